/*
 * multi_tensor.cuh: what the multi-tensor kernels share (scaler.cu's
 * unscale and norm passes, optim.cu's steps): a table of tensors passed by
 * value as a kernel parameter, each cut into CHUNK-element pieces, one block
 * a piece. A table type has n, first_chunk[n + 1] (tensor k has the chunks
 * [first_chunk[k], first_chunk[k + 1])) and numel[n], whose length is the
 * table's capacity; its other fields are its kernels' own.
 *   pack_and_launch  fills tables from a list and launches each (host);
 *   this_piece       finds a block's piece in its table (device).
 */
#ifndef AMPC_MULTI_TENSOR_CUH
#define AMPC_MULTI_TENSOR_CUH

#include <stdint.h>

#include "common.h"

/* A table goes to its kernel by value: CUDA takes 32764 bytes of kernel
 * parameters (sm_70+, CUDA 12.1+), and the kernel's other arguments need
 * a little of that. */
constexpr size_t MAX_TABLE_BYTES = 32764 - 1024;

/* What pack_and_launch's fill answers for one item. */
struct Entry {
    int64_t numel;  /* the elements of the entry fill wrote, or -1: no entry */
    int status;     /* AMPC_OK, or an error that ends the walk */

    /* Entry k written, numel elements. */
    static Entry packed(int64_t numel) { return {numel, AMPC_OK}; }
    /* No entry: the item is skipped, or fill launched it by itself (with
     * that launch's status). */
    static Entry left_out(int status = AMPC_OK) { return {-1, status}; }
};

/*
 * Items 0 .. n-1 into tables, in order. fill(i, table, k) writes item i's
 * fields of entry k (all but numel and first_chunk, counted here) and
 * answers Entry::packed(numel), or Entry::left_out(): an item sent on its
 * own is launched inside fill, in its turn, so that launches keep the
 * list's order. launch(table, chunks) runs on each full table and on the
 * last one. A status other than AMPC_OK from either ends the walk. An
 * entry has ceil(numel / CHUNK) chunks, and an empty one 1 (a block with
 * nothing to do) so that this_piece finds every entry. The table is the
 * caller's: a field that fill leaves alone (a table-wide dtype) keeps its
 * value from table to table.
 */
template <int64_t CHUNK, class Table, class Fill, class Launch>
int pack_and_launch(Table &t, int64_t n, Fill fill, Launch launch)
{
    static_assert(sizeof(Table) <= MAX_TABLE_BYTES, "a multi-tensor table is too large for a kernel parameter");
    constexpr int CAPACITY = (int)(sizeof(Table::numel) / sizeof(int64_t));
    t.n = 0;
    t.first_chunk[0] = 0;
    for (int64_t i = 0; i < n; i++) {
        const int k = t.n;
        const Entry e = fill(i, t, k);
        if (e.status != AMPC_OK)
            return e.status;
        if (e.numel < 0)
            continue;
        t.numel[k] = e.numel;
        t.first_chunk[k + 1] = t.first_chunk[k] + (e.numel > 0 ? (e.numel + CHUNK - 1) / CHUNK : 1);
        t.n = k + 1;
        if (t.n == CAPACITY) {
            const int status = launch(t, t.first_chunk[t.n]);
            if (status != AMPC_OK)
                return status;
            t.n = 0;
        }
    }
    return t.n > 0 ? launch(t, t.first_chunk[t.n]) : AMPC_OK;
}

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
