"""The fused attention kernels (cuda/attention_kernels.cuh, the very source nvcc compiles) run on
the CPU: tests/emulated_cuda/cuda_model.h models CUDA's threads, barriers and the warp
instructions they use (mma.sync, ldmatrix, shuffles, cp.async landing only when waited for), and
attention.cpp checks the outputs, log-sum-exp and gradients against a float64 reference (grouped
query heads and dropout with the composed attention's mask too), with every output poisoned first
and gaps between rows that must stay untouched. Built with AddressSanitizer and
UndefinedBehaviorSanitizer where the compiler has them (CI's does), so a read or write outside a
tile or an operand fails too. A check of the kernels' indexing, masking and synchronisation on a
machine without a GPU; the GPU tests (test_attention_gpu.py) check the instructions themselves.
The softmax kernels that keep a row in shared memory run on the same model (softmax.cpp)."""

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HERE = os.path.join(ROOT, "tests", "emulated_cuda")
# the sanitizer run's preloaded runtime is not for the compiler or this binary (which links its own)
CLEAN_ENV = {k: v for k, v in os.environ.items()
             if k not in ("LD_PRELOAD", "ASAN_OPTIONS", "LSAN_OPTIONS", "UBSAN_OPTIONS", "PYTHONMALLOC")}


def _sanitizers():
    """AddressSanitizer and UndefinedBehaviorSanitizer where the compiler has their runtimes (CI's
    machine does; a GPU machine's image may not, and the model's check stands without them)."""
    found = subprocess.run(["g++", "-print-file-name=libasan.so"], capture_output=True, text=True, env=CLEAN_ENV)
    if not os.path.isabs(found.stdout.strip()):
        return []
    return ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer"]


def _run_on_the_model(program, tmp_path, seed, includes=()):
    """Build tests/emulated_cuda/<program>.cpp (sanitized where the compiler can), run it with the
    session's seed, and give its lines, having checked that it passed."""
    exe = tmp_path / program
    build = subprocess.run(
        ["g++", "-std=c++20", "-O1", "-g", "-pthread", *_sanitizers(), "-Wall", "-Wextra", "-Werror",
         "-Wno-unknown-pragmas", *(f"-I{os.path.join(HERE, d)}" for d in includes), f"-I{HERE}",
         *(f"-I{os.path.join(ROOT, d)}" for d in ("src", "cuda", ".")),  # setup.py's include_dirs
         os.path.join(HERE, f"{program}.cpp"), "-o", str(exe)], capture_output=True, text=True, env=CLEAN_ENV)
    assert build.returncode == 0, build.stderr[-4000:]
    run = subprocess.run([str(exe), str(seed)], capture_output=True, text=True, env=CLEAN_ENV, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr[-4000:]
    return run.stdout.splitlines()


@pytest.mark.skipif(shutil.which("g++") is None or not sys.platform.startswith("linux"), reason="needs g++")
def test_attention_kernels_on_the_cpu_model(tmp_path, test_seed):
    lines = _run_on_the_model("attention", tmp_path, test_seed)
    assert len(lines) == 13 and all(line.startswith("ok ") for line in lines), "\n".join(lines)


@pytest.mark.skipif(shutil.which("g++") is None or not sys.platform.startswith("linux"), reason="needs g++")
def test_softmax_kernels_on_the_cpu_model(tmp_path, test_seed):
    """cuda/softmax_kernels.cuh's streamed forward kernels, through ops.cuh and packs.cuh as nvcc
    compiles them (tests/emulated_cuda/shadow stands in for CUDA's headers): softmax_smem against
    softmax_streamed bit for bit and both against float64, in the three storage dtypes, softmax
    and log_softmax, causal rows and special values."""
    lines = _run_on_the_model("softmax", tmp_path, test_seed, includes=("shadow",))
    assert len(lines) == 24 and all(line.startswith("ok ") for line in lines), "\n".join(lines)
