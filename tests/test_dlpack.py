"""The DLPack consumer and producer: ownership (each deleter called exactly
once), versions, read-only flags, stream arguments, and malformed capsules."""

import sys

import ml_dtypes
import numpy as np
import pytest

import ampc
from dlpack_fakes import READ_ONLY, FakeTensor, Producer, capsule_name, exported


def test_from_dlpack_ndarray_shares_memory(rng):
    x = rng.standard_normal((3, 4)).astype(np.float32)[:, ::2]
    a = ampc.from_dlpack(x)
    assert isinstance(a, ampc.Array)
    assert a.data_ptr() == x.ctypes.data
    assert (a.shape, a.strides, a.dtype, a.device, a.readonly) == (x.shape, x.strides, x.dtype, "cpu", False)
    assert a.ndim == 2 and a.size == 6 and a.itemsize == 4 and a.nbytes == 24
    back = np.from_dlpack(a)
    assert back.ctypes.data == x.ctypes.data
    np.testing.assert_array_equal(back, x)


def test_bfloat16_round_trip_without_copy():
    x = np.arange(12, dtype=np.float32).reshape(3, 4).astype(ml_dtypes.bfloat16)
    a = ampc.from_dlpack(x)  # NumPy's own __dlpack__ refuses bfloat16
    with pytest.raises(BufferError):
        x.__dlpack__()
    assert a.dtype == ampc.bfloat16
    view = np.asarray(a)
    assert view.dtype == ampc.bfloat16 and view.ctypes.data == x.ctypes.data
    cap = a.__dlpack__(max_version=(1, 0))  # kept alive while its struct is read
    t = exported(cap).dl_tensor
    assert (t.dtype.code, t.dtype.bits, t.dtype.lanes) == (4, 16, 1)  # kDLBfloat


def test_numpy_bfloat16_reaches_torch_through_ampc():
    torch = pytest.importorskip("torch")
    x = np.arange(6, dtype=np.float32).astype(ml_dtypes.bfloat16)
    t = torch.from_dlpack(ampc.from_dlpack(x))
    assert t.dtype == torch.bfloat16 and t.data_ptr() == x.ctypes.data
    assert t.float().tolist() == [0, 1, 2, 3, 4, 5]


def test_array_protocol_copy_and_dtype(rng):
    x = rng.standard_normal(5).astype(np.float32)
    a = ampc.from_dlpack(x)
    assert np.asarray(a).ctypes.data == x.ctypes.data
    assert np.array(a, copy=True).ctypes.data != x.ctypes.data
    np.testing.assert_array_equal(np.asarray(a, dtype=np.float64), x.astype(np.float64))
    assert np.asarray(a, dtype=np.float32).ctypes.data == x.ctypes.data
    with pytest.raises(ValueError, match="copy"):
        a.__array__(np.float64, copy=False)


def test_capsule_kinds_follow_max_version():
    a = ampc.from_dlpack(np.zeros(3, np.float32))
    assert capsule_name(a.__dlpack__()) == "dltensor"  # JAX asks without max_version
    assert capsule_name(a.__dlpack__(max_version=(0, 9))) == "dltensor"
    v = a.__dlpack__(max_version=(1, 0))
    assert capsule_name(v) == "dltensor_versioned"
    m = exported(v)
    assert (m.version.major, m.version.minor) == (1, 0)  # not above what the consumer asked for
    newer = a.__dlpack__(max_version=(1, 5))
    assert exported(newer).version.minor == 1


def test_exported_fields():
    x = np.zeros((5, 6), np.float16)[::-1, ::2]
    cap = ampc.from_dlpack(x).__dlpack__(max_version=(1, 0))
    m = exported(cap)
    t = m.dl_tensor
    assert t.ndim == 2 and [t.shape[i] for i in range(2)] == [5, 3]
    assert [t.strides[i] for i in range(2)] == [-6, 2]  # in elements, negative kept
    assert t.data == x.ctypes.data and t.byte_offset == 0
    assert (t.device.device_type, t.device.device_id) == (1, 0)
    assert m.flags == 0


def test_read_only_is_kept_and_refused_as_legacy():
    x = np.zeros(4, np.float32)
    x.flags.writeable = False
    a = ampc.from_dlpack(x)
    assert a.readonly
    with pytest.raises(BufferError, match="read-only"):
        a.__dlpack__()
    cap = a.__dlpack__(max_version=(1, 0))
    assert exported(cap).flags & READ_ONLY
    assert not np.from_dlpack(a).flags.writeable
    assert not np.asarray(a).flags.writeable
    assert capsule_name(a.__dlpack__(copy=True)) == "dltensor"  # a copy is writable


def test_copy_true_exports_a_copy(rng):
    x = rng.standard_normal(7).astype(np.float32)
    a = ampc.from_dlpack(x)
    cap = a.__dlpack__(max_version=(1, 0), copy=True)
    m = exported(cap)
    assert m.flags & 2 and m.dl_tensor.data != x.ctypes.data
    c = np.from_dlpack(a, copy=True)
    assert c.ctypes.data != x.ctypes.data
    np.testing.assert_array_equal(c, x)


@pytest.mark.parametrize("dtype", [np.int64, np.int8, np.uint16, np.bool_])
def test_copy_true_exports_a_copy_of_any_dtype(rng, dtype):
    """An integer or bool array's copy (the cast kernels took floating dtypes only: this indexed their
    tables past the end), in any layout."""
    x = (rng.standard_normal((3, 5)) * 100).astype(dtype)[:, ::-2]
    c = np.from_dlpack(ampc.from_dlpack(x), copy=True)
    assert c.dtype == x.dtype
    np.testing.assert_array_equal(c, x)


def test_export_arguments_are_checked():
    a = ampc.from_dlpack(np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="stream must be None"):
        a.__dlpack__(stream=1)
    with pytest.raises(BufferError, match="does not copy"):
        a.__dlpack__(dl_device=(2, 0))
    with pytest.raises(TypeError, match="max_version"):
        a.__dlpack__(max_version=1)
    with pytest.raises(TypeError, match="copy"):
        a.__dlpack__(copy="yes")
    with pytest.raises(TypeError):
        a.__dlpack__(1)  # keyword-only
    assert a.__dlpack_device__() == (1, 0)
    assert capsule_name(a.__dlpack__(dl_device=(1, 0))) == "dltensor"


def test_strides_not_multiple_of_itemsize_cannot_be_exported():
    rec = np.zeros(6, dtype=[("a", np.float32), ("b", np.int8)])["a"]  # stride 5 bytes
    a = ampc.from_dlpack(rec)
    with pytest.raises(BufferError, match="multiple"):
        a.__dlpack__(max_version=(1, 0))
    assert ampc.cast(rec, np.float16).strides == (2,)  # reading through byte strides is fine


def test_unconsumed_export_releases_its_owner():
    a = ampc.from_dlpack(np.zeros(3, np.float32))
    before = sys.getrefcount(a)
    for _ in range(100):
        cap = a.__dlpack__(max_version=(1, 0))
        assert sys.getrefcount(a) == before + 1
        del cap
    assert sys.getrefcount(a) == before


def test_consumed_capsule_deleter_runs_once(rng):
    data = rng.standard_normal(4).astype(np.float32)
    for versioned in (True, False):
        fake = FakeTensor(data=data.ctypes.data, shape=(4,), versioned=versioned)
        a = ampc.from_dlpack(fake.capsule)
        assert capsule_name(fake.capsule) == ("used_dltensor_versioned" if versioned else "used_dltensor")
        assert a.readonly == (not versioned)  # a legacy capsule cannot say it may be written
        np.testing.assert_array_equal(np.asarray(a), data)
        y = ampc.cast(a, np.float64)
        assert isinstance(y, ampc.Array)  # unknown source type: ampc's own array
        np.testing.assert_array_equal(np.asarray(y), data.astype(np.float64))
        with pytest.raises(BufferError, match="already consumed"):
            ampc.from_dlpack(fake.capsule)
        assert fake.deleted == 0
        del a
        assert fake.deleted == 1


BAD = [
    (dict(ndim=-1), "ndim -1"),
    (dict(shape=(1,) * 65), "ndim 65"),
    (dict(null_shape=True), "shape is NULL"),
    (dict(shape=(2, -3)), "negative or too large"),
    (dict(shape=(2**40, 2**40)), "negative or too large"),
    (dict(data=None, shape=(3,)), "data pointer is NULL"),
    (dict(lanes=4), "4 lanes"),
    (dict(code=2, bits=24), "24 bits"),
    (dict(code=5, bits=64), "code 5"),  # complex
    (dict(code=10, bits=8), "code 10"),  # float8_e4m3fn
    (dict(major=2), "version 2.1"),
    (dict(device=(4, 0)), "device type 4"),
    (dict(device=(2, -1)), "device id -1"),
    (dict(byte_offset=2**64 - 8), "past the address space"),
    (dict(shape=(3,), strides=(2**62,)), "stride"),
    (dict(shape=(2**61,), bits=64), "negative or too large"),
    (dict(device=(2, 0), data=4097, bits=16), "not aligned to its 2-byte elements"),  # GPU kernels read whole elements
    (dict(device=(2, 0), byte_offset=6, bits=64), "not aligned to its 8-byte elements"),
]


@pytest.mark.parametrize("fields,match", BAD, ids=[m for _, m in BAD])
def test_malformed_capsules_are_refused_and_not_consumed(fields, match):
    fields = {"data": 4096, **fields}
    fake = FakeTensor(**fields)
    name = capsule_name(fake.capsule)
    with pytest.raises(BufferError, match=match):
        ampc.from_dlpack(fake.capsule)
    assert capsule_name(fake.capsule) == name  # the producer still owns it
    assert fake.deleted == 0


def test_zero_size_with_null_data_is_fine():
    fake = FakeTensor(data=None, shape=(0, 5))
    a = ampc.from_dlpack(fake.capsule)
    assert a.shape == (0, 5)
    assert ampc.cast(a, np.float16).shape == (0, 5)


def test_other_capsules_are_type_errors():
    import datetime  # any non-DLPack capsule: the datetime C API capsule

    with pytest.raises(TypeError, match="not a DLPack tensor"):
        ampc.from_dlpack(datetime.datetime_CAPI)
    with pytest.raises(TypeError, match="no __dlpack__"):
        ampc.from_dlpack([1, 2])


def test_consumer_asks_for_versioned_and_falls_back():
    x = np.arange(4, dtype=np.float32)
    p = Producer(x)
    assert np.asarray(ampc.cast(p, np.float16)).tolist() == [0, 1, 2, 3]
    assert p.calls == [{"max_version": (1, 1)}]  # no stream for CPU memory
    old = Producer(x, legacy_only=True)
    ampc.from_dlpack(old)
    assert old.calls == [{"max_version": (1, 1)}, {}]


def test_out_asks_producer_not_to_copy():
    out = np.zeros(4, np.float16)
    p = Producer(out)
    assert ampc.cast(np.ones(4, np.float32), out=p) is p
    assert p.calls == [{"max_version": (1, 1), "copy": False}]
    np.testing.assert_array_equal(out, 1)


def test_out_through_legacy_capsule_is_read_only():
    out = np.zeros(4, np.float16)
    with pytest.raises(ValueError, match="read-only"):
        ampc.cast(np.ones(4, np.float32), out=Producer(out, legacy_only=True))
    assert (out == 0).all()


def test_bad_dlpack_device():
    class Broken:
        def __dlpack_device__(self):
            return "cpu"

        def __dlpack__(self, **kw):
            raise AssertionError("must not be called")

    with pytest.raises(BufferError, match="__dlpack_device__"):
        ampc.cast(Broken(), np.float16)


def test_producer_returning_garbage():
    class Liar:
        def __dlpack_device__(self):
            return (1, 0)

        def __dlpack__(self, **kw):
            return 42

    with pytest.raises(TypeError, match="not a capsule"):
        ampc.cast(Liar(), np.float16)


def test_no_reference_leaks(rng):
    x = rng.standard_normal(100).astype(np.float32)
    out = np.empty(100, np.float16)
    base = sys.getrefcount(x), sys.getrefcount(out)
    for _ in range(2000):
        ampc.cast(x, np.float16)
        ampc.cast(x, out=out)
        ampc.from_dlpack(x)
        ampc.cast(Producer(x), "bf16")
        with pytest.raises(TypeError):
            ampc.cast(x, "int8")
    assert (sys.getrefcount(x), sys.getrefcount(out)) == base
