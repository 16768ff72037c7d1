/*
 * scaler.c: ampc.GradScaler, torch.amp.GradScaler's behaviour in C.
 *
 * The scale, its growth tracker and the found_inf flags live in one block of
 * memory (scaler_rule.h) on the device of the first tensor scale() meets,
 * created then, as torch creates its scale tensors lazily. Gradients on one
 * other device (the CPU beside a GPU, or the reverse) get a second block
 * holding a copy of the scale and their own flags. On a GPU nothing waits
 * for the device until step() must decide whether to step (or never, for
 * optimizers that take found_inf themselves); update() is a one-thread kernel.
 *
 * Per optimizer (keyed by id(), as torch does): a stage, READY -> UNSCALED ->
 * STEPPED, and which flag slots hold its inf checks. Error texts, assertion
 * texts and the order of the checks are torch's (spec/torch-amp.md 1.x), so
 * that code written against torch.cuda.amp reads the same.
 *
 * Beyond torch, all off by default: min_scale / max_scale, hysteresis,
 * stats(), overflow_report(), and unscale_(..., max_norm=) which clips in the
 * same pass, or with defer=True leaves the division to the optimizer's fused
 * step.
 *
 * A scaler's methods run one at a time: each holds the scaler's own lock,
 * taken again freely by the thread holding it (step() runs the optimizer,
 * whose code may call the scaler). The kernels release the GIL and step()
 * runs Python code, so without the lock a second thread could enter midway
 * and reuse the gradient list being read. The option getters and setters
 * and is_enabled() take no lock: they touch one field under the GIL (update()
 * reads the options once, into the rule it applies), and a thread that the
 * optimizer's step waits for may call them without waiting for that step.
 */
#include "ampc.h"

#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include "grads.h"
#include "kernels/scaler_rule.h"

enum { READY = 0, UNSCALED = 1, STEPPED = 2 };

typedef struct {
    ampc_device device;
    PyObject *owner;            /* the array holding the block */
    ampc_scaler_block *block;   /* host or device address */
    void *stream;               /* the stream its contents are ready on (CUDA) */
    int nflags;                 /* flag slots taken since the last update */
} scaler_memory;

typedef struct {
    int stage;
    PyObject *divisor;          /* after unscale_(defer=True): the step's grad_scale */
    int nfound;
    struct {
        int memory;             /* index into ScalerObject.memory */
        int slot;
    } found[AMPC_GRADS_MAX_DEVICES];
} opt_state;

/* What defines a scaler: its options, and the state its next block starts
 * from (the block, once created, holds the live scale and counters). One
 * validating path (check_config) guards every way in: the constructor, the
 * setters, load_state_dict and unpickling. */
typedef struct {
    int enabled;
    int cuda;                   /* the `device` argument is "cuda" (else "cpu") */
    double growth_factor;
    double backoff_factor;
    int64_t growth_interval;
    double min_scale;           /* 0: none */
    double max_scale;           /* inf: none */
    int64_t hysteresis;
    double scale;
    int64_t growth_tracker;
    int64_t hysteresis_left;
    int64_t steps, skipped;
} scaler_config;

typedef struct {
    PyObject_HEAD
    scaler_config cfg;
    ampc_grads scratch;         /* the gradient list, its memory reused step after step */
    int nmemory;                /* 0 until the first scale() */
    scaler_memory memory[AMPC_GRADS_MAX_DEVICES];  /* [0]: the scale's own device */
    PyObject *states;           /* dict: id(optimizer) -> capsule of opt_state */
    PyThread_type_lock lock;    /* held by the thread running a method */
    unsigned long owner;        /* that thread's ident (read and written with the GIL held) */
    int depth;                  /* its calls in progress */
    /* The method that is running the caller's code (param_groups, .grad,
     * __dlpack__, __float__, ...) while it holds pointers into this object;
     * NULL when none. Meanwhile a re-entered method that would change the
     * scaler is refused (scaler_enter). */
    const char *busy;
} ScalerObject;

#define SCALER(o) ((ScalerObject *)(o))
#define HEADER_BYTES offsetof(ampc_scaler_block, flags)
#define OPT_STATE_CAPSULE "ampc.GradScaler.opt_state"

static const char *const SCALE_IS_NONE =
    "Attempted %s but _scale is None.  This may indicate your script did not use "
    "scaler.scale(loss or outputs) earlier in the iteration.";

static ampc_state *state_of(PyObject *self) { return ampc_state_from_type(Py_TYPE(self)); }

static int same_device(ampc_device a, ampc_device b) { return a.type == b.type && a.index == b.index; }

static ampc_scale_rule rule_of(const ScalerObject *s)
{
    ampc_scale_rule r = {s->cfg.growth_factor, s->cfg.backoff_factor, s->cfg.min_scale, s->cfg.max_scale,
                         s->cfg.growth_interval, (int32_t)s->cfg.hysteresis};
    return r;
}

/* ------------------------------------------------------------------------ */
/* The memory blocks                                                         */
/* ------------------------------------------------------------------------ */

static void *stream_for(const scaler_memory *m)
{
    return m->device.type != AMPC_DEVICE_CPU ? ampc_current_stream(m->device.index, NULL) : NULL;
}

/* Copy between a block and host memory. */
static int block_copy(ampc_state *st, scaler_memory *m, void *host, void *device_addr, size_t nbytes,
                      int to_host)
{
    const ampc_device cpu = {AMPC_DEVICE_CPU, 0};
    return to_host ? ampc_copy_bytes(st, cpu, host, m->device, device_addr, nbytes, stream_for(m), "GradScaler")
                   : ampc_copy_bytes(st, m->device, device_addr, cpu, host, nbytes, stream_for(m), "GradScaler");
}

static int read_header(ampc_state *st, ScalerObject *self, ampc_scaler_block *out)
{
    return block_copy(st, &self->memory[0], out, self->memory[0].block, HEADER_BYTES, 1);
}

static int write_header(ampc_state *st, ScalerObject *self, ampc_scaler_block *in)
{
    return block_copy(st, &self->memory[0], in, self->memory[0].block, HEADER_BYTES, 0);
}

/* A new block on `device`; the scale's own (master) block when master.
 * 1 (nothing added) when the blocks changed while it was allocated: the
 * allocation may collect garbage, whose finalizers may call the scaler. */
static int add_memory(ampc_state *st, ScalerObject *self, ampc_device device, int master)
{
    const int before = self->nmemory;
    const int64_t shape[1] = {(int64_t)sizeof(ampc_scaler_block)};
    ampc_view v;
    PyObject *owner = ampc_array_empty(st, device, AMPC_UINT8, 1, shape, NULL, &v);
    if (owner == NULL)
        return -1;
    if (self->nmemory != before) {
        Py_DECREF(owner);
        return 1;
    }
    scaler_memory *m = &self->memory[self->nmemory];
    m->device = device;
    m->owner = owner;
    m->block = (ampc_scaler_block *)v.data;
    m->stream = v.stream;
    m->nflags = 0;
    ampc_scaler_block init;
    memset(&init, 0, sizeof init);
    if (master) {  /* checked by check_config: each value fits its field */
        init.scale = (float)self->cfg.scale;
        init.growth_tracker = (int32_t)self->cfg.growth_tracker;
        init.hysteresis_left = (int32_t)self->cfg.hysteresis_left;
        init.steps = self->cfg.steps;
        init.skipped = self->cfg.skipped;
    }
    self->nmemory++;
    if (block_copy(st, m, &init, m->block, sizeof init, 0) < 0) {
        self->nmemory--;
        Py_CLEAR(m->owner);
        return -1;
    }
    return 0;
}

static void drop_memory(ScalerObject *self)
{
    for (int i = 0; i < self->nmemory; i++)
        Py_CLEAR(self->memory[i].owner);
    self->nmemory = 0;
}

/* The block for arrays on `device`: the master block, created on the
 * first device seen, or a second block, created if needed. -1 with
 * ValueError when the devices cannot be combined. */
static int memory_for(ampc_state *st, ScalerObject *self, ampc_device device)
{
    for (;;) {
        for (int i = 0; i < self->nmemory; i++)
            if (same_device(self->memory[i].device, device))
                return i;
        if (self->nmemory > 0) {
            const ampc_device master = self->memory[0].device;
            if (self->nmemory == AMPC_GRADS_MAX_DEVICES ||
                (master.type == AMPC_DEVICE_CUDA && device.type == AMPC_DEVICE_CUDA)) {
                char a[32], b[32];
                PyErr_Format(PyExc_ValueError, "GradScaler: gradients on %s cannot be combined with the scale "
                             "on %s (ampc combines the CPU and one GPU)",
                             ampc_device_str(device, a, sizeof a), ampc_device_str(master, b, sizeof b));
                return -1;
            }
        }
        const int rc = add_memory(st, self, device, self->nmemory == 0);
        if (rc < 0)
            return -1;
        if (rc == 0)
            return self->nmemory - 1;
    }
}

/* Copy the master scale into a second block before its kernels read it. */
static int refresh_scale(ampc_state *st, ScalerObject *self, int m)
{
    if (m == 0)
        return 0;
    float scale;
    if (block_copy(st, &self->memory[0], &scale, &self->memory[0].block->scale, sizeof scale, 1) < 0)
        return -1;
    return block_copy(st, &self->memory[m], &scale, &self->memory[m].block->scale, sizeof scale, 0);
}

/* ------------------------------------------------------------------------ */
/* Per-optimizer states                                                      */
/* ------------------------------------------------------------------------ */

static void opt_state_free(PyObject *capsule)
{
    opt_state *s = PyCapsule_GetPointer(capsule, OPT_STATE_CAPSULE);
    Py_XDECREF(s->divisor);
    PyMem_Free(s);
}

/* The optimizer's state, created READY when `create`: a new reference to
 * its capsule, which the caller holds while it runs Python (an optimizer
 * whose step() calls update() drops the scaler's reference meanwhile; the
 * state then outlives it, as torch's per-optimizer dict does), and the state
 * in *out. NULL without an exception when absent and not created. */
static PyObject *get_opt_state(ScalerObject *self, PyObject *optimizer, int create, opt_state **out)
{
    *out = NULL;
    PyObject *key = PyLong_FromVoidPtr(optimizer);
    if (key == NULL)
        return NULL;
    PyObject *capsule = PyDict_GetItemWithError(self->states, key);  /* int keys: runs no Python */
    if (capsule != NULL) {
        Py_INCREF(capsule);
    }
    else if (!PyErr_Occurred() && create) {
        opt_state *s = PyMem_Calloc(1, sizeof *s);
        if (s == NULL) {
            PyErr_NoMemory();
        }
        else {
            capsule = PyCapsule_New(s, OPT_STATE_CAPSULE, opt_state_free);
            if (capsule == NULL)
                PyMem_Free(s);
            else if (PyDict_SetItem(self->states, key, capsule) < 0)
                Py_CLEAR(capsule);
        }
    }
    Py_DECREF(key);
    if (capsule != NULL)
        *out = PyCapsule_GetPointer(capsule, OPT_STATE_CAPSULE);
    return capsule;
}

static int check_scale(ScalerObject *self, const char *funcname)
{
    if (self->nmemory > 0)
        return 0;
    PyErr_Format(PyExc_AssertionError, SCALE_IS_NONE, funcname);
    return -1;
}

/* ------------------------------------------------------------------------ */
/* Unscaling                                                                 */
/* ------------------------------------------------------------------------ */

/* Where `n` flags per device can go, checked before any kernel runs. */
static int reserve_flags(ScalerObject *self, const int *mem, int ndevices)
{
    for (int d = 0; d < ndevices; d++) {
        if (self->memory[mem[d]].nflags >= AMPC_SCALER_MAX_FLAGS) {
            PyErr_Format(PyExc_RuntimeError, "GradScaler: more than %d inf checks on one device since "
                         "the last update()", AMPC_SCALER_MAX_FLAGS);
            return -1;
        }
    }
    return 0;
}

static PyObject *float32_scalar(ampc_state *st, ampc_device device, float value)
{
    const int64_t shape0[1] = {0};
    ampc_view v;
    PyObject *a = ampc_array_empty(st, device, AMPC_FLOAT32, 0, shape0, NULL, &v);
    if (a == NULL)
        return NULL;
    const ampc_device cpu = {AMPC_DEVICE_CPU, 0};
    if (ampc_copy_bytes(st, device, v.data, cpu, &value, sizeof value, v.stream, "GradScaler") < 0)
        Py_CLEAR(a);
    return a;
}

/* ValueError "<what>, got <value>" (the value as a float: the object's own
 * repr may raise). */
static void bad_number(const char *what, double value)
{
    PyObject *v = PyFloat_FromDouble(value);
    if (v != NULL)
        PyErr_Format(PyExc_ValueError, "%s, got %R", what, v);
    Py_XDECREF(v);
}

/* unscale_(max_norm=...): how to clip, and what comes back. */
typedef struct {
    double max_norm;
    double norm_type;
    int deferred;               /* leave the gradients scaled; the step divides by `divisor` */
    PyObject *norm;             /* out: a 0-d float32 on the gradients' device */
    PyObject *divisor;          /* out, when deferred: likewise */
} clip_request;

static void clip_request_clear(clip_request *clip)
{
    Py_CLEAR(clip->norm);
    Py_CLEAR(clip->divisor);
}

/* The gradients of device slot d were produced on their own streams (a
 * producer's current stream, when read through DLPack's C exchange API).
 * before: make `stream` wait for them; after: make them wait for `stream`,
 * so the producer reads what ampc wrote. Each distinct stream once. */
static int order_grads(ampc_state *st, const ampc_grads *g, int d, void *stream, int before)
{
    ampc_streams_seen seen = {0};
    for (int64_t i = 0; i < g->n; i++) {
        const ampc_view *v = &g->entries[i].view;
        if (g->entries[i].device_slot == d &&
            ampc_order_stream(st, v->device.index, stream, v->stream, before, &seen) < 0)
            return -1;
    }
    return 0;
}

/* One device's gradients: check and (unless check_only) unscale them by
 * the block's scale, through the device's backend; with a clip request,
 * clip them in the same passes (cuda/scaler.cu fuses them; the CPU takes the
 * norm, then one read and write per element). The norm (and a deferred
 * divisor) are new 0-d float32 arrays on that device, so nothing waits.
 * block NULL: gradients that are not scaled. The caller orders the
 * gradients' streams around it. */
static int unscale_on(ampc_state *st, ampc_device device, void *stream, const ampc_grad_ref *refs, int64_t count,
                      ampc_scaler_block *block, int slot, int check_only, clip_request *clip)
{
    ampc_view norm, divisor;
    if (clip != NULL) {
        clip->norm = ampc_array_empty(st, device, AMPC_FLOAT32, 0, NULL, NULL, &norm);
        if (clip->norm == NULL)
            return -1;
        if (clip->deferred &&
            (clip->divisor = ampc_array_empty(st, device, AMPC_FLOAT32, 0, NULL, NULL, &divisor)) == NULL)
            return -1;
    }
    const ampc_backend *b = ampc_backend_of(st, device);
    PyThreadState *released = b->runs_without_gil ? PyEval_SaveThread() : NULL;
    const int status = clip != NULL
                           ? b->unscale_clip(device.index, stream, refs, count, block, slot, clip->max_norm,
                                             clip->norm_type, (float *)norm.data,
                                             clip->deferred ? (float *)divisor.data : NULL)
                           : b->unscale(device.index, stream, refs, count, block, slot, check_only);
    if (released != NULL)
        PyEval_RestoreThread(released);
    return status == AMPC_OK ? 0 : ampc_backend_raise(st, device, status, "unscale_");
}

/* unscale_(max_norm=) on a disabled scaler: clip only (never deferred: a
 * disabled scaler's step() is the optimizer's own). */
static PyObject *clip_unscaled(ampc_state *st, PyObject *optimizer, clip_request *clip)
{
    ampc_grads g = {0};
    int rc = -1;
    clip->deferred = 0;
    if (ampc_grads_collect(st, optimizer, 1, 1, &g) < 0)
        return NULL;
    if (g.ndevices > 1) {
        PyErr_SetString(PyExc_ValueError, "unscale_(max_norm=...): the gradients must be on one device");
    }
    else if (g.ndevices == 1 && g.devices[0].type != AMPC_DEVICE_CPU) {
        void *stream = ampc_current_stream(g.devices[0].index, NULL);
        rc = order_grads(st, &g, 0, stream, 1) == 0 &&
                     unscale_on(st, g.devices[0], stream, g.refs, g.n, NULL, 0, 0, clip) == 0 &&
                     order_grads(st, &g, 0, stream, 0) == 0
                 ? 0 : -1;
    }
    else {
        const ampc_device cpu = {AMPC_DEVICE_CPU, 0};
        rc = unscale_on(st, cpu, NULL, g.refs, g.n, NULL, 0, 0, clip);
    }
    if (rc == 0)
        ampc_grads_count_writes(st, &g);
    ampc_grads_release(&g);
    if (rc < 0)
        clip_request_clear(clip);
    PyObject *norm = clip->norm;
    clip->norm = NULL;
    return norm;
}

/* Check (and unless check_only, unscale) the optimizer's gradients, device
 * by device, recording a flag slot per device in `os`. With a clip request
 * (one device only), clip to the total norm in the same passes. */
static int unscale_grads(ampc_state *st, ScalerObject *self, PyObject *optimizer, opt_state *os,
                         int check_only, int allow_fp16, clip_request *clip)
{
    ampc_grads g = self->scratch;  /* moved out while in use, and back at the end */
    memset(&self->scratch, 0, sizeof self->scratch);
    int mem[AMPC_GRADS_MAX_DEVICES];
    int rc = -1;
    if (ampc_grads_collect(st, optimizer, allow_fp16, !check_only, &g) < 0)
        goto done;
    for (int d = 0; d < g.ndevices; d++)
        if ((mem[d] = memory_for(st, self, g.devices[d])) < 0)
            goto done;
    if (reserve_flags(self, mem, g.ndevices) < 0)
        goto done;
    if (clip != NULL && g.ndevices > 1) {
        PyErr_SetString(PyExc_ValueError, "unscale_(max_norm=...): the gradients must be on one device");
        goto done;
    }

    os->nfound = 0;
    for (int d = 0; d < g.ndevices; d++) {
        scaler_memory *m = &self->memory[mem[d]];
        const ampc_grad_ref *refs = g.refs + g.first[d];
        const int64_t count = g.count[d];
        if (!check_only && refresh_scale(st, self, mem[d]) < 0)
            goto done;
        const int slot = m->nflags++;
        os->found[os->nfound].memory = mem[d];
        os->found[os->nfound].slot = slot;
        os->nfound++;
        if (m->device.type == AMPC_DEVICE_CPU) {
            if (unscale_on(st, m->device, NULL, refs, count, m->block, slot, check_only, clip) < 0)
                goto done;
            continue;
        }
        void *stream = stream_for(m);
        if (order_grads(st, &g, d, stream, 1) < 0 ||
            unscale_on(st, m->device, stream, refs, count, m->block, slot, check_only, clip) < 0)
            goto done;
        m->stream = stream;
        if (!check_only && order_grads(st, &g, d, stream, 0) < 0)
            goto done;
    }
    if (clip != NULL && clip->norm == NULL) {  /* no gradients: the norm of nothing, nothing to divide */
        clip->norm = float32_scalar(st, self->memory[0].device, 0.0f);
        if (clip->norm == NULL)
            goto done;
    }
    if (!check_only)
        ampc_grads_count_writes(st, &g);
    rc = 0;
done:
    if (rc < 0 && clip != NULL)
        clip_request_clear(clip);
    ampc_grads_clear(&g);
    if (self->scratch.entries == NULL)
        self->scratch = g;
    else
        ampc_grads_release(&g);
    return rc;
}

/* The value of one flag, read on the host (waits for a GPU). */
static int read_flag(ampc_state *st, ScalerObject *self, int m, int slot, float *out)
{
    scaler_memory *mem = &self->memory[m];
    return block_copy(st, mem, out, &mem->block->flags[slot], sizeof *out, 1);
}

/* A new 0-d float32 array (an ndarray or an ampc.Array) holding one float
 * of a block (the scale or a flag). A copy, never a
 * view: what the caller keeps must not change when the scaler's memory does
 * (a found_inf kept across steps, a scale torch's autograd saves for
 * backward). On a GPU the copy is queued on the block's stream. */
static PyObject *float_copy(ampc_state *st, ScalerObject *self, int m, const float *addr)
{
    scaler_memory *mem = &self->memory[m];
    ampc_view v;
    PyObject *out = ampc_array_empty(st, mem->device, AMPC_FLOAT32, 0, NULL, NULL, &v);
    if (out == NULL)
        return NULL;
    if (mem->device.type == AMPC_DEVICE_CPU) {
        memcpy(v.data, addr, sizeof *addr);
        return out;
    }
    void *stream = stream_for(mem);
    ampc_streams_seen before = {0}, after = {0};
    if (ampc_order_stream(st, mem->device.index, stream, v.stream, 1, &before) < 0 ||
        ampc_copy_bytes(st, mem->device, v.data, mem->device, addr, sizeof *addr, stream, "GradScaler") < 0 ||
        ampc_order_stream(st, mem->device.index, stream, v.stream, 0, &after) < 0)
        Py_CLEAR(out);
    return out;
}

/* `array` (stolen) as the type `like` (a new reference, also stolen; NULL:
 * as it is). */
static PyObject *as_like(ampc_state *st, PyObject *array, PyTypeObject *like)
{
    PyObject *out = like != NULL && array != NULL ? ampc_return_as(st, array, like) : array;
    Py_XDECREF(like);
    return out;
}

/* ------------------------------------------------------------------------ */
/* Construction                                                              */
/* ------------------------------------------------------------------------ */

/* torch's defaults, no bounds, hysteresis 1, nothing counted yet. */
static const scaler_config DEFAULT_CONFIG = {
    .enabled = 1, .cuda = 1, .growth_factor = 2.0, .backoff_factor = 0.5, .growth_interval = 2000,
    .min_scale = 0.0, .max_scale = INFINITY, .hysteresis = 1, .scale = 65536.0, .growth_tracker = 0,
    .hysteresis_left = 1, .steps = 0, .skipped = 0,
};

static PyObject *Scaler_new(PyTypeObject *type, PyObject *Py_UNUSED(args), PyObject *Py_UNUSED(kwargs))
{
    ScalerObject *self = (ScalerObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->cfg = DEFAULT_CONFIG;
    self->states = PyDict_New();
    self->lock = PyThread_allocate_lock();
    if (self->states == NULL || self->lock == NULL) {
        if (self->lock == NULL && !PyErr_Occurred())
            PyErr_NoMemory();
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

/* A Python number (int or float, not bool) as a double; TypeError naming
 * `name` otherwise. The value is checked by check_config, never converted
 * to an integer. */
static int as_double(PyObject *obj, const char *name, double *out)
{
    if (!PyNumber_Check(obj) || PyBool_Check(obj) || PyComplex_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "GradScaler: %s must be a number, got %.200s", name,
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    *out = PyFloat_AsDouble(obj);
    return (*out == -1.0 && PyErr_Occurred()) ? -1 : 0;
}

/* A Python int (or an integer type with __index__, such as NumPy's; not a
 * float, not bool) as an int64; TypeError or ValueError naming `name`. */
static int as_int64(PyObject *obj, const char *name, int64_t *out)
{
    if (!PyIndex_Check(obj) || PyBool_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "GradScaler: %s must be an int, got %.200s", name,
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    PyObject *index = PyNumber_Index(obj);
    if (index == NULL)
        return -1;
    int overflow;
    const long long v = PyLong_AsLongLongAndOverflow(index, &overflow);
    if (overflow != 0)
        PyErr_Format(PyExc_ValueError, "GradScaler: %s is out of range, got %S", name, index);
    Py_DECREF(index);
    if (overflow != 0 || (v == -1 && PyErr_Occurred()))
        return -1;
    *out = v;
    return 0;
}

/* PyErr_Format knows no floating-point conversions: format with the C
 * library, then raise. */
static void value_error(const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    PyErr_SetString(PyExc_ValueError, msg);
}

/* The growth and backoff factors as the setters take them: what torch's
 * setters and load_state_dict accept that has a meaning, 1.0 included (it
 * holds the scale where it is), nothing that would make it zero, negative,
 * inf or NaN. */
static int check_growth_factor(double v)
{
    if (isfinite(v) && v >= 1.0)
        return 0;
    value_error("GradScaler: growth_factor must be a finite number >= 1.0 (1.0 never grows the scale), got %g", v);
    return -1;
}

static int check_backoff_factor(double v)
{
    if (v > 0.0 && v <= 1.0)
        return 0;
    value_error("GradScaler: backoff_factor must be in (0, 1] (1.0 never backs the scale off), got %g", v);
    return -1;
}

static int check_growth_interval(int64_t v)
{
    if (v >= 0)
        return 0;
    PyErr_Format(PyExc_ValueError, "GradScaler: growth_interval must be >= 0 (0 never grows the scale), got %lld",
                 (long long)v);
    return -1;
}

/* Whether an integer field lies in [lo, hi]; ValueError naming it if not. */
static int check_range(const char *name, int64_t v, int64_t lo, int64_t hi)
{
    if (v >= lo && v <= hi)
        return 0;
    PyErr_Format(PyExc_ValueError, "GradScaler: %s must be in %lld .. %lld, got %lld", name, (long long)lo,
                 (long long)hi, (long long)v);
    return -1;
}

/* Every way into a scaler's configuration checks it here, before anything
 * is changed. A disabled scaler has no options to check (torch keeps none).
 * `constructor`: torch's two assertions too, which its setters and
 * load_state_dict do not make; their error is both an AssertionError and a
 * ValueError (and survives python -O). */
static int check_config(ampc_state *st, const scaler_config *c, int constructor)
{
    if (!c->enabled)
        return 0;
    if (constructor && !(c->growth_factor > 1.0)) {
        PyErr_SetString(st->argument_error, "The growth factor must be > 1.0.");
        return -1;
    }
    if (constructor && !(c->backoff_factor < 1.0)) {
        PyErr_SetString(st->argument_error, "The backoff factor must be < 1.0.");
        return -1;
    }
    if (check_growth_factor(c->growth_factor) < 0 || check_backoff_factor(c->backoff_factor) < 0 ||
        check_growth_interval(c->growth_interval) < 0)
        return -1;
    /* In float32, as the scale is held: 1e-50 would round to 0. */
    if (!(c->scale > 0.0 && c->scale <= FLT_MAX && (float)c->scale > 0.0f)) {
        value_error("GradScaler: the scale must be a positive finite float32, got %g", c->scale);
        return -1;
    }
    if (!(c->min_scale >= 0.0 && isfinite(c->min_scale) && c->max_scale >= c->min_scale)) {
        value_error("GradScaler: need 0 <= min_scale <= max_scale, got %g and %g", c->min_scale, c->max_scale);
        return -1;
    }
    if (c->scale < c->min_scale || c->scale > c->max_scale) {
        value_error("GradScaler: the scale %g is outside [min_scale, max_scale] = [%g, %g]", c->scale, c->min_scale,
                    c->max_scale);
        return -1;
    }
    if (c->hysteresis < 1 || c->hysteresis > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "GradScaler: hysteresis must be at least 1, got %lld",
                     (long long)c->hysteresis);
        return -1;
    }
    return check_range("_growth_tracker", c->growth_tracker, 0, INT32_MAX) < 0 ||
                   check_range("hysteresis_left", c->hysteresis_left, 0, c->hysteresis) < 0 ||
                   check_range("steps", c->steps, 0, INT64_MAX) < 0 ||
                   check_range("skipped_steps", c->skipped, 0, c->steps) < 0
               ? -1 : 0;
}

/* Make `c` (checked) the scaler's configuration, its memory and
 * per-optimizer states dropped: the next scale() starts from it. */
static void reset_to(ScalerObject *self, const scaler_config *c)
{
    drop_memory(self);
    PyDict_Clear(self->states);  /* int keys and ampc's capsules: runs no Python */
    self->cfg = *c;
}

static int cuda_available(int *available)
{
    PyObject *cuda = PyImport_ImportModule("ampc.cuda");
    PyObject *avail = cuda ? PyObject_CallMethod(cuda, "is_available", NULL) : NULL;
    Py_XDECREF(cuda);
    if (avail == NULL)
        return -1;
    *available = PyObject_IsTrue(avail);
    Py_DECREF(avail);
    return *available < 0 ? -1 : 0;
}

static int Scaler_init(PyObject *op, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"device", "init_scale", "growth_factor", "backoff_factor", "growth_interval",
                             "enabled", "min_scale", "max_scale", "hysteresis", NULL};
    ScalerObject *self = SCALER(op);
    ampc_state *st = state_of(op);
    PyObject *device = NULL, *init_scale = NULL, *growth = NULL, *backoff = NULL, *interval = NULL,
             *min_scale = Py_None, *max_scale = Py_None, *hysteresis = NULL;
    int enabled = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|OOOOOp$OOO:GradScaler", kwlist, &device, &init_scale,
                                     &growth, &backoff, &interval, &enabled, &min_scale, &max_scale,
                                     &hysteresis))
        return -1;
    scaler_config c = DEFAULT_CONFIG;  /* parsed into a copy: a failure leaves self as it was */
    if (device != NULL) {
        if (!PyUnicode_Check(device)) {
            PyErr_Format(PyExc_TypeError, "GradScaler: device must be a str such as 'cuda' or 'cpu', got "
                         "%.200s", Py_TYPE(device)->tp_name);
            return -1;
        }
        if (PyUnicode_CompareWithASCIIString(device, "cpu") == 0)
            c.cuda = 0;
        else if (PyUnicode_CompareWithASCIIString(device, "cuda") != 0)
            return ampc_raise_with_repr(PyExc_ValueError, "%s: device must be 'cuda' or 'cpu', got %U", "GradScaler",
                                        device);
    }
    if ((init_scale && as_double(init_scale, "init_scale", &c.scale) < 0) ||
        (growth && as_double(growth, "growth_factor", &c.growth_factor) < 0) ||
        (backoff && as_double(backoff, "backoff_factor", &c.backoff_factor) < 0) ||
        (interval && as_int64(interval, "growth_interval", &c.growth_interval) < 0) ||
        (min_scale != Py_None && as_double(min_scale, "min_scale", &c.min_scale) < 0) ||
        (max_scale != Py_None && as_double(max_scale, "max_scale", &c.max_scale) < 0) ||
        (hysteresis && as_int64(hysteresis, "hysteresis", &c.hysteresis) < 0))
        return -1;
    c.enabled = enabled;
    if (c.enabled && c.cuda) {
        int available;
        if (cuda_available(&available) < 0)
            return -1;
        if (!available) {
            if (PyErr_WarnEx(PyExc_UserWarning, "ampc.GradScaler is enabled, but CUDA is not available.  "
                             "Disabling.", 1) < 0)
                return -1;
            c.enabled = 0;
        }
    }
    c.hysteresis_left = c.hysteresis;
    if (check_config(st, &c, 1) < 0)
        return -1;
    reset_to(self, &c);
    return 0;
}

static int Scaler_traverse(PyObject *op, visitproc visit, void *arg)
{
    ScalerObject *self = SCALER(op);
    Py_VISIT(Py_TYPE(op));
    Py_VISIT(self->states);
    for (int i = 0; i < self->nmemory; i++)
        Py_VISIT(self->memory[i].owner);
    return 0;
}

static int Scaler_clear(PyObject *op)
{
    ScalerObject *self = SCALER(op);
    Py_CLEAR(self->states);
    drop_memory(self);
    ampc_grads_release(&self->scratch);
    return 0;
}

static void Scaler_dealloc(PyObject *op)
{
    PyTypeObject *type = Py_TYPE(op);
    PyObject_GC_UnTrack(op);
    Scaler_clear(op);
    if (SCALER(op)->lock != NULL)
        PyThread_free_lock(SCALER(op)->lock);
    type->tp_free(op);
    Py_DECREF(type);
}

/* ------------------------------------------------------------------------ */
/* scale                                                                     */
/* ------------------------------------------------------------------------ */

static int is_array(ampc_state *st, PyObject *obj)
{
    return PyArray_Check(obj) || PyArray_IsScalar(obj, Generic) || ampc_is_array(st, obj) ||
           PyObject_HasAttrString(obj, "__dlpack_device__");
}

/* The device an array lives on, without asking for its memory (a torch loss
 * that requires grad refuses to be exported). */
static int array_device(ampc_state *st, PyObject *obj, const char *argname, ampc_device *dev)
{
    *dev = (ampc_device){AMPC_DEVICE_CPU, 0};
    if (PyArray_Check(obj) || PyArray_IsScalar(obj, Generic))
        return 0;
    if (ampc_is_array(st, obj)) {
        *dev = ampc_array_view(obj)->device;
        return 0;
    }
    return ampc_dlpack_device(st, obj, argname, dev);
}

/* outputs * scale for one array. torch tensors multiply with torch's own
 * operator, so the result still backpropagates; other arrays with ampc's
 * kernel, in torch's result dtype: a 0-d float16/bfloat16 loss becomes
 * float32, an N-d tensor keeps its dtype. */
static PyObject *scale_one(ampc_state *st, ScalerObject *self, PyObject *outputs)
{
    ampc_device dev;
    if (array_device(st, outputs, "scale: outputs", &dev) < 0)
        return NULL;
    const int m = memory_for(st, self, dev);
    if (m < 0 || refresh_scale(st, self, m) < 0)
        return NULL;
    float *scale_addr = &self->memory[m].block->scale;
    if (ampc_is_torch_type(Py_TYPE(outputs), NULL)) {
        PyObject *scale = as_like(st, float_copy(st, self, m, scale_addr),
                                  (PyTypeObject *)Py_NewRef(Py_TYPE(outputs)));
        if (scale == NULL)
            return NULL;
        PyObject *r = PyNumber_Multiply(outputs, scale);
        Py_DECREF(scale);
        return r;
    }
    ampc_view x, out;
    if (ampc_view_from_object(st, outputs, "scale: outputs", AMPC_FOR_READING, &x) < 0)
        return NULL;
    PyObject *result = NULL;
    if (!same_device(x.device, dev)) {
        /* the kernel below runs on dev: the CPU's loop must not read GPU memory, nor a GPU's host memory */
        char said[32], is[32];
        PyErr_Format(PyExc_BufferError, "scale: outputs: __dlpack_device__() says %s, but its memory is on %s",
                     ampc_device_str(dev, said, sizeof said), ampc_device_str(x.device, is, sizeof is));
        goto done;
    }
    if (!AMPC_DTYPE_IS_FLOAT(x.dtype)) {
        PyErr_Format(PyExc_TypeError, "scale: outputs has dtype %s; a loss is floating",
                     ampc_dtype_names[x.dtype]);
        goto done;
    }
    ampc_dtype dtype = x.dtype;
    if (x.ndim == 0 && (dtype == AMPC_FLOAT16 || dtype == AMPC_BFLOAT16))
        dtype = AMPC_FLOAT32;
    PyObject *fresh = ampc_empty_like(st, &x, dtype, &out);
    if (fresh == NULL)
        goto done;
    char *data[2] = {out.data, x.data};
    const int64_t *strides[2] = {out.strides, x.strides};
    ampc_loop loop;
    ampc_loop_init(&loop, 2, x.ndim, x.shape, data, strides);
    void *stream = stream_for(&self->memory[m]);
    ampc_streams_seen seen = {0};
    if (dev.type != AMPC_DEVICE_CPU && ampc_order_stream(st, dev.index, stream, x.stream, 1, &seen) < 0) {
        Py_DECREF(fresh);
        goto done;
    }
    const int status = ampc_backend_of(st, dev)->scale_mul(dev.index, stream, &loop, dtype, x.dtype, scale_addr);
    if (status != AMPC_OK) {
        Py_DECREF(fresh);
        ampc_backend_raise(st, dev, status, "scale");
        goto done;
    }
    result = ampc_return_as(st, fresh, x.source);
    if (result != NULL && PyArray_IsScalar(outputs, Generic) && PyArray_Check(result))
        result = PyArray_Return((PyArrayObject *)result);  /* a NumPy scalar in, a NumPy scalar out */
done:
    ampc_view_release(&x);
    return result;
}

static PyObject *scale_nested(ampc_state *st, PyObject *op, PyObject *outputs);

/* A list or tuple rebuilt as the same type, each item scaled. The items are
 * held in a tuple of their own first: scaling runs the caller's code
 * (__dlpack__, torch's multiply), which may change a list while it is read. */
static PyObject *scale_sequence(ampc_state *st, PyObject *op, PyObject *outputs)
{
    PyObject *items = PySequence_Tuple(outputs);
    if (items == NULL)
        return NULL;
    const Py_ssize_t n = PyTuple_GET_SIZE(items);
    PyObject *scaled = PyList_New(n);
    for (Py_ssize_t i = 0; scaled != NULL && i < n; i++) {
        PyObject *v = scale_nested(st, op, PyTuple_GET_ITEM(items, i));
        if (v == NULL)
            Py_CLEAR(scaled);
        else
            PyList_SET_ITEM(scaled, i, v);
    }
    Py_DECREF(items);
    if (scaled == NULL || PyList_Check(outputs))
        return scaled;
    PyObject *t = PyList_AsTuple(scaled);
    Py_DECREF(scaled);
    return t;
}

static PyObject *scale_nested(ampc_state *st, PyObject *op, PyObject *outputs)
{
    ScalerObject *self = SCALER(op);
    if (is_array(st, outputs))
        return scale_one(st, self, outputs);
    if (PyList_Check(outputs) || PyTuple_Check(outputs)) {
        /* A list that holds itself, or a million nested tuples: RecursionError, as torch's walk
         * raises, not the C stack's end. */
        if (Py_EnterRecursiveCall(" in GradScaler.scale"))
            return NULL;
        PyObject *r = scale_sequence(st, op, outputs);
        Py_LeaveRecursiveCall();
        return r;
    }
    /* Any other iterable comes back as a lazy map, as in torch; not a string, whose characters are
     * strings again (torch's map recurses until a RecursionError when it is read). */
    PyObject *iter = PyUnicode_Check(outputs) || PyBytes_Check(outputs) ? NULL : PyObject_GetIter(outputs);
    if (iter == NULL) {
        if (PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_TypeError))
            return NULL;  /* the object's own __iter__ raised: its error, not ours */
        PyErr_Clear();
        PyErr_SetString(PyExc_ValueError, "outputs must be a Tensor or an iterable of Tensors");
        return NULL;
    }
    Py_DECREF(iter);
    PyObject *method = PyObject_GetAttrString(op, "scale");
    if (method == NULL)
        return NULL;
    PyObject *map = PyObject_CallFunctionObjArgs((PyObject *)&PyMap_Type, method, outputs, NULL);
    Py_DECREF(method);
    return map;
}

static PyObject *Scaler_scale(PyObject *op, PyObject *outputs)
{
    if (!SCALER(op)->cfg.enabled)
        return Py_NewRef(outputs);
    return scale_nested(state_of(op), op, outputs);
}

/* ------------------------------------------------------------------------ */
/* unscale_, step, update                                                    */
/* ------------------------------------------------------------------------ */

static PyTypeObject *param_type(ampc_state *st, PyObject *optimizer);

/* The legacy fused-optimizer contract: step(..., grad_scaler=self). */
static int takes_grad_scaler(PyObject *optimizer)
{
    PyObject *amp = PyImport_ImportModule("ampc.amp");
    PyObject *r = amp ? PyObject_CallMethod(amp, "_step_takes_grad_scaler", "O", optimizer) : NULL;
    Py_XDECREF(amp);
    if (r == NULL)
        return -1;
    const int yes = PyObject_IsTrue(r);
    Py_DECREF(r);
    return yes;
}

enum { AMP_PLAIN, AMP_FUSED, AMP_LEGACY };

/* How an optimizer takes part in scaling: AMP_PLAIN, the scaler unscales
 * and skips for it; AMP_FUSED, it takes grad_scale and found_inf itself
 * (torch's _step_supports_amp_scaling); AMP_LEGACY, step(grad_scaler=self).
 * -1 on error. */
static int amp_kind(PyObject *optimizer)
{
    PyObject *supports = PyObject_GetAttrString(optimizer, "_step_supports_amp_scaling");
    const int fused = supports != NULL && PyObject_IsTrue(supports) == 1;
    Py_XDECREF(supports);
    PyErr_Clear();
    if (!fused)
        return AMP_PLAIN;
    const int legacy = takes_grad_scaler(optimizer);
    return legacy < 0 ? -1 : legacy ? AMP_LEGACY : AMP_FUSED;
}

static PyObject *Scaler_unscale_(PyObject *op, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"optimizer", "max_norm", "norm_type", "defer", NULL};
    ScalerObject *self = SCALER(op);
    ampc_state *st = state_of(op);
    PyObject *optimizer, *max_norm_obj = Py_None, *norm_type_obj = NULL, *norm = NULL;
    int defer = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|$OOp:unscale_", kwlist, &optimizer, &max_norm_obj,
                                     &norm_type_obj, &defer))
        return NULL;
    double max_norm = 0, norm_type = 2.0;
    if (max_norm_obj != Py_None) {
        if (as_double(max_norm_obj, "max_norm", &max_norm) < 0)
            return NULL;
        if (!(max_norm > 0) || !isfinite(max_norm)) {
            bad_number("unscale_: max_norm must be positive and finite", max_norm);
            return NULL;
        }
    }
    if (norm_type_obj != NULL) {
        if (as_double(norm_type_obj, "norm_type", &norm_type) < 0)
            return NULL;
        if (!(norm_type > 0)) {
            bad_number("unscale_: norm_type must be positive (or inf)", norm_type);
            return NULL;
        }
    }
    if (defer && max_norm == 0) {
        PyErr_SetString(PyExc_ValueError, "unscale_: defer=True defers clipping and needs max_norm");
        return NULL;
    }
    clip_request clip = {max_norm, norm_type, defer, NULL, NULL};
    if (!self->cfg.enabled) {
        if (max_norm == 0)
            Py_RETURN_NONE;
        /* Disabled, the gradients are not scaled, but clipping still clips:
         * the same user code runs with and without mixed precision. */
        norm = clip_unscaled(st, optimizer, &clip);
        return as_like(st, norm, norm ? param_type(st, optimizer) : NULL);
    }
    if (check_scale(self, "unscale_") < 0)
        return NULL;
    opt_state *os;
    PyObject *held = get_opt_state(self, optimizer, 1, &os);
    if (held == NULL)
        return NULL;
    if (os->stage == UNSCALED) {
        PyErr_SetString(PyExc_RuntimeError, "unscale_() has already been called on this optimizer since the "
                        "last update().");
        goto fail;
    }
    if (os->stage == STEPPED) {
        PyErr_SetString(PyExc_RuntimeError, "unscale_() is being called after step().");
        goto fail;
    }
    if (defer) {
        /* Only an optimizer that divides by grad_scale itself can take the
         * division over; for any other, clip now. */
        const int kind = amp_kind(optimizer);
        if (kind < 0)
            goto fail;
        clip.deferred = kind == AMP_FUSED;
    }
    if (unscale_grads(st, self, optimizer, os, 0, 0, max_norm > 0 ? &clip : NULL) < 0)
        goto fail;
    os->stage = UNSCALED;
    Py_XSETREF(os->divisor, clip.divisor);
    Py_DECREF(held);
    norm = clip.norm;
    if (norm == NULL)
        Py_RETURN_NONE;
    /* The norm comes back as the gradients' own array type, as clip_grad_norm_'s does. */
    return as_like(st, norm, param_type(st, optimizer));
fail:
    Py_DECREF(held);
    return NULL;
}

/* Whether any inf check recorded for this optimizer found an inf or NaN
 * (waits for a GPU). */
static int any_found(ampc_state *st, ScalerObject *self, const opt_state *os, int *found)
{
    *found = 0;
    for (int i = 0; i < os->nfound; i++) {
        float f;
        if (read_flag(st, self, os->found[i].memory, os->found[i].slot, &f) < 0)
            return -1;
        if (f != 0.0f)
            *found = 1;
    }
    return 0;
}

/* The optimizer's first parameter's array type (a new reference, or NULL
 * without an exception where there is none): grad_scale and found_inf are
 * handed over in its library's array type (torch for torch optimizers; an
 * ampc.Parameter's, the type of the array it holds). */
static PyTypeObject *param_type(ampc_state *st, PyObject *optimizer)
{
    PyObject *groups = PyObject_GetAttrString(optimizer, "param_groups");
    PyTypeObject *type = NULL;
    if (groups && PySequence_Check(groups) && PySequence_Size(groups) > 0) {
        PyObject *g = PySequence_GetItem(groups, 0);
        PyObject *params = g ? PyMapping_GetItemString(g, "params") : NULL;
        PyObject *p = params && PySequence_Check(params) && PySequence_Size(params) > 0 ? PySequence_GetItem(params, 0)
                                                                                       : NULL;
        if (p != NULL) {
            PyObject *data = ampc_is_parameter(st, p) ? Py_NewRef(((ampc_parameter *)p)->data)
                             : PyObject_HasAttrString(p, "__dlpack__") ? Py_NewRef(p) : PyObject_GetAttrString(p, "data");
            if (data != NULL) {
                type = (PyTypeObject *)Py_NewRef(Py_TYPE(data));  /* held: `data` may be its last instance */
                Py_DECREF(data);
            }
        }
        Py_XDECREF(p);
        Py_XDECREF(params);
        Py_XDECREF(g);
    }
    Py_XDECREF(groups);
    PyErr_Clear();
    return type;
}

/* found_inf for an optimizer that takes it: a new 0-d float32 on the
 * scale's device holding the sum of its checks (or the int 0 without any),
 * as torch's sum of the per-device flags is. */
static PyObject *combined_found(ampc_state *st, ScalerObject *self, const opt_state *os)
{
    if (os->nfound == 0)
        return PyLong_FromLong(0);
    if (os->nfound == 1 && os->found[0].memory == 0)  /* the common case: copied on the device, no wait */
        return float_copy(st, self, 0, &self->memory[0].block->flags[os->found[0].slot]);
    /* Several devices: summed on the host (a wait). */
    float sum = 0;
    for (int i = 0; i < os->nfound; i++) {
        float f;
        if (read_flag(st, self, os->found[i].memory, os->found[i].slot, &f) < 0)
            return NULL;
        sum += f;
    }
    return float32_scalar(st, self->memory[0].device, sum);
}

static PyObject *call_step(PyObject *optimizer, PyObject *args, PyObject *kwargs)
{
    PyObject *step = PyObject_GetAttrString(optimizer, "step");
    if (step == NULL)
        return NULL;
    PyObject *r = PyObject_Call(step, args, kwargs);
    Py_DECREF(step);
    return r;
}

/* optimizer.step(), with the scaler open to any call from it: the scaler's
 * part of step() is done by then, and what it does after holds only its own
 * references (the optimizer's state, found_inf). torch's legacy fused
 * optimizers call back into the scaler from their step, and an optimizer
 * may well call update() there. */
static PyObject *step_unguarded(ScalerObject *self, PyObject *optimizer, PyObject *args, PyObject *kwargs)
{
    const char *busy = self->busy;
    self->busy = NULL;
    PyObject *r = call_step(optimizer, args, kwargs);
    self->busy = busy;
    return r;
}

static PyObject *with_found(PyObject *retval, int return_found_inf, PyObject *found)
{
    if (retval == NULL || !return_found_inf)
        return retval;
    PyObject *t = PyTuple_Pack(2, retval, found);
    Py_DECREF(retval);
    return t;
}

static PyObject *Scaler_step(PyObject *op, PyObject *args, PyObject *kwargs)
{
    ScalerObject *self = SCALER(op);
    ampc_state *st = state_of(op);
    PyObject *optimizer, *rest = NULL, *kw = NULL, *retval = NULL, *result = NULL, *found = NULL, *held = NULL;
    PyTypeObject *like = NULL;
    if (PyTuple_GET_SIZE(args) < 1) {
        PyErr_SetString(PyExc_TypeError, "step() missing required argument: 'optimizer'");
        return NULL;
    }
    optimizer = PyTuple_GET_ITEM(args, 0);
    rest = PyTuple_GetSlice(args, 1, PyTuple_GET_SIZE(args));
    kw = kwargs ? PyDict_Copy(kwargs) : PyDict_New();
    if (rest == NULL || kw == NULL)
        goto done;
    int return_found_inf = 0;
    PyObject *rfi = PyDict_GetItemString(kw, "return_found_inf");
    if (rfi != NULL) {
        return_found_inf = PyObject_IsTrue(rfi);
        if (return_found_inf < 0 || PyDict_DelItemString(kw, "return_found_inf") < 0)
            goto done;
    }
    if (!self->cfg.enabled) {
        result = with_found(call_step(optimizer, rest, kw), return_found_inf, Py_False);
        goto done;
    }
    if (PyDict_GetItemString(kw, "closure") != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Closure use is not currently supported if GradScaler is enabled.");
        goto done;
    }
    if (check_scale(self, "step") < 0)
        goto done;
    opt_state *os;
    held = get_opt_state(self, optimizer, 1, &os);
    if (held == NULL)
        goto done;
    if (os->stage == STEPPED) {
        PyErr_SetString(PyExc_RuntimeError, "step() has already been called since the last update().");
        goto done;
    }

    const int kind = amp_kind(optimizer);
    if (kind < 0)
        goto done;
    if (kind == AMP_LEGACY) {
        if (PyErr_WarnEx(PyExc_FutureWarning,
                         "GradScaler is going to stop passing itself as a keyword argument to the passed "
                         "optimizer. In the near future GradScaler registers `grad_scale: Tensor` and "
                         "`found_inf: Tensor` to the passed optimizer and let the optimizer use them "
                         "directly.", 1) < 0 ||
            PyDict_SetItemString(kw, "grad_scaler", op) < 0)
            goto done;
        retval = step_unguarded(self, optimizer, rest, kw);
        if (retval != NULL)
            os->stage = STEPPED;
        result = with_found(retval, return_found_inf, Py_False);
        goto done;
    }
    if (kind == AMP_FUSED) {
        if (os->stage == READY && unscale_grads(st, self, optimizer, os, 1, 1, NULL) < 0)
            goto done;
        like = param_type(st, optimizer);
        found = combined_found(st, self, os);
        if (found != NULL && like != NULL && !PyLong_Check(found))
            found = as_like(st, found, (PyTypeObject *)Py_NewRef(like));
        if (found == NULL)
            goto done;
        PyObject *grad_scale;
        if (os->stage == UNSCALED && os->divisor == NULL) {
            /* Already unscaled: the optimizer must not divide again. */
            grad_scale = PyObject_HasAttrString(optimizer, "grad_scale")
                             ? PyObject_GetAttrString(optimizer, "grad_scale") : Py_NewRef(Py_None);
        }
        else {
            /* Still scaled: the scale, or after a deferred clip the scale
             * over the clipping coefficient. */
            grad_scale = os->divisor != NULL ? Py_NewRef(os->divisor)
                                             : float_copy(st, self, 0, &self->memory[0].block->scale);
            grad_scale = as_like(st, grad_scale, like ? (PyTypeObject *)Py_NewRef(like) : NULL);
            if (grad_scale != NULL && PyObject_HasAttrString(optimizer, "grad_scale")) {
                PyObject *user = PyObject_GetAttrString(optimizer, "grad_scale");
                PyObject *product = user ? PyNumber_Multiply(grad_scale, user) : NULL;
                Py_XDECREF(user);
                Py_SETREF(grad_scale, product);
            }
        }
        if (grad_scale == NULL)
            goto done;
        const int set = PyObject_SetAttrString(optimizer, "grad_scale", grad_scale) == 0 &&
                        PyObject_SetAttrString(optimizer, "found_inf", found) == 0;
        Py_DECREF(grad_scale);
        if (!set)
            goto done;
        retval = step_unguarded(self, optimizer, rest, kw);
        /* Whatever step() did, take the attributes back off. */
        PyObject *exc = retval ? NULL : ampc_take_exception();
        if (PyObject_DelAttrString(optimizer, "grad_scale") < 0 || PyObject_DelAttrString(optimizer, "found_inf") < 0)
            PyErr_Clear();
        if (exc != NULL) {
            ampc_restore_exception(exc);
            goto done;
        }
        os->stage = STEPPED;
        result = with_found(retval, return_found_inf, found);
        goto done;
    }

    if (os->stage == READY) {
        if (unscale_grads(st, self, optimizer, os, 0, 0, NULL) < 0)
            goto done;
        os->stage = UNSCALED;
    }
    if (os->nfound == 0) {
        PyErr_SetString(PyExc_AssertionError, "No inf checks were recorded for this optimizer.");
        goto done;
    }
    int any;
    if (any_found(st, self, os, &any) < 0)
        goto done;
    retval = any ? Py_NewRef(Py_None) : step_unguarded(self, optimizer, rest, kw);
    if (retval == NULL)
        goto done;
    os->stage = STEPPED;
    result = with_found(retval, return_found_inf, any ? Py_True : Py_False);
done:
    Py_XDECREF(like);
    Py_XDECREF(held);
    Py_XDECREF(found);
    Py_XDECREF(rest);
    Py_XDECREF(kw);
    return result;
}

static int reset_states(ScalerObject *self)
{
    PyDict_Clear(self->states);
    for (int i = 0; i < self->nmemory; i++)
        self->memory[i].nflags = 0;
    return 0;
}

static int set_scale_from(ampc_state *st, ScalerObject *self, PyObject *new_scale)
{
    static const char *const NEW_SCALE =
        "new_scale should be a float or a 1-element torch.cuda.FloatTensor or torch.FloatTensor with "
        "requires_grad=False.";
    double value;
    if (PyFloat_Check(new_scale) || (PyLong_Check(new_scale) && !PyBool_Check(new_scale))) {
        value = PyFloat_AsDouble(new_scale);
        if (value == -1.0 && PyErr_Occurred())
            return -1;
    }
    else if (PyArray_Check(new_scale) || PyArray_IsScalar(new_scale, Generic) || ampc_is_array(st, new_scale) ||
             PyObject_HasAttrString(new_scale, "__dlpack__")) {
        ampc_device dev;
        if (array_device(st, new_scale, "update: new_scale", &dev) < 0)
            return -1;
        PyObject *rg = PyObject_GetAttrString(new_scale, "requires_grad");
        const int requires_grad = rg != NULL && PyObject_IsTrue(rg) == 1;
        Py_XDECREF(rg);
        PyErr_Clear();
        if ((dev.type == AMPC_DEVICE_CUDA) != self->cfg.cuda || requires_grad) {
            PyErr_SetString(PyExc_AssertionError, NEW_SCALE);
            return -1;
        }
        ampc_view v;
        if (ampc_view_from_object(st, new_scale, "update: new_scale", AMPC_FOR_READING, &v) < 0)
            return -1;
        int rc = -1;
        if (v.numel != 1) {
            PyErr_SetString(PyExc_AssertionError, NEW_SCALE);
            goto done;
        }
        if (!AMPC_DTYPE_IS_FLOAT(v.dtype)) {
            PyErr_Format(PyExc_TypeError, "update: new_scale has dtype %s; it must be floating",
                         ampc_dtype_names[v.dtype]);
            goto done;
        }
        /* Read the one element as float64, on the host. */
        ampc_view host;
        const int64_t shape0[1] = {0};
        PyObject *h = ampc_array_empty(st, (ampc_device){AMPC_DEVICE_CPU, 0}, AMPC_FLOAT64, 0, shape0, NULL, &host);
        if (h == NULL)
            goto done;
        char raw[8];
        if (ampc_copy_bytes(st, host.device, raw, v.device, v.data, (size_t)ampc_dtype_size(v.dtype),
                            ampc_current_stream(v.device.index, NULL), "update") < 0) {
            Py_DECREF(h);
            goto done;
        }
        ampc_view src = host;
        src.data = raw;
        src.dtype = v.dtype;
        rc = ampc_cast_views(st, &host, &src, 0);
        memcpy(&value, host.data, sizeof value);
        Py_DECREF(h);
    done:
        ampc_view_release(&v);
        if (rc < 0)
            return -1;
    }
    else {
        PyErr_Format(PyExc_TypeError, "update: new_scale must be a float or a 1-element array, got %.200s",
                     Py_TYPE(new_scale)->tp_name);
        return -1;
    }
    if (!(value > 0) || !isfinite(value) || value > FLT_MAX) {
        value_error("update: new_scale must be a positive finite float32, got %g", value);
        return -1;
    }
    const float f = (float)value;
    return block_copy(st, &self->memory[0], (void *)&f, &self->memory[0].block->scale, sizeof f, 0);
}

static PyObject *Scaler_update(PyObject *op, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"new_scale", NULL};
    ScalerObject *self = SCALER(op);
    ampc_state *st = state_of(op);
    PyObject *new_scale = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|O:update", kwlist, &new_scale))
        return NULL;
    if (!self->cfg.enabled)
        Py_RETURN_NONE;
    if (check_scale(self, "update") < 0)
        return NULL;
    if (new_scale != Py_None) {
        if (set_scale_from(st, self, new_scale) < 0)
            return NULL;
        reset_states(self);
        Py_RETURN_NONE;
    }
    /* Gather every check since the last update into the master's flags. */
    scaler_memory *master = &self->memory[0];
    int recorded = 0;
    for (int i = 0; i < self->nmemory; i++)
        recorded += self->memory[i].nflags;
    if (recorded == 0) {
        PyErr_SetString(PyExc_AssertionError, "No inf checks were recorded prior to update.");
        return NULL;
    }
    for (int i = 1; i < self->nmemory; i++) {
        scaler_memory *m = &self->memory[i];
        if (m->nflags == 0)
            continue;
        if (master->nflags + m->nflags > AMPC_SCALER_MAX_FLAGS) {
            PyErr_SetString(PyExc_RuntimeError, "GradScaler: too many inf checks since the last update()");
            return NULL;
        }
        float flags[AMPC_SCALER_MAX_FLAGS];
        if (block_copy(st, m, flags, m->block->flags, (size_t)m->nflags * sizeof(float), 1) < 0 ||
            block_copy(st, master, flags, &master->block->flags[master->nflags], (size_t)m->nflags * sizeof(float), 0) < 0)
            return NULL;
        master->nflags += m->nflags;
        m->nflags = 0;
    }
    const ampc_scale_rule rule = rule_of(self);
    void *stream = stream_for(master);
    const int status = ampc_backend_of(st, master->device)->update_scale(master->device.index, stream, master->block,
                                                                         master->nflags, &rule);
    if (status != AMPC_OK)
        return ampc_backend_raise(st, master->device, status, "update"), NULL;
    if (master->device.type != AMPC_DEVICE_CPU)
        master->stream = stream;
    reset_states(self);
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------------ */
/* Getters, setters, state                                                   */
/* ------------------------------------------------------------------------ */

/* The configuration with the live state in it: the block's scale and
 * counters once it exists. */
static int config_now(ampc_state *st, ScalerObject *self, scaler_config *c)
{
    *c = self->cfg;
    if (self->nmemory == 0)
        return 0;
    ampc_scaler_block h;
    if (read_header(st, self, &h) < 0)
        return -1;
    c->scale = h.scale;
    c->growth_tracker = h.growth_tracker;
    c->hysteresis_left = h.hysteresis_left;
    c->steps = h.steps;
    c->skipped = h.skipped;
    return 0;
}

static PyObject *Scaler_get_scale(PyObject *op, PyObject *Py_UNUSED(ignored))
{
    ScalerObject *self = SCALER(op);
    scaler_config c;
    if (!self->cfg.enabled)
        return PyFloat_FromDouble(1.0);
    return config_now(state_of(op), self, &c) < 0 ? NULL : PyFloat_FromDouble(c.scale);
}

static PyObject *Scaler_get_growth_tracker(PyObject *op, PyObject *Py_UNUSED(ignored))
{
    ScalerObject *self = SCALER(op);
    scaler_config c;
    if (!self->cfg.enabled)
        return PyLong_FromLong(0);
    return config_now(state_of(op), self, &c) < 0 ? NULL : PyLong_FromLongLong(c.growth_tracker);
}

static PyObject *Scaler_is_enabled(PyObject *op, PyObject *Py_UNUSED(ignored))
{
    return PyBool_FromLong(SCALER(op)->cfg.enabled);
}

/* The option getters and setters: plain attribute writes in torch; here
 * checked as load_state_dict checks the same values (check_config), so that
 * whatever a setter takes, the scaler's own state_dict() gives back
 * loadable. */
#define OPTION(NAME, CTYPE, READ, CHECK, BOX)                                    \
    static PyObject *Scaler_get_##NAME(PyObject *op, PyObject *Py_UNUSED(ignored)) \
    {                                                                            \
        return BOX(SCALER(op)->cfg.NAME);                                        \
    }                                                                            \
    static PyObject *Scaler_set_##NAME(PyObject *op, PyObject *value)           \
    {                                                                            \
        CTYPE v;                                                                 \
        if (READ(value, #NAME, &v) < 0 || CHECK(v) < 0)                          \
            return NULL;                                                         \
        SCALER(op)->cfg.NAME = v;                                                \
        Py_RETURN_NONE;                                                          \
    }
OPTION(growth_factor, double, as_double, check_growth_factor, PyFloat_FromDouble)
OPTION(backoff_factor, double, as_double, check_backoff_factor, PyFloat_FromDouble)
OPTION(growth_interval, int64_t, as_int64, check_growth_interval, PyLong_FromLongLong)
#undef OPTION

/* d[key] = value, stealing value. */
static int set_item(PyObject *d, const char *key, PyObject *value)
{
    if (value == NULL)
        return -1;
    const int rc = PyDict_SetItemString(d, key, value);
    Py_DECREF(value);
    return rc;
}

static PyObject *Scaler_state_dict(PyObject *op, PyObject *Py_UNUSED(ignored))
{
    ScalerObject *self = SCALER(op);
    scaler_config c;
    if (!self->cfg.enabled)
        return PyDict_New();
    if (config_now(state_of(op), self, &c) < 0)
        return NULL;
    PyObject *d = Py_BuildValue("{s:d,s:d,s:d,s:L,s:L}", "scale", c.scale, "growth_factor", c.growth_factor,
                                "backoff_factor", c.backoff_factor, "growth_interval", (long long)c.growth_interval,
                                "_growth_tracker", (long long)c.growth_tracker);
    if (d == NULL)
        return NULL;
    /* ampc's own options appear only when used, so a default scaler's state
     * dict is exactly torch's. */
    if ((c.min_scale > 0 && set_item(d, "min_scale", PyFloat_FromDouble(c.min_scale)) < 0) ||
        (isfinite(c.max_scale) && set_item(d, "max_scale", PyFloat_FromDouble(c.max_scale)) < 0) ||
        (c.hysteresis != 1 && set_item(d, "hysteresis", PyLong_FromLongLong(c.hysteresis)) < 0))
        Py_CLEAR(d);
    return d;
}

/* One entry of a state: a number, an int, a bool or a str. */
enum { FIELD_NUMBER, FIELD_INT, FIELD_BOOL, FIELD_DEVICE };

typedef struct {
    const char *key;
    int kind;
    size_t offset;              /* into scaler_config */
    int required;
} state_field;

#define FIELD(key, kind, member, required) {key, kind, offsetof(scaler_config, member), required}

/* torch's five keys, then ampc's options (present only when used). */
static const state_field STATE_DICT_FIELDS[] = {
    FIELD("scale", FIELD_NUMBER, scale, 1),
    FIELD("growth_factor", FIELD_NUMBER, growth_factor, 1),
    FIELD("backoff_factor", FIELD_NUMBER, backoff_factor, 1),
    FIELD("growth_interval", FIELD_INT, growth_interval, 1),
    FIELD("_growth_tracker", FIELD_INT, growth_tracker, 1),
    FIELD("min_scale", FIELD_NUMBER, min_scale, 0),
    FIELD("max_scale", FIELD_NUMBER, max_scale, 0),
    FIELD("hysteresis", FIELD_INT, hysteresis, 0),
    {NULL, 0, 0, 0},
};

/* What __getstate__ writes, all of it read back. */
static const state_field PICKLE_FIELDS[] = {
    FIELD("enabled", FIELD_BOOL, enabled, 1),
    FIELD("device", FIELD_DEVICE, cuda, 1),
    FIELD("init_scale", FIELD_NUMBER, scale, 1),
    FIELD("growth_factor", FIELD_NUMBER, growth_factor, 1),
    FIELD("backoff_factor", FIELD_NUMBER, backoff_factor, 1),
    FIELD("growth_interval", FIELD_INT, growth_interval, 1),
    FIELD("init_growth_tracker", FIELD_INT, growth_tracker, 1),
    FIELD("min_scale", FIELD_NUMBER, min_scale, 1),
    FIELD("max_scale", FIELD_NUMBER, max_scale, 1),
    FIELD("hysteresis", FIELD_INT, hysteresis, 1),
    FIELD("hysteresis_left", FIELD_INT, hysteresis_left, 1),
    FIELD("steps", FIELD_INT, steps, 1),
    FIELD("skipped_steps", FIELD_INT, skipped, 1),
    {NULL, 0, 0, 0},
};

#undef FIELD

/* Read `fields` from the mapping `src` into `c` (which holds the values
 * of the fields that are absent and optional). A missing required entry
 * raises StateDictError (a KeyError, as torch's, and a ValueError) naming
 * it; a value of the wrong type, TypeError naming it. Nothing is checked
 * for range here: check_config does that, on the whole. */
static int read_fields(ampc_state *st, PyObject *src, const state_field *fields, scaler_config *c)
{
    for (const state_field *f = fields; f->key != NULL; f++) {
        PyObject *v = PyMapping_GetItemString(src, f->key);
        if (v == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_KeyError))
                return -1;
            PyErr_Clear();
            if (!f->required)
                continue;
            PyObject *name = PyUnicode_FromString(f->key);
            if (name != NULL)
                PyErr_SetObject(st->state_dict_error, name);  /* str() quotes it, as KeyError's */
            Py_XDECREF(name);
            return -1;
        }
        char *field = (char *)c + f->offset;
        int rc = 0;
        switch (f->kind) {
        case FIELD_NUMBER:
            rc = as_double(v, f->key, (double *)field);
            break;
        case FIELD_INT:
            rc = as_int64(v, f->key, (int64_t *)field);
            break;
        case FIELD_BOOL:
            if (!PyBool_Check(v)) {
                PyErr_Format(PyExc_TypeError, "GradScaler: %s must be a bool, got %.200s", f->key,
                             Py_TYPE(v)->tp_name);
                rc = -1;
            }
            *(int *)field = v == Py_True;
            break;
        case FIELD_DEVICE:
            if (PyUnicode_Check(v) && PyUnicode_CompareWithASCIIString(v, "cuda") == 0) {
                *(int *)field = 1;
            }
            else if (PyUnicode_Check(v) && PyUnicode_CompareWithASCIIString(v, "cpu") == 0) {
                *(int *)field = 0;
            }
            else {
                PyErr_Format(PyExc_ValueError, "GradScaler: %s must be 'cuda' or 'cpu', got a %.200s", f->key,
                             Py_TYPE(v)->tp_name);
                rc = -1;
            }
            break;
        }
        Py_DECREF(v);
        if (rc < 0)
            return -1;
    }
    return 0;
}

static PyObject *Scaler_load_state_dict(PyObject *op, PyObject *sd)
{
    ScalerObject *self = SCALER(op);
    ampc_state *st = state_of(op);
    if (!self->cfg.enabled)
        Py_RETURN_NONE;
    if (!PyMapping_Check(sd)) {
        PyErr_Format(PyExc_TypeError, "load_state_dict: expected a dict, got %.200s", Py_TYPE(sd)->tp_name);
        return NULL;
    }
    const Py_ssize_t size = PyMapping_Size(sd);
    if (size < 0)
        return NULL;
    if (size == 0) {
        PyErr_SetString(PyExc_RuntimeError, "The source state dict is empty, possibly because it was saved from a "
                        "disabled instance of GradScaler.");
        return NULL;
    }
    /* Everything is read and checked first: a bad dict changes nothing. The
     * options it lacks (a torch checkpoint lacks ampc's) stay as they are. */
    scaler_config c;
    if (config_now(st, self, &c) < 0 || read_fields(st, sd, STATE_DICT_FIELDS, &c) < 0)
        return NULL;
    c.hysteresis_left = c.hysteresis;
    if (check_config(st, &c, 0) < 0)
        return NULL;
    if (self->nmemory > 0) {
        ampc_scaler_block h;
        if (read_header(st, self, &h) < 0)
            return NULL;
        h.scale = (float)c.scale;
        h.growth_tracker = (int32_t)c.growth_tracker;
        h.hysteresis_left = (int32_t)c.hysteresis_left;
        if (write_header(st, self, &h) < 0)
            return NULL;
    }
    self->cfg = c;
    Py_RETURN_NONE;
}

/* A subclass's own attributes (ampc.distributed.ShardedGradScaler's, a
 * user's): a new reference to the instance's __dict__, or NULL without an
 * exception where it has none (ampc.GradScaler's __slots__). */
static PyObject *instance_dict(PyObject *op)
{
    PyObject *d = PyObject_GenericGetDict(op, NULL);
    if (d == NULL && PyErr_ExceptionMatches(PyExc_AttributeError))
        PyErr_Clear();
    return d;
}

static PyObject *Scaler_getstate(PyObject *op, PyObject *Py_UNUSED(ignored))
{
    ScalerObject *self = SCALER(op);
    if (self->cfg.enabled && PyDict_Size(self->states) > 0) {
        PyErr_SetString(PyExc_AssertionError, "A GradScaler instance may only be pickled at the beginning of an "
                        "iteration, or at the end after scaler.update().");
        return NULL;
    }
    /* The scale's memory is not pickled: the copy creates it again on the
     * device of its next scale() call, as torch's does. */
    scaler_config c;
    if (config_now(state_of(op), self, &c) < 0)
        return NULL;
    PyObject *state = Py_BuildValue("{s:O,s:s,s:d,s:d,s:d,s:L,s:L,s:d,s:d,s:L,s:L,s:L,s:L}", "enabled",
                                    c.enabled ? Py_True : Py_False, "device", c.cuda ? "cuda" : "cpu", "init_scale",
                                    c.scale, "growth_factor", c.growth_factor, "backoff_factor", c.backoff_factor,
                                    "growth_interval", (long long)c.growth_interval, "init_growth_tracker",
                                    (long long)c.growth_tracker, "min_scale", c.min_scale, "max_scale", c.max_scale,
                                    "hysteresis", (long long)c.hysteresis, "hysteresis_left",
                                    (long long)c.hysteresis_left, "steps", (long long)c.steps, "skipped_steps",
                                    (long long)c.skipped);
    /* A subclass's attributes go with it, as torch's whole __dict__ does. */
    PyObject *attributes = state ? instance_dict(op) : NULL;
    if (attributes != NULL && PyDict_GET_SIZE(attributes) > 0 && set_item(state, "__dict__", PyDict_Copy(attributes)) < 0)
        Py_CLEAR(state);
    Py_XDECREF(attributes);
    if (PyErr_Occurred())
        Py_CLEAR(state);
    return state;
}

/* Unpickling (and copy.copy / deepcopy): the state __getstate__ wrote, every
 * entry required, each checked as load_state_dict checks it. A state that
 * fails (truncated, edited, from elsewhere) changes nothing. */
static PyObject *Scaler_setstate(PyObject *op, PyObject *state)
{
    ScalerObject *self = SCALER(op);
    ampc_state *st = state_of(op);
    if (!PyDict_Check(state)) {
        PyErr_Format(PyExc_TypeError, "GradScaler.__setstate__: expected a dict, got %.200s", Py_TYPE(state)->tp_name);
        return NULL;
    }
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(state, &pos, &key, &value)) {  /* str keys compared as str: runs no Python */
        int known = PyUnicode_Check(key) && PyUnicode_CompareWithASCIIString(key, "__dict__") == 0;
        for (const state_field *f = PICKLE_FIELDS; !known && f->key != NULL && PyUnicode_Check(key); f++)
            known = PyUnicode_CompareWithASCIIString(key, f->key) == 0;
        if (!known)
            return ampc_raise_with_repr(PyExc_ValueError, "%s: unexpected entry %U", "GradScaler.__setstate__", key),
                   NULL;
    }
    scaler_config c = self->cfg;
    if (read_fields(st, state, PICKLE_FIELDS, &c) < 0 || check_config(st, &c, 0) < 0)
        return NULL;
    /* Reading ran the entries' __float__ and __index__: take the attributes only now, each under a
     * str name (an attribute's name; hashing a str runs no Python, so the update cannot fail midway). */
    PyObject *attributes = PyDict_GetItemString(state, "__dict__");
    if (attributes != NULL) {
        int names_ok = PyDict_Check(attributes);
        pos = 0;
        while (names_ok && PyDict_Next(attributes, &pos, &key, &value))
            names_ok = PyUnicode_CheckExact(key);
        if (!names_ok) {
            PyErr_SetString(PyExc_TypeError, "GradScaler.__setstate__: '__dict__' must be a dict of attribute names");
            return NULL;
        }
        PyObject *instance = instance_dict(op);
        if (instance == NULL) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_TypeError, "GradScaler.__setstate__: a %.200s has no attributes to restore",
                             Py_TYPE(op)->tp_name);
            return NULL;
        }
        Py_INCREF(attributes);
        const int rc = PyDict_Update(instance, attributes);
        Py_DECREF(attributes);
        Py_DECREF(instance);
        if (rc < 0)
            return NULL;
    }
    reset_to(self, &c);
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------------ */
/* Beyond torch: telemetry and overflow reports                              */
/* ------------------------------------------------------------------------ */

static PyObject *Scaler_stats(PyObject *op, PyObject *Py_UNUSED(ignored))
{
    ScalerObject *self = SCALER(op);
    ampc_scaler_block h = {0};
    h.scale = 1.0f;  /* a disabled scaler counts nothing */
    h.hysteresis_left = 1;
    if (self->cfg.enabled) {  /* checked: each value fits its field */
        h.scale = (float)self->cfg.scale;
        h.growth_tracker = (int32_t)self->cfg.growth_tracker;
        h.hysteresis_left = (int32_t)self->cfg.hysteresis_left;
        h.steps = self->cfg.steps;
        h.skipped = self->cfg.skipped;
        if (self->nmemory > 0 && read_header(state_of(op), self, &h) < 0)
            return NULL;
    }
    PyObject *last = h.steps == 0 ? Py_None : (h.found_inf != 0.0f ? Py_True : Py_False);
    return Py_BuildValue("{s:O,s:d,s:L,s:L,s:i,s:i,s:O}", "enabled", self->cfg.enabled ? Py_True : Py_False, "scale",
                         (double)h.scale, "steps", (long long)h.steps, "skipped_steps", (long long)h.skipped,
                         "growth_tracker", (int)h.growth_tracker, "hysteresis_left", (int)h.hysteresis_left,
                         "last_step_skipped", last);
}

static PyObject *Scaler_overflow_report(PyObject *op, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"optimizer", "names", NULL};
    ampc_state *st = state_of(op);
    PyObject *optimizer, *names = Py_None, *by_id = NULL, *report = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|O:overflow_report", kwlist, &optimizer, &names))
        return NULL;
    ampc_grads g = {0};
    if (ampc_grads_collect(st, optimizer, 1, 0, &g) < 0)
        return NULL;
    int64_t *counts = PyMem_Calloc((size_t)(g.n > 0 ? g.n : 1), sizeof *counts);
    if (counts == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    /* names: (name, parameter) pairs, as model.named_parameters() gives them. */
    by_id = PyDict_New();
    if (by_id == NULL)
        goto done;
    if (names != Py_None) {
        PyObject *pairs = PyDict_Check(names) ? PyDict_Items(names) : Py_NewRef(names);
        PyObject *it = pairs ? PyObject_GetIter(pairs) : NULL;
        Py_XDECREF(pairs);
        PyObject *pair;
        while (it && (pair = PyIter_Next(it)) != NULL) {
            PyObject *name, *param;
            int ok = PyArg_ParseTuple(pair, "OO;names must hold (name, parameter) pairs", &name, &param);
            PyObject *key = ok ? PyLong_FromVoidPtr(param) : NULL;
            ok = key && PyDict_SetItem(by_id, key, name) == 0;
            Py_XDECREF(key);
            Py_DECREF(pair);
            if (!ok)
                break;
        }
        Py_XDECREF(it);
        if (PyErr_Occurred())
            goto done;
    }
    /* On demand: one read of every gradient, only when asked. */
    for (int d = 0; d < g.ndevices; d++) {
        const ampc_grad_ref *refs = g.refs + g.first[d];
        int64_t *out = counts + g.first[d];
        const ampc_device device = g.devices[d];
        void *stream = device.type == AMPC_DEVICE_CPU ? NULL : ampc_current_stream(device.index, NULL);
        if (device.type != AMPC_DEVICE_CPU && order_grads(st, &g, d, stream, 1) < 0)
            goto done;
        const int status = ampc_backend_of(st, device)->count_nonfinite(device.index, stream, refs, g.count[d], out);
        if (status != AMPC_OK) {
            ampc_backend_raise(st, device, status, "overflow_report");
            goto done;
        }
    }
    report = PyList_New(0);
    if (report == NULL)
        goto done;
    /* refs are grouped by device; walk them in the same order as the entries. */
    for (int d = 0; d < g.ndevices; d++) {
        int64_t k = g.first[d];
        for (int64_t i = 0; i < g.n; i++) {
            const ampc_grad_entry *e = &g.entries[i];
            if (e->device_slot != d)
                continue;
            const int64_t count = counts[k++];
            if (count == 0)
                continue;
            PyObject *key = PyLong_FromVoidPtr(e->param);
            PyObject *name = key ? PyDict_GetItemWithError(by_id, key) : NULL;
            Py_XDECREF(key);
            if (PyErr_Occurred())
                goto fail;
            PyObject *label = name ? Py_NewRef(name)
                                   : PyUnicode_FromFormat("param_groups[%d]['params'][%d]", e->group, e->index);
            PyObject *shape = PyTuple_New(e->view.ndim);
            for (int s = 0; shape && s < e->view.ndim; s++)
                PyTuple_SET_ITEM(shape, s, PyLong_FromLongLong(e->view.shape[s]));
            char dev[32];
            PyObject *row = label && shape ? Py_BuildValue("{s:N,s:i,s:i,s:N,s:s,s:s,s:L,s:L}", "name", label, "group",
                                                           e->group, "index", e->index, "shape", shape, "dtype",
                                                           ampc_dtype_names[e->view.dtype], "device",
                                                           ampc_device_str(e->view.device, dev, sizeof dev), "nonfinite",
                                                           (long long)count, "numel", (long long)e->view.numel)
                                           : NULL;
            if (row == NULL || PyList_Append(report, row) < 0) {
                Py_XDECREF(row);
                goto fail;
            }
            Py_DECREF(row);
        }
    }
    goto done;
fail:
    Py_CLEAR(report);
done:
    PyMem_Free(counts);
    Py_XDECREF(by_id);
    ampc_grads_release(&g);
    return report;
}

/* ------------------------------------------------------------------------ */
/* torch's internals that its tests use                                      */
/* ------------------------------------------------------------------------ */

/* {device name: found_inf}, each a copy of the optimizer's flag (torch's
 * dict holds tensors of its own too). */
static PyObject *Scaler_found_inf_per_device(PyObject *op, PyObject *optimizer)
{
    ScalerObject *self = SCALER(op);
    ampc_state *st = state_of(op);
    PyTypeObject *like = param_type(st, optimizer);  /* runs Python: before the state is looked up */
    PyObject *d = PyDict_New();
    opt_state *os = NULL;
    PyObject *held = d ? get_opt_state(self, optimizer, 0, &os) : NULL;
    if (d == NULL || PyErr_Occurred())
        goto fail;
    for (int i = 0; os && i < os->nfound; i++) {
        const int m = os->found[i].memory;
        char name[32];
        ampc_device_str(self->memory[m].device, name, sizeof name);
        PyObject *flag = float_copy(st, self, m, &self->memory[m].block->flags[os->found[i].slot]);
        if (set_item(d, name, as_like(st, flag, like ? (PyTypeObject *)Py_NewRef(like) : NULL)) < 0)
            goto fail;
    }
    Py_XDECREF(held);
    Py_XDECREF(like);
    return d;
fail:
    Py_XDECREF(held);
    Py_XDECREF(like);
    Py_XDECREF(d);
    return NULL;
}

static PyObject *Scaler_check_inf_per_device(PyObject *op, PyObject *optimizer)
{
    ScalerObject *self = SCALER(op);
    if (check_scale(self, "_check_inf_per_device") < 0)
        return NULL;
    opt_state *os;
    PyObject *held = get_opt_state(self, optimizer, 1, &os);
    const int rc = held == NULL ? -1 : unscale_grads(state_of(op), self, optimizer, os, 1, 1, NULL);
    Py_XDECREF(held);
    return rc < 0 ? NULL : Scaler_found_inf_per_device(op, optimizer);
}

/* _set_found_inf(optimizer, value): write `value` into every inf check
 * recorded for the optimizer since the last update (what step() and
 * update() then read). ampc.distributed.ShardedGradScaler writes the flag
 * its ranks agreed on this way: the dicts _found_inf_per_device returns are
 * copies. */
static PyObject *Scaler_set_found_inf(PyObject *op, PyObject *args)
{
    ScalerObject *self = SCALER(op);
    ampc_state *st = state_of(op);
    PyObject *optimizer, *value_obj;
    double value;
    if (!PyArg_ParseTuple(args, "OO:_set_found_inf", &optimizer, &value_obj) ||
        as_double(value_obj, "found_inf", &value) < 0)
        return NULL;
    opt_state *os;
    PyObject *held = get_opt_state(self, optimizer, 0, &os);
    if (held == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_RuntimeError, "_set_found_inf: no inf checks were recorded for this optimizer");
        return NULL;
    }
    const float f = (float)value;
    int rc = 0;
    for (int i = 0; rc == 0 && i < os->nfound; i++) {
        scaler_memory *m = &self->memory[os->found[i].memory];
        rc = block_copy(st, m, (void *)&f, &m->block->flags[os->found[i].slot], sizeof f, 0);
    }
    Py_DECREF(held);
    if (rc < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------------ */
/* One method at a time                                                      */
/* ------------------------------------------------------------------------ */

/* Whether a method changes the scaler (its state, its blocks, the
 * per-optimizer stages), or only reads it. */
enum { READS = 0, CHANGES = 1 };

/* 0 with the lock held, or -1 with an exception: a signal handler raised
 * while waiting (Ctrl-C reaches a thread waiting for a long step), or the
 * call would change the scaler while one of its own methods, further up
 * this thread's stack, is running the caller's code and holds pointers into
 * it (an optimizer's .grad property calling update() from inside unscale_()).
 * The thread holding the lock may enter again: step() runs the optimizer,
 * whose code may call the scaler, and a read is always safe. */
static int scaler_enter(ScalerObject *self, const char *name, int changes)
{
    const unsigned long me = PyThread_get_thread_ident();
    if (self->depth > 0 && self->owner == me) {
        if (changes && self->busy != NULL) {
            PyErr_Format(PyExc_RuntimeError, "GradScaler.%s() was called while GradScaler.%s() was running the "
                         "caller's code (a property, __dlpack__, __float__ or another callback of the objects "
                         "given to it); call it after %s() returns", name, self->busy, self->busy);
            return -1;
        }
        self->depth++;
        return 0;
    }
    if (!PyThread_acquire_lock(self->lock, NOWAIT_LOCK)) {
        PyLockStatus got;
        do {
            Py_BEGIN_ALLOW_THREADS  /* the holder may need the GIL to finish */
            got = PyThread_acquire_lock_timed(self->lock, 100000, 1);  /* 0.1 s, interruptible */
            Py_END_ALLOW_THREADS
            if (got != PY_LOCK_ACQUIRED && PyErr_CheckSignals() < 0)
                return -1;
        } while (got != PY_LOCK_ACQUIRED);
    }
    self->owner = me;
    self->depth = 1;
    return 0;
}

static void scaler_leave(ScalerObject *self)
{
    if (--self->depth == 0) {
        self->owner = 0;
        PyThread_release_lock(self->lock);
    }
}

/* Every method that holds the lock marks the scaler busy while it runs
 * (step() lifts the mark around the optimizer's own step), and restores the
 * mark of the call it may be nested in. */
#define SERIALISED_BODY(name, changes, call, failed)       \
    ScalerObject *self = SCALER(op);                        \
    if (scaler_enter(self, name, changes) < 0)              \
        return failed;                                      \
    const char *outer = self->busy;                         \
    self->busy = name;                                      \
    __typeof__(call) result = call;                         \
    self->busy = outer;                                     \
    scaler_leave(self);                                     \
    return result;

/* NAME_serialised: NAME holding the scaler's lock (METH_O and METH_NOARGS
 * methods share a signature; SERIALISED_KW for METH_VARARGS | METH_KEYWORDS). */
#define SERIALISED(fn, name, changes) \
    static PyObject *fn##_serialised(PyObject *op, PyObject *arg) { SERIALISED_BODY(name, changes, fn(op, arg), NULL) }
#define SERIALISED_KW(fn, name, changes)                                               \
    static PyObject *fn##_serialised(PyObject *op, PyObject *args, PyObject *kwargs)   \
    {                                                                                  \
        SERIALISED_BODY(name, changes, fn(op, args, kwargs), NULL)                     \
    }

SERIALISED(Scaler_scale, "scale", READS)  /* it may create a block, never drops one */
SERIALISED_KW(Scaler_unscale_, "unscale_", CHANGES)
SERIALISED_KW(Scaler_step, "step", CHANGES)
SERIALISED_KW(Scaler_update, "update", CHANGES)
SERIALISED(Scaler_get_scale, "get_scale", READS)
SERIALISED(Scaler_get_growth_tracker, "_get_growth_tracker", READS)
SERIALISED(Scaler_state_dict, "state_dict", READS)
SERIALISED(Scaler_load_state_dict, "load_state_dict", CHANGES)
SERIALISED(Scaler_stats, "stats", READS)
SERIALISED_KW(Scaler_overflow_report, "overflow_report", READS)
SERIALISED(Scaler_check_inf_per_device, "_check_inf_per_device", CHANGES)
SERIALISED(Scaler_found_inf_per_device, "_found_inf_per_device", READS)
SERIALISED(Scaler_set_found_inf, "_set_found_inf", CHANGES)
SERIALISED(Scaler_getstate, "__getstate__", READS)
SERIALISED(Scaler_setstate, "__setstate__", CHANGES)

static int Scaler_init_serialised(PyObject *op, PyObject *args, PyObject *kwargs)
{
    SERIALISED_BODY("__init__", CHANGES, Scaler_init(op, args, kwargs), -1)
}

/* ------------------------------------------------------------------------ */
/* The type                                                                  */
/* ------------------------------------------------------------------------ */

PyDoc_STRVAR(Scaler_doc,
"GradScaler(device='cuda', init_scale=65536.0, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000,\n"
"           enabled=True, *, min_scale=None, max_scale=None, hysteresis=1)\n--\n\n"
"Dynamic loss scaling, as torch.amp.GradScaler: scale(loss) before backward, step(optimizer), update().\n"
"Works with any optimizer whose params have a .grad that is a NumPy array or a DLPack buffer (torch,\n"
"CuPy, ampc), unscaling in place. Beyond torch: min_scale/max_scale bounds, hysteresis (back off only on\n"
"the N-th overflowing step in a row), stats(), overflow_report(optimizer), and\n"
"unscale_(optimizer, max_norm=..., norm_type=2.0), which clips in the same pass and returns the norm.");

static PyMethodDef Scaler_methods[] = {
    {"scale", Scaler_scale_serialised, METH_O, "scale($self, outputs, /)\n--\n\noutputs times the scale (nested lists, tuples and iterables too)."},
    {"unscale_", (PyCFunction)(void (*)(void))Scaler_unscale__serialised, METH_VARARGS | METH_KEYWORDS,
     "unscale_($self, optimizer, /, *, max_norm=None, norm_type=2.0, defer=False)\n--\n\n"
     "Divide the optimizer's gradients by the scale in place and check them for inf/NaN; with max_norm, also clip\n"
     "them to that total norm in the same pass and return the norm. With defer=True, for an optimizer that takes\n"
     "grad_scale itself (ampc.optim, torch's fused optimizers), only read the gradients for the check and the\n"
     "norm; step() then hands the optimizer scale / clip coefficient as its grad_scale, and its fused step\n"
     "writes the unscaled, clipped gradients back. Until then .grad still holds the scaled gradients."},
    {"step", (PyCFunction)(void (*)(void))Scaler_step_serialised, METH_VARARGS | METH_KEYWORDS,
     "step($self, optimizer, /, *args, return_found_inf=False, **kwargs)\n--\n\n"
     "optimizer.step(*args, **kwargs) unless an inf or NaN was found."},
    {"update", (PyCFunction)(void (*)(void))Scaler_update_serialised, METH_VARARGS | METH_KEYWORDS,
     "update($self, /, new_scale=None)\n--\n\nGrow or back off the scale (or set it to new_scale)."},
    {"get_scale", Scaler_get_scale_serialised, METH_NOARGS, "get_scale($self, /)\n--\n\nThe current scale, as a float."},
    {"get_growth_factor", Scaler_get_growth_factor, METH_NOARGS,
     "get_growth_factor($self, /)\n--\n\nWhat the scale is multiplied by after growth_interval clean steps."},
    {"set_growth_factor", Scaler_set_growth_factor, METH_O,
     "set_growth_factor($self, new_factor, /)\n--\n\nSet growth_factor (at least 1)."},
    {"get_backoff_factor", Scaler_get_backoff_factor, METH_NOARGS,
     "get_backoff_factor($self, /)\n--\n\nWhat the scale is multiplied by on a step with an inf or NaN."},
    {"set_backoff_factor", Scaler_set_backoff_factor, METH_O,
     "set_backoff_factor($self, new_factor, /)\n--\n\nSet backoff_factor (in (0, 1])."},
    {"get_growth_interval", Scaler_get_growth_interval, METH_NOARGS,
     "get_growth_interval($self, /)\n--\n\nClean steps in a row before the scale grows."},
    {"set_growth_interval", Scaler_set_growth_interval, METH_O,
     "set_growth_interval($self, new_interval, /)\n--\n\nSet growth_interval (0 or more)."},
    {"_get_growth_tracker", Scaler_get_growth_tracker_serialised, METH_NOARGS, NULL},
    {"is_enabled", Scaler_is_enabled, METH_NOARGS,
     "is_enabled($self, /)\n--\n\nFalse for a disabled scaler, whose methods pass through."},
    {"state_dict", Scaler_state_dict_serialised, METH_NOARGS,
     "state_dict($self, /)\n--\n\ntorch's five keys (plus ampc's options where they are used)."},
    {"load_state_dict", Scaler_load_state_dict_serialised, METH_O, "load_state_dict($self, state_dict, /)\n--\n\nThe state a state_dict() gave, torch's or ampc's, checked before any is set."},
    {"stats", Scaler_stats_serialised, METH_NOARGS,
     "stats($self, /)\n--\n\nsteps, skipped_steps, scale, growth_tracker, hysteresis_left, last_step_skipped."},
    {"overflow_report", (PyCFunction)(void (*)(void))Scaler_overflow_report_serialised, METH_VARARGS | METH_KEYWORDS,
     "overflow_report($self, optimizer, /, names=None)\n--\n\n"
     "The gradients holding inf or NaN now, with how many; names: (name, param) pairs such as\n"
     "model.named_parameters()."},
    {"_check_inf_per_device", Scaler_check_inf_per_device_serialised, METH_O, NULL},
    {"_found_inf_per_device", Scaler_found_inf_per_device_serialised, METH_O, NULL},
    {"_set_found_inf", Scaler_set_found_inf_serialised, METH_VARARGS, NULL},
    {"__getstate__", Scaler_getstate_serialised, METH_NOARGS, NULL},
    {"__setstate__", Scaler_setstate_serialised, METH_O, NULL},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot Scaler_slots[] = {
    {Py_tp_new, Scaler_new},
    {Py_tp_init, Scaler_init_serialised},
    {Py_tp_dealloc, Scaler_dealloc},
    {Py_tp_traverse, Scaler_traverse},
    {Py_tp_clear, Scaler_clear},
    {Py_tp_methods, Scaler_methods},
    {Py_tp_doc, (void *)Scaler_doc},
    {0, NULL},
};

static PyType_Spec Scaler_spec = {
    .name = "ampc.GradScaler",
    .basicsize = sizeof(ScalerObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .slots = Scaler_slots,
};

int ampc_scaler_type_init(PyObject *module, ampc_state *st)
{
    st->scaler_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &Scaler_spec, NULL);
    if (st->scaler_type == NULL)
        return -1;
    return PyModule_AddType(module, st->scaler_type);
}
