"""Property test (hypothesis): autocast's state (enabled, dtype) after random nestings of regions, some
disabled, some left by an exception, run in several threads at once, against a model: a stack per
thread."""

import threading

import pytest

import ampc

pytest.importorskip("hypothesis")
from hypothesis import given, settings, strategies as st  # noqa: E402

DTYPES = [ampc.bfloat16, ampc.float16]
regions = st.recursive(
    st.just([]),
    lambda inner: st.lists(st.tuples(st.sampled_from(DTYPES), st.booleans(), st.booleans(), inner), max_size=3),
    max_leaves=12,
)


class Boom(Exception):
    pass


def run(program, state, errors):
    """Enter each region of program, check the state against the model inside and after it."""
    for dtype, enabled, fails, inner in program:
        before = (ampc.is_autocast_enabled("cpu"), ampc.get_autocast_dtype("cpu"))
        try:
            with ampc.autocast("cpu", dtype=dtype, enabled=enabled):
                if (ampc.is_autocast_enabled("cpu"), ampc.get_autocast_dtype("cpu")) != (enabled, dtype):
                    errors.append(("inside", enabled, dtype))
                run(inner, (enabled, dtype), errors)
                if fails:
                    raise Boom()
        except Boom:
            pass
        if (ampc.is_autocast_enabled("cpu"), ampc.get_autocast_dtype("cpu")) != before or before != state:
            errors.append(("after", before, state))


@settings(max_examples=100, deadline=None)
@given(st.lists(regions, min_size=3, max_size=3))
def test_nesting_exceptions_and_threads(programs):
    initial = (ampc.is_autocast_enabled("cpu"), ampc.get_autocast_dtype("cpu"))
    errors = [[] for _ in programs]
    barrier = threading.Barrier(len(programs))

    def thread(i):
        barrier.wait()
        run(programs[i], initial, errors[i])

    threads = [threading.Thread(target=thread, args=(i,)) for i in range(len(programs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [[] for _ in programs]
    assert (ampc.is_autocast_enabled("cpu"), ampc.get_autocast_dtype("cpu")) == initial
