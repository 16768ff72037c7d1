"""Slow, obviously correct NumPy versions of ampc's kernels: the oracles that
tests and benchmarks compare against.

cast: narrowing is done in float64 arithmetic, which holds every input
exactly: scale by the destination's unit in the last place, np.rint (nearest,
ties to even), scale back, send values beyond the largest finite one to
+-inf. The exact result is then stored with astype, which cannot round it
again. This owes nothing to NumPy's or ml_dtypes' own rounding (ml_dtypes 0.6
rounds float64 -> bfloat16 through float32, i.e. twice). NaNs follow ampc's
rule: a quiet NaN with the input's sign and leading payload bits.
"""

import ml_dtypes
import numpy as np

# (exponent bits, mantissa bits, unsigned type of the same width)
FORMATS = {
    np.dtype(np.float64): (11, 52, np.uint64),
    np.dtype(np.float32): (8, 23, np.uint32),
    np.dtype(np.float16): (5, 10, np.uint16),
    np.dtype(ml_dtypes.bfloat16): (8, 7, np.uint16),
}


def bits(x):
    """The bit patterns of a floating array, as unsigned integers."""
    return x.view(FORMATS[x.dtype][2])


def nan_bits(x, dtype):
    """ampc's NaN for each element of x converted to dtype (meaningful where x is NaN)."""
    se, sm, src_uint = FORMATS[x.dtype]
    de, dm, dst_uint = FORMATS[np.dtype(dtype)]
    b = x.view(src_uint).astype(np.uint64)
    sign = (b >> np.uint64(se + sm)) << np.uint64(de + dm)
    mant = b & np.uint64((1 << sm) - 1)
    payload = mant >> np.uint64(sm - dm) if sm > dm else mant << np.uint64(dm - sm)
    inf = np.uint64(((1 << de) - 1) << dm)
    quiet = np.uint64(1 << (dm - 1))
    return (sign | inf | quiet | payload).astype(dst_uint)


def round_to(x, dtype):
    """x (any floating dtype) rounded once to nearest even in dtype's format, as float64."""
    exp_bits, mant_bits, _ = FORMATS[np.dtype(dtype)]
    emax = 2 ** (exp_bits - 1) - 1
    emin = 1 - emax
    v = np.asarray(x, dtype=np.float64)
    with np.errstate(all="ignore"):
        _, e = np.frexp(v)  # |v| in [2^(e-1), 2^e)
        ulp_exp = np.maximum(e - 1, emin) - mant_bits  # subnormals share the smallest normal's ulp
        r = np.ldexp(np.rint(np.ldexp(v, -ulp_exp)), ulp_exp)
        largest = np.ldexp(2.0 - 2.0**-mant_bits, emax)
        return np.where(np.abs(r) > largest, np.copysign(np.inf, v), r)


def cast(x, dtype):
    """x converted to dtype, bit for bit as ampc.cast does it."""
    dtype = np.dtype(dtype)
    x = np.asarray(x)
    if x.dtype == dtype:
        return x.copy()  # a copy keeps every bit, signalling NaNs included
    with np.errstate(all="ignore"):
        if FORMATS[dtype][1] < FORMATS[x.dtype][1]:
            out = round_to(x, dtype).astype(dtype)  # exact: nothing left to round
        else:
            out = x.astype(dtype)  # widening is exact
    nan = np.isnan(x)
    if nan.any():
        out_bits = out.view(FORMATS[dtype][2])
        out_bits[nan] = nan_bits(x, dtype)[nan]
    return out
