"""ampc.nn.functional's GPU ops against torch's, in the same run.

    python benchmarks/ops.py [--repeat N] [--only linear softmax ...] [--match REGEX] [--profile REGEX]

Each row times one op (forward or backward) on torch CUDA tensors with CUDA events, median of
--repeat after warm-up, the calls queued behind a sleep kernel so that the events time the kernels
(the host's time per call is host_time.py's): ampc's and torch's, the ratio torch / ampc (above 1:
ampc faster), and what ampc achieves against the measured limit: TFLOP/s against torch's own best product of that
dtype (an 8192^3 matmul, which is what cuBLAS reaches here), GB/s against a device-to-device
copy. Shapes: GPT-2 small's linear layers (8 x 1024 tokens, d = 768), ResNet-50's classifier,
convolutions and batch norms (batch 256; NCHW and channels-last), the GPT-2 LM head's
cross_entropy (50257 classes), layer_norm and softmax rows, a diffusion U-Net's group_norm, GPT-2's
causal attention. Backward passes: torch's own backward ops (what autograd calls; autograd itself
for batch_norm and attention), ampc's *_backward functions.

--profile REGEX times nothing: each row whose "op shape dtype" REGEX finds runs one ampc call and
then one torch call (after warm-up) between cudaProfilerStart and cudaProfilerStop, for
`ncu --profile-from-start off` (benchmarks/ncu_rows.sh prints what ncu measured of their kernels).
"""

import argparse
import os
import re
import statistics
import sys

import torch

import ampc
from ampc.nn import _bare_ops, _differentiable, _spatial

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from scaler import copy_bandwidth, timed as timed_with_wall  # noqa: E402

F = ampc.nn.functional
TF = torch.nn.functional
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def sleep_cycles_per_ms():
    """How many of torch.cuda._sleep's cycles make a millisecond on this GPU."""
    torch.cuda._sleep(1_000_000)  # warm-up
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(10_000_000)
    end.record()
    end.synchronize()
    return 10_000_000 / start.elapsed_time(end)


CYCLES_PER_MS = None


def timed(fn, repeat):
    """Median GPU milliseconds of fn, the kernels' time and not the host's.

    Timed back to back, a call whose kernels finish before the host has launched the next call's
    measures the host (launch-bound rows took 0.04-0.06 ms whatever their kernels did). So the GPU
    is first held in a sleep kernel long enough for the host to queue every call: each pair of
    events then brackets only its call's kernels. The host's own time is host_time.py's.
    """
    global CYCLES_PER_MS
    if CYCLES_PER_MS is None:
        CYCLES_PER_MS = sleep_cycles_per_ms()
    _, wall = timed_with_wall(fn, 3)  # warm-up; the wall time bounds the host's time per call
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeat)]
    torch.cuda._sleep(int(CYCLES_PER_MS * (2 * wall * repeat + 1)))
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in events)


def matmul_peak(dtype, repeat):
    a = torch.randn(8192, 8192, device="cuda", dtype=dtype)
    b = torch.randn(8192, 8192, device="cuda", dtype=dtype)
    return 2 * 8192**3 / timed(lambda: a @ b, repeat) / 1e9  # TFLOP/s


ROWS = []
PROFILE = None  # --profile's compiled pattern
MATCH = None  # --match's


def profiled(label, ampc_fn, torch_fn):
    """One call of each, after warm-up, inside the CUDA profiler's range."""
    for fn in (ampc_fn, torch_fn):
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    print(f"profiled: {label} (ampc's kernels, then torch's)", flush=True)
    torch.cuda.cudart().cudaProfilerStart()
    for fn in (ampc_fn, torch_fn):
        fn()
        torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def row(op, shape, dtype, ampc_fn, torch_fn, repeat, *, flops=None, nbytes=None, limits=None):
    label = f"{op} {shape} {dtype}"
    if PROFILE is not None:
        if PROFILE.search(label):
            profiled(label, ampc_fn, torch_fn)
        return
    if MATCH is not None and not MATCH.search(label):
        return
    t_ampc = timed(ampc_fn, repeat)
    t_torch = timed(torch_fn, repeat)
    if flops is not None:
        achieved = f"{flops / t_ampc / 1e9:7.1f} TFLOP/s = {100 * flops / t_ampc / 1e9 / limits['peak'][dtype]:3.0f} %"
    else:
        achieved = f"{nbytes / t_ampc / 1e6:7.0f} GB/s    = {100 * nbytes / t_ampc / 1e6 / limits['copy']:3.0f} %"
    ROWS.append((op, shape, dtype, t_ampc, t_torch, achieved))
    print(f"{op:<28} {shape:<18} {dtype:<5} {t_ampc:9.3f} {t_torch:9.3f} {t_torch / t_ampc:6.2f}x  {achieved}",
          flush=True)


def bench_linear(limits, repeat):
    shapes = [("GPT-2 qkv", 8192, 768, 2304), ("GPT-2 fc", 8192, 768, 3072), ("GPT-2 proj", 8192, 3072, 768),
              ("GPT-2 lm_head", 8192, 768, 50257), ("ResNet-50 fc", 256, 2048, 1000)]
    for name, m, k, n in shapes:
        for dn, dtype in DTYPES.items():
            x = torch.randn(m, k, device="cuda", dtype=dtype)
            w = torch.randn(n, k, device="cuda", dtype=dtype) * 0.02
            b = torch.randn(n, device="cuda", dtype=dtype)
            g = torch.randn(m, n, device="cuda", dtype=dtype)
            shape = f"{m}x{k}->{n}"
            row(f"linear fwd {name}", shape, dn, lambda: F.linear(x, w, b), lambda: TF.linear(x, w, b), repeat,
                flops=2 * m * n * k, limits=limits)

            def torch_backward():
                g.mm(w)
                g.t().mm(x)
                g.sum(0)

            row(f"linear bwd {name}", shape, dn, lambda: F.linear_backward(g, x, w), torch_backward, repeat,
                flops=4 * m * n * k, limits=limits)


def bench_layer_norm(limits, repeat):
    for rows, n in [(8192, 768), (8192, 1024), (4096, 4096)]:
        for dn, dtype in DTYPES.items():
            x = torch.randn(rows, n, device="cuda", dtype=dtype)
            w = torch.randn(n, device="cuda", dtype=dtype)
            b = torch.randn(n, device="cuda", dtype=dtype)
            g = torch.randn(rows, n, device="cuda", dtype=dtype)
            size = x.element_size()
            shape = f"{rows}x{n}"
            row("layer_norm fwd", shape, dn, lambda: F.layer_norm(x, (n,), w, b),
                lambda: TF.layer_norm(x, (n,), w, b), repeat, nbytes=2 * rows * n * size, limits=limits)
            _, mean, rstd = _bare_ops.layer_norm_forward(x, (n,), w, b)
            _, tmean, trstd = torch.ops.aten.native_layer_norm(x, (n,), w, b, 1e-5)
            row("layer_norm bwd", shape, dn,
                lambda: F.layer_norm_backward(g, x, (n,), w, b, mean=mean, rstd=rstd),
                lambda: torch.ops.aten.native_layer_norm_backward(g, x, (n,), tmean, trstd, w, b, [True] * 3),
                repeat, nbytes=3 * rows * n * size, limits=limits)


def bench_group_norm(limits, repeat):
    """A diffusion U-Net's group norms (32 groups of its channels) and one of many small channels."""
    for batch, c, h, groups in [(8, 320, 64, 32), (8, 640, 32, 32), (8, 1280, 16, 32), (64, 256, 7, 32)]:
        for dn, dtype in DTYPES.items():
            x = torch.randn(batch, c, h, h, device="cuda", dtype=dtype)
            w, b = torch.randn(c, device="cuda", dtype=dtype), torch.randn(c, device="cuda", dtype=dtype)
            g = torch.randn_like(x)
            nbytes = x.numel() * x.element_size()
            shape = f"{batch}x{c}x{h}^2 /{groups}"
            row("group_norm fwd", shape, dn, lambda: F.group_norm(x, groups, w, b),
                lambda: TF.group_norm(x, groups, w, b), repeat, nbytes=2 * nbytes, limits=limits)
            _, mean, rstd = _bare_ops.group_norm_forward(x, groups, w, b)
            _, tmean, trstd = torch.ops.aten.native_group_norm(x, w, b, batch, c, h * h, groups, 1e-5)
            row("group_norm bwd", shape, dn,
                lambda: F.group_norm_backward(g, x, groups, w, b, mean=mean, rstd=rstd),
                lambda: torch.ops.aten.native_group_norm_backward(g, x, tmean, trstd, w, batch, c, h * h, groups,
                                                                  [True] * 3),
                repeat, nbytes=3 * nbytes, limits=limits)


def bench_softmax(limits, repeat):
    for rows, n in [(8192, 1024), (96 * 1024, 1024), (8192, 50257)]:
        for dn, dtype in DTYPES.items():
            x = torch.randn(rows, n, device="cuda", dtype=dtype)
            g = torch.randn(rows, n, device="cuda", dtype=dtype)
            size = x.element_size()
            shape = f"{rows}x{n}"
            row("softmax fwd", shape, dn, lambda: F.softmax(x, dim=-1), lambda: TF.softmax(x, dim=-1), repeat,
                nbytes=2 * rows * n * size, limits=limits)
            y = TF.softmax(x, dim=-1)
            row("softmax bwd", shape, dn, lambda: F.softmax_backward(g, y, -1),
                lambda: torch._softmax_backward_data(g, y, -1, dtype), repeat, nbytes=3 * rows * n * size,
                limits=limits)


def bench_cross_entropy(limits, repeat):
    for rows, n in [(8192, 50257), (256, 1000)]:
        for dn, dtype in DTYPES.items():
            x = torch.randn(rows, n, device="cuda", dtype=dtype)
            t = torch.randint(0, n, (rows,), device="cuda")
            size = x.element_size()
            shape = f"{rows}x{n}"
            row("cross_entropy fwd", shape, dn, lambda: F.cross_entropy(x, t), lambda: TF.cross_entropy(x, t),
                repeat, nbytes=rows * n * size, limits=limits)
            xr = x.clone().requires_grad_(True)
            one = torch.ones((), device="cuda", dtype=torch.float32)

            def torch_both():
                TF.cross_entropy(xr, t).backward()

            def ampc_both():
                loss, lse, denom = _bare_ops.cross_entropy_forward(x, t)
                F.cross_entropy_backward(one, x, t, lse=lse, denom=denom)

            row("cross_entropy fwd+bwd", shape, dn, ampc_both, torch_both, repeat, nbytes=3 * rows * n * size,
                limits=limits)


def bench_attention(limits, repeat):
    """GPT-2 small's attention (8 x 12 heads of 1024 x 64), causal: ampc's public op against torch's,
    forward and forward + backward as training runs them (ampc: the tape's two halves; torch:
    autograd). 16-bit: ampc's fused kernels against torch's FlashAttention; float32: ampc's
    composed attention against torch's memory-efficient kernel. FLOPs count the
    products a causal mask leaves (half of 4 * B * H * L * L * E forward, 2.5x that backward), as
    FlashAttention's papers do."""
    b, h, n, e = 8, 12, 1024, 64
    for dn, dtype in DTYPES.items():
        q, k, v = (torch.randn(b, h, n, e, device="cuda", dtype=dtype) for _ in range(3))
        g = torch.randn(b, h, n, e, device="cuda", dtype=dtype)
        flops = 2 * b * h * n * n * e  # causal: half of the forward's two products
        shape = f"{b}x{h}x{n}x{e}"
        row("attention fwd causal", shape, dn, lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
            lambda: TF.scaled_dot_product_attention(q, k, v, is_causal=True), repeat, flops=flops, limits=limits)
        qr, kr, vr = (x.clone().requires_grad_(True) for x in (q, k, v))
        args = dict(query=q, key=k, value=v, attn_mask=None, dropout_p=0.0, is_causal=True, scale=None,
                    enable_gqa=False)

        def torch_both():
            TF.scaled_dot_product_attention(qr, kr, vr, is_causal=True).backward(g)

        def ampc_both():
            _, state = _differentiable._attention_forward(args)
            _differentiable._attention_backward(args, state, g, (True, True, True, False))

        row("attention fwd+bwd causal", shape, dn, ampc_both, torch_both, repeat, flops=3.5 * flops, limits=limits)


# ResNet-50's convolutions at batch 256: (name, C, H, K, kernel, stride), padding kernel // 2. The
# stride-2 ones are each stage's first 3x3 and its 1x1 downsample.
RESNET_CONVS = [("stem 7x7", 3, 224, 64, 7, 2), ("layer1 3x3", 64, 56, 64, 3, 1), ("layer1 1x1", 256, 56, 64, 1, 1),
                ("layer2 3x3 s2", 128, 56, 128, 3, 2), ("layer2 down s2", 256, 56, 512, 1, 2),
                ("layer3 down s2", 512, 28, 1024, 1, 2), ("layer3 3x3", 256, 14, 256, 3, 1),
                ("layer4 3x3 s2", 512, 14, 512, 3, 2), ("layer4 down s2", 1024, 14, 2048, 1, 2),
                ("layer4 1x1", 512, 7, 2048, 1, 1)]
LAYOUTS = {"nchw": torch.contiguous_format, "nhwc": torch.channels_last}


def bench_conv2d(limits, repeat, batch=256):
    for name, c, h, k, r, stride in RESNET_CONVS:
        for dn, dtype in DTYPES.items():
            for ln, layout in LAYOUTS.items():
                x = torch.randn(batch, c, h, h, device="cuda", dtype=dtype).contiguous(memory_format=layout)
                w = (torch.randn(k, c, r, r, device="cuda", dtype=dtype) * (c * r * r) ** -0.5).contiguous(
                    memory_format=layout)
                kw = dict(stride=stride, padding=r // 2)
                y = TF.conv2d(x, w, None, **kw)
                g = torch.randn_like(y)
                flops = 2 * y.numel() * c * r * r
                shape = f"{batch}x{c}x{h}^2->{k} {ln}"
                row(f"conv2d fwd {name}", shape, dn, lambda: F.conv2d(x, w, None, **kw),
                    lambda: TF.conv2d(x, w, None, **kw), repeat, flops=flops, limits=limits)
                # what autograd runs: the data gradient (not for the stem's image) and the filter's
                mask = [name != "stem 7x7", True, False]
                row(f"conv2d bwd {name}", shape, dn,
                    lambda: F.conv2d_backward(g, x, w, **kw, input_grad=mask[0], bias_grad=False),
                    lambda: torch.ops.aten.convolution_backward(g, x, w, None, [stride] * 2, [r // 2] * 2, [1, 1],
                                                                False, [0, 0], 1, mask),
                    repeat, flops=flops * (1 + mask[0]), limits=limits)


def bench_batch_norm(limits, repeat, batch=256):
    for c, h in [(64, 112), (256, 56), (512, 28), (1024, 14), (2048, 7)]:
        for dn, dtype in DTYPES.items():
            for ln, layout in LAYOUTS.items():
                x = torch.randn(batch, c, h, h, device="cuda", dtype=dtype).contiguous(memory_format=layout)
                g = torch.randn_like(x)
                w, b = torch.rand(c, device="cuda") + 0.5, torch.randn(c, device="cuda")
                rm, rv = torch.zeros(c, device="cuda"), torch.ones(c, device="cuda")
                shape = f"{batch}x{c}x{h}^2 {ln}"
                nbytes = x.numel() * x.element_size()
                row("batch_norm fwd (train)", shape, dn, lambda: F.batch_norm(x, rm, rv, w, b, training=True),
                    lambda: TF.batch_norm(x, rm, rv, w, b, training=True), repeat, nbytes=2 * nbytes, limits=limits)
                _, mean, rstd = _spatial.batch_norm_forward(x, rm, rv, w, b, True)
                xr, wr, br = x.clone().requires_grad_(True), w.clone().requires_grad_(True), b.clone().requires_grad_(True)
                yr = TF.batch_norm(xr, rm, rv, wr, br, training=True)
                row("batch_norm bwd", shape, dn,
                    lambda: F.batch_norm_backward(g, x, w, training=True, save_mean=mean, save_rstd=rstd),
                    lambda: torch.autograd.grad(yr, (xr, wr, br), g, retain_graph=True), repeat,
                    nbytes=3 * nbytes, limits=limits)


BENCHES = {"linear": bench_linear, "conv2d": bench_conv2d, "layer_norm": bench_layer_norm,
           "group_norm": bench_group_norm, "batch_norm": bench_batch_norm, "softmax": bench_softmax,
           "cross_entropy": bench_cross_entropy, "attention": bench_attention}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--only", nargs="*", choices=sorted(BENCHES), default=list(BENCHES))
    parser.add_argument("--profile", metavar="REGEX", help="profile the matching rows instead of timing any")
    parser.add_argument("--match", metavar="REGEX", help="time only the rows whose \"op shape dtype\" it finds")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False  # torch's default: full fp32 products, as ampc's
    torch.backends.cudnn.allow_tf32 = False  # torch's convolutions default to TF32; ampc's never are
    global MATCH, PROFILE
    MATCH = re.compile(args.match) if args.match is not None else None
    if args.profile is not None:
        PROFILE = re.compile(args.profile)
        for name in args.only:
            BENCHES[name](None, args.repeat)
        return
    limits = {"copy": copy_bandwidth(args.repeat),
              "peak": {dn: matmul_peak(dt, 10) for dn, dt in DTYPES.items()}}
    print(f"{torch.cuda.get_device_name()}: copy {limits['copy']:.0f} GB/s; matmul peak (torch, 8192^3) "
          + ", ".join(f"{dn} {v:.0f} TFLOP/s" for dn, v in limits["peak"].items()))
    print(f"{'op':<28} {'shape':<18} {'dtype':<5} {'ampc ms':>9} {'torch ms':>9} {'torch/ampc':>7}  ampc achieves")
    for name in args.only:
        BENCHES[name](limits, args.repeat)


if __name__ == "__main__":
    main()
