/*
 * timing.cu: timing the candidates of a first call (cuBLASLt's algorithms,
 * cuDNN's engines, batch norm's two paths) on the GPU alone.
 *
 * Events bracket whatever the GPU does between them, and a candidate's launch
 * may cost the host more than its kernels cost the GPU: cuDNN's batch norm
 * makes descriptors, asks for sizes and fills scratch before it launches.
 * With an idle GPU that host time lands between the start event and the
 * kernels and counts against the candidate. So each run is queued behind a
 * one-thread kernel that holds the stream for HOLD_NS: the host records the
 * start event, queues the candidate and the stop event while the GPU is still
 * held, and the interval measures the candidate's kernels back to back.
 */
#include "common.h"

#include <math.h>

/* Longer than any candidate's host work (tens of microseconds), short
 * against the runs it precedes (a first call times a few dozen). */
static const unsigned long long HOLD_NS = 200000;

__global__ void hold_stream_kernel(unsigned long long ns)
{
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}

/* One run of candidate i: hold, start, the candidate, stop; its GPU time in *ms. */
static int time_one_run(cudaStream_t stream, cudaEvent_t start, cudaEvent_t stop,
                        int (*launch)(const void *ctx, int i), const void *ctx, int i, float *ms)
{
    hold_stream_kernel<<<1, 1, 0, stream>>>(HOLD_NS);
    int rc = ampc_cuda_launched("launching the kernel that holds the stream while a candidate is queued");
    if (rc != AMPC_OK)
        return rc;
    AMPC_CUDA_TRY(cudaEventRecord(start, stream), "timing a candidate: cudaEventRecord");
    if ((rc = launch(ctx, i)) != AMPC_OK)
        return rc;
    AMPC_CUDA_TRY(cudaEventRecord(stop, stream), "timing a candidate: cudaEventRecord");
    AMPC_CUDA_TRY(cudaEventSynchronize(stop), "timing a candidate: cudaEventSynchronize");
    AMPC_CUDA_TRY(cudaEventElapsedTime(ms, start, stop), "timing a candidate: cudaEventElapsedTime");
    return AMPC_OK;
}

extern "C" int ampc_cuda_time_candidates(void *stream, int n, int rounds, int (*launch)(const void *ctx, int i),
                                         const void *ctx, float *best_ms)
{
    cudaEvent_t start = NULL, stop = NULL;
    cudaError_t err = cudaEventCreate(&start);
    if (err == cudaSuccess)
        err = cudaEventCreate(&stop);
    int rc = err == cudaSuccess ? AMPC_OK : ampc_cuda_fail(err, "creating the events that time candidates");
    for (int i = 0; i < n; i++)
        best_ms[i] = INFINITY;
    for (int r = 0; r < rounds && rc == AMPC_OK; r++)
        for (int i = 0; i < n && rc == AMPC_OK; i++) {
            float ms = INFINITY;
            rc = time_one_run((cudaStream_t)stream, start, stop, launch, ctx, i, &ms);
            if (rc == AMPC_OK && ms < best_ms[i])
                best_ms[i] = ms;
        }
    if (start != NULL)
        cudaEventDestroy(start);
    if (stop != NULL)
        cudaEventDestroy(stop);
    return rc;
}
