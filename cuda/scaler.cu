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
#include "fp_formats.h"
#include "scaler_rule.h"
#include "strided.cuh"
#include "unscale.h"

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

/* The element at p as float32 and back, for the three 32/16-bit dtypes. */
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

template <bool CHECK_ONLY>
__global__ void __launch_bounds__(BLOCK) unscale_kernel(const TensorTable table, ampc_scaler_block *block, int slot)
{
    /* The tensor this block's chunk belongs to (binary search of the table). */
    const int64_t chunk = blockIdx.x;
    int lo = 0, hi = table.n - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (table.first_chunk[mid] <= chunk)
            lo = mid;
        else
            hi = mid - 1;
    }
    const int64_t begin = (chunk - table.first_chunk[lo]) * CHUNK;
    const int64_t end = begin + CHUNK < table.numel[lo] ? begin + CHUNK : table.numel[lo];
    const float inv = CHECK_ONLY ? 1.0f : ampc_inv_scale(block->scale);
    const bool bad = unscale_run<CHECK_ONLY>(table.ptr[lo], begin, end, table.dtype[lo], inv);
    if (__syncthreads_or(bad) && threadIdx.x == 0)
        block->flags[slot] = 1.0f;
}

__global__ void unscale_strided_kernel(char *base, int64_t n, int dtype, const StridedLayout layout,
                                       ampc_scaler_block *block, int slot, bool check_only)
{
    const float inv = check_only ? 1.0f : ampc_inv_scale(block->scale);
    bool bad = false;
    for (int64_t i = (int64_t)blockIdx.x * BLOCK + threadIdx.x; i < n; i += (int64_t)gridDim.x * BLOCK) {
        int64_t off, unused;
        strided_offsets(layout, i, off, unused);
        bad |= unscale_element(base + off, dtype, inv, check_only);
    }
    if (__syncthreads_or(bad) && threadIdx.x == 0)
        block->flags[slot] = 1.0f;
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

}  // namespace

extern "C" int ampc_cuda_unscale(int device, void *stream, const ampc_grad_ref *grads, int64_t n,
                                 ampc_scaler_block *block, int slot, int check_only)
{
    ampc_device_guard guard;
    int status = ampc_device_enter(device, &guard);
    if (status != AMPC_OK)
        return status;
    cudaStream_t s = (cudaStream_t)stream;
    status = zero_flag(block, slot, s);
    TensorTable table;
    table.n = 0;
    table.first_chunk[0] = 0;
    /* Dense tensors fill tables; a table is launched when full and at the end. */
    for (int64_t i = 0; status == AMPC_OK && i <= n; i++) {
        const bool last = i == n;
        if (!last && grads[i].numel == 0)
            continue;
        if (!last && grads[i].loop != NULL) {
            const ampc_grad_ref *g = &grads[i];
            unscale_strided_kernel<<<strided_blocks(g->numel, BLOCK), BLOCK, 0, s>>>(
                g->loop->data[0], g->numel, g->dtype, strided_layout(g->loop), block, slot, check_only != 0);
            const cudaError_t err = cudaGetLastError();
            if (err != cudaSuccess)
                status = ampc_cuda_fail(err, "launching the strided unscale kernel");
            continue;
        }
        if (!last) {
            const int t = table.n++;
            table.ptr[t] = grads[i].data;
            table.numel[t] = grads[i].numel;
            table.dtype[t] = (uint8_t)grads[i].dtype;
            table.first_chunk[t + 1] = table.first_chunk[t] + (grads[i].numel + CHUNK - 1) / CHUNK;
        }
        if (table.n > 0 && (last || table.n == TABLE)) {
            const int64_t chunks = table.first_chunk[table.n];
            if (check_only)
                unscale_kernel<true><<<(unsigned)chunks, BLOCK, 0, s>>>(table, block, slot);
            else
                unscale_kernel<false><<<(unsigned)chunks, BLOCK, 0, s>>>(table, block, slot);
            const cudaError_t err = cudaGetLastError();
            if (err != cudaSuccess)
                status = ampc_cuda_fail(err, "launching the unscale kernel");
            table.n = 0;
        }
    }
    ampc_device_leave(&guard);
    return status;
}

extern "C" int ampc_cuda_update_scale(int device, void *stream, ampc_scaler_block *block, int nflags,
                                      const ampc_scale_rule *rule)
{
    ampc_device_guard guard;
    int status = ampc_device_enter(device, &guard);
    if (status != AMPC_OK)
        return status;
    update_scale_kernel<<<1, 1, 0, (cudaStream_t)stream>>>(block, nflags, *rule);
    const cudaError_t err = cudaGetLastError();
    ampc_device_leave(&guard);
    return err == cudaSuccess ? AMPC_OK : ampc_cuda_fail(err, "launching the update kernel");
}

extern "C" int ampc_cuda_scale_mul(int device, void *stream, const ampc_loop *loop, ampc_dtype dst, ampc_dtype src,
                                   const float *scale)
{
    if (loop->numel == 0)
        return AMPC_OK;
    ampc_device_guard guard;
    int status = ampc_device_enter(device, &guard);
    if (status != AMPC_OK)
        return status;
    scale_mul_kernel<<<strided_blocks(loop->numel, BLOCK), BLOCK, 0, (cudaStream_t)stream>>>(
        loop->data[0], loop->data[1], loop->numel, dst, src, strided_layout(loop), scale);
    const cudaError_t err = cudaGetLastError();
    ampc_device_leave(&guard);
    return err == cudaSuccess ? AMPC_OK : ampc_cuda_fail(err, "launching the scale kernel");
}

extern "C" int ampc_cuda_count_nonfinite(int device, void *stream, const ampc_grad_ref *grads, int64_t n,
                                         int64_t *counts)
{
    if (n == 0)
        return AMPC_OK;
    ampc_device_guard guard;
    int status = ampc_device_enter(device, &guard);
    if (status != AMPC_OK)
        return status;
    cudaStream_t s = (cudaStream_t)stream;
    const size_t nbytes = (size_t)n * sizeof(unsigned long long);
    unsigned long long *dev_counts = NULL;
    status = ampc_cuda_alloc(device, nbytes, stream, (void **)&dev_counts);
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
    ampc_device_leave(&guard);
    return status;
}
