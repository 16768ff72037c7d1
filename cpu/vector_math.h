/*
 * vector_math.h: e^x and erfc(x) in float32, written so that a loop calling
 * them vectorises. libm's expf and erfcf are a call per element, which no
 * compiler vectorises without -ffast-math: softmax, cross_entropy, sigmoid
 * and silu ran at about 5 ns an element and gelu at 12, a tenth and a
 * twenty-fifth of torch's CPU kernels.
 *
 * Branch-free (selects only), and every operation a correctly rounded IEEE
 * one, so a vectorised loop gives the scalar bits on any instruction set
 * (the build keeps -ffp-contract=off).
 */
#ifndef AMPC_VECTOR_MATH_H
#define AMPC_VECTOR_MATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

static inline float ampc_float_from_bits(uint32_t b)
{
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}

/* For the functions a vectorised loop calls per element: GCC stopped inlining them (and so
 * vectorising those loops) once the kernels were compiled twice, for SSE2 and AVX2. */
#if defined(__GNUC__)
#define AMPC_ALWAYS_INLINE __attribute__((always_inline)) inline
#else
#define AMPC_ALWAYS_INLINE inline
#endif

/* Cody-Waite's reduction of e^x to 2^n e^r with |r| <= ln2 / 2: ln2 in two parts, the high one
 * of 9 significant bits, so that n * ln2_hi is exact for every n of float32's range. */
#define AMPC_LOG2E 1.44269504088896341f
#define AMPC_LN2_HI 0.693359375f
#define AMPC_LN2_LO -2.12194440e-4f

/* x clamped to [-104, 89], beyond which every e^x is inf or 0 in float32 */
static AMPC_ALWAYS_INLINE float ampc_exp_clamp(float x)
{
    const float c = x > 89.0f ? 89.0f : x;
    return c < -104.0f ? -104.0f : c;
}

/* round(x / ln2), ties to even, for a clamped x */
static AMPC_ALWAYS_INLINE float ampc_exp_reduction_n(float x)
{
    const float round = 12582912.0f;  /* 1.5 * 2^23: adding and subtracting it rounds to an integer */
    return (x * AMPC_LOG2E + round) - round;
}

/* 2^n e^r for |r| <= ln2 / 2 (a little beyond costs accuracy, not range) and n in [-150, 128]:
 * Cephes' degree-7 polynomial for e^r, then 2^n applied in two halves, each a normal float, so that
 * results in the subnormal range round once and large n overflow to inf. */
static AMPC_ALWAYS_INLINE float ampc_exp_reduced(float n, float r)
{
    /* Estrin's scheme (depth 4 where Horner's chain is 6 multiply-adds): without FMA (kept off, for
     * the same bits on every instruction set) that chain's latency bound the loops calling e^x */
    const float r2 = r * r;
    const float q0 = 1.6666665459e-1f * r + 5.0000001201e-1f, q1 = 8.3334519073e-3f * r + 4.1665795894e-2f;
    const float q2 = 1.9875691500e-4f * r + 1.3981999507e-3f;
    float p = (q0 + q1 * r2) + q2 * (r2 * r2);
    p = p * r2 + r + 1.0f;
    const int32_t k = (int32_t)n, h = k / 2;
    return p * ampc_float_from_bits((uint32_t)(h + 127) << 23) * ampc_float_from_bits((uint32_t)(k - h + 127) << 23);
}

/* e^x within 0.98 ulp over a third of all float32 inputs (tests/test_ops.py sweeps a sample); NaN
 * stays NaN, e^-inf is 0 and e^inf inf. */
static AMPC_ALWAYS_INLINE float ampc_expf(float x)
{
    const float c = ampc_exp_clamp(x == x ? x : 0.0f);  /* a NaN computes on 0 and is put back at the end */
    const float n = ampc_exp_reduction_n(c);
    float r = c - n * AMPC_LN2_HI;
    r = r - n * AMPC_LN2_LO;
    const float y = ampc_exp_reduced(n, r);
    return x == x ? y : x;
}

/* e^(a + b) without rounding a + b first, for an exact a (erfc's -x^2, split so that its square is
 * exact) and a smaller b in [-2, 2]: a - n ln2_hi is exact wherever |a| >= 2 (n ln2_hi is a
 * multiple of 2^-9 and a one of its own ulp), so the reduced argument carries b's rounding and
 * one more, not a's (|a| ulp). Not for NaN; a + b above 89 is not clamped (erfc never has it). */
/* ampc_exp_of_sum in two steps, for loops that run each over a block: n, the power of 2 of the
 * reduction, then the rest */
static AMPC_ALWAYS_INLINE float ampc_exp_of_sum_n(float a, float b)
{
    return ampc_exp_reduction_n(ampc_exp_clamp(a + b));
}

static AMPC_ALWAYS_INLINE float ampc_exp_of_sum_with(float a, float b, float n)
{
    const float r = (a - n * AMPC_LN2_HI) + (b - n * AMPC_LN2_LO);
    const float y = ampc_exp_reduced(n, r);
    return a + b < -104.0f ? 0.0f : y;  /* below, n was clamped and r is not reduced */
}

static AMPC_ALWAYS_INLINE float ampc_exp_of_sum(float a, float b)
{
    return ampc_exp_of_sum_with(a, b, ampc_exp_of_sum_n(a, b));
}

/* log(x) in float32, branch-free as ampc_expf: x = 2^e m with m in [sqrt(1/2), sqrt(2)) (subnormal x
 * scaled by 2^23 first), log(m) = f - f^2 / 2 + f^3 P(f) for f = m - 1 (exact) with Cephes' degree-8
 * P by Estrin's scheme, and e ln2 added in Cody-Waite's two parts. log(0) = -inf, log(inf) = inf,
 * negative x and NaN give NaN. libm's logf is a call per element: binary_cross_entropy_with_logits,
 * through log1p, ran at 25 ns an element. */
static AMPC_ALWAYS_INLINE float ampc_logf(float x)
{
    const float tiny = 1.17549435e-38f;  /* the least normal float */
    const float xs = x < tiny ? x * 8388608.0f : x;  /* 2^23: a subnormal x becomes normal */
    uint32_t bits;
    memcpy(&bits, &xs, sizeof bits);
    const float m0 = ampc_float_from_bits((bits & 0x007fffffu) | 0x3f000000u);  /* [1/2, 1) */
    const int below = m0 < 0.707106781186547524f;
    /* e by float selects (exact: small integers); an int `below` in the integer arithmetic kept the
     * loops scalar */
    const float e = (float)((int32_t)(bits >> 23) - 126) - (below ? 1.0f : 0.0f) - (x < tiny ? 23.0f : 0.0f);
    const float f = (below ? m0 + m0 : m0) - 1.0f;  /* exact: m in [sqrt(1/2), sqrt(2)) */
    const float z = f * f, z2 = z * z, z4 = z2 * z2;
    const float q0 = -2.4999993993e-1f * f + 3.3333331174e-1f, q1 = -1.6668057665e-1f * f + 2.0000714765e-1f;
    const float q2 = -1.1514610310e-1f * f + 1.1676998740e-1f, q3 = -1.2420140846e-1f * f + 1.4249322787e-1f;
    const float p = (q0 + q1 * z) + (q3 + q2 * z) * z2 + 7.0376836292e-2f * z4;
    float y = f * z * p;
    y = y + e * AMPC_LN2_LO;
    y = y - 0.5f * z;
    const float r = (f + y) + e * AMPC_LN2_HI;
    const float special = x == 0 ? -INFINITY : (x == INFINITY ? x : NAN);
    const int finite_positive = (x > 0) & (x < INFINITY);  /* not &&: its branch kept the loops scalar */
    return finite_positive ? r : (x == x ? special : x);
}

/* log(1 + u) as log(w) u / (w - 1), w = 1 + u rounded (Goldberg's correction: the quotient undoes
 * w's rounding), u itself where w is 1; u = inf gives inf. */
static AMPC_ALWAYS_INLINE float ampc_log1pf(float u)
{
    const float w = 1.0f + u;
    const float r = w == 1.0f ? u : ampc_logf(w) * (u / (w - 1.0f));
    return u == INFINITY ? u : r;
}

/* erfc(x) in float32, branch-free as ampc_expf: t = 1 / (1 + |x| / 2), erfc(|x|) = t e^(-x^2 + P(t))
 * with Numerical Recipes' Chebyshev fit P (relative error under 1.2e-7 for every |x|), and x^2
 * split as h^2 + (2h + l) l with h of 12 significant bits (so h^2 is exact: rounding x^2 would put
 * x^2 * 2^-24 of relative error into e^(-x^2), 50 ulp at |x| = 7, gelu(-10)'s tail); erfc(x) for
 * negative x as 2 - erfc(|x|), which no longer cancels. In stages (ampc_erfcf_rows runs each over
 * a block of values): t; e^'s two arguments; e^'s reduction; the rest. */
static AMPC_ALWAYS_INLINE float ampc_erfc_abs(float x)
{
    const float z = x < 0 ? -x : x;
    return z < 20.0f ? z : 20.0f;  /* erfc(20) is 0 in float32; inf would make the split NaN */
}

static AMPC_ALWAYS_INLINE float ampc_erfc_t(float x) { return 1.0f / (1.0f + 0.5f * ampc_erfc_abs(x)); }

/* -x^2 (exact, as -h^2) and P(t) - (2h + l) l: e^(-x^2 + P(t)) is e^ of their sum */
static AMPC_ALWAYS_INLINE void ampc_erfc_exponent(float x, float t, float *square, float *rest)
{
    const float z = ampc_erfc_abs(x);
    /* P(t) of degree 9 by Estrin's scheme: 4 levels of multiply-add, not Horner's chain of 9, which
     * left gelu bound by its latency (3.7 ns an element on one thread) */
    const float t2 = t * t, t4 = t2 * t2, t8 = t4 * t4;
    const float q0 = 1.00002368f * t - 1.26551223f, q1 = 0.09678418f * t + 0.37409196f;
    const float q2 = 0.27886807f * t - 0.18628806f, q3 = 1.48851587f * t - 1.13520398f;
    const float q4 = 0.17087277f * t - 0.82215223f;
    const float p = ((q0 + q1 * t2) + (q2 + q3 * t2) * t4) + q4 * t8;
    const float c = 4097.0f * z, h = c - (c - z), l = z - h;  /* Veltkamp's split: h has 12 bits */
    *square = -(h * h);
    *rest = p - (h + h + l) * l;
}

/* erfc(x) from t and e^(-x^2 + P(t)) */
static AMPC_ALWAYS_INLINE float ampc_erfc_finish(float x, float t, float e)
{
    const float r = t * e;
    const float y = x < 0 ? 2.0f - r : r;
    return x == x ? y : x;
}

static AMPC_ALWAYS_INLINE float ampc_erfcf(float x)
{
    const float t = ampc_erfc_t(x);
    float square, rest;
    ampc_erfc_exponent(x, t, &square, &rest);
    return ampc_erfc_finish(x, t, ampc_exp_of_sum(square, rest));
}

/* out[i] = ampc_erfcf(x[i]) for n values (out may be x), bit for bit, each stage a loop over a
 * block: one loop of the whole body was one chain of dependent operations an iteration, longer than
 * the out-of-order window could overlap (gelu 2.2 ns an element on one thread, 1.64 in three
 * stages, 1.43 in these four; a fifth, e^'s reduced argument apart, gained nothing). */
#define AMPC_ERFC_BLOCK 256
static AMPC_ALWAYS_INLINE void ampc_erfcf_rows(int64_t n, float *out, const float *x)
{
    float t[AMPC_ERFC_BLOCK], square[AMPC_ERFC_BLOCK], rest[AMPC_ERFC_BLOCK], powers[AMPC_ERFC_BLOCK];  /* e^'s n */
    for (int64_t i0 = 0; i0 < n; i0 += AMPC_ERFC_BLOCK) {
        const int m = (int)(n - i0 < AMPC_ERFC_BLOCK ? n - i0 : AMPC_ERFC_BLOCK);
        const float *xb = x + i0;
        float *ob = out + i0;
        for (int i = 0; i < m; i++)
            t[i] = ampc_erfc_t(xb[i]);
        for (int i = 0; i < m; i++)
            ampc_erfc_exponent(xb[i], t[i], &square[i], &rest[i]);
        for (int i = 0; i < m; i++)
            powers[i] = ampc_exp_of_sum_n(square[i], rest[i]);
        for (int i = 0; i < m; i++)
            ob[i] = ampc_erfc_finish(xb[i], t[i], ampc_exp_of_sum_with(square[i], rest[i], powers[i]));
    }
}

/* tanh(x): Cephes' odd polynomial x + x^3 P(x^2) for |x| < 0.625, where 1 - 2 / (e^2|x| + 1)
 * would cancel, and that form beyond it (e^2|x| overflowing to inf gives exactly 1), the sign put
 * back; both are computed and one chosen. Within 1.33 ulp over a third of all float32 inputs
 * (glibc's tanhf: 2.18). */
static AMPC_ALWAYS_INLINE float ampc_tanhf(float x)
{
    const float z = x < 0 ? -x : x;
    const float s = x * x;
    float p = -5.70498872745e-3f;
    p = p * s + 2.06390887954e-2f;
    p = p * s - 5.37397155531e-2f;
    p = p * s + 1.33314422036e-1f;
    p = p * s - 3.33332819422e-1f;
    const float small = p * s * x + x;
    const float large = 1.0f - 2.0f / (ampc_expf(z + z) + 1.0f);
    const float y = z < 0.625f ? small : (x < 0 ? -large : large);
    return x == x && x != 0 ? y : x;  /* NaN, and -0 (the polynomial would give +0) */
}

#endif /* AMPC_VECTOR_MATH_H */
