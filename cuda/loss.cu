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
 */
#include "ops.cuh"

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
__global__ void cross_entropy_kernel(ampc_cross_entropy c, Acc *pos_loss, Acc *pos_weight)
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
        const RowLaunch L = row_launch(c->rows);
        AMPC_LAUNCH_ROWS(cross_entropy_kernel, Acc, L, as_stream(stream), *c, pos_loss, pos_weight);
        const int status = ampc_cuda_launched("cross_entropy kernel");
        if (status != AMPC_OK)
            return status;
    }
    if (c->reduction == 0)
        return AMPC_OK;
    cross_entropy_finish<Acc><<<1, FINISH, 0, as_stream(stream)>>>(*c, pos_loss, pos_weight, rows);
    return ampc_cuda_launched("cross_entropy reduction kernel");
}

template <int G, class Acc>
__global__ void cross_entropy_backward_kernel(ampc_cross_entropy_backward c)
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
        const RowLaunch L = row_launch(c->rows);
        if (c->logits.dtype == AMPC_FLOAT64)
            AMPC_LAUNCH_ROWS(cross_entropy_backward_kernel, double, L, as_stream(stream), *c);
        else
            AMPC_LAUNCH_ROWS(cross_entropy_backward_kernel, float, L, as_stream(stream), *c);
        return ampc_cuda_launched("cross_entropy backward kernel");
    });
}
