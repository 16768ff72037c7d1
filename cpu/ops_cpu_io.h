/*
 * ops_cpu_io.h: how the CPU op kernels (ops_cpu.c, spatial_cpu.c) move
 * operands between storage and their compute type: runs of float16 and
 * bfloat16 go through the SIMD cast kernels into small buffers of float
 * (double for float64), and come back rounded once.
 */
#ifndef AMPC_OPS_CPU_IO_H
#define AMPC_OPS_CPU_IO_H

#include <string.h>

#include "cpu/cast_cpu.h"
#include "kernels/op_descriptors.h"

/* Elements per buffered run, and the least work worth a thread. */
#define OPS_BLOCK 1024
#define OPS_MIN_WORK 16384

static inline ampc_cast_contig_fn contig_cast(ampc_dtype dst, ampc_dtype src)
{
    const ampc_cast_contig_fn fn = ampc_isa_table(ampc_isa_active())->contig[dst][src];
    return fn != NULL ? fn : ampc_cast_portable.contig[dst][src];
}

/* n values of b from element `off` on, `stride` elements apart (0: one value
 * repeated), as the compute type `acc`: a pointer into b itself where it
 * already holds them densely, else `buf` filled with them. */
static inline const void *load_vals(void *buf, ampc_dtype acc, const ampc_buf *b, int64_t off, int64_t stride, int64_t n)
{
    const int64_t size = ampc_dtype_size(b->dtype), acc_size = ampc_dtype_size(acc);
    const char *src = (const char *)b->data + off * size;
    if (stride == 1 && b->dtype == acc)
        return src;
    if (stride == 1) {
        contig_cast(acc, b->dtype)(src, buf, n);
    }
    else if (stride == 0) {
        contig_cast(acc, b->dtype)(src, buf, 1);
        for (int64_t i = 1; i < n; i++)
            memcpy((char *)buf + i * acc_size, buf, (size_t)acc_size);
    }
    else {
        ampc_cast_strided[acc][b->dtype](src, stride * size, buf, acc_size, n);
    }
    return buf;
}

/* One value of b as the compute type. */
static inline void load_one(void *dst, ampc_dtype acc, const ampc_buf *b, int64_t index)
{
    contig_cast(acc, b->dtype)((const char *)b->data + index * ampc_dtype_size(b->dtype), dst, 1);
}

/* Where to compute a dense run of out from element `off` on: out itself when
 * it has the compute type, else `buf`. */
static inline void *out_target(void *buf, ampc_dtype acc, const ampc_buf *out, int64_t off)
{
    return out->dtype == acc ? (char *)out->data + off * ampc_dtype_size(acc) : buf;
}

/* Write n computed values to out from element `off`, `stride` apart, rounding
 * them to out's dtype (nothing to do when they were computed in place). */
static inline void store_vals(const ampc_buf *out, int64_t off, int64_t stride, const void *vals, ampc_dtype acc, int64_t n)
{
    const int64_t size = ampc_dtype_size(out->dtype);
    char *dst = (char *)out->data + off * size;
    if (stride == 1 && (const void *)dst == vals)
        return;
    if (stride == 1)
        contig_cast(out->dtype, acc)(vals, dst, n);
    else
        ampc_cast_strided[out->dtype][acc](vals, ampc_dtype_size(acc), dst, stride * size, n);
}

#endif /* AMPC_OPS_CPU_IO_H */
