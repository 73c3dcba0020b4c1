/*
 * CUDA backend: device discovery.
 */
#include "common.cuh"
#include "../include/kvpage_cuda.h"

#include <stdio.h>
#include <string.h>

extern "C" int kvp_cuda_device_count(int32_t *count, char *err, size_t err_size) {
    if (count == NULL) return kvp__errf(err, err_size, KVP_EINVAL, "count is NULL");
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* clear the sticky-free error */
        return kvp__cuda_status(e, err, err_size, "cudaGetDeviceCount");
    }
    if (n == 0)
        return kvp__errf(err, err_size, KVP_ENODEV, "no CUDA device is visible");
    *count = n;
    return KVP_OK;
}

extern "C" int kvp_cuda_device_query(int32_t device, kvp_cuda_device_info_t *info,
                                     char *err, size_t err_size) {
    int rc = kvp__check_struct(info, sizeof *info, "info", err, err_size);
    if (rc != KVP_OK) return rc;
    if (device < 0)
        return kvp__errf(err, err_size, KVP_EINVAL, "device ordinal %d is negative",
                         (int)device);
    int32_t n = 0;
    rc = kvp_cuda_device_count(&n, err, err_size);
    if (rc != KVP_OK) return rc;
    if (device >= n)
        return kvp__errf(err, err_size, KVP_ENODEV, "device %d does not exist (%d visible)",
                         (int)device, (int)n);

    kvp_cuda_device_info_t r;
    memset(&r, 0, sizeof r);
    r.struct_size = sizeof r;
    r.device = device;
    cudaDeviceProp prop;
    cudaError_t e = cudaGetDeviceProperties(&prop, device);
    if (e != cudaSuccess) return kvp__cuda_status(e, err, err_size, "cudaGetDeviceProperties");
    r.cc_major = prop.major;
    r.cc_minor = prop.minor;
    r.sm_count = prop.multiProcessorCount;
    r.total_bytes = prop.totalGlobalMem;
    snprintf(r.name, sizeof r.name, "%s", prop.name);
    int v = 0;
    if (cudaRuntimeGetVersion(&v) == cudaSuccess) r.runtime_version = v;
    if (cudaDriverGetVersion(&v) == cudaSuccess) r.driver_version = v;

    int previous = 0;
    e = cudaGetDevice(&previous);
    if (e != cudaSuccess) return kvp__cuda_status(e, err, err_size, "cudaGetDevice");
    e = cudaSetDevice(device);
    if (e != cudaSuccess) return kvp__cuda_status(e, err, err_size, "cudaSetDevice");
    size_t free_b = 0, total_b = 0;
    e = cudaMemGetInfo(&free_b, &total_b);
    cudaError_t e2 = cudaSetDevice(previous);
    if (e != cudaSuccess) return kvp__cuda_status(e, err, err_size, "cudaMemGetInfo");
    if (e2 != cudaSuccess) return kvp__cuda_status(e2, err, err_size, "cudaSetDevice");
    r.free_bytes = free_b;
    kvp__copy_out(info, &r, sizeof r);
    return KVP_OK;
}
