"""ampc.cpu.amp: the legacy torch.cpu.amp names, deprecated in favour of ampc.amp."""

import warnings

from ampc import _C, amp

__all__ = ["GradScaler", "autocast"]


class GradScaler(amp.GradScaler):
    """``ampc.cpu.amp.GradScaler(args...)`` is ``ampc.amp.GradScaler("cpu", args...)``, deprecated as torch's
    ``torch.cpu.amp.GradScaler`` is."""

    def __init__(self, init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000,
                 enabled=True, **kwargs):
        warnings.warn("`ampc.cpu.amp.GradScaler(args...)` is deprecated. Please use `ampc.amp.GradScaler('cpu', "
                      "args...)` instead.", FutureWarning, stacklevel=2)
        super().__init__("cpu", init_scale, growth_factor, backoff_factor, growth_interval, enabled, **kwargs)


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
