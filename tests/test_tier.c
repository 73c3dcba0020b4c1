/*
 * Layer: tier — swap out / swap in / drop against a fake storage (the bytes
 * of every pool and staging page, sized by kvp_layout_compute()), through
 * page I/O and through returned operations.
 *
 *   - round trips are bit-exact for every page kind (full pages, a partly
 *     filled tail page, staging pages split in chunks, forked and
 *     prefix-shared pages) and every format family;
 *   - shared pages are kept by reference: never copied, never freed under
 *     another user; cached pages found unchanged are attached, not copied;
 *   - a full host tier, a failing page I/O, an allocation failure and bad
 *     input get a clear status and change nothing;
 *   - behind the real CPU store (page I/O over its regions), quantized pages,
 *     scales and staging pages come back bit for bit;
 *   - a random differential test (table + tier + storage) against a model
 *     of every sequence's token values, with the invariant checks after
 *     every operation.
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>

#include "kvpage_ext.h"
#include "kvpage_plan.h"
#include "kvpage_tier.h"
#include "paging.h"
#include "testutil.h"

/* ---- a fake storage: every page's bytes ------------------------------------ */

typedef struct {
    kvp_layout_t l;
    int32_t P, num_pages, num_staging;
    uint8_t *mem;
    uint64_t rng;
    long io_calls, io_fail_at; /* fail the call with this index; -1 never */
    long copies;
    uint8_t *host;             /* the tier's host memory (operations mode) */
    uint64_t slot_bytes;
} store_t;

static uint64_t xs(uint64_t *r) {
    *r ^= *r << 13;
    *r ^= *r >> 7;
    *r ^= *r << 17;
    return *r;
}

static uint64_t bytes_of(const store_t *st, int32_t page) {
    return page < st->num_pages ? st->l.page_bytes : st->l.staging_page_bytes;
}

static uint8_t *page_at(store_t *st, int32_t page) {
    assert_true(page >= 0 && page < st->num_pages + st->num_staging);
    if (page < st->num_pages) return st->mem + (size_t)page * st->l.page_bytes;
    return st->mem + (size_t)st->num_pages * st->l.page_bytes +
           (size_t)(page - st->num_pages) * st->l.staging_page_bytes;
}

/* Token row `r` of a page: a uint32 at r x (bytes / P); the rest of the page
 * (the "scales") is whatever the last writer left. */
static uint32_t *row_at(store_t *st, int32_t page, int32_t r) {
    return (uint32_t *)(void *)(page_at(st, page) + (size_t)r * (bytes_of(st, page) / (uint64_t)st->P / 4 * 4));
}

static void scribble(store_t *st, int32_t page) {
    memset(page_at(st, page), (int)(xs(&st->rng) & 0xff), bytes_of(st, page));
}

static void store_init(store_t *st, int32_t layers, int32_t heads, int32_t dim, int32_t P,
                       int32_t kf, int32_t vf, int32_t num_pages, int32_t num_staging) {
    memset(st, 0, sizeof *st);
    st->l.struct_size = sizeof st->l;
    assert_int_equal(kvp_layout_compute(layers, heads, dim, P, kf, vf, &st->l, NULL, 0), KVP_OK);
    st->P = P;
    st->num_pages = num_pages;
    st->num_staging = st->l.needs_staging ? num_staging : 0;
    size_t total = (size_t)num_pages * st->l.page_bytes +
                   (size_t)st->num_staging * st->l.staging_page_bytes;
    st->mem = malloc(total);
    assert_non_null(st->mem);
    st->rng = 0x9e3779b97f4a7c15ull ^ (uint64_t)(kf * 7 + vf);
    for (int32_t p = 0; p < num_pages + st->num_staging; p++) scribble(st, p);
    st->io_fail_at = -1;
}

/* Overwrite every free page: data must never be read from a page after it
 * was given back and the operations of that call were executed. */
static void scribble_free(store_t *st, kvp_pool_t *pool) {
    for (int32_t p = 0; p < pool->num_pages; p++)
        if (pool->pages[p].state == KVP__PAGE_FREE) scribble(st, p);
    for (int32_t s = 0; s < pool->num_staging; s++)
        if (pool->staging[s].next != KVP__IN_USE) scribble(st, pool->num_pages + s);
}

static int io_out(void *o, int32_t page, uint64_t off, void *dst, uint64_t n) {
    store_t *st = o;
    if (st->io_calls++ == st->io_fail_at) return KVP_ECUDA;
    assert_true(off + n <= bytes_of(st, page));
    memcpy(dst, page_at(st, page) + off, n);
    st->copies++;
    return KVP_OK;
}

static int io_in(void *o, int32_t page, uint64_t off, const void *src, uint64_t n) {
    store_t *st = o;
    if (st->io_calls++ == st->io_fail_at) return KVP_ECUDA;
    assert_true(off + n <= bytes_of(st, page));
    memcpy(page_at(st, page) + off, src, n);
    st->copies++;
    return KVP_OK;
}

static kvp_page_io_t page_io(store_t *st) {
    kvp_page_io_t io;
    memset(&io, 0, sizeof io);
    io.struct_size = sizeof io;
    io.copy_to_host = io_out;
    io.copy_from_host = io_in;
    io.opaque = st;
    return io;
}

/* Execute page operations on the storage, as an engine would. Row values of
 * an append are written afterwards by write_rows. */
static void exec_ops(store_t *st, const kvp_page_op_t *ops, int32_t n) {
    for (int32_t i = 0; i < n; i++) {
        const kvp_page_op_t *op = &ops[i];
        switch (op->kind) {
        case KVP_OP_COPY:
            assert_int_equal(bytes_of(st, op->src), bytes_of(st, op->dst));
            memcpy(page_at(st, op->dst), page_at(st, op->src), bytes_of(st, op->src));
            break;
        case KVP_OP_SEAL:
            scribble(st, op->dst); /* new scales */
            for (int32_t r = 0; r < op->count; r++)
                *row_at(st, op->dst, r) = *row_at(st, op->src, r);
            break;
        case KVP_OP_UNSEAL:
            for (int32_t r = 0; r < op->count; r++)
                *row_at(st, op->dst, r) = *row_at(st, op->src, r);
            break;
        case KVP_OP_SWAP_OUT: {
            uint64_t off = (uint64_t)op->row * st->slot_bytes, left = bytes_of(st, op->src) - off;
            memcpy(st->host + (size_t)op->dst * st->slot_bytes, page_at(st, op->src) + off,
                   left < st->slot_bytes ? left : st->slot_bytes);
            st->copies++;
            break;
        }
        case KVP_OP_SWAP_IN: {
            uint64_t off = (uint64_t)op->row * st->slot_bytes, left = bytes_of(st, op->dst) - off;
            memcpy(page_at(st, op->dst) + off, st->host + (size_t)op->src * st->slot_bytes,
                   left < st->slot_bytes ? left : st->slot_bytes);
            st->copies++;
            break;
        }
        default: fail_msg("unknown op kind %d", op->kind);
        }
    }
}

static void write_rows(store_t *st, const int64_t *slots, const uint32_t *vals, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        *row_at(st, (int32_t)(slots[i] / st->P), (int32_t)(slots[i] % st->P)) = vals[i];
}

/* ---- fixture: pool + table + tier + storage ---------------------------------- */

typedef struct {
    store_t st;
    kvp_pool_t *pool;
    kvp_table_t *t;
    kvp_tier_t *tier;
    kvp_page_io_t io;
    bool ops_mode;
} fix_t;

typedef struct {
    int32_t kf, vf, P, pages, staging, slots;
    bool ops_mode, prefix;
} cfg_t;

static void fix_init(fix_t *f, const cfg_t *c, kvp_allocator_t *a) {
    memset(f, 0, sizeof *f);
    store_init(&f->st, 2, 2, 64, c->P, c->kf, c->vf, c->pages, c->staging);
    kvp_pool_params_t pp;
    kvp_pool_params_init(&pp);
    pp.page_size = c->P;
    pp.num_pages = c->pages;
    pp.num_staging = f->st.num_staging;
    pp.prefix_cache = c->prefix ? 1 : 0;
    if (a != NULL) pp.allocator = *a; /* the table's too */
    char err[KVP_ERR_SIZE];
    assert_int_equal(kvp_pool_create(&pp, &f->pool, err, sizeof err), KVP_OK);
    assert_int_equal(kvp_table_create(f->pool, 16, &f->t, err, sizeof err), KVP_OK);
    f->io = page_io(&f->st);
    f->ops_mode = c->ops_mode;
    kvp_tier_params_t p;
    kvp_tier_params_init(&p);
    p.layout = &f->st.l;
    p.host_bytes = (uint64_t)c->slots * kvp__round_up_u64(f->st.l.page_bytes, KVP_ARENA_ALIGN);
    p.page_io = c->ops_mode ? NULL : &f->io;
    if (a != NULL) p.allocator = *a;
    int rc = kvp_tier_create(f->t, &p, &f->tier, err, sizeof err);
    if (rc != KVP_OK) print_error("tier: %s\n", err);
    assert_int_equal(rc, KVP_OK);
    kvp_tier_stats_t ts = {.struct_size = sizeof ts};
    assert_int_equal(kvp_tier_stats(f->tier, &ts), KVP_OK);
    assert_int_equal(ts.total_slots, c->slots);
    uint64_t bytes;
    void *base;
    assert_int_equal(kvp_tier_host_memory(f->tier, &base, &bytes), KVP_OK);
    assert_int_equal(bytes, ts.host_bytes);
    assert_int_equal((uintptr_t)base % KVP_ARENA_ALIGN, 0);
    f->st.host = base;
    f->st.slot_bytes = ts.slot_bytes;
}

static void fix_check(fix_t *f) {
    char err[KVP_ERR_SIZE];
    int rc = kvp__tier_check(f->tier, err, sizeof err);
    if (rc != KVP_OK) print_error("invariant: %s\n", err);
    assert_int_equal(rc, KVP_OK);
}

static void fix_done(fix_t *f) {
    fix_check(f);
    kvp_tier_destroy(f->tier);
    kvp_table_destroy(f->t);
    kvp_pool_stats_t s = {.struct_size = sizeof s};
    assert_int_equal(kvp_pool_stats(f->pool, &s), KVP_OK);
    assert_int_equal(s.used_pages, 0);
    assert_int_equal(s.used_staging, 0);
    assert_int_equal(s.live_tokens, 0);
    kvp_pool_destroy(f->pool);
    free(f->st.mem);
}

/* Token values: a running hash of the token ids, so equal prefixes have
 * equal K/V (what makes the prefix cache's reuse correct). */
static uint32_t chain(uint32_t prev, int32_t tok) {
    uint64_t x = ((uint64_t)prev << 32 | (uint32_t)tok) * 0x9e3779b97f4a7c15ull;
    return (uint32_t)(x >> 29) | 1u;
}

/* Append `n` tokens (ids `tok`) after values `vals[0..len)`; the new values
 * go to vals[len..]. Executes the operations and writes the rows. */
static int append(fix_t *f, int32_t seq, int64_t len, const int32_t *tok, int64_t n,
                  uint32_t *vals) {
    int64_t slots[512];
    kvp_page_op_t ops[130];
    int32_t nops = 0;
    assert_true(n <= 512);
    int rc = kvp_table_append(f->t, seq, n, tok, slots, ops, 130, &nops);
    if (rc != KVP_OK) return rc;
    for (int64_t i = 0; i < n; i++) vals[len + i] = chain(len + i > 0 ? vals[len + i - 1] : 7, tok[i]);
    exec_ops(&f->st, ops, nops);
    write_rows(&f->st, slots, vals + len, n);
    return KVP_OK;
}

/* Check a resident sequence's token values through its page list. */
static void check_values(fix_t *f, int32_t seq, const uint32_t *vals, int64_t len) {
    kvp_seq_info_t info = {.struct_size = sizeof info};
    assert_int_equal(kvp_table_seq_info(f->t, seq, &info), KVP_OK);
    assert_int_equal(info.length, len);
    assert_int_equal(info.swapped, 0);
    int32_t pages[256];
    assert_int_equal(kvp_table_seq_pages(f->t, seq, pages, 256), KVP_OK);
    for (int64_t i = 0; i < len; i++) {
        uint32_t got = *row_at(&f->st, pages[i / f->st.P], (int32_t)(i % f->st.P));
        if (got != vals[i])
            print_error("seq %d token %lld: page %d row %d holds %08x, expected %08x\n",
                        (int)seq, (long long)i, (int)pages[i / f->st.P], (int)(i % f->st.P),
                        got, vals[i]);
        assert_int_equal(got, vals[i]);
    }
}

/* Whole-page bytes of a resident sequence, in page-list order. */
typedef struct {
    uint8_t *bytes;
    int32_t n;
    int32_t pages[256];
} snap_t;

static void snapshot(fix_t *f, int32_t seq, snap_t *s) {
    kvp_seq_info_t info = {.struct_size = sizeof info};
    assert_int_equal(kvp_table_seq_info(f->t, seq, &info), KVP_OK);
    s->n = info.num_pages;
    assert_int_equal(kvp_table_seq_pages(f->t, seq, s->pages, 256), KVP_OK);
    size_t total = 0;
    for (int32_t i = 0; i < s->n; i++) total += bytes_of(&f->st, s->pages[i]);
    s->bytes = malloc(total + 1);
    assert_non_null(s->bytes);
    total = 0;
    for (int32_t i = 0; i < s->n; i++) {
        memcpy(s->bytes + total, page_at(&f->st, s->pages[i]), bytes_of(&f->st, s->pages[i]));
        total += bytes_of(&f->st, s->pages[i]);
    }
}

static void assert_same_bytes(fix_t *f, int32_t seq, snap_t *before) {
    snap_t now;
    snapshot(f, seq, &now);
    assert_int_equal(now.n, before->n);
    size_t at = 0;
    for (int32_t i = 0; i < now.n; i++) {
        uint64_t n = bytes_of(&f->st, now.pages[i]);
        assert_int_equal(n, bytes_of(&f->st, before->pages[i]));
        if (memcmp(now.bytes + at, before->bytes + at, n) != 0)
            fail_msg("seq %d page #%d (id %d, was %d): bytes differ after the round trip",
                     (int)seq, (int)i, (int)now.pages[i], (int)before->pages[i]);
        at += n;
    }
    free(now.bytes);
    free(before->bytes);
    before->bytes = NULL;
}

static int swap_out(fix_t *f, int32_t seq) {
    kvp_page_op_t ops[300];
    int32_t n = -1;
    int rc = kvp_tier_swap_out(f->tier, seq, f->ops_mode ? ops : NULL, f->ops_mode ? 300 : 0, &n);
    if (rc == KVP_OK) {
        if (f->ops_mode) exec_ops(&f->st, ops, n);
        else assert_int_equal(n, 0);
        scribble_free(&f->st, f->pool);
    }
    return rc;
}

static int swap_in(fix_t *f, int32_t seq) {
    kvp_page_op_t ops[300];
    int32_t n = -1;
    int rc = kvp_tier_swap_in(f->tier, seq, f->ops_mode ? ops : NULL, f->ops_mode ? 300 : 0, &n);
    if (rc == KVP_OK) {
        if (f->ops_mode) exec_ops(&f->st, ops, n);
        else assert_int_equal(n, 0);
        scribble_free(&f->st, f->pool);
    }
    return rc;
}

static int32_t new_seq(fix_t *f) {
    int32_t id = -1;
    assert_int_equal(kvp_table_seq_create(f->t, 0, 0, &id), KVP_OK);
    return id;
}

static int32_t refcount(fix_t *f, int32_t page) {
    int32_t r = -1;
    assert_int_equal(kvp_pool_refcount(f->pool, page, &r), KVP_OK);
    return r;
}

static kvp_tier_stats_t tstats(fix_t *f) {
    kvp_tier_stats_t s;
    memset(&s, 0, sizeof s);
    s.struct_size = sizeof s;
    assert_int_equal(kvp_tier_stats(f->tier, &s), KVP_OK);
    return s;
}

static kvp_pool_stats_t pstats(fix_t *f) {
    kvp_pool_stats_t s;
    memset(&s, 0, sizeof s);
    s.struct_size = sizeof s;
    assert_int_equal(kvp_pool_stats(f->pool, &s), KVP_OK);
    return s;
}

static int32_t toks[1024];
static void setup_tokens(void) {
    for (int i = 0; i < 1024; i++) toks[i] = 100 + i;
}

static const int32_t formats[][2] = {
    {KVP_FORMAT_FP16, KVP_FORMAT_FP16}, {KVP_FORMAT_BF16, KVP_FORMAT_FP8_E4M3},
    {KVP_FORMAT_INT8, KVP_FORMAT_INT8}, {KVP_FORMAT_INT4, KVP_FORMAT_INT4},
    {KVP_FORMAT_INT8, KVP_FORMAT_INT4}, {KVP_FORMAT_FP32, KVP_FORMAT_FP32},
};
#define NFORMATS ((int)(sizeof formats / sizeof formats[0]))

/* ---- round trips: every page kind, every format family, both modes ------------ */

static void round_trip_kinds(const cfg_t *c) {
    fix_t f;
    fix_init(&f, c, NULL);
    int32_t P = c->P;
    static uint32_t va[600], vb[600], vc[600], vd[600];
    /* a: full pages only; b: a partly filled tail; c: a fork of b that grew;
     * d: shares a's prefix through the prefix cache */
    int32_t a = new_seq(&f), b = new_seq(&f);
    assert_int_equal(append(&f, a, 0, toks, 3 * P, va), KVP_OK);
    assert_int_equal(append(&f, b, 0, toks + 500, 2 * P + 3, vb), KVP_OK);
    int32_t cseq = -1, nops = 0;
    kvp_page_op_t op;
    assert_int_equal(kvp_table_fork(f.t, b, &cseq, &op, 1, &nops), KVP_OK);
    exec_ops(&f.st, &op, nops);
    memcpy(vc, vb, sizeof vb);
    assert_int_equal(append(&f, cseq, 2 * P + 3, toks + 700, P, vc), KVP_OK);
    int32_t d = new_seq(&f);
    int64_t matched = 0;
    assert_int_equal(kvp_table_attach_prefix(f.t, d, toks, 2 * P + 1, &matched), KVP_OK);
    assert_int_equal(matched, c->prefix ? 2 * P : 0);
    memcpy(vd, va, sizeof va);
    assert_int_equal(append(&f, d, matched, toks + matched, 2 * P + 1 - matched, vd), KVP_OK);
    fix_check(&f);

    int32_t seqs[4] = {a, b, cseq, d};
    uint32_t *vals[4] = {va, vb, vc, vd};
    int64_t lens[4] = {3 * P, 2 * P + 3, 3 * P + 3, 2 * P + 1};
    snap_t snaps[4];
    for (int k = 0; k < 4; k++) snapshot(&f, seqs[k], &snaps[k]);
    int32_t b_pages[16];
    assert_int_equal(kvp_table_seq_pages(f.t, b, b_pages, 16), KVP_OK);

    /* Swap b out: the pages it shares with its fork stay, with the fork's
     * reference and its own. */
    kvp_tier_seq_info_t ti = {.struct_size = sizeof ti};
    assert_int_equal(kvp_tier_seq_info(f.tier, b, &ti), KVP_OK);
    assert_int_equal(ti.swapped, 0);
    assert_true(ti.shared_pages >= 2);
    kvp_tier_stats_t before = tstats(&f);
    assert_int_equal(swap_out(&f, b), KVP_OK);
    kvp_tier_stats_t after = tstats(&f);
    assert_int_equal(after.free_slots, before.free_slots - ti.host_slots);
    assert_int_equal(after.pages_kept - before.pages_kept, ti.shared_pages);
    for (int32_t i = 0; i < 2; i++) assert_int_equal(refcount(&f, b_pages[i]), 2);
    kvp_seq_info_t si = {.struct_size = sizeof si};
    assert_int_equal(kvp_table_seq_info(f.t, b, &si), KVP_OK);
    assert_int_equal(si.swapped, 1);
    assert_int_equal(si.staging_page, -1);
    assert_int_equal(si.length, 2 * P + 3);
    check_values(&f, cseq, vc, lens[2]); /* the fork is untouched */
    fix_check(&f);

    /* Everything else out too, then other work reuses the freed pages. */
    for (int k = 0; k < 4; k++)
        if (k != 1) assert_int_equal(swap_out(&f, seqs[k]), KVP_OK);
    kvp_pool_stats_t ps = pstats(&f);
    assert_int_equal(ps.live_tokens, 0);
    int32_t junk = new_seq(&f);
    static uint32_t vj[600];
    int64_t room = (ps.available_pages - 1) * P;
    assert_int_equal(append(&f, junk, 0, toks + 300, room, vj), KVP_OK);
    fix_check(&f);
    assert_int_equal(kvp_table_seq_release(f.t, junk), KVP_OK);
    scribble_free(&f.st, f.pool);

    /* Back in, in another order: every byte of every page as before. */
    int order[4] = {3, 1, 0, 2};
    for (int k = 0; k < 4; k++) {
        int s = order[k];
        assert_int_equal(swap_in(&f, seqs[s]), KVP_OK);
        assert_same_bytes(&f, seqs[s], &snaps[s]);
        check_values(&f, seqs[s], vals[s], lens[s]);
        fix_check(&f);
    }
    assert_int_equal(tstats(&f).free_slots, c->slots);
    /* They work as before: appends after the round trip. */
    assert_int_equal(append(&f, b, lens[1], toks + 900, P + 1, vb), KVP_OK);
    check_values(&f, b, vb, lens[1] + P + 1);
    check_values(&f, cseq, vc, lens[2]);
    fix_done(&f);
}

static void test_round_trip_every_format(void **state) {
    (void)state;
    setup_tokens();
    for (int fmt = 0; fmt < NFORMATS; fmt++)
        for (int mode = 0; mode < 2; mode++)
            for (int prefix = 0; prefix < 2; prefix++) {
                cfg_t c = {formats[fmt][0], formats[fmt][1], 4, 48, 8, 64, mode == 1,
                           prefix == 1};
                round_trip_kinds(&c);
            }
}

/* A staging page larger than a slot moves in chunks; a staging page with no
 * token moves nothing. */
static void test_staging_chunks(void **state) {
    (void)state;
    setup_tokens();
    for (int mode = 0; mode < 2; mode++) {
        cfg_t c = {KVP_FORMAT_INT4, KVP_FORMAT_INT4, 4, 16, 4, 16, mode == 1, true};
        fix_t f;
        fix_init(&f, &c, NULL);
        kvp_tier_stats_t ts = tstats(&f);
        assert_int_equal(ts.staging_chunks,
                         (int32_t)((f.st.l.staging_page_bytes + ts.slot_bytes - 1) / ts.slot_bytes));
        assert_true(ts.staging_chunks >= 2);
        assert_int_equal(ts.staging_bytes, ts.staging_chunks * ts.slot_bytes);
        static uint32_t v[64];
        int32_t s = new_seq(&f);
        assert_int_equal(append(&f, s, 0, toks, 6, v), KVP_OK); /* 1 page + 2 in staging */
        snap_t snap;
        snapshot(&f, s, &snap);
        kvp_page_op_t ops[16];
        int32_t n = 0;
        if (mode == 1) {
            assert_int_equal(kvp_tier_swap_out(f.tier, s, ops, 16, &n), KVP_OK);
            assert_int_equal(n, 1 + ts.staging_chunks);
            assert_int_equal(ops[0].kind, KVP_OP_SWAP_OUT);
            assert_int_equal(ops[0].count, 4);
            assert_int_equal(ops[0].row, 0);
            for (int32_t j = 0; j < ts.staging_chunks; j++) {
                assert_int_equal(ops[1 + j].kind, KVP_OP_SWAP_OUT);
                assert_true(ops[1 + j].src >= f.pool->num_pages);
                assert_int_equal(ops[1 + j].count, 2);
                assert_int_equal(ops[1 + j].row, j);
            }
            exec_ops(&f.st, ops, n);
        } else {
            long copies = f.st.copies;
            assert_int_equal(swap_out(&f, s), KVP_OK);
            assert_int_equal(f.st.copies - copies, 1 + ts.staging_chunks);
        }
        assert_int_equal(tstats(&f).free_slots, 16 - 1 - ts.staging_chunks);
        assert_int_equal(tstats(&f).bytes_out, f.st.l.page_bytes + f.st.l.staging_page_bytes);
        assert_int_equal(pstats(&f).used_staging, 0); /* the staging page moved */
        scribble_free(&f.st, f.pool);
        assert_int_equal(swap_in(&f, s), KVP_OK);
        assert_same_bytes(&f, s, &snap);
        check_values(&f, s, v, 6);
        /* a length that is a multiple of the page size: the staging page is empty */
        assert_int_equal(append(&f, s, 6, toks + 6, 2, v), KVP_OK);
        kvp_tier_seq_info_t ti = {.struct_size = sizeof ti};
        assert_int_equal(kvp_tier_seq_info(f.tier, s, &ti), KVP_OK);
        assert_int_equal(ti.staging, 0);
        assert_int_equal(ti.host_slots, 2);
        assert_int_equal(ti.ops, mode == 1 ? 2 : 0);
        assert_int_equal(ti.copy_bytes, 2 * f.st.l.page_bytes);
        assert_int_equal(swap_out(&f, s), KVP_OK);
        assert_int_equal(tstats(&f).free_slots, 14);
        assert_int_equal(swap_in(&f, s), KVP_OK);
        check_values(&f, s, v, 8);
        fix_done(&f);
    }
}

/* Shared pages: never copied, never freed under another user, whoever swaps. */
static void test_shared_pages_kept(void **state) {
    (void)state;
    setup_tokens();
    cfg_t c = {KVP_FORMAT_FP16, KVP_FORMAT_FP16, 4, 32, 0, 32, false, true};
    fix_t f;
    fix_init(&f, &c, NULL);
    static uint32_t vp[64], vc[64];
    int32_t parent = new_seq(&f);
    assert_int_equal(append(&f, parent, 0, toks, 10, vp), KVP_OK);
    int32_t child = -1, n = 0;
    assert_int_equal(kvp_table_fork(f.t, parent, &child, NULL, 0, &n), KVP_OK);
    memcpy(vc, vp, sizeof vp);
    int32_t pages[8];
    assert_int_equal(kvp_table_seq_pages(f.t, parent, pages, 8), KVP_OK);
    long copies = f.st.copies;
    kvp_pool_stats_t ps0 = pstats(&f);
    /* both out: every page is shared, nothing moves and nothing is freed */
    assert_int_equal(swap_out(&f, parent), KVP_OK);
    assert_int_equal(swap_out(&f, child), KVP_OK);
    assert_int_equal(f.st.copies, copies);
    assert_int_equal(tstats(&f).free_slots, 32);
    assert_int_equal(tstats(&f).pages_kept, 6);
    assert_int_equal(pstats(&f).used_pages, ps0.used_pages);
    for (int i = 0; i < 3; i++) assert_int_equal(refcount(&f, pages[i]), 2);
    /* the child comes back, diverges (copy-on-write of the shared tail) and
     * leaves: the parent's pages are still there, held by it alone */
    assert_int_equal(swap_in(&f, child), KVP_OK);
    assert_int_equal(append(&f, child, 10, toks + 40, 3, vc), KVP_OK);
    check_values(&f, child, vc, 13);
    assert_int_equal(refcount(&f, pages[2]), 1); /* the tail was copied on write */
    assert_int_equal(kvp_table_seq_release(f.t, child), KVP_OK);
    for (int i = 0; i < 3; i++) assert_int_equal(refcount(&f, pages[i]), 1);
    fix_check(&f);
    scribble_free(&f.st, f.pool);
    assert_int_equal(swap_in(&f, parent), KVP_OK);
    check_values(&f, parent, vp, 10);
    /* now private: a swap-out copies them */
    copies = f.st.copies;
    assert_int_equal(swap_out(&f, parent), KVP_OK);
    assert_int_equal(f.st.copies - copies, 3);
    assert_int_equal(swap_in(&f, parent), KVP_OK);
    check_values(&f, parent, vp, 10);
    fix_done(&f);
}

/* Private pages in the prefix cache: copied out, left cached for other
 * prompts, attached again (no copy) when unchanged, copied back and stored
 * again when they were evicted. */
static void test_prefix_cached_pages(void **state) {
    (void)state;
    setup_tokens();
    for (int staged = 0; staged < 2; staged++) {
        cfg_t c = {staged ? KVP_FORMAT_INT8 : KVP_FORMAT_FP16, KVP_FORMAT_FP16, 4, 32, 4, 32,
                   false, true};
        fix_t f;
        fix_init(&f, &c, NULL);
        static uint32_t v[64], w[64];
        int32_t s = new_seq(&f);
        assert_int_equal(append(&f, s, 0, toks, 9, v), KVP_OK); /* 2 full pages stored */
        assert_int_equal(pstats(&f).pages_stored, 2);
        snap_t snap;
        snapshot(&f, s, &snap);
        assert_int_equal(swap_out(&f, s), KVP_OK);
        kvp_pool_stats_t ps = pstats(&f);
        assert_int_equal(ps.cached_pages, 2); /* evictable, still reusable */
        assert_int_equal(ps.used_pages, 0);
        /* another prompt uses them meanwhile */
        int32_t o = new_seq(&f);
        int64_t m = 0;
        assert_int_equal(kvp_table_attach_prefix(f.t, o, toks, 9, &m), KVP_OK);
        assert_int_equal(m, 8);
        memcpy(w, v, sizeof v);
        assert_int_equal(append(&f, o, 8, toks + 8, 3, w), KVP_OK);
        long copies = f.st.copies;
        assert_int_equal(swap_in(&f, s), KVP_OK);
        assert_int_equal(tstats(&f).pages_reattached, 2);
        /* only the tail (or the staging page) came back by copy */
        assert_int_equal(f.st.copies - copies, staged ? tstats(&f).staging_chunks : 1);
        int32_t sp[4], op[4];
        assert_int_equal(kvp_table_seq_pages(f.t, s, sp, 4), KVP_OK);
        assert_int_equal(kvp_table_seq_pages(f.t, o, op, 4), KVP_OK);
        assert_int_equal(sp[0], op[0]);
        assert_int_equal(sp[1], op[1]);
        assert_int_equal(refcount(&f, sp[0]), 2);
        assert_same_bytes(&f, s, &snap);
        assert_int_equal(kvp_table_seq_release(f.t, o), KVP_OK);

        /* out again; the cache is evicted: the pages come back by copy and
         * are stored again for later prompts */
        snapshot(&f, s, &snap);
        assert_int_equal(swap_out(&f, s), KVP_OK);
        int32_t ev = 0;
        assert_int_equal(kvp_pool_evict(f.pool, INT32_MAX, &ev), KVP_OK);
        assert_true(ev >= 2);
        scribble_free(&f.st, f.pool);
        copies = f.st.copies;
        assert_int_equal(swap_in(&f, s), KVP_OK);
        assert_int_equal(tstats(&f).pages_reattached, 2); /* unchanged */
        assert_true(f.st.copies - copies >= 2);
        assert_same_bytes(&f, s, &snap);
        check_values(&f, s, v, 9);
        assert_int_equal(kvp_table_lookup_prefix(f.t, 0, toks, 9, &m), KVP_OK);
        assert_int_equal(m, 8);
        /* token ids came back too: the next full page is stored */
        assert_int_equal(append(&f, s, 9, toks + 9, 3, v), KVP_OK);
        assert_int_equal(kvp_table_lookup_prefix(f.t, 0, toks, 12, &m), KVP_OK);
        assert_int_equal(m, 12);
        fix_done(&f);
    }
}

/* A cached page that changed while the sequence was out (evicted, reused
 * and stored again under the same id) is not attached: it is copied. */
static void test_changed_cached_page_copied(void **state) {
    (void)state;
    setup_tokens();
    cfg_t c = {KVP_FORMAT_FP16, KVP_FORMAT_FP16, 4, 4, 0, 8, false, true};
    fix_t f;
    fix_init(&f, &c, NULL);
    static uint32_t v[16], w[16];
    int32_t s = new_seq(&f);
    assert_int_equal(append(&f, s, 0, toks, 4, v), KVP_OK); /* page 0, stored */
    int32_t sp[2];
    assert_int_equal(kvp_table_seq_pages(f.t, s, sp, 2), KVP_OK);
    snap_t snap;
    snapshot(&f, s, &snap);
    assert_int_equal(swap_out(&f, s), KVP_OK);
    /* fill the pool so that the cached page is evicted and reused, and
     * stored again with other tokens */
    int32_t o = new_seq(&f);
    assert_int_equal(append(&f, o, 0, toks + 50, 16, w), KVP_OK);
    int32_t op[4];
    assert_int_equal(kvp_table_seq_pages(f.t, o, op, 4), KVP_OK);
    bool reused = false;
    for (int i = 0; i < 4; i++) reused |= op[i] == sp[0];
    assert_true(reused);
    assert_int_equal(kvp_table_seq_release(f.t, o), KVP_OK); /* all 4 cached now */
    assert_int_equal(pstats(&f).cached_pages, 4);
    long copies = f.st.copies;
    assert_int_equal(swap_in(&f, s), KVP_OK);
    assert_int_equal(tstats(&f).pages_reattached, 0);
    assert_int_equal(f.st.copies - copies, 1);
    assert_same_bytes(&f, s, &snap);
    check_values(&f, s, v, 4);
    fix_done(&f);
}

/* A cached page evicted and filled again with the same tokens (so stored
 * under the same name, possibly the same id) holds other bytes: copied. */
static void test_refilled_cached_page_copied(void **state) {
    (void)state;
    setup_tokens();
    for (int staged = 0; staged < 2; staged++) {
        cfg_t c = {staged ? KVP_FORMAT_INT4 : KVP_FORMAT_FP16, KVP_FORMAT_INT4, 4, 4, 2, 8,
                   false, true};
        fix_t f;
        fix_init(&f, &c, NULL);
        static uint32_t v[16], w[16];
        int32_t s = new_seq(&f);
        assert_int_equal(append(&f, s, 0, toks, 5, v), KVP_OK);
        int32_t sp[2];
        assert_int_equal(kvp_table_seq_pages(f.t, s, sp, 2), KVP_OK);
        snap_t snap;
        snapshot(&f, s, &snap);
        assert_int_equal(swap_out(&f, s), KVP_OK);
        int32_t ev = 0;
        assert_int_equal(kvp_pool_evict(f.pool, INT32_MAX, &ev), KVP_OK);
        scribble_free(&f.st, f.pool);
        int32_t o = new_seq(&f); /* the same prompt, prefilled again */
        assert_int_equal(append(&f, o, 0, toks, 5, w), KVP_OK);
        int32_t op[2];
        assert_int_equal(kvp_table_seq_pages(f.t, o, op, 2), KVP_OK);
        assert_int_equal(op[0], sp[0]); /* same id, same name, new bytes */
        assert_int_equal(kvp_table_seq_release(f.t, o), KVP_OK);
        assert_int_equal(swap_in(&f, s), KVP_OK);
        assert_int_equal(tstats(&f).pages_reattached, 0);
        assert_same_bytes(&f, s, &snap);
        fix_done(&f);
    }
}

/* The host tier is full: KVP_EHOSTFULL, and nothing changes. */
static void test_host_full(void **state) {
    (void)state;
    setup_tokens();
    cfg_t c = {KVP_FORMAT_INT8, KVP_FORMAT_INT8, 4, 32, 4, 3, false, false};
    fix_t f;
    fix_init(&f, &c, NULL);
    static uint32_t v[64], w[64];
    int32_t a = new_seq(&f), b = new_seq(&f);
    assert_int_equal(append(&f, a, 0, toks, 4, v), KVP_OK); /* 1 slot */
    assert_int_equal(append(&f, b, 0, toks, 13, w), KVP_OK); /* 3 pages + staging */
    assert_int_equal(kvp_table_reserve(f.t, b, 3), KVP_OK);
    assert_int_equal(swap_out(&f, a), KVP_OK);
    kvp_pool_stats_t ps = pstats(&f);
    kvp_tier_stats_t ts = tstats(&f);
    kvp_seq_info_t si = {.struct_size = sizeof si}, si2 = {.struct_size = sizeof si2};
    assert_int_equal(kvp_table_seq_info(f.t, b, &si), KVP_OK);
    snap_t snap;
    snapshot(&f, b, &snap);
    assert_int_equal(swap_out(&f, b), KVP_EHOSTFULL);
    assert_non_null(strstr(kvp_tier_last_error(f.tier), "host slots"));
    assert_string_equal(kvp_status_name(KVP_EHOSTFULL), "KVP_EHOSTFULL");
    /* nothing lost: the sequence stays where it was, whole */
    assert_int_equal(kvp_table_seq_info(f.t, b, &si2), KVP_OK);
    assert_memory_equal(&si, &si2, sizeof si);
    kvp_pool_stats_t ps2 = pstats(&f);
    kvp_tier_stats_t ts2 = tstats(&f);
    assert_memory_equal(&ps, &ps2, sizeof ps);
    assert_memory_equal(&ts, &ts2, sizeof ts);
    assert_same_bytes(&f, b, &snap);
    assert_int_equal(append(&f, b, 13, toks + 13, 3, w), KVP_OK); /* its reservation holds */
    check_values(&f, b, w, 16);
    fix_check(&f);
    /* dropping the swapped-out one makes room */
    assert_int_equal(kvp_tier_drop(f.tier, a), KVP_OK);
    assert_int_equal(kvp_tier_seq_info(f.tier, a, &(kvp_tier_seq_info_t){.struct_size = sizeof(kvp_tier_seq_info_t)}), KVP_ENOENT);
    assert_int_equal(swap_out(&f, b), KVP_EHOSTFULL); /* 4 pages: still too many */
    assert_int_equal(kvp_tier_drop(f.tier, b), KVP_OK);
    assert_int_equal(tstats(&f).drops, 2);
    fix_done(&f);
}

/* Page I/O failures: the swap is undone and reports the storage's status. */
static void test_page_io_failure(void **state) {
    (void)state;
    setup_tokens();
    cfg_t c = {KVP_FORMAT_INT4, KVP_FORMAT_INT4, 4, 32, 4, 32, false, true};
    fix_t f;
    fix_init(&f, &c, NULL);
    static uint32_t v[64];
    int32_t s = new_seq(&f);
    assert_int_equal(append(&f, s, 0, toks, 14, v), KVP_OK);
    snap_t snap;
    snapshot(&f, s, &snap);
    kvp_pool_stats_t ps = pstats(&f);
    kvp_tier_stats_t ts = tstats(&f);
    int32_t n = 0;
    for (long k = 0;; k++) { /* fail each copy of the swap-out in turn */
        f.st.io_calls = 0;
        f.st.io_fail_at = k;
        int rc = kvp_tier_swap_out(f.tier, s, NULL, 0, &n);
        if (rc == KVP_OK) break;
        assert_int_equal(rc, KVP_ECUDA);
        assert_non_null(strstr(kvp_tier_last_error(f.tier), "page I/O failed"));
        kvp_pool_stats_t ps2 = pstats(&f);
        kvp_tier_stats_t ts2 = tstats(&f);
        assert_memory_equal(&ps, &ps2, sizeof ps);
        assert_memory_equal(&ts, &ts2, sizeof ts);
        fix_check(&f);
    }
    f.st.io_fail_at = -1;
    scribble_free(&f.st, f.pool);
    ps = pstats(&f);
    ts = tstats(&f);
    for (long k = 0;; k++) {
        f.st.io_calls = 0;
        f.st.io_fail_at = k;
        int rc = kvp_tier_swap_in(f.tier, s, NULL, 0, &n);
        if (rc == KVP_OK) break;
        assert_int_equal(rc, KVP_ECUDA);
        kvp_pool_stats_t ps2 = pstats(&f);
        kvp_tier_stats_t ts2 = tstats(&f);
        assert_int_equal(ps2.used_pages, ps.used_pages);
        assert_int_equal(ps2.used_staging, ps.used_staging);
        assert_int_equal(ps2.available_pages, ps.available_pages);
        assert_memory_equal(&ts, &ts2, sizeof ts);
        kvp_seq_info_t si = {.struct_size = sizeof si};
        assert_int_equal(kvp_table_seq_info(f.t, s, &si), KVP_OK);
        assert_int_equal(si.swapped, 1);
        fix_check(&f);
        scribble_free(&f.st, f.pool);
    }
    f.st.io_fail_at = -1;
    assert_same_bytes(&f, s, &snap);
    check_values(&f, s, v, 14);
    fix_done(&f);
}

/* Bad input: a clear status, and nothing changes. */
static void test_bad_input(void **state) {
    (void)state;
    setup_tokens();
    cfg_t c = {KVP_FORMAT_INT8, KVP_FORMAT_INT8, 4, 8, 3, 8, true, true};
    fix_t f;
    fix_init(&f, &c, NULL);
    static uint32_t v[64];
    int32_t s = new_seq(&f), n = 0;
    assert_int_equal(append(&f, s, 0, toks, 6, v), KVP_OK);
    kvp_page_op_t ops[8];
    assert_int_equal(kvp_tier_swap_out(NULL, s, ops, 8, &n), KVP_EINVAL);
    assert_int_equal(kvp_tier_swap_out(f.tier, s, ops, 8, NULL), KVP_EINVAL);
    assert_int_equal(kvp_tier_swap_out(f.tier, s, ops, -1, &n), KVP_EINVAL);
    kvp_tier_seq_info_t ti = {.struct_size = sizeof ti};
    assert_int_equal(kvp_tier_seq_info(f.tier, s, &ti), KVP_OK);
    assert_int_equal(ti.ops, 1 + tstats(&f).staging_chunks);
    assert_int_equal(kvp_tier_swap_out(f.tier, s, ops, ti.ops - 1, &n), KVP_EINVAL);
    assert_non_null(strstr(kvp_tier_last_error(f.tier), "needs room for"));
    assert_int_equal(kvp_tier_swap_out(f.tier, s, NULL, 8, &n), KVP_EINVAL);
    assert_int_equal(kvp_tier_swap_out(f.tier, 12345, ops, 8, &n), KVP_ENOENT);
    assert_non_null(strstr(kvp_tier_last_error(f.tier), "not live"));
    assert_int_equal(kvp_tier_swap_in(f.tier, 12345, ops, 8, &n), KVP_ENOENT);
    assert_int_equal(kvp_tier_swap_in(f.tier, s, ops, 8, &n), KVP_ESTATE); /* resident */
    assert_non_null(strstr(kvp_tier_last_error(f.tier), "resident"));
    assert_int_equal(kvp_tier_drop(f.tier, 12345), KVP_ENOENT);
    assert_int_equal(kvp_tier_drop(NULL, s), KVP_EINVAL);
    assert_int_equal(kvp_tier_seq_info(f.tier, s, NULL), KVP_EINVAL);
    assert_int_equal(kvp_tier_stats(f.tier, NULL), KVP_EINVAL);
    assert_int_equal(kvp_tier_stats(NULL, NULL), KVP_EINVAL);
    assert_int_equal(kvp_tier_host_memory(f.tier, NULL, NULL), KVP_EINVAL);
    assert_string_equal(kvp_tier_last_error(NULL), "NULL handle");
    fix_check(&f);

    assert_int_equal(swap_out(&f, s), KVP_OK);
    assert_int_equal(kvp_tier_swap_out(f.tier, s, ops, 8, &n), KVP_ESTATE);
    assert_non_null(strstr(kvp_tier_last_error(f.tier), "already swapped out"));
    /* the table refuses everything that needs the pages on the device */
    int64_t slots[4], m = 0;
    int32_t child = -1, pages[4];
    assert_int_equal(kvp_table_append(f.t, s, 1, toks, slots, ops, 8, &n), KVP_ESTATE);
    assert_non_null(strstr(kvp_table_last_error(f.t), "swapped out"));
    assert_int_equal(kvp_table_reserve(f.t, s, 1), KVP_ESTATE);
    assert_int_equal(kvp_table_fork(f.t, s, &child, ops, 8, &n), KVP_ESTATE);
    assert_int_equal(kvp_table_truncate(f.t, s, 1, ops, 8, &n), KVP_ESTATE);
    assert_int_equal(kvp_table_attach_prefix(f.t, s, toks, 4, &m), KVP_ESTATE);
    assert_int_equal(kvp_table_seq_pages(f.t, s, pages, 4), KVP_ESTATE);
    assert_int_equal(kvp_table_set_range_priority(f.t, s, 0, 4, 9), KVP_ESTATE);
    assert_int_equal(kvp_table_seq_release(f.t, s), KVP_ESTATE);
    int64_t ni, ns;
    assert_int_equal(kvp_table_export_size(f.t, &s, 1, NULL, &ni, &ns), KVP_ESTATE);
    assert_int_equal(kvp_table_set_priority(f.t, s, 3), KVP_OK); /* metadata only */
    kvp_seq_info_t si = {.struct_size = sizeof si};
    assert_int_equal(kvp_table_seq_info(f.t, s, &si), KVP_OK);
    assert_int_equal(si.swapped, 1);
    assert_int_equal(si.priority, 3);
    fix_check(&f);

    /* swap-in without room: no staging page, then too few pages */
    int32_t others[3];
    for (int i = 0; i < 3; i++) others[i] = new_seq(&f);
    kvp_pool_stats_t ps = pstats(&f);
    kvp_tier_stats_t ts = tstats(&f);
    assert_int_equal(kvp_tier_swap_in(f.tier, s, ops, 8, &n), KVP_ENOSPC);
    assert_non_null(strstr(kvp_tier_last_error(f.tier), "staging"));
    assert_int_equal(kvp_table_seq_release(f.t, others[2]), KVP_OK);
    static uint32_t w[64];
    assert_int_equal(append(&f, others[0], 0, toks + 100, 28, w), KVP_OK); /* 7 of 8 pages */
    assert_int_equal(swap_in(&f, s), KVP_OK); /* 1 page and the staging page */
    check_values(&f, s, v, 6);
    assert_int_equal(swap_out(&f, s), KVP_OK);
    assert_int_equal(kvp_table_reserve(f.t, others[1], 4), KVP_OK); /* the last page */
    ps = pstats(&f);
    ts = tstats(&f);
    assert_int_equal(ps.available_pages, 0);
    assert_int_equal(kvp_tier_swap_in(f.tier, s, ops, 8, &n), KVP_ENOSPC);
    assert_non_null(strstr(kvp_tier_last_error(f.tier), "available"));
    kvp_pool_stats_t ps2 = pstats(&f);
    kvp_tier_stats_t ts2 = tstats(&f);
    assert_memory_equal(&ps, &ps2, sizeof ps);
    assert_memory_equal(&ts, &ts2, sizeof ts);
    fix_check(&f);
    /* the engine drops it instead; its id is gone */
    assert_int_equal(kvp_tier_drop(f.tier, s), KVP_OK);
    assert_int_equal(kvp_table_seq_info(f.t, s, &si), KVP_ENOENT);
    assert_int_equal(tstats(&f).free_slots, 8);
    fix_done(&f);
}

static void test_create_errors(void **state) {
    (void)state;
    cfg_t c = {KVP_FORMAT_INT8, KVP_FORMAT_INT8, 4, 8, 3, 8, false, true};
    fix_t f;
    fix_init(&f, &c, NULL);
    char err[KVP_ERR_SIZE];
    kvp_tier_t *t2 = NULL;
    kvp_tier_params_t p;
    kvp_tier_params_init(&p);
    p.layout = &f.st.l;
    p.host_bytes = 1 << 20;
    assert_int_equal(kvp_tier_create(f.t, &p, &t2, err, sizeof err), KVP_ESTATE); /* one per table */
    assert_non_null(strstr(err, "already has"));
    kvp_tier_destroy(f.tier);
    f.tier = NULL;
    assert_int_equal(kvp_tier_create(NULL, &p, &t2, err, sizeof err), KVP_EINVAL);
    assert_int_equal(kvp_tier_create(f.t, NULL, &t2, err, sizeof err), KVP_EINVAL);
    assert_int_equal(kvp_tier_create(f.t, &p, NULL, err, sizeof err), KVP_EINVAL);
    kvp_tier_params_t bad = p;
    bad.struct_size = 4;
    assert_int_equal(kvp_tier_create(f.t, &bad, &t2, err, sizeof err), KVP_EINVAL);
    bad = p;
    bad.layout = NULL;
    assert_int_equal(kvp_tier_create(f.t, &bad, &t2, err, sizeof err), KVP_EINVAL);
    assert_non_null(strstr(err, "layout"));
    kvp_layout_t l = f.st.l;
    l.page_bytes += 16;
    bad.layout = &l;
    assert_int_equal(kvp_tier_create(f.t, &bad, &t2, err, sizeof err), KVP_EINVAL);
    assert_non_null(strstr(err, "kvp_layout_compute"));
    kvp_layout_t l8;
    l8.struct_size = sizeof l8;
    assert_int_equal(kvp_layout_compute(2, 2, 64, 8, KVP_FORMAT_INT8, KVP_FORMAT_INT8, &l8, NULL, 0),
                     KVP_OK);
    bad.layout = &l8;
    assert_int_equal(kvp_tier_create(f.t, &bad, &t2, err, sizeof err), KVP_EINVAL);
    assert_non_null(strstr(err, "page size"));
    assert_int_equal(kvp_layout_compute(2, 2, 64, 4, KVP_FORMAT_FP16, KVP_FORMAT_INT8, &l8, NULL, 0),
                     KVP_OK);
    assert_int_equal(kvp_tier_create(f.t, &bad, &t2, err, sizeof err), KVP_EINVAL);
    assert_non_null(strstr(err, "staging"));
    bad = p;
    bad.host_bytes = f.st.l.page_bytes - 1;
    assert_int_equal(kvp_tier_create(f.t, &bad, &t2, err, sizeof err), KVP_EINVAL);
    assert_non_null(strstr(err, "less than one slot"));
    kvp_page_io_t io = page_io(&f.st);
    io.copy_from_host = NULL;
    bad = p;
    bad.page_io = &io;
    assert_int_equal(kvp_tier_create(f.t, &bad, &t2, err, sizeof err), KVP_EINVAL);
    kvp_allocator_t half = {kvt_alloc, NULL, NULL};
    bad = p;
    bad.host_allocator = half;
    assert_int_equal(kvp_tier_create(f.t, &bad, &t2, err, sizeof err), KVP_EINVAL);
    assert_null(t2);
    assert_int_equal(kvp_tier_create(f.t, &p, &f.tier, err, sizeof err), KVP_OK);
    kvp_tier_destroy(NULL);
    fix_done(&f);
}

/* Every allocation can fail: creation leaks nothing; a swap-out that cannot
 * grow its record changes nothing. */
static void test_allocation_failures(void **state) {
    (void)state;
    setup_tokens();
    cfg_t c = {KVP_FORMAT_INT8, KVP_FORMAT_INT4, 4, 64, 4, 64, false, true};
    test_alloc_state as = {0, -1, 0, 0};
    kvp_allocator_t a = test_allocator(&as);
    fix_t f;
    fix_init(&f, &c, &a);
    kvp_tier_destroy(f.tier);
    long live = as.live;
    kvp_tier_params_t p;
    kvp_tier_params_init(&p);
    p.layout = &f.st.l;
    p.host_bytes = 1 << 20;
    p.allocator = a;
    long base = as.calls;
    assert_int_equal(kvp_tier_create(f.t, &p, &f.tier, NULL, 0), KVP_OK);
    long calls = as.calls - base;
    kvp_tier_destroy(f.tier);
    assert_int_equal(as.live, live);
    for (long k = 0; k < calls; k++) {
        as.fail_at = as.calls + k;
        kvp_tier_t *t = NULL;
        char err[KVP_ERR_SIZE];
        assert_int_equal(kvp_tier_create(f.t, &p, &t, err, sizeof err), KVP_ENOMEM);
        assert_null(t);
        assert_int_equal(as.live, live);
    }
    as.fail_at = -1;
    assert_int_equal(kvp_tier_create(f.t, &p, &f.tier, NULL, 0), KVP_OK);
    static uint32_t v[300];
    int32_t s = new_seq(&f);
    assert_int_equal(append(&f, s, 0, toks, 150, v), KVP_OK); /* > 8 pages: the record grows */
    kvp_pool_stats_t ps = pstats(&f);
    kvp_tier_stats_t ts = tstats(&f);
    as.fail_at = as.calls; /* the record's allocation */
    int32_t n;
    kvp_page_op_t ops[64]; /* this tier has no page I/O: it returns operations */
    assert_int_equal(kvp_tier_swap_out(f.tier, s, ops, 64, &n), KVP_ENOMEM);
    kvp_pool_stats_t ps2 = pstats(&f);
    kvp_tier_stats_t ts2 = tstats(&f);
    assert_memory_equal(&ps, &ps2, sizeof ps);
    assert_memory_equal(&ts, &ts2, sizeof ts);
    as.fail_at = as.calls + 1; /* the token-id copy */
    assert_int_equal(kvp_tier_swap_out(f.tier, s, ops, 64, &n), KVP_ENOMEM);
    as.fail_at = -1;
    fix_check(&f);
    assert_int_equal(kvp_tier_swap_out(f.tier, s, ops, 64, &n), KVP_OK);
    assert_int_equal(kvp_tier_drop(f.tier, s), KVP_OK);
    kvp_tier_destroy(f.tier);
    f.tier = NULL;
    kvp_table_destroy(f.t);
    kvp_pool_destroy(f.pool);
    free(f.st.mem);
    assert_int_equal(as.live, 0);
}

/* Destroying the tier drops what is still swapped out; the table and pool
 * are consistent afterwards. */
static void test_destroy_with_swapped(void **state) {
    (void)state;
    setup_tokens();
    cfg_t c = {KVP_FORMAT_FP16, KVP_FORMAT_FP16, 4, 16, 0, 16, false, true};
    fix_t f;
    fix_init(&f, &c, NULL);
    static uint32_t v[64];
    int32_t a = new_seq(&f), n = 0, child = -1;
    assert_int_equal(append(&f, a, 0, toks, 7, v), KVP_OK);
    assert_int_equal(kvp_table_fork(f.t, a, &child, NULL, 0, &n), KVP_OK);
    assert_int_equal(swap_out(&f, a), KVP_OK);
    kvp_tier_destroy(f.tier);
    f.tier = NULL;
    kvp_seq_info_t si = {.struct_size = sizeof si};
    assert_int_equal(kvp_table_seq_info(f.t, a, &si), KVP_ENOENT);
    assert_int_equal(kvp_table_seq_info(f.t, child, &si), KVP_OK);
    char err[KVP_ERR_SIZE];
    assert_int_equal(kvp__table_check(f.t, err, sizeof err), KVP_OK);
    int32_t pages[4];
    assert_int_equal(kvp_table_seq_pages(f.t, child, pages, 4), KVP_OK);
    assert_int_equal(refcount(&f, pages[0]), 1);
    kvp_table_destroy(f.t);
    kvp_pool_stats_t s = pstats(&f);
    assert_int_equal(s.used_pages, 0);
    kvp_pool_destroy(f.pool);
    free(f.st.mem);
}

/* ---- the real CPU store behind the page I/O ------------------------------------------ */

/* Page I/O over the store's public region API: a page is serialized as, for
 * each layer, its K blocks (all kv heads, `page_stride` bytes) then its V
 * blocks; staging pages the same with the fp16 staging regions. This is the
 * interface the store implements (the lead wires it into lib/store.c). */
typedef struct {
    kvp_store_t *s;
    int32_t layers, num_pages;
} store_io_t;

static int store_copy(store_io_t *x, int32_t page, uint64_t off, uint8_t *host, uint64_t n,
                      bool to_host) {
    bool staging = page >= x->num_pages;
    uint64_t at = 0;
    for (int32_t l = 0; l < x->layers; l++)
        for (int kv = 0; kv < 2; kv++) {
            kvp_region_t r = {.struct_size = sizeof r};
            int32_t kind = staging ? (kv ? KVP_REGION_STAGING_V : KVP_REGION_STAGING_K)
                                   : (kv ? KVP_REGION_V : KVP_REGION_K);
            int rc = kvp_store_region(x->s, l, kind, &r);
            if (rc != KVP_OK) return rc;
            uint8_t *blocks = (uint8_t *)r.base + (uint64_t)(page - r.first_page) * r.page_stride;
            uint64_t lo = at > off ? at : off;
            uint64_t hi = at + r.page_stride < off + n ? at + r.page_stride : off + n;
            if (lo < hi) {
                if (to_host) memcpy(host + (lo - off), blocks + (lo - at), hi - lo);
                else memcpy(blocks + (lo - at), host + (lo - off), hi - lo);
            }
            at += r.page_stride;
        }
    return KVP_OK;
}

static int store_out(void *o, int32_t page, uint64_t off, void *dst, uint64_t n) {
    return store_copy(o, page, off, dst, n, true);
}

static int store_in(void *o, int32_t page, uint64_t off, const void *src, uint64_t n) {
    return store_copy(o, page, off, (uint8_t *)(uintptr_t)src, n, false);
}

/* Append `n` random rows to `seq` in the table and the store (every layer). */
static void store_rows(kvp_store_t *s, kvp_table_t *t, int32_t seq, int32_t layers, int32_t HD,
                       const int32_t *tok, int32_t n, uint64_t *rng) {
    int64_t slots[64];
    kvp_page_op_t ops[16];
    int32_t nops = 0;
    float k[64 * 128], v[64 * 128];
    assert_true(n <= 64 && HD <= 128);
    assert_int_equal(kvp_table_append(t, seq, n, tok, slots, ops, 16, &nops), KVP_OK);
    assert_int_equal(kvp_store_apply_ops(s, ops, nops), KVP_OK); /* COPY/UNSEAL; SEAL skipped */
    for (int32_t l = 0; l < layers; l++) {
        for (int32_t i = 0; i < n * HD; i++) {
            k[i] = (float)((int64_t)(xs(rng) % 2001) - 1000) / 250.0f;
            v[i] = (float)((int64_t)(xs(rng) % 2001) - 1000) / 500.0f;
        }
        kvp_append_params_t a;
        kvp_append_params_init(&a);
        a.layer = l;
        a.rows = n;
        a.dtype = KVP_FORMAT_FP32;
        a.k = k;
        a.v = v;
        a.slots = slots;
        a.ops = ops;
        a.num_ops = nops;
        int rc = kvp_store_append(s, &a);
        if (rc != KVP_OK) print_error("append: %s\n", kvp_store_last_error(s));
        assert_int_equal(rc, KVP_OK);
    }
}

typedef struct {
    uint8_t *bytes;   /* every page serialized, in page-list order */
    float *kv;        /* every token dequantized, every layer */
    size_t nbytes, nkv;
} store_snap_t;

static void store_snapshot(store_io_t *x, kvp_table_t *t, int32_t seq, const kvp_layout_t *l,
                           store_snap_t *out) {
    kvp_seq_info_t info = {.struct_size = sizeof info};
    assert_int_equal(kvp_table_seq_info(t, seq, &info), KVP_OK);
    int32_t pages[64];
    assert_int_equal(kvp_table_seq_pages(t, seq, pages, 64), KVP_OK);
    size_t HD = (size_t)l->kv_heads * (size_t)l->head_dim;
    out->nbytes = 0;
    for (int32_t i = 0; i < info.num_pages; i++)
        out->nbytes += pages[i] < x->num_pages ? l->page_bytes : l->staging_page_bytes;
    out->nkv = (size_t)info.length * HD * 2 * (size_t)l->layers;
    out->bytes = malloc(out->nbytes);
    out->kv = malloc(out->nkv * sizeof *out->kv);
    assert_non_null(out->bytes);
    assert_non_null(out->kv);
    size_t at = 0, f = 0;
    for (int32_t i = 0; i < info.num_pages; i++) {
        uint64_t n = pages[i] < x->num_pages ? l->page_bytes : l->staging_page_bytes;
        assert_int_equal(store_out(x, pages[i], 0, out->bytes + at, n), KVP_OK);
        at += n;
        int32_t count = i + 1 < info.num_pages ? l->page_size : info.last_page_len;
        for (int32_t layer = 0; layer < l->layers; layer++) {
            assert_int_equal(kvp_store_read(x->s, layer, pages[i], 0, count, out->kv + f,
                                            out->kv + f + (size_t)count * HD),
                             KVP_OK);
            f += 2 * (size_t)count * HD;
        }
    }
    assert_int_equal(f, out->nkv);
}

static void store_same(store_io_t *x, kvp_table_t *t, int32_t seq, const kvp_layout_t *l,
                       store_snap_t *before) {
    store_snap_t now;
    store_snapshot(x, t, seq, l, &now);
    assert_int_equal(now.nbytes, before->nbytes);
    assert_int_equal(now.nkv, before->nkv);
    assert_memory_equal(now.bytes, before->bytes, now.nbytes);
    assert_memory_equal(now.kv, before->kv, now.nkv * sizeof *now.kv);
    free(now.bytes);
    free(now.kv);
    free(before->bytes);
    free(before->kv);
}

/* The tier behind the real CPU store: quantized pages, scales, staging pages
 * and a fork come back bit for bit after their device pages were reused. */
static void test_real_store_round_trip(void **state) {
    (void)state;
    setup_tokens();
    static const int32_t fm[][2] = {{KVP_FORMAT_FP16, KVP_FORMAT_FP16},
                                    {KVP_FORMAT_BF16, KVP_FORMAT_FP8_E4M3},
                                    {KVP_FORMAT_INT8, KVP_FORMAT_INT8},
                                    {KVP_FORMAT_INT4, KVP_FORMAT_INT4},
                                    {KVP_FORMAT_INT8, KVP_FORMAT_INT4}};
    const int32_t L = 2, H = 2, D = 64, P = 8, N = 24;
    for (size_t f = 0; f < sizeof fm / sizeof fm[0]; f++) {
        uint64_t rng = 0x5eed + f;
        kvp_layout_t l = {.struct_size = sizeof l};
        assert_int_equal(kvp_layout_compute(L, H, D, P, fm[f][0], fm[f][1], &l, NULL, 0), KVP_OK);
        int32_t S = l.needs_staging ? 4 : 0;
        kvp_store_params_t sp;
        kvp_store_params_init(&sp);
        sp.layers = L;
        sp.kv_heads = H;
        sp.head_dim = D;
        sp.page_size = P;
        sp.k_format = fm[f][0];
        sp.v_format = fm[f][1];
        sp.num_pages = N;
        sp.num_staging = (uint64_t)S;
        store_io_t x = {NULL, L, N};
        char err[KVP_ERR_SIZE];
        assert_int_equal(kvp_store_create(&sp, &x.s, err, sizeof err), KVP_OK);
        if (fm[f][1] == KVP_FORMAT_FP8_E4M3)
            for (int32_t layer = 0; layer < L; layer++)
                for (int32_t h = 0; h < H; h++)
                    assert_int_equal(kvp_store_set_fp8_scale(x.s, layer, h, 1, 0.01f), KVP_OK);
        kvp_pool_params_t pp;
        kvp_pool_params_init(&pp);
        pp.page_size = P;
        pp.num_pages = N;
        pp.num_staging = S;
        kvp_pool_t *pool;
        kvp_table_t *t;
        kvp_tier_t *tier;
        assert_int_equal(kvp_pool_create(&pp, &pool, NULL, 0), KVP_OK);
        assert_int_equal(kvp_table_create(pool, 0, &t, NULL, 0), KVP_OK);
        kvp_page_io_t io = {.struct_size = sizeof io};
        io.copy_to_host = store_out;
        io.copy_from_host = store_in;
        io.opaque = &x;
        kvp_tier_params_t tp;
        kvp_tier_params_init(&tp);
        tp.layout = &l;
        tp.page_io = &io;
        tp.host_bytes = 64 * kvp__round_up_u64(l.page_bytes, KVP_ARENA_ALIGN);
        assert_int_equal(kvp_tier_create(t, &tp, &tier, err, sizeof err), KVP_OK);
        /* the serialization covers exactly a page's bytes */
        uint64_t covered = 0;
        for (int32_t layer = 0; layer < L; layer++)
            for (int32_t kind = KVP_REGION_K; kind <= KVP_REGION_V; kind++) {
                kvp_region_t r = {.struct_size = sizeof r};
                assert_int_equal(kvp_store_region(x.s, layer, kind, &r), KVP_OK);
                covered += r.page_stride;
            }
        assert_int_equal(covered, l.page_bytes);

        int32_t a, b, c, nops;
        assert_int_equal(kvp_table_seq_create(t, 0, 0, &a), KVP_OK);
        store_rows(x.s, t, a, L, H * D, toks, 5, &rng);
        store_rows(x.s, t, a, L, H * D, toks + 5, 9, &rng);
        store_rows(x.s, t, a, L, H * D, toks + 14, 7, &rng); /* 21: 2 pages + 5 in the tail */
        kvp_page_op_t op;
        assert_int_equal(kvp_table_fork(t, a, &b, &op, 1, &nops), KVP_OK);
        assert_int_equal(kvp_store_apply_ops(x.s, &op, nops), KVP_OK);
        store_rows(x.s, t, b, L, H * D, toks + 300, 6, &rng);
        store_snap_t sa, sb;
        store_snapshot(&x, t, a, &l, &sa);
        store_snapshot(&x, t, b, &l, &sb);
        assert_int_equal(kvp_tier_swap_out(tier, a, NULL, 0, &nops), KVP_OK);
        /* other work overwrites the pages a gave back */
        assert_int_equal(kvp_table_seq_create(t, 0, 0, &c), KVP_OK);
        for (int k = 0; k < 4; k++) store_rows(x.s, t, c, L, H * D, toks + 400 + 10 * k, 10, &rng);
        assert_int_equal(kvp_table_seq_release(t, c), KVP_OK);
        assert_int_equal(kvp_pool_evict(pool, INT32_MAX, &nops), KVP_OK);
        assert_int_equal(kvp_tier_swap_in(tier, a, NULL, 0, &nops), KVP_OK);
        store_same(&x, t, a, &l, &sa);
        store_same(&x, t, b, &l, &sb);
        store_rows(x.s, t, a, L, H * D, toks + 21, 3, &rng); /* it goes on */
        char msg[KVP_ERR_SIZE];
        assert_int_equal(kvp__tier_check(tier, msg, sizeof msg), KVP_OK);
        kvp_tier_destroy(tier);
        kvp_table_destroy(t);
        kvp_pool_destroy(pool);
        kvp_store_destroy(x.s);
    }
}

/* ---- random differential test ----------------------------------------------------- */

enum { R_FREE, R_RES, R_SWAP };

typedef struct {
    int32_t id;
    int state;
    int64_t len;
    int32_t tok[400];
    uint32_t val[400];
    snap_t snap;
} rseq_t;

static int64_t rnd(uint64_t *r, int64_t n) { return (int64_t)(xs(r) % (uint64_t)n); }

static void random_run(const cfg_t *c, uint64_t seed, int ops_n) {
    fix_t f;
    fix_init(&f, c, NULL);
    enum { NS = 10 };
    static rseq_t q[NS];
    memset(q, 0, sizeof q);
    uint64_t r = seed * 0x2545f4914f6cdd1dull + 1;
    int32_t P = c->P;
    long outs = 0, ins = 0, full = 0, nospc = 0;
    for (int step = 0; step < ops_n; step++) {
        int k = (int)rnd(&r, NS);
        rseq_t *x = &q[k];
        int what = (int)rnd(&r, 10);
        if (x->state == R_FREE) {
            if (kvp_table_seq_create(f.t, 0, 0, &x->id) != KVP_OK) continue;
            x->state = R_RES;
            x->len = 0;
            int64_t n = 1 + rnd(&r, 3 * P + 3);
            int sys = (int)rnd(&r, 3); /* shared system prompts: prefix hits */
            for (int64_t i = 0; i < n; i++)
                x->tok[i] = i < 2 * P ? 1000 * sys + (int32_t)i : (int32_t)rnd(&r, 50);
            int64_t m = 0;
            assert_int_equal(kvp_table_attach_prefix(f.t, x->id, x->tok, n - 1, &m), KVP_OK);
            for (int64_t i = 0; i < m; i++) x->val[i] = chain(i ? x->val[i - 1] : 7, x->tok[i]);
            x->len = m;
            int rc = append(&f, x->id, m, x->tok + m, n - m, x->val);
            if (rc == KVP_OK) x->len = n;
            else assert_int_equal(rc, KVP_ENOSPC);
        } else if (x->state == R_RES && what < 3) {
            int64_t n = 1 + rnd(&r, 2 * P);
            if (x->len + n > 400) n = 400 - x->len;
            if (n <= 0) continue;
            for (int64_t i = 0; i < n; i++) x->tok[x->len + i] = (int32_t)rnd(&r, 50);
            if (rnd(&r, 2) && kvp_table_reserve(f.t, x->id, n) != KVP_OK) continue;
            int rc = append(&f, x->id, x->len, x->tok + x->len, n, x->val);
            if (rc == KVP_OK) x->len += n;
            else assert_int_equal(rc, KVP_ENOSPC);
        } else if (x->state == R_RES && what == 3) {
            int kk = (int)rnd(&r, NS);
            if (q[kk].state != R_FREE) continue;
            int32_t n = 0;
            kvp_page_op_t op;
            if (kvp_table_fork(f.t, x->id, &q[kk].id, &op, 1, &n) != KVP_OK) continue;
            exec_ops(&f.st, &op, n);
            q[kk].state = R_RES;
            q[kk].len = x->len;
            memcpy(q[kk].tok, x->tok, sizeof x->tok);
            memcpy(q[kk].val, x->val, sizeof x->val);
        } else if (x->state == R_RES && what == 4) {
            int64_t len = rnd(&r, x->len + 1);
            kvp_page_op_t op;
            int32_t n = 0;
            assert_int_equal(kvp_table_truncate(f.t, x->id, len, &op, 1, &n), KVP_OK);
            exec_ops(&f.st, &op, n);
            x->len = len;
        } else if (x->state == R_RES && what == 5) {
            assert_int_equal(kvp_table_seq_release(f.t, x->id), KVP_OK);
            x->state = R_FREE;
        } else if (x->state == R_RES && what >= 6) {
            snapshot(&f, x->id, &x->snap);
            int rc = swap_out(&f, x->id);
            if (rc == KVP_OK) {
                x->state = R_SWAP;
                outs++;
            } else {
                assert_int_equal(rc, KVP_EHOSTFULL);
                full++;
                free(x->snap.bytes);
                x->snap.bytes = NULL;
            }
        } else if (x->state == R_SWAP && what < 7) {
            int rc = swap_in(&f, x->id);
            if (rc == KVP_OK) {
                x->state = R_RES;
                assert_same_bytes(&f, x->id, &x->snap);
                ins++;
            } else {
                assert_int_equal(rc, KVP_ENOSPC);
                nospc++;
            }
        } else if (x->state == R_SWAP && what == 7) {
            assert_int_equal(kvp_tier_drop(f.tier, x->id), KVP_OK);
            free(x->snap.bytes);
            x->snap.bytes = NULL;
            x->state = R_FREE;
        } else if (what == 8 && c->prefix) {
            int32_t ev;
            assert_int_equal(kvp_pool_evict(f.pool, (int32_t)rnd(&r, 4), &ev), KVP_OK);
        }
        scribble_free(&f.st, f.pool);
        fix_check(&f);
        for (int i = 0; i < NS; i++)
            if (q[i].state == R_RES) check_values(&f, q[i].id, q[i].val, q[i].len);
    }
    assert_true(outs > 0 && ins > 0);
    for (int i = 0; i < NS; i++) {
        free(q[i].snap.bytes);
        q[i].snap.bytes = NULL;
    }
    if (getenv("KVT_VERBOSE"))
        print_message("kf %d vf %d ops %d prefix %d: %ld out, %ld in, %ld host full, %ld no space, "
                      "%llu reattached, %llu kept\n",
                      c->kf, c->vf, c->ops_mode, c->prefix, outs, ins, full, nospc,
                      (unsigned long long)tstats(&f).pages_reattached,
                      (unsigned long long)tstats(&f).pages_kept);
    fix_done(&f);
}

static void test_random(void **state) {
    (void)state;
    for (int fmt = 0; fmt < NFORMATS; fmt++)
        for (int mode = 0; mode < 2; mode++)
            for (uint64_t seed = 1; seed <= 3; seed++) {
                cfg_t c = {formats[fmt][0], formats[fmt][1], 4, 40, 6, 20, mode == 1,
                           seed != 2};
                random_run(&c, seed * 31 + (uint64_t)fmt, 1500);
            }
}

/* The allocators are given by value: the metadata through `allocator`, the
 * host memory through `host_allocator`, or through `allocator` when
 * host_allocator's hooks are zeroed. */
static void test_allocators_by_value(void **state) {
    (void)state;
    cfg_t c = {KVP_FORMAT_FP16, KVP_FORMAT_FP16, 4, 8, 0, 8, false, true};
    fix_t f;
    fix_init(&f, &c, NULL);
    kvp_tier_destroy(f.tier);
    f.tier = NULL;
    kvp_tier_params_t p;
    memset(&p, 0x5a, sizeof p);
    kvp_tier_params_init(&p);
    assert_null(p.allocator.alloc); /* zeroed hooks: libc */
    assert_null(p.allocator.free);
    assert_null(p.allocator.opaque);
    assert_null(p.host_allocator.alloc);
    assert_null(p.host_allocator.free);
    assert_null(p.host_allocator.opaque);
    p.layout = &f.st.l;
    p.host_bytes = 1 << 16;
    for (int separate = 0; separate <= 1; separate++) {
        test_alloc_state meta = {0, -1, 0, 0}, host = {0, -1, 0, 0};
        p.allocator = test_allocator(&meta);
        if (separate) p.host_allocator = test_allocator(&host);
        else memset(&p.host_allocator, 0, sizeof p.host_allocator);
        kvp_tier_t *t = NULL;
        char err[KVP_ERR_SIZE];
        assert_int_equal(kvp_tier_create(f.t, &p, &t, err, sizeof err), KVP_OK);
        kvp_tier_stats_t ts = {.struct_size = sizeof ts};
        assert_int_equal(kvp_tier_stats(t, &ts), KVP_OK);
        assert_true(ts.host_bytes > 0);
        assert_true(meta.live > 0); /* metadata */
        if (separate) {
            assert_int_equal(host.live, 1); /* one block of host memory */
            assert_true(host.live_bytes >= ts.host_bytes);
            assert_true(meta.live_bytes < ts.host_bytes);
        } else {
            assert_int_equal(host.calls, 0);
            assert_true(meta.live_bytes >= ts.host_bytes);
        }
        kvp_tier_destroy(t);
        assert_int_equal(meta.live, 0);
        assert_int_equal(host.live, 0);
    }
    kvp_tier_params_init(&p);
    p.layout = &f.st.l;
    p.host_bytes = 1 << 16;
    assert_int_equal(kvp_tier_create(f.t, &p, &f.tier, NULL, 0), KVP_OK);
    fix_done(&f);
}

/* The detail text: "" until a call fails, kept (sticky) through calls that
 * succeed, replaced by the next failure; "NULL handle" for NULL. */
static void test_last_error_is_sticky(void **state) {
    (void)state;
    setup_tokens();
    assert_string_equal(kvp_tier_last_error(NULL), "NULL handle");
    cfg_t c = {KVP_FORMAT_FP16, KVP_FORMAT_FP16, 4, 16, 0, 8, false, true};
    fix_t f;
    fix_init(&f, &c, NULL);
    assert_string_equal(kvp_tier_last_error(f.tier), "");
    static uint32_t v[64];
    int32_t s = new_seq(&f);
    assert_int_equal(append(&f, s, 0, toks, 6, v), KVP_OK);
    assert_int_equal(swap_out(&f, s), KVP_OK);
    assert_string_equal(kvp_tier_last_error(f.tier), "");
    assert_int_equal(kvp_tier_drop(f.tier, 12345), KVP_ENOENT);
    char first[KVP_ERR_SIZE];
    snprintf(first, sizeof first, "%s", kvp_tier_last_error(f.tier));
    assert_true(strlen(first) > 0);
    /* successful calls leave it as it was */
    assert_int_equal(swap_in(&f, s), KVP_OK);
    check_values(&f, s, v, 6);
    (void)tstats(&f);
    kvp_tier_seq_info_t ti = {.struct_size = sizeof ti};
    assert_int_equal(kvp_tier_seq_info(f.tier, s, &ti), KVP_OK);
    assert_int_equal(swap_out(&f, s), KVP_OK);
    assert_int_equal(kvp_tier_drop(f.tier, s), KVP_OK);
    assert_string_equal(kvp_tier_last_error(f.tier), first);
    /* the next failure replaces it */
    int32_t n = 0;
    int32_t r = new_seq(&f);
    assert_int_equal(kvp_tier_swap_in(f.tier, r, NULL, 0, &n), KVP_ESTATE); /* resident */
    assert_non_null(strstr(kvp_tier_last_error(f.tier), "resident"));
    assert_string_not_equal(kvp_tier_last_error(f.tier), first);
    assert_int_equal(kvp_table_seq_release(f.t, r), KVP_OK);
    fix_done(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_every_format),
        cmocka_unit_test(test_staging_chunks),
        cmocka_unit_test(test_shared_pages_kept),
        cmocka_unit_test(test_prefix_cached_pages),
        cmocka_unit_test(test_changed_cached_page_copied),
        cmocka_unit_test(test_refilled_cached_page_copied),
        cmocka_unit_test(test_host_full),
        cmocka_unit_test(test_page_io_failure),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_create_errors),
        cmocka_unit_test(test_allocation_failures),
        cmocka_unit_test(test_destroy_with_swapped),
        cmocka_unit_test(test_real_store_round_trip),
        cmocka_unit_test(test_random),
        cmocka_unit_test(test_allocators_by_value),
        cmocka_unit_test(test_last_error_is_sticky),
    };
    return cmocka_run_group_tests_name("tier", tests, NULL, NULL);
}
