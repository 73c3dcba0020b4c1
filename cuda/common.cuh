/*
 * Shared helpers of the CUDA backend: error mapping. Every CUDA call goes
 * through kvp__cuda_status(), which turns a cudaError_t into KVP_ECUDA (or
 * KVP_ENODEV for "no device"/"no driver") with the runtime's text.
 */
#ifndef KVPAGE_CUDA_COMMON_CUH
#define KVPAGE_CUDA_COMMON_CUH

#include "compat.cuh"

#include "../lib/internal.h"

static inline int kvp__cuda_status(cudaError_t e, char *err, size_t err_size,
                                   const char *what) {
    if (e == cudaSuccess) return KVP_OK;
    int status = KVP_ECUDA;
    if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver ||
        e == cudaErrorInvalidDevice || e == cudaErrorDevicesUnavailable ||
        e == cudaErrorCompatNotSupportedOnDevice)
        status = KVP_ENODEV;
    return kvp__errf(err, err_size, status, "%s: %s (%s)", what, cudaGetErrorString(e),
                     cudaGetErrorName(e));
}

#endif
