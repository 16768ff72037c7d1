/*
 * cast_cpu.c: the CPU cast driver. Walks an ampc_loop in inner runs, calls
 * the active table's contiguous kernel where both operands are contiguous
 * and the portable strided kernel elsewhere (and always, for an integer or
 * bool source: no op's hot path converts those), and splits large loops
 * between ampc's threads.
 */
#include "cpu/cast_cpu.h"

#include "cpu/parallel.h"

#ifdef __linux__
#include <sys/mman.h>
#include <unistd.h>
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  /* Linux 5.14 */
#endif
#endif

#include "cpu/fpenv.h"

/* Below this many elements a cast stays on one thread: waking workers costs
 * more than it saves. */
#define MIN_ELEMENTS_PER_THREAD (1 << 16)
/* Threads' ranges start on multiples of this, so no two threads write one
 * cache line (64 elements are at least 128 bytes). */
#define THREAD_ALIGN 64
/* Outputs at least this large are written with streaming stores: they will
 * not fit in the caches anyway, and streaming skips reading each destination
 * line before writing it (a quarter of the traffic of float32 -> float16).
 * Freshly allocated outputs are first populated with MADV_POPULATE_WRITE
 * (the kernel maps and zeroes all the pages in one call instead of one fault
 * per page): streaming into pages that still fault is slower than plain
 * stores, streaming into populated pages is faster than either (measured
 * with and without transparent huge pages). */
#define STREAMING_MIN_BYTES (8 << 20)

typedef struct {
    const ampc_loop *loop;
    ampc_cast_contig_fn contig;     /* NULL: the strided kernel throughout */
    ampc_cast_contig_fn streaming;  /* NULL: plain stores only */
    ampc_cast_strided_fn strided;
    int populate;                   /* fresh output: populate each range before streaming */
    int64_t dst_size, src_size;
} cast_job;

/* Map the pages under [p, p + nbytes) writable now; 1 on success. An old
 * kernel answers EINVAL, and the caller then uses plain stores. */
static int populate(char *p, int64_t nbytes)
{
#ifdef __linux__
    const long page = sysconf(_SC_PAGESIZE);
    const uintptr_t start = (uintptr_t)p & ~(uintptr_t)(page - 1);
    const uintptr_t end = ((uintptr_t)p + (uintptr_t)nbytes + (uintptr_t)page - 1) & ~(uintptr_t)(page - 1);
    return madvise((void *)start, end - start, MADV_POPULATE_WRITE) == 0;
#else
    (void)p;
    (void)nbytes;
    return 0;
#endif
}

static void cast_range(void *arg, int64_t begin, int64_t end)
{
    const cast_job *job = arg;
    const ampc_loop *loop = job->loop;
    const int inner = loop->ndim - 1;
    const int contiguous = loop->ndim == 0 || (loop->strides[0][inner] == job->dst_size &&
                                               loop->strides[1][inner] == job->src_size);
    const int64_t dst_stride = loop->ndim ? loop->strides[0][inner] : 0;
    const int64_t src_stride = loop->ndim ? loop->strides[1][inner] : 0;
    ampc_cursor cursor;
    ampc_cast_contig_fn contig = job->streaming ? job->streaming : job->contig;

    AMPC_FPENV_ENTER();
    int64_t run = ampc_cursor_seek(loop, &cursor, begin);
    /* A fresh output is dense in the loop's order: this range's bytes are contiguous. */
    if (job->populate && !populate(cursor.ptrs[0], (end - begin) * job->dst_size))
        contig = job->contig;
    for (int64_t pos = begin; pos < end;) {
        const int64_t n = run < end - pos ? run : end - pos;
        if (contiguous && contig != NULL)
            contig(cursor.ptrs[1], cursor.ptrs[0], n);
        else
            job->strided(cursor.ptrs[1], src_stride, cursor.ptrs[0], dst_stride, n);
        pos += n;
        if (pos < end)
            run = ampc_cursor_step(loop, &cursor, n);
    }
    AMPC_FPENV_LEAVE();
}

void ampc_cast_cpu(const ampc_loop *loop, ampc_dtype dst, ampc_dtype src, int fresh_output)
{
    if (loop->numel == 0)
        return;
    cast_job job = {
        .loop = loop,
        .strided = ampc_cast_strided_any(dst, src),
        .dst_size = ampc_dtype_size(dst),
        .src_size = ampc_dtype_size(src),
    };
    if (ampc_cast_portable.contig[dst][src] != NULL) {  /* two floating dtypes */
        const ampc_cast_table *table = ampc_isa_table(ampc_isa_active());
        const int large = loop->numel * ampc_dtype_size(dst) >= STREAMING_MIN_BYTES;
        job.contig = table->contig[dst][src] ? table->contig[dst][src] : ampc_cast_portable.contig[dst][src];
        job.streaming = large ? table->streaming[dst][src] : NULL;
        job.populate = large && fresh_output && table->streaming[dst][src];
    }
    ampc_parallel_for(loop->numel, MIN_ELEMENTS_PER_THREAD, THREAD_ALIGN, cast_range, &job);
}
