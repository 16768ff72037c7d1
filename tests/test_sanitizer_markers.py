"""conftest.py's markers for tests that cannot hold under compute-sanitizer: skipped under the tools
they name (AMPC_UNDER_SANITIZER holds the tool's name, as benchmarks/run_on_gpu.sh sets it) and run
everywhere else. Checked in a pytest of its own, since the skips are decided at collection."""

import os
import re
import subprocess
import sys

import pytest


@pytest.mark.outlasts_racecheck_and_initcheck
def test_probe_outlasts_racecheck_and_initcheck():
    """Runs wherever neither racecheck nor initcheck is the tool: the subprocesses below count its outcomes."""
    assert os.environ.get("AMPC_UNDER_SANITIZER") not in ("racecheck", "initcheck")


@pytest.mark.never_waits
def test_probe_never_waits():
    """Runs wherever no sanitizer is."""
    assert os.environ.get("AMPC_UNDER_SANITIZER", "") in ("", "0")


def outcomes(tool):
    env = dict(os.environ, AMPC_UNDER_SANITIZER=tool)
    for selection in ("AMPC_TEST_SHARD", "AMPC_TEST_FROM"):  # a sharded run's own selection would drop a probe
        env.pop(selection, None)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs",
                           f"{__file__}::test_probe_outlasts_racecheck_and_initcheck",
                           f"{__file__}::test_probe_never_waits"],
                          env=env, capture_output=True, text=True, timeout=120)
    return done.stdout


@pytest.mark.parametrize("tool,summary", [
    ("racecheck", "2 skipped"),  # outlasts_racecheck_and_initcheck and never_waits
    ("initcheck", "2 skipped"),
    ("memcheck", "1 passed, 1 skipped"),  # never_waits alone
    ("", "2 passed"),  # no sanitizer
])
def test_markers_skip_under_the_tools_they_name(tool, summary):
    out = outcomes(tool)
    assert re.search(rf"^{summary} in [0-9.]+s", out, re.MULTILINE), out
