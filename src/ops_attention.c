/*
 * ops_attention.c: the entry points of fused attention (op_descriptors.h's
 * ampc_attention; kernels in cuda/attention.cu), as private functions of
 * ampc._C that ampc.nn's scaled_dot_product_attention takes when they serve
 * its arguments:
 *   _attention(query, key, value, is_causal, scale, dropout_p=0, seed=0,
 *              offset=0) -> (output, lse) or None
 *   _attention_backward(grad_output, query, key, value, output, lse,
 *                       is_causal, scale, dropout_p=0, seed=0, offset=0)
 *                       -> (grad_query, grad_key, grad_value) or None
 * None says "not served here" (a backend without it, the CPU's; another dtype or head
 * dimension, a GPU before sm_80, unaligned rows): the caller composes the
 * attention from products and a softmax instead. key and value may have
 * fewer heads than query, a divisor of them: grouped-query attention, whose
 * caller has checked that it was asked for (torch's enable_gqa). Outputs
 * take the memory order of the operand they belong to, so attention's
 * (batch, len, heads, head_dim) views give outputs that transpose back
 * without a copy.
 */
#include "ampc.h"

#include <math.h>

#include "kernels/op_descriptors.h"
#include "op_args.h"

/* Dropout's terms in d (op_descriptors.h): p in [0, 1] (0: none), the draw (seed, offset) as the composed
 * attention's dropout takes it. -1 with ValueError for another p. */
static int set_dropout(ampc_attention *d, double p, unsigned long long seed, unsigned long long offset)
{
    if (!(p >= 0.0 && p <= 1.0)) {
        PyErr_SetString(PyExc_ValueError, "dropout probability has to be between 0 and 1");
        return -1;
    }
    d->seed = seed;
    d->offset = offset;
    d->keep_below = (uint32_t)llround((1.0 - p) * 16777216.0);
    d->keep_scale = p < 1.0 ? (float)(1.0 / (1.0 - p)) : 0.0f;
    return 0;
}

/* x as a kernel operand: element strides of its first three dimensions
 * (after ampc_op_dense where head_dim's stride is not 1). */
static int operand_of(ampc_op_args *a, ampc_view *x, ampc_attention_arg *out)
{
    const int64_t size = ampc_dtype_size(x->dtype);
    int unit = x->shape[3] == 1 || x->strides[3] == size;
    for (int d = 0; d < 3 && unit; d++)
        unit = x->strides[d] % size == 0;
    if (!unit && ampc_op_dense(a, x) < 0)
        return -1;
    out->data = x->data;
    for (int d = 0; d < 3; d++)
        out->stride[d] = x->strides[d] / size;
    return 0;
}

/* An output of `shape` laid out in like's memory order, as a kernel operand. */
static PyObject *output_like(ampc_op_args *a, const ampc_view *like, const int64_t *shape,
                             ampc_attention_arg *out)
{
    int64_t strides[4];
    ampc_layout_korder_strides(4, shape, like->strides, ampc_dtype_size(like->dtype), strides);
    ampc_view v;
    PyObject *obj = ampc_op_output_strided(a, like->dtype, 4, shape, strides, &v);
    if (obj != NULL && operand_of(a, &v, out) < 0)
        return NULL;
    return obj;
}

/* Read query, key and value into d: (batch, heads, len, head_dim) each, one
 * dtype. 1: served so far; 0: not served (the caller answers None); -1:
 * an exception. */
static int read_operands(ampc_op_args *a, PyObject *const objs[3], ampc_view *views[3], int causal, double scale,
                         ampc_attention *d)
{
    static const char *names[3] = {"query", "key", "value"};
    for (int i = 0; i < 3; i++)
        if ((views[i] = ampc_op_arg(a, objs[i], names[i], AMPC_ARG_FLOAT)) == NULL)
            return -1;
    const ampc_view *q = views[0], *k = views[1], *v = views[2];
    if (ampc_backend_of(a->st, a->device)->attention == NULL || q->ndim != 4 || k->ndim != 4 || v->ndim != 4 ||
        k->dtype != q->dtype || v->dtype != q->dtype || (q->dtype != AMPC_FLOAT16 && q->dtype != AMPC_BFLOAT16))
        return 0;
    /* one batch; key and value heads alike, query heads a multiple of them (grouped-query
     * attention); the rest (broadcast batches, other head dimensions of value) is composed */
    if (k->shape[0] != q->shape[0] || v->shape[0] != q->shape[0] || v->shape[1] != k->shape[1] ||
        k->shape[1] == 0 || q->shape[1] % k->shape[1] != 0)
        return 0;
    if (k->shape[3] != q->shape[3] || v->shape[3] != q->shape[3] || v->shape[2] != k->shape[2])
        return 0;
    *d = (ampc_attention){.dtype = q->dtype, .batch = q->shape[0], .heads = q->shape[1], .kv_heads = k->shape[1],
                          .q_len = q->shape[2], .kv_len = k->shape[2], .head_dim = q->shape[3], .causal = causal,
                          .scale = (float)scale};
    if (operand_of(a, views[0], &d->q) < 0 || operand_of(a, views[1], &d->k) < 0 ||
        operand_of(a, views[2], &d->v) < 0)
        return -1;
    return 1;
}

/* What a kernel's status means here: 1 done (the arguments' streams then
 * wait for it), 0 not served, -1 an exception. */
static int served_by(ampc_op_args *a, void *stream, int status)
{
    if (status == AMPC_ERR_UNSUPPORTED)
        return 0;
    if (status != AMPC_OK) {
        return ampc_backend_raise(a->st, a->device, status, a->op);
    }
    return ampc_op_stream_end(a, stream) < 0 ? -1 : 1;
}

static PyObject *mod_attention(PyObject *module, PyObject *args)
{
    ampc_state *st = ampc_state_of(module);
    PyObject *objs[3], *result = NULL;
    int causal;
    double scale, dropout_p = 0.0;
    unsigned long long seed = 0, offset = 0;
    if (!PyArg_ParseTuple(args, "OOOpd|dKK:_attention", &objs[0], &objs[1], &objs[2], &causal, &scale, &dropout_p,
                          &seed, &offset))
        return NULL;
    ampc_op_args a;
    ampc_op_args_init(&a, st, "scaled_dot_product_attention");
    ampc_view *views[3], lse;
    ampc_attention d;
    void *stream;
    int served = read_operands(&a, objs, views, causal, scale, &d);
    if (served > 0 && set_dropout(&d, dropout_p, seed, offset) < 0)
        served = -1;
    if (served <= 0)
        goto done;
    const int64_t out_shape[4] = {d.batch, d.heads, d.q_len, d.head_dim}, lse_shape[3] = {d.batch, d.heads, d.q_len};
    PyObject *outs[2];
    outs[0] = output_like(&a, views[0], out_shape, &d.o);
    outs[1] = outs[0] ? ampc_op_output(&a, AMPC_FLOAT32, 3, lse_shape, &lse) : NULL;
    if (outs[1] == NULL || ampc_op_stream_begin(&a, &stream) < 0) {
        served = -1;
        goto done;
    }
    d.lse = (float *)lse.data;
    if ((served = served_by(&a, stream, ampc_backend_of(st, a.device)->attention(a.device.index, stream, &d))) > 0)
        result = ampc_op_results(&a, outs, 2);
done:
    ampc_op_args_release(&a);
    return served == 0 ? Py_NewRef(Py_None) : result;
}

/* grad_output and output: query's dtype and shape; lse: float32 (batch, heads, q_len). */
static int read_forward_results(ampc_op_args *a, PyObject *g_obj, PyObject *o_obj, PyObject *lse_obj,
                                const ampc_view *q, ampc_attention_backward *b)
{
    ampc_view *g = ampc_op_arg(a, g_obj, "grad_output", AMPC_ARG_FLOAT);
    ampc_view *o = g ? ampc_op_arg(a, o_obj, "output", AMPC_ARG_FLOAT) : NULL;
    ampc_view *lse = o ? ampc_op_arg(a, lse_obj, "lse", AMPC_ARG_FLOAT) : NULL;
    if (lse == NULL || ampc_op_check_same_shape(a->op, g, "grad_output", q, "query") < 0 ||
        ampc_op_check_same_shape(a->op, o, "output", q, "query") < 0)
        return -1;
    if (g->dtype != q->dtype || o->dtype != q->dtype || lse->dtype != AMPC_FLOAT32) {
        PyErr_Format(PyExc_TypeError, "%s: grad_output and output must have query's dtype, and lse float32", a->op);
        return -1;
    }
    if (lse->ndim != 3 || lse->shape[0] != q->shape[0] || lse->shape[1] != q->shape[1] ||
        lse->shape[2] != q->shape[2]) {
        PyErr_Format(PyExc_ValueError, "%s: lse must have shape (batch, heads, q_len) of query", a->op);
        return -1;
    }
    if (operand_of(a, g, &b->dout) < 0 || operand_of(a, o, &b->fwd.o) < 0 || ampc_op_dense(a, lse) < 0)
        return -1;
    b->fwd.lse = (float *)lse->data;
    return 0;
}

static PyObject *mod_attention_backward(PyObject *module, PyObject *args)
{
    ampc_state *st = ampc_state_of(module);
    PyObject *g_obj, *objs[3], *o_obj, *lse_obj, *result = NULL;
    int causal;
    double scale, dropout_p = 0.0;
    unsigned long long seed = 0, offset = 0;
    if (!PyArg_ParseTuple(args, "OOOOOOpd|dKK:_attention_backward", &g_obj, &objs[0], &objs[1], &objs[2], &o_obj,
                          &lse_obj, &causal, &scale, &dropout_p, &seed, &offset))
        return NULL;
    ampc_op_args a;
    ampc_op_args_init(&a, st, "scaled_dot_product_attention_backward");
    ampc_view *views[3];
    ampc_attention_backward b;
    void *stream;
    int served = read_operands(&a, objs, views, causal, scale, &b.fwd);
    if (served > 0 && set_dropout(&b.fwd, dropout_p, seed, offset) < 0)
        served = -1;
    if (served <= 0)
        goto done;
    PyObject *outs[3] = {NULL, NULL, NULL};
    ampc_attention_arg *grads[3] = {&b.dq, &b.dk, &b.dv};
    served = read_forward_results(&a, g_obj, o_obj, lse_obj, views[0], &b) < 0 ? -1 : 1;
    for (int i = 0; i < 3 && served > 0; i++)
        if ((outs[i] = output_like(&a, views[i], views[i]->shape, grads[i])) == NULL)
            served = -1;
    if (served < 0 || ampc_op_stream_begin(&a, &stream) < 0) {
        served = -1;
        goto done;
    }
    if ((served = served_by(&a, stream, ampc_backend_of(st, a.device)->attention_backward(a.device.index, stream, &b))) > 0)
        result = ampc_op_results(&a, outs, 3);
done:
    ampc_op_args_release(&a);
    return served == 0 ? Py_NewRef(Py_None) : result;
}

PyMethodDef ampc_attention_methods[] = {
    {"_attention", mod_attention, METH_VARARGS,
     "_attention(query, key, value, is_causal, scale, dropout_p=0.0, seed=0, offset=0) -> (output, lse), or None "
     "where the fused kernels do not serve the arguments; dropout draws at (seed, offset) as ampc's dropout does."},
    {"_attention_backward", mod_attention_backward, METH_VARARGS,
     "_attention_backward(grad_output, query, key, value, output, lse, is_causal, scale, dropout_p=0.0, seed=0, "
     "offset=0) -> (grad_query, grad_key, grad_value), or None where the fused kernels do not serve the arguments."},
    {NULL, NULL, 0, NULL},
};
