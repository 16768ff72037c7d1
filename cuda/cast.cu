/*
 * cast.cu: elementwise conversion between float32, float16, bfloat16 and
 * float64 on the GPU; from integer and bool arrays to those (torch's .to()),
 * and same-dtype copies of any dtype.
 *
 * Bit for bit the function of kernels/fp_formats.h, so CPU and GPU results are
 * identical: the float32 <-> 16-bit pairs use the hardware conversions
 * (cvt.rn: nearest even, subnormals kept, overflow to inf; this file must
 * never be built with --use_fast_math or -ftz=true) with NaN lanes redone by
 * fp_formats.h, whose NaN rule the hardware does not follow; the float64
 * pairs run fp_formats.h itself, which rounds float64 straight to 16 bits
 * (through float32 would round twice).
 *
 * Three kernels:
 *   - contiguous: each thread converts 8 elements with 16-byte loads and
 *     stores; a few scalar threads cover the unaligned head and the tail.
 *     This is the path every dense array takes, since ampc_loop_init merges
 *     dense layouts into one run. It is memory-bound: 6 bytes per element for
 *     float32 -> float16, against the device's copy bandwidth.
 *   - strided rows: a strided layout whose innermost dimension is dense
 *     and whole 16-byte vectors long takes a thread per vector of it;
 *   - strided: one thread per element, index decomposed over up to
 *     AMPC_MAX_NDIM dimensions; for views that no merging can make dense.
 * Indices are 64-bit throughout: arrays of more than 2^31 elements are fine.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include <type_traits>

#include "common.h"
#include "dispatch.cuh"
#include "kernels/fp_formats.h"
#include "strided.cuh"

namespace {

struct F32 { typedef uint32_t bits; };
struct F16 { typedef uint16_t bits; };
struct BF16 { typedef uint16_t bits; };
struct F64 { typedef uint64_t bits; };
/* Integer and bool sources: the bits are the value. */
template <class T> struct Int { typedef T bits; };
struct Bool { typedef uint8_t bits; };

/* The hardware conversions (cvt.rn: nearest even, subnormals kept, overflow
 * to inf), right for every input but NaN; float32 -> 16 bits two at a time
 * with the packed instructions (cvt.rn.f16x2.f32, cvt.rn.bf16x2.f32). */
__device__ __forceinline__ float hw_to_f32(F32, uint32_t b) { return __uint_as_float(b); }
__device__ __forceinline__ float hw_to_f32(F16, uint16_t h) { return __half2float(__ushort_as_half(h)); }
__device__ __forceinline__ float hw_to_f32(BF16, uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

__device__ __forceinline__ void hw_from_f32x2(F32, float a, float b, uint32_t &x, uint32_t &y)
{
    x = __float_as_uint(a);
    y = __float_as_uint(b);
}

__device__ __forceinline__ void hw_from_f32x2(F16, float a, float b, uint16_t &x, uint16_t &y)
{
    const __half2 h = __floats2half2_rn(a, b);
    x = __half_as_ushort(__low2half(h));
    y = __half_as_ushort(__high2half(h));
}

__device__ __forceinline__ void hw_from_f32x2(BF16, float a, float b, uint16_t &x, uint16_t &y)
{
    const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    x = __bfloat16_as_ushort(__low2bfloat16(h));
    y = __bfloat16_as_ushort(__high2bfloat16(h));
}

/* The same one element at a time, NaN included (fp_formats.h's rule). */
__device__ __forceinline__ uint32_t exact_to_f32(F32, uint32_t b) { return b; }
__device__ __forceinline__ uint32_t exact_to_f32(F16, uint16_t h)
{
    return ampc_f16_bits_isnan(h) ? ampc_f16_nan_to_f32(h) : __float_as_uint(hw_to_f32(F16(), h));
}
__device__ __forceinline__ uint32_t exact_to_f32(BF16, uint16_t h) { return ampc_bf16_to_f32_bits(h); }

__device__ __forceinline__ uint32_t exact_from_f32(F32, uint32_t b) { return b; }
__device__ __forceinline__ uint16_t exact_from_f32(F16, uint32_t b)
{
    return ampc_f32_bits_isnan(b) ? ampc_f32_nan_to_f16(b) : __half_as_ushort(__float2half_rn(__uint_as_float(b)));
}
__device__ __forceinline__ uint16_t exact_from_f32(BF16, uint32_t b)
{
    return ampc_f32_bits_isnan(b) ? ampc_f32_nan_to_bf16(b)
                                  : __bfloat16_as_ushort(__float2bfloat16_rn(__uint_as_float(b)));
}

__device__ __forceinline__ bool is_nan(F32, uint32_t b) { return ampc_f32_bits_isnan(b); }
__device__ __forceinline__ bool is_nan(F16, uint16_t h) { return ampc_f16_bits_isnan(h); }
__device__ __forceinline__ bool is_nan(BF16, uint16_t h) { return ampc_bf16_bits_isnan(h); }

/*
 * Convert<D, S>: S bits -> D bits, for the float32 and 16-bit formats.
 *   exact(x)      one element, NaN included;
 *   fast2(a, b)   two elements with the hardware, right except where an input is NaN;
 *   fix_nan       whether fast2's NaN lanes must be redone with exact().
 * The vector kernel runs fast2 over its 8 elements, tests them for NaN once
 * and redoes the NaN lanes only then: a branch a warp almost never takes
 * costs fewer instructions than a select on every lane.
 */
template <class D, class S>
struct Convert {
    static constexpr bool fix_nan = true;
    static __device__ __forceinline__ typename D::bits exact(typename S::bits x)
    {
        return exact_from_f32(D(), exact_to_f32(S(), x));  /* float32 holds both 16-bit formats */
    }
    static __device__ __forceinline__ void fast2(typename S::bits a, typename S::bits b,
                                                 typename D::bits &x, typename D::bits &y)
    {
        hw_from_f32x2(D(), hw_to_f32(S(), a), hw_to_f32(S(), b), x, y);
    }
};

/* Same dtype: a copy, every bit kept (signalling NaNs too), as on the CPU. */
template <class T>
struct Copy {
    static constexpr bool fix_nan = false;
    static __device__ __forceinline__ typename T::bits exact(typename T::bits x) { return x; }
    static __device__ __forceinline__ void fast2(typename T::bits a, typename T::bits b,
                                                 typename T::bits &x, typename T::bits &y)
    {
        x = a;
        y = b;
    }
};
template <class T> struct Convert<T, T> : Copy<T> {};

/* float64 pairs: fp_formats.h directly (exact on every input, NaN included),
 * which rounds float64 to 16 bits once. */
#define EXACT_PAIR(D, S, FN)                                                                             \
    template <>                                                                                          \
    struct Convert<D, S> {                                                                               \
        static constexpr bool fix_nan = false;                                                           \
        static __device__ __forceinline__ D::bits exact(S::bits x) { return FN(x); }                   \
        static __device__ __forceinline__ void fast2(S::bits a, S::bits b, D::bits &x, D::bits &y)    \
        {                                                                                                \
            x = FN(a);                                                                                   \
            y = FN(b);                                                                                   \
        }                                                                                                \
    };
EXACT_PAIR(F64, F32, ampc_f32_to_f64_bits)
EXACT_PAIR(F64, F16, ampc_f16_to_f64_bits)
EXACT_PAIR(F64, BF16, ampc_bf16_to_f64_bits)
EXACT_PAIR(F32, F64, ampc_f64_to_f32_bits)
EXACT_PAIR(F16, F64, ampc_f64_to_f16_bits)
EXACT_PAIR(BF16, F64, ampc_f64_to_bf16_bits)
#undef EXACT_PAIR

/* Integer and bool sources, as torch's .to() (c10 constructs a 16-bit
 * float from an integer through float): the value to float32 (to nearest;
 * float64 directly), a 16-bit result rounded from there. cpu/cast_portable.c
 * is the CPU's same function. */
__device__ __forceinline__ uint64_t value_to(F64, double v) { return (uint64_t)__double_as_longlong(v); }
__device__ __forceinline__ uint32_t value_to(F32, float v) { return __float_as_uint(v); }
__device__ __forceinline__ uint16_t value_to(F16, float v) { return __half_as_ushort(__float2half_rn(v)); }
__device__ __forceinline__ uint16_t value_to(BF16, float v) { return __bfloat16_as_ushort(__float2bfloat16_rn(v)); }

template <class T> __device__ __forceinline__ T value_of(Int<T>, T x) { return x; }
__device__ __forceinline__ bool value_of(Bool, uint8_t x) { return x != 0; }  /* any nonzero byte is true */

template <class D, class S>
struct ConvertValue {
    static constexpr bool fix_nan = false;
    static __device__ __forceinline__ typename D::bits exact(typename S::bits x)
    {
        typedef typename std::conditional<std::is_same<D, F64>::value, double, float>::type Via;
        return value_to(D(), (Via)value_of(S(), x));
    }
    static __device__ __forceinline__ void fast2(typename S::bits a, typename S::bits b,
                                                 typename D::bits &x, typename D::bits &y)
    {
        x = exact(a);
        y = exact(b);
    }
};
template <class D, class T> struct Convert<D, Int<T>> : ConvertValue<D, Int<T>> {};
template <class D> struct Convert<D, Bool> : ConvertValue<D, Bool> {};
template <class T> struct Convert<Int<T>, Int<T>> : Copy<Int<T>> {};
template <> struct Convert<Bool, Bool> : Copy<Bool> {};

/* Elements per vector thread, and the vectors they move: 16-byte aligned
 * groups of 8 (two or four 16-byte accesses for 4- and 8-byte types). */
constexpr int VEC = 8;
template <class T> struct alignas(16) Vec { T v[VEC]; };

constexpr int BLOCK = 256;

/* One vector: the fast conversion, or the exact one where a NaN needs it. */
template <class D, class S>
__device__ __forceinline__ Vec<typename D::bits> convert_vec(const Vec<typename S::bits> &in)
{
    Vec<typename D::bits> out;
#pragma unroll
    for (int k = 0; k < VEC; k += 2)
        Convert<D, S>::fast2(in.v[k], in.v[k + 1], out.v[k], out.v[k + 1]);
    if constexpr (Convert<D, S>::fix_nan) {
        bool any_nan = false;
#pragma unroll
        for (int k = 0; k < VEC; k++)
            any_nan |= is_nan(S(), in.v[k]);
        if (any_nan) {
#pragma unroll
            for (int k = 0; k < VEC; k++)
                out.v[k] = Convert<D, S>::exact(in.v[k]);
        }
    }
    return out;
}

/* Threads [0, nvec) convert vector k = elements head + 8k ...; the next
 * `head` threads the elements before it, the rest the tail after it. */
template <class D, class S>
__global__ void cast_contiguous_kernel(typename D::bits *__restrict__ dst,
                                       const typename S::bits *__restrict__ src, int64_t n,
                                       int64_t head, int64_t nvec)
{
    const int64_t t = (int64_t)blockIdx.x * BLOCK + threadIdx.x;
    if (t < nvec) {
        const int64_t base = head + t * VEC;
        *reinterpret_cast<Vec<typename D::bits> *>(dst + base) =
            convert_vec<D, S>(*reinterpret_cast<const Vec<typename S::bits> *>(src + base));
        return;
    }
    int64_t i = t - nvec;  /* a scalar thread */
    if (i >= head)
        i += nvec * VEC;
    if (i < n)
        dst[i] = Convert<D, S>::exact(src[i]);
}

/* Each element read and written as one access (src/dlpack.c refuses GPU arrays whose elements
 * are not aligned to their size), never through memcpy: memcpy became byte stores, and CUDA 13.0's
 * ptxas stored the low byte of a float16 converted from int8, uint8 or bool from the wrong
 * half-register (the PTX is right), the source byte (0x3c01 for 1), for every strided element. */
template <class D, class S>
__global__ void cast_strided_kernel(char *dst, const char *src, int64_t n, const StridedLayout layout)
{
    for (int64_t t = (int64_t)blockIdx.x * BLOCK + threadIdx.x; t < n;
         t += (int64_t)gridDim.x * BLOCK) {
        int64_t dst_off, src_off;
        strided_offsets(layout, t, dst_off, src_off);
        const typename S::bits x = *reinterpret_cast<const typename S::bits *>(src + src_off);
        *reinterpret_cast<typename D::bits *>(dst + dst_off) = Convert<D, S>::exact(x);
    }
}

/* A strided layout whose innermost dimension is dense in both operands and
 * whole vectors long, every vector on a 16-byte boundary (attention's
 * heads moved between (B, H, T, D) and (B, T, H, D), a channels-last
 * relayout): a thread per vector, the outer offsets worked out once for 8
 * elements instead of once for each. */
template <class D, class S>
__global__ void cast_strided_rows_kernel(char *dst, const char *src, int64_t nvec, const StridedLayout layout)
{
    for (int64_t t = (int64_t)blockIdx.x * BLOCK + threadIdx.x; t < nvec; t += (int64_t)gridDim.x * BLOCK) {
        int64_t dst_off, src_off;
        strided_offsets(layout, t * VEC, dst_off, src_off);
        *reinterpret_cast<Vec<typename D::bits> *>(dst + dst_off) =
            convert_vec<D, S>(*reinterpret_cast<const Vec<typename S::bits> *>(src + src_off));
    }
}

/* Whether loop (two operands: dst of dsize-byte elements, src of ssize)
 * takes cast_strided_rows_kernel. */
bool strided_rows(const ampc_loop *loop, int64_t dsize, int64_t ssize)
{
    const int inner = loop->ndim - 1;
    if (inner < 0 || loop->strides[0][inner] != dsize || loop->strides[1][inner] != ssize ||
        loop->shape[inner] % VEC != 0)
        return false;
    if ((uintptr_t)loop->data[0] % 16 != 0 || (uintptr_t)loop->data[1] % 16 != 0)
        return false;
    for (int d = 0; d < inner; d++)
        if (loop->strides[0][d] % 16 != 0 || loop->strides[1][d] % 16 != 0)
            return false;
    return true;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* The first element index h < VEC at which both pointers are 16-byte
 * aligned, or -1 if there is none (their misalignments differ). */
int64_t aligned_head(uintptr_t dst, size_t dsize, uintptr_t src, size_t ssize)
{
    for (int64_t h = 0; h < VEC; h++)
        if ((dst + h * dsize) % 16 == 0 && (src + h * ssize) % 16 == 0)
            return h;
    return -1;
}

template <class D, class S>
int launch(const ampc_loop *loop, cudaStream_t stream)
{
    typedef typename D::bits DT;
    typedef typename S::bits ST;
    const int64_t n = loop->numel;
    const int contiguous = loop->ndim == 0 || (loop->ndim == 1 && loop->strides[0][0] == sizeof(DT) &&
                                               loop->strides[1][0] == sizeof(ST));
    /* A vector of 8 one-byte elements is no 16-byte access: those go an
     * element a thread. */
    constexpr bool vectors = sizeof(DT) > 1 && sizeof(ST) > 1;
    if (contiguous) {
        DT *dst = reinterpret_cast<DT *>(loop->data[0]);
        const ST *src = reinterpret_cast<const ST *>(loop->data[1]);
        int64_t head = vectors ? aligned_head((uintptr_t)dst, sizeof(DT), (uintptr_t)src, sizeof(ST)) : -1;
        int64_t nvec = 0;
        if (head >= 0 && head < n)
            nvec = (n - head) / VEC;
        else
            head = n;  /* no common alignment: all scalar */
        const int64_t threads = nvec + (n - nvec * VEC);
        cast_contiguous_kernel<D, S><<<(unsigned)ceil_div(threads, BLOCK), BLOCK, 0, stream>>>(
            dst, src, n, head, nvec);
    }
    else if (vectors && strided_rows(loop, sizeof(DT), sizeof(ST))) {
        cast_strided_rows_kernel<D, S><<<strided_blocks(n / VEC, BLOCK), BLOCK, 0, stream>>>(
            loop->data[0], loop->data[1], n / VEC, strided_layout(loop));
    }
    else {
        cast_strided_kernel<D, S><<<strided_blocks(n, BLOCK), BLOCK, 0, stream>>>(
            loop->data[0], loop->data[1], n, strided_layout(loop));
    }
    AMPC_CUDA_TRY(cudaGetLastError(), "launching the cast kernel");
    return AMPC_OK;
}

/* This file's conversion tag of a floating dtype's tag (dispatch.cuh). */
template <class Tag>
using FloatOf = float_type<Tag, F16, BF16, F32, F64>;

template <class S>
int dispatch_dst(ampc_dtype dst, const ampc_loop *loop, cudaStream_t stream)
{
    if (AMPC_DTYPE_IS_FLOAT(dst))
        return dispatch_float(dst, [&](auto tag) { return launch<FloatOf<decltype(tag)>, S>(loop, stream); });
    if constexpr (!std::is_same<S, F32>::value && !std::is_same<S, F16>::value && !std::is_same<S, BF16>::value &&
                  !std::is_same<S, F64>::value) {
        return launch<S, S>(loop, stream);  /* an integer or bool copy: src/cast.c asked dst == src */
    }
    return ampc_cuda_fail_msg(AMPC_ERR_INVALID, "cast: dtype %d is not floating", (int)dst);
}

}  // namespace

extern "C" int ampc_cuda_cast(int device, void *stream, const ampc_loop *loop, ampc_dtype dst,
                              ampc_dtype src)
{
    if (loop->numel == 0)
        return AMPC_OK;
    if (!AMPC_DTYPE_IS_FLOAT(dst) && dst != src)
        return ampc_cuda_fail_msg(AMPC_ERR_INVALID, "cast: dtype %d from dtype %d", (int)dst, (int)src);
    cudaStream_t s = (cudaStream_t)stream;
    return ampc_on_device(device, [&] {
        if (AMPC_DTYPE_IS_FLOAT(src))
            return dispatch_float(src, [&](auto tag) { return dispatch_dst<FloatOf<decltype(tag)>>(dst, loop, s); });
        switch (src) {
        case AMPC_BOOL: return dispatch_dst<Bool>(dst, loop, s);
        case AMPC_INT8: return dispatch_dst<Int<int8_t>>(dst, loop, s);
        case AMPC_INT16: return dispatch_dst<Int<int16_t>>(dst, loop, s);
        case AMPC_INT32: return dispatch_dst<Int<int32_t>>(dst, loop, s);
        case AMPC_INT64: return dispatch_dst<Int<int64_t>>(dst, loop, s);
        case AMPC_UINT8: return dispatch_dst<Int<uint8_t>>(dst, loop, s);
        case AMPC_UINT16: return dispatch_dst<Int<uint16_t>>(dst, loop, s);
        case AMPC_UINT32: return dispatch_dst<Int<uint32_t>>(dst, loop, s);
        case AMPC_UINT64: return dispatch_dst<Int<uint64_t>>(dst, loop, s);
        default: return ampc_cuda_fail_msg(AMPC_ERR_INVALID, "cast: unknown dtype %d", (int)src);
        }
    });
}
