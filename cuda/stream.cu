/*
 * CUDA backend: the device guard, per-object device/stream/memory, and the
 * staging area that uploads per-call metadata (common.cuh explains why).
 */
#include "common.cuh"

int kvp__device_enter(kvp__device_guard *g, int device, char *err, size_t err_size) {
    g->switched = false;
    g->previous = 0;
    KVP_CUDA_TRY(cudaGetDevice(&g->previous), err, err_size, "cudaGetDevice");
    if (g->previous != device) {
        KVP_CUDA_TRY(cudaSetDevice(device), err, err_size, "cudaSetDevice");
        g->switched = true;
    }
    return KVP_OK;
}

void kvp__device_leave(kvp__device_guard *g) {
    if (g->switched) (void)cudaSetDevice(g->previous);
    g->switched = false;
}

/* ---- device memory ----------------------------------------------------------------- */

int kvp__obj_alloc(kvp__cuda_obj *o, uint64_t bytes, void **p, char *err, size_t err_size,
                   const char *what) {
    *p = nullptr;
    if (bytes == 0) return KVP_OK;
    if (o->alloc.alloc != nullptr) {
        void *m = o->alloc.alloc(o->alloc.opaque, (size_t)bytes, (void *)o->stream);
        if (m == nullptr)
            return kvp__errf(err, err_size, KVP_ENOMEM,
                             "the device allocator hook returned NULL for %s (%llu bytes)", what,
                             (unsigned long long)bytes);
        if (((uintptr_t)m & (KVP_ARENA_ALIGN - 1)) != 0) {
            o->alloc.free(o->alloc.opaque, m, (size_t)bytes, (void *)o->stream);
            return kvp__errf(err, err_size, KVP_EINVAL,
                             "the device allocator hook returned memory aligned below %d bytes "
                             "for %s", KVP_ARENA_ALIGN, what);
        }
        *p = m;
        return KVP_OK;
    }
    void *m = nullptr;
    cudaError_t e = cudaMalloc(&m, (size_t)bytes);
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* an allocation failure is not sticky: clear it */
        return kvp__errf(err, err_size, e == cudaErrorMemoryAllocation ? KVP_ENOMEM : KVP_ECUDA,
                         "cudaMalloc of %llu bytes for %s: %s (%s)", (unsigned long long)bytes,
                         what, cudaGetErrorString(e), cudaGetErrorName(e));
    }
    *p = m;
    return KVP_OK;
}

void kvp__obj_free(kvp__cuda_obj *o, void *p, uint64_t bytes) {
    if (p == nullptr) return;
    if (o->alloc.free != nullptr) o->alloc.free(o->alloc.opaque, p, (size_t)bytes, (void *)o->stream);
    else (void)cudaFree(p);
}

/* ---- the object ------------------------------------------------------------------------ */

int kvp__obj_init(kvp__cuda_obj *o, const kvp_cuda_params_t *p, kvp__device_guard *g, char *err,
                  size_t err_size) {
    g->switched = false; /* the caller releases the guard whatever happens */
    g->previous = 0;
    memset(o, 0, sizeof *o);
    o->stage.last = -1;
    o->stage.building = -1;
    kvp_cuda_params_t def;
    kvp_cuda_params_init(&def);
    if (p == nullptr) p = &def;
    int rc = kvp__check_struct(p, sizeof *p, "cuda params", err, err_size);
    if (rc != KVP_OK) return rc;
    if ((p->allocator.alloc == nullptr) != (p->allocator.free == nullptr))
        return kvp__errf(err, err_size, KVP_EINVAL,
                         "cuda allocator: set both alloc and free, or neither");
    if (p->device < 0)
        return kvp__errf(err, err_size, KVP_EINVAL, "device ordinal %d is negative", (int)p->device);
    uint64_t staging = p->staging_bytes != 0 ? p->staging_bytes : KVP__DEFAULT_STAGING;
    if (staging < 4096 || staging > ((uint64_t)1 << 36))
        return kvp__errf(err, err_size, KVP_EINVAL, "staging_bytes must be 4 KiB .. 64 GiB");
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return kvp__cuda_status(e, err, err_size, "cudaGetDeviceCount");
    }
    if (p->device >= n)
        return kvp__errf(err, err_size, KVP_ENODEV, "device %d does not exist (%d visible)",
                         (int)p->device, n);
    rc = kvp__device_enter(g, p->device, err, err_size);
    if (rc != KVP_OK) return rc;
    o->device = p->device;
    o->stream = (cudaStream_t)p->stream;
    o->alloc = p->allocator;
    e = cudaEventCreateWithFlags(&o->order, cudaEventDisableTiming);
    if (e != cudaSuccess) return kvp__cuda_status(e, err, err_size, "cudaEventCreate");
    o->order_ok = true;
    kvp__stager *st = &o->stage;
    for (int i = 0; i < 2; i++) {
        e = cudaEventCreateWithFlags(&st->done[i], cudaEventDisableTiming);
        if (e != cudaSuccess) {
            if (i == 1) (void)cudaEventDestroy(st->done[0]);
            (void)cudaEventDestroy(o->order);
            o->order_ok = false;
            return kvp__cuda_status(e, err, err_size, "cudaEventCreate");
        }
    }
    st->half = staging / 2 / 256 * 256;
    void *h = nullptr;
    e = cudaMallocHost(&h, (size_t)(2 * st->half));
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        kvp__obj_fini(o);
        return kvp__errf(err, err_size, KVP_ENOMEM, "cudaMallocHost of %llu staging bytes: %s",
                         (unsigned long long)(2 * st->half), cudaGetErrorString(e));
    }
    st->host = (uint8_t *)h;
    void *d = nullptr;
    rc = kvp__obj_alloc(o, 2 * st->half, &d, err, err_size, "the staging area");
    if (rc != KVP_OK) {
        kvp__obj_fini(o);
        return rc;
    }
    st->dev = (uint8_t *)d;
    return KVP_OK;
}

void kvp__obj_fini(kvp__cuda_obj *o) {
    kvp__stager *st = &o->stage;
    if (o->order_ok) {
        /* the staging halves may still be read by enqueued work */
        (void)cudaStreamSynchronize(o->stream);
        (void)cudaEventDestroy(st->done[0]);
        (void)cudaEventDestroy(st->done[1]);
        (void)cudaEventDestroy(o->order);
        o->order_ok = false;
    }
    if (st->host != nullptr) (void)cudaFreeHost(st->host);
    kvp__obj_free(o, st->dev, 2 * st->half);
    st->host = nullptr;
    st->dev = nullptr;
}

int kvp__obj_set_stream(kvp__cuda_obj *o, cudaStream_t s, char *err, size_t err_size) {
    if (s == o->stream) return KVP_OK;
    /* everything enqueued so far (arena writes, staging copies) happens
     * before anything enqueued from now on */
    KVP_CUDA_TRY(cudaEventRecord(o->order, o->stream), err, err_size, "cudaEventRecord");
    KVP_CUDA_TRY(cudaStreamWaitEvent(s, o->order, 0), err, err_size, "cudaStreamWaitEvent");
    o->stream = s;
    return KVP_OK;
}

/* ---- staging ---------------------------------------------------------------------------- */

int kvp__stage_begin(kvp__cuda_obj *o, uint64_t bytes, uint8_t **host, char *err, size_t err_size,
                     const char *what) {
    kvp__stager *st = &o->stage;
    if (bytes > st->half)
        return kvp__errf(err, err_size, KVP_ENOMEM,
                         "%s needs %llu bytes of staging; this object has %llu per call "
                         "(raise kvp_cuda_params_t::staging_bytes)", what,
                         (unsigned long long)bytes, (unsigned long long)st->half);
    int h = st->last == 0 ? 1 : 0;
    if (st->pending[h]) {
        /* the copy out of this half was enqueued two uploads ago */
        KVP_CUDA_TRY(cudaEventSynchronize(st->done[h]), err, err_size, "cudaEventSynchronize");
        st->pending[h] = false;
    }
    st->building = h;
    *host = st->host + (uint64_t)h * st->half;
    return KVP_OK;
}

int kvp__stage_commit(kvp__cuda_obj *o, uint64_t bytes, const uint8_t **dev, char *err,
                      size_t err_size) {
    kvp__stager *st = &o->stage;
    int h = st->building;
    st->building = -1;
    const uint8_t *mine = st->host + (uint64_t)h * st->half;
    if (st->last >= 0 && st->size[st->last] == bytes &&
        memcmp(st->host + (uint64_t)st->last * st->half, mine, (size_t)bytes) == 0) {
        *dev = st->dev + (uint64_t)st->last * st->half; /* the same bytes are up already */
        return KVP_OK;
    }
    uint8_t *d = st->dev + (uint64_t)h * st->half;
    if (bytes > 0) {
        KVP_CUDA_TRY(cudaMemcpyAsync(d, mine, (size_t)bytes, cudaMemcpyHostToDevice, o->stream), err,
                     err_size, "cudaMemcpyAsync (metadata)");
        KVP_CUDA_TRY(cudaEventRecord(st->done[h], o->stream), err, err_size, "cudaEventRecord");
        st->pending[h] = true;
    }
    st->size[h] = bytes;
    st->last = h;
    *dev = d;
    return KVP_OK;
}

/* ---- the store's geometry for kernels --------------------------------------------------- */

kvp__geo kvp__make_geo(const kvp_store_t *s, int32_t layer) {
    kvp__geo g;
    memset(&g, 0, sizeof g);
    kvp__layer_offsets o = kvp__store_layer(s, layer);
    g.arena = s->arena;
    g.off[0] = o.k_offset;
    g.off[1] = o.v_offset;
    g.soff[0] = o.sk_offset;
    g.soff[1] = o.sv_offset;
    g.pstride[0] = s->page_stride_k;
    g.pstride[1] = s->page_stride_v;
    g.sstride[0] = s->spage_stride_k;
    g.sstride[1] = s->spage_stride_v;
    g.block[0] = s->layout.k_block_bytes;
    g.block[1] = s->layout.v_block_bytes;
    g.used[0] = kvp__block_used_bytes(&s->kfmt);
    g.used[1] = kvp__block_used_bytes(&s->vfmt);
    g.hstride[0] = s->head_stride_k;
    g.hstride[1] = s->head_stride_v;
    g.sblock = (uint64_t)s->layout.page_size * (uint64_t)s->layout.head_dim * 2;
    for (int side = 0; side < 2; side++) {
        float *t = side ? s->fp8_v : s->fp8_k;
        g.fp8[side] = t != nullptr ? t + (size_t)layer * (size_t)s->layout.kv_heads : nullptr;
        g.fp8w[side] = t != nullptr ? t + (size_t)layer * (size_t)s->layout.kv_heads : nullptr;
    }
    g.num_pages = s->num_pages;
    g.P = s->layout.page_size;
    g.D = s->layout.head_dim;
    g.H = s->layout.kv_heads;
    g.fmt[0] = s->kfmt;
    g.fmt[1] = s->vfmt;
    g.sfmt[0] = s->skfmt;
    g.sfmt[1] = s->svfmt;
    return g;
}
