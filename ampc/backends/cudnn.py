"""ampc.backends.cudnn: as torch.backends.cudnn.

``deterministic`` (False by default, as torch's): when True, GPU convolutions take only cuDNN's
deterministic algorithms, so that a run repeats its bits (the fastest deterministic one, timed on
the first call of each shape and layout); when False, the fastest algorithm, deterministic or not.
Process-wide, as torch's. (ampc always times cuDNN's algorithms on a shape's first call, as
torch.backends.cudnn.benchmark = True does.)
"""

import sys
import types

from ampc import _C

__all__ = ["deterministic"]


class _CudnnModule(types.ModuleType):
    @property
    def deterministic(self):
        return _C._cudnn_deterministic()

    @deterministic.setter
    def deterministic(self, value):
        _C._cudnn_deterministic(value)


sys.modules[__name__].__class__ = _CudnnModule
