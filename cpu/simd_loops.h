/*
 * simd_loops.h: the contiguous conversion loops, written once for every
 * instruction set. Included by one kernels_<isa>.c file per table, after that
 * file has defined, for its vector width SIMD_WIDTH of float32 lanes:
 *
 *   simd_f32 load_<t>(const char *p)       SIMD_WIDTH elements of type t, as float32
 *   void     store_<t>(char *p, simd_f32)  SIMD_WIDTH float32 lanes, rounded to t
 *   void     stream_<t>(char *p, simd_f32) the same with non-temporal stores; p is
 *                                          aligned to SIMD_WIDTH * sizeof(t)
 *
 * for t in f32, f16, bf16, f64, and SIMD_NAME(x) / SIMD_TABLE / SIMD_LABEL.
 *
 * Every pair goes through float32 lanes, which is exact for the 16-bit
 * formats and for widening to float64. float64 -> float16/bfloat16 is not
 * here: rounding to float32 first would round twice, so those pairs stay on
 * the portable kernels, which round once. The portable kernels also do the
 * heads and tails shorter than one vector.
 */
#include <stdint.h>

#define SIMD_LOOPS(SRC, DST, SRC_SIZE, DST_SIZE, SRC_ID, DST_ID)                               \
    static void SIMD_NAME(SRC##_to_##DST)(const void *src, void *dst, int64_t n)               \
    {                                                                                          \
        const char *s = src;                                                                   \
        char *d = dst;                                                                         \
        int64_t i = 0;                                                                         \
        for (; i + SIMD_WIDTH <= n; i += SIMD_WIDTH)                                           \
            store_##DST(d + i * DST_SIZE, load_##SRC(s + i * SRC_SIZE));                       \
        if (i < n)                                                                             \
            ampc_cast_portable.contig[DST_ID][SRC_ID](s + i * SRC_SIZE, d + i * DST_SIZE,      \
                                                      n - i);                                  \
    }                                                                                          \
    static void SIMD_NAME(SRC##_to_##DST##_streaming)(const void *src, void *dst, int64_t n)   \
    {                                                                                          \
        const char *s = src;                                                                   \
        char *d = dst;                                                                         \
        const uintptr_t align = SIMD_WIDTH * DST_SIZE;                                         \
        if ((uintptr_t)d % DST_SIZE != 0) { /* never reaches alignment: plain stores */        \
            SIMD_NAME(SRC##_to_##DST)(src, dst, n);                                            \
            return;                                                                            \
        }                                                                                      \
        int64_t head = (int64_t)(((align - (uintptr_t)d % align) % align) / DST_SIZE);         \
        if (head > n)                                                                          \
            head = n;                                                                          \
        SIMD_NAME(SRC##_to_##DST)(s, d, head);                                                 \
        int64_t i = head;                                                                      \
        for (; i + SIMD_WIDTH <= n; i += SIMD_WIDTH)                                           \
            stream_##DST(d + i * DST_SIZE, load_##SRC(s + i * SRC_SIZE));                      \
        _mm_sfence(); /* streaming stores are weakly ordered: publish them */                  \
        SIMD_NAME(SRC##_to_##DST)(s + i * SRC_SIZE, d + i * DST_SIZE, n - i);                  \
    }

SIMD_LOOPS(f32, f16, 4, 2, AMPC_FLOAT32, AMPC_FLOAT16)
SIMD_LOOPS(f32, bf16, 4, 2, AMPC_FLOAT32, AMPC_BFLOAT16)
SIMD_LOOPS(f32, f64, 4, 8, AMPC_FLOAT32, AMPC_FLOAT64)
SIMD_LOOPS(f16, f32, 2, 4, AMPC_FLOAT16, AMPC_FLOAT32)
SIMD_LOOPS(f16, bf16, 2, 2, AMPC_FLOAT16, AMPC_BFLOAT16)
SIMD_LOOPS(f16, f64, 2, 8, AMPC_FLOAT16, AMPC_FLOAT64)
SIMD_LOOPS(bf16, f32, 2, 4, AMPC_BFLOAT16, AMPC_FLOAT32)
SIMD_LOOPS(bf16, f16, 2, 2, AMPC_BFLOAT16, AMPC_FLOAT16)
SIMD_LOOPS(bf16, f64, 2, 8, AMPC_BFLOAT16, AMPC_FLOAT64)
SIMD_LOOPS(f64, f32, 8, 4, AMPC_FLOAT64, AMPC_FLOAT32)

#undef SIMD_LOOPS

/* [dst][src] by dtype number; a pair not named here: the portable kernel. */
#define SIMD_ROWS(SUFFIX)                                                                               \
    {                                                                                                   \
        [AMPC_FLOAT32] = {[AMPC_FLOAT16] = SIMD_NAME(f16_to_f32##SUFFIX),                               \
                          [AMPC_BFLOAT16] = SIMD_NAME(bf16_to_f32##SUFFIX),                             \
                          [AMPC_FLOAT64] = SIMD_NAME(f64_to_f32##SUFFIX)},                              \
        [AMPC_FLOAT16] = {[AMPC_FLOAT32] = SIMD_NAME(f32_to_f16##SUFFIX),                               \
                          [AMPC_BFLOAT16] = SIMD_NAME(bf16_to_f16##SUFFIX)},                            \
        [AMPC_BFLOAT16] = {[AMPC_FLOAT32] = SIMD_NAME(f32_to_bf16##SUFFIX),                             \
                           [AMPC_FLOAT16] = SIMD_NAME(f16_to_bf16##SUFFIX)},                            \
        [AMPC_FLOAT64] = {[AMPC_FLOAT32] = SIMD_NAME(f32_to_f64##SUFFIX),                               \
                          [AMPC_FLOAT16] = SIMD_NAME(f16_to_f64##SUFFIX),                               \
                          [AMPC_BFLOAT16] = SIMD_NAME(bf16_to_f64##SUFFIX)},                            \
    }
const ampc_cast_table SIMD_TABLE = {SIMD_LABEL, SIMD_ROWS(), SIMD_ROWS(_streaming)};
#undef SIMD_ROWS
