"""ampc.cast against the reference (NumPy's float16, ml_dtypes' bfloat16, with
ampc's NaN rule) bit for bit, on every instruction set, layout and size, and its
refusals of bad input."""

import ml_dtypes
import numpy as np
import pytest

import ampc
from ampc import _reference as ref

from cast_samples import FLOATS, PAIR_IDS, PAIRS, assert_bits_equal, samples


@pytest.mark.parametrize("src,dst", PAIRS, ids=PAIR_IDS)
def test_bits_match_reference_on_every_isa(isa, src, dst, rng):
    x = samples(src, rng)
    assert_bits_equal(ampc.cast(x, dst), ref.cast(x, dst))


def ml_dtypes_rounds_float64_twice():
    """ml_dtypes 0.6 and older round float64 -> bfloat16 through float32."""
    just_above_a_tie = np.array([1 + 2**-8 + 2**-40])
    return int(ref.bits(just_above_a_tie.astype(ml_dtypes.bfloat16))[0]) == 0x3F80


@pytest.mark.parametrize("src,dst", PAIRS, ids=PAIR_IDS)
def test_matches_numpy_and_ml_dtypes_except_nan_bits(src, dst, rng):
    """Against the libraries themselves: equal bits on every non-NaN, NaN exactly where they give NaN."""
    if (src, dst) == (FLOATS[3], FLOATS[2]) and ml_dtypes_rounds_float64_twice():
        pytest.skip(f"ml_dtypes {ml_dtypes.__version__} rounds float64 -> bfloat16 twice; ampc rounds once")
    x = samples(src, rng)
    with np.errstate(all="ignore"):
        theirs = x.astype(np.float32).astype(dst) if {src, dst} == {FLOATS[1], FLOATS[2]} else x.astype(dst)
    ours = ampc.cast(x, dst)
    nan = np.isnan(theirs)
    np.testing.assert_array_equal(np.isnan(ours), nan)
    np.testing.assert_array_equal(ref.bits(ours)[~nan], ref.bits(theirs)[~nan])


# ampc's NaN rule and rounding, on values whose results are known from the
# hardware (x86 F16C / AVX512-BF16, measured in spec/ecosystem.md).
KNOWN = [
    (0x00400000, np.float16, 0x0000), (0x00400000, ml_dtypes.bfloat16, 0x0040),
    (0x007FFFFF, ml_dtypes.bfloat16, 0x0080), (0x3F808000, ml_dtypes.bfloat16, 0x3F80),
    (0x3F818000, ml_dtypes.bfloat16, 0x3F82), (0x3F808000, np.float16, 0x3C04),
    (0x7F7FFFFF, ml_dtypes.bfloat16, 0x7F80), (0x7F7FFFFF, np.float16, 0x7C00),
    (0x477FF000, ml_dtypes.bfloat16, 0x4780), (0x477FF000, np.float16, 0x7C00),
    (0x387FC000, np.float16, 0x03FF), (0x387FC000, ml_dtypes.bfloat16, 0x3880),
    (0x7F800001, np.float16, 0x7E00), (0xFF800001, np.float16, 0xFE00), (0x7FA00000, np.float16, 0x7F00),
    (0x7F800001, ml_dtypes.bfloat16, 0x7FC0), (0xFF800001, ml_dtypes.bfloat16, 0xFFC0),
    (0x7FA00000, ml_dtypes.bfloat16, 0x7FE0),
]


@pytest.mark.parametrize("f32_bits,dtype,expected", KNOWN, ids=[f"{b:#010x}->{np.dtype(d)}" for b, d, _ in KNOWN])
def test_known_results(isa, f32_bits, dtype, expected):
    x = np.full(37, f32_bits, np.uint32).view(np.float32)  # long enough for the vector path and a tail
    assert (ref.bits(ampc.cast(x, dtype)) == expected).all()


def test_float64_rounds_once(isa):
    """Just above a bfloat16 tie: rounding through float32 would land on the tie and round to even."""
    x = np.array([1 + 2**-8 + 2**-40, -(1 + 2**-8 + 2**-40), 1 + 2**-11 + 2**-45] * 11)
    assert ref.bits(ampc.cast(x, ml_dtypes.bfloat16))[:2].tolist() == [0x3F81, 0xBF81]
    assert ref.bits(ampc.cast(x, np.float16))[2] == 0x3C01


def test_widening_quiets_nan_and_keeps_payload(isa):
    h = np.array([0x7C01, 0xFD55, 0x7E00], np.uint16).view(np.float16)
    assert ref.bits(ampc.cast(h, np.float32)).tolist() == [0x7FC02000, 0xFFEAA000, 0x7FC00000]
    b = np.array([0x7F81, 0xFFC1], np.uint16).view(ml_dtypes.bfloat16)
    assert ref.bits(ampc.cast(b, np.float32)).tolist() == [0x7FC10000, 0xFFC10000]


@pytest.mark.parametrize("n", [0, 1, 2, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 1000, 4097, 65539])
@pytest.mark.parametrize("offset", [0, 1, 3])
def test_sizes_and_alignments(isa, n, offset, rng):
    """Every size around the vector widths, starting at unaligned addresses."""
    for src, dst in [(FLOATS[0], FLOATS[1]), (FLOATS[0], FLOATS[2]), (FLOATS[1], FLOATS[0]),
                     (FLOATS[2], FLOATS[1]), (FLOATS[3], FLOATS[0]), (FLOATS[0], FLOATS[3])]:
        pool = samples(src, rng, n + offset)
        x = pool[pool.size - n - offset:][offset:]  # n values after `offset` elements
        assert x.size == n
        assert_bits_equal(ampc.cast(x, dst), ref.cast(x, dst))


@pytest.mark.parametrize("offset", [0, 1])
def test_large_outputs_use_streaming_stores(isa, offset, rng):
    """Outputs of 8 MiB and more are written with non-temporal stores."""
    n = 2**22 + 13
    for src, dst in [(FLOATS[0], FLOATS[1]), (FLOATS[0], FLOATS[2]), (FLOATS[1], FLOATS[0]), (FLOATS[2], FLOATS[3])]:
        x = samples(src, rng, n)[:n]
        big = poisoned(n + offset, dst)
        out = big[offset:]
        assert ampc.cast(x, out=out) is out
        expected = ref.cast(x, dst)
        assert_bits_equal(out, expected)
        assert ref.bits(big[:offset]).tolist() == [POISON16] * offset
        assert_bits_equal(ampc.cast(x[offset:], dst), expected[offset:])  # fresh output: populated first


def test_unaligned_data_pointer(rng):
    buf = bytearray(4 * 1001 + 1)
    x = np.frombuffer(buf, dtype=np.float32, offset=1)
    x[...] = rng.standard_normal(x.size)
    assert not x.flags.aligned
    assert_bits_equal(ampc.cast(x, np.float16), ref.cast(x, np.float16))


def layouts(rng):
    base = rng.standard_normal((7, 9, 11)).astype(np.float32) * 1000
    return {
        "c": base,
        "transposed": base.T,
        "fortran": np.asfortranarray(base),
        "reversed": base[::-1, :, ::-1],
        "every_other": base[:, ::2],
        "step3_reversed": base[..., ::-3],
        "permuted_sliced": base.transpose(2, 0, 1)[::2],
        "2d": base[3],
        "1d": base[3, 4],
        "0d": base[3, 4, 5],
        "empty": base[:, :0],
        "broadcast": np.broadcast_to(base[:1], (5, 9, 11)),
    }


@pytest.mark.parametrize("name", list(layouts(np.random.default_rng(0))))
def test_layouts(isa, name, rng):
    x = layouts(rng)[name]
    for dst in (np.float16, ml_dtypes.bfloat16, np.float64):
        y = ampc.cast(x, dst)
        assert type(y) is np.ndarray and y.shape == x.shape and y.flags.writeable
        assert_bits_equal(y, ref.cast(x, dst))
        if name == "transposed" or name == "fortran":
            assert y.flags.f_contiguous  # keeps the input's order, so the cast runs as one pass
        if name == "c" or name == "reversed":
            assert y.flags.c_contiguous


def test_multithreaded_equals_single_threaded(rng):
    x = samples(FLOATS[0], rng, 1_500_011)
    before = ampc.get_num_threads()
    try:
        ampc.set_num_threads(1)
        one = ampc.cast(x, np.float16)
        ampc.set_num_threads(4)
        assert ampc.get_num_threads() == 4
        four = ampc.cast(x, np.float16)
        strided = ampc.cast(x[::3], ml_dtypes.bfloat16)
    finally:
        ampc.set_num_threads(before)
    assert_bits_equal(one, ref.cast(x, np.float16))
    assert_bits_equal(four, one)
    assert_bits_equal(strided, ref.cast(x[::3], ml_dtypes.bfloat16))


def test_set_num_threads_rejects_nonsense():
    with pytest.raises(ValueError, match="positive"):
        ampc.set_num_threads(0)
    with pytest.raises(TypeError):
        ampc.set_num_threads("4")


@pytest.mark.parametrize("dtype", ["float16", "half", "fp16", np.float16, ampc.float16, "f2", "<f2"])
def test_dtype_spellings(dtype):
    assert ampc.cast(np.float32(1.5), dtype).dtype == np.float16


def test_python_and_numpy_scalars():
    y = ampc.cast(1.1, "bfloat16")
    assert type(y) is np.ndarray and y.shape == () and y.dtype == ampc.bfloat16
    assert ref.bits(y) == ref.bits(np.array(1.1).astype(ml_dtypes.bfloat16))
    assert ampc.cast(np.float16(2.5), "float32") == 2.5
    assert ampc.cast(ml_dtypes.bfloat16(3.0), np.float64) == 3.0


# ---------------------------------------------------------------------------
# out=
# ---------------------------------------------------------------------------

POISON16 = 0x7E7E


def poisoned(shape, dtype, order="C"):
    out = np.empty(shape, dtype, order=order)
    out.view(np.uint16 if out.itemsize == 2 else np.uint32 if out.itemsize == 4 else np.uint64)[...] = POISON16
    return out


@pytest.mark.parametrize("order", ["C", "F"])
def test_out_is_filled_and_returned(isa, order, rng):
    x = rng.standard_normal((33, 17)).astype(np.float32)
    out = poisoned(x.shape, np.float16, order)
    y = ampc.cast(x, out=out)  # dtype taken from out
    assert y is out
    assert_bits_equal(out, ref.cast(x, np.float16))


def test_out_strided_view(rng):
    x = rng.standard_normal((20, 30)).astype(np.float64)
    big = poisoned((40, 30), ml_dtypes.bfloat16)
    out = big[::2]
    assert ampc.cast(x, "bf16", out=out) is out
    assert_bits_equal(out, ref.cast(x, ml_dtypes.bfloat16))
    assert (ref.bits(big[1::2]) == POISON16).all()  # nothing written between the rows


def test_in_place_same_dtype_is_a_copy(rng):
    x = rng.standard_normal(100).astype(np.float32)
    keep = x.copy()
    assert ampc.cast(x, np.float32, out=x) is x
    np.testing.assert_array_equal(x, keep)


def unchanged_after(fn, *arrays):
    before = [a.copy() for a in arrays]
    fn()
    for a, b in zip(arrays, before):
        np.testing.assert_array_equal(ref.bits(a) if a.dtype in FLOATS else a, ref.bits(b) if b.dtype in FLOATS else b)


@pytest.mark.parametrize(
    "out_shape,out_dtype,error,match",
    [
        ((5, 4), np.float16, ValueError, r"out has shape \(5, 4\) but x has shape \(4, 5\)"),
        ((4, 5), np.float32, TypeError, "out has dtype float32 but dtype=float16"),
        ((4, 5), np.int16, TypeError, "out has dtype int16 but dtype=float16"),
    ],
)
def test_out_errors_write_nothing(out_shape, out_dtype, error, match, rng):
    x = rng.standard_normal((4, 5)).astype(np.float32)
    out = poisoned(out_shape, out_dtype)

    def call():
        with pytest.raises(error, match=match):
            ampc.cast(x, np.float16, out=out)

    unchanged_after(call, x, out)


def test_out_read_only(rng):
    x = rng.standard_normal(10).astype(np.float32)
    out = poisoned(10, np.float16)
    out.flags.writeable = False

    def call():
        with pytest.raises(ValueError, match="out is read-only"):
            ampc.cast(x, np.float16, out=out)

    unchanged_after(call, x, out)


def test_out_with_shared_elements(rng):
    x = rng.standard_normal((3, 4)).astype(np.float32)
    base = poisoned(4, np.float16)
    out = np.lib.stride_tricks.as_strided(base, shape=(3, 4), strides=(0, 2), writeable=True)

    def call():
        with pytest.raises(ValueError, match="share memory"):
            ampc.cast(x, np.float16, out=out)

    unchanged_after(call, x, base)


def test_out_overlapping_x(rng):
    buf = rng.standard_normal(16).astype(np.float32)
    x = buf[:8]
    out = buf.view(np.float16)[4:12]  # the same bytes, read as float16

    def call():
        with pytest.raises(ValueError, match="overlaps x"):
            ampc.cast(x, np.float16, out=out)

    unchanged_after(call, buf)


# ---------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "x,dtype,error,match",
    [
        ([1.0, 2.0], "float16", TypeError, "x must be an array .* got list"),
        ("1.0", "float16", TypeError, "x must be an array"),
        (np.arange(5, dtype=np.int32), "int16", TypeError, r"dtype must be .* \(or x's own dtype, a copy\), got int16"),
        (np.ones(3, np.complex64), "float16", TypeError, "x has dtype .*complex64.* not support"),
        (np.ones(3, ">f4"), "float16", TypeError, "not support"),
        (np.ones(3, np.float32), "int32", TypeError, "dtype must be float32, float16, bfloat16 or float64 .*got int32"),
        (np.ones(3, np.float32), "float", ValueError, "ambiguous"),
        (np.ones(3, np.float32), "floaty", TypeError, "'floaty' is not a dtype"),
        (np.ones(3, np.float32), np.complex128, TypeError, "does not support"),
        (np.ones(3, np.float32), None, TypeError, "needs a dtype"),
    ],
)
def test_bad_input(x, dtype, error, match):
    keep = np.array(x, copy=True) if isinstance(x, np.ndarray) else None
    with pytest.raises(error, match=match):
        ampc.cast(x, dtype)
    if keep is not None:
        np.testing.assert_array_equal(x, keep)


INTEGERS = [np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]


def integer_samples(dtype, rng):
    """Each integer type's extremes, the values around float16's and bfloat16's rounding and
    overflow points and float32's 2^24, and random ones."""
    if dtype == np.bool_:
        return rng.random(240) < 0.5
    info = np.iinfo(dtype)
    edges = [0, 1, -1, 255, 256, 257, 2047, 2048, 2049, 2051, 65504, 65519, 65520, 65536, 2**24 - 1, 2**24 + 1,
             2**24 + 3, 2**31 - 1, -2**31, 2**53 + 1, 2**63 - 1, -2**63, 2**64 - 1, info.min, info.max]
    values = [v for v in edges if info.min <= v <= info.max]
    random = rng.integers(info.min, info.max, 200, dtype=dtype, endpoint=True)
    return np.concatenate([np.array(values, dtype=dtype), random])


@pytest.mark.parametrize("dst", FLOATS, ids=str)
@pytest.mark.parametrize("src", INTEGERS, ids=lambda t: np.dtype(t).name)
def test_integers_convert_as_torch_does(src, dst, rng):
    """Integer and bool arrays to each floating dtype as torch's .to(): float64 directly, the others
    through float32 (c10 constructs float16 and bfloat16 from an integer through float), which
    rounds twice beyond 2^24; in any layout."""
    x = integer_samples(src, rng)
    via = np.float64 if dst == FLOATS[3] else np.float32
    with np.errstate(over="ignore"):  # beyond float16's range: inf, as torch
        want = x.astype(via).astype(dst)
    assert_bits_equal(ampc.cast(x, dst), want)
    assert_bits_equal(ampc.cast(x[::-3], dst), want[::-3])
    out = np.full(x.size // 2, 7, dst)
    ampc.cast(x[1::2][: out.size], out=out)
    assert_bits_equal(out, want[1::2][: out.size])


def test_a_bool_is_any_nonzero_byte():
    x = np.array([0, 1, 2, 128, 255], np.uint8).view(np.bool_)
    for dst in FLOATS:
        np.testing.assert_array_equal(ampc.cast(x, dst).astype(np.float64), [0, 1, 1, 1, 1])


@pytest.mark.parametrize("dtype", INTEGERS, ids=lambda t: np.dtype(t).name)
def test_integers_copy_to_their_own_dtype(dtype, rng):
    """A same-dtype cast is a copy of every element, from any layout into any layout."""
    x = integer_samples(dtype, rng)[:120].reshape(10, 12)
    out = np.zeros((12, 10), dtype).T
    ampc.cast(x[:, ::-1], out=out)
    np.testing.assert_array_equal(out, x[:, ::-1])
    with pytest.raises(TypeError, match="dtype must be float32, float16, bfloat16 or float64"):
        ampc.cast(x, np.int8 if dtype != np.int8 else np.int16)


def test_bad_arguments():
    x = np.ones(3, np.float32)
    with pytest.raises(TypeError):
        ampc.cast()
    with pytest.raises(TypeError):
        ampc.cast(x, "float16", np.empty(3, np.float16))  # out= is keyword-only
    with pytest.raises(TypeError, match="out must be an array"):
        ampc.cast(x, "float16", out=[0, 0, 0])


# ---------------------------------------------------------------------------
# Every float32 pattern
# ---------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("dst", [np.float16, ml_dtypes.bfloat16])
def test_every_float32_pattern(dst):
    """All 2^32 inputs, against NumPy's float16 and ml_dtypes' bfloat16 (NaN-ness for NaNs) and
    against the reference's NaN rule bit for bit."""
    chunk = 2**26
    for start in range(0, 2**32, chunk):
        x = np.arange(start, start + chunk, dtype=np.uint64).astype(np.uint32).view(np.float32)
        ours = ref.bits(ampc.cast(x, dst))
        with np.errstate(all="ignore"):
            theirs = ref.bits(x.astype(dst))
        nan = (x != x)
        finite = ~nan
        assert (ours[finite] == theirs[finite]).all(), f"chunk at {start:#x}"
        assert (ours[nan] == ref.nan_bits(x, dst)[nan]).all(), f"NaN chunk at {start:#x}"


@pytest.mark.parametrize(
    "make,overlaps",
    [
        (lambda b: b[:, ::3], False),
        (lambda b: b[::2, 1::7].T, False),
        (lambda b: b[::-1, ::-5], False),
        (lambda b: np.lib.stride_tricks.as_strided(b, (4, 4), (8, 4), writeable=True), True),  # rows share elements
        (lambda b: np.lib.stride_tricks.as_strided(b, (3, 5), (20, 4), writeable=True), False),  # exactly adjacent rows
        (lambda b: np.lib.stride_tricks.as_strided(b, (3, 6), (20, 4), writeable=True), True),
    ],
)
def test_out_overlap_detection(make, overlaps):
    """Writable views whose elements never share memory are accepted as out=; the others refused."""
    out = make(np.zeros((30, 40), np.float32))
    x = np.ones(out.shape, np.float64)
    if overlaps:
        with pytest.raises(ValueError, match="share memory"):
            ampc.cast(x, out=out)
    else:
        assert ampc.cast(x, out=out) is out and (out == 1).all()
