"""Fuzzing the parsers of outside input (hypothesis drives them; CI runs a bounded number of examples,
under AddressSanitizer in .ci/sanitize; AMPC_FUZZ_EXAMPLES=100000 python -m pytest tests/test_fuzz.py
is the long run): DLPack capsules with arbitrary versions, devices, dtypes, ndims, shapes, strides and
byte offsets. A capsule is either refused with a BufferError, left unconsumed and its deleter not
called, or taken: then its shape and strides are the capsule's, reading it touches only its memory,
and its deleter runs exactly once."""

import gc
import os

import numpy as np
import pytest

import ampc
from dlpack_fakes import FakeTensor, capsule_name

pytest.importorskip("hypothesis")
from hypothesis import given, settings, strategies as st  # noqa: E402

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


def extent(shape, strides, itemsize):
    """(lowest, one past the highest) byte an array of this layout touches from its first element."""
    lo = hi = 0
    for n, s in zip(shape, strides):
        if n == 0:
            return 0, 0
        lo, hi = lo + min(0, (n - 1) * s), hi + max(0, (n - 1) * s)
    return lo, hi + itemsize


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
        first = np.asarray(a).reshape(-1)[:1].view(np.uint8)[0]  # element [0, ..., 0]'s first byte
        assert first == buffer[fields["byte_offset"]]  # where data + byte_offset says
        np.copy(np.asarray(a))  # every element read: inside the buffer (AddressSanitizer would see otherwise)
    del a
    gc.collect()
    assert fake.deleted == 1
    ACCEPTED.append(1)


def test_the_fuzzer_reaches_both_outcomes():
    """Some of its capsules must be taken, or the run above only ever tried the refusals."""
    if not ACCEPTED:
        test_dlpack_import_takes_a_capsule_whole_or_not_at_all()
    assert len(ACCEPTED) >= 5
