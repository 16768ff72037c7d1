"""Slow, obviously correct NumPy versions of ampc's kernels: the oracles that
tests and benchmarks compare against.

cast: NumPy's own float16 conversion and ml_dtypes' bfloat16 conversion round
finite values to nearest even directly from the source format (no double
rounding through float32); only NaN bits differ between libraries, so NaNs
are rewritten to ampc's rule: a quiet NaN with the input's sign and leading
payload bits.
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


def cast(x, dtype):
    """x converted to dtype, bit for bit as ampc.cast does it."""
    dtype = np.dtype(dtype)
    x = np.asarray(x)
    if x.dtype == dtype:
        return x.copy()  # a copy keeps every bit, signalling NaNs included
    with np.errstate(all="ignore"):
        if np.dtype(ml_dtypes.bfloat16) in (x.dtype, dtype) and np.dtype(np.float16) in (x.dtype, dtype):
            out = x.astype(np.float32).astype(dtype)  # exact through float32: one rounding
        else:
            out = x.astype(dtype)
    nan = np.isnan(x)
    if nan.any():
        out_bits = out.view(FORMATS[dtype][2])
        out_bits[nan] = nan_bits(x, dtype)[nan]
    return out
