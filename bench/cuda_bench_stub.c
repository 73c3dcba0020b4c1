/*
 * kvpage-bench's CUDA helpers in a build without CUDA (HAVE_CUDA=0): every
 * one says so. bench/cuda_bench.cu replaces this file when HAVE_CUDA=1.
 */
#include "cuda_bench.h"

#include "kvpage.h"

#include <stdio.h>

static int not_built(char *err, size_t err_size) {
    if (err != NULL && err_size > 0)
        snprintf(err, err_size, "this build of kvpage-bench has no CUDA (HAVE_CUDA=0)");
    return KVP_ENOTSUP;
}

int bench_cuda_malloc(int32_t device, uint64_t bytes, void **ptr, char *err, size_t err_size) {
    (void)device;
    (void)bytes;
    (void)ptr;
    return not_built(err, err_size);
}

void bench_cuda_free(int32_t device, void *ptr) {
    (void)device;
    (void)ptr;
}

int bench_cuda_memcpy(void *dst, const void *src, uint64_t bytes, int kind, char *err,
                      size_t err_size) {
    (void)dst;
    (void)src;
    (void)bytes;
    (void)kind;
    return not_built(err, err_size);
}

int bench_cuda_copy_bandwidth(int32_t device, uint64_t bytes, int reps, double *gbps, char *err,
                              size_t err_size) {
    (void)device;
    (void)bytes;
    (void)reps;
    (void)gbps;
    return not_built(err, err_size);
}

int bench_cuda_time(void *stream, int (*fn)(void *), void *arg, int reps, double *seconds,
                    char *err, size_t err_size) {
    (void)stream;
    (void)fn;
    (void)arg;
    (void)reps;
    (void)seconds;
    return not_built(err, err_size);
}

int bench_cuda_flush_alloc(int32_t device, void **buf, uint64_t *bytes, char *err,
                           size_t err_size) {
    (void)device;
    (void)buf;
    (void)bytes;
    return not_built(err, err_size);
}

int bench_cuda_time_kernels(kvp_ctx_t *ctx, void *stream, int (*fn)(void *), void *arg, int reps,
                            void *flush, uint64_t flush_bytes, double *seconds, char *err,
                            size_t err_size) {
    (void)ctx;
    (void)stream;
    (void)fn;
    (void)arg;
    (void)reps;
    (void)flush;
    (void)flush_bytes;
    (void)seconds;
    return not_built(err, err_size);
}
