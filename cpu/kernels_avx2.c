/*
 * kernels_avx2.c: the CPU kernels for AVX2 + F16C, 8 float32 lanes: casts
 * (simd_loops.h) and unscale (simd_unscale.h).
 *
 * float16 uses the F16C instructions, which round to nearest even, keep
 * subnormals and quiet NaNs exactly as fp_formats.h does. bfloat16 has no
 * instruction before AVX512-BF16, so it is rounded in integer arithmetic:
 * add 0x7fff plus the lowest kept bit, keep the high half (NaN lanes are
 * quieted instead). The float64 conversions use the hardware, which the
 * driver runs under the default MXCSR (nearest even, no flush to zero).
 */
#include "cpu/cast_cpu.h"
#include "cpu/cpu_kernels.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#pragma GCC target("avx2,f16c,fma")
#include <immintrin.h>

#define SIMD_WIDTH 8
typedef __m256 simd_f32;

static inline simd_f32 load_f32(const char *p) { return _mm256_loadu_ps((const float *)p); }

static inline simd_f32 load_f16(const char *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

static inline simd_f32 load_bf16(const char *p)
{
    __m256i w = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16);
    const __m256i mag = _mm256_and_si256(w, _mm256_set1_epi32(0x7fffffff));
    const __m256i nan = _mm256_cmpgt_epi32(mag, _mm256_set1_epi32(0x7f800000));
    w = _mm256_or_si256(w, _mm256_and_si256(nan, _mm256_set1_epi32(0x00400000)));  /* quiet */
    return _mm256_castsi256_ps(w);
}

static inline simd_f32 load_f64(const char *p)
{
    const __m128 lo = _mm256_cvtpd_ps(_mm256_loadu_pd((const double *)p));
    const __m128 hi = _mm256_cvtpd_ps(_mm256_loadu_pd((const double *)p + 4));
    return _mm256_insertf128_ps(_mm256_castps128_ps256(lo), hi, 1);
}

static inline __m128i round_f16(simd_f32 v)
{
    return _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

static inline __m128i round_bf16(simd_f32 v)
{
    const __m256i b = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_add_epi32(b, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
    const __m256i mag = _mm256_and_si256(b, _mm256_set1_epi32(0x7fffffff));
    const __m256i nan = _mm256_cmpgt_epi32(mag, _mm256_set1_epi32(0x7f800000));
    const __m256i quiet = _mm256_or_si256(b, _mm256_set1_epi32(0x00400000));
    const __m256i r = _mm256_srli_epi32(_mm256_blendv_epi8(rounded, quiet, nan), 16);
    /* Pack the eight 32-bit lanes (each <= 0xffff) into 16 bits; packus works
     * within 128-bit halves, so gather quadwords 0 and 2 afterwards. */
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08));
}

static inline void store_f32(char *p, simd_f32 v) { _mm256_storeu_ps((float *)p, v); }
static inline void store_f16(char *p, simd_f32 v) { _mm_storeu_si128((__m128i *)p, round_f16(v)); }
static inline void store_bf16(char *p, simd_f32 v) { _mm_storeu_si128((__m128i *)p, round_bf16(v)); }

static inline void store_f64(char *p, simd_f32 v)
{
    _mm256_storeu_pd((double *)p, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
    _mm256_storeu_pd((double *)p + 4, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
}

static inline void stream_f32(char *p, simd_f32 v) { _mm256_stream_ps((float *)p, v); }
static inline void stream_f16(char *p, simd_f32 v) { _mm_stream_si128((__m128i *)p, round_f16(v)); }
static inline void stream_bf16(char *p, simd_f32 v) { _mm_stream_si128((__m128i *)p, round_bf16(v)); }

static inline void stream_f64(char *p, simd_f32 v)
{
    _mm256_stream_pd((double *)p, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
    _mm256_stream_pd((double *)p + 4, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
}

typedef __m256i simd_acc;
static inline simd_acc simd_acc_zero(void) { return _mm256_setzero_si256(); }
static inline simd_acc simd_nonfinite(simd_acc acc, simd_f32 v)
{
    const __m256i exponent = _mm256_and_si256(_mm256_castps_si256(v), _mm256_set1_epi32(0x7f800000));
    return _mm256_or_si256(acc, _mm256_cmpeq_epi32(exponent, _mm256_set1_epi32(0x7f800000)));
}
static inline int simd_any(simd_acc acc) { return !_mm256_testz_si256(acc, acc); }

typedef struct {
    __m256d lo, hi;
} simd_dacc;
static inline simd_dacc simd_dacc_zero(void) { return (simd_dacc){_mm256_setzero_pd(), _mm256_setzero_pd()}; }
static inline simd_dacc simd_sumsq(simd_dacc a, simd_f32 v)
{
    const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v));
    const __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
    return (simd_dacc){_mm256_fmadd_pd(lo, lo, a.lo), _mm256_fmadd_pd(hi, hi, a.hi)};
}
static inline double simd_dacc_sum(simd_dacc a)
{
    const __m256d s = _mm256_add_pd(a.lo, a.hi);
    const __m128d t = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
    return _mm_cvtsd_f64(_mm_add_sd(t, _mm_unpackhi_pd(t, t)));
}
static inline simd_f32 simd_mul(simd_f32 a, simd_f32 b) { return _mm256_mul_ps(a, b); }
static inline simd_f32 simd_set1(float x) { return _mm256_set1_ps(x); }

#define SIMD_NAME(x) avx2_##x
#define SIMD_TABLE ampc_cast_avx2
#define SIMD_LABEL "avx2"
#define SIMD_UNSCALE_TABLE ampc_unscale_avx2
#include "cpu/simd_loops.h"
#include "cpu/simd_unscale.h"

#else
const ampc_cast_table ampc_cast_avx2 = {"avx2", {{NULL}}, {{NULL}}};
const ampc_unscale_table ampc_unscale_avx2 = {{NULL}, {NULL}};
#endif
