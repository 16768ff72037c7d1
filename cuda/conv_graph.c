/*
 * conv_graph.c: convolutions through cuDNN's graph (backend) API, whose
 * engines are those torch times under torch.backends.cudnn.benchmark. The
 * legacy cudnnFind...Ex calls reach fewer of them: on the H200 they left
 * 16-bit 1x1 convolutions 2-5x slower than torch's.
 *
 * One operation graph per convolution pass; cuDNN's heuristics (instant
 * mode, then its fallback list) name the engine configurations; each is
 * finalized into an execution plan and timed on the call's buffers. Engines
 * whose numerics ampc does not promise are left out, as torch leaves them:
 * inputs converted down, TF32 for float32 data (Tensor Core engines), and,
 * since 16-bit convolutions accumulate in float32, reduced-precision
 * reductions.
 */
#include "conv.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MAX_CONFIGS 64   /* engine configurations considered */
#define TIMED_RUNS 3
/* Plans timed at most, the heuristic's ranking first, as torch's
 * torch.backends.cudnn.benchmark_limit (10): timing all of up to 64 made a
 * ResNet-50's first steps take minutes. AMPC_CONV_BENCHMARK_LIMIT=N
 * changes it (0: every one). */
#define DEFAULT_BENCHMARK_LIMIT 10

static int benchmark_limit(void)
{
    const char *text = getenv("AMPC_CONV_BENCHMARK_LIMIT");
    char *end = NULL;
    const long n = text != NULL ? strtol(text, &end, 10) : 0;
    if (text == NULL || end == text || *end != '\0' || n < 0)
        return DEFAULT_BENCHMARK_LIMIT;  /* unset or not a count: not "time them all" */
    return n == 0 || n > MAX_CONFIGS ? MAX_CONFIGS : (int)n;
}
#define UID_X 1
#define UID_W 2
#define UID_Y 3

/* Each pass's operation, with the attributes of its three operands in the
 * roles x (image), w (filter), y (output image): the forward writes y, the
 * data gradient x, the filter gradient w. */
static const struct {
    cudnnBackendDescriptorType_t type;
    cudnnBackendAttributeName_t alpha, beta, conv, x, w, y;
} OPERATION[3] = {
    [AMPC_CONV_FORWARD] = {CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
                           CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
                           CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA,
                           CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
                           CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
                           CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y},
    [AMPC_CONV_BACKWARD_DATA] = {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
                                 CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
                                 CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA,
                                 CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
                                 CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
                                 CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
                                 CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY},
    [AMPC_CONV_BACKWARD_FILTER] = {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
                                   CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
                                   CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA,
                                   CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
                                   CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
                                   CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
                                   CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY},
};

#define SET(desc, attr, type, count, value) \
    DNN_TRY(cudnnBackendSetAttribute((desc), (attr), (type), (count), (value)), "cudnnBackendSetAttribute(" #attr ")")
#define CREATE(kind, desc) DNN_TRY(cudnnBackendCreateDescriptor((kind), (desc)), "cudnnBackendCreateDescriptor(" #kind ")")
#define FINALIZE(desc, what) DNN_TRY(cudnnBackendFinalize(desc), "cudnnBackendFinalize(" what ")")

static void destroy(cudnnBackendDescriptor_t *d)
{
    if (*d != NULL)
        cudnnBackendDestroyDescriptor(*d);
    *d = NULL;
}

void ampc_conv_graph_destroy(conv_engine *e)
{
    destroy(&e->plan);
    destroy(&e->config);
    destroy(&e->graph);
    destroy(&e->op);
    destroy(&e->conv);
    for (int i = 0; i < 3; i++)
        destroy(&e->tensors[i]);
}

static int tensor(cudnnBackendDescriptor_t *t, int dtype, int64_t uid, const int64_t *dims, const int64_t *strides,
                  int64_t align)
{
    const cudnnDataType_t type = ampc_dnn_type(dtype);
    CREATE(CUDNN_BACKEND_TENSOR_DESCRIPTOR, t);
    SET(*t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
    SET(*t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims);
    SET(*t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides);
    SET(*t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    SET(*t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
    FINALIZE(*t, "tensor");
    return AMPC_OK;
}

/* The pass's operation graph in e (tensors, convolution, operation, graph). */
static int build_graph(cudnnHandle_t handle, const conv_key *k, conv_engine *e)
{
    const int64_t cg = k->c / k->groups;
    const int64_t x_dims[4] = {k->n, k->c, k->h, k->w}, y_dims[4] = {k->n, k->k, k->p, k->q};
    const int64_t w_dims[4] = {k->k, cg, k->r, k->s};
    const int64_t w_krsc[4] = {k->r * k->s * cg, 1, k->s * cg, cg}, w_kcrs[4] = {cg * k->r * k->s, k->r * k->s, k->s, 1};
    int rc = tensor(&e->tensors[0], k->dtype, UID_X, x_dims, k->x_strides, k->align[0]);
    if (rc == AMPC_OK)
        rc = tensor(&e->tensors[1], k->dtype, UID_W, w_dims, k->w_nhwc ? w_krsc : w_kcrs, k->align[1]);
    if (rc == AMPC_OK)
        rc = tensor(&e->tensors[2], k->dtype, UID_Y, y_dims, k->y_strides, k->align[2]);
    if (rc != AMPC_OK)
        return rc;

    const int f64 = k->dtype == AMPC_FLOAT64;
    const cudnnDataType_t compute = f64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
    const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
    const int64_t spatial = 2;
    CREATE(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, &e->conv);
    SET(e->conv, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute);
    SET(e->conv, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode);
    SET(e->conv, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &spatial);
    SET(e->conv, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, k->dilation);
    SET(e->conv, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, k->stride);
    SET(e->conv, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, k->pad);
    SET(e->conv, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, k->pad);
    FINALIZE(e->conv, "convolution");

    const double one_d = 1.0, zero_d = 0.0;
    const float one_f = 1.0f, zero_f = 0.0f;
    const cudnnBackendAttributeType_t scalar = f64 ? CUDNN_TYPE_DOUBLE : CUDNN_TYPE_FLOAT;
    const void *one = f64 ? (const void *)&one_d : (const void *)&one_f;
    const void *zero = f64 ? (const void *)&zero_d : (const void *)&zero_f;
    const __typeof__(OPERATION[0]) *o = &OPERATION[k->pass];
    CREATE(o->type, &e->op);
    SET(e->op, o->x, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &e->tensors[0]);
    SET(e->op, o->w, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &e->tensors[1]);
    SET(e->op, o->y, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &e->tensors[2]);
    SET(e->op, o->conv, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &e->conv);
    SET(e->op, o->alpha, scalar, 1, one);
    SET(e->op, o->beta, scalar, 1, zero);
    FINALIZE(e->op, "convolution operation");

    CREATE(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, &e->graph);
    SET(e->graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &e->op);
    SET(e->graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
    FINALIZE(e->graph, "operation graph");
    return AMPC_OK;
}

/* Append to configs[*count..MAX_CONFIGS) the engine configurations cuDNN's
 * heuristics in `mode` rank for the graph. */
static int heuristic_configs(cudnnBackendDescriptor_t graph, cudnnBackendHeurMode_t mode,
                             cudnnBackendDescriptor_t *configs, int *count)
{
    cudnnBackendDescriptor_t heur = NULL;
    int64_t found = 0, got = 0;
    int rc = AMPC_OK;
    cudnnStatus_t st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &heur);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                      &graph);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendFinalize(heur);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &found,
                                      NULL);
    const int64_t room = MAX_CONFIGS - *count;
    if (found > room)
        found = room;
    int64_t made = 0;
    for (; st == CUDNN_STATUS_SUCCESS && made < found; made++)
        st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &configs[*count + made]);
    if (st == CUDNN_STATUS_SUCCESS && found > 0)
        st = cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, found, &got,
                                      &configs[*count]);
    if (st != CUDNN_STATUS_SUCCESS) {
        rc = ampc_dnn_fail(st, "cuDNN's engine heuristics");
        got = 0;
    }
    for (int64_t i = got; i < made; i++)  /* the descriptors no result filled */
        destroy(&configs[*count + i]);
    *count += (int)got;
    destroy(&heur);
    return rc;
}

/* Whether ampc may run the engine of config (its numerical notes), its
 * index among cuDNN's engines, and whether it is deterministic. */
static int engine_notes(cudnnBackendDescriptor_t config, int dtype, int *allowed, int64_t *index, int *deterministic)
{
    cudnnBackendDescriptor_t engine = NULL;
    cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
    int64_t n = 0, got = 0;
    cudnnStatus_t st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &engine);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendGetAttribute(config, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &got,
                                      &engine);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &got, index);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                      CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &n, notes);
    destroy(&engine);
    if (st != CUDNN_STATUS_SUCCESS)
        return ampc_dnn_fail(st, "reading a cuDNN engine's notes");
    *allowed = 1;
    *deterministic = 1;
    for (int64_t i = 0; i < n; i++) {
        switch (notes[i]) {
        case CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS:
        case CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION:
            *allowed = 0;
            break;
        case CUDNN_NUMERICAL_NOTE_TENSOR_CORE:
            if (dtype == AMPC_FLOAT32)
                *allowed = 0;  /* TF32 */
            break;
        case CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC:
            *deterministic = 0;
            break;
        default:
            break;
        }
    }
    return AMPC_OK;
}

/* Queue plan on c's buffers. */
static int execute(cudnnHandle_t handle, cudnnBackendDescriptor_t plan, const ampc_conv *c, void *ws)
{
    int64_t uids[3] = {UID_X, UID_W, UID_Y};
    void *pointers[3] = {c->x.data, c->weight.data, c->y.data};
    cudnnBackendDescriptor_t pack = NULL;
    CREATE(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack);
    cudnnStatus_t st = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 3, uids);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 3, pointers);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendFinalize(pack);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendExecute(handle, plan, pack);
    destroy(&pack);
    return st == CUDNN_STATUS_SUCCESS ? AMPC_OK : ampc_dnn_fail(st, "cudnnBackendExecute (convolution)");
}

int ampc_conv_graph_run(cudnnHandle_t handle, const conv_engine *e, const ampc_conv *c, void *ws)
{
    return execute(handle, e->plan, c, ws);
}

/* An execution plan of config that ran once on c's buffers, or NULL (and
 * AMPC_OK) when cuDNN cannot make one for this graph, it asks more
 * workspace than there is, or its first run fails. */
static int try_plan(cudnnHandle_t handle, cudnnBackendDescriptor_t config, const ampc_conv *c, void *ws,
                    size_t ws_size, cudnnBackendDescriptor_t *plan, size_t *workspace)
{
    int64_t need = 0, got = 0;
    CREATE(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, plan);
    SET(*plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
    SET(*plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &config);
    cudnnStatus_t st = cudnnBackendFinalize(*plan);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendGetAttribute(*plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &got,
                                      &need);
    if (st != CUDNN_STATUS_SUCCESS || need < 0 || (uint64_t)need > ws_size) {
        destroy(plan);  /* this engine does not take this convolution here: not an error */
        return AMPC_OK;
    }
    if (execute(handle, *plan, c, ws) != AMPC_OK) {
        (void)cudaGetLastError();  /* not sticky, or the timing that follows reports it */
        destroy(plan);
        return AMPC_OK;
    }
    *workspace = (size_t)need;
    return AMPC_OK;
}

typedef struct {
    cudnnHandle_t handle;
    const cudnnBackendDescriptor_t *plans;
    const int *live;  /* indices into plans */
    const ampc_conv *c;
    void *ws;
} trial;

static int launch_live(const void *ctx, int i)
{
    const trial *t = (const trial *)ctx;
    return execute(t->handle, t->plans[t->live[i]], t->c, t->ws);
}

int ampc_conv_graph_find(cudnnHandle_t handle, void *stream, const conv_key *key, const ampc_conv *c, void *ws,
                         size_t ws_size, float slack, conv_engine *best)
{
    memset(best, 0, sizeof *best);
    cudnnBackendDescriptor_t configs[MAX_CONFIGS];
    int count = 0;
    /* A graph or heuristics cuDNN refuses (float64 data gradients, say)
     * leaves the convolution to the legacy algorithms: not an error. */
    if (build_graph(handle, key, best) != AMPC_OK ||
        heuristic_configs(best->graph, CUDNN_HEUR_MODE_INSTANT, configs, &count) != AMPC_OK) {
        ampc_conv_graph_destroy(best);
        return AMPC_OK;
    }
    const int ranked = count;
    (void)heuristic_configs(best->graph, CUDNN_HEUR_MODE_FALLBACK, configs, &count);  /* a bonus if it fails */
    int rc = AMPC_OK;

    /* Time every allowed configuration; the fallback list's engines only
     * where the ranked list did not name them already. */
    cudnnBackendDescriptor_t plans[MAX_CONFIGS] = {0};
    size_t workspaces[MAX_CONFIGS] = {0};
    float times[MAX_CONFIGS];
    int deterministic[MAX_CONFIGS] = {0};
    int64_t indices[MAX_CONFIGS];
    for (int i = 0; i < count; i++) {
        times[i] = INFINITY;
        indices[i] = -1;
    }
    int live[MAX_CONFIGS], nlive = 0;
    const int limit = benchmark_limit();
    for (int i = 0; i < count && rc == AMPC_OK && nlive < limit; i++) {
        int allowed = 0;
        if (engine_notes(configs[i], key->dtype, &allowed, &indices[i], &deterministic[i]) != AMPC_OK)
            continue;
        for (int j = 0; j < ranked && i >= ranked; j++)
            allowed &= indices[j] != indices[i];
        if (!allowed)
            continue;
        rc = try_plan(handle, configs[i], c, ws, ws_size, &plans[i], &workspaces[i]);
        if (rc == AMPC_OK && plans[i] != NULL)
            live[nlive++] = i;
    }
    float live_times[MAX_CONFIGS];
    const trial t = {handle, plans, live, c, ws};
    if (rc == AMPC_OK)
        rc = ampc_cuda_time_candidates(stream, nlive, TIMED_RUNS, launch_live, &t, live_times);
    int fastest = -1;
    for (int k = 0; k < nlive && rc == AMPC_OK; k++) {
        times[live[k]] = live_times[k];
        if (fastest < 0 || live_times[k] < times[fastest])
            fastest = live[k];
    }
    int chosen = fastest;
    const int verbose = ampc_conv_debugging();
    char text[AMPC_CONV_KEY_TEXT] = "";
    if (verbose)
        ampc_conv_key_text(key, text, sizeof text);
    for (int i = 0; fastest >= 0 && i < count; i++)
        if (plans[i] != NULL && deterministic[i] && times[i] <= times[fastest] * slack &&
            (!deterministic[chosen] || times[i] < times[chosen]))
            chosen = i;
    for (int i = 0; i < count; i++) {
        if (verbose)
            ampc_conv_debug_line("ampc conv graph: %s: config %d/%d engine %lld %s%s %.4f ms%s\n", text, i, count,
                                 (long long)indices[i], plans[i] != NULL ? "timed" : "skipped",
                                 deterministic[i] ? "" : " (nondeterministic)", (double)times[i],
                                 i == chosen ? " <- chosen" : "");
        if (i == chosen && rc == AMPC_OK) {
            best->plan = plans[i];
            best->config = configs[i];
            best->workspace = workspaces[i];
            best->time = times[i];
            best->deterministic = deterministic[i];
            continue;
        }
        destroy(&plans[i]);
        destroy(&configs[i]);
    }
    if (rc != AMPC_OK || best->plan == NULL)
        ampc_conv_graph_destroy(best);
    return rc;
}
