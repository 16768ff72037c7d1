"""The bad-input matrix over ampc.nn.functional: every public function, each of its required
arguments given each class of bad input, and the array layouts a caller may hand over.

- What is no array (a list, a string, None, a dict, a plain object) where an argument is required:
  a TypeError, ValueError or RuntimeError with a message, never the AttributeError of the Python
  line that first read .shape, and every array passed along unchanged.
- Integer, bool and complex arrays anywhere: taken (the glue ops move any dtype; indices are
  integers) or refused with those exceptions, never anything else.
- Reversed (negative strides), strided, transposed, read-only and empty arrays: the same bits as
  the contiguous copy gives, the input untouched (ops.c makes what a kernel cannot walk dense).
"""

import inspect
import warnings

import numpy as np
import pytest

import ampc

F = ampc.nn.functional
REFUSED = (TypeError, ValueError, RuntimeError)
SHAPE = (2, 3, 4, 4)


def _public_functions():
    for name in sorted(dir(F)):
        fn = getattr(F, name)
        if name.startswith("_") or not callable(fn) or isinstance(fn, type):
            continue
        if not getattr(fn, "__module__", "").startswith("ampc.nn"):
            continue
        required = [p for p in inspect.signature(fn).parameters.values()
                    if p.default is inspect.Parameter.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        yield name, len(required)


FUNCTIONS = list(_public_functions())
CASES = [(name, position, count) for name, count in FUNCTIONS for position in range(count)]
NOT_ARRAYS = {"list": [1.0, 2.0], "str": "abc", "None": None, "dict": {}, "object": object()}
TAKEN = {("dropout_backward", 1, "None")}  # documented: the state of a dropout that dropped nothing
OTHER_DTYPES = {"int64": np.int64, "bool": np.bool_, "complex64": np.complex64}


# The op a function's messages may name instead of its own: the forward of a *_backward, and:
NAMED_AS = {"max_pool2d_with_indices": "max_pool2d"}


def assert_names_the_op(name, error):
    """The message begins with the op's name, as every message of ampc's ops does: not NumPy's
    words from a line that happened to touch the argument first."""
    ops = (name, name.removesuffix("_backward"), NAMED_AS.get(name, name))
    assert str(error).startswith(tuple(op + ":" for op in ops)), (name, str(error))


def arguments(count, rng):
    return [rng.standard_normal(SHAPE).astype(np.float32) for _ in range(count)]


def test_the_matrix_covers_the_api():
    assert len(FUNCTIONS) > 60 and len(CASES) > 100


@pytest.mark.parametrize("name,position,count", CASES, ids=lambda v: str(v))
def test_what_is_no_array_is_refused_by_name(name, position, count, rng):
    fn = getattr(F, name)
    for kind, bad in NOT_ARRAYS.items():
        if (name, position, kind) in TAKEN:
            continue
        args = arguments(count, rng)
        before = [a.copy() for a in args]
        args[position] = bad
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with pytest.raises(REFUSED) as info:
                fn(*args)
        assert_names_the_op(name, info.value)
        for i, (a, b) in enumerate(zip(args, before)):
            if i != position:
                np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name,position,count", CASES, ids=lambda v: str(v))
def test_other_dtypes_are_taken_or_refused_cleanly(name, position, count, rng):
    fn = getattr(F, name)
    for kind, dtype in OTHER_DTYPES.items():
        args = arguments(count, rng)
        args[position] = (args[position] * 3).astype(dtype)
        before = [a.copy() for a in args]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                fn(*args)
            except REFUSED as error:
                assert_names_the_op(name, error)
        for a, b in zip(args, before):
            np.testing.assert_array_equal(a, b)


W = np.linspace(-1, 1, 20, dtype=np.float32).reshape(5, 4)
LAYOUT_OPS = {
    "relu": lambda x: F.relu(x), "gelu": lambda x: F.gelu(x), "silu": lambda x: F.silu(x), "exp": lambda x: F.exp(x),
    "log": lambda x: F.log(F.add(F.relu(x), 1.0)), "softmax": lambda x: F.softmax(x, -1),
    "log_softmax": lambda x: F.log_softmax(x, 0), "layer_norm": lambda x: F.layer_norm(x, (4,)),
    "sum": lambda x: F.sum(x, 0), "mean": lambda x: F.mean(x), "add": lambda x: F.add(x, x, alpha=0.5),
    "mul": lambda x: F.mul(x, 3.0), "linear": lambda x: F.linear(x, W), "matmul": lambda x: F.matmul(x, W.T),
    "mse_loss": lambda x: F.mse_loss(x, F.relu(x)), "l1_loss": lambda x: F.l1_loss(x, x * 0, reduction="sum"),
    "cross_entropy": lambda x: F.cross_entropy(x, np.arange(x.shape[0]) % 4),
}
LAYOUTS = {
    "reversed": lambda a: a[::-1, ::-1],
    "strided": lambda a: a[::2],
    "transposed": lambda a: np.ascontiguousarray(a.T).T,
    "read-only": lambda a: _read_only(a),
    "empty rows": lambda a: a[:0],
}


def _read_only(a):
    a = a.copy()
    a.flags.writeable = False
    return a


def _bits(a):
    a = np.ascontiguousarray(np.atleast_1d(np.asarray(a)))
    return a.view(f"u{a.dtype.itemsize}") if a.dtype.kind == "f" else a


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("op", LAYOUT_OPS)
def test_any_layout_gives_the_contiguous_bits(op, layout, rng):
    fn = LAYOUT_OPS[op]
    base = rng.standard_normal((8, 4)).astype(np.float32)
    x = LAYOUTS[layout](base)
    before = x.copy()
    if layout == "empty rows" and op == "cross_entropy":
        assert np.isnan(fn(x))  # torch's mean over no targets
        return
    got, want = fn(x), fn(np.ascontiguousarray(x))
    assert np.asarray(got).shape == np.asarray(want).shape and np.asarray(got).dtype == np.asarray(want).dtype
    np.testing.assert_array_equal(_bits(got), _bits(want))
    np.testing.assert_array_equal(x, before)


@pytest.mark.parametrize("op", ["cat", "stack"])
@pytest.mark.parametrize("kind", ["None", "str", "object"])
def test_a_non_array_among_the_arrays_of_cat_and_stack(op, kind, rng):
    """NumPy takes None or a string as a 0-d array: cat said the arrays' dimensions differ, stack
    that their shapes do. Both name the argument instead, as torch's TypeError does."""
    first = rng.standard_normal(3).astype(np.float32)
    keep = first.copy()
    bad = NOT_ARRAYS[kind]
    with pytest.raises(TypeError, match=f"{op}: each of tensors must be an array .*got {type(bad).__name__}"):
        getattr(F, op)([first, bad])
    np.testing.assert_array_equal(first, keep)


@pytest.mark.parametrize("op", ["sum", "mean"])
def test_reduction_dims_are_ints(op, rng):
    """dim=[1.5] summed over dim 1 (int() truncated it): a silent wrong answer; torch refuses it.
    A NumPy integer is an int (it was refused as 'not iterable'); mean's out-of-range dim gets
    torch's IndexError text, not a tuple's."""
    x = rng.standard_normal((2, 3)).astype(np.float32)
    fn = getattr(F, op)
    for bad in ([1.5], 1.0, "a", [None]):
        with pytest.raises(TypeError, match=f"{op}: dim must be an int or a list or tuple of ints"):
            fn(x, dim=bad)
    np.testing.assert_array_equal(fn(x, dim=np.int64(1)), fn(x, dim=1))
    np.testing.assert_array_equal(fn(x, dim=[np.int32(-1)]), fn(x, dim=1))
    with pytest.raises(IndexError, match=rf"{op}: Dimension out of range \(expected to be in range of \[-2, 1\], "
                                         r"but got 5\)"):
        fn(x, dim=5)


@pytest.mark.parametrize("call,op,name", [
    (lambda x, v: F.cross_entropy(x[0], np.array([0, 1]), ignore_index=v), "cross_entropy", "ignore_index"),
    (lambda x, v: F.nll_loss(x[0], np.array([0, 1]), ignore_index=v), "nll_loss", "ignore_index"),
    (lambda x, v: F.cross_entropy_backward(np.float32(1), x[0], np.array([0, 1]), ignore_index=v),
     "cross_entropy_backward", "ignore_index"),
    (lambda x, v: F.embedding(np.array([1]), x[0], padding_idx=v), "embedding", "padding_idx"),
    (lambda x, v: F.layer_norm(x[0], (v,)), "layer_norm", "normalized_shape"),
    (lambda x, v: F.group_norm(x[1], v), "group_norm", "num_groups"),
    (lambda x, v: F.conv2d(x[1], np.ones((2, 1, 1, 1), np.float32), groups=v), "conv2d", "groups"),
    (lambda x, v: F.avg_pool2d(x[1], 1, divisor_override=v), "avg_pool2d", "divisor_override"),
])
def test_int_arguments_are_ints(call, op, name, rng):
    """int() took 1.5 for 1: cross_entropy(ignore_index=1.5) ignored class 1, layer_norm((3.5,))
    normalised over 3, a silent wrong answer each; torch refuses a float. A NumPy integer is taken."""
    x = (rng.standard_normal((2, 3)).astype(np.float32), rng.standard_normal((1, 2, 3, 3)).astype(np.float32))
    keep = [a.copy() for a in x]
    ok = {"layer_norm": 3, "group_norm": 2, "conv2d": 2, "avg_pool2d": 1, "embedding": 1}.get(op, 1)
    for bad in (1.5, float(ok), "1"):
        with pytest.raises(TypeError, match=f"{op}: {name} must be an int"):
            call(x, bad)
    call(x, np.int64(ok))
    for a, b in zip(x, keep):
        np.testing.assert_array_equal(a, b)


def test_split_and_chunk_sizes_are_ints(rng):
    """split(x, [1.5, 1.5], 1) became [1, 1]; with sizes that still added up ([1.5, 2.5] of 3) the
    pieces were silently other than asked. NumPy integers are taken (they were refused as 'not
    iterable')."""
    x = rng.standard_normal((2, 4)).astype(np.float32)
    for call in (lambda: F.split(x, [1.5, 2.5], 1), lambda: F.split(x, 1.5, 1)):
        with pytest.raises(TypeError, match="split: split_size_or_sections must be an int or a list of ints"):
            call()
    with pytest.raises(TypeError, match="chunk: chunks must be an int, got float"):
        F.chunk(x, 2.0, 1)
    assert [p.shape for p in F.split(x, np.int64(3), 1)] == [(2, 3), (2, 1)]
    assert [p.shape for p in F.split(x, [np.int32(1), 3], 1)] == [(2, 1), (2, 3)]
    assert [p.shape for p in F.chunk(x, np.int64(2), 1)] == [(2, 2), (2, 2)]


@pytest.mark.parametrize("bad", [1.5, -0.25, np.nan])
def test_binary_cross_entropy_takes_probabilities_only(bad, rng):
    """An input outside [0, 1] gave a number (1.5: -log 1.5, a negative loss) where torch's CPU
    kernel raises; 0 and 1 themselves are probabilities."""
    p = rng.random((2, 3)).astype(np.float32)
    p[0, 0], p[1, 2] = 0.0, 1.0
    y = rng.random((2, 3)).astype(np.float32)
    p64, y64 = p.astype(np.float64), y.astype(np.float64)
    with np.errstate(divide="ignore"):  # log 0, clamped at -100 as torch's
        want = -np.mean(y64 * np.maximum(np.log(p64), -100) + (1 - y64) * np.maximum(np.log1p(-p64), -100))
    np.testing.assert_allclose(F.binary_cross_entropy(p, y), want, rtol=1e-5)
    p[1, 1] = bad
    keep = p.copy()
    for call in (lambda: F.binary_cross_entropy(p, y), lambda: F.binary_cross_entropy_backward(np.float32(1), p, y)):
        with pytest.raises(RuntimeError, match="all elements of input should be between 0 and 1"):
            call()
    np.testing.assert_array_equal(p, keep)


@pytest.mark.parametrize("shape", [(4, -1), (-1, -1), (0, -1), (7,), (2, -3), ()])
def test_reshape_to_a_shape_of_another_size(shape, rng):
    """torch's ValueError text naming the op, not NumPy's 'cannot reshape array of size 6'."""
    x = rng.standard_normal((2, 3)).astype(np.float32)
    with pytest.raises(ValueError, match=rf"reshape: shape '\[{', '.join(map(str, shape))}\]' is invalid for input "
                                         r"of size 6"):
        F.reshape(x, shape)
    assert F.reshape(x, (3, -1)).shape == (3, 2) and F.reshape(x, np.array([6])).shape == (6,)
    assert F.reshape(x[:0], (0, 5)).shape == (0, 5)


@pytest.mark.parametrize("bad", [{}, {3, 2}, "32", 2.0, np.ones((2, 3), np.int64), [3, 2.0]])
def test_shapes_are_ints(bad, rng):
    """A dict or set was an empty or unordered shape, a 2-D array's rows were taken for ints."""
    x = rng.standard_normal((2, 3)).astype(np.float32)
    for call, op, name in [(lambda: F.reshape(x, bad), "reshape", "shape"),
                           (lambda: F.sum_backward(x, bad), "sum_backward", "input_shape"),
                           (lambda: F.permute(x, bad), "permute", "dims"),
                           (lambda: F.layer_norm(x, bad), "layer_norm", "normalized_shape")]:
        with pytest.raises(TypeError, match=f"{op}: {name} must be an int or a sequence of ints"):
            call()


def test_elementwise_messages_name_op_and_argument(rng):
    """The shared elementwise kernel's messages name the public op and its argument (they said
    'elementwise: other' for sub's, relu_backward's and mse_loss's arguments alike)."""
    x = rng.standard_normal((2, 3)).astype(np.float32)
    ints = np.arange(6).reshape(2, 3)
    cases = [(lambda: F.sub(ints, ints), "sub: input must be a floating array"),
             (lambda: F.gelu(ints), "gelu: input must be a floating array"),
             (lambda: F.mean(ints), "mean: input must be a floating array"),
             (lambda: F.mean(x, (0, 0)), "mean: dim 0 appears multiple times"),
             (lambda: F.relu_backward(x, ints), "relu_backward: input must be a floating array"),
             (lambda: F.gelu_backward(ints, x), "gelu_backward: grad_output must be a floating array"),
             (lambda: F.mse_loss(x, ints), "mse_loss: target must be a floating array"),
             (lambda: F.l1_loss_backward(ints, x, x), "l1_loss_backward: grad_output must be a floating array"),
             (lambda: F.pow(ints, 2), "pow: input must be a floating array"),
             (lambda: F.mul(x, None), "mul: other must be an array or a number, got None"),
             (lambda: F.add(x, x[:, :2]), r"add: the shapes of the operands do not broadcast"),
             (lambda: F.scaled_dot_product_attention_backward(x, ints, x, x, x),
              "scaled_dot_product_attention_backward: query must be a floating array"),
             (lambda: F.pow_backward(None, x, x), "pow_backward: grad_output must be an array or a number, got None"),
             (lambda: F.dropout_backward(x, x), r"dropout_backward: state must be what dropout's forward returned"),
             (lambda: F.dropout(x, "0.5"), "dropout: p must be a float, got str")]
    for call, message in cases:
        with pytest.raises((TypeError, ValueError, RuntimeError), match=message):
            call()


def test_numpy_scalar_exponents_are_numbers(rng):
    """np.int64(2) went to the array path and was refused as an integer array; torch takes it."""
    x = rng.random((3, 4)).astype(np.float32) + 0.5
    for exponent in (np.int64(2), np.float32(2.0), 2):
        np.testing.assert_array_equal(F.pow(x, exponent), x * x)
    np.testing.assert_array_equal(F.pow_backward(np.ones_like(x), x, np.int32(2)), 2 * x)
