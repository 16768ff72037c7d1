/*
 * unscale_cpu.c: the portable unscale kernels and the CPU driver that runs
 * a list of gradients through the active instruction set's kernels on
 * ampc's threads.
 *
 * The dense gradients are cut into fixed blocks of the concatenated element
 * space (a block may span several small tensors), independent of the thread
 * count: the norm's partial sums are then added in the same order whatever
 * the threads, so it is reproducible bit for bit. Strided gradients are
 * walked on the calling thread.
 */
#include "cpu/cpu_kernels.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "cpu/cast_cpu.h"
#include "kernels/fp_formats.h"
#include "cpu/fpenv.h"
#include "cpu/parallel.h"

/* Elements per block of work: large enough that a block is worth a thread's
 * attention, small enough that millions of tiny tensors still spread out. */
#define BLOCK (1 << 16)

/* ------------------------------------------------------------------------ */
/* Portable kernels                                                          */
/* ------------------------------------------------------------------------ */

static float f32_of(const char *p, ampc_dtype dtype)
{
    uint32_t bits;
    if (dtype == AMPC_FLOAT32) {
        memcpy(&bits, p, 4);
    }
    else {
        uint16_t h;
        memcpy(&h, p, 2);
        bits = dtype == AMPC_FLOAT16 ? ampc_f16_to_f32_bits(h) : ampc_bf16_to_f32_bits(h);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static void store_f32_as(char *p, ampc_dtype dtype, float f)
{
    uint32_t bits;
    memcpy(&bits, &f, 4);
    if (dtype == AMPC_FLOAT32) {
        memcpy(p, &bits, 4);
        return;
    }
    const uint16_t h = dtype == AMPC_FLOAT16 ? ampc_f32_to_f16_bits(bits) : ampc_f32_to_bf16_bits(bits);
    memcpy(p, &h, 2);
}

#define DEFINE_PORTABLE(T, DTYPE, SIZE)                                                   \
    static int unscale_##T(char *p, int64_t n, float inv_scale, int check_only)           \
    {                                                                                     \
        int bad = 0;                                                                      \
        for (int64_t i = 0; i < n; i++) {                                                 \
            const float v = f32_of(p + i * SIZE, DTYPE);                                  \
            bad |= !isfinite(v);                                                          \
            if (!check_only)                                                              \
                store_f32_as(p + i * SIZE, DTYPE, v * inv_scale);                         \
        }                                                                                 \
        return bad;                                                                       \
    }                                                                                     \
    static double sumsq_##T(const char *p, int64_t n, float inv_scale, int *nonfinite)    \
    {                                                                                     \
        double s = 0;                                                                     \
        int bad = 0;                                                                      \
        for (int64_t i = 0; i < n; i++) {                                                 \
            const float v = f32_of(p + i * SIZE, DTYPE);                                  \
            bad |= !isfinite(v);                                                          \
            const double u = v * inv_scale;                                               \
            s += u * u;                                                                   \
        }                                                                                 \
        *nonfinite |= bad;                                                                \
        return s;                                                                         \
    }

DEFINE_PORTABLE(f32, AMPC_FLOAT32, 4)
DEFINE_PORTABLE(f16, AMPC_FLOAT16, 2)
DEFINE_PORTABLE(bf16, AMPC_BFLOAT16, 2)

/* float64 gradients unscale in float64, as torch does. */
static int unscale_f64(char *p, int64_t n, float inv_scale, int check_only)
{
    int bad = 0;
    for (int64_t i = 0; i < n; i++) {
        double v;
        memcpy(&v, p + i * 8, 8);
        bad |= !isfinite(v);
        if (!check_only) {
            v *= (double)inv_scale;
            memcpy(p + i * 8, &v, 8);
        }
    }
    return bad;
}

static double sumsq_f64(const char *p, int64_t n, float inv_scale, int *nonfinite)
{
    double s = 0;
    int bad = 0;
    for (int64_t i = 0; i < n; i++) {
        double v;
        memcpy(&v, p + i * 8, 8);
        bad |= !isfinite(v);
        v *= (double)inv_scale;
        s += v * v;
    }
    *nonfinite |= bad;
    return s;
}

const ampc_unscale_table ampc_unscale_portable = {
    {[AMPC_FLOAT32] = unscale_f32, [AMPC_FLOAT16] = unscale_f16, [AMPC_BFLOAT16] = unscale_bf16,
     [AMPC_FLOAT64] = unscale_f64},
    {[AMPC_FLOAT32] = sumsq_f32, [AMPC_FLOAT16] = sumsq_f16, [AMPC_BFLOAT16] = sumsq_bf16,
     [AMPC_FLOAT64] = sumsq_f64},
};

/* The other norms: sum of |u|^p (p = 1 or any p), or max |u| (p = inf). */
static double norm_part(const char *p, int64_t n, ampc_dtype dtype, float inv_scale, double norm_type,
                        int *nonfinite)
{
    const int64_t size = ampc_dtype_size(dtype);
    double acc = 0;
    int bad = 0;
    for (int64_t i = 0; i < n; i++) {
        double v;
        if (dtype == AMPC_FLOAT64) {
            memcpy(&v, p + i * size, 8);
            v *= (double)inv_scale;
        }
        else {
            const float f = f32_of(p + i * size, dtype);
            v = f * inv_scale;
        }
        bad |= !isfinite(v);
        const double a = fabs(v);
        if (isinf(norm_type))
            acc = a > acc || a != a ? a : acc;  /* NaN wins, as torch's max does */
        else
            acc += norm_type == 1.0 ? a : pow(a, norm_type);
    }
    *nonfinite |= bad;
    return acc;
}

/* ------------------------------------------------------------------------ */
/* The driver                                                                */
/* ------------------------------------------------------------------------ */

typedef struct {
    const ampc_grad_ref *grads;
    const int64_t *dense;     /* indices of the dense gradients */
    const int64_t *start;     /* start[k]: first element of dense[k] in the concatenation */
    int64_t ndense;
    int64_t total;
    const ampc_unscale_table *table;
    float inv_scale;
    int check_only;
    double norm_type;         /* 0: unscale; else the norm to sum */
    double *partial;          /* per block (norms) */
    int nonfinite;            /* written atomically */
} job;

static ampc_unscale_fn unscale_fn(const job *j, ampc_dtype d)
{
    return j->table->unscale[d] ? j->table->unscale[d] : ampc_unscale_portable.unscale[d];
}

static ampc_sumsq_fn sumsq_fn(const job *j, ampc_dtype d)
{
    return j->table->sumsq[d] ? j->table->sumsq[d] : ampc_unscale_portable.sumsq[d];
}

/* One run of one gradient: unscale it, or add its part of the norm. */
static double run(const job *j, char *p, int64_t n, ampc_dtype dtype, int *bad)
{
    if (j->norm_type == 0) {
        *bad |= unscale_fn(j, dtype)(p, n, j->inv_scale, j->check_only);
        return 0;
    }
    if (j->norm_type == 2.0)
        return sumsq_fn(j, dtype)(p, n, j->inv_scale, bad);
    return norm_part(p, n, dtype, j->inv_scale, j->norm_type, bad);
}

static double combine(double norm_type, double a, double b)
{
    if (isinf(norm_type))
        return a > b || a != a ? a : b;  /* NaN wins, as torch's max does */
    return a + b;
}

static void run_blocks(void *arg, int64_t first, int64_t last)
{
    job *j = arg;
    int bad = 0;
    AMPC_FPENV_ENTER();
    for (int64_t b = first; b < last; b++) {
        int64_t pos = b * BLOCK;
        const int64_t end = pos + BLOCK < j->total ? pos + BLOCK : j->total;
        int64_t k = ampc_array_at(j->start, j->ndense, pos);
        double acc = 0;
        while (pos < end) {
            const ampc_grad_ref *g = &j->grads[j->dense[k]];
            const int64_t offset = pos - j->start[k];
            const int64_t n = (g->numel - offset < end - pos) ? g->numel - offset : end - pos;
            acc = combine(j->norm_type, acc,
                          run(j, g->data + offset * ampc_dtype_size(g->dtype), n, g->dtype, &bad));
            pos += n;
            k++;
        }
        if (j->partial)
            j->partial[b] = acc;
    }
    AMPC_FPENV_LEAVE();
    if (bad)
        __atomic_store_n(&j->nonfinite, 1, __ATOMIC_RELAXED);
}

/* A strided gradient, one inner run at a time, on this thread. */
static double run_strided(job *j, const ampc_grad_ref *g)
{
    ampc_cursor c;
    double acc = 0;
    int bad = 0;
    const ampc_loop *loop = g->loop;
    const int inner = loop->ndim - 1;
    const int64_t stride = loop->ndim ? loop->strides[0][inner] : 0;
    AMPC_FPENV_ENTER();
    int64_t left = ampc_cursor_seek(loop, &c, 0);
    for (int64_t pos = 0; pos < loop->numel;) {
        /* Element by element along the run: the kernels want contiguous runs. */
        for (int64_t i = 0; i < left; i++)
            acc = combine(j->norm_type, acc, run(j, c.ptrs[0] + i * stride, 1, g->dtype, &bad));
        pos += left;
        if (pos < loop->numel)
            left = ampc_cursor_step(loop, &c, left);
    }
    AMPC_FPENV_LEAVE();
    j->nonfinite |= bad;
    return acc;
}

/* Unscale (norm_type 0) or sum the norm over the list into *result. -1 if
 * the bookkeeping could not be allocated (nothing was touched then). */
static int run_all(const ampc_grad_ref *grads, int64_t n, float inv_scale, int check_only,
                   double norm_type, int *nonfinite, double *result)
{
    job j = {.grads = grads, .inv_scale = inv_scale, .check_only = check_only, .norm_type = norm_type,
             .table = ampc_isa_unscale_table(ampc_isa_active())};
    int64_t *index = malloc(2 * (size_t)(n > 0 ? n : 1) * sizeof(int64_t));
    if (index == NULL)
        return -1;
    int64_t *start = index + n;
    for (int64_t i = 0; i < n; i++) {
        if (grads[i].numel > 0 && grads[i].loop == NULL) {
            index[j.ndense] = i;
            start[j.ndense] = j.total;
            j.ndense++;
            j.total += grads[i].numel;
        }
    }
    j.dense = index;
    j.start = start;
    const int64_t nblocks = (j.total + BLOCK - 1) / BLOCK;
    if (norm_type != 0 && nblocks > 0) {
        j.partial = malloc((size_t)nblocks * sizeof(double));
        if (j.partial == NULL) {
            free(index);
            return -1;
        }
    }
    double acc = 0;
    for (int64_t i = 0; i < n; i++)
        if (grads[i].numel > 0 && grads[i].loop != NULL)
            acc = combine(norm_type, acc, run_strided(&j, &grads[i]));
    if (nblocks > 0)
        ampc_parallel_for(nblocks, 4, 1, run_blocks, &j);
    for (int64_t b = 0; j.partial && b < nblocks; b++)
        acc = combine(norm_type, acc, j.partial[b]);
    free(j.partial);
    free(index);
    *nonfinite = j.nonfinite;
    *result = acc;
    return 0;
}

int ampc_unscale_cpu(const ampc_grad_ref *grads, int64_t n, float inv_scale, int check_only,
                     int *nonfinite)
{
    double unused;
    return run_all(grads, n, inv_scale, check_only, 0, nonfinite, &unused);
}

int ampc_grad_norm_cpu(const ampc_grad_ref *grads, int64_t n, float inv_scale, double norm_type,
                       int *nonfinite, double *norm)
{
    double acc;
    if (run_all(grads, n, inv_scale, 0, norm_type, nonfinite, &acc) < 0)
        return -1;
    *norm = isinf(norm_type) ? acc : norm_type == 1.0 ? acc : pow(acc, 1.0 / norm_type);
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Overflow counts and loss scaling                                          */
/* ------------------------------------------------------------------------ */

static int element_nonfinite(const char *p, ampc_dtype dtype)
{
    if (dtype == AMPC_FLOAT64) {
        double v;
        memcpy(&v, p, 8);
        return !isfinite(v);
    }
    return !isfinite(f32_of(p, dtype));
}

int64_t ampc_count_nonfinite_cpu(const ampc_grad_ref *g)
{
    const int64_t size = ampc_dtype_size(g->dtype);
    int64_t count = 0;
    if (g->loop == NULL) {
        for (int64_t i = 0; i < g->numel; i++)
            count += element_nonfinite(g->data + i * size, g->dtype);
        return count;
    }
    ampc_cursor c;
    const ampc_loop *loop = g->loop;
    const int64_t stride = loop->ndim ? loop->strides[0][loop->ndim - 1] : 0;
    int64_t left = ampc_cursor_seek(loop, &c, 0);
    for (int64_t pos = 0; pos < loop->numel;) {
        for (int64_t i = 0; i < left; i++)
            count += element_nonfinite(c.ptrs[0] + i * stride, g->dtype);
        pos += left;
        if (pos < loop->numel)
            left = ampc_cursor_step(loop, &c, left);
    }
    return count;
}

void ampc_scale_mul_cpu(const ampc_loop *loop, ampc_dtype dst, ampc_dtype src, float scale)
{
    if (loop->numel == 0)
        return;
    const int inner = loop->ndim - 1;
    const int64_t dstride = loop->ndim ? loop->strides[0][inner] : 0;
    const int64_t sstride = loop->ndim ? loop->strides[1][inner] : 0;
    ampc_cursor c;
    AMPC_FPENV_ENTER();
    int64_t left = ampc_cursor_seek(loop, &c, 0);
    for (int64_t pos = 0; pos < loop->numel;) {
        for (int64_t i = 0; i < left; i++) {
            const char *s = c.ptrs[1] + i * sstride;
            char *d = c.ptrs[0] + i * dstride;
            if (dst == AMPC_FLOAT64) {
                double v;
                if (src == AMPC_FLOAT64)
                    memcpy(&v, s, 8);
                else
                    v = f32_of(s, src);
                v *= (double)scale;
                memcpy(d, &v, 8);
            }
            else {
                store_f32_as(d, dst, f32_of(s, src) * scale);
            }
        }
        pos += left;
        if (pos < loop->numel)
            left = ampc_cursor_step(loop, &c, left);
    }
    AMPC_FPENV_LEAVE();
}
