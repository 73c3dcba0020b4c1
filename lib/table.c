/*
 * Layer `table`: sequences mapped onto pool pages; reservation, append with
 * copy-on-write and sealing, truncation, fork, prefix reuse, batch export.
 *
 * Every mutating function works in two phases: first it checks everything
 * that can fail (arguments, pages, host memory for the page list), then it
 * changes state with operations that cannot fail. So a failed call leaves
 * the table and its pool exactly as they were.
 *
 * Reservations are counts, not page ids: a sequence's `promised` pages are
 * subtracted from what other allocations may take (pool->reserved), and its
 * appends take real pages only when rows land in them. That keeps the page
 * ids deterministic and lets a reservation be backed by cached pages, which
 * stay reusable until the moment they are needed.
 */
#include "paging.h"

#include <string.h>

/* The table's structs are in paging.h: the host tier (tier.c) moves a
 * sequence's pages out and back. A swapped-out sequence keeps its slot, id,
 * length and page list; the entries of pages on the host are -1. */
typedef kvp__seq seq_t;

#define MAX_LEN ((int64_t)INT32_MAX)

int kvp__table_fail(kvp_table_t *t, int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    kvp__verrf(t->err, sizeof t->err, status, fmt, ap);
    va_end(ap);
    return status;
}
#define fail kvp__table_fail

const char *kvp_table_last_error(const kvp_table_t *table) {
    return table ? table->err : KVP__NULL_HANDLE;
}

/* ---- small helpers --------------------------------------------------------- */

static inline int64_t page_sz(const kvp_table_t *t) { return t->pool->page_size; }

/* Pool pages a sequence of `len` tokens holds. */
static inline int64_t pages_for(const kvp_table_t *t, int64_t len) {
    int64_t P = page_sz(t);
    return t->staged ? len / P : (len + P - 1) / P;
}

static inline int32_t last_page(const seq_t *s) { return s->pages[s->npages - 1]; }

/* Without staging, the partly filled last page may be written in place only
 * if this sequence alone holds it and it is not in the prefix cache. */
static bool must_copy_on_write(const kvp_table_t *t, const seq_t *s) {
    if (t->staged || s->len % page_sz(t) == 0) return false;
    const kvp__page *pg = &t->pool->pages[last_page(s)];
    return pg->ref > 1 || pg->stored;
}

/* Pool pages that growing `s` to `target` tokens takes from the pool. */
static int64_t pages_needed(const kvp_table_t *t, const seq_t *s, int64_t target) {
    if (target <= s->len) return 0;
    return pages_for(t, target) - pages_for(t, s->len) + (must_copy_on_write(t, s) ? 1 : 0);
}

static void set_promise(kvp_table_t *t, seq_t *s, int64_t pages) {
    t->pool->reserved += pages - s->promised;
    s->promised = (int32_t)pages;
}

void kvp__table_set_promise(kvp_table_t *t, kvp__seq *s, int64_t pages) {
    set_promise(t, s, pages);
}

/* After a change of length, bring the promise back to what the remaining
 * reservation needs. It only shrinks, except when the engine retained the
 * partly filled page itself (see kvp_pool_retain): then it grows by what is
 * available. */
static void refresh_promise(kvp_table_t *t, seq_t *s) {
    int64_t need = pages_needed(t, s, s->reserve_to);
    if (need > s->promised) {
        int64_t room = kvp__pool_available(t->pool);
        int64_t grow = need - s->promised;
        need = s->promised + (grow < room ? grow : (room > 0 ? room : 0));
    }
    set_promise(t, s, need);
}

/* Grow the page list to hold `n` pages (the only host allocation of the
 * table after creation; capacity is kept when the slot is reused). */
static int ensure_capacity(kvp_table_t *t, seq_t *s, int64_t n) {
    if (n <= s->cap) return KVP_OK;
    if (n > INT32_MAX) return fail(t, KVP_EINVAL, "a sequence cannot hold %lld pages", (long long)n);
    int64_t cap = s->cap < 4 ? 4 : (int64_t)s->cap * 2;
    if (cap < n) cap = n;
    if (cap > INT32_MAX) cap = INT32_MAX;
    int32_t *grown = kvp__malloc(&t->allocator, (size_t)cap * sizeof *grown, 0);
    if (grown == NULL)
        return fail(t, KVP_ENOMEM, "cannot grow a page list to %lld pages", (long long)cap);
    if (s->npages > 0) memcpy(grown, s->pages, (size_t)s->npages * sizeof *grown);
    kvp__free(&t->allocator, s->pages);
    s->pages = grown;
    s->cap = (int32_t)cap;
    return KVP_OK;
}

/* ---- ids --------------------------------------------------------------------- */

static int32_t make_id(const kvp_table_t *t, int32_t slot) {
    return (int32_t)((t->seqs[slot].gen << t->slot_bits) | (uint32_t)slot);
}

static seq_t *find_seq(kvp_table_t *t, const char *fn, int32_t id) {
    uint32_t slot = (uint32_t)id & ((1u << t->slot_bits) - 1);
    uint32_t gen = (uint32_t)id >> t->slot_bits;
    if (id >= 0 && slot < (uint32_t)t->max_seqs && t->seqs[slot].live && t->seqs[slot].gen == gen)
        return &t->seqs[slot];
    fail(t, KVP_ENOENT, "%s: sequence %d is not live (never created, or released)", fn, (int)id);
    return NULL;
}

kvp__seq *kvp__table_find(kvp_table_t *t, const char *fn, int32_t id) {
    return find_seq(t, fn, id);
}

static int swapped_out(kvp_table_t *t, const char *fn, int32_t id) {
    return fail(t, KVP_ESTATE,
                "%s: sequence %d is swapped out to the host tier (swap it in, or "
                "drop it, first)",
                fn, (int)id);
}

/* Look up a live sequence or return its error from the calling function. */
#define FIND_SEQ(s, fn, id)                              \
    seq_t *s = find_seq(t, fn, id);                      \
    if (s == NULL) return KVP_ENOENT

/* The same, for calls that need its pages on the device. */
#define FIND_RESIDENT(s, fn, id)                         \
    FIND_SEQ(s, fn, id);                                 \
    if (s->swapped) return swapped_out(t, fn, id)

/* ---- creation -------------------------------------------------------------- */

static int32_t bits_for(int32_t n) {
    int32_t b = 1;
    while ((1 << b) < n) b++;
    return b;
}

int kvp_table_create(kvp_pool_t *pool, int32_t max_seqs, kvp_table_t **table, char *err,
                     size_t err_size) {
    if (pool == NULL || table == NULL)
        return kvp__errf(err, err_size, KVP_EINVAL, "%s is NULL",
                         pool == NULL ? "pool" : "table (output)");
    if (max_seqs < 0 || max_seqs > (1 << 24))
        return kvp__errf(err, err_size, KVP_EINVAL, "max_seqs must be 0..2^24, got %d",
                         (int)max_seqs);
    if (max_seqs == 0) max_seqs = pool->num_staging > 0 ? pool->num_staging : 4096;
    /* A pool and its tables are one object: they share its allocator. */
    const kvp_allocator_t *hooks = &pool->allocator;
    kvp_table_t *t = kvp__malloc(hooks, sizeof *t, 64);
    seq_t *seqs = kvp__calloc(hooks, (size_t)max_seqs, sizeof *seqs, 64);
    if (t == NULL || seqs == NULL) {
        kvp__free(hooks, t);
        kvp__free(hooks, seqs);
        return kvp__errf(err, err_size, KVP_ENOMEM, "cannot allocate a table of %d sequences",
                         (int)max_seqs);
    }
    memset(t, 0, sizeof *t);
    t->pool = pool;
    t->allocator = *hooks;
    t->seqs = seqs;
    t->max_seqs = max_seqs;
    t->slot_bits = bits_for(max_seqs);
    t->gen_mask = (1u << (31 - t->slot_bits)) - 1;
    t->staged = pool->num_staging > 0;
    for (int32_t i = 0; i < max_seqs; i++) {
        seqs[i].next_free = i + 1 < max_seqs ? i + 1 : -1;
        seqs[i].staging = -1;
    }
    t->free_head = 0;
    *table = t;
    return KVP_OK;
}

static void release_seq(kvp_table_t *t, seq_t *s);

void kvp_table_destroy(kvp_table_t *table) {
    if (table == NULL) return;
    for (int32_t i = 0; i < table->max_seqs; i++) {
        if (table->seqs[i].live) release_seq(table, &table->seqs[i]);
        kvp__free(&table->allocator, table->seqs[i].pages);
    }
    kvp_allocator_t hooks = table->allocator;
    kvp__free(&hooks, table->seqs);
    kvp__free(&hooks, table);
}

/* ---- sequences ------------------------------------------------------------ */

int kvp_table_seq_create(kvp_table_t *t, int32_t priority, uint64_t salt, int32_t *seq) {
    if (t == NULL) return KVP_EINVAL;
    if (seq == NULL) return fail(t, KVP_EINVAL, "kvp_table_seq_create: seq (output) is NULL");
    if (t->free_head < 0)
        return fail(t, KVP_ENOSPC, "kvp_table_seq_create: all %d sequence slots are live",
                    (int)t->max_seqs);
    if (t->staged && t->pool->staging_free_count == 0)
        return fail(t, KVP_ENOSPC,
                    "kvp_table_seq_create: all %d staging pages are held (one per live "
                    "sequence)",
                    (int)t->pool->num_staging);
    int32_t slot = t->free_head;
    seq_t *s = &t->seqs[slot];
    t->free_head = s->next_free;
    s->live = true;
    s->npages = 0;
    s->len = s->known = s->reserve_to = 0;
    s->promised = 0;
    s->priority = priority;
    s->salt = salt;
    s->staging = t->staged ? kvp__staging_take(t->pool) : -1;
    t->live++;
    t->pool->live_seqs++;
    *seq = make_id(t, slot);
    return KVP_OK;
}

/* Drop pool pages [from, npages) of `s`, last first (a swapped-out
 * sequence's entries of pages on the host are -1: nothing to drop). */
static void drop_pages_from(kvp_table_t *t, seq_t *s, int32_t from) {
    while (s->npages > from) {
        int32_t page = s->pages[--s->npages];
        if (page >= 0) kvp__pool_drop(t->pool, page);
    }
}

static void release_seq(kvp_table_t *t, seq_t *s) {
    drop_pages_from(t, s, 0);
    if (s->staging >= 0) kvp__staging_drop(t->pool, s->staging);
    s->staging = -1;
    set_promise(t, s, 0);
    if (!s->swapped) t->pool->live_tokens -= s->len; /* a swapped one's were taken off */
    t->pool->live_seqs--;
    t->live--;
    s->len = s->known = s->reserve_to = 0;
    s->live = false;
    s->swapped = false;
    s->gen = (s->gen + 1) & t->gen_mask; /* the old id is now stale */
    int32_t slot = (int32_t)(s - t->seqs);
    s->next_free = t->free_head;
    t->free_head = slot;
}

void kvp__table_release(kvp_table_t *t, kvp__seq *s) { release_seq(t, s); }

int kvp_table_seq_release(kvp_table_t *t, int32_t seq) {
    if (t == NULL) return KVP_EINVAL;
    FIND_RESIDENT(s, "kvp_table_seq_release", seq);
    release_seq(t, s);
    return KVP_OK;
}

/* ---- reserve ------------------------------------------------------------------ */

static int check_growth(kvp_table_t *t, const char *fn, const seq_t *s, int64_t n) {
    if (n < 0) return fail(t, KVP_EINVAL, "%s: n must be >= 0, got %lld", fn, (long long)n);
    if (n > MAX_LEN - s->len)
        return fail(t, KVP_EINVAL,
                    "%s: %lld + %lld tokens exceed the longest sequence, 2^31-1 tokens", fn,
                    (long long)s->len, (long long)n);
    return KVP_OK;
}

int kvp_table_reserve(kvp_table_t *t, int32_t seq, int64_t n) {
    if (t == NULL) return KVP_EINVAL;
    FIND_RESIDENT(s, "kvp_table_reserve", seq);
    int rc = check_growth(t, "kvp_table_reserve", s, n);
    if (rc != KVP_OK) return rc;
    int64_t target = s->len + n;
    int64_t need = pages_needed(t, s, target);
    int64_t more = need - s->promised;
    if (more > kvp__pool_available(t->pool))
        return fail(t, KVP_ENOSPC,
                    "kvp_table_reserve: %lld tokens need %lld more pages, %lld available",
                    (long long)n, (long long)more, (long long)kvp__pool_available(t->pool));
    rc = ensure_capacity(t, s, pages_for(t, target)); /* a copy replaces, adds no entry */
    if (rc != KVP_OK) return rc;
    s->reserve_to = target;
    set_promise(t, s, need);
    return KVP_OK;
}

/* ---- append ------------------------------------------------------------------- */

/* Store page `k` of `s` in the prefix cache if its chain is known: every
 * token up to its end has a known id, its previous page is stored (the
 * chain's name is the parent page), and the engine holds no reference of
 * its own to it. */
static void maybe_store(kvp_table_t *t, const seq_t *s, int32_t k, int64_t known) {
    kvp_pool_t *p = t->pool;
    if (!p->prefix_cache || ((int64_t)k + 1) * p->page_size > known) return;
    int32_t parent = k > 0 ? s->pages[k - 1] : -1;
    if (parent >= 0 && !p->pages[parent].stored) return;
    int32_t page = s->pages[k];
    if (p->pages[page].ext > 0) return;
    kvp__prefix_store(p, page, parent, s->salt);
}

void kvp__table_maybe_store(kvp_table_t *t, const kvp__seq *s, int32_t k) {
    maybe_store(t, s, k, s->known);
}

static void copy_tokens(kvp_pool_t *p, int32_t dst, int64_t dst_off, const int32_t *src,
                        int64_t n) {
    if (p->tokens == NULL || src == NULL || n <= 0) return;
    memcpy(kvp__page_tokens(p, dst) + dst_off, src, (size_t)n * sizeof *src);
}

static void fill_slots(int64_t *slots, int64_t row, int32_t page, int64_t P, int64_t off,
                       int64_t m) {
    if (slots == NULL) return;
    int64_t base = (int64_t)page * P + off;
    for (int64_t j = 0; j < m; j++) slots[row + j] = base + j;
}

static kvp_page_op_t make_op(int32_t kind, int32_t src, int32_t dst, int64_t count, int64_t row) {
    kvp_page_op_t op;
    op.kind = kind;
    op.src = src;
    op.dst = dst;
    op.count = (int32_t)count;
    op.row = (int32_t)row;
    return op;
}

/* Layouts without staging: copy a shared partial page, then fill pages. */
static int32_t append_paged(kvp_table_t *t, seq_t *s, int64_t n, const int32_t *tokens,
                            int64_t known, int64_t *slots, kvp_page_op_t *ops) {
    kvp_pool_t *p = t->pool;
    int64_t P = page_sz(t), pos = s->len, row = 0;
    int32_t nops = 0;
    if (must_copy_on_write(t, s)) {
        int32_t old = last_page(s), fresh = kvp__pool_take(p, s->priority);
        int64_t off = pos % P;
        copy_tokens(p, fresh, 0, kvp__page_tokens(p, old), off);
        ops[nops++] = make_op(KVP_OP_COPY, old, fresh, off, -1);
        s->pages[s->npages - 1] = fresh;
        kvp__pool_drop(p, old);
    }
    while (row < n) {
        int64_t off = pos % P, m = P - off < n - row ? P - off : n - row;
        if (off == 0) s->pages[s->npages++] = kvp__pool_take(p, s->priority);
        int32_t page = last_page(s);
        fill_slots(slots, row, page, P, off, m);
        copy_tokens(p, page, off, tokens ? tokens + row : NULL, m);
        row += m;
        pos += m;
        if (pos % P == 0) maybe_store(t, s, s->npages - 1, known);
    }
    return nops;
}

/* Layouts with staging: rows completing a page go straight into a new pool
 * page, sealed together with what the staging page held; the rest go to the
 * staging page. */
static int32_t append_staged(kvp_table_t *t, seq_t *s, int64_t n, const int32_t *tokens,
                             int64_t known, int64_t *slots, kvp_page_op_t *ops) {
    kvp_pool_t *p = t->pool;
    int64_t P = page_sz(t), pos = s->len, row = 0;
    int32_t nops = 0;
    while (row < n) {
        int64_t fill = pos % P, m = P - fill < n - row ? P - fill : n - row;
        const int32_t *tok = tokens ? tokens + row : NULL;
        if (fill + m == P) {
            int32_t dst = kvp__pool_take(p, s->priority);
            ops[nops++] = make_op(KVP_OP_SEAL, fill > 0 ? s->staging : -1, dst, fill, row);
            fill_slots(slots, row, dst, P, fill, m);
            copy_tokens(p, dst, 0, kvp__page_tokens(p, s->staging), fill);
            copy_tokens(p, dst, fill, tok, m);
            s->pages[s->npages++] = dst;
            maybe_store(t, s, s->npages - 1, known);
        } else {
            fill_slots(slots, row, s->staging, P, fill, m);
            copy_tokens(p, s->staging, fill, tok, m);
        }
        row += m;
        pos += m;
    }
    return nops;
}

static int64_t append_ops_needed(const kvp_table_t *t, const seq_t *s, int64_t n) {
    if (n == 0) return 0;
    if (t->staged) return (s->len + n) / page_sz(t) - s->len / page_sz(t);
    return must_copy_on_write(t, s) ? 1 : 0;
}

static int check_ops_room(kvp_table_t *t, const char *fn, int64_t need,
                          const kvp_page_op_t *ops, int32_t capacity, const int32_t *num_ops) {
    if (num_ops == NULL) return fail(t, KVP_EINVAL, "%s: num_ops is NULL", fn);
    if (capacity < 0) return fail(t, KVP_EINVAL, "%s: ops_capacity is negative", fn);
    if (need > capacity || (need > 0 && ops == NULL))
        return fail(t, KVP_EINVAL, "%s: needs room for %lld page operations, ops has %d%s", fn,
                    (long long)need, (int)capacity, ops == NULL ? " (NULL)" : "");
    return KVP_OK;
}

int kvp_table_append(kvp_table_t *t, int32_t seq, int64_t n, const int32_t *tokens,
                     int64_t *slots, kvp_page_op_t *ops, int32_t ops_capacity,
                     int32_t *num_ops) {
    static const char fn[] = "kvp_table_append";
    if (t == NULL) return KVP_EINVAL;
    FIND_RESIDENT(s, fn, seq);
    int rc = check_growth(t, fn, s, n);
    if (rc == KVP_OK)
        rc = check_ops_room(t, fn, append_ops_needed(t, s, n), ops, ops_capacity, num_ops);
    if (rc != KVP_OK) return rc;
    if (n == 0) { /* nothing to write: no copy-on-write either */
        *num_ops = 0;
        return KVP_OK;
    }
    int64_t need = pages_needed(t, s, s->len + n);
    int64_t covered = need < s->promised ? need : s->promised;
    if (need - covered > kvp__pool_available(t->pool))
        return fail(t, KVP_ENOSPC,
                    "%s: %lld tokens need %lld pages (%lld reserved), %lld available", fn,
                    (long long)n, (long long)need, (long long)covered,
                    (long long)kvp__pool_available(t->pool));
    rc = ensure_capacity(t, s, pages_for(t, s->len + n));
    if (rc != KVP_OK) return rc;

    /* Nothing below can fail. */
    set_promise(t, s, s->promised - covered);
    int64_t known = (tokens != NULL && s->known == s->len) ? s->len + n : s->known;
    *num_ops = t->staged ? append_staged(t, s, n, tokens, known, slots, ops)
                         : append_paged(t, s, n, tokens, known, slots, ops);
    s->len += n;
    s->known = known;
    t->pool->live_tokens += n;
    refresh_promise(t, s);
    return KVP_OK;
}

/* ---- truncate ------------------------------------------------------------------ */

/* Without staging: a page that becomes partly filled must not be written in
 * place while stored. If this sequence alone holds it and nothing stored
 * extends it, take it out of the cache now (cheaper than a copy later);
 * otherwise the next append copies it. */
static void reopen_paged(kvp_table_t *t, seq_t *s) {
    if (s->len % page_sz(t) == 0 || s->npages == 0) return;
    kvp__page *pg = &t->pool->pages[last_page(s)];
    if (pg->stored && pg->ref == 1 && pg->children == 0) kvp__prefix_unstore(t->pool, last_page(s));
}

int kvp_table_truncate(kvp_table_t *t, int32_t seq, int64_t length, kvp_page_op_t *ops,
                       int32_t ops_capacity, int32_t *num_ops) {
    static const char fn[] = "kvp_table_truncate";
    if (t == NULL) return KVP_EINVAL;
    FIND_RESIDENT(s, fn, seq);
    if (length < 0 || length > s->len)
        return fail(t, KVP_EINVAL, "%s: length %lld is outside 0..%lld (the current length)",
                    fn, (long long)length, (long long)s->len);
    int64_t P = page_sz(t);
    int32_t keep = (int32_t)pages_for(t, length);
    bool unseal = t->staged && length % P != 0 && keep < s->npages;
    int rc = check_ops_room(t, fn, unseal ? 1 : 0, ops, ops_capacity, num_ops);
    if (rc != KVP_OK) return rc;

    *num_ops = 0;
    if (unseal) {
        int32_t src = s->pages[keep];
        copy_tokens(t->pool, s->staging, 0, kvp__page_tokens(t->pool, src), length % P);
        ops[0] = make_op(KVP_OP_UNSEAL, src, s->staging, length % P, -1);
        *num_ops = 1;
    }
    drop_pages_from(t, s, keep);
    t->pool->live_tokens -= s->len - length;
    s->len = length;
    if (s->known > length) s->known = length;
    s->reserve_to = 0;
    set_promise(t, s, 0);
    if (!t->staged) reopen_paged(t, s);
    return KVP_OK;
}

/* ---- fork ------------------------------------------------------------------------ */

int kvp_table_fork(kvp_table_t *t, int32_t parent, int32_t *child, kvp_page_op_t *ops,
                   int32_t ops_capacity, int32_t *num_ops) {
    static const char fn[] = "kvp_table_fork";
    if (t == NULL) return KVP_EINVAL;
    FIND_RESIDENT(s, fn, parent);
    if (child == NULL) return fail(t, KVP_EINVAL, "%s: child (output) is NULL", fn);
    int64_t P = page_sz(t);
    bool copy_staging = t->staged && s->len % P != 0;
    int rc = check_ops_room(t, fn, copy_staging ? 1 : 0, ops, ops_capacity, num_ops);
    if (rc != KVP_OK) return rc;
    if (t->free_head < 0)
        return fail(t, KVP_ENOSPC, "%s: all %d sequence slots are live", fn, (int)t->max_seqs);
    if (t->staged && t->pool->staging_free_count == 0)
        return fail(t, KVP_ENOSPC, "%s: no free staging page for the child (all %d held)", fn,
                    (int)t->pool->num_staging);
    /* Sharing the parent's partial page makes its reserved append copy it. */
    bool newly_shared = !t->staged && s->len % P != 0 && !must_copy_on_write(t, s);
    int64_t extra = (newly_shared && s->reserve_to > s->len) ? 1 : 0;
    if (extra > kvp__pool_available(t->pool))
        return fail(t, KVP_ENOSPC,
                    "%s: the parent's reservation needs a copy-on-write page, none available",
                    fn);
    seq_t *c = &t->seqs[t->free_head];
    rc = ensure_capacity(t, c, s->npages);
    if (rc != KVP_OK) return rc;

    int32_t id;
    kvp_table_seq_create(t, s->priority, s->salt, &id); /* cannot fail: slot and staging checked */
    if (s->npages > 0) memcpy(c->pages, s->pages, (size_t)s->npages * sizeof *c->pages);
    for (int32_t i = 0; i < s->npages; i++) t->pool->pages[s->pages[i]].ref++;
    c->npages = s->npages;
    c->len = s->len;
    c->known = s->known;
    t->pool->live_tokens += s->len;
    *num_ops = 0;
    if (copy_staging) {
        copy_tokens(t->pool, c->staging, 0, kvp__page_tokens(t->pool, s->staging), s->len % P);
        ops[0] = make_op(KVP_OP_COPY, s->staging, c->staging, s->len % P, -1);
        *num_ops = 1;
    }
    set_promise(t, s, s->promised + extra);
    *child = id;
    return KVP_OK;
}

/* ---- prefix cache ----------------------------------------------------------------- */

static int check_prompt(kvp_table_t *t, const char *fn, const int32_t *tokens, int64_t n,
                        const int64_t *matched) {
    if (matched == NULL) return fail(t, KVP_EINVAL, "%s: matched is NULL", fn);
    if (n < 0 || n > MAX_LEN)
        return fail(t, KVP_EINVAL, "%s: n must be 0..2^31-1, got %lld", fn, (long long)n);
    if (n > 0 && tokens == NULL) return fail(t, KVP_EINVAL, "%s: tokens is NULL", fn);
    return KVP_OK;
}

/* Walk the cache along `tokens`, writing matching pages to `out` (if not
 * NULL). Stops at the first page not stored, or when taking the next cached
 * page would exceed `budget` pages of cost (a cached page costs 1: attaching
 * it removes it from what allocations can take). Returns pages matched. */
static int32_t walk_prefix(const kvp_pool_t *p, uint64_t salt, const int32_t *tokens, int64_t n,
                           int64_t budget, int32_t *out) {
    if (!p->prefix_cache) return 0;
    int32_t parent = -1, count = 0;
    uint64_t hash = kvp__prefix_root_hash(p, salt);
    int64_t cost = 0;
    for (int64_t k = 0; k < n / p->page_size; k++) {
        int32_t page = kvp__prefix_find(p, parent, hash, salt, tokens + k * p->page_size, NULL);
        if (page < 0) break;
        cost += p->pages[page].ref == 0;
        if (cost > budget) break;
        if (out) out[count] = page;
        count++;
        parent = page;
        hash = p->pages[page].hash;
    }
    return count;
}

int kvp_table_attach_prefix(kvp_table_t *t, int32_t seq, const int32_t *tokens, int64_t n,
                            int64_t *matched) {
    static const char fn[] = "kvp_table_attach_prefix";
    if (t == NULL) return KVP_EINVAL;
    FIND_RESIDENT(s, fn, seq);
    int rc = check_prompt(t, fn, tokens, n, matched);
    if (rc != KVP_OK) return rc;
    if (s->len != 0)
        return fail(t, KVP_ESTATE, "%s: sequence %d already holds %lld tokens", fn, (int)seq,
                    (long long)s->len);
    kvp_pool_t *p = t->pool;
    rc = ensure_capacity(t, s, n / p->page_size);
    if (rc != KVP_OK) return rc;

    /* This sequence's own reservation is dropped, so its pages count too. */
    set_promise(t, s, 0);
    s->reserve_to = 0;
    int32_t count = walk_prefix(p, s->salt, tokens, n, kvp__pool_available(p), s->pages);
    for (int32_t i = 0; i < count; i++) kvp__pool_attach(p, s->pages[i], s->priority);
    s->npages = count;
    s->len = s->known = (int64_t)count * p->page_size;
    p->live_tokens += s->len;
    p->prefix_lookups++;
    p->prefix_hit_tokens += (uint64_t)s->len;
    p->prefix_miss_tokens += (uint64_t)(n - s->len);
    *matched = s->len;
    return KVP_OK;
}

int kvp_table_lookup_prefix(kvp_table_t *t, uint64_t salt, const int32_t *tokens, int64_t n,
                            int64_t *matched) {
    if (t == NULL) return KVP_EINVAL;
    int rc = check_prompt(t, "kvp_table_lookup_prefix", tokens, n, matched);
    if (rc != KVP_OK) return rc;
    *matched = (int64_t)walk_prefix(t->pool, salt, tokens, n, INT64_MAX, NULL) *
               t->pool->page_size;
    return KVP_OK;
}

/* ---- priorities ------------------------------------------------------------------- */

int kvp_table_set_priority(kvp_table_t *t, int32_t seq, int32_t priority) {
    if (t == NULL) return KVP_EINVAL;
    FIND_SEQ(s, "kvp_table_set_priority", seq);
    s->priority = priority;
    /* Held pages are in use, hence not in the eviction heap: no reordering.
     * Pages a swapped-out sequence has on the host get it at swap-in. */
    for (int32_t i = 0; i < s->npages; i++) {
        if (s->pages[i] < 0) continue;
        kvp__page *pg = &t->pool->pages[s->pages[i]];
        if (pg->priority < priority) pg->priority = priority;
    }
    return KVP_OK;
}

int kvp_table_set_range_priority(kvp_table_t *t, int32_t seq, int64_t begin, int64_t end,
                                 int32_t priority) {
    static const char fn[] = "kvp_table_set_range_priority";
    if (t == NULL) return KVP_EINVAL;
    FIND_RESIDENT(s, fn, seq);
    if (begin < 0 || begin > end || end > s->len)
        return fail(t, KVP_EINVAL, "%s: range [%lld, %lld) is not within 0..%lld", fn,
                    (long long)begin, (long long)end, (long long)s->len);
    int64_t P = page_sz(t);
    for (int64_t k = (begin + P - 1) / P; (k + 1) * P <= end; k++)
        t->pool->pages[s->pages[k]].priority = priority;
    return KVP_OK;
}

/* ---- queries and export ------------------------------------------------------------- */

/* Entries a sequence has in an exported `indices`. */
static int32_t export_pages(const kvp_table_t *t, const seq_t *s) {
    return s->npages + (t->staged && s->len % page_sz(t) != 0 ? 1 : 0);
}

static int32_t last_page_len(const kvp_table_t *t, const seq_t *s) {
    if (s->len == 0) return 0;
    int64_t r = s->len % page_sz(t);
    return (int32_t)(r == 0 ? page_sz(t) : r);
}

static int64_t slot_of(const kvp_table_t *t, const seq_t *s, int64_t pos) {
    int64_t P = page_sz(t);
    int64_t k = pos / P;
    int32_t page = k < s->npages ? s->pages[k] : s->staging;
    return (int64_t)page * P + pos % P;
}

int kvp_table_seq_info(kvp_table_t *t, int32_t seq, kvp_seq_info_t *info) {
    if (t == NULL) return KVP_EINVAL;
    FIND_SEQ(s, "kvp_table_seq_info", seq);
    int rc = kvp__check_struct(info, sizeof *info, "info", t->err, sizeof t->err);
    if (rc != KVP_OK) return rc;
    kvp_seq_info_t r;
    memset(&r, 0, sizeof r);
    r.struct_size = sizeof r;
    r.num_pages = export_pages(t, s);
    r.length = s->len;
    r.last_page_len = last_page_len(t, s);
    r.staging_page = s->staging;
    r.reserved_tokens = s->reserve_to > s->len ? s->reserve_to - s->len : 0;
    r.reserved_pages = s->promised;
    r.priority = s->priority;
    r.salt = s->salt;
    r.swapped = s->swapped ? 1 : 0;
    kvp__copy_out(info, &r, sizeof r);
    return KVP_OK;
}

static void write_pages(const kvp_table_t *t, const seq_t *s, int32_t *out) {
    if (s->npages > 0) memcpy(out, s->pages, (size_t)s->npages * sizeof *out);
    if (export_pages(t, s) > s->npages) out[s->npages] = s->staging;
}

int kvp_table_seq_pages(kvp_table_t *t, int32_t seq, int32_t *pages, int32_t capacity) {
    static const char fn[] = "kvp_table_seq_pages";
    if (t == NULL) return KVP_EINVAL;
    FIND_RESIDENT(s, fn, seq);
    int32_t need = export_pages(t, s);
    if (need > 0 && (pages == NULL || capacity < need))
        return fail(t, KVP_EINVAL, "%s: sequence %d has %d pages, capacity is %d%s", fn,
                    (int)seq, (int)need, (int)capacity, pages == NULL ? " (NULL)" : "");
    if (need > 0) write_pages(t, s, pages);
    return KVP_OK;
}

/* Check a batch and count its entries. */
static int batch_size(kvp_table_t *t, const char *fn, const int32_t *seqs, int32_t batch,
                      const int32_t *num_new, int64_t *num_indices, int64_t *num_slots) {
    if (batch < 0 || (batch > 0 && seqs == NULL))
        return fail(t, KVP_EINVAL, "%s: %s", fn, batch < 0 ? "batch is negative" : "seqs is NULL");
    int64_t pages = 0, rows = 0;
    for (int32_t b = 0; b < batch; b++) {
        seq_t *s = find_seq(t, fn, seqs[b]);
        if (s == NULL)
            return fail(t, KVP_ENOENT, "%s: seqs[%d] = %d is not a live sequence", fn, (int)b,
                        (int)seqs[b]);
        if (s->swapped)
            return fail(t, KVP_ESTATE, "%s: seqs[%d] = %d is swapped out to the host tier", fn,
                        (int)b, (int)seqs[b]);
        int64_t q = num_new ? num_new[b] : 0;
        if (q < 0 || q > s->len)
            return fail(t, KVP_EINVAL, "%s: num_new[%d] = %lld is outside 0..%lld (its length)",
                        fn, (int)b, (long long)q, (long long)s->len);
        pages += export_pages(t, s);
        rows += q;
    }
    if (pages > INT32_MAX || rows > INT32_MAX)
        return fail(t, KVP_EINVAL, "%s: %lld page entries and %lld rows exceed int32 offsets",
                    fn, (long long)pages, (long long)rows);
    *num_indices = pages;
    *num_slots = rows;
    return KVP_OK;
}

int kvp_table_export_size(kvp_table_t *t, const int32_t *seqs, int32_t batch,
                          const int32_t *num_new, int64_t *num_indices, int64_t *num_slots) {
    static const char fn[] = "kvp_table_export_size";
    if (t == NULL) return KVP_EINVAL;
    if (num_indices == NULL || num_slots == NULL)
        return fail(t, KVP_EINVAL, "%s: num_indices or num_slots is NULL", fn);
    return batch_size(t, fn, seqs, batch, num_new, num_indices, num_slots);
}

static int check_buffers(kvp_table_t *t, const char *fn, const kvp_batch_buffers_t *b,
                         int64_t pages, int64_t rows) {
    int rc = kvp__check_struct(b, sizeof *b, "buffers", t->err, sizeof t->err);
    if (rc == KVP_OK) rc = kvp__check_reserved(b->reserved_, "buffers", t->err, sizeof t->err);
    if (rc != KVP_OK) return rc;
    if (b->indptr == NULL || b->last_page_len == NULL || (pages > 0 && b->indices == NULL))
        return fail(t, KVP_EINVAL, "%s: indptr, indices and last_page_len are required", fn);
    if (b->indices_capacity < pages)
        return fail(t, KVP_EINVAL, "%s: indices needs %lld entries, capacity is %lld", fn,
                    (long long)pages, (long long)b->indices_capacity);
    if (b->slot_mapping != NULL && b->slots_capacity < rows)
        return fail(t, KVP_EINVAL, "%s: slot_mapping needs %lld entries, capacity is %lld", fn,
                    (long long)rows, (long long)b->slots_capacity);
    return KVP_OK;
}

int kvp_table_export(kvp_table_t *t, const int32_t *seqs, int32_t batch, const int32_t *num_new,
                     const kvp_batch_buffers_t *buffers, kvp_kv_view_t *view) {
    static const char fn[] = "kvp_table_export";
    if (t == NULL) return KVP_EINVAL;
    int64_t pages, rows;
    int rc = batch_size(t, fn, seqs, batch, num_new, &pages, &rows);
    if (rc == KVP_OK) rc = check_buffers(t, fn, buffers, pages, rows);
    if (rc == KVP_OK && view != NULL)
        rc = kvp__check_struct(view, sizeof *view, "view", t->err, sizeof t->err);
    if (rc != KVP_OK) return rc;

    const kvp_batch_buffers_t *b = buffers;
    int32_t at = 0, row = 0;
    b->indptr[0] = 0;
    if (b->qo_indptr) b->qo_indptr[0] = 0;
    for (int32_t i = 0; i < batch; i++) {
        const seq_t *s = find_seq(t, fn, seqs[i]);
        write_pages(t, s, b->indices + at);
        at += export_pages(t, s);
        b->indptr[i + 1] = at;
        b->last_page_len[i] = last_page_len(t, s);
        int32_t q = num_new ? num_new[i] : 0;
        if (b->slot_mapping)
            for (int64_t pos = s->len - q; pos < s->len; pos++)
                b->slot_mapping[row++] = slot_of(t, s, pos);
        else
            row += q;
        if (b->qo_indptr) b->qo_indptr[i + 1] = row;
    }
    if (view != NULL) {
        kvp_kv_view_t v = {sizeof v, batch, t->pool->page_size, t->pool->num_pages,
                           t->pool->num_staging, 0, b->indptr, b->indices, b->last_page_len};
        kvp__copy_out(view, &v, sizeof v);
    }
    return KVP_OK;
}

/* ---- invariant check (tests, fuzzer) ------------------------------------------------ */

#define CHECK(cond, ...)                                                          \
    do {                                                                          \
        if (!(cond)) return kvp__errf(err, err_size, KVP_EINTERNAL, __VA_ARGS__); \
    } while (0)

static int check_seq(const kvp_table_t *t, int32_t slot, char *err, size_t err_size) {
    const seq_t *s = &t->seqs[slot];
    const kvp_pool_t *p = t->pool;
    CHECK(s->len >= 0 && s->len <= MAX_LEN, "seq slot %d: length %lld", (int)slot,
          (long long)s->len);
    CHECK(s->npages == pages_for(t, s->len), "seq slot %d: %d pages for %lld tokens", (int)slot,
          (int)s->npages, (long long)s->len);
    CHECK(s->npages <= s->cap, "seq slot %d: %d pages, capacity %d", (int)slot, (int)s->npages,
          (int)s->cap);
    CHECK(s->known >= 0 && s->known <= s->len, "seq slot %d: known %lld of %lld", (int)slot,
          (long long)s->known, (long long)s->len);
    CHECK((s->staging >= 0) == (t->staged && !s->swapped), "seq slot %d: staging page %d%s",
          (int)slot, (int)s->staging, s->swapped ? " (swapped out)" : "");
    CHECK(!s->swapped || (s->promised == 0 && s->reserve_to <= s->len),
          "seq slot %d: swapped out with a reservation", (int)slot);
    if (s->staging >= 0)
        CHECK(s->staging >= p->num_pages && s->staging < p->num_pages + p->num_staging &&
                  p->staging[s->staging - p->num_pages].next == KVP__IN_USE,
              "seq slot %d: staging page %d not in use", (int)slot, (int)s->staging);
    for (int32_t i = 0; i < s->npages; i++) {
        int32_t page = s->pages[i];
        if (page < 0 && s->swapped) continue; /* on the host */
        CHECK(page >= 0 && page < p->num_pages && p->pages[page].state == KVP__PAGE_USED,
              "seq slot %d: page %d (#%d) is not a used pool page", (int)slot, (int)page, (int)i);
        bool full = t->staged || ((int64_t)i + 1) * page_sz(t) <= s->len;
        CHECK(!p->pages[page].stored || i == 0 || s->pages[i - 1] < 0 ||
                  p->pages[s->pages[i - 1]].stored || !full,
              "seq slot %d: stored page %d follows an unstored page", (int)slot, (int)page);
    }
    int64_t need = pages_needed(t, s, s->reserve_to);
    CHECK(s->promised >= need, "seq slot %d: reservation needs %lld pages, %d promised",
          (int)slot, (long long)need, (int)s->promised);
    return KVP_OK;
}

int kvp__table_check(const kvp_table_t *t, char *err, size_t err_size) {
    int32_t live = 0, free_slots = 0;
    int64_t tokens = 0, promised = 0;
    for (int32_t i = 0; i < t->max_seqs; i++) {
        const seq_t *s = &t->seqs[i];
        if (!s->live) {
            CHECK(s->npages == 0 && s->promised == 0 && s->staging < 0,
                  "released slot %d still holds pages", (int)i);
            continue;
        }
        live++;
        if (!s->swapped) tokens += s->len;
        promised += s->promised;
        int rc = check_seq(t, i, err, err_size);
        if (rc != KVP_OK) return rc;
    }
    for (int32_t i = t->free_head; i >= 0; i = t->seqs[i].next_free) {
        CHECK(!t->seqs[i].live, "free slot %d is live", (int)i);
        CHECK(++free_slots <= t->max_seqs, "free-slot list has a cycle");
    }
    CHECK(live == t->live && live + free_slots == t->max_seqs,
          "%d live + %d free slots, table says %d live of %d", (int)live, (int)free_slots,
          (int)t->live, (int)t->max_seqs);
    CHECK(tokens <= t->pool->live_tokens && promised <= t->pool->reserved,
          "table holds %lld tokens and %lld reserved pages, pool counts %lld and %lld",
          (long long)tokens, (long long)promised, (long long)t->pool->live_tokens,
          (long long)t->pool->reserved);
    return kvp__pool_check(t->pool, err, err_size);
}
