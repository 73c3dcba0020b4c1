/*
 * The backend a harness drives: the CPU (default) or, with FZ_CUDA defined,
 * the CUDA backend (on a GPU, or in the kernel simulator: tests/cudasim,
 * tests/test_fuzz_cuda.c). What differs between the two stays here:
 *
 *   - fz_store_create / fz_ctx_create: kvp_store_create / kvp_ctx_create,
 *     or the kvp_cuda_* creators with default CUDA parameters (device 0,
 *     the default stream; the host allocator still serves the metadata);
 *   - device tensors: fz_dev_mirror() gives a device buffer of the same
 *     size holding a host buffer's bytes (on the CPU: the host buffer
 *     itself), fz_dev_upload() / fz_dev_download() copy between the two (on
 *     the CPU: nothing to do), fz_dev_release() frees the mirror;
 *   - fz_dev_sync() waits for the device and traps on a pending CUDA error
 *     (a simulator fault); fz_dev_used() is the device memory in use, so a
 *     harness can check that a destroyed store gave all of it back (0 on
 *     the CPU).
 *
 * FZ_DEV is 1 under FZ_CUDA, else 0, for plain `if (FZ_DEV)` tests.
 */
#ifndef KVPAGE_FUZZ_DEVICE_H
#define KVPAGE_FUZZ_DEVICE_H

#include "kvpage.h"
#include "fuzz_input.h"

#include <stddef.h>
#include <string.h>

#ifdef FZ_CUDA
#include <cuda_runtime_api.h>
#include "kvpage_cuda.h"
#define FZ_DEV 1
#else
#define FZ_DEV 0
#endif

static inline int fz_store_create(const kvp_store_params_t *p, kvp_store_t **out, char *err,
                                  size_t err_size) {
#ifdef FZ_CUDA
    return kvp_cuda_store_create(p, NULL, out, err, err_size);
#else
    return kvp_store_create(p, out, err, err_size);
#endif
}

static inline int fz_ctx_create(const kvp_ctx_params_t *p, kvp_ctx_t **out, char *err,
                                size_t err_size) {
#ifdef FZ_CUDA
    return kvp_cuda_ctx_create(p, NULL, out, err, err_size);
#else
    return kvp_ctx_create(p, out, err, err_size);
#endif
}

/* A device buffer of n bytes (at least 1) holding h's bytes; h itself on
 * the CPU. Exactly n bytes, so a kernel that overruns it is an ASan report
 * in the simulator as it would be on the host. */
static inline void *fz_dev_mirror(void *h, size_t n) {
#ifdef FZ_CUDA
    void *d = NULL;
    FZI_ASSERT(cudaMalloc(&d, n ? n : 1) == cudaSuccess && d != NULL);
    if (n) FZI_ASSERT(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice) == cudaSuccess);
    return d;
#else
    (void)n;
    return h;
#endif
}

static inline void fz_dev_upload(void *d, const void *h, size_t n) {
    if (d == h || n == 0) return;
#ifdef FZ_CUDA
    FZI_ASSERT(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice) == cudaSuccess);
#else
    memmove(d, h, n);
#endif
}

static inline void fz_dev_download(void *h, const void *d, size_t n) {
    if (d == h || n == 0) return;
#ifdef FZ_CUDA
    FZI_ASSERT(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost) == cudaSuccess);
#else
    memmove(h, d, n);
#endif
}

/* Free a buffer from fz_dev_mirror(d's host twin h). */
static inline void fz_dev_release(void *d, const void *h) {
    if (d == NULL || d == h) return;
#ifdef FZ_CUDA
    FZI_ASSERT(cudaFree(d) == cudaSuccess);
#endif
}

static inline void fz_dev_sync(void) {
#ifdef FZ_CUDA
    FZI_ASSERT(cudaDeviceSynchronize() == cudaSuccess);
    FZI_ASSERT(cudaGetLastError() == cudaSuccess);
#endif
}

static inline size_t fz_dev_used(void) {
#ifdef FZ_CUDA
    size_t free_b = 0, total = 0;
    FZI_ASSERT(cudaMemGetInfo(&free_b, &total) == cudaSuccess);
    return total - free_b;
#else
    return 0;
#endif
}

#endif
