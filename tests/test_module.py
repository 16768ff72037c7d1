"""The package as installed: both extensions, the doctor, and the answers ampc
gives where there is no GPU or no ampc._cuda."""

import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

import ampc

HAS_NVCC = shutil.which("nvcc") is not None or os.path.exists("/usr/local/cuda/bin/nvcc")


def run_python(code):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True)


@pytest.mark.skipif(not HAS_NVCC or os.environ.get("AMPC_CUDA") == "0", reason="no nvcc here")
def test_cuda_extension_is_built_where_nvcc_is():
    built, why_not = ampc._C._cuda_build_info()
    assert built, why_not


def test_doctor_runs():
    r = subprocess.run([sys.executable, "-m", "ampc", "doctor"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    for needle in ("Python", "NumPy", "ml_dtypes", "ampc._cuda", "SIMD", "cast kernels", "GPUs"):
        assert needle in r.stdout
    line = next(line for line in r.stdout.splitlines() if "CPU bf16 vs fp32" in line)
    speedups = [float(v) for v in re.findall(r"(\d+\.\d+)x", line)]
    assert len(speedups) == 2 and all(s > 0 for s in speedups)  # measured, not made up
    assert "CPU mixed precision" in r.stdout and ("recommended" in r.stdout or "memory only" in r.stdout)
    if ampc.cuda.is_built():
        for needle in ("CUDA runtime", "driver", "cuBLASLt", "cuDNN"):
            assert needle in r.stdout
    # each GPU says whether attention runs fused there (sm_80 on)
    fused_rows = [line for line in r.stdout.splitlines() if line.startswith("  fused attention ")]
    assert len(fused_rows) == ampc.cuda.device_count()
    for i, line in enumerate(fused_rows):
        served = ampc.cuda.get_device_capability(i) >= (8, 0)
        assert line.split(None, 2)[2].startswith("16-bit, head_dim 64" if served else "no"), line


# A GPU array as far as DLPack can tell; ampc must refuse it before asking for the memory.
FAKE_CUDA = """
class FakeCuda:
    def __dlpack_device__(self):
        return (2, 0)
    def __dlpack__(self, **kw):
        raise AssertionError("ampc asked for memory it cannot use")
"""

NO_GPU_ANSWERS = """
import ampc
assert ampc.cuda.is_available() is False
assert ampc.cuda.device_count() == 0
assert ampc.cuda.get_device_name() is None
assert ampc.cuda.get_device_capability() == (0, 0)
assert ampc.cuda.is_bf16_supported() is False
assert ampc.cuda.memory_allocated() == 0 and ampc.cuda.max_memory_allocated() == 0
assert ampc.cuda.memory_reserved() == 0
ampc.cuda.reset_peak_memory_stats()
assert ampc.cuda.current_stream().cuda_stream == 0
"""


def test_without_the_cuda_extension():
    r = run_python(
        "import sys; sys.modules['ampc._cuda'] = None\n"
        + NO_GPU_ANSWERS
        + FAKE_CUDA
        + """
assert ampc.cuda.is_built() is False
try:
    ampc.cast(FakeCuda(), "float16")
except RuntimeError as e:
    assert "AMPC_CUDA=1 pip install" in str(e), e
else:
    raise AssertionError("no error")
try:
    ampc.cuda.synchronize()
except RuntimeError as e:
    assert "ampc._cuda" in str(e), e
print("ok")
"""
    )
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


@pytest.mark.skipif(ampc.cuda.is_available(), reason="a GPU is present")
@pytest.mark.skipif(not ampc._C._cuda_build_info()[0], reason="built without ampc._cuda")
def test_with_the_cuda_extension_but_no_gpu():
    r = run_python(
        NO_GPU_ANSWERS
        + FAKE_CUDA
        + """
try:
    ampc.cast(FakeCuda(), "float16")
except RuntimeError as e:
    assert "no CUDA GPU is available" in str(e), e
else:
    raise AssertionError("no error")
print("ok")
"""
    )
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_device_arguments():
    from ampc.cuda import _index

    assert _index(None) == 0 and _index(2) == 2 and _index("cuda") == 0 and _index("cuda:3") == 3
    with pytest.raises(ValueError, match="cuda:1"):
        _index("cpu")
    with pytest.raises(TypeError):
        _index(1.5)


def test_stream_arguments():
    with pytest.raises(TypeError, match="stream"):
        ampc.cuda.stream("fast").__enter__()
    with pytest.raises(ValueError, match="non-negative"):
        ampc.cuda.stream(-5).__enter__()
    with ampc.cuda.stream(None):
        pass
    with ampc.cuda.stream(2):  # the per-thread default stream needs no GPU to name
        assert ampc.cuda.current_stream().cuda_stream == 2
        assert ampc.cuda.current_stream(1).cuda_stream == 2
    assert ampc.cuda.current_stream().cuda_stream == 0


def test_cpu_isa_controls():
    isas = ampc._C._cpu_isas()
    assert isas[0] == "portable" and ampc._C._cpu_isa() in isas
    with pytest.raises(ValueError, match="unknown instruction set"):
        ampc._C._set_cpu_isa("sse9")
    r = run_python("import ampc; print(ampc._C._cpu_isa())")
    assert r.stdout.strip() == isas[-1]
    env = dict(os.environ, AMPC_CPU_ISA="portable")
    r = subprocess.run([sys.executable, "-c", "import ampc; print(ampc._C._cpu_isa())"], env=env,
                       capture_output=True, text=True)
    assert r.stdout.strip() == "portable"
