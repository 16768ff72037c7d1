/*
 * optim.c: the Python entry points of ampc.optim's fused steps, and the
 * small array helpers ampc.optim uses (zeros_like, zero_, _scalar_like, _item).
 *
 *   _sgd_step(params, grads, momentum_buffers, firsts, *, lr, momentum, dampening,
 *             weight_decay, nesterov, maximize, grad_scale=None, found_inf=None)
 *   _adam_step(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, *, lr, beta1,
 *              beta2, eps, weight_decay, amsgrad, maximize, decoupled, grad_scale=None,
 *              found_inf=None)
 *
 * Every array is read and checked first (one device, float dtype, the
 * parameter's shape, dtype and layout, dense, writable where written);
 * then one multi-tensor pass runs on the CPU or the GPU. grad_scale,
 * found_inf, Adam's steps and SGD's firsts (see optim_descriptors.h: None once a buffer
 * is known to hold a momentum) are one-element float32 arrays on that
 * device, read by the kernel itself, so a GPU step never waits for the
 * host. Returns True if the step ran and False if found_inf skipped it on
 * the CPU; None on a GPU, where the host does not know yet. dry_run=True
 * only reads and checks (ampc.optim checks every group before stepping any).
 */
#include "ampc.h"

#include <math.h>
#include <string.h>
#include "kernels/optim_descriptors.h"

/* Everything one step reads, checked, and the refs the kernels take. */
typedef struct {
    ampc_view *views;       /* n * per: column 0 the parameters, 1 the gradients, then the state */
    ampc_view *step_views;  /* n: Adam's step counts, SGD's first-step flags (entries may be empty) */
    int64_t n;
    int per;
    ampc_optim_ref *refs;
    ampc_device device;
    ampc_view gs_view, fi_view;
    const float *grad_scale, *found_inf;  /* addresses on the step's device, or NULL */
} step_args;

static void args_release(step_args *a)
{
    for (int64_t i = 0; a->views && i < a->n * a->per; i++)
        ampc_view_release(&a->views[i]);
    for (int64_t i = 0; a->step_views && i < a->n; i++)
        ampc_view_release(&a->step_views[i]);
    PyMem_Free(a->views);
    PyMem_Free(a->step_views);
    PyMem_Free(a->refs);
    ampc_view_release(&a->gs_view);
    ampc_view_release(&a->fi_view);
}

/* Whether a view's elements fill one contiguous run (in any dimension
 * order), and where that run starts: its lowest address. */
static int is_dense(const ampc_view *v, char **start)
{
    if (v->numel == 0) {
        *start = v->data;
        return 1;
    }
    ampc_loop loop;
    char *data[1] = {v->data};
    const int64_t *strides[1] = {v->strides};
    ampc_loop_init(&loop, 1, v->ndim, v->shape, data, strides);
    *start = loop.data[0];
    return loop.ndim == 0 || (loop.ndim == 1 && loop.strides[0][0] == ampc_dtype_size(v->dtype));
}

static char *dense_start(const ampc_view *v)
{
    char *start;
    return is_dense(v, &start) ? start : NULL;
}

static int same_device(ampc_device a, ampc_device b) { return a.type == b.type && a.index == b.index; }

static int same_layout(const ampc_view *a, const ampc_view *b)
{
    if (a->ndim != b->ndim || !same_device(a->device, b->device))
        return 0;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d] || (a->shape[d] > 1 && a->strides[d] != b->strides[d]))
            return 0;
    return 1;
}

/* The float32 at a view's address, on any device (a GPU's is copied on the
 * current stream, which the host then waits for). */
static int read_float(ampc_state *st, const ampc_view *v, float *out)
{
    const ampc_device host = {AMPC_DEVICE_CPU, 0};
    return ampc_copy_bytes(st, host, out, v->device, v->data, sizeof *out, ampc_current_stream(v->device.index, NULL),
                           "reading a scalar");
}

/* A one-element float32 array on the step's device (a GradScaler's
 * grad_scale or found_inf, a step count), or None when optional. A scale or
 * flag on another device (a scaler on the GPU stepping CPU parameters, as
 * torch's fused optimizers allow) is copied over, which waits for it. */
static int read_scalar(ampc_state *st, PyObject *obj, const char *name, ampc_device device, int writable,
                       ampc_view *v, float **addr)
{
    *addr = NULL;
    if (obj == Py_None)
        return 0;
    if (ampc_view_from_object(st, obj, name, writable ? AMPC_FOR_WRITING : AMPC_FOR_READING, v) < 0)
        return -1;
    const int elsewhere = !same_device(v->device, device);
    if (v->numel != 1 || v->dtype != AMPC_FLOAT32 || (writable && (v->readonly || elsewhere))) {
        char dev[32];
        PyErr_Format(PyExc_ValueError, "%s must be a one-element%s float32 array on %s", name,
                     writable ? " writable" : "", ampc_device_str(device, dev, sizeof dev));
        return -1;
    }
    if (elsewhere) {
        float value;
        ampc_view here;
        if (read_float(st, v, &value) < 0)
            return -1;
        PyObject *copy = ampc_array_empty(st, device, AMPC_FLOAT32, 0, NULL, NULL, &here);
        if (copy == NULL)
            return -1;
        const ampc_device host = {AMPC_DEVICE_CPU, 0};
        ampc_view_release(v);
        const int rc = ampc_copy_bytes(st, device, here.data, host, &value, sizeof value,
                                       ampc_current_stream(device.index, NULL), "copying a scalar") == 0
                           ? ampc_view_from_object(st, copy, name, AMPC_FOR_READING, v)
                           : -1;
        Py_DECREF(copy);
        if (rc < 0)
            return -1;
    }
    *addr = (float *)v->data;
    return 0;
}

/* One array of the step: lists[k][i] into a->views[i * per + k]. Errors
 * name it list_name[i] (formatted only then: this runs for every array of
 * every step). */
static int read_array(ampc_state *st, PyObject *list, const char *list_name, Py_ssize_t i, int k, int writable,
                      step_args *a)
{
    PyObject *item = PySequence_GetItem(list, i);
    if (item == NULL)
        return -1;
    ampc_view *v = &a->views[i * a->per + k];
    const int rc = ampc_view_from_object(st, item, list_name, writable ? AMPC_FOR_WRITING : AMPC_FOR_READING, v);
    Py_DECREF(item);
    if (rc < 0) {
        char name[64];
        snprintf(name, sizeof name, "%s[%zd]", list_name, i);
        ampc_rename_error(list_name, name);
        return -1;
    }
    const ampc_view *p = &a->views[i * a->per];
    char *start;
    if (!AMPC_DTYPE_IS_FLOAT(v->dtype)) {
        PyErr_Format(PyExc_TypeError, "%s[%zd] has dtype %s; ampc.optim updates floating arrays", list_name, i,
                     ampc_dtype_names[v->dtype]);
        return -1;
    }
    if (writable && v->readonly) {
        PyErr_Format(PyExc_ValueError, "%s[%zd] is read-only", list_name, i);
        return -1;
    }
    if (k > 0 && v->dtype != p->dtype) {
        PyErr_Format(PyExc_TypeError, "%s[%zd] has dtype %s but its parameter has %s", list_name, i,
                     ampc_dtype_names[v->dtype], ampc_dtype_names[p->dtype]);
        return -1;
    }
    if (k > 0 && !same_layout(v, p)) {
        PyErr_Format(PyExc_ValueError, "%s[%zd] must have its parameter's shape, device and strides", list_name, i);
        return -1;
    }
    if (!is_dense(v, &start)) {
        PyErr_Format(PyExc_ValueError, "%s[%zd] is not dense (ampc.optim steps contiguous arrays, in any "
                     "dimension order)", list_name, i);
        return -1;
    }
    if (k == 0) {
        if (i == 0)
            a->device = v->device;
        else if (!same_device(v->device, a->device)) {
            PyErr_SetString(PyExc_ValueError, "ampc.optim: all parameters of one step must be on one device");
            return -1;
        }
    }
    return 0;
}

/* A byte range of one array of the step. */
typedef struct {
    uintptr_t lo, hi;
    int written;
} span;

/* Sort spans by start: a bottom-up merge sort through `tmp` (qsort's calls
 * through a function pointer cost as much as reading the arrays). Returns
 * whichever buffer holds the result. */
static span *sort_spans(span *a, span *tmp, size_t n)
{
    for (size_t width = 1; width < n; width *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * width) {
            const size_t mid = lo + width < n ? lo + width : n, hi = lo + 2 * width < n ? lo + 2 * width : n;
            size_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi)
                tmp[k++] = a[j].lo < a[i].lo ? a[j++] : a[i++];
            while (i < mid)
                tmp[k++] = a[i++];
            while (j < hi)
                tmp[k++] = a[j++];
        }
        span *t = a;
        a = tmp;
        tmp = t;
    }
    return a;
}

static void add_span(span *spans, size_t *count, const char *start, const ampc_view *v, int written)
{
    const size_t nbytes = (size_t)v->numel * (size_t)ampc_dtype_size(v->dtype);
    if (nbytes == 0)
        return;
    spans[*count].lo = (uintptr_t)start;
    spans[*count].hi = (uintptr_t)start + nbytes;
    spans[(*count)++].written = written;
}

/* No array that the step writes may share memory with another array of the
 * step (the kernels read and write each element once, and the CPU loops
 * rely on it: restrict); gradients that are only read may share. */
static int check_no_overlap(const step_args *a, PyObject *const *lists, int grads_written)
{
    const size_t most = (size_t)a->n * (size_t)(a->per + 1) + 2;
    span *buffer = PyMem_Malloc(2 * most * sizeof *buffer), *spans = buffer;
    if (buffer == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    size_t count = 0;
    for (int64_t i = 0; i < a->n; i++) {
        const ampc_optim_ref *r = &a->refs[i];
        const ampc_view *v = &a->views[i * a->per];
        add_span(spans, &count, r->param, &v[0], 1);
        add_span(spans, &count, r->grad, &v[1], grads_written);
        for (int k = 2; k < a->per; k++)
            if (lists[k] != Py_None)
                add_span(spans, &count, r->state[k - 2], &v[k], 1);
        if (r->step != NULL)
            add_span(spans, &count, (char *)r->step, &a->step_views[i], 1);
    }
    if (a->grad_scale)
        add_span(spans, &count, (const char *)a->grad_scale, &a->gs_view, 0);
    if (a->found_inf)
        add_span(spans, &count, (const char *)a->found_inf, &a->fi_view, 0);
    spans = sort_spans(spans, buffer + most, count);
    /* Sweep in address order: a range overlaps an earlier one if it starts
     * before the furthest end seen (of any range when it is written, of the
     * written ones when it is only read). */
    uintptr_t end_any = 0, end_written = 0;
    int shared = 0;
    for (size_t s = 0; s < count && !shared; s++) {
        shared = spans[s].lo < (spans[s].written ? end_any : end_written);
        if (spans[s].hi > end_any)
            end_any = spans[s].hi;
        if (spans[s].written && spans[s].hi > end_written)
            end_written = spans[s].hi;
    }
    PyMem_Free(buffer);
    if (shared) {
        PyErr_SetString(PyExc_ValueError, "ampc.optim: arrays of one step share memory (each parameter, gradient "
                        "and state array must be its own)");
        return -1;
    }
    return 0;
}

/* Parameter i's arrays and step scalar, and its ref for the kernels. */
static int read_parameter(ampc_state *st, PyObject *const *lists, const char *const *names, PyObject *steps,
                          int steps_optional, int grads_written, Py_ssize_t i, step_args *a)
{
    const int per = a->per;
    for (int k = 0; k < per; k++)
        if (lists[k] != Py_None && read_array(st, lists[k], names[k], i, k, k != 1 || grads_written, a) < 0)
            return -1;
    PyObject *s = PySequence_GetItem(steps, i);
    if (s == NULL)
        return -1;
    int rc = read_scalar(st, s, "steps", a->device, 1, &a->step_views[i], &a->refs[i].step);
    if (rc == 0 && s == Py_None && !steps_optional) {
        PyErr_SetString(PyExc_TypeError, "steps must be an array, not None");
        rc = -1;
    }
    Py_DECREF(s);
    if (rc < 0) {
        char name[32];
        snprintf(name, sizeof name, "steps[%zd]", i);
        ampc_rename_error("steps", name);
        return -1;
    }
    ampc_optim_ref *r = &a->refs[i];
    const ampc_view *v = &a->views[i * per];
    r->param = dense_start(&v[0]);
    r->grad = dense_start(&v[1]);
    for (int k = 2; k < per; k++)
        r->state[k - 2] = lists[k] != Py_None ? dense_start(&v[k]) : NULL;
    r->numel = v[0].numel;
    r->dtype = v[0].dtype;
    return 0;
}

/* Read and check every array of a step before anything is written: lists[k]
 * (NULL-free; Py_None for a column left out, as max_exp_avg_sqs without
 * amsgrad), the per-parameter step scalars (None entries allowed where
 * steps_optional), grad_scale and found_inf. The gradients are written too
 * when grad_scale is given (they get the unscaled values). */
static int read_step(ampc_state *st, PyObject *const *lists, const char *const *names, int per, PyObject *steps,
                     int steps_optional, PyObject *gs_obj, PyObject *fi_obj, step_args *a)
{
    memset(a, 0, sizeof *a);
    a->per = per;
    const Py_ssize_t n = PySequence_Size(lists[0]);
    if (n < 0)
        return -1;
    for (int k = 0; k <= per; k++) {
        PyObject *list = k < per ? lists[k] : steps;
        const Py_ssize_t len = list == Py_None ? n : PySequence_Size(list);
        if (len < 0)
            return -1;
        if (len != n) {
            PyErr_Format(PyExc_ValueError, "%s has %zd entries but params has %zd", k < per ? names[k] : "steps",
                         len, n);
            return -1;
        }
    }
    const size_t count = (size_t)(n > 0 ? n : 1);
    a->views = PyMem_Calloc(count * (size_t)per, sizeof *a->views);
    a->step_views = PyMem_Calloc(count, sizeof *a->step_views);
    a->refs = PyMem_Calloc(count, sizeof *a->refs);
    if (a->views == NULL || a->step_views == NULL || a->refs == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    const int grads_written = gs_obj != Py_None;
    /* A producer's current stream is asked once per device for the whole
     * step, as for a GradScaler's gradient list (grads.c). */
    st->stream_cache_on = 1;
    st->stream_cache_thread = PyThread_get_thread_ident();
    st->stream_cache_api = NULL;
    int rc = 0;
    for (Py_ssize_t i = 0; i < n && rc == 0; i++) {
        a->n = i + 1;  /* views up to here are released with the arguments */
        rc = read_parameter(st, lists, names, steps, steps_optional, grads_written, i, a);
    }
    st->stream_cache_on = 0;
    if (rc < 0)
        return -1;
    a->n = n;
    float *gs, *fi;
    if (read_scalar(st, gs_obj, "grad_scale", a->device, 0, &a->gs_view, &gs) < 0 ||
        read_scalar(st, fi_obj, "found_inf", a->device, 0, &a->fi_view, &fi) < 0)
        return -1;
    a->grad_scale = gs;
    a->found_inf = fi;
    return check_no_overlap(a, lists, grads_written);
}

/* A GPU step's kernels run on ampc's stream, after the streams its arrays
 * were produced on (before) and ahead of their next work there (after). */
static int order_step(ampc_state *st, const step_args *a, void *stream, int before)
{
    ampc_streams_seen seen = {0};
    const int device = a->device.index;
    for (int64_t i = 0; i < a->n * a->per; i++)
        if (a->views[i].owner != NULL && ampc_order_stream(st, device, stream, a->views[i].stream, before, &seen) < 0)
            return -1;
    for (int64_t i = 0; i < a->n; i++)
        if (a->step_views[i].owner != NULL &&
            ampc_order_stream(st, device, stream, a->step_views[i].stream, before, &seen) < 0)
            return -1;
    const ampc_view *scalars[2] = {&a->gs_view, &a->fi_view};
    for (int k = 0; k < 2; k++)
        if (scalars[k]->owner != NULL && ampc_order_stream(st, device, stream, scalars[k]->stream, before, &seen) < 0)
            return -1;
    return 0;
}

/* Run a checked step: SGD when sgd is given, else Adam(W). dry_run: only
 * the checks, already done. */
static PyObject *run_step(ampc_state *st, const step_args *a, int dry_run, const ampc_sgd_config *sgd,
                          const ampc_adam_config *adam)
{
    if (dry_run)
        Py_RETURN_NONE;
    const ampc_backend *b = ampc_backend_of(st, a->device);
    const int device = a->device.index;
    const int has_streams = b->stream_wait != NULL;
    void *stream = has_streams ? ampc_current_stream(device, NULL) : NULL;
    if (has_streams && order_step(st, a, stream, 1) < 0)
        return NULL;
    int ran, status;
    PyThreadState *released = b->runs_without_gil ? PyEval_SaveThread() : NULL;
    status = sgd ? b->sgd(device, stream, a->refs, a->n, sgd, a->grad_scale, a->found_inf, &ran)
                 : b->adam(device, stream, a->refs, a->n, adam, a->grad_scale, a->found_inf, &ran);
    if (released != NULL)
        PyEval_RestoreThread(released);
    if (status != AMPC_OK)
        return ampc_backend_raise(st, a->device, status, sgd ? "SGD step" : "Adam step"), NULL;
    if (has_streams && order_step(st, a, stream, 0) < 0)
        return NULL;
    /* True if the step ran, False if found_inf skipped it; None where the
     * host does not wait to know (a GPU). */
    if (ran < 0)
        Py_RETURN_NONE;
    return PyBool_FromLong(ran);
}

static PyObject *mod_sgd_step(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"params", "grads", "momentum_buffers", "firsts", "lr", "momentum", "dampening",
                             "weight_decay", "nesterov", "maximize", "grad_scale", "found_inf", "dry_run", NULL};
    ampc_state *st = ampc_state_of(module);
    PyObject *params, *grads, *bufs, *firsts, *gs_obj = Py_None, *fi_obj = Py_None;
    ampc_sgd_config c = {.lr = -1};
    int dry_run = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOO|$ddddppOOp:_sgd_step", kwlist, &params, &grads, &bufs,
                                     &firsts, &c.lr, &c.momentum, &c.dampening, &c.weight_decay, &c.nesterov,
                                     &c.maximize, &gs_obj, &fi_obj, &dry_run))
        return NULL;
    if (c.lr < 0) {
        PyErr_SetString(PyExc_TypeError, "_sgd_step: lr= (and the other hyperparameters) must be given");
        return NULL;
    }
    PyObject *lists[3] = {params, grads, c.momentum != 0 ? bufs : Py_None};
    static const char *const names[3] = {"params", "grads", "momentum_buffers"};
    step_args a;
    PyObject *result = NULL;
    if (read_step(st, lists, names, 3, firsts, 1, gs_obj, fi_obj, &a) == 0)
        result = run_step(st, &a, dry_run, &c, NULL);
    args_release(&a);
    return result;
}

static PyObject *mod_adam_step(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"params", "grads", "exp_avgs", "exp_avg_sqs", "max_exp_avg_sqs", "steps", "lr",
                             "beta1", "beta2", "eps", "weight_decay", "amsgrad", "maximize", "decoupled",
                             "grad_scale", "found_inf", "dry_run", NULL};
    ampc_state *st = ampc_state_of(module);
    PyObject *params, *grads, *m, *v, *vmax, *steps, *gs_obj = Py_None, *fi_obj = Py_None;
    ampc_adam_config c = {.lr = -1};
    int dry_run = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOO|$dddddpppOOp:_adam_step", kwlist, &params, &grads, &m,
                                     &v, &vmax, &steps, &c.lr, &c.beta1, &c.beta2, &c.eps, &c.weight_decay,
                                     &c.amsgrad, &c.maximize, &c.decoupled, &gs_obj, &fi_obj, &dry_run))
        return NULL;
    if (c.lr < 0) {
        PyErr_SetString(PyExc_TypeError, "_adam_step: lr= (and the other hyperparameters) must be given");
        return NULL;
    }
    PyObject *lists[5] = {params, grads, m, v, c.amsgrad ? vmax : Py_None};
    static const char *const names[5] = {"params", "grads", "exp_avgs", "exp_avg_sqs", "max_exp_avg_sqs"};
    step_args a;
    PyObject *result = NULL;
    if (read_step(st, lists, names, 5, steps, 0, gs_obj, fi_obj, &a) == 0)
        result = run_step(st, &a, dry_run, NULL, &c);
    args_release(&a);
    return result;
}

/* ------------------------------------------------------------------------ */
/* zeros_like, zero_                                                         */
/* ------------------------------------------------------------------------ */

static int zero_view(ampc_state *st, const ampc_view *v)
{
    char *start;
    if (!is_dense(v, &start)) {
        PyErr_SetString(PyExc_ValueError, "zero_: the array is not dense");
        return -1;
    }
    const size_t nbytes = (size_t)(v->numel * ampc_dtype_size(v->dtype));
    if (nbytes == 0)
        return 0;
    if (v->device.type == AMPC_DEVICE_CPU) {
        memset(start, 0, nbytes);
        return 0;
    }
    const int device = v->device.index;
    void *stream = ampc_current_stream(device, NULL);
    ampc_streams_seen before = {0}, after = {0};
    if (ampc_order_stream(st, device, stream, v->stream, 1, &before) < 0)
        return -1;
    const int status = ampc_backend_of(st, v->device)->memset(device, start, 0, nbytes, stream);
    if (status != AMPC_OK)
        return ampc_backend_raise(st, v->device, status, "zero_");
    return ampc_order_stream(st, device, stream, v->stream, 0, &after);
}

static PyObject *mod_zeros_like(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"x", "dtype", "shape", NULL};
    ampc_state *st = ampc_state_of(module);
    PyObject *x, *dtype_obj = Py_None, *shape_obj = Py_None, *fresh = NULL, *result = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|$OO:zeros_like", kwlist, &x, &dtype_obj, &shape_obj))
        return NULL;
    ampc_view v, out;
    if (ampc_view_from_object(st, x, "zeros_like: x", AMPC_FOR_READING, &v) < 0)
        return NULL;
    ampc_dtype dtype = v.dtype;
    if (dtype_obj != Py_None && ampc_dtype_parse(st, dtype_obj, "zeros_like: dtype", &dtype) < 0)
        goto done;
    if (shape_obj == Py_None) {
        fresh = ampc_empty_like(st, &v, dtype, &out);
    }
    else {
        int64_t shape[AMPC_MAX_NDIM];
        const Py_ssize_t ndim = PySequence_Check(shape_obj) ? PySequence_Size(shape_obj) : -1;
        if (ndim < 0 || ndim > AMPC_MAX_NDIM) {
            PyErr_SetString(PyExc_TypeError, "zeros_like: shape must be a sequence of at most 64 ints");
            goto done;
        }
        for (Py_ssize_t d = 0; d < ndim; d++) {
            PyObject *item = PySequence_GetItem(shape_obj, d);
            shape[d] = item ? PyLong_AsLongLong(item) : -1;
            Py_XDECREF(item);
            if (PyErr_Occurred())
                goto done;
        }
        fresh = ampc_array_empty(st, v.device, dtype, (int)ndim, shape, NULL, &out);
    }
    if (fresh != NULL && zero_view(st, &out) == 0)
        result = ampc_return_as(st, Py_NewRef(fresh), v.source);
done:
    Py_XDECREF(fresh);
    ampc_view_release(&v);
    return result;
}

/* A one-element float32 array of shape () holding value, on x's device and
 * of x's type (Adam's step counts, SGD's first-step flags). */
static PyObject *mod_scalar_like(PyObject *module, PyObject *args)
{
    ampc_state *st = ampc_state_of(module);
    PyObject *x, *fresh, *result = NULL;
    double value;
    if (!PyArg_ParseTuple(args, "Od:_scalar_like", &x, &value))
        return NULL;
    ampc_view v, out;
    if (ampc_view_from_object(st, x, "_scalar_like: x", AMPC_FOR_READING, &v) < 0)
        return NULL;
    const float f = (float)value;
    fresh = ampc_array_empty(st, v.device, AMPC_FLOAT32, 0, NULL, NULL, &out);
    if (fresh != NULL) {
        int status = AMPC_OK;
        if (out.device.type == AMPC_DEVICE_CPU)
            memcpy(out.data, &f, sizeof f);
        else if (f == 0.0f && !signbit(f))  /* a memset: never waits, where a copy from the host may */
            status = ampc_backend_of(st, out.device)->memset(out.device.index, out.data, 0, sizeof f,
                                                             ampc_current_stream(out.device.index, NULL));
        else
            status = ampc_backend_of(st, out.device)->copy(out.device.index, out.data, -1, &f, sizeof f,
                                                           ampc_current_stream(out.device.index, NULL));
        if (status == AMPC_OK)
            result = ampc_return_as(st, Py_NewRef(fresh), v.source);
        else
            ampc_backend_raise(st, out.device, status, "_scalar_like");
        Py_DECREF(fresh);
    }
    ampc_view_release(&v);
    return result;
}

static PyObject *mod_zero_(PyObject *module, PyObject *x)
{
    ampc_state *st = ampc_state_of(module);
    ampc_view v;
    if (ampc_view_from_object(st, x, "zero_: x", AMPC_FOR_WRITING, &v) < 0)
        return NULL;
    int rc = -1;
    if (v.readonly)
        PyErr_SetString(PyExc_ValueError, "zero_: the array is read-only");
    else
        rc = zero_view(st, &v);
    ampc_view_release(&v);
    if (rc == 0)
        ampc_count_write(st, x);  /* a Parameter's cached casts are stale now */
    return rc < 0 ? NULL : Py_NewRef(x);
}

/* The value of a one-element float32 array on any device, as a Python
 * float (a GPU array is copied on the current stream, which the host then
 * waits for). ampc.optim reads SGD's first-step flags with it. */
static PyObject *mod_item(PyObject *module, PyObject *x)
{
    ampc_state *st = ampc_state_of(module);
    ampc_view v;
    if (ampc_view_from_object(st, x, "_item: x", AMPC_FOR_READING, &v) < 0)
        return NULL;
    PyObject *result = NULL;
    float value;
    if (v.numel != 1 || v.dtype != AMPC_FLOAT32)
        PyErr_SetString(PyExc_ValueError, "_item: x must be a one-element float32 array");
    else if (read_float(st, &v, &value) == 0)
        result = PyFloat_FromDouble(value);
    ampc_view_release(&v);
    return result;
}

PyMethodDef ampc_optim_methods[] = {
    {"_sgd_step", (PyCFunction)(void (*)(void))mod_sgd_step, METH_VARARGS | METH_KEYWORDS,
     "The fused SGD step of ampc.optim.SGD over lists of arrays."},
    {"_adam_step", (PyCFunction)(void (*)(void))mod_adam_step, METH_VARARGS | METH_KEYWORDS,
     "The fused Adam/AdamW step of ampc.optim.Adam and AdamW over lists of arrays."},
    {"zeros_like", (PyCFunction)(void (*)(void))mod_zeros_like, METH_VARARGS | METH_KEYWORDS,
     "zeros_like(x, /, *, dtype=None, shape=None)\n--\n\n"
     "A new array of zeros with x's shape (or `shape`), dtype (or `dtype`), device and type."},
    {"_scalar_like", mod_scalar_like, METH_VARARGS,
     "_scalar_like(x, value, /)\n--\n\nA 0-d float32 array holding value, on x's device and of x's type."},
    {"_item", mod_item, METH_O, "_item(x, /)\n--\n\nThe value of a one-element float32 array on any device."},
    {"zero_", mod_zero_, METH_O, "zero_(x, /)\n--\n\nFill a dense array with zeros, in place; returns x."},
    {NULL, NULL, 0, NULL},
};
