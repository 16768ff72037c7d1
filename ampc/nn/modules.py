"""ampc.nn's layers, as torch.nn's: Module (parameters, buffers, submodules, train/eval,
state_dict), the layers a ResNet or a GPT is made of, containers and losses, with torch's default
initialisations. Parameters are float32 NumPy arrays until moved; a forward runs ampc.nn.functional's
ops, so inside ``ampc.autocast`` each runs in the precision torch would choose, and its output is an
ampc.autograd.Tensor whose backward() fills the parameters' ``.grad``.
"""

import collections
import collections.abc
import math
import operator

import numpy as np

from ampc import _C, _array_namespace, random
from ampc._interop import is_torch
from ampc.autograd import Arithmetic
from ampc.nn import functional as F
from ampc.nn import _embedding
from ampc.nn._bare_ops import legacy_reduction
from ampc.nn._common import is_floating_array, shape_of

__all__ = [
    "AdaptiveAvgPool2d", "AvgPool2d", "BCELoss", "BCEWithLogitsLoss", "BatchNorm1d", "BatchNorm2d", "Conv1d", "Conv2d",
    "CrossEntropyLoss", "Dropout", "Embedding", "Flatten", "GELU", "GroupNorm", "Identity", "L1Loss", "LayerNorm",
    "Linear", "LogSoftmax", "MSELoss", "MaxPool2d", "Module", "ModuleDict", "ModuleList", "NLLLoss", "Parameter",
    "Mish", "ReLU", "SiLU", "Sequential", "Sigmoid", "Softmax", "Softplus", "Tanh",
]


class Parameter(_C.Parameter, Arithmetic):
    """ampc.Parameter (an array an optimizer updates in place, with its ``.grad``) with arithmetic
    through ampc's ops, as torch.nn.Parameter."""

    __slots__ = ()


def _generator():
    """A NumPy generator keyed by the next numbers of ampc.random's stream: manual_seed makes
    initialisation repeat."""
    seed, offset = random._draw(1 << 20)
    return np.random.Generator(np.random.Philox(key=seed, counter=offset))


def _uniform(shape, bound):
    return _generator().uniform(-bound, bound, shape).astype(np.float32)


def _fan_in_bound(fan_in):
    """1/sqrt(fan_in), torch's bound for Linear's and Conv's weights and biases; 0 for no inputs
    (torch's too: a layer of 0 input features is allowed)."""
    return 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0


def _kaiming_uniform(shape, fan_in):
    """torch's default for Linear and Conv weights: kaiming_uniform_(a=sqrt(5)), which comes to
    U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    return _uniform(shape, _fan_in_bound(fan_in))


def _typename(value):
    """torch's name for a type in its errors: numpy.ndarray, int."""
    kind = type(value)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


_IncompatibleKeys = collections.namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])


class Module:
    """torch.nn.Module's bookkeeping: attributes that are Parameters, Modules or registered buffers
    are found by parameters(), modules(), state_dict() and friends, in the order they were set."""

    def __init__(self):
        object.__setattr__(self, "_parameters", {})
        object.__setattr__(self, "_buffers", {})
        object.__setattr__(self, "_modules", {})
        object.__setattr__(self, "training", True)

    def __setattr__(self, name, value):
        """As torch's: a Parameter or a Module is registered (in its place, if the name had one); a name
        that holds a parameter, submodule or buffer takes only its kind or None (an array assigned to a
        parameter's name would have taken it out of parameters() and the optimizer, in silence)."""
        if "_parameters" not in self.__dict__:
            raise AttributeError("cannot assign before Module.__init__() call")
        params, buffers, modules = self._parameters, self._buffers, self._modules
        if isinstance(value, (_C.Parameter, Module)):
            own, others = (params, (buffers, modules)) if isinstance(value, _C.Parameter) else (modules, (params, buffers))
            for table in others:
                table.pop(name, None)
            self.__dict__.pop(name, None)
            own[name] = value
        elif name in params and value is not None:
            raise TypeError(f"cannot assign '{_typename(value)}' as parameter '{name}' "
                            "(ampc.nn.Parameter or None expected)")
        elif name in modules and value is not None:
            raise TypeError(f"cannot assign '{_typename(value)}' as child module '{name}' "
                            "(ampc.nn.Module or None expected)")
        elif name in buffers:
            self.register_buffer(name, value)  # `self.num_batches_tracked += 1`: a buffer set anew
        elif name in params:  # None: an absent optional parameter, as register_parameter(name, None)
            params[name] = None
        else:  # None for a submodule (no longer one) or any value for a plain attribute
            modules.pop(name, None)
            object.__setattr__(self, name, value)

    def __getattr__(self, name):
        for table in ("_parameters", "_buffers", "_modules"):
            found = self.__dict__.get(table, {})
            if name in found:
                return found[name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __delattr__(self, name):
        for table in (self._parameters, self._buffers, self._modules):
            if name in table:
                del table[name]
                return
        object.__delattr__(self, name)

    def register_buffer(self, name, value):
        """An array saved in state_dict but not trained (batch norm's running statistics), or None."""
        if value is not None and not isinstance(value, np.ndarray) and not hasattr(value, "__dlpack__"):
            raise TypeError(f"cannot assign '{type(value).__name__}' object to buffer '{name}' "
                            "(an array or None required)")  # torch's text, with its own types
        self.__dict__.pop(name, None)
        self._buffers[name] = value

    def register_parameter(self, name, param):
        """param (a Parameter, or None for an optional one that is absent, as a Linear's bias=False)
        as the parameter `name`, as torch's."""
        if not isinstance(name, str):
            raise TypeError(f"parameter name should be a string. Got {type(name).__name__}")
        if "." in name or name == "":
            raise KeyError("parameter name can't contain \".\"" if name else "parameter name can't be empty string \"\"")
        if param is not None and not isinstance(param, _C.Parameter):
            raise TypeError(f"cannot assign '{type(param).__name__}' object to parameter '{name}' "
                            "(ampc.Parameter or None required)")
        for table in (self._buffers, self._modules):
            table.pop(name, None)
        self.__dict__.pop(name, None)
        self._parameters[name] = param

    def add_module(self, name, module):
        """module as the submodule `name` (as torch's; a container's entries come in this way)."""
        # setattr would keep a non-module as a plain attribute, out of the model (torch also takes None)
        if not isinstance(module, Module):
            raise TypeError(f"{type(module).__name__} is not a Module subclass")
        if not isinstance(name, str):
            raise TypeError(f"module name should be a string. Got {type(name).__name__}")
        setattr(self, name, module)

    def forward(self, *args, **kwargs):
        """The module's computation: what calling the module runs. Subclasses define it."""
        raise NotImplementedError(f'Module [{type(self).__name__}] is missing the required "forward" function')

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    # -- what the module holds
    def named_modules(self, prefix=""):
        """(name, module) for this module and every module under it, depth first, each once."""
        seen, stack = set(), [(prefix, self)]
        while stack:
            name, module = stack.pop()
            if id(module) in seen:
                continue
            seen.add(id(module))
            yield name, module
            stack.extend(reversed([(f"{name}.{n}" if name else n, m) for n, m in module._modules.items()]))

    def modules(self):
        """This module and every module under it, depth first, each once."""
        return (m for _, m in self.named_modules())

    def named_children(self):
        """(name, module) for each direct submodule, in the order they were set."""
        return iter(self._modules.items())

    def children(self):
        """Each direct submodule, in the order they were set."""
        return iter(self._modules.values())

    def _named(self, table, prefix, recurse):
        seen = set()
        modules = self.named_modules(prefix) if recurse else [(prefix, self)]
        for name, module in modules:
            for key, value in getattr(module, table).items():
                if value is None or id(value) in seen:
                    continue
                seen.add(id(value))
                yield (f"{name}.{key}" if name else key), value

    def named_parameters(self, prefix="", recurse=True):
        """(name, parameter) for this module's parameters and (recurse) its submodules', dotted names as torch's."""
        return self._named("_parameters", prefix, recurse)

    def parameters(self, recurse=True):
        """This module's parameters and (recurse) its submodules', each once: what an optimizer takes."""
        return (p for _, p in self.named_parameters(recurse=recurse))

    def get_submodule(self, target):
        """The submodule at a dotted path ("layer1.0.conv1"; "" is the module itself), as torch's."""
        module = self
        for name in target.split(".") if target else []:
            if name not in module._modules:
                raise AttributeError(f"`{name}` is not an nn.Module" if hasattr(module, name)
                                     else f"{type(module).__name__} has no attribute `{name}`")
            module = module._modules[name]
        return module

    def get_parameter(self, target):
        """The parameter at a dotted path ("layer1.0.conv1.weight"), as torch's."""
        path, _, name = target.rpartition(".")
        module = self.get_submodule(path)
        if name not in module._parameters:
            raise AttributeError(f"{type(module).__name__} has no attribute `{name}`" if not hasattr(module, name)
                                 else f"`{name}` is not an nn.Parameter")
        return module._parameters[name]

    def named_buffers(self, prefix="", recurse=True):
        """(name, array) for this module's buffers (running statistics...) and (recurse) its submodules'."""
        return self._named("_buffers", prefix, recurse)

    def buffers(self, recurse=True):
        """This module's buffers and (recurse) its submodules'."""
        return (b for _, b in self.named_buffers(recurse=recurse))

    # -- modes
    def train(self, mode=True):
        """Set training mode (mode=True) or evaluation mode on this module and every submodule; returns self."""
        if not isinstance(mode, bool):
            raise ValueError("training mode is expected to be boolean")
        for module in self.modules():
            object.__setattr__(module, "training", mode)
        return self

    def eval(self):
        """Evaluation mode (batch norm's running statistics, no dropout): train(False); returns self."""
        return self.train(False)

    def to(self, device=None, dtype=None, memory_format=None):
        """Move every parameter and buffer to device ("cpu", "cuda", "cuda:N", an int or a
        torch.device: NumPy arrays on the host, ampc arrays from ampc's pool on a GPU) and cast the
        floating ones to dtype, as torch's Module.to; gradients follow their parameters.
        ``memory_format="channels_last"`` lays 4-D ones out channels-last (NHWC), where ampc's
        convolutions and batch norms are fastest. Batch norm's step count stays a host integer."""
        index = None if device is None else _device_index(device)
        if memory_format not in (None, "channels_last", "contiguous_format"):
            raise ValueError(f"to: memory_format must be 'channels_last' or 'contiguous_format', got {memory_format!r}")
        # every array moved first, then all of them put in place: a failure (a bad dtype, the GPU's
        # memory running out) leaves the model as it was, not half moved
        moves, seen = [], set()
        for module in self.modules():
            for p in module._parameters.values():
                if p is not None and id(p) not in seen:  # a shared (tied) parameter once
                    seen.add(id(p))
                    moves.append((p, "data", _moved(p.data, index, dtype, memory_format)))
                    if p.grad is not None:
                        moves.append((p, "grad", _moved(p.grad, index, dtype, memory_format)))
            for name, b in module._buffers.items():
                if b is not None and name != "num_batches_tracked":
                    moves.append((module._buffers, name, _moved(b, index, dtype, memory_format)))
        for owner, name, value in moves:
            if isinstance(owner, dict):
                owner[name] = value
            else:
                setattr(owner, name, value)
        return self

    def cuda(self, device=0):
        """Move the parameters and buffers to a CUDA device (to(device)); returns self."""
        return self.to(device)

    def float(self):
        """Floating parameters and buffers to float32; returns self."""
        return self.to(dtype=np.float32)

    def double(self):
        """Floating parameters and buffers to float64; returns self."""
        return self.to(dtype=np.float64)

    def half(self):
        """Floating parameters and buffers to float16; returns self."""
        return self.to(dtype=np.float16)

    def bfloat16(self):
        """Floating parameters and buffers to bfloat16; returns self."""
        return self.to(dtype=_C.as_dtype("bfloat16"))

    def requires_grad_(self, requires_grad=True):
        """Whether backward() computes the parameters' gradients (False: frozen, as for fine-tuning
        a part of a model), as torch's."""
        for p in self.parameters():
            p.requires_grad = requires_grad
        return self

    def cpu(self):
        """Move the parameters and buffers to host memory (NumPy arrays); returns self."""
        return self.to("cpu")

    def zero_grad(self, set_to_none=True):
        """Every parameter's gradient None, or (set_to_none=False) zeroed in place, as torch's: zeros
        also where an overflow left inf or NaN (multiplying by 0 kept NaN there)."""
        for p in self.parameters():
            if set_to_none or p.grad is None:
                p.grad = None
            else:
                _C.zero_(p.grad)

    def apply(self, fn):
        """Call fn on every submodule, then on this module (torch's order, for initialisation); returns self."""
        for module in list(self.modules())[::-1]:
            fn(module)
        return self

    # -- state
    def state_dict(self, prefix="", keep_vars=False):
        """Every parameter's and buffer's array under its dotted name, in torch's order (a module's
        parameters, then its buffers, then its submodules')."""
        state = collections.OrderedDict()
        for name, module in self.named_modules(prefix.rstrip(".")):
            for key, value in list(module._parameters.items()) + list(module._buffers.items()):
                if value is not None:
                    full = f"{name}.{key}" if name else key
                    state[full] = value if keep_vars or not isinstance(value, _C.Parameter) else value.data
        return state

    def load_state_dict(self, state_dict, strict=True):
        """Copy each array of state_dict into the parameter or buffer of its name (torch's checks
        and texts: missing and unexpected keys, size mismatches). Nothing is changed when any
        check fails."""
        if not isinstance(state_dict, collections.abc.Mapping):
            raise TypeError(f"Expected state_dict to be dict-like, got {type(state_dict)}.")
        own = self.state_dict(keep_vars=True)
        missing = [k for k in own if k not in state_dict]
        unexpected = [k for k in state_dict if k not in own]
        errors = []
        if strict:
            if unexpected:
                errors.append("Unexpected key(s) in state_dict: " + ", ".join(f'"{k}"' for k in unexpected) + ". ")
            if missing:
                errors.append("Missing key(s) in state_dict: " + ", ".join(f'"{k}"' for k in missing) + ". ")
        arrays = {}
        for key, target in own.items():
            if key not in state_dict:
                continue
            value = np.asarray(state_dict[key]) if not hasattr(state_dict[key], "__dlpack__") else state_dict[key]
            if not _holds_numbers(value):  # None, strings, objects: found before anything is written
                errors.append(f'While copying the parameter named "{key}", expected torch.Tensor or Tensor-like '
                              f"object from checkpoint but received {type(state_dict[key])}")
                continue
            current = target.data if isinstance(target, _C.Parameter) else target
            if tuple(value.shape) != tuple(current.shape):
                errors.append(f"size mismatch for {key}: copying a param with shape {tuple(value.shape)} from "
                              f"checkpoint, the shape in current model is {tuple(current.shape)}.")
                continue
            if _read_only(current):  # found now: the copy would fail after the keys before it were written
                errors.append(f'While copying the parameter named "{key}", the array in the current model is '
                              "read-only.")
                continue
            arrays[key] = value
        if errors:
            raise RuntimeError(f"Error(s) in loading state_dict for {type(self).__name__}:\n\t" + "\n\t".join(errors))
        for key, value in arrays.items():
            _copy_into(own[key], value)
        return _IncompatibleKeys(missing, unexpected)

    def __repr__(self):
        lines = [f"({name}): " + repr(m).replace("\n", "\n  ") for name, m in self._modules.items()]
        extra = self.extra_repr()
        if not lines:
            return f"{type(self).__name__}({extra})"
        return f"{type(self).__name__}(\n  " + "\n  ".join(([extra] if extra else []) + lines) + "\n)"

    def extra_repr(self):
        """The module's own settings for its repr (Linear's in_features=..., out_features=...); '' by default."""
        return ""


_MAX_DEVICE = 2**31 - 1  # CUDA ordinals are C ints


def _device_index(device):
    """-1 for the host, else the CUDA ordinal, from "cpu", "cuda", "cuda:N", an int N or a torch.device."""
    if isinstance(device, int) and not isinstance(device, bool):
        index = int(device)
    else:
        if isinstance(device, str):
            text = str.__str__(device)  # the characters, whatever a subclass's __str__ does
        elif is_torch(device, "device"):
            text = str(device)
        else:
            raise TypeError(f"to: device must be a str, an int or a torch.device, got {type(device).__name__}")
        if text == "cpu":
            return -1
        if text == "cuda":
            return 0
        if not (text.startswith("cuda:") and text[5:].isascii() and text[5:].isdigit()):
            raise ValueError(f"Expected one of cpu, cuda device type at start of device string: {text}")
        index = int(text[5:])
    if not 0 <= index < _MAX_DEVICE:
        raise ValueError(f"to: a CUDA device ordinal is 0 or more and below 2**31 - 1, got {index}")
    return index


def _array_device(x):
    if isinstance(x, np.ndarray):
        return -1
    kind, index = x.__dlpack_device__()
    return int(index) if int(kind) == 2 else -1  # DLPack: 1 the CPU, 2 CUDA


def _relaid(x, memory_format):
    """x laid out channels-last (a 4-D array) or in C order, on the host (NumPy) or as an ampc array."""
    channels_last = memory_format == "channels_last" and len(x.shape) == 4
    if memory_format is None or (memory_format == "channels_last" and not channels_last):
        return x
    if isinstance(x, np.ndarray):
        return np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2) if channels_last else \
            np.ascontiguousarray(x)
    if not isinstance(x, _C.Array):
        raise TypeError(f"to: memory_format needs NumPy or ampc arrays, got {type(x).__name__}")
    if not channels_last:
        return _array_namespace.contiguous(x)
    n, c, h, w = x.shape
    out = _array_namespace.transpose(_C.zeros_like(x, shape=(n, h, w, c)), (0, 3, 1, 2))
    _C.cast(x, out=out)
    return out


def _moved(x, index, dtype, memory_format=None):
    # integer and bool buffers keep their dtype
    if dtype is not None and is_floating_array(x) and _C.as_dtype(x.dtype) != _C.as_dtype(dtype):
        x = _C.cast(x, dtype)
    x = _relaid(x, memory_format)
    if index is None or _array_device(x) == index:
        return x
    try:
        return _C._to_device(x, index)
    except ValueError:  # not one dense block: a C-order copy first
        if isinstance(x, np.ndarray):
            return _C._to_device(np.ascontiguousarray(x), index)
        copy = _C.zeros_like(x, shape=tuple(x.shape))
        _C.cast(x, out=copy)
        return _C._to_device(copy, index)


def _holds_numbers(value):
    """Whether value (an array of any library) has a dtype ampc knows: what a load can convert."""
    try:
        _C.as_dtype(value.dtype)
    except (TypeError, ValueError, AttributeError):
        return False
    return True


def _read_only(array):
    """Whether ampc may not write into array: a NumPy array not writeable, an ampc.Array marked
    read-only (a legacy DLPack import); torch's and CuPy's arrays are writeable."""
    if isinstance(array, np.ndarray):
        return not array.flags.writeable
    return isinstance(array, _C.Array) and array.readonly


def _copy_into(target, value):
    """Write value's numbers into a parameter's or buffer's array, in its dtype and on its device.
    A conversion never fails part-way (value holds numbers, _holds_numbers): NaN into an integer
    buffer becomes what NumPy's cast makes of it, as torch's copy_ does, not a warning raised
    after earlier keys were written."""
    data = target.data if isinstance(target, _C.Parameter) else target
    if isinstance(data, np.ndarray):
        with np.errstate(invalid="ignore", over="ignore"):
            np.copyto(data, np.asarray(value).astype(data.dtype, copy=False))
    else:
        device = _array_device(data)
        if isinstance(value, np.ndarray) and value.dtype != _C.as_dtype(data.dtype):
            with np.errstate(invalid="ignore", over="ignore"):  # converted on the host: GPU casts take floats only
                value = value.astype(_C.as_dtype(data.dtype))
        if _array_device(value) != device:
            value = _moved(np.asarray(value) if not hasattr(value, "__dlpack_device__") else value, device, None)
        _C.cast(value, out=data)
    if isinstance(target, _C.Parameter):
        target.bump_version()


# -- layers -----------------------------------------------------------------------------------


class Identity(Module):
    """Returns its input unchanged, as torch.nn.Identity."""
    def forward(self, input):
        return input


class Linear(Module):
    """y = x @ weight.T + bias, as torch.nn.Linear: weight (out_features, in_features) and bias (out_features) drawn
    as torch draws them; on autocast's lower-precision list."""
    def __init__(self, in_features, out_features, bias=True):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = Parameter(_kaiming_uniform((out_features, in_features), in_features))
        self.bias = Parameter(_uniform((out_features,), _fan_in_bound(in_features))) if bias else None

    def forward(self, input):
        return F.linear(input, self.weight, self.bias)

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


class _ConvNd(Module):
    """What Conv1d and Conv2d share: torch's arguments (padding_mode 'zeros' only), weight and bias
    initialised as torch's, the functional op for the dimensionality (_DIMS)."""

    _DIMS = 2

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1, bias=True,
                 padding_mode="zeros"):
        super().__init__()
        if not isinstance(groups, int) or groups <= 0:
            raise ValueError("groups must be a positive integer")  # torch's texts
        if in_channels % groups:
            raise ValueError("in_channels must be divisible by groups")
        if out_channels % groups:
            raise ValueError("out_channels must be divisible by groups")
        if padding_mode != "zeros":
            raise NotImplementedError(f"{type(self).__name__}: padding_mode {padding_mode!r} is not supported "
                                      "(only 'zeros')")
        tuple_of = (lambda v: (v,) if isinstance(v, int) else tuple(v)) if self._DIMS == 1 else _pair
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.kernel_size, self.stride, self.dilation = tuple_of(kernel_size), tuple_of(stride), tuple_of(dilation)
        self.padding = padding if isinstance(padding, str) else tuple_of(padding)
        self.padding_mode = padding_mode
        fan_in = in_channels // groups * math.prod(self.kernel_size)
        self.weight = Parameter(_kaiming_uniform((out_channels, in_channels // groups) + self.kernel_size, fan_in))
        self.bias = Parameter(_uniform((out_channels,), _fan_in_bound(fan_in))) if bias else None

    def forward(self, input):
        conv = F.conv1d if self._DIMS == 1 else F.conv2d
        return conv(input, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)

    def extra_repr(self):
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"
                + (f", padding={self.padding}" if self.padding not in ((0,), (0, 0), "valid") else "")
                + (f", groups={self.groups}" if self.groups != 1 else "") + (", bias=False" if self.bias is None else ""))


class Conv1d(_ConvNd):
    """A 1-D convolution over (N, C, L) inputs, as torch.nn.Conv1d (stride, padding, dilation, groups, bias); on
    autocast's lower-precision list."""
    _DIMS = 1


class Conv2d(_ConvNd):
    """A 2-D convolution over (N, C, H, W) inputs, as torch.nn.Conv2d (stride, padding, dilation, groups, bias); on
    autocast's lower-precision list."""
    _DIMS = 2


class _BatchNorm(Module):
    """What BatchNorm1d and BatchNorm2d share: running statistics as buffers, and momentum=None's
    cumulative average (1 / batches seen), as torch's."""

    _INPUT_DIMS = ()

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True):
        super().__init__()
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.affine, self.track_running_stats = affine, track_running_stats
        self.weight = Parameter(np.ones(num_features, np.float32)) if affine else None
        self.bias = Parameter(np.zeros(num_features, np.float32)) if affine else None
        if track_running_stats:
            self.register_buffer("running_mean", np.zeros(num_features, np.float32))
            self.register_buffer("running_var", np.ones(num_features, np.float32))
            self.register_buffer("num_batches_tracked", np.zeros((), np.int64))
        else:
            self.running_mean = self.running_var = None

    def forward(self, input):
        ndim = len(shape_of(input, "batch_norm"))
        if ndim not in self._INPUT_DIMS:
            wanted = " or ".join(f"{d}D" for d in self._INPUT_DIMS)
            raise ValueError(f"expected {wanted} input (got {ndim}D input)")
        training = self.training or not self.track_running_stats
        momentum = self.momentum
        if self.training and self.track_running_stats:
            self.num_batches_tracked += 1  # a 0-d NumPy array, in place
            if momentum is None:
                momentum = 1.0 / float(self.num_batches_tracked)
        return F.batch_norm(input, self.running_mean, self.running_var, self.weight, self.bias, training,
                            0.0 if momentum is None else momentum, self.eps)

    def extra_repr(self):
        return f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}"


class BatchNorm1d(_BatchNorm):
    """Batch normalisation over (N, C) or (N, C, L) inputs, as torch.nn.BatchNorm1d: batch statistics in training,
    running ones in eval."""
    _INPUT_DIMS = (2, 3)


class BatchNorm2d(_BatchNorm):
    """Batch normalisation over (N, C, H, W) inputs, as torch.nn.BatchNorm2d: batch statistics in training, running
    ones in eval."""
    _INPUT_DIMS = (4,)


class GroupNorm(Module):
    """Normalises each group of num_channels / num_groups channels, then weight and bias per channel, as
    torch.nn.GroupNorm."""
    def __init__(self, num_groups, num_channels, eps=1e-5, affine=True):
        super().__init__()
        if not isinstance(num_groups, int) or num_groups <= 0:
            raise ValueError(f"num_groups must be a positive integer, got {num_groups!r}")
        if num_channels % num_groups:
            raise ValueError("num_channels must be divisible by num_groups")
        self.num_groups, self.num_channels, self.eps, self.affine = num_groups, num_channels, eps, affine
        self.weight = Parameter(np.ones(num_channels, np.float32)) if affine else None
        self.bias = Parameter(np.zeros(num_channels, np.float32)) if affine else None

    def forward(self, input):
        return F.group_norm(input, self.num_groups, self.weight, self.bias, self.eps)

    def extra_repr(self):
        return f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}"


class LayerNorm(Module):
    """Normalises over the last dimensions (normalized_shape), then elementwise weight and bias, as
    torch.nn.LayerNorm; on autocast's float32 list."""
    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True):
        super().__init__()
        self.normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.eps = eps
        affine = elementwise_affine
        self.weight = Parameter(np.ones(self.normalized_shape, np.float32)) if affine else None
        self.bias = Parameter(np.zeros(self.normalized_shape, np.float32)) if affine and bias else None

    def forward(self, input):
        return F.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self):
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.weight is not None}"


class Embedding(Module):
    """A lookup table of num_embeddings rows of embedding_dim, as torch.nn.Embedding (padding_idx's row gets no
    gradient)."""
    def __init__(self, num_embeddings, embedding_dim, padding_idx=None, max_norm=None, norm_type=2.0,
                 scale_grad_by_freq=False, sparse=False):
        super().__init__()
        if sparse:
            raise NotImplementedError("Embedding: sparse gradients are not supported")
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.max_norm, self.norm_type, self.scale_grad_by_freq = max_norm, norm_type, scale_grad_by_freq
        if padding_idx is not None:  # in [-num_embeddings, num_embeddings), as torch asserts
            padding_idx = _embedding._padding_index("Embedding", padding_idx, num_embeddings)
        self.padding_idx = padding_idx
        weight = _generator().standard_normal((num_embeddings, embedding_dim)).astype(np.float32)
        if padding_idx is not None:
            weight[padding_idx] = 0
        self.weight = Parameter(weight)

    def forward(self, input):
        if self.max_norm is not None:  # on the Parameter, so that autocast's cached copies are dropped
            _embedding.renorm_(self.weight, input, float(self.max_norm), float(self.norm_type))
        return F.embedding(input, self.weight, self.padding_idx, scale_grad_by_freq=self.scale_grad_by_freq)

    def extra_repr(self):
        return f"{self.num_embeddings}, {self.embedding_dim}" + (f", max_norm={self.max_norm}" if self.max_norm else "")


class Dropout(Module):
    """Zeroes each element with probability p in training and scales the rest by 1 / (1 - p), as torch.nn.Dropout;
    the identity in eval."""
    def __init__(self, p=0.5, inplace=False):
        super().__init__()
        if not 0 <= p <= 1:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        self.p, self.inplace = p, inplace

    def forward(self, input):
        return F.dropout(input, self.p, self.training, self.inplace)

    def extra_repr(self):
        return f"p={self.p}, inplace={self.inplace}"


class ReLU(Module):
    """max(x, 0) elementwise, as torch.nn.ReLU."""
    def __init__(self, inplace=False):
        super().__init__()
        self.inplace = inplace

    def forward(self, input):
        return F.relu(input, self.inplace)

    def extra_repr(self):
        return "inplace=True" if self.inplace else ""


class GELU(Module):
    """The Gaussian error linear unit, as torch.nn.GELU (approximate='none' or 'tanh')."""
    def __init__(self, approximate="none"):
        super().__init__()
        self.approximate = approximate

    def forward(self, input):
        return F.gelu(input, approximate=self.approximate)

    def extra_repr(self):
        return f"approximate='{self.approximate}'"


class SiLU(Module):
    """x * sigmoid(x) elementwise, as torch.nn.SiLU."""
    def __init__(self, inplace=False):
        super().__init__()
        self.inplace = inplace

    def forward(self, input):
        return F.silu(input, self.inplace)


class Softplus(Module):
    """log(1 + exp(beta * x)) / beta, linear above threshold, as torch.nn.Softplus; on autocast's float32 list."""
    def __init__(self, beta=1.0, threshold=20.0):
        super().__init__()
        self.beta = beta
        self.threshold = threshold

    def forward(self, input):
        return F.softplus(input, self.beta, self.threshold)

    def extra_repr(self):
        return f"beta={self.beta}, threshold={self.threshold}"


class Mish(Module):
    """x * tanh(softplus(x)) elementwise, as torch.nn.Mish."""
    def __init__(self, inplace=False):
        super().__init__()
        self.inplace = inplace

    def forward(self, input):
        return F.mish(input, inplace=self.inplace)

    def extra_repr(self):
        return "inplace=True" if self.inplace else ""


class Sigmoid(Module):
    """1 / (1 + exp(-x)) elementwise, as torch.nn.Sigmoid."""
    def forward(self, input):
        return F.sigmoid(input)


class Tanh(Module):
    """The hyperbolic tangent elementwise, as torch.nn.Tanh."""
    def forward(self, input):
        return F.tanh(input)


class Softmax(Module):
    """softmax along dim, as torch.nn.Softmax."""
    def __init__(self, dim=None):
        super().__init__()
        self.dim = dim

    def forward(self, input):
        return F.softmax(input, self.dim)

    def extra_repr(self):
        return f"dim={self.dim}"


class LogSoftmax(Softmax):
    """log_softmax along dim, as torch.nn.LogSoftmax."""
    def forward(self, input):
        return F.log_softmax(input, self.dim)


class _Pool2d(Module):
    def extra_repr(self):
        return f"kernel_size={self.kernel_size}, stride={self.stride or self.kernel_size}, padding={self.padding}"


class MaxPool2d(_Pool2d):
    """The maximum over each window of (N, C, H, W) inputs, as torch.nn.MaxPool2d."""
    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, return_indices=False, ceil_mode=False):
        super().__init__()
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self.dilation, self.return_indices, self.ceil_mode = dilation, return_indices, ceil_mode

    def forward(self, input):
        return F.max_pool2d(input, self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode,
                            self.return_indices)


class AvgPool2d(_Pool2d):
    """The mean over each window of (N, C, H, W) inputs, as torch.nn.AvgPool2d."""
    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
                 divisor_override=None):
        super().__init__()
        self.kernel_size, self.stride, self.padding, self.ceil_mode = kernel_size, stride, padding, ceil_mode
        self.count_include_pad, self.divisor_override = count_include_pad, divisor_override

    def forward(self, input):
        return F.avg_pool2d(input, self.kernel_size, self.stride, self.padding, self.ceil_mode, self.count_include_pad,
                            self.divisor_override)


class AdaptiveAvgPool2d(Module):
    """The mean over windows that give output_size planes, as torch.nn.AdaptiveAvgPool2d."""
    def __init__(self, output_size):
        super().__init__()
        self.output_size = output_size

    def forward(self, input):
        return F.adaptive_avg_pool2d(input, self.output_size)

    def extra_repr(self):
        return f"output_size={self.output_size}"


class Flatten(Module):
    """Merges dimensions start_dim..end_dim (1..-1 by default, keeping the batch), as torch.nn.Flatten."""
    def __init__(self, start_dim=1, end_dim=-1):
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, input):
        return F.flatten(input, self.start_dim, self.end_dim)


# -- containers -------------------------------------------------------------------------------


class _ModuleSequence(Module):
    """What Sequential and ModuleList share: submodules in order, named 0, 1, 2 ... (renumbered after
    a deletion or an insertion, as torch's)."""

    def _sliced(self, items):
        raise NotImplementedError

    def _key(self, index):
        """The name of the submodule at index, negative from the end; torch's IndexError outside."""
        index, n = operator.index(index), len(self)
        if not -n <= index < n:
            raise IndexError(f"index {index} is out of range")
        return list(self._modules)[index % n]

    def _renumber(self, modules):
        self._modules.clear()
        for i, module in enumerate(modules):
            self.add_module(str(i), module)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self._sliced(list(self._modules.items())[index])
        return self._modules[self._key(index)]

    def __setitem__(self, index, module):
        self.add_module(self._key(index), module)

    def __delitem__(self, index):
        names = list(self._modules)[index] if isinstance(index, slice) else [self._key(index)]
        for name in names:
            del self._modules[name]
        self._renumber(list(self._modules.values()))

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

    def append(self, module):
        """Add module at the end; returns self."""
        self.add_module(str(len(self)), module)
        return self

    def extend(self, modules):
        """Add each module of an iterable at the end; returns self."""
        if not isinstance(modules, collections.abc.Iterable):
            raise TypeError(f"{type(self).__name__}.extend should be called with an iterable, but got "
                            f"{type(modules).__name__}")
        for module in list(modules):  # list: a container extended by itself
            self.append(module)
        return self

    def insert(self, index, module):
        """Put module before position index (the rest renumbered); returns self."""
        index, n = operator.index(index), len(self)
        if not -n <= index <= n:
            raise IndexError(f"Index out of range: {index}")
        if not isinstance(module, Module):
            raise TypeError(f"{type(module).__name__} is not a Module subclass")
        modules = list(self._modules.values())
        modules.insert(index, module)
        self._renumber(modules)
        return self

    def pop(self, index):
        """Remove the module at index (the rest renumbered) and return it."""
        module = self[index]
        del self[index]
        return module


class Sequential(_ModuleSequence):
    """Runs its modules in order, each on the previous one's output, as torch.nn.Sequential (indexed and sliced as
    torch's)."""
    def __init__(self, *modules):
        super().__init__()
        if len(modules) == 1 and isinstance(modules[0], collections.OrderedDict):
            for name, module in modules[0].items():
                self.add_module(name, module)
        else:
            for module in modules:
                self.append(module)

    def _sliced(self, items):  # the names kept, as torch's (a slice's state dict keys are the model's)
        return Sequential(collections.OrderedDict(items))

    def forward(self, input):
        for module in self._modules.values():
            input = module(input)
        return input


class ModuleList(_ModuleSequence):
    """A list of modules whose parameters the parent sees, as torch.nn.ModuleList."""
    def __init__(self, modules=None):
        super().__init__()
        if modules is not None:
            self.extend(modules)

    def _sliced(self, items):  # numbered again, as torch's
        return ModuleList(module for _, module in items)


class ModuleDict(Module):
    """Submodules by name, in the order they were added (torch.nn.ModuleDict)."""

    def __init__(self, modules=None):
        super().__init__()
        if modules is not None:
            self.update(modules)

    def __getitem__(self, key):
        return self._modules[key]

    def __setitem__(self, key, module):
        self.add_module(key, module)

    def __delitem__(self, key):
        del self._modules[key]

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules)

    def __contains__(self, key):
        return key in self._modules

    def keys(self):
        """The names of the modules, in insertion order."""
        return self._modules.keys()

    def items(self):
        """(name, module) pairs, in insertion order."""
        return self._modules.items()

    def values(self):
        """The modules, in insertion order."""
        return self._modules.values()

    def pop(self, key):
        """Remove the module named key and return it."""
        return self._modules.pop(key)

    def clear(self):
        """Remove every module."""
        self._modules.clear()

    def update(self, modules):
        """Add or replace modules from a mapping or from (name, module) pairs."""
        for name, module in (modules.items() if hasattr(modules, "items") else modules):
            self.add_module(name, module)


# -- losses -----------------------------------------------------------------------------------


class _Loss(Module):
    """A loss's reduction, from torch's legacy size_average and reduce where given."""

    def __init__(self, size_average=None, reduce=None, reduction="mean"):
        super().__init__()
        self.reduction = legacy_reduction(size_average, reduce, reduction)


class _WeightedLoss(_Loss):
    """A loss with class weights: a buffer, as torch's, so that to(device) moves it."""

    def __init__(self, weight=None, size_average=None, reduce=None, reduction="mean"):
        super().__init__(size_average, reduce, reduction)
        self.register_buffer("weight", weight)


class CrossEntropyLoss(_WeightedLoss):
    """cross_entropy of logits against class indices or probabilities, as torch.nn.CrossEntropyLoss (weight,
    ignore_index, reduction, label_smoothing)."""
    def __init__(self, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean",
                 label_smoothing=0.0):
        super().__init__(weight, size_average, reduce, reduction)
        self.ignore_index, self.label_smoothing = ignore_index, label_smoothing

    def forward(self, input, target):
        return F.cross_entropy(input, target, self.weight, ignore_index=self.ignore_index, reduction=self.reduction,
                               label_smoothing=self.label_smoothing)


class NLLLoss(_WeightedLoss):
    """The negative log likelihood of log-probabilities against class indices, as torch.nn.NLLLoss."""
    def __init__(self, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean"):
        super().__init__(weight, size_average, reduce, reduction)
        self.ignore_index = ignore_index

    def forward(self, input, target):
        return F.nll_loss(input, target, self.weight, ignore_index=self.ignore_index, reduction=self.reduction)


class MSELoss(_Loss):
    """The mean squared error, as torch.nn.MSELoss (reduction 'mean', 'sum' or 'none')."""
    def forward(self, input, target):
        return F.mse_loss(input, target, reduction=self.reduction)


class L1Loss(_Loss):
    """The mean absolute error, as torch.nn.L1Loss (reduction 'mean', 'sum' or 'none')."""
    def forward(self, input, target):
        return F.l1_loss(input, target, reduction=self.reduction)


class BCELoss(_WeightedLoss):
    """Binary cross entropy of probabilities against targets, as torch.nn.BCELoss."""
    def forward(self, input, target):
        return F.binary_cross_entropy(input, target, self.weight, reduction=self.reduction)


class BCEWithLogitsLoss(_WeightedLoss):
    """Binary cross entropy computed stably from logits, as torch.nn.BCEWithLogitsLoss (weight, pos_weight)."""
    def __init__(self, weight=None, size_average=None, reduce=None, reduction="mean", pos_weight=None):
        super().__init__(weight, size_average, reduce, reduction)
        self.register_buffer("pos_weight", pos_weight)

    def forward(self, input, target):
        return F.binary_cross_entropy_with_logits(input, target, self.weight, reduction=self.reduction,
                                                  pos_weight=self.pos_weight)
