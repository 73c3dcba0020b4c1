/*
 * The cache façade's object, shared by cache.c (the decode loop) and
 * cacheblob.c (blob tiers, sequence export/import, events). Not installed.
 */
#ifndef KVPAGE_CACHE_H
#define KVPAGE_CACHE_H

#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

struct kvp__cache_blob;

struct kvp_cache {
    kvp_allocator_t alloc;
    kvp_pool_t *pool;
    kvp_table_t *table;
    kvp_store_t *store;
    kvp_ctx_t *ctx;
    kvp_tier_t *tier; /* NULL without a host budget */
    int32_t page_size, num_pages, num_staging;
    /* the current step (grow-only buffers: a step allocates nothing once warm) */
    int in_step;
    int32_t layers;
    uint8_t *written; /* [layers]: kvp_cache_write() done for the layer this step */
    int32_t batch, rows, num_ops;
    int32_t *indptr, *indices, *last_page_len, *qo_indptr, *sorted;
    int64_t *slots, *prev_reserved;
    kvp_page_op_t *ops;
    size_t cap_batch, cap_indices, cap_rows, cap_ops;
    kvp_kv_view_t view;
    struct kvp__cache_blob *blob; /* tiers, identity and events (cacheblob.c), or NULL */
    char *err; /* -> err_text: writable from const-taking getters */
    char err_text[KVP_ERR_SIZE];
};

/* Record a detail message on the cache and return `status` (cache.c). */
int kvp__cache_fail(const kvp_cache_t *c, int status, const char *fmt, ...) KVP__PRINTF(3, 4);

/* cacheblob.c: called by cache.c around the calls that change pages. No-ops
 * without tiers. */
/* Before a step's appends: write the pages queued for write-through (their
 * K/V were written by the previous step). */
void kvp__cache_blob_before_step(kvp_cache_t *c);
/* After a call that may have evicted pages: put what the write-back buffered. */
void kvp__cache_blob_after(kvp_cache_t *c);
/* Before a sequence's release: its pages' K/V are final, write them through. */
void kvp__cache_blob_before_release(kvp_cache_t *c);
/* After kvp_table_attach_prefix(): extend the sequence from the tiers. */
int kvp__cache_blob_attach(kvp_cache_t *c, int32_t seq, const int32_t *tokens, int64_t n,
                           int64_t *matched);
/* Free the blob state (cache destruction). */
void kvp__cache_blob_destroy(kvp_cache_t *c);

#ifdef __cplusplus
}
#endif

#endif /* KVPAGE_CACHE_H */
