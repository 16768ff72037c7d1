/*
 * api.c: the backend table ampc._cuda hands to ampc._C (kernels/backend.h),
 * and the tiny Python module that carries it in a capsule.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "backend_cuda.h"

/* The table's forms that differ from the functions': a GPU cast has no use
 * for the CPU's hint, and a GPU step leaves found_inf on the device, so the
 * host never knows whether it ran. */
static int cast(int device, void *stream, const ampc_loop *loop, ampc_dtype dst, ampc_dtype src,
                int fresh_output)
{
    (void)fresh_output;
    return ampc_cuda_cast(device, stream, loop, dst, src);
}

static int sgd(int device, void *stream, const ampc_optim_ref *refs, int64_t n, const ampc_sgd_config *config,
               const float *grad_scale, const float *found_inf, int *ran)
{
    *ran = -1;
    return ampc_cuda_sgd(device, stream, refs, n, config, grad_scale, found_inf);
}

static int adam(int device, void *stream, const ampc_optim_ref *refs, int64_t n, const ampc_adam_config *config,
                const float *grad_scale, const float *found_inf, int *ran)
{
    *ran = -1;
    return ampc_cuda_adam(device, stream, refs, n, config, grad_scale, found_inf);
}

/* Entries left out are NULL: the host controls, and im2col/col2im (conv is here). */
const ampc_backend ampc_cuda_backend = {
    .abi_version = AMPC_BACKEND_ABI_VERSION,
    .struct_size = sizeof(ampc_backend),
    .name = "cuda",
    .runs_without_gil = 0,  /* the plan caches and the pool are guarded by the GIL */
    .last_error = ampc_cuda_last_error,
    .device_count = ampc_cuda_device_count,
    .device_props = ampc_cuda_get_device_props,
    .versions = ampc_cuda_get_versions,
    .synchronize = ampc_cuda_synchronize,
    .stream_device = ampc_cuda_stream_device,
    .stream_wait = ampc_cuda_stream_wait,
    .alloc = ampc_cuda_alloc,
    .free = ampc_cuda_free,
    .memory_stats = ampc_cuda_get_memory_stats,
    .reset_peak_memory = ampc_cuda_reset_peak_memory,
    .copy = ampc_cuda_copy,
    .memset = ampc_cuda_memset,
    .conv_report = ampc_cuda_conv_report,
    .cast = cast,
    .unscale = ampc_cuda_unscale,
    .unscale_clip = ampc_cuda_unscale_clip,
    .update_scale = ampc_cuda_update_scale,
    .scale_mul = ampc_cuda_scale_mul,
    .count_nonfinite = ampc_cuda_count_nonfinite,
    .sgd = sgd,
    .adam = adam,
    .elementwise = ampc_cuda_elementwise,
    .softmax = ampc_cuda_softmax,
    .softmax_backward = ampc_cuda_softmax_backward,
    .layer_norm = ampc_cuda_layer_norm,
    .layer_norm_backward = ampc_cuda_layer_norm_backward,
    .reduce = ampc_cuda_reduce,
    .cross_entropy = ampc_cuda_cross_entropy,
    .cross_entropy_backward = ampc_cuda_cross_entropy_backward,
    .gemm = ampc_cuda_gemm,
    .conv = ampc_cuda_conv,
    .batch_norm = ampc_cuda_batch_norm,
    .batch_norm_backward = ampc_cuda_batch_norm_backward,
    .pool = ampc_cuda_pool,
    .pool_backward = ampc_cuda_pool_backward,
    .embedding = ampc_cuda_embedding,
    .embedding_backward = ampc_cuda_embedding_backward,
    .dropout = ampc_cuda_dropout,
    .attention = ampc_cuda_attention,
    .attention_backward = ampc_cuda_attention_backward,
};

static int cuda_exec(PyObject *module)
{
    PyObject *capsule = PyCapsule_New((void *)&ampc_cuda_backend, "ampc._cuda." AMPC_BACKEND_CAPSULE_ATTR, NULL);
    if (capsule == NULL)
        return -1;
    const int rc = PyModule_AddObjectRef(module, AMPC_BACKEND_CAPSULE_ATTR, capsule);
    Py_DECREF(capsule);
    return rc;
}

static PyModuleDef_Slot cuda_slots[] = {
    {Py_mod_exec, cuda_exec},
#if PY_VERSION_HEX >= 0x030D0000
    {Py_mod_gil, Py_MOD_GIL_USED},  /* as ampc._C, whose table of functions this is */
#endif
    {0, NULL},
};

static PyModuleDef cuda_module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "ampc._cuda",
    .m_doc = "ampc's CUDA kernels, pool and runtime, as a table of C functions for ampc._C.",
    .m_size = 0,
    .m_slots = cuda_slots,
};

PyMODINIT_FUNC PyInit__cuda(void) { return PyModuleDef_Init(&cuda_module_def); }
