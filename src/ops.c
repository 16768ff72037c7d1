/*
 * ops.c: the entry points of the op kernels (op_descriptors.h), as private functions
 * of ampc._C that ampc.nn.functional composes: _ew, _softmax,
 * _softmax_backward, _layer_norm, _layer_norm_backward, _sum,
 * _cross_entropy, _cross_entropy_backward (matrix products: ops_gemm.c).
 *
 * Each takes arrays of any kind ampc reads (NumPy, torch, CuPy, JAX,
 * ampc.Array), checks every argument before anything is allocated or
 * written, runs the CPU kernel (GIL released) or the CUDA one on ampc's
 * current stream (ordered after the inputs' streams, and theirs after it),
 * and returns arrays of the caller's type.
 */
#include "ampc.h"

#include "kernels/op_descriptors.h"
#include "op_args.h"

static ampc_buf buf_of(const ampc_view *v) { return (ampc_buf){v->data, v->dtype}; }

/* ------------------------------------------------------------------------ */
/* _ew: elementwise with broadcasting                                         */
/* ------------------------------------------------------------------------ */

/* A Python number (bool included): a wrapped number of torch's promotion. */
static int is_number(PyObject *obj)
{
    return PyFloat_Check(obj) || PyLong_Check(obj);
}

/* The ops that take integer and bool arrays, as torch's: alongside a floating
 * operand (the result is floating) or, for the ops torch computes in floating
 * point whatever their input (exp, division ...), alone, giving float32.
 * The rest (gelu, the gradients, the losses) are floating only, as torch's
 * kernels are. The flags: kernels/ew_ops.def. */
static int ew_takes_integers(ampc_ew_op op) { return (ampc_ew_flags(op) & AMPC_EW_INT) != 0; }

static int ew_integers_give_float(ampc_ew_op op) { return (ampc_ew_flags(op) & AMPC_EW_INT_FLOAT) != 0; }

/* Read e's operands into in[] (NULL for a Python number after the first
 * operand, its value in e->value) and set e->out.dtype: dtype= where given,
 * else torch's result type (type_promotion.c). Integer and bool arrays are
 * converted to the compute type (float32, float64 for a float64 result)
 * first: the kernels read every operand in it, as torch's CUDA kernels do
 * (float16 + an int64 array adds the integers as float32, not rounded to
 * float16 first). */
static int ew_operands(ampc_op_args *a, ampc_ew *e, PyObject *const *objs, const char *const *names,
                       PyObject *dtype_obj, const ampc_view **in)
{
    const int arity = ampc_ew_arity(e->op);
    const int kind = ew_takes_integers(e->op) ? AMPC_ARG_ANY : AMPC_ARG_FLOAT;
    ampc_view *arrays[3] = {NULL, NULL, NULL};
    ampc_promotion types;
    ampc_promotion_init(&types);
    for (int x = 0; x < e->nin; x++) {
        if (x == 1 && arity == 1 && objs[1] == Py_None) {
            e->value[1] = 0;
            continue;
        }
        if (is_number(objs[x]) && x > 0) {  /* the first operand is an array (a float: a 0-d float64 one) */
            e->value[x] = PyFloat_AsDouble(objs[x]);
            if (e->value[x] == -1.0 && PyErr_Occurred())
                return -1;
            ampc_promotion_add_number(&types, PyFloat_Check(objs[x]) ? AMPC_CATEGORY_FLOAT
                                                : PyBool_Check(objs[x]) ? AMPC_CATEGORY_BOOL
                                                                        : AMPC_CATEGORY_INTEGER);
            continue;
        }
        if ((arrays[x] = ampc_op_arg(a, objs[x], names[x], kind)) == NULL)
            return -1;
        ampc_promotion_add_array(&types, arrays[x]);
    }
    /* After the operands: a backward op's dtype= is an operand's dtype, and
     * the message about that operand names it. */
    int have_dtype;
    if (ampc_op_parse_dtype(a, dtype_obj, &have_dtype, &e->out.dtype) < 0)
        return -1;
    const ampc_type_group result = ampc_promotion_result(&types);
    if (!have_dtype && result.category == AMPC_CATEGORY_FLOAT)
        e->out.dtype = result.floating;
    else if (!have_dtype && ew_integers_give_float(e->op))
        e->out.dtype = AMPC_FLOAT32;  /* torch's default dtype */
    else if (!have_dtype) {
        const int x = arrays[0] != NULL ? 0 : 1;
        PyErr_Format(PyExc_TypeError, "%s: %s must be a floating array (float32, float16, bfloat16 or float64), "
                     "got dtype %s: integer and bool operands are taken beside a floating one (torch would give "
                     "an integer result, which ampc does not compute)", a->op, names[x],
                     ampc_dtype_names[arrays[x]->dtype]);
        return -1;
    }
    for (int x = 0; x < e->nin; x++) {
        if (arrays[x] != NULL && !AMPC_DTYPE_IS_FLOAT(arrays[x]->dtype) &&
            ampc_op_convert(a, arrays[x], e->out.dtype == AMPC_FLOAT64 ? AMPC_FLOAT64 : AMPC_FLOAT32, NULL) < 0)
            return -1;
        in[x] = arrays[x];
    }
    return 0;
}

/* The input whose layout the output takes, or -1 for C order: as torch and
 * NumPy (order 'K') do, the first input of the output's full shape that is
 * dense in an order other than C's (a channels-last activation gives a
 * channels-last result, which the next convolution and batch norm read as
 * they are, without a transposing copy). */
static int ew_layout_source(const ampc_ew *e, const ampc_view *const *in)
{
    for (int x = 0; x < e->nin; x++) {
        const ampc_view *v = in[x];
        int full = v != NULL && v->ndim == e->ndim;
        for (int d = 0; full && d < e->ndim; d++)
            full = v->shape[d] == e->shape[d];
        if (!full)
            continue;
        const int64_t size = ampc_dtype_size(v->dtype);
        if (ampc_layout_is_c_contiguous(v->ndim, v->shape, v->strides, size))
            return -1;
        int64_t dense[AMPC_MAX_NDIM];
        ampc_layout_korder_strides(v->ndim, v->shape, v->strides, size, dense);
        int same = 1;
        for (int d = 0; d < v->ndim && same; d++)
            same = v->shape[d] == 1 || v->strides[d] == dense[d];
        if (same)
            return x;
    }
    return -1;
}

/* Reorder e's dimensions into the memory order of an output with these
 * (byte) strides, outermost first, so that the kernels, which write the
 * output in C order of e's dimensions, write it in its memory order. */
static void ew_in_memory_order(ampc_ew *e, const int64_t *out_strides)
{
    int perm[AMPC_MAX_NDIM];
    ampc_layout_sort_by_stride(e->ndim, out_strides, perm);
    ampc_ew c = *e;
    for (int k = 0; k < e->ndim; k++) {
        e->shape[k] = c.shape[perm[k]];
        for (int x = 0; x < e->nin; x++)
            e->strides[x][k] = c.strides[x][perm[k]];
    }
}

static PyObject *mod_ew(PyObject *module, PyObject *args, PyObject *kwargs)
{
    /* name may come fifth positionally: every call names its op, and each keyword given costs a
     * lookup of every keyword before it in this list (a new str each, 0.1 us) */
    static char *kwlist[] = {"op", "a", "b", "c", "name", "param", "scale", "dtype", "shape", "names", "param2",
                             NULL};
    ampc_state *st = ampc_state_of(module);
    int op;
    PyObject *objs[3] = {NULL, Py_None, Py_None}, *dtype_obj = Py_None, *shape_obj = Py_None, *result = NULL;
    /* The public op's name and its arguments' names, for the error messages. */
    const char *name = "elementwise", *names[3] = {"input", "other", "scale"};
    PyObject *names_obj = Py_None;
    ampc_ew e = {0};
    e.param = 1.0;
    e.scale = 1.0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iO|OOs$ddOOOd:_ew", kwlist, &op, &objs[0], &objs[1], &objs[2],
                                     &name, &e.param, &e.scale, &dtype_obj, &shape_obj, &names_obj, &e.param2))
        return NULL;
    if (names_obj != Py_None) {
        if (!PyTuple_Check(names_obj) || PyTuple_GET_SIZE(names_obj) > 3) {
            PyErr_SetString(PyExc_TypeError, "_ew: names must be a tuple of at most 3 str");
            return NULL;
        }
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(names_obj); i++)
            if ((names[i] = PyUnicode_AsUTF8(PyTuple_GET_ITEM(names_obj, i))) == NULL)
                return NULL;
    }
    if (op < 0 || op >= AMPC_EW_NUM_OPS) {
        PyErr_Format(PyExc_ValueError, "_ew: unknown op %d", op);
        return NULL;
    }
    e.op = (ampc_ew_op)op;
    const int arity = ampc_ew_arity(e.op);
    e.nin = objs[2] != Py_None ? 3 : arity;
    if (arity == 2 && objs[1] == Py_None) {
        PyErr_Format(PyExc_TypeError, "%s: %s must be an array or a number, got None", name, names[1]);
        return NULL;
    }
    ampc_op_args a;
    ampc_op_args_init(&a, st, name);
    const ampc_view *in[3] = {NULL, NULL, NULL};
    if (ew_operands(&a, &e, objs, names, dtype_obj, in) < 0)
        goto done;
    /* The output's shape: the inputs' shapes broadcast together (and to shape=). */
    int64_t want[AMPC_MAX_NDIM];
    int want_ndim = -1;
    if (shape_obj != Py_None && (want_ndim = ampc_parse_int64s(shape_obj, "_ew: shape", want, 0)) < 0)
        goto done;
    e.ndim = want_ndim > 0 ? want_ndim : 0;
    for (int x = 0; x < e.nin; x++)
        if (in[x] != NULL && in[x]->ndim > e.ndim)
            e.ndim = in[x]->ndim;
    for (int d = 0; d < e.ndim; d++) {
        e.shape[d] = 1;
        const int wd = d - (e.ndim - want_ndim);
        if (want_ndim >= 0 && wd >= 0)
            e.shape[d] = want[wd];
        for (int x = 0; x < e.nin; x++) {
            if (in[x] == NULL)
                continue;
            const int vd = d - (e.ndim - in[x]->ndim);
            if (vd >= 0 && in[x]->shape[vd] != 1) {
                if (e.shape[d] != 1 && e.shape[d] != in[x]->shape[vd]) {
                    PyErr_Format(PyExc_ValueError, "%s: the shapes of the operands do not broadcast "
                                 "(size %lld against %lld at dimension %d)", name, (long long)e.shape[d],
                                 (long long)in[x]->shape[vd], d);
                    goto done;
                }
                e.shape[d] = in[x]->shape[vd];
            }
        }
    }
    if (want_ndim >= 0 && e.ndim != want_ndim) {
        PyErr_Format(PyExc_ValueError, "%s: the operands do not broadcast to shape", name);
        goto done;
    }
    for (int x = 0; x < e.nin; x++) {
        if (in[x] == NULL)
            continue;
        if (ampc_op_broadcast_strides(name, names[x], in[x], e.ndim, e.shape, e.strides[x]) < 0)
            goto done;
        e.in[x] = buf_of(in[x]);
    }
    ampc_view out;
    int64_t out_strides[AMPC_MAX_NDIM];
    const int follow = ew_layout_source(&e, in);
    if (follow >= 0)
        ampc_layout_korder_strides(e.ndim, e.shape, in[follow]->strides, ampc_dtype_size(e.out.dtype), out_strides);
    PyObject *out_obj = ampc_op_output_strided(&a, e.out.dtype, e.ndim, e.shape, follow >= 0 ? out_strides : NULL,
                                               &out);
    if (out_obj == NULL)
        goto done;
    if (follow >= 0)
        ew_in_memory_order(&e, out_strides);
    e.out.data = out.data;
    e.numel = out.numel;
    if (AMPC_RUN_KERNEL(&a, elementwise, &e) < 0)
        goto done;
    result = ampc_op_result(&a, out_obj);
done:
    ampc_op_args_release(&a);
    return result;
}

/* ------------------------------------------------------------------------ */
/* softmax, log_softmax                                                      */
/* ------------------------------------------------------------------------ */

static PyObject *mod_softmax(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"input", "dim", "log", "dtype", "causal", "causal_offset", NULL};
    ampc_state *st = ampc_state_of(module);
    PyObject *x_obj, *dtype_obj = Py_None, *result = NULL;
    long long dim, causal_offset = 0;
    int log, causal = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OLp|O$pL:_softmax", kwlist, &x_obj, &dim, &log, &dtype_obj,
                                     &causal, &causal_offset))
        return NULL;
    const char *name = log ? "log_softmax" : "softmax";
    if (causal_offset < 0 || (causal_offset != 0 && !causal)) {
        PyErr_Format(PyExc_ValueError, "%s: causal_offset must be 0 or more, and comes with causal=True (got %lld)",
                     name, causal_offset);
        return NULL;
    }
    ampc_op_args a;
    ampc_op_args_init(&a, st, name);
    ampc_softmax s = {.log = log};
    int have_dtype;
    ampc_dtype dtype;
    int64_t d;
    ampc_view *x = ampc_op_arg(&a, x_obj, "input", AMPC_ARG_FLOAT);
    if (x == NULL || ampc_op_parse_dtype(&a, dtype_obj, &have_dtype, &dtype) < 0 ||
        ampc_op_normalize_dim(name, dim, x->ndim, &d) < 0 || ampc_op_dense(&a, x) < 0)
        goto done;
    s.rows = ampc_op_rows(x, d);
    if (causal) {
        /* attention's mask over the last two dimensions: query rows, key columns */
        if (x->ndim < 2 || d != x->ndim - 1) {
            PyErr_Format(PyExc_ValueError, "%s: a causal mask needs 2 dimensions or more and the last one as dim", name);
            goto done;
        }
        s.causal = x->shape[x->ndim - 2];
        /* past the row's length every column is live: no larger offset means more (nor overflows) */
        s.causal_offset = causal_offset < s.rows.n ? causal_offset : s.rows.n;
    }
    ampc_view y;
    PyObject *y_obj = ampc_op_output(&a, have_dtype ? dtype : x->dtype, x->ndim, x->shape, &y);
    if (y_obj == NULL)
        goto done;
    s.x = buf_of(x);
    s.y = buf_of(&y);
    if (AMPC_RUN_KERNEL(&a, softmax, &s) < 0)
        goto done;
    result = ampc_op_result(&a, y_obj);
done:
    ampc_op_args_release(&a);
    return result;
}

static PyObject *mod_softmax_backward(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"grad_output", "output", "dim", "log", "dtype", NULL};
    ampc_state *st = ampc_state_of(module);
    PyObject *dy_obj, *y_obj, *dtype_obj = Py_None, *result = NULL;
    long long dim;
    int log;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOLp|O:_softmax_backward", kwlist, &dy_obj, &y_obj, &dim,
                                     &log, &dtype_obj))
        return NULL;
    const char *name = log ? "log_softmax_backward" : "softmax_backward";
    ampc_op_args a;
    ampc_op_args_init(&a, st, name);
    ampc_softmax_backward s = {.log = log};
    int have_dtype;
    ampc_dtype dtype;
    int64_t d;
    ampc_view *dy = ampc_op_arg(&a, dy_obj, "grad_output", AMPC_ARG_FLOAT);
    ampc_view *y = dy ? ampc_op_arg(&a, y_obj, "output", AMPC_ARG_FLOAT) : NULL;
    if (y == NULL || ampc_op_parse_dtype(&a, dtype_obj, &have_dtype, &dtype) < 0 ||
        ampc_op_check_same_shape(name, dy, "grad_output", y, "output") < 0 ||
        ampc_op_normalize_dim(name, dim, y->ndim, &d) < 0 || ampc_op_dense(&a, dy) < 0 || ampc_op_dense(&a, y) < 0)
        goto done;
    s.rows = ampc_op_rows(y, d);
    ampc_view dx;
    PyObject *dx_obj = ampc_op_output(&a, have_dtype ? dtype : y->dtype, y->ndim, y->shape, &dx);
    if (dx_obj == NULL)
        goto done;
    s.dx = buf_of(&dx);
    s.dy = buf_of(dy);
    s.y = buf_of(y);
    if (AMPC_RUN_KERNEL(&a, softmax_backward, &s) < 0)
        goto done;
    result = ampc_op_result(&a, dx_obj);
done:
    ampc_op_args_release(&a);
    return result;
}

/* ------------------------------------------------------------------------ */
/* layer_norm                                                                */
/* ------------------------------------------------------------------------ */

/* The (rows, n) split of x for a layer_norm over its last `nnorm` elements. */
static int layer_norm_split(const char *op, const ampc_view *x, long long nnorm, int64_t *rows, int64_t *n)
{
    if (nnorm < 1 || (x->numel > 0 && x->numel % nnorm != 0) || (x->numel == 0 && nnorm != 1 && x->ndim == 0)) {
        PyErr_Format(PyExc_ValueError, "%s: cannot normalise over %lld elements of an input of %lld", op, nnorm,
                     (long long)x->numel);
        return -1;
    }
    *n = nnorm;
    *rows = x->numel / nnorm;
    return 0;
}

static int check_param(const char *op, const ampc_view *p, const char *name, int64_t n)
{
    if (p == NULL || p->numel == n)
        return 0;
    PyErr_Format(PyExc_ValueError, "%s: %s has %lld elements where %lld were expected", op, name,
                 (long long)p->numel, (long long)n);
    return -1;
}

/* The rows' affine step: layer_norm's (groups 0), a weight and bias per
 * element of a row; or group_norm's, a weight and bias per channel, each
 * row one group of a sample, channels / groups channels of `spatial`
 * elements. The number of weights (n, or channels) in *width. */
static int affine_layout(const char *op, int64_t rows, int64_t n, long long groups, long long channels,
                         int64_t *spatial, int64_t *width)
{
    *spatial = 0;
    *width = n;
    if (groups == 0 && channels == 0)
        return 0;
    if (groups < 1 || channels < 1 || channels % groups != 0 || rows % groups != 0 || n % (channels / groups) != 0) {
        PyErr_Format(PyExc_ValueError, "%s: %lld channels in %lld groups do not divide rows of %lld elements", op,
                     channels, groups, (long long)n);
        return -1;
    }
    *spatial = n / (channels / groups);
    *width = channels;
    return 0;
}

static PyObject *mod_layer_norm(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"input", "n", "weight", "bias", "eps", "dtype", "stats", "groups", "channels", NULL};
    ampc_state *st = ampc_state_of(module);
    PyObject *x_obj, *w_obj = Py_None, *b_obj = Py_None, *dtype_obj = Py_None, *result = NULL;
    long long nnorm, groups = 0, channels = 0;
    double eps = 1e-5;
    int stats = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OL|OOd$OpLL:_layer_norm", kwlist, &x_obj, &nnorm, &w_obj, &b_obj,
                                     &eps, &dtype_obj, &stats, &groups, &channels))
        return NULL;
    const char *name = groups > 0 ? "group_norm" : "layer_norm";
    ampc_op_args a;
    ampc_op_args_init(&a, st, name);
    ampc_layer_norm l = {.eps = eps, .groups = groups};
    ampc_view *x = ampc_op_arg(&a, x_obj, "input", AMPC_ARG_FLOAT);
    ampc_view *w = NULL, *b = NULL;
    int have_dtype;
    ampc_dtype dtype;
    if (x == NULL || ampc_op_parse_dtype(&a, dtype_obj, &have_dtype, &dtype) < 0)
        goto done;
    if (w_obj != Py_None && (w = ampc_op_arg(&a, w_obj, "weight", AMPC_ARG_FLOAT)) == NULL)
        goto done;
    if (b_obj != Py_None && (b = ampc_op_arg(&a, b_obj, "bias", AMPC_ARG_FLOAT)) == NULL)
        goto done;
    int64_t width;
    if (layer_norm_split(name, x, nnorm, &l.rows, &l.n) < 0 ||
        affine_layout(name, l.rows, l.n, groups, channels, &l.spatial, &width) < 0 ||
        check_param(name, w, "weight", width) < 0 || check_param(name, b, "bias", width) < 0 ||
        ampc_op_dense(&a, x) < 0 || (w && ampc_op_dense(&a, w) < 0) || (b && ampc_op_dense(&a, b) < 0))
        goto done;
    /* torch: the output takes the input's dtype (unless asked: group_norm's float32 xhat); mean and rstd the
     * accumulation type. */
    const ampc_dtype acc = ampc_acc_dtype(x->dtype);
    ampc_view y, mean, rstd;
    const int64_t rows = l.rows;
    PyObject *y_obj = ampc_op_output(&a, have_dtype ? dtype : x->dtype, x->ndim, x->shape, &y);
    PyObject *mean_obj = y_obj ? ampc_op_output(&a, acc, 1, &rows, &mean) : NULL;
    PyObject *rstd_obj = mean_obj ? ampc_op_output(&a, acc, 1, &rows, &rstd) : NULL;
    if (rstd_obj == NULL)
        goto done;
    l.y = buf_of(&y);
    l.mean = buf_of(&mean);
    l.rstd = buf_of(&rstd);
    l.x = buf_of(x);
    l.weight = w ? buf_of(w) : (ampc_buf){NULL, AMPC_FLOAT32};
    l.bias = b ? buf_of(b) : (ampc_buf){NULL, AMPC_FLOAT32};
    if (AMPC_RUN_KERNEL(&a, layer_norm, &l) < 0)
        goto done;
    /* Without stats (no backward to come) mean and rstd go back to the pool with the call's other
     * temporaries, unexported: handing each to torch took about as long as a small row's kernel. */
    result = stats ? ampc_op_results(&a, (PyObject *[]){y_obj, mean_obj, rstd_obj}, 3) : ampc_op_result(&a, y_obj);
done:
    ampc_op_args_release(&a);
    return result;
}

static PyObject *mod_layer_norm_backward(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"grad_output", "input", "mean", "rstd", "n", "weight", "weight_grads",
                             "input_grad", "groups", "channels", NULL};
    ampc_state *st = ampc_state_of(module);
    PyObject *dy_obj, *x_obj, *m_obj, *r_obj, *w_obj = Py_None, *result = NULL;
    long long nnorm, groups = 0, channels = 0;
    int weight_grads = 1, input_grad = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOL|Opp$LL:_layer_norm_backward", kwlist, &dy_obj, &x_obj,
                                     &m_obj, &r_obj, &nnorm, &w_obj, &weight_grads, &input_grad, &groups, &channels))
        return NULL;
    const char *name = groups > 0 ? "group_norm_backward" : "layer_norm_backward";
    ampc_op_args a;
    ampc_op_args_init(&a, st, name);
    ampc_layer_norm_backward l = {.groups = groups};
    PyObject *dx_obj = NULL, *dw_obj = NULL, *db_obj = NULL;
    ampc_view *dy = ampc_op_arg(&a, dy_obj, "grad_output", AMPC_ARG_FLOAT);
    ampc_view *x = dy ? ampc_op_arg(&a, x_obj, "input", AMPC_ARG_FLOAT) : NULL;
    ampc_view *mean = x ? ampc_op_arg(&a, m_obj, "mean", AMPC_ARG_FLOAT) : NULL;
    ampc_view *rstd = mean ? ampc_op_arg(&a, r_obj, "rstd", AMPC_ARG_FLOAT) : NULL;
    ampc_view *w = NULL;
    if (rstd == NULL)
        goto done;
    if (w_obj != Py_None && (w = ampc_op_arg(&a, w_obj, "weight", AMPC_ARG_FLOAT)) == NULL)
        goto done;
    int64_t width;
    if (ampc_op_check_same_shape(name, dy, "grad_output", x, "input") < 0 ||
        layer_norm_split(name, x, nnorm, &l.rows, &l.n) < 0 ||
        affine_layout(name, l.rows, l.n, groups, channels, &l.spatial, &width) < 0 ||
        check_param(name, w, "weight", width) < 0)
        goto done;
    const ampc_dtype acc = ampc_acc_dtype(x->dtype);
    if (mean->dtype != acc || rstd->dtype != acc || mean->numel != l.rows || rstd->numel != l.rows) {
        PyErr_Format(PyExc_ValueError, "%s: mean and rstd must be the %lld %s values that layer_norm saved", name,
                     (long long)l.rows, ampc_dtype_names[acc]);
        goto done;
    }
    if (ampc_op_dense(&a, dy) < 0 || ampc_op_dense(&a, x) < 0 || ampc_op_dense(&a, mean) < 0 ||
        ampc_op_dense(&a, rstd) < 0 || (w && ampc_op_dense(&a, w) < 0))
        goto done;
    ampc_view dx = {0}, dw = {0}, db = {0};
    if (input_grad && (dx_obj = ampc_op_output(&a, x->dtype, x->ndim, x->shape, &dx)) == NULL)
        goto done;
    const ampc_dtype wdt = w ? w->dtype : x->dtype;
    if (weight_grads && ((dw_obj = ampc_op_output(&a, wdt, 1, &width, &dw)) == NULL ||
                         (db_obj = ampc_op_output(&a, wdt, 1, &width, &db)) == NULL))
        goto done;
    l.dx = buf_of(&dx);
    l.dweight = buf_of(&dw);
    l.dbias = buf_of(&db);
    l.dy = buf_of(dy);
    l.x = buf_of(x);
    l.mean = buf_of(mean);
    l.rstd = buf_of(rstd);
    l.weight = w ? buf_of(w) : (ampc_buf){NULL, AMPC_FLOAT32};
    if (weight_grads && l.rows == 0) {
        /* no rows: the weight gradients are zeros (a constant 0 copied) */
        ampc_ew zero = {.op = AMPC_EW_COPY, .scale = 1, .ndim = 1, .nin = 1, .numel = width, .shape = {width}};
        for (int k = 0; k < 2; k++) {
            zero.out = k == 0 ? l.dweight : l.dbias;
            if (AMPC_RUN_KERNEL(&a, elementwise, &zero) < 0)
                goto done;
        }
    }
    if (AMPC_RUN_KERNEL(&a, layer_norm_backward, &l) < 0)
        goto done;
    result = ampc_op_results(&a, (PyObject *[]){dx_obj, dw_obj, db_obj}, 3);
done:
    ampc_op_args_release(&a);
    return result;
}

/* ------------------------------------------------------------------------ */
/* _sum: a scaled sum over some dimensions                                    */
/* ------------------------------------------------------------------------ */

/* Sum a dense array over the dimensions marked in `reduce`, as a sequence of
 * reductions of one run of adjacent marked dimensions each, the
 * intermediates in the accumulation dtype. */
static PyObject *mod_sum(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"input", "dims", "keepdim", "scale", "dtype", "name", NULL};
    ampc_state *st = ampc_state_of(module);
    PyObject *x_obj, *dims_obj = Py_None, *dtype_obj = Py_None, *result = NULL;
    int keepdim = 0;
    double scale = 1.0;
    const char *name = "sum"; /* or mean, a sum scaled by 1/count */
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|Opd$Os:_sum", kwlist, &x_obj, &dims_obj, &keepdim, &scale,
                                     &dtype_obj, &name))
        return NULL;
    ampc_op_args a;
    ampc_op_args_init(&a, st, name);
    int have_dtype;
    ampc_dtype dtype;
    char reduce[AMPC_MAX_NDIM] = {0};
    ampc_view *x = ampc_op_arg(&a, x_obj, "input", AMPC_ARG_FLOAT);
    if (x == NULL || ampc_op_parse_dtype(&a, dtype_obj, &have_dtype, &dtype) < 0)
        goto done;
    if (dims_obj == Py_None) {
        for (int d = 0; d < x->ndim; d++)
            reduce[d] = 1;
    }
    else {
        PyObject *seq = PySequence_Fast(dims_obj, "_sum: dims must be a sequence of ints");
        if (seq == NULL)
            goto done;
        for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
            /* held: its __index__ may take it out of the list (the size is read again each time) */
            PyObject *item = Py_NewRef(PySequence_Fast_GET_ITEM(seq, i));
            const long long v = PyLong_AsLongLong(item);
            Py_DECREF(item);
            int64_t d;
            if ((v == -1 && PyErr_Occurred()) || ampc_op_normalize_dim(name, v, x->ndim, &d) < 0) {
                Py_DECREF(seq);
                goto done;
            }
            if (x->ndim > 0 && reduce[d]) {
                PyErr_Format(PyExc_RuntimeError, "%s: dim %lld appears multiple times in the list of dims", name, v);
                Py_DECREF(seq);
                goto done;
            }
            if (x->ndim > 0)
                reduce[d] = 1;
        }
        Py_DECREF(seq);
    }
    if (ampc_op_dense(&a, x) < 0)
        goto done;
    const ampc_dtype out_dtype = have_dtype ? dtype : x->dtype, acc = ampc_acc_dtype(out_dtype);
    /* the output's shape */
    int64_t oshape[AMPC_MAX_NDIM];
    int ondim = 0;
    for (int d = 0; d < x->ndim; d++) {
        if (!reduce[d])
            oshape[ondim++] = x->shape[d];
        else if (keepdim)
            oshape[ondim++] = 1;
    }
    /* Reduce the runs of marked dimensions from the innermost out. */
    int64_t shape[AMPC_MAX_NDIM];
    int ndim = x->ndim;
    for (int d = 0; d < ndim; d++)
        shape[d] = x->shape[d];
    ampc_buf cur = buf_of(x);
    int nruns = 0;
    for (int d = 0; d < ndim; d++)
        if (reduce[d] && (d == 0 || !reduce[d - 1]))
            nruns++;
    PyObject *out_obj = NULL;
    if (nruns == 0) {
        /* nothing to sum: a scaled copy in the output dtype */
        ampc_view out;
        if ((out_obj = ampc_op_output(&a, out_dtype, ondim, oshape, &out)) == NULL)
            goto done;
        ampc_ew e = {.op = AMPC_EW_COPY, .scale = scale, .ndim = 1, .nin = 1, .numel = x->numel,
                     .shape = {x->numel}, .out = buf_of(&out), .in = {cur}, .strides = {{1}}};
        if (AMPC_RUN_KERNEL(&a, elementwise, &e) < 0)
            goto done;
        result = ampc_op_result(&a, out_obj);
        goto done;
    }
    int runs_done = 0;
    for (int hi = ndim - 1; hi >= 0; hi--) {
        if (!reduce[hi])
            continue;
        int lo = hi;
        while (lo > 0 && reduce[lo - 1])
            lo--;
        ampc_reduce r = {.rows = {1, 1, 1}, .scale = 1.0, .x = cur};
        for (int d = 0; d < ndim; d++) {
            if (d < lo)
                r.rows.outer *= shape[d];
            else if (d <= hi)
                r.rows.n *= shape[d];
            else
                r.rows.inner *= shape[d];
        }
        const int last = ++runs_done == nruns;
        ampc_view out;
        PyObject *obj;
        if (last) {
            r.scale = scale;
            obj = out_obj = ampc_op_output(&a, out_dtype, ondim, oshape, &out);
        }
        else {
            const int64_t count = r.rows.outer * r.rows.inner;
            obj = ampc_op_output(&a, acc, 1, &count, &out);
        }
        if (obj == NULL)
            goto done;
        r.out = buf_of(&out);
        if (AMPC_RUN_KERNEL(&a, reduce, &r) < 0)
            goto done;
        /* the reduced run becomes one dimension of size 1 */
        for (int d = lo; d <= hi; d++)
            shape[d] = 1;
        cur = r.out;
        hi = lo;
    }
    result = ampc_op_result(&a, out_obj);
done:
    ampc_op_args_release(&a);
    return result;
}

/* ------------------------------------------------------------------------ */
/* cross_entropy, nll_loss                                                   */
/* ------------------------------------------------------------------------ */

typedef struct {
    ampc_view *logits, *target, *weight;
    ampc_rows rows;
    int probs_target;
} ce_inputs;

/* The checks torch makes: input (N, C, d1, ...) or (C,); target (N, d1, ...)
 * of class indices, or the input's shape of probabilities; weight (C,). On
 * the CPU, every index in [0, C) or ignore_index. */
static int ce_parse(ampc_op_args *a, PyObject *x_obj, PyObject *t_obj, PyObject *w_obj, long long ignore_index,
                    int log_probs, ce_inputs *in)
{
    const char *op = a->op;
    memset(in, 0, sizeof *in);
    if ((in->logits = ampc_op_arg(a, x_obj, "input", AMPC_ARG_FLOAT)) == NULL)
        return -1;
    ampc_view *x = in->logits;
    if (x->ndim < 1) {
        PyErr_Format(PyExc_ValueError, "%s: input must have at least one dimension (the classes)", op);
        return -1;
    }
    if (w_obj != Py_None && (in->weight = ampc_op_arg(a, w_obj, "weight", AMPC_ARG_FLOAT)) == NULL)
        return -1;
    /* probabilities if the target is floating */
    ampc_view probe;
    char label[96];
    snprintf(label, sizeof label, "%s: target", op);
    if (ampc_view_from_object(a->st, t_obj, label, AMPC_FOR_READING, &probe) < 0)
        return -1;
    in->probs_target = AMPC_DTYPE_IS_FLOAT(probe.dtype);
    ampc_view_release(&probe);
    if (in->probs_target && log_probs) {
        PyErr_Format(PyExc_TypeError, "%s: target must hold class indices (an integer array), got a floating array", op);
        return -1;
    }
    if ((in->target = ampc_op_arg(a, t_obj, "target", in->probs_target ? AMPC_ARG_FLOAT : AMPC_ARG_INDEX)) == NULL)
        return -1;
    ampc_view *t = in->target;
    const int class_dim = x->ndim == 1 ? 0 : 1;
    in->rows = ampc_op_rows(x, class_dim);
    const int64_t classes = in->rows.n;
    char sx[256], st_[256];
    ampc_shape_str(x, sx, sizeof sx);
    ampc_shape_str(t, st_, sizeof st_);
    if (in->probs_target) {
        if (t->ndim == x->ndim - 1) {  /* labels with a floating dtype, as torch refuses them */
            PyErr_Format(PyExc_TypeError, "%s: target of shape %s has a floating dtype (%s): class indices must be "
                         "an integer array, and class probabilities need input's shape %s", op, st_,
                         ampc_dtype_names[t->dtype], sx);
            return -1;
        }
        if (ampc_op_check_same_shape(op, x, "input", t, "target") < 0)
            return -1;
    }
    else {
        int ok = t->ndim == x->ndim - 1;
        for (int d = 0, dx = 0; ok && d < t->ndim; d++, dx++) {
            if (dx == class_dim)
                dx++;
            ok = t->shape[d] == x->shape[dx];
        }
        if (!ok) {
            PyErr_Format(PyExc_ValueError, "%s: Expected target of shape %s without the class dimension of input "
                         "%s, got %s", op, sx, sx, st_);
            return -1;
        }
    }
    if (in->weight != NULL && (in->weight->ndim != 1 || in->weight->shape[0] != classes)) {
        PyErr_Format(PyExc_ValueError, "%s: weight must have one value per class (%lld), got %lld", op,
                     (long long)classes, (long long)in->weight->numel);
        return -1;
    }
    if (ampc_op_dense(a, x) < 0 || ampc_op_dense(a, t) < 0 || (in->weight && ampc_op_dense(a, in->weight) < 0))
        return -1;
    if (!in->probs_target && t->device.type == AMPC_DEVICE_CPU) {
        const ampc_buf tb = buf_of(t);
        for (int64_t i = 0; i < t->numel; i++) {
            const int64_t k = ampc_index_at(&tb, i);  /* an index dtype: ampc_op_arg checked */
            if (k != ignore_index && (k < 0 || k >= classes)) {
                PyErr_Format(PyExc_ValueError, "%s: target %lld is out of bounds: the input has %lld classes "
                             "(target[%lld] in the flattened target)", op, (long long)k, (long long)classes,
                             (long long)i);
                return -1;
            }
        }
    }
    return 0;
}

static int parse_reduction(const char *op, const char *s, int *out)
{
    if (strcmp(s, "none") == 0)
        *out = 0;
    else if (strcmp(s, "mean") == 0)
        *out = 1;
    else if (strcmp(s, "sum") == 0)
        *out = 2;
    else {
        PyErr_Format(PyExc_ValueError, "%s: %s is not a valid value for reduction", op, s);
        return -1;
    }
    return 0;
}

static PyObject *mod_cross_entropy(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"input", "target", "weight", "ignore_index", "label_smoothing", "reduction",
                             "log_probs", "stats", NULL};
    ampc_state *st = ampc_state_of(module);
    PyObject *x_obj, *t_obj, *w_obj = Py_None, *result = NULL;
    long long ignore_index = -100;
    double smoothing = 0.0;
    const char *reduction_s = "mean";
    int log_probs = 0, stats = 1, reduction;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|OLdspp:_cross_entropy", kwlist, &x_obj, &t_obj, &w_obj,
                                     &ignore_index, &smoothing, &reduction_s, &log_probs, &stats))
        return NULL;
    const char *name = log_probs ? "nll_loss" : "cross_entropy";
    ampc_op_args a;
    ampc_op_args_init(&a, st, name);
    ce_inputs in;
    if (parse_reduction(name, reduction_s, &reduction) < 0)
        goto done;
    if (smoothing < 0.0 || smoothing > 1.0) {
        PyObject *v = PyFloat_FromDouble(smoothing);
        if (v != NULL)
            PyErr_Format(PyExc_ValueError, "%s: label_smoothing must be between 0.0 and 1.0. Got: %R", name, v);
        Py_XDECREF(v);
        goto done;
    }
    if (ce_parse(&a, x_obj, t_obj, w_obj, ignore_index, log_probs, &in) < 0)
        goto done;
    const ampc_view *x = in.logits;
    const ampc_dtype acc = ampc_acc_dtype(x->dtype);
    const int64_t positions = in.rows.outer * in.rows.inner, one = 1;
    /* the loss: the target's shape without reduction (positions for probabilities) */
    int64_t lshape[AMPC_MAX_NDIM];
    int lndim = 0;
    for (int d = 0; d < x->ndim; d++)
        if (d != (x->ndim == 1 ? 0 : 1))
            lshape[lndim++] = x->shape[d];
    ampc_view loss, lse, denom;
    PyObject *loss_obj = reduction == 0 ? ampc_op_output(&a, x->dtype, lndim, lshape, &loss)
                                        : ampc_op_output(&a, x->dtype, 0, NULL, &loss);
    PyObject *lse_obj = loss_obj ? ampc_op_output(&a, acc, 1, &positions, &lse) : NULL;
    PyObject *denom_obj = lse_obj ? ampc_op_output(&a, acc, 1, &one, &denom) : NULL;
    if (denom_obj == NULL)
        goto done;
    ampc_cross_entropy c = {
        .rows = in.rows, .log_probs = log_probs, .probs_target = in.probs_target, .reduction = reduction,
        .ignore_index = ignore_index, .smoothing = smoothing, .loss = buf_of(&loss), .lse = buf_of(&lse),
        .denom = buf_of(&denom), .logits = buf_of(x), .target = buf_of(in.target),
        .weight = in.weight ? buf_of(in.weight) : (ampc_buf){NULL, AMPC_FLOAT32},
    };
    if (AMPC_RUN_KERNEL(&a, cross_entropy, &c) < 0)
        goto done;
    /* without stats (no backward to come) lse and denom go back to the pool unexported, as
     * layer_norm's mean and rstd */
    result = stats ? ampc_op_results(&a, (PyObject *[]){loss_obj, lse_obj, denom_obj}, 3)
                   : ampc_op_result(&a, loss_obj);
done:
    ampc_op_args_release(&a);
    return result;
}

static PyObject *mod_cross_entropy_backward(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"grad_output", "input", "target", "lse", "denom", "weight", "ignore_index",
                             "label_smoothing", "reduction", "log_probs", NULL};
    ampc_state *st = ampc_state_of(module);
    PyObject *dl_obj, *x_obj, *t_obj, *lse_obj, *denom_obj, *w_obj = Py_None, *result = NULL;
    long long ignore_index = -100;
    double smoothing = 0.0;
    const char *reduction_s = "mean";
    int log_probs = 0, reduction;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOO|OLdsp:_cross_entropy_backward", kwlist, &dl_obj, &x_obj,
                                     &t_obj, &lse_obj, &denom_obj, &w_obj, &ignore_index, &smoothing, &reduction_s,
                                     &log_probs))
        return NULL;
    const char *name = log_probs ? "nll_loss_backward" : "cross_entropy_backward";
    ampc_op_args a;
    ampc_op_args_init(&a, st, name);
    ce_inputs in;
    if (parse_reduction(name, reduction_s, &reduction) < 0 ||
        ce_parse(&a, x_obj, t_obj, w_obj, ignore_index, log_probs, &in) < 0)
        goto done;
    const ampc_view *x = in.logits;
    const ampc_dtype acc = ampc_acc_dtype(x->dtype);
    const int64_t positions = in.rows.outer * in.rows.inner;
    ampc_view *dl = ampc_op_arg(&a, dl_obj, "grad_output", AMPC_ARG_FLOAT);
    ampc_view *lse = dl ? ampc_op_arg(&a, lse_obj, "lse", AMPC_ARG_FLOAT) : NULL;
    ampc_view *denom = lse ? ampc_op_arg(&a, denom_obj, "denom", AMPC_ARG_FLOAT) : NULL;
    if (denom == NULL)
        goto done;
    if (lse->dtype != acc || lse->numel != positions || denom->dtype != acc || denom->numel != 1) {
        PyErr_Format(PyExc_ValueError, "%s: lse and denom must be what the forward saved", name);
        goto done;
    }
    if (dl->numel != (reduction == 0 ? positions : 1)) {
        PyErr_Format(PyExc_ValueError, "%s: grad_output has %lld elements, expected %lld", name,
                     (long long)dl->numel, (long long)(reduction == 0 ? positions : 1));
        goto done;
    }
    if (ampc_op_dense(&a, dl) < 0 || ampc_op_dense(&a, lse) < 0)
        goto done;
    ampc_view dx;
    PyObject *dx_obj = ampc_op_output(&a, x->dtype, x->ndim, x->shape, &dx);
    if (dx_obj == NULL)
        goto done;
    ampc_cross_entropy_backward c = {
        .rows = in.rows, .log_probs = log_probs, .probs_target = in.probs_target, .reduction = reduction,
        .ignore_index = ignore_index, .smoothing = smoothing, .dlogits = buf_of(&dx), .dloss = buf_of(dl),
        .lse = buf_of(lse), .denom = buf_of(denom), .logits = buf_of(x), .target = buf_of(in.target),
        .weight = in.weight ? buf_of(in.weight) : (ampc_buf){NULL, AMPC_FLOAT32},
    };
    if (AMPC_RUN_KERNEL(&a, cross_entropy_backward, &c) < 0)
        goto done;
    result = ampc_op_result(&a, dx_obj);
done:
    ampc_op_args_release(&a);
    return result;
}

/* ------------------------------------------------------------------------ */

static PyObject *mod_ew_ops(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(args))
{
    static const char *const names[] = {
#define AMPC_EW_OP(ENUM, name, arity, flags) name,
#include "kernels/ew_ops.def"
    };
    _Static_assert(sizeof names / sizeof *names == AMPC_EW_NUM_OPS, "a name for each elementwise op");
    PyObject *d = PyDict_New();
    for (int i = 0; d != NULL && i < AMPC_EW_NUM_OPS; i++) {
        PyObject *v = PyLong_FromLong(i);
        if (v == NULL || PyDict_SetItemString(d, names[i], v) < 0)
            Py_CLEAR(d);
        Py_XDECREF(v);
    }
    return d;
}

PyMethodDef ampc_ops_methods[] = {
    {"_ew_ops", mod_ew_ops, METH_NOARGS, "The elementwise op codes of _ew, by name."},
    {"_ew", (PyCFunction)(void (*)(void))mod_ew, METH_VARARGS | METH_KEYWORDS,
     "_ew(op, a, b=None, c=None, name='elementwise', *, param=1.0, scale=1.0, dtype=None, shape=None, names=None, "
     "param2=0.0): f(a, b; param, param2) * c * scale, broadcast; errors name the op `name` and the operands `names`."},
    {"_softmax", (PyCFunction)(void (*)(void))mod_softmax, METH_VARARGS | METH_KEYWORDS,
     "_softmax(input, dim, log, dtype=None, *, causal=False, causal_offset=0): causal masks the last two dimensions "
     "as attention's is_causal does (query row i takes key columns 0..i + causal_offset: a band of queries that "
     "starts causal_offset queries in)."},
    {"_softmax_backward", (PyCFunction)(void (*)(void))mod_softmax_backward, METH_VARARGS | METH_KEYWORDS,
     "_softmax_backward(grad_output, output, dim, log, dtype=None)"},
    {"_layer_norm", (PyCFunction)(void (*)(void))mod_layer_norm, METH_VARARGS | METH_KEYWORDS,
     "_layer_norm(input, n, weight=None, bias=None, eps=1e-5, *, dtype=None, stats=True) -> (output, mean, "
     "rstd), or output alone without stats"},
    {"_layer_norm_backward", (PyCFunction)(void (*)(void))mod_layer_norm_backward, METH_VARARGS | METH_KEYWORDS,
     "_layer_norm_backward(grad_output, input, mean, rstd, n, weight=None, weight_grads=True, input_grad=True) "
     "-> (grad_input, grad_weight, grad_bias)"},
    {"_sum", (PyCFunction)(void (*)(void))mod_sum, METH_VARARGS | METH_KEYWORDS,
     "_sum(input, dims=None, keepdim=False, scale=1.0, *, dtype=None, name='sum')"},
    {"_cross_entropy", (PyCFunction)(void (*)(void))mod_cross_entropy, METH_VARARGS | METH_KEYWORDS,
     "_cross_entropy(input, target, weight=None, ignore_index=-100, label_smoothing=0.0, reduction='mean', "
     "log_probs=False, stats=True) -> (loss, lse, denom), or the loss alone without stats"},
    {"_cross_entropy_backward", (PyCFunction)(void (*)(void))mod_cross_entropy_backward,
     METH_VARARGS | METH_KEYWORDS,
     "_cross_entropy_backward(grad_output, input, target, lse, denom, weight=None, ignore_index=-100, "
     "label_smoothing=0.0, reduction='mean', log_probs=False)"},
    {NULL, NULL, 0, NULL},
};
