/*
 * cast.cu (workbench): variants of the float32 -> float16 contiguous cast
 * kernel, each checked against the CPU reference and timed against a
 * device-to-device copy of the same buffers. The winner goes into
 * cuda/cast.cu by hand; this file stays as the record.
 *
 *   nvcc -O3 -std=c++17 -gencode arch=compute_90,code=sm_90 -I. benchmarks/kernels/cast.cu -o /tmp/cast_bench
 *   /tmp/cast_bench [log2n]
 *
 * Floor: 6 bytes per element (4 read, 2 written). Variants:
 *   1  one thread per 8 elements, two 16-byte loads and one 16-byte store (cuda/cast.cu today)
 *   2  as 1, with the streaming cache hints __ldcs/__stcs (evict-first)
 *   3  one thread per 16 elements (four loads in flight)
 *   4  one thread per 4 elements (one 16-byte load, one 8-byte store)
 *   5  grid-stride loop over 8-element vectors, 4 blocks of 256 per SM resident at once
 *   6  as 1 with 128-thread blocks
 */
#include <cuda_fp16.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <algorithm>
#include <vector>

#include "kernels/fp_formats.h"
#include "workbench.h"

struct alignas(16) F8 { float v[8]; };
struct alignas(16) H8 { __half v[8]; };
struct alignas(16) F4 { float v[4]; };
struct alignas(8) H4 { __half v[4]; };

__global__ void v1(H8 *dst, const F8 *src, int64_t nvec)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= nvec) return;
    F8 in = src[i];
    H8 out;
#pragma unroll
    for (int k = 0; k < 8; k++) out.v[k] = __float2half_rn(in.v[k]);
    dst[i] = out;
}

__global__ void v2(H8 *dst, const F8 *src, int64_t nvec)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= nvec) return;
    const float4 *s = reinterpret_cast<const float4 *>(src + i);
    float4 a = __ldcs(s), b = __ldcs(s + 1);
    H8 out;
    float in[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
    for (int k = 0; k < 8; k++) out.v[k] = __float2half_rn(in[k]);
    __stcs(reinterpret_cast<float4 *>(dst + i), *reinterpret_cast<float4 *>(&out));
}

__global__ void v3(H8 *dst, const F8 *src, int64_t nvec)
{
    int64_t i = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * 2;
    if (i + 1 >= nvec + 1) return;
    F8 in0 = src[i];
    F8 in1 = i + 1 < nvec ? src[i + 1] : in0;
    H8 o0, o1;
#pragma unroll
    for (int k = 0; k < 8; k++) { o0.v[k] = __float2half_rn(in0.v[k]); o1.v[k] = __float2half_rn(in1.v[k]); }
    dst[i] = o0;
    if (i + 1 < nvec) dst[i + 1] = o1;
}

__global__ void v4(H4 *dst, const F4 *src, int64_t nvec)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= nvec) return;
    F4 in = src[i];
    H4 out;
#pragma unroll
    for (int k = 0; k < 4; k++) out.v[k] = __float2half_rn(in.v[k]);
    dst[i] = out;
}

__global__ void v5(H8 *dst, const F8 *src, int64_t nvec)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < nvec; i += (int64_t)gridDim.x * blockDim.x) {
        F8 in = src[i];
        H8 out;
#pragma unroll
        for (int k = 0; k < 8; k++) out.v[k] = __float2half_rn(in.v[k]);
        dst[i] = out;
    }
}

static float median(std::vector<float> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; }

int main(int argc, char **argv)
{
    const int log2n = argc > 1 ? atoi(argv[1]) : 28;
    const int64_t n = 1ll << log2n, nvec = n / 8;
    std::vector<float> h(n);
    uint64_t s = 88172645463325252ull;
    for (int64_t i = 0; i < n; i++) {
        s ^= s << 13; s ^= s >> 7; s ^= s << 17;
        h[i] = (float)((int64_t)(s >> 11) - (1ll << 52)) / (float)(1ll << 40);
    }
    float *x; __half *y; float *c;
    CHECK(cudaMalloc(&x, n * 4)); CHECK(cudaMalloc(&y, n * 2)); CHECK(cudaMalloc(&c, n * 4));
    CHECK(cudaMemcpy(x, h.data(), n * 4, cudaMemcpyHostToDevice));
    int sms; CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    cudaEvent_t a, b; CHECK(cudaEventCreate(&a)); CHECK(cudaEventCreate(&b));
    auto timed = [&](auto launch) {
        std::vector<float> t;
        for (int r = 0; r < 35; r++) {
            CHECK(cudaEventRecord(a)); launch(); CHECK(cudaEventRecord(b)); CHECK(cudaEventSynchronize(b));
            float ms; CHECK(cudaEventElapsedTime(&ms, a, b)); if (r >= 5) t.push_back(ms);
        }
        CHECK(cudaGetLastError());
        return median(t);
    };
    const float copy_ms = timed([&] { CHECK(cudaMemcpyAsync(c, x, n * 4, cudaMemcpyDeviceToDevice)); });
    const double copy_bw = 8.0 * n / copy_ms / 1e6;
    printf("copy %.3f ms %.0f GB/s (read + write)\n", copy_ms, copy_bw);
    std::vector<uint16_t> out(n);
    for (int v = 1; v <= 6; v++) {
        CHECK(cudaMemset(y, 0x7e, n * 2));
        float ms = timed([&] {
            switch (v) {
            case 1: v1<<<(nvec + 255) / 256, 256>>>((H8 *)y, (const F8 *)x, nvec); break;
            case 2: v2<<<(nvec + 255) / 256, 256>>>((H8 *)y, (const F8 *)x, nvec); break;
            case 3: v3<<<(nvec / 2 + 255) / 256, 256>>>((H8 *)y, (const F8 *)x, nvec); break;
            case 4: v4<<<(n / 4 + 255) / 256, 256>>>((H4 *)y, (const F4 *)x, n / 4); break;
            case 5: v5<<<sms * 8, 256>>>((H8 *)y, (const F8 *)x, nvec); break;
            case 6: v1<<<(nvec + 127) / 128, 128>>>((H8 *)y, (const F8 *)x, nvec); break;
            }
        });
        CHECK(cudaMemcpy(out.data(), y, n * 2, cudaMemcpyDeviceToHost));
        int64_t bad = 0;
        for (int64_t i = 0; i < n; i++) {
            uint32_t bits; memcpy(&bits, &h[i], 4);
            bad += out[i] != ampc_f32_to_f16_bits(bits);
        }
        const double bw = 6.0 * n / ms / 1e6;
        printf("variant %d %.3f ms %.0f GB/s %.1f %% of copy%s\n", v, ms, bw, 100 * bw / copy_bw, bad ? " WRONG" : "");
    }
    return 0;
}
