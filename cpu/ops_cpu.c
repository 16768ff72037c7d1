/*
 * ops_cpu.c: the CPU kernels of op_descriptors.h.
 *
 * Each kernel streams its operands through small buffers of the compute
 * type (float, or double for float64 data): a run of float16 or bfloat16 is
 * converted with the SIMD cast kernels (cast_cpu.h), computed on in float
 * and rounded once on the way out. A float32 operand in place is read (and a
 * float32 output written) directly. The arithmetic is in ops_real.inc,
 * compiled once per compute type.
 *
 * Work is cut into items that do not depend on the thread count, and every
 * sum across items is taken in item order, so results are the same bits on
 * 1 or 64 threads.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/fpenv.h"
#include "cpu/cpu_kernels.h"
#include "cpu/cast_cpu.h"
#include "cpu/ops_cpu_io.h"
#include "cpu/parallel.h"
#include "cpu/vector_math.h"


#define REAL float
#define F(name) name##_f
#define ACC_DTYPE AMPC_FLOAT32
#define ERFC ampc_erfcf  /* vector_math.h, as EXP */
#define ERFC_ROWS ampc_erfcf_rows  /* the same in stages over a run */
#define EXP ampc_expf  /* vector_math.h: loops calling it vectorise, as loops calling expf do not */
#define LOG ampc_logf  /* vector_math.h, as EXP */
#define LOG1P ampc_log1pf
#define TANH ampc_tanhf  /* vector_math.h, as EXP */
#define POW powf
#define SQRT sqrtf
#define FABS fabsf
#include "cpu/ops_real.inc"

/* The float kernels again for AVX2 (8 lanes against SSE2's 4): the same
 * operations in the same order, so the same bits; chosen where the CPU has
 * AVX2 and AMPC_CPU_ISA does not force the portable set. */
#if defined(__x86_64__) && defined(__GNUC__)
#define AMPC_OPS_AVX2 1
#pragma GCC push_options
#pragma GCC target("avx2")
#undef F
#define F(name) name##_f_avx2
#undef VEC_BYTES
#define VEC_BYTES 32  /* real_sums.inc's lanes in half as many vectors: the same lanes, the same bits */
#include "cpu/ops_real.inc"
#undef VEC_BYTES
#define VEC_BYTES 16
#pragma GCC pop_options

/* And for AVX-512 (16 lanes), the same operations again, so the same bits:
 * the elementwise loops twice as wide as AVX2's (512 x 2048 float32, one
 * thread: e^x 0.85 -> 0.57 ms, sigmoid 0.92 -> 0.63, softmax 1.02 -> 0.84);
 * real_sums.inc's 16 lanes are one vector. */
#define AMPC_OPS_AVX512 1
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq")
#undef F
#define F(name) name##_f_avx512
#undef VEC_BYTES
#define VEC_BYTES 64
#include "cpu/ops_real.inc"
#undef VEC_BYTES
#define VEC_BYTES 16
#pragma GCC pop_options
#endif
#undef REAL
#undef F
#undef ACC_DTYPE
#undef ERFC
#undef ERFC_ROWS
#undef EXP
#undef LOG
#undef LOG1P
#undef TANH
#undef POW
#undef SQRT
#undef FABS

#define REAL double
#define F(name) name##_d
#define ACC_DTYPE AMPC_FLOAT64
#define ERFC erfc
#define EXP exp
#define LOG log
#define LOG1P log1p
#define TANH tanh
#define POW pow
#define SQRT sqrt
#define FABS fabs
#include "cpu/ops_real.inc"

/* ------------------------------------------------------------------------ */
/* Entry points: the compute type follows the data (float64 or the rest)    */
/* ------------------------------------------------------------------------ */

/* name's float kernel for this CPU. */
#ifdef AMPC_OPS_AVX512
#define FLOAT_KERNEL(name)                                                                                   \
    (ampc_isa_active() >= AMPC_ISA_AVX512 ? name##_f_avx512                                                 \
                                          : ampc_isa_active() >= AMPC_ISA_AVX2 ? name##_f_avx2 : name##_f)
#elif defined(AMPC_OPS_AVX2)
#define FLOAT_KERNEL(name) (ampc_isa_active() >= AMPC_ISA_AVX2 ? name##_f_avx2 : name##_f)
#else
#define FLOAT_KERNEL(name) name##_f
#endif

int ampc_cpu_elementwise(const ampc_ew *e)
{
    if (e->numel == 0)
        return 0;
    return e->out.dtype == AMPC_FLOAT64 ? elementwise_d(e) : FLOAT_KERNEL(elementwise)(e);
}

int ampc_cpu_softmax(const ampc_softmax *s)
{
    if (s->rows.outer * s->rows.n * s->rows.inner == 0)
        return 0;
    return s->x.dtype == AMPC_FLOAT64 ? run_rows_d(&s->rows, s, softmax_range_d)
                                      : FLOAT_KERNEL(run_rows)(&s->rows, s, FLOAT_KERNEL(softmax_range));
}

int ampc_cpu_softmax_backward(const ampc_softmax_backward *s)
{
    if (s->rows.outer * s->rows.n * s->rows.inner == 0)
        return 0;
    return s->y.dtype == AMPC_FLOAT64 ? run_rows_d(&s->rows, s, softmax_backward_range_d)
                                      : FLOAT_KERNEL(run_rows)(&s->rows, s, FLOAT_KERNEL(softmax_backward_range));
}

int ampc_cpu_layer_norm(const ampc_layer_norm *l)
{
    if (l->rows == 0 || l->n == 0)
        return 0;
    const ampc_rows rows = {l->rows, l->n, 1};
    return l->x.dtype == AMPC_FLOAT64 ? run_rows_d(&rows, l, layer_norm_range_d)
                                      : FLOAT_KERNEL(run_rows)(&rows, l, FLOAT_KERNEL(layer_norm_range));
}

int ampc_cpu_layer_norm_backward(const ampc_layer_norm_backward *l)
{
    if (l->rows == 0 || l->n == 0)
        return 0;
    return l->x.dtype == AMPC_FLOAT64 ? layer_norm_backward_d(l) : FLOAT_KERNEL(layer_norm_backward)(l);
}

int ampc_cpu_reduce(const ampc_reduce *r)
{
    if (r->rows.outer * r->rows.inner == 0)
        return 0;
    return r->x.dtype == AMPC_FLOAT64 ? reduce_d(r) : FLOAT_KERNEL(reduce)(r);
}

int ampc_cpu_cross_entropy(const ampc_cross_entropy *c)
{
    return c->logits.dtype == AMPC_FLOAT64 ? cross_entropy_d(c) : FLOAT_KERNEL(cross_entropy)(c);
}

int ampc_cpu_cross_entropy_backward(const ampc_cross_entropy_backward *c)
{
    if (c->rows.outer * c->rows.n * c->rows.inner == 0)
        return 0;
    return c->logits.dtype == AMPC_FLOAT64 ? cross_entropy_backward_d(c) : FLOAT_KERNEL(cross_entropy_backward)(c);
}
