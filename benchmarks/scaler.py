"""GradScaler throughput on the GPU, against torch in the same run.

    python benchmarks/scaler.py

For the three parameter sets of spec/anchors.md (ResNet-50, GPT-2 124M, a LLaMA-style
1.2B model), fp32 gradients of random normal values: unscale + inf/NaN check, ampc's
scaler.unscale_(optimizer) against torch's own kernel
(torch._amp_foreach_non_finite_check_and_unscale_) and torch's scaler.unscale_. GPU time
with CUDA events (median of --repeat after warm-up), and wall time per call; the floor is
8 bytes per element (read + write) at the measured device-to-device copy bandwidth.
"""

import argparse
import statistics
import time

import torch

import ampc


def resnet50_shapes():
    import torchvision

    return [tuple(p.shape) for p in torchvision.models.resnet50().parameters()]


def gpt2_shapes(d=768, layers=12, vocab=50257, ctx=1024):
    per_layer = [(d,), (d,), (d, 3 * d), (3 * d,), (d, d), (d,), (d,), (d,), (d, 4 * d), (4 * d,), (4 * d, d), (d,)]
    return [(vocab, d), (ctx, d)] + per_layer * layers + [(d,), (d,)]


def llama_shapes(d=2048, ff=8192, layers=16, vocab=32000):
    per_layer = [(d, d)] * 4 + [(ff, d), (ff, d), (d, ff), (d,), (d,)]
    return [(vocab, d)] + per_layer * layers + [(d,), (vocab, d)]


def timed(fn, repeat):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeat)]
    t0 = time.perf_counter()
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) / repeat
    return statistics.median(s.elapsed_time(e) for s, e in events), wall * 1e3


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeat", type=int, default=30)
    args = p.parse_args()
    x = torch.empty(2**28, device="cuda")
    y = torch.empty_like(x)
    copy_ms, _ = timed(lambda: y.copy_(x), args.repeat)
    copy_bw = 8 * x.numel() / copy_ms / 1e6
    del x, y
    print(f"GPU {torch.cuda.get_device_name()}, device-to-device copy {copy_bw:.0f} GB/s")
    rows = []
    for name, shapes in (("ResNet-50", resnet50_shapes()), ("GPT-2 124M", gpt2_shapes()),
                         ("LLaMA-style 1.2B", llama_shapes())):
        params = [torch.nn.Parameter(torch.zeros(s, device="cuda")) for s in shapes]
        for q in params:
            q.grad = torch.randn_like(q)
        grads = [q.grad for q in params]
        n = sum(g.numel() for g in grads)
        floor = 8 * n / copy_bw / 1e6
        opt = torch.optim.SGD(params, lr=0.0)
        found = torch.zeros((), device="cuda")
        inv = torch.full((), 1.0 / 65536, device="cuda")
        theirs, theirs_wall = timed(lambda: torch._amp_foreach_non_finite_check_and_unscale_(grads, found, inv),
                                    args.repeat)
        tscaler = torch.amp.GradScaler("cuda")
        tscaler.scale(torch.ones((), device="cuda"))

        def torch_api():
            tscaler.unscale_(opt)
            tscaler.update()

        api, api_wall = timed(torch_api, args.repeat)
        scaler = ampc.GradScaler("cuda")
        scaler.scale(torch.ones((), device="cuda"))

        def ours_call():
            scaler.unscale_(opt)
            scaler.update()

        ours, ours_wall = timed(ours_call, args.repeat)
        rows.append((name, len(grads), n, floor, theirs, theirs_wall, api, api_wall, ours, ours_wall))
        del params, grads, opt
        torch.cuda.empty_cache()
    print(f"\n{'unscale + inf check':<18}{'tensors':>8}{'elements':>10}{'floor ms':>9}{'torch kernel':>13}"
          f"{'torch unscale_':>15}{'ampc unscale_':>14}{'vs kernel':>10}{'of floor':>9}{'ampc wall':>10}")
    for name, k, n, floor, theirs, theirs_wall, api, api_wall, ours, ours_wall in rows:
        print(f"{name:<18}{k:>8}{n / 1e6:>9.1f}M{floor:>9.3f}{theirs:>13.3f}{api:>15.3f}{ours:>14.3f}"
              f"{theirs / ours:>9.2f}x{100 * floor / ours:>8.0f}%{ours_wall:>10.3f}")


if __name__ == "__main__":
    main()
