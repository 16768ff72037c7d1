/*
 * backend.h: the one table every backend fills, and the only way ampc._C
 * reaches a backend's code.
 *
 * A backend is a device kind's kernels behind struct ampc_backend: the CPU's
 * (cpu/backend.c, linked into ampc._C) and CUDA's (cuda/api.c, in
 * ampc._cuda, loaded the first time a GPU array is met and handed over in a
 * PyCapsule). src/ includes this header and no backend's own; no backend
 * includes src/. Each entry takes the descriptors of op_descriptors.h,
 * optim_descriptors.h and grad_list.h, which both backends read the same way.
 *
 * Rules, as in dlpack.h:
 *   - every entry returns an ampc_status: AMPC_OK, or a negative code with a
 *     message for this thread in last_error();
 *   - nothing here exits, aborts, prints or touches Python;
 *   - `device` is the device's index (0 on the CPU), `stream` an opaque
 *     handle (a cudaStream_t on CUDA, NULL for the legacy default stream;
 *     always NULL on the CPU);
 *   - an entry a backend does not have is NULL, and its comment says what
 *     ampc._C does instead (the CPU's convolution, for one, is im2col plus
 *     NumPy's matrix product, composed in src/ops_spatial.c);
 *   - a new entry or a changed one bumps AMPC_BACKEND_ABI_VERSION: ampc._C
 *     refuses a loaded table of another version.
 */
#ifndef AMPC_KERNELS_BACKEND_H
#define AMPC_KERNELS_BACKEND_H

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

/* 11: one table for both backends (was ampc_cuda_api); cast's fresh_output,
 * sgd's and adam's `ran`, the CPU's controls, im2col and col2im. */
#define AMPC_BACKEND_ABI_VERSION 11
/* A loadable backend module `M` (ampc._cuda) carries its table in a capsule
 * named "M._backend", which is also the module attribute it is set as. */
#define AMPC_BACKEND_CAPSULE_ATTR "_backend"
/* conv_report's lines never reach this many bytes with their NUL. */
#define AMPC_CONV_REPORT_SIZE ((size_t)64 << 10)

typedef enum {
    AMPC_OK = 0,
    AMPC_ERR_NO_DEVICE = -1,     /* no driver, or no GPU */
    AMPC_ERR_OUT_OF_MEMORY = -2,
    AMPC_ERR_DEVICE = -3,        /* any other failure of the device's runtime or libraries */
    AMPC_ERR_INVALID = -4,       /* bad argument (a bug in the caller) */
    AMPC_ERR_UNSUPPORTED = -5,   /* a fused form the backend cannot do here: take the unfused one */
} ampc_status;

typedef struct {
    char name[256];
    int major, minor;            /* compute capability */
    int multiprocessors;
    size_t total_memory;         /* bytes */
} ampc_device_props;

typedef struct {
    int runtime;                 /* cudaRuntimeGetVersion, e.g. 13000 */
    int runtime_built;           /* CUDART_VERSION the module was compiled with */
    int driver;                  /* cudaDriverGetVersion; 0 without a driver */
    long cublaslt;               /* cublasLtGetVersion, e.g. 130100 */
    long cudnn;                  /* cudnnGetVersion, e.g. 91900 */
    long cudnn_built;            /* CUDNN_VERSION the module was compiled with */
} ampc_backend_versions;

typedef struct {
    int64_t allocated;           /* bytes held by live ampc arrays */
    int64_t peak;                /* largest `allocated` since the last reset */
    int64_t reserved;            /* bytes ampc's pool holds from the driver */
} ampc_memory_stats;

typedef struct {
    const char *name;            /* "avx2", "f16c", ... */
    int present;
} ampc_feature;

typedef struct ampc_backend {
    uint32_t abi_version;
    uint32_t struct_size;
    const char *name;            /* "cpu", "cuda" */
    /* 1: the kernels may run while other threads run Python (ampc._C releases
     * the GIL around the long ones); 0: the backend's caches rely on the GIL. */
    int runs_without_gil;

    /* The message of this thread's last failure. */
    const char *(*last_error)(void);

    /* ---------------------------------------------------------------- */
    /* Devices, streams and memory: a device backend's (NULL on the CPU, */
    /* whose memory NumPy allocates and which has no streams).          */
    /* ---------------------------------------------------------------- */

    /* device_count answers 0 (and AMPC_OK) without a driver or device. */
    int (*device_count)(int *count);
    int (*device_props)(int device, ampc_device_props *props);
    int (*versions)(ampc_backend_versions *versions);
    int (*synchronize)(int device);
    /* stream_device: the device a stream belongs to. stream_wait: make
     * `waiter` wait for the work queued so far on `signaller` (an event
     * recorded on one, waited on by the other; nothing when they are equal). */
    int (*stream_device)(void *stream, int *device);
    int (*stream_wait)(int device, void *waiter, void *signaller);
    /* The backend's stream-ordered pool (one per device). free must be given
     * the size and stream of the allocation. */
    int (*alloc)(int device, size_t nbytes, void *stream, void **ptr);
    int (*free)(int device, void *ptr, size_t nbytes, void *stream);
    int (*memory_stats)(int device, ampc_memory_stats *stats);
    int (*reset_peak_memory)(int device);
    /* Copy between the host (device -1) and a device, or within a device. A
     * copy to the host returns once the data has arrived. */
    int (*copy)(int dst_device, void *dst, int src_device, const void *src, size_t nbytes, void *stream);
    /* Fill nbytes of device memory with a byte value, queued on stream. */
    int (*memset)(int device, void *ptr, int value, size_t nbytes, void *stream);
    /* The lines AMPC_CONV_DEBUG asks of the convolutions (each pass's
     * algorithms and engines timed, and the one chosen), kept rather than
     * printed. *length: their length; where buf is not NULL and size >
     * *length, they are moved into buf, NUL-terminated, and forgotten. A buf
     * of AMPC_CONV_REPORT_SIZE bytes always takes them. */
    int (*conv_report)(char *buf, size_t size, size_t *length);

    /* ---------------------------------------------------------------- */
    /* Host controls: the CPU's (NULL on a device backend).             */
    /* ---------------------------------------------------------------- */

    /* Threads the kernels split their work across; set_num_threads waits
     * for a running job (1 <= n <= 1024). */
    int (*get_num_threads)(void);
    int (*set_num_threads)(int n);
    /* The CPU's SIMD features: up to max entries, returns how many. */
    int (*features)(ampc_feature *out, int max);
    /* Instruction sets: isa_name(i) for i = 0, 1, ... until NULL; whether
     * one is usable here; the one in use, and forcing another (tests).
     * set_isa: AMPC_ERR_INVALID for an unknown name, AMPC_ERR_UNSUPPORTED
     * for one this CPU lacks. */
    const char *(*isa_name)(int isa);
    int (*isa_supported)(int isa);
    int (*isa_active)(void);
    int (*set_isa)(const char *name);

    /* ---------------------------------------------------------------- */
    /* Conversions and the GradScaler (cast.c / cuda/cast.cu,           */
    /* unscale_cpu.c / cuda/scaler.cu)                                   */
    /* ---------------------------------------------------------------- */

    /* loop->data[0] (dtype dst) = loop->data[1] (dtype src), for the
     * floating dtypes and from integer and bool sources. fresh_output: the
     * destination was just allocated and never touched (a hint). */
    int (*cast)(int device, void *stream, const ampc_loop *loop, ampc_dtype dst, ampc_dtype src,
                int fresh_output);
    /* `block` is an ampc_scaler_block in the device's memory (host memory on
     * the CPU); the grads are on `device`.
     * unscale: block->flags[slot] = 1 if any element is inf or NaN, else 0;
     *   unless check_only, every element *= float32(1 / (double)block->scale).
     * unscale_clip: unscale and check as unscale does, and clip the unscaled
     *   gradients to their total norm of type norm_type, written as a float32
     *   to norm_out (the device's memory). block NULL: gradients that are not
     *   scaled, nothing flagged. divisor_out not NULL: check and take the
     *   norm only, leave the gradients as they are, and write scale /
     *   coefficient there for the optimizer's step.
     * update_scale: the rule of scaler_rule.h with the sum of flags[0 .. nflags).
     * scale_mul: loop->data[0] (dst) = loop->data[1] (src) * *scale, in
     *   float32 (float64 for float64), rounded to dst; scale is the device's
     *   memory.
     * count_nonfinite: counts[i] = inf and NaN elements of grads[i]; counts
     *   is host memory, filled before the call returns. */
    int (*unscale)(int device, void *stream, const ampc_grad_ref *grads, int64_t n, ampc_scaler_block *block,
                   int slot, int check_only);
    int (*unscale_clip)(int device, void *stream, const ampc_grad_ref *grads, int64_t n,
                        ampc_scaler_block *block, int slot, double max_norm, double norm_type, float *norm_out,
                        float *divisor_out);
    int (*update_scale)(int device, void *stream, ampc_scaler_block *block, int nflags,
                        const ampc_scale_rule *rule);
    int (*scale_mul)(int device, void *stream, const ampc_loop *loop, ampc_dtype dst, ampc_dtype src,
                     const float *scale);
    int (*count_nonfinite)(int device, void *stream, const ampc_grad_ref *grads, int64_t n, int64_t *counts);

    /* ---------------------------------------------------------------- */
    /* ampc.optim's fused steps (optim_descriptors.h). grad_scale and   */
    /* found_inf are the device's memory, or NULL. *ran: 1 if the step   */
    /* ran, 0 if found_inf skipped it, -1 where the host does not wait   */
    /* to know (a device backend).                                       */
    /* ---------------------------------------------------------------- */

    int (*sgd)(int device, void *stream, const ampc_optim_ref *refs, int64_t n, const ampc_sgd_config *config,
               const float *grad_scale, const float *found_inf, int *ran);
    int (*adam)(int device, void *stream, const ampc_optim_ref *refs, int64_t n, const ampc_adam_config *config,
                const float *grad_scale, const float *found_inf, int *ran);

    /* ---------------------------------------------------------------- */
    /* The op kernels of op_descriptors.h                                */
    /* ---------------------------------------------------------------- */

    int (*elementwise)(int device, void *stream, const ampc_ew *e);
    int (*softmax)(int device, void *stream, const ampc_softmax *s);
    int (*softmax_backward)(int device, void *stream, const ampc_softmax_backward *s);
    int (*layer_norm)(int device, void *stream, const ampc_layer_norm *l);
    int (*layer_norm_backward)(int device, void *stream, const ampc_layer_norm_backward *l);
    int (*reduce)(int device, void *stream, const ampc_reduce *r);
    int (*cross_entropy)(int device, void *stream, const ampc_cross_entropy *c);
    int (*cross_entropy_backward)(int device, void *stream, const ampc_cross_entropy_backward *c);
    /* NULL: ampc._C multiplies with NumPy (its BLAS) and finishes with
     * elementwise and reduce. */
    int (*gemm)(int device, void *stream, const ampc_gemm *g);
    /* NULL: ampc._C lowers the convolution to columns with im2col/col2im
     * below and multiplies them with NumPy. */
    int (*conv)(int device, void *stream, const ampc_conv *c);
    /* im2col: the columns of images [n0, n0 + images) of c->x in the
     * accumulation dtype, for each image i and group g a (c / groups) * r * s
     * by p * q matrix (a row per filter tap, the output positions in order
     * along it) at col + i * col_strides[0] + g * col_strides[1], rows
     * col_strides[2] apart (elements); col2im: the data gradient of those
     * images from such columns, rounded once into c->x. NULL where conv is
     * given. */
    int (*im2col)(const ampc_conv *c, int64_t n0, int64_t images, void *col, const int64_t col_strides[3]);
    int (*col2im)(const ampc_conv *c, int64_t n0, int64_t images, const void *col, const int64_t col_strides[3]);
    int (*batch_norm)(int device, void *stream, const ampc_batch_norm *b);
    int (*batch_norm_backward)(int device, void *stream, const ampc_batch_norm_backward *b);
    int (*pool)(int device, void *stream, const ampc_pool *p);
    int (*pool_backward)(int device, void *stream, const ampc_pool_backward *p);
    /* Indices already checked to lie in [0, num). */
    int (*embedding)(int device, void *stream, const ampc_embedding *e);
    int (*embedding_backward)(int device, void *stream, const ampc_embedding_backward *e);
    int (*dropout)(int device, void *stream, const ampc_dropout *d);
    /* Fused attention: AMPC_ERR_UNSUPPORTED for what its kernels do not
     * serve, NULL where it has none; ampc.nn composes it from matmul and
     * softmax then. */
    int (*attention)(int device, void *stream, const ampc_attention *a);
    int (*attention_backward)(int device, void *stream, const ampc_attention_backward *b);
} ampc_backend;

/* The backend linked into ampc._C (cpu/backend.c). */
extern const ampc_backend ampc_cpu_backend;

#ifdef __cplusplus
}
#endif

#endif /* AMPC_KERNELS_BACKEND_H */
