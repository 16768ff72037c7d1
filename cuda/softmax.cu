/*
 * softmax.cu: softmax and log_softmax along one dimension, and their
 * backward passes, over (outer, n, inner) rows (ops.cuh's row groups).
 *
 * Forward: one pass keeps a running maximum and the sum of exp(x - max)
 * rescaled as the maximum grows (the online softmax, ops.cuh's
 * row_max_sum), the group combines its lanes, and a second pass writes the
 * outputs: two reads (the second mostly from cache), one write.
 * A row of -inf gives NaN and a NaN anywhere makes its row NaN, as torch's
 * and the CPU kernel's do.
 */
#include "ops.cuh"

namespace {

using namespace ops;

template <int G, class Acc>
__global__ void softmax_kernel(ampc_softmax s)
{
    typedef RowGroup<G> Group;
    __shared__ Acc scratch[BLOCK / 32];
    const int64_t rows = s.rows.outer * s.rows.inner, n = s.rows.n, stride = s.rows.inner;
    for (int64_t pos = Group::first(); pos < rows; pos += Group::step()) {
        const int64_t base = row_base(s.rows, pos);
        Acc M, S;
        row_max_sum<G, Acc>(s.x, base, n, stride, M, S, scratch);
        if (s.log) {
            const Acc shift = M + m_log(S);
            row_each<G, Acc>(s.x, base, n, stride, [&](int64_t j, Acc v) { store(s.y, base + j * stride, v - shift); });
        }
        else {
            const Acc inv = (Acc)1 / S;
            row_each<G, Acc>(s.x, base, n, stride,
                             [&](int64_t j, Acc v) { store(s.y, base + j * stride, m_exp(v - M) * inv); });
        }
    }
}

/* softmax: dx = y * (dy - sum(dy * y)); log_softmax: dx = dy - exp(y) * sum(dy). */
template <int G, class Acc>
__global__ void softmax_backward_kernel(ampc_softmax_backward s)
{
    typedef RowGroup<G> Group;
    __shared__ Acc scratch[BLOCK / 32];
    const int64_t rows = s.rows.outer * s.rows.inner, n = s.rows.n, stride = s.rows.inner;
    for (int64_t pos = Group::first(); pos < rows; pos += Group::step()) {
        const int64_t base = row_base(s.rows, pos);
        Acc t = 0;
        if (s.log)
            row_each<G, Acc>(s.dy, base, n, stride, [&](int64_t, Acc dy) { t += dy; });
        else
            row_each2<G, Acc>(s.dy, s.y, base, n, stride, [&](int64_t, Acc dy, Acc y) { t += dy * y; });
        t = Group::sum(t, scratch);
        row_each2<G, Acc>(s.dy, s.y, base, n, stride, [&](int64_t j, Acc dy, Acc y) {
            store(s.dx, base + j * stride, s.log ? dy - m_exp(y) * t : y * (dy - t));
        });
    }
}

}  // namespace

extern "C" int ampc_cuda_softmax(int device, void *stream, const ampc_softmax *s)
{
    if (s->rows.outer * s->rows.n * s->rows.inner == 0)
        return AMPC_OK;
    return ampc_on_device(device, [&] {
        const RowLaunch L = row_launch(s->rows);
        if (s->x.dtype == AMPC_FLOAT64)
            AMPC_LAUNCH_ROWS(softmax_kernel, double, L, as_stream(stream), *s);
        else
            AMPC_LAUNCH_ROWS(softmax_kernel, float, L, as_stream(stream), *s);
        return ampc_cuda_launched("softmax kernel");
    });
}

extern "C" int ampc_cuda_softmax_backward(int device, void *stream, const ampc_softmax_backward *s)
{
    if (s->rows.outer * s->rows.n * s->rows.inner == 0)
        return AMPC_OK;
    return ampc_on_device(device, [&] {
        const RowLaunch L = row_launch(s->rows);
        if (s->y.dtype == AMPC_FLOAT64)
            AMPC_LAUNCH_ROWS(softmax_backward_kernel, double, L, as_stream(stream), *s);
        else
            AMPC_LAUNCH_ROWS(softmax_backward_kernel, float, L, as_stream(stream), *s);
        return ampc_cuda_launched("softmax backward kernel");
    });
}
