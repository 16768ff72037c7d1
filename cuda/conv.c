/*
 * conv.c: ampc_conv (op_descriptors.h) on cuDNN's convolution API: the forward, the
 * data gradient and the filter gradient, for float32, float16, bfloat16
 * and float64 data in NCHW or channels-last layouts.
 *
 * Precision: 16-bit data accumulates in float32 on Tensor Cores; float32
 * data runs in plain FMA arithmetic (no TF32: what torch gives with
 * torch.backends.cudnn.allow_tf32 = False, and what ampc's matrix products
 * do); float64 in float64.
 *
 * Algorithms: the first call of a shape, layout and dtype times cuDNN's
 * algorithms on the call's own buffers (cudnnFind...AlgorithmEx, as
 * torch.backends.cudnn.benchmark = True does), times the fastest few again
 * (FindEx's single cold run is noisy), times the graph API's engines
 * (conv_graph.c), and keeps the choice with its descriptors: the fastest,
 * a deterministic one where times tie, or the fastest deterministic one
 * where the caller asks (ampc.backends.cudnn.deterministic); out of benchmark
 * mode (ampc.backends.cudnn.benchmark = False, torch's default) the first of
 * cuDNN's heuristic ranking, untimed. torch (benchmark mode, deterministic
 * off by default) picks the fastest too; a 10 % preference for deterministic
 * algorithms cost ResNet-50's layer1 3x3 channels-last float32 backward 6 %
 * on an H100 (4.36 -> 4.10 ms, torch 3.76). That first call waits for the
 * GPU; later calls only enqueue. The workspace comes from ampc's pool on the
 * call's stream.
 */
#include "conv.h"

#include <float.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include "plan_cache.h"

/* The most an algorithm may ask while they are timed (less where less is
 * free; torch lets cuDNN ask what is free). Not 1 GiB: at that cap ResNet-50's
 * channels-last float32 1x1 stride-2 downsample (256x256x56^2 -> 512) lost
 * its fast engines (its legacy algorithm 1 alone asks 1.23 GB), and its data
 * gradient ran cuDNN's 129 ms one, half of the training step; with 4 GiB a
 * graph API engine takes 2.7 ms (H100). */
#define FIND_WORKSPACE ((size_t)4 << 30)
#define DETERMINISTIC_SLACK 1.00f  /* how much slower a deterministic algorithm may be and still be chosen */

typedef struct {
    conv_key key;  /* first: the plan cache finds it there */
    cudnnTensorDescriptor_t x, y;
    cudnnFilterDescriptor_t w;
    cudnnConvolutionDescriptor_t conv;
    int algo;
    size_t workspace;
    conv_engine engine;  /* a graph API plan, when one ran faster than the legacy algorithms */
} conv_plan;

_Static_assert(offsetof(conv_plan, key) == 0, "plan_cache.c reads a plan's key at its start");

/* The plan's descriptors (plan_cache.c frees the plan). */
static void plan_destroy(void *plan)
{
    conv_plan *p = (conv_plan *)plan;
    ampc_conv_graph_destroy(&p->engine);
    if (p->x)
        cudnnDestroyTensorDescriptor(p->x);
    if (p->y)
        cudnnDestroyTensorDescriptor(p->y);
    if (p->w)
        cudnnDestroyFilterDescriptor(p->w);
    if (p->conv)
        cudnnDestroyConvolutionDescriptor(p->conv);
}

/* The plans kept, under dnn.c's lock. */
static ampc_plan_cache plans = {
    .plan_size = sizeof(conv_plan),
    .key_size = sizeof(conv_key),
    .what = "a cuDNN plan",
    .destroy = plan_destroy,
};

static cudnnMathType_t math_type(int dtype)
{
    if (dtype == AMPC_FLOAT16 || dtype == AMPC_BFLOAT16)
        return CUDNN_TENSOR_OP_MATH;
    return dtype == AMPC_FLOAT32 ? CUDNN_FMA_MATH : CUDNN_DEFAULT_MATH;
}

static int descriptors(conv_plan *p)
{
    const conv_key *k = &p->key;
    const int64_t xd[4] = {k->n, k->c, k->h, k->w}, yd[4] = {k->n, k->k, k->p, k->q};
    int rc = ampc_dnn_tensor(&p->x, k->dtype, xd, k->x_strides);
    if (rc == AMPC_OK)
        rc = ampc_dnn_tensor(&p->y, k->dtype, yd, k->y_strides);
    if (rc != AMPC_OK)
        return rc;
    /* cuDNN's filter and convolution take ints: a stride of 2**32 + 1 would have been 1 */
    const int64_t ints[] = {k->k, k->c / k->groups, k->r, k->s, k->pad[0], k->pad[1], k->stride[0], k->stride[1],
                            k->dilation[0], k->dilation[1], k->groups};
    for (size_t i = 0; i < sizeof ints / sizeof *ints; i++)
        if (ints[i] > INT_MAX)
            return ampc_cuda_fail_msg(AMPC_ERR_INVALID, "a convolution's filter, padding, stride, dilation or groups "
                                      "of %lld is beyond cuDNN's 32-bit sizes", (long long)ints[i]);
    DNN_TRY(cudnnCreateFilterDescriptor(&p->w), "cudnnCreateFilterDescriptor");
    DNN_TRY(cudnnSetFilter4dDescriptor(p->w, ampc_dnn_type(k->dtype), k->w_nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW,
                                       (int)k->k, (int)(k->c / k->groups), (int)k->r, (int)k->s),
            "cudnnSetFilter4dDescriptor");
    DNN_TRY(cudnnCreateConvolutionDescriptor(&p->conv), "cudnnCreateConvolutionDescriptor");
    const cudnnDataType_t compute = k->dtype == AMPC_FLOAT64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
    DNN_TRY(cudnnSetConvolution2dDescriptor(p->conv, (int)k->pad[0], (int)k->pad[1], (int)k->stride[0],
                                            (int)k->stride[1], (int)k->dilation[0], (int)k->dilation[1],
                                            CUDNN_CROSS_CORRELATION, compute),
            "cudnnSetConvolution2dDescriptor");
    DNN_TRY(cudnnSetConvolutionGroupCount(p->conv, (int)k->groups), "cudnnSetConvolutionGroupCount");
    DNN_TRY(cudnnSetConvolutionMathType(p->conv, math_type(k->dtype)), "cudnnSetConvolutionMathType");
    return AMPC_OK;
}

/* One timed algorithm, whichever pass it belongs to. */
typedef struct {
    int algo;
    cudnnStatus_t status;
    float time;
    size_t memory;
    int deterministic;
    cudnnMathType_t math;
} timing;

#define MAX_ALGOS 16

#define COPY_TIMINGS(perf, n, out)                                         \
    for (int i_ = 0; i_ < (n); i_++) {                                     \
        (out)[i_].algo = (int)(perf)[i_].algo;                             \
        (out)[i_].status = (perf)[i_].status;                              \
        (out)[i_].time = (perf)[i_].time;                                  \
        (out)[i_].memory = (perf)[i_].memory;                              \
        (out)[i_].deterministic = (perf)[i_].determinism == CUDNN_DETERMINISTIC; \
        (out)[i_].math = (perf)[i_].mathType;                              \
    }

/* Time the pass's algorithms on the call's buffers (their outputs are
 * overwritten by the real call that follows). */
static int find(cudnnHandle_t handle, const conv_plan *p, const ampc_conv *c, void *ws, size_t ws_size, timing *t,
                int *count)
{
    const conv_key *k = &p->key;
    if (k->pass == AMPC_CONV_FORWARD) {
        cudnnConvolutionFwdAlgoPerf_t perf[MAX_ALGOS];
        DNN_TRY(cudnnFindConvolutionForwardAlgorithmEx(handle, p->x, c->x.data, p->w, c->weight.data, p->conv, p->y,
                                                       c->y.data, MAX_ALGOS, count, perf, ws, ws_size),
                "cudnnFindConvolutionForwardAlgorithmEx");
        COPY_TIMINGS(perf, *count, t);
    }
    else if (k->pass == AMPC_CONV_BACKWARD_DATA) {
        cudnnConvolutionBwdDataAlgoPerf_t perf[MAX_ALGOS];
        DNN_TRY(cudnnFindConvolutionBackwardDataAlgorithmEx(handle, p->w, c->weight.data, p->y, c->y.data, p->conv,
                                                            p->x, c->x.data, MAX_ALGOS, count, perf, ws, ws_size),
                "cudnnFindConvolutionBackwardDataAlgorithmEx");
        COPY_TIMINGS(perf, *count, t);
    }
    else {
        cudnnConvolutionBwdFilterAlgoPerf_t perf[MAX_ALGOS];
        DNN_TRY(cudnnFindConvolutionBackwardFilterAlgorithmEx(handle, p->x, c->x.data, p->y, c->y.data, p->conv,
                                                              p->w, c->weight.data, MAX_ALGOS, count, perf, ws,
                                                              ws_size),
                "cudnnFindConvolutionBackwardFilterAlgorithmEx");
        COPY_TIMINGS(perf, *count, t);
    }
    return AMPC_OK;
}

/* cuDNN's heuristic ranking of the pass's algorithms, untimed: the fallback
 * when none of the timed ones ran (seen for float64 data gradients). */
static int heuristic(cudnnHandle_t handle, const conv_plan *p, timing *t, int *count)
{
    const conv_key *k = &p->key;
    if (k->pass == AMPC_CONV_FORWARD) {
        cudnnConvolutionFwdAlgoPerf_t perf[MAX_ALGOS];
        DNN_TRY(cudnnGetConvolutionForwardAlgorithm_v7(handle, p->x, p->w, p->conv, p->y, MAX_ALGOS, count, perf),
                "cudnnGetConvolutionForwardAlgorithm_v7");
        COPY_TIMINGS(perf, *count, t);
    }
    else if (k->pass == AMPC_CONV_BACKWARD_DATA) {
        cudnnConvolutionBwdDataAlgoPerf_t perf[MAX_ALGOS];
        DNN_TRY(cudnnGetConvolutionBackwardDataAlgorithm_v7(handle, p->w, p->y, p->conv, p->x, MAX_ALGOS, count,
                                                            perf),
                "cudnnGetConvolutionBackwardDataAlgorithm_v7");
        COPY_TIMINGS(perf, *count, t);
    }
    else {
        cudnnConvolutionBwdFilterAlgoPerf_t perf[MAX_ALGOS];
        DNN_TRY(cudnnGetConvolutionBackwardFilterAlgorithm_v7(handle, p->x, p->y, p->conv, p->w, MAX_ALGOS, count,
                                                              perf),
                "cudnnGetConvolutionBackwardFilterAlgorithm_v7");
        COPY_TIMINGS(perf, *count, t);
    }
    /* untimed: keep cuDNN's order, which the deterministic preference then follows */
    for (int i = 0; i < *count; i++)
        t[i].time = 0;
    return AMPC_OK;
}

static int run(cudnnHandle_t handle, const conv_plan *p, const ampc_conv *c, void *ws)
{
    if (p->engine.plan != NULL)
        return ampc_conv_graph_run(handle, &p->engine, c, ws);
    const double one_d = 1.0, zero_d = 0.0;
    const float one_f = 1.0f, zero_f = 0.0f;
    const int f64 = p->key.dtype == AMPC_FLOAT64;
    const void *one = f64 ? (const void *)&one_d : (const void *)&one_f;
    const void *zero = f64 ? (const void *)&zero_d : (const void *)&zero_f;
    switch (p->key.pass) {
    case AMPC_CONV_FORWARD:
        DNN_TRY(cudnnConvolutionForward(handle, one, p->x, c->x.data, p->w, c->weight.data, p->conv,
                                        (cudnnConvolutionFwdAlgo_t)p->algo, ws, p->workspace, zero, p->y, c->y.data),
                "cudnnConvolutionForward");
        break;
    case AMPC_CONV_BACKWARD_DATA:
        DNN_TRY(cudnnConvolutionBackwardData(handle, one, p->w, c->weight.data, p->y, c->y.data, p->conv,
                                             (cudnnConvolutionBwdDataAlgo_t)p->algo, ws, p->workspace, zero, p->x,
                                             c->x.data),
                "cudnnConvolutionBackwardData");
        break;
    default:
        DNN_TRY(cudnnConvolutionBackwardFilter(handle, one, p->x, c->x.data, p->y, c->y.data, p->conv,
                                               (cudnnConvolutionBwdFilterAlgo_t)p->algo, ws, p->workspace, zero, p->w,
                                               c->weight.data),
                "cudnnConvolutionBackwardFilter");
        break;
    }
    return AMPC_OK;
}

static int usable(const conv_plan *p, const timing *t)
{
    /* float32 must not come back as TF32 (a Tensor Core math type) */
    return t->status == CUDNN_STATUS_SUCCESS &&
           (math_type(p->key.dtype) != CUDNN_FMA_MATH || t->math == CUDNN_FMA_MATH || t->math == CUDNN_DEFAULT_MATH);
}

/* How much slower than the fastest a deterministic algorithm may be and
 * still be chosen: any, where the caller asked for deterministic ones
 * (which pick and choose then insist on). */
static float slack(const conv_plan *p)
{
    return p->key.deterministic ? FLT_MAX : DETERMINISTIC_SLACK;  /* not INFINITY: untimed algorithms' 0 * inf is NaN */
}

/* The algorithm to run among t[0..count): the fastest usable one, or the
 * fastest deterministic one within the slack of it; among equal times the
 * first (cuDNN's order). NULL where none is usable, or where deterministic
 * ones were asked for and none is. */
static const timing *pick(const conv_plan *p, const timing *t, int count)
{
    const timing *fastest = NULL, *chosen = NULL;
    for (int i = 0; i < count; i++)
        if (usable(p, &t[i]) && (fastest == NULL || t[i].time < fastest->time))
            fastest = &t[i];
    for (int i = 0; fastest != NULL && i < count; i++)
        if (usable(p, &t[i]) && t[i].deterministic && t[i].time <= fastest->time * slack(p) &&
            (chosen == NULL || t[i].time < chosen->time))
            chosen = &t[i];
    return chosen != NULL || p->key.deterministic ? chosen : fastest;
}

#define RETIMED 4   /* candidates timed again */
#define RETIME_RUNS 3

typedef struct {
    cudnnHandle_t handle;
    const conv_plan *p;
    const ampc_conv *c;
    void *ws;
    timing *candidates[RETIMED];
} legacy_trial;

static int launch_legacy(const void *ctx, int i)
{
    const legacy_trial *a = (const legacy_trial *)ctx;
    const timing *t = a->candidates[i];
    conv_plan trial = *a->p;
    trial.algo = t->algo;
    trial.workspace = t->memory;
    const cudnnMathType_t math = math_type(a->p->key.dtype) == CUDNN_FMA_MATH ? CUDNN_FMA_MATH : t->math;
    DNN_TRY(cudnnSetConvolutionMathType(a->p->conv, math), "cudnnSetConvolutionMathType");
    return run(a->handle, &trial, a->c, a->ws);
}

/* FindEx times each algorithm once, cold: on the H200 the same shape picked
 * algorithms 2-4 times apart from run to run. Time its RETIMED fastest
 * usable candidates again, RETIME_RUNS rounds, best run kept, and drop the
 * rest. */
static int retime(cudnnHandle_t handle, void *stream, conv_plan *p, const ampc_conv *c, void *ws, size_t ws_size,
                  timing *t, int count)
{
    legacy_trial a = {handle, p, c, ws, {NULL}};
    int n = 0;
    for (int i = 0; i < count; i++) {
        if (!usable(p, &t[i]) || t[i].memory > ws_size)
            continue;
        if (n == RETIMED)
            t[i].status = CUDNN_STATUS_NOT_SUPPORTED;  /* not timed again: not compared */
        else
            a.candidates[n++] = &t[i];
    }
    float times[RETIMED];
    const int rc = ampc_cuda_time_candidates(stream, n, RETIME_RUNS, launch_legacy, &a, times);
    for (int i = 0; i < n && rc == AMPC_OK; i++)
        a.candidates[i]->time = times[i];
    return rc;
}

static const char *pass_name(int pass)
{
    return pass == AMPC_CONV_FORWARD ? "forward" : pass == AMPC_CONV_BACKWARD_DATA ? "data gradient" : "filter gradient";
}

/* Whether the graph API's engine runs rather than the legacy algorithm t:
 * the faster, or the deterministic one where it is within the slack. */
static int graph_wins(const conv_plan *p, const timing *t)
{
    const conv_engine *e = &p->engine;
    if (e->deterministic != t->deterministic)
        return e->deterministic ? e->time <= t->time * slack(p) : t->time > e->time * slack(p);
    return e->time < t->time;
}

const char *ampc_conv_key_text(const conv_key *k, char *buf, size_t size)
{
    snprintf(buf, size, "%s, dtype %d, %lld x %lld x %lld x %lld%s, %lld filters of %lld x %lld, stride %lld x %lld, "
             "padding %lld x %lld, dilation %lld x %lld, groups %lld", pass_name(k->pass), k->dtype, (long long)k->n,
             (long long)k->c, (long long)k->h, (long long)k->w, k->w_nhwc ? " channels-last" : "", (long long)k->k,
             (long long)k->r, (long long)k->s, (long long)k->stride[0], (long long)k->stride[1],
             (long long)k->pad[0], (long long)k->pad[1], (long long)k->dilation[0], (long long)k->dilation[1],
             (long long)k->groups);
    return buf;
}

/* With AMPC_CONV_DEBUG set, the legacy algorithms' timings and the choice,
 * kept for Python to print (conv_report.c; conv_graph.c reports the graph
 * API's engines). */
static void report(const conv_plan *p, const timing *timed, int count, const timing *chosen, int graph)
{
    if (!ampc_conv_debugging())
        return;
    char text[AMPC_CONV_KEY_TEXT];
    ampc_conv_key_text(&p->key, text, sizeof text);
    for (int i = 0; i < count; i++)
        ampc_conv_debug_line("ampc conv legacy: %s: algo %d %s %.4f ms, %zu B, math %d%s%s\n", text, timed[i].algo,
                             cudnnGetErrorString(timed[i].status), (double)timed[i].time, timed[i].memory,
                             (int)timed[i].math, timed[i].deterministic ? "" : " (nondeterministic)",
                             &timed[i] == chosen && !graph ? " <- chosen" : "");
    if (graph)
        ampc_conv_debug_line("ampc conv: %s: the graph API's engine chosen, %.4f ms\n", text, (double)p->engine.time);
}

static int choose(cudnnHandle_t handle, conv_plan *p, const timing *timed, int count)
{
    const cudnnMathType_t wanted = math_type(p->key.dtype);
    const timing *chosen = pick(p, timed, count);
    const int graph = p->engine.plan != NULL && (p->engine.deterministic || !p->key.deterministic) &&
                      (chosen == NULL || graph_wins(p, chosen));
    report(p, timed, count, chosen, graph);
    if (graph) {
        p->workspace = p->engine.workspace;
        return AMPC_OK;
    }
    ampc_conv_graph_destroy(&p->engine);
    timing ranked[MAX_ALGOS];
    int ranked_count = 0;
    if (chosen == NULL) {
        const int rc = heuristic(handle, p, ranked, &ranked_count);
        if (rc != AMPC_OK)
            return rc;
        chosen = pick(p, ranked, ranked_count);
    }
    if (chosen == NULL) {
        char text[AMPC_CONV_KEY_TEXT];
        return ampc_cuda_fail_msg(AMPC_ERR_DEVICE, "cuDNN has no %salgorithm for this convolution (%s; %d timed, %d "
                                  "ranked, the first: %s)", p->key.deterministic ? "deterministic " : "",
                                  ampc_conv_key_text(&p->key, text, sizeof text), count, ranked_count,
                                  count > 0 ? cudnnGetErrorString(timed[0].status)
                                  : ranked_count > 0 ? cudnnGetErrorString(ranked[0].status) : "none");
    }
    p->algo = chosen->algo;
    p->workspace = chosen->memory;
    if (wanted != CUDNN_FMA_MATH)
        DNN_TRY(cudnnSetConvolutionMathType(p->conv, chosen->math), "cudnnSetConvolutionMathType");
    return AMPC_OK;
}

/* Build p's descriptors and pick its algorithm, timing them once (or, out
 * of benchmark mode, taking cuDNN's ranking untimed). */
static int plan_build(cudnnHandle_t handle, int device, void *stream, conv_plan *p, const ampc_conv *c)
{
    int rc = descriptors(p);
    if (rc != AMPC_OK)
        return rc;
    timing t[MAX_ALGOS];
    if (!p->key.benchmark)  /* torch.backends.cudnn.benchmark = False: nothing timed, nothing waits */
        return choose(handle, p, t, 0);
    void *ws = NULL;
    size_t ws_size = FIND_WORKSPACE;
    while (ws_size > 0 && ampc_cuda_alloc(device, ws_size, stream, &ws) != AMPC_OK) {
        ws = NULL;
        ws_size /= 4;  /* less memory free: let fewer algorithms compete */
        if (ws_size < ((size_t)1 << 20))
            ws_size = 0;
    }
    int count = 0;
    rc = find(handle, p, c, ws, ws_size, t, &count);
    if (rc == AMPC_OK)
        rc = retime(handle, stream, p, c, ws, ws_size, t, count);
    if (rc == AMPC_OK)
        rc = ampc_conv_graph_find(handle, stream, &p->key, c, ws, ws_size, slack(p), &p->engine);
    if (ws != NULL) {
        const int freed = ampc_cuda_free(device, ws, ws_size, stream);
        if (rc == AMPC_OK)
            rc = freed;
    }
    return rc == AMPC_OK ? choose(handle, p, t, count) : rc;
}

typedef struct {
    cudnnHandle_t handle;
    int device;
    void *stream;
    const ampc_conv *c;
} build_args;

static int build(void *plan, void *ctx)
{
    const build_args *a = (const build_args *)ctx;
    return plan_build(a->handle, a->device, a->stream, (conv_plan *)plan, a->c);
}

/* The pass's output declared written for initcheck (initcheck.c): some of
 * cuDNN's Hopper convolutions store through the TMA, and initcheck reported
 * every read of their outputs (cuDNN's own layout transposes, torch's copy,
 * ampc's batch norm; H200, 2026-12-06). The whole span of the output, which
 * for the dense arrays ampc hands cuDNN is the output itself. */
static void mark_output(void *stream, const ampc_conv *c)
{
    const int64_t *dims, *strides;
    const ampc_buf *out;
    const int64_t y_dims[4] = {c->n, c->k, c->p, c->q}, x_dims[4] = {c->n, c->c, c->h, c->w};
    const int64_t w_dims[4] = {c->k, c->c / c->groups, c->r, c->s};
    switch (c->pass) {
    case AMPC_CONV_FORWARD:
        dims = y_dims, strides = c->y_strides, out = &c->y;
        break;
    case AMPC_CONV_BACKWARD_DATA:
        dims = x_dims, strides = c->x_strides, out = &c->x;
        break;
    default:
        dims = w_dims, strides = c->w_strides, out = &c->weight;
        break;
    }
    int64_t last = 0;  /* the offset of the span's last element */
    for (int i = 0; i < 4; i++)
        last += (dims[i] - 1) * strides[i];
    ampc_mark_written(stream, out->data, 1, (last + 1) * ampc_dtype_size(out->dtype), 0);
}

static int conv_locked(cudnnHandle_t handle, int device, void *stream, const ampc_conv *c, const conv_key *key)
{
    build_args args = {handle, device, stream, c};
    void *plan = NULL;
    int temporary = 0;
    int rc = ampc_plan_get(&plans, key, build, &args, &plan, &temporary);
    if (rc != AMPC_OK)
        return rc;
    const conv_plan *p = (const conv_plan *)plan;
    void *ws = NULL;
    if (p->workspace > 0)
        rc = ampc_cuda_alloc(device, p->workspace, stream, &ws);
    if (rc == AMPC_OK)
        rc = run(handle, p, c, ws);
    if (rc == AMPC_OK)
        mark_output(stream, c);
    if (ws != NULL) {
        const int freed = ampc_cuda_free(device, ws, p->workspace, stream);
        if (rc == AMPC_OK)
            rc = freed;
    }
    ampc_plan_done(&plans, plan, temporary);
    return rc;
}

/* The largest power of two up to 16 that divides the address. */
static int alignment(const void *data)
{
    int a = 1;
    while (a < 16 && (uintptr_t)data % (uintptr_t)(2 * a) == 0)
        a *= 2;
    return a;
}

int ampc_cuda_conv(int device, void *stream, const ampc_conv *c)
{
    if (c->n * c->k * c->p * c->q == 0 || c->c == 0)
        return AMPC_OK;
    conv_key key;
    memset(&key, 0, sizeof key);  /* padding too: keys are compared as bytes */
    key.device = device;
    key.pass = (int)c->pass;
    key.dtype = c->x.dtype;
    key.w_nhwc = c->channels_last;  /* the filter in the data's layout: KRSC, else KCRS */
    key.deterministic = c->deterministic;
    key.benchmark = c->benchmark;
    key.align[0] = alignment(c->x.data);
    key.align[1] = alignment(c->weight.data);
    key.align[2] = alignment(c->y.data);
    key.n = c->n, key.c = c->c, key.h = c->h, key.w = c->w;
    key.k = c->k, key.r = c->r, key.s = c->s, key.p = c->p, key.q = c->q, key.groups = c->groups;
    for (int i = 0; i < 2; i++) {
        key.stride[i] = c->stride[i];
        key.pad[i] = c->pad[i];
        key.dilation[i] = c->dilation[i];
    }
    memcpy(key.x_strides, c->x_strides, sizeof key.x_strides);
    memcpy(key.y_strides, c->y_strides, sizeof key.y_strides);
    ampc_device_guard guard;
    int rc = ampc_device_enter(device, &guard);
    if (rc != AMPC_OK)
        return rc;
    cudnnHandle_t handle;
    rc = ampc_dnn_enter(device, stream, &handle);
    if (rc == AMPC_OK)
        rc = conv_locked(handle, device, stream, c, &key);
    ampc_dnn_leave();
    ampc_device_leave(&guard);
    return rc;
}
