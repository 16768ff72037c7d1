/*
 * simd_avx512.h: loads, stores and streaming stores of 16 float32 lanes for
 * the two AVX-512 files (kernels_avx512.c, kernels_avx512bf16.c). Their casts differ only
 * in how they round float32 to bfloat16: each defines round_bf16. Include
 * after the file's target pragma.
 */
#ifndef AMPC_SIMD_AVX512_H
#define AMPC_SIMD_AVX512_H

#include <immintrin.h>

#define SIMD_WIDTH 16
typedef __m512 simd_f32;

static inline __m256i round_bf16(simd_f32 v);

static inline simd_f32 load_f32(const char *p) { return _mm512_loadu_ps((const float *)p); }

static inline simd_f32 load_f16(const char *p)
{
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}

static inline simd_f32 load_bf16(const char *p)
{
    const __m512i w = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16);
    const __m512i mag = _mm512_and_si512(w, _mm512_set1_epi32(0x7fffffff));
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(mag, _mm512_set1_epi32(0x7f800000));
    return _mm512_castsi512_ps(_mm512_mask_or_epi32(w, nan, w, _mm512_set1_epi32(0x00400000)));
}

static inline simd_f32 load_f64(const char *p)
{
    const __m256 lo = _mm512_cvtpd_ps(_mm512_loadu_pd((const double *)p));
    const __m256 hi = _mm512_cvtpd_ps(_mm512_loadu_pd((const double *)p + 8));
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(lo)),
                                               _mm256_castps_pd(hi), 1));
}

/* float32 -> bfloat16 in integer arithmetic (see kernels_avx2.c), 16 lanes. */
static inline __m256i bf16_round_integer(simd_f32 v)
{
    const __m512i b = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_add_epi32(b, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
    const __m512i mag = _mm512_and_si512(b, _mm512_set1_epi32(0x7fffffff));
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(mag, _mm512_set1_epi32(0x7f800000));
    const __m512i r = _mm512_mask_or_epi32(rounded, nan, b, _mm512_set1_epi32(0x00400000));
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16));
}

static inline __m256i round_f16(simd_f32 v)
{
    return _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

static inline __m512d low_f64(simd_f32 v) { return _mm512_cvtps_pd(_mm512_castps512_ps256(v)); }

static inline __m512d high_f64(simd_f32 v)
{
    return _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}

static inline void store_f32(char *p, simd_f32 v) { _mm512_storeu_ps((float *)p, v); }
static inline void store_f16(char *p, simd_f32 v) { _mm256_storeu_si256((__m256i *)p, round_f16(v)); }
static inline void store_bf16(char *p, simd_f32 v) { _mm256_storeu_si256((__m256i *)p, round_bf16(v)); }

static inline void store_f64(char *p, simd_f32 v)
{
    _mm512_storeu_pd((double *)p, low_f64(v));
    _mm512_storeu_pd((double *)p + 8, high_f64(v));
}

static inline void stream_f32(char *p, simd_f32 v) { _mm512_stream_ps((float *)p, v); }
static inline void stream_f16(char *p, simd_f32 v) { _mm256_stream_si256((__m256i *)p, round_f16(v)); }
static inline void stream_bf16(char *p, simd_f32 v) { _mm256_stream_si256((__m256i *)p, round_bf16(v)); }

static inline void stream_f64(char *p, simd_f32 v)
{
    _mm512_stream_pd((double *)p, low_f64(v));
    _mm512_stream_pd((double *)p + 8, high_f64(v));
}

/* For simd_unscale.h. */
typedef __mmask16 simd_acc;
static inline simd_acc simd_acc_zero(void) { return 0; }
static inline simd_acc simd_nonfinite(simd_acc acc, simd_f32 v)
{
    const __m512i exponent = _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7f800000));
    return acc | _mm512_cmpeq_epi32_mask(exponent, _mm512_set1_epi32(0x7f800000));
}
static inline int simd_any(simd_acc acc) { return acc != 0; }

typedef struct {
    __m512d lo, hi;
} simd_dacc;
static inline simd_dacc simd_dacc_zero(void) { return (simd_dacc){_mm512_setzero_pd(), _mm512_setzero_pd()}; }
static inline simd_dacc simd_sumsq(simd_dacc a, simd_f32 v)
{
    const __m512d lo = low_f64(v), hi = high_f64(v);
    return (simd_dacc){_mm512_fmadd_pd(lo, lo, a.lo), _mm512_fmadd_pd(hi, hi, a.hi)};
}
static inline double simd_dacc_sum(simd_dacc a) { return _mm512_reduce_add_pd(_mm512_add_pd(a.lo, a.hi)); }
static inline simd_f32 simd_mul(simd_f32 a, simd_f32 b) { return _mm512_mul_ps(a, b); }
static inline simd_f32 simd_set1(float x) { return _mm512_set1_ps(x); }

#endif /* AMPC_SIMD_AVX512_H */
