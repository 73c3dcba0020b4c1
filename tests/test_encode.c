/*
 * The append path's encoders (lib/cpu/encode.c and each ISA's primitives)
 * against the reference codec (lib/blockfmt.c): every primitive element for
 * element over special values (ties, subnormals, overflow, NaN payloads,
 * infinities, signed zeros), and whole blocks byte for byte, in every format,
 * order, head_dim and page size, for every ISA this CPU runs.
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
#include "numeric.h"
#include "testutil.h"
#include "blockfmt.h"
#include "cpu/cpu.h"

#include <stdlib.h>
#include <string.h>

/* ---- inputs ------------------------------------------------------------------------- */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void) { /* splitmix64, high half */
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (uint32_t)((z ^ (z >> 31)) >> 32);
}
static float bits(uint32_t u) { return kvp__bits_f32(u); }
static float unif(float lo, float hi) { return lo + (hi - lo) * (float)(rnd() >> 8) * (1.0f / 16777216.0f); }

/* A value of one of several kinds: ordinary, tiny, huge, special. */
static float any_value(void) {
    switch (rnd() % 16) {
    case 0: return bits(rnd());                          /* any bits: NaNs with payloads too */
    case 1: return bits(0x7F800000u | (rnd() & 0x807FFFFFu)); /* Inf or NaN, either sign */
    case 2: return (rnd() & 1) ? 0.0f : -0.0f;
    case 8: return (rnd() & 1) ? INFINITY : -INFINITY;
    case 3: return bits(rnd() & 0x807FFFFFu);            /* f32 subnormal */
    case 4: return unif(-1e-4f, 1e-4f);                  /* f16 subnormal range */
    case 5: return unif(-70000.0f, 70000.0f);            /* around the f16 limit */
    case 6: return unif(-500.0f, 500.0f);                /* around the e4m3 limit */
    default: return unif(-4.0f, 4.0f);
    }
}

/* Each distinct encoder table this CPU runs (portable first). */
static int encoders(const kvp__enc_prims **out) {
    int n = 0;
    for (int32_t isa = KVP_ISA_PORTABLE; isa < KVP_ISA_COUNT; isa++) {
        if (!kvp_isa_supported(isa)) continue;
        const kvp__enc_prims *e = kvp__pick_enc(isa);
        bool seen = false;
        for (int i = 0; i < n; i++) seen |= out[i] == e;
        if (!seen) out[n++] = e;
    }
    return n;
}

/* ---- conversions -------------------------------------------------------------------- */

#define NCONV 4099 /* not a multiple of any vector width: the tails run too */

static void check_conversions(const kvp__enc_prims *e, const float *x, int n) {
    uint16_t y[NCONV];
    uint8_t q[NCONV];
    e->to_f16(x, y, n);
    for (int i = 0; i < n; i++)
        if (y[i] != kvp__f32_to_f16(x[i]))
            fail_msg("%s to_f16(0x%08x) = 0x%04x, reference 0x%04x", e->name, kvp__f32_bits(x[i]), y[i],
                     kvp__f32_to_f16(x[i]));
    e->to_bf16(x, y, n);
    for (int i = 0; i < n; i++)
        if (y[i] != kvp__f32_to_bf16(x[i]))
            fail_msg("%s to_bf16(0x%08x) = 0x%04x, reference 0x%04x", e->name, kvp__f32_bits(x[i]), y[i],
                     kvp__f32_to_bf16(x[i]));
    static const float invs[] = {1.0f, 0.37f, 8.0f};
    for (size_t k = 0; k < sizeof invs / sizeof *invs; k++) {
        e->to_e4m3(x, q, n, invs[k]);
        for (int i = 0; i < n; i++)
            if (q[i] != kvp__f32_to_e4m3(x[i] * invs[k]))
                fail_msg("%s to_e4m3(0x%08x * %g) = 0x%02x, reference 0x%02x", e->name, kvp__f32_bits(x[i]),
                         (double)invs[k], q[i], kvp__f32_to_e4m3(x[i] * invs[k]));
    }
    int bad = 0;
    for (int i = 0; i < n; i++) bad += !isfinite(x[i]);
    assert_int_equal(e->nonfinite(x, n), bad);
}

static void test_conversions(void **state) {
    (void)state;
    const kvp__enc_prims *es[KVP_ISA_COUNT];
    int ne = encoders(es);
    float *x = malloc(NCONV * sizeof *x);
    assert_non_null(x);
    for (int k = 0; k < ne; k++) {
        /* every fp16 value, its neighbours and the exact ties between halves */
        for (uint32_t h0 = 0; h0 < 65536; h0 += 1024) {
            int n = 0;
            for (uint32_t h = h0; h < h0 + 1024 && n + 4 <= NCONV; h++) {
                float f = kvp__f16_to_f32((uint16_t)h), g = kvp__f16_to_f32((uint16_t)(h + 1));
                x[n++] = f;
                x[n++] = nextafterf(f, INFINITY);
                x[n++] = nextafterf(f, -INFINITY);
                x[n++] = isfinite(f) && isfinite(g) ? (float)(((double)f + (double)g) / 2) : f;
            }
            check_conversions(es[k], x, n);
        }
        /* bf16 and e4m3 ties: values with the low bits exactly half way */
        for (int n = 0; n < NCONV; n++)
            x[n] = bits((rnd() & 0xFFFF0000u) | (n % 3 == 0 ? 0x8000u : n % 3 == 1 ? 0x80000u : (rnd() & 0xFFFFu)));
        check_conversions(es[k], x, NCONV);
        for (int rep = 0; rep < 64; rep++) {
            for (int n = 0; n < NCONV; n++) x[n] = any_value();
            check_conversions(es[k], x, NCONV - rep);
        }
        /* fp16 -> fp32: every half, its NaNs' bits kept as the reference keeps them */
        uint16_t h[1024];
        float y[1024];
        for (uint32_t h0 = 0; h0 < 65536; h0 += 1024) {
            for (int i = 0; i < 1024; i++) h[i] = (uint16_t)(h0 + (uint32_t)i);
            es[k]->from_f16(h, y, 1021);
            for (int i = 0; i < 1021; i++)
                if (kvp__f32_bits(y[i]) != kvp__f32_bits(kvp__f16_to_f32(h[i])))
                    fail_msg("%s from_f16(0x%04x) = 0x%08x, reference 0x%08x", es[k]->name, h[i],
                             kvp__f32_bits(y[i]), kvp__f32_bits(kvp__f16_to_f32(h[i])));
        }
    }
    free(x);
}

/* ---- ranges and codes ---------------------------------------------------------------- */

static void test_ranges_and_codes(void **state) {
    (void)state;
    const kvp__enc_prims *es[KVP_ISA_COUNT];
    int ne = encoders(es);
    enum { ROWS = 37, COLS = 45 };
    static float x[ROWS * COLS];
    for (int k = 0; k < ne; k++) {
        const kvp__enc_prims *e = es[k];
        for (int rep = 0; rep < 200; rep++) {
            int special = rep % 4; /* 0: none, 1: some, 2: many, 3: all NaN/Inf in some columns */
            for (int i = 0; i < ROWS * COLS; i++) {
                x[i] = unif(-3.0f, 3.0f) * (rep % 7 == 0 ? 1e-30f : 1.0f);
                if ((special == 1 && rnd() % 50 == 0) || (special == 2 && rnd() % 4 == 0)) x[i] = any_value();
                if (special == 3 && i % COLS < 3) x[i] = (rnd() & 1) ? NAN : -INFINITY;
            }
            int n = 1 + (int)(rnd() % COLS), rows = 1 + (int)(rnd() % ROWS);
            /* columns */
            float lo[COLS], hi[COLS], rlo[COLS], rhi[COLS];
            e->minmax_cols(x, COLS, rows, n, lo, hi);
            kvp__enc_portable.minmax_cols(x, COLS, rows, n, rlo, rhi);
            for (int d = 0; d < n; d++) {
                assert_true(lo[d] == rlo[d]); /* a zero's sign may differ: encode.c fixes it */
                assert_true(hi[d] == rhi[d]);
            }
            /* one row */
            float a, b, ra, rb;
            e->minmax(x, n, &a, &b);
            kvp__enc_portable.minmax(x, n, &ra, &rb);
            assert_true(a == ra && b == rb);
            float am = e->absmax(x, n);
            assert_true(am == kvp__enc_portable.absmax(x, n));
            /* codes, with parameters as the encoders make them and odd ones */
            float mn[COLS], inv[COLS], lv[COLS];
            uint8_t c[COLS], rc[COLS];
            int8_t s[COLS], rs[COLS];
            for (int d = 0; d < n; d++) {
                int levels = rnd() % 3 == 0 ? 255 : 15;
                kvp__asym q = kvp__asym_make(rlo[d], rhi[d], levels);
                mn[d] = q.min;
                inv[d] = rep % 5 == 0 ? 0.0f : q.inv;
                lv[d] = (float)levels;
            }
            const float *row = x + (size_t)(rnd() % (unsigned)rows) * COLS;
            e->asym_codes(row, n, mn, inv, lv, c);
            kvp__enc_portable.asym_codes(row, n, mn, inv, lv, rc);
            assert_memory_equal(c, rc, (size_t)n);
            e->asym_codes1(row, n, mn[0], inv[0], lv[0], c);
            kvp__enc_portable.asym_codes1(row, n, mn[0], inv[0], lv[0], rc);
            assert_memory_equal(c, rc, (size_t)n);
            float sinv = rep % 5 == 0 ? 0.0f : kvp__sym8_inv(kvp__sym8_scale16(am));
            e->sym8_codes(row, n, sinv, s);
            kvp__enc_portable.sym8_codes(row, n, sinv, rs);
            assert_memory_equal(s, rs, (size_t)n);
        }
    }
}

/* The portable primitives are the reference's functions themselves: check
 * them once against it, so the comparisons above are anchored. */
static void test_portable_is_reference(void **state) {
    (void)state;
    float x[64];
    for (int i = 0; i < 64; i++) x[i] = any_value();
    uint8_t c[64];
    kvp__asym a = kvp__asym_make(-1.0f, 2.0f, 15);
    kvp__enc_portable.asym_codes1(x, 64, a.min, a.inv, 15.0f, c);
    for (int i = 0; i < 64; i++) assert_int_equal(c[i], kvp__asym_code(&a, x[i], 15));
    int8_t s[64];
    kvp__enc_portable.sym8_codes(x, 64, 3.0f, s);
    for (int i = 0; i < 64; i++) assert_int_equal(s[i], kvp__sym8_code(x[i], 3.0f));
}

/* ---- whole blocks ---------------------------------------------------------------------- */

/* Fill rows [P][D] (stride D + 3) with data of the given kind. */
static void fill_rows(float *x, size_t stride, int P, int D, int kind) {
    for (int t = 0; t < P; t++)
        for (int d = 0; d < D; d++) {
            float v;
            switch (kind) {
            case 0: v = unif(-2.0f, 2.0f) * (d % 7 == 3 ? 40.0f : 1.0f); break; /* outlier channels */
            case 1: v = rnd() % 9 == 0 ? any_value() : unif(-2.0f, 2.0f); break;
            case 2: v = (rnd() & 1) ? 0.0f : -0.0f; break;                    /* signed zeros only */
            case 3: v = d % 3 == 0 ? 1.5f : (d % 3 == 1 ? ((rnd() & 1) ? 0.0f : -0.0f) : unif(0.0f, 1.0f)); break;
            default: v = unif(-1e-6f, 1e-6f); break;                          /* f16 subnormals */
            }
            x[(size_t)t * stride + (size_t)d] = v;
        }
}

static void test_blocks_match_reference(void **state) {
    (void)state;
    const kvp__enc_prims *es[KVP_ISA_COUNT];
    int ne = encoders(es);
    static const int dims[] = {8, 24, 40, 64, 128, 136};
    static const int pages[] = {2, 6, 10, 16, 32};
    static const int32_t fmts[] = {KVP_FORMAT_FP32, KVP_FORMAT_FP16, KVP_FORMAT_BF16, KVP_FORMAT_FP8_E4M3,
                                   KVP_FORMAT_INT8, KVP_FORMAT_INT4};
    const size_t maxd = 136, stride = maxd + 3;
    float *x = malloc(32 * stride * sizeof *x);
    uint8_t *ref = malloc(1 << 16), *got = malloc(1 << 16), *pre = malloc(1 << 16);
    assert_true(x && ref && got && pre);
    int blocks = 0;
    for (size_t di = 0; di < sizeof dims / sizeof *dims; di++)
        for (size_t pi = 0; pi < sizeof pages / sizeof *pages; pi++)
            for (size_t fi = 0; fi < sizeof fmts / sizeof *fmts; fi++)
                for (int side = 0; side < 2; side++)
                    for (int order = 0; order < 2; order++) {
                        const int D = dims[di], P = pages[pi];
                        const int32_t fmt = fmts[fi];
                        bool plain = fmt <= KVP_FORMAT_FP8_E4M3;
                        if (order == 1 && !(plain && side == 1)) continue; /* order: plain keys only */
                        kvp__blockfmt f = kvp__blockfmt_make(fmt, side, order ? KVP_K_ORDER_DIM_MAJOR : KVP_K_ORDER_TOKEN_MAJOR,
                                                             P, D);
                        size_t bytes = (size_t)kvp__round_up_u64(kvp__block_used_bytes(&f), KVP_BLOCK_ALIGN);
                        assert_true(bytes <= (1u << 16));
                        for (int kind = 0; kind < 5; kind++) {
                            fill_rows(x, stride, P, D, kind);
                            /* a whole page, then (not int keys: per page) a part of one */
                            int t0 = 0, n = P;
                            for (int part = 0; part < 2; part++) {
                                if (part == 1) {
                                    if (side == 1 && !plain) break;
                                    t0 = (int)(rnd() % (unsigned)P);
                                    n = 1 + (int)(rnd() % (unsigned)(P - t0));
                                }
                                /* both start from the same garbage: the bytes outside
                                 * [t0, t0+n) must stay as they were */
                                for (size_t i = 0; i < bytes; i++) pre[i] = (uint8_t)rnd();
                                memcpy(ref, pre, bytes);
                                float fp8 = 0.75f;
                                uint64_t rbad = kvp__block_encode(&f, ref, t0, n, x, stride, fp8);
                                for (int k = 0; k < ne; k++) {
                                    memcpy(got, pre, bytes);
                                    uint64_t gbad = kvp__encode(es[k], &f, got, t0, n, x, stride, fp8);
                                    if (gbad != rbad || memcmp(got, ref, bytes) != 0) {
                                        size_t at = 0;
                                        while (at < bytes && got[at] == ref[at]) at++;
                                        fail_msg("%s: format %d %s%s D %d P %d data %d tokens %d+%d: byte %zu "
                                                 "0x%02x, reference 0x%02x; non-finite %llu vs %llu",
                                                 es[k]->name, (int)fmt, side ? "keys" : "values",
                                                 order ? " dim-major" : "", D, P, kind, t0, n, at,
                                                 at < bytes ? got[at] : 0, at < bytes ? ref[at] : 0,
                                                 (unsigned long long)gbad, (unsigned long long)rbad);
                                    }
                                    blocks++;
                                }
                            }
                        }
                    }
    assert_true(blocks > 1000);
    free(x);
    free(ref);
    free(got);
    free(pre);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_portable_is_reference),
        cmocka_unit_test(test_conversions),
        cmocka_unit_test(test_ranges_and_codes),
        cmocka_unit_test(test_blocks_match_reference),
    };
    return kvt_run_group("encode", tests, sizeof tests / sizeof tests[0]);
}
