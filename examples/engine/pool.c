#define _POSIX_C_SOURCE 200809L
#include "pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

/* Spin this many polls before sleeping: about 100 us, longer than the gap
 * between two kernels of one forward pass, much shorter than human time. */
#define SPIN_POLLS 20000

struct pool {
    int n;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t wake;
    atomic_uint generation; /* bumped once per job */
    atomic_int done;        /* workers finished with the current job */
    atomic_int sleepers;
    int stop;
    pool_fn fn;
    void *arg;
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

/* Wait until the generation moves past `seen`; spin first, then sleep. */
static unsigned wait_next(pool_t *p, unsigned seen) {
    for (int i = 0; i < SPIN_POLLS; i++) {
        unsigned g = atomic_load_explicit(&p->generation, memory_order_acquire);
        if (g != seen) return g;
        cpu_relax();
    }
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add(&p->sleepers, 1);
    unsigned g;
    while ((g = atomic_load(&p->generation)) == seen) pthread_cond_wait(&p->wake, &p->mu);
    atomic_fetch_sub(&p->sleepers, 1);
    pthread_mutex_unlock(&p->mu);
    return g;
}

static void *worker_main(void *raw) {
    worker_arg wa = *(worker_arg *)raw;
    free(raw);
    pool_t *p = wa.p;
    unsigned seen = 0;
    for (;;) {
        seen = wait_next(p, seen);
        if (p->stop) return NULL;
        p->fn(p->arg, wa.tid, p->n);
        atomic_fetch_add_explicit(&p->done, 1, memory_order_release);
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

static void publish(pool_t *p) {
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
    if (atomic_load(&p->sleepers)) pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
}

void pool_run(pool_t *p, pool_fn fn, void *arg) {
    if (p->n == 1) {
        fn(arg, 0, 1);
        return;
    }
    p->fn = fn;
    p->arg = arg;
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    publish(p);
    fn(arg, 0, p->n);
    for (long i = 0; atomic_load_explicit(&p->done, memory_order_acquire) != p->n - 1; i++) {
        if (i < SPIN_POLLS) cpu_relax();
        else sched_yield(); /* the other core may be busy with another tenant */
    }
}

void pool_destroy(pool_t *p) {
    if (!p) return;
    if (p->n > 1) {
        p->stop = 1;
        publish(p);
        for (int t = 1; t < p->n; t++) pthread_join(p->threads[t], NULL);
    }
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->wake);
    free(p->threads);
    free(p);
}

int pool_threads(const pool_t *p) { return p->n; }

void pool_split(long n, long quantum, int tid, int nthreads, long *lo, long *hi) {
    long chunks = (n + quantum - 1) / quantum;
    long a = chunks * tid / nthreads, b = chunks * (tid + 1) / nthreads;
    *lo = a * quantum < n ? a * quantum : n;
    *hi = b * quantum < n ? b * quantum : n;
}
