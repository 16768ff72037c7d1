"""Where an ampc training step's time goes on the GPU: host time, kernel time, top kernels."""
import cProfile, io, pstats, sys, time
import numpy as np
import torch
from torch.profiler import profile, ProfilerActivity
import ampc
import ampc.nn.functional as F
from ampc._demo import training_step, synthetic_batch

kind = sys.argv[1]
channels_last = "nhwc" in sys.argv
with_torch = "torch" in sys.argv
batch = 256 if kind == "resnet50" else 8
torch.cuda.init()
if with_torch:
    import torchvision
    torch.backends.cudnn.benchmark = True
    m = torchvision.models.resnet50().cuda().to(memory_format=torch.channels_last)
    o = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9); sc = torch.amp.GradScaler("cuda")
    tx, ty = (torch.from_dlpack(a) for a in synthetic_batch(kind, batch, 0, channels_last=True))
    def tstep():
        o.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.float16):
            l = torch.nn.functional.cross_entropy(m(tx), ty)
        sc.scale(l).backward(); sc.step(o); sc.update()
    for _ in range(4): tstep()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        tstep(); tstep(); torch.cuda.synchronize()
    ev = list(prof.key_averages())
    print(f"TORCH kernel time per step {sum(e.device_time_total for e in ev)/2e3:.1f} ms, {sum(e.count for e in ev)//2} kernels")
    for e in sorted(ev, key=lambda e: -e.device_time_total)[:25]:
        print(f"{e.device_time_total/2e3:8.2f} ms {e.count//2:5d}x  {e.key[:150]}")
    del m, o, sc, tx, ty; torch.cuda.empty_cache()
ampc.manual_seed(0)
model = ampc.models.resnet50() if kind == "resnet50" else ampc.models.gpt(block_size=1024)
model.to("cuda:0", memory_format="channels_last" if channels_last else None)
params = list(model.parameters())
opt = ampc.optim.SGD(params, lr=0.1, momentum=0.9) if kind == "resnet50" else ampc.optim.AdamW(params, lr=3e-4)
scaler = ampc.GradScaler("cuda")
x, y = synthetic_batch(kind, batch, 0, channels_last=channels_last)
step = lambda: training_step(lambda: F.cross_entropy(model(x), y) if kind == "resnet50" else model(x, y)[1],
                             opt, scaler, "cuda", ampc.float16)
for _ in range(4):
    step()
ampc.cuda.synchronize(0)
ampc.cuda.reset_peak_memory_stats(0)
walls, hosts = [], []
for _ in range(5):
    ampc.cuda.synchronize(0)
    t0 = time.perf_counter(); step(); t1 = time.perf_counter(); ampc.cuda.synchronize(0); t2 = time.perf_counter()
    hosts.append(t1 - t0); walls.append(t2 - t0)
print(f"{kind} nhwc={channels_last}: wall {1e3*np.median(walls):.1f} ms, host enqueue {1e3*np.median(hosts):.1f} ms, "
      f"peak {ampc.cuda.max_memory_allocated(0)/2**20:.0f} MiB, now {ampc.cuda.memory_allocated(0)/2**20:.0f} MiB")
print("reserved MiB", ampc.cuda.memory_reserved(0) / 2**20)
pr = cProfile.Profile(); pr.enable(); step(); ampc.cuda.synchronize(0); pr.disable()
s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(22); print(s.getvalue()[-6000:])
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    step(); step(); ampc.cuda.synchronize(0)
ev = [e for e in prof.key_averages()]
tot = sum(e.device_time_total for e in ev) / 2
print(f"kernel time per step {tot/1e3:.1f} ms over {sum(e.count for e in ev)//2} kernels")
for e in sorted(ev, key=lambda e: -e.device_time_total)[:32]:
    print(f"{e.device_time_total/2e3:8.2f} ms {e.count//2:5d}x  {e.key[:150]}")
