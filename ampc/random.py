"""ampc.random: the random numbers ampc's kernels draw (dropout), named as torch's.

One Philox4x32-10 stream (kernels/philox.h) for the process, shared by the CPU and every GPU: a draw
of n numbers takes the next ceil(n / 4) counters after the seed's, so a program that seeds and
then makes the same calls gets the same masks on the CPU and the GPU. torch keeps a generator per
device; here a draw is the same bits wherever it runs, which is what a CPU-vs-GPU check wants.
"""

import threading

# torch's default seed, so that an unseeded program repeats its numbers run to run as torch's does
_DEFAULT_SEED = 67280421310721
_MASK64 = (1 << 64) - 1

_lock = threading.Lock()
_seed = _DEFAULT_SEED
_offset = 0


def manual_seed(seed):
    """Seed the stream (any int; taken modulo 2^64) and restart it. Returns None."""
    global _seed, _offset
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(f"manual_seed expected an int, got {type(seed).__name__}")
    with _lock:
        _seed = seed & _MASK64
        _offset = 0


def initial_seed():
    """The seed the stream started from."""
    return _seed


def get_rng_state():
    """(seed, offset): where the stream stands, for set_rng_state."""
    with _lock:
        return (_seed, _offset)


def set_rng_state(state):
    """Put the stream back where get_rng_state found it."""
    global _seed, _offset
    seed, offset = state
    if not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= _MASK64 for v in (seed, offset)):
        raise ValueError("set_rng_state expects (seed, offset), two ints in [0, 2**64)")
    with _lock:
        _seed, _offset = seed, offset


def _draw(count):
    """(seed, offset) for a draw of count numbers; the stream moves past them."""
    global _offset
    with _lock:
        state = (_seed, _offset)
        _offset = (_offset + (count + 3) // 4) & _MASK64
    return state
