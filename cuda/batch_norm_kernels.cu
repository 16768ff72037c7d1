/*
 * batch_norm_kernels.cu: training batch norm, ampc's own kernels, over
 * channels-last data and over dense NCHW data (cuDNN's legacy persistent
 * mode measured 20-60 times slower than torch's channels-last kernels on
 * the H200, and its NCHW kernels took 40 of a ResNet-50 step's 87 ms).
 *
 * Channels-last data is a (rows = n * h * w, c) matrix, so every per-channel
 * statistic is a column reduction, a pack of channels per thread in two
 * fixed-order stages (packs.cuh's layout): the forward runs Welford's mean
 * and sum of squared deviations in one pass (no cancellation, and one read
 * of x fewer than a mean pass then a deviations pass), merged by Chan's
 * formula, then writes (x - mean) * rstd * w + b; the backward takes sum(dy)
 * and sum(dy * xhat) in one pass and writes dx (the CPU kernel's formulas,
 * spatial_real.inc). Channels must come in whole 16-byte packs.
 *
 * NCHW data is n * c planes of h * w contiguous elements: a row group per
 * plane (for short planes, a block per chunk of images and run of a pack's
 * worth of channels, through shared memory, or a warp per run of
 * consecutive images' planes of one channel) takes their mean and sum of
 * squared deviations about it (two passes, the second from cache), or the
 * two gradient sums, with the row kernels' 16-byte streaming (packs.cuh)
 * for whole planes; these are then merged per channel in image order, by
 * Chan's formula for the moments, so the results repeat bit for bit.
 * On sm_90 a channel short enough is instead held on chip by a cluster of
 * blocks and read once (Held, below). Planes of fewer than 16 elements go
 * to cuDNN.
 */
#include <cooperative_groups.h>
#include <type_traits>
#include <utility>

#include "packs.cuh"

namespace {

using namespace ops;

template <class T>
struct DyAndDyXc {  /* dy, dy * (x - mean) */
    const T *dy, *x;
    const float *mean;
    int64_t c;
    template <class V>
    __device__ void operator()(int64_t j, int64_t pack, V &v) const
    {
        Pack<T> d, p;
        d.load(dy + j * c + pack * Pack<T>::VEC);
        p.load(x + j * c + pack * Pack<T>::VEC);
#pragma unroll
        for (int i = 0; i < Pack<T>::VEC; i++) {
            v[0][i] = d[i];
            v[1][i] = d[i] * (p[i] - mean[pack * Pack<T>::VEC + i]);
        }
    }
};

/* Welford's running mean and sum of squared deviations, one pass, merged by
 * Chan's formula: (n, mean, m2) += (nb, mean_b, m2_b). */
__device__ __forceinline__ void merge(float &n, float &mean, float &m2, float nb, float mean_b, float m2_b)
{
    if (nb == 0.0f)
        return;
    const float total = n + nb, delta = mean_b - mean, w = nb / total;
    mean += delta * w;
    m2 += m2_b + delta * delta * n * w;
    n = total;
}

/* Stage 1 over the (rows, c) matrix: block (tile, chunk), as packed_column_partials lays it out,
 * each thread running Welford over its rows for a pack of channels, the block's threads merged
 * in a fixed order (row lane, then lane group) into mean[chunk][ch] and m2[chunk][ch]. */
template <class T>
__global__ void __launch_bounds__(PCOL_X *PCOL_Y)
    welford_partials(const T *x, int64_t rows, int64_t cols, int64_t chunks, int groups, float *part_mean,
                     float *part_m2)
{
    constexpr int VEC = Pack<T>::VEC;
    __shared__ float s_mean[PCOL_Y][PCOL_X * VEC + 1], s_m2[PCOL_Y][PCOL_X * VEC + 1], s_n[PCOL_Y][PCOL_X];
    const int64_t tiles = (cols / VEC + PCOL_X - 1) / PCOL_X;
    const int64_t tile = blockIdx.x % tiles, c = blockIdx.x / tiles;
    const int width = PCOL_X / groups, group = threadIdx.x / width;
    const int64_t pack = tile * PCOL_X + threadIdx.x % width;
    const int64_t chunk = (rows + chunks - 1) / chunks;
    const int64_t j0 = c * chunk, j1 = j0 + chunk < rows ? j0 + chunk : rows;
    float n = 0.0f, mean[VEC], m2[VEC];
#pragma unroll
    for (int i = 0; i < VEC; i++)
        mean[i] = m2[i] = 0.0f;
    /* UNROLL rows' packs loaded before any is used: one load in flight a thread left the
     * statistics pass latency-bound; the rows still enter Welford's sums in order */
    constexpr int UNROLL = 4;
    const int64_t step = PCOL_Y * groups;
    if (pack * VEC < cols)
        for (int64_t j = j0 + threadIdx.y * groups + group; j < j1; j += UNROLL * step) {
            Pack<T> p[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; u++)
                if (j + u * step < j1)
                    p[u].load(x + (j + u * step) * cols + pack * VEC);
#pragma unroll
            for (int u = 0; u < UNROLL; u++)
                if (j + u * step < j1) {
                    n += 1.0f;
                    const float inv = 1.0f / n;
#pragma unroll
                    for (int i = 0; i < VEC; i++) {
                        const float d = p[u][i] - mean[i];
                        mean[i] += d * inv;
                        m2[i] += d * (p[u][i] - mean[i]);
                    }
                }
        }
#pragma unroll
    for (int i = 0; i < VEC; i++) {
        s_mean[threadIdx.y][threadIdx.x * VEC + i] = mean[i];
        s_m2[threadIdx.y][threadIdx.x * VEC + i] = m2[i];
    }
    s_n[threadIdx.y][threadIdx.x] = n;
    __syncthreads();
    for (int k = threadIdx.y * PCOL_X + threadIdx.x; k < width * VEC; k += PCOL_X * PCOL_Y) {
        const int64_t col = tile * PCOL_X * VEC + k;
        if (col >= cols)
            continue;
        float tn = 0.0f, tmean = 0.0f, tm2 = 0.0f;
        for (int q = 0; q < PCOL_Y * groups; q++) {
            const int r = q / groups, slot = q % groups * width * VEC + k;
            merge(tn, tmean, tm2, s_n[r][slot / VEC], s_mean[r][slot], s_m2[r][slot]);
        }
        part_mean[c * cols + col] = tmean;
        part_m2[c * cols + col] = tm2;
    }
}

/* Normalize's scale and bias at a channel, y = (x - mean) * scale + bias,
 * from its sum of squared deviations over `count` values; where `record`,
 * its batch statistics stored too: save_mean and save_rstd, and the running
 * averages (the unbiased variance, as the CPU kernel). */
__device__ void channel_statistics(const ampc_batch_norm &b, int64_t ch, float mean, float m2, int64_t count,
                                   bool record, float &scale, float &bias)
{
    const float *w = static_cast<const float *>(b.weight.data), *beta = static_cast<const float *>(b.bias.data);
    const float rstd = 1.0f / sqrtf(m2 / (float)count + (float)b.eps);
    scale = (w != nullptr ? w[ch] : 1.0f) * rstd;
    bias = beta != nullptr ? beta[ch] : 0.0f;
    if (!record)
        return;
    static_cast<float *>(b.save_mean.data)[ch] = mean;
    static_cast<float *>(b.save_rstd.data)[ch] = rstd;
    const float momentum = (float)b.momentum;
    if (b.running_mean.data != nullptr) {
        float *rm = static_cast<float *>(b.running_mean.data) + ch;
        *rm = (1.0f - momentum) * *rm + momentum * mean;
    }
    if (b.running_var.data != nullptr) {
        float *rv = static_cast<float *>(b.running_var.data) + ch;
        const float unbiased = count > 1 ? m2 / (float)(count - 1) : NAN;
        *rv = (1.0f - momentum) * *rv + momentum * unbiased;
    }
}

/* Stage 2 per channel: the chunks (`chunk` of the `rows` values each, the last ones short or
 * empty) merged in a fixed order (FINISH_Y threads each take every FINISH_Y-th chunk, then their
 * results merge in y order); then channel_statistics. */
__global__ void __launch_bounds__(FINISH_X *FINISH_Y)
    welford_finish(ampc_batch_norm b, const float *part_mean, const float *part_m2, int64_t rows, int64_t chunks,
                   int64_t chunk, float *scale, float *bias_of)
{
    __shared__ float s_n[FINISH_Y][FINISH_X], s_mean[FINISH_Y][FINISH_X], s_m2[FINISH_Y][FINISH_X];
    for (int64_t c0 = (int64_t)blockIdx.x * FINISH_X; c0 < b.c; c0 += (int64_t)gridDim.x * FINISH_X) {
        const int64_t ch = c0 + threadIdx.x;
        float n = 0.0f, mean = 0.0f, m2 = 0.0f;
        /* UNROLL chunks' partials loaded before they are merged, in order: a load, then a merge
         * waiting on it, took 28 us over 1024 chunks of 64 channels (8 % of the 112^2 forward) */
        constexpr int UNROLL = 8;
        if (ch < b.c)
            for (int64_t first = threadIdx.y; first < chunks; first += UNROLL * FINISH_Y) {
                float pm[UNROLL], pq[UNROLL];
#pragma unroll
                for (int u = 0; u < UNROLL; u++) {
                    const int64_t c = first + u * FINISH_Y;
                    if (c < chunks) {
                        pm[u] = part_mean[c * b.c + ch];
                        pq[u] = part_m2[c * b.c + ch];
                    }
                }
#pragma unroll
                for (int u = 0; u < UNROLL; u++) {
                    const int64_t c = first + u * FINISH_Y, left = rows - c * chunk;  /* the last may be short, or empty */
                    if (c < chunks)
                        merge(n, mean, m2, (float)(left < chunk ? (left > 0 ? left : 0) : chunk), pm[u], pq[u]);
                }
            }
        s_n[threadIdx.y][threadIdx.x] = n;
        s_mean[threadIdx.y][threadIdx.x] = mean;
        s_m2[threadIdx.y][threadIdx.x] = m2;
        __syncthreads();
        if (threadIdx.y == 0 && ch < b.c) {
            for (int r = 1; r < FINISH_Y; r++)
                merge(n, mean, m2, s_n[r][threadIdx.x], s_mean[r][threadIdx.x], s_m2[r][threadIdx.x]);
            channel_statistics(b, ch, mean, m2, rows, true, scale[ch], bias_of[ch]);
        }
        __syncthreads();
    }
}

/* VEC per-channel values from c0 (a multiple of 4 on a 16-byte boundary):
 * a few vector loads where a scalar load per element and array kept the
 * elementwise kernels at 15 % of the memory bandwidth (bound by the load
 * unit). */
template <int VEC>
__device__ __forceinline__ void load_channels(const float *p, int64_t c0, float (&v)[VEC])
{
#pragma unroll
    for (int i = 0; i < VEC; i += 4) {
        const float4 f = __ldg(reinterpret_cast<const float4 *>(p + c0 + i));
        v[i] = f.x, v[i + 1] = f.y, v[i + 2] = f.z, v[i + 3] = f.w;
    }
}

/* The first pack of a thread of the elementwise passes (normalize, the
 * input gradient), whose blocks start from the end of the array: the
 * statistics pass before them read it first to last, so its end is what
 * the L2 still holds (50 MB on an H100: most of a 7x7 stage's 51 MB in 16
 * bits; 3-6 % off those passes on an H200). Blocks are dispatched in index
 * order; the grid still covers every pack. */
__device__ __forceinline__ int64_t last_blocks_first()
{
    return (int64_t)(gridDim.x - 1 - blockIdx.x) * blockDim.x + threadIdx.x;
}

template <class T>
__global__ void normalize(ampc_batch_norm b, int64_t packs, const float *scale, const float *bias)
{
    constexpr int VEC = Pack<T>::VEC;
    const int64_t per_row = b.c / VEC;
    for (int64_t q = last_blocks_first(); q < packs; q += (int64_t)gridDim.x * blockDim.x) {
        const int64_t c0 = q % per_row * VEC;
        Pack<T> x, y;
        float k[VEC], m[VEC], mu[VEC];
        x.load(static_cast<const T *>(b.x.data) + q * VEC);
        load_channels<VEC>(scale, c0, k);
        load_channels<VEC>(bias, c0, m);
        load_channels<VEC>(static_cast<const float *>(b.save_mean.data), c0, mu);
        /* (x - mean) * scale + bias: x * scale + (bias - mean * scale) cancels where the mean is
         * large against the spread (the CPU kernel's form, spatial_real.inc) */
#pragma unroll
        for (int i = 0; i < VEC; i++)
            y.set(i, (x[i] - mu[i]) * k[i] + m[i]);
        y.store(static_cast<T *>(b.y.data) + q * VEC);
    }
}

/* The input gradient's per-channel terms, dx = k * (dy - mean_dy - (x - mean) * proj). */
struct GradTerms {
    float *k, *mean_dy, *proj, *mean;
};

/* The input gradient's terms k, mean_dy and proj at channel ch, from the
 * sums; where `record`, dweight = sum(dy * (x - mean)) * rstd and
 * dbias = sum(dy) stored too. */
__device__ void channel_gradient(const ampc_batch_norm_backward &b, int64_t ch, float sum_dy, float sum_dy_xc,
                                 int64_t count, bool record, float &k, float &mean_dy, float &proj)
{
    const float *w = static_cast<const float *>(b.weight.data);
    const float rstd = static_cast<const float *>(b.save_rstd.data)[ch];
    if (record && b.dweight.data != nullptr)
        static_cast<float *>(b.dweight.data)[ch] = sum_dy_xc * rstd;
    if (record && b.dbias.data != nullptr)
        static_cast<float *>(b.dbias.data)[ch] = sum_dy;
    k = (w != nullptr ? w[ch] : 1.0f) * rstd;
    mean_dy = sum_dy / (float)count;
    proj = sum_dy_xc / (float)count * rstd * rstd;
}

/* channel_gradient over every channel, from the sums, its terms stored. */
__global__ void channel_gradients(ampc_batch_norm_backward b, const float *sum_dy, const float *sum_dy_xc,
                                  int64_t count, GradTerms terms)
{
    for (int64_t ch = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; ch < b.c; ch += (int64_t)gridDim.x * blockDim.x) {
        channel_gradient(b, ch, sum_dy[ch], sum_dy_xc[ch], count, true, terms.k[ch], terms.mean_dy[ch], terms.proj[ch]);
        terms.mean[ch] = static_cast<const float *>(b.save_mean.data)[ch];
    }
}

template <class T>
__global__ void input_gradient(ampc_batch_norm_backward b, GradTerms terms, int64_t packs)
{
    constexpr int VEC = Pack<T>::VEC;
    const int64_t per_row = b.c / VEC;
    for (int64_t q = last_blocks_first(); q < packs; q += (int64_t)gridDim.x * blockDim.x) {
        const int64_t c0 = q % per_row * VEC;
        Pack<T> dy, x, dx;
        float k[VEC], mean_dy[VEC], proj[VEC], mean[VEC];
        dy.load(static_cast<const T *>(b.dy.data) + q * VEC);
        x.load(static_cast<const T *>(b.x.data) + q * VEC);
        load_channels<VEC>(terms.k, c0, k);
        load_channels<VEC>(terms.mean_dy, c0, mean_dy);
        load_channels<VEC>(terms.proj, c0, proj);
        load_channels<VEC>(terms.mean, c0, mean);
#pragma unroll
        for (int i = 0; i < VEC; i++)
            dx.set(i, k[i] * (dy[i] - mean_dy[i] - (x[i] - mean[i]) * proj[i]));
        dx.store(static_cast<T *>(b.dx.data) + q * VEC);
    }
}

/* ------------------------------------------------------------------------ */
/* NCHW: a row group per plane, or a warp per run of planes                 */
/* ------------------------------------------------------------------------ */

/* Planes of this many elements or more are streamed, a row group per plane.
 * Shorter ones are taken a run of planes of one channel per warp, and their
 * elementwise passes run flat over the array: a warp per 7x7 plane left a
 * third of its lanes idle and spent more on its reductions than on its
 * loads (ResNet-50's last stage ran at a tenth of the bandwidth, five times
 * slower than cuDNN). */
constexpr int64_t STREAM_PLANES_FROM = 512;
constexpr int64_t RUN_ELEMENTS = 1024;  /* a run: at most this many elements of its channel */

/* NCHW data as chunks of `images` consecutive images (one when streamed),
 * the unit (chunk, channel) numbered chunk * c + channel: the chunk-major
 * layout welford_finish and channel_sums merge in chunk order. */
struct Planes {
    int64_t n, c, hw, images;

    static Planes of(int64_t n, int64_t c, int64_t hw)
    {
        const int64_t images = hw >= STREAM_PLANES_FROM ? 1 : RUN_ELEMENTS / hw;  /* 2 or more */
        return Planes{n, c, hw, images < n ? images : n};
    }
    __host__ __device__ bool streamed() const { return hw >= STREAM_PLANES_FROM; }
    __host__ __device__ int64_t chunks() const { return (n + images - 1) / images; }
    __host__ __device__ int64_t units() const { return chunks() * c; }
    /* the elements of a unit's channel in its chunk */
    __device__ int64_t length(int64_t unit) const
    {
        const int64_t first = unit / c * images;
        return (n - first < images ? n - first : images) * hw;
    }
};

/* fn(a[j], b[j]) (b[j] = 0 where b is null) for the lane's share of a
 * unit's elements: a streamed plane's 16-byte packs, or a run's planes one
 * after another, UNROLL loads in flight, each lane stepping from plane to
 * plane without a division. (STREAMED = p.streamed(), a template argument
 * so that a run's kernel is not given the registers streaming needs.) */
template <class T, int G, bool STREAMED, class Fn>
__device__ __forceinline__ void over_unit(const T *a, const T *b, const Planes &p, int64_t unit, int lane, Fn fn)
{
    if constexpr (STREAMED) {
        stream_reduce<T, G>(a + unit * p.hw, b != nullptr ? b + unit * p.hw : nullptr, p.hw, lane,
                            [&](int64_t, const float *va, const float *vb, auto count) {
                                for (int i = 0; i < decltype(count)::value; i++)
                                    fn(va[i], vb[i]);
                            });
        return;
    }
    constexpr int UNROLL = 4;
    const int64_t first = unit / p.c * p.images, image_step = p.c * p.hw, len = p.length(unit);
    const int64_t base = (first * p.c + unit % p.c) * p.hw;
    int64_t pix = lane, at = lane;  /* at: the element's offset from base, pix: within its plane */
    const auto advance = [&] {
        pix += G, at += G;
        while (pix >= p.hw)
            pix -= p.hw, at += image_step - p.hw;
    };
    while (pix >= p.hw)
        pix -= p.hw, at += image_step - p.hw;
    for (int64_t j0 = lane; j0 < len; j0 += UNROLL * G) {
        float va[UNROLL], vb[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            va[u] = vb[u] = 0.0f;
            if (j0 + u * G < len) {
                va[u] = to_float(a[base + at]);
                if (b != nullptr)
                    vb[u] = to_float(b[base + at]);
            }
            advance();
        }
#pragma unroll
        for (int u = 0; u < UNROLL; u++)
            if (j0 + u * G < len)
                fn(va[u], vb[u]);
    }
}

/* Each unit's mean and sum of squared deviations about it, at
 * part_mean[unit] and part_m2[unit], by the corrected two-pass algorithm
 * (layer_norm's, norm.cu); the second pass reads from cache. */
template <class T, int G, bool STREAMED>
__global__ void __launch_bounds__(BLOCK) plane_moments(const T *x, Planes p, float *part_mean, float *part_m2)
{
    typedef RowGroup<G> Group;
    __shared__ float scratch[BLOCK / 32];
    const int lane = Group::lane();
    for (int64_t unit = Group::first(); unit < p.units(); unit += Group::step()) {
        const float n = (float)p.length(unit);
        float s = 0.0f;
        over_unit<T, G, STREAMED>(x, (const T *)nullptr, p, unit, lane, [&](float v, float) { s += v; });
        const float mu = Group::sum(s, scratch) / n;
        float q = 0.0f, d = 0.0f;
        over_unit<T, G, STREAMED>(x, (const T *)nullptr, p, unit, lane, [&](float v, float) {
            q += (v - mu) * (v - mu);
            d += v - mu;
        });
        q = Group::sum(q, scratch);
        d = Group::sum(d, scratch);
        if (lane == 0)
            corrected_moments(mu, d, q, n, part_mean[unit], part_m2[unit]);
    }
}

/* Each unit's sum(dy) and sum(dy * (x - mean)), the channel's mean. */
template <class T, int G, bool STREAMED>
__global__ void __launch_bounds__(BLOCK)
    plane_gradient_sums(ampc_batch_norm_backward b, Planes p, float *part_dy, float *part_dy_xc)
{
    typedef RowGroup<G> Group;
    __shared__ float scratch[BLOCK / 32];
    const int lane = Group::lane();
    for (int64_t unit = Group::first(); unit < p.units(); unit += Group::step()) {
        const float mean = static_cast<const float *>(b.save_mean.data)[unit % p.c];
        float s = 0.0f, t = 0.0f;
        over_unit<T, G, STREAMED>(static_cast<const T *>(b.dy.data), static_cast<const T *>(b.x.data), p, unit, lane,
                                  [&](float d, float v) {
                                      s += d;
                                      t += d * (v - mean);
                                  });
        s = Group::sum(s, scratch);
        t = Group::sum(t, scratch);
        if (lane == 0) {
            part_dy[unit] = s;
            part_dy_xc[unit] = t;
        }
    }
}

/* Short planes whose channels come in whole packs: a block per chunk and
 * run of VEC channels. One image's planes of VEC consecutive channels are
 * hw contiguous packs on a 16-byte boundary (a slab), so the block copies
 * its chunk's slabs into shared memory with 16-byte loads, every one in
 * flight at once, and a warp per channel then reduces its planes from
 * there (a warp reading its run from memory kept 4 loads of 2 bytes in
 * flight a lane: 22 % of the bandwidth on 14x14 planes, 17 % on 7x7). */
template <class T>
struct Slabs {
    static constexpr int VEC = Pack<T>::VEC, THREADS = 32 * VEC;
    static constexpr int PACKS = (int)RUN_ELEMENTS;  /* a chunk's slabs: at most 16 KB an array */
    static constexpr int UNROLL = PACKS / THREADS;
    int64_t first_image;
    int64_t group;  /* the run of channels group * VEC .. */
    int hw, packs;  /* hw packs a slab, `packs` in the chunk */

    /* a block per chunk and run of VEC channels */
    __host__ __device__ static int64_t blocks(const Planes &p) { return p.chunks() * (p.c / VEC); }

    __device__ Slabs(const Planes &p, int64_t block)
    {
        const int64_t groups = p.c / VEC, chunk = block / groups;
        first_image = chunk * p.images;
        group = block % groups;
        hw = (int)p.hw;
        packs = (int)((p.n - first_image < p.images ? p.n - first_image : p.images) * p.hw);
    }

    /* The chunk's slabs of src, packed one after another into dst (shared memory). */
    __device__ void stage(const T *src, T *dst, const Planes &p) const
    {
        const int64_t groups = p.c / VEC;
        Pack<T> v[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const int q = (int)threadIdx.x + u * THREADS, image = q / hw;
            if (q < packs)
                v[u].load(src + (((first_image + image) * groups + group) * hw + (q - image * hw)) * VEC);
        }
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const int q = (int)threadIdx.x + u * THREADS;
            if (q < packs)
                v[u].store(dst + q * VEC);
        }
    }

    /* fn(at) for the offsets in the staged slabs of the calling warp's
     * channel's elements that its lane takes, E at a time (E divides hw, so
     * a run never crosses a plane's end), in order: plane after plane,
     * 32 * E apart, stepping across a plane's end without a division. */
    template <int E, class Fn>
    __device__ __forceinline__ void each(Fn fn) const
    {
        const int lane = (int)threadIdx.x % 32, channel = (int)threadIdx.x / 32;
        int pix = lane * E, at = channel * hw + lane * E;
        const auto wrap = [&] {
            while (pix >= hw)
                pix -= hw, at += (VEC - 1) * hw;
        };
        wrap();
        for (int j = lane * E; j < packs; j += 32 * E) {  /* packs: the channel's elements in the chunk */
            fn(at);
            pix += 32 * E, at += 32 * E;
            wrap();
        }
    }

    /* The E staged elements from offset at (a multiple of E) as floats, one shared-memory access. */
    template <int E>
    __device__ __forceinline__ static void run(const T *slab, int at, float (&v)[E])
    {
        struct alignas(E * sizeof(T)) Run {
            T e[E];
        };
        const Run r = *reinterpret_cast<const Run *>(slab + at);
#pragma unroll
        for (int i = 0; i < E; i++)
            v[i] = to_float(r.e[i]);
    }

    __device__ int64_t unit(const Planes &p) const
    {
        return first_image / p.images * p.c + group * VEC + threadIdx.x / 32;
    }
};

/* plane_moments over short planes by slabs (Slabs says how): the same units and algorithm. */
template <class T, int E>
__global__ void __launch_bounds__(Slabs<T>::THREADS) slab_moments(const T *x, Planes p, float *part_mean,
                                                                   float *part_m2)
{
    __shared__ __align__(16) T slab[Slabs<T>::PACKS * Slabs<T>::VEC];
    for (int64_t block = blockIdx.x; block < Slabs<T>::blocks(p); block += gridDim.x) {
        const Slabs<T> s(p, block);
        s.stage(x, slab, p);
        __syncthreads();
        const float n = (float)s.packs;
        float sum = 0.0f;
        s.template each<E>([&](int at) {
            float v[E];
            Slabs<T>::run(slab, at, v);
#pragma unroll
            for (int i = 0; i < E; i++)
                sum += v[i];
        });
        const float mu = RowGroup<32>::sum(sum, (float *)nullptr) / n;
        float q = 0.0f, d = 0.0f;
        s.template each<E>([&](int at) {
            float v[E];
            Slabs<T>::run(slab, at, v);
#pragma unroll
            for (int i = 0; i < E; i++) {
                q += (v[i] - mu) * (v[i] - mu);
                d += v[i] - mu;
            }
        });
        RowGroup<32>::sum2(q, d, (float *)nullptr);
        if (threadIdx.x % 32 == 0)
            corrected_moments(mu, d, q, n, part_mean[s.unit(p)], part_m2[s.unit(p)]);
        __syncthreads();  /* the slabs are free for the next block's */
    }
}

/* plane_gradient_sums over short planes by slabs: dy's and x's. */
template <class T, int E>
__global__ void __launch_bounds__(Slabs<T>::THREADS)
    slab_gradient_sums(ampc_batch_norm_backward b, Planes p, float *part_dy, float *part_dy_xc)
{
    __shared__ __align__(16) T dy[Slabs<T>::PACKS * Slabs<T>::VEC], x[Slabs<T>::PACKS * Slabs<T>::VEC];
    for (int64_t block = blockIdx.x; block < Slabs<T>::blocks(p); block += gridDim.x) {
        const Slabs<T> s(p, block);
        s.stage(static_cast<const T *>(b.dy.data), dy, p);
        s.stage(static_cast<const T *>(b.x.data), x, p);
        __syncthreads();
        const int64_t unit = s.unit(p);
        const float mean = static_cast<const float *>(b.save_mean.data)[unit % p.c];
        float sum = 0.0f, t = 0.0f;
        s.template each<E>([&](int at) {
            float d[E], v[E];
            Slabs<T>::run(dy, at, d);
            Slabs<T>::run(x, at, v);
#pragma unroll
            for (int i = 0; i < E; i++) {
                sum += d[i];
                t += d[i] * (v[i] - mean);
            }
        });
        RowGroup<32>::sum2(sum, t, (float *)nullptr);
        if (threadIdx.x % 32 == 0) {
            part_dy[unit] = sum;
            part_dy_xc[unit] = t;
        }
        __syncthreads();
    }
}

/* Whether the short planes' slab kernels take planes of T. */
template <class T>
bool by_slabs(const Planes &p)
{
    return !p.streamed() && p.c % Pack<T>::VEC == 0;
}

/* launch(E) (a std::integral_constant) with the longest run of elements,
 * 4, 2 or 1, that divides the planes: a 14x14 plane's warp reads 4 at a
 * time, where one at a time spent more on its loop than its loads. */
template <class Launch>
void with_run(const Planes &p, Launch launch)
{
    if (p.hw % 4 == 0)
        launch(std::integral_constant<int, 4>());
    else if (p.hw % 2 == 0)
        launch(std::integral_constant<int, 2>());
    else
        launch(std::integral_constant<int, 1>());
}

/* Per channel, the chunks' sums added in chunk order. */
__global__ void channel_sums(int64_t chunks, int64_t c, const float *part_dy, const float *part_dy_xc, float *sum_dy,
                             float *sum_dy_xc)
{
    for (int64_t ch = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; ch < c; ch += (int64_t)gridDim.x * blockDim.x) {
        float s = 0.0f, t = 0.0f;
        for (int64_t chunk = 0; chunk < chunks; chunk++) {
            s += part_dy[chunk * c + ch];
            t += part_dy_xc[chunk * c + ch];
        }
        sum_dy[ch] = s;
        sum_dy_xc[ch] = t;
    }
}

/* The elementwise passes' formulas at one channel, its terms loaded by at(ch). */
struct NormalizeAt {  /* y = (x - mean) * scale + bias */
    const float *scale, *bias, *save_mean;
    float k, m, mean;
    __device__ void at(int64_t ch) { k = scale[ch], m = bias[ch], mean = save_mean[ch]; }
    __device__ float operator()(float x, float) const { return (x - mean) * k + m; }
};

struct InputGradientAt {  /* dx = k * (dy - mean_dy - (x - mean) * proj) */
    GradTerms t;
    float k, mean_dy, proj, mean;
    __device__ void at(int64_t ch) { k = t.k[ch], mean_dy = t.mean_dy[ch], proj = t.proj[ch], mean = t.mean[ch]; }
    __device__ float operator()(float dy, float x) const { return k * (dy - mean_dy - (x - mean) * proj); }
};

/* out = fn(a, b) over streamed planes (b may be null), a row group a plane. */
template <class T, int G, class At>
__global__ void __launch_bounds__(BLOCK) map_planes(const T *a, const T *b, T *out, Planes p, At fn)
{
    typedef RowGroup<G> Group;
    const int lane = Group::lane();
    for (int64_t i = Group::first(); i < p.units(); i += Group::step()) {
        const int64_t plane = p.units() - 1 - i;  /* from the last, as last_blocks_first */
        fn.at(plane % p.c);
        stream_map<T, G>(a + plane * p.hw, b != nullptr ? b + plane * p.hw : nullptr, out + plane * p.hw, p.hw, lane,
                         [&](int64_t, float u, float v) { return fn(u, v); });
    }
}

/* The same over short planes: a pack a thread over the whole array, the
 * channel followed across plane boundaries (its terms reloaded only there). */
template <class T, class At>
__global__ void map_flat(const T *a, const T *b, T *out, Planes p, At fn)
{
    constexpr int VEC = Pack<T>::VEC;
    const int64_t total = p.n * p.c * p.hw;
    for (int64_t q = last_blocks_first(); q * VEC < total; q += (int64_t)gridDim.x * blockDim.x) {
        const int64_t e0 = q * VEC;
        int64_t plane, ch;
        if (total <= UINT32_MAX) {  /* 32-bit division where it suffices: a 64-bit one is a long call */
            plane = (uint32_t)e0 / (uint32_t)p.hw;
            ch = (uint32_t)plane % (uint32_t)p.c;
        } else {
            plane = e0 / p.hw;
            ch = plane % p.c;
        }
        int64_t off = e0 - plane * p.hw;
        fn.at(ch);
        const auto next = [&] {
            if (++off == p.hw) {
                off = 0;
                ch = ch + 1 == p.c ? 0 : ch + 1;
                fn.at(ch);
            }
        };
        if (e0 + VEC <= total) {
            Pack<T> x, y, o;
            x.load(a + e0);
            if (b != nullptr)
                y.load(b + e0);
#pragma unroll
            for (int i = 0; i < VEC; i++) {
                o.set(i, fn(x[i], b != nullptr ? y[i] : 0.0f));
                next();
            }
            o.store(out + e0);
        } else
            for (int64_t e = e0; e < total; e++) {
                out[e] = from_float<T>(fn(to_float(a[e]), b != nullptr ? to_float(b[e]) : 0.0f));
                next();
            }
    }
}

/* launch(G, STREAMED, grid) over the units (std::integral_constants), G
 * lanes a unit: a block for a long plane, a warp for a short plane or a run
 * (a block a run spent more on its reductions than on its elements). */
template <class Launch>
int launch_units(const Planes &p, Launch launch)
{
    using warp = std::integral_constant<int, 32>;
    if (!p.streamed())
        return launch(warp(), std::false_type(), rows_grid(p.units(), 32));
    if (p.hw < STREAM_BLOCK_FROM)
        return launch(warp(), std::true_type(), rows_grid(p.units(), 32));
    return launch(std::integral_constant<int, BLOCK>(), std::true_type(), rows_grid(p.units(), BLOCK));
}

/* out = fn(a, b) over the planes, the kernel their length suits. */
template <class T, class At>
int map_nchw(void *stream, const T *a, const T *b, T *out, const Planes &p, At fn, const char *what)
{
    if (p.streamed())
        return launch_units(p, [&](auto g, auto, unsigned grid) {
            map_planes<T, decltype(g)::value><<<grid, BLOCK, 0, as_stream(stream)>>>(a, b, out, p, fn);
            return ampc_cuda_launched(what);
        });
    map_flat<T><<<grid_for((p.n * p.c * p.hw + Pack<T>::VEC - 1) / Pack<T>::VEC, 256), 256, 0, as_stream(stream)>>>(
        a, b, out, p, fn);
    return ampc_cuda_launched(what);
}

/* ------------------------------------------------------------------------ */
/* NCHW on sm_90: a channel held on chip by a cluster                        */
/* ------------------------------------------------------------------------ */

/* A channel short enough (ResNet-50's 14x14 and 7x7 stages at batch 256:
 * 50176 and 12544 elements) is read once: a cluster of up to 8 blocks holds
 * it in registers, merges its blocks' statistics through distributed shared
 * memory, and writes its output from the registers. The plane kernels read
 * x twice, for the statistics and to normalize (and dy and x twice
 * backward); cuDNN's single-read kernel took 0.81 of their time on 14x14
 * fp16. A thread holds as much as its registers allow: the time from a
 * load to its store is a block's two reductions and a cluster's barrier,
 * and only the bytes held cover it (a thread holding 16 elements, a quarter
 * of this, ran at a third of the bandwidth). */
constexpr int HELD_CLUSTER_MAX = 8;  /* the portable cluster size */
constexpr int HELD_REGISTERS = 32;   /* a thread's registers for held values, all its arrays' */

/* A thread's share of one array of its cluster's channel, in REGS
 * registers, THREADS to a block: runs of E elements (E divides hw; a run
 * takes a register at least). The cluster reads `per_step` whole planes at
 * a time, a thread a run of one of them, a plane's runs to consecutive
 * threads (a warp's loads contiguous), so a thread's runs lie per_step
 * images apart and their addresses are one multiply-add each (a walk
 * across plane ends with a carry per run held 64-bit addresses for every
 * run and spilled). */
template <class T, int E, int REGS, int THREADS>
struct Held {
    static constexpr int RUNS = REGS * 4 / (E * (int)sizeof(T)) < REGS ? REGS * 4 / (E * (int)sizeof(T)) : REGS;
    static constexpr int BLOCK_THREADS = THREADS;
    struct alignas(E * sizeof(T)) Run {
        T e[E];
    };
    Run v[RUNS];
    int live;  /* the runs j < live exist */

    __host__ __device__ static int64_t per_step(const Planes &p, int64_t blocks) { return blocks * THREADS * E / p.hw; }

    /* The fewest blocks that hold a channel, HELD_CLUSTER_MAX + 1 where it is too long. */
    static int64_t blocks(const Planes &p)
    {
        int64_t k = 1;
        while (k <= HELD_CLUSTER_MAX && per_step(p, k) * RUNS < p.n)
            k++;
        return k;
    }

    /* fn(j, run) for the runs j < live, `run` its place in the array whose
     * channel starts at `channel`. A pointer stepped run by run: offsets
     * shared by the loads and the stores were kept, 64 bits a run, and spilled. */
    template <class P, class Fn>
    __device__ __forceinline__ void walk(P *channel, const Planes &p, int blocks, int rank, Fn fn)
    {
        const int runs_per_plane = (int)p.hw / E, thread = rank * THREADS + (int)threadIdx.x;
        const int image = thread / runs_per_plane, step = (int)per_step(p, blocks);
        const int64_t image_step = p.c * p.hw;
        live = image < step && image < p.n ? (int)((p.n - image + step - 1) / step) : 0;
        P *run = channel + image * image_step + (thread - image * runs_per_plane) * E;
#pragma unroll
        for (int j = 0; j < RUNS; j++) {
            if (j < live)
                fn(j, run);
            run += step * image_step;
        }
    }

    __device__ __forceinline__ void load(const T *channel, const Planes &p, int blocks, int rank)
    {
        walk(channel, p, blocks, rank, [&](int j, const T *run) { v[j] = *reinterpret_cast<const Run *>(run); });
    }

    /* out at the held runs' places: element i of run j is fn(j, i). */
    template <class Fn>
    __device__ __forceinline__ void store(T *channel, const Planes &p, int blocks, int rank, Fn fn)
    {
        walk(channel, p, blocks, rank, [&](int j, T *run) {
            Run r;
#pragma unroll
            for (int i = 0; i < E; i++)
                r.e[i] = from_float<T>(fn(j, i));
            *reinterpret_cast<Run *>(run) = r;
        });
    }

    /* Element i of run j, converted afresh at each use: the compiler kept
     * every element's float from the first pass to the store (twice the
     * registers for 16-bit data) and spilled. */
    __device__ __forceinline__ float operator()(int j, int i) const { return afresh(v[j].e[i]); }
    __device__ __forceinline__ static float afresh(float v) { return v; }
    __device__ __forceinline__ static float afresh(__half v)
    {
        float f;
        asm volatile("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(__half_as_ushort(v)));
        return f;
    }
    __device__ __forceinline__ static float afresh(__nv_bfloat16 v)
    {
        float f;
        asm volatile("mov.b32 %0, {0, %1};" : "=f"(f) : "h"(__bfloat16_as_ushort(v)));
        return f;
    }

    /* fn(j, i, value) over the held elements: element i of run j */
    template <class Fn>
    __device__ __forceinline__ void each(Fn fn) const
    {
#pragma unroll
        for (int j = 0; j < RUNS; j++)
            if (j < live)
#pragma unroll
                for (int i = 0; i < E; i++)
                    fn(j, i, (*this)(j, i));
    }
};

#if __CUDA_ARCH__ >= 900
/* fn(values) for every block's NV values in the cluster, in rank order, in
 * every block alike. `mine`: NV floats of the block's shared memory, for the
 * block's `values`. The caller arrives at the cluster's barrier and waits
 * there before leaving, so that no block leaves while another reads. */
template <int NV, class Fn>
__device__ __forceinline__ void across_cluster(const float (&values)[NV], float *mine, Fn fn)
{
    namespace cg = cooperative_groups;
    const cg::cluster_group cluster = cg::this_cluster();
    if (threadIdx.x == 0)
#pragma unroll
        for (int i = 0; i < NV; i++)
            mine[i] = values[i];
    cluster.sync();
    for (unsigned r = 0; r < cluster.num_blocks(); r++)
        fn(cluster.map_shared_rank(mine, r));
}
#endif

/* Training forward, a cluster per channel: each block's mean and sum of
 * squared deviations by the corrected two-pass algorithm (plane_moments'),
 * from the registers, merged across the cluster by Chan's formula; then y.
 * (Chan's formula across the block's warps too, one barrier instead of the
 * two sums' four, took 1.1 times as long: a chain of divisions.) */
template <class T, int E, int THREADS>
__global__ void __launch_bounds__(THREADS, 1024 / THREADS) held_forward(ampc_batch_norm b, Planes p)
{
#if __CUDA_ARCH__ >= 900
    namespace cg = cooperative_groups;
    const cg::cluster_group cluster = cg::this_cluster();
    __shared__ float scratch[2 * THREADS / 32], moments[3];
    const int blocks = (int)cluster.num_blocks(), rank = (int)cluster.block_rank();
    const int64_t ch = blockIdx.x / blocks, count = p.n * p.hw;
    Held<T, E, HELD_REGISTERS, THREADS> x;
    x.load(static_cast<const T *>(b.x.data) + ch * p.hw, p, blocks, rank);
    float sum = 0.0f, n = 0.0f;
    x.each([&](int, int, float v) { sum += v, n += 1.0f; });
    RowGroup<THREADS, THREADS>::sum2(sum, n, scratch);
    const float mu = sum / n;  /* a block holding nothing (n = 0) merges as nothing */
    float q = 0.0f, d = 0.0f;
    x.each([&](int, int, float v) { q += (v - mu) * (v - mu), d += v - mu; });
    RowGroup<THREADS, THREADS>::sum2(q, d, scratch);
    float block[3] = {n};
    corrected_moments(mu, d, q, n, block[1], block[2]);
    float total = 0.0f, mean = 0.0f, m2 = 0.0f;
    across_cluster(block, moments, [&](const float *m) { merge(total, mean, m2, m[0], m[1], m[2]); });
    cg::cluster_group::arrival_token read = cluster.barrier_arrive();
    float scale, bias;
    channel_statistics(b, ch, mean, m2, count, rank == 0 && threadIdx.x == 0, scale, bias);
    x.store(static_cast<T *>(b.y.data) + ch * p.hw, p, blocks, rank,
            [&](int j, int i) { return (x(j, i) - mean) * scale + bias; });
    cluster.barrier_wait(std::move(read));
#endif
}

/* Training backward, a cluster per channel: sum(dy) and sum(dy * (x - mean))
 * from the registers, added across the cluster; then dx. */
template <class T, int E, int THREADS>
__global__ void __launch_bounds__(THREADS, 1024 / THREADS) held_backward(ampc_batch_norm_backward b, Planes p)
{
#if __CUDA_ARCH__ >= 900
    namespace cg = cooperative_groups;
    const cg::cluster_group cluster = cg::this_cluster();
    __shared__ float scratch[2 * THREADS / 32], sums[2];
    const int blocks = (int)cluster.num_blocks(), rank = (int)cluster.block_rank();
    const int64_t ch = blockIdx.x / blocks, count = p.n * p.hw;
    Held<T, E, HELD_REGISTERS / 2, THREADS> dy, x;  /* half the registers each */
    dy.load(static_cast<const T *>(b.dy.data) + ch * p.hw, p, blocks, rank);
    x.load(static_cast<const T *>(b.x.data) + ch * p.hw, p, blocks, rank);
    const float mean = static_cast<const float *>(b.save_mean.data)[ch];
    float s = 0.0f, t = 0.0f;  /* sum(dy), sum(dy * (x - mean)) */
    dy.each([&](int j, int i, float d) { s += d, t += d * (x(j, i) - mean); });
    RowGroup<THREADS, THREADS>::sum2(s, t, scratch);
    const float block[2] = {s, t};
    s = t = 0.0f;
    across_cluster(block, sums, [&](const float *m) { s += m[0], t += m[1]; });
    cg::cluster_group::arrival_token read = cluster.barrier_arrive();
    float k, mean_dy, proj;
    channel_gradient(b, ch, s, t, count, rank == 0 && threadIdx.x == 0, k, mean_dy, proj);
    if (b.dx.data != nullptr)
        x.store(static_cast<T *>(b.dx.data) + ch * p.hw, p, blocks, rank,
                [&](int j, int i) { return k * (dy(j, i) - mean_dy - (x(j, i) - mean) * proj); });
    cluster.barrier_wait(std::move(read));
#endif
}

/* launch(E, THREADS) (std::integral_constants) for the held kernels that
 * hold REGS registers of a thread per array, or AMPC_NOT_TAKEN: on a GPU
 * older than sm_90, where 8 blocks hold too little, and for 16-bit planes
 * of odd length (loads of one 2-byte element reached a quarter of the
 * bandwidth on 7x7 planes, where the slabs' 16-byte loads through shared
 * memory took 0.8 of the time). Blocks of 256 threads where they hold the
 * channel, else 512: 7x7 fp32 forward and 14x14 16-bit backward 1.06-1.08
 * times faster, the 512s' longer reach kept for 28x28 16-bit forward and
 * 14x14 fp32 backward. */
template <class T, int REGS, class Launch>
int with_held_shape(int device, const Planes &p, Launch launch)
{
    int major = 0;
    AMPC_CUDA_TRY(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), "reading the GPU");
    int rc = AMPC_NOT_TAKEN;
    if (major < 9 || p.c > INT32_MAX / HELD_CLUSTER_MAX)
        return rc;
    with_run(p, [&](auto e) {
        constexpr int E = decltype(e)::value;
        if constexpr (E * sizeof(T) >= 4) {
            if (Held<T, E, REGS, 256>::blocks(p) <= HELD_CLUSTER_MAX)
                rc = launch(e, std::integral_constant<int, 256>());
            else if (Held<T, E, REGS, 512>::blocks(p) <= HELD_CLUSTER_MAX)
                rc = launch(e, std::integral_constant<int, 512>());
        }
    });
    return rc;
}

/* kernel(arg, p) launched on a cluster of H::blocks(p) blocks per channel. */
template <class H, class Arg, class Kernel>
int launch_held(void *stream, const Planes &p, Kernel kernel, const Arg &arg, const char *what)
{
    const int64_t blocks = H::blocks(p);
    cudaLaunchAttribute cluster;
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x = (unsigned)blocks, cluster.val.clusterDim.y = 1, cluster.val.clusterDim.z = 1;
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3((unsigned)(p.c * blocks)), config.blockDim = dim3(H::BLOCK_THREADS);
    config.stream = as_stream(stream), config.attrs = &cluster, config.numAttrs = 1;
    AMPC_CUDA_TRY(cudaLaunchKernelEx(&config, kernel, arg, p), what);
    return ampc_cuda_launched(what);
}

/* Dense NCHW data of a storage type the row kernels stream, every pointer
 * on a 16-byte boundary (so every array's planes meet those boundaries at
 * the same element), planes of 16 elements or more. */
bool planes_fit(int dtype, int64_t n, int64_t c, int64_t h, int64_t w, const int64_t *s, const void *const *ptrs,
                int nptrs)
{
    if (dtype == AMPC_FLOAT64 || h * w < 16 || s[3] != 1 || s[2] != w || s[1] != h * w || (n > 1 && s[0] != c * h * w))
        return false;
    for (int i = 0; i < nptrs; i++)
        if (ptrs[i] != nullptr && (uintptr_t)ptrs[i] % 16 != 0)
            return false;
    return true;
}

/* Dense channels-last data of a storage type packs serve, channels in whole packs. */
bool fits(int dtype, int64_t n, int64_t c, int64_t h, int64_t w, const int64_t *s, const void *const *ptrs, int nptrs)
{
    if (dtype == AMPC_FLOAT64 || c < 2 || s[1] != 1 || s[3] != c || s[2] != w * c || (n > 1 && s[0] != h * w * c))
        return false;
    for (int i = 0; i < nptrs; i++)
        if (ptrs[i] != nullptr && !packs_fit(dtype, c, ptrs[i]))
            return false;
    return packs_fit(dtype, c, ptrs[0]);
}

}  // namespace

extern "C" int ampc_cuda_batch_norm_nhwc(int device, void *stream, const ampc_batch_norm *b)
{
    const void *ptrs[2] = {b->x.data, b->y.data};
    if (!b->training || !fits(b->x.dtype, b->n, b->c, b->h, b->w, b->x_strides, ptrs, 2) || b->y.dtype != b->x.dtype)
        return AMPC_NOT_TAKEN;
    const int64_t rows = b->n * b->h * b->w;
    return ampc_on_device(device, [&] {
        return with_storage(b->x.dtype, [&](auto type) {
            using T = decltype(type);
            constexpr int VEC = Pack<T>::VEC;
            const int64_t tiles = (b->c / VEC + PCOL_X - 1) / PCOL_X;
            const int64_t chunks = packed_column_chunks(rows, b->c, VEC);
            /* scale, bias, then each chunk's means and m2s */
            Scratch scratch(device, stream);
            int rc = scratch.get((2 + 2 * (size_t)chunks) * (size_t)b->c * sizeof(float));
            if (rc != AMPC_OK)
                return rc;
            float *scale = static_cast<float *>(scratch.ptr), *bias = scale + b->c;
            float *part_mean = bias + b->c, *part_m2 = part_mean + chunks * b->c;
            welford_partials<T><<<(unsigned)(tiles * chunks), dim3(PCOL_X, PCOL_Y), 0, as_stream(stream)>>>(
                static_cast<const T *>(b->x.data), rows, b->c, chunks, packed_column_groups(b->c, VEC), part_mean,
                part_m2);
            rc = ampc_cuda_launched("batch_norm statistics kernel");
            if (rc != AMPC_OK)
                return rc;
            welford_finish<<<grid_for(b->c, FINISH_X), dim3(FINISH_X, FINISH_Y), 0, as_stream(stream)>>>(
                *b, part_mean, part_m2, rows, chunks, (rows + chunks - 1) / chunks, scale, bias);
            rc = ampc_cuda_launched("batch_norm statistics kernel");
            if (rc != AMPC_OK)
                return rc;
            const int64_t packs = rows * b->c / VEC;
            normalize<T><<<grid_for(packs, 256), 256, 0, as_stream(stream)>>>(*b, packs, scale, bias);
            return ampc_cuda_launched("batch_norm kernel");
        });
    });
}

extern "C" int ampc_cuda_batch_norm_nhwc_backward(int device, void *stream, const ampc_batch_norm_backward *b)
{
    const void *ptrs[3] = {b->x.data, b->dy.data, b->dx.data};
    if (!fits(b->x.dtype, b->n, b->c, b->h, b->w, b->x_strides, ptrs, 3) || b->dy.dtype != b->x.dtype ||
        (b->dx.data != nullptr && b->dx.dtype != b->x.dtype))
        return AMPC_NOT_TAKEN;
    const int64_t rows = b->n * b->h * b->w;
    return ampc_on_device(device, [&] {
        Scratch sums(device, stream);
        int rc = sums.get(6 * (size_t)b->c * sizeof(float));  /* the two sums, then GradTerms */
        if (rc != AMPC_OK)
            return rc;
        float *sum_dy = static_cast<float *>(sums.ptr), *sum_dy_xc = sum_dy + b->c;
        const GradTerms terms{sum_dy + 2 * b->c, sum_dy + 3 * b->c, sum_dy + 4 * b->c, sum_dy + 5 * b->c};
        return with_storage(b->x.dtype, [&](auto type) {
            using T = decltype(type);
            const DyAndDyXc<T> val{static_cast<const T *>(b->dy.data), static_cast<const T *>(b->x.data),
                                   static_cast<const float *>(b->save_mean.data), b->c};
            int status = packed_column_sums<T, 2>(device, stream, val, rows, b->c, ampc_buf{sum_dy, AMPC_FLOAT32},
                                                  ampc_buf{sum_dy_xc, AMPC_FLOAT32}, 1.0f, "batch_norm backward sums");
            if (status != AMPC_OK)
                return status;
            channel_gradients<<<grid_for(b->c, 256), 256, 0, as_stream(stream)>>>(*b, sum_dy, sum_dy_xc, rows, terms);
            status = ampc_cuda_launched("batch_norm weight gradient kernel");
            if (status != AMPC_OK || b->dx.data == nullptr)
                return status;
            const int64_t packs = rows * b->c / Pack<T>::VEC;
            input_gradient<T><<<grid_for(packs, 256), 256, 0, as_stream(stream)>>>(*b, terms, packs);
            return ampc_cuda_launched("batch_norm backward kernel");
        });
    });
}

extern "C" int ampc_cuda_batch_norm_planes(int device, void *stream, const ampc_batch_norm *b)
{
    const void *ptrs[2] = {b->x.data, b->y.data};
    if (!b->training || !planes_fit(b->x.dtype, b->n, b->c, b->h, b->w, b->x_strides, ptrs, 2) ||
        b->y.dtype != b->x.dtype)
        return AMPC_NOT_TAKEN;
    const Planes p = Planes::of(b->n, b->c, b->h * b->w);
    return ampc_on_device(device, [&] {
        int rc = with_storage(b->x.dtype, [&](auto type) {
            using T = decltype(type);
            return with_held_shape<T, HELD_REGISTERS>(device, p, [&](auto e, auto threads) {
                constexpr int E = decltype(e)::value, THREADS = decltype(threads)::value;
                return launch_held<Held<T, E, HELD_REGISTERS, THREADS>>(stream, p, held_forward<T, E, THREADS>, *b,
                                                                        "batch_norm kernel");
            });
        });
        if (rc != AMPC_NOT_TAKEN)
            return rc;
        /* scale, bias, then each unit's mean and m2 */
        Scratch scratch(device, stream);
        rc = scratch.get((2 * (size_t)b->c + 2 * (size_t)p.units()) * sizeof(float));
        if (rc != AMPC_OK)
            return rc;
        float *scale = static_cast<float *>(scratch.ptr), *bias = scale + b->c;
        float *part_mean = bias + b->c, *part_m2 = part_mean + p.units();
        return with_storage(b->x.dtype, [&](auto type) {
            using T = decltype(type);
            int status;
            if (by_slabs<T>(p)) {
                const unsigned grid = rows_grid(Slabs<T>::blocks(p), BLOCK);  /* capped: the kernels grid-stride */
                with_run(p, [&](auto e) {
                    slab_moments<T, decltype(e)::value><<<grid, Slabs<T>::THREADS, 0, as_stream(stream)>>>(
                        static_cast<const T *>(b->x.data), p, part_mean, part_m2);
                });
                status = ampc_cuda_launched("batch_norm statistics kernel");
            }
            else
                status = launch_units(p, [&](auto g, auto streamed, unsigned grid) {
                    plane_moments<T, decltype(g)::value, decltype(streamed)::value>
                        <<<grid, BLOCK, 0, as_stream(stream)>>>(static_cast<const T *>(b->x.data), p, part_mean,
                                                                part_m2);
                    return ampc_cuda_launched("batch_norm statistics kernel");
                });
            if (status != AMPC_OK)
                return status;
            welford_finish<<<grid_for(b->c, FINISH_X), dim3(FINISH_X, FINISH_Y), 0, as_stream(stream)>>>(
                *b, part_mean, part_m2, b->n * p.hw, p.chunks(), p.images * p.hw, scale, bias);
            status = ampc_cuda_launched("batch_norm statistics kernel");
            if (status != AMPC_OK)
                return status;
            const NormalizeAt fn{scale, bias, static_cast<const float *>(b->save_mean.data), 0.0f, 0.0f, 0.0f};
            return map_nchw(stream, static_cast<const T *>(b->x.data), (const T *)nullptr, static_cast<T *>(b->y.data),
                            p, fn, "batch_norm kernel");
        });
    });
}

extern "C" int ampc_cuda_batch_norm_planes_backward(int device, void *stream, const ampc_batch_norm_backward *b)
{
    const void *ptrs[3] = {b->x.data, b->dy.data, b->dx.data};
    if (!planes_fit(b->x.dtype, b->n, b->c, b->h, b->w, b->x_strides, ptrs, 3) || b->dy.dtype != b->x.dtype ||
        (b->dx.data != nullptr && b->dx.dtype != b->x.dtype))
        return AMPC_NOT_TAKEN;
    const Planes p = Planes::of(b->n, b->c, b->h * b->w);
    return ampc_on_device(device, [&] {
        int rc = with_storage(b->x.dtype, [&](auto type) {
            using T = decltype(type);
            return with_held_shape<T, HELD_REGISTERS / 2>(device, p, [&](auto e, auto threads) {
                constexpr int E = decltype(e)::value, THREADS = decltype(threads)::value;
                return launch_held<Held<T, E, HELD_REGISTERS / 2, THREADS>>(stream, p, held_backward<T, E, THREADS>,
                                                                            *b, "batch_norm backward kernel");
            });
        });
        if (rc != AMPC_NOT_TAKEN)
            return rc;
        /* the two sums, GradTerms, then each unit's two sums */
        Scratch sums(device, stream);
        rc = sums.get((6 * (size_t)b->c + 2 * (size_t)p.units()) * sizeof(float));
        if (rc != AMPC_OK)
            return rc;
        float *sum_dy = static_cast<float *>(sums.ptr), *sum_dy_xc = sum_dy + b->c;
        const GradTerms terms{sum_dy + 2 * b->c, sum_dy + 3 * b->c, sum_dy + 4 * b->c, sum_dy + 5 * b->c};
        float *part_dy = sum_dy + 6 * b->c, *part_dy_xc = part_dy + p.units();
        return with_storage(b->x.dtype, [&](auto type) {
            using T = decltype(type);
            int status;
            if (by_slabs<T>(p)) {
                const unsigned grid = rows_grid(Slabs<T>::blocks(p), BLOCK);
                with_run(p, [&](auto e) {
                    slab_gradient_sums<T, decltype(e)::value>
                        <<<grid, Slabs<T>::THREADS, 0, as_stream(stream)>>>(*b, p, part_dy, part_dy_xc);
                });
                status = ampc_cuda_launched("batch_norm backward sums");
            }
            else
                status = launch_units(p, [&](auto g, auto streamed, unsigned grid) {
                    plane_gradient_sums<T, decltype(g)::value, decltype(streamed)::value>
                        <<<grid, BLOCK, 0, as_stream(stream)>>>(*b, p, part_dy, part_dy_xc);
                    return ampc_cuda_launched("batch_norm backward sums");
                });
            if (status != AMPC_OK)
                return status;
            channel_sums<<<grid_for(b->c, 256), 256, 0, as_stream(stream)>>>(p.chunks(), b->c, part_dy, part_dy_xc,
                                                                             sum_dy, sum_dy_xc);
            status = ampc_cuda_launched("batch_norm backward sums");
            if (status != AMPC_OK)
                return status;
            channel_gradients<<<grid_for(b->c, 256), 256, 0, as_stream(stream)>>>(*b, sum_dy, sum_dy_xc, b->n * p.hw,
                                                                                  terms);
            status = ampc_cuda_launched("batch_norm weight gradient kernel");
            if (status != AMPC_OK || b->dx.data == nullptr)
                return status;
            const InputGradientAt fn{terms, 0.0f, 0.0f, 0.0f, 0.0f};
            return map_nchw(stream, static_cast<const T *>(b->dy.data), static_cast<const T *>(b->x.data),
                            static_cast<T *>(b->dx.data), p, fn, "batch_norm backward kernel");
        });
    });
}
