/*
 * reduce.cu: out[o, i] = scale * sum_j x[o, j, i] over (outer, n, inner),
 * in the compute type and a fixed order (the same bits on every run).
 *   inner > 1: ops.cuh's column sums (coalesced across i);
 *   inner == 1: each row cut into chunks, a block summing each chunk, then
 *   the chunks added in order (column_finish with inner 1).
 * A sum over the rows of a contiguous 2-D array of one storage type (a
 * bias's gradient) takes packs.cuh's column sums, a pack of columns per
 * thread.
 */
#include "packs.cuh"

namespace {

using namespace ops;

template <class Acc>
struct Element {
    ampc_buf x;
    int64_t n, inner;
    __device__ void operator()(int64_t o, int64_t j, int64_t i, Acc *v) const
    {
        v[0] = load<Acc>(x, (o * n + j) * inner + i);
    }
};

/* Elements per chunk of a row: enough that a block's set-up is negligible. */
constexpr int64_t ROW_CHUNK = 1 << 15;

/* Block (o, chunk): the chunk's sum into partial[o][chunk], or with one
 * chunk, scaled, into out. */
template <class Acc>
__global__ void row_partials(ampc_buf x, int64_t n, int64_t chunks, Acc *partial, ampc_buf out, Acc scale)
{
    __shared__ Acc scratch[BLOCK / 32];
    const int64_t o = blockIdx.x / chunks, c = blockIdx.x % chunks;
    const int64_t chunk = (n + chunks - 1) / chunks;
    const int64_t j0 = c * chunk, j1 = j0 + chunk < n ? j0 + chunk : n;
    Acc s = 0;
#pragma unroll 8
    for (int64_t j = j0 + threadIdx.x; j < j1; j += BLOCK)
        s += load<Acc>(x, o * n + j);
    s = RowGroup<BLOCK>::sum(s, scratch);
    if (threadIdx.x != 0)
        return;
    if (chunks > 1)
        partial[o * chunks + c] = s;
    else
        store(out, o, s * scale);
}

template <class Acc>
int reduce(int device, void *stream, const ampc_reduce *r)
{
    const int64_t outer = r->rows.outer, n = r->rows.n, inner = r->rows.inner;
    const Acc scale = (Acc)r->scale;
    if (inner > 1 || n == 0)
        return column_sums<1, Acc>(device, stream, Element<Acc>{r->x, n, inner}, outer, n, inner, r->out, r->out,
                                   scale, "sum kernel");
    const int64_t chunks = (n + ROW_CHUNK - 1) / ROW_CHUNK;
    if (outer * chunks >= (int64_t)1 << 31)
        return ampc_cuda_fail_msg(AMPC_ERR_INVALID, "sum: %lld rows are too many for one launch", (long long)outer);
    Scratch scratch(device, stream);
    if (chunks > 1) {
        const int got = scratch.get((size_t)(outer * chunks) * sizeof(Acc));
        if (got != AMPC_OK)
            return got;
    }
    row_partials<Acc><<<(unsigned)(outer * chunks), BLOCK, 0, as_stream(stream)>>>(
        r->x, n, chunks, static_cast<Acc *>(scratch.ptr), r->out, scale);
    int status = ampc_cuda_launched("sum kernel");
    if (status == AMPC_OK && chunks > 1)
        status = finish_columns<Acc>(stream, static_cast<const Acc *>(scratch.ptr), outer, 1, chunks, 1, r->out, r->out,
                                     scale, "sum kernel");
    return status;
}

/* Sums over the rows of a (rows, cols) array whose columns come in whole
 * 16-byte packs, or NOT_FAST. */
int reduce_fast(int device, void *stream, const ampc_reduce *r)
{
    const ampc_rows &d = r->rows;
    if (d.outer != 1 || d.inner == 1 || d.n == 0 || !packs_fit(r->x.dtype, d.inner, r->x.data))
        return NOT_FAST;
    return with_storage(r->x.dtype, [&](auto type) {
        using T = decltype(type);
        return packed_column_sums<T, 1>(device, stream, PlainColumns<T>{static_cast<const T *>(r->x.data), d.inner},
                                        d.n, d.inner, r->out, r->out, (float)r->scale, "sum kernel");
    });
}

}  // namespace

extern "C" int ampc_cuda_reduce(int device, void *stream, const ampc_reduce *r)
{
    if (r->rows.outer * r->rows.inner == 0)
        return AMPC_OK;
    return ampc_on_device(device, [&] {
        const int fast = reduce_fast(device, stream, r);
        if (fast != NOT_FAST)
            return fast;
        return r->x.dtype == AMPC_FLOAT64 ? reduce<double>(device, stream, r) : reduce<float>(device, stream, r);
    });
}
