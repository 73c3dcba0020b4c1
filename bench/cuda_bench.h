/*
 * CUDA helpers of kvpage-bench attention --device cuda (bench/attention_cuda.c),
 * so the benchmark stays plain C and builds without the toolkit's headers:
 * device memory, copies, event timing (of a call, or of an attention
 * call's kernels alone), the L2 flush and the copy-bandwidth probe.
 * bench/cuda_bench.cu implements them (HAVE_CUDA=1); in a CPU-only build
 * bench/cuda_bench_stub.c returns KVP_ENOTSUP. Not part of the library.
 */
#ifndef KVPAGE_BENCH_CUDA_BENCH_H
#define KVPAGE_BENCH_CUDA_BENCH_H

#include <stddef.h>
#include <stdint.h>

#include "kvpage.h"

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
/* A buffer whose writing evicts the device's L2 cache: twice its size
 * (cudaDevAttrL2CacheSize), at least 1 MiB. Free with bench_cuda_free(). */
int bench_cuda_flush_alloc(int32_t device, void **buf, uint64_t *bytes, char *err,
                           size_t err_size);
/* Time fn(arg), one kvp_attention() call on the CUDA context `ctx`, as
 * device work only (kvp_cuda_ctx_set_timing(), kvp_cuda_ctx_kernel_time():
 * from the call's first kernel to its last, without the host's share): one
 * warm-up, then `reps` timed calls (at most 64), each after a write of
 * `flush` (flush_bytes, from bench_cuda_flush_alloc(); NULL: none) on
 * `stream`, the context's stream, outside the timed interval. *seconds is
 * the median. Timing is left off. */
int bench_cuda_time_kernels(kvp_ctx_t *ctx, void *stream, int (*fn)(void *), void *arg, int reps,
                            void *flush, uint64_t flush_bytes, double *seconds, char *err,
                            size_t err_size);

#ifdef __cplusplus
}
#endif

#endif
