/*
 * dnn.c: cuDNN handles, status codes and tensor descriptors (dnn.h).
 */
#include "dnn.h"

#include <limits.h>
#include <pthread.h>

#define MAX_DEVICES 64

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static cudnnHandle_t handles[MAX_DEVICES];

int ampc_dnn_fail(cudnnStatus_t status, const char *what)
{
    const int code = status == CUDNN_STATUS_ALLOC_FAILED ? AMPC_ERR_OUT_OF_MEMORY
                     : status == CUDNN_STATUS_BAD_PARAM || status == CUDNN_STATUS_NOT_SUPPORTED ? AMPC_ERR_INVALID
                                                                                                 : AMPC_ERR_DEVICE;
    return ampc_cuda_fail_msg(code, "%s: %s", what, cudnnGetErrorString(status));
}

int ampc_dnn_enter(int device, void *stream, cudnnHandle_t *handle)
{
    pthread_mutex_lock(&lock);
    if (device < 0 || device >= MAX_DEVICES)
        return ampc_cuda_fail_msg(AMPC_ERR_INVALID, "device %d is outside 0..%d", device, MAX_DEVICES - 1);
    if (handles[device] == NULL)
        DNN_TRY(cudnnCreate(&handles[device]), "cudnnCreate");
    DNN_TRY(cudnnSetStream(handles[device], (cudaStream_t)stream), "cudnnSetStream");
    *handle = handles[device];
    return AMPC_OK;
}

void ampc_dnn_leave(void) { pthread_mutex_unlock(&lock); }

cudnnDataType_t ampc_dnn_type(int dtype)
{
    switch (dtype) {
    case AMPC_FLOAT16: return CUDNN_DATA_HALF;
    case AMPC_BFLOAT16: return CUDNN_DATA_BFLOAT16;
    case AMPC_FLOAT64: return CUDNN_DATA_DOUBLE;
    default: return CUDNN_DATA_FLOAT;
    }
}

int ampc_dnn_tensor(cudnnTensorDescriptor_t *desc, int dtype, const int64_t *dims, const int64_t *strides)
{
    int d[4], s[4];
    for (int i = 0; i < 4; i++) {
        if (dims[i] > INT_MAX || strides[i] > INT_MAX || strides[i] < 0)
            return ampc_cuda_fail_msg(AMPC_ERR_INVALID, "an array of %lld x %lld x %lld x %lld is beyond cuDNN's "
                                      "32-bit sizes", (long long)dims[0], (long long)dims[1], (long long)dims[2],
                                      (long long)dims[3]);
        d[i] = (int)dims[i];
        s[i] = (int)strides[i];
    }
    DNN_TRY(cudnnCreateTensorDescriptor(desc), "cudnnCreateTensorDescriptor");
    const cudnnStatus_t st =
        cudnnSetTensor4dDescriptorEx(*desc, ampc_dnn_type(dtype), d[0], d[1], d[2], d[3], s[0], s[1], s[2], s[3]);
    if (st != CUDNN_STATUS_SUCCESS) {
        cudnnDestroyTensorDescriptor(*desc);
        *desc = NULL;
        return ampc_dnn_fail(st, "cudnnSetTensor4dDescriptorEx");
    }
    return AMPC_OK;
}
