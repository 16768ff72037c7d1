/*
 * packs.cuh: the fast paths of the row kernels. They serve rows that are
 * contiguous (inner == 1) and whose arrays share one storage type T (float,
 * __half or __nv_bfloat16), and move data in 16-byte packs of
 * VEC = 16 / sizeof(T) elements, converted to float in registers:
 *   - CachedRow<T, G, NV>: a row held in registers by a row group of G
 *     lanes, NV packs a lane (pack p in lane p % G), so a kernel reads it
 *     from memory once however many passes it makes over it;
 *   - stream_reduce / stream_map: a row too long to hold, read in packs
 *     with several loads in flight per lane, scalar before its first
 *     16-byte boundary and after its last;
 *   - packed_column_sums: sums over the rows of a (rows, cols) array for
 *     each column, a pack of columns per thread, in two fixed-order stages.
 * Sums run in a fixed order (lane by lane, then ops.cuh's group
 * reductions), so results repeat bit for bit. The generic kernels beside
 * these (any dtype mix, strided rows, float64) remain the reference path;
 * the arithmetic of each formula is the same, only the order of a row's
 * sum differs.
 */
#ifndef AMPC_PACKS_CUH
#define AMPC_PACKS_CUH

#include <type_traits>

#include "dispatch.cuh"
#include "ops.cuh"

namespace ops {

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <class T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

template <class T>
struct Pack {
    static constexpr int VEC = 16 / sizeof(T);
    union {
        uint4 raw;
        T e[VEC];
    };

    __device__ __forceinline__ Pack() {}
    __device__ __forceinline__ void load(const T *p) { raw = __ldg(reinterpret_cast<const uint4 *>(p)); }
    __device__ __forceinline__ void store(T *p) const { *reinterpret_cast<uint4 *>(p) = raw; }
    __device__ __forceinline__ float operator[](int i) const { return to_float(e[i]); }
    __device__ __forceinline__ void set(int i, float v) { e[i] = from_float<T>(v); }
};

template <class T>
__host__ __device__ constexpr int vec_of() { return Pack<T>::VEC; }

/* The storage type of an ampc dtype, for dispatch: fn(T{}) with T float,
 * __half or __nv_bfloat16. float64 has no packs: it takes float's
 * instance, whose fast paths turn float64 away (packs_fit,
 * launch_fast_rows). */
template <class Tag>
using PackStorage = float_type<Tag, __half, __nv_bfloat16, float, float>;

template <class Fn>
int with_storage(int dtype, Fn fn)
{
    return dispatch_float(dtype, [&](auto tag) { return fn(PackStorage<decltype(tag)>()); });
}

/* Whether rows of n elements of a dtype starting at these pointers all take
 * the cached path's pack loads: a storage type packs serve, n a whole
 * number of packs, every pointer on a 16-byte boundary. */
static inline bool packs_fit(int dtype, int64_t n, const void *a, const void *b = nullptr, const void *c = nullptr,
                             const void *d = nullptr)
{
    if (dtype != AMPC_FLOAT32 && dtype != AMPC_FLOAT16 && dtype != AMPC_BFLOAT16)
        return false;
    const int64_t vec = dtype == AMPC_FLOAT32 ? 4 : 8;
    const void *ptrs[4] = {a, b, c, d};
    for (const void *p : ptrs)
        if (p != nullptr && (uintptr_t)p % 16 != 0)
            return false;
    return n % vec == 0;
}

/* Whether streamed rows of these arrays (the same n and storage type) meet
 * 16-byte boundaries at the same element, so one pack index serves both. */
static inline bool same_phase(const void *a, const void *b)
{
    return b == nullptr || ((uintptr_t)a - (uintptr_t)b) % 16 == 0;
}

/* ------------------------------------------------------------------------ */
/* Rows held in registers                                                    */
/* ------------------------------------------------------------------------ */

/* Tiers of the cached kernels: a warp per row with 4 or 8 packs a lane,
 * 4 warps per row with 4 or 8, a block per row with 8 (rows up to 16384
 * float32 or 32768 16-bit elements; longer ones stream). Several packs a
 * lane keep enough loads in flight; a kernel holds registers for all NV
 * packs whether the row fills them or not, and a backward pass holding two
 * rows at NV = 8 (110-115 registers) fits one block an SM where NV = 4 (64)
 * fits two: hence both widths at 4 warps. cached_tier(n, VEC) is the
 * smallest that holds a row, or -1. Each tier is a set of kernel instances:
 * few keep the build short. The kernels loop over a block's rows together
 * (RowGroup::block_first): a group past the last row holds no packs and
 * only joins the reductions. */
constexpr int CACHED_TIERS = 5;
constexpr int TIER_GROUP[CACHED_TIERS] = {32, 32, 128, 128, BLOCK};
constexpr int TIER_PACKS[CACHED_TIERS] = {4, 8, 4, 8, 8};

static inline int cached_tier(int64_t n, int vec)
{
    for (int t = 0; t < CACHED_TIERS; t++)
        if (n <= (int64_t)TIER_GROUP[t] * TIER_PACKS[t] * vec)
            return t;
    return -1;
}

template <class T, int G, int NV>
struct CachedRow {
    static constexpr int VEC = Pack<T>::VEC;
    Pack<T> p[NV];

    /* The lane's packs, those wholly from element live on left unread (a
     * causal row's masked end, which each() and cached_map() never read). */
    __device__ __forceinline__ void load(const T *row, int64_t packs, int lane, int64_t live = INT64_MAX)
    {
#pragma unroll
        for (int k = 0; k < NV; k++)
            if (lane + (int64_t)k * G < packs && (lane + (int64_t)k * G) * VEC < live)
                p[k].load(row + (lane + (int64_t)k * G) * VEC);
    }

    /* fn(j, x[j]) over the lane's elements j < live, in order. A pack wholly
     * below live (every pack, without a causal mask) takes no test per element. */
    template <class Fn>
    __device__ __forceinline__ void each(int64_t packs, int lane, Fn fn, int64_t live = INT64_MAX) const
    {
#pragma unroll
        for (int k = 0; k < NV; k++)
            if (lane + (int64_t)k * G < packs) {
                const int64_t j0 = (lane + (int64_t)k * G) * VEC;
                if (j0 + VEC <= live) {
#pragma unroll
                    for (int i = 0; i < VEC; i++)
                        fn(j0 + i, p[k][i]);
                }
                else {
                    for (int i = 0; i < VEC && j0 + i < live; i++)
                        fn(j0 + i, p[k][i]);
                }
            }
    }
};

/* fn(j, a[j], b[j]) over the lane's elements of two cached rows, in order. */
template <class T, int G, int NV, class Fn>
__device__ __forceinline__ void cached_each2(const CachedRow<T, G, NV> &a, const CachedRow<T, G, NV> &b,
                                             int64_t packs, int lane, Fn fn)
{
    constexpr int VEC = Pack<T>::VEC;
#pragma unroll
    for (int k = 0; k < NV; k++)
        if (lane + (int64_t)k * G < packs) {
            const int64_t j0 = (lane + (int64_t)k * G) * VEC;
#pragma unroll
            for (int i = 0; i < VEC; i++)
                fn(j0 + i, a.p[k][i], b.p[k][i]);
        }
}

/* N values rounded to O and stored at p with one access (N * sizeof(O)
 * bytes, at most 16, on a boundary of that size). */
template <class O, int N>
__device__ __forceinline__ void store_rounded(O *p, const float (&v)[N])
{
    struct alignas(N * sizeof(O)) Values {
        O e[N];
    } out;
    static_assert(sizeof(Values) <= 16, "one access");
#pragma unroll
    for (int i = 0; i < N; i++)
        out.e[i] = from_float<O>(v[i]);
    *reinterpret_cast<Values *>(p) = out;
}

/* out[j] = fn(j, a[j], b[j]) over the lane's elements of two cached rows
 * (b may be a: a single-row map), stored a pack at a time in out's type O
 * (T's, or 16 bits from float32: attention's probabilities); `dead` from
 * element live on (a causal mask). */
template <class T, class O, int G, int NV, class Fn>
__device__ __forceinline__ void cached_map(const CachedRow<T, G, NV> &a, const CachedRow<T, G, NV> &b, O *out,
                                           int64_t packs, int lane, Fn fn, int64_t live = INT64_MAX,
                                           float dead = 0.0f)
{
    constexpr int VEC = Pack<T>::VEC;
#pragma unroll
    for (int k = 0; k < NV; k++)
        if (lane + (int64_t)k * G < packs) {
            const int64_t j0 = (lane + (int64_t)k * G) * VEC;
            float o[VEC];
            if (j0 + VEC <= live) {
#pragma unroll
                for (int i = 0; i < VEC; i++)
                    o[i] = fn(j0 + i, a.p[k][i], b.p[k][i]);
            }
            else {
#pragma unroll
                for (int i = 0; i < VEC; i++)
                    o[i] = j0 + i < live ? fn(j0 + i, a.p[k][i], b.p[k][i]) : dead;
            }
            store_rounded<O, VEC>(out + j0, o);
        }
}

/* kernel<T, G, NV><<<...>>>(args...) for tier t of the cached kernels. */
#define AMPC_LAUNCH_CACHED(kernel, T, tier, grid, stream, ...)                                          \
    do {                                                                                                \
        switch (tier) {                                                                                 \
        case 0: kernel<T, 32, 4><<<(grid), ops::BLOCK, 0, (stream)>>>(__VA_ARGS__); break;              \
        case 1: kernel<T, 32, 8><<<(grid), ops::BLOCK, 0, (stream)>>>(__VA_ARGS__); break;              \
        case 2: kernel<T, 128, 4><<<(grid), ops::BLOCK, 0, (stream)>>>(__VA_ARGS__); break;             \
        case 3: kernel<T, 128, 8><<<(grid), ops::BLOCK, 0, (stream)>>>(__VA_ARGS__); break;             \
        default: kernel<T, ops::BLOCK, 8><<<(grid), ops::BLOCK, 0, (stream)>>>(__VA_ARGS__); break;     \
        }                                                                                               \
    } while (0)

/* The grid of a row kernel with G lanes a row over `rows` rows. */
static inline unsigned rows_grid(int64_t rows, int group)
{
    const int64_t per_block = BLOCK / group;
    int64_t grid = (rows + per_block - 1) / per_block;
    if (grid > (1 << 20))
        grid = 1 << 20;  /* grid-stride beyond that */
    return (unsigned)(grid > 0 ? grid : 1);
}

static inline unsigned tier_grid(int64_t rows, int tier) { return rows_grid(rows, TIER_GROUP[tier]); }

/* ------------------------------------------------------------------------ */
/* Streamed rows                                                             */
/* ------------------------------------------------------------------------ */

/* Packs a lane has in flight at once while streaming. */
constexpr int STREAM_UNROLL = 4;

/* Elements of a row before its first 16-byte boundary. */
template <class T>
__device__ __forceinline__ int64_t head_of(const T *row, int64_t n)
{
    const int64_t h = (int64_t)(((16 - ((uintptr_t)row & 15)) & 15) / sizeof(T));
    return h < n ? h : n;
}

/* What stream_reduce hands keep by default: nothing is kept. */
struct KeepNothing {
    __device__ __forceinline__ void operator()(int64_t, const uint4 &) const {}
};

/* fn(j0, a, b, C) for every segment of the group's share of a row: C (a
 * std::integral_constant) elements j0.. of a (and of b, when b_row is not
 * null; zeros otherwise) as floats. Segments are whole packs, or single
 * elements before the first and after the last pack boundary. keep(p, raw)
 * sees each whole pack p of a as it was read (elements head + p * VEC..,
 * head = head_of(a_row, n)), for a kernel that holds the row. */
template <class T, int G, class Fn, class Keep = KeepNothing>
__device__ __forceinline__ void stream_reduce(const T *a_row, const T *b_row, int64_t n, int lane, Fn fn,
                                              Keep keep = Keep())
{
    constexpr int VEC = Pack<T>::VEC;
    const int64_t head = head_of(a_row, n);
    const int64_t packs = (n - head) / VEC, tail = head + packs * VEC;
    using One = std::integral_constant<int, 1>;
    using Vec = std::integral_constant<int, VEC>;
    if (lane < head) {
        float a[1] = {to_float(a_row[lane])}, b[1] = {b_row != nullptr ? to_float(b_row[lane]) : 0.0f};
        fn((int64_t)lane, a, b, One());
    }
    const T *a_body = a_row + head, *b_body = b_row != nullptr ? b_row + head : nullptr;
    for (int64_t p = lane; p < packs; p += STREAM_UNROLL * G) {
        Pack<T> pa[STREAM_UNROLL], pb[STREAM_UNROLL];
#pragma unroll
        for (int u = 0; u < STREAM_UNROLL; u++)
            if (p + u * G < packs) {
                pa[u].load(a_body + (p + u * G) * VEC);
                if (b_body != nullptr)
                    pb[u].load(b_body + (p + u * G) * VEC);
            }
#pragma unroll
        for (int u = 0; u < STREAM_UNROLL; u++)
            if (p + u * G < packs) {
                keep(p + u * G, pa[u].raw);
                float a[VEC], b[VEC];
#pragma unroll
                for (int i = 0; i < VEC; i++) {
                    a[i] = pa[u][i];
                    b[i] = b_body != nullptr ? pb[u][i] : 0.0f;
                }
                fn(head + (p + u * G) * VEC, a, b, Vec());
            }
    }
    if (tail + lane < n) {
        const int64_t j = tail + lane;
        float a[1] = {to_float(a_row[j])}, b[1] = {b_row != nullptr ? to_float(b_row[j]) : 0.0f};
        fn(j, a, b, One());
    }
}

/* out[j] = fn(j, a[j], b[j]) over the group's share of a row (b_row may be
 * null: b reads 0; a_row null: a reads 0), `dead` from element live on (a
 * causal mask). out must meet 16-byte boundaries where the inputs do
 * (same_phase). */
template <class T, int G, class Fn>
__device__ __forceinline__ void stream_map(const T *a_row, const T *b_row, T *out_row, int64_t n, int lane, Fn fn,
                                           int64_t live = INT64_MAX, float dead = 0.0f)
{
    constexpr int VEC = Pack<T>::VEC;
    const int64_t head = head_of(out_row, n);
    const int64_t packs = (n - head) / VEC, tail = head + packs * VEC;
    auto scalar = [&](int64_t j) {
        const float a = a_row != nullptr ? to_float(a_row[j]) : 0.0f, b = b_row != nullptr ? to_float(b_row[j]) : 0.0f;
        out_row[j] = from_float<T>(j < live ? fn(j, a, b) : dead);
    };
    if (lane < head)
        scalar(lane);
    for (int64_t p = lane; p < packs; p += STREAM_UNROLL * G) {
        Pack<T> pa[STREAM_UNROLL], pb[STREAM_UNROLL];
#pragma unroll
        for (int u = 0; u < STREAM_UNROLL; u++)
            if (p + u * G < packs) {
                if (a_row != nullptr)
                    pa[u].load(a_row + head + (p + u * G) * VEC);
                if (b_row != nullptr)
                    pb[u].load(b_row + head + (p + u * G) * VEC);
            }
#pragma unroll
        for (int u = 0; u < STREAM_UNROLL; u++)
            if (p + u * G < packs) {
                const int64_t j0 = head + (p + u * G) * VEC;
                Pack<T> o;
#pragma unroll
                for (int i = 0; i < VEC; i++) {
                    const float a = a_row != nullptr ? pa[u][i] : 0.0f, b = b_row != nullptr ? pb[u][i] : 0.0f;
                    o.set(i, j0 + VEC <= live || j0 + i < live ? fn(j0 + i, a, b) : dead);
                }
                o.store(out_row + j0);
            }
    }
    if (tail + lane < n)
        scalar(tail + lane);
}

/* The online softmax's (max, sum of exp(x - max)) over a segment of C
 * values: one exponential per element, and one per segment that raises the
 * maximum. NaN makes both NaN; -inf adds nothing. */
template <int C>
__device__ __forceinline__ void online_add_segment(float &m, float &s, const float *v)
{
    float pm = v[0];
#pragma unroll
    for (int i = 1; i < C; i++)
        pm = nan_max(pm, v[i]);
    if (pm > m || pm != pm) {
        s *= m_exp(m - pm);  /* 0 * exp(...) stays 0 from the start, m = -inf */
        m = pm;
    }
    if (m != -INFINITY)
#pragma unroll
        for (int i = 0; i < C; i++)
            s += m_exp(v[i] - m);
}

/* The group's (M, S) from each lane's (m, s). */
template <int G>
__device__ __forceinline__ void combine_max_sum(float m, float s, float &M, float &S, float *scratch)
{
    M = RowGroup<G>::max(m, scratch);
    S = RowGroup<G>::sum(s == 0.0f ? 0.0f : s * m_exp(m - M), scratch);
}

/* ------------------------------------------------------------------------ */
/* Choosing a path                                                           */
/* ------------------------------------------------------------------------ */

/* What a fast path answers when the arrays need the generic kernels. */
constexpr int NOT_FAST = AMPC_NOT_TAKEN;

/* The group size of a streamed row: a warp for short rows, a block for long. */
constexpr int64_t STREAM_BLOCK_FROM = 4096;

/* The fast path for rows (outer, n, 1) of one storage type whose arrays
 * start at ptrs[0..nptrs): cached(tier, grid, stream) when a row fits a
 * tier and packs fit, else streamed(group, grid, stream) when the arrays
 * share their 16-byte phase; NOT_FAST when neither applies. */
template <class Cached, class Streamed>
int launch_fast_rows(const ampc_rows &rows, int dtype, const void *const *ptrs, int nptrs, cudaStream_t stream,
                     Cached cached, Streamed streamed)
{
    if (rows.inner != 1 || dtype == AMPC_FLOAT64)
        return NOT_FAST;
    for (int i = 1; i < nptrs; i++)
        if (!same_phase(ptrs[0], ptrs[i]))
            return NOT_FAST;
    const int vec = dtype == AMPC_FLOAT32 ? 4 : 8;
    const int tier = packs_fit(dtype, rows.n, ptrs[0], nptrs > 1 ? ptrs[1] : nullptr, nptrs > 2 ? ptrs[2] : nullptr)
                         ? cached_tier(rows.n, vec)
                         : -1;
    if (tier >= 0)
        return cached(tier, tier_grid(rows.outer, tier), stream);
    const int group = rows.n < STREAM_BLOCK_FROM ? 32 : BLOCK;
    return streamed(group, rows_grid(rows.outer, group), stream);
}

/* launch_fast_rows with the kernels cached<T, G, NV> and streamed<T, G>
 * over the descriptor desc (a variable): the status, or NOT_FAST. */
#define AMPC_FAST_ROWS(cached, streamed, T, rows, dtype, ptrs, nptrs, stream, what, desc)          \
    launch_fast_rows(                                                                             \
        (rows), (dtype), (ptrs), (nptrs), (stream),                                               \
        [&](int tier_, unsigned grid_, cudaStream_t st_) {                                         \
            AMPC_LAUNCH_CACHED(cached, T, tier_, grid_, st_, desc);                                \
            return ampc_cuda_launched(what);                                                      \
        },                                                                                        \
        [&](int group_, unsigned grid_, cudaStream_t st_) {                                        \
            if (group_ == 32)                                                                     \
                streamed<T, 32><<<grid_, ops::BLOCK, 0, st_>>>(desc);                             \
            else                                                                                  \
                streamed<T, ops::BLOCK><<<grid_, ops::BLOCK, 0, st_>>>(desc);                     \
            return ampc_cuda_launched(what);                                                      \
        })

/* ------------------------------------------------------------------------ */
/* Column sums, a pack of columns per thread                                 */
/* ------------------------------------------------------------------------ */

constexpr int PCOL_X = 32, PCOL_Y = 8;  /* block: packs across, rows down */

/* Lanes of a warp that share a pack of columns, each taking every such
 * row: a row narrower than a warp (64 half channels are 8 packs) would
 * leave the other lanes idle. */
static inline int packed_column_groups(int64_t cols, int vec)
{
    const int64_t packs = cols / vec;
    return packs < PCOL_X && PCOL_X % packs == 0 ? (int)(PCOL_X / packs) : 1;
}

/* Chunks of rows: as many as keep about 1024 blocks busy, and a function of
 * the shape alone, so the bits are too. */
static inline int64_t packed_column_chunks(int64_t rows, int64_t cols, int vec)
{
    const int64_t tiles = (cols / vec + PCOL_X - 1) / PCOL_X;
    const int64_t rows_at_once = (int64_t)PCOL_Y * packed_column_groups(cols, vec);
    int64_t chunks = (rows + 2 * rows_at_once - 1) / (2 * rows_at_once);
    const int64_t want = 1024 / tiles > 1 ? 1024 / tiles : 1;
    if (chunks > want)
        chunks = want;
    return chunks > 0 ? chunks : 1;
}

/* The column values of a plain (rows, cols) array: a sum over its rows. */
template <class T>
struct PlainColumns {
    const T *x;
    int64_t cols;
    template <class Values>
    __device__ void operator()(int64_t j, int64_t pack, Values &v) const
    {
        Pack<T> p;
        p.load(x + j * cols + pack * Pack<T>::VEC);
#pragma unroll
        for (int i = 0; i < Pack<T>::VEC; i++)
            v[0][i] = p[i];
    }
};

/* Stage 1 over (rows, cols): block (tile, chunk) adds val(j, pack, out) for
 * its chunk's rows, NVAL sums of VEC columns per thread, into
 * partial[v][chunk][col] (column_finish's layout with outer 1), or with one
 * chunk, scaled, into out0 / out1. */
template <class T, int NVAL, class Val>
__global__ void packed_column_partials(Val val, int64_t rows, int64_t cols, int64_t chunks, int groups,
                                       float *partial, ampc_buf out0, ampc_buf out1, float scale)
{
    constexpr int VEC = Pack<T>::VEC;
    __shared__ float acc[NVAL][PCOL_Y][PCOL_X * VEC + 1];
    const int64_t tiles = (cols / VEC + PCOL_X - 1) / PCOL_X;
    const int64_t tile = blockIdx.x % tiles, c = blockIdx.x / tiles;
    const int width = PCOL_X / groups;  /* packs a tile spans: a warp's lanes are groups x width */
    const int group = threadIdx.x / width;
    const int64_t pack = tile * PCOL_X + threadIdx.x % width;
    const int64_t chunk = (rows + chunks - 1) / chunks;
    const int64_t j0 = c * chunk, j1 = j0 + chunk < rows ? j0 + chunk : rows;
    float s[NVAL][VEC];
#pragma unroll
    for (int v = 0; v < NVAL; v++)
#pragma unroll
        for (int i = 0; i < VEC; i++)
            s[v][i] = 0.0f;
    if (pack * VEC < cols)
#pragma unroll 2
        for (int64_t j = j0 + threadIdx.y * groups + group; j < j1; j += PCOL_Y * groups) {
            float x[NVAL][VEC];
            val(j, pack, x);  /* val's operator() takes the array by reference: no stack */
#pragma unroll
            for (int v = 0; v < NVAL; v++)
#pragma unroll
                for (int i = 0; i < VEC; i++)
                    s[v][i] += x[v][i];
        }
#pragma unroll
    for (int v = 0; v < NVAL; v++)
#pragma unroll
        for (int i = 0; i < VEC; i++)
            acc[v][threadIdx.y][threadIdx.x * VEC + i] = s[v][i];
    __syncthreads();
    /* the block's width * VEC columns, each added over the rows in order
     * (row y, then lane group) */
    for (int t = threadIdx.y * PCOL_X + threadIdx.x; t < NVAL * width * VEC; t += PCOL_X * PCOL_Y) {
        const int v = t / (width * VEC), k = t % (width * VEC);
        const int64_t col = tile * PCOL_X * VEC + k;
        if (col >= cols)
            continue;
        float sum = acc[v][0][k];
        for (int q = 1; q < PCOL_Y * groups; q++)
            sum += acc[v][q / groups][q % groups * width * VEC + k];
        if (chunks > 1)
            partial[((int64_t)v * chunks + c) * cols + col] = sum;
        else if (v == 0)
            store(out0, col, sum * scale);
        else
            store(out1, col, sum * scale);
    }
}

#ifdef __CUDACC__  /* a launch: nvcc's alone (tests/emulated_cuda compiles the rest for the CPU) */
/* Both stages, queued on stream: NVAL column sums of val over (rows, cols)
 * into out0 (and out1), times scale. */
template <class T, int NVAL, class Val>
int packed_column_sums(int device, void *stream, Val val, int64_t rows, int64_t cols, ampc_buf out0, ampc_buf out1,
                       float scale, const char *what)
{
    constexpr int VEC = Pack<T>::VEC;
    const int64_t tiles = (cols / VEC + PCOL_X - 1) / PCOL_X;
    const int64_t chunks = packed_column_chunks(rows, cols, VEC);
    Scratch scratch(device, stream);
    if (chunks > 1) {
        const int got = scratch.get((size_t)(NVAL * chunks * cols) * sizeof(float));
        if (got != AMPC_OK)
            return got;
    }
    packed_column_partials<T, NVAL><<<(unsigned)(tiles * chunks), dim3(PCOL_X, PCOL_Y), 0, as_stream(stream)>>>(
        val, rows, cols, chunks, packed_column_groups(cols, VEC), static_cast<float *>(scratch.ptr), out0, out1,
        scale);
    int status = ampc_cuda_launched(what);
    if (status == AMPC_OK && chunks > 1)
        status = finish_columns<float>(stream, static_cast<const float *>(scratch.ptr), 1, cols, chunks, NVAL, out0,
                                       out1, scale, what);
    return status;
}
#endif /* __CUDACC__ */

}  // namespace ops

#endif /* AMPC_PACKS_CUH */
