/*
 * backend.c: the CPU's backend table (kernels/backend.h): the CPU kernels
 * under the signatures every backend shares. The device and stream are
 * always 0 and NULL here; the kernels' own form (cpu_kernels.h) stays plain,
 * and these adapters add what the table's contract asks: a status, the
 * scaler's block, the step's `ran`.
 */
#include "kernels/backend.h"

#include "cpu/cast_cpu.h"
#include "cpu/cpu_features.h"
#include "cpu/cpu_kernels.h"
#include "cpu/parallel.h"

/* The CPU kernels fail only for want of memory for their bookkeeping. */
static const char *last_error(void) { return "out of memory"; }

static int status_of(int rc) { return rc < 0 ? AMPC_ERR_OUT_OF_MEMORY : AMPC_OK; }

/* An op kernel's entry: the kernel on its descriptor. */
#define OP_ENTRY(entry, kernel, desc_type)                                          \
    static int entry(int device, void *stream, const desc_type *desc)               \
    {                                                                               \
        (void)device;                                                               \
        (void)stream;                                                               \
        return status_of(kernel(desc));                                             \
    }
OP_ENTRY(elementwise, ampc_cpu_elementwise, ampc_ew)
OP_ENTRY(softmax, ampc_cpu_softmax, ampc_softmax)
OP_ENTRY(softmax_backward, ampc_cpu_softmax_backward, ampc_softmax_backward)
OP_ENTRY(layer_norm, ampc_cpu_layer_norm, ampc_layer_norm)
OP_ENTRY(layer_norm_backward, ampc_cpu_layer_norm_backward, ampc_layer_norm_backward)
OP_ENTRY(reduce, ampc_cpu_reduce, ampc_reduce)
OP_ENTRY(cross_entropy, ampc_cpu_cross_entropy, ampc_cross_entropy)
OP_ENTRY(cross_entropy_backward, ampc_cpu_cross_entropy_backward, ampc_cross_entropy_backward)
OP_ENTRY(batch_norm, ampc_cpu_batch_norm, ampc_batch_norm)
OP_ENTRY(batch_norm_backward, ampc_cpu_batch_norm_backward, ampc_batch_norm_backward)
OP_ENTRY(pool, ampc_cpu_pool, ampc_pool)
OP_ENTRY(pool_backward, ampc_cpu_pool_backward, ampc_pool_backward)
OP_ENTRY(embedding, ampc_cpu_embedding, ampc_embedding)
OP_ENTRY(embedding_backward, ampc_cpu_embedding_backward, ampc_embedding_backward)
OP_ENTRY(dropout, ampc_cpu_dropout, ampc_dropout)
#undef OP_ENTRY

static int im2col(const ampc_conv *c, int64_t n0, int64_t images, void *col, const int64_t col_strides[3])
{
    return status_of(ampc_cpu_im2col(c, n0, images, col, col_strides));
}

static int col2im(const ampc_conv *c, int64_t n0, int64_t images, const void *col, const int64_t col_strides[3])
{
    return status_of(ampc_cpu_col2im(c, n0, images, col, col_strides));
}

static int cast(int device, void *stream, const ampc_loop *loop, ampc_dtype dst, ampc_dtype src, int fresh_output)
{
    (void)device;
    (void)stream;
    ampc_cast_cpu(loop, dst, src, fresh_output);
    return AMPC_OK;
}

/* ------------------------------------------------------------------------ */
/* The GradScaler: the block is in host memory                              */
/* ------------------------------------------------------------------------ */

static int unscale(int device, void *stream, const ampc_grad_ref *grads, int64_t n, ampc_scaler_block *block,
                   int slot, int check_only)
{
    (void)device;
    (void)stream;
    int nonfinite = 0;
    const float inv = check_only ? 1.0f : ampc_inv_scale(block->scale);
    if (ampc_unscale_cpu(grads, n, inv, check_only, &nonfinite) < 0)
        return AMPC_ERR_OUT_OF_MEMORY;
    block->flags[slot] = nonfinite ? 1.0f : 0.0f;
    return AMPC_OK;
}

/* The norm pass first, then (unless deferred) one read and write per
 * element with the clipping multiplier. */
static int unscale_clip(int device, void *stream, const ampc_grad_ref *grads, int64_t n, ampc_scaler_block *block,
                        int slot, double max_norm, double norm_type, float *norm_out, float *divisor_out)
{
    (void)device;
    (void)stream;
    const float scale = block != NULL ? block->scale : 1.0f;
    int nonfinite = 0;
    double norm = 0;
    if (ampc_grad_norm_cpu(grads, n, ampc_inv_scale(scale), norm_type, &nonfinite, &norm) < 0)
        return AMPC_ERR_OUT_OF_MEMORY;
    const double coef = ampc_clip_coef(norm, max_norm);
    if (divisor_out == NULL) {
        int unused;
        if (ampc_unscale_cpu(grads, n, ampc_clip_multiplier(scale, coef), 0, &unused) < 0)
            return AMPC_ERR_OUT_OF_MEMORY;
    }
    else {
        *divisor_out = ampc_clip_divisor(scale, coef);
    }
    *norm_out = (float)norm;
    if (block != NULL)
        block->flags[slot] = nonfinite ? 1.0f : 0.0f;
    return AMPC_OK;
}

static int update_scale(int device, void *stream, ampc_scaler_block *block, int nflags, const ampc_scale_rule *rule)
{
    (void)device;
    (void)stream;
    float found = 0;
    for (int i = 0; i < nflags; i++)
        found += block->flags[i];
    ampc_update_scale(block, found, rule);
    return AMPC_OK;
}

static int scale_mul(int device, void *stream, const ampc_loop *loop, ampc_dtype dst, ampc_dtype src,
                     const float *scale)
{
    (void)device;
    (void)stream;
    ampc_scale_mul_cpu(loop, dst, src, *scale);
    return AMPC_OK;
}

static int count_nonfinite(int device, void *stream, const ampc_grad_ref *grads, int64_t n, int64_t *counts)
{
    (void)device;
    (void)stream;
    for (int64_t i = 0; i < n; i++)
        counts[i] = ampc_count_nonfinite_cpu(&grads[i]);
    return AMPC_OK;
}

/* ------------------------------------------------------------------------ */
/* ampc.optim's steps: the host knows whether found_inf skipped them         */
/* ------------------------------------------------------------------------ */

static int step_status(int rc, int *ran)
{
    *ran = rc > 0;
    return status_of(rc);
}

static int sgd(int device, void *stream, const ampc_optim_ref *refs, int64_t n, const ampc_sgd_config *config,
               const float *grad_scale, const float *found_inf, int *ran)
{
    (void)device;
    (void)stream;
    return step_status(ampc_sgd_cpu(refs, n, config, grad_scale, found_inf), ran);
}

static int adam(int device, void *stream, const ampc_optim_ref *refs, int64_t n, const ampc_adam_config *config,
                const float *grad_scale, const float *found_inf, int *ran)
{
    (void)device;
    (void)stream;
    return step_status(ampc_adam_cpu(refs, n, config, grad_scale, found_inf), ran);
}

/* ------------------------------------------------------------------------ */
/* Host controls                                                             */
/* ------------------------------------------------------------------------ */

static int set_num_threads(int n)
{
    if (n < 1 || n > 1024)
        return AMPC_ERR_INVALID;
    ampc_set_num_threads(n);
    return AMPC_OK;
}

static const char *isa_name(int isa)
{
    return isa >= 0 && isa < AMPC_ISA_COUNT ? ampc_isa_name((ampc_isa)isa) : NULL;
}

static int isa_supported(int isa) { return isa >= 0 && isa < AMPC_ISA_COUNT && ampc_isa_supported((ampc_isa)isa); }

static int isa_active(void) { return (int)ampc_isa_active(); }

static int set_isa(const char *name)
{
    const int isa = ampc_isa_from_name(name);
    if (isa < 0)
        return AMPC_ERR_INVALID;
    if (!ampc_isa_supported((ampc_isa)isa))
        return AMPC_ERR_UNSUPPORTED;
    ampc_isa_set_active((ampc_isa)isa);
    return AMPC_OK;
}

/* Entries left out are NULL: devices, streams and memory (NumPy allocates
 * the CPU's), gemm and conv (ampc._C composes them with NumPy's matrix
 * product), and fused attention (ampc.nn composes it). */
const ampc_backend ampc_cpu_backend = {
    .abi_version = AMPC_BACKEND_ABI_VERSION,
    .struct_size = sizeof(ampc_backend),
    .name = "cpu",
    .runs_without_gil = 1,
    .last_error = last_error,
    .get_num_threads = ampc_get_num_threads,
    .set_num_threads = set_num_threads,
    .features = ampc_cpu_features,
    .isa_name = isa_name,
    .isa_supported = isa_supported,
    .isa_active = isa_active,
    .set_isa = set_isa,
    .cast = cast,
    .unscale = unscale,
    .unscale_clip = unscale_clip,
    .update_scale = update_scale,
    .scale_mul = scale_mul,
    .count_nonfinite = count_nonfinite,
    .sgd = sgd,
    .adam = adam,
    .elementwise = elementwise,
    .softmax = softmax,
    .softmax_backward = softmax_backward,
    .layer_norm = layer_norm,
    .layer_norm_backward = layer_norm_backward,
    .reduce = reduce,
    .cross_entropy = cross_entropy,
    .cross_entropy_backward = cross_entropy_backward,
    .im2col = im2col,
    .col2im = col2im,
    .batch_norm = batch_norm,
    .batch_norm_backward = batch_norm_backward,
    .pool = pool,
    .pool_backward = pool_backward,
    .embedding = embedding,
    .embedding_backward = embedding_backward,
    .dropout = dropout,
};
