"""python -m ampc doctor: can this environment run ampc, and how fast?"""

import platform
import sys
import time

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


def _best_ms(fn, device, repeat=5):
    """The fastest of `repeat` timed calls of fn (after one warm-up), in ms; a GPU waited for."""
    fn()
    times = []
    for _ in range(repeat):
        if device >= 0:
            ampc.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device >= 0:
            ampc.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return 1e3 * min(times)


def _speedups(device, dtype):
    """Measured (matmul, conv2d) speed-ups of dtype over float32 on device (-1: the CPU): a square
    matrix product and a ResNet-like 3x3 convolution, each op given arrays already in the dtype,
    as autocast would hand them over."""
    F = ampc.nn.functional
    rng = np.random.default_rng(0)
    n, (b, c, hw) = (4096, (64, 256, 14)) if device >= 0 else (384, (8, 64, 14))
    a = rng.standard_normal((n, n), dtype=np.float32)
    x = rng.standard_normal((b, c, hw, hw), dtype=np.float32)
    w = (rng.standard_normal((c, c, 3, 3), dtype=np.float32) / np.sqrt(9 * c)).astype(np.float32)
    result = []
    for op, args in ((lambda p, q: F.matmul(p, q), (a, a)), (lambda p, q: F.conv2d(p, q, padding=1), (x, w))):
        times = []
        for dt in (ampc.float32, dtype):
            moved = [_C._to_device(np.ascontiguousarray(ampc.cast(v, dt)), device) for v in args]
            times.append(_best_ms(lambda: op(*moved), device))
        result.append(times[0] / times[1])
    return tuple(result)


def _gpu_verdict(cc):
    if cc >= (8, 0):
        return "AMP recommended: Tensor Cores for float16 and bfloat16"
    if cc >= (7, 0):
        return "AMP recommended (float16 with GradScaler): Tensor Cores; no bfloat16 before Ampere"
    if cc >= (6, 0):
        return "memory saving only: no Tensor Cores on Pascal; no bfloat16 before Ampere"
    return "not recommended: too old for float16 arithmetic"


def doctor(out=sys.stdout, measure=True):
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
        row("fused attention", "16-bit, head_dim 64" if cc >= (8, 0) else "no (composed from products and softmax)")
        if measure:
            mm, conv = _speedups(i, ampc.float16)
            row("fp16 vs fp32", f"matmul 4096^3 {mm:.1f}x, conv2d 3x3 64x256x14^2 {conv:.1f}x (measured)")
        row("verdict", _gpu_verdict(cc))
    print("verdict", file=out)
    if measure:
        mm, conv = _speedups(-1, ampc.bfloat16)
        row("CPU bf16 vs fp32", f"matmul 384^3 {mm:.2f}x, conv2d 3x3 8x64x14^2 {conv:.2f}x (measured)")
        cpu = ("AMP bf16 recommended: faster here" if min(mm, conv) > 1.1 else
               "AMP bf16 for memory only: bfloat16 products run in float32 here (no speed-up)")
    else:
        cpu = "ready"
    row("CPU mixed precision", cpu)
    row("GPU mixed precision", "ready, see each GPU's verdict" if count else
        ("no GPU" if built else "ampc._cuda missing"))
    return 0
