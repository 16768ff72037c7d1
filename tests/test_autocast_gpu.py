"""ampc.autocast on CUDA arrays: every op of torch's CUDA lists gets its policy (torch's
test_autocast_torch_fp16 / _bf16 / _fp32 / _need_autocast_promote / _banned and
test_autocast_ignored_types, on the engine itself), with torch and CuPy arrays; the casts equal
the library's own, bit for bit."""

import pytest

import ampc
from autocast_lists import POLICIES
from test_autocast import probe

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

BCE_TEXT = ("torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n"
            "Many models use a sigmoid layer right before the binary cross entropy layer.\n"
            "In this case, combine the two layers using torch.nn.functional.binary_cross_entropy_with_logits\n"
            "or torch.nn.BCEWithLogitsLoss.  binary_cross_entropy_with_logits and BCEWithLogits are\n"
            "safe to autocast.")


def same_bits(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape and a.device == b.device
    assert torch.equal(a.view(torch.int16 if a.element_size() == 2 else torch.int32),
                       b.view(torch.int16 if b.element_size() == 2 else torch.int32))


@pytest.mark.parametrize("name, policy", sorted(POLICIES["cuda"].items()))
@pytest.mark.parametrize("region_dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_every_cuda_op_gets_its_policy(name, policy, region_dtype):
    op = probe(name)
    untouched = [torch.randn(3, device="cuda", dtype=torch.float64), torch.arange(3, device="cuda"),
                 torch.randn(3), 2.5, None]  # float64, integers, a CPU tensor, scalars
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        args = [torch.randn(5, 3, device="cuda").to(dtype), torch.randn(7, device="cuda").to(dtype)]
        target = {"lower_precision_fp": region_dtype, "fp32": torch.float32,
                  "promote": torch.float32 if dtype == torch.float32 else region_dtype if dtype == region_dtype
                  else None}.get(policy, dtype)
        with ampc.autocast("cuda", dtype=region_dtype):
            if policy == "banned":
                with pytest.raises(RuntimeError) as error:
                    op(*args)
                assert str(error.value) == BCE_TEXT
                continue
            if target is None:
                with pytest.raises(RuntimeError, match="Unexpected floating ScalarType in at::autocast::prioritize"):
                    op(*args, *untouched)
                continue
            got, kwargs = op(*args, *untouched)
        for before, after in zip(args, got):
            if before.dtype == target:
                assert after is before
            else:
                same_bits(after, before.to(target))  # torch's control: .to() by hand
        assert all(u is g for u, g in zip(untouched, got[2:]))
        if policy in ("fp32_set_opt_dtype", "fp32_append_dtype"):
            assert kwargs == {"dtype": torch.float32}
            with ampc.autocast("cuda", dtype=region_dtype):
                assert probe(name)(untouched[0])[1] == {}  # float64 first: no dtype added
                assert probe(name)(args[0], dtype=torch.float16)[1] == {"dtype": torch.float16}
        else:
            assert kwargs == {}


def test_integer_dtype_of_an_enabled_cuda_region_is_refused():
    # torch would open it and cast floating tensors to int32; ampc refuses it. Disabled, it is
    # torch's: allowed without a word (issue 50, instance 13).
    with pytest.raises(TypeError, match="autocast: dtype must be a floating dtype, got int32"):
        ampc.autocast("cuda", dtype=torch.int32)
    with ampc.autocast("cuda", dtype=torch.int32, enabled=False):
        assert not ampc.is_autocast_enabled("cuda")
    assert ampc.get_autocast_dtype("cuda") == ampc.float16


def test_cpu_tensors_follow_the_cpu_region():
    mm = probe("mm")
    cpu, gpu = torch.randn(2, 2), torch.randn(2, 2, device="cuda")
    with ampc.autocast("cpu"):
        with ampc.autocast("cuda"):
            got, _ = mm(cpu, cpu)
            assert got[0].dtype == torch.bfloat16 and got[0].device.type == "cpu"
            got, _ = mm(gpu, cpu)  # any CUDA array makes it a CUDA op, as torch's dispatch does
            assert got[0].dtype == torch.float16 and got[1] is cpu


def test_cupy_arrays():
    cupy = pytest.importorskip("cupy")
    x = cupy.random.standard_normal((4, 4), dtype=cupy.float32)
    with ampc.autocast("cuda"):
        (got,), _ = probe("linear")(x)
        assert isinstance(got, cupy.ndarray) and got.dtype == cupy.float16
        assert bool((got == x.astype(cupy.float16)).all())
        _, kwargs = probe("softmax")(x)
        assert kwargs == {"dtype": cupy.dtype(cupy.float32)}  # NumPy's dtype, which CuPy takes


def test_weight_cache_with_torch_parameters_on_the_gpu():
    linear = torch.nn.functional.linear
    op = ampc.AutocastOp(linear, "linear")
    w = ampc.Parameter(torch.randn(8, 8, device="cuda"))
    x = torch.randn(4, 8, device="cuda")
    with ampc.autocast("cuda"):
        first = op(x, w)
        info = ampc._C._autocast_cache_info()
        second = op(x, w)
        assert ampc._C._autocast_cache_info()["cache_hits"] == info["cache_hits"] + 1
        assert torch.equal(first, second)
        w.data.mul_(2)  # an in-place torch op: torch's own version counter says so
        third = op(x, w)
    assert torch.equal(third, linear(x.half(), w.data.half()))
    assert not torch.equal(third, first)


def test_jax_arrays(rng):
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    matmul = ampc.autocast_op(name="matmul")(jnp.matmul)
    x = jax.device_put(rng.standard_normal((16, 16)).astype("float32"), jax.devices("gpu")[0])
    with ampc.autocast("cuda", dtype="bfloat16"):
        out = matmul(x, x)
        _, kwargs = probe("sum")(x)
    assert isinstance(out, jax.Array) and out.dtype == jnp.bfloat16
    xb = x.astype(jnp.bfloat16)
    assert bool((out == jnp.matmul(xb, xb)).all())
    assert kwargs == {"dtype": jnp.dtype("float32")}
