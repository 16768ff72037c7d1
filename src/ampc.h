/*
 * ampc.h: the internal header of ampc._C; every Python-facing .c file
 * includes it first. It holds the NumPy API set-up, the module state and the
 * prototypes that files share, grouped by the file that defines them.
 *
 * src/ reaches the kernels only through the backend table
 * (kernels/backend.h): the CPU's, linked in, and CUDA's, loaded from
 * ampc._cuda on first use. It includes no backend's own header.
 */
#ifndef AMPC_H
#define AMPC_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Pinned to a fixed version (not NPY_API_VERSION), so a later NumPy
 * deprecation cannot break a released build. */
#define NPY_NO_DEPRECATED_API NPY_2_0_API_VERSION
#define PY_ARRAY_UNIQUE_SYMBOL ampc_ARRAY_API
#ifndef AMPC_IMPORTS_NUMPY
#define NO_IMPORT_ARRAY
#endif
#include <numpy/arrayobject.h>

#include "kernels/backend.h"
#include "kernels/dtypes.h"
#include "kernels/layout.h"

/* ------------------------------------------------------------------------ */
/* Module state (module.c)                                                  */
/* ------------------------------------------------------------------------ */

typedef struct {
    PyTypeObject *array_type;                  /* ampc.Array */
    PyArray_Descr *descr[AMPC_NUM_DTYPES];     /* NumPy dtype of each ampc dtype */
    PyObject *converters;                      /* dict: type -> callable(ampc.Array) or None */
    PyObject *exchange_apis;                   /* dict: type -> its DLPack C exchange API capsule, or None */
    /* While a list of arrays is read in one go (an optimizer's gradients),
     * the producer's current stream is asked once per (table, device). */
    int stream_cache_on;
    unsigned long stream_cache_thread;         /* the thread reading the list: the cache is its alone */
    const void *stream_cache_api;
    int stream_cache_device;
    void *stream_cache_stream;
    PyObject *converter_for;                   /* ampc._interop.converter_for, once imported */
    PyObject *cuda_error;                      /* ampc.CudaError */
    PyObject *argument_error;                  /* ampc.ArgumentError */
    PyObject *state_dict_error;                /* ampc.StateDictError */
    PyTypeObject *scaler_type;                 /* ampc.GradScaler */
    PyObject *oom_error;                       /* ampc.OutOfMemoryError */
    /* ampc._cuda, loaded on first use (cuda_backend.c) */
    const ampc_backend *cuda;
    PyObject *cuda_module;
    PyObject *cuda_load_error;                 /* why it could not be loaded */
    int cuda_device_count;                     /* -1 until asked */
    int cuda_bf16_supported;                   /* -1 until asked */
    /* ampc.Parameter and autocast (parameter.c, autocast_*.c) */
    PyTypeObject *parameter_type;
    PyTypeObject *autocast_type;               /* ampc._C.autocast: the region */
    PyTypeObject *autocast_op_type;            /* ampc.AutocastOp: a function autocast dispatches */
    PyTypeObject *op_policy_type;              /* a registry entry: an op name's policy per device */
    PyObject *autocast_registry;               /* dict: op name -> op_policy */
    PyObject *cast_cache;                      /* dict: Parameter -> (data, version, dtype, cast) */
    PyObject *array_like_types;                /* dict: type -> whether its objects are arrays (__dlpack__) */
    PyObject *float32_for;                     /* dict: array type -> its library's float32 dtype */
    PyObject *interop;                         /* ampc._interop, once imported */
    PyObject *np_matmul;                       /* numpy.matmul, once asked for (ops_gemm.c) */
    PyObject *np_errstate;                     /* numpy.errstate, with it */
} ampc_state;

extern PyModuleDef ampc_module_def;

/* Raise an exception taken by ampc_take_exception (stolen). */
static inline void ampc_restore_exception(PyObject *exc)
{
#if PY_VERSION_HEX >= 0x030C0000
    PyErr_SetRaisedException(exc);
#else
    PyErr_Restore(Py_NewRef((PyObject *)Py_TYPE(exc)), exc, PyException_GetTraceback(exc));
#endif
}

/* Take the raised exception (normalised), clearing it; NULL if none. */
static inline PyObject *ampc_take_exception(void)
{
#if PY_VERSION_HEX >= 0x030C0000
    return PyErr_GetRaisedException();
#else
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (value != NULL && tb != NULL)
        PyException_SetTraceback(value, tb);
    Py_XDECREF(type);
    Py_XDECREF(tb);
    return value;
#endif
}

static inline ampc_state *ampc_state_of(PyObject *module)
{
    return (ampc_state *)PyModule_GetState(module);
}

/* The state of the module that defines `type` (for methods of ampc's types);
 * NULL with TypeError if no class in type's MRO comes from ampc._C. */
static inline ampc_state *ampc_state_from_type(PyTypeObject *type)
{
    PyObject *module = PyType_GetModuleByDef(type, &ampc_module_def);
    return module ? ampc_state_of(module) : NULL;
}

/* ------------------------------------------------------------------------ */
/* dtypes (dtype.c)                                                         */
/* ------------------------------------------------------------------------ */

extern const char *const ampc_dtype_names[AMPC_NUM_DTYPES];

int ampc_dtype_init(ampc_state *st);
/* ampc's dtype for a NumPy descriptor, or -1 (no exception set). */
int ampc_dtype_from_descr(ampc_state *st, PyArray_Descr *descr);
/* Parse a user's dtype argument: a NumPy dtype or type, a name ("float16",
 * "half", "bf16", ...), or a torch dtype. -1 with TypeError/ValueError naming
 * `argname` on failure. */
int ampc_dtype_parse(ampc_state *st, PyObject *obj, const char *argname, ampc_dtype *out);

/* torch's dtype as ampc's, read through its str() ("torch.float16"): -1 when
 * that is not torch's name of a dtype ampc knows, -2 with an exception. */
int ampc_dtype_of_torch(PyObject *dtype);
/* _C._dtypes(): dtypes.def's rows as (name, kind, size, DLPack code, DLPack
 * bits, NumPy dtype), indexed by ampc's dtype number. */
PyObject *ampc_dtypes_info(PyObject *module, PyObject *arg);

/* ------------------------------------------------------------------------ */
/* The caller's array library (interop.c)                                   */
/* ------------------------------------------------------------------------ */

/* Whether `type` is torch's: its __module__ is torch or under it (as
 * ampc._interop.library_of says), or, given a name, it is torch.<name>
 * itself (__module__ "torch", __name__ `name`). Never raises. */
int ampc_is_torch_type(PyTypeObject *type, const char *name);

/* ------------------------------------------------------------------------ */
/* Array views (view.c; any array read as one: any_array.c)                 */
/* ------------------------------------------------------------------------ */

/* One description of every array the C code touches. */
typedef struct {
    char *data;                     /* address of element [0, ..., 0] */
    ampc_dtype dtype;
    int ndim;
    int64_t numel;
    int64_t shape[AMPC_MAX_NDIM];
    int64_t strides[AMPC_MAX_NDIM]; /* bytes; may be negative or zero */
    ampc_device device;
    int readonly;
    void *stream;                   /* CUDA: the stream its contents are ready on */
    PyObject *owner;                /* strong: keeps the memory alive */
    PyTypeObject *source;           /* strong: type of the object the caller gave */
} ampc_view;

/* 1 if the two views have the same dimensions (their strides, dtypes and devices aside). */
static inline int ampc_same_shape(const ampc_view *a, const ampc_view *b)
{
    if (a->ndim != b->ndim)
        return 0;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d])
            return 0;
    return 1;
}

typedef enum {
    AMPC_FOR_READING = 0,
    AMPC_FOR_WRITING = 1,  /* an out= argument: asks DLPack producers not to copy */
} ampc_access;

/* Describe `obj` (ndarray, ampc.Array, DLPack producer or capsule, Python or
 * NumPy scalar). 0, or -1 with an exception naming `argname`. (any_array.c) */
int ampc_view_from_object(ampc_state *st, PyObject *obj, const char *argname,
                          ampc_access access, ampc_view *view);
void ampc_view_release(ampc_view *view);
/* The same for an ndarray; `source` is left NULL. */
int ampc_view_from_ndarray(ampc_state *st, PyArrayObject *a, const char *argname, ampc_view *view);
/* Hand a result (an ndarray or ampc.Array, stolen) back as the type the
 * caller used: NumPy in, NumPy out; CuPy in, CuPy out; torch in, torch out.
 * (any_array.c) */
PyObject *ampc_return_as(ampc_state *st, PyObject *result, PyTypeObject *source);

/* ------------------------------------------------------------------------ */
/* Error messages (errors.c)                                                */
/* ------------------------------------------------------------------------ */

/* repr(obj) for an error message, or "<T object>" where that repr raises
 * (the message must not turn into the object's own exception). */
PyObject *ampc_safe_repr(PyObject *obj);
/* Raise exc with format % (name, safe_repr(obj)): format takes a %s, then a
 * %U. Returns -1. */
int ampc_raise_with_repr(PyObject *exc, const char *format, const char *name, PyObject *obj);
/* The raised exception's message names an argument `given` (its start):
 * say `name` instead, keeping the type and the rest. Lets loops over many
 * arrays pass a short fixed name and format the real one only on error. */
void ampc_rename_error(const char *given, const char *name);
/* "cpu" or "cuda:N" */
const char *ampc_device_str(ampc_device device, char *buf, size_t size);
/* "(2, 3)": the shape, as Python writes a tuple. */
void ampc_shape_str(const ampc_view *v, char *buf, size_t size);
/* A shape (or strides, with allow_negative) of at most AMPC_MAX_NDIM ints into out: their count,
 * or -1 with TypeError / ValueError naming argname. */
int ampc_parse_int64s(PyObject *obj, const char *argname, int64_t *out, int allow_negative);

/* ------------------------------------------------------------------------ */
/* ampc.Array (array.c)                                                     */
/* ------------------------------------------------------------------------ */

int ampc_array_type_init(PyObject *module, ampc_state *st);
int ampc_is_array(ampc_state *st, PyObject *obj);
/* The view of an ampc.Array; owner and source are left NULL (borrowed use). */
const ampc_view *ampc_array_view(PyObject *array);
/* Wrap an ndarray (no copy). */
PyObject *ampc_array_from_ndarray(ampc_state *st, PyArrayObject *ndarray);
/* Take ownership of an imported DLPack tensor described by `view`. On
 * failure the tensor is released. */
PyObject *ampc_array_from_dlpack(ampc_state *st, void *managed, int versioned,
                                 const ampc_view *view);
/* A new uninitialised array with `like`'s shape and device, its dimension
 * order (NumPy's order='K'), and dtype `dtype`: an ndarray on the CPU, an
 * ampc.Array in ampc's pool on a GPU. Fills `out` with its view. */
PyObject *ampc_empty_like(ampc_state *st, const ampc_view *like, ampc_dtype dtype, ampc_view *out);
/* The same for a given shape (strides in bytes, or NULL for C order). */
PyObject *ampc_array_empty(ampc_state *st, ampc_device device, ampc_dtype dtype, int ndim,
                           const int64_t *shape, const int64_t *strides, ampc_view *out);
/* An ampc.Array over memory `owner` keeps alive (view->owner is ignored). */
PyObject *ampc_array_view_into(ampc_state *st, PyObject *owner, const ampc_view *view);

/* ------------------------------------------------------------------------ */
/* DLPack (dlpack.c)                                                        */
/* ------------------------------------------------------------------------ */

/* Import through the protocol (__dlpack__ / __dlpack_device__) or from a bare
 * capsule; returns a new ampc.Array owning the tensor. */
PyObject *ampc_dlpack_import(ampc_state *st, PyObject *obj, const char *argname, ampc_access access);
/* The device `obj` lives on, from obj.__dlpack_device__() alone (CPU for a
 * producer without it): its memory is not asked for. A CUDA device is checked
 * to be one ampc can use. -1 with BufferError (a malformed answer, a device
 * ampc does not read; argname names the argument) or the CUDA check's error. */
int ampc_dlpack_device(ampc_state *st, PyObject *obj, const char *argname, ampc_device *device);
/* Describe `obj` through its type's DLPack C exchange API, without calling
 * Python: 1 when done, 0 when the type has no usable table (nothing set),
 * -1 with an exception. The view's stream is the producer's current one. */
int ampc_dlpack_fast_view(ampc_state *st, PyObject *obj, const char *argname, ampc_view *view);
/* Call an imported tensor's deleter (DLManagedTensorVersioned when
 * `versioned`, else DLManagedTensor) with the exception being raised, if
 * any, set aside: a producer's deleter may run Python (ctypes, pybind11,
 * Cython), which must not see or clobber it. What the deleter itself raises
 * is reported as unraisable. */
void ampc_dlpack_release(void *managed, int versioned);
/* Build a capsule for `view`; `owner` is kept alive until the consumer's
 * deleter runs. */
PyObject *ampc_dlpack_export(const ampc_view *view, PyObject *owner, int versioned,
                             unsigned minor, int copied);
/* Hand `view` (kept alive by `owner`) to the library of `type` through its
 * C exchange API, with no Python call: 1 with *out set, 0 (nothing set)
 * when the type has no such table, -1 with an exception. On a GPU the
 * library's current stream is ordered after the view's. */
int ampc_dlpack_fast_return(ampc_state *st, const ampc_view *view, PyObject *owner, PyTypeObject *type,
                            PyObject **out);

/* ------------------------------------------------------------------------ */
/* Backends (cuda_backend.c)                                                */
/* ------------------------------------------------------------------------ */

/* The backend that runs kernels on `device`: the CPU's, or CUDA's (loaded:
 * every GPU array passed ampc_cuda_check_device on its way in). */
static inline const ampc_backend *ampc_backend_of(const ampc_state *st, ampc_device device)
{
    return device.type == AMPC_DEVICE_CPU ? &ampc_cpu_backend : st->cuda;
}
/* Raise the exception for a backend's failed ampc_status; returns -1. */
int ampc_backend_raise(ampc_state *st, ampc_device device, int status, const char *what);

/* Load ampc._cuda if needed; -1 with a RuntimeError saying how to build it. */
int ampc_cuda_require(ampc_state *st);
/* Visible GPUs: 0 without a driver, a device or ampc._cuda; -1 with an
 * exception only when the driver reports a failure. */
int ampc_cuda_device_count(ampc_state *st);
/* 1 if GPU 0 computes in bfloat16 (capability 8.0 on), 0 if not or no GPU,
 * -1 with an exception. */
int ampc_cuda_bf16_supported(ampc_state *st);
/* Check that a CUDA device index exists; -1 with RuntimeError/ValueError. */
int ampc_cuda_check_device(ampc_state *st, int device);
/* Raise the exception for a failed status of ampc._cuda; returns -1. */
int ampc_cuda_raise(ampc_state *st, int status, const char *what);
/* ampc's current stream for `device` (NULL: the legacy default stream), and
 * the Python object that keeps it alive (borrowed, may be NULL). */
void *ampc_current_stream(int device, PyObject **owner);
/* The integer a DLPack consumer passes for a stream handle. */
long long ampc_dlpack_stream_arg(void *stream);

/* Ordering ampc's stream with the streams arrays were produced on (a view's
 * stream, read through DLPack's C exchange API). before: `stream` waits for
 * `producer`; after: `producer` waits for `stream`, so the producer sees
 * what ampc wrote. Each distinct producer once (`seen`, zeroed by the
 * caller, remembers the first few); `stream` itself is skipped (NULL is the
 * legacy default stream). */
typedef struct {
    void *stream[8];
    int n;
} ampc_streams_seen;
int ampc_order_stream(ampc_state *st, int device, void *stream, void *producer, int before,
                      ampc_streams_seen *seen);

extern PyMethodDef ampc_cuda_methods[];

/* ------------------------------------------------------------------------ */
/* ampc.Parameter (parameter.c)                                             */
/* ------------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    PyObject *data;
    PyObject *grad;             /* None or an array */
    char requires_grad;
    unsigned long long version; /* writes counted: the cast cache's check */
    PyObject *counter_owner;    /* NULL, or the Parameter whose counter this one counts in */
    PyObject *dict;
    PyObject *weakreflist;
} ampc_parameter;

/* The counter p's writes go to: its own, or for Parameter(q) (which shares
 * q's array, as torch's detach shares q's storage and version counter) q's,
 * so that a write through either one makes the other's cached cast stale.
 * One level: a Parameter that counts in another's never lends its counter. */
static inline unsigned long long *ampc_parameter_version(ampc_parameter *p)
{
    return p->counter_owner != NULL ? &((ampc_parameter *)p->counter_owner)->version : &p->version;
}

static inline int ampc_is_parameter(ampc_state *st, PyObject *obj)
{
    return Py_IS_TYPE(obj, st->parameter_type) || PyObject_TypeCheck(obj, st->parameter_type);
}

/* Count a write ampc made into obj's memory (an out= argument, a statistic
 * updated in place): a Parameter's version goes up, so that autocast's
 * weight-cast cache casts it again; anything else is left alone. Called
 * after the write, so no cast cached in between (Python run while other
 * arguments were read) survives it. */
static inline void ampc_count_write(ampc_state *st, PyObject *obj)
{
    if (obj != NULL && ampc_is_parameter(st, obj))
        (*ampc_parameter_version((ampc_parameter *)obj))++;
}

int ampc_parameter_type_init(PyObject *module, ampc_state *st);
extern PyMethodDef ampc_parameter_methods[];

/* tp_descr_get for ampc's function-like callables (AutocastOp, TapeOp):
 * bound to an instance as a method, as a Python function is. */
static inline PyObject *ampc_bind_as_method(PyObject *self, PyObject *obj, PyObject *Py_UNUSED(type))
{
    if (obj == NULL || obj == Py_None)
        return Py_NewRef(self);
    return PyMethod_New(self, obj);
}

/* ampc.TapeOp and _needs_grad (tape_op.c) */
int ampc_tape_op_type_init(PyObject *module);
extern PyMethodDef ampc_tape_op_methods[];

/* ------------------------------------------------------------------------ */
/* GradScaler (scaler.c)                                                    */
/* ------------------------------------------------------------------------ */

int ampc_scaler_type_init(PyObject *module, ampc_state *st);

/* ------------------------------------------------------------------------ */
/* Casts (cast.c) and the copies made of them (copy.c)                      */
/* ------------------------------------------------------------------------ */

/* dst = src elementwise (shapes, devices, dtypes already checked); queued on
 * the device's current stream for GPU views. `fresh_output`: dst was just
 * allocated by ampc_empty_like. */
int ampc_cast_views(ampc_state *st, ampc_view *dst, const ampc_view *src, int fresh_output);

/* Copy nbytes between two places, each in host memory (a CPU device) or a
 * device's, through the device's backend on `stream` where one is involved
 * (a copy to the host returns once the data has arrived). 0, or -1 with an
 * exception naming `what`. */
int ampc_copy_bytes(ampc_state *st, ampc_device dst_device, void *dst, ampc_device src_device, const void *src,
                    size_t nbytes, void *stream, const char *what);

extern PyMethodDef ampc_copy_methods[];  /* cast, _to_device */

/* ampc.optim's fused steps and helpers (optim.c). */
extern PyMethodDef ampc_optim_methods[];

#endif /* AMPC_H */
