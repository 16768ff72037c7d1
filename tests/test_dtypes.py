"""dtype spellings: NumPy dtypes and types, names, torch dtypes."""

import ml_dtypes
import numpy as np
import pytest

import ampc


def test_the_four_floating_dtypes_are_numpy_dtypes():
    assert ampc.float32 == np.dtype(np.float32)
    assert ampc.float16 == np.dtype(np.float16)
    assert ampc.bfloat16 == np.dtype(ml_dtypes.bfloat16)
    assert ampc.float64 == np.dtype(np.float64)
    assert ampc.bfloat16 != ampc.float16  # same size, different format


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
