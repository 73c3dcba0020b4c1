/*
 * CPU-only builds: the CUDA entry points exist and say they are not built,
 * so bindings and engines can probe without link errors.
 */
#include "internal.h"
#include "kvpage_cuda.h"

static int not_built(char *err, size_t err_size) {
    return kvp__errf(err, err_size, KVP_ENOTSUP,
                     "libkvpage was built without CUDA (HAVE_CUDA=0)");
}

int kvp_cuda_device_count(int32_t *count, char *err, size_t err_size) {
    if (count == NULL) return kvp__errf(err, err_size, KVP_EINVAL, "count is NULL");
    return not_built(err, err_size);
}

int kvp_cuda_device_query(int32_t device, kvp_cuda_device_info_t *info, char *err,
                          size_t err_size) {
    int rc = kvp__check_struct(info, sizeof *info, "info", err, err_size);
    if (rc != KVP_OK) return rc;
    if (device < 0)
        return kvp__errf(err, err_size, KVP_EINVAL, "device ordinal %d is negative",
                         (int)device);
    return not_built(err, err_size);
}
