/*
 * batch_norm.c: ampc_batch_norm and ampc_batch_norm_backward (op_descriptors.h) on
 * cuDNN's batch normalisation, per channel ("spatial"): float32 statistics,
 * weights and running averages for float32 and 16-bit data, float64 for
 * float64. Training takes ampc's kernels (batch_norm_kernels.cu) where
 * they serve the layout: channels-last in whole 16-byte packs of channels,
 * dense NCHW planes of 16 elements or more; the rest takes cuDNN (its
 * persistent mode for channels-last, through the Ex calls). Where both
 * serve, training takes whichever ran faster on its shape's first call.
 *
 * cuDNN wants every per-channel operand: an absent weight is ones, an
 * absent bias zeros, a gradient nobody asked for a scratch buffer, all from
 * ampc's pool on the call's stream.
 */
#include "dnn.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Defined in elementwise.cu and batch_norm_kernels.cu (training over
 * channels-last data or NCHW planes, or AMPC_NOT_TAKEN). */
int ampc_cuda_elementwise(int device, void *stream, const ampc_ew *e);
int ampc_cuda_batch_norm_nhwc(int device, void *stream, const ampc_batch_norm *b);
int ampc_cuda_batch_norm_nhwc_backward(int device, void *stream, const ampc_batch_norm_backward *b);
int ampc_cuda_batch_norm_planes(int device, void *stream, const ampc_batch_norm *b);
int ampc_cuda_batch_norm_planes_backward(int device, void *stream, const ampc_batch_norm_backward *b);

/* cuDNN's scaling factors: double for double data, float otherwise. */
typedef struct {
    double one_d, zero_d;
    float one_f, zero_f;
} factors;

static const void *factor_one(const factors *f, int acc)
{
    return acc == AMPC_FLOAT64 ? (const void *)&f->one_d : (const void *)&f->one_f;
}

static const void *factor_zero(const factors *f, int acc)
{
    return acc == AMPC_FLOAT64 ? (const void *)&f->zero_d : (const void *)&f->zero_f;
}

static int is_nhwc(const int64_t *dims, const int64_t *strides)
{
    return dims[1] > 1 && strides[1] == 1 && strides[3] == dims[1];
}

/* Per-channel scratch for the operands a call lacks. */
typedef struct {
    void *ptr;
    size_t nbytes;
} scratch;

/* Points each absent operand (*part[i] == NULL) of the n at its own run of
 * c values of dtype acc, filled with fill[i] (1 or 0; -1: left unwritten,
 * for an output cuDNN writes and nobody reads). Present operands cost
 * nothing: no allocation, no fill. */
static int scratch_for_absent(int device, void *stream, scratch *s, int64_t c, int acc, int n, void **part[],
                              const signed char fill[])
{
    const size_t each = (size_t)c * (size_t)ampc_dtype_size(acc);
    int absent = 0;
    for (int i = 0; i < n; i++)
        absent += *part[i] == NULL;
    s->nbytes = each * (size_t)absent;
    s->ptr = NULL;
    if (absent == 0)
        return AMPC_OK;
    int rc = ampc_cuda_alloc(device, s->nbytes, stream, &s->ptr);
    char *next = (char *)s->ptr;
    for (int i = 0; i < n && rc == AMPC_OK; i++) {
        if (*part[i] != NULL)
            continue;
        if (fill[i] >= 0) {
            ampc_ew e = {.op = AMPC_EW_COPY, .scale = 1.0, .ndim = 1, .nin = 1, .numel = c, .shape = {c}};
            e.out = (ampc_buf){next, (ampc_dtype)acc};
            e.value[0] = fill[i];
            rc = ampc_cuda_elementwise(device, stream, &e);
        }
        *part[i] = next;
        next += each;
    }
    return rc;
}

static int scratch_give(int device, void *stream, const scratch *s, int rc)
{
    if (s->ptr == NULL)
        return rc;
    const int freed = ampc_cuda_free(device, s->ptr, s->nbytes, stream);
    return rc == AMPC_OK ? freed : rc;
}

/* The x and per-channel descriptors, and the mode for x's layout. */
typedef struct {
    cudnnTensorDescriptor_t x, param;
    cudnnBatchNormMode_t mode;
} bn_descs;

static int bn_descs_make(bn_descs *d, int dtype, const int64_t *dims, const int64_t *strides, int training)
{
    memset(d, 0, sizeof *d);
    int rc = ampc_dnn_tensor(&d->x, dtype, dims, strides);
    if (rc != AMPC_OK)
        return rc;
    d->mode = training && dtype != AMPC_FLOAT64 && is_nhwc(dims, strides) ? CUDNN_BATCHNORM_SPATIAL_PERSISTENT
                                                                          : CUDNN_BATCHNORM_SPATIAL;
    DNN_TRY(cudnnCreateTensorDescriptor(&d->param), "cudnnCreateTensorDescriptor");
    DNN_TRY(cudnnDeriveBNTensorDescriptor(d->param, d->x, d->mode), "cudnnDeriveBNTensorDescriptor");
    return AMPC_OK;
}

static void bn_descs_free(bn_descs *d)
{
    if (d->x)
        cudnnDestroyTensorDescriptor(d->x);
    if (d->param)
        cudnnDestroyTensorDescriptor(d->param);
}

/* cuDNN's persistent channels-last training runs its semi-persistent
 * kernels (torch's) through the Ex calls; the legacy calls in that mode ran
 * 16-20x slower than ampc's kernels (H100). The Ex calls take a workspace
 * (*workspace bytes of it for the forward or the backward), and a reserve
 * space the forward fills for the backward where the op keeps one. ampc
 * keeps no state between the two, so the legacy calls stay where cuDNN asks
 * for a reserve, in the other modes, and where a size query fails: whether
 * the Ex calls serve, never an error. */
static int ex_calls(cudnnHandle_t handle, const bn_descs *d, int backward, size_t *workspace)
{
    const cudnnBatchNormOps_t ops = CUDNN_BATCHNORM_OPS_BN;
    size_t reserve = 0;
    *workspace = 0;
    if (d->mode != CUDNN_BATCHNORM_SPATIAL_PERSISTENT ||
        cudnnGetBatchNormalizationTrainingExReserveSpaceSize(handle, d->mode, ops, NULL, d->x, &reserve) !=
            CUDNN_STATUS_SUCCESS ||
        reserve != 0)
        return 0;
    const cudnnStatus_t st =
        backward ? cudnnGetBatchNormalizationBackwardExWorkspaceSize(handle, d->mode, ops, d->x, d->x, d->x, NULL, d->x,
                                                                    d->param, NULL, workspace)
                 : cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(handle, d->mode, ops, d->x, NULL, d->x,
                                                                           d->param, NULL, workspace);
    return st == CUDNN_STATUS_SUCCESS;
}

/* Whether an Ex call's status is cuDNN refusing its arguments (checked
 * before it launches anything), so that the legacy call may run instead. */
static int ex_refused(cudnnStatus_t st)
{
    return st == CUDNN_STATUS_BAD_PARAM || st == CUDNN_STATUS_NOT_SUPPORTED;
}

static int forward(cudnnHandle_t handle, int device, void *stream, const ampc_batch_norm *b, const bn_descs *d)
{
    const int acc = b->x.dtype == AMPC_FLOAT64 ? AMPC_FLOAT64 : AMPC_FLOAT32;
    const factors f = {1.0, 0.0, 1.0f, 0.0f};
    const void *one = factor_one(&f, acc), *zero = factor_zero(&f, acc);
    /* cuDNN takes both running statistics or neither */
    const int one_running = (b->running_mean.data == NULL) != (b->running_var.data == NULL);
    void *weight = b->weight.data, *bias = b->bias.data, *rm = b->running_mean.data, *rv = b->running_var.data;
    void **parts[3] = {&weight, &bias, rm == NULL ? &rm : &rv};
    const signed char fill[3] = {1, 0, -1};
    scratch s;
    int rc = scratch_for_absent(device, stream, &s, b->c, acc, b->training && one_running ? 3 : 2, parts, fill);
    if (rc == AMPC_OK && b->training) {
        scratch ws = {NULL, 0};
        int ex = ex_calls(handle, d, 0, &ws.nbytes);
        if (ex && ws.nbytes > 0)
            rc = ampc_cuda_alloc(device, ws.nbytes, stream, &ws.ptr);
        cudnnStatus_t st = CUDNN_STATUS_NOT_SUPPORTED; /* as if refused: the legacy call, unless Ex runs */
        if (rc == AMPC_OK && ex)
            st = cudnnBatchNormalizationForwardTrainingEx(
                handle, d->mode, CUDNN_BATCHNORM_OPS_BN, one, zero, d->x, b->x.data, NULL, NULL, d->x, b->y.data,
                d->param, weight, bias, b->momentum, rm, rv, b->eps, b->save_mean.data, b->save_rstd.data, NULL,
                ws.ptr, ws.nbytes, NULL, 0);
        if (rc == AMPC_OK && ex_refused(st)) {
            ex = 0;
            st = cudnnBatchNormalizationForwardTraining(handle, d->mode, one, zero, d->x, b->x.data, d->x, b->y.data,
                                                        d->param, weight, bias, b->momentum, rm, rv, b->eps,
                                                        b->save_mean.data, b->save_rstd.data);
        }
        if (rc == AMPC_OK && st != CUDNN_STATUS_SUCCESS)
            rc = ampc_dnn_fail(st, ex ? "cudnnBatchNormalizationForwardTrainingEx"
                                      : "cudnnBatchNormalizationForwardTraining");
        rc = scratch_give(device, stream, &ws, rc);
    }
    else if (rc == AMPC_OK) {
        const cudnnStatus_t st = cudnnBatchNormalizationForwardInference(
            handle, d->mode, one, zero, d->x, b->x.data, d->x, b->y.data, d->param, weight, bias,
            b->running_mean.data, b->running_var.data, b->eps);
        if (st != CUDNN_STATUS_SUCCESS)
            rc = ampc_dnn_fail(st, "cudnnBatchNormalizationForwardInference");
    }
    return scratch_give(device, stream, &s, rc);
}

static int backward(cudnnHandle_t handle, int device, void *stream, const ampc_batch_norm_backward *b,
                    const bn_descs *d)
{
    const int acc = b->x.dtype == AMPC_FLOAT64 ? AMPC_FLOAT64 : AMPC_FLOAT32;
    const factors f = {1.0, 0.0, 1.0f, 0.0f};
    const void *one = factor_one(&f, acc), *zero = factor_zero(&f, acc);
    void *weight = b->weight.data, *dweight = b->dweight.data, *dbias = b->dbias.data;
    void **parts[3] = {&weight, &dweight, &dbias};
    const signed char fill[3] = {1, -1, -1};
    scratch s, dx_scratch = {NULL, 0};
    int rc = scratch_for_absent(device, stream, &s, b->c, acc, 3, parts, fill);
    void *dx = b->dx.data;
    if (rc == AMPC_OK && dx == NULL) {
        dx_scratch.nbytes = (size_t)(b->n * b->c * b->h * b->w) * (size_t)ampc_dtype_size(b->x.dtype);
        rc = ampc_cuda_alloc(device, dx_scratch.nbytes, stream, &dx_scratch.ptr);
        dx = dx_scratch.ptr;
    }
    scratch ws = {NULL, 0};
    int ex = rc == AMPC_OK && ex_calls(handle, d, 1, &ws.nbytes);
    if (ex && ws.nbytes > 0)
        rc = ampc_cuda_alloc(device, ws.nbytes, stream, &ws.ptr);
    cudnnStatus_t st = CUDNN_STATUS_NOT_SUPPORTED; /* as if refused: the legacy call, unless Ex runs */
    if (rc == AMPC_OK && ex)
        st = cudnnBatchNormalizationBackwardEx(handle, d->mode, CUDNN_BATCHNORM_OPS_BN, one, zero, one, zero, d->x,
                                               b->x.data, NULL, NULL, d->x, b->dy.data, NULL, NULL, d->x, dx,
                                               d->param, weight, NULL, dweight, dbias, b->eps, b->save_mean.data,
                                               b->save_rstd.data, NULL, ws.ptr, ws.nbytes, NULL, 0);
    if (rc == AMPC_OK && ex_refused(st)) {
        ex = 0;
        st = cudnnBatchNormalizationBackward(handle, d->mode, one, zero, one, zero, d->x, b->x.data, d->x, b->dy.data,
                                             d->x, dx, d->param, weight, dweight, dbias, b->eps, b->save_mean.data,
                                             b->save_rstd.data);
    }
    if (rc == AMPC_OK && st != CUDNN_STATUS_SUCCESS)
        rc = ampc_dnn_fail(st, ex ? "cudnnBatchNormalizationBackwardEx" : "cudnnBatchNormalizationBackward");
    rc = scratch_give(device, stream, &ws, rc);
    rc = scratch_give(device, stream, &dx_scratch, rc);
    return scratch_give(device, stream, &s, rc);
}

/* Return call's status, run with the device current and cuDNN's handle held. */
#define WITH_DNN(device, stream, call)                          \
    do {                                                        \
        ampc_device_guard guard_;                               \
        int rc_ = ampc_device_enter((device), &guard_);         \
        if (rc_ != AMPC_OK)                                     \
            return rc_;                                         \
        cudnnHandle_t handle;                                   \
        rc_ = ampc_dnn_enter((device), (stream), &handle);      \
        if (rc_ == AMPC_OK)                                     \
            rc_ = (call);                                       \
        ampc_dnn_leave();                                       \
        ampc_device_leave(&guard_);                             \
        return rc_;                                             \
    } while (0)

static int forward_descs(cudnnHandle_t handle, int device, void *stream, const ampc_batch_norm *b)
{
    const int64_t dims[4] = {b->n, b->c, b->h, b->w};
    bn_descs d;
    int rc = bn_descs_make(&d, b->x.dtype, dims, b->x_strides, b->training);
    if (rc == AMPC_OK)
        rc = forward(handle, device, stream, b, &d);
    bn_descs_free(&d);
    return rc;
}

static int backward_descs(cudnnHandle_t handle, int device, void *stream, const ampc_batch_norm_backward *b)
{
    const int64_t dims[4] = {b->n, b->c, b->h, b->w};
    bn_descs d;
    int rc = bn_descs_make(&d, b->x.dtype, dims, b->x_strides, 1);
    if (rc == AMPC_OK)
        rc = backward(handle, device, stream, b, &d);
    bn_descs_free(&d);
    return rc;
}

static int cudnn_forward(int device, void *stream, const ampc_batch_norm *b)
{
    WITH_DNN(device, stream, forward_descs(handle, device, stream, b));
}

static int cudnn_backward(int device, void *stream, const ampc_batch_norm_backward *b)
{
    WITH_DNN(device, stream, backward_descs(handle, device, stream, b));
}

/* ampc's kernels for the layout, or AMPC_NOT_TAKEN. */
static int own_forward(int device, void *stream, const ampc_batch_norm *b)
{
    const int rc = ampc_cuda_batch_norm_nhwc(device, stream, b);
    return rc != AMPC_NOT_TAKEN ? rc : ampc_cuda_batch_norm_planes(device, stream, b);
}

static int own_backward(int device, void *stream, const ampc_batch_norm_backward *b)
{
    const int rc = ampc_cuda_batch_norm_nhwc_backward(device, stream, b);
    return rc != AMPC_NOT_TAKEN ? rc : ampc_cuda_batch_norm_planes_backward(device, stream, b);
}

/* ------------------------------------------------------------------------ */
/* Training: ampc's kernels or cuDNN's, the faster per shape                 */
/* ------------------------------------------------------------------------ */

/* ampc's kernels are ahead of cuDNN's on most of ResNet-50's shapes, not on
 * all: cuDNN's semi-persistent channels-last backward reads dy and x once
 * where ampc's two passes read them twice, and at the 7x7 stage in float32
 * torch's call of it took 0.149-0.155 ms against ampc's 0.186 (H100). So
 * the first training call of each shape, direction and layout that ampc's
 * kernels take times both (as the convolutions' algorithms are timed: on
 * the call's own buffers, its outputs written again by the one chosen; a
 * forward's trials leave the running statistics alone) and the choice is
 * remembered. AMPC_BATCH_NORM=ampc or =cudnn forces one (the tests take
 * each). */
enum { BY_AMPC = 1, BY_CUDNN = 2 };

/* What a choice depends on (ampc's kernels want 16-byte boundaries); four
 * ints before the int64s: no padding, so keys compare as bytes. */
typedef struct {
    int device, dtype, backward, aligned;
    int64_t n, c, h, w, x_strides[4];
} bn_key;

typedef struct {
    bn_key key;
    int path;  /* 0: an empty slot */
} bn_choice;

#define BN_CHOICES 128  /* shapes remembered; past that the oldest is timed again when it comes back */
#define BN_TIMED_RUNS 3

static pthread_mutex_t choices_lock = PTHREAD_MUTEX_INITIALIZER;
static bn_choice choices[BN_CHOICES];
static int choices_next;

static bn_key key_of(int device, int dtype, int backward, const void *a, const void *b, const void *c, int64_t n,
                     int64_t ch, int64_t h, int64_t w, const int64_t *x_strides)
{
    const int aligned = ((uintptr_t)a | (uintptr_t)b | (uintptr_t)c) % 16 == 0;
    bn_key k = {device, dtype, backward, aligned, n, ch, h, w,
                {x_strides[0], x_strides[1], x_strides[2], x_strides[3]}};
    return k;
}

/* The remembered path for key, or 0. */
static int remembered(const bn_key *key)
{
    int path = 0;
    pthread_mutex_lock(&choices_lock);
    for (int i = 0; i < BN_CHOICES && path == 0; i++)
        if (choices[i].path != 0 && memcmp(&choices[i].key, key, sizeof *key) == 0)
            path = choices[i].path;
    pthread_mutex_unlock(&choices_lock);
    return path;
}

static void remember(const bn_key *key, int path)
{
    pthread_mutex_lock(&choices_lock);
    choices[choices_next] = (bn_choice){*key, path};
    choices_next = (choices_next + 1) % BN_CHOICES;
    pthread_mutex_unlock(&choices_lock);
}

/* A forced path (AMPC_BATCH_NORM), or 0. */
static int forced_path(void)
{
    const char *forced = getenv("AMPC_BATCH_NORM");
    if (forced == NULL)
        return 0;
    return strcmp(forced, "cudnn") == 0 ? BY_CUDNN : strcmp(forced, "ampc") == 0 ? BY_AMPC : 0;
}

typedef struct {
    int device;
    void *stream;
    const void *op;  /* an ampc_batch_norm or an ampc_batch_norm_backward */
    int backward;
} bn_trial;

static int launch_own(const void *ctx, int i)
{
    (void)i;
    const bn_trial *t = (const bn_trial *)ctx;
    return t->backward ? own_backward(t->device, t->stream, (const ampc_batch_norm_backward *)t->op)
                       : own_forward(t->device, t->stream, (const ampc_batch_norm *)t->op);
}

static int launch_cudnn(const void *ctx, int i)
{
    (void)i;
    const bn_trial *t = (const bn_trial *)ctx;
    return t->backward ? cudnn_backward(t->device, t->stream, (const ampc_batch_norm_backward *)t->op)
                       : cudnn_forward(t->device, t->stream, (const ampc_batch_norm *)t->op);
}

/* The path for trial's op under key: forced, remembered, or timed now
 * (BY_AMPC where ampc's kernels do not take it or cuDNN's fail on it). */
static int choose_path(const bn_key *key, const bn_trial *trial, int *path)
{
    *path = forced_path();
    if (*path == 0)
        *path = remembered(key);
    if (*path != 0)
        return AMPC_OK;
    *path = BY_AMPC;
    float own_ms = 0.0f, cudnn_ms = 0.0f;
    ampc_device_guard guard;
    int rc = ampc_device_enter(trial->device, &guard);
    if (rc != AMPC_OK)
        return rc;
    rc = ampc_cuda_time_candidates(trial->stream, 1, BN_TIMED_RUNS, launch_own, trial, &own_ms);
    if (rc == AMPC_OK &&
        ampc_cuda_time_candidates(trial->stream, 1, BN_TIMED_RUNS, launch_cudnn, trial, &cudnn_ms) == AMPC_OK &&
        cudnn_ms < own_ms)
        *path = BY_CUDNN;
    ampc_device_leave(&guard);
    if (rc == AMPC_NOT_TAKEN)  /* cuDNN's anyway */
        rc = AMPC_OK, *path = BY_CUDNN;
    if (rc == AMPC_OK)
        remember(key, *path);
    return rc;
}

int ampc_cuda_batch_norm(int device, void *stream, const ampc_batch_norm *b)
{
    if (b->n * b->c * b->h * b->w == 0)
        return AMPC_OK;
    int path = BY_AMPC;  /* eval, float64, or y over x (the trials would read what they wrote): as before */
    if (b->training && b->x.dtype != AMPC_FLOAT64 && b->y.data != b->x.data) {
        ampc_batch_norm quiet = *b;  /* the trials leave the running statistics as they were */
        quiet.running_mean.data = NULL, quiet.running_var.data = NULL;
        const bn_key key = key_of(device, b->x.dtype, 0, b->x.data, b->y.data, NULL, b->n, b->c, b->h, b->w,
                                  b->x_strides);
        const bn_trial trial = {device, stream, &quiet, 0};
        const int rc = choose_path(&key, &trial, &path);
        if (rc != AMPC_OK)
            return rc;
    }
    const int own = path == BY_AMPC ? own_forward(device, stream, b) : AMPC_NOT_TAKEN;
    return own != AMPC_NOT_TAKEN ? own : cudnn_forward(device, stream, b);
}

int ampc_cuda_batch_norm_backward(int device, void *stream, const ampc_batch_norm_backward *b)
{
    if (b->n * b->c * b->h * b->w == 0)
        return AMPC_OK;
    int path = BY_AMPC;  /* float64, no dx, or dx over dy or x (the trials would read what they wrote): as before */
    if (b->x.dtype != AMPC_FLOAT64 && b->dx.data != NULL && b->dx.data != b->dy.data && b->dx.data != b->x.data) {
        const bn_key key = key_of(device, b->x.dtype, 1, b->x.data, b->dy.data, b->dx.data, b->n, b->c, b->h, b->w,
                                  b->x_strides);
        const bn_trial trial = {device, stream, b, 1};
        const int rc = choose_path(&key, &trial, &path);
        if (rc != AMPC_OK)
            return rc;
    }
    const int own = path == BY_AMPC ? own_backward(device, stream, b) : AMPC_NOT_TAKEN;
    return own != AMPC_NOT_TAKEN ? own : cudnn_backward(device, stream, b);
}
