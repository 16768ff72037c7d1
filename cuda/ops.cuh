/*
 * ops.cuh: what the op kernels (elementwise.cu, softmax.cu, norm.cu,
 * loss.cu, reduce.cu) share:
 *   - loading an element of any floating dtype into the compute type Acc
 *     (float, or double for float64 data) and rounding once on the way out;
 *   - row groups: G threads working on one row of an (outer, n, inner)
 *     layout (G = 1: a thread per row, for strided rows; 32: a warp; BLOCK:
 *     a whole block), with sums and maxima over the group in a fixed order,
 *     so a kernel gives the same bits on every run;
 *   - column sums in two deterministic stages (partials per chunk of rows,
 *     then the chunks added in order), for reductions over all but the
 *     innermost dimension and for layer_norm's weight gradients;
 *   - scratch memory from ampc's pool.
 * The arithmetic must stay IEEE: no --use_fast_math here.
 */
#ifndef AMPC_OPS_CUH
#define AMPC_OPS_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#include "common.h"
#include "kernels/op_descriptors.h"

/* Defined in memory.c: ampc's pool, for scratch buffers. */
extern "C" int ampc_cuda_alloc(int device, size_t nbytes, void *stream, void **ptr);
extern "C" int ampc_cuda_free(int device, void *ptr, size_t nbytes, void *stream);

namespace ops {

/* Threads of a block-sized row group, and of every other launch here. Row
 * kernels declare it as their launch bound, so the compiler keeps them
 * within 65536 / BLOCK registers a thread (a row held in registers would
 * otherwise ask for more than a block can have). */
constexpr int BLOCK = 512;

/* A kernel's dynamic shared memory as an array of T, sized by the launch's
 * third argument (tests/emulated_cuda's model defines its own). */
#ifndef AMPC_DYNAMIC_SHARED
#define AMPC_DYNAMIC_SHARED(T, name) extern __shared__ T name[]
#endif

/* ------------------------------------------------------------------------ */
/* Elements                                                                  */
/* ------------------------------------------------------------------------ */

template <class Acc>
__device__ __forceinline__ Acc load(const ampc_buf &b, int64_t i)
{
    switch (b.dtype) {
    case AMPC_FLOAT32: return (Acc)static_cast<const float *>(b.data)[i];
    case AMPC_FLOAT16: return (Acc)__half2float(static_cast<const __half *>(b.data)[i]);
    case AMPC_BFLOAT16: return (Acc)__bfloat162float(static_cast<const __nv_bfloat16 *>(b.data)[i]);
    default: return (Acc)static_cast<const double *>(b.data)[i];
    }
}

/* Round v to b's dtype once: double goes straight to 16 bits, not through
 * float (which would round twice). */
__device__ __forceinline__ void store(const ampc_buf &b, int64_t i, float v)
{
    switch (b.dtype) {
    case AMPC_FLOAT32: static_cast<float *>(b.data)[i] = v; break;
    case AMPC_FLOAT16: static_cast<__half *>(b.data)[i] = __float2half_rn(v); break;
    case AMPC_BFLOAT16: static_cast<__nv_bfloat16 *>(b.data)[i] = __float2bfloat16_rn(v); break;
    default: static_cast<double *>(b.data)[i] = (double)v; break;
    }
}

__device__ __forceinline__ void store(const ampc_buf &b, int64_t i, double v)
{
    switch (b.dtype) {
    case AMPC_FLOAT32: static_cast<float *>(b.data)[i] = (float)v; break;
    case AMPC_FLOAT16: static_cast<__half *>(b.data)[i] = __double2half(v); break;
    case AMPC_BFLOAT16: static_cast<__nv_bfloat16 *>(b.data)[i] = __double2bfloat16(v); break;
    default: static_cast<double *>(b.data)[i] = v; break;
    }
}

/* A class index of an integer target array. */
__device__ __forceinline__ int64_t load_index(const ampc_buf &t, int64_t i)
{
    switch (t.dtype) {
    case AMPC_INT64: return static_cast<const int64_t *>(t.data)[i];
    case AMPC_INT32: return static_cast<const int32_t *>(t.data)[i];
    case AMPC_INT16: return static_cast<const int16_t *>(t.data)[i];
    case AMPC_INT8: return static_cast<const int8_t *>(t.data)[i];
    case AMPC_UINT8: return static_cast<const uint8_t *>(t.data)[i];
    default: return -1;
    }
}

/* The maximum with NaN winning, as torch's softmax and max reductions have it. */
template <class Acc>
__device__ __forceinline__ Acc nan_max(Acc a, Acc b)
{
    return (a > b || a != a) ? a : b;
}

/* Math in the compute type (the float versions for float, IEEE-accurate as
 * CUDA's libdevice gives them without fast math). */
__device__ __forceinline__ float m_exp(float x) { return expf(x); }
__device__ __forceinline__ double m_exp(double x) { return exp(x); }
__device__ __forceinline__ float m_log(float x) { return logf(x); }
__device__ __forceinline__ double m_log(double x) { return log(x); }
__device__ __forceinline__ float m_log1p(float x) { return log1pf(x); }
__device__ __forceinline__ double m_log1p(double x) { return log1p(x); }
__device__ __forceinline__ float m_erfc(float x) { return erfcf(x); }
__device__ __forceinline__ double m_erfc(double x) { return erfc(x); }
/* Phi(x) as erfc(-x / sqrt 2) / 2 (ops_real.inc's normal_cdf: no cancellation for negative x). */
template <class Acc>
__device__ __forceinline__ Acc normal_cdf(Acc x) { return (Acc)0.5 * m_erfc(-x * (Acc)M_SQRT1_2); }
/* The corrected two-pass moments: the mean and the sum of squared deviations of n values from a
 * first pass's mean mu and the sums of the deviations from it and of their squares (the CPU's
 * corrected_moments, real_sums.inc, which says why). */
template <class Acc>
__device__ __forceinline__ void corrected_moments(Acc mu, Acc deviations, Acc squares, Acc n, Acc &mean, Acc &m2)
{
    const Acc correction = deviations / n, corrected = squares - deviations * correction;
    mean = mu + correction;
    m2 = corrected > (Acc)0 ? corrected : (Acc)0;
}
__device__ __forceinline__ float m_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double m_tanh(double x) { return tanh(x); }
__device__ __forceinline__ float m_pow(float x, float y) { return powf(x, y); }
__device__ __forceinline__ double m_pow(double x, double y) { return pow(x, y); }
__device__ __forceinline__ float m_sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double m_sqrt(double x) { return sqrt(x); }
__device__ __forceinline__ float m_abs(float x) { return fabsf(x); }
__device__ __forceinline__ double m_abs(double x) { return fabs(x); }

/* ------------------------------------------------------------------------ */
/* Row groups                                                                */
/* ------------------------------------------------------------------------ */

/* G threads per row: rows run over positions (o, i) of (outer, n, inner),
 * each a row of n elements `inner` apart starting at base(). A group of 4
 * warps (G = 128) shares the block's barriers with the other groups, so its
 * kernels loop over the block's rows together (block_first, block_step)
 * and let a group without a row join the reductions idle. */
template <int G, int THREADS = BLOCK>  /* THREADS: the block's */
struct RowGroup {
    static_assert(G == 1 || G == 32 || G == 128 || G == THREADS, "a row group is a thread, 1 or 4 warps, or the block");
    static constexpr int ROWS_PER_BLOCK = THREADS / G;

    __device__ static int lane() { return G == 1 ? 0 : (int)(threadIdx.x % G); }
    __device__ static int64_t first() { return (int64_t)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / G; }
    __device__ static int64_t step() { return (int64_t)gridDim.x * ROWS_PER_BLOCK; }
    __device__ static int64_t block_first() { return (int64_t)blockIdx.x * ROWS_PER_BLOCK; }
    __device__ static int in_block() { return (int)(threadIdx.x / G); }

    /* The sum (max: the NaN-propagating maximum) over the group, the same
     * value in every lane. The warp's butterfly combines the same two values
     * in each pair of lanes, and the block combines its warps' results in
     * warp order. scratch: THREADS / 32 values of shared memory (unused where
     * G <= 32). */
    template <class Acc>
    __device__ static Acc sum(Acc v, Acc *scratch)
    {
        return reduce(v, scratch, [](Acc a, Acc b) { return a + b; });
    }

    template <class Acc>
    __device__ static Acc max(Acc v, Acc *scratch)
    {
        return reduce(v, scratch, [](Acc a, Acc b) { return nan_max(a, b); });
    }

    /* Two sums at once, each with sum()'s order and bits: one exchange
     * through shared memory (two barriers) instead of two. scratch:
     * 2 * THREADS / 32 values. */
    template <class Acc>
    __device__ static void sum2(Acc &a, Acc &b, Acc *scratch)
    {
        if constexpr (G > 1) {
            for (int offset = 16; offset > 0; offset /= 2) {
                a += __shfl_xor_sync(0xffffffffu, a, offset);
                b += __shfl_xor_sync(0xffffffffu, b, offset);
            }
        }
        if constexpr (G > 32) {
            constexpr int WARPS = G / 32, HALF = THREADS / 32;
            const int warp = threadIdx.x / 32, first = warp - warp % WARPS;
            if (threadIdx.x % 32 == 0) {
                scratch[warp] = a;
                scratch[HALF + warp] = b;
            }
            sync();
            Acc ra = scratch[first], rb = scratch[HALF + first];
            for (int w = 1; w < WARPS; w++) {
                ra += scratch[first + w];
                rb += scratch[HALF + first + w];
            }
            sync();
            a = ra;
            b = rb;
        }
    }

private:
    template <class Acc, class Op>
    __device__ static Acc reduce(Acc v, Acc *scratch, Op op)
    {
        if constexpr (G == 1)
            return v;
        else {
            for (int offset = 16; offset > 0; offset /= 2)
                v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
            if constexpr (G == 32)
                return v;
            else
                return across_warps(v, scratch, op);
        }
    }

    /* A barrier of the group's warps alone: a named one (1 + the group's
     * index; 0 is __syncthreads') for a group smaller than the block, so
     * that the block's rows do not wait for each other's reductions. */
    __device__ static void sync()
    {
        if constexpr (G == THREADS)
            __syncthreads();
        else
            asm volatile("bar.sync %0, %1;" ::"r"(1 + (int)(threadIdx.x / G)), "n"(G) : "memory");
    }

    template <class Acc, class Op>
    __device__ static Acc across_warps(Acc v, Acc *scratch, Op op)
    {
        constexpr int WARPS = G / 32;
        const int warp = threadIdx.x / 32, first = warp - warp % WARPS;
        if (threadIdx.x % 32 == 0)
            scratch[warp] = v;
        sync();
        Acc r = scratch[first];
        for (int w = 1; w < WARPS; w++)
            r = op(r, scratch[first + w]);
        sync();  /* scratch is free for the next reduction */
        return r;
    }
};

/* fn(j, x[j]) for the group's share of a row's n elements (`stride` apart
 * from base), UNROLL loads issued before any is used: a lane keeps several
 * loads in flight, which a memory-bound row kernel needs to approach the
 * device's bandwidth. (16-byte vector loads, tried, were slower here: one
 * vector in flight per lane hides less latency than eight scalars.) */
constexpr int UNROLL = 8;

template <int G, class Acc, class Fn>
__device__ __forceinline__ void row_each(const ampc_buf &x, int64_t base, int64_t n, int64_t stride, Fn fn)
{
    int64_t j = RowGroup<G>::lane();
    for (; j + (UNROLL - 1) * G < n; j += UNROLL * G) {
        Acc v[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; u++)
            v[u] = load<Acc>(x, base + (j + u * G) * stride);
#pragma unroll
        for (int u = 0; u < UNROLL; u++)
            fn(j + u * G, v[u]);
    }
    for (; j < n; j += G)
        fn(j, load<Acc>(x, base + j * stride));
}

/* The same over two arrays of the same layout: fn(j, x[j], y[j]). */
template <int G, class Acc, class Fn>
__device__ __forceinline__ void row_each2(const ampc_buf &x, const ampc_buf &y, int64_t base, int64_t n,
                                          int64_t stride, Fn fn)
{
    constexpr int U = UNROLL / 2;
    int64_t j = RowGroup<G>::lane();
    for (; j + (U - 1) * G < n; j += U * G) {
        Acc v[U], w[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            v[u] = load<Acc>(x, base + (j + u * G) * stride);
            w[u] = load<Acc>(y, base + (j + u * G) * stride);
        }
#pragma unroll
        for (int u = 0; u < U; u++)
            fn(j + u * G, v[u], w[u]);
    }
    for (; j < n; j += G)
        fn(j, load<Acc>(x, base + j * stride), load<Acc>(y, base + j * stride));
}

/* The online softmax's running maximum m and sum s of exp(x - m), one
 * element at a time: -inf adds nothing, NaN makes s NaN, and the first
 * finite value from m = -inf, s = 0 gives s = 1. */
template <class Acc>
__device__ __forceinline__ void online_add(Acc &m, Acc &s, Acc v)
{
    if (v > m) {
        s = s * m_exp(m - v) + (Acc)1;
        m = v;
    }
    else if (v != -INFINITY) {
        s += m_exp(v - m);
    }
}

/* A row's maximum M and sum of exp(x - M) over the group. */
template <int G, class Acc>
__device__ __forceinline__ void row_max_sum(const ampc_buf &x, int64_t base, int64_t n, int64_t stride, Acc &M,
                                            Acc &S, Acc *scratch)
{
    Acc m = -INFINITY, s = 0;
    row_each<G, Acc>(x, base, n, stride, [&](int64_t, Acc v) { online_add(m, s, v); });
    M = RowGroup<G>::max(m, scratch);
    /* a lane that saw nothing (or only -inf) adds nothing */
    S = RowGroup<G>::sum(s == 0 ? (Acc)0 : s * m_exp(m - M), scratch);
}

__device__ __forceinline__ int64_t row_base(const ampc_rows &r, int64_t pos)
{
    return (pos / r.inner) * r.n * r.inner + pos % r.inner;
}

/* How a row kernel is launched: a thread per row when rows are strided
 * (inner > 1: neighbouring threads read neighbouring elements), a warp per
 * short row, a block per long one. */
struct RowLaunch {
    int group;
    unsigned grid;
};

static inline RowLaunch row_launch(const ampc_rows &r)
{
    const int64_t rows = r.outer * r.inner;
    const int group = r.inner > 1 ? 1 : r.n <= 1024 ? 32 : BLOCK;
    const int64_t per_block = BLOCK / group;
    int64_t grid = (rows + per_block - 1) / per_block;
    if (grid > (1 << 20))
        grid = 1 << 20;  /* grid-stride beyond that */
    return {group, (unsigned)(grid > 0 ? grid : 1)};
}

/* kernel<G, Acc><<<...>>>(args...) for the group size L.group. */
#define AMPC_LAUNCH_ROWS(kernel, Acc, L, stream, ...)                                             \
    do {                                                                                          \
        switch ((L).group) {                                                                      \
        case 1: kernel<1, Acc><<<(L).grid, ops::BLOCK, 0, (stream)>>>(__VA_ARGS__); break;        \
        case 32: kernel<32, Acc><<<(L).grid, ops::BLOCK, 0, (stream)>>>(__VA_ARGS__); break;      \
        default: kernel<ops::BLOCK, Acc><<<(L).grid, ops::BLOCK, 0, (stream)>>>(__VA_ARGS__); break; \
        }                                                                                         \
    } while (0)

/* The stream an entry point was handed. */
static inline cudaStream_t as_stream(void *stream) { return static_cast<cudaStream_t>(stream); }

/* ------------------------------------------------------------------------ */
/* Scratch                                                                   */
/* ------------------------------------------------------------------------ */

/* A buffer from ampc's pool, handed back on the same stream when it goes out
 * of scope (stream order makes that safe while kernels still read it). */
struct Scratch {
    int device;
    void *stream;
    size_t nbytes = 0;
    void *ptr = nullptr;

    Scratch(int device_, void *stream_) : device(device_), stream(stream_) {}
    Scratch(const Scratch &) = delete;
    Scratch &operator=(const Scratch &) = delete;
    ~Scratch()
    {
        if (ptr != nullptr)
            (void)ampc_cuda_free(device, ptr, nbytes, stream);
    }
    int get(size_t n)
    {
        nbytes = n > 0 ? n : 1;
        return ampc_cuda_alloc(device, nbytes, stream, &ptr);
    }
};

/* ------------------------------------------------------------------------ */
/* Column sums: out[o, i] = scale * sum_j v(o, j, i) over (outer, n, inner)  */
/* ------------------------------------------------------------------------ */

/* Rows of a chunk, and the chunks of a column sum: the number depends on
 * the shape alone (never on the device), so the bits do too. */
constexpr int COL_TILE = 32, COL_ROWS = 16;

static inline int64_t column_chunks(int64_t outer, int64_t n, int64_t inner)
{
    const int64_t tiles = (inner + COL_TILE - 1) / COL_TILE;
    int64_t chunks = (n + 63) / 64;
    const int64_t want = 2048 / (tiles * outer) > 1 ? 2048 / (tiles * outer) : 1;
    if (chunks > want)
        chunks = want;
    if (chunks > 1024)
        chunks = 1024;
    return chunks > 0 ? chunks : 1;
}

/* Stage 1: block (COL_TILE, COL_ROWS) sums its chunk of rows for COL_TILE
 * columns, NV sums at once (v fills NV values), into partial[v][o][chunk][i]
 * (chunks > 1) or, with scale, straight into out[v] (one chunk). Blocks are
 * numbered (o, chunk, tile), flattened into grid.x. */
template <int NV, class Acc, class Val>
__global__ void column_partials(Val val, int64_t outer, int64_t n, int64_t inner, int64_t chunks, Acc *partial,
                                ampc_buf out0, ampc_buf out1, Acc scale)
{
    __shared__ Acc acc[NV][COL_ROWS][COL_TILE + 1];
    const int64_t tiles = (inner + COL_TILE - 1) / COL_TILE;
    const int64_t tile = blockIdx.x % tiles, c = (blockIdx.x / tiles) % chunks, o = blockIdx.x / tiles / chunks;
    const int64_t i = tile * COL_TILE + threadIdx.x;
    const int64_t chunk = (n + chunks - 1) / chunks;
    const int64_t j0 = c * chunk, j1 = j0 + chunk < n ? j0 + chunk : n;
    Acc s[NV];
    for (int v = 0; v < NV; v++)
        s[v] = 0;
    if (i < inner)
#pragma unroll 4
        for (int64_t j = j0 + threadIdx.y; j < j1; j += COL_ROWS) {
            Acc x[NV];
            val(o, j, i, x);
            for (int v = 0; v < NV; v++)
                s[v] += x[v];
        }
    for (int v = 0; v < NV; v++)
        acc[v][threadIdx.y][threadIdx.x] = s[v];
    __syncthreads();
    if (threadIdx.y != 0 || i >= inner)
        return;
    for (int v = 0; v < NV; v++) {
        Acc t = acc[v][0][threadIdx.x];
        for (int r = 1; r < COL_ROWS; r++)
            t += acc[v][r][threadIdx.x];
        if (chunks > 1)
            partial[((v * outer + o) * chunks + c) * inner + i] = t;
        else
            store(v == 0 ? out0 : out1, o * inner + i, t * scale);
    }
}

/* Stage 2: out[v][o, i] = scale * the sum over chunks. FINISH_Y threads
 * share an output, each adding every FINISH_Y-th chunk, and their sums are
 * added in y order: a fixed order, so the bits depend on the shape alone
 * (one thread per output took 118 us over 1024 chunks of 256 columns). */
constexpr int FINISH_X = 32, FINISH_Y = 16;

template <class Acc>
__global__ void __launch_bounds__(FINISH_X *FINISH_Y)
    column_finish(const Acc *partial, int64_t outer, int64_t inner, int64_t chunks, int nv, ampc_buf out0,
                  ampc_buf out1, Acc scale)
{
    __shared__ Acc acc[FINISH_Y][FINISH_X];
    const int64_t total = nv * outer * inner;
    for (int64_t t0 = (int64_t)blockIdx.x * FINISH_X; t0 < total; t0 += (int64_t)gridDim.x * FINISH_X) {
        const int64_t t = t0 + threadIdx.x;
        Acc s = 0;
        if (t < total) {
            const int64_t v = t / (outer * inner), o = t / inner % outer, i = t % inner;
            const Acc *p = partial + (v * outer + o) * chunks * inner + i;
#pragma unroll 4
            for (int64_t c = threadIdx.y; c < chunks; c += FINISH_Y)
                s += p[c * inner];
        }
        acc[threadIdx.y][threadIdx.x] = s;
        __syncthreads();
        if (threadIdx.y == 0 && t < total) {
            Acc sum = acc[0][threadIdx.x];
            for (int r = 1; r < FINISH_Y; r++)
                sum += acc[r][threadIdx.x];
            store(t < outer * inner ? out0 : out1, t % (outer * inner), sum * scale);
        }
        __syncthreads();
    }
}

static inline unsigned grid_for(int64_t n, int block)
{
    const int64_t b = (n + block - 1) / block;
    return (unsigned)(b < (1 << 20) ? (b > 0 ? b : 1) : (1 << 20));
}

#ifdef __CUDACC__  /* the launches: nvcc's alone (tests/emulated_cuda compiles the rest for the CPU) */
/* Queue column_finish for nv * outer * inner outputs. */
template <class Acc>
int finish_columns(void *stream, const Acc *partial, int64_t outer, int64_t inner, int64_t chunks, int nv,
                   ampc_buf out0, ampc_buf out1, Acc scale, const char *what)
{
    column_finish<Acc><<<grid_for(nv * outer * inner, FINISH_X), dim3(FINISH_X, FINISH_Y), 0, as_stream(stream)>>>(
        partial, outer, inner, chunks, nv, out0, out1, scale);
    return ampc_cuda_launched(what);
}

/* Both stages for NV column sums of val over (outer, n, inner) into out0
 * (and out1), queued on stream. */
template <int NV, class Acc, class Val>
int column_sums(int device, void *stream, Val val, int64_t outer, int64_t n, int64_t inner, ampc_buf out0,
                ampc_buf out1, Acc scale, const char *what)
{
    const int64_t tiles = (inner + COL_TILE - 1) / COL_TILE;
    const int64_t chunks = column_chunks(outer, n, inner);
    Scratch scratch(device, stream);
    if (chunks > 1) {
        const int got = scratch.get((size_t)(NV * outer * chunks * inner) * sizeof(Acc));
        if (got != AMPC_OK)
            return got;
    }
    const int64_t blocks = tiles * chunks * outer;
    if (blocks >= (int64_t)1 << 31)
        return ampc_cuda_fail_msg(AMPC_ERR_INVALID, "%s: %lld column blocks are too many for one launch", what,
                                  (long long)blocks);
    column_partials<NV, Acc><<<(unsigned)blocks, dim3(COL_TILE, COL_ROWS), 0, as_stream(stream)>>>(
        val, outer, n, inner, chunks, static_cast<Acc *>(scratch.ptr), out0, out1, scale);
    int status = ampc_cuda_launched(what);
    if (status == AMPC_OK && chunks > 1)
        status = finish_columns<Acc>(stream, static_cast<const Acc *>(scratch.ptr), outer, inner, chunks, NV, out0,
                                     out1, scale, what);
    return status;
}
#endif /* __CUDACC__ */

}  // namespace ops

#endif /* AMPC_OPS_CUH */
