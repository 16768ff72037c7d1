/* Stands in for CUDA's cuda_fp16.h (see cuda_runtime.h beside it): cuda_model.h's 16-bit types. */
#include "cuda_model.h"
