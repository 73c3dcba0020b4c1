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
 * KV beyond the process (<kvpage_blob.h>). With an identity (the model's
 * fingerprint, kvp_cache_set_blob) the cache exports a sequence as page
 * blobs and imports one (kvp_cache_seq_export / _import: prefill in one
 * process, decode in another). With KV stores too (kvp_cache_add_tier), the
 * same seq_attach_prefix walks the pool, then each store, importing the
 * longest chain of valid pages, and full pages are written to the stores as
 * they are cached (write-through) and as the pool evicts them (write-back),
 * so a later process over the same store prefills only what is new. A
 * store is a directory (dir:PATH, the file tier) or a Redis/Valkey server
 * (redis://..., the Redis tier) shared by processes on several machines,
 * each behind a queue tier, so writing never stalls the decode loop; a
 * Redis server that dies during a run only turns lookups into misses.
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
#include <kvpage_blob.h> /* identity, stores, sequence export/import */
#include <kvpage_ext.h>  /* kvp_table_seq_info, kvp_store_info, kvp_status_name */
#include <kvpage_plan.h> /* kvp_layout_compute, kvp_format_parse */

#include "kv.h"

/* Room for a store's spec (passwords masked) or description in reports. */
#define KV_STORE_TEXT 384
/* Kinds of store (rows of store_schemes). */
enum { STORE_DIR, STORE_REDIS };

static void mask_spec(const char *text, char *out, size_t size);

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
    /* KV stores behind the pool (owned here: destroyed after the cache) */
    kvp_blob_tier_t *tiers[KV_MAX_STORES];
    kvp_blob_tier_t *behind[KV_MAX_STORES]; /* what a queue in tiers[i] writes to, or NULL */
    int32_t store_kind[KV_MAX_STORES];      /* its row in store_schemes */
    char store_specs[KV_MAX_STORES][KV_STORE_TEXT]; /* as given, passwords masked */
    char store_detail[KV_MAX_STORES][KV_STORE_TEXT];
    int32_t n_tiers;
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
    kvp_cache_flush(p->c); /* write-through pages still pending (destroy would too) */
    kvp_cache_destroy(p->c);
    for (int32_t i = 0; i < p->n_tiers; i++) { /* after their cache; a queue before its tier */
        kvp_blob_tier_destroy(p->tiers[i]);
        kvp_blob_tier_destroy(p->behind[i]);
    }
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

/* Pages the stores have given the cache so far. */
static int64_t store_pages(const paged_kv *p) {
    int64_t pages = 0;
    for (int32_t i = 0; i < p->n_tiers; i++) {
        kvp_cache_tier_stats_t ts = {.struct_size = sizeof ts};
        if (kvp_cache_tier_stats(p->c, i, &ts) == KVP_OK) pages += (int64_t)ts.hit_pages;
    }
    return pages;
}

static int32_t paged_attach_prefix(kv_cache_t *kv, int32_t seq_id, const int32_t *tokens, int32_t n) {
    paged_kv *p = as_paged(kv);
    int64_t matched = 0;
    if (n < 2 || !p->opts.prefix_cache) return 0;
    int64_t before = store_pages(p);
    /* n - 1: the prompt's last token is prefilled, for its logits; the pool
     * first, then the stores (the longest chain of valid pages) */
    int rc = kvp_cache_seq_attach_prefix(p->c, seq_id, tokens, n - 1, &matched);
    if (rc != KVP_OK) { /* e.g. a store's pages could not be written: what the pool gave stays */
        failed(p, "attach_prefix", rc);
        int32_t len = paged_len(kv, seq_id);
        return len > 0 && len < n ? len : 0;
    }
    /* the pool's share (the stores' is in their statistics) */
    p->prefix_hit_pages += matched / p->layout.page_size - (store_pages(p) - before);
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
    out->n_stores = p->n_tiers;
    for (int32_t i = 0; i < p->n_tiers; i++) {
        kvp_cache_tier_stats_t ts = {.struct_size = sizeof ts};
        if (kvp_cache_tier_stats(p->c, i, &ts) != KVP_OK) continue;
        out->stores[i].spec = p->store_specs[i];
        out->stores[i].lookups = (int64_t)ts.lookups;
        out->stores[i].hit_pages = (int64_t)ts.hit_pages;
        out->stores[i].written = (int64_t)ts.written;
        out->stores[i].misses = (int64_t)ts.miss_pages;
        out->stores[i].rejected = (int64_t)ts.rejected;
        out->stores[i].errors = (int64_t)ts.errors;
        out->stores[i].bytes_in = ts.bytes_in;
        out->stores[i].bytes_out = ts.bytes_out;
        out->stores[i].read_s = (double)ts.read_ns * 1e-9;
        out->stores[i].write_s = (double)ts.write_ns * 1e-9;
        out->stores[i].detail = p->store_detail[i];
        mask_spec(kvp_blob_tier_last_error(p->behind[i]), out->stores[i].last_error,
                  sizeof out->stores[i].last_error);
        kvp_queue_tier_info_t qi = {.struct_size = sizeof qi};
        if (kvp_queue_tier_info(p->tiers[i], &qi) == KVP_OK) {
            out->stores[i].queue_dropped = (int64_t)qi.dropped;
            out->stores[i].queue_failed = (int64_t)qi.failed;
        }
        kvp_redis_tier_info_t ri = {.struct_size = sizeof ri};
        if (p->store_kind[i] == STORE_REDIS && kvp_redis_tier_info(p->behind[i], &ri) == KVP_OK) {
            out->stores[i].is_redis = 1;
            out->stores[i].redis.cluster = ri.cluster;
            out->stores[i].redis.nodes = ri.nodes;
            out->stores[i].redis.nodes_down = ri.nodes_down;
            out->stores[i].redis.connects = (int64_t)ri.connects;
            out->stores[i].redis.failures = (int64_t)ri.failures;
            out->stores[i].redis.timeouts = (int64_t)ri.timeouts;
            out->stores[i].redis.skipped = (int64_t)ri.skipped;
            out->stores[i].redis.server_errors = (int64_t)ri.server_errors;
        }
    }
}

/* ---- KV stores ------------------------------------------------------------------------ */

/* A store is opened by its scheme, the text before the first ':'. Built in:
 * "dir:PATH", libkvpage's file tier, and "redis://...", its Redis/Valkey
 * tier. Each gets a queue tier in front: pages written back or through
 * during a step cost the decode loop a copy, never a file write, an fsync
 * or a network round trip (the queue's thread writes them). Another kind
 * (the engine's own) is one more row in store_schemes: its opener wraps its
 * functions in a kvp_blob_tier_t (kvp_blob_tier_create) and the cache does
 * the rest. */
typedef int (*store_open_fn)(const char *spec, const char *rest, kvp_blob_tier_t **inner, char *detail,
                             size_t detail_size, char *err, size_t err_size);

/* `text` with the password of every "scheme://user:password@host" in it
 * replaced by "***" (a lone "scheme://name@host" is masked too: it may be
 * a password given in the wrong place), for reports and error messages. */
static void mask_spec(const char *text, char *out, size_t size) {
    size_t o = 0;
#define PUT(ch)                                   \
    do {                                          \
        if (o + 1 < size) out[o++] = (char)(ch); \
    } while (0)
    for (const char *s = text; *s;) {
        const char *sep = strstr(s, "://");
        if (!sep) {
            while (*s) PUT(*s++);
            break;
        }
        while (s < sep + 3) PUT(*s++);
        size_t auth = strcspn(s, "/, \t"); /* the authority: [userinfo@]host[:port] */
        const char *at = NULL;
        for (size_t k = 0; k < auth; k++)
            if (s[k] == '@') at = s + k;
        if (!at) continue;
        const char *colon = memchr(s, ':', (size_t)(at - s));
        while (colon && s < colon) PUT(*s++); /* the user */
        if (colon) PUT(':');
        PUT('*');
        PUT('*');
        PUT('*');
        s = at;
    }
#undef PUT
    if (size) out[o < size ? o : size - 1] = 0;
}

static int open_dir(const char *spec, const char *path, kvp_blob_tier_t **inner, char *detail, size_t detail_size,
                    char *err, size_t err_size) {
    (void)spec;
    kvp_file_tier_params_t fp;
    kvp_file_tier_params_init(&fp);
    fp.path = path;
    char e[KVP_ERR_SIZE] = "";
    int rc = kvp_file_tier_create(&fp, inner, e, sizeof e);
    if (rc != KVP_OK) {
        snprintf(err, err_size, "dir:%s: %s: %s", path, kvp_status_name(rc), e);
        return -1;
    }
    if (detail_size) detail[0] = 0; /* nothing to add to "dir:PATH" */
    return 0;
}

/* libkvpage's Redis/Valkey tier on the URI(s) of the spec, with the ACL
 * user and the password (for URIs that carry none) and the key prefix from
 * the environment. A
 * wrong password, a refused command or an unreachable server fails here,
 * with the server's words; a server that fails later only makes misses. */
static int open_redis(const char *spec, const char *rest, kvp_blob_tier_t **inner, char *detail,
                      size_t detail_size, char *err, size_t err_size) {
    (void)rest;
    kvp_redis_tier_params_t rp;
    kvp_redis_tier_params_init(&rp);
    rp.uri = spec;
    const char *password = getenv("KVPAGE_REDIS_PASSWORD"), *prefix = getenv("KVPAGE_REDIS_PREFIX");
    const char *user = getenv("KVPAGE_REDIS_USER");
    if (password && *password) rp.password = password;
    if (user && *user) rp.user = user;
    if (prefix && *prefix) rp.prefix = prefix;
    char e[KVP_ERR_SIZE] = "", shown[KV_STORE_TEXT], shown_e[KVP_ERR_SIZE];
    int rc = kvp_redis_tier_create(&rp, inner, e, sizeof e);
    if (rc != KVP_OK) {
        mask_spec(spec, shown, sizeof shown);
        mask_spec(e, shown_e, sizeof shown_e);
        const char *hint = "";
        if (rc == KVP_EACCES && !strchr(spec, '@'))
            hint = rp.password ? (rp.user ? " (the user and password were KVPAGE_REDIS_USER's and "
                                            "KVPAGE_REDIS_PASSWORD's)"
                                          : " (the password was KVPAGE_REDIS_PASSWORD's)")
                               : " (no password was given: set KVPAGE_REDIS_PASSWORD)";
        else if (rc == KVP_ENOTSUP)
            hint = " (this libkvpage was built without hiredis: install libhiredis-dev and rebuild it)";
        snprintf(err, err_size, "KV store '%s': %s (%s)%s%s%s", shown, kvp_status_name(rc), kvp_strerror(rc),
                 *shown_e ? ": " : "", shown_e, hint);
        return -1;
    }
    kvp_redis_tier_info_t ri = {.struct_size = sizeof ri};
    int have = kvp_redis_tier_info(*inner, &ri) == KVP_OK;
    char where[64] = "";
    if (have)
        snprintf(where, sizeof where, "%d %s%s, ", ri.nodes,
                 ri.cluster ? "Cluster node" : "server", ri.nodes == 1 ? "" : "s");
    snprintf(detail, detail_size, "Redis/Valkey: %skey prefix \"%s\"%s%s%s, call budget %d ms", where,
             rp.prefix ? rp.prefix : "kvp:", prefix && *prefix ? " (KVPAGE_REDIS_PREFIX)" : "",
             rp.user ? ", user from KVPAGE_REDIS_USER" : "",
             rp.password ? ", password from KVPAGE_REDIS_PASSWORD" : "", rp.timeout_ms);
    return 0;
}

static const struct {
    const char *scheme, *form;
    int32_t kind;
    int32_t feature; /* the kvp_feature its tier needs, or 0 */
    store_open_fn open;
} store_schemes[] = {
    {"dir", "dir:PATH", STORE_DIR, 0, open_dir},
    {"redis", "redis://[user[:password]@]host[:port][/db][,redis://...]", STORE_REDIS, KVP_FEATURE_REDIS,
     open_redis},
};
#define N_SCHEMES (int)(sizeof store_schemes / sizeof *store_schemes)

/* The scheme's row, and what follows "SCHEME:"; -1 with a sentence in err. */
static int store_scheme(const char *spec, const char **rest, char *err, size_t err_size) {
    const char *colon = strchr(spec, ':');
    size_t len = colon ? (size_t)(colon - spec) : 0;
    char built_in[160] = "", shown[KV_STORE_TEXT];
    mask_spec(spec, shown, sizeof shown);
    for (int i = 0; i < N_SCHEMES; i++)
        snprintf(built_in + strlen(built_in), sizeof built_in - strlen(built_in), "%s%s", i ? ", " : "",
                 store_schemes[i].form);
    if (len == 0) {
        snprintf(err, err_size, "KV store '%s': expected SCHEME:..., one of: %s", shown, built_in);
        return -1;
    }
    for (int i = 0; i < N_SCHEMES; i++)
        if (strlen(store_schemes[i].scheme) == len && !strncmp(spec, store_schemes[i].scheme, len)) {
            *rest = colon + 1;
            if (!**rest || (store_schemes[i].kind == STORE_REDIS && (strncmp(*rest, "//", 2) || !(*rest)[2]))) {
                /* (a malformed URI is not echoed: it may hold a password) */
                snprintf(err, err_size, "KV store '%s%s': expected %s",
                         store_schemes[i].kind == STORE_REDIS ? "redis:" : shown,
                         store_schemes[i].kind == STORE_REDIS && **rest ? "..." : "", store_schemes[i].form);
                return -1;
            }
            if (store_schemes[i].feature && !kvp_build_has(store_schemes[i].feature)) {
                snprintf(err, err_size, "KV store '%s': this libkvpage %s was built without its %s tier (hiredis "
                         "missing: install libhiredis-dev and rebuild it)", shown, kvp_version_string(),
                         store_schemes[i].scheme);
                return -1;
            }
            return i;
        }
    snprintf(err, err_size, "KV store '%s': unknown store '%.*s' (not built in; built in: %s)", shown, (int)len,
             spec, built_in);
    return -1;
}

int kv_store_check(const char *spec, char *err, size_t err_size) {
    const char *rest;
    return store_scheme(spec, &rest, err, err_size) < 0 ? -1 : 0;
}

/* Open store `spec` into p->tiers[p->n_tiers] (a queue tier) and
 * p->behind[...] (the store's own tier); -1 with err. */
static int open_store(paged_kv *p, const char *spec, char *err, size_t err_size) {
    const char *rest;
    int k = store_scheme(spec, &rest, err, err_size);
    if (k < 0) return -1;
    int32_t i = p->n_tiers;
    kvp_blob_tier_t *inner = NULL, *queue = NULL;
    p->store_detail[i][0] = 0;
    if (store_schemes[k].open(spec, rest, &inner, p->store_detail[i], KV_STORE_TEXT, err, err_size)) return -1;
    kvp_queue_tier_params_t qp;
    kvp_queue_tier_params_init(&qp);
    qp.inner = inner;
    char e[KVP_ERR_SIZE] = "";
    int rc = kvp_queue_tier_create(&qp, &queue, e, sizeof e);
    mask_spec(spec, p->store_specs[i], KV_STORE_TEXT);
    if (rc != KVP_OK) {
        kvp_blob_tier_destroy(inner);
        snprintf(err, err_size, "KV store '%s': its queue: %s: %s", p->store_specs[i], kvp_status_name(rc), e);
        return -1;
    }
    p->tiers[i] = queue;
    p->behind[i] = inner;
    p->store_kind[i] = store_schemes[k].kind;
    p->n_tiers++;
    return 0;
}

int kv_store_policy_parse(const char *list, int32_t *policy, char *err, size_t err_size) {
    static const struct {
        const char *name;
        int32_t flag;
    } names[] = {{"read", KVP_TIER_READ}, {"write-back", KVP_TIER_WRITE_BACK}, {"write-through", KVP_TIER_WRITE_THROUGH}};
    int32_t flags = 0;
    for (const char *at = list;;) {
        size_t len = strcspn(at, ",");
        int found = 0;
        for (size_t i = 0; i < sizeof names / sizeof *names; i++)
            if (strlen(names[i].name) == len && !strncmp(at, names[i].name, len)) flags |= names[i].flag, found = 1;
        if (!found) {
            snprintf(err, err_size, "store policy '%.*s': expected read, write-back or write-through (comma-separated)",
                     (int)len, at);
            return -1;
        }
        if (!at[len]) break;
        at += len + 1;
    }
    *policy = flags;
    return 0;
}

/* Give the cache its identity and open its stores; -1 with err. */
static int attach_stores(paged_kv *p, const kv_paged_opts_t *o, char *err, size_t err_size) {
    if (o->n_stores > 0 && !o->has_identity) {
        snprintf(err, err_size, "KV stores need the model's fingerprint (the cache's identity)");
        return -1;
    }
    if (o->n_stores > 0 && !o->prefix_cache) {
        snprintf(err, err_size, "KV stores need the prefix cache (it is off)");
        return -1;
    }
    if (o->n_stores < 0 || o->n_stores > KV_MAX_STORES) {
        snprintf(err, err_size, "at most %d KV stores", KV_MAX_STORES);
        return -1;
    }
    if (!o->has_identity) return 0;
    kvp_blob_params_t bp;
    kvp_blob_params_init(&bp);
    memcpy(bp.fingerprint, o->fingerprint, sizeof bp.fingerprint);
    int rc = kvp_cache_set_blob(p->c, &bp);
    if (rc != KVP_OK) {
        snprintf(err, err_size, "libkvpage: identity: %s: %s", kvp_status_name(rc), kvp_cache_last_error(p->c));
        return -1;
    }
    int32_t policy = o->store_policy ? o->store_policy
                                     : KVP_TIER_READ | KVP_TIER_WRITE_BACK | KVP_TIER_WRITE_THROUGH;
    for (int32_t i = 0; i < o->n_stores; i++) {
        if (open_store(p, o->stores[i], err, err_size)) return -1;
        rc = kvp_cache_add_tier(p->c, p->tiers[p->n_tiers - 1], policy, NULL);
        if (rc != KVP_OK) {
            snprintf(err, err_size, "libkvpage: KV store '%s': %s: %s", p->store_specs[p->n_tiers - 1],
                     kvp_status_name(rc), kvp_cache_last_error(p->c));
            return -1;
        }
    }
    return 0;
}

int kv_paged_flush(kv_cache_t *kv) {
    paged_kv *p = as_paged(kv);
    int rc = kvp_cache_flush(p->c);
    for (int32_t i = 0; i < p->n_tiers; i++) kvp_queue_tier_drain(p->tiers[i]); /* counters final */
    return rc == KVP_OK ? KV_OK : failed(p, "flush", rc);
}

int kv_paged_seq_export(kv_cache_t *kv, int32_t seq, const int32_t *tokens, int32_t n, void **buf,
                        uint64_t *bytes) {
    paged_kv *p = as_paged(kv);
    int32_t blobs = 0;
    uint64_t need = 0;
    *buf = NULL;
    *bytes = 0;
    int rc = kvp_cache_seq_export_size(p->c, seq, &blobs, &need);
    if (rc != KVP_OK) return failed(p, "seq_export_size", rc);
    void *b = malloc(need ? need : 1);
    if (!b) {
        snprintf(p->err, sizeof p->err, "seq_export: out of memory (%llu bytes)", (unsigned long long)need);
        return KV_ENOMEM;
    }
    rc = kvp_cache_seq_export(p->c, seq, tokens, n, b, need);
    if (rc != KVP_OK) {
        free(b);
        return failed(p, "seq_export", rc);
    }
    *buf = b;
    *bytes = need;
    return KV_OK;
}

int kv_paged_seq_import(kv_cache_t *kv, int32_t seq, const int32_t *tokens, int32_t n, const void *buf,
                        uint64_t bytes) {
    paged_kv *p = as_paged(kv);
    int32_t reason = KVP_BLOB_OK;
    int rc = kvp_cache_seq_import(p->c, seq, tokens, n, buf, bytes, &reason);
    if (rc == KVP_OK) {
        sample_peaks(p);
        return KV_OK;
    }
    failed(p, "seq_import", rc);
    if (reason != KVP_BLOB_OK)
        snprintf(p->err + strlen(p->err), sizeof p->err - strlen(p->err), " (rejected: %s)",
                 kvp_blob_reason_name(reason));
    return rc == KVP_ENOSPC ? KV_ENOSPC : KV_EINVAL;
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
    if (attach_stores(p, o, err, err_size)) {
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
