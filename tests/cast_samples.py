"""Inputs for the cast tests, CPU and GPU: random bit patterns and every special class."""

import ml_dtypes
import numpy as np

from ampc import _reference as ref

FLOATS = [np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16), np.dtype(np.float64)]
PAIRS = [(s, d) for s in FLOATS for d in FLOATS]
PAIR_IDS = [f"{s}->{d}" for s, d in PAIRS]

# float32 patterns of every special class: zeros, infinities, quiet and signalling
# NaNs with payloads, subnormals, the largest finite values, ties and the
# rounding boundaries of float16 and bfloat16.
F32_SPECIALS = [
    0x00000000, 0x80000000, 0x7F800000, 0xFF800000,  # +-0, +-inf
    0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FA00000, 0x7FBFFFFF, 0x7FFFFFFF,  # NaNs
    0x00000001, 0x00400000, 0x007FFFFF, 0x80000001, 0x807FFFFF, 0x00800000,  # subnormals, min normal
    0x7F7FFFFF, 0xFF7FFFFF,  # largest finite
    0x477FE000, 0x477FEFFF, 0x477FF000, 0xC77FF000,  # float16: 65504, below and at the overflow tie
    0x33800000, 0x33000000, 0x33000001, 0x32FFFFFF,  # float16: smallest subnormal, its half-way points
    0x387FC000, 0x387FE000, 0x38800000,  # float16: largest subnormal, tie to min normal, min normal
    0x3F801000, 0x3F803000, 0x3F800FFF, 0x3F801001,  # float16 ties at 1 + 2^-11
    0x3F808000, 0x3F818000, 0x3F807FFF, 0x3F808001,  # bfloat16 ties at 1 + 2^-8
    0x7F7F8000, 0x7F7F7FFF, 0x00008000, 0x00018000,  # bfloat16: overflow tie, subnormal ties
]


def f32_samples(rng, n):
    uniform = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    # Exponents near the 16-bit formats' ranges, where rounding is interesting.
    exps = rng.integers(127 - 30, 127 + 20, n, dtype=np.uint32)
    near = (rng.integers(0, 2**23, n, dtype=np.uint32) | (exps << 23)) ^ (rng.integers(0, 2, n, dtype=np.uint32) << 31)
    return np.concatenate([np.array(F32_SPECIALS, np.uint32), uniform, near]).view(np.float32)


def f64_samples(rng, n):
    uniform = rng.integers(0, 2**63, n, dtype=np.uint64) ^ (rng.integers(0, 2, n, dtype=np.uint64) << np.uint64(63))
    exps = rng.integers(1023 - 160, 1023 + 140, n, dtype=np.uint64)
    near = rng.integers(0, 2**52, n, dtype=np.uint64) | (exps << np.uint64(52))
    # Exact ties of float32, float16 and bfloat16 and the values one ulp either
    # side: only rounding float64 directly (not through float32) gets all right.
    ties = []
    for kept in (23, 10, 7):
        m = rng.integers(0, 2**kept, n // 8, dtype=np.uint64) << np.uint64(52 - kept)
        tie = np.uint64(1 << (51 - kept))
        e = rng.integers(1023 - 30, 1023 + 30, n // 8, dtype=np.uint64) << np.uint64(52)
        ties += [e | m | tie, e | m | (tie + np.uint64(1)), e | m | (tie - np.uint64(1))]
    ties = np.concatenate(ties)
    specials = np.array([0, 2**63, 0x7FF0000000000000, 0xFFF0000000000000, 0x7FF8000000000000,
                         0x7FF0000000000001, 0xFFF4000000000000, 1, 0x000FFFFFFFFFFFFF,
                         0x7FEFFFFFFFFFFFFF, 0x47EFFFFFE0000000, 0x47EFFFFFF0000000], np.uint64)
    return np.concatenate([specials, uniform, near, ties]).view(np.float64)


def samples(dtype, rng, n=50_000):
    if dtype == np.float32:
        return f32_samples(rng, n)
    if dtype == np.float64:
        return f64_samples(rng, n)
    every = np.arange(2**16, dtype=np.uint16)  # 16-bit sources: every pattern
    return np.concatenate([every, rng.integers(0, 2**16, n, dtype=np.uint16)]).view(dtype)


def assert_bits_equal(actual, expected):
    assert actual.dtype == expected.dtype
    assert actual.shape == expected.shape
    a, e = ref.bits(np.ascontiguousarray(actual)), ref.bits(np.ascontiguousarray(expected))
    bad = np.flatnonzero(a != e)
    assert bad.size == 0, f"{bad.size} elements differ, first at {bad[0]}: {a.flat[bad[0]]:#x} != {e.flat[bad[0]]:#x}"
