"""python -m ampc demo: what mixed precision buys, measured.

One model is trained three times with the same data, seed and recipe (AdamW, batch 64): in
float32, under ``ampc.autocast`` in bfloat16, and under autocast in float16 with a GradScaler.
The table gives each run's step time, peak memory, final test accuracy, skipped steps and final
loss scale. On the CPU the model is an MLP on the handwritten digits ampc ships (ampc.data).
"""

import math
import sys
import time
import tracemalloc

import numpy as np

import ampc
from ampc import nn
from ampc.data import load_digits

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


def mlp(hidden=256):
    return nn.Sequential(nn.Linear(64, hidden), nn.GELU(), nn.Linear(hidden, hidden), nn.GELU(),
                         nn.Linear(hidden, 10))


class Progress:
    """A one-line progress bar on stderr, redrawn as it fills; off a terminal, one line at the end."""

    def __init__(self, name, total, stream=sys.stderr, width=30):
        self.name, self.total, self.stream, self.width = name, total, stream, width
        self.live = getattr(stream, "isatty", lambda: False)()
        self.drawn = -1

    def show(self, done, loss):
        filled = self.width * done // max(self.total, 1)
        if done != self.total and (not self.live or filled == self.drawn):
            return
        self.drawn = filled
        self.stream.write(f"\r{self.name:9s} [{'#' * filled}{'.' * (self.width - filled)}] {done}/{self.total} "
                          f"loss {loss:.4f}" + ("\n" if done == self.total else ""))
        self.stream.flush()


def train(recipe, data, epochs=20, batch_size=64, lr=2e-3, seed=0, inject_inf_at=None, progress=True):
    """Train a fresh MLP under recipe; a dict of what the demo reports, with the loss and scale at
    every step. inject_inf_at: a step whose gradients are made inf (as an overflow would)."""
    name, dtype, scaled = recipe
    x_train, y_train, x_test, y_test = data
    ampc.manual_seed(seed)
    model = mlp()
    optimizer = ampc.optim.AdamW(list(model.parameters()), lr=lr)
    scaler = ampc.GradScaler("cpu", enabled=scaled)
    steps_per_epoch = math.ceil(len(x_train) / batch_size)
    bar = Progress(name, epochs * steps_per_epoch) if progress else None
    losses, scales, step_times = [], [], []
    for epoch in range(epochs):
        order = np.random.default_rng(seed * 1000 + epoch).permutation(len(x_train))
        for start in range(0, len(x_train), batch_size):
            batch = order[start:start + batch_size]
            began = time.perf_counter()
            optimizer.zero_grad()
            with ampc.autocast("cpu", dtype=dtype or ampc.bfloat16, enabled=dtype is not None):
                loss = F.cross_entropy(model(x_train[batch]), y_train[batch])
            scaler.scale(loss).backward()
            if inject_inf_at == len(losses):
                first = next(iter(model.parameters()))
                first.grad[...] = np.inf
            scaler.step(optimizer)
            scaler.update()
            step_times.append(time.perf_counter() - began)
            losses.append(float(loss))
            scales.append(scaler.get_scale() if scaled else 1.0)
            if bar is not None:
                bar.show(len(losses), losses[-1])
    model.eval()
    with ampc.no_grad():
        predictions = np.asarray(model(x_test)).argmax(axis=1)
    stats = scaler.stats()
    return {
        "name": name,
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
            optimizer.zero_grad()
            with ampc.autocast("cpu", dtype=dtype or ampc.bfloat16, enabled=dtype is not None):
                loss = F.cross_entropy(model(x_train), y_train)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def table(results):
    """The seed's table: one row per run, speed-up and memory against the float32 run."""
    base = results[0]
    lines = ["| run | step time ms | vs fp32 | peak memory MB | vs fp32 | test accuracy | skipped steps | final scale |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        scale = "—" if r["scale"] is None else f"{r['scale']:g}"
        lines.append(f"| {r['name']} | {r['step_ms']:.3f} | {base['step_ms'] / r['step_ms']:.2f}x | "
                     f"{r['peak_bytes'] / 2**20:.2f} | {r['peak_bytes'] / base['peak_bytes']:.2f}x | "
                     f"{100 * r['accuracy']:.2f} % | {r['skipped']} | {scale} |")
    return "\n".join(lines)


def run(args):
    data = digits_split(args.seed)
    print(f"ampc {ampc.__version__} demo: an MLP (64-256-256-10) on {len(data[0])} handwritten digits, tested on "
          f"{len(data[2])}; AdamW, batch {args.batch_size}, {args.epochs} epochs, on the CPU")
    results = []
    for recipe in RECIPES:
        result = train(recipe, data, args.epochs, args.batch_size, seed=args.seed)
        result["peak_bytes"] = peak_memory(recipe, data, batch_size=args.batch_size)
        results.append(result)
    print(table(results))
    for r in results:
        if not math.isfinite(r["final_loss"]):
            print(f"{r['name']}: the loss is {r['final_loss']} (NaN or inf in the data or the model)")
        if r["skipped"]:
            print(f"{r['name']}: the GradScaler skipped {r['skipped']} step(s) whose gradients held inf or NaN")
    if args.plot:
        from ampc._plot import save_training_plot

        save_training_plot(args.plot, results)
        print(f"loss and loss scale against the step: {args.plot}")
    return 0
