/*
 * api.c: the table ampc._cuda hands to ampc._C (see ampc_cuda.h), and the
 * tiny Python module that carries it in a capsule.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "ampc_cuda.h"

/* Defined in runtime.c, memory.c, cast.cu, scaler.cu and optim.cu. */
const char *ampc_cuda_last_error(void);
int ampc_cuda_device_count(int *count);
int ampc_cuda_get_device_props(int device, ampc_cuda_device_props *props);
int ampc_cuda_get_versions(ampc_cuda_versions *versions);
int ampc_cuda_synchronize(int device);
int ampc_cuda_stream_device(void *stream, int *device);
int ampc_cuda_stream_wait(int device, void *waiter, void *signaller);
int ampc_cuda_alloc(int device, size_t nbytes, void *stream, void **ptr);
int ampc_cuda_free(int device, void *ptr, size_t nbytes, void *stream);
int ampc_cuda_get_memory_stats(int device, ampc_cuda_memory_stats *stats);
int ampc_cuda_reset_peak_memory(int device);
int ampc_cuda_cast(int device, void *stream, const ampc_loop *loop, ampc_dtype dst, ampc_dtype src);
int ampc_cuda_copy(int dst_device, void *dst, int src_device, const void *src, size_t nbytes, void *stream);
int ampc_cuda_unscale(int device, void *stream, const ampc_grad_ref *grads, int64_t n, ampc_scaler_block *block,
                      int slot, int check_only);
int ampc_cuda_update_scale(int device, void *stream, ampc_scaler_block *block, int nflags,
                           const ampc_scale_rule *rule);
int ampc_cuda_scale_mul(int device, void *stream, const ampc_loop *loop, ampc_dtype dst, ampc_dtype src,
                        const float *scale);
int ampc_cuda_count_nonfinite(int device, void *stream, const ampc_grad_ref *grads, int64_t n, int64_t *counts);
int ampc_cuda_unscale_clip(int device, void *stream, const ampc_grad_ref *grads, int64_t n, ampc_scaler_block *block,
                           int slot, double max_norm, double norm_type, float *norm_out, float *divisor_out);
int ampc_cuda_memset(int device, void *ptr, int value, size_t nbytes, void *stream);
int ampc_cuda_sgd(int device, void *stream, const ampc_optim_ref *refs, int64_t n, const ampc_sgd_config *config,
                  const float *grad_scale, const float *found_inf);
int ampc_cuda_adam(int device, void *stream, const ampc_optim_ref *refs, int64_t n, const ampc_adam_config *config,
                   const float *grad_scale, const float *found_inf);
/* The op kernels: elementwise.cu, softmax.cu, norm.cu, reduce.cu, loss.cu, gemm.c. */
int ampc_cuda_elementwise(int device, void *stream, const ampc_ew *e);
int ampc_cuda_softmax(int device, void *stream, const ampc_softmax *s);
int ampc_cuda_softmax_backward(int device, void *stream, const ampc_softmax_backward *s);
int ampc_cuda_layer_norm(int device, void *stream, const ampc_layer_norm *l);
int ampc_cuda_layer_norm_backward(int device, void *stream, const ampc_layer_norm_backward *l);
int ampc_cuda_reduce(int device, void *stream, const ampc_reduce *r);
int ampc_cuda_cross_entropy(int device, void *stream, const ampc_cross_entropy *c);
int ampc_cuda_cross_entropy_backward(int device, void *stream, const ampc_cross_entropy_backward *c);
int ampc_cuda_gemm(int device, void *stream, const ampc_gemm *g);
/* The spatial ops: conv.c, batch_norm.c, pool.cu. */
int ampc_cuda_conv(int device, void *stream, const ampc_conv *c);
int ampc_cuda_batch_norm(int device, void *stream, const ampc_batch_norm *b);
int ampc_cuda_batch_norm_backward(int device, void *stream, const ampc_batch_norm_backward *b);
int ampc_cuda_pool(int device, void *stream, const ampc_pool *p);
int ampc_cuda_pool_backward(int device, void *stream, const ampc_pool_backward *p);
int ampc_cuda_embedding(int device, void *stream, const ampc_embedding *e);
int ampc_cuda_embedding_backward(int device, void *stream, const ampc_embedding_backward *e);
int ampc_cuda_dropout(int device, void *stream, const ampc_dropout *d);
int ampc_cuda_attention(int device, void *stream, const ampc_attention *a);
int ampc_cuda_attention_backward(int device, void *stream, const ampc_attention_backward *b);
/* AMPC_CONV_DEBUG's lines: conv_report.c. */
int ampc_cuda_conv_report(char *buf, size_t size, size_t *length);

const ampc_cuda_api ampc_cuda_api_table = {
    .abi_version = AMPC_CUDA_ABI_VERSION,
    .struct_size = sizeof(ampc_cuda_api),
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
    .cast = ampc_cuda_cast,
    .copy = ampc_cuda_copy,
    .unscale = ampc_cuda_unscale,
    .update_scale = ampc_cuda_update_scale,
    .scale_mul = ampc_cuda_scale_mul,
    .count_nonfinite = ampc_cuda_count_nonfinite,
    .unscale_clip = ampc_cuda_unscale_clip,
    .memset = ampc_cuda_memset,
    .sgd = ampc_cuda_sgd,
    .adam = ampc_cuda_adam,
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
    .conv_report = ampc_cuda_conv_report,
};

static int cuda_exec(PyObject *module)
{
    PyObject *capsule = PyCapsule_New((void *)&ampc_cuda_api_table, AMPC_CUDA_API_CAPSULE, NULL);
    if (capsule == NULL)
        return -1;
    const int rc = PyModule_AddObjectRef(module, "_api", capsule);
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
