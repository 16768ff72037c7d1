/*
 * Stands in for CUDA's cuda_runtime.h where tests/emulated_cuda compiles
 * ops.cuh and packs.cuh for the CPU (-I this folder): cuda_model.h, and the
 * runtime's types that the headers' host declarations name. Nothing here
 * runs on a GPU or links against CUDA.
 */
#ifndef AMPC_SHADOW_CUDA_RUNTIME_H
#define AMPC_SHADOW_CUDA_RUNTIME_H

#include "cuda_model.h"

typedef int cudaError_t;
constexpr cudaError_t cudaSuccess = 0;
typedef struct CUstream_st *cudaStream_t;

#endif /* AMPC_SHADOW_CUDA_RUNTIME_H */
