/*
 * mma.cuh: the warp-level Tensor Core and asynchronous-copy instructions the
 * fused attention kernels are built of (sm_80 on; empty below, where the
 * host refuses to launch them): mma.sync m16n8k16 with float32
 * accumulators, ldmatrix, cp.async, and 16-bit pairs packed for them.
 * Fragment layouts are PTX's (a lane holds rows lane / 4 and lane / 4 + 8,
 * columns 2 * (lane % 4) and the next); tests/emulated_cuda/mma.cuh models
 * each instruction on the CPU to the same contract.
 */
#ifndef AMPC_MMA_CUH
#define AMPC_MMA_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include <type_traits>

namespace mma_sm80 {

/* c += a b, a 16 x 16 (row-major fragments), b 16 x 8 (column-major). */
template <class T>
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
#if __CUDA_ARCH__ >= 800
    if constexpr (std::is_same<T, __half>::value)
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    else
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

/* Four 8 x 8 matrices of 16-bit elements; lane l gives the address of row
 * l % 8 of matrix l / 8. trans: each is transposed on the way. */
template <bool TRANS>
__device__ __forceinline__ void ldmatrix4(uint32_t (&r)[4], const void *smem)
{
#if __CUDA_ARCH__ >= 800
    const uint32_t addr = (uint32_t)__cvta_generic_to_shared(smem);
    if constexpr (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(addr)
                     : "memory");
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(addr)
                     : "memory");
#endif
}

/* 16 bytes global -> shared without passing through registers; zeros where
 * !valid (src is then not read). */
__device__ __forceinline__ void copy16_async(void *smem, const void *src, bool valid)
{
#if __CUDA_ARCH__ >= 800
    const uint32_t addr = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(addr), "l"(src), "r"(valid ? 16 : 0)
                 : "memory");
#endif
}

__device__ __forceinline__ void async_commit()
{
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

/* Wait until at most N committed groups are still in flight. */
template <int N>
__device__ __forceinline__ void async_wait()
{
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

/* Two floats rounded to T, packed as one 32-bit register (lo first). */
template <class T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi)
{
    if constexpr (std::is_same<T, __half>::value) {
        const __half2 v = __floats2half2_rn(lo, hi);
        return *reinterpret_cast<const uint32_t *>(&v);
    }
    else {
        const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
        return *reinterpret_cast<const uint32_t *>(&v);
    }
}

}  // namespace mma_sm80

#endif /* AMPC_MMA_CUH */
