"""ampc.backends: switches over the libraries ampc's GPU ops run on, named as torch.backends'."""

from ampc.backends import cudnn

__all__ = ["cudnn"]
