/*
 * layout.h: shapes and byte strides, in plain C (no Python, no CUDA).
 *
 * An elementwise op visits the same index in each of its operands. Before
 * running one, ampc builds an ampc_loop: it drops size-1 dimensions, orders
 * the rest from the largest output stride to the smallest, flips dimensions
 * that every operand walks backwards, and merges dimensions that are
 * contiguous in every operand. A C-contiguous, Fortran-ordered, transposed or
 * reversed array pair then becomes one contiguous run, which is what the SIMD
 * and CUDA kernels are written for; anything else keeps its strides.
 *
 * Strides are in bytes and may be negative or zero. Operand 0 is the output.
 */
#ifndef AMPC_KERNELS_LAYOUT_H
#define AMPC_KERNELS_LAYOUT_H

#include <stddef.h>
#include <stdint.h>
#include "kernels/dtypes.h"

#ifdef __cplusplus
extern "C" {
#endif

#define AMPC_MAX_OPERANDS 4

typedef struct {
    int nop;                      /* operands, output first */
    int ndim;                     /* after coalescing; 0 for a single element */
    int64_t numel;
    int64_t shape[AMPC_MAX_NDIM]; /* outermost first */
    int64_t strides[AMPC_MAX_OPERANDS][AMPC_MAX_NDIM];
    char *data[AMPC_MAX_OPERANDS];
} ampc_loop;

/* Size arithmetic on int64: a * b and a + b, 0 with *out set, or -1 when the
 * result does not fit (*out then meaningless). Every product or sum of
 * shapes, strides, element sizes and offsets that a caller can make large
 * goes through these (or ampc_layout_numel / ampc_layout_extent), never a
 * plain * that would wrap. */
static inline int ampc_size_mul(int64_t a, int64_t b, int64_t *out)
{
    return __builtin_mul_overflow(a, b, out) ? -1 : 0;
}

static inline int ampc_size_add(int64_t a, int64_t b, int64_t *out)
{
    return __builtin_add_overflow(a, b, out) ? -1 : 0;
}

/* Number of elements, or -1 if a dimension is negative or the product of the
 * nonzero dimensions times itemsize does not fit in int64 (NumPy's rule: a
 * zero-size array's other dimensions must still be sizes, so that strides and
 * products over any of its dimensions never wrap). */
int64_t ampc_layout_numel(int ndim, const int64_t *shape, int64_t itemsize);

/* Lowest and one-past-highest byte, relative to the element [0,...,0], that an
 * array with this layout touches: 0, or -1 (lo and hi unset) when a span or
 * their sum does not fit in int64. Not meaningful for zero-size arrays. */
int ampc_layout_extent(int ndim, const int64_t *shape, const int64_t *strides,
                       int64_t itemsize, int64_t *lo, int64_t *hi);

/* 1 if two distinct indices can share memory (zero strides, overlapping
 * strides), or if the layout's extent does not fit in int64. A sufficient test: after sorting by |stride| each dimension must
 * step over everything the inner ones span. Exotic non-overlapping layouts
 * that interleave dimensions are reported as overlapping (refused, never
 * silently wrong). */
int ampc_layout_has_internal_overlap(int ndim, const int64_t *shape, const int64_t *strides,
                                     int64_t itemsize);

/* Dimensions sorted by |stride| descending, outermost first (ties keep
 * their order, so a C-ordered array stays C-ordered). */
void ampc_layout_sort_by_stride(int ndim, const int64_t *strides, int *perm);

/* Strides of a new dense array that keeps the order of an existing one's
 * dimensions (NumPy's order='K'): dimensions sorted by |stride|, positive
 * strides. A transposed input then gets a transposed, contiguous output and
 * the cast runs as one contiguous pass. The shape must have passed
 * ampc_layout_numel with this itemsize (then no stride wraps). */
void ampc_layout_korder_strides(int ndim, const int64_t *shape, const int64_t *strides,
                                int64_t itemsize, int64_t *out_strides);

/* 1 if the layout is C-contiguous. */
int ampc_layout_is_c_contiguous(int ndim, const int64_t *shape, const int64_t *strides,
                                int64_t itemsize);

/* Build the loop for nop operands of one shape. Each operand's layout must
 * have passed ampc_layout_numel and ampc_layout_extent (every ampc_view has):
 * the offsets the loop computes then stay inside int64. */
void ampc_loop_init(ampc_loop *loop, int nop, int ndim, const int64_t *shape,
                    char *const *data, const int64_t *const *strides);

/* A position in a loop's iteration order, advanced one inner run at a time.
 * Threads each seek to the start of their share of the loop. */
typedef struct {
    int64_t index[AMPC_MAX_NDIM];
    char *ptrs[AMPC_MAX_OPERANDS];
} ampc_cursor;

/* Put the cursor at linear position `pos` (< numel); returns how many
 * elements are left in the inner run there. */
int64_t ampc_cursor_seek(const ampc_loop *loop, ampc_cursor *c, int64_t pos);

/* Move past `count` elements of the current run (no more than it has left);
 * returns the length of the run the cursor is then in, 0 past the end. */
int64_t ampc_cursor_step(const ampc_loop *loop, ampc_cursor *c, int64_t count);

#ifdef __cplusplus
}
#endif

#endif /* AMPC_KERNELS_LAYOUT_H */
