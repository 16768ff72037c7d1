/*
 * backend_cuda.h: ampc._cuda's functions, one for each entry of the backend
 * table (kernels/backend.h) that api.c fills. Each returns an ampc_status and
 * leaves its message for ampc_cuda_last_error; none touches Python.
 */
#ifndef AMPC_CUDA_BACKEND_CUDA_H
#define AMPC_CUDA_BACKEND_CUDA_H

#include "kernels/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Defined in runtime.c, memory.c, cast.cu, scaler.cu and optim.cu. */
const char *ampc_cuda_last_error(void);
int ampc_cuda_device_count(int *count);
int ampc_cuda_get_device_props(int device, ampc_device_props *props);
int ampc_cuda_get_versions(ampc_backend_versions *versions);
int ampc_cuda_synchronize(int device);
int ampc_cuda_stream_device(void *stream, int *device);
int ampc_cuda_stream_wait(int device, void *waiter, void *signaller);
int ampc_cuda_alloc(int device, size_t nbytes, void *stream, void **ptr);
int ampc_cuda_free(int device, void *ptr, size_t nbytes, void *stream);
int ampc_cuda_get_memory_stats(int device, ampc_memory_stats *stats);
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

/* The table ampc._cuda exports (api.c). */
extern const ampc_backend ampc_cuda_backend;

#ifdef __cplusplus
}
#endif

#endif /* AMPC_CUDA_BACKEND_CUDA_H */
