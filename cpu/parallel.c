/*
 * parallel.c: see parallel.h.
 *
 * One job runs at a time. The caller publishes it under the lock and bumps
 * `generation`; workers take pieces until none are left, then wait for the
 * next. Pieces are large (tens of thousands of elements at least), so one
 * mutex is cheaper and simpler than lock-free counters.
 *
 * Waiting spins for SPIN_NS before it sleeps, on both sides: a worker for the
 * next job, the caller for the last piece. A condition variable's wake-up took
 * tens of µs on the CI VM, as long as a whole 2-thread job on 4 MB; ops come
 * one after another, so the next job usually arrives within the spin (torch's
 * OpenMP workers spin too). Only `generation`, `quit` and `remaining` are read
 * outside the lock, atomically.
 *
 * After fork() only the forking thread exists in the child: the child handler
 * forgets the workers, and the next job starts new ones.
 */
#define _GNU_SOURCE
#include "cpu/parallel.h"

#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <time.h>

#define MAX_THREADS 256
#define SPIN_NS 50000  /* how long a waiting thread stays on its CPU */

static struct {
    pthread_mutex_t busy;  /* held by the caller whose job is running */
    pthread_mutex_t lock;  /* guards everything below */
    pthread_cond_t wake;   /* a new job, or quit */
    pthread_cond_t done;   /* the last piece finished */
    pthread_t workers[MAX_THREADS];
    int nworkers;
    int nthreads;          /* configured, caller included; 0 until first asked */
    int quit;
    int sleepers;          /* workers waiting on `wake` */
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
        if (__atomic_sub_fetch(&pool.remaining, 1, __ATOMIC_RELEASE) == 0)
            pthread_cond_signal(&pool.done);
    }
}

static int64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Spins (without the lock) for up to SPIN_NS while done(arg) is false. */
static void spin_while_not(int (*done)(const void *), const void *arg)
{
    const int64_t until = now_ns() + SPIN_NS;
    for (int i = 1; !done(arg); i++) {
        cpu_relax();
        if (i % 64 == 0 && now_ns() > until)
            return;
    }
}

static int job_after(const void *seen)
{
    return __atomic_load_n(&pool.generation, __ATOMIC_ACQUIRE) != *(const unsigned long *)seen ||
           __atomic_load_n(&pool.quit, __ATOMIC_RELAXED);
}

static int job_finished(const void *unused)
{
    (void)unused;
    return __atomic_load_n(&pool.remaining, __ATOMIC_ACQUIRE) == 0;
}

static void *worker_main(void *arg)
{
    unsigned long seen = (unsigned long)(uintptr_t)arg;
    for (;;) {
        spin_while_not(job_after, &seen);
        pthread_mutex_lock(&pool.lock);
        while (!pool.quit && pool.generation == seen) {
            pool.sleepers++;
            pthread_cond_wait(&pool.wake, &pool.lock);
            pool.sleepers--;
        }
        if (pool.quit) {
            pthread_mutex_unlock(&pool.lock);
            return NULL;
        }
        seen = pool.generation;
        run_pieces_locked();
        pthread_mutex_unlock(&pool.lock);
    }
}

static void after_fork_child(void)
{
    pthread_mutex_unlock(&pool.lock);
    pthread_mutex_unlock(&pool.busy);
    pool.nworkers = 0;
    pool.sleepers = 0;
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
    __atomic_store_n(&pool.quit, 1, __ATOMIC_RELAXED);
    pthread_cond_broadcast(&pool.wake);
    const int nworkers = pool.nworkers;
    pthread_mutex_unlock(&pool.lock);
    for (int i = 0; i < nworkers; i++)
        pthread_join(pool.workers[i], NULL);
    pthread_mutex_lock(&pool.lock);
    pool.nworkers = 0;
    __atomic_store_n(&pool.quit, 0, __ATOMIC_RELAXED);
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
    __atomic_store_n(&pool.remaining, pool.npieces, __ATOMIC_RELAXED);
    __atomic_store_n(&pool.generation, pool.generation + 1, __ATOMIC_RELEASE);
    if (pool.sleepers > 0)
        pthread_cond_broadcast(&pool.wake);
    run_pieces_locked();
    if (pool.remaining > 0) {
        pthread_mutex_unlock(&pool.lock);
        spin_while_not(job_finished, NULL);
        pthread_mutex_lock(&pool.lock);
    }
    while (pool.remaining > 0)
        pthread_cond_wait(&pool.done, &pool.lock);
    pool.fn = NULL;
    pool.ctx = NULL;
    pthread_mutex_unlock(&pool.lock);
    pthread_mutex_unlock(&pool.busy);
}
