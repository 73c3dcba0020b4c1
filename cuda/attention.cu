/*
 * CUDA backend: the attention context (device workspace, staging) and the
 * host side of paged attention: schedule, upload, launch.
 *
 * Schedule. Units = (sequence, kv head, block of R rows); R = 1, 2, 4 or 8,
 * the smallest power of two holding the longest sequence's rows of one kv
 * head (the GQA group for decode), at most 8. When the units cannot fill the
 * device (fewer than the SMs times the CTAs of the kernel one SM holds, from
 * cudaOccupancyMaxActiveBlocksPerMultiprocessor: small batches, long
 * contexts), each sequence's pages are split into up to that factor of
 * ranges of at least 256 tokens (flash-decoding); the splits' partial
 * results (m, l, o) go to the context's workspace and a merge kernel
 * combines them. No split when the workspace cannot hold the partials.
 * Kernel: the copy pipeline (k_attention_pipe) when plan_pipe finds that
 * the store's pages fit a tile, its blocks are 16-byte aligned and the
 * stages fit the device's shared memory, else the single-buffer loader
 * (k_attention). Everything the kernels need about
 * the batch (the CSR view, qo_indptr, the schedule) is uploaded in one copy,
 * or not at all when it is identical to the last one (every layer of a step).
 * The kernels of each head dimension are compiled in a file of their own
 * (attention_d64.cu ... attention_d256.cu), so that the build's longest work
 * runs on several cores.
 */
#include "attention.cuh"

using namespace kvp_attn;

#define MIN_SPLIT_TOKENS 256
/* Dynamic shared memory a kernel may use without opting in. */
#define DEFAULT_SMEM_LIMIT (48 * 1024)
/* The copy pipeline's ceiling: the device's per-block limit, less room for
 * the kernel's static shared memory (48 bytes) */
#define PIPE_SMEM_LIMIT(cc) ((cc)->smem_optin - 1024)

namespace {

/* The head dimensions with kernels; a context's occupancy cache is indexed
 * by the position here. */
const struct {
    int32_t D;
    const dim_kernels *k;
} dims[] = {{64, &dims_64}, {80, &dims_80}, {96, &dims_96}, {128, &dims_128}, {256, &dims_256}};

int dim_index(int32_t D) {
    for (int i = 0; i < (int)(sizeof dims / sizeof dims[0]); i++)
        if (dims[i].D == D) return i;
    return -1;
}

int32_t kind_of(int32_t format) {
    return format == KVP_FORMAT_FP32 ? KIND_F32 : format == KVP_FORMAT_BF16 ? KIND_BF16 : KIND_F16;
}

/* Does the 16-byte loader cover this block format at page size P? */
bool fast_loader(const kvp__blockfmt &f, int32_t P) {
    switch (f.format) {
    case KVP_FORMAT_INT8: return P % 4 == 0;
    case KVP_FORMAT_INT4_V1:
    case KVP_FORMAT_INT4: return f.is_key ? P % 8 == 0 : P % 4 == 0;
    default:
        if (!kvp__blockfmt_dim_major(&f)) return true;
        return P % (16 / kvp__plain_size(f.format)) == 0;
    }
}

/* One attention call, as the host sees it. */
struct call {
    kvp__geo g;
    int32_t batch, group, q_heads;
    const int32_t *qo;      /* [B+1] */
    const int32_t *indptr;  /* [B+1] */
    const int32_t *indices;
    const int32_t *last;
    const void *q;
    void *out;
    float *lse;
    int32_t dtype;
    float sm_scale, soft_cap;
    int32_t causal, window;
};

size_t up8(size_t x) { return (x + 7) & ~(size_t)7; }

/* CTAs of attention kernel `ka` (`smem` bytes of dynamic shared memory) one
 * SM holds at once, asked once per context, variant (di, ri, pipeline) and
 * size. A kernel above the default dynamic shared memory limit is opted in first
 * (which its launch needs anyway), to the device's whole per-block limit:
 * the attribute belongs to the kernel, not to this context or size, so a
 * smaller value set for another call would fail this one's launch. If the
 * occupancy query fails: 1, and the query's own error is not left pending
 * (an earlier one stays). */
int ctas_per_sm(kvp__cuda_ctx *cc, attn_kernel ka, int di, int ri, int pipe, int smem, int *ctas,
                char *err, size_t err_size) {
    for (int w = 0; w < KVP__OCC_WAYS; w++)
        if (cc->occ[di][ri][pipe][w].ctas > 0 && cc->occ[di][ri][pipe][w].smem == smem) {
            *ctas = cc->occ[di][ri][pipe][w].ctas;
            return KVP_OK;
        }
    if (smem > DEFAULT_SMEM_LIMIT) {
        cudaFuncAttributes fa;
        memset(&fa, 0, sizeof fa);
        KVP_CUDA_TRY(cudaFuncGetAttributes(&fa, ka), err, err_size,
                     "cudaFuncGetAttributes (attention kernel)");
        const int most = cc->smem_optin - (int)fa.sharedSizeBytes; /* less its static memory */
        KVP_CUDA_TRY(cudaFuncSetAttribute(ka, cudaFuncAttributeMaxDynamicSharedMemorySize, most), err,
                     err_size, "cudaFuncSetAttribute (attention kernel shared memory)");
    }
    bool clean = cudaPeekAtLastError() == cudaSuccess;
    int n = 0;
    cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, ka, NT, (size_t)smem);
    if (e != cudaSuccess && clean) (void)cudaGetLastError();
    *ctas = e == cudaSuccess && n > 0 ? n : 1;
    const int w = cc->occ_next[di][ri][pipe];
    cc->occ[di][ri][pipe][w].smem = smem;
    cc->occ[di][ri][pipe][w].ctas = *ctas;
    cc->occ_next[di][ri][pipe] = (w + 1) % KVP__OCC_WAYS;
    return KVP_OK;
}

/* With timing on: record timing event `which` (0: before the first kernel,
 * 1: after the last) on the context's stream. */
int mark(kvp__cuda_ctx *cc, int which, char *err, size_t err_size) {
    if (!cc->timing) return KVP_OK;
    KVP_CUDA_TRY(cudaEventRecord(cc->timing_ev[which], cc->o.stream), err, err_size,
                 "cudaEventRecord (kernel timing)");
    if (which == 1) cc->timed = true;
    return KVP_OK;
}

int launch(kvp_ctx_t *c, const call &in) {
    kvp__cuda_ctx *cc = kvp__cctx(c);
    char *err = c->error;
    const size_t err_size = KVP_ERR_SIZE;
    const int32_t B = in.batch, P = in.g.P, D = in.g.D, H = in.g.H;
    const int di = dim_index(D);
    if (di < 0) return kvp__errf(err, err_size, KVP_ENOTSUP, "head_dim %d", (int)D);

    /* rows per CTA */
    int32_t max_rows = 0;
    for (int32_t b = 0; b < B; b++) {
        int32_t q_len = in.qo[b + 1] - in.qo[b];
        if (q_len * in.group > max_rows) max_rows = q_len * in.group;
    }
    int R = 1, ri = 0;
    while (R < max_rows && R < 8) {
        R *= 2;
        ri++;
    }

    /* the kernels, and how many CTAs of this one an SM holds */
    const int32_t kind_k = kind_of(in.g.fmt[0].format), kind_v = kind_of(in.g.fmt[1].format);
    attn_kernel ka = nullptr, km = nullptr;
    int smem = 0;
    pipe_plan pl;
    memset(&pl, 0, sizeof pl);
    const dim_kernels &dk = *dims[di].k;
    km = dk.merge[ri];
    smem = dk.smem(kind_k, kind_v, R);
    if (cc->pipeline) pl = dk.plan(in.g, kind_k, kind_v, R, PIPE_SMEM_LIMIT(cc));
    ka = pl.ok ? dk.pipe_attn[ri] : dk.attn[ri];
    if (pl.ok) smem = pl.smem;
    int occ = 0;
    int rc = ctas_per_sm(cc, ka, di, ri, pl.ok, smem, &occ, err, err_size);
    if (rc != KVP_OK) return rc;
    cc->last_smem = smem;
    cc->last_pipe = pl.ok;
    cc->last_stages = pl.ok ? pl.stages : 0;
    cc->last_kint = pl.ok && pl.kint;

    /* metadata layout: int32 arrays, then int64 part_off, then indices */
    const int32_t nnz = in.indptr[B];
    size_t o_qo = 0, o_indptr = o_qo + (size_t)(B + 1) * 4, o_last = o_indptr + (size_t)(B + 1) * 4;
    size_t o_items = o_last + (size_t)B * 4, o_splits = o_items + (size_t)(B + 1) * 4;
    size_t o_per = o_splits + (size_t)B * 4, o_merge = o_per + (size_t)B * 4;
    size_t o_part = up8(o_merge + (size_t)(B + 1) * 4), o_idx = o_part + (size_t)B * 8;
    size_t bytes = o_idx + (size_t)nnz * 4;
    uint8_t *host = nullptr;
    rc = kvp__stage_begin(&cc->o, bytes, &host, err, err_size, "this batch's view and schedule");
    if (rc != KVP_OK) return rc;
    int32_t *qo = (int32_t *)(void *)(host + o_qo), *indptr = (int32_t *)(void *)(host + o_indptr);
    int32_t *last = (int32_t *)(void *)(host + o_last), *items = (int32_t *)(void *)(host + o_items);
    int32_t *splits = (int32_t *)(void *)(host + o_splits), *per = (int32_t *)(void *)(host + o_per);
    int32_t *merge = (int32_t *)(void *)(host + o_merge);
    int64_t *part = (int64_t *)(void *)(host + o_part);
    for (int32_t b = 0; b <= B; b++) {
        qo[b] = in.qo[b];
        indptr[b] = in.indptr[b];
    }
    for (int32_t b = 0; b < B; b++) last[b] = in.last ? in.last[b] : 0;
    if (nnz > 0) memcpy(host + o_idx, in.indices, (size_t)nnz * 4);

    /* units, then splits while the workspace holds their partials */
    int64_t base_units = 0;
    for (int32_t b = 0; b < B; b++) {
        int32_t rows = (qo[b + 1] - qo[b]) * in.group;
        base_units += rows > 0 ? (int64_t)H * ((rows + R - 1) / R) : 0;
    }
    const int64_t target = (int64_t)cc->sm_count * occ;
    cc->split_target = target;
    int64_t factor = base_units > 0 && base_units < target ? (target + base_units - 1) / base_units : 1;
    const int32_t min_pages = (MIN_SPLIT_TOKENS + P - 1) / P;
    const uint64_t part_floats = (uint64_t)R * (uint64_t)(D + 2);
    for (int pass = 0; pass < 2; pass++) {
        uint64_t used = 0;
        for (int32_t b = 0; b < B; b++) {
            int32_t pages = indptr[b + 1] - indptr[b], rows = (qo[b + 1] - qo[b]) * in.group;
            int64_t s = factor, most = (pages + min_pages - 1) / min_pages;
            if (s > most) s = most;
            if (s < 1) s = 1;
            int32_t pp = pages > 0 ? (int32_t)((pages + s - 1) / s) : 1;
            s = pages > 0 ? (pages + pp - 1) / pp : 1;
            splits[b] = (int32_t)s;
            per[b] = pp;
            part[b] = -1;
            if (s > 1) {
                part[b] = (int64_t)used;
                used += (uint64_t)H * (uint64_t)((rows + R - 1) / R) * (uint64_t)s * part_floats;
            }
        }
        if (used * sizeof(float) <= cc->partial_bytes) break;
        factor = 1;
    }
    int64_t nitems = 0, nmerge = 0;
    for (int32_t b = 0; b < B; b++) {
        int32_t rows = (qo[b + 1] - qo[b]) * in.group;
        int64_t units = rows > 0 ? (int64_t)H * ((rows + R - 1) / R) : 0;
        items[b] = (int32_t)nitems;
        merge[b] = (int32_t)nmerge;
        nitems += units * splits[b];
        if (splits[b] > 1) nmerge += units;
    }
    items[B] = (int32_t)nitems;
    merge[B] = (int32_t)nmerge;
    if (nitems > INT32_MAX)
        return kvp__errf(err, err_size, KVP_EINVAL, "%lld work items exceed a launch",
                         (long long)nitems);
    const uint8_t *dev = nullptr;
    rc = kvp__stage_commit(&cc->o, bytes, &dev, err, err_size);
    if (rc != KVP_OK || nitems == 0) return rc;

    params k;
    memset(&k, 0, sizeof k);
    k.g = in.g;
    k.kind[0] = kind_k;
    k.kind[1] = kind_v;
    k.fast[0] = fast_loader(in.g.fmt[0], P);
    k.fast[1] = fast_loader(in.g.fmt[1], P);
    k.sfast = fast_loader(in.g.sfmt[0], P);
    k.batch = B;
    k.group = in.group;
    k.q_heads = in.q_heads;
    k.R = R;
    k.qo = (const int32_t *)(const void *)(dev + o_qo);
    k.indptr = (const int32_t *)(const void *)(dev + o_indptr);
    k.last = (const int32_t *)(const void *)(dev + o_last);
    k.item_start = (const int32_t *)(const void *)(dev + o_items);
    k.splits = (const int32_t *)(const void *)(dev + o_splits);
    k.split_pages = (const int32_t *)(const void *)(dev + o_per);
    k.merge_start = (const int32_t *)(const void *)(dev + o_merge);
    k.part_off = (const int64_t *)(const void *)(dev + o_part);
    k.indices = (const int32_t *)(const void *)(dev + o_idx);
    k.q = (const uint8_t *)in.q;
    k.out = (uint8_t *)in.out;
    k.lse = in.lse;
    k.dtype = in.dtype;
    k.esize = (int32_t)kvp__dtype_size(in.dtype);
    k.sm_scale = in.sm_scale;
    k.soft_cap = in.soft_cap;
    k.causal = in.causal;
    k.window = in.window;
    k.partials = cc->partials;
    if (pl.ok) {
        k.pipe = 1;
        k.stages = pl.stages;
        k.stage_k = pl.stage_k;
        k.stage_v = pl.stage_v;
        k.copy_k = pl.copy_k;
        k.copy_v = pl.copy_v;
        k.direct[0] = pl.direct[0];
        k.direct[1] = pl.direct[1];
        k.sdirect = pl.sdirect;
        k.dec_k = pl.dec_k;
        k.dec_v = pl.dec_v;
        k.slot_k = pl.slot_k;
        k.slot_v = pl.slot_v;
        k.kint = pl.kint;
    }

    rc = mark(cc, 0, err, err_size);
    if (rc != KVP_OK) return rc;
    rc = kvp__cuda_status(KVP_LAUNCH(ka, dim3((unsigned)nitems), dim3(NT), (size_t)smem,
                                     cc->o.stream, k),
                          err, err_size, "attention kernel");
    if (rc == KVP_OK && nmerge > 0)
        rc = kvp__cuda_status(KVP_LAUNCH(km, dim3((unsigned)nmerge), dim3(NT), 0, cc->o.stream, k),
                              err, err_size, "split merge kernel");
    return rc == KVP_OK ? mark(cc, 1, err, err_size) : rc;
}

} // namespace

int kvp__cuda_attention(kvp_ctx_t *c, const kvp__attn_args *a) {
    kvp__cuda_ctx *cc = kvp__cctx(c);
    kvp__cuda_store *cs = kvp__cstore(a->store);
    if (cs->o.device != cc->o.device)
        return kvp__errf(c->error, KVP_ERR_SIZE, KVP_EINVAL,
                         "the context is on device %d, the store on device %d", cc->o.device,
                         cs->o.device);
    kvp__device_guard g;
    int rc = kvp__device_enter(&g, cc->o.device, c->error, KVP_ERR_SIZE);
    if (rc != KVP_OK) return rc;
    const kvp_attention_params_t *p = a->p;
    call in;
    memset(&in, 0, sizeof in);
    in.g = kvp__make_geo(a->store, p->layer);
    in.batch = a->view->batch;
    in.group = a->group;
    in.q_heads = p->q_heads;
    in.qo = p->qo_indptr;
    in.indptr = a->view->indptr;
    in.indices = a->view->indices;
    in.last = a->view->last_page_len;
    in.q = p->q;
    in.out = p->out;
    in.lse = p->lse;
    in.dtype = p->dtype;
    in.sm_scale = a->sm_scale;
    in.soft_cap = p->logit_soft_cap;
    in.causal = p->causal;
    in.window = p->window_left;
    if (in.batch > 0 && in.indices == nullptr) {
        static const int32_t none = 0; /* a batch whose sequences hold no page */
        in.indices = &none;
    }
    cc->timed = false;
    rc = in.batch > 0 ? launch(c, in) : KVP_OK;
    if (rc == KVP_OK && cc->timing && !cc->timed) { /* no kernel ran: an empty interval */
        rc = mark(cc, 0, c->error, KVP_ERR_SIZE);
        if (rc == KVP_OK) rc = mark(cc, 1, c->error, KVP_ERR_SIZE);
    }
    kvp__device_leave(&g);
    return rc;
}

/* ---- kernel timing ------------------------------------------------------------------------------ */

int kvp__cuda_ctx_set_timing(kvp_ctx_t *c, int enable) {
    kvp__cuda_ctx *cc = kvp__cctx(c);
    if (enable != 0 && enable != 1)
        return kvp__errf(c->error, KVP_ERR_SIZE, KVP_EINVAL, "enable must be 0 or 1, got %d",
                         enable);
    if (enable && !cc->timing_ev_ok) {
        kvp__device_guard g;
        int rc = kvp__device_enter(&g, cc->o.device, c->error, KVP_ERR_SIZE);
        if (rc != KVP_OK) return rc;
        cudaError_t e = cudaEventCreate(&cc->timing_ev[0]);
        if (e == cudaSuccess) {
            e = cudaEventCreate(&cc->timing_ev[1]);
            if (e != cudaSuccess) (void)cudaEventDestroy(cc->timing_ev[0]);
        }
        kvp__device_leave(&g);
        if (e != cudaSuccess) return kvp__cuda_status(e, c->error, KVP_ERR_SIZE, "cudaEventCreate");
        cc->timing_ev_ok = true;
    }
    if (enable) cc->timed = false;
    cc->timing = enable != 0;
    return KVP_OK;
}

int kvp__cuda_ctx_kernel_time(kvp_ctx_t *c, double *seconds) {
    kvp__cuda_ctx *cc = kvp__cctx(c);
    if (seconds == nullptr) return kvp__errf(c->error, KVP_ERR_SIZE, KVP_EINVAL, "seconds is NULL");
    if (!cc->timed)
        return kvp__errf(c->error, KVP_ERR_SIZE, KVP_ESTATE,
                         cc->timing ? "no attention call since timing was turned on"
                                    : "timing is off (kvp_cuda_ctx_set_timing)");
    kvp__device_guard g;
    int rc = kvp__device_enter(&g, cc->o.device, c->error, KVP_ERR_SIZE);
    if (rc != KVP_OK) return rc;
    float ms = 0.0f;
    cudaError_t e = cudaEventSynchronize(cc->timing_ev[1]);
    if (e == cudaSuccess) e = cudaEventElapsedTime(&ms, cc->timing_ev[0], cc->timing_ev[1]);
    kvp__device_leave(&g);
    if (e != cudaSuccess) return kvp__cuda_status(e, c->error, KVP_ERR_SIZE, "kernel timing");
    *seconds = ms > 0.0f ? (double)ms * 1e-3 : 0.0;
    return KVP_OK;
}

/* ---- the context ------------------------------------------------------------------------------ */

int kvp__cuda_ctx_init(kvp_ctx_t *c, const void *bparams, char *err, size_t err_size) {
    kvp__cuda_ctx *cc = (kvp__cuda_ctx *)kvp__calloc(&c->allocator, 1, sizeof *cc, 64);
    if (cc == nullptr) return kvp__errf(err, err_size, KVP_ENOMEM, "cannot allocate the CUDA state");
    c->backend_state = cc;
    kvp__device_guard g;
    int rc = kvp__obj_init(&cc->o, (const kvp_cuda_params_t *)bparams, &g, err, err_size);
    if (rc == KVP_OK) {
        c->device = cc->o.device;
        int sms = 0;
        cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, cc->o.device);
        rc = kvp__cuda_status(e, err, err_size, "cudaDeviceGetAttribute");
        cc->sm_count = sms > 0 ? sms : 1;
    }
    if (rc == KVP_OK) {
        int optin = 0;
        cudaError_t e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                               cc->o.device);
        rc = kvp__cuda_status(e, err, err_size, "cudaDeviceGetAttribute");
        cc->smem_optin = optin > DEFAULT_SMEM_LIMIT ? optin : DEFAULT_SMEM_LIMIT;
        cc->pipeline = true;
    }
    if (rc == KVP_OK) {
        void *w = nullptr;
        rc = kvp__obj_alloc(&cc->o, c->workspace_bytes, &w, err, err_size, "the attention workspace");
        cc->partials = (float *)w;
        cc->partial_bytes = c->workspace_bytes;
    }
    kvp__device_leave(&g);
    if (rc != KVP_OK) kvp__cuda_ctx_fini(c);
    return rc;
}

void kvp__cuda_ctx_fini(kvp_ctx_t *c) {
    kvp__cuda_ctx *cc = kvp__cctx(c);
    if (cc == nullptr) return;
    kvp__device_guard g;
    bool entered = kvp__device_enter(&g, cc->o.device, nullptr, 0) == KVP_OK;
    if (cc->partials != nullptr) (void)cudaStreamSynchronize(cc->o.stream);
    if (cc->timing_ev_ok) {
        (void)cudaEventDestroy(cc->timing_ev[0]);
        (void)cudaEventDestroy(cc->timing_ev[1]);
    }
    kvp__obj_free(&cc->o, cc->partials, cc->partial_bytes);
    kvp__obj_fini(&cc->o);
    if (entered) kvp__device_leave(&g);
    kvp__free(&c->allocator, cc);
    c->backend_state = nullptr;
}
