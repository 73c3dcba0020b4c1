/*
 * Layer `cache`, beyond one process: the façade's blob identity, its tiers
 * (looked up on admission, written back on eviction, written through after
 * a page's K/V are complete), its events with chain hashes, and sequence
 * export/import.
 *
 * The cache listens to its pool's events. A page stored in the prefix cache
 * gets its chain hash then (from its parent's and its token ids); a stored
 * page the pool evicts is serialized at once, while its bytes are still
 * intact, into a small buffer that is put to the tiers when the pool call
 * returns. Pages stored during a step are queued and written through at the
 * next step (or release, flush, destruction), once the engine has written
 * their K/V for every layer.
 */
#define _POSIX_C_SOURCE 200809L
#include "backend.h"
#include "blob.h"
#include "cache.h"
#include "paging.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#define MAX_TIERS 8
/* Per-page state. */
enum { F_CHAIN = 1, F_PERSISTED = 2, F_PENDING = 4 };
/* Largest write-back buffer and lookup batch, in blobs; both shrink for
 * big pages so the buffers stay near BUFFER_BYTES. */
#define MAX_BATCH 32
#define BUFFER_BYTES (16u << 20)

typedef struct {
    kvp_blob_tier_t *tier;
    int32_t policy;
    kvp_cache_tier_stats_t stats;
} tier_slot;

struct kvp__cache_blob {
    kvp_blob_codec_t *codec; /* NULL while only an event callback is set */
    tier_slot tiers[MAX_TIERS];
    int32_t ntiers;
    kvp_hash_t *chain;       /* [num_pages] chain hash of stored pages (F_CHAIN) */
    kvp_hash_t *pchain;      /* [num_pages] their parents' chain hashes (events) */
    uint8_t *flags;          /* [num_pages] F_* */
    int32_t *pending;        /* [num_pages] pages to write through (F_PENDING) */
    int32_t npending;
    uint64_t blob_bytes;     /* a pool page's blob */
    int32_t batch;           /* blobs per buffer */
    uint8_t *buf;            /* batch blobs: the write-back buffer */
    kvp_hash_t *wkeys;       /* [batch] */
    kvp_hash_t *wparents;    /* [batch] their parents' chain hashes (events) */
    uint8_t *wmask;          /* [batch] tiers each buffered blob goes to */
    int32_t wn;
    uint8_t *rbuf;           /* batch blobs: lookups */
    kvp_page_op_t *ops;      /* [batch + 1] an import's (ignored) SEALs */
    kvp_hash_t *keys;        /* a prompt's chain hashes */
    int64_t keys_cap;
    int32_t importing_tier;  /* events: pages stored now come from this tier */
    bool importing;          /* pages stored now are copies of a tier's (persisted) */
    bool rolling_back;       /* pages evicted now hold wrong bytes: never write them */
    bool clearing;           /* kvp_cache_clear_prefix(): pages leave without a trace */
    kvp_cache_event_fn fn;
    void *opaque;
    uint64_t next_seq;       /* events' numbers */
};

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int32_t policy_mask(const struct kvp__cache_blob *b, int32_t policy) {
    int32_t m = 0;
    for (int32_t t = 0; t < b->ntiers; t++)
        if (b->tiers[t].policy & policy) m |= 1 << t;
    return m;
}

/* Number an event and deliver it. */
static void emit(kvp_cache_t *c, kvp_cache_event_t *ev) {
    struct kvp__cache_blob *b = c->blob;
    ev->seq_no = b->next_seq++;
    ev->page_size = c->page_size;
    if (b->fn != NULL) b->fn(b->opaque, ev);
}

/* A tier event (TIER_STORED, TIER_REMOVED, CLEARED). */
static void emit_tier(kvp_cache_t *c, int32_t kind, int32_t tier, const kvp_hash_t *chain,
                      const kvp_hash_t *parent) {
    kvp_cache_event_t ev;
    memset(&ev, 0, sizeof ev);
    ev.struct_size = sizeof ev;
    ev.kind = kind;
    ev.page = -1;
    ev.parent = -1;
    ev.tier = tier;
    if (chain) ev.chain = *chain;
    if (parent) ev.parent_chain = *parent;
    emit(c, &ev);
}

/* ---- writing to the tiers ------------------------------------------------- */

/* Put the buffered blobs, each to its tiers, batched per tier. */
static void flush_writes(kvp_cache_t *c) {
    struct kvp__cache_blob *b = c->blob;
    if (b == NULL || b->wn == 0) return;
    const void *blobs[MAX_BATCH];
    uint64_t sizes[MAX_BATCH];
    kvp_hash_t keys[MAX_BATCH];
    int32_t from[MAX_BATCH]; /* buffer index of each */
    for (int32_t t = 0; t < b->ntiers; t++) {
        int32_t n = 0;
        for (int32_t i = 0; i < b->wn; i++) {
            if (!(b->wmask[i] & (1 << t))) continue;
            blobs[n] = b->buf + (size_t)i * b->blob_bytes;
            sizes[n] = b->blob_bytes;
            from[n] = i;
            keys[n++] = b->wkeys[i];
        }
        if (n == 0) continue;
        tier_slot *s = &b->tiers[t];
        uint64_t t0 = now_ns();
        /* another process (or an earlier run) may have written them already */
        uint8_t present[MAX_BATCH];
        if (kvp_blob_tier_exists(s->tier, n, keys, present) == KVP_OK) {
            int32_t m = 0;
            for (int32_t i = 0; i < n; i++)
                if (!present[i]) {
                    blobs[m] = blobs[i];
                    from[m] = from[i];
                    keys[m++] = keys[i];
                }
            n = m;
        }
        if (n == 0) {
            s->stats.write_ns += now_ns() - t0;
            continue;
        }
        bool ok = kvp_blob_tier_put(s->tier, n, keys, blobs, sizes) == KVP_OK;
        if (ok) {
            s->stats.written += (uint64_t)n;
            s->stats.bytes_out += (uint64_t)n * b->blob_bytes;
        } else {
            s->stats.errors++;
        }
        s->stats.write_ns += now_ns() - t0;
        for (int32_t i = 0; ok && i < n; i++)
            emit_tier(c, KVP_EVENT_TIER_STORED, t, &keys[i], &b->wparents[from[i]]);
    }
    b->wn = 0;
}

/* Serialize a stored page into the buffer, for the tiers in `mask`. */
static bool buffer_page(kvp_cache_t *c, int32_t page, int32_t mask) {
    struct kvp__cache_blob *b = c->blob;
    if (b->wn == b->batch) flush_writes(c);
    uint64_t t0 = now_ns();
    int rc = kvp_blob_export(b->codec, page, c->page_size, &b->chain[page],
                             b->buf + (size_t)b->wn * b->blob_bytes, b->blob_bytes);
    uint64_t dt = now_ns() - t0;
    for (int32_t t = 0; t < b->ntiers; t++) {
        if (!(mask & (1 << t))) continue;
        b->tiers[t].stats.write_ns += dt;
        if (rc != KVP_OK) b->tiers[t].stats.errors++;
    }
    if (rc != KVP_OK) return false;
    b->wkeys[b->wn] = b->chain[page];
    b->wparents[b->wn] = b->pchain[page];
    b->wmask[b->wn++] = (uint8_t)mask;
    return true;
}

/* Write through the pages stored since the last call (their K/V are final). */
static void flush_pending(kvp_cache_t *c) {
    struct kvp__cache_blob *b = c->blob;
    if (b == NULL || b->npending == 0) return;
    int32_t mask = policy_mask(b, KVP_TIER_WRITE_THROUGH);
    for (int32_t i = 0; i < b->npending; i++) {
        int32_t page = b->pending[i];
        if (!(b->flags[page] & F_PENDING)) continue; /* evicted meanwhile */
        b->flags[page] &= (uint8_t)~F_PENDING;
        if ((b->flags[page] & (F_CHAIN | F_PERSISTED)) != F_CHAIN) continue;
        if (buffer_page(c, page, mask)) b->flags[page] |= F_PERSISTED;
    }
    b->npending = 0;
    flush_writes(c);
}

void kvp__cache_blob_before_step(kvp_cache_t *c) { flush_pending(c); }
void kvp__cache_blob_before_release(kvp_cache_t *c) { flush_pending(c); }
void kvp__cache_blob_after(kvp_cache_t *c) { flush_writes(c); }

/* ---- events ------------------------------------------------------------------ */

/* The chain hash a page's parent gives it: the parent's, or the root. */
static bool parent_chain(kvp_cache_t *c, int32_t page, int32_t parent, kvp_hash_t *out) {
    struct kvp__cache_blob *b = c->blob;
    if (parent >= 0) {
        if (!(b->flags[parent] & F_CHAIN)) return false;
        *out = b->chain[parent];
        return true;
    }
    return kvp_blob_chain_root(b->codec, c->pool->pages[page].salt, out) == KVP_OK;
}

static void on_stored(kvp_cache_t *c, const kvp_pool_event_t *e, kvp_cache_event_t *ev) {
    struct kvp__cache_blob *b = c->blob;
    int32_t page = e->page;
    b->flags[page] = 0;
    kvp_hash_t parent;
    if (!parent_chain(c, page, e->parent, &parent)) return;
    const int32_t *tokens = kvp__page_tokens(c->pool, page);
    if (kvp_blob_chain(b->codec, &parent, tokens, c->page_size, &b->chain[page]) != KVP_OK) return;
    b->flags[page] = F_CHAIN;
    b->pchain[page] = parent;
    ev->chain = b->chain[page];
    ev->parent_chain = parent;
    if (b->importing) {
        b->flags[page] |= F_PERSISTED;
        ev->tier = b->importing_tier;
    } else if (policy_mask(b, KVP_TIER_WRITE_THROUGH) != 0) {
        b->flags[page] |= F_PENDING;
        b->pending[b->npending++] = page; /* at most once per page: F_PENDING */
    }
}

static void on_evicted(kvp_cache_t *c, const kvp_pool_event_t *e, kvp_cache_event_t *ev) {
    struct kvp__cache_blob *b = c->blob;
    int32_t page = e->page;
    uint8_t f = b->flags[page];
    b->flags[page] = 0;
    if (f & F_PENDING) { /* leaves the queue: stored again, it would be queued again */
        for (int32_t i = 0; i < b->npending; i++)
            if (b->pending[i] == page) {
                b->pending[i] = b->pending[--b->npending];
                break;
            }
    }
    if (!(f & F_CHAIN)) return;
    ev->chain = b->chain[page];
    ev->parent_chain = b->pchain[page];
    int32_t mask = policy_mask(b, KVP_TIER_WRITE_BACK);
    if ((f & F_PERSISTED) || mask == 0 || b->rolling_back || b->clearing) return;
    if (buffer_page(c, page, mask))
        for (int32_t t = 0; t < b->ntiers; t++)
            if (mask & (1 << t)) {
                ev->tier = t;
                break;
            }
}

static void on_pool_event(void *opaque, const kvp_pool_event_t *e) {
    kvp_cache_t *c = (kvp_cache_t *)opaque;
    struct kvp__cache_blob *b = c->blob;
    kvp_cache_event_t ev;
    memset(&ev, 0, sizeof ev);
    ev.struct_size = sizeof ev;
    ev.kind = e->kind;
    ev.page = e->page;
    ev.parent = e->parent;
    ev.priority = e->priority;
    ev.tier = KVP_TIER_NONE;
    ev.hash = e->hash;
    if (e->kind == KVP_EVENT_PAGE_STORED) {
        ev.num_tokens = c->page_size;
        ev.tokens = kvp__page_tokens(c->pool, e->page);
    }
    if (b->codec != NULL && e->kind == KVP_EVENT_PAGE_STORED) on_stored(c, e, &ev);
    if (b->codec != NULL && e->kind == KVP_EVENT_PAGE_EVICTED) on_evicted(c, e, &ev);
    if (b->clearing && e->kind == KVP_EVENT_PAGE_EVICTED) return; /* CLEARED says it */
    emit(c, &ev);
}

/* ---- setup ------------------------------------------------------------------- */

static int ensure_state(kvp_cache_t *c) {
    if (c->blob != NULL) return KVP_OK;
    struct kvp__cache_blob *b =
        (struct kvp__cache_blob *)kvp__calloc(&c->alloc, 1, sizeof *b, 0);
    if (b == NULL) return kvp__cache_fail(c, KVP_ENOMEM, "out of memory (cache events)");
    b->importing_tier = KVP_TIER_NONE;
    c->blob = b;
    kvp_pool_set_event_callback(c->pool, on_pool_event, c);
    return KVP_OK;
}

int kvp_cache_set_event_callback(kvp_cache_t *c, kvp_cache_event_fn fn, void *opaque) {
    if (c == NULL) return KVP_EINVAL;
    int rc = ensure_state(c);
    if (rc != KVP_OK) return rc;
    c->blob->fn = fn;
    c->blob->opaque = opaque;
    return KVP_OK;
}

static void free_buffers(const kvp_allocator_t *a, struct kvp__cache_blob *b) {
    void *bufs[] = {b->chain, b->pchain, b->flags, b->pending, b->buf, b->wkeys,
                    b->wparents, b->wmask, b->rbuf, b->ops, b->keys};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) kvp__free(a, bufs[i]);
}

int kvp_cache_set_blob(kvp_cache_t *c, const kvp_blob_params_t *params) {
    if (c == NULL) return KVP_EINVAL;
    if (c->blob != NULL && c->blob->codec != NULL)
        return kvp__cache_fail(c, KVP_ESTATE, "set_blob: the cache has an identity already");
    kvp_blob_codec_t *codec = NULL;
    int rc = kvp_blob_codec_create(c->store, params, &codec, c->err, KVP_ERR_SIZE);
    if (rc != KVP_OK) return rc;
    uint64_t blob_bytes = 0;
    kvp_blob_size(codec, 0, &blob_bytes);
    int32_t batch = (int32_t)(BUFFER_BYTES / blob_bytes);
    batch = batch < 1 ? 1 : batch > MAX_BATCH ? MAX_BATCH : batch;
    const kvp_allocator_t *a = &c->alloc;
    size_t pages = (size_t)c->num_pages, nb = (size_t)batch;
    struct kvp__cache_blob fresh;
    memset(&fresh, 0, sizeof fresh);
    fresh.chain = (kvp_hash_t *)kvp__calloc(a, pages, sizeof(kvp_hash_t), 64);
    fresh.pchain = (kvp_hash_t *)kvp__calloc(a, pages, sizeof(kvp_hash_t), 64);
    fresh.flags = (uint8_t *)kvp__calloc(a, pages, 1, 64);
    fresh.pending = (int32_t *)kvp__calloc(a, pages, sizeof(int32_t), 64);
    fresh.buf = (uint8_t *)kvp__calloc(a, nb, (size_t)blob_bytes, 64);
    fresh.rbuf = (uint8_t *)kvp__calloc(a, nb, (size_t)blob_bytes, 64);
    fresh.wkeys = (kvp_hash_t *)kvp__calloc(a, nb, sizeof(kvp_hash_t), 64);
    fresh.wparents = (kvp_hash_t *)kvp__calloc(a, nb, sizeof(kvp_hash_t), 64);
    fresh.wmask = (uint8_t *)kvp__calloc(a, nb, 1, 64);
    fresh.ops = (kvp_page_op_t *)kvp__calloc(a, nb + 1, sizeof(kvp_page_op_t), 64);
    bool ok = fresh.chain && fresh.pchain && fresh.flags && fresh.pending && fresh.buf &&
              fresh.rbuf && fresh.wkeys && fresh.wparents && fresh.wmask && fresh.ops;
    if (ok) ok = ensure_state(c) == KVP_OK;
    if (!ok) {
        free_buffers(a, &fresh);
        kvp_blob_codec_destroy(codec);
        return kvp__cache_fail(c, KVP_ENOMEM, "out of memory (cache blob buffers)");
    }
    struct kvp__cache_blob *b = c->blob;
    fresh.fn = b->fn;
    fresh.opaque = b->opaque;
    fresh.next_seq = b->next_seq;
    fresh.importing_tier = KVP_TIER_NONE;
    fresh.codec = codec;
    fresh.blob_bytes = blob_bytes;
    fresh.batch = batch;
    *b = fresh;
    return KVP_OK;
}

int kvp_cache_blob_codec(const kvp_cache_t *c, kvp_blob_codec_t **codec) {
    if (c == NULL) return KVP_EINVAL;
    if (codec == NULL) return kvp__cache_fail(c, KVP_EINVAL, "codec is NULL");
    if (c->blob == NULL || c->blob->codec == NULL)
        return kvp__cache_fail(c, KVP_ESTATE, "no blob identity: call kvp_cache_set_blob first");
    *codec = c->blob->codec;
    return KVP_OK;
}

static int need_codec(const kvp_cache_t *c, const char *fn) {
    if (c->blob == NULL || c->blob->codec == NULL)
        return kvp__cache_fail(c, KVP_ESTATE, "%s: no blob identity (kvp_cache_set_blob)", fn);
    return KVP_OK;
}

int kvp_cache_add_tier(kvp_cache_t *c, kvp_blob_tier_t *tier, int32_t policy, int32_t *index) {
    if (c == NULL) return KVP_EINVAL;
    int rc = need_codec(c, "add_tier");
    if (rc != KVP_OK) return rc;
    int32_t all = KVP_TIER_READ | KVP_TIER_WRITE_BACK | KVP_TIER_WRITE_THROUGH;
    if (tier == NULL) return kvp__cache_fail(c, KVP_EINVAL, "add_tier: tier is NULL");
    if (policy == 0 || (policy & ~all) != 0)
        return kvp__cache_fail(c, KVP_EINVAL, "add_tier: policy must be a non-empty set of "
                               "KVP_TIER_* flags, got %d", (int)policy);
    struct kvp__cache_blob *b = c->blob;
    for (int32_t t = 0; t < b->ntiers; t++)
        if (b->tiers[t].tier == tier)
            return kvp__cache_fail(c, KVP_EINVAL, "add_tier: this tier is index %d already",
                                   (int)t);
    if (b->ntiers == MAX_TIERS)
        return kvp__cache_fail(c, KVP_ENOSPC, "add_tier: a cache has at most %d tiers",
                               MAX_TIERS);
    tier_slot *s = &b->tiers[b->ntiers];
    memset(s, 0, sizeof *s);
    s->tier = tier;
    s->policy = policy;
    s->stats.struct_size = sizeof s->stats;
    if (index) *index = b->ntiers;
    b->ntiers++;
    return KVP_OK;
}

int kvp_cache_tier_stats(const kvp_cache_t *c, int32_t index, kvp_cache_tier_stats_t *stats) {
    if (c == NULL) return KVP_EINVAL;
    int rc = kvp__check_struct(stats, sizeof *stats, "stats", c->err, KVP_ERR_SIZE);
    if (rc != KVP_OK) return rc;
    int32_t n = c->blob ? c->blob->ntiers : 0;
    if (index < 0 || index >= n)
        return kvp__cache_fail(c, KVP_EINVAL, "tier_stats: index %d is not a tier (%d added)",
                               (int)index, (int)n);
    kvp__copy_out(stats, &c->blob->tiers[index].stats, sizeof c->blob->tiers[index].stats);
    return KVP_OK;
}

int kvp_cache_flush(kvp_cache_t *c) {
    if (c == NULL) return KVP_EINVAL;
    flush_pending(c);
    flush_writes(c);
    return KVP_OK;
}

int kvp_cache_clear_prefix(kvp_cache_t *c) {
    if (c == NULL) return KVP_EINVAL;
    if (c->pool->live_seqs > 0)
        return kvp__cache_fail(c, KVP_ESTATE, "clear_prefix: %lld sequences are live (their "
                               "pages are cached too); release them first",
                               (long long)c->pool->live_seqs);
    int rc = ensure_state(c);
    if (rc != KVP_OK) return rc;
    struct kvp__cache_blob *b = c->blob;
    b->clearing = true;
    kvp_pool_evict(c->pool, INT32_MAX, NULL);
    b->clearing = false;
    emit_tier(c, KVP_EVENT_CLEARED, KVP_TIER_NONE, NULL, NULL);
    return KVP_OK;
}

void kvp__cache_blob_destroy(kvp_cache_t *c) {
    struct kvp__cache_blob *b = c->blob;
    if (b == NULL) return;
    flush_pending(c);
    flush_writes(c);
    kvp_pool_set_event_callback(c->pool, NULL, NULL);
    free_buffers(&c->alloc, b);
    kvp_blob_codec_destroy(b->codec);
    kvp__free(&c->alloc, b);
    c->blob = NULL;
}

/* ---- importing pages --------------------------------------------------------- */

/* Chain hashes of the pages of `n` tokens of a sequence of salt `salt`. */
static int prompt_hashes(kvp_cache_t *c, uint64_t salt, const int32_t *tokens, int64_t n) {
    struct kvp__cache_blob *b = c->blob;
    int64_t pages = (n + c->page_size - 1) / c->page_size;
    if (pages > b->keys_cap) {
        kvp_hash_t *k = (kvp_hash_t *)kvp__calloc(&c->alloc, (size_t)pages, sizeof *k, 64);
        if (k == NULL) return kvp__cache_fail(c, KVP_ENOMEM, "out of memory (chain hashes)");
        kvp__free(&c->alloc, b->keys);
        b->keys = k;
        b->keys_cap = pages;
    }
    kvp_hash_t root;
    int rc = kvp_blob_chain_root(b->codec, salt, &root);
    if (rc == KVP_OK) rc = kvp_blob_chain(b->codec, &root, tokens, n, b->keys);
    if (rc != KVP_OK)
        return kvp__cache_fail(c, rc, "chain hashes: %s", kvp_blob_codec_last_error(b->codec));
    return KVP_OK;
}

/* Undo an import's appends: back to `len` tokens, and the pages it stored
 * leave the prefix cache (their bytes are not what their names say). */
static void roll_back(kvp_cache_t *c, int32_t seq, int64_t len, const int32_t *pages,
                      int32_t count) {
    struct kvp__cache_blob *b = c->blob;
    kvp_page_op_t ops[4];
    int32_t n = 0;
    b->rolling_back = true;
    kvp_table_truncate(c->table, seq, len, ops, 4, &n);
    for (int32_t i = count - 1; i >= 0; i--) kvp__pool_forget(c->pool, pages[i]);
    b->rolling_back = false;
}

/* Append `count` pages of tokens (from page `k`, plus `tail` tokens of a
 * partly filled last page) to `seq` and write the prechecked blobs into
 * them, checking each one's integrity on the way (kvp__blob_write). The
 * seals an append asks for are not run: the payloads are the sealed pages.
 * `*written` receives the pages whose blobs passed; when one fails, the
 * sequence is cut back to the pages before it, those after leave the
 * prefix cache, and the status (KVP_EBADBLOB with `*reason`, or a store
 * error) is returned. */
static int write_pages(kvp_cache_t *c, int32_t seq, const int32_t *tokens, int64_t k,
                       int32_t count, int32_t tail, const uint8_t *const *blobs,
                       const uint64_t *lens, int32_t tier, int32_t *written, int32_t *reason) {
    struct kvp__cache_blob *b = c->blob;
    int64_t P = c->page_size, n = (int64_t)count * P + tail;
    int32_t nops = 0;
    *written = 0;
    b->importing = tier != KVP_TIER_NONE;
    b->importing_tier = tier;
    int rc = kvp_table_append(c->table, seq, n, tokens + k * P, NULL, b->ops, b->batch + 1,
                              &nops);
    b->importing = false;
    b->importing_tier = KVP_TIER_NONE;
    if (rc != KVP_OK)
        return kvp__cache_fail(c, rc, "import: %s", kvp_table_last_error(c->table));
    const kvp__seq *s = kvp__table_find(c->table, "import", seq);
    int32_t pages[MAX_BATCH + 1];
    int32_t total = count + (tail > 0), i = 0;
    for (int32_t j = 0; j < total; j++)
        pages[j] = (int64_t)(k + j) < s->npages ? s->pages[k + j] : s->staging;
    for (; i < total && rc == KVP_OK; i++)
        rc = kvp__blob_write(b->codec, pages[i], blobs[i], lens[i], reason);
    if (rc == KVP_OK) {
        *written = count;
        return KVP_OK;
    }
    int32_t bad = i - 1; /* the page whose write failed */
    char why[KVP_ERR_SIZE];
    snprintf(why, sizeof why, "%s", kvp_blob_codec_last_error(b->codec));
    /* full pages from the bad one on were stored under their names: they go;
     * a partly filled last page is never stored */
    roll_back(c, seq, (k + bad) * P, pages + bad, bad < count ? count - bad : 0);
    *written = bad < count ? bad : count;
    return kvp__cache_fail(c, rc, "blob %lld: %s", (long long)(k + bad), why);
}

/* One batch from one tier: fetch, precheck in order, import the run that
 * passes. Returns pages imported (fewer than `want` stops the walk on this
 * tier); *status is an error of the store, never of a blob. */
static int32_t tier_batch(kvp_cache_t *c, int32_t t, int32_t seq, const int32_t *tokens,
                          int64_t k, int32_t want, int *status) {
    struct kvp__cache_blob *b = c->blob;
    tier_slot *s = &b->tiers[t];
    void *bufs[MAX_BATCH];
    uint64_t caps[MAX_BATCH], sizes[MAX_BATCH];
    for (int32_t i = 0; i < want; i++) {
        bufs[i] = b->rbuf + (size_t)i * b->blob_bytes;
        caps[i] = b->blob_bytes;
    }
    uint64_t t0 = now_ns();
    s->stats.lookups += (uint64_t)want;
    if (kvp_blob_tier_get(s->tier, want, b->keys + k, bufs, caps, sizes) != KVP_OK)
        s->stats.errors++;
    int32_t ok = 0, reason = KVP_BLOB_OK;
    while (ok < want && sizes[ok] > 0 &&
           kvp__blob_precheck(b->codec, (const uint8_t *)bufs[ok], sizes[ok], &b->keys[k + ok],
                              c->page_size, 0, &reason) == KVP_OK)
        ok++;
    int32_t bad = ok < want && sizes[ok] > 0 ? ok : -1; /* rejected by the precheck */
    int32_t written = 0;
    if (ok > 0) {
        int rc = write_pages(c, seq, tokens, k, ok, 0, (const uint8_t *const *)bufs, sizes, t,
                             &written, &reason);
        if (rc != KVP_OK && rc != KVP_EBADBLOB) *status = rc;
        if (rc == KVP_EBADBLOB) bad = written;
    }
    if (bad >= 0) {
        s->stats.rejected++;
        s->stats.rejects[reason]++;
        /* never fetched again, and a good blob may take its place */
        if (kvp_blob_tier_remove(s->tier, 1, &b->keys[k + bad]) == KVP_OK)
            emit_tier(c, KVP_EVENT_TIER_REMOVED, t, &b->keys[k + bad], NULL);
    }
    for (int32_t i = 0; i < written; i++) s->stats.bytes_in += sizes[i];
    s->stats.hit_pages += (uint64_t)written;
    s->stats.miss_pages += (uint64_t)(want - written - (bad >= 0));
    s->stats.read_ns += now_ns() - t0;
    return written;
}

int kvp__cache_blob_attach(kvp_cache_t *c, int32_t seq, const int32_t *tokens, int64_t n,
                           int64_t *matched) {
    struct kvp__cache_blob *b = c->blob;
    if (b == NULL || b->codec == NULL || policy_mask(b, KVP_TIER_READ) == 0) return KVP_OK;
    int64_t P = c->page_size, full = n / P, k = *matched / P;
    if (k >= full) return KVP_OK;
    kvp_seq_info_t info = {.struct_size = sizeof info};
    int rc = kvp_table_seq_info(c->table, seq, &info);
    char saved[KVP_ERR_SIZE]; /* a call that succeeds keeps the last error text */
    memcpy(saved, c->err, sizeof saved);
    if (rc == KVP_OK) rc = prompt_hashes(c, info.salt, tokens, full * P);
    if (rc != KVP_OK) { /* no lookup: a miss in every tier, the pool's match stands */
        memcpy(c->err, saved, sizeof saved);
        for (int32_t t = 0; t < b->ntiers; t++)
            if (b->tiers[t].policy & KVP_TIER_READ) b->tiers[t].stats.errors++;
        return KVP_OK;
    }
    for (int32_t t = 0; t < b->ntiers && k < full && rc == KVP_OK; t++) {
        if (!(b->tiers[t].policy & KVP_TIER_READ)) continue;
        for (;;) {
            int64_t avail = kvp__pool_available(c->pool);
            int64_t want = full - k < b->batch ? full - k : b->batch;
            if (want > avail) want = avail;
            if (want <= 0) break;
            int32_t got = tier_batch(c, t, seq, tokens, k, (int32_t)want, &rc);
            k += got;
            if (got < want || rc != KVP_OK) break;
        }
    }
    *matched = k * P;
    return rc;
}

/* ---- sequence export / import ---------------------------------------------- */

static int seq_resident(kvp_cache_t *c, const char *fn, int32_t seq, kvp_seq_info_t *info) {
    int rc = need_codec(c, fn);
    if (rc != KVP_OK) return rc;
    info->struct_size = sizeof *info;
    rc = kvp_table_seq_info(c->table, seq, info);
    if (rc != KVP_OK) return kvp__cache_fail(c, rc, "%s: %s", fn, kvp_table_last_error(c->table));
    if (info->swapped)
        return kvp__cache_fail(c, KVP_ESTATE, "%s: sequence %d is swapped out", fn, (int)seq);
    return KVP_OK;
}

/* Blob size of page `i` of a sequence of `len` tokens. */
static uint64_t page_blob_bytes(const kvp_cache_t *c, int64_t len, int64_t i) {
    const kvp_layout_t *l = &c->store->layout;
    bool partial = (i + 1) * c->page_size > len;
    bool staging = partial && l->needs_staging;
    return KVP_BLOB_HEADER_BYTES + (staging ? l->staging_page_bytes : l->page_bytes);
}

int kvp_cache_seq_export_size(kvp_cache_t *c, int32_t seq, int32_t *blobs, uint64_t *bytes) {
    if (c == NULL) return KVP_EINVAL;
    if (blobs == NULL || bytes == NULL)
        return kvp__cache_fail(c, KVP_EINVAL, "seq_export_size: blobs or bytes is NULL");
    kvp_seq_info_t info;
    int rc = seq_resident(c, "seq_export_size", seq, &info);
    if (rc != KVP_OK) return rc;
    int64_t pages = (info.length + c->page_size - 1) / c->page_size;
    uint64_t total = 0;
    for (int64_t i = 0; i < pages; i++) total += page_blob_bytes(c, info.length, i);
    *blobs = (int32_t)pages;
    *bytes = total;
    return KVP_OK;
}

int kvp_cache_seq_export(kvp_cache_t *c, int32_t seq, const int32_t *tokens, int64_t n,
                         void *dst, uint64_t dst_bytes) {
    if (c == NULL) return KVP_EINVAL;
    int32_t blobs = 0;
    uint64_t need = 0;
    int rc = kvp_cache_seq_export_size(c, seq, &blobs, &need);
    if (rc != KVP_OK) return rc;
    kvp_seq_info_t info;
    seq_resident(c, "seq_export", seq, &info);
    if (n != info.length || n < 1 || tokens == NULL || dst == NULL)
        return kvp__cache_fail(c, KVP_EINVAL, "seq_export: %s", n != info.length || n < 1
                               ? "n must be the sequence's length (>= 1)" : "tokens or dst is NULL");
    if (dst_bytes < need)
        return kvp__cache_fail(c, KVP_EINVAL, "seq_export: dst has %llu bytes, %llu needed",
                               (unsigned long long)dst_bytes, (unsigned long long)need);
    rc = prompt_hashes(c, info.salt, tokens, n);
    if (rc != KVP_OK) return rc;
    const kvp__seq *s = kvp__table_find(c->table, "seq_export", seq);
    uint8_t *out = (uint8_t *)dst;
    for (int32_t i = 0; i < blobs; i++) {
        int32_t page = i < s->npages ? s->pages[i] : s->staging;
        int64_t in_page = n - (int64_t)i * c->page_size;
        int32_t tokens_in = (int32_t)(in_page < c->page_size ? in_page : c->page_size);
        uint64_t size = page_blob_bytes(c, n, i);
        rc = kvp_blob_export(c->blob->codec, page, tokens_in, &c->blob->keys[i], out, size);
        if (rc != KVP_OK)
            return kvp__cache_fail(c, rc, "seq_export: page %d: %s", (int)i,
                                   kvp_blob_codec_last_error(c->blob->codec));
        out += size;
    }
    return KVP_OK;
}

/* Split `src` into blobs by their headers' lengths (checked later). */
static int split_blobs(kvp_cache_t *c, const uint8_t *src, uint64_t bytes, int64_t count,
                       const uint8_t **at, uint64_t *len) {
    uint64_t off = 0;
    for (int64_t i = 0; i < count; i++) {
        if (bytes - off < KVP_BLOB_HEADER_BYTES)
            return kvp__cache_fail(c, KVP_EBADBLOB, "seq_import: blob %lld is truncated "
                                   "(%lld blobs expected)", (long long)i, (long long)count);
        uint64_t payload = 0;
        for (int j = 7; j >= 0; j--) payload = payload << 8 | src[off + 80 + (uint64_t)j];
        if (payload > bytes - off - KVP_BLOB_HEADER_BYTES)
            return kvp__cache_fail(c, KVP_EBADBLOB, "seq_import: blob %lld is truncated",
                                   (long long)i);
        at[i] = src + off;
        len[i] = KVP_BLOB_HEADER_BYTES + payload;
        off += len[i];
    }
    if (off != bytes)
        return kvp__cache_fail(c, KVP_EBADBLOB, "seq_import: %llu bytes after the %lld blobs "
                               "the tokens name", (unsigned long long)(bytes - off),
                               (long long)count);
    return KVP_OK;
}

static int check_import_args(kvp_cache_t *c, int32_t seq, const int32_t *tokens, int64_t n,
                             const void *src, kvp_seq_info_t *info) {
    int rc = seq_resident(c, "seq_import", seq, info);
    if (rc != KVP_OK) return rc;
    if (info->length != 0)
        return kvp__cache_fail(c, KVP_ESTATE, "seq_import: sequence %d is not empty", (int)seq);
    if (n < 1 || n > INT32_MAX || tokens == NULL || src == NULL)
        return kvp__cache_fail(c, KVP_EINVAL, "seq_import: %s", n < 1 || n > INT32_MAX
                               ? "n must be 1..2^31-1" : "tokens or src is NULL");
    return KVP_OK;
}

int kvp_cache_seq_import(kvp_cache_t *c, int32_t seq, const int32_t *tokens, int64_t n,
                         const void *src, uint64_t bytes, int32_t *reason) {
    if (c == NULL) return KVP_EINVAL;
    if (reason) *reason = KVP_BLOB_OK;
    kvp_seq_info_t info;
    int rc = check_import_args(c, seq, tokens, n, src, &info);
    if (rc != KVP_OK) return rc;
    int64_t P = c->page_size, count = (n + P - 1) / P, full = n / P;
    int32_t tail = (int32_t)(n - full * P);
    struct kvp__cache_blob *b = c->blob;
    const uint8_t **at = (const uint8_t **)kvp__calloc(&c->alloc, (size_t)count, sizeof *at, 0);
    uint64_t *len = (uint64_t *)kvp__calloc(&c->alloc, (size_t)count, sizeof *len, 0);
    if (at == NULL || len == NULL) rc = kvp__cache_fail(c, KVP_ENOMEM, "out of memory (import)");
    if (rc == KVP_OK) {
        rc = split_blobs(c, (const uint8_t *)src, bytes, count, at, len);
        if (rc != KVP_OK && reason) *reason = KVP_BLOB_TRUNCATED;
    }
    if (rc == KVP_OK) rc = prompt_hashes(c, info.salt, tokens, n);
    /* pages this cache holds already are attached, not copied */
    int64_t matched = 0;
    if (rc == KVP_OK) rc = kvp_table_attach_prefix(c->table, seq, tokens, full * P, &matched);
    int64_t k0 = matched / P;
    /* every other blob is checked before anything is written (its
     * integrity while it is written: a failure then undoes the import) */
    for (int64_t i = k0; i < count && rc == KVP_OK; i++) {
        bool partial = i == full;
        int32_t r = KVP_BLOB_OK;
        rc = kvp__blob_precheck(b->codec, at[i], len[i], &b->keys[i],
                                partial ? tail : (int32_t)P, partial && c->num_staging > 0, &r);
        if (rc != KVP_OK) {
            if (reason) *reason = r;
            rc = kvp__cache_fail(c, rc, "seq_import: blob %lld: %s", (long long)i,
                                 kvp_blob_codec_last_error(b->codec));
        }
    }
    int64_t need = (full - k0) + (tail > 0 && c->num_staging == 0);
    if (rc == KVP_OK && need > kvp__pool_available(c->pool))
        rc = kvp__cache_fail(c, KVP_ENOSPC, "seq_import: %lld pages needed, %lld available",
                             (long long)need, (long long)kvp__pool_available(c->pool));
    for (int64_t k = k0; k < count && rc == KVP_OK;) {
        int64_t left = full - k;
        int32_t m = (int32_t)(left < b->batch ? left : b->batch);
        int32_t t = k + m == full ? tail : 0;
        int32_t written = 0, r = KVP_BLOB_OK;
        rc = write_pages(c, seq, tokens, k, m, t, at + k, len + k, KVP_TIER_NONE, &written, &r);
        if (rc == KVP_EBADBLOB && reason) *reason = r;
        if (rc != KVP_OK) {
            char why[KVP_ERR_SIZE];
            memcpy(why, c->err, sizeof why);
            rc = kvp__cache_fail(c, rc, "seq_import: %s", why);
        }
        k += m + (t > 0);
    }
    if (rc != KVP_OK) { /* all or nothing: pages written so far stay cached */
        kvp_page_op_t ops[4];
        int32_t n_ops = 0;
        kvp_table_truncate(c->table, seq, 0, ops, 4, &n_ops);
    }
    kvp__free(&c->alloc, at);
    kvp__free(&c->alloc, len);
    kvp__cache_blob_after(c);
    return rc;
}
