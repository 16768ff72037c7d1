"""ampc.optim: Parameter, SGD, Adam and AdamW with torch.optim's formulas, defaults, checks and
state layout; each step is one fused multi-tensor kernel (ampc._C on the CPU, ampc._cuda on a
GPU) over every parameter of a group.

They declare ``_step_supports_amp_scaling``: under an ``ampc.GradScaler`` (or torch's) the step
divides the gradients by the scale itself and skips itself when an inf or NaN was found,
reading both where the kernel runs, so a GPU step never waits for the host.

The element arithmetic is that of torch's fused optimizers (``fused=True``); see
kernels/optim_math.h. One difference on purpose: SGD's ``maximize`` negates the gradient before
the weight decay, as torch's documented algorithm and its foreach/for-loop SGD do (torch's
fused SGD applies it to the update instead, which differs when weight_decay is not zero).
"""

import collections.abc
import threading

import numpy as np

from ampc import _C

__all__ = ["Adam", "AdamW", "Optimizer", "Parameter", "SGD"]


# An array that an optimizer updates in place, its gradient, and a count of writes (autocast's
# weight-cast cache reads it): ampc._C.Parameter, also ampc.Parameter.
Parameter = _C.Parameter


class Optimizer:
    """torch.optim.Optimizer's shape: param_groups, state, defaults, add_param_group, zero_grad,
    step(closure=None), state_dict and load_state_dict, with torch's texts for bad input."""

    _step_supports_amp_scaling = True

    def __init__(self, params, defaults):
        if not isinstance(defaults, dict):
            raise TypeError(f"defaults must be a dict of the groups' settings, got {type(defaults).__name__}")
        self.defaults = defaults
        self.state = {}
        self.param_groups = []
        if isinstance(params, (Parameter, np.ndarray)):
            raise TypeError("params argument given to the optimizer should be an iterable of Tensors or dicts, "
                            f"but got {type(params).__name__}")
        groups = list(params)
        if not groups:
            raise ValueError("optimizer got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        for group in groups:
            self.add_param_group(group)

    def add_param_group(self, param_group):
        """Add a dict with 'params' and any hyperparameters (the others from the defaults), as torch's."""
        self._refuse_inside_step("add_param_group")
        if not isinstance(param_group, dict):
            raise TypeError(f"param_group must be a dict, but got {type(param_group).__name__}")
        params = param_group["params"]
        if isinstance(params, Parameter):
            params = [params]
        elif isinstance(params, set):
            raise TypeError("optimizer parameters need to be organized in ordered collections, but the ordering "
                            "of tensors in sets will change between runs. Please use a list instead.")
        group = dict(param_group, params=list(params))
        for p in group["params"]:
            if not isinstance(p, Parameter):
                hint = ("; wrap each array in ampc.optim.Parameter(array), which holds it and its .grad"
                        if hasattr(p, "__array__") or hasattr(p, "__dlpack__") else "")
                raise TypeError(f"optimizer can only optimize Tensors, but one of the params is "
                                f"{type(p).__name__}{hint}")
        for name, default in self.defaults.items():
            group.setdefault(name, default)
        if len({id(p) for p in group["params"]}) != len(group["params"]):
            raise ValueError("optimizer contains a parameter group with duplicate parameters")
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        if any(id(p) in seen for p in group["params"]):
            raise ValueError("some parameters appear in more than one parameter group")
        self.param_groups.append(group)

    # The thread inside step() after its closure, or None. What step() reads may run Python (a .grad
    # or .data property, __float__, __dlpack__), which may call back into this optimizer: the methods
    # that change it refuse then, rather than change the state under the step (as load_state_dict
    # replacing self.state, whose new arrays the step would not update).
    _stepping_thread = None

    def _refuse_inside_step(self, method):
        if self._stepping_thread == threading.get_ident():
            raise RuntimeError(f"{type(self).__name__}.{method}() was called from inside its own step() (by a .grad "
                               f"or .data property, __float__, __index__ or __dlpack__ that step() ran); call it "
                               f"before or after step()")

    def zero_grad(self, set_to_none=True):
        """Clear every parameter's .grad: None (set_to_none, torch's default) or zeros in place."""
        self._refuse_inside_step("zero_grad")
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                else:
                    _C.zero_(p.grad)

    def step(self, closure=None):
        """One fused update of every parameter with a gradient; closure, when given, is called first and its loss
        returned."""
        loss = closure() if closure is not None else None  # a closure may call zero_grad(): not guarded
        self._refuse_inside_step("step")
        self._stepping_thread = threading.get_ident()
        try:
            self._step()
        finally:
            del self._stepping_thread
        return loss

    def _step(self):
        scaler = self._scaler_args()
        if scaler is None:
            return  # a GradScaler found an inf on the host side: nothing to do
        # Each parameter's .data and .grad and each group's settings are read once, before anything
        # is written: the checking pass and the step see the same arrays and numbers.
        work = []
        for group in self.param_groups:
            params, datas, grads = [], [], []
            for p in group["params"]:
                grad = p.grad
                if grad is not None:
                    params.append(p)
                    datas.append(p.data)
                    grads.append(grad)
            if params:
                work.append((params, datas, grads, self._settings(group)))
        # Bad input must change nothing: with several groups, every group is checked before
        # any steps (one group is checked by its own step before it writes anything).
        for dry_run in ([True, False] if len(work) > 1 else [False]):
            for params, datas, grads, settings in work:
                known = len(self.state)  # state created by this group's step comes after these
                try:
                    self._step_group(params, datas, grads, settings, scaler, dry_run)
                except BaseException:
                    self._drop_state_since(known)
                    raise
                if dry_run:
                    self._drop_state_since(known)
                else:
                    _C._bump_versions(params)  # a float16 copy cached by autocast is stale now
                    if scaler["grad_scale"] is not None:
                        _C._bump_versions(grads)  # unscaled in place: a gradient that is a Parameter too

    def _drop_state_since(self, known):
        """Forget the state entries after the first `known` (dicts keep insertion order)."""
        if len(self.state) > known:
            self._drop_state(list(self.state)[known:])

    def _drop_state(self, params):
        for p in params:
            del self.state[p]

    def _scaler_args(self):
        """grad_scale and found_inf as a GradScaler sets them for the duration of step(); None
        when found_inf is a number that says skip (a scaler with no device flag to hand over)."""
        grad_scale = getattr(self, "grad_scale", None)
        found_inf = getattr(self, "found_inf", None)
        if isinstance(found_inf, (int, float)):
            if found_inf:
                return None
            found_inf = None
        return {"grad_scale": grad_scale, "found_inf": found_inf}

    # -- state dicts ------------------------------------------------------------------------

    def state_dict(self):
        """torch's layout: parameters numbered in order across groups, each group's settings
        with "params" as those numbers, the state keyed by number; arrays are not copied."""
        index = {}
        groups = []
        for group in self.param_groups:
            packed = {k: v for k, v in group.items() if k != "params"}
            packed["params"] = [index.setdefault(id(p), len(index)) for p in group["params"]]
            groups.append(packed)
        state = {}
        for group in self.param_groups:
            for p in group["params"]:
                if p in self.state:
                    state[index[id(p)]] = self._saved_state(p)
        return {"state": state, "param_groups": groups}

    def _saved_state(self, p):
        return dict(self.state[p])

    def load_state_dict(self, state_dict):
        """Load a state dict from ampc or torch: settings from its groups, state arrays copied
        into new arrays of each parameter's type, device and dtype (the step count a float32
        on the parameter's device). Checked before anything changes."""
        self._refuse_inside_step("load_state_dict")
        _check_payload(state_dict)
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups):
            raise ValueError("loaded state dict has a different number of parameter groups")
        if any(len(g["params"]) != len(s["params"]) for g, s in zip(self.param_groups, saved_groups)):
            raise ValueError("loaded state dict contains a parameter group that doesn't match the size of "
                             "optimizer's group")
        by_id = {}
        for group, saved in zip(self.param_groups, saved_groups):
            by_id.update(zip(saved["params"], group["params"]))
        state = {}
        for key, values in state_dict["state"].items():
            if key not in by_id:
                continue  # torch also drops state of parameters it does not have
            p = by_id[key]
            state[p] = {name: self._loaded_value(p, name, value) for name, value in values.items()}
        self.state = state
        self._forget_pending()
        for group, saved in zip(self.param_groups, saved_groups):
            group.update({k: v for k, v in saved.items() if k != "params"})

    def _loaded_value(self, p, name, value):
        if value is None or isinstance(value, (bool, str)):
            return value
        if name == "step":
            try:
                return _C._scalar_like(p.data, float(value))
            except (TypeError, ValueError):
                raise TypeError(f"load_state_dict: a parameter's 'step' must be a number, got "
                                f"{type(value).__name__}") from None
        if isinstance(value, (int, float)):
            return value
        shape = getattr(value, "shape", None)
        if shape is None or tuple(shape) != tuple(p.data.shape):
            raise ValueError(f"load_state_dict: a parameter's '{name}' must be an array of its shape "
                             f"{tuple(p.data.shape)}, got " + (type(value).__name__ if shape is None else str(tuple(shape))))
        out = _C.zeros_like(p.data)
        _C.cast(value, out=out)
        return out

    def _forget_pending(self):
        pass

    def __repr__(self):
        lines = [f"{type(self).__name__} ("]
        for i, group in enumerate(self.param_groups):
            lines.append(f"Parameter Group {i}")
            lines += [f"    {k}: {v}" for k, v in sorted(group.items()) if k != "params"]
        return "\n".join(lines + [")"])


def _check_payload(state_dict):
    """The outline of an optimizer's state dict (a checkpoint, outside input): a TypeError or
    ValueError naming what is wrong, before anything is read from it."""
    if not isinstance(state_dict, collections.abc.Mapping):
        raise TypeError(f"load_state_dict: state_dict must be a dict, got {type(state_dict).__name__}")
    for key in ("state", "param_groups"):
        if key not in state_dict:
            raise ValueError(f"load_state_dict: state_dict has no '{key}' entry")
    groups = state_dict["param_groups"]
    if not isinstance(groups, (list, tuple)) or not all(
            isinstance(g, collections.abc.Mapping) and isinstance(g.get("params"), (list, tuple)) for g in groups):
        raise TypeError("load_state_dict: state_dict['param_groups'] must be a list of dicts, each with a "
                        "'params' list")
    state = state_dict["state"]
    if not isinstance(state, collections.abc.Mapping) or not all(
            isinstance(v, collections.abc.Mapping) for v in state.values()):
        raise TypeError("load_state_dict: state_dict['state'] must be a dict of dicts (each parameter's state)")


def _check(condition, message):
    if not condition:
        raise ValueError(message)


class SGD(Optimizer):
    """torch.optim.SGD: momentum, dampening, nesterov, weight_decay, maximize."""

    def __init__(self, params, lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, *,
                 maximize=False):
        _check(lr >= 0.0, f"Invalid learning rate: {lr}")
        _check(momentum >= 0.0, f"Invalid momentum value: {momentum}")
        _check(weight_decay >= 0.0, f"Invalid weight_decay value: {weight_decay}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        # Parameters whose momentum buffer was created but whose first step may not have run
        # (a GradScaler may have skipped it on the device): a float32 flag on the parameter's
        # device, 0 until a step runs. See kernels/optim_descriptors.h.
        self._firsts = {}
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                                      nesterov=nesterov, maximize=maximize))

    @staticmethod
    def _settings(group):
        return dict(lr=float(group["lr"]), momentum=float(group["momentum"]), dampening=float(group["dampening"]),
                    weight_decay=float(group["weight_decay"]), nesterov=bool(group["nesterov"]),
                    maximize=bool(group["maximize"]))

    def _step_group(self, params, datas, grads, settings, scaler, dry_run):
        momentum = settings["momentum"]
        bufs = []
        for p, data in zip(params, datas):
            s = self.state.setdefault(p, {})
            buf = s.get("momentum_buffer")
            if momentum != 0 and buf is None:
                buf = s["momentum_buffer"] = _C.zeros_like(data)
                self._firsts[p] = _C._scalar_like(data, 0.0)
            elif momentum == 0:
                s.setdefault("momentum_buffer", None)
            bufs.append(buf)
        pending = self._firsts
        firsts = [pending.get(p) for p in params] if pending else [None] * len(params)
        ran = _C._sgd_step(datas, grads, bufs, firsts, dry_run=dry_run, **settings, **scaler)
        if pending and not dry_run and (ran or (ran is None and scaler["found_inf"] is None)):
            for p in params:
                pending.pop(p, None)

    def _saved_state(self, p):
        """A buffer whose first step never ran (skipped by a GradScaler) is saved as None, as
        torch would have no buffer yet; reading the flag waits for the device."""
        state = dict(self.state[p])
        first = self._firsts.get(p)
        if first is not None:
            if _C._item(first) == 0.0:
                state["momentum_buffer"] = None
            else:
                del self._firsts[p]
        return state

    def _forget_pending(self):
        self._firsts = {}

    def _drop_state(self, params):
        super()._drop_state(params)
        for p in params:
            self._firsts.pop(p, None)


class Adam(Optimizer):
    """torch.optim.Adam: amsgrad, weight_decay (L2, added to the gradient), maximize."""

    _decoupled = False

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, amsgrad=False, *,
                 maximize=False):
        _check(lr >= 0.0, f"Invalid learning rate: {lr}")
        _check(eps >= 0.0, f"Invalid epsilon value: {eps}")
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise TypeError(f"betas must be a pair of floats, got {betas!r:.60}")
        _check(0.0 <= betas[0] < 1.0, f"Invalid beta parameter at index 0: {betas[0]}")
        _check(0.0 <= betas[1] < 1.0, f"Invalid beta parameter at index 1: {betas[1]}")
        _check(weight_decay >= 0.0, f"Invalid weight_decay value: {weight_decay}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                                      amsgrad=amsgrad, maximize=maximize))

    def _state(self, p, data, amsgrad):
        s = self.state.get(p)
        if not s:
            # The step count is a float32 on the parameter's device, as torch's fused Adam
            # keeps it: the kernel counts it, and does not when a GradScaler skips the step.
            s = self.state[p] = {"step": _C._scalar_like(data, 0.0), "exp_avg": _C.zeros_like(data),
                                 "exp_avg_sq": _C.zeros_like(data)}
        if amsgrad and "max_exp_avg_sq" not in s:
            s["max_exp_avg_sq"] = _C.zeros_like(data)
        return s

    def _settings(self, group):
        beta1, beta2 = group["betas"]
        return dict(lr=float(group["lr"]), beta1=float(beta1), beta2=float(beta2), eps=float(group["eps"]),
                    weight_decay=float(group["weight_decay"]), amsgrad=bool(group["amsgrad"]),
                    maximize=bool(group["maximize"]), decoupled=self._decoupled)

    def _step_group(self, params, datas, grads, settings, scaler, dry_run):
        amsgrad = settings["amsgrad"]
        states = [self._state(p, data, amsgrad) for p, data in zip(params, datas)]
        _C._adam_step(datas, grads, [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states],
                      [s["max_exp_avg_sq"] for s in states] if amsgrad else None, [s["step"] for s in states],
                      dry_run=dry_run, **settings, **scaler)


class AdamW(Adam):
    """torch.optim.AdamW: Adam with decoupled weight decay (param -= lr * weight_decay * param),
    torch's default weight_decay 1e-2."""

    _decoupled = True

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False, *,
                 maximize=False):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize=maximize)
