/*
 * A persistent thread pool for fork-join kernels: pool_run() runs fn on every
 * thread (the caller is thread 0) and returns when all have finished.
 *
 * Workers spin briefly between jobs (a forward pass dispatches ~150 jobs per
 * step, too many to pay a futex wake-up each) and then sleep on a condition
 * variable, so an idle engine costs no CPU.
 */
#ifndef ENGINE_POOL_H
#define ENGINE_POOL_H

typedef struct pool pool_t;
typedef void (*pool_fn)(void *arg, int tid, int nthreads);

/* nthreads >= 1 (1 = no worker threads). NULL on failure. */
pool_t *pool_create(int nthreads);
void pool_destroy(pool_t *p);
int pool_threads(const pool_t *p);
void pool_run(pool_t *p, pool_fn fn, void *arg);

/* The half-open share [*lo, *hi) of n items for thread tid of nthreads,
 * rounded to multiples of `quantum` so rows stay grouped. */
void pool_split(long n, long quantum, int tid, int nthreads, long *lo, long *hi);

#endif
