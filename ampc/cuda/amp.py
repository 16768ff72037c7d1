"""ampc.cuda.amp: the legacy torch.cuda.amp names, deprecated in favour of ampc.amp."""

import warnings

from ampc import _C, amp

__all__ = ["GradScaler", "autocast", "custom_bwd", "custom_fwd"]


def _deprecated(old, new):
    warnings.warn(f"`ampc.cuda.amp.{old}(args...)` is deprecated. Please use `{new}` instead.", FutureWarning,
                  stacklevel=3)


class GradScaler(amp.GradScaler):
    """``ampc.cuda.amp.GradScaler(args...)`` is ``ampc.amp.GradScaler("cuda", args...)``."""

    def __init__(self, init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000,
                 enabled=True, **kwargs):
        _deprecated("GradScaler", "ampc.amp.GradScaler('cuda', args...)")
        super().__init__("cuda", init_scale, growth_factor, backoff_factor, growth_interval, enabled, **kwargs)


class autocast(amp.autocast):
    """``ampc.cuda.amp.autocast(args...)`` is ``ampc.amp.autocast("cuda", args...)``; as torch's
    legacy class, ``with`` binds the region itself."""

    __slots__ = ()

    def __init__(self, enabled=True, dtype=_C.float16, cache_enabled=True, **kwargs):
        _deprecated("autocast", "ampc.amp.autocast('cuda', args...)")
        super().__init__("cuda", dtype, enabled, cache_enabled, **kwargs)

    def __enter__(self):
        super().__enter__()
        return self


def custom_fwd(fwd=None, *, cast_inputs=None):
    """``ampc.cuda.amp.custom_fwd(args...)`` is ``ampc.amp.custom_fwd(args..., device_type="cuda")``."""
    _deprecated("custom_fwd", "ampc.amp.custom_fwd(args..., device_type='cuda')")
    return amp.custom_fwd(fwd, device_type="cuda", cast_inputs=cast_inputs)


def custom_bwd(bwd=None):
    """``ampc.cuda.amp.custom_bwd(args...)`` is ``ampc.amp.custom_bwd(args..., device_type="cuda")``."""
    _deprecated("custom_bwd", "ampc.amp.custom_bwd(args..., device_type='cuda')")
    return amp.custom_bwd(bwd, device_type="cuda")
