"""ampc.amp: the torch.amp names. GradScaler lives in C (ampc._C); this module
adds what torch has beside it."""

import enum
import inspect
import weakref

from ampc._C import GradScaler

__all__ = ["GradScaler", "OptState"]


class OptState(enum.Enum):
    """The per-optimizer stage of a GradScaler, as torch.amp.grad_scaler.OptState."""

    READY = 0
    UNSCALED = 1
    STEPPED = 2


# step function -> whether it takes grad_scaler=; inspect.signature costs tens of microseconds,
# and GradScaler asks at every step of a fused optimizer.
_takes_grad_scaler = weakref.WeakKeyDictionary()


def _step_takes_grad_scaler(optimizer):
    """The legacy fused-optimizer contract: does optimizer.step take grad_scaler=?"""
    step = optimizer.step
    function = getattr(step, "__func__", None)  # the same answer for every instance's bound step
    if function is not None:
        known = _takes_grad_scaler.get(function)
        if known is not None:
            return known
    try:
        takes = "grad_scaler" in inspect.signature(step).parameters
    except (TypeError, ValueError):
        takes = False
    if function is not None:
        try:
            _takes_grad_scaler[function] = takes
        except TypeError:  # not weakly referable
            pass
    return takes
