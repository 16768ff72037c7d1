/*
 * plan_cache.c: hashed buckets of plans (plan_cache.h). Each entry is one
 * allocation, the chain's link and then the owner's plan, aligned for any
 * type; a new plan goes to the front of its bucket's chain.
 */
#include "plan_cache.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "common.h"

struct ampc_plan_entry {
    ampc_plan_entry *next;
    max_align_t plan[];  /* plan_size bytes, beginning with the key */
};

static uint64_t key_hash(const void *key, size_t size)
{
    const unsigned char *p = (const unsigned char *)key;
    uint64_t h = 1469598103934665603ull;  /* FNV-1a */
    for (size_t i = 0; i < size; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static ampc_plan_entry *entry_of(void *plan)
{
    return (ampc_plan_entry *)((char *)plan - offsetof(ampc_plan_entry, plan));
}

static void destroy(const ampc_plan_cache *cache, void *plan)
{
    cache->destroy(plan);
    free(entry_of(plan));
}

int ampc_plan_get(ampc_plan_cache *cache, const void *key, int (*build)(void *plan, void *ctx), void *ctx,
                  void **plan, int *temporary)
{
    const uint64_t slot = key_hash(key, cache->key_size) % AMPC_PLAN_BUCKETS;
    for (ampc_plan_entry *e = cache->buckets[slot]; e != NULL; e = e->next)
        if (memcmp(e->plan, key, cache->key_size) == 0) {
            *plan = e->plan;
            *temporary = 0;
            return AMPC_OK;
        }
    ampc_plan_entry *e = calloc(1, offsetof(ampc_plan_entry, plan) + cache->plan_size);
    if (e == NULL)
        return ampc_cuda_fail_msg(AMPC_ERR_OUT_OF_MEMORY, "out of host memory for %s", cache->what);
    memcpy(e->plan, key, cache->key_size);
    const int rc = build(e->plan, ctx);
    if (rc != AMPC_OK) {
        destroy(cache, e->plan);
        return rc;
    }
    *temporary = cache->count >= AMPC_PLAN_LIMIT;
    if (!*temporary) {
        e->next = cache->buckets[slot];
        cache->buckets[slot] = e;
        cache->count++;
    }
    *plan = e->plan;
    return AMPC_OK;
}

void ampc_plan_done(ampc_plan_cache *cache, void *plan, int temporary)
{
    if (temporary)
        destroy(cache, plan);
}
