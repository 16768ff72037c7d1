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


class _CudnnModule(types.ModuleType):
    @property
    def deterministic(self):
        return _C._cudnn_deterministic()

    @deterministic.setter
    def deterministic(self, value):
        _C._cudnn_deterministic(value)

    @property
    def benchmark(self):
        return _C._cudnn_benchmark()

    @benchmark.setter
    def benchmark(self, value):
        _C._cudnn_benchmark(value)


sys.modules[__name__].__class__ = _CudnnModule
