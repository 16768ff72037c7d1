"""One rank of tests/test_distributed.py's and test_distributed_torch.py's runs (launched by mpirun
or as processes with torch's environment variables; not collected by pytest):
python distributed_worker.py CASE [TIMEOUT [BACKEND]]; prints one JSON line of results per rank."""

import json
import sys

import numpy as np

import ampc
from ampc import distributed as dist, nn
from ampc.cli.workloads import digits_split, mlp

F = nn.functional


def collectives(rank, size):
    out = {}
    for name, dtype in (("f32", np.float32), ("f64", np.float64), ("bf16", ampc.bfloat16), ("i64", np.int64)):
        a = np.arange(4).astype(dtype) + rank
        for op in ("sum", "max", "min"):
            b = a.copy()
            dist.all_reduce(b, op)
            out[f"{name}_{op}"] = np.asarray(b, np.float64).tolist()
    avg = np.full(3, float(rank), np.float32)
    dist.all_reduce(avg, "avg")
    out["avg"] = avg.tolist()
    c = np.full(5, rank + 7.0)
    dist.broadcast(c, src=size - 1)
    out["broadcast"] = c.tolist()
    dist.barrier()
    return out


def checksum(model):
    return float(sum(np.asarray(p.data, np.float64).sum() for p in model.parameters()))


def ddp(rank, size):
    """Data-parallel AMP fp16 training on each rank's own shard of the digits; inf injected into
    rank 1's gradients at step 2 only."""
    x, y, _, _ = digits_split(0)
    ampc.manual_seed(rank)  # different initial weights: the broadcast makes them rank 0's
    model = dist.DataParallel(mlp(64))
    opt = ampc.optim.AdamW(list(model.parameters()), lr=1e-2)
    scaler = ampc.GradScaler("cpu")
    shard = np.arange(len(x))[rank::size]
    for step in range(6):
        batch = shard[step * 32:(step + 1) * 32]
        opt.zero_grad()
        with ampc.autocast("cpu", dtype=ampc.float16):
            loss = F.cross_entropy(model(x[batch]), y[batch])
        if step == 2 and rank == 1:
            loss = loss * float("inf")
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    return {"checksum": checksum(model), "stats": scaler.stats(), "state": scaler.state_dict(),
            "keys": list(model.state_dict())[:2]}


def sharded(rank, size):
    """Each rank steps only its shard of the parameters (ZeRO-1); with 3 ranks and 2 parameters one
    rank holds none. Inf in rank 0's shard at step 1: every rank skips it."""
    rng = np.random.default_rng(0)
    params = [ampc.nn.Parameter(rng.standard_normal(5).astype(np.float32)) for _ in range(2)]
    mine = params[rank::size]
    opt = ampc.optim.SGD(mine, lr=0.1) if mine else ampc.optim.SGD([ampc.nn.Parameter(np.zeros(1, np.float32))],
                                                                  lr=0.1)
    scaler = dist.ShardedGradScaler("cpu", init_scale=1024.0, growth_interval=2)
    for step in range(4):
        for p in params:
            p.grad = None
        loss = F.sum(F.mul(params[0], params[0])) + F.sum(params[1])
        scaler.scale(loss).backward()
        if step == 1 and rank == 0:
            mine[0].grad[0] = np.inf
        scaler.step(opt)
        scaler.update()
    return {"stats": scaler.stats(), "values": [np.asarray(p.data, np.float64).tolist() for p in mine]}


def hysteresis(rank, size):
    """ShardedGradScaler with hysteresis=2 and scale bounds: overflows on rank 0 alone at steps 1
    and 2 (the second backs off), on the last rank at step 4 (absorbed), then clean steps growing
    the scale to its bound."""
    rng = np.random.default_rng(1)
    params = [ampc.nn.Parameter(rng.standard_normal(4).astype(np.float32)) for _ in range(size)]
    mine = params[rank::size]
    opt = ampc.optim.SGD(mine, lr=0.01)
    scaler = dist.ShardedGradScaler("cpu", init_scale=256.0, growth_interval=1, hysteresis=2, min_scale=64.0,
                                    max_scale=1024.0)
    scales = []
    for step in range(9):
        for p in params:
            p.grad = None
        loss = F.sum(F.mul(F.sum(F.stack(list(params), dim=0), dim=0), 0.5))
        scaler.scale(loss).backward()
        if (step in (1, 2) and rank == 0) or (step == 4 and rank == size - 1):
            mine[0].grad[0] = np.nan
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
    return {"scales": scales, "stats": scaler.stats()}


def timeout(rank, size):
    """Rank 1 leaves at once; rank 0's next collective must fail within its timeout."""
    if rank == 1:
        return {"left": True}
    try:
        dist.all_reduce(np.ones(1), "sum")
    except RuntimeError as error:
        return {"error": str(error)}
    return {"error": None}


def main():
    case = sys.argv[1]
    dist.init_process_group(sys.argv[3] if len(sys.argv) > 3 else "mpi",
                            timeout=float(sys.argv[2]) if len(sys.argv) > 2 else 60.0)
    rank, size = dist.get_rank(), dist.get_world_size()
    result = globals()[case](rank, size)
    print("RESULT " + json.dumps({"rank": rank, "size": size, **result}), flush=True)
    # torch's gloo group left to the interpreter's exit aborted it now and then ("terminate called
    # without an active exception", one run in four here) after the result was out
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
