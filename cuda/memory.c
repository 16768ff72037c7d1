/*
 * memory.c: ampc's GPU memory, one stream-ordered pool per device
 * (cudaMallocFromPoolAsync). The pool keeps freed blocks instead of handing
 * them back to the driver after every synchronisation (release threshold:
 * unlimited), which is what makes it as cheap as a caching allocator; when
 * an allocation fails, the pool is trimmed and the allocation tried once
 * more. It is ampc's own pool, not the device's default one, so its settings
 * touch no other library.
 *
 * `allocated` counts what live arrays hold, each rounded up to 512 bytes as
 * torch.cuda.memory_allocated counts its blocks, so the two are comparable.
 */
#include "common.h"

#include <pthread.h>
#include <stdint.h>

#define MAX_DEVICES 64
#define ACCOUNTING_UNIT 512

static struct {
    cudaMemPool_t pool;
    int64_t allocated;
    int64_t peak;
} devices[MAX_DEVICES];

static pthread_mutex_t create_lock = PTHREAD_MUTEX_INITIALIZER;

static int64_t accounted(size_t nbytes)
{
    return (int64_t)((nbytes + ACCOUNTING_UNIT - 1) / ACCOUNTING_UNIT * ACCOUNTING_UNIT);
}

static int check_device(int device)
{
    if (device < 0 || device >= MAX_DEVICES)
        return ampc_cuda_fail_msg(AMPC_ERR_INVALID, "device %d is outside 0..%d", device,
                                  MAX_DEVICES - 1);
    return AMPC_OK;
}

/* The device's pool, created on first use. Called with the device current. */
static int get_pool(int device, cudaMemPool_t *pool)
{
    pthread_mutex_lock(&create_lock);
    if (devices[device].pool == NULL) {
        struct cudaMemPoolProps props = {0};
        props.allocType = cudaMemAllocationTypePinned;
        props.location.type = cudaMemLocationTypeDevice;
        props.location.id = device;
        cudaMemPool_t created;
        cudaError_t err = cudaMemPoolCreate(&created, &props);
        if (err == cudaSuccess) {
            uint64_t threshold = UINT64_MAX;
            err = cudaMemPoolSetAttribute(created, cudaMemPoolAttrReleaseThreshold, &threshold);
            if (err == cudaSuccess)
                devices[device].pool = created;
            else
                (void)cudaMemPoolDestroy(created);
        }
        if (err != cudaSuccess) {
            pthread_mutex_unlock(&create_lock);
            return ampc_cuda_fail(err, "creating ampc's memory pool");
        }
    }
    *pool = devices[device].pool;
    pthread_mutex_unlock(&create_lock);
    return AMPC_OK;
}

static void account(int device, int64_t delta)
{
    const int64_t now = __atomic_add_fetch(&devices[device].allocated, delta, __ATOMIC_RELAXED);
    int64_t peak = __atomic_load_n(&devices[device].peak, __ATOMIC_RELAXED);
    while (now > peak &&
           !__atomic_compare_exchange_n(&devices[device].peak, &peak, now, 1, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED)) {
    }
}

int ampc_cuda_alloc(int device, size_t nbytes, void *stream, void **ptr)
{
    int status = check_device(device);
    if (status != AMPC_OK)
        return status;
    ampc_device_guard guard;
    if ((status = ampc_device_enter(device, &guard)) != AMPC_OK)
        return status;
    cudaMemPool_t pool = NULL;
    if ((status = get_pool(device, &pool)) == AMPC_OK) {
        cudaError_t err = cudaMallocFromPoolAsync(ptr, nbytes, pool, (cudaStream_t)stream);
        if (err == cudaErrorMemoryAllocation) {
            /* Give back what the pool caches (after the frees queued so far
             * have run) and try once more. */
            (void)cudaGetLastError();
            err = cudaDeviceSynchronize();
            if (err == cudaSuccess)
                err = cudaMemPoolTrimTo(pool, 0);
            if (err == cudaSuccess)
                err = cudaMallocFromPoolAsync(ptr, nbytes, pool, (cudaStream_t)stream);
        }
        if (err == cudaSuccess)
            account(device, accounted(nbytes));
        else if (err == cudaErrorMemoryAllocation)
            status = ampc_cuda_fail_msg(AMPC_ERR_OUT_OF_MEMORY,
                                        "out of memory allocating %zu bytes on cuda:%d "
                                        "(ampc holds %lld bytes)", nbytes, device,
                                        (long long)devices[device].allocated);
        else
            status = ampc_cuda_fail(err, "cudaMallocFromPoolAsync");
    }
    ampc_device_leave(&guard);
    return status;
}

int ampc_cuda_free(int device, void *ptr, size_t nbytes, void *stream)
{
    int status = check_device(device);
    if (status != AMPC_OK)
        return status;
    account(device, -accounted(nbytes));
    ampc_device_guard guard;
    if ((status = ampc_device_enter(device, &guard)) != AMPC_OK)
        return status;
    const cudaError_t err = cudaFreeAsync(ptr, (cudaStream_t)stream);
    ampc_device_leave(&guard);
    return err == cudaSuccess ? AMPC_OK : ampc_cuda_fail(err, "cudaFreeAsync");
}

int ampc_cuda_get_memory_stats(int device, ampc_memory_stats *stats)
{
    int status = check_device(device);
    if (status != AMPC_OK)
        return status;
    stats->allocated = __atomic_load_n(&devices[device].allocated, __ATOMIC_RELAXED);
    stats->peak = __atomic_load_n(&devices[device].peak, __ATOMIC_RELAXED);
    stats->reserved = 0;
    pthread_mutex_lock(&create_lock);
    cudaMemPool_t pool = devices[device].pool;
    pthread_mutex_unlock(&create_lock);
    if (pool != NULL) {
        uint64_t reserved = 0;
        AMPC_CUDA_TRY(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved),
                      "reading the pool's reserved memory");
        stats->reserved = (int64_t)reserved;
    }
    return AMPC_OK;
}

int ampc_cuda_reset_peak_memory(int device)
{
    int status = check_device(device);
    if (status != AMPC_OK)
        return status;
    __atomic_store_n(&devices[device].peak, __atomic_load_n(&devices[device].allocated, __ATOMIC_RELAXED),
                     __ATOMIC_RELAXED);
    return AMPC_OK;
}
