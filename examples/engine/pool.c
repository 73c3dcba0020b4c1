#define _POSIX_C_SOURCE 200809L
#include "pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

/* Polls before a worker sleeps: about 100 us, longer than the gap between
 * two kernels of one forward pass, much shorter than human time. */
#define SPIN_POLLS 20000

/*
 * The job is published through `ticket` = generation << 32 | next chunk.
 * A thread claims chunk i of generation g by a CAS from (g, i) to (g, i+1).
 * Before writing a new job's fields, the caller closes the ticket at
 * (g+1, CLOSED): a slow thread that read the old ticket then fails its CAS,
 * so no chunk is ever claimed with fields of another job, and a successful
 * claim proves job g is still running (its caller waits for every claimed
 * chunk). The fields are atomics because such a slow thread may read them
 * while they are rewritten (it then discards what it read).
 */
#define CLOSED 0xFFFFFFFFu
struct pool {
    int n;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t wake;
    _Atomic uint64_t ticket;
    _Atomic long n_chunks;
    _Atomic(pool_fn) fn;
    _Atomic(void *) arg;
    atomic_long completed;
    atomic_int sleepers;
    atomic_int stop;
    atomic_int park; /* set by pool_park, cleared by pool_run */
};

typedef struct {
    pool_t *p;
    int tid;
} worker_arg;

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Claim and run chunks of the job published as generation `gen`. */
static void work_on(pool_t *p, uint32_t gen, int tid) {
    for (;;) {
        uint64_t t = atomic_load_explicit(&p->ticket, memory_order_acquire);
        if ((uint32_t)(t >> 32) != gen) return;
        long n = atomic_load_explicit(&p->n_chunks, memory_order_relaxed);
        pool_fn fn = atomic_load_explicit(&p->fn, memory_order_relaxed);
        void *arg = atomic_load_explicit(&p->arg, memory_order_relaxed);
        if ((uint32_t)t == CLOSED) { /* being published: a few stores away */
            cpu_relax();
            continue;
        }
        long i = (long)(uint32_t)t;
        if (i >= n) return;
        atomic_thread_fence(memory_order_acquire); /* see pool_run's fence */
        if (!atomic_compare_exchange_weak_explicit(&p->ticket, &t, t + 1, memory_order_acq_rel,
                                                   memory_order_relaxed))
            continue;
        fn(arg, i, tid);
        atomic_fetch_add_explicit(&p->completed, 1, memory_order_release);
    }
}

/* Wait until the generation moves past `seen`; spin first, then sleep. */
static uint32_t wait_next(pool_t *p, uint32_t seen) {
    for (int i = 0; i < SPIN_POLLS; i++) {
        uint32_t g = (uint32_t)(atomic_load_explicit(&p->ticket, memory_order_acquire) >> 32);
        if (g != seen || atomic_load(&p->stop)) return g;
        if (atomic_load_explicit(&p->park, memory_order_relaxed)) break;
        cpu_relax();
    }
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add(&p->sleepers, 1);
    uint32_t g;
    while ((g = (uint32_t)(atomic_load(&p->ticket) >> 32)) == seen && !atomic_load(&p->stop))
        pthread_cond_wait(&p->wake, &p->mu);
    atomic_fetch_sub(&p->sleepers, 1);
    pthread_mutex_unlock(&p->mu);
    return g;
}

static void *worker_main(void *raw) {
    worker_arg wa = *(worker_arg *)raw;
    free(raw);
    uint32_t seen = 0;
    for (;;) {
        seen = wait_next(wa.p, seen);
        if (atomic_load(&wa.p->stop)) return NULL;
        work_on(wa.p, seen, wa.tid);
    }
}

pool_t *pool_create(int nthreads) {
    if (nthreads < 1) return NULL;
    pool_t *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n = nthreads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    p->threads = calloc((size_t)nthreads, sizeof *p->threads);
    if (!p->threads) {
        free(p);
        return NULL;
    }
    for (int t = 1; t < nthreads; t++) {
        worker_arg *wa = malloc(sizeof *wa);
        if (wa) *wa = (worker_arg){p, t};
        if (!wa || pthread_create(&p->threads[t], NULL, worker_main, wa) != 0) {
            free(wa);
            p->n = t; /* threads 1..t-1 started; stop those */
            pool_destroy(p);
            return NULL;
        }
    }
    return p;
}

static void wake_all(pool_t *p) {
    if (!atomic_load(&p->sleepers)) return;
    pthread_mutex_lock(&p->mu);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
}

void pool_run(pool_t *p, pool_fn fn, void *arg, long n_chunks) {
    if (n_chunks <= 0) return;
    if (n_chunks >= (long)CLOSED) n_chunks = (long)CLOSED - 1; /* never: callers pass far fewer */
    if (p->n == 1 || n_chunks == 1) {
        for (long i = 0; i < n_chunks; i++) fn(arg, i, 0);
        return;
    }
    atomic_store_explicit(&p->park, 0, memory_order_relaxed);
    uint32_t gen = (uint32_t)(atomic_load(&p->ticket) >> 32) + 1;
    atomic_store(&p->ticket, (uint64_t)gen << 32 | CLOSED);
    /* pairs with the fence in work_on: whoever sees a new field sees CLOSED */
    atomic_thread_fence(memory_order_release);
    atomic_store_explicit(&p->fn, fn, memory_order_relaxed);
    atomic_store_explicit(&p->arg, arg, memory_order_relaxed);
    atomic_store_explicit(&p->n_chunks, n_chunks, memory_order_relaxed);
    atomic_store_explicit(&p->completed, 0, memory_order_relaxed);
    /* under the mutex, so a worker about to sleep cannot miss it */
    pthread_mutex_lock(&p->mu);
    atomic_store_explicit(&p->ticket, (uint64_t)gen << 32, memory_order_release);
    pthread_mutex_unlock(&p->mu);
    wake_all(p);
    work_on(p, gen, 0);
    for (long i = 0; atomic_load_explicit(&p->completed, memory_order_acquire) != n_chunks; i++) {
        if (i < SPIN_POLLS) cpu_relax();
        else sched_yield(); /* a worker holding a chunk was descheduled */
    }
}

void pool_destroy(pool_t *p) {
    if (!p) return;
    if (p->n > 1) {
        pthread_mutex_lock(&p->mu);
        atomic_store(&p->stop, 1);
        pthread_cond_broadcast(&p->wake);
        pthread_mutex_unlock(&p->mu);
        for (int t = 1; t < p->n; t++) pthread_join(p->threads[t], NULL);
    }
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->wake);
    free(p->threads);
    free(p);
}

int pool_threads(const pool_t *p) { return p->n; }

void pool_park(pool_t *p) {
    if (p->n > 1) atomic_store_explicit(&p->park, 1, memory_order_relaxed);
}
