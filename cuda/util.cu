/*
 * Internal CUDA helpers for kvpage-bench (lib/cuda_util.h): device memory,
 * copies, event timing and the device-to-device copy probe, so the
 * benchmark stays plain C.
 */
#include "common.cuh"
#include "../lib/cuda_util.h"

extern "C" {

int kvp__cuda_malloc(int32_t device, uint64_t bytes, void **ptr, char *err, size_t err_size) {
    if (ptr == nullptr) return kvp__errf(err, err_size, KVP_EINVAL, "ptr is NULL");
    KVP_CUDA_TRY(cudaSetDevice(device), err, err_size, "cudaSetDevice");
    void *p = nullptr;
    cudaError_t e = cudaMalloc(&p, (size_t)bytes);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return kvp__cuda_status(e, err, err_size, "cudaMalloc");
    }
    *ptr = p;
    return KVP_OK;
}

void kvp__cuda_free(int32_t device, void *ptr) {
    if (ptr == nullptr) return;
    (void)cudaSetDevice(device);
    (void)cudaFree(ptr);
}

int kvp__cuda_memcpy(void *dst, const void *src, uint64_t bytes, int kind, char *err,
                     size_t err_size) {
    cudaMemcpyKind k = kind == 0 ? cudaMemcpyHostToDevice
                       : kind == 1 ? cudaMemcpyDeviceToHost : cudaMemcpyDeviceToDevice;
    KVP_CUDA_TRY(cudaMemcpy(dst, src, (size_t)bytes, k), err, err_size, "cudaMemcpy");
    return KVP_OK;
}

static double median(double *v, int n) {
    for (int i = 1; i < n; i++) /* insertion sort: n is small */
        for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
            double t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

#define MAX_REPS 64

int kvp__cuda_time(void *stream, int (*fn)(void *), void *arg, int reps, double *seconds,
                   char *err, size_t err_size) {
    if (fn == nullptr || seconds == nullptr || reps < 1)
        return kvp__errf(err, err_size, KVP_EINVAL, "bad timing arguments");
    if (reps > MAX_REPS) reps = MAX_REPS;
    cudaStream_t s = (cudaStream_t)stream;
    cudaEvent_t a, b;
    KVP_CUDA_TRY(cudaEventCreate(&a), err, err_size, "cudaEventCreate");
    cudaError_t e = cudaEventCreate(&b);
    if (e != cudaSuccess) {
        (void)cudaEventDestroy(a);
        return kvp__cuda_status(e, err, err_size, "cudaEventCreate");
    }
    double t[MAX_REPS];
    int rc = fn(arg); /* warm-up: module load, first-touch */
    if (rc == KVP_OK) e = cudaStreamSynchronize(s);
    for (int i = 0; i < reps && rc == KVP_OK && e == cudaSuccess; i++) {
        e = cudaEventRecord(a, s);
        if (e == cudaSuccess) rc = fn(arg);
        if (rc == KVP_OK && e == cudaSuccess) e = cudaEventRecord(b, s);
        if (rc == KVP_OK && e == cudaSuccess) e = cudaEventSynchronize(b);
        float ms = 0.0f;
        if (rc == KVP_OK && e == cudaSuccess) e = cudaEventElapsedTime(&ms, a, b);
        t[i] = ms * 1e-3;
    }
    (void)cudaEventDestroy(a);
    (void)cudaEventDestroy(b);
    if (rc != KVP_OK) return rc;
    if (e != cudaSuccess) return kvp__cuda_status(e, err, err_size, "timing");
    *seconds = median(t, reps);
    return KVP_OK;
}

struct copy_arg {
    void *dst;
    const void *src;
    uint64_t bytes;
};

static int copy_once(void *arg) {
    copy_arg *c = (copy_arg *)arg;
    cudaError_t e = cudaMemcpyAsync(c->dst, c->src, (size_t)c->bytes, cudaMemcpyDeviceToDevice, 0);
    return e == cudaSuccess ? KVP_OK : KVP_ECUDA;
}

int kvp__cuda_copy_bandwidth(int32_t device, uint64_t bytes, int reps, double *gbps, char *err,
                             size_t err_size) {
    if (gbps == nullptr || bytes == 0) return kvp__errf(err, err_size, KVP_EINVAL, "bad arguments");
    void *a = nullptr, *b = nullptr;
    int rc = kvp__cuda_malloc(device, bytes, &a, err, err_size);
    if (rc == KVP_OK) rc = kvp__cuda_malloc(device, bytes, &b, err, err_size);
    if (rc == KVP_OK) {
        /* not zeros: some hardware moves zeros faster than data */
        cudaError_t e = cudaMemset(a, 0x5A, (size_t)bytes);
        if (e != cudaSuccess) rc = kvp__cuda_status(e, err, err_size, "cudaMemset");
    }
    double s = 0.0;
    if (rc == KVP_OK) {
        copy_arg c = {b, a, bytes};
        rc = kvp__cuda_time(nullptr, copy_once, &c, reps, &s, err, err_size);
    }
    kvp__cuda_free(device, a);
    kvp__cuda_free(device, b);
    if (rc != KVP_OK) return rc;
    *gbps = s > 0.0 ? 2.0 * (double)bytes / s / 1e9 : 0.0;
    return KVP_OK;
}

} /* extern "C" */
