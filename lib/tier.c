/*
 * Layer `tier`: a host memory area with its own byte budget, into which a
 * page table's sequences are swapped out and from which they come back.
 *
 * Host memory is one allocation cut into slots of `slot_bytes` (a pool page
 * rounded up to KVP_ARENA_ALIGN) with an intrusive LIFO free list, so taking
 * and giving back a slot is O(1) and the memory never fragments. A staging
 * page larger than a slot moves in `staging_chunks` slots.
 *
 * A swapped-out sequence stays in its table (slot, id, length, page list):
 * the table marks it swapped and empties the entries of the pages that went
 * to the host. The tier keeps, per table slot, where each of those pages
 * went (host slot), and enough to recognise a page that was in the prefix
 * cache and is still there unchanged at swap-in (its id, hash and epoch):
 * such a page is attached again instead of copied. Token ids of moved pages
 * are kept too, so the prefix cache and later copy-on-write see the same
 * ids after the swap-in.
 *
 * Every call checks everything that can fail first; the copies (page I/O)
 * come before any state changes on swap-out, and are undone on swap-in.
 */
#include "paging.h"

#include <string.h>

typedef struct {
    int32_t slot;     /* host slot, or -1: kept on the device (shared) */
    int32_t orig;     /* page id at swap-out */
    int32_t priority; /* its eviction priority at swap-out */
    uint8_t stored;   /* it was in the prefix cache at swap-out */
    uint8_t reattach; /* swap-in scratch: attached again, not copied */
    uint16_t epoch;   /* its epoch then (see kvp__page) */
    uint64_t hash;    /* its prefix hash then */
} entry_t;

typedef struct {
    entry_t *e;       /* [cap]: one per page entry, then one per staging chunk */
    int32_t *tokens;  /* [(cap) x page_size] token ids of moved pages (prefix cache on) */
    int32_t cap;
    int32_t npages;   /* page entries */
    int32_t nstg;     /* staging chunks on the host (0: the staging page held no token) */
    int32_t slots;    /* host slots held */
    bool swapped;
} rec_t;

struct kvp_tier {
    kvp_table_t *table;
    kvp_allocator_t alloc;
    kvp_allocator_t host_alloc;
    kvp_page_io_t io;
    bool has_io;
    kvp_layout_t layout;
    uint64_t slot_bytes;
    int32_t staging_chunks;
    int32_t nslots;
    uint8_t *host;      /* [nslots x slot_bytes] */
    int32_t *next;      /* [nslots] free-list links */
    int32_t free_head;
    int32_t free_count;
    rec_t *recs;        /* [table->max_seqs], indexed by table slot */
    int64_t swapped_seqs, swapped_tokens;
    kvp_tier_stats_t counters;
    char err[KVP_ERR_SIZE];
};

static int fail(kvp_tier_t *t, int status, const char *fmt, ...) KVP__PRINTF(3, 4);
static int fail(kvp_tier_t *t, int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    kvp__verrf(t->err, sizeof t->err, status, fmt, ap);
    va_end(ap);
    return status;
}

const char *kvp_tier_last_error(const kvp_tier_t *tier) {
    return tier ? tier->err : KVP__NULL_HANDLE;
}

/* ---- creation ------------------------------------------------------------- */

void kvp_tier_params_init(kvp_tier_params_t *p) {
    if (p == NULL) return;
    memset(p, 0, sizeof *p);
    p->struct_size = sizeof *p;
}

/* The layout must be what kvp_layout_compute() gives for its shape and
 * formats (the one byte-count function), and fit the table's pool. */
static int check_layout(const kvp_table_t *table, const kvp_layout_t *l, char *err,
                        size_t err_size) {
    int rc = kvp__check_struct(l, sizeof *l, "params->layout", err, err_size);
    if (rc != KVP_OK) return rc;
    kvp_layout_t ref;
    memset(&ref, 0, sizeof ref);
    ref.struct_size = sizeof ref;
    rc = kvp_layout_compute(l->layers, l->kv_heads, l->head_dim, l->page_size, l->k_format,
                            l->v_format, &ref, err, err_size);
    if (rc != KVP_OK) return rc;
    if (ref.page_bytes != l->page_bytes || ref.staging_page_bytes != l->staging_page_bytes ||
        ref.needs_staging != l->needs_staging)
        return kvp__errf(err, err_size, KVP_EINVAL,
                         "params->layout does not match kvp_layout_compute() for its shape "
                         "(page_bytes %llu, expected %llu)",
                         (unsigned long long)l->page_bytes, (unsigned long long)ref.page_bytes);
    const kvp_pool_t *pool = table->pool;
    if (l->page_size != pool->page_size)
        return kvp__errf(err, err_size, KVP_EINVAL,
                         "layout page size %d differs from the pool's %d", (int)l->page_size,
                         (int)pool->page_size);
    if ((l->needs_staging != 0) != table->staged)
        return kvp__errf(err, err_size, KVP_EINVAL,
                         "the layout %s staging pages but the pool has %d",
                         l->needs_staging ? "needs" : "has no", (int)pool->num_staging);
    return KVP_OK;
}

static int check_params(const kvp_table_t *table, const kvp_tier_params_t *p, char *err,
                        size_t err_size) {
    int rc = kvp__check_struct(p, sizeof *p, "params", err, err_size);
    if (rc == KVP_OK) rc = kvp__check_reserved(p->reserved_, "params", err, err_size);
    if (rc != KVP_OK) return rc;
    if (p->layout == NULL)
        return kvp__errf(err, err_size, KVP_EINVAL,
                         "params->layout is NULL (use kvp_layout_compute)");
    rc = check_layout(table, p->layout, err, err_size);
    if (rc != KVP_OK) return rc;
    if (p->page_io != NULL) {
        rc = kvp__check_struct(p->page_io, sizeof *p->page_io, "params->page_io", err, err_size);
        if (rc != KVP_OK) return rc;
        if (p->page_io->copy_to_host == NULL || p->page_io->copy_from_host == NULL)
            return kvp__errf(err, err_size, KVP_EINVAL,
                             "params->page_io: set both copy_to_host and copy_from_host");
    }
    rc = kvp__allocator_check(&p->allocator, err, err_size);
    if (rc == KVP_OK) rc = kvp__allocator_check(&p->host_allocator, err, err_size);
    return rc;
}

static void free_all(kvp_tier_t *t, int32_t nrecs) {
    if (t->recs != NULL)
        for (int32_t i = 0; i < nrecs; i++) {
            kvp__free(&t->alloc, t->recs[i].e);
            kvp__free(&t->alloc, t->recs[i].tokens);
        }
    kvp__free(&t->alloc, t->recs);
    kvp__free(&t->alloc, t->next);
    kvp__free(&t->host_alloc, t->host);
}

int kvp_tier_create(kvp_table_t *table, const kvp_tier_params_t *params, kvp_tier_t **tier,
                    char *err, size_t err_size) {
    if (table == NULL || tier == NULL)
        return kvp__errf(err, err_size, KVP_EINVAL, "%s is NULL",
                         table == NULL ? "table" : "tier (output)");
    int rc = check_params(table, params, err, err_size);
    if (rc != KVP_OK) return rc;
    if (table->tier != NULL)
        return kvp__errf(err, err_size, KVP_ESTATE, "the table already has a host tier");
    const kvp_layout_t *l = params->layout;
    uint64_t slot_bytes = kvp__round_up_u64(l->page_bytes, KVP_ARENA_ALIGN);
    uint64_t nslots = params->host_bytes / slot_bytes;
    if (nslots == 0)
        return kvp__errf(err, err_size, KVP_EINVAL,
                         "host_bytes %llu is less than one slot (%llu bytes: a page)",
                         (unsigned long long)params->host_bytes, (unsigned long long)slot_bytes);
    if (nslots > INT32_MAX)
        return kvp__errf(err, err_size, KVP_EINVAL,
                         "host_bytes %llu make %llu slots, more than 2^31-1",
                         (unsigned long long)params->host_bytes, (unsigned long long)nslots);
    uint64_t host_total = nslots * slot_bytes; /* <= host_bytes: no overflow */
    if (host_total > SIZE_MAX)
        return kvp__errf(err, err_size, KVP_EINVAL, "host_bytes %llu exceed the address space",
                         (unsigned long long)host_total);

    kvp_allocator_t hooks = params->allocator;
    kvp_tier_t *t = kvp__calloc(&hooks, 1, sizeof *t, 64);
    if (t == NULL) return kvp__errf(err, err_size, KVP_ENOMEM, "cannot allocate the tier");
    t->alloc = hooks;
    t->host_alloc = params->host_allocator.alloc != NULL ? params->host_allocator : hooks;
    t->table = table;
    t->layout = *l;
    t->layout.struct_size = sizeof t->layout;
    if (params->page_io) {
        memcpy(&t->io, params->page_io, sizeof t->io);
        t->has_io = true;
    }
    t->slot_bytes = slot_bytes;
    t->staging_chunks =
        table->staged ? (int32_t)((l->staging_page_bytes + slot_bytes - 1) / slot_bytes) : 0;
    t->nslots = (int32_t)nslots;
    t->recs = kvp__calloc(&hooks, (size_t)table->max_seqs, sizeof *t->recs, 64);
    t->next = kvp__malloc(&hooks, (size_t)nslots * sizeof *t->next, 64);
    t->host = kvp__malloc(&t->host_alloc, (size_t)host_total, KVP_ARENA_ALIGN);
    if (t->recs == NULL || t->next == NULL || t->host == NULL) {
        bool host = t->recs != NULL && t->next != NULL;
        free_all(t, 0);
        kvp__free(&hooks, t);
        return kvp__errf(err, err_size, KVP_ENOMEM, "cannot allocate %s",
                         host ? "the host memory of the tier" : "the tier's metadata");
    }
    for (int32_t i = 0; i < t->nslots; i++) t->next[i] = i + 1 < t->nslots ? i + 1 : -1;
    t->free_head = 0;
    t->free_count = t->nslots;
    table->tier = t;
    *tier = t;
    return KVP_OK;
}

/* ---- host slots ------------------------------------------------------------ */

static int32_t slot_take(kvp_tier_t *t) {
    int32_t s = t->free_head;
    t->free_head = t->next[s];
    t->free_count--;
    return s;
}

static void slot_give(kvp_tier_t *t, int32_t s) {
    t->next[s] = t->free_head;
    t->free_head = s;
    t->free_count++;
}

static uint8_t *slot_ptr(const kvp_tier_t *t, int32_t s) {
    return t->host + (size_t)s * t->slot_bytes;
}

/* Give back a record's slots, last taken first, so the free list is as it
 * was before they were taken. */
static void rec_give_slots(kvp_tier_t *t, rec_t *r, int32_t nentries) {
    for (int32_t i = nentries - 1; i >= 0; i--)
        if (r->e[i].slot >= 0) {
            slot_give(t, r->e[i].slot);
            r->e[i].slot = -1;
        }
}

/* Bytes of staging chunk `j`. */
static uint64_t chunk_bytes(const kvp_tier_t *t, int32_t j) {
    uint64_t off = (uint64_t)j * t->slot_bytes;
    uint64_t left = t->layout.staging_page_bytes - off;
    return left < t->slot_bytes ? left : t->slot_bytes;
}

/* ---- shared helpers ------------------------------------------------------------ */

/* Look up a live sequence of the tier's table; on failure the table's detail
 * becomes the tier's. */
static kvp__seq *find(kvp_tier_t *t, const char *fn, int32_t seq) {
    kvp__seq *s = kvp__table_find(t->table, fn, seq);
    if (s == NULL) fail(t, KVP_ENOENT, "%s", kvp_table_last_error(t->table));
    return s;
}

static int check_ops(kvp_tier_t *t, const char *fn, int64_t need, const kvp_page_op_t *ops,
                     int32_t capacity, const int32_t *num_ops) {
    if (num_ops == NULL) return fail(t, KVP_EINVAL, "%s: num_ops is NULL", fn);
    if (capacity < 0) return fail(t, KVP_EINVAL, "%s: ops_capacity is negative", fn);
    if (t->has_io) return KVP_OK; /* copies are made here: no operations */
    if (need > capacity || (need > 0 && ops == NULL))
        return fail(t, KVP_EINVAL, "%s: needs room for %lld page operations, ops has %d%s", fn,
                    (long long)need, (int)capacity, ops == NULL ? " (NULL)" : "");
    return KVP_OK;
}

/* A page I/O function failed: its status (a positive value breaks the
 * contract and becomes KVP_EINVAL). */
static int io_failed(kvp_tier_t *t, const char *fn, int rc, const char *what, int32_t page,
                     int32_t slot) {
    int status = rc < 0 ? rc : KVP_EINVAL;
    return fail(t, status, "%s: page I/O failed (%s) %s page %d, host slot %d%s", fn,
                kvp_status_name(status), what, (int)page, (int)slot,
                rc < 0 ? "" : ": it returned a positive value, not a status");
}

static int ensure_rec(kvp_tier_t *t, rec_t *r, int32_t entries) {
    if (entries <= r->cap) return KVP_OK;
    int64_t cap = r->cap < 8 ? 8 : (int64_t)r->cap * 2;
    if (cap < entries) cap = entries;
    if (cap > INT32_MAX) cap = INT32_MAX;
    entry_t *e = kvp__malloc(&t->alloc, (size_t)cap * sizeof *e, 0);
    int32_t *tok = NULL;
    kvp_pool_t *p = t->table->pool;
    if (e != NULL && p->tokens != NULL) {
        uint64_t n;
        if (kvp__mul_u64((uint64_t)cap, (uint64_t)p->page_size * sizeof *tok, &n) && n <= SIZE_MAX)
            tok = kvp__malloc(&t->alloc, (size_t)n, 0);
    }
    if (e == NULL || (p->tokens != NULL && tok == NULL)) {
        kvp__free(&t->alloc, e);
        return fail(t, KVP_ENOMEM, "cannot grow the tier's record of a sequence to %lld pages",
                    (long long)cap);
    }
    kvp__free(&t->alloc, r->e);
    kvp__free(&t->alloc, r->tokens);
    r->e = e;
    r->tokens = tok;
    r->cap = (int32_t)cap;
    return KVP_OK;
}

/* Tokens page `k` of a sequence of `len` tokens holds (pool pages). */
static int32_t page_tokens(const kvp_table_t *tb, int64_t len, int32_t k) {
    int64_t P = tb->pool->page_size;
    int64_t left = len - (int64_t)k * P;
    return (int32_t)(left < P ? left : P);
}

static bool staging_has_tokens(const kvp_table_t *tb, const kvp__seq *s) {
    return tb->staged && s->len % tb->pool->page_size != 0;
}

static kvp_page_op_t make_op(int32_t kind, int32_t src, int32_t dst, int32_t count, int32_t row) {
    kvp_page_op_t op;
    op.kind = kind;
    op.src = src;
    op.dst = dst;
    op.count = count;
    op.row = row;
    return op;
}

/* Is entry `e` (swapped out) a page still in the prefix cache, unchanged? */
static bool reusable(const kvp_pool_t *p, const entry_t *e) {
    if (!e->stored) return false;
    const kvp__page *pg = &p->pages[e->orig];
    return pg->stored && pg->epoch == e->epoch && pg->hash == e->hash;
}

/* ---- swap out ----------------------------------------------------------------- */

int kvp_tier_swap_out(kvp_tier_t *t, int32_t seq, kvp_page_op_t *ops, int32_t ops_capacity,
                      int32_t *num_ops) {
    static const char fn[] = "kvp_tier_swap_out";
    if (t == NULL) return KVP_EINVAL;
    kvp__seq *s = find(t, fn, seq);
    if (s == NULL) return KVP_ENOENT;
    if (s->swapped)
        return fail(t, KVP_ESTATE, "%s: sequence %d is already swapped out", fn, (int)seq);
    kvp_table_t *tb = t->table;
    kvp_pool_t *p = tb->pool;
    int64_t P = p->page_size;

    int32_t moved = 0;
    for (int32_t i = 0; i < s->npages; i++) moved += p->pages[s->pages[i]].ref == 1;
    int32_t nstg = staging_has_tokens(tb, s) ? t->staging_chunks : 0;
    int64_t slots = (int64_t)moved + nstg;
    int rc = check_ops(t, fn, slots, ops, ops_capacity, num_ops);
    if (rc != KVP_OK) return rc;
    if (slots > t->free_count)
        return fail(t, KVP_EHOSTFULL,
                    "%s: sequence %d needs %lld host slots (%llu bytes), %d of %d are free", fn,
                    (int)seq, (long long)slots, (unsigned long long)slots * t->slot_bytes,
                    (int)t->free_count, (int)t->nslots);
    rec_t *r = &t->recs[kvp__table_slot(tb, s)];
    rc = ensure_rec(t, r, s->npages + nstg);
    if (rc != KVP_OK) return rc;

    /* Slots first, then the copies: until they all succeed nothing changes. */
    for (int32_t i = 0; i < s->npages; i++) {
        entry_t *e = &r->e[i];
        const kvp__page *pg = &p->pages[s->pages[i]];
        e->slot = pg->ref == 1 ? slot_take(t) : -1;
        e->orig = s->pages[i];
        e->priority = pg->priority;
        e->stored = pg->stored;
        e->reattach = 0;
        e->epoch = pg->epoch;
        e->hash = pg->hash;
    }
    for (int32_t j = 0; j < nstg; j++) {
        entry_t *e = &r->e[s->npages + j];
        memset(e, 0, sizeof *e);
        e->slot = slot_take(t);
        e->orig = s->staging;
    }
    if (t->has_io) {
        for (int32_t i = 0; i < s->npages + nstg; i++) {
            const entry_t *e = &r->e[i];
            if (e->slot < 0) continue;
            bool stg = i >= s->npages;
            uint64_t off = stg ? (uint64_t)(i - s->npages) * t->slot_bytes : 0;
            uint64_t n = stg ? chunk_bytes(t, i - s->npages) : t->layout.page_bytes;
            int io = t->io.copy_to_host(t->io.opaque, e->orig, off, slot_ptr(t, e->slot), n);
            if (io != KVP_OK) {
                rec_give_slots(t, r, s->npages + nstg);
                return io_failed(t, fn, io, "copying out", e->orig, e->slot);
            }
        }
    }

    /* Commit: nothing below can fail. */
    int32_t nops = 0;
    uint64_t bytes = 0;
    for (int32_t i = 0; i < s->npages; i++) {
        const entry_t *e = &r->e[i];
        if (e->slot < 0) {
            t->counters.pages_kept++;
            continue;
        }
        if (r->tokens) memcpy(r->tokens + (size_t)i * (size_t)P, kvp__page_tokens(p, e->orig),
                              (size_t)P * sizeof *r->tokens);
        if (!t->has_io)
            ops[nops++] = make_op(KVP_OP_SWAP_OUT, e->orig, e->slot,
                                  tb->staged ? (int32_t)P : page_tokens(tb, s->len, i), 0);
        bytes += t->layout.page_bytes;
        t->counters.pages_out++;
    }
    for (int32_t j = 0; j < nstg; j++) {
        const entry_t *e = &r->e[s->npages + j];
        if (!t->has_io)
            ops[nops++] = make_op(KVP_OP_SWAP_OUT, s->staging, e->slot, (int32_t)(s->len % P), j);
        bytes += chunk_bytes(t, j);
    }
    if (nstg > 0) {
        if (r->tokens)
            memcpy(r->tokens + (size_t)s->npages * (size_t)P, kvp__page_tokens(p, s->staging),
                   (size_t)P * sizeof *r->tokens);
        t->counters.pages_out++;
    }
    /* Last page first, as a release does: earlier pages of a cached chain
     * stay cached longer. */
    for (int32_t i = s->npages - 1; i >= 0; i--)
        if (r->e[i].slot >= 0) {
            kvp__pool_drop(p, s->pages[i]);
            s->pages[i] = -1;
        }
    if (s->staging >= 0) kvp__staging_drop(p, s->staging);
    s->staging = -1;
    kvp__table_set_promise(tb, s, 0);
    s->reserve_to = 0;
    s->swapped = true;
    p->live_tokens -= s->len;
    r->swapped = true;
    r->npages = s->npages;
    r->nstg = nstg;
    r->slots = (int32_t)slots;
    t->swapped_seqs++;
    t->swapped_tokens += s->len;
    t->counters.swap_outs++;
    t->counters.bytes_out += bytes;
    *num_ops = nops;
    return KVP_OK;
}

/* ---- swap in ------------------------------------------------------------------- */

/* Undo the page and staging takes of a swap-in whose copies failed. */
static void undo_swap_in(kvp_tier_t *t, kvp__seq *s, const rec_t *r, int32_t staging) {
    kvp_pool_t *p = t->table->pool;
    /* Fresh pages go back to the free list in reverse order of taking. */
    for (int32_t i = r->npages - 1; i >= 0; i--) {
        const entry_t *e = &r->e[i];
        if (e->slot < 0 || e->reattach) continue;
        kvp__pool_drop(p, s->pages[i]);
        s->pages[i] = -1;
    }
    for (int32_t i = r->npages - 1; i >= 0; i--) {
        const entry_t *e = &r->e[i];
        if (e->slot < 0 || !e->reattach) continue;
        kvp__pool_drop(p, e->orig);
        s->pages[i] = -1;
    }
    if (staging >= 0) kvp__staging_drop(p, staging);
}

int kvp_tier_swap_in(kvp_tier_t *t, int32_t seq, kvp_page_op_t *ops, int32_t ops_capacity,
                     int32_t *num_ops) {
    static const char fn[] = "kvp_tier_swap_in";
    if (t == NULL) return KVP_EINVAL;
    kvp__seq *s = find(t, fn, seq);
    if (s == NULL) return KVP_ENOENT;
    if (!s->swapped)
        return fail(t, KVP_ESTATE, "%s: sequence %d is resident, not swapped out", fn, (int)seq);
    kvp_table_t *tb = t->table;
    kvp_pool_t *p = tb->pool;
    int64_t P = p->page_size;
    rec_t *r = &t->recs[kvp__table_slot(tb, s)];

    int64_t take = 0, fresh = 0;
    for (int32_t i = 0; i < r->npages; i++) {
        entry_t *e = &r->e[i];
        if (e->slot < 0) continue;
        e->reattach = reusable(p, e);
        if (!e->reattach) fresh++;
        /* a fresh page, or a cached one, comes out of the available pages */
        if (!e->reattach || p->pages[e->orig].state == KVP__PAGE_CACHED) take++;
    }
    int rc = check_ops(t, fn, fresh + r->nstg, ops, ops_capacity, num_ops);
    if (rc != KVP_OK) return rc;
    if (take > kvp__pool_available(p))
        return fail(t, KVP_ENOSPC, "%s: sequence %d needs %lld pages, %lld available", fn,
                    (int)seq, (long long)take, (long long)kvp__pool_available(p));
    if (tb->staged && p->staging_free_count == 0)
        return fail(t, KVP_ENOSPC, "%s: no free staging page for sequence %d (all %d held)", fn,
                    (int)seq, (int)p->num_staging);

    int32_t staging = tb->staged ? kvp__staging_take(p) : -1;
    /* Cached pages first, so that taking fresh pages cannot evict them. */
    for (int32_t i = 0; i < r->npages; i++) {
        const entry_t *e = &r->e[i];
        if (e->slot >= 0 && e->reattach) {
            kvp__pool_attach(p, e->orig, s->priority);
            s->pages[i] = e->orig;
        }
    }
    for (int32_t i = 0; i < r->npages; i++)
        if (r->e[i].slot >= 0 && s->pages[i] < 0) {
            int32_t page = kvp__pool_take(p, r->e[i].priority);
            s->pages[i] = page;
        }
    if (t->has_io) {
        for (int32_t i = 0; i < r->npages + r->nstg; i++) {
            const entry_t *e = &r->e[i];
            bool stg = i >= r->npages;
            if (e->slot < 0 || (!stg && e->reattach)) continue;
            int32_t page = stg ? staging : s->pages[i];
            uint64_t off = stg ? (uint64_t)(i - r->npages) * t->slot_bytes : 0;
            uint64_t n = stg ? chunk_bytes(t, i - r->npages) : t->layout.page_bytes;
            int io = t->io.copy_from_host(t->io.opaque, page, off, slot_ptr(t, e->slot), n);
            if (io != KVP_OK) {
                undo_swap_in(t, s, r, staging);
                return io_failed(t, fn, io, "copying into", page, e->slot);
            }
        }
    }

    /* Commit: nothing below can fail. */
    int32_t nops = 0;
    uint64_t bytes = 0;
    for (int32_t i = 0; i < r->npages; i++) {
        const entry_t *e = &r->e[i];
        if (e->slot < 0) continue;
        if (e->reattach) {
            t->counters.pages_reattached++;
            continue;
        }
        int32_t page = s->pages[i];
        if (r->tokens)
            memcpy(kvp__page_tokens(p, page), r->tokens + (size_t)i * (size_t)P,
                   (size_t)P * sizeof *r->tokens);
        if (!t->has_io)
            ops[nops++] = make_op(KVP_OP_SWAP_IN, e->slot, page,
                                  tb->staged ? (int32_t)P : page_tokens(tb, s->len, i), 0);
        bytes += t->layout.page_bytes;
        t->counters.pages_in++;
        /* It was in the prefix cache: store the copy, as the append that
         * filled it did (nothing happens if an equal page is stored). */
        if (e->stored) kvp__table_maybe_store(tb, s, i);
    }
    for (int32_t j = 0; j < r->nstg; j++) {
        const entry_t *e = &r->e[r->npages + j];
        if (!t->has_io)
            ops[nops++] = make_op(KVP_OP_SWAP_IN, e->slot, staging, (int32_t)(s->len % P), j);
        bytes += chunk_bytes(t, j);
    }
    if (r->nstg > 0) {
        if (r->tokens)
            memcpy(kvp__page_tokens(p, staging), r->tokens + (size_t)r->npages * (size_t)P,
                   (size_t)P * sizeof *r->tokens);
        t->counters.pages_in++;
    }
    rec_give_slots(t, r, r->npages + r->nstg);
    s->staging = staging;
    s->swapped = false;
    p->live_tokens += s->len;
    t->swapped_seqs--;
    t->swapped_tokens -= s->len;
    r->swapped = false;
    r->slots = 0;
    t->counters.swap_ins++;
    t->counters.bytes_in += bytes;
    *num_ops = nops;
    return KVP_OK;
}

/* ---- drop, destroy ---------------------------------------------------------------- */

static void forget(kvp_tier_t *t, kvp__seq *s) {
    rec_t *r = &t->recs[kvp__table_slot(t->table, s)];
    if (!r->swapped) return;
    rec_give_slots(t, r, r->npages + r->nstg);
    r->swapped = false;
    r->slots = 0;
    t->swapped_seqs--;
    t->swapped_tokens -= s->len;
}

int kvp_tier_drop(kvp_tier_t *t, int32_t seq) {
    if (t == NULL) return KVP_EINVAL;
    kvp__seq *s = find(t, "kvp_tier_drop", seq);
    if (s == NULL) return KVP_ENOENT;
    forget(t, s);
    kvp__table_release(t->table, s);
    t->counters.drops++;
    return KVP_OK;
}

void kvp_tier_destroy(kvp_tier_t *t) {
    if (t == NULL) return;
    kvp_table_t *tb = t->table;
    for (int32_t i = 0; i < tb->max_seqs; i++)
        if (t->recs[i].swapped) {
            forget(t, &tb->seqs[i]);
            kvp__table_release(tb, &tb->seqs[i]);
        }
    tb->tier = NULL;
    kvp_allocator_t hooks = t->alloc;
    free_all(t, tb->max_seqs);
    kvp__free(&hooks, t);
}

/* ---- queries ------------------------------------------------------------------------ */

int kvp_tier_seq_info(kvp_tier_t *t, int32_t seq, kvp_tier_seq_info_t *info) {
    static const char fn[] = "kvp_tier_seq_info";
    if (t == NULL) return KVP_EINVAL;
    int rc = kvp__check_struct(info, sizeof *info, "info", t->err, sizeof t->err);
    if (rc != KVP_OK) return rc;
    kvp__seq *s = find(t, fn, seq);
    if (s == NULL) return KVP_ENOENT;
    const kvp_pool_t *p = t->table->pool;
    kvp_tier_seq_info_t o;
    memset(&o, 0, sizeof o);
    o.struct_size = sizeof o;
    o.swapped = s->swapped ? 1 : 0;
    if (s->swapped) {
        const rec_t *r = &t->recs[kvp__table_slot(t->table, s)];
        int32_t fresh = 0;
        for (int32_t i = 0; i < r->npages; i++) {
            if (r->e[i].slot < 0) {
                o.shared_pages++;
                continue;
            }
            o.private_pages++;
            fresh += !reusable(p, &r->e[i]);
        }
        o.staging = r->nstg > 0;
        o.host_slots = r->slots;
        o.ops = fresh + r->nstg;
        o.copy_bytes = (uint64_t)fresh * t->layout.page_bytes;
    } else {
        for (int32_t i = 0; i < s->npages; i++) {
            if (p->pages[s->pages[i]].ref == 1) o.private_pages++;
            else o.shared_pages++;
        }
        o.staging = staging_has_tokens(t->table, s);
        o.host_slots = o.private_pages + (o.staging ? t->staging_chunks : 0);
        o.ops = o.host_slots;
        o.copy_bytes = (uint64_t)o.private_pages * t->layout.page_bytes;
    }
    if (o.staging) o.copy_bytes += t->layout.staging_page_bytes;
    if (t->has_io) o.ops = 0;
    o.host_bytes = (uint64_t)o.host_slots * t->slot_bytes;
    kvp__copy_out(info, &o, sizeof o);
    return KVP_OK;
}

int kvp_tier_stats(const kvp_tier_t *t, kvp_tier_stats_t *stats) {
    if (t == NULL) return KVP_EINVAL;
    int rc = kvp__check_struct(stats, sizeof *stats, "stats", NULL, 0);
    if (rc != KVP_OK) return rc;
    kvp_tier_stats_t o = t->counters;
    o.struct_size = sizeof o;
    o.staging_chunks = t->staging_chunks;
    o.slot_bytes = t->slot_bytes;
    o.staging_bytes = (uint64_t)t->staging_chunks * t->slot_bytes;
    o.total_slots = t->nslots;
    o.host_bytes = (uint64_t)t->nslots * t->slot_bytes;
    o.free_slots = t->free_count;
    o.free_bytes = (uint64_t)t->free_count * t->slot_bytes;
    o.swapped_seqs = t->swapped_seqs;
    o.swapped_tokens = t->swapped_tokens;
    kvp__copy_out(stats, &o, sizeof o);
    return KVP_OK;
}

int kvp_tier_host_memory(const kvp_tier_t *t, void **base, uint64_t *bytes) {
    if (t == NULL || base == NULL || bytes == NULL) return KVP_EINVAL;
    *base = t->host;
    *bytes = (uint64_t)t->nslots * t->slot_bytes;
    return KVP_OK;
}

/* ---- invariant check (tests) ---------------------------------------------------------- */

int kvp__tier_check(const kvp_tier_t *t, char *err, size_t err_size) {
    int64_t held = 0, seqs = 0, tokens = 0;
    const kvp_table_t *tb = t->table;
    for (int32_t i = 0; i < tb->max_seqs; i++) {
        const rec_t *r = &t->recs[i];
        const kvp__seq *s = &tb->seqs[i];
        if (r->swapped != (s->live && s->swapped))
            return kvp__errf(err, err_size, KVP_EINTERNAL,
                             "table slot %d: tier says swapped %d, table %d", (int)i,
                             (int)r->swapped, (int)(s->live && s->swapped));
        if (!r->swapped) continue;
        int32_t n = 0;
        for (int32_t k = 0; k < r->npages + r->nstg; k++) n += r->e[k].slot >= 0;
        for (int32_t k = 0; k < r->npages; k++)
            if ((r->e[k].slot >= 0) != (s->pages[k] < 0))
                return kvp__errf(err, err_size, KVP_EINTERNAL,
                                 "table slot %d page %d: host slot %d, device page %d", (int)i,
                                 (int)k, (int)r->e[k].slot, (int)s->pages[k]);
        if (n != r->slots)
            return kvp__errf(err, err_size, KVP_EINTERNAL, "table slot %d: %d slots, says %d",
                             (int)i, (int)n, (int)r->slots);
        held += n;
        seqs++;
        tokens += s->len;
    }
    int32_t free_n = 0;
    for (int32_t s = t->free_head; s >= 0; s = t->next[s])
        if (++free_n > t->nslots)
            return kvp__errf(err, err_size, KVP_EINTERNAL, "host free list has a cycle");
    if (free_n != t->free_count || held + free_n != t->nslots || seqs != t->swapped_seqs ||
        tokens != t->swapped_tokens)
        return kvp__errf(err, err_size, KVP_EINTERNAL,
                         "host slots: %d free (count %d) + %lld held != %d; %lld sequences "
                         "(count %lld), %lld tokens (count %lld)",
                         (int)free_n, (int)t->free_count, (long long)held, (int)t->nslots,
                         (long long)seqs, (long long)t->swapped_seqs, (long long)tokens,
                         (long long)t->swapped_tokens);
    return kvp__table_check(tb, err, err_size);
}
