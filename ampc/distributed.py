"""ampc.distributed: data-parallel and sharded training on an existing engine, with every rank
agreeing on the loss scale and on which steps to skip.

Two engines: MPI through mpi4py (``init_process_group("mpi")``, or an mpi4py communicator adopted
with ``comm=``) for NumPy training on the CPU, and torch.distributed (``"nccl"`` for GPU buffers,
``"gloo-via-torch"`` for the CPU, or a torch process group adopted with ``group=``), which takes any
DLPack array through torch.from_dlpack without a copy. Collectives run in place; float16 and
bfloat16 reduce in float32 and round once where the engine has no 16-bit floats (MPI, gloo). Each
waits at most ``timeout`` seconds (30 min by default, as torch's): a rank that died or stopped
answering turns into a RuntimeError on the others rather than a hang.

- ``DataParallel(model)``: parameters and buffers broadcast from rank 0 at the start; after each
  ``backward()`` the gradients are averaged across ranks in buckets of about 25 MB, as torch's DDP
  does, so a GradScaler needs no change: every rank holds the same gradients.
- ``ShardedGradScaler``: for optimizers that hold a shard each (ZeRO-1): each rank unscales its own
  gradients, and the ranks agree on found_inf (all-reduced with MAX and waited for before it is
  read) before any of them steps; a rank with no gradients takes part.
"""

import time

import numpy as np

from ampc import _C, autograd
from ampc.amp import GradScaler
from ampc.nn.modules import Module

__all__ = ["DataParallel", "ProcessGroup", "ShardedGradScaler", "TorchProcessGroup", "all_reduce", "barrier", "broadcast",
           "destroy_process_group", "get_rank", "get_world_size", "init_process_group", "is_initialized"]

DEFAULT_TIMEOUT = 1800.0
_OPS = ("sum", "max", "min", "avg")
_default = None


class ProcessGroup:
    """A set of ranks and the engine that connects them (an mpi4py communicator)."""

    def __init__(self, comm, timeout=DEFAULT_TIMEOUT):
        from mpi4py import MPI

        self._mpi, self.comm, self.timeout, self.backend = MPI, comm, float(timeout), "mpi"

    def rank(self):
        """This process's rank in the group."""
        return self.comm.Get_rank()

    def size(self):
        """The number of ranks in the group."""
        return self.comm.Get_size()

    def _wait(self, request, what):
        """Wait for a non-blocking collective, at most self.timeout seconds. MPI moves a
        non-blocking collective on only inside calls like Test, a round at a time: poll without
        pause for the first 0.1 s (sleeping between polls made a 2-rank all-reduce take 30 ms),
        then with growing pauses."""
        start = time.monotonic()
        busy_until, deadline = start + 0.1, start + self.timeout
        pause = 1e-5
        while not request.Test():
            now = time.monotonic()
            if now > deadline:
                raise RuntimeError(f"ampc.distributed: {what} did not complete within {self.timeout:g} s on rank "
                                   f"{self.rank()} of {self.size()}: another rank died or stopped answering")
            if now > busy_until:
                time.sleep(pause)
                pause = min(pause * 2, 1e-2)

    def all_reduce(self, array, op="sum"):
        """Reduce array across the ranks in place (op: sum, max, min, avg)."""
        op = _check_op(op, array)
        work = _working_copy(array, "all_reduce")
        mpi_op = {"sum": self._mpi.SUM, "avg": self._mpi.SUM, "max": self._mpi.MAX, "min": self._mpi.MIN}[op]
        self._wait(self.comm.Iallreduce(self._mpi.IN_PLACE, work, op=mpi_op), f"all_reduce({op})")
        if op == "avg":
            work /= self.size()
        _write_back(work, array)
        return array

    def broadcast(self, array, src=0):
        """array from rank src, in place on every other rank."""
        work = _working_copy(array, "broadcast")
        self._wait(self.comm.Ibcast(work, root=src), "broadcast")
        _write_back(work, array)
        return array

    def barrier(self):
        """Wait until every rank has reached this call."""
        self._wait(self.comm.Ibarrier(), "barrier")

    def average_gradients(self, grads, bucket_bytes):
        """Average NumPy gradients across the ranks in place, in float32 buckets of bucket_bytes."""
        size = self.size()
        for bucket in _buckets(grads, bucket_bytes):
            flat = np.concatenate([np.asarray(g, np.float32).ravel() for g in bucket])
            self.all_reduce(flat, "sum")
            flat /= size
            start = 0
            for g in bucket:  # back in place: each gradient keeps its dtype and its parameter's layout
                np.copyto(g, flat[start:start + g.size].reshape(g.shape), casting="unsafe")
                start += g.size


class TorchProcessGroup:
    """A torch.distributed group (NCCL for GPU buffers, gloo for the CPU) doing ampc's collectives
    on any DLPack array (NumPy, CuPy, torch, ampc), through torch views of its memory."""

    def __init__(self, group=None):
        import torch
        import torch.distributed as td

        self._torch, self._td, self.group = torch, td, group
        self.backend = str(td.get_backend(group))

    def rank(self):
        """This process's rank in the group."""
        return self._td.get_rank(self.group)

    def size(self):
        """The number of ranks in the group."""
        return self._td.get_world_size(self.group)

    def _views(self, array):
        """(the tensor the engine reduces, the torch view of array to copy it back into, or None)."""
        torch = self._torch
        view = self._as_torch(array)
        work = view
        if self.backend == "nccl" and not view.is_cuda:
            work = view.cuda()
        elif self.backend != "nccl" and view.dtype in (torch.float16, torch.bfloat16):
            work = view.float()
        return work, (view if work is not view else None)

    def _as_torch(self, array):
        """array as a torch tensor sharing its memory. NumPy cannot export ml_dtypes' bfloat16
        through DLPack: those go as their bits (uint16), viewed back as torch's bfloat16."""
        torch = self._torch
        if isinstance(array, torch.Tensor):
            return array
        if isinstance(array, np.ndarray) and array.dtype.name == "bfloat16":
            return torch.from_numpy(array.view(np.uint16)).view(torch.bfloat16)
        return torch.from_dlpack(array)

    def _op(self, op):
        ops = self._td.ReduceOp
        return {"sum": ops.SUM, "avg": ops.SUM, "max": ops.MAX, "min": ops.MIN}[op]

    def all_reduce(self, array, op="sum"):
        """Reduce array across the ranks in place through torch.distributed (op: sum, max, min, avg)."""
        op = _check_op(op, array)
        work, back = self._views(array)
        self._td.all_reduce(work, self._op(op), group=self.group)
        if op == "avg":
            work.div_(self.size())
        if back is not None:
            back.copy_(work)
        return array

    def broadcast(self, array, src=0):
        """array from rank src, in place on every other rank, through torch.distributed."""
        work, back = self._views(array)
        self._td.broadcast(work, src, group=self.group)
        if back is not None:
            back.copy_(work)
        return array

    def barrier(self):
        """Wait until every rank has reached this call."""
        self._td.barrier(group=self.group)

    def average_gradients(self, grads, bucket_bytes):
        """Average gradients (any DLPack arrays) in place, in float32 buckets of bucket_bytes."""
        torch, size = self._torch, self.size()
        for bucket in _buckets(grads, bucket_bytes):
            views = [self._as_torch(g) for g in bucket]
            flat = torch.cat([v.reshape(-1).float() for v in views])
            self.all_reduce(flat, "sum")
            flat.div_(size)
            start = 0
            for v in views:
                v.copy_(flat[start:start + v.numel()].view(v.shape))
                start += v.numel()


def _check_op(op, array=None):
    name = getattr(op, "name", op)
    name = str(name).lower()
    if name not in _OPS:
        raise ValueError(f"all_reduce: op must be one of {', '.join(_OPS)}, got {op!r}")
    if name == "avg" and array is not None and not _floating(array):
        raise TypeError(f"all_reduce: avg needs a floating array, got {array.dtype}")
    return name


def _floating(array):
    try:
        return _C.as_dtype(array.dtype) in (np.float16, np.float32, np.float64, _C.bfloat16)
    except (TypeError, ValueError):
        return False


def _working_copy(array, what):
    """array itself when MPI can reduce it in place, else a float32 copy (16-bit floats)."""
    if not isinstance(array, np.ndarray):
        raise TypeError(f"{what}: the MPI backend takes NumPy arrays, got {type(array).__name__}")
    if not array.flags.c_contiguous or not array.flags.writeable:
        raise ValueError(f"{what}: the array must be C-contiguous and writable")
    if array.dtype in (np.float16, _C.bfloat16):
        return _C.cast(array, np.float32)
    return array


def _write_back(work, array):
    if work is not array:
        _C.cast(work, out=array)


def init_process_group(backend="mpi", *, comm=None, group=None, timeout=DEFAULT_TIMEOUT, init_method=None,
                       rank=None, world_size=None):
    """Start the default group and return it: backend "mpi" (mpi4py's COMM_WORLD, or comm), "nccl"
    or "gloo-via-torch" (torch.distributed, started here with init_method / rank / world_size, torch's
    environment variables by default, or one process alone when none are set; or a torch process
    group adopted as group)."""
    global _default
    if _default is not None:
        raise RuntimeError("trying to initialize the default process group twice!")
    if backend == "mpi":
        if comm is None:
            from mpi4py import MPI

            comm = MPI.COMM_WORLD
        _default = ProcessGroup(comm, timeout)
        return _default
    if backend not in ("nccl", "gloo-via-torch", "gloo"):
        raise ValueError(f"init_process_group: backend must be 'mpi', 'nccl' or 'gloo-via-torch', got {backend!r}")
    import datetime
    import os

    import torch.distributed as td

    if group is None and not td.is_initialized():
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast stays off (see the device notes)
        if init_method is None and "MASTER_ADDR" not in os.environ:
            init_method, rank, world_size = f"tcp://127.0.0.1:{_free_port()}", 0, 1  # one process alone
        td.init_process_group("nccl" if backend == "nccl" else "gloo", init_method=init_method,
                              rank=-1 if rank is None else rank,  # torch's "from the environment"
                              world_size=-1 if world_size is None else world_size,
                              timeout=datetime.timedelta(seconds=timeout))
    _default = TorchProcessGroup(group)
    return _default


def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def is_initialized():
    """True once init_process_group has run (and destroy_process_group has not)."""
    return _default is not None


def destroy_process_group():
    """Forget the default process group (and, for one made through torch.distributed, destroy it)."""
    global _default
    if isinstance(_default, TorchProcessGroup) and _default.group is None:
        _default._td.destroy_process_group()
    _default = None


def _group(group):
    group = group if group is not None else _default
    if group is None:
        raise RuntimeError("Default process group has not been initialized, please make sure to call "
                           "init_process_group.")
    if not isinstance(group, (ProcessGroup, TorchProcessGroup)):
        raise TypeError(f"group must be a process group (new_group's or init_process_group's), got "
                        f"{type(group).__name__}")
    return group


def get_rank(group=None):
    """This process's rank in the group (the default group when None)."""
    return _group(group).rank()


def get_world_size(group=None):
    """The number of ranks in the group (the default group when None)."""
    return _group(group).size()


def all_reduce(array, op="sum", group=None):
    """Reduce array across the group's ranks, in place (op: sum, max, min, avg)."""
    return _group(group).all_reduce(array, op)


def broadcast(array, src=0, group=None):
    """array from rank src, in place on every other rank."""
    return _group(group).broadcast(array, src)


def barrier(group=None):
    """Wait until every rank of the group has reached this call."""
    _group(group).barrier()


# -- data parallel -----------------------------------------------------------------------------


class DataParallel(Module):
    """model, its gradients averaged across the group's ranks after each backward() (torch's
    DistributedDataParallel): parameters and buffers broadcast from rank 0 here, then the gradients
    gathered into float32 buckets of about bucket_cap_mb, one all-reduce a bucket."""

    def __init__(self, module, group=None, bucket_cap_mb=25, broadcast_buffers=True):
        super().__init__()
        self.module = module
        object.__setattr__(self, "_group", _group(group))
        object.__setattr__(self, "bucket_bytes", int(bucket_cap_mb * 2**20))
        object.__setattr__(self, "_sync", True)
        for p in module.parameters():
            self._group.broadcast(p.data, 0)
            p.bump_version()
        if broadcast_buffers:
            for b in module.buffers():
                if isinstance(b, np.ndarray) and b.ndim > 0:
                    self._group.broadcast(b, 0)
        object.__setattr__(self, "_hook", autograd.register_post_backward_hook(self._average))

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def no_sync(self):
        """A region whose backward() passes only accumulate (torch's no_sync): the next backward
        outside it averages what they added up."""
        ddp = self

        class _NoSync:
            def __enter__(self):
                object.__setattr__(ddp, "_sync", False)

            def __exit__(self, *exc):
                object.__setattr__(ddp, "_sync", True)
                return False

        return _NoSync()

    def _average(self, touched):
        ours = [p for p in self.module.parameters() if p.grad is not None]
        if self._sync and {id(p) for p in touched} & {id(p) for p in ours}:
            self._group.average_gradients([p.grad for p in ours], self.bucket_bytes)


def _buckets(grads, bucket_bytes):
    """Consecutive gradients in groups of about bucket_bytes of float32."""
    bucket, used = [], 0
    for g in grads:
        n = 4 * int(np.prod(g.shape))
        if bucket and used + n > bucket_bytes:
            yield bucket
            bucket, used = [], 0
        bucket.append(g)
        used += n
    if bucket:
        yield bucket


# -- sharded optimizers ------------------------------------------------------------------------


class _Probe:
    """An optimizer with one zero gradient: what a rank without gradients unscales, so that it
    records an inf check like the others and its update() moves the scale as theirs do."""

    def __init__(self):
        param = _C.Parameter(np.zeros(1, np.float32))
        param.grad = np.zeros(1, np.float32)
        self.param_groups = [{"params": [param]}]


class ShardedGradScaler(GradScaler):
    """A GradScaler for sharded optimizers: ``ShardedGradScaler(device, ..., process_group=None)``
    with GradScaler's arguments. After each rank unscales its shard, found_inf is all-reduced with
    MAX across the group (a blocking collective: waited for before step reads it), so every rank
    skips the same steps and keeps the same scale; hysteresis and the scale bounds follow."""

    def __init__(self, *args, process_group=None, **kwargs):
        super().__init__(*args, **kwargs)
        self._process_group = process_group
        self._unscaled = {}  # id(optimizer) -> the optimizer whose found_inf the ranks agreed on
        self._probe = None

    def unscale_(self, optimizer, *, max_norm=None, norm_type=2.0, defer=False):
        if max_norm is not None:
            raise NotImplementedError("ShardedGradScaler.unscale_: clipping needs the norm over every shard; clip "
                                      "after unscale_ with the norm all-reduced")
        result = super().unscale_(optimizer)
        checked = optimizer
        found = self._found_inf_per_device(optimizer)
        if not found:  # no gradients on this rank: still take part
            if self._probe is None:
                self._probe = _Probe()
            checked = self._probe
            super().unscale_(checked)
            found = self._found_inf_per_device(checked)
        flag = np.array([max(_read_flag(v) for v in found.values())], np.float32)
        _group(self._process_group).all_reduce(flag, "max")
        self._set_found_inf(checked, float(flag[0]))  # found holds copies: the flags are written in the scaler
        self._unscaled[id(optimizer)] = optimizer
        return result

    def step(self, optimizer, *args, **kwargs):
        if not self.is_enabled():
            return super().step(optimizer, *args, **kwargs)
        if id(optimizer) not in self._unscaled:
            self.unscale_(optimizer)
        if not self._found_inf_per_device(optimizer):
            return None  # nothing of this shard to step; the probe carried the agreed check
        return super().step(optimizer, *args, **kwargs)

    def update(self, new_scale=None):
        super().update(new_scale)
        self._unscaled.clear()


def _read_flag(view):
    return float(np.asarray(view if isinstance(view, np.ndarray) else _C._to_device(view, -1)))


