"""python -m ampc demo --distributed: the digits MLP trained data-parallel with AMP float16 and a
GradScaler, each rank on its share of every batch. Under `mpirun -n N` the ranks are MPI's, on the
CPU; under `torchrun --nproc_per_node=N` they are torch.distributed's, each on its GPU over NCCL
(gloo on the CPU with --device cpu or without a GPU). Rank 0 first trains alone (the others wait)
for the speed-up's baseline; then every rank trains, and rank 0 prints what each rank ended with
(scale, skipped steps, a checksum of its parameters) and whether they agree."""

import os
import time

import numpy as np

import ampc
from ampc import distributed as dist
from ampc._demo import RECIPES, digits_split, mlp, training_step

F = ampc.nn.functional


def _train(data, epochs, batch_size, rank, size, group, seed, inject_inf_at, index=-1):
    """Seconds per epoch and the final (scale, skipped, checksum) of one data-parallel run on device
    index (-1: the CPU)."""
    x_train, y_train = data[0], data[1]
    device_type = "cpu" if index < 0 else "cuda"
    ampc.manual_seed(seed + rank)  # different on each rank: DataParallel broadcasts rank 0's
    model = dist.DataParallel(mlp().to("cpu" if index < 0 else f"cuda:{index}"), group=group)
    optimizer = ampc.optim.AdamW(list(model.parameters()), lr=2e-3)
    scaler = ampc.GradScaler(device_type)
    _, dtype, _ = RECIPES[2]
    steps = 0
    began = time.perf_counter()
    for epoch in range(epochs):
        order = np.random.default_rng(seed * 1000 + epoch).permutation(len(x_train))
        for start in range(0, len(x_train), batch_size):
            batch = order[start:start + batch_size][rank::size]  # this rank's share of the batch
            x, y = x_train[batch], y_train[batch]
            if index >= 0:  # on the host the gathered rows are the batch already: no second copy
                x, y = ampc._C._to_device(x, index), ampc._C._to_device(y, index)

            def loss_of(overflow=steps == inject_inf_at and rank == size - 1):
                loss = F.cross_entropy(model(x), y)
                return loss * float("inf") if overflow else loss  # one rank overflows: every rank must skip

            training_step(loss_of, optimizer, scaler, device_type, dtype)
            steps += 1
    if index >= 0:
        ampc.cuda.synchronize(index)
    seconds = (time.perf_counter() - began) / epochs
    checksum = float(sum(np.asarray(ampc._C._to_device(p.data, -1), np.float64).sum() for p in model.parameters()))
    stats = scaler.stats()
    return seconds, (stats["scale"], stats["skipped_steps"], checksum)


def _limit_blas_threads(n):
    """Set NumPy's OpenBLAS to n threads, as threadpoolctl would (its set_num_threads in the loaded
    library): mpirun binds each rank to its cores, and OpenBLAS's own threads spinning on one core
    made two ranks 20x slower than one. Returns whether it found the library."""
    import ctypes
    import re

    try:
        with open("/proc/self/maps") as maps:
            libraries = set(re.findall(r"(/\S*openblas\S*\.so\S*)", maps.read()))
    except OSError:
        return False
    for path in libraries:
        library = ctypes.CDLL(path)
        for name in ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
                     "openblas_set_num_threads64_", "openblas_set_num_threads"):
            if hasattr(library, name):
                getattr(library, name)(ctypes.c_int(n))
                return True
    return False


def _launched_by_torchrun():
    return "TORCHELASTIC_RUN_ID" in os.environ or all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR"))


def _alone_then_together(args, world, alone, index=-1):
    """Rank 0 trains on its own (in `alone`, a group of rank 0 only; None elsewhere) for the baseline,
    then every rank of `world` together, an inf injected into the last rank's loss at step 3: (the
    baseline's seconds, 0 on other ranks; the seconds together; this rank's final (scale, skipped
    steps, checksum))."""
    data, batch, rank, size = digits_split(args.seed), args.batch_size or 64, world.rank(), world.size()
    baseline = 0.0
    if rank == 0:
        baseline, _ = _train(data, args.epochs, batch, 0, 1, alone, args.seed, None, index)
    world.barrier()
    seconds, final = _train(data, args.epochs, batch, rank, size, world, args.seed, 3, index)
    return baseline, seconds, final


def _report(finals, size, engine, args, baseline, seconds):
    """Rank 0's table: each rank's (scale, skipped steps, checksum), whether they agree, the speed-up;
    the exit status (1 when the ranks disagree)."""
    print(f"ampc {ampc.__version__} demo --distributed: the digits MLP, AMP fp16 + GradScaler, {size} ranks over "
          f"{engine}, global batch {args.batch_size or 64}, {args.epochs} epochs; inf injected into rank "
          f"{size - 1}'s loss at step 3")
    print("| rank | final scale | skipped steps | parameter checksum |")
    print("| --- | --- | --- | --- |")
    for r, (scale, skipped, checksum) in enumerate(finals):
        print(f"| {r} | {scale:g} | {int(skipped)} | {checksum!r} |")
    agree = all(tuple(f) == tuple(finals[0]) for f in finals)
    print(f"ranks agree: {'yes' if agree else 'NO'}; epoch time {baseline:.3f} s on 1 rank, {seconds:.3f} s on "
          f"{size}: {baseline / seconds:.2f}x")
    return 0 if agree else 1


def _run_torch(args):
    """Under torchrun: torch.distributed's ranks, each on the GPU its LOCAL_RANK names (NCCL), or on
    the CPU over gloo. The final states meet through an all-reduce of one row per rank."""
    import torch.distributed as td

    local = int(os.environ.get("LOCAL_RANK", "0"))
    on_gpu = args.device != "cpu" and ampc.cuda.is_available()
    if on_gpu:
        import torch

        torch.cuda.set_device(local)  # NCCL's buffers of this rank (host arrays it reduces) go there
    world = dist.init_process_group("nccl" if on_gpu else "gloo-via-torch")
    rank, size = world.rank(), world.size()
    index = local if on_gpu else -1
    if not on_gpu:
        threads = max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
        ampc.set_num_threads(threads)
        _limit_blas_threads(threads)
    alone = td.new_group([0])  # every rank takes part in making it
    try:
        baseline, seconds, final = _alone_then_together(args, world, dist.TorchProcessGroup(alone) if rank == 0
                                                        else None, index)
        finals = np.zeros((size, 3), np.float64)
        finals[rank] = final
        world.all_reduce(finals, "sum")
        engine = f"NCCL (cuda:{index} on rank 0)" if on_gpu else "gloo (the CPU)"
        return _report(finals.tolist(), size, engine, args, baseline, seconds) if rank == 0 else 0
    finally:
        dist.destroy_process_group()


def run(args):
    if _launched_by_torchrun():
        return _run_torch(args)
    from mpi4py import MPI

    world = dist.init_process_group("mpi")
    rank, size = world.rank(), world.size()
    # a rank's threads: the cores mpirun bound it to, or its share of the machine's when it bound
    # none (--oversubscribe); more only fight the other ranks
    cores = len(os.sched_getaffinity(0))
    local = MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED).Get_size()
    threads = max(1, cores if cores < (os.cpu_count() or cores) else cores // local)
    ampc.set_num_threads(threads)
    _limit_blas_threads(threads)
    alone = MPI.COMM_WORLD.Split(0 if rank == 0 else MPI.UNDEFINED, 0)
    baseline, seconds, final = _alone_then_together(args, world, dist.ProcessGroup(alone) if rank == 0 else None)
    finals = MPI.COMM_WORLD.gather(final, root=0)
    return _report(finals, size, "MPI", args, baseline, seconds) if rank == 0 else 0
