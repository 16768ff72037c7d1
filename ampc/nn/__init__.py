"""ampc.nn: the layers (as torch.nn's) and the ops they run (ampc.nn.functional)."""

from ampc.nn import functional
from ampc.nn.modules import (
    AdaptiveAvgPool2d,
    BatchNorm2d,
    Conv2d,
    CrossEntropyLoss,
    Dropout,
    Embedding,
    Flatten,
    GELU,
    Identity,
    LayerNorm,
    Linear,
    MSELoss,
    MaxPool2d,
    Module,
    ModuleList,
    Parameter,
    ReLU,
    Sequential,
)

__all__ = [
    "AdaptiveAvgPool2d", "BatchNorm2d", "Conv2d", "CrossEntropyLoss", "Dropout", "Embedding", "Flatten", "GELU",
    "Identity", "LayerNorm", "Linear", "MSELoss", "MaxPool2d", "Module", "ModuleList", "Parameter", "ReLU",
    "Sequential", "functional",
]
