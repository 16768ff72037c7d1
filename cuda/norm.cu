/*
 * norm.cu: layer_norm over the last n elements of each row, and its
 * backward pass.
 *
 * Forward: a row group takes the mean, then the variance around it (two
 * passes, as the CPU: no cancellation), then writes the normalised row;
 * mean and 1 / sqrt(var + eps) are saved in the compute type.
 * Backward: dx row by row (two sums over the row: of g = dy * w and of
 * g * xhat), and dweight = sum over rows of dy * xhat, dbias = sum of dy,
 * as two-stage column sums in one pass (ops.cuh), in a fixed order.
 */
#include "ops.cuh"

namespace {

using namespace ops;

template <int G, class Acc>
__global__ void layer_norm_kernel(ampc_layer_norm l)
{
    typedef RowGroup<G> Group;
    __shared__ Acc scratch[BLOCK / 32];
    const int64_t n = l.n;
    for (int64_t row = Group::first(); row < l.rows; row += Group::step()) {
        const int64_t base = row * n;
        Acc s = 0;
        row_each<G, Acc>(l.x, base, n, 1, [&](int64_t, Acc v) { s += v; });
        const Acc mean = Group::sum(s, scratch) / (Acc)n;
        Acc q = 0;
        row_each<G, Acc>(l.x, base, n, 1, [&](int64_t, Acc v) { q += (v - mean) * (v - mean); });
        const Acc var = Group::sum(q, scratch) / (Acc)n;
        const Acc rstd = (Acc)1 / m_sqrt(var + (Acc)l.eps);
        row_each<G, Acc>(l.x, base, n, 1, [&](int64_t j, Acc v) {
            v = (v - mean) * rstd;
            if (l.weight.data != nullptr)
                v *= load<Acc>(l.weight, j);
            if (l.bias.data != nullptr)
                v += load<Acc>(l.bias, j);
            store(l.y, base + j, v);
        });
        if (Group::lane() == 0) {
            static_cast<Acc *>(l.mean.data)[row] = mean;
            static_cast<Acc *>(l.rstd.data)[row] = rstd;
        }
    }
}

/* dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * w. */
template <int G, class Acc>
__global__ void layer_norm_dx_kernel(ampc_layer_norm_backward l)
{
    typedef RowGroup<G> Group;
    __shared__ Acc scratch[BLOCK / 32];
    const int64_t n = l.n;
    for (int64_t row = Group::first(); row < l.rows; row += Group::step()) {
        const int64_t base = row * n;
        const Acc mean = static_cast<const Acc *>(l.mean.data)[row];
        const Acc rstd = static_cast<const Acc *>(l.rstd.data)[row];
        Acc sg = 0, sgx = 0;
        row_each2<G, Acc>(l.dy, l.x, base, n, 1, [&](int64_t j, Acc dy, Acc x) {
            const Acc g = l.weight.data != nullptr ? dy * load<Acc>(l.weight, j) : dy;
            sg += g;
            sgx += g * (x - mean) * rstd;
        });
        const Acc mg = Group::sum(sg, scratch) / (Acc)n;
        const Acc mgx = Group::sum(sgx, scratch) / (Acc)n;
        row_each2<G, Acc>(l.dy, l.x, base, n, 1, [&](int64_t j, Acc dy, Acc x) {
            const Acc g = l.weight.data != nullptr ? dy * load<Acc>(l.weight, j) : dy;
            store(l.dx, base + j, rstd * (g - mg - (x - mean) * rstd * mgx));
        });
    }
}

/* Column values for the weight gradients: row j, feature i. */
template <class Acc>
struct DyXhat {  /* dweight and dbias */
    ampc_layer_norm_backward l;
    __device__ void operator()(int64_t, int64_t j, int64_t i, Acc *v) const
    {
        const Acc dy = load<Acc>(l.dy, j * l.n + i);
        const Acc mean = static_cast<const Acc *>(l.mean.data)[j], rstd = static_cast<const Acc *>(l.rstd.data)[j];
        v[0] = dy * (load<Acc>(l.x, j * l.n + i) - mean) * rstd;
        v[1] = dy;
    }
};

template <class Acc>
struct Dy {  /* dbias alone */
    ampc_layer_norm_backward l;
    __device__ void operator()(int64_t, int64_t j, int64_t i, Acc *v) const { v[0] = load<Acc>(l.dy, j * l.n + i); }
};

template <class Acc>
struct DyXhatOnly {  /* dweight alone */
    ampc_layer_norm_backward l;
    __device__ void operator()(int64_t, int64_t j, int64_t i, Acc *v) const
    {
        DyXhat<Acc> both{l};
        Acc two[2];
        both(0, j, i, two);
        v[0] = two[0];
    }
};

template <class Acc>
int layer_norm_backward(int device, void *stream, const ampc_layer_norm_backward *l)
{
    if (l->dx.data != nullptr) {
        const RowLaunch L = row_launch(ampc_rows{l->rows, l->n, 1});
        AMPC_LAUNCH_ROWS(layer_norm_dx_kernel, Acc, L, as_stream(stream), *l);
        const int status = ampc_cuda_launched("layer_norm backward kernel");
        if (status != AMPC_OK)
            return status;
    }
    const char *what = "layer_norm weight gradient kernel";
    if (l->dweight.data != nullptr && l->dbias.data != nullptr)
        return column_sums<2, Acc>(device, stream, DyXhat<Acc>{*l}, 1, l->rows, l->n, l->dweight, l->dbias,
                                   (Acc)1, what);
    if (l->dweight.data != nullptr)
        return column_sums<1, Acc>(device, stream, DyXhatOnly<Acc>{*l}, 1, l->rows, l->n, l->dweight, l->dweight,
                                   (Acc)1, what);
    if (l->dbias.data != nullptr)
        return column_sums<1, Acc>(device, stream, Dy<Acc>{*l}, 1, l->rows, l->n, l->dbias, l->dbias, (Acc)1, what);
    return AMPC_OK;
}

}  // namespace

extern "C" int ampc_cuda_layer_norm(int device, void *stream, const ampc_layer_norm *l)
{
    if (l->rows == 0 || l->n == 0)
        return AMPC_OK;
    return ampc_on_device(device, [&] {
        const RowLaunch L = row_launch(ampc_rows{l->rows, l->n, 1});
        if (l->x.dtype == AMPC_FLOAT64)
            AMPC_LAUNCH_ROWS(layer_norm_kernel, double, L, as_stream(stream), *l);
        else
            AMPC_LAUNCH_ROWS(layer_norm_kernel, float, L, as_stream(stream), *l);
        return ampc_cuda_launched("layer_norm kernel");
    });
}

extern "C" int ampc_cuda_layer_norm_backward(int device, void *stream, const ampc_layer_norm_backward *l)
{
    if (l->rows == 0 || l->n == 0)
        return AMPC_OK;
    return ampc_on_device(device, [&] {
        return l->x.dtype == AMPC_FLOAT64 ? layer_norm_backward<double>(device, stream, l)
                                          : layer_norm_backward<float>(device, stream, l);
    });
}
