/*
 * grads.c: an optimizer's gradients as kernels see them.
 *
 * An optimizer is anything with `param_groups` (a list of dicts whose
 * "params" is an iterable of parameters) whose parameters have a `.grad`:
 * None, a NumPy array, or any DLPack buffer (torch, CuPy, ampc). All of
 * them are read and checked before any kernel runs, so a bad gradient
 * leaves every gradient untouched: wrong dtype (TypeError), float16 where
 * torch refuses it, read-only or self-overlapping (ValueError). A sparse COO
 * gradient (torch's) is read through its values, as torch unscales them.
 */
#include "ampc.h"

#include <string.h>
#include "grads.h"

static void describe(char *buf, size_t size, int group, int index)
{
    snprintf(buf, size, "optimizer.param_groups[%d]['params'][%d].grad", group, index);
}

void ampc_grads_clear(ampc_grads *g)
{
    for (int64_t i = 0; i < g->n; i++) {
        ampc_view_release(&g->entries[i].view);
        Py_XDECREF(g->entries[i].param);
        Py_XDECREF(g->entries[i].written);
        PyMem_Free(g->entries[i].loop);
    }
    g->n = 0;
    g->ndevices = 0;
}

void ampc_grads_count_writes(ampc_state *st, const ampc_grads *g)
{
    for (int64_t i = 0; i < g->n; i++)
        ampc_count_write(st, g->entries[i].written);
}

void ampc_grads_release(ampc_grads *g)
{
    ampc_grads_clear(g);
    PyMem_Free(g->entries);
    PyMem_Free(g->refs);
    memset(g, 0, sizeof *g);
}

/* Room for one more entry (and its ref). */
static int grow(ampc_grads *g)
{
    if (g->n < g->capacity)
        return 0;
    const int64_t capacity = g->capacity ? 2 * g->capacity : 256;
    ampc_grad_entry *entries = PyMem_Realloc(g->entries, (size_t)capacity * sizeof *entries);
    if (entries == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    g->entries = entries;
    ampc_grad_ref *refs = PyMem_Realloc(g->refs, (size_t)capacity * sizeof *refs);
    if (refs == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    g->refs = refs;
    g->capacity = capacity;
    return 0;
}

/* Check one gradient and describe it for the kernels. The name is written
 * out only for an error message: this runs for every gradient of every step. */
static int add_grad(ampc_state *st, ampc_grads *g, PyObject *param, PyObject *grad, int group, int index,
                    int allow_fp16, int for_writing)
{
    char name[96];
    if (grow(g) < 0)
        return -1;
    ampc_grad_entry *e = &g->entries[g->n];
    e->param = e->written = NULL;
    if (ampc_view_from_object(st, grad, "gradient", for_writing ? AMPC_FOR_WRITING : AMPC_FOR_READING,
                              &e->view) < 0) {
        describe(name, sizeof name, group, index);  /* say which gradient, keeping the message */
        ampc_rename_error("gradient", name);
        return -1;
    }
    e->loop = NULL;
    g->n++;  /* from here on released with the list */
    e->param = Py_NewRef(param);
    e->written = for_writing && ampc_is_parameter(st, grad) ? Py_NewRef(grad) : NULL;
    e->group = group;
    e->index = index;
    const ampc_view *v = &e->view;
    if (!AMPC_DTYPE_IS_FLOAT(v->dtype)) {
        describe(name, sizeof name, group, index);
        PyErr_Format(PyExc_TypeError, "%s has dtype %s; gradients must be float32, float16, bfloat16 "
                     "or float64", name, ampc_dtype_names[v->dtype]);
        return -1;
    }
    if (v->dtype == AMPC_FLOAT16 && !allow_fp16) {
        PyErr_SetString(PyExc_ValueError, "Attempting to unscale FP16 gradients.");
        return -1;
    }
    if (for_writing && v->readonly) {
        describe(name, sizeof name, group, index);
        PyErr_Format(PyExc_ValueError, "%s is read-only", name);
        return -1;
    }
    if (for_writing && ampc_layout_has_internal_overlap(v->ndim, v->shape, v->strides, ampc_dtype_size(v->dtype))) {
        describe(name, sizeof name, group, index);
        PyErr_Format(PyExc_ValueError, "%s has elements that share memory (zero or overlapping "
                     "strides); unscaling it would scale them twice", name);
        return -1;
    }
    ampc_loop loop;
    char *data[1] = {v->data};
    const int64_t *strides[1] = {v->strides};
    ampc_loop_init(&loop, 1, v->ndim, v->shape, data, strides);
    if (loop.ndim == 0 || (loop.ndim == 1 && loop.strides[0][0] == ampc_dtype_size(v->dtype))) {
        e->dense_data = loop.data[0];
        return 0;
    }
    e->loop = PyMem_Malloc(sizeof loop);
    if (e->loop == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    *e->loop = loop;
    return 0;
}

/* 1 if `grad` is a sparse COO tensor (torch's is_sparse), 0 if not, -1 on error. Arrays of ampc's
 * and NumPy's are dense without asking. */
static int is_sparse(ampc_state *st, PyObject *grad)
{
    if (PyArray_Check(grad) || ampc_is_array(st, grad))
        return 0;
    PyObject *flag = PyObject_GetAttrString(grad, "is_sparse");
    if (flag == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError))
            return -1;
        PyErr_Clear();
        return 0;
    }
    const int sparse = PyObject_IsTrue(flag);
    Py_DECREF(flag);
    return sparse;
}

/* What torch unscales of a sparse COO gradient: grad._values(), a dense tensor over its values'
 * memory (a new reference). A float16 gradient is coalesced first, when float16 is allowed, and
 * param.grad becomes the coalesced tensor, as torch does: its duplicate indices add up, which can
 * overflow, so the check must see the sums. Without allow_fp16 the values' dtype is refused with
 * torch's text afterwards. */
static PyObject *sparse_values(PyObject *param, PyObject *grad, int allow_fp16)
{
    PyObject *dtype = PyObject_GetAttrString(grad, "dtype");
    const int d = dtype ? ampc_dtype_of_torch(dtype) : -2;
    Py_XDECREF(dtype);
    if (d == -2)
        return NULL;
    const int half = d == AMPC_FLOAT16;
    PyObject *source = Py_NewRef(grad);
    if (half && allow_fp16) {
        Py_SETREF(source, PyObject_CallMethod(grad, "coalesce", NULL));
        if (source == NULL || PyObject_SetAttrString(param, "grad", source) < 0) {
            Py_XDECREF(source);
            return NULL;
        }
    }
    PyObject *values = PyObject_CallMethod(source, "_values", NULL);
    Py_DECREF(source);
    return values;
}

int ampc_grads_collect(ampc_state *st, PyObject *optimizer, int allow_fp16, int for_writing, ampc_grads *g)
{
    PyObject *groups = NULL, *group_iter = NULL, *group = NULL, *params = NULL, *param_iter = NULL,
             *param = NULL, *grad = NULL;
    int rc = -1;
    ampc_grads_clear(g);
    st->stream_cache_on = 1;
    st->stream_cache_thread = PyThread_get_thread_ident();
    st->stream_cache_api = NULL;
    groups = PyObject_GetAttrString(optimizer, "param_groups");
    if (groups == NULL) {
        if (PyErr_ExceptionMatches(PyExc_AttributeError)) {  /* a string, a loss: say what was wanted */
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "optimizer must be an optimizer (an object with param_groups), got %.200s",
                         Py_TYPE(optimizer)->tp_name);
        }
        goto done;
    }
    group_iter = PyObject_GetIter(groups);
    if (group_iter == NULL)
        goto done;
    for (int gi = 0; (group = PyIter_Next(group_iter)) != NULL; gi++) {
        params = PyMapping_Check(group) ? PyMapping_GetItemString(group, "params") : NULL;
        if (params == NULL) {
            if (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_KeyError)) {
                PyErr_Clear();
                PyErr_Format(PyExc_TypeError, "optimizer.param_groups[%d] must be a dict with 'params', got %.200s",
                             gi, Py_TYPE(group)->tp_name);
            }
            goto done;
        }
        param_iter = PyObject_GetIter(params);
        if (param_iter == NULL)
            goto done;
        for (int pi = 0; (param = PyIter_Next(param_iter)) != NULL; pi++) {
            grad = PyObject_GetAttrString(param, "grad");
            if (grad == NULL) {
                if (PyErr_ExceptionMatches(PyExc_AttributeError)) {  /* None, a string: say which entry */
                    PyErr_Clear();
                    PyErr_Format(PyExc_TypeError, "optimizer.param_groups[%d]['params'][%d] must be a parameter "
                                 "(an object with .grad), got %.200s", gi, pi, Py_TYPE(param)->tp_name);
                }
                goto done;
            }
            if (grad != Py_None) {
                const int sparse = is_sparse(st, grad);
                if (sparse < 0)
                    goto done;
                if (sparse) {
                    Py_SETREF(grad, sparse_values(param, grad, allow_fp16));
                    if (grad == NULL)
                        goto done;
                }
                if (add_grad(st, g, param, grad, gi, pi, allow_fp16, for_writing) < 0)
                    goto done;
            }
            Py_CLEAR(grad);
            Py_CLEAR(param);
        }
        if (PyErr_Occurred())
            goto done;
        Py_CLEAR(param_iter);
        Py_CLEAR(params);
        Py_CLEAR(group);
    }
    if (PyErr_Occurred())
        goto done;

    /* Devices, and the refs the kernels take, grouped by device. */
    for (int64_t i = 0; i < g->n; i++) {
        const ampc_device dev = g->entries[i].view.device;
        int d = 0;
        while (d < g->ndevices && !(g->devices[d].type == dev.type && g->devices[d].index == dev.index))
            d++;
        if (d == g->ndevices) {
            if (g->ndevices == AMPC_GRADS_MAX_DEVICES) {
                PyErr_SetString(PyExc_ValueError, "the optimizer's gradients are on more devices than "
                                "ampc's GradScaler handles at once");
                goto done;
            }
            g->devices[g->ndevices++] = dev;
        }
        g->entries[i].device_slot = d;
    }
    int64_t k = 0;
    for (int d = 0; d < g->ndevices; d++) {
        g->first[d] = k;
        for (int64_t i = 0; i < g->n; i++) {
            ampc_grad_entry *e = &g->entries[i];
            if (e->device_slot != d)
                continue;
            ampc_grad_ref *r = &g->refs[k++];
            r->data = e->loop == NULL ? e->dense_data : e->view.data;
            r->numel = e->view.numel;
            r->dtype = e->view.dtype;
            r->loop = e->loop;
        }
        g->count[d] = k - g->first[d];
    }
    rc = 0;
done:
    Py_XDECREF(grad);
    Py_XDECREF(param);
    Py_XDECREF(param_iter);
    Py_XDECREF(params);
    Py_XDECREF(group);
    Py_XDECREF(group_iter);
    Py_XDECREF(groups);
    st->stream_cache_on = 0;
    if (rc < 0)
        ampc_grads_clear(g);
    return rc;
}
