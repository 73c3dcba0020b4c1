/*
 * The paged KV cache: kv_ops_t on libkvpage's kvp_cache_t, as an outside
 * engine uses it (only <kvpage.h>, linked through pkg-config).
 *
 *   seq_open / seq_fork / seq_close  kvp_cache_seq_create / _fork / _release
 *   seq_len                          kvp_table_seq_info on the cache's table
 *   seq_attach_prefix                kvp_cache_seq_attach_prefix with n - 1 tokens,
 *                                    so the prompt's last token is always computed
 *   begin_step                       kvp_cache_begin_step: reserve + append in the
 *                                    page table, copy-on-write on the arena, one
 *                                    export (CSR view + slots) for all layers
 *   append                           kvp_cache_write: quantize-on-write into the
 *                                    slots, pages that fill are sealed
 *   attend                           kvp_cache_attend: paged attention over the view
 *                                    (prefill chunks and decode rows alike)
 *   stats                            kvp_pool_stats + the layout's byte counts
 *
 * Threads. Attention runs on the library's threads (kvp_cache_params_t::
 * threads, sized like the engine's pool) between two of the engine's
 * matmuls, so the engine's pool is parked (its workers sleep instead of
 * spinning) while it runs. The other way round the engine has no say: the
 * library's workers spin for ~0.5 ms after each call before they sleep, and
 * in decode the next call comes sooner, so they would spin through every
 * matmul. Steps where every sequence brings one row (pure decode: short
 * attention calls) therefore attend on a second context with
 * `decode_threads` threads (default 1: the calling thread alone, nothing
 * spins), over the cache's own store and step view (kvp_cache_step_view +
 * kvp_attention), as llama.cpp sizes its threads apart for batches and for
 * generation. docs/PERFORMANCE.md has the measurements.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kvpage.h>
#include <kvpage_ext.h>  /* kvp_table_seq_info, kvp_store_info, kvp_status_name */
#include <kvpage_plan.h> /* kvp_layout_compute, kvp_format_parse */

#include "kv.h"

typedef struct {
    kv_cache_t base;
    kvp_cache_t *c;
    kvp_cache_parts_t parts; /* its pool, table, store (owned by the cache) */
    kv_paged_opts_t opts;
    kvp_layout_t layout;
    uint64_t arena_bytes;
    int64_t num_pages;
    int32_t threads;     /* the cache context's attention threads (prefill steps) */
    kvp_ctx_t *decode_ctx; /* pure-decode steps' context, or NULL: the cache's */
    int decode_step;     /* this step brings one row per sequence */
    /* the current step */
    int32_t *num_new;
    int32_t num_new_cap;
    /* peaks, sampled after every step */
    int64_t peak_pages, peak_staging;
    uint64_t peak_bytes;
    int64_t prefix_hit_pages;
    char name[64];
    char err[KVP_ERR_SIZE + 64];
} paged_kv;

static paged_kv *as_paged(kv_cache_t *kv) { return (paged_kv *)(void *)kv; }
static const paged_kv *as_paged_c(const kv_cache_t *kv) { return (const paged_kv *)(const void *)kv; }

static int kv_code(int status) {
    switch (status) {
    case KVP_OK: return KV_OK;
    case KVP_ENOSPC: return KV_ENOSPC;
    case KVP_ENOMEM: return KV_ENOMEM;
    case KVP_ENOTSUP: return KV_ENOTSUP;
    default: return KV_EINVAL;
    }
}

/* Keep the library's detail text of a failed call for kv_paged_last_error(). */
static int failed(paged_kv *p, const char *what, int status) {
    snprintf(p->err, sizeof p->err, "%s: %s: %s", what, kvp_status_name(status), kvp_cache_last_error(p->c));
    return kv_code(status);
}

void kv_paged_opts_init(kv_paged_opts_t *o) {
    memset(o, 0, sizeof *o);
    o->k_format = o->v_format = KVP_FORMAT_FP16;
    o->page_size = 16;
    o->prefix_cache = 1;
    o->threads = 0;
    o->k_order = KVP_K_ORDER_TOKEN_MAJOR;
}

static void paged_destroy(kv_cache_t *kv) {
    paged_kv *p = as_paged(kv);
    if (!p) return;
    kvp_cache_destroy(p->c);
    kvp_ctx_destroy(p->decode_ctx);
    free(p->num_new);
    free(p);
}

static int paged_open(kv_cache_t *kv, int32_t *seq_id) {
    paged_kv *p = as_paged(kv);
    int rc = kvp_cache_seq_create(p->c, 0, 0, seq_id);
    return rc == KVP_OK ? KV_OK : failed(p, "seq_create", rc);
}

static int paged_fork(kv_cache_t *kv, int32_t parent, int32_t *child) {
    paged_kv *p = as_paged(kv);
    int rc = kvp_cache_seq_fork(p->c, parent, child);
    return rc == KVP_OK ? KV_OK : failed(p, "seq_fork", rc);
}

static void paged_close(kv_cache_t *kv, int32_t seq_id) {
    paged_kv *p = as_paged(kv);
    int rc = kvp_cache_seq_release(p->c, seq_id);
    if (rc != KVP_OK) failed(p, "seq_release", rc); /* an unknown id: nothing to free */
}

static int32_t paged_len(const kv_cache_t *kv, int32_t seq_id) {
    kvp_seq_info_t info = {.struct_size = sizeof info};
    return kvp_table_seq_info(as_paged_c(kv)->parts.table, seq_id, &info) == KVP_OK
               ? (int32_t)info.length
               : -1;
}

static int32_t paged_attach_prefix(kv_cache_t *kv, int32_t seq_id, const int32_t *tokens, int32_t n) {
    paged_kv *p = as_paged(kv);
    int64_t matched = 0;
    if (n < 2 || !p->opts.prefix_cache) return 0;
    /* n - 1: the prompt's last token is prefilled, for its logits */
    int rc = kvp_cache_seq_attach_prefix(p->c, seq_id, tokens, n - 1, &matched);
    if (rc != KVP_OK) {
        failed(p, "attach_prefix", rc);
        return 0;
    }
    p->prefix_hit_pages += matched / p->layout.page_size;
    return (int32_t)matched;
}

static void sample_peaks(paged_kv *p) {
    kvp_pool_stats_t st = {.struct_size = sizeof st};
    if (kvp_pool_stats(p->parts.pool, &st) != KVP_OK) return;
    uint64_t bytes = (uint64_t)st.used_pages * p->layout.page_bytes +
                     (uint64_t)st.used_staging * p->layout.staging_page_bytes;
    if (st.used_pages > p->peak_pages) p->peak_pages = st.used_pages;
    if (st.used_staging > p->peak_staging) p->peak_staging = st.used_staging;
    if (bytes > p->peak_bytes) p->peak_bytes = bytes;
}

static int paged_begin(kv_cache_t *kv, const kv_batch_t *b) {
    paged_kv *p = as_paged(kv);
    if (b->n_seqs < 1 || b->q_start[0] != 0) return KV_EINVAL;
    if (b->n_seqs > p->num_new_cap) {
        int32_t *nn = realloc(p->num_new, (size_t)b->n_seqs * sizeof *nn);
        if (!nn) return KV_ENOMEM;
        p->num_new = nn;
        p->num_new_cap = b->n_seqs;
    }
    p->decode_step = 1;
    for (int32_t i = 0; i < b->n_seqs; i++) {
        p->num_new[i] = b->q_start[i + 1] - b->q_start[i];
        if (p->num_new[i] != 1) p->decode_step = 0;
        int32_t len = paged_len(kv, b->seq_ids[i]);
        if (p->num_new[i] < 1 || len < 0) return KV_EINVAL;
        /* the engine's per-sequence limit, as the contiguous cache has it */
        if (len + p->num_new[i] > kv->shape.max_len) {
            snprintf(p->err, sizeof p->err, "begin_step: sequence %d would hold %d tokens, more than max_len %d",
                     (int)b->seq_ids[i], (int)(len + p->num_new[i]), (int)kv->shape.max_len);
            return KV_ENOSPC;
        }
    }
    int rc = kvp_cache_begin_step(p->c, b->seq_ids, b->n_seqs, p->num_new, b->tokens);
    if (rc != KVP_OK) return failed(p, "begin_step", rc);
    sample_peaks(p);
    return KV_OK;
}

static int paged_append(kv_cache_t *kv, int32_t layer, const float *k, const float *v) {
    paged_kv *p = as_paged(kv);
    int rc = kvp_cache_write(p->c, layer, KVP_FORMAT_FP32, k, v, 0, 0);
    return rc == KVP_OK ? KV_OK : failed(p, "write", rc);
}

static int paged_attend(kv_cache_t *kv, int32_t layer, const float *q, float *out, float scale) {
    paged_kv *p = as_paged(kv);
    kvp_attention_params_t ap;
    kvp_attention_params_init(&ap);
    ap.layer = layer;
    ap.q_heads = kv->shape.n_q_heads;
    ap.dtype = KVP_FORMAT_FP32;
    ap.sm_scale = scale;
    ap.q = q;
    ap.out = out;
    if (p->decode_step && p->decode_ctx) { /* short calls: the decode context */
        kvp_kv_view_t view = {.struct_size = sizeof view};
        int rc = kvp_cache_step_view(p->c, &view, NULL, &ap.qo_indptr, NULL);
        if (rc == KVP_OK) rc = kvp_attention(p->decode_ctx, p->parts.store, &view, &ap);
        if (rc == KVP_OK) return KV_OK;
        snprintf(p->err, sizeof p->err, "attend (decode context): %s: %s", kvp_status_name(rc),
                 kvp_ctx_last_error(p->decode_ctx));
        return kv_code(rc);
    }
    /* the engine's workers sleep while the library's threads attend (with
     * one library thread the caller attends alone, and they may spin) */
    if (kv->pool && p->threads > 1) pool_park(kv->pool);
    int rc = kvp_cache_attend(p->c, &ap);
    return rc == KVP_OK ? KV_OK : failed(p, "attend", rc);
}

static void paged_end(kv_cache_t *kv) {
    (void)kv; /* kvp_cache_begin_step already advanced the lengths */
}

static void paged_stats(const kv_cache_t *kv, kv_stats_t *out) {
    const paged_kv *p = as_paged_c(kv);
    memset(out, 0, sizeof *out);
    out->impl = "libkvpage paged";
    out->k_format = kvp_format_name(p->opts.k_format);
    out->v_format = kvp_format_name(p->opts.v_format);
    kvp_pool_stats_t st = {.struct_size = sizeof st};
    if (kvp_pool_stats(p->parts.pool, &st) != KVP_OK) return;
    out->live_seqs = (int32_t)st.live_seqs;
    out->live_tokens = st.live_tokens;
    out->bytes_reserved = p->arena_bytes;
    out->bytes_live = (uint64_t)st.used_pages * p->layout.page_bytes +
                      (uint64_t)st.used_staging * p->layout.staging_page_bytes;
    out->prefix_hit_tokens = (int64_t)st.prefix_hit_tokens;
    out->prefix_lookups = (int64_t)st.prefix_lookups;
    out->prefix_lookup_tokens = (int64_t)(st.prefix_hit_tokens + st.prefix_miss_tokens);
    out->prefix_hit_pages = p->prefix_hit_pages;
    out->page_size = p->layout.page_size;
    out->page_bytes = p->layout.page_bytes;
    out->staging_page_bytes = p->layout.staging_page_bytes;
    out->pages_total = st.total_pages;
    out->pages_used = st.used_pages;
    out->pages_cached = st.cached_pages;
    out->pages_peak = p->peak_pages;
    out->staging_used = st.used_staging;
    out->staging_peak = p->peak_staging;
    out->bytes_peak = p->peak_bytes;
}

static const kv_ops_t paged_ops = {
    "libkvpage paged", paged_destroy, paged_open,  paged_fork, paged_close, paged_len,
    paged_attach_prefix, paged_begin, paged_append, paged_attend, paged_end, paged_stats,
};

kv_cache_t *kv_paged_create(const kv_shape_t *shape, pool_t *pool, const kv_paged_opts_t *o, char *err,
                            size_t err_size) {
    if (shape->n_layers < 1 || shape->n_kv_heads < 1 || shape->max_seqs < 1 || shape->max_len < 1 ||
        shape->n_q_heads % shape->n_kv_heads != 0) {
        snprintf(err, err_size, "bad KV shape");
        return NULL;
    }
    paged_kv *p = calloc(1, sizeof *p);
    if (!p) {
        snprintf(err, err_size, "out of memory");
        return NULL;
    }
    p->base.ops = &paged_ops;
    p->base.shape = *shape;
    p->base.pool = pool;
    p->opts = *o;
    p->layout.struct_size = sizeof p->layout;
    char e[KVP_ERR_SIZE] = "";
    int rc = kvp_layout_compute(shape->n_layers, shape->n_kv_heads, shape->head_dim, o->page_size, o->k_format,
                                o->v_format, &p->layout, e, sizeof e);
    /* enough pages for every sequence at its longest: an append never fails
     * for room; cached prefix pages are evicted when a sequence needs them */
    p->num_pages = o->num_pages > 0 ? o->num_pages
                                    : (int64_t)shape->max_seqs * ((shape->max_len + o->page_size - 1) / o->page_size);
    if (rc == KVP_OK) {
        kvp_cache_params_t cp;
        kvp_cache_params_init(&cp);
        cp.layers = shape->n_layers;
        cp.kv_heads = shape->n_kv_heads;
        cp.head_dim = shape->head_dim;
        cp.page_size = o->page_size;
        cp.k_format = o->k_format;
        cp.v_format = o->v_format;
        cp.k_order = o->k_order;
        cp.max_seqs = shape->max_seqs;
        cp.prefix_cache = o->prefix_cache;
        cp.threads = p->threads = o->threads > 0 ? o->threads : pool ? pool_threads(pool) : 1;
        cp.num_pages = p->num_pages;
        cp.isa = o->isa;
        rc = kvp_cache_create(&cp, &p->c, e, sizeof e);
    }
    p->parts.struct_size = sizeof p->parts;
    if (rc == KVP_OK) rc = kvp_cache_parts(p->c, &p->parts);
    kvp_store_info_t si = {.struct_size = sizeof si};
    if (rc == KVP_OK) rc = kvp_store_info(p->parts.store, &si);
    if (rc == KVP_OK) p->arena_bytes = si.arena_bytes;
    int32_t decode_threads = o->decode_threads > 0 ? o->decode_threads : 1;
    if (rc == KVP_OK && decode_threads != p->threads) {
        kvp_ctx_params_t xp;
        kvp_ctx_params_init(&xp);
        xp.threads = decode_threads;
        xp.isa = o->isa;
        rc = kvp_ctx_create(&xp, &p->decode_ctx, e, sizeof e);
    }
    if (rc != KVP_OK) {
        snprintf(err, err_size, "libkvpage: %s: %s", kvp_status_name(rc), e);
        paged_destroy(&p->base);
        return NULL;
    }
    snprintf(p->name, sizeof p->name, "libkvpage paged %s/%s, page %d", kvp_format_name(o->k_format),
             kvp_format_name(o->v_format), o->page_size);
    return &p->base;
}

const char *kv_paged_last_error(const kv_cache_t *kv) { return as_paged_c(kv)->err; }
const char *kv_paged_name(const kv_cache_t *kv) { return as_paged_c(kv)->name; }

/* One format name, of `len` bytes (not NUL-terminated). */
static int parse_format(const char *s, size_t len, int32_t *f, char *err, size_t err_size) {
    char name[32];
    if (len == 0 || len >= sizeof name) {
        snprintf(err, err_size, "empty or too long format name");
        return -1;
    }
    memcpy(name, s, len);
    name[len] = 0;
    char e[KVP_ERR_SIZE];
    if (kvp_format_parse(name, f, e, sizeof e) != KVP_OK) {
        snprintf(err, err_size, "%s", e);
        return -1;
    }
    return 0;
}

int kv_paged_parse(const char *spec, kv_paged_opts_t *o, char *err, size_t err_size) {
    const char *at = strchr(spec, '@'), *end = at ? at : spec + strlen(spec), *slash = strchr(spec, '/');
    int32_t k, v;
    if (slash && slash > end) slash = NULL;
    if ((size_t)(end - spec) == 4 && !strncmp(spec, "k8v4", 4)) {
        k = KVP_FORMAT_INT8, v = KVP_FORMAT_INT4;
    } else if (slash) {
        if (parse_format(spec, (size_t)(slash - spec), &k, err, err_size) ||
            parse_format(slash + 1, (size_t)(end - slash - 1), &v, err, err_size))
            return -1;
    } else {
        if (parse_format(spec, (size_t)(end - spec), &k, err, err_size)) return -1;
        v = k;
    }
    int32_t page = o->page_size;
    if (at) {
        char *stop;
        long p = strtol(at + 1, &stop, 10);
        if (*stop || p < 1 || p > KVP_MAX_PAGE_SIZE) {
            snprintf(err, err_size, "bad page size in '%s' (1..%d after '@')", spec, KVP_MAX_PAGE_SIZE);
            return -1;
        }
        page = (int32_t)p;
    }
    o->k_format = k;
    o->v_format = v;
    o->page_size = page;
    return 0;
}
