"""The array core under hostile use (issue 50): sizes that wrap int64, DLPack deleters that run
Python while an error is pending, Python code that changes what ampc is reading, in-place writes
that autocast's weight-cast cache must see, and refused calls that must change nothing."""

import gc

import numpy as np
import pytest

import ampc
from dlpack_fakes import DELETER, DestroyedCapsule, FakeTensor

# --------------------------------------------------------------------------------------------
# Size arithmetic: every product and sum of shapes, strides, itemsizes and offsets checked
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape, strides, offset", [
    ((5,), (2**62,), 0),           # (5 - 1) * 2**62 wrapped to 0: passed, and np.asarray of it crashed
    ((3,), (2**62,), 0),           # 2 * 2**62 wraps to -2**63
    ((2, 2), (2**62, 2**62), 0),   # each span fits, their sum does not
    ((2,), (-(2**62),), 2**62),    # offset + a negative span
    ((1,), (4,), 2**63 - 4),       # offset + itemsize
])
def test_view_extents_that_wrap_are_refused(shape, strides, offset):
    a = ampc.from_dlpack(np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="_view"):
        a._view(shape, strides, offset)


def test_view_of_one_element_takes_any_stride():
    """A size-1 dimension takes no step: its stride (INT64_MIN included) is never multiplied."""
    x = np.arange(4, dtype=np.float32)
    v = ampc.from_dlpack(x)._view((1, 2), (-(2**63), 4), 4)
    np.testing.assert_array_equal(np.asarray(v), [[1.0, 2.0]])
    np.testing.assert_array_equal(ampc.cast(v, np.float64), [[1.0, 2.0]])


def test_view_size_counts_the_itemsize():
    a = ampc.from_dlpack(np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="_view"):
        a._view((2**61, 2), (0, 0), 0)  # 2**62 elements of 4 bytes: its nbytes wrapped


def test_zero_size_arrays_of_unrepresentable_shape_are_refused():
    """NumPy's rule: a zero-size array's other dimensions must still multiply to a size (else the
    strides of a new array like it, computed from them, wrap)."""
    a = ampc.from_dlpack(np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="_view"):
        a._view((0, 2**40, 2**40), (0, 0, 0), 0)
    f = FakeTensor(data=None, shape=(0, 2**40, 2**40))
    with pytest.raises(BufferError, match="too large"):
        ampc.from_dlpack(f.capsule)
    assert f.deleted == 0  # refused before it was taken: the capsule keeps it


def test_dlpack_strides_that_wrap_are_refused():
    buf = np.zeros(8, np.float32)
    for strides in ((2**61,), (2**62,), (-(2**61),)):  # times 4 bytes, or times the 4 steps of 5 elements
        f = FakeTensor(data=buf.ctypes.data, shape=(5,), strides=strides)
        with pytest.raises(BufferError):
            ampc.from_dlpack(f.capsule)


def test_ndarray_strides_past_int64_are_refused():
    """as_strided bounds nothing: a view whose last element is 2**64 bytes on is refused, not
    walked with offsets that wrap."""
    x = np.zeros(4, np.float32)
    wild = np.lib.stride_tricks.as_strided(x, shape=(5,), strides=(2**62,))
    with pytest.raises(ValueError, match="2\\*\\*63"):
        ampc.cast(wild, np.float16)


def test_outputs_too_large_are_a_value_error():
    x = np.zeros(1, np.float32)
    with pytest.raises(ValueError, match="too large"):
        ampc._C._ew(0, x, shape=(2**40, 2**40))


# --------------------------------------------------------------------------------------------
# Borrowed state across Python: a shape list that its own items' __index__ changes
# --------------------------------------------------------------------------------------------


class _Shrinks:
    """An int whose __index__ empties the list that holds it."""

    def __init__(self, value, holder):
        self.value, self.holder = value, holder

    def __index__(self):
        self.holder.clear()
        gc.collect()
        return self.value


def test_shape_list_emptied_by_index_is_an_error_not_a_crash():
    a = ampc.from_dlpack(np.zeros(16, np.float32))
    shape = [None, 2, 2]
    shape[0] = _Shrinks(4, shape)
    with pytest.raises(RuntimeError, match="changed size"):
        a._view(shape, (16, 8, 4), 0)  # read past the emptied list's items
    strides = [None, 8, 4]
    strides[0] = _Shrinks(16, strides)
    with pytest.raises(RuntimeError, match="changed size"):
        a._view((4, 2, 2), strides, 0)


def test_parameter_of_a_parameter_holds_the_array_through_a_collection():
    """Parameter(p) took p's array borrowed across its own allocation, whose garbage collection ran
    a finalizer that assigned p.data: the new Parameter then held the freed array (a segfault)."""
    p = ampc.Parameter(np.arange(100000, dtype=np.float64))

    class Reassigns:
        def __del__(self):
            p.data = np.zeros(3)

    gc.collect()
    thresholds = gc.get_threshold()
    gc.set_threshold(1, 1, 1)
    try:
        cycle = Reassigns()
        cycle.me = cycle
        del cycle
        q = ampc.Parameter(p)
    finally:
        gc.set_threshold(*thresholds)
    gc.collect()
    assert q.data.shape in ((100000,), (3,))  # whichever array p held when q took it, alive
    if q.data.shape == (100000,):
        np.testing.assert_array_equal(q.data[:5], [0, 1, 2, 3, 4])


# --------------------------------------------------------------------------------------------
# Pending exceptions: a producer's deleter that runs Python while ampc raises
# --------------------------------------------------------------------------------------------


def test_refused_out_keeps_its_error_through_a_python_deleter():
    """A legacy capsule is read-only; cast refuses it and drops the imported tensor, whose ctypes
    deleter runs Python: the ValueError reaches the caller (it was 'SystemError: returned NULL
    without setting an exception')."""
    buf = np.zeros(4, np.float32)
    f = FakeTensor(data=buf.ctypes.data, versioned=False)
    with pytest.raises(ValueError, match="read-only"):
        ampc.cast(np.ones(4, np.float32), out=f.capsule)
    assert f.deleted == 1
    np.testing.assert_array_equal(buf, 0)


def test_a_deleter_that_raises_is_unraisable_and_the_pending_error_stays(monkeypatch):
    buf = np.zeros(4, np.float32)
    f = FakeTensor(data=buf.ctypes.data, versioned=False)
    seen = []
    monkeypatch.setattr("sys.unraisablehook", lambda u: seen.append(u.exc_type))

    def raising(_):
        f.deleted += 1
        raise KeyError("from the deleter")

    f._deleter = DELETER(raising)
    f.managed.deleter = f._deleter
    with pytest.raises(ValueError, match="read-only"):
        ampc.cast(np.ones(4, np.float32), out=f.capsule)
    assert f.deleted == 1
    # ctypes reports the callback's own error itself; nothing of it is left set for ampc's caller
    assert all(t is not ValueError for t in seen)


def test_a_refused_producers_capsule_dies_without_clobbering_the_error():
    """__dlpack__ hands a capsule of a DLPack version ampc does not read; ampc refuses it and drops
    it, and its destructor (the producer's, running Python) must not clobber the BufferError."""
    buf = np.zeros(4, np.float32)

    class Producer:
        def __init__(self):
            self.made = []

        def __dlpack_device__(self):
            return (1, 0)

        def __dlpack__(self, **kwargs):
            self.made.append(DestroyedCapsule(FakeTensor(data=buf.ctypes.data, major=2)))
            return self.made[-1].capsule()

    producer = Producer()
    with pytest.raises(BufferError, match="version 2"):
        ampc.cast(producer, np.float16)
    assert [c.destroyed for c in producer.made] == [1]


@pytest.mark.parametrize("raised", [KeyboardInterrupt, MemoryError])
def test_a_dtype_lookup_keeps_an_interrupt(raised):
    """NumPy's dtype converter reads an object's .dtype; a Ctrl-C or MemoryError raised there went
    into "is not a dtype" (TypeError). An ordinary error still does."""
    class Hostile:
        @property
        def dtype(self):
            raise raised

    class Ordinary:
        @property
        def dtype(self):
            raise RuntimeError("no dtype here")

    with pytest.raises(raised):
        ampc.as_dtype(Hostile())
    with pytest.raises(TypeError, match="is not a dtype"):
        ampc.as_dtype(Ordinary())



@pytest.mark.parametrize("raised", [KeyboardInterrupt, MemoryError])
def test_a_dlpack_device_lookup_keeps_an_interrupt(raised):
    """__dlpack_device__'s numbers are read through their __index__; a Ctrl-C or MemoryError raised
    there went into "must return a (device_type, device_id) tuple" (BufferError). An ordinary
    error still does."""
    class Index:
        def __init__(self, error):
            self.error = error

        def __index__(self):
            raise self.error

    class Producer:
        def __init__(self, error):
            self.error = error

        def __dlpack_device__(self):
            return (1, Index(self.error))

        def __dlpack__(self, **kwargs):
            raise AssertionError("must not be called")

    with pytest.raises(raised):
        ampc.cast(Producer(raised), np.float16)
    with pytest.raises(raised):
        ampc.GradScaler("cpu").scale(Producer(raised))
    with pytest.raises(BufferError, match="__dlpack_device__"):
        ampc.cast(Producer(ValueError("no index here")), np.float16)

# --------------------------------------------------------------------------------------------
# Version counting: every in-place write ampc makes to a Parameter counts, so autocast's
# weight-cast cache never hands out the cast of the values before it
# --------------------------------------------------------------------------------------------


def _write_cast(p):
    ampc.cast(np.full((2, 2), 3.0, np.float32), out=p)


def _write_relu(p):
    ampc.nn.functional.relu(p, inplace=True)


def _write_silu(p):
    ampc.nn.functional.silu(p, inplace=True)


def _write_dropout(p):
    ampc.nn.functional.dropout(p, 0.5, True, inplace=True)


def _write_zero(p):
    ampc._C.zero_(p)  # what Module.zero_grad(set_to_none=False) writes with


@pytest.mark.parametrize("write", [_write_cast, _write_relu, _write_silu, _write_dropout, _write_zero])
def test_in_place_writes_reach_the_weight_cast_cache(write):
    F = ampc.nn.functional
    x = np.eye(2, dtype=np.float32)
    p = ampc.Parameter(np.array([[-1.0, -2.0], [-3.0, -4.0]], np.float32))
    with ampc.autocast("cpu"):
        F.linear(x, p)  # caches p's bfloat16 copy
        before = p._version
        with ampc.no_grad():  # in place on a leaf that requires grad is refused, as torch's
            write(p)
        again = F.linear(x, p)
    assert p._version == before + 1
    want = np.asarray(p).astype(ampc.bfloat16).astype(np.float32).T  # x @ p.T, p as it is now
    np.testing.assert_array_equal(np.asarray(again, np.float32), want)


@pytest.mark.parametrize("share", ["Parameter(p)", "q.data = p"])
def test_a_parameter_sharing_an_array_shares_its_version_counter(share):
    """Parameter(p) holds p's array, as torch's detach() shares p's storage and version counter: a
    write through either one makes the other's cached cast stale."""
    F = ampc.nn.functional
    x = np.eye(2, dtype=np.float32)
    p = ampc.Parameter(np.array([[1.0, 2.0], [3.0, 4.0]], np.float32))
    if share == "Parameter(p)":
        q = ampc.Parameter(p)
    else:
        q = ampc.Parameter(np.zeros((2, 2), np.float32))
        q.data = p
    assert q.data is p.data
    with ampc.autocast("cpu"):
        F.linear(x, p)  # caches p's bfloat16 copy
        F.linear(x, q)
        with ampc.no_grad():
            ampc.cast(np.full((2, 2), 8.0, np.float32), out=q)  # written through q ...
        assert p._version == q._version
        np.testing.assert_array_equal(np.asarray(F.linear(x, p), np.float32), 8.0)  # ... seen through p
        q.grad = np.ones((2, 2), np.float32)
        ampc.optim.SGD([p, q][1:], lr=1.0).step()  # a step of q
        np.testing.assert_array_equal(np.asarray(F.linear(x, p), np.float32), 7.0)
        p.bump_version()
        assert q._version == p._version
    r = ampc.Parameter(q)  # counts in p's counter too (one level)
    r.bump_version()
    assert p._version == q._version == r._version
    q.data = np.zeros((2, 2), np.float32)  # q's own array again: its own counter
    before = p._version
    q.bump_version()
    assert p._version == before


def test_a_refused_write_counts_nothing():
    p = ampc.Parameter(np.zeros((2, 2), np.float32))
    with pytest.raises(ValueError, match="shape"):
        ampc.cast(np.ones((3,), np.float32), out=p)
    assert p._version == 0


def test_batch_norm_running_statistics_count_as_written():
    F = ampc.nn.functional
    x = np.arange(8, dtype=np.float32).reshape(4, 2)
    mean, var = ampc.Parameter(np.zeros(2, np.float32)), ampc.Parameter(np.ones(2, np.float32))
    with ampc.no_grad():
        F.batch_norm(x, mean, var, training=True)
        assert (mean._version, var._version) == (1, 1)
        np.testing.assert_allclose(np.asarray(mean), 0.1 * x.mean(0), rtol=1e-6)
        F.batch_norm(x, mean, var, training=False)  # evaluation reads them only
        assert (mean._version, var._version) == (1, 1)


# --------------------------------------------------------------------------------------------
# Refused calls change nothing
# --------------------------------------------------------------------------------------------


def test_load_state_dict_with_a_read_only_target_writes_no_key():
    """The bias's array is read-only: found with the other checks, before the weight (copied
    first) is written; its version stays too."""
    layer = ampc.nn.Linear(3, 2)
    weight = layer.weight.data.copy()
    layer.bias.data.flags.writeable = False
    state = {"weight": np.ones((2, 3), np.float32), "bias": np.ones(2, np.float32)}
    with pytest.raises(RuntimeError, match='"bias".*read-only'):
        layer.load_state_dict(state)
    np.testing.assert_array_equal(layer.weight.data, weight)
    assert layer.weight._version == 0
    layer.bias.data.flags.writeable = True
    layer.load_state_dict(state)
    np.testing.assert_array_equal(layer.weight.data, 1.0)
    assert layer.weight._version == 1
