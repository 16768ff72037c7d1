"""The parts of ampc._cuda that run on the host alone, compiled for and run on the CPU: a machine
without a GPU checks them, and the temporary and overflow paths that GPU tests seldom reach are
driven on purpose. Each program in tests/cuda_host/ builds against the very files in cuda/ that
setup.py compiles, with AddressSanitizer and UndefinedBehaviorSanitizer where the compiler has
them, and prints "ok <check>" per check passed."""

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HERE = os.path.join(ROOT, "tests", "cuda_host")
# the sanitizer run's preloaded runtime is not for the compiler or this binary (which links its own)
CLEAN_ENV = {k: v for k, v in os.environ.items()
             if k not in ("LD_PRELOAD", "ASAN_OPTIONS", "LSAN_OPTIONS", "UBSAN_OPTIONS", "PYTHONMALLOC")}

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None or not sys.platform.startswith("linux"),
                                reason="needs gcc")


def _cuda_include():
    """CUDA's headers, found as setup.py finds the toolkit (cuda/common.h includes
    cuda_runtime.h), or None."""
    nvcc = shutil.which("nvcc")
    for home in (os.environ.get("CUDA_HOME"), "/usr/local/cuda",
                 nvcc and os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))):
        if home and os.path.exists(os.path.join(home, "include", "cuda_runtime.h")):
            return os.path.join(home, "include")
    return None


def _sanitizers():
    found = subprocess.run(["gcc", "-print-file-name=libasan.so"], capture_output=True, text=True, env=CLEAN_ENV)
    if not os.path.isabs(found.stdout.strip()):
        return []
    return ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer"]


def _run(program, sources, tmp_path, includes=()):
    """Build tests/cuda_host/<program>.c with the cuda/ sources as setup.py's flags have them (C11,
    -Wall -Wextra as errors, its include folders), run it, and give its lines, having checked
    that it passed."""
    exe = tmp_path / program
    build = subprocess.run(
        ["gcc", "-std=gnu11", "-O1", "-g", "-pthread", *_sanitizers(), "-Wall", "-Wextra", "-Werror",
         "-Wno-missing-field-initializers", *(f"-I{os.path.join(ROOT, d)}" for d in ("cuda", ".")),
         *(f"-I{d}" for d in includes), os.path.join(HERE, f"{program}.c"),
         *(os.path.join(ROOT, s) for s in sources), "-o", str(exe)],
        capture_output=True, text=True, env=CLEAN_ENV)
    assert build.returncode == 0, build.stderr[-4000:]
    run = subprocess.run([str(exe)], capture_output=True, text=True, env=CLEAN_ENV, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr[-4000:]
    return run.stdout.splitlines()


def test_conv_report_keeps_whole_lines_for_python(tmp_path):
    """cuda/conv_report.c, where AMPC_CONV_DEBUG's lines wait for _C._cuda_conv_report: measured
    without being taken, taken whole into a buffer with room for them and their NUL and then
    forgotten, nothing taken into one without; past its bound whole lines are left out and a
    last line counts them; two threads' lines do not mix."""
    assert _run("conv_report", ["cuda/conv_report.c"], tmp_path) == [
        "ok empty",
        "ok kept, measured, taken, forgotten",
        "ok full: whole lines, the rest counted",
        "ok two threads' lines whole, each in its order",
        "ok AMPC_CONV_DEBUG read on each call",
    ]


@pytest.mark.skipif(_cuda_include() is None, reason="needs CUDA's headers")
def test_plan_cache_keeps_plans_up_to_its_limit(tmp_path):
    """cuda/plan_cache.c, conv.c's and gemm.c's plans: a key's plan built once and found again,
    keys a byte apart being plans apart, a failed build destroyed and not kept,
    AMPC_PLAN_LIMIT plans kept and each new key's plan past them built for its call and destroyed
    after it (a path no GPU test reaches), every kept plan still found after."""
    assert _run("plan_cache", ["cuda/plan_cache.c"], tmp_path, includes=[_cuda_include()]) == [
        "ok built once, found again",
        "ok keys apart in their first, middle or last bytes, plans apart",
        "ok a failed build destroyed, not kept",
        "ok AMPC_PLAN_LIMIT kept, then temporary ones destroyed after use",
    ]
