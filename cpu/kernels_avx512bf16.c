/*
 * kernels_avx512bf16.c: the AVX-512 casts with float32 -> bfloat16 done by the
 * AVX512-BF16 instruction (VCVTNEPS2BF16): nearest even and quiet NaNs as in
 * fp_formats.h, but it treats float32 subnormal inputs as zero whatever the
 * MXCSR says. Lanes holding a subnormal are therefore redone in integer
 * arithmetic; real data almost never has one, so that branch is rarely taken.
 * (Unscale uses kernels_avx512.c's table: the rounding is the same.)
 */
#include "cpu/cast_cpu.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,f16c,fma")
#include "cpu/simd_avx512.h"

static inline __m256i round_bf16(simd_f32 v)
{
    const __m256i r = (__m256i)_mm512_cvtneps_pbh(v);
    const __m512i mag = _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7fffffff));
    const __mmask16 subnormal = _mm512_cmplt_epu32_mask(mag, _mm512_set1_epi32(0x00800000)) &
                                _mm512_test_epi32_mask(mag, mag);
    if (subnormal)
        return _mm256_mask_mov_epi16(r, subnormal, bf16_round_integer(v));
    return r;
}

#define SIMD_NAME(x) avx512bf16_##x
#define SIMD_TABLE ampc_cast_avx512bf16
#define SIMD_LABEL "avx512bf16"
#include "cpu/simd_loops.h"

#else
const ampc_cast_table ampc_cast_avx512bf16 = {"avx512bf16", {{NULL}}, {{NULL}}};
#endif
