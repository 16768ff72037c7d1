"""ampc.autocast side by side with torch.autocast, where torch is installed: torch's own
functions registered as ampc autocast ops under their torch names, run in an ampc region with
torch's autocast off, must give what torch.autocast gives: the same output dtype and the same
bits (torch's _run_autocast_outofplace compares bitwise too). That checks, op by op, the
policy ampc picks, which arguments it casts and that its casts round as torch's do. On the
CPU (torch's CPU lists) and, on a GPU, with torch's CUDA lists, float16 and bfloat16."""

import pytest

import ampc

torch = pytest.importorskip("torch")
F = torch.nn.functional
NN = torch._C._nn

N = 8


@pytest.fixture(autouse=True)
def deterministic_cudnn():
    """As torch's tests: the same algorithm for both runs, so equal inputs give equal bits."""
    saved = torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    yield
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved


def maker(device, rng):
    def t(*shape, dtype=torch.float32):
        return torch.from_numpy(rng.standard_normal(shape)).to(device=device, dtype=dtype)

    return t


def index(high, *shape, device):
    return torch.randint(high, shape, device=device)


def distinct_rows(*shape, device):
    """An index for a scatter along dim 0 that never sends two values to one place: CUDA's
    scatter_add sums colliding values with atomics, in an order that differs from run to run."""
    return torch.argsort(torch.rand(shape, device=device), dim=0)


def lower_cases(t, device):
    """torch's torch_16 / nn_16 lists (test/test_autocast.py, test/test_cuda.py): fp32 inputs."""
    cases = [
        ("conv1d", torch.conv1d, (t(N, N, 5), t(N, N, 3))),
        ("conv2d", torch.conv2d, (t(N, N, 5, 5), t(N, N, 3, 3))),
        ("conv3d", torch.conv3d, (t(N, N, 5, 5, 5), t(N, N, 3, 3, 3))),
        ("conv_tbc", torch.conv_tbc, (t(10, 7, 3), t(5, 3, 5), t(5), 2)),
        ("conv_transpose1d", torch.conv_transpose1d, (t(N, N, 5), t(N, N, 3))),
        ("conv_transpose2d", torch.conv_transpose2d, (t(N, N, 5, 5), t(N, N, 3, 3))),
        ("conv_transpose3d", torch.conv_transpose3d, (t(N, N, 5, 5, 5), t(N, N, 3, 3, 3))),
        ("prelu", torch.prelu, (t(N, N), t(N))),
        ("addmm", torch.addmm, (t(N, N), t(N, N), t(N, N))),
        ("matmul", torch.matmul, (t(N, N), t(N, N))),
        ("mm", torch.mm, (t(N, N), t(N, N))),
        ("addbmm", torch.addbmm, (t(N, N), t(N, N, N), t(N, N, N))),
        ("baddbmm", torch.baddbmm, (t(N, N, N), t(N, N, N), t(N, N, N))),
        ("bmm", torch.bmm, (t(N, N, N), t(N, N, N))),
        ("linear", F.linear, (t(N, N), t(N, N), t(N))),
        ("__matmul__", torch.Tensor.__matmul__, (t(N, N), t(N, N))),
    ]
    if device == "cuda":
        cases += [
            ("convolution", torch.convolution, (t(N, N, 5, 5), t(N, N, 3, 3), t(N), (1, 1), (0, 0), (1, 1), False,
                                                (0, 0), 1)),
            ("addmv", torch.addmv, (t(N), t(N, N), t(N))),
            ("addr", torch.addr, (t(N, N), t(N), t(N))),
            ("einsum", torch.einsum, ("bkhd,bqhd->bqkh", t(2, 3, 4, 5), t(2, 6, 4, 5))),
            ("mv", torch.mv, (t(N, N), t(N))),
            ("linalg_multi_dot", torch.linalg.multi_dot, ([t(N, N), t(N, N), t(N, N)],)),
            ("lstm_cell", torch.lstm_cell, (t(N, N), (t(N, N), t(N, N)), t(4 * N, N), t(4 * N, N), t(4 * N),
                                            t(4 * N))),
            ("gru_cell", torch.gru_cell, (t(N, N), t(N, N), t(3 * N, N), t(3 * N, N), t(3 * N), t(3 * N))),
            ("rnn_tanh_cell", torch.rnn_tanh_cell, (t(N, N), t(N, N), t(N, N), t(N, N), t(N), t(N))),
            ("rnn_relu_cell", torch.rnn_relu_cell, (t(N, N), t(N, N), t(N, N), t(N, N), t(N), t(N))),
            ("scaled_dot_product_attention", F.scaled_dot_product_attention, (t(2, 4, 8, 16), t(2, 4, 8, 16),
                                                                               t(2, 4, 8, 16))),
        ]
    return cases


def fp32_cases(t, device, low):
    """torch's fp32 lists, fed lower-precision inputs."""
    lo = lambda *s: t(*s, dtype=low)  # noqa: E731
    pos = lambda *s: lo(*s).abs() + 0.25  # noqa: E731
    unit = lambda *s: lo(*s).clamp(-0.9, 0.9)  # noqa: E731
    sign = lambda *s: lo(*s).sign()  # noqa: E731
    cases = [
        ("poisson_nll_loss", torch.poisson_nll_loss, (lo(N, N), pos(N, N), True, False, 1e-8, 1)),
        ("cosine_embedding_loss", torch.cosine_embedding_loss, (lo(N, N), lo(N, N), sign(N))),
        ("hinge_embedding_loss", torch.hinge_embedding_loss, (lo(N, N), sign(N, N))),
        ("margin_ranking_loss", torch.margin_ranking_loss, (lo(N), lo(N), sign(N))),
        ("triplet_margin_loss", torch.triplet_margin_loss, (lo(N, N), lo(N, N), lo(N, N))),
        ("binary_cross_entropy_with_logits", torch.binary_cross_entropy_with_logits,
         (lo(N, N), lo(N, N).sigmoid())),
        ("nll_loss", NN.nll_loss, (lo(N, 10).log_softmax(1), index(10, N, device=device))),
        ("nll_loss2d", NN.nll_loss2d, (lo(N, 10, 4, 4).log_softmax(1), index(10, N, 4, 4, device=device))),
        ("l1_loss", NN.l1_loss, (lo(N, N), lo(N, N))),
        ("smooth_l1_loss", NN.smooth_l1_loss, (lo(N, N), lo(N, N))),
        ("mse_loss", NN.mse_loss, (lo(N, N), lo(N, N))),
        ("multilabel_margin_loss", NN.multilabel_margin_loss, (lo(N, N), index(N, N, N, device=device))),
        ("soft_margin_loss", NN.soft_margin_loss, (lo(N, N), sign(N, N))),
        ("multi_margin_loss", NN.multi_margin_loss, (lo(N, 10), index(10, N, device=device))),
        ("huber_loss", NN.huber_loss, (lo(N, N), lo(N, N))),
        ("kl_div", torch.kl_div, (lo(N, N).log_softmax(1), lo(N, N).softmax(1))),
        ("cdist", torch.cdist, (lo(N, N), lo(N, N))),
    ]
    if device == "cpu":
        cases += [
            ("avg_pool3d", NN.avg_pool3d, (lo(5, 5, 5, 5), (2, 2, 2))),
            ("binary_cross_entropy", NN.binary_cross_entropy, (lo(N, N).sigmoid(), lo(N, N).sigmoid())),
            ("reflection_pad1d", NN.reflection_pad1d, (lo(N, N, N), (2, 2))),
            ("prod", torch.prod, (pos(N),)),
        ]
    else:
        cases += [
            ("acos", torch.acos, (unit(N, N),)), ("asin", torch.asin, (unit(N, N),)),
            ("cosh", torch.cosh, (lo(N, N),)), ("erfinv", torch.erfinv, (unit(N, N),)),
            ("exp", torch.exp, (lo(N, N),)), ("expm1", torch.expm1, (lo(N, N),)),
            ("log", torch.log, (pos(N, N),)), ("log10", torch.log10, (pos(N, N),)),
            ("log2", torch.log2, (pos(N, N),)), ("log1p", torch.log1p, (pos(N, N),)),
            ("reciprocal", torch.reciprocal, (pos(N, N),)), ("rsqrt", torch.rsqrt, (pos(N, N),)),
            ("sinh", torch.sinh, (lo(N, N),)), ("tan", torch.tan, (unit(N, N),)),
            ("pow", torch.pow, (pos(N, N), 1.7)), ("pow", torch.pow, (pos(N, N), pos(N, N))),
            ("__pow__", torch.Tensor.__pow__, (pos(N, N), 1.5)),
            ("softplus", NN.softplus, (lo(N, N),)),
            ("layer_norm", F.layer_norm, (lo(N, N), (N,), lo(N), lo(N))),
            ("group_norm", F.group_norm, (lo(N, N, 4), 2, lo(N), lo(N))),
            ("cosine_similarity", F.cosine_similarity, (lo(N, N), lo(N, N))),
            ("dist", torch.dist, (lo(N, N), lo(N, N))), ("pdist", torch.pdist, (lo(N, N),)),
            ("renorm", torch.renorm, (lo(N, N), 2, 0, 1.0)), ("logsumexp", torch.logsumexp, (lo(N, N), 0)),
            # fp32_set_opt_dtype: ampc passes dtype=torch.float32, torch's wrapper does the same
            ("softmax", torch.softmax, (lo(N, N), 0)), ("log_softmax", torch.log_softmax, (lo(N, N), 0)),
            ("cumsum", torch.cumsum, (lo(N, N), 0)), ("cumprod", torch.cumprod, (pos(N, N), 0)),
            ("sum", torch.sum, (lo(N, N),)), ("prod", torch.prod, (pos(N),)),
            ("linalg_vector_norm", torch.linalg.vector_norm, (lo(N, N),)),
            ("norm", torch.norm, (lo(N, N),)),
        ]
    return cases


def promote_cases(t, device, low):
    lo = lambda *s: t(*s, dtype=low)  # noqa: E731
    if device == "cpu":
        return [("cat", torch.cat, ([t(2, N), lo(3, N)],)), ("stack", torch.stack, ([t(N), lo(N)],)),
                ("cat", torch.cat, ([lo(2, N), lo(3, N)],))]
    return [
        ("addcdiv", torch.addcdiv, (t(N, N), lo(N, N), t(N, N).abs() + 1)),
        ("addcmul", torch.addcmul, (t(N, N), lo(N, N), t(N, N))),
        ("atan2", torch.atan2, (t(N, N), lo(N, N))),
        ("bilinear", F.bilinear, (t(N, N), lo(N, N), t(N, N, N), lo(N))),
        ("cross", torch.cross, (t(N, 3), lo(N, 3), 1)),
        ("dot", torch.dot, (t(N), lo(N))),
        ("vdot", torch.vdot, (lo(N), t(N))),
        ("tensordot", torch.tensordot, (t(N, N), lo(N, N))),
        ("scatter_add", torch.scatter_add, (t(N, N), 0, distinct_rows(N, N, device=device), lo(N, N))),
        ("grid_sampler", torch.grid_sampler, (t(2, 3, 5, 5), lo(2, 4, 4, 2).clamp(-1, 1), 0, 0, False)),
    ]


def outputs(out):
    return list(out) if isinstance(out, (tuple, list)) else [out]


def same(a, b):
    assert a.dtype == b.dtype, (a.dtype, b.dtype)
    assert a.shape == b.shape
    assert torch.equal(a.nan_to_num(), b.nan_to_num()), (a - b).abs().max()


def side_by_side(device, dtype, cases):
    for name, fn, args in cases:
        op = ampc.AutocastOp(fn, name)
        with torch.autocast(device, dtype=dtype):
            expected = outputs(fn(*args))
        with ampc.autocast(device, dtype=dtype):
            assert not torch.is_autocast_enabled(device)
            got = outputs(op(*args))
        for g, e in zip(got, expected, strict=True):
            same(g, e)


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
LOW = {"float16": torch.float16, "bfloat16": torch.bfloat16}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("low", LOW)
def test_lower_precision_lists(rng, device, low):
    side_by_side(device, LOW[low], lower_cases(maker(device, rng), device))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("low", LOW)
def test_fp32_lists(rng, device, low):
    side_by_side(device, LOW[low], fp32_cases(maker(device, rng), device, LOW[low]))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("low", LOW)
def test_need_autocast_promote(rng, device, low):
    side_by_side(device, LOW[low], promote_cases(maker(device, rng), device, LOW[low]))


@pytest.mark.parametrize("device", DEVICES)
def test_expect_builtin_promote(rng, device):
    """add, mul, div, comparisons: not autocast; torch's own promotion decides."""
    t = maker(device, rng)
    a, b = t(N, N), t(N, N, dtype=torch.float16)
    cases = [(name, fn, (a, b)) for name, fn in [("add", torch.add), ("mul", torch.mul), ("div", torch.div),
                                                  ("eq", torch.eq), ("lt", torch.lt)]]
    side_by_side(device, torch.float16 if device == "cuda" else torch.bfloat16, cases)


@pytest.mark.gpu
def test_banned_binary_cross_entropy_on_cuda(rng):
    t = maker("cuda", rng)
    args = (t(N, N).sigmoid(), t(N, N).sigmoid())
    with torch.autocast("cuda"):
        with pytest.raises(RuntimeError) as torch_error:
            NN.binary_cross_entropy(*args)
    op = ampc.AutocastOp(NN.binary_cross_entropy, "binary_cross_entropy")
    with ampc.autocast("cuda"):
        with pytest.raises(RuntimeError) as ampc_error:
            op(*args)
    assert str(ampc_error.value) in str(torch_error.value)
    assert op(*args).dtype == torch.float32  # outside a region it runs


@pytest.mark.gpu
def test_ignored_types_and_other_devices(rng):
    t = maker("cuda", rng)
    mm = ampc.AutocastOp(torch.mm, "mm")
    d, h = t(N, N, dtype=torch.float64), t(N, N, dtype=torch.float16)
    with ampc.autocast("cuda"):
        with pytest.raises(RuntimeError):
            mm(d, h)  # float64 is not cast, so torch's mm refuses the mix, as under torch.autocast
        assert mm(d, d).dtype == torch.float64
        cpu = torch.randn(N, N)
        assert mm(cpu, cpu).dtype == torch.float32  # CPU tensors in a CUDA region pass through
        assert ampc.AutocastOp(torch.sum, "sum")(torch.arange(4, device="cuda")).dtype == torch.int64
    with ampc.autocast("cpu"):
        assert mm(h.float(), h.float()).dtype == torch.float32  # CUDA tensors in a CPU region too


@pytest.mark.gpu
def test_cupy_and_the_cache_on_the_gpu(rng):
    cupy = pytest.importorskip("cupy")
    matmul = ampc.autocast_op(name="matmul")(cupy.matmul)
    x = cupy.asarray(rng.standard_normal((64, 64)), dtype=cupy.float32)
    w = ampc.Parameter(cupy.asarray(rng.standard_normal((64, 64)), dtype=cupy.float32))
    with ampc.autocast("cuda"):
        out = matmul(x, w)
        assert isinstance(out, cupy.ndarray) and out.dtype == cupy.float16
        control = cupy.matmul(x.astype(cupy.float16), w.data.astype(cupy.float16))
        assert bool((out == control).all())
        before = ampc._C._autocast_cache_info()
        matmul(x, w)
        after = ampc._C._autocast_cache_info()
        assert after["cache_hits"] - before["cache_hits"] == 1 and after["casts"] - before["casts"] == 1


@pytest.mark.gpu
def test_autocast_cache_leak_on_the_gpu(rng):
    """torch's test_autocast_cache_leak: repeated forwards under autocast do not allocate more."""
    linear = ampc.AutocastOp(F.linear, "linear")
    weights = [ampc.Parameter(torch.randn(256, 256, device="cuda")) for _ in range(3)]
    x = torch.randn(32, 256, device="cuda")

    def forward():
        with ampc.autocast("cuda"):
            h = x
            for w in weights:
                h = linear(h, w)
            return h

    forward()
    torch.cuda.synchronize()
    baseline = ampc.cuda.memory_allocated()
    for _ in range(4):
        with ampc.autocast("cuda"):
            for _ in range(3):
                h = x
                for w in weights:
                    h = linear(h, w)
            inside = ampc.cuda.memory_allocated()
        del h
        assert ampc.cuda.memory_allocated() == baseline
    # inside the region: each weight's float16 copy, cached (the input's cast is freed after its op)
    assert inside - baseline == 3 * 256 * 256 * 2


@pytest.mark.gpu
def test_custom_fwd_cast_inputs_on_cuda(rng):
    t = maker("cuda", rng)
    seen = {}

    class MyMM:
        @staticmethod
        @ampc.custom_fwd(device_type="cuda", cast_inputs=torch.float32)
        def forward(ctx, a, container):
            b = container[1][0]
            seen["forward"] = (a.dtype, b.dtype, ampc.is_autocast_enabled("cuda"))
            return a.mm(b)

    class Ctx:
        pass

    a, b = t(N, N, dtype=torch.float16), t(N, N, dtype=torch.float16)
    with ampc.autocast("cuda"):
        out = MyMM.forward(Ctx(), a, (0, {0: b}))
    assert seen["forward"] == (torch.float32, torch.float32, False) and out.dtype == torch.float32
    assert torch.equal(out, a.float().mm(b.float()))
    assert MyMM.forward(Ctx(), a, (0, {0: b})).dtype == torch.float16  # outside: nothing cast


def test_parameter_holding_a_torch_tensor_is_cast_to_torch(rng):
    w = ampc.Parameter(torch.randn(4, 4))
    got = ampc.AutocastOp(lambda a: a, "mm")
    with ampc.autocast("cpu"):
        out = got(w)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16
    assert torch.equal(out.view(torch.int16), w.data.to(torch.bfloat16).view(torch.int16))
