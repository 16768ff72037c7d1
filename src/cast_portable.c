/*
 * cast_portable.c: the portable conversion kernels, for every pair of the four
 * floating dtypes, contiguous and strided.
 *
 * They run fp_formats.h on bit patterns, so they need no floating-point
 * hardware support and ignore the floating-point environment. Loads and
 * stores go through memcpy: NumPy arrays need not be aligned, and the
 * compiler turns a fixed-size memcpy into a plain move.
 */
#include "cast_cpu.h"

#include <string.h>
#include "fp_formats.h"

/* Same dtype: a copy. */
static void copy_contig_2(const void *s, void *d, int64_t n) { memcpy(d, s, (size_t)n * 2); }
static void copy_contig_4(const void *s, void *d, int64_t n) { memcpy(d, s, (size_t)n * 4); }
static void copy_contig_8(const void *s, void *d, int64_t n) { memcpy(d, s, (size_t)n * 8); }

#define DEFINE_STRIDED_COPY(SIZE)                                                   \
    static void copy_strided_##SIZE(const char *s, int64_t ss, char *d, int64_t ds, \
                                    int64_t n)                                      \
    {                                                                               \
        for (int64_t i = 0; i < n; i++, s += ss, d += ds)                           \
            memcpy(d, s, SIZE);                                                     \
    }
DEFINE_STRIDED_COPY(2)
DEFINE_STRIDED_COPY(4)
DEFINE_STRIDED_COPY(8)

/* A conversion between two bit-pattern types, contiguous and strided. */
#define DEFINE_CONVERSION(NAME, SRC_T, DST_T, CONVERT)                                       \
    static void NAME##_contig(const void *src, void *dst, int64_t n)                         \
    {                                                                                        \
        const char *s = src;                                                                 \
        char *d = dst;                                                                       \
        for (int64_t i = 0; i < n; i++) {                                                    \
            SRC_T in;                                                                        \
            memcpy(&in, s + i * (int64_t)sizeof(SRC_T), sizeof in);                          \
            const DST_T out = CONVERT(in);                                                   \
            memcpy(d + i * (int64_t)sizeof(DST_T), &out, sizeof out);                        \
        }                                                                                    \
    }                                                                                        \
    static void NAME##_strided(const char *s, int64_t ss, char *d, int64_t ds, int64_t n)    \
    {                                                                                        \
        for (int64_t i = 0; i < n; i++, s += ss, d += ds) {                                  \
            SRC_T in;                                                                        \
            memcpy(&in, s, sizeof in);                                                       \
            const DST_T out = CONVERT(in);                                                   \
            memcpy(d, &out, sizeof out);                                                     \
        }                                                                                    \
    }

DEFINE_CONVERSION(f32_to_f16, uint32_t, uint16_t, ampc_f32_to_f16_bits)
DEFINE_CONVERSION(f32_to_bf16, uint32_t, uint16_t, ampc_f32_to_bf16_bits)
DEFINE_CONVERSION(f32_to_f64, uint32_t, uint64_t, ampc_f32_to_f64_bits)
DEFINE_CONVERSION(f16_to_f32, uint16_t, uint32_t, ampc_f16_to_f32_bits)
DEFINE_CONVERSION(f16_to_bf16, uint16_t, uint16_t, ampc_f16_to_bf16_bits)
DEFINE_CONVERSION(f16_to_f64, uint16_t, uint64_t, ampc_f16_to_f64_bits)
DEFINE_CONVERSION(bf16_to_f32, uint16_t, uint32_t, ampc_bf16_to_f32_bits)
DEFINE_CONVERSION(bf16_to_f16, uint16_t, uint16_t, ampc_bf16_to_f16_bits)
DEFINE_CONVERSION(bf16_to_f64, uint16_t, uint64_t, ampc_bf16_to_f64_bits)
DEFINE_CONVERSION(f64_to_f32, uint64_t, uint32_t, ampc_f64_to_f32_bits)
DEFINE_CONVERSION(f64_to_f16, uint64_t, uint16_t, ampc_f64_to_f16_bits)
DEFINE_CONVERSION(f64_to_bf16, uint64_t, uint16_t, ampc_f64_to_bf16_bits)

/* Rows: destination; columns: source; order of ampc_dtype (f32, f16, bf16, f64). */
const ampc_cast_table ampc_cast_portable = {
    "portable",
    {
        {copy_contig_4, f16_to_f32_contig, bf16_to_f32_contig, f64_to_f32_contig},
        {f32_to_f16_contig, copy_contig_2, bf16_to_f16_contig, f64_to_f16_contig},
        {f32_to_bf16_contig, f16_to_bf16_contig, copy_contig_2, f64_to_bf16_contig},
        {f32_to_f64_contig, f16_to_f64_contig, bf16_to_f64_contig, copy_contig_8},
    },
    {{NULL}},
};

const ampc_cast_strided_fn ampc_cast_strided[AMPC_NUM_FLOAT_DTYPES][AMPC_NUM_FLOAT_DTYPES] = {
    {copy_strided_4, f16_to_f32_strided, bf16_to_f32_strided, f64_to_f32_strided},
    {f32_to_f16_strided, copy_strided_2, bf16_to_f16_strided, f64_to_f16_strided},
    {f32_to_bf16_strided, f16_to_bf16_strided, copy_strided_2, f64_to_bf16_strided},
    {f32_to_f64_strided, f16_to_f64_strided, bf16_to_f64_strided, copy_strided_8},
};
