"""dtype spellings: NumPy dtypes and types, names, torch dtypes."""

import ml_dtypes
import numpy as np
import pytest

import ampc
from ampc import _C
from dlpack_fakes import FakeTensor, exported


def test_the_four_floating_dtypes_are_numpy_dtypes():
    assert ampc.float32 == np.dtype(np.float32)
    assert ampc.float16 == np.dtype(np.float16)
    assert ampc.bfloat16 == np.dtype(ml_dtypes.bfloat16)
    assert ampc.float64 == np.dtype(np.float64)
    assert ampc.bfloat16 != ampc.float16  # same size, different format


# kernels/dtypes.def's rows: the numbers cross the boundary between ampc._C and ampc._cuda, so they
# never change (new dtypes are appended: float8_e4m3fn and float8_e5m2 come next, at 13 and 14).
# (name, kind, size, DLPack code, DLPack bits, NumPy dtype), in ampc's dtype number order.
DTYPE_ROWS = [
    ("float32", "float", 4, 2, 32, np.dtype(np.float32)),
    ("float16", "float", 2, 2, 16, np.dtype(np.float16)),
    ("bfloat16", "float", 2, 4, 16, np.dtype(ml_dtypes.bfloat16)),
    ("float64", "float", 8, 2, 64, np.dtype(np.float64)),
    ("bool", "bool", 1, 6, 8, np.dtype(np.bool_)),
    ("int8", "int", 1, 0, 8, np.dtype(np.int8)),
    ("int16", "int", 2, 0, 16, np.dtype(np.int16)),
    ("int32", "int", 4, 0, 32, np.dtype(np.int32)),
    ("int64", "int", 8, 0, 64, np.dtype(np.int64)),
    ("uint8", "uint", 1, 1, 8, np.dtype(np.uint8)),
    ("uint16", "uint", 2, 1, 16, np.dtype(np.uint16)),
    ("uint32", "uint", 4, 1, 32, np.dtype(np.uint32)),
    ("uint64", "uint", 8, 1, 64, np.dtype(np.uint64)),
]


def test_the_dtype_numbers_are_pinned():
    assert list(_C._dtypes()) == DTYPE_ROWS


@pytest.mark.parametrize("row", DTYPE_ROWS, ids=[r[0] for r in DTYPE_ROWS])
def test_every_dtype_round_trips_through_its_name_numpy_and_dlpack(row):
    name, _, size, code, bits, dtype = row
    assert ampc.as_dtype(name) == dtype and ampc.as_dtype(dtype) == dtype and dtype.itemsize == size
    x = np.arange(3).astype(dtype)
    a = ampc.from_dlpack(x)  # NumPy's dtype in
    assert a.dtype == dtype
    t = exported(cap := a.__dlpack__(max_version=(1, 0))).dl_tensor  # DLPack's type out
    assert (t.dtype.code, t.dtype.bits, t.dtype.lanes) == (code, bits, 1)
    del cap
    fake = FakeTensor(data=x.ctypes.data, shape=(3,), code=code, bits=bits)  # DLPack's type in
    b = ampc.from_dlpack(fake.capsule)
    assert b.dtype == dtype and np.array_equal(np.asarray(b), x)


@pytest.mark.parametrize("code,bits", [(2, 8), (4, 32), (6, 16), (0, 128), (10, 8), (12, 8), (7, 8), (5, 64)])
def test_dlpack_types_no_row_names_are_refused(code, bits):
    x = np.zeros(4, np.uint8 if bits == 8 else np.float64)
    fake = FakeTensor(data=x.ctypes.data, shape=(1,), code=code, bits=bits)
    with pytest.raises((BufferError, TypeError)):
        ampc.from_dlpack(fake.capsule)


@pytest.mark.parametrize(
    "spelling,expected",
    [
        ("float16", np.float16), ("half", np.float16), ("fp16", np.float16), (np.float16, np.float16),
        ("f2", np.float16), ("<f2", np.float16), ("e", np.float16),
        ("bfloat16", ml_dtypes.bfloat16), ("bf16", ml_dtypes.bfloat16), (ml_dtypes.bfloat16, ml_dtypes.bfloat16),
        (np.dtype(ml_dtypes.bfloat16), ml_dtypes.bfloat16),
        ("float32", np.float32), ("single", np.float32), ("fp32", np.float32), ("f4", np.float32),
        ("float64", np.float64), ("double", np.float64), ("fp64", np.float64), (float, np.float64),
        ("int32", np.int32), (np.int64, np.int64), ("uint8", np.uint8), (bool, np.bool_), ("bool", np.bool_),
        (np.intp, np.intp), (np.longlong, np.int64), (np.ulonglong, np.uint64),
    ],
)
def test_as_dtype(spelling, expected):
    assert ampc.as_dtype(spelling) == np.dtype(expected)


@pytest.mark.parametrize(
    "spelling,error,match",
    [
        ("float", ValueError, "ambiguous"),
        ("floaty", TypeError, "not a dtype"),
        (None, TypeError, "None"),
        (np.complex64, TypeError, "does not support"),
        ("float8_e4m3fn", TypeError, "does not support"),
        (np.dtype(">f4"), TypeError, "does not support"),
        (3.5, TypeError, "not a dtype"),
        (np.longdouble, TypeError, "does not support"),
    ],
)
def test_as_dtype_errors(spelling, error, match):
    with pytest.raises(error, match=match):
        ampc.as_dtype(spelling)


def test_torch_dtypes():
    torch = pytest.importorskip("torch")
    assert ampc.as_dtype(torch.float16) == ampc.float16
    assert ampc.as_dtype(torch.half) == ampc.float16
    assert ampc.as_dtype(torch.bfloat16) == ampc.bfloat16
    assert ampc.as_dtype(torch.float32) == ampc.float32
    assert ampc.as_dtype(torch.float64) == ampc.float64
    assert ampc.as_dtype(torch.int8) == np.int8
    with pytest.raises(TypeError, match="does not support"):
        ampc.as_dtype(torch.complex64)
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    y = ampc.cast(x, torch.bfloat16)
    assert isinstance(y, torch.Tensor) and y.dtype == torch.bfloat16
    assert torch.equal(y, x.to(torch.bfloat16))


def test_torch_is_recognised_by_its_types_module():
    """torch's dtype is torch.dtype by module and name (ampc._interop.is_torch's rule, which the C
    side shares): read through its str(); a class of that name elsewhere in torch is not one."""
    from ampc._interop import is_torch

    def named(module, name, text):
        return type(name, (), {"__module__": module, "__str__": lambda self: text})()

    half = named("torch", "dtype", "torch.float16")
    assert is_torch(half, "dtype") and ampc.as_dtype(half) == ampc.float16
    assert ampc.as_dtype(named("torch", "dtype", "torch.bfloat16")) == ampc.bfloat16
    with pytest.raises(TypeError, match="does not support dtype"):
        ampc.as_dtype(named("torch", "dtype", "torch.complex64"))
    elsewhere = named("torch.cuda", "dtype", "torch.float16")
    assert is_torch(elsewhere) and not is_torch(elsewhere, "dtype")
    with pytest.raises(TypeError, match="is not a dtype"):
        ampc.as_dtype(elsewhere)
    assert not is_torch(named("torchvision", "dtype", "torch.float16"))


def test_an_interrupt_inside_repr_is_not_swallowed():
    """An error message names the object by its repr, or its type's name when __repr__ fails; a
    KeyboardInterrupt raised in __repr__ is the user's Ctrl-C, not a failure to hide."""
    class Interrupting:
        def __repr__(self):
            raise KeyboardInterrupt

    class Failing:
        def __repr__(self):
            raise KeyError("no repr")

    class FailingStr(str):
        def __repr__(self):
            raise KeyError("no repr")

    with pytest.raises(KeyboardInterrupt):
        ampc.as_dtype(Interrupting())
    with pytest.raises(TypeError, match="Failing object"):
        ampc.as_dtype(Failing())
    # every message that names an object by its repr goes through the same helper
    with pytest.raises(ValueError, match="GradScaler: device must be 'cuda' or 'cpu', got <FailingStr object>"):
        ampc.GradScaler(FailingStr("gpu"))
    with pytest.raises(ValueError, match="register_autocast: policy must be one of .* got <FailingStr object>"):
        ampc.register_autocast("an_op_of_mine", FailingStr("fastest"))
    with pytest.raises(TypeError, match="register_autocast: policy must be one of .* got <Failing object>"):
        ampc.register_autocast("an_op_of_mine", Failing())


def test_ampc_exports_the_floating_dtypes_the_table_lists():
    from ampc.nn._common import FLOATING, FLOATING_NAMES

    floating = [(name, dtype) for name, kind, *_, dtype in _C._dtypes() if kind == "float"]
    assert [name for name, _ in floating] == ["float32", "float16", "bfloat16", "float64"]
    for name, dtype in floating:
        assert getattr(ampc, name) == dtype and name in ampc.__all__ and name in dir(ampc)
    assert FLOATING == {dtype for _, dtype in floating}
    assert FLOATING_NAMES == "float32, float16, bfloat16 or float64"
    with pytest.raises(AttributeError, match="no attribute 'int8'"):
        ampc.int8  # noqa: B018  (only the floating dtypes are ampc's names, as before)
