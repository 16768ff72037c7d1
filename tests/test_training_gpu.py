"""Training on the GPU with ampc alone: Module.to("cuda") moves parameters into ampc's pool (ampc
arrays), the same recipe runs there as on the CPU, and the numbers agree with the CPU's."""

import numpy as np
import pytest

import ampc
from ampc import _C, nn

pytestmark = pytest.mark.gpu

F = nn.functional


def gpt_losses(device, steps=3):
    ampc.manual_seed(0)
    model = ampc.models.gpt(vocab_size=50, block_size=8, n_layer=1, n_head=2, n_embd=16).to(device)
    opt = ampc.optim.AdamW(list(model.parameters()), lr=1e-2)
    rng = np.random.default_rng(0)
    losses = []
    index = -1 if device == "cpu" else 0
    for _ in range(steps):
        idx, targets = (_C._to_device(rng.integers(0, 50, (2, 8)), index) for _ in range(2))
        opt.zero_grad()
        logits, loss = model(idx, targets)
        loss.backward()
        opt.step()
        losses.append(float(np.asarray(_C._to_device(loss.data, -1))))
    return model, losses


def test_module_to_cuda_and_back():
    model, losses = gpt_losses("cuda")
    p = next(iter(model.parameters()))
    assert isinstance(p.data, ampc.Array) and p.data.device == "cuda:0" and p.grad.device == "cuda:0"
    _, cpu_losses = gpt_losses("cpu")
    np.testing.assert_allclose(losses, cpu_losses, rtol=1e-4)
    state = model.to("cpu").state_dict()
    assert all(isinstance(v, np.ndarray) for v in state.values())
    fresh = ampc.models.gpt(vocab_size=50, block_size=8, n_layer=1, n_head=2, n_embd=16).to("cuda")
    fresh.load_state_dict(state)  # host arrays into GPU parameters
    for key, value in fresh.to("cpu").state_dict().items():
        np.testing.assert_array_equal(value, state[key], err_msg=key)


def test_resnet_with_the_scaler_on_the_gpu():
    ampc.manual_seed(1)
    model = ampc.models.ResNet((1, 1, 1, 1), num_classes=10).to("cuda")
    opt = ampc.optim.SGD(list(model.parameters()), lr=0.05, momentum=0.9)
    scaler = ampc.GradScaler("cuda")
    rng = np.random.default_rng(2)
    for _ in range(3):
        x = _C._to_device(rng.standard_normal((4, 3, 32, 32)).astype(np.float32), 0)
        y = _C._to_device(rng.integers(0, 10, 4), 0)
        opt.zero_grad()
        with ampc.autocast("cuda"):
            logits = model(x)
            loss = F.cross_entropy(logits, y)
        assert logits.dtype == ampc.float16 and loss.dtype == np.float32
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    assert np.isfinite(float(np.asarray(_C._to_device(loss.data, -1))))
    assert int(model.bn1.num_batches_tracked) == 3


def test_data_on_another_device_is_a_clear_error():
    model = nn.Linear(4, 2).to("cuda")
    with pytest.raises((ValueError, RuntimeError), match="device"):
        model(np.zeros((3, 4), np.float32))
