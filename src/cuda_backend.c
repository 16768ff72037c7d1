/*
 * cuda_backend.c: ampc._C's side of the CUDA boundary. Loads ampc._cuda the
 * first time a GPU is needed, turns its status codes into Python exceptions,
 * keeps each thread's current stream, and implements the Python functions
 * behind ampc.cuda (device queries, memory statistics, streams), all of
 * which answer "no GPU" quietly where there is no driver, no device or no
 * ampc._cuda.
 */
#include "ampc.h"

#include <stdio.h>
#include "dlpack.h"

#define BUILD_HINT                                                                          \
    "ampc was built without its CUDA extension (ampc._cuda). Build it where nvcc and the " \
    "CUDA libraries are installed: AMPC_CUDA=1 pip install --no-build-isolation -e ."

/* Try once; afterwards return the remembered outcome. 0: loaded. */
static int load_backend(ampc_state *st)
{
    if (st->cuda != NULL)
        return 0;
    if (st->cuda_load_error != NULL)
        return -1;
    PyObject *module = PyImport_ImportModule("ampc._cuda");
    const ampc_backend *api = NULL;
    if (module != NULL) {
        api = PyCapsule_Import("ampc._cuda." AMPC_BACKEND_CAPSULE_ATTR, 0);
        if (api != NULL && (api->abi_version != AMPC_BACKEND_ABI_VERSION ||
                            api->struct_size != sizeof(ampc_backend))) {
            PyErr_Format(PyExc_ImportError, "ampc._cuda has ABI version %u, ampc._C needs %u; "
                         "rebuild ampc", api->abi_version, AMPC_BACKEND_ABI_VERSION);
            api = NULL;
        }
    }
    if (api == NULL) {
        PyObject *error = ampc_take_exception();
        st->cuda_load_error = error ? error : Py_NewRef(Py_None);
        Py_XDECREF(module);
        return -1;
    }
    st->cuda_module = module;
    st->cuda = api;
    return 0;
}

int ampc_cuda_require(ampc_state *st)
{
    if (load_backend(st) == 0)
        return 0;
    PyErr_Format(PyExc_RuntimeError, "%s (%S)", BUILD_HINT, st->cuda_load_error);
    return -1;
}

int ampc_cuda_raise(ampc_state *st, int status, const char *what)
{
    const char *msg = st->cuda ? st->cuda->last_error() : "ampc._cuda is not loaded";
    switch (status) {
    case AMPC_ERR_OUT_OF_MEMORY:
        PyErr_Format(st->oom_error, "%s: %s", what, msg);
        break;
    case AMPC_ERR_NO_DEVICE:
        PyErr_Format(PyExc_RuntimeError, "%s: no CUDA GPU is available (%s)", what, msg);
        break;
    case AMPC_ERR_INVALID:
        PyErr_Format(PyExc_ValueError, "%s: %s", what, msg);
        break;
    default:
        PyErr_Format(st->cuda_error, "%s: %s", what, msg);
        break;
    }
    return -1;
}

int ampc_backend_raise(ampc_state *st, ampc_device device, int status, const char *what)
{
    if (device.type != AMPC_DEVICE_CPU)
        return ampc_cuda_raise(st, status, what);
    if (status == AMPC_ERR_OUT_OF_MEMORY)
        PyErr_NoMemory();
    else
        PyErr_Format(PyExc_RuntimeError, "%s: %s", what, ampc_cpu_backend.last_error());
    return -1;
}

/* Number of GPUs, 0 without a driver, device or ampc._cuda; -1 only when the
 * driver itself reports a failure. Counted once: the CUDA runtime fixes the
 * visible devices when it starts. */
int ampc_cuda_device_count(ampc_state *st)
{
    if (st->cuda_device_count >= 0)
        return st->cuda_device_count;
    if (load_backend(st) < 0)
        return st->cuda_device_count = 0;
    int count = 0;
    const int status = st->cuda->device_count(&count);
    if (status != AMPC_OK)
        return ampc_cuda_raise(st, status, "counting CUDA devices");
    return st->cuda_device_count = count;
}

int ampc_cuda_check_device(ampc_state *st, int device)
{
    if (ampc_cuda_require(st) < 0)
        return -1;
    const int count = ampc_cuda_device_count(st);
    if (count < 0)
        return -1;
    if (count == 0) {
        PyErr_Format(PyExc_RuntimeError, "the array is on cuda:%d, but no CUDA GPU is available "
                     "to this process", device);
        return -1;
    }
    if (device < 0 || device >= count) {
        PyErr_Format(PyExc_ValueError, "CUDA device %d does not exist (this process sees %d)",
                     device, count);
        return -1;
    }
    return 0;
}

int ampc_cuda_bf16_supported(ampc_state *st)
{
    if (st->cuda_bf16_supported >= 0)
        return st->cuda_bf16_supported;
    const int count = ampc_cuda_device_count(st);
    if (count <= 0)
        return count < 0 ? -1 : (st->cuda_bf16_supported = 0);
    ampc_device_props p;
    const int status = st->cuda->device_props(0, &p);
    if (status != AMPC_OK)
        return ampc_cuda_raise(st, status, "reading device properties");
    return st->cuda_bf16_supported = p.major >= 8;
}

int ampc_order_stream(ampc_state *st, int device, void *stream, void *producer, int before,
                      ampc_streams_seen *seen)
{
    if (producer == stream)
        return 0;
    for (int k = 0; k < seen->n; k++)
        if (seen->stream[k] == producer)
            return 0;
    const int status = before ? st->cuda->stream_wait(device, stream, producer)
                              : st->cuda->stream_wait(device, producer, stream);
    if (status != AMPC_OK)
        return ampc_cuda_raise(st, status, "ordering streams");
    if (seen->n < (int)(sizeof seen->stream / sizeof seen->stream[0]))
        seen->stream[seen->n++] = producer;
    return 0;
}

/* ------------------------------------------------------------------------ */
/* The current stream, per thread                                            */
/* ------------------------------------------------------------------------ */

/* NO_STREAM: every device uses its legacy default stream, which orders with
 * torch's and CuPy's default streams. ANY_DEVICE: the per-thread default
 * stream, which exists on every device. `owner` is a strong reference to the
 * Python object the stream came from. */
#define NO_STREAM (-1)
#define ANY_DEVICE (-2)
static _Thread_local struct {
    void *handle;
    int device;
    PyObject *owner;
} current = {NULL, NO_STREAM, NULL};

void *ampc_current_stream(int device, PyObject **owner)
{
    const int match = current.device == device || current.device == ANY_DEVICE;
    if (owner)
        *owner = match ? current.owner : NULL;
    return match ? current.handle : NULL;
}

long long ampc_dlpack_stream_arg(void *stream)
{
    if (stream == NULL || stream == (void *)(uintptr_t)1)
        return DLPACK_STREAM_LEGACY_DEFAULT;
    return (long long)(uintptr_t)stream;
}

/* _cuda_swap_stream(handle, device, owner) -> (handle, device, owner) before */
static PyObject *mod_cuda_swap_stream(PyObject *Py_UNUSED(module), PyObject *args)
{
    unsigned long long handle;
    int device;
    PyObject *owner;
    if (!PyArg_ParseTuple(args, "KiO:_cuda_swap_stream", &handle, &device, &owner))
        return NULL;
    PyObject *previous = Py_BuildValue("(KiO)", (unsigned long long)(uintptr_t)current.handle,
                                       current.device, current.owner ? current.owner : Py_None);
    if (previous == NULL)
        return NULL;
    /* The default streams are the same on every device: the legacy one is
     * NULL whichever way it was spelt (0 or 1), the per-thread one is 2. */
    current.handle = handle <= 1 ? NULL : (void *)(uintptr_t)handle;
    current.device = handle <= 1 ? NO_STREAM : handle == 2 ? ANY_DEVICE : device;
    Py_XSETREF(current.owner, owner == Py_None ? NULL : Py_NewRef(owner));
    return previous;
}

static PyObject *mod_cuda_current_stream(PyObject *Py_UNUSED(module), PyObject *args)
{
    int device;
    if (!PyArg_ParseTuple(args, "i:_cuda_current_stream", &device))
        return NULL;
    PyObject *owner;
    void *handle = ampc_current_stream(device, &owner);
    return Py_BuildValue("(KO)", (unsigned long long)(uintptr_t)handle, owner ? owner : Py_None);
}

/* ------------------------------------------------------------------------ */
/* Python functions behind ampc.cuda                                         */
/* ------------------------------------------------------------------------ */

static PyObject *mod_cuda_build_info(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    ampc_state *st = ampc_state_of(module);
    if (load_backend(st) == 0)
        return Py_BuildValue("(OO)", Py_True, Py_None);
    PyObject *msg = PyObject_Str(st->cuda_load_error);
    if (msg == NULL)
        return NULL;
    return Py_BuildValue("(ON)", Py_False, msg);
}

static PyObject *mod_cuda_device_count(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    const int n = ampc_cuda_device_count(ampc_state_of(module));
    return n < 0 ? NULL : PyLong_FromLong(n);
}

static int parse_device(ampc_state *st, PyObject *args, const char *fmt, int *device)
{
    if (!PyArg_ParseTuple(args, fmt, device))
        return -1;
    return ampc_cuda_check_device(st, *device);
}

static PyObject *mod_cuda_device_properties(PyObject *module, PyObject *args)
{
    ampc_state *st = ampc_state_of(module);
    int device;
    if (parse_device(st, args, "i:_cuda_device_properties", &device) < 0)
        return NULL;
    ampc_device_props p;
    const int status = st->cuda->device_props(device, &p);
    if (status != AMPC_OK) {
        ampc_cuda_raise(st, status, "reading device properties");
        return NULL;
    }
    return Py_BuildValue("{s:s,s:(ii),s:i,s:K}", "name", p.name, "capability", p.major, p.minor,
                         "multiprocessors", p.multiprocessors, "total_memory",
                         (unsigned long long)p.total_memory);
}

static PyObject *mod_cuda_versions(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    ampc_state *st = ampc_state_of(module);
    if (ampc_cuda_require(st) < 0)
        return NULL;
    ampc_backend_versions v;
    const int status = st->cuda->versions(&v);
    if (status != AMPC_OK) {
        ampc_cuda_raise(st, status, "reading CUDA versions");
        return NULL;
    }
    return Py_BuildValue("{s:i,s:i,s:i,s:l,s:l,s:l}", "runtime", v.runtime, "runtime_built",
                         v.runtime_built, "driver", v.driver, "cublaslt", v.cublaslt, "cudnn",
                         v.cudnn, "cudnn_built", v.cudnn_built);
}

/* For the memory statistics, which answer quietly (nothing was ever
 * allocated) without a GPU: 1 with no GPU, 0 with a valid device, -1 with an
 * exception. */
static int no_gpu_or_valid(ampc_state *st, PyObject *args, const char *fmt, int *device)
{
    if (!PyArg_ParseTuple(args, fmt, device))
        return -1;
    const int count = ampc_cuda_device_count(st);
    if (count <= 0)
        return count < 0 ? -1 : 1;
    return ampc_cuda_check_device(st, *device);
}

static PyObject *mod_cuda_memory_stats(PyObject *module, PyObject *args)
{
    ampc_state *st = ampc_state_of(module);
    int device;
    const int rc = no_gpu_or_valid(st, args, "i:_cuda_memory_stats", &device);
    if (rc < 0)
        return NULL;
    if (rc == 1)
        return Py_BuildValue("{s:i,s:i,s:i}", "allocated", 0, "peak", 0, "reserved", 0);
    ampc_memory_stats m;
    const int status = st->cuda->memory_stats(device, &m);
    if (status != AMPC_OK) {
        ampc_cuda_raise(st, status, "reading memory statistics");
        return NULL;
    }
    return Py_BuildValue("{s:L,s:L,s:L}", "allocated", (long long)m.allocated, "peak",
                         (long long)m.peak, "reserved", (long long)m.reserved);
}

static PyObject *mod_cuda_reset_peak_memory(PyObject *module, PyObject *args)
{
    ampc_state *st = ampc_state_of(module);
    int device;
    const int rc = no_gpu_or_valid(st, args, "i:_cuda_reset_peak_memory", &device);
    if (rc < 0)
        return NULL;
    if (rc == 1)
        Py_RETURN_NONE;
    const int status = st->cuda->reset_peak_memory(device);
    if (status != AMPC_OK) {
        ampc_cuda_raise(st, status, "resetting memory statistics");
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *mod_cuda_synchronize(PyObject *module, PyObject *args)
{
    ampc_state *st = ampc_state_of(module);
    int device;
    if (parse_device(st, args, "i:_cuda_synchronize", &device) < 0)
        return NULL;
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = st->cuda->synchronize(device);
    Py_END_ALLOW_THREADS
    if (status != AMPC_OK) {
        ampc_cuda_raise(st, status, "synchronizing");
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *mod_cuda_stream_device(PyObject *module, PyObject *args)
{
    ampc_state *st = ampc_state_of(module);
    unsigned long long handle;
    if (!PyArg_ParseTuple(args, "K:_cuda_stream_device", &handle))
        return NULL;
    if (ampc_cuda_require(st) < 0)
        return NULL;
    int device = -1;
    const int status = st->cuda->stream_device((void *)(uintptr_t)handle, &device);
    if (status != AMPC_OK) {
        ampc_cuda_raise(st, status, "finding a stream's device");
        return NULL;
    }
    return PyLong_FromLong(device);
}

/* The lines AMPC_CONV_DEBUG asked of the GPU convolutions since the last
 * call, which ampc._cuda keeps: ampc.nn prints them, as nothing in C does.
 * "" where ampc._cuda is not loaded (no GPU array met yet: no lines). */
static PyObject *mod_cuda_conv_report(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    ampc_state *st = ampc_state_of(module);
    size_t length = 0;
    if (st->cuda == NULL || (st->cuda->conv_report(NULL, 0, &length) == AMPC_OK && length == 0))
        return PyUnicode_FromStringAndSize(NULL, 0);
    char *text = PyMem_Malloc(AMPC_CONV_REPORT_SIZE);
    if (text == NULL)
        return PyErr_NoMemory();
    PyObject *lines = NULL;
    const int status = st->cuda->conv_report(text, AMPC_CONV_REPORT_SIZE, &length);
    if (status != AMPC_OK)
        ampc_cuda_raise(st, status, "taking AMPC_CONV_DEBUG's lines");
    else if (length >= AMPC_CONV_REPORT_SIZE)  /* not moved: backend.h's bound broken */
        PyErr_SetString(PyExc_RuntimeError, "ampc._cuda kept more AMPC_CONV_DEBUG lines than its bound");
    else
        lines = PyUnicode_DecodeUTF8(text, (Py_ssize_t)length, "replace");
    PyMem_Free(text);
    return lines;
}

PyMethodDef ampc_cuda_methods[] = {
    {"_cuda_build_info", mod_cuda_build_info, METH_NOARGS,
     "(built, why_not): whether ampc._cuda loads, and the import error if it does not."},
    {"_cuda_device_count", mod_cuda_device_count, METH_NOARGS, "Visible CUDA devices (0 without a GPU)."},
    {"_cuda_device_properties", mod_cuda_device_properties, METH_VARARGS, "Name, capability, SMs, memory."},
    {"_cuda_versions", mod_cuda_versions, METH_NOARGS, "CUDA runtime, driver, cuBLASLt and cuDNN versions."},
    {"_cuda_memory_stats", mod_cuda_memory_stats, METH_VARARGS, "Bytes allocated, peak, reserved."},
    {"_cuda_reset_peak_memory", mod_cuda_reset_peak_memory, METH_VARARGS, "Reset the peak to the current."},
    {"_cuda_synchronize", mod_cuda_synchronize, METH_VARARGS, "Wait for all work on a device."},
    {"_cuda_stream_device", mod_cuda_stream_device, METH_VARARGS, "The device a cudaStream_t belongs to."},
    {"_cuda_swap_stream", mod_cuda_swap_stream, METH_VARARGS, "Set this thread's stream; returns the old one."},
    {"_cuda_current_stream", mod_cuda_current_stream, METH_VARARGS, "(handle, owner) for a device."},
    {"_cuda_conv_report", mod_cuda_conv_report, METH_NOARGS,
     "The lines AMPC_CONV_DEBUG asked of the GPU convolutions since the last call, for Python to print."},
    {NULL, NULL, 0, NULL},
};
