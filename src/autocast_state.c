/*
 * autocast_state.c: the regions. ampc._C.autocast (the context manager the
 * Python ampc.autocast extends with its decorator form) and torch's
 * module-level state functions.
 *
 * The state is per thread, as torch's: enabled and dtype per device type,
 * the cache flag, the nesting counter. What a region's __exit__ restores is
 * kept on a per-thread stack of frames rather than on the autocast object,
 * so that one object may be entered again while it is active (a decorated
 * function that recurses) or from several threads at once (a decorated
 * forward called by worker threads); torch keeps it on the object, and
 * leaves a recursing function's caller with autocast on.
 *
 * Regions may be left in any order, as torch's may: asyncio tasks that each
 * hold a region across an `await` share their thread's state and leave in
 * the order they resume. A region left while others entered after it are
 * still open is taken out of the stack: what it saved is handed to the next
 * region above it (of its device type, for the per-device state), so that
 * leaving all of them, in whatever order, gives back the state from before
 * the first, and the nesting count reaches 0 (the cache is dropped) when
 * the last one is left. The state is per thread, not per task: a task sees
 * the innermost region open on its thread, whichever task entered it.
 */
#include "autocast.h"

#include <string.h>

_Thread_local ampc_autocast_tls ampc_autocast = {
    .dtype = {[AMPC_DEVICE_CPU] = AMPC_BFLOAT16, [AMPC_DEVICE_CUDA] = AMPC_FLOAT16},
    .cache_enabled = 1,
};

/* ------------------------------------------------------------------------ */
/* Device types                                                              */
/* ------------------------------------------------------------------------ */

/* Every device type torch's parser accepts (c10/core/DeviceType.cpp). */
static const char *const torch_device_types[] = {
    "cpu", "cuda", "ipu", "xpu", "mkldnn", "opengl", "opencl", "ideep", "hip", "ve", "fpga", "maia", "xla",
    "lazy", "vulkan", "mps", "meta", "hpu", "mtia", "privateuseone", NULL,
};

static const char *const device_type_names[AMPC_AUTOCAST_DEVICES] = {
    [AMPC_DEVICE_CPU] = "cpu",
    [AMPC_DEVICE_CUDA] = "cuda",
};

int ampc_autocast_device(PyObject *device_type)
{
    if (!PyUnicode_Check(device_type)) {
        PyErr_Format(PyExc_TypeError, "device_type must be a str, got %.200s", Py_TYPE(device_type)->tp_name);
        return -1;
    }
    Py_ssize_t size;
    const char *s = PyUnicode_AsUTF8AndSize(device_type, &size);
    if (s == NULL)
        return -1;
    /* "type" or "type:index" with a decimal index, as torch.device parses */
    const char *colon = memchr(s, ':', (size_t)size);
    const size_t type_len = colon ? (size_t)(colon - s) : (size_t)size;
    int index_ok = 1;
    if (colon != NULL) {
        const char *digits = colon + 1;
        index_ok = *digits != '\0' && (digits[0] != '0' || digits[1] == '\0');
        for (const char *c = digits; *c; c++)
            index_ok &= *c >= '0' && *c <= '9';
    }
    for (int k = 0; index_ok && torch_device_types[k] != NULL; k++) {
        if (strlen(torch_device_types[k]) != type_len || strncmp(torch_device_types[k], s, type_len) != 0)
            continue;
        for (int d = 0; d < AMPC_AUTOCAST_DEVICES; d++)
            if (strcmp(torch_device_types[k], device_type_names[d]) == 0)
                return d;
        return -2;
    }
    PyErr_Format(PyExc_RuntimeError, "Invalid device string: '%s'", s);
    return -1;
}

int ampc_autocast_device_or_raise(PyObject *device_type)
{
    const int d = ampc_autocast_device(device_type);
    if (d == -2)
        PyErr_Format(PyExc_RuntimeError, "User specified an unsupported autocast device_type '%U'", device_type);
    return d < 0 ? -1 : d;
}

/* ------------------------------------------------------------------------ */
/* ampc._C.autocast                                                          */
/* ------------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    ampc_device_type device;
    PyObject *device_str;   /* as given */
    ampc_dtype dtype;
    char enabled;
    char cache_enabled;
    PyObject *overrides;    /* dict op name -> policy, or NULL */
} autocast_object;

#define AUTOCAST(op) ((autocast_object *)(op))

static int Autocast_traverse(PyObject *op, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(op));
    Py_VISIT(AUTOCAST(op)->device_str);
    Py_VISIT(AUTOCAST(op)->overrides);
    return 0;
}

static int Autocast_clear(PyObject *op)
{
    Py_CLEAR(AUTOCAST(op)->device_str);
    Py_CLEAR(AUTOCAST(op)->overrides);
    return 0;
}

static void Autocast_dealloc(PyObject *op)
{
    PyTypeObject *type = Py_TYPE(op);
    PyObject_GC_UnTrack(op);
    Autocast_clear(op);
    type->tp_free(op);
    Py_DECREF(type);
}

/* Add `names` (an iterable of op names or autocast ops) to `overrides` with
 * `policy`. Each must name an op autocast knows, once. */
static int add_overrides(ampc_state *st, PyObject *overrides, PyObject *names, const char *argname,
                         ampc_policy policy)
{
    if (PyUnicode_Check(names)) {
        PyErr_Format(PyExc_TypeError, "autocast: %s must be a collection of op names, not a str", argname);
        return -1;
    }
    PyObject *it = PyObject_GetIter(names);
    if (it == NULL) {
        PyErr_Format(PyExc_TypeError, "autocast: %s must be a collection of op names, got %.200s", argname,
                     Py_TYPE(names)->tp_name);
        return -1;
    }
    PyObject *policy_obj = PyLong_FromLong(policy), *item;
    int rc = policy_obj != NULL ? 0 : -1;
    while (rc == 0 && (item = PyIter_Next(it)) != NULL) {
        PyObject *name = PyUnicode_Check(item) ? Py_NewRef(item) : PyObject_GetAttrString(item, "name");
        if (name != NULL && PyUnicode_Check(name))  /* an exact str: the regions' lookups never run Python */
            Py_SETREF(name, PyUnicode_FromObject(name));
        if (name == NULL || !PyUnicode_Check(name)) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "autocast: %s holds %.200s; expected op names (str) or autocast ops",
                         argname, Py_TYPE(item)->tp_name);
            rc = -1;
        }
        else if (PyDict_GetItemWithError(st->autocast_registry, name) == NULL) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_ValueError, "autocast: %s names '%U', which is not an op autocast knows "
                             "(register it with ampc.register_autocast or ampc.autocast_op)", argname, name);
            rc = -1;
        }
        else if (PyDict_GetItemWithError(overrides, name) != NULL) {
            PyErr_Format(PyExc_ValueError, "autocast: '%U' is named twice in fp32_ops and lower_precision_ops",
                         name);
            rc = -1;
        }
        else if (!PyErr_Occurred()) {
            rc = PyDict_SetItem(overrides, name, policy_obj);
        }
        else {
            rc = -1;
        }
        Py_XDECREF(name);
        Py_DECREF(item);
    }
    if (rc == 0 && PyErr_Occurred())
        rc = -1;
    Py_XDECREF(policy_obj);
    Py_DECREF(it);
    return rc;
}

static PyObject *Autocast_new(PyTypeObject *type, PyObject *Py_UNUSED(args), PyObject *Py_UNUSED(kwargs))
{
    autocast_object *self = (autocast_object *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->device = AMPC_DEVICE_CUDA;
    self->dtype = AMPC_FLOAT16;
    self->device_str = PyUnicode_FromString("cuda");
    if (self->device_str == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

/* torch.autocast.__init__'s checks, texts and warnings, in its order. */
static int Autocast_init(PyObject *op, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"device_type", "dtype", "enabled", "cache_enabled", "fp32_ops",
                             "lower_precision_ops", NULL};
    autocast_object *self = AUTOCAST(op);
    ampc_state *st = ampc_state_from_type(Py_TYPE(op));
    PyObject *device_obj, *dtype_obj = Py_None, *cache_obj = Py_None, *fp32_ops = Py_None, *lower_ops = Py_None;
    int enabled = 1;
    if (st == NULL || !PyArg_ParseTupleAndKeywords(args, kwargs, "O|OpO$OO:autocast", kwlist, &device_obj,
                                                   &dtype_obj, &enabled, &cache_obj, &fp32_ops, &lower_ops))
        return -1;
    if (!PyUnicode_Check(device_obj)) {
        PyObject *type_repr = PyObject_Repr((PyObject *)Py_TYPE(device_obj));
        if (type_repr != NULL)
            PyErr_Format(PyExc_ValueError, "Expected `device_type` of type `str`, got: `%U`", type_repr);
        Py_XDECREF(type_repr);
        return -1;
    }
    const int device = ampc_autocast_device_or_raise(device_obj);
    if (device < 0)
        return -1;
    /* Any dtype ampc knows: torch checks it only where the region is enabled (below). */
    ampc_dtype dtype = ampc_autocast.dtype[device];
    if (dtype_obj != Py_None && ampc_dtype_parse(st, dtype_obj, "autocast: dtype", &dtype) < 0)
        return -1;
    int cache_enabled = ampc_autocast.cache_enabled;
    if (cache_obj != Py_None && (cache_enabled = PyObject_IsTrue(cache_obj)) < 0)
        return -1;

    PyObject *overrides = NULL;
    if (fp32_ops != Py_None || lower_ops != Py_None) {
        overrides = PyDict_New();
        if (overrides == NULL ||
            (fp32_ops != Py_None && add_overrides(st, overrides, fp32_ops, "fp32_ops", AMPC_POLICY_FP32) < 0) ||
            (lower_ops != Py_None &&
             add_overrides(st, overrides, lower_ops, "lower_precision_ops", AMPC_POLICY_LOWER_PRECISION_FP) < 0)) {
            Py_XDECREF(overrides);
            return -1;
        }
    }

    if (enabled && device == AMPC_DEVICE_CUDA) {
        const int count = ampc_cuda_device_count(st);
        if (count < 0)
            PyErr_Clear();  /* a failing driver: as unavailable as no GPU */
        if (count <= 0) {
            if (PyErr_WarnEx(PyExc_UserWarning,
                             "User provided device_type of 'cuda', but CUDA is not available. Disabling", 1) < 0)
                goto fail;
            enabled = 0;
        }
    }
    if (enabled && device == AMPC_DEVICE_CPU && dtype != AMPC_BFLOAT16 && dtype != AMPC_FLOAT16) {
        if (PyErr_WarnEx(PyExc_UserWarning,
                         "In CPU autocast, but the target dtype is not supported. Disabling autocast.\n"
                         "CPU Autocast only supports dtype of torch.bfloat16, torch.float16 currently.", 1) < 0)
            goto fail;
        enabled = 0;
    }
    /* torch would open an enabled CUDA region that casts floating arrays to
     * an integer dtype; ampc refuses it (a disabled one is torch's: allowed). */
    if (enabled && device == AMPC_DEVICE_CUDA && !AMPC_DTYPE_IS_FLOAT(dtype)) {
        PyErr_Format(PyExc_TypeError, "autocast: dtype must be a floating dtype, got %s", ampc_dtype_names[dtype]);
        goto fail;
    }
    if (enabled && device == AMPC_DEVICE_CUDA && dtype == AMPC_BFLOAT16) {
        const int bf16 = ampc_cuda_bf16_supported(st);
        if (bf16 < 0)
            goto fail;
        if (!bf16) {
            PyErr_SetString(PyExc_RuntimeError,
                            "Current CUDA Device does not support bfloat16. Please switch dtype to float16.");
            goto fail;
        }
    }
    self->device = (ampc_device_type)device;
    Py_SETREF(self->device_str, Py_NewRef(device_obj));
    self->dtype = dtype;
    self->enabled = (char)enabled;
    self->cache_enabled = (char)cache_enabled;
    Py_XSETREF(self->overrides, overrides);
    return 0;
fail:
    Py_XDECREF(overrides);
    return -1;
}

/* A thread that ends inside a region (a thread function or a generator that
 * entered one and never left it) would keep what its frames and overrides
 * hold for good: the regions' autocast objects, their policy dicts, frames on
 * the heap. CPython clears a thread's state dict on the thread itself as the
 * thread ends, so a capsule kept there gives them back; its pointer is the
 * thread's own state, so that a dict cleared by another thread gives back
 * nothing of that one's. */
static const char release_capsule_name[] = "ampc.autocast.release_at_exit";

static void release_thread_frames(PyObject *capsule)
{
    ampc_autocast_tls *t = &ampc_autocast;
    if (PyCapsule_GetPointer(capsule, release_capsule_name) != (void *)t) {
        PyErr_Clear();
        return;
    }
    t->release_at_exit = 0;
    /* Everything taken out of the state before the first release, which may run Python. */
    const int n = t->nframes;
    ampc_autocast_frame *frames = t->frames;
    PyObject *overrides[AMPC_AUTOCAST_DEVICES];
    for (int d = 0; d < AMPC_AUTOCAST_DEVICES; d++) {
        overrides[d] = t->overrides[d];
        t->overrides[d] = NULL;
    }
    ampc_autocast_frame inline_copy[AMPC_AUTOCAST_INLINE_FRAMES];
    if (frames == t->inline_frames) {
        memcpy(inline_copy, t->inline_frames, sizeof inline_copy);
        frames = inline_copy;
    }
    t->frames = t->inline_frames;
    t->capacity = AMPC_AUTOCAST_INLINE_FRAMES;
    t->nframes = 0;
    t->nesting = 0;
    for (int i = 0; i < n; i++) {
        Py_XDECREF(frames[i].overrides);
        Py_DECREF(frames[i].owner);
    }
    if (frames != inline_copy)
        PyMem_Free(frames);
    for (int d = 0; d < AMPC_AUTOCAST_DEVICES; d++)
        Py_XDECREF(overrides[d]);
}

/* Keep the capsule in the thread's state dict, once a thread. */
static int release_at_thread_exit(ampc_autocast_tls *t)
{
    if (t->release_at_exit)
        return 0;
    PyObject *dict = PyThreadState_GetDict();  /* borrowed; NULL (nothing raised) where there is none */
    if (dict == NULL)
        return 0;
    PyObject *capsule = PyCapsule_New(t, release_capsule_name, release_thread_frames);
    const int rc = capsule != NULL ? PyDict_SetItemString(dict, release_capsule_name, capsule) : -1;
    Py_XDECREF(capsule);
    if (rc == 0)
        t->release_at_exit = 1;
    return rc;
}

static int push_frame(ampc_autocast_tls *t, autocast_object *self)
{
    if (release_at_thread_exit(t) < 0)
        return -1;
    if (t->frames == NULL) {
        t->frames = t->inline_frames;
        t->capacity = AMPC_AUTOCAST_INLINE_FRAMES;
    }
    if (t->nframes == t->capacity) {
        const int capacity = 2 * t->capacity;
        const int in_place = t->frames == t->inline_frames;
        ampc_autocast_frame *frames = PyMem_Realloc(in_place ? NULL : t->frames, (size_t)capacity * sizeof *frames);
        if (frames == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        if (in_place)
            memcpy(frames, t->inline_frames, sizeof t->inline_frames);
        t->frames = frames;
        t->capacity = capacity;
    }
    const ampc_device_type d = self->device;
    ampc_autocast_frame *f = &t->frames[t->nframes++];
    f->owner = Py_NewRef((PyObject *)self);
    f->device = d;
    f->enabled = t->enabled[d];
    f->cache_enabled = t->cache_enabled;
    f->dtype = t->dtype[d];
    f->suppressed = t->suppressed;
    f->overrides = t->overrides[d];  /* the thread's reference moves to the frame */
    t->overrides[d] = NULL;
    return 0;
}

/* The policies by name inside the region: the enclosing region's, with this
 * one's own on top. A new reference or NULL. */
static int region_overrides(const autocast_object *self, PyObject *outer, PyObject **out)
{
    if (self->overrides == NULL || outer == NULL) {
        *out = Py_XNewRef(self->overrides != NULL ? self->overrides : outer);
        return 0;
    }
    PyObject *merged = PyDict_Copy(outer);
    if (merged == NULL || PyDict_Update(merged, self->overrides) < 0) {
        Py_XDECREF(merged);
        return -1;
    }
    *out = merged;
    return 0;
}

static PyObject *Autocast_enter(PyObject *op, PyObject *Py_UNUSED(ignored))
{
    autocast_object *self = AUTOCAST(op);
    ampc_autocast_tls *t = &ampc_autocast;
    const ampc_device_type d = self->device;
    PyObject *overrides;
    if (region_overrides(self, t->overrides[d], &overrides) < 0)
        return NULL;
    if (push_frame(t, self) < 0) {
        Py_XDECREF(overrides);
        return NULL;
    }
    t->enabled[d] = (unsigned char)self->enabled;
    t->dtype[d] = self->dtype;
    t->overrides[d] = overrides;
    t->nesting++;
    t->cache_enabled = (unsigned char)self->cache_enabled;
    t->suppressed = 0;  /* a region opened inside an autocast op casts again */
    Py_RETURN_NONE;
}

/* The topmost frame `op` entered on this thread, or -1. */
static int find_frame(const ampc_autocast_tls *t, PyObject *op)
{
    for (int i = t->nframes - 1; i >= 0; i--)
        if (t->frames[i].owner == op)
            return i;
    return -1;
}

static PyObject *Autocast_exit(PyObject *op, PyObject *const *Py_UNUSED(args), Py_ssize_t Py_UNUSED(nargs))
{
    ampc_autocast_tls *t = &ampc_autocast;
    const int i = find_frame(t, op);
    if (i < 0) {
        PyErr_SetString(PyExc_RuntimeError, "autocast.__exit__ without a matching __enter__ in this thread");
        return NULL;
    }
    const ampc_autocast_frame f = t->frames[i];
    /* What the region saved goes to the region entered next above it, if
     * one is still open (it saved what this one set), else to the thread. */
    if (i + 1 < t->nframes) {
        t->frames[i + 1].cache_enabled = f.cache_enabled;
        t->frames[i + 1].suppressed = f.suppressed;
    }
    else {
        t->cache_enabled = f.cache_enabled;
        t->suppressed = f.suppressed;
    }
    int above = i + 1;
    while (above < t->nframes && t->frames[above].device != f.device)
        above++;
    PyObject *dropped;  /* the overrides this region set: a dict of str, whose release runs no Python */
    if (above < t->nframes) {
        ampc_autocast_frame *g = &t->frames[above];
        g->enabled = f.enabled;
        g->dtype = f.dtype;
        dropped = g->overrides;
        g->overrides = f.overrides;
    }
    else {
        t->enabled[f.device] = f.enabled;
        t->dtype[f.device] = f.dtype;
        dropped = t->overrides[f.device];
        t->overrides[f.device] = f.overrides;
    }
    memmove(&t->frames[i], &t->frames[i + 1], (size_t)(t->nframes - i - 1) * sizeof *t->frames);
    if (--t->nframes == 0 && t->frames != t->inline_frames) {  /* back to the frames in place */
        PyMem_Free(t->frames);
        t->frames = t->inline_frames;
        t->capacity = AMPC_AUTOCAST_INLINE_FRAMES;
    }
    Py_XDECREF(dropped);
    /* Drop the cache when leaving the outermost region (disabled ones count).
     * Last, with the state already restored: releasing a cast may run Python
     * (a producer's deleter), which may enter and leave regions. */
    if (--t->nesting == 0)
        ampc_cast_cache_clear(ampc_state_from_type(Py_TYPE(op)));
    Py_DECREF(f.owner);
    Py_RETURN_FALSE;
}

static PyObject *Autocast_get_device(PyObject *op, void *Py_UNUSED(closure))
{
    return Py_NewRef(AUTOCAST(op)->device_str);
}

static PyObject *Autocast_get_fast_dtype(PyObject *op, void *Py_UNUSED(closure))
{
    ampc_state *st = ampc_state_from_type(Py_TYPE(op));
    return st ? Py_NewRef((PyObject *)st->descr[AUTOCAST(op)->dtype]) : NULL;
}

static PyObject *Autocast_get_enabled(PyObject *op, void *Py_UNUSED(closure))
{
    return PyBool_FromLong(AUTOCAST(op)->enabled);
}

static PyObject *Autocast_get_cache_enabled(PyObject *op, void *Py_UNUSED(closure))
{
    return PyBool_FromLong(AUTOCAST(op)->cache_enabled);
}

/* {"fp32": [...], "lower_precision_fp": [...]}: the region's own policies. */
static PyObject *Autocast_get_overrides(PyObject *op, void *Py_UNUSED(closure))
{
    PyObject *d = PyDict_New(), *name, *policy;
    Py_ssize_t pos = 0;
    if (d == NULL || AUTOCAST(op)->overrides == NULL)
        return d;
    while (PyDict_Next(AUTOCAST(op)->overrides, &pos, &name, &policy)) {
        const char *key = ampc_policy_names[PyLong_AsLong(policy)];
        PyObject *names = PyDict_GetItemString(d, key);
        if (names == NULL) {
            names = PyList_New(0);
            if (names == NULL || PyDict_SetItemString(d, key, names) < 0) {
                Py_XDECREF(names);
                Py_DECREF(d);
                return NULL;
            }
            Py_DECREF(names);
        }
        if (PyList_Append(names, name) < 0) {
            Py_DECREF(d);
            return NULL;
        }
    }
    return d;
}

static PyGetSetDef Autocast_getset[] = {
    {"device", Autocast_get_device, NULL, "The device type, as given.", NULL},
    {"fast_dtype", Autocast_get_fast_dtype, NULL, "The dtype lower_precision_fp ops run in.", NULL},
    {"_enabled", Autocast_get_enabled, NULL, "Whether the region casts (after the checks).", NULL},
    {"_cache_enabled", Autocast_get_cache_enabled, NULL, "Whether the weight-cast cache is on in the region.",
     NULL},
    {"_overrides", Autocast_get_overrides, NULL, "The region's own policies by op name.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyObject *Autocast_repr(PyObject *op)
{
    autocast_object *self = AUTOCAST(op);
    return PyUnicode_FromFormat("%s(device_type=%R, dtype=%s, enabled=%s, cache_enabled=%s)",
                                Py_TYPE(op)->tp_name, self->device_str, ampc_dtype_names[self->dtype],
                                self->enabled ? "True" : "False", self->cache_enabled ? "True" : "False");
}

static PyMethodDef Autocast_methods[] = {
    {"__enter__", Autocast_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)(void (*)(void))Autocast_exit, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL},
};

PyDoc_STRVAR(Autocast_doc,
"autocast(device_type, dtype=None, enabled=True, cache_enabled=None, *, fp32_ops=None,\n"
"         lower_precision_ops=None)\n--\n\n"
"A region in which autocast ops run in the precision their policy picks, as torch.autocast.");

static PyType_Slot Autocast_slots[] = {
    {Py_tp_new, Autocast_new},
    {Py_tp_init, Autocast_init},
    {Py_tp_dealloc, Autocast_dealloc},
    {Py_tp_traverse, Autocast_traverse},
    {Py_tp_clear, Autocast_clear},
    {Py_tp_repr, Autocast_repr},
    {Py_tp_getset, Autocast_getset},
    {Py_tp_methods, Autocast_methods},
    {Py_tp_doc, (void *)Autocast_doc},
    {0, NULL},
};

static PyType_Spec Autocast_spec = {
    .name = "ampc._C.autocast",
    .basicsize = sizeof(autocast_object),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .slots = Autocast_slots,
};

/* ------------------------------------------------------------------------ */
/* Module-level state functions (torch's names)                              */
/* ------------------------------------------------------------------------ */

static int check_nargs(const char *name, Py_ssize_t nargs, Py_ssize_t min, Py_ssize_t max)
{
    if (nargs >= min && nargs <= max)
        return 0;
    if (min == max)
        PyErr_Format(PyExc_TypeError, "%s expected %zd arguments, got %zd", name, min, nargs);
    else
        PyErr_Format(PyExc_TypeError, "%s expected %zd to %zd arguments, got %zd", name, min, max, nargs);
    return -1;
}

/* The device type argument of the state functions; torch's legacy forms
 * mean CUDA when it is left out. */
static int device_arg(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t at)
{
    if (nargs <= at || args[at] == Py_None)
        return AMPC_DEVICE_CUDA;
    return ampc_autocast_device_or_raise(args[at]);
}

static PyObject *mod_is_autocast_enabled(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (check_nargs("is_autocast_enabled", nargs, 0, 1) < 0)
        return NULL;
    const int d = device_arg(args, nargs, 0);
    return d < 0 ? NULL : PyBool_FromLong(ampc_autocast.enabled[d]);
}

/* set_autocast_enabled(device_type, enabled), or the legacy
 * set_autocast_enabled(enabled) for CUDA. */
static PyObject *mod_set_autocast_enabled(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (check_nargs("set_autocast_enabled", nargs, 1, 2) < 0)
        return NULL;
    const int d = nargs == 2 ? ampc_autocast_device_or_raise(args[0]) : AMPC_DEVICE_CUDA;
    if (d < 0)
        return NULL;
    const int enabled = PyObject_IsTrue(args[nargs - 1]);
    if (enabled < 0)
        return NULL;
    ampc_autocast.enabled[d] = (unsigned char)enabled;
    Py_RETURN_NONE;
}

static PyObject *mod_get_autocast_dtype(PyObject *module, PyObject *device_type)
{
    const int d = ampc_autocast_device_or_raise(device_type);
    return d < 0 ? NULL : Py_NewRef((PyObject *)ampc_state_of(module)->descr[ampc_autocast.dtype[d]]);
}

static PyObject *mod_set_autocast_dtype(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_nargs("set_autocast_dtype", nargs, 2, 2) < 0)
        return NULL;
    const int d = ampc_autocast_device_or_raise(args[0]);
    ampc_dtype dtype;
    if (d < 0 || ampc_dtype_parse(ampc_state_of(module), args[1], "set_autocast_dtype: dtype", &dtype) < 0)
        return NULL;
    /* Any dtype, as torch's: a region made with it warns and runs disabled (CPU) or is refused
     * (CUDA), and an op in a state turned on by set_autocast_enabled refuses it (dispatch). */
    ampc_autocast.dtype[d] = dtype;
    Py_RETURN_NONE;
}

static PyObject *mod_is_autocast_cache_enabled(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(ignored))
{
    return PyBool_FromLong(ampc_autocast.cache_enabled);
}

static PyObject *mod_set_autocast_cache_enabled(PyObject *Py_UNUSED(module), PyObject *enabled)
{
    const int flag = PyObject_IsTrue(enabled);
    if (flag < 0)
        return NULL;
    ampc_autocast.cache_enabled = (unsigned char)flag;
    Py_RETURN_NONE;
}

static PyObject *mod_autocast_increment_nesting(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(ignored))
{
    return PyLong_FromLong(++ampc_autocast.nesting);
}

static PyObject *mod_autocast_decrement_nesting(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(ignored))
{
    return PyLong_FromLong(--ampc_autocast.nesting);
}

static PyObject *mod_is_autocast_available(PyObject *Py_UNUSED(module), PyObject *device_type)
{
    const int d = ampc_autocast_device(device_type);
    if (d == -1)
        return NULL;
    return PyBool_FromLong(d >= 0);
}

PyMethodDef ampc_autocast_state_methods[] = {
    {"is_autocast_enabled", (PyCFunction)(void (*)(void))mod_is_autocast_enabled, METH_FASTCALL,
     "is_autocast_enabled(device_type='cuda', /)\n--\n\nWhether autocast is on for the device type in this thread."},
    {"set_autocast_enabled", (PyCFunction)(void (*)(void))mod_set_autocast_enabled, METH_FASTCALL,
     "set_autocast_enabled(device_type, enabled, /)\n--\n\nTurn autocast on or off for the device type in this "
     "thread (set_autocast_enabled(enabled) means CUDA)."},
    {"get_autocast_dtype", mod_get_autocast_dtype, METH_O,
     "get_autocast_dtype(device_type, /)\n--\n\nThe dtype a region on the device type uses when none is given "
     "(float16 on 'cuda', bfloat16 on 'cpu' in a new thread)."},
    {"set_autocast_dtype", (PyCFunction)(void (*)(void))mod_set_autocast_dtype, METH_FASTCALL,
     "set_autocast_dtype(device_type, dtype, /)\n--\n\nSet that dtype in this thread."},
    {"is_autocast_cache_enabled", mod_is_autocast_cache_enabled, METH_NOARGS,
     "is_autocast_cache_enabled()\n--\n\nWhether casts of float32 parameters are cached in this thread's regions."},
    {"set_autocast_cache_enabled", mod_set_autocast_cache_enabled, METH_O,
     "set_autocast_cache_enabled(enabled, /)\n--\n\nCache casts of float32 parameters in this thread's regions, or not."},
    {"autocast_increment_nesting", mod_autocast_increment_nesting, METH_NOARGS,
     "autocast_increment_nesting()\n--\n\nOne level deeper; returns the new depth."},
    {"autocast_decrement_nesting", mod_autocast_decrement_nesting, METH_NOARGS,
     "autocast_decrement_nesting()\n--\n\nOne level out; returns the new depth (at 0, torch's regions clear "
     "the cast cache)."},
    {"is_autocast_available", mod_is_autocast_available, METH_O,
     "is_autocast_available(device_type, /)\n--\n\nTrue for 'cpu' and 'cuda', False for the other device types "
     "torch knows."},
    {NULL, NULL, 0, NULL},
};

int ampc_autocast_state_init(PyObject *module, ampc_state *st)
{
    st->autocast_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &Autocast_spec, NULL);
    if (st->autocast_type == NULL)
        return -1;
    return PyModule_AddType(module, st->autocast_type);
}
