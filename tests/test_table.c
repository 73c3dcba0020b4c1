/*
 * Layer: table — slots and page operations (exact values), copy-on-write,
 * staging pages, reservations, the prefix cache (matches, salts, collisions,
 * eviction order, priorities), batch export, bad input, allocation-failure
 * injection for every growing operation, and determinism.
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>

#include "kvpage_ext.h"
#include "paging.h"
#include "testutil.h"

typedef struct {
    kvp_pool_t *pool;
    kvp_table_t *t;
} fixture;

static fixture make(int32_t P, int32_t N, int32_t S, kvp_allocator_t *a) {
    fixture f;
    kvp_pool_params_t p;
    kvp_pool_params_init(&p);
    p.page_size = P;
    p.num_pages = N;
    p.num_staging = S;
    if (a != NULL) p.allocator = *a; /* the table allocates through the pool's hooks */
    char err[KVP_ERR_SIZE];
    assert_int_equal(kvp_pool_create(&p, &f.pool, err, sizeof err), KVP_OK);
    assert_int_equal(kvp_table_create(f.pool, 16, &f.t, err, sizeof err), KVP_OK);
    return f;
}

static void check(const fixture *f) {
    char err[KVP_ERR_SIZE];
    int rc = kvp__table_check(f->t, err, sizeof err);
    if (rc != KVP_OK) print_error("invariant: %s\n", err);
    assert_int_equal(rc, KVP_OK);
}

static void done(fixture *f) {
    check(f);
    kvp_table_destroy(f->t);
    kvp_pool_stats_t s = {.struct_size = sizeof s};
    assert_int_equal(kvp_pool_stats(f->pool, &s), KVP_OK);
    assert_int_equal(s.used_pages, 0);
    assert_int_equal(s.used_staging, 0);
    assert_int_equal(s.reserved_pages, 0);
    assert_int_equal(s.live_tokens, 0);
    kvp_pool_destroy(f->pool);
}

static int32_t new_seq(fixture *f) {
    int32_t id = -1;
    assert_int_equal(kvp_table_seq_create(f->t, 0, 0, &id), KVP_OK);
    return id;
}

/* Append with tokens base+pos; returns the number of ops. */
typedef struct {
    int64_t slots[256];
    kvp_page_op_t ops[64];
    int32_t nops;
} appended;

static appended *append(fixture *f, int32_t seq, int64_t n, const int32_t *tokens) {
    static appended a;
    memset(&a, 0xff, sizeof a);
    int rc = kvp_table_append(f->t, seq, n, tokens, a.slots, a.ops, 64, &a.nops);
    if (rc != KVP_OK) print_error("append: %s\n", kvp_table_last_error(f->t));
    assert_int_equal(rc, KVP_OK);
    return &a;
}

static void assert_op(const kvp_page_op_t *op, int32_t kind, int32_t src, int32_t dst,
                      int32_t count, int32_t row) {
    if (op->kind != kind || op->src != src || op->dst != dst || op->count != count ||
        op->row != row)
        print_error("op {%d, %d, %d, %d, %d}, expected {%d, %d, %d, %d, %d}\n", op->kind,
                    op->src, op->dst, op->count, op->row, kind, src, dst, count, row);
    assert_int_equal(op->kind, kind);
    assert_int_equal(op->src, src);
    assert_int_equal(op->dst, dst);
    assert_int_equal(op->count, count);
    assert_int_equal(op->row, row);
}

static int32_t pages_of(fixture *f, int32_t seq, int32_t *out) {
    kvp_seq_info_t info = {.struct_size = sizeof info};
    assert_int_equal(kvp_table_seq_info(f->t, seq, &info), KVP_OK);
    assert_int_equal(kvp_table_seq_pages(f->t, seq, out, 256), KVP_OK);
    return info.num_pages;
}

static int32_t refcount(fixture *f, int32_t page) {
    int32_t r = -1;
    assert_int_equal(kvp_pool_refcount(f->pool, page, &r), KVP_OK);
    return r;
}

static kvp_pool_stats_t stats(fixture *f) {
    kvp_pool_stats_t s;
    memset(&s, 0, sizeof s);
    s.struct_size = sizeof s;
    assert_int_equal(kvp_pool_stats(f->pool, &s), KVP_OK);
    return s;
}

static int32_t toks[512];

static void setup_tokens(void) {
    for (int i = 0; i < 512; i++) toks[i] = 1000 + i;
}

/* ---- appends, slots, operations ------------------------------------------------ */

static void test_append_paged_slots(void **state) {
    (void)state;
    fixture f = make(4, 8, 0, NULL);
    int32_t a = new_seq(&f);
    appended *r = append(&f, a, 10, toks);
    assert_int_equal(r->nops, 0);
    for (int i = 0; i < 10; i++) assert_int_equal(r->slots[i], i); /* pages 0,1,2 */
    r = append(&f, a, 3, toks + 10); /* 2 into page 2, 1 into page 3 */
    assert_int_equal(r->slots[0], 2 * 4 + 2);
    assert_int_equal(r->slots[1], 2 * 4 + 3);
    assert_int_equal(r->slots[2], 3 * 4 + 0);
    int32_t pages[16];
    assert_int_equal(pages_of(&f, a, pages), 4);
    kvp_seq_info_t info = {.struct_size = sizeof info};
    assert_int_equal(kvp_table_seq_info(f.t, a, &info), KVP_OK);
    assert_int_equal(info.length, 13);
    assert_int_equal(info.last_page_len, 1);
    assert_int_equal(info.staging_page, -1);
    /* 0 tokens: nothing at all */
    int32_t nops = -1;
    assert_int_equal(kvp_table_append(f.t, a, 0, NULL, NULL, NULL, 0, &nops), KVP_OK);
    assert_int_equal(nops, 0);
    done(&f);
}

/* With staging: rows completing a page are sealed into a pool page, with
 * the staging page's tokens; the rest go to the staging page. */
static void test_append_staged_seal_ops(void **state) {
    (void)state;
    fixture f = make(4, 8, 2, NULL);
    int32_t a = new_seq(&f);
    kvp_seq_info_t info = {.struct_size = sizeof info};
    assert_int_equal(kvp_table_seq_info(f.t, a, &info), KVP_OK);
    int32_t stg = info.staging_page;
    assert_int_equal(stg, 8);
    appended *r = append(&f, a, 1, toks); /* staging holds 1 */
    assert_int_equal(r->nops, 0);
    assert_int_equal(r->slots[0], stg * 4);
    r = append(&f, a, 9, toks + 1); /* rows 0-2 complete page A, 3-6 page B, 7-8 staging */
    assert_int_equal(r->nops, 2);
    assert_op(&r->ops[0], KVP_OP_SEAL, stg, 0, 1, 0);
    assert_op(&r->ops[1], KVP_OP_SEAL, -1, 1, 0, 3);
    int64_t want[9] = {0 * 4 + 1, 0 * 4 + 2, 0 * 4 + 3, 4, 5, 6, 7, stg * 4 + 0, stg * 4 + 1};
    for (int i = 0; i < 9; i++) assert_int_equal(r->slots[i], want[i]);
    int32_t pages[8];
    assert_int_equal(pages_of(&f, a, pages), 3); /* 2 sealed + staging */
    assert_int_equal(pages[0], 0);
    assert_int_equal(pages[1], 1);
    assert_int_equal(pages[2], stg);
    /* an append that exactly completes the staging page */
    r = append(&f, a, 2, toks + 10);
    assert_int_equal(r->nops, 1);
    assert_op(&r->ops[0], KVP_OP_SEAL, stg, 2, 2, 0);
    assert_int_equal(r->slots[0], 2 * 4 + 2);
    assert_int_equal(pages_of(&f, a, pages), 3); /* aligned: no staging entry */
    assert_int_equal(kvp_table_seq_info(f.t, a, &info), KVP_OK);
    assert_int_equal(info.last_page_len, 4);
    /* too little room for the ops: EINVAL saying how many, nothing changed */
    kvp_page_op_t one;
    int32_t nops;
    assert_int_equal(kvp_table_append(f.t, a, 8, toks, NULL, &one, 1, &nops), KVP_EINVAL);
    assert_non_null(strstr(kvp_table_last_error(f.t), "needs room for 2"));
    assert_int_equal(kvp_table_seq_info(f.t, a, &info), KVP_OK);
    assert_int_equal(info.length, 12);
    done(&f);
}

static void test_fork_copy_on_write_paged(void **state) {
    (void)state;
    fixture f = make(4, 8, 0, NULL);
    int32_t a = new_seq(&f);
    append(&f, a, 6, toks); /* pages 0 (full), 1 (2 tokens) */
    int32_t b, nops = -1;
    assert_int_equal(kvp_table_fork(f.t, a, &b, NULL, 0, &nops), KVP_OK);
    assert_int_equal(nops, 0); /* copy is lazy */
    assert_int_equal(refcount(&f, 0), 2);
    assert_int_equal(refcount(&f, 1), 2);
    /* the child appends first: it copies the shared partial page */
    appended *r = append(&f, b, 1, toks + 6);
    assert_int_equal(r->nops, 1);
    assert_op(&r->ops[0], KVP_OP_COPY, 1, 2, 2, -1);
    assert_int_equal(r->slots[0], 2 * 4 + 2);
    assert_int_equal(refcount(&f, 1), 1);
    /* now the parent owns page 1 alone: it writes in place */
    r = append(&f, a, 1, toks + 6);
    assert_int_equal(r->nops, 0);
    assert_int_equal(r->slots[0], 1 * 4 + 2);
    int32_t pa[4], pb[4];
    assert_int_equal(pages_of(&f, a, pa), 2);
    assert_int_equal(pages_of(&f, b, pb), 2);
    assert_int_equal(pa[0], 0);
    assert_int_equal(pb[0], 0);
    assert_int_equal(pa[1], 1);
    assert_int_equal(pb[1], 2);
    /* forking an aligned sequence shares only full pages: no copy ever */
    int32_t c = new_seq(&f);
    append(&f, c, 4, toks);
    int32_t d;
    assert_int_equal(kvp_table_fork(f.t, c, &d, NULL, 0, &nops), KVP_OK);
    r = append(&f, d, 1, toks);
    assert_int_equal(r->nops, 0);
    done(&f);
}

static void test_fork_staged_copies_staging(void **state) {
    (void)state;
    fixture f = make(4, 8, 3, NULL);
    int32_t a = new_seq(&f);
    append(&f, a, 6, toks);
    int32_t b, nops = -1;
    kvp_page_op_t op;
    assert_int_equal(kvp_table_fork(f.t, a, &b, NULL, 0, &nops), KVP_EINVAL); /* needs 1 op */
    assert_int_equal(kvp_table_fork(f.t, a, &b, &op, 1, &nops), KVP_OK);
    assert_int_equal(nops, 1);
    assert_op(&op, KVP_OP_COPY, 8, 9, 2, -1);
    assert_int_equal(refcount(&f, 0), 2);
    appended *r = append(&f, b, 2, toks + 6); /* completes the child's page */
    assert_op(&r->ops[0], KVP_OP_SEAL, 9, 1, 2, 0);
    /* the third sequence takes the last staging page; a fourth cannot exist */
    int32_t c = new_seq(&f), d;
    assert_int_equal(kvp_table_fork(f.t, c, &d, &op, 1, &nops), KVP_ENOSPC);
    assert_non_null(strstr(kvp_table_last_error(f.t), "staging"));
    assert_int_equal(kvp_table_seq_create(f.t, 0, 0, &d), KVP_ENOSPC);
    assert_int_equal(kvp_table_seq_release(f.t, c), KVP_OK);
    assert_int_equal(kvp_table_seq_create(f.t, 0, 0, &d), KVP_OK);
    done(&f);
}

static void test_truncate(void **state) {
    (void)state;
    /* staging: cutting into a sealed page reopens it */
    fixture f = make(4, 8, 2, NULL);
    int32_t a = new_seq(&f);
    append(&f, a, 10, toks); /* sealed 0, 1; staging 2 tokens */
    kvp_page_op_t op;
    int32_t nops = -1;
    assert_int_equal(kvp_table_truncate(f.t, a, 9, &op, 1, &nops), KVP_OK);
    assert_int_equal(nops, 0); /* still within the staging page */
    assert_int_equal(kvp_table_truncate(f.t, a, 6, NULL, 0, &nops), KVP_EINVAL); /* needs 1 */
    assert_int_equal(kvp_table_truncate(f.t, a, 6, &op, 1, &nops), KVP_OK);
    assert_int_equal(nops, 1);
    assert_op(&op, KVP_OP_UNSEAL, 1, 8, 2, -1);
    int32_t pages[4];
    assert_int_equal(pages_of(&f, a, pages), 2);
    assert_int_equal(pages[1], 8);
    assert_int_equal(refcount(&f, 1), 0);
    assert_int_equal(kvp_table_truncate(f.t, a, 4, &op, 1, &nops), KVP_OK);
    assert_int_equal(nops, 0);
    assert_int_equal(kvp_table_truncate(f.t, a, 5, &op, 1, &nops), KVP_EINVAL); /* past the end */
    assert_non_null(strstr(kvp_table_last_error(f.t), "outside 0..4"));
    assert_int_equal(kvp_table_truncate(f.t, a, -1, &op, 1, &nops), KVP_EINVAL);
    assert_int_equal(kvp_table_truncate(f.t, a, 0, &op, 1, &nops), KVP_OK);
    assert_int_equal(pages_of(&f, a, pages), 0);
    done(&f);

    /* no staging: pages past the end are dropped; a cached page that becomes
     * partial is taken out of the cache when nobody else holds it */
    f = make(4, 8, 0, NULL);
    a = new_seq(&f);
    append(&f, a, 12, toks); /* 3 full pages, all stored */
    assert_int_equal(stats(&f).pages_stored, 3);
    assert_int_equal(kvp_table_truncate(f.t, a, 6, NULL, 0, &nops), KVP_OK);
    assert_int_equal(nops, 0);
    /* page 2 was a leaf of the cache: released to it; page 1 (partial) has a
     * stored child, so it stays stored and the next append copies it */
    assert_int_equal(stats(&f).cached_pages, 1);
    appended *r = append(&f, a, 1, toks + 6);
    assert_int_equal(r->nops, 1);
    assert_op(&r->ops[0], KVP_OP_COPY, 1, 3, 2, -1);
    int32_t b = new_seq(&f);
    append(&f, b, 8, toks + 100); /* pages 4, 5 stored */
    assert_int_equal(kvp_table_truncate(f.t, b, 7, NULL, 0, &nops), KVP_OK);
    assert_int_equal(stats(&f).pages_evicted, 1); /* page 5 taken out of the cache */
    r = append(&f, b, 1, toks + 107);
    assert_int_equal(r->nops, 0); /* written in place */
    assert_int_equal(r->slots[0], 5 * 4 + 3);
    done(&f);
}

/* ---- reservations ----------------------------------------------------------------- */

static void test_reserve_guarantees_append(void **state) {
    (void)state;
    test_alloc_state st = {0, -1, 0, 0};
    kvp_allocator_t al = test_allocator(&st);
    fixture f = make(4, 8, 0, &al);
    int32_t a = new_seq(&f);
    assert_int_equal(kvp_table_reserve(f.t, a, 9), KVP_OK); /* 3 pages */
    kvp_seq_info_t info = {.struct_size = sizeof info};
    assert_int_equal(kvp_table_seq_info(f.t, a, &info), KVP_OK);
    assert_int_equal(info.reserved_tokens, 9);
    assert_int_equal(info.reserved_pages, 3);
    assert_int_equal(stats(&f).available_pages, 5);
    /* others cannot take the reserved pages */
    int32_t pages[8];
    assert_int_equal(kvp_pool_alloc(f.pool, 6, pages), KVP_ENOSPC);
    assert_int_equal(kvp_pool_alloc(f.pool, 5, pages), KVP_OK);
    int32_t b = new_seq(&f);
    int32_t nops;
    kvp_page_op_t ops[4];
    assert_int_equal(kvp_table_append(f.t, b, 1, toks, NULL, ops, 4, &nops), KVP_ENOSPC);
    assert_int_equal(kvp_table_reserve(f.t, b, 1), KVP_ENOSPC);
    assert_non_null(strstr(kvp_table_last_error(f.t), "available"));
    /* the reserved appends succeed and allocate nothing */
    long calls = st.calls;
    append(&f, a, 5, toks);
    append(&f, a, 4, toks + 5);
    assert_int_equal(st.calls, calls);
    assert_int_equal(kvp_table_seq_info(f.t, a, &info), KVP_OK);
    assert_int_equal(info.reserved_tokens, 0);
    assert_int_equal(info.reserved_pages, 0);
    assert_int_equal(kvp_table_append(f.t, a, 4, toks, NULL, ops, 4, &nops), KVP_ENOSPC);
    /* lowering and dropping a reservation gives pages back */
    assert_int_equal(kvp_pool_release(f.pool, 5, pages), KVP_OK);
    assert_int_equal(kvp_table_reserve(f.t, b, 16), KVP_OK);
    assert_int_equal(stats(&f).reserved_pages, 4);
    assert_int_equal(kvp_table_reserve(f.t, b, 5), KVP_OK);
    assert_int_equal(stats(&f).reserved_pages, 2);
    assert_int_equal(kvp_table_reserve(f.t, b, 0), KVP_OK);
    assert_int_equal(stats(&f).reserved_pages, 0);
    /* truncation drops the reservation */
    assert_int_equal(kvp_table_reserve(f.t, b, 4), KVP_OK);
    assert_int_equal(kvp_table_truncate(f.t, b, 0, NULL, 0, &nops), KVP_OK);
    assert_int_equal(stats(&f).reserved_pages, 0);
    done(&f);
    assert_int_equal(st.live, 0);
}

/* A reservation counts the copy-on-write page of a shared partial page, and
 * a fork of a reserved sequence reserves it. */
static void test_reserve_counts_copy_on_write(void **state) {
    (void)state;
    fixture f = make(4, 5, 0, NULL);
    int32_t a = new_seq(&f), b, nops;
    append(&f, a, 6, toks); /* 2 pages */
    assert_int_equal(kvp_table_reserve(f.t, a, 1), KVP_OK);
    assert_int_equal(stats(&f).reserved_pages, 0); /* fits in page 1 */
    assert_int_equal(kvp_table_fork(f.t, a, &b, NULL, 0, &nops), KVP_OK);
    assert_int_equal(stats(&f).reserved_pages, 1); /* a must now copy page 1 */
    int32_t pages[3];
    assert_int_equal(kvp_pool_alloc(f.pool, 2, pages), KVP_OK);
    kvp_page_op_t ops[2];
    assert_int_equal(kvp_table_append(f.t, b, 1, toks, NULL, ops, 2, &nops), KVP_ENOSPC);
    appended *r = append(&f, a, 1, toks + 6);
    assert_int_equal(r->nops, 1);
    assert_op(&r->ops[0], KVP_OP_COPY, 1, 4, 2, -1);
    /* with the last free page reserved, a fork that needs one more fails */
    assert_int_equal(kvp_table_reserve(f.t, b, 1), KVP_OK); /* page 1 is b's alone now */
    assert_int_equal(stats(&f).available_pages, 0);
    int32_t c;
    assert_int_equal(kvp_pool_release(f.pool, 2, pages), KVP_OK);
    assert_int_equal(kvp_pool_alloc(f.pool, 2, pages), KVP_OK);
    assert_int_equal(kvp_table_fork(f.t, b, &c, NULL, 0, &nops), KVP_ENOSPC);
    assert_non_null(strstr(kvp_table_last_error(f.t), "copy-on-write"));
    assert_int_equal(kvp_pool_release(f.pool, 2, pages), KVP_OK);
    done(&f);
}

/* After a fork shares the last page of a reserved sequence, its reserved
 * append copies that page, still without allocating: the copy replaces the
 * last page-list entry. The list is exactly full here (4 of 4 entries). */
static void test_reserved_append_after_fork_allocates_nothing(void **state) {
    (void)state;
    test_alloc_state st = {0, -1, 0, 0};
    kvp_allocator_t al = test_allocator(&st);
    fixture f = make(4, 16, 0, &al);
    int32_t a = new_seq(&f), b, nops;
    append(&f, a, 14, toks); /* 4 pages, the list grown to exactly 4 */
    assert_int_equal(kvp_table_reserve(f.t, a, 2), KVP_OK);
    assert_int_equal(kvp_table_fork(f.t, a, &b, NULL, 0, &nops), KVP_OK);
    long calls = st.calls;
    appended *r = append(&f, a, 2, toks + 14);
    assert_int_equal(st.calls, calls);
    assert_int_equal(r->nops, 1);
    assert_int_equal(r->ops[0].kind, KVP_OP_COPY);
    done(&f);
    assert_int_equal(st.live, 0);
}

/* ---- prefix cache ------------------------------------------------------------------ */

typedef struct {
    int kinds[64], pages[64], parents[64];
    int n;
} event_log;

static void log_event(void *opaque, const kvp_pool_event_t *ev) {
    event_log *l = opaque;
    assert_int_equal(ev->struct_size, sizeof *ev);
    if (l->n < 64) {
        l->kinds[l->n] = ev->kind;
        l->pages[l->n] = ev->page;
        l->parents[l->n] = ev->parent;
        l->n++;
    }
}

static void test_prefix_attach(void **state) {
    (void)state;
    fixture f = make(4, 16, 0, NULL);
    event_log log = {{0}, {0}, {0}, 0};
    assert_int_equal(kvp_pool_set_event_callback(f.pool, log_event, &log), KVP_OK);
    int32_t a = new_seq(&f);
    append(&f, a, 14, toks); /* pages 0,1,2 full and stored, page 3 partial */
    assert_int_equal(log.n, 3);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(log.kinds[i], KVP_EVENT_PAGE_STORED);
        assert_int_equal(log.pages[i], i);
        assert_int_equal(log.parents[i], i - 1);
    }
    assert_int_equal(kvp_table_seq_release(f.t, a), KVP_OK);
    assert_int_equal(log.kinds[3], KVP_EVENT_PAGE_FREED); /* the partial page */
    assert_int_equal(log.pages[3], 3);
    kvp_pool_stats_t s = stats(&f);
    assert_int_equal(s.cached_pages, 3);
    assert_int_equal(s.used_pages, 0);
    assert_int_equal(s.available_pages, 16);

    int64_t m = -1;
    assert_int_equal(kvp_table_lookup_prefix(f.t, 0, toks, 14, &m), KVP_OK);
    assert_int_equal(m, 12);
    int32_t b = new_seq(&f);
    assert_int_equal(kvp_table_attach_prefix(f.t, b, toks, 14, &m), KVP_OK);
    assert_int_equal(m, 12);
    int32_t pages[8];
    assert_int_equal(pages_of(&f, b, pages), 3);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(pages[i], i);
        assert_int_equal(refcount(&f, i), 1);
    }
    s = stats(&f);
    assert_int_equal(s.cached_pages, 0);
    assert_int_equal(s.prefix_lookups, 1);
    assert_int_equal(s.prefix_hit_tokens, 12);
    assert_int_equal(s.prefix_miss_tokens, 2);
    appended *r = append(&f, b, 2, toks + 12); /* the rest of the prompt */
    assert_int_equal(r->slots[0], 3 * 4); /* a's freed partial page, reused first (LIFO) */
    /* attach needs an empty sequence */
    assert_int_equal(kvp_table_attach_prefix(f.t, b, toks, 14, &m), KVP_ESTATE);
    /* a prompt diverging inside page 1 matches page 0 only; shared now */
    int32_t other[16];
    memcpy(other, toks, sizeof other);
    other[6] = -5;
    int32_t c = new_seq(&f);
    assert_int_equal(kvp_table_attach_prefix(f.t, c, other, 16, &m), KVP_OK);
    assert_int_equal(m, 4);
    assert_int_equal(refcount(&f, 0), 2);
    /* shorter than a page: nothing */
    int32_t d = new_seq(&f);
    assert_int_equal(kvp_table_attach_prefix(f.t, d, toks, 3, &m), KVP_OK);
    assert_int_equal(m, 0);
    assert_int_equal(kvp_table_attach_prefix(f.t, d, NULL, 0, &m), KVP_OK);
    done(&f);
}

static void test_prefix_salt_and_unknown_tokens(void **state) {
    (void)state;
    fixture f = make(4, 16, 0, NULL);
    int32_t a;
    assert_int_equal(kvp_table_seq_create(f.t, 0, 0xabc, &a), KVP_OK);
    append(&f, a, 8, toks);
    int64_t m = -1;
    assert_int_equal(kvp_table_lookup_prefix(f.t, 0, toks, 8, &m), KVP_OK);
    assert_int_equal(m, 0); /* another tenant sees nothing */
    assert_int_equal(kvp_table_lookup_prefix(f.t, 0xabc, toks, 8, &m), KVP_OK);
    assert_int_equal(m, 8);
    int32_t b, nops;
    assert_int_equal(kvp_table_fork(f.t, a, &b, NULL, 0, &nops), KVP_OK);
    kvp_seq_info_t info = {.struct_size = sizeof info};
    assert_int_equal(kvp_table_seq_info(f.t, b, &info), KVP_OK);
    assert_int_equal(info.salt, 0xabc); /* forks inherit the salt */
    /* without token ids, pages are not stored, nor any page after them */
    int32_t c = new_seq(&f);
    append(&f, c, 4, toks + 100);
    append(&f, c, 4, NULL);
    append(&f, c, 4, toks + 108);
    assert_int_equal(stats(&f).pages_stored, 3); /* a's 2 + c's first */
    done(&f);
}

/* With every hash equal, lookups still compare the tokens. */
static void test_prefix_collisions_are_exact(void **state) {
    (void)state;
    fixture f = make(2, 16, 0, NULL);
    kvp__pool_set_hash_mask(f.pool, 0);
    int32_t p1[6] = {1, 2, 3, 4, 5, 6}, p2[6] = {1, 2, 3, 9, 5, 6}, p3[6] = {7, 7, 3, 4, 5, 6};
    int32_t a = new_seq(&f), b = new_seq(&f), c = new_seq(&f);
    int64_t m;
    append(&f, a, 6, p1);
    /* b shares a's first page through the cache, then stores its own two */
    assert_int_equal(kvp_table_attach_prefix(f.t, b, p2, 6, &m), KVP_OK);
    assert_int_equal(m, 2);
    append(&f, b, 4, p2 + 2);
    append(&f, c, 6, p3);
    assert_int_equal(stats(&f).pages_stored, 3 + 2 + 3);
    int32_t q[6] = {1, 2, 3, 9, 5, 7};
    assert_int_equal(kvp_table_lookup_prefix(f.t, 0, q, 6, &m), KVP_OK);
    assert_int_equal(m, 4);
    int32_t d = new_seq(&f);
    assert_int_equal(kvp_table_attach_prefix(f.t, d, p3, 6, &m), KVP_OK);
    assert_int_equal(m, 6);
    int32_t pd[3], pc[3];
    pages_of(&f, d, pd);
    pages_of(&f, c, pc);
    assert_memory_equal(pd, pc, sizeof pd);
    done(&f);
}

/* Eviction: lowest priority first, then least recently released, and only
 * pages no cached page extends. */
static void test_eviction_order(void **state) {
    (void)state;
    fixture f = make(2, 8, 0, NULL);
    event_log log = {{0}, {0}, {0}, 0};
    int32_t a = new_seq(&f), b = new_seq(&f), c = new_seq(&f);
    int32_t pa[4] = {1, 2, 3, 4}, pb[2] = {5, 6}, pc[2] = {7, 8};
    append(&f, a, 4, pa); /* pages 0, 1 (chain) */
    append(&f, b, 2, pb); /* page 2 */
    append(&f, c, 2, pc); /* page 3 */
    assert_int_equal(kvp_table_set_priority(f.t, c, 5), KVP_OK);
    assert_int_equal(kvp_table_seq_release(f.t, b), KVP_OK); /* oldest */
    assert_int_equal(kvp_table_seq_release(f.t, a), KVP_OK);
    assert_int_equal(kvp_table_seq_release(f.t, c), KVP_OK);
    assert_int_equal(stats(&f).cached_pages, 4);
    assert_int_equal(kvp_pool_set_event_callback(f.pool, log_event, &log), KVP_OK);
    int32_t pages[8];
    assert_int_equal(kvp_pool_alloc(f.pool, 8, pages), KVP_OK); /* 4 free + 4 evicted */
    int order[4], n = 0;
    for (int i = 0; i < log.n; i++)
        if (log.kinds[i] == KVP_EVENT_PAGE_EVICTED) order[n++] = log.pages[i];
    assert_int_equal(n, 4);
    assert_int_equal(order[0], 2); /* priority 0, released first */
    assert_int_equal(order[1], 1); /* a's leaf, then its parent */
    assert_int_equal(order[2], 0);
    assert_int_equal(order[3], 3); /* priority 5 last */
    assert_int_equal(kvp_pool_release(f.pool, 8, pages), KVP_OK);
    done(&f);
}

/* Pinning a system prompt: its pages outlive everything of lower priority. */
static void test_range_priority_pins_prompt(void **state) {
    (void)state;
    fixture f = make(4, 6, 0, NULL);
    int32_t sys = new_seq(&f);
    append(&f, sys, 10, toks);                       /* pages 0, 1 full, 2 partial */
    assert_int_equal(kvp_table_set_range_priority(f.t, sys, 0, 9, 100), KVP_OK);
    assert_int_equal(kvp_table_set_range_priority(f.t, sys, 0, 11, 1), KVP_EINVAL);
    assert_int_equal(kvp_table_set_range_priority(f.t, sys, 5, 4, 1), KVP_EINVAL);
    assert_int_equal(kvp_table_seq_release(f.t, sys), KVP_OK);
    int32_t other = new_seq(&f);
    append(&f, other, 8, toks + 200); /* two more stored pages */
    assert_int_equal(kvp_table_seq_release(f.t, other), KVP_OK);
    assert_int_equal(stats(&f).cached_pages, 4);
    int32_t pages[4];
    assert_int_equal(kvp_pool_alloc(f.pool, 4, pages), KVP_OK); /* 2 free + 2 evicted */
    int64_t m;
    assert_int_equal(kvp_table_lookup_prefix(f.t, 0, toks, 8, &m), KVP_OK);
    assert_int_equal(m, 8); /* the pinned prompt survived */
    assert_int_equal(kvp_table_lookup_prefix(f.t, 0, toks + 200, 8, &m), KVP_OK);
    assert_int_equal(m, 0);
    assert_int_equal(kvp_pool_release(f.pool, 4, pages), KVP_OK);
    /* explicit eviction drops the rest, leaves first */
    int32_t evicted = -1;
    assert_int_equal(kvp_pool_evict(f.pool, INT32_MAX, &evicted), KVP_OK);
    assert_int_equal(evicted, 2);
    assert_int_equal(stats(&f).cached_pages, 0);
    done(&f);
}

/* Attaching does not take cached pages that reservations count on. */
static void test_attach_respects_reservations(void **state) {
    (void)state;
    fixture f = make(4, 4, 0, NULL);
    int32_t a = new_seq(&f);
    append(&f, a, 8, toks);
    assert_int_equal(kvp_table_seq_release(f.t, a), KVP_OK); /* 2 cached */
    int32_t b = new_seq(&f);
    assert_int_equal(kvp_table_reserve(f.t, b, 12), KVP_OK); /* 3 pages: 2 free + 1 cached */
    int32_t c = new_seq(&f);
    int64_t m;
    assert_int_equal(kvp_table_attach_prefix(f.t, c, toks, 8, &m), KVP_OK);
    assert_int_equal(m, 4); /* the second cached page is promised to b */
    append(&f, b, 12, toks + 50);
    done(&f);
}

/* ---- export --------------------------------------------------------------------- */

static void test_export(void **state) {
    (void)state;
    fixture f = make(4, 16, 3, NULL);
    int32_t a = new_seq(&f), b = new_seq(&f), c = new_seq(&f);
    append(&f, a, 10, toks); /* sealed 0, 1; staging 16 (2 tokens) */
    append(&f, b, 4, toks);  /* sealed 2 */
    int32_t seqs[3] = {a, b, c}, num_new[3] = {3, 4, 0};
    int64_t ni = -1, ns = -1;
    assert_int_equal(kvp_table_export_size(f.t, seqs, 3, num_new, &ni, &ns), KVP_OK);
    assert_int_equal(ni, 4);
    assert_int_equal(ns, 7);
    int32_t indptr[4], indices[8], last[3], qo[4];
    int64_t slots[8];
    kvp_batch_buffers_t buf = {.struct_size = sizeof buf};
    buf.indptr = indptr;
    buf.indices = indices;
    buf.last_page_len = last;
    buf.slot_mapping = slots;
    buf.qo_indptr = qo;
    buf.indices_capacity = 3; /* too small */
    buf.slots_capacity = 8;
    memset(indptr, 0x7f, sizeof indptr);
    assert_int_equal(kvp_table_export(f.t, seqs, 3, num_new, &buf, NULL), KVP_EINVAL);
    assert_non_null(strstr(kvp_table_last_error(f.t), "indices needs 4"));
    assert_int_equal(indptr[0], 0x7f7f7f7f); /* untouched */
    buf.indices_capacity = 8;
    /* a view without its struct_size is refused, and nothing is written */
    kvp_kv_view_t view;
    memset(&view, 0x5a, sizeof view);
    view.struct_size = 0;
    assert_int_equal(kvp_table_export(f.t, seqs, 3, num_new, &buf, &view), KVP_EINVAL);
    assert_non_null(strstr(kvp_table_last_error(f.t), "struct_size"));
    assert_int_equal(indptr[0], 0x7f7f7f7f);
    assert_int_equal(view.struct_size, 0);
    assert_int_equal(view.batch, 0x5a5a5a5a);
    view.struct_size = offsetof(kvp_kv_view_t, indptr); /* too small as well */
    assert_int_equal(kvp_table_export(f.t, seqs, 3, num_new, &buf, &view), KVP_EINVAL);
    assert_int_equal(indptr[0], 0x7f7f7f7f);
    assert_int_equal(view.batch, 0x5a5a5a5a);
    view.struct_size = sizeof view;
    assert_int_equal(kvp_table_export(f.t, seqs, 3, num_new, &buf, &view), KVP_OK);
    int32_t want_indptr[4] = {0, 3, 4, 4}, want_indices[4] = {0, 1, 16, 2}, want_last[3] = {2, 4, 0};
    assert_memory_equal(indptr, want_indptr, sizeof want_indptr);
    assert_memory_equal(indices, want_indices, sizeof want_indices);
    assert_memory_equal(last, want_last, sizeof want_last);
    int64_t want_slots[7] = {1 * 4 + 3, 16 * 4 + 0, 16 * 4 + 1, 8, 9, 10, 11};
    assert_memory_equal(slots, want_slots, sizeof want_slots);
    int32_t want_qo[4] = {0, 3, 7, 7};
    assert_memory_equal(qo, want_qo, sizeof want_qo);
    assert_int_equal(view.batch, 3);
    assert_int_equal(view.page_size, 4);
    assert_int_equal(view.num_pages, 16);
    assert_int_equal(view.num_staging, 3);
    assert_int_equal(view.struct_size, sizeof view);
    assert_ptr_equal(view.indptr, indptr);
    assert_ptr_equal(view.indices, indices);
    assert_ptr_equal(view.last_page_len, last);
    /* the lengths FlashInfer's formula gives back */
    int64_t lens[3] = {10, 4, 0};
    for (int i = 0; i < 2; i++)
        assert_int_equal((int64_t)(indptr[i + 1] - indptr[i] - 1) * 4 + last[i], lens[i]);
    /* bad batches */
    int32_t bad_new[3] = {11, 0, 0};
    assert_int_equal(kvp_table_export(f.t, seqs, 3, bad_new, &buf, NULL), KVP_EINVAL);
    assert_non_null(strstr(kvp_table_last_error(f.t), "num_new[0]"));
    assert_int_equal(kvp_table_seq_release(f.t, b), KVP_OK);
    assert_int_equal(kvp_table_export(f.t, seqs, 3, NULL, &buf, NULL), KVP_ENOENT);
    assert_non_null(strstr(kvp_table_last_error(f.t), "seqs[1]"));
    assert_int_equal(kvp_table_export_size(f.t, seqs, 3, NULL, &ni, &ns), KVP_ENOENT);
    assert_int_equal(kvp_table_export(f.t, seqs, -1, NULL, &buf, NULL), KVP_EINVAL);
    assert_int_equal(kvp_table_export(f.t, NULL, 1, NULL, &buf, NULL), KVP_EINVAL);
    assert_int_equal(kvp_table_export(f.t, seqs, 1, NULL, NULL, NULL), KVP_EINVAL);
    assert_int_equal(kvp_table_export_size(f.t, seqs, 1, NULL, NULL, &ns), KVP_EINVAL);
    /* an empty batch */
    assert_int_equal(kvp_table_export(f.t, NULL, 0, NULL, &buf, &view), KVP_OK);
    assert_int_equal(indptr[0], 0);
    assert_int_equal(view.batch, 0);
    done(&f);
}

/* ---- bad input --------------------------------------------------------------------- */

static void test_bad_ids_and_arguments(void **state) {
    (void)state;
    fixture f = make(4, 8, 0, NULL);
    int32_t a = new_seq(&f);
    append(&f, a, 5, toks);
    int32_t gone = new_seq(&f);
    assert_int_equal(kvp_table_seq_release(f.t, gone), KVP_OK);
    kvp_pool_stats_t before = stats(&f);
    int32_t ids[] = {gone, -1, 12345, 15, INT32_MAX};
    kvp_page_op_t ops[4];
    int32_t nops, out;
    int64_t m;
    kvp_seq_info_t info = {.struct_size = sizeof info};
    for (size_t i = 0; i < sizeof ids / sizeof *ids; i++) {
        int32_t id = ids[i];
        assert_int_equal(kvp_table_seq_release(f.t, id), KVP_ENOENT);
        assert_non_null(strstr(kvp_table_last_error(f.t), "not live"));
        assert_int_equal(kvp_table_reserve(f.t, id, 1), KVP_ENOENT);
        assert_int_equal(kvp_table_append(f.t, id, 1, toks, NULL, ops, 4, &nops), KVP_ENOENT);
        assert_int_equal(kvp_table_truncate(f.t, id, 0, ops, 4, &nops), KVP_ENOENT);
        assert_int_equal(kvp_table_fork(f.t, id, &out, ops, 4, &nops), KVP_ENOENT);
        assert_int_equal(kvp_table_attach_prefix(f.t, id, toks, 4, &m), KVP_ENOENT);
        assert_int_equal(kvp_table_set_priority(f.t, id, 1), KVP_ENOENT);
        assert_int_equal(kvp_table_set_range_priority(f.t, id, 0, 0, 1), KVP_ENOENT);
        assert_int_equal(kvp_table_seq_info(f.t, id, &info), KVP_ENOENT);
        assert_int_equal(kvp_table_seq_pages(f.t, id, &out, 1), KVP_ENOENT);
    }
    /* a released id stays invalid when its slot is reused */
    int32_t reuse = new_seq(&f);
    assert_int_not_equal(reuse, gone);
    assert_int_equal(kvp_table_seq_release(f.t, gone), KVP_ENOENT);
    assert_int_equal(kvp_table_seq_release(f.t, reuse), KVP_OK);
    /* counts: negative, too long, overflowing */
    assert_int_equal(kvp_table_append(f.t, a, -1, toks, NULL, ops, 4, &nops), KVP_EINVAL);
    assert_int_equal(kvp_table_append(f.t, a, INT32_MAX, NULL, NULL, ops, 4, &nops), KVP_EINVAL);
    assert_non_null(strstr(kvp_table_last_error(f.t), "2^31-1"));
    assert_int_equal(kvp_table_append(f.t, a, INT64_MAX, NULL, NULL, ops, 4, &nops), KVP_EINVAL);
    assert_int_equal(kvp_table_reserve(f.t, a, -3), KVP_EINVAL);
    assert_int_equal(kvp_table_reserve(f.t, a, INT64_MAX), KVP_EINVAL);
    assert_int_equal(kvp_table_append(f.t, a, 1, toks, NULL, ops, 4, NULL), KVP_EINVAL);
    assert_int_equal(kvp_table_append(f.t, a, 1, toks, NULL, ops, -1, &nops), KVP_EINVAL);
    assert_int_equal(kvp_table_attach_prefix(f.t, a, toks, -1, &m), KVP_EINVAL);
    assert_int_equal(kvp_table_attach_prefix(f.t, a, NULL, 4, &m), KVP_EINVAL);
    assert_int_equal(kvp_table_attach_prefix(f.t, a, toks, 4, NULL), KVP_EINVAL);
    assert_int_equal(kvp_table_lookup_prefix(f.t, 0, toks, (int64_t)INT32_MAX + 1, &m), KVP_EINVAL);
    assert_int_equal(kvp_table_fork(f.t, a, NULL, ops, 4, &nops), KVP_EINVAL);
    assert_int_equal(kvp_table_truncate(f.t, a, 6, ops, 4, &nops), KVP_EINVAL);
    assert_int_equal(kvp_table_seq_pages(f.t, a, &out, 1), KVP_EINVAL); /* has 2 pages */
    assert_non_null(strstr(kvp_table_last_error(f.t), "has 2 pages"));
    assert_int_equal(kvp_table_seq_info(f.t, a, NULL), KVP_EINVAL);
    assert_int_equal(kvp_table_seq_create(f.t, 0, 0, NULL), KVP_EINVAL);
    /* NULL tables */
    assert_int_equal(kvp_table_seq_create(NULL, 0, 0, &out), KVP_EINVAL);
    assert_int_equal(kvp_table_append(NULL, a, 1, toks, NULL, ops, 4, &nops), KVP_EINVAL);
    assert_int_equal(kvp_table_seq_release(NULL, a), KVP_EINVAL);
    assert_string_equal(kvp_table_last_error(NULL), "NULL handle");
    kvp_table_destroy(NULL);
    kvp_pool_stats_t after = stats(&f);
    assert_memory_equal(&before, &after, sizeof before);
    /* table creation */
    kvp_table_t *t2 = NULL;
    char err[KVP_ERR_SIZE];
    assert_int_equal(kvp_table_create(f.pool, -1, &t2, err, sizeof err), KVP_EINVAL);
    assert_non_null(strstr(err, "max_seqs"));
    assert_int_equal(kvp_table_create(f.pool, (1 << 24) + 1, &t2, err, sizeof err), KVP_EINVAL);
    assert_non_null(strstr(err, "max_seqs"));
    assert_int_equal(kvp_table_create(NULL, 0, &t2, err, sizeof err), KVP_EINVAL);
    assert_int_equal(kvp_table_create(f.pool, 0, NULL, err, sizeof err), KVP_EINVAL);
    assert_null(t2);
    done(&f);
}

/* kvp_table_seq_create() takes the priority and the salt directly. */
static void test_seq_create_priority_and_salt(void **state) {
    (void)state;
    fixture f = make(4, 16, 0, NULL);
    int32_t a = -1;
    assert_int_equal(kvp_table_seq_create(f.t, 7, 0x55, &a), KVP_OK);
    assert_true(a >= 0);
    kvp_seq_info_t info = {.struct_size = sizeof info};
    assert_int_equal(kvp_table_seq_info(f.t, a, &info), KVP_OK);
    assert_int_equal(info.priority, 7);
    assert_int_equal(info.salt, 0x55);
    assert_int_equal(info.length, 0);
    int32_t b = -1;
    assert_int_equal(kvp_table_seq_create(f.t, -3, 0, &b), KVP_OK);
    assert_int_equal(kvp_table_seq_info(f.t, b, &info), KVP_OK);
    assert_int_equal(info.priority, -3);
    assert_int_equal(info.salt, 0);
    /* a full page of `a` is cached under its salt only */
    append(&f, a, 4, toks);
    int64_t m = -1;
    assert_int_equal(kvp_table_lookup_prefix(f.t, 0x55, toks, 4, &m), KVP_OK);
    assert_int_equal(m, 4);
    assert_int_equal(kvp_table_lookup_prefix(f.t, 0, toks, 4, &m), KVP_OK);
    assert_int_equal(m, 0);
    assert_int_equal(kvp_table_seq_release(f.t, a), KVP_OK);
    assert_int_equal(kvp_table_seq_release(f.t, b), KVP_OK);
    done(&f);
}

/* The detail text: "" until a call fails, then kept (sticky) through later
 * calls that succeed, replaced by the next failure; "NULL handle" for NULL. */
static void test_last_error_is_sticky(void **state) {
    (void)state;
    assert_string_equal(kvp_table_last_error(NULL), "NULL handle");
    fixture f = make(4, 16, 0, NULL);
    assert_string_equal(kvp_table_last_error(f.t), "");
    int32_t a = new_seq(&f);
    append(&f, a, 5, toks);
    assert_string_equal(kvp_table_last_error(f.t), "");
    assert_int_equal(kvp_table_truncate(f.t, a, 9, NULL, 0, &(int32_t){0}), KVP_EINVAL);
    char first[KVP_ERR_SIZE];
    snprintf(first, sizeof first, "%s", kvp_table_last_error(f.t));
    assert_true(strlen(first) > 0);
    /* successful calls leave it unchanged */
    int32_t b = new_seq(&f);
    append(&f, b, 3, toks + 50);
    assert_int_equal(kvp_table_reserve(f.t, b, 4), KVP_OK);
    kvp_seq_info_t info = {.struct_size = sizeof info};
    assert_int_equal(kvp_table_seq_info(f.t, a, &info), KVP_OK);
    int32_t child, nops;
    kvp_page_op_t op;
    assert_int_equal(kvp_table_fork(f.t, a, &child, &op, 1, &nops), KVP_OK);
    assert_int_equal(kvp_table_seq_release(f.t, child), KVP_OK);
    assert_string_equal(kvp_table_last_error(f.t), first);
    /* the next failure replaces it */
    assert_int_equal(kvp_table_seq_release(f.t, child), KVP_ENOENT);
    assert_non_null(strstr(kvp_table_last_error(f.t), "not live"));
    assert_string_not_equal(kvp_table_last_error(f.t), first);
    assert_int_equal(kvp_table_seq_release(f.t, a), KVP_OK);
    assert_int_equal(kvp_table_seq_release(f.t, b), KVP_OK);
    assert_non_null(strstr(kvp_table_last_error(f.t), "not live"));
    done(&f);
}

static void test_sequence_slots_run_out(void **state) {
    (void)state;
    fixture f = make(4, 8, 0, NULL);
    int32_t ids[16], x;
    for (int i = 0; i < 16; i++) ids[i] = new_seq(&f);
    assert_int_equal(kvp_table_seq_create(f.t, 0, 0, &x), KVP_ENOSPC);
    assert_non_null(strstr(kvp_table_last_error(f.t), "16 sequence slots"));
    int32_t nops;
    assert_int_equal(kvp_table_fork(f.t, ids[0], &x, NULL, 0, &nops), KVP_ENOSPC);
    for (int i = 0; i < 16; i++) assert_int_equal(kvp_table_seq_release(f.t, ids[i]), KVP_OK);
    done(&f);
}

/* ---- allocation-failure injection ------------------------------------------------ */

typedef int (*growing_op)(fixture *f, int32_t seq);

static int op_reserve(fixture *f, int32_t seq) { return kvp_table_reserve(f->t, seq, 40); }
static int op_append(fixture *f, int32_t seq) {
    kvp_page_op_t ops[16];
    int32_t nops;
    return kvp_table_append(f->t, seq, 40, toks, NULL, ops, 16, &nops);
}
static int op_fork(fixture *f, int32_t seq) {
    kvp_page_op_t op;
    int32_t nops, child;
    return kvp_table_fork(f->t, seq, &child, &op, 1, &nops);
}
static int op_attach(fixture *f, int32_t seq) {
    (void)seq;
    int32_t fresh;
    int rc = kvp_table_seq_create(f->t, 0, 0, &fresh);
    if (rc != KVP_OK) return rc;
    int64_t m;
    rc = kvp_table_attach_prefix(f->t, fresh, toks, 40, &m);
    if (rc != KVP_OK) kvp_table_seq_release(f->t, fresh);
    return rc;
}

/* A fingerprint of everything observable: stats and every sequence. */
static uint64_t fingerprint(fixture *f, const int32_t *seqs, int n) {
    uint64_t h = 1469598103934665603ull;
#define MIX(v) (h = (h ^ (uint64_t)(v)) * 1099511628211ull)
    kvp_pool_stats_t s = stats(f);
    MIX(s.free_pages);
    MIX(s.cached_pages);
    MIX(s.used_pages);
    MIX(s.reserved_pages);
    MIX(s.live_tokens);
    MIX(s.live_seqs);
    MIX(s.used_staging);
    for (int i = 0; i < n; i++) {
        kvp_seq_info_t info = {.struct_size = sizeof info};
        if (kvp_table_seq_info(f->t, seqs[i], &info) != KVP_OK) continue;
        MIX(info.length);
        MIX(info.reserved_pages);
        int32_t pages[256];
        int32_t np = pages_of(f, seqs[i], pages);
        for (int k = 0; k < np; k++) MIX(pages[k]);
    }
    for (int32_t p = 0; p < s.total_pages; p++) MIX(refcount(f, p));
#undef MIX
    return h;
}

static void inject(growing_op op, int32_t staging) {
    test_alloc_state st = {0, -1, 0, 0};
    kvp_allocator_t al = test_allocator(&st);
    fixture f = make(4, 64, staging, &al);
    /* populate: one long sequence (cached pages for attach) and a short one */
    int32_t seqs[3];
    seqs[0] = new_seq(&f);
    append(&f, seqs[0], 40, toks);
    assert_int_equal(kvp_table_seq_release(f.t, seqs[0]), KVP_OK);
    seqs[1] = new_seq(&f);
    append(&f, seqs[1], 6, toks + 300);
    seqs[2] = new_seq(&f);
    long failures = 0;
    for (int target = 1; target <= 2; target++) {
        for (long k = 0;; k++) {
            uint64_t before = fingerprint(&f, seqs, 3);
            st.fail_at = st.calls + k;
            int rc = op(&f, seqs[target]);
            st.fail_at = -1;
            if (rc == KVP_OK) break;
            assert_int_equal(rc, KVP_ENOMEM);
            assert_non_null(strstr(kvp_table_last_error(f.t), "cannot"));
            assert_int_equal(fingerprint(&f, seqs, 3), before);
            check(&f);
            failures++;
        }
    }
    assert_true(failures >= 1); /* the operation did allocate, and each failure was clean */
    done(&f);
    assert_int_equal(st.live, 0);
}

static void test_fault_injection_growing_ops(void **state) {
    (void)state;
    for (int32_t staging = 0; staging <= 4; staging += 4) {
        inject(op_reserve, staging);
        inject(op_append, staging);
        inject(op_fork, staging);
        inject(op_attach, staging);
    }
}

static void test_table_create_fault_injection(void **state) {
    (void)state;
    /* the table allocates through its pool's hooks: fail each of the
     * table's allocations in turn, the pool's own stay as they are */
    test_alloc_state st = {0, -1, 0, 0};
    kvp_allocator_t al = test_allocator(&st);
    kvp_pool_t *pool = NULL;
    kvp_pool_params_t pp;
    kvp_pool_params_init(&pp);
    pp.num_pages = 8;
    pp.allocator = al;
    char err[KVP_ERR_SIZE];
    assert_int_equal(kvp_pool_create(&pp, &pool, err, sizeof err), KVP_OK);
    const long pool_live = st.live;
    assert_true(pool_live > 0);
    for (long k = 0;; k++) {
        st.fail_at = st.calls + k;
        kvp_table_t *t = NULL;
        int rc = kvp_table_create(pool, 0, &t, err, sizeof err);
        st.fail_at = -1;
        if (rc == KVP_OK) {
            assert_true(st.live > pool_live); /* it did allocate through the pool's hooks */
            kvp_table_destroy(t);
            assert_int_equal(st.live, pool_live);
            assert_true(k >= 2);
            break;
        }
        assert_int_equal(rc, KVP_ENOMEM);
        assert_null(t);
        assert_int_equal(st.live, pool_live);
    }
    kvp_pool_destroy(pool);
    assert_int_equal(st.live, 0);
}

/* ---- determinism ------------------------------------------------------------------- */

/* A fixed pseudo-random script; returns a hash of every id, slot and op. */
static uint64_t script(int32_t staging) {
    fixture f = make(4, 40, staging, NULL);
    uint64_t rng = 42, h = 1469598103934665603ull;
#define MIX(v) (h = (h ^ (uint64_t)(v)) * 1099511628211ull)
    int32_t live[8];
    int nlive = 0;
    for (int i = 0; i < 20000; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t r = (uint32_t)(rng >> 33);
        int32_t nops = 0, id;
        kvp_page_op_t ops[16];
        int64_t slots[40];
        if (nlive < 8 && (nlive == 0 || r % 5 == 0)) {
            if (kvp_table_seq_create(f.t, 0, 0, &id) == KVP_OK) {
                live[nlive++] = id;
                int64_t m;
                kvp_table_attach_prefix(f.t, id, toks, (r >> 8) % 30, &m);
                MIX(id);
                MIX(m);
            }
        } else if (r % 5 == 1) {
            int k = (int)((r >> 8) % (uint32_t)nlive);
            MIX(kvp_table_seq_release(f.t, live[k]));
            live[k] = live[--nlive];
        } else if (r % 5 == 2) {
            MIX(kvp_table_truncate(f.t, live[(r >> 8) % (uint32_t)nlive], (r >> 12) % 20, ops, 16, &nops));
        } else if (r % 5 == 3 && nlive < 8) {
            if (kvp_table_fork(f.t, live[(r >> 8) % (uint32_t)nlive], &id, ops, 16, &nops) == KVP_OK)
                live[nlive++] = id;
        } else {
            int64_t n = (r >> 8) % 40;
            int rc = kvp_table_append(f.t, live[(r >> 16) % (uint32_t)nlive], n,
                                      toks + (r >> 20) % 40, slots, ops, 16, &nops);
            MIX(rc);
            for (int64_t j = 0; rc == KVP_OK && j < n; j++) MIX(slots[j]);
        }
        for (int j = 0; j < nops; j++) {
            MIX(ops[j].kind);
            MIX(ops[j].src);
            MIX(ops[j].dst);
        }
    }
#undef MIX
    done(&f);
    return h;
}

static void test_determinism(void **state) {
    (void)state;
    assert_true(script(0) == script(0));
    assert_true(script(8) == script(8));
    assert_true(script(0) != script(8));
}

int main(void) {
    setup_tokens();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_append_paged_slots),
        cmocka_unit_test(test_append_staged_seal_ops),
        cmocka_unit_test(test_fork_copy_on_write_paged),
        cmocka_unit_test(test_fork_staged_copies_staging),
        cmocka_unit_test(test_truncate),
        cmocka_unit_test(test_reserve_guarantees_append),
        cmocka_unit_test(test_reserve_counts_copy_on_write),
        cmocka_unit_test(test_reserved_append_after_fork_allocates_nothing),
        cmocka_unit_test(test_prefix_attach),
        cmocka_unit_test(test_prefix_salt_and_unknown_tokens),
        cmocka_unit_test(test_prefix_collisions_are_exact),
        cmocka_unit_test(test_eviction_order),
        cmocka_unit_test(test_range_priority_pins_prompt),
        cmocka_unit_test(test_attach_respects_reservations),
        cmocka_unit_test(test_export),
        cmocka_unit_test(test_bad_ids_and_arguments),
        cmocka_unit_test(test_seq_create_priority_and_salt),
        cmocka_unit_test(test_last_error_is_sticky),
        cmocka_unit_test(test_sequence_slots_run_out),
        cmocka_unit_test(test_fault_injection_growing_ops),
        cmocka_unit_test(test_table_create_fault_injection),
        cmocka_unit_test(test_determinism),
    };
    return cmocka_run_group_tests_name("table", tests, NULL, NULL);
}
