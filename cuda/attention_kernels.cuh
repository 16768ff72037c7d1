/*
 * attention_kernels.cuh: the fused attention kernels of attention.cu (see
 * its comment for the algorithm), apart from the host code that launches
 * them, so that tests/emulated_cuda can run this very code on the CPU. It
 * includes nothing itself: the includer brings op_descriptors.h's types, philox.h,
 * packs.cuh's to_float and mma.cuh's instructions (or their CPU models)
 * first.
 */
#ifndef AMPC_ATTENTION_KERNELS_CUH
#define AMPC_ATTENTION_KERNELS_CUH

namespace {

using namespace ops;
using namespace mma_sm80;

constexpr int D = 64;              /* the head dimension served */
constexpr int TILE = 64;           /* rows of a tile: queries or keys */
constexpr int PITCH = D + 8;       /* elements of a tile row in shared memory */
constexpr int WARPS = 4;           /* a warp per 16 rows of the tile */
constexpr int THREADS = 32 * WARPS;
constexpr float LOG2E = 1.4426950408889634f;
constexpr float LN2 = 0.6931471805599453f;

/* The A operand (16 x 16) made of accumulators c[2k] and c[2k + 1]: columns
 * 16k .. 16k + 15 of a warp's 16 rows. */
template <class T>
__device__ __forceinline__ void as_operand(uint32_t (&a)[4], const float (&c0)[4], const float (&c1)[4])
{
    a[0] = pack2<T>(c0[0], c0[1]);
    a[1] = pack2<T>(c0[2], c0[3]);
    a[2] = pack2<T>(c1[0], c1[1]);
    a[3] = pack2<T>(c1[2], c1[3]);
}

/* ------------------------------------------------------------------------ */
/* Tiles                                                                     */
/* ------------------------------------------------------------------------ */

/* Query heads a key/value head serves (grouped-query attention; 1: none). */
__device__ __forceinline__ int64_t group_of(const ampc_attention &a) { return a.heads / a.kv_heads; }

/* The rows of one (batch, head) of an operand. */
template <class T>
struct Rows {
    const T *base;
    int64_t stride;  /* elements from a row to the next */
    int64_t len;

    __device__ Rows(const ampc_attention_arg &x, int64_t batch, int64_t head, int64_t n)
        : base(static_cast<const T *>(x.data) + batch * x.stride[0] + head * x.stride[1]),
          stride(x.stride[2]), len(n)
    {
    }
};

/* The rows of query head `head` of batch `batch` in each operand of the
 * backward pass: its queries and output gradients, and the keys and values
 * of the key/value head its group shares. */
template <class T>
struct Heads {
    Rows<T> q, k, v, dout;

    __device__ Heads(const ampc_attention_backward &b, int64_t batch, int64_t head)
        : q(b.fwd.q, batch, head, b.fwd.q_len), k(b.fwd.k, batch, head / group_of(b.fwd), b.fwd.kv_len),
          v(b.fwd.v, batch, head / group_of(b.fwd), b.fwd.kv_len), dout(b.dout, batch, head, b.fwd.q_len)
    {
    }
};

/* Queue rows [row0, row0 + TILE) into a shared tile (rows past the end: zeros). */
template <class T>
__device__ __forceinline__ void load_tile(T *tile, const Rows<T> &x, int64_t row0)
{
    constexpr int PIECES = D / 8;  /* 16-byte pieces a row */
    for (int i = threadIdx.x; i < TILE * PIECES; i += THREADS) {
        const int r = i / PIECES, c = (i % PIECES) * 8;
        const bool valid = row0 + r < x.len;
        copy16_async(tile + r * PITCH + c, valid ? x.base + (row0 + r) * x.stride + c : x.base, valid);
    }
}

/* A operands of a warp's 16 rows of a tile, all D columns (16 at a time). */
template <class T>
__device__ __forceinline__ void load_operand_rows(uint32_t (&a)[D / 16][4], const T *tile, int row0)
{
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int k = 0; k < D / 16; k++)
        ldmatrix4<false>(a[k], tile + (row0 + lane % 16) * PITCH + k * 16 + (lane / 16) * 8);
}

/* acc (16 x TILE) += a (16 x D) x^T, x a tile of TILE rows of D columns:
 * the scores of a warp's rows against every row of the tile. */
template <class T>
__device__ __forceinline__ void times_rows(float (&acc)[TILE / 8][4], const uint32_t (&a)[D / 16][4], const T *tile)
{
    const int lane = threadIdx.x % 32, m = lane / 8;
#pragma unroll
    for (int k = 0; k < D / 16; k++)
#pragma unroll
        for (int n = 0; n < TILE / 16; n++) {
            uint32_t b[4];
            ldmatrix4<false>(b, tile + (n * 16 + (m / 2) * 8 + lane % 8) * PITCH + k * 16 + (m % 2) * 8);
            mma<T>(acc[2 * n], a[k], b[0], b[1]);
            mma<T>(acc[2 * n + 1], a[k], b[2], b[3]);
        }
}

/* acc (16 x D) += p (16 x TILE, as accumulators) x, x a tile of TILE rows of
 * D columns: probabilities times values, and the like. */
template <class T>
__device__ __forceinline__ void times_tile(float (&acc)[D / 8][4], const float (&p)[TILE / 8][4], const T *tile)
{
    const int lane = threadIdx.x % 32, m = lane / 8;
#pragma unroll
    for (int k = 0; k < TILE / 16; k++) {
        uint32_t a[4];
        as_operand<T>(a, p[2 * k], p[2 * k + 1]);
#pragma unroll
        for (int n = 0; n < D / 16; n++) {
            uint32_t b[4];
            ldmatrix4<true>(b, tile + (k * 16 + (m % 2) * 8 + lane % 8) * PITCH + n * 16 + (m / 2) * 8);
            mma<T>(acc[2 * n], a, b[0], b[1]);
            mma<T>(acc[2 * n + 1], a, b[2], b[3]);
        }
    }
}

template <int N>
__device__ __forceinline__ void zero(float (&acc)[N][4])
{
#pragma unroll
    for (int i = 0; i < N; i++)
        acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
}

/* Store a warp's 16 x D accumulators, times `scale`, as rows row0.. of an
 * operand (rows past len are not written). */
template <class T>
__device__ __forceinline__ void store_rows(const ampc_attention_arg &x, int64_t batch, int64_t head, int64_t len,
                                           int64_t row0, const float (&acc)[D / 8][4], float scale0, float scale1)
{
    const int lane = threadIdx.x % 32;
    T *base = static_cast<T *>(x.data) + batch * x.stride[0] + head * x.stride[1];
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int64_t row = row0 + lane / 4 + 8 * half;
        if (row >= len)
            continue;
        const float s = half ? scale1 : scale0;
        uint32_t *out = reinterpret_cast<uint32_t *>(base + row * x.stride[2] + 2 * (lane % 4));
#pragma unroll
        for (int n = 0; n < D / 8; n++)
            out[n * 4] = pack2<T>(acc[n][2 * half] * s, acc[n][2 * half + 1] * s);
    }
}

/* The keys queries q0 .. q0 + TILE - 1 see: all, or causally those up to the last query. */
__device__ __forceinline__ int64_t visible_keys(const ampc_attention &a, int64_t q0)
{
    return a.causal && q0 + TILE < a.kv_len ? q0 + TILE : a.kv_len;
}

/* Whether key `key` counts for query `query`. */
__device__ __forceinline__ bool visible(const ampc_attention &a, int64_t query, int64_t key)
{
    return key < a.kv_len && (!a.causal || key <= query);
}

/* ------------------------------------------------------------------------ */
/* Dropout                                                                   */
/* ------------------------------------------------------------------------ */

/* The composed attention's mask, so that both drop the same elements:
 * element i of head bh's probabilities is i = (bh * q_len + query) * kv_len
 * + key in the draw, and word i % 4 of Philox block offset + i / 4 decides
 * it (philox.h). A lane's elements of a tile are bits n * 4 + e of a
 * 32-bit mask (accumulator n, element e). The kernels take DROP as a
 * template argument: without dropout they keep none of its registers. */

__device__ __forceinline__ uint32_t word(const ampc_philox_block &r, int w)
{
    return w == 0 ? r.v[0] : w == 1 ? r.v[1] : w == 2 ? r.v[2] : r.v[3];
}

/* Keep bits of elements i and i + 1 of the draw (bit 0, bit 1). */
__device__ __forceinline__ uint32_t keep_pair(const ampc_attention &a, uint64_t i)
{
    const int w = (int)(i % 4);
    const ampc_philox_block r = ampc_philox(a.seed, a.offset + i / 4);
    const uint32_t next = w < 3 ? word(r, w + 1) : ampc_philox(a.seed, a.offset + i / 4 + 1).v[0];
    return (uint32_t)ampc_philox_keep(word(r, w), a.keep_below) | (uint32_t)ampc_philox_keep(next, a.keep_below) << 1;
}

/* A warp whose rows are queries (row0, row0 + 8: the lane's) and columns
 * keys (key0 + n * 8 and the next: the lane's). */
__device__ __forceinline__ uint32_t keep_by_query(const ampc_attention &a, int64_t bh, int64_t row0, int64_t key0)
{
    uint32_t bits = 0;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const uint64_t at = (uint64_t)((bh * a.q_len + row0 + 8 * h) * a.kv_len + key0);
#pragma unroll
        for (int n = 0; n < TILE / 8; n++)
            bits |= keep_pair(a, at + n * 8) << (n * 4 + 2 * h);
    }
    return bits;
}

/* A warp whose rows are keys (key, key + 8: the lane's) and columns queries
 * (query0 + n * 8 and the next): the transpose, a block a element. */
__device__ __forceinline__ uint32_t keep_by_key(const ampc_attention &a, int64_t bh, int64_t key, int64_t query0)
{
    uint32_t bits = 0;
#pragma unroll
    for (int h = 0; h < 2; h++)
#pragma unroll
        for (int n = 0; n < TILE / 8; n++)
#pragma unroll
            for (int c = 0; c < 2; c++) {
                const uint64_t i = (uint64_t)((bh * a.q_len + query0 + n * 8 + c) * a.kv_len + key + 8 * h);
                const ampc_philox_block r = ampc_philox(a.seed, a.offset + i / 4);
                bits |= (uint32_t)ampc_philox_keep(word(r, (int)(i % 4)), a.keep_below) << (n * 4 + 2 * h + c);
            }
    return bits;
}

/* p times the dropout factor: keep_scale where kept, 0 where dropped. */
__device__ __forceinline__ void apply_keep(float (&p)[TILE / 8][4], uint32_t keep, float kept)
{
#pragma unroll
    for (int n = 0; n < TILE / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            p[n][e] = keep >> (n * 4 + e) & 1 ? p[n][e] * kept : 0.0f;
}

/* ------------------------------------------------------------------------ */
/* Forward                                                                   */
/* ------------------------------------------------------------------------ */

/* A block per (64 queries, batch * head); the causal diagonal's longest
 * rows first. Three blocks a multiprocessor (their 46 KB of shared memory
 * each allow it): without the bound ptxas kept to 128 registers and
 * spilled. */
template <class T, bool DROP>
__global__ void __launch_bounds__(THREADS, 3) forward_kernel(ampc_attention a)
{
    __shared__ __align__(16) T sq[TILE * PITCH];
    __shared__ __align__(16) T sk[2][TILE * PITCH];
    __shared__ __align__(16) T sv[2][TILE * PITCH];
    const int64_t bh = blockIdx.y, batch = bh / a.heads, head = bh % a.heads;
    const int64_t q0 = (int64_t)(gridDim.x - 1 - blockIdx.x) * TILE;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const Rows<T> q(a.q, batch, head, a.q_len), k(a.k, batch, head / group_of(a), a.kv_len),
        v(a.v, batch, head / group_of(a), a.kv_len);
    const int blocks = (int)((visible_keys(a, q0) + TILE - 1) / TILE);
    const float scale = a.scale * LOG2E;

    load_tile(sq, q, q0);
    load_tile(sk[0], k, 0);
    load_tile(sv[0], v, 0);
    async_commit();

    uint32_t qa[D / 16][4];
    float o[D / 8][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    zero(o);
    const int64_t row0 = q0 + warp * 16 + lane / 4;  /* this lane's rows: row0, row0 + 8 */
    for (int j = 0; j < blocks; j++) {
        if (j + 1 < blocks) {  /* the next keys and values load while these are used */
            load_tile(sk[(j + 1) & 1], k, (int64_t)(j + 1) * TILE);
            load_tile(sv[(j + 1) & 1], v, (int64_t)(j + 1) * TILE);
            async_commit();
            async_wait<1>();
        }
        else {
            async_wait<0>();
        }
        __syncthreads();
        if (j == 0)
            load_operand_rows(qa, sq, warp * 16);
        float s[TILE / 8][4];
        zero(s);
        times_rows<T>(s, qa, sk[j & 1]);

        const int64_t kb = (int64_t)j * TILE, key0 = kb + 2 * (lane % 4);
        const bool edge = kb + TILE > a.kv_len || (a.causal && kb + TILE - 1 > q0 + warp * 16);
#pragma unroll
        for (int n = 0; n < TILE / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                s[n][e] = !edge || visible(a, row0 + 8 * (e / 2), key0 + n * 8 + e % 2) ? s[n][e] * scale : -INFINITY;

#pragma unroll
        for (int h = 0; h < 2; h++) {  /* rows row0 and row0 + 8 */
            float mx = m[h];
#pragma unroll
            for (int n = 0; n < TILE / 8; n++)
                mx = fmaxf(mx, fmaxf(s[n][2 * h], s[n][2 * h + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float base = mx == -INFINITY ? 0.0f : mx;  /* a row with nothing visible yet */
            const float rescale = exp2f(m[h] - base);
            m[h] = mx;
            float sum = 0.0f;
#pragma unroll
            for (int n = 0; n < TILE / 8; n++) {
                s[n][2 * h] = exp2f(s[n][2 * h] - base);
                s[n][2 * h + 1] = exp2f(s[n][2 * h + 1] - base);
                sum += s[n][2 * h] + s[n][2 * h + 1];
            }
            l[h] = l[h] * rescale + sum;  /* this lane's share; the row's four lanes add up at the end */
#pragma unroll
            for (int n = 0; n < D / 8; n++) {
                o[n][2 * h] *= rescale;
                o[n][2 * h + 1] *= rescale;
            }
        }
        if constexpr (DROP)  /* l has summed the probabilities whole; o takes them dropped */
            apply_keep(s, keep_by_query(a, bh, row0, key0), a.keep_scale);
        times_tile<T>(o, s, sv[j & 1]);
        __syncthreads();  /* before the next iteration's loads overwrite this stage */
    }

    float inv[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
        inv[h] = 1.0f / l[h];
        const int64_t row = row0 + 8 * h;
        if (lane % 4 == 0 && row < a.q_len)
            a.lse[bh * a.q_len + row] = (m[h] + log2f(l[h])) * LN2;
    }
    store_rows<T>(a.o, batch, head, a.q_len, q0 + warp * 16, o, inv[0], inv[1]);
}

/* ------------------------------------------------------------------------ */
/* Backward                                                                  */
/* ------------------------------------------------------------------------ */

/* delta[bh * q_len + i] = sum_d dout[i][d] * o[i][d]: a warp per row. */
template <class T>
__global__ void __launch_bounds__(THREADS) delta_kernel(ampc_attention_backward b, float *delta)
{
    const ampc_attention &a = b.fwd;
    const int64_t rows = a.batch * a.heads * a.q_len;
    const int lane = threadIdx.x % 32;
    for (int64_t r = ((int64_t)blockIdx.x * THREADS + threadIdx.x) / 32; r < rows; r += (int64_t)gridDim.x * WARPS) {
        const int64_t bh = r / a.q_len, i = r % a.q_len;
        const int64_t batch = bh / a.heads, head = bh % a.heads;
        const Rows<T> dout(b.dout, batch, head, a.q_len), o(a.o, batch, head, a.q_len);
        float sum = 0.0f;
        for (int d = lane; d < D; d += 32)
            sum += to_float(dout.base[i * dout.stride + d]) * to_float(o.base[i * o.stride + d]);
#pragma unroll
        for (int off = 16; off > 0; off /= 2)
            sum += __shfl_xor_sync(0xffffffffu, sum, off);
        if (lane == 0)
            delta[r] = sum;
    }
}

/* ds = p (z a x^T - delta): the gradient of a warp's 16 x TILE scores from
 * their probabilities p and the gradient of the dropped probabilities a x^T
 * (x a tile of TILE rows), z dropout's factor (bits `keep` of the lane's
 * elements, each kept one times `kept`); delta_at(n, e) is delta for
 * element e of accumulator n. */
template <class T, class Delta>
__device__ __forceinline__ void score_gradients(float (&ds)[TILE / 8][4], const float (&p)[TILE / 8][4],
                                                const uint32_t (&a)[D / 16][4], const T *tile, uint32_t keep,
                                                float kept, Delta delta_at)
{
    zero(ds);
    times_rows<T>(ds, a, tile);
#pragma unroll
    for (int n = 0; n < TILE / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            ds[n][e] = p[n][e] * ((keep >> (n * 4 + e) & 1 ? kept : 0.0f) * ds[n][e] - delta_at(n, e));
}

/* A backward block's shared tiles: two stages of the two operands it walks
 * (queries and their output gradients, or keys and values), so that the next
 * tiles load while these are used. The rows the block keeps load into the
 * second stage first; once their A operands are in registers, the stage is
 * free. */
template <class T>
struct __align__(16) BackwardTiles {
    T x[2][TILE * PITCH], y[2][TILE * PITCH];
};

/* Queue tiles of rows row0.. of x and y into stage `stage` (one cp.async group). */
template <class T>
__device__ __forceinline__ void stage_tiles(BackwardTiles<T> &s, int stage, const Rows<T> &x, const Rows<T> &y,
                                            int64_t row0)
{
    load_tile(s.x[stage], x, row0);
    load_tile(s.y[stage], y, row0);
    async_commit();
}

/* Wait for the current stage (the next one stays in flight where `more`),
 * and make it visible to the block. */
__device__ __forceinline__ void stage_ready(bool more)
{
    if (more)
        async_wait<1>();
    else
        async_wait<0>();
    __syncthreads();
}

/* The rows a backward block keeps (rows row0.. of x and y): loaded through
 * stage 1, the A operands of this warp's 16 rows of each taken into
 * registers; the stage is free again afterwards. */
template <class T>
__device__ __forceinline__ void keep_rows(uint32_t (&xa)[D / 16][4], uint32_t (&ya)[D / 16][4], BackwardTiles<T> &s,
                                          const Rows<T> &x, const Rows<T> &y, int64_t row0)
{
    stage_tiles(s, 1, x, y, row0);
    stage_ready(false);
    load_operand_rows(xa, s.x[1], threadIdx.x / 32 * 16);
    load_operand_rows(ya, s.y[1], threadIdx.x / 32 * 16);
    __syncthreads();  /* every warp has its operands */
}

/* dK and dV of 64 keys: a block per (64 keys, batch * key/value head),
 * walking the queries that see them, of every query head of its group. */
template <class T, bool DROP>
__global__ void __launch_bounds__(THREADS) dkdv_kernel(ampc_attention_backward b, const float *delta)
{
    __shared__ BackwardTiles<T> s;  /* x: queries, y: their output gradients */
    __shared__ float slse[2][TILE], sdelta[2][TILE];
    const ampc_attention &a = b.fwd;
    const int64_t group = group_of(a), batch = blockIdx.y / a.kv_heads, kv_head = blockIdx.y % a.kv_heads;
    const int64_t k0 = (int64_t)blockIdx.x * TILE;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const float scale = a.scale * LOG2E;
    uint32_t ka[D / 16][4], va[D / 16][4];
    const Heads<T> group_head(b, batch, kv_head * group);
    keep_rows(ka, va, s, group_head.k, group_head.v, k0);

    /* The steps: every query head of the group, every tile of its queries
     * that see these keys. Step `step` queued into `stage`, with the queries'
     * lse (past the end: +inf, probabilities 0) and delta. */
    const int64_t first = a.causal ? k0 : 0;
    const int64_t tiles = first < a.q_len ? (a.q_len - first + TILE - 1) / TILE : 0, steps = group * tiles;
    const auto stage_step = [&](int stage, int64_t step) {
        const int64_t head = kv_head * group + step / tiles, q0 = first + step % tiles * TILE;
        const Heads<T> rows(b, batch, head);
        stage_tiles(s, stage, rows.q, rows.dout, q0);
        const int64_t at = (batch * a.heads + head) * a.q_len + q0;
        for (int i = threadIdx.x; i < TILE; i += THREADS) {
            const bool valid = q0 + i < a.q_len;
            slse[stage][i] = valid ? a.lse[at + i] * LOG2E : INFINITY;
            sdelta[stage][i] = valid ? delta[at + i] : 0.0f;
        }
    };
    float dk[D / 8][4], dv[D / 8][4];
    zero(dk);
    zero(dv);
    const int64_t key = k0 + warp * 16 + lane / 4;  /* this lane's keys: key, key + 8 */
    if (steps > 0)
        stage_step(0, 0);
    int st = 0;
    for (int64_t step = 0; step < steps; step++, st ^= 1) {
        const bool more = step + 1 < steps;
        if (more)  /* the next queries load while these are used */
            stage_step(st ^ 1, step + 1);
        stage_ready(more);
        const int64_t q0 = first + step % tiles * TILE;
        const T *sq = s.x[st], *sdo = s.y[st];
        const float *sl = slse[st], *sd = sdelta[st];

        float p[TILE / 8][4];  /* P^T: this warp's 16 keys x 64 queries */
        zero(p);
        times_rows<T>(p, ka, sq);
        const int64_t query0 = q0 + 2 * (lane % 4);
        const bool edge = a.causal && k0 + warp * 16 + 15 > q0;
#pragma unroll
        for (int n = 0; n < TILE / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int c = n * 8 + 2 * (lane % 4) + e % 2;
                p[n][e] = !edge || key + 8 * (e / 2) <= query0 + n * 8 + e % 2 ? exp2f(p[n][e] * scale - sl[c])
                                                                                 : 0.0f;
            }
        const int64_t bh = batch * a.heads + kv_head * group + step / tiles;  /* the query head */
        const uint32_t keep = DROP ? keep_by_key(a, bh, key, query0) : ~0u;
        const float kept = DROP ? a.keep_scale : 1.0f;
        float ds[TILE / 8][4];  /* dS^T = P^T (Z^T V dout^T - delta), delta by query (column) */
        score_gradients<T>(ds, p, va, sdo, keep, kept,
                           [&](int n, int e) { return sd[n * 8 + 2 * (lane % 4) + e % 2]; });
        if constexpr (DROP)
            apply_keep(p, keep, kept);  /* dV takes the probabilities dropped */
        times_tile<T>(dv, p, sdo);
        times_tile<T>(dk, ds, sq);
        __syncthreads();  /* every warp is done with this stage before it is loaded again */
    }
    store_rows<T>(b.dk, batch, kv_head, a.kv_len, k0 + warp * 16, dk, a.scale, a.scale);
    store_rows<T>(b.dv, batch, kv_head, a.kv_len, k0 + warp * 16, dv, 1.0f, 1.0f);
}

/* dQ of 64 queries: a block per (64 queries, batch * head), walking the
 * keys they see. */
template <class T, bool DROP>
__global__ void __launch_bounds__(THREADS) dq_kernel(ampc_attention_backward b, const float *delta)
{
    __shared__ BackwardTiles<T> s;  /* x: keys, y: values */
    const ampc_attention &a = b.fwd;
    const int64_t bh = blockIdx.y, q0 = (int64_t)(gridDim.x - 1 - blockIdx.x) * TILE;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const Heads<T> rows(b, bh / a.heads, bh % a.heads);
    const float scale = a.scale * LOG2E;
    uint32_t qa[D / 16][4], doa[D / 16][4];
    keep_rows(qa, doa, s, rows.q, rows.dout, q0);
    const int64_t row0 = q0 + warp * 16 + lane / 4;  /* this lane's queries: row0, row0 + 8 */
    float lse[2], dl[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const bool valid = row0 + 8 * h < a.q_len;
        lse[h] = valid ? a.lse[bh * a.q_len + row0 + 8 * h] * LOG2E : INFINITY;
        dl[h] = valid ? delta[bh * a.q_len + row0 + 8 * h] : 0.0f;
    }

    float dq[D / 8][4];
    zero(dq);
    const int64_t keys = visible_keys(a, q0);
    stage_tiles(s, 0, rows.k, rows.v, 0);
    int st = 0;
    for (int64_t k0 = 0; k0 < keys; k0 += TILE, st ^= 1) {
        const bool more = k0 + TILE < keys;
        if (more)  /* the next keys and values load while these are used */
            stage_tiles(s, st ^ 1, rows.k, rows.v, k0 + TILE);
        stage_ready(more);
        const T *sk = s.x[st], *sv = s.y[st];

        float p[TILE / 8][4];
        zero(p);
        times_rows<T>(p, qa, sk);
        const int64_t key0 = k0 + 2 * (lane % 4);
        const bool edge = k0 + TILE > a.kv_len || (a.causal && k0 + TILE - 1 > q0 + warp * 16);
#pragma unroll
        for (int n = 0; n < TILE / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                p[n][e] = !edge || visible(a, row0 + 8 * (e / 2), key0 + n * 8 + e % 2)
                              ? exp2f(p[n][e] * scale - lse[e / 2])
                              : 0.0f;
        float ds[TILE / 8][4];  /* dS = P (dout V^T - delta), delta by query (row) */
        const uint32_t keep = DROP ? keep_by_query(a, bh, row0, key0) : ~0u;
        score_gradients<T>(ds, p, doa, sv, keep, DROP ? a.keep_scale : 1.0f,
                           [&](int, int e) { return dl[e / 2]; });
        times_tile<T>(dq, ds, sk);
        __syncthreads();  /* every warp is done with this stage before it is loaded again */
    }
    store_rows<T>(b.dq, bh / a.heads, bh % a.heads, a.q_len, q0 + warp * 16, dq, a.scale, a.scale);
}

}  // namespace

#endif /* AMPC_ATTENTION_KERNELS_CUH */
