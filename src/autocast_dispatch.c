/*
 * autocast_dispatch.c: the one engine every autocast op goes through.
 *
 * An ampc.AutocastOp wraps a function under an op name. Called inside a
 * region, it finds the arrays among its arguments (nested lists, tuples and
 * dicts included), picks the device type the op runs on (CUDA if any array is
 * on a GPU, as torch's dispatch prefers), reads the op's policy for it (the
 * region's own fp32_ops / lower_precision_ops first, then the registry), casts
 * the eligible arrays with ampc's cast kernels and calls the function with
 * the others untouched. Eligible, as in torch: floating, not float64, on the
 * region's device type. Parameters are handed on as their arrays, and their
 * casts to the lower dtype come from the weight-cast cache.
 *
 * Outside a region the call goes straight through (Parameters still
 * unwrapped), so a registered function costs a few nanoseconds more than the
 * bare one; inside, the work is one pass over the arguments, the casts, and
 * one call.
 */
#include "autocast.h"

#include <structmember.h>

/* ------------------------------------------------------------------------ */
/* Registry entries: an op name's policy per device type                     */
/* ------------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    PyObject *name;
    unsigned char policy[AMPC_AUTOCAST_DEVICES];
} op_policy;

static void OpPolicy_dealloc(PyObject *op)
{
    PyTypeObject *type = Py_TYPE(op);
    Py_XDECREF(((op_policy *)op)->name);
    type->tp_free(op);
    Py_DECREF(type);
}

static PyType_Slot OpPolicy_slots[] = {
    {Py_tp_dealloc, OpPolicy_dealloc},
    {0, NULL},
};

static PyType_Spec OpPolicy_spec = {
    .name = "ampc._C._OpPolicy",
    .basicsize = sizeof(op_policy),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = OpPolicy_slots,
};

/* The registry's entry for `name` (a str), made with no policy if new. A
 * new reference. The registry's keys are exact str (a subclass's name is
 * copied), so that its lookups and the regions' never run Python. */
static op_policy *entry_for(ampc_state *st, PyObject *name)
{
    op_policy *e = (op_policy *)PyDict_GetItemWithError(st->autocast_registry, name);
    if (e != NULL || PyErr_Occurred())
        return (op_policy *)Py_XNewRef((PyObject *)e);
    PyObject *exact = PyUnicode_FromObject(name);
    if (exact == NULL)
        return NULL;
    e = PyObject_New(op_policy, st->op_policy_type);
    if (e == NULL) {
        Py_DECREF(exact);
        return NULL;
    }
    e->name = exact;
    PyUnicode_InternInPlace(&e->name);
    for (int d = 0; d < AMPC_AUTOCAST_DEVICES; d++)
        e->policy[d] = AMPC_POLICY_NONE;
    if (PyDict_SetItem(st->autocast_registry, e->name, (PyObject *)e) < 0)
        Py_CLEAR(e);
    return e;
}

/* ------------------------------------------------------------------------ */
/* The arrays among an op's arguments                                        */
/* ------------------------------------------------------------------------ */

/* obj and param are held: the scan runs Python (__dlpack__, a metaclass's
 * __getattr__) that may drop them from their containers or give a
 * Parameter other data, and a freed address could then match another. */
typedef struct {
    PyObject *obj;      /* strong: the array (for a Parameter, its data) */
    PyObject *param;    /* strong: the Parameter it came from, or NULL */
    int dtype;          /* ampc_dtype, or -1 for a dtype ampc does not know (never cast) */
    ampc_device device;
    ampc_view view;     /* described when dtype >= 0 */
} leaf;

typedef struct {
    leaf *items;
    Py_ssize_t n, capacity;
    leaf inline_items[4];
} leaf_list;

static void leaves_init(leaf_list *l)
{
    l->items = l->inline_items;
    l->n = 0;
    l->capacity = (Py_ssize_t)(sizeof l->inline_items / sizeof l->inline_items[0]);
}

static void leaves_release(leaf_list *l)
{
    for (Py_ssize_t i = 0; i < l->n; i++) {
        if (l->items[i].dtype >= 0)
            ampc_view_release(&l->items[i].view);
        Py_DECREF(l->items[i].obj);
        Py_XDECREF(l->items[i].param);
    }
    if (l->items != l->inline_items)
        PyMem_Free(l->items);
    leaves_init(l);
}

static leaf *leaves_add(leaf_list *l)
{
    if (l->n == l->capacity) {
        const Py_ssize_t capacity = 2 * l->capacity;
        leaf *items = PyMem_Malloc((size_t)capacity * sizeof *items);
        if (items == NULL) {
            PyErr_NoMemory();
            return NULL;
        }
        memcpy(items, l->items, (size_t)l->n * sizeof *items);
        if (l->items != l->inline_items)
            PyMem_Free(l->items);
        l->items = items;
        l->capacity = capacity;
    }
    return &l->items[l->n++];
}

/* Whether autocast treats `obj` as an array: a NumPy array, an ampc.Array,
 * or an object whose type has __dlpack__ (asked once per type). Scalars are
 * not: torch passes non-tensor arguments through. */
static int is_array(ampc_state *st, PyObject *obj)
{
    if (PyArray_Check(obj) || ampc_is_array(st, obj))
        return 1;
    if (obj == Py_None || PyFloat_CheckExact(obj) || PyLong_CheckExact(obj) || PyUnicode_CheckExact(obj) ||
        PyBool_Check(obj) || PyTuple_CheckExact(obj) || PyList_CheckExact(obj) || PyDict_CheckExact(obj) ||
        PyArray_IsScalar(obj, Generic))
        return 0;
    PyObject *type = (PyObject *)Py_TYPE(obj);
    PyObject *known = PyDict_GetItemWithError(st->array_like_types, type);
    if (known != NULL)
        return known == Py_True;
    if (PyErr_Occurred())
        return -1;
    const int has = PyObject_HasAttrString(type, "__dlpack__");
    if (PyDict_SetItem(st->array_like_types, type, has ? Py_True : Py_False) < 0)
        return -1;
    return has;
}

/* Describe one array. Arrays of a dtype or on a device ampc cannot read
 * (complex, a TPU) are kept with dtype -1: never eligible, as in torch. */
static int describe(ampc_state *st, PyObject *obj, PyObject *param, leaf_list *l)
{
    leaf *f = leaves_add(l);
    if (f == NULL)
        return -1;
    f->obj = Py_NewRef(obj);
    f->param = Py_XNewRef(param);
    f->dtype = -1;
    f->device = (ampc_device){AMPC_DEVICE_CPU, 0};
    if (PyArray_Check(obj) && ampc_dtype_from_descr(st, PyArray_DESCR((PyArrayObject *)obj)) < 0)
        return 0;
    if (ampc_view_from_object(st, obj, "autocast: argument", AMPC_FOR_READING, &f->view) < 0) {
        if (!PyErr_ExceptionMatches(PyExc_BufferError))
            return -1;
        PyErr_Clear();  /* DLPack's answer for a dtype or device ampc does not read */
        return 0;
    }
    f->dtype = f->view.dtype;
    f->device = f->view.device;
    return 0;
}

static int scan(ampc_state *st, PyObject *obj, leaf_list *l);

/* scan() of each item of a tuple or list, or each value of a dict. */
static int scan_container(ampc_state *st, PyObject *obj, leaf_list *l)
{
    /* a snapshot: a cast may release the GIL, and __dlpack__ may run Python */
    PyObject *items = PyDict_CheckExact(obj) ? PyDict_Values(obj) : PySequence_Tuple(obj);
    if (items == NULL)
        return -1;
    int rc = 0;
    for (Py_ssize_t i = 0; rc == 0 && i < PySequence_Fast_GET_SIZE(items); i++)
        rc = scan(st, PySequence_Fast_GET_ITEM(items, i), l);
    Py_DECREF(items);
    return rc;
}

/* Find the arrays in `obj`, in the order rebuild() visits them. Nested
 * containers are walked to any depth Python allows: RecursionError, as
 * torch's walk of them, for a list that holds itself or 10^6 nested tuples. */
static int scan(ampc_state *st, PyObject *obj, leaf_list *l)
{
    if (ampc_is_parameter(st, obj)) {
        PyObject *data = Py_NewRef(((ampc_parameter *)obj)->data);  /* is_array() may run Python */
        const int array = is_array(st, data);
        const int rc = array <= 0 ? array : describe(st, data, obj, l);
        Py_DECREF(data);
        return rc;
    }
    if (PyTuple_CheckExact(obj) || PyList_CheckExact(obj) || PyDict_CheckExact(obj)) {
        if (Py_EnterRecursiveCall(" while autocast looked for arrays in nested containers"))
            return -1;
        const int rc = scan_container(st, obj, l);
        Py_LeaveRecursiveCall();
        return rc;
    }
    const int array = is_array(st, obj);
    return array <= 0 ? array : describe(st, obj, NULL, l);
}

/* ------------------------------------------------------------------------ */
/* Casting and rebuilding the arguments                                      */
/* ------------------------------------------------------------------------ */

typedef struct {
    ampc_state *st;
    leaf_list *leaves;   /* NULL: only unwrap Parameters */
    Py_ssize_t next;     /* the next leaf rebuild() expects */
    ampc_device_type device;
    int target;          /* the dtype eligible arrays are cast to, or -1 for none */
    int cache;           /* whether casts of float32 Parameters to `target` are cached */
    int nesting;         /* the thread's nesting count when the op began */
} rebuild_ctx;

static int eligible(const leaf *f, ampc_device_type device)
{
    return f->device.type == device &&
           (f->dtype == AMPC_FLOAT32 || f->dtype == AMPC_FLOAT16 || f->dtype == AMPC_BFLOAT16);
}

static PyObject *cast_leaf(rebuild_ctx *c, leaf *f)
{
    ampc_state *st = c->st;
    const ampc_dtype target = (ampc_dtype)c->target;
    const int cacheable = c->cache && f->param != NULL && f->dtype == AMPC_FLOAT32 &&
                          ((ampc_parameter *)f->param)->requires_grad;
    if (cacheable) {
        PyObject *hit = ampc_cast_cache_get(st, f->param, target);
        if (hit != NULL) {
            ampc_autocast_count.cache_hits++;
            return hit;
        }
    }
    ampc_view out;
    PyObject *fresh = ampc_empty_like(st, &f->view, target, &out);
    if (fresh == NULL)
        return NULL;
    const int rc = ampc_cast_views(st, &out, &f->view, 1);
    ampc_view_release(&out);
    if (rc < 0) {
        Py_DECREF(fresh);
        return NULL;
    }
    ampc_autocast_count.casts++;
    PyObject *result = ampc_return_as(st, fresh, f->view.source);
    if (result != NULL && cacheable && ampc_cast_cache_put(st, f->param, target, result, c->nesting) < 0)
        Py_CLEAR(result);
    return result;
}

/* What the function receives for an array (its Parameter, if any, already
 * unwrapped to `array`): the leaf scan() found for it, cast if it is eligible
 * and not in the target dtype. */
static PyObject *rebuild_array(rebuild_ctx *c, PyObject *array, PyObject *param)
{
    if (c->leaves == NULL || c->next >= c->leaves->n)
        return Py_NewRef(array);
    leaf *f = &c->leaves->items[c->next];
    if (f->obj != array || f->param != param)
        return Py_NewRef(array);  /* changed since the scan (another thread): handed on as it is now */
    c->next++;
    if (c->target < 0 || !eligible(f, c->device) || f->dtype == c->target)
        return Py_NewRef(array);
    return cast_leaf(c, f);
}

static PyObject *rebuild(rebuild_ctx *c, PyObject *obj);

/* A tuple or list with each item rebuilt; `obj` itself if none changed. */
static PyObject *rebuild_sequence(rebuild_ctx *c, PyObject *obj)
{
    PyObject *items = PySequence_Tuple(obj);
    if (items == NULL)
        return NULL;
    const Py_ssize_t n = PyTuple_GET_SIZE(items);
    PyObject *out = NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyTuple_GET_ITEM(items, i);
        PyObject *converted = rebuild(c, item);
        if (converted == NULL)
            goto fail;
        if (out == NULL && converted != item) {
            out = PyTuple_New(n);
            if (out == NULL) {
                Py_DECREF(converted);
                goto fail;
            }
            for (Py_ssize_t k = 0; k < i; k++)
                PyTuple_SET_ITEM(out, k, Py_NewRef(PyTuple_GET_ITEM(items, k)));
        }
        if (out != NULL)
            PyTuple_SET_ITEM(out, i, converted);
        else
            Py_DECREF(converted);
    }
    Py_DECREF(items);
    if (out == NULL)
        return Py_NewRef(obj);
    if (PyList_CheckExact(obj)) {
        PyObject *list = PySequence_List(out);
        Py_DECREF(out);
        return list;
    }
    return out;
fail:
    Py_DECREF(items);
    Py_XDECREF(out);
    return NULL;
}

/* A dict with each value rebuilt (keys kept); `obj` itself if none changed. */
static PyObject *rebuild_dict(rebuild_ctx *c, PyObject *obj)
{
    PyObject *keys = PyDict_Keys(obj), *values = PyDict_Values(obj), *converted = NULL, *out = NULL;
    if (keys == NULL || values == NULL)
        goto done;
    converted = rebuild_sequence(c, values);
    if (converted == NULL || converted == values) {
        out = converted == NULL ? NULL : Py_NewRef(obj);
        goto done;
    }
    out = PyDict_New();
    for (Py_ssize_t i = 0; out != NULL && i < PyList_GET_SIZE(keys); i++)
        if (PyDict_SetItem(out, PyList_GET_ITEM(keys, i), PyList_GET_ITEM(converted, i)) < 0)
            Py_CLEAR(out);
done:
    Py_XDECREF(keys);
    Py_XDECREF(values);
    Py_XDECREF(converted);
    return out;
}

static PyObject *rebuild(rebuild_ctx *c, PyObject *obj)
{
    ampc_state *st = c->st;
    if (ampc_is_parameter(st, obj))
        return rebuild_array(c, ((ampc_parameter *)obj)->data, obj);
    const int sequence = PyTuple_CheckExact(obj) || PyList_CheckExact(obj);
    if (!sequence && !PyDict_CheckExact(obj))
        return rebuild_array(c, obj, NULL);
    if (Py_EnterRecursiveCall(" while autocast rebuilt nested containers"))
        return NULL;
    PyObject *out = sequence ? rebuild_sequence(c, obj) : rebuild_dict(c, obj);
    Py_LeaveRecursiveCall();
    return out;
}

/* ------------------------------------------------------------------------ */
/* Policies                                                                  */
/* ------------------------------------------------------------------------ */

/* torch's at::autocast::prioritize over the eligible arrays: float32 if any
 * is, the region's dtype if all are; -1 with torch's RuntimeError for a mix
 * of float16 and bfloat16, or a float64 region. */
static int promote_type(const leaf_list *l, ampc_device_type device, ampc_dtype lower)
{
    ampc_dtype current = lower;
    for (Py_ssize_t i = 0; i < l->n; i++) {
        const leaf *f = &l->items[i];
        if (current == AMPC_FLOAT64) {
            PyErr_SetString(PyExc_RuntimeError, "promote type is double in at::autocast::prioritize");
            return -1;
        }
        if (!eligible(f, device))
            continue;
        if (current == AMPC_FLOAT32 || f->dtype == AMPC_FLOAT32) {
            current = AMPC_FLOAT32;
        }
        else if (!(current == lower && f->dtype == (int)lower)) {
            PyErr_SetString(PyExc_RuntimeError, "Unexpected floating ScalarType in at::autocast::prioritize");
            return -1;
        }
    }
    return current;
}

/* The float32 dtype of the library `type` belongs to (torch.float32 for
 * torch; NumPy's for NumPy, CuPy, JAX and the rest), asked of
 * ampc._interop once per type. Borrowed. */
static PyObject *float32_for(ampc_state *st, PyTypeObject *type)
{
    PyObject *dtype = PyDict_GetItemWithError(st->float32_for, (PyObject *)type);
    if (dtype != NULL || PyErr_Occurred())
        return dtype;
    if (st->interop == NULL && (st->interop = PyImport_ImportModule("ampc._interop")) == NULL)
        return NULL;
    dtype = PyObject_CallMethod(st->interop, "float32_for", "O", (PyObject *)type);
    if (dtype == NULL)
        return NULL;
    const int rc = PyDict_SetItem(st->float32_for, (PyObject *)type, dtype);
    Py_DECREF(dtype);
    return rc < 0 ? NULL : dtype;
}

/* ------------------------------------------------------------------------ */
/* ampc.AutocastOp                                                           */
/* ------------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    PyObject *func;
    op_policy *entry;       /* strong: the registry's entry for the op's name */
    ampc_state *st;
    PyObject *dict;
    PyObject *weakreflist;
    vectorcallfunc vectorcall;
} autocast_op;

#define OP(o) ((autocast_op *)(o))

static ampc_policy policy_in_region(const autocast_op *op, ampc_device_type device, int *failed)
{
    PyObject *overrides = ampc_autocast.overrides[device];
    if (overrides != NULL) {
        PyObject *p = PyDict_GetItemWithError(overrides, op->entry->name);
        if (p != NULL)
            return (ampc_policy)PyLong_AsLong(p);
        if (PyErr_Occurred())
            *failed = 1;
    }
    return (ampc_policy)op->entry->policy[device];
}

static int banned(const autocast_op *op, ampc_device_type device)
{
    if (PyUnicode_CompareWithASCIIString(op->entry->name, "binary_cross_entropy") == 0)
        PyErr_SetString(PyExc_RuntimeError, ampc_banned_bce_message);
    else
        PyErr_Format(PyExc_RuntimeError, "%U is unsafe to autocast: its policy on %s is 'banned'",
                     op->entry->name, device == AMPC_DEVICE_CUDA ? "cuda" : "cpu");
    return -1;
}

/* Index of keyword `name` among kwnames, or -1. */
static Py_ssize_t keyword_index(PyObject *kwnames, const char *name)
{
    const Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t k = 0; k < nkw; k++)
        if (PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, k), name) == 0)
            return k;
    return -1;
}

/* Whether any argument needs rebuilding when nothing is cast: a Parameter to
 * unwrap, or a container that may hold one. */
static int needs_unwrap(ampc_state *st, PyObject *const *args, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *a = args[i];
        if (ampc_is_parameter(st, a) || PyTuple_CheckExact(a) || PyList_CheckExact(a) || PyDict_CheckExact(a))
            return 1;
    }
    return 0;
}

/* Call func with each argument rebuilt by `c` and, if `dtype` is not NULL,
 * dtype=`dtype` (replacing the keyword where it was given as None). With
 * `suppress`, autocast ops that func calls run as called. */
static PyObject *call_rebuilt(autocast_op *op, rebuild_ctx *c, PyObject *const *args, Py_ssize_t nargs,
                              PyObject *kwnames, PyObject *dtype, int suppress)
{
    const Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    const Py_ssize_t dtype_at = dtype ? keyword_index(kwnames, "dtype") : -1;
    const Py_ssize_t n = nargs + nkw + (dtype && dtype_at < 0);
    PyObject *small[8], **argv = n <= 8 ? small : PyMem_Malloc((size_t)n * sizeof(PyObject *));
    PyObject *names = Py_XNewRef(kwnames), *result = NULL;
    Py_ssize_t built = 0;
    if (argv == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (; built < nargs + nkw; built++)
        if ((argv[built] = rebuild(c, args[built])) == NULL)
            goto done;
    if (dtype != NULL) {
        if (dtype_at >= 0) {
            Py_SETREF(argv[nargs + dtype_at], Py_NewRef(dtype));
        }
        else {
            PyObject *key = PyUnicode_InternFromString("dtype");
            PyObject *extra = key ? PyTuple_Pack(1, key) : NULL;
            Py_XDECREF(key);
            if (extra == NULL)
                goto done;
            Py_XSETREF(names, names ? PySequence_Concat(names, extra) : Py_NewRef(extra));
            Py_DECREF(extra);
            if (names == NULL)
                goto done;
            argv[built++] = Py_NewRef(dtype);
        }
    }
    /* Put back as found, not counted down: func may leave regions (in any
     * order), which restore the count their frames saved. */
    const int suppressed = ampc_autocast.suppressed;
    ampc_autocast.suppressed = suppressed + suppress;
    result = PyObject_Vectorcall(op->func, argv, (size_t)nargs, names);
    ampc_autocast.suppressed = suppressed;
done:
    for (Py_ssize_t i = 0; i < built; i++)
        Py_DECREF(argv[i]);
    if (argv != small)
        PyMem_Free(argv);
    Py_XDECREF(names);
    return result;
}

/* Inside a region: the op's policy for the device its arrays are on. */
static PyObject *dispatch(autocast_op *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    ampc_state *st = op->st;
    const ampc_autocast_tls *t = &ampc_autocast;
    const Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    rebuild_ctx c = {st, NULL, 0, AMPC_DEVICE_CPU, -1, 0, ampc_autocast.nesting};
    PyObject *result = NULL, *dtype = NULL;
    leaf_list leaves;
    leaves_init(&leaves);

    /* In-place forms (out=) are allowed but not autocast, as in torch. */
    const Py_ssize_t out_at = keyword_index(kwnames, "out");
    if (out_at >= 0 && args[nargs + out_at] != Py_None)
        return call_rebuilt(op, &c, args, nargs, kwnames, NULL, 0);

    Py_ssize_t first_leaves = 0;  /* leaves found in args[0] */
    for (Py_ssize_t i = 0; i < nargs + nkw; i++) {
        if (scan(st, args[i], &leaves) < 0)
            goto done;
        if (i == 0)
            first_leaves = leaves.n;
    }
    ampc_device_type device = AMPC_DEVICE_CPU;
    for (Py_ssize_t i = 0; i < leaves.n; i++)
        if (leaves.items[i].device.type == AMPC_DEVICE_CUDA)
            device = AMPC_DEVICE_CUDA;
    int failed = 0;
    const ampc_policy policy = leaves.n > 0 && t->enabled[device] ? policy_in_region(op, device, &failed)
                                                                   : AMPC_POLICY_NONE;
    if (failed)
        goto done;
    c.leaves = &leaves;
    c.device = device;
    if ((policy == AMPC_POLICY_LOWER_PRECISION_FP || policy == AMPC_POLICY_PROMOTE) &&
        !AMPC_DTYPE_IS_FLOAT(t->dtype[device])) {
        /* a disabled region's dtype (autocast("cpu", dtype=int32) warns and
         * disables, as torch's) turned on by set_autocast_enabled: torch would
         * cast to it; ampc casts only between floating dtypes */
        PyErr_Format(PyExc_RuntimeError, "autocast: the region's dtype on %s is %s, which is not a floating dtype; "
                     "%U cannot run in it", device == AMPC_DEVICE_CUDA ? "cuda" : "cpu",
                     ampc_dtype_names[t->dtype[device]], op->entry->name);
        goto done;
    }
    switch (policy) {
    case AMPC_POLICY_NONE:
        break;
    case AMPC_POLICY_LOWER_PRECISION_FP:
        c.target = t->dtype[device];
        c.cache = t->cache_enabled;
        break;
    case AMPC_POLICY_FP32:
        c.target = AMPC_FLOAT32;
        break;
    case AMPC_POLICY_PROMOTE:
        if ((c.target = promote_type(&leaves, device, t->dtype[device])) < 0)
            goto done;
        c.cache = t->cache_enabled && c.target == (int)t->dtype[device];
        break;
    case AMPC_POLICY_FP32_SET_OPT_DTYPE:
    case AMPC_POLICY_FP32_APPEND_DTYPE: {
        /* dtype=float32 if the first argument is an eligible array and the
         * caller gave no dtype; the arrays themselves are not cast. */
        const Py_ssize_t dtype_at = keyword_index(kwnames, "dtype");
        const int given = dtype_at >= 0 && args[nargs + dtype_at] != Py_None;
        const int first_array = nargs > 0 && first_leaves == 1 && (leaves.items[0].obj == args[0] ||
                                                                   leaves.items[0].param == args[0]);
        if (!given && first_array && eligible(&leaves.items[0], device) &&
            (dtype = Py_XNewRef(float32_for(st, leaves.items[0].view.source))) == NULL)
            goto done;
        break;
    }
    case AMPC_POLICY_BANNED:
    default:
        banned(op, device);
        goto done;
    }
    result = call_rebuilt(op, &c, args, nargs, kwnames, dtype, policy != AMPC_POLICY_NONE);
done:
    Py_XDECREF(dtype);
    leaves_release(&leaves);
    return result;
}

static PyObject *Op_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    autocast_op *op = OP(self);
    const Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (ampc_autocast_any_enabled())
        return dispatch(op, args, nargs, kwnames);
    const Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    if (!needs_unwrap(op->st, args, nargs + nkw))
        return PyObject_Vectorcall(op->func, args, nargsf, kwnames);
    rebuild_ctx c = {op->st, NULL, 0, AMPC_DEVICE_CPU, -1, 0, 0};
    return call_rebuilt(op, &c, args, nargs, kwnames, NULL, 0);
}

static PyObject *Op_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"func", "name", NULL};
    PyObject *func, *name;
    ampc_state *st = ampc_state_from_type(type);
    if (st == NULL || !PyArg_ParseTupleAndKeywords(args, kwargs, "OU:AutocastOp", kwlist, &func, &name))
        return NULL;
    if (!PyCallable_Check(func)) {
        PyErr_Format(PyExc_TypeError, "AutocastOp: func must be callable, got %.200s", Py_TYPE(func)->tp_name);
        return NULL;
    }
    op_policy *entry = entry_for(st, name);
    if (entry == NULL)
        return NULL;
    autocast_op *self = (autocast_op *)type->tp_alloc(type, 0);
    if (self == NULL) {
        Py_DECREF(entry);
        return NULL;
    }
    self->func = Py_NewRef(func);
    self->entry = entry;
    self->st = st;
    self->vectorcall = Op_vectorcall;
    return (PyObject *)self;
}

static int Op_traverse(PyObject *o, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(o));
    Py_VISIT(OP(o)->func);
    Py_VISIT(OP(o)->dict);
    return 0;
}

static int Op_clear(PyObject *o)
{
    Py_CLEAR(OP(o)->func);
    Py_CLEAR(OP(o)->dict);
    return 0;
}

static void Op_dealloc(PyObject *o)
{
    PyTypeObject *type = Py_TYPE(o);
    PyObject_GC_UnTrack(o);
    if (OP(o)->weakreflist != NULL)
        PyObject_ClearWeakRefs(o);
    Op_clear(o);
    Py_CLEAR(OP(o)->entry);
    type->tp_free(o);
    Py_DECREF(type);
}

static PyObject *Op_get_name(PyObject *o, void *Py_UNUSED(closure))
{
    return Py_NewRef(OP(o)->entry->name);
}

static PyObject *Op_get_func(PyObject *o, void *Py_UNUSED(closure))
{
    return Py_NewRef(OP(o)->func);
}

static PyObject *policies_dict(const op_policy *e)
{
    return Py_BuildValue("{s:s,s:s}", "cpu", ampc_policy_names[e->policy[AMPC_DEVICE_CPU]], "cuda",
                         ampc_policy_names[e->policy[AMPC_DEVICE_CUDA]]);
}

static PyObject *Op_get_policies(PyObject *o, void *Py_UNUSED(closure))
{
    return policies_dict(OP(o)->entry);
}

static PyObject *Op_repr(PyObject *o)
{
    return PyUnicode_FromFormat("<autocast op '%U' of %R>", OP(o)->entry->name, OP(o)->func);
}

static PyGetSetDef Op_getset[] = {
    {"name", Op_get_name, NULL, "The op name its policy is registered under.", NULL},
    {"func", Op_get_func, NULL, "The function it calls.", NULL},
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {"policies", Op_get_policies, NULL, "Its policy on 'cpu' and on 'cuda', as registered now.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef Op_members[] = {
    {"__dictoffset__", T_PYSSIZET, offsetof(autocast_op, dict), READONLY, NULL},
    {"__weaklistoffset__", T_PYSSIZET, offsetof(autocast_op, weakreflist), READONLY, NULL},
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(autocast_op, vectorcall), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

PyDoc_STRVAR(Op_doc,
"AutocastOp(func, name)\n--\n\n"
"func under the op name `name`: inside an autocast region its array arguments are cast by the\n"
"policy registered for that name (ampc.register_autocast, torch's op lists); outside one it runs\n"
"as called. Made by @ampc.autocast_op.");

static PyType_Slot Op_slots[] = {
    {Py_tp_new, Op_new},
    {Py_tp_dealloc, Op_dealloc},
    {Py_tp_traverse, Op_traverse},
    {Py_tp_clear, Op_clear},
    {Py_tp_call, PyVectorcall_Call},
    {Py_tp_descr_get, ampc_bind_as_method},
    {Py_tp_repr, Op_repr},
    {Py_tp_getset, Op_getset},
    {Py_tp_members, Op_members},
    {Py_tp_doc, (void *)Op_doc},
    {0, NULL},
};

static PyType_Spec Op_spec = {
    .name = "ampc.AutocastOp",
    .basicsize = sizeof(autocast_op),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .slots = Op_slots,
};

/* ------------------------------------------------------------------------ */
/* Module functions                                                          */
/* ------------------------------------------------------------------------ */

/* The device types an optional device_type argument names: both for None. */
static int device_range(PyObject *device_type, int *first, int *last)
{
    if (device_type == Py_None) {
        *first = 0;
        *last = AMPC_AUTOCAST_DEVICES - 1;
        return 0;
    }
    const int d = ampc_autocast_device_or_raise(device_type);
    *first = *last = d;
    return d < 0 ? -1 : 0;
}

static int parse_policy(PyObject *obj, const char *caller)
{
    const char *s = PyUnicode_Check(obj) ? PyUnicode_AsUTF8(obj) : NULL;
    const int p = s ? ampc_policy_from_name(s) : -1;
    if (p < 0 && !PyErr_Occurred())
        ampc_raise_with_repr(PyUnicode_Check(obj) ? PyExc_ValueError : PyExc_TypeError,
                             "%s: policy must be one of 'lower_precision_fp', 'fp32', 'fp32_set_opt_dtype', "
                             "'fp32_append_dtype', 'promote', 'banned' or 'none', got %U", caller, obj);
    return p;
}

/* _register_autocast(name, policy, device_type=None, strict=False): set the
 * op's policy. strict (the decorator's form) refuses to change a policy
 * already set to another one. */
static PyObject *mod_register_autocast(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"name", "policy", "device_type", "strict", NULL};
    ampc_state *st = ampc_state_of(module);
    PyObject *name, *policy_obj, *device_type = Py_None;
    int strict = 0, first, last;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "UO|Op:register_autocast", kwlist, &name, &policy_obj,
                                     &device_type, &strict))
        return NULL;
    const int policy = parse_policy(policy_obj, "register_autocast");
    if (policy < 0 || device_range(device_type, &first, &last) < 0)
        return NULL;
    op_policy *e = entry_for(st, name);
    if (e == NULL)
        return NULL;
    for (int d = first; strict && d <= last; d++) {
        if (e->policy[d] != AMPC_POLICY_NONE && e->policy[d] != policy) {
            PyErr_Format(PyExc_ValueError, "autocast_op: '%U' already has policy '%s' on %s; give the op "
                         "another name= or change the policy with ampc.register_autocast", name,
                         ampc_policy_names[e->policy[d]], d == AMPC_DEVICE_CUDA ? "cuda" : "cpu");
            Py_DECREF(e);
            return NULL;
        }
    }
    for (int d = first; d <= last; d++)
        e->policy[d] = (unsigned char)policy;
    Py_DECREF(e);
    Py_RETURN_NONE;
}

static PyObject *mod_autocast_policy(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyUnicode_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "autocast_policy(name, device_type) takes an op name and a device type");
        return NULL;
    }
    const int d = ampc_autocast_device_or_raise(args[1]);
    if (d < 0)
        return NULL;
    op_policy *e = (op_policy *)PyDict_GetItemWithError(ampc_state_of(module)->autocast_registry, args[0]);
    if (e == NULL && PyErr_Occurred())
        return NULL;
    return PyUnicode_FromString(ampc_policy_names[e ? e->policy[d] : AMPC_POLICY_NONE]);
}

static PyObject *mod_autocast_ops(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    PyObject *registry = ampc_state_of(module)->autocast_registry, *name, *entry, *out = PyDict_New();
    Py_ssize_t pos = 0;
    while (out != NULL && PyDict_Next(registry, &pos, &name, &entry)) {
        PyObject *p = policies_dict((op_policy *)entry);
        if (p == NULL || PyDict_SetItem(out, name, p) < 0)
            Py_CLEAR(out);
        Py_XDECREF(p);
    }
    return out;
}

/* _autocast_cast(value, device_type, dtype): torch.amp's _cast, for
 * custom_fwd's cast_inputs: every eligible array in value (nested lists,
 * tuples and dicts too) cast to dtype; the rest as it is. */
static PyObject *mod_autocast_cast(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    ampc_state *st = ampc_state_of(module);
    ampc_dtype dtype;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "_autocast_cast(value, device_type, dtype)");
        return NULL;
    }
    const int device = ampc_autocast_device_or_raise(args[1]);
    if (device < 0 || ampc_dtype_parse(st, args[2], "cast_inputs", &dtype) < 0)
        return NULL;
    if (!AMPC_DTYPE_IS_FLOAT(dtype)) {
        PyErr_Format(PyExc_TypeError, "cast_inputs must be a floating dtype, got %s", ampc_dtype_names[dtype]);
        return NULL;
    }
    leaf_list leaves;
    leaves_init(&leaves);
    PyObject *result = NULL;
    if (scan(st, args[0], &leaves) == 0) {
        rebuild_ctx c = {st, &leaves, 0, (ampc_device_type)device, dtype, 0, 0};
        result = rebuild(&c, args[0]);
    }
    leaves_release(&leaves);
    return result;
}

PyMethodDef ampc_autocast_dispatch_methods[] = {
    {"_register_autocast", (PyCFunction)(void (*)(void))mod_register_autocast, METH_VARARGS | METH_KEYWORDS,
     "Set an op name's autocast policy on one device type or both."},
    {"autocast_policy", (PyCFunction)(void (*)(void))mod_autocast_policy, METH_FASTCALL,
     "autocast_policy(name, device_type, /)\n--\n\nThe policy autocast applies to op `name` on the device type "
     "('none' if it has none)."},
    {"_autocast_ops", mod_autocast_ops, METH_NOARGS, "Every op name with a policy entry: {name: {device: policy}}."},
    {"_autocast_cast", (PyCFunction)(void (*)(void))mod_autocast_cast, METH_FASTCALL,
     "torch.amp's _cast: cast the eligible arrays of a nested value."},
    {NULL, NULL, 0, NULL},
};

int ampc_autocast_dispatch_init(PyObject *module, ampc_state *st)
{
    st->op_policy_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &OpPolicy_spec, NULL);
    st->autocast_op_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &Op_spec, NULL);
    st->autocast_registry = PyDict_New();
    st->cast_cache = PyDict_New();
    st->array_like_types = PyDict_New();
    st->float32_for = PyDict_New();
    if (st->op_policy_type == NULL || st->autocast_op_type == NULL || st->autocast_registry == NULL ||
        st->cast_cache == NULL || st->array_like_types == NULL || st->float32_for == NULL)
        return -1;
    for (int d = 0; d < AMPC_AUTOCAST_DEVICES; d++) {
        for (const ampc_autocast_listing *row = ampc_autocast_lists[d]; row->name != NULL; row++) {
            PyObject *name = PyUnicode_InternFromString(row->name);
            op_policy *e = name ? entry_for(st, name) : NULL;
            Py_XDECREF(name);
            if (e == NULL)
                return -1;
            e->policy[d] = (unsigned char)row->policy;
            Py_DECREF(e);
        }
    }
    return PyModule_AddType(module, st->autocast_op_type);
}
