/*
 * common.h: what every file of ampc._cuda shares: turning CUDA errors into an
 * ampc_status plus a message for this thread, and a guard that makes a
 * device current and puts the caller's device back afterwards (ampc must
 * not change the device other libraries in the process see).
 */
#ifndef AMPC_CUDA_COMMON_H
#define AMPC_CUDA_COMMON_H

#include <cuda_runtime.h>
#include "backend_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What a fast path answers when it does not serve the arguments, and the
 * general path should (the ampc_status codes are 0 and negative). */
#define AMPC_NOT_TAKEN 1

/* Record "what: <CUDA's message> (<error name>)" and return the matching
 * status. Clears CUDA's non-sticky last error. */
int ampc_cuda_fail(cudaError_t err, const char *what);
/* Record a formatted message and return `status`. */
int ampc_cuda_fail_msg(int status, const char *fmt, ...);
/* Right after a kernel launch: AMPC_OK, or the launch's error as
 * ampc_cuda_fail reports it ("launching ... : ..."). */
int ampc_cuda_launched(const char *what);

#define AMPC_CUDA_TRY(call, what)                 \
    do {                                          \
        const cudaError_t err_ = (call);          \
        if (err_ != cudaSuccess)                  \
            return ampc_cuda_fail(err_, (what));  \
    } while (0)

/* Time n candidates (launch(ctx, i) queues candidate i on stream) in
 * `rounds` rounds of one run each in turn, so a clock still ramping up or a
 * neighbour's burst falls on them all alike, and keep each one's best run
 * in best_ms[i], in ms: the GPU's time alone, each run queued while the
 * stream is held (timing.cu). Waits for the GPU. */
int ampc_cuda_time_candidates(void *stream, int n, int rounds, int (*launch)(const void *ctx, int i),
                              const void *ctx, float *best_ms);

/* Declare `count` runs of `run` bytes, `step` bytes apart from p on, written
 * by the work queued on stream so far (initcheck.c: for the libraries'
 * kernels whose stores compute-sanitizer's initcheck does not see). */
void ampc_mark_written(void *stream, const void *p, int64_t count, int64_t run, int64_t step);

typedef struct {
    int previous;
    int changed;
} ampc_device_guard;

int ampc_device_enter(int device, ampc_device_guard *guard);
void ampc_device_leave(const ampc_device_guard *guard);

#ifdef __cplusplus
}

/* Run body() (returning an ampc_status) with `device` current, restoring the
 * caller's device after it: the frame of every entry point in cuda/. */
template <class Body>
int ampc_on_device(int device, Body body)
{
    ampc_device_guard guard;
    const int entered = ampc_device_enter(device, &guard);
    if (entered != AMPC_OK)
        return entered;
    const int status = body();
    ampc_device_leave(&guard);
    return status;
}
#endif

#endif /* AMPC_CUDA_COMMON_H */
