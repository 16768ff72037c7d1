"""Property tests (hypothesis): GradScaler's update rule against a pure-Python model of it, over random
sequences of clean and overflowing steps with every option (growth and backoff factors, the growth
interval, hysteresis, min_scale / max_scale), scale compared bit for bit after every update."""

import numpy as np
import pytest

import ampc

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings, strategies as st  # noqa: E402


class Model:
    """kernels/scaler_rule.h in Python: torch's _amp_update_scale_ plus hysteresis and bounds; products
    in double, rounded to float32."""

    def __init__(self, scale, growth, backoff, interval, hysteresis, low, high):
        self.scale, self.tracker, self.left = np.float32(scale), 0, hysteresis
        self.growth, self.backoff, self.interval, self.hysteresis = growth, backoff, interval, hysteresis
        self.low, self.high = low, high
        self.steps = self.skipped = 0

    def update(self, overflow):
        self.steps += 1
        if overflow:
            self.skipped += 1
            self.tracker = 0
            if self.left > 1:
                self.left -= 1
                return
            self.left = 0
            backed = np.float32(float(self.scale) * self.backoff)
            self.scale = np.float32(self.low) if float(backed) < self.low else backed
            return
        self.left = self.hysteresis
        if self.tracker + 1 == self.interval:
            with np.errstate(over="ignore"):  # past float32's range: inf, and no growth
                grown = np.float32(float(self.scale) * self.growth)
            if float(grown) > self.high:
                grown = np.float32(self.high)
            if np.isfinite(grown):
                self.scale = grown
            self.tracker = 0
        else:
            self.tracker += 1


options = st.fixed_dictionaries({
    "init_scale": st.sampled_from([1.0, 3.0, 1024.0, 65536.0, 2.0 ** 100, 1e38]),
    "growth_factor": st.sampled_from([1.0001, 1.5, 2.0, 3.0, 10.0]),
    "backoff_factor": st.sampled_from([0.125, 0.1, 0.5, 0.99]),
    "growth_interval": st.integers(1, 4),
    "hysteresis": st.integers(1, 3),
    "bounds": st.sampled_from([(None, None), (0.5, None), (None, 2.0 ** 110), (1.0, 2.0 ** 127)]),
})


@settings(max_examples=150, deadline=None)
@given(options, st.lists(st.sampled_from(["clean", "inf", "nan"]), min_size=1, max_size=40))
def test_update_rule_matches_the_model(opts, steps):
    low, high = opts["bounds"]
    if (low is not None and opts["init_scale"] < low) or (high is not None and opts["init_scale"] > high):
        return  # the constructor refuses a scale outside its bounds (tested with the constructor)
    scaler = ampc.GradScaler("cpu", init_scale=opts["init_scale"], growth_factor=opts["growth_factor"],
                             backoff_factor=opts["backoff_factor"], growth_interval=opts["growth_interval"],
                             min_scale=low, max_scale=high, hysteresis=opts["hysteresis"])
    model = Model(opts["init_scale"], opts["growth_factor"], opts["backoff_factor"], opts["growth_interval"],
                  opts["hysteresis"], 0.0 if low is None else low, np.inf if high is None else high)
    param = ampc.Parameter(np.zeros(3, np.float32))
    opt = ampc.optim.SGD([param], lr=0.0)
    for kind in steps:
        param.grad = np.array([1.0, {"clean": 2.0, "inf": np.inf, "nan": np.nan}[kind], 3.0], np.float32)
        scaler.scale(np.float32(1.0))
        scaler.step(opt)
        scaler.update()
        model.update(kind != "clean")
        stats = scaler.stats()
        assert np.float32(scaler.get_scale()).view(np.uint32) == model.scale.view(np.uint32), (kind, stats)
        assert scaler._get_growth_tracker() == model.tracker
        assert (stats["steps"], stats["skipped_steps"], stats["hysteresis_left"]) == \
            (model.steps, model.skipped, model.left)
