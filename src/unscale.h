/*
 * unscale.h: gradients as the unscale kernels see them, and the CPU entry
 * points. Plain C, shared by the CPU kernels and ampc._cuda.
 *
 * torch._amp_foreach_non_finite_check_and_unscale_'s contract, per element:
 * the check is on the *scaled* value as stored (inf or NaN sets found_inf),
 * then v * inv_scale is computed in float32 (float64 for float64 gradients)
 * and rounded back to the gradient's dtype; with inv_scale exactly 1.0
 * (the check-only pass) nothing is written.
 */
#ifndef AMPC_UNSCALE_H
#define AMPC_UNSCALE_H

#include <stdint.h>
#include "ampc_types.h"
#include "layout.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    char *data;            /* dense: the lowest address of its elements; else element [0..0] */
    int64_t numel;
    ampc_dtype dtype;      /* floating */
    const ampc_loop *loop; /* NULL when dense (any order of its elements is fine); else how to walk it */
} ampc_grad_ref;

/* One contiguous run of one dtype: unscale in place (or only check when
 * check_only); returns 1 if any element is inf or NaN. */
typedef int (*ampc_unscale_fn)(char *p, int64_t n, float inv_scale, int check_only);
/* Sum of squares of (v * inv_scale) over a run, in float64; sets *nonfinite
 * if any v is inf or NaN. */
typedef double (*ampc_sumsq_fn)(const char *p, int64_t n, float inv_scale, int *nonfinite);

typedef struct {
    ampc_unscale_fn unscale[AMPC_NUM_FLOAT_DTYPES];
    ampc_sumsq_fn sumsq[AMPC_NUM_FLOAT_DTYPES];
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

#ifdef __cplusplus
}
#endif

#endif /* AMPC_UNSCALE_H */
