"""ampc.nn.functional's spatial ops on CUDA tensors (cuDNN convolutions and batch norm, ampc's
pooling kernels): forward and backward against torch's on the same inputs and against float64
references (torch in float64), NCHW and channels-last, torch's autocast dtypes, bad input."""

import re

import pytest

import ampc
from ampc.nn import _spatial

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
from test_ops_gpu import FLOATS, ID, RTOL, autograd, close, randn, seed, strided  # noqa: E402,F401 (seed: the autouse fixture)

TF = torch.nn.functional
F = ampc.nn.functional


@pytest.fixture(autouse=True)
def no_tf32():
    """torch's float32 convolutions default to TF32; ampc's never are. Compare like with like."""
    old = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32 = old


# (N, C, H, W, K, R, S, stride, padding, dilation, groups)
CONVS = [
    (2, 3, 7, 6, 4, 3, 3, (1, 1), (1, 1), (1, 1), 1),
    (3, 4, 9, 8, 6, 3, 2, (2, 1), (1, 0), (1, 2), 2),
    (1, 6, 5, 5, 6, 1, 1, (1, 1), (0, 0), (1, 1), 6),
    (1, 1, 1, 1, 1, 1, 1, (1, 1), (0, 0), (1, 1), 1),
    (4, 64, 28, 28, 64, 3, 3, (1, 1), (1, 1), (1, 1), 1),
    (2, 256, 14, 14, 512, 1, 1, (2, 2), (0, 0), (1, 1), 1),
    (2, 3, 57, 57, 16, 7, 7, (2, 2), (3, 3), (1, 1), 1),
]


def conv_case(case, dtype):
    n, c, h, w, k, r, s, stride, pad, dil, groups = case
    x = randn(n, c, h, w, dtype=dtype)
    wt = randn(k, c // groups, r, s, dtype=dtype, scale=(c // groups * r * s) ** -0.5)
    b = randn(k, dtype=dtype)
    return x, wt, b, dict(stride=stride, padding=pad, dilation=dil, groups=groups)


def conv_rtol(dtype, case):
    """float32 sums of many terms lose more than one rounding; 16-bit outputs are rounded once."""
    terms = case[1] // case[10] * case[5] * case[6]
    return RTOL[dtype] * (1 + terms ** 0.5 / 4) if dtype in (torch.float32, torch.float64) else RTOL[dtype]


@pytest.mark.parametrize("dtype", FLOATS, ids=ID.get)
@pytest.mark.parametrize("case", CONVS, ids=str)
def test_conv2d(case, dtype):
    x, wt, b, kw = conv_case(case, dtype)
    rtol = conv_rtol(dtype, case)
    ref = TF.conv2d(x.double(), wt.double(), b.double(), **kw)
    # cuDNN's sum is rounded to the output's dtype before the bias is added (as in torch): where the
    # bias cancels the sum (the 1x1x1x1 case, one seed in fifty in 16 bits), the first rounding is
    # measured against the sum's size, not the output's
    scale = max(ref.abs().max().item(), TF.conv2d(x.double(), wt.double(), None, **kw).abs().max().item())
    y = F.conv2d(x, wt, b, **kw)
    close(y, ref, dtype, rtol=rtol, scale=scale, what="conv2d vs float64")
    close(y, TF.conv2d(x, wt, b, **kw), dtype, rtol=2 * rtol, scale=scale, what="conv2d vs torch")
    close(F.conv2d(strided(x), wt, b, **kw), ref, dtype, rtol=rtol, scale=scale, what="conv2d strided")
    xl, wl = x.to(memory_format=torch.channels_last), wt.to(memory_format=torch.channels_last)
    yl = F.conv2d(xl, wl, b, **kw)
    close(yl, ref, dtype, rtol=rtol, scale=scale, what="conv2d channels-last")
    if case[1] > 1:
        assert yl.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("dtype", FLOATS, ids=ID.get)
@pytest.mark.parametrize("case", CONVS, ids=str)
def test_conv2d_backward(case, dtype):
    x, wt, b, kw = conv_case(case, dtype)
    rtol = conv_rtol(dtype, case) * (4 if dtype in (torch.float32, torch.float64) else 1)
    dy = randn(*TF.conv2d(x, wt, b, **kw).shape, dtype=dtype)
    egi, egw, egb = autograd(lambda a, w, c: TF.conv2d(a, w, c, **kw), [x, wt, b], dy)
    for layout in (torch.contiguous_format, torch.channels_last):
        xs, ws, dys = (t.contiguous(memory_format=layout) for t in (x, wt, dy))
        gi, gw, gb = F.conv2d_backward(dys, xs, ws, **kw)
        what = f"{'channels-last ' if layout == torch.channels_last else ''}"
        close(gi, egi, dtype, rtol=rtol, what=what + "grad_input")
        close(gw, egw, dtype, rtol=rtol * 4, what=what + "grad_weight")
        close(gb, egb, dtype, what=what + "grad_bias")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=ID.get)
@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last], ids=["nchw", "nhwc"])
def test_conv2d_backward_deterministic(dtype, layout):
    """ampc.backends.cudnn.deterministic: the same gradients to the bit, call after call, where the
    fastest algorithm may sum in any order (filter gradients over many positions), and still
    within the reference's tolerance. The flag is a plan key: False afterwards takes the fastest
    again, with no error."""
    case = (16, 64, 28, 28, 64, 3, 3, (1, 1), (1, 1), (1, 1), 1)
    x, wt, b, kw = conv_case(case, dtype)
    x, wt = x.contiguous(memory_format=layout), wt.contiguous(memory_format=layout)
    dy = randn(*TF.conv2d(x, wt, b, **kw).shape, dtype=dtype).contiguous(memory_format=layout)
    egi, egw, _ = autograd(lambda a, w, c: TF.conv2d(a, w, c, **kw), [x, wt, b], dy)
    rtol = conv_rtol(dtype, case) * (4 if dtype == torch.float32 else 1)
    assert ampc.backends.cudnn.deterministic is False  # torch's default
    ampc.backends.cudnn.deterministic = True
    try:
        first = F.conv2d_backward(dy, x, wt, **kw, bias_grad=False)
        for _ in range(3):
            again = F.conv2d_backward(dy, x, wt, **kw, bias_grad=False)
            assert torch.equal(again[0], first[0]) and torch.equal(again[1], first[1])
    finally:
        ampc.backends.cudnn.deterministic = False
    close(first[0], egi, dtype, rtol=rtol, what="deterministic grad_input")
    close(first[1], egw, dtype, rtol=rtol * 4, what="deterministic grad_weight")
    gi, gw, _ = F.conv2d_backward(dy, x, wt, **kw, bias_grad=False)
    close(gw, egw, dtype, rtol=rtol * 4, what="grad_weight, any algorithm")


@pytest.mark.parametrize("dtype", FLOATS, ids=ID.get)
@pytest.mark.parametrize("case", CONVS, ids=str)
def test_conv2d_untimed(case, dtype):
    """ampc.backends.cudnn.benchmark = False (torch's default): each pass takes the first of cuDNN's
    heuristic ranking, nothing timed; forward and both gradients within the reference's tolerance
    in both layouts (the flag is part of a plan's key: the timed plans of the other tests stay)."""
    x, wt, b, kw = conv_case(case, dtype)
    rtol = conv_rtol(dtype, case) * (4 if dtype in (torch.float32, torch.float64) else 1)
    dy = randn(*TF.conv2d(x, wt, b, **kw).shape, dtype=dtype)
    ref = TF.conv2d(x.double(), wt.double(), b.double(), **kw)
    scale = max(ref.abs().max().item(), TF.conv2d(x.double(), wt.double(), None, **kw).abs().max().item())
    egi, egw, egb = autograd(lambda a, w, c: TF.conv2d(a, w, c, **kw), [x, wt, b], dy)
    before = ampc.backends.cudnn.benchmark  # True, ampc's default (not torch's), unless AMPC_CUDNN_BENCHMARK=0
    ampc.backends.cudnn.benchmark = False
    try:
        for layout in (torch.contiguous_format, torch.channels_last):
            xs, ws, dys = (t.contiguous(memory_format=layout) for t in (x, wt, dy))
            what = f"untimed{' channels-last' if layout == torch.channels_last else ''} "
            close(F.conv2d(xs, ws, b, **kw), ref, dtype, rtol=rtol, scale=scale, what=what + "conv2d")
            gi, gw, gb = F.conv2d_backward(dys, xs, ws, **kw)
            close(gi, egi, dtype, rtol=rtol, what=what + "grad_input")
            close(gw, egw, dtype, rtol=rtol * 4, what=what + "grad_weight")
            close(gb, egb, dtype, what=what + "grad_bias")
    finally:
        ampc.backends.cudnn.benchmark = before


def test_conv1d():
    x, wt, b = randn(2, 6, 33), randn(4, 3, 5), randn(4)
    kw = dict(stride=2, padding=3, dilation=2, groups=2)
    close(F.conv1d(x, wt, b, **kw), TF.conv1d(x.double(), wt.double(), b.double(), **kw), torch.float32,
          rtol=3e-5, what="conv1d")
    dy = randn(*TF.conv1d(x, wt, b, **kw).shape)
    egi, egw, egb = autograd(lambda a, w, c: TF.conv1d(a, w, c, **kw), [x, wt, b], dy)
    gi, gw, gb = F.conv1d_backward(dy, x, wt, **kw)
    close(gi, egi, torch.float32, rtol=3e-5, what="conv1d grad_input")
    close(gw, egw, torch.float32, rtol=3e-5, what="conv1d grad_weight")
    close(gb, egb, torch.float32, what="conv1d grad_bias")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=ID.get)
def test_conv_autocast_dtype(dtype):
    x, wt, b = randn(2, 8, 9, 9), randn(16, 8, 3, 3), randn(16)
    with ampc.autocast("cuda", dtype=dtype):
        y = F.conv2d(x, wt, b, padding=1)
        y1 = F.conv1d(x[:, :, 0], wt[:, :, 0], b, padding=1)
    with torch.autocast("cuda", dtype=dtype):
        ty = TF.conv2d(x, wt, b, padding=1)
        ty1 = TF.conv1d(x[:, :, 0], wt[:, :, 0], b, padding=1)
    assert y.dtype == ty.dtype == dtype and y1.dtype == ty1.dtype == dtype
    close(y, TF.conv2d(x.to(dtype).double(), wt.to(dtype).double(), b.to(dtype).double(), padding=1), dtype,
          what="autocast conv2d")


def test_conv_bad_input():
    x, wt = randn(2, 4, 6, 6), randn(6, 2, 3, 3)
    with pytest.raises(ValueError, match="one device"):
        F.conv2d(x, wt.cpu(), groups=2)
    with pytest.raises(ValueError, match="to have 2 channels"):
        F.conv2d(x, wt)
    with pytest.raises(TypeError, match="same dtype"):
        F.conv2d(x, wt.half(), groups=2)


# AMPC_CONV_DEBUG's three kinds of line, as cuda/conv.c and conv_graph.c format them, for the shape
# of test_conv_debug_lines_reach_python (a float32 image of 5 x 11 x 13, 7 filters of 3 x 3).
_KEY = (r"(forward|data gradient|filter gradient), dtype \d+, 1 x 5 x 11 x 13, 7 filters of 3 x 3, stride 1 x 1, "
        r"padding 1 x 1, dilation 1 x 1, groups 1")
_MS = r"(-?\d+\.\d{4}|-?inf|nan) ms"
CONV_DEBUG_LINES = (
    re.compile(rf"ampc conv legacy: {_KEY}: algo \d+ \S+ {_MS}, \d+ B, math \d+( \(nondeterministic\))?"
               r"(?P<chosen> <- chosen)?"),
    re.compile(rf"ampc conv graph: {_KEY}: config \d+/\d+ engine -?\d+ (timed|skipped)( \(nondeterministic\))? "
               rf"{_MS}( <- chosen)?"),
    re.compile(rf"ampc conv: {_KEY}: the graph API's engine chosen, {_MS}"),
)


def test_conv_debug_lines_reach_python(monkeypatch, capsys):
    """AMPC_CONV_DEBUG=1: each pass's first call of a shape tells its timed algorithms and engines
    and the one chosen, in conv.c's and conv_graph.c's formats, through Python's sys.stderr (which
    capsys sees, and C's own fprintf did not); the plan's next call tells nothing, and without the
    setting a new shape tells nothing either."""
    before = ampc.backends.cudnn.benchmark
    ampc.backends.cudnn.benchmark = True  # timed: AMPC_CUDNN_BENCHMARK=0 would leave nothing to tell
    try:
        monkeypatch.delenv("AMPC_CONV_DEBUG", raising=False)
        F.conv2d(randn(1, 5, 11, 12), randn(7, 5, 3, 3), padding=1)
        assert capsys.readouterr().err == ""
        monkeypatch.setenv("AMPC_CONV_DEBUG", "1")
        x, wt, dy = randn(1, 5, 11, 13), randn(7, 5, 3, 3), randn(1, 7, 11, 13)
        F.conv2d(x, wt, padding=1)
        F.conv2d_backward(dy, x, wt, padding=1, bias_grad=False)
        err = capsys.readouterr().err
        F.conv2d(x, wt, padding=1)
        assert capsys.readouterr().err == ""
    finally:
        ampc.backends.cudnn.benchmark = before
    chosen = {}
    for line in err.splitlines():
        match = next((m for m in (p.fullmatch(line) for p in CONV_DEBUG_LINES) if m), None)
        assert match, line
        graph_chosen = match.re is CONV_DEBUG_LINES[2]
        legacy_chosen = match.re is CONV_DEBUG_LINES[0] and match.group("chosen") is not None
        chosen[match.group(1)] = chosen.get(match.group(1), 0) + (graph_chosen or legacy_chosen)
    assert chosen == {"forward": 1, "data gradient": 1, "filter gradient": 1}, err


# --------------------------------------------------------------------------------------------
# Batch norm
# --------------------------------------------------------------------------------------------

# Training takes ampc's kernels channels-last with channels in whole 16-byte packs (64, 256; 12 in
# float32) and NCHW with planes of 16 elements or more; other shapes take cuDNN.
# NCHW on an sm_90 GPU: a channel short enough is held on chip by a cluster of up to 8 blocks, read
# 4, 2 or (float32 alone) 1 at a time, the cluster taking whole planes at a time: blocks of 256
# threads (BN_SHAPES: one block, 8 x 64 x 14^2; 2 and 3, planes of 511 and 667 elements in float32;
# 5, planes longer than a block's reach, 2 x 3 x 64 x 70; 4, 7 and 8, 256 x 3 x 14^2,
# 1024 x 3 x 8^2, 2000 x 2 x 5 x 6, 64 x 4 x 28^2), or of 512 where those hold too little (float32
# backward of the last four; 1337 x 2 x 7^2 float32 forward, too long to hold backward).
# Longer channels, 16-bit planes of odd length, and every NCHW shape on older GPUs, go by planes
# (BN_LONG on sm_90; BN_SHAPES, too, elsewhere): planes under 512 elements by slabs where channels
# come in whole packs (16, 20, 25, 30, 49, 196, 511 elements: read 4, 2 or 1 at a time; chunks of
# images the last of which is short: 70 of 16, 32 of 49, 3 of 511, 136 of 49, 281 of 196; 12
# channels in float32 only), else a run of images per warp (30, 49 elements: planes off 16-byte
# boundaries, packs across planes; 100 images of 49 make five runs, the last short); longer ones a
# warp per plane (667) or a block (4480).
BN_SHAPES = [(4, 3, 5, 6), (7, 5), (3, 4, 9), (8, 64, 14, 14), (2, 1, 3, 3), (3, 12, 3, 3), (32, 256, 7, 7),
             (100, 3, 7, 7), (70, 8, 4, 4), (9, 12, 4, 5), (5, 16, 5, 5), (6, 16, 5, 6), (3, 8, 7, 73), (3, 5, 23, 29),
             (2, 3, 64, 70), (256, 3, 14, 14), (1024, 3, 8, 8), (1337, 2, 7, 7), (2000, 2, 5, 6), (64, 4, 28, 28)]
BN_LONG = [(2701, 16, 7, 7), (1401, 16, 14, 14), (8800, 3, 5, 6), (200, 3, 23, 29), (50, 3, 64, 70)]


@pytest.mark.parametrize("dtype", FLOATS, ids=ID.get)
@pytest.mark.parametrize("shape", BN_SHAPES + BN_LONG, ids=str)
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
def test_batch_norm(shape, dtype, channels_last):
    if channels_last and len(shape) != 4:
        pytest.skip("channels-last is a 4-D layout")
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    x = (randn(*shape, dtype=torch.float64) * 2 + 0.5).to(dtype)
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    c = shape[1]
    w, b = randn(c, dtype=acc), randn(c, dtype=acc)
    rm, rv = randn(c, dtype=acc), randn(c, dtype=acc).abs() + 0.5
    trm, trv = rm.clone(), rv.clone()
    y = F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.1)
    ty = TF.batch_norm(x, trm, trv, w, b, training=True, momentum=0.1)
    ref = TF.batch_norm(x.double(), None, None, w.double(), b.double(), training=True)
    assert y.dtype == ty.dtype == dtype
    close(y, ref, dtype, rtol=RTOL[dtype] * 4, what="batch_norm training")
    close(rm, trm, acc, rtol=1e-5, what="running_mean as torch's")
    close(rv, trv, acc, rtol=1e-5, what="running_var as torch's")
    ye = F.batch_norm(x, rm, rv, w, b, training=False)
    close(ye, TF.batch_norm(x.double(), rm.double(), rv.double(), w.double(), b.double()), dtype,
          rtol=RTOL[dtype] * 2, what="batch_norm eval")
    dy = randn(*shape, dtype=dtype)
    egi, egw, egb = autograd(lambda a, ww, bb: TF.batch_norm(a, None, None, ww, bb, training=True), [x, w, b], dy)
    gi, gw, gb = F.batch_norm_backward(dy.contiguous(memory_format=torch.channels_last) if channels_last else dy,
                                       x, w, training=True)
    close(gi, egi, dtype, rtol=RTOL[dtype] * 8, what="batch_norm grad_input")
    close(gw, egw, acc, rtol=1e-4, what="batch_norm grad_weight")
    close(gb, egb, acc, rtol=1e-4, what="batch_norm grad_bias")


@pytest.mark.parametrize("shape", [(16, 64, 28, 28), (200, 8, 7, 7), (256, 3, 14, 14), (2701, 16, 7, 7)], ids=str)
@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last], ids=["nchw", "nhwc"])
def test_batch_norm_training_repeats_bit_for_bit(layout, shape):
    """ampc's batch-norm kernels sum in a fixed order (per plane, run of planes or column chunk, then
    in image order; a held channel's blocks in rank order): the same inputs give the same bits,
    statistics and gradients included."""
    x = randn(*shape, dtype=torch.float16).contiguous(memory_format=layout)
    g = randn(*shape, dtype=torch.float16).contiguous(memory_format=layout)
    w, b = randn(shape[1]), randn(shape[1])
    runs = []
    for _ in range(2):
        y, mean, rstd = _spatial.batch_norm_forward(x, None, None, w, b, True)
        runs.append((y, mean, rstd) + tuple(F.batch_norm_backward(g, x, w, training=True, save_mean=mean,
                                                                  save_rstd=rstd)))
    for first, second in zip(*runs):
        assert torch.equal(first, second)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=ID.get)
@pytest.mark.parametrize("shape", [(32, 2048, 7, 7), (16, 64, 28, 28), (5, 12, 3, 3), (8, 16, 14, 14)], ids=str)
@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last], ids=["nchw", "nhwc"])
@pytest.mark.parametrize("path", ["ampc", "cudnn"])
def test_batch_norm_training_either_path(monkeypatch, path, layout, shape, dtype):
    """Training runs ampc's kernels or cuDNN's, whichever the shape's first call timed faster;
    AMPC_BATCH_NORM forces one, and each must give torch's outputs, statistics, running averages and
    gradients (the backward from ampc's own saved statistics)."""
    monkeypatch.setenv("AMPC_BATCH_NORM", path)
    c = shape[1]
    x = (randn(*shape, dtype=torch.float64) * 2 + 0.5).to(dtype).contiguous(memory_format=layout)
    dy = randn(*shape, dtype=dtype).contiguous(memory_format=layout)
    w, b = randn(c), randn(c)
    rm, rv = randn(c), randn(c).abs() + 0.5
    trm, trv = rm.clone(), rv.clone()
    y = F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.1)
    TF.batch_norm(x, trm, trv, w, b, training=True, momentum=0.1)
    ref = TF.batch_norm(x.double(), None, None, w.double(), b.double(), training=True)
    assert y.dtype == dtype and y.is_contiguous(memory_format=layout)
    close(y, ref, dtype, rtol=RTOL[dtype] * 4, what=f"batch_norm by {path}")
    close(rm, trm, torch.float32, rtol=1e-5, what=f"running_mean by {path}")
    close(rv, trv, torch.float32, rtol=1e-5, what=f"running_var by {path}")
    _, mean, rstd = _spatial.batch_norm_forward(x, None, None, w, b, True)
    xd = x.double()
    close(mean, xd.mean(dim=(0, 2, 3)).float(), torch.float32, rtol=1e-5, scale=xd.abs().max().item(),
          what=f"saved mean by {path}")
    close(rstd, (xd.var(dim=(0, 2, 3), unbiased=False) + 1e-5).rsqrt().float(), torch.float32, rtol=1e-4,
          what=f"saved rstd by {path}")
    egi, egw, egb = autograd(lambda a, ww, bb: TF.batch_norm(a, None, None, ww, bb, training=True), [x, w, b], dy)
    gi, gw, gb = F.batch_norm_backward(dy, x, w, training=True, save_mean=mean, save_rstd=rstd)
    assert gi.dtype == dtype and gi.is_contiguous(memory_format=layout)
    close(gi, egi, dtype, rtol=RTOL[dtype] * 8, what=f"grad_input by {path}")
    close(gw, egw, torch.float32, rtol=1e-4, what=f"grad_weight by {path}")
    close(gb, egb, torch.float32, rtol=1e-4, what=f"grad_bias by {path}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=ID.get)
@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last], ids=["nchw", "nhwc"])
@pytest.mark.parametrize("path", ["ampc", "cudnn"])
def test_batch_norm_absent_parts_either_path(monkeypatch, path, layout, dtype):
    """cuDNN wants every per-channel operand, so its path stands scratch in for each one the call
    lacks (ones for a weight, zeros for a bias, a running statistic or weight gradient nobody
    reads): each absence alone, on both paths, against float64."""
    monkeypatch.setenv("AMPC_BATCH_NORM", path)
    shape, c, momentum = (8, 16, 14, 14), 16, 0.25
    x = (randn(*shape, dtype=torch.float64) * 2 + 0.5).to(dtype).contiguous(memory_format=layout)
    dy = randn(*shape, dtype=dtype).contiguous(memory_format=layout)
    w, b = randn(c), randn(c)
    xd = x.double()
    mean = xd.mean(dim=(0, 2, 3))
    unbiased = xd.var(dim=(0, 2, 3), unbiased=True)
    for weight, bias in [(None, b), (w, None), (None, None)]:
        ref = TF.batch_norm(xd, None, None, None if weight is None else weight.double(),
                            None if bias is None else bias.double(), training=True)
        y = F.batch_norm(x, None, None, weight, bias, training=True)
        close(y, ref, dtype, rtol=RTOL[dtype] * 4, what=f"batch_norm by {path}, weight {weight is not None}, "
                                                         f"bias {bias is not None}")
    for kept in ["running_mean", "running_var"]:
        start = randn(c).abs() + 0.5
        running = start.clone()
        args = (running, None) if kept == "running_mean" else (None, running)
        F.batch_norm(x, *args, w, b, training=True, momentum=momentum)
        batch = mean if kept == "running_mean" else unbiased
        close(running, ((1 - momentum) * start.double() + momentum * batch).float(), torch.float32, rtol=1e-5,
              scale=batch.abs().max().item(), what=f"{kept} alone by {path}")
    egi = autograd(lambda a, ww, bb: TF.batch_norm(a, None, None, ww, bb, training=True), [x, w, b], dy)[0]
    egi_unweighted, = autograd(lambda a: TF.batch_norm(a, None, None, None, None, training=True), [x], dy)
    gi, gw, gb = F.batch_norm_backward(dy, x, None, training=True)
    assert gw is None and gb is None
    close(gi, egi_unweighted, dtype, rtol=RTOL[dtype] * 8, what=f"grad_input without weight by {path}")
    gi, gw, gb = F.batch_norm_backward(dy, x, w, training=True, weight_grads=False)
    assert gw is None and gb is None
    close(gi, egi, dtype, rtol=RTOL[dtype] * 8, what=f"grad_input without weight grads by {path}")


def test_batch_norm_eval_backward():
    x, dy = randn(4, 3, 5, 5), randn(4, 3, 5, 5)
    w, rm, rv = randn(3), randn(3), randn(3).abs() + 0.5
    egi, egw = autograd(lambda a, ww: TF.batch_norm(a, rm.double(), rv.double(), ww, None), [x, w], dy)
    gi, gw, _ = F.batch_norm_backward(dy, x, w, rm, rv, training=False)
    close(gi, egi, torch.float32, what="eval grad_input")
    close(gw, egw, torch.float32, rtol=1e-4, what="eval grad_weight")


def test_batch_norm_bad_input():
    x = randn(1, 3, 1, 1)
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        F.batch_norm(x, randn(3), randn(3), training=True)
    with pytest.raises(ValueError, match="one device"):
        F.batch_norm(randn(4, 3), randn(3).cpu(), randn(3).cpu(), training=True)


# --------------------------------------------------------------------------------------------
# Pooling
# --------------------------------------------------------------------------------------------

MAX_POOLS = [
    ((2, 3, 9, 8), 3, 2, 1, 1, False),
    ((1, 2, 7, 7), (2, 3), (2, 1), (1, 0), (2, 1), True),
    ((3, 5, 6), 2, 2, 0, 1, True),
    ((8, 64, 112, 112), 3, 2, 1, 1, False),
]


@pytest.mark.parametrize("dtype", FLOATS, ids=ID.get)
@pytest.mark.parametrize("case", MAX_POOLS, ids=str)
def test_max_pool2d(case, dtype):
    shape, k, s, p, d, ceil = case
    x = randn(*shape, dtype=dtype)
    y, idx = F.max_pool2d(x, k, s, p, d, ceil, return_indices=True)
    ty, tidx = TF.max_pool2d(x, k, s, p, d, ceil, return_indices=True)
    assert torch.equal(y, ty)
    assert torch.equal(idx, tidx)
    dy = randn(*y.shape, dtype=dtype)
    (egi,) = autograd(lambda a: TF.max_pool2d(a, k, s, p, d, ceil), [x], dy)
    close(F.max_pool2d_backward(dy, x, idx, k, s, p, d, ceil), egi, dtype, what="max_pool2d backward")


AVG_POOLS = [
    ((2, 3, 9, 8), 3, 2, 1, False, True, None),
    ((1, 2, 7, 7), (2, 3), (2, 1), 1, True, False, None),
    ((2, 2, 5, 5), 3, 1, 1, False, True, 4),
]


@pytest.mark.parametrize("dtype", FLOATS, ids=ID.get)
@pytest.mark.parametrize("case", AVG_POOLS, ids=str)
def test_avg_pool2d(case, dtype):
    shape, k, s, p, ceil, include, divisor = case
    kw = dict(ceil_mode=ceil, count_include_pad=include, divisor_override=divisor)
    x = randn(*shape, dtype=dtype)
    y = F.avg_pool2d(x, k, s, p, **kw)
    close(y, TF.avg_pool2d(x.double(), k, s, p, **kw), dtype, what="avg_pool2d")
    close(y, TF.avg_pool2d(x, k, s, p, **kw), dtype, rtol=2 * RTOL[dtype], what="avg_pool2d vs torch")
    dy = randn(*y.shape, dtype=dtype)
    (egi,) = autograd(lambda a: TF.avg_pool2d(a, k, s, p, **kw), [x], dy)
    close(F.avg_pool2d_backward(dy, x, k, s, p, **kw), egi, dtype, what="avg_pool2d backward")


@pytest.mark.parametrize("dtype", FLOATS, ids=ID.get)
@pytest.mark.parametrize("shape,size", [((8, 2048, 7, 7), 1), ((1, 2, 9, 5), (4, 3)), ((3, 5, 6), (5, 6))], ids=str)
def test_adaptive_avg_pool2d(shape, size, dtype):
    x = randn(*shape, dtype=dtype)
    y = F.adaptive_avg_pool2d(x, size)
    close(y, TF.adaptive_avg_pool2d(x.double(), size), dtype, what="adaptive_avg_pool2d")
    dy = randn(*y.shape, dtype=dtype)
    (egi,) = autograd(lambda a: TF.adaptive_avg_pool2d(a, size), [x], dy)
    close(F.adaptive_avg_pool2d_backward(dy, x), egi, dtype, what="adaptive_avg_pool2d backward")


def test_pool_matches_cpu_bits():
    """The CPU and CUDA kernels share the windows and the order of the sums."""
    x = randn(2, 3, 11, 10)
    dy = randn(2, 3, 6, 5)  # (11 + 2 - 3) // 2 + 1 rows, (10 + 2 - 3) // 2 + 1 columns
    for fn in (lambda a: F.avg_pool2d(a, 3, 2, 1), lambda a: F.adaptive_avg_pool2d(a, (5, 5))):
        assert torch.equal(fn(x).cpu(), torch.from_numpy(fn(x.cpu().numpy())))
    gi = F.avg_pool2d_backward(dy, x, 3, 2, 1)
    assert torch.equal(gi.cpu(), torch.from_numpy(F.avg_pool2d_backward(dy.cpu().numpy(), x.cpu().numpy(), 3, 2, 1)))


@pytest.mark.parametrize("dtype", FLOATS, ids=ID.get)
@pytest.mark.parametrize("shape", [(2, 24, 11, 10), (4, 64, 56, 56)], ids=str)
def test_pools_keep_channels_last(shape, dtype):
    """A channels-last input pools channels-last (as torch's, so a channels-last network stays so), with
    the bits of the NCHW kernels: the same windows, summed in the same order; the backward likewise,
    and from a grad_output in the other layout."""
    cl = torch.channels_last
    x = randn(*shape, dtype=dtype)
    x_cl = x.to(memory_format=cl)
    pools = [(lambda a: F.max_pool2d(a, 3, 2, 1, return_indices=True),
              lambda dy, a, i: F.max_pool2d_backward(dy, a, i, 3, 2, 1)),
             (lambda a: (F.avg_pool2d(a, (3, 2), 2, 1, count_include_pad=False), None),
              lambda dy, a, i: F.avg_pool2d_backward(dy, a, (3, 2), 2, 1, count_include_pad=False)),
             (lambda a: (F.adaptive_avg_pool2d(a, (5, 3)), None),
              lambda dy, a, i: F.adaptive_avg_pool2d_backward(dy, a))]
    for forward, backward in pools:
        y, idx = forward(x)
        y_cl, idx_cl = forward(x_cl)
        assert y_cl.is_contiguous(memory_format=cl) and not y_cl.is_contiguous()
        assert torch.equal(y_cl, y)
        if idx is not None:
            assert idx_cl.is_contiguous(memory_format=cl) and torch.equal(idx_cl, idx)
            assert torch.equal(idx_cl, TF.max_pool2d(x_cl, 3, 2, 1, return_indices=True)[1])
        dy = randn(*y.shape, dtype=dtype)
        want = backward(dy, x, idx)
        for grad in (dy.to(memory_format=cl), dy):
            got = backward(grad, x_cl, idx_cl)
            assert got.is_contiguous(memory_format=cl) and not got.is_contiguous()
            assert torch.equal(got, want)


POOL_VARIANTS = {
    "max dilated ceil": (lambda a: F.max_pool2d(a, (3, 2), (2, 1), (1, 0), (2, 1), True, return_indices=True),
                         lambda dy, a, i: F.max_pool2d_backward(dy, a, i, (3, 2), (2, 1), (1, 0), (2, 1), True)),
    "avg padding counted": (lambda a: (F.avg_pool2d(a, 3, 2, 1), None),
                            lambda dy, a, i: F.avg_pool2d_backward(dy, a, 3, 2, 1)),
    "avg ceil divisor": (lambda a: (F.avg_pool2d(a, 3, 2, 1, ceil_mode=True, divisor_override=5), None),
                         lambda dy, a, i: F.avg_pool2d_backward(dy, a, 3, 2, 1, ceil_mode=True, divisor_override=5)),
    "adaptive": (lambda a: (F.adaptive_avg_pool2d(a, (4, 3)), None),
                 lambda dy, a, i: F.adaptive_avg_pool2d_backward(dy, a)),
}


def same_bits(a, b):
    """Equal bit for bit, NaN included (torch.equal calls NaN unequal)."""
    ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return a.shape == b.shape and torch.equal(a.contiguous().view(ints), b.contiguous().view(ints))


@pytest.mark.parametrize("dtype", FLOATS, ids=ID.get)
@pytest.mark.parametrize("channels", [8, 12, 16])
@pytest.mark.parametrize("variant", POOL_VARIANTS)
def test_channels_last_pools_match_nchw_bits(variant, channels, dtype):
    """Channels in whole 16-byte packs take a thread per pack of channels (12 float32 channels do, 12
    16-bit ones do not): the NCHW kernels' windows in their order, so their bits, with NaN (the first in
    a window is the maximum) and -inf in the data, dilation, ceil mode, counted padding and a divisor."""
    forward, backward = POOL_VARIANTS[variant]
    cl = torch.channels_last
    x = randn(3, channels, 9, 11, dtype=dtype)
    x[0, 1, 2, 3] = x[0, 1, 2, 5] = float("nan")
    x[1, 5, 4:7, 4:6] = float("nan")
    x[2, :, :2, :2] = float("-inf")
    y, idx = forward(x)
    y_cl, idx_cl = forward(x.to(memory_format=cl))
    assert y_cl.is_contiguous(memory_format=cl) and same_bits(y_cl, y)
    if idx is not None:
        assert idx_cl.is_contiguous(memory_format=cl) and torch.equal(idx_cl, idx)
    dy = randn(*y.shape, dtype=dtype)
    got = backward(dy.to(memory_format=cl), x.to(memory_format=cl), idx_cl)
    assert got.is_contiguous(memory_format=cl) and same_bits(got, backward(dy, x, idx))


@pytest.mark.parametrize("dtype", FLOATS, ids=ID.get)
@pytest.mark.parametrize("case", [CONVS[0], CONVS[2], CONVS[5]], ids=str)
def test_conv2d_mixed_layouts(case, dtype):
    """cuDNN's legacy API has no algorithm when the filter's layout differs from the data's (nor for
    float64 channels-last data gradients): ampc puts every operand in the input's layout."""
    x, wt, b, kw = conv_case(case, dtype)
    rtol = conv_rtol(dtype, case) * (4 if dtype in (torch.float32, torch.float64) else 1)
    dy = randn(*TF.conv2d(x, wt, b, **kw).shape, dtype=dtype)
    egi, egw, _ = autograd(lambda a, w, c: TF.conv2d(a, w, c, **kw), [x, wt, b], dy)
    ref = TF.conv2d(x.double(), wt.double(), b.double(), **kw)
    cl = torch.channels_last
    for xs, ws, dys in ((x, wt.contiguous(memory_format=cl), dy), (x.contiguous(memory_format=cl), wt, dy),
                        (x.contiguous(memory_format=cl), wt, dy.contiguous(memory_format=cl))):
        close(F.conv2d(xs, ws, b, **kw), ref, dtype, rtol=conv_rtol(dtype, case), what="mixed-layout forward")
        gi, gw, _ = F.conv2d_backward(dys, xs, ws, **kw, bias_grad=False)
        close(gi, egi, dtype, rtol=rtol, what="mixed-layout grad_input")
        close(gw, egw, dtype, rtol=rtol * 4, what="mixed-layout grad_weight")


@pytest.mark.parametrize("kernel,dilation", [((2, 4), (1, 1)), ((2, 3), (3, 1))])
@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel lengths:UserWarning")  # torch's own
def test_conv2d_same_padding_with_an_even_kernel(kernel, dilation):
    x = torch.randn(2, 3, 7, 8, device="cuda", dtype=torch.float64)
    w = torch.randn((4, 3) + kernel, device="cuda", dtype=torch.float64)
    fn = lambda a, b: torch.nn.functional.conv2d(a, b, padding="same", dilation=dilation)  # noqa: E731
    y = F.conv2d(x, w, padding="same", dilation=dilation)
    torch.testing.assert_close(y, fn(x, w), rtol=1e-12, atol=1e-12)
    dy = torch.randn_like(y)
    xr, wr = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    want = torch.autograd.grad(fn(xr, wr), (xr, wr), dy)
    gi, gw, _ = F.conv2d_backward(dy, x, w, padding="same", dilation=dilation, bias_grad=False)
    torch.testing.assert_close(gi, want[0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(gw, want[1], rtol=1e-12, atol=1e-12)
