/*
 * attention.cpp: cuda/attention_kernels.cuh run on the CPU (cuda_model.h)
 * against a float64 reference: forward output and log-sum-exp, and the
 * three gradients, causal and not, lengths that end inside a tile, dense
 * and strided (GPT-2's heads of one projection) operands. Outputs are
 * poisoned first and laid out with gaps between rows, so that a row left
 * unwritten or a write outside its row shows. Prints a line per case;
 * exits 1 if any is off.
 *
 *   g++ -std=c++20 -O2 -pthread -Itests/emulated_cuda -Isrc -Icuda tests/emulated_cuda/attention.cpp
 */
#include "cuda_model.h"

#include "kernels/op_descriptors.h"
#include "kernels/philox.h"

#include "attention_kernels.cuh"

#include <cstdio>
#include <random>
#include <string>

namespace {

/* A (batch, heads, len, D) operand of 16-bit elements in a buffer of its own,
 * rows `gap` elements apart beyond D (poisoned there). */
struct Operand {
    int64_t batch, heads, len, gap;
    bool heads_inner;  /* (batch, len, heads, D) in memory, as attention's views of a projection */
    std::vector<uint16_t> buf;

    Operand(int64_t b, int64_t h, int64_t n, bool inner, int64_t gap_)
        : batch(b), heads(h), len(n), gap(gap_), heads_inner(inner), buf((size_t)(b * h * n * (D + gap_)) + 8)
    {
    }
    int64_t row_stride() const { return heads_inner ? heads * (D + gap) : D + gap; }
    int64_t head_stride() const { return heads_inner ? D + gap : len * (D + gap); }
    int64_t batch_stride() const { return heads * len * (D + gap); }
    int64_t index(int64_t b, int64_t h, int64_t i, int64_t d) const
    {
        return b * batch_stride() + h * head_stride() + i * row_stride() + d;
    }
    ampc_attention_arg arg() { return {buf.data(), {batch_stride(), head_stride(), row_stride()}}; }
};

template <class T>
float value(uint16_t bits)
{
    return std::is_same<T, __half>::value ? half_to_float(bits) : bf16_to_float(bits);
}

template <class T>
uint16_t bits_of(float v)
{
    return std::is_same<T, __half>::value ? float_to_half(v) : float_to_bf16(v);
}

template <class T>
void fill_random(Operand &x, std::mt19937 &rng)
{
    std::normal_distribution<float> normal;
    for (auto &e : x.buf)
        e = bits_of<T>(normal(rng));
}

/* Out of every element, and the gap after its rows: NaN. */
template <class T>
void poison(Operand &x)
{
    for (auto &e : x.buf)
        e = bits_of<T>(NAN);
}

struct Case {
    int64_t batch, heads, kv_heads, q_len, kv_len;
    bool causal, heads_inner;
    double dropout;  /* p: the probabilities dropped with it, as the composed attention drops them */
};

/* Largest |got - want| over the largest |want|; inf where got is NaN or a
 * gap was written. */
template <class T>
double compare(const Operand &got, const std::vector<double> &want)
{
    double err = 0.0, scale = 1e-30;
    for (int64_t b = 0; b < got.batch; b++)
        for (int64_t h = 0; h < got.heads; h++)
            for (int64_t i = 0; i < got.len; i++) {
                for (int64_t d = 0; d < D; d++) {
                    const double w = want[(size_t)(((b * got.heads + h) * got.len + i) * D + d)];
                    const double g = value<T>(got.buf[(size_t)got.index(b, h, i, d)]);
                    if (std::isnan(g))
                        return INFINITY;
                    err = std::max(err, std::fabs(g - w));
                    scale = std::max(scale, std::fabs(w));
                }
                for (int64_t d = D; d < D + got.gap; d++)
                    if (!std::isnan(value<T>(got.buf[(size_t)got.index(b, h, i, d)])))
                        return INFINITY;
            }
    return err / scale;
}

template <class T, bool DROP>
bool run(const Case &c, std::mt19937 &rng)
{
    const int64_t B = c.batch, H = c.heads, HK = c.kv_heads, G = H / HK, L = c.q_len, S = c.kv_len, gap = 8;
    const float scale = 0.125f;
    Operand q(B, H, L, c.heads_inner, gap), k(B, HK, S, c.heads_inner, gap), v(B, HK, S, c.heads_inner, gap);
    Operand o(B, H, L, c.heads_inner, gap), dout(B, H, L, c.heads_inner, gap);
    Operand dq(B, H, L, c.heads_inner, gap), dk(B, HK, S, c.heads_inner, gap), dv(B, HK, S, c.heads_inner, gap);
    for (Operand *x : {&q, &k, &v, &dout})
        fill_random<T>(*x, rng);
    for (Operand *x : {&o, &dq, &dk, &dv})
        poison<T>(*x);
    std::vector<float> lse((size_t)(B * H * L), NAN), delta((size_t)(B * H * L), NAN);

    ampc_attention a = {};
    a.dtype = std::is_same<T, __half>::value ? AMPC_FLOAT16 : AMPC_BFLOAT16;
    a.batch = B, a.heads = H, a.kv_heads = HK, a.q_len = L, a.kv_len = S, a.head_dim = D, a.causal = c.causal, a.scale = scale;
    a.q = q.arg(), a.k = k.arg(), a.v = v.arg(), a.o = o.arg(), a.lse = lse.data();
    a.seed = rng(), a.offset = rng() % 1000, a.keep_below = (uint32_t)std::llround((1.0 - c.dropout) * 16777216.0);
    a.keep_scale = c.dropout < 1.0 ? (float)(1.0 / (1.0 - c.dropout)) : 0.0f;
    const unsigned q_tiles = (unsigned)((L + TILE - 1) / TILE), kv_tiles = (unsigned)((S + TILE - 1) / TILE);
    launch(q_tiles, (unsigned)(B * H), forward_kernel<T, DROP>, a);
    ampc_attention_backward bw = {a, dout.arg(), dq.arg(), dk.arg(), dv.arg()};
    launch((unsigned)((B * H * L + WARPS - 1) / WARPS), 1, delta_kernel<T>, bw, delta.data());
    launch(kv_tiles, (unsigned)(B * HK), dkdv_kernel<T, DROP>, bw, (const float *)delta.data());
    launch(q_tiles, (unsigned)(B * H), dq_kernel<T, DROP>, bw, (const float *)delta.data());

    /* float64 reference from the same 16-bit inputs */
    std::vector<double> ro((size_t)(B * H * L * D)), rdq(ro.size()), rdk((size_t)(B * HK * S * D)), rdv(rdk.size());
    double lse_err = 0.0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++) {
            const int64_t bh = b * H + h, bhk = b * HK + h / G;  /* the key/value head of h's group */
            auto at = [&](const Operand &x, int64_t i, int64_t d) {
                return (double)value<T>(x.buf[(size_t)x.index(b, &x == &k || &x == &v ? h / G : h, i, d)]);
            };
            std::vector<double> p((size_t)(L * S)), dp((size_t)(L * S)), z((size_t)(L * S), 1.0);
            for (int64_t e = 0; DROP && e < L * S; e++) {  /* the composed attention's mask */
                const uint64_t i = (uint64_t)(bh * L * S + e);
                z[e] = ampc_philox_keep(ampc_philox(a.seed, a.offset + i / 4).v[i % 4], a.keep_below) ? a.keep_scale : 0.0;
            }
            for (int64_t i = 0; i < L; i++) {
                double m = -INFINITY;
                for (int64_t j = 0; j < S; j++) {
                    double s = 0.0;
                    for (int64_t d = 0; d < D; d++)
                        s += at(q, i, d) * at(k, j, d);
                    p[i * S + j] = c.causal && j > i ? -INFINITY : s * scale;
                    m = std::max(m, p[i * S + j]);
                }
                double sum = 0.0;
                for (int64_t j = 0; j < S; j++)
                    sum += std::exp(p[i * S + j] - m);
                lse_err = std::max(lse_err, std::fabs(lse[(size_t)(bh * L + i)] - (m + std::log(sum))));
                for (int64_t j = 0; j < S; j++)
                    p[i * S + j] = std::exp(p[i * S + j] - m) / sum;
                for (int64_t d = 0; d < D; d++) {
                    double acc = 0.0;
                    for (int64_t j = 0; j < S; j++)
                        acc += p[i * S + j] * z[i * S + j] * at(v, j, d);
                    ro[(size_t)((bh * L + i) * D + d)] = acc;
                }
            }
            for (int64_t i = 0; i < L; i++) {
                double di = 0.0;
                for (int64_t d = 0; d < D; d++)
                    di += at(dout, i, d) * ro[(size_t)((bh * L + i) * D + d)];
                for (int64_t j = 0; j < S; j++) {
                    double s = 0.0;
                    for (int64_t d = 0; d < D; d++)
                        s += at(dout, i, d) * at(v, j, d);
                    dp[i * S + j] = p[i * S + j] * (z[i * S + j] * s - di);  /* dS */
                }
            }
            for (int64_t d = 0; d < D; d++) {
                for (int64_t i = 0; i < L; i++) {
                    double acc = 0.0;
                    for (int64_t j = 0; j < S; j++)
                        acc += dp[i * S + j] * at(k, j, d);
                    rdq[(size_t)((bh * L + i) * D + d)] = acc * scale;
                }
                for (int64_t j = 0; j < S; j++) {
                    double gk = 0.0, gv = 0.0;
                    for (int64_t i = 0; i < L; i++) {
                        gk += dp[i * S + j] * at(q, i, d);
                        gv += p[i * S + j] * z[i * S + j] * at(dout, i, d);
                    }
                    rdk[(size_t)((bhk * S + j) * D + d)] += gk * scale;  /* the group's heads add up */
                    rdv[(size_t)((bhk * S + j) * D + d)] += gv;
                }
            }
        }
    const bool half = std::is_same<T, __half>::value;
    const double tol_o = half ? 4e-3 : 3e-2, tol_g = half ? 2e-2 : 1.2e-1;
    const double eo = compare<T>(o, ro), eq = compare<T>(dq, rdq), ek = compare<T>(dk, rdk), ev = compare<T>(dv, rdv);
    const bool ok = eo < tol_o && eq < tol_g && ek < tol_g && ev < tol_g && lse_err < 1e-4;
    std::printf("%s %s B=%lld H=%lld/%lld L=%lld S=%lld causal=%d dropout=%.2f %s: out %.2e lse %.2e dq %.2e "
                "dk %.2e dv %.2e\n", ok ? "ok  " : "FAIL", half ? "fp16" : "bf16", (long long)B, (long long)H,
                (long long)HK, (long long)L, (long long)S,
                (int)c.causal, c.dropout, c.heads_inner ? "heads-inner" : "dense", eo, lse_err, eq, ek, ev);
    return ok;
}

}  // namespace

int main(int argc, char **argv)
{
    std::mt19937 rng(argc > 1 ? (unsigned)std::stoul(argv[1]) : 0u);
    /* {batch, heads, kv_heads, q_len, kv_len, causal, heads_inner, dropout}: tails of both lengths,
     * several tiles each way, a causal diagonal inside and across tiles, grouped query heads (2 and
     * 3 to a key/value head), dropout (odd kv_len: an element pair straddles two Philox blocks);
     * float16 for all, bfloat16 (the other rounding of pack2 and of the instructions' operands)
     * for two. */
    const Case cases[] = {
        {1, 2, 2, 70, 37, false, false, 0.0}, {1, 2, 2, 70, 37, true, false, 0.0},
        {2, 1, 1, 37, 100, true, true, 0.0},  {1, 1, 1, 64, 64, true, false, 0.0},
        {1, 2, 2, 5, 130, false, true, 0.0},  {1, 1, 1, 130, 3, true, false, 0.0},
        {1, 2, 2, 77, 77, true, true, 0.0},   {1, 4, 2, 70, 70, true, true, 0.0},
        {2, 3, 1, 20, 90, false, false, 0.0}, {1, 2, 1, 70, 77, true, true, 0.3},
        {1, 1, 1, 33, 100, false, false, 0.6},
    };
    bool ok = true;
    for (const Case &c : cases)
        ok = (c.dropout > 0.0 ? run<__half, true>(c, rng) : run<__half, false>(c, rng)) && ok;
    ok = run<__nv_bfloat16, false>(cases[1], rng) && ok;
    ok = run<__nv_bfloat16, true>(cases[9], rng) && ok;
    return ok ? 0 : 1;
}
