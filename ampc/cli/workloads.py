"""What the demo trains, shared by its runs in ampc (demo, demo_distributed) and in torch
(demo_torch): the recipes, the digits and their batches, the MLP, the synthetic ResNet-50 and GPT-2
workloads, and one AMP training step. Kept apart from demo.py so that demo_torch, which demo
imports, needs nothing of demo."""

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


def mlp(hidden=256, nn=nn):
    """The demo's MLP from nn's layers: ampc.nn's, or torch.nn's for --compare-torch (the same names)."""
    return nn.Sequential(nn.Linear(64, hidden), nn.GELU(), nn.Linear(hidden, hidden), nn.GELU(),
                         nn.Linear(hidden, 10))


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


def synchronize(index):
    """Wait for device index's queued work (-1, the CPU: nothing to wait for), as a timed step must."""
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
