/*
 * multi_tensor.cuh: what the multi-tensor kernels share (scaler.cu's
 * unscale and norm passes, optim.cu's steps): a table of tensors passed by
 * value as a kernel parameter, each cut into CHUNK-element pieces, one block
 * a piece. A table type has n, first_chunk[n + 1] (tensor k has the chunks
 * [first_chunk[k], first_chunk[k + 1])) and numel[n].
 */
#ifndef AMPC_MULTI_TENSOR_CUH
#define AMPC_MULTI_TENSOR_CUH

#include <stdint.h>

/* This block's piece: tensor k, elements [begin, end). */
struct Piece {
    int k;
    int64_t begin, end;
};

template <int64_t CHUNK, class Table>
__device__ __forceinline__ Piece this_piece(const Table &t)
{
    const int64_t chunk = blockIdx.x;
    int lo = 0, hi = t.n - 1;  /* binary search of the table */
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (t.first_chunk[mid] <= chunk)
            lo = mid;
        else
            hi = mid - 1;
    }
    const int64_t begin = (chunk - t.first_chunk[lo]) * CHUNK;
    return {lo, begin, begin + CHUNK < t.numel[lo] ? begin + CHUNK : t.numel[lo]};
}

#endif /* AMPC_MULTI_TENSOR_CUH */
