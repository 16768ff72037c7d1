/*
 * autocast_lists.c: which ops autocast casts, and how: torch's op lists
 * (aten/src/ATen/autocast_mode.{h,cpp}, by op name without the overload),
 * plus the Python-level names torch's documentation lists for the same ops
 * (__matmul__, __pow__, cross_entropy, ...). An op not named here runs as
 * called, as in torch, unless a user registers a policy for it.
 */
#include "autocast.h"

#include <string.h>

const char *const ampc_policy_names[AMPC_NUM_POLICIES] = {
    [AMPC_POLICY_NONE] = "none",
    [AMPC_POLICY_LOWER_PRECISION_FP] = "lower_precision_fp",
    [AMPC_POLICY_FP32] = "fp32",
    [AMPC_POLICY_FP32_SET_OPT_DTYPE] = "fp32_set_opt_dtype",
    [AMPC_POLICY_FP32_APPEND_DTYPE] = "fp32_append_dtype",
    [AMPC_POLICY_PROMOTE] = "promote",
    [AMPC_POLICY_BANNED] = "banned",
};

int ampc_policy_from_name(const char *name)
{
    for (int p = 0; p < AMPC_NUM_POLICIES; p++)
        if (strcmp(name, ampc_policy_names[p]) == 0)
            return p;
    return -1;
}

const char ampc_banned_bce_message[] =
    "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n"
    "Many models use a sigmoid layer right before the binary cross entropy layer.\n"
    "In this case, combine the two layers using torch.nn.functional.binary_cross_entropy_with_logits\n"
    "or torch.nn.BCEWithLogitsLoss.  binary_cross_entropy_with_logits and BCEWithLogits are\n"
    "safe to autocast.";

#define LOWER(name) {name, AMPC_POLICY_LOWER_PRECISION_FP}
#define FP32(name) {name, AMPC_POLICY_FP32}
#define SET_OPT_DTYPE(name) {name, AMPC_POLICY_FP32_SET_OPT_DTYPE}
#define APPEND_DTYPE(name) {name, AMPC_POLICY_FP32_APPEND_DTYPE}
#define PROMOTE(name) {name, AMPC_POLICY_PROMOTE}
#define BANNED(name) {name, AMPC_POLICY_BANNED}

static const ampc_autocast_listing cuda_list[] = {
    /* lower_precision_fp */
    LOWER("_convolution"), LOWER("conv1d"), LOWER("conv2d"), LOWER("conv3d"), LOWER("conv_tbc"),
    LOWER("conv_transpose1d"), LOWER("conv_transpose2d"), LOWER("conv_transpose3d"), LOWER("convolution"),
    LOWER("cudnn_convolution"), LOWER("cudnn_convolution_transpose"), LOWER("prelu"), LOWER("addmm"),
    LOWER("addmv"), LOWER("addr"), LOWER("matmul"), LOWER("einsum"), LOWER("mm"), LOWER("mv"),
    LOWER("linalg_vecdot"), LOWER("linear"), LOWER("addbmm"), LOWER("baddbmm"), LOWER("bmm"),
    LOWER("chain_matmul"), LOWER("linalg_multi_dot"), LOWER("_thnn_fused_lstm_cell"),
    LOWER("_thnn_fused_gru_cell"), LOWER("lstm_cell"), LOWER("gru_cell"), LOWER("rnn_tanh_cell"),
    LOWER("rnn_relu_cell"), LOWER("_scaled_dot_product_flash_attention"),
    LOWER("scaled_dot_product_attention"),
    LOWER("__matmul__"), LOWER("multi_dot"),
    /* fp32 */
    FP32("acos"), FP32("asin"), FP32("cosh"), FP32("erfinv"), FP32("exp"), FP32("expm1"), FP32("log"),
    FP32("log10"), FP32("log2"), FP32("log1p"), FP32("reciprocal"), FP32("rsqrt"), FP32("sinh"),
    FP32("tan"), FP32("pow"), FP32("softplus"), FP32("layer_norm"), FP32("native_layer_norm"),
    FP32("group_norm"), FP32("frobenius_norm"), FP32("nuclear_norm"), FP32("cosine_similarity"),
    FP32("poisson_nll_loss"), FP32("cosine_embedding_loss"), FP32("nll_loss"), FP32("nll_loss2d"),
    FP32("hinge_embedding_loss"), FP32("kl_div"), FP32("l1_loss"), FP32("smooth_l1_loss"),
    FP32("huber_loss"), FP32("mse_loss"), FP32("margin_ranking_loss"), FP32("multilabel_margin_loss"),
    FP32("soft_margin_loss"), FP32("triplet_margin_loss"), FP32("multi_margin_loss"),
    FP32("binary_cross_entropy_with_logits"), FP32("dist"), FP32("pdist"), FP32("cdist"), FP32("renorm"),
    FP32("logsumexp"), FP32("upsample_nearest1d"), FP32("_upsample_nearest_exact1d"),
    FP32("upsample_nearest2d"), FP32("_upsample_nearest_exact2d"), FP32("upsample_nearest3d"),
    FP32("_upsample_nearest_exact3d"), FP32("upsample_linear1d"), FP32("upsample_bilinear2d"),
    FP32("_upsample_bilinear2d_aa"), FP32("upsample_trilinear3d"), FP32("upsample_bicubic2d"),
    FP32("_upsample_bicubic2d_aa"),
    FP32("__pow__"), FP32("__rpow__"), FP32("__rdiv__"), FP32("__rtruediv__"), FP32("cross_entropy"),
    FP32("normalize"),
    /* fp32_set_opt_dtype */
    SET_OPT_DTYPE("prod"), SET_OPT_DTYPE("softmax"), SET_OPT_DTYPE("log_softmax"), SET_OPT_DTYPE("cumprod"),
    SET_OPT_DTYPE("cumsum"), SET_OPT_DTYPE("linalg_vector_norm"), SET_OPT_DTYPE("linalg_matrix_norm"),
    SET_OPT_DTYPE("sum"), SET_OPT_DTYPE("softmin"),
    /* fp32_append_dtype */
    APPEND_DTYPE("norm"),
    /* promote */
    PROMOTE("addcdiv"), PROMOTE("addcmul"), PROMOTE("atan2"), PROMOTE("bilinear"), PROMOTE("cross"),
    PROMOTE("dot"), PROMOTE("vdot"), PROMOTE("grid_sampler"), PROMOTE("index_put"), PROMOTE("tensordot"),
    PROMOTE("scatter_add"),
    /* banned */
    BANNED("binary_cross_entropy"),
    {NULL, AMPC_POLICY_NONE},
};

static const ampc_autocast_listing cpu_list[] = {
    /* lower_precision_fp */
    LOWER("conv1d"), LOWER("conv2d"), LOWER("conv3d"), LOWER("bmm"), LOWER("mm"), LOWER("linalg_vecdot"),
    LOWER("baddbmm"), LOWER("addmm"), LOWER("_addmm_activation"), LOWER("addbmm"), LOWER("linear"),
    LOWER("_convolution"), LOWER("matmul"), LOWER("conv_tbc"), LOWER("mkldnn_rnn_layer"),
    LOWER("conv_transpose1d"), LOWER("conv_transpose2d"), LOWER("conv_transpose3d"), LOWER("prelu"),
    LOWER("scaled_dot_product_attention"), LOWER("_native_multi_head_attention"),
    LOWER("__matmul__"),
    /* fp32: pooling, sampling, padding and the like */
    FP32("avg_pool3d"), FP32("binary_cross_entropy"), FP32("grid_sampler"), FP32("polar"), FP32("prod"),
    FP32("quantile"), FP32("nanquantile"), FP32("stft"), FP32("cdist"), FP32("grid_sampler_2d"),
    FP32("_grid_sampler_2d_cpu_fallback"), FP32("grid_sampler_3d"), FP32("trace"), FP32("view_as_complex"),
    FP32("cholesky"), FP32("cholesky_inverse"), FP32("cholesky_solve"), FP32("inverse"), FP32("lu_solve"),
    FP32("orgqr"), FP32("ormqr"), FP32("pinverse"), FP32("max_pool3d"), FP32("max_unpool2d"),
    FP32("max_unpool3d"), FP32("adaptive_avg_pool3d"), FP32("reflection_pad1d"), FP32("reflection_pad2d"),
    FP32("replication_pad1d"), FP32("replication_pad2d"), FP32("replication_pad3d"),
    /* fp32: losses */
    FP32("mse_loss"), FP32("cosine_embedding_loss"), FP32("nll_loss"), FP32("nll_loss2d"),
    FP32("hinge_embedding_loss"), FP32("poisson_nll_loss"), FP32("smooth_l1_loss"), FP32("cross_entropy_loss"),
    FP32("l1_loss"), FP32("huber_loss"), FP32("margin_ranking_loss"), FP32("soft_margin_loss"),
    FP32("triplet_margin_loss"), FP32("multi_margin_loss"), FP32("ctc_loss"), FP32("kl_div"),
    FP32("multilabel_margin_loss"), FP32("binary_cross_entropy_with_logits"), FP32("cross_entropy"),
    /* fp32: FFT */
    FP32("fft_fft"), FP32("fft_ifft"), FP32("fft_fft2"), FP32("fft_ifft2"), FP32("fft_fftn"), FP32("fft_ifftn"),
    FP32("fft_rfft"), FP32("fft_irfft"), FP32("fft_rfft2"), FP32("fft_irfft2"), FP32("fft_rfftn"),
    FP32("fft_irfftn"), FP32("fft_hfft"), FP32("fft_ihfft"),
    /* fp32: linear algebra */
    FP32("linalg_cond"), FP32("linalg_matrix_rank"), FP32("linalg_solve"), FP32("linalg_cholesky"),
    FP32("linalg_svdvals"), FP32("linalg_eigvals"), FP32("linalg_eigvalsh"), FP32("linalg_inv"),
    FP32("linalg_householder_product"), FP32("linalg_tensorinv"), FP32("linalg_tensorsolve"),
    /* fp32: other */
    FP32("fake_quantize_per_tensor_affine"), FP32("geqrf"), FP32("_lu_with_info"), FP32("qr"), FP32("svd"),
    FP32("triangular_solve"), FP32("fractional_max_pool2d"), FP32("fractional_max_pool3d"),
    FP32("adaptive_max_pool3d"), FP32("multilabel_margin_loss_forward"), FP32("linalg_qr"),
    FP32("linalg_cholesky_ex"), FP32("linalg_svd"), FP32("linalg_eig"), FP32("linalg_eigh"),
    FP32("linalg_lstsq"), FP32("linalg_inv_ex"),
    /* promote */
    PROMOTE("stack"), PROMOTE("cat"), PROMOTE("index_copy"),
    {NULL, AMPC_POLICY_NONE},
};

const ampc_autocast_listing *const ampc_autocast_lists[AMPC_AUTOCAST_DEVICES] = {
    [AMPC_DEVICE_CPU] = cpu_list,
    [AMPC_DEVICE_CUDA] = cuda_list,
};
