/*
 * batch_norm_cudnn.cu (workbench): cuDNN's channels-last training batch
 * norm through its two entry points, timed on ResNet-50's shapes, to learn
 * whether ampc can reach the kernel torch runs (batchnorm_bwtr_nhwc_semiPersist,
 * 0.149 ms at 256x2048x7^2 float32 backward against ampc's 0.186):
 *   legacy  cudnnBatchNormalizationForwardTraining / ...Backward in
 *           CUDNN_BATCHNORM_SPATIAL_PERSISTENT mode (cuda/batch_norm.c's
 *           fallback; 1.86 / 2.68 ms at 7^2 float32 on an H100, 2026-12-06);
 *   ex      ...ForwardTrainingEx / ...BackwardEx with CUDNN_BATCHNORM_OPS_BN,
 *           no activation, their workspaces and the reserve space the
 *           forward leaves for the backward (torch's calls, aten's
 *           cudnn/BatchNorm.cpp).
 * Prints each path's forward and backward (median of 20, after 3 warm-up
 * runs), the workspace and reserve sizes (a nonzero reserve is state ampc's
 * tape would have to keep from the forward to the backward), and the
 * largest difference between the two paths' outputs (y, dx, dweight) as a
 * check that both ran.
 *
 *   nvcc -O2 -std=c++17 benchmarks/kernels/batch_norm_cudnn.cu -lcudnn -o /tmp/bn_cudnn && /tmp/bn_cudnn
 */
#include <cuda_fp16.h>
#include <cudnn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <algorithm>
#include <vector>

#include "workbench.h"

#define DNN(x)                                                                                    \
    do {                                                                                          \
        cudnnStatus_t s = (x);                                                                    \
        if (s != CUDNN_STATUS_SUCCESS) {                                                          \
            fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudnnGetErrorString(s));            \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)

static const cudnnBatchNormMode_t MODE = CUDNN_BATCHNORM_SPATIAL_PERSISTENT;
static const int RUNS = 20, WARMUP = 3;

struct Case {
    int n, c, hw;
    cudnnDataType_t type;
    size_t elem;
    const char *name;
};

struct Buffers {
    void *x, *dy, *y, *dx, *y2, *dx2;
    float *w, *b, *rm, *rv, *mean, *rstd, *dw, *db, *dw2, *db2;
    void *ws, *reserve;
    size_t ws_bytes, reserve_bytes;
};

/* Median milliseconds of fn over RUNS runs, after WARMUP. */
template <class Fn>
static float time_ms(Fn fn)
{
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    for (int i = 0; i < WARMUP; i++)
        fn();
    std::vector<float> t(RUNS);
    for (int i = 0; i < RUNS; i++) {
        CHECK(cudaEventRecord(a));
        fn();
        CHECK(cudaEventRecord(b));
        CHECK(cudaEventSynchronize(b));
        CHECK(cudaEventElapsedTime(&t[i], a, b));
    }
    CHECK(cudaEventDestroy(a));
    CHECK(cudaEventDestroy(b));
    std::sort(t.begin(), t.end());
    return t[RUNS / 2];
}

/* Random data in [-1, 1) as float32 or float16, made on the host. */
static void fill(void *dst, size_t count, bool half, unsigned seed)
{
    std::vector<float> f(count);
    srand(seed);
    for (size_t i = 0; i < count; i++)
        f[i] = 2.0f * (float)rand() / (float)RAND_MAX - 1.0f;
    if (!half) {
        CHECK(cudaMemcpy(dst, f.data(), count * 4, cudaMemcpyHostToDevice));
        return;
    }
    std::vector<__half> h(count);
    for (size_t i = 0; i < count; i++)
        h[i] = __float2half(f[i]);
    CHECK(cudaMemcpy(dst, h.data(), count * 2, cudaMemcpyHostToDevice));
}

/* The largest |a - b| of two device arrays of count elements. */
static double max_diff(const void *a, const void *b, size_t count, bool half)
{
    std::vector<float> fa(count), fb(count);
    if (half) {
        std::vector<__half> ha(count), hb(count);
        CHECK(cudaMemcpy(ha.data(), a, count * 2, cudaMemcpyDeviceToHost));
        CHECK(cudaMemcpy(hb.data(), b, count * 2, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < count; i++)
            fa[i] = __half2float(ha[i]), fb[i] = __half2float(hb[i]);
    }
    else {
        CHECK(cudaMemcpy(fa.data(), a, count * 4, cudaMemcpyDeviceToHost));
        CHECK(cudaMemcpy(fb.data(), b, count * 4, cudaMemcpyDeviceToHost));
    }
    double d = 0.0;
    for (size_t i = 0; i < count; i++)
        d = std::max(d, (double)fabsf(fa[i] - fb[i]));
    return d;
}

static void run(cudnnHandle_t h, const Case &k)
{
    const size_t count = (size_t)k.n * k.c * k.hw * k.hw, bytes = count * k.elem;
    const bool half = k.type == CUDNN_DATA_HALF;
    cudnnTensorDescriptor_t xd, pd;
    DNN(cudnnCreateTensorDescriptor(&xd));
    DNN(cudnnCreateTensorDescriptor(&pd));
    DNN(cudnnSetTensor4dDescriptor(xd, CUDNN_TENSOR_NHWC, k.type, k.n, k.c, k.hw, k.hw));
    DNN(cudnnDeriveBNTensorDescriptor(pd, xd, MODE));
    Buffers m = {};
    void **big[] = {&m.x, &m.dy, &m.y, &m.dx, &m.y2, &m.dx2};
    for (void **p : big)
        CHECK(cudaMalloc(p, bytes));
    float **small[] = {&m.w, &m.b, &m.rm, &m.rv, &m.mean, &m.rstd, &m.dw, &m.db, &m.dw2, &m.db2};
    for (float **p : small)
        CHECK(cudaMalloc(p, (size_t)k.c * 4));
    fill(m.x, count, half, 1);
    fill(m.dy, count, half, 2);
    fill(m.w, k.c, false, 3);
    fill(m.b, k.c, false, 4);
    CHECK(cudaMemset(m.rm, 0, (size_t)k.c * 4));
    CHECK(cudaMemset(m.rv, 0, (size_t)k.c * 4));

    size_t fwd_ws = 0, bwd_ws = 0;
    DNN(cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(h, MODE, CUDNN_BATCHNORM_OPS_BN, xd, nullptr, xd, pd,
                                                                 nullptr, &fwd_ws));
    DNN(cudnnGetBatchNormalizationBackwardExWorkspaceSize(h, MODE, CUDNN_BATCHNORM_OPS_BN, xd, xd, xd, nullptr, xd, pd,
                                                          nullptr, &bwd_ws));
    DNN(cudnnGetBatchNormalizationTrainingExReserveSpaceSize(h, MODE, CUDNN_BATCHNORM_OPS_BN, nullptr, xd,
                                                             &m.reserve_bytes));
    m.ws_bytes = std::max(fwd_ws, bwd_ws);
    if (m.ws_bytes > 0)
        CHECK(cudaMalloc(&m.ws, m.ws_bytes));
    if (m.reserve_bytes > 0)
        CHECK(cudaMalloc(&m.reserve, m.reserve_bytes));

    const float one = 1.0f, zero = 0.0f;
    const double eps = 1e-5, momentum = 0.1;
    auto legacy_fwd = [&] {
        DNN(cudnnBatchNormalizationForwardTraining(h, MODE, &one, &zero, xd, m.x, xd, m.y, pd, m.w, m.b, momentum,
                                                   m.rm, m.rv, eps, m.mean, m.rstd));
    };
    auto legacy_bwd = [&] {
        DNN(cudnnBatchNormalizationBackward(h, MODE, &one, &zero, &one, &zero, xd, m.x, xd, m.dy, xd, m.dx, pd, m.w,
                                            m.dw, m.db, eps, m.mean, m.rstd));
    };
    auto ex_fwd = [&] {
        DNN(cudnnBatchNormalizationForwardTrainingEx(h, MODE, CUDNN_BATCHNORM_OPS_BN, &one, &zero, xd, m.x, nullptr,
                                                     nullptr, xd, m.y2, pd, m.w, m.b, momentum, m.rm, m.rv, eps,
                                                     m.mean, m.rstd, nullptr, m.ws, m.ws_bytes, m.reserve,
                                                     m.reserve_bytes));
    };
    auto ex_bwd = [&] {
        DNN(cudnnBatchNormalizationBackwardEx(h, MODE, CUDNN_BATCHNORM_OPS_BN, &one, &zero, &one, &zero, xd, m.x,
                                              nullptr, nullptr, xd, m.dy, nullptr, nullptr, xd, m.dx2, pd, m.w, m.b,
                                              m.dw2, m.db2, eps, m.mean, m.rstd, nullptr, m.ws, m.ws_bytes,
                                              m.reserve, m.reserve_bytes));
    };
    const float lf = time_ms(legacy_fwd), lb = time_ms(legacy_bwd);
    const float ef = time_ms(ex_fwd), eb = time_ms(ex_bwd);
    /* the saved statistics both backward passes read are the Ex forward's last */
    legacy_bwd();
    CHECK(cudaDeviceSynchronize());
    printf("%-5s %4dx%4dx%3d^2  legacy fwd %7.3f bwd %7.3f  ex fwd %7.3f bwd %7.3f ms  ws %zu/%zu reserve %zu B"
           "  legacy-ex: y %.1e dx %.1e dw %.1e\n",
           k.name, k.n, k.c, k.hw, lf, lb, ef, eb, fwd_ws, bwd_ws, m.reserve_bytes, max_diff(m.y, m.y2, count, half),
           max_diff(m.dx, m.dx2, count, half), max_diff(m.dw, m.dw2, (size_t)k.c, false));
    for (void **p : big)
        CHECK(cudaFree(*p));
    for (float **p : small)
        CHECK(cudaFree(*p));
    CHECK(cudaFree(m.ws));
    CHECK(cudaFree(m.reserve));
    DNN(cudnnDestroyTensorDescriptor(xd));
    DNN(cudnnDestroyTensorDescriptor(pd));
}

int main()
{
    cudnnHandle_t h;
    DNN(cudnnCreate(&h));
    const int stages[5][2] = {{64, 112}, {256, 56}, {512, 28}, {1024, 14}, {2048, 7}};
    for (int half = 0; half < 2; half++)
        for (const auto &s : stages)
            run(h, Case{256, s[0], s[1], half ? CUDNN_DATA_HALF : CUDNN_DATA_FLOAT, half ? 2u : 4u,
                        half ? "fp16" : "fp32"});
    DNN(cudnnDestroy(h));
    return 0;
}
