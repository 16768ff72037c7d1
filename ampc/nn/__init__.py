"""ampc.nn: the layers (as torch.nn's) and the ops they run (ampc.nn.functional)."""

from ampc.nn import functional, utils
from ampc.nn.modules import (
    AdaptiveAvgPool2d,
    AvgPool2d,
    BCELoss,
    BCEWithLogitsLoss,
    BatchNorm1d,
    BatchNorm2d,
    Conv1d,
    Conv2d,
    CrossEntropyLoss,
    Dropout,
    Embedding,
    Flatten,
    GELU,
    GroupNorm,
    Identity,
    L1Loss,
    LayerNorm,
    Linear,
    LogSoftmax,
    MSELoss,
    MaxPool2d,
    Mish,
    Module,
    ModuleDict,
    ModuleList,
    NLLLoss,
    Parameter,
    ReLU,
    Sequential,
    SiLU,
    Sigmoid,
    Softmax,
    Softplus,
    Tanh,
)
from ampc.nn.modules import __all__ as _modules

__all__ = _modules + ["functional"]
