"""ampc.autograd: backward() through graphs of ampc ops, against float64 finite differences and the
ops' own backward functions; grad mode, retain_graph, the scaler's scaled loss, autocast's dtypes."""

import inspect
import ml_dtypes
import numpy as np
import pytest

import ampc
from ampc.autograd import Tensor
from ampc.nn import _attention

F = ampc.nn.functional
F32, F64 = np.dtype(np.float32), np.dtype(np.float64)


def numeric_grad(loss, param, eps=1e-6):
    """d loss() / d param.data by central differences (float64)."""
    grad = np.zeros_like(param.data)
    for i in np.ndindex(param.data.shape):
        old = param.data[i]
        param.data[i] = old + eps
        up = float(np.asarray(loss().data))
        param.data[i] = old - eps
        down = float(np.asarray(loss().data))
        param.data[i] = old
        grad[i] = (up - down) / (2 * eps)
    return grad


def check_grads(loss, params, rtol=1e-6):
    for p in params:
        p.grad = None
    loss().backward()
    for p in params:
        expected = numeric_grad(loss, p)
        assert p.grad is not None and p.grad.shape == p.data.shape and p.grad.dtype == p.data.dtype
        # central differences of a loss near 1 carry about 1e-10 of rounding error
        np.testing.assert_allclose(p.grad, expected, rtol=rtol, atol=max(rtol * np.abs(expected).max(), 1e-8))


def param(rng, *shape):
    return ampc.nn.Parameter(rng.standard_normal(shape))


@pytest.mark.parametrize("seed", range(4))
def test_residual_mlp_with_shared_weights(seed):
    """A random MLP with a residual connection, one weight used twice, two losses added."""
    rng = np.random.default_rng(seed)
    n, d, k = int(rng.integers(2, 6)), int(rng.integers(2, 6)), int(rng.integers(2, 5))
    x, y = rng.standard_normal((n, d)), rng.integers(0, k, n)
    w_in, b_in, w_shared, w_out = param(rng, d, d), param(rng, d), param(rng, d, d), param(rng, k, d)
    gamma, beta = param(rng, d), param(rng, d)

    def loss():
        h = F.gelu(F.linear(x, w_in, b_in))
        h = h + F.linear(F.relu(F.linear(h, w_shared)), w_shared) * 0.5  # residual, shared weight
        h = F.layer_norm(h, (d,), gamma, beta)
        logits = F.linear(F.silu(h), w_out)
        return F.cross_entropy(logits, y, label_smoothing=0.1) + F.mean(F.log_softmax(logits, 1) ** 2) * 0.01

    check_grads(loss, [w_in, b_in, w_shared, w_out, gamma, beta])


def _random_chain(rng, x):
    """A random chain of the tape's glue and smooth ops on the Parameter x, the same ops each time
    it is called with an rng in the same state: split and chunk into one piece or several, cat and
    stack, elements and rows picked by ints, slices, None and Ellipsis, the shape methods, powers,
    reductions, softmaxes. Returns the chain's end and the names of its steps."""
    def pieces(a, d):
        parts = a.split(int(rng.integers(1, a.shape[d] + 2)), d)  # one piece when the size >= the dimension
        return F.cat([part * float(i + 1) for i, part in enumerate(parts)], d)

    def pick(a):
        key = []
        for size in a.shape:
            kind = int(rng.integers(0, 4))
            key += [[int(rng.integers(-size, size))], [slice(int(rng.integers(0, size)), None, int(rng.integers(1, 3)))],
                    [None, slice(None)], [slice(None)]][kind]
        return a[tuple(key)] if rng.integers(0, 2) else a[(Ellipsis,) + tuple(key[-1:])]

    steps = {
        "pieces": lambda a: pieces(a, int(rng.integers(0, a.ndim))),
        "chunk_stack": lambda a: F.stack([a.chunk(1, 0)[0], a * 2.0], int(rng.integers(0, a.ndim + 1))),
        "pick": pick,
        "transpose": lambda a: a.transpose(int(rng.integers(-a.ndim, a.ndim)), int(rng.integers(-a.ndim, a.ndim))),
        "permute": lambda a: a.permute(*(int(d) for d in rng.permutation(a.ndim))),
        "reshape": lambda a: a.reshape(-1),
        "unsqueeze": lambda a: a.unsqueeze(int(rng.integers(-a.ndim - 1, a.ndim + 1))),
        "squeeze": lambda a: a.squeeze(),
        "flatten": lambda a: a.flatten(int(rng.integers(0, a.ndim))),
        "T": lambda a: a.T,
        "power": lambda a: (a * a + 0.5) ** float(rng.choice([2.0, 0.5, -1.0])),
        "rpow": lambda a: 2.0 ** F.tanh(a),
        "divide": lambda a: 1.5 / (a * a + 1.0) - a,
        "reduce": lambda a: getattr(a, str(rng.choice(["sum", "mean"])))(int(rng.integers(-a.ndim, a.ndim)),
                                                                         keepdim=bool(rng.integers(0, 2))),
        "softmax": lambda a: getattr(a, str(rng.choice(["softmax", "log_softmax"])))(int(rng.integers(-a.ndim, a.ndim))),
        "smooth": lambda a: getattr(a, str(rng.choice(["exp", "sigmoid", "tanh"])))() * 0.5,
        "product": lambda a: a @ a.transpose(-1, -2) if a.ndim >= 2 else a * a,
    }
    names = list(steps)
    trail, out = [], x
    for _ in range(int(rng.integers(1, 7))):
        if out.ndim == 0:
            out = out.unsqueeze(0)
        name = names[int(rng.integers(0, len(names)))]
        out = steps[name](out)
        trail.append(name)
    return out, trail


@pytest.mark.parametrize("seed", range(24))
def test_random_chains_of_glue_and_smooth_ops(seed):
    """Random chains of the tape's ops against float64 finite differences: how a split into one
    piece (its gradient read as the pieces'), a picked element (a NumPy scalar taken for a number:
    no gradient) and a stack of a chunk went wrong, found by such chains against torch."""
    rng = np.random.default_rng(seed)
    x = param(rng, *(int(s) for s in rng.integers(1, 4, size=int(rng.integers(1, 4)))))
    state = rng.bit_generator.state
    out, trail = _random_chain(rng, x)
    g = rng.standard_normal(out.shape)

    def loss():
        rng.bit_generator.state = state
        return F.sum(_random_chain(rng, x)[0] * g)

    x.grad = None
    loss().backward()
    expected = numeric_grad(loss, x)
    assert x.grad is not None and x.grad.shape == x.shape, trail
    np.testing.assert_allclose(x.grad, expected, rtol=1e-5, atol=1e-6 * max(1.0, np.abs(expected).max()),
                               err_msg=str(trail))


def test_abs_sqrt_rsqrt_on_the_tape():
    """As Tensor methods and abs(), against float64 finite differences; rsqrt is float32 under CUDA
    autocast, as torch lists it, and keeps its input's dtype under the CPU's."""
    rng = np.random.default_rng(3)
    w, v = ampc.nn.Parameter(rng.random((3, 4)) + 0.5), param(rng, 3, 4)
    check_grads(lambda: F.sum(w.sqrt() * abs(v) + w.rsqrt() * v.abs() ** 3.0), [w, v])
    assert ampc.autocast_policy("rsqrt", "cuda") == "fp32" and ampc.autocast_policy("rsqrt", "cpu") == "none"
    with ampc.autocast("cpu", dtype=ampc.bfloat16):
        assert F.rsqrt(np.ones(3, np.float32)).dtype == np.float32


def test_convolutional_graph():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 3, 6, 6))
    w1, b1, w2 = param(rng, 4, 3, 3, 3), param(rng, 4), param(rng, 4, 2, 1, 1)
    bn_w, bn_b = param(rng, 4), param(rng, 4)
    fc = param(rng, 5, 4)
    y = np.array([1, 4])

    def loss():
        h = F.conv2d(x, w1, b1, padding=1)
        h = F.batch_norm(h, np.zeros(4), np.ones(4), bn_w, bn_b, training=True)
        h = F.relu(h)
        h = h + F.conv2d(h, w2, groups=2)  # residual through a grouped 1x1 convolution
        h = F.max_pool2d(h, 2)
        h = F.flatten(F.adaptive_avg_pool2d(h, 1), 1)
        return F.cross_entropy(F.linear(h, fc), y)

    check_grads(loss, [w1, b1, w2, bn_w, bn_b, fc], rtol=1e-5)


def test_attention_and_glue():
    rng = np.random.default_rng(3)
    b, t, c, heads = 2, 5, 8, 2
    x = rng.standard_normal((b, t, c))
    w_qkv, w_proj, emb = param(rng, 3 * c, c), param(rng, c, c), param(rng, 11, c)
    idx = rng.integers(0, 11, (b, t))

    def loss():
        h = x + F.embedding(idx, emb)
        q, k, v = F.split(F.linear(h, w_qkv), c, dim=2)
        q, k, v = (F.transpose(F.reshape(z, (b, t, heads, c // heads)), 1, 2) for z in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        att = F.reshape(F.transpose(att, 1, 2), (b, t, c))
        return F.mse_loss(F.linear(att, w_proj), x)

    check_grads(loss, [w_qkv, w_proj, emb])


def test_arithmetic_and_broadcasting():
    rng = np.random.default_rng(5)
    a, b = param(rng, 3, 4), param(rng, 4)
    m = rng.standard_normal((2, 3))

    def loss():
        z = (a * b - b / (F.exp(a) + 2.0)) / 3.0 + (1.0 - a) * F.log(b * b + 1.0)
        # the reflected operators with a number or an ndarray on the left: 1.5 ** b, m @ a
        z = z + 1.5 ** b + F.sum(m @ a, dim=0) * 0.1
        return F.sum(z ** 2, dim=1).mean()

    check_grads(loss, [a, b])


def test_tensor_methods_as_torch_s():
    """The method forms a torch model's forward uses, each on the tape."""
    rng = np.random.default_rng(16)
    a, b = param(rng, 3, 4), param(rng, 4, 1)

    def loss():
        h = (2.0 / (a.exp() + 1.0)).unsqueeze(0).squeeze(0) + a.sigmoid().log_softmax(1) * a.tanh().relu()
        first, second = h.chunk(2, dim=1)
        parts = h.split([1, 3], dim=1)
        total = (first.T @ second).sum() + (h @ b).t().sum() + parts[1].log_softmax(1).mean()
        return total + (a * a + 1.0).log().softmax(0).sum() * 0.5 + h.numel() * 0.0

    check_grads(loss, [a, b])
    assert a.T.shape == (4, 3) and F.relu(a).numel() == 12
    with pytest.raises(ValueError, match="t\\(\\) expects a tensor with <= 2 dimensions"):
        F.reshape(a, (1, 3, 4)).t()


def test_argmax_and_argmin_as_torch_s():
    """Tensor.argmax/argmin (torch's `(logits.argmax(1) == y).mean()`): the values' indices, off the
    tape, with torch's dim and keepdim; on a Parameter too."""
    rng = np.random.default_rng(17)
    w = param(rng, 5, 7)
    logits = F.linear(rng.standard_normal((6, 7)), w)
    assert isinstance(logits, Tensor)
    values = np.asarray(logits)
    np.testing.assert_array_equal(logits.argmax(1), values.argmax(1))
    np.testing.assert_array_equal(logits.argmin(dim=0, keepdim=True), values.argmin(0, keepdims=True))
    assert logits.argmax() == values.argmax() and logits.argmax(-1).shape == (6,)
    np.testing.assert_array_equal(w.argmax(0), w.data.argmax(0))
    with pytest.raises(TypeError, match="argmax: dim must be an int"):
        logits.argmax(1.5)


def test_matches_the_ops_own_backward_functions():
    """backward() of one linear gives exactly what linear_backward gives."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 3)).astype(F32)
    w, bias = ampc.Parameter(rng.standard_normal((5, 3)).astype(F32)), ampc.Parameter(np.zeros(5, F32))
    g = rng.standard_normal((4, 5)).astype(F32)
    F.linear(x, w, bias).backward(g)
    gi, gw, gb = F.linear_backward(g, x, w.data)
    np.testing.assert_array_equal(w.grad, gw)
    np.testing.assert_array_equal(bias.grad, gb)


def test_gradients_add_up_and_no_grad():
    rng = np.random.default_rng(2)
    w = param(rng, 3)
    F.sum(w * 2.0).backward()
    F.sum(w * 3.0).backward()
    np.testing.assert_array_equal(w.grad, np.full(3, 5.0))
    with ampc.no_grad():
        out = F.mul(w, 2.0)
        assert not ampc.is_grad_enabled()
    assert not isinstance(out, Tensor) and ampc.is_grad_enabled()

    @ampc.no_grad()
    def forward():
        return F.mul(w, 2.0)

    assert not isinstance(forward(), Tensor) and ampc.is_grad_enabled()
    frozen = ampc.Parameter(np.ones(3), requires_grad=False)
    assert not isinstance(F.mul(frozen, 2.0), Tensor)
    with ampc.set_grad_enabled(False):
        assert not ampc.is_grad_enabled()
    assert ampc.is_grad_enabled()


def test_what_puts_a_call_on_the_tape():
    """A Tensor or a Parameter that requires grad anywhere among the arguments: positional, keyword,
    inside lists and tuples (cat's); a frozen Parameter or plain arrays leave the call off it."""
    rng = np.random.default_rng(3)
    w, x = param(rng, 3), rng.standard_normal(3).astype(np.float32)
    frozen = ampc.Parameter(x.copy(), requires_grad=False)
    tensor = F.mul(w, 1.0)
    assert isinstance(tensor, Tensor)
    assert isinstance(F.cat((w,), dim=0), Tensor)
    assert isinstance(F.cat((x, tensor)), Tensor)
    assert isinstance(F.add(input=x, other=w), Tensor)
    assert not isinstance(F.cat([x, frozen, x]), Tensor)
    assert not isinstance(F.add(input=frozen, other=x), Tensor)
    nested = [x]
    nested.append(nested)  # holds itself: an error, not a crash
    with pytest.raises(RecursionError):
        F.cat(nested)
    deep = (x,)
    for _ in range(10**6):
        deep = (deep,)
    with pytest.raises(RecursionError):  # the tape's walk, then autocast's
        F.cat([deep])
    with ampc.autocast("cpu"), pytest.raises(RecursionError):
        F.cat(nested)
    frozen.requires_grad = True
    out = F.cat([x, frozen])
    assert isinstance(out, Tensor)
    F.sum(out).backward()
    np.testing.assert_array_equal(frozen.grad, np.ones(3))


def test_a_tape_op_passes_for_its_function():
    """F's ops are ampc.TapeOp objects (the tape's check in C): they keep the op's name, text,
    signature and module, bind as methods as functions do, and off the tape name the argument that
    is no array, as the op itself would (raised from None, the AttributeError as its context)."""
    import copy
    import inspect
    import pickle

    op = F.layer_norm
    assert isinstance(op, ampc._C.TapeOp)
    assert (op.__name__, op.__module__, op.__doc__) == (op.raw.__name__, op.raw.__module__, op.raw.__doc__)
    assert str(inspect.signature(op)) == str(inspect.signature(op.raw)) and op.__wrapped__ is op.raw
    for public in (F.layer_norm, F.cat, F.relu):  # by name, as functions (cat's body lives in _shape_ops)
        assert pickle.loads(pickle.dumps(public)) is public and copy.deepcopy(public) is public

    class Holder:
        relu = F.relu

    x = np.array([-1.0, 2.0], np.float32)
    holder = Holder()
    holder.x = x
    assert Holder.relu is F.relu and holder.relu.__self__ is holder
    np.testing.assert_array_equal(Holder.relu(x), [0.0, 2.0])
    with pytest.raises(TypeError, match="layer_norm: input must be an array") as raised:
        F.layer_norm(object(), (3,))
    error = raised.value
    assert error.__suppress_context__ and isinstance(error.__context__, AttributeError)
    with pytest.raises(TypeError, match="TapeOp: op, record and explain must be callable"):
        ampc._C.TapeOp(F.relu.raw, 1, Tensor)
    with pytest.raises(TypeError):
        ampc._C.TapeOp(F.relu.raw, F.relu.raw, "not a type")


def test_retain_graph_and_errors():
    w = ampc.nn.Parameter(np.ones(3))
    y = F.sum(F.exp(w))
    y.backward(retain_graph=True)
    y.backward()
    np.testing.assert_allclose(w.grad, 2 * np.exp(np.ones(3)))
    with pytest.raises(RuntimeError, match="Trying to backward through the graph a second time"):
        y.backward()
    with pytest.raises(RuntimeError, match="grad can be implicitly created only for scalar outputs"):
        F.exp(w).backward()
    with pytest.raises(RuntimeError, match=r"Mismatch in shape: grad_output\[0\] has a shape of \(2,\) and output\[0\] "
                       r"has a shape of \(3,\)"):
        F.exp(w).backward(np.ones(2))
    with pytest.raises(RuntimeError, match="element 0 of tensors does not require grad"):
        ampc.autograd.run_backward(np.ones(3), None, False)
    for bad in ([1.0, 1.0, 1.0], "abc", 2.0):  # torch's text; was the AttributeError of .shape
        with pytest.raises(TypeError, match=f"gradients can be either Tensors or None, but got {type(bad).__name__}"):
            F.exp(w).backward(bad)
    assert w.grad is not None and np.allclose(w.grad, 2 * np.exp(np.ones(3)))  # untouched by the refusals


def test_scaled_loss_backward():
    """scaler.scale(loss).backward() leaves scale times the gradient, as torch's recipe."""
    w = ampc.Parameter(np.array([1.0, 2.0], F32))
    scaler = ampc.GradScaler("cpu", init_scale=1024.0)
    loss = F.sum(F.mul(w, w))
    scaled = scaler.scale(loss)
    assert isinstance(scaled, Tensor) and float(scaled) == 1024.0 * 5.0
    scaled.backward()
    np.testing.assert_array_equal(w.grad, np.array([2048.0, 4096.0], F32))


def test_autocast_dtypes_on_the_tape():
    """Under CPU autocast (bfloat16) linear runs in bfloat16 and the loss in float32; the float32
    weight's gradient comes back in float32, the bfloat16 product's gradient cast up, as torch's."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((8, 6)).astype(F32)
    y = rng.integers(0, 3, 8)
    w = ampc.Parameter(rng.standard_normal((3, 6)).astype(F32))
    with ampc.autocast("cpu"):
        logits = F.linear(x, w)
        loss = F.cross_entropy(logits, y)
    assert logits.dtype == ampc.bfloat16 and loss.dtype == F32
    assert loss.grad_fn.args["input"] is logits.data  # the 16-bit logits kept, not autocast's float32 copy
    loss.backward()
    assert w.grad.dtype == F32
    # the same arithmetic by hand: cross_entropy's gradient (float32, from bfloat16 logits), cast to
    # bfloat16 for linear's backward, its weight gradient cast back to float32
    g_logits = F.cross_entropy_backward(np.float32(1.0), logits.data.astype(F32), y)
    _, gw, _ = F.linear_backward(ampc.cast(g_logits, ampc.bfloat16), ampc.cast(x, ampc.bfloat16),
                                 ampc.cast(w.data, ampc.bfloat16), bias_grad=False)
    np.testing.assert_array_equal(w.grad, ampc.cast(gw, F32))


def test_the_remaining_ops_are_on_the_tape():
    """sigmoid, tanh, addmm, baddbmm, binary_cross_entropy, max_pool2d_with_indices, cat and stack:
    every public op records itself (an op that did not would drop the graph without a word)."""
    rng = np.random.default_rng(8)
    x, m1, m2 = param(rng, 3, 4), param(rng, 3, 5), param(rng, 5, 4)
    b, b1, b2 = param(rng, 2, 1, 4), param(rng, 2, 3, 5), param(rng, 2, 5, 4)
    probs = ampc.nn.Parameter(rng.random((2, 3)) * 0.8 + 0.1)
    image = param(rng, 1, 2, 4, 4)

    def loss():
        h = F.sigmoid(F.addmm(F.tanh(x), m1, m2, beta=0.5, alpha=2.0))
        h = F.cat([h, np.ones((3, 1)), h * 2.0], dim=1)
        total = F.sum(h ** 2) + F.sum(F.baddbmm(b, b1, b2, alpha=0.5) ** 2)
        total = total + F.binary_cross_entropy(probs, np.full((2, 3), 0.3))
        pooled, _ = F.max_pool2d_with_indices(image, 2)
        return total + F.sum(F.stack([pooled, pooled * 3.0], dim=0) ** 2)

    check_grads(loss, [x, m1, m2, b, b1, b2, probs, image], rtol=1e-5)


def test_an_array_exponent_gets_its_gradient():
    """base ** exponent with both learned and broadcast against each other (a learned per-channel
    power, as in Box-Cox layers): each gradient summed back to its own shape."""
    rng = np.random.default_rng(12)
    base = ampc.nn.Parameter(rng.random((3, 1, 4)) + 0.5)
    exponent = param(rng, 5, 1)

    def loss():
        return F.sum(base ** exponent * 0.5) + F.sum(F.pow(base, 3.0))

    check_grads(loss, [base, exponent])


@pytest.mark.parametrize("gqa", [False, True])
def test_a_learned_attention_bias_gets_its_gradient(gqa):
    """An additive attn_mask that needs a gradient (T5's and Swin's relative position biases): the
    scores' gradient summed over the dimensions the mask was broadcast along."""
    rng = np.random.default_rng(10)
    q = param(rng, 2, 4, 5, 3)
    k, v = param(rng, 2, 2 if gqa else 4, 6, 3), param(rng, 2, 2 if gqa else 4, 6, 2)
    per_head, shared = param(rng, 1, 4, 5, 6), param(rng, 5, 6)

    def loss():
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=per_head, enable_gqa=gqa)
        out = out + F.scaled_dot_product_attention(q, k, v, attn_mask=shared, enable_gqa=gqa)
        return F.sum(out * out)

    check_grads(loss, [q, k, v, per_head, shared])


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_soft_targets_get_their_gradients(reduction):
    """Probability targets of cross_entropy (label smoothing, class weights, spatial), and the targets
    of binary_cross_entropy and its _with_logits form (weights, pos_weight), as torch differentiates
    them."""
    rng = np.random.default_rng(11)
    logits, probs = param(rng, 3, 4, 2), ampc.nn.Parameter(rng.random((3, 4, 2)) * 0.8 + 0.1)
    soft = ampc.nn.Parameter(rng.random((3, 4, 2)))
    weight, pos_weight = rng.random(2) + 0.5, rng.random(2) * 3

    def loss():
        parts = [F.cross_entropy(logits, soft, rng_weight, reduction=reduction, label_smoothing=0.2),
                 F.binary_cross_entropy(probs, soft, weight, reduction=reduction),
                 F.binary_cross_entropy_with_logits(logits, soft, weight, reduction=reduction, pos_weight=pos_weight)]
        return sum(F.sum(p * p) if reduction == "none" else p for p in parts[1:]) + F.sum(parts[0] * 1.5)

    rng_weight = rng.random(4) + 0.5
    check_grads(loss, [logits, probs, soft])


def test_an_argument_without_a_derivative_is_an_error_not_a_silent_none():
    """A class weight that needs a gradient: torch's RuntimeError when backward reaches the loss
    (it was left without a gradient, the model training on without it)."""
    rng = np.random.default_rng(12)
    logits, weight = param(rng, 3, 4), ampc.nn.Parameter(rng.random(4) + 0.5)
    loss = F.cross_entropy(logits, np.array([0, 1, 3]), weight)
    with pytest.raises(RuntimeError, match="the derivative for 'weight' is not implemented"):
        loss.backward()


def test_bce_with_logits_pos_weight_on_the_tape():
    rng = np.random.default_rng(9)
    logits, target = param(rng, 4, 3), rng.random((4, 3))
    pos_weight, weight = rng.random(3) * 3, rng.random(3) + 0.5
    check_grads(lambda: F.binary_cross_entropy_with_logits(logits, target, weight, pos_weight=pos_weight), [logits])


def test_every_public_op_is_recorded():
    from ampc.nn._differentiable import OPS

    public = [n for n in dir(F) if not n.startswith("_") and not n.endswith("_backward")
              and callable(getattr(F, n)) and n not in ("as_dtype", "autocast_op")]
    assert sorted(n for n in public if n not in OPS) == []


def test_functional_publishes_each_op_of_the_tape_under_its_name():
    """functional.py lists the ops it publishes one by one: an op left out of the list, or listed
    bare, would run off the tape without a word. Each public one pickles by its name there."""
    import pickle

    from ampc.nn._differentiable import OPS

    for name, op in OPS.items():
        assert getattr(F, name, None) is op, name
        if not name.startswith("_"):
            assert (op.__module__, op.__qualname__) == ("ampc.nn.functional", name)
            assert pickle.loads(pickle.dumps(op)) is op


def test_indexing_and_dtype_conversions_on_the_tape():
    rng = np.random.default_rng(9)
    w = param(rng, 3, 4)

    def loss():
        h = (w * 2.0)[1:, 1:3].to(np.float64) + w[0, 1:3]
        return F.sum(h ** 2) + F.sum(w[-1])

    check_grads(loss, [w])
    w.grad = None
    y = (w * 1.0).half()
    assert y.dtype == ampc.float16 and w[0].float().dtype == np.float32
    F.sum(y).backward()
    assert w.grad.dtype == np.float64  # the cast's gradient comes back in the parameter's dtype
    np.testing.assert_array_equal(w.grad, np.ones((3, 4)))


def test_relu_and_add_let_go_of_what_their_backward_does_not_read():
    """relu's backward reads its output, add's only its inputs' shapes: neither keeps an input
    alive until backward (a ResNet would hold one more activation per layer)."""
    import gc
    import weakref

    rng = np.random.default_rng(11)
    p = ampc.nn.Parameter(rng.standard_normal((4, 5)))
    q = ampc.nn.Parameter(rng.standard_normal(5))
    a, b = F.mul(p, 3.0), F.mul(q, -2.0)
    kept = [weakref.ref(t.data) for t in (a, b)]
    loss = F.sum(F.mul(F.relu(F.add(a, b)), F.relu(F.sub(a, b))))
    del a, b
    gc.collect()
    assert [r() for r in kept] == [None, None]
    loss.backward()
    x, y = 3 * p.data, -2 * q.data
    s, d = x + y, x - y
    rs, rd = np.maximum(s, 0), np.maximum(d, 0)
    gs, gd = rd * (s > 0), rs * (d > 0)
    np.testing.assert_allclose(p.grad, 3 * (gs + gd), rtol=1e-12)
    np.testing.assert_allclose(q.grad, -2 * (gs - gd).sum(axis=0), rtol=1e-12)


@pytest.mark.parametrize("dropout_p", [0.0, 0.3])
def test_attention_keeps_no_probabilities_between_the_passes(dropout_p):
    """The tape keeps q, k and v and dropout's seed, not the (B, H, L, S) probabilities: the backward
    recomputes them, bit for bit, so the gradients are those of the probabilities the forward used."""
    rng = np.random.default_rng(12)
    q, k, v = (ampc.nn.Parameter(rng.standard_normal((2, 3, 5, 4)).astype(np.float32)) for _ in range(3))
    g = rng.standard_normal((2, 3, 5, 4)).astype(np.float32)
    ampc.manual_seed(3)
    out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
    saved = out.grad_fn.saved
    assert saved is None or (isinstance(saved, tuple) and all(isinstance(s, int) for s in saved))
    out.backward(g)
    ampc.manual_seed(3)
    _, probs, state = _attention._forward(q.data, k.data, v.data, None, dropout_p, True)
    want = F.scaled_dot_product_attention_backward(g, q.data, k.data, v.data, probs, dropout_p, None, state)
    for p, w in zip((q, k, v), want):
        np.testing.assert_array_equal(p.grad, w)


def test_in_place_forms_write_the_callers_array():
    """relu, silu and dropout with inplace=True change the array given and return it, as torch's do
    (they returned a new array and left the input as it was); so do the modules."""
    rng = np.random.default_rng(12)
    x = rng.standard_normal((4, 5)).astype(np.float32)
    for fn, want in ((lambda a: F.relu(a, inplace=True), F.relu(x)), (lambda a: F.silu(a, inplace=True), F.silu(x)),
                     (lambda a: F.dropout(a, 0.0, inplace=True), x), (ampc.nn.ReLU(inplace=True), F.relu(x))):
        a = x.copy()
        assert fn(a) is a
        np.testing.assert_array_equal(a, want)
    a = x.copy()
    assert ampc.nn.ReLU()(a) is not a and np.array_equal(a, x)
    assert repr(ampc.nn.ReLU(inplace=True)) == "ReLU(inplace=True)" and repr(ampc.nn.ReLU()) == "ReLU()"
    assert repr(ampc.nn.Dropout(0.2)) == "Dropout(p=0.2, inplace=False)"


@pytest.mark.parametrize("grad_mode", [True, False], ids=["on the tape", "under no_grad"])
def test_in_place_on_a_tensor_keeps_what_other_nodes_saw(grad_mode):
    """relu(t, inplace=True) on a Tensor whose array another node kept for its backward (mul keeps
    its inputs): the Tensor takes the result (on the tape, the relu node too, as torch moves its
    grad_fn), the kept array is not written, and the gradients are those of the out-of-place graph."""
    rng = np.random.default_rng(13)
    x = rng.standard_normal((3, 4))
    w = ampc.nn.Parameter(rng.standard_normal((5, 4)))

    def run(in_place):
        w.grad = None
        t = F.linear(x, w)
        h = F.mul(t, t)
        if in_place:
            with ampc.autograd.set_grad_enabled(grad_mode):
                assert F.relu(t, inplace=True) is t
            u = t
        else:
            u = F.relu(t) if grad_mode else Tensor(F.relu(t.data), t.grad_fn, t._index)
        (F.sum(h) + F.sum(u)).backward()
        return w.grad.copy(), np.asarray(u.data).copy()

    (g_in_place, u_in_place), (g_copy, u_copy) = run(True), run(False)
    np.testing.assert_array_equal(u_in_place, np.maximum(x @ w.data.T, 0))
    np.testing.assert_array_equal(u_in_place, u_copy)
    np.testing.assert_array_equal(g_in_place, g_copy)


def test_in_place_on_a_parameter_that_needs_a_gradient_is_refused():
    p = ampc.nn.Parameter(np.array([-1.0, 2.0]))
    with pytest.raises(RuntimeError, match="a leaf Variable that requires grad is being used in an in-place operation"):
        F.relu(p, inplace=True)
    np.testing.assert_array_equal(p.data, [-1.0, 2.0])


def test_backward_of_a_tensor_without_a_graph():
    """A Tensor no op made (grad_fn None): torch's RuntimeError, not an AttributeError from the walk."""
    with pytest.raises(RuntimeError, match="does not require grad and does not have a grad_fn"):
        ampc.autograd.Tensor(np.ones((), np.float32), None).backward()


@pytest.mark.parametrize("key", [
    np.array([0, 2, 2, 3]),                                   # an index taken twice
    (np.array([0, 1, 1]), np.array([4, 0, 4])),               # pairs, one repeated
    (slice(None), np.array([4, 0, 4])),                       # a slice and an index array
    np.array([True, False, True, True]),                      # a mask
    [1, 1, 0],                                                # a list
    (slice(1, 3), Ellipsis, np.array([2])),
    (1, slice(None, None, 2)),                                # basic: a view
    (1, 2, 3),                                                # one element (NumPy makes it a scalar)
    -1,
], ids=repr)
def test_indexing_gradients_add_up_repeated_indices(rng, key):
    """Tensor[key] with index arrays and masks (logits[rows, targets]): the gradient adds g at each
    picked element, an element picked twice getting both (it got zeros: g was written into NumPy's
    copy of the picked elements)."""
    x = rng.standard_normal((4, 5, 6))
    w = ampc.nn.Parameter(x.copy())
    out = w[key]
    np.testing.assert_array_equal(out.data, x[key])
    g = rng.standard_normal(out.data.shape)
    F.sum(out * g).backward()
    want = np.zeros_like(x)
    np.add.at(want, key, g)
    np.testing.assert_allclose(w.grad, want, rtol=1e-12, atol=1e-12)


def test_indexing_gradients_of_16_bit_data_round_once(rng):
    """An element picked 300 times: its gradient summed in float32 and rounded once to bfloat16."""
    x = np.ones((3, 2), ml_dtypes.bfloat16)
    w = ampc.nn.Parameter(x.copy())
    key = np.zeros(300, np.int64)
    g = np.full((300, 2), 1.0 / 3, np.float32).astype(ml_dtypes.bfloat16)
    F.sum(w[key] * g).backward()
    assert w.grad.dtype == ml_dtypes.bfloat16
    want = np.float32(g.astype(np.float32)[:, 0].sum())
    np.testing.assert_array_equal(w.grad[0].astype(np.float32), np.full(2, want).astype(ml_dtypes.bfloat16)
                                  .astype(np.float32))
    assert not w.grad[1:].astype(np.float32).any()


def test_one_element_picked_then_used_keeps_its_gradient(rng):
    """w[1, 2] * 2: NumPy's x[1, 2] is a scalar, which the product took for a Python number (np.float64
    is a float) and gave no gradient, in silence; written into, the backward raised."""
    w = param(rng, 2, 3)
    check_grads(lambda: w[1, 2] * 2.0 + w[0, 0] * w[1, 2], [w])


@pytest.mark.parametrize("size, dim", [(2, 0), (5, 1), (3, -1)])
def test_a_split_into_one_piece_passes_its_gradient_through(rng, size, dim):
    """split(size) of a dimension no longer than size is one piece, returned in a tuple as torch's:
    its backward read the gradient's rows as the pieces' gradients."""
    w = param(rng, 2, 3)
    g = rng.standard_normal((2, 3))
    check_grads(lambda: F.sum(w.split(size, dim)[0] * g) + F.sum(w.chunk(1, dim)[0] ** 2), [w])


def test_parameters_answer_size_and_dim_as_tensors_do():
    w = ampc.nn.Parameter(np.ones((3, 4), np.float32))
    t = w * 2.0
    for a in (w, t):
        assert a.size() == (3, 4) and a.size(1) == 4 and a.size(-2) == 3 and a.dim() == 2 and a.numel() == 12
        assert a.ndim == 2


def test_parameters_pass_for_their_arrays():
    """np.asarray(p) is p's array (it was a NumPy object array of Tensors, one per row); DLPack
    consumers see it too; a Parameter made from another holds that one's array, as torch's shares its
    storage."""
    x = np.arange(6.0).reshape(2, 3)
    for p in (ampc.Parameter(x), ampc.nn.Parameter(x)):
        assert np.asarray(p) is x and np.asarray(p, np.float32).dtype == np.float32
        assert np.array(p) is not x and np.array_equal(np.array(p), x)
        np.testing.assert_array_equal(np.from_dlpack(p), x)
        assert p.ndim == 2
        with pytest.raises(ValueError):
            np.asarray(p, np.float32, copy=False)
        q = ampc.nn.Parameter(p)
        assert q.data is x
        q.data = ampc.Parameter(x[0])
        assert np.shares_memory(q.data, x) and q.data.shape == (3,) and q._version == 1


def test_backward_refuses_parameters_written_since_the_forward():
    """An optimizer step (or `p.data = ...`) between a forward and its backward: torch's RuntimeError
    naming the versions, and no gradient written; the gradients were computed from the new values,
    in silence. A write before the forward, or after the backward, is fine."""
    w = ampc.nn.Parameter(np.ones(3, np.float32))
    v = ampc.nn.Parameter(np.full(3, 2.0, np.float32))
    opt = ampc.optim.SGD([v], lr=1.0)
    v.grad = np.ones(3, np.float32)
    opt.step()  # before the forward: fine
    loss = F.sum(w * v) + F.sum(w.exp())
    opt.step()
    with pytest.raises(RuntimeError, match=r"modified by an inplace operation: \[Parameter \(3,\)\] is at version 2; "
                                           r"expected version 1 instead\."):
        loss.backward()
    assert w.grad is None  # nothing half-written
    loss = F.sum(w * v)
    v.data = v.data * 0.5
    with pytest.raises(RuntimeError, match="is at version 3; expected version 2"):
        loss.backward()
    loss = F.sum(w * v)
    loss.backward()
    np.testing.assert_array_equal(w.grad, v.data)


def test_tensor_operators_before_their_ops_are_registered_raise_a_clear_error():
    """autograd sits below nn: its operators reach ampc.nn.functional through set_tensor_ops, which
    functional calls at its import. Without it they raise, naming what is missing."""
    a = ampc.autograd.Tensor(np.ones(3, np.float32), None)
    ampc.autograd.set_tensor_ops(None)
    try:
        for use in (lambda: a + 1, lambda: -a, lambda: a.sum()):
            with pytest.raises(RuntimeError, match="ampc.nn.functional, which has not been imported yet"):
                use()
    finally:
        ampc.autograd.set_tensor_ops(ampc.nn.functional)
    np.testing.assert_array_equal(np.asarray((a + 1).data), 2.0)


def test_the_tape_builds_each_op_whose_gradient_needs_only_its_input():
    """_bare_ops.GRADIENT_AT_INPUT is how such an op reaches the tape (written once, in _bare_ops):
    each entry pairs the op with its own *_backward, and functional publishes the tape's version."""
    from ampc.nn import _bare_ops, _differentiable

    assert {"silu", "softplus", "mish", "gelu", "log", "abs"} <= set(_bare_ops.GRADIENT_AT_INPUT)
    for name, (forward, backward, arguments) in _bare_ops.GRADIENT_AT_INPUT.items():
        assert forward is getattr(_bare_ops, name) and backward is getattr(_bare_ops, name + "_backward")
        assert set(arguments) <= set(inspect.signature(forward).parameters)
        assert getattr(F, name) is _differentiable.OPS[name]
        values = np.linspace(-3, 3, 7, dtype=np.float32) + 0.25  # log's input: every value nonzero
        x = ampc.nn.Parameter(values)
        F.sum(getattr(F, name)(x)).backward()
        np.testing.assert_array_equal(np.asarray(x.grad), np.asarray(backward(np.ones(7, np.float32), values)))
