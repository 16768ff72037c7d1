/*
 * pool.cu: max_pool2d, avg_pool2d and adaptive_avg_pool2d (ampc_pool of
 * op_descriptors.h) over dense NCHW planes or dense channels-last images, forward
 * and backward.
 *
 * The windows are op_descriptors.h's ampc_pool_window, as on the CPU. The forward
 * takes a thread per output element. The backward gathers: a thread per
 * input element adds the gradients of the windows that used it, in window
 * order, with no atomics, so it gives the CPU's bits and the same bits on
 * every run. Channels-last images of whole 16-byte packs of channels take
 * a thread per pack instead (pool_packed_kernel).
 */
#include "packs.cuh"

namespace {

using namespace ops;

/* Element `at` of a dense tensor of images rows x cols, in the pool's
 * layout: which image, which channel (0 for NCHW planes, each plane its
 * own image there), and which row and column. A thread per element in
 * memory order reads and writes neighbouring addresses in either layout
 * (channels-last's neighbours are the channels of one pixel). */
struct Site {
    int64_t image, channel, row, col;
};

__device__ __forceinline__ int64_t interleaved(const ampc_pool &pl)
{
    return pl.channels_last ? pl.channels : 1;
}

/* I: the index type of the divisions, 32 bits where every index fits (a
 * 64-bit division costs several times a 32-bit one, and these kernels
 * are bound by their index arithmetic, not by memory). */
template <class I>
__device__ __forceinline__ Site site_of(const ampc_pool &pl, int64_t at64, int64_t rows64, int64_t cols64)
{
    const I at = (I)at64, rows = (I)rows64, cols = (I)cols64, channels = (I)pl.channels;
    Site s;
    s.channel = pl.channels_last ? at % channels : 0;
    I pixel = pl.channels_last ? at / channels : at;
    s.col = pixel % cols;
    pixel /= cols;
    s.row = pixel % rows;
    s.image = pixel / rows;
    return s;
}

/* Where pixel (row, col) of site s's image and channel lies in a tensor
 * of images rows x cols: offset + (row * cols + col) * step. */
struct Plane {
    int64_t offset, step;
};

__device__ __forceinline__ Plane plane_of(const ampc_pool &pl, const Site &s, int64_t rows, int64_t cols)
{
    const int64_t step = interleaved(pl);
    return {s.image * rows * cols * step + s.channel, step};
}

/* The compute type of storage type T (float, or double for float64
 * data), and the conversions: every kernel here is compiled for its
 * storage type, as a run-time switch on the dtype at every load and store
 * cost the NCHW kernels half their speed. */
template <class T>
struct Compute {
    using type = float;
};
template <>
struct Compute<double> {
    using type = double;
};

template <class T>
__device__ __forceinline__ typename Compute<T>::type widen(T v) { return to_float(v); }
template <>
__device__ __forceinline__ double widen<double>(double v) { return v; }
template <class T>
__device__ __forceinline__ T narrow(typename Compute<T>::type v) { return from_float<T>(v); }
template <>
__device__ __forceinline__ double narrow<double>(double v) { return v; }

/* A thread per output element. I: the type of the index arithmetic. */
template <class T, class I>
__global__ void pool_kernel(ampc_pool pl)
{
    using Acc = typename Compute<T>::type;
    const int64_t total = pl.planes * pl.p * pl.q;
    const I w = (I)pl.w;
    for (int64_t o = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; o < total; o += (int64_t)gridDim.x * blockDim.x) {
        const Site s = site_of<I>(pl, o, pl.p, pl.q);
        const Plane x = plane_of(pl, s, pl.h, pl.w);
        const T *in = static_cast<const T *>(pl.x.data) + x.offset;
        const I step = (I)x.step;
        int64_t h0, h1, hs, hp, w0, w1, ws, wp;
        ampc_pool_window(&pl, 0, s.row, &h0, &h1, &hs, &hp);
        ampc_pool_window(&pl, 1, s.col, &w0, &w1, &ws, &wp);
        if (pl.mode == AMPC_POOL_MAX) {
            Acc m = -INFINITY;
            I at = (I)(h0 * pl.w + w0);
            bool nan = false;
            for (I hh = (I)h0; hh < (I)h1 && !nan; hh += (I)hs)
                for (I ww = (I)w0; ww < (I)w1; ww += (I)ws) {
                    const Acc v = widen(in[(hh * w + ww) * step]);
                    if (v > m || v != v) {
                        m = v;
                        at = hh * w + ww;
                        if (v != v) {
                            nan = true;  /* NaN wins */
                            break;
                        }
                    }
                }
            static_cast<T *>(pl.y.data)[o] = narrow<T>(m);
            static_cast<int64_t *>(pl.indices.data)[o] = at;
        }
        else {
            Acc sum = 0;
            for (I hh = (I)h0; hh < (I)h1; hh++)
                for (I ww = (I)w0; ww < (I)w1; ww++)
                    sum += widen(in[(hh * w + ww) * step]);
            static_cast<T *>(pl.y.data)[o] = narrow<T>(sum / (Acc)ampc_pool_divisor(&pl, h1 - h0, w1 - w0, hp * wp));
        }
    }
}

/* The windows along one axis that may cover position x: [*first, *last]. */
template <class I>
__device__ __forceinline__ void candidates(const ampc_pool &pl, int axis, int64_t x64, int64_t *first, int64_t *last)
{
    const I x = (I)x64, out = (I)(axis == 0 ? pl.p : pl.q), in = (I)(axis == 0 ? pl.h : pl.w);
    if (pl.mode == AMPC_POOL_ADAPTIVE_AVG) {
        const I lo = x * out / in - 1, hi = (x + 1) * out / in + 1;
        *first = lo < 0 ? 0 : lo;
        *last = hi > out - 1 ? out - 1 : hi;
        return;
    }
    const I stride = (I)pl.stride[axis], pad = (I)pl.pad[axis];
    const I reach = x + pad - (I)((pl.kernel[axis] - 1) * pl.dilation[axis]);
    *first = reach <= 0 ? 0 : (reach + stride - 1) / stride;
    const I hi = (x + pad) / stride;
    *last = hi > out - 1 ? out - 1 : hi;
}

__device__ __forceinline__ bool covers(int64_t lo, int64_t hi, int64_t step, int64_t x)
{
    return x >= lo && x < hi && (x - lo) % step == 0;
}

/* A thread per input element. */
template <class T, class I>
__global__ void pool_backward_kernel(ampc_pool pl)
{
    using Acc = typename Compute<T>::type;
    const int64_t total = pl.planes * pl.h * pl.w;
    const I q = (I)pl.q;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        const Site s = site_of<I>(pl, e, pl.h, pl.w);
        const I hh = (I)s.row, ww = (I)s.col, pos = hh * (I)pl.w + ww;
        const Plane y = plane_of(pl, s, pl.p, pl.q);
        const T *dy = static_cast<const T *>(pl.y.data) + y.offset;
        const int64_t *indices = static_cast<const int64_t *>(pl.indices.data) + y.offset;
        const I step = (I)y.step;
        int64_t i0, i1, j0, j1;
        candidates<I>(pl, 0, hh, &i0, &i1);
        candidates<I>(pl, 1, ww, &j0, &j1);
        Acc g = 0;
        if (pl.mode == AMPC_POOL_MAX) {
            /* a window whose maximum is at pos covers it: no window to work out */
            for (I i = (I)i0; i <= (I)i1; i++)
                for (I j = (I)j0; j <= (I)j1; j++) {
                    const I o = (i * q + j) * step;
                    if (indices[o] == pos)
                        g += widen(dy[o]);
                }
            static_cast<T *>(pl.x.data)[e] = narrow<T>(g);
            continue;
        }
        for (I i = (I)i0; i <= (I)i1; i++) {
            int64_t h0, h1, hs, hp;
            ampc_pool_window(&pl, 0, i, &h0, &h1, &hs, &hp);
            if (!covers(h0, h1, hs, hh))
                continue;
            for (I j = (I)j0; j <= (I)j1; j++) {
                int64_t w0, w1, ws, wp;
                ampc_pool_window(&pl, 1, j, &w0, &w1, &ws, &wp);
                if (!covers(w0, w1, ws, ww))
                    continue;
                g += widen(dy[(i * q + j) * step]) / (Acc)ampc_pool_divisor(&pl, h1 - h0, w1 - w0, hp * wp);
            }
        }
        static_cast<T *>(pl.x.data)[e] = narrow<T>(g);
    }
}

/* Channels-last images whose channels are whole 16-byte packs (every
 * network's): a thread per pack of V channels of one pixel. A thread per
 * element worked out its windows once per channel, and that arithmetic,
 * not memory, bounded the kernels above; here it is done once for V
 * channels, and the loads and stores move 16 bytes. The same windows in
 * the same order, so the same bits. */
template <class T, class I>
__global__ void pool_packed_kernel(ampc_pool pl)
{
    constexpr int V = Pack<T>::VEC;
    const int64_t packs = pl.planes * pl.p * pl.q / V;
    for (int64_t u = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; u < packs; u += (int64_t)gridDim.x * blockDim.x) {
        const int64_t o = u * V;
        const Site s = site_of<I>(pl, o, pl.p, pl.q);
        const Plane x = plane_of(pl, s, pl.h, pl.w);
        const T *xs = static_cast<const T *>(pl.x.data) + x.offset;
        int64_t h0, h1, hs, hp, w0, w1, ws, wp;
        ampc_pool_window(&pl, 0, s.row, &h0, &h1, &hs, &hp);
        ampc_pool_window(&pl, 1, s.col, &w0, &w1, &ws, &wp);
        float acc[V];
        if (pl.mode == AMPC_POOL_MAX) {
            int64_t at[V];
            bool nan[V];  /* a lane's first NaN wins and stays */
            for (int k = 0; k < V; k++) {
                acc[k] = -INFINITY;
                at[k] = h0 * pl.w + w0;
                nan[k] = false;
            }
            for (int64_t hh = h0; hh < h1; hh += hs)
                for (int64_t ww = w0; ww < w1; ww += ws) {
                    Pack<T> v;
                    v.load(xs + (hh * pl.w + ww) * x.step);
                    for (int k = 0; k < V; k++) {
                        const float f = v[k];
                        if (!nan[k] && (f > acc[k] || f != f)) {
                            acc[k] = f;
                            at[k] = hh * pl.w + ww;
                            nan[k] = f != f;
                        }
                    }
                }
            longlong2 *indices = reinterpret_cast<longlong2 *>(static_cast<int64_t *>(pl.indices.data) + o);
            for (int k = 0; k < V; k += 2)
                indices[k / 2] = make_longlong2(at[k], at[k + 1]);
        }
        else {
            for (int k = 0; k < V; k++)
                acc[k] = 0.0f;
            for (int64_t hh = h0; hh < h1; hh++)
                for (int64_t ww = w0; ww < w1; ww++) {
                    Pack<T> v;
                    v.load(xs + (hh * pl.w + ww) * x.step);
                    for (int k = 0; k < V; k++)
                        acc[k] += v[k];
                }
            const float divisor = (float)ampc_pool_divisor(&pl, h1 - h0, w1 - w0, hp * wp);
            for (int k = 0; k < V; k++)
                acc[k] /= divisor;
        }
        Pack<T> out;
        for (int k = 0; k < V; k++)
            out.set(k, acc[k]);
        out.store(static_cast<T *>(pl.y.data) + o);
    }
}

template <class T, class I>
__global__ void pool_backward_packed_kernel(ampc_pool pl)
{
    constexpr int V = Pack<T>::VEC;
    const int64_t packs = pl.planes * pl.h * pl.w / V;
    const T *dy = static_cast<const T *>(pl.y.data);
    const int64_t *indices = static_cast<const int64_t *>(pl.indices.data);
    for (int64_t u = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; u < packs; u += (int64_t)gridDim.x * blockDim.x) {
        const int64_t e = u * V;
        const Site s = site_of<I>(pl, e, pl.h, pl.w);
        const int64_t hh = s.row, ww = s.col, pos = hh * pl.w + ww;
        const Plane y = plane_of(pl, s, pl.p, pl.q);
        int64_t i0, i1, j0, j1;
        candidates<I>(pl, 0, hh, &i0, &i1);
        candidates<I>(pl, 1, ww, &j0, &j1);
        float g[V];
        for (int k = 0; k < V; k++)
            g[k] = 0.0f;
        for (int64_t i = i0; i <= i1; i++) {
            int64_t h0 = 0, h1 = 0, hs = 0, hp = 0;
            if (pl.mode != AMPC_POOL_MAX) {
                ampc_pool_window(&pl, 0, i, &h0, &h1, &hs, &hp);
                if (!covers(h0, h1, hs, hh))
                    continue;
            }
            for (int64_t j = j0; j <= j1; j++) {
                const int64_t o = y.offset + (i * pl.q + j) * y.step;
                if (pl.mode == AMPC_POOL_MAX) {
                    /* a window whose maximum is at pos covers it; dy read only where one is */
                    bool mine[V], any = false;
                    const longlong2 *at = reinterpret_cast<const longlong2 *>(indices + o);
                    for (int k = 0; k < V; k += 2) {
                        const longlong2 two = __ldg(at + k / 2);
                        mine[k] = two.x == pos;
                        mine[k + 1] = two.y == pos;
                        any = any || mine[k] || mine[k + 1];
                    }
                    if (!any)
                        continue;
                    Pack<T> d;
                    d.load(dy + o);
                    for (int k = 0; k < V; k++)
                        if (mine[k])
                            g[k] += d[k];
                    continue;
                }
                int64_t w0, w1, ws, wp;
                ampc_pool_window(&pl, 1, j, &w0, &w1, &ws, &wp);
                if (!covers(w0, w1, ws, ww))
                    continue;
                const float divisor = (float)ampc_pool_divisor(&pl, h1 - h0, w1 - w0, hp * wp);
                Pack<T> d;
                d.load(dy + o);
                for (int k = 0; k < V; k++)
                    g[k] += d[k] / divisor;
            }
        }
        Pack<T> out;
        for (int k = 0; k < V; k++)
            out.set(k, g[k]);
        out.store(static_cast<T *>(pl.x.data) + e);
    }
}

/* Whether every index of p and every product of two fits in 32 bits. */
bool indices_fit_32(const ampc_pool *p)
{
    const int64_t limit = INT32_MAX / 2;  /* sums of two of these stay in 32 bits too */
    bool narrow = p->planes * p->h * p->w < limit && p->planes * p->p * p->q < limit &&
                  (p->h + 1) * p->p < limit && (p->w + 1) * p->q < limit;
    for (int axis = 0; axis < 2; axis++)  /* a window's reach, for candidates() */
        narrow = narrow && p->stride[axis] < limit && p->pad[axis] < limit && p->dilation[axis] < limit &&
                 p->kernel[axis] < limit && (p->kernel[axis] - 1) * p->dilation[axis] < limit;
    return narrow;
}

/* Whether p takes the packed kernels: channels-last, x and y (dy and dx)
 * of one storage type in whole packs of channels on 16-byte boundaries. */
bool packed(const ampc_pool *p)
{
    return p->channels_last && p->x.dtype == p->y.dtype &&
           packs_fit(p->x.dtype, p->channels, p->x.data, p->y.data,
                     p->mode == AMPC_POOL_MAX ? p->indices.data : nullptr);
}

/* Run launch(T{}, I{}) or, where packed(p), launch_packed(T{}, I{}), with
 * p's storage type T and 32-bit index arithmetic I where every index and
 * product of them fits. */
template <class Launch, class LaunchPacked>
int with_types(const ampc_pool *p, Launch launch, LaunchPacked launch_packed)
{
    const bool fits_32 = indices_fit_32(p);
    if (packed(p))
        return with_storage(p->x.dtype, [&](auto t) {
            return fits_32 ? launch_packed(t, int32_t{}) : launch_packed(t, int64_t{});
        });
    if (p->x.dtype == AMPC_FLOAT64)
        return fits_32 ? launch(double{}, int32_t{}) : launch(double{}, int64_t{});
    return with_storage(p->x.dtype, [&](auto t) { return fits_32 ? launch(t, int32_t{}) : launch(t, int64_t{}); });
}

}  // namespace

extern "C" int ampc_cuda_pool(int device, void *stream, const ampc_pool *p)
{
    const int64_t total = p->planes * p->p * p->q;
    if (total == 0)
        return AMPC_OK;
    return ampc_on_device(device, [&] {
        return with_types(
            p,
            [&](auto t, auto index) {
                pool_kernel<decltype(t), decltype(index)><<<grid_for(total, 256), 256, 0, as_stream(stream)>>>(*p);
                return ampc_cuda_launched("pool kernel");
            },
            [&](auto t, auto index) {
                const int64_t packs = total / vec_of<decltype(t)>();
                pool_packed_kernel<decltype(t), decltype(index)>
                    <<<grid_for(packs, 256), 256, 0, as_stream(stream)>>>(*p);
                return ampc_cuda_launched("pool kernel");
            });
    });
}

extern "C" int ampc_cuda_pool_backward(int device, void *stream, const ampc_pool_backward *pb)
{
    const ampc_pool *p = &pb->pool;
    const int64_t total = p->planes * p->h * p->w;
    if (total == 0)
        return AMPC_OK;
    return ampc_on_device(device, [&] {
        return with_types(
            p,
            [&](auto t, auto index) {
                pool_backward_kernel<decltype(t), decltype(index)>
                    <<<grid_for(total, 256), 256, 0, as_stream(stream)>>>(*p);
                return ampc_cuda_launched("pool backward kernel");
            },
            [&](auto t, auto index) {
                const int64_t packs = total / vec_of<decltype(t)>();
                pool_backward_packed_kernel<decltype(t), decltype(index)>
                    <<<grid_for(packs, 256), 256, 0, as_stream(stream)>>>(*p);
                return ampc_cuda_launched("pool backward kernel");
            });
    });
}
