/*
 * optim_math.h: one element of ampc.optim's updates (see optim.h), written
 * once for the CPU kernels (optim_cpu.c) and the CUDA kernels (optim.cu).
 *
 * The arithmetic is that of torch's fused CUDA optimizers (_fused_sgd_,
 * _fused_adam_, _fused_adamw_), operation for operation: the element works
 * in its "opmath" type (float32 for float32, float16 and bfloat16
 * parameters, float64 for float64 ones) while the hyperparameters are
 * float64, so a line such as `m = beta1 * m + (1 - beta1) * g` is evaluated
 * in float64 and rounded once to opmath; the final update
 * `p - step_size * m / denom` is opmath arithmetic. Every operation is a
 * correctly rounded IEEE one and both compilers are told not to contract a
 * multiply and an add into a fused multiply-add (-ffp-contract=off, nvcc
 * --fmad=false for optim.cu), so the CPU and the GPU give the same bits;
 * the exceptions are NaN payloads (the 16-bit stores quiet NaNs as each side
 * does) and float64 Adam, whose bias corrections come from each side's
 * pow(), which may differ in the last bit (float32 opmath rounds that away).
 * torch's own build lets nvcc contract: against torch the results agree to
 * the last bit of float32 but for the rare element where a float64 fma and
 * a float64 multiply-add round to different sides of a float32 boundary.
 *
 * The body is optim_math.inc, included once per opmath type: it defines
 * ampc_<name>_float and ampc_<name>_double.
 */
#ifndef AMPC_OPTIM_MATH_H
#define AMPC_OPTIM_MATH_H

#include <math.h>
#include "optim.h"

#ifdef __CUDACC__
#define AMPC_OPTIM_FN static __device__ __forceinline__
#else
#define AMPC_OPTIM_FN static inline
#endif

#define AMPC_OPTIM_CAT_(a, b) a##_##b
#define AMPC_OPTIM_CAT(a, b) AMPC_OPTIM_CAT_(a, b)

#define OPMATH float
#define OPMATH_SQRT sqrtf
#include "optim_math.inc"
#undef OPMATH
#undef OPMATH_SQRT

#define OPMATH double
#define OPMATH_SQRT sqrt
#include "optim_math.inc"
#undef OPMATH
#undef OPMATH_SQRT

#endif /* AMPC_OPTIM_MATH_H */
