"""ampc.autograd: gradients through the ops of ampc.nn.functional. A tape, not a tensor library.

An op called while grad mode is on, with an input that needs a gradient (an ``ampc.Parameter``
with ``requires_grad``, or a ``Tensor`` an earlier op returned), returns a ``Tensor``: its array
(``.data``) and the ``Node`` that made it. The node keeps what the op's backward needs: its
inputs as the op saw them, after autocast's casts, and what the forward saved. ``backward()``
runs the nodes from the loss back, each op's ``*_backward`` kernel in the dtype its forward ran
in, casts each gradient back to the dtype of the input it belongs to (autocast's cast is an op
too, as in torch), and adds it to that input's gradient: the next node's, or a Parameter's
``.grad``. Without an input that needs a gradient, or under ``no_grad()``, the ops return plain
arrays and record nothing.
"""

import functools
import inspect
import math
import threading
import weakref

import ml_dtypes
import numpy as np

from ampc import _C, amp
from ampc._arguments import as_int, non_array_error
from ampc._interop import array_namespace, is_torch

__all__ = ["Arithmetic", "Function", "FunctionCtx", "Node", "Tensor", "enable_grad", "is_grad_enabled", "no_grad",
           "set_grad_enabled"]


class _GradState(threading.local):
    """Grad mode, per thread as torch's; on in a thread that never set it (a class attribute: a
    plain lookup, where getattr with a default took half a microsecond on every op call)."""

    enabled = True


_local = _GradState()


def is_grad_enabled():
    """True if ops called now on this thread go on the tape (see no_grad, enable_grad, set_grad_enabled)."""
    return _local.enabled


class _GradMode:
    """A context manager and decorator that sets grad mode in the thread, and puts back the mode
    it found."""

    mode = True

    def __enter__(self):
        saved = getattr(_local, "saved", None)
        if saved is None:
            saved = _local.saved = []
        saved.append(is_grad_enabled())
        _local.enabled = self.mode

    def __exit__(self, *exc):
        _local.enabled = _local.saved.pop()
        return False

    def __call__(self, func):
        mode = type(self)

        @functools.wraps(func)
        def run(*args, **kwargs):
            with mode():
                return func(*args, **kwargs)
        return run


class no_grad(_GradMode):
    """Record no gradients in this region (as torch.no_grad): ops return plain arrays."""

    mode = False


class enable_grad(_GradMode):
    """Record gradients in this region, even inside no_grad."""

    mode = True


class set_grad_enabled:
    """``set_grad_enabled(mode)`` sets grad mode at once, as torch's; as a context manager it puts
    the previous mode back at the end of the region, as a decorator it runs the function in mode."""

    def __init__(self, mode):
        self.mode = bool(mode)
        self._previous = is_grad_enabled()
        _local.enabled = self.mode

    def __enter__(self):
        return None

    def __exit__(self, *exc):
        _local.enabled = self._previous
        return False

    def __call__(self, func):
        _local.enabled = self._previous
        return (enable_grad if self.mode else no_grad)()(func)


# -- the graph --------------------------------------------------------------------------------

_FREED = ("Trying to backward through the graph a second time (or directly access saved tensors after they "
          "have already been freed). Saved intermediate values of the graph are freed when you call .backward() "
          "or autograd.grad(). Specify retain_graph=True if you need to backward through the graph a second time "
          "or if you need to access saved tensors after calling backward.")


class Node:
    """One op on the tape: ``backward(args, saved, grads, needs)`` returns the gradients of the
    op's differentiable inputs (None where ``needs`` says none is wanted) from the gradients of its
    outputs (a list of them for an op that returns a tuple, even of one array: ``outputs`` is its
    length, None for an op that returns one array); ``sources`` are those inputs' own nodes,
    Parameters, or None; ``dtypes`` their dtypes before autocast cast them."""

    __slots__ = ("name", "backward", "args", "saved", "sources", "dtypes", "outputs", "versions")

    def __init__(self, name, backward, args, saved, sources, dtypes, outputs=None, versions=()):
        self.name, self.backward, self.args, self.saved = name, backward, args, saved
        self.sources, self.dtypes, self.outputs = sources, dtypes, outputs
        self.versions = versions  # (Parameter, its version when the op ran): what backward() checks

    def __repr__(self):
        return f"<{self.name}Backward>"


# The module whose ops the Tensor operators and backward's sums call: ampc.nn.functional, which
# registers itself with set_tensor_ops when it is imported (`import ampc` imports it). autograd sits
# below ampc.nn and does not import it.
_tensor_ops = None


def set_tensor_ops(namespace):
    """Make the Tensor operators (a + b, a @ b, .reshape, .sum, ...) call namespace's ops."""
    global _tensor_ops
    _tensor_ops = namespace


def _ops():
    ops = _tensor_ops
    if ops is None:
        raise RuntimeError("Tensor operators run the ops of ampc.nn.functional, which has not been imported yet "
                           "(import ampc imports it)")
    return ops


class Arithmetic:
    """Operators and shape methods through ampc's ops (recorded like any other op), for Tensor and
    ampc.nn.Parameter, so that a model's forward reads as it would in torch."""

    __slots__ = ()
    __array_ufunc__ = None  # NumPy's operators defer to these: `array + tensor` stays on the tape

    _f = staticmethod(_ops)

    def __add__(self, other):
        return self._f().add(self, other)

    __radd__ = __add__

    def __sub__(self, other):
        return self._f().sub(self, other)

    def __rsub__(self, other):
        return self._f().add(self._f().mul(self, -1.0), other)

    def __mul__(self, other):
        return self._f().mul(self, other)

    __rmul__ = __mul__

    def __truediv__(self, other):
        return self._f().div(self, other)

    def __rtruediv__(self, other):
        return self._f().mul(self._f().pow(self, -1.0), other)

    def __neg__(self):
        return self._f().mul(self, -1.0)

    def __matmul__(self, other):
        return self._f().matmul(self, other)

    def __rmatmul__(self, other):
        return self._f().matmul(other, self)

    def __pow__(self, exponent):
        return self._f().pow(self, exponent)

    def __rpow__(self, base):
        return self._f().pow(base, self)

    def reshape(self, *shape):
        """The elements in a new shape, as torch's Tensor.reshape (one dimension may be -1)."""
        return self._f().reshape(self, shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape)

    view = reshape

    def transpose(self, dim0, dim1):
        """Dimensions dim0 and dim1 swapped, as torch's Tensor.transpose."""
        return self._f().transpose(self, dim0, dim1)

    def permute(self, *dims):
        """The dimensions in the order dims, as torch's Tensor.permute."""
        return self._f().permute(self, dims[0] if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else dims)

    def flatten(self, start_dim=0, end_dim=-1):
        """Dimensions start_dim..end_dim merged into one, as torch's Tensor.flatten."""
        return self._f().flatten(self, start_dim, end_dim)

    def sum(self, dim=None, keepdim=False):
        """The sum over dim (all dimensions by default), as torch's Tensor.sum."""
        return self._f().sum(self, dim, keepdim)

    def mean(self, dim=None, keepdim=False):
        """The mean over dim (all dimensions by default), as torch's Tensor.mean."""
        return self._f().mean(self, dim, keepdim)

    def softmax(self, dim):
        """softmax along dim, as torch's Tensor.softmax."""
        return self._f().softmax(self, dim)

    def log_softmax(self, dim):
        """log_softmax along dim, as torch's Tensor.log_softmax."""
        return self._f().log_softmax(self, dim)

    def unsqueeze(self, dim):
        """A dimension of size 1 inserted at dim, as torch's Tensor.unsqueeze."""
        return self._f().unsqueeze(self, dim)

    def squeeze(self, dim=None):
        """Dimensions of size 1 removed (only dim's when given), as torch's Tensor.squeeze."""
        return self._f().squeeze(self, dim)

    def split(self, split_size, dim=0):
        """Pieces of split_size along dim (or of the sizes in a list), as torch's Tensor.split."""
        return self._f().split(self, split_size, dim)

    def chunk(self, chunks, dim=0):
        """chunks pieces of (nearly) equal size along dim, as torch's Tensor.chunk."""
        return self._f().chunk(self, chunks, dim)

    @property
    def T(self):  # noqa: N802 - torch's name
        """The dimensions reversed (torch's .T)."""
        return self._f().permute(self, tuple(range(len(self.shape) - 1, -1, -1)))

    def t(self):
        """The transpose of a 2-D array (a 1-D or 0-D one as it is), as torch's Tensor.t."""
        if len(self.shape) > 2:
            raise ValueError(f"t() expects a tensor with <= 2 dimensions, but self is {len(self.shape)}D")
        return self.T

    def exp(self):
        """e raised to each element."""
        return self._f().exp(self)

    def log(self):
        """The natural logarithm of each element."""
        return self._f().log(self)

    def sigmoid(self):
        """1 / (1 + exp(-x)) elementwise."""
        return self._f().sigmoid(self)

    def tanh(self):
        """The hyperbolic tangent of each element."""
        return self._f().tanh(self)

    def relu(self):
        """max(x, 0) elementwise."""
        return self._f().relu(self)

    def abs(self):
        """The absolute value of each element."""
        return self._f().abs(self)

    __abs__ = abs

    def sqrt(self):
        """The square root of each element."""
        return self._f().sqrt(self)

    def rsqrt(self):
        """1 / sqrt(x) elementwise."""
        return self._f().rsqrt(self)

    def size(self, dim=None):
        """The shape as a tuple, or the size of dimension dim, as torch's Tensor.size."""
        shape = tuple(self.shape)
        return shape if dim is None else shape[dim]

    def dim(self):
        """The number of dimensions."""
        return len(self.shape)

    def numel(self):
        """The number of elements."""
        return math.prod(self.shape)

    def argmax(self, dim=None, keepdim=False):
        """The indices of the largest values along dim (all: of the flattened values), as torch's
        Tensor.argmax: an integer array of the library the values live in, off the tape."""
        return _index_reduction(self, "argmax", dim, keepdim)

    def argmin(self, dim=None, keepdim=False):
        """The index of the smallest element (over dim, when given), as torch's Tensor.argmin; off the tape."""
        return _index_reduction(self, "argmin", dim, keepdim)

    def __getitem__(self, key):
        """self[key] on the tape: ints and slices, and for NumPy arrays index arrays and masks too
        (the gradient: zeros, with the picked elements' added in)."""
        return self._f()._index(self, key)

    def to(self, dtype):
        """self in dtype, on the tape (its gradient comes back in self's dtype)."""
        return self._f()._cast(self, dtype)

    def float(self):
        """A float32 copy (on the tape), as torch's Tensor.float."""
        return self.to(_C.float32)

    def half(self):
        """A float16 copy (on the tape), as torch's Tensor.half."""
        return self.to(_C.float16)

    def bfloat16(self):
        """A bfloat16 copy (on the tape), as torch's Tensor.bfloat16."""
        return self.to(_C.bfloat16)


class Tensor(Arithmetic):
    """An array an op made from inputs that need a gradient, with the node that made it. It passes
    for its array where one is read (``__array__``, ``__dlpack__``, shape, dtype) and runs ampc's
    ops for arithmetic, so that a model's forward reads as it would in torch."""

    __slots__ = ("data", "grad_fn", "_index", "__weakref__")
    requires_grad = True
    is_leaf = False

    def __init__(self, data, grad_fn, index=0):
        self.data, self.grad_fn, self._index = data, grad_fn, index

    # what an array is asked
    shape = property(lambda self: tuple(self.data.shape))
    dtype = property(lambda self: self.data.dtype)
    ndim = property(lambda self: len(self.data.shape))
    device = property(lambda self: getattr(self.data, "device", "cpu"))

    def __len__(self):
        return len(self.data)

    def __array__(self, dtype=None, copy=None):
        import numpy as np

        return np.asarray(self.data, dtype=dtype, copy=copy)

    def __dlpack__(self, *args, **kwargs):
        return self.data.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self.data.__dlpack_device__()

    def detach(self):
        """The array alone, outside the graph."""
        return self.data

    def item(self):
        """The value of a one-element Tensor as a Python number (waits for a GPU), as torch's Tensor.item."""
        return _host_scalar(self.data)

    def __float__(self):
        return float(_host_scalar(self.data))

    def __repr__(self):
        return f"Tensor(shape={self.shape}, dtype={self.dtype}, grad_fn={self.grad_fn!r})"

    def backward(self, gradient=None, retain_graph=None, create_graph=False):
        """The gradients of this value with respect to every Parameter it came from, added to their
        ``.grad``; ``gradient`` is this value's own (1 for a single number)."""
        if create_graph:
            raise NotImplementedError("backward: create_graph (gradients of gradients) is not supported")
        run_backward(self, gradient, bool(retain_graph))


def _host_scalar(x):
    """The one number of x, read on the host (an ampc array on a GPU copied back first)."""
    if isinstance(x, _C.Array):
        import numpy as np

        return np.asarray(x if x.device == "cpu" else _C._to_device(x, -1)).item()
    return x.item()


def _index_reduction(x, name, dim, keepdim):
    """x's array's own argmax or argmin: torch's (dim, keepdim) or NumPy's, CuPy's and JAX's (axis,
    keepdims)."""
    a = _array(x)
    if dim is not None:
        dim = as_int(name, "dim", dim)
    if is_torch(a):
        return getattr(a, name)(dim=dim, keepdim=keepdim)
    return getattr(a, name)(axis=dim, keepdims=keepdim)


def _needs_grad(value):
    """Whether value (an argument of an op) is, or holds in lists and tuples, a Tensor or a Parameter
    that requires grad."""
    return _C._needs_grad((value,), None, Tensor)


def _plain(value):
    """value with every Tensor in it replaced by its array."""
    if isinstance(value, Tensor):
        return value.data
    if isinstance(value, (list, tuple)):
        for v in value:
            if isinstance(v, Tensor):
                return type(value)(_plain(v) for v in value)
    return value


def _source(value):
    """Where value's gradient goes: its node (and output index), a Parameter, or None."""
    if isinstance(value, Tensor):
        return (value.grad_fn, value._index)
    if isinstance(value, _C.Parameter) and value.requires_grad:
        return value
    return None


def _array(value):
    return value.data if isinstance(value, (Tensor, _C.Parameter)) else value


def _scale_loss(loss, scale):
    """GradScaler.scale(loss) for a Tensor loss, scale being the C scaler's own: the scaled loss is a
    Tensor too, whose backward() starts from the scale, as torch's does."""
    if not is_grad_enabled():
        return scale(loss.data)
    node = Node("scale", lambda args, saved, grad, needs: (scale(grad),), {}, None, (_source(loss),), (loss.dtype,))
    return Tensor(scale(loss.data), node)


amp._register_loss_tensor(Tensor, _scale_loss)


def _capture(op):
    """An autocast op under op's name whose body hands back the arguments it got: it casts them
    exactly as the op would (the policy, the weight cache), for the graph to keep."""
    if not isinstance(op, _C.AutocastOp):
        return None
    return _C.AutocastOp(lambda *args, **kwargs: (args, kwargs), op.name)


class _Binder:
    """Python's argument binding for one op, precomputed: inspect.Signature.bind took most of the
    tape's time per op."""

    def __init__(self, func, name):
        params = list(inspect.signature(func).parameters.values())
        self.name = name
        self.names = [p.name for p in params]
        self.known = set(self.names)
        self.positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        self.defaults = [(p.name, p.default) for p in params if p.default is not p.empty]

    def bind(self, args, kwargs):
        if len(args) > len(self.positional):
            raise TypeError(f"{self.name}() takes {len(self.positional)} positional arguments but {len(args)} "
                            f"were given")
        bound = dict(zip(self.positional, args))
        for key, value in kwargs.items():
            if key not in self.known or key in bound:
                raise TypeError(f"{self.name}() got an unexpected keyword argument '{key}'" if key not in self.known
                                else f"{self.name}() got multiple values for argument '{key}'")
            bound[key] = value
        for key, value in self.defaults:
            bound.setdefault(key, value)
        if len(bound) != len(self.names):
            missing = [n for n in self.names if n not in bound]
            raise TypeError(f"{self.name}() missing required argument: '{missing[0]}'")
        return {n: bound[n] for n in self.names}


def _widened(original, cast):
    """Whether cast is autocast's float32 copy of a 16-bit float array (exact: the same values)."""
    original = _array(original)
    if original is cast or not hasattr(original, "dtype") or not hasattr(cast, "dtype"):
        return False
    return _C.as_dtype(cast.dtype) == _F32 and _C.as_dtype(original.dtype) in _SIXTEEN_BIT


_F32 = np.dtype(np.float32)
_SIXTEEN_BIT = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))


def _off_tape_in_place(op, binder, target, args, kwargs):
    """An in-place form on a Tensor off the tape (no_grad, or nothing needing a gradient): its array
    may be kept by nodes of its graph, so the Tensor is given the result instead and the array it
    held is left as they saw it. (A plain array is written in place by the op itself.)"""
    arguments = binder.bind(args, kwargs)
    arguments["inplace"] = False
    target.data = op(**{k: _plain(v) for k, v in arguments.items()})
    return target


def differentiable(op, grad_args, forward, backward, name=None, keep_uncast=()):
    """op, recorded on the tape when grad mode is on and an argument needs a gradient.

    ``grad_args`` names op's differentiable arguments; ``forward(args)`` (op's arguments by name,
    in its order, cast and unwrapped) returns ``(output, saved)``; ``backward(args, saved, grad,
    needs)`` returns one gradient per name in grad_args, or per array of a list argument. An output
    that is a tuple becomes a tuple of Tensors, and backward then gets a list of their gradients
    (None for one nobody used).

    ``keep_uncast`` names arguments whose backward reads a 16-bit array as well as its float32
    cast (the kernels load either into float32: the same values) and answers in its dtype: the
    tape keeps the 16-bit original, not autocast's float32 copy of twice the size (cross_entropy's
    logits: 1.6 GB for GPT-2's 8 x 1024 x 50257), and the gradient needs no cast back."""
    name = name or getattr(op, "__name__", "op")
    binder = _Binder(op, name)
    grad_set = frozenset(grad_args)
    capture = _capture(op)
    first = binder.names[0]

    inplace_at = binder.positional.index("inplace") if "inplace" in binder.positional else None

    def record(*args, **kwargs):  # TapeOp's call when an argument needs a gradient
        arguments = None
        try:
            if not is_grad_enabled():
                if kwargs.get("inplace") or (inplace_at is not None and len(args) > inplace_at and args[inplace_at]):
                    target = args[0] if args else kwargs.get(first)
                    if isinstance(target, Tensor):
                        return _off_tape_in_place(op, binder, target, args, kwargs)
                if kwargs:
                    return op(*_plain(args), **{k: _plain(v) for k, v in kwargs.items()})
                return op(*_plain(args))
            arguments = binder.bind(args, kwargs)
            # an in-place form (relu(x, inplace=True)) runs out of place on the tape, so that what other
            # nodes kept of x stays as they saw it; x, a Tensor, is then rebound to the result, as torch
            # moves a tensor's grad_fn to the in-place op
            in_place = arguments[first] if arguments.get("inplace") else None
            if in_place is not None:
                arguments["inplace"] = False
                if isinstance(in_place, _C.Parameter) and in_place.requires_grad:
                    raise RuntimeError("a leaf Variable that requires grad is being used in an in-place operation.")
            # one source per differentiable array: a list argument (cat's tensors) gives one each
            # (plain loops here and below: this runs for every op recorded)
            values = []
            for n in grad_args:
                value = arguments[n]
                if isinstance(value, (list, tuple)):
                    values.extend(value)
                else:
                    values.append(value)
            # an argument the op has no gradient for, that needs one (a loss's class weights): torch's
            # error when the backward reaches it, not a gradient left out without a word
            missing = None
            for n, value in arguments.items():
                if n not in grad_set and _needs_grad(value):
                    missing = n
                    break
            sources, dtypes = [], []
            for value in values:
                sources.append(_source(value))
                dtypes.append(getattr(_array(value), "dtype", None))
            parameters = []
            for key, value in arguments.items():
                value = arguments[key] = _plain(value)  # Parameters stay, for autocast's weight cache
                if isinstance(value, (list, tuple)):
                    parameters.extend(v for v in value if isinstance(v, _C.Parameter))
                elif isinstance(value, _C.Parameter):
                    parameters.append(value)
            originals = {n: arguments[n] for n in keep_uncast}
            if capture is not None:
                # the first argument positionally: fp32_set_opt_dtype looks at it
                rest = {k: v for k, v in arguments.items() if k != first}
                cast_args, cast_kwargs = capture(arguments[first], **rest)
                cast_kwargs[first] = cast_args[0]
                arguments = {n: cast_kwargs[n] for n in binder.names}
            for n in grad_args:
                value = arguments[n]
                arguments[n] = [_array(v) for v in value] if isinstance(value, (list, tuple)) else _array(value)
            output, saved = forward(arguments)
            for n, original in originals.items():
                if _widened(original, arguments[n]):
                    arguments[n] = _array(original)
            outputs = len(output) if isinstance(output, tuple) else None
            node = Node(name, backward if missing is None else _not_implemented(missing), arguments, saved,
                        tuple(sources), tuple(dtypes), outputs, tuple((p, p._version) for p in parameters))
            if isinstance(output, tuple):
                return tuple(Tensor(o, node, i) for i, o in enumerate(output))
            if isinstance(in_place, Tensor):
                in_place.data, in_place.grad_fn, in_place._index = output, node, 0
                return in_place
            return Tensor(output, node)
        except AttributeError as error:  # an argument that is no array: named, as names_non_arrays does
            named = non_array_error(op, error, args, kwargs, arguments)
            if named is None:
                raise
            raise named from None

    def explain(error, args, kwargs):  # the op's AttributeError off the tape, named as above
        return non_array_error(op, error, args, kwargs)

    # every call asks whether it goes on the tape: in C, the op called at once where it does not
    return functools.update_wrapper(_C.TapeOp(op, record, Tensor, explain), op)


def _not_implemented(name):
    def backward(args, saved, grads, needs):
        raise RuntimeError(f"the derivative for '{name}' is not implemented.")  # torch's text
    return backward


# -- custom functions -------------------------------------------------------------------------

class FunctionCtx:
    """The ``ctx`` a Function's forward and backward share, as torch's: ``save_for_backward`` and
    ``saved_tensors``, ``needs_input_grad``, and any attribute forward sets (``custom_fwd`` records
    autocast's state on it for ``custom_bwd``)."""

    def save_for_backward(self, *arrays):
        """Keep arrays for backward, which reads them back from ctx.saved_tensors."""
        self._saved = tuple(_plain(a) for a in arrays)

    @property
    def saved_tensors(self):
        return getattr(self, "_saved", ())


class Function:
    """torch.autograd.Function: an op whose forward and backward you write. Subclass it with two
    static methods and call ``apply``::

        class Square(ampc.autograd.Function):
            @staticmethod
            @ampc.amp.custom_fwd(device_type="cpu", cast_inputs=ampc.float32)
            def forward(ctx, x):
                ctx.save_for_backward(x)
                return x * x

            @staticmethod
            @ampc.amp.custom_bwd(device_type="cpu")
            def backward(ctx, grad):
                (x,) = ctx.saved_tensors
                return 2 * x * grad

        y = Square.apply(x)

    ``forward(ctx, *args)`` runs with grad mode off, on the arguments' arrays (a Tensor's ``.data``;
    Parameters as they are), and returns an array or a tuple of arrays. Where grad mode is on and an
    argument needs a gradient, the output goes on the tape: ``backward(ctx, *grad_outputs)``, one
    gradient per output (zeros for an output nobody used), returns one gradient per argument of
    forward (None where there is none, or a single array for a single argument)."""

    @staticmethod
    def forward(ctx, *args):
        """The function's output from its inputs' arrays (grad mode is off here); subclasses define it, static, with
        ctx first."""
        raise NotImplementedError("You must implement the forward function for custom autograd.Function.")

    @staticmethod
    def backward(ctx, *grad_outputs):
        """One gradient per forward argument (None where there is none) from the gradients of forward's outputs;
        subclasses define it, static, with ctx first."""
        raise NotImplementedError("You must implement either the backward or vjp method for your custom "
                                  "autograd.Function to use it with backward mode AD.")

    @classmethod
    def apply(cls, *args, **kwargs):
        """Run forward on these arguments (by position) and, where grad mode is on and one needs a gradient, put the
        output on the tape for backward."""
        if kwargs:  # torch's apply takes its arguments by position only
            raise TypeError(f"{cls.__name__}.apply() takes no keyword arguments")
        ctx = FunctionCtx()
        ctx.needs_input_grad = tuple(_needs_grad(a) for a in args)
        with no_grad():
            output = cls.forward(ctx, *(_plain(a) for a in args))
        if not (is_grad_enabled() and any(ctx.needs_input_grad)):
            return output
        name = f"{cls.__name__}Backward"
        outputs = len(output) if isinstance(output, tuple) else None
        shapes = [_array(o) for o in (output if outputs is not None else (output,))]

        def backward(_args, saved, grads, needs):
            grads = list(grads) if outputs is not None else [grads]
            grads = [array_namespace(o).zeros_like(o) if g is None else g for g, o in zip(grads, shapes)]
            result = cls.backward(saved, *grads)
            result = result if isinstance(result, tuple) else (result,)
            if len(result) != len(args):
                raise RuntimeError(f"function {name} returned an incorrect number of gradients (expected "
                                   f"{len(args)}, got {len(result)})")
            return [None if g is None else _array(g) for g in result]

        versions = tuple((a, a._version) for a in args if isinstance(a, _C.Parameter) and a.requires_grad)
        node = Node(name, backward, {}, ctx, tuple(_source(a) for a in args),
                    tuple(getattr(_array(a), "dtype", None) for a in args), outputs, versions)
        if outputs is not None:
            return tuple(Tensor(o, node, i) for i, o in enumerate(output))
        return Tensor(output, node)


# -- running the tape backwards ---------------------------------------------------------------

_post_backward_hooks = {}  # handle -> weak reference to a method(parameters)


class _HookHandle:
    def __init__(self, method):
        _post_backward_hooks[self] = weakref.WeakMethod(method)

    def remove(self):
        _post_backward_hooks.pop(self, None)


def register_post_backward_hook(method):
    """Run method(parameters) after each backward() with the Parameters whose .grad it wrote (what
    ampc.distributed.DataParallel averages across ranks). Held weakly: the hook goes with its
    object. Returns a handle whose remove() unregisters it."""
    return _HookHandle(method)


def _order(root):
    """The nodes root depends on, each after every node that consumes it (root first): Kahn's
    order on the count of each node's consumers."""
    consumers, stack = {id(root): 0}, [root]
    while stack:
        for source in stack.pop().sources:
            if isinstance(source, tuple):
                node = source[0]
                if id(node) not in consumers:
                    consumers[id(node)] = 0
                    stack.append(node)
                consumers[id(node)] += 1
    order, ready = [], [root]
    while ready:
        node = ready.pop()
        order.append(node)
        for source in node.sources:
            if isinstance(source, tuple):
                consumers[id(source[0])] -= 1
                if consumers[id(source[0])] == 0:
                    ready.append(source[0])
    return order


def _add(a, b):
    return _ops().add.raw(a, b)


def _to_dtype(grad, dtype):
    """grad in dtype: the backward of autocast's cast."""
    if dtype is None or grad.dtype == dtype:
        return grad
    return _C.cast(grad, _C.as_dtype(dtype))


def _element_strides(x):
    stride = getattr(x, "stride", None)
    if callable(stride):  # torch
        return tuple(stride())
    itemsize = _C.as_dtype(x.dtype).itemsize
    return tuple(s // itemsize for s in x.strides)


def _like_parameter(grad, param):
    """grad in the array type, dtype and layout of param's array (a channels-last weight gets a
    channels-last gradient, as torch's gradient layout contract): what a fused optimizer step walks
    in step. A cast keeps its input's layout; a gradient laid out otherwise, or of another library
    (a NumPy weight that torch data flowed through), is copied into an array like the parameter's."""
    data = param.data
    dtype = _C.as_dtype(data.dtype)
    if type(grad) is type(data) and _element_strides(grad) == _element_strides(data):
        return grad if _C.as_dtype(grad.dtype) == dtype else _C.cast(grad, dtype)
    out = _C.zeros_like(data)
    _C.cast(grad, out=out)
    return out


def _ones_like(x):
    return array_namespace(x).ones_like(x)


def _modified(p, version):
    """torch's text for a tensor written after an op saved it (an optimizer's step between a forward
    and its backward): its gradients would be computed from the new values, without a word."""
    return (f"one of the variables needed for gradient computation has been modified by an inplace operation: "
            f"[Parameter {tuple(p.shape)}] is at version {p._version}; expected version {version} instead.")


def _check_versions(node):
    for p, version in node.versions:
        if p._version != version:
            raise RuntimeError(_modified(p, version))


def run_backward(root, gradient, retain_graph):
    if not isinstance(root, Tensor) or root.grad_fn is None:  # a detached Tensor has no graph either
        raise RuntimeError("element 0 of tensors does not require grad and does not have a grad_fn")
    if gradient is None:
        if math.prod(int(s) for s in root.data.shape) != 1:
            raise RuntimeError("grad can be implicitly created only for scalar outputs")
        gradient = _ones_like(root.data)
    gradient = _array(gradient)
    if isinstance(gradient, (str, bytes)) or getattr(gradient, "shape", None) is None:
        raise TypeError(f"gradients can be either Tensors or None, but got {type(gradient).__name__}")
    if tuple(gradient.shape) != tuple(root.data.shape):
        raise RuntimeError(f"Mismatch in shape: grad_output[0] has a shape of {tuple(gradient.shape)} and output[0] "
                           f"has a shape of {tuple(root.data.shape)}.")
    grads = {id(root.grad_fn): [None] * (root.grad_fn.outputs or 1)}
    touched = {}  # the Parameters whose .grad this pass wrote
    grads[id(root.grad_fn)][root._index] = gradient
    order = _order(root.grad_fn)
    for node in order:  # all checked before any gradient is written
        _check_versions(node)
    for node in order:
        pending = grads.pop(id(node), None)
        if pending is None:
            continue
        if node.args is None:
            raise RuntimeError(_FREED)
        # and again as each node runs, as torch checks a saved tensor when it is unpacked: a .grad
        # setter, a hook or a custom backward may have stepped an optimizer since
        _check_versions(node)
        needs = tuple(source is not None for source in node.sources)
        result = node.backward(node.args, node.saved, pending if node.outputs is not None else pending[0], needs)
        for source, grad, dtype in zip(node.sources, result, node.dtypes):
            if source is None or grad is None:
                continue
            if isinstance(source, tuple):
                grad = _to_dtype(grad, dtype)
                slots = grads.setdefault(id(source[0]), [None] * (source[0].outputs or 1))
                slots[source[1]] = grad if slots[source[1]] is None else _add(slots[source[1]], grad)
            else:  # a Parameter: its .grad, added to as torch's
                grad = _like_parameter(grad, source)
                source.grad = grad if source.grad is None else _add(source.grad, grad)
                touched[id(source)] = source
        if not retain_graph:
            node.args = node.saved = None
    for handle, hook in list(_post_backward_hooks.items()):
        callback = hook()
        if callback is None:  # its object is gone
            handle.remove()
        else:
            callback(list(touched.values()))

