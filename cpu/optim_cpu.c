/*
 * optim_cpu.c: the fused SGD and Adam(W) steps on the CPU (see optim_descriptors.h).
 *
 * The parameters are cut into fixed blocks of their concatenated elements
 * and the blocks spread over ampc's threads, as unscale_cpu.c does; each
 * element of every array is read once and written once. The element math is
 * optim_math.h's, shared with the GPU; the loops below only load and store:
 * float32 and float64 directly (the compiler vectorises them), float16 and
 * bfloat16 through float32 with fp_formats.h's rounding, as the GPU does.
 */
#include "cpu/cpu_kernels.h"
#include "kernels/optim_math.h"

#include <stdlib.h>
#include <string.h>
#include "kernels/fp_formats.h"
#include "cpu/cast_cpu.h"
#include "cpu/fpenv.h"
#include "cpu/parallel.h"

#define BLOCK (1 << 15)

/* Loads and stores of element i, memcpy'd so that any alignment is fine. */
static inline float load_f32(const char *p, int64_t i)
{
    float v;
    memcpy(&v, p + 4 * i, 4);
    return v;
}
static inline void store_f32(char *p, int64_t i, float v) { memcpy(p + 4 * i, &v, 4); }
static inline double load_f64(const char *p, int64_t i)
{
    double v;
    memcpy(&v, p + 8 * i, 8);
    return v;
}
static inline void store_f64(char *p, int64_t i, double v) { memcpy(p + 8 * i, &v, 8); }

static inline float bits_f32(uint32_t b)
{
    float v;
    memcpy(&v, &b, 4);
    return v;
}
static inline uint32_t f32_bits(float v)
{
    uint32_t b;
    memcpy(&b, &v, 4);
    return b;
}
static inline uint16_t load_u16(const char *p, int64_t i)
{
    uint16_t h;
    memcpy(&h, p + 2 * i, 2);
    return h;
}
static inline float load_f16(const char *p, int64_t i) { return bits_f32(ampc_f16_to_f32_bits(load_u16(p, i))); }
static inline float load_bf16(const char *p, int64_t i) { return bits_f32(ampc_bf16_to_f32_bits(load_u16(p, i))); }
static inline void store_f16(char *p, int64_t i, float v)
{
    const uint16_t h = ampc_f32_to_f16_bits(f32_bits(v));
    memcpy(p + 2 * i, &h, 2);
}
static inline void store_bf16(char *p, int64_t i, float v)
{
    const uint16_t h = ampc_f32_to_bf16_bits(f32_bits(v));
    memcpy(p + 2 * i, &h, 2);
}

/* sgd_run_<dtype>_<isa> and adam_run_<dtype>_<isa>: elements [begin, end)
 * of one parameter, O being the dtype's opmath type. The loops take what
 * decides their stores (momentum, amsgrad, the gradient written back) as
 * constants from the dispatch below, so that each variant is one straight
 * loop the compiler vectorises; the arrays of one parameter never overlap
 * (optim.c checks), hence restrict. */
#define ALWAYS_INLINE static inline __attribute__((always_inline))

#define DEFINE_RUNS(SUFFIX, O, LOAD, STORE, ISA, TARGET)                                              \
    ALWAYS_INLINE void sgd_loop_##SUFFIX##ISA(char *restrict param, char *restrict grad, char *restrict buf, \
                                              int64_t begin, int64_t end, const ampc_sgd_config *c,  \
                                              const float *gs, int first, const int momentum,        \
                                              const int write_grad)                                  \
    {                                                                                                \
        for (int64_t i = begin; i < end; i++) {                                                      \
            const O g = ampc_unscaled_##O(LOAD(grad, i), gs);                                        \
            if (write_grad)                                                                          \
                STORE(grad, i, g);                                                                   \
            O b = momentum ? LOAD(buf, i) : (O)0; /* zeros before the first step */                  \
            STORE(param, i, ampc_sgd_##O(LOAD(param, i), g, &b, first, c));                          \
            if (momentum)                                                                            \
                STORE(buf, i, b);                                                                    \
        }                                                                                            \
    }                                                                                                \
    TARGET static void sgd_run_##SUFFIX##ISA(const ampc_optim_ref *r, int64_t begin, int64_t end,     \
                                             const ampc_sgd_config *cfg, const float *gs)            \
    {                                                                                                \
        const ampc_sgd_config c = *cfg;                                                              \
        const int first = r->step != NULL && *r->step == 0.0f;                                       \
        char *p = r->param, *g = r->grad, *b = r->state[0];                                          \
        if (c.momentum != 0 && gs)                                                                   \
            sgd_loop_##SUFFIX##ISA(p, g, b, begin, end, &c, gs, first, 1, 1);                        \
        else if (c.momentum != 0)                                                                    \
            sgd_loop_##SUFFIX##ISA(p, g, b, begin, end, &c, NULL, first, 1, 0);                      \
        else if (gs)                                                                                 \
            sgd_loop_##SUFFIX##ISA(p, g, NULL, begin, end, &c, gs, 0, 0, 1);                         \
        else                                                                                         \
            sgd_loop_##SUFFIX##ISA(p, g, NULL, begin, end, &c, NULL, 0, 0, 0);                       \
    }                                                                                                \
    ALWAYS_INLINE void adam_loop_##SUFFIX##ISA(char *restrict param, char *restrict grad, char *restrict m_, \
                                               char *restrict v_, char *restrict vmax_, int64_t begin, \
                                               int64_t end, const ampc_adam_config *c, const float *gs, \
                                               O step_size, O bc2_sqrt, const int amsgrad,           \
                                               const int write_grad)                                 \
    {                                                                                                \
        for (int64_t i = begin; i < end; i++) {                                                      \
            const O g = ampc_unscaled_##O(LOAD(grad, i), gs);                                        \
            if (write_grad)                                                                          \
                STORE(grad, i, g);                                                                   \
            O m = LOAD(m_, i), v = LOAD(v_, i), vmax = amsgrad ? LOAD(vmax_, i) : (O)0;              \
            STORE(param, i, ampc_adam_##O(LOAD(param, i), g, &m, &v, &vmax, step_size, bc2_sqrt, c)); \
            STORE(m_, i, m);                                                                         \
            STORE(v_, i, v);                                                                         \
            if (amsgrad)                                                                             \
                STORE(vmax_, i, vmax);                                                               \
        }                                                                                            \
    }                                                                                                \
    TARGET static void adam_run_##SUFFIX##ISA(const ampc_optim_ref *r, int64_t begin, int64_t end,    \
                                              const ampc_adam_config *cfg, const float *gs)          \
    {                                                                                                \
        const ampc_adam_config c = *cfg;                                                             \
        O step_size, bc2_sqrt;                                                                       \
        ampc_adam_factors_##O(*r->step, &c, &step_size, &bc2_sqrt);                                  \
        char *p = r->param, *g = r->grad, *m = r->state[0], *v = r->state[1], *w = r->state[2];      \
        if (c.amsgrad && gs)                                                                         \
            adam_loop_##SUFFIX##ISA(p, g, m, v, w, begin, end, &c, gs, step_size, bc2_sqrt, 1, 1);   \
        else if (c.amsgrad)                                                                          \
            adam_loop_##SUFFIX##ISA(p, g, m, v, w, begin, end, &c, NULL, step_size, bc2_sqrt, 1, 0); \
        else if (gs)                                                                                 \
            adam_loop_##SUFFIX##ISA(p, g, m, v, NULL, begin, end, &c, gs, step_size, bc2_sqrt, 0, 1); \
        else                                                                                         \
            adam_loop_##SUFFIX##ISA(p, g, m, v, NULL, begin, end, &c, NULL, step_size, bc2_sqrt, 0, 0); \
    }

#define DEFINE_ISA(ISA, TARGET)                                      \
    DEFINE_RUNS(f32, float, load_f32, store_f32, ISA, TARGET)         \
    DEFINE_RUNS(f64, double, load_f64, store_f64, ISA, TARGET)        \
    DEFINE_RUNS(f16, float, load_f16, store_f16, ISA, TARGET)         \
    DEFINE_RUNS(bf16, float, load_bf16, store_bf16, ISA, TARGET)

/* The portable runs, and on x86-64 an AVX2 copy chosen at run time: twice
 * the vector width, and fma() as one instruction where the portable build
 * has to call libm's (same correctly rounded operation, same bits). */
DEFINE_ISA(_portable, )
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HAVE_AVX2_RUNS 1
DEFINE_ISA(_avx2, __attribute__((target("avx2,f16c,fma"))))
#else
#define HAVE_AVX2_RUNS 0
DEFINE_ISA(_avx2, )  /* never chosen: keeps the dispatch below one shape */
#endif

typedef void (*run_fn)(const ampc_optim_ref *r, int64_t begin, int64_t end, const void *config, const float *gs);

/* Each dtype's run for the active instruction set (AMPC_CPU_ISA or
 * _C._set_cpu_isa choose it, as for the casts). */
#define DISPATCH(KIND, r, ...)                                                                     \
    do {                                                                                           \
        const int avx2 = HAVE_AVX2_RUNS && ampc_isa_active() >= AMPC_ISA_AVX2;                     \
        switch ((r)->dtype) {                                                                      \
        case AMPC_FLOAT32: avx2 ? KIND##_f32_avx2(r, __VA_ARGS__) : KIND##_f32_portable(r, __VA_ARGS__); return; \
        case AMPC_FLOAT64: avx2 ? KIND##_f64_avx2(r, __VA_ARGS__) : KIND##_f64_portable(r, __VA_ARGS__); return; \
        case AMPC_FLOAT16: avx2 ? KIND##_f16_avx2(r, __VA_ARGS__) : KIND##_f16_portable(r, __VA_ARGS__); return; \
        default: avx2 ? KIND##_bf16_avx2(r, __VA_ARGS__) : KIND##_bf16_portable(r, __VA_ARGS__); return;        \
        }                                                                                          \
    } while (0)

static void sgd_run(const ampc_optim_ref *r, int64_t begin, int64_t end, const void *config, const float *gs)
{
    DISPATCH(sgd_run, r, begin, end, config, gs);
}

static void adam_run(const ampc_optim_ref *r, int64_t begin, int64_t end, const void *config, const float *gs)
{
    DISPATCH(adam_run, r, begin, end, config, gs);
}

/* ------------------------------------------------------------------------ */
/* Blocks over the concatenated parameters                                   */
/* ------------------------------------------------------------------------ */

typedef struct {
    const ampc_optim_ref *refs;
    int64_t n;
    const int64_t *start;       /* start[k]: first element of refs[k] in the concatenation */
    int64_t total;
    const void *config;
    run_fn run;
    const float *grad_scale;    /* NULL, or the caller's scale */
} job;

static void run_blocks(void *arg, int64_t first, int64_t last)
{
    const job *j = arg;
    AMPC_FPENV_ENTER();
    for (int64_t b = first; b < last; b++) {
        int64_t pos = b * BLOCK;
        const int64_t end = pos + BLOCK < j->total ? pos + BLOCK : j->total;
        for (int64_t k = ampc_array_at(j->start, j->n, pos); pos < end; k++) {
            const ampc_optim_ref *r = &j->refs[k];
            const int64_t offset = pos - j->start[k];
            const int64_t stop = r->numel - offset < end - pos ? r->numel : offset + (end - pos);
            if (stop > offset)
                j->run(r, offset, stop, j->config, j->grad_scale);
            pos += stop - offset;
        }
    }
    AMPC_FPENV_LEAVE();
}

static int run(const ampc_optim_ref *refs, int64_t n, const void *config, run_fn fn, const float *grad_scale)
{
    int64_t *start = malloc((size_t)(n > 0 ? n : 1) * sizeof *start);
    if (start == NULL)
        return -1;
    job j = {refs, n, start, 0, config, fn, grad_scale};
    for (int64_t k = 0; k < n; k++) {
        start[k] = j.total;
        j.total += refs[k].numel;
    }
    const int64_t nblocks = (j.total + BLOCK - 1) / BLOCK;
    if (nblocks > 0)
        ampc_parallel_for(nblocks, 2, 1, run_blocks, &j);
    free(start);
    return 0;
}

int ampc_sgd_cpu(const ampc_optim_ref *refs, int64_t n, const ampc_sgd_config *c, const float *grad_scale,
                 const float *found_inf)
{
    if (found_inf && *found_inf != 0.0f)
        return 0;
    const float scale = grad_scale ? *grad_scale : 1.0f;
    if (run(refs, n, c, sgd_run, grad_scale ? &scale : NULL) < 0)
        return -1;
    for (int64_t k = 0; k < n; k++)
        if (refs[k].step != NULL)
            *refs[k].step = 1.0f;  /* the buffers hold momenta now */
    return 1;
}

int ampc_adam_cpu(const ampc_optim_ref *refs, int64_t n, const ampc_adam_config *c, const float *grad_scale,
                  const float *found_inf)
{
    if (found_inf && *found_inf != 0.0f)
        return 0;  /* skipped: the step counts stay as they were */
    for (int64_t k = 0; k < n; k++)
        *refs[k].step += 1.0f;
    const float scale = grad_scale ? *grad_scale : 1.0f;
    if (run(refs, n, c, adam_run, grad_scale ? &scale : NULL) < 0) {
        /* Out of memory before any element changed: uncount (exact for counts below 2^24). */
        for (int64_t k = 0; k < n; k++)
            *refs[k].step -= 1.0f;
        return -1;
    }
    return 1;
}
