"""python -m ampc doctor: can this environment run ampc, and how fast?"""

import platform
import sys

import ml_dtypes
import numpy as np

import ampc
from ampc import _C


def _version(code, digits):
    """CUDA-style integer versions: 13000 -> 13.0, 130100 -> 13.1.0, 91900 -> 9.19.0."""
    if not code:
        return "none"
    parts = []
    for div in digits:
        parts.append(str(code // div))
        code %= div
    return ".".join(parts)


def _cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def doctor(out=sys.stdout):
    def row(key, value):
        print(f"  {key:<22} {value}", file=out)

    print("ampc doctor", file=out)
    row("ampc", ampc.__version__)
    row("Python", platform.python_version())
    row("NumPy", np.__version__)
    row("ml_dtypes", ml_dtypes.__version__)

    print("CPU", file=out)
    row("model", _cpu_name())
    features = _C._cpu_features()
    row("SIMD", " ".join(f"{k}{'' if v else '(no)'}" for k, v in features.items()) or "none detected")
    row("cast kernels", f"{_C._cpu_isa()} (available: {', '.join(_C._cpu_isas())})")
    row("threads", ampc.get_num_threads())

    print("CUDA", file=out)
    built, why_not = _C._cuda_build_info()
    row("ampc._cuda", "built" if built else f"not available ({why_not})")
    if built:
        v = _C._cuda_versions()
        row("CUDA runtime", f"{_version(v['runtime'], (1000, 10))} (built with {_version(v['runtime_built'], (1000, 10))})")
        row("driver", f"supports CUDA {_version(v['driver'], (1000, 10))}" if v["driver"] else "none")
        row("cuBLASLt", _version(v["cublaslt"], (10000, 100, 1)))
        row("cuDNN", f"{_version(v['cudnn'], (10000, 100, 1))} (built with {_version(v['cudnn_built'], (10000, 100, 1))})")
    try:
        count = ampc.cuda.device_count()
    except RuntimeError as e:
        count = 0
        row("GPUs", f"error: {e}")
    else:
        row("GPUs", count)
    for i in range(count):
        p = ampc.cuda.get_device_properties(i)
        cc = (p.major, p.minor)
        print(f"GPU {i}: {p.name}", file=out)
        row("compute capability", f"{p.major}.{p.minor}")
        row("memory", f"{p.total_memory / 2**30:.1f} GiB, {p.multi_processor_count} SMs")
        row("Tensor Cores", "yes (fp16)" if cc >= (7, 0) else "no")
        row("bfloat16", "native" if cc >= (8, 0) else "emulated (casts only)")
    print("verdict", file=out)
    row("CPU mixed precision", "ready")
    row("GPU mixed precision", "ready" if count else ("no GPU" if built else "ampc._cuda missing"))
    return 0
