/*
 * attention.cu: fused scaled-dot-product attention (op_descriptors.h's ampc_attention),
 * FlashAttention-2's algorithm on Tensor Cores (mma.sync m16n8k16, float32
 * accumulators) for 16-bit q, k, v with a head dimension of 64.
 *
 * The composed attention writes the scores and probabilities of every head
 * (B * H * L * S values, several passes over them forward and back); here a
 * block takes 64 queries and walks the keys 64 at a time, keeping scores in
 * registers: softmax is taken online (a running maximum m and sum l per
 * query, the output rescaled when m grows), and only o and each query's
 * log-sum-exp reach memory.
 *
 * Backward, without atomics (so every run gives the same bits):
 *   - delta_kernel: delta_i = sum_d dout_id * o_id;
 *   - dkdv_kernel, a block per 64 keys, walking the queries: P^T from the
 *     scores and lse, dV += P^T dout, dP^T = V dout^T, dS^T = P^T (dP^T -
 *     delta), dK += dS^T Q;
 *   - dq_kernel, a block per 64 queries, walking the keys: P, dP = dout V^T,
 *     dS, dQ += dS K.
 * That is 7 products a tile where one kernel with atomic dQ additions does
 * 5, for bits that do not depend on the schedule.
 *
 * Grouped query heads read their group's key/value head; a dK/dV block
 * walks the queries of every head of its group. Dropout takes the composed
 * attention's mask (philox.h's draw, element by element of the (batch,
 * heads, L, S) probabilities), so both drop the same elements for a seed;
 * the kernels are compiled with and without it.
 *
 * Warps own 16 rows of a tile (queries forward and in dq_kernel, keys in
 * dkdv_kernel). Fragments follow PTX's m16n8k16 layouts: a lane holds rows
 * lane / 4 and lane / 4 + 8, columns 2 * (lane % 4) and the next, of each
 * 16 x 8 accumulator, which is also how two accumulators of a row of
 * scores become one A operand of the next product. Tiles are staged in
 * shared memory by cp.async, rows padded by 16 bytes so that ldmatrix's
 * eight row addresses fall in different banks.
 *
 * Scores are kept in base 2: s * scale * log2(e), exp2 of the difference.
 *
 * The kernels are in attention_kernels.cuh, the instructions they use in
 * mma.cuh; tests/emulated_cuda runs the kernels on the CPU against a model
 * of those instructions (tests/test_attention_emulated.py).
 */
#include "packs.cuh"
#include "mma.cuh"
#include "kernels/philox.h"
#include "attention_kernels.cuh"

namespace {

/* ------------------------------------------------------------------------ */
/* Host                                                                      */
/* ------------------------------------------------------------------------ */

bool aligned(const ampc_attention_arg &x)
{
    /* 16-byte rows for cp.async; 4-byte pairs for the stores */
    return reinterpret_cast<uintptr_t>(x.data) % 16 == 0 && x.stride[0] % 8 == 0 && x.stride[1] % 8 == 0 &&
           x.stride[2] % 8 == 0;
}

/* AMPC_OK when the kernels serve a; else AMPC_ERR_UNSUPPORTED with why. */
int served(const ampc_attention &a, int device)
{
    int major = 0;
    AMPC_CUDA_TRY(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), "reading the GPU");
    if (major < 8)
        return ampc_cuda_fail_msg(AMPC_ERR_UNSUPPORTED, "fused attention needs sm_80 or newer");
    if (a.head_dim != D || (a.dtype != AMPC_FLOAT16 && a.dtype != AMPC_BFLOAT16))
        return ampc_cuda_fail_msg(AMPC_ERR_UNSUPPORTED, "fused attention takes 16-bit operands of head_dim 64");
    if (!aligned(a.q) || !aligned(a.k) || !aligned(a.v) || !aligned(a.o))
        return ampc_cuda_fail_msg(AMPC_ERR_UNSUPPORTED, "fused attention needs 16-byte aligned rows");
    if (a.kv_len == 0)
        return ampc_cuda_fail_msg(AMPC_ERR_UNSUPPORTED, "fused attention: no keys");
    if (a.kv_heads < 1 || a.heads % a.kv_heads != 0)
        return ampc_cuda_fail_msg(AMPC_ERR_INVALID, "fused attention: %lld query heads for %lld key/value heads",
                                  (long long)a.heads, (long long)a.kv_heads);
    if (a.batch * a.heads > 65535 || (a.q_len + TILE - 1) / TILE > INT32_MAX || a.kv_len > INT32_MAX)
        return ampc_cuda_fail_msg(AMPC_ERR_UNSUPPORTED, "fused attention: too many heads or rows for its grid");
    return AMPC_OK;
}

/* fn(T(), std::integral_constant<bool, DROP>()): a's storage type, and whether it drops. */
template <class Fn>
int with_variant(const ampc_attention &a, Fn fn)
{
    const bool drop = a.keep_below < (1u << 24);
    if (a.dtype == AMPC_FLOAT16)
        return drop ? fn(__half(), std::true_type()) : fn(__half(), std::false_type());
    return drop ? fn(__nv_bfloat16(), std::true_type()) : fn(__nv_bfloat16(), std::false_type());
}

dim3 grid_of(int64_t rows, const ampc_attention &a)
{
    return dim3((unsigned)((rows + TILE - 1) / TILE), (unsigned)(a.batch * a.heads));
}

}  // namespace

extern "C" int ampc_cuda_attention(int device, void *stream, const ampc_attention *a)
{
    return ampc_on_device(device, [&] {
        int rc = served(*a, device);
        if (rc != AMPC_OK || a->batch * a->heads * a->q_len == 0)
            return rc;
        return with_variant(*a, [&](auto type, auto drop) {
            using T = decltype(type);
            forward_kernel<T, decltype(drop)::value><<<grid_of(a->q_len, *a), THREADS, 0, as_stream(stream)>>>(*a);
            return ampc_cuda_launched("attention kernel");
        });
    });
}

extern "C" int ampc_cuda_attention_backward(int device, void *stream, const ampc_attention_backward *b)
{
    const ampc_attention &a = b->fwd;
    return ampc_on_device(device, [&] {
        int rc = served(a, device);
        if (rc != AMPC_OK || a.batch * a.heads == 0)
            return rc;
        if (a.q_len == 0)  /* dk and dv are zeros: the composed backward writes them */
            return ampc_cuda_fail_msg(AMPC_ERR_UNSUPPORTED, "fused attention backward: no queries");
        if (!aligned(b->dout) || !aligned(b->dq) || !aligned(b->dk) || !aligned(b->dv))
            return ampc_cuda_fail_msg(AMPC_ERR_UNSUPPORTED, "fused attention needs 16-byte aligned rows");
        const size_t nbytes = (size_t)(a.batch * a.heads * a.q_len) * sizeof(float);
        float *delta = NULL;
        if ((rc = ampc_cuda_alloc(device, nbytes, stream, (void **)&delta)) != AMPC_OK)
            return rc;
        rc = with_variant(a, [&](auto type, auto drop) {
            using T = decltype(type);
            constexpr bool DROP = decltype(drop)::value;
            const cudaStream_t s = as_stream(stream);
            const int64_t rows = a.batch * a.heads * a.q_len;
            delta_kernel<T><<<grid_for(rows, WARPS), THREADS, 0, s>>>(*b, delta);
            int status = ampc_cuda_launched("attention backward kernel (delta)");
            if (status != AMPC_OK)
                return status;
            const dim3 key_tiles((unsigned)((a.kv_len + TILE - 1) / TILE), (unsigned)(a.batch * a.kv_heads));
            dkdv_kernel<T, DROP><<<key_tiles, THREADS, 0, s>>>(*b, delta);
            if ((status = ampc_cuda_launched("attention backward kernel (dk, dv)")) != AMPC_OK)
                return status;
            dq_kernel<T, DROP><<<grid_of(a.q_len, a), THREADS, 0, s>>>(*b, delta);
            return ampc_cuda_launched("attention backward kernel (dq)");
        });
        const int freed = ampc_cuda_free(device, delta, nbytes, stream);
        return rc != AMPC_OK ? rc : freed;
    });
}
