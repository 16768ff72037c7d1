/*
 * ops_gemm.c: _matmul, the one entry point of every matrix product
 * (linear, matmul, mm, bmm, addmm, baddbmm and their backward passes).
 *
 *   out = alpha * (op(a) @ op(b)) + beta * c + bias
 *
 * with torch.matmul's rules for shapes (1-D operands, broadcast batch
 * dimensions), op() a transpose of the last two dimensions where asked
 * (linear's weight), c broadcast to the output, bias one value per column.
 *
 * A backend without a gemm entry (the CPU's): NumPy's matmul (its BLAS,
 * threads, GIL released) in float32 (float64 for float64), then one
 * elementwise pass that adds c or bias and rounds once to the output dtype.
 * With one (CUDA's: one cuBLASLt call, cuda/gemm.c, float32 accumulation):
 * c is copied into the output first when cuBLASLt cannot read it in place.
 */
#include "ampc.h"

#include "kernels/op_descriptors.h"
#include "op_args.h"

/* An ndarray of v's values in dtype acc (float32 or float64): over v's
 * memory when v has that dtype (read-only, kept alive by v's owner), else a
 * converted copy. */
PyObject *ampc_op_acc_ndarray(ampc_op_args *a, const ampc_view *v, ampc_dtype acc)
{
    ampc_state *st = a->st;
    if (v->dtype != acc) {
        ampc_view copy;
        PyObject *obj = ampc_array_empty(st, v->device, acc, v->ndim, v->shape, NULL, &copy);
        if (obj == NULL)
            return NULL;
        if (ampc_cast_views(st, &copy, v, 1) < 0) {
            Py_DECREF(obj);
            return NULL;
        }
        return obj;
    }
    npy_intp dims[AMPC_MAX_NDIM], strides[AMPC_MAX_NDIM];
    for (int d = 0; d < v->ndim; d++) {
        dims[d] = (npy_intp)v->shape[d];
        strides[d] = (npy_intp)v->strides[d];
    }
    PyArray_Descr *descr = st->descr[acc];
    Py_INCREF(descr);
    PyObject *arr = PyArray_NewFromDescr(&PyArray_Type, descr, v->ndim, dims, strides, v->data, 0, NULL);
    if (arr == NULL)
        return NULL;
    Py_INCREF(v->owner);
    if (PyArray_SetBaseObject((PyArrayObject *)arr, v->owner) < 0) {
        Py_DECREF(arr);
        return NULL;
    }
    return arr;
}

/* NumPy's matmul inside np.errstate(all="ignore"): inf and NaN are values
 * here (a GradScaler finds them), as in ampc's own kernels, not warnings. */
PyObject *ampc_np_matmul(ampc_state *st, PyObject *x, PyObject *y, PyObject *out)
{
    if (st->np_matmul == NULL) {
        PyObject *np = PyImport_ImportModule("numpy");
        if (np == NULL)
            return NULL;
        st->np_matmul = PyObject_GetAttrString(np, "matmul");
        st->np_errstate = st->np_matmul ? PyObject_GetAttrString(np, "errstate") : NULL;
        Py_DECREF(np);
        if (st->np_errstate == NULL) {
            Py_CLEAR(st->np_matmul);
            return NULL;
        }
    }
    PyObject *kwargs = Py_BuildValue("{s:s}", "all", "ignore");
    PyObject *empty = PyTuple_New(0);
    PyObject *quiet = kwargs && empty ? PyObject_Call(st->np_errstate, empty, kwargs) : NULL;
    Py_XDECREF(kwargs);
    Py_XDECREF(empty);
    if (quiet == NULL)
        return NULL;
    PyObject *entered = PyObject_CallMethod(quiet, "__enter__", NULL);
    PyObject *product = NULL;
    if (entered != NULL && out == NULL)
        product = PyObject_CallFunctionObjArgs(st->np_matmul, x, y, NULL);
    else if (entered != NULL) {
        PyObject *operands = PyTuple_Pack(2, x, y), *where = Py_BuildValue("{s:O}", "out", out);
        product = operands && where ? PyObject_Call(st->np_matmul, operands, where) : NULL;
        Py_XDECREF(operands);
        Py_XDECREF(where);
    }
    Py_XDECREF(entered);
    PyObject *exc = ampc_take_exception();
    PyObject *exited = PyObject_CallMethod(quiet, "__exit__", "OOO", Py_None, Py_None, Py_None);
    Py_DECREF(quiet);
    if (exc != NULL) {
        Py_XDECREF(exited);
        ampc_restore_exception(exc);
        Py_XDECREF(product);
        return NULL;
    }
    if (exited == NULL) {
        Py_XDECREF(product);
        return NULL;
    }
    Py_DECREF(exited);
    if (product == NULL)
        return NULL;
    /* two vectors give a NumPy scalar: make it a 0-d array */
    PyObject *r = PyArray_FROM_O(product);
    Py_DECREF(product);
    return r;
}

static void swap_last_two(ampc_view *v)
{
    const int i = v->ndim - 2, j = v->ndim - 1;
    int64_t t = v->shape[i];
    v->shape[i] = v->shape[j];
    v->shape[j] = t;
    t = v->strides[i];
    v->strides[i] = v->strides[j];
    v->strides[j] = t;
}

/* torch.matmul's shape rules: the output shape, m, n, k, and the broadcast
 * batch shape. A 1-D a is a row (its m dropped), a 1-D b a column (n dropped). */
typedef struct {
    int64_t m, n, k;
    int bndim;
    int64_t bshape[AMPC_MAX_NDIM];
    int ondim;
    int64_t oshape[AMPC_MAX_NDIM];
} mm_shape;

static int matmul_shape(const char *op, const ampc_view *x, const ampc_view *y, mm_shape *s)
{
    const int xv = x->ndim == 1, yv = y->ndim == 1;
    s->m = xv ? 1 : x->shape[x->ndim - 2];
    s->k = x->shape[x->ndim - 1];
    const int64_t ky = yv ? y->shape[0] : y->shape[y->ndim - 2];
    s->n = yv ? 1 : y->shape[y->ndim - 1];
    if (s->k != ky) {
        if (x->ndim <= 2 && y->ndim <= 2)
            PyErr_Format(PyExc_ValueError, "%s: mat1 and mat2 shapes cannot be multiplied (%lldx%lld and %lldx%lld)",
                         op, (long long)s->m, (long long)s->k, (long long)ky, (long long)s->n);
        else
            PyErr_Format(PyExc_ValueError, "%s: the inner dimensions do not match: input has %lld columns, "
                         "other has %lld rows", op, (long long)s->k, (long long)ky);
        return -1;
    }
    const int xb = xv ? 0 : x->ndim - 2, yb = yv ? 0 : y->ndim - 2;
    s->bndim = xb > yb ? xb : yb;
    for (int d = 0; d < s->bndim; d++) {
        const int dx = d - (s->bndim - xb), dy = d - (s->bndim - yb);
        const int64_t sx = dx >= 0 ? x->shape[dx] : 1, sy = dy >= 0 ? y->shape[dy] : 1;
        if (sx != sy && sx != 1 && sy != 1) {
            PyErr_Format(PyExc_ValueError, "%s: the batch dimensions do not broadcast (%lld against %lld at "
                         "batch dimension %d)", op, (long long)sx, (long long)sy, d);
            return -1;
        }
        s->bshape[d] = sx != 1 ? sx : sy;
    }
    s->ondim = 0;
    for (int d = 0; d < s->bndim; d++)
        s->oshape[s->ondim++] = s->bshape[d];
    if (!xv)
        s->oshape[s->ondim++] = s->m;
    if (!yv)
        s->oshape[s->ondim++] = s->n;
    return 0;
}

/* Whether v broadcasts to (ndim, shape) without growing it: as many dimensions or fewer, each 1 or
 * equal to the output's, aligned at the last. */
static int broadcasts_to(const ampc_view *v, int ndim, const int64_t *shape)
{
    if (v->ndim > ndim)
        return 0;
    for (int d = 0; d < v->ndim; d++) {
        const int64_t have = v->shape[v->ndim - 1 - d], want = shape[ndim - 1 - d];
        if (have != 1 && have != want)
            return 0;
    }
    return 1;
}

/* The epilogue in one elementwise pass: out = alpha * (r + beta/alpha * c)
 * (c broadcast; a bias is c with beta 1), or alpha * r, rounded to out's
 * dtype. As BLAS (and so torch, and the GPU's cuBLASLt): beta 0 reads no c,
 * alpha 0 no product, so their NaN and inf do not reach the result. */
static int epilogue(ampc_op_args *a, const ampc_view *r, const ampc_view *c, const ampc_view *bias, double alpha,
                    double beta, const ampc_view *out)
{
    ampc_ew e = {.op = AMPC_EW_COPY, .param = 1.0, .scale = 1.0, .ndim = out->ndim, .nin = 1, .numel = out->numel};
    if (c != NULL && beta == 0.0) {
        if (ampc_op_broadcast_strides(a->op, "input", c, out->ndim, out->shape, e.strides[1]) < 0)
            return -1;  /* still the shape it must have */
        c = NULL;
    }
    for (int d = 0; d < out->ndim; d++) {
        e.shape[d] = out->shape[d];
        e.strides[0][d] = r->strides[d] / ampc_dtype_size(r->dtype);
    }
    e.out = (ampc_buf){out->data, out->dtype};
    e.in[0] = (ampc_buf){r->data, r->dtype};
    const char *name = c != NULL ? "input" : "bias";
    if (c == NULL && bias != NULL) {
        c = bias;  /* a bias is c with beta 1 */
        beta = 1.0;
    }
    if (c != NULL) {
        e.op = AMPC_EW_ADD;
        e.nin = 2;
        e.in[1] = (ampc_buf){c->data, c->dtype};
        if (ampc_op_broadcast_strides(a->op, name, c, out->ndim, out->shape, e.strides[1]) < 0)
            return -1;
        if (alpha == 0.0) {
            /* beta * c alone (alpha * r would be 0 * inf = NaN where r overflows; torch ignores r) */
            e.op = AMPC_EW_COPY;
            e.nin = 1;
            e.in[0] = e.in[1];
            for (int d = 0; d < out->ndim; d++)
                e.strides[0][d] = e.strides[1][d];
            e.scale = beta;
        }
        else {
            e.param = beta / alpha;
            e.scale = alpha;
        }
    }
    else if (alpha == 0.0) {
        e.in[0].data = NULL;  /* the constant e.value[0], 0 */
    }
    else {
        e.scale = alpha;
    }
    return AMPC_RUN_KERNEL(a, elementwise, &e);
}

static int matmul_numpy(ampc_op_args *a, const ampc_view *x, const ampc_view *y, const ampc_view *c,
                        const ampc_view *bias, double alpha, double beta, ampc_dtype out_dtype, PyObject **out_obj)
{
    ampc_state *st = a->st;
    const ampc_dtype acc = ampc_acc_dtype(x->dtype);
    PyObject *xa = ampc_op_acc_ndarray(a, x, acc);
    if (xa == NULL || ampc_op_keep(a, xa) < 0)
        return -1;
    PyObject *ya = ampc_op_acc_ndarray(a, y, acc);
    if (ya == NULL || ampc_op_keep(a, ya) < 0)
        return -1;
    PyObject *r = ampc_np_matmul(st, xa, ya, NULL);
    if (r == NULL || ampc_op_keep(a, r) < 0)
        return -1;
    if (c == NULL && bias == NULL && alpha == 1.0 && out_dtype == acc) {
        *out_obj = r;
        return 0;
    }
    ampc_view rv, out;
    if (ampc_view_from_ndarray(st, (PyArrayObject *)r, "matmul result", &rv) < 0)
        return -1;
    int rc;
    if (out_dtype == acc && PyArray_IS_C_CONTIGUOUS((PyArrayObject *)r)) {
        /* the epilogue in place on NumPy's fresh product, which nobody else holds: a second array
         * of its size would be allocated and first touched (attention's scaled scores: 2.7x the
         * product's own time on the CI VM) */
        rc = epilogue(a, &rv, c, bias, alpha, beta, &rv);
        *out_obj = r;
    }
    else {
        PyObject *o = ampc_op_output(a, out_dtype, rv.ndim, rv.shape, &out);
        rc = o != NULL ? epilogue(a, &rv, c, bias, alpha, beta, &out) : -1;
        *out_obj = o;
    }
    ampc_view_release(&rv);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* GPU: the layout cuBLASLt is given                                         */
/* ------------------------------------------------------------------------ */

/* The stride (elements) between v's matrices along the batch dimensions
 * [from, to) of the broadcast batch shape, if one stride describes it: 1
 * with *stride set (0 when v is one matrix over all of them), 0 if not. vb:
 * v's batch dimensions, aligned to the batch shape's last. */
static int group_stride(const ampc_view *v, int vb, const mm_shape *s, int from, int to, int64_t *stride)
{
    const int64_t size = ampc_dtype_size(v->dtype);
    int broadcast = 0, stepped = 0;
    int64_t expect = 0;
    *stride = 0;
    for (int d = to - 1; d >= from; d--) {
        if (s->bshape[d] == 1)
            continue;
        const int vd = d - (s->bndim - vb);
        if (vd < 0 || v->shape[vd] == 1) {
            broadcast = 1;
            continue;
        }
        if (v->strides[vd] % size != 0)
            return 0;
        const int64_t st = v->strides[vd] / size;
        if (!stepped)
            *stride = st;
        else if (st != expect)
            return 0;
        stepped = 1;
        expect = st * s->bshape[d];
    }
    return !(broadcast && stepped);  /* broadcast over part of the group: no single stride */
}

static int batch_stride(const ampc_view *v, int vb, const mm_shape *s, int64_t *stride)
{
    return group_stride(v, vb, s, 0, s->bndim, stride);
}

/* A batch that is not one stride in x or y but two, the dimensions before
 * *split in one and those from it in the other (attention's heads viewed
 * out of a (batch, sequence, heads, features) array): 1 with *split and the
 * outer strides set, and cuBLASLt's batch is the inner dimensions, once per
 * outer index. Saves copying the operands dense. */
static int two_level_batch(const ampc_view *x, int xb, const ampc_view *y, int yb, const mm_shape *s, int *split,
                           int64_t *x_outer, int64_t *y_outer)
{
    int64_t inner;
    for (int at = s->bndim - 1; at >= 1; at--)
        if (group_stride(x, xb, s, at, s->bndim, &inner) && group_stride(y, yb, s, at, s->bndim, &inner) &&
            group_stride(x, xb, s, 0, at, x_outer) && group_stride(y, yb, s, 0, at, y_outer)) {
            *split = at;
            return 1;
        }
    return 0;
}

/* The matrix layout of v's last two dimensions (rows x cols): 1 with
 * *trans and *ld set when one of them has unit stride, 0 otherwise. */
static int matrix_layout(const ampc_view *v, int64_t rows, int64_t cols, int *trans, int64_t *ld)
{
    const int64_t size = ampc_dtype_size(v->dtype);
    const int64_t sr = v->ndim >= 2 ? v->strides[v->ndim - 2] : cols * size;
    const int64_t sc = v->strides[v->ndim - 1];
    if (sr % size || sc % size)
        return 0;
    if ((sc == size || cols == 1) && (rows == 1 || sr / size >= cols)) {
        *trans = 0;
        *ld = rows == 1 ? cols : sr / size;
        return *ld >= 1;
    }
    if ((sr == size || rows == 1) && (cols == 1 || sc / size >= rows)) {
        *trans = 1;
        *ld = cols == 1 ? rows : sc / size;
        return *ld >= 1;
    }
    return 0;
}

/* A dense copy of v broadcast to its batch dimensions over the full batch shape. */
static int expand_dense(ampc_op_args *a, ampc_view *v, int vb, const mm_shape *s)
{
    int64_t shape[AMPC_MAX_NDIM];
    int ndim = 0;
    for (int d = 0; d < s->bndim; d++)
        shape[ndim++] = s->bshape[d];
    for (int d = vb; d < v->ndim; d++)
        shape[ndim++] = v->shape[d];
    ampc_view copy;
    if (ampc_op_output(a, v->dtype, ndim, shape, &copy) == NULL)
        return -1;
    ampc_ew e = {.op = AMPC_EW_COPY, .scale = 1.0, .ndim = ndim, .nin = 1, .numel = copy.numel};
    for (int d = 0; d < ndim; d++)
        e.shape[d] = shape[d];
    e.out = (ampc_buf){copy.data, copy.dtype};
    e.in[0] = (ampc_buf){v->data, v->dtype};
    if (ampc_op_broadcast_strides(a->op, "input", v, ndim, shape, e.strides[0]) < 0 ||
        AMPC_RUN_KERNEL(a, elementwise, &e) < 0)
        return -1;
    v->data = copy.data;
    v->ndim = ndim;
    for (int d = 0; d < ndim; d++) {
        v->shape[d] = copy.shape[d];
        v->strides[d] = copy.strides[d];
    }
    v->stream = copy.stream;
    return 0;
}

/* sums (out_dtype, m values) = the sums of the dense (k, m) x0 over its
 * rows: op(a)'s sums over k when op(a) is x0 transposed. */
static int input_column_sums(ampc_op_args *a, ampc_view *x0, const ampc_view *sums)
{
    if (ampc_op_dense(a, x0) < 0)
        return -1;
    ampc_reduce r = {.rows = {1, x0->shape[0], x0->shape[1]}, .scale = 1.0, .out = {sums->data, sums->dtype},
                     .x = {x0->data, x0->dtype}};
    return AMPC_RUN_KERNEL(a, reduce, &r);
}

/* The products cuBLASLt's strided batch cannot describe alone: `count`
 * batches of g, the operands' matrices `*_stride` elements further on
 * each time (two_level_batch). */
typedef struct {
    int64_t count, a_stride, b_stride, d_stride;
} outer_batch;

static int gemm_each(ampc_op_args *a, void *stream, const ampc_gemm *g, const outer_batch *ob)
{
    int status = AMPC_OK;
    for (int64_t i = 0; i < ob->count && status == AMPC_OK; i++) {
        ampc_gemm part = *g;
        part.a.data = (char *)g->a.data + i * ob->a_stride * ampc_dtype_size(g->a.dtype);
        part.b.data = (char *)g->b.data + i * ob->b_stride * ampc_dtype_size(g->b.dtype);
        part.d.data = (char *)g->d.data + i * ob->d_stride * ampc_dtype_size(g->d.dtype);
        if (g->c.data != NULL)  /* c is d (the epilogue's broadcast) */
            part.c.data = part.d.data;
        status = ampc_backend_of(a->st, a->device)->gemm(a->device.index, stream, &part);
    }
    return status;
}

/* sums (when not NULL): linear's bias gradient from the weight gradient's
 * product, fused into it (cuBLASLt's BGRADB epilogue) where it can be, else
 * input_column_sums over x0. */
static int matmul_gemm(ampc_op_args *a, ampc_view *x, ampc_view *y, const ampc_view *c, const ampc_view *bias,
                       double alpha, double beta, ampc_dtype out_dtype, const mm_shape *s, PyObject **out_obj,
                       const ampc_view *sums, ampc_view *x0)
{
    /* Matrices as 2-D or more: a 1-D a is (1, k), a 1-D b (k, 1). */
    if (x->ndim == 1) {
        x->ndim = 2;
        x->shape[1] = x->shape[0];
        x->strides[1] = x->strides[0];
        x->shape[0] = 1;
        x->strides[0] = x->shape[1] * ampc_dtype_size(x->dtype);
    }
    if (y->ndim == 1) {
        y->ndim = 2;
        y->shape[1] = 1;
        y->strides[1] = ampc_dtype_size(y->dtype);
    }
    const int xb = x->ndim - 2, yb = y->ndim - 2;
    ampc_gemm g = {.m = s->m, .n = s->n, .k = s->k, .batch = 1, .alpha = alpha, .beta = 0.0};
    outer_batch ob = {.count = 1};
    int split = 0;
    if (sums == NULL && matrix_layout(x, s->m, s->k, &g.trans_a, &g.lda) &&
        matrix_layout(y, s->k, s->n, &g.trans_b, &g.ldb) &&
        !(batch_stride(x, xb, s, &g.stride_a) && batch_stride(y, yb, s, &g.stride_b)))
        two_level_batch(x, xb, y, yb, s, &split, &ob.a_stride, &ob.b_stride);
    for (int d = 0; d < s->bndim; d++)
        *(d < split ? &ob.count : &g.batch) *= s->bshape[d];
    if (!group_stride(x, xb, s, split, s->bndim, &g.stride_a) || !matrix_layout(x, s->m, s->k, &g.trans_a, &g.lda)) {
        if (expand_dense(a, x, xb, s) < 0)
            return -1;
        batch_stride(x, s->bndim, s, &g.stride_a);
        matrix_layout(x, s->m, s->k, &g.trans_a, &g.lda);
    }
    if (!group_stride(y, yb, s, split, s->bndim, &g.stride_b) || !matrix_layout(y, s->k, s->n, &g.trans_b, &g.ldb)) {
        if (expand_dense(a, y, yb, s) < 0)
            return -1;
        batch_stride(y, s->bndim, s, &g.stride_b);
        matrix_layout(y, s->k, s->n, &g.trans_b, &g.ldb);
    }
    ampc_view out;
    PyObject *o = ampc_op_output(a, out_dtype, s->ondim, s->oshape, &out);
    if (o == NULL)
        return -1;
    g.ldd = s->n;
    g.stride_d = s->m * s->n;
    ob.d_stride = g.batch * g.stride_d;
    /* One product of m * batch rows when b is shared and a's matrices lie end to end. */
    if (g.batch > 1 && g.stride_b == 0 && !g.trans_a && g.stride_a == s->m * g.lda && g.lda == s->k) {
        g.m *= g.batch;
        g.batch = 1;
    }
    g.a = (ampc_buf){x->data, x->dtype};
    g.b = (ampc_buf){y->data, y->dtype};
    g.d = (ampc_buf){out.data, out.dtype};
    /* a bias is c with beta 1 */
    const ampc_view *added = bias != NULL ? bias : c != NULL && beta != 0.0 ? c : NULL;
    const double added_beta = bias != NULL ? 1.0 : beta;
    if (added != NULL) {
        if (added->ndim == 1 && added->shape[0] == s->n && added_beta == 1.0 &&
            added->strides[0] == ampc_dtype_size(added->dtype) && added->dtype == out_dtype) {
            g.bias = (ampc_buf){added->data, added->dtype};  /* linear, addmm(bias, x, w): the bias epilogue */
        }
        else {
            /* broadcast into the output, which cuBLASLt then reads as C */
            ampc_ew e = {.op = AMPC_EW_COPY, .scale = 1.0, .ndim = out.ndim, .nin = 1, .numel = out.numel};
            for (int d = 0; d < out.ndim; d++)
                e.shape[d] = out.shape[d];
            e.out = g.d;
            e.in[0] = (ampc_buf){added->data, added->dtype};
            if (ampc_op_broadcast_strides(a->op, added == bias ? "bias" : "input", added, out.ndim, out.shape,
                                          e.strides[0]) < 0 ||
                AMPC_RUN_KERNEL(a, elementwise, &e) < 0)
                return -1;
            g.c = g.d;
            g.ldc = g.ldd;
            g.stride_c = g.stride_d;
            g.beta = added_beta;
        }
    }
    *out_obj = o;
    if (out.numel == 0 || s->k == 0) {
        int rc = 0;
        if (out.numel > 0 && g.c.data == NULL && g.bias.data == NULL) {
            /* an empty sum: zeros */
            ampc_ew zero = {.op = AMPC_EW_COPY, .scale = 1.0, .ndim = 1, .nin = 1, .numel = out.numel,
                            .shape = {out.numel}, .out = g.d};
            rc = AMPC_RUN_KERNEL(a, elementwise, &zero);
        }
        else if (out.numel > 0) {
            /* c or bias alone: the products add nothing */
            void *stream;
            if (ampc_op_stream_begin(a, &stream) < 0)
                return -1;
            const int status = gemm_each(a, stream, &g, &ob);
            if (status != AMPC_OK)
                return ampc_backend_raise(a->st, a->device, status, a->op);
            rc = ampc_op_stream_end(a, stream);
        }
        return rc == 0 && sums != NULL ? input_column_sums(a, x0, sums) : rc;
    }
    void *stream;
    if (ampc_op_stream_begin(a, &stream) < 0)
        return -1;
    if (sums != NULL && s->k > 0 && g.batch == 1 && g.c.data == NULL && g.bias.data == NULL)
        g.bias_grad = (ampc_buf){sums->data, sums->dtype};
    int status = gemm_each(a, stream, &g, &ob);
    if (status == AMPC_ERR_UNSUPPORTED && g.bias_grad.data != NULL) {
        g.bias_grad = (ampc_buf){NULL, AMPC_FLOAT32};
        status = gemm_each(a, stream, &g, &ob);
    }
    if (status != AMPC_OK)
        return ampc_backend_raise(a->st, a->device, status, a->op);
    if (ampc_op_stream_end(a, stream) < 0)
        return -1;
    return sums != NULL && g.bias_grad.data == NULL ? input_column_sums(a, x0, sums) : 0;
}

static PyObject *mod_matmul(PyObject *module, PyObject *args, PyObject *kwargs)
{
    /* keyword-only, in the order calls use them: a call looks up each keyword before the last
     * one it gives (a new str each), so op, which every call gives, comes first, then linear's */
    static char *kwlist[] = {"input", "other", "op", "bias", "transpose_a", "transpose_b", "c", "alpha", "beta",
                             "dtype", "bias_grad", NULL};
    ampc_state *st = ampc_state_of(module);
    PyObject *x_obj, *y_obj, *c_obj = Py_None, *b_obj = Py_None, *dtype_obj = Py_None, *result = NULL;
    double alpha = 1.0, beta = 1.0;
    int ta = 0, tb = 0, want_sums = 0;
    const char *name = "matmul";
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|$sOppOddOp:_matmul", kwlist, &x_obj, &y_obj, &name, &b_obj,
                                     &ta, &tb, &c_obj, &alpha, &beta, &dtype_obj, &want_sums))
        return NULL;
    ampc_op_args a;
    ampc_op_args_init(&a, st, name);
    int have_dtype;
    ampc_dtype dtype;
    mm_shape s;
    ampc_view *c = NULL, *bias = NULL;
    ampc_view *x = ampc_op_arg(&a, x_obj, "input", AMPC_ARG_FLOAT);
    ampc_view *y = x ? ampc_op_arg(&a, y_obj, "other", AMPC_ARG_FLOAT) : NULL;
    if (y == NULL || ampc_op_parse_dtype(&a, dtype_obj, &have_dtype, &dtype) < 0)
        goto done;
    if (c_obj != Py_None && (c = ampc_op_arg(&a, c_obj, "input", AMPC_ARG_FLOAT)) == NULL)
        goto done;
    if (b_obj != Py_None && (bias = ampc_op_arg(&a, b_obj, "bias", AMPC_ARG_FLOAT)) == NULL)
        goto done;
    if (x->ndim == 0 || y->ndim == 0) {
        PyErr_Format(PyExc_ValueError, "%s: both arguments need at least 1 dimension, got %dD and %dD", name,
                     x->ndim, y->ndim);
        goto done;
    }
    if (x->dtype != y->dtype || (bias != NULL && bias->dtype != x->dtype) || (c != NULL && c->dtype != x->dtype)) {
        const ampc_view *other = x->dtype != y->dtype ? y : bias != NULL && bias->dtype != x->dtype ? bias : c;
        PyErr_Format(PyExc_TypeError, "%s: expected all arguments to have the same dtype, but got %s for input and "
                     "%s for %s%s", name, ampc_dtype_names[x->dtype], ampc_dtype_names[other->dtype],
                     other == y ? "other" : other == bias ? "bias" : "the added input",
                     ampc_op_float64_hint(x->dtype, other->dtype));
        goto done;
    }
    if ((ta && x->ndim < 2) || (tb && y->ndim < 2)) {
        PyErr_Format(PyExc_ValueError, "%s: a transposed operand needs 2 dimensions or more", name);
        goto done;
    }
    if (want_sums && (!ta || x->ndim != 2 || y->ndim != 2 || c != NULL || bias != NULL || alpha != 1.0)) {
        PyErr_Format(PyExc_ValueError, "%s: bias_grad takes a product of a transposed 2-D input and a 2-D other, "
                     "without c, bias or alpha", name);
        goto done;
    }
    ampc_view x0 = *x;  /* before the transpose: the (k, m) array bias_grad sums over its rows */
    if (ta)
        swap_last_two(x);
    if (tb)
        swap_last_two(y);
    if (matmul_shape(name, x, y, &s) < 0)
        goto done;
    if (ampc_layout_numel(s.ondim, s.oshape, 8) < 0) {
        /* the broadcast batch times m times n: checked before any product of them is taken (the GPU's
         * batch counts, the expanded operands) */
        PyErr_Format(PyExc_ValueError, "%s: the output's broadcast batch and matrices are too large (past 2**63 "
                     "bytes)", name);
        goto done;
    }
    if (bias != NULL && !broadcasts_to(bias, s.ondim, s.oshape)) {
        /* torch's linear adds any bias that broadcasts to the output (addmm's and matmul's + bias): (n,),
         * (1, n), (m, n), a number; never one that would grow the output */
        char bs[256], os[256];
        const ampc_view shown = {.ndim = s.ondim};
        ampc_shape_str(bias, bs, sizeof bs);
        ampc_view out_shape = shown;
        for (int d = 0; d < s.ondim; d++)
            out_shape.shape[d] = s.oshape[d];
        ampc_shape_str(&out_shape, os, sizeof os);
        PyErr_Format(PyExc_ValueError, "%s: bias of shape %s does not broadcast to the output's shape %s (one value "
                     "per output feature: %lld)", name, bs, os, (long long)s.n);
        goto done;
    }
    if (c != NULL && bias != NULL) {
        PyErr_Format(PyExc_TypeError, "%s: give either c or bias", name);
        goto done;
    }
    const ampc_dtype out_dtype = have_dtype ? dtype : x->dtype;
    PyObject *out_obj = NULL, *sums_obj = NULL;
    ampc_view sums;
    if (want_sums && (sums_obj = ampc_op_output(&a, out_dtype, 1, &s.m, &sums)) == NULL)
        goto done;
    int rc;
    if (ampc_backend_of(st, a.device)->gemm == NULL) {
        rc = matmul_numpy(&a, x, y, c, bias, alpha, beta, out_dtype, &out_obj);
        if (rc == 0 && want_sums)
            rc = input_column_sums(&a, &x0, &sums);
    }
    else {
        rc = matmul_gemm(&a, x, y, c, bias, alpha, beta, out_dtype, &s, &out_obj, want_sums ? &sums : NULL, &x0);
    }
    if (rc == 0 && !want_sums)
        result = ampc_op_result(&a, out_obj);
    if (rc == 0 && want_sums)
        result = ampc_op_results(&a, (PyObject *[]){out_obj, sums_obj}, 2);
done:
    ampc_op_args_release(&a);
    return result;
}

PyMethodDef ampc_gemm_methods[] = {
    {"_matmul", (PyCFunction)(void (*)(void))mod_matmul, METH_VARARGS | METH_KEYWORDS,
     "_matmul(input, other, *, c=None, bias=None, alpha=1.0, beta=1.0, transpose_a=False, transpose_b=False, "
     "op='matmul', dtype=None, bias_grad=False): alpha * op(input) @ op(other) + beta * c + bias, accumulated in "
     "float32. bias_grad (linear's weight gradient, input = grad_output transposed): returns (product, the sums "
     "of op(input) over k), the sums fused into the product on the GPU where cuBLASLt can."},
    {NULL, NULL, 0, NULL},
};
