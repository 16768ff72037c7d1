/*
 * parallel.h: ampc's CPU threads. A small persistent pool (pthreads) that
 * splits one range of work into contiguous pieces. Plain C: callers release
 * the GIL around it.
 */
#ifndef AMPC_PARALLEL_H
#define AMPC_PARALLEL_H

#include <stdint.h>

typedef void (*ampc_range_fn)(void *ctx, int64_t begin, int64_t end);

/* Run fn over [0, n) in contiguous ranges, one per thread, each at least
 * min_per_thread long and starting at a multiple of `align`. The calling
 * thread takes a share. Runs fn(ctx, 0, n) inline when n is too small for two
 * threads, when one thread is configured, or when the pool is already busy
 * with another caller's job (so two Python threads never wait on each other). */
void ampc_parallel_for(int64_t n, int64_t min_per_thread, int64_t align,
                       ampc_range_fn fn, void *ctx);

/* Threads a job may use, the caller included. Defaults to the CPUs this
 * process may run on, or AMPC_NUM_THREADS when set. */
int ampc_get_num_threads(void);
void ampc_set_num_threads(int n);

/* For kernels that cut a list of arrays laid end to end into fixed blocks:
 * the array holding position pos, given start[k], the position of array k's
 * first element (ascending, start[0] <= pos < the total). */
static inline int64_t ampc_array_at(const int64_t *start, int64_t n, int64_t pos)
{
    int64_t lo = 0, hi = n - 1;
    while (lo < hi) {
        const int64_t mid = (lo + hi + 1) / 2;
        if (start[mid] <= pos)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

#endif /* AMPC_PARALLEL_H */
