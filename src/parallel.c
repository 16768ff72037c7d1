/*
 * parallel.c: see parallel.h.
 *
 * One job runs at a time. The caller publishes it under the lock and bumps
 * `generation`; sleeping workers wake, take pieces until none are left and go
 * back to sleep. Pieces are large (tens of thousands of elements at least), so
 * one mutex is cheaper and simpler than lock-free counters.
 *
 * After fork() only the forking thread exists in the child: the child handler
 * forgets the workers, and the next job starts new ones.
 */
#define _GNU_SOURCE
#include "parallel.h"

#include <pthread.h>
#include <sched.h>
#include <stdlib.h>

#define MAX_THREADS 256

static struct {
    pthread_mutex_t busy;  /* held by the caller whose job is running */
    pthread_mutex_t lock;  /* guards everything below */
    pthread_cond_t wake;   /* a new job, or quit */
    pthread_cond_t done;   /* the last piece finished */
    pthread_t workers[MAX_THREADS];
    int nworkers;
    int nthreads;          /* configured, caller included; 0 until first asked */
    int quit;
    unsigned long generation;
    /* the current job */
    ampc_range_fn fn;
    void *ctx;
    int64_t n, piece;
    int npieces, next, remaining;
} pool = {
    .busy = PTHREAD_MUTEX_INITIALIZER,
    .lock = PTHREAD_MUTEX_INITIALIZER,
    .wake = PTHREAD_COND_INITIALIZER,
    .done = PTHREAD_COND_INITIALIZER,
};

/* Run pieces of the current job until none are left. Called and returns with
 * the lock held. */
static void run_pieces_locked(void)
{
    while (pool.next < pool.npieces) {
        const int k = pool.next++;
        const int64_t begin = (int64_t)k * pool.piece;
        const int64_t end = begin + pool.piece < pool.n ? begin + pool.piece : pool.n;
        ampc_range_fn fn = pool.fn;
        void *ctx = pool.ctx;
        pthread_mutex_unlock(&pool.lock);
        fn(ctx, begin, end);
        pthread_mutex_lock(&pool.lock);
        if (--pool.remaining == 0)
            pthread_cond_signal(&pool.done);
    }
}

static void *worker_main(void *arg)
{
    unsigned long seen = (unsigned long)(uintptr_t)arg;
    pthread_mutex_lock(&pool.lock);
    for (;;) {
        while (!pool.quit && pool.generation == seen)
            pthread_cond_wait(&pool.wake, &pool.lock);
        if (pool.quit)
            break;
        seen = pool.generation;
        run_pieces_locked();
    }
    pthread_mutex_unlock(&pool.lock);
    return NULL;
}

static void after_fork_child(void)
{
    pthread_mutex_unlock(&pool.lock);
    pthread_mutex_unlock(&pool.busy);
    pool.nworkers = 0;
}

static void before_fork(void)
{
    pthread_mutex_lock(&pool.busy);
    pthread_mutex_lock(&pool.lock);
}

static void after_fork_parent(void)
{
    pthread_mutex_unlock(&pool.lock);
    pthread_mutex_unlock(&pool.busy);
}

static int default_threads(void)
{
    const char *env = getenv("AMPC_NUM_THREADS");
    if (env) {
        char *end;
        const long v = strtol(env, &end, 10);
        if (end != env && *end == '\0' && v >= 1)
            return v < MAX_THREADS ? (int)v : MAX_THREADS;
    }
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        const int c = CPU_COUNT(&set);
        if (c >= 1)
            return c < MAX_THREADS ? c : MAX_THREADS;
    }
    return 1;
}

static pthread_once_t init_once = PTHREAD_ONCE_INIT;

static void pool_init(void)
{
    pthread_atfork(before_fork, after_fork_parent, after_fork_child);
    pthread_mutex_lock(&pool.lock);
    if (pool.nthreads == 0)
        __atomic_store_n(&pool.nthreads, default_threads(), __ATOMIC_RELAXED);
    pthread_mutex_unlock(&pool.lock);
}

int ampc_get_num_threads(void)
{
    pthread_once(&init_once, pool_init);
    return __atomic_load_n(&pool.nthreads, __ATOMIC_RELAXED);
}

void ampc_set_num_threads(int n)
{
    pthread_once(&init_once, pool_init);
    if (n < 1)
        n = 1;
    if (n > MAX_THREADS)
        n = MAX_THREADS;
    pthread_mutex_lock(&pool.busy);
    pthread_mutex_lock(&pool.lock);
    pool.quit = 1;
    pthread_cond_broadcast(&pool.wake);
    const int nworkers = pool.nworkers;
    pthread_mutex_unlock(&pool.lock);
    for (int i = 0; i < nworkers; i++)
        pthread_join(pool.workers[i], NULL);
    pthread_mutex_lock(&pool.lock);
    pool.nworkers = 0;
    pool.quit = 0;
    __atomic_store_n(&pool.nthreads, n, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&pool.lock);
    pthread_mutex_unlock(&pool.busy);
}

void ampc_parallel_for(int64_t n, int64_t min_per_thread, int64_t align,
                       ampc_range_fn fn, void *ctx)
{
    pthread_once(&init_once, pool_init);
    if (min_per_thread < 1)
        min_per_thread = 1;
    if (align < 1)
        align = 1;
    int64_t threads = n / min_per_thread;
    const int configured = __atomic_load_n(&pool.nthreads, __ATOMIC_RELAXED);
    if (threads > configured)
        threads = configured;
    if (threads <= 1 || pthread_mutex_trylock(&pool.busy) != 0) {
        fn(ctx, 0, n);
        return;
    }
    pthread_mutex_lock(&pool.lock);
    if (threads > pool.nthreads)
        threads = pool.nthreads;
    while (pool.nworkers < threads - 1) {
        const uintptr_t seen = pool.generation;
        if (pthread_create(&pool.workers[pool.nworkers], NULL, worker_main, (void *)seen) != 0)
            break;  /* run with the workers we have */
        pool.nworkers++;
    }
    if (threads > pool.nworkers + 1)
        threads = pool.nworkers + 1;

    int64_t piece = (n + threads - 1) / threads;
    piece = (piece + align - 1) / align * align;
    pool.fn = fn;
    pool.ctx = ctx;
    pool.n = n;
    pool.piece = piece;
    pool.npieces = (int)((n + piece - 1) / piece);
    pool.next = 0;
    pool.remaining = pool.npieces;
    pool.generation++;
    pthread_cond_broadcast(&pool.wake);
    run_pieces_locked();
    while (pool.remaining > 0)
        pthread_cond_wait(&pool.done, &pool.lock);
    pool.fn = NULL;
    pool.ctx = NULL;
    pthread_mutex_unlock(&pool.lock);
    pthread_mutex_unlock(&pool.busy);
}
