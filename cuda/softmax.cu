/*
 * softmax.cu: softmax and log_softmax along one dimension, and their
 * backward passes, over (outer, n, inner) rows (ops.cuh's row groups).
 *
 * Forward: one pass keeps a running maximum and the sum of exp(x - max)
 * rescaled as the maximum grows (the online softmax, ops.cuh's
 * row_max_sum), the group combines its lanes, and a second pass writes the
 * outputs: two reads (the second mostly from cache), one write.
 * A row of -inf gives NaN and a NaN anywhere makes its row NaN, as torch's
 * and the CPU kernel's do.
 *
 * Contiguous rows of one storage type take packs.cuh's paths: a row that
 * fits a lane's registers is read once (softmax_cached: max, sum, write,
 * all from registers); a longer one is streamed in 16-byte packs
 * (softmax_streamed: the online sum with one exponential per element, then
 * the writes), its second pass from shared memory where the row fits half
 * an SM's (softmax_smem, the forward), from memory again where not.
 * Anything else (strided rows, float64, an output dtype other than the
 * input's) takes the generic kernels.
 */
#include "softmax_kernels.cuh"

namespace {

/* The bytes of shared memory softmax_smem takes for rows of n elements of
 * T, or 0 where a row does not fit half the SM's (two blocks an SM, each
 * with its 1 KB the runtime reserves and its scratch). */
template <class T>
static int smem_row_bytes(int64_t n)
{
    int device = 0, per_sm = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device) != cudaSuccess)
        return 0;
    const int64_t bytes = (n / vec_of<T>() + 1) * 16, room = per_sm / 2 - 2048;
    return bytes <= room ? (int)bytes : 0;
}

/* float32 scores rounded to 16-bit probabilities (attention's), rows a
 * cached tier holds: softmax_cached<float> writes the 16-bit output. */
int softmax_rounding_fast(const ampc_softmax *s, cudaStream_t stream)
{
    if (s->x.dtype != AMPC_FLOAT32 || (s->y.dtype != AMPC_FLOAT16 && s->y.dtype != AMPC_BFLOAT16) ||
        s->rows.inner != 1 || !packs_fit(AMPC_FLOAT32, s->rows.n, s->x.data, s->y.data))
        return NOT_FAST;
    const int tier = cached_tier(s->rows.n, vec_of<float>());
    if (tier < 0)
        return NOT_FAST;
    AMPC_LAUNCH_CACHED(softmax_cached, float, tier, tier_grid(s->rows.outer, tier), stream, *s);
    return ampc_cuda_launched("softmax kernel");
}

int softmax_fast(const ampc_softmax *s, cudaStream_t stream)
{
    if (s->x.dtype != s->y.dtype)
        return softmax_rounding_fast(s, stream);
    const void *ptrs[2] = {s->x.data, s->y.data};
    return with_storage(s->x.dtype, [&](auto type) {
        using T = decltype(type);
        const bool registers = packs_fit(s->x.dtype, s->rows.n, s->x.data, s->y.data) &&
                               cached_tier(s->rows.n, vec_of<T>()) >= 0;
        const int bytes = s->rows.inner == 1 && s->x.dtype != AMPC_FLOAT64 && !registers &&
                                  s->rows.n >= STREAM_BLOCK_FROM && same_phase(s->x.data, s->y.data)
                              ? smem_row_bytes<T>(s->rows.n)
                              : 0;
        if (bytes > 0) {
            AMPC_CUDA_TRY(cudaFuncSetAttribute(softmax_smem<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
                          "cudaFuncSetAttribute (softmax's shared memory)");
            softmax_smem<T><<<rows_grid(s->rows.outer, BLOCK), BLOCK, bytes, stream>>>(*s);
            return ampc_cuda_launched("softmax kernel");
        }
        return AMPC_FAST_ROWS(softmax_cached, softmax_streamed, T, s->rows, s->x.dtype, ptrs, 2, stream,
                              "softmax kernel", *s);
    });
}

int softmax_backward_fast(const ampc_softmax_backward *s, cudaStream_t stream)
{
    if (s->dx.dtype != s->dy.dtype || s->y.dtype != s->dy.dtype)
        return NOT_FAST;
    const void *ptrs[3] = {s->dy.data, s->y.data, s->dx.data};
    return with_storage(s->dy.dtype, [&](auto type) {
        using T = decltype(type);
        return AMPC_FAST_ROWS(softmax_backward_cached, softmax_backward_streamed, T, s->rows, s->dy.dtype, ptrs, 3,
                              stream, "softmax backward kernel", *s);
    });
}

}  // namespace

extern "C" int ampc_cuda_softmax(int device, void *stream, const ampc_softmax *s)
{
    if (s->rows.outer * s->rows.n * s->rows.inner == 0)
        return AMPC_OK;
    return ampc_on_device(device, [&] {
        const int fast = softmax_fast(s, as_stream(stream));
        if (fast != NOT_FAST)
            return fast;
        const RowLaunch L = row_launch(s->rows);
        if (s->x.dtype == AMPC_FLOAT64)
            AMPC_LAUNCH_ROWS(softmax_kernel, double, L, as_stream(stream), *s);
        else
            AMPC_LAUNCH_ROWS(softmax_kernel, float, L, as_stream(stream), *s);
        return ampc_cuda_launched("softmax kernel");
    });
}

extern "C" int ampc_cuda_softmax_backward(int device, void *stream, const ampc_softmax_backward *s)
{
    if (s->rows.outer * s->rows.n * s->rows.inner == 0)
        return AMPC_OK;
    return ampc_on_device(device, [&] {
        const int fast = softmax_backward_fast(s, as_stream(stream));
        if (fast != NOT_FAST)
            return fast;
        const RowLaunch L = row_launch(s->rows);
        if (s->y.dtype == AMPC_FLOAT64)
            AMPC_LAUNCH_ROWS(softmax_backward_kernel, double, L, as_stream(stream), *s);
        else
            AMPC_LAUNCH_ROWS(softmax_backward_kernel, float, L, as_stream(stream), *s);
        return ampc_cuda_launched("softmax backward kernel");
    });
}
