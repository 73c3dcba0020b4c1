/*
 * Layer `cache`: a façade over pool + table + store + context for the common
 * decode loop. It owns nothing the layers do not already do; it sequences
 * them so their contracts hold: reservations before appends (all or
 * nothing across a batch), COPY/UNSEAL operations on the arena before the
 * next append reads the pages, SEAL operations handed to the per-layer
 * append with row numbers of the whole step.
 */
#include "cache.h"
#include "kvpage_cuda.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>


int kvp__cache_fail(const kvp_cache_t *c, int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    kvp__verrf(c->err, KVP_ERR_SIZE, status, fmt, ap);
    va_end(ap);
    return status;
}
#define fail kvp__cache_fail

/* Keep a layer's detail text as the cache's. */
static int pass(kvp_cache_t *c, int status, const char *what, const char *detail) {
    if (status == KVP_OK) return KVP_OK;
    return fail(c, status, "%s: %s", what, detail);
}

void kvp_cache_params_init(kvp_cache_params_t *p) {
    if (p == NULL) return;
    memset(p, 0, sizeof *p);
    p->struct_size = sizeof *p;
    p->page_size = 16;
    p->k_format = KVP_FORMAT_FP16;
    p->v_format = KVP_FORMAT_FP16;
    p->k_order = KVP_K_ORDER_TOKEN_MAJOR;
    p->max_seqs = 256;
    p->prefix_cache = 1;
    p->threads = 1;
    p->isa = KVP_ISA_AUTO;
}

void kvp_cache_destroy(kvp_cache_t *c) {
    if (c == NULL) return;
    kvp_allocator_t a = c->alloc;
    kvp__cache_blob_destroy(c); /* writes pending pages through first */
    kvp_tier_destroy(c->tier); /* before its table */
    kvp_table_destroy(c->table);
    kvp_pool_destroy(c->pool);
    kvp_store_destroy(c->store);
    kvp_ctx_destroy(c->ctx);
    void *bufs[] = {c->indptr, c->indices, c->last_page_len, c->qo_indptr, c->sorted,
                    c->slots, c->prev_reserved, c->ops, c->written};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) kvp__free(&a, bufs[i]);
    kvp__free(&a, c);
}

/* Pool pages a byte budget holds beside the staging pages. */
static int pages_for_budget(const kvp_cache_params_t *p, const kvp_layout_t *l,
                            int64_t *pages, char *err, size_t err_size) {
    uint64_t staging = l->needs_staging ? (uint64_t)p->max_seqs * l->staging_page_bytes : 0;
    uint64_t fixed = l->fixed_bytes + staging;
    if (p->kv_budget_bytes < fixed + l->page_bytes)
        return kvp__errf(err, err_size, KVP_EINVAL,
                         "kv_budget_bytes %llu is smaller than one page (%llu bytes) plus %d "
                         "staging pages and the fixed region (%llu bytes)",
                         (unsigned long long)p->kv_budget_bytes,
                         (unsigned long long)l->page_bytes, (int)p->max_seqs,
                         (unsigned long long)fixed);
    uint64_t n = (p->kv_budget_bytes - fixed) / l->page_bytes;
    *pages = n > (uint64_t)INT32_MAX - (uint64_t)p->max_seqs ? INT32_MAX - p->max_seqs : (int64_t)n;
    return KVP_OK;
}

/* The CUDA cache's host tier lives in pinned memory, so its page copies are
 * asynchronous on the store's stream. */
static void *pinned_alloc(void *opaque, size_t size, size_t alignment) {
    (void)opaque;
    (void)alignment; /* cudaMallocHost memory is page-aligned */
    void *p = NULL;
    return kvp_cuda_host_alloc((uint64_t)size, &p, NULL, 0) == KVP_OK ? p : NULL;
}

static void pinned_free(void *opaque, void *ptr) {
    (void)opaque;
    kvp_cuda_host_free(ptr);
}

static int create_parts(kvp_cache_t *c, const kvp_cache_params_t *p, const kvp_layout_t *l,
                        int64_t pages, const kvp_cuda_params_t *cuda, char *err,
                        size_t err_size) {
    int32_t staging = l->needs_staging ? p->max_seqs : 0;
    c->layers = p->layers;
    c->written = (uint8_t *)kvp__calloc(&c->alloc, (size_t)p->layers, 1, 64);
    if (c->written == NULL) return kvp__errf(err, err_size, KVP_ENOMEM, "out of memory (cache)");
    kvp_store_params_t sp;
    kvp_store_params_init(&sp);
    sp.layers = p->layers;
    sp.kv_heads = p->kv_heads;
    sp.head_dim = p->head_dim;
    sp.page_size = p->page_size;
    sp.k_format = p->k_format;
    sp.v_format = p->v_format;
    sp.k_order = p->k_order;
    sp.num_pages = (uint64_t)pages;
    sp.num_staging = (uint64_t)staging;
    sp.allocator = p->allocator;
    int rc = cuda ? kvp_cuda_store_create(&sp, cuda, &c->store, err, err_size)
                  : kvp_store_create(&sp, &c->store, err, err_size);
    if (rc != KVP_OK) return rc;

    kvp_pool_params_t pp;
    kvp_pool_params_init(&pp);
    pp.page_size = p->page_size;
    pp.num_pages = (int32_t)pages;
    pp.num_staging = staging;
    pp.prefix_cache = p->prefix_cache;
    pp.hash_seed = p->hash_seed;
    pp.allocator = p->allocator;
    rc = kvp_pool_create(&pp, &c->pool, err, err_size);
    if (rc != KVP_OK) return rc;

    rc = kvp_table_create(c->pool, p->max_seqs, &c->table, err, err_size);
    if (rc != KVP_OK) return rc;

    kvp_ctx_params_t cp;
    kvp_ctx_params_init(&cp);
    cp.threads = p->threads;
    cp.isa = p->isa;
    cp.allocator = p->allocator;
    rc = cuda ? kvp_cuda_ctx_create(&cp, cuda, &c->ctx, err, err_size) /* ignores `arena` */
              : kvp_ctx_create(&cp, &c->ctx, err, err_size);
    if (rc != KVP_OK || p->host_bytes == 0) return rc;

    kvp_page_io_t io = {.struct_size = sizeof io};
    rc = kvp_store_page_io(c->store, &io);
    if (rc != KVP_OK) return kvp__errf(err, err_size, rc, "%s", kvp_store_last_error(c->store));
    kvp_tier_params_t hp;
    kvp_tier_params_init(&hp);
    hp.host_bytes = p->host_bytes;
    hp.layout = l;
    hp.page_io = &io;
    hp.allocator = p->allocator;
    if (cuda) {
        kvp_allocator_t pinned = {pinned_alloc, pinned_free, NULL};
        hp.host_allocator = pinned;
    }
    return kvp_tier_create(c->table, &hp, &c->tier, err, err_size);
}

static int cache_create(const kvp_cache_params_t *p, const kvp_cuda_params_t *cuda,
                        kvp_cache_t **out, char *err, size_t err_size) {
    if (out == NULL) return kvp__errf(err, err_size, KVP_EINVAL, "out is NULL");
    int rc = kvp__check_struct(p, sizeof *p, "params", err, err_size);
    if (rc == KVP_OK) rc = kvp__check_reserved(p->reserved_, "params", err, err_size);
    if (rc == KVP_OK) rc = kvp__allocator_check(&p->allocator, err, err_size);
    if (rc != KVP_OK) return rc;
    if (p->max_seqs < 1 || p->max_seqs > (1 << 24))
        return kvp__errf(err, err_size, KVP_EINVAL, "max_seqs must be 1..%d, got %d", 1 << 24,
                         (int)p->max_seqs);
    if (p->num_pages < 0 || p->num_pages > INT32_MAX - p->max_seqs)
        return kvp__errf(err, err_size, KVP_EINVAL, "num_pages %lld is out of range",
                         (long long)p->num_pages);
    if (p->num_pages == 0 && p->kv_budget_bytes == 0)
        return kvp__errf(err, err_size, KVP_EINVAL, "give num_pages or kv_budget_bytes");
    if (p->num_pages != 0 && p->kv_budget_bytes != 0)
        return kvp__errf(err, err_size, KVP_EINVAL,
                         "give num_pages or kv_budget_bytes, not both");
    kvp_layout_t l = {.struct_size = sizeof l};
    rc = kvp_layout_compute(p->layers, p->kv_heads, p->head_dim, p->page_size, p->k_format,
                            p->v_format, &l, err, err_size);
    if (rc != KVP_OK) return rc;
    int64_t pages = p->num_pages;
    if (pages == 0 && (rc = pages_for_budget(p, &l, &pages, err, err_size)) != KVP_OK) return rc;

    kvp_cache_t *c = kvp__calloc(&p->allocator, 1, sizeof *c, 0);
    if (c == NULL) return kvp__errf(err, err_size, KVP_ENOMEM, "out of memory (cache)");
    c->alloc = p->allocator;
    c->err = c->err_text;
    c->view.struct_size = sizeof c->view;
    c->page_size = p->page_size;
    c->num_pages = (int32_t)pages;
    c->num_staging = l.needs_staging ? p->max_seqs : 0;
    rc = create_parts(c, p, &l, pages, cuda, err, err_size);
    if (rc != KVP_OK) {
        kvp_cache_destroy(c);
        return rc;
    }
    *out = c;
    return KVP_OK;
}

int kvp_cache_create(const kvp_cache_params_t *p, kvp_cache_t **out, char *err,
                     size_t err_size) {
    return cache_create(p, NULL, out, err, err_size);
}

int kvp_cuda_cache_create(const kvp_cache_params_t *params, const kvp_cuda_params_t *cuda,
                          kvp_cache_t **out, char *err, size_t err_size) {
    if (!kvp_build_has(KVP_FEATURE_CUDA))
        return kvp__errf(err, err_size, KVP_ENOTSUP, "libkvpage was built without CUDA");
    kvp_cuda_params_t defaults;
    if (cuda == NULL) {
        kvp_cuda_params_init(&defaults);
        cuda = &defaults;
    } else {
        int rc = kvp__check_struct(cuda, sizeof *cuda, "cuda", err, err_size);
        if (rc != KVP_OK) return rc;
    }
    return cache_create(params, cuda, out, err, err_size);
}

const char *kvp_cache_last_error(const kvp_cache_t *c) {
    return c == NULL ? KVP__NULL_HANDLE : c->err;
}

int kvp_cache_parts(const kvp_cache_t *c, kvp_cache_parts_t *out) {
    if (c == NULL) return KVP_EINVAL;
    int rc = kvp__check_struct(out, sizeof *out, "parts", c->err, KVP_ERR_SIZE);
    if (rc != KVP_OK) return rc;
    kvp_cache_parts_t r = {sizeof r, 0, c->pool, c->table, c->store, c->ctx, c->tier};
    kvp__copy_out(out, &r, sizeof r);
    return KVP_OK;
}

int kvp_cache_seq_swap_out(kvp_cache_t *c, int32_t seq) {
    if (c == NULL) return KVP_EINVAL;
    if (c->tier == NULL) return fail(c, KVP_ESTATE, "this cache has no host tier (host_bytes 0)");
    int32_t n = 0;
    c->in_step = 0; /* the step's view may name its pages */
    return pass(c, kvp_tier_swap_out(c->tier, seq, NULL, 0, &n), "swap_out",
                kvp_tier_last_error(c->tier));
}

int kvp_cache_seq_swap_in(kvp_cache_t *c, int32_t seq) {
    if (c == NULL) return KVP_EINVAL;
    if (c->tier == NULL) return fail(c, KVP_ESTATE, "this cache has no host tier (host_bytes 0)");
    int32_t n = 0;
    return pass(c, kvp_tier_swap_in(c->tier, seq, NULL, 0, &n), "swap_in",
                kvp_tier_last_error(c->tier));
}

/* ---- sequences ---------------------------------------------------------- */

int kvp_cache_seq_create(kvp_cache_t *c, int32_t priority, uint64_t salt, int32_t *seq) {
    if (c == NULL) return KVP_EINVAL;
    return pass(c, kvp_table_seq_create(c->table, priority, salt, seq), "seq_create",
                kvp_table_last_error(c->table));
}

int kvp_cache_seq_release(kvp_cache_t *c, int32_t seq) {
    if (c == NULL) return KVP_EINVAL;
    c->in_step = 0; /* the step's view may name it */
    kvp__cache_blob_before_release(c);
    kvp_seq_info_t info = {.struct_size = sizeof info};
    if (c->tier != NULL && kvp_table_seq_info(c->table, seq, &info) == KVP_OK && info.swapped)
        return pass(c, kvp_tier_drop(c->tier, seq), "seq_release", kvp_tier_last_error(c->tier));
    return pass(c, kvp_table_seq_release(c->table, seq), "seq_release",
                kvp_table_last_error(c->table));
}

int kvp_cache_seq_attach_prefix(kvp_cache_t *c, int32_t seq, const int32_t *tokens, int64_t n,
                                int64_t *matched) {
    if (c == NULL) return KVP_EINVAL;
    int rc = pass(c, kvp_table_attach_prefix(c->table, seq, tokens, n, matched), "attach_prefix",
                  kvp_table_last_error(c->table));
    if (rc == KVP_OK) rc = kvp__cache_blob_attach(c, seq, tokens, n, matched);
    kvp__cache_blob_after(c);
    return rc;
}

int kvp_cache_seq_fork(kvp_cache_t *c, int32_t parent, int32_t *child) {
    if (c == NULL) return KVP_EINVAL;
    if (child == NULL) return fail(c, KVP_EINVAL, "child is NULL");
    kvp_page_op_t ops[4];
    int32_t n = 0, id = -1;
    int rc = kvp_table_fork(c->table, parent, &id, ops, 4, &n);
    kvp__cache_blob_after(c);
    if (rc != KVP_OK) return pass(c, rc, "fork", kvp_table_last_error(c->table));
    rc = kvp_store_apply_ops(c->store, ops, n);
    if (rc != KVP_OK) {
        const char *why = kvp_store_last_error(c->store);
        kvp_table_seq_release(c->table, id);
        return pass(c, rc, "fork: copying pages", why);
    }
    *child = id;
    return KVP_OK;
}

int kvp_cache_seq_truncate(kvp_cache_t *c, int32_t seq, int64_t length) {
    if (c == NULL) return KVP_EINVAL;
    kvp_page_op_t ops[4];
    int32_t n = 0;
    int rc = kvp_table_truncate(c->table, seq, length, ops, 4, &n);
    kvp__cache_blob_after(c);
    if (rc != KVP_OK) return pass(c, rc, "truncate", kvp_table_last_error(c->table));
    c->in_step = 0;
    rc = kvp_store_apply_ops(c->store, ops, n);
    return pass(c, rc, "truncate: unsealing", kvp_store_last_error(c->store));
}

/* ---- steps -------------------------------------------------------------- */

/* Grow a buffer to at least `n` elements of `size` bytes (never shrinks). */
static bool grow(kvp_cache_t *c, void **buf, size_t *cap, size_t n, size_t size) {
    if (n <= *cap) return true;
    size_t want = *cap * 2 > n ? *cap * 2 : n;
    void *p = kvp__malloc(&c->alloc, want * size, 64);
    if (p == NULL) return false;
    kvp__free(&c->alloc, *buf);
    *buf = p;
    *cap = want;
    return true;
}

/* The five per-sequence buffers grow together (all or none). */
static bool grow_batch(kvp_cache_t *c, size_t n) {
    if (n <= c->cap_batch) return true;
    size_t want = c->cap_batch * 2 > n ? c->cap_batch * 2 : n;
    int32_t **i32[] = {&c->indptr, &c->qo_indptr, &c->last_page_len, &c->sorted};
    void *fresh[5] = {NULL, NULL, NULL, NULL, NULL};
    bool ok = true;
    for (int i = 0; i < 4 && ok; i++) ok = (fresh[i] = kvp__malloc(&c->alloc, want * 4, 64)) != NULL;
    if (ok) ok = (fresh[4] = kvp__malloc(&c->alloc, want * 8, 64)) != NULL;
    if (!ok) {
        for (int i = 0; i < 5; i++) kvp__free(&c->alloc, fresh[i]);
        return false;
    }
    for (int i = 0; i < 4; i++) {
        kvp__free(&c->alloc, *i32[i]);
        *i32[i] = fresh[i];
    }
    kvp__free(&c->alloc, c->prev_reserved);
    c->prev_reserved = fresh[4];
    c->cap_batch = want;
    return true;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Check the batch and size every buffer the step needs, before any change. */
static int prepare_step(kvp_cache_t *c, const int32_t *seqs, int32_t batch,
                        const int32_t *num_new, int64_t *rows_out) {
    if (seqs == NULL || num_new == NULL) return fail(c, KVP_EINVAL, "seqs or num_new is NULL");
    if (batch < 1) return fail(c, KVP_EINVAL, "batch must be >= 1, got %d", (int)batch);
    int64_t rows = 0, pages = 0;
    if (!grow_batch(c, (size_t)batch + 1)) return fail(c, KVP_ENOMEM, "out of memory (step buffers)");
    for (int32_t b = 0; b < batch; b++) {
        if (num_new[b] < 1)
            return fail(c, KVP_EINVAL, "num_new[%d] must be >= 1, got %d", (int)b, (int)num_new[b]);
        kvp_seq_info_t info = {.struct_size = sizeof info};
        int rc = kvp_table_seq_info(c->table, seqs[b], &info);
        if (rc != KVP_OK)
            return fail(c, rc, "batch index %d (sequence %d): %s", (int)b, (int)seqs[b],
                        kvp_table_last_error(c->table));
        rows += num_new[b];
        pages += info.num_pages + num_new[b] / c->page_size + 2;
        c->sorted[b] = seqs[b];
    }
    if (rows > INT32_MAX) return fail(c, KVP_EINVAL, "more than 2^31-1 new rows");
    qsort(c->sorted, (size_t)batch, sizeof(int32_t), cmp_i32);
    for (int32_t b = 1; b < batch; b++)
        if (c->sorted[b] == c->sorted[b - 1])
            return fail(c, KVP_EINVAL, "sequence %d appears twice in the batch", (int)c->sorted[b]);
    /* a batch's append ops: at most one COPY and one SEAL per page it fills */
    size_t ops = (size_t)pages + (size_t)batch;
    bool ok = grow(c, (void **)&c->indices, &c->cap_indices, (size_t)pages, sizeof(int32_t));
    ok = ok && grow(c, (void **)&c->slots, &c->cap_rows, (size_t)rows, sizeof(int64_t));
    ok = ok && grow(c, (void **)&c->ops, &c->cap_ops, ops, sizeof(kvp_page_op_t));
    if (!ok) return fail(c, KVP_ENOMEM, "out of memory (step buffers)");
    *rows_out = rows;
    return KVP_OK;
}

/* Undo the reservations set so far (they were valid before, so restoring
 * them only gives pages back). */
static void restore_reservations(kvp_cache_t *c, const int32_t *seqs, int32_t upto) {
    for (int32_t b = 0; b < upto; b++) kvp_table_reserve(c->table, seqs[b], c->prev_reserved[b]);
}

static int reserve_all(kvp_cache_t *c, const int32_t *seqs, int32_t batch, const int32_t *num_new) {
    for (int32_t b = 0; b < batch; b++) {
        kvp_seq_info_t info = {.struct_size = sizeof info};
        kvp_table_seq_info(c->table, seqs[b], &info);
        c->prev_reserved[b] = info.reserved_tokens;
        if (info.reserved_tokens >= num_new[b]) continue;
        int rc = kvp_table_reserve(c->table, seqs[b], num_new[b]);
        if (rc != KVP_OK) {
            const char *why = kvp_table_last_error(c->table);
            char detail[KVP_ERR_SIZE];
            snprintf(detail, sizeof detail, "%s", why);
            restore_reservations(c, seqs, b);
            return fail(c, rc, "batch index %d (sequence %d): %s", (int)b, (int)seqs[b], detail);
        }
    }
    return KVP_OK;
}

int kvp_cache_begin_step(kvp_cache_t *c, const int32_t *seqs, int32_t batch,
                         const int32_t *num_new, const int32_t *tokens) {
    if (c == NULL) return KVP_EINVAL;
    c->in_step = 0;
    int64_t rows = 0;
    int rc = prepare_step(c, seqs, batch, num_new, &rows);
    if (rc != KVP_OK) return rc;
    kvp__cache_blob_before_step(c);
    rc = reserve_all(c, seqs, batch, num_new);
    kvp__cache_blob_after(c); /* reservations may evict */
    if (rc != KVP_OK) return rc;

    /* Within their reservations appends cannot fail; ops carry step rows. */
    int32_t n_ops = 0, row = 0;
    for (int32_t b = 0; b < batch; b++) {
        int32_t n = 0;
        rc = kvp_table_append(c->table, seqs[b], num_new[b], tokens ? tokens + row : NULL, NULL,
                              c->ops + n_ops, (int32_t)(c->cap_ops - (size_t)n_ops), &n);
        if (rc != KVP_OK)
            return fail(c, KVP_EINTERNAL, "append of reserved tokens failed (sequence %d): %s",
                        (int)seqs[b], kvp_table_last_error(c->table));
        for (int32_t i = n_ops; i < n_ops + n; i++)
            if (c->ops[i].kind == KVP_OP_SEAL) c->ops[i].row += row;
        n_ops += n;
        row += num_new[b];
    }
    kvp__cache_blob_after(c); /* evicted pages leave before COPYs overwrite them */
    rc = kvp_store_apply_ops(c->store, c->ops, n_ops); /* COPY now; SEALs go to the writes */
    if (rc != KVP_OK) return pass(c, rc, "begin_step: page copies", kvp_store_last_error(c->store));

    kvp_batch_buffers_t bb = {.struct_size = sizeof bb};
    bb.indptr = c->indptr;
    bb.indices = c->indices;
    bb.last_page_len = c->last_page_len;
    bb.slot_mapping = c->slots;
    bb.qo_indptr = c->qo_indptr;
    bb.indices_capacity = (int64_t)c->cap_indices;
    bb.slots_capacity = (int64_t)c->cap_rows;
    rc = kvp_table_export(c->table, seqs, batch, num_new, &bb, &c->view);
    if (rc != KVP_OK)
        return fail(c, KVP_EINTERNAL, "export of the step failed: %s",
                    kvp_table_last_error(c->table));
    c->batch = batch;
    c->rows = (int32_t)rows;
    c->num_ops = n_ops;
    memset(c->written, 0, (size_t)c->layers);
    c->in_step = 1;
    return KVP_OK;
}

int kvp_cache_write(kvp_cache_t *c, int32_t layer, int32_t dtype, const void *k, const void *v,
                    int64_t k_stride, int64_t v_stride) {
    if (c == NULL) return KVP_EINVAL;
    if (!c->in_step) return fail(c, KVP_ESTATE, "no step: call kvp_cache_begin_step first");
    kvp_append_params_t a;
    kvp_append_params_init(&a);
    a.layer = layer;
    a.rows = c->rows;
    a.dtype = dtype;
    a.k = k;
    a.v = v;
    a.k_row_stride = k_stride;
    a.v_row_stride = v_stride;
    a.slots = c->slots;
    a.ops = c->ops;
    a.num_ops = c->num_ops;
    int rc = kvp_store_append(c->store, &a);
    if (rc == KVP_OK) c->written[layer] = 1; /* the append checked the layer */
    return pass(c, rc, "write", kvp_store_last_error(c->store));
}

int kvp_cache_attend(kvp_cache_t *c, const kvp_attention_params_t *params) {
    if (c == NULL) return KVP_EINVAL;
    if (!c->in_step) return fail(c, KVP_ESTATE, "no step: call kvp_cache_begin_step first");
    int rc = kvp__check_struct(params, sizeof *params, "params", c->err, KVP_ERR_SIZE);
    if (rc != KVP_OK) return rc;
    /* before its write, the step's pages of this layer hold no K/V for the
     * new rows (and int8/int4 keys' completed pages are not sealed yet) */
    if (params->layer >= 0 && params->layer < c->layers && !c->written[params->layer])
        return fail(c, KVP_ESTATE, "attend: layer %d's K/V of this step are not written "
                    "(call kvp_cache_write for it first)", (int)params->layer);
    kvp_attention_params_t p = *params;
    p.qo_indptr = c->qo_indptr;
    return pass(c, kvp_attention(c->ctx, c->store, &c->view, &p), "attend",
                kvp_ctx_last_error(c->ctx));
}

int kvp_cache_step_view(const kvp_cache_t *c, kvp_kv_view_t *view, const int64_t **slots,
                        const int32_t **qo_indptr, int32_t *rows) {
    if (c == NULL) return KVP_EINVAL;
    int rc = kvp__check_struct(view, sizeof *view, "view", c->err, KVP_ERR_SIZE);
    if (rc != KVP_OK) return rc;
    if (!c->in_step) return fail(c, KVP_ESTATE, "no step: call kvp_cache_begin_step first");
    kvp__copy_out(view, &c->view, sizeof c->view);
    if (slots) *slots = c->slots;
    if (qo_indptr) *qo_indptr = c->qo_indptr;
    if (rows) *rows = c->rows;
    return KVP_OK;
}
