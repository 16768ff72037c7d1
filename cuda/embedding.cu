/*
 * embedding.cu: embedding's gather and its backward pass (op_descriptors.h).
 *
 * Forward: a thread per output element; an index outside [0, num) gives
 * its row NaN (checking would mean waiting for the device).
 * Backward: deterministic, without atomics on floats. The positions are
 * sorted by index (CUB's radix sort, stable, so ascending positions within
 * an index), then a warp per run of equal indices sums its rows of dy in
 * that order, in the accumulation dtype, rounding once into dweight; rows
 * no index names get zeros. The CPU (embedding_cpu.c) sums in the same
 * order, so the two give the same bits.
 */
#include <cub/device/device_radix_sort.cuh>

#include "ops.cuh"

namespace {

using namespace ops;

template <class Acc>
__global__ void embedding_kernel(ampc_embedding e)
{
    const int64_t total = e.count * e.dim;
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += (int64_t)gridDim.x * blockDim.x) {
        const int64_t i = t / e.dim, c = t % e.dim;
        const int64_t r = load_index(e.indices, i);
        store(e.out, t, r >= 0 && r < e.num ? load<Acc>(e.weight, r * e.dim + c) : (Acc)NAN);
    }
}

/* Sort keys: the row, or num (sorted last, skipped) for an index that gets
 * nothing (out of range, padding_idx). Values: the positions. */
__global__ void embedding_keys(ampc_embedding_backward e, int32_t *keys, int32_t *positions)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < e.count; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = load_index(e.indices, i);
        keys[i] = (int32_t)(r >= 0 && r < e.num && r != e.padding_idx ? r : e.num);
        positions[i] = (int32_t)i;
    }
}

constexpr int EMB_COLS = 4;  /* columns a lane adds at once */

/* A warp per sorted position that starts a run of equal keys: the run's
 * rows of dy summed in position order, 32 * EMB_COLS columns at a time. */
template <class Acc>
__global__ void embedding_runs(ampc_embedding_backward e, const int32_t *keys, const int32_t *positions)
{
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x / 32);
    const int lane = threadIdx.x % 32;
    for (int64_t s = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; s < e.count; s += warps) {
        const int32_t key = keys[s];
        if (key == e.num || (s > 0 && keys[s - 1] == key))
            continue;
        int64_t end = s + 1;
        while (end < e.count && keys[end] == key)
            end++;
        for (int64_t c0 = 0; c0 < e.dim; c0 += 32 * EMB_COLS) {
            Acc acc[EMB_COLS];
            for (int u = 0; u < EMB_COLS; u++)
                acc[u] = 0;
            for (int64_t k = s; k < end; k++) {
                const int64_t row = (int64_t)positions[k] * e.dim;
#pragma unroll
                for (int u = 0; u < EMB_COLS; u++) {
                    const int64_t c = c0 + u * 32 + lane;
                    if (c < e.dim)
                        acc[u] += load<Acc>(e.dy, row + c);
                }
            }
#pragma unroll
            for (int u = 0; u < EMB_COLS; u++) {
                const int64_t c = c0 + u * 32 + lane;
                if (c < e.dim)
                    store(e.dweight, (int64_t)key * e.dim + c, acc[u]);
            }
        }
    }
}

static int key_bits(int64_t num)
{
    int bits = 1;
    while (bits < 31 && ((int64_t)1 << bits) <= num)
        bits++;
    return bits;
}

template <class Acc>
int embedding_backward(int device, void *stream, const ampc_embedding_backward *e)
{
    const size_t bytes = (size_t)(e->num * e->dim) * ampc_dtype_size(e->dweight.dtype);
    AMPC_CUDA_TRY(cudaMemsetAsync(e->dweight.data, 0, bytes, as_stream(stream)), "clearing the embedding gradient");
    if (e->count == 0)
        return AMPC_OK;
    const int n = (int)e->count;
    size_t sort_bytes = 0;
    AMPC_CUDA_TRY(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, (const int32_t *)nullptr, (int32_t *)nullptr,
                                                  (const int32_t *)nullptr, (int32_t *)nullptr, n, 0,
                                                  key_bits(e->num), as_stream(stream)),
                  "sizing the embedding gradient's sort");
    /* keys and positions, in and out, then CUB's scratch */
    const size_t lists = 4 * (size_t)n * sizeof(int32_t);
    Scratch scratch(device, stream);
    const int got = scratch.get(lists + sort_bytes);
    if (got != AMPC_OK)
        return got;
    int32_t *keys = static_cast<int32_t *>(scratch.ptr), *positions = keys + n, *sorted_keys = positions + n,
            *sorted_positions = sorted_keys + n;
    embedding_keys<<<grid_for(n, 256), 256, 0, as_stream(stream)>>>(*e, keys, positions);
    int status = ampc_cuda_launched("embedding gradient keys");
    if (status != AMPC_OK)
        return status;
    AMPC_CUDA_TRY(cub::DeviceRadixSort::SortPairs(static_cast<char *>(scratch.ptr) + lists, sort_bytes, keys,
                                                  sorted_keys, positions, sorted_positions, n, 0, key_bits(e->num),
                                                  as_stream(stream)),
                  "sorting the embedding gradient's positions");
    embedding_runs<Acc><<<grid_for((int64_t)n * 32, 256), 256, 0, as_stream(stream)>>>(*e, sorted_keys,
                                                                                        sorted_positions);
    return ampc_cuda_launched("embedding gradient kernel");
}

}  // namespace

extern "C" int ampc_cuda_embedding(int device, void *stream, const ampc_embedding *e)
{
    if (e->count * e->dim == 0)
        return AMPC_OK;
    return ampc_on_device(device, [&] {
        const unsigned grid = grid_for(e->count * e->dim, 256);
        if (e->weight.dtype == AMPC_FLOAT64)
            embedding_kernel<double><<<grid, 256, 0, as_stream(stream)>>>(*e);
        else
            embedding_kernel<float><<<grid, 256, 0, as_stream(stream)>>>(*e);
        return ampc_cuda_launched("embedding kernel");
    });
}

extern "C" int ampc_cuda_embedding_backward(int device, void *stream, const ampc_embedding_backward *e)
{
    if (e->num * e->dim == 0)
        return AMPC_OK;
    if (e->count > INT32_MAX || e->num >= INT32_MAX)
        return ampc_cuda_fail_msg(AMPC_ERR_INVALID, "embedding_backward: %lld positions into %lld rows are more "
                                  "than the GPU kernel takes (2^31 - 1)", (long long)e->count, (long long)e->num);
    return ampc_on_device(device, [&] {
        return e->dy.dtype == AMPC_FLOAT64 ? embedding_backward<double>(device, stream, e)
                                           : embedding_backward<float>(device, stream, e);
    });
}
