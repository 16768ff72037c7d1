/*
 * ops_spatial.c: the entry points of the spatial ops over NCHW images:
 * _conv2d and _conv2d_backward (conv1d is a conv2d of one row, arranged by
 * ampc.nn.functional), _batch_norm and _batch_norm_backward, _pool and
 * _pool_backward. Batch norm answers in 4-D, (n, c, h, w) with the
 * trailing dimensions of its input as h; the caller reshapes.
 *
 * A backend without a conv entry (the CPU's) lowers the convolution: the
 * images go to columns (its im2col, GIL released) in float32 (float64 for float64), NumPy's matmul multiplies
 * them with the filter into NCHW order, and one elementwise pass adds the
 * bias and rounds once (none for float32 without a bias). The images are
 * taken in chunks, so the columns stay near COL_BUDGET bytes whatever the
 * batch; the chunk size depends only on the shapes, so the filter
 * gradient's sum over chunks has a fixed order.
 * A backend with one (CUDA's: cuDNN, cuda/conv.c) takes the descriptor;
 * channels-last arrays as they are.
 */
#include "ampc.h"

#include <stdlib.h>
#include <string.h>

#include "kernels/op_descriptors.h"
#include "op_args.h"

#define COL_BUDGET ((int64_t)32 << 20)

/* ampc.backends.cudnn.deterministic and .benchmark: process-wide, as torch's.
 * benchmark is -1 until first read: then 0 where AMPC_CUDNN_BENCHMARK=0, else 1. */
static int cudnn_deterministic;
static int cudnn_benchmark = -1;

static int cudnn_benchmark_now(void)
{
    int now = __atomic_load_n(&cudnn_benchmark, __ATOMIC_RELAXED);
    if (now < 0) {
        const char *env = getenv("AMPC_CUDNN_BENCHMARK");
        const int from_env = env == NULL || strcmp(env, "0") != 0;
        __atomic_compare_exchange_n(&cudnn_benchmark, &now, from_env, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
        now = __atomic_load_n(&cudnn_benchmark, __ATOMIC_RELAXED);
    }
    return now;
}

static ampc_buf buf_of(const ampc_view *v) { return (ampc_buf){v->data, v->dtype}; }

/* Element strides of a 4-D view in NCHW order. */
static void elem_strides(const ampc_view *v, int64_t *out)
{
    for (int d = 0; d < 4; d++)
        out[d] = v->strides[d] / ampc_dtype_size(v->dtype);
}

/* Element strides of a dense (n, c, h, w) array in NCHW order, stored in C
 * order or channels-last (as (n, h, w, c)). */
static void dense_strides(const int64_t *shape, int channels_last, int64_t *out)
{
    const int64_t c = shape[1], h = shape[2], w = shape[3];
    out[0] = c * h * w;
    out[1] = channels_last ? 1 : h * w;
    out[2] = channels_last ? w * c : w;
    out[3] = channels_last ? c : 1;
}

/* Dense channels-last: (n, c, h, w) stored as (n, h, w, c). The strides of
 * dimensions of size 1 do not matter (torch leaves them arbitrary). */
static int is_channels_last(const ampc_view *v)
{
    if (v->ndim != 4)
        return 0;
    int64_t want[4];
    dense_strides(v->shape, 1, want);
    for (int d = 0; d < 4; d++)
        if (v->shape[d] != 1 && v->strides[d] != want[d] * ampc_dtype_size(v->dtype))
            return 0;
    return 1;
}

static int is_c_order(const ampc_view *v)
{
    return ampc_layout_is_c_contiguous(v->ndim, v->shape, v->strides, ampc_dtype_size(v->dtype));
}

/* v as a dense channels-last array: itself, or a copy (kept by a). */
static int make_channels_last(ampc_op_args *a, ampc_view *v)
{
    if (is_channels_last(v))
        return 0;
    int64_t strides[4];
    dense_strides(v->shape, 1, strides);
    for (int d = 0; d < 4; d++)
        strides[d] *= ampc_dtype_size(v->dtype);
    return ampc_op_relayout(a, v, strides);
}

/* cuDNN's legacy convolutions want one layout for every operand (a filter
 * in the other layout, or a 1x1 filter described in the other format, has
 * no algorithm), and float64 gradients only in C order. The layout is the
 * input's: channels-last when it is (but float64's gradients), else C
 * order; the filter and dy (or y) are copied to it where they differ. The
 * CPU takes C order. */
static int conv_layout(ampc_op_args *a, ampc_view *x, ampc_view *wt, ampc_view *dy, ampc_conv *cv)
{
    cv->deterministic = __atomic_load_n(&cudnn_deterministic, __ATOMIC_RELAXED);
    cv->benchmark = cudnn_benchmark_now();
    const int float64_gradient = x->dtype == AMPC_FLOAT64 && cv->pass != AMPC_CONV_FORWARD;
    cv->channels_last = a->device.type == AMPC_DEVICE_CUDA && !float64_gradient && !is_c_order(x) &&
                        is_channels_last(x);
    ampc_view *views[3] = {x, wt, dy};
    for (int i = 0; i < 3; i++)
        if (views[i] != NULL && (cv->channels_last ? make_channels_last(a, views[i]) : ampc_op_dense(a, views[i])) < 0)
            return -1;
    return 0;
}

/* GPU kernels take C order or channels-last; the CPU ones C order. */
static int layout_for_device(ampc_op_args *a, ampc_view *v)
{
    if (a->device.type == AMPC_DEVICE_CUDA && is_channels_last(v))
        return 0;
    return ampc_op_dense(a, v);
}

/* A 4-D output in the layout of `like` (channels-last or C order). */
static PyObject *output_like(ampc_op_args *a, ampc_dtype dtype, const int64_t *shape, const ampc_view *like,
                             ampc_view *out)
{
    if (!is_c_order(like) && is_channels_last(like)) {
        int64_t strides[4];
        dense_strides(shape, 1, strides);
        for (int i = 0; i < 4; i++)
            strides[i] *= ampc_dtype_size(dtype);  /* in bytes */
        return ampc_op_output_strided(a, dtype, 4, shape, strides, out);
    }
    return ampc_op_output(a, dtype, 4, shape, out);
}

/* ------------------------------------------------------------------------ */
/* Convolution                                                               */
/* ------------------------------------------------------------------------ */

static int parse_pair(PyObject *obj, const char *op, const char *name, int64_t lo, int64_t *out)
{
    if (!PyTuple_Check(obj) || PyTuple_GET_SIZE(obj) != 2) {
        PyErr_Format(PyExc_TypeError, "%s: %s must be a pair of ints", op, name);
        return -1;
    }
    for (int i = 0; i < 2; i++) {
        const long long v = PyLong_AsLongLong(PyTuple_GET_ITEM(obj, i));
        if (v == -1 && PyErr_Occurred())
            return -1;
        if (v < lo) {
            PyErr_Format(PyExc_ValueError, "%s: %s must be %s, got %lld", op, name,
                         lo > 0 ? "positive" : "non-negative", v);
            return -1;
        }
        out[i] = v;
    }
    return 0;
}

static void shape_list(const ampc_view *v, char *buf, size_t size)
{
    int n = snprintf(buf, size, "[");
    for (int d = 0; d < v->ndim && n < (int)size; d++)
        n += snprintf(buf + n, size - (size_t)n, d ? ", %lld" : "%lld", (long long)v->shape[d]);
    if (n < (int)size)
        snprintf(buf + n, size - (size_t)n, "]");
}

/* conv1d runs as conv2d over images of one row (nn/_spatial.py): its
 * messages show its own shapes, without that row's dimension. */
static int is_conv1d(const char *op) { return strncmp(op, "conv1d", 6) == 0; }

static void conv_shape_list(const char *op, const ampc_view *v, char *buf, size_t size)
{
    ampc_view shown = *v;
    if (is_conv1d(op) && v->ndim == 4) {
        shown.ndim = 3;
        shown.shape[2] = v->shape[3];
    }
    shape_list(&shown, buf, size);
}

/* Check x and weight against each other and the parameters (torch's
 * messages), and fill cv's shapes. */
static int conv_shapes(const char *op, const ampc_view *x, const ampc_view *wt, PyObject *stride, PyObject *padding,
                       PyObject *dilation, long long groups, ampc_conv *cv)
{
    char xs[96], ws[96];
    if (x->ndim != 4 || wt->ndim != 4) {
        PyErr_Format(PyExc_ValueError, "%s: expected 4-D input and weight (batch, channels, height, width), got "
                     "%d-D and %d-D", op, x->ndim, wt->ndim);
        return -1;
    }
    if (x->dtype != wt->dtype) {
        PyErr_Format(PyExc_TypeError, "%s: expected input and weight to have the same dtype, but got %s and %s%s", op,
                     ampc_dtype_names[x->dtype], ampc_dtype_names[wt->dtype],
                     ampc_op_float64_hint(x->dtype, wt->dtype));
        return -1;
    }
    if (parse_pair(stride, op, "stride", 1, cv->stride) < 0 || parse_pair(padding, op, "padding", 0, cv->pad) < 0 ||
        parse_pair(dilation, op, "dilation", 1, cv->dilation) < 0)
        return -1;
    if (wt->shape[2] < 1 || wt->shape[3] < 1) {
        PyErr_Format(PyExc_ValueError, "%s: the kernel must be at least 1 x 1, got weight of size %s", op,
                     (conv_shape_list(op, wt, ws, sizeof ws), ws));
        return -1;
    }
    if (groups < 1) {
        PyErr_Format(PyExc_ValueError, "%s: non-positive groups is not supported", op);
        return -1;
    }
    conv_shape_list(op, x, xs, sizeof xs);
    conv_shape_list(op, wt, ws, sizeof ws);
    cv->n = x->shape[0], cv->c = x->shape[1], cv->h = x->shape[2], cv->w = x->shape[3];
    cv->k = wt->shape[0], cv->r = wt->shape[2], cv->s = wt->shape[3], cv->groups = groups;
    if (cv->k % groups != 0) {
        PyErr_Format(PyExc_ValueError, "%s: Given groups=%lld, expected weight to be divisible by %lld at "
                     "dimension 0, but got weight of size %s instead", op, groups, groups, ws);
        return -1;
    }
    if (wt->shape[1] * groups != cv->c) {
        PyErr_Format(PyExc_ValueError, "%s: Given groups=%lld, weight of size %s, expected input%s to have %lld "
                     "channels, but got %lld channels instead", op, groups, ws, xs,
                     (long long)(wt->shape[1] * groups), (long long)cv->c);
        return -1;
    }
    /* the kernel's extent and the padded image, checked: a padding or dilation near 2**62 wrapped them */
    int64_t eh, ew, ph, pw;
    if (ampc_size_mul(cv->dilation[0], cv->r - 1, &eh) < 0 || ampc_size_add(eh, 1, &eh) < 0 ||
        ampc_size_mul(cv->dilation[1], cv->s - 1, &ew) < 0 || ampc_size_add(ew, 1, &ew) < 0 ||
        ampc_size_mul(cv->pad[0], 2, &ph) < 0 || ampc_size_add(ph, cv->h, &ph) < 0 ||
        ampc_size_mul(cv->pad[1], 2, &pw) < 0 || ampc_size_add(pw, cv->w, &pw) < 0) {
        PyErr_Format(PyExc_ValueError, "%s: padding, dilation and kernel size too large (past 2**63)", op);
        return -1;
    }
    if ((ph < eh || pw < ew) && is_conv1d(op)) {
        PyErr_Format(PyExc_ValueError, "%s: Calculated padded input size per channel: (%lld). Kernel size: (%lld). "
                     "Kernel size can't be greater than actual input size", op, (long long)pw, (long long)ew);
        return -1;
    }
    if (ph < eh || pw < ew) {
        PyErr_Format(PyExc_ValueError, "%s: Calculated padded input size per channel: (%lld x %lld). Kernel size: "
                     "(%lld x %lld). Kernel size can't be greater than actual input size", op, (long long)ph,
                     (long long)pw, (long long)eh, (long long)ew);
        return -1;
    }
    cv->p = (ph - eh) / cv->stride[0] + 1;
    cv->q = (pw - ew) / cv->stride[1] + 1;
    /* the CPU's columns of one image, (c / groups) * r * s * p * q * groups values of 8 bytes at most,
     * must be a size, whatever the batch (an empty one allocates no output to check it) */
    int64_t columns;
    if (ampc_size_mul(cv->p, cv->q, &columns) < 0 || ampc_size_mul(columns, cv->c, &columns) < 0 ||
        ampc_size_mul(columns, cv->r, &columns) < 0 || ampc_size_mul(columns, cv->s, &columns) < 0 ||
        ampc_size_mul(columns, 8, &columns) < 0) {
        PyErr_Format(PyExc_ValueError, "%s: an output of %lld x %lld positions is too large", op, (long long)cv->p,
                     (long long)cv->q);
        return -1;
    }
    return 0;
}

/* ndarray of the filter in the accumulation dtype as (groups, k / groups,
 * (c / groups) * r * s); the weight view is dense C order. */
static PyObject *filter_matrix(ampc_op_args *a, const ampc_view *wt, const ampc_conv *cv, ampc_dtype acc)
{
    PyObject *w = ampc_op_acc_ndarray(a, wt, acc);
    if (w == NULL)
        return NULL;
    npy_intp dims[3] = {(npy_intp)cv->groups, (npy_intp)(cv->k / cv->groups),
                        (npy_intp)(cv->c / cv->groups * cv->r * cv->s)};
    PyArray_Dims shape = {dims, 3};
    PyObject *m = PyArray_Newshape((PyArrayObject *)w, &shape, NPY_CORDER);
    Py_DECREF(w);
    return m;
}

/* A new CPU array in the accumulation dtype; its data in *data. */
static PyObject *acc_array(ampc_op_args *a, ampc_dtype acc, int ndim, const int64_t *shape, void **data)
{
    ampc_view v;
    const ampc_device cpu = {AMPC_DEVICE_CPU, 0};
    PyObject *obj = ampc_array_empty(a->st, cpu, acc, ndim, shape, NULL, &v);
    if (obj != NULL)
        *data = v.data;
    return obj;
}

/* An ndarray over dense C-order memory, no copy and no owner: a temporary,
 * dropped before the op returns, while a's views hold the memory. */
static PyObject *over_memory(ampc_state *st, void *data, ampc_dtype dtype, int ndim, const int64_t *shape,
                             int writeable)
{
    npy_intp dims[4];
    for (int d = 0; d < ndim; d++)
        dims[d] = (npy_intp)shape[d];
    PyArray_Descr *descr = st->descr[dtype];
    Py_INCREF(descr);
    return PyArray_NewFromDescr(&PyArray_Type, descr, ndim, dims, NULL, data, writeable ? NPY_ARRAY_WRITEABLE : 0,
                                NULL);
}

/* An elementwise copy of a 3-D block, out dense in shape's order, in read
 * with in_strides (elements), rounded to out's dtype; bias (one value per
 * index of the middle dimension) added where given. out may be in. */
static int copy_block(ampc_op_args *a, ampc_buf out, ampc_buf in, const int64_t shape[3], const int64_t in_strides[3],
                      const ampc_view *bias)
{
    ampc_ew e = {.op = AMPC_EW_COPY, .param = 1.0, .scale = 1.0, .ndim = 3, .nin = 1,
                 .numel = shape[0] * shape[1] * shape[2], .out = out, .in = {in}};
    memcpy(e.shape, shape, sizeof e.shape[0] * 3);
    memcpy(e.strides[0], in_strides, sizeof e.strides[0][0] * 3);
    if (bias != NULL) {
        const int64_t bias_strides[3] = {0, 1, 0};
        e.op = AMPC_EW_ADD;
        e.nin = 2;
        e.in[1] = buf_of(bias);
        memcpy(e.strides[1], bias_strides, sizeof bias_strides);
    }
    return AMPC_RUN_KERNEL(a, elementwise, &e);
}

/*
 * The CPU convolution as NumPy's matrix products, group by group of each
 * image, on columns laid out so that NCHW needs no transposing:
 *   forward      y[i, g] (kg, pq)  = W[g] (kg, crs) @ col[i, g] (crs, pq)
 *   data grad    dcol[i, g]        = W[g]^T @ dy[i, g], then col2im
 *   filter grad  dW[g] (kg, crs)   = dy[g] (kg, images * pq) @ col[g]^T
 * (kg = k / groups, crs = (c / groups) * r * s, pq = p * q). y[i, g] and
 * dy[i, g] are NCHW memory as it is; the filter gradient gathers each
 * group's rows over all the images of a chunk, one product for them all. A
 * 1x1 filter with stride 1 and no padding reads x itself as its columns
 * and writes dx directly (float32 and float64 data).
 */
static int pointwise(const ampc_conv *cv)
{
    return cv->r == 1 && cv->s == 1 && cv->stride[0] == 1 && cv->stride[1] == 1 && cv->pad[0] == 0 &&
           cv->pad[1] == 0;
}

static int64_t chunk_images(const ampc_conv *cv, ampc_dtype acc)
{
    const int64_t per_image = cv->groups * cv->p * cv->q * (cv->c / cv->groups) * cv->r * cv->s *
                              ampc_dtype_size(acc);
    const int64_t nb = per_image > 0 ? COL_BUDGET / per_image : cv->n;
    return nb < 1 ? 1 : nb > cv->n ? cv->n : nb;
}

/* Images [n0, n0 + images) of a dense NCHW buffer b (channels planes of
 * plane values each) as (images, groups, channels / groups, plane) in acc:
 * over b's memory where b is in acc already, else a converted copy. */
static PyObject *images_in_acc(ampc_op_args *a, ampc_buf b, int64_t channels, int64_t plane, int64_t groups,
                               int64_t n0, int64_t images, ampc_dtype acc)
{
    const int64_t shape[4] = {images, groups, channels / groups, plane};
    char *data = (char *)b.data + n0 * channels * plane * ampc_dtype_size(b.dtype);
    if (b.dtype == acc)
        return over_memory(a->st, data, acc, 4, shape, 0);
    void *copy;
    PyObject *obj = acc_array(a, acc, 4, shape, &copy);
    const int64_t block[3] = {images, channels, plane}, dense[3] = {channels * plane, plane, 1};
    if (obj != NULL && copy_block(a, (ampc_buf){copy, acc}, (ampc_buf){data, b.dtype}, block, dense, NULL) < 0)
        Py_CLEAR(obj);
    return obj;
}

/* New columns of images [n0, n0 + images): an acc array of shape, filled by
 * im2col with col_strides (elements: image, group, row). */
static PyObject *columns(ampc_op_args *a, const ampc_conv *cv, int64_t n0, int64_t images, int ndim,
                         const int64_t *shape, const int64_t col_strides[3], ampc_dtype acc)
{
    void *col;
    PyObject *obj = acc_array(a, acc, ndim, shape, &col);
    if (obj == NULL)
        return NULL;
    const ampc_backend *b = ampc_backend_of(a->st, a->device);
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = b->im2col(cv, n0, images, col, col_strides);
    Py_END_ALLOW_THREADS
    if (status != AMPC_OK) {
        ampc_backend_raise(a->st, a->device, status, a->op);
        Py_CLEAR(obj);
    }
    return obj;
}

static int conv_forward_columns(ampc_op_args *a, ampc_conv *cv, const ampc_view *wt, const ampc_view *bias)
{
    const ampc_dtype acc = ampc_acc_dtype(cv->x.dtype);
    PyObject *wm = filter_matrix(a, wt, cv, acc);  /* (groups, kg, crs) */
    if (wm == NULL || ampc_op_keep(a, wm) < 0)
        return -1;
    const int64_t g = cv->groups, kg = cv->k / g, crs = cv->c / g * cv->r * cv->s, pq = cv->p * cv->q;
    const int64_t nb = chunk_images(cv, acc), col_strides[3] = {g * crs * pq, crs * pq, pq};
    const int in_place = cv->y.dtype == acc;  /* the product written into y itself */
    for (int64_t n0 = 0; n0 < cv->n; n0 += nb) {
        const int64_t images = cv->n - n0 < nb ? cv->n - n0 : nb;
        const int64_t col_shape[4] = {images, g, crs, pq}, y_shape[4] = {images, g, kg, pq};
        PyObject *col = pointwise(cv) ? images_in_acc(a, cv->x, cv->c, pq, g, n0, images, acc)
                                      : columns(a, cv, n0, images, 4, col_shape, col_strides, acc);
        ampc_buf y = {(char *)cv->y.data + n0 * cv->k * pq * ampc_dtype_size(cv->y.dtype), cv->y.dtype};
        PyObject *out = col != NULL && in_place ? over_memory(a->st, y.data, acc, 4, y_shape, 1) : NULL;
        PyObject *r = col != NULL && (out != NULL || !in_place) ? ampc_np_matmul(a->st, wm, col, out) : NULL;
        Py_XDECREF(col);
        Py_XDECREF(out);
        if (r == NULL)
            return -1;
        const int64_t block[3] = {images, cv->k, pq}, dense[3] = {cv->k * pq, pq, 1};
        const ampc_buf product = {PyArray_DATA((PyArrayObject *)r), acc};
        const int rc = in_place && bias == NULL ? 0 : copy_block(a, y, product, block, dense, bias);
        Py_DECREF(r);
        if (rc < 0)
            return -1;
    }
    return 0;
}

static int conv_backward_data_columns(ampc_op_args *a, ampc_conv *cv, const ampc_view *wt)
{
    const ampc_backend *b = ampc_backend_of(a->st, a->device);
    const ampc_dtype acc = ampc_acc_dtype(cv->x.dtype);
    PyObject *wm = filter_matrix(a, wt, cv, acc);
    if (wm == NULL || ampc_op_keep(a, wm) < 0)
        return -1;
    PyObject *wmt = PyArray_SwapAxes((PyArrayObject *)wm, 1, 2);  /* (groups, crs, kg) */
    if (wmt == NULL || ampc_op_keep(a, wmt) < 0)
        return -1;
    const int64_t g = cv->groups, crs = cv->c / g * cv->r * cv->s, pq = cv->p * cv->q;
    const int64_t nb = chunk_images(cv, acc), col_strides[3] = {g * crs * pq, crs * pq, pq};
    const int direct = pointwise(cv) && cv->x.dtype == acc;  /* the product is dx */
    for (int64_t n0 = 0; n0 < cv->n; n0 += nb) {
        const int64_t images = cv->n - n0 < nb ? cv->n - n0 : nb;
        const int64_t dx_shape[4] = {images, g, crs, pq};
        PyObject *dy = images_in_acc(a, cv->y, cv->k, pq, g, n0, images, acc);
        void *dx = (char *)cv->x.data + n0 * cv->c * cv->h * cv->w * ampc_dtype_size(cv->x.dtype);
        PyObject *out = dy != NULL && direct ? over_memory(a->st, dx, acc, 4, dx_shape, 1) : NULL;
        PyObject *dcol = dy != NULL && (out != NULL || !direct) ? ampc_np_matmul(a->st, wmt, dy, out) : NULL;
        Py_XDECREF(dy);
        Py_XDECREF(out);
        if (dcol == NULL)
            return -1;
        int status = AMPC_OK;
        const void *cols = PyArray_DATA((PyArrayObject *)dcol);
        if (!direct) {
            Py_BEGIN_ALLOW_THREADS
            status = b->col2im(cv, n0, images, cols, col_strides);
            Py_END_ALLOW_THREADS
        }
        Py_DECREF(dcol);
        if (status != AMPC_OK)
            return ampc_backend_raise(a->st, a->device, status, a->op);
    }
    return 0;
}

static int conv_backward_filter_columns(ampc_op_args *a, ampc_conv *cv)
{
    const ampc_dtype acc = ampc_acc_dtype(cv->x.dtype);
    const int64_t g = cv->groups, kg = cv->k / g, crs = cv->c / g * cv->r * cv->s, pq = cv->p * cv->q;
    const int64_t nb = chunk_images(cv, acc);
    PyObject *total = NULL;
    for (int64_t n0 = 0; n0 < cv->n; n0 += nb) {
        const int64_t images = cv->n - n0 < nb ? cv->n - n0 : nb;
        /* columns as (groups, crs, images * pq) and dy as (groups, kg, images * pq): a group's
         * rows run over every image of the chunk */
        const int64_t col_shape[3] = {g, crs, images * pq}, col_strides[3] = {pq, crs * images * pq, images * pq};
        PyObject *col = columns(a, cv, n0, images, 3, col_shape, col_strides, acc);
        const int64_t dy_shape[3] = {g, kg, images * pq}, block[3] = {cv->k, images, pq};
        const int64_t from[3] = {pq, cv->k * pq, 1};  /* dy's (channel, image, position) strides */
        void *rows = NULL;  /* set by acc_array when it succeeds (the GPU machine's GCC cannot see that) */
        PyObject *dy = col != NULL ? acc_array(a, acc, 3, dy_shape, &rows) : NULL;
        const ampc_buf dy_chunk = {(char *)cv->y.data + n0 * cv->k * pq * ampc_dtype_size(cv->y.dtype), cv->y.dtype};
        if (dy != NULL && copy_block(a, (ampc_buf){rows, acc}, dy_chunk, block, from, NULL) < 0)
            Py_CLEAR(dy);
        PyObject *colt = dy != NULL ? PyArray_SwapAxes((PyArrayObject *)col, 1, 2) : NULL;
        PyObject *part = colt != NULL ? ampc_np_matmul(a->st, dy, colt, NULL) : NULL;  /* (groups, kg, crs) */
        Py_XDECREF(colt);
        Py_XDECREF(dy);
        Py_XDECREF(col);
        if (part == NULL)
            goto fail;
        if (total == NULL) {
            total = part;
            continue;
        }
        const int64_t numel = cv->k * crs;
        ampc_ew e = {.op = AMPC_EW_ADD, .param = 1.0, .scale = 1.0, .ndim = 1, .nin = 2, .numel = numel,
                     .shape = {numel}, .strides = {{1}, {1}}};
        e.out = e.in[0] = (ampc_buf){PyArray_DATA((PyArrayObject *)total), acc};
        e.in[1] = (ampc_buf){PyArray_DATA((PyArrayObject *)part), acc};
        const int rc = AMPC_RUN_KERNEL(a, elementwise, &e);
        Py_DECREF(part);
        if (rc < 0)
            goto fail;
    }
    if (total == NULL)
        return 0;  /* no images: the caller wrote zeros */
    const int64_t numel = cv->k * crs;
    ampc_ew e = {.op = AMPC_EW_COPY, .scale = 1.0, .ndim = 1, .nin = 1, .numel = numel, .shape = {numel},
                 .strides = {{1}}};
    e.out = cv->weight;
    e.in[0] = (ampc_buf){PyArray_DATA((PyArrayObject *)total), acc};
    const int rc = AMPC_RUN_KERNEL(a, elementwise, &e);
    Py_DECREF(total);
    return rc;
fail:
    Py_XDECREF(total);
    return -1;
}

/* out[...] = 0 over a whole output (an empty sum). */
static int zero_fill(ampc_op_args *a, const ampc_view *out)
{
    ampc_ew zero = {.op = AMPC_EW_COPY, .scale = 1.0, .ndim = 1, .nin = 1, .numel = out->numel,
                    .shape = {out->numel}, .out = buf_of(out)};
    return out->numel == 0 ? 0 : AMPC_RUN_KERNEL(a, elementwise, &zero);
}

/* y += bias per channel, walking y in its memory order (C or channels-last). */
static int add_bias(ampc_op_args *a, const ampc_view *y, const ampc_view *bias)
{
    const int nhwc = !is_c_order(y);
    const int64_t n = y->shape[0], c = y->shape[1], hw = y->shape[2] * y->shape[3];
    ampc_ew e = {.op = AMPC_EW_ADD, .param = 1.0, .scale = 1.0, .ndim = 3, .nin = 2, .numel = y->numel};
    const int64_t shape[3] = {n, nhwc ? hw : c, nhwc ? c : hw};
    const int64_t ys[3] = {c * hw, nhwc ? c : hw, 1};
    const int64_t bs[3] = {0, nhwc ? 0 : 1, nhwc ? 1 : 0};
    memcpy(e.shape, shape, sizeof shape);
    memcpy(e.strides[0], ys, sizeof ys);
    memcpy(e.strides[1], bs, sizeof bs);
    e.out = e.in[0] = buf_of(y);
    e.in[1] = buf_of(bias);
    return AMPC_RUN_KERNEL(a, elementwise, &e);
}

/* The operands of cv, dense in cv's layout (conv_layout): their strides as
 * that layout's, whatever those of their size-1 dimensions are. */
static void conv_fill_strides(ampc_conv *cv, const ampc_view *x, const ampc_view *wt, const ampc_view *y)
{
    dense_strides(x->shape, cv->channels_last, cv->x_strides);
    dense_strides(wt->shape, cv->channels_last, cv->w_strides);
    dense_strides(y->shape, cv->channels_last, cv->y_strides);
    cv->x = buf_of(x);
    cv->weight = buf_of(wt);
    cv->y = buf_of(y);
}

static PyObject *mod_conv2d(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"input", "weight", "bias", "stride", "padding", "dilation", "groups", "op", NULL};
    ampc_state *st = ampc_state_of(module);
    PyObject *x_obj, *w_obj, *b_obj = Py_None, *stride, *padding, *dilation, *result = NULL;
    long long groups;
    const char *name = "conv2d";  /* or conv1d's, which runs through here */
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOOL|$s:_conv2d", kwlist, &x_obj, &w_obj, &b_obj, &stride,
                                     &padding, &dilation, &groups, &name))
        return NULL;
    ampc_op_args a;
    ampc_op_args_init(&a, st, name);
    ampc_conv cv = {.pass = AMPC_CONV_FORWARD};
    ampc_view *x = ampc_op_arg(&a, x_obj, "input", AMPC_ARG_FLOAT);
    ampc_view *wt = x ? ampc_op_arg(&a, w_obj, "weight", AMPC_ARG_FLOAT) : NULL;
    ampc_view *bias = NULL;
    if (wt == NULL || conv_shapes(name, x, wt, stride, padding, dilation, groups, &cv) < 0)
        goto done;
    if (b_obj != Py_None) {
        if ((bias = ampc_op_arg(&a, b_obj, "bias", AMPC_ARG_FLOAT)) == NULL)
            goto done;
        if (bias->ndim != 1 || bias->shape[0] != cv.k) {
            char ws[96], bs[96];
            conv_shape_list(name, wt, ws, sizeof ws);
            shape_list(bias, bs, sizeof bs);
            PyErr_Format(PyExc_ValueError, "%s: Given weight of size %s, expected bias to be 1-dimensional with "
                         "%lld elements, but got bias of size %s instead", name, ws, (long long)cv.k, bs);
            goto done;
        }
        if (bias->dtype != x->dtype) {
            PyErr_Format(PyExc_TypeError, "%s: expected bias to have the input's dtype %s, got %s", name,
                         ampc_dtype_names[x->dtype], ampc_dtype_names[bias->dtype]);
            goto done;
        }
    }
    if (conv_layout(&a, x, wt, NULL, &cv) < 0 || (bias && ampc_op_dense(&a, bias) < 0))
        goto done;
    const int64_t yshape[4] = {cv.n, cv.k, cv.p, cv.q};
    ampc_view y;
    PyObject *y_obj = output_like(&a, x->dtype, yshape, x, &y);
    if (y_obj == NULL)
        goto done;
    conv_fill_strides(&cv, x, wt, &y);
    int rc;
    if (y.numel == 0)
        rc = 0;
    else if (cv.c == 0)  /* an empty sum: the bias alone */
        rc = zero_fill(&a, &y) < 0 || (bias && add_bias(&a, &y, bias) < 0) ? -1 : 0;
    else if (ampc_backend_of(st, a.device)->conv == NULL)
        rc = conv_forward_columns(&a, &cv, wt, bias);
    else
        rc = AMPC_RUN_KERNEL(&a, conv, &cv) < 0 || (bias && add_bias(&a, &y, bias) < 0) ? -1 : 0;
    if (rc == 0)
        result = ampc_op_result(&a, y_obj);
done:
    ampc_op_args_release(&a);
    return result;
}

static PyObject *mod_conv2d_backward(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"grad_output", "input", "weight", "stride", "padding", "dilation", "groups", "which",
                             "op", NULL};
    ampc_state *st = ampc_state_of(module);
    PyObject *dy_obj, *x_obj, *w_obj, *stride, *padding, *dilation, *result = NULL;
    long long groups;
    const char *which, *name = "conv2d_backward";  /* or conv1d_backward's */
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOOLs|$s:_conv2d_backward", kwlist, &dy_obj, &x_obj, &w_obj,
                                     &stride, &padding, &dilation, &groups, &which, &name))
        return NULL;
    const int data = strcmp(which, "input") == 0;
    if (!data && strcmp(which, "weight") != 0) {
        PyErr_Format(PyExc_ValueError, "_conv2d_backward: which must be 'input' or 'weight', got '%s'", which);
        return NULL;
    }
    ampc_op_args a;
    ampc_op_args_init(&a, st, name);
    ampc_conv cv = {.pass = data ? AMPC_CONV_BACKWARD_DATA : AMPC_CONV_BACKWARD_FILTER};
    ampc_view *dy = ampc_op_arg(&a, dy_obj, "grad_output", AMPC_ARG_FLOAT);
    ampc_view *x = dy ? ampc_op_arg(&a, x_obj, "input", AMPC_ARG_FLOAT) : NULL;
    ampc_view *wt = x ? ampc_op_arg(&a, w_obj, "weight", AMPC_ARG_FLOAT) : NULL;
    if (wt == NULL || conv_shapes(name, x, wt, stride, padding, dilation, groups, &cv) < 0)
        goto done;
    if (dy->ndim != 4 || dy->shape[0] != cv.n || dy->shape[1] != cv.k || dy->shape[2] != cv.p ||
        dy->shape[3] != cv.q) {
        char ds[96], want[96];
        conv_shape_list(name, dy, ds, sizeof ds);
        ampc_view output = {.ndim = 4, .shape = {cv.n, cv.k, cv.p, cv.q}};
        conv_shape_list(name, &output, want, sizeof want);
        PyErr_Format(PyExc_ValueError, "%s: grad_output must have the output's shape %s, got %s", name, want, ds);
        goto done;
    }
    if (dy->dtype != x->dtype) {
        PyErr_Format(PyExc_TypeError, "%s: expected grad_output to have the input's dtype %s, got %s", name,
                     ampc_dtype_names[x->dtype], ampc_dtype_names[dy->dtype]);
        goto done;
    }
    if (conv_layout(&a, x, wt, dy, &cv) < 0)
        goto done;
    ampc_view out;
    PyObject *out_obj = data ? output_like(&a, x->dtype, x->shape, x, &out)
                             : output_like(&a, wt->dtype, wt->shape, wt, &out);
    if (out_obj == NULL)
        goto done;
    conv_fill_strides(&cv, data ? &out : x, data ? wt : &out, dy);
    int rc;
    if (out.numel == 0)
        rc = 0;
    else if (dy->numel == 0)
        rc = zero_fill(&a, &out);
    else if (ampc_backend_of(st, a.device)->conv != NULL)
        rc = AMPC_RUN_KERNEL(&a, conv, &cv);
    else
        rc = data ? conv_backward_data_columns(&a, &cv, wt) : conv_backward_filter_columns(&a, &cv);
    if (rc == 0)
        result = ampc_op_result(&a, out_obj);
done:
    ampc_op_args_release(&a);
    return result;
}

/* ------------------------------------------------------------------------ */
/* Batch norm                                                                */
/* ------------------------------------------------------------------------ */

/* x (n, c, *) as the 4-D (n, c, h, w) the kernels take: a channels-last
 * 4-D array on the GPU as it is, anything else in C order with the trailing
 * dimensions as h. */
static int as_nchw(ampc_op_args *a, ampc_view *v)
{
    if (v->ndim == 4 && layout_for_device(a, v) == 0)
        return 0;
    if (ampc_op_dense(a, v) < 0)
        return -1;
    int64_t h = 1;
    for (int d = 2; d < v->ndim; d++)
        h *= v->shape[d];
    const int64_t size = ampc_dtype_size(v->dtype), c = v->shape[1];
    v->ndim = 4;
    v->shape[2] = h;
    v->shape[3] = 1;
    v->strides[3] = size;
    v->strides[2] = size;
    v->strides[1] = h * size;
    v->strides[0] = c * h * size;
    return 0;
}

/* A per-channel parameter as c dense values of the accumulation dtype: p
 * itself, or a converted copy (*copied set) that the caller writes back for
 * a running statistic. */
static int channel_param(ampc_op_args *a, const char *name, ampc_view *p, int64_t c, ampc_dtype acc, ampc_buf *out,
                         ampc_view *copy, int *copied)
{
    *copied = 0;
    if (p->numel != c || p->ndim != 1) {
        PyErr_Format(PyExc_ValueError, "%s: %s must have one value per channel (%lld), got %lld values in %d-D", a->op,
                     name, (long long)c, (long long)p->numel, p->ndim);
        return -1;
    }
    if (p->dtype == acc && p->strides[0] == ampc_dtype_size(acc)) {
        *out = buf_of(p);
        return 0;
    }
    if (ampc_op_output(a, acc, 1, &c, copy) == NULL || ampc_cast_views(a->st, copy, p, 1) < 0)
        return -1;
    *out = buf_of(copy);
    *copied = 1;
    return 0;
}

/* dst (1-D, any dtype and stride) = src, rounded: a running statistic back. */
static int write_back(ampc_op_args *a, const ampc_view *dst, ampc_buf src)
{
    ampc_view s = *dst;
    s.data = src.data;
    s.dtype = src.dtype;
    s.strides[0] = ampc_dtype_size(src.dtype);
    ampc_view d = *dst;
    return ampc_cast_views(a->st, &d, &s, 0);
}

static PyObject *mod_batch_norm(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"input", "weight", "bias", "running_mean", "running_var", "training", "momentum", "eps",
                             NULL};
    ampc_state *st = ampc_state_of(module);
    PyObject *x_obj, *w_obj, *b_obj, *rm_obj, *rv_obj, *result = NULL;
    int training;
    double momentum, eps;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOpdd:_batch_norm", kwlist, &x_obj, &w_obj, &b_obj, &rm_obj,
                                     &rv_obj, &training, &momentum, &eps))
        return NULL;
    const char *name = "batch_norm";
    ampc_op_args a;
    ampc_op_args_init(&a, st, name);
    ampc_batch_norm b = {.training = training, .momentum = momentum, .eps = eps};
    ampc_view *x = ampc_op_arg(&a, x_obj, "input", AMPC_ARG_FLOAT);
    ampc_view *p[4] = {NULL, NULL, NULL, NULL};
    PyObject *objs[4] = {w_obj, b_obj, rm_obj, rv_obj};
    static const char *names[4] = {"weight", "bias", "running_mean", "running_var"};
    ampc_buf *bufs[4] = {&b.weight, &b.bias, &b.running_mean, &b.running_var};
    ampc_view copies[4];
    int copied[4] = {0, 0, 0, 0};
    if (x == NULL)
        goto done;
    for (int i = 0; i < 4; i++)
        if (objs[i] != Py_None &&
            (p[i] = ampc_op_arg(&a, objs[i], names[i], AMPC_ARG_FLOAT | (i >= 2 && training ? AMPC_ARG_INOUT : 0))) ==
                NULL)
            goto done;
    if (x->ndim < 2) {
        PyErr_Format(PyExc_ValueError, "%s: expected input of at least 2 dimensions (batch, channels, ...), got %d-D",
                     name, x->ndim);
        goto done;
    }
    if (!training && (p[2] == NULL || p[3] == NULL)) {
        PyErr_Format(PyExc_ValueError, "%s: running_mean and running_var must be defined in evaluation mode", name);
        goto done;
    }
    int64_t per_channel = x->shape[0];
    for (int d = 2; d < x->ndim; d++)
        per_channel *= x->shape[d];
    if (training && per_channel <= 1) {
        char xs[96];
        shape_list(x, xs, sizeof xs);
        PyErr_Format(PyExc_ValueError, "%s: Expected more than 1 value per channel when training, got input size %s",
                     name, xs);
        goto done;
    }
    const ampc_dtype acc = ampc_acc_dtype(x->dtype);
    const int64_t c = x->shape[1];
    for (int i = 0; i < 4; i++)
        if (p[i] != NULL && channel_param(&a, names[i], p[i], c, acc, bufs[i], &copies[i], &copied[i]) < 0)
            goto done;
    if (as_nchw(&a, x) < 0)
        goto done;
    ampc_view y4, sm, sr;
    PyObject *y_obj = output_like(&a, x->dtype, x->shape, x, &y4);
    PyObject *sm_obj = y_obj && training ? ampc_op_output(&a, acc, 1, &c, &sm) : NULL;
    PyObject *sr_obj = sm_obj ? ampc_op_output(&a, acc, 1, &c, &sr) : NULL;
    if (y_obj == NULL || (training && sr_obj == NULL))
        goto done;
    b.n = x->shape[0], b.c = c, b.h = x->shape[2], b.w = x->shape[3];
    elem_strides(x, b.x_strides);
    b.x = buf_of(x);
    b.y = buf_of(&y4);
    if (training) {
        b.save_mean = buf_of(&sm);
        b.save_rstd = buf_of(&sr);
    }
    const int ran = AMPC_RUN_KERNEL(&a, batch_norm, &b);
    for (int i = 2; i < 4 && training; i++) {
        const int back = ran == 0 && copied[i] ? write_back(&a, p[i], *bufs[i]) : 0;
        ampc_count_write(st, objs[i]);  /* the running statistics moved in place */
        if (back < 0)
            goto done;
    }
    if (ran < 0)
        goto done;
    result = ampc_op_results(&a, (PyObject *[]){y_obj, sm_obj, sr_obj}, 3);
done:
    ampc_op_args_release(&a);
    return result;
}

static PyObject *mod_batch_norm_backward(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"grad_output", "input", "weight", "save_mean", "save_rstd", "eps", "input_grad",
                             "weight_grads", NULL};
    ampc_state *st = ampc_state_of(module);
    PyObject *dy_obj, *x_obj, *w_obj, *m_obj, *r_obj, *result = NULL;
    double eps;
    int input_grad = 1, weight_grads = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOd|pp:_batch_norm_backward", kwlist, &dy_obj, &x_obj, &w_obj,
                                     &m_obj, &r_obj, &eps, &input_grad, &weight_grads))
        return NULL;
    const char *name = "batch_norm_backward";
    ampc_op_args a;
    ampc_op_args_init(&a, st, name);
    ampc_batch_norm_backward b = {.eps = eps};
    ampc_view *dy = ampc_op_arg(&a, dy_obj, "grad_output", AMPC_ARG_FLOAT);
    ampc_view *x = dy ? ampc_op_arg(&a, x_obj, "input", AMPC_ARG_FLOAT) : NULL;
    ampc_view *mean = x ? ampc_op_arg(&a, m_obj, "save_mean", AMPC_ARG_FLOAT) : NULL;
    ampc_view *rstd = mean ? ampc_op_arg(&a, r_obj, "save_rstd", AMPC_ARG_FLOAT) : NULL;
    ampc_view *w = NULL, wcopy, unused;
    int copied;
    if (rstd == NULL || (w_obj != Py_None && (w = ampc_op_arg(&a, w_obj, "weight", AMPC_ARG_FLOAT)) == NULL))
        goto done;
    if (x->ndim < 2 || ampc_op_check_same_shape(name, dy, "grad_output", x, "input") < 0)
        goto done;
    const ampc_dtype acc = ampc_acc_dtype(x->dtype);
    const int64_t c = x->shape[1];
    if (mean->dtype != acc || rstd->dtype != acc) {
        PyErr_Format(PyExc_TypeError, "%s: save_mean and save_rstd must be the %s values batch_norm saved", name,
                     ampc_dtype_names[acc]);
        goto done;
    }
    if (channel_param(&a, "save_mean", mean, c, acc, &b.save_mean, &unused, &copied) < 0 ||
        channel_param(&a, "save_rstd", rstd, c, acc, &b.save_rstd, &unused, &copied) < 0 ||
        (w && channel_param(&a, "weight", w, c, acc, &b.weight, &wcopy, &copied) < 0))
        goto done;
    /* dy must share x's layout: both channels-last, or both C order */
    if (!(a.device.type == AMPC_DEVICE_CUDA && x->ndim == 4 && is_channels_last(x) && is_channels_last(dy))) {
        if (ampc_op_dense(&a, x) < 0 || ampc_op_dense(&a, dy) < 0)
            goto done;
    }
    if (as_nchw(&a, x) < 0 || as_nchw(&a, dy) < 0)
        goto done;
    ampc_view dx, dw, db;
    PyObject *dx_obj = NULL, *dw_obj = NULL, *db_obj = NULL;
    if (input_grad && (dx_obj = output_like(&a, x->dtype, x->shape, x, &dx)) == NULL)
        goto done;
    if (weight_grads && ((dw_obj = ampc_op_output(&a, acc, 1, &c, &dw)) == NULL ||
                         (db_obj = ampc_op_output(&a, acc, 1, &c, &db)) == NULL))
        goto done;
    b.n = x->shape[0], b.c = c, b.h = x->shape[2], b.w = x->shape[3];
    elem_strides(x, b.x_strides);
    b.x = buf_of(x);
    b.dy = buf_of(dy);
    if (input_grad)
        b.dx = buf_of(&dx);
    if (weight_grads) {
        b.dweight = buf_of(&dw);
        b.dbias = buf_of(&db);
    }
    if (AMPC_RUN_KERNEL(&a, batch_norm_backward, &b) < 0)
        goto done;
    result = ampc_op_results(&a, (PyObject *[]){dx_obj, dw_obj, db_obj}, 3);
done:
    ampc_op_args_release(&a);
    return result;
}

/* ------------------------------------------------------------------------ */
/* Pooling                                                                   */
/* ------------------------------------------------------------------------ */

/* torch's pooling output size along one axis (0 or less: too small); -1 with a ValueError where the
 * sizes pass int64 (a window's arithmetic, in + 2 pad + stride + dilation (k - 1), is then checked
 * once here: ampc_pool_window's sums stay below it). */
static int pool_out_size(const char *op, int64_t in, int64_t k, int64_t pad, int64_t stride, int64_t dil,
                         int ceil_mode, int64_t *out)
{
    int64_t reach, bound;  /* dil * (k - 1): a window's extent less one */
    if (ampc_size_mul(dil, k - 1, &reach) < 0 || ampc_size_add(in, 2 * pad, &bound) < 0 ||
        ampc_size_add(bound, stride, &bound) < 0 || ampc_size_add(bound, reach, &bound) < 0) {
        PyErr_Format(PyExc_ValueError, "%s: kernel_size, stride, padding and dilation too large (past 2**63)", op);
        return -1;
    }
    const int64_t span = in + 2 * pad - reach - 1 + (ceil_mode ? stride - 1 : 0);
    int64_t n = (span >= 0 ? span / stride : -((-span + stride - 1) / stride)) + 1;
    /* the last window must start inside the image or its left padding */
    if (ceil_mode && n > 0 && (n - 1) * stride >= in + pad)
        n--;
    *out = n;
    return 0;
}

static const char *const pool_names[] = {"max_pool2d", "avg_pool2d", "adaptive_avg_pool2d"};

/* Parse the pool's parameters for x (.., h, w) into pl (planes, sizes). */
static int pool_parse(ampc_op_args *a, const ampc_view *x, int mode, PyObject *kernel, PyObject *stride,
                      PyObject *padding, PyObject *dilation, int ceil_mode, int count_include_pad, long long divisor,
                      PyObject *output_size, ampc_pool *pl)
{
    const char *op = a->op;
    if (x->ndim != 3 && x->ndim != 4) {
        PyErr_Format(PyExc_ValueError, "%s: expected a 3-D (unbatched) or 4-D (batched) input, got %d-D", op,
                     x->ndim);
        return -1;
    }
    pl->mode = (ampc_pool_mode)mode;
    pl->h = x->shape[x->ndim - 2];
    pl->w = x->shape[x->ndim - 1];
    pl->planes = x->shape[0] * (x->ndim == 4 ? x->shape[1] : 1);
    if (mode == AMPC_POOL_ADAPTIVE_AVG) {
        int64_t out[2];
        if (parse_pair(output_size, op, "output_size", 1, out) < 0)
            return -1;
        if (pl->h == 0 || pl->w == 0) {
            PyErr_Format(PyExc_ValueError, "%s: expected input with non-zero height and width", op);
            return -1;
        }
        pl->p = out[0], pl->q = out[1];
        /* ampc_pool_window's (i + 1) * h + p - 1, i < p, and the output's planes * p * q */
        int64_t bound;
        if (ampc_size_mul(pl->p, pl->h, &bound) < 0 || ampc_size_add(bound, pl->p, &bound) < 0 ||
            ampc_size_mul(pl->q, pl->w, &bound) < 0 || ampc_size_add(bound, pl->q, &bound) < 0 ||
            ampc_size_mul(pl->planes, pl->p, &bound) < 0 || ampc_size_mul(bound, pl->q, &bound) < 0) {
            PyErr_Format(PyExc_ValueError, "%s: output_size (%lld, %lld) is too large", op, (long long)pl->p,
                         (long long)pl->q);
            return -1;
        }
        return 0;
    }
    if (parse_pair(kernel, op, "kernel_size", 1, pl->kernel) < 0 || parse_pair(stride, op, "stride", 1, pl->stride) < 0 ||
        parse_pair(padding, op, "padding", 0, pl->pad) < 0 || parse_pair(dilation, op, "dilation", 1, pl->dilation) < 0)
        return -1;
    if (divisor < 0) {  /* 0: none given */
        PyErr_Format(PyExc_ValueError, "%s: divisor_override must be greater than zero", op);
        return -1;
    }
    pl->count_include_pad = count_include_pad;
    pl->divisor = divisor;
    for (int i = 0; i < 2; i++)
        if (pl->pad[i] > pl->kernel[i] / 2) {
            PyErr_Format(PyExc_ValueError, "%s: pad should be at most half of effective kernel size, but got pad=%lld, "
                         "kernel_size=%lld", op, (long long)pl->pad[i], (long long)pl->kernel[i]);
            return -1;
        }
    if (pool_out_size(op, pl->h, pl->kernel[0], pl->pad[0], pl->stride[0], pl->dilation[0], ceil_mode, &pl->p) < 0 ||
        pool_out_size(op, pl->w, pl->kernel[1], pl->pad[1], pl->stride[1], pl->dilation[1], ceil_mode, &pl->q) < 0)
        return -1;
    if (pl->p < 1 || pl->q < 1) {
        PyErr_Format(PyExc_ValueError, "%s: Given input size: (%lldx%lld). Calculated output size: (%lldx%lld). "
                     "Output size is too small", op, (long long)pl->h, (long long)pl->w, (long long)pl->p,
                     (long long)pl->q);
        return -1;
    }
    return 0;
}

/* A pool runs channels-last on the GPU where its input is (and is not also
 * C order: one channel, or 1x1 images), as torch keeps the layout; else
 * over C-order planes, which the CPU kernels need. */
static void pool_layout(const ampc_op_args *a, const ampc_view *x, ampc_pool *pl)
{
    pl->channels_last = a->device.type == AMPC_DEVICE_CUDA && !is_c_order(x) && is_channels_last(x);
    pl->channels = x->ndim == 4 ? x->shape[1] : 1;
}

/* v in the pool's layout: itself, or a copy kept by a. */
static int pool_operand(ampc_op_args *a, const ampc_pool *pl, ampc_view *v)
{
    return pl->channels_last ? make_channels_last(a, v) : ampc_op_dense(a, v);
}

/* A pool's output of the given shape in the pool's layout. */
static PyObject *pool_output(ampc_op_args *a, const ampc_pool *pl, ampc_dtype dtype, const ampc_view *x,
                             const int64_t *shape, ampc_view *out)
{
    return pl->channels_last ? output_like(a, dtype, shape, x, out) : ampc_op_output(a, dtype, x->ndim, shape, out);
}

#define POOL_KWLIST "mode", "kernel_size", "stride", "padding", "dilation", "ceil_mode", "count_include_pad", \
                    "divisor_override", "output_size"

static int parse_mode(const char *op, int mode)
{
    if (mode < AMPC_POOL_MAX || mode > AMPC_POOL_ADAPTIVE_AVG) {
        PyErr_Format(PyExc_ValueError, "%s: unknown pool mode %d", op, mode);
        return -1;
    }
    return 0;
}

static PyObject *mod_pool(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"input", POOL_KWLIST, NULL};
    ampc_state *st = ampc_state_of(module);
    PyObject *x_obj, *kernel, *stride, *padding, *dilation, *output_size, *result = NULL;
    int mode, ceil_mode, count_include_pad;
    long long divisor;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OiOOOOppLO:_pool", kwlist, &x_obj, &mode, &kernel, &stride,
                                     &padding, &dilation, &ceil_mode, &count_include_pad, &divisor, &output_size) ||
        parse_mode("_pool", mode) < 0)
        return NULL;
    ampc_op_args a;
    ampc_op_args_init(&a, st, pool_names[mode]);
    ampc_pool pl = {0};
    ampc_view *x = ampc_op_arg(&a, x_obj, "input", AMPC_ARG_FLOAT);
    if (x == NULL || pool_parse(&a, x, mode, kernel, stride, padding, dilation, ceil_mode, count_include_pad, divisor,
                                output_size, &pl) < 0)
        goto done;
    pool_layout(&a, x, &pl);
    if (pool_operand(&a, &pl, x) < 0)
        goto done;
    int64_t shape[4];
    memcpy(shape, x->shape, sizeof shape);
    shape[x->ndim - 2] = pl.p;
    shape[x->ndim - 1] = pl.q;
    ampc_view y, idx;
    PyObject *y_obj = pool_output(&a, &pl, x->dtype, x, shape, &y);
    PyObject *i_obj = y_obj && mode == AMPC_POOL_MAX ? pool_output(&a, &pl, AMPC_INT64, x, shape, &idx) : NULL;
    if (y_obj == NULL || (mode == AMPC_POOL_MAX && i_obj == NULL))
        goto done;
    pl.x = buf_of(x);
    pl.y = buf_of(&y);
    if (i_obj != NULL)
        pl.indices = buf_of(&idx);
    if (AMPC_RUN_KERNEL(&a, pool, &pl) < 0)
        goto done;
    result = ampc_op_results(&a, (PyObject *[]){y_obj, i_obj}, 2);
done:
    ampc_op_args_release(&a);
    return result;
}

static PyObject *mod_pool_backward(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"grad_output", "input", "indices", POOL_KWLIST, NULL};
    ampc_state *st = ampc_state_of(module);
    PyObject *dy_obj, *x_obj, *i_obj, *kernel, *stride, *padding, *dilation, *output_size, *result = NULL;
    int mode, ceil_mode, count_include_pad;
    long long divisor;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOiOOOOppLO:_pool_backward", kwlist, &dy_obj, &x_obj, &i_obj,
                                     &mode, &kernel, &stride, &padding, &dilation, &ceil_mode, &count_include_pad,
                                     &divisor, &output_size) ||
        parse_mode("_pool_backward", mode) < 0)
        return NULL;
    char name[48];
    snprintf(name, sizeof name, "%s_backward", pool_names[mode]);
    ampc_op_args a;
    ampc_op_args_init(&a, st, name);
    ampc_pool_backward pb = {{0}};
    ampc_pool *pl = &pb.pool;
    ampc_view *dy = ampc_op_arg(&a, dy_obj, "grad_output", AMPC_ARG_FLOAT);
    ampc_view *x = dy ? ampc_op_arg(&a, x_obj, "input", AMPC_ARG_FLOAT) : NULL;
    ampc_view *idx = NULL;
    if (x == NULL || pool_parse(&a, x, mode, kernel, stride, padding, dilation, ceil_mode, count_include_pad, divisor,
                                output_size, pl) < 0)
        goto done;
    pool_layout(&a, x, pl);
    int64_t outputs;
    if (dy->ndim != x->ndim || dy->shape[x->ndim - 2] != pl->p || dy->shape[x->ndim - 1] != pl->q ||
        ampc_size_mul(pl->planes, pl->p, &outputs) < 0 || ampc_size_mul(outputs, pl->q, &outputs) < 0 ||
        dy->numel != outputs) {
        PyErr_Format(PyExc_ValueError, "%s: grad_output must have the pool's output shape (.., %lld, %lld)", name,
                     (long long)pl->p, (long long)pl->q);
        goto done;
    }
    if (mode == AMPC_POOL_MAX) {
        if (i_obj == Py_None) {
            PyErr_Format(PyExc_ValueError, "%s: the indices of the forward are needed", name);
            goto done;
        }
        if ((idx = ampc_op_arg(&a, i_obj, "indices", AMPC_ARG_INDEX)) == NULL ||
            ampc_op_check_same_shape(name, idx, "indices", dy, "grad_output") < 0)
            goto done;
        if (idx->dtype != AMPC_INT64) {
            PyErr_Format(PyExc_TypeError, "%s: indices must be int64, as max_pool2d returns them, got %s", name,
                         ampc_dtype_names[idx->dtype]);
            goto done;
        }
        if (pool_operand(&a, pl, idx) < 0)
            goto done;
        pl->indices = buf_of(idx);
    }
    if (pool_operand(&a, pl, dy) < 0)
        goto done;
    ampc_view dx;
    PyObject *dx_obj = pool_output(&a, pl, dy->dtype, x, x->shape, &dx);
    if (dx_obj == NULL)
        goto done;
    pl->x = buf_of(&dx);
    pl->y = buf_of(dy);
    if (dx.numel > 0 && AMPC_RUN_KERNEL(&a, pool_backward, &pb) < 0)
        goto done;
    result = ampc_op_result(&a, dx_obj);
done:
    ampc_op_args_release(&a);
    return result;
}

/* The optional bool of a switch's setter-getter ("|O:" format): 0 with *flag
 * NULL (no argument) or Py_True/Py_False, -1 with a TypeError for anything else. */
static int switch_argument(PyObject *args, const char *format, const char *name, PyObject **flag)
{
    *flag = NULL;
    if (!PyArg_ParseTuple(args, format, flag))
        return -1;
    if (*flag != NULL && !PyBool_Check(*flag)) {
        PyErr_Format(PyExc_TypeError, "%s: expected a bool, got %s", name, Py_TYPE(*flag)->tp_name);
        return -1;
    }
    return 0;
}

static PyObject *mod_cudnn_deterministic(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *flag;
    if (switch_argument(args, "|O:_cudnn_deterministic", "cudnn.deterministic", &flag) < 0)
        return NULL;
    const int was = flag != NULL ? __atomic_exchange_n(&cudnn_deterministic, flag == Py_True, __ATOMIC_RELAXED)
                                 : __atomic_load_n(&cudnn_deterministic, __ATOMIC_RELAXED);
    return PyBool_FromLong(was);
}

static PyObject *mod_cudnn_benchmark(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *flag;
    if (switch_argument(args, "|O:_cudnn_benchmark", "cudnn.benchmark", &flag) < 0)
        return NULL;
    const int was = cudnn_benchmark_now();
    if (flag != NULL)
        __atomic_store_n(&cudnn_benchmark, flag == Py_True, __ATOMIC_RELAXED);
    return PyBool_FromLong(was);
}

PyMethodDef ampc_spatial_methods[] = {
    {"_cudnn_deterministic", mod_cudnn_deterministic, METH_VARARGS,
     "_cudnn_deterministic([flag]): whether GPU convolutions take cuDNN's deterministic algorithms only; with "
     "flag, set it. Returns the value before."},
    {"_cudnn_benchmark", mod_cudnn_benchmark, METH_VARARGS,
     "_cudnn_benchmark([flag]): whether a GPU convolution's first call of a shape times cuDNN's algorithms (else "
     "it takes cuDNN's ranking untimed); with flag, set it. Returns the value before."},
    {"_conv2d", (PyCFunction)(void (*)(void))mod_conv2d, METH_VARARGS | METH_KEYWORDS,
     "_conv2d(input, weight, bias, stride, padding, dilation, groups): torch's conv2d on 4-D arrays, accumulated "
     "in float32."},
    {"_conv2d_backward", (PyCFunction)(void (*)(void))mod_conv2d_backward, METH_VARARGS | METH_KEYWORDS,
     "_conv2d_backward(grad_output, input, weight, stride, padding, dilation, groups, which): the gradient of "
     "'input' or 'weight'."},
    {"_batch_norm", (PyCFunction)(void (*)(void))mod_batch_norm, METH_VARARGS | METH_KEYWORDS,
     "_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps): (output (n, c, h, w), "
     "save_mean, save_rstd); the running statistics move in place when training."},
    {"_batch_norm_backward", (PyCFunction)(void (*)(void))mod_batch_norm_backward, METH_VARARGS | METH_KEYWORDS,
     "_batch_norm_backward(grad_output, input, weight, save_mean, save_rstd, eps, input_grad=True, "
     "weight_grads=True): (grad_input (n, c, h, w), grad_weight, grad_bias) of training-mode batch_norm."},
    {"_pool", (PyCFunction)(void (*)(void))mod_pool, METH_VARARGS | METH_KEYWORDS,
     "_pool(input, mode, kernel_size, stride, padding, dilation, ceil_mode, count_include_pad, divisor_override, "
     "output_size): (output, indices or None); mode 0 max, 1 avg, 2 adaptive avg."},
    {"_pool_backward", (PyCFunction)(void (*)(void))mod_pool_backward, METH_VARARGS | METH_KEYWORDS,
     "_pool_backward(grad_output, input, indices, mode, ...): the gradient of the pool's input."},
    {NULL, NULL, 0, NULL},
};
