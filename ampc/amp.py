"""ampc.amp: the torch.amp names. GradScaler, the autocast regions, their state and the
dispatch engine live in C (ampc._C); this module adds what is plainer in Python: the decorator
forms, custom_fwd / custom_bwd, and the registry's front door."""

import enum
import functools
import inspect
import warnings
import weakref

from ampc import _C
from ampc._C import (
    AutocastOp,
    autocast_decrement_nesting,
    autocast_increment_nesting,
    autocast_policy,
    clear_autocast_cache,
    get_autocast_dtype,
    is_autocast_available,
    is_autocast_cache_enabled,
    is_autocast_enabled,
    set_autocast_cache_enabled,
    set_autocast_dtype,
    set_autocast_enabled,
)

__all__ = [
    "AutocastOp",
    "GradScaler",
    "OptState",
    "autocast",
    "autocast_decrement_nesting",
    "autocast_increment_nesting",
    "autocast_op",
    "autocast_policy",
    "clear_autocast_cache",
    "custom_bwd",
    "custom_fwd",
    "get_autocast_dtype",
    "is_autocast_available",
    "is_autocast_cache_enabled",
    "is_autocast_enabled",
    "register_autocast",
    "set_autocast_cache_enabled",
    "set_autocast_dtype",
    "set_autocast_enabled",
]


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


# (Tensor type, its scale(tensor, scale_array)): ampc.autograd registers its Tensor when it is imported
# (which `import ampc` does), since amp sits below autograd and does not import it.
_loss_tensor = None


def _register_loss_tensor(tensor_type, scale):
    global _loss_tensor
    _loss_tensor = (tensor_type, scale)


class GradScaler(_C.GradScaler):
    """torch.amp.GradScaler (ampc._C.GradScaler: dynamic loss scaling, and more, in C). ``scale``
    also takes the ampc.autograd.Tensor a training step's loss is: the scaled loss is a Tensor
    too, whose ``backward()`` starts from the scale, as torch's does."""

    __slots__ = ()

    def scale(self, outputs):
        loss_tensor = _loss_tensor
        if loss_tensor is None or not isinstance(outputs, loss_tensor[0]):
            return super().scale(outputs)
        return loss_tensor[1](outputs, super().scale)


# -- autocast ---------------------------------------------------------------------------------


class autocast(_C.autocast):
    """A region in which autocast ops run in the precision that suits them, as torch.autocast:
    a context manager, or a decorator that runs the function inside the region.

    ``autocast(device_type, dtype=None, enabled=True, cache_enabled=None, *, fp32_ops=None,
    lower_precision_ops=None)``. device_type is ``"cuda"`` or ``"cpu"``; dtype defaults to
    get_autocast_dtype(device_type) (float16 on CUDA, bfloat16 on the CPU). torch's checks,
    warnings and texts apply. Beyond torch, fp32_ops and lower_precision_ops name ops (or
    autocast ops) that run in float32, or in the region's dtype, inside this region and the
    regions nested in it, whatever their registered policy.

    The state is per thread. What ``__exit__`` restores is kept per thread too, so one instance
    may be entered again while active (a decorated function that recurses) and from several
    threads at once. As in torch, regions may be left in any order (asyncio tasks that hold a
    region across an ``await`` leave in the order they resume): the nesting count goes back to 0
    and the cache is dropped when the last is left, and leaving them all gives back the state
    from before the first. The state is the thread's, not the task's: while a task awaits inside
    a region, the other tasks of its event loop run inside it too.
    """

    __slots__ = ()

    def __call__(self, func):
        if not callable(func):
            raise TypeError(f"autocast()(func) requires a callable, but got {type(func).__name__}")

        @functools.wraps(func)
        def decorate_autocast(*args, **kwargs):
            with self:
                return func(*args, **kwargs)

        return decorate_autocast


def register_autocast(name, policy, device_type=None):
    """Set the autocast policy of op ``name`` (a str, or an AutocastOp) on ``device_type``
    ("cuda", "cpu", or None for both): one of "lower_precision_fp", "fp32",
    "fp32_set_opt_dtype", "fp32_append_dtype", "promote", "banned", or "none" to stop
    autocasting it. Every AutocastOp under that name follows at once, torch's built-in ops
    included."""
    if isinstance(name, AutocastOp):
        name = name.name
    _C._register_autocast(name, policy, device_type)


def autocast_op(policy=None, *, name=None, device_type=None):
    """Make a function an autocast op: inside a region its array arguments (NumPy, CuPy, torch,
    JAX or ampc arrays, Parameters, and lists, tuples and dicts of them) are cast by the policy
    of its op name, with ampc's cast kernels, before it runs.

    ``@autocast_op("lower_precision_fp")`` registers the policy under the function's
    ``__name__`` (or ``name=``) on ``device_type`` (None: both); ``@autocast_op(name="softmax")``
    or a bare ``@autocast_op`` takes the policy already registered under the name (torch's
    lists). A function under "fp32_set_opt_dtype" must take ``dtype=``: it gets
    ``dtype=float32`` (torch's, for torch arrays; NumPy's otherwise) when its first argument
    is eligible and no dtype was given. Calls with ``out=`` are not autocast, as in torch.
    Registering a policy that conflicts with the one the name has raises ValueError; use
    register_autocast to change it."""
    if callable(policy) and not isinstance(policy, str):
        return autocast_op(name=name, device_type=device_type)(policy)

    def wrap(func):
        op_name = name if name is not None else getattr(func, "__name__", None)
        if not isinstance(op_name, str):
            raise TypeError(f"autocast_op: {func!r} has no __name__; pass name=")
        if policy is not None:
            _C._register_autocast(op_name, policy, device_type, strict=True)
        op = AutocastOp(func, op_name)
        functools.update_wrapper(op, func)
        return op

    return wrap


def _deprecated_form(old, new):
    warnings.warn(f"ampc.{old} is deprecated. Please use ampc.{new} instead.", DeprecationWarning, stacklevel=3)


def is_autocast_cpu_enabled():
    """Deprecated, as in torch: is_autocast_enabled("cpu")."""
    _deprecated_form("is_autocast_cpu_enabled()", "is_autocast_enabled('cpu')")
    return is_autocast_enabled("cpu")


def set_autocast_cpu_enabled(enabled):
    """Deprecated, as in torch: set_autocast_enabled("cpu", enabled)."""
    _deprecated_form("set_autocast_cpu_enabled(enabled)", "set_autocast_enabled('cpu', enabled)")
    set_autocast_enabled("cpu", enabled)


def get_autocast_cpu_dtype():
    """Deprecated, as in torch: get_autocast_dtype("cpu")."""
    _deprecated_form("get_autocast_cpu_dtype()", "get_autocast_dtype('cpu')")
    return get_autocast_dtype("cpu")


def set_autocast_cpu_dtype(dtype):
    """Deprecated, as in torch: set_autocast_dtype("cpu", dtype)."""
    _deprecated_form("set_autocast_cpu_dtype(dtype)", "set_autocast_dtype('cpu', dtype)")
    set_autocast_dtype("cpu", dtype)


def get_autocast_gpu_dtype():
    """Deprecated, as in torch: get_autocast_dtype("cuda")."""
    _deprecated_form("get_autocast_gpu_dtype()", "get_autocast_dtype('cuda')")
    return get_autocast_dtype("cuda")


def set_autocast_gpu_dtype(dtype):
    """Deprecated, as in torch: set_autocast_dtype("cuda", dtype)."""
    _deprecated_form("set_autocast_gpu_dtype(dtype)", "set_autocast_dtype('cuda', dtype)")
    set_autocast_dtype("cuda", dtype)


def _device_type_str(device_type):
    if not isinstance(device_type, str):
        raise ValueError(f"Expected `device_type` of type `str`, got: `{type(device_type)}`")


def custom_fwd(fwd=None, *, device_type, cast_inputs=None):
    """torch.amp.custom_fwd for the forward of a custom function (``forward(ctx, ...)``; ctx is
    any object that takes attributes). It records the autocast state on ctx for custom_bwd.
    With ``cast_inputs`` (a dtype), inside an enabled region the floating arrays on device_type
    among the arguments are cast to it (nested containers too) and forward runs with autocast
    off; outside a region forward runs unchanged."""
    _device_type_str(device_type)
    if fwd is None:
        return functools.partial(custom_fwd, device_type=device_type, cast_inputs=cast_inputs)

    @functools.wraps(fwd)
    def decorate_fwd(*args, **kwargs):
        ctx = args[0]
        ctx._dtype = get_autocast_dtype(device_type)
        if cast_inputs is None:
            ctx._fwd_used_autocast = is_autocast_enabled(device_type)
            return fwd(*args, **kwargs)
        ctx._fwd_used_autocast = False
        if not is_autocast_enabled(device_type):
            return fwd(*args, **kwargs)
        with autocast(device_type=device_type, enabled=False):
            return fwd(*_C._autocast_cast(args, device_type, cast_inputs),
                       **_C._autocast_cast(kwargs, device_type, cast_inputs))

    return decorate_fwd


def custom_bwd(bwd=None, *, device_type):
    """torch.amp.custom_bwd: backward runs with the autocast state its forward ran with (as
    custom_fwd recorded it on ctx)."""
    _device_type_str(device_type)
    if bwd is None:
        return functools.partial(custom_bwd, device_type=device_type)

    @functools.wraps(bwd)
    def decorate_bwd(*args, **kwargs):
        ctx = args[0]
        with autocast(device_type=device_type, enabled=ctx._fwd_used_autocast, dtype=ctx._dtype):
            return bwd(*args, **kwargs)

    return decorate_bwd
