"""Where ampc's unscale_ spends its time: host (no GPU work queued) against GPU."""
import time
import torch
import ampc
import scaler as bench

for name, shapes in (("ResNet-50", bench.resnet50_shapes()), ("GPT-2", bench.gpt2_shapes())):
    params = [torch.nn.Parameter(torch.zeros(s, device="cuda")) for s in shapes]
    for q in params:
        q.grad = torch.randn_like(q)
    opt = torch.optim.SGD(params, lr=0.0)
    s = ampc.GradScaler("cuda")
    s.scale(torch.ones((), device="cuda"))
    host, gpu = [], []
    for i in range(40):
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        a.record()
        s.unscale_(opt)
        b.record()
        t1 = time.perf_counter()
        s.update()
        torch.cuda.synchronize()
        host.append((t1 - t0) * 1e3)
        gpu.append(a.elapsed_time(b))
    t0 = time.perf_counter()
    for _ in range(100):
        s._check_inf_per_device(opt)
        s.update()
    torch.cuda.synchronize()
    per = (time.perf_counter() - t0) * 10
    host.sort(); gpu.sort()
    print(f"{name}: unscale_ host {host[20]:.3f} ms, GPU between events {gpu[20]:.3f} ms (host and GPU overlap), "
          f"check+update loop {per:.3f} ms/iter")
