/*
 * Worker threads, started once per context. A run publishes (fn, arg) with a
 * generation counter; workers spin briefly (decode steps come back to back)
 * and then sleep on a condition variable, so an idle context costs nothing.
 * kvp__workers_run neither allocates nor creates threads.
 *
 * Jobs hand out their work dynamically (an atomic item counter), so the
 * caller never waits for a worker that has not started: when the caller's
 * own share is done it closes the run, and waits only for workers that
 * entered it. A worker the OS has not scheduled yet (machines are shared)
 * finds the run closed and goes back to waiting. Entering and closing are
 * sequentially consistent: either the worker sees the run closed, or the
 * caller sees the worker inside.
 */
#define _POSIX_C_SOURCE 200809L
#include "cpu.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <string.h>

/* One spin-wait pause: x86 `pause` (tens to ~140 cycles, by core); on
 * ARM64 `isb`, which stalls for a comparable time, where `yield` is a hint
 * most cores retire at once (SPIN_ITERS would then spin for far less time
 * than on x86). */
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define CPU_RELAX() __asm__ __volatile__("isb" ::: "memory")
#else
#define CPU_RELAX() ((void)0)
#endif

#define SPIN_ITERS 20000

struct kvp__workers {
    kvp_allocator_t alloc;
    int32_t threads;
    int32_t started;
    pthread_t *tids;
    pthread_mutex_t mu;
    pthread_cond_t cv_start, cv_done;
    atomic_uint_fast64_t gen;
    atomic_int entered; /* workers inside the current run */
    atomic_int closed;  /* the current run takes no more workers */
    atomic_int stop;
    kvp__job_fn fn;
    void *arg;
    struct worker_arg *wargs; /* one per worker, alive as long as the pool */
};

typedef struct worker_arg {
    kvp__workers *pool;
    int32_t index;
} worker_arg;

static uint64_t wait_for_generation(kvp__workers *p, uint64_t seen) {
    for (int i = 0; i < SPIN_ITERS; i++) {
        uint64_t g = atomic_load_explicit(&p->gen, memory_order_acquire);
        if (g != seen || atomic_load(&p->stop)) return g;
        CPU_RELAX();
    }
    pthread_mutex_lock(&p->mu);
    uint64_t g;
    while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen && !atomic_load(&p->stop))
        pthread_cond_wait(&p->cv_start, &p->mu);
    pthread_mutex_unlock(&p->mu);
    return g;
}

static void leave_run(kvp__workers *p) {
    if (atomic_fetch_sub(&p->entered, 1) == 1) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_signal(&p->cv_done);
        pthread_mutex_unlock(&p->mu);
    }
}

static void *worker_main(void *varg) {
    worker_arg *w = (worker_arg *)varg;
    kvp__workers *p = w->pool;
    int32_t index = w->index;
    uint64_t seen = 0;
    for (;;) {
        seen = wait_for_generation(p, seen);
        if (atomic_load(&p->stop)) break;
        atomic_fetch_add(&p->entered, 1);
        if (!atomic_load(&p->closed)) p->fn(p->arg, index); /* fn/arg read only inside */
        leave_run(p);
    }
    return NULL;
}

static void stop_workers(kvp__workers *p) {
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->cv_start);
    pthread_mutex_unlock(&p->mu);
    for (int32_t i = 0; i < p->started; i++) pthread_join(p->tids[i], NULL);
}

int kvp__workers_create(const kvp_allocator_t *a, int32_t threads, kvp__workers **out) {
    kvp__workers *p = (kvp__workers *)kvp__calloc(a, 1, sizeof *p, 64);
    if (p == NULL) return KVP_ENOMEM;
    p->alloc = *a;
    p->threads = threads;
    atomic_init(&p->gen, 0);
    atomic_init(&p->entered, 0);
    atomic_init(&p->closed, 1);
    atomic_init(&p->stop, 0);
    int32_t workers = threads - 1;
    worker_arg *args = NULL;
    if (workers > 0) {
        p->tids = (pthread_t *)kvp__calloc(a, (size_t)workers, sizeof *p->tids, 16);
        args = (worker_arg *)kvp__calloc(a, (size_t)workers, sizeof *args, 16);
        if (p->tids == NULL || args == NULL) {
            kvp__free(a, p->tids);
            kvp__free(a, args);
            kvp__free(a, p);
            return KVP_ENOMEM;
        }
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv_start, NULL);
    pthread_cond_init(&p->cv_done, NULL);
    for (int32_t i = 0; i < workers; i++) {
        args[i].pool = p;
        args[i].index = i + 1;
        if (pthread_create(&p->tids[i], NULL, worker_main, &args[i]) != 0) break;
        p->started++;
    }
    p->wargs = args;
    if (p->started != workers) {
        kvp__workers_destroy(p);
        return KVP_ENOMEM;
    }
    *out = p;
    return KVP_OK;
}

void kvp__workers_run(kvp__workers *p, kvp__job_fn fn, void *arg) {
    if (p->threads == 1) {
        fn(arg, 0);
        return;
    }
    p->fn = fn;
    p->arg = arg;
    atomic_store(&p->closed, 0);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
    pthread_cond_broadcast(&p->cv_start);
    pthread_mutex_unlock(&p->mu);
    fn(arg, 0); /* returns when no work is left to claim */
    atomic_store(&p->closed, 1);
    for (int i = 0; i < SPIN_ITERS; i++) {
        if (atomic_load(&p->entered) == 0) return;
        CPU_RELAX();
    }
    pthread_mutex_lock(&p->mu);
    while (atomic_load(&p->entered) != 0) pthread_cond_wait(&p->cv_done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

void kvp__cpu_wait(int spins) {
    if (spins < SPIN_ITERS) CPU_RELAX();
    else sched_yield();
}

void kvp__workers_destroy(kvp__workers *p) {
    if (p == NULL) return;
    if (p->started > 0 && !atomic_load(&p->stop)) stop_workers(p);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv_start);
    pthread_cond_destroy(&p->cv_done);
    kvp_allocator_t a = p->alloc;
    kvp__free(&a, p->tids);
    kvp__free(&a, p->wargs);
    kvp__free(&a, p);
}
