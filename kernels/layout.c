/* layout.c: see layout.h. */
#include "kernels/layout.h"

#include <stdlib.h>

/* |v| as an unsigned number: INT64_MIN's has no int64 (a stride of a size-1
 * dimension may be anything). */
static uint64_t abs64(int64_t v) { return v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v; }

int64_t ampc_layout_numel(int ndim, const int64_t *shape, int64_t itemsize)
{
    int64_t n = 1, nbytes;
    int zero = 0;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return -1;
        if (shape[i] == 0)
            zero = 1;
        else if (ampc_size_mul(n, shape[i], &n) < 0)
            return -1;
    }
    if (ampc_size_mul(n, itemsize, &nbytes) < 0)
        return -1;
    return zero ? 0 : n;
}

int ampc_layout_extent(int ndim, const int64_t *shape, const int64_t *strides,
                       int64_t itemsize, int64_t *lo, int64_t *hi)
{
    int64_t low = 0, high = itemsize;
    for (int i = 0; i < ndim; i++) {
        int64_t span;
        if (shape[i] <= 1)
            continue;  /* no step taken: the stride may be anything */
        if (ampc_size_mul(shape[i] - 1, strides[i], &span) < 0 ||
            ampc_size_add(span < 0 ? low : high, span, span < 0 ? &low : &high) < 0)
            return -1;
    }
    *lo = low;
    *hi = high;
    return 0;
}

/* ndim is small: insertion sort. */
void ampc_layout_sort_by_stride(int ndim, const int64_t *strides, int *perm)
{
    for (int i = 0; i < ndim; i++)
        perm[i] = i;
    for (int i = 1; i < ndim; i++) {
        const int p = perm[i];
        int j = i;
        while (j > 0 && abs64(strides[perm[j - 1]]) < abs64(strides[p])) {
            perm[j] = perm[j - 1];
            j--;
        }
        perm[j] = p;
    }
}

int ampc_layout_has_internal_overlap(int ndim, const int64_t *shape, const int64_t *strides,
                                     int64_t itemsize)
{
    for (int d = 0; d < ndim; d++)
        if (shape[d] == 0)
            return 0;  /* no elements, nothing to share (NumPy gives such arrays zero strides) */
    int perm[AMPC_MAX_NDIM];
    ampc_layout_sort_by_stride(ndim, strides, perm);
    uint64_t extent = (uint64_t)itemsize;  /* bytes from the first to past the last element of the inner dimensions */
    for (int k = ndim - 1; k >= 0; k--) {
        const int d = perm[k];
        if (shape[d] <= 1)
            continue;
        uint64_t span;
        if (abs64(strides[d]) < extent || __builtin_mul_overflow((uint64_t)(shape[d] - 1), abs64(strides[d]), &span) ||
            __builtin_add_overflow(extent, span, &extent) || extent > INT64_MAX)
            return 1;  /* a layout past int64 is no array: refused as if overlapping */
    }
    return 0;
}

void ampc_layout_korder_strides(int ndim, const int64_t *shape, const int64_t *strides,
                                int64_t itemsize, int64_t *out_strides)
{
    int perm[AMPC_MAX_NDIM];
    ampc_layout_sort_by_stride(ndim, strides, perm);
    uint64_t step = (uint64_t)itemsize;  /* unsigned: a shape past int64 wraps without UB, and numel refuses it */
    for (int k = ndim - 1; k >= 0; k--) {
        const int d = perm[k];
        out_strides[d] = (int64_t)step;
        step *= shape[d] > 0 ? (uint64_t)shape[d] : 1;
    }
}

int ampc_layout_is_c_contiguous(int ndim, const int64_t *shape, const int64_t *strides,
                                int64_t itemsize)
{
    uint64_t step = (uint64_t)itemsize;
    for (int d = ndim - 1; d >= 0; d--) {
        if (shape[d] == 0)
            return 1;
        if (shape[d] != 1 && (uint64_t)strides[d] != step)
            return 0;
        step *= (uint64_t)shape[d];
    }
    return 1;
}

void ampc_loop_init(ampc_loop *loop, int nop, int ndim, const int64_t *shape,
                    char *const *data, const int64_t *const *strides)
{
    int perm[AMPC_MAX_NDIM];
    loop->nop = nop;
    loop->numel = 1;
    for (int op = 0; op < nop; op++)
        loop->data[op] = data[op];
    for (int d = 0; d < ndim; d++)
        loop->numel *= shape[d];

    /* Order by the output's strides: writes are the expensive side. */
    ampc_layout_sort_by_stride(ndim, strides[0], perm);

    int n = 0;
    for (int k = 0; k < ndim; k++) {
        const int d = perm[k];
        if (shape[d] == 1)
            continue;
        loop->shape[n] = shape[d];
        for (int op = 0; op < nop; op++)
            loop->strides[op][n] = strides[op][d];
        n++;
    }

    /* Walk a dimension forwards when every operand walks it backwards. */
    for (int d = 0; d < n; d++) {
        int all_negative = 1;
        for (int op = 0; op < nop; op++)
            all_negative &= loop->strides[op][d] < 0;
        /* (shape - 1) * stride and -stride fit: within the operand's extent */
        if (!all_negative)
            continue;
        for (int op = 0; op < nop; op++) {
            loop->data[op] += (loop->shape[d] - 1) * loop->strides[op][d];
            loop->strides[op][d] = -loop->strides[op][d];
        }
    }

    /* Merge an outer dimension into the next inner one where every operand
     * is contiguous across the pair. */
    int m = 0;
    for (int d = 0; d < n; d++) {
        if (m > 0) {
            int mergeable = 1;
            for (int op = 0; op < nop; op++) {
                /* stride * shape may pass int64 where (shape - 1) * stride did not: then no merge */
                int64_t whole;
                mergeable &= ampc_size_mul(loop->strides[op][d], loop->shape[d], &whole) == 0 &&
                             loop->strides[op][m - 1] == whole;
            }
            if (mergeable) {
                loop->shape[m - 1] *= loop->shape[d];
                for (int op = 0; op < nop; op++)
                    loop->strides[op][m - 1] = loop->strides[op][d];
                continue;
            }
        }
        loop->shape[m] = loop->shape[d];
        for (int op = 0; op < nop; op++)
            loop->strides[op][m] = loop->strides[op][d];
        m++;
    }
    loop->ndim = m;
}

static void cursor_locate(const ampc_loop *loop, ampc_cursor *c)
{
    for (int op = 0; op < loop->nop; op++) {
        char *p = loop->data[op];
        for (int d = 0; d < loop->ndim; d++)
            p += c->index[d] * loop->strides[op][d];
        c->ptrs[op] = p;
    }
}

int64_t ampc_cursor_seek(const ampc_loop *loop, ampc_cursor *c, int64_t pos)
{
    if (loop->ndim == 0) {
        for (int op = 0; op < loop->nop; op++)
            c->ptrs[op] = loop->data[op];
        return 1 - pos;
    }
    for (int d = loop->ndim - 1; d >= 0; d--) {
        c->index[d] = pos % loop->shape[d];
        pos /= loop->shape[d];
    }
    cursor_locate(loop, c);
    const int inner = loop->ndim - 1;
    return loop->shape[inner] - c->index[inner];
}

int64_t ampc_cursor_step(const ampc_loop *loop, ampc_cursor *c, int64_t count)
{
    if (loop->ndim == 0)
        return 0;
    const int inner = loop->ndim - 1;
    c->index[inner] += count;
    if (c->index[inner] < loop->shape[inner]) {
        for (int op = 0; op < loop->nop; op++)
            c->ptrs[op] += count * loop->strides[op][inner];
        return loop->shape[inner] - c->index[inner];
    }
    /* End of the run: carry into the outer dimensions. */
    c->index[inner] = 0;
    int d = inner - 1;
    for (; d >= 0; d--) {
        if (++c->index[d] < loop->shape[d])
            break;
        c->index[d] = 0;
    }
    if (d < 0)
        return 0;
    cursor_locate(loop, c);
    return loop->shape[inner];
}
