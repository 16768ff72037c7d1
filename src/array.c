/*
 * array.c: ampc.Array, the array type ampc returns when the caller's own type
 * cannot be used (the input was an ampc.Array, a bare capsule, or an object
 * of an unknown library) and the vehicle for every export: it implements
 * __dlpack__ and __dlpack_device__, so CuPy, torch, JAX and NumPy take it
 * without a copy, and __array__ for CPU memory (including bfloat16, which
 * NumPy's own DLPack cannot carry).
 *
 * An Array's memory is one of:
 *   - borrowed from `base` (an ndarray: CPU results, from_dlpack(ndarray));
 *   - an imported DLPack tensor, released through its deleter when the Array dies;
 *   - a block of ampc's stream-ordered CUDA pool, returned on the stream it was
 *     allocated on (whose Python object `stream_owner` keeps alive until then).
 */
#include "ampc.h"

#include <structmember.h>
#include "dlpack.h"

typedef struct {
    PyObject_HEAD
    ampc_view view;               /* owner and source stay NULL */
    PyObject *base;
    void *dl_managed;
    int dl_versioned;
    const ampc_backend *backend;  /* the device's, kept for the free at dealloc */
    void *pool_ptr;
    size_t pool_nbytes;
    PyObject *stream_owner;
    PyObject *weakreflist;
} ArrayObject;

#define ARRAY(o) ((ArrayObject *)(o))

int ampc_is_array(ampc_state *st, PyObject *obj) { return Py_TYPE(obj) == st->array_type; }

const ampc_view *ampc_array_view(PyObject *array) { return &ARRAY(array)->view; }

static ArrayObject *array_alloc(ampc_state *st, const ampc_view *view)
{
    ArrayObject *self = (ArrayObject *)st->array_type->tp_alloc(st->array_type, 0);
    if (self == NULL)
        return NULL;
    self->view = *view;
    self->view.owner = NULL;
    self->view.source = NULL;
    return self;
}

PyObject *ampc_array_from_ndarray(ampc_state *st, PyArrayObject *ndarray)
{
    ampc_view v;
    if (ampc_view_from_ndarray(st, ndarray, "array", &v) < 0)
        return NULL;
    ArrayObject *self = array_alloc(st, &v);
    if (self != NULL)
        self->base = v.owner;  /* takes the view's reference */
    else
        ampc_view_release(&v);
    return (PyObject *)self;
}

PyObject *ampc_array_from_dlpack(ampc_state *st, void *managed, int versioned, const ampc_view *view)
{
    ArrayObject *self = array_alloc(st, view);
    if (self == NULL) {
        ampc_dlpack_release(managed, versioned);
        return NULL;
    }
    self->dl_managed = managed;
    self->dl_versioned = versioned;
    self->backend = ampc_backend_of(st, view->device);
    return (PyObject *)self;
}

/* The ValueError for a shape whose size in bytes does not fit in int64 (or has a negative
 * dimension). Returns NULL. */
static PyObject *too_large(int ndim, const int64_t *shape, ampc_dtype dtype)
{
    ampc_view v = {.ndim = ndim};
    char buf[256];
    for (int d = 0; d < ndim; d++)
        v.shape[d] = shape[d];
    ampc_shape_str(&v, buf, sizeof buf);
    PyErr_Format(PyExc_ValueError, "an array of shape %s and dtype %s is too large (more than 2**63 bytes, or a "
                 "negative dimension)", buf, ampc_dtype_names[dtype]);
    return NULL;
}

PyObject *ampc_empty_like(ampc_state *st, const ampc_view *like, ampc_dtype dtype, ampc_view *out)
{
    if (ampc_layout_numel(like->ndim, like->shape, ampc_dtype_size(dtype)) < 0)
        return too_large(like->ndim, like->shape, dtype);
    int64_t strides[AMPC_MAX_NDIM];
    ampc_layout_korder_strides(like->ndim, like->shape, like->strides, ampc_dtype_size(dtype), strides);
    return ampc_array_empty(st, like->device, dtype, like->ndim, like->shape, strides, out);
}

PyObject *ampc_array_empty(ampc_state *st, ampc_device device, ampc_dtype dtype, int ndim,
                           const int64_t *shape, const int64_t *strides, ampc_view *out)
{
    const int64_t itemsize = ampc_dtype_size(dtype);
    ampc_view v = {0};
    v.dtype = dtype;
    v.ndim = ndim;
    v.device = device;
    v.numel = ampc_layout_numel(ndim, shape, itemsize);
    if (v.numel < 0)
        return too_large(ndim, shape, dtype);
    for (int d = 0; d < ndim; d++)
        v.shape[d] = shape[d];
    if (strides != NULL) {
        for (int d = 0; d < ndim; d++)
            v.strides[d] = strides[d];
    }
    else {
        int64_t step = itemsize;
        for (int d = ndim - 1; d >= 0; d--) {
            v.strides[d] = step;
            step *= shape[d] > 0 ? shape[d] : 1;
        }
    }

    if (device.type == AMPC_DEVICE_CPU) {
        npy_intp dims[AMPC_MAX_NDIM], npy_strides[AMPC_MAX_NDIM];
        for (int d = 0; d < v.ndim; d++) {
            dims[d] = (npy_intp)v.shape[d];
            npy_strides[d] = (npy_intp)v.strides[d];
        }
        PyArray_Descr *descr = st->descr[dtype];
        Py_INCREF(descr);
        /* With data == NULL, NumPy allocates numel * itemsize bytes and keeps
         * the given (dense) strides. */
        PyObject *a = PyArray_NewFromDescr(&PyArray_Type, descr, v.ndim, dims, npy_strides, NULL, 0, NULL);
        if (a == NULL)
            return NULL;
        v.data = PyArray_BYTES((PyArrayObject *)a);
        v.stream = NULL;
        *out = v;
        return a;
    }

    PyObject *stream_owner = NULL;
    const int index = device.index;
    v.stream = ampc_current_stream(index, &stream_owner);
    const size_t nbytes = (size_t)(v.numel * itemsize);
    void *ptr = NULL;
    if (nbytes > 0) {
        const int status = ampc_backend_of(st, device)->alloc(index, nbytes, v.stream, &ptr);
        if (status != AMPC_OK) {
            ampc_backend_raise(st, device, status, "allocating GPU memory");
            return NULL;
        }
    }
    v.data = ptr;
    ArrayObject *self = array_alloc(st, &v);
    if (self == NULL) {
        if (ptr)
            ampc_backend_of(st, device)->free(index, ptr, nbytes, v.stream);
        return NULL;
    }
    self->backend = ampc_backend_of(st, device);
    self->pool_ptr = ptr;
    self->pool_nbytes = nbytes;
    Py_XINCREF(stream_owner);
    self->stream_owner = stream_owner;
    *out = v;
    return (PyObject *)self;
}

PyObject *ampc_array_view_into(ampc_state *st, PyObject *owner, const ampc_view *view)
{
    ArrayObject *self = array_alloc(st, view);
    if (self == NULL)
        return NULL;
    Py_INCREF(owner);
    self->base = owner;
    self->backend = ampc_backend_of(st, view->device);
    return (PyObject *)self;
}

static void Array_dealloc(PyObject *op)
{
    ArrayObject *self = ARRAY(op);
    PyTypeObject *type = Py_TYPE(op);
    if (self->weakreflist != NULL)
        PyObject_ClearWeakRefs(op);
    if (self->dl_managed != NULL)
        ampc_dlpack_release(self->dl_managed, self->dl_versioned);
    if (self->pool_ptr != NULL) {
        /* Nothing can be raised from here; a failure (the CUDA runtime is
         * already unloading at exit) only leaks the block. */
        (void)self->backend->free(self->view.device.index, self->pool_ptr, self->pool_nbytes,
                               self->view.stream);
    }
    Py_XDECREF(self->base);
    Py_XDECREF(self->stream_owner);
    type->tp_free(op);
    Py_DECREF(type);
}

/* ------------------------------------------------------------------------ */
/* DLPack export                                                             */
/* ------------------------------------------------------------------------ */

/* The consumer's stream argument as a handle; `sync` is 0 for -1 ("do not
 * synchronise"). Values per the array API: None and 1 are the legacy default
 * stream, 2 the per-thread default, anything larger a cudaStream_t. 0 is
 * ambiguous in the standard; CuPy treats it as the legacy default, so does ampc. */
static int consumer_stream(PyObject *arg, void **stream, int *sync)
{
    *stream = NULL;
    *sync = 1;
    if (arg == Py_None)
        return 0;
    const long long v = PyLong_AsLongLong(arg);
    if (v == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "__dlpack__: stream must be an int or None, got %.200s",
                     Py_TYPE(arg)->tp_name);
        return -1;
    }
    if (v == -1)
        *sync = 0;
    else if (v == 2)
        *stream = (void *)(uintptr_t)2;  /* cudaStreamPerThread */
    else if (v > 2)
        *stream = (void *)(uintptr_t)v;
    else if (v < -1) {
        PyErr_Format(PyExc_ValueError, "__dlpack__: stream %lld is not a valid CUDA stream", v);
        return -1;
    }
    return 0;
}

static int parse_max_version(PyObject *arg, int *versioned, unsigned *minor)
{
    *versioned = 0;
    *minor = DLPACK_MINOR_VERSION;
    if (arg == Py_None)
        return 0;
    if (!PyTuple_Check(arg) || PyTuple_GET_SIZE(arg) != 2) {
        PyErr_SetString(PyExc_TypeError, "__dlpack__: max_version must be a (major, minor) tuple");
        return -1;
    }
    const long major = PyLong_AsLong(PyTuple_GET_ITEM(arg, 0));
    const long min = PyLong_AsLong(PyTuple_GET_ITEM(arg, 1));
    if (PyErr_Occurred())
        return -1;
    if (major >= DLPACK_MAJOR_VERSION) {
        *versioned = 1;
        if (major == DLPACK_MAJOR_VERSION && min >= 0 && min < DLPACK_MINOR_VERSION)
            *minor = (unsigned)min;
    }
    return 0;
}

static int check_dl_device(ArrayObject *self, PyObject *arg)
{
    if (arg == Py_None)
        return 0;
    int type, id;
    if (!PyArg_ParseTuple(arg, "ii;__dlpack__: dl_device must be a (device_type, device_id) tuple",
                          &type, &id))
        return -1;
    const ampc_device dev = self->view.device;
    const int same = dev.type == AMPC_DEVICE_CPU ? type == kDLCPU
                                                 : (type == kDLCUDA && id == dev.index);
    if (!same) {
        char buf[32];
        PyErr_Format(PyExc_BufferError, "__dlpack__: the array is on %s and ampc does not copy it "
                     "to DLPack device (%d, %d)", ampc_device_str(dev, buf, sizeof buf), type, id);
        return -1;
    }
    return 0;
}

static PyObject *Array_dlpack(PyObject *op, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"stream", "max_version", "dl_device", "copy", NULL};
    ArrayObject *self = ARRAY(op);
    PyObject *stream_arg = Py_None, *max_version = Py_None, *dl_device = Py_None, *copy = Py_None;
    PyObject *copy_owner = NULL, *capsule = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|$OOOO:__dlpack__", kwlist, &stream_arg,
                                     &max_version, &dl_device, &copy))
        return NULL;
    int versioned;
    unsigned minor;
    if (parse_max_version(max_version, &versioned, &minor) < 0 || check_dl_device(self, dl_device) < 0)
        return NULL;
    if (copy != Py_None && !PyBool_Check(copy)) {
        PyErr_SetString(PyExc_TypeError, "__dlpack__: copy must be True, False or None");
        return NULL;
    }
    const int cuda = self->view.device.type == AMPC_DEVICE_CUDA;
    void *consumer = NULL;
    int sync = 0;
    if (cuda) {
        if (consumer_stream(stream_arg, &consumer, &sync) < 0)
            return NULL;
    }
    else if (stream_arg != Py_None) {
        PyErr_SetString(PyExc_ValueError, "__dlpack__: stream must be None for a CPU array");
        return NULL;
    }
    const ampc_view *export = &self->view;
    ampc_view copied;
    if (copy == Py_True) {
        ampc_state *st = ampc_state_from_type(Py_TYPE(op));
        copy_owner = ampc_empty_like(st, &self->view, self->view.dtype, &copied);
        if (copy_owner == NULL || ampc_cast_views(st, &copied, &self->view, 1) < 0)
            goto done;
        export = &copied;
    }
    if (export->readonly && !versioned) {
        PyErr_SetString(PyExc_BufferError, "cannot export a read-only array as a legacy DLPack "
                        "capsule, which cannot mark it read-only; ask for max_version=(1, 0)");
        goto done;
    }
    if (cuda && sync && consumer != export->stream) {
        const int status = self->backend->stream_wait(self->view.device.index, consumer, export->stream);
        if (status != AMPC_OK) {
            ampc_backend_raise(ampc_state_from_type(Py_TYPE(op)), self->view.device, status,
                               "ordering the consumer's stream");
            goto done;
        }
    }
    capsule = ampc_dlpack_export(export, copy_owner ? copy_owner : op, versioned, minor,
                                 copy_owner != NULL);
done:
    Py_XDECREF(copy_owner);
    return capsule;
}

static PyObject *Array_dlpack_device(PyObject *op, PyObject *Py_UNUSED(ignored))
{
    const ampc_device dev = ARRAY(op)->view.device;
    if (dev.type == AMPC_DEVICE_CUDA)
        return Py_BuildValue("(ii)", kDLCUDA, dev.index);
    return Py_BuildValue("(ii)", kDLCPU, 0);
}

/* ------------------------------------------------------------------------ */
/* NumPy interop and attributes                                              */
/* ------------------------------------------------------------------------ */

static PyObject *Array_array(PyObject *op, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"dtype", "copy", NULL};
    ArrayObject *self = ARRAY(op);
    PyObject *dtype = Py_None, *copy = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|OO:__array__", kwlist, &dtype, &copy))
        return NULL;
    if (self->view.device.type != AMPC_DEVICE_CPU) {
        char buf[32];
        PyErr_Format(PyExc_TypeError, "this ampc.Array is on %s; copy it to the host first, e.g. "
                     "cupy.asnumpy(cupy.from_dlpack(a)) or torch.from_dlpack(a).cpu()",
                     ampc_device_str(self->view.device, buf, sizeof buf));
        return NULL;
    }
    ampc_state *st = ampc_state_from_type(Py_TYPE(op));
    npy_intp dims[AMPC_MAX_NDIM], strides[AMPC_MAX_NDIM];
    for (int d = 0; d < self->view.ndim; d++) {
        dims[d] = (npy_intp)self->view.shape[d];
        strides[d] = (npy_intp)self->view.strides[d];
    }
    PyArray_Descr *descr = st->descr[self->view.dtype];
    Py_INCREF(descr);
    PyObject *a = PyArray_NewFromDescr(&PyArray_Type, descr, self->view.ndim, dims, strides,
                                       self->view.data,
                                       self->view.readonly ? 0 : NPY_ARRAY_WRITEABLE, NULL);
    if (a == NULL)
        return NULL;
    Py_INCREF(op);
    if (PyArray_SetBaseObject((PyArrayObject *)a, op) < 0) {
        Py_DECREF(a);
        return NULL;
    }
    /* NumPy 2's protocol: copy=True always copies, copy=False never does
     * (ValueError if the dtype asks for a conversion), None copies if needed. */
    PyArray_Descr *want = NULL;
    if (dtype != Py_None && PyArray_DescrConverter(dtype, &want) != NPY_SUCCEED) {
        Py_DECREF(a);
        return NULL;
    }
    PyObject *res = a;
    if (want != NULL && !PyArray_EquivTypes(want, descr)) {
        if (copy == Py_False) {
            PyErr_SetString(PyExc_ValueError, "__array__: converting the dtype needs a copy, but "
                            "copy=False was asked for");
            res = NULL;
        }
        else {
            Py_INCREF(want);
            res = PyArray_CastToType((PyArrayObject *)a, want, 0);
        }
        Py_DECREF(a);
    }
    else if (copy == Py_True) {
        res = PyArray_NewCopy((PyArrayObject *)a, NPY_KEEPORDER);
        Py_DECREF(a);
    }
    Py_XDECREF(want);
    return res;
}

static PyObject *int64_tuple(int n, const int64_t *values)
{
    PyObject *t = PyTuple_New(n);
    if (t == NULL)
        return NULL;
    for (int i = 0; i < n; i++) {
        PyObject *v = PyLong_FromLongLong(values[i]);
        if (v == NULL) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, i, v);
    }
    return t;
}

static PyObject *Array_get_shape(PyObject *op, void *Py_UNUSED(c))
{
    return int64_tuple(ARRAY(op)->view.ndim, ARRAY(op)->view.shape);
}

static PyObject *Array_get_strides(PyObject *op, void *Py_UNUSED(c))
{
    return int64_tuple(ARRAY(op)->view.ndim, ARRAY(op)->view.strides);
}

static PyObject *Array_get_dtype(PyObject *op, void *Py_UNUSED(c))
{
    PyObject *d = (PyObject *)ampc_state_from_type(Py_TYPE(op))->descr[ARRAY(op)->view.dtype];
    Py_INCREF(d);
    return d;
}

static PyObject *Array_get_ndim(PyObject *op, void *Py_UNUSED(c))
{
    return PyLong_FromLong(ARRAY(op)->view.ndim);
}

static PyObject *Array_get_size(PyObject *op, void *Py_UNUSED(c))
{
    return PyLong_FromLongLong(ARRAY(op)->view.numel);
}

static PyObject *Array_get_itemsize(PyObject *op, void *Py_UNUSED(c))
{
    return PyLong_FromLongLong(ampc_dtype_size(ARRAY(op)->view.dtype));
}

static PyObject *Array_get_nbytes(PyObject *op, void *Py_UNUSED(c))
{
    return PyLong_FromLongLong(ARRAY(op)->view.numel * ampc_dtype_size(ARRAY(op)->view.dtype));
}

static PyObject *Array_get_device(PyObject *op, void *Py_UNUSED(c))
{
    char buf[32];
    return PyUnicode_FromString(ampc_device_str(ARRAY(op)->view.device, buf, sizeof buf));
}

static PyObject *Array_get_readonly(PyObject *op, void *Py_UNUSED(c))
{
    return PyBool_FromLong(ARRAY(op)->view.readonly);
}

static PyObject *Array_data_ptr(PyObject *op, PyObject *Py_UNUSED(ignored))
{
    return PyLong_FromVoidPtr(ARRAY(op)->view.data);
}

/* Another view of the same memory: shape, strides (bytes) and a byte offset
 * from this array's first element, all inside the bytes this array spans.
 * What reshape, transpose and slicing of ampc arrays are made of
 * (ampc/nn/_ampc_arrays.py). */
static PyObject *Array_view(PyObject *op, PyObject *args)
{
    ArrayObject *self = ARRAY(op);
    PyObject *shape_obj, *strides_obj;
    long long offset;
    if (!PyArg_ParseTuple(args, "OOL:_view", &shape_obj, &strides_obj, &offset))
        return NULL;
    ampc_view v = self->view;
    const int ndim = ampc_parse_int64s(shape_obj, "_view: shape", v.shape, 0);
    const int nstrides = ndim < 0 ? -1 : ampc_parse_int64s(strides_obj, "_view: strides", v.strides, 1);
    if (nstrides < 0)
        return NULL;
    const int64_t itemsize = ampc_dtype_size(v.dtype);
    if (nstrides != ndim) {
        PyErr_SetString(PyExc_ValueError, "_view: shape and strides differ in length");
        return NULL;
    }
    v.ndim = ndim;
    v.numel = ampc_layout_numel(ndim, v.shape, itemsize);
    int aligned = offset % itemsize == 0;
    for (int d = 0; d < ndim; d++)
        aligned &= v.strides[d] % itemsize == 0;
    if (v.numel < 0 || !aligned) {
        PyErr_SetString(PyExc_ValueError, "_view: sizes too large, or strides and offset not whole elements");
        return NULL;
    }
    if (v.numel > 0) {
        /* every sum checked: (5 - 1) * 2**62 wrapped to 0 and passed, a view of wild memory */
        int64_t lo, hi, own_lo = 0, own_hi = 0, first, last;
        if (ampc_layout_extent(ndim, v.shape, v.strides, itemsize, &lo, &hi) < 0 ||
            ampc_size_add(offset, lo, &first) < 0 || ampc_size_add(offset, hi, &last) < 0) {
            PyErr_SetString(PyExc_ValueError, "_view: the view's strides and offset span more than 2**63 bytes");
            return NULL;
        }
        if (self->view.numel > 0 &&
            ampc_layout_extent(self->view.ndim, self->view.shape, self->view.strides, itemsize, &own_lo, &own_hi) < 0) {
            PyErr_SetString(PyExc_SystemError, "_view: the array's own layout spans more than 2**63 bytes");
            return NULL;
        }
        if (self->view.numel == 0 || first < own_lo || last > own_hi) {
            PyErr_SetString(PyExc_ValueError, "_view: the view reaches outside the array's memory");
            return NULL;
        }
    }
    v.data = (char *)self->view.data + offset;
    return ampc_array_view_into(ampc_state_from_type(Py_TYPE(op)), op, &v);
}

static PyObject *Array_repr(PyObject *op)
{
    ArrayObject *self = ARRAY(op);
    char buf[32];
    PyObject *shape = Array_get_shape(op, NULL);
    if (shape == NULL)
        return NULL;
    PyObject *r = PyUnicode_FromFormat("ampc.Array(shape=%R, dtype=%s, device='%s')", shape,
                                       ampc_dtype_names[self->view.dtype],
                                       ampc_device_str(self->view.device, buf, sizeof buf));
    Py_DECREF(shape);
    return r;
}

PyDoc_STRVAR(Array_dlpack_doc,
"__dlpack__($self, /, *, stream=None, max_version=None, dl_device=None, copy=None)\n--\n\n"
"Export through DLPack: a versioned capsule when max_version >= (1, 0), else a legacy one.\n"
"For GPU arrays the consumer's stream is made to wait for the work that wrote this array.");

PyDoc_STRVAR(Array_dlpack_device_doc,
"__dlpack_device__($self, /)\n--\n\n(device_type, device_id) as DLPack numbers them.");

PyDoc_STRVAR(Array_array_doc,
"__array__($self, /, dtype=None, copy=None)\n--\n\nA NumPy view of CPU memory (no copy unless asked).");

PyDoc_STRVAR(Array_data_ptr_doc,
"data_ptr($self, /)\n--\n\nThe address of the first element, as an int.");

static PyMethodDef Array_methods[] = {
    {"__dlpack__", (PyCFunction)(void (*)(void))Array_dlpack, METH_VARARGS | METH_KEYWORDS, Array_dlpack_doc},
    {"__dlpack_device__", Array_dlpack_device, METH_NOARGS, Array_dlpack_device_doc},
    {"__array__", (PyCFunction)(void (*)(void))Array_array, METH_VARARGS | METH_KEYWORDS, Array_array_doc},
    {"data_ptr", Array_data_ptr, METH_NOARGS, Array_data_ptr_doc},
    {"_view", Array_view, METH_VARARGS, "_view(shape, strides, offset): a view of the same memory, inside it."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Array_getset[] = {
    {"shape", Array_get_shape, NULL, "tuple of dimensions", NULL},
    {"strides", Array_get_strides, NULL, "strides in bytes, as in NumPy", NULL},
    {"dtype", Array_get_dtype, NULL, "the NumPy dtype (ml_dtypes.bfloat16 for bfloat16)", NULL},
    {"ndim", Array_get_ndim, NULL, "number of dimensions", NULL},
    {"size", Array_get_size, NULL, "number of elements", NULL},
    {"itemsize", Array_get_itemsize, NULL, "bytes per element", NULL},
    {"nbytes", Array_get_nbytes, NULL, "size * itemsize", NULL},
    {"device", Array_get_device, NULL, "'cpu' or 'cuda:N'", NULL},
    {"readonly", Array_get_readonly, NULL, "True if ampc may not write into it", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef Array_members[] = {
    {"__weaklistoffset__", T_PYSSIZET, offsetof(ArrayObject, weakreflist), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

PyDoc_STRVAR(Array_doc,
"An array in memory ampc owns or imported: GPU results when the input's library is unknown,\n"
"views made by ampc.from_dlpack. Hand it to any DLPack consumer (numpy.from_dlpack,\n"
"torch.from_dlpack, cupy.from_dlpack, jax.dlpack.from_dlpack) without a copy.");

static PyType_Slot Array_slots[] = {
    {Py_tp_dealloc, Array_dealloc},
    {Py_tp_repr, Array_repr},
    {Py_tp_methods, Array_methods},
    {Py_tp_getset, Array_getset},
    {Py_tp_members, Array_members},
    {Py_tp_doc, (void *)Array_doc},
    {0, NULL},
};

static PyType_Spec Array_spec = {
    .name = "ampc.Array",
    .basicsize = sizeof(ArrayObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = Array_slots,
};

int ampc_array_type_init(PyObject *module, ampc_state *st)
{
    st->array_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &Array_spec, NULL);
    if (st->array_type == NULL)
        return -1;
    return PyModule_AddType(module, st->array_type);
}
