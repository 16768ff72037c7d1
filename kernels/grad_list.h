/*
 * grad_list.h: gradients as the unscale kernels of both backends see them.
 * Plain C, shared by the CPU kernels (cpu_kernels.h holds their entry
 * points) and ampc._cuda.
 *
 * torch._amp_foreach_non_finite_check_and_unscale_'s contract, per element:
 * the check is on the *scaled* value as stored (inf or NaN sets found_inf),
 * then v * inv_scale is computed in float32 (float64 for float64 gradients)
 * and rounded back to the gradient's dtype; with inv_scale exactly 1.0
 * (the check-only pass) nothing is written.
 */
#ifndef AMPC_KERNELS_GRAD_LIST_H
#define AMPC_KERNELS_GRAD_LIST_H

#include <stdint.h>
#include "kernels/dtypes.h"
#include "kernels/layout.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    char *data;            /* dense: the lowest address of its elements; else element [0..0] */
    int64_t numel;
    ampc_dtype dtype;      /* floating */
    const ampc_loop *loop; /* NULL when dense (any order of its elements is fine); else how to walk it */
} ampc_grad_ref;

#ifdef __cplusplus
}
#endif

#endif /* AMPC_KERNELS_GRAD_LIST_H */
