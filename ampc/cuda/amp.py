"""ampc.cuda.amp: the legacy torch.cuda.amp names, deprecated in favour of ampc.amp."""

import warnings

from ampc import _C

__all__ = ["GradScaler"]


class GradScaler(_C.GradScaler):
    """``ampc.cuda.amp.GradScaler(args...)`` is ``ampc.amp.GradScaler("cuda", args...)``."""

    def __init__(self, init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000,
                 enabled=True, **kwargs):
        warnings.warn(
            "`ampc.cuda.amp.GradScaler(args...)` is deprecated. Please use `ampc.amp.GradScaler('cuda', args...)` "
            "instead.",
            FutureWarning,
            stacklevel=2,
        )
        super().__init__("cuda", init_scale, growth_factor, backoff_factor, growth_interval, enabled, **kwargs)
