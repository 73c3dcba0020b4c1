/*
 * Layer `pool`: page ids, reference counts, free lists, stats and events.
 * The prefix cache's index and eviction order are in prefix.c.
 *
 * Everything is sized at creation: the free lists are intrusive (linked
 * through the page metadata), so allocating or releasing a page touches one
 * metadata entry and allocates nothing.
 */
#include "paging.h"

#include <stdio.h>
#include <string.h>

/* ---- errors -------------------------------------------------------------- */

int kvp__pool_fail(kvp_pool_t *pool, int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    kvp__verrf(pool->err, sizeof pool->err, status, fmt, ap);
    va_end(ap);
    return status;
}

const char *kvp_pool_last_error(const kvp_pool_t *pool) {
    return pool ? pool->err : KVP__NULL_HANDLE;
}

/* ---- creation ------------------------------------------------------------ */

void kvp_pool_params_init(kvp_pool_params_t *p) {
    if (p == NULL) return;
    memset(p, 0, sizeof *p);
    p->struct_size = sizeof *p;
    p->page_size = 16;
    p->prefix_cache = 1;
}

static int check_params(const kvp_pool_params_t *p, char *err, size_t err_size) {
    int rc = kvp__check_struct(p, sizeof *p, "params", err, err_size);
    if (rc == KVP_OK) rc = kvp__check_reserved(p->reserved_, "params", err, err_size);
    if (rc != KVP_OK) return rc;
    if (p->page_size < 1 || p->page_size > KVP_MAX_PAGE_SIZE)
        return kvp__errf(err, err_size, KVP_EINVAL, "page_size must be 1..%d, got %d",
                         KVP_MAX_PAGE_SIZE, (int)p->page_size);
    if (p->num_pages < 1)
        return kvp__errf(err, err_size, KVP_EINVAL,
                         "num_pages must be at least 1, got %d", (int)p->num_pages);
    if (p->num_staging < 0)
        return kvp__errf(err, err_size, KVP_EINVAL, "num_staging must be >= 0, got %d",
                         (int)p->num_staging);
    if ((int64_t)p->num_pages + p->num_staging > INT32_MAX)
        return kvp__errf(err, err_size, KVP_EINVAL,
                         "%d pages + %d staging pages exceed the 2^31-1 int32 page ids",
                         (int)p->num_pages, (int)p->num_staging);
    if (p->prefix_cache != 0 && p->prefix_cache != 1)
        return kvp__errf(err, err_size, KVP_EINVAL, "prefix_cache must be 0 or 1, got %d",
                         (int)p->prefix_cache);
    return kvp__allocator_check(&p->allocator, err, err_size);
}

static void free_arrays(kvp_pool_t *p) {
    kvp__free(&p->allocator, p->pages);
    kvp__free(&p->allocator, p->staging);
    kvp__free(&p->allocator, p->tokens);
    kvp__free(&p->allocator, p->buckets);
    kvp__free(&p->allocator, p->heap);
}

/* Allocate `n` elements of `size`, or fail if n*size overflows size_t. */
static void *alloc_array(kvp_pool_t *p, uint64_t n, size_t size) {
    uint64_t bytes;
    if (n == 0) n = 1; /* keep every array non-NULL */
    if (!kvp__mul_u64(n, size, &bytes) || bytes > SIZE_MAX) return NULL;
    return kvp__malloc(&p->allocator, (size_t)bytes, 64);
}

static uint32_t bucket_count(int32_t pages) {
    uint32_t b = 1;
    while (b < (uint32_t)pages) b <<= 1;
    return b;
}

static int alloc_arrays(kvp_pool_t *p, char *err, size_t err_size) {
    uint64_t ids = (uint64_t)p->num_pages + (uint64_t)p->num_staging;
    uint64_t token_count;
    if (!kvp__mul_u64(ids, (uint64_t)p->page_size, &token_count) ||
        token_count > SIZE_MAX / sizeof(int32_t))
        return kvp__errf(err, err_size, KVP_EINVAL,
                         "token ids of %llu pages of %d tokens overflow size_t",
                         (unsigned long long)ids, (int)p->page_size);
    p->pages = alloc_array(p, (uint64_t)p->num_pages, sizeof *p->pages);
    p->staging = alloc_array(p, (uint64_t)p->num_staging, sizeof *p->staging);
    bool ok = p->pages && p->staging;
    if (ok && p->prefix_cache) {
        p->bucket_mask = bucket_count(p->num_pages) - 1;
        p->tokens = alloc_array(p, token_count, sizeof *p->tokens);
        p->buckets = alloc_array(p, (uint64_t)p->bucket_mask + 1, sizeof *p->buckets);
        p->heap = alloc_array(p, (uint64_t)p->num_pages, sizeof *p->heap);
        ok = p->tokens && p->buckets && p->heap;
    }
    if (!ok)
        return kvp__errf(err, err_size, KVP_ENOMEM,
                         "cannot allocate the metadata of %d pages", (int)p->num_pages);
    return KVP_OK;
}

/* Link every page into the free lists in id order, so a fresh pool hands
 * out 0, 1, 2, ... */
static void init_lists(kvp_pool_t *p) {
    for (int32_t i = 0; i < p->num_pages; i++) {
        kvp__page *pg = &p->pages[i];
        memset(pg, 0, sizeof *pg);
        pg->next = i + 1 < p->num_pages ? i + 1 : -1;
        pg->parent = -1;
        pg->heap_pos = -1;
        pg->state = KVP__PAGE_FREE;
    }
    p->free_head = 0;
    p->free_count = p->num_pages;
    for (int32_t i = 0; i < p->num_staging; i++) {
        p->staging[i].ref = 0;
        p->staging[i].ext = 0;
        p->staging[i].next = i + 1 < p->num_staging ? i + 1 : -1;
    }
    p->staging_free_head = p->num_staging > 0 ? 0 : -1;
    p->staging_free_count = p->num_staging;
    if (p->buckets)
        for (uint32_t b = 0; b <= p->bucket_mask; b++) p->buckets[b] = -1;
    if (p->tokens)
        memset(p->tokens, 0,
               ((size_t)p->num_pages + (size_t)p->num_staging) * (size_t)p->page_size *
                   sizeof *p->tokens);
}

int kvp_pool_create(const kvp_pool_params_t *params, kvp_pool_t **pool, char *err,
                    size_t err_size) {
    if (pool == NULL) return kvp__errf(err, err_size, KVP_EINVAL, "pool (output) is NULL");
    int rc = check_params(params, err, err_size);
    if (rc != KVP_OK) return rc;
    kvp_allocator_t hooks = params->allocator;
    kvp_pool_t *p = kvp__malloc(&hooks, sizeof *p, 64);
    if (p == NULL)
        return kvp__errf(err, err_size, KVP_ENOMEM, "cannot allocate the pool object");
    memset(p, 0, sizeof *p);
    p->allocator = hooks;
    p->page_size = params->page_size;
    p->num_pages = params->num_pages;
    p->num_staging = params->num_staging;
    p->prefix_cache = params->prefix_cache == 1;
    p->hash_seed = params->hash_seed;
    p->hash_mask = UINT64_MAX;
    rc = alloc_arrays(p, err, err_size);
    if (rc != KVP_OK) {
        free_arrays(p);
        kvp__free(&hooks, p);
        return rc;
    }
    init_lists(p);
    *pool = p;
    return KVP_OK;
}

int kvp_pool_create_from_plan(const kvp_plan_t *plan, const kvp_pool_params_t *params,
                              kvp_pool_t **pool, char *err, size_t err_size) {
    int rc = kvp__check_struct(plan, sizeof *plan, "plan", err, err_size);
    if (rc != KVP_OK) return rc;
    kvp_pool_params_t p;
    kvp_pool_params_init(&p);
    if (params != NULL) {
        rc = kvp__check_struct(params, sizeof *params, "params", err, err_size);
        if (rc != KVP_OK) return rc;
        p = *params;
    }
    if (plan->page_bytes == 0 || plan->page_size < 1)
        return kvp__errf(err, err_size, KVP_EINVAL,
                         "plan is not initialised (use kvp_plan_compute)");
    if (plan->needs_staging && plan->num_staging == 0)
        return kvp__errf(err, err_size, KVP_EINVAL,
                         "the plan's key format needs a staging page per sequence but it "
                         "counted none: set a context length in the plan parameters");
    if (plan->num_pages > (uint64_t)INT32_MAX ||
        plan->num_staging > (uint64_t)INT32_MAX - plan->num_pages)
        return kvp__errf(err, err_size, KVP_EINVAL,
                         "the plan has %llu pages and %llu staging pages, more than int32 "
                         "page ids can name: use a larger page size",
                         (unsigned long long)plan->num_pages,
                         (unsigned long long)plan->num_staging);
    p.page_size = plan->page_size;
    p.num_pages = (int32_t)plan->num_pages;
    p.num_staging = plan->needs_staging ? (int32_t)plan->num_staging : 0;
    return kvp_pool_create(&p, pool, err, err_size);
}

int kvp_pool_create_for_budget(const kvp_plan_params_t *plan_params,
                               const kvp_pool_params_t *params, kvp_pool_t **pool,
                               kvp_plan_t *plan, char *err, size_t err_size) {
    if (plan != NULL) {
        int rc = kvp__check_struct(plan, sizeof *plan, "plan", err, err_size);
        if (rc != KVP_OK) return rc;
    }
    kvp_plan_t computed;
    memset(&computed, 0, sizeof computed);
    computed.struct_size = sizeof computed;
    int rc = kvp_plan_compute(plan_params, &computed, err, err_size);
    if (rc != KVP_OK) return rc;
    rc = kvp_pool_create_from_plan(&computed, params, pool, err, err_size);
    if (rc == KVP_OK && plan != NULL) kvp__copy_out(plan, &computed, sizeof computed);
    return rc;
}

void kvp_pool_destroy(kvp_pool_t *pool) {
    if (pool == NULL) return;
    kvp_allocator_t hooks = pool->allocator;
    free_arrays(pool);
    kvp__free(&hooks, pool);
}

/* ---- events -------------------------------------------------------------- */

int kvp_pool_set_event_callback(kvp_pool_t *pool, kvp_pool_event_fn fn, void *opaque) {
    if (pool == NULL) return KVP_EINVAL;
    pool->event_fn = fn;
    pool->event_opaque = opaque;
    return KVP_OK;
}

void kvp__pool_emit(kvp_pool_t *p, int32_t kind, int32_t page) {
    const kvp__page *pg = &p->pages[page];
    kvp_pool_event_t ev;
    memset(&ev, 0, sizeof ev);
    ev.struct_size = sizeof ev;
    ev.kind = kind;
    ev.page = page;
    ev.priority = pg->priority;
    ev.parent = kind == KVP_EVENT_PAGE_FREED ? -1 : pg->parent;
    ev.hash = kind == KVP_EVENT_PAGE_FREED ? 0 : pg->hash;
    p->event_fn(p->event_opaque, &ev);
}

/* ---- taking and dropping pages (shared with the table) -------------------- */

static void push_free(kvp_pool_t *p, int32_t page) {
    kvp__page *pg = &p->pages[page];
    pg->state = KVP__PAGE_FREE;
    pg->next = p->free_head;
    p->free_head = page;
    p->free_count++;
    kvp__pool_event(p, KVP_EVENT_PAGE_FREED, page);
}

void kvp__evict_one(kvp_pool_t *p) {
    int32_t page = p->heap[0];
    kvp__heap_remove(p, page);
    kvp__prefix_unstore(p, page);
    p->cached_count--;
    push_free(p, page);
}

bool kvp__pool_forget(kvp_pool_t *p, int32_t page) {
    const kvp__page *pg = &p->pages[page];
    if (pg->state != KVP__PAGE_CACHED || pg->heap_pos < 0) return false;
    kvp__heap_remove(p, page);
    kvp__prefix_unstore(p, page);
    p->cached_count--;
    push_free(p, page);
    return true;
}

int32_t kvp__pool_take(kvp_pool_t *p, int32_t priority) {
    if (p->free_head < 0) kvp__evict_one(p);
    int32_t page = p->free_head;
    kvp__page *pg = &p->pages[page];
    p->free_head = pg->next;
    p->free_count--;
    pg->next = -1;
    pg->ref = 1;
    pg->state = KVP__PAGE_USED;
    pg->priority = priority;
    return page;
}

void kvp__pool_drop(kvp_pool_t *p, int32_t page) {
    kvp__page *pg = &p->pages[page];
    if (--pg->ref > 0) return;
    if (!pg->stored) {
        push_free(p, page);
        return;
    }
    /* Keep it for later prompts; only pages nothing stored depends on are
     * eviction candidates, so chains are evicted from their ends. */
    pg->state = KVP__PAGE_CACHED;
    pg->stamp = ++p->clock;
    p->cached_count++;
    if (pg->children == 0) kvp__heap_push(p, page);
}

void kvp__pool_attach(kvp_pool_t *p, int32_t page, int32_t priority) {
    kvp__page *pg = &p->pages[page];
    if (pg->state == KVP__PAGE_CACHED) {
        if (pg->heap_pos >= 0) kvp__heap_remove(p, page);
        p->cached_count--;
        pg->state = KVP__PAGE_USED;
    }
    pg->ref++;
    if (pg->priority < priority) pg->priority = priority;
}

int32_t kvp__staging_take(kvp_pool_t *p) {
    int32_t slot = p->staging_free_head;
    kvp__staging *s = &p->staging[slot];
    p->staging_free_head = s->next;
    p->staging_free_count--;
    s->next = KVP__IN_USE;
    s->ref = 1;
    return p->num_pages + slot;
}

void kvp__staging_drop(kvp_pool_t *p, int32_t page) {
    int32_t slot = page - p->num_pages;
    kvp__staging *s = &p->staging[slot];
    if (--s->ref > 0) return;
    s->next = p->staging_free_head;
    p->staging_free_head = slot;
    p->staging_free_count++;
}

/* ---- public allocation ---------------------------------------------------- */

static int alloc_general(kvp_pool_t *pool, int32_t n, int32_t *pages) {
    if (pool == NULL) return KVP_EINVAL;
    if (pages == NULL || n < 1)
        return kvp__pool_fail(pool, KVP_EINVAL, "kvp_pool_alloc: %s",
                              pages == NULL ? "pages is NULL" : "n must be >= 1");
    if (n > kvp__pool_available(pool))
        return kvp__pool_fail(pool, KVP_ENOSPC,
                              "kvp_pool_alloc: %d pages wanted, %lld available (%d free, "
                              "%d cached, %lld reserved)",
                              (int)n, (long long)kvp__pool_available(pool),
                              (int)pool->free_count, (int)pool->cached_count,
                              (long long)pool->reserved);
    for (int32_t i = 0; i < n; i++) {
        int32_t page = kvp__pool_take(pool, 0);
        pool->pages[page].ext = 1;
        pages[i] = page;
    }
    return KVP_OK;
}

int kvp_pool_alloc(kvp_pool_t *pool, int32_t n, int32_t *pages) {
    /* Fast path, same effect as the general one: one page from a free list
     * with more free pages than reserved ones (no eviction needed). */
    if (KVP__LIKELY(pool != NULL && pages != NULL && n == 1 &&
                    pool->free_count > pool->reserved)) {
        int32_t page = pool->free_head;
        kvp__page *pg = &pool->pages[page];
        pool->free_head = pg->next;
        pool->free_count--;
        pg->next = -1;
        pg->ref = 1;
        pg->ext = 1;
        pg->state = KVP__PAGE_USED;
        pg->priority = 0;
        *pages = page;
        return KVP_OK;
    }
    return alloc_general(pool, n, pages);
}

int kvp_pool_alloc_staging(kvp_pool_t *pool, int32_t n, int32_t *pages) {
    if (pool == NULL) return KVP_EINVAL;
    if (pages == NULL || n < 1)
        return kvp__pool_fail(pool, KVP_EINVAL, "kvp_pool_alloc_staging: %s",
                              pages == NULL ? "pages is NULL" : "n must be >= 1");
    if (n > pool->staging_free_count)
        return kvp__pool_fail(pool, KVP_ENOSPC,
                              "kvp_pool_alloc_staging: %d staging pages wanted, %d free of %d",
                              (int)n, (int)pool->staging_free_count, (int)pool->num_staging);
    for (int32_t i = 0; i < n; i++) {
        int32_t page = kvp__staging_take(pool);
        pool->staging[page - pool->num_pages].ext = 1;
        pages[i] = page;
    }
    return KVP_OK;
}

static bool page_in_range(const kvp_pool_t *p, int32_t page) {
    return page >= 0 && page < p->num_pages + p->num_staging;
}

/* Reference counts of a page id: the total and the engine's share. */
static int32_t *ref_of(kvp_pool_t *p, int32_t page) {
    return kvp__is_staging_id(p, page) ? &p->staging[page - p->num_pages].ref
                                       : &p->pages[page].ref;
}
static int32_t *ext_of(kvp_pool_t *p, int32_t page) {
    return kvp__is_staging_id(p, page) ? &p->staging[page - p->num_pages].ext
                                       : &p->pages[page].ext;
}

static int check_ids(kvp_pool_t *p, const char *fn, int32_t n, const int32_t *pages) {
    if (n < 0 || (n > 0 && pages == NULL))
        return kvp__pool_fail(p, KVP_EINVAL, "%s: %s", fn,
                              n < 0 ? "n must be >= 0" : "pages is NULL");
    for (int32_t i = 0; i < n; i++)
        if (!page_in_range(p, pages[i]))
            return kvp__pool_fail(p, KVP_EINVAL, "%s: pages[%d] = %d is out of range 0..%d",
                                  fn, (int)i, (int)pages[i],
                                  (int)(p->num_pages + p->num_staging - 1));
    return KVP_OK;
}

int kvp_pool_retain(kvp_pool_t *pool, int32_t n, const int32_t *pages) {
    if (pool == NULL) return KVP_EINVAL;
    int rc = check_ids(pool, "kvp_pool_retain", n, pages);
    if (rc != KVP_OK) return rc;
    for (int32_t i = 0; i < n; i++) {
        int32_t page = pages[i];
        const char *why = NULL;
        if (*ref_of(pool, page) == 0) why = "is not in use";
        else if (*ref_of(pool, page) == INT32_MAX) why = "has 2^31-1 references already";
        /* A stored page referenced from outside the sequences would keep
         * its chain's cached ancestors from ever being evicted. */
        else if (!kvp__is_staging_id(pool, page) && pool->pages[page].stored)
            why = "is in the prefix cache (its references belong to the page table)";
        if (why != NULL) {
            for (int32_t j = 0; j < i; j++) {
                (*ref_of(pool, pages[j]))--;
                (*ext_of(pool, pages[j]))--;
            }
            return kvp__pool_fail(pool, KVP_EINVAL, "kvp_pool_retain: page %d %s",
                                  (int)page, why);
        }
        (*ref_of(pool, page))++;
        (*ext_of(pool, page))++;
    }
    return KVP_OK;
}

static int release_general(kvp_pool_t *pool, int32_t n, const int32_t *pages) {
    if (pool == NULL) return KVP_EINVAL;
    int rc = check_ids(pool, "kvp_pool_release", n, pages);
    if (rc != KVP_OK) return rc;
    /* Count first (undoing on error), so a bad list changes nothing; then
     * hand back the pages whose count reached 0. */
    for (int32_t i = 0; i < n; i++) {
        int32_t *ext = ext_of(pool, pages[i]);
        if (*ext == 0) {
            for (int32_t j = 0; j < i; j++) (*ext_of(pool, pages[j]))++;
            return kvp__pool_fail(pool, KVP_EINVAL,
                                  "kvp_pool_release: page %d holds no reference taken with "
                                  "kvp_pool_alloc or kvp_pool_retain (double release?)",
                                  (int)pages[i]);
        }
        (*ext)--;
    }
    for (int32_t i = 0; i < n; i++) {
        int32_t page = pages[i];
        if (kvp__is_staging_id(pool, page)) kvp__staging_drop(pool, page);
        else kvp__pool_drop(pool, page);
    }
    return KVP_OK;
}

int kvp_pool_release(kvp_pool_t *pool, int32_t n, const int32_t *pages) {
    /* Fast path, same effect as the general one: the engine's only
     * reference to one pool page, with no event callback to call. */
    if (KVP__LIKELY(pool != NULL && pages != NULL && n == 1 && pool->event_fn == NULL)) {
        int32_t page = pages[0];
        if ((uint32_t)page < (uint32_t)pool->num_pages) {
            kvp__page *pg = &pool->pages[page];
            if (pg->ref == 1 && pg->ext == 1) { /* ext > 0 means never stored */
                pg->ref = 0;
                pg->ext = 0;
                pg->state = KVP__PAGE_FREE;
                pg->next = pool->free_head;
                pool->free_head = page;
                pool->free_count++;
                return KVP_OK;
            }
        }
    }
    return release_general(pool, n, pages);
}

int kvp_pool_refcount(kvp_pool_t *pool, int32_t page, int32_t *refcount) {
    if (pool == NULL) return KVP_EINVAL;
    if (refcount == NULL)
        return kvp__pool_fail(pool, KVP_EINVAL, "kvp_pool_refcount: refcount is NULL");
    if (!page_in_range(pool, page))
        return kvp__pool_fail(pool, KVP_EINVAL, "kvp_pool_refcount: page %d is out of range 0..%d",
                              (int)page, (int)(pool->num_pages + pool->num_staging - 1));
    *refcount = *ref_of(pool, page);
    return KVP_OK;
}

int kvp_pool_evict(kvp_pool_t *pool, int32_t max_pages, int32_t *evicted) {
    if (pool == NULL) return KVP_EINVAL;
    if (max_pages < 0)
        return kvp__pool_fail(pool, KVP_EINVAL, "kvp_pool_evict: max_pages must be >= 0, got %d",
                              (int)max_pages);
    /* Evicting moves cached pages to the free list: available pages, and so
     * every reservation, are unaffected. */
    int32_t done = 0;
    while (done < max_pages && pool->cached_count > 0) {
        kvp__evict_one(pool);
        done++;
    }
    if (evicted) *evicted = done;
    return KVP_OK;
}

int kvp_pool_stats(kvp_pool_t *pool, kvp_pool_stats_t *stats) {
    if (pool == NULL) return KVP_EINVAL;
    int rc = kvp__check_struct(stats, sizeof *stats, "stats", pool->err, sizeof pool->err);
    if (rc != KVP_OK) return rc;
    kvp_pool_stats_t s;
    memset(&s, 0, sizeof s);
    s.struct_size = sizeof s;
    s.page_size = pool->page_size;
    s.total_pages = pool->num_pages;
    s.free_pages = pool->free_count;
    s.cached_pages = pool->cached_count;
    s.used_pages = (int64_t)pool->num_pages - pool->free_count - pool->cached_count;
    s.reserved_pages = pool->reserved;
    s.available_pages = kvp__pool_available(pool);
    s.total_staging = pool->num_staging;
    s.used_staging = (int64_t)pool->num_staging - pool->staging_free_count;
    s.live_seqs = pool->live_seqs;
    s.live_tokens = pool->live_tokens;
    int64_t slots = (s.used_pages + s.used_staging) * (int64_t)pool->page_size;
    s.utilization = slots > 0 ? (double)s.live_tokens / (double)slots : 0.0;
    s.prefix_lookups = pool->prefix_lookups;
    s.prefix_hit_tokens = pool->prefix_hit_tokens;
    s.prefix_miss_tokens = pool->prefix_miss_tokens;
    s.pages_stored = pool->pages_stored;
    s.pages_evicted = pool->pages_evicted;
    kvp__copy_out(stats, &s, sizeof s);
    return KVP_OK;
}

void kvp__pool_set_hash_mask(kvp_pool_t *p, uint64_t mask) { p->hash_mask = mask; }

/* ---- invariant check ------------------------------------------------------- */

#define CHECK(cond, ...)                                                 \
    do {                                                                 \
        if (!(cond)) return kvp__errf(err, err_size, KVP_EINTERNAL, __VA_ARGS__); \
    } while (0)

static int check_free_lists(const kvp_pool_t *p, char *err, size_t err_size) {
    int32_t n = 0;
    for (int32_t page = p->free_head; page >= 0; page = p->pages[page].next) {
        CHECK(page < p->num_pages, "free list holds id %d", (int)page);
        CHECK(++n <= p->num_pages, "free list has a cycle");
        CHECK(p->pages[page].state == KVP__PAGE_FREE, "page %d on the free list is not free",
              (int)page);
    }
    CHECK(n == p->free_count, "free list has %d pages, count says %d", (int)n,
          (int)p->free_count);
    n = 0;
    for (int32_t s = p->staging_free_head; s >= 0; s = p->staging[s].next) {
        CHECK(s < p->num_staging, "staging free list holds slot %d", (int)s);
        CHECK(++n <= p->num_staging, "staging free list has a cycle");
        CHECK(p->staging[s].ref == 0 && p->staging[s].ext == 0,
              "free staging slot %d has references", (int)s);
    }
    CHECK(n == p->staging_free_count, "staging free list has %d, count says %d", (int)n,
          (int)p->staging_free_count);
    for (int32_t s = 0; s < p->num_staging; s++) {
        const kvp__staging *st = &p->staging[s];
        CHECK(st->next != KVP__IN_USE || st->ref >= 1, "used staging slot %d has no reference",
              (int)s);
        CHECK(st->ext >= 0 && st->ext <= st->ref, "staging slot %d: ext %d of ref %d", (int)s,
              (int)st->ext, (int)st->ref);
    }
    return KVP_OK;
}

static int check_page(const kvp_pool_t *p, int32_t i, char *err, size_t err_size) {
    const kvp__page *pg = &p->pages[i];
    CHECK(pg->ext >= 0 && pg->ext <= pg->ref, "page %d: ext %d, ref %d", (int)i, (int)pg->ext,
          (int)pg->ref);
    switch (pg->state) {
    case KVP__PAGE_FREE:
        CHECK(pg->ref == 0 && !pg->stored && pg->heap_pos < 0,
              "free page %d: ref %d stored %d heap %d", (int)i, (int)pg->ref, (int)pg->stored,
              (int)pg->heap_pos);
        break;
    case KVP__PAGE_USED:
        CHECK(pg->ref > 0 && pg->heap_pos < 0, "used page %d: ref %d heap %d", (int)i,
              (int)pg->ref, (int)pg->heap_pos);
        CHECK(!pg->stored || pg->ext == 0, "stored page %d has engine references", (int)i);
        break;
    case KVP__PAGE_CACHED:
        CHECK(pg->ref == 0 && pg->stored, "cached page %d: ref %d stored %d", (int)i,
              (int)pg->ref, (int)pg->stored);
        CHECK((pg->heap_pos >= 0) == (pg->children == 0),
              "cached page %d: %d children but heap position %d", (int)i, (int)pg->children,
              (int)pg->heap_pos);
        break;
    default: CHECK(0, "page %d has state %d", (int)i, (int)pg->state);
    }
    if (pg->stored) {
        CHECK(pg->parent < 0 || (pg->parent < p->num_pages && p->pages[pg->parent].stored),
              "stored page %d has parent %d that is not stored", (int)i, (int)pg->parent);
        /* a used page's chain is held by the same sequences */
        CHECK(pg->ref == 0 || pg->parent < 0 || p->pages[pg->parent].ref >= pg->ref,
              "used stored page %d (ref %d) has parent %d with ref %d", (int)i, (int)pg->ref,
              (int)pg->parent, (int)(pg->parent >= 0 ? p->pages[pg->parent].ref : 0));
    }
    return KVP_OK;
}

int kvp__pool_check(const kvp_pool_t *p, char *err, size_t err_size) {
    int rc = check_free_lists(p, err, err_size);
    if (rc != KVP_OK) return rc;
    int32_t cached = 0;
    for (int32_t i = 0; i < p->num_pages; i++) {
        rc = check_page(p, i, err, err_size);
        if (rc != KVP_OK) return rc;
        cached += p->pages[i].state == KVP__PAGE_CACHED;
    }
    CHECK(cached == p->cached_count, "%d cached pages, count says %d", (int)cached,
          (int)p->cached_count);
    CHECK(p->reserved >= 0 && p->reserved <= (int64_t)p->free_count + p->cached_count,
          "reserved %lld exceeds free %d + cached %d", (long long)p->reserved,
          (int)p->free_count, (int)p->cached_count);
    return kvp__prefix_check(p, err, err_size);
}
