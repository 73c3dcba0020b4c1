/*
 * Internal declarations of the layers `pool` (pool.c, prefix.c) and `table`
 * (table.c). Not installed. Tests include it to check invariants.
 */
#ifndef KVPAGE_PAGING_H
#define KVPAGE_PAGING_H

#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Page states. A pool page is in exactly one. */
enum { KVP__PAGE_FREE = 0, KVP__PAGE_USED = 1, KVP__PAGE_CACHED = 2 };

/* Metadata of one pool page. `next` links the free list while the page is
 * free and its hash bucket while it is stored in the prefix cache (a page is
 * never both), so neither list costs an allocation. */
typedef struct {
    int32_t ref;      /* references held: sequences' plus ext */
    int32_t ext;      /* of which taken by the engine (kvp_pool_alloc/retain) */
    int32_t next;     /* free list or hash-bucket link; -1 ends a list */
    int32_t parent;   /* stored: the stored page this one extends; -1 = first page */
    int32_t children; /* stored pages whose parent this is */
    int32_t heap_pos; /* index in the eviction heap, or -1 */
    int32_t priority; /* eviction priority (higher is kept longer) */
    uint8_t state;    /* KVP__PAGE_* */
    uint8_t stored;   /* 1 while in the prefix cache's hash index */
    uint16_t epoch;   /* +1 each time the page leaves the prefix cache: a stored page
                         whose epoch is unchanged still holds the same bytes (tier.c) */
    uint64_t hash;    /* chained hash (valid while stored) */
    uint64_t salt;    /* namespace of the chain (valid while stored) */
    uint64_t stamp;   /* logical time of the last release (LRU order) */
} kvp__page;

/* Staging pages are never shared by sequences nor cached: reference counts
 * and the free-list link (KVP__IN_USE while taken) are enough. */
#define KVP__IN_USE (-2)
typedef struct {
    int32_t ref;
    int32_t ext;
    int32_t next;
} kvp__staging;

struct kvp_pool {
    kvp_allocator_t allocator;
    int32_t page_size;
    int32_t num_pages;
    int32_t num_staging;
    bool prefix_cache;
    uint64_t hash_seed;
    uint64_t hash_mask;    /* UINT64_MAX; tests narrow it to force collisions */

    kvp__page *pages;      /* [num_pages] */
    int32_t free_head;     /* LIFO free list through pages[].next */
    int32_t free_count;
    int32_t cached_count;  /* state CACHED */
    int64_t reserved;      /* free+cached pages promised to reservations */

    kvp__staging *staging; /* [num_staging] */
    int32_t staging_free_head; /* index into staging[], not a page id */
    int32_t staging_free_count;

    int32_t *tokens;       /* [(num_pages+num_staging)*page_size] when prefix_cache */
    int32_t *buckets;      /* [bucket_mask+1] heads of hash chains */
    uint32_t bucket_mask;
    int32_t *heap;         /* [num_pages] evictable cached leaves, min-heap */
    int32_t heap_len;
    uint64_t clock;        /* logical time for LRU stamps */

    int64_t live_seqs;     /* maintained by the tables on this pool */
    int64_t live_tokens;
    uint64_t prefix_lookups, prefix_hit_tokens, prefix_miss_tokens;
    uint64_t pages_stored, pages_evicted;

    kvp_pool_event_fn event_fn;
    void *event_opaque;
    char err[KVP_ERR_SIZE];
};

/* Record a detail message on the pool and return `status`. */
int kvp__pool_fail(kvp_pool_t *pool, int status, const char *fmt, ...) KVP__PRINTF(3, 4);

static inline bool kvp__is_staging_id(const kvp_pool_t *p, int32_t page) {
    return page >= p->num_pages;
}

/* Pages an allocation can take without touching reservations. */
static inline int64_t kvp__pool_available(const kvp_pool_t *p) {
    return (int64_t)p->free_count + p->cached_count - p->reserved;
}

/* Take one pool page (free list first, else evict). The caller has checked
 * that a page is free or cached. The page gets ref 1 and `priority`. */
int32_t kvp__pool_take(kvp_pool_t *p, int32_t priority);
/* Drop one reference of a used pool page (to the cache or free list). */
void kvp__pool_drop(kvp_pool_t *p, int32_t page);
/* Staging pages: take one (caller checked one is free) / give one back. */
int32_t kvp__staging_take(kvp_pool_t *p);
void kvp__staging_drop(kvp_pool_t *p, int32_t page);

/* Token ids of a page (pool or staging); NULL when the prefix cache is off. */
static inline int32_t *kvp__page_tokens(kvp_pool_t *p, int32_t page) {
    return p->tokens ? p->tokens + (size_t)page * (size_t)p->page_size : NULL;
}

/* Add a reference to a used or cached pool page on behalf of a sequence
 * (a cached page becomes used again), raising its priority to `priority`. */
void kvp__pool_attach(kvp_pool_t *p, int32_t page, int32_t priority);

/* ---- table (table.c), shared with the host tier (tier.c) ------------------- */

typedef struct {
    int32_t *pages;     /* pool pages in token order (with staging: sealed pages only);
                           -1 for a page a swapped-out sequence holds on the host */
    int32_t npages;
    int32_t cap;        /* capacity of `pages`; kept across reuse of the slot */
    int32_t staging;    /* staging page id, or -1 (no staging, or swapped out) */
    int32_t priority;
    int32_t promised;   /* pages set aside for the reservation */
    uint32_t gen;       /* generation of the slot, part of the id */
    int32_t next_free;  /* free-slot list link */
    bool live;
    bool swapped;       /* in a host tier: refuses appends, reservations, forks... */
    int64_t len;
    int64_t known;      /* leading tokens whose ids are known (prefix cache) */
    int64_t reserve_to; /* room reserved up to this length; <= len: none */
    uint64_t salt;
} kvp__seq;

struct kvp_tier;

struct kvp_table {
    kvp_pool_t *pool;
    kvp_allocator_t allocator;
    kvp__seq *seqs;
    int32_t max_seqs;
    int32_t free_head;
    int32_t live;
    int32_t slot_bits;
    uint32_t gen_mask;
    bool staged; /* the pool has staging pages: partial pages live there */
    struct kvp_tier *tier; /* the host tier on this table, or NULL */
    char err[KVP_ERR_SIZE];
};

/* Record a detail message on the table and return `status`. */
int kvp__table_fail(kvp_table_t *t, int status, const char *fmt, ...) KVP__PRINTF(3, 4);
/* The live sequence with this id (swapped out or not), or NULL with
 * KVP_ENOENT recorded on the table. */
kvp__seq *kvp__table_find(kvp_table_t *t, const char *fn, int32_t id);
/* Slot index of a sequence (its position in t->seqs). */
static inline int32_t kvp__table_slot(const kvp_table_t *t, const kvp__seq *s) {
    return (int32_t)(s - t->seqs);
}
/* Set the pages a sequence's reservation holds back from the pool. */
void kvp__table_set_promise(kvp_table_t *t, kvp__seq *s, int64_t pages);
/* Store page `k` of `s` in the prefix cache if its chain is known. */
void kvp__table_maybe_store(kvp_table_t *t, const kvp__seq *s, int32_t k);
/* Release a live sequence (resident or swapped out): its id becomes stale. */
void kvp__table_release(kvp_table_t *t, kvp__seq *s);

/* ---- prefix cache (prefix.c) ------------------------------------------- */

/* Hash of the chain root for a salt. */
uint64_t kvp__prefix_root_hash(const kvp_pool_t *p, uint64_t salt);
/* The stored page extending `parent` (-1: chain root) with these tokens in
 * namespace `salt`, or -1. `parent_hash` is the parent's hash (or the root
 * hash); `*hash` receives the page's hash. */
int32_t kvp__prefix_find(const kvp_pool_t *p, int32_t parent, uint64_t parent_hash,
                         uint64_t salt, const int32_t *tokens, uint64_t *hash);
/* Store used page `page` (full, tokens already in p->tokens) under `parent`
 * (a stored page or -1). Returns false, storing nothing, when an identical
 * page is already stored. */
bool kvp__prefix_store(kvp_pool_t *p, int32_t page, int32_t parent, uint64_t salt);
/* Remove a stored page with no stored children from the index. */
void kvp__prefix_unstore(kvp_pool_t *p, int32_t page);
/* Eviction heap of cached pages without stored children. */
void kvp__heap_push(kvp_pool_t *p, int32_t page);
void kvp__heap_remove(kvp_pool_t *p, int32_t page);
/* Evict the first page in eviction order to the free list (pool.c). */
void kvp__evict_one(kvp_pool_t *p);
/* Evict one cached page that no stored page extends (e.g. bytes that
 * turned out wrong); false, changing nothing, for any other page. */
bool kvp__pool_forget(kvp_pool_t *p, int32_t page);
/* Emit an event if a callback is set (the check is inline: most engines
 * set none, and releases are on the hot path). */
void kvp__pool_emit(kvp_pool_t *p, int32_t kind, int32_t page);
static inline void kvp__pool_event(kvp_pool_t *p, int32_t kind, int32_t page) {
    if (p->event_fn != NULL) kvp__pool_emit(p, kind, page);
}

/* ---- checks for tests and the fuzzer ----------------------------------- */

/* The prefix-cache part of kvp__pool_check. */
int kvp__prefix_check(const kvp_pool_t *p, char *err, size_t err_size);
/* Verify every internal invariant of the pool; KVP_OK or KVP_EINTERNAL with
 * the first violation in `err`. O(pages). */
int kvp__pool_check(const kvp_pool_t *p, char *err, size_t err_size);
/* Verify the table's invariants against its pool. O(pages of all sequences). */
int kvp__table_check(const kvp_table_t *t, char *err, size_t err_size);
/* Verify the host tier's invariants, then its table's. */
int kvp__tier_check(const kvp_tier_t *t, char *err, size_t err_size);
/* Tests: narrow hashes to `mask` bits to force collisions. */
void kvp__pool_set_hash_mask(kvp_pool_t *p, uint64_t mask);

#ifdef __cplusplus
}
#endif

#endif /* KVPAGE_PAGING_H */
