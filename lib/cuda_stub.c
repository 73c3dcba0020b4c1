/*
 * CPU-only builds: the CUDA entry points exist and say they are not built,
 * so bindings and engines can probe without link errors.
 */
#include "backend.h"
#include "kvpage_cuda.h"

#include <string.h>

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

/* ---- stores, contexts, kernels: not built --------------------------------------- */

void kvp_cuda_params_init(kvp_cuda_params_t *p) {
    if (p == NULL) return;
    memset(p, 0, sizeof *p);
    p->struct_size = sizeof *p;
}

int kvp_cuda_store_create(const kvp_store_params_t *params, const kvp_cuda_params_t *cuda,
                          kvp_store_t **out, char *err, size_t err_size) {
    (void)params;
    (void)cuda;
    (void)out;
    return not_built(err, err_size);
}

int kvp_cuda_ctx_create(const kvp_ctx_params_t *params, const kvp_cuda_params_t *cuda,
                        kvp_ctx_t **out, char *err, size_t err_size) {
    (void)params;
    (void)cuda;
    (void)out;
    return not_built(err, err_size);
}

/* A store or context of this build is never a CUDA one: say so on the object. */
int kvp_cuda_store_set_stream(kvp_store_t *store, void *stream) {
    (void)stream;
    if (store == NULL) return KVP_EINVAL;
    return not_built(store->error, KVP__STORE_ERR_SIZE);
}

int kvp_cuda_ctx_set_stream(kvp_ctx_t *ctx, void *stream) {
    (void)stream;
    if (ctx == NULL) return KVP_EINVAL;
    return not_built(ctx->error, KVP_ERR_SIZE);
}

int kvp_cuda_ctx_set_timing(kvp_ctx_t *ctx, int enable) {
    (void)enable;
    if (ctx == NULL) return KVP_EINVAL;
    return not_built(ctx->error, KVP_ERR_SIZE);
}

int kvp_cuda_ctx_kernel_time(kvp_ctx_t *ctx, double *seconds) {
    (void)seconds;
    if (ctx == NULL) return KVP_EINVAL;
    return not_built(ctx->error, KVP_ERR_SIZE);
}

int kvp_cuda_ctx_set_pipeline(kvp_ctx_t *ctx, int enable) {
    (void)enable;
    if (ctx == NULL) return KVP_EINVAL;
    return not_built(ctx->error, KVP_ERR_SIZE);
}

int kvp_cuda_quantize(const kvp_quant_desc_t *desc, const void *src, int64_t pages, void *dst,
                      void *stream, char *err, size_t err_size) {
    (void)desc;
    (void)src;
    (void)pages;
    (void)dst;
    (void)stream;
    return not_built(err, err_size);
}

int kvp_cuda_dequantize(const kvp_quant_desc_t *desc, const void *src, int64_t pages, void *dst,
                        void *stream, char *err, size_t err_size) {
    (void)desc;
    (void)src;
    (void)pages;
    (void)dst;
    (void)stream;
    return not_built(err, err_size);
}

int kvp_cuda_host_alloc(uint64_t bytes, void **ptr, char *err, size_t err_size) {
    (void)bytes;
    (void)ptr;
    return not_built(err, err_size);
}

void kvp_cuda_host_free(void *ptr) { (void)ptr; }
