/*
 * cuda/plan_cache.c on the CPU (tests/test_cuda_host.py), with a plan that
 * owns heap memory so that the sanitizers see a plan destroyed twice or
 * never: built once per key and found again, keys a byte apart told apart,
 * a failed build destroyed and not kept, AMPC_PLAN_LIMIT plans kept and the
 * next ones temporary. Prints "ok <check>" per check passed.
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "plan_cache.h"
#include "common.h"
#include "check.h"

/* runtime.c's, which needs the CUDA runtime: the message kept for the checks. */
static char message[256];

int ampc_cuda_fail_msg(int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    return status;
}

typedef struct {
    int32_t id;    /* the first bytes */
    int64_t wide;  /* after 4 bytes of padding, zeroed by make_key */
    char tag[8];   /* tag[7]: the last byte */
} test_key;

typedef struct {
    test_key key;
    int *resource;  /* made by build, freed by destroy */
    int filled;
} test_plan;

static int builds, destroys, fail_next;

static void destroy(void *plan)
{
    destroys++;
    free(((test_plan *)plan)->resource);
}

static int build(void *plan, void *ctx)
{
    test_plan *p = (test_plan *)plan;
    builds++;
    CHECK(p->resource == NULL && p->filled == 0);  /* zero but for the key */
    p->resource = malloc(sizeof *p->resource);
    CHECK(p->resource != NULL);
    *p->resource = *(const int *)ctx;
    if (fail_next) {
        fail_next = 0;
        return AMPC_ERR_INVALID;  /* half built: destroy must release the resource */
    }
    p->filled = 1;
    return AMPC_OK;
}

static ampc_plan_cache cache = {
    .plan_size = sizeof(test_plan),
    .key_size = sizeof(test_key),
    .what = "a test plan",
    .destroy = destroy,
};

static test_key make_key(int32_t id, int64_t wide, char tag)
{
    test_key k;
    memset(&k, 0, sizeof k);
    k.id = id, k.wide = wide, k.tag[7] = tag;
    return k;
}

static const int context = 42;  /* what build is handed */

static test_plan *get(test_key k, int *temporary)
{
    void *plan = NULL;
    *temporary = -1;
    CHECK(ampc_plan_get(&cache, &k, build, (void *)&context, &plan, temporary) == AMPC_OK);
    CHECK(plan != NULL && (*temporary == 0 || *temporary == 1));
    test_plan *p = (test_plan *)plan;
    CHECK(memcmp(&p->key, &k, sizeof k) == 0 && p->filled == 1 && *p->resource == 42);
    CHECK((uintptr_t)plan % _Alignof(max_align_t) == 0);
    return p;
}

int main(void)
{
    int temporary;
    test_plan *first = get(make_key(1, 2, 'a'), &temporary);
    CHECK(builds == 1 && !temporary && cache.count == 1);
    CHECK(get(make_key(1, 2, 'a'), &temporary) == first && builds == 1 && !temporary);
    ampc_plan_done(&cache, first, 0);  /* kept: stays */
    CHECK(destroys == 0 && get(make_key(1, 2, 'a'), &temporary) == first && builds == 1);
    puts("ok built once, found again");

    const test_key others[3] = {make_key(2, 2, 'a'), make_key(1, 3, 'a'), make_key(1, 2, 'b')};
    for (int i = 0; i < 3; i++)
        CHECK(get(others[i], &temporary) != first && !temporary);
    CHECK(builds == 4 && cache.count == 4);
    puts("ok keys apart in their first, middle or last bytes, plans apart");

    void *plan = NULL;
    test_key failing = make_key(7, 7, 'f');
    fail_next = 1;
    CHECK(ampc_plan_get(&cache, &failing, build, (void *)&context, &plan, &temporary) == AMPC_ERR_INVALID);
    CHECK(builds == 5 && destroys == 1 && cache.count == 4);
    CHECK(get(failing, &temporary) != NULL && builds == 6 && !temporary && cache.count == 5);
    puts("ok a failed build destroyed, not kept");

    for (int32_t id = 100; cache.count < AMPC_PLAN_LIMIT; id++) {
        get(make_key(id, -id, 'k'), &temporary);
        CHECK(!temporary);
    }
    const int kept_builds = builds;
    test_plan *extra = get(make_key(-1, 0, 't'), &temporary);
    CHECK(temporary && builds == kept_builds + 1 && cache.count == AMPC_PLAN_LIMIT);
    ampc_plan_done(&cache, extra, temporary);
    CHECK(destroys == 2);
    extra = get(make_key(-1, 0, 't'), &temporary);  /* not kept: built again */
    CHECK(temporary && builds == kept_builds + 2);
    ampc_plan_done(&cache, extra, temporary);
    CHECK(destroys == 3);
    CHECK(get(make_key(1, 2, 'a'), &temporary) == first && !temporary);
    for (int32_t id = 100; id < 100 + AMPC_PLAN_LIMIT - 5; id++)
        CHECK(get(make_key(id, -id, 'k'), &temporary)->key.id == id && !temporary);
    CHECK(builds == kept_builds + 2);
    puts("ok AMPC_PLAN_LIMIT kept, then temporary ones destroyed after use");

    CHECK(message[0] == '\0');  /* no allocation failed */
    return 0;
}
