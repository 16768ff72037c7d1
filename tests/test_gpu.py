"""ampc on the GPU: casts bit for bit equal to the CPU's, through torch, CuPy and
JAX without copies, ampc's pool and its statistics, streams, and bad input.
Skipped without a GPU; run with --require-gpu on the GPU machine."""

import ml_dtypes
import numpy as np
import pytest

import ampc
from ampc import _reference as ref
from cast_samples import FLOATS, PAIR_IDS, PAIRS, assert_bits_equal, samples

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

TORCH_DTYPES = {
    np.dtype(np.float32): torch.float32,
    np.dtype(np.float16): torch.float16,
    np.dtype(ml_dtypes.bfloat16): torch.bfloat16,
    np.dtype(np.float64): torch.float64,
}
SIGNED = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}
TORCH_SIGNED = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def to_torch(x):
    """A CUDA tensor with x's bits (through a signed view: torch has no uint32/uint64 kernels)."""
    bits = torch.from_numpy(np.ascontiguousarray(x).view(SIGNED[x.itemsize])).cuda()
    return bits.view(TORCH_DTYPES[x.dtype])


def from_torch(t):
    dtype = next(k for k, v in TORCH_DTYPES.items() if v == t.dtype)
    return t.contiguous().view(TORCH_SIGNED[t.element_size()]).cpu().numpy().view(dtype)


def test_device_queries():
    assert ampc.cuda.is_available() and ampc.cuda.device_count() == torch.cuda.device_count()
    assert ampc.cuda.get_device_name() == torch.cuda.get_device_name(0)
    assert ampc.cuda.get_device_capability() == torch.cuda.get_device_capability(0)
    assert ampc.cuda.is_bf16_supported() == (torch.cuda.get_device_capability(0) >= (8, 0))
    p = ampc.cuda.get_device_properties(0)
    assert p.total_memory == torch.cuda.get_device_properties(0).total_memory
    with pytest.raises(ValueError, match="does not exist"):
        ampc.cuda.get_device_properties(ampc.cuda.device_count())


@pytest.mark.parametrize("src,dst", PAIRS, ids=PAIR_IDS)
def test_bits_equal_the_cpu(src, dst, rng):
    x = samples(src, rng, 200_000)
    y = ampc.cast(to_torch(x), dst)
    assert isinstance(y, torch.Tensor) and y.is_cuda and y.dtype == TORCH_DTYPES[np.dtype(dst)]
    assert_bits_equal(from_torch(y), ref.cast(x, dst))


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 15, 17, 33, 1000, 65539, 1 << 20])
@pytest.mark.parametrize("offset", [0, 1, 2, 5])
def test_sizes_and_alignments(n, offset, rng):
    for src, dst in [(FLOATS[0], FLOATS[1]), (FLOATS[0], FLOATS[2]), (FLOATS[1], FLOATS[0]), (FLOATS[3], FLOATS[1])]:
        x = samples(src, rng, n + offset)[: n + offset]
        t = to_torch(x)[offset:]
        assert_bits_equal(from_torch(ampc.cast(t, dst)), ref.cast(x[offset:], dst))


def test_layouts(rng):
    x = (rng.standard_normal((6, 10, 14)) * 100).astype(np.float32)
    t = to_torch(x)
    views = {
        "transposed": (t.permute(2, 0, 1), x.transpose(2, 0, 1)),
        "step": (t[:, ::3, 1::2], x[:, ::3, 1::2]),
        "broadcast": (t[:1].expand(4, 10, 14), np.broadcast_to(x[:1], (4, 10, 14))),
        "0d": (t[1, 2, 3], x[1, 2, 3]),
        "empty": (t[:, :0], x[:, :0]),
    }
    for name, (tv, xv) in views.items():
        for dst in (np.float16, ml_dtypes.bfloat16, np.float64):
            y = ampc.cast(tv, dst)
            assert tuple(y.shape) == xv.shape, name
            assert_bits_equal(from_torch(y), ref.cast(xv.copy(), dst))
    y = ampc.cast(t.permute(2, 0, 1), np.float16)
    assert y.stride() == t.permute(2, 0, 1).stride()  # keeps the input's order: one contiguous pass


@pytest.mark.parametrize("src,dst", PAIRS, ids=PAIR_IDS)
def test_strided_rows_bits_equal_the_cpu(src, dst, rng):
    """A strided copy whose innermost dimension is dense and whole 16-byte vectors long (attention
    heads between (B, H, T, D) and (B, T, H, D)) takes a thread per vector; rows of 12, and rows off a
    16-byte boundary, take the element kernel: the bits of the CPU's cast, NaN and subnormals included,
    every element of the output written and nothing else."""
    for rows, offset in ((16, 0), (64, 0), (12, 0), (16, 1)):
        size = 2 * 3 * 5 * rows
        pool = samples(src, rng, size)  # the special values first, then the rest shuffled in
        x = np.concatenate([pool[:32], rng.permutation(pool[32:])])[:size].reshape(2, 3, 5, rows)
        t = to_torch(np.zeros(size + offset, dtype=src))[offset:]  # a misaligned base where offset > 0
        t.copy_(to_torch(x).reshape(-1))
        heads = t.reshape(2, 3, 5, rows).permute(0, 2, 1, 3)  # (2, 5, 3, rows): the inner rows stay dense
        out = torch.full((2, 5, 3, rows + 16), float("nan"), device="cuda", dtype=TORCH_DTYPES[np.dtype(dst)])
        view = out[..., 8:8 + rows]  # on 16-byte boundaries; the poison either side of each row must survive
        assert ampc.cast(heads, out=view) is view
        assert_bits_equal(from_torch(view), ref.cast(x.transpose(0, 2, 1, 3).copy(), dst))
        assert out[..., :8].isnan().all() and out[..., 8 + rows:].isnan().all()


INTEGERS = [np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]


@pytest.mark.parametrize("src", INTEGERS, ids=lambda t: np.dtype(t).name)
def test_integers_convert_and_copy_as_the_cpu(src, rng):
    """Integer and bool arrays (CuPy has every width) to each floating dtype, bit for bit the CPU's
    conversion (torch's .to()), dense at every alignment (1-byte types take no 16-byte vectors),
    reversed, and as rows of a transposed array; and copies to their own dtype in any layout."""
    cp = pytest.importorskip("cupy")
    if src == np.bool_:
        x = rng.random(4099) < 0.5
    else:
        info = np.iinfo(src)
        x = rng.integers(info.min, info.max, 4099, dtype=src, endpoint=True)
        x[:4] = [0, info.min, info.max, 2049 if info.max > 2049 else 1]
    g = cp.asarray(x)
    for dst in FLOATS:
        for offset in (0, 1, 3):
            assert_bits_equal(cp.asnumpy(ampc.cast(g[offset:], dst)), ampc.cast(x[offset:], dst))
        try:
            backwards = ampc.cast(g[::-1], dst)
        except BufferError as e:  # CuPy 14 exports a stride of -itemsize bytes as (2^64 - itemsize) / itemsize
            assert x.itemsize > 1 and "too large" in str(e), e
        else:
            assert_bits_equal(cp.asnumpy(backwards), ampc.cast(x[::-1], dst))
        rows = g[:4096].reshape(16, 256).T[:, ::2]  # strided, no dense run
        assert_bits_equal(cp.asnumpy(ampc.cast(rows, dst)), ampc.cast(x[:4096].reshape(16, 256).T[:, ::2], dst))
        heads = x[:4096].reshape(4, 8, 128).transpose(1, 0, 2)  # dense rows of 128 between strided ones
        assert_bits_equal(cp.asnumpy(ampc.cast(cp.asarray(x[:4096]).reshape(4, 8, 128).transpose(1, 0, 2), dst)),
                          ampc.cast(heads, dst))
    poison = np.array(7).astype(src)  # True for bool
    poisoned = cp.full((64, 70), poison, dtype=src)
    view = poisoned[:, 3:67]
    # reversed rows where CuPy exports them (1-byte types), else transposed
    source, want = (g[:4096].reshape(64, 64)[:, ::-1], x[:4096].reshape(64, 64)[:, ::-1]) if x.itemsize == 1 else \
        (g[:4096].reshape(64, 64).T, x[:4096].reshape(64, 64).T)
    assert ampc.cast(source, out=view) is view
    np.testing.assert_array_equal(cp.asnumpy(view), want)
    assert (poisoned[:, :3] == poison).all() and (poisoned[:, 67:] == poison).all()


def test_cupy_in_cupy_out(rng):
    cupy = pytest.importorskip("cupy")
    x = rng.standard_normal(1001).astype(np.float32)
    c = cupy.asarray(x)
    # (CuPy 14 exports negative strides wrongly, as 2^62 - 1 for -1, which ampc refuses.)
    y = ampc.cast(c[1::3], "float16")
    assert isinstance(y, cupy.ndarray) and y.dtype == np.float16
    np.testing.assert_array_equal(cupy.asnumpy(y), x[1::3].astype(np.float16))
    out = cupy.zeros(1001, np.float64)
    assert ampc.cast(c, out=out) is out
    np.testing.assert_array_equal(cupy.asnumpy(out), x.astype(np.float64))
    before = ampc.cuda.memory_allocated()
    b = ampc.cast(c, "bfloat16")
    assert ampc.cuda.memory_allocated() == before + 2048  # CuPy kept ampc's buffer: no copy
    assert b.dtype == ampc.bfloat16
    np.testing.assert_array_equal(cupy.asnumpy(b.view(np.uint16)), ref.bits(x.astype(ml_dtypes.bfloat16)))


def test_jax_in_jax_out(rng):
    jax = pytest.importorskip("jax")
    x = rng.standard_normal(513).astype(np.float32)
    j = jax.device_put(x, jax.devices("gpu")[0])
    j.block_until_ready()
    before = ampc.cuda.memory_allocated()
    y = ampc.cast(j, "bfloat16")
    assert ampc.cuda.memory_allocated() == before + 1536  # JAX kept ampc's buffer: no copy
    assert isinstance(y, jax.Array) and y.dtype == ampc.bfloat16
    assert next(iter(y.devices())).platform == "gpu"
    np.testing.assert_array_equal(np.asarray(y).view(np.uint16), ref.bits(x.astype(ml_dtypes.bfloat16)))


def test_results_share_memory_with_ampc_pool(rng):
    torch.cuda.synchronize()
    before = ampc.cuda.memory_allocated()
    x = to_torch(rng.standard_normal(1000).astype(np.float32))
    y = ampc.cast(x, np.float16)
    assert ampc.cuda.memory_allocated() == before + 2048  # 2000 bytes, counted in 512-byte units
    a = ampc.from_dlpack(y)
    assert a.data_ptr() == y.data_ptr() and a.device == "cuda:0" and a.__dlpack_device__() == (2, 0)
    assert torch.from_dlpack(a).data_ptr() == y.data_ptr()
    peak = ampc.cuda.max_memory_allocated()
    assert peak >= before + 2048
    del a, y
    assert ampc.cuda.memory_allocated() == before
    ampc.cuda.reset_peak_memory_stats()
    assert ampc.cuda.max_memory_allocated() == before
    assert ampc.cuda.memory_reserved() >= 2048


def test_unknown_producer_gets_an_ampc_array(rng):
    x = rng.standard_normal(64).astype(np.float32)
    t = to_torch(x)

    class Wrapper:
        def __dlpack_device__(self):
            return t.__dlpack_device__()

        def __dlpack__(self, **kw):
            return t.__dlpack__(**kw)

    y = ampc.cast(Wrapper(), np.float16)
    assert isinstance(y, ampc.Array) and y.device == "cuda:0"
    with pytest.raises(TypeError, match="cuda:0"):
        np.asarray(y)
    np.testing.assert_array_equal(torch.from_dlpack(y).cpu().numpy(), x.astype(np.float16))


def test_out_torch_and_device_mismatch(rng):
    x = rng.standard_normal((8, 9)).astype(np.float32)
    t = to_torch(x)
    out = torch.full((8, 9), float("nan"), dtype=torch.bfloat16, device="cuda")
    assert ampc.cast(t, out=out) is out
    assert_bits_equal(from_torch(out), ref.cast(x, ml_dtypes.bfloat16))
    host = np.zeros((8, 9), np.float16)
    with pytest.raises(ValueError, match="x is on cuda:0 but out is on cpu"):
        ampc.cast(t, out=host)
    assert (host == 0).all()
    # Read through torch's C exchange API, a tensor that requires grad is read like any
    # other; the result is ampc's, outside torch's graph.
    y = ampc.cast(t.clone().requires_grad_(), np.float16)
    assert not y.requires_grad and torch.equal(y, t.half())


def test_more_than_2_31_elements():
    n = 2**31 + 19
    bits = torch.randint(-(2**15), 2**15, (n,), dtype=torch.int16, device="cuda")
    y = ampc.cast(bits.view(torch.bfloat16), np.float16)
    idx = torch.cat([torch.tensor([0, 2**31 - 1, 2**31, 2**31 + 7, n - 1], device="cuda"),
                     torch.randint(0, n, (100_000,), device="cuda")])
    x = bits[idx].cpu().numpy().view(ml_dtypes.bfloat16)
    assert_bits_equal(from_torch(y[idx]), ref.cast(x, np.float16))
    del y, bits


def test_streams_order_producer_and_consumer():
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        # A long computation on torch's side stream, read by ampc on its default stream
        # and handed back to torch on the side stream: no explicit synchronisation.
        a = torch.ones(1 << 24, device="cuda")
        for _ in range(20):
            a = a * 1.5 - 0.25
        y = ampc.cast(a, np.float16)
        expected = a.to(torch.float16)
        assert torch.equal(y, expected)


def test_ampc_runs_on_the_stream_it_is_given(rng):
    x = to_torch(rng.standard_normal(1 << 16).astype(np.float32))
    for make in (lambda: torch.cuda.Stream(), lambda: pytest.importorskip("cupy").cuda.Stream()):
        s = make()
        handle = getattr(s, "cuda_stream", None) or s.ptr
        with ampc.cuda.stream(s):
            assert ampc.cuda.current_stream().cuda_stream == handle
            assert ampc.cuda.current_stream().device == 0
            before = ampc.cuda.memory_allocated()
            y = ampc.cast(x, np.float16)
        assert ampc.cuda.current_stream().cuda_stream == 0
        del s  # y keeps its stream alive until it is freed on it
        torch.cuda.synchronize()
        np.testing.assert_array_equal(y.cpu().numpy(), x.cpu().numpy().astype(np.float16))
        del y
        assert ampc.cuda.memory_allocated() == before
    with ampc.cuda.stream(torch.cuda.Stream().cuda_stream):  # a raw handle
        assert ampc.cuda.current_stream().device == 0


def test_writing_an_ampc_array_on_another_stream(rng):
    """An ampc.Array's contents are ready on its own stream even when written on another."""
    x = rng.standard_normal(1 << 20).astype(np.float32)
    t = to_torch(x)

    class Wrapper:  # an unknown producer: the results are ampc.Arrays
        def __init__(self, a):
            self.a = a

        def __dlpack_device__(self):
            return self.a.__dlpack_device__()

        def __dlpack__(self, **kw):
            return self.a.__dlpack__(**kw)

    out = ampc.cast(Wrapper(t), np.float16)  # allocated on the default stream
    assert isinstance(out, ampc.Array)
    s = torch.cuda.Stream()
    with ampc.cuda.stream(s):
        ampc.cast(Wrapper(t * 2), out=out)
    got = torch.from_dlpack(out)  # read on torch's default stream, no explicit synchronisation
    assert torch.equal(got, (t * 2).to(torch.float16))


def test_synchronize_and_zero_size():
    y = ampc.cast(torch.empty(0, 5, device="cuda"), np.float16)
    assert isinstance(y, torch.Tensor) and tuple(y.shape) == (0, 5)
    ampc.cuda.synchronize()


@pytest.mark.faults_on_purpose
def test_a_faulted_context_is_an_exception_that_says_so():
    """A kernel that faults (here CuPy's, writing to address 16) leaves the process's CUDA context
    unusable: ampc's next GPU call raises an error saying so, and the process does not crash. In a
    process of its own, since the fault is the whole process's."""
    import subprocess
    import sys

    pytest.importorskip("cupy")
    code = """
import cupy, numpy as np, ampc
fault = cupy.RawKernel(r'extern "C" __global__ void fault() { *(volatile int *)16 = 1; }', "fault")
x = ampc._C._to_device(np.ones(8, np.float32), 0)
fault((1,), (1,), ())
try:
    cupy.cuda.runtime.deviceSynchronize()
except Exception:
    pass
try:
    ampc.cast(x, ampc.float16)
    ampc.cuda.synchronize(0)
except Exception as error:
    print(type(error).__name__, "|", error)
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    kind, message = result.stdout.strip().split(" | ", 1)
    assert kind in ("RuntimeError", "CudaError") and "the CUDA context is unusable" in message, result.stdout
