/*
 * CUDA helpers of kvpage-bench attention --device cuda (bench/attention_cuda.c),
 * so the benchmark stays plain C and builds without the toolkit's headers:
 * device memory, copies, event timing and the copy-bandwidth probe.
 * bench/cuda_bench.cu implements them (HAVE_CUDA=1); in a CPU-only build
 * bench/cuda_bench_stub.c returns KVP_ENOTSUP. Not part of the library.
 */
#ifndef KVPAGE_BENCH_CUDA_BENCH_H
#define KVPAGE_BENCH_CUDA_BENCH_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Statuses are kvp ones (KVP_OK, KVP_ECUDA, KVP_ENODEV, KVP_ENOMEM,
 * KVP_EINVAL, KVP_ENOTSUP); err gets the CUDA runtime's text. */

/* cudaMalloc on `device` (made current). */
int bench_cuda_malloc(int32_t device, uint64_t bytes, void **ptr, char *err, size_t err_size);
void bench_cuda_free(int32_t device, void *ptr);
/* Synchronous copy; kind 0: host to device, 1: device to host, 2: device to device. */
int bench_cuda_memcpy(void *dst, const void *src, uint64_t bytes, int kind, char *err,
                      size_t err_size);
/* Device-to-device copy of `bytes` bytes, timed with events (median of
 * `reps`); *gbps counts bytes read plus bytes written (2 x bytes), the
 * usual convention for a copy's bandwidth. */
int bench_cuda_copy_bandwidth(int32_t device, uint64_t bytes, int reps, double *gbps, char *err,
                              size_t err_size);
/* Time fn(arg) on `stream` with events: one warm-up, then `reps` timed
 * calls (at most 64); *seconds is their median. fn returns a kvp status. */
int bench_cuda_time(void *stream, int (*fn)(void *), void *arg, int reps, double *seconds,
                    char *err, size_t err_size);

#ifdef __cplusplus
}
#endif

#endif
