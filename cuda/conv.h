/*
 * conv.h: what conv.c (the legacy cudnnFind...Ex algorithms) and
 * conv_graph.c (cuDNN's graph API engines) share: the key a convolution's
 * plan is remembered by, the graph API's chosen engine, and where
 * AMPC_CONV_DEBUG's lines go (conv_report.h).
 */
#ifndef AMPC_CUDA_CONV_H
#define AMPC_CUDA_CONV_H

#include "conv_report.h"
#include "dnn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Everything a plan depends on; compared as bytes (zero it first). */
typedef struct {
    int device, pass, dtype, w_nhwc;
    int deterministic;  /* deterministic algorithms only */
    int benchmark;      /* timed on the first call, else cuDNN's ranking */
    int align[3];  /* of x, the filter and y: a graph plan may load 16 bytes at a time */
    int64_t n, c, h, w, k, r, s, p, q, groups;
    int64_t stride[2], pad[2], dilation[2];
    int64_t x_strides[4], y_strides[4];
} conv_key;

/* k in words for messages and AMPC_CONV_DEBUG's lines: its pass, dtype,
 * input, filters, stride, padding, dilation and groups (buf's size
 * AMPC_CONV_KEY_TEXT is ample; snprintf cuts what it could not hold). */
#define AMPC_CONV_KEY_TEXT 256
const char *ampc_conv_key_text(const conv_key *k, char *buf, size_t size);

/* A graph API execution plan with the descriptors it was made from. */
typedef struct {
    cudnnBackendDescriptor_t plan, config, graph, op, conv, tensors[3];
    size_t workspace;
    float time;        /* best timed run, ms */
    int deterministic;
} conv_engine;

/* Time the graph API's engines for key's pass on c's buffers (whose
 * outputs they overwrite) with ws_size bytes of workspace at ws, and keep
 * in *best the fastest, or the fastest deterministic one within slack of
 * it. best->plan stays NULL when no engine ran. */
int ampc_conv_graph_find(cudnnHandle_t handle, void *stream, const conv_key *key, const ampc_conv *c, void *ws,
                         size_t ws_size, float slack, conv_engine *best);
int ampc_conv_graph_run(cudnnHandle_t handle, const conv_engine *e, const ampc_conv *c, void *ws);
void ampc_conv_graph_destroy(conv_engine *e);

#ifdef __cplusplus
}
#endif

#endif /* AMPC_CUDA_CONV_H */
