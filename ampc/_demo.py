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
import sys
import time
import tracemalloc

import numpy as np

import ampc
from ampc import nn
from ampc.data import load_digits
from ampc.nn import _attention
from ampc.nn.modules import _device_index

F = nn.functional

# (name, autocast dtype or None, GradScaler enabled)
RECIPES = (("fp32", None, False), ("AMP bf16", ampc.bfloat16, False), ("AMP fp16", ampc.float16, True))


def digits_split(seed=0, test_fraction=0.2):
    """(train images, train labels, test images, test labels): a fixed shuffle of the digits."""
    images, labels = load_digits()
    order = np.random.default_rng(seed).permutation(len(images))
    cut = len(images) - int(round(len(images) * test_fraction))
    train, test = order[:cut], order[cut:]
    return images[train], labels[train], images[test], labels[test]


def mlp(hidden=256, nn=nn):
    """The demo's MLP from nn's layers: ampc.nn's, or torch.nn's for --compare-torch (the same names)."""
    return nn.Sequential(nn.Linear(64, hidden), nn.GELU(), nn.Linear(hidden, hidden), nn.GELU(),
                         nn.Linear(hidden, 10))


class Progress:
    """A one-line progress bar on stderr, redrawn as it fills; off a terminal, one line at the end."""

    def __init__(self, name, total, stream=None, width=30):
        # sys.stderr as it is now, not as it was at import (pytest had closed that capture on the GPU machine)
        stream = sys.stderr if stream is None else stream
        self.name, self.total, self.stream, self.width = name, total, stream, width
        self.live = getattr(stream, "isatty", lambda: False)()
        self.drawn = -1

    def show(self, done, loss):
        filled = self.width * done // max(self.total, 1)
        if done != self.total and (not self.live or filled == self.drawn):
            return
        self.drawn = filled
        self.stream.write(f"\r{self.name:14s} [{'#' * filled}{'.' * (self.width - filled)}] {done}/{self.total} "
                          f"loss {loss:.4f}" + ("\n" if done == self.total else ""))
        self.stream.flush()


def training_step(loss_of, optimizer, scaler, device_type, dtype, before_step=None):
    """One step of the recipe, the loss and what follows it: zero the gradients, loss_of() under
    autocast in dtype (None: autocast off, float32), the scaled backward, then before_step() (an
    injected overflow) and the scaler's step and update. Returns the loss."""
    optimizer.zero_grad()
    with ampc.autocast(device_type, dtype=dtype or ampc.bfloat16, enabled=dtype is not None):
        loss = loss_of()
    scaler.scale(loss).backward()
    if before_step is not None:
        before_step()
    scaler.step(optimizer)
    scaler.update()
    return loss


def batches(x_train, y_train, epochs, batch_size, seed, nan_at=None):
    """The demo's batches as NumPy arrays, ampc's runs and torch's alike: each epoch a fixed shuffle
    of the training set, and a NaN in the batch of step nan_at."""
    step = 0
    for epoch in range(epochs):
        order = np.random.default_rng(seed * 1000 + epoch).permutation(len(x_train))
        for start in range(0, len(x_train), batch_size):
            batch = order[start:start + batch_size]
            x = x_train[batch]  # a fancy-indexed copy: the data set keeps its values
            if step == nan_at:
                x[0, 0] = np.nan
            yield x, y_train[batch]
            step += 1


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
        _synchronize(index)
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


def _synchronize(index):
    if index >= 0:
        ampc.cuda.synchronize(index)


def synthetic_batch(kind, batch_size, index, image_size=224, seq_len=1024, seed=0, channels_last=False):
    """Random inputs and labels for kind on device index: images (NCHW, or NHWC in memory) and
    classes, or tokens."""
    rng = np.random.default_rng(seed)
    if kind == "resnet50":
        inputs = rng.standard_normal((batch_size, image_size, image_size, 3), dtype=np.float32).transpose(0, 3, 1, 2)
        inputs = inputs if channels_last else np.ascontiguousarray(inputs)
        labels = rng.integers(0, 1000, batch_size)
    else:
        inputs, labels = (rng.integers(0, 50257, (batch_size, seq_len)) for _ in range(2))
    return ampc._C._to_device(inputs, index), ampc._C._to_device(labels, index)


def synthetic_model(kind, index, seq_len=1024, channels_last=False):
    """(model, optimizer) of kind on device index, from ampc's current seed: ResNet-50 with SGD
    (momentum 0.9), or GPT-2 small for seq_len tokens with AdamW."""
    model = ampc.models.resnet50() if kind == "resnet50" else ampc.models.gpt(block_size=max(seq_len, 1))
    model.to("cpu" if index < 0 else f"cuda:{index}", memory_format="channels_last" if channels_last else None)
    params = list(model.parameters())
    optimizer = (ampc.optim.SGD(params, lr=0.1, momentum=0.9) if kind == "resnet50"
                 else ampc.optim.AdamW(params, lr=3e-4))
    return model, optimizer


def synthetic_loss(kind, model, x, y):
    """The training loss of kind's model on a synthetic batch."""
    return F.cross_entropy(model(x), y) if kind == "resnet50" else model(x, y)[1]


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
        _synchronize(index)
        if step == warmup and index >= 0:  # the timed steps' peak apart from the warm-up's
            warmup_peak = ampc.cuda.max_memory_allocated(index)
            ampc.cuda.reset_peak_memory_stats(index)
        began = time.perf_counter()
        loss = training_step(lambda: synthetic_loss(kind, model, x, y), optimizer, scaler, device_type, dtype)
        _synchronize(index)
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
        from ampc._demo_torch import train_torch_mlp

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
        from ampc._plot import save_training_plot

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
        from ampc._demo_torch import train_torch

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
