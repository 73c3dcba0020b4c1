/*
 * CUDA backend: the backend table (lib/backend.h) and the public entry
 * points of include/kvpage_cuda.h that create objects and pick streams.
 * The generic functions of kvpage.h (lib/store.c, lib/ctx.c) check every
 * argument and then call into this table.
 */
#include "common.cuh"

extern "C" {

const kvp__backend kvp__cuda_backend = {
    "cuda",
    KVP_BACKEND_CUDA,
    kvp__cuda_arena_alloc,
    kvp__cuda_store_fini,
    kvp__cuda_append,
    kvp__cuda_apply_ops,
    kvp__cuda_read,
    kvp__cuda_set_fp8_scale,
    kvp__cuda_get_fp8_scale,
    kvp__cuda_nonfinite,
    kvp__cuda_page_io,
    kvp__cuda_synchronize,
    kvp__cuda_ctx_init,
    kvp__cuda_ctx_fini,
    kvp__cuda_attention,
};

int kvp_cuda_store_create(const kvp_store_params_t *params, const kvp_cuda_params_t *cuda,
                          kvp_store_t **out, char *err, size_t err_size) {
    return kvp__store_create(params, &kvp__cuda_backend, cuda, out, err, err_size);
}

int kvp_cuda_ctx_create(const kvp_ctx_params_t *params, const kvp_cuda_params_t *cuda,
                        kvp_ctx_t **out, char *err, size_t err_size) {
    return kvp__ctx_create(params, &kvp__cuda_backend, cuda, out, err, err_size);
}

static int set_stream(kvp__cuda_obj *o, void *stream, char *err, size_t err_size) {
    kvp__device_guard g;
    int rc = kvp__device_enter(&g, o->device, err, err_size);
    if (rc != KVP_OK) return rc;
    rc = kvp__obj_set_stream(o, (cudaStream_t)stream, err, err_size);
    kvp__device_leave(&g);
    return rc;
}

int kvp_cuda_store_set_stream(kvp_store_t *store, void *stream) {
    if (store == nullptr) return KVP_EINVAL;
    if (store->backend != &kvp__cuda_backend)
        return kvp__errf(store->error, KVP__STORE_ERR_SIZE, KVP_EINVAL,
                         "not a CUDA store (kvp_cuda_store_create makes one)");
    int rc = set_stream(&kvp__cstore(store)->o, stream, store->error, KVP__STORE_ERR_SIZE);
    return rc;
}

int kvp_cuda_ctx_set_stream(kvp_ctx_t *ctx, void *stream) {
    if (ctx == nullptr) return KVP_EINVAL;
    if (ctx->backend != &kvp__cuda_backend)
        return kvp__errf(ctx->error, KVP_ERR_SIZE, KVP_EINVAL,
                         "not a CUDA context (kvp_cuda_ctx_create makes one)");
    int rc = set_stream(&kvp__cctx(ctx)->o, stream, ctx->error, KVP_ERR_SIZE);
    return rc;
}

int kvp_cuda_ctx_set_timing(kvp_ctx_t *ctx, int enable) {
    if (ctx == nullptr) return KVP_EINVAL;
    if (ctx->backend != &kvp__cuda_backend)
        return kvp__errf(ctx->error, KVP_ERR_SIZE, KVP_EINVAL,
                         "not a CUDA context (kvp_cuda_ctx_create makes one)");
    return kvp__cuda_ctx_set_timing(ctx, enable);
}

int kvp_cuda_ctx_kernel_time(kvp_ctx_t *ctx, double *seconds) {
    if (ctx == nullptr) return KVP_EINVAL;
    if (ctx->backend != &kvp__cuda_backend)
        return kvp__errf(ctx->error, KVP_ERR_SIZE, KVP_EINVAL,
                         "not a CUDA context (kvp_cuda_ctx_create makes one)");
    return kvp__cuda_ctx_kernel_time(ctx, seconds);
}

int kvp_cuda_ctx_set_pipeline(kvp_ctx_t *ctx, int enable) {
    if (ctx == nullptr) return KVP_EINVAL;
    if (ctx->backend != &kvp__cuda_backend)
        return kvp__errf(ctx->error, KVP_ERR_SIZE, KVP_EINVAL,
                         "not a CUDA context (kvp_cuda_ctx_create makes one)");
    if (enable != 0 && enable != 1)
        return kvp__errf(ctx->error, KVP_ERR_SIZE, KVP_EINVAL, "enable must be 0 or 1, got %d",
                         enable);
    kvp__cctx(ctx)->pipeline = enable != 0;
    return KVP_OK;
}

int kvp_cuda_host_alloc(uint64_t bytes, void **ptr, char *err, size_t err_size) {
    if (ptr == nullptr || bytes == 0)
        return kvp__errf(err, err_size, KVP_EINVAL, "ptr is NULL or bytes is 0");
    if (bytes > SIZE_MAX) return kvp__errf(err, err_size, KVP_EINVAL, "bytes exceed the address space");
    void *p = nullptr;
    cudaError_t e = cudaMallocHost(&p, (size_t)bytes);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return kvp__cuda_status(e, err, err_size, "cudaMallocHost");
    }
    *ptr = p;
    return KVP_OK;
}

void kvp_cuda_host_free(void *ptr) {
    if (ptr != nullptr) (void)cudaFreeHost(ptr);
}

} /* extern "C" */
