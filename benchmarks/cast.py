"""Cast throughput: ampc against torch, CuPy, NumPy and ml_dtypes in the same run.

    python benchmarks/cast.py            # GPU (if any) and CPU, 2^28 elements
    python benchmarks/cast.py --log2n 24 --cpu-only

GPU: float32 -> float16 and -> bfloat16 of 2^28 elements (1 GiB in, 512 MiB out),
timed with CUDA events on the default stream (median of --repeat after warm-up),
against torch's Tensor.to / copy_ and CuPy's astype, and against the measured
device-to-device copy bandwidth (bytes read + written). A cast moves 6 bytes
per element; the target is 90 % of the copy's bandwidth.

CPU: the same casts on one thread (ampc.set_num_threads(1)) against NumPy's
astype(float16) and ml_dtypes' astype(bfloat16), allocating and into a
preallocated output, and ampc on all threads; the target is 5x NumPy's float16
cast on one thread.
"""

import argparse
import json
import os
import statistics
import sys
import time

import ml_dtypes
import numpy as np

import ampc

ROWS = []


def row(group, name, seconds, nbytes, peer=None, floor=None):
    r = {"group": group, "name": name, "ms": seconds * 1e3, "GB/s": nbytes / seconds / 1e9}
    if peer is not None:
        r["vs"] = peer
    if floor is not None:
        r["of_copy"] = r["GB/s"] / floor
    ROWS.append(r)
    return r


def gpu(n, repeat):
    import torch

    try:
        import cupy
    except ImportError:
        cupy = None
    x = torch.randn(n, device="cuda")
    out16 = torch.empty(n, dtype=torch.float16, device="cuda")
    outbf = torch.empty(n, dtype=torch.bfloat16, device="cuda")
    copy_dst = torch.empty_like(x)

    def timed(fn):
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeat)]
        for start, end in events:
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
        return statistics.median(s.elapsed_time(e) for s, e in events) / 1e3

    copy = timed(lambda: copy_dst.copy_(x))
    copy_bw = 8 * n / copy / 1e9
    row("gpu", "device-to-device copy (fp32)", copy, 8 * n)
    cx = cupy.from_dlpack(x) if cupy is not None else None
    for label, tdtype, adtype, out in (("fp32->fp16", torch.float16, "float16", out16),
                                       ("fp32->bf16", torch.bfloat16, "bfloat16", outbf)):
        nbytes = 6 * n
        torch_to = timed(lambda: x.to(tdtype))
        torch_copy = timed(lambda: out.copy_(x))
        ampc_new = timed(lambda: ampc.cast(x, adtype))
        ampc_out = timed(lambda: ampc.cast(x, out=out))
        row("gpu", f"{label} torch Tensor.to", torch_to, nbytes, floor=copy_bw)
        row("gpu", f"{label} torch copy_ (preallocated)", torch_copy, nbytes, floor=copy_bw)
        if cx is not None:
            try:
                cupy_t = timed(lambda: cx.astype(getattr(ml_dtypes, adtype, None) or adtype))
                row("gpu", f"{label} cupy astype", cupy_t, nbytes, floor=copy_bw)
            except Exception as e:  # CuPy without this dtype
                print(f"cupy astype {adtype}: {type(e).__name__}: {e}", file=sys.stderr)
        row("gpu", f"{label} ampc.cast", ampc_new, nbytes, peer=torch_to / ampc_new, floor=copy_bw)
        row("gpu", f"{label} ampc.cast out= (preallocated)", ampc_out, nbytes, peer=torch_copy / ampc_out,
            floor=copy_bw)
        check = ampc.cast(x, adtype)
        assert torch.equal(check, x.to(tdtype)), f"{label}: ampc and torch disagree"


def cpu(n, repeat):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(n, dtype=np.float32)
    out16 = np.empty(n, np.float16)
    outbf = np.empty(n, ml_dtypes.bfloat16)
    out32 = np.empty(n, np.float32)

    def timed(fn):
        fn()
        times = []
        for _ in range(repeat):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return min(times)

    threads = ampc.get_num_threads()
    copy = timed(lambda: np.copyto(out32, x))
    row("cpu", "memcpy fp32 (numpy copyto, 1 thread)", copy, 8 * n)
    try:
        for label, dtype, out in (("fp32->fp16", np.float16, out16), ("fp32->bf16", ml_dtypes.bfloat16, outbf)):
            nbytes = 6 * n
            peer = "numpy" if dtype is np.float16 else "ml_dtypes"
            with np.errstate(all="ignore"):
                theirs_new = timed(lambda: x.astype(dtype))
                theirs_out = timed(lambda: np.copyto(out, x, casting="unsafe"))
            ampc.set_num_threads(1)
            ours_new = timed(lambda: ampc.cast(x, dtype))
            ours_out = timed(lambda: ampc.cast(x, out=out))
            ampc.set_num_threads(threads)
            ours_all = timed(lambda: ampc.cast(x, out=out))
            row("cpu", f"{label} {peer} astype", theirs_new, nbytes)
            row("cpu", f"{label} {peer} into preallocated", theirs_out, nbytes)
            row("cpu", f"{label} ampc.cast, 1 thread", ours_new, nbytes, peer=theirs_new / ours_new)
            row("cpu", f"{label} ampc.cast out=, 1 thread", ours_out, nbytes, peer=theirs_out / ours_out)
            row("cpu", f"{label} ampc.cast out=, {threads} threads", ours_all, nbytes, peer=theirs_out / ours_all)
            ampc.set_num_threads(1)
            best = ampc._C._cpu_isa()
            for isa in ampc._C._cpu_isas():  # each instruction set's kernels, for the record
                ampc._C._set_cpu_isa(isa)
                t = timed(lambda: ampc.cast(x, out=out))
                row("cpu", f"{label} out=, 1 thread, {isa} kernels", t, nbytes, peer=theirs_out / t)
            ampc._C._set_cpu_isa(best)
            ampc.set_num_threads(threads)
    finally:
        ampc.set_num_threads(threads)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--log2n", type=int, default=28)
    p.add_argument("--repeat", type=int, default=30)
    p.add_argument("--cpu-repeat", type=int, default=5)
    p.add_argument("--cpu-only", action="store_true")
    p.add_argument("--gpu-only", action="store_true")
    p.add_argument("--json", help="also write the rows here")
    args = p.parse_args()
    n = 2**args.log2n
    print(f"ampc {ampc.__version__}, numpy {np.__version__}, ml_dtypes {ml_dtypes.__version__}, "
          f"CPU kernels {ampc._C._cpu_isa()}, n = 2^{args.log2n}")
    if not args.cpu_only and ampc.cuda.is_available():
        print(f"GPU: {ampc.cuda.get_device_name()}")
        gpu(n, args.repeat)
    if not args.gpu_only:
        cpu(n, args.cpu_repeat)
    print(f"\n{'':4}{'what':<44}{'ms':>9}{'GB/s':>9}{'speed-up':>10}{'of copy':>9}")
    for r in ROWS:
        vs = f"{r['vs']:.2f}x" if "vs" in r else ""
        of = f"{100 * r['of_copy']:.0f} %" if "of_copy" in r else ""
        print(f"{r['group']:<4}{r['name']:<44}{r['ms']:>9.3f}{r['GB/s']:>9.1f}{vs:>10}{of:>9}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(ROWS, f, indent=1)


if __name__ == "__main__":
    main()
