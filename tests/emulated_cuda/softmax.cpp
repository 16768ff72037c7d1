/*
 * softmax.cpp: cuda/softmax_kernels.cuh's streamed forward kernels run on the
 * CPU (cuda_model.h, blocks of 512 threads): softmax_smem, which keeps each
 * row in shared memory for its second and third passes, and softmax_streamed,
 * each against a float64 reference (their sums differ in order: the one
 * online, the other after the maximum).
 * Rows off 16-byte boundaries, causal rows whose live part ends before the
 * first boundary, inside a pack and after the last, a grid smaller than the
 * rows, -inf and NaN; outputs poisoned first, with guards before and after
 * the rows that must stay untouched. Prints a line per case; exits 1 if any
 * is off.
 *
 *   g++ -std=c++20 -O2 -pthread -Itests/emulated_cuda/shadow -Itests/emulated_cuda -Isrc -Icuda \
 *       tests/emulated_cuda/softmax.cpp
 */
#define AMPC_MODEL_ROWS
#define AMPC_MODEL_THREADS 512
#include "cuda_model.h"

#include "softmax_kernels.cuh"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

constexpr int GUARD = 24;  /* elements before and after the rows */

struct Case {
    const char *name;
    int64_t rows, n, causal, offset;  /* offset: elements before row 0, after the guard */
    unsigned grid;
    bool special;  /* row 0 all -inf, row 1 a NaN, row 2 -inf but its last 10 */
};

template <class T>
ampc_dtype dtype_of()
{
    return std::is_same<T, float>::value ? AMPC_FLOAT32 : std::is_same<T, __half>::value ? AMPC_FLOAT16 : AMPC_BFLOAT16;
}

template <class T>
const char *name_of()
{
    return std::is_same<T, float>::value ? "float32" : std::is_same<T, __half>::value ? "float16" : "bfloat16";
}

float to_float(float v) { return v; }
float to_float(__half v) { return half_to_float(v.bits); }
float to_float(__nv_bfloat16 v) { return bf16_to_float(v.bits); }

template <class T>
T from_float(float v)
{
    if constexpr (std::is_same<T, float>::value)
        return v;
    else if constexpr (std::is_same<T, __half>::value)
        return __half{float_to_half(v)};
    else
        return __nv_bfloat16{float_to_bf16(v)};
}

/* The kernels' output of one row in float64: NaN where a live element is
 * NaN or every live one is -inf (exp(-inf - -inf)), as torch's; and in
 * *scale what each output's error is relative to (log_softmax's
 * x - (m + log(s)) cancels: the terms' size, not the result's). */
std::vector<double> reference(const std::vector<double> &x, int64_t live, int64_t n, bool log,
                              std::vector<double> *scale)
{
    double m = -INFINITY;
    bool nan = false;
    for (int64_t j = 0; j < live; j++) {
        nan = nan || std::isnan(x[j]);
        m = std::max(m, x[j]);
    }
    double s = 0.0;
    for (int64_t j = 0; j < live; j++)
        s += std::exp(x[j] - m);
    std::vector<double> y(n, log ? -INFINITY : 0.0);
    scale->assign(n, 0.0);
    for (int64_t j = 0; j < live; j++) {
        y[j] = nan || m == -INFINITY ? NAN : log ? x[j] - m - std::log(s) : std::exp(x[j] - m) / s;
        (*scale)[j] = log ? std::fabs(x[j]) + std::fabs(m) + std::log(s) : std::fabs(y[j]);  /* x - (m + log s) */
    }
    return y;
}

/* |got - want| within the output dtype's rounding (and the float32 sum's),
 * relative to scale, with room for 16-bit subnormals. */
template <class T>
bool close(double got, double want, double scale)
{
    if (std::isnan(want) || std::isnan(got))
        return std::isnan(want) && std::isnan(got);
    if (std::isinf(want) || std::isinf(got))
        return got == want;
    const double rtol = std::is_same<T, float>::value ? 2e-5 : std::is_same<T, __half>::value ? 1.5e-3 : 1e-2;
    const double atol = std::is_same<T, __half>::value ? 1e-7 : 1e-37;
    return std::fabs(got - want) <= rtol * scale + atol;
}

template <class T>
bool run(const Case &c, bool log, std::mt19937 &rng)
{
    constexpr int VEC = ops::vec_of<T>();
    const int64_t total = GUARD + c.offset + c.rows * c.n + GUARD;
    std::normal_distribution<float> normal(0.0f, 3.0f);
    std::vector<T> x(total);
    for (auto &v : x)
        v = from_float<T>(normal(rng));
    T *row0 = x.data() + GUARD + c.offset;
    if (c.special) {
        for (int64_t j = 0; j < c.n; j++)
            row0[j] = from_float<T>(-INFINITY);
        row0[c.n + 17] = from_float<T>(NAN);
        for (int64_t j = 0; j < c.n - 10; j++)
            row0[2 * c.n + j] = from_float<T>(-INFINITY);
    }
    std::vector<T> y_streamed(total, from_float<T>(1234.5f)), y_smem = y_streamed;
    const std::vector<T> poison = y_streamed;

    ampc_softmax s{};
    s.rows = {c.rows, c.n, 1};
    s.log = log;
    s.causal = c.causal;
    s.x = {row0, dtype_of<T>()};
    s.y = {y_streamed.data() + GUARD + c.offset, dtype_of<T>()};
    launch(c.grid, 1, softmax_streamed<T, ops::BLOCK>, s);
    s.y = {y_smem.data() + GUARD + c.offset, dtype_of<T>()};
    launch_shared(c.grid, 1, (size_t)(c.n / VEC + 1) * 16, softmax_smem<T>, s);

    std::string why;
    const int64_t first = GUARD + c.offset, end = first + c.rows * c.n;
    const std::pair<const char *, const std::vector<T> *> kernels[] = {{"softmax_smem", &y_smem},
                                                                       {"softmax_streamed", &y_streamed}};
    for (const auto &[kernel, y] : kernels) {
        for (int64_t i = 0; i < total && why.empty(); i++)
            if ((i < first || i >= end) && std::memcmp(&(*y)[i], &poison[i], sizeof(T)) != 0)
                why = std::string(kernel) + " wrote outside the rows, at " + std::to_string(i - first);
        for (int64_t r = 0; r < c.rows && why.empty(); r++) {
            std::vector<double> row(c.n);
            for (int64_t j = 0; j < c.n; j++)
                row[j] = to_float(row0[r * c.n + j]);
            const int64_t live = c.causal > 0 ? std::min(r % c.causal + 1, c.n) : c.n;
            std::vector<double> scale;
            const std::vector<double> want = reference(row, live, c.n, log, &scale);
            for (int64_t j = 0; j < c.n && why.empty(); j++) {
                const double got = to_float((*y)[first + r * c.n + j]);
                if (!close<T>(got, want[j], scale[j]))
                    why = std::string(kernel) + ", row " + std::to_string(r) + " element " + std::to_string(j) +
                          ": " + std::to_string(got) + " against " + std::to_string(want[j]);
            }
        }
    }
    std::printf("%s %s %s %s%s%s\n", why.empty() ? "ok" : "FAILED", name_of<T>(), log ? "log_softmax" : "softmax", c.name,
                why.empty() ? "" : ": ", why.c_str());
    return why.empty();
}

}  // namespace

int main(int argc, char **argv)
{
    std::mt19937 rng(argc > 1 ? (unsigned)std::stoul(argv[1]) : 1u);
    /* 20001 and 28000 float32, 50257 16-bit elements: rows softmax.cu sends to softmax_smem; the
     * causal case's live parts end before the first 16-byte boundary, inside packs and after the
     * last, over every row of a 40 x 40 matrix */
    const Case cases[] = {
        {"5 rows of 20001, off the boundaries, grid 3", 5, 20001, 0, 1, 3, false},
        {"3 rows of 20001 with -inf and NaN", 3, 20001, 0, 2, 2, true},
        {"40 causal rows of 40, grid 5", 40, 40, 40, 3, 5, false},
    };
    bool ok = true;
    for (int log = 0; log < 2; log++) {
        for (const Case &c : cases) {
            ok = run<float>(c, log, rng) && ok;
            ok = run<__half>(c, log, rng) && ok;
            ok = run<__nv_bfloat16>(c, log, rng) && ok;
        }
        ok = run<float>({"2 rows of 28000, aligned", 2, 28000, 0, 0, 2, false}, log, rng) && ok;
        ok = run<__half>({"4 rows of 50257, off the boundaries", 4, 50257, 0, 5, 4, false}, log, rng) && ok;
        ok = run<__nv_bfloat16>({"4 rows of 50257, off the boundaries", 4, 50257, 0, 5, 4, false}, log, rng) && ok;
    }
    return ok ? 0 : 1;
}
