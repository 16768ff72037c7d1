/*
 * elementwise.cu: ampc_ew on the GPU: out = f(a, b; p) * c * scale over a
 * broadcast index space, in the compute type of the output (float, double
 * for float64), each element rounded once. The same formulas as the CPU's
 * ops_real.inc, element by element: those of kernels/ew_ops.def from its
 * text, the others written here as there.
 *
 * The layout is coalesced first (ampc_ew_coalesce: size-1 dimensions gone,
 * dimensions every operand walks contiguously merged), so a dense or
 * row-broadcast operation is one or two dimensions; each thread decomposes
 * its linear index over those. Grid-stride, 64-bit indices.
 */
#include "ops.cuh"
#include "packs.cuh"

namespace {

using namespace ops;

template <class Acc>
__device__ __forceinline__ Acc sigmoid(Acc x)
{
    return (Acc)1 / ((Acc)1 + m_exp(-x));
}

template <class Acc>
__device__ __forceinline__ Acc gelu_tanh_inner(Acc x)
{
    const Acc k = (Acc)(M_SQRT2 * M_2_SQRTPI * 0.5); /* sqrt(2 / pi) */
    return k * (x + (Acc)0.044715 * x * x * x);
}

/* sigmoid(y) and 1 - sigmoid(y), neither by a subtraction (ops_real.inc's sigmoid_pair: gelu's
 * tanh form as 1 + tanh(z) = 2 sigmoid(2z), 1 - tanh(z)^2 = 4 sigmoid(2z) (1 - sigmoid(2z))). */
template <class Acc>
__device__ __forceinline__ void sigmoid_pair(Acc y, Acc &s, Acc &rest)
{
    const Acc e = m_exp(y < (Acc)0 ? y : -y), d = (Acc)1 / ((Acc)1 + e);
    s = y < (Acc)0 ? e * d : d;
    rest = y < (Acc)0 ? d : e * d;
}

/* sign(d) as torch's: 0 at +-0 and at NaN (abs's and l1_loss's gradients are 0 there). */
template <class Acc>
__device__ __forceinline__ Acc sign_of(Acc d)
{
    return d > 0 ? (Acc)1 : d < 0 ? (Acc)-1 : (Acc)0;
}

/* x ** p as torch computes it (ops_real.inc's pow_rows): its special-cased exponents by their
 * operations (sqrt for 0.5, x * x * x for 3, ...), any other by pow. */
template <class Acc>
__device__ __forceinline__ Acc pow_by(Acc x, Acc p)
{
    return p == 0 ? (Acc)1 : p == 1 ? x : p == 2 ? x * x : p == 3 ? x * x * x : p == -2 ? (Acc)1 / (x * x)
         : p == (Acc)0.5 ? m_sqrt(x) : p == (Acc)-0.5 ? (Acc)1 / m_sqrt(x) : p == -1 ? (Acc)1 / x : m_pow(x, p);
}

/* binary_cross_entropy_with_logits as torch's (1 - t) x - log_sigmoid(x), and its limit at an
 * infinite x (ops_real.inc's bce_logits). */
template <class Acc>
__device__ __forceinline__ Acc bce_logits(Acc x, Acc t)
{
    const Acc log_sigmoid = (x < (Acc)0 ? x : (Acc)0) - m_log1p(m_exp(-m_abs(x)));
    const Acc c = x > (Acc)0 ? (Acc)1 - t : -t;
    const Acc limit = c == (Acc)0 ? (Acc)0 : c * x;
    return isinf(x) ? limit : ((Acc)1 - t) * x - log_sigmoid;
}

/* The table's formulas (kernels/ew_ops.def), one function an op, ew_formula_<ENUM>(a, b, p, q), in
 * the GPU's maths: ops.cuh's m_exp ... and the helpers above; REAL is the compute type Acc. */
#define REAL Acc
#define EXP m_exp
#define LOG m_log
#define LOG1P m_log1p
#define TANH m_tanh
#define POW m_pow
#define SQRT m_sqrt
#define FABS m_abs
#define SIGMOID sigmoid
#define SIGN sign_of
#define AMPC_EW_OP(ENUM_, name_, arity_, flags_)
#define AMPC_EW_FORMULA(ENUM_, name_, arity_, flags_, formula_)                                   \
    template <class Acc>                                                                          \
    __device__ __forceinline__ Acc ew_formula_##ENUM_(Acc a, Acc b, Acc p, Acc q)                 \
    {                                                                                             \
        (void)a, (void)b, (void)p, (void)q;                                                       \
        return formula_;                                                                          \
    }
#include "kernels/ew_ops.def"
#undef REAL
#undef EXP
#undef LOG
#undef LOG1P
#undef TANH
#undef POW
#undef SQRT
#undef FABS
#undef SIGMOID
#undef SIGN

/* f(a, b; p, q) of one element. Inlined, so that a kernel given op as a
 * constant keeps only its case. */
template <class Acc>
__device__ __forceinline__ Acc apply(int op, Acc p, Acc q, Acc a, Acc b)
{
    switch (op) {
#define AMPC_EW_OP(ENUM_, name_, arity_, flags_)
#define AMPC_EW_FORMULA(ENUM_, name_, arity_, flags_, formula_) \
    case AMPC_EW_##ENUM_: return ew_formula_##ENUM_<Acc>(a, b, p, q);
#include "kernels/ew_ops.def"
    case AMPC_EW_COPY: return a;
    case AMPC_EW_RELU: return a > 0 || a != a ? a : (Acc)0;  /* NaN stays NaN */
    case AMPC_EW_GELU: return a * normal_cdf(a);
    case AMPC_EW_GELU_TANH: {
        Acc s, rest;
        sigmoid_pair((Acc)2 * gelu_tanh_inner(a), s, rest);
        return a * s;
    }
    case AMPC_EW_POW_SCALAR: return pow_by(a, p);
    case AMPC_EW_ADD: return p == 1 ? a + b : a + p * b;
    case AMPC_EW_GELU_GRAD: {
        const Acc k = (Acc)(M_2_SQRTPI * M_SQRT1_2 * 0.5); /* 1 / sqrt(2 pi) */
        const Acc cdf = normal_cdf(b);
        return a * (cdf + b * k * m_exp((Acc)-0.5 * b * b));
    }
    case AMPC_EW_GELU_TANH_GRAD: {
        const Acc k = (Acc)(M_SQRT2 * M_2_SQRTPI * 0.5);
        Acc s, rest;
        sigmoid_pair((Acc)2 * gelu_tanh_inner(b), s, rest);
        const Acc dinner = k * ((Acc)1 + (Acc)3 * (Acc)0.044715 * b * b);
        return a * (s + (Acc)2 * b * s * rest * dinner);
    }
    case AMPC_EW_SILU_GRAD: {
        const Acc s = sigmoid(b);
        return a * s * ((Acc)1 + b * ((Acc)1 - s));
    }
    case AMPC_EW_POW_SCALAR_GRAD: return a * (p * pow_by(b, p - 1));
    case AMPC_EW_BCE_LOGITS: return bce_logits(a, b);
    case AMPC_EW_BCE: {
        const Acc la = m_log(a) > (Acc)-100 ? m_log(a) : (Acc)-100;
        const Acc l1a = m_log1p(-a) > (Acc)-100 ? m_log1p(-a) : (Acc)-100;
        return -(b * la + ((Acc)1 - b) * l1a);
    }
    case AMPC_EW_BCE_GRAD: {
        const Acc d = ((Acc)1 - a) * a;
        return (a - b) / (d > (Acc)1e-12 ? d : (Acc)1e-12);
    }
    default: return a;
    }
}

template <class Acc>
__device__ __forceinline__ Acc operand(const ampc_ew &e, int x, int64_t off)
{
    return e.in[x].data != nullptr ? load<Acc>(e.in[x], off) : (Acc)e.value[x];
}

template <class Acc>
__global__ void elementwise_kernel(ampc_ew e, int arity)
{
    const Acc p = (Acc)e.param, q = (Acc)e.param2, scale = (Acc)e.scale;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < e.numel;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t off[3] = {0, 0, 0};
        int64_t r = i;
        for (int d = e.ndim - 1; d >= 0; d--) {
            const int64_t k = d > 0 ? r % e.shape[d] : r;
            r /= e.shape[d];
            for (int x = 0; x < e.nin; x++)
                off[x] += k * e.strides[x][d];
        }
        const Acc a = operand<Acc>(e, 0, off[0]);
        const Acc b = arity > 1 ? operand<Acc>(e, 1, off[1]) : (Acc)0;
        Acc v = apply<Acc>(e.op, p, q, a, b);
        /* as the CPU: out *= c * scale */
        if (e.nin > 2)
            v *= operand<Acc>(e, 2, off[2]) * scale;
        else if (scale != (Acc)1)
            v *= scale;
        store(e.out, i, v);
    }
}

/* The dense case, which a network's activations almost always are: every
 * array operand walks the output's memory order with stride 1 and has the
 * output's storage type T. Each thread takes V consecutive elements, one
 * 16-byte pack (packs.cuh) an operand where every pointer is on a 16-byte
 * boundary (V = Pack<T>::VEC), else one element (V = 1), with no index
 * arithmetic; the values, and so the bits, are those of elementwise_kernel.
 * The last numel % V elements go one to a thread. */
template <class T, int V>
__device__ __forceinline__ void load_values(const ampc_ew &e, int x, int64_t at, float (&out)[V])
{
    if (e.in[x].data == nullptr) {
        for (int k = 0; k < V; k++)
            out[k] = (float)e.value[x];
        return;
    }
    const T *p = static_cast<const T *>(e.in[x].data) + at;
    if constexpr (V == Pack<T>::VEC) {
        Pack<T> pack;
        pack.load(p);
        for (int k = 0; k < V; k++)
            out[k] = pack[k];
    } else {
        for (int k = 0; k < V; k++)
            out[k] = to_float(p[k]);
    }
}

/* Elements at .. at + V - 1. OP: the op as a constant (a network's
 * activations' relu, add, mul, relu_grad and copies), or ANY_OP for e.op. */
constexpr int ANY_OP = -1;

template <class T, int V, int OP>
__device__ __forceinline__ void dense_values(const ampc_ew &e, int arity, int64_t at)
{
    const int op = OP == ANY_OP ? e.op : OP;
    const float p = (float)e.param, q = (float)e.param2, scale = (float)e.scale;
    float a[V], b[V], c[V];
    load_values<T, V>(e, 0, at, a);
    if (arity > 1)
        load_values<T, V>(e, 1, at, b);
    if (e.nin > 2)
        load_values<T, V>(e, 2, at, c);
    for (int k = 0; k < V; k++) {
        a[k] = apply<float>(op, p, q, a[k], arity > 1 ? b[k] : 0.0f);
        if (e.nin > 2)
            a[k] *= c[k] * scale;
        else if (scale != 1.0f)
            a[k] *= scale;
    }
    T *out = static_cast<T *>(e.out.data) + at;
    if constexpr (V == Pack<T>::VEC) {
        Pack<T> pack;
        for (int k = 0; k < V; k++)
            pack.set(k, a[k]);
        pack.store(out);
    } else {
        for (int k = 0; k < V; k++)
            out[k] = from_float<T>(a[k]);
    }
}

template <class T, int V, int OP>
__global__ void elementwise_dense_kernel(ampc_ew e, int arity)
{
    const int64_t packs = e.numel / V, stride = (int64_t)gridDim.x * blockDim.x;
    const int64_t first = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (int64_t i = first; i < packs; i += stride)
        dense_values<T, V, OP>(e, arity, i * V);
    if (V > 1 && first < e.numel - packs * V)
        dense_values<T, 1, OP>(e, arity, packs * V + first);  /* the tail */
}

/* 1 if every array operand of the coalesced c is dense in the output's
 * order and of its dtype (a 16-bit or float32 one). */
bool is_dense(const ampc_ew &c)
{
    if (c.ndim != 1 || (c.out.dtype != AMPC_FLOAT32 && c.out.dtype != AMPC_FLOAT16 && c.out.dtype != AMPC_BFLOAT16))
        return false;
    for (int x = 0; x < c.nin; x++)
        if (c.in[x].data != nullptr && (c.in[x].dtype != c.out.dtype || c.strides[x][0] != 1))
            return false;
    return true;
}

bool is_aligned(const ampc_ew &c)
{
    bool aligned = reinterpret_cast<uintptr_t>(c.out.data) % 16 == 0;
    for (int x = 0; x < c.nin; x++)
        aligned = aligned && reinterpret_cast<uintptr_t>(c.in[x].data) % 16 == 0;  /* null: a number */
    return aligned;
}

template <class T, int OP>
int launch_dense_op(const ampc_ew &c, int arity, cudaStream_t stream)
{
    constexpr int V = Pack<T>::VEC;
    if (is_aligned(c))
        elementwise_dense_kernel<T, V, OP><<<grid_for((c.numel + V - 1) / V, 256), 256, 0, stream>>>(c, arity);
    else
        elementwise_dense_kernel<T, 1, OP><<<grid_for(c.numel, 256), 256, 0, stream>>>(c, arity);
    return ampc_cuda_launched("elementwise kernel");
}

/* The ops a network's activations and gradients go through most (flag
 * AMPC_EW_GPU_KERNEL in kernels/ew_ops.def) get a kernel of their own: with
 * every op's case inside the loop (erf, pow, tanh ...) the kernel ran at
 * half torch's bandwidth. The others share the ANY_OP kernel. */
template <class T>
int launch_dense(const ampc_ew &c, int arity, cudaStream_t stream)
{
    switch (c.op) {
#define AMPC_EW_OP(ENUM, name_, arity_, flags_) \
    case AMPC_EW_##ENUM: \
        return launch_dense_op<T, ((flags_) & AMPC_EW_GPU_KERNEL) != 0 ? (int)AMPC_EW_##ENUM : ANY_OP>(c, arity, stream);
#include "kernels/ew_ops.def"
    default: return launch_dense_op<T, ANY_OP>(c, arity, stream);
    }
}

}  // namespace

extern "C" int ampc_cuda_elementwise(int device, void *stream, const ampc_ew *e)
{
    if (e->numel == 0)
        return AMPC_OK;
    return ampc_on_device(device, [&] {
        ampc_ew c = *e;
        ampc_ew_coalesce(e, &c.ndim, c.shape, c.strides);
        const unsigned grid = grid_for(e->numel, 256);
        const int arity = ampc_ew_arity(e->op);
        if (is_dense(c))
            return with_storage(c.out.dtype, [&](auto t) {
                return launch_dense<decltype(t)>(c, arity, as_stream(stream));
            });
        if (e->out.dtype == AMPC_FLOAT64)
            elementwise_kernel<double><<<grid, 256, 0, as_stream(stream)>>>(c, arity);
        else
            elementwise_kernel<float><<<grid, 256, 0, as_stream(stream)>>>(c, arity);
        return ampc_cuda_launched("elementwise kernel");
    });
}
