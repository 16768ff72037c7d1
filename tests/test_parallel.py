"""ampc's CPU thread pool (cpu/parallel.c): its workers wait for the next job spinning for a while,
then asleep. Jobs that come back to back, after a pause, from several Python threads at once, or in a
forked child must each give the single-threaded bits."""

import os
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import ampc

F = ampc.nn.functional
SIZE = 1 << 18  # large enough that ops split it over the threads


@pytest.fixture
def three_threads():
    before = ampc.get_num_threads()
    ampc.set_num_threads(3)
    yield
    ampc.set_num_threads(before)


def references(rng, count):
    xs = [rng.standard_normal(SIZE, dtype=np.float32) for _ in range(count)]
    threads = ampc.get_num_threads()
    ampc.set_num_threads(1)
    try:
        wanted = [(F.relu(x), F.softmax(x.reshape(64, -1), -1)) for x in xs]
    finally:
        ampc.set_num_threads(threads)
    return xs, wanted


def check(x, wanted):
    relu, softmax = wanted
    assert np.array_equal(F.relu(x).view(np.uint32), relu.view(np.uint32))
    assert np.array_equal(F.softmax(x.reshape(64, -1), -1).view(np.uint32), softmax.view(np.uint32))


def test_jobs_back_to_back_and_after_pauses(rng, three_threads):
    xs, wanted = references(rng, 6)
    for i in range(60):
        if i % 7 == 3:
            time.sleep(0.002)  # longer than the spin: the workers go to sleep and must be woken
        check(xs[i % 6], wanted[i % 6])


def test_jobs_from_several_python_threads(rng, three_threads):
    xs, wanted = references(rng, 4)

    def run(k):
        for i in range(25):
            check(xs[(k + i) % 4], wanted[(k + i) % 4])

    with ThreadPoolExecutor(4) as threads:
        for done in [threads.submit(run, k) for k in range(4)]:
            done.result()  # a thread's failed check raises here


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")  # Python 3.12+
# JAX, once an earlier test in the process imported it, warns at every fork (its own threads may
# deadlock in the child); the child here runs only ampc's pool.
@pytest.mark.filterwarnings("ignore:os.fork\\(\\) was called:RuntimeWarning")
def test_a_forked_child_starts_its_own_workers(rng, three_threads):
    """pthread_atfork's handlers: the child forgets the parent's workers (only the forking thread
    exists there) and starts its own."""
    xs, wanted = references(rng, 1)
    check(xs[0], wanted[0])  # the parent's workers exist, and may be spinning, at the fork
    pid = os.fork()
    if pid == 0:  # the child: exit 0 only if the pool works there
        code = 1
        try:
            check(xs[0], wanted[0])
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    check(xs[0], wanted[0])
