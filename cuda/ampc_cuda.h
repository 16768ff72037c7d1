/*
 * ampc_cuda.h: the C ABI between ampc._C and ampc._cuda.
 *
 * ampc._cuda is loaded only when ampc first meets a GPU array. It exports one
 * table of plain C functions (struct ampc_cuda_api) in a PyCapsule named
 * AMPC_CUDA_API_CAPSULE; everything Python-facing stays in ampc._C. So the
 * code in cuda/ knows nothing about Python, and CUDA headers never reach
 * src/.
 *
 * Rules, as in dlpack.h:
 *   - every function returns an ampc_status: 0 on success, a negative code on
 *     failure, with a message for this thread in last_error();
 *   - nothing here exits, aborts or prints;
 *   - a stream is an opaque `void *` holding a cudaStream_t; NULL is the
 *     legacy default stream;
 *   - append fields to the end of the table and bump AMPC_CUDA_ABI_VERSION;
 *     never reorder.
 */
#ifndef AMPC_CUDA_H
#define AMPC_CUDA_H

#include <stddef.h>
#include <stdint.h>
#include "kernels/dtypes.h"
#include "kernels/layout.h"
#include "kernels/op_descriptors.h"
#include "kernels/optim_descriptors.h"
#include "kernels/scaler_rule.h"
#include "kernels/grad_list.h"

#ifdef __cplusplus
extern "C" {
#endif

#define AMPC_CUDA_ABI_VERSION 10
#define AMPC_CUDA_API_CAPSULE "ampc._cuda._api"
/* conv_report's lines never reach this many bytes with their NUL. */
#define AMPC_CUDA_CONV_REPORT_SIZE ((size_t)64 << 10)

typedef enum {
    AMPC_OK = 0,
    AMPC_ERR_NO_DEVICE = -1,     /* no driver, or no GPU */
    AMPC_ERR_OUT_OF_MEMORY = -2,
    AMPC_ERR_CUDA = -3,          /* any other CUDA, cuBLAS or cuDNN failure */
    AMPC_ERR_INVALID = -4,       /* bad argument (a bug in the caller) */
    AMPC_ERR_UNSUPPORTED = -5,   /* a fused form the library cannot do here: take the unfused one */
} ampc_status;

typedef struct {
    char name[256];
    int major, minor;            /* compute capability */
    int multiprocessors;
    size_t total_memory;         /* bytes */
} ampc_cuda_device_props;

typedef struct {
    int runtime;                 /* cudaRuntimeGetVersion, e.g. 13000 */
    int runtime_built;           /* CUDART_VERSION the module was compiled with */
    int driver;                  /* cudaDriverGetVersion; 0 without a driver */
    long cublaslt;               /* cublasLtGetVersion, e.g. 130100 */
    long cudnn;                  /* cudnnGetVersion, e.g. 91900 */
    long cudnn_built;            /* CUDNN_VERSION the module was compiled with */
} ampc_cuda_versions;

typedef struct {
    int64_t allocated;           /* bytes held by live ampc arrays */
    int64_t peak;                /* largest `allocated` since the last reset */
    int64_t reserved;            /* bytes ampc's pool holds from the driver */
} ampc_cuda_memory_stats;

typedef struct ampc_cuda_api {
    uint32_t abi_version;
    uint32_t struct_size;

    /* The message of this thread's last failure. */
    const char *(*last_error)(void);

    /* Devices. device_count answers 0 (and AMPC_OK) without a driver or GPU. */
    int (*device_count)(int *count);
    int (*device_props)(int device, ampc_cuda_device_props *props);
    int (*versions)(ampc_cuda_versions *versions);
    int (*synchronize)(int device);

    /* Streams. stream_device: the device a stream belongs to. stream_wait:
     * make `waiter` wait for the work queued so far on `signaller` (an event
     * recorded on one, waited on by the other; nothing when they are equal). */
    int (*stream_device)(void *stream, int *device);
    int (*stream_wait)(int device, void *waiter, void *signaller);

    /* ampc's stream-ordered pool (one per device). free must be given the
     * size and stream of the allocation. */
    int (*alloc)(int device, size_t nbytes, void *stream, void **ptr);
    int (*free)(int device, void *ptr, size_t nbytes, void *stream);
    int (*memory_stats)(int device, ampc_cuda_memory_stats *stats);
    int (*reset_peak_memory)(int device);

    /* Elementwise conversion: loop->data[0] (dtype dst) = loop->data[1]
     * (dtype src), for the four floating dtypes. Queued on `stream`. */
    int (*cast)(int device, void *stream, const ampc_loop *loop, ampc_dtype dst, ampc_dtype src);

    /* --- ABI 2 --- */

    /* Copy between the host (device -1) and a device, or within a device.
     * A copy to the host returns once the data has arrived. */
    int (*copy)(int dst_device, void *dst, int src_device, const void *src, size_t nbytes, void *stream);

    /* GradScaler (cuda/scaler.cu). `block` points to an ampc_scaler_block in
     * the device's memory; the grads are on `device`.
     * unscale: block->flags[slot] = 1 if any element is inf or NaN, else 0;
     *   unless check_only, every element *= float32(1 / (double)block->scale).
     * update_scale: the rule of scaler_rule.h with the sum of flags[0 .. nflags).
     * scale_mul: loop->data[0] (dst) = loop->data[1] (src) * *scale, in float32
     *   (float64 for float64), rounded to dst.
     * count_nonfinite: counts[i] = inf and NaN elements of grads[i]; counts is
     *   host memory, filled before the call returns. */
    int (*unscale)(int device, void *stream, const ampc_grad_ref *grads, int64_t n,
                   ampc_scaler_block *block, int slot, int check_only);
    int (*update_scale)(int device, void *stream, ampc_scaler_block *block, int nflags,
                        const ampc_scale_rule *rule);
    int (*scale_mul)(int device, void *stream, const ampc_loop *loop, ampc_dtype dst, ampc_dtype src,
                     const float *scale);
    int (*count_nonfinite)(int device, void *stream, const ampc_grad_ref *grads, int64_t n,
                           int64_t *counts);

    /* --- ABI 3 --- */

    /* unscale_(max_norm=): unscale and check as unscale does, and clip the
     * unscaled gradients to the total norm of type norm_type, written as a
     * float32 to norm_out (device memory). block NULL: gradients that are
     * not scaled (a disabled scaler), nothing flagged. divisor_out (device
     * memory) not NULL: check and take the norm only, leave the gradients as
     * they are, and write scale / coefficient there for the optimizer's step
     * (ABI 4). */
    int (*unscale_clip)(int device, void *stream, const ampc_grad_ref *grads, int64_t n,
                        ampc_scaler_block *block, int slot, double max_norm, double norm_type, float *norm_out,
                        float *divisor_out);

    /* Fill nbytes of device memory with a byte value, queued on stream. */
    int (*memset)(int device, void *ptr, int value, size_t nbytes, void *stream);
    /* ampc.optim's fused steps (cuda/optim.cu), as optim_descriptors.h defines them;
     * grad_scale and found_inf are device addresses or NULL. */
    int (*sgd)(int device, void *stream, const ampc_optim_ref *refs, int64_t n, const ampc_sgd_config *config,
               const float *grad_scale, const float *found_inf);
    int (*adam)(int device, void *stream, const ampc_optim_ref *refs, int64_t n, const ampc_adam_config *config,
                const float *grad_scale, const float *found_inf);

    /* --- ABI 5 --- */

    /* The op kernels of op_descriptors.h (cuda/elementwise.cu, softmax.cu,
     * norm.cu, loss.cu, reduce.cu, gemm.c ...), queued on stream. */
    int (*elementwise)(int device, void *stream, const ampc_ew *e);
    int (*softmax)(int device, void *stream, const ampc_softmax *s);
    int (*softmax_backward)(int device, void *stream, const ampc_softmax_backward *s);
    int (*layer_norm)(int device, void *stream, const ampc_layer_norm *l);
    int (*layer_norm_backward)(int device, void *stream, const ampc_layer_norm_backward *l);
    int (*reduce)(int device, void *stream, const ampc_reduce *r);
    int (*cross_entropy)(int device, void *stream, const ampc_cross_entropy *c);
    int (*cross_entropy_backward)(int device, void *stream, const ampc_cross_entropy_backward *c);
    int (*gemm)(int device, void *stream, const ampc_gemm *g);

    /* --- ABI 6 --- */

    /* The spatial ops of op_descriptors.h: convolutions and batch norm on cuDNN
     * (cuda/conv.c, cuda/batch_norm.c), pooling (cuda/pool.cu). */
    int (*conv)(int device, void *stream, const ampc_conv *c);
    int (*batch_norm)(int device, void *stream, const ampc_batch_norm *b);
    int (*batch_norm_backward)(int device, void *stream, const ampc_batch_norm_backward *b);
    int (*pool)(int device, void *stream, const ampc_pool *p);
    int (*pool_backward)(int device, void *stream, const ampc_pool_backward *p);

    /* --- ABI 7 --- */

    /* cuda/embedding.cu and cuda/dropout.cu (op_descriptors.h); gemm's bias_grad. */
    int (*embedding)(int device, void *stream, const ampc_embedding *e);
    int (*embedding_backward)(int device, void *stream, const ampc_embedding_backward *e);
    int (*dropout)(int device, void *stream, const ampc_dropout *d);

    /* --- ABI 8 --- */

    /* Fused attention (cuda/attention.cu, op_descriptors.h): AMPC_ERR_UNSUPPORTED for
     * what its kernels do not serve. */
    int (*attention)(int device, void *stream, const ampc_attention *a);
    int (*attention_backward)(int device, void *stream, const ampc_attention_backward *b);

    /* --- ABI 9 --- */

    /* The lines AMPC_CONV_DEBUG asks of the convolutions (each pass's
     * algorithms and engines timed, and the one chosen), which ampc._cuda
     * keeps rather than prints (cuda/conv_report.c). *length: their length;
     * where buf is not NULL and size > *length, they are moved into buf,
     * NUL-terminated, and forgotten. A buf of AMPC_CUDA_CONV_REPORT_SIZE
     * bytes always takes them. */
    int (*conv_report)(char *buf, size_t size, size_t *length);

    /* --- ABI 10: no new entry; ampc_ew gained param2 (op_descriptors.h) --- */
} ampc_cuda_api;

/* Defined by cuda/api.c: the table ampc._cuda exports. */
extern const ampc_cuda_api ampc_cuda_api_table;

#ifdef __cplusplus
}
#endif

#endif /* AMPC_CUDA_H */
