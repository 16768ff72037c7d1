"""ampc.nn.functional: the ops autocast governs, forward and backward, on NumPy arrays (C kernels,
NumPy's BLAS) and GPU buffers (CUDA kernels, cuBLASLt), with PyTorch's names, arguments and
defaults.

Each forward op that torch's autocast lists is an ampc.AutocastOp under torch's op name, so inside
``ampc.autocast`` it runs in the precision torch would choose (``linear`` in float16/bfloat16,
``softmax`` and the losses in float32), through the one policy engine. The kernels load every
operand into float32 (float64 for float64 data), compute there and round each result once.

Arrays come back as the caller's type (NumPy in, NumPy out; torch in, torch out). The
``*_backward`` functions take the gradient of the output and what the forward saw, and return
the gradients of the inputs, in the dtypes the forward ran in.

This module only publishes. The ops live in _bare_ops.py (matrix products, softmax and the norms,
losses, reductions, pointwise maths) and in _attention, _embedding, _shape_ops and _spatial; a
forward op is published as _differentiable.py puts it on ampc.autograd's tape (the bare op with
plain arrays, a Tensor when an argument needs a gradient), a backward as it is.
"""

# math, numbers, np, as_dtype, autocast_op, F32, F64 and OPS were names of this module while the
# ops were written here; they stay, unused, so that its attributes stay as they were.
import math  # noqa: F401
import numbers  # noqa: F401
import sys as _sys

import numpy as np  # noqa: F401

from ampc._C import as_dtype  # noqa: F401
from ampc._arguments import names_non_arrays as _names_non_arrays
from ampc.amp import autocast_op  # noqa: F401
from ampc.autograd import set_tensor_ops as _set_tensor_ops
from ampc.nn import _attention, _embedding, _shape_ops, _spatial
from ampc.nn._bare_ops import (  # noqa: F401 - off the tape; each names an argument that is no array
    abs_backward, binary_cross_entropy_backward, binary_cross_entropy_with_logits_backward, cross_entropy_backward,
    exp_backward, gelu_backward, group_norm_backward, l1_loss_backward, layer_norm_backward, linear_backward,
    log_backward, log_softmax_backward, matmul_backward, mean_backward, mish_backward, mse_loss_backward,
    nll_loss_backward, pow_backward, pow_exponent_backward, relu_backward, rsqrt_backward, silu_backward,
    softmax_backward, softplus_backward, sqrt_backward, sum_backward)
from ampc.nn._common import F32, F64, OPS  # noqa: F401
from ampc.nn._differentiable import OPS as _TAPE

# --------------------------------------------------------------------------------------------
# The forward ops, on the tape (ampc/nn/_differentiable.py): with plain arrays they are the
# bare ops. Each is pickled by the name it has here.
# --------------------------------------------------------------------------------------------

# matrix products, softmax and the norms, losses, reductions, pointwise maths (_bare_ops.py)
linear = _TAPE["linear"]
matmul = _TAPE["matmul"]
mm = _TAPE["mm"]
bmm = _TAPE["bmm"]
addmm = _TAPE["addmm"]
baddbmm = _TAPE["baddbmm"]
softmax = _TAPE["softmax"]
log_softmax = _TAPE["log_softmax"]
layer_norm = _TAPE["layer_norm"]
group_norm = _TAPE["group_norm"]
cross_entropy = _TAPE["cross_entropy"]
nll_loss = _TAPE["nll_loss"]
mse_loss = _TAPE["mse_loss"]
l1_loss = _TAPE["l1_loss"]
binary_cross_entropy = _TAPE["binary_cross_entropy"]
binary_cross_entropy_with_logits = _TAPE["binary_cross_entropy_with_logits"]
sum = _TAPE["sum"]  # noqa: A001 - torch's name
mean = _TAPE["mean"]
exp = _TAPE["exp"]
log = _TAPE["log"]
pow = _TAPE["pow"]  # noqa: A001 - torch's name
sqrt = _TAPE["sqrt"]
rsqrt = _TAPE["rsqrt"]
relu = _TAPE["relu"]
gelu = _TAPE["gelu"]
silu = _TAPE["silu"]
softplus = _TAPE["softplus"]
mish = _TAPE["mish"]
sigmoid = _TAPE["sigmoid"]
tanh = _TAPE["tanh"]
abs = _TAPE["abs"]  # noqa: A001 - torch's name
add = _TAPE["add"]
sub = _TAPE["sub"]
mul = _TAPE["mul"]
div = _TAPE["div"]

# convolutions, batch norm, pooling (_spatial.py)
conv1d = _TAPE["conv1d"]
conv2d = _TAPE["conv2d"]
batch_norm = _TAPE["batch_norm"]
max_pool2d = _TAPE["max_pool2d"]
max_pool2d_with_indices = _TAPE["max_pool2d_with_indices"]
avg_pool2d = _TAPE["avg_pool2d"]
adaptive_avg_pool2d = _TAPE["adaptive_avg_pool2d"]

# dropout and embedding (_embedding.py), attention (_attention.py)
dropout = _TAPE["dropout"]
embedding = _TAPE["embedding"]
scaled_dot_product_attention = _TAPE["scaled_dot_product_attention"]

# the shape ops (_shape_ops.py)
reshape = _TAPE["reshape"]
flatten = _TAPE["flatten"]
unsqueeze = _TAPE["unsqueeze"]
squeeze = _TAPE["squeeze"]
transpose = _TAPE["transpose"]
permute = _TAPE["permute"]
cat = _TAPE["cat"]
stack = _TAPE["stack"]
split = _TAPE["split"]
chunk = _TAPE["chunk"]

# what Tensor.to and Tensor[key] record (not public)
_cast = _TAPE["_cast"]
_index = _TAPE["_index"]

# --------------------------------------------------------------------------------------------
# The backward ops of the other modules, off the tape: an argument that is no array gets the
# TypeError that names it (those of _bare_ops.py get it where they are defined). Their modules
# call them unwrapped.
# --------------------------------------------------------------------------------------------

conv1d_backward = _names_non_arrays(_spatial.conv1d_backward)
conv2d_backward = _names_non_arrays(_spatial.conv2d_backward)
batch_norm_backward = _names_non_arrays(_spatial.batch_norm_backward)
max_pool2d_backward = _names_non_arrays(_spatial.max_pool2d_backward)
avg_pool2d_backward = _names_non_arrays(_spatial.avg_pool2d_backward)
adaptive_avg_pool2d_backward = _names_non_arrays(_spatial.adaptive_avg_pool2d_backward)
dropout_backward = _names_non_arrays(_embedding.dropout_backward)
embedding_backward = _names_non_arrays(_embedding.embedding_backward)
scaled_dot_product_attention_backward = _names_non_arrays(_attention.scaled_dot_product_attention_backward)
reshape_backward = _names_non_arrays(_shape_ops.reshape_backward)
transpose_backward = _names_non_arrays(_shape_ops.transpose_backward)
permute_backward = _names_non_arrays(_shape_ops.permute_backward)
cat_backward = _names_non_arrays(_shape_ops.cat_backward)
stack_backward = _names_non_arrays(_shape_ops.stack_backward)

# The ops that the Tensor operators (a + b, .sum(), ...) and backward's sums call: this module,
# complete now.
_set_tensor_ops(_sys.modules[__name__])
