/*
 * scaler_rule.h: the loss scale's state and its update rule, shared by the
 * CPU (host memory) and the GPU (one-thread kernel, so update() never waits
 * for the device). Plain C that nvcc also compiles.
 *
 * The rule is torch._amp_update_scale_'s, bit for bit:
 *   - an overflow (found_inf non-zero; NaN counts) multiplies the scale by
 *     backoff_factor and resets the growth tracker;
 *   - a clean step counts: on exactly growth_interval clean steps in a row
 *     the scale is multiplied by growth_factor, unless that would leave the
 *     float32 range, and the tracker restarts. Products are taken in double
 *     (the factors are doubles) and rounded to float32, as torch does.
 * and two bounds and a hysteresis that torch lacks, all off by default:
 *   - min_scale / max_scale: the scale never backs off below min_scale and
 *     never grows above max_scale;
 *   - hysteresis = N: back off only on the N-th overflowing step in a row
 *     (a clean step restores the allowance), as DeepSpeed and Megatron do.
 *     N = 1 is torch's behaviour.
 */
#ifndef AMPC_KERNELS_SCALER_RULE_H
#define AMPC_KERNELS_SCALER_RULE_H

#include <stdint.h>

#ifdef __CUDACC__
#define AMPC_RULE_FN static inline __host__ __device__
#else
#define AMPC_RULE_FN static inline
#endif

/* found_inf flags one device can hold between two update() calls: one per
 * unscale_/inf check of an optimizer on that device. */
#define AMPC_SCALER_MAX_FLAGS 255

/* The scaler's memory on one device (host memory for the CPU). The block on
 * the scale's own device is the master; a block on another device holds a
 * copy of the scale for its kernels and that device's found_inf flags. */
typedef struct {
    float scale;
    int32_t growth_tracker;
    int32_t hysteresis_left;  /* overflows still tolerated before a backoff */
    float found_inf;          /* the combined flag of the last update */
    int64_t steps;            /* updates so far */
    int64_t skipped;          /* ... of which had found an inf or NaN */
    float flags[AMPC_SCALER_MAX_FLAGS];
} ampc_scaler_block;

typedef struct {
    double growth_factor;
    double backoff_factor;
    double min_scale;         /* 0: no floor */
    double max_scale;         /* +inf: no ceiling */
    int64_t growth_interval;
    int32_t hysteresis;       /* >= 1 */
} ampc_scale_rule;

AMPC_RULE_FN int ampc_rule_isfinite(float x)
{
    union { float f; uint32_t u; } v;
    v.f = x;
    return (v.u & 0x7f800000u) != 0x7f800000u;
}

/* Apply one update with the combined found_inf (a sum of flags). */
AMPC_RULE_FN void ampc_update_scale(ampc_scaler_block *b, float found_inf, const ampc_scale_rule *r)
{
    b->found_inf = found_inf;
    b->steps += 1;
    if (found_inf != 0.0f) {  /* NaN != 0 is true: a NaN flag counts as an overflow */
        b->skipped += 1;
        b->growth_tracker = 0;
        if (b->hysteresis_left > 1) {
            b->hysteresis_left -= 1;
            return;
        }
        b->hysteresis_left = 0;
        float backed_off = (float)((double)b->scale * r->backoff_factor);
        if ((double)backed_off < r->min_scale)
            backed_off = (float)r->min_scale;
        b->scale = backed_off;
        return;
    }
    b->hysteresis_left = r->hysteresis;
    /* In 64 bits, so a huge growth_interval cannot overflow the tracker. */
    const int64_t successful = (int64_t)b->growth_tracker + 1;
    if (successful == r->growth_interval) {
        float grown = (float)((double)b->scale * r->growth_factor);
        if ((double)grown > r->max_scale)
            grown = (float)r->max_scale;
        /* Do not grow the scale past float32's range (to inf). */
        if (ampc_rule_isfinite(grown))
            b->scale = grown;
        b->growth_tracker = 0;
    }
    else {
        b->growth_tracker = successful > INT32_MAX ? INT32_MAX : (int32_t)successful;
    }
}

/* The reciprocal as torch takes it: in float64, then rounded to float32. */
AMPC_RULE_FN float ampc_inv_scale(float scale) { return (float)(1.0 / (double)scale); }

/* torch.nn.utils.clip_grad_norm_'s coefficient max_norm / (norm + 1e-6), at
 * most 1. Where the norm is not finite the step is skipped anyway, and the
 * coefficient is 1: the gradients are only unscaled. */
AMPC_RULE_FN double ampc_clip_coef(double norm, double max_norm)
{
    const double coef = max_norm / (norm + 1e-6);
    return coef < 1.0 && norm <= 1.7976931348623157e308 ? coef : 1.0;
}

/* What a clipping pass multiplies the scaled gradients by: inv_scale times
 * the coefficient, rounded once. */
AMPC_RULE_FN float ampc_clip_multiplier(float scale, double coef)
{
    return (float)((double)ampc_inv_scale(scale) * coef);
}

/* Deferred clipping: what the optimizer's fused step divides the scaled
 * gradients by instead (the grad_scale it is given). */
AMPC_RULE_FN float ampc_clip_divisor(float scale, double coef) { return (float)((double)scale / coef); }

#endif /* AMPC_KERNELS_SCALER_RULE_H */
