/*
 * norm.cu: layer_norm over the last n elements of each row, and its
 * backward pass.
 *
 * Forward: a row group takes the mean, then the variance around it (two
 * passes, as the CPU: no cancellation), then writes the normalised row;
 * mean and 1 / sqrt(var + eps) are saved in the compute type. group_norm's
 * rows (ampc_layer_norm's groups: weight and bias per channel) take the
 * same kernel.
 * Backward: dx row by row (two sums over the row: of g = dy * w and of
 * g * xhat), and dweight = sum over rows of dy * xhat, dbias = sum of dy,
 * as two-stage column sums in one pass (ops.cuh), in a fixed order.
 * group_norm's backward first sums dy and dy * xhat over each channel of
 * each sample (one read of dy and x); its rows' two sums are those channel
 * sums weighted, so dx is one more read, and the weight gradients are the
 * channel sums' column sums over the samples (as torch's). Where each
 * channel is whole 16-byte packs, group_norm's kernels stream packs (a pack
 * is one channel's: one division and one weight a pack).
 *
 * Contiguous rows whose arrays share one storage type, n a whole number of
 * 16-byte packs, take packs.cuh's paths: a row held in registers (read
 * once by the forward, dy and x read once by the backward's dx) and the
 * weight gradients as column sums a pack of columns per thread.
 */
#include "packs.cuh"

namespace {

using namespace ops;

/* The mean and 1 / sqrt(var + eps) of n values from a first-pass mean mu and the sums of the
 * deviations from it (d) and of their squares (q), by ops.cuh's corrected_moments. */
template <class Acc>
__device__ __forceinline__ void mean_and_rstd(Acc mu, Acc q, Acc d, Acc n, Acc eps, Acc &mean, Acc &rstd)
{
    Acc m2;
    corrected_moments(mu, d, q, n, mean, m2);
    rstd = (Acc)1 / m_sqrt(m2 / n + eps);
}

/* The mean and 1 / sqrt(var + eps) of a row of n elements held in registers
 * by a row group of G lanes, as layer_norm_kernel's passes take them, the
 * same in every lane. scratch: RowGroup's, 2 * BLOCK / 32 floats. */
template <int G, class T, int NV>
__device__ __forceinline__ void cached_moments(const CachedRow<T, G, NV> &x, int64_t packs, int lane, int64_t n,
                                               float eps, float *scratch, float &mean, float &rstd)
{
    typedef RowGroup<G> Group;
    float s = 0.0f;
    x.each(packs, lane, [&](int64_t, float v) { s += v; });
    const float mu = Group::sum(s, scratch) / (float)n;
    float q = 0.0f, d = 0.0f;
    x.each(packs, lane, [&](int64_t, float v) {
        q += (v - mu) * (v - mu);
        d += v - mu;
    });
    Group::sum2(q, d, scratch);
    mean_and_rstd(mu, q, d, (float)n, eps, mean, rstd);
}

/* The weight and bias index of element j of a row: j, or under group_norm its channel (ampc_layer_norm's
 * groups), the division in 32 bits where the row allows (a 64-bit one is a long call). */
template <class L>  /* ampc_layer_norm or ampc_layer_norm_backward */
__device__ __forceinline__ int64_t affine_index(const L &l, int64_t first_channel, int64_t j)
{
    if (l.groups == 0)
        return j;
    return first_channel + (l.n <= UINT32_MAX ? (int64_t)((uint32_t)j / (uint32_t)l.spatial) : j / l.spatial);
}

template <int G, class Acc>
__global__ void __launch_bounds__(BLOCK) layer_norm_kernel(ampc_layer_norm l)
{
    typedef RowGroup<G> Group;
    __shared__ Acc scratch[2 * BLOCK / 32];
    const int64_t n = l.n;
    for (int64_t row = Group::first(); row < l.rows; row += Group::step()) {
        const int64_t base = row * n;
        Acc s = 0;
        row_each<G, Acc>(l.x, base, n, 1, [&](int64_t, Acc v) { s += v; });
        const Acc mu = Group::sum(s, scratch) / (Acc)n;
        Acc q = 0, d = 0;
        row_each<G, Acc>(l.x, base, n, 1, [&](int64_t, Acc v) {
            q += (v - mu) * (v - mu);
            d += v - mu;
        });
        Group::sum2(q, d, scratch);
        Acc mean, rstd;
        mean_and_rstd(mu, q, d, (Acc)n, (Acc)l.eps, mean, rstd);
        const int64_t first_channel = l.groups > 0 ? row % l.groups * (n / l.spatial) : 0;
        row_each<G, Acc>(l.x, base, n, 1, [&](int64_t j, Acc v) {
            v = (v - mean) * rstd;
            if (l.weight.data != nullptr)
                v *= load<Acc>(l.weight, affine_index(l, first_channel, j));
            if (l.bias.data != nullptr)
                v += load<Acc>(l.bias, affine_index(l, first_channel, j));
            store(l.y, base + j, v);
        });
        if (Group::lane() == 0) {
            static_cast<Acc *>(l.mean.data)[row] = mean;
            static_cast<Acc *>(l.rstd.data)[row] = rstd;
        }
    }
}

/* dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * w. */
template <int G, class Acc>
__global__ void __launch_bounds__(BLOCK) layer_norm_dx_kernel(ampc_layer_norm_backward l)
{
    typedef RowGroup<G> Group;
    __shared__ Acc scratch[2 * BLOCK / 32];
    const int64_t n = l.n;
    for (int64_t row = Group::first(); row < l.rows; row += Group::step()) {
        const int64_t base = row * n;
        const Acc mean = static_cast<const Acc *>(l.mean.data)[row];
        const Acc rstd = static_cast<const Acc *>(l.rstd.data)[row];
        Acc sg = 0, sgx = 0;
        row_each2<G, Acc>(l.dy, l.x, base, n, 1, [&](int64_t j, Acc dy, Acc x) {
            const Acc g = l.weight.data != nullptr ? dy * load<Acc>(l.weight, j) : dy;
            sg += g;
            sgx += g * (x - mean) * rstd;
        });
        Group::sum2(sg, sgx, scratch);
        const Acc mg = sg / (Acc)n, mgx = sgx / (Acc)n;
        row_each2<G, Acc>(l.dy, l.x, base, n, 1, [&](int64_t j, Acc dy, Acc x) {
            const Acc g = l.weight.data != nullptr ? dy * load<Acc>(l.weight, j) : dy;
            store(l.dx, base + j, rstd * (g - mg - (x - mean) * rstd * mgx));
        });
    }
}

/* group_norm's sums over each channel of each sample: the n / spatial
 * channels of row r are segments r * (n / spatial) + k of `spatial`
 * elements, and segment t's sums go to sums[t] (of dy) and
 * sums[segments + t] (of dy * xhat). each(base, count, fn) runs fn(dy, x)
 * over the group's share of elements base.. of dy and x: the generic
 * kernel's row_each2 or the streamed kernel's packs. */
template <int G, class Acc, class Each>
__device__ __forceinline__ void channel_sums(const ampc_layer_norm_backward &l, Acc *sums, Each each)
{
    typedef RowGroup<G> Group;
    __shared__ Acc scratch[2 * BLOCK / 32];
    const int64_t spatial = l.spatial, channels = l.n / spatial, segments = l.rows * channels;
    for (int64_t t = Group::first(); t < segments; t += Group::step()) {
        const int64_t row = t / channels;
        const Acc mean = static_cast<const Acc *>(l.mean.data)[row];
        const Acc rstd = static_cast<const Acc *>(l.rstd.data)[row];
        Acc sdy = 0, sdyx = 0;
        each(t * spatial, spatial, [&](Acc dy, Acc x) {
            sdy += dy;
            sdyx += dy * (x - mean) * rstd;
        });
        Group::sum2(sdy, sdyx, scratch);
        if (Group::lane() == 0) {
            sums[t] = sdy;
            sums[segments + t] = sdyx;
        }
    }
}

/* group_norm's dx as layer_norm_dx_kernel's, the row's sums of g = dy * w
 * and g * xhat from its channels' sums (channel_sums). Each row is `parts`
 * runs of whole channels, a run a group's (a row a group where rows are
 * many). map(row, part, first_channel, fn) stores fn(w, dy, x) for each of
 * the group's elements of that run, w its channel's weight (1 without one). */
template <int G, class Acc, class Map>
__device__ __forceinline__ void group_norm_dx(const ampc_layer_norm_backward &l, const Acc *sums, int64_t parts,
                                              Map map)
{
    typedef RowGroup<G> Group;
    __shared__ Acc scratch[2 * BLOCK / 32];
    const int64_t n = l.n, channels = n / l.spatial, segments = l.rows * channels;
    for (int64_t t = Group::first(); t < l.rows * parts; t += Group::step()) {
        const int64_t row = t / parts, first_channel = row % l.groups * channels;
        const Acc mean = static_cast<const Acc *>(l.mean.data)[row];
        const Acc rstd = static_cast<const Acc *>(l.rstd.data)[row];
        Acc sg = 0, sgx = 0;
        for (int64_t k = Group::lane(); k < channels; k += G) {
            const Acc w = l.weight.data != nullptr ? load<Acc>(l.weight, first_channel + k) : (Acc)1;
            sg += w * sums[row * channels + k];
            sgx += w * sums[segments + row * channels + k];
        }
        Group::sum2(sg, sgx, scratch);
        const Acc mg = sg / (Acc)n, mgx = sgx / (Acc)n;
        map(row, t % parts, first_channel,
            [&](Acc w, Acc dy, Acc x) { return rstd * (dy * w - mg - (x - mean) * rstd * mgx); });
    }
}

/* The two above for any storage and compute type, an element at a time. */
template <int G, class Acc>
__global__ void __launch_bounds__(BLOCK) group_norm_channel_sums(ampc_layer_norm_backward l, Acc *sums)
{
    channel_sums<G>(l, sums, [&](int64_t base, int64_t count, auto fn) {
        row_each2<G, Acc>(l.dy, l.x, base, count, 1, [&](int64_t, Acc dy, Acc x) { fn(dy, x); });
    });
}

template <int G, class Acc>
__global__ void __launch_bounds__(BLOCK) group_norm_dx_kernel(ampc_layer_norm_backward l, const Acc *sums)
{
    group_norm_dx<G>(l, sums, 1, [&](int64_t row, int64_t, int64_t first_channel, auto fn) {
        const int64_t base = row * l.n;
        row_each2<G, Acc>(l.dy, l.x, base, l.n, 1, [&](int64_t j, Acc dy, Acc x) {
            const Acc w = l.weight.data != nullptr ? load<Acc>(l.weight, affine_index(l, first_channel, j)) : (Acc)1;
            store(l.dx, base + j, fn(w, dy, x));
        });
    });
}

/* group_norm's rows in 16-byte packs (group_packs_fit): each channel is
 * whole packs, so a pack has one channel (one division a pack, not an
 * element) and one weight. fn(c, a, b, out, C) makes C values from the C
 * values of a and b (zeros where b_row is null) of channel c; C is VEC on
 * such rows (stream_reduce's single elements are for rows that do not fit). */
template <class T, int G, class Fn>
__device__ __forceinline__ void channel_map(const T *a_row, const T *b_row, T *out_row, int64_t n, uint32_t spatial,
                                            int64_t first_channel, int lane, Fn fn)
{
    stream_reduce<T, G>(a_row, b_row, n, lane, [&](int64_t j0, const float *a, const float *b, auto count) {
        constexpr int C = decltype(count)::value;
        float out[C];
        fn(first_channel + (int64_t)((uint32_t)j0 / spatial), a, b, out, count);
        if constexpr (C == Pack<T>::VEC) {
            Pack<T> o;
#pragma unroll
            for (int i = 0; i < C; i++)
                o.set(i, out[i]);
            o.store(out_row + j0);
        } else {
            for (int i = 0; i < C; i++)
                out_row[j0 + i] = from_float<T>(out[i]);
        }
    });
}

/* Whether group_norm's rows take the streamed kernels below: a storage type
 * packs serve, channels of whole packs, the arrays on 16-byte boundaries,
 * and rows short enough for channel_map's 32-bit division. */
static inline bool group_packs_fit(int dtype, int64_t n, int64_t spatial, const void *a, const void *b,
                                   const void *c)
{
    return n <= INT32_MAX && packs_fit(dtype, spatial, a, b, c);
}

/* layer_norm_kernel for group_norm's rows, streamed in packs. */
template <class T, int G>
__global__ void __launch_bounds__(BLOCK) group_norm_streamed(ampc_layer_norm l)
{
    typedef RowGroup<G> Group;
    __shared__ float scratch[2 * BLOCK / 32];
    const int64_t n = l.n, channels = n / l.spatial;
    const int lane = Group::lane();
    for (int64_t row = Group::first(); row < l.rows; row += Group::step()) {
        const T *x = static_cast<const T *>(l.x.data) + row * n;
        float s = 0.0f;
        stream_reduce<T, G>(x, nullptr, n, lane, [&](int64_t, const float *v, const float *, auto count) {
            for (int i = 0; i < decltype(count)::value; i++)
                s += v[i];
        });
        const float mu = Group::sum(s, scratch) / (float)n;
        float q = 0.0f, d = 0.0f;
        stream_reduce<T, G>(x, nullptr, n, lane, [&](int64_t, const float *v, const float *, auto count) {
            for (int i = 0; i < decltype(count)::value; i++) {
                q += (v[i] - mu) * (v[i] - mu);
                d += v[i] - mu;
            }
        });
        Group::sum2(q, d, scratch);
        float mean, rstd;
        mean_and_rstd(mu, q, d, (float)n, (float)l.eps, mean, rstd);
        channel_map<T, G>(x, nullptr, static_cast<T *>(l.y.data) + row * n, n, (uint32_t)l.spatial,
                          row % l.groups * channels, lane, [&](int64_t c, const float *v, const float *, float *out, auto count) {
                              const float w = l.weight.data != nullptr ? load<float>(l.weight, c) : 1.0f;
                              const float b = l.bias.data != nullptr ? load<float>(l.bias, c) : 0.0f;
#pragma unroll
                              for (int i = 0; i < decltype(count)::value; i++) {
                                  float y = (v[i] - mean) * rstd;
                                  if (l.weight.data != nullptr)
                                      y *= w;
                                  if (l.bias.data != nullptr)
                                      y += b;
                                  out[i] = y;
                              }
                          });
        if (lane == 0) {
            static_cast<float *>(l.mean.data)[row] = mean;
            static_cast<float *>(l.rstd.data)[row] = rstd;
        }
    }
}

/* group_norm's rows that are whole packs, though their channels are not
 * (7x7 planes: 49 elements), held in registers as layer_norm_cached holds
 * its rows: read once, where the generic kernel read each 16-bit element
 * alone, three times (64x256x7^2 fp16 on an H200: 16 -> 9 us, torch 15).
 * Each element finds its channel by a division. */
template <class T, int G, int NV>
__global__ void __launch_bounds__(BLOCK) group_norm_cached(ampc_layer_norm l)
{
    typedef RowGroup<G> Group;
    __shared__ float scratch[2 * BLOCK / 32];
    const int64_t n = l.n, channels = n / l.spatial;
    const uint32_t spatial = (uint32_t)l.spatial;
    const int lane = Group::lane();
    for (int64_t first = Group::block_first(); first < l.rows; first += Group::step()) {
        const int64_t row = first + Group::in_block(), packs = row < l.rows ? n / Pack<T>::VEC : 0;
        CachedRow<T, G, NV> x;
        x.load(static_cast<const T *>(l.x.data) + row * n, packs, lane);
        float mean, rstd;
        cached_moments<G>(x, packs, lane, n, (float)l.eps, scratch, mean, rstd);
        const int64_t first_channel = row % l.groups * channels;
        cached_map(x, x, static_cast<T *>(l.y.data) + row * n, packs, lane, [&](int64_t j, float v, float) {
            const int64_t c = first_channel + (uint32_t)j / spatial;
            float y = (v - mean) * rstd;
            if (l.weight.data != nullptr)
                y *= load<float>(l.weight, c);
            if (l.bias.data != nullptr)
                y += load<float>(l.bias, c);
            return y;
        });
        if (lane == 0 && row < l.rows) {
            static_cast<float *>(l.mean.data)[row] = mean;
            static_cast<float *>(l.rstd.data)[row] = rstd;
        }
    }
}

/* group_norm_channel_sums, streamed in packs. Two blocks an SM at least:
 * the float32 and bfloat16 instances took 75 registers, one 512-thread
 * block an SM, and an SM summed one channel at a time. */
template <class T, int G>
__global__ void __launch_bounds__(BLOCK, 2) group_norm_channel_sums_streamed(ampc_layer_norm_backward l, float *sums)
{
    channel_sums<G>(l, sums, [&](int64_t base, int64_t count, auto fn) {
        stream_reduce<T, G>(static_cast<const T *>(l.dy.data) + base, static_cast<const T *>(l.x.data) + base, count,
                            RowGroup<G>::lane(), [&](int64_t, const float *dy, const float *x, auto c) {
                                for (int i = 0; i < decltype(c)::value; i++)
                                    fn(dy[i], x[i]);
                            });
    });
}

/* group_norm_dx_kernel, streamed in packs (a weight a pack), each row in
 * `parts` runs of `run` channels (the last run may be short). */
template <class T, int G>
__global__ void __launch_bounds__(BLOCK)
    group_norm_dx_streamed(ampc_layer_norm_backward l, const float *sums, int64_t parts, int64_t run)
{
    group_norm_dx<G>(l, sums, parts, [&](int64_t row, int64_t part, int64_t first_channel, auto fn) {
        const int64_t channels = l.n / l.spatial, c0 = part * run, c1 = c0 + run < channels ? c0 + run : channels;
        const int64_t base = row * l.n + c0 * l.spatial, length = (c1 - c0) * l.spatial;
        channel_map<T, G>(static_cast<const T *>(l.dy.data) + base, static_cast<const T *>(l.x.data) + base,
                          static_cast<T *>(l.dx.data) + base, length, (uint32_t)l.spatial, first_channel + c0,
                          RowGroup<G>::lane(), [&](int64_t c, const float *dy, const float *x, float *out, auto count) {
                              const float w = l.weight.data != nullptr ? load<float>(l.weight, c) : 1.0f;
#pragma unroll
                              for (int i = 0; i < decltype(count)::value; i++)
                                  out[i] = fn(w, dy[i], x[i]);
                          });
    });
}

/* A streamed kernel launched a warp a row (narrow) for rows shorter than
 * block_from elements, else a block a row (wide). */
template <class... Params, class... Args>
int launch_streamed(void (*narrow)(Params...), void (*wide)(Params...), int64_t rows, int64_t n, int64_t block_from,
                    cudaStream_t stream, const char *what, Args... args)
{
    if (n < block_from)
        narrow<<<rows_grid(rows, 32), BLOCK, 0, stream>>>(args...);
    else
        wide<<<rows_grid(rows, BLOCK), BLOCK, 0, stream>>>(args...);
    return ampc_cuda_launched(what);
}

/* Column values of group_norm's weight gradients: sample j, channel i of
 * the channel sums; v[0] the sum of dy * xhat (dweight), v[NV - 1] of dy
 * (dbias); NV 2 for both, 1 for either alone. */
template <class Acc, int NV, bool WEIGHT>
struct ChannelSums {
    const Acc *sums;
    int64_t segments, width;  /* width: the channels of a sample */
    __device__ void operator()(int64_t, int64_t j, int64_t i, Acc *v) const
    {
        if (WEIGHT)
            v[0] = sums[segments + j * width + i];
        if (NV == 2 || !WEIGHT)
            v[NV - 1] = sums[j * width + i];
    }
};

/* group_norm's weight gradients: the column sums over the samples of its
 * channel sums s (group_norm_channel_sums'). */
template <class Acc>
int group_norm_weight_grads(int device, void *stream, const ampc_layer_norm_backward *l, const Acc *s)
{
    const int64_t channels = l->n / l->spatial, segments = l->rows * channels;
    const int64_t samples = l->rows / l->groups, width = ampc_layer_norm_weights(l->n, l->groups, l->spatial);
    const char *what = "group_norm weight gradient kernel";
    if (l->dweight.data != nullptr && l->dbias.data != nullptr)
        return column_sums<2, Acc>(device, stream, ChannelSums<Acc, 2, true>{s, segments, width}, 1, samples, width,
                                   l->dweight, l->dbias, (Acc)1, what);
    if (l->dweight.data != nullptr)
        return column_sums<1, Acc>(device, stream, ChannelSums<Acc, 1, true>{s, segments, width}, 1, samples, width,
                                   l->dweight, l->dweight, (Acc)1, what);
    if (l->dbias.data != nullptr)
        return column_sums<1, Acc>(device, stream, ChannelSums<Acc, 1, false>{s, segments, width}, 1, samples,
                                   width, l->dbias, l->dbias, (Acc)1, what);
    return AMPC_OK;
}

/* The channel length from which a block, not a warp, sums each channel:
 * a block of 512 threads for 1024 float32 elements left half of them idle. */
constexpr int64_t CHANNEL_BLOCK_FROM = STREAM_BLOCK_FROM;

/* dx's runs of whole channels a row is cut into: as many as make about
 * DX_UNITS runs in all (a few rows of many channels left most SMs idle,
 * one 512-thread block a row resident on each), none under DX_RUN_MIN
 * elements. */
constexpr int64_t DX_UNITS = 1024, DX_RUN_MIN = 4096;

static inline int64_t dx_run(int64_t rows, int64_t n, int64_t spatial)
{
    const int64_t channels = n / spatial;
    int64_t parts = (DX_UNITS + rows - 1) / rows;
    if (parts > n / DX_RUN_MIN)
        parts = n / DX_RUN_MIN;
    if (parts > channels)
        parts = channels;
    return parts > 1 ? (channels + parts - 1) / parts : channels;
}

/* group_norm's backward: the channel sums, then dx and the weight
 * gradients from them. */
template <class Acc>
int group_norm_backward(int device, void *stream, const ampc_layer_norm_backward *l)
{
    const int64_t channels = l->n / l->spatial, segments = l->rows * channels;
    Scratch sums(device, stream);
    int status = sums.get((size_t)(2 * segments) * sizeof(Acc));
    if (status != AMPC_OK)
        return status;
    const Acc *s = static_cast<const Acc *>(sums.ptr);
    const int dtype = l->x.dtype;
    if constexpr (std::is_same<Acc, float>::value) {
        if (l->dy.dtype == dtype && (l->dx.data == nullptr || l->dx.dtype == dtype) &&
            group_packs_fit(dtype, l->n, l->spatial, l->dy.data, l->x.data, l->dx.data))
            return with_storage(dtype, [&](auto type) {
                using T = decltype(type);
                const cudaStream_t st = as_stream(stream);
                int rc = launch_streamed(group_norm_channel_sums_streamed<T, 32>,
                                         group_norm_channel_sums_streamed<T, BLOCK>, segments, l->spatial,
                                         CHANNEL_BLOCK_FROM, st, "group_norm channel sums kernel", *l,
                                         static_cast<float *>(sums.ptr));
                if (rc == AMPC_OK && l->dx.data != nullptr) {
                    const int64_t run = dx_run(l->rows, l->n, l->spatial), parts = (channels + run - 1) / run;
                    rc = launch_streamed(group_norm_dx_streamed<T, 32>, group_norm_dx_streamed<T, BLOCK>,
                                         l->rows * parts, run * l->spatial, STREAM_BLOCK_FROM, st,
                                         "group_norm backward kernel", *l, s, parts, run);
                }
                return rc == AMPC_OK ? group_norm_weight_grads<Acc>(device, stream, l, s) : rc;
            });
    }
    /* a thread a channel where channels are short (neighbouring threads read neighbouring channels) */
    RowLaunch L = row_launch(ampc_rows{segments, l->spatial, 1});
    if (l->spatial < 32) {
        L.group = 1;
        L.grid = grid_for(segments, BLOCK);
    }
    AMPC_LAUNCH_ROWS(group_norm_channel_sums, Acc, L, as_stream(stream), *l, static_cast<Acc *>(sums.ptr));
    status = ampc_cuda_launched("group_norm channel sums kernel");
    if (status != AMPC_OK)
        return status;
    if (l->dx.data != nullptr) {
        const RowLaunch R = row_launch(ampc_rows{l->rows, l->n, 1});
        AMPC_LAUNCH_ROWS(group_norm_dx_kernel, Acc, R, as_stream(stream), *l, s);
        status = ampc_cuda_launched("group_norm backward kernel");
        if (status != AMPC_OK)
            return status;
    }
    return group_norm_weight_grads<Acc>(device, stream, l, s);
}

/* Column values for the weight gradients: row j, feature i. */
template <class Acc>
struct DyXhat {  /* dweight and dbias */
    ampc_layer_norm_backward l;
    __device__ void operator()(int64_t, int64_t j, int64_t i, Acc *v) const
    {
        const Acc dy = load<Acc>(l.dy, j * l.n + i);
        const Acc mean = static_cast<const Acc *>(l.mean.data)[j], rstd = static_cast<const Acc *>(l.rstd.data)[j];
        v[0] = dy * (load<Acc>(l.x, j * l.n + i) - mean) * rstd;
        v[1] = dy;
    }
};

template <class Acc>
struct Dy {  /* dbias alone */
    ampc_layer_norm_backward l;
    __device__ void operator()(int64_t, int64_t j, int64_t i, Acc *v) const { v[0] = load<Acc>(l.dy, j * l.n + i); }
};

template <class Acc>
struct DyXhatOnly {  /* dweight alone */
    ampc_layer_norm_backward l;
    __device__ void operator()(int64_t, int64_t j, int64_t i, Acc *v) const
    {
        DyXhat<Acc> both{l};
        Acc two[2];
        both(0, j, i, two);
        v[0] = two[0];
    }
};

template <class Acc>
int layer_norm_backward(int device, void *stream, const ampc_layer_norm_backward *l)
{
    if (l->groups > 0)
        return group_norm_backward<Acc>(device, stream, l);
    if (l->dx.data != nullptr) {
        const RowLaunch L = row_launch(ampc_rows{l->rows, l->n, 1});
        AMPC_LAUNCH_ROWS(layer_norm_dx_kernel, Acc, L, as_stream(stream), *l);
        const int status = ampc_cuda_launched("layer_norm backward kernel");
        if (status != AMPC_OK)
            return status;
    }
    const char *what = "layer_norm weight gradient kernel";
    if (l->dweight.data != nullptr && l->dbias.data != nullptr)
        return column_sums<2, Acc>(device, stream, DyXhat<Acc>{*l}, 1, l->rows, l->n, l->dweight, l->dbias,
                                   (Acc)1, what);
    if (l->dweight.data != nullptr)
        return column_sums<1, Acc>(device, stream, DyXhatOnly<Acc>{*l}, 1, l->rows, l->n, l->dweight, l->dweight,
                                   (Acc)1, what);
    if (l->dbias.data != nullptr)
        return column_sums<1, Acc>(device, stream, Dy<Acc>{*l}, 1, l->rows, l->n, l->dbias, l->dbias, (Acc)1, what);
    return AMPC_OK;
}

template <class T, int G, int NV>
__global__ void __launch_bounds__(BLOCK) layer_norm_cached(ampc_layer_norm l)
{
    typedef RowGroup<G> Group;
    constexpr int VEC = vec_of<T>();
    __shared__ float scratch[2 * BLOCK / 32];
    const int64_t n = l.n;
    const int lane = Group::lane();
    const T *w = static_cast<const T *>(l.weight.data), *b = static_cast<const T *>(l.bias.data);
    for (int64_t first = Group::block_first(); first < l.rows; first += Group::step()) {
        const int64_t row = first + Group::in_block(), packs = row < l.rows ? n / VEC : 0;
        CachedRow<T, G, NV> x;
        x.load(static_cast<const T *>(l.x.data) + row * n, packs, lane);
        float mean, rstd;
        cached_moments<G>(x, packs, lane, n, (float)l.eps, scratch, mean, rstd);
        T *y = static_cast<T *>(l.y.data) + row * n;
#pragma unroll
        for (int k = 0; k < NV; k++) {
            const int64_t p = lane + (int64_t)k * G;
            if (p >= packs)
                continue;
            Pack<T> pw, pb, out;
            if (w != nullptr)
                pw.load(w + p * VEC);
            if (b != nullptr)
                pb.load(b + p * VEC);
#pragma unroll
            for (int i = 0; i < VEC; i++) {
                float v = (x.p[k][i] - mean) * rstd;
                if (w != nullptr)
                    v *= pw[i];
                if (b != nullptr)
                    v += pb[i];
                out.set(i, v);
            }
            out.store(y + p * VEC);
        }
        if (lane == 0 && row < l.rows) {
            static_cast<float *>(l.mean.data)[row] = mean;
            static_cast<float *>(l.rstd.data)[row] = rstd;
        }
    }
}

/* dx of layer_norm_dx_kernel from rows held in registers. */
template <class T, int G, int NV>
__global__ void __launch_bounds__(BLOCK) layer_norm_dx_cached(ampc_layer_norm_backward l)
{
    typedef RowGroup<G> Group;
    constexpr int VEC = vec_of<T>();
    __shared__ float scratch[2 * BLOCK / 32];
    const int64_t n = l.n;
    const int lane = Group::lane();
    const T *w = static_cast<const T *>(l.weight.data);
    for (int64_t first = Group::block_first(); first < l.rows; first += Group::step()) {
        const int64_t row = first + Group::in_block(), packs = row < l.rows ? n / VEC : 0;
        CachedRow<T, G, NV> dy, x;
        dy.load(static_cast<const T *>(l.dy.data) + row * n, packs, lane);
        x.load(static_cast<const T *>(l.x.data) + row * n, packs, lane);
        const float mean = packs > 0 ? static_cast<const float *>(l.mean.data)[row] : 0.0f;
        const float rstd = packs > 0 ? static_cast<const float *>(l.rstd.data)[row] : 0.0f;
        float sg = 0.0f, sgx = 0.0f;
#pragma unroll
        for (int k = 0; k < NV; k++) {
            const int64_t p = lane + (int64_t)k * G;
            if (p >= packs)
                continue;
            Pack<T> pw;
            if (w != nullptr)
                pw.load(w + p * VEC);
#pragma unroll
            for (int i = 0; i < VEC; i++) {
                const float g = w != nullptr ? dy.p[k][i] * pw[i] : dy.p[k][i];
                sg += g;
                sgx += g * (x.p[k][i] - mean) * rstd;
            }
        }
        Group::sum2(sg, sgx, scratch);
        const float mg = sg / (float)n, mgx = sgx / (float)n;
        T *dx = static_cast<T *>(l.dx.data) + row * n;
#pragma unroll
        for (int k = 0; k < NV; k++) {
            const int64_t p = lane + (int64_t)k * G;
            if (p >= packs)
                continue;
            Pack<T> pw, out;
            if (w != nullptr)
                pw.load(w + p * VEC);
#pragma unroll
            for (int i = 0; i < VEC; i++) {
                const float g = w != nullptr ? dy.p[k][i] * pw[i] : dy.p[k][i];
                out.set(i, rstd * (g - mg - (x.p[k][i] - mean) * rstd * mgx));
            }
            out.store(dx + p * VEC);
        }
    }
}

/* Column values of the weight gradients a pack at a time: v[0] = dy * xhat
 * (dweight), v[NV - 1] = dy (dbias); NV 2 for both, 1 for either alone. */
template <class T, int NV, bool WEIGHT>
struct PackedDyXhat {
    const T *dy, *x;
    const float *mean, *rstd;
    int64_t n;
    template <class Values>
    __device__ void operator()(int64_t j, int64_t pack, Values &v) const
    {
        Pack<T> d, xx;
        d.load(dy + j * n + pack * Pack<T>::VEC);
        if (WEIGHT)
            xx.load(x + j * n + pack * Pack<T>::VEC);
        const float mu = mean[j], rs = rstd[j];
#pragma unroll
        for (int i = 0; i < Pack<T>::VEC; i++) {
            if (WEIGHT)
                v[0][i] = d[i] * (xx[i] - mu) * rs;
            v[NV - 1][i] = d[i];
        }
    }
};

template <class T>
int layer_norm_weight_grads_packed(int device, void *stream, const ampc_layer_norm_backward *l)
{
    const T *dy = static_cast<const T *>(l->dy.data), *x = static_cast<const T *>(l->x.data);
    const float *mean = static_cast<const float *>(l->mean.data), *rstd = static_cast<const float *>(l->rstd.data);
    const char *what = "layer_norm weight gradient kernel";
    if (l->dweight.data != nullptr && l->dbias.data != nullptr)
        return packed_column_sums<T, 2>(device, stream, PackedDyXhat<T, 2, true>{dy, x, mean, rstd, l->n}, l->rows,
                                        l->n, l->dweight, l->dbias, 1.0f, what);
    if (l->dweight.data != nullptr)
        return packed_column_sums<T, 1>(device, stream, PackedDyXhat<T, 1, true>{dy, x, mean, rstd, l->n}, l->rows,
                                        l->n, l->dweight, l->dweight, 1.0f, what);
    return packed_column_sums<T, 1>(device, stream, PackedDyXhat<T, 1, false>{dy, x, mean, rstd, l->n}, l->rows,
                                    l->n, l->dbias, l->dbias, 1.0f, what);
}

/* The forward's fast path, or NOT_FAST. */
int layer_norm_fast(const ampc_layer_norm *l, cudaStream_t stream)
{
    const int dtype = l->x.dtype;
    if (l->groups > 0) {  /* group_norm's rows: streamed where channels are whole packs, else held */
        if (l->y.dtype != dtype)
            return NOT_FAST;
        if (group_packs_fit(dtype, l->n, l->spatial, l->x.data, l->y.data, nullptr))
            return with_storage(dtype, [&](auto type) {
                using T = decltype(type);
                return launch_streamed(group_norm_streamed<T, 32>, group_norm_streamed<T, BLOCK>, l->rows, l->n,
                                       STREAM_BLOCK_FROM, stream, "group_norm kernel", *l);
            });
        const int tier = cached_tier(l->n, dtype == AMPC_FLOAT32 ? 4 : 8);
        if (tier < 0 || !packs_fit(dtype, l->n, l->x.data, l->y.data))
            return NOT_FAST;
        return with_storage(dtype, [&](auto type) {
            using T = decltype(type);
            AMPC_LAUNCH_CACHED(group_norm_cached, T, tier, tier_grid(l->rows, tier), stream, *l);
            return ampc_cuda_launched("group_norm kernel");
        });
    }
    if (l->y.dtype != dtype || (l->weight.data != nullptr && l->weight.dtype != dtype) ||
        (l->bias.data != nullptr && l->bias.dtype != dtype) ||
        !packs_fit(dtype, l->n, l->x.data, l->y.data, l->weight.data, l->bias.data))
        return NOT_FAST;
    const int tier = cached_tier(l->n, dtype == AMPC_FLOAT32 ? 4 : 8);
    if (tier < 0)
        return NOT_FAST;
    return with_storage(dtype, [&](auto type) {
        using T = decltype(type);
        AMPC_LAUNCH_CACHED(layer_norm_cached, T, tier, tier_grid(l->rows, tier), stream, *l);
        return ampc_cuda_launched("layer_norm kernel");
    });
}

/* The backward's fast path (dx and the weight gradients), or NOT_FAST. */
int layer_norm_backward_fast(int device, void *stream, const ampc_layer_norm_backward *l)
{
    const int dtype = l->x.dtype;
    if (l->groups > 0 || l->dy.dtype != dtype || (l->dx.data != nullptr && l->dx.dtype != dtype) ||
        (l->weight.data != nullptr && l->weight.dtype != dtype) ||
        !packs_fit(dtype, l->n, l->x.data, l->dy.data, l->dx.data, l->weight.data))
        return NOT_FAST;
    const int tier = cached_tier(l->n, dtype == AMPC_FLOAT32 ? 4 : 8);
    if (tier < 0)
        return NOT_FAST;
    return with_storage(dtype, [&](auto type) {
        using T = decltype(type);
        if (l->dx.data != nullptr) {
            AMPC_LAUNCH_CACHED(layer_norm_dx_cached, T, tier, tier_grid(l->rows, tier), as_stream(stream), *l);
            const int status = ampc_cuda_launched("layer_norm backward kernel");
            if (status != AMPC_OK)
                return status;
        }
        if (l->dweight.data == nullptr && l->dbias.data == nullptr)
            return (int)AMPC_OK;
        return layer_norm_weight_grads_packed<T>(device, stream, l);
    });
}

}  // namespace

extern "C" int ampc_cuda_layer_norm(int device, void *stream, const ampc_layer_norm *l)
{
    if (l->rows == 0 || l->n == 0)
        return AMPC_OK;
    return ampc_on_device(device, [&] {
        const int fast = layer_norm_fast(l, as_stream(stream));
        if (fast != NOT_FAST)
            return fast;
        const RowLaunch L = row_launch(ampc_rows{l->rows, l->n, 1});
        if (l->x.dtype == AMPC_FLOAT64)
            AMPC_LAUNCH_ROWS(layer_norm_kernel, double, L, as_stream(stream), *l);
        else
            AMPC_LAUNCH_ROWS(layer_norm_kernel, float, L, as_stream(stream), *l);
        return ampc_cuda_launched("layer_norm kernel");
    });
}

extern "C" int ampc_cuda_layer_norm_backward(int device, void *stream, const ampc_layer_norm_backward *l)
{
    if (l->rows == 0 || l->n == 0)
        return AMPC_OK;
    return ampc_on_device(device, [&] {
        const int fast = layer_norm_backward_fast(device, stream, l);
        if (fast != NOT_FAST)
            return fast;
        return l->x.dtype == AMPC_FLOAT64 ? layer_norm_backward<double>(device, stream, l)
                                          : layer_norm_backward<float>(device, stream, l);
    });
}
