"""Training end to end on the CPU: ampc.nn's modules, the demo's recipes on the digits data
(AMP reaching float32's accuracy, the GradScaler skipping an overflowed step), state dicts with
torch's keys and texts, and `python -m ampc demo` itself."""

import importlib.util
import sys

import ml_dtypes
import numpy as np
import pytest

import ampc
from ampc import nn
from ampc.cli import demo, demo_torch, workloads
from ampc.cli.main import main

F = nn.functional


@pytest.fixture(scope="module")
def digits():
    return workloads.digits_split(0)


@pytest.fixture(scope="module")
def fp32_run(digits):
    return demo.train(workloads.RECIPES[0], digits, epochs=8, progress=False)


def test_bf16_reaches_the_fp32_accuracy(digits, fp32_run):
    bf16 = demo.train(workloads.RECIPES[1], digits, epochs=8, progress=False)
    assert fp32_run["accuracy"] > 0.95
    assert abs(bf16["accuracy"] - fp32_run["accuracy"]) <= 0.01
    assert bf16["skipped"] == 0 and bf16["losses"] != fp32_run["losses"]  # it did run in bfloat16


def test_fp16_with_the_scaler_skips_an_overflowed_step(digits, fp32_run):
    fp16 = demo.train(workloads.RECIPES[2], digits, epochs=8, inject_inf_at=3, progress=False)
    assert fp16["skipped"] == 1
    assert fp16["scales"][2] == 65536.0 and fp16["scales"][3] == 32768.0  # backed off at the injected step
    assert fp16["scale"] == 32768.0  # 184 steps: no growth interval (2000) completed since
    assert abs(fp16["accuracy"] - fp32_run["accuracy"]) <= 0.01


def test_the_demo_command(capsys):
    assert main(["demo", "--epochs", "1"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "---" not in line]
    assert [row.split("|")[1].strip() for row in rows] == ["run", "fp32", "AMP bf16", "AMP fp16"]


@pytest.mark.parametrize("args, message", [
    (["--epochs", "0"], "argument --epochs: must be at least 1, got 0"),  # was an IndexError after training
    (["--batch-size", "0"], "argument --batch-size: must be at least 1, got 0"),  # was the default, in silence
    (["--nan-at", "-1"], "argument --nan-at: must be at least 0, got -1"),  # was never injected, in silence
    (["--model", "gpt2", "--seq-len", "0"], "argument --seq-len: must be at least 1"),
    (["--model", "gpt2", "--steps", "0"], "argument --steps: must be at least 1"),
    (["--epochs", "two"], "argument --epochs: expected an integer, got 'two'"),
    (["--device", "gpu"], "--device: Expected one of cpu, cuda device type"),
    (["--device", "cuda:99"], "--device cuda:99: this process sees"),
    (["--plot", "/nonexistent-folder/runs.png"], "is not a folder this process can write to"),  # was after training
], ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_the_demo_refuses_bad_arguments_before_training(capsys, args, message):
    with pytest.raises(SystemExit) as exit_:
        main(["demo", *args])
    assert exit_.value.code == 2
    captured = capsys.readouterr()
    assert message in captured.err and captured.out == ""


def test_the_demo_with_a_nan_in_the_data_says_what_each_run_did(capsys):
    """--nan-at: one batch holds a NaN in every run; the scaled fp16 run skips that step and goes on
    learning, the unscaled runs' weights turn NaN (their predictions: all class 0), and the notes
    under the table say which is which."""
    assert main(["demo", "--epochs", "2", "--nan-at", "30"]) == 0
    out = capsys.readouterr().out
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in out.splitlines() if line.startswith("| ") and "---" not in line}
    digits_of_class_0 = np.mean(workloads.digits_split(0)[3] == 0)
    for name in ("fp32", "AMP bf16"):
        assert float(rows[name][4].rstrip(" %")) == pytest.approx(100 * digits_of_class_0, abs=0.01)
        assert f"{name}: the final loss is nan" in out
    assert rows["AMP fp16"][5:] == ["1", "32768"] and float(rows["AMP fp16"][4].rstrip(" %")) > 80
    assert "AMP fp16: the GradScaler skipped 1 step(s) whose gradients held inf or NaN" in out


def test_the_demo_without_torch_says_so_and_keeps_its_own_rows(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    assert main(["demo", "--epochs", "1", "--compare-torch"]) == 0
    out = capsys.readouterr().out
    assert "--compare-torch: torch is not installed" in out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "---" not in line]
    assert [row.split("|")[1].strip() for row in rows] == ["run", "fp32", "AMP bf16", "AMP fp16"]


def test_torch_has_no_resnet50_without_torchvision(monkeypatch):
    """What keeps --compare-torch's ResNet-50 rows out, single-process and distributed alike: a note,
    not a crash, where torchvision is missing; GPT-2 needs torch alone."""
    assert demo_torch.no_torch_model("gpt2") is None
    find_spec = importlib.util.find_spec

    def without_torchvision(name, package=None):
        return None if name == "torchvision" else find_spec(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", without_torchvision)
    note = "--compare-torch: torchvision is not installed: no torch rows for ResNet-50"
    assert demo_torch.no_torch_model("resnet50") == note
    assert demo_torch.torch_model(None, "resnet50", None) is None  # torch itself is never touched


def model():
    ampc.manual_seed(1)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 2))


def test_state_dict_names_and_order_are_torch_s():
    m = model()
    assert list(m.state_dict()) == ["0.weight", "1.weight", "1.bias", "1.running_mean", "1.running_var",
                                    "1.num_batches_tracked", "5.weight", "5.bias"]
    assert [n for n, _ in m.named_parameters()] == ["0.weight", "1.weight", "1.bias", "5.weight", "5.bias"]
    assert sum(p.data.size for p in m.parameters()) == 4 * 3 * 9 + 4 + 4 + 2 * 4 + 2


def test_load_state_dict_round_trip_and_errors():
    a, b = model(), model()
    for p in a.parameters():
        p.data[...] = np.random.default_rng(0).standard_normal(p.data.shape)
    b.load_state_dict(a.state_dict())
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        np.testing.assert_array_equal(x, y, err_msg=name)
    before = {k: np.array(v, copy=True) for k, v in b.state_dict().items()}
    bad = dict(a.state_dict())
    del bad["5.bias"]
    bad["extra"] = np.zeros(1)
    bad["0.weight"] = np.zeros((4, 3, 1, 1), np.float32)
    with pytest.raises(RuntimeError) as error:
        b.load_state_dict(bad)
    text = str(error.value)
    assert text.startswith("Error(s) in loading state_dict for Sequential:")
    assert 'Unexpected key(s) in state_dict: "extra".' in text and 'Missing key(s) in state_dict: "5.bias".' in text
    assert ("size mismatch for 0.weight: copying a param with shape (4, 3, 1, 1) from checkpoint, the shape in "
            "current model is (4, 3, 3, 3).") in text
    for k, v in b.state_dict().items():  # nothing changed
        np.testing.assert_array_equal(v, before[k], err_msg=k)
    result = b.load_state_dict({k: v for k, v in a.state_dict().items() if k != "5.bias"}, strict=False)
    assert result.missing_keys == ["5.bias"] and result.unexpected_keys == []


def test_load_state_dict_takes_parameters():
    """state_dict(keep_vars=True) holds the Parameters themselves, as torch's: loading it copies their
    arrays (a Parameter was refused as no array)."""
    a, b = model(), model()
    for p in a.parameters():
        p.data[...] = np.random.default_rng(1).standard_normal(p.data.shape)
    b.load_state_dict(a.state_dict(keep_vars=True))
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        np.testing.assert_array_equal(x, y, err_msg=name)
        assert not np.shares_memory(x, y), name


def test_load_state_dict_refuses_values_that_are_not_numbers_before_writing_any():
    """A None or a string array after valid keys: the error names the key (torch's text) and nothing
    is half-loaded (the fuzz target found 0.bias written before num_batches_tracked's None failed).
    NaN into the integer counter converts without a warning, as torch's copy_."""
    a, b = model(), model()
    for p in a.parameters():
        p.data[...] = np.random.default_rng(1).standard_normal(p.data.shape)
    before = {k: np.array(v, copy=True) for k, v in b.state_dict().items()}
    for key, value in (("1.num_batches_tracked", None), ("5.bias", np.array(["a", "b"]))):
        bad = dict(a.state_dict())
        bad[key] = value
        with pytest.raises(RuntimeError, match=f'While copying the parameter named "{key}", expected torch.Tensor '
                                               "or Tensor-like object from checkpoint but received"):
            b.load_state_dict(bad)
        for k, v in b.state_dict().items():
            np.testing.assert_array_equal(v, before[k], err_msg=k)
    b.load_state_dict({**a.state_dict(), "1.num_batches_tracked": np.array(np.nan)})
    np.testing.assert_array_equal(b.state_dict()["0.weight"], a.state_dict()["0.weight"])


def test_train_eval_and_batch_norm_statistics():
    m = model()
    x = np.random.default_rng(2).standard_normal((5, 3, 4, 4)).astype(np.float32)
    m(x)
    bn = m[1]
    assert int(bn.num_batches_tracked) == 1 and "num_batches_tracked" in bn._buffers
    assert not np.array_equal(bn.running_mean, np.zeros(4, np.float32))
    m.eval()
    assert not any(module.training for module in m.modules())
    stats = bn.running_mean.copy()
    with ampc.no_grad():
        y = m(x)
    np.testing.assert_array_equal(bn.running_mean, stats)
    assert isinstance(y, np.ndarray) and y.shape == (5, 2)
    m.train()
    assert all(module.training for module in m.modules())


def test_default_initialisations():
    ampc.manual_seed(3)
    layer = nn.Linear(400, 300)
    bound = 1 / np.sqrt(400)
    assert layer.weight.data.dtype == np.float32 and np.abs(layer.weight.data).max() <= bound
    assert np.abs(layer.weight.data).max() > 0.95 * bound  # uniform over the whole range
    assert abs(layer.weight.data.std() - bound / np.sqrt(3)) < 0.01 * bound
    conv = nn.Conv2d(8, 16, 3, groups=2)
    assert conv.weight.data.shape == (16, 4, 3, 3) and np.abs(conv.weight.data).max() <= 1 / np.sqrt(36)
    emb = nn.Embedding(1000, 64, padding_idx=0)
    assert abs(emb.weight.data[1:].std() - 1) < 0.02 and not emb.weight.data[0].any()
    ampc.manual_seed(3)
    np.testing.assert_array_equal(nn.Linear(400, 300).weight.data, layer.weight.data)  # seeded: repeats


def test_model_gradients_match_finite_differences():
    """A small CNN with batch norm: backward() against float64 central differences."""
    ampc.manual_seed(4)
    m = nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), nn.BatchNorm2d(3), nn.GELU(), nn.MaxPool2d(2), nn.Flatten(),
                      nn.Linear(12, 3))
    for p in m.parameters():
        p.data = p.data.astype(np.float64)
    for name in ("running_mean", "running_var"):
        m[1]._buffers[name] = m[1]._buffers[name].astype(np.float64)
    rng = np.random.default_rng(5)
    x, y = rng.standard_normal((3, 2, 4, 4)), np.array([0, 2, 1])
    loss_fn = nn.CrossEntropyLoss()

    def loss():
        return loss_fn(m(x), y)

    loss().backward()
    for name, p in m.named_parameters():
        expected = np.zeros_like(p.data)
        for i in np.ndindex(p.data.shape):
            old = p.data[i]
            p.data[i] = old + 1e-6
            up = float(loss())
            p.data[i] = old - 1e-6
            down = float(loss())
            p.data[i] = old
            expected[i] = (up - down) / 2e-6
        np.testing.assert_allclose(p.grad, expected, rtol=1e-5, atol=1e-8, err_msg=name)


def test_wrong_label_dtype_is_a_clear_error(digits):
    m = workloads.mlp()
    with pytest.raises(TypeError, match="target of shape .4,. has a floating dtype .float64.: class indices must"):
        F.cross_entropy(m(digits[0][:4]), digits[1][:4].astype(np.float64))


def _gpt_losses(to_ampc_arrays, steps=3):
    ampc.manual_seed(0)
    m = ampc.models.gpt(vocab_size=50, block_size=8, n_layer=1, n_head=2, n_embd=16)
    if to_ampc_arrays:  # what Module.to("cuda") makes on a GPU: ampc arrays, here on the CPU
        for p in m.parameters():
            p.data = ampc.from_dlpack(p.data.copy())
    opt = ampc.optim.AdamW(list(m.parameters()), lr=1e-2)
    rng = np.random.default_rng(0)
    losses = []
    for _ in range(steps):
        idx, targets = rng.integers(0, 50, (2, 8)), rng.integers(0, 50, (2, 8))
        if to_ampc_arrays:
            idx, targets = ampc.from_dlpack(idx), ampc.from_dlpack(targets)
        opt.zero_grad()
        with ampc.autocast("cpu"):
            logits, loss = m(idx, targets)
        loss.backward()
        opt.step()
        losses.append(float(np.asarray(loss.data)))
    return losses, logits.data


def test_ampc_arrays_train_as_numpy_arrays_do():
    """Parameters held as ampc arrays (reshape, transpose and split as views, cat as copies, in
    ampc/_array_namespace.py) train to the same bits as NumPy parameters."""
    theirs, _ = _gpt_losses(False)
    ours, logits = _gpt_losses(True)
    assert ours == theirs and isinstance(logits, ampc.Array)


def test_ampc_array_glue():
    from ampc import _array_namespace as lib

    base = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    a = ampc.from_dlpack(base.copy())
    t = lib.swapaxes(a, 0, 2)
    np.testing.assert_array_equal(np.asarray(t), base.swapaxes(0, 2))
    np.testing.assert_array_equal(np.asarray(lib.reshape(t, (-1, 6))), base.swapaxes(0, 2).reshape(-1, 6))  # a copy
    np.testing.assert_array_equal(np.asarray(lib.take_slice(a, 1, 1, 3)), base[:, 1:3])
    np.testing.assert_array_equal(np.asarray(lib.concatenate([a, a], 2)), np.concatenate([base, base], 2))
    np.testing.assert_array_equal(np.asarray(F.split(a, 1, dim=1)[2]), base[:, 2:3])
    with pytest.raises(ValueError, match="cannot reshape an array of size 24 into shape"):
        lib.reshape(a, (5, -1))
    with pytest.raises(ValueError, match="outside the array's memory"):
        a._view((25,), (4,), 0)


def test_module_to():
    m = nn.Sequential(nn.Linear(3, 2), nn.BatchNorm2d(2))
    m.to(dtype=ampc.float64)
    assert {p.data.dtype for p in m.parameters()} == {np.dtype(np.float64)}
    assert m[1].running_mean.dtype == np.float64 and m[1].num_batches_tracked.dtype == np.int64
    assert m.to("cpu") is m
    with pytest.raises(ValueError, match="Expected one of cpu, cuda device type at start of device string: tpu"):
        m.to("tpu")
    for bad, error in [(-1, ValueError), (2**31, ValueError), ("cuda:99999999999999999999", ValueError),
                       ("cuda:١", ValueError), (1.0, TypeError), (object(), TypeError)]:
        with pytest.raises(error, match="device"):
            m.to(bad)


def test_module_dtype_methods_go_there_and_back():
    """half(), bfloat16(), float(), double(): every floating parameter and buffer, bfloat16 included
    on the way back (NumPy does not count it as np.floating: to(float32) left it bfloat16); integer
    buffers stay."""
    m = nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2))
    want = m[0].weight.data.copy()
    for method, dtype in [("half", np.float16), ("float", np.float32), ("bfloat16", ml_dtypes.bfloat16),
                          ("float", np.float32), ("double", np.float64)]:
        assert getattr(m, method)() is m
        assert {a.dtype for a in (*(p.data for p in m.parameters()), m[1].running_var)} == {np.dtype(dtype)}
        assert m[1].num_batches_tracked.dtype == np.int64
    assert np.array_equal(m[0].weight.data, want.astype(ml_dtypes.bfloat16).astype(np.float64))


def test_zero_grad_keeping_the_arrays_zeroes_inf_and_nan_too():
    """zero_grad(set_to_none=False) after an overflow: zeros, in the same arrays (it multiplied by 0,
    which left NaN where the overflow had put inf or NaN, and the scaler skipped every step after)."""
    m = nn.Linear(2, 2)
    grads = [np.full(p.data.shape, v, np.float32) for p, v in zip(m.parameters(), (np.inf, np.nan))]
    for p, g in zip(m.parameters(), grads):
        p.grad = g
    m.zero_grad(set_to_none=False)
    assert all(p.grad is g and not g.any() for p, g in zip(m.parameters(), grads))


def test_requires_grad_freezes_parameters():
    m = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    assert m[0].requires_grad_(False) is m[0]
    x = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    F.sum(m(x)).backward()
    assert m[0].weight.grad is None and m[0].bias.grad is None
    assert m[2].weight.grad is not None and np.abs(m[2].weight.grad).sum() > 0
    m.requires_grad_()
    assert all(p.requires_grad for p in m.parameters())


def test_register_parameter_get_submodule_get_parameter():
    """torch's names, paths and texts."""
    m = nn.Sequential(nn.Linear(3, 4), nn.Sequential(nn.ReLU(), nn.Linear(4, 2)))
    assert m.get_submodule("1.1") is m[1][1] and m.get_submodule("") is m
    assert m.get_parameter("1.1.bias") is m[1][1].bias
    for target, text in [("1.x", "Sequential has no attribute `x`"), ("0.weight.z", "`weight` is not an nn.Module")]:
        with pytest.raises(AttributeError, match=text):
            m.get_submodule(target)
    with pytest.raises(AttributeError, match="`in_features` is not an nn.Parameter"):
        m.get_parameter("0.in_features")
    layer = nn.Linear(2, 2)
    layer.register_parameter("bias", None)
    assert list(layer.state_dict()) == ["weight"] and layer.bias is None
    scale = nn.Parameter(np.ones(2, np.float32))
    layer.register_parameter("scale", scale)
    assert [n for n, _ in layer.named_parameters()] == ["weight", "scale"] and layer.scale is scale
    for name, value, error in [("a.b", scale, KeyError), ("", scale, KeyError), (1, scale, TypeError),
                               ("c", np.ones(2), TypeError)]:
        with pytest.raises(error):
            layer.register_parameter(name, value)
    assert [n for n, _ in layer.named_parameters()] == ["weight", "scale"]


def test_layers_refuse_bad_arguments_as_torch_does():
    """Found by constructing every layer with random arguments: a count of groups of 0 divided by zero,
    a loss took a number for its class weights (and load_state_dict then failed reading its .shape),
    a Linear of no inputs divided by zero (torch allows it: its bias bound is 0)."""
    for make, error, text in [(lambda: nn.Conv2d(4, 4, 3, groups=0), ValueError, "groups must be a positive integer"),
                              (lambda: nn.Conv2d(3, 4, 3, groups=2), ValueError, "in_channels must be divisible"),
                              (lambda: nn.Conv1d(4, 3, 3, groups=2), ValueError, "out_channels must be divisible"),
                              (lambda: nn.GroupNorm(0, 4), ValueError, "num_groups must be a positive integer"),
                              (lambda: nn.BCELoss(weight=2), TypeError, "cannot assign 'int' object to buffer"),
                              (lambda: nn.CrossEntropyLoss([1.0, 2.0]), TypeError, "to buffer 'weight'"),
                              (lambda: nn.BCEWithLogitsLoss(pos_weight="x"), TypeError, "to buffer 'pos_weight'"),
                              (lambda: nn.NLLLoss(np.float32(1.5)), TypeError, "'float32' object to buffer"),
                              (lambda: nn.Parameter([1.0, 2.0]), TypeError, "Parameter: data must be an array"),
                              (lambda: ampc.optim.Adam(nn.Linear(2, 2).parameters(), 1e-3, True), TypeError,
                               "betas must be a pair of floats")]:
        with pytest.raises(error, match=text):
            make()
    empty = nn.Linear(0, 3)
    assert empty.weight.data.shape == (3, 0) and not empty.bias.data.any()
    np.testing.assert_array_equal(np.asarray(empty(np.ones((2, 0), np.float32)).data), np.zeros((2, 3)))


def test_layers_name_an_input_that_is_no_array():
    """A list or a string where an array goes: the TypeError naming the argument, as the
    functional ops give (a list given to a layer with learned weights went through the tape, which
    copied it, and came out as an AttributeError)."""
    for layer, op in [(nn.LayerNorm(2), "layer_norm"), (nn.Linear(2, 3), "linear"), (nn.BatchNorm1d(2), "batch_norm"),
                      (nn.Conv2d(1, 1, 1), "conv2d")]:
        for bad in ([[1.0, 2.0]], "x"):
            with pytest.raises(TypeError, match=f"{op}: input must be an array"):
                layer(bad)


def test_module_to_moves_everything_or_nothing(monkeypatch):
    """A move that fails part way (the GPU's memory running out) leaves every array where it was;
    a tied parameter is moved once."""
    from ampc.nn import modules

    m = nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 3))
    m[1].weight = m[0].weight  # tied, (2, 3) and (3, 2) aside: only its identity matters here
    before = {name: p.data for name, p in m.named_parameters()}
    calls, moved = [], modules._moved

    def fails_third(x, *args):
        calls.append(x)
        if len(calls) == 3:
            raise MemoryError("out of memory")
        return moved(x, *args)

    monkeypatch.setattr(modules, "_moved", fails_third)
    with pytest.raises(MemoryError):
        m.to(dtype=ampc.float64)
    assert all(p.data is before[name] for name, p in m.named_parameters())
    calls.clear()
    monkeypatch.setattr(modules, "_moved", lambda x, *args: (calls.append(x), moved(x, *args))[1])
    m.to(dtype=ampc.float64)
    assert len(calls) == 3 and m[1].weight is m[0].weight and m[0].weight.data.dtype == np.float64


def test_the_resnet50_demo_runs_on_the_cpu(capsys):
    """The seed's ResNet-50 table's code path (timed steps on random images), shrunk for the CPU."""
    assert main(["demo", "--model", "resnet50", "--device", "cpu", "--batch-size", "2", "--image-size", "32",
                 "--steps", "1", "--warmup", "0"]) == 0
    out = capsys.readouterr().out
    assert "ResNet-50, batch 2, random 32x32 images" in out
    rows = [line.split("|")[1].strip() for line in out.splitlines() if line.startswith("| ") and "---" not in line]
    assert rows == ["run", "fp32", "AMP bf16", "AMP fp16"]


def test_channels_last_trains_as_contiguous():
    """to(memory_format="channels_last"): NHWC weights and inputs train to the same losses, and each
    weight's gradient comes in its weight's layout (what the fused optimizer step needs)."""
    def losses(channels_last):
        ampc.manual_seed(0)
        m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(8, 4, 1), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3))
        x = np.random.default_rng(0).standard_normal((2, 3, 6, 6)).astype(np.float32)
        if channels_last:
            m.to(memory_format="channels_last")
            x = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
        opt = ampc.optim.SGD(list(m.parameters()), lr=0.1, momentum=0.9)
        out = []
        for _ in range(3):
            opt.zero_grad()
            loss = F.cross_entropy(m(x), np.array([1, 2]))
            loss.backward()
            if channels_last:
                w = m[0].weight
                assert w.data.strides == w.grad.strides == (108, 4, 36, 12)
            opt.step()
            out.append(float(loss))
        return out

    np.testing.assert_allclose(losses(True), losses(False), rtol=1e-5)


def test_nan_data_the_scaler_skips_and_the_demo_says_so(digits):
    """Images holding NaN: the float16 run's scaler skips every step whose batch holds one (the
    parameters stay finite), the float32 run's loss turns NaN, and notes() says both."""
    x_train, y_train, x_test, y_test = (a.copy() for a in digits)
    x_train[::50, 3] = np.nan  # one image in 50: most batches of 64 hold one
    data = (x_train, y_train, x_test, y_test)
    fp32 = demo.train(workloads.RECIPES[0], data, epochs=1, progress=False)
    fp16 = demo.train(workloads.RECIPES[2], data, epochs=1, progress=False)
    order = np.random.default_rng(0).permutation(len(x_train))  # train()'s shuffle for seed 0, epoch 0
    batches_with_nan = sum(np.isnan(x_train[order[i:i + 64]]).any() for i in range(0, len(x_train), 64))
    assert fp16["skipped"] == batches_with_nan > 0
    assert not np.isfinite(fp32["final_loss"])
    lines = demo.notes([fp32, fp16])
    assert any("fp32: the final loss is nan" in line for line in lines)
    assert any(f"AMP fp16: the GradScaler skipped {fp16['skipped']} step(s)" in line for line in lines)


def test_table_shows_the_warm_up_peak_where_the_runs_measured_one():
    """The synthetic runs' rows carry the warm-up's peak beside the timed steps' (ampc tunes its
    convolutions in the warm-up); the MLP's rows have none and keep the seed's columns."""
    row = {"library": "ampc", "accuracy": None, "skipped": 0, "scale": None}
    fp32 = dict(row, name="fp32", step_ms=10.0, peak_bytes=3 * 2**20, warmup_peak_bytes=5 * 2**20)
    fp16 = dict(row, name="AMP fp16", step_ms=4.0, peak_bytes=2**20, warmup_peak_bytes=2 * 2**20, scale=1024.0)
    lines = demo.table([fp32, fp16]).splitlines()
    assert lines[0].split(" | ")[5] == "warm-up peak MB"
    assert lines[3].split(" | ")[1:6] == ["4.000", "2.50x", "1.00", "0.33x", "2.00"]
    assert lines[3].endswith("| 1024 |")
    for r in (fp32, fp16):
        del r["warmup_peak_bytes"]
    plain = demo.table([fp32, fp16]).splitlines()
    assert "warm-up" not in plain[0] and plain[3].split(" | ")[1:6] == ["4.000", "2.50x", "1.00", "0.33x", "—"]


def test_containers_take_modules_only():
    """Sequential(ReLU(), 3) kept the 3 as a plain attribute, out of the model: a silent
    difference from torch, which refuses it. Sequential, its OrderedDict form, ModuleList,
    append() and add_module() refuse it with torch's text; the container is left as it was."""
    from collections import OrderedDict

    for make in (lambda: nn.Sequential(nn.ReLU(), 3), lambda: nn.Sequential(OrderedDict(a=nn.ReLU(), b=None)),
                 lambda: nn.ModuleList([nn.ReLU(), "relu"])):
        with pytest.raises(TypeError, match=r"(int|NoneType|str) is not a Module subclass"):
            make()
    seq = nn.Sequential(nn.ReLU())
    with pytest.raises(TypeError, match="float is not a Module subclass"):
        seq.append(1.5)
    with pytest.raises(TypeError, match="module name should be a string. Got int"):
        seq.add_module(3, nn.ReLU())
    assert len(seq) == 1 and list(seq.state_dict()) == []
    seq.add_module("tail", nn.Linear(2, 2))
    assert len(seq) == 2 and sorted(seq.state_dict()) == ["tail.bias", "tail.weight"]


def test_containers_edit_as_torch_s():
    """Sequential and ModuleList indexed, sliced, assigned, deleted from, inserted into and extended as
    torch's: a Sequential's slice keeps its names (its state dict keys are the model's); the rest
    number their entries 0, 1, 2 ... again (insert, extend and item deletion were missing, and a
    slice was renumbered)."""
    a, b, c, d = nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 3), nn.GELU()
    seq = nn.Sequential(a, b, c, d)
    assert list(seq[2:].state_dict()) == ["2.weight", "2.bias"] and seq[-1] is d and seq[1:3][1] is c
    seq[0] = nn.Identity()
    assert list(seq.state_dict()) == ["2.weight", "2.bias"] and [n for n, _ in seq.named_children()][0] == "0"
    del seq[0]
    assert list(seq.state_dict()) == ["1.weight", "1.bias"] and list(seq) == [b, c, d]
    seq.insert(-1, a)
    assert list(seq) == [b, c, a, d] and list(seq.state_dict()) == ["1.weight", "1.bias", "2.weight", "2.bias"]
    assert seq.pop(1) is c and list(seq) == [b, a, d]
    del seq[1:]
    assert list(seq) == [b]
    lst = nn.ModuleList([a]).extend(x for x in (b, c)).insert(0, d)
    assert list(lst) == [d, a, b, c] and list(lst[1:].state_dict()) == ["0.weight", "0.bias", "2.weight", "2.bias"]
    for bad, error in ((lambda: seq[3], IndexError), (lambda: seq.insert(5, a), IndexError),
                       (lambda: lst.extend(3), TypeError), (lambda: lst.insert(0, 3), TypeError)):
        with pytest.raises(error):
            bad()
    assert list(seq) == [b] and list(lst) == [d, a, b, c]


def test_assigning_an_array_to_a_parameter_s_name_is_refused():
    """m.weight = array took weight out of parameters() (and so out of the optimizer and the state
    dict) in silence; torch refuses it, and a submodule's name takes a module or None only. A
    parameter assigned anew keeps its place in the state dict."""
    m = nn.Linear(3, 2)
    with pytest.raises(TypeError, match="cannot assign 'numpy.ndarray' as parameter 'weight'"):
        m.weight = np.zeros((2, 3), np.float32)
    seq = nn.Sequential(m)
    with pytest.raises(TypeError, match="cannot assign 'int' as child module '0'"):
        setattr(seq, "0", 3)
    assert [n for n, _ in m.named_parameters()] == ["weight", "bias"]
    m.weight = nn.Parameter(np.ones((2, 3), np.float32))
    assert list(m.state_dict()) == ["weight", "bias"] and m.weight.data.sum() == 6
    m.bias = None
    assert m.bias is None and list(m.state_dict()) == ["weight"]


def test_the_remaining_layers_run_their_functional_ops():
    """Each module beyond issue 6's list is its functional op with torch's arguments and defaults."""
    rng = np.random.default_rng(13)
    x4, x3 = rng.standard_normal((2, 4, 6, 6)).astype(np.float32), rng.standard_normal((2, 4, 9)).astype(np.float32)
    ampc.manual_seed(6)
    conv1 = nn.Conv1d(4, 6, 3, stride=2, padding=1, groups=2)
    bound = 1 / np.sqrt(2 * 3)
    assert conv1.weight.shape == (6, 2, 3) and np.abs(conv1.weight.data).max() <= bound
    assert np.abs(conv1.bias.data).max() <= bound
    cases = [
        (conv1, x3, lambda v: F.conv1d(v, conv1.weight.data, conv1.bias.data, 2, 1, 1, 2)),
        (nn.Conv1d(4, 3, 4, padding="same", bias=False), x3, None),
        (nn.GroupNorm(2, 4), x4, lambda v: F.group_norm(v, 2)),
        (nn.AvgPool2d(3, 2, 1, ceil_mode=True, count_include_pad=False), x4,
         lambda v: F.avg_pool2d(v, 3, 2, 1, True, False)),
        (nn.SiLU(), x4, F.silu), (nn.Sigmoid(), x4, F.sigmoid), (nn.Tanh(), x4, F.tanh),
        (nn.Softplus(), x4, F.softplus), (nn.Softplus(2, 0.5), x4, lambda v: F.softplus(v, 2.0, 0.5)),
        (nn.Mish(), x4, F.mish),
        (nn.Softmax(dim=1), x4, lambda v: F.softmax(v, 1)), (nn.LogSoftmax(dim=-1), x4, lambda v: F.log_softmax(v, -1)),
    ]
    for module, x, fn in cases:
        got = module(x)
        if fn is not None:
            np.testing.assert_array_equal(got, fn(x), err_msg=type(module).__name__)
    assert repr(nn.Softplus()) == "Softplus(beta=1.0, threshold=20.0)"  # torch's reprs
    assert repr(nn.Softplus(2, 0.5)) == "Softplus(beta=2, threshold=0.5)"
    assert repr(nn.Mish()) == "Mish()" and repr(nn.Mish(inplace=True)) == "Mish(inplace=True)"
    indices = nn.MaxPool2d(2, return_indices=True)(x4)
    assert isinstance(indices, tuple) and np.array_equal(indices[0], F.max_pool2d(x4, 2))
    with pytest.raises(NotImplementedError, match="padding_mode 'reflect' is not supported"):
        nn.Conv2d(2, 2, 3, padding_mode="reflect")


def test_batch_norm_1d_and_the_cumulative_average():
    """BatchNorm1d takes (N, C) and (N, C, L); momentum=None averages every batch seen equally."""
    rng = np.random.default_rng(14)
    bn = nn.BatchNorm1d(3, momentum=None)
    batches = [rng.standard_normal((8, 3, 5)) * (i + 1) + i for i in range(3)]
    for b in batches:
        bn(b)
    means = [b.mean(axis=(0, 2)) for b in batches]
    np.testing.assert_allclose(bn.running_mean, np.mean(means, axis=0), rtol=1e-5)
    assert int(bn.num_batches_tracked) == 3
    assert bn(rng.standard_normal((4, 3))).shape == (4, 3)
    with pytest.raises(ValueError, match=r"expected 2D or 3D input \(got 4D input\)"):
        bn(rng.standard_normal((2, 3, 4, 4)))


def test_the_remaining_losses_and_their_legacy_arguments():
    rng = np.random.default_rng(15)
    x, t = rng.standard_normal((5, 3)), rng.random((5, 3))
    idx = np.array([0, 2, 1, 1, 0])
    w, pw = rng.random(3) + 0.5, rng.random(3) * 2
    log_p = F.log_softmax(x, 1)
    assert np.array_equal(nn.NLLLoss(w, ignore_index=1)(log_p, idx), F.nll_loss(log_p, idx, w, ignore_index=1))
    assert np.array_equal(nn.L1Loss(reduction="sum")(x, t), F.l1_loss(x, t, reduction="sum"))
    p = 1 / (1 + np.exp(-x))
    assert np.array_equal(nn.BCELoss(w)(p, t), F.binary_cross_entropy(p, t, w))
    assert np.array_equal(nn.BCEWithLogitsLoss(w, pos_weight=pw)(x, t),
                          F.binary_cross_entropy_with_logits(x, t, w, pos_weight=pw))
    assert nn.MSELoss(size_average=False)(x, t).shape == () and nn.MSELoss(reduce=False)(x, t).shape == (5, 3)
    loss = nn.CrossEntropyLoss(w)
    assert list(loss.state_dict()) == ["weight"] and list(nn.CrossEntropyLoss().state_dict()) == []  # a buffer
    assert np.array_equal(loss(x, idx), F.cross_entropy(x, idx, w))


def test_module_dict():
    d = nn.ModuleDict({"a": nn.Linear(2, 3), "b": nn.ReLU()})
    d["c"] = nn.Linear(3, 1)
    assert list(d) == ["a", "b", "c"] and "b" in d and len(d) == 3
    assert sorted(d.state_dict()) == ["a.bias", "a.weight", "c.bias", "c.weight"]
    assert len(list(d.parameters())) == 4 and d.pop("b").__class__ is nn.ReLU and list(d.keys()) == ["a", "c"]
    with pytest.raises(TypeError, match="int is not a Module subclass"):
        d["x"] = 3


@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0, float("inf")])
@pytest.mark.parametrize("max_norm", [0.5, 1e3])
def test_clip_grad_norm_as_torch_s(rng, norm_type, max_norm):
    """ampc.nn.utils.clip_grad_norm_: the total norm over every gradient (float64 reference, float32
    gradients), and each gradient scaled by max_norm / (norm + 1e-6) where that is below 1, as
    torch's; a parameter without a gradient is passed over; a generator of parameters is taken."""
    params = [nn.Parameter(np.zeros(s, np.float32)) for s in ((3, 4), (7,), (2, 1, 5), (2,))]
    for p in params[:3]:
        p.grad = (rng.standard_normal(p.shape) * 3).astype(np.float32)
    grads = [p.grad.astype(np.float64) for p in params[:3]]
    flat = np.concatenate([g.ravel() for g in grads])
    want = np.abs(flat).max() if norm_type == float("inf") else (np.abs(flat) ** norm_type).sum() ** (1 / norm_type)
    norm = nn.utils.clip_grad_norm_((p for p in params), max_norm, norm_type=norm_type)
    assert np.asarray(norm).dtype == np.float32 and float(norm) == pytest.approx(want, rel=1e-6)
    coef = min(1.0, max_norm / (want + 1e-6))
    for p, g in zip(params[:3], grads):
        np.testing.assert_allclose(p.grad, g * coef, rtol=1e-6, atol=0)
    assert params[3].grad is None


def test_clip_grad_norm_non_finite_and_bad_input(rng):
    """A non-finite norm leaves the gradients (a GradScaler skips the step) and, when asked, raises
    torch's RuntimeError; clip_grad_value_ clamps in place, NaN kept; wrong arguments are TypeErrors
    that name the function, nothing written."""
    p = nn.Parameter(np.zeros(3, np.float32))
    p.grad = np.array([np.inf, 1.0, -2.0], np.float32)
    before = p.grad.copy()
    assert float(nn.utils.clip_grad_norm_(p, 1.0)) == np.inf
    np.testing.assert_array_equal(p.grad, before)
    with pytest.raises(RuntimeError, match="is non-finite, so it cannot be clipped"):
        nn.utils.clip_grad_norm_([p], 1.0, error_if_nonfinite=True)
    np.testing.assert_array_equal(p.grad, before)
    assert float(nn.utils.clip_grad_norm_([], 1.0)) == 0.0
    q = nn.Parameter(np.zeros(4, np.float32))
    q.grad = np.array([np.nan, -3.0, 0.25, 4.0], np.float32)
    nn.utils.clip_grad_value_([q], 0.5)
    np.testing.assert_array_equal(q.grad, np.array([np.nan, -0.5, 0.25, 0.5], np.float32))
    integer = nn.Parameter(np.zeros(2, np.int32))
    integer.grad = np.array([5, 6], np.int32)
    for call in (lambda: nn.utils.clip_grad_norm_(3, 1.0), lambda: nn.utils.clip_grad_norm_([p], "1"),
                 lambda: nn.utils.clip_grad_value_([np.zeros(2)], 1.0),
                 lambda: nn.utils.clip_grad_value_([p, integer], 0.5)):  # p is not clamped first
        with pytest.raises(TypeError, match="clip_grad_(norm|value)_:"):
            call()
    np.testing.assert_array_equal(p.grad, before)
    np.testing.assert_array_equal(integer.grad, [5, 6])
