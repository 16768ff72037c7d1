/*
 * plan_cache.h: the plans conv.c (cuDNN) and gemm.c (cuBLASLt) keep for the
 * process's life, found by their key's bytes (plan_cache.c). A key's first
 * call builds its plan and the cache keeps it; once a cache holds
 * AMPC_PLAN_LIMIT plans, a new key's plan is built for its call alone and
 * destroyed after it (a process that meets shapes without end stays
 * bounded). Not thread-safe: the caller holds its own lock around every call
 * here and every use of a plan.
 */
#ifndef AMPC_CUDA_PLAN_CACHE_H
#define AMPC_CUDA_PLAN_CACHE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define AMPC_PLAN_BUCKETS 256
#define AMPC_PLAN_LIMIT 4096  /* beyond it, plans are made per call */

typedef struct ampc_plan_entry ampc_plan_entry;  /* a plan and its bucket's chain (plan_cache.c) */

typedef struct {
    /* Set by the owner (static initialisers; the rest starts zero): */
    size_t plan_size;  /* the owner's plan struct, which begins with its key */
    size_t key_size;   /* compared as bytes: the owner zeroes a key's padding */
    const char *what;  /* "a cuDNN plan", for the out-of-memory message */
    /* Release what build made of a plan (a plan starts zeroed but for its
     * key, and build may fail half way), not the plan's memory. */
    void (*destroy)(void *plan);

    ampc_plan_entry *buckets[AMPC_PLAN_BUCKETS];
    int count;
} ampc_plan_cache;

/* The plan for key in *plan: the one kept, or a new one that build(plan,
 * ctx) fills (an ampc_status; on failure the plan is destroyed and its
 * status returned), kept, or where the cache is full made for this call
 * alone (*temporary set). */
int ampc_plan_get(ampc_plan_cache *cache, const void *key, int (*build)(void *plan, void *ctx), void *ctx,
                  void **plan, int *temporary);

/* After the call that used it: a temporary plan is destroyed, a kept one
 * stays. */
void ampc_plan_done(ampc_plan_cache *cache, void *plan, int temporary);

#ifdef __cplusplus
}
#endif

#endif /* AMPC_CUDA_PLAN_CACHE_H */
