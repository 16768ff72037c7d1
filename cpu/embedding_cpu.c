/*
 * embedding_cpu.c: the CPU kernels of embedding, its backward pass, and
 * dropout (op_descriptors.h). Plain C on ampc's threads; the caller releases the GIL.
 *
 * The embedding's backward is the GPU's algorithm (cuda/embedding.cu):
 * positions grouped by index in position order (here a counting sort),
 * then each row's sum taken over its positions in that order, in the
 * accumulation dtype, and rounded once. The two give the same bits.
 */
#include <stdlib.h>
#include <string.h>

#include "cpu/fpenv.h"
#include "cpu/cpu_kernels.h"
#include "cpu/ops_cpu_io.h"
#include "cpu/parallel.h"
#include "kernels/philox.h"

/* ------------------------------------------------------------------------ */
/* Forward: copy rows                                                        */
/* ------------------------------------------------------------------------ */

static void embedding_range(void *ctx, int64_t begin, int64_t end)
{
    const ampc_embedding *e = ctx;
    const int64_t row = e->dim * ampc_dtype_size(e->weight.dtype);
    for (int64_t i = begin; i < end; i++)
        memcpy((char *)e->out.data + i * row, (const char *)e->weight.data + ampc_index_at(&e->indices, i) * row,
               (size_t)row);
}

int ampc_cpu_embedding(const ampc_embedding *e)
{
    if (e->count * e->dim == 0)
        return 0;
    ampc_parallel_for(e->count, OPS_MIN_WORK / (e->dim + 1) + 1, 1, embedding_range, (void *)e);
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Backward: rows summed over their positions, in position order             */
/* ------------------------------------------------------------------------ */

typedef struct {
    const ampc_embedding_backward *e;
    const int64_t *start;     /* num + 1: row r's positions are order[start[r] .. start[r + 1]) */
    const int64_t *order;     /* positions grouped by index, ascending within a group */
    int failed;
} embedding_backward_job;

#define EMBEDDING_COLUMNS 256  /* columns summed at once: the accumulators stay in cache */

static void embedding_backward_range(void *ctx, int64_t begin, int64_t end)
{
    embedding_backward_job *job = ctx;
    const ampc_embedding_backward *e = job->e;
    const ampc_dtype acc = ampc_acc_dtype(e->dy.dtype);
    const int64_t asize = ampc_dtype_size(acc), dim = e->dim;
    char *buf = malloc((size_t)(2 * EMBEDDING_COLUMNS * asize));
    if (buf == NULL) {
        __atomic_store_n(&job->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    char *sum = buf, *vals = buf + EMBEDDING_COLUMNS * asize;
    AMPC_FPENV_ENTER();
    for (int64_t r = begin; r < end; r++) {
        const int64_t lo = job->start[r], hi = job->start[r + 1];
        for (int64_t c0 = 0; c0 < dim; c0 += EMBEDDING_COLUMNS) {
            const int64_t cols = dim - c0 < EMBEDDING_COLUMNS ? dim - c0 : EMBEDDING_COLUMNS;
            memset(sum, 0, (size_t)(cols * asize));
            for (int64_t k = lo; k < hi; k++) {
                const void *v = load_vals(vals, acc, &e->dy, job->order[k] * dim + c0, 1, cols);
                if (acc == AMPC_FLOAT64)
                    for (int64_t c = 0; c < cols; c++)
                        ((double *)sum)[c] += ((const double *)v)[c];
                else
                    for (int64_t c = 0; c < cols; c++)
                        ((float *)sum)[c] += ((const float *)v)[c];
            }
            store_vals(&e->dweight, r * dim + c0, 1, sum, acc, cols);
        }
    }
    AMPC_FPENV_LEAVE();
    free(buf);
}

int ampc_cpu_embedding_backward(const ampc_embedding_backward *e)
{
    if (e->num * e->dim == 0)
        return 0;
    /* calloc: the count times the element size is checked, never wrapped */
    int64_t *start = calloc((size_t)(e->num + 1), sizeof *start);
    int64_t *order = calloc((size_t)(e->count > 0 ? e->count : 1), sizeof *order);
    if (start == NULL || order == NULL) {
        free(start);
        free(order);
        return -1;
    }
    /* a counting sort of the positions by index, stable: ascending positions within an index */
    for (int64_t i = 0; i < e->count; i++) {
        const int64_t r = ampc_index_at(&e->indices, i);
        if (r >= 0 && r < e->num && r != e->padding_idx)
            start[r + 1]++;
    }
    for (int64_t r = 0; r < e->num; r++)
        start[r + 1] += start[r];
    int64_t *next = calloc((size_t)e->num, sizeof *next);
    if (next == NULL) {
        free(start);
        free(order);
        return -1;
    }
    memcpy(next, start, (size_t)e->num * sizeof *next);
    for (int64_t i = 0; i < e->count; i++) {
        const int64_t r = ampc_index_at(&e->indices, i);
        if (r >= 0 && r < e->num && r != e->padding_idx)
            order[next[r]++] = i;
    }
    free(next);
    embedding_backward_job job = {.e = e, .start = start, .order = order};
    ampc_parallel_for(e->num, OPS_MIN_WORK / (e->dim + 1) + 1, 1, embedding_backward_range, &job);
    free(start);
    free(order);
    return job.failed ? -1 : 0;
}

/* ------------------------------------------------------------------------ */
/* Dropout                                                                   */
/* ------------------------------------------------------------------------ */

/* A dropped element is x * 0, not 0: NaN and inf stay visible, as torch's. */
static void dropout_range(void *ctx, int64_t begin, int64_t end)
{
    const ampc_dropout *d = ctx;
    const ampc_dtype acc = ampc_acc_dtype(d->x.dtype);
    char buf[2][OPS_BLOCK * 8];
    AMPC_FPENV_ENTER();
    /* begin is a multiple of 4 (the range's alignment): whole Philox blocks */
    for (int64_t i0 = begin; i0 < end; i0 += OPS_BLOCK) {
        const int64_t n = end - i0 < OPS_BLOCK ? end - i0 : OPS_BLOCK;
        const void *x = load_vals(buf[0], acc, &d->x, i0, 1, n);
        void *y = out_target(buf[1], acc, &d->y, i0);
        for (int64_t j = 0; j < n; j += 4) {
            const ampc_philox_block b = ampc_philox(d->seed, d->offset + (uint64_t)(i0 + j) / 4);
            for (int64_t u = 0; u < 4 && j + u < n; u++) {
                const int keep = ampc_philox_keep(b.v[u], d->keep_below);
                if (acc == AMPC_FLOAT64)
                    ((double *)y)[j + u] = ((const double *)x)[j + u] * (keep ? d->scale : 0.0);
                else
                    ((float *)y)[j + u] = ((const float *)x)[j + u] * (keep ? (float)d->scale : 0.0f);
            }
        }
        store_vals(&d->y, i0, 1, y, acc, n);
    }
    AMPC_FPENV_LEAVE();
}

int ampc_cpu_dropout(const ampc_dropout *d)
{
    if (d->numel == 0)
        return 0;
    ampc_parallel_for(d->numel, OPS_MIN_WORK, OPS_BLOCK, dropout_range, (void *)d);
    return 0;
}
