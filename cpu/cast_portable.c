/*
 * cast_portable.c: the portable conversion kernels, for every pair of the
 * floating dtypes, contiguous and strided; and from integer and bool arrays to
 * each floating dtype, strided only.
 *
 * They run fp_formats.h on bit patterns, so they need no floating-point
 * hardware support and ignore the floating-point environment. Loads and
 * stores go through memcpy: NumPy arrays need not be aligned, and the
 * compiler turns a fixed-size memcpy into a plain move.
 */
#include "cpu/cast_cpu.h"

#include <string.h>
#include "kernels/fp_formats.h"

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
DEFINE_STRIDED_COPY(1)
DEFINE_STRIDED_COPY(2)
DEFINE_STRIDED_COPY(4)
DEFINE_STRIDED_COPY(8)

/* A conversion between two bit-pattern types, strided; and contiguous. */
#define DEFINE_STRIDED_CONVERSION(NAME, SRC_T, DST_T, CONVERT)                               \
    static void NAME##_strided(const char *s, int64_t ss, char *d, int64_t ds, int64_t n)    \
    {                                                                                        \
        for (int64_t i = 0; i < n; i++, s += ss, d += ds) {                                  \
            SRC_T in;                                                                        \
            memcpy(&in, s, sizeof in);                                                       \
            const DST_T out = CONVERT(in);                                                   \
            memcpy(d, &out, sizeof out);                                                     \
        }                                                                                    \
    }
#define DEFINE_CONVERSION(NAME, SRC_T, DST_T, CONVERT)                                       \
    DEFINE_STRIDED_CONVERSION(NAME, SRC_T, DST_T, CONVERT)                                   \
    static void NAME##_contig(const void *src, void *dst, int64_t n)                         \
    {                                                                                        \
        NAME##_strided(src, (int64_t)sizeof(SRC_T), dst, (int64_t)sizeof(DST_T), n);          \
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

/* Integer and bool sources, as torch's .to(): the value converted to float32
 * (to nearest; float64 directly) and a 16-bit result rounded from there, as
 * c10::Half and c10::BFloat16 are constructed from an integer. */
static uint32_t f32_bits(float f)
{
    uint32_t b;
    memcpy(&b, &f, sizeof b);
    return b;
}
static uint32_t to_f32(float v) { return f32_bits(v); }
static uint16_t to_f16(float v) { return ampc_f32_to_f16_bits(f32_bits(v)); }
static uint16_t to_bf16(float v) { return ampc_f32_to_bf16_bits(f32_bits(v)); }
static uint64_t to_f64(double v)
{
    uint64_t b;
    memcpy(&b, &v, sizeof b);
    return b;
}

#define DEFINE_FROM_INTEGER(NAME, SRC_T)                                    \
    DEFINE_STRIDED_CONVERSION(NAME##_to_f32, SRC_T, uint32_t, to_f32)       \
    DEFINE_STRIDED_CONVERSION(NAME##_to_f16, SRC_T, uint16_t, to_f16)       \
    DEFINE_STRIDED_CONVERSION(NAME##_to_bf16, SRC_T, uint16_t, to_bf16)     \
    DEFINE_STRIDED_CONVERSION(NAME##_to_f64, SRC_T, uint64_t, to_f64)
DEFINE_FROM_INTEGER(i8, int8_t)
DEFINE_FROM_INTEGER(i16, int16_t)
DEFINE_FROM_INTEGER(i32, int32_t)
DEFINE_FROM_INTEGER(i64, int64_t)
DEFINE_FROM_INTEGER(u8, uint8_t)
DEFINE_FROM_INTEGER(u16, uint16_t)
DEFINE_FROM_INTEGER(u32, uint32_t)
DEFINE_FROM_INTEGER(u64, uint64_t)
#undef DEFINE_FROM_INTEGER

/* A bool is a byte, true whatever nonzero value it holds. */
static uint32_t bool_to_f32_value(uint8_t b) { return to_f32(b != 0); }
static uint16_t bool_to_f16_value(uint8_t b) { return to_f16(b != 0); }
static uint16_t bool_to_bf16_value(uint8_t b) { return to_bf16(b != 0); }
static uint64_t bool_to_f64_value(uint8_t b) { return to_f64(b != 0); }
DEFINE_STRIDED_CONVERSION(bool_to_f32, uint8_t, uint32_t, bool_to_f32_value)
DEFINE_STRIDED_CONVERSION(bool_to_f16, uint8_t, uint16_t, bool_to_f16_value)
DEFINE_STRIDED_CONVERSION(bool_to_bf16, uint8_t, uint16_t, bool_to_bf16_value)
DEFINE_STRIDED_CONVERSION(bool_to_f64, uint8_t, uint64_t, bool_to_f64_value)

/* [dst][src] by dtype number; a pair not named: no such kernel. F32_ROW(_contig)
 * or (_strided): destination float32's floating sources, and so on;
 * INTEGER_SOURCES(f32): its integer and bool sources (strided only). */
#define F32_ROW(K) \
    [AMPC_FLOAT32] = copy##K##_4, [AMPC_FLOAT16] = f16_to_f32##K, \
    [AMPC_BFLOAT16] = bf16_to_f32##K, [AMPC_FLOAT64] = f64_to_f32##K
#define F16_ROW(K) \
    [AMPC_FLOAT32] = f32_to_f16##K, [AMPC_FLOAT16] = copy##K##_2, \
    [AMPC_BFLOAT16] = bf16_to_f16##K, [AMPC_FLOAT64] = f64_to_f16##K
#define BF16_ROW(K) \
    [AMPC_FLOAT32] = f32_to_bf16##K, [AMPC_FLOAT16] = f16_to_bf16##K, \
    [AMPC_BFLOAT16] = copy##K##_2, [AMPC_FLOAT64] = f64_to_bf16##K
#define F64_ROW(K) \
    [AMPC_FLOAT32] = f32_to_f64##K, [AMPC_FLOAT16] = f16_to_f64##K, \
    [AMPC_BFLOAT16] = bf16_to_f64##K, [AMPC_FLOAT64] = copy##K##_8
#define INTEGER_SOURCES(D)                                                                        \
    [AMPC_BOOL] = bool_to_##D##_strided, [AMPC_INT8] = i8_to_##D##_strided,                       \
    [AMPC_INT16] = i16_to_##D##_strided, [AMPC_INT32] = i32_to_##D##_strided,                     \
    [AMPC_INT64] = i64_to_##D##_strided, [AMPC_UINT8] = u8_to_##D##_strided,                      \
    [AMPC_UINT16] = u16_to_##D##_strided, [AMPC_UINT32] = u32_to_##D##_strided,                   \
    [AMPC_UINT64] = u64_to_##D##_strided

const ampc_cast_table ampc_cast_portable = {
    "portable",
    {
        [AMPC_FLOAT32] = {F32_ROW(_contig)},
        [AMPC_FLOAT16] = {F16_ROW(_contig)},
        [AMPC_BFLOAT16] = {BF16_ROW(_contig)},
        [AMPC_FLOAT64] = {F64_ROW(_contig)},
    },
    {{NULL}},
};

const ampc_cast_strided_fn ampc_cast_strided[AMPC_NUM_DTYPES][AMPC_NUM_DTYPES] = {
    [AMPC_FLOAT32] = {F32_ROW(_strided), INTEGER_SOURCES(f32)},
    [AMPC_FLOAT16] = {F16_ROW(_strided), INTEGER_SOURCES(f16)},
    [AMPC_BFLOAT16] = {BF16_ROW(_strided), INTEGER_SOURCES(bf16)},
    [AMPC_FLOAT64] = {F64_ROW(_strided), INTEGER_SOURCES(f64)},
};

ampc_cast_strided_fn ampc_cast_strided_any(ampc_dtype dst, ampc_dtype src)
{
    if (ampc_cast_strided[dst][src] != NULL)
        return ampc_cast_strided[dst][src];
    if (dst != src)
        return NULL;
    switch (ampc_dtype_size(src)) {
    case 1: return copy_strided_1;
    case 2: return copy_strided_2;
    case 4: return copy_strided_4;
    default: return copy_strided_8;
    }
}
