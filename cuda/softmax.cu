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
#include "packs.cuh"

namespace {

using namespace ops;

template <int G, class Acc>
__global__ void __launch_bounds__(BLOCK) softmax_kernel(ampc_softmax s)
{
    typedef RowGroup<G> Group;
    __shared__ Acc scratch[BLOCK / 32];
    const int64_t rows = s.rows.outer * s.rows.inner, n = s.rows.n, stride = s.rows.inner;
    for (int64_t pos = Group::first(); pos < rows; pos += Group::step()) {
        const int64_t base = row_base(s.rows, pos), live = ampc_softmax_live(&s, pos);
        Acc M, S;
        row_max_sum<G, Acc>(s.x, base, live, stride, M, S, scratch);
        if (s.log) {
            const Acc shift = M + m_log(S);
            row_each<G, Acc>(s.x, base, n, stride, [&](int64_t j, Acc v) {
                store(s.y, base + j * stride, j < live ? v - shift : (Acc)-INFINITY);
            });
        }
        else {
            const Acc inv = (Acc)1 / S;
            row_each<G, Acc>(s.x, base, n, stride, [&](int64_t j, Acc v) {
                store(s.y, base + j * stride, j < live ? m_exp(v - M) * inv : (Acc)0);
            });
        }
    }
}

/* softmax: dx = y * (dy - sum(dy * y)); log_softmax: dx = dy - exp(y) * sum(dy). */
template <int G, class Acc>
__global__ void __launch_bounds__(BLOCK) softmax_backward_kernel(ampc_softmax_backward s)
{
    typedef RowGroup<G> Group;
    __shared__ Acc scratch[BLOCK / 32];
    const int64_t rows = s.rows.outer * s.rows.inner, n = s.rows.n, stride = s.rows.inner;
    for (int64_t pos = Group::first(); pos < rows; pos += Group::step()) {
        const int64_t base = row_base(s.rows, pos);
        Acc t = 0;
        if (s.log)
            row_each<G, Acc>(s.dy, base, n, stride, [&](int64_t, Acc dy) { t += dy; });
        else
            row_each2<G, Acc>(s.dy, s.y, base, n, stride, [&](int64_t, Acc dy, Acc y) { t += dy * y; });
        t = Group::sum(t, scratch);
        row_each2<G, Acc>(s.dy, s.y, base, n, stride, [&](int64_t j, Acc dy, Acc y) {
            store(s.dx, base + j * stride, s.log ? dy - m_exp(y) * t : y * (dy - t));
        });
    }
}

template <class T, int G, int NV>
__global__ void __launch_bounds__(BLOCK) softmax_cached(ampc_softmax s)
{
    typedef RowGroup<G> Group;
    __shared__ float scratch[BLOCK / 32];
    const int64_t n = s.rows.n, rows = s.rows.outer;
    const int lane = Group::lane();
    for (int64_t first = Group::block_first(); first < rows; first += Group::step()) {
        const int64_t row = first + Group::in_block(), packs = row < rows ? n / vec_of<T>() : 0;
        const int64_t live = ampc_softmax_live(&s, row);
        CachedRow<T, G, NV> x;
        x.load(static_cast<const T *>(s.x.data) + row * n, packs, lane, live);
        float m = -INFINITY;
        x.each(packs, lane, [&](int64_t, float v) { m = nan_max(m, v); }, live);
        const float M = Group::max(m, scratch);
        float e = 0.0f;
        x.each(packs, lane, [&](int64_t, float v) { e += m_exp(v - M); }, live);
        const float S = Group::sum(e, scratch);
        auto write = [&](auto *y) {
            if (s.log) {
                const float shift = M + m_log(S);
                cached_map(x, x, y + row * n, packs, lane, [&](int64_t, float v, float) { return v - shift; }, live,
                           -INFINITY);
            }
            else {
                const float inv = 1.0f / S;
                cached_map(x, x, y + row * n, packs, lane, [&](int64_t, float v, float) { return m_exp(v - M) * inv; },
                           live);
            }
        };
        if constexpr (std::is_same<T, float>::value) {  /* float32 scores to 16-bit probabilities */
            if (s.y.dtype == AMPC_FLOAT16) {
                write(static_cast<__half *>(s.y.data));
                continue;
            }
            if (s.y.dtype == AMPC_BFLOAT16) {
                write(static_cast<__nv_bfloat16 *>(s.y.data));
                continue;
            }
        }
        write(static_cast<T *>(s.y.data));
    }
}

/* The streamed kernels' first pass: the row's maximum M and sum S of
 * exp(x - M) over its live elements, online; keep (stream_reduce's) sees
 * each whole pack as it is read. */
template <class T, int G, class Keep = KeepNothing>
__device__ __forceinline__ void streamed_max_sum(const T *x, int64_t live, int lane, float *scratch, float &M,
                                                 float &S, Keep keep = Keep())
{
    float m = -INFINITY, e = 0.0f;
    stream_reduce<T, G>(
        x, nullptr, live, lane,
        [&](int64_t, const float *v, const float *, auto count) { online_add_segment<decltype(count)::value>(m, e, v); },
        keep);
    combine_max_sum<G>(m, e, M, S, scratch);
}

template <class T, int G>
__global__ void __launch_bounds__(BLOCK) softmax_streamed(ampc_softmax s)
{
    typedef RowGroup<G> Group;
    __shared__ float scratch[BLOCK / 32];
    const int64_t n = s.rows.n;
    const int lane = Group::lane();
    for (int64_t row = Group::first(); row < s.rows.outer; row += Group::step()) {
        const T *x = static_cast<const T *>(s.x.data) + row * n;
        const int64_t live = ampc_softmax_live(&s, row);
        float M, S;
        streamed_max_sum<T, G>(x, live, lane, scratch, M, S);
        T *y = static_cast<T *>(s.y.data) + row * n;
        if (s.log) {
            const float shift = M + m_log(S);
            stream_map<T, G>(x, nullptr, y, n, lane, [&](int64_t, float v, float) { return v - shift; }, live,
                             -INFINITY);
        }
        else {
            const float inv = 1.0f / S;
            stream_map<T, G>(x, nullptr, y, n, lane, [&](int64_t, float v, float) { return m_exp(v - M) * inv; },
                             live);
        }
    }
}

/* softmax_streamed for rows that fit half an SM's shared memory, a block a
 * row: the first pass keeps there each whole pack it reads (pack p at
 * cache[p]: a lane keeps and rereads only its own packs, so no barrier
 * guards them), and the second reads them back instead of reading the row
 * again. The same segments, sums and formulas: the same bits as
 * softmax_streamed. Streamed, a 100 KB row (GPT-2's 50257 logits in 16 bits)
 * missed the L2 on its second read, with 53 MB of rows in flight. */
template <class T>
__global__ void __launch_bounds__(BLOCK, 2) softmax_smem(ampc_softmax s)
{
    typedef RowGroup<BLOCK> Group;
    constexpr int VEC = vec_of<T>();
    extern __shared__ uint4 cache[];
    __shared__ float scratch[BLOCK / 32];
    const int64_t n = s.rows.n;
    const int lane = Group::lane();
    for (int64_t row = Group::first(); row < s.rows.outer; row += Group::step()) {
        const T *x = static_cast<const T *>(s.x.data) + row * n;
        const int64_t live = ampc_softmax_live(&s, row);
        float M, S;
        streamed_max_sum<T, BLOCK>(x, live, lane, scratch, M, S, [&](int64_t p, const uint4 &raw) { cache[p] = raw; });
        const float shift = M + m_log(S), inv = 1.0f / S, dead = s.log ? -INFINITY : 0.0f;
        auto out = [&](int64_t j, float v) { return j < live ? (s.log ? v - shift : m_exp(v - M) * inv) : dead; };
        /* stream_map's writes: the kept packs are those wholly before live
         * (none where live ends before the first boundary) */
        T *y = static_cast<T *>(s.y.data) + row * n;
        const int64_t head = head_of(x, n), packs = (n - head) / VEC, tail = head + packs * VEC;
        const int64_t kept = live >= head ? (live - head) / VEC : 0;
        if (lane < head)
            y[lane] = from_float<T>(out(lane, lane < live ? to_float(x[lane]) : 0.0f));
        for (int64_t p = lane; p < packs; p += BLOCK) {
            const int64_t j0 = head + p * VEC;
            Pack<T> v, o;
            if (p < kept)
                v.raw = cache[p];
            else if (j0 < live)
                v.load(x + j0);  /* the pack live ends in */
            else
                v.raw = make_uint4(0, 0, 0, 0);
#pragma unroll
            for (int i = 0; i < VEC; i++)
                o.set(i, out(j0 + i, v[i]));
            o.store(y + j0);
        }
        if (tail + lane < n)
            y[tail + lane] = from_float<T>(out(tail + lane, tail + lane < live ? to_float(x[tail + lane]) : 0.0f));
    }
}

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

template <class T, int G, int NV>
__global__ void __launch_bounds__(BLOCK) softmax_backward_cached(ampc_softmax_backward s)
{
    typedef RowGroup<G> Group;
    __shared__ float scratch[BLOCK / 32];
    const int64_t n = s.rows.n, rows = s.rows.outer;
    const int lane = Group::lane();
    for (int64_t first = Group::block_first(); first < rows; first += Group::step()) {
        const int64_t row = first + Group::in_block(), packs = row < rows ? n / vec_of<T>() : 0;
        CachedRow<T, G, NV> dy, y;
        dy.load(static_cast<const T *>(s.dy.data) + row * n, packs, lane);
        y.load(static_cast<const T *>(s.y.data) + row * n, packs, lane);
        float t = 0.0f;
        cached_each2(dy, y, packs, lane, [&](int64_t, float d, float v) { t += s.log ? d : d * v; });
        t = Group::sum(t, scratch);
        cached_map(dy, y, static_cast<T *>(s.dx.data) + row * n, packs, lane,
                   [&](int64_t, float d, float v) { return s.log ? d - m_exp(v) * t : v * (d - t); });
    }
}

template <class T, int G>
__global__ void __launch_bounds__(BLOCK) softmax_backward_streamed(ampc_softmax_backward s)
{
    typedef RowGroup<G> Group;
    __shared__ float scratch[BLOCK / 32];
    const int64_t n = s.rows.n;
    const int lane = Group::lane();
    for (int64_t row = Group::first(); row < s.rows.outer; row += Group::step()) {
        const T *dy = static_cast<const T *>(s.dy.data) + row * n, *y = static_cast<const T *>(s.y.data) + row * n;
        float t = 0.0f;
        stream_reduce<T, G>(dy, y, n, lane, [&](int64_t, const float *d, const float *v, auto count) {
            for (int i = 0; i < decltype(count)::value; i++)
                t += s.log ? d[i] : d[i] * v[i];
        });
        t = Group::sum(t, scratch);
        stream_map<T, G>(dy, y, static_cast<T *>(s.dx.data) + row * n, n, lane,
                         [&](int64_t, float d, float v) { return s.log ? d - m_exp(v) * t : v * (d - t); });
    }
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
