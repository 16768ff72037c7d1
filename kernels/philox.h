/*
 * philox.h: the Philox4x32-10 counter-based generator (Salmon et al.,
 * "Parallel random numbers: as easy as 1, 2, 3", SC 2011), shared by the
 * CPU and CUDA dropout kernels so that one (seed, offset) draws the same
 * numbers on both. Plain C that nvcc also compiles.
 *
 * Element i of a draw at `offset` takes word i % 4 of the block whose
 * counter is offset + i / 4: a draw of n elements uses ceil(n / 4)
 * counters, and the next draw starts after them.
 */
#ifndef AMPC_KERNELS_PHILOX_H
#define AMPC_KERNELS_PHILOX_H

#include <stdint.h>

#ifdef __CUDACC__
#define AMPC_PHILOX_FN static inline __host__ __device__
#else
#define AMPC_PHILOX_FN static inline
#endif

typedef struct {
    uint32_t v[4];
} ampc_philox_block;

AMPC_PHILOX_FN ampc_philox_block ampc_philox(uint64_t seed, uint64_t counter)
{
    const uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u, W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
    uint32_t c0 = (uint32_t)counter, c1 = (uint32_t)(counter >> 32), c2 = 0, c3 = 0;
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int round = 0; round < 10; round++) {
        const uint64_t p0 = (uint64_t)M0 * c0, p1 = (uint64_t)M1 * c2;
        const uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        const uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
        k0 += W0;
        k1 += W1;
    }
    ampc_philox_block b = {{c0, c1, c2, c3}};
    return b;
}

/* Dropout's keep test for a 32-bit word: its top 24 bits below keep_below,
 * an integer comparison, so the CPU and the GPU agree on every element.
 * keep_below = round((1 - p) * 2^24). */
AMPC_PHILOX_FN int ampc_philox_keep(uint32_t word, uint32_t keep_below) { return (word >> 8) < keep_below; }

#endif /* AMPC_KERNELS_PHILOX_H */
