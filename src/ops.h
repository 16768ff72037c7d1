/*
 * ops.h: the kernels behind ampc.nn.functional, as the CPU (ops_cpu.c) and
 * CUDA (cuda/ops.cu, cuda/gemm.c) code see them. Plain C, shared with
 * ampc._cuda through ampc_cuda.h.
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
#ifndef AMPC_OPS_H
#define AMPC_OPS_H

#include <stdint.h>
#include "ampc_types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A dense array (C order) of one of the floating dtypes, or of an integer
 * dtype for class indices. data NULL: absent (an optional weight). */
typedef struct {
    void *data;
    ampc_dtype dtype;
} ampc_buf;

/* The float type a kernel computes in for data of dtype d. */
static inline ampc_dtype ampc_acc_dtype(ampc_dtype d) { return d == AMPC_FLOAT64 ? AMPC_FLOAT64 : AMPC_FLOAT32; }

/* ------------------------------------------------------------------------ */
/* Elementwise                                                               */
/* ------------------------------------------------------------------------ */

/* f(a, b; p). Forward ops read a (and b); a gradient op reads the incoming
 * gradient as a and the forward's input (or output) as b. */
typedef enum {
    /* unary: f(a) */
    AMPC_EW_COPY = 0,
    AMPC_EW_NEG,
    AMPC_EW_RELU,
    AMPC_EW_GELU,           /* a * Phi(a), with erf */
    AMPC_EW_GELU_TANH,      /* PyTorch's approximate='tanh' */
    AMPC_EW_SILU,
    AMPC_EW_SIGMOID,
    AMPC_EW_TANH,
    AMPC_EW_EXP,
    AMPC_EW_LOG,
    AMPC_EW_POW_SCALAR,     /* a ** p */
    AMPC_EW_SQRT,
    AMPC_EW_RSQRT,
    AMPC_EW_ABS,
    AMPC_EW_SIGN,
    /* binary: f(a, b) */
    AMPC_EW_ADD,            /* a + p * b (torch's alpha) */
    AMPC_EW_MUL,
    AMPC_EW_DIV,
    AMPC_EW_POW,            /* a ** b */
    AMPC_EW_MAXIMUM,
    AMPC_EW_MINIMUM,
    /* gradients: a = dy, b = the forward's x (or y where said) */
    AMPC_EW_RELU_GRAD,      /* b: y or x (the same test) */
    AMPC_EW_GELU_GRAD,
    AMPC_EW_GELU_TANH_GRAD,
    AMPC_EW_SILU_GRAD,
    AMPC_EW_SIGMOID_GRAD,   /* b: y */
    AMPC_EW_TANH_GRAD,      /* b: y */
    AMPC_EW_POW_SCALAR_GRAD,/* dy * p * x ** (p - 1) */
    /* pointwise losses: a = input, b = target; their gradients with respect to a */
    AMPC_EW_SQUARED_DIFF,   /* (a - b)^2 */
    AMPC_EW_ABS_DIFF,       /* |a - b| */
    AMPC_EW_BCE_LOGITS,     /* max(a, 0) - a * b + log1p(exp(-|a|)) */
    AMPC_EW_BCE,            /* -(b * log(a) + (1 - b) * log(1 - a)), logs clamped at -100 */
    AMPC_EW_SQUARED_DIFF_GRAD,
    AMPC_EW_ABS_DIFF_GRAD,  /* sign(a - b) */
    AMPC_EW_BCE_LOGITS_GRAD,/* sigmoid(a) - b */
    AMPC_EW_BCE_GRAD,       /* (a - b) / max((1 - a) * a, 1e-12) */
    AMPC_EW_NUM_OPS
} ampc_ew_op;

/* Number of array operands an op reads before the optional multiplier c. */
static inline int ampc_ew_arity(ampc_ew_op op) { return op < AMPC_EW_ADD ? 1 : 2; }

/* out (dense, C order, `shape`) = f(in[0], in[1]; param) * in[2] * scale,
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

/* y = softmax(x) or log_softmax(x) along n. */
typedef struct {
    ampc_rows rows;
    int log;
    ampc_buf y, x;
} ampc_softmax;

/* dx from dy and the forward's output y:
 * softmax: dx = y * (dy - sum(dy * y)); log_softmax: dx = dy - exp(y) * sum(dy). */
typedef struct {
    ampc_rows rows;
    int log;
    ampc_buf dx, dy, y;
} ampc_softmax_backward;

/* y = (x - mean) * rstd * w + b over rows of n (inner == 1); mean and rstd
 * (the accumulation dtype, outer values each) are saved for the backward. */
typedef struct {
    int64_t rows, n;
    double eps;
    ampc_buf y, mean, rstd, x, weight, bias;
} ampc_layer_norm;

/* dx, and dweight/dbias (summed over rows) where their data is not NULL. */
typedef struct {
    int64_t rows, n;
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
 * or float32. Accumulates in float32 (float64 for float64). */
typedef struct {
    int64_t m, n, k, batch;
    int trans_a, trans_b;
    int64_t lda, ldb, ldc, ldd;
    int64_t stride_a, stride_b, stride_c, stride_d;
    double alpha, beta;
    ampc_buf a, b, c, d, bias;
} ampc_gemm;

/* ------------------------------------------------------------------------ */
/* CPU kernels (ops_cpu.c): plain C, split across ampc's threads; the       */
/* caller releases the GIL. 0, or -1 when out of memory (nothing written).  */
/* ------------------------------------------------------------------------ */

int ampc_cpu_elementwise(const ampc_ew *e);
int ampc_cpu_softmax(const ampc_softmax *s);
int ampc_cpu_softmax_backward(const ampc_softmax_backward *s);
int ampc_cpu_layer_norm(const ampc_layer_norm *l);
int ampc_cpu_layer_norm_backward(const ampc_layer_norm_backward *l);
int ampc_cpu_reduce(const ampc_reduce *r);
int ampc_cpu_cross_entropy(const ampc_cross_entropy *c);
int ampc_cpu_cross_entropy_backward(const ampc_cross_entropy_backward *c);

#ifdef __cplusplus
}
#endif

#endif /* AMPC_OPS_H */
