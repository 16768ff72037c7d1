/*
 * batch_norm_nhwc.cu: training batch norm over channels-last data, ampc's
 * own kernels (cuDNN's legacy persistent mode measured 20-60 times slower
 * than torch's channels-last kernels on the H200).
 *
 * Channels-last data is a (rows = n * h * w, c) matrix, so every per-channel
 * statistic is a column sum (packs.cuh, a pack of channels per thread, two
 * fixed-order stages): the forward takes the mean, then the sum of squared
 * deviations (two passes, as the CPU: no cancellation), then writes
 * (x - mean) * rstd * w + b; the backward takes sum(dy) and sum(dy * xhat)
 * in one pass and writes dx. The formulas are the CPU kernel's
 * (spatial_real.inc). Channels must come in whole 16-byte packs; other
 * shapes go to cuDNN.
 */
#include "packs.cuh"

namespace {

using namespace ops;

template <class T>
struct Squared {  /* (x - mean)^2 */
    const T *x;
    const float *mean;
    int64_t c;
    template <class V>
    __device__ void operator()(int64_t j, int64_t pack, V &v) const
    {
        Pack<T> p;
        p.load(x + j * c + pack * Pack<T>::VEC);
#pragma unroll
        for (int i = 0; i < Pack<T>::VEC; i++) {
            const float d = p[i] - mean[pack * Pack<T>::VEC + i];
            v[0][i] = d * d;
        }
    }
};

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

/* rstd from the sum of squared deviations (in save_rstd), the running
 * averages (the unbiased variance), as the CPU kernel, and each channel's
 * scale and shift for normalize. */
__global__ void finish_statistics(ampc_batch_norm b, int64_t count, float *scale, float *shift)
{
    const float *w = static_cast<const float *>(b.weight.data), *bias = static_cast<const float *>(b.bias.data);
    for (int64_t ch = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; ch < b.c; ch += (int64_t)gridDim.x * blockDim.x) {
        float *rstd = static_cast<float *>(b.save_rstd.data) + ch;  /* holds the sum of squared deviations */
        const float mean = static_cast<const float *>(b.save_mean.data)[ch];
        const float m2 = *rstd, var = m2 / (float)count;
        *rstd = 1.0f / sqrtf(var + (float)b.eps);
        scale[ch] = (w != nullptr ? w[ch] : 1.0f) * *rstd;
        shift[ch] = (bias != nullptr ? bias[ch] : 0.0f) - mean * scale[ch];
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

template <class T>
__global__ void normalize(ampc_batch_norm b, int64_t packs, const float *scale, const float *shift)
{
    constexpr int VEC = Pack<T>::VEC;
    const int64_t per_row = b.c / VEC;
    for (int64_t q = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; q < packs; q += (int64_t)gridDim.x * blockDim.x) {
        const int64_t c0 = q % per_row * VEC;
        Pack<T> x, y;
        float k[VEC], m[VEC];
        x.load(static_cast<const T *>(b.x.data) + q * VEC);
        load_channels<VEC>(scale, c0, k);
        load_channels<VEC>(shift, c0, m);
#pragma unroll
        for (int i = 0; i < VEC; i++)
            y.set(i, x[i] * k[i] + m[i]);
        y.store(static_cast<T *>(b.y.data) + q * VEC);
    }
}

/* The input gradient's per-channel terms, dx = k * (dy - mean_dy - (x - mean) * proj). */
struct GradTerms {
    float *k, *mean_dy, *proj, *mean;
};

/* dweight = sum(dy * (x - mean)) * rstd, dbias = sum(dy), from the sums,
 * and the input gradient's terms. */
__global__ void channel_gradients(ampc_batch_norm_backward b, const float *sum_dy, const float *sum_dy_xc,
                                  int64_t count, GradTerms terms)
{
    const float *w = static_cast<const float *>(b.weight.data), *rstd = static_cast<const float *>(b.save_rstd.data);
    for (int64_t ch = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; ch < b.c; ch += (int64_t)gridDim.x * blockDim.x) {
        if (b.dweight.data != nullptr)
            static_cast<float *>(b.dweight.data)[ch] = sum_dy_xc[ch] * rstd[ch];
        if (b.dbias.data != nullptr)
            static_cast<float *>(b.dbias.data)[ch] = sum_dy[ch];
        terms.k[ch] = (w != nullptr ? w[ch] : 1.0f) * rstd[ch];
        terms.mean_dy[ch] = sum_dy[ch] / (float)count;
        terms.proj[ch] = sum_dy_xc[ch] / (float)count * rstd[ch] * rstd[ch];
        terms.mean[ch] = static_cast<const float *>(b.save_mean.data)[ch];
    }
}

template <class T>
__global__ void input_gradient(ampc_batch_norm_backward b, GradTerms terms, int64_t packs)
{
    constexpr int VEC = Pack<T>::VEC;
    const int64_t per_row = b.c / VEC;
    for (int64_t q = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; q < packs; q += (int64_t)gridDim.x * blockDim.x) {
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
        Scratch coefficients(device, stream);
        const int got = coefficients.get(2 * (size_t)b->c * sizeof(float));
        if (got != AMPC_OK)
            return got;
        float *scale = static_cast<float *>(coefficients.ptr), *shift = scale + b->c;
        return with_storage(b->x.dtype, [&](auto type) {
            using T = decltype(type);
            const T *x = static_cast<const T *>(b->x.data);
            const float inv = 1.0f / (float)rows;
            int rc = packed_column_sums<T, 1>(device, stream, PlainColumns<T>{x, b->c}, rows, b->c, b->save_mean,
                                              b->save_mean, inv, "batch_norm mean");
            if (rc == AMPC_OK)
                rc = packed_column_sums<T, 1>(device, stream,
                                              Squared<T>{x, static_cast<const float *>(b->save_mean.data), b->c},
                                              rows, b->c, b->save_rstd, b->save_rstd, 1.0f, "batch_norm variance");
            if (rc != AMPC_OK)
                return rc;
            finish_statistics<<<grid_for(b->c, 256), 256, 0, as_stream(stream)>>>(*b, rows, scale, shift);
            rc = ampc_cuda_launched("batch_norm statistics kernel");
            if (rc != AMPC_OK)
                return rc;
            const int64_t packs = rows * b->c / Pack<T>::VEC;
            normalize<T><<<grid_for(packs, 256), 256, 0, as_stream(stream)>>>(*b, packs, scale, shift);
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
