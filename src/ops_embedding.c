/*
 * ops_embedding.c: the entry points of embedding, its backward pass, and
 * dropout (op_descriptors.h; CPU kernels in embedding_cpu.c, CUDA ones in
 * cuda/embedding.cu and cuda/dropout.cu), as private functions of ampc._C
 * that ampc.nn.functional composes: _embedding, _embedding_backward,
 * _dropout.
 */
#include "ampc.h"

#include <math.h>

#include "kernels/op_descriptors.h"
#include "op_args.h"

static ampc_buf buf_of(const ampc_view *v) { return (ampc_buf){v->data, v->dtype}; }

/* On the CPU, every index must name a row (the GPU writes NaN instead: it
 * cannot look without waiting for the device). idx is dense. */
static int check_indices(const ampc_op_args *a, const ampc_view *idx, int64_t num)
{
    if (a->device.type != AMPC_DEVICE_CPU)
        return 0;
    const ampc_buf indices = buf_of(idx);
    for (int64_t i = 0; i < idx->numel; i++) {
        const int64_t r = ampc_index_at(&indices, i);
        if (r < 0 || r >= num) {
            PyErr_Format(PyExc_ValueError, "%s: input holds the index %lld, outside the %lld rows of weight", a->op,
                         (long long)r, (long long)num);
            return -1;
        }
    }
    return 0;
}

/* _embedding(weight, indices) -> weight's rows, shaped indices.shape + (dim,) */
static PyObject *mod_embedding(PyObject *module, PyObject *args)
{
    ampc_state *st = ampc_state_of(module);
    PyObject *w_obj, *i_obj, *result = NULL;
    if (!PyArg_ParseTuple(args, "OO:_embedding", &w_obj, &i_obj))
        return NULL;
    ampc_op_args a;
    ampc_op_args_init(&a, st, "embedding");
    ampc_view *w = ampc_op_arg(&a, w_obj, "weight", AMPC_ARG_FLOAT);
    ampc_view *idx = w ? ampc_op_arg(&a, i_obj, "input", AMPC_ARG_INDEX) : NULL;
    if (idx == NULL)
        goto done;
    if (w->ndim != 2) {
        PyErr_Format(PyExc_ValueError, "embedding: weight must be 2-D (num_embeddings, embedding_dim), got %d-D",
                     w->ndim);
        goto done;
    }
    if (idx->ndim + 1 > AMPC_MAX_NDIM) {
        PyErr_Format(PyExc_ValueError, "embedding: input has too many dimensions (%d)", idx->ndim);
        goto done;
    }
    if (ampc_op_dense(&a, w) < 0 || ampc_op_dense(&a, idx) < 0 || check_indices(&a, idx, w->shape[0]) < 0)
        goto done;
    int64_t shape[AMPC_MAX_NDIM];
    for (int d = 0; d < idx->ndim; d++)
        shape[d] = idx->shape[d];
    shape[idx->ndim] = w->shape[1];
    ampc_view out;
    PyObject *out_obj = ampc_op_output(&a, w->dtype, idx->ndim + 1, shape, &out);
    if (out_obj == NULL)
        goto done;
    ampc_embedding e = {.num = w->shape[0], .dim = w->shape[1], .count = idx->numel, .out = buf_of(&out),
                        .weight = buf_of(w), .indices = buf_of(idx)};
    if (AMPC_RUN_KERNEL(&a, embedding, &e) == 0)
        result = ampc_op_result(&a, out_obj);
done:
    ampc_op_args_release(&a);
    return result;
}

/* _embedding_backward(grad_output, indices, num_weights, padding_idx) -> grad_weight */
static PyObject *mod_embedding_backward(PyObject *module, PyObject *args)
{
    ampc_state *st = ampc_state_of(module);
    PyObject *dy_obj, *i_obj, *result = NULL;
    long long num, padding_idx;
    if (!PyArg_ParseTuple(args, "OOLL:_embedding_backward", &dy_obj, &i_obj, &num, &padding_idx))
        return NULL;
    ampc_op_args a;
    ampc_op_args_init(&a, st, "embedding_backward");
    ampc_view *dy = ampc_op_arg(&a, dy_obj, "grad_output", AMPC_ARG_FLOAT);
    ampc_view *idx = dy ? ampc_op_arg(&a, i_obj, "input", AMPC_ARG_INDEX) : NULL;
    if (idx == NULL)
        goto done;
    if (num < 0) {
        PyErr_Format(PyExc_ValueError, "embedding_backward: num_weights must be non-negative, got %lld", num);
        goto done;
    }
    int shaped = dy->ndim == idx->ndim + 1;
    for (int d = 0; shaped && d < idx->ndim; d++)
        shaped = dy->shape[d] == idx->shape[d];
    if (!shaped) {
        PyErr_Format(PyExc_ValueError, "embedding_backward: grad_output must have the input's shape and one more "
                     "dimension (embedding_dim); got %d-D for a %d-D input", dy->ndim, idx->ndim);
        goto done;
    }
    if (ampc_op_dense(&a, dy) < 0 || ampc_op_dense(&a, idx) < 0 || check_indices(&a, idx, num) < 0)
        goto done;
    const int64_t dim = dy->shape[dy->ndim - 1], shape[2] = {num, dim};
    ampc_view out;
    PyObject *out_obj = ampc_op_output(&a, dy->dtype, 2, shape, &out);
    if (out_obj == NULL)
        goto done;
    ampc_embedding_backward e = {.num = num, .dim = dim, .count = idx->numel,
                                 .padding_idx = padding_idx < 0 ? -1 : padding_idx, .dweight = buf_of(&out),
                                 .dy = buf_of(dy), .indices = buf_of(idx)};
    if (AMPC_RUN_KERNEL(&a, embedding_backward, &e) == 0)
        result = ampc_op_result(&a, out_obj);
done:
    ampc_op_args_release(&a);
    return result;
}

/* _dropout(input, p, seed, offset) -> input * keep / (1 - p), keep drawn
 * from Philox at (seed, offset); dropout's backward is the same call on
 * grad_output. */
static PyObject *mod_dropout(PyObject *module, PyObject *args)
{
    ampc_state *st = ampc_state_of(module);
    PyObject *x_obj, *result = NULL;
    double p;
    unsigned long long seed, offset;
    if (!PyArg_ParseTuple(args, "OdKK:_dropout", &x_obj, &p, &seed, &offset))
        return NULL;
    if (!(p >= 0.0 && p <= 1.0)) {
        PyErr_SetString(PyExc_ValueError, "dropout probability has to be between 0 and 1");
        return NULL;
    }
    ampc_op_args a;
    ampc_op_args_init(&a, st, "dropout");
    ampc_view *x = ampc_op_arg(&a, x_obj, "input", AMPC_ARG_FLOAT);
    if (x == NULL || ampc_op_dense(&a, x) < 0)
        goto done;
    ampc_view y;
    PyObject *y_obj = ampc_op_output(&a, x->dtype, x->ndim, x->shape, &y);
    if (y_obj == NULL)
        goto done;
    ampc_dropout d = {.numel = x->numel, .seed = seed, .offset = offset,
                      .keep_below = (uint32_t)llround((1.0 - p) * 16777216.0), .scale = p < 1.0 ? 1.0 / (1.0 - p) : 0.0,
                      .y = buf_of(&y), .x = buf_of(x)};
    if (AMPC_RUN_KERNEL(&a, dropout, &d) == 0)
        result = ampc_op_result(&a, y_obj);
done:
    ampc_op_args_release(&a);
    return result;
}

PyMethodDef ampc_embedding_methods[] = {
    {"_embedding", mod_embedding, METH_VARARGS, "_embedding(weight, indices): the rows of weight indices name."},
    {"_embedding_backward", mod_embedding_backward, METH_VARARGS,
     "_embedding_backward(grad_output, indices, num_weights, padding_idx): grad_weight, each row summed over its "
     "positions in order (padding_idx < 0: none)."},
    {"_dropout", mod_dropout, METH_VARARGS,
     "_dropout(input, p, seed, offset): input * keep / (1 - p), keep drawn by Philox4x32-10 at (seed, offset)."},
    {NULL, NULL, 0, NULL},
};
