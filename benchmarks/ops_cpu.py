"""ampc.nn.functional's CPU kernels against torch's CPU kernels (where torch is installed) and NumPy,
in the same run, on float32 and bfloat16 activations of 512 x 2048: time, the ratio to each peer
(> 1: ampc is faster) and GB/s moved against this machine's copy bandwidth (a NumPy copy of the
same bytes, the limit an elementwise op can reach). Then conv2d on ResNet-50's shapes (batch 8),
forward and backward (data and filter gradients), against torch's convolution and
convolution_backward, in GFLOP/s against NumPy's float32 matrix product of 2048 x 2048 (the BLAS
ampc's convolutions run on). Then GPT-2's causal attention (12 heads of 1024 x 64, float32),
forward and forward + backward as training runs them: ampc by bands of queries, ampc over the
whole matrix, and torch.

    python benchmarks/ops_cpu.py [--threads N] [--only rows|conv|attention]
"""

import argparse
import os
import time

import numpy as np

ROWS, COLS = 512, 2048


def best_of(fn, repeat=9):
    fn()
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=None, help="ampc's and torch's CPU threads")
    parser.add_argument("--only", choices=("rows", "conv", "attention"), help="one of the three tables")
    args = parser.parse_args()
    import ampc
    from ampc.nn import _bare_ops

    F = ampc.nn.functional
    if args.threads:
        ampc.set_num_threads(args.threads)
    try:
        import torch
        import torch.nn.functional as TF

        if args.threads:
            torch.set_num_threads(args.threads)
    except ImportError:
        torch = None
    rng = np.random.default_rng(0)
    target = rng.integers(0, COLS, ROWS)
    # group_norm over the rows as 8 samples of 64 channels of 2048 positions, in 8 groups, with an affine step
    gn_shape, groups, gn_w, gn_b = (ROWS // 64, 64, COLS), 8, rng.standard_normal(64), rng.standard_normal(64)

    def ampc_gn_backward(x):
        w, b = gn_w.astype(x.dtype), gn_b.astype(x.dtype)
        x = x.reshape(gn_shape)
        _, mean, rstd = _bare_ops.group_norm_forward(x, groups, w, b)
        return lambda: F.group_norm_backward(x, x, groups, w, b, mean=mean, rstd=rstd)

    def torch_gn(t):
        w, b = (torch.from_numpy(v).to(t.dtype) for v in (gn_w, gn_b))
        return TF.group_norm(t.reshape(gn_shape), groups, w, b)

    def torch_gn_backward(t):
        w = torch.from_numpy(gn_w).to(t.dtype)
        t = t.reshape(gn_shape)
        _, mean, rstd = torch.ops.aten.native_group_norm(t, w, None, *gn_shape[:2], COLS, groups, 1e-5)
        return lambda: torch.ops.aten.native_group_norm_backward(t, t, mean, rstd, w, *gn_shape[:2], COLS, groups,
                                                                 [True] * 3)
    ops = [  # name, ampc, torch, NumPy (None: no peer), tensors read + written
        ("exp", F.exp, lambda t: torch.exp(t), np.exp, 2),
        ("sigmoid", F.sigmoid, lambda t: torch.sigmoid(t), None, 2),
        ("silu", F.silu, lambda t: TF.silu(t), None, 2),
        ("gelu", F.gelu, lambda t: TF.gelu(t), None, 2),
        ("tanh", F.tanh, lambda t: torch.tanh(t), np.tanh, 2),
        ("softmax", lambda x: F.softmax(x, -1), lambda t: TF.softmax(t, -1), None, 2),
        ("log_softmax", lambda x: F.log_softmax(x, -1), lambda t: TF.log_softmax(t, -1), None, 2),
        ("cross_entropy", lambda x: F.cross_entropy(x, target),
         lambda t: TF.cross_entropy(t, torch.from_numpy(target)), None, 1),
        ("layer_norm", lambda x: F.layer_norm(x, (COLS,)), lambda t: TF.layer_norm(t, (COLS,)), None, 2),
        ("group_norm", lambda x: F.group_norm(x.reshape(gn_shape), groups, gn_w.astype(x.dtype), gn_b.astype(x.dtype)),
         torch_gn, None, 2),
        ("group_norm bwd", Prepared(ampc_gn_backward), Prepared(torch_gn_backward), None, 3),
        ("add", lambda x: F.add(x, x), lambda t: torch.add(t, t), lambda x: np.add(x, x), 3),
    ]
    print(f"threads: ampc {ampc.get_num_threads()}" + (f", torch {torch.get_num_threads()}" if torch else "")
          + f"; {os.cpu_count()} CPUs")
    if args.only in (None, "rows"):
        rows(ops, rng, torch)
    if args.only in (None, "conv"):
        convolutions(rng, torch)
    if args.only in (None, "attention"):
        attention(rng, torch)


class Prepared:
    """An op whose call needs setting up first (a backward's saved statistics): prepare(x) returns the
    call to time, made once per array and kept."""

    def __init__(self, prepare):
        self.prepare, self.calls = prepare, {}

    def __call__(self, x):
        if id(x) not in self.calls:
            self.calls[id(x)] = (x, self.prepare(x))  # x kept alive with it: its id stays its own
        return self.calls[id(x)][1]()


def rows(ops, rng, torch):
    """Every op of ampc (and NumPy) timed first, torch's after: torch's OpenMP workers spin a while after
    each of its calls, on the cores ampc's next timing needs (on 2 cores, interleaved, ampc's two threads
    measured no faster than one), and making them sleep instead (OMP_WAIT_POLICY=passive) slows torch."""
    import ampc

    cases = []
    for dtype in (np.float32, ampc.bfloat16):
        x = rng.standard_normal((ROWS, COLS)).astype(dtype)
        into = np.empty_like(x)
        copy_s = best_of(lambda: np.copyto(into, x))
        for name, ours, theirs, numpys, tensors in ops:
            s = best_of(lambda: ours(x))
            ns = best_of(lambda: numpys(x)) if numpys is not None and dtype == np.float32 else None
            cases.append((name, dtype, x, theirs, tensors, s, ns, 2 * x.nbytes / copy_s / 1e9))
    print(f"{'op':<16}{'dtype':<10}{'ampc ms':>9}{'torch ms':>10}{'ratio':>7}{'numpy ms':>10}{'ratio':>7}"
          f"{'GB/s':>7}{'of copy':>9}")
    for name, dtype, x, theirs, tensors, s, ns, copy_gbs in cases:
        ts = None
        if torch is not None:
            t = torch.from_numpy(x.astype(np.float32)).to(torch.bfloat16 if dtype == ampc.bfloat16 else torch.float32)
            ts = best_of(lambda: theirs(t))
        gbs = tensors * x.nbytes / s / 1e9
        cells = [f"{ts * 1e3:10.2f}{ts / s:7.2f}" if ts else f"{'-':>10}{'-':>7}",
                 f"{ns * 1e3:10.2f}{ns / s:7.2f}" if ns else f"{'-':>10}{'-':>7}"]
        print(f"{name:<16}{np.dtype(dtype).name:<10}{s * 1e3:9.2f}{cells[0]}{cells[1]}{gbs:7.1f}"
              f"{gbs / copy_gbs:8.0%}")


# ResNet-50's convolutions at batch 8: (channels in, side, channels out, kernel, stride)
CONVS = ((3, 224, 64, 7, 2), (64, 56, 64, 3, 1), (64, 56, 256, 1, 1), (256, 56, 64, 1, 1), (128, 28, 128, 3, 1),
         (256, 14, 256, 3, 1), (512, 7, 512, 3, 1))


def convolutions(rng, torch, batch=8):
    import ampc

    F = ampc.nn.functional
    a = rng.standard_normal((2048, 2048), dtype=np.float32)
    peak = 2 * 2048**3 / best_of(lambda: a @ a, 5) / 1e9
    print(f"\nconv2d, batch {batch}, GFLOP/s against NumPy's float32 2048^3 product: {peak:.0f} GFLOP/s")
    print(f"{'c, side, k, kernel/stride':<28}{'dtype':<10}{'pass':<6}{'ampc ms':>9}{'torch ms':>10}{'ratio':>7}"
          f"{'GFLOP/s':>9}{'of peak':>9}")
    for c, side, k, kernel, stride in CONVS:
        pad = kernel // 2
        for dtype in (np.float32, ampc.bfloat16):
            x = rng.standard_normal((batch, c, side, side)).astype(dtype)
            w = (rng.standard_normal((k, c, kernel, kernel)) / np.sqrt(c * kernel * kernel)).astype(dtype)
            y = F.conv2d(x, w, None, stride, pad)
            dy = rng.standard_normal(y.shape).astype(dtype)
            flops = 2 * y.size * c * kernel * kernel
            ours = {"fwd": best_of(lambda: F.conv2d(x, w, None, stride, pad), 3),
                    "bwd": best_of(lambda: F.conv2d_backward(dy, x, w, stride, pad, bias_grad=False), 3)}
            theirs = {}
            if torch is not None:
                tdt = torch.bfloat16 if dtype == ampc.bfloat16 else torch.float32
                tx, tw, tdy = (torch.from_numpy(v.astype(np.float32)).to(tdt) for v in (x, w, dy))
                theirs["fwd"] = best_of(lambda: torch.nn.functional.conv2d(tx, tw, None, stride, pad), 3)
                theirs["bwd"] = best_of(lambda: torch.ops.aten.convolution_backward(
                    tdy, tx, tw, None, [stride] * 2, [pad] * 2, [1, 1], False, [0, 0], 1, [True, True, False]), 3)
            for name, s in ours.items():
                work = flops * (2 if name == "bwd" else 1)
                ts = theirs.get(name)
                cell = f"{ts * 1e3:10.2f}{ts / s:7.2f}" if ts else f"{'-':>10}{'-':>7}"
                print(f"{f'{c}, {side}, {k}, {kernel}/{stride}':<28}{np.dtype(dtype).name:<10}{name:<6}{s * 1e3:9.2f}"
                      f"{cell}{work / s / 1e9:9.1f}{work / s / 1e9 / peak:9.0%}")


def attention(rng, torch, heads=12, length=1024, width=64):
    from ampc.nn import _attention, _differentiable

    q, k, v, g = (rng.standard_normal((1, heads, length, width), dtype=np.float32) for _ in range(4))
    args = dict(query=q, key=k, value=v, attn_mask=None, dropout_p=0.0, is_causal=True, scale=None,
                enable_gqa=False)

    def forward():
        return _differentiable._attention_forward(args)

    def both():
        _differentiable._attention_backward(args, forward()[1], g, (True, True, True, False))

    times = {}
    rows_each = _attention.CAUSAL_BAND_ROWS
    for name, band_rows in (("ampc by bands", rows_each), ("ampc whole", length)):
        _attention.CAUSAL_BAND_ROWS = band_rows
        times[name] = (best_of(forward, 5), best_of(both, 5))
    _attention.CAUSAL_BAND_ROWS = rows_each
    if torch is not None:
        tq, tk, tv = (torch.from_numpy(a).requires_grad_(True) for a in (q, k, v))
        tg = torch.from_numpy(g)

        def torch_forward():
            with torch.no_grad():
                torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=True)

        def torch_both():
            torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=True).backward(tg)

        times["torch"] = (best_of(torch_forward, 5), best_of(torch_both, 5))
    a = rng.standard_normal((2048, 2048), dtype=np.float32)
    peak = 2 * 2048**3 / best_of(lambda: a @ a, 5) / 1e9
    flops = 2 * heads * length * length * width  # the products a causal mask leaves, forward; 3.5x with backward
    print(f"\ncausal attention, {heads} heads of {length} x {width}, float32; ratio = torch / this row; GFLOP/s "
          f"(forward and backward) against NumPy's float32 2048^3 product: {peak:.0f} GFLOP/s")
    print(f"{'':<16}{'fwd ms':>9}{'fwd+bwd ms':>12}{'ratio':>12}{'GFLOP/s':>9}{'of peak':>9}")
    for name, (fwd, fb) in times.items():
        ratio = f"{times['torch'][0] / fwd:5.2f}/{times['torch'][1] / fb:4.2f}" if "torch" in times else "-"
        rate = 3.5 * flops / fb / 1e9
        print(f"{name:<16}{fwd * 1e3:9.1f}{fb * 1e3:12.1f}{ratio:>12}{rate:9.1f}{rate / peak:9.0%}")


if __name__ == "__main__":
    main()
