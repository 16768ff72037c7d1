"""The demo's torch rows (``--compare-torch``): the same model, data and recipe in torch's AMP, timed
the same way in the same process. torch's float32 runs without TF32, as ampc's always do (torch's
convolutions default to TF32: the anchors' 117.7 ms float32 step is TF32)."""

import importlib.util
import math
import time

import numpy as np

from ampc.cli.progress import Progress
from ampc.cli.workloads import batches, mlp, synthetic_batch


def _torch_gpt(torch, vocab=50257, block=1024, n_layer=12, n_head=12, n_embd=768):
    """nanoGPT's GPT-2 in torch: the layout and initialisation ampc.models.gpt has (torch's default
    initialisation of the tied N(0, 1) embedding starts the loss near 85 instead of ln 50257)."""
    nn, F = torch.nn, torch.nn.functional

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.ln_2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
            self.c_attn, self.c_proj = nn.Linear(n_embd, 3 * n_embd), nn.Linear(n_embd, n_embd)
            self.c_fc, self.mlp_proj = nn.Linear(n_embd, 4 * n_embd), nn.Linear(4 * n_embd, n_embd)

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = self.c_attn(self.ln_1(x)).split(n_embd, dim=2)
            q, k, v = (z.view(b, t, n_head, c // n_head).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c)
            x = x + self.c_proj(y)
            return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(vocab, n_embd), nn.Embedding(block, n_embd)
            self.h = nn.ModuleList([Block() for _ in range(n_layer)])
            self.ln_f = nn.LayerNorm(n_embd)
            self.lm_head = nn.Linear(n_embd, vocab, bias=False)
            self.lm_head.weight = self.wte.weight

        def forward(self, idx, targets):
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
            for block in self.h:
                x = block(x)
            logits = self.lm_head(self.ln_f(x))
            return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))

    model = GPT()
    for name, p in model.named_parameters():  # ampc.models.gpt's initialisation (GPT-2's)
        if name.endswith(("c_proj.weight", "mlp_proj.weight")):
            nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * n_layer))
        elif name.endswith("bias"):
            nn.init.zeros_(p)
        elif p.ndim == 2:
            nn.init.normal_(p, 0.0, 0.02)
    return model


def no_torch_model(kind):
    """Why torch has no model of kind here (ResNet-50 needs torchvision), or None."""
    if kind == "resnet50" and importlib.util.find_spec("torchvision") is None:
        return "--compare-torch: torchvision is not installed: no torch rows for ResNet-50"
    return None


def torch_model(torch, kind, device, seq_len=1024, channels_last=False):
    """(model, optimizer) of kind on device, ampc's synthetic_model in torch (torchvision's ResNet-50, a
    nanoGPT GPT-2), from torch's current seed; None (with no_torch_model's note printed) without
    torchvision."""
    why = no_torch_model(kind)
    if why is not None:
        print(why)
        return None
    if kind == "resnet50":
        import torchvision

        model = torchvision.models.resnet50().to(device)
        if channels_last:
            model = model.to(memory_format=torch.channels_last)
        return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model = _torch_gpt(torch, block=max(seq_len, 1)).to(device)
    return model, torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)


def torch_loss(torch, kind, model, x, y):
    """torch's synthetic_loss."""
    return torch.nn.functional.cross_entropy(model(x), y) if kind == "resnet50" else model(x, y)


def _import_torch():
    try:
        import torch
    except ImportError:
        print("--compare-torch: torch is not installed")
        return None
    return torch


def _torch_dtype(torch, dtype):
    """torch's autocast dtype for an ampc recipe's, or None (autocast off, float32) for None."""
    return None if dtype is None else {"float16": torch.float16, "bfloat16": torch.bfloat16}[np.dtype(dtype).name]


def _autocast(torch, device_type, autocast_dtype):
    """torch.autocast in autocast_dtype (a torch dtype; None: off, float32)."""
    return torch.autocast(device_type, dtype=autocast_dtype or torch.float16, enabled=autocast_dtype is not None)


def torch_training_step(torch, loss_of, optimizer, scaler, device_type, autocast_dtype):
    """One step of torch's AMP, the twin of workloads.training_step: zero the gradients, loss_of() under
    torch.autocast in autocast_dtype (a torch dtype, resolved once by the caller with _torch_dtype, not
    every timed step; None: autocast off, float32), the scaled backward, then the scaler's step and
    update. Returns the loss."""
    optimizer.zero_grad(set_to_none=True)
    with _autocast(torch, device_type, autocast_dtype):
        loss = loss_of()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    return loss


def train_torch_mlp(recipe, data, epochs=20, batch_size=64, lr=2e-3, seed=0, index=-1, nan_at=None):
    """torch's row for the digits MLP (demo.train's model, batches, optimizer and recipe, in torch's
    AMP, timed the same way), or None with a note printed when torch is missing or lacks the
    recipe on this device (CPU autocast in float16 and a CPU GradScaler came in torch 2.3)."""
    torch = _import_torch()
    if torch is None:
        return None
    name, dtype, scaled = recipe
    autocast_dtype = _torch_dtype(torch, dtype)
    x_train, y_train, x_test, y_test = data
    device = torch.device("cpu") if index < 0 else torch.device("cuda", index)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(seed)
    model = mlp(nn=torch.nn).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    try:
        scaler = torch.amp.GradScaler(device.type, enabled=scaled)
        with _autocast(torch, device.type, autocast_dtype):
            model(torch.zeros(1, 64, device=device))
    except (AttributeError, RuntimeError) as e:
        print(f"--compare-torch: torch {torch.__version__} cannot run {name} on {device.type}: {e}")
        return None
    if index >= 0:
        torch.cuda.reset_peak_memory_stats(device)
    bar = Progress("torch " + name, epochs * math.ceil(len(x_train) / batch_size))
    losses, scales, step_times, skipped = [], [], [], 0
    for x, y in batches(x_train, y_train, epochs, batch_size, seed, nan_at):
        x, y = torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)
        scale = scaler.get_scale() if scaled else 1.0  # read outside the timed step: it waits for the GPU
        _synchronize(torch, index)
        began = time.perf_counter()
        loss = torch_training_step(torch, lambda: torch.nn.functional.cross_entropy(model(x), y), optimizer,
                                   scaler, device.type, autocast_dtype)
        _synchronize(torch, index)
        step_times.append(time.perf_counter() - began)
        if scaled and scaler.get_scale() < scale:  # a step with inf or NaN gradients backs the scale off
            skipped += 1
        losses.append(loss.item())
        scales.append(scaler.get_scale() if scaled else 1.0)
        bar.show(len(losses), losses[-1])
    model.eval()
    with torch.no_grad():
        predictions = model(torch.from_numpy(x_test).to(device)).argmax(dim=1).cpu().numpy()
    return {"name": "torch " + name, "library": "torch", "step_ms": 1e3 * float(np.median(step_times)),
            # torch's CPU allocator is not one tracemalloc sees: no CPU peak for torch
            "peak_bytes": torch.cuda.max_memory_allocated(device) if index >= 0 else None,
            "accuracy": float((predictions == y_test).mean()), "skipped": skipped,
            "scale": scaler.get_scale() if scaled else None, "final_loss": losses[-1], "losses": losses,
            "scales": scales}


def _synchronize(torch, index):
    if index >= 0:
        torch.cuda.synchronize(index)


def train_torch(kind, recipe, index, batch_size, steps=9, warmup=3, image_size=224, seq_len=1024,
                channels_last=False):
    """torch's row for recipe, or None (with a note printed) when torch or torchvision is missing or
    there is no GPU."""
    torch = _import_torch()
    if torch is None:
        return None
    if index < 0:
        print("--compare-torch: torch's rows are measured on a GPU only")
        return None
    name, dtype, scaled = recipe
    autocast_dtype = _torch_dtype(torch, dtype)
    device = torch.device("cuda", index)
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(0)
    made = torch_model(torch, kind, device, seq_len, channels_last)
    if made is None:
        return None
    model, optimizer = made
    x, y = (torch.from_dlpack(a) for a in synthetic_batch(kind, batch_size, index, image_size, seq_len,
                                                            channels_last=channels_last))
    scaler = torch.amp.GradScaler("cuda", enabled=scaled)
    torch.cuda.reset_peak_memory_stats(device)
    times, losses, warmup_peak = [], [], None
    bar = Progress("torch " + name, warmup + steps)
    for step in range(warmup + steps):
        torch.cuda.synchronize(device)
        if step == warmup:  # as ampc's rows: the timed steps' peak apart from the warm-up's
            warmup_peak = torch.cuda.max_memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
        began = time.perf_counter()
        loss = torch_training_step(torch, lambda: torch_loss(torch, kind, model, x, y), optimizer, scaler, "cuda",
                                   autocast_dtype)
        torch.cuda.synchronize(device)
        if step >= warmup:
            times.append(time.perf_counter() - began)
        losses.append(loss.item())
        bar.show(step + 1, losses[-1])
    scale = scaler.get_scale() if scaled else None
    row = {"name": "torch " + name, "library": "torch", "step_ms": 1e3 * float(np.median(times)),
           "peak_bytes": torch.cuda.max_memory_allocated(device), "warmup_peak_bytes": warmup_peak,
           "accuracy": None, "skipped": None,
           "scale": scale, "final_loss": losses[-1], "losses": losses, "scales": [scale or 1.0] * len(losses)}
    del model, optimizer, x, y
    torch.cuda.empty_cache()
    return row
