/*
 * kernels_avx512.c: the CPU kernels for AVX-512 (F, BW, VL), 16 float32
 * lanes: casts (bfloat16 rounded in integer arithmetic) and unscale. See
 * simd_avx512.h.
 */
#include "cpu/cast_cpu.h"
#include "cpu/cpu_kernels.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,f16c,fma")
#include "cpu/simd_avx512.h"

static inline __m256i round_bf16(simd_f32 v) { return bf16_round_integer(v); }

#define SIMD_NAME(x) avx512_##x
#define SIMD_TABLE ampc_cast_avx512
#define SIMD_LABEL "avx512"
#define SIMD_UNSCALE_TABLE ampc_unscale_avx512
#include "cpu/simd_loops.h"
#include "cpu/simd_unscale.h"

#else
const ampc_cast_table ampc_cast_avx512 = {"avx512", {{NULL}}, {{NULL}}};
const ampc_unscale_table ampc_unscale_avx512 = {{NULL}, {NULL}};
#endif
