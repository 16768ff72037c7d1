/*
 * optim_math.h: one element of ampc.optim's updates (see optim_descriptors.h), written
 * once for the CPU kernels (optim_cpu.c) and the CUDA kernels (optim.cu).
 *
 * The arithmetic is that of torch's fused CUDA optimizers (_fused_sgd_,
 * _fused_adam_, _fused_adamw_ of torch 2.11), operation for operation: the
 * element and the hyperparameters in the element's "opmath" type (float32
 * for float32, float16 and bfloat16 parameters, float64 for float64 ones),
 * and the fused multiply-adds where torch's build lets nvcc contract a
 * multiply and an add, spelt out as fma() calls. Both compilers are told
 * never to contract on their own (-ffp-contract=off; nvcc --fmad=false for
 * optim.cu), so every other operation is one correctly rounded IEEE
 * operation on both sides and the CPU and the GPU give the same bits.
 *
 * The one exception is Adam's bias correction beta^step. The GPU takes
 * CUDA's powf() as torch does, which is not correctly rounded: for about
 * one step count in 10^4 (beta 0.9) to one in 200 (beta 0.999) it is one ulp
 * off, and there the CPU, which rounds a float64 pow() once, gives the
 * closer factor and results that differ in the last bit. (NaN payloads are
 * the other: the 16-bit stores quiet NaNs as each side does.)
 *
 * Against torch itself: the same bits on the GPU, but for SGD under a
 * GradScaler, where torch's kernel, in its grad_scale branch, rounds
 * `p - lr * g` otherwise than in its plain one (measured: about 1 % of the
 * elements an ulp apart); ampc rounds both as the plain one does.
 *
 * The body is optim_math.inc, included once per opmath type: it defines
 * ampc_<name>_float and ampc_<name>_double.
 */
#ifndef AMPC_KERNELS_OPTIM_MATH_H
#define AMPC_KERNELS_OPTIM_MATH_H

#include <math.h>
#include "kernels/optim_descriptors.h"

#ifdef __CUDACC__
#define AMPC_OPTIM_FN static __device__ __forceinline__
#else
/* Inlined into each instruction set's loops (optim_cpu.c) so that they vectorise. */
#define AMPC_OPTIM_FN static inline __attribute__((always_inline))
#endif

#define AMPC_OPTIM_CAT_(a, b) a##_##b
#define AMPC_OPTIM_CAT(a, b) AMPC_OPTIM_CAT_(a, b)

#ifdef __CUDACC__
#define AMPC_POWF powf
#else
/* float32 beta^step rounded once from float64 (see above). */
static inline float ampc_powf_rounded(float x, float y) { return (float)pow((double)x, (double)y); }
#define AMPC_POWF ampc_powf_rounded
#endif

#define OPMATH float
#define OPMATH_SQRT sqrtf
#define OPMATH_POW AMPC_POWF
#define OPMATH_FMA fmaf
#include "kernels/optim_math.inc"
#undef OPMATH
#undef OPMATH_SQRT
#undef OPMATH_POW
#undef OPMATH_FMA

#define OPMATH double
#define OPMATH_SQRT sqrt
#define OPMATH_POW pow
#define OPMATH_FMA fma
#include "kernels/optim_math.inc"
#undef OPMATH
#undef OPMATH_SQRT
#undef OPMATH_POW
#undef OPMATH_FMA

#endif /* AMPC_KERNELS_OPTIM_MATH_H */
