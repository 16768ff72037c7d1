"""Run ampc's GPU kernels over awkward sizes, offsets and layouts, for
compute-sanitizer (not collected by pytest):

    compute-sanitizer --tool memcheck --error-exitcode 1 python tests/gpu_memcheck.py
"""

import torch

import ampc

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
torch.cuda.synchronize()
print("memcheck workload done")
