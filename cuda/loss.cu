/*
 * loss.cu: cross_entropy and nll_loss over (outer = batch, n = classes,
 * inner = positions) logits, and their backward pass: the formulas of the
 * CPU's ops_real.inc, a row group per position.
 *
 * Forward: each position's log-sum-exp (online, one read of the row), its
 * loss and its weight; then, for mean and sum, one block adds the
 * positions in a fixed order in float64. No host synchronisation anywhere,
 * so class indices are not checked on the GPU (that would need one): an
 * index outside [0, classes) that is not ignore_index gives that position
 * a NaN loss (a NaN mean, a step GradScaler skips) and a zero gradient,
 * and nothing outside the row is read.
 *
 * Class-index targets over contiguous logits of one storage type, without
 * both class weights and label smoothing, take the streamed fast path:
 * 16-byte packs, one exponential per element (packs.cuh). Label smoothing's
 * sum of (lse - x) is then n * lse - sum(x), taken in the same pass.
 */
#include "packs.cuh"

namespace {

using namespace ops;

template <class Acc>
__device__ __forceinline__ Acc class_weight(const ampc_buf &w, int64_t k)
{
    return w.data != nullptr ? load<Acc>(w, k) : (Acc)1;
}

/* log-sum-exp of a row over the group (-inf for a row of -inf). */
template <int G, class Acc>
__device__ __forceinline__ Acc row_logsumexp(const ampc_buf &x, int64_t base, int64_t n, int64_t stride,
                                             Acc *scratch)
{
    Acc M, S;
    row_max_sum<G, Acc>(x, base, n, stride, M, S, scratch);
    return M == -INFINITY ? M : M + m_log(S);
}

/* Per position: lse (when saved), and the loss and weight into pos_loss
 * and pos_weight (mean, sum) or the loss itself (none). */
template <int G, class Acc>
__global__ void __launch_bounds__(BLOCK) cross_entropy_kernel(ampc_cross_entropy c, Acc *pos_loss, Acc *pos_weight)
{
    typedef RowGroup<G> Group;
    __shared__ Acc scratch[BLOCK / 32];
    const int64_t rows = c.rows.outer * c.rows.inner, n = c.rows.n, stride = c.rows.inner;
    const Acc ls = (Acc)c.smoothing;
    for (int64_t pos = Group::first(); pos < rows; pos += Group::step()) {
        const int64_t base = row_base(c.rows, pos);
        const Acc lse = c.log_probs ? (Acc)0 : row_logsumexp<G, Acc>(c.logits, base, n, stride, scratch);
        Acc loss, weight;
        if (c.probs_target) {
            /* -sum_k w_k q'_k log p_k, q' = (1 - ls) q + ls / n */
            Acc acc = 0;
            row_each2<G, Acc>(c.target, c.logits, base, n, stride, [&](int64_t k, Acc q, Acc x) {
                acc += class_weight<Acc>(c.weight, k) * (q * ((Acc)1 - ls) + ls / (Acc)n) * (x - lse);
            });
            loss = -Group::sum(acc, scratch);
            weight = 1;
        }
        else {
            const int64_t t = load_index(c.target, pos);
            if (t == c.ignore_index) {
                loss = 0;
                weight = 0;
            }
            else if (t < 0 || t >= n) {
                loss = (Acc)NAN;
                weight = 0;
            }
            else {
                weight = class_weight<Acc>(c.weight, t);
                loss = ((Acc)1 - ls) * weight * (lse - load<Acc>(c.logits, base + t * stride));
                if (ls > 0) {
                    Acc smooth = 0;
                    row_each<G, Acc>(c.logits, base, n, stride,
                                     [&](int64_t k, Acc x) { smooth += class_weight<Acc>(c.weight, k) * (lse - x); });
                    loss += ls * Group::sum(smooth, scratch) / (Acc)n;
                }
            }
        }
        if (Group::lane() == 0) {
            if (c.lse.data != nullptr)
                static_cast<Acc *>(c.lse.data)[pos] = lse;
            if (c.reduction == 0) {
                store(c.loss, pos, loss);
            }
            else {
                pos_loss[pos] = loss;
                pos_weight[pos] = weight;
            }
        }
    }
    if (c.reduction == 0 && c.denom.data != nullptr && blockIdx.x == 0 && threadIdx.x == 0)
        *static_cast<Acc *>(c.denom.data) = 1;
}

/* cross_entropy_kernel for class indices over contiguous rows (inner 1),
 * streamed; no class weights when smoothing. */
template <class T, int G>
__global__ void __launch_bounds__(BLOCK) cross_entropy_streamed(ampc_cross_entropy c, float *pos_loss, float *pos_weight)
{
    typedef RowGroup<G> Group;
    __shared__ float scratch[BLOCK / 32];
    const int64_t rows = c.rows.outer, n = c.rows.n;
    const float ls = (float)c.smoothing;
    const int lane = Group::lane();
    for (int64_t pos = Group::first(); pos < rows; pos += Group::step()) {
        const T *x = static_cast<const T *>(c.logits.data) + pos * n;
        float m = -INFINITY, e = 0.0f, sx = 0.0f;
        stream_reduce<T, G>(x, nullptr, n, lane, [&](int64_t, const float *v, const float *, auto count) {
            online_add_segment<decltype(count)::value>(m, e, v);
            if (ls > 0.0f)
                for (int i = 0; i < decltype(count)::value; i++)
                    sx += v[i];
        });
        float M, S;
        combine_max_sum<G>(m, e, M, S, scratch);
        const float lse = M == -INFINITY ? M : M + m_log(S);
        if (ls > 0.0f)
            sx = Group::sum(sx, scratch);
        float loss, weight;
        const int64_t t = load_index(c.target, pos);
        if (t == c.ignore_index) {
            loss = 0.0f;
            weight = 0.0f;
        }
        else if (t < 0 || t >= n) {
            loss = NAN;
            weight = 0.0f;
        }
        else {
            weight = class_weight<float>(c.weight, t);
            loss = (1.0f - ls) * weight * (lse - to_float(x[t]));
            if (ls > 0.0f)
                loss += ls * ((float)n * lse - sx) / (float)n;
        }
        if (lane == 0) {
            if (c.lse.data != nullptr)
                static_cast<float *>(c.lse.data)[pos] = lse;
            if (c.reduction == 0) {
                store(c.loss, pos, loss);
            }
            else {
                pos_loss[pos] = loss;
                pos_weight[pos] = weight;
            }
        }
    }
    if (c.reduction == 0 && c.denom.data != nullptr && blockIdx.x == 0 && threadIdx.x == 0)
        *static_cast<float *>(c.denom.data) = 1.0f;
}

/* Whether the streamed kernels serve these logits: class indices, inner 1,
 * a 16-bit or float32 storage type, not class weights and smoothing both. */
static bool streamable(const ampc_rows &rows, int logits_dtype, int probs_target, int log_probs, const void *weight,
                       double smoothing)
{
    return rows.inner == 1 && !probs_target && !log_probs && logits_dtype != AMPC_FLOAT64 &&
           (weight == nullptr || smoothing == 0.0);
}

/* The streamed forward, launched, or NOT_FAST. */
int cross_entropy_fast(const ampc_cross_entropy *c, float *pos_loss, float *pos_weight, cudaStream_t stream)
{
    if (!streamable(c->rows, c->logits.dtype, c->probs_target, c->log_probs, c->weight.data, c->smoothing))
        return NOT_FAST;
    const int group = c->rows.n < STREAM_BLOCK_FROM ? 32 : BLOCK;
    const unsigned grid = rows_grid(c->rows.outer, group);
    return with_storage(c->logits.dtype, [&](auto type) {
        using T = decltype(type);
        if (group == 32)
            cross_entropy_streamed<T, 32><<<grid, BLOCK, 0, stream>>>(*c, pos_loss, pos_weight);
        else
            cross_entropy_streamed<T, BLOCK><<<grid, BLOCK, 0, stream>>>(*c, pos_loss, pos_weight);
        return ampc_cuda_launched("cross_entropy kernel");
    });
}

/* One block: the mean or sum of the positions, in float64 and a fixed order
 * (each thread a fixed set of positions, then the block's tree). */
constexpr int FINISH = 1024;

template <class Acc>
__global__ void cross_entropy_finish(ampc_cross_entropy c, const Acc *pos_loss, const Acc *pos_weight, int64_t rows)
{
    __shared__ double total[FINISH], wsum[FINISH];
    double t = 0, w = 0;
    for (int64_t p = threadIdx.x; p < rows; p += FINISH) {
        t += (double)pos_loss[p];
        w += (double)pos_weight[p];
    }
    total[threadIdx.x] = t;
    wsum[threadIdx.x] = w;
    __syncthreads();
    for (int half = FINISH / 2; half > 0; half /= 2) {
        if (threadIdx.x < half) {
            total[threadIdx.x] += total[threadIdx.x + half];
            wsum[threadIdx.x] += wsum[threadIdx.x + half];
        }
        __syncthreads();
    }
    if (threadIdx.x != 0)
        return;
    const Acc denom = c.reduction == 1 ? (Acc)wsum[0] : (Acc)1;
    store(c.loss, 0, (Acc)(c.reduction == 1 ? total[0] / (double)denom : total[0]));
    if (c.denom.data != nullptr)
        *static_cast<Acc *>(c.denom.data) = denom;
}

template <class Acc>
int cross_entropy(int device, void *stream, const ampc_cross_entropy *c)
{
    const int64_t rows = c->rows.outer * c->rows.inner;
    Scratch scratch(device, stream);
    Acc *pos_loss = nullptr, *pos_weight = nullptr;
    if (c->reduction != 0) {
        const int got = scratch.get(2 * (size_t)rows * sizeof(Acc));
        if (got != AMPC_OK)
            return got;
        pos_loss = static_cast<Acc *>(scratch.ptr);
        pos_weight = pos_loss + rows;
    }
    if (rows > 0) {
        int status = NOT_FAST;
        if constexpr (std::is_same<Acc, float>::value)
            status = cross_entropy_fast(c, pos_loss, pos_weight, as_stream(stream));
        if (status == NOT_FAST) {
            const RowLaunch L = row_launch(c->rows);
            AMPC_LAUNCH_ROWS(cross_entropy_kernel, Acc, L, as_stream(stream), *c, pos_loss, pos_weight);
            status = ampc_cuda_launched("cross_entropy kernel");
        }
        if (status != AMPC_OK)
            return status;
    }
    if (c->reduction == 0)
        return AMPC_OK;
    cross_entropy_finish<Acc><<<1, FINISH, 0, as_stream(stream)>>>(*c, pos_loss, pos_weight, rows);
    return ampc_cuda_launched("cross_entropy reduction kernel");
}

template <int G, class Acc>
__global__ void __launch_bounds__(BLOCK) cross_entropy_backward_kernel(ampc_cross_entropy_backward c)
{
    typedef RowGroup<G> Group;
    __shared__ Acc scratch[BLOCK / 32];
    const int64_t rows = c.rows.outer * c.rows.inner, n = c.rows.n, stride = c.rows.inner;
    const Acc ls = (Acc)c.smoothing;
    const Acc denom = *static_cast<const Acc *>(c.denom.data);
    const Acc dl_one = c.reduction != 0 ? load<Acc>(c.dloss, 0) : (Acc)0;
    for (int64_t pos = Group::first(); pos < rows; pos += Group::step()) {
        const int64_t base = row_base(c.rows, pos);
        const Acc dl = c.reduction == 0 ? load<Acc>(c.dloss, pos) : dl_one;
        const Acc f = c.reduction == 1 ? dl / denom : dl;
        if (c.probs_target) {
            const Acc lse = static_cast<const Acc *>(c.lse.data)[pos];
            Acc s = 0;
            row_each<G, Acc>(c.target, base, n, stride, [&](int64_t k, Acc q) {
                s += class_weight<Acc>(c.weight, k) * (q * ((Acc)1 - ls) + ls / (Acc)n);
            });
            s = Group::sum(s, scratch);
            row_each2<G, Acc>(c.target, c.logits, base, n, stride, [&](int64_t k, Acc q, Acc x) {
                const Acc qk = q * ((Acc)1 - ls) + ls / (Acc)n;
                store(c.dlogits, base + k * stride, f * (m_exp(x - lse) * s - class_weight<Acc>(c.weight, k) * qk));
            });
            continue;
        }
        const int64_t t = load_index(c.target, pos);
        if (t == c.ignore_index || t < 0 || t >= n) {
            for (int64_t k = Group::lane(); k < n; k += G)
                store(c.dlogits, base + k * stride, (Acc)0);
        }
        else if (c.log_probs) {
            const Acc g = -f * class_weight<Acc>(c.weight, t);
            for (int64_t k = Group::lane(); k < n; k += G)
                store(c.dlogits, base + k * stride, k == t ? g : (Acc)0);
        }
        else {
            const Acc lse = static_cast<const Acc *>(c.lse.data)[pos];
            const Acc wt = class_weight<Acc>(c.weight, t);
            Acc wsum = (Acc)n;
            if (ls > 0 && c.weight.data != nullptr) {
                Acc s = 0;
                for (int64_t k = Group::lane(); k < n; k += G)
                    s += load<Acc>(c.weight, k);
                wsum = Group::sum(s, scratch);
            }
            row_each<G, Acc>(c.logits, base, n, stride, [&](int64_t k, Acc x) {
                const Acc p = m_exp(x - lse);
                Acc g = ((Acc)1 - ls) * wt * (p - (k == t ? (Acc)1 : (Acc)0));
                if (ls > 0)
                    g += ls / (Acc)n * (wsum * p - class_weight<Acc>(c.weight, k));
                store(c.dlogits, base + k * stride, f * g);
            });
        }
    }
}

/* cross_entropy_backward_kernel for streamable rows. */
template <class T, int G>
__global__ void __launch_bounds__(BLOCK) cross_entropy_backward_streamed(ampc_cross_entropy_backward c)
{
    typedef RowGroup<G> Group;
    const int64_t rows = c.rows.outer, n = c.rows.n;
    const float ls = (float)c.smoothing;
    const float denom = *static_cast<const float *>(c.denom.data);
    const float dl_one = c.reduction != 0 ? load<float>(c.dloss, 0) : 0.0f;
    const int lane = Group::lane();
    for (int64_t pos = Group::first(); pos < rows; pos += Group::step()) {
        const T *x = static_cast<const T *>(c.logits.data) + pos * n;
        T *dx = static_cast<T *>(c.dlogits.data) + pos * n;
        const float dl = c.reduction == 0 ? load<float>(c.dloss, pos) : dl_one;
        const float f = c.reduction == 1 ? dl / denom : dl;
        const int64_t t = load_index(c.target, pos);
        if (t == c.ignore_index || t < 0 || t >= n) {
            stream_map<T, G>(nullptr, nullptr, dx, n, lane, [](int64_t, float, float) { return 0.0f; });
            continue;
        }
        const float lse = static_cast<const float *>(c.lse.data)[pos];
        const float wt = class_weight<float>(c.weight, t);
        stream_map<T, G>(x, nullptr, dx, n, lane, [&](int64_t k, float v, float) {
            const float p = m_exp(v - lse);
            float g = (1.0f - ls) * wt * (p - (k == t ? 1.0f : 0.0f));
            if (ls > 0.0f)
                g += ls / (float)n * ((float)n * p - 1.0f);
            return f * g;
        });
    }
}

}  // namespace

extern "C" int ampc_cuda_cross_entropy(int device, void *stream, const ampc_cross_entropy *c)
{
    return ampc_on_device(device, [&] {
        return c->logits.dtype == AMPC_FLOAT64 ? cross_entropy<double>(device, stream, c)
                                               : cross_entropy<float>(device, stream, c);
    });
}

extern "C" int ampc_cuda_cross_entropy_backward(int device, void *stream, const ampc_cross_entropy_backward *c)
{
    if (c->rows.outer * c->rows.n * c->rows.inner == 0)
        return AMPC_OK;
    return ampc_on_device(device, [&] {
        if (c->dlogits.dtype == c->logits.dtype && same_phase(c->logits.data, c->dlogits.data) &&
            streamable(c->rows, c->logits.dtype, c->probs_target, c->log_probs, c->weight.data, c->smoothing)) {
            const int group = c->rows.n < STREAM_BLOCK_FROM ? 32 : BLOCK;
            const unsigned grid = rows_grid(c->rows.outer, group);
            return with_storage(c->logits.dtype, [&](auto type) {
                using T = decltype(type);
                if (group == 32)
                    cross_entropy_backward_streamed<T, 32><<<grid, BLOCK, 0, as_stream(stream)>>>(*c);
                else
                    cross_entropy_backward_streamed<T, BLOCK><<<grid, BLOCK, 0, as_stream(stream)>>>(*c);
                return ampc_cuda_launched("cross_entropy backward kernel");
            });
        }
        const RowLaunch L = row_launch(c->rows);
        if (c->logits.dtype == AMPC_FLOAT64)
            AMPC_LAUNCH_ROWS(cross_entropy_backward_kernel, double, L, as_stream(stream), *c);
        else
            AMPC_LAUNCH_ROWS(cross_entropy_backward_kernel, float, L, as_stream(stream), *c);
        return ampc_cuda_launched("cross_entropy backward kernel");
    });
}
