/*
 * op_args.c: what the op entry points (ops.c, ops_gemm.c, ops_spatial.c,
 * ops_embedding.c, ops_attention.c) share; see op_args.h. A leaf below them
 * all, so that none of them depends on another's file.
 */
#include "ampc.h"

#include "op_args.h"

void ampc_op_args_init(ampc_op_args *a, ampc_state *st, const char *op)
{
    /* not the views (8 of 1 KB: a memset of them was 2.5 % of a small call): each is zeroed
     * when an argument takes it */
    a->st = st;
    a->op = op;
    a->nviews = a->nkeep = 0;
    a->device = (ampc_device){AMPC_DEVICE_CPU, 0};
    a->device_arg = NULL;
    a->have_device = 0;
    a->source = NULL;
}

void ampc_op_args_release(ampc_op_args *a)
{
    for (int i = 0; i < a->nviews; i++)
        ampc_view_release(&a->views[i]);
    for (int i = 0; i < a->nkeep; i++)
        Py_XDECREF(a->keep[i]);
    a->nviews = a->nkeep = 0;
}

static int same_device(ampc_device x, ampc_device y) { return x.type == y.type && x.index == y.index; }

static int check_device(ampc_op_args *a, const ampc_view *v, const char *name)
{
    if (!a->have_device) {
        a->device = v->device;
        a->device_arg = name;
        a->have_device = 1;
        a->source = v->source;
        return 0;
    }
    if (same_device(a->device, v->device))
        return 0;
    char d0[32], d1[32];
    PyErr_Format(PyExc_ValueError, "%s: expected all arrays on one device, but %s is on %s and %s on %s",
                 a->op, a->device_arg, ampc_device_str(a->device, d0, sizeof d0), name,
                 ampc_device_str(v->device, d1, sizeof d1));
    return -1;
}

/* "op: name" into label, cut to its size: what snprintf would write, without its
 * format parser (3 % of a small op's call, for a label only an error reads). */
static void join_label(char *label, size_t size, const char *op, const char *name)
{
    size_t n = 0;
    for (const char *part[3] = {op, ": ", name}, **p = part; p < part + 3; p++)
        for (const char *c = *p; *c != '\0' && n + 1 < size; c++)
            label[n++] = *c;
    label[n] = '\0';
}

ampc_view *ampc_op_arg(ampc_op_args *a, PyObject *obj, const char *name, int kind)
{
    if (a->nviews == AMPC_OP_MAX_ARGS) {
        PyErr_SetString(PyExc_SystemError, "too many op arguments");
        return NULL;
    }
    char label[96];
    join_label(label, sizeof label, a->op, name);
    ampc_view *v = &a->views[a->nviews];
    memset(v, 0, sizeof *v);
    const int inout = kind & AMPC_ARG_INOUT;
    kind &= ~AMPC_ARG_INOUT;
    if (ampc_view_from_object(a->st, obj, label, inout ? AMPC_FOR_WRITING : AMPC_FOR_READING, v) < 0)
        return NULL;
    a->nviews++;
    if (inout && v->readonly) {
        PyErr_Format(PyExc_ValueError, "%s: %s is updated in place, but it is read-only", a->op, name);
        return NULL;
    }
    if (kind == AMPC_ARG_FLOAT && !AMPC_DTYPE_IS_FLOAT(v->dtype)) {
        PyErr_Format(PyExc_TypeError, "%s: %s must be a floating array (float32, float16, bfloat16 or "
                     "float64), got dtype %s", a->op, name, ampc_dtype_names[v->dtype]);
        return NULL;
    }
    if (kind == AMPC_ARG_INDEX) {
        const ampc_dtype d = v->dtype;
        if (d != AMPC_INT64 && d != AMPC_INT32 && d != AMPC_INT16 && d != AMPC_INT8 && d != AMPC_UINT8) {
            PyErr_Format(PyExc_TypeError, "%s: %s must hold class indices (an integer array: int64, int32, "
                         "int16, int8 or uint8), got dtype %s", a->op, name, ampc_dtype_names[d]);
            return NULL;
        }
    }
    if (check_device(a, v, name) < 0)
        return NULL;
    return v;
}

int ampc_op_keep(ampc_op_args *a, PyObject *obj)
{
    if (a->nkeep == AMPC_OP_MAX_KEEP) {
        Py_DECREF(obj);
        PyErr_SetString(PyExc_SystemError, "too many op temporaries");
        return -1;
    }
    a->keep[a->nkeep++] = obj;
    return 0;
}

int ampc_op_dense(ampc_op_args *a, ampc_view *v)
{
    if (ampc_layout_is_c_contiguous(v->ndim, v->shape, v->strides, ampc_dtype_size(v->dtype)))
        return 0;
    return ampc_op_relayout(a, v, NULL);
}

int ampc_op_relayout(ampc_op_args *a, ampc_view *v, const int64_t *strides)
{
    return ampc_op_convert(a, v, v->dtype, strides);
}

int ampc_op_convert(ampc_op_args *a, ampc_view *v, ampc_dtype dtype, const int64_t *strides)
{
    ampc_view copy;
    PyObject *obj = ampc_array_empty(a->st, v->device, dtype, v->ndim, v->shape, strides, &copy);
    if (obj == NULL || ampc_op_keep(a, obj) < 0 || ampc_cast_views(a->st, &copy, v, 1) < 0)
        return -1;
    /* The view keeps its owner (harmless) and now reads the copy. */
    v->data = copy.data;
    v->dtype = dtype;
    for (int d = 0; d < v->ndim; d++)
        v->strides[d] = copy.strides[d];
    v->stream = copy.stream;
    return 0;
}

PyObject *ampc_op_output(ampc_op_args *a, ampc_dtype dtype, int ndim, const int64_t *shape, ampc_view *out)
{
    return ampc_op_output_strided(a, dtype, ndim, shape, NULL, out);
}

PyObject *ampc_op_output_strided(ampc_op_args *a, ampc_dtype dtype, int ndim, const int64_t *shape,
                                 const int64_t *strides, ampc_view *out)
{
    PyObject *obj = ampc_array_empty(a->st, a->device, dtype, ndim, shape, strides, out);
    if (obj == NULL)
        return NULL;
    if (ampc_op_keep(a, obj) < 0)
        return NULL;
    return obj;
}

PyObject *ampc_op_result(ampc_op_args *a, PyObject *out)
{
    Py_INCREF(out);
    return ampc_return_as(a->st, out, a->source);
}

PyObject *ampc_op_results(ampc_op_args *a, PyObject *const *outs, int n)
{
    PyObject *tuple = PyTuple_New(n);
    for (int i = 0; tuple != NULL && i < n; i++) {
        PyObject *r = outs[i] != NULL ? ampc_op_result(a, outs[i]) : Py_NewRef(Py_None);
        if (r == NULL)
            Py_CLEAR(tuple);
        else
            PyTuple_SET_ITEM(tuple, i, r);
    }
    return tuple;
}

int ampc_op_stream_begin(ampc_op_args *a, void **stream)
{
    *stream = NULL;
    if (a->device.type == AMPC_DEVICE_CPU)
        return 0;
    *stream = ampc_current_stream(a->device.index, NULL);
    ampc_streams_seen seen = {0};
    for (int i = 0; i < a->nviews; i++)
        if (a->views[i].device.type != AMPC_DEVICE_CPU &&
            ampc_order_stream(a->st, a->device.index, *stream, a->views[i].stream, 1, &seen) < 0)
            return -1;
    return 0;
}

int ampc_op_stream_end(ampc_op_args *a, void *stream)
{
    if (a->device.type == AMPC_DEVICE_CPU)
        return 0;
    ampc_streams_seen seen = {0};
    for (int i = 0; i < a->nviews; i++)
        if (a->views[i].device.type != AMPC_DEVICE_CPU &&
            ampc_order_stream(a->st, a->device.index, stream, a->views[i].stream, 0, &seen) < 0)
            return -1;
    return 0;
}

int ampc_op_cpu_status(int rc)
{
    if (rc < 0) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

const char *ampc_op_float64_hint(ampc_dtype a, ampc_dtype b)
{
    if ((a == AMPC_FLOAT64) == (b == AMPC_FLOAT64))
        return "";
    return " (NumPy makes float64 arrays by default, and a model's parameters are float32: convert the input, "
           "e.g. x.astype(numpy.float32))";
}

int ampc_op_normalize_dim(const char *op, int64_t dim, int ndim, int64_t *out)
{
    const int64_t n = ndim > 0 ? ndim : 1;
    if (dim < -n || dim >= n) {
        PyErr_Format(PyExc_IndexError, "%s: Dimension out of range (expected to be in range of [%lld, %lld], "
                     "but got %lld)", op, (long long)-n, (long long)(n - 1), (long long)dim);
        return -1;
    }
    *out = dim < 0 ? dim + n : dim;
    return 0;
}

ampc_rows ampc_op_rows(const ampc_view *v, int64_t dim)
{
    ampc_rows r = {1, 1, 1};
    for (int d = 0; d < v->ndim; d++) {
        if (d < dim)
            r.outer *= v->shape[d];
        else if (d == dim)
            r.n = v->shape[d];
        else
            r.inner *= v->shape[d];
    }
    return r;
}

int ampc_op_parse_dtype(const ampc_op_args *a, PyObject *obj, int *have, ampc_dtype *dtype)
{
    *have = 0;
    if (obj == NULL || obj == Py_None)
        return 0;
    char argname[80];
    snprintf(argname, sizeof argname, "%s: dtype", a->op);
    if (ampc_dtype_parse(a->st, obj, argname, dtype) < 0)
        return -1;
    if (!AMPC_DTYPE_IS_FLOAT(*dtype)) {
        PyErr_Format(PyExc_TypeError, "%s must be a floating dtype, got %s", argname, ampc_dtype_names[*dtype]);
        return -1;
    }
    *have = 1;
    return 0;
}

/* Broadcast `v` into the output's shape: element strides, 0 where broadcast. */
int ampc_op_broadcast_strides(const char *op, const char *name, const ampc_view *v, int ndim,
                             const int64_t *shape, int64_t *strides)
{
    const int64_t size = ampc_dtype_size(v->dtype);
    for (int d = 0; d < ndim; d++) {
        const int vd = d - (ndim - v->ndim);
        if (vd < 0 || v->shape[vd] == 1) {
            strides[d] = 0;
            continue;
        }
        if (v->shape[vd] != shape[d]) {
            PyErr_Format(PyExc_ValueError, "%s: %s of size %lld cannot be broadcast to size %lld at "
                         "dimension %d", op, name, (long long)v->shape[vd], (long long)shape[d], d);
            return -1;
        }
        if (v->strides[vd] % size != 0) {
            PyErr_Format(PyExc_ValueError, "%s: %s has a stride that is not a multiple of its item size",
                         op, name);
            return -1;
        }
        strides[d] = v->strides[vd] / size;
    }
    return 0;
}

int ampc_op_check_same_shape(const char *op, const ampc_view *x, const char *xn, const ampc_view *y,
                             const char *yn)
{
    if (ampc_same_shape(x, y))
        return 0;
    char sx[256], sy[256];
    ampc_shape_str(x, sx, sizeof sx);
    ampc_shape_str(y, sy, sizeof sy);
    PyErr_Format(PyExc_ValueError, "%s: %s has shape %s but %s has shape %s", op, xn, sx, yn, sy);
    return -1;
}
