/*
 * optim.cu: ampc.optim's fused SGD and Adam(W) steps on the GPU.
 *
 * Multi-tensor like the scaler's unscale (cuda/scaler.cu): up to TABLE
 * parameters of any floating dtypes a launch, cut into CHUNK-element pieces,
 * a block a piece, the table passed by value. A thread takes ILP adjacent
 * elements of the parameter, its gradient and its state, with vector
 * accesses where every array of the parameter is aligned for them, and runs
 * the element math of kernels/optim_math.h, the CPU kernels' own (this file is
 * compiled with --fmad=false so that the two agree bit for bit).
 *
 * With a GradScaler: grad_scale divides the gradients (the unscaled values
 * are written back, as torch's fused optimizers do) and a non-zero
 * found_inf makes every block return at once; the small kernels that count
 * Adam's steps and record SGD's first step look at found_inf too. The host
 * never reads either value, so a step never waits for the device.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "common.h"
#include "dispatch.cuh"
#include "multi_tensor.cuh"
#include "kernels/optim_descriptors.h"
#include "kernels/optim_math.h"

namespace {

constexpr int64_t CHUNK = 1 << 14;
constexpr int BLOCK = 256;
constexpr int ILP = 4;
/* 128 parameters of 8 pointers and sizes each: about 9 KB of kernel
 * parameters (sm_70+ takes 32 KiB). */
constexpr int TABLE = 128;

struct OptimTable {
    int n;
    int dtype;                       /* every entry's: one kernel instantiation a dtype */
    bool any_step;                   /* some entry has a step pointer */
    int64_t first_chunk[TABLE + 1];  /* parameter k has chunks [first_chunk[k], first_chunk[k + 1]) */
    char *param[TABLE];
    char *grad[TABLE];
    char *state[3][TABLE];
    float *step[TABLE];
    int64_t numel[TABLE];
};

/* The storage types and their opmath: float32 and the 16-bit formats work
 * in float32, float64 in float64. */
struct f16_bits { uint16_t b; };
struct bf16_bits { uint16_t b; };
/* A dtype's storage type, from its tag (dispatch.cuh). */
template <class Tag>
using Storage = float_type<Tag, f16_bits, bf16_bits, float, double>;

template <typename S> struct Elem;
template <> struct Elem<float> {
    using Op = float;
    static __device__ __forceinline__ float load(float x) { return x; }
    static __device__ __forceinline__ float store(float v) { return v; }
};
template <> struct Elem<double> {
    using Op = double;
    static __device__ __forceinline__ double load(double x) { return x; }
    static __device__ __forceinline__ double store(double v) { return v; }
};
template <> struct Elem<f16_bits> {
    using Op = float;
    static __device__ __forceinline__ float load(f16_bits x) { return __half2float(__ushort_as_half(x.b)); }
    static __device__ __forceinline__ f16_bits store(float v) { return {__half_as_ushort(__float2half_rn(v))}; }
};
template <> struct Elem<bf16_bits> {
    using Op = float;
    static __device__ __forceinline__ float load(bf16_bits x) { return __uint_as_float((uint32_t)x.b << 16); }
    static __device__ __forceinline__ bf16_bits store(float v)
    {
        return {__bfloat16_as_ushort(__float2bfloat16_rn(v))};
    }
};

/* The element math of optim_math.h under one name per step. */
__device__ __forceinline__ float unscaled(float g, const float *gs) { return ampc_unscaled_float(g, gs); }
__device__ __forceinline__ double unscaled(double g, const float *gs) { return ampc_unscaled_double(g, gs); }
__device__ __forceinline__ float sgd(float p, float g, float *b, int first, const ampc_sgd_config *c)
{
    return ampc_sgd_float(p, g, b, first, c);
}
__device__ __forceinline__ double sgd(double p, double g, double *b, int first, const ampc_sgd_config *c)
{
    return ampc_sgd_double(p, g, b, first, c);
}
__device__ __forceinline__ void adam_factors(float step, const ampc_adam_config *c, float *s, float *b)
{
    ampc_adam_factors_float(step, c, s, b);
}
__device__ __forceinline__ void adam_factors(float step, const ampc_adam_config *c, double *s, double *b)
{
    ampc_adam_factors_double(step, c, s, b);
}
__device__ __forceinline__ float adam(float p, float g, float *m, float *v, float *w, float s, float b,
                                      const ampc_adam_config *c)
{
    return ampc_adam_float(p, g, m, v, w, s, b, c);
}
__device__ __forceinline__ double adam(double p, double g, double *m, double *v, double *w, double s, double b,
                                       const ampc_adam_config *c)
{
    return ampc_adam_double(p, g, m, v, w, s, b, c);
}

/* ILP adjacent elements [i, i + ILP) of one array, cut at end. */
template <typename S> struct alignas(sizeof(S) * ILP) Pack { S v[ILP]; };

template <typename S>
__device__ __forceinline__ void load(const char *base, int64_t i, int64_t end, bool vec,
                                     typename Elem<S>::Op out[ILP])
{
    const S *a = reinterpret_cast<const S *>(base);
    if (vec) {
        const Pack<S> pack = *reinterpret_cast<const Pack<S> *>(a + i);
#pragma unroll
        for (int j = 0; j < ILP; j++)
            out[j] = Elem<S>::load(pack.v[j]);
        return;
    }
#pragma unroll
    for (int j = 0; j < ILP; j++)
        out[j] = i + j < end ? Elem<S>::load(a[i + j]) : 0;
}

template <typename S>
__device__ __forceinline__ void store(char *base, int64_t i, int64_t end, bool vec,
                                      const typename Elem<S>::Op in[ILP])
{
    S *a = reinterpret_cast<S *>(base);
    if (vec) {
        Pack<S> pack;
#pragma unroll
        for (int j = 0; j < ILP; j++)
            pack.v[j] = Elem<S>::store(in[j]);
        *reinterpret_cast<Pack<S> *>(a + i) = pack;
        return;
    }
#pragma unroll
    for (int j = 0; j < ILP; j++)
        if (i + j < end)
            a[i + j] = Elem<S>::store(in[j]);
}

template <typename S>
__device__ __forceinline__ bool packs_aligned(const char *const *arrays, int count)
{
    uintptr_t bits = 0;
    for (int a = 0; a < count; a++)
        bits |= (uintptr_t)arrays[a];
    return bits % sizeof(Pack<S>) == 0;
}

template <typename S>
__device__ void sgd_piece(const OptimTable &t, Piece w, const ampc_sgd_config *c, const float *gs)
{
    using O = typename Elem<S>::Op;
    const int k = w.k;
    const bool momentum = c->momentum != 0;
    const int first = t.step[k] != nullptr && *t.step[k] == 0.0f;
    const char *arrays[3] = {t.param[k], t.grad[k], t.state[0][k]};
    const bool aligned = packs_aligned<S>(arrays, momentum ? 3 : 2);
    for (int64_t i = w.begin + (int64_t)threadIdx.x * ILP; i < w.end; i += (int64_t)BLOCK * ILP) {
        const bool vec = aligned && i + ILP <= w.end;
        O p[ILP], g[ILP], b[ILP];
        load<S>(t.param[k], i, w.end, vec, p);
        load<S>(t.grad[k], i, w.end, vec, g);
        if (momentum && !first)
            load<S>(t.state[0][k], i, w.end, vec, b);
#pragma unroll
        for (int j = 0; j < ILP; j++) {
            if (!momentum || first)
                b[j] = 0;
            g[j] = unscaled(g[j], gs);
            p[j] = sgd(p[j], g[j], &b[j], first, c);
        }
        store<S>(t.param[k], i, w.end, vec, p);
        if (gs)
            store<S>(t.grad[k], i, w.end, vec, g);
        if (momentum)
            store<S>(t.state[0][k], i, w.end, vec, b);
    }
}

template <typename S>
__device__ void adam_piece(const OptimTable &t, Piece w, const ampc_adam_config *c, const float *gs)
{
    using O = typename Elem<S>::Op;
    const int k = w.k;
    O step_size, bc2_sqrt;
    adam_factors(*t.step[k], c, &step_size, &bc2_sqrt);
    const char *arrays[5] = {t.param[k], t.grad[k], t.state[0][k], t.state[1][k], t.state[2][k]};
    const bool aligned = packs_aligned<S>(arrays, c->amsgrad ? 5 : 4);
    for (int64_t i = w.begin + (int64_t)threadIdx.x * ILP; i < w.end; i += (int64_t)BLOCK * ILP) {
        const bool vec = aligned && i + ILP <= w.end;
        O p[ILP], g[ILP], m[ILP], v[ILP], vmax[ILP];
        load<S>(t.param[k], i, w.end, vec, p);
        load<S>(t.grad[k], i, w.end, vec, g);
        load<S>(t.state[0][k], i, w.end, vec, m);
        load<S>(t.state[1][k], i, w.end, vec, v);
        if (c->amsgrad)
            load<S>(t.state[2][k], i, w.end, vec, vmax);
#pragma unroll
        for (int j = 0; j < ILP; j++) {
            if (!c->amsgrad)
                vmax[j] = 0;
            g[j] = unscaled(g[j], gs);
            p[j] = adam(p[j], g[j], &m[j], &v[j], &vmax[j], step_size, bc2_sqrt, c);
        }
        store<S>(t.param[k], i, w.end, vec, p);
        if (gs)
            store<S>(t.grad[k], i, w.end, vec, g);
        store<S>(t.state[0][k], i, w.end, vec, m);
        store<S>(t.state[1][k], i, w.end, vec, v);
        if (c->amsgrad)
            store<S>(t.state[2][k], i, w.end, vec, vmax);
    }
}

__device__ __forceinline__ bool skipped(const float *found_inf) { return found_inf && *found_inf != 0.0f; }

/* The scale read once per thread: the element math takes it by address. */
#define LOCAL_SCALE(gs, scale) ((gs) ? ((scale) = *(gs), &(scale)) : nullptr)

/* One instantiation per storage type: the float64 one's registers would
 * otherwise halve the occupancy of the float32 one. */
template <typename S>
__global__ void __launch_bounds__(BLOCK) sgd_kernel(const OptimTable t, const ampc_sgd_config c,
                                                    const float *grad_scale, const float *found_inf)
{
    if (skipped(found_inf))
        return;
    float scale;
    sgd_piece<S>(t, this_piece<CHUNK>(t), &c, LOCAL_SCALE(grad_scale, scale));
}

template <typename S>
__global__ void __launch_bounds__(BLOCK) adam_kernel(const OptimTable t, const ampc_adam_config c,
                                                     const float *grad_scale, const float *found_inf)
{
    if (skipped(found_inf))
        return;
    float scale;
    adam_piece<S>(t, this_piece<CHUNK>(t), &c, LOCAL_SCALE(grad_scale, scale));
}

/* Adam: step += 1 before the step's kernel; SGD: mark the first step done
 * after it. Nothing when found_inf skips the step. */
__global__ void bump_steps_kernel(const OptimTable t, const float *found_inf, bool set_to_one)
{
    const int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k < t.n && t.step[k] != nullptr && !skipped(found_inf))
        *t.step[k] = set_to_one ? 1.0f : *t.step[k] + 1.0f;
}

int bump_steps(const OptimTable &t, cudaStream_t s, const float *found_inf, bool set_to_one)
{
    bump_steps_kernel<<<(unsigned)((t.n + 127) / 128), 128, 0, s>>>(t, found_inf, set_to_one);
    return ampc_cuda_launched("launching the step-count kernel");
}

/* Fill tables from the refs, one dtype at a time (the parameters are
 * independent: their order does not matter), and call launch(table, chunks)
 * for each. An empty parameter still gets an entry (its block does nothing). */
template <class Launch>
int launch_tables(const ampc_optim_ref *refs, int64_t n, Launch launch)
{
    static const int dtypes[] = {AMPC_FLOAT32, AMPC_FLOAT64, AMPC_FLOAT16, AMPC_BFLOAT16};
    OptimTable table;
    for (const int dtype : dtypes) {
        table.dtype = dtype;
        const int status = pack_and_launch<CHUNK>(
            table, n,
            [&](int64_t i, OptimTable &t, int k) {
                const ampc_optim_ref *r = &refs[i];
                if ((int)r->dtype != dtype)
                    return Entry::left_out();
                t.param[k] = r->param;
                t.grad[k] = r->grad;
                for (int s = 0; s < 3; s++)
                    t.state[s][k] = r->state[s];
                t.step[k] = r->step;
                t.any_step = (k > 0 && t.any_step) || r->step != nullptr;  /* entry 0 starts a table */
                return Entry::packed(r->numel);
            },
            launch);
        if (status != AMPC_OK)
            return status;
    }
    return AMPC_OK;
}

/* launch_tables with `device` current. */
template <class Launch>
int for_each_table(int device, const ampc_optim_ref *refs, int64_t n, Launch launch)
{
    return ampc_on_device(device, [&] { return launch_tables(refs, n, launch); });
}

}  // namespace

extern "C" int ampc_cuda_sgd(int device, void *stream, const ampc_optim_ref *refs, int64_t n,
                             const ampc_sgd_config *config, const float *grad_scale, const float *found_inf)
{
    cudaStream_t s = (cudaStream_t)stream;
    const ampc_sgd_config c = *config;
    return for_each_table(device, refs, n, [&](const OptimTable &t, int64_t chunks) {
        dispatch_float(t.dtype, [&](auto tag) {
            sgd_kernel<Storage<decltype(tag)>><<<(unsigned)chunks, BLOCK, 0, s>>>(t, c, grad_scale, found_inf);
        });
        const int st = ampc_cuda_launched("launching the SGD kernel");
        return st == AMPC_OK && t.any_step ? bump_steps(t, s, found_inf, true) : st;
    });
}

extern "C" int ampc_cuda_adam(int device, void *stream, const ampc_optim_ref *refs, int64_t n,
                              const ampc_adam_config *config, const float *grad_scale, const float *found_inf)
{
    cudaStream_t s = (cudaStream_t)stream;
    const ampc_adam_config c = *config;
    return for_each_table(device, refs, n, [&](const OptimTable &t, int64_t chunks) {
        const int st = bump_steps(t, s, found_inf, false);
        if (st != AMPC_OK)
            return st;
        dispatch_float(t.dtype, [&](auto tag) {
            adam_kernel<Storage<decltype(tag)>><<<(unsigned)chunks, BLOCK, 0, s>>>(t, c, grad_scale, found_inf);
        });
        return ampc_cuda_launched("launching the Adam kernel");
    });
}
