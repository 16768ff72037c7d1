/*
 * strided.cuh: any ampc_loop as a kernel argument, and the byte offsets of
 * element i in each operand; for the arrays that no merging of dimensions
 * makes contiguous. Up to AMPC_MAX_NDIM dimensions and 2 operands: 1.5 KB,
 * well inside a kernel's parameter space.
 */
#ifndef AMPC_STRIDED_CUH
#define AMPC_STRIDED_CUH

#include <stdint.h>
#include "kernels/layout.h"

struct StridedLayout {
    int ndim;
    int64_t shape[AMPC_MAX_NDIM];
    int64_t stride[2][AMPC_MAX_NDIM];  /* bytes; [0]: the output (or the only operand) */
};

static inline StridedLayout strided_layout(const ampc_loop *loop)
{
    StridedLayout l;
    l.ndim = loop->ndim;
    for (int d = 0; d < loop->ndim; d++) {
        l.shape[d] = loop->shape[d];
        l.stride[0][d] = loop->strides[0][d];
        l.stride[1][d] = loop->nop > 1 ? loop->strides[1][d] : 0;
    }
    return l;
}

/* Byte offsets of linear element i (in the loop's order) in both operands. */
__device__ __forceinline__ void strided_offsets(const StridedLayout &l, int64_t i, int64_t &off0, int64_t &off1)
{
    off0 = 0;
    off1 = 0;
    for (int d = l.ndim - 1; d >= 0; d--) {
        const int64_t k = i % l.shape[d];
        i /= l.shape[d];
        off0 += k * l.stride[0][d];
        off1 += k * l.stride[1][d];
    }
}

/* Blocks for a grid-stride loop over n elements: enough to fill the GPU. */
static inline unsigned strided_blocks(int64_t n, int block)
{
    const int64_t b = (n + block - 1) / block;
    return (unsigned)(b < 65536 ? (b > 0 ? b : 1) : 65536);
}

#endif /* AMPC_STRIDED_CUH */
