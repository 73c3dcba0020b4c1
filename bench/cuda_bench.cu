/*
 * CUDA helpers of kvpage-bench (bench/cuda_bench.h): device memory, copies,
 * event timing (whole calls, or an attention call's kernels through
 * kvp_cuda_ctx_set_timing()), the L2 flush and the device-to-device copy
 * probe. Compiled by nvcc when
 * HAVE_CUDA=1 and linked into kvpage-bench only. Host code without the C++
 * library (no new/delete, exceptions or RTTI), so the C compiler links it.
 */
#include "cuda_bench.h"

#include "kvpage.h"
#include "kvpage_cuda.h"

#include <cuda_runtime.h>
#include <stdio.h>

namespace {

/* A cudaError_t as a kvp status, with the runtime's text in err. */
int status_of(cudaError_t e, char *err, size_t err_size, const char *what) {
    if (e == cudaSuccess) return KVP_OK;
    (void)cudaGetLastError(); /* clear a sticky non-fatal error */
    int status = KVP_ECUDA;
    if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver ||
        e == cudaErrorInvalidDevice || e == cudaErrorDevicesUnavailable)
        status = KVP_ENODEV;
    else if (e == cudaErrorMemoryAllocation)
        status = KVP_ENOMEM;
    if (err != nullptr && err_size > 0)
        snprintf(err, err_size, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
    return status;
}

int bad_args(char *err, size_t err_size, const char *what) {
    if (err != nullptr && err_size > 0) snprintf(err, err_size, "%s", what);
    return KVP_EINVAL;
}

double median(double *v, int n) {
    for (int i = 1; i < n; i++) /* insertion sort: n is small */
        for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
            double t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct copy_arg {
    void *dst;
    const void *src;
    uint64_t bytes;
};

int copy_once(void *arg) {
    copy_arg *c = (copy_arg *)arg;
    cudaError_t e = cudaMemcpyAsync(c->dst, c->src, (size_t)c->bytes, cudaMemcpyDeviceToDevice, 0);
    return e == cudaSuccess ? KVP_OK : KVP_ECUDA;
}

const int MAX_REPS = 64;

/* The context's last error as the bench's detail text. */
int ctx_fail(kvp_ctx_t *ctx, int rc, char *err, size_t err_size, const char *what) {
    if (err != nullptr && err_size > 0)
        snprintf(err, err_size, "%s: %s", what, kvp_ctx_last_error(ctx));
    return rc;
}

} // namespace

extern "C" {

int bench_cuda_malloc(int32_t device, uint64_t bytes, void **ptr, char *err, size_t err_size) {
    if (ptr == nullptr) return bad_args(err, err_size, "ptr is NULL");
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess) return status_of(e, err, err_size, "cudaSetDevice");
    void *p = nullptr;
    e = cudaMalloc(&p, (size_t)bytes);
    if (e != cudaSuccess) return status_of(e, err, err_size, "cudaMalloc");
    *ptr = p;
    return KVP_OK;
}

void bench_cuda_free(int32_t device, void *ptr) {
    if (ptr == nullptr) return;
    (void)cudaSetDevice(device);
    (void)cudaFree(ptr);
}

int bench_cuda_memcpy(void *dst, const void *src, uint64_t bytes, int kind, char *err,
                      size_t err_size) {
    cudaMemcpyKind k = kind == 0   ? cudaMemcpyHostToDevice
                       : kind == 1 ? cudaMemcpyDeviceToHost
                                   : cudaMemcpyDeviceToDevice;
    return status_of(cudaMemcpy(dst, src, (size_t)bytes, k), err, err_size, "cudaMemcpy");
}

int bench_cuda_time(void *stream, int (*fn)(void *), void *arg, int reps, double *seconds,
                    char *err, size_t err_size) {
    if (fn == nullptr || seconds == nullptr || reps < 1)
        return bad_args(err, err_size, "bad timing arguments");
    if (reps > MAX_REPS) reps = MAX_REPS;
    cudaStream_t s = (cudaStream_t)stream;
    cudaEvent_t a, b;
    cudaError_t e = cudaEventCreate(&a);
    if (e != cudaSuccess) return status_of(e, err, err_size, "cudaEventCreate");
    e = cudaEventCreate(&b);
    if (e != cudaSuccess) {
        (void)cudaEventDestroy(a);
        return status_of(e, err, err_size, "cudaEventCreate");
    }
    double t[MAX_REPS];
    int rc = fn(arg); /* warm-up: module load, first touch */
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
    if (e != cudaSuccess) return status_of(e, err, err_size, "timing");
    *seconds = median(t, reps);
    return KVP_OK;
}

int bench_cuda_flush_alloc(int32_t device, void **buf, uint64_t *bytes, char *err,
                           size_t err_size) {
    if (buf == nullptr || bytes == nullptr) return bad_args(err, err_size, "buf or bytes is NULL");
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess) return status_of(e, err, err_size, "cudaSetDevice");
    int l2 = 0;
    e = cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device);
    if (e != cudaSuccess) return status_of(e, err, err_size, "cudaDeviceGetAttribute (L2 size)");
    uint64_t n = 2 * (uint64_t)(l2 > 0 ? l2 : 0);
    if (n < (1u << 20)) n = 1u << 20;
    int rc = bench_cuda_malloc(device, n, buf, err, err_size);
    if (rc != KVP_OK) return rc;
    *bytes = n;
    return KVP_OK;
}

int bench_cuda_time_kernels(kvp_ctx_t *ctx, void *stream, int (*fn)(void *), void *arg, int reps,
                            void *flush, uint64_t flush_bytes, double *seconds, char *err,
                            size_t err_size) {
    if (ctx == nullptr || fn == nullptr || seconds == nullptr || reps < 1)
        return bad_args(err, err_size, "bad timing arguments");
    if (reps > MAX_REPS) reps = MAX_REPS;
    cudaStream_t s = (cudaStream_t)stream;
    int rc = kvp_cuda_ctx_set_timing(ctx, 1);
    if (rc != KVP_OK) return ctx_fail(ctx, rc, err, err_size, "kvp_cuda_ctx_set_timing");
    double t[MAX_REPS], warm = 0.0;
    rc = fn(arg); /* warm-up: module load, first touch */
    if (rc != KVP_OK) (void)ctx_fail(ctx, rc, err, err_size, "the call");
    else if ((rc = kvp_cuda_ctx_kernel_time(ctx, &warm)) != KVP_OK)
        (void)ctx_fail(ctx, rc, err, err_size, "kvp_cuda_ctx_kernel_time");
    for (int i = 0; i < reps && rc == KVP_OK; i++) {
        if (flush != nullptr) { /* outside the timed interval: before the call's first kernel */
            cudaError_t e = cudaMemsetAsync(flush, i & 0xFF, (size_t)flush_bytes, s);
            if (e != cudaSuccess) {
                rc = status_of(e, err, err_size, "cudaMemsetAsync (L2 flush)");
                break;
            }
        }
        rc = fn(arg);
        if (rc != KVP_OK) (void)ctx_fail(ctx, rc, err, err_size, "the call");
        else if ((rc = kvp_cuda_ctx_kernel_time(ctx, &t[i])) != KVP_OK)
            (void)ctx_fail(ctx, rc, err, err_size, "kvp_cuda_ctx_kernel_time");
    }
    (void)kvp_cuda_ctx_set_timing(ctx, 0);
    if (rc != KVP_OK) return rc;
    *seconds = median(t, reps);
    return KVP_OK;
}

int bench_cuda_copy_bandwidth(int32_t device, uint64_t bytes, int reps, double *gbps, char *err,
                              size_t err_size) {
    if (gbps == nullptr || bytes == 0) return bad_args(err, err_size, "bad arguments");
    void *a = nullptr, *b = nullptr;
    int rc = bench_cuda_malloc(device, bytes, &a, err, err_size);
    if (rc == KVP_OK) rc = bench_cuda_malloc(device, bytes, &b, err, err_size);
    if (rc == KVP_OK) /* not zeros: some hardware moves zeros faster than data */
        rc = status_of(cudaMemset(a, 0x5A, (size_t)bytes), err, err_size, "cudaMemset");
    double s = 0.0;
    if (rc == KVP_OK) {
        copy_arg c = {b, a, bytes};
        rc = bench_cuda_time(nullptr, copy_once, &c, reps, &s, err, err_size);
    }
    bench_cuda_free(device, a);
    bench_cuda_free(device, b);
    if (rc != KVP_OK) return rc;
    *gbps = s > 0.0 ? 2.0 * (double)bytes / s / 1e9 : 0.0;
    return KVP_OK;
}

} /* extern "C" */
