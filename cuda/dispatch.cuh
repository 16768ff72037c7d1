/*
 * dispatch.cuh: the GPU kernels' one dispatch from a run-time floating
 * dtype to compile-time types. dispatch_float(dtype, fn) calls fn with the
 * tag of float16, bfloat16, float32 or float64, and each caller maps the
 * tag to its own types with float_type<Tag, F16, BF16, F32, F64> (in that
 * order): packs.cuh to __half, __nv_bfloat16 and float, optim.cu to its
 * bit structs, cast.cu to its conversion tags. fn is instantiated once per
 * tag; tags that a caller maps to the same type reach the same kernels.
 *
 * Not through here, on purpose: scaler.cu loads and stores each element
 * by its run-time dtype, since one launch's table mixes dtypes; and the
 * one-line `dtype == AMPC_FLOAT64 ? f<double> : f<float>` picks of a
 * compute type (embedding.cu, loss.cu, norm.cu, reduce.cu, ...), where a
 * tag and a map would only add a template to the same choice.
 */
#ifndef AMPC_DISPATCH_CUH
#define AMPC_DISPATCH_CUH

#include "backend_cuda.h"

namespace dtype_tag {

/* A tag names its column of float_type. */
struct Float16 {
    template <class F16, class BF16, class F32, class F64> using pick = F16;
};
struct BFloat16 {
    template <class F16, class BF16, class F32, class F64> using pick = BF16;
};
struct Float32 {
    template <class F16, class BF16, class F32, class F64> using pick = F32;
};
struct Float64 {
    template <class F16, class BF16, class F32, class F64> using pick = F64;
};

}  // namespace dtype_tag

/* The caller's type for the dtype of Tag. */
template <class Tag, class F16, class BF16, class F32, class F64>
using float_type = typename Tag::template pick<F16, BF16, F32, F64>;

/* fn(tag) for a floating dtype. Any other dtype takes float32's tag, the
 * row kernels' fallback: callers check their dtypes first (optim.cu packs
 * only the four; cast.cu, which also copies integers, tests
 * AMPC_DTYPE_IS_FLOAT itself). */
template <class Fn>
auto dispatch_float(int dtype, Fn fn) -> decltype(fn(dtype_tag::Float32()))
{
    switch (dtype) {
    case AMPC_FLOAT16: return fn(dtype_tag::Float16());
    case AMPC_BFLOAT16: return fn(dtype_tag::BFloat16());
    case AMPC_FLOAT64: return fn(dtype_tag::Float64());
    default: return fn(dtype_tag::Float32());
    }
}

#endif /* AMPC_DISPATCH_CUH */
