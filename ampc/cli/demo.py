"""python -m ampc demo: what mixed precision buys, measured.

One model is trained three times with the same data, seed and recipe: in float32, under
``ampc.autocast`` in bfloat16, and under autocast in float16 with a GradScaler. The table gives
each run's step time, peak memory, final accuracy, skipped steps and final loss scale.

- ``--model mlp`` (the default): an MLP on the handwritten digits ampc ships (ampc.data), AdamW,
  on the CPU or, where there is one, the GPU.
- ``--model resnet50`` / ``--model gpt2``: the seed's ResNet-50 table (random 224x224 images, SGD
  with momentum) or a GPT-2 small step (random tokens, AdamW): step time and memory, the median of
  ``--steps`` steps after ``--warmup``. ``--compare-torch`` runs the same model and recipe in
  torch's AMP in the same process and adds its rows (torchvision's ResNet-50, a nanoGPT GPT-2).
"""

import gc
import math
import time
import tracemalloc

import numpy as np

import ampc
from ampc import nn
from ampc.cli.demo_torch import train_torch, train_torch_mlp
from ampc.cli.plot import save_training_plot
from ampc.cli.progress import Progress
from ampc.cli.workloads import (RECIPES, batches, digits_split, mlp, synchronize, synthetic_batch, synthetic_loss,
                                synthetic_model, training_step)
from ampc.nn import _attention
from ampc.nn.modules import _device_index

F = nn.functional


def train(recipe, data, epochs=20, batch_size=64, lr=2e-3, seed=0, inject_inf_at=None, progress=True, index=-1,
          nan_at=None):
    """Train a fresh MLP under recipe on device index (-1: the CPU); a dict of what the demo reports,
    with the loss and scale at every step. inject_inf_at: a step whose gradients are made inf (as an
    overflow would); nan_at: a step whose batch holds a NaN (as bad data would)."""
    name, dtype, scaled = recipe
    x_train, y_train, x_test, y_test = data
    ampc.manual_seed(seed)
    device_type = "cpu" if index < 0 else "cuda"
    model = mlp().to("cpu" if index < 0 else f"cuda:{index}")
    optimizer = ampc.optim.AdamW(list(model.parameters()), lr=lr)
    scaler = ampc.GradScaler(device_type, enabled=scaled)
    if index >= 0:
        ampc.cuda.reset_peak_memory_stats(index)
    steps_per_epoch = math.ceil(len(x_train) / batch_size)
    bar = Progress(name, epochs * steps_per_epoch) if progress else None
    losses, scales, step_times = [], [], []
    for x, y in batches(x_train, y_train, epochs, batch_size, seed, nan_at):
        x, y = ampc._C._to_device(x, index), ampc._C._to_device(y, index)
        began = time.perf_counter()
        def overflow():
            first = next(iter(model.parameters()))
            first.grad = ampc._C._to_device(np.full(first.grad.shape, np.inf, np.float32), index)

        loss = training_step(lambda: F.cross_entropy(model(x), y), optimizer, scaler, device_type, dtype,
                             overflow if inject_inf_at == len(losses) else None)
        synchronize(index)
        step_times.append(time.perf_counter() - began)
        losses.append(float(loss))
        scales.append(scaler.get_scale() if scaled else 1.0)
        if bar is not None:
            bar.show(len(losses), losses[-1])
    model.eval()
    with ampc.no_grad():
        logits = model(ampc._C._to_device(x_test, index))
        predictions = np.asarray(ampc._C._to_device(logits, -1)).argmax(axis=1)
    stats = scaler.stats()
    return {
        "name": name,
        "library": "ampc",
        "peak_bytes": ampc.cuda.max_memory_allocated(index) if index >= 0 else None,
        "step_ms": 1e3 * float(np.median(step_times)),
        "accuracy": float((predictions == y_test).mean()),
        "skipped": stats["skipped_steps"] if scaled else 0,
        "scale": stats["scale"] if scaled else None,
        "final_loss": losses[-1],
        "losses": losses,
        "scales": scales,
    }


def peak_memory(recipe, data, steps=3, batch_size=64):
    """Peak bytes a few training steps hold (model, optimizer state, activations, gradients),
    traced apart from the timed run: tracing every allocation would slow it."""
    name, dtype, scaled = recipe
    x_train, y_train = data[0][:batch_size], data[1][:batch_size]
    tracemalloc.start()
    try:
        model = mlp()
        optimizer = ampc.optim.AdamW(list(model.parameters()), lr=1e-3)
        scaler = ampc.GradScaler("cpu", enabled=scaled)
        for _ in range(steps):
            training_step(lambda: F.cross_entropy(model(x_train), y_train), optimizer, scaler, "cpu", dtype)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def table(results):
    """The seed's table: one row per run; speed-up and memory against the float32 run of the same
    library."""
    def cell(value, fmt, empty="—"):
        return empty if value is None else fmt.format(value)

    warm_up = any("warmup_peak_bytes" in r for r in results)  # the synthetic runs: peaks of both phases
    lines = ["| run | step time ms | vs fp32 | peak memory MB | vs fp32 | "
             + ("warm-up peak MB | " if warm_up else "") + "accuracy | skipped steps | final scale |",
             "| --- | --- | --- | --- | --- | " + ("--- | " if warm_up else "") + "--- | --- | --- |"]
    for r in results:
        base = next(b for b in results if b.get("library") == r.get("library"))
        memory = r["peak_bytes"] / base["peak_bytes"] if r["peak_bytes"] and base["peak_bytes"] else None
        warm = r.get("warmup_peak_bytes")
        lines.append(f"| {r['name']} | {r['step_ms']:.3f} | {base['step_ms'] / r['step_ms']:.2f}x | "
                     f"{cell(r['peak_bytes'] and r['peak_bytes'] / 2**20, '{:.2f}')} | {cell(memory, '{:.2f}x')} | "
                     + (f"{cell(warm and warm / 2**20, '{:.2f}')} | " if warm_up else "")
                     + f"{cell(r['accuracy'] and 100 * r['accuracy'], '{:.2f} %')} | {cell(r['skipped'], '{}')} | "
                     f"{cell(r['scale'], '{:g}')} |")
    return "\n".join(lines)


def notes(results):
    """What the table's numbers mean when something went wrong: a loss that is not finite, steps the
    scaler skipped."""
    lines = []
    for r in results:
        if not math.isfinite(r["final_loss"]):
            lines.append(f"{r['name']}: the final loss is {r['final_loss']}: NaN or inf in the data or the model")
        if r["skipped"]:
            lines.append(f"{r['name']}: the GradScaler skipped {r['skipped']} step(s) whose gradients held inf or NaN")
    return lines


def device_index(device):
    """-1 for the CPU, else the CUDA ordinal; "auto" is the first GPU if there is one."""
    if device == "auto":
        return 0 if ampc.cuda.is_available() else -1
    return _device_index(device)


def train_synthetic(kind, recipe, index, batch_size, steps=9, warmup=3, image_size=224, seq_len=1024,
                    channels_last=False):
    """Time ampc's training step of kind (resnet50: SGD momentum 0.9; gpt2: AdamW) under recipe on
    device index: a dict of the median step time and peak GPU memory, skipped steps, scale."""
    name, dtype, scaled = recipe
    ampc.manual_seed(0)
    model, optimizer = synthetic_model(kind, index, seq_len, channels_last)
    device_type = "cpu" if index < 0 else "cuda"
    scaler = ampc.GradScaler(device_type, enabled=scaled)
    x, y = synthetic_batch(kind, batch_size, index, image_size, seq_len, channels_last=channels_last)
    if index >= 0:
        ampc.cuda.reset_peak_memory_stats(index)
    times, losses, warmup_peak = [], [], None
    bar = Progress(name, warmup + steps)
    for step in range(warmup + steps):
        synchronize(index)
        if step == warmup and index >= 0:  # the timed steps' peak apart from the warm-up's
            warmup_peak = ampc.cuda.max_memory_allocated(index)
            ampc.cuda.reset_peak_memory_stats(index)
        began = time.perf_counter()
        loss = training_step(lambda: synthetic_loss(kind, model, x, y), optimizer, scaler, device_type, dtype)
        synchronize(index)
        if step >= warmup:
            times.append(time.perf_counter() - began)
        losses.append(float(loss))
        bar.show(step + 1, losses[-1])
    stats = scaler.stats()
    return {"name": name, "library": "ampc", "step_ms": 1e3 * float(np.median(times)),
            "peak_bytes": ampc.cuda.max_memory_allocated(index) if index >= 0 else None,
            "warmup_peak_bytes": warmup_peak, "accuracy": None, "skipped": stats["skipped_steps"] if scaled else 0,
            "scale": stats["scale"] if scaled else None, "final_loss": losses[-1], "losses": losses,
            "scales": [stats["scale"] if scaled else 1.0] * len(losses)}


def run(args):
    index = device_index(args.device)
    if args.model != "mlp":
        return run_synthetic(args, index)
    data = digits_split(args.seed)
    where = "the CPU" if index < 0 else ampc.cuda.get_device_name(index)
    print(f"ampc {ampc.__version__} demo: an MLP (64-256-256-10) on {len(data[0])} handwritten digits, tested on "
          f"{len(data[2])}; AdamW, batch {args.batch_size or 64}, {args.epochs} epochs, on {where}")
    results = []
    for recipe in RECIPES:
        result = train(recipe, data, args.epochs, args.batch_size or 64, seed=args.seed, index=index,
                       nan_at=args.nan_at)
        if index < 0:
            result["peak_bytes"] = peak_memory(recipe, data, batch_size=args.batch_size or 64)
        results.append(result)
    if args.compare_torch:
        for recipe in RECIPES:
            row = train_torch_mlp(recipe, data, args.epochs, args.batch_size or 64, seed=args.seed, index=index,
                                  nan_at=args.nan_at)
            if row is None:
                break
            results.append(row)
    print(table(results))
    for line in notes(results):
        print(line)
    if args.plot:
        save_training_plot(args.plot, results)
        print(f"loss and loss scale against the step: {args.plot}")
    return 0


def run_synthetic(args, index):
    kind = args.model
    batch = args.batch_size or (256 if kind == "resnet50" else 8)
    where = "the CPU" if index < 0 else ampc.cuda.get_device_name(index)
    what = (f"ResNet-50, batch {batch}, random {args.image_size}x{args.image_size} images"
            f"{' (channels-last)' if args.channels_last else ''}, SGD momentum 0.9" if kind == "resnet50" else
            f"GPT-2 small (124M), batch {batch} x {args.seq_len} random tokens, AdamW")
    print(f"ampc {ampc.__version__} demo: {what}, on {where}; one training step, median of {args.steps} after "
          f"{args.warmup} warm-up steps")
    if kind == "gpt2" and index >= 0:
        fused = _attention.FUSED and ampc.cuda.get_device_capability(index) >= (8, 0)
        print("attention: " + ("ampc's fused kernels in AMP (16-bit heads of 64), composed in float32" if fused
                               else "composed from products and a softmax"
                               + (" (AMPC_FUSED_ATTENTION=0)" if not _attention.FUSED else "")))
    if index >= 0:
        # ampc's first steps time each convolution's algorithms in a workspace of up to 4 GiB, taken
        # only where free (less when memory is short): that transient is the warm-up's, not the run's
        print("peak memory: over the timed steps; warm-up peak: over the warm-up steps, where ampc times "
              "each convolution's algorithms in the memory that is free")
    results = []
    for recipe in RECIPES:
        results.append(train_synthetic(kind, recipe, index, batch, args.steps, args.warmup, args.image_size,
                                       args.seq_len, args.channels_last))
        gc.collect()
    if args.compare_torch:
        for recipe in RECIPES:
            row = train_torch(kind, recipe, index, batch, args.steps, args.warmup, args.image_size, args.seq_len,
                              args.channels_last)
            if row is None:
                break
            results.append(row)
            gc.collect()
    print(table(results))
    for line in notes(results):
        print(line)
    return 0
