/*
 * spatial_cpu.c: the CPU kernels of the spatial ops of op_descriptors.h (the
 * convolution's columns, batch norm, pooling). The arithmetic is in
 * spatial_real.inc, compiled once per compute type; the load and store
 * helpers are ops_cpu_io.h's.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/fpenv.h"
#include "cpu/cpu_kernels.h"
#include "cpu/ops_cpu_io.h"
#include "cpu/parallel.h"

#define REAL float
#define F(name) name##_f
#define ACC_DTYPE AMPC_FLOAT32
#define SQRT sqrtf
#include "cpu/spatial_real.inc"
#undef REAL
#undef F
#undef ACC_DTYPE
#undef SQRT

#define REAL double
#define F(name) name##_d
#define ACC_DTYPE AMPC_FLOAT64
#define SQRT sqrt
#include "cpu/spatial_real.inc"

int ampc_cpu_im2col(const ampc_conv *cv, int64_t n0, int64_t images, void *col, const int64_t col_strides[3])
{
    return cv->x.dtype == AMPC_FLOAT64 ? im2col_d(cv, n0, images, col, col_strides)
                                       : im2col_f(cv, n0, images, col, col_strides);
}

int ampc_cpu_col2im(const ampc_conv *cv, int64_t n0, int64_t images, const void *col, const int64_t col_strides[3])
{
    return cv->x.dtype == AMPC_FLOAT64 ? col2im_d(cv, n0, images, col, col_strides)
                                       : col2im_f(cv, n0, images, col, col_strides);
}

int ampc_cpu_batch_norm(const ampc_batch_norm *b)
{
    if (b->c == 0)
        return 0;
    return b->x.dtype == AMPC_FLOAT64 ? batch_norm_d(b) : batch_norm_f(b);
}

int ampc_cpu_batch_norm_backward(const ampc_batch_norm_backward *b)
{
    if (b->c == 0)
        return 0;
    return b->x.dtype == AMPC_FLOAT64 ? batch_norm_backward_d(b) : batch_norm_backward_f(b);
}

int ampc_cpu_pool(const ampc_pool *p)
{
    if (p->planes * p->p * p->q == 0)
        return 0;
    return p->x.dtype == AMPC_FLOAT64 ? pool_d(p) : pool_f(p);
}

int ampc_cpu_pool_backward(const ampc_pool_backward *p)
{
    if (p->pool.planes * p->pool.h * p->pool.w == 0)
        return 0;
    return p->pool.x.dtype == AMPC_FLOAT64 ? pool_backward_d(p) : pool_backward_f(p);
}
