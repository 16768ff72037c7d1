/*
 * dlpack.c: the DLPack consumer and producer, following the protocol exactly
 * (https://dmlc.github.io/dlpack/latest/python_spec.html).
 *
 * Consumer: ask for a versioned capsule (max_version), pass ampc's stream so
 * the producer orders its pending work before ampc's, fall back to the
 * legacy call on TypeError, validate every field before trusting it, then
 * rename the capsule to "used_..." and own the tensor until the ampc.Array
 * holding it dies. Legacy capsules cannot say whether the memory may be
 * written, so ampc treats them as read-only (as NumPy does since 2.3).
 *
 * Producer: one PyMem_Raw block holds the managed tensor, its shape and its
 * strides; the deleter takes the GIL, drops the owner and frees the block.
 */
#include "ampc.h"

#include <string.h>
#include "dlpack.h"

/* ------------------------------------------------------------------------ */
/* dtypes and devices                                                        */
/* ------------------------------------------------------------------------ */

/* Each dtype's DLPack type (dtypes.def); lanes are always 1. */
static const DLDataType dl_types[AMPC_NUM_DTYPES] = {
#define AMPC_DTYPE(ENUM, VALUE, NAME, SIZE, KIND, DL_CODE, DL_BITS, ...) [AMPC_##ENUM] = {DL_CODE, DL_BITS, 1},
#include "kernels/dtypes.def"
#undef AMPC_DTYPE
};

static int dtype_from_dl(DLDataType t)
{
    for (int d = 0; d < AMPC_NUM_DTYPES; d++)
        if (t.code == dl_types[d].code && t.bits == dl_types[d].bits && t.lanes == 1)
            return d;
    return -1;
}

static DLDataType dtype_to_dl(ampc_dtype d) { return dl_types[d]; }

/* ------------------------------------------------------------------------ */
/* Consumer                                                                  */
/* ------------------------------------------------------------------------ */

/* A DLPack device as ampc's: pinned host memory is the CPU's, managed memory
 * its GPU's. BufferError naming argname for any other device. */
static int device_from_dl(DLDevice d, const char *argname, ampc_device *out)
{
    switch (d.device_type) {
    case kDLCPU:
    case kDLCUDAHost:  /* pinned host memory */
        *out = (ampc_device){AMPC_DEVICE_CPU, 0};
        return 0;
    case kDLCUDA:
    case kDLCUDAManaged:
        if (d.device_id < 0) {
            PyErr_Format(PyExc_BufferError, "%s: DLPack device id %d is negative", argname,
                         (int)d.device_id);
            return -1;
        }
        *out = (ampc_device){AMPC_DEVICE_CUDA, d.device_id};
        return 0;
    default:
        PyErr_Format(PyExc_BufferError, "%s: DLPack device type %d is not supported (ampc reads "
                     "CPU and CUDA memory)", argname, (int)d.device_type);
        return -1;
    }
}

/* Check every field of a DLTensor and describe it. BufferError on anything
 * malformed; nothing is consumed here. */
static int view_from_dltensor(const DLTensor *t, const char *argname, ampc_view *v)
{
    if (device_from_dl(t->device, argname, &v->device) < 0)
        return -1;
    const int dtype = dtype_from_dl(t->dtype);
    if (dtype < 0) {
        PyErr_Format(PyExc_BufferError,
                     "%s: DLPack dtype (code %d, %d bits, %d lanes) is not supported", argname,
                     (int)t->dtype.code, (int)t->dtype.bits, (int)t->dtype.lanes);
        return -1;
    }
    v->dtype = (ampc_dtype)dtype;
    const int64_t itemsize = ampc_dtype_size(dtype);
    if (t->ndim < 0 || t->ndim > AMPC_MAX_NDIM) {
        PyErr_Format(PyExc_BufferError, "%s: DLPack ndim %d is outside 0..%d", argname,
                     (int)t->ndim, AMPC_MAX_NDIM);
        return -1;
    }
    v->ndim = t->ndim;
    if (v->ndim > 0 && t->shape == NULL) {
        PyErr_Format(PyExc_BufferError, "%s: DLPack shape is NULL", argname);
        return -1;
    }
    for (int d = 0; d < v->ndim; d++)
        v->shape[d] = t->shape[d];
    v->numel = ampc_layout_numel(v->ndim, v->shape, itemsize);
    if (v->numel < 0) {
        PyErr_Format(PyExc_BufferError, "%s: DLPack shape has a negative or too large dimension",
                     argname);
        return -1;
    }
    if (t->strides == NULL) {
        int64_t step = itemsize;  /* within numel's bound: no wrap */
        for (int d = v->ndim - 1; d >= 0; d--) {
            v->strides[d] = step;
            step *= v->shape[d] ? v->shape[d] : 1;
        }
    }
    else {
        for (int d = 0; d < v->ndim; d++) {
            if (ampc_size_mul(t->strides[d], itemsize, &v->strides[d]) < 0) {
                PyErr_Format(PyExc_BufferError, "%s: DLPack stride %lld is too large", argname,
                             (long long)t->strides[d]);
                return -1;
            }
        }
    }
    if (t->data == NULL && v->numel > 0) {
        PyErr_Format(PyExc_BufferError, "%s: DLPack data pointer is NULL", argname);
        return -1;
    }
    uintptr_t base = (uintptr_t)t->data;
    if (__builtin_add_overflow(base, t->byte_offset, &base)) {
        PyErr_Format(PyExc_BufferError, "%s: DLPack byte_offset runs past the address space",
                     argname);
        return -1;
    }
    if (v->numel > 0) {
        /* The elements must not wrap around the address space either. */
        int64_t lo, hi;
        if (ampc_layout_extent(v->ndim, v->shape, v->strides, itemsize, &lo, &hi) < 0) {
            PyErr_Format(PyExc_BufferError, "%s: DLPack strides span too much memory", argname);
            return -1;
        }
        uintptr_t first, last;
        if (__builtin_sub_overflow(base, (uintptr_t)0 - (uintptr_t)lo, &first) ||
            __builtin_add_overflow(base, (uintptr_t)hi, &last)) {
            PyErr_Format(PyExc_BufferError, "%s: DLPack tensor runs past the address space",
                         argname);
            return -1;
        }
        (void)first;
        (void)last;
    }
    /* The GPU kernels read and write whole elements (a misaligned one faults the CUDA context for
     * good); torch, CuPy and JAX never make such arrays. Strides count elements, so the first
     * element decides. */
    if (v->device.type == AMPC_DEVICE_CUDA && base % (uintptr_t)itemsize != 0) {
        PyErr_Format(PyExc_BufferError, "%s: DLPack data of a GPU array is not aligned to its %lld-byte "
                     "elements", argname, (long long)itemsize);
        return -1;
    }
    v->data = (char *)base;
    return 0;
}

/* Around a producer's code run on ampc's error paths (a deleter, a capsule's destructor): Python
 * perhaps (ctypes, pybind11, Cython), which must neither see the exception being raised nor clobber
 * it ("returned NULL without setting an exception"). What that code raises itself is unraisable. */
static PyObject *set_error_aside(void) { return ampc_take_exception(); }

static void put_error_back(PyObject *pending)
{
    if (PyErr_Occurred())
        PyErr_WriteUnraisable(NULL);
    if (pending != NULL)
        ampc_restore_exception(pending);
}

void ampc_dlpack_release(void *managed, int versioned)
{
    DLManagedTensorVersioned *mv = versioned ? managed : NULL;
    DLManagedTensor *ml = versioned ? NULL : managed;
    if (versioned ? mv->deleter == NULL : ml->deleter == NULL)
        return;
    PyObject *pending = set_error_aside();  /* a refused call's, as an Array is dropped on the way out */
    if (versioned)
        mv->deleter(mv);
    else
        ml->deleter(ml);
    put_error_back(pending);
}

/* Take a capsule (legacy or versioned, unconsumed) and return an ampc.Array
 * that owns its tensor. */
static PyObject *import_capsule(ampc_state *st, PyObject *capsule, const char *argname,
                                ampc_access access, void *stream)
{
    ampc_view v = {0};
    void *managed;
    int versioned;
    const DLTensor *t;
    if (PyCapsule_IsValid(capsule, DLPACK_VERSIONED_CAPSULE_NAME)) {
        DLManagedTensorVersioned *m = PyCapsule_GetPointer(capsule, DLPACK_VERSIONED_CAPSULE_NAME);
        if (m == NULL)
            return NULL;
        if (m->version.major != DLPACK_MAJOR_VERSION) {
            /* Only the deleter may be touched; the capsule still owns the
             * tensor and frees it when it dies. */
            PyErr_Format(PyExc_BufferError, "%s: DLPack version %u.%u is not supported (ampc "
                         "reads %d.x)", argname, m->version.major, m->version.minor,
                         DLPACK_MAJOR_VERSION);
            return NULL;
        }
        if (m->flags & DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED) {
            PyErr_Format(PyExc_BufferError, "%s: padded sub-byte DLPack types are not supported",
                         argname);
            return NULL;
        }
        managed = m;
        versioned = 1;
        t = &m->dl_tensor;
        v.readonly = (m->flags & DLPACK_FLAG_BITMASK_READ_ONLY) != 0;
        if (access == AMPC_FOR_WRITING && (m->flags & DLPACK_FLAG_BITMASK_IS_COPIED)) {
            PyErr_Format(PyExc_BufferError, "%s: the producer exported a copy, so writing into it "
                         "would be lost", argname);
            return NULL;
        }
    }
    else if (PyCapsule_IsValid(capsule, DLPACK_CAPSULE_NAME)) {
        DLManagedTensor *m = PyCapsule_GetPointer(capsule, DLPACK_CAPSULE_NAME);
        if (m == NULL)
            return NULL;
        managed = m;
        versioned = 0;
        t = &m->dl_tensor;
        v.readonly = 1;  /* a legacy capsule cannot say whether writing is allowed */
    }
    else {
        const char *name = PyCapsule_GetName(capsule);
        PyErr_Clear();
        if (name && (strcmp(name, DLPACK_CAPSULE_USED_NAME) == 0 ||
                     strcmp(name, DLPACK_VERSIONED_CAPSULE_USED_NAME) == 0))
            PyErr_Format(PyExc_BufferError, "%s: this DLPack capsule was already consumed", argname);
        else
            PyErr_Format(PyExc_TypeError, "%s: a PyCapsule named %s is not a DLPack tensor",
                         argname, name ? name : "NULL");
        return NULL;
    }
    if (view_from_dltensor(t, argname, &v) < 0)
        return NULL;
    if (v.device.type == AMPC_DEVICE_CUDA) {
        if (ampc_cuda_check_device(st, v.device.index) < 0)
            return NULL;
        /* that may have imported ampc._cuda, running Python with the GIL let go: a capsule that
         * another consumer took meanwhile is not taken a second time (two deleter calls) */
        const char *name = versioned ? DLPACK_VERSIONED_CAPSULE_NAME : DLPACK_CAPSULE_NAME;
        if (!PyCapsule_IsValid(capsule, name) || PyCapsule_GetPointer(capsule, name) != managed) {
            PyErr_Clear();
            PyErr_Format(PyExc_BufferError, "%s: the DLPack capsule was consumed while ampc read it", argname);
            return NULL;
        }
    }
    v.stream = stream;
    if (PyCapsule_SetName(capsule, versioned ? DLPACK_VERSIONED_CAPSULE_USED_NAME
                                             : DLPACK_CAPSULE_USED_NAME) < 0)
        return NULL;
    /* From here on ampc owns the tensor; ampc_array_from_dlpack releases it
     * on failure. */
    return ampc_array_from_dlpack(st, managed, versioned, &v);
}

/* ------------------------------------------------------------------------ */
/* The C exchange API (DLPack 1.3)                                            */
/* ------------------------------------------------------------------------ */

/* The type's exchange table, looked up once per type; NULL (no exception)
 * when it has none, or none ampc can read. */
static const DLPackExchangeAPI *exchange_api(ampc_state *st, PyTypeObject *type)
{
    PyObject *capsule = PyDict_GetItemWithError(st->exchange_apis, (PyObject *)type);
    if (capsule == NULL) {
        if (PyErr_Occurred())
            return NULL;
        capsule = PyObject_GetAttrString((PyObject *)type, DLPACK_EXCHANGE_API_ATTR);
        if (capsule == NULL || !PyCapsule_IsValid(capsule, DLPACK_EXCHANGE_API_CAPSULE)) {
            PyErr_Clear();
            Py_XSETREF(capsule, Py_NewRef(Py_None));
        }
        const int rc = PyDict_SetItem(st->exchange_apis, (PyObject *)type, capsule);
        Py_DECREF(capsule);  /* the dict holds it */
        if (rc < 0) {
            PyErr_Clear();
            return NULL;
        }
    }
    if (capsule == Py_None)
        return NULL;
    const DLPackExchangeAPI *api = PyCapsule_GetPointer(capsule, DLPACK_EXCHANGE_API_CAPSULE);
    /* The table's layout is DLPack 1.3's; another major version may differ. */
    if (api == NULL || api->header.version.major != DLPACK_MAJOR_VERSION || api->header.version.minor < 3 ||
        api->current_work_stream == NULL ||
        (api->dltensor_from_py_object_no_sync == NULL && api->managed_tensor_from_py_object_no_sync == NULL)) {
        PyErr_Clear();
        return NULL;
    }
    return api;
}

int ampc_dlpack_fast_view(ampc_state *st, PyObject *obj, const char *argname, ampc_view *v)
{
    const DLPackExchangeAPI *api = exchange_api(st, Py_TYPE(obj));
    if (api == NULL)
        return 0;
    memset(v, 0, sizeof *v);
    PyObject *owner;
    DLTensor t;
    if (api->managed_tensor_from_py_object_no_sync != NULL) {
        /* An owned tensor, released with the ampc.Array that holds it. Taken
         * first: it holds the producer's memory itself, where a borrowed
         * description holds only the object, whose memory Python code run
         * before the kernel (another argument's __dlpack__ or __index__ calling
         * torch's x.set_() or resize_()) could free under the view. */
        DLManagedTensorVersioned *m = NULL;
        if (api->managed_tensor_from_py_object_no_sync(obj, &m) < 0)
            return -1;
        t = m->dl_tensor;
        v->readonly = (m->flags & DLPACK_FLAG_BITMASK_READ_ONLY) != 0;
        if (m->version.major != DLPACK_MAJOR_VERSION || view_from_dltensor(&t, argname, v) < 0) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_BufferError, "%s: DLPack version %u is not supported", argname, m->version.major);
            ampc_dlpack_release(m, 1);
            return -1;
        }
        owner = ampc_array_from_dlpack(st, m, 1, v);
        if (owner == NULL)
            return -1;
    }
    else {
        /* A borrowed description (its shape and strides copied into v): the
         * object keeps the memory alive, as long as its type cannot swap it. */
        if (api->dltensor_from_py_object_no_sync(obj, &t) < 0 || view_from_dltensor(&t, argname, v) < 0)
            return -1;
        owner = Py_NewRef(obj);
    }
    if (v->device.type == AMPC_DEVICE_CUDA) {
        /* Nothing was synchronised: the producer's work is ordered on its
         * current stream, which ampc's kernels wait for (ampc_cast_views and
         * the scaler order themselves after view->stream). */
        void *stream = NULL;
        if (ampc_cuda_check_device(st, v->device.index) < 0) {
            Py_DECREF(owner);
            return -1;
        }
        /* The cache is the reading thread's: another thread reading its own list meanwhile (the GIL
         * moves between them whenever Python runs) has streams of its own. */
        const int cached = st->stream_cache_on && st->stream_cache_thread == PyThread_get_thread_ident();
        if (cached && st->stream_cache_api == api && st->stream_cache_device == v->device.index) {
            stream = st->stream_cache_stream;
        }
        else {
            if (api->current_work_stream(t.device.device_type, t.device.device_id, &stream) < 0) {
                Py_DECREF(owner);
                return -1;
            }
            if (cached) {
                st->stream_cache_api = api;
                st->stream_cache_device = v->device.index;
                st->stream_cache_stream = stream;
            }
        }
        v->stream = (uintptr_t)stream <= 1 ? NULL : stream;
    }
    v->owner = owner;
    return 1;
}

/* obj.__dlpack_device__() as (type, id); producers that predate it are CPU. */
static int producer_device(PyObject *obj, int *type, int *id)
{
    *type = kDLCPU;
    *id = 0;
    PyObject *dev = PyObject_CallMethod(obj, "__dlpack_device__", NULL);
    if (dev == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError))
            return -1;
        PyErr_Clear();
        return 0;
    }
    int ok = PyTuple_Check(dev) && PyTuple_GET_SIZE(dev) == 2;
    if (ok) {
        /* the items' __index__ may run Python, and the tuple keeps them alive meanwhile */
        const long t = PyLong_AsLong(PyTuple_GET_ITEM(dev, 0));
        const long i = t == -1 && PyErr_Occurred() ? -1 : PyLong_AsLong(PyTuple_GET_ITEM(dev, 1));
        ok = !PyErr_Occurred() && t >= 0 && t <= INT32_MAX && i >= INT32_MIN && i <= INT32_MAX;
        *type = (int)t;
        *id = (int)i;
    }
    Py_DECREF(dev);
    if (!ok) {
        /* a MemoryError, KeyboardInterrupt or SystemExit raised by an item's __index__ goes on up */
        if (PyErr_Occurred() && (PyErr_ExceptionMatches(PyExc_MemoryError) ||
                                 !PyErr_ExceptionMatches(PyExc_Exception)))
            return -1;
        PyErr_Clear();
        PyErr_SetString(PyExc_BufferError, "__dlpack_device__() must return a (device_type, "
                        "device_id) tuple of ints");
        return -1;
    }
    return 0;
}

int ampc_dlpack_device(ampc_state *st, PyObject *obj, const char *argname, ampc_device *device)
{
    int type, id;
    if (producer_device(obj, &type, &id) < 0)
        return -1;
    const DLDevice d = {type, id};
    if (device_from_dl(d, argname, device) < 0)
        return -1;
    /* Before anything asks for the memory or allocates beside it, make sure ampc can use it. */
    if (device->type == AMPC_DEVICE_CUDA && ampc_cuda_check_device(st, device->index) < 0)
        return -1;
    return 0;
}

/* obj.__dlpack__(**kwargs); a producer older than DLPack 1.0 raises TypeError
 * for max_version and copy, and is asked again with `stream` alone. */
static PyObject *call_dlpack(PyObject *obj, PyObject *kwargs)
{
    PyObject *method = PyObject_GetAttrString(obj, "__dlpack__");
    if (method == NULL)
        return NULL;
    PyObject *empty = PyTuple_New(0);
    PyObject *capsule = NULL;
    if (empty == NULL)
        goto done;
    capsule = PyObject_Call(method, empty, kwargs);
    if (capsule == NULL && PyErr_ExceptionMatches(PyExc_TypeError)) {
        PyErr_Clear();
        if ((PyDict_DelItemString(kwargs, "max_version") < 0) ||
            (PyDict_GetItemString(kwargs, "copy") && PyDict_DelItemString(kwargs, "copy") < 0))
            goto done;
        capsule = PyObject_Call(method, empty, kwargs);
    }
done:
    Py_XDECREF(empty);
    Py_DECREF(method);
    return capsule;
}

PyObject *ampc_dlpack_import(ampc_state *st, PyObject *obj, const char *argname, ampc_access access)
{
    PyObject *kwargs = NULL, *capsule = NULL, *result = NULL;
    void *stream = NULL;
    if (PyCapsule_CheckExact(obj))
        return import_capsule(st, obj, argname, access, NULL);

    ampc_device device;
    if (ampc_dlpack_device(st, obj, argname, &device) < 0)
        return NULL;
    const int cuda = device.type == AMPC_DEVICE_CUDA;
    if (cuda)
        stream = ampc_current_stream(device.index, NULL);

    kwargs = Py_BuildValue("{s:(ii)}", "max_version", DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION);
    if (kwargs == NULL)
        goto done;
    if (cuda) {
        PyObject *s = PyLong_FromLongLong(ampc_dlpack_stream_arg(stream));
        if (s == NULL || PyDict_SetItemString(kwargs, "stream", s) < 0) {
            Py_XDECREF(s);
            goto done;
        }
        Py_DECREF(s);
    }
    if (access == AMPC_FOR_WRITING && PyDict_SetItemString(kwargs, "copy", Py_False) < 0)
        goto done;

    capsule = call_dlpack(obj, kwargs);
    if (capsule == NULL)
        goto done;
    if (!PyCapsule_CheckExact(capsule)) {
        PyErr_Format(PyExc_TypeError, "%s.__dlpack__() returned %.200s, not a capsule", argname,
                     Py_TYPE(capsule)->tp_name);
        goto done;
    }
    result = import_capsule(st, capsule, argname, access, stream);
done:
    Py_XDECREF(kwargs);
    if (result == NULL && capsule != NULL) {
        /* a refused capsule dies here, and its destructor (the producer's) frees the tensor */
        PyObject *pending = set_error_aside();
        Py_DECREF(capsule);
        put_error_back(pending);
    }
    else {
        Py_XDECREF(capsule);
    }
    return result;
}

/* ------------------------------------------------------------------------ */
/* Producer                                                                  */
/* ------------------------------------------------------------------------ */

/* The deleters may run on any thread, with or without the GIL, and even
 * while the interpreter shuts down, when leaking is the only safe choice. */
static void release_export(void *block, PyObject *owner)
{
    if (!Py_IsInitialized())
        return;
    PyGILState_STATE gil = PyGILState_Ensure();
    Py_XDECREF(owner);
    PyMem_RawFree(block);
    PyGILState_Release(gil);
}

static void deleter_versioned(DLManagedTensorVersioned *self)
{
    release_export(self, (PyObject *)self->manager_ctx);
}

static void deleter_legacy(DLManagedTensor *self)
{
    release_export(self, (PyObject *)self->manager_ctx);
}

/* Called when the capsule dies: free the tensor unless a consumer took it. */
static void capsule_destructor(PyObject *capsule)
{
#if PY_VERSION_HEX >= 0x030C0000
    PyObject *saved = PyErr_GetRaisedException();
#else
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
#endif
    if (PyCapsule_IsValid(capsule, DLPACK_VERSIONED_CAPSULE_NAME)) {
        DLManagedTensorVersioned *m = PyCapsule_GetPointer(capsule, DLPACK_VERSIONED_CAPSULE_NAME);
        if (m && m->deleter)
            m->deleter(m);
    }
    else if (PyCapsule_IsValid(capsule, DLPACK_CAPSULE_NAME)) {
        DLManagedTensor *m = PyCapsule_GetPointer(capsule, DLPACK_CAPSULE_NAME);
        if (m && m->deleter)
            m->deleter(m);
    }
    if (PyErr_Occurred())
        PyErr_WriteUnraisable(capsule);
#if PY_VERSION_HEX >= 0x030C0000
    PyErr_SetRaisedException(saved);
#else
    PyErr_Restore(type, value, tb);
#endif
}

/* The DLPack description of `view`, owning a reference to `owner` (released
 * by its deleter): a DLManagedTensorVersioned, or a legacy DLManagedTensor.
 * NULL with an exception. */
static void *managed_tensor(const ampc_view *v, PyObject *owner, int versioned, unsigned minor, int copied)
{
    const int64_t itemsize = ampc_dtype_size(v->dtype);
    for (int d = 0; d < v->ndim; d++) {
        if (v->strides[d] % itemsize != 0 && v->shape[d] > 1) {
            PyErr_SetString(PyExc_BufferError, "cannot export through DLPack: a stride is not a "
                            "multiple of the element size");
            return NULL;
        }
    }
    const size_t header = versioned ? sizeof(DLManagedTensorVersioned) : sizeof(DLManagedTensor);
    char *block = PyMem_RawMalloc(header + 2 * (size_t)v->ndim * sizeof(int64_t) + 1);
    if (block == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    int64_t *shape = (int64_t *)(block + header);
    int64_t *strides = shape + v->ndim;
    DLTensor *t;
    if (versioned) {
        DLManagedTensorVersioned *m = (DLManagedTensorVersioned *)block;
        m->version.major = DLPACK_MAJOR_VERSION;
        m->version.minor = minor;
        m->manager_ctx = owner;
        m->deleter = deleter_versioned;
        m->flags = (v->readonly ? DLPACK_FLAG_BITMASK_READ_ONLY : 0) |
                   (copied ? DLPACK_FLAG_BITMASK_IS_COPIED : 0);
        t = &m->dl_tensor;
    }
    else {
        DLManagedTensor *m = (DLManagedTensor *)block;
        m->manager_ctx = owner;
        m->deleter = deleter_legacy;
        t = &m->dl_tensor;
    }
    for (int d = 0; d < v->ndim; d++) {
        shape[d] = v->shape[d];
        strides[d] = v->strides[d] / itemsize;
    }
    t->data = v->data;  /* the first element's address, byte_offset 0, as NumPy does */
    t->byte_offset = 0;
    t->device.device_type = v->device.type == AMPC_DEVICE_CUDA ? kDLCUDA : kDLCPU;
    t->device.device_id = v->device.type == AMPC_DEVICE_CUDA ? v->device.index : 0;
    t->ndim = v->ndim;
    t->dtype = dtype_to_dl(v->dtype);
    t->shape = shape;
    t->strides = strides;

    Py_INCREF(owner);
    return block;
}

PyObject *ampc_dlpack_export(const ampc_view *v, PyObject *owner, int versioned,
                             unsigned minor, int copied)
{
    void *block = managed_tensor(v, owner, versioned, minor, copied);
    if (block == NULL)
        return NULL;
    PyObject *capsule = PyCapsule_New(block, versioned ? DLPACK_VERSIONED_CAPSULE_NAME
                                                       : DLPACK_CAPSULE_NAME, capsule_destructor);
    if (capsule == NULL) {
        Py_DECREF(owner);
        PyMem_RawFree(block);
    }
    return capsule;
}

int ampc_dlpack_fast_return(ampc_state *st, const ampc_view *v, PyObject *owner, PyTypeObject *type,
                            PyObject **out)
{
    const DLPackExchangeAPI *api = exchange_api(st, type);
    if (api == NULL || api->managed_tensor_to_py_object_no_sync == NULL)
        return 0;
    if (v->device.type == AMPC_DEVICE_CUDA) {
        /* The library's work goes on its current stream: order it after
         * what ampc wrote on the view's. */
        void *consumer = NULL;
        if (api->current_work_stream(kDLCUDA, v->device.index, &consumer) < 0)
            return -1;
        if (consumer != v->stream) {
            const int status = ampc_backend_of(st, v->device)->stream_wait(v->device.index, consumer, v->stream);
            if (status != AMPC_OK)
                return ampc_backend_raise(st, v->device, status, "ordering the consumer's stream");
        }
    }
    DLManagedTensorVersioned *m = managed_tensor(v, owner, 1, DLPACK_MINOR_VERSION, 0);
    if (m == NULL)
        return -1;
    void *result = NULL;
    if (api->managed_tensor_to_py_object_no_sync(m, &result) < 0)
        return -1;  /* the tensor was stolen, freed by the library */
    *out = (PyObject *)result;
    return 1;
}
