/*
 * CUDA backend: the store on a device. The arena is the CPU store's layout
 * byte for byte (lib/store.c computes the geometry for both backends); this
 * file owns its memory (cudaMalloc, the engine's pointer, or the engine's
 * allocator hook), the fp8 scale tables in its fixed region, the device
 * counter of non-finite inputs, and the store's stream.
 */
#include "common.cuh"

/* kvp_store_read() copies through a device scratch of at most this many bytes. */
#define READ_SCRATCH_BYTES (1u << 20)

void kvp_cuda_params_init(kvp_cuda_params_t *p) {
    if (p == nullptr) return;
    memset(p, 0, sizeof *p);
    p->struct_size = sizeof *p;
}

static void store_state_free(kvp_store_t *s, kvp__cuda_store *cs) {
    if (cs == nullptr) return;
    if (s->arena != nullptr) {
        if (cs->arena_mode != KVP__ARENA_ENGINE) kvp__obj_free(&cs->o, s->arena, s->arena_bytes);
        s->arena = nullptr;
    }
    kvp__obj_free(&cs->o, cs->dev_small, cs->dev_small_bytes);
    kvp__obj_fini(&cs->o);
    kvp__free(&s->allocator, cs->fp8_known);
    kvp__free(&s->allocator, cs);
    s->backend_state = nullptr;
}

int kvp__cuda_arena_alloc(kvp_store_t *s, const void *bparams, char *err, size_t err_size) {
    const kvp_cuda_params_t *p = (const kvp_cuda_params_t *)bparams;
    kvp__cuda_store *cs = (kvp__cuda_store *)kvp__calloc(&s->allocator, 1, sizeof *cs, 64);
    if (cs == nullptr) return kvp__errf(err, err_size, KVP_ENOMEM, "cannot allocate the CUDA state");
    s->backend_state = cs;
    kvp__device_guard g;
    int rc = kvp__obj_init(&cs->o, p, &g, err, err_size);
    if (rc != KVP_OK) {
        kvp__device_leave(&g);
        store_state_free(s, cs);
        return rc;
    }
    s->device = cs->o.device;
    {
        /* whole-page swaps are 2D copies whose pitch is a layer's bytes:
         * beyond the device's limit they go layer by layer */
        int pitch = 0;
        if (cudaDeviceGetAttribute(&pitch, cudaDevAttrMaxPitch, cs->o.device) != cudaSuccess)
            (void)cudaGetLastError(); /* unknown: never a 2D copy */
        cs->max_pitch = pitch > 0 ? (uint64_t)pitch : 0;
    }
    const kvp_layout_t *l = &s->layout;
    size_t table = (size_t)l->layers * (size_t)l->kv_heads;
    cs->fp8_known = (uint8_t *)kvp__calloc(&s->allocator, 2 * table, 1, 16);
    if (cs->fp8_known == nullptr) {
        rc = kvp__errf(err, err_size, KVP_ENOMEM, "cannot allocate the fp8 scale flags");
        goto fail;
    }
    /* the arena */
    if (p != nullptr && p->arena != nullptr) {
        if (((uintptr_t)p->arena & (KVP_ARENA_ALIGN - 1)) != 0) {
            rc = kvp__errf(err, err_size, KVP_EINVAL, "the engine's arena must be aligned to %d "
                           "bytes", KVP_ARENA_ALIGN);
            goto fail;
        }
        if (p->arena_bytes < s->arena_bytes) {
            rc = kvp__errf(err, err_size, KVP_EINVAL, "the engine's arena has %llu bytes; this "
                           "store needs %llu (kvp_arena_bytes)", (unsigned long long)p->arena_bytes,
                           (unsigned long long)s->arena_bytes);
            goto fail;
        }
        s->arena = (uint8_t *)p->arena;
        cs->arena_mode = KVP__ARENA_ENGINE;
    } else {
        void *a = nullptr;
        rc = kvp__obj_alloc(&cs->o, s->arena_bytes, &a, err, err_size, "the arena");
        if (rc != KVP_OK) goto fail;
        s->arena = (uint8_t *)a;
        cs->arena_mode = cs->o.alloc.alloc != nullptr ? KVP__ARENA_HOOK : KVP__ARENA_CUDAMALLOC;
    }
    {
        /* small device buffers: the non-finite counter, then the read scratch */
        uint64_t row = (uint64_t)l->kv_heads * (uint64_t)l->head_dim * sizeof(float) * 2;
        uint64_t tokens = READ_SCRATCH_BYTES / row;
        if (tokens < 1) tokens = 1;
        if (tokens > (uint64_t)l->page_size) tokens = (uint64_t)l->page_size;
        cs->scratch_tokens = (int32_t)tokens;
        cs->dev_small_bytes = 256 + tokens * row;
        void *d = nullptr;
        rc = kvp__obj_alloc(&cs->o, cs->dev_small_bytes, &d, err, err_size, "the store's buffers");
        if (rc != KVP_OK) goto fail;
        cs->dev_small = (uint8_t *)d;
        cs->nonfinite = (unsigned long long *)d;
        cs->scratch = (float *)(void *)((uint8_t *)d + 256);
    }
    {
        cudaError_t e = cudaMemsetAsync(cs->nonfinite, 0, sizeof(unsigned long long), cs->o.stream);
        if (e == cudaSuccess && l->fixed_bytes > 0)
            e = cudaMemsetAsync(s->arena, 0, (size_t)l->fixed_bytes, cs->o.stream);
        if (e == cudaSuccess) e = cudaStreamSynchronize(cs->o.stream);
        if (e != cudaSuccess) {
            rc = kvp__cuda_status(e, err, err_size, "initialising the arena");
            goto fail;
        }
    }
    {
        float *next = (float *)(void *)s->arena;
        if (l->k_format == KVP_FORMAT_FP8_E4M3) {
            s->fp8_k = next;
            next += table;
        }
        if (l->v_format == KVP_FORMAT_FP8_E4M3) s->fp8_v = next;
    }
    kvp__device_leave(&g);
    return KVP_OK;
fail:
    store_state_free(s, cs);
    kvp__device_leave(&g);
    return rc;
}

void kvp__cuda_store_fini(kvp_store_t *s) {
    kvp__cuda_store *cs = kvp__cstore(s);
    if (cs == nullptr) return;
    kvp__device_guard g;
    bool entered = kvp__device_enter(&g, cs->o.device, nullptr, 0) == KVP_OK;
    store_state_free(s, cs);
    if (entered) kvp__device_leave(&g);
}

/* ---- fp8 scales, counters, synchronization -------------------------------------------------- */

int kvp__cuda_set_fp8_scale(kvp_store_t *s, int side, int32_t layer, int32_t h, float scale,
                            char *err, size_t err_size) {
    kvp__cuda_store *cs = kvp__cstore(s);
    kvp__device_guard g;
    int rc = kvp__device_enter(&g, cs->o.device, err, err_size);
    if (rc != KVP_OK) return rc;
    /* pageable source: the copy has read `scale` when the call returns */
    cudaError_t e = cudaMemcpyAsync(kvp__fp8_scale(s, side, layer, h), &scale, sizeof scale,
                                    cudaMemcpyHostToDevice, cs->o.stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(cs->o.stream);
    kvp__device_leave(&g);
    if (e != cudaSuccess) return kvp__cuda_status(e, err, err_size, "setting an fp8 scale");
    size_t table = (size_t)s->layout.layers * (size_t)s->layout.kv_heads;
    cs->fp8_known[(size_t)side * table + (size_t)layer * (size_t)s->layout.kv_heads + (size_t)h] =
        scale > 0.0f;
    return KVP_OK;
}

int kvp__cuda_get_fp8_scale(const kvp_store_t *s, int side, int32_t layer, int32_t h,
                            float *scale, char *err, size_t err_size) {
    kvp__cuda_store *cs = kvp__cstore(s);
    kvp__device_guard g;
    int rc = kvp__device_enter(&g, cs->o.device, err, err_size);
    if (rc != KVP_OK) return rc;
    float v = 0.0f;
    cudaError_t e = cudaMemcpyAsync(&v, kvp__fp8_scale(s, side, layer, h), sizeof v,
                                    cudaMemcpyDeviceToHost, cs->o.stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(cs->o.stream);
    kvp__device_leave(&g);
    if (e != cudaSuccess) return kvp__cuda_status(e, err, err_size, "reading an fp8 scale");
    *scale = v;
    return KVP_OK;
}

int kvp__cuda_nonfinite(const kvp_store_t *s, uint64_t *count, char *err, size_t err_size) {
    kvp__cuda_store *cs = kvp__cstore(s);
    kvp__device_guard g;
    int rc = kvp__device_enter(&g, cs->o.device, err, err_size);
    if (rc != KVP_OK) return rc;
    unsigned long long n = 0;
    cudaError_t e = cudaMemcpyAsync(&n, cs->nonfinite, sizeof n, cudaMemcpyDeviceToHost,
                                    cs->o.stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(cs->o.stream);
    kvp__device_leave(&g);
    if (e != cudaSuccess) {
        *count = cs->nonfinite_seen;
        return kvp__cuda_status(e, err, err_size, "reading the non-finite counter");
    }
    cs->nonfinite_seen = n;
    *count = n;
    return KVP_OK;
}

int kvp__cuda_synchronize(kvp_store_t *s, char *err, size_t err_size) {
    kvp__cuda_store *cs = kvp__cstore(s);
    kvp__device_guard g;
    int rc = kvp__device_enter(&g, cs->o.device, err, err_size);
    if (rc != KVP_OK) return rc;
    cudaError_t e = cudaStreamSynchronize(cs->o.stream);
    kvp__device_leave(&g);
    return kvp__cuda_status(e, err, err_size, "cudaStreamSynchronize");
}
