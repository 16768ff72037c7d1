"""Fuzzing the parsers of outside input (hypothesis drives them; CI runs a bounded number of examples,
under AddressSanitizer in .ci/sanitize; AMPC_FUZZ_EXAMPLES=100000 python -m pytest tests/test_fuzz.py
is the long run).

DLPack capsules with arbitrary versions, devices, dtypes, ndims, shapes, strides and byte offsets: a
capsule is either refused with a BufferError, left unconsumed and its deleter not called, or taken:
then its shape and strides are the capsule's, reading it touches only its memory, and its deleter
runs exactly once. GradScaler, Module and optimizer state dicts with keys dropped, replaced by any value (arrays
of other shapes and dtypes, strings, non-contiguous) or added: a payload is refused with a clear
exception and the scaler or model unchanged, or taken (as given; a model's arrays keep their shapes
and dtypes). dtype and device arguments (as_dtype, cast, softmax's dtype, autocast's device_type and
dtype, the autocast queries, GradScaler's device, Module.to, custom_fwd) given any object: a result,
or a TypeError, ValueError or RuntimeError, with the inputs, the model and autocast's state kept."""

import gc
import os
import pickle
import pickletools
import warnings

import ml_dtypes
import numpy as np
import pytest

import ampc
from dlpack_fakes import FakeTensor, capsule_name

pytest.importorskip("hypothesis")
from hypothesis import example, given, settings, strategies as st  # noqa: E402

EXAMPLES = int(os.environ.get("AMPC_FUZZ_EXAMPLES", "400"))
ABSURD = [2**31 - 1, 2**31, 2**32, 2**62, 2**63 - 1, -(2**63), -(2**31)]
BUFFER = 256
ACCEPTED = []  # examples imported (the others refused), for a bounded run to show it took both paths


def mostly(usual, *others):
    """usual most of the time (so that some capsules pass every check), else one of others."""
    return st.sampled_from([usual] * 4 + list(others))


@st.composite
def capsules(draw):
    ndim = draw(st.integers(0, 6))
    size = st.integers(0, 6) | st.integers(1, 3) | st.integers(-2, 6) | st.sampled_from(ABSURD)
    shape = tuple(draw(st.lists(size, min_size=ndim, max_size=ndim)))
    strides = draw(st.none() | st.lists(st.integers(-9, 9) | st.sampled_from(ABSURD), min_size=ndim,
                                        max_size=ndim).map(tuple))
    return dict(
        shape=shape, strides=strides,
        # an ndim past the shape array only where it is absurd (refused before the shape is read)
        ndim=draw(mostly(None, 0, -1, 65, 2**31 - 1, -(2**31))) if ndim else draw(mostly(None, -1, 65)),
        code=draw(mostly(2, 0, 1, 3, 4, 5, 6, 7, 10, 12)), bits=draw(mostly(32, 0, 1, 8, 16, 64, 128, 255)),
        lanes=draw(mostly(1, 0, 2, 4)),
        # CPU-side device types (CUDA ones need a GPU; the GPU suite has its own DLPack tests)
        device=draw(mostly((1, 0), (1, 5), (1, -1), (0, 0), (4, 0), (14, 0), (2**30, 0))),
        versioned=draw(st.booleans()), major=draw(mostly(1, 0, 2, 2**31)),
        flags=draw(mostly(0, 1, 2, 3, 2**63)),
        byte_offset=draw(mostly(0, 1, 2, 4, 8, 60, 64, BUFFER, 2**63, 2**64 - 8)),
        null_data=draw(mostly(False, True)), null_shape=draw(mostly(False, True)))


def element(view, index):
    """view's element at index, as a 1-element view of its bytes (no copy: a 0-d array indexed by ()
    gives a scalar, which for bool holds 0 or 1 whatever byte the buffer has; the Ellipsis keeps
    a view)."""
    return view[tuple(slice(i, i + 1) for i in index) + (Ellipsis,)].reshape(-1)


def read_all(a):
    """Read every element of a (AddressSanitizer sees a read outside the buffer) and return the
    first byte of element [0, ..., 0]; a broadcast view of billions (strides 0) is read at its
    lowest- and highest-addressed elements, which bound all the others."""
    view = np.asarray(a)
    if view.size <= 1 << 20:
        np.copy(view)
    else:
        for toward in (-1, 1):
            element(view, [n - 1 if s * toward > 0 else 0 for n, s in zip(view.shape, view.strides)]).copy()
    return element(view, [0] * view.ndim).view(np.uint8)[0]


def extent(shape, strides, itemsize):
    """(lowest, one past the highest) byte an array of this layout touches from its first element."""
    lo = hi = 0
    for n, s in zip(shape, strides):
        if n == 0:
            return 0, 0
        lo, hi = lo + min(0, (n - 1) * s), hi + max(0, (n - 1) * s)
    return lo, hi + itemsize


# a 0-d bool whose byte is 2 (a 20,000-example run's find: read_all compared a copy's normalised 1)
@example(dict(shape=(), strides=None, ndim=None, code=6, bits=8, lanes=1, device=(1, 0), versioned=False, major=1,
              flags=0, byte_offset=2, null_data=False, null_shape=False))
@settings(max_examples=EXAMPLES, deadline=None, derandomize="AMPC_FUZZ_EXAMPLES" not in os.environ)
@given(capsules())
def test_dlpack_import_takes_a_capsule_whole_or_not_at_all(fields):
    buffer = np.arange(BUFFER, dtype=np.uint8)
    null_data = fields.pop("null_data")
    fake = FakeTensor(data=None if null_data else buffer.ctypes.data, **fields)
    name = capsule_name(fake.capsule)
    try:
        a = ampc.from_dlpack(fake.capsule)
    except BufferError:
        assert capsule_name(fake.capsule) == name and fake.deleted == 0
        return
    assert capsule_name(fake.capsule) == "used_" + name and fake.deleted == 0
    assert a.shape == fields["shape"][:len(a.shape)] and a.ndim == len(a.shape)
    lo, hi = extent(a.shape, a.strides, a.itemsize)
    if a.size and 0 <= fields["byte_offset"] + lo and fields["byte_offset"] + hi <= BUFFER and not null_data:
        assert read_all(a) == buffer[fields["byte_offset"]]  # element [0, ..., 0] where data + byte_offset says
    del a
    gc.collect()
    assert fake.deleted == 1
    ACCEPTED.append(1)


def test_the_fuzzer_reaches_both_outcomes():
    """Some of its capsules must be taken, or the run above only ever tried the refusals."""
    if not ACCEPTED:
        test_dlpack_import_takes_a_capsule_whole_or_not_at_all()
    assert len(ACCEPTED) >= 5


# -- GradScaler.load_state_dict ------------------------------------------------------------------

VALID = ampc.GradScaler("cpu", init_scale=8.0, min_scale=1.0, max_scale=1024.0, hysteresis=2).state_dict()
ANY_VALUE = (st.floats() | st.integers(-(2**70), 2**70) | st.booleans() | st.none() | st.text(max_size=3)
             | st.floats(0.5, 4.0) | st.integers(0, 4000) | st.just(np.float32(2.0)) | st.just(np.int64(7))
             | st.just(np.ones(2)) | st.lists(st.integers(), max_size=2))


@st.composite
def state_dicts(draw):
    """The valid state dict with each key kept, dropped or given any value, and junk keys added."""
    sd = {}
    for key, value in VALID.items():
        fate = draw(mostly("keep", "drop", "replace"))
        if fate != "drop":
            sd[key] = value if fate == "keep" else draw(ANY_VALUE)
    sd.update(draw(st.dictionaries(st.text(max_size=4), ANY_VALUE, max_size=2)))
    return sd


@settings(max_examples=EXAMPLES, deadline=None, derandomize="AMPC_FUZZ_EXAMPLES" not in os.environ)
@given(state_dicts(), st.booleans())
def test_scaler_load_state_dict_takes_a_payload_whole_or_not_at_all(sd, with_options):
    s = (ampc.GradScaler("cpu", init_scale=8.0, min_scale=1.0, max_scale=1024.0, hysteresis=2) if with_options
         else ampc.GradScaler("cpu", init_scale=4.0))
    before = s.state_dict()
    try:
        s.load_state_dict(sd)
    except (TypeError, ValueError, RuntimeError, OverflowError) as error:  # a missing entry: StateDictError
        assert str(error)
        assert s.state_dict() == before  # nothing half-loaded
        return
    loaded = s.state_dict()
    for key in ("scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"):
        assert loaded[key] == sd[key]  # taken as given
    assert 0 < loaded["scale"] < float("inf")
    again = ampc.GradScaler("cpu")
    again.load_state_dict(loaded)
    assert again.state_dict() == loaded  # what it holds is itself a valid payload


# -- GradScaler pickles --------------------------------------------------------------------------

def _pickled_scalers():
    import ampc.distributed as dist

    plain = ampc.GradScaler("cpu", init_scale=8.0, min_scale=1.0, max_scale=1024.0, hysteresis=2)
    plain.scale(np.float32(1))
    sharded = dist.ShardedGradScaler("cpu", init_scale=4.0)
    return [pickle.dumps(plain, protocol=p) for p in (2, 5)] + [pickle.dumps(sharded)]


PICKLES = _pickled_scalers()
SCALER_STATE = ampc.GradScaler("cpu", init_scale=8.0, hysteresis=2).__getstate__()
# What unpickling edited bytes may raise before GradScaler.__setstate__ sees anything (pickle's own
# parsing, a mangled class name), and what __setstate__ raises.
UNPICKLE_ERRORS = (pickle.UnpicklingError, EOFError, ValueError, TypeError, KeyError, AttributeError, IndexError,
                   OverflowError, UnicodeDecodeError, ImportError, RuntimeError, AssertionError, MemoryError)


def _check_restored(scaler):
    """A scaler that came out of a pickle: valid through and through."""
    if not scaler.is_enabled():
        return
    sd = scaler.state_dict()
    assert 0 < sd["scale"] <= 3.4028234663852886e38
    twin = ampc.GradScaler("cpu")
    twin.load_state_dict(sd)  # what it holds is itself a valid payload
    if type(scaler) is not ampc.GradScaler:  # a ShardedGradScaler's step needs its process group
        return
    g = np.full(3, 2.0 * sd["scale"], np.float32)
    opt = _Opt(g)
    scaler.scale(np.float32(1))
    scaler.step(opt)
    scaler.update()
    np.testing.assert_array_equal(g, np.full(3, 2.0, np.float32))  # unscaled exactly (a power-of-two scale)


class _Opt:
    def __init__(self, grad):
        from types import SimpleNamespace

        self.param_groups = [{"params": [SimpleNamespace(grad=grad)]}]

    def step(self):
        pass


def _value_bytes(data):
    """Where the pickle's values are: the argument bytes of its opcodes, but not of those that index
    pickle's memo or size a frame (an edited index there makes pickle itself allocate gigabytes,
    which AddressSanitizer aborts on before Python can raise MemoryError), nor the opcodes."""
    ops = list(pickletools.genops(data))
    spans = [(pos + 1, end) for (op, _, pos), (_, _, end) in zip(ops, ops[1:] + [(None, None, len(data))])
             if op.name not in ("BINPUT", "LONG_BINPUT", "BINGET", "LONG_BINGET", "FRAME", "PROTO")]
    return [i for start, end in spans for i in range(start, end)]


VALUE_BYTES = {data: _value_bytes(data) for data in PICKLES}


@settings(max_examples=EXAMPLES, deadline=None, derandomize="AMPC_FUZZ_EXAMPLES" not in os.environ)
@given(st.sampled_from(PICKLES), st.data())
def test_truncated_and_edited_scaler_pickles(data, draw):
    """Bytes cut short or values' bytes changed: unpickling raises, or gives a scaler that is valid whole."""
    edits = draw.draw(st.lists(st.tuples(st.sampled_from(VALUE_BYTES[data]), st.integers(0, 255)), max_size=3))
    cut = draw.draw(mostly(len(data), *range(0, len(data), 7)))
    mutated = bytearray(data[:cut])
    for at, byte in edits:
        if at < len(mutated):
            mutated[at] = byte
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            scaler = pickle.loads(bytes(mutated))
    except UNPICKLE_ERRORS as error:
        assert not isinstance(error, SystemError)
        return
    if isinstance(scaler, ampc.GradScaler):
        _check_restored(scaler)


@st.composite
def scaler_states(draw):
    """The state __getstate__ writes with entries kept, dropped, given any value, or added."""
    state = {}
    for key, value in SCALER_STATE.items():
        fate = draw(mostly("keep", "drop", "replace"))
        if fate != "drop":
            state[key] = value if fate == "keep" else draw(ANY_VALUE | st.sampled_from(["cuda", "cpu", True, False]))
    state.update(draw(st.dictionaries(st.sampled_from(["__dict__", "x", ""]), ANY_VALUE, max_size=1)))
    return state


@settings(max_examples=EXAMPLES, deadline=None, derandomize="AMPC_FUZZ_EXAMPLES" not in os.environ)
@given(scaler_states(), st.booleans())
def test_scaler_setstate_takes_a_state_whole_or_not_at_all(state, sharded):
    import ampc.distributed as dist

    s = dist.ShardedGradScaler("cpu", init_scale=4.0) if sharded else ampc.GradScaler("cpu", init_scale=4.0)
    s.scale(np.float32(1))
    before = s.__getstate__()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            s.__setstate__(state)
    except (TypeError, ValueError) as error:  # a missing entry: StateDictError, a ValueError
        assert str(error)
        assert s.__getstate__() == before
        return
    assert {k: v for k, v in s.__getstate__().items() if k != "__dict__"} == \
        {k: v for k, v in state.items() if k != "__dict__"}  # taken as given
    _check_restored(s)


# -- Module.load_state_dict ----------------------------------------------------------------------

def _model():
    ampc.manual_seed(0)
    return ampc.nn.Sequential(ampc.nn.Linear(3, 2), ampc.nn.BatchNorm2d(2), ampc.nn.Embedding(4, 2))


MODEL_KEYS = list(_model().state_dict())
TENSOR_VALUE = (ANY_VALUE | st.sampled_from([(2,), (2, 3), (3, 2), (), (4, 2), (0,)]).map(np.ones)
                | st.sampled_from([np.float16, np.float64, np.int64, np.bool_, ampc.bfloat16]).map(
                    lambda t: np.ones(2, t)) | st.just(np.array(["a", "b"])) | st.just(np.ones((2, 3))[:, ::2]))


@st.composite
def module_state_dicts(draw):
    sd = {k: v.copy() for k, v in _model().state_dict().items()}
    for key in MODEL_KEYS:
        fate = draw(mostly("keep", "drop", "replace"))
        if fate == "drop":
            del sd[key]
        elif fate == "replace":
            sd[key] = draw(TENSOR_VALUE)
    sd.update(draw(st.dictionaries(st.text(max_size=4), TENSOR_VALUE, max_size=1)))
    return sd, draw(st.booleans())


@settings(max_examples=EXAMPLES, deadline=None, derandomize="AMPC_FUZZ_EXAMPLES" not in os.environ)
@given(module_state_dicts())
def test_module_load_state_dict_takes_a_payload_whole_or_not_at_all(case):
    sd, strict = case
    model = _model()
    before = {k: np.array(v, copy=True) for k, v in model.state_dict().items()}
    try:
        model.load_state_dict(sd, strict=strict)
    except (TypeError, ValueError, RuntimeError) as error:
        assert str(error)
        after = model.state_dict()
        for key, value in before.items():  # nothing half-loaded
            np.testing.assert_array_equal(after[key], value)
            assert after[key].dtype == value.dtype
        return
    after = model.state_dict()
    for key, value in before.items():
        assert after[key].dtype == value.dtype and after[key].shape == value.shape  # the model's own
        if key not in sd:
            np.testing.assert_array_equal(after[key], value)


# -- Optimizer.load_state_dict -------------------------------------------------------------------

def _optimizer(kind):
    ampc.manual_seed(0)
    params = [ampc.Parameter(np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)),
              ampc.Parameter(np.ones(3, np.float32))]
    for p in params:
        p.grad = np.full(p.data.shape, 0.5, np.float32)
    opt = ampc.optim.AdamW(params, lr=0.01) if kind == "adamw" else ampc.optim.SGD(params, lr=0.1, momentum=0.9)
    opt.step()
    return opt


STATE_VALUE = (ANY_VALUE | st.sampled_from([(2, 3), (3,), (), (3, 2), (0,)]).map(np.ones)
               | st.just(np.ones((2, 3), np.float16)) | st.just(np.array(["a", "b"])))


@st.composite
def optimizer_state_dicts(draw, kind):
    """The optimizer's own state dict, each part kept, dropped or replaced: the two top entries, each
    group's settings and params list, each parameter's state and each of its values."""
    sd = _optimizer(kind).state_dict()
    for key in ("state", "param_groups"):
        fate = draw(mostly("keep", "drop", "replace"))
        if fate == "drop":
            del sd[key]
        elif fate == "replace":
            sd[key] = draw(ANY_VALUE | st.just({0: 1}) | st.just([{}]) | st.just([{"params": 3}]))
    for group in sd.get("param_groups", []) if isinstance(sd.get("param_groups"), list) else []:
        if isinstance(group, dict) and draw(mostly(False, True)):
            group[draw(st.sampled_from(["params", "lr", "momentum", "betas", "junk"]))] = draw(ANY_VALUE)
    state = sd.get("state")
    if isinstance(state, dict):
        for index in list(state):
            fate = draw(mostly("keep", "replace", "edit"))
            if fate == "replace":
                state[index] = draw(ANY_VALUE)
            elif fate == "edit" and isinstance(state[index], dict):
                state[index] = dict(state[index], **{draw(st.sampled_from(list(state[index]) + ["junk"])):
                                                     draw(STATE_VALUE)})
    return sd


@settings(max_examples=EXAMPLES, deadline=None, derandomize="AMPC_FUZZ_EXAMPLES" not in os.environ)
@given(st.data(), st.sampled_from(["sgd", "adamw"]))
def test_optimizer_load_state_dict_takes_a_payload_whole_or_not_at_all(data, kind):
    """A checkpoint's optimizer state: refused with a TypeError or ValueError and the optimizer as
    it was (state, settings), or taken, after which it still steps."""
    sd = data.draw(optimizer_state_dicts(kind))
    opt = _optimizer(kind)
    before = opt.state_dict()
    try:
        opt.load_state_dict(sd)
    except (TypeError, ValueError) as error:
        assert str(error)
        after = opt.state_dict()
        assert after["param_groups"] == before["param_groups"]
        for index, values in before["state"].items():
            for name, value in values.items():
                np.testing.assert_array_equal(np.asarray(after["state"][index][name]), np.asarray(value))
        return
    try:
        opt.step()  # what it took, it can use; a setting of the wrong type is refused by the step
    except (TypeError, ValueError, OverflowError) as error:
        assert str(error)


# ---------------------------------------------------------------------------------------------
# dtype and device arguments
# ---------------------------------------------------------------------------------------------


class Hostile:
    """An argument whose every hook raises: str, repr, ==, hash, index, float, dtype lookups."""

    def _boom(self, *args):
        raise KeyError("hostile")

    __str__ = __repr__ = __eq__ = __hash__ = __index__ = __float__ = __len__ = __iter__ = _boom

    @property
    def dtype(self):
        raise KeyError("hostile dtype")


class HostileStr(str):
    """A str (so it passes type checks) whose methods raise."""

    def _boom(self, *args):
        raise KeyError("hostile str")

    __repr__ = __eq__ = __hash__ = __str__ = _boom


NAMES = ["float16", "torch.float16", "bfloat16", "float32", "float64", "float", "half", "bf16", "f2", "<f2", ">f4",
         "=f8", "e", "V3", "int8", "bool", "complex64", "S5", "U3", "O", "M8[s]", "cpu", "cuda", "cuda:0", "cuda:1",
         "cpu:0", "cuda:-1", "cuda:99999999999999999999", "cuda:0x", "mps", "xpu", "meta", "", " cuda", "CUDA",
         "float16\x00", "cuda\x00"]
NP_DTYPES = [np.dtype(d) for d in ("f2", ">f2", ">f4", "f8", "V2", "i1", "u8", "?", "c8", "S3", "U2", "O", "M8[ns]")]
NP_DTYPES += [np.dtype([("a", "f4")]), np.dtype(ml_dtypes.bfloat16), np.dtype(ml_dtypes.float8_e4m3fn)]
TYPES = [np.float16, np.float32, np.int64, np.bool_, float, int, bool, complex, object, str, ml_dtypes.bfloat16,
         ml_dtypes.float8_e5m2, ampc.Array]
SCALARS = (st.sampled_from(NAMES) | st.text(max_size=12) | st.integers() | st.floats() | st.none() | st.booleans()
           | st.binary(max_size=6) | st.sampled_from(NP_DTYPES + TYPES) | st.builds(Hostile)
           | st.sampled_from(NAMES).map(HostileStr))
ARGUMENTS = SCALARS | st.tuples(SCALARS) | st.lists(SCALARS, max_size=2)
REFUSED = (TypeError, ValueError, RuntimeError)
DTYPES = {np.dtype(d) for d in ("f2", "f4", "f8", "?", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8")}
DTYPES.add(np.dtype(ml_dtypes.bfloat16))
ARGUMENT_OUTCOMES = {"taken": 0, "refused": 0}


def autocast_state():
    return [(ampc.is_autocast_enabled(d), ampc.get_autocast_dtype(d), ampc.is_autocast_cache_enabled())
            for d in ("cpu", "cuda")]


def autocast_region(dtype):
    with ampc.autocast("cpu", dtype=dtype):
        assert ampc.is_autocast_enabled("cpu") == (ampc.get_autocast_dtype("cpu") in (ampc.float16, ampc.bfloat16))


def targets(x, model):
    """Each parser of a dtype or device argument, as a function of the argument."""
    return [
        ("as_dtype", lambda a: ampc.as_dtype(a)),
        ("cast", lambda a: ampc.cast(x, a)),
        ("softmax dtype", lambda a: ampc.nn.functional.softmax(x, 0, dtype=a)),
        ("autocast device_type", lambda a: ampc.autocast(a)),
        ("autocast dtype", lambda a: ampc.autocast("cpu", dtype=a)),
        ("autocast region", autocast_region),
        ("is_autocast_enabled", lambda a: ampc.is_autocast_enabled(a)),
        ("get_autocast_dtype", lambda a: ampc.get_autocast_dtype(a)),
        ("is_autocast_available", lambda a: ampc.is_autocast_available(a)),
        ("GradScaler", lambda a: ampc.GradScaler(a)),
        ("Module.to", lambda a: model.to(a)),
        ("custom_fwd", lambda a: ampc.custom_fwd(device_type=a)),
        ("custom_fwd cast_inputs", lambda a: ampc.custom_fwd(device_type="cpu", cast_inputs=a)),
    ]


@settings(max_examples=EXAMPLES, deadline=None, derandomize="AMPC_FUZZ_EXAMPLES" not in os.environ)
@given(ARGUMENTS)
def test_dtype_and_device_arguments_are_taken_or_refused_cleanly(argument):
    """Whatever is passed where a dtype or a device goes: a result, or a TypeError, ValueError or
    RuntimeError with a message (never the argument's own exception, a SystemError or a crash),
    with the input array, the model and the autocast state as they were."""
    x = np.linspace(-2, 2, 5, dtype=np.float32)
    model = ampc.nn.Linear(3, 2)
    weights = {k: np.array(v, copy=True) for k, v in model.state_dict().items()}
    state = autocast_state()
    for name, call in targets(x, model):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # autocast's "CUDA is not available", as torch's
            try:
                result = call(argument)
            except REFUSED as error:
                assert str(error), name
                ARGUMENT_OUTCOMES["refused"] += 1
            else:
                ARGUMENT_OUTCOMES["taken"] += 1
                if name == "as_dtype":
                    assert result in DTYPES and ampc.as_dtype(result) == result
                if name == "Module.to":  # a GPU that exists ("cuda", 0) takes the model there: back, bits intact
                    model.to("cpu")
        np.testing.assert_array_equal(x, np.linspace(-2, 2, 5, dtype=np.float32))
        assert autocast_state() == state, name
        for key, value in model.state_dict().items():  # a failed .to() moved nothing
            assert isinstance(value, np.ndarray), (name, key)
            np.testing.assert_array_equal(value, weights[key])


def test_the_argument_fuzzer_reaches_both_outcomes():
    if not ARGUMENT_OUTCOMES["taken"]:
        pytest.skip("runs after the fuzz test above")
    assert ARGUMENT_OUTCOMES["taken"] > 0 and ARGUMENT_OUTCOMES["refused"] > 0
