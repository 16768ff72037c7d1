"""ampc.amp: the torch.amp names. GradScaler lives in C (ampc._C); this module
adds what torch has beside it."""

import enum
import inspect

from ampc._C import GradScaler

__all__ = ["GradScaler", "OptState"]


class OptState(enum.Enum):
    """The per-optimizer stage of a GradScaler, as torch.amp.grad_scaler.OptState."""

    READY = 0
    UNSCALED = 1
    STEPPED = 2


def _step_takes_grad_scaler(optimizer):
    """The legacy fused-optimizer contract: does optimizer.step take grad_scaler=?"""
    try:
        return "grad_scaler" in inspect.signature(optimizer.step).parameters
    except (TypeError, ValueError):
        return False
