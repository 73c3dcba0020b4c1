/*
 * Layer `pool`, prefix cache: a hash index of full pages and the eviction
 * order of cached pages.
 *
 * A stored page is named by its chain: (parent page, salt, its token ids),
 * where the parent is the stored page holding the previous page of tokens
 * (-1 for a prompt's first page). The 64-bit chained hash of that name only
 * picks a bucket: a lookup compares the parent id, the salt and every token
 * id, so a hash collision costs a comparison and can never return a page
 * holding other tokens. Two pages with the same name are never both stored.
 *
 * Eviction: cached pages (reference count 0) that no stored page extends
 * sit in a binary min-heap ordered by (priority, last release, page id); a
 * parent enters the heap when its last stored child leaves the cache, so a
 * chain is always evicted from its end and never breaks in the middle.
 */
#include "paging.h"

#include <string.h>

/* ---- hashing --------------------------------------------------------------- */

/* splitmix64's finalizer: every input bit affects every output bit. */
static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

uint64_t kvp__prefix_root_hash(const kvp_pool_t *p, uint64_t salt) {
    return mix64(salt ^ mix64(p->hash_seed ^ 0x6b7670726f6f7421ull)) & p->hash_mask;
}

/* Hash of a page of tokens after `parent_hash`: two token ids per 64-bit
 * word, multiply-xorshift per word, a full mix at the end. */
static uint64_t page_hash(const kvp_pool_t *p, uint64_t parent_hash, const int32_t *tokens) {
    uint64_t h = mix64(parent_hash ^ p->hash_seed);
    int32_t n = p->page_size, i = 0;
    for (; i + 2 <= n; i += 2) {
        uint64_t w = (uint64_t)(uint32_t)tokens[i] | (uint64_t)(uint32_t)tokens[i + 1] << 32;
        h = (h ^ w) * 0x9e3779b97f4a7c15ull;
        h ^= h >> 29;
    }
    if (i < n) {
        h = (h ^ (uint32_t)tokens[i]) * 0x9e3779b97f4a7c15ull;
        h ^= h >> 29;
    }
    return mix64(h) & p->hash_mask;
}

/* ---- the index ----------------------------------------------------------- */

static bool same_name(const kvp_pool_t *p, int32_t page, uint64_t hash, int32_t parent,
                      uint64_t salt, const int32_t *tokens) {
    const kvp__page *pg = &p->pages[page];
    return pg->hash == hash && pg->parent == parent && pg->salt == salt &&
           memcmp(p->tokens + (size_t)page * (size_t)p->page_size, tokens,
                  (size_t)p->page_size * sizeof *tokens) == 0;
}

int32_t kvp__prefix_find(const kvp_pool_t *p, int32_t parent, uint64_t parent_hash,
                         uint64_t salt, const int32_t *tokens, uint64_t *hash) {
    uint64_t h = page_hash(p, parent_hash, tokens);
    if (hash) *hash = h;
    for (int32_t c = p->buckets[h & p->bucket_mask]; c >= 0; c = p->pages[c].next)
        if (same_name(p, c, h, parent, salt, tokens)) return c;
    return -1;
}

bool kvp__prefix_store(kvp_pool_t *p, int32_t page, int32_t parent, uint64_t salt) {
    uint64_t parent_hash = parent >= 0 ? p->pages[parent].hash : kvp__prefix_root_hash(p, salt);
    const int32_t *tokens = kvp__page_tokens(p, page);
    uint64_t h;
    if (kvp__prefix_find(p, parent, parent_hash, salt, tokens, &h) >= 0) return false;
    kvp__page *pg = &p->pages[page];
    uint32_t b = (uint32_t)(h & p->bucket_mask);
    pg->next = p->buckets[b];
    p->buckets[b] = page;
    pg->stored = 1;
    pg->hash = h;
    pg->parent = parent;
    pg->salt = salt;
    pg->children = 0;
    if (parent >= 0) p->pages[parent].children++; /* the parent is in use: not in the heap */
    p->pages_stored++;
    kvp__pool_event(p, KVP_EVENT_PAGE_STORED, page);
    return true;
}

void kvp__prefix_unstore(kvp_pool_t *p, int32_t page) {
    kvp__page *pg = &p->pages[page];
    kvp__pool_event(p, KVP_EVENT_PAGE_EVICTED, page);
    int32_t *link = &p->buckets[pg->hash & p->bucket_mask];
    while (*link != page) link = &p->pages[*link].next;
    *link = pg->next;
    pg->next = -1;
    pg->stored = 0;
    pg->epoch++; /* its bytes may change from now on */
    p->pages_evicted++;
    int32_t parent = pg->parent;
    pg->parent = -1;
    if (parent < 0) return;
    kvp__page *pp = &p->pages[parent];
    if (--pp->children == 0 && pp->state == KVP__PAGE_CACHED) kvp__heap_push(p, parent);
}

/* ---- the eviction heap ------------------------------------------------------ */

/* True if page a is evicted before page b. */
static inline bool evict_before(const kvp_pool_t *p, int32_t a, int32_t b) {
    const kvp__page *x = &p->pages[a], *y = &p->pages[b];
    if (x->priority != y->priority) return x->priority < y->priority;
    if (x->stamp != y->stamp) return x->stamp < y->stamp;
    return a < b;
}

static inline void heap_set(kvp_pool_t *p, int32_t pos, int32_t page) {
    p->heap[pos] = page;
    p->pages[page].heap_pos = pos;
}

static void sift_up(kvp_pool_t *p, int32_t pos) {
    int32_t page = p->heap[pos];
    while (pos > 0) {
        int32_t up = (pos - 1) / 2;
        if (!evict_before(p, page, p->heap[up])) break;
        heap_set(p, pos, p->heap[up]);
        pos = up;
    }
    heap_set(p, pos, page);
}

static void sift_down(kvp_pool_t *p, int32_t pos) {
    int32_t page = p->heap[pos];
    for (;;) {
        int32_t child = 2 * pos + 1;
        if (child >= p->heap_len) break;
        if (child + 1 < p->heap_len && evict_before(p, p->heap[child + 1], p->heap[child]))
            child++;
        if (!evict_before(p, p->heap[child], page)) break;
        heap_set(p, pos, p->heap[child]);
        pos = child;
    }
    heap_set(p, pos, page);
}

void kvp__heap_push(kvp_pool_t *p, int32_t page) {
    heap_set(p, p->heap_len++, page);
    sift_up(p, p->heap_len - 1);
}

void kvp__heap_remove(kvp_pool_t *p, int32_t page) {
    int32_t pos = p->pages[page].heap_pos;
    int32_t last = p->heap[--p->heap_len];
    p->pages[page].heap_pos = -1;
    if (pos == p->heap_len) return;
    heap_set(p, pos, last);
    sift_down(p, pos);
    sift_up(p, p->pages[last].heap_pos);
}

/* ---- invariant check (tests, fuzzer) ---------------------------------------- */

#define CHECK(cond, ...)                                                          \
    do {                                                                          \
        if (!(cond)) return kvp__errf(err, err_size, KVP_EINTERNAL, __VA_ARGS__); \
    } while (0)

static int check_heap(const kvp_pool_t *p, char *err, size_t err_size) {
    for (int32_t pos = 0; pos < p->heap_len; pos++) {
        int32_t page = p->heap[pos];
        CHECK(page >= 0 && page < p->num_pages, "heap[%d] = %d", (int)pos, (int)page);
        CHECK(p->pages[page].heap_pos == pos, "page %d: heap_pos %d, found at %d", (int)page,
              (int)p->pages[page].heap_pos, (int)pos);
        CHECK(pos == 0 || !evict_before(p, page, p->heap[(pos - 1) / 2]),
              "heap order broken at %d", (int)pos);
    }
    int32_t in_heap = 0;
    for (int32_t i = 0; i < p->num_pages; i++) in_heap += p->pages[i].heap_pos >= 0;
    CHECK(in_heap == p->heap_len, "%d pages claim a heap position, heap holds %d",
          (int)in_heap, (int)p->heap_len);
    return KVP_OK;
}

static int check_stored(const kvp_pool_t *p, int32_t i, char *err, size_t err_size) {
    const kvp__page *pg = &p->pages[i];
    uint64_t parent_hash =
        pg->parent >= 0 ? p->pages[pg->parent].hash : kvp__prefix_root_hash(p, pg->salt);
    uint64_t h;
    int32_t found = kvp__prefix_find(p, pg->parent, parent_hash, pg->salt,
                                     p->tokens + (size_t)i * (size_t)p->page_size, &h);
    CHECK(h == pg->hash, "stored page %d: hash %llx, its tokens hash to %llx", (int)i,
          (unsigned long long)pg->hash, (unsigned long long)h);
    CHECK(found == i, "stored page %d is found as %d (missing or duplicated)", (int)i,
          (int)found);
    if (p->num_pages <= 4096) { /* quadratic recount: test-sized pools only */
        int32_t children = 0;
        for (int32_t j = 0; j < p->num_pages; j++)
            children += p->pages[j].stored && p->pages[j].parent == i;
        CHECK(children == pg->children, "stored page %d has %d children, count says %d",
              (int)i, (int)children, (int)pg->children);
    }
    return KVP_OK;
}

int kvp__prefix_check(const kvp_pool_t *p, char *err, size_t err_size) {
    if (!p->prefix_cache) {
        for (int32_t i = 0; i < p->num_pages; i++)
            CHECK(!p->pages[i].stored, "page %d stored with the prefix cache off", (int)i);
        return p->heap_len == 0 ? KVP_OK
                                : kvp__errf(err, err_size, KVP_EINTERNAL, "heap not empty");
    }
    int32_t chained = 0;
    for (uint32_t b = 0; b <= p->bucket_mask; b++)
        for (int32_t c = p->buckets[b]; c >= 0; c = p->pages[c].next) {
            CHECK(c < p->num_pages && p->pages[c].stored, "bucket %u holds page %d", b, (int)c);
            CHECK((p->pages[c].hash & p->bucket_mask) == b, "page %d in the wrong bucket",
                  (int)c);
            CHECK(++chained <= p->num_pages, "hash chains have a cycle");
        }
    int32_t stored = 0;
    for (int32_t i = 0; i < p->num_pages; i++) {
        if (!p->pages[i].stored) continue;
        stored++;
        int rc = check_stored(p, i, err, err_size);
        if (rc != KVP_OK) return rc;
    }
    CHECK(stored == chained, "%d stored pages, %d in hash chains", (int)stored, (int)chained);
    return check_heap(p, err, err_size);
}
