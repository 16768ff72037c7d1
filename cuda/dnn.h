/*
 * dnn.h: what the cuDNN users (conv.c, batch_norm.c) share: one handle per
 * device, made on first use and bound to the call's stream, a lock around
 * every use of it (a cuDNN handle is not for two threads at once), status
 * codes turned into ampc's, and tensor descriptors from op_descriptors.h's shapes.
 */
#ifndef AMPC_CUDA_DNN_H
#define AMPC_CUDA_DNN_H

#include <cudnn.h>
#include "common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Defined in memory.c: ampc's pool. */
int ampc_cuda_alloc(int device, size_t nbytes, void *stream, void **ptr);
int ampc_cuda_free(int device, void *ptr, size_t nbytes, void *stream);

/* Take the lock and the device's handle, bound to stream; release with
 * ampc_dnn_leave (also after a failure). */
int ampc_dnn_enter(int device, void *stream, cudnnHandle_t *handle);
void ampc_dnn_leave(void);

/* "what: cuDNN's message" as an ampc_status. */
int ampc_dnn_fail(cudnnStatus_t status, const char *what);

#define DNN_TRY(call, what)                             \
    do {                                                \
        const cudnnStatus_t dnn_st_ = (call);           \
        if (dnn_st_ != CUDNN_STATUS_SUCCESS)            \
            return ampc_dnn_fail(dnn_st_, (what));      \
    } while (0)

cudnnDataType_t ampc_dnn_type(int dtype);

/* A 4-D tensor descriptor: dims (n, c, h, w), strides in elements. An
 * AMPC_ERR_INVALID when a size does not fit cuDNN's int. */
int ampc_dnn_tensor(cudnnTensorDescriptor_t *desc, int dtype, const int64_t *dims, const int64_t *strides);

#ifdef __cplusplus
}
#endif

#endif /* AMPC_CUDA_DNN_H */
