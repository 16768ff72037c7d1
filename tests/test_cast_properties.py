"""Property tests (hypothesis): ampc.cast against NumPy (float16) and ml_dtypes (bfloat16) on arbitrary
bit patterns, shapes and strides (views with steps and negative steps), NaN compared as NaN-ness."""

import ml_dtypes
import numpy as np
import pytest

import ampc

pytest.importorskip("hypothesis")
from hypothesis import given, settings, strategies as st  # noqa: E402
from hypothesis.extra import numpy as hnp  # noqa: E402

SOURCES = {"float32": (np.uint32, np.float32), "float16": (np.uint16, np.float16),
           "bfloat16": (np.uint16, ml_dtypes.bfloat16), "float64": (np.uint64, np.float64)}
TARGETS = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float64": np.float64}


def same(a, b):
    with np.errstate(invalid="ignore"):  # NumPy warns when it widens a signalling NaN
        a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    nan = np.isnan(a64)
    assert np.array_equal(nan, np.isnan(b64))
    assert np.array_equal(a64[~nan], b64[~nan])
    # signed zeros and infinities too
    assert np.array_equal(np.signbit(a64[~nan]), np.signbit(b64[~nan]))


@st.composite
def views(draw):
    source = draw(st.sampled_from(sorted(SOURCES)))
    bits, dtype = SOURCES[source]
    raw = draw(hnp.arrays(bits, hnp.array_shapes(min_dims=1, max_dims=3, max_side=9)))
    x = raw.view(dtype)
    index = tuple(draw(st.sampled_from([slice(None), slice(None, None, -1), slice(1, None, 2), slice(None, None, 3)]))
                  for _ in range(x.ndim))
    return x[index]


@settings(max_examples=300, deadline=None)
@given(views(), st.sampled_from(sorted(TARGETS)))
def test_cast_matches_numpy_and_ml_dtypes(x, target):
    with np.errstate(over="ignore", invalid="ignore"):
        want = x.astype(TARGETS[target])
    got = ampc.cast(x, target)
    assert got.dtype == want.dtype and got.shape == want.shape
    same(got, want)
    out = np.empty(x.shape, TARGETS[target])[..., ::-1] if x.ndim else np.empty((), TARGETS[target])
    ampc.cast(x, out=out)  # into a reversed view
    same(out, want)
