/*
 * cpu_kernels.h: the CPU backend's kernels, for arrays in host memory, in
 * their plain form; cpu/backend.c puts them in the backend table
 * (kernels/backend.h) through which ampc._C calls them. Plain C, no Python:
 * the caller releases the GIL around them, and most split their work across
 * ampc's threads (parallel.h). Nothing here is seen outside cpu/.
 */
#ifndef AMPC_CPU_KERNELS_H
#define AMPC_CPU_KERNELS_H

#include <stdint.h>
#include "kernels/dtypes.h"
#include "kernels/layout.h"
#include "kernels/op_descriptors.h"
#include "kernels/optim_descriptors.h"
#include "kernels/grad_list.h"

/* ------------------------------------------------------------------------ */
/* op_descriptors.h's kernels (ops_cpu.c): 0, or -1 when out of memory (nothing        */
/* written).                                                                */
/* ------------------------------------------------------------------------ */

int ampc_cpu_elementwise(const ampc_ew *e);
int ampc_cpu_softmax(const ampc_softmax *s);
int ampc_cpu_softmax_backward(const ampc_softmax_backward *s);
int ampc_cpu_layer_norm(const ampc_layer_norm *l);
int ampc_cpu_layer_norm_backward(const ampc_layer_norm_backward *l);
int ampc_cpu_reduce(const ampc_reduce *r);
int ampc_cpu_cross_entropy(const ampc_cross_entropy *c);
int ampc_cpu_cross_entropy_backward(const ampc_cross_entropy_backward *c);
/* spatial_cpu.c. The convolution's matrix product is NumPy's: the CPU
 * kernels lower to and from columns. im2col: the columns of images
 * [n0, n0 + images) of x in the accumulation dtype, for each image i and
 * group g a (c / groups) * r * s by p * q matrix (a row per filter tap, the
 * output positions in order along it) at col + i * col_strides[0] +
 * g * col_strides[1], rows col_strides[2] apart (elements); col2im: the
 * data gradient of those images from such columns, rounded once into x. */
int ampc_cpu_im2col(const ampc_conv *cv, int64_t n0, int64_t images, void *col, const int64_t col_strides[3]);
int ampc_cpu_col2im(const ampc_conv *cv, int64_t n0, int64_t images, const void *col, const int64_t col_strides[3]);
int ampc_cpu_batch_norm(const ampc_batch_norm *b);
int ampc_cpu_batch_norm_backward(const ampc_batch_norm_backward *b);
int ampc_cpu_pool(const ampc_pool *p);
int ampc_cpu_pool_backward(const ampc_pool_backward *p);
/* embedding_cpu.c: indices already checked to lie in [0, num). */
int ampc_cpu_embedding(const ampc_embedding *e);
int ampc_cpu_embedding_backward(const ampc_embedding_backward *e);
int ampc_cpu_dropout(const ampc_dropout *d);

/* ------------------------------------------------------------------------ */
/* optim_descriptors.h's steps (optim_cpu.c)                                            */
/* ------------------------------------------------------------------------ */

/* grad_scale and found_inf may be NULL. Return 1 if the step ran, 0 if
 * found_inf skipped it, -1 (nothing changed) when out of memory for the
 * bookkeeping. */
int ampc_sgd_cpu(const ampc_optim_ref *refs, int64_t n, const ampc_sgd_config *c, const float *grad_scale,
                 const float *found_inf);
int ampc_adam_cpu(const ampc_optim_ref *refs, int64_t n, const ampc_adam_config *c, const float *grad_scale,
                  const float *found_inf);

/* ------------------------------------------------------------------------ */
/* Unscaling grad_list.h's gradients (unscale_cpu.c, kernels_avx*.c)          */
/* ------------------------------------------------------------------------ */

/* One contiguous run of one dtype: unscale in place (or only check when
 * check_only); returns 1 if any element is inf or NaN. */
typedef int (*ampc_unscale_fn)(char *p, int64_t n, float inv_scale, int check_only);
/* Sum of squares of (v * inv_scale) over a run, in float64; sets *nonfinite
 * if any v is inf or NaN. */
typedef double (*ampc_sumsq_fn)(const char *p, int64_t n, float inv_scale, int *nonfinite);

typedef struct {
    ampc_unscale_fn unscale[AMPC_NUM_DTYPES];  /* by dtype number */
    ampc_sumsq_fn sumsq[AMPC_NUM_DTYPES];
} ampc_unscale_table;

/* Per instruction set (NULL entries fall back to the portable ones). */
extern const ampc_unscale_table ampc_unscale_portable;
extern const ampc_unscale_table ampc_unscale_avx2;
extern const ampc_unscale_table ampc_unscale_avx512;

/* Check and unscale a list of gradients in place, split across ampc's
 * threads; *nonfinite = 1 if any element of any of them is inf or NaN. No
 * Python: the caller may release the GIL. -1 (nothing touched) when out of
 * memory for the bookkeeping. */
int ampc_unscale_cpu(const ampc_grad_ref *grads, int64_t n, float inv_scale, int check_only,
                     int *nonfinite);

/* The norm of the unscaled gradients over the whole list, as
 * torch.nn.utils.clip_grad_norm_ defines it (norm_type 2, 1, inf or any
 * p > 0), and whether any element is inf or NaN. -1 when out of memory. */
int ampc_grad_norm_cpu(const ampc_grad_ref *grads, int64_t n, float inv_scale, double norm_type,
                       int *nonfinite, double *norm);

/* Inf and NaN elements of one gradient (for overflow reports: on demand,
 * single-threaded). */
int64_t ampc_count_nonfinite_cpu(const ampc_grad_ref *grad);

/* loop->data[0] (dst) = loop->data[1] (src) * scale, in float32 (float64 for
 * float64), rounded to dst: what GradScaler.scale does to a loss. */
void ampc_scale_mul_cpu(const ampc_loop *loop, ampc_dtype dst, ampc_dtype src, float scale);

#endif /* AMPC_CPU_KERNELS_H */
