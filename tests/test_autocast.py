"""ampc.autocast on NumPy: torch's autocast tests (spec/torch-amp.md 5.2 and 5.3) ported to
ampc's engine, the state and its texts, the policies of torch's op lists, the weight-cast
cache, the registry, per-region overrides, and custom_fwd / custom_bwd.

The ops here are float64 references that round once to their inputs' dtype and, like torch's
ops, refuse mixed dtypes: so an op's output dtype says which dtype autocast gave it, and the
result must equal, bit for bit, the same op run outside autocast on inputs cast by hand."""

import gc
import pickle
import threading
import tracemalloc
import warnings
import weakref

import numpy as np
import pytest

import ampc
from ampc import _C
from autocast_lists import POLICIES, UNLISTED

F32, F16, BF16, F64 = np.dtype(np.float32), np.dtype(np.float16), ampc.bfloat16, np.dtype(np.float64)
LOWER = {"cpu": BF16, "cuda": F16}


def bits(a):
    a = np.asarray(a)
    return a.view(np.uint16 if a.dtype.itemsize == 2 else np.uint32 if a.dtype.itemsize == 4 else np.uint64)


def assert_same_bits(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_array_equal(bits(a), bits(b))


def same_dtype(*arrays):
    dtypes = {a.dtype for a in arrays}
    if len(dtypes) != 1:
        raise TypeError(f"expected one dtype, got {sorted(map(str, dtypes))}")
    return dtypes.pop()


def rounded(value, dtype):
    """A float64 result rounded once to dtype (ampc.cast rounds to nearest even)."""
    return ampc.cast(np.asarray(value, np.float64), dtype)


def reference_mm(a, b):
    return rounded(a.astype(np.float64) @ b.astype(np.float64), same_dtype(a, b))


def reference_exp(a):
    return rounded(np.exp(a.astype(np.float64)), a.dtype)


def reference_mse_loss(a, b):
    return rounded(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2), same_dtype(a, b))


def reference_cat(arrays, axis=0):
    return rounded(np.concatenate([a.astype(np.float64) for a in arrays], axis), same_dtype(*arrays))


def reference_sum(a, axis=None, dtype=None):
    return rounded(np.sum(a.astype(np.float64), axis), dtype if dtype is not None else a.dtype)


def make_op(name, func):
    """func as an autocast op under `name`, whatever policy the name has."""
    return ampc.AutocastOp(func, name)


@pytest.fixture(autouse=True)
def clean_state():
    """Every test starts and must end outside any region, with the registry as it was."""
    assert not ampc.is_autocast_enabled("cpu") and not ampc.is_autocast_enabled("cuda")
    registry = _C._autocast_ops()
    yield
    for name, policies in _C._autocast_ops().items():
        for device, policy in registry.get(name, {"cpu": "none", "cuda": "none"}).items():
            if policies[device] != policy:
                ampc.register_autocast(name, policy, device)
    assert not ampc.is_autocast_enabled("cpu"), "a test left CPU autocast on"
    assert ampc.get_autocast_dtype("cpu") == BF16 and ampc.get_autocast_dtype("cuda") == F16
    assert ampc.is_autocast_cache_enabled()
    assert _C._autocast_cache_info()["entries"] == 0


def floats(rng, shape, dtype):
    return ampc.cast(rng.standard_normal(shape), dtype)


# ---------------------------------------------------------------------------
# The state and its module functions
# ---------------------------------------------------------------------------


def test_defaults_and_state_functions():
    assert ampc.get_autocast_dtype("cpu") == BF16
    assert ampc.get_autocast_dtype("cuda") == F16
    assert ampc.is_autocast_enabled() is False  # no argument: CUDA, torch's legacy form
    assert ampc.is_autocast_cache_enabled() is True
    try:
        ampc.set_autocast_enabled("cpu", True)
        assert ampc.is_autocast_enabled("cpu") and not ampc.is_autocast_enabled("cuda")
        ampc.set_autocast_dtype("cpu", "float16")
        assert ampc.get_autocast_dtype("cpu") == F16
        ampc.set_autocast_cache_enabled(False)
        assert ampc.is_autocast_cache_enabled() is False
        ampc.set_autocast_enabled(True)  # legacy: CUDA
        assert ampc.is_autocast_enabled("cuda")
    finally:
        ampc.set_autocast_enabled("cpu", False)
        ampc.set_autocast_enabled("cuda", False)
        ampc.set_autocast_dtype("cpu", BF16)
        ampc.set_autocast_cache_enabled(True)
    # any dtype, as torch's setter: a region made with an integer one warns and runs disabled
    ampc.set_autocast_dtype("cpu", np.int32)
    try:
        assert ampc.get_autocast_dtype("cpu") == np.int32
        with pytest.warns(UserWarning, match="target dtype is not supported"):
            region = ampc.autocast("cpu")
        with region:
            assert not ampc.is_autocast_enabled("cpu") and region.fast_dtype == np.int32
    finally:
        ampc.set_autocast_dtype("cpu", BF16)
    with pytest.raises(TypeError):
        ampc.set_autocast_dtype("cpu", "no such dtype")
    assert ampc.get_autocast_dtype("cpu") == BF16


def test_deprecated_per_device_forms():
    forms = [(ampc.is_autocast_cpu_enabled, (), False), (ampc.get_autocast_cpu_dtype, (), BF16),
             (ampc.get_autocast_gpu_dtype, (), F16)]
    for fn, args, expected in forms:
        with pytest.warns(DeprecationWarning, match=f"ampc.{fn.__name__}\\(\\) is deprecated"):
            assert fn(*args) == expected
    with pytest.warns(DeprecationWarning):
        ampc.set_autocast_cpu_enabled(True)
    with pytest.warns(DeprecationWarning):
        ampc.set_autocast_cpu_dtype(F16)
    with pytest.warns(DeprecationWarning):
        ampc.set_autocast_gpu_dtype(BF16)
    try:
        assert ampc.is_autocast_enabled("cpu") and ampc.get_autocast_dtype("cpu") == F16
        assert ampc.get_autocast_dtype("cuda") == BF16
    finally:
        ampc.set_autocast_enabled("cpu", False)
        ampc.set_autocast_dtype("cpu", BF16)
        ampc.set_autocast_dtype("cuda", F16)


def test_nesting_counter():
    assert ampc.autocast_increment_nesting() == 1
    assert ampc.autocast_increment_nesting() == 2
    with ampc.autocast("cpu"):
        assert ampc.autocast_decrement_nesting() == 2
        assert ampc.autocast_increment_nesting() == 3
    assert ampc.autocast_decrement_nesting() == 1
    assert ampc.autocast_decrement_nesting() == 0


def test_is_autocast_available():
    assert ampc.is_autocast_available("cpu") and ampc.is_autocast_available("cuda")
    assert ampc.is_autocast_available("cuda:1")
    for other in ("xpu", "mps", "hpu", "xla", "meta"):
        assert ampc.is_autocast_available(other) is False
    with pytest.raises(RuntimeError, match="Invalid device string: 'not a real device'"):
        ampc.is_autocast_available("not a real device")


# ---------------------------------------------------------------------------
# Construction: torch's checks, warnings and texts
# ---------------------------------------------------------------------------


def test_invalid_device():
    with pytest.raises(RuntimeError, match="Invalid device string: 'not a real device'"):
        ampc.autocast("not a real device")
    with pytest.raises(RuntimeError, match="Invalid device string: 'cuda:x'"):
        ampc.autocast("cuda:x")
    with pytest.raises(RuntimeError, match="User specified an unsupported autocast device_type 'xpu'"):
        ampc.autocast("xpu")


def test_non_string_device():
    with pytest.raises(ValueError, match="Expected `device_type` of type `str`, got: `<class 'int'>`"):
        ampc.autocast(0)
    with pytest.raises(ValueError, match="Expected `device_type` of type `str`"):
        ampc.custom_fwd(device_type=0)
    with pytest.raises(ValueError, match="Expected `device_type` of type `str`"):
        ampc.custom_bwd(device_type=None)


def test_autocast_called_with_non_callable():
    with pytest.raises(TypeError, match=r"autocast\(\)\(func\) requires a callable, but got ndarray"):
        ampc.autocast("cpu")(np.ones(2))


CPU_WARNING = ("In CPU autocast, but the target dtype is not supported. Disabling autocast.\n"
               "CPU Autocast only supports dtype of torch.bfloat16, torch.float16 currently.")


def test_cpu_dtype_not_supported_warns_and_disables():
    # the integer dtypes and bool too (issue 50, instance 13: np.int32 raised TypeError), as torch
    for dtype in (np.float32, np.float64, np.int32, np.int8, np.uint64, np.bool_, "int64"):
        with pytest.warns(UserWarning) as record:
            region = ampc.autocast("cpu", dtype=dtype)
        assert [str(r.message) for r in record] == [CPU_WARNING]
        assert region._enabled is False and region.fast_dtype == np.dtype(dtype)
        with region:
            assert not ampc.is_autocast_enabled("cpu")
            assert ampc.get_autocast_dtype("cpu") == np.dtype(dtype)  # torch sets it too


def test_integer_dtype_disabled_region_is_quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for device in ("cpu", "cuda"):
            region = ampc.autocast(device, dtype=np.int32, enabled=False)
            assert region._enabled is False and region.fast_dtype == np.dtype(np.int32)
            with region:
                assert not ampc.is_autocast_enabled(device)
                assert ampc.get_autocast_dtype(device) == np.dtype(np.int32)
        assert ampc.get_autocast_dtype("cuda") == F16


@pytest.mark.skipif(ampc.cuda.is_available(), reason="needs a machine without a GPU")
def test_cuda_integer_dtype_without_a_gpu_warns_and_disables():
    # torch's CUDA check comes first and disables the region; its dtype is not looked at then
    with pytest.warns(UserWarning) as record:
        region = ampc.autocast("cuda", dtype=np.int32)
    assert [str(r.message) for r in record] == [
        "User provided device_type of 'cuda', but CUDA is not available. Disabling"]
    assert region._enabled is False and region.fast_dtype == np.dtype(np.int32)


def test_integer_region_dtype_turned_on_refuses_to_cast():
    # set_autocast_enabled inside a disabled integer region: torch would cast floats to int32;
    # ampc refuses the op, and a clear error (it crashed in the cast kernel before this check)
    mm = make_op("mm", reference_mm)
    a = np.ones((2, 2), np.float32)
    with pytest.warns(UserWarning, match="target dtype is not supported"):
        region = ampc.autocast("cpu", dtype=np.int32)
    with region:
        ampc.set_autocast_enabled("cpu", True)
        try:
            with pytest.raises(RuntimeError, match="region's dtype on cpu is int32, which is not a floating dtype"):
                mm(a, a)
            assert make_op("exp", reference_exp)(a).dtype == F32  # fp32 ops need no region dtype
        finally:
            ampc.set_autocast_enabled("cpu", False)


def test_autocast_disabled_with_fp32_dtype():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with ampc.autocast("cpu", dtype=np.float32, enabled=False):
            assert not ampc.is_autocast_enabled("cpu")
        ampc.autocast("cuda", dtype=np.float32, enabled=False)


@pytest.mark.skipif(ampc.cuda.is_available(), reason="needs a machine without a GPU")
def test_cuda_without_a_gpu_warns_and_disables():
    with pytest.warns(UserWarning, match="User provided device_type of 'cuda', but CUDA is not available. Disabling"):
        region = ampc.autocast("cuda")
    assert region._enabled is False and region.device == "cuda"
    with region:
        assert not ampc.is_autocast_enabled("cuda")


def test_construction_arguments():
    region = ampc.autocast("cpu", dtype="float16", cache_enabled=False)
    assert region.device == "cpu" and region.fast_dtype == F16 and region._cache_enabled is False
    assert ampc.autocast("cpu").fast_dtype == BF16
    with pytest.raises(TypeError):
        ampc.autocast("cpu", dtype="not a dtype")
    with pytest.raises(TypeError, match="ampc does not support dtype"):
        ampc.autocast("cpu", dtype=np.complex64)  # torch warns and disables; ampc has no such dtype
    # The default dtype and cache flag are this thread's at construction
    ampc.set_autocast_dtype("cpu", F16)
    ampc.set_autocast_cache_enabled(False)
    try:
        region = ampc.autocast("cpu")
        assert region.fast_dtype == F16 and region._cache_enabled is False
    finally:
        ampc.set_autocast_dtype("cpu", BF16)
        ampc.set_autocast_cache_enabled(True)


def test_legacy_classes_warn():
    with pytest.warns(FutureWarning) as record:
        cpu_region = ampc.cpu.amp.autocast()
    assert str(record[0].message) == ("`ampc.cpu.amp.autocast(args...)` is deprecated. Please use "
                                      "`ampc.amp.autocast('cpu', args...)` instead.")
    assert record[0].filename == __file__
    with cpu_region as bound:
        assert bound is cpu_region  # the legacy classes returned self
        assert ampc.is_autocast_enabled("cpu") and ampc.get_autocast_dtype("cpu") == BF16
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # no GPU here: disabled
        with pytest.warns(FutureWarning, match=r"`ampc.cuda.amp.autocast\(args...\)` is deprecated. Please use "
                                               r"`ampc.amp.autocast\('cuda', args...\)` instead."):
            cuda_region = ampc.cuda.amp.autocast(enabled=False)
    assert cuda_region.device == "cuda" and cuda_region.fast_dtype == F16
    with pytest.warns(FutureWarning) as record:
        ampc.cuda.amp.custom_fwd(lambda ctx: None)
        ampc.cuda.amp.custom_bwd(lambda ctx: None)
    assert [str(w.message) for w in record] == [
        "`ampc.cuda.amp.custom_fwd(args...)` is deprecated. Please use "
        "`ampc.amp.custom_fwd(args..., device_type='cuda')` instead.",
        "`ampc.cuda.amp.custom_bwd(args...)` is deprecated. Please use "
        "`ampc.amp.custom_bwd(args..., device_type='cuda')` instead.",
    ]


# ---------------------------------------------------------------------------
# Regions: nesting, exceptions, the decorator, recursion, threads
# ---------------------------------------------------------------------------


def state():
    return (ampc.is_autocast_enabled("cpu"), ampc.get_autocast_dtype("cpu"), ampc.is_autocast_cache_enabled())


def test_enter_returns_none_and_exit_restores():
    before = state()
    region = ampc.autocast("cpu", dtype=F16, cache_enabled=False)
    with region as bound:
        assert bound is None
        assert state() == (True, F16, False)
    assert state() == before


def test_state_restored_after_an_exception():
    before = state()
    with pytest.raises(ZeroDivisionError):
        with ampc.autocast("cpu", dtype=F16):
            with ampc.autocast("cpu", enabled=False):
                1 / 0
    assert state() == before


def test_nested_regions(rng):
    mm = make_op("mm", reference_mm)
    a, b = floats(rng, (3, 5), F32), floats(rng, (5, 2), F32)
    with ampc.autocast("cpu"):
        assert mm(a, b).dtype == BF16
        with ampc.autocast("cpu", enabled=False):
            assert not ampc.is_autocast_enabled("cpu")
            assert mm(a, b).dtype == F32  # ops run in their inputs' dtype
            with pytest.raises(TypeError, match="one dtype"):
                mm(a, ampc.cast(b, BF16))  # the user must cast back, as in torch
            with ampc.autocast("cpu", dtype=F16):
                assert mm(a, b).dtype == F16
            assert not ampc.is_autocast_enabled("cpu")
        assert ampc.get_autocast_dtype("cpu") == BF16
        assert mm(a, b).dtype == BF16  # re-entering an enabled region casts again


def test_decorator_form(rng):
    mm = make_op("mm", reference_mm)
    a = floats(rng, (4, 4), F32)

    @ampc.autocast("cpu")
    def forward(x):
        """Runs in a region."""
        return mm(x, x), ampc.is_autocast_enabled("cpu")

    assert forward.__name__ == "forward" and forward.__doc__ == "Runs in a region."
    out, on = forward(a)
    assert on and out.dtype == BF16
    assert not ampc.is_autocast_enabled("cpu")


def test_decorated_function_that_recurses_leaves_autocast_off():
    # torch keeps the saved state on the instance: the inner call overwrites it and the
    # outermost exit restores "on". ampc keeps it per thread.
    @ampc.autocast("cpu")
    def depth(n):
        assert ampc.is_autocast_enabled("cpu")
        return depth(n - 1) + 1 if n else 0

    assert depth(5) == 5
    assert not ampc.is_autocast_enabled("cpu")


def nesting():
    """The thread's autocast nesting count."""
    depth = ampc.autocast_increment_nesting() - 1
    ampc.autocast_decrement_nesting()
    return depth


def test_exit_without_enter_is_refused():
    a = ampc.autocast("cpu")
    with pytest.raises(RuntimeError, match="without a matching __enter__"):
        a.__exit__(None, None, None)
    with a:
        pass
    with pytest.raises(RuntimeError, match="without a matching __enter__"):
        a.__exit__(None, None, None)  # already left
    assert nesting() == 0


def test_regions_left_out_of_order():
    # torch's regions may be left in any order (each restores what it saved and counts the
    # nesting down); ampc's too, and the state from before the first comes back at the end
    # (torch's leaves the second region's saved "on"). Was: RuntimeError "reverse order".
    before = state()
    a, b = ampc.autocast("cpu", dtype=F16, cache_enabled=False), ampc.autocast("cpu", dtype=BF16)
    a.__enter__()
    b.__enter__()
    assert a.__exit__(None, None, None) is False
    assert state() == (True, BF16, True)  # b is still open: its state holds
    assert nesting() == 1
    b.__exit__(None, None, None)
    assert state() == before and nesting() == 0


def test_regions_of_two_devices_left_out_of_order():
    cpu = ampc.autocast("cpu", dtype=F16, cache_enabled=False)
    off = ampc.autocast("cuda", enabled=False, cache_enabled=False)
    inner = ampc.autocast("cpu", dtype=BF16)
    cpu.__enter__()
    off.__enter__()
    inner.__enter__()
    cpu.__exit__(None, None, None)  # its saved CPU state goes to inner, its saved cache flag to off
    assert state() == (True, BF16, True)
    inner.__exit__(None, None, None)
    assert state() == (False, BF16, False)  # off is still open, with its own cache flag
    off.__exit__(None, None, None)
    assert state() == (False, BF16, True) and nesting() == 0


def test_cache_dropped_when_the_last_region_is_left_out_of_order(rng):
    mm = make_op("mm", reference_mm)
    w = ampc.Parameter(floats(rng, (4, 4), F32))
    a, b = ampc.autocast("cpu"), ampc.autocast("cpu")
    a.__enter__()
    b.__enter__()
    mm(w, w)
    assert _C._autocast_cache_info()["entries"] == 1
    a.__exit__(None, None, None)
    assert _C._autocast_cache_info()["entries"] == 1  # b still open
    b.__exit__(None, None, None)
    assert _C._autocast_cache_info()["entries"] == 0 and nesting() == 0


def test_asyncio_tasks_holding_regions_across_an_await(rng):
    # issue 50, instance 12: two tasks, each in a region across an await, leave in the order they
    # resume (task 1 enters, task 2 enters, task 1 leaves, task 2 leaves). Was: RuntimeError in
    # task 1 and a nesting count stuck at 1, so the cache was never dropped again on the thread.
    import asyncio

    mm = make_op("mm", reference_mm)
    w = ampc.Parameter(floats(rng, (4, 4), F32))
    seen = {}

    async def main():
        entered, left = asyncio.Event(), asyncio.Event()

        async def first():
            try:
                with ampc.autocast("cpu"):
                    mm(w, w)
                    entered.set()
                    while not seen.get("second in"):
                        await asyncio.sleep(0)
            finally:
                left.set()

        async def second():
            await entered.wait()
            with ampc.autocast("cpu", dtype=F16):
                seen["second in"] = True
                await left.wait()
                seen["after first left"] = (ampc.get_autocast_dtype("cpu"), mm(w, w).dtype)
        return await asyncio.gather(first(), second(), return_exceptions=True)

    assert asyncio.run(main()) == [None, None]
    assert seen["after first left"] == (F16, F16)  # the open region is second's
    assert nesting() == 0 and not ampc.is_autocast_enabled("cpu")
    assert _C._autocast_cache_info()["entries"] == 0


def test_state_is_per_thread(rng):
    mm = make_op("mm", reference_mm)
    a = floats(rng, (4, 4), F32)
    inside, checked = threading.Event(), threading.Event()
    seen = {}

    def other_thread():
        inside.wait()
        seen["enabled"] = ampc.is_autocast_enabled("cpu")
        seen["dtype"] = ampc.get_autocast_dtype("cpu")
        seen["cache"] = ampc.is_autocast_cache_enabled()
        seen["mm"] = mm(a, a).dtype
        with ampc.autocast("cpu", dtype=F16):
            seen["own region"] = mm(a, a).dtype
        checked.set()

    t = threading.Thread(target=other_thread)
    t.start()
    ampc.set_autocast_dtype("cpu", F16)
    ampc.set_autocast_cache_enabled(False)
    try:
        with ampc.autocast("cpu", dtype=BF16):
            inside.set()
            checked.wait()
            assert ampc.get_autocast_dtype("cpu") == BF16  # the other thread's region did not touch ours
            assert mm(a, a).dtype == BF16
    finally:
        ampc.set_autocast_dtype("cpu", BF16)
        ampc.set_autocast_cache_enabled(True)
    t.join()
    # a new thread starts with autocast off, the default dtypes and the cache on
    assert seen == {"enabled": False, "dtype": BF16, "cache": True, "mm": F32, "own region": F16}


@pytest.mark.parametrize("depth", [1, 12])  # in place, and frames on the heap (8 in place)
def test_a_thread_that_ends_inside_regions_gives_back_what_they_hold(depth):
    """A thread function that enters regions and returns without leaving them: the regions' objects
    and their policy dicts are released when the thread ends (they were kept for good)."""
    held = []

    class Region(ampc.autocast):  # weakly referable
        pass

    def worker():
        for _ in range(depth):
            region = Region("cpu", fp32_ops=["mm"])
            region.__enter__()
            held.append(weakref.ref(region))
        assert nesting() == depth

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    gc.collect()
    assert len(held) == depth and all(ref() is None for ref in held)
    assert nesting() == 0  # this thread's state is its own


def test_one_decorated_function_in_several_threads(rng):
    mm = make_op("mm", reference_mm)
    a = floats(rng, (4, 4), F32)
    barrier = threading.Barrier(4)
    results = []

    @ampc.autocast("cpu")
    def work():
        barrier.wait()
        out = mm(a, a).dtype
        barrier.wait()
        return out, ampc.is_autocast_enabled("cpu")

    threads = [threading.Thread(target=lambda: results.append((work(), ampc.is_autocast_enabled("cpu"))))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [((BF16, True), False)] * 4


# ---------------------------------------------------------------------------
# The op lists and the policies
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_policy_tables_are_torchs_lists(device):
    expected = POLICIES[device]
    registered = {name: p[device] for name, p in _C._autocast_ops().items() if p[device] != "none"}
    assert registered == expected
    for name in UNLISTED:
        assert ampc.autocast_policy(name, device) == "none"
    assert ampc.autocast_policy("never registered", device) == "none"


def probe(name):
    """An autocast op under `name` that hands back what it received."""
    return make_op(name, lambda *args, **kwargs: (args, kwargs))


def inputs(rng, dtype):
    return [floats(rng, (3, 4), dtype), floats(rng, (4,), dtype)]


CPU_LISTED = sorted(POLICIES["cpu"].items())


@pytest.mark.parametrize("name, policy", CPU_LISTED)
@pytest.mark.parametrize("region_dtype", [BF16, F16])
def test_every_cpu_op_gets_its_policy(rng, name, policy, region_dtype):
    op = probe(name)
    untouched = [floats(rng, (2,), F64), np.arange(3, dtype=np.int32), np.array([True]), 1.5, "text", None]
    for dtype in (F32, F16, BF16):
        args = inputs(rng, dtype)
        target = {"lower_precision_fp": region_dtype, "fp32": F32,
                  "promote": F32 if dtype == F32 else region_dtype if dtype == region_dtype else None}[policy]
        with ampc.autocast("cpu", dtype=region_dtype):
            if target is None:  # promote of the other lower dtype alone: torch's error
                with pytest.raises(RuntimeError, match="Unexpected floating ScalarType"):
                    op(*args, *untouched)
                continue
            got, kwargs = op(*args, *untouched)
        assert kwargs == {}
        for before, after in zip(args, got):
            if before.dtype == target:
                assert after is before  # no cast, no copy
            else:
                assert_same_bits(after, ampc.cast(before, target))  # torch's control casts by hand
        assert all(u is g for u, g in zip(untouched, got[2:]))  # float64, ints, bools, scalars pass through


def test_unlisted_ops_run_as_called(rng):
    for name in UNLISTED:
        op = probe(name)
        args = inputs(rng, F32) + inputs(rng, BF16)
        with ampc.autocast("cpu"):
            got, _ = op(*args)
        assert all(a is g for a, g in zip(args, got))


def test_lower_precision_ops_bit_exact_against_the_manual_cast(rng):
    mm = make_op("mm", reference_mm)
    for shape_a, shape_b in [((7, 13), (13, 5)), ((1, 1), (1, 1)), ((16, 3), (3, 16))]:
        a, b = floats(rng, shape_a, F32), floats(rng, shape_b, F32)
        for region_dtype in (BF16, F16):
            with ampc.autocast("cpu", dtype=region_dtype):
                out = mm(a, b)
            control = mm(ampc.cast(a, region_dtype), ampc.cast(b, region_dtype))
            assert_same_bits(out, control)
        # mixed inputs: both cast to the region's dtype
        with ampc.autocast("cpu"):
            mixed = mm(a, ampc.cast(b, F16))
        assert_same_bits(mixed, mm(ampc.cast(a, BF16), ampc.cast(ampc.cast(b, F16), BF16)))


def test_non_contiguous_and_transposed_inputs_are_cast_exactly(rng):
    mm = make_op("mm", reference_mm)
    base = floats(rng, (9, 12), F32)
    a = base[::2, 1::3]  # (5, 4), strided
    b = base.T[2:6, ::2]  # (4, 5), a transposed view
    with ampc.autocast("cpu"):
        out = mm(a, b)
    assert_same_bits(out, mm(ampc.cast(a, BF16), ampc.cast(b, BF16)))


def test_fp32_ops(rng):
    mse = make_op("mse_loss", reference_mse_loss)
    a, b = floats(rng, (5, 6), BF16), floats(rng, (5, 6), F16)
    with ampc.autocast("cpu"):
        out = mse(a, b)
    assert out.dtype == F32
    assert_same_bits(out, mse(ampc.cast(a, F32), ampc.cast(b, F32)))


def test_promote(rng):
    cat = make_op("cat", reference_cat)
    f32, bf16, f16 = floats(rng, (2, 3), F32), floats(rng, (4, 3), BF16), floats(rng, (1, 3), F16)
    f64 = floats(rng, (1, 3), F64)
    with ampc.autocast("cpu"):
        assert cat([bf16, bf16]).dtype == BF16
        out = cat([f32, bf16])
        assert out.dtype == F32
        assert_same_bits(out, reference_cat([f32, ampc.cast(bf16, F32)]))
        # torch's prioritize walks the arguments in order: float32 first wins over a float16 in a
        # bfloat16 region, while a float16 met first is an error
        assert cat([f32, f16]).dtype == F32
        with pytest.raises(RuntimeError, match="Unexpected floating ScalarType"):
            cat([f16, f32])
        with pytest.raises(RuntimeError, match="Unexpected floating ScalarType in at::autocast::prioritize"):
            cat([f16, bf16])
        with pytest.raises(RuntimeError, match="Unexpected floating ScalarType"):
            cat([f16])  # a lone float16 in a bfloat16 region
        # float64 takes no part: the op's own promotion sees it
        got, _ = probe("cat")([bf16, f64])
        assert got[0][0] is bf16 and got[0][1] is f64
    with ampc.autocast("cpu", dtype=F16):
        assert cat([f16, f16]).dtype == F16
        assert cat([f16, f32]).dtype == F32


def test_fp32_set_opt_dtype(rng):
    ampc.register_autocast("sum", "fp32_set_opt_dtype", "cpu")  # a CUDA policy; torch's CPU list has none
    total = make_op("sum", reference_sum)
    x = floats(rng, (4, 5), BF16)
    with ampc.autocast("cpu"):
        out = total(x)
        assert out.dtype == F32  # the input is not cast: the op computes in float32
        assert_same_bits(out, reference_sum(x, dtype=np.float32))
        assert total(x, dtype=F16).dtype == F16  # an explicit dtype is kept
        assert total(x, dtype=None).dtype == F32
        assert total(floats(rng, (3,), F64)).dtype == F64  # ineligible first argument: unchanged
        got, kwargs = probe("sum")(x, 1)
        assert got[0] is x and kwargs == {"dtype": np.dtype(np.float32)}
        got, kwargs = probe("sum")(np.arange(4), x)
        assert kwargs == {}
    ampc.register_autocast("norm", "fp32_append_dtype", "cpu")
    with ampc.autocast("cpu"):
        _, kwargs = probe("norm")(x)
    assert kwargs == {"dtype": np.dtype(np.float32)}


def test_banned_policy_raises():
    ampc.register_autocast("risky_op", "banned", "cpu")
    op = probe("risky_op")
    x = np.ones(3, np.float32)
    with ampc.autocast("cpu"):
        with pytest.raises(RuntimeError, match="risky_op is unsafe to autocast"):
            op(x)
    assert op(x)[0][0] is x  # outside a region it runs
    # binary_cross_entropy is banned on CUDA only; on the CPU it runs in float32
    with ampc.autocast("cpu"):
        got, _ = probe("binary_cross_entropy")(ampc.cast(x, BF16))
    assert got[0].dtype == F32


def test_containers_are_cast_and_rebuilt(rng):
    op = probe("linear")
    a, b, c = floats(rng, (2, 2), F32), floats(rng, (3,), BF16), floats(rng, (2,), F32)
    ints = np.arange(3)
    nested = ([a, (b, {"k": c, "n": ints})], {"x": [a]}, (ints,))
    with ampc.autocast("cpu"):
        got, kwargs = op(*nested, key=[c])
    (lst, dct, tup) = got
    assert type(lst) is list and type(lst[1]) is tuple and type(lst[1][1]) is dict
    assert_same_bits(lst[0], ampc.cast(a, BF16))
    assert lst[1][0] is b
    assert_same_bits(lst[1][1]["k"], ampc.cast(c, BF16))
    assert lst[1][1]["n"] is ints
    assert_same_bits(dct["x"][0], ampc.cast(a, BF16))
    assert tup is nested[2]  # nothing to cast: the very same container
    assert_same_bits(kwargs["key"][0], ampc.cast(c, BF16))
    assert nested[0][0] is a and nested[0][1][1]["k"] is c  # the caller's containers are not modified


def endless_containers():
    """Containers no walk can finish: RecursionError in torch's walk of them (torch.amp's _cast)."""
    one = [np.ones(2, np.float32)]
    one.append(one)
    two = [np.ones(2, np.float32)]
    two += [two, two]  # under the old depth cap of 32: 2^32 visits, a hang
    d = {"x": np.ones(2, np.float32)}
    d["self"] = d
    deep = (np.ones(2, np.float32),)
    for _ in range(10**6):
        deep = (deep,)
    return {"list holding itself": one, "list holding itself twice": two, "dict holding itself": d,
            "10^6 nested tuples": deep}


def test_endless_containers_raise_recursion_error():
    # issue 50, class "recursion in C": scan() and rebuild() walk containers with
    # Py_EnterRecursiveCall; before, they stopped at depth 32 without a word
    op = probe("mm")
    for name, value in endless_containers().items():
        with ampc.autocast("cpu"):
            with pytest.raises(RecursionError):
                op(value)
            with pytest.raises(RecursionError):
                op(np.ones(2, np.float32), key=value)
        with pytest.raises(RecursionError):  # outside a region: the walk that unwraps Parameters
            op([ampc.Parameter(np.ones(2, np.float32)), value])
        with pytest.raises(RecursionError):  # custom_fwd's cast_inputs
            _C._autocast_cast(value, "cpu", np.float16)


def test_deeply_nested_arrays_are_cast(rng):
    # the walk has no depth cap of its own now (it had 32: deeper arrays were handed on uncast)
    op = probe("mm")
    a = floats(rng, (2, 2), F32)
    nested = a
    for _ in range(100):
        nested = [nested]
    with ampc.autocast("cpu"):
        got, _ = op(nested)
    for _ in range(101):
        got = got[0]
    assert_same_bits(got, ampc.cast(a, BF16))


def test_out_calls_are_not_autocast(rng):
    op = probe("mm")
    a, out = floats(rng, (2, 2), F32), np.empty((2, 2), np.float32)
    with ampc.autocast("cpu"):
        got, kwargs = op(a, a, out=out)
        assert got[0] is a and kwargs["out"] is out
        got, _ = op(a, a, out=None)
        assert got[0].dtype == BF16


def test_ops_called_by_an_autocast_op_run_as_called(rng):
    inner = probe("mse_loss")  # fp32

    @ampc.autocast_op(name="linear")
    def outer(x):
        return inner(x)

    x = floats(rng, (3,), F32)
    with ampc.autocast("cpu"):
        (got,), _ = outer(x)
        assert got.dtype == BF16  # not cast again to float32: torch masks autocast inside its wrappers
        (again,), _ = inner(x)
        assert again is x  # and the next op is autocast again
        # a region opened inside the op casts again
        region_inside = make_op("linear", lambda y: ampc.autocast("cpu", dtype=F16)(lambda: inner(y))())
        (inner_got,), _ = region_inside(x)
        assert inner_got.dtype == F32
    with pytest.raises(KeyError):
        with ampc.autocast("cpu"):
            make_op("linear", lambda y: {}["missing"])(x)
    with ampc.autocast("cpu"):
        assert probe("mm")(x)[0][0].dtype == BF16  # the failed op did not leave autocast masked


def test_arrays_ampc_and_parameters(rng):
    op = probe("mm")
    host = floats(rng, (3, 3), F32)
    wrapped = ampc.from_dlpack(host)
    p = ampc.Parameter(floats(rng, (3, 3), F32))
    with ampc.autocast("cpu"):
        got, _ = op(wrapped, p)
    assert isinstance(got[0], ampc.Array) and got[0].dtype == BF16
    assert_same_bits(np.asarray(got[0]), ampc.cast(host, BF16))
    assert isinstance(got[1], np.ndarray)  # a Parameter arrives as its array
    got, _ = op(p)  # outside a region too
    assert got[0] is p.data
    fp64 = ampc.Parameter(floats(rng, (2,), F64))
    with ampc.autocast("cpu"):
        got, _ = op(fp64, [p])
    assert got[0] is fp64.data and got[1][0].dtype == BF16


# ---------------------------------------------------------------------------
# The registry
# ---------------------------------------------------------------------------


def test_autocast_op_decorator_registers_and_wraps(rng):
    @ampc.autocast_op("lower_precision_fp")
    def my_matmul(a, b):
        """My matmul."""
        return reference_mm(a, b)

    assert isinstance(my_matmul, ampc.AutocastOp)
    assert my_matmul.name == "my_matmul" and my_matmul.__doc__ == "My matmul."
    assert my_matmul.policies == {"cpu": "lower_precision_fp", "cuda": "lower_precision_fp"}
    assert my_matmul.__wrapped__.__name__ == "my_matmul"
    a = floats(rng, (2, 2), F32)
    assert my_matmul(a, a).dtype == F32
    with ampc.autocast("cpu"):
        assert my_matmul(a, a).dtype == BF16
    # the same policy again (a re-run notebook cell) is fine; another one is refused
    ampc.autocast_op("lower_precision_fp", name="my_matmul")(reference_mm)
    with pytest.raises(ValueError, match="'my_matmul' already has policy 'lower_precision_fp' on cpu"):
        ampc.autocast_op("fp32", name="my_matmul")(reference_mm)
    with pytest.raises(ValueError, match="already has policy 'fp32_set_opt_dtype' on cuda"):
        ampc.autocast_op("fp32", name="softmax")(reference_exp)


def test_bare_decorator_takes_the_registered_policy():
    @ampc.autocast_op
    def softmax(x, dim=-1, dtype=None):
        return x

    assert softmax.policies == {"cpu": "none", "cuda": "fp32_set_opt_dtype"}

    @ampc.autocast_op(name="linear")
    def my_linear(x, w):
        return x

    assert my_linear.name == "linear" and my_linear.policies["cpu"] == "lower_precision_fp"


def test_register_autocast_changes_every_op_of_the_name(rng):
    op = make_op("exp", reference_exp)
    x = floats(rng, (3,), BF16)
    with ampc.autocast("cpu"):
        assert op(x).dtype == BF16  # exp has no CPU policy
        ampc.register_autocast("exp", "fp32", device_type="cpu")
        assert ampc.autocast_policy("exp", "cpu") == "fp32" and ampc.autocast_policy("exp", "cuda") == "fp32"
        assert op(x).dtype == F32
        ampc.register_autocast(op, "none", "cpu")
        assert op(x).dtype == BF16
    with pytest.raises(ValueError, match="policy must be one of"):
        ampc.register_autocast("exp", "fp64")
    with pytest.raises(TypeError, match="policy must be one of"):
        ampc.register_autocast("exp", 3)
    with pytest.raises(RuntimeError, match="unsupported autocast device_type 'mps'"):
        ampc.register_autocast("exp", "fp32", "mps")
    with pytest.raises(TypeError):
        ampc.AutocastOp(42, "x")
    with pytest.raises(TypeError, match="no __name__"):
        ampc.autocast_op("fp32")(_Nameless())


class _Nameless:
    def __call__(self, x):
        return x


def test_autocast_op_as_a_method(rng):
    class Layer:
        def __init__(self, w):
            self.w = w

        @ampc.autocast_op(name="linear")
        def apply(self, x, w):
            return reference_mm(x, w)

    layer = Layer(ampc.Parameter(floats(rng, (4, 2), F32)))
    x = floats(rng, (3, 4), F32)
    with ampc.autocast("cpu"):
        out = layer.apply(x, layer.w)  # bound: self passes through untouched
    assert_same_bits(out, reference_mm(ampc.cast(x, BF16), ampc.cast(layer.w.data, BF16)))
    assert layer.apply(x, layer.w).dtype == F32


# ---------------------------------------------------------------------------
# Per-region overrides (pytorch/pytorch#117832)
# ---------------------------------------------------------------------------


def test_region_overrides(rng):
    mm = make_op("mm", reference_mm)
    mse = make_op("mse_loss", reference_mse_loss)
    a = floats(rng, (3, 3), F32)
    with ampc.autocast("cpu", fp32_ops={"mm"}, lower_precision_ops=[mse]):
        assert mm(a, a).dtype == F32
        assert mse(a, a).dtype == BF16
        with ampc.autocast("cpu", dtype=F16):  # nested regions keep the outer overrides
            assert mm(a, a).dtype == F32 and mse(a, a).dtype == F16
            with ampc.autocast("cpu", lower_precision_ops={"mm"}):  # and may change them
                assert mm(a, a).dtype == F16 and mse(a, a).dtype == F16
            assert mm(a, a).dtype == F32
    with ampc.autocast("cpu"):
        assert mm(a, a).dtype == BF16 and mse(a, a).dtype == F32
    assert ampc.autocast("cpu", fp32_ops=["mm"])._overrides == {"fp32": ["mm"]}


def test_region_override_errors():
    with pytest.raises(ValueError, match="'sofmax', which is not an op autocast knows"):
        ampc.autocast("cpu", fp32_ops={"sofmax"})
    with pytest.raises(TypeError, match="collection of op names, not a str"):
        ampc.autocast("cpu", fp32_ops="softmax")
    with pytest.raises(TypeError, match="collection of op names"):
        ampc.autocast("cpu", fp32_ops=3)
    with pytest.raises(TypeError, match="expected op names"):
        ampc.autocast("cpu", fp32_ops=[3])
    with pytest.raises(ValueError, match="'mm' is named twice"):
        ampc.autocast("cpu", fp32_ops={"mm"}, lower_precision_ops={"mm"})


# ---------------------------------------------------------------------------
# The weight-cast cache
# ---------------------------------------------------------------------------


def casts():
    return _C._autocast_cache_info()["casts"]


def test_one_cast_per_weight_per_region(rng):
    mm = probe("mm")
    w = ampc.Parameter(floats(rng, (4, 4), F32))
    x = floats(rng, (4, 4), F32)
    before = casts()
    with ampc.autocast("cpu"):
        first = mm(x, w)[0][1]
        second = mm(x, w)[0][1]
        assert second is first  # reused
        assert _C._autocast_cache_info()["entries"] == 1
        with ampc.autocast("cpu"):  # a nested region shares it, and leaving it keeps it
            assert mm(w)[0][0] is first
        assert mm(w)[0][0] is first
        assert_same_bits(first, ampc.cast(w.data, BF16))
    assert casts() - before == 2 + 1  # x twice, w once
    assert _C._autocast_cache_info()["entries"] == 0  # cleared by the outermost exit
    with ampc.autocast("cpu"):
        assert mm(w)[0][0] is not first  # a new region casts again


def test_cache_disabled_casts_twice(rng):
    mm = probe("mm")
    w = ampc.Parameter(floats(rng, (4, 4), F32))
    ampc.set_autocast_cache_enabled(False)
    try:
        from_thread_flag = ampc.autocast("cpu")  # cache_enabled=None: the thread's flag
    finally:
        ampc.set_autocast_cache_enabled(True)
    for region in (ampc.autocast("cpu", cache_enabled=False), from_thread_flag):
        before = casts()
        with region:
            assert not ampc.is_autocast_cache_enabled()
            assert mm(w)[0][0] is not mm(w)[0][0]
        assert casts() - before == 2
        assert _C._autocast_cache_info()["entries"] == 0


def test_only_trained_float32_weights_cast_down_are_cached(rng):
    frozen = ampc.Parameter(floats(rng, (3,), F32), requires_grad=False)
    half = ampc.Parameter(floats(rng, (3,), F16))
    w = ampc.Parameter(floats(rng, (3,), F32))
    activation = floats(rng, (3,), F32)
    with ampc.autocast("cpu"):
        before = casts()
        for _ in range(2):
            probe("mm")(frozen, half, activation)
            probe("mse_loss")(ampc.Parameter(floats(rng, (3,), BF16)))  # to float32: never cached
        assert casts() - before == 2 * 4
        assert _C._autocast_cache_info()["entries"] == 0
        probe("mm")(w)
        assert _C._autocast_cache_info()["entries"] == 1


def test_writes_invalidate_the_cached_cast(rng):
    mm = probe("mm")
    w = ampc.Parameter(floats(rng, (5,), F32))
    with ampc.autocast("cpu"):
        first = mm(w)[0][0]
        w.data[...] = 2 * w.data  # a write ampc cannot see ...
        assert mm(w)[0][0] is first
        w.bump_version()  # ... until told
        second = mm(w)[0][0]
        assert_same_bits(second, ampc.cast(w.data, BF16))
        w.data = floats(rng, (5,), F32)  # a new array
        third = mm(w)[0][0]
        assert_same_bits(third, ampc.cast(w.data, BF16))
        w.grad = floats(rng, (5,), F32)
        ampc.optim.SGD([w], lr=0.5).step()  # an optimizer step
        fourth = mm(w)[0][0]
        assert fourth is not third
        assert_same_bits(fourth, ampc.cast(w.data, BF16))
        assert mm(w)[0][0] is fourth


class CountedData:
    """Array data with a write counter of its own, as a torch tensor's _version."""

    def __init__(self, array, version):
        self.array, self._version = array, version

    def __dlpack__(self, **kwargs):
        return self.array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


@pytest.mark.parametrize("version", [0, 2**63 - 1, 2**63, 2**64 + 5, -1])
def test_the_datas_own_counter_is_read_whatever_its_size(rng, version):
    """A write counted by the data's own counter casts again: a counter past int64 (or -1) read as
    "no counter" before, and the stale cast came back."""
    mm = probe("mm")
    data = CountedData(floats(rng, (5,), F32), version)
    w = ampc.Parameter(data)
    with ampc.autocast("cpu"):
        first = mm(w)[0][0]
        assert mm(w)[0][0] is first  # cached
        data.array[...] = 2 * data.array
        data._version += 1  # the write, as the data's owner counts it
        second = mm(w)[0][0]
        assert second is not first
        assert_same_bits(second, ampc.cast(data.array, BF16))


def test_data_whose_counter_is_not_an_int_is_never_cached(rng):
    mm = probe("mm")
    data = CountedData(floats(rng, (5,), F32), 1.0)  # a float compares by running Python's ==: not trusted
    w = ampc.Parameter(data)
    with ampc.autocast("cpu"):
        first = mm(w)[0][0]
        assert mm(w)[0][0] is not first
        assert _C._autocast_cache_info()["entries"] == 0


def test_nested_region_with_another_dtype_gets_its_own_cast(rng):
    # torch returns the cached cast whatever its dtype; ampc keys the dtype too
    mm = probe("mm")
    w = ampc.Parameter(floats(rng, (4,), F32))
    with ampc.autocast("cpu"):
        assert mm(w)[0][0].dtype == BF16
        with ampc.autocast("cpu", dtype=F16):
            assert_same_bits(mm(w)[0][0], ampc.cast(w.data, F16))


def test_cast_cache_is_global(rng):
    # A region opened by another thread (a backward pass on autograd's thread) reuses the
    # casts of the forward's region while that is still open.
    mm = probe("mm")
    w = ampc.Parameter(floats(rng, (4, 4), F32))
    seen = {}

    def backward():
        with ampc.autocast("cpu"):
            seen["cast"] = mm(w)[0][0]

    with ampc.autocast("cpu"):
        forward = mm(w)[0][0]
        t = threading.Thread(target=backward)
        t.start()
        t.join()
        assert seen["cast"] is forward


def test_autocast_cache_leak(rng):
    # torch's test_autocast_cache_leak (issue #48049): repeated forwards do not grow memory.
    mm = make_op("linear", reference_mm)
    weights = [ampc.Parameter(floats(rng, (32, 32), F32)) for _ in range(4)]
    x = floats(rng, (8, 32), F32)

    def iteration():
        with ampc.autocast("cpu"):
            h = x
            for w in weights:
                h = mm(h, w)
            assert _C._autocast_cache_info()["entries"] == len(weights)
        return h

    for _ in range(3):
        iteration()
    gc.collect()
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        for _ in range(50):
            iteration()
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()
    assert grown < 16 * 1024, grown
    assert _C._autocast_cache_info()["entries"] == 0


def test_cache_releases_what_it_held(rng):
    w = ampc.Parameter(floats(rng, (4,), F32))
    with ampc.autocast("cpu"):
        cast = weakref.ref(probe("mm")(w)[0][0])
        gc.collect()
        assert cast() is not None  # the cache holds it for the region
    gc.collect()
    assert cast() is None


def test_clear_autocast_cache(rng):
    mm = probe("mm")
    w = ampc.Parameter(floats(rng, (4,), F32))
    with ampc.autocast("cpu"):
        first = mm(w)[0][0]
        ampc.clear_autocast_cache()
        assert _C._autocast_cache_info()["entries"] == 0
        assert mm(w)[0][0] is not first


# ---------------------------------------------------------------------------
# Parameter
# ---------------------------------------------------------------------------


def test_parameter(rng):
    data = floats(rng, (2, 3), F32)
    p = ampc.Parameter(data)
    assert p.data is data and p.grad is None and p.requires_grad is True and p._version == 0
    assert p.shape == (2, 3) and p.dtype == F32 and repr(p) == "Parameter(shape=(2, 3), dtype=float32)"
    assert ampc.optim.Parameter is ampc.Parameter
    p.grad = np.zeros_like(data)
    p.requires_grad = False
    p.note = "kept"
    p.data = floats(rng, (2, 3), F32)
    assert p._version == 1
    p.bump_version()
    assert p._version == 2
    q = pickle.loads(pickle.dumps(p))
    np.testing.assert_array_equal(q.data, p.data)
    np.testing.assert_array_equal(q.grad, p.grad)
    assert q.requires_grad is False and q.note == "kept"
    assert weakref.ref(p)() is p
    assert_same_bits(ampc.cast(p, BF16), ampc.cast(p.data, BF16))
    with pytest.raises(AttributeError):
        del p.data
    with pytest.raises(AttributeError):
        p._version = 5


def test_optimizer_steps_count_as_writes(rng):
    params = [ampc.Parameter(floats(rng, (3,), F32)) for _ in range(3)]
    for p in params[:2]:
        p.grad = floats(rng, (3,), F32)
    opt = ampc.optim.AdamW(params)
    opt.step()
    assert [p._version for p in params] == [1, 1, 0]  # a parameter without a gradient is not stepped
    with pytest.raises(ValueError):
        ampc.optim.SGD(params, lr=-1.0)
    bad = ampc.optim.SGD([params[0]])
    params[0].grad = floats(rng, (4,), F32)  # wrong shape: refused before anything is written
    with pytest.raises(ValueError):
        bad.step()
    assert params[0]._version == 1


# ---------------------------------------------------------------------------
# custom_fwd / custom_bwd (torch's test_autocast_custom_enabled / _cast_inputs)
# ---------------------------------------------------------------------------


class Ctx:
    pass


def make_custom(mm, **fwd_kwargs):
    class MyMM:
        @staticmethod
        @ampc.custom_fwd(device_type="cpu", **fwd_kwargs)
        def forward(ctx, a, container):
            b = container[1][0]
            ctx.saved = (a, b)
            ctx.inputs_seen = (a.dtype, b.dtype, ampc.is_autocast_enabled("cpu"))
            return mm(a, b)

        @staticmethod
        @ampc.custom_bwd(device_type="cpu")
        def backward(ctx, grad):
            a, b = ctx.saved
            ctx.backward_autocast = ampc.is_autocast_enabled("cpu")
            return mm(grad, b.T), mm(a.T, grad)

    return MyMM


def test_custom_fwd_bwd_without_cast(rng):
    mm = make_op("mm", reference_mm)
    fn = make_custom(mm)
    a, b = floats(rng, (4, 4), F32), floats(rng, (4, 4), F32)
    ctx = Ctx()
    with ampc.autocast("cpu"):
        out = fn.forward(ctx, a, (0, {0: b}))
        grad = np.ones_like(out)
    assert ctx.inputs_seen == (F32, F32, True)  # the forward sees its inputs as given
    assert out.dtype == BF16
    ga, gb = fn.backward(ctx, grad)  # outside the region: backward runs as forward did
    assert ctx.backward_autocast is True and not ampc.is_autocast_enabled("cpu")
    assert ga.dtype == BF16 and gb.dtype == BF16
    assert ctx._dtype == BF16 and ctx._fwd_used_autocast is True


def test_custom_fwd_cast_inputs(rng):
    mm = make_op("mm", reference_mm)
    fn = make_custom(mm, cast_inputs=np.float32)
    a, b = floats(rng, (3, 3), BF16), floats(rng, (3, 3), F16)
    ctx = Ctx()
    with ampc.autocast("cpu"):
        out = fn.forward(ctx, a, (0, {0: b}))
        assert ampc.is_autocast_enabled("cpu")
    assert ctx.inputs_seen == (F32, F32, False)  # cast, nested ones too, and autocast off inside
    assert out.dtype == F32
    assert_same_bits(out, reference_mm(ampc.cast(a, F32), ampc.cast(b, F32)))
    ga, gb = fn.backward(ctx, np.ones((3, 3), np.float32))
    assert ctx.backward_autocast is False and ga.dtype == F32
    # outside a region nothing is cast
    ctx = Ctx()
    with pytest.raises(TypeError, match="one dtype"):
        fn.forward(ctx, a, (0, {0: b}))
    assert ctx._fwd_used_autocast is False
    same = fn.forward(ctx, a, (0, {0: ampc.cast(b, BF16)}))
    assert same.dtype == BF16


def test_custom_fwd_partial_and_keywords(rng):
    seen = {}

    @ampc.custom_fwd(device_type="cpu", cast_inputs="float16")
    def forward(ctx, x, *, y):
        seen["x"], seen["y"] = x.dtype, y.dtype
        return x

    x = floats(rng, (2,), F32)
    with ampc.autocast("cpu"):
        forward(Ctx(), x, y=x)
    assert seen == {"x": F16, "y": F16}
    assert forward.__name__ == "forward"
    with pytest.raises(TypeError, match="floating"):
        with ampc.autocast("cpu"):
            ampc.custom_fwd(lambda ctx, v: v, device_type="cpu", cast_inputs=np.int32)(Ctx(), x)


def test_cast_helper_matches_torchs(rng):
    x32, x16, x64 = floats(rng, (2,), F32), floats(rng, (2,), F16), floats(rng, (2,), F64)
    value = {"a": [x32, (x16, "s", b"b", 3)], "b": x64, "c": np.arange(2)}
    out = _C._autocast_cast(value, "cpu", np.float16)
    assert_same_bits(out["a"][0], ampc.cast(x32, F16))
    assert out["a"][1][0] is x16 and out["a"][1][1:] == ("s", b"b", 3)
    assert out["b"] is x64 and out["c"] is value["c"]
    assert _C._autocast_cast(x32, "cuda", np.float16) is x32  # not on the device type
