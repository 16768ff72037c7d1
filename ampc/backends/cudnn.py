"""ampc.backends.cudnn: as torch.backends.cudnn.

``deterministic`` (False by default, as torch's): when True, GPU convolutions take only cuDNN's
deterministic algorithms, so that a run repeats its bits (the fastest deterministic one, timed on
the first call of each shape and layout); when False, the fastest algorithm, deterministic or not.

``benchmark`` (True by default, where torch's is False; AMPC_CUDNN_BENCHMARK=0 makes it False):
when True, the first call of each shape, layout and dtype times cuDNN's algorithms and engines and
keeps the fastest (that call waits for the GPU); when False, it takes the first of cuDNN's
heuristic ranking, untimed, as torch's default does. Each setting keeps its own choices.

Both process-wide, as torch's.
"""

import sys
import types

from ampc import _C

__all__ = ["benchmark", "deterministic"]


def _switch(function):
    """A module attribute over one of _C's switches: function() reads it, function(value) sets it
    (a TypeError for anything but a bool)."""
    return property(lambda module: function(), lambda module, value: function(value))


class _CudnnModule(types.ModuleType):
    deterministic = _switch(_C._cudnn_deterministic)
    benchmark = _switch(_C._cudnn_benchmark)


sys.modules[__name__].__class__ = _CudnnModule
