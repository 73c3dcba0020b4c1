/*
 * Layer: store — the page arena (one allocation of kvp_arena_bytes), its
 * regions and strides, append with SEAL, COPY / UNSEAL, fp8 scales, and bad
 * input (status + detail, arena unchanged).
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
#include "kvpage_tier.h"
#include "blockfmt.h"
#include "numeric.h"
#include "testutil.h"
#include "../bench/kvdist.h"

static kvp_store_t *make_store(int32_t layers, int32_t H, int32_t D, int32_t P, int32_t kf, int32_t vf,
                               int32_t order, uint64_t pages, uint64_t staging) {
    kvp_store_params_t p;
    kvp_store_params_init(&p);
    p.layers = layers;
    p.kv_heads = H;
    p.head_dim = D;
    p.page_size = P;
    p.k_format = kf;
    p.v_format = vf;
    p.k_order = order;
    p.num_pages = pages;
    p.num_staging = staging;
    kvp_store_t *s = NULL;
    char err[KVP_ERR_SIZE];
    int rc = kvp_store_create(&p, &s, err, sizeof err);
    if (rc != KVP_OK) print_error("create: %s\n", err);
    assert_int_equal(rc, KVP_OK);
    return s;
}

static kvp_store_info_t info_of(const kvp_store_t *s) {
    kvp_store_info_t info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    assert_int_equal(kvp_store_info(s, &info), KVP_OK);
    return info;
}

/* FNV-1a of the whole arena: "nothing was written". */
static uint64_t arena_hash(const kvp_store_t *s) {
    kvp_store_info_t info = info_of(s);
    uint64_t h = 1469598103934665603ull;
    for (uint64_t i = 0; i < info.arena_bytes; i++)
        h = (h ^ ((const uint8_t *)info.arena)[i]) * 1099511628211ull;
    return h;
}

static void test_create_and_sizes(void **state) {
    (void)state;
    for (int32_t kf = 0; kf < KVP_FORMAT_COUNT; kf++)
        for (int32_t vf = 0; vf < KVP_FORMAT_COUNT; vf++) {
            kvp_store_t *s = make_store(3, 2, 64, 16, kf, vf, kf % 2, 10, 4);
            kvp_layout_t l = {.struct_size = sizeof l};
            assert_int_equal(kvp_store_layout(s, &l), KVP_OK);
            uint64_t want;
            assert_int_equal(kvp_arena_bytes(&l, 10, 4, &want, NULL, 0), KVP_OK);
            kvp_store_info_t info = info_of(s);
            void *base = info.arena;
            uint64_t bytes = info.arena_bytes;
            assert_int_equal(bytes, want); /* exactly the planner's bytes */
            assert_int_equal((uintptr_t)base % KVP_ARENA_ALIGN, 0);
            /* regions tile the arena: pool layers, then staging layers */
            uint64_t covered = l.fixed_bytes;
            for (int32_t layer = 0; layer < 3; layer++)
                for (int32_t kind = 0; kind < 4; kind++) {
                    kvp_region_t r = {.struct_size = sizeof r};
                    assert_int_equal(kvp_store_region(s, layer, kind, &r), KVP_OK);
                    if (r.pages == 0) continue;
                    assert_int_equal(r.head_stride * 2, r.page_stride);
                    assert_int_equal(r.block_bytes % KVP_BLOCK_ALIGN, 0);
                    covered += r.pages * r.page_stride;
                    assert_true((uint8_t *)r.base + r.pages * r.page_stride <= (uint8_t *)base + bytes);
                }
            assert_int_equal(covered, bytes);
            kvp_store_destroy(s);
        }
    kvp_store_destroy(NULL);
    assert_string_equal(kvp_store_last_error(NULL), "NULL handle");
    uint64_t n = 77;
    assert_int_equal(kvp_store_nonfinite_count(NULL, &n), KVP_EINVAL);
    assert_int_equal(n, 77);
}

static void test_create_bad_params(void **state) {
    (void)state;
    kvp_store_params_t p;
    kvp_store_t *s = NULL;
    char err[KVP_ERR_SIZE];
    struct {
        int what;
        const char *needle;
    } cases[] = {{0, "head_dim"}, {1, "num_pages"}, {2, "num_staging"}, {3, "k_order"},
                 {4, "even"},     {5, "2^31"},      {6, "allocator"},   {7, "struct_size"}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        kvp_store_params_init(&p);
        p.layers = 2;
        p.kv_heads = 2;
        p.head_dim = 64;
        p.num_pages = 4;
        p.num_staging = 1;
        switch (cases[i].what) {
        case 0: p.head_dim = 60; break;
        case 1: p.num_pages = 0; break;
        case 2: p.k_format = KVP_FORMAT_INT8; p.num_staging = 0; break;
        case 3: p.k_order = 2; break;
        case 4: p.k_format = KVP_FORMAT_INT4; p.page_size = 9; break;
        case 5: p.num_pages = 1ull << 31; break;
        case 6: p.allocator.free = kvt_free; break;
        default: p.struct_size = 3; break;
        }
        err[0] = 0;
        assert_int_equal(kvp_store_create(&p, &s, err, sizeof err), KVP_EINVAL);
        if (!strstr(err, cases[i].needle)) print_error("'%s' lacks '%s'\n", err, cases[i].needle);
        assert_non_null(strstr(err, cases[i].needle));
        assert_null(s);
    }
    assert_int_equal(kvp_store_create(NULL, &s, err, sizeof err), KVP_EINVAL);
    kvp_store_params_init(&p);
    p.layers = p.kv_heads = 1;
    p.head_dim = 64;
    p.num_pages = 1;
    assert_int_equal(kvp_store_create(&p, NULL, err, sizeof err), KVP_EINVAL);
    /* every allocation can fail; nothing leaks */
    for (long fail = 0; fail < 6; fail++) {
        test_alloc_state st = {0, fail, 0, 0};
        p.allocator = test_allocator(&st);
        p.k_format = KVP_FORMAT_INT8;
        p.num_staging = 2;
        s = NULL;
        int rc = kvp_store_create(&p, &s, err, sizeof err);
        if (rc == KVP_OK) kvp_store_destroy(s);
        else assert_int_equal(rc, KVP_ENOMEM);
        assert_int_equal(st.live, 0);
    }
}

/* fp16 token-major blocks are FlashInfer's HND layout, at the strides the
 * region reports; dim-major swaps the strides. */
static void test_region_strides_hnd(void **state) {
    (void)state;
    const int32_t H = 2, D = 64, P = 8;
    for (int32_t order = 0; order < 2; order++) {
        kvp_store_t *s = make_store(2, H, D, P, KVP_FORMAT_FP16, KVP_FORMAT_FP16, order, 6, 0);
        float k[3 * 2 * 64], v[3 * 2 * 64];
        for (int i = 0; i < 3 * H * D; i++) {
            k[i] = (float)i * 0.25f;
            v[i] = -(float)i * 0.5f;
        }
        int64_t slots[3] = {4 * P + 5, 1 * P + 0, 4 * P + 6};
        kvp_append_params_t a;
        kvp_append_params_init(&a);
        a.layer = 1;
        a.rows = 3;
        a.dtype = KVP_FORMAT_FP32;
        a.k = k;
        a.v = v;
        a.slots = slots;
        assert_int_equal(kvp_store_append(s, &a), KVP_OK);
        kvp_region_t rk = {.struct_size = sizeof rk}, rv = {.struct_size = sizeof rv};
        assert_int_equal(kvp_store_region(s, 1, KVP_REGION_K, &rk), KVP_OK);
        assert_int_equal(kvp_store_region(s, 1, KVP_REGION_V, &rv), KVP_OK);
        assert_int_equal(rk.order, order);
        assert_int_equal(rv.token_stride, (uint64_t)D * 2);
        assert_int_equal(rv.dim_stride, 2);
        for (int r = 0; r < 3; r++)
            for (int32_t h = 0; h < H; h++)
                for (int32_t d = 0; d < D; d++) {
                    int64_t page = slots[r] / P, t = slots[r] % P;
                    const uint8_t *kp = (const uint8_t *)rk.base + (uint64_t)page * rk.page_stride +
                                        (uint64_t)h * rk.head_stride + (uint64_t)t * rk.token_stride +
                                        (uint64_t)d * rk.dim_stride;
                    const uint8_t *vp = (const uint8_t *)rv.base + (uint64_t)page * rv.page_stride +
                                        (uint64_t)h * rv.head_stride + (uint64_t)t * rv.token_stride +
                                        (uint64_t)d * rv.dim_stride;
                    uint16_t kh, vh;
                    memcpy(&kh, kp, 2);
                    memcpy(&vh, vp, 2);
                    assert_true(kvp__f16_to_f32(kh) == k[(r * H + h) * D + d]);
                    assert_true(kvp__f16_to_f32(vh) == v[(r * H + h) * D + d]);
                }
        kvp_store_destroy(s);
    }
}

/* A sequence appended token by token through staging and seals reads back
 * as the same values as quantizing each full page at once (byte-identical
 * blocks), for every format pair with staging. */
static void test_append_seal_matches_quantize(void **state) {
    (void)state;
    const int32_t H = 2, D = 64, P = 8, T = 29, L = 2;
    kvd_rng rng;
    kvd_seed(&rng, 21);
    kvd_keys keys;
    assert_int_equal(kvd_keys_init(&keys, &rng, H, D), 0);
    float *k = malloc((size_t)T * H * D * 4), *v = malloc((size_t)T * H * D * 4);
    kvd_fill_keys(&keys, &rng, T, k);
    kvd_fill_normal(&rng, (size_t)T * H * D, v);
    /* a seal quantizes the staging page's tokens as stored (fp16): give the
     * inputs fp16 values, so both routes see the same numbers */
    for (int32_t i = 0; i < T * H * D; i++) {
        k[i] = kvp__f16_to_f32(kvp__f32_to_f16(k[i]));
        v[i] = kvp__f16_to_f32(kvp__f32_to_f16(v[i]));
    }
    static const int32_t fmts[][2] = {{KVP_FORMAT_INT8, KVP_FORMAT_INT8}, {KVP_FORMAT_INT4, KVP_FORMAT_INT4},
                                      {KVP_FORMAT_INT4_V1, KVP_FORMAT_INT4_V1}, {KVP_FORMAT_INT8, KVP_FORMAT_INT4},
                                      {KVP_FORMAT_INT8, KVP_FORMAT_FP16}, {KVP_FORMAT_INT4, KVP_FORMAT_FP8_E4M3},
                                      {KVP_FORMAT_FP16, KVP_FORMAT_INT8}, {KVP_FORMAT_BF16, KVP_FORMAT_INT4}};
    for (size_t f = 0; f < sizeof fmts / sizeof *fmts; f++) {
        kvp_store_t *s = make_store(L, H, D, P, fmts[f][0], fmts[f][1], 0, 8, 2);
        kvp_layout_t lay = {.struct_size = sizeof lay};
        kvp_store_layout(s, &lay);
        if (fmts[f][1] == KVP_FORMAT_FP8_E4M3)
            for (int32_t l = 0; l < L; l++)
                for (int32_t h = 0; h < H; h++) assert_int_equal(kvp_store_set_fp8_scale(s, l, h, 1, 0.05f), KVP_OK);
        /* the page table chooses the slots and the seals */
        kvp_pool_params_t pp;
        kvp_pool_params_init(&pp);
        pp.page_size = P;
        pp.num_pages = 8;
        pp.num_staging = lay.needs_staging ? 2 : 0;
        kvp_pool_t *pool = NULL;
        kvp_table_t *table = NULL;
        char err[KVP_ERR_SIZE];
        assert_int_equal(kvp_pool_create(&pp, &pool, err, sizeof err), KVP_OK);
        assert_int_equal(kvp_table_create(pool, 0, &table, err, sizeof err), KVP_OK);
        int32_t seq = -1;
        assert_int_equal(kvp_table_seq_create(table, 0, 0, &seq), KVP_OK);
        static const int32_t steps[] = {1, 3, 1, 9, 2, 8, 5};
        int32_t seals = 0, staged[8] = {0}; /* per pool page: its seal's staged tokens */
        for (int32_t t0 = 0, si = 0; t0 < T; si++) {
            int32_t n = steps[si % 7] < T - t0 ? steps[si % 7] : T - t0, nops = 0;
            int64_t slots[16];
            kvp_page_op_t ops[16];
            assert_int_equal(kvp_table_append(table, seq, n, NULL, slots, ops, 16, &nops), KVP_OK);
            for (int32_t i = 0; i < nops; i++)
                if (ops[i].kind == KVP_OP_SEAL) {
                    seals++;
                    if (ops[i].dst >= 0 && ops[i].dst < 8) staged[ops[i].dst] = ops[i].count;
                }
            for (int32_t l = 0; l < L; l++) {
                kvp_append_params_t a;
                kvp_append_params_init(&a);
                a.layer = l;
                a.rows = n;
                a.dtype = KVP_FORMAT_FP32;
                a.k = k + (size_t)t0 * H * D;
                a.v = v + (size_t)t0 * H * D;
                a.slots = slots;
                a.ops = ops;
                a.num_ops = nops;
                int rc = kvp_store_append(s, &a);
                if (rc) print_error("%s\n", kvp_store_last_error(s));
                assert_int_equal(rc, KVP_OK);
            }
            t0 += n;
        }
        assert_int_equal(seals, lay.needs_staging ? T / P : 0);
        kvp_seq_info_t si = {.struct_size = sizeof si};
        assert_int_equal(kvp_table_seq_info(table, seq, &si), KVP_OK);
        assert_int_equal(si.length, T);
        int32_t pages[8];
        assert_int_equal(si.num_pages, T / P + (T % P != 0)); /* full pages + the partial one */
    assert_int_equal(kvp_table_seq_pages(table, seq, pages, 8), KVP_OK);
        /* full pages: byte-identical to kvp_quantize of the page */
        for (int32_t pg = 0; pg < T / P; pg++)
            for (int32_t side = 0; side < 2; side++) {
                kvp_quant_desc_t q = {sizeof q, fmts[f][side], side, 0, P, D, H, KVP_FORMAT_FP32, 0.05f, 0};
                uint64_t block;
                assert_int_equal(kvp_quant_block_bytes(&q, &block, NULL, 0), KVP_OK);
                uint8_t *want = calloc(H, block);
                assert_int_equal(kvp_quantize(&q, (side ? v : k) + (size_t)pg * P * H * D, 1, want, NULL, 0),
                                 KVP_OK);
                if (side && lay.needs_staging && fmts[f][1] == KVP_FORMAT_INT4) {
                    /* rotated values: the staged tokens were kept as fp16 in the
                     * rotated basis, and the seal quantizes them as they are */
                    kvp__blockfmt raw = kvp__blockfmt_make(KVP_FORMAT_INT4, 0, 0, P, D);
                    raw.rot = 0;
                    for (int32_t h = 0; h < H; h++) {
                        float rows[16 * 64];
                        assert_true(P <= 16 && D <= 64);
                        for (int32_t t = 0; t < P; t++) {
                            float *r = rows + (size_t)t * (size_t)D;
                            memcpy(r, v + (((size_t)pg * P + (size_t)t) * H + (size_t)h) * D, (size_t)D * 4);
                            kvp__rot_forward(r, D);
                            if (t < staged[pages[pg]])
                                for (int32_t d = 0; d < D; d++) r[d] = kvp__f16_to_f32(kvp__f32_to_f16(r[d]));
                        }
                        kvp__block_encode(&raw, want + h * block, 0, P, rows, (size_t)D, 1.0f);
                    }
                }
                kvp_region_t r = {.struct_size = sizeof r};
                assert_int_equal(kvp_store_region(s, 1, side ? KVP_REGION_V : KVP_REGION_K, &r), KVP_OK);
                assert_true(pages[pg] >= 0 && pages[pg] < 8);
                const uint8_t *got = (const uint8_t *)r.base + (uint64_t)pages[pg] * r.page_stride;
                for (int32_t h = 0; h < H; h++)
                    assert_memory_equal(got + h * r.head_stride, want + h * block, r.scale_offset);
                free(want);
            }
        /* the partial last page reads back from staging (fp16 keys) */
        if (lay.needs_staging) {
            assert_true(si.staging_page >= 8);
            assert_int_equal(pages[si.num_pages - 1], si.staging_page);
            float back[5 * 2 * 64];
            int32_t tail = T % P;
            assert_int_equal(kvp_store_read(s, 1, si.staging_page, 0, tail, back, NULL), KVP_OK);
            for (int32_t i = 0; i < tail * H * D; i++)
                assert_true(back[i] == k[(size_t)(T - tail) * H * D + i]);
        } else {
            assert_int_equal(si.staging_page, -1);
        }
        kvp_table_destroy(table);
        kvp_pool_destroy(pool);
        kvp_store_destroy(s);
    }
    kvd_keys_free(&keys);
    free(k);
    free(v);
}

/* Skipped rows (negative slots), row strides (fused QKV) and fp16 input. */
static void test_append_strides_and_skips(void **state) {
    (void)state;
    const int32_t H = 2, D = 8, P = 4, W = 3 * H * D; /* q|k|v per row */
    kvp_store_t *s = make_store(1, H, D, P, KVP_FORMAT_FP32, KVP_FORMAT_INT8, 0, 4, 0);
    uint16_t qkv[3 * 3 * 2 * 8];
    for (int i = 0; i < 3 * W; i++) qkv[i] = kvp__f32_to_f16((float)(i % 50) * 0.125f);
    int64_t slots[3] = {5, -1, 2};
    kvp_append_params_t a;
    kvp_append_params_init(&a);
    a.rows = 3;
    a.dtype = KVP_FORMAT_FP16;
    a.k = qkv + H * D;
    a.v = qkv + 2 * H * D;
    a.k_row_stride = W;
    a.v_row_stride = W;
    a.slots = slots;
    assert_int_equal(kvp_store_append(s, &a), KVP_OK);
    float kb[2 * 8];
    for (int r = 0; r < 3; r += 2) {
        assert_int_equal(kvp_store_read(s, 0, (int32_t)(slots[r] / P), (int32_t)(slots[r] % P), 1, kb, NULL),
                         KVP_OK);
        for (int i = 0; i < H * D; i++) assert_true(kb[i] == kvp__f16_to_f32(qkv[r * W + H * D + i]));
    }
    uint64_t nonfinite = 99;
    assert_int_equal(kvp_store_nonfinite_count(s, &nonfinite), KVP_OK);
    assert_int_equal(nonfinite, 0);
    qkv[2 * W + H * D + 3] = kvp__f32_to_f16(NAN);
    qkv[2 * W + 2 * H * D + 1] = kvp__f32_to_f16(INFINITY);
    assert_int_equal(kvp_store_append(s, &a), KVP_OK);
    assert_int_equal(kvp_store_nonfinite_count(s, &nonfinite), KVP_OK);
    assert_int_equal(nonfinite, 2);
    kvp_store_destroy(s);
}

/* COPY (pool and staging) and UNSEAL, with values in the rotated basis
 * (int4) and not (int4_v1). */
static void page_ops(int32_t v_format) {
    const int32_t H = 1, D = 64, P = 8, L = 2;
    kvp_store_t *s = make_store(L, H, D, P, KVP_FORMAT_INT8, v_format, 0, 4, 3);
    kvd_rng rng;
    kvd_seed(&rng, 5);
    float k[8 * 64], v[8 * 64];
    kvd_fill_normal(&rng, 8 * 64, k);
    kvd_fill_normal(&rng, 8 * 64, v);
    int64_t slots[8];
    for (int i = 0; i < 8; i++) slots[i] = 2 * P + i; /* pool page 2, sealed */
    kvp_page_op_t seal = {KVP_OP_SEAL, -1, 2, 0, 0};
    for (int32_t l = 0; l < L; l++) {
        kvp_append_params_t a;
        kvp_append_params_init(&a);
        a.layer = l;
        a.rows = 8;
        a.dtype = KVP_FORMAT_FP32;
        a.k = k;
        a.v = v;
        a.slots = slots;
        a.ops = &seal;
        a.num_ops = 1;
        assert_int_equal(kvp_store_append(s, &a), KVP_OK);
    }
    float a8[8 * 64], b8[8 * 64], av[8 * 64], bv[8 * 64];
    kvp_page_op_t ops[3] = {{KVP_OP_COPY, 2, 3, 0, -1}, {KVP_OP_UNSEAL, 2, 4 + 1, 5, -1},
                            {KVP_OP_COPY, 5, 6, 0, -1}};
    assert_int_equal(kvp_store_apply_ops(s, ops, 3), KVP_OK);
    for (int32_t l = 0; l < L; l++) {
        assert_int_equal(kvp_store_read(s, l, 2, 0, 8, a8, av), KVP_OK);
        assert_int_equal(kvp_store_read(s, l, 3, 0, 8, b8, bv), KVP_OK);
        assert_memory_equal(a8, b8, sizeof a8); /* COPY: identical */
        assert_memory_equal(av, bv, sizeof av);
        assert_int_equal(kvp_store_read(s, l, 6, 0, 5, b8, bv), KVP_OK);
        for (int i = 0; i < 5 * 64; i++) { /* UNSEAL: the quantized values, as fp16 */
            assert_true(b8[i] == kvp__f16_to_f32(kvp__f32_to_f16(a8[i])));
            if (v_format == KVP_FORMAT_INT4) /* fp16 of the rotated values: about as close */
                assert_true(fabsf(bv[i] - av[i]) <= 4e-3f * (1.0f + fabsf(av[i])));
            else
                assert_true(bv[i] == kvp__f16_to_f32(kvp__f32_to_f16(av[i])));
        }
    }
    /* bad operations: checked before any runs, nothing changes */
    uint64_t before = arena_hash(s);
    kvp_page_op_t bad[][2] = {
        {{KVP_OP_COPY, 0, 1, 0, -1}, {KVP_OP_COPY, 0, 5, 0, -1}},   /* pool -> staging */
        {{KVP_OP_COPY, 0, 1, 0, -1}, {KVP_OP_UNSEAL, 1, 5, 9, -1}}, /* count > page */
        {{KVP_OP_COPY, 0, 1, 0, -1}, {KVP_OP_UNSEAL, 5, 6, 2, -1}}, /* src not pool */
        {{KVP_OP_COPY, 0, 1, 0, -1}, {7, 0, 1, 0, -1}},             /* unknown kind */
        {{KVP_OP_COPY, 0, 1, 0, -1}, {KVP_OP_COPY, 0, 7, 0, -1}},   /* no page 7 */
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        assert_int_equal(kvp_store_apply_ops(s, bad[i], 2), KVP_EINVAL);
        assert_non_null(strstr(kvp_store_last_error(s), "ops[1]"));
        assert_int_equal(arena_hash(s), before);
    }
    assert_int_equal(kvp_store_apply_ops(s, NULL, 1), KVP_EINVAL);
    assert_int_equal(kvp_store_apply_ops(s, NULL, 0), KVP_OK);
    kvp_store_destroy(s);
    /* UNSEAL needs a staging layout */
    s = make_store(1, 1, 64, 8, KVP_FORMAT_FP16, KVP_FORMAT_FP16, 0, 2, 0);
    kvp_page_op_t un = {KVP_OP_UNSEAL, 0, 2, 1, -1};
    assert_int_equal(kvp_store_apply_ops(s, &un, 1), KVP_EINVAL);
    kvp_store_destroy(s);
}

static void test_page_ops(void **state) {
    (void)state;
    page_ops(KVP_FORMAT_INT4);
    page_ops(KVP_FORMAT_INT4_V1);
}

static void test_fp8_scales(void **state) {
    (void)state;
    kvp_store_t *s = make_store(2, 2, 64, 4, KVP_FORMAT_FP16, KVP_FORMAT_FP8_E4M3, 0, 4, 0);
    float sc = -1.0f;
    assert_int_equal(kvp_store_get_fp8_scale(s, 1, 1, 1, &sc), KVP_OK);
    assert_true(sc == 0.0f); /* not calibrated */
    assert_int_equal(kvp_store_get_fp8_scale(s, 1, 1, 0, &sc), KVP_EINVAL); /* keys are fp16 */
    assert_non_null(strstr(kvp_store_last_error(s), "fp8"));
    assert_int_equal(kvp_store_set_fp8_scale(s, 0, 0, 1, -1.0f), KVP_EINVAL);
    assert_int_equal(kvp_store_set_fp8_scale(s, 0, 2, 1, 1.0f), KVP_EINVAL);
    assert_int_equal(kvp_store_set_fp8_scale(s, 2, 0, 1, 1.0f), KVP_EINVAL);
    assert_int_equal(kvp_store_set_fp8_scale(s, 0, 1, 1, 0.5f), KVP_OK);
    float v[2 * 2 * 64], k[2 * 2 * 64];
    for (int i = 0; i < 2 * 2 * 64; i++) {
        v[i] = (float)((i % 64) - 32) * (i < 128 ? 0.1f : 0.05f);
        k[i] = 0.0f;
    }
    v[3] = NAN; /* ignored by calibration */
    int64_t slots[2] = {0, 1};
    kvp_append_params_t a;
    kvp_append_params_init(&a);
    a.rows = 2;
    a.dtype = KVP_FORMAT_FP32;
    a.k = k;
    a.v = v;
    a.slots = slots;
    assert_int_equal(kvp_store_append(s, &a), KVP_OK);
    assert_int_equal(kvp_store_get_fp8_scale(s, 0, 0, 1, &sc), KVP_OK);
    /* head 0: rows 0 and 1, max |x| = 32 * 0.1 (row 0) */
    assert_true(fabsf(sc - 3.2f * 8.0f / 448.0f) < 1e-6f);
    assert_int_equal(kvp_store_get_fp8_scale(s, 0, 1, 1, &sc), KVP_OK);
    assert_true(sc == 0.5f); /* set by the engine: kept */
    assert_int_equal(kvp_store_get_fp8_scale(s, 1, 0, 1, &sc), KVP_OK);
    assert_true(sc == 0.0f); /* layer 1 not appended yet */
    kvp_store_destroy(s);
}

/* Bad appends: a status, a detail naming the problem, and an unchanged arena. */
static void test_append_bad_input(void **state) {
    (void)state;
    const int32_t H = 1, D = 64, P = 4;
    kvp_store_t *s = make_store(2, H, D, P, KVP_FORMAT_INT8, KVP_FORMAT_INT8, 0, 3, 2);
    float k[6 * 64], v[6 * 64];
    for (int i = 0; i < 6 * 64; i++) k[i] = v[i] = (float)i;
    int64_t ok_slots[4] = {3 * P, 3 * P + 1, 4 * P + 0, 4 * P + 1}; /* two staging pages */
    int64_t slots[6];
    kvp_page_op_t ops[2];
    kvp_append_params_t base;
    kvp_append_params_init(&base);
    base.rows = 4;
    base.dtype = KVP_FORMAT_FP32;
    base.k = k;
    base.v = v;
    base.slots = slots;
    base.ops = ops;
    base.num_ops = 0;
    uint64_t before = arena_hash(s);
    struct {
        int what;
        const char *needle;
    } cases[] = {
        {0, "layer"},      {1, "dtype"},       {2, "NULL"},       {3, "not a page id"},
        {4, "SEAL op"},    {5, "expected"},    {6, "count"},      {7, "staging page"},
        {8, "k_row_stride"}, {9, "rows"},      {10, "struct_size"}, {11, "dst"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        kvp_append_params_t a = base;
        memcpy(slots, ok_slots, sizeof ok_slots);
        a.num_ops = 0;
        switch (cases[i].what) {
        case 0: a.layer = 2; break;
        case 1: a.dtype = KVP_FORMAT_INT4; break;
        case 2: a.k = NULL; break;
        case 3: slots[1] = 5 * P; break;                        /* past the staging pages */
        case 4: slots[2] = 0; break;                            /* pool page without a seal */
        case 5: /* seal whose rows' slots do not point into dst */
            ops[0] = (kvp_page_op_t){KVP_OP_SEAL, 3, 0, 2, 0};
            slots[0] = 0 * P + 2;
            slots[1] = 0 * P + 2;
            slots[2] = 3 * P;
            slots[3] = 3 * P + 1;
            a.num_ops = 1;
            break;
        case 6: ops[0] = (kvp_page_op_t){KVP_OP_SEAL, 3, 0, 4, 0}; a.num_ops = 1; break;
        case 7: ops[0] = (kvp_page_op_t){KVP_OP_SEAL, 1, 0, 2, 0}; a.num_ops = 1; break; /* src pool */
        case 8: a.k_row_stride = 10; break;
        case 9: a.rows = -1; break;
        case 10: a.struct_size = 2; break;
        default: ops[0] = (kvp_page_op_t){KVP_OP_SEAL, -1, 4, 0, 0}; a.num_ops = 1; break; /* dst staging */
        }
        int rc = kvp_store_append(s, &a);
        assert_int_equal(rc, KVP_EINVAL);
        if (!strstr(kvp_store_last_error(s), cases[i].needle))
            print_error("case %zu: '%s' lacks '%s'\n", i, kvp_store_last_error(s), cases[i].needle);
        assert_non_null(strstr(kvp_store_last_error(s), cases[i].needle));
        assert_int_equal(arena_hash(s), before);
    }
    /* the good append still works; the detail of the last failure stays
     * (sticky: a successful call does not clear it) */
    char last[KVP_ERR_SIZE];
    snprintf(last, sizeof last, "%s", kvp_store_last_error(s));
    memcpy(slots, ok_slots, sizeof ok_slots);
    assert_int_equal(kvp_store_append(s, &base), KVP_OK);
    assert_string_equal(kvp_store_last_error(s), last);
    assert_int_equal(kvp_store_append(NULL, &base), KVP_EINVAL);
    /* a SEAL in a layout without staging */
    kvp_store_t *f = make_store(1, 1, 64, 4, KVP_FORMAT_FP16, KVP_FORMAT_FP16, 0, 2, 0);
    kvp_append_params_t a = base;
    ops[0] = (kvp_page_op_t){KVP_OP_SEAL, -1, 0, 0, 0};
    for (int i = 0; i < 4; i++) slots[i] = i;
    a.num_ops = 1;
    assert_int_equal(kvp_store_append(f, &a), KVP_EINVAL);
    assert_non_null(strstr(kvp_store_last_error(f), "without staging"));
    /* reads and regions */
    float out[64];
    assert_int_equal(kvp_store_read(f, 0, 2, 0, 1, out, NULL), KVP_EINVAL);
    assert_int_equal(kvp_store_read(f, 0, 0, 3, 2, out, NULL), KVP_EINVAL);
    assert_int_equal(kvp_store_read(f, 0, 0, 0, 1, NULL, NULL), KVP_EINVAL);
    kvp_region_t r = {.struct_size = sizeof r};
    assert_int_equal(kvp_store_region(f, 1, KVP_REGION_K, &r), KVP_EINVAL);
    assert_int_equal(kvp_store_region(f, 0, 4, &r), KVP_EINVAL);
    r.struct_size = 1;
    assert_int_equal(kvp_store_region(f, 0, 0, &r), KVP_EINVAL);
    kvp_store_destroy(f);
    kvp_store_destroy(s);
}

/* Page I/O (the host tier's swaps): a page's serialization is
 * [layer][K blocks][V blocks], any byte range of it; copying it out and back
 * restores the page bit for bit; bad ids and ranges change nothing. */
static void test_page_io(void **state) {
    (void)state;
    const int32_t L = 3, H = 2, D = 32, P = 8;
    kvp_store_t *s = make_store(L, H, D, P, KVP_FORMAT_INT8, KVP_FORMAT_INT4, 0, 6, 3);
    kvp_store_info_t info = info_of(s);
    assert_int_equal(info.backend, KVP_BACKEND_CPU);
    kvp_layout_t lay = {.struct_size = sizeof lay};
    assert_int_equal(kvp_store_layout(s, &lay), KVP_OK);
    void *base = info.arena;
    uint64_t bytes = info.arena_bytes;
    for (uint64_t i = lay.fixed_bytes; i < bytes; i++) ((uint8_t *)base)[i] = (uint8_t)(i * 131 + 7);
    uint64_t pb = lay.page_bytes, sb = lay.staging_page_bytes;
    uint8_t *buf = malloc((size_t)(pb + sb)), *part = malloc((size_t)(pb + sb));
    assert_non_null(buf);
    assert_non_null(part);
    for (int32_t page = 0; page < 9; page++) {
        bool stg = page >= 6;
        uint64_t n = stg ? sb : pb;
        assert_int_equal(kvp_store_page_to_host(s, page, 0, buf, n), KVP_OK);
        /* the serialization, from the regions */
        uint64_t at = 0;
        for (int32_t l = 0; l < L; l++)
            for (int32_t kind = 0; kind < 2; kind++) {
                kvp_region_t r = {.struct_size = sizeof r};
                assert_int_equal(kvp_store_region(s, l, stg ? kind + 2 : kind, &r), KVP_OK);
                const uint8_t *src = (const uint8_t *)r.base + (uint64_t)(page - r.first_page) * r.page_stride;
                assert_memory_equal(buf + at, src, (size_t)r.page_stride);
                at += r.page_stride;
            }
        assert_true(at == n);
        /* a range across block boundaries */
        uint64_t off = n / 5 + 3, len = n / 2 + 1;
        assert_int_equal(kvp_store_page_to_host(s, page, off, part, len), KVP_OK);
        assert_memory_equal(part, buf + off, (size_t)len);
    }
    /* out, clobber, back in two halves: the same arena */
    uint8_t *before = malloc((size_t)bytes);
    assert_non_null(before);
    memcpy(before, base, (size_t)bytes);
    assert_int_equal(kvp_store_page_to_host(s, 4, 0, buf, pb), KVP_OK);
    kvp_page_op_t clobber = {KVP_OP_COPY, 1, 4, 0, -1};
    assert_int_equal(kvp_store_apply_ops(s, &clobber, 1), KVP_OK);
    assert_true(memcmp(before, base, (size_t)bytes) != 0);
    assert_int_equal(kvp_store_page_from_host(s, 4, 0, buf, pb / 2), KVP_OK);
    assert_int_equal(kvp_store_page_from_host(s, 4, pb / 2, buf + pb / 2, pb - pb / 2), KVP_OK);
    assert_memory_equal(before, base, (size_t)bytes);
    assert_int_equal(kvp_store_synchronize(s), KVP_OK);
    /* bad input: a status, the detail, nothing written */
    assert_int_equal(kvp_store_page_to_host(s, 9, 0, buf, 8), KVP_EINVAL);
    assert_non_null(strstr(kvp_store_last_error(s), "not a page id"));
    assert_int_equal(kvp_store_page_to_host(s, -1, 0, buf, 8), KVP_EINVAL);
    assert_int_equal(kvp_store_page_to_host(s, 0, pb - 7, buf, 8), KVP_EINVAL);
    assert_non_null(strstr(kvp_store_last_error(s), "outside"));
    assert_int_equal(kvp_store_page_from_host(s, 0, 0, NULL, 8), KVP_EINVAL);
    assert_int_equal(kvp_store_page_from_host(s, 7, sb, buf, 1), KVP_EINVAL);
    assert_memory_equal(before, base, (size_t)bytes);
    assert_int_equal(kvp_store_page_to_host(s, 0, pb, buf, 0), KVP_OK); /* empty range */
    assert_int_equal(kvp_store_page_to_host(NULL, 0, 0, buf, 8), KVP_EINVAL);
    assert_int_equal(kvp_store_synchronize(NULL), KVP_EINVAL);
    assert_int_equal(kvp_store_info(NULL, &info), KVP_EINVAL);
    free(before);
    free(buf);
    free(part);
    kvp_store_destroy(s);
}

/* kvp_store_info() reports what the store was created with. */
static void test_store_info(void **state) {
    (void)state;
    static const struct { int32_t kf, vf, order; uint64_t pages, staging; } cases[] = {
        {KVP_FORMAT_FP16, KVP_FORMAT_FP16, KVP_K_ORDER_TOKEN_MAJOR, 10, 0},
        {KVP_FORMAT_FP32, KVP_FORMAT_FP8_E4M3, KVP_K_ORDER_DIM_MAJOR, 3, 0},
        {KVP_FORMAT_INT8, KVP_FORMAT_INT4, KVP_K_ORDER_TOKEN_MAJOR, 7, 5},
        {KVP_FORMAT_INT4, KVP_FORMAT_BF16, KVP_K_ORDER_DIM_MAJOR, 1, 2},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        kvp_store_t *s = make_store(2, 2, 64, 16, cases[i].kf, cases[i].vf, cases[i].order,
                                    cases[i].pages, cases[i].staging);
        kvp_store_info_t info;
        memset(&info, 0xa5, sizeof info);
        info.struct_size = sizeof info;
        assert_int_equal(kvp_store_info(s, &info), KVP_OK);
        assert_int_equal(info.struct_size, sizeof info);
        assert_int_equal(info.backend, KVP_BACKEND_CPU);
        assert_int_equal(info.device, -1);
        assert_int_equal(info.k_order, cases[i].order);
        assert_int_equal(info.num_pages, (int32_t)cases[i].pages);
        kvp_layout_t lay = {.struct_size = sizeof lay};
        assert_int_equal(kvp_layout_compute(2, 2, 64, 16, cases[i].kf, cases[i].vf, &lay, NULL, 0),
                         KVP_OK);
        /* staging pages exist only in layouts that need them */
        uint64_t staging = lay.needs_staging ? cases[i].staging : 0;
        assert_int_equal(info.num_staging, (int32_t)staging);
        uint64_t want = 0;
        assert_int_equal(kvp_arena_bytes(&lay, cases[i].pages, staging, &want, NULL, 0), KVP_OK);
        assert_int_equal(info.arena_bytes, want);
        assert_non_null(info.arena);
        assert_int_equal((uintptr_t)info.arena % KVP_ARENA_ALIGN, 0);
        /* the arena is the regions' memory */
        kvp_region_t r = {.struct_size = sizeof r};
        assert_int_equal(kvp_store_region(s, 0, KVP_REGION_K, &r), KVP_OK);
        assert_true((uint8_t *)r.base >= (uint8_t *)info.arena &&
                    (uint8_t *)r.base < (uint8_t *)info.arena + info.arena_bytes);
        /* a struct_size too small (or none) is refused, nothing written */
        kvp_store_info_t small;
        memset(&small, 0xa5, sizeof small);
        small.struct_size = 0;
        assert_int_equal(kvp_store_info(s, &small), KVP_EINVAL);
        assert_non_null(strstr(kvp_store_last_error(s), "struct_size"));
        assert_int_equal(small.backend, (int32_t)0xa5a5a5a5);
        small.struct_size = offsetof(kvp_store_info_t, arena_bytes);
        assert_int_equal(kvp_store_info(s, &small), KVP_EINVAL);
        assert_int_equal(small.backend, (int32_t)0xa5a5a5a5);
        assert_int_equal(kvp_store_info(s, NULL), KVP_EINVAL);
        kvp_store_destroy(s);
    }
    kvp_store_info_t info = {.struct_size = sizeof info};
    assert_int_equal(kvp_store_info(NULL, &info), KVP_EINVAL);
}

/* kvp_store_nonfinite_count(): a status, the count through a pointer that
 * must be given; it grows when a NaN or an infinity is appended. */
static void test_nonfinite_count(void **state) {
    (void)state;
    const int32_t H = 2, D = 64, P = 16;
    static const int32_t fmts[] = {KVP_FORMAT_FP16, KVP_FORMAT_FP8_E4M3, KVP_FORMAT_INT8};
    for (size_t f = 0; f < sizeof fmts / sizeof *fmts; f++) {
        kvp_store_t *s = make_store(1, H, D, P, fmts[f], fmts[f], 0, 4, 2);
        assert_int_equal(kvp_store_nonfinite_count(s, NULL), KVP_EINVAL);
        assert_non_null(strstr(kvp_store_last_error(s), "count"));
        uint64_t n = 1234;
        assert_int_equal(kvp_store_nonfinite_count(s, &n), KVP_OK);
        assert_int_equal(n, 0);
        float k[2 * 2 * 64], v[2 * 2 * 64];
        for (int i = 0; i < 2 * H * D; i++) k[i] = v[i] = (float)(i % 17) * 0.25f - 2.0f;
        /* two rows into the staging page (int8 keys) or a pool page */
        kvp_layout_t lay = {.struct_size = sizeof lay};
        assert_int_equal(kvp_store_layout(s, &lay), KVP_OK);
        int64_t base = lay.needs_staging ? 4 * P : 0;
        int64_t slots[2] = {base, base + 1};
        kvp_append_params_t a;
        kvp_append_params_init(&a);
        a.rows = 2;
        a.dtype = KVP_FORMAT_FP32;
        a.k = k;
        a.v = v;
        a.slots = slots;
        assert_int_equal(kvp_store_append(s, &a), KVP_OK);
        assert_int_equal(kvp_store_nonfinite_count(s, &n), KVP_OK);
        assert_int_equal(n, 0);
        k[5] = NAN;
        slots[0] = base + 2;
        slots[1] = base + 3;
        assert_int_equal(kvp_store_append(s, &a), KVP_OK);
        uint64_t after_nan = 0;
        assert_int_equal(kvp_store_nonfinite_count(s, &after_nan), KVP_OK);
        assert_true(after_nan > n);
        v[H * D + 7] = NAN;
        slots[0] = base + 4;
        slots[1] = base + 5;
        assert_int_equal(kvp_store_append(s, &a), KVP_OK);
        uint64_t after_two = 0;
        assert_int_equal(kvp_store_nonfinite_count(s, &after_two), KVP_OK);
        assert_true(after_two > after_nan);
        kvp_store_destroy(s);
    }
}

/* The detail text: "" until a call fails, kept (sticky) through calls that
 * succeed, replaced by the next failure; "NULL handle" for NULL. */
static void test_last_error_is_sticky(void **state) {
    (void)state;
    assert_string_equal(kvp_store_last_error(NULL), "NULL handle");
    kvp_store_t *s = make_store(2, 1, 64, 4, KVP_FORMAT_FP16, KVP_FORMAT_FP16, 0, 4, 0);
    assert_string_equal(kvp_store_last_error(s), "");
    float k[64] = {0}, v[64] = {0}, out[64];
    int64_t slot = 1;
    kvp_append_params_t a;
    kvp_append_params_init(&a);
    a.rows = 1;
    a.dtype = KVP_FORMAT_FP32;
    a.k = k;
    a.v = v;
    a.slots = &slot;
    assert_int_equal(kvp_store_append(s, &a), KVP_OK);
    assert_string_equal(kvp_store_last_error(s), "");
    a.layer = 5;
    assert_int_equal(kvp_store_append(s, &a), KVP_EINVAL);
    char first[KVP_ERR_SIZE];
    snprintf(first, sizeof first, "%s", kvp_store_last_error(s));
    assert_non_null(strstr(first, "layer"));
    /* successful calls leave it as it was */
    a.layer = 1;
    assert_int_equal(kvp_store_append(s, &a), KVP_OK);
    assert_int_equal(kvp_store_read(s, 1, 0, 1, 1, out, NULL), KVP_OK);
    kvp_page_op_t copy = {KVP_OP_COPY, 0, 1, 0, -1};
    assert_int_equal(kvp_store_apply_ops(s, &copy, 1), KVP_OK);
    (void)info_of(s);
    assert_int_equal(kvp_store_synchronize(s), KVP_OK);
    assert_string_equal(kvp_store_last_error(s), first);
    /* the next failure replaces it */
    assert_int_equal(kvp_store_read(s, 0, 9, 0, 1, out, NULL), KVP_EINVAL);
    assert_string_not_equal(kvp_store_last_error(s), first);
    assert_true(strlen(kvp_store_last_error(s)) > 0);
    kvp_store_destroy(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create_and_sizes),
        cmocka_unit_test(test_create_bad_params),
        cmocka_unit_test(test_region_strides_hnd),
        cmocka_unit_test(test_append_seal_matches_quantize),
        cmocka_unit_test(test_append_strides_and_skips),
        cmocka_unit_test(test_page_ops),
        cmocka_unit_test(test_fp8_scales),
        cmocka_unit_test(test_append_bad_input),
        cmocka_unit_test(test_page_io),
        cmocka_unit_test(test_store_info),
        cmocka_unit_test(test_nonfinite_count),
        cmocka_unit_test(test_last_error_is_sticky),
    };
    return cmocka_run_group_tests_name("store", tests, NULL, NULL);
}
