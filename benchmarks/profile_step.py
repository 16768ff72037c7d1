"""Where one of the demo's GPU training steps spends its time: the step's wall time against the host's
time to enqueue it (a gap means the GPU is the bound), the peak memory, and ampc's kernels ranked by
GPU time. torch's profiler traces every kernel of the process through CUPTI, ampc's included, so it
needs torch; with --torch it ranks torch's own step of the same model and recipe beside it
(torchvision's ResNet-50, or the demo's GPT-2 in torch).

    python benchmarks/profile_step.py --model resnet50 --channels-last [--torch] [--host]
"""

import argparse
import time

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

import ampc
from ampc.cli import demo_torch, workloads

F = ampc.nn.functional


def top_kernels(step, synchronize, steps=2, top=25):
    """GPU time per step of the kernels step() launches, longest first."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        synchronize()
    events = list(prof.key_averages())
    total = sum(e.device_time_total for e in events) / steps
    print(f"kernel time per step {total / 1e3:.1f} ms, {sum(e.count for e in events) // steps} launches")
    for e in sorted(events, key=lambda e: -e.device_time_total)[:top]:
        print(f"{e.device_time_total / steps / 1e3:8.2f} ms {e.count // steps:5d}x  {e.key[:140]}")


def host_profile(step, synchronize, steps=3, top=30):
    """The Python functions (and C entry points) the host spends a step's enqueue in, by own time:
    when the host's time nears the step's, this is the list to shorten."""
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(steps):
        step()
    profiler.disable()
    synchronize()
    print(f"host time per step by function ({steps} steps):")
    pstats.Stats(profiler).sort_stats("tottime").print_stats(top)


def timed(step, synchronize, reset_peak, warmup=4, steps=5):
    """The median wall time of a step and of its enqueue on the host (ms), after warm-up steps (the
    first runs tune the convolutions), with the peak memory counted from the warm-up's end."""
    for _ in range(warmup):
        step()
    synchronize()
    reset_peak()
    walls, hosts = [], []
    for _ in range(steps):
        began = time.perf_counter()
        step()
        enqueued = time.perf_counter()
        synchronize()
        walls.append(time.perf_counter() - began)
        hosts.append(enqueued - began)
    return 1e3 * np.median(walls), 1e3 * np.median(hosts)


def ampc_step(args):
    ampc.manual_seed(0)
    model = ampc.models.resnet50() if args.model == "resnet50" else ampc.models.gpt(block_size=1024)
    model.to("cuda:0", memory_format="channels_last" if args.channels_last else None)
    params = list(model.parameters())
    optimizer = (ampc.optim.SGD(params, lr=0.1, momentum=0.9) if args.model == "resnet50"
                 else ampc.optim.AdamW(params, lr=3e-4))
    scaler = ampc.GradScaler("cuda")
    x, y = workloads.synthetic_batch(args.model, args.batch_size, 0, channels_last=args.channels_last)
    loss_of = (lambda: F.cross_entropy(model(x), y)) if args.model == "resnet50" else (lambda: model(x, y)[1])
    dtype = None if args.dtype == "float32" else getattr(ampc, args.dtype)  # None: autocast off
    return lambda: workloads.training_step(loss_of, optimizer, scaler, "cuda", dtype)


def torch_step(args):
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False  # float32 as ampc's: no TF32 (torch's convolutions default to it)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(0)
    if args.model == "resnet50":
        import torchvision

        fmt = torch.channels_last if args.channels_last else torch.contiguous_format
        model = torchvision.models.resnet50().cuda().to(memory_format=fmt)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    else:  # the demo's torch GPT-2, the layout and initialisation of ampc.models.gpt
        model = demo_torch._torch_gpt(torch).cuda()
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
    scaler = torch.amp.GradScaler("cuda")
    x, y = (torch.from_dlpack(a) for a in workloads.synthetic_batch(args.model, args.batch_size, 0,
                                                                       channels_last=args.channels_last))
    loss_of = (lambda: torch.nn.functional.cross_entropy(model(x), y)) if args.model == "resnet50" \
        else (lambda: model(x, y))

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=getattr(torch, args.dtype), enabled=args.dtype != "float32"):
            loss = loss_of()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    return step


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("resnet50", "gpt2"), default="resnet50")
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--channels-last", action="store_true")
    parser.add_argument("--dtype", choices=("float16", "bfloat16", "float32"), default="float16",
                        help="autocast's dtype; float32: autocast off")
    parser.add_argument("--torch", action="store_true",
                        help="torch's step of the same model too (torchvision's ResNet-50, the demo's GPT-2)")
    parser.add_argument("--host", action="store_true",
                        help="also where the host's time to enqueue a step goes (cProfile, by own time)")
    args = parser.parse_args()
    args.batch_size = args.batch_size or (256 if args.model == "resnet50" else 8)
    torch.cuda.init()
    sync = lambda: ampc.cuda.synchronize(0)  # noqa: E731
    recipe = args.dtype if args.dtype == "float32" else f"AMP {args.dtype}"
    what = f"{args.model}{' channels-last' if args.channels_last else ''} {recipe}"
    step = ampc_step(args)
    wall, host = timed(step, sync, lambda: ampc.cuda.reset_peak_memory_stats(0))
    print(f"ampc {what}: step {wall:.1f} ms, host enqueue {host:.1f} ms, peak "
          f"{ampc.cuda.max_memory_allocated(0) / 2**20:.0f} MiB")
    top_kernels(step, sync)
    if args.host:
        host_profile(step, sync)
    if args.torch:
        step = torch_step(args)
        wall, host = timed(step, torch.cuda.synchronize, torch.cuda.reset_peak_memory_stats)
        print(f"torch {what}: step {wall:.1f} ms, host enqueue {host:.1f} ms, peak "
              f"{torch.cuda.max_memory_allocated() / 2**20:.0f} MiB")
        top_kernels(step, torch.cuda.synchronize)


if __name__ == "__main__":
    main()
