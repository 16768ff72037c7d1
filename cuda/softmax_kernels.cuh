/*
 * softmax_kernels.cuh: the kernels of softmax.cu (which launches them), in
 * a header of their own so that tests/emulated_cuda can run them on the
 * CPU. What they do and when each runs: softmax.cu.
 */
#ifndef AMPC_SOFTMAX_KERNELS_CUH
#define AMPC_SOFTMAX_KERNELS_CUH

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
 * exp(x - M) over its live elements, online. */
template <class T, int G>
__device__ __forceinline__ void streamed_max_sum(const T *x, int64_t live, int lane, float *scratch, float &M,
                                                 float &S)
{
    float m = -INFINITY, e = 0.0f;
    stream_reduce<T, G>(x, nullptr, live, lane, [&](int64_t, const float *v, const float *, auto count) {
        online_add_segment<decltype(count)::value>(m, e, v);
    });
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
 * row, in the cached kernels' three passes (torch's too): the first reads
 * the row once, keeps each whole pack it reads in shared memory (pack p at
 * cache[p]: a lane keeps and rereads only its own packs, so no barrier
 * guards them) and takes only the maximum, so no exponential waits behind
 * its loads; the sum of exp(x - M) and the output then come from shared
 * memory. Streamed, a 100 KB row (GPT-2's 50257 logits in 16 bits) missed
 * the L2 on its second read, with 53 MB of rows in flight. */
template <class T>
__global__ void __launch_bounds__(BLOCK, 2) softmax_smem(ampc_softmax s)
{
    typedef RowGroup<BLOCK> Group;
    constexpr int VEC = vec_of<T>();
    AMPC_DYNAMIC_SHARED(uint4, cache);
    __shared__ float scratch[BLOCK / 32];
    const int64_t n = s.rows.n;
    const int lane = Group::lane();
    for (int64_t row = Group::first(); row < s.rows.outer; row += Group::step()) {
        const T *x = static_cast<const T *>(s.x.data) + row * n;
        const int64_t live = ampc_softmax_live(&s, row);
        /* stream_reduce's segments of the live part: `head` single elements
         * before the first 16-byte boundary, `kept` whole packs, and the
         * rest of live after them single again (none kept where live ends
         * before the first boundary) */
        const int64_t head = head_of(x, n), kept = live >= head ? (live - head) / VEC : 0;
        const int64_t live_head = head < live ? head : live, live_tail = live_head + kept * VEC;
        float m = -INFINITY;
        stream_reduce<T, BLOCK>(
            x, nullptr, live, lane,
            [&](int64_t, const float *v, const float *, auto count) {
#pragma unroll
                for (int i = 0; i < decltype(count)::value; i++)
                    m = nan_max(m, v[i]);
            },
            [&](int64_t p, const uint4 &raw) { cache[p] = raw; });
        const float M = Group::max(m, scratch);
        float e = 0.0f;
        if (lane < live_head)
            e += m_exp(to_float(x[lane]) - M);
        for (int64_t p = lane; p < kept; p += BLOCK) {
            Pack<T> v;
            v.raw = cache[p];
#pragma unroll
            for (int i = 0; i < VEC; i++)
                e += m_exp(v[i] - M);
        }
        if (live_tail + lane < live)
            e += m_exp(to_float(x[live_tail + lane]) - M);
        const float S = Group::sum(e, scratch);
        const float shift = M + m_log(S), inv = 1.0f / S, dead = s.log ? -INFINITY : 0.0f;
        auto out = [&](int64_t j, float v) { return j < live ? (s.log ? v - shift : m_exp(v - M) * inv) : dead; };
        /* stream_map's writes: the kept packs from shared memory */
        T *y = static_cast<T *>(s.y.data) + row * n;
        const int64_t packs = (n - head) / VEC, tail = head + packs * VEC;
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

}  // namespace

#endif /* AMPC_SOFTMAX_KERNELS_CUH */
