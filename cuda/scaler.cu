/*
 * scaler.cu: GradScaler's GPU kernels.
 *
 *   unscale          multi-tensor: up to TABLE tensors of any floating dtypes
 *                    in one launch, cut into CHUNK-element pieces, one block
 *                    a piece (apex's multi_tensor_apply, with the table passed
 *                    by value as a kernel parameter). Per element: inf/NaN
 *                    check on the scaled value, then v * inv_scale in float32
 *                    (float64 for float64), rounded back; 16-byte vector
 *                    accesses where the tensor is aligned. The flag is a plain
 *                    store of 1.0 by any block that saw a bad value: every
 *                    writer writes the same value, so the race is harmless.
 *                    inv_scale = float32(1 / (double)scale) is computed by
 *                    each thread from the scale in device memory: nothing
 *                    waits for the host.
 *   unscale_clip     unscale_(max_norm=): a norm pass (one float64 partial
 *                    per block, inf/NaN flagged), one block that sums the
 *                    partials in a fixed order into the norm and the factor
 *                    inv_scale * min(1, max_norm / (norm + 1e-6)), and the
 *                    unscale pass with that factor: two reads and one write
 *                    of each gradient, and still no host synchronisation.
 *                    Deferred (unscale_(defer=True)): the norm pass only, and
 *                    the divisor scale / coefficient that the optimizer's
 *                    fused step applies as its grad_scale: one read.
 *   update_scale     one thread applies scaler_rule.h to the block.
 *   scale_mul        outputs * scale for GradScaler.scale (any layout).
 *   count_nonfinite  per-tensor counts for overflow_report (on demand).
 * Strided (non-dense) gradients go through a strided kernel, one per tensor.
 * Indices are 64-bit: tensors and lists beyond 2^31 elements are fine.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "common.h"
#include "kernels/fp_formats.h"
#include "multi_tensor.cuh"
#include "kernels/scaler_rule.h"
#include "strided.cuh"
#include "kernels/grad_list.h"

/* Defined in memory.c: ampc's pool, for scratch buffers. */
extern "C" int ampc_cuda_alloc(int device, size_t nbytes, void *stream, void **ptr);
extern "C" int ampc_cuda_free(int device, void *ptr, size_t nbytes, void *stream);

namespace {

/* Elements per piece of work: a block of 512 threads does 32 (float32) or
 * 64 (16-bit) elements a thread. Small enough that the last wave of blocks
 * is short, large enough that a block's set-up is negligible. */
constexpr int64_t CHUNK = 1 << 14;
constexpr int BLOCK = 512;
/* Tensors per launch: 256 * 25 bytes of table, far inside the 32 KiB of
 * kernel parameters sm_70+ takes, and more than ResNet-50, GPT-2 or a
 * LLaMA-style model have, so one launch covers them. */
constexpr int TABLE = 256;

struct TensorTable {
    int n;
    int64_t first_chunk[TABLE + 1];  /* tensor t has chunks [first_chunk[t], first_chunk[t + 1]) */
    char *ptr[TABLE];
    int64_t numel[TABLE];
    uint8_t dtype[TABLE];
};

__device__ __forceinline__ bool nonfinite(float v) { return (__float_as_uint(v) & 0x7f800000u) == 0x7f800000u; }

/* The element at p as float32 and back, for the three 32/16-bit dtypes.
 * The dtype is a run-time value, element by element, on purpose: one
 * launch's table mixes dtypes, so dispatch.cuh's compile-time dispatch
 * (a kernel a dtype) would split a list into a launch per dtype. */
__device__ __forceinline__ float load_as_f32(const char *p, int dtype)
{
    if (dtype == AMPC_FLOAT32)
        return *reinterpret_cast<const float *>(p);
    const unsigned short h = *reinterpret_cast<const unsigned short *>(p);
    return dtype == AMPC_FLOAT16 ? __half2float(__ushort_as_half(h)) : __uint_as_float((uint32_t)h << 16);
}

__device__ __forceinline__ void store_from_f32(char *p, int dtype, float v)
{
    if (dtype == AMPC_FLOAT32)
        *reinterpret_cast<float *>(p) = v;
    else if (dtype == AMPC_FLOAT16)
        *reinterpret_cast<unsigned short *>(p) = __half_as_ushort(__float2half_rn(v));
    else
        *reinterpret_cast<unsigned short *>(p) = __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

/* One element, any dtype: check, and unless check_only, multiply. */
__device__ __forceinline__ bool unscale_element(char *p, int dtype, float inv, bool check_only)
{
    if (dtype == AMPC_FLOAT64) {
        double v = *reinterpret_cast<double *>(p);
        const bool bad = !isfinite(v);
        if (!check_only)
            *reinterpret_cast<double *>(p) = v * (double)inv;
        return bad;
    }
    const float v = load_as_f32(p, dtype);
    if (!check_only)
        store_from_f32(p, dtype, v * inv);
    return nonfinite(v);
}

/* A run of elements of one tensor, 16 bytes a thread where aligned. */
template <bool CHECK_ONLY>
__device__ bool unscale_run(char *base, int64_t begin, int64_t end, int dtype, float inv)
{
    bool bad = false;
    const int64_t size = dtype == AMPC_FLOAT64 ? 8 : dtype == AMPC_FLOAT32 ? 4 : 2;
    const int64_t per_vec = 16 / size;
    char *p = base + begin * size;
    const int64_t n = end - begin;
    int64_t i = 0;
    if (((uintptr_t)p & 15) == 0 && dtype != AMPC_FLOAT64) {
        const int64_t nvec = n / per_vec;
        uint4 *v = reinterpret_cast<uint4 *>(p);
        for (int64_t k = threadIdx.x; k < nvec; k += BLOCK) {
            uint4 w = v[k];
            if (dtype == AMPC_FLOAT32) {
                float *f = reinterpret_cast<float *>(&w);
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    bad |= nonfinite(f[j]);
                    f[j] *= inv;
                }
            }
            else {
                unsigned short *h = reinterpret_cast<unsigned short *>(&w);
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    const float f = load_as_f32(reinterpret_cast<const char *>(&h[j]), dtype);
                    bad |= nonfinite(f);
                    store_from_f32(reinterpret_cast<char *>(&h[j]), dtype, f * inv);
                }
            }
            if (!CHECK_ONLY)
                v[k] = w;
        }
        i = nvec * per_vec;
    }
    for (int64_t k = i + threadIdx.x; k < n; k += BLOCK)
        bad |= unscale_element(p + k * size, dtype, inv, CHECK_ONLY);
    return bad;
}

/* The multiplier of an unscale pass: 1 to only check, the clipping pass's
 * factor (inv_scale times the clipping coefficient) when given, else
 * inv_scale from the scale in device memory. */
__device__ __forceinline__ float multiplier(bool check_only, const ampc_scaler_block *block, const float *factor)
{
    return check_only ? 1.0f : factor ? *factor : ampc_inv_scale(block->scale);
}

/* block NULL: no flag to set (the clipping pass set it already). */
template <bool CHECK_ONLY>
__global__ void __launch_bounds__(BLOCK) unscale_kernel(const TensorTable table, ampc_scaler_block *block, int slot,
                                                        const float *factor)
{
    const Piece w = this_piece<CHUNK>(table);
    const float inv = multiplier(CHECK_ONLY, block, factor);
    const bool bad = unscale_run<CHECK_ONLY>(table.ptr[w.k], w.begin, w.end, table.dtype[w.k], inv);
    if (__syncthreads_or(bad) && threadIdx.x == 0 && block)
        block->flags[slot] = 1.0f;
}

__global__ void unscale_strided_kernel(char *base, int64_t n, int dtype, const StridedLayout layout,
                                       ampc_scaler_block *block, int slot, bool check_only, const float *factor)
{
    const float inv = multiplier(check_only, block, factor);
    bool bad = false;
    for (int64_t i = (int64_t)blockIdx.x * BLOCK + threadIdx.x; i < n; i += (int64_t)gridDim.x * BLOCK) {
        int64_t off, unused;
        strided_offsets(layout, i, off, unused);
        bad |= unscale_element(base + off, dtype, inv, check_only);
    }
    if (__syncthreads_or(bad) && threadIdx.x == 0 && block)
        block->flags[slot] = 1.0f;
}

/* ------------------------------------------------------------------------ */
/* Fused clipping: the norm of the unscaled gradients                        */
/* ------------------------------------------------------------------------ */

/* torch.nn.utils.clip_grad_norm_'s norms: sum of u^2, of |u|, of |u|^p, or
 * max |u|, over u = the unscaled gradient as unscale_ would store it (the
 * float32 product v * inv_scale; float64 for float64 gradients), summed in
 * float64. */
enum NormKind { NORM_2, NORM_1, NORM_INF, NORM_P };

template <int KIND>
__device__ __forceinline__ double norm_combine(double a, double b)
{
    if (KIND == NORM_INF)
        return a > b || a != a ? a : b;  /* NaN wins, as torch's max does */
    return a + b;
}

template <int KIND>
struct NormAcc {
    float inv;
    double p;
    double acc;
    bool bad;
    __device__ __forceinline__ void add(double u)
    {
        const double a = fabs(u);
        acc = norm_combine<KIND>(acc, KIND == NORM_2 ? u * u : KIND == NORM_P ? pow(a, p) : a);
    }
    __device__ __forceinline__ void operator()(float v)
    {
        bad |= nonfinite(v);
        add((double)(v * inv));
    }
    __device__ __forceinline__ void operator()(double v)
    {
        bad |= !isfinite(v);
        add(v * (double)inv);
    }
};

/* Elements [begin, end) of one dense tensor through f, 16 bytes a thread
 * where aligned. */
template <class F>
__device__ __forceinline__ void read_run(const char *base, int64_t begin, int64_t end, int dtype, F &f)
{
    const int64_t size = dtype == AMPC_FLOAT64 ? 8 : dtype == AMPC_FLOAT32 ? 4 : 2;
    const char *p = base + begin * size;
    const int64_t n = end - begin;
    int64_t i = 0;
    if (((uintptr_t)p & 15) == 0) {
        const int64_t per_vec = 16 / size, nvec = n / per_vec;
        const uint4 *v = reinterpret_cast<const uint4 *>(p);
        for (int64_t k = threadIdx.x; k < nvec; k += BLOCK) {
            uint4 w = v[k];
            if (dtype == AMPC_FLOAT64) {
                const double *d = reinterpret_cast<const double *>(&w);
                f(d[0]);
                f(d[1]);
            }
            else if (dtype == AMPC_FLOAT32) {
                const float *x = reinterpret_cast<const float *>(&w);
#pragma unroll
                for (int j = 0; j < 4; j++)
                    f(x[j]);
            }
            else {
                const unsigned short *h = reinterpret_cast<const unsigned short *>(&w);
#pragma unroll
                for (int j = 0; j < 8; j++)
                    f(load_as_f32(reinterpret_cast<const char *>(&h[j]), dtype));
            }
        }
        i = nvec * per_vec;
    }
    for (int64_t k = i + threadIdx.x; k < n; k += BLOCK) {
        if (dtype == AMPC_FLOAT64)
            f(*reinterpret_cast<const double *>(p + k * size));
        else
            f(load_as_f32(p + k * size, dtype));
    }
}

/* The block's combined value, in thread 0, in a fixed order (the same bits
 * on every run). */
template <int KIND, int THREADS>
__device__ __forceinline__ double block_combine(double x)
{
    __shared__ double warp_part[THREADS / 32];
    for (int offset = 16; offset > 0; offset /= 2)
        x = norm_combine<KIND>(x, __shfl_down_sync(0xffffffffu, x, offset));
    if (threadIdx.x % 32 == 0)
        warp_part[threadIdx.x / 32] = x;
    __syncthreads();
    if (threadIdx.x == 0)
        for (int w = 1; w < THREADS / 32; w++)
            x = norm_combine<KIND>(x, warp_part[w]);
    return x;
}

/* The end of a norm block: its combined partial into partials[blockIdx.x],
 * and the flag set if any thread saw an inf or NaN. */
template <int KIND>
__device__ __forceinline__ void write_partial(const NormAcc<KIND> &f, ampc_scaler_block *block, int slot,
                                              double *partials)
{
    const double acc = block_combine<KIND, BLOCK>(f.acc);
    const bool bad = __syncthreads_or(f.bad);
    if (threadIdx.x == 0) {
        partials[blockIdx.x] = acc;
        if (bad && block)
            block->flags[slot] = 1.0f;
    }
}

/* One partial norm per chunk: partials[blockIdx.x]; inf/NaN sets the flag. */
template <int KIND>
__global__ void __launch_bounds__(BLOCK) norm_kernel(const TensorTable table, ampc_scaler_block *block, int slot,
                                                     double p, double *partials)
{
    const Piece w = this_piece<CHUNK>(table);
    NormAcc<KIND> f = {block ? ampc_inv_scale(block->scale) : 1.0f, p, 0.0, false};
    read_run(table.ptr[w.k], w.begin, w.end, table.dtype[w.k], f);
    write_partial(f, block, slot, partials);
}

template <int KIND>
__global__ void __launch_bounds__(BLOCK) norm_strided_kernel(const char *base, int64_t n, int dtype,
                                                             const StridedLayout layout, ampc_scaler_block *block,
                                                             int slot, double p, double *partials)
{
    NormAcc<KIND> f = {block ? ampc_inv_scale(block->scale) : 1.0f, p, 0.0, false};
    for (int64_t i = (int64_t)blockIdx.x * BLOCK + threadIdx.x; i < n; i += (int64_t)gridDim.x * BLOCK) {
        int64_t off, unused;
        strided_offsets(layout, i, off, unused);
        if (dtype == AMPC_FLOAT64)
            f(*reinterpret_cast<const double *>(base + off));
        else
            f(load_as_f32(base + off, dtype));
    }
    write_partial(f, block, slot, partials);
}

constexpr int FACTOR_THREADS = 1024;

/* The total norm from the partials, into *norm_out, and the factor of
 * scaler_rule.h's clipping coefficient: the multiplier of the unscale pass,
 * or with `deferred` the divisor the optimizer's step applies. */
template <int KIND>
__global__ void __launch_bounds__(FACTOR_THREADS) clip_factor_kernel(const double *partials, int64_t count,
                                                                     double p, double max_norm,
                                                                     const ampc_scaler_block *block,
                                                                     float *norm_out, float *factor,
                                                                     bool deferred)
{
    double acc = 0;
    for (int64_t i = threadIdx.x; i < count; i += FACTOR_THREADS)
        acc = norm_combine<KIND>(acc, partials[i]);
    acc = block_combine<KIND, FACTOR_THREADS>(acc);
    if (threadIdx.x != 0)
        return;
    const double norm = KIND == NORM_2 ? sqrt(acc) : KIND == NORM_P ? pow(acc, 1.0 / p) : acc;
    *norm_out = (float)norm;
    const double coef = ampc_clip_coef(norm, max_norm);
    const float scale = block ? block->scale : 1.0f;
    *factor = deferred ? ampc_clip_divisor(scale, coef) : ampc_clip_multiplier(scale, coef);
}

__global__ void update_scale_kernel(ampc_scaler_block *block, int nflags, const ampc_scale_rule rule)
{
    float found = 0.0f;
    for (int i = 0; i < nflags; i++)
        found += block->flags[i];
    ampc_update_scale(block, found, &rule);
}

__global__ void scale_mul_kernel(char *dst, const char *src, int64_t n, int dst_dtype, int src_dtype,
                                 const StridedLayout layout, const float *scale)
{
    const float s = *scale;
    for (int64_t i = (int64_t)blockIdx.x * BLOCK + threadIdx.x; i < n; i += (int64_t)gridDim.x * BLOCK) {
        int64_t doff, soff;
        strided_offsets(layout, i, doff, soff);
        if (dst_dtype == AMPC_FLOAT64) {
            const double v = src_dtype == AMPC_FLOAT64 ? *reinterpret_cast<const double *>(src + soff)
                                                       : (double)load_as_f32(src + soff, src_dtype);
            *reinterpret_cast<double *>(dst + doff) = v * (double)s;
        }
        else {
            store_from_f32(dst + doff, dst_dtype, load_as_f32(src + soff, src_dtype) * s);
        }
    }
}

__global__ void count_nonfinite_kernel(char *base, int64_t n, int dtype, const StridedLayout layout, bool dense,
                                       unsigned long long *count)
{
    const int64_t size = dtype == AMPC_FLOAT64 ? 8 : dtype == AMPC_FLOAT32 ? 4 : 2;
    unsigned long long mine = 0;
    for (int64_t i = (int64_t)blockIdx.x * BLOCK + threadIdx.x; i < n; i += (int64_t)gridDim.x * BLOCK) {
        int64_t off = i * size, unused;
        if (!dense)
            strided_offsets(layout, i, off, unused);
        mine += dtype == AMPC_FLOAT64 ? !isfinite(*reinterpret_cast<double *>(base + off))
                                      : nonfinite(load_as_f32(base + off, dtype));
    }
    if (mine)
        atomicAdd(count, mine);
}

int zero_flag(ampc_scaler_block *block, int slot, cudaStream_t stream)
{
    AMPC_CUDA_TRY(cudaMemsetAsync(&block->flags[slot], 0, sizeof(float), stream), "clearing found_inf");
    return AMPC_OK;
}

/* Walk a gradient list: dense gradients fill tables, each launched through
 * dense(table, chunks) when full and at the end; strided ones go one by one
 * through strided(grad), in their turn (the norm pass's partials keep the
 * list's order). Empty gradients are left out. */
template <class Dense, class Strided>
int for_each_launch(const ampc_grad_ref *grads, int64_t n, Dense dense, Strided strided)
{
    TensorTable table;
    return pack_and_launch<CHUNK>(
        table, n,
        [&](int64_t i, TensorTable &t, int k) {
            const ampc_grad_ref &g = grads[i];
            if (g.numel == 0)
                return Entry::left_out();
            if (g.loop != NULL)
                return Entry::left_out(strided(g));
            t.ptr[k] = g.data;
            t.dtype[k] = (uint8_t)g.dtype;
            return Entry::packed(g.numel);
        },
        dense);
}

/* The unscale pass over a list: inv_scale from the block, or `factor`. */
int unscale_pass(const ampc_grad_ref *grads, int64_t n, ampc_scaler_block *block, int slot, bool check_only,
                 const float *factor, cudaStream_t s)
{
    return for_each_launch(
        grads, n,
        [&](const TensorTable &table, int64_t chunks) {
            if (check_only)
                unscale_kernel<true><<<(unsigned)chunks, BLOCK, 0, s>>>(table, block, slot, factor);
            else
                unscale_kernel<false><<<(unsigned)chunks, BLOCK, 0, s>>>(table, block, slot, factor);
            return ampc_cuda_launched("launching the unscale kernel");
        },
        [&](const ampc_grad_ref &g) {
            unscale_strided_kernel<<<strided_blocks(g.numel, BLOCK), BLOCK, 0, s>>>(
                g.loop->data[0], g.numel, g.dtype, strided_layout(g.loop), block, slot, check_only, factor);
            return ampc_cuda_launched("launching the strided unscale kernel");
        });
}

/* The norm pass, a partial per block into partials (NULL: only count them
 * into *count). */
template <int KIND>
int norm_pass(const ampc_grad_ref *grads, int64_t n, ampc_scaler_block *block, int slot, double p,
              double *partials, int64_t *count, cudaStream_t s)
{
    *count = 0;
    return for_each_launch(
        grads, n,
        [&](const TensorTable &table, int64_t chunks) {
            if (partials != NULL)
                norm_kernel<KIND><<<(unsigned)chunks, BLOCK, 0, s>>>(table, block, slot, p, partials + *count);
            *count += chunks;
            return partials != NULL ? ampc_cuda_launched("launching the norm kernel") : AMPC_OK;
        },
        [&](const ampc_grad_ref &g) {
            const unsigned blocks = strided_blocks(g.numel, BLOCK);
            if (partials != NULL)
                norm_strided_kernel<KIND><<<blocks, BLOCK, 0, s>>>(g.loop->data[0], g.numel, g.dtype,
                                                                   strided_layout(g.loop), block, slot, p,
                                                                   partials + *count);
            *count += blocks;
            return partials != NULL ? ampc_cuda_launched("launching the strided norm kernel") : AMPC_OK;
        });
}

/* divisor_out NULL: the norm pass, then the unscale pass with the
 * multiplier. Otherwise the norm pass only, and the divisor for the step. */
template <int KIND>
int unscale_clip(int device, cudaStream_t s, const ampc_grad_ref *grads, int64_t n, ampc_scaler_block *block,
                 int slot, double max_norm, double p, float *norm_out, float *divisor_out)
{
    int64_t count;
    norm_pass<KIND>(grads, n, block, slot, p, NULL, &count, s);
    /* The partials, then the factor, in one scratch allocation. */
    const size_t nbytes = (size_t)(count > 0 ? count : 1) * sizeof(double) + sizeof(double);
    double *scratch = NULL;
    int status = ampc_cuda_alloc(device, nbytes, s, (void **)&scratch);
    if (status != AMPC_OK)
        return status;
    float *factor = reinterpret_cast<float *>(scratch + (count > 0 ? count : 1));
    if (block)
        status = zero_flag(block, slot, s);
    if (status == AMPC_OK)
        status = norm_pass<KIND>(grads, n, block, slot, p, scratch, &count, s);
    if (status == AMPC_OK) {
        const bool deferred = divisor_out != NULL;
        clip_factor_kernel<KIND><<<1, FACTOR_THREADS, 0, s>>>(scratch, count, p, max_norm, block, norm_out,
                                                              deferred ? divisor_out : factor, deferred);
        status = ampc_cuda_launched("launching the clipping kernel");
    }
    if (status == AMPC_OK && divisor_out == NULL)
        status = unscale_pass(grads, n, NULL, 0, false, factor, s);
    const int freed = ampc_cuda_free(device, scratch, nbytes, s);
    return status != AMPC_OK ? status : freed;
}

}  // namespace

extern "C" int ampc_cuda_unscale(int device, void *stream, const ampc_grad_ref *grads, int64_t n,
                                 ampc_scaler_block *block, int slot, int check_only)
{
    cudaStream_t s = (cudaStream_t)stream;
    return ampc_on_device(device, [&] {
        const int status = zero_flag(block, slot, s);
        return status != AMPC_OK ? status : unscale_pass(grads, n, block, slot, check_only != 0, NULL, s);
    });
}

extern "C" int ampc_cuda_unscale_clip(int device, void *stream, const ampc_grad_ref *grads, int64_t n,
                                      ampc_scaler_block *block, int slot, double max_norm, double norm_type,
                                      float *norm_out, float *divisor_out)
{
    cudaStream_t s = (cudaStream_t)stream;
    return ampc_on_device(device, [&] {
        if (norm_type == 2.0)
            return unscale_clip<NORM_2>(device, s, grads, n, block, slot, max_norm, norm_type, norm_out, divisor_out);
        if (norm_type == 1.0)
            return unscale_clip<NORM_1>(device, s, grads, n, block, slot, max_norm, norm_type, norm_out, divisor_out);
        if (isinf(norm_type))
            return unscale_clip<NORM_INF>(device, s, grads, n, block, slot, max_norm, norm_type, norm_out,
                                          divisor_out);
        return unscale_clip<NORM_P>(device, s, grads, n, block, slot, max_norm, norm_type, norm_out, divisor_out);
    });
}

extern "C" int ampc_cuda_update_scale(int device, void *stream, ampc_scaler_block *block, int nflags,
                                      const ampc_scale_rule *rule)
{
    return ampc_on_device(device, [&] {
        update_scale_kernel<<<1, 1, 0, (cudaStream_t)stream>>>(block, nflags, *rule);
        return ampc_cuda_launched("launching the update kernel");
    });
}

extern "C" int ampc_cuda_scale_mul(int device, void *stream, const ampc_loop *loop, ampc_dtype dst, ampc_dtype src,
                                   const float *scale)
{
    if (loop->numel == 0)
        return AMPC_OK;
    return ampc_on_device(device, [&] {
        scale_mul_kernel<<<strided_blocks(loop->numel, BLOCK), BLOCK, 0, (cudaStream_t)stream>>>(
            loop->data[0], loop->data[1], loop->numel, dst, src, strided_layout(loop), scale);
        return ampc_cuda_launched("launching the scale kernel");
    });
}

extern "C" int ampc_cuda_count_nonfinite(int device, void *stream, const ampc_grad_ref *grads, int64_t n,
                                         int64_t *counts)
{
    if (n == 0)
        return AMPC_OK;
    return ampc_on_device(device, [&] {
        cudaStream_t s = (cudaStream_t)stream;
        const size_t nbytes = (size_t)n * sizeof(unsigned long long);
        unsigned long long *dev_counts = NULL;
        int status = ampc_cuda_alloc(device, nbytes, stream, (void **)&dev_counts);
        if (status == AMPC_OK) {
            cudaError_t err = cudaMemsetAsync(dev_counts, 0, nbytes, s);
            for (int64_t i = 0; err == cudaSuccess && i < n; i++) {
                const ampc_grad_ref *g = &grads[i];
                if (g->numel == 0)
                    continue;
                StridedLayout layout;
                layout.ndim = 0;
                if (g->loop)
                    layout = strided_layout(g->loop);
                count_nonfinite_kernel<<<strided_blocks(g->numel, BLOCK), BLOCK, 0, s>>>(
                    g->loop ? g->loop->data[0] : g->data, g->numel, g->dtype, layout, g->loop == NULL, &dev_counts[i]);
                err = cudaGetLastError();
            }
            if (err == cudaSuccess)
                err = cudaMemcpyAsync(counts, dev_counts, nbytes, cudaMemcpyDeviceToHost, s);
            if (err == cudaSuccess)
                err = cudaStreamSynchronize(s);
            if (err != cudaSuccess)
                status = ampc_cuda_fail(err, "counting inf and NaN");
            ampc_cuda_free(device, dev_counts, nbytes, stream);
        }
        return status;
    });
}
