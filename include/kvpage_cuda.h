/**
 * @file kvpage_cuda.h
 * @brief libkvpage — CUDA-specific entry points.
 *
 * Needs no CUDA headers: streams are passed as `void *` (a cudaStream_t).
 * In a CPU-only build these functions exist and return KVP_ENOTSUP, so one
 * binding works with either build (see kvp_build_has_cuda()).
 */
#ifndef KVPAGE_CUDA_H
#define KVPAGE_CUDA_H

#include "kvpage.h"

#ifdef __cplusplus
extern "C" {
#endif

/** @brief Facts about one CUDA device, from kvp_cuda_device_query(). */
typedef struct kvp_cuda_device_info {
    uint32_t struct_size;     /**< Set by the caller to sizeof(kvp_cuda_device_info_t). */
    int32_t device;           /**< Device ordinal. */
    int32_t cc_major;         /**< Compute capability, major (9 for Hopper). */
    int32_t cc_minor;         /**< Compute capability, minor. */
    int32_t sm_count;         /**< Streaming multiprocessors. */
    int32_t runtime_version;  /**< CUDA runtime version the library was built with (e.g. 13000). */
    int32_t driver_version;   /**< CUDA version the installed driver supports. */
    int32_t reserved_;        /**< Padding; always 0. */
    uint64_t total_bytes;     /**< Total device memory. */
    uint64_t free_bytes;      /**< Free device memory at the time of the call. */
    char name[256];           /**< Device name, NUL-terminated. */
} kvp_cuda_device_info_t;

/**
 * @brief Number of CUDA devices visible to this process.
 * @param[out] count    Number of devices (0 is reported as #KVP_ENODEV).
 * @param[out] err      Optional error-detail buffer (the CUDA runtime's text).
 * @param[in]  err_size Its size.
 * @return #KVP_OK; #KVP_ENODEV when no device or no driver is usable;
 *         #KVP_ENOTSUP in a CPU-only build; #KVP_EINVAL for NULL.
 */
KVP_API int kvp_cuda_device_count(int32_t *count, char *err, size_t err_size);

/**
 * @brief Query a CUDA device: name, compute capability, memory.
 *
 * Useful to plan from the device actually present
 * (`kvp_plan_params_t::memory_bytes = info.total_bytes`).
 *
 * @param[in]  device   Device ordinal (0-based).
 * @param[out] info     Result; `info->struct_size` must be set.
 * @param[out] err      Optional error-detail buffer (the CUDA runtime's text).
 * @param[in]  err_size Its size.
 * @return #KVP_OK; #KVP_ENODEV when the device does not exist or no driver is
 *         usable; #KVP_ECUDA for another CUDA error; #KVP_ENOTSUP in a
 *         CPU-only build; #KVP_EINVAL for bad arguments.
 */
KVP_API int kvp_cuda_device_query(int32_t device, kvp_cuda_device_info_t *info,
                                  char *err, size_t err_size);

#ifdef __cplusplus
}
#endif

#endif /* KVPAGE_CUDA_H */
