/*
 * cast_portable.c: the portable conversion kernels, for every pair of the four
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

#define FROM_INTEGER_ROW(NAME) {NAME##_to_f32_strided, NAME##_to_f16_strided, NAME##_to_bf16_strided, NAME##_to_f64_strided}
/* Rows: source, from AMPC_BOOL on; columns: destination, f32 f16 bf16 f64. */
static const ampc_cast_strided_fn from_integer[AMPC_NUM_DTYPES - AMPC_BOOL][AMPC_NUM_FLOAT_DTYPES] = {
    FROM_INTEGER_ROW(bool), FROM_INTEGER_ROW(i8), FROM_INTEGER_ROW(i16), FROM_INTEGER_ROW(i32),
    FROM_INTEGER_ROW(i64), FROM_INTEGER_ROW(u8), FROM_INTEGER_ROW(u16), FROM_INTEGER_ROW(u32),
    FROM_INTEGER_ROW(u64),
};
#undef FROM_INTEGER_ROW

ampc_cast_strided_fn ampc_cast_strided_any(ampc_dtype dst, ampc_dtype src)
{
    if (AMPC_DTYPE_IS_FLOAT(src) && AMPC_DTYPE_IS_FLOAT(dst))
        return ampc_cast_strided[dst][src];
    if (AMPC_DTYPE_IS_FLOAT(dst))
        return from_integer[src - AMPC_BOOL][dst];
    if (dst != src)
        return NULL;
    switch (ampc_dtype_size(src)) {
    case 1: return copy_strided_1;
    case 2: return copy_strided_2;
    case 4: return copy_strided_4;
    default: return copy_strided_8;
    }
}
