/*
 * op_descriptors.h: the kernels behind ampc.nn.functional, as the CPU
 * (cpu/ops_cpu.c, spatial_cpu.c, embedding_cpu.c) and CUDA (cuda/'s .cu
 * files, gemm.c, conv.c) code see them. Plain C, shared by both backends;
 * ampc._C hands them over through the backend table (backend.h).
 *
 * A handful of kernel families serve every op: the Python layer composes
 * them (linear's backward is two matrix products and a reduction).
 *   - elementwise: out = f(a, b) * c * scale over a broadcast index space;
 *     activations, their gradients, binary arithmetic and pointwise losses;
 *   - rows: softmax, log_softmax, layer_norm, cross_entropy and their
 *     backward passes over the layout (outer, n, inner): element (o, j, i)
 *     at (o * n + j) * inner + i, the reduced dimension in the middle;
 *   - reduce: sums over the same layout;
 *   - gemm (GPU; the CPU goes through NumPy's BLAS).
 *
 * Every kernel loads its operands into float32 (float64 for float64 data),
 * computes there and rounds each output once: float16 and bfloat16 storage
 * never means float16 arithmetic.
 */
#ifndef AMPC_KERNELS_OP_DESCRIPTORS_H
#define AMPC_KERNELS_OP_DESCRIPTORS_H

#include <stdint.h>
#include "kernels/dtypes.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Helpers the CPU and CUDA kernels share. */
#ifdef __CUDACC__
#define AMPC_HOST_DEVICE __host__ __device__
#else
#define AMPC_HOST_DEVICE
#endif

/* A dense array (C order) of one of the floating dtypes, or of an integer
 * dtype for class indices. data NULL: absent (an optional weight). */
typedef struct {
    void *data;
    ampc_dtype dtype;
} ampc_buf;

/* Element i of an integer array of indices (class targets, embedding rows):
 * int8/16/32/64 or uint8, the dtypes the entry points accept as indices;
 * -1 for any other. */
static inline int64_t ampc_index_at(const ampc_buf *t, int64_t i)
{
    switch (t->dtype) {
    case AMPC_INT64: return ((const int64_t *)t->data)[i];
    case AMPC_INT32: return ((const int32_t *)t->data)[i];
    case AMPC_INT16: return ((const int16_t *)t->data)[i];
    case AMPC_INT8: return ((const int8_t *)t->data)[i];
    case AMPC_UINT8: return ((const uint8_t *)t->data)[i];
    default: return -1;
    }
}

/* The float type a kernel computes in for data of dtype d. */
static inline ampc_dtype ampc_acc_dtype(ampc_dtype d) { return d == AMPC_FLOAT64 ? AMPC_FLOAT64 : AMPC_FLOAT32; }

/* ------------------------------------------------------------------------ */
/* Elementwise                                                               */
/* ------------------------------------------------------------------------ */

/* f(a, b; p). The ops, their names, arities and flags: kernels/ew_ops.def. */
enum {
    AMPC_EW_INT = 1,         /* takes integer and bool arrays beside a floating one */
    AMPC_EW_INT_FLOAT = 2,   /* ... and alone, giving float32 */
    AMPC_EW_GPU_KERNEL = 4,  /* a dense GPU kernel of its own */
};

typedef enum {
#define AMPC_EW_OP(ENUM, name, arity, flags) AMPC_EW_##ENUM,
#include "kernels/ew_ops.def"
    AMPC_EW_NUM_OPS
} ampc_ew_op;

/* Number of array operands an op reads before the optional multiplier c. */
static inline int ampc_ew_arity(ampc_ew_op op)
{
    static const signed char arity[] = {
#define AMPC_EW_OP(ENUM, name, arity, flags) arity,
#include "kernels/ew_ops.def"
    };
    return arity[op];
}

/* The op's AMPC_EW_* flags. */
static inline int ampc_ew_flags(ampc_ew_op op)
{
    static const unsigned char flags[] = {
#define AMPC_EW_OP(ENUM, name, arity, flags) flags,
#include "kernels/ew_ops.def"
    };
    return flags[op];
}

/* out (dense, C order, `shape`) = f(in[0], in[1]; param, param2) * in[2] * scale,
 * in[2] only when nin == 3 (in[1] unused by a unary op). Input strides are
 * in elements and may be zero (broadcast) or negative. An operand whose
 * data is NULL is the constant value[x] (a Python number). */
typedef struct {
    ampc_ew_op op;
    double param;
    double scale;
    int ndim;
    int nin;
    int64_t numel;
    int64_t shape[AMPC_MAX_NDIM];
    ampc_buf out;
    ampc_buf in[3];
    double value[3];
    int64_t strides[3][AMPC_MAX_NDIM];
    double param2;  /* a formula's q (ew_ops.def): a second parameter, softplus's threshold */
} ampc_ew;

/* Drop size-1 dimensions and merge the dimensions that every input walks
 * contiguously (the output is C order), so inner runs are as long as they
 * can be. At least one dimension is left. */
static inline void ampc_ew_coalesce(const ampc_ew *e, int *ndim, int64_t *shape, int64_t (*strides)[AMPC_MAX_NDIM])
{
    int nd = 0;
    for (int d = 0; d < e->ndim; d++) {
        if (e->shape[d] == 1)
            continue;
        int merge = nd > 0;
        for (int x = 0; x < e->nin && merge; x++)
            merge = strides[x][nd - 1] == e->strides[x][d] * e->shape[d];
        if (merge) {
            shape[nd - 1] *= e->shape[d];
            for (int x = 0; x < e->nin; x++)
                strides[x][nd - 1] = e->strides[x][d];
            continue;
        }
        shape[nd] = e->shape[d];
        for (int x = 0; x < e->nin; x++)
            strides[x][nd] = e->strides[x][d];
        nd++;
    }
    if (nd == 0) {
        shape[0] = 1;
        for (int x = 0; x < e->nin; x++)
            strides[x][0] = 0;
        nd = 1;
    }
    *ndim = nd;
}

/* ------------------------------------------------------------------------ */
/* Row ops over (outer, n, inner)                                            */
/* ------------------------------------------------------------------------ */

typedef struct {
    int64_t outer, n, inner;
} ampc_rows;

/* y = softmax(x) or log_softmax(x) along n. causal (attention's mask,
 * rows contiguous): 0, or the L rows of each matrix, of which row r takes
 * columns 0..r + causal_offset alone, the others counting as -inf (y = 0,
 * or -inf for log_softmax). causal_offset (0..n): the rows are a band of
 * queries that starts causal_offset queries into the sequence. */
typedef struct {
    ampc_rows rows;
    int log;
    ampc_buf y, x;
    int64_t causal, causal_offset;
} ampc_softmax;

/* The columns a row of a (causal) softmax takes. */
static inline AMPC_HOST_DEVICE int64_t ampc_softmax_live(const ampc_softmax *s, int64_t row)
{
    const int64_t live = s->causal > 0 ? row % s->causal + 1 + s->causal_offset : s->rows.n;
    return live < s->rows.n ? live : s->rows.n;
}

/* dx from dy and the forward's output y:
 * softmax: dx = y * (dy - sum(dy * y)); log_softmax: dx = dy - exp(y) * sum(dy). */
typedef struct {
    ampc_rows rows;
    int log;
    ampc_buf dx, dy, y;
} ampc_softmax_backward;

/* y = (x - mean) * rstd * w + b over rows of n (inner == 1); mean and rstd
 * (the accumulation dtype, outer values each) are saved for the backward.
 * groups 0: w and b per element of a row (layer_norm); groups > 0:
 * group_norm's, per channel, a row being one group of one sample, n /
 * spatial channels of `spatial` elements each, row r's first channel
 * (r % groups) * (n / spatial). */
typedef struct {
    int64_t rows, n, groups, spatial;
    double eps;
    ampc_buf y, mean, rstd, x, weight, bias;
} ampc_layer_norm;

/* How many weights (and biases) the rows take: n, or group_norm's channels. */
static inline int64_t ampc_layer_norm_weights(int64_t n, int64_t groups, int64_t spatial)
{
    return groups > 0 ? groups * (n / spatial) : n;
}

/* dx, and dweight/dbias (summed over rows) where their data is not NULL;
 * groups and spatial as ampc_layer_norm's (group_norm: dweight and dbias a
 * value per channel). */
typedef struct {
    int64_t rows, n, groups, spatial;
    ampc_buf dx, dweight, dbias, dy, x, mean, rstd, weight;
} ampc_layer_norm_backward;

/* out[o, i] = scale * sum_j x[o, j, i], accumulated in the accumulation
 * dtype in a fixed order (the same bits whatever the thread count). */
typedef struct {
    ampc_rows rows;
    double scale;
    ampc_buf out, x;
} ampc_reduce;

/* cross_entropy / nll_loss over logits (outer = batch, n = classes,
 * inner = spatial positions), targets as class indices (an integer dtype,
 * outer * inner of them) or as probabilities (the logits' shape).
 *   log_probs: the input is already log-probabilities (nll_loss);
 *   weight: per class, or absent; smoothing: label_smoothing;
 *   reduction: 0 none (loss has outer * inner values), 1 mean, 2 sum;
 * Saved for the backward: lse (outer * inner, accumulation dtype), the
 * log-sum-exp of each position, and denom (one value): the divisor of the
 * mean (the summed weights of the targets not ignored; positions for
 * probabilities), 1 for sum and none. */
typedef struct {
    ampc_rows rows;
    int log_probs, probs_target, reduction;
    int64_t ignore_index;
    double smoothing;
    ampc_buf loss, lse, denom, logits, target, weight;
} ampc_cross_entropy;

/* dlogits = dloss * d(loss)/d(logits); dloss has one value (mean, sum) or
 * outer * inner (none). */
typedef struct {
    ampc_rows rows;
    int log_probs, probs_target, reduction;
    int64_t ignore_index;
    double smoothing;
    ampc_buf dlogits, dloss, lse, denom, logits, target, weight;
} ampc_cross_entropy_backward;

/* ------------------------------------------------------------------------ */
/* Matrix products (GPU)                                                     */
/* ------------------------------------------------------------------------ */

/* d[b] = alpha * op(a[b]) @ op(b[b]) + beta * c[b] + bias, row-major, for
 * b in [0, batch): op(a) is m x k, op(b) k x n, d m x n. Each matrix has
 * unit stride along one dimension: ld* is the other stride (elements);
 * trans_*: the matrix is stored transposed (its rows are op's columns).
 * batch strides (elements) may be 0 (a broadcast operand). c (optional)
 * has d's dtype and layout parameters of its own; bias (optional) has n
 * values, added to every row. a and b share a dtype; d has that dtype
 * or float32. Accumulates in float32 (float64 for float64). bias_grad
 * (optional; one product, no c or bias): also the m sums of op(a) over k,
 * in d's dtype (linear's bias gradient, when op(a) is dy transposed); a
 * GPU that cannot fuse them answers AMPC_ERR_UNSUPPORTED. */
typedef struct {
    int64_t m, n, k, batch;
    int trans_a, trans_b;
    int64_t lda, ldb, ldc, ldd;
    int64_t stride_a, stride_b, stride_c, stride_d;
    double alpha, beta;
    ampc_buf a, b, c, d, bias;
    ampc_buf bias_grad;
} ampc_gemm;

/* ------------------------------------------------------------------------ */
/* Spatial ops over NCHW images: convolution, batch norm, pooling            */
/* ------------------------------------------------------------------------ */

/* A 2-D convolution (cross-correlation, as torch's conv2d; conv1d is one
 * with a single row): x (n, c, h, w), weight (k, c / groups, r, s), y (n, k,
 * p, q). Strides are in elements, in NCHW order, so a channels-last array is
 * one whose c stride is 1. All three share one layout (the entry point
 * copies what differs): channels-last on the GPU when the input is, else
 * C order (what the CPU kernels need). pass says which of the three is
 * written from the other two: the forward writes y, the data gradient x
 * (from y holding dy), the filter gradient w. */
typedef enum { AMPC_CONV_FORWARD = 0, AMPC_CONV_BACKWARD_DATA, AMPC_CONV_BACKWARD_FILTER } ampc_conv_pass;

typedef struct {
    ampc_conv_pass pass;
    int64_t n, c, h, w;
    int64_t k, r, s;
    int64_t p, q;
    int64_t groups;
    int64_t stride[2], pad[2], dilation[2];
    int64_t x_strides[4], w_strides[4], y_strides[4];
    ampc_buf x, weight, y;
    int channels_last;  /* every operand channels-last (the GPU), else all C order */
    int deterministic;  /* the GPU: cuDNN's deterministic algorithms only (ampc.backends.cudnn) */
    int benchmark;      /* the GPU: time cuDNN's algorithms on a shape's first call, else take its ranking */
} ampc_conv;

/* batch_norm over x viewed as (n, c, h, w) with x_strides (elements, NCHW
 * order; y has x's layout), per channel c. Training: the batch's mean and
 * 1 / sqrt(biased var + eps) are written to save_mean / save_rstd, and
 * running_mean / running_var (optional) move by momentum towards the mean
 * and the unbiased variance. Eval: the running statistics normalise.
 * weight, bias, the running and saved statistics: c values each, in the
 * accumulation dtype. */
typedef struct {
    int64_t n, c, h, w;
    int64_t x_strides[4];
    int training;
    double momentum, eps;
    ampc_buf y, x, weight, bias, running_mean, running_var, save_mean, save_rstd;
} ampc_batch_norm;

/* The training-mode backward from the saved statistics: dx, and dweight /
 * dbias (c values, the accumulation dtype) where their data is not NULL.
 * dy and dx have x's layout. */
typedef struct {
    int64_t n, c, h, w;
    int64_t x_strides[4];
    double eps;
    ampc_buf dx, dweight, dbias, dy, x, weight, save_mean, save_rstd;
} ampc_batch_norm_backward;

/* max_pool2d, avg_pool2d and adaptive_avg_pool2d over dense NCHW planes:
 * x (planes, h, w) to y (planes, p, q); on the GPU also over dense
 * channels-last images, x (n, h, w, channels) to y (n, p, q, channels) with
 * planes = n * channels (indices then in y's layout too). Window (i, j) of a fixed pool covers
 * rows i * stride - pad + a * dilation, a < kernel (columns likewise),
 * clipped to the image; an adaptive pool's covers rows
 * [floor(i h / p), ceil((i + 1) h / p)). avg divides by the window's size
 * (with the padding that lies inside the image plus pad when
 * count_include_pad, as torch), or by divisor when it is not 0. max also
 * writes the flat h * w index of each window's maximum (NaN wins) to
 * indices (int64), which its backward reads. */
typedef enum { AMPC_POOL_MAX = 0, AMPC_POOL_AVG, AMPC_POOL_ADAPTIVE_AVG } ampc_pool_mode;

typedef struct {
    ampc_pool_mode mode;
    int64_t planes, h, w, p, q;
    int64_t kernel[2], stride[2], pad[2], dilation[2];
    int count_include_pad;
    int64_t divisor;
    ampc_buf y, x, indices;
    int channels_last;  /* GPU only: x, y, indices stored (n, h, w, channels) */
    int64_t channels;
} ampc_pool;

/* ------------------------------------------------------------------------ */
/* Embedding and dropout                                                     */
/* ------------------------------------------------------------------------ */

/* out (count, dim) = the rows of weight (num, dim) that indices (count
 * integers) name; out has weight's dtype. An index outside [0, num): the
 * CPU entry point refuses it before anything is written; the GPU, which
 * cannot look without waiting for the device, writes a row of NaN. */
typedef struct {
    int64_t num, dim, count;
    ampc_buf out, weight, indices;
} ampc_embedding;

/* dweight (num, dim) from dy (count, dim): row r is the sum of the rows of
 * dy whose index is r, taken in position order in the accumulation dtype
 * and rounded once (so the CPU and the GPU give the same bits); rows no
 * index names, the row padding_idx (-1: none) and indices out of range get
 * zeros and nothing. */
typedef struct {
    int64_t num, dim, count, padding_idx;
    ampc_buf dweight, dy, indices;
} ampc_embedding_backward;

/* y = x * keep * scale over numel dense elements (y may be x), keep from
 * philox.h: element i of the draw (seed, offset). Dropout's backward is the
 * same call on dy with the forward's seed and offset. */
typedef struct {
    int64_t numel;
    uint64_t seed, offset;
    uint32_t keep_below;  /* keep with probability keep_below / 2^24 */
    double scale;         /* 1 / (1 - p), applied in the accumulation dtype */
    ampc_buf y, x;
} ampc_dropout;

/* ------------------------------------------------------------------------ */
/* Fused attention (GPU only: cuda/attention.cu)                             */
/* ------------------------------------------------------------------------ */

/* One (batch, heads, len, head_dim) operand: element strides of its first
 * three dimensions; head_dim's is 1 (attention's q, k and v are views of one
 * projection, strided everywhere else). */
typedef struct {
    void *data;
    int64_t stride[3];
} ampc_attention_arg;

/* o = softmax(q k^T * scale) v, FlashAttention-2's way: the scores never
 * reach memory. causal: query i sees keys 0..i (torch's is_causal, counted
 * from the top left). k and v may have fewer heads than q, a divisor of
 * them (grouped-query attention: query head h reads key/value head
 * h / (heads / kv_heads)). q, k, v, o share a dtype, float16 or bfloat16; lse
 * (batch, heads, q_len) float32, dense: each query's log-sum-exp of its
 * scaled scores, from which the backward pass recomputes the
 * probabilities. A GPU or shape the kernels do not serve (head_dim other
 * than 64, before sm_80, operands not 16-byte aligned) answers
 * AMPC_ERR_UNSUPPORTED, and the caller composes the attention instead. */
typedef struct {
    ampc_dtype dtype;
    int64_t batch, heads, kv_heads, q_len, kv_len, head_dim;
    int causal;
    float scale;
    ampc_attention_arg q, k, v, o;
    float *lse;
    /* Dropout on the probabilities, the composed attention's mask: element
     * i of the (batch, heads, q_len, kv_len) probabilities kept where
     * ampc_philox_keep(element i of the draw (seed, offset), keep_below)
     * (philox.h), then times keep_scale = 1 / (1 - p). keep_below = 2^24:
     * no dropout. */
    uint64_t seed, offset;
    uint32_t keep_below;
    float keep_scale;
} ampc_attention;

/* dq, dk, dv (strided as the forward's operands may be) from dout and the
 * forward's q, k, v, o and lse. Deterministic: no atomics, the same bits
 * on every run. */
typedef struct {
    ampc_attention fwd;
    ampc_attention_arg dout, dq, dk, dv;
} ampc_attention_backward;


/* The rows (axis 0) or columns (axis 1) window i covers: [*lo, *hi) by
 * *step, and *padded, its extent with padding (what count_include_pad
 * divides by). The CPU and CUDA kernels share it. */
static inline AMPC_HOST_DEVICE void ampc_pool_window(const ampc_pool *pl, int axis, int64_t i, int64_t *lo,
                                                     int64_t *hi, int64_t *step, int64_t *padded)
{
    const int64_t in = axis == 0 ? pl->h : pl->w, out = axis == 0 ? pl->p : pl->q;
    if (pl->mode == AMPC_POOL_ADAPTIVE_AVG) {
        *lo = i * in / out;
        *hi = ((i + 1) * in + out - 1) / out;
        *step = 1;
        *padded = *hi - *lo;
        return;
    }
    const int64_t start = i * pl->stride[axis] - pl->pad[axis];
    *step = pl->dilation[axis];
    if (pl->mode == AMPC_POOL_MAX) {
        int64_t s = start;
        while (s < 0)
            s += *step;
        *lo = s;
        const int64_t last = start + (pl->kernel[axis] - 1) * *step + 1;
        *hi = last < in ? last : in;
        *padded = 0;
        return;
    }
    /* average: torch counts the padding inside [start, in + pad) */
    int64_t e = start + pl->kernel[axis];
    if (e > in + pl->pad[axis])
        e = in + pl->pad[axis];
    *padded = e - start;
    *lo = start < 0 ? 0 : start;
    *hi = e < in ? e : in;
}

/* What an average window of rows x cols image elements divides by. */
static inline AMPC_HOST_DEVICE int64_t ampc_pool_divisor(const ampc_pool *pl, int64_t rows, int64_t cols,
                                                         int64_t padded)
{
    if (pl->divisor != 0)
        return pl->divisor;
    if (pl->mode == AMPC_POOL_AVG && pl->count_include_pad)
        return padded;
    return rows * cols;
}

/* dx (planes, h, w) from dy (planes, p, q): every input element gathers the
 * gradients of the windows that used it (max: those whose index points at
 * it), in window order, so the result does not depend on the schedule. */
typedef struct {
    ampc_pool pool;  /* y holds dy, x receives dx */
} ampc_pool_backward;

#ifdef __cplusplus
}
#endif

#endif /* AMPC_KERNELS_OP_DESCRIPTORS_H */
