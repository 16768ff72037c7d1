/*
 * runtime.c: errors, devices, versions and streams for ampc._cuda, on the
 * CUDA runtime (linked statically, so the module loads even without a
 * driver and reports cudaErrorInsufficientDriver instead).
 */
#include "common.h"

#include <stdarg.h>
#include <stdio.h>
#include <cublasLt.h>
#include <cudnn.h>

static _Thread_local char last_error[512];

const char *ampc_cuda_last_error(void) { return last_error; }

int ampc_cuda_fail_msg(int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return status;
}

static int status_of(cudaError_t err)
{
    switch (err) {
    case cudaErrorMemoryAllocation:
        return AMPC_ERR_OUT_OF_MEMORY;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
        return AMPC_ERR_NO_DEVICE;
    default:
        return AMPC_ERR_DEVICE;
    }
}

/* The errors after which the context is unusable: a kernel faulted, and
 * every later call in the process answers the same error. */
static int is_sticky(cudaError_t err)
{
    switch (err) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
    case cudaErrorLaunchTimeout:
    case cudaErrorECCUncorrectable:
        return 1;
    default:
        return 0;
    }
}

int ampc_cuda_fail(cudaError_t err, const char *what)
{
    (void)cudaGetLastError();  /* a sticky error stays; a plain one is reported once */
    return ampc_cuda_fail_msg(status_of(err), "%s: %s (%s)%s", what, cudaGetErrorString(err), cudaGetErrorName(err),
                              is_sticky(err) ? "; the CUDA context is unusable from now on (a kernel faulted): "
                                               "every later GPU call in this process fails the same way, so "
                                               "restart the process" : "");
}

int ampc_cuda_launched(const char *what)
{
    const cudaError_t err = cudaGetLastError();
    return err == cudaSuccess ? AMPC_OK : ampc_cuda_fail(err, what);
}

int ampc_device_enter(int device, ampc_device_guard *guard)
{
    guard->changed = 0;
    AMPC_CUDA_TRY(cudaGetDevice(&guard->previous), "cudaGetDevice");
    if (guard->previous != device) {
        AMPC_CUDA_TRY(cudaSetDevice(device), "cudaSetDevice");
        guard->changed = 1;
    }
    return AMPC_OK;
}

void ampc_device_leave(const ampc_device_guard *guard)
{
    if (guard->changed)
        (void)cudaSetDevice(guard->previous);
}

int ampc_cuda_device_count(int *count)
{
    const cudaError_t err = cudaGetDeviceCount(count);
    if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver) {
        /* No GPU here: an answer, not a failure. */
        (void)cudaGetLastError();
        *count = 0;
        return AMPC_OK;
    }
    AMPC_CUDA_TRY(err, "cudaGetDeviceCount");
    return AMPC_OK;
}

int ampc_cuda_get_device_props(int device, ampc_device_props *props)
{
    struct cudaDeviceProp p;
    AMPC_CUDA_TRY(cudaGetDeviceProperties(&p, device), "cudaGetDeviceProperties");
    snprintf(props->name, sizeof props->name, "%s", p.name);
    props->major = p.major;
    props->minor = p.minor;
    props->multiprocessors = p.multiProcessorCount;
    props->total_memory = p.totalGlobalMem;
    return AMPC_OK;
}

int ampc_cuda_get_versions(ampc_backend_versions *v)
{
    AMPC_CUDA_TRY(cudaRuntimeGetVersion(&v->runtime), "cudaRuntimeGetVersion");
    v->runtime_built = CUDART_VERSION;
    if (cudaDriverGetVersion(&v->driver) != cudaSuccess)
        v->driver = 0;
    v->cublaslt = (long)cublasLtGetVersion();
    v->cudnn = (long)cudnnGetVersion();
    v->cudnn_built = CUDNN_VERSION;
    return AMPC_OK;
}

int ampc_cuda_synchronize(int device)
{
    ampc_device_guard guard;
    int status = ampc_device_enter(device, &guard);
    if (status != AMPC_OK)
        return status;
    const cudaError_t err = cudaDeviceSynchronize();
    ampc_device_leave(&guard);
    return err == cudaSuccess ? AMPC_OK : ampc_cuda_fail(err, "cudaDeviceSynchronize");
}

int ampc_cuda_stream_device(void *stream, int *device)
{
    if ((uintptr_t)stream <= 2) {  /* the default streams exist on every device */
        *device = -1;
        return AMPC_OK;
    }
    AMPC_CUDA_TRY(cudaStreamGetDevice((cudaStream_t)stream, device), "cudaStreamGetDevice");
    return AMPC_OK;
}

int ampc_cuda_stream_wait(int device, void *waiter, void *signaller)
{
    if (waiter == signaller)
        return AMPC_OK;
    ampc_device_guard guard;
    int status = ampc_device_enter(device, &guard);
    if (status != AMPC_OK)
        return status;
    cudaEvent_t event;
    cudaError_t err = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
    if (err == cudaSuccess) {
        err = cudaEventRecord(event, (cudaStream_t)signaller);
        if (err == cudaSuccess)
            err = cudaStreamWaitEvent((cudaStream_t)waiter, event, 0);
        /* Destroying right away is allowed: the wait keeps what it needs. */
        const cudaError_t destroy = cudaEventDestroy(event);
        if (err == cudaSuccess)
            err = destroy;
    }
    ampc_device_leave(&guard);
    return err == cudaSuccess ? AMPC_OK : ampc_cuda_fail(err, "ordering two streams");
}

int ampc_cuda_copy(int dst_device, void *dst, int src_device, const void *src, size_t nbytes, void *stream)
{
    if (nbytes == 0)
        return AMPC_OK;
    const int device = dst_device >= 0 ? dst_device : src_device;
    ampc_device_guard guard;
    int status = ampc_device_enter(device, &guard);
    if (status != AMPC_OK)
        return status;
    cudaStream_t s = (cudaStream_t)stream;
    cudaError_t err;
    if (dst_device >= 0 && src_device >= 0 && dst_device != src_device)
        err = cudaMemcpyPeerAsync(dst, dst_device, src, src_device, nbytes, s);
    else
        err = cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, s);
    if (err == cudaSuccess && dst_device < 0)
        err = cudaStreamSynchronize(s);  /* the host reads it next */
    ampc_device_leave(&guard);
    return err == cudaSuccess ? AMPC_OK : ampc_cuda_fail(err, "copying");
}

int ampc_cuda_memset(int device, void *ptr, int value, size_t nbytes, void *stream)
{
    if (nbytes == 0)
        return AMPC_OK;
    ampc_device_guard guard;
    int status = ampc_device_enter(device, &guard);
    if (status != AMPC_OK)
        return status;
    const cudaError_t err = cudaMemsetAsync(ptr, value, nbytes, (cudaStream_t)stream);
    ampc_device_leave(&guard);
    return err == cudaSuccess ? AMPC_OK : ampc_cuda_fail(err, "cudaMemsetAsync");
}
