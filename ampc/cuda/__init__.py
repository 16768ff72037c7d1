"""ampc.cuda: devices, memory statistics and streams, named as in torch.cuda.

Every query answers quietly where there is no GPU, no driver or no ampc._cuda:
is_available() is False, device_count() is 0, memory counters are 0,
get_device_name() is None and get_device_capability() is (0, 0).
"""

from collections import namedtuple

from ampc import _C

__all__ = [
    "DeviceProperties",
    "Stream",
    "current_stream",
    "device_count",
    "get_device_capability",
    "get_device_name",
    "get_device_properties",
    "is_available",
    "is_bf16_supported",
    "is_built",
    "max_memory_allocated",
    "memory_allocated",
    "memory_reserved",
    "reset_peak_memory_stats",
    "stream",
    "synchronize",
]

DeviceProperties = namedtuple("DeviceProperties", "name major minor multi_processor_count total_memory")


def is_built():
    """True if ampc._cuda was built and loads."""
    return _C._cuda_build_info()[0]


def device_count():
    """The number of CUDA GPUs this process sees; 0 without a driver, a GPU or ampc._cuda."""
    return _C._cuda_device_count()


def is_available():
    """True if ampc can run on a CUDA GPU here (ampc._cuda built, a driver and a GPU)."""
    try:
        return device_count() > 0
    except RuntimeError:
        return False


def _index(device):
    """A device index from None (device 0), an int, 'cuda', 'cuda:N' or a torch.device."""
    if device is None:
        return 0
    if isinstance(device, int) and not isinstance(device, bool):
        return device
    if isinstance(device, str):
        kind, _, index = device.partition(":")
        if kind == "cuda" and (not index or index.isdigit()):
            return int(index) if index else 0
        raise ValueError(f"expected a CUDA device such as 'cuda' or 'cuda:1', got {device!r}")
    index = getattr(device, "index", None)
    if getattr(device, "type", None) == "cuda":
        return 0 if index is None else index
    raise TypeError(f"expected a device index, 'cuda:N' or a torch.device, got {type(device).__name__}")


def get_device_properties(device=None):
    """The device's name, compute capability (major, minor), multiprocessor count and total memory."""
    p = _C._cuda_device_properties(_index(device))
    major, minor = p["capability"]
    return DeviceProperties(p["name"], major, minor, p["multiprocessors"], p["total_memory"])


def get_device_name(device=None):
    """The device's name, such as 'NVIDIA H100 80GB HBM3'; None where there is no GPU."""
    if device_count() == 0:
        return None
    return get_device_properties(device).name


def get_device_capability(device=None):
    """The device's compute capability as (major, minor); (0, 0) where there is no GPU."""
    if device_count() == 0:
        return (0, 0)
    p = get_device_properties(device)
    return (p.major, p.minor)


def is_bf16_supported():
    """True if GPU 0 computes in bfloat16 natively (compute capability 8.0 or newer)."""
    return get_device_capability() >= (8, 0)


def memory_allocated(device=None):
    """Bytes held by live ampc arrays on the device (each rounded up to 512, as torch counts)."""
    return _C._cuda_memory_stats(_index(device))["allocated"]


def max_memory_allocated(device=None):
    """The most bytes live ampc arrays held on the device since the start or the last reset_peak_memory_stats."""
    return _C._cuda_memory_stats(_index(device))["peak"]


def memory_reserved(device=None):
    """Bytes ampc's pool holds from the driver, in use or cached for reuse."""
    return _C._cuda_memory_stats(_index(device))["reserved"]


def reset_peak_memory_stats(device=None):
    """Start max_memory_allocated's count again from what is allocated now."""
    _C._cuda_reset_peak_memory(_index(device))


def synchronize(device=None):
    """Wait until every kernel queued on the device has finished."""
    _C._cuda_synchronize(_index(device))


def _handle(s):
    """The cudaStream_t of an ampc, torch or CuPy stream, or of a raw int handle."""
    if isinstance(s, int) and not isinstance(s, bool):
        handle = s
    else:
        handle = getattr(s, "cuda_stream", None)  # ampc and torch
        if handle is None:
            handle = getattr(s, "ptr", None)  # CuPy
        if not isinstance(handle, int):
            raise TypeError(
                f"expected a torch or CuPy stream, an ampc.cuda.Stream or an int handle, got {type(s).__name__}"
            )
    if handle < 0:
        raise ValueError(f"a stream handle is a non-negative int, got {handle}")
    return handle


class Stream:
    """A CUDA stream ampc can run on: its handle (cudaStream_t as an int) and device.

    Handles 0 and 1 name the legacy default stream, 2 the per-thread default
    stream; these belong to every device (device is None).
    """

    __slots__ = ("cuda_stream", "device", "_owner")

    def __init__(self, cuda_stream, device=None, _owner=None):
        self.cuda_stream = 0 if cuda_stream == 1 else cuda_stream
        self.device = device
        self._owner = _owner

    def __eq__(self, other):
        return isinstance(other, Stream) and other.cuda_stream == self.cuda_stream and other.device == self.device

    def __hash__(self):
        return hash((self.cuda_stream, self.device))

    def __repr__(self):
        return f"ampc.cuda.Stream(cuda_stream={self.cuda_stream:#x}, device={self.device})"


def current_stream(device=None):
    """The stream ampc queues this thread's work for `device` on."""
    index = _index(device)
    handle, owner = _C._cuda_current_stream(index)
    return Stream(handle, None if handle <= 2 else index, owner)


class stream:
    """Run ampc's GPU work in this thread on `s` inside the block (None: leave it as it is).

    `s` is a torch.cuda.Stream, a cupy.cuda.Stream, an ampc.cuda.Stream or a raw
    cudaStream_t. ampc passes it to every DLPack producer it reads from, so the
    producer's pending work is ordered before ampc's. Arrays ampc allocates inside
    the block keep `s` alive and are freed on it.
    """

    def __init__(self, s):
        self.stream = s
        self._previous = None

    def __enter__(self):
        if self.stream is None:
            return self.stream
        handle = _handle(self.stream)
        device = _C._cuda_stream_device(handle) if handle > 2 else -1
        owner = self.stream._owner if isinstance(self.stream, Stream) else self.stream
        self._previous = _C._cuda_swap_stream(handle, device, owner)
        return self.stream

    def __exit__(self, *exc):
        if self._previous is not None:
            _C._cuda_swap_stream(*self._previous)
            self._previous = None
        return False


from ampc.cuda import amp  # noqa: E402  (the legacy torch.cuda.amp names)
