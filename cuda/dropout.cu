/*
 * dropout.cu: dropout (op_descriptors.h): y = x * keep * scale, keep drawn by
 * Philox4x32-10 (kernels/philox.h) at (seed, offset), the CPU's numbers: a
 * thread per block of 4 elements. A dropped element is x * 0, so NaN and
 * inf stay visible, as torch's.
 */
#include "ops.cuh"
#include "kernels/philox.h"

namespace {

using namespace ops;

template <class Acc>
__global__ void dropout_kernel(ampc_dropout d)
{
    const int64_t blocks = (d.numel + 3) / 4;
    const Acc scale = (Acc)d.scale;
    for (int64_t b = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; b < blocks; b += (int64_t)gridDim.x * blockDim.x) {
        const ampc_philox_block r = ampc_philox(d.seed, d.offset + (uint64_t)b);
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int64_t i = 4 * b + u;
            if (i < d.numel)
                store(d.y, i, load<Acc>(d.x, i) * (ampc_philox_keep(r.v[u], d.keep_below) ? scale : (Acc)0));
        }
    }
}

}  // namespace

extern "C" int ampc_cuda_dropout(int device, void *stream, const ampc_dropout *d)
{
    if (d->numel == 0)
        return AMPC_OK;
    return ampc_on_device(device, [&] {
        const unsigned grid = grid_for((d->numel + 3) / 4, 256);
        if (d->x.dtype == AMPC_FLOAT64)
            dropout_kernel<double><<<grid, 256, 0, as_stream(stream)>>>(*d);
        else
            dropout_kernel<float><<<grid, 256, 0, as_stream(stream)>>>(*d);
        return ampc_cuda_launched("dropout kernel");
    });
}
