"""Mixed-precision training of a small MLP on NumPy arrays: autocast runs the linear layers in float16,
GradScaler keeps float16's small gradients from flushing to zero, AdamW steps in float32.

    python examples/numpy_mlp.py
"""

import numpy as np

import ampc
from ampc import nn
from ampc.data import load_digits


def main(steps: int = 300, seed: int = 0) -> float:
    """Train on 1,500 of the 1,797 digits and return the accuracy on the other 297."""
    ampc.manual_seed(seed)
    rng = np.random.default_rng(seed)
    x, y = load_digits()  # float32 images (1797, 64), int64 labels
    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 10))
    opt = ampc.optim.AdamW(model.parameters(), lr=3e-3)
    scaler = ampc.GradScaler("cpu")
    for step in range(steps):
        batch = rng.integers(0, 1500, 64)
        with ampc.autocast("cpu", dtype=ampc.float16):
            loss = nn.functional.cross_entropy(model(x[batch]), y[batch])
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        if step % 100 == 0:
            print(f"step {step:3d}  loss {loss.item():.3f}  scale {scaler.get_scale():.0f}")
    model.eval()
    with ampc.no_grad():
        predictions = np.argmax(np.asarray(model(x[1500:])), axis=1)
    accuracy = float((predictions == y[1500:]).mean())
    print(f"held-out accuracy {accuracy:.1%}")
    return accuracy


if __name__ == "__main__":
    main()
