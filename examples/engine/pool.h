/*
 * A persistent thread pool for fork-join kernels: pool_run() splits a job
 * into chunks that the caller (thread 0) and the workers take from a shared
 * counter, and returns when every chunk is done.
 *
 * Chunks are claimed, not assigned: on a shared machine a worker may be
 * descheduled for milliseconds, and a forward pass dispatches ~150 jobs per
 * step; with static shares every job would wait for it. Here the threads
 * that run take the work, and the caller waits only for chunks a worker has
 * actually started. Which thread runs a chunk does not change its result.
 *
 * Workers spin briefly between jobs, then sleep on a condition variable, so
 * an idle engine costs no CPU.
 */
#ifndef ENGINE_POOL_H
#define ENGINE_POOL_H

typedef struct pool pool_t;
/* Run chunk `chunk` (0 .. n_chunks-1) on thread `tid` (0 .. threads-1; a
 * thread's index, e.g. for per-thread scratch memory). */
typedef void (*pool_fn)(void *arg, long chunk, int tid);

/* nthreads >= 1 (1 = no worker threads). NULL on failure. */
pool_t *pool_create(int nthreads);
void pool_destroy(pool_t *p);
int pool_threads(const pool_t *p);
/* Not reentrant: one job at a time, from one caller thread. */
void pool_run(pool_t *p, pool_fn fn, void *arg, long n_chunks);
/* Send the workers to sleep now instead of after their spin, e.g. before
 * another set of threads (libkvpage's attention) runs on the same cores;
 * the next pool_run wakes them. From the caller thread, between jobs. */
void pool_park(pool_t *p);

#endif
