/*
 * Execution context (threads, workspace, ISA) and the attention front end:
 * every argument is checked here, before a backend runs.
 */
#include "backend.h"

#include <string.h>

#define DEFAULT_WORKSPACE (16ull << 20)
#define CTX_ERR(c, status, ...) kvp__errf((c)->error, KVP_ERR_SIZE, status, __VA_ARGS__)

static const char *const isa_names[KVP_ISA_COUNT] = {"auto",   "portable", "avx2",        "avx512",
                                                      "avx512-bf16", "neon", "neon-dotprod"};

const char *kvp_isa_name(int32_t isa) {
    return isa >= KVP_ISA_AUTO && isa < KVP_ISA_COUNT ? isa_names[isa] : NULL;
}

int kvp_isa_supported(int32_t isa) {
    switch (isa) {
    case KVP_ISA_AUTO:
    case KVP_ISA_PORTABLE: return 1;
    case KVP_ISA_AVX2: return kvp__cpu_has_avx2() ? 1 : 0;
    case KVP_ISA_AVX512: return kvp__cpu_has_avx512() ? 1 : 0;
    case KVP_ISA_AVX512_BF16: return kvp__cpu_has_avx512_bf16() ? 1 : 0;
    case KVP_ISA_NEON: return kvp__cpu_has_neon() ? 1 : 0;
    case KVP_ISA_NEON_DOTPROD: return kvp__cpu_has_neon_dotprod() ? 1 : 0;
    default: return 0;
    }
}

void kvp_ctx_params_init(kvp_ctx_params_t *p) {
    if (p == NULL) return;
    memset(p, 0, sizeof *p);
    p->struct_size = sizeof *p;
    p->threads = 1;
    p->isa = KVP_ISA_AUTO;
    p->workspace_bytes = DEFAULT_WORKSPACE;
}

int kvp__ctx_create(const kvp_ctx_params_t *p, const kvp__backend *backend, const void *bparams,
                    kvp_ctx_t **out, char *err, size_t err_size) {
    int rc = kvp__check_struct(p, sizeof *p, "params", err, err_size);
    if (rc != KVP_OK) return rc;
    rc = kvp__allocator_check(&p->allocator, err, err_size);
    if (rc != KVP_OK) return rc;
    if (out == NULL) return kvp__errf(err, err_size, KVP_EINVAL, "out is NULL");
    if (p->threads < 1 || p->threads > 256)
        return kvp__errf(err, err_size, KVP_EINVAL, "threads must be 1..256, got %d",
                         (int)p->threads);
    if (kvp_isa_name(p->isa) == NULL)
        return kvp__errf(err, err_size, KVP_EINVAL, "isa %d is not a kvp_isa", (int)p->isa);
    bool cpu = backend->id == KVP_BACKEND_CPU;
    if (cpu && !kvp_isa_supported(p->isa))
        return kvp__errf(err, err_size, KVP_ENOTSUP, "this CPU cannot run the %s kernels",
                         kvp_isa_name(p->isa));
    rc = kvp__check_reserved(p->reserved_, "params", err, err_size);
    if (rc != KVP_OK) return rc;
    uint64_t ws = p->workspace_bytes != 0 ? p->workspace_bytes : DEFAULT_WORKSPACE;
    if (ws < 4096 || ws > ((uint64_t)1 << 40))
        return kvp__errf(err, err_size, KVP_EINVAL, "workspace_bytes must be 4 KiB .. 1 TiB");
    kvp_ctx_t *c = (kvp_ctx_t *)kvp__calloc(&p->allocator, 1, sizeof *c, 64);
    if (c == NULL) return kvp__errf(err, err_size, KVP_ENOMEM, "cannot allocate the context");
    c->backend = backend;
    c->error = c->error_text;
    c->device = -1;
    c->allocator = p->allocator;
    c->threads = p->threads;
    c->isa = !cpu ? -1 : p->isa == KVP_ISA_AUTO ? kvp__cpu_best_isa() : p->isa;
    c->workspace_bytes = ws;
    rc = c->backend->ctx_init(c, bparams, err, err_size);
    if (rc != KVP_OK) {
        kvp__free(&p->allocator, c);
        return rc;
    }
    *out = c;
    return KVP_OK;
}

int kvp_ctx_create(const kvp_ctx_params_t *p, kvp_ctx_t **out, char *err, size_t err_size) {
    return kvp__ctx_create(p, &kvp__cpu_backend, NULL, out, err, err_size);
}

void kvp_ctx_destroy(kvp_ctx_t *c) {
    if (c == NULL) return;
    kvp_allocator_t a = c->allocator;
    c->backend->ctx_fini(c);
    kvp__free(&a, c);
}

const char *kvp_ctx_last_error(const kvp_ctx_t *c) {
    return c == NULL ? KVP__NULL_HANDLE : c->error;
}

int kvp_ctx_info(const kvp_ctx_t *c, kvp_ctx_info_t *info) {
    if (c == NULL) return KVP_EINVAL;
    int rc = kvp__check_struct(info, sizeof *info, "info", c->error, KVP_ERR_SIZE);
    if (rc != KVP_OK) return rc;
    kvp_ctx_info_t r = {sizeof r, c->backend->id, c->device, c->isa, c->threads, 0,
                        c->workspace_bytes};
    kvp__copy_out(info, &r, sizeof r);
    return KVP_OK;
}

void kvp_attention_params_init(kvp_attention_params_t *p) {
    if (p == NULL) return;
    memset(p, 0, sizeof *p);
    p->struct_size = sizeof *p;
    p->dtype = KVP_FORMAT_FP32;
    p->causal = 1;
    p->window_left = -1;
}

static bool attn_head_dim_ok(int32_t d) {
    return d == 64 || d == 80 || d == 96 || d == 128 || d == 256;
}

static int check_view(kvp_ctx_t *c, const kvp_store_t *s, const kvp_kv_view_t *v,
                      const int32_t *qo, int32_t q_heads) {
    int rc = kvp__check_reserved(v->reserved_, "view", c->error, KVP_ERR_SIZE);
    if (rc != KVP_OK) return rc;
    if (v->batch < 0) return CTX_ERR(c, KVP_EINVAL, "view batch is negative (%d)", (int)v->batch);
    if (v->page_size != s->layout.page_size)
        return CTX_ERR(c, KVP_EINVAL, "view page_size %d differs from the store's %d",
                       (int)v->page_size, (int)s->layout.page_size);
    if (v->num_pages != s->num_pages || v->num_staging != s->num_staging)
        return CTX_ERR(c, KVP_EINVAL, "view has %d pool + %d staging pages, the store %d + %d",
                       (int)v->num_pages, (int)v->num_staging, (int)s->num_pages,
                       (int)s->num_staging);
    if (v->batch > 0 && (v->indptr == NULL || v->last_page_len == NULL))
        return CTX_ERR(c, KVP_EINVAL, "view indptr or last_page_len is NULL");
    if (v->batch > 0 && v->indptr[0] != 0)
        return CTX_ERR(c, KVP_EINVAL, "view indptr[0] must be 0, got %d", (int)v->indptr[0]);
    if (qo[0] != 0) return CTX_ERR(c, KVP_EINVAL, "qo_indptr[0] must be 0, got %d", (int)qo[0]);
    /* Differences and products in 64 bits: the arrays are the caller's. The
     * kernels count tokens and query-head rows in 32 bits, so both are
     * bounded here. */
    int64_t P = s->layout.page_size, limit = (int64_t)s->num_pages + s->num_staging;
    for (int32_t b = 0; b < v->batch; b++) {
        int64_t n = (int64_t)v->indptr[b + 1] - v->indptr[b];
        if (n < 0) return CTX_ERR(c, KVP_EINVAL, "view indptr decreases at sequence %d", (int)b);
        if (n > 0 && v->indices == NULL) return CTX_ERR(c, KVP_EINVAL, "view indices is NULL");
        int32_t last = v->last_page_len[b];
        if (n > 0 && (last < 1 || last > P))
            return CTX_ERR(c, KVP_EINVAL, "last_page_len[%d] = %d outside 1..%d", (int)b,
                           (int)last, (int)P);
        int64_t kv_len = n == 0 ? 0 : (n - 1) * P + last;
        if (kv_len > INT32_MAX)
            return CTX_ERR(c, KVP_EINVAL, "sequence %d has %lld tokens (%lld pages); at most "
                           "2^31 - 1 are supported", (int)b, (long long)kv_len, (long long)n);
        for (int32_t i = v->indptr[b]; i < v->indptr[b + 1]; i++) {
            int32_t id = v->indices[i];
            if (id < 0 || id >= limit)
                return CTX_ERR(c, KVP_EINVAL, "sequence %d page %lld: id %d is not a page of the "
                               "store (0..%lld)", (int)b, (long long)i - v->indptr[b], (int)id,
                               (long long)limit - 1);
            if (id >= s->num_pages && i != v->indptr[b + 1] - 1)
                return CTX_ERR(c, KVP_EINVAL, "sequence %d: staging page %d is not its last page",
                               (int)b, (int)id);
        }
        int64_t q_len = (int64_t)qo[b + 1] - qo[b];
        if (q_len < 0) return CTX_ERR(c, KVP_EINVAL, "qo_indptr decreases at sequence %d", (int)b);
        if (q_len > kv_len)
            return CTX_ERR(c, KVP_EINVAL, "sequence %d has %lld query rows but only %lld tokens "
                           "(append its K/V first)", (int)b, (long long)q_len, (long long)kv_len);
    }
    /* qo_indptr starts at 0 and does not decrease: its last entry is the row count */
    int64_t head_rows = v->batch > 0 ? (int64_t)qo[v->batch] * q_heads : 0;
    if (head_rows > INT32_MAX)
        return CTX_ERR(c, KVP_EINVAL, "%d query rows x %d query heads exceed 2^31 - 1 head rows",
                       (int)qo[v->batch], (int)q_heads);
    return KVP_OK;
}

int kvp_attention(kvp_ctx_t *c, const kvp_store_t *s, const kvp_kv_view_t *v,
                  const kvp_attention_params_t *p) {
    if (c == NULL) return KVP_EINVAL;
    int rc = kvp__check_struct(p, sizeof *p, "params", c->error, KVP_ERR_SIZE);
    if (rc != KVP_OK) return rc;
    if (s == NULL) return CTX_ERR(c, KVP_EINVAL, "store is NULL");
    rc = kvp__check_struct(v, sizeof *v, "view", c->error, KVP_ERR_SIZE);
    if (rc != KVP_OK) return rc;
    if (s->backend != c->backend)
        return CTX_ERR(c, KVP_EINVAL, "the context runs on the %s backend, the store's arena is "
                       "on the %s backend", c->backend->name, s->backend->name);
    const kvp_layout_t *l = &s->layout;
    if (p->layer < 0 || p->layer >= l->layers)
        return CTX_ERR(c, KVP_EINVAL, "layer %d out of range 0..%d", (int)p->layer,
                       (int)l->layers - 1);
    if (p->q_heads < 1 || p->q_heads > KVP__MAX_Q_HEADS || p->q_heads % l->kv_heads != 0)
        return CTX_ERR(c, KVP_EINVAL, "q_heads %d must be a multiple of kv_heads %d in 1..%d",
                       (int)p->q_heads, (int)l->kv_heads, KVP__MAX_Q_HEADS);
    if (kvp__dtype_size(p->dtype) == 0)
        return CTX_ERR(c, KVP_EINVAL, "dtype %d: q and out must be fp32, fp16 or bf16", (int)p->dtype);
    if (p->causal != 0 && p->causal != 1)
        return CTX_ERR(c, KVP_EINVAL, "causal must be 0 or 1, got %d", (int)p->causal);
    if (p->window_left < -1)
        return CTX_ERR(c, KVP_EINVAL, "window_left must be -1 (none) or >= 0, got %d",
                       (int)p->window_left);
    if (!(p->sm_scale >= 0.0f) || !isfinite(p->sm_scale))
        return CTX_ERR(c, KVP_EINVAL, "sm_scale must be finite and > 0 (0: 1/sqrt(head_dim)), "
                       "got %g", (double)p->sm_scale);
    if (!(p->logit_soft_cap >= 0.0f) || !isfinite(p->logit_soft_cap))
        return CTX_ERR(c, KVP_EINVAL, "logit_soft_cap must be finite and >= 0 (0 = off), got %g",
                       (double)p->logit_soft_cap);
    if (!attn_head_dim_ok(l->head_dim))
        return CTX_ERR(c, KVP_ENOTSUP, "attention supports head_dim 64, 80, 96, 128 and 256; "
                       "the store has %d", (int)l->head_dim);
    if (p->qo_indptr == NULL) return CTX_ERR(c, KVP_EINVAL, "qo_indptr is NULL");
    rc = check_view(c, s, v, p->qo_indptr, p->q_heads);
    if (rc != KVP_OK) return rc;
    int32_t rows = v->batch > 0 ? p->qo_indptr[v->batch] : 0;
    if (rows > 0 && (p->q == NULL || p->out == NULL))
        return CTX_ERR(c, KVP_EINVAL, "q or out is NULL");
    kvp__attn_args a;
    a.store = s;
    a.view = v;
    a.p = p;
    a.group = p->q_heads / l->kv_heads;
    a.total_rows = rows;
    a.sm_scale = p->sm_scale != 0.0f ? p->sm_scale : 1.0f / sqrtf((float)l->head_dim);
    rc = c->backend->attention(c, &a);
    return rc;
}
