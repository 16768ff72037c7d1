"""Shared fixtures: a seeded RNG that reports its seed, the gpu and slow
markers, and a fixture that runs a test once per CPU instruction set."""

import os
import zlib

# JAX must not take three quarters of the GPU when a test first imports it.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import ampc  # noqa: E402
from ampc import _C  # noqa: E402


def pytest_addoption(parser):
    parser.addoption("--run-slow", action="store_true", help="run tests marked slow")
    parser.addoption(
        "--require-gpu", action="store_true", help="fail, rather than skip, gpu tests when no GPU is usable"
    )


# Tests that cannot hold under compute-sanitizer (benchmarks/run_on_gpu.sh sets AMPC_UNDER_SANITIZER
# to the tool's name for its sanitizer runs), by marker, with the tools they cannot hold under (None:
# any): it returns from each launch only once the kernel has ended, so no test can prove that a call
# queued its work without waiting; it reports a fault that a test makes on purpose as an error; and
# racecheck and initcheck slow the GPT-2 demo under torchrun past its limit.
SANITIZER = os.environ.get("AMPC_UNDER_SANITIZER", "")
UNDER_SANITIZER = SANITIZER not in ("", "0")
NOT_UNDER_SANITIZER = {
    "never_waits": (None, "compute-sanitizer waits for every kernel"),
    "faults_on_purpose": (None, "compute-sanitizer reports the fault as an error"),
    "outlasts_racecheck_and_initcheck": ({"racecheck", "initcheck"},
                                         "under racecheck and under initcheck the run outlasts its 300 s limit "
                                         "(H100, 2026-12-07)"),
}


def pytest_collection_modifyitems(config, items):
    # "k": the tests from the k-th collected (0-based) on, to resume a sanitizer run that ran out of time
    start = int(os.environ.get("AMPC_TEST_FROM", "0"))
    if start:
        config.hook.pytest_deselected(items=items[:start])
        items[:] = items[start:]
    shard = os.environ.get("AMPC_TEST_SHARD")  # "i/n": every n-th test from the i-th (0-based)
    if shard:
        index, count = (int(v) for v in shard.split("/"))
        config.hook.pytest_deselected(items=[t for k, t in enumerate(items) if k % count != index])
        items[:] = [t for k, t in enumerate(items) if k % count == index]
    has_gpu = ampc.cuda.is_available()
    for item in items:
        if "slow" in item.keywords and not config.getoption("--run-slow"):
            item.add_marker(pytest.mark.skip(reason="slow: use --run-slow"))
        for marker, (tools, reason) in NOT_UNDER_SANITIZER.items():
            if marker in item.keywords and UNDER_SANITIZER and (tools is None or SANITIZER in tools):
                item.add_marker(pytest.mark.skip(reason=reason))
        if "gpu" in item.keywords and not has_gpu:
            if config.getoption("--require-gpu"):
                item.add_marker(pytest.mark.xfail(reason="no usable GPU", strict=True, run=False))
            else:
                item.add_marker(pytest.mark.skip(reason="no CUDA GPU (or ampc._cuda not built)"))


class Rng(np.random.Generator):
    """numpy's Generator whose repr says how to draw its data again, so a failure does."""

    def __init__(self, seed):
        super().__init__(np.random.PCG64(seed))
        self.seed = seed

    def __repr__(self):
        return f"Rng(seed={self.seed}: AMPC_TEST_SEED={SESSION_SEED} draws it again)"


# The session's seed, printed after the results: AMPC_TEST_SEED=<it> draws the same data again.
SESSION_SEED = int(os.environ.get("AMPC_TEST_SEED", np.random.SeedSequence().entropy % 2**32))


def pytest_terminal_summary(terminalreporter):
    terminalreporter.write_line(f"test data: AMPC_TEST_SEED={SESSION_SEED} draws it again")


@pytest.fixture
def test_seed(request):
    """This test's seed: the session's mixed with the test's id (each test draws its own data, the
    same again under the same AMPC_TEST_SEED; Python's hash() of the id would differ per process)."""
    return (SESSION_SEED ^ zlib.crc32(request.node.nodeid.encode())) % 2**32


def _autocast_state():
    return {d: (ampc.is_autocast_enabled(d), ampc.get_autocast_dtype(d)) for d in ("cpu", "cuda")}, \
        ampc.is_autocast_cache_enabled()


@pytest.fixture(autouse=True)
def autocast_left_as_found():
    """A test that leaves autocast on (a region entered and never left) fails itself, and the flags
    are put back, rather than changing the dtypes of every test after it."""
    before = _autocast_state()
    yield
    after = _autocast_state()
    if after != before:
        for device, (enabled, dtype) in before[0].items():
            ampc.set_autocast_enabled(device, enabled)
            ampc.set_autocast_dtype(device, dtype)
        ampc.set_autocast_cache_enabled(before[1])
        pytest.fail(f"the test left autocast's state changed: {before} -> {after}")


@pytest.fixture(autouse=True)
def torch_math_attention_under_sanitizer():
    """Under compute-sanitizer (benchmarks/run_on_gpu.sh), torch's reference attention takes its math
    path, in every GPU test file: racecheck reported hazards in cuDNN's fused attention kernel, which
    copies through the tensor memory accelerator that it does not follow, and those reports stood in
    for test_attention_gpu's and test_layers_gpu's verdicts (H100, 2026-12-06)."""
    if not UNDER_SANITIZER:
        yield
        return
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:  # no torch: no reference attention to steer
        yield
        return
    with sdpa_kernel(SDPBackend.MATH):
        yield


@pytest.fixture
def rng(test_seed):
    return Rng(test_seed)


@pytest.fixture(params=_C._cpu_isas())
def isa(request):
    """Each instruction set this CPU supports, forced for one test."""
    previous = _C._cpu_isa()
    _C._set_cpu_isa(request.param)
    yield request.param
    _C._set_cpu_isa(previous)
