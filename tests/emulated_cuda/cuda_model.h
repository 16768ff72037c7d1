/*
 * cuda_model.h: enough of CUDA to run cuda/attention_kernels.cuh on the CPU,
 * so that its indexing, masking, tiling and synchronisation are checked on a
 * machine without a GPU (tests/test_attention_emulated.py builds and runs
 * attention.cpp with it).
 *
 * A block is 128 std::threads: __syncthreads is a barrier over them, and each
 * warp-wide instruction (__shfl_xor_sync, ldmatrix, mma.sync) a warp's 32
 * threads meeting at a barrier, publishing their operands, and each taking
 * its own share of the result as PTX's fragment layouts define it (a lane
 * holds rows lane / 4 and lane / 4 + 8, columns 2 * (lane % 4) and the next;
 * ldmatrix's lane l addresses row l % 8 of matrix l / 8). cp.async copies
 * are queued per thread and land when a cp.async.wait_group lets them, so a
 * read before the wait sees the old contents, as it may on the GPU. Blocks
 * run one after another, so __shared__ arrays are function-static, and a
 * launch's dynamic shared memory (launch_shared) a buffer of the block's.
 *
 * Blocks have MODEL_THREADS threads: 128 (the attention kernels'), or
 * AMPC_MODEL_THREADS where defined first (the row kernels' 512). With
 * AMPC_MODEL_ROWS defined first, the model serves ops.cuh and packs.cuh
 * (tests/emulated_cuda/shadow stands in for CUDA's headers): the 16-bit
 * conversions as intrinsics, uint4 and __ldg, rather than the attention
 * kernels' ops::to_float.
 */
#ifndef AMPC_CUDA_MODEL_H
#define AMPC_CUDA_MODEL_H

#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <thread>
#include <type_traits>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))

struct Dim3 {
    unsigned x = 0, y = 0, z = 0;
};
inline thread_local Dim3 threadIdx, blockIdx, gridDim;

/* 16-bit storage types: bits only, as the kernels use them (to_float, pack2). */
struct __half {
    uint16_t bits;
};
struct __nv_bfloat16 {
    uint16_t bits;
};

inline float half_to_float(uint16_t bits)
{
    _Float16 h;
    std::memcpy(&h, &bits, 2);
    return (float)h;
}

inline float bf16_to_float(uint16_t bits)
{
    const uint32_t u = (uint32_t)bits << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

inline uint16_t float_to_half(float f)
{
    const _Float16 h = (_Float16)f;  /* round to nearest even */
    uint16_t bits;
    std::memcpy(&bits, &h, 2);
    return bits;
}

inline uint16_t float_to_bf16(float f)
{
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if (std::isnan(f))
        return 0x7fc0;
    u += 0x7fff + ((u >> 16) & 1);  /* round to nearest even */
    return (uint16_t)(u >> 16);
}

#ifdef AMPC_MODEL_ROWS
inline float __half2float(__half v) { return half_to_float(v.bits); }
inline float __bfloat162float(__nv_bfloat16 v) { return bf16_to_float(v.bits); }
inline __half __float2half_rn(float v) { return __half{float_to_half(v)}; }
inline __nv_bfloat16 __float2bfloat16_rn(float v) { return __nv_bfloat16{float_to_bf16(v)}; }
/* Declared alone: no kernel the model runs rounds float64 to 16 bits (ops.cuh's
 * generic store does), and a use fails to link rather than round twice. */
__half __double2half(double v);
__nv_bfloat16 __double2bfloat16(double v);

struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }
inline uint4 __ldg(const uint4 *p) { return *p; }
#else
namespace ops {
inline float to_float(__half v) { return half_to_float(v.bits); }
inline float to_float(__nv_bfloat16 v) { return bf16_to_float(v.bits); }
}  // namespace ops
#endif

/* ------------------------------------------------------------------------ */
/* A block of threads                                                        */
/* ------------------------------------------------------------------------ */

#ifndef AMPC_MODEL_THREADS
#define AMPC_MODEL_THREADS 128
#endif
constexpr int MODEL_THREADS = AMPC_MODEL_THREADS;

struct Lane {  /* what a lane publishes for a warp-wide instruction */
    uint32_t a[4], b0, b1;
    const void *addr;
    float f;
};

struct Block {
    std::vector<unsigned char> shared;  /* the launch's dynamic shared memory */
    std::barrier<> all{MODEL_THREADS};
    std::vector<std::unique_ptr<std::barrier<>>> warp;
    Lane lanes[MODEL_THREADS / 32][32];
    Block()
    {
        for (int w = 0; w < MODEL_THREADS / 32; w++)
            warp.push_back(std::make_unique<std::barrier<>>(32));
    }
};
inline thread_local Block *this_block;

inline void __syncthreads() { this_block->all.arrive_and_wait(); }

/* Publish this lane's operands, run take(lanes) once all 32 have, and wait
 * until all have taken their share before the slots are reused. */
template <class Publish, class Take>
inline void warp_exchange(Publish publish, Take take)
{
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    publish(this_block->lanes[w][lane]);
    this_block->warp[w]->arrive_and_wait();
    take(this_block->lanes[w], lane);
    this_block->warp[w]->arrive_and_wait();
}

inline float __shfl_xor_sync(unsigned, float v, int mask)
{
    float r = 0.0f;
    warp_exchange([&](Lane &l) { l.f = v; }, [&](const Lane *ls, int lane) { r = ls[lane ^ mask].f; });
    return r;
}

/* A kernel's dynamic shared memory (ops.cuh's AMPC_DYNAMIC_SHARED), poisoned
 * at each block's start as the GPU's is undefined. */
template <class T>
inline T *model_dynamic_shared()
{
    return reinterpret_cast<T *>(this_block->shared.data());
}
#define AMPC_DYNAMIC_SHARED(T, name) T *name = model_dynamic_shared<T>()

/* Run kernel(args...) over a grid of (gx, gy) blocks of MODEL_THREADS
 * threads, each block with `shared` bytes of dynamic shared memory. */
template <class Kernel, class... Args>
void launch_shared(unsigned gx, unsigned gy, size_t shared, Kernel kernel, Args... args)
{
    for (unsigned by = 0; by < gy; by++)
        for (unsigned bx = 0; bx < gx; bx++) {
            Block block;
            block.shared.assign(shared, 0xA5);
            std::vector<std::thread> threads;
            for (unsigned t = 0; t < MODEL_THREADS; t++)
                threads.emplace_back([&, t] {
                    threadIdx = {t, 0, 0};
                    blockIdx = {bx, by, 0};
                    gridDim = {gx, gy, 1};
                    this_block = &block;
                    kernel(args...);
                });
            for (auto &th : threads)
                th.join();
        }
}

/* Run kernel(args...) over a grid of (gx, gy) blocks of MODEL_THREADS threads. */
template <class Kernel, class... Args>
void launch(unsigned gx, unsigned gy, Kernel kernel, Args... args)
{
    launch_shared(gx, gy, 0, kernel, args...);
}

/* ------------------------------------------------------------------------ */
/* mma.cuh's instructions                                                    */
/* ------------------------------------------------------------------------ */

namespace mma_sm80 {

template <class T>
inline float element(uint32_t pair, int hi)
{
    const uint16_t bits = (uint16_t)(hi ? pair >> 16 : pair & 0xffff);
    return std::is_same<T, __half>::value ? half_to_float(bits) : bf16_to_float(bits);
}

/* mma.sync.m16n8k16.row.col, float32 accumulators: c += A B. */
template <class T>
inline void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    warp_exchange(
        [&](Lane &l) {
            std::memcpy(l.a, a, sizeof l.a);
            l.b0 = b0;
            l.b1 = b1;
        },
        [&](const Lane *ls, int lane) {
            float A[16][16], B[16][8];
            for (int t = 0; t < 32; t++) {
                const int g = t / 4, q = t % 4;
                for (int h = 0; h < 2; h++) {
                    A[g][2 * q + h] = element<T>(ls[t].a[0], h);
                    A[g + 8][2 * q + h] = element<T>(ls[t].a[1], h);
                    A[g][2 * q + 8 + h] = element<T>(ls[t].a[2], h);
                    A[g + 8][2 * q + 8 + h] = element<T>(ls[t].a[3], h);
                    B[2 * q + h][g] = element<T>(ls[t].b0, h);
                    B[2 * q + 8 + h][g] = element<T>(ls[t].b1, h);
                }
            }
            const int g = lane / 4, q = lane % 4;
            for (int e = 0; e < 4; e++) {
                const int row = g + 8 * (e / 2), col = 2 * q + e % 2;
                float sum = 0.0f;
                for (int k = 0; k < 16; k++)
                    sum += A[row][k] * B[k][col];
                c[e] += sum;
            }
        });
}

/* ldmatrix.sync.m8n8.x4[.trans].b16 */
template <bool TRANS>
inline void ldmatrix4(uint32_t (&r)[4], const void *smem)
{
    warp_exchange([&](Lane &l) { l.addr = smem; },
                  [&](const Lane *ls, int lane) {
                      for (int m = 0; m < 4; m++) {
                          uint16_t lo, hi;
                          if (TRANS) {  /* element (row, col) of the matrix transposed: (col, row) stored */
                              lo = static_cast<const uint16_t *>(ls[m * 8 + 2 * (lane % 4)].addr)[lane / 4];
                              hi = static_cast<const uint16_t *>(ls[m * 8 + 2 * (lane % 4) + 1].addr)[lane / 4];
                          }
                          else {
                              const uint16_t *row = static_cast<const uint16_t *>(ls[m * 8 + lane / 4].addr);
                              lo = row[2 * (lane % 4)];
                              hi = row[2 * (lane % 4) + 1];
                          }
                          r[m] = (uint32_t)lo | (uint32_t)hi << 16;
                      }
                  });
}

struct PendingCopy {
    void *dst;
    const void *src;
    bool valid;
};
inline thread_local std::vector<PendingCopy> uncommitted;
inline thread_local std::deque<std::vector<PendingCopy>> committed;

inline void copy16_async(void *smem, const void *src, bool valid) { uncommitted.push_back({smem, src, valid}); }

inline void async_commit()
{
    committed.push_back(std::move(uncommitted));
    uncommitted.clear();
}

template <int N>
inline void async_wait()
{
    while (committed.size() > (size_t)N) {
        for (const PendingCopy &c : committed.front()) {
            if (c.valid)
                std::memcpy(c.dst, c.src, 16);
            else
                std::memset(c.dst, 0, 16);
        }
        committed.pop_front();
    }
}

template <class T>
inline uint32_t pack2(float lo, float hi)
{
    const auto round = std::is_same<T, __half>::value ? float_to_half : float_to_bf16;
    return (uint32_t)round(lo) | (uint32_t)round(hi) << 16;
}

}  // namespace mma_sm80

#endif /* AMPC_CUDA_MODEL_H */
