"""python -m ampc demo --distributed, under `mpirun -n N`: the digits MLP trained data-parallel with
AMP float16 and a GradScaler, each rank on its share of every batch. Rank 0 first trains alone
(the others wait) for the speed-up's baseline; then every rank trains, and rank 0 prints what
each rank ended with (scale, skipped steps, a checksum of its parameters) and whether they agree."""

import os
import time

import numpy as np

import ampc
from ampc import distributed as dist
from ampc._demo import RECIPES, digits_split, mlp, training_step

F = ampc.nn.functional


def _train(data, epochs, batch_size, rank, size, group, seed, inject_inf_at):
    """Seconds per epoch and the final (scale, skipped, checksum) of one data-parallel run."""
    x_train, y_train = data[0], data[1]
    ampc.manual_seed(seed + rank)  # different on each rank: DataParallel broadcasts rank 0's
    model = dist.DataParallel(mlp(), group=group)
    optimizer = ampc.optim.AdamW(list(model.parameters()), lr=2e-3)
    scaler = ampc.GradScaler("cpu")
    _, dtype, _ = RECIPES[2]
    steps = 0
    began = time.perf_counter()
    for epoch in range(epochs):
        order = np.random.default_rng(seed * 1000 + epoch).permutation(len(x_train))
        for start in range(0, len(x_train), batch_size):
            batch = order[start:start + batch_size][rank::size]  # this rank's share of the batch
            def loss_of(overflow=steps == inject_inf_at and rank == size - 1):
                loss = F.cross_entropy(model(x_train[batch]), y_train[batch])
                return loss * float("inf") if overflow else loss  # one rank overflows: every rank must skip

            training_step(loss_of, optimizer, scaler, "cpu", dtype)
            steps += 1
    seconds = (time.perf_counter() - began) / epochs
    checksum = float(sum(np.asarray(p.data, np.float64).sum() for p in model.parameters()))
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


def run(args):
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
    data = digits_split(args.seed)
    batch = args.batch_size or 64
    alone = MPI.COMM_WORLD.Split(0 if rank == 0 else MPI.UNDEFINED, 0)
    baseline = None
    if rank == 0:
        baseline, _ = _train(data, args.epochs, batch, 0, 1, dist.ProcessGroup(alone), args.seed, None)
    world.barrier()
    seconds, final = _train(data, args.epochs, batch, rank, size, world, args.seed, inject_inf_at=3)
    finals = MPI.COMM_WORLD.gather(final, root=0)
    if rank == 0:
        print(f"ampc {ampc.__version__} demo --distributed: the digits MLP, AMP fp16 + GradScaler, {size} ranks over "
              f"MPI, global batch {batch}, {args.epochs} epochs; inf injected into rank {size - 1}'s loss at step 3")
        print("| rank | final scale | skipped steps | parameter checksum |")
        print("| --- | --- | --- | --- |")
        for r, (scale, skipped, checksum) in enumerate(finals):
            print(f"| {r} | {scale:g} | {skipped} | {checksum!r} |")
        agree = all(f == finals[0] for f in finals)
        print(f"ranks agree: {'yes' if agree else 'NO'}; epoch time {baseline:.3f} s on 1 rank, {seconds:.3f} s on "
              f"{size}: {baseline / seconds:.2f}x")
        return 0 if agree else 1
    return 0
