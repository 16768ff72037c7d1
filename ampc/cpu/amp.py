"""ampc.cpu.amp: the legacy torch.cpu.amp name, deprecated in favour of ampc.amp."""

import warnings

from ampc import _C, amp

__all__ = ["autocast"]


class autocast(amp.autocast):
    """``ampc.cpu.amp.autocast(args...)`` is ``ampc.amp.autocast("cpu", args...)``; as torch's
    legacy class, ``with`` binds the region itself."""

    __slots__ = ()

    def __init__(self, enabled=True, dtype=_C.bfloat16, cache_enabled=True, **kwargs):
        warnings.warn("`ampc.cpu.amp.autocast(args...)` is deprecated. Please use `ampc.amp.autocast('cpu', "
                      "args...)` instead.", FutureWarning, stacklevel=2)
        super().__init__("cpu", dtype, enabled, cache_enabled, **kwargs)

    def __enter__(self):
        super().__enter__()
        return self
