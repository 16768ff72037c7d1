/*
 * optim_descriptors.h: the fused optimizer steps of ampc.optim, as the CPU and CUDA
 * kernels see them. Plain C, shared by both backends; ampc._C hands them
 * over through the backend table (backend.h).
 *
 * One step updates a list of parameters at once: one pass over each
 * parameter, its gradient and its state, in torch's formulas (the element
 * arithmetic is in optim_math.h):
 *
 * SGD:  g = grad (negated when maximize) [+ weight_decay * param]
 *       buf = g on the first step, else momentum * buf + (1 - dampening) * g
 *       g = g + momentum * buf (nesterov) or buf;  param -= lr * g
 * Adam: step += 1;  g = grad (negated when maximize)
 *       Adam: g += weight_decay * param;  AdamW: param -= lr * weight_decay * param
 *       m = beta1 * m + (1 - beta1) * g;  v = beta2 * v + (1 - beta2) * g * g
 *       (amsgrad: vmax = max(vmax, v), used instead of v below)
 *       param -= lr / (1 - beta1^step) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps)
 *
 * With a GradScaler, grad_scale divides each gradient first (and the
 * unscaled gradient is written back, as torch's fused optimizers do), and a
 * non-zero found_inf skips the whole step, so the step needs no host
 * synchronisation: both are read where the kernel runs. A skipped step
 * changes nothing: not the parameters, not the state, not the step counts,
 * not whether SGD's next step is its first.
 */
#ifndef AMPC_KERNELS_OPTIM_DESCRIPTORS_H
#define AMPC_KERNELS_OPTIM_DESCRIPTORS_H

#include <stdint.h>
#include "kernels/dtypes.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    char *param;        /* dense arrays, all of the parameter's dtype, at their lowest address */
    char *grad;
    char *state[3];     /* SGD: momentum buffer; Adam: exp_avg, exp_avg_sq, max_exp_avg_sq (amsgrad) */
    /* Adam: this parameter's step count, a float32 as torch's fused Adam keeps
     * it. SGD with momentum: NULL once the buffer is known to hold a momentum;
     * until then a float32 that is 0 while no step has run (the buffer takes
     * the gradient) and that the first step to run sets to 1. */
    float *step;
    int64_t numel;
    ampc_dtype dtype;
} ampc_optim_ref;

typedef struct {
    double lr, momentum, dampening, weight_decay;
    int nesterov, maximize;
} ampc_sgd_config;

typedef struct {
    double lr, beta1, beta2, eps, weight_decay;
    int amsgrad, maximize, decoupled;   /* decoupled: AdamW's weight decay */
} ampc_adam_config;

#ifdef __cplusplus
}
#endif

#endif /* AMPC_KERNELS_OPTIM_DESCRIPTORS_H */
