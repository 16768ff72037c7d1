"""python -m ampc demo --distributed: data-parallel training with AMP float16 and a GradScaler, an
inf injected into the last rank's loss so that every rank must skip that step. Under `mpirun -n N`
the ranks are MPI's, on the CPU; under `torchrun --nproc_per_node=N` they are torch.distributed's,
each on its GPU over NCCL (gloo on the CPU with --device cpu or without a GPU).

- ``--model mlp`` (the default): the digits MLP, each rank on its share of every batch. Rank 0 first
  trains alone (the others wait) for the speed-up's baseline; then every rank trains, and rank 0
  prints what each rank ended with (scale, skipped steps, a checksum of its parameters) and whether
  they agree.
- ``--model gpt2`` / ``--model resnet50``: timed steps on random data, ``--batch-size`` samples a
  rank (weak scaling), the median of ``--steps`` after ``--warmup`` (the inf at the first step):
  on rank 0 alone, then on every rank; with ``--compare-torch`` (torchrun on GPUs) the same model and
  recipe in torch's DistributedDataParallel with torch's GradScaler, in the same run. The table:
  step time, samples a second, scaling efficiency (one rank's step time over N ranks'), skipped
  steps, final scale, and whether the ranks' parameters agree bit for bit.
"""

import gc
import os
import time

import numpy as np

import ampc
from ampc import distributed as dist
from ampc.cli import demo_torch
from ampc.cli.workloads import (RECIPES, digits_split, mlp, synchronize, synthetic_batch, synthetic_loss,
                                synthetic_model, training_step)

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
    checksum = _checksum(ampc._C._to_device(p.data, -1) for p in model.parameters())
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
    agree = _agree(finals)
    print(f"ranks agree: {'yes' if agree else 'NO'}; epoch time {baseline:.3f} s on 1 rank, {seconds:.3f} s on "
          f"{size}: {baseline / seconds:.2f}x")
    return 0 if agree else 1


def _agree(finals):
    return all(tuple(f) == tuple(finals[0]) for f in finals)


def _checksum(values):
    """The float64 sum of every parameter's elements: equal on two ranks when their parameters are."""
    return float(sum(np.asarray(v, np.float64).sum() for v in values))


def _each_rank(world, row):
    """Every rank's row of numbers, on every rank (an all-reduce of a table with one row filled a rank:
    the float64 values arrive unchanged)."""
    rows = np.zeros((world.size(), len(row)), np.float64)
    rows[world.rank()] = row
    world.all_reduce(rows, "sum")
    return rows.tolist()


def _data_parallel_steps(kind, args, group, index, inject_at):
    """ampc's data-parallel AMP float16 training of kind over group (DataParallel: rank 0's parameters,
    the gradients averaged), on this rank's own random batch on device index: (the median step's
    seconds, (final scale, skipped steps, parameter checksum))."""
    rank, size = group.rank(), group.size()
    device_type = "cpu" if index < 0 else "cuda"
    ampc.manual_seed(args.seed + rank)  # different on each rank: DataParallel broadcasts rank 0's
    model, optimizer = synthetic_model(kind, index, args.seq_len, args.channels_last)
    model = dist.DataParallel(model, group=group)
    scaler = ampc.GradScaler(device_type)
    x, y = synthetic_batch(kind, _batch(args), index, args.image_size, args.seq_len, seed=args.seed + 1 + rank,
                           channels_last=args.channels_last)
    times = []
    for step in range(args.warmup + args.steps):
        synchronize(index)
        began = time.perf_counter()

        def loss_of(overflow=step == inject_at and rank == size - 1):
            loss = synthetic_loss(kind, model, x, y)
            return loss * float("inf") if overflow else loss  # one rank overflows: every rank must skip

        training_step(loss_of, optimizer, scaler, device_type, ampc.float16)
        synchronize(index)
        if step >= args.warmup:
            times.append(time.perf_counter() - began)
    stats = scaler.stats()
    checksum = _checksum(ampc._C._to_device(p.data, -1) for p in model.parameters())
    return float(np.median(times)), (stats["scale"], stats["skipped_steps"], checksum)


def _torch_data_parallel_steps(torch, kind, args, group, index, inject_at):
    """_data_parallel_steps in torch: DistributedDataParallel over the torch process group (None: the
    world) and torch's GradScaler, on the GPU index. Skipped steps are counted where the scale fell."""
    import torch.distributed as td

    rank, size = td.get_rank(group), td.get_world_size(group)
    device = torch.device("cuda", index)
    torch.manual_seed(args.seed + rank)  # DistributedDataParallel broadcasts rank 0's
    model, optimizer = demo_torch.torch_model(torch, kind, device, args.seq_len, args.channels_last)
    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[index], process_group=group)
    scaler = torch.amp.GradScaler("cuda")
    x, y = (torch.from_dlpack(a) for a in synthetic_batch(
        kind, _batch(args), index, args.image_size, args.seq_len, seed=args.seed + 1 + rank,
        channels_last=args.channels_last))
    times, skipped = [], 0

    def loss_of():
        loss = demo_torch.torch_loss(torch, kind, model, x, y)
        return loss * float("inf") if step == inject_at and rank == size - 1 else loss

    for step in range(args.warmup + args.steps):
        before = scaler.get_scale()  # read outside the timed step: it waits for the GPU
        torch.cuda.synchronize(device)
        began = time.perf_counter()
        demo_torch.torch_training_step(torch, loss_of, optimizer, scaler, "cuda", torch.float16)
        torch.cuda.synchronize(device)
        if step >= args.warmup:
            times.append(time.perf_counter() - began)
        skipped += scaler.get_scale() < before  # a skipped step halves the scale (no growth this early)
    checksum = _checksum(p.detach().double().cpu().numpy() for p in model.module.parameters())
    return float(np.median(times)), (scaler.get_scale(), skipped, checksum)


def _batch(args):
    return args.batch_size or (64 if args.model == "resnet50" else 8)


def _alone_then_together_steps(steps_of, world, alone, inject_at=0):
    """steps_of(group, inject_at) on rank 0 alone (alone: a group of rank 0 only, None elsewhere;
    nothing injected), then on every rank of world with the inf at step inject_at: (one rank's
    seconds, N ranks' (the slowest rank's), every rank's final (scale, skipped, checksum))."""
    single = steps_of(alone, None)[0] if world.rank() == 0 else 0.0
    world.barrier()
    seconds, final = steps_of(world, inject_at)
    timing = np.array([single, seconds])
    world.all_reduce(timing, "max")
    return timing[0], timing[1], _each_rank(world, final)


def _rate(samples_per_second):
    """One decimal, or two significant digits below 1 (a batch-1 GPT-2 step on a busy CPU takes
    seconds: 0.08 samples/s is not 0.1, nor 0.0)."""
    return f"{samples_per_second:.1f}" if samples_per_second >= 1 else f"{samples_per_second:.2g}"


def _synthetic_table(args, rows, size, engine):
    """Rank 0's table of the synthetic runs: rows of (library, one rank's seconds, N ranks', finals)."""
    kind, batch = args.model, _batch(args)
    what = (f"GPT-2 small (124M), {batch} x {args.seq_len} random tokens a rank, AdamW" if kind == "gpt2" else
            f"ResNet-50, {batch} random {args.image_size}x{args.image_size} images a rank, SGD momentum 0.9")
    print(f"ampc {ampc.__version__} demo --distributed: {what}; AMP fp16 + GradScaler, {size} ranks over {engine}; "
          f"median of {args.steps} steps after {args.warmup} warm-up; inf injected into rank {size - 1}'s loss at "
          f"the first step (the {size}-rank runs)")
    print("| library | ranks | step ms | samples/s | scaling efficiency | skipped steps | final scale | "
          "ranks' parameters agree |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    status = 0
    for library, single, together, finals in rows:
        agree = _agree(finals)
        status |= not agree
        scale, skipped, _ = finals[0]
        print(f"| {library} | 1 | {1e3 * single:.1f} | {_rate(batch / single)} | — | — | — | — |")
        print(f"| {library} | {size} | {1e3 * together:.1f} | {_rate(size * batch / together)} | "
              f"{single / together:.3f} | {int(skipped)} | {scale:g} | {'yes' if agree else 'NO'} |")
    if len(rows) == 2:
        print(f"torch's step time / ampc's: {rows[1][1] / rows[0][1]:.2f}x on 1 rank, "
              f"{rows[1][2] / rows[0][2]:.2f}x on {size}")
    return status


def _run_synthetic(args, world, alone, index, engine, torch_alone):
    """ampc's rows (and torch's, with --compare-torch under torchrun on GPUs); rank 0 prints the table."""
    def ampc_steps(group, inject_at):
        return _data_parallel_steps(args.model, args, group, index, inject_at)

    rows = [("ampc", *_alone_then_together_steps(ampc_steps, world, alone))]
    gc.collect()
    if args.compare_torch and (torch_alone is False or index < 0):
        if world.rank() == 0:
            print("--compare-torch: torch's DistributedDataParallel rows are measured under torchrun on GPUs")
    elif args.compare_torch and (why := demo_torch.no_torch_model(args.model)) is not None:
        if world.rank() == 0:  # the same answer on every rank: none of them starts torch's rows
            print(why)
    elif args.compare_torch:
        import torch

        def torch_steps(group, inject_at):  # torch's own groups: the world's (None) or rank 0's
            return _torch_data_parallel_steps(torch, args.model, args, None if group is world else torch_alone,
                                              index, inject_at)

        rows.append(("torch DDP", *_alone_then_together_steps(torch_steps, world, alone)))
        torch.cuda.empty_cache()
    return _synthetic_table(args, rows, world.size(), engine) if world.rank() == 0 else 0


def _join(args):
    """This process's place in the job that launched it: (world, alone, index, engine, torch_alone):
    alone a group of rank 0 only (None on the other ranks) for the one-rank baseline, index this
    rank's GPU (-1: the CPU), torch_alone alone's torch process group (False under MPI)."""
    if _launched_by_torchrun():
        import torch.distributed as td

        local = int(os.environ.get("LOCAL_RANK", "0"))
        on_gpu = args.device != "cpu" and ampc.cuda.is_available()
        if on_gpu:
            import torch

            torch.cuda.set_device(local)  # NCCL's buffers of this rank (host arrays it reduces) go there
        world = dist.init_process_group("nccl" if on_gpu else "gloo-via-torch")
        if not on_gpu:
            _share_the_cores(int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
        torch_alone = td.new_group([0])  # every rank takes part in making it
        alone = dist.TorchProcessGroup(torch_alone) if world.rank() == 0 else None
        engine = f"NCCL (cuda:{local} on rank 0)" if on_gpu else "gloo (the CPU)"
        return world, alone, local if on_gpu else -1, engine, torch_alone
    from mpi4py import MPI

    world = dist.init_process_group("mpi")
    # a rank's threads: the cores mpirun bound it to, or its share of the machine's when it bound
    # none (--oversubscribe); more only fight the other ranks
    cores = len(os.sched_getaffinity(0))
    local = MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED).Get_size()
    _share_the_cores(1 if cores < (os.cpu_count() or cores) else local, cores)
    alone = MPI.COMM_WORLD.Split(0 if world.rank() == 0 else MPI.UNDEFINED, 0)
    return world, dist.ProcessGroup(alone) if world.rank() == 0 else None, -1, "MPI", False


def _share_the_cores(ranks, cores=None):
    """ampc's and OpenBLAS's threads: this rank's share of cores (default: the machine's)."""
    threads = max(1, (cores or os.cpu_count() or 1) // ranks)
    ampc.set_num_threads(threads)
    _limit_blas_threads(threads)


def run(args):
    world, alone, index, engine, torch_alone = _join(args)
    try:
        if args.model != "mlp":
            return _run_synthetic(args, world, alone, index, engine, torch_alone)
        data, batch = digits_split(args.seed), args.batch_size or 64

        def mlp_epochs(group, inject_at):
            return _train(data, args.epochs, batch, group.rank(), group.size(), group, args.seed, inject_at, index)

        baseline, seconds, finals = _alone_then_together_steps(mlp_epochs, world, alone, inject_at=3)
        return _report(finals, world.size(), engine, args, baseline, seconds) if world.rank() == 0 else 0
    finally:
        dist.destroy_process_group()
