/*
 * Layer: cache — the façade over pool + table + store + context, driven the
 * way an engine's decode loop drives it, and checked against a float64
 * attention over each sequence's own K/V history (kept by the test).
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>

#include "../bench/kvdist.h"
#include "kvpage.h"
#include "kvpage_ext.h"
#include "kvpage_plan.h"
#include "kvpage_tier.h"
#include "testutil.h"

#define L 2
#define H 2
#define QH 4
#define D 64
#define ROW (H * D)

/* K/V of token `id` at position `pos`: a deterministic function, so a page
 * found in the prefix cache holds exactly what the sequence would write. */
static void kv_of(int32_t id, int64_t pos, int layer, float *k, float *v) {
    kvd_rng r;
    kvd_seed(&r, (uint64_t)id * 1000003u + (uint64_t)pos * 7919u + (uint64_t)layer);
    for (int i = 0; i < ROW; i++) {
        k[i] = (float)(kvd_normal(&r) + ((i % 32) == 3 ? 4.0 : 0.0));
        v[i] = (float)kvd_normal(&r);
    }
}

typedef struct {
    int32_t seq;
    int64_t len;
    int32_t tokens[4096];
} hist;

typedef struct {
    kvp_cache_t *c;
    double tol;
    int checks;
} fixture;

static kvp_cache_t *make_cache_tier(int32_t kf, int32_t vf, int64_t pages, int32_t P,
                                    int32_t max_seqs, uint64_t host_bytes) {
    kvp_cache_params_t p;
    kvp_cache_params_init(&p);
    p.layers = L;
    p.kv_heads = H;
    p.head_dim = D;
    p.page_size = P;
    p.k_format = kf;
    p.v_format = vf;
    p.num_pages = pages;
    p.max_seqs = max_seqs;
    p.threads = 2;
    p.host_bytes = host_bytes;
    kvp_cache_t *c = NULL;
    char err[KVP_ERR_SIZE] = "";
    int rc = kvp_cache_create(&p, &c, err, sizeof err);
    if (rc != KVP_OK) print_error("create: %s\n", err);
    assert_int_equal(rc, KVP_OK);
    return c;
}

/* The cache's parts (pool, table, store, context, tier). */
static kvp_cache_parts_t parts_of(const kvp_cache_t *c) {
    kvp_cache_parts_t parts;
    memset(&parts, 0, sizeof parts);
    parts.struct_size = sizeof parts;
    assert_int_equal(kvp_cache_parts(c, &parts), KVP_OK);
    return parts;
}

/* A sequence's length, from the cache's table. */
static int64_t seq_length(const kvp_cache_t *c, int32_t seq) {
    kvp_seq_info_t info = {.struct_size = sizeof info};
    int rc = kvp_table_seq_info(parts_of(c).table, seq, &info);
    assert_int_equal(rc, KVP_OK);
    return info.length;
}

static kvp_pool_stats_t pool_stats_of(const kvp_cache_t *c) {
    kvp_pool_stats_t st;
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    assert_int_equal(kvp_pool_stats(parts_of(c).pool, &st), KVP_OK);
    return st;
}

static kvp_cache_t *make_cache(int32_t kf, int32_t vf, int64_t pages, int32_t P, int32_t max_seqs) {
    return make_cache_tier(kf, vf, pages, P, max_seqs, 0);
}

/* One step: append the given new tokens of each sequence, write K/V, attend,
 * and compare every row with the float64 reference over its history. */
static void step(fixture *f, hist **hs, int batch, const int32_t *num_new, const int32_t *toks) {
    int32_t seqs[16];
    int rows = 0;
    for (int b = 0; b < batch; b++) {
        seqs[b] = hs[b]->seq;
        rows += num_new[b];
    }
    int rc = kvp_cache_begin_step(f->c, seqs, batch, num_new, toks);
    if (rc != KVP_OK) print_error("begin_step: %s\n", kvp_cache_last_error(f->c));
    assert_int_equal(rc, KVP_OK);
    float *k = malloc(sizeof(float) * (size_t)rows * ROW), *v = malloc(sizeof(float) * (size_t)rows * ROW);
    float *q = malloc(sizeof(float) * (size_t)rows * QH * D), *out = malloc(sizeof(float) * (size_t)rows * QH * D);
    int row = 0;
    for (int b = 0; b < batch; b++)
        for (int i = 0; i < num_new[b]; i++, row++) {
            hs[b]->tokens[hs[b]->len + i] = toks[row];
        }
    kvd_rng qr;
    kvd_seed(&qr, 99 + (uint64_t)rows);
    for (int layer = 0; layer < L; layer++) {
        row = 0;
        for (int b = 0; b < batch; b++)
            for (int i = 0; i < num_new[b]; i++, row++)
                kv_of(toks[row], hs[b]->len + i, layer, k + (size_t)row * ROW, v + (size_t)row * ROW);
        assert_int_equal(kvp_cache_write(f->c, layer, KVP_FORMAT_FP32, k, v, 0, 0), KVP_OK);
        kvd_fill_normal(&qr, (size_t)rows * QH * D, q);
        for (size_t i = 0; i < (size_t)rows * QH * D; i++) out[i] = NAN; /* poisoned */
        kvp_attention_params_t ap;
        kvp_attention_params_init(&ap);
        ap.layer = layer;
        ap.q_heads = QH;
        ap.sm_scale = 0.125f;
        ap.q = q;
        ap.out = out;
        rc = kvp_cache_attend(f->c, &ap);
        if (rc != KVP_OK) print_error("attend: %s\n", kvp_cache_last_error(f->c));
        assert_int_equal(rc, KVP_OK);
        /* the reference: each sequence's full history */
        row = 0;
        for (int b = 0; b < batch; b++) {
            int64_t n = hs[b]->len + num_new[b];
            float *hk = malloc(sizeof(float) * (size_t)n * ROW), *hv = malloc(sizeof(float) * (size_t)n * ROW);
            for (int64_t t = 0; t < n; t++)
                kv_of(hs[b]->tokens[t], t, layer, hk + (size_t)t * ROW, hv + (size_t)t * ROW);
            double *ref = malloc(sizeof(double) * (size_t)num_new[b] * QH * D);
            kvd_attn a = {QH, H, D, 0.125, 0.0, 1, -1};
            assert_int_equal(kvd_reference(&a, q + (size_t)row * QH * D, num_new[b], hk, hv, (int)n, ref), 0);
            double e = kvd_rel_l2(out + (size_t)row * QH * D, ref, (size_t)num_new[b] * QH * D);
            if (!(e <= f->tol)) print_error("seq %d layer %d: rel err %.3g > %.3g\n", (int)hs[b]->seq, layer, e, f->tol);
            assert_true(e <= f->tol);
            f->checks++;
            free(hk);
            free(hv);
            free(ref);
            row += num_new[b];
        }
    }
    for (int b = 0; b < batch; b++) {
        hs[b]->len += num_new[b];
        assert_int_equal(seq_length(f->c, hs[b]->seq), hs[b]->len);
    }
    free(k);
    free(v);
    free(q);
    free(out);
}

static void run_decode_loop(int32_t kf, int32_t vf, int32_t P, double tol) {
    fixture f = {make_cache(kf, vf, 400, P, 8), tol, 0};
    hist *h[3];
    for (int i = 0; i < 3; i++) {
        h[i] = calloc(1, sizeof(hist));
        assert_int_equal(kvp_cache_seq_create(f.c, 0, 0, &h[i]->seq), KVP_OK);
    }
    /* ragged prefill (one sequence within a page, two across several) */
    int32_t nn[3] = {5, 3 * P + 1, 2 * P};
    int32_t toks[4096];
    int total = nn[0] + nn[1] + nn[2];
    for (int i = 0; i < total; i++) toks[i] = 1000 + i;
    step(&f, h, 3, nn, toks);
    /* decode steps, one joins late via a chunk */
    for (int s = 0; s < 2 * P + 3; s++) {
        int32_t one[3] = {1, 1, s == P ? 7 : 1};
        for (int i = 0; i < 9; i++) toks[i] = 5000 + s * 10 + i;
        step(&f, h, 3, one, toks);
    }
    /* fork the second sequence; both continue differently */
    hist *child = calloc(1, sizeof(hist));
    assert_int_equal(kvp_cache_seq_fork(f.c, h[1]->seq, &child->seq), KVP_OK);
    child->len = h[1]->len;
    memcpy(child->tokens, h[1]->tokens, sizeof child->tokens);
    hist *pair[2] = {h[1], child};
    for (int s = 0; s < P + 2; s++) {
        int32_t one[2] = {1, 1}, t2[2] = {7000 + s, 8000 + s};
        step(&f, pair, 2, one, t2);
    }
    /* both take a prefill chunk over their shared pages (40 query rows per
     * kv head: the kernels' prefill blocks) */
    int32_t chunk[2] = {20, 20};
    for (int i = 0; i < 40; i++) toks[i] = 9500 + i;
    step(&f, pair, 2, chunk, toks);
    /* speculative tokens rejected: append 5, truncate back by 4 across a page edge */
    int32_t five[1] = {5}, t5[5] = {1, 2, 3, 4, 5};
    step(&f, &child, 1, five, t5);
    assert_int_equal(kvp_cache_seq_truncate(f.c, child->seq, child->len - 4), KVP_OK);
    child->len -= 4;
    for (int s = 0; s < 3; s++) {
        int32_t one[1] = {1}, t1[1] = {9000 + s};
        step(&f, &child, 1, one, t1);
    }
    assert_true(f.checks > 100);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(kvp_cache_seq_release(f.c, h[i]->seq), KVP_OK);
        free(h[i]);
    }
    assert_int_equal(kvp_cache_seq_release(f.c, child->seq), KVP_OK);
    free(child);
    kvp_pool_stats_t st = pool_stats_of(f.c);
    assert_int_equal(st.used_pages, 0); /* everything released or cached */
    kvp_cache_destroy(f.c);
}

/* Bounds: fp32 is exact up to summation order; fp16 rounds K/V to 11 bits;
 * int8/int4 bounds are the format errors measured on this data (keys with a
 * +4 offset channel) times about 2. */
static void test_decode_loop_fp32(void **state) { (void)state; run_decode_loop(KVP_FORMAT_FP32, KVP_FORMAT_FP32, 16, 2e-5); }
static void test_decode_loop_fp16(void **state) { (void)state; run_decode_loop(KVP_FORMAT_FP16, KVP_FORMAT_FP16, 8, 2e-3); }
static void test_decode_loop_int8(void **state) { (void)state; run_decode_loop(KVP_FORMAT_INT8, KVP_FORMAT_INT8, 16, 3e-2); }
static void test_decode_loop_k8v4(void **state) { (void)state; run_decode_loop(KVP_FORMAT_INT8, KVP_FORMAT_INT4, 32, 2.5e-1); }

/* A prompt found in the prefix cache gives the same attention as one
 * prefilled again. */
static void test_prefix_reuse(void **state) {
    (void)state;
    fixture f = {make_cache(KVP_FORMAT_FP16, KVP_FORMAT_FP16, 200, 8, 4), 2e-3, 0};
    hist *a = calloc(1, sizeof(hist)), *b = calloc(1, sizeof(hist));
    int32_t prompt[40];
    for (int i = 0; i < 40; i++) prompt[i] = 300 + i;
    assert_int_equal(kvp_cache_seq_create(f.c, 0, 0, &a->seq), KVP_OK);
    int32_t n40[1] = {40};
    step(&f, &a, 1, n40, prompt);
    assert_int_equal(kvp_cache_seq_release(f.c, a->seq), KVP_OK);
    assert_int_equal(kvp_cache_seq_create(f.c, 0, 0, &b->seq), KVP_OK);
    int64_t matched = 0;
    /* 39: the last prompt token is computed again, for its logits */
    assert_int_equal(kvp_cache_seq_attach_prefix(f.c, b->seq, prompt, 39, &matched), KVP_OK);
    assert_int_equal(matched, 32);
    memcpy(b->tokens, prompt, sizeof prompt);
    b->len = matched;
    int32_t rest[1] = {(int32_t)(40 - matched)};
    step(&f, &b, 1, rest, prompt + matched);
    kvp_pool_stats_t st = pool_stats_of(f.c);
    assert_int_equal((int64_t)st.prefix_hit_tokens, matched);
    free(a);
    free(b);
    kvp_cache_destroy(f.c);
}

/* Out of pages: the whole batch fails and nothing changes. */
static void test_enospc_is_all_or_nothing(void **state) {
    (void)state;
    kvp_cache_t *c = make_cache(KVP_FORMAT_FP16, KVP_FORMAT_FP16, 4, 16, 4);
    int32_t s[2];
    assert_int_equal(kvp_cache_seq_create(c, 0, 0, &s[0]), KVP_OK);
    assert_int_equal(kvp_cache_seq_create(c, 0, 0, &s[1]), KVP_OK);
    int32_t nn[2] = {32, 40}; /* 2 + 3 pages > 4 */
    kvp_pool_stats_t before = pool_stats_of(c);
    assert_int_equal(kvp_cache_begin_step(c, s, 2, nn, NULL), KVP_ENOSPC);
    assert_non_null(strstr(kvp_cache_last_error(c), "batch index 1"));
    kvp_pool_stats_t after = pool_stats_of(c);
    assert_int_equal(after.available_pages, before.available_pages);
    assert_int_equal(after.reserved_pages, before.reserved_pages);
    assert_int_equal(seq_length(c, s[0]), 0);
    /* no step is open after a failure */
    float kv[ROW];
    memset(kv, 0, sizeof kv);
    assert_int_equal(kvp_cache_write(c, 0, KVP_FORMAT_FP32, kv, kv, 0, 0), KVP_ESTATE);
    nn[1] = 16;
    assert_int_equal(kvp_cache_begin_step(c, s, 2, nn, NULL), KVP_OK);
    kvp_cache_destroy(c);
}

static void test_bad_input(void **state) {
    (void)state;
    char err[KVP_ERR_SIZE];
    kvp_cache_params_t p;
    kvp_cache_params_init(&p);
    kvp_cache_t *c = NULL;
    assert_int_equal(kvp_cache_create(&p, &c, err, sizeof err), KVP_EINVAL);
    p.layers = L;
    p.kv_heads = H;
    p.head_dim = D;
    assert_int_equal(kvp_cache_create(&p, &c, err, sizeof err), KVP_EINVAL);
    assert_non_null(strstr(err, "num_pages or kv_budget_bytes"));
    p.num_pages = 10;
    p.kv_budget_bytes = 1 << 20;
    assert_int_equal(kvp_cache_create(&p, &c, err, sizeof err), KVP_EINVAL);
    p.num_pages = 0;
    p.kv_budget_bytes = 100;
    assert_int_equal(kvp_cache_create(&p, &c, err, sizeof err), KVP_EINVAL);
    assert_non_null(strstr(err, "smaller than one page"));
    p.kv_budget_bytes = 1 << 20;
    p.max_seqs = 0;
    assert_int_equal(kvp_cache_create(&p, &c, err, sizeof err), KVP_EINVAL);
    p.max_seqs = 4;
    assert_int_equal(kvp_cache_create(&p, NULL, err, sizeof err), KVP_EINVAL);
    assert_null(c);
    assert_int_equal(kvp_cache_create(&p, &c, err, sizeof err), KVP_OK);

    int32_t s = -1, s2 = -1;
    assert_int_equal(kvp_cache_seq_create(c, 0, 0, &s), KVP_OK);
    assert_int_equal(kvp_cache_seq_create(c, 0, 0, &s2), KVP_OK);
    int32_t one[2] = {1, 1}, zero[1] = {0}, dup[2] = {s, s}, bad[1] = {12345};
    assert_int_equal(kvp_cache_begin_step(c, NULL, 1, one, NULL), KVP_EINVAL);
    assert_int_equal(kvp_cache_begin_step(c, &s, 0, one, NULL), KVP_EINVAL);
    assert_int_equal(kvp_cache_begin_step(c, &s, 1, zero, NULL), KVP_EINVAL);
    assert_int_equal(kvp_cache_begin_step(c, dup, 2, one, NULL), KVP_EINVAL);
    assert_non_null(strstr(kvp_cache_last_error(c), "twice"));
    assert_int_equal(kvp_cache_begin_step(c, bad, 1, one, NULL), KVP_ENOENT);
    kvp_attention_params_t ap;
    kvp_attention_params_init(&ap);
    assert_int_equal(kvp_cache_attend(c, &ap), KVP_ESTATE);
    kvp_kv_view_t view = {.struct_size = sizeof view};
    assert_int_equal(kvp_cache_step_view(c, &view, NULL, NULL, NULL), KVP_ESTATE);
    assert_int_equal(kvp_cache_begin_step(c, &s, 1, one, NULL), KVP_OK);
    int32_t rows = 0;
    const int64_t *slots = NULL;
    assert_int_equal(kvp_cache_step_view(c, &view, &slots, NULL, &rows), KVP_OK);
    assert_int_equal(rows, 1);
    assert_int_equal(view.batch, 1);
    /* the view's struct_size must be set */
    kvp_kv_view_t unsized;
    memset(&unsized, 0x5a, sizeof unsized);
    unsized.struct_size = 0;
    assert_int_equal(kvp_cache_step_view(c, &unsized, NULL, NULL, NULL), KVP_EINVAL);
    assert_non_null(strstr(kvp_cache_last_error(c), "struct_size"));
    assert_int_equal(unsized.batch, 0x5a5a5a5a);
    float kv[ROW];
    memset(kv, 0, sizeof kv);
    assert_int_equal(kvp_cache_write(c, L, KVP_FORMAT_FP32, kv, kv, 0, 0), KVP_EINVAL); /* layer */
    assert_int_equal(kvp_cache_seq_fork(c, bad[0], &s2), KVP_ENOENT);
    assert_int_equal(kvp_cache_seq_truncate(c, s, 5), KVP_EINVAL);
    assert_int_equal(kvp_cache_seq_release(c, bad[0]), KVP_ENOENT);
    kvp_cache_destroy(c);
    kvp_cache_destroy(NULL);
    assert_string_equal(kvp_cache_last_error(NULL), "NULL handle");
}

/* Sized by a budget: the arena fits it; every allocation can fail cleanly. */
static void test_budget_and_allocation_failures(void **state) {
    (void)state;
    kvp_cache_params_t p;
    kvp_cache_params_init(&p);
    p.layers = L;
    p.kv_heads = H;
    p.head_dim = D;
    p.k_format = KVP_FORMAT_INT8;
    p.max_seqs = 3;
    p.kv_budget_bytes = 1 << 20;
    test_alloc_state st = {0, -1, 0, 0};
    p.allocator = test_allocator(&st);
    kvp_cache_t *c = NULL;
    assert_int_equal(kvp_cache_create(&p, &c, NULL, 0), KVP_OK);
    kvp_store_info_t info = {.struct_size = sizeof info};
    assert_int_equal(kvp_store_info(parts_of(c).store, &info), KVP_OK);
    uint64_t bytes = info.arena_bytes;
    assert_true(bytes <= p.kv_budget_bytes);
    kvp_layout_t l = {.struct_size = sizeof l};
    assert_int_equal(kvp_store_layout(parts_of(c).store, &l), KVP_OK);
    assert_true(bytes + l.page_bytes > p.kv_budget_bytes); /* one more page would not fit */
    long calls = st.calls;
    kvp_cache_destroy(c);
    assert_int_equal(st.live, 0);
    for (long k = 0; k < calls; k++) {
        st.calls = 0;
        st.fail_at = k;
        c = NULL;
        int rc = kvp_cache_create(&p, &c, NULL, 0);
        assert_int_equal(rc, KVP_ENOMEM);
        assert_null(c);
        assert_int_equal(st.live, 0);
    }
    /* a step whose buffers cannot grow fails and changes nothing */
    st.fail_at = -1;
    assert_int_equal(kvp_cache_create(&p, &c, NULL, 0), KVP_OK);
    int32_t s;
    assert_int_equal(kvp_cache_seq_create(c, 0, 0, &s), KVP_OK);
    st.calls = 0;
    st.fail_at = 0;
    int32_t n[1] = {20};
    assert_int_equal(kvp_cache_begin_step(c, &s, 1, n, NULL), KVP_ENOMEM);
    assert_int_equal(seq_length(c, s), 0);
    st.fail_at = -1;
    assert_int_equal(kvp_cache_begin_step(c, &s, 1, n, NULL), KVP_OK);
    kvp_cache_destroy(c);
    assert_int_equal(st.live, 0);
}

/* Swap a sequence out, let another use its pages, swap it back: its
 * attention is what it was (the data came back bit for bit). */
static void run_swap(int32_t kf, int32_t vf) {
    const int32_t P = 16;
    fixture f = {make_cache_tier(kf, vf, 12, P, 4, 1 << 20), vf == KVP_FORMAT_INT4 ? 2.5e-1 : 2e-3, 0};
    hist *a = calloc(1, sizeof(hist)), *b = calloc(1, sizeof(hist));
    assert_int_equal(kvp_cache_seq_create(f.c, 0, 0, &a->seq), KVP_OK);
    assert_int_equal(kvp_cache_seq_create(f.c, 0, 0, &b->seq), KVP_OK);
    int32_t toks[200];
    for (int i = 0; i < 200; i++) toks[i] = 40 + i;
    int32_t na[1] = {8 * P + 5};
    step(&f, &a, 1, na, toks);
    int32_t nb[1] = {5 * P};
    assert_int_equal(kvp_cache_begin_step(f.c, &b->seq, 1, nb, toks), KVP_ENOSPC); /* a holds 8 or 9 pages, b needs 5, of 12 */
    assert_int_equal(kvp_cache_seq_swap_out(f.c, a->seq), KVP_OK);
    assert_int_equal(kvp_cache_seq_swap_out(f.c, a->seq), KVP_ESTATE); /* already out */
    int32_t one[1] = {1};
    assert_int_equal(kvp_cache_begin_step(f.c, &a->seq, 1, one, toks), KVP_ESTATE);
    step(&f, &b, 1, nb, toks + 10); /* b now uses the pages a gave back */
    assert_int_equal(kvp_cache_seq_swap_in(f.c, a->seq), KVP_ENOSPC); /* not enough pages */
    assert_int_equal(kvp_cache_seq_release(f.c, b->seq), KVP_OK);
    assert_int_equal(kvp_cache_seq_swap_in(f.c, a->seq), KVP_OK);
    assert_int_equal(kvp_cache_seq_swap_in(f.c, a->seq), KVP_ESTATE); /* resident */
    for (int s = 0; s < P + 2; s++) {
        int32_t t1[1] = {7000 + s};
        step(&f, &a, 1, one, t1); /* checked against a's whole history */
    }
    /* a swapped-out sequence can be released (dropped): its host slots are freed */
    kvp_tier_t *tier = parts_of(f.c).tier;
    assert_non_null(tier);
    assert_int_equal(kvp_cache_seq_swap_out(f.c, a->seq), KVP_OK);
    kvp_tier_stats_t ts = {.struct_size = sizeof ts};
    assert_int_equal(kvp_tier_stats(tier, &ts), KVP_OK);
    assert_true(ts.free_slots < ts.total_slots); /* a's pages are on the host */
    assert_int_equal(kvp_cache_seq_release(f.c, a->seq), KVP_OK);
    assert_int_equal(kvp_tier_stats(tier, &ts), KVP_OK);
    assert_int_equal(ts.free_slots, ts.total_slots);
    kvp_seq_info_t gone = {.struct_size = sizeof gone};
    assert_int_equal(kvp_table_seq_info(parts_of(f.c).table, a->seq, &gone), KVP_ENOENT);
    assert_int_equal(kvp_cache_seq_release(f.c, a->seq), KVP_ENOENT);
    assert_true(ts.swap_outs == 2 && ts.swap_ins == 1);
    free(a);
    free(b);
    kvp_cache_destroy(f.c);
}

static void test_swap_fp16(void **state) { (void)state; run_swap(KVP_FORMAT_FP16, KVP_FORMAT_FP16); }
static void test_swap_int8_staging(void **state) { (void)state; run_swap(KVP_FORMAT_INT8, KVP_FORMAT_INT4); }

static void test_swap_without_tier_or_room(void **state) {
    (void)state;
    kvp_cache_t *c = make_cache(KVP_FORMAT_FP16, KVP_FORMAT_FP16, 8, 16, 2);
    int32_t s;
    assert_int_equal(kvp_cache_seq_create(c, 0, 0, &s), KVP_OK);
    assert_int_equal(kvp_cache_seq_swap_out(c, s), KVP_ESTATE);
    assert_non_null(strstr(kvp_cache_last_error(c), "no host tier"));
    kvp_cache_destroy(c);
    /* a host tier of one page: a 3-page sequence does not fit, nothing changes */
    kvp_layout_t l = {.struct_size = sizeof l};
    assert_int_equal(kvp_layout_compute(L, H, D, 16, KVP_FORMAT_FP16, KVP_FORMAT_FP16, &l, NULL, 0), KVP_OK);
    c = make_cache_tier(KVP_FORMAT_FP16, KVP_FORMAT_FP16, 8, 16, 2, l.page_bytes + 256);
    assert_int_equal(kvp_cache_seq_create(c, 0, 0, &s), KVP_OK);
    int32_t n[1] = {40};
    assert_int_equal(kvp_cache_begin_step(c, &s, 1, n, NULL), KVP_OK);
    kvp_pool_stats_t before = pool_stats_of(c);
    assert_int_equal(kvp_cache_seq_swap_out(c, s), KVP_EHOSTFULL);
    kvp_pool_stats_t after = pool_stats_of(c);
    assert_int_equal(after.used_pages, before.used_pages);
    assert_int_equal(seq_length(c, s), 40);
    kvp_cache_destroy(c);
}

/* kvp_cache_parts(): the cache's own pool, table, store and context, and a
 * host tier only with host_bytes; a NULL cache or output, or a struct_size
 * too small, is KVP_EINVAL with nothing written. */
static void test_cache_parts(void **state) {
    (void)state;
    for (int tiered = 0; tiered <= 1; tiered++) {
        kvp_cache_t *c = make_cache_tier(KVP_FORMAT_INT8, KVP_FORMAT_INT4, 20, 16, 3,
                                         tiered ? 1 << 20 : 0);
        kvp_cache_parts_t parts;
        memset(&parts, 0xa5, sizeof parts);
        parts.struct_size = sizeof parts;
        assert_int_equal(kvp_cache_parts(c, &parts), KVP_OK);
        assert_int_equal(parts.struct_size, sizeof parts);
        assert_non_null(parts.pool);
        assert_non_null(parts.table);
        assert_non_null(parts.store);
        assert_non_null(parts.ctx);
        if (tiered) assert_non_null(parts.tier);
        else assert_null(parts.tier);
        /* the same objects every time */
        kvp_cache_parts_t again = parts_of(c);
        assert_ptr_equal(again.pool, parts.pool);
        assert_ptr_equal(again.table, parts.table);
        assert_ptr_equal(again.store, parts.store);
        assert_ptr_equal(again.ctx, parts.ctx);
        assert_ptr_equal(again.tier, parts.tier);
        /* ... and they are the cache's: what it was made with, what it does */
        kvp_pool_stats_t ps = pool_stats_of(c);
        assert_int_equal(ps.total_pages, 20);
        assert_int_equal(ps.total_staging, 3); /* int8 keys: one per sequence */
        assert_int_equal(ps.page_size, 16);
        kvp_store_info_t si = {.struct_size = sizeof si};
        assert_int_equal(kvp_store_info(parts.store, &si), KVP_OK);
        assert_int_equal(si.num_pages, 20);
        assert_int_equal(si.num_staging, 3);
        assert_int_equal(si.backend, KVP_BACKEND_CPU);
        kvp_layout_t l = {.struct_size = sizeof l};
        assert_int_equal(kvp_store_layout(parts.store, &l), KVP_OK);
        assert_int_equal(l.layers, L);
        assert_int_equal(l.kv_heads, H);
        assert_int_equal(l.head_dim, D);
        assert_int_equal(l.k_format, KVP_FORMAT_INT8);
        assert_int_equal(l.v_format, KVP_FORMAT_INT4);
        kvp_ctx_info_t ci = {.struct_size = sizeof ci};
        assert_int_equal(kvp_ctx_info(parts.ctx, &ci), KVP_OK);
        assert_int_equal(ci.threads, 2);
        assert_int_equal(ci.backend, KVP_BACKEND_CPU);
        int32_t s = -1;
        assert_int_equal(kvp_cache_seq_create(c, 3, 0x77, &s), KVP_OK);
        int32_t n[1] = {21};
        assert_int_equal(kvp_cache_begin_step(c, &s, 1, n, NULL), KVP_OK);
        kvp_seq_info_t info = {.struct_size = sizeof info};
        assert_int_equal(kvp_table_seq_info(parts.table, s, &info), KVP_OK);
        assert_int_equal(info.length, 21);
        assert_int_equal(info.priority, 3);
        assert_int_equal(info.salt, 0x77);
        assert_int_equal(pool_stats_of(c).live_tokens, 21);
        if (tiered) {
            kvp_tier_stats_t ts = {.struct_size = sizeof ts};
            assert_int_equal(kvp_tier_stats(parts.tier, &ts), KVP_OK);
            assert_true(ts.total_slots > 0);
            assert_int_equal(ts.free_slots, ts.total_slots);
            assert_int_equal(kvp_cache_seq_swap_out(c, s), KVP_OK);
            assert_int_equal(kvp_tier_stats(parts.tier, &ts), KVP_OK);
            assert_int_equal(ts.swap_outs, 1);
            assert_true(ts.free_slots < ts.total_slots);
        }
        /* bad calls: EINVAL, detail text, nothing written */
        assert_int_equal(kvp_cache_parts(NULL, &parts), KVP_EINVAL);
        assert_int_equal(kvp_cache_parts(c, NULL), KVP_EINVAL);
        kvp_cache_parts_t small;
        memset(&small, 0xa5, sizeof small);
        small.struct_size = 0;
        assert_int_equal(kvp_cache_parts(c, &small), KVP_EINVAL);
        assert_non_null(strstr(kvp_cache_last_error(c), "struct_size"));
        small.struct_size = offsetof(kvp_cache_parts_t, tier); /* an older, shorter struct */
        assert_int_equal(kvp_cache_parts(c, &small), KVP_EINVAL);
        assert_non_null(strstr(kvp_cache_last_error(c), "struct_size"));
        unsigned char poison[sizeof small];
        memset(poison, 0xa5, sizeof poison);
        assert_memory_equal((unsigned char *)&small + offsetof(kvp_cache_parts_t, pool),
                            poison, sizeof small - offsetof(kvp_cache_parts_t, pool));
        kvp_cache_destroy(c);
    }
}

/* The detail text: "" until a call fails, kept (sticky) through calls that
 * succeed, replaced by the next failure; "NULL handle" for NULL. */
static void test_last_error_is_sticky(void **state) {
    (void)state;
    assert_string_equal(kvp_cache_last_error(NULL), "NULL handle");
    kvp_cache_t *c = make_cache(KVP_FORMAT_FP16, KVP_FORMAT_FP16, 16, 16, 4);
    assert_string_equal(kvp_cache_last_error(c), "");
    int32_t s = -1;
    assert_int_equal(kvp_cache_seq_create(c, 0, 0, &s), KVP_OK);
    assert_string_equal(kvp_cache_last_error(c), "");
    float kv[ROW];
    memset(kv, 0, sizeof kv);
    assert_int_equal(kvp_cache_write(c, 0, KVP_FORMAT_FP32, kv, kv, 0, 0), KVP_ESTATE);
    char first[KVP_ERR_SIZE];
    snprintf(first, sizeof first, "%s", kvp_cache_last_error(c));
    assert_true(strlen(first) > 0);
    /* a whole step that succeeds leaves it as it was */
    int32_t one[1] = {1}, tok[1] = {5};
    assert_int_equal(kvp_cache_begin_step(c, &s, 1, one, tok), KVP_OK);
    assert_int_equal(kvp_cache_write(c, 0, KVP_FORMAT_FP32, kv, kv, 0, 0), KVP_OK);
    float q[QH * D], out[QH * D];
    memset(q, 0, sizeof q);
    kvp_attention_params_t ap;
    kvp_attention_params_init(&ap);
    ap.q_heads = QH;
    ap.q = q;
    ap.out = out;
    assert_int_equal(kvp_cache_attend(c, &ap), KVP_OK);
    (void)parts_of(c);
    int32_t child = -1;
    assert_int_equal(kvp_cache_seq_fork(c, s, &child), KVP_OK);
    assert_int_equal(kvp_cache_seq_release(c, child), KVP_OK);
    assert_string_equal(kvp_cache_last_error(c), first);
    /* the next failure replaces it */
    assert_int_equal(kvp_cache_seq_release(c, child), KVP_ENOENT);
    assert_string_not_equal(kvp_cache_last_error(c), first);
    assert_non_null(strstr(kvp_cache_last_error(c), "seq_release"));
    kvp_cache_destroy(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decode_loop_fp32),
        cmocka_unit_test(test_decode_loop_fp16),
        cmocka_unit_test(test_decode_loop_int8),
        cmocka_unit_test(test_decode_loop_k8v4),
        cmocka_unit_test(test_prefix_reuse),
        cmocka_unit_test(test_enospc_is_all_or_nothing),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_budget_and_allocation_failures),
        cmocka_unit_test(test_swap_fp16),
        cmocka_unit_test(test_swap_int8_staging),
        cmocka_unit_test(test_swap_without_tier_or_room),
        cmocka_unit_test(test_cache_parts),
        cmocka_unit_test(test_last_error_is_sticky),
    };
    return cmocka_run_group_tests_name("cache", tests, NULL, NULL);
}
