/*
 * simd_unscale.h: the unscale and norm loops, written once for every
 * instruction set. Included by a kernels_<isa>.c file after simd_loops.h (whose
 * loads and stores it uses), with these defined as well:
 *
 *   simd_acc, simd_acc_zero(), simd_nonfinite(simd_acc, simd_f32), simd_any(simd_acc)
 *                            "some lane was inf or NaN", folded in one vector at a time
 *   simd_dacc, simd_dacc_zero(), simd_sumsq(simd_dacc, simd_f32), simd_dacc_sum(simd_dacc)
 *                            float64 sums of the lanes' squares
 *   simd_f32 simd_mul(simd_f32, simd_f32), simd_set1(float)
 *   SIMD_UNSCALE_TABLE
 *
 * float64 gradients stay on the portable loops: float32 lanes would turn
 * their large finite values into inf.
 */

#define SIMD_UNSCALE_LOOPS(T, SIZE, ID)                                                       \
    static int SIMD_NAME(unscale_##T)(char *p, int64_t n, float inv_scale, int check_only)    \
    {                                                                                         \
        const simd_f32 inv = simd_set1(inv_scale);                                            \
        simd_acc bad = simd_acc_zero();                                                       \
        int64_t i = 0;                                                                        \
        if (check_only) {                                                                     \
            for (; i + SIMD_WIDTH <= n; i += SIMD_WIDTH)                                      \
                bad = simd_nonfinite(bad, load_##T(p + i * SIZE));                            \
        }                                                                                     \
        else {                                                                                \
            for (; i + SIMD_WIDTH <= n; i += SIMD_WIDTH) {                                    \
                const simd_f32 v = load_##T(p + i * SIZE);                                    \
                bad = simd_nonfinite(bad, v);                                                 \
                store_##T(p + i * SIZE, simd_mul(v, inv));                                    \
            }                                                                                 \
        }                                                                                     \
        const int tail = ampc_unscale_portable.unscale[ID](p + i * SIZE, n - i, inv_scale,    \
                                                           check_only);                       \
        return simd_any(bad) | tail;                                                          \
    }                                                                                         \
    static double SIMD_NAME(sumsq_##T)(const char *p, int64_t n, float inv_scale, int *nonfinite) \
    {                                                                                         \
        const simd_f32 inv = simd_set1(inv_scale);                                            \
        simd_acc bad = simd_acc_zero();                                                       \
        simd_dacc acc = simd_dacc_zero();                                                     \
        int64_t i = 0;                                                                        \
        for (; i + SIMD_WIDTH <= n; i += SIMD_WIDTH) {                                        \
            const simd_f32 v = load_##T(p + i * SIZE);                                        \
            bad = simd_nonfinite(bad, v);                                                     \
            acc = simd_sumsq(acc, simd_mul(v, inv));                                          \
        }                                                                                     \
        int tail_bad = 0;                                                                     \
        const double tail = ampc_unscale_portable.sumsq[ID](p + i * SIZE, n - i, inv_scale,   \
                                                            &tail_bad);                       \
        *nonfinite |= simd_any(bad) | tail_bad;                                               \
        return simd_dacc_sum(acc) + tail;                                                     \
    }

SIMD_UNSCALE_LOOPS(f32, 4, AMPC_FLOAT32)
SIMD_UNSCALE_LOOPS(f16, 2, AMPC_FLOAT16)
SIMD_UNSCALE_LOOPS(bf16, 2, AMPC_BFLOAT16)

#undef SIMD_UNSCALE_LOOPS

const ampc_unscale_table SIMD_UNSCALE_TABLE = {
    {[AMPC_FLOAT32] = SIMD_NAME(unscale_f32), [AMPC_FLOAT16] = SIMD_NAME(unscale_f16),
     [AMPC_BFLOAT16] = SIMD_NAME(unscale_bf16)},
    {[AMPC_FLOAT32] = SIMD_NAME(sumsq_f32), [AMPC_FLOAT16] = SIMD_NAME(sumsq_f16),
     [AMPC_BFLOAT16] = SIMD_NAME(sumsq_bf16)},
};
