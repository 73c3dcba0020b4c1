/*
 * Layer: pool — creation (from counts, a plan, a budget), O(1) allocation
 * with reference counts, staging pages, all-or-nothing failures, engine
 * references, stats, and allocation-failure injection.
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
#include "paging.h"
#include "testutil.h"

static kvp_pool_t *make_pool(int32_t P, int32_t N, int32_t S, kvp_allocator_t *a) {
    kvp_pool_params_t p;
    kvp_pool_params_init(&p);
    p.page_size = P;
    p.num_pages = N;
    p.num_staging = S;
    if (a != NULL) p.allocator = *a;
    kvp_pool_t *pool = NULL;
    char err[KVP_ERR_SIZE] = "";
    int rc = kvp_pool_create(&p, &pool, err, sizeof err);
    if (rc != KVP_OK) print_error("create: %s\n", err);
    assert_int_equal(rc, KVP_OK);
    return pool;
}

static kvp_pool_stats_t stats_of(kvp_pool_t *pool) {
    kvp_pool_stats_t s;
    memset(&s, 0, sizeof s);
    s.struct_size = sizeof s;
    assert_int_equal(kvp_pool_stats(pool, &s), KVP_OK);
    return s;
}

static void assert_pool_ok(kvp_pool_t *pool) {
    char err[KVP_ERR_SIZE];
    int rc = kvp__pool_check(pool, err, sizeof err);
    if (rc != KVP_OK) print_error("invariant: %s\n", err);
    assert_int_equal(rc, KVP_OK);
}

static void test_params_init(void **state) {
    (void)state;
    kvp_pool_params_t p;
    memset(&p, 0x5a, sizeof p);
    kvp_pool_params_init(&p);
    assert_int_equal(p.struct_size, sizeof p);
    assert_int_equal(p.page_size, 16);
    assert_int_equal(p.num_pages, 0);
    assert_int_equal(p.num_staging, 0);
    assert_int_equal(p.prefix_cache, 1);
    assert_int_equal(p.hash_seed, 0);
    assert_null(p.allocator.alloc); /* zeroed hooks: libc */
    assert_null(p.allocator.free);
    assert_null(p.allocator.opaque);
    kvp_pool_params_init(NULL); /* ignored */
}

static void test_create_bad_input(void **state) {
    (void)state;
    struct { int32_t P, N, S, cache; const char *needle; } bad[] = {
        {0, 8, 0, 1, "page_size"},       {4097, 8, 0, 1, "page_size"},
        {16, 0, 0, 1, "num_pages"},      {16, -5, 0, 1, "num_pages"},
        {16, 8, -1, 1, "num_staging"},   {16, INT32_MAX, 1, 1, "2^31-1"},
        {16, 8, 0, 2, "prefix_cache"},
    };
    char err[KVP_ERR_SIZE];
    kvp_pool_t *sentinel = (kvp_pool_t *)(uintptr_t)0x1234, *pool = sentinel;
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        kvp_pool_params_t p;
        kvp_pool_params_init(&p);
        p.page_size = bad[i].P;
        p.num_pages = bad[i].N;
        p.num_staging = bad[i].S;
        p.prefix_cache = bad[i].cache;
        err[0] = '\0';
        assert_int_equal(kvp_pool_create(&p, &pool, err, sizeof err), KVP_EINVAL);
        if (!strstr(err, bad[i].needle)) print_error("case %zu: '%s'\n", i, err);
        assert_non_null(strstr(err, bad[i].needle));
        assert_ptr_equal(pool, sentinel);
    }
    kvp_pool_params_t p;
    kvp_pool_params_init(&p);
    p.num_pages = 8;
    assert_int_equal(kvp_pool_create(NULL, &pool, err, sizeof err), KVP_EINVAL);
    assert_int_equal(kvp_pool_create(&p, NULL, err, sizeof err), KVP_EINVAL);
    p.struct_size = 4;
    assert_int_equal(kvp_pool_create(&p, &pool, err, sizeof err), KVP_EINVAL);
    assert_non_null(strstr(err, "struct_size"));
    kvp_pool_params_init(&p);
    p.num_pages = 8;
    kvp_allocator_t half = {kvt_alloc, NULL, NULL};
    p.allocator = half;
    assert_int_equal(kvp_pool_create(&p, &pool, err, sizeof err), KVP_EINVAL);
    assert_non_null(strstr(err, "allocator"));
    assert_ptr_equal(pool, sentinel);
    /* no error buffer: still a status */
    assert_int_equal(kvp_pool_create(NULL, &pool, NULL, 0), KVP_EINVAL);
}

/* An allocator that refuses blocks over 64 MiB (the pool's metadata for 2^31
 * pages of 4096 tokens is terabytes), so the test stays valid under ASan. */
static void *capped_alloc(void *opaque, size_t size, size_t alignment) {
    if (size > ((size_t)64 << 20)) {
        ((test_alloc_state *)opaque)->calls++;
        return NULL;
    }
    return kvt_alloc(opaque, size, alignment);
}

static void test_create_huge_is_enomem(void **state) {
    (void)state;
    test_alloc_state st = {0, -1, 0, 0};
    kvp_allocator_t a = {capped_alloc, kvt_free, &st};
    kvp_pool_params_t p;
    kvp_pool_params_init(&p);
    p.page_size = KVP_MAX_PAGE_SIZE;
    p.num_pages = INT32_MAX - 1;
    p.num_staging = 1;
    p.allocator = a;
    kvp_pool_t *pool = NULL;
    char err[KVP_ERR_SIZE];
    assert_int_equal(kvp_pool_create(&p, &pool, err, sizeof err), KVP_ENOMEM);
    assert_null(pool);
    assert_int_equal(st.live, 0);
}

static void test_alloc_release_basics(void **state) {
    (void)state;
    kvp_pool_t *pool = make_pool(16, 8, 0, NULL);
    assert_string_equal(kvp_pool_last_error(pool), "");
    int32_t pages[8];
    assert_int_equal(kvp_pool_alloc(pool, 3, pages), KVP_OK);
    /* a fresh pool hands out ids in order */
    assert_int_equal(pages[0], 0);
    assert_int_equal(pages[1], 1);
    assert_int_equal(pages[2], 2);
    kvp_pool_stats_t s = stats_of(pool);
    assert_int_equal(s.used_pages, 3);
    assert_int_equal(s.free_pages, 5);
    assert_int_equal(s.cached_pages, 0);
    assert_int_equal(s.total_pages, 8);
    assert_int_equal(s.page_size, 16);
    int32_t ref = -1;
    assert_int_equal(kvp_pool_refcount(pool, 1, &ref), KVP_OK);
    assert_int_equal(ref, 1);
    assert_int_equal(kvp_pool_retain(pool, 2, (int32_t[]){1, 1}), KVP_OK);
    assert_int_equal(kvp_pool_refcount(pool, 1, &ref), KVP_OK);
    assert_int_equal(ref, 3);
    assert_int_equal(kvp_pool_release(pool, 1, &pages[1]), KVP_OK);
    assert_int_equal(kvp_pool_release(pool, 2, (int32_t[]){1, 1}), KVP_OK);
    assert_int_equal(kvp_pool_refcount(pool, 1, &ref), KVP_OK);
    assert_int_equal(ref, 0);
    /* freed last, handed out first (LIFO: the page is still warm) */
    int32_t again;
    assert_int_equal(kvp_pool_alloc(pool, 1, &again), KVP_OK);
    assert_int_equal(again, 1);
    assert_pool_ok(pool);
    kvp_pool_destroy(pool);
    kvp_pool_destroy(NULL); /* no-op */
}

static void test_alloc_all_or_nothing(void **state) {
    (void)state;
    kvp_pool_t *pool = make_pool(4, 6, 0, NULL);
    int32_t pages[8];
    assert_int_equal(kvp_pool_alloc(pool, 4, pages), KVP_OK);
    int32_t out[8];
    for (int i = 0; i < 8; i++) out[i] = -77;
    kvp_pool_stats_t before = stats_of(pool);
    assert_int_equal(kvp_pool_alloc(pool, 3, out), KVP_ENOSPC);
    assert_non_null(strstr(kvp_pool_last_error(pool), "3 pages wanted, 2 available"));
    for (int i = 0; i < 8; i++) assert_int_equal(out[i], -77);
    kvp_pool_stats_t after = stats_of(pool);
    assert_memory_equal(&before, &after, sizeof before);
    /* exactly what is left still works, and then nothing */
    assert_int_equal(kvp_pool_alloc(pool, 2, out), KVP_OK);
    assert_int_equal(kvp_pool_alloc(pool, 1, out + 2), KVP_ENOSPC);
    assert_int_equal(stats_of(pool).free_pages, 0);
    assert_pool_ok(pool);
    kvp_pool_destroy(pool);
}

static void test_release_bad_input_changes_nothing(void **state) {
    (void)state;
    kvp_pool_t *pool = make_pool(4, 6, 2, NULL);
    int32_t pages[3];
    assert_int_equal(kvp_pool_alloc(pool, 3, pages), KVP_OK);
    kvp_pool_stats_t before = stats_of(pool);
    /* double release inside one call: the first page must not be freed */
    assert_int_equal(kvp_pool_release(pool, 2, (int32_t[]){0, 0}), KVP_EINVAL);
    assert_non_null(strstr(kvp_pool_last_error(pool), "double release"));
    int32_t ref;
    assert_int_equal(kvp_pool_refcount(pool, 0, &ref), KVP_OK);
    assert_int_equal(ref, 1);
    /* a free page, an out-of-range id, a negative count, NULL */
    assert_int_equal(kvp_pool_release(pool, 2, (int32_t[]){1, 4}), KVP_EINVAL);
    assert_non_null(strstr(kvp_pool_last_error(pool), "page 4"));
    assert_int_equal(kvp_pool_release(pool, 1, (int32_t[]){8}), KVP_EINVAL);
    assert_non_null(strstr(kvp_pool_last_error(pool), "out of range"));
    assert_int_equal(kvp_pool_release(pool, 1, (int32_t[]){-1}), KVP_EINVAL);
    assert_int_equal(kvp_pool_release(pool, -1, pages), KVP_EINVAL);
    assert_int_equal(kvp_pool_release(pool, 1, NULL), KVP_EINVAL);
    assert_int_equal(kvp_pool_release(pool, 0, NULL), KVP_OK);
    assert_int_equal(kvp_pool_release(NULL, 1, pages), KVP_EINVAL);
    /* retain of a free page, or out of range */
    assert_int_equal(kvp_pool_retain(pool, 2, (int32_t[]){1, 5}), KVP_EINVAL);
    assert_non_null(strstr(kvp_pool_last_error(pool), "not in use"));
    assert_int_equal(kvp_pool_refcount(pool, 1, &ref), KVP_OK);
    assert_int_equal(ref, 1); /* the retain of page 1 was undone */
    assert_int_equal(kvp_pool_retain(pool, 1, (int32_t[]){9}), KVP_EINVAL);
    assert_int_equal(kvp_pool_refcount(pool, 9, &ref), KVP_EINVAL);
    assert_int_equal(kvp_pool_refcount(pool, 0, NULL), KVP_EINVAL);
    kvp_pool_stats_t after = stats_of(pool);
    assert_memory_equal(&before, &after, sizeof before);
    /* bad alloc arguments */
    assert_int_equal(kvp_pool_alloc(pool, 0, pages), KVP_EINVAL);
    assert_int_equal(kvp_pool_alloc(pool, -2, pages), KVP_EINVAL);
    assert_int_equal(kvp_pool_alloc(pool, 1, NULL), KVP_EINVAL);
    assert_int_equal(kvp_pool_alloc(NULL, 1, pages), KVP_EINVAL);
    assert_int_equal(kvp_pool_evict(pool, -1, NULL), KVP_EINVAL);
    assert_int_equal(kvp_pool_evict(NULL, 1, NULL), KVP_EINVAL);
    assert_int_equal(kvp_pool_stats(pool, NULL), KVP_EINVAL);
    assert_int_equal(kvp_pool_set_event_callback(NULL, NULL, NULL), KVP_EINVAL);
    assert_string_equal(kvp_pool_last_error(NULL), "NULL handle");
    after = stats_of(pool);
    assert_memory_equal(&before, &after, sizeof before);
    assert_pool_ok(pool);
    kvp_pool_destroy(pool);
}

static void test_staging_pages(void **state) {
    (void)state;
    kvp_pool_t *pool = make_pool(4, 5, 3, NULL);
    int32_t st[3];
    assert_int_equal(kvp_pool_alloc_staging(pool, 3, st), KVP_OK);
    assert_int_equal(st[0], 5);
    assert_int_equal(st[1], 6);
    assert_int_equal(st[2], 7);
    int32_t more = -1;
    assert_int_equal(kvp_pool_alloc_staging(pool, 1, &more), KVP_ENOSPC);
    assert_int_equal(more, -1);
    assert_int_equal(stats_of(pool).used_staging, 3);
    assert_int_equal(stats_of(pool).total_staging, 3);
    assert_int_equal(kvp_pool_retain(pool, 1, &st[1]), KVP_OK);
    assert_int_equal(kvp_pool_release(pool, 2, (int32_t[]){6, 6}), KVP_OK);
    assert_int_equal(kvp_pool_release(pool, 1, &st[1]), KVP_EINVAL);
    assert_int_equal(stats_of(pool).used_staging, 2);
    assert_int_equal(kvp_pool_alloc_staging(pool, 1, &more), KVP_OK);
    assert_int_equal(more, 6);
    assert_int_equal(kvp_pool_alloc_staging(pool, 0, &more), KVP_EINVAL);
    assert_int_equal(kvp_pool_alloc_staging(pool, 1, NULL), KVP_EINVAL);
    assert_pool_ok(pool);
    kvp_pool_destroy(pool);
    /* a pool without staging pages has none to give */
    pool = make_pool(4, 5, 0, NULL);
    assert_int_equal(kvp_pool_alloc_staging(pool, 1, &more), KVP_ENOSPC);
    kvp_pool_destroy(pool);
}

/* Allocation and release never call the allocator. */
static void test_no_allocation_per_operation(void **state) {
    (void)state;
    test_alloc_state st = {0, -1, 0, 0};
    kvp_allocator_t a = test_allocator(&st);
    kvp_pool_t *pool = make_pool(16, 1000, 10, &a);
    long calls = st.calls;
    int32_t pages[64];
    for (int round = 0; round < 1000; round++) {
        assert_int_equal(kvp_pool_alloc(pool, 64, pages), KVP_OK);
        assert_int_equal(kvp_pool_retain(pool, 8, pages), KVP_OK);
        assert_int_equal(kvp_pool_release(pool, 8, pages), KVP_OK);
        assert_int_equal(kvp_pool_release(pool, 64, pages), KVP_OK);
        assert_int_equal(kvp_pool_alloc_staging(pool, 10, pages), KVP_OK);
        assert_int_equal(kvp_pool_release(pool, 10, pages), KVP_OK);
    }
    assert_int_equal(st.calls, calls);
    assert_pool_ok(pool);
    kvp_pool_destroy(pool);
    assert_int_equal(st.live, 0);
}

/* SQLite-style: fail each allocation of creation in turn. */
static void test_create_fault_injection(void **state) {
    (void)state;
    for (int cache = 0; cache <= 1; cache++) {
        long fail_at = 0;
        for (;; fail_at++) {
            test_alloc_state st = {0, fail_at, 0, 0};
            kvp_allocator_t a = test_allocator(&st);
            kvp_pool_params_t p;
            kvp_pool_params_init(&p);
            p.num_pages = 100;
            p.num_staging = 4;
            p.prefix_cache = cache;
            p.allocator = a;
            kvp_pool_t *pool = NULL;
            char err[KVP_ERR_SIZE];
            int rc = kvp_pool_create(&p, &pool, err, sizeof err);
            if (rc == KVP_OK) {
                assert_true(st.calls == fail_at); /* every allocation was failed once */
                kvp_pool_destroy(pool);
                assert_int_equal(st.live, 0);
                break;
            }
            assert_int_equal(rc, KVP_ENOMEM);
            assert_null(pool);
            assert_int_equal(st.live, 0);
        }
        assert_true(fail_at >= (cache ? 6 : 3));
    }
}

static void test_create_from_plan_and_budget(void **state) {
    (void)state;
    kvp_plan_params_t pp;
    kvp_plan_params_init(&pp);
    pp.layers = 32;
    pp.kv_heads = 8;
    pp.head_dim = 128;
    pp.k_format = KVP_FORMAT_INT8;
    pp.v_format = KVP_FORMAT_INT8;
    pp.kv_budget_bytes = 3ull << 30;
    pp.context = 4096;
    kvp_plan_t plan = {.struct_size = sizeof plan};
    char err[KVP_ERR_SIZE];
    kvp_pool_t *pool = NULL;
    assert_int_equal(kvp_pool_create_for_budget(&pp, NULL, &pool, &plan, err, sizeof err),
                     KVP_OK);
    assert_true(plan.needs_staging == 1 && plan.num_staging > 0);
    kvp_pool_stats_t s = stats_of(pool);
    assert_int_equal(s.total_pages, (int64_t)plan.num_pages);
    assert_int_equal(s.total_staging, (int64_t)plan.num_staging);
    assert_int_equal(s.page_size, 16);
    kvp_pool_destroy(pool);

    /* the plan alone, with options */
    kvp_pool_params_t opt;
    kvp_pool_params_init(&opt);
    opt.prefix_cache = 0;
    opt.num_pages = 3; /* ignored: the plan's count wins */
    assert_int_equal(kvp_pool_create_from_plan(&plan, &opt, &pool, err, sizeof err), KVP_OK);
    assert_int_equal(stats_of(pool).total_pages, (int64_t)plan.num_pages);
    kvp_pool_destroy(pool);

    /* a staging layout planned without a context counted no staging pages */
    pp.context = 0;
    kvp_plan_t noctx = {.struct_size = sizeof noctx};
    assert_int_equal(kvp_plan_compute(&pp, &noctx, err, sizeof err), KVP_OK);
    pool = NULL;
    assert_int_equal(kvp_pool_create_from_plan(&noctx, NULL, &pool, err, sizeof err), KVP_EINVAL);
    assert_non_null(strstr(err, "context"));
    assert_null(pool);
    /* bad plans */
    kvp_plan_t zero;
    memset(&zero, 0, sizeof zero);
    zero.struct_size = sizeof zero;
    assert_int_equal(kvp_pool_create_from_plan(&zero, NULL, &pool, err, sizeof err), KVP_EINVAL);
    assert_int_equal(kvp_pool_create_from_plan(NULL, NULL, &pool, err, sizeof err), KVP_EINVAL);
    kvp_plan_t huge = plan;
    huge.num_pages = (uint64_t)INT32_MAX + 1;
    assert_int_equal(kvp_pool_create_from_plan(&huge, NULL, &pool, err, sizeof err), KVP_EINVAL);
    assert_non_null(strstr(err, "int32"));
    /* a bad budget is the planner's error */
    pp.layers = 0;
    assert_int_equal(kvp_pool_create_for_budget(&pp, NULL, &pool, NULL, err, sizeof err),
                     KVP_EINVAL);
    assert_non_null(strstr(err, "layers"));
    assert_null(pool);
}

/* The planner's sequence count is exactly what the pool and a table admit:
 * max_seqs sequences of `context` tokens fit, one more does not. */
static void admit(int32_t k_format, uint64_t context) {
    kvp_plan_params_t pp;
    kvp_plan_params_init(&pp);
    pp.layers = 4;
    pp.kv_heads = 2;
    pp.head_dim = 64;
    pp.k_format = k_format;
    pp.v_format = k_format;
    pp.kv_budget_bytes = 64ull << 20;
    pp.context = context;
    kvp_plan_t plan = {.struct_size = sizeof plan};
    kvp_pool_t *pool = NULL;
    char err[KVP_ERR_SIZE];
    assert_int_equal(kvp_pool_create_for_budget(&pp, NULL, &pool, &plan, err, sizeof err), KVP_OK);
    kvp_table_t *t = NULL;
    assert_int_equal(kvp_table_create(pool, (int32_t)plan.max_seqs + 1, &t, err, sizeof err),
                     KVP_OK);
    int32_t seq;
    for (uint64_t i = 0; i < plan.max_seqs; i++) {
        assert_int_equal(kvp_table_seq_create(t, 0, 0, &seq), KVP_OK);
        assert_int_equal(kvp_table_reserve(t, seq, (int64_t)context), KVP_OK);
        int32_t nops;
        kvp_page_op_t ops[1024];
        assert_int_equal(kvp_table_append(t, seq, (int64_t)context, NULL, NULL, ops, 1024, &nops),
                         KVP_OK);
    }
    kvp_pool_stats_t s = stats_of(pool);
    assert_int_equal(s.live_tokens, (int64_t)(plan.max_seqs * context));
    assert_int_equal(s.used_pages, (int64_t)(plan.max_seqs * plan.pages_per_seq));
    int rc = kvp_table_seq_create(t, 0, 0, &seq);
    if (plan.needs_staging) {
        assert_int_equal(rc, KVP_ENOSPC); /* no staging page left */
    } else {
        assert_int_equal(rc, KVP_OK);
        assert_int_equal(kvp_table_reserve(t, seq, (int64_t)context), KVP_ENOSPC);
    }
    kvp_table_destroy(t);
    assert_int_equal(stats_of(pool).used_pages, 0);
    kvp_pool_destroy(pool);
}

static void test_planner_numbers_are_admitted(void **state) {
    (void)state;
    admit(KVP_FORMAT_FP16, 1000);
    admit(KVP_FORMAT_FP16, 1024);
    admit(KVP_FORMAT_INT8, 1000);
    admit(KVP_FORMAT_INT4, 4096);
    admit(KVP_FORMAT_FP8_E4M3, 777);
}

static void test_stats_and_utilization(void **state) {
    (void)state;
    kvp_pool_t *pool = make_pool(16, 10, 0, NULL);
    kvp_pool_stats_t s = stats_of(pool);
    assert_true(s.utilization == 0.0);
    kvp_table_t *t = NULL;
    char err[KVP_ERR_SIZE];
    assert_int_equal(kvp_table_create(pool, 0, &t, err, sizeof err), KVP_OK);
    int32_t a, b, nops;
    kvp_page_op_t ops[4];
    assert_int_equal(kvp_table_seq_create(t, 0, 0, &a), KVP_OK);
    assert_int_equal(kvp_table_seq_create(t, 0, 0, &b), KVP_OK);
    assert_int_equal(kvp_table_append(t, a, 40, NULL, NULL, ops, 4, &nops), KVP_OK);
    assert_int_equal(kvp_table_append(t, b, 8, NULL, NULL, ops, 4, &nops), KVP_OK);
    s = stats_of(pool);
    assert_int_equal(s.used_pages, 4); /* 3 + 1 */
    assert_int_equal(s.live_tokens, 48);
    assert_int_equal(s.live_seqs, 2);
    assert_true(s.utilization == 48.0 / 64.0);
    assert_int_equal(kvp_table_reserve(t, b, 30), KVP_OK); /* 8 + 30: 2 more pages */
    s = stats_of(pool);
    assert_int_equal(s.reserved_pages, 2);
    assert_int_equal(s.available_pages, 4);
    /* a struct_size below this version's struct is rejected, untouched */
    kvp_pool_stats_t small;
    memset(&small, 0xee, sizeof small);
    small.struct_size = offsetof(kvp_pool_stats_t, used_pages);
    assert_int_equal(kvp_pool_stats(pool, &small), KVP_EINVAL);
    assert_non_null(strstr(kvp_pool_last_error(pool), "struct_size"));
    assert_int_equal(small.used_pages, (int64_t)0xeeeeeeeeeeeeeeeeull);
    kvp_table_destroy(t);
    s = stats_of(pool);
    assert_int_equal(s.used_pages, 0);
    assert_int_equal(s.live_tokens, 0);
    assert_int_equal(s.reserved_pages, 0);
    kvp_pool_destroy(pool);
}

/* The detail text: "" until a call fails, then the failure's explanation,
 * kept (sticky) through later calls that succeed, replaced by the next
 * failure; "NULL handle" for a NULL pool. */
static void test_last_error_is_sticky(void **state) {
    (void)state;
    assert_string_equal(kvp_pool_last_error(NULL), "NULL handle");
    kvp_pool_t *pool = make_pool(4, 2, 0, NULL);
    assert_string_equal(kvp_pool_last_error(pool), "");
    int32_t pages[3];
    assert_int_equal(kvp_pool_alloc(pool, 1, pages), KVP_OK);
    assert_string_equal(kvp_pool_last_error(pool), ""); /* success writes nothing */
    assert_int_equal(kvp_pool_alloc(pool, 3, pages + 1), KVP_ENOSPC);
    char first[KVP_ERR_SIZE];
    snprintf(first, sizeof first, "%s", kvp_pool_last_error(pool));
    assert_non_null(strstr(first, "3 pages wanted"));
    /* successful calls of every kind leave it as it was */
    assert_int_equal(kvp_pool_alloc(pool, 1, pages + 1), KVP_OK);
    assert_int_equal(kvp_pool_retain(pool, 1, pages), KVP_OK);
    assert_int_equal(kvp_pool_release(pool, 1, pages), KVP_OK);
    int32_t ref;
    assert_int_equal(kvp_pool_refcount(pool, pages[0], &ref), KVP_OK);
    (void)stats_of(pool);
    assert_int_equal(kvp_pool_release(pool, 2, pages), KVP_OK);
    assert_string_equal(kvp_pool_last_error(pool), first);
    /* the next failure replaces it */
    assert_int_equal(kvp_pool_refcount(pool, 99, &ref), KVP_EINVAL);
    assert_string_not_equal(kvp_pool_last_error(pool), first);
    assert_non_null(strstr(kvp_pool_last_error(pool), "99"));
    kvp_pool_destroy(pool);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_params_init),
        cmocka_unit_test(test_create_bad_input),
        cmocka_unit_test(test_create_huge_is_enomem),
        cmocka_unit_test(test_alloc_release_basics),
        cmocka_unit_test(test_alloc_all_or_nothing),
        cmocka_unit_test(test_release_bad_input_changes_nothing),
        cmocka_unit_test(test_staging_pages),
        cmocka_unit_test(test_no_allocation_per_operation),
        cmocka_unit_test(test_create_fault_injection),
        cmocka_unit_test(test_create_from_plan_and_budget),
        cmocka_unit_test(test_planner_numbers_are_admitted),
        cmocka_unit_test(test_stats_and_utilization),
        cmocka_unit_test(test_last_error_is_sticky),
    };
    return cmocka_run_group_tests_name("pool", tests, NULL, NULL);
}
