/*
 * gemm.c: ampc_gemm (op_descriptors.h) on cuBLASLt: d = alpha * op(a) @ op(b) + beta * c
 * + bias, row-major, batched, accumulating in float32 (float64 for float64
 * data; no TF32, as torch's default allow_tf32=False for matmul).
 *
 * cuBLASLt is column-major. A row-major m x n matrix is the column-major
 * n x m matrix with the same leading dimension, so D^T = op(B)^T op(A)^T
 * is computed: b's storage is cuBLASLt's A, a's is its B.
 *
 * Plans: for each shape, layout, dtype and operand alignment, the
 * descriptors and cuBLASLt's heuristic's first CANDIDATES algorithms are
 * made once and kept; the plan's first call times them and keeps the
 * fastest (what torch.backends.cudnn.benchmark does for cuDNN; with
 * AMPC_GEMM_TUNING=0 the heuristic's first, untimed, as torch's cuBLASLt
 * calls take it); a call then sets the bias pointer and enqueues.
 * linear's backward takes its bias gradient from the weight gradient's
 * product (the BGRADB epilogue) where cuBLASLt has an algorithm for it. The handle is one per
 * device; the workspace comes from ampc's pool on the call's stream.
 */
#include "common.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cublasLt.h>
#include "plan_cache.h"

/* Defined in memory.c. */
int ampc_cuda_alloc(int device, size_t nbytes, void *stream, void **ptr);
int ampc_cuda_free(int device, void *ptr, size_t nbytes, void *stream);

#define MAX_DEVICES 64
#define WORKSPACE_LIMIT ((size_t)32 << 20)  /* what torch gives cuBLASLt on Hopper */

typedef struct {
    int device;
    int64_t m, n, k, batch;
    int64_t lda, ldb, ldc, ldd;
    int64_t stride_a, stride_b, stride_c, stride_d;
    int trans_a, trans_b;
    int ab_dtype, d_dtype, has_c, has_bias, has_bias_grad;
    uint32_t align[4];                      /* a, b, c, d: bytes, at most 256 */
} plan_key;

#define CANDIDATES 4     /* heuristic algorithms timed on a plan's first call */
#define TIMED_RUNS 3

typedef struct {
    plan_key key;  /* first: the plan cache finds it there */
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t layout_a, layout_b, layout_c, layout_d;
    cublasLtMatmulAlgo_t algo;
    size_t workspace;
    cublasLtMatmulHeuristicResult_t candidates[CANDIDATES];
    int ncandidates, tuned;
} plan;

_Static_assert(offsetof(plan, key) == 0, "plan_cache.c reads a plan's key at its start");

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static cublasLtHandle_t handles[MAX_DEVICES];

static int lt_fail(cublasStatus_t status, const char *what)
{
    return ampc_cuda_fail_msg(status == CUBLAS_STATUS_ALLOC_FAILED ? AMPC_ERR_OUT_OF_MEMORY : AMPC_ERR_DEVICE,
                              "%s: %s", what, cublasLtGetStatusString(status));
}

#define LT_TRY(call, what)                          \
    do {                                            \
        const cublasStatus_t st_ = (call);          \
        if (st_ != CUBLAS_STATUS_SUCCESS)           \
            return lt_fail(st_, (what));            \
    } while (0)

static cudaDataType_t cuda_type(int dtype)
{
    switch (dtype) {
    case AMPC_FLOAT16: return CUDA_R_16F;
    case AMPC_BFLOAT16: return CUDA_R_16BF;
    case AMPC_FLOAT64: return CUDA_R_64F;
    default: return CUDA_R_32F;
    }
}

static uint32_t alignment(const void *p)
{
    const uintptr_t a = (uintptr_t)p;
    uint32_t align = 256;
    while (align > 1 && a % align != 0)
        align /= 2;
    return align;
}

/* The plan's descriptors (plan_cache.c frees the plan). */
static void plan_destroy(void *kept)
{
    plan *p = (plan *)kept;
    if (p->layout_a)
        cublasLtMatrixLayoutDestroy(p->layout_a);
    if (p->layout_b)
        cublasLtMatrixLayoutDestroy(p->layout_b);
    if (p->layout_c)
        cublasLtMatrixLayoutDestroy(p->layout_c);
    if (p->layout_d)
        cublasLtMatrixLayoutDestroy(p->layout_d);
    if (p->desc)
        cublasLtMatmulDescDestroy(p->desc);
}

/* The plans kept, under the lock. */
static ampc_plan_cache plans = {
    .plan_size = sizeof(plan),
    .key_size = sizeof(plan_key),
    .what = "a cuBLASLt plan",
    .destroy = plan_destroy,
};

/* A column-major rows x cols layout, batched. */
static int make_layout(cublasLtMatrixLayout_t *layout, int dtype, int64_t rows, int64_t cols, int64_t ld,
                       int64_t batch, int64_t stride)
{
    LT_TRY(cublasLtMatrixLayoutCreate(layout, cuda_type(dtype), (uint64_t)rows, (uint64_t)cols, ld),
           "cublasLtMatrixLayoutCreate");
    if (batch > 1) {
        const int32_t count = (int32_t)batch;
        LT_TRY(cublasLtMatrixLayoutSetAttribute(*layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count),
               "cublasLtMatrixLayoutSetAttribute(BATCH_COUNT)");
        LT_TRY(cublasLtMatrixLayoutSetAttribute(*layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                sizeof stride),
               "cublasLtMatrixLayoutSetAttribute(STRIDED_BATCH_OFFSET)");
    }
    return AMPC_OK;
}

/* Descriptors and algorithm for k's product; p->key set by the caller. */
static int plan_build(cublasLtHandle_t handle, plan *p)
{
    const plan_key *k = &p->key;
    const int f64 = k->ab_dtype == AMPC_FLOAT64;
    LT_TRY(cublasLtMatmulDescCreate(&p->desc, f64 ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F,
                                    f64 ? CUDA_R_64F : CUDA_R_32F),
           "cublasLtMatmulDescCreate");
    const cublasOperation_t op_a = k->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  /* cuBLASLt's A is b */
    const cublasOperation_t op_b = k->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    LT_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a),
           "cublasLtMatmulDescSetAttribute(TRANSA)");
    LT_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b),
           "cublasLtMatmulDescSetAttribute(TRANSB)");
    if (k->has_bias || k->has_bias_grad) {
        /* bias_grad: the sums of op(a) over k, cuBLASLt's B (the operands are swapped) */
        const cublasLtEpilogue_t epilogue = k->has_bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_BGRADB;
        const cudaDataType_t bias_type = cuda_type(k->d_dtype);
        LT_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue),
               "cublasLtMatmulDescSetAttribute(EPILOGUE)");
        LT_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                              sizeof bias_type),
               "cublasLtMatmulDescSetAttribute(BIAS_DATA_TYPE)");
    }
    int rc;
    if ((rc = make_layout(&p->layout_a, k->ab_dtype, k->trans_b ? k->k : k->n, k->trans_b ? k->n : k->k, k->ldb,
                          k->batch, k->stride_b)) != AMPC_OK ||
        (rc = make_layout(&p->layout_b, k->ab_dtype, k->trans_a ? k->m : k->k, k->trans_a ? k->k : k->m, k->lda,
                          k->batch, k->stride_a)) != AMPC_OK ||
        (rc = make_layout(&p->layout_c, k->d_dtype, k->n, k->m, k->has_c ? k->ldc : k->ldd, k->batch,
                          k->has_c ? k->stride_c : k->stride_d)) != AMPC_OK ||
        (rc = make_layout(&p->layout_d, k->d_dtype, k->n, k->m, k->ldd, k->batch, k->stride_d)) != AMPC_OK)
        return rc;

    cublasLtMatmulPreference_t pref;
    LT_TRY(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
    const size_t limit = WORKSPACE_LIMIT;
    /* cuBLASLt's A is b, its B is a */
    const uint32_t align[4] = {k->align[1], k->align[0], k->align[2], k->align[3]};
    const cublasLtMatmulPreferenceAttributes_t which[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &limit,
                                                             sizeof limit);
    for (int i = 0; i < 4 && st == CUBLAS_STATUS_SUCCESS; i++)
        st = cublasLtMatmulPreferenceSetAttribute(pref, which[i], &align[i], sizeof align[i]);
    int found = 0;
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulAlgoGetHeuristic(handle, p->desc, p->layout_a, p->layout_b, p->layout_c, p->layout_d, pref,
                                            CANDIDATES, p->candidates, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st == CUBLAS_STATUS_NOT_SUPPORTED && k->has_bias_grad)
        return ampc_cuda_fail_msg(AMPC_ERR_UNSUPPORTED, "cuBLASLt has no bias gradient epilogue for this product");
    if (st != CUBLAS_STATUS_SUCCESS)
        return lt_fail(st, "cublasLtMatmulAlgoGetHeuristic");
    if (found == 0)
        return ampc_cuda_fail_msg(k->has_bias_grad ? AMPC_ERR_UNSUPPORTED : AMPC_ERR_DEVICE,
                                  "cuBLASLt has no algorithm for a %lldx%lldx%lld product (batch %lld) of these "
                                  "dtypes and layouts%s", (long long)k->m, (long long)k->n, (long long)k->k,
                                  (long long)k->batch, k->has_bias_grad ? " with the bias gradient" : "");
    p->ncandidates = found;
    p->algo = p->candidates[0].algo;  /* the heuristic's first, until timed */
    p->workspace = p->candidates[0].workspaceSize;
    return AMPC_OK;
}

static int build(void *kept, void *handle)
{
    return plan_build(*(const cublasLtHandle_t *)handle, (plan *)kept);
}

/* The plan for key (kept in the cache, or *temporary set: the caller hands
 * it to ampc_plan_done), with the lock held. */
static int plan_get(const plan_key *key, plan **out, int *temporary)
{
    const int device = key->device;
    if (handles[device] == NULL)
        LT_TRY(cublasLtCreate(&handles[device]), "cublasLtCreate");
    void *found = NULL;
    const int rc = ampc_plan_get(&plans, key, build, &handles[device], &found, temporary);
    *out = (plan *)found;
    return rc;
}

/* One cublasLtMatmul of g with the given algorithm, on stream. */
static int matmul(int device, void *stream, const ampc_gemm *g, const plan *p, const cublasLtMatmulAlgo_t *algo,
                  void *workspace, size_t workspace_size)
{
    const plan_key *key = &p->key;
    const double beta_d = key->has_c ? g->beta : 0.0;  /* no C: D is read as C, times 0 */
    const float alpha_f = (float)g->alpha, beta_f = (float)beta_d;
    const int f64 = key->ab_dtype == AMPC_FLOAT64;
    const void *alpha = f64 ? (const void *)&g->alpha : (const void *)&alpha_f;
    const void *beta = f64 ? (const void *)&beta_d : (const void *)&beta_f;
    const void *c = key->has_c ? g->c.data : g->d.data;
    LT_TRY(cublasLtMatmul(handles[device], p->desc, alpha, g->b.data, p->layout_a, g->a.data, p->layout_b, beta, c,
                          p->layout_c, g->d.data, p->layout_d, algo, workspace, workspace_size, (cudaStream_t)stream),
           "cublasLtMatmul");
    return AMPC_OK;
}

/* D (and the bias gradient) declared written for initcheck (initcheck.c),
 * element for element, gaps between rows left out. */
static void mark_written(void *stream, const ampc_gemm *g)
{
    const int64_t size = ampc_dtype_size(g->d.dtype);
    if (g->ldd != g->n && g->m > 1)  /* rows with gaps between them */
        for (int64_t b = 0; b < g->batch; b++)
            ampc_mark_written(stream, (const char *)g->d.data + b * g->stride_d * size, g->m, g->n * size,
                              g->ldd * size);
    else if (g->batch > 1 && g->stride_d != g->m * g->n)  /* matrices with gaps between them */
        ampc_mark_written(stream, g->d.data, g->batch, g->m * g->n * size, g->stride_d * size);
    else
        ampc_mark_written(stream, g->d.data, 1, g->batch * g->m * g->n * size, 0);
    if (g->bias_grad.data != NULL)
        ampc_mark_written(stream, g->bias_grad.data, 1, g->m * ampc_dtype_size(g->bias_grad.dtype), 0);
}

typedef struct {
    int device;
    void *stream;
    const ampc_gemm *g;
    const plan *p;
    void *ws;
} trial;

static int launch_candidate(const void *ctx, int i)
{
    const trial *t = (const trial *)ctx;
    return matmul(t->device, t->stream, t->g, t->p, &t->p->candidates[i].algo, t->ws,
                  t->p->candidates[i].workspaceSize);
}

/* AMPC_GEMM_TUNING=0 leaves a plan untimed: no first call waits for the
 * GPU, and compute-sanitizer's racecheck and initcheck runs (run_on_gpu.sh)
 * instrument one product a call rather than thirteen. Read as each plan is
 * first called, which keeps its choice after. */
static int tuning_wanted(void)
{
    const char *env = getenv("AMPC_GEMM_TUNING");
    return env == NULL || strcmp(env, "0") != 0;
}

/* On a kept plan's first call, time the heuristic's candidates on the
 * call's buffers (TIMED_RUNS rounds, the best of each kept) and keep the
 * fastest, as cuDNN's algorithms are (the heuristic's first choice measured
 * up to 15 % slower on the H200). Not when the product reads C: a run adds
 * to D. This call waits for the GPU; later ones only enqueue. */
static int tune(int device, void *stream, const ampc_gemm *g, plan *p)
{
    p->tuned = 1;
    if (p->ncandidates < 2 || p->key.has_c || !tuning_wanted())
        return AMPC_OK;
    size_t most = 0;
    for (int i = 0; i < p->ncandidates; i++)
        if (p->candidates[i].workspaceSize > most)
            most = p->candidates[i].workspaceSize;
    void *ws = NULL;
    int rc = most > 0 ? ampc_cuda_alloc(device, most, stream, &ws) : AMPC_OK;
    float times[CANDIDATES];
    const trial t = {device, stream, g, p, ws};
    if (rc == AMPC_OK)
        rc = ampc_cuda_time_candidates(stream, p->ncandidates, TIMED_RUNS, launch_candidate, &t, times);
    if (rc == AMPC_OK) {
        int fastest = 0;
        for (int i = 1; i < p->ncandidates; i++)
            if (times[i] < times[fastest])
                fastest = i;
        p->algo = p->candidates[fastest].algo;
        p->workspace = p->candidates[fastest].workspaceSize;
    }
    if (ws != NULL) {
        const int freed = ampc_cuda_free(device, ws, most, stream);
        if (rc == AMPC_OK)
            rc = freed;
    }
    return rc;
}

static int gemm_locked(int device, void *stream, const ampc_gemm *g, const plan_key *key)
{
    plan *p = NULL;
    int temporary = 0;
    int rc = plan_get(key, &p, &temporary);
    if (rc != AMPC_OK)
        return rc;
    if (key->has_bias || key->has_bias_grad) {
        const void *const *pointer = key->has_bias ? (const void *const *)&g->bias.data
                                                   : (const void *const *)&g->bias_grad.data;
        const cublasStatus_t st = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                                 pointer, sizeof *pointer);
        if (st != CUBLAS_STATUS_SUCCESS)
            rc = lt_fail(st, "cublasLtMatmulDescSetAttribute(BIAS_POINTER)");
    }
    if (rc == AMPC_OK && !p->tuned && !temporary)
        rc = tune(device, stream, g, p);
    void *workspace = NULL;
    if (rc == AMPC_OK && p->workspace > 0)
        rc = ampc_cuda_alloc(device, p->workspace, stream, &workspace);
    if (rc == AMPC_OK)
        rc = matmul(device, stream, g, p, &p->algo, workspace, p->workspace);
    if (rc == AMPC_OK)
        mark_written(stream, g);
    if (workspace != NULL) {
        const int freed = ampc_cuda_free(device, workspace, p->workspace, stream);
        if (rc == AMPC_OK)
            rc = freed;
    }
    ampc_plan_done(&plans, p, temporary);
    return rc;
}

static int gemm_planned(int device, void *stream, const ampc_gemm *g)
{
    plan_key key;
    memset(&key, 0, sizeof key);  /* padding too: keys are compared as bytes */
    key.device = device;
    key.m = g->m, key.n = g->n, key.k = g->k, key.batch = g->batch;
    key.lda = g->lda, key.ldb = g->ldb, key.ldd = g->ldd;
    key.stride_a = g->stride_a, key.stride_b = g->stride_b, key.stride_d = g->stride_d;
    key.trans_a = g->trans_a, key.trans_b = g->trans_b;
    key.ab_dtype = g->a.dtype, key.d_dtype = g->d.dtype;
    key.has_c = g->c.data != NULL && g->beta != 0.0;
    key.has_bias = g->bias.data != NULL;
    key.has_bias_grad = g->bias_grad.data != NULL;
    if (key.has_c) {
        key.ldc = g->ldc;
        key.stride_c = g->stride_c;
    }
    key.align[0] = alignment(g->a.data);
    key.align[1] = alignment(g->b.data);
    key.align[2] = alignment(key.has_c ? g->c.data : g->d.data);
    key.align[3] = alignment(g->d.data);
    ampc_device_guard guard;
    int rc = ampc_device_enter(device, &guard);
    if (rc != AMPC_OK)
        return rc;
    pthread_mutex_lock(&lock);
    rc = gemm_locked(device, stream, g, &key);
    pthread_mutex_unlock(&lock);
    ampc_device_leave(&guard);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Matrices off 16-byte vectors                                              */
/* ------------------------------------------------------------------------ */

/* cuBLASLt's fast kernels move 16-byte vectors along a matrix's contiguous
 * dimension, and take a matrix only when that dimension's extent and its
 * leading dimension are whole vectors: GPT-2's 50257-word vocabulary in 16
 * bits gets kernels that move an element at a time, 3-4x slower (torch's
 * too). A large single product copies such operands into scratch padded
 * with zeros to whole vectors (zeros along k add nothing), runs there, and
 * copies the output's m x n (and the bias gradient's m) out: passes over
 * the matrices against k multiply-adds an output element. */
#define REALIGN_MIN_MACS ((int64_t)1 << 30)
#define VECTOR_ELEMENTS 8  /* 16 bytes of 16-bit values */

typedef struct {
    const void *data;
    int64_t rows, cols, ld;  /* as stored: row-major rows x cols, ld elements apart */
    size_t size;
} stored;

static int64_t whole_vectors(int64_t n)
{
    return (n + VECTOR_ELEMENTS - 1) / VECTOR_ELEMENTS * VECTOR_ELEMENTS;
}

/* The product's padded sizes: m where a is stored transposed (m is then
 * its contiguous extent), n (d's, and b's unless transposed), k where a or
 * b runs along it. */
typedef struct {
    int64_t m, n, k;
} sizes;

static sizes padded_sizes(const ampc_gemm *g)
{
    return (sizes){g->trans_a ? whole_vectors(g->m) : g->m, whole_vectors(g->n),
                   !g->trans_a || g->trans_b ? whole_vectors(g->k) : g->k};
}

static int off_vectors(const stored *m)
{
    return ((size_t)m->ld * m->size) % 16 != 0;
}

static int realign_worth_it(const ampc_gemm *g, const stored *mats)
{
    int64_t macs;  /* m * n * k, checked: past int64 it is certainly worth it */
    const int big = __builtin_mul_overflow(g->m, g->n, &macs) || __builtin_mul_overflow(macs, g->k, &macs) ||
                    macs >= REALIGN_MIN_MACS;
    if (mats[0].size != 2 || g->batch != 1 || g->c.data != NULL || !big)
        return 0;
    const sizes p = padded_sizes(g);
    return p.m != g->m || p.n != g->n || p.k != g->k || off_vectors(&mats[0]) || off_vectors(&mats[1]) ||
           off_vectors(&mats[2]);
}

/* *out: scratch of rows x cols (ld cols) holding m, zeros around it. */
static int pad_copy(int device, void *stream, const stored *m, int64_t rows, int64_t cols, void **out,
                    size_t *nbytes)
{
    const size_t row_bytes = (size_t)cols * m->size;
    *nbytes = (size_t)rows * row_bytes;
    *out = NULL;
    int rc = ampc_cuda_alloc(device, *nbytes, stream, out);
    if (rc != AMPC_OK)
        return rc;
    char *dst = (char *)*out;
    const cudaStream_t s = (cudaStream_t)stream;
    AMPC_CUDA_TRY(cudaMemcpy2DAsync(dst, row_bytes, m->data, (size_t)m->ld * m->size, (size_t)m->cols * m->size,
                                    (size_t)m->rows, cudaMemcpyDeviceToDevice, s),
                  "cudaMemcpy2DAsync (padding a matrix)");
    if (cols > m->cols)
        AMPC_CUDA_TRY(cudaMemset2DAsync(dst + (size_t)m->cols * m->size, row_bytes, 0,
                                        (size_t)(cols - m->cols) * m->size, (size_t)m->rows, s),
                      "cudaMemset2DAsync (padding a matrix)");
    if (rows > m->rows)
        AMPC_CUDA_TRY(cudaMemsetAsync(dst + (size_t)m->rows * row_bytes, 0, (size_t)(rows - m->rows) * row_bytes, s),
                      "cudaMemsetAsync (padding a matrix)");
    return AMPC_OK;
}

enum { PAD_A, PAD_B, PAD_D, PAD_BIAS, PAD_BIAS_GRAD, PADS };

typedef struct {
    void *ptr[PADS];
    size_t nbytes[PADS];
} pads;

/* An operand as the padded product reads it: itself where it already
 * is whole vectors, else a padded copy in scratch slot i. */
static int operand(int device, void *stream, const stored *m, int64_t rows, int64_t cols, void **data,
                   int64_t *ld, pads *scratch, int i)
{
    if (rows == m->rows && cols == m->cols && !off_vectors(m))
        return AMPC_OK;
    *ld = cols;
    const int rc = pad_copy(device, stream, m, rows, cols, &scratch->ptr[i], &scratch->nbytes[i]);
    *data = scratch->ptr[i];
    return rc;
}

static int realigned_into(int device, void *stream, const ampc_gemm *g, const stored *mats, pads *scratch)
{
    const sizes p = padded_sizes(g);
    ampc_gemm padded = *g;
    padded.m = p.m, padded.n = p.n, padded.k = p.k;
    const int64_t a_rows = g->trans_a ? p.k : p.m, a_cols = g->trans_a ? p.m : p.k;
    const int64_t b_rows = g->trans_b ? p.n : p.k, b_cols = g->trans_b ? p.k : p.n;
    int rc = operand(device, stream, &mats[0], a_rows, a_cols, &padded.a.data, &padded.lda, scratch, PAD_A);
    if (rc == AMPC_OK)
        rc = operand(device, stream, &mats[1], b_rows, b_cols, &padded.b.data, &padded.ldb, scratch, PAD_B);
    const int d_direct = p.m == g->m && p.n == g->n && !off_vectors(&mats[2]);
    if (rc == AMPC_OK && !d_direct) {
        scratch->nbytes[PAD_D] = (size_t)(p.m * p.n) * mats[2].size;
        rc = ampc_cuda_alloc(device, scratch->nbytes[PAD_D], stream, &scratch->ptr[PAD_D]);
        padded.d.data = scratch->ptr[PAD_D], padded.ldd = p.n;
    }
    if (rc == AMPC_OK && g->bias.data != NULL && p.n != g->n) {
        const stored bias = {g->bias.data, 1, g->n, g->n, mats[2].size};
        rc = pad_copy(device, stream, &bias, 1, p.n, &scratch->ptr[PAD_BIAS], &scratch->nbytes[PAD_BIAS]);
        padded.bias.data = scratch->ptr[PAD_BIAS];
    }
    /* the bias gradient has the padded m's sums (zeros past m) */
    const size_t bias_grad_bytes = (size_t)g->m * mats[2].size;
    if (rc == AMPC_OK && g->bias_grad.data != NULL && p.m != g->m) {
        scratch->nbytes[PAD_BIAS_GRAD] = (size_t)p.m * mats[2].size;
        rc = ampc_cuda_alloc(device, scratch->nbytes[PAD_BIAS_GRAD], stream, &scratch->ptr[PAD_BIAS_GRAD]);
        padded.bias_grad.data = scratch->ptr[PAD_BIAS_GRAD];
    }
    if (rc != AMPC_OK)
        return rc;
    padded.stride_a = padded.stride_b = padded.stride_d = 0;  /* one product */
    rc = gemm_planned(device, stream, &padded);
    if (rc == AMPC_OK && !d_direct)
        AMPC_CUDA_TRY(cudaMemcpy2DAsync(g->d.data, (size_t)g->ldd * mats[2].size, scratch->ptr[PAD_D],
                                        (size_t)p.n * mats[2].size, (size_t)g->n * mats[2].size, (size_t)g->m,
                                        cudaMemcpyDeviceToDevice, (cudaStream_t)stream),
                      "cudaMemcpy2DAsync (the padded product's output)");
    if (rc == AMPC_OK && scratch->ptr[PAD_BIAS_GRAD] != NULL)
        AMPC_CUDA_TRY(cudaMemcpyAsync(g->bias_grad.data, scratch->ptr[PAD_BIAS_GRAD], bias_grad_bytes,
                                      cudaMemcpyDeviceToDevice, (cudaStream_t)stream),
                      "cudaMemcpyAsync (the padded product's bias gradient)");
    return rc;
}

static int gemm_realigned(int device, void *stream, const ampc_gemm *g, const stored *mats)
{
    ampc_device_guard guard;  /* the copies go on the device's stream */
    int rc = ampc_device_enter(device, &guard);
    if (rc != AMPC_OK)
        return rc;
    pads scratch = {{NULL}, {0}};
    rc = realigned_into(device, stream, g, mats, &scratch);
    for (int i = 0; i < PADS; i++)
        if (scratch.ptr[i] != NULL) {
            const int freed = ampc_cuda_free(device, scratch.ptr[i], scratch.nbytes[i], stream);
            if (rc == AMPC_OK)
                rc = freed;
        }
    ampc_device_leave(&guard);
    return rc;
}

int ampc_cuda_gemm(int device, void *stream, const ampc_gemm *g)
{
    if (device < 0 || device >= MAX_DEVICES)
        return ampc_cuda_fail_msg(AMPC_ERR_INVALID, "device %d is outside 0..%d", device, MAX_DEVICES - 1);
    if (g->m == 0 || g->n == 0 || g->batch == 0)
        return AMPC_OK;
    if (g->batch > INT32_MAX)
        return ampc_cuda_fail_msg(AMPC_ERR_INVALID, "a batch of %lld products is more than cuBLASLt takes",
                                  (long long)g->batch);
    if (g->bias.data != NULL && g->bias.dtype != g->d.dtype)
        return ampc_cuda_fail_msg(AMPC_ERR_INVALID, "the bias epilogue needs the output's dtype");
    if (g->bias_grad.data != NULL &&
        (g->bias_grad.dtype != g->d.dtype || g->batch != 1 || g->bias.data != NULL || g->c.data != NULL))
        return ampc_cuda_fail_msg(AMPC_ERR_INVALID, "the bias gradient epilogue takes one product of the output's "
                                  "dtype, without c or bias");
    const size_t ab_size = (size_t)ampc_dtype_size(g->a.dtype), d_size = (size_t)ampc_dtype_size(g->d.dtype);
    const stored mats[3] = {
        {g->a.data, g->trans_a ? g->k : g->m, g->trans_a ? g->m : g->k, g->lda, ab_size},
        {g->b.data, g->trans_b ? g->n : g->k, g->trans_b ? g->k : g->n, g->ldb, ab_size},
        {g->d.data, g->m, g->n, g->ldd, d_size},
    };
    if (realign_worth_it(g, mats))
        return gemm_realigned(device, stream, g, mats);
    return gemm_planned(device, stream, g);
}
