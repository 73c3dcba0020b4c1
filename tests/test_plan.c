/*
 * Layer: plan — page byte counts, arena size, the planner, presets, sizes.
 * Expected numbers are computed here from the definitions in docs/formats.md
 * (blocks, the arena) and include/kvpage_plan.h (the planner), not read back
 * from the library.
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>

#include "kvpage.h"
#include "kvpage_ext.h"
#include "kvpage_plan.h"
#include "testutil.h"

#define MIB (1024ull * 1024ull)
#define GIB (1024ull * MIB)

static kvp_layout_t layout_of(int32_t L, int32_t H, int32_t D, int32_t P, int32_t kf,
                              int32_t vf) {
    kvp_layout_t l;
    memset(&l, 0, sizeof l);
    l.struct_size = sizeof l;
    char err[KVP_ERR_SIZE] = "";
    int rc = kvp_layout_compute(L, H, D, P, kf, vf, &l, err, sizeof err);
    if (rc != KVP_OK) print_error("layout: %s\n", err);
    assert_int_equal(rc, KVP_OK);
    return l;
}

static uint64_t pad16(uint64_t x) { return (x + 15) / 16 * 16; }

/* Reference block sizes, written out from docs/formats.md ("Blocks"). */
static uint64_t ref_block(int32_t f, int is_key, uint64_t P, uint64_t D) {
    switch (f) {
    case KVP_FORMAT_FP32: return 4 * P * D;
    case KVP_FORMAT_FP16:
    case KVP_FORMAT_BF16: return 2 * P * D;
    case KVP_FORMAT_FP8_E4M3: return P * D;
    case KVP_FORMAT_INT8: return is_key ? P * D + D * (2 + 2) : P * D + P * 2;
    case KVP_FORMAT_INT4_V1: /* keys: + D/32 outlier channels as int8 (index, scale, min, codes) */
        return is_key ? P * D / 2 + D * (2 + 2) + (D / 32) * (2 + 2 + 2 + P)
                      : P * D / 2 + P * ((D + 31) / 32) * (2 + 2);
    case KVP_FORMAT_INT4: /* keys: 4 outlier channels per 32 channels or part of 32 */
        return is_key ? P * D / 2 + D * (2 + 2) + (D + 31) / 32 * 4 * (2 + 2 + 2 + P)
                      : P * D / 2 + P * ((D + 31) / 32) * (2 + 2);
    }
    return 0;
}

static void test_layout_fp16_llama70b(void **state) {
    (void)state;
    kvp_layout_t l = layout_of(80, 8, 128, 16, KVP_FORMAT_FP16, KVP_FORMAT_FP16);
    assert_int_equal(l.element_bytes_per_token, 327680); /* 2*80*8*128*2 */
    assert_true(l.bytes_per_token == 327680.0);
    assert_int_equal(l.page_bytes, 327680ull * 16);
    assert_int_equal(l.k_block_bytes, 16 * 128 * 2);
    assert_int_equal(l.needs_staging, 0);
    assert_int_equal(l.staging_page_bytes, 0);
    assert_int_equal(l.fixed_bytes, 0);
}

/* Byte ratios over fp16 at page 32, head_dim 128: int8 ~1.87x, int4 ~2.9x
 * (int4_v1 ~3.1x: 4 int8 key channels, 152 bytes per block, instead of 16,
 * 608 bytes; 3.2x with none). */
static void test_layout_quantized_ratios(void **state) {
    (void)state;
    kvp_layout_t f16 = layout_of(32, 8, 128, 32, KVP_FORMAT_FP16, KVP_FORMAT_FP16);
    kvp_layout_t i8 = layout_of(32, 8, 128, 32, KVP_FORMAT_INT8, KVP_FORMAT_INT8);
    kvp_layout_t i4 = layout_of(32, 8, 128, 32, KVP_FORMAT_INT4_V1, KVP_FORMAT_INT4_V1);
    kvp_layout_t r4 = layout_of(32, 8, 128, 32, KVP_FORMAT_INT4, KVP_FORMAT_INT4);
    assert_int_equal(i8.k_block_bytes, 32 * 128 + 128 * 4);
    assert_int_equal(i8.v_block_bytes, 32 * 128 + 32 * 2);
    assert_int_equal(i4.k_block_bytes, 2720); /* 32*128/2 + 128*4 + 4*(6+32) = 2712, padded to 16 */
    assert_int_equal(i4.v_block_bytes, 32 * 128 / 2 + 32 * 4 * 4);
    assert_true(fabs((double)f16.page_bytes / (double)i8.page_bytes - 1.8686) < 1e-3);
    assert_true(fabs((double)f16.page_bytes / (double)i4.page_bytes - 16384.0 / (2720 + 2560)) < 1e-9);
    assert_int_equal(r4.k_block_bytes, 3168); /* 32*128/2 + 128*4 + 16*(6+32) = 3168 */
    assert_int_equal(r4.v_block_bytes, i4.v_block_bytes);
    assert_true(fabs((double)f16.page_bytes / (double)r4.page_bytes - 16384.0 / (3168 + 2560)) < 1e-9);
    /* staging: fp16 K and V of every layer and head for one page */
    assert_int_equal(i8.needs_staging, 1);
    assert_int_equal(i8.staging_page_bytes, 32ull * 8 * 32 * 128 * 2 * 2);
    assert_int_equal(i8.staging_page_bytes, f16.page_bytes);
}

/* Every format pair, head_dim and page size against the reference formula. */
static void test_layout_all_formats_match_reference(void **state) {
    (void)state;
    static const int32_t dims[] = {8, 64, 80, 96, 128, 256, 1024};
    static const int32_t pages[] = {2, 8, 16, 32, 64, 4096};
    for (int32_t kf = 0; kf < KVP_FORMAT_COUNT; kf++)
        for (int32_t vf = 0; vf < KVP_FORMAT_COUNT; vf++)
            for (size_t d = 0; d < sizeof dims / sizeof *dims; d++)
                for (size_t p = 0; p < sizeof pages / sizeof *pages; p++) {
                    uint64_t D = (uint64_t)dims[d], P = (uint64_t)pages[p];
                    kvp_layout_t l = layout_of(3, 5, dims[d], pages[p], kf, vf);
                    uint64_t kb = pad16(ref_block(kf, 1, P, D)), vb = pad16(ref_block(vf, 0, P, D));
                    assert_int_equal(l.k_block_bytes, kb);
                    assert_int_equal(l.v_block_bytes, vb);
                    assert_int_equal(l.page_bytes, 15 * (kb + vb));
                    assert_int_equal(l.needs_staging,
                                     kf == KVP_FORMAT_INT8 || kf == KVP_FORMAT_INT4 ||
                                         kf == KVP_FORMAT_INT4_V1);
                    assert_int_equal(l.staging_page_bytes,
                                     l.needs_staging ? 15 * P * D * 4 : 0);
                    uint64_t fixed = 15 * 4 * ((kf == KVP_FORMAT_FP8_E4M3) + (vf == KVP_FORMAT_FP8_E4M3));
                    assert_int_equal(l.fixed_bytes, (fixed + 255) / 256 * 256);
                    assert_int_equal(l.k_block_bytes % KVP_BLOCK_ALIGN, 0);
                    assert_int_equal(l.v_block_bytes % KVP_BLOCK_ALIGN, 0);
                }
}

static void test_layout_padding(void **state) {
    (void)state;
    /* V int8 with one token per page: 64 + 2 bytes, padded to 80 */
    kvp_layout_t l = layout_of(1, 1, 64, 1, KVP_FORMAT_FP16, KVP_FORMAT_INT8);
    assert_int_equal(l.v_block_bytes, 80);
    assert_int_equal(l.k_block_bytes, 128);
    /* head_dim 80: int4 V groups are 32, 32 and 16 wide -> 3 scale pairs */
    l = layout_of(1, 1, 80, 16, KVP_FORMAT_FP16, KVP_FORMAT_INT4);
    assert_int_equal(l.v_block_bytes, pad16(16 * 80 / 2 + 16 * 3 * 4));
}

static void test_layout_bad_input(void **state) {
    (void)state;
    char err[KVP_ERR_SIZE];
    kvp_layout_t l, before;
    memset(&l, 0xA5, sizeof l);
    l.struct_size = sizeof l;
    before = l;
    struct { int32_t L, H, D, P, kf, vf; const char *needle; } bad[] = {
        {0, 8, 128, 16, 1, 1, "layers"},
        {-3, 8, 128, 16, 1, 1, "layers"},
        {65537, 8, 128, 16, 1, 1, "layers"},
        {32, 0, 128, 16, 1, 1, "kv_heads"},
        {32, 8, 0, 16, 1, 1, "head_dim"},
        {32, 8, 100, 16, 1, 1, "head_dim"},
        {32, 8, 2048, 16, 1, 1, "head_dim"},
        {32, 8, 128, 0, 1, 1, "page_size"},
        {32, 8, 128, 4097, 1, 1, "page_size"},
        {32, 8, 128, 16, KVP_FORMAT_COUNT, 1, "K format"},
        {32, 8, 128, 16, 1, -1, "V format"},
        {32, 8, 128, 15, KVP_FORMAT_INT4, 1, "even"},
        {32, 8, 128, 1, KVP_FORMAT_INT4, 1, "even"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        err[0] = '\0';
        assert_int_equal(kvp_layout_compute(bad[i].L, bad[i].H, bad[i].D, bad[i].P, bad[i].kf,
                                            bad[i].vf, &l, err, sizeof err),
                         KVP_EINVAL);
        if (strstr(err, bad[i].needle) == NULL) print_error("case %zu: '%s'\n", i, err);
        assert_non_null(strstr(err, bad[i].needle));
        assert_memory_equal(&l, &before, sizeof l);
    }
    /* int4 values need no even page size (packing is along head_dim) */
    l = layout_of(2, 2, 64, 15, KVP_FORMAT_FP16, KVP_FORMAT_INT4);
    assert_int_equal(kvp_layout_compute(1, 1, 64, 16, 1, 1, NULL, err, sizeof err), KVP_EINVAL);
    l.struct_size = 8;
    assert_int_equal(kvp_layout_compute(1, 1, 64, 16, 1, 1, &l, err, sizeof err), KVP_EINVAL);
    assert_non_null(strstr(err, "struct_size"));
}

static void test_arena_bytes(void **state) {
    (void)state;
    char err[KVP_ERR_SIZE];
    kvp_layout_t l = layout_of(32, 8, 128, 16, KVP_FORMAT_INT8, KVP_FORMAT_FP8_E4M3);
    uint64_t b = 0;
    assert_int_equal(kvp_arena_bytes(&l, 1000, 7, &b, err, sizeof err), KVP_OK);
    assert_int_equal(b, l.fixed_bytes + 1000 * l.page_bytes + 7 * l.staging_page_bytes);
    assert_int_equal(l.fixed_bytes, 1024); /* 32*8*4 = 1024 for V fp8 */
    assert_int_equal(kvp_arena_bytes(&l, UINT64_MAX / 2, 0, &b, err, sizeof err), KVP_EINVAL);
    assert_non_null(strstr(err, "overflow"));
    assert_int_equal(kvp_arena_bytes(&l, 1, UINT64_MAX / 2, &b, err, sizeof err), KVP_EINVAL);
    assert_int_equal(kvp_arena_bytes(&l, 1, 1, NULL, err, sizeof err), KVP_EINVAL);
    assert_int_equal(kvp_arena_bytes(NULL, 1, 1, &b, err, sizeof err), KVP_EINVAL);
    kvp_layout_t zero;
    memset(&zero, 0, sizeof zero);
    zero.struct_size = sizeof zero;
    assert_int_equal(kvp_arena_bytes(&zero, 1, 1, &b, err, sizeof err), KVP_EINVAL);
    /* no staging in the layout: staging count is ignored */
    kvp_layout_t f = layout_of(2, 2, 64, 16, KVP_FORMAT_FP16, KVP_FORMAT_FP16);
    assert_int_equal(kvp_arena_bytes(&f, 3, 1000, &b, err, sizeof err), KVP_OK);
    assert_int_equal(b, 3 * f.page_bytes);
}

static kvp_plan_params_t shape(int32_t L, int32_t H, int32_t D) {
    kvp_plan_params_t p;
    kvp_plan_params_init(&p);
    p.layers = L;
    p.kv_heads = H;
    p.head_dim = D;
    return p;
}

static int plan_of(const kvp_plan_params_t *p, kvp_plan_t *out, char *err) {
    memset(out, 0, sizeof *out);
    out->struct_size = sizeof *out;
    return kvp_plan_compute(p, out, err, KVP_ERR_SIZE);
}

static void test_params_init(void **state) {
    (void)state;
    kvp_plan_params_t p;
    memset(&p, 0x5A, sizeof p);
    kvp_plan_params_init(&p);
    assert_int_equal(p.struct_size, sizeof p);
    assert_int_equal(p.k_format, KVP_FORMAT_FP16);
    assert_int_equal(p.v_format, KVP_FORMAT_FP16);
    assert_int_equal(p.page_size, 16);
    assert_true(p.utilization == 0.90);
    assert_int_equal(p.layers, 0);
    assert_int_equal(p.memory_bytes, 0);
    kvp_plan_params_init(NULL); /* ignored */
}

/* Llama-3.1-8B on an H100 80GB, 8k context, computed by hand. */
static void test_plan_llama8b_h100(void **state) {
    (void)state;
    char err[KVP_ERR_SIZE] = "";
    kvp_plan_params_t p = shape(32, 8, 128);
    p.q_heads = 32;
    p.memory_bytes = 81559 * MIB;
    p.weight_bytes = 2 * 8030261248ull;
    p.context = 8192;
    kvp_plan_t r;
    assert_int_equal(plan_of(&p, &r, err), KVP_OK);
    /* 90% of what the bf16 weights leave */
    uint64_t budget = (uint64_t)((long double)(81559 * MIB - 2 * 8030261248ull) * 0.90L);
    uint64_t page = 2ull * 32 * 8 * 128 * 2 * 16;
    assert_int_equal(r.kv_budget_bytes, budget);
    assert_int_equal(r.bytes_per_token, 131072);
    assert_int_equal(r.page_bytes, page);
    assert_int_equal(r.num_pages, budget / page);
    assert_int_equal(r.max_tokens, budget / page * 16);
    assert_int_equal(r.pages_per_seq, 512);
    assert_int_equal(r.seq_bytes, 512 * page);
    assert_int_equal(r.max_seqs, budget / (512 * page));
    assert_int_equal(r.num_staging, 0);
    assert_int_equal(r.arena_bytes, r.num_pages * page);
    assert_true(r.arena_bytes <= r.kv_budget_bytes);
    assert_int_equal(r.context, 8192);
}

/* Staging formats: floor(context/P) pool pages plus one fp16 staging page. */
static void test_plan_staging_accounting(void **state) {
    (void)state;
    char err[KVP_ERR_SIZE] = "";
    kvp_plan_params_t p = shape(32, 8, 128);
    p.k_format = KVP_FORMAT_INT8;
    p.v_format = KVP_FORMAT_INT4;
    p.kv_budget_bytes = 10 * GIB;
    p.context = 1000; /* 62 full pages of 16 + 8 tokens in staging */
    kvp_plan_t r;
    assert_int_equal(plan_of(&p, &r, err), KVP_OK);
    kvp_layout_t l = layout_of(32, 8, 128, 16, KVP_FORMAT_INT8, KVP_FORMAT_INT4);
    assert_int_equal(r.needs_staging, 1);
    assert_int_equal(r.pages_per_seq, 62);
    assert_int_equal(r.seq_bytes, 62 * l.page_bytes + l.staging_page_bytes);
    assert_int_equal(r.max_seqs, (10 * GIB - l.fixed_bytes) / r.seq_bytes);
    assert_int_equal(r.num_staging, r.max_seqs);
    assert_int_equal(r.num_pages,
                     (10 * GIB - l.fixed_bytes - r.max_seqs * l.staging_page_bytes) / l.page_bytes);
    assert_true(r.num_pages >= r.max_seqs * r.pages_per_seq);
    assert_int_equal(r.bytes_per_token, 32ull * 8 * 128 * (8 + 4) / 8);
    assert_true(r.bytes_per_token_stored == l.bytes_per_token);
}

/* Invariants over many shapes, formats, budgets and contexts. */
static void test_plan_invariants_sweep(void **state) {
    (void)state;
    uint64_t seed = 0x9E3779B97F4A7C15ull;
    int checked = 0;
    for (int it = 0; it < 20000; it++) {
        seed ^= seed << 13; seed ^= seed >> 7; seed ^= seed << 17;
        kvp_plan_params_t p = shape(1 + (int32_t)(seed % 128), 1 + (int32_t)((seed >> 8) % 64),
                                    8 * (1 + (int32_t)((seed >> 16) % 32)));
        p.k_format = (int32_t)((seed >> 24) % KVP_FORMAT_COUNT);
        p.v_format = (int32_t)((seed >> 28) % KVP_FORMAT_COUNT);
        p.page_size = 2 * (1 + (int32_t)((seed >> 32) % 64));
        p.context = (seed >> 40) % 200000;
        p.kv_budget_bytes = (seed >> 3) % (2048 * GIB) + 1;
        kvp_plan_t r;
        char err[KVP_ERR_SIZE] = "";
        int rc = plan_of(&p, &r, err);
        kvp_layout_t l = layout_of(p.layers, p.kv_heads, p.head_dim, p.page_size, p.k_format,
                                   p.v_format);
        uint64_t staging = l.needs_staging ? l.staging_page_bytes : 0;
        if (p.kv_budget_bytes < l.fixed_bytes + l.page_bytes + staging) {
            assert_int_equal(rc, KVP_EINVAL);
            assert_non_null(strstr(err, "smaller than one page"));
            continue;
        }
        assert_int_equal(rc, KVP_OK);
        checked++;
        uint64_t room = p.kv_budget_bytes - l.fixed_bytes;
        assert_true(r.arena_bytes <= p.kv_budget_bytes);
        /* one more page would not fit */
        assert_true(r.arena_bytes + l.page_bytes > p.kv_budget_bytes);
        if (p.context > 0) {
            assert_true(r.max_seqs * r.seq_bytes <= room);
            assert_true((r.max_seqs + 1) * r.seq_bytes > room);
            assert_true(r.num_pages >= r.max_seqs * r.pages_per_seq);
            uint64_t cap = r.pages_per_seq * (uint64_t)p.page_size +
                           (l.needs_staging ? (uint64_t)p.page_size - 1 : 0);
            assert_true(cap >= p.context); /* a sequence's pages hold its context */
        }
    }
    assert_true(checked > 10000);
}

static void test_plan_bad_input(void **state) {
    (void)state;
    char err[KVP_ERR_SIZE];
    kvp_plan_t r, before;
    memset(&r, 0x3C, sizeof r);
    r.struct_size = sizeof r;
    before = r;
    struct { kvp_plan_params_t p; const char *needle; } cases[16];
    int n = 0;
    kvp_plan_params_t ok = shape(32, 8, 128);
    ok.memory_bytes = 80 * GIB;
    ok.context = 4096;

    cases[n].p = ok; cases[n].p.layers = 0; cases[n++].needle = "layers";
    cases[n].p = ok; cases[n].p.head_dim = -128; cases[n++].needle = "head_dim";
    cases[n].p = ok; cases[n].p.q_heads = 12; cases[n++].needle = "multiple";
    cases[n].p = ok; cases[n].p.memory_bytes = 0; cases[n++].needle = "no memory";
    cases[n].p = ok; cases[n].p.kv_budget_bytes = GIB; cases[n++].needle = "not both";
    cases[n].p = ok; cases[n].p.utilization = 0; cases[n++].needle = "utilization";
    cases[n].p = ok; cases[n].p.utilization = 1.5; cases[n++].needle = "utilization";
    cases[n].p = ok; cases[n].p.utilization = NAN; cases[n++].needle = "utilization";
    cases[n].p = ok; cases[n].p.weight_bytes = 100 * GIB; cases[n++].needle = "do not fit";
    cases[n].p = ok; cases[n].p.weight_bytes = 78 * GIB; cases[n].p.reserve_bytes = 2 * GIB;
    cases[n++].needle = "do not fit";
    /* weights that fit but leave less than a page */
    cases[n].p = ok; cases[n].p.weight_bytes = 80 * GIB - 1000; cases[n++].needle = "smaller than one page";
    cases[n].p = ok; cases[n].p.weight_bytes = UINT64_MAX; cases[n].p.reserve_bytes = 5;
    cases[n++].needle = "weights";
    cases[n].p = ok; cases[n].p.memory_bytes = 0; cases[n].p.kv_budget_bytes = 1000;
    cases[n++].needle = "smaller than one page";
    cases[n].p = ok; cases[n].p.context = UINT64_MAX; cases[n++].needle = "overflow";
    cases[n].p = ok; cases[n].p.page_size = 3; cases[n].p.k_format = KVP_FORMAT_INT4;
    cases[n++].needle = "even";
    cases[n].p = ok; cases[n].p.struct_size = 4; cases[n++].needle = "struct_size";
    for (int i = 0; i < n; i++) {
        err[0] = '\0';
        int rc = kvp_plan_compute(&cases[i].p, &r, err, sizeof err);
        if (rc != KVP_EINVAL || strstr(err, cases[i].needle) == NULL)
            print_error("case %d: %s '%s'\n", i, kvp_status_name(rc), err);
        assert_int_equal(rc, KVP_EINVAL);
        assert_non_null(strstr(err, cases[i].needle));
        assert_memory_equal(&r, &before, sizeof r); /* untouched */
    }
    assert_int_equal(kvp_plan_compute(NULL, &r, err, sizeof err), KVP_EINVAL);
    assert_int_equal(kvp_plan_compute(&ok, NULL, err, sizeof err), KVP_EINVAL);
    kvp_plan_t small = {.struct_size = 8};
    assert_int_equal(kvp_plan_compute(&ok, &small, err, sizeof err), KVP_EINVAL);
    /* no error buffer is fine */
    assert_int_equal(kvp_plan_compute(&cases[0].p, &r, NULL, 0), KVP_EINVAL);
}

/* A budget that holds pages but not one whole sequence: 0 sequences, not an error. */
static void test_plan_context_too_long(void **state) {
    (void)state;
    char err[KVP_ERR_SIZE];
    kvp_plan_params_t p = shape(32, 8, 128);
    p.kv_budget_bytes = 64 * MIB;
    p.context = 131072;
    kvp_plan_t r;
    assert_int_equal(plan_of(&p, &r, err), KVP_OK);
    assert_int_equal(r.max_seqs, 0);
    assert_int_equal(r.num_pages, 64 * MIB / (2ull * 32 * 8 * 128 * 2 * 16));
    /* no context: pages only */
    p.context = 0;
    assert_int_equal(plan_of(&p, &r, err), KVP_OK);
    assert_int_equal(r.max_seqs, 0);
    assert_int_equal(r.pages_per_seq, 0);
}

static void test_presets(void **state) {
    (void)state;
    char err[KVP_ERR_SIZE];
    static const char *const required[] = {"llama-3.1-8b", "llama-3.1-70b", "llama-2-7b",
                                           "mistral-7b", "qwen2.5-7b", "qwen2.5-72b",
                                           "smollm2-135m"};
    for (size_t i = 0; i < sizeof required / sizeof *required; i++) {
        kvp_model_preset_t m = {.struct_size = sizeof m};
        assert_int_equal(kvp_model_preset_find(required[i], &m, err, sizeof err), KVP_OK);
        assert_string_equal(m.name, required[i]);
    }
    assert_true(kvp_model_preset_count() >= 7);
    for (int32_t i = 0; i < kvp_model_preset_count(); i++) {
        kvp_model_preset_t m = {.struct_size = sizeof m};
        assert_int_equal(kvp_model_preset_get(i, &m), KVP_OK);
        assert_true(m.layers > 0 && m.kv_heads > 0 && m.head_dim > 0 && m.params > 0);
        assert_int_equal(m.q_heads % m.kv_heads, 0);
        assert_non_null(m.source);
    }
    kvp_model_preset_t m = {.struct_size = sizeof m};
    assert_int_equal(kvp_model_preset_find("SmolLM2-135M", &m, err, sizeof err), KVP_OK);
    assert_int_equal(m.layers, 30);
    assert_int_equal(m.kv_heads, 3);
    assert_int_equal(m.q_heads, 9);
    assert_int_equal(m.head_dim, 64);
    assert_int_equal(kvp_model_preset_find("llama-9", &m, err, sizeof err), KVP_ENOENT);
    assert_non_null(strstr(err, "llama-9"));
    assert_non_null(strstr(err, "llama-3.1-8b")); /* lists what is known */
    assert_int_equal(kvp_model_preset_find(NULL, &m, err, sizeof err), KVP_EINVAL);
    assert_int_equal(kvp_model_preset_get(-1, &m), KVP_EINVAL);
    assert_int_equal(kvp_model_preset_get(kvp_model_preset_count(), &m), KVP_EINVAL);
    m.struct_size = 0;
    assert_int_equal(kvp_model_preset_get(0, &m), KVP_EINVAL);
}

static void test_gpus(void **state) {
    (void)state;
    char err[KVP_ERR_SIZE];
    static const struct { const char *name; uint64_t bytes; } required[] = {
        {"h100-80g", 81559 * MIB}, {"h200-141g", 143771 * MIB}, {"a100-40g", 40960 * MIB},
        {"a100-80g", 81920 * MIB}, {"l4-24g", 23034 * MIB},     {"rtx4090-24g", 24564 * MIB},
        {"jetson-orin-8g", 8 * GIB},
    };
    for (size_t i = 0; i < sizeof required / sizeof *required; i++) {
        kvp_gpu_preset_t g = {.struct_size = sizeof g};
        assert_int_equal(kvp_gpu_preset_find(required[i].name, &g, err, sizeof err), KVP_OK);
        assert_int_equal(g.memory_bytes, required[i].bytes);
        assert_non_null(g.description);
    }
    assert_int_equal(kvp_gpu_preset_count(), 7);
    kvp_gpu_preset_t g = {.struct_size = sizeof g};
    assert_int_equal(kvp_gpu_preset_find("H100-80G", &g, err, sizeof err), KVP_OK);
    assert_int_equal(kvp_gpu_preset_find("b200", &g, err, sizeof err), KVP_ENOENT);
    assert_non_null(strstr(err, "h200-141g"));
    assert_int_equal(kvp_gpu_preset_get(7, &g), KVP_EINVAL);
    assert_int_equal(kvp_gpu_preset_find("h100-80g", NULL, err, sizeof err), KVP_EINVAL);
}

static void test_weight_bytes(void **state) {
    (void)state;
    char err[KVP_ERR_SIZE];
    uint64_t b = 0;
    assert_int_equal(kvp_weight_bytes(1000, "fp32", &b, err, sizeof err), KVP_OK);
    assert_int_equal(b, 4000);
    assert_int_equal(kvp_weight_bytes(1000, "BF16", &b, err, sizeof err), KVP_OK);
    assert_int_equal(b, 2000);
    assert_int_equal(kvp_weight_bytes(1000, "int8", &b, err, sizeof err), KVP_OK);
    assert_int_equal(b, 1000);
    assert_int_equal(kvp_weight_bytes(1000, "int4", &b, err, sizeof err), KVP_OK);
    assert_int_equal(b, 532); /* ceil(1000 * 4.25 / 8) = ceil(531.25) */
    assert_int_equal(kvp_weight_bytes(32, "int4", &b, err, sizeof err), KVP_OK);
    assert_int_equal(b, 17);
    assert_int_equal(kvp_weight_bytes(0, "fp16", &b, err, sizeof err), KVP_EINVAL);
    assert_int_equal(kvp_weight_bytes(10, "fp12", &b, err, sizeof err), KVP_EINVAL);
    assert_non_null(strstr(err, "fp12"));
    assert_int_equal(kvp_weight_bytes(UINT64_MAX, "fp32", &b, err, sizeof err), KVP_EINVAL);
    assert_non_null(strstr(err, "overflow"));
    assert_int_equal(kvp_weight_bytes(10, NULL, &b, err, sizeof err), KVP_EINVAL);
    assert_int_equal(kvp_weight_bytes(10, "fp16", NULL, err, sizeof err), KVP_EINVAL);
}

static void test_parse_size(void **state) {
    (void)state;
    static const struct { const char *text; uint64_t bytes; } good[] = {
        {"4096", 4096},           {"80GiB", 80 * GIB},      {"24GB", 24000000000ull},
        {"1.5GiB", 3 * GIB / 2},  {" 7 MiB ", 7 * MIB},     {"1k", 1024},
        {"0.5KB", 500},           {"2t", 2048 * GIB},       {"3TB", 3000000000000ull},
        {"100b", 100},            {"0.001GiB", 1073741},    {"16EiB", 0},
        {"18446744073709551615", UINT64_MAX},
    };
    char err[KVP_ERR_SIZE];
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        uint64_t b = 0;
        int rc = kvp_parse_size(good[i].text, &b, err, sizeof err);
        if (good[i].bytes == 0) { /* not a unit we accept */
            assert_int_equal(rc, KVP_EINVAL);
            continue;
        }
        if (rc != KVP_OK) print_error("'%s': %s\n", good[i].text, err);
        assert_int_equal(rc, KVP_OK);
        assert_int_equal(b, good[i].bytes);
    }
    static const char *const bad[] = {
        "", "   ", "abc", "-5", "0", "0GiB", "5XB", "1e9", "80 GiB x", "1.", ".5", "1..5G",
        "99999999999999999999", "17179869184GiB", "18446744073709551616", "GiB", "+5",
        "1.5.GiB", "12 34",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        uint64_t b = 12345;
        err[0] = '\0';
        int rc = kvp_parse_size(bad[i], &b, err, sizeof err);
        if (rc != KVP_EINVAL) print_error("'%s' was accepted as %llu\n", bad[i], (unsigned long long)b);
        assert_int_equal(rc, KVP_EINVAL);
        assert_int_equal(b, 12345);
        assert_true(strlen(err) > 0);
    }
    uint64_t b;
    assert_int_equal(kvp_parse_size(NULL, &b, err, sizeof err), KVP_EINVAL);
    assert_int_equal(kvp_parse_size("1", NULL, err, sizeof err), KVP_EINVAL);
}

/* Sizes at the 64-bit limits: the budget of the whole 2^64-1 bytes at
 * utilization 1 converts without overflow, and the plan's arena fits it;
 * products that overflow are refused with a message, the plan untouched. */
static void test_plan_extreme_sizes(void **state) {
    (void)state;
    kvp_plan_params_t p;
    kvp_plan_params_init(&p);
    p.layers = 65536;
    p.kv_heads = 65536;
    p.head_dim = KVP_MAX_HEAD_DIM;
    p.page_size = KVP_MAX_PAGE_SIZE;
    p.k_format = KVP_FORMAT_FP32;
    p.v_format = KVP_FORMAT_FP32;
    p.memory_bytes = UINT64_MAX;
    p.utilization = 1.0;
    kvp_plan_t plan = {.struct_size = sizeof plan};
    char err[KVP_ERR_SIZE];
    assert_int_equal(kvp_plan_compute(&p, &plan, err, sizeof err), KVP_OK);
    assert_true(plan.kv_budget_bytes == UINT64_MAX);
    assert_true(plan.arena_bytes <= plan.kv_budget_bytes);
    assert_true(plan.num_pages >= 1);
    /* a context whose bytes per sequence overflow 64 bits */
    p.context = UINT64_MAX;
    memset(&plan, 0x5a, sizeof plan);
    plan.struct_size = sizeof plan;
    assert_int_equal(kvp_plan_compute(&p, &plan, err, sizeof err), KVP_EINVAL);
    assert_non_null(strstr(err, "overflow"));
    assert_true(plan.num_pages == 0x5a5a5a5a5a5a5a5aull);
    /* non-finite utilization is refused */
    p.context = 0;
    p.utilization = NAN;
    assert_int_equal(kvp_plan_compute(&p, &plan, err, sizeof err), KVP_EINVAL);
    p.utilization = INFINITY;
    assert_int_equal(kvp_plan_compute(&p, &plan, err, sizeof err), KVP_EINVAL);
    /* sizes: the largest is exact, one more is refused */
    uint64_t b = 0;
    assert_int_equal(kvp_parse_size("18446744073709551615", &b, err, sizeof err), KVP_OK);
    assert_true(b == UINT64_MAX);
    assert_int_equal(kvp_parse_size("18446744073709551616", &b, err, sizeof err), KVP_EINVAL);
    assert_int_equal(kvp_parse_size("16777216TiB", &b, err, sizeof err), KVP_EINVAL);
    assert_int_equal(kvp_parse_size("16777215.99999999999999TiB", &b, err, sizeof err), KVP_OK);
    assert_true(b >= (16777215ull << 40));
    assert_int_equal(kvp_weight_bytes(UINT64_MAX, "fp32", &b, err, sizeof err), KVP_EINVAL);
    assert_int_equal(kvp_weight_bytes(UINT64_MAX, "int4", &b, err, sizeof err), KVP_OK);
    assert_true(b == UINT64_MAX / 32 * 17 + (UINT64_MAX % 32 * 17 + 31) / 32);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout_fp16_llama70b),
        cmocka_unit_test(test_layout_quantized_ratios),
        cmocka_unit_test(test_layout_all_formats_match_reference),
        cmocka_unit_test(test_layout_padding),
        cmocka_unit_test(test_layout_bad_input),
        cmocka_unit_test(test_arena_bytes),
        cmocka_unit_test(test_params_init),
        cmocka_unit_test(test_plan_llama8b_h100),
        cmocka_unit_test(test_plan_staging_accounting),
        cmocka_unit_test(test_plan_invariants_sweep),
        cmocka_unit_test(test_plan_bad_input),
        cmocka_unit_test(test_plan_context_too_long),
        cmocka_unit_test(test_presets),
        cmocka_unit_test(test_gpus),
        cmocka_unit_test(test_weight_bytes),
        cmocka_unit_test(test_parse_size),
        cmocka_unit_test(test_plan_extreme_sizes),
    };
    return cmocka_run_group_tests_name("plan", tests, NULL, NULL);
}
