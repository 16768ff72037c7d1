"""Run ampc's GPU kernels over awkward sizes, offsets and layouts, for
compute-sanitizer (not collected by pytest):

    compute-sanitizer --tool memcheck --error-exitcode 1 python tests/gpu_memcheck.py
"""

import torch

import ampc
from ampc.nn import _attention, _bare_ops, _embedding, _spatial

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]

base = torch.randn(70_000, device="cuda", dtype=torch.float64)
for src in DTYPES:
    for dst in DTYPES:
        x = base.to(src)
        for n in (1, 7, 9, 17, 1000, 65539):
            for offset in (0, 1, 3):
                y = ampc.cast(x[offset : offset + n], dst)
                assert y.dtype == dst and y.shape == (n,)
        m = x[:60_000].view(200, 300)
        ampc.cast(m.t()[::3, 1::2], dst)
        ampc.cast(m[5, 7], dst)
        out = torch.empty(300, 200, dtype=dst, device="cuda").t()
        ampc.cast(m, out=out)
# Integer and bool sources (1-byte ones an element a thread), and same-dtype integer copies.
ints = torch.randint(-1000, 1000, (70_000,), device="cuda")
for src in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool):
    x = ints.to(src)
    for dst in DTYPES:
        for n in (1, 7, 9, 17, 1000, 65539):
            for offset in (0, 1, 3):
                ampc.cast(x[offset : offset + n], dst)
        ampc.cast(x[:60_000].view(200, 300).t()[::3, 1::2], dst)
        ampc.cast(x[:4096].view(4, 8, 128).transpose(0, 1), dst)
    ampc.cast(x[1:60_001].view(200, 300).t(), out=torch.empty(200, 300, dtype=src, device="cuda").t())
# GradScaler: multi-tensor unscale over awkward sizes and dtypes, strided grads, update, overflow counts.
params = [torch.nn.Parameter(torch.zeros(n, device="cuda", dtype=dt))
          for n in (1, 7, 16383, 16384, 16385, 70_001) for dt in (torch.float32, torch.bfloat16, torch.float64)]
for p in params:
    p.grad = torch.randn_like(p)
strided = torch.nn.Parameter(torch.zeros(30, 14, device="cuda"))
strided.grad = torch.randn(30, 40, device="cuda")[:, ::3]
opt = torch.optim.SGD(params + [strided], lr=0.0)
scaler = ampc.GradScaler("cuda", init_scale=8.0)
for _ in range(3):
    scaler.scale(torch.ones((2, 2), device="cuda"))
    scaler.step(opt)
    scaler.update()
params[4].grad[3] = float("inf")
scaler.scale(torch.ones((), device="cuda"))
scaler.step(opt)
scaler.overflow_report(opt)
scaler.update()
# Fused clipping: every norm type, dense and strided gradients, the disabled-scaler path.
for norm_type in (2.0, 1.0, float("inf"), 3.0):
    scaler.scale(torch.ones((), device="cuda"))
    scaler.unscale_(opt, max_norm=0.5, norm_type=norm_type)
    scaler.step(opt)
    scaler.update()
ampc.GradScaler("cuda", enabled=False).unscale_(opt, max_norm=0.5)
# Deferred clipping: the norm pass alone, the divisor handed to a fused step.
fused = torch.optim.AdamW(params, fused=True)
scaler.scale(torch.ones((), device="cuda"))
scaler.unscale_(fused, max_norm=0.5, defer=True)
scaler.step(fused)
scaler.update()
# ampc.optim: every dtype, sizes around the chunk, misaligned (scalar path) and aligned (vector path).
from ampc import optim  # noqa: E402

for dt in DTYPES:
    ps = []
    for n in (1, 5, 16383, 16385, 40_003):
        for offset in (0, 1):
            ps.append(optim.Parameter(torch.randn(n + offset, device="cuda", dtype=dt)[offset:]))
    for p in ps:
        p.grad = torch.randn(p.data.numel() + 1, device="cuda", dtype=dt)[1:] if p.data.data_ptr() % 16 else \
            torch.randn_like(p.data)
    for make in (lambda q: optim.SGD(q, lr=0.1, momentum=0.9, nesterov=True), lambda q: optim.SGD(q, lr=0.1),
                 lambda q: optim.AdamW(q, amsgrad=True), lambda q: optim.Adam(q)):
        o = make(ps)
        s = ampc.GradScaler("cuda", init_scale=4.0)
        for i in range(2):
            s.scale(torch.ones((), device="cuda"))
            s.step(o)
            s.update()
        o.step()
        o.zero_grad(set_to_none=False)
# autocast: the engine's casts of CUDA arguments (nested, strided, cached weights), both dtypes.
linear = ampc.AutocastOp(torch.nn.functional.linear, "linear")
cat = ampc.AutocastOp(torch.cat, "cat")
w = ampc.Parameter(torch.randn(33, 17, device="cuda"))
for dtype in (torch.float16, torch.bfloat16):
    with ampc.autocast("cuda", dtype=dtype):
        for n in (1, 7, 1025):
            linear(torch.randn(n, 17, device="cuda"), w)
            linear(torch.randn(17, n, device="cuda").t(), w)
        ampc.register_autocast("cat", "promote", "cuda")
        cat([torch.randn(3, device="cuda", dtype=dtype), torch.randn(5, device="cuda")])
        ampc.register_autocast("cat", "none", "cuda")
# ampc.nn.functional: every op family at sizes around the launch shapes (a thread, a warp, a block
# per row; one and several reduction chunks), strided rows, every dtype.
F = ampc.nn.functional
for dt in DTYPES:
    for rows, n in ((1, 1), (3, 31), (5, 1025), (2, 40_000)):
        x = torch.randn(rows, n, device="cuda", dtype=dt)
        g = torch.randn(rows, n, device="cuda", dtype=dt)
        w, b = torch.randn(n, device="cuda", dtype=dt), torch.randn(n, device="cuda", dtype=dt)
        for fn in (F.relu, F.gelu, F.silu, F.exp, F.tanh):
            fn(x)
        F.add(x, w, alpha=0.5)
        F.mul(x[:, :1], w)
        for dim in (0, 1):
            y = F.softmax(x, dim=dim)
            F.softmax_backward(g, y, dim)
            F.log_softmax_backward(g, F.log_softmax(x, dim=dim), dim)
            F.sum(x, dim=dim)
        F.sum(x)
        y, mean, rstd = _bare_ops.layer_norm_forward(x, (n,), w, b)
        F.layer_norm_backward(g, x, (n,), w, b, mean=mean, rstd=rstd)
        F.layer_norm_backward(g, x, (n,), None, b, mean=mean, rstd=rstd)
        t = torch.randint(0, n, (rows,), device="cuda")
        for kw in ({}, dict(reduction="none"), dict(label_smoothing=0.1, weight=w.abs()), dict(ignore_index=0)):
            loss, lse, denom = _bare_ops.cross_entropy_forward(x, t, **kw)
            F.cross_entropy_backward(torch.ones_like(loss), x, t, lse=lse, denom=denom, **kw)
        F.cross_entropy(x, torch.softmax(g.float(), 1).to(dt))
        F.mse_loss(x, g)
        F.binary_cross_entropy_with_logits(x, torch.rand_like(g))
    a, bm = torch.randn(5, 3, 7, device="cuda", dtype=dt), torch.randn(7, 9, device="cuda", dtype=dt)
    F.matmul(a, bm)
    F.matmul(a.transpose(1, 2).contiguous().transpose(1, 2), bm.t().contiguous().t())
    F.linear(a, bm.t(), torch.randn(9, device="cuda", dtype=dt))
    F.linear_backward(torch.randn(5, 3, 9, device="cuda", dtype=dt), a, bm.t().contiguous())
    F.baddbmm(torch.randn(5, 3, 9, device="cuda", dtype=dt), a, torch.randn(5, 7, 9, device="cuda", dtype=dt))
# The layer ops: embedding (gather, sorted gradient), dropout, group_norm, attention (causal too),
# and every cached / streamed row tier of softmax and layer_norm at their edges.
for dt in DTYPES:
    w = torch.randn(37, 130, device="cuda", dtype=dt)
    idx = torch.randint(-1, 38, (5, 9), device="cuda")
    F.embedding(idx, w)
    F.embedding_backward(torch.randn(5, 9, 130, device="cuda", dtype=dt), idx, 37, 3)
    y, state = _embedding.dropout_forward(torch.randn(1001, device="cuda", dtype=dt), 0.3)
    F.dropout_backward(y, state, 0.3)
    x = torch.randn(3, 8, 5, 5, device="cuda", dtype=dt)
    c = torch.randn(8, device="cuda", dtype=dt)
    F.group_norm_backward(x, x, 4, c, c)
    q = torch.randn(2, 3, 33, 16, device="cuda", dtype=dt)
    out, probs, _ = _attention._forward(q, q, q, is_causal=True)
    F.scaled_dot_product_attention_backward(out, q, q, q, probs)
    bands = [(0, 9), (9, 18), (18, 27), (27, 33)]  # causal_bands composes by bands on the host only
    _attention.banded_backward(_attention.banded_forward(q, q, q, bands), q, q, q, bands)
    for n in (128, 129, 1024, 2048, 4096, 8192, 16384, 16392, 50257):
        x = torch.randn(6, n, device="cuda", dtype=dt)
        ln, mean, rstd = _bare_ops.layer_norm_forward(x, (n,), x[0], x[1])
        F.layer_norm_backward(ln, x, (n,), x[0], x[1], mean=mean, rstd=rstd)
        F.softmax_backward(x, F.softmax(x, -1), -1)
        ampc._C._softmax(x.view(2, 3, n), -1, True, None, causal=True)
        ampc._C._softmax(x.view(2, 3, n), -1, False, None, causal=True, causal_offset=2)  # a band's rows
        t = torch.randint(0, n, (6,), device="cuda")
        loss, lse, denom = _bare_ops.cross_entropy_forward(x[:, 1:], t - 1, label_smoothing=0.1)
        F.cross_entropy_backward(torch.ones_like(loss), x[:, 1:], t - 1, label_smoothing=0.1, lse=lse, denom=denom)
    # channels-last batch norm: ampc's kernels (cuDNN for 12 channels in 16 bits), lanes sharing
    # a pack of columns (16, 64), chunks added by column_finish (the 64 x 16 x 16 images)
    for c, n, hw in ((12, 3, 5), (16, 3, 5), (64, 3, 5), (16, 64, 16), (64, 64, 16)):
        x = torch.randn(n, c, hw, hw + 2, device="cuda", dtype=dt).to(memory_format=torch.channels_last)
        if dt != torch.float64:
            acc = torch.float32
            stats = [torch.randn(c, device="cuda", dtype=acc) for _ in range(2)]
            y, sm, sr = _spatial.batch_norm_forward(x, stats[0], stats[1].abs(), stats[0], stats[1], True)
            F.batch_norm_backward(y, x, stats[0], training=True, save_mean=sm, save_rstd=sr)
    # NCHW planes: runs of short planes (5 x 6, 7 x 7 in one run and in two, 14 x 14), slabs of 8
    # channels' short planes read 1, 2 or 4 at a time (7 x 7 in one chunk and in three, 5 x 6,
    # 14 x 14), a warp's (23 x 29), a block's (64 x 70); on sm_90 these are held on chip, a block a
    # channel, and the last four rows are a cluster's (2 to 7 blocks) and, longer, slabs' and runs'
    for c, n, h, w in ((3, 4, 5, 6), (8, 3, 7, 7), (3, 90, 7, 7), (5, 2, 14, 14), (8, 45, 7, 7), (16, 2, 5, 6),
                       (8, 6, 14, 14), (3, 2, 23, 29), (3, 2, 64, 70), (2, 256, 14, 14), (2, 1337, 7, 7),
                       (16, 2701, 7, 7), (3, 8800, 5, 6)):
        if dt != torch.float64:
            x = torch.randn(n, c, h, w, device="cuda", dtype=dt)
            stats = [torch.randn(c, device="cuda") for _ in range(2)]
            y, sm, sr = _spatial.batch_norm_forward(x, stats[0], stats[1].abs(), stats[0], stats[1], True)
            F.batch_norm_backward(y, x, stats[0], training=True, save_mean=sm, save_rstd=sr)
# Pools, NCHW and channels-last (a thread per 16-byte pack of channels where they come whole:
# 8, 16 and 24 in 16 bits, 12 in float32; 12 16-bit channels take the element kernels), forward
# and backward; relayouts of attention heads (the strided-rows cast); float32 scores to 16-bit
# probabilities, causal, at the warp, block and generic row lengths.

for dt in DTYPES:
    for c in (8, 12, 16, 24):
        for layout in (torch.contiguous_format, torch.channels_last):
            x = torch.randn(2, c, 9, 11, device="cuda", dtype=dt).contiguous(memory_format=layout)
            y, idx = F.max_pool2d(x, 3, 2, 1, return_indices=True)
            F.max_pool2d_backward(torch.randn_like(y), x, idx, 3, 2, 1)
            y = F.avg_pool2d(x, (3, 2), 2, 1, ceil_mode=True, count_include_pad=False)
            F.avg_pool2d_backward(torch.randn_like(y), x, (3, 2), 2, 1, ceil_mode=True, count_include_pad=False)
            y = F.adaptive_avg_pool2d(x, (4, 3))
            F.adaptive_avg_pool2d_backward(torch.randn_like(y), x)
    heads = torch.randn(2, 5, 3, 64, device="cuda", dtype=dt).transpose(1, 2)
    for out_dt in DTYPES:
        ampc.cast(heads, out=torch.empty(2, 3, 5, 64, device="cuda", dtype=out_dt))
for dt in (torch.float16, torch.bfloat16):
    for s_len in (64, 1024, 5000, 70):
        q, k = torch.randn(1, 2, 3, 32, device="cuda", dtype=dt), torch.randn(1, 2, s_len, 32, device="cuda", dtype=dt)
        for causal in (False, True):
            _attention.probabilities(q, k, is_causal=causal)
# The fused attention kernels: tails of both lengths (rows past the end zero-filled and not
# written), grouped heads with dropout, GPT-2's strided head views.
for dt in (torch.float16, torch.bfloat16):
    for L, S in ((70, 37), (5, 130), (64, 64)):
        q, k, v = (torch.randn(2, 3, n, 64, device="cuda", dtype=dt) for n in (L, S, S))
        for causal in (False, True):
            served = ampc._C._attention(q, k, v, causal, 0.125)
            if served is not None:
                ampc._C._attention_backward(torch.randn_like(q), q, k, v, *served, causal, 0.125)
    q, kv = torch.randn(1, 4, 70, 64, device="cuda", dtype=dt), torch.randn(1, 2, 77, 64, device="cuda", dtype=dt)
    served = ampc._C._attention(q, kv, kv, True, 0.125, 0.3, 7, 11)  # grouped heads, dropout
    if served is not None:
        ampc._C._attention_backward(torch.randn_like(q), q, kv, kv, *served, True, 0.125, 0.3, 7, 11)
    qkv = torch.randn(2, 77, 3 * 128, device="cuda", dtype=dt)
    q, k, v = (z.reshape(2, 77, 2, 64).transpose(1, 2) for z in qkv.split(128, dim=2))
    served = ampc._C._attention(q, k, v, True, 0.125)
    if served is not None:
        ampc._C._attention_backward(served[0], q, k, v, *served, True, 0.125)
torch.cuda.synchronize()
print("layer ops done", flush=True)
# Convolutions: the first call of each shape times cuDNN's legacy algorithms and graph API engines
# on its buffers (conv_graph.c); grouped and strided, NCHW and channels-last.
for dt, layout in ((torch.float32, torch.contiguous_format), (torch.float16, torch.channels_last)):
    x = torch.randn(2, 6, 9, 11, device="cuda", dtype=dt).contiguous(memory_format=layout)
    w = torch.randn(8, 3, 3, 3, device="cuda", dtype=dt).contiguous(memory_format=layout)
    y = F.conv2d(x, w, torch.randn(8, device="cuda", dtype=dt), stride=2, padding=1, groups=2)
    F.conv2d_backward(torch.randn_like(y), x, w, stride=2, padding=1, groups=2, input_grad=True, bias_grad=True)
torch.cuda.synchronize()
print("memcheck workload done")
