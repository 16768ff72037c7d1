/*
 * fp_formats.h: exact conversions between IEEE binary formats, on bit patterns.
 *
 * This is ampc's reference for every cast: the portable CPU path runs it, the
 * SIMD and CUDA paths are tested against it bit for bit, and the CUDA kernels
 * run it for the rare float64 <-> 16-bit pairs. It is plain C that nvcc also
 * compiles for the device, and it does not depend on the floating-point
 * environment (rounding mode, flush-to-zero), because it never does
 * floating-point arithmetic.
 *
 * Rules (IEEE 754 convertFormat):
 *   - narrowing rounds to nearest, ties to even; values beyond the largest
 *     finite number after rounding become +-inf; subnormals are exact;
 *   - widening is exact (source subnormals become normal where they fit);
 *   - NaN stays NaN: ampc's result is a quiet NaN with the sign and the leading
 *     payload bits of the input. This is what x86 (F16C, AVX-512, SSE) and the
 *     AVX512-BF16 instruction give, so the SIMD paths need no special case and
 *     the CPU and GPU results agree in every bit. Other libraries differ only
 *     in NaN bits (NumPy keeps signalling NaNs signalling, ml_dtypes returns
 *     its canonical NaN).
 *
 * A format is described by its exponent and mantissa widths:
 *   float64 (11, 52), float32 (8, 23), float16 (5, 10), bfloat16 (8, 7).
 * The generic functions take them as arguments; every caller passes
 * constants, so after inlining each becomes a short branch-light sequence.
 */
#ifndef AMPC_KERNELS_FP_FORMATS_H
#define AMPC_KERNELS_FP_FORMATS_H

#include <stdint.h>

#ifdef __CUDACC__
#define AMPC_FP_FN static inline __host__ __device__
#else
#define AMPC_FP_FN static inline
#endif

/* v >> shift, rounded to nearest with ties to even; 1 <= shift <= 63, v < 2^63. */
AMPC_FP_FN uint64_t ampc_fp_round_shift(uint64_t v, int shift)
{
    const uint64_t half_minus_one = (1ull << (shift - 1)) - 1;
    const uint64_t lsb = (v >> shift) & 1u;
    return (v + half_minus_one + lsb) >> shift;
}

/* Index of the most significant set bit; v != 0. */
AMPC_FP_FN int ampc_fp_msb(uint64_t v)
{
#ifdef __CUDA_ARCH__
    return 63 - __clzll((long long)v);
#else
    return 63 - __builtin_clzll(v);
#endif
}

/* The fields of a (se, sm) pattern on its way to a (de, dm) format. */
typedef struct {
    uint64_t sign;      /* the sign bit, already at the destination's position */
    uint64_t mag;       /* the pattern without its sign */
    uint64_t mant;      /* the source mantissa field */
    uint64_t src_inf;   /* magnitude of the source's infinity */
    uint64_t dst_inf;   /* ... and of the destination's */
    int exp;            /* the source's biased exponent field */
    int rebias;         /* destination bias minus source bias */
} ampc_fp_fields;

AMPC_FP_FN ampc_fp_fields ampc_fp_split(uint64_t bits, int se, int sm, int de, int dm)
{
    ampc_fp_fields f;
    const uint64_t src_sign = 1ull << (se + sm);
    f.sign = (bits & src_sign) ? (1ull << (de + dm)) : 0;
    f.mag = bits & (src_sign - 1);
    f.mant = f.mag & ((1ull << sm) - 1);
    f.src_inf = ((1ull << se) - 1) << sm;
    f.dst_inf = ((1ull << de) - 1) << dm;
    f.exp = (int)(f.mag >> sm);
    f.rebias = ((1 << (de - 1)) - 1) - ((1 << (se - 1)) - 1);
    return f;
}

/*
 * Round a (se, sm) pattern to a (de, dm) format with de <= se and dm < sm.
 * The destination may be subnormal, or overflow to infinity.
 */
AMPC_FP_FN uint64_t ampc_fp_narrow(uint64_t bits, int se, int sm, int de, int dm)
{
    const ampc_fp_fields f = ampc_fp_split(bits, se, sm, de, dm);
    const int drop = sm - dm;  /* mantissa bits that do not fit */

    if (f.mag >= f.src_inf) {
        if (f.mag == f.src_inf)
            return f.sign | f.dst_inf;
        return f.sign | f.dst_inf | (1ull << (dm - 1)) | (f.mant >> drop);  /* quiet NaN */
    }
    /* Biased destination exponent of a normal source value. */
    const int dst_exp = f.exp + f.rebias;
    if (f.exp != 0 && dst_exp >= 1) {
        if (dst_exp >= (1 << de) - 1)
            return f.sign | f.dst_inf;
        /* Rebias, then round the mantissa. A carry out of the mantissa bumps
         * the exponent, which is exactly right, up to and including inf. */
        return f.sign | ampc_fp_round_shift(((uint64_t)dst_exp << sm) | f.mant, drop);
    }
    /* The result is subnormal or zero in the destination (or rounds up to its
     * smallest normal, whose encoding the same arithmetic produces). */
    const uint64_t significand = f.exp ? (f.mant | (1ull << sm)) : f.mant;
    const int shift = drop + 1 - ((f.exp ? f.exp : 1) + f.rebias);
    if (shift > sm + 1)  /* below half the smallest subnormal: rounds to zero */
        return f.sign;
    return f.sign | ampc_fp_round_shift(significand, shift);
}

/* Exact conversion of a (se, sm) pattern to a wider (de, dm) format: de >= se, dm > sm. */
AMPC_FP_FN uint64_t ampc_fp_widen(uint64_t bits, int se, int sm, int de, int dm)
{
    const ampc_fp_fields f = ampc_fp_split(bits, se, sm, de, dm);

    if (f.mag >= f.src_inf) {
        if (f.mag == f.src_inf)
            return f.sign | f.dst_inf;
        return f.sign | f.dst_inf | (1ull << (dm - 1)) | (f.mant << (dm - sm));  /* quiet NaN */
    }
    if (f.exp == 0) {
        if (f.mant == 0)
            return f.sign;
        if (de == se)  /* same exponent range: a subnormal stays subnormal */
            return f.sign | (f.mant << (dm - sm));
        /* Normalise: the value is 2^p * 1.f * 2^(1 - src_bias - sm). */
        const int p = ampc_fp_msb(f.mant);
        const uint64_t e = (uint64_t)(p + 1 - sm + f.rebias);
        return f.sign | (e << dm) | ((f.mant ^ (1ull << p)) << (dm - p));
    }
    return f.sign | ((uint64_t)(f.exp + f.rebias) << dm) | (f.mant << (dm - sm));
}

/* The named pairs. 16-bit <-> 16-bit goes through float32, which holds both
 * exactly, so it is still a single rounding. */
AMPC_FP_FN uint16_t ampc_f32_to_f16_bits(uint32_t b)  { return (uint16_t)ampc_fp_narrow(b, 8, 23, 5, 10); }
AMPC_FP_FN uint16_t ampc_f32_to_bf16_bits(uint32_t b) { return (uint16_t)ampc_fp_narrow(b, 8, 23, 8, 7); }
AMPC_FP_FN uint32_t ampc_f64_to_f32_bits(uint64_t b)  { return (uint32_t)ampc_fp_narrow(b, 11, 52, 8, 23); }
AMPC_FP_FN uint16_t ampc_f64_to_f16_bits(uint64_t b)  { return (uint16_t)ampc_fp_narrow(b, 11, 52, 5, 10); }
AMPC_FP_FN uint16_t ampc_f64_to_bf16_bits(uint64_t b) { return (uint16_t)ampc_fp_narrow(b, 11, 52, 8, 7); }
AMPC_FP_FN uint32_t ampc_f16_to_f32_bits(uint16_t h)  { return (uint32_t)ampc_fp_widen(h, 5, 10, 8, 23); }
AMPC_FP_FN uint32_t ampc_bf16_to_f32_bits(uint16_t h) { return (uint32_t)ampc_fp_widen(h, 8, 7, 8, 23); }
AMPC_FP_FN uint64_t ampc_f32_to_f64_bits(uint32_t b)  { return ampc_fp_widen(b, 8, 23, 11, 52); }
AMPC_FP_FN uint64_t ampc_f16_to_f64_bits(uint16_t h)  { return ampc_fp_widen(h, 5, 10, 11, 52); }
AMPC_FP_FN uint64_t ampc_bf16_to_f64_bits(uint16_t h) { return ampc_fp_widen(h, 8, 7, 11, 52); }
AMPC_FP_FN uint16_t ampc_f16_to_bf16_bits(uint16_t h) { return ampc_f32_to_bf16_bits(ampc_f16_to_f32_bits(h)); }
AMPC_FP_FN uint16_t ampc_bf16_to_f16_bits(uint16_t h) { return ampc_f32_to_f16_bits(ampc_bf16_to_f32_bits(h)); }

/* ampc's NaN results for the hot pairs, as the few bit operations they are
 * (equal to ampc_fp_narrow / ampc_fp_widen on NaN inputs): fast paths that
 * convert with the hardware select these for their NaN lanes. */
AMPC_FP_FN uint16_t ampc_f32_nan_to_f16(uint32_t b)
{
    return (uint16_t)(((b >> 16) & 0x8000u) | 0x7e00u | ((b >> 13) & 0x3ffu));
}
AMPC_FP_FN uint16_t ampc_f32_nan_to_bf16(uint32_t b) { return (uint16_t)((b >> 16) | 0x40u); }
AMPC_FP_FN uint32_t ampc_f16_nan_to_f32(uint16_t h)
{
    return ((uint32_t)(h & 0x8000u) << 16) | 0x7fc00000u | ((uint32_t)(h & 0x3ffu) << 13);
}

/* NaN tests on bit patterns, for the fast paths that fix up NaN lanes. */
AMPC_FP_FN int ampc_f32_bits_isnan(uint32_t b)  { return (b & 0x7fffffffu) > 0x7f800000u; }
AMPC_FP_FN int ampc_f16_bits_isnan(uint16_t h)  { return (h & 0x7fffu) > 0x7c00u; }
AMPC_FP_FN int ampc_bf16_bits_isnan(uint16_t h) { return (h & 0x7fffu) > 0x7f80u; }

#endif /* AMPC_KERNELS_FP_FORMATS_H */
