"""ampc.models: torchvision's ResNet-50 layout and a GPT-2-style transformer, built from ampc.nn,
trained a step on the CPU."""

import importlib.util

import numpy as np
import pytest

import ampc
from ampc import models

F = ampc.nn.functional


@pytest.fixture(scope="module")
def resnet():
    ampc.manual_seed(0)
    return models.resnet50()


def test_resnet50_has_torchvision_s_parameters(resnet):
    assert sum(p.data.size for p in resnet.parameters()) == 25_557_032
    state = resnet.state_dict()
    assert len(state) == 320
    shapes = {k: tuple(v.shape) for k, v in state.items()}
    assert shapes["conv1.weight"] == (64, 3, 7, 7)
    assert shapes["layer1.0.downsample.0.weight"] == (256, 64, 1, 1)
    assert shapes["layer2.0.conv2.weight"] == (128, 128, 3, 3)  # v1.5: the stride on the 3x3
    assert shapes["layer4.2.conv3.weight"] == (2048, 512, 1, 1)
    assert shapes["fc.weight"] == (1000, 2048) and shapes["layer3.5.bn3.num_batches_tracked"] == ()
    conv = resnet.layer3[0].conv2.weight.data  # kaiming_normal_(fan_out): std sqrt(2 / (256 * 9))
    assert abs(conv.std() - np.sqrt(2 / (256 * 9))) < 0.02 * np.sqrt(2 / (256 * 9))


@pytest.mark.skipif(importlib.util.find_spec("torchvision") is None, reason="torchvision is not installed")
def test_resnet50_state_dict_keys_and_shapes_equal_torchvision_s(resnet):
    import torchvision

    theirs = torchvision.models.resnet50().state_dict()
    assert [(k, tuple(v.shape)) for k, v in theirs.items()] == \
        [(k, tuple(v.shape)) for k, v in resnet.state_dict().items()]


def test_resnet50_trains_a_step_under_autocast(resnet):
    x = np.random.default_rng(1).standard_normal((2, 3, 64, 64)).astype(np.float32)
    opt = ampc.optim.SGD(list(resnet.parameters()), lr=0.1, momentum=0.9)
    with ampc.autocast("cpu"):
        logits = resnet(x)
        loss = F.cross_entropy(logits, np.array([3, 7]))
    assert logits.dtype == ampc.bfloat16 and logits.shape == (2, 1000) and loss.dtype == np.float32
    loss.backward()
    assert all(p.grad is not None and p.grad.dtype == np.float32 for p in resnet.parameters())
    before = resnet.fc.weight.data.copy()
    opt.step()
    assert not np.array_equal(before, resnet.fc.weight.data)


def test_gpt_tied_weights_loss_and_gradients():
    ampc.manual_seed(2)
    config = dict(vocab_size=97, block_size=16, n_layer=2, n_head=2, n_embd=32)
    model = models.gpt(**config)
    assert model.lm_head.weight is model.wte.weight
    c, v, t, n = config["n_embd"], config["vocab_size"], config["block_size"], config["n_layer"]
    per_block = 2 * 2 * c + (3 * c * c + 3 * c) + (c * c + c) + (4 * c * c + 4 * c) + (4 * c * c + c)
    assert sum(p.data.size for p in model.parameters()) == v * c + t * c + n * per_block + 2 * c
    assert "lm_head.weight" in model.state_dict() and "wte.weight" in model.state_dict()
    rng = np.random.default_rng(3)
    idx, targets = rng.integers(0, v, (2, t)), rng.integers(0, v, (2, t))
    logits, loss = model(idx, targets)
    assert logits.shape == (2, t, v) and abs(float(loss) - np.log(v)) < 0.1  # near uniform at initialisation
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())
    with pytest.raises(ValueError, match="Cannot forward sequence of length 17, block size is only 16"):
        model(np.zeros((1, 17), np.int64))


def test_gpt2_small_has_124m_parameters():
    assert sum(p.data.size for p in models.gpt().parameters()) == 124_439_808
