/*
 * pool.cu: max_pool2d, avg_pool2d and adaptive_avg_pool2d (ampc_pool of
 * ops.h) over dense NCHW planes or dense channels-last images, forward
 * and backward.
 *
 * The windows are ops.h's ampc_pool_window, as on the CPU. The forward
 * takes a thread per output element. The backward gathers: a thread per
 * input element adds the gradients of the windows that used it, in window
 * order, with no atomics, so it gives the CPU's bits and the same bits on
 * every run.
 */
#include "ops.cuh"

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

template <class Acc, class I>
__global__ void pool_kernel(ampc_pool pl)
{
    const int64_t total = pl.planes * pl.p * pl.q;
    for (int64_t o = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; o < total; o += (int64_t)gridDim.x * blockDim.x) {
        const Site s = site_of<I>(pl, o, pl.p, pl.q);
        const int64_t i = s.row, j = s.col;
        const Plane x = plane_of(pl, s, pl.h, pl.w);
        int64_t h0, h1, hs, hp, w0, w1, ws, wp;
        ampc_pool_window(&pl, 0, i, &h0, &h1, &hs, &hp);
        ampc_pool_window(&pl, 1, j, &w0, &w1, &ws, &wp);
        if (pl.mode == AMPC_POOL_MAX) {
            Acc m = -INFINITY;
            int64_t at = h0 * pl.w + w0;
            bool nan = false;
            for (int64_t hh = h0; hh < h1 && !nan; hh += hs)
                for (int64_t ww = w0; ww < w1; ww += ws) {
                    const Acc v = load<Acc>(pl.x, x.offset + (hh * pl.w + ww) * x.step);
                    if (v > m || v != v) {
                        m = v;
                        at = hh * pl.w + ww;
                        if (v != v) {
                            nan = true;  /* NaN wins */
                            break;
                        }
                    }
                }
            store(pl.y, o, m);
            static_cast<int64_t *>(pl.indices.data)[o] = at;
        }
        else {
            Acc sum = 0;
            for (int64_t hh = h0; hh < h1; hh++)
                for (int64_t ww = w0; ww < w1; ww++)
                    sum += load<Acc>(pl.x, x.offset + (hh * pl.w + ww) * x.step);
            store(pl.y, o, sum / (Acc)ampc_pool_divisor(&pl, h1 - h0, w1 - w0, hp * wp));
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

template <class Acc, class I>
__global__ void pool_backward_kernel(ampc_pool pl)
{
    const int64_t total = pl.planes * pl.h * pl.w;
    const int64_t *indices = static_cast<const int64_t *>(pl.indices.data);
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        const Site s = site_of<I>(pl, e, pl.h, pl.w);
        const int64_t hh = s.row, ww = s.col, pos = hh * pl.w + ww;
        const Plane y = plane_of(pl, s, pl.p, pl.q);
        int64_t i0, i1, j0, j1;
        candidates<I>(pl, 0, hh, &i0, &i1);
        candidates<I>(pl, 1, ww, &j0, &j1);
        Acc g = 0;
        if (pl.mode == AMPC_POOL_MAX) {
            /* a window whose maximum is at pos covers it: no window to work out */
            for (int64_t i = i0; i <= i1; i++)
                for (int64_t j = j0; j <= j1; j++) {
                    const int64_t o = y.offset + (i * pl.q + j) * y.step;
                    if (indices[o] == pos)
                        g += load<Acc>(pl.y, o);
                }
            store(pl.x, e, g);
            continue;
        }
        for (int64_t i = i0; i <= i1; i++) {
            int64_t h0, h1, hs, hp;
            ampc_pool_window(&pl, 0, i, &h0, &h1, &hs, &hp);
            if (!covers(h0, h1, hs, hh))
                continue;
            for (int64_t j = j0; j <= j1; j++) {
                int64_t w0, w1, ws, wp;
                ampc_pool_window(&pl, 1, j, &w0, &w1, &ws, &wp);
                if (!covers(w0, w1, ws, ww))
                    continue;
                const int64_t o = y.offset + (i * pl.q + j) * y.step;
                g += load<Acc>(pl.y, o) / (Acc)ampc_pool_divisor(&pl, h1 - h0, w1 - w0, hp * wp);
            }
        }
        store(pl.x, e, g);
    }
}

/* Run launch(Acc{}, I{}) with the compute type for p's dtype and 32-bit
 * indices where every index and product of them fits. */
template <class Launch>
int with_types(const ampc_pool *p, Launch launch)
{
    const int64_t limit = INT32_MAX / 2;  /* sums of two of these stay in 32 bits too */
    bool narrow = p->planes * p->h * p->w < limit && p->planes * p->p * p->q < limit &&
                  (p->h + 1) * p->p < limit && (p->w + 1) * p->q < limit;
    for (int axis = 0; axis < 2; axis++)  /* a window's reach, for candidates() */
        narrow = narrow && p->stride[axis] < limit && p->pad[axis] < limit && p->dilation[axis] < limit &&
                 p->kernel[axis] < limit && (p->kernel[axis] - 1) * p->dilation[axis] < limit;
    if (p->x.dtype == AMPC_FLOAT64)
        return narrow ? launch(double{}, int32_t{}) : launch(double{}, int64_t{});
    return narrow ? launch(float{}, int32_t{}) : launch(float{}, int64_t{});
}

}  // namespace

extern "C" int ampc_cuda_pool(int device, void *stream, const ampc_pool *p)
{
    const int64_t total = p->planes * p->p * p->q;
    if (total == 0)
        return AMPC_OK;
    return ampc_on_device(device, [&] {
        return with_types(p, [&](auto acc, auto index) {
            pool_kernel<decltype(acc), decltype(index)><<<grid_for(total, 256), 256, 0, as_stream(stream)>>>(*p);
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
        return with_types(p, [&](auto acc, auto index) {
            pool_backward_kernel<decltype(acc), decltype(index)>
                <<<grid_for(total, 256), 256, 0, as_stream(stream)>>>(*p);
            return ampc_cuda_launched("pool backward kernel");
        });
    });
}
