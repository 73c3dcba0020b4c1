/*
 * libFuzzer harness: drives the pool and table API from bytes.
 *
 *   make fuzz FUZZ_SECONDS=60      (clang -fsanitize=fuzzer,address,undefined)
 *
 * The first four bytes choose a pool (page size, pages, staging pages,
 * prefix cache, narrowed hashes that collide); every following byte is an
 * operation with its arguments. Besides crashes and sanitizer reports, the
 * harness traps on wrong results: it keeps each sequence's tokens and a
 * simulated KV store (rows written at the returned slots, page operations
 * executed as the header specifies) and reads every sequence back through
 * the exported CSR after each operation; it checks the library's internal
 * invariants; and it fails allocations on demand, requiring KVP_ENOMEM with
 * nothing changed. With flag bit 2 set, a host tier (operations mode, a few
 * slots) swaps sequences out and back: a swapped-out sequence must refuse
 * the table's calls, and read back exactly after its swap-in.
 * tests/test_fuzz_table.c runs this file's corpus and random inputs under
 * the normal `make test`.
 */
#define _POSIX_C_SOURCE 200809L
#include "paging.h"
#include "fuzz_input.h"

#include <stdlib.h>
#include <string.h>

#define FZ_SEQS 8
#define FZ_LEN 256
#define FZ_MAX_PAGES 64
#define FZ_MAX_P 16

#define FZ_ASSERT FZI_ASSERT

typedef fzi_cursor fz_bytes;
static uint32_t take(fz_bytes *b) { return fzi_u8(b); }

typedef struct {
    bool live;
    bool swapped;
    int32_t id;
    int64_t len;
    uint64_t salt;
    int32_t toks[FZ_LEN];
} fz_seq;

typedef struct {
    int32_t P, N, S;
    kvp_pool_t *pool;
    kvp_table_t *t;
    fzi_alloc alloc;
    fz_seq seqs[FZ_SEQS];
    int32_t stale[4];
    int32_t engine[8];
    int nengine;
    int32_t store[(FZ_MAX_PAGES + FZ_SEQS + 1) * FZ_MAX_P];
    kvp_tier_t *tier;
    kvp_layout_t layout;
    uint64_t slot_bytes;
    int32_t host[(FZ_MAX_PAGES + FZ_SEQS) * 4 * FZ_MAX_P]; /* rows of each host slot */
} fz_world;

/* The harness's storage serializes a page as its rows, row r at byte
 * r x (page bytes / P); a swap chunk j moves the rows whose bytes start in
 * [j x slot_bytes, (j + 1) x slot_bytes). */
static bool row_in_chunk(const fz_world *w, int32_t page, int32_t r, int32_t j) {
    uint64_t bytes = page < w->N ? w->layout.page_bytes : w->layout.staging_page_bytes;
    uint64_t at = (uint64_t)r * (bytes / (uint64_t)w->P);
    return at / w->slot_bytes == (uint64_t)j;
}

static void run_swap(fz_world *w, const kvp_page_op_t *op) {
    bool out = op->kind == KVP_OP_SWAP_OUT;
    int32_t page = out ? op->src : op->dst, slot = out ? op->dst : op->src;
    FZ_ASSERT(page >= 0 && page < w->N + w->S && slot >= 0);
    FZ_ASSERT((size_t)(slot + 1) * (size_t)w->P <= sizeof w->host / sizeof w->host[0]);
    for (int32_t r = 0; r < w->P; r++) {
        if (!row_in_chunk(w, page, r, op->row)) continue;
        if (out) w->host[slot * w->P + r] = w->store[page * w->P + r];
        else w->store[page * w->P + r] = w->host[slot * w->P + r];
    }
}

static void run_ops(fz_world *w, const kvp_page_op_t *ops, int32_t n) {
    for (int32_t i = 0; i < n; i++) {
        const kvp_page_op_t *op = &ops[i];
        if (op->kind == KVP_OP_SWAP_OUT || op->kind == KVP_OP_SWAP_IN) {
            run_swap(w, op);
            continue;
        }
        int32_t count = op->kind == KVP_OP_COPY ? w->P : op->count;
        FZ_ASSERT(op->dst >= 0 && op->dst < w->N + w->S && count >= 0 && count <= w->P);
        if (op->kind == KVP_OP_SEAL && op->count == 0) {
            FZ_ASSERT(op->src == -1);
            continue;
        }
        FZ_ASSERT(op->src >= 0 && op->src < w->N + w->S);
        memmove(&w->store[op->dst * w->P], &w->store[op->src * w->P],
                (size_t)count * sizeof(int32_t));
    }
}

/* Export every live sequence and read its tokens back from the store. */
static void verify(fz_world *w) {
    char err[KVP_ERR_SIZE];
    FZ_ASSERT((w->tier ? kvp__tier_check(w->tier, err, sizeof err)
                       : kvp__table_check(w->t, err, sizeof err)) == KVP_OK);
    int32_t ids[FZ_SEQS], who[FZ_SEQS], nb = 0;
    for (int i = 0; i < FZ_SEQS; i++)
        if (w->seqs[i].live && !w->seqs[i].swapped) {
            who[nb] = i;
            ids[nb++] = w->seqs[i].id;
        }
    int64_t ni, ns;
    FZ_ASSERT(kvp_table_export_size(w->t, ids, nb, NULL, &ni, &ns) == KVP_OK && ns == 0);
    int32_t indptr[FZ_SEQS + 1], last[FZ_SEQS];
    int32_t indices[FZ_SEQS * (FZ_LEN + 1)];
    kvp_batch_buffers_t b = {.struct_size = sizeof b};
    b.indptr = indptr;
    b.indices = indices;
    b.last_page_len = last;
    b.indices_capacity = ni;
    FZ_ASSERT(kvp_table_export(w->t, ids, nb, NULL, &b, NULL) == KVP_OK);
    for (int k = 0; k < nb; k++) {
        const fz_seq *s = &w->seqs[who[k]];
        int64_t pages = w->S > 0 ? s->len / w->P + (s->len % w->P != 0) : (s->len + w->P - 1) / w->P;
        FZ_ASSERT(indptr[k + 1] - indptr[k] == pages);
        FZ_ASSERT(last[k] == (s->len == 0 ? 0 : (s->len % w->P ? s->len % w->P : w->P)));
        for (int64_t pos = 0; pos < s->len; pos++) {
            int32_t page = indices[indptr[k] + pos / w->P];
            FZ_ASSERT(w->store[page * w->P + pos % w->P] == s->toks[pos]);
        }
    }
}

/* A live sequence on the device (`swapped` false) or in the host tier. */
static fz_seq *pick_in(fz_world *w, uint32_t r, bool swapped) {
    for (int i = 0; i < FZ_SEQS; i++) {
        fz_seq *s = &w->seqs[(r + (uint32_t)i) % FZ_SEQS];
        if (s->live && s->swapped == swapped) return s;
    }
    return NULL;
}

static fz_seq *pick(fz_world *w, uint32_t r) { return pick_in(w, r, false); }

static fz_seq *free_slot(fz_world *w) {
    for (int i = 0; i < FZ_SEQS; i++)
        if (!w->seqs[i].live) return &w->seqs[i];
    return NULL;
}

static void do_create(fz_world *w, fz_bytes *in) {
    fz_seq *s = free_slot(w);
    uint32_t a = take(in);
    if (s == NULL) return;
    int32_t priority = (int32_t)(a & 7) - 2;
    uint64_t salt = a >> 7;
    int32_t id;
    int rc = kvp_table_seq_create(w->t, priority, salt, &id);
    FZ_ASSERT(rc == KVP_OK || rc == KVP_ENOSPC);
    if (rc != KVP_OK) return;
    s->live = true;
    s->swapped = false;
    s->id = id;
    s->len = 0;
    s->salt = salt;
}

static void do_append(fz_world *w, fz_bytes *in) {
    fz_seq *s = pick(w, take(in));
    uint32_t a = take(in);
    if (s == NULL) return;
    int64_t n = (int64_t)(a & 63) % (3 * w->P + 1);
    if (s->len + n > FZ_LEN) n = FZ_LEN - s->len;
    int32_t toks[FZ_LEN];
    for (int64_t i = 0; i < n; i++) toks[i] = (int32_t)(take(in) & 7);
    int64_t slots[FZ_LEN];
    kvp_page_op_t ops[FZ_LEN + 1];
    int32_t nops = -1;
    int rc = kvp_table_append(w->t, s->id, n, (a & 64) ? NULL : toks, slots, ops,
                              (int32_t)(n / w->P + 1), &nops);
    FZ_ASSERT(rc == KVP_OK || rc == KVP_ENOSPC || rc == KVP_ENOMEM);
    if (rc != KVP_OK) return;
    run_ops(w, ops, nops);
    for (int64_t i = 0; i < n; i++) {
        FZ_ASSERT(slots[i] >= 0 && slots[i] < (int64_t)(w->N + w->S) * w->P);
        w->store[slots[i]] = toks[i];
        s->toks[s->len + i] = toks[i];
    }
    s->len += n;
}

static void do_truncate(fz_world *w, fz_bytes *in) {
    fz_seq *s = pick(w, take(in));
    uint32_t a = take(in);
    if (s == NULL) return;
    int64_t len = (int64_t)a % (s->len + 2); /* may be past the end */
    kvp_page_op_t op;
    int32_t nops;
    int rc = kvp_table_truncate(w->t, s->id, len, &op, 1, &nops);
    if (len > s->len) {
        FZ_ASSERT(rc == KVP_EINVAL);
        return;
    }
    FZ_ASSERT(rc == KVP_OK);
    run_ops(w, &op, nops);
    s->len = len;
}

static void do_fork(fz_world *w, fz_bytes *in) {
    fz_seq *s = pick(w, take(in)), *c = free_slot(w);
    if (s == NULL || c == NULL) return;
    kvp_page_op_t op;
    int32_t nops, id;
    int rc = kvp_table_fork(w->t, s->id, &id, &op, 1, &nops);
    FZ_ASSERT(rc == KVP_OK || rc == KVP_ENOSPC || rc == KVP_ENOMEM);
    if (rc != KVP_OK) return;
    run_ops(w, &op, nops);
    *c = *s;
    c->id = id;
}

static void do_release(fz_world *w, fz_bytes *in) {
    uint32_t a = take(in);
    fz_seq *s = pick(w, a);
    if (s == NULL) return;
    FZ_ASSERT(kvp_table_seq_release(w->t, s->id) == KVP_OK);
    w->stale[a % 4] = s->id;
    s->live = false;
}

static void do_attach(fz_world *w, fz_bytes *in) {
    fz_seq *s = free_slot(w);
    uint32_t a = take(in);
    if (s == NULL) return;
    do_create(w, in);
    if (!s->live) return;
    int64_t n = a % FZ_LEN;
    int32_t toks[FZ_LEN];
    for (int64_t i = 0; i < n; i++) toks[i] = (int32_t)((i * (a & 3)) & 7);
    int64_t looked, m;
    FZ_ASSERT(kvp_table_lookup_prefix(w->t, s->salt, toks, n, &looked) == KVP_OK);
    int rc = kvp_table_attach_prefix(w->t, s->id, toks, n, &m);
    FZ_ASSERT(rc == KVP_OK || rc == KVP_ENOMEM);
    if (rc != KVP_OK) return;
    FZ_ASSERT(m <= looked && m % w->P == 0);
    memcpy(s->toks, toks, (size_t)m * sizeof *toks);
    s->len = m;
}

static void do_engine(fz_world *w, fz_bytes *in) {
    uint32_t a = take(in);
    if (w->nengine > 0 && (a & 1)) {
        int i = (int)(a >> 1) % w->nengine;
        FZ_ASSERT(kvp_pool_release(w->pool, 1, &w->engine[i]) == KVP_OK);
        int32_t page = w->engine[i];
        w->engine[i] = w->engine[--w->nengine];
        bool held = false; /* a second release of the same reference must fail */
        for (int k = 0; k < w->nengine; k++) held |= w->engine[k] == page;
        if (!held) FZ_ASSERT(kvp_pool_release(w->pool, 1, &page) == KVP_EINVAL);
    } else if (w->nengine < 8) {
        int32_t page;
        int rc = kvp_pool_alloc(w->pool, 1, &page);
        FZ_ASSERT(rc == KVP_OK || rc == KVP_ENOSPC);
        if (rc == KVP_OK) w->engine[w->nengine++] = page;
    }
}

static void do_misc(fz_world *w, fz_bytes *in) {
    uint32_t a = take(in), b = take(in);
    fz_seq *s = pick(w, b);
    switch (a % 6) {
    case 0: { /* stale and bogus ids are rejected */
        int32_t id = (a & 8) ? w->stale[b % 4] : (int32_t)(b * 2654435761u);
        bool live = false;
        for (int i = 0; i < FZ_SEQS; i++) live |= w->seqs[i].live && w->seqs[i].id == id;
        if (!live) FZ_ASSERT(kvp_table_seq_release(w->t, id) == KVP_ENOENT);
        break;
    }
    case 1: {
        int32_t evicted;
        FZ_ASSERT(kvp_pool_evict(w->pool, (int32_t)(b % 4), &evicted) == KVP_OK);
        break;
    }
    case 2:
        if (s) FZ_ASSERT(kvp_table_set_priority(w->t, s->id, (int32_t)(b & 7) - 3) == KVP_OK);
        break;
    case 3:
        if (s) {
            int64_t x = b % (s->len + 1);
            FZ_ASSERT(kvp_table_set_range_priority(w->t, s->id, x / 2, x, (int32_t)b) == KVP_OK);
        }
        break;
    case 4:
        if (s) {
            int rc = kvp_table_reserve(w->t, s->id, b % (2 * w->P + 1));
            FZ_ASSERT(rc == KVP_OK || rc == KVP_ENOSPC || rc == KVP_ENOMEM);
        }
        break;
    default:
        w->alloc.countdown = b % 3; /* fail one of the next allocations */
        break;
    }
}

/* Host tier: swap out, swap in, drop; a swapped-out sequence refuses the
 * table's calls and the wrong swap direction. */
static void do_tier(fz_world *w, fz_bytes *in) {
    uint32_t a = take(in), b = take(in);
    kvp_page_op_t ops[FZ_LEN + FZ_SEQS];
    int32_t nops = -1;
    kvp_tier_seq_info_t info = {.struct_size = sizeof info};
    fz_seq *s;
    int rc;
    switch (a % 4) {
    case 0:
        if ((s = pick(w, b)) == NULL) return;
        FZ_ASSERT(kvp_tier_seq_info(w->tier, s->id, &info) == KVP_OK && !info.swapped);
        rc = kvp_tier_swap_out(w->tier, s->id, ops, info.ops, &nops);
        /* full, or an injected allocation failure: nothing changed (verified) */
        FZ_ASSERT(rc == KVP_OK || rc == KVP_EHOSTFULL || rc == KVP_ENOMEM);
        if (rc == KVP_OK) {
            FZ_ASSERT(nops == info.ops);
            run_ops(w, ops, nops);
            s->swapped = true;
        }
        break;
    case 1:
        if ((s = pick_in(w, b, true)) == NULL) return;
        FZ_ASSERT(kvp_tier_seq_info(w->tier, s->id, &info) == KVP_OK && info.swapped);
        rc = kvp_tier_swap_in(w->tier, s->id, ops, info.ops, &nops);
        FZ_ASSERT(rc == KVP_OK || rc == KVP_ENOSPC);
        if (rc == KVP_OK) {
            run_ops(w, ops, nops);
            s->swapped = false;
        }
        break;
    case 2:
        if ((s = pick_in(w, b, (a & 4) != 0)) == NULL) return;
        FZ_ASSERT(kvp_tier_drop(w->tier, s->id) == KVP_OK);
        w->stale[b % 4] = s->id;
        s->live = false;
        break;
    default: {
        int64_t slots[1];
        int32_t child;
        if ((s = pick_in(w, b, true)) != NULL) {
            FZ_ASSERT(kvp_table_append(w->t, s->id, 1, NULL, slots, ops, 2, &nops) == KVP_ESTATE);
            FZ_ASSERT(kvp_table_reserve(w->t, s->id, 1) == KVP_ESTATE);
            FZ_ASSERT(kvp_table_fork(w->t, s->id, &child, ops, 1, &nops) == KVP_ESTATE);
            FZ_ASSERT(kvp_table_truncate(w->t, s->id, 0, ops, 1, &nops) == KVP_ESTATE);
            FZ_ASSERT(kvp_table_seq_release(w->t, s->id) == KVP_ESTATE);
            FZ_ASSERT(kvp_tier_swap_out(w->tier, s->id, ops, FZ_LEN, &nops) == KVP_ESTATE);
        }
        if ((s = pick(w, b)) != NULL)
            FZ_ASSERT(kvp_tier_swap_in(w->tier, s->id, ops, FZ_LEN, &nops) == KVP_ESTATE);
        break;
    }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const int32_t page_sizes[6] = {1, 2, 3, 4, 8, 16};
    fz_bytes in = fzi_make(data, size);
    static fz_world w;
    memset(&w, 0, sizeof w);
    w.P = page_sizes[take(&in) % 6];
    w.N = 1 + (int32_t)(take(&in) % FZ_MAX_PAGES);
    w.S = (int32_t)(take(&in) % (FZ_SEQS + 1));
    uint32_t flags = take(&in);
    w.alloc.countdown = -1;
    kvp_allocator_t hooks = {fzi_malloc, fzi_free, &w.alloc};
    kvp_pool_params_t pp;
    kvp_pool_params_init(&pp);
    pp.page_size = w.P;
    pp.num_pages = w.N;
    pp.num_staging = w.S;
    pp.prefix_cache = (int32_t)(flags & 1);
    pp.allocator = hooks; /* the table allocates through the pool's hooks */
    char err[KVP_ERR_SIZE];
    FZ_ASSERT(kvp_pool_create(&pp, &w.pool, err, sizeof err) == KVP_OK);
    if (flags & 2) kvp__pool_set_hash_mask(w.pool, flags >> 6); /* 0..3: collisions */
    FZ_ASSERT(kvp_table_create(w.pool, FZ_SEQS, &w.t, err, sizeof err) == KVP_OK);
    for (int i = 0; i < 4; i++) w.stale[i] = -1;
    if (flags & 4) { /* a host tier of 2..23 slots; int8 keys need staging pages */
        w.layout.struct_size = sizeof w.layout;
        int32_t f = w.S > 0 ? KVP_FORMAT_INT8 : KVP_FORMAT_FP16;
        FZ_ASSERT(kvp_layout_compute(1, 1, 64, w.P, f, f, &w.layout, err, sizeof err) == KVP_OK);
        kvp_tier_params_t tp2;
        kvp_tier_params_init(&tp2);
        tp2.layout = &w.layout;
        tp2.allocator = hooks;
        uint64_t slot = (w.layout.page_bytes + KVP_ARENA_ALIGN - 1) / KVP_ARENA_ALIGN * KVP_ARENA_ALIGN;
        tp2.host_bytes = slot * (2 + 3 * ((flags >> 3) & 7));
        FZ_ASSERT(kvp_tier_create(w.t, &tp2, &w.tier, err, sizeof err) == KVP_OK);
        kvp_tier_stats_t ts = {.struct_size = sizeof ts};
        FZ_ASSERT(kvp_tier_stats(w.tier, &ts) == KVP_OK && ts.slot_bytes == slot);
        w.slot_bytes = slot;
    }

    while (in.n > 0) {
        switch (take(&in) % 9) {
        case 0: do_create(&w, &in); break;
        case 1:
        case 2: do_append(&w, &in); break;
        case 3: do_truncate(&w, &in); break;
        case 4: do_fork(&w, &in); break;
        case 5: do_release(&w, &in); break;
        case 6: do_attach(&w, &in); break;
        case 7: do_engine(&w, &in); break;
        default:
            if (w.tier != NULL && (take(&in) & 1)) do_tier(&w, &in);
            else do_misc(&w, &in);
            break;
        }
        verify(&w);
    }
    w.alloc.countdown = -1;
    kvp_tier_destroy(w.tier); /* drops what is still swapped out */
    kvp_table_destroy(w.t);
    kvp_pool_stats_t st = {.struct_size = sizeof st};
    FZ_ASSERT(kvp_pool_stats(w.pool, &st) == KVP_OK);
    FZ_ASSERT(st.used_pages == w.nengine); /* only the engine's pages remain */
    FZ_ASSERT(kvp_pool_release(w.pool, w.nengine, w.engine) == KVP_OK);
    FZ_ASSERT(kvp_pool_stats(w.pool, &st) == KVP_OK && st.used_pages == 0 &&
              st.reserved_pages == 0 && st.live_tokens == 0);
    kvp_pool_destroy(w.pool);
    FZ_ASSERT(w.alloc.live == 0); /* everything allocated was freed */
    return 0;
}
