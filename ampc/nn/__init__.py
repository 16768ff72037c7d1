"""ampc.nn: the ops (ampc.nn.functional); the layers come with the training issue."""

from ampc.nn import functional

__all__ = ["functional"]
