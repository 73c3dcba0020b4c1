/*
 * Formats: number conversions (rounding, saturation, NaN/Inf), the block
 * codecs through kvp_quantize / kvp_dequantize (round-trip error per format,
 * every head_dim and page size), and the non-finite rules of docs/formats.md.
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
#include "kvpage_plan.h"
#include "numeric.h"
#include "testutil.h"
#include "../bench/kvdist.h"
#include "blockfmt.h"

#include <stdlib.h>
#include <string.h>

/* ---- conversions ------------------------------------------------------------------------ */

static void test_fp16_conversion(void **state) {
    (void)state;
    /* every half round-trips exactly (NaNs stay NaN) */
    for (uint32_t h = 0; h < 65536; h++) {
        float f = kvp__f16_to_f32((uint16_t)h);
        uint16_t back = kvp__f32_to_f16(f);
        if (isnan(f)) assert_true((back & 0x7C00) == 0x7C00 && (back & 0x3FF) != 0);
        else assert_int_equal(back, h);
    }
    /* ties to even, subnormals, overflow */
    assert_int_equal(kvp__f32_to_f16(1.0f + 1.0f / 2048.0f), 0x3C00);            /* tie -> even */
    assert_int_equal(kvp__f32_to_f16(1.0f + 3.0f / 2048.0f), 0x3C02);            /* tie -> even up */
    assert_int_equal(kvp__f32_to_f16(65504.0f), 0x7BFF);
    assert_int_equal(kvp__f32_to_f16(65519.0f), 0x7BFF);
    assert_int_equal(kvp__f32_to_f16(65520.0f), 0x7C00);                         /* to Inf */
    assert_int_equal(kvp__f32_to_f16(-1e9f), 0xFC00);
    assert_int_equal(kvp__f32_to_f16(5.9604644775390625e-8f), 0x0001);           /* smallest subnormal */
    assert_int_equal(kvp__f32_to_f16(2.98023223876953125e-8f), 0x0000);          /* half of it: even */
    assert_int_equal(kvp__f32_to_f16(-0.0f), 0x8000);
}

static void test_bf16_conversion(void **state) {
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = kvp__bf16_to_f32((uint16_t)h);
        uint16_t back = kvp__f32_to_bf16(f);
        if (isnan(f)) assert_true(isnan(kvp__bf16_to_f32(back)));
        else assert_int_equal(back, h);
    }
    assert_int_equal(kvp__f32_to_bf16(1.0f + 1.0f / 256.0f), 0x3F80); /* tie -> even */
    assert_int_equal(kvp__f32_to_bf16(1.0f + 3.0f / 256.0f), 0x3F82);
}

static void test_e4m3_conversion(void **state) {
    (void)state;
    for (uint32_t c = 0; c < 256; c++) {
        float f = kvp__e4m3_to_f32((uint8_t)c);
        if ((c & 0x7F) == 0x7F) {
            assert_true(isnan(f));
            assert_int_equal(kvp__f32_to_e4m3(f), 0); /* NaN -> 0, never stored */
        } else if (c == 0x80) {
            assert_int_equal(kvp__f32_to_e4m3(f), 0x80); /* -0 */
        } else {
            assert_int_equal(kvp__f32_to_e4m3(f), c);
        }
    }
    assert_true(kvp__e4m3_to_f32(0x7E) == 448.0f);
    assert_int_equal(kvp__f32_to_e4m3(1e6f), 0x7E);       /* saturate */
    assert_int_equal(kvp__f32_to_e4m3(-INFINITY), 0xFE);
    assert_int_equal(kvp__f32_to_e4m3(464.0f), 0x7E);      /* beyond the top: saturate, not NaN */
    assert_int_equal(kvp__f32_to_e4m3(1.0625f), 0x38);     /* tie between 1.0 and 1.125 -> even */
    assert_int_equal(kvp__f32_to_e4m3(1.1875f), 0x3A);     /* tie -> even (1.25) */
    assert_int_equal(kvp__f32_to_e4m3(0.0009765625f), 0);  /* 2^-10: tie at half a step -> 0 */
}

/* ---- block round trips ---------------------------------------------------------------------- */

static kvp_quant_desc_t desc_of(int32_t f, int32_t is_value, int32_t order, int32_t P, int32_t D,
                                int32_t heads) {
    kvp_quant_desc_t d;
    memset(&d, 0, sizeof d);
    d.struct_size = sizeof d;
    d.format = f;
    d.is_value = is_value;
    d.k_order = order;
    d.page_size = P;
    d.head_dim = D;
    d.heads = heads;
    d.dtype = KVP_FORMAT_FP32;
    d.fp8_scale = 0.2f; /* 448 * 0.2 = 89.6: above the outlier keys, no saturation */
    return d;
}

/* int4 values in the rotated basis: the rounding bound of each rotated
 * element (its 32-wide group's step / 2), carried back through the
 * rotation's block (every element of it adds into channel d with weight
 * +-2^-ceil(k/2)), plus float rounding in the two transforms. */
static double allowed_error_rotated(const float *row, int32_t D, int32_t d) {
    float r[KVP_MAX_HEAD_DIM];
    memcpy(r, row, (size_t)D * sizeof(float));
    kvp__rot_forward(r, D);
    double norm = 0.0;
    for (int32_t i = 0; i < D; i++) norm += fabs((double)row[i]);
    int32_t base = 0, B = 0;
    while (base + (B = kvp__rot_block(D, base)) <= d) base += B;
    double sum = 0.0;
    for (int32_t i = base; i < base + B; i++) {
        int32_t g0 = i / 32 * 32, g1 = g0 + 32 < D ? g0 + 32 : D;
        double lo = INFINITY, hi = -INFINITY;
        for (int32_t k = g0; k < g1; k++) {
            lo = fmin(lo, r[k]);
            hi = fmax(hi, r[k]);
        }
        sum += (hi - lo) / 15.0 * 0.5 * 1.002 + fabs(lo) * 1e-3;
    }
    return sum * kvp__rot_scale(B, 1) + norm * 1e-6;
}

/* Largest allowed |x - dequant(quant(x))| of element (t, h, d) of a page. */
static double allowed_error(int32_t f, int32_t is_value, const float *x, int32_t P, int32_t H,
                            int32_t D, int32_t t, int32_t h, int32_t d, float fp8_scale) {
    float v = x[((size_t)t * (size_t)H + (size_t)h) * (size_t)D + (size_t)d];
    if (is_value && f == KVP_FORMAT_INT4)
        return allowed_error_rotated(x + ((size_t)t * (size_t)H + (size_t)h) * (size_t)D, D, d);
    double lo = INFINITY, hi = -INFINITY, amax = 0.0;
    switch (f) {
    case KVP_FORMAT_FP32: return 0.0;
    case KVP_FORMAT_FP16: return fabs(v) * (1.0 / 2048.0) + 6e-8;
    case KVP_FORMAT_BF16: return fabs(v) * (1.0 / 256.0) + 1e-38;
    case KVP_FORMAT_FP8_E4M3: return fabs(v) * (1.0 / 16.0) + fp8_scale * 0.001953125;
    default: break;
    }
    int levels = f == KVP_FORMAT_INT8 ? 255 : 15;
    if (!is_value) { /* per channel over the page */
        for (int32_t i = 0; i < P; i++) {
            double y = x[((size_t)i * (size_t)H + (size_t)h) * (size_t)D + (size_t)d];
            lo = fmin(lo, y);
            hi = fmax(hi, y);
        }
        return (hi - lo) / levels * 0.5 * 1.002 + fabs(lo) * 1e-3;
    }
    if (f == KVP_FORMAT_INT8) { /* per token, symmetric */
        for (int32_t i = 0; i < D; i++)
            amax = fmax(amax, fabs(x[((size_t)t * (size_t)H + (size_t)h) * (size_t)D + (size_t)i]));
        return amax / 127.0 * 0.5 * 1.002;
    }
    int32_t g0 = d / 32 * 32, g1 = g0 + 32 < D ? g0 + 32 : D; /* per token, 32-wide group */
    for (int32_t i = g0; i < g1; i++) {
        double y = x[((size_t)t * (size_t)H + (size_t)h) * (size_t)D + (size_t)i];
        lo = fmin(lo, y);
        hi = fmax(hi, y);
    }
    return (hi - lo) / 15.0 * 0.5 * 1.002 + fabs(lo) * 1e-3;
}

static void round_trip(int32_t f, int32_t is_value, int32_t order, int32_t P, int32_t D, kvd_rng *rng) {
    const int32_t H = 3, pages = 2;
    kvp_quant_desc_t q = desc_of(f, is_value, order, P, D, H);
    uint64_t block = 0;
    char err[KVP_ERR_SIZE];
    assert_int_equal(kvp_quant_block_bytes(&q, &block, err, sizeof err), KVP_OK);
    /* the same bytes the store's layout counts */
    kvp_layout_t l = {.struct_size = sizeof l};
    assert_int_equal(kvp_layout_compute(1, H, D, P, is_value ? KVP_FORMAT_FP16 : f,
                                        is_value ? f : KVP_FORMAT_FP16, &l, NULL, 0), KVP_OK);
    assert_int_equal(block, is_value ? l.v_block_bytes : l.k_block_bytes);
    size_t n = (size_t)pages * (size_t)P * (size_t)H * (size_t)D;
    float *x = malloc(n * 4), *y = malloc(n * 4);
    uint8_t *b = malloc((size_t)pages * (size_t)H * block);
    kvd_keys keys;
    assert_int_equal(kvd_keys_init(&keys, rng, H, D), 0);
    kvd_fill_keys(&keys, rng, (size_t)pages * (size_t)P, x); /* outliers + offsets: the hard case */
    /* every byte of a block is written, padding included: the same bytes
     * whatever the buffer held */
    size_t nb = (size_t)pages * (size_t)H * block;
    uint8_t *b2 = malloc(nb);
    assert_non_null(b2);
    memset(b, 0x00, nb);
    memset(b2, 0xA5, nb);
    assert_int_equal(kvp_quantize(&q, x, pages, b2, err, sizeof err), KVP_OK);
    assert_int_equal(kvp_quantize(&q, x, pages, b, err, sizeof err), KVP_OK);
    assert_memory_equal(b, b2, nb);
    free(b2);
    memset(y, 0xFF, n * 4);
    assert_int_equal(kvp_dequantize(&q, b, pages, y, err, sizeof err), KVP_OK);
    for (int32_t pg = 0; pg < pages; pg++)
        for (int32_t t = 0; t < P; t++)
            for (int32_t h = 0; h < H; h++)
                for (int32_t d = 0; d < D; d++) {
                    size_t i = (((size_t)pg * (size_t)P + (size_t)t) * (size_t)H + (size_t)h) * (size_t)D +
                               (size_t)d;
                    double allow = allowed_error(f, is_value, x + (size_t)pg * (size_t)P * (size_t)H * (size_t)D,
                                                 P, H, D, t, h, d, q.fp8_scale);
                    if (!(fabs((double)y[i] - (double)x[i]) <= allow))
                        print_error("%s %s P=%d D=%d (t%d h%d d%d): %g vs %g (allowed %g)\n",
                                    kvp_format_name(f), is_value ? "V" : "K", (int)P, (int)D, (int)t,
                                    (int)h, (int)d, (double)y[i], (double)x[i], allow);
                    assert_true(fabs((double)y[i] - (double)x[i]) <= allow);
                }
    kvd_keys_free(&keys);
    free(x);
    free(y);
    free(b);
}

static void test_round_trip_all_formats(void **state) {
    (void)state;
    static const int32_t dims[] = {8, 64, 80, 96, 128, 256};
    static const int32_t pages[] = {1, 2, 8, 16, 32, 64};
    kvd_rng rng;
    kvd_seed(&rng, 11);
    for (int32_t f = 0; f < KVP_FORMAT_COUNT; f++)
        for (int32_t side = 0; side < 2; side++)
            for (size_t d = 0; d < sizeof dims / sizeof *dims; d++)
                for (size_t p = 0; p < sizeof pages / sizeof *pages; p++) {
                    if (kvp__format_is_int4(f) && !side && pages[p] % 2) continue;
                    round_trip(f, side, (int32_t)(p % 2), pages[p], dims[d], &rng);
                }
}

/* fp16 and bf16 input tensors give the same blocks as their fp32 values. */
static void test_input_dtypes(void **state) {
    (void)state;
    const int32_t P = 16, D = 64, H = 2;
    size_t n = (size_t)P * H * D;
    float *x = malloc(n * 4);
    uint16_t *h16 = malloc(n * 2);
    kvd_rng rng;
    kvd_seed(&rng, 3);
    kvd_fill_normal(&rng, n, x);
    for (int32_t dt = KVP_FORMAT_FP16; dt <= KVP_FORMAT_BF16; dt++) {
        for (size_t i = 0; i < n; i++) {
            h16[i] = dt == KVP_FORMAT_FP16 ? kvp__f32_to_f16(x[i]) : kvp__f32_to_bf16(x[i]);
            x[i] = dt == KVP_FORMAT_FP16 ? kvp__f16_to_f32(h16[i]) : kvp__bf16_to_f32(h16[i]);
        }
        kvp_quant_desc_t a = desc_of(KVP_FORMAT_INT8, 0, 0, P, D, H), b = a;
        b.dtype = dt;
        uint64_t block;
        assert_int_equal(kvp_quant_block_bytes(&a, &block, NULL, 0), KVP_OK);
        uint8_t *ba = malloc(block * H), *bb = malloc(block * H);
        memset(ba, 0, block * H);
        memset(bb, 0, block * H);
        assert_int_equal(kvp_quantize(&a, x, 1, ba, NULL, 0), KVP_OK);
        assert_int_equal(kvp_quantize(&b, h16, 1, bb, NULL, 0), KVP_OK);
        assert_memory_equal(ba, bb, block * H);
        /* dequantize to the 16-bit type: the fp32 result, rounded */
        float *y = malloc(n * 4);
        uint16_t *y16 = malloc(n * 2);
        assert_int_equal(kvp_dequantize(&a, ba, 1, y, NULL, 0), KVP_OK);
        assert_int_equal(kvp_dequantize(&b, ba, 1, y16, NULL, 0), KVP_OK);
        for (size_t i = 0; i < n; i++)
            assert_int_equal(y16[i], dt == KVP_FORMAT_FP16 ? kvp__f32_to_f16(y[i]) : kvp__f32_to_bf16(y[i]));
        free(ba);
        free(bb);
        free(y);
        free(y16);
    }
    free(x);
    free(h16);
}

/* ---- non-finite inputs ------------------------------------------------------------------------- */

/* One NaN / Inf in a page: every other channel's (keys) or token's (values)
 * scale is untouched; the element itself follows the format's rule. */
static void test_nonfinite_rules(void **state) {
    (void)state;
    const int32_t P = 16, D = 64, H = 1;
    size_t n = (size_t)P * D;
    float *x = malloc(n * 4), *bad = malloc(n * 4), *y = malloc(n * 4), *yb = malloc(n * 4);
    kvd_rng rng;
    kvd_seed(&rng, 17);
    kvd_fill_normal(&rng, n, x);
    static const float specials[] = {NAN, INFINITY, -INFINITY};
    for (int32_t f = KVP_FORMAT_FP8_E4M3; f < KVP_FORMAT_COUNT; f++)
        for (int32_t side = 0; side < 2; side++)
            for (int s = 0; s < 3; s++) {
                kvp_quant_desc_t q = desc_of(f, side, 0, P, D, H);
                uint64_t block;
                assert_int_equal(kvp_quant_block_bytes(&q, &block, NULL, 0), KVP_OK);
                uint8_t *b = calloc(1, block), *bb = calloc(1, block);
                memcpy(bad, x, n * 4);
                const int32_t t = 5, d = 37;
                bad[t * D + d] = specials[s];
                assert_int_equal(kvp_quantize(&q, x, 1, b, NULL, 0), KVP_OK);
                assert_int_equal(kvp_quantize(&q, bad, 1, bb, NULL, 0), KVP_OK);
                assert_int_equal(kvp_dequantize(&q, b, 1, y, NULL, 0), KVP_OK);
                assert_int_equal(kvp_dequantize(&q, bb, 1, yb, NULL, 0), KVP_OK);
                for (int32_t i = 0; i < P; i++)
                    for (int32_t j = 0; j < D; j++) {
                        size_t k = (size_t)i * D + (size_t)j;
                        assert_true(isfinite(yb[k])); /* nothing non-finite is stored */
                        bool same_scale_set = side ? (f == KVP_FORMAT_INT4_V1 ? i == t && j / 32 == d / 32 : i == t)
                                                   : j == d;
                        if (f == KVP_FORMAT_FP8_E4M3) same_scale_set = i == t && j == d;
                        if (!same_scale_set) assert_true(yb[k] == y[k]); /* untouched */
                    }
                float got = yb[t * D + d];
                if (side && f == KVP_FORMAT_INT4) { /* rotated values: counted as 0 */
                    assert_true(fabsf(got) <= 0.5f);
                } else if (s == 0) { /* NaN: the code nearest 0 */
                    assert_true(fabsf(got) <= fabsf(y[t * D + d]) + 1.0f);
                    if (f == KVP_FORMAT_FP8_E4M3 || (side && f == KVP_FORMAT_INT8)) assert_true(got == 0.0f);
                } else { /* +-Inf: the extreme of the range */
                    float ext = specials[s] > 0 ? -INFINITY : INFINITY;
                    for (int32_t i = 0; i < P; i++)
                        for (int32_t j = 0; j < D; j++) {
                            bool in = side ? (f == KVP_FORMAT_INT4_V1 ? i == t && j / 32 == d / 32 : i == t) : j == d;
                            if (f == KVP_FORMAT_FP8_E4M3) in = true;
                            if (!in) continue;
                            float v = yb[(size_t)i * D + (size_t)j];
                            ext = specials[s] > 0 ? fmaxf(ext, v) : fminf(ext, v);
                        }
                    assert_true(got == ext);
                }
                free(b);
                free(bb);
            }
    free(x);
    free(bad);
    free(y);
    free(yb);
}

/* A page with no finite value at all in a channel: scale 0, stored as 0. */
static void test_all_nan_channel(void **state) {
    (void)state;
    const int32_t P = 8, D = 8;
    float x[8 * 8], y[8 * 8];
    for (int i = 0; i < P * D; i++) x[i] = (i % D == 3) ? NAN : (float)i * 0.1f;
    kvp_quant_desc_t q = desc_of(KVP_FORMAT_INT8, 0, 0, P, D, 1);
    uint8_t b[512];
    assert_int_equal(kvp_quantize(&q, x, 1, b, NULL, 0), KVP_OK);
    assert_int_equal(kvp_dequantize(&q, b, 1, y, NULL, 0), KVP_OK);
    for (int t = 0; t < P; t++) assert_true(y[t * D + 3] == 0.0f);
    assert_true(fabsf(y[1] - 0.1f) < 0.01f);
}

/* ---- the rotated basis of int4 values ------------------------------------------------------------- */

/* docs/formats.md's definition, written out again: sign of channel d from
 * the hash, blocks from the set bits of D (largest first), y = 2^-floor(k/2)
 * * H_B * (signed x) with H_B[i][j] = (-1)^popcount(i & j), in double. */
static int doc_neg(uint32_t d) {
    uint32_t h = d * 0x9E3779B1u;
    h ^= h >> 15;
    h *= 0x2C1B3C6Du;
    h ^= h >> 12;
    return (int)(h >> 31);
}

static void doc_rotate(const float *x, int D, double *y) {
    int base = 0;
    for (int bit = 1 << 12; bit >= 1; bit >>= 1) {
        if (!(D & bit)) continue;
        int k = 0;
        while ((1 << k) < bit) k++;
        double scale = ldexp(1.0, -(k / 2));
        for (int i = 0; i < bit; i++) {
            double acc = 0.0;
            for (int j = 0; j < bit; j++) {
                double v = isfinite(x[base + j]) ? (double)x[base + j] : 0.0;
                if (doc_neg((uint32_t)(base + j))) v = -v;
                acc += (__builtin_popcount((unsigned)(i & j)) & 1) ? -v : v;
            }
            y[base + i] = acc * scale;
        }
        base += bit;
    }
}

/* kvp__rot_forward is the documented map (to fp32 rounding), its inverse
 * returns the row, the sign pattern is about half -1, a channel of large
 * values is spread over its block, and non-finite inputs count as 0. */
static void test_value_rotation(void **state) {
    (void)state;
    static const int dims[] = {8, 16, 24, 64, 80, 96, 128, 136, 256, 1024};
    kvd_rng rng;
    kvd_seed(&rng, 23);
    float x[KVP_MAX_HEAD_DIM], r[KVP_MAX_HEAD_DIM];
    double y[KVP_MAX_HEAD_DIM];
    for (size_t di = 0; di < sizeof dims / sizeof *dims; di++) {
        const int D = dims[di];
        for (int trial = 0; trial < 4; trial++) {
            kvd_fill_normal(&rng, (size_t)D, x);
            if (trial == 1) x[D / 3] = 300.0f; /* one wide channel */
            if (trial == 2) x[D / 2] = NAN, x[1] = -INFINITY;
            memcpy(r, x, sizeof(float) * (size_t)D);
            kvp__rot_forward(r, D);
            doc_rotate(x, D, y);
            double norm = 0.0;
            for (int d = 0; d < D; d++) norm += y[d] * y[d];
            norm = sqrt(norm);
            for (int d = 0; d < D; d++) {
                if (!(fabs((double)r[d] - y[d]) <= 1e-6 * norm)) print_error("D %d channel %d: %g vs %g\n", D, d, (double)r[d], y[d]);
                assert_true(fabs((double)r[d] - y[d]) <= 1e-6 * norm);
            }
            if (trial == 1 && D >= 64) { /* 300 spread: no rotated value above 300 / 2^2 + noise */
                float m = 0.0f;
                for (int d = 0; d < D; d++) m = fmaxf(m, fabsf(r[d]));
                assert_true(m < 300.0f / 4.0f + 40.0f);
            }
            kvp__rot_inverse(r, D);
            for (int d = 0; d < D; d++) {
                float want = isfinite(x[d]) ? x[d] : 0.0f;
                assert_true(fabsf(r[d] - want) <= 1e-5f * (1.0f + (float)norm));
            }
        }
        int neg = 0;
        for (int d = 0; d < D; d++) {
            assert_int_equal(kvp__rot_neg(d), doc_neg((uint32_t)d));
            neg += doc_neg((uint32_t)d);
        }
        if (D >= 64) assert_true(neg > D / 4 && neg < 3 * D / 4);
    }
    /* rotated values through the public codec: the bytes of the rotated
     * rows under the unrotated layout, and reads that undo it */
    const int32_t P = 8, D = 80;
    kvp_quant_desc_t q = desc_of(KVP_FORMAT_INT4, 1, 0, P, D, 1);
    uint64_t block;
    assert_int_equal(kvp_quant_block_bytes(&q, &block, NULL, 0), KVP_OK);
    float rows[8 * 80], rot[8 * 80], back[8 * 80];
    kvd_fill_normal(&rng, (size_t)P * D, rows);
    memcpy(rot, rows, sizeof rows);
    for (int t = 0; t < P; t++) kvp__rot_forward(rot + t * D, D);
    uint8_t *a = calloc(1, block), *b = calloc(1, block);
    assert_int_equal(kvp_quantize(&q, rows, 1, a, NULL, 0), KVP_OK);
    kvp__blockfmt raw = kvp__blockfmt_make(KVP_FORMAT_INT4, 0, 0, P, D);
    assert_int_equal(raw.rot, 1);
    raw.rot = 0;
    kvp__block_encode(&raw, b, 0, P, rot, (size_t)D, 1.0f);
    assert_memory_equal(a, b, block);
    assert_int_equal(kvp_dequantize(&q, a, 1, back, NULL, 0), KVP_OK);
    double err = 0.0, ref = 0.0;
    for (int i = 0; i < P * D; i++) {
        err += ((double)back[i] - rows[i]) * ((double)back[i] - rows[i]);
        ref += (double)rows[i] * rows[i];
    }
    assert_true(sqrt(err / ref) < 0.12); /* int4's error, not a wrong basis (~1.4) */
    free(a);
    free(b);
}

/* ---- bad input ----------------------------------------------------------------------------------- */

/* kvp__block_decode() (whole tokens at once: the portable kernels' and the
 * prefill blocks' decoder) gives what kvp__block_decode_one() gives, bit for
 * bit: every format, keys (both orders) and values, page sizes whose last
 * token group is short, partial token ranges, head_dim 64/80/96, and blocks
 * of random bytes (scales of any value, int4 keys' outlier tables with
 * repeated or out-of-range channels). */
static void test_block_decode_matches_elements(void **state) {
    (void)state;
    static const int32_t fmts[] = {KVP_FORMAT_FP32, KVP_FORMAT_FP16,     KVP_FORMAT_BF16,
                                   KVP_FORMAT_FP8_E4M3, KVP_FORMAT_INT8, KVP_FORMAT_INT4_V1,
                                   KVP_FORMAT_INT4};
    static const int32_t pages[] = {2, 6, 16, 18, 32}, dims[] = {64, 80, 96};
    uint8_t *blk = malloc(1 << 18);
    float *y = malloc((size_t)32 * 100 * sizeof(float));
    assert_non_null(blk);
    assert_non_null(y);
    uint64_t rng = 0x9E3779B97F4A7C15ull;
    size_t checked = 0;
    for (size_t fi = 0; fi < sizeof fmts / sizeof *fmts; fi++)
        for (int key = 0; key < 2; key++)
            for (int order = 0; order < 2; order++)
                for (size_t pi = 0; pi < sizeof pages / sizeof *pages; pi++)
                    for (size_t di = 0; di < sizeof dims / sizeof *dims; di++) {
                        const int32_t P = pages[pi], D = dims[di];
                        kvp__blockfmt f = kvp__blockfmt_make(fmts[fi], key, order, P, D);
                        size_t bytes = (size_t)kvp__block_used_bytes(&f);
                        assert_true(bytes <= (1u << 18));
                        for (size_t i = 0; i < bytes; i++) {
                            rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
                            blk[i] = (uint8_t)(rng >> 32);
                        }
                        if (key && kvp__format_is_int4(fmts[fi])) { /* outlier channels: in range,
                                                                   repeated (entry 1 = entry 0), past D */
                            uint8_t *ot = blk + kvp__block_data_bytes(&f) + 4 * (size_t)D;
                            for (int j = 0; j < kvp__k4_outliers(fmts[fi], D); j++) {
                                uint16_t c = j == 1 ? (uint16_t)(ot[0] | ot[1] << 8)
                                                    : (uint16_t)((rng >> (8 * (j % 8))) % (uint64_t)(D + 4));
                                ot[2 * j] = (uint8_t)c;
                                ot[2 * j + 1] = (uint8_t)(c >> 8);
                            }
                        }
                        const int32_t ranges[][2] = {{0, P}, {1, P - 1}, {P / 2, 1}};
                        for (int r = 0; r < 3; r++) {
                            const int32_t t0 = ranges[r][0], n = ranges[r][1];
                            const size_t stride = (size_t)D + 3;
                            kvp__block_decode(&f, blk, t0, n, y, stride, 0.37f);
                            for (int32_t i = 0; i < n; i++)
                                for (int32_t d = 0; d < D; d++) {
                                    float want = kvp__block_decode_one(&f, blk, t0 + i, d, 0.37f);
                                    float got = y[(size_t)i * stride + (size_t)d];
                                    if (isnan(want) && isnan(got)) continue;
                                    if (memcmp(&want, &got, sizeof want) != 0)
                                        print_error("format %d key %d order %d page %d head_dim %d token %d "
                                                    "channel %d: %a, element decoder %a\n", (int)fmts[fi], key,
                                                    order, (int)P, (int)D, (int)(t0 + i), (int)d, got, want);
                                    assert_memory_equal(&want, &got, sizeof want);
                                    checked++;
                                }
                        }
                    }
    assert_true(checked > 100000);
    free(blk);
    free(y);
}

/* int4 keys read back by docs/formats.md's layout alone ("int4 keys"): the
 * outlier count per head_dim, the table after scale[D] and min[D], the
 * entries in increasing channel order, the widest channels chosen, their
 * int4 entries and scales zero, and the codes where the layout puts them:
 * channel quads (j/4)*P*4 + t*4 + j%4 for int4, j*P + t for int4_v1. */
static void test_int4_key_layout(void **state) {
    (void)state;
    static const int32_t dims[] = {8, 24, 64, 80, 96, 128, 256};
    static const int want4[] = {4, 4, 8, 12, 12, 16, 32}, want1[] = {0, 0, 2, 2, 3, 4, 8};
    const int32_t P = 16;
    float *x = malloc((size_t)P * 256 * sizeof(float)), *back = malloc((size_t)P * 256 * sizeof(float));
    uint8_t *blk = malloc(1 << 16);
    assert_true(x != NULL && back != NULL && blk != NULL);
    for (int fi = 0; fi < 2; fi++)
        for (size_t di = 0; di < sizeof dims / sizeof *dims; di++) {
            const int32_t fmt = fi == 0 ? KVP_FORMAT_INT4 : KVP_FORMAT_INT4_V1, D = dims[di];
            const int R = fi == 0 ? want4[di] : want1[di];
            /* channel d's range is distinct for every d (a permutation of
             * 1..D), so the R widest are known */
            for (int32_t t = 0; t < P; t++)
                for (int32_t d = 0; d < D; d++) {
                    float w = (float)(1 + (d * 37 + 11) % D);
                    x[(size_t)t * (size_t)D + (size_t)d] = w * ((float)((t * 5 + d) % P) / (float)(P - 1) - 0.5f);
                }
            kvp_quant_desc_t q;
            memset(&q, 0, sizeof q);
            q.struct_size = sizeof q;
            q.format = fmt;
            q.page_size = P;
            q.head_dim = D;
            q.heads = 1;
            q.dtype = KVP_FORMAT_FP32;
            uint64_t bytes = 0;
            assert_int_equal(kvp_quant_block_bytes(&q, &bytes, NULL, 0), KVP_OK);
            /* P*D/2 + 4D + R*(6 + P), then padding */
            assert_true(bytes >= (uint64_t)(P * D / 2 + 4 * D + R * (6 + P)) && bytes <= (1u << 16));
            assert_int_equal(kvp_quantize(&q, x, 1, blk, NULL, 0), KVP_OK);
            assert_int_equal(kvp_dequantize(&q, blk, 1, back, NULL, 0), KVP_OK);
            const uint8_t *sc = blk + P * D / 2, *mn = sc + 2 * D, *ot = mn + 2 * D;
            const uint8_t *codes = ot + 6 * R;
            /* the R widest channels: ranks of w = 1 + (d*37 + 11) % D above D - R */
            int j = 0;
            for (int32_t d = 0; d < D; d++) {
                if (1 + (d * 37 + 11) % D <= D - R) continue;
                assert_true(j < R);
                uint16_t idx, s16, m16;
                memcpy(&idx, ot + 2 * j, 2);
                memcpy(&s16, ot + 2 * (R + j), 2);
                memcpy(&m16, ot + 2 * (2 * R + j), 2);
                assert_int_equal(idx, d);
                uint16_t zs, zm;
                memcpy(&zs, sc + 2 * d, 2);
                memcpy(&zm, mn + 2 * d, 2);
                assert_int_equal(zs, 0);
                assert_int_equal(zm, 0);
                for (int32_t t = 0; t < P; t++) {
                    size_t at = fmt == KVP_FORMAT_INT4 ? (size_t)(j / 4) * (size_t)P * 4 + (size_t)t * 4 + (size_t)(j % 4)
                                                       : (size_t)j * (size_t)P + (size_t)t;
                    float v = fmaf(kvp__f16_to_f32(s16), (float)codes[at], kvp__f16_to_f32(m16));
                    assert_memory_equal(&v, &back[(size_t)t * (size_t)D + (size_t)d], sizeof v);
                    /* the int4 part holds 0 there (low nibble: even token) */
                    uint8_t byte = blk[(size_t)(d / 4) * (size_t)(P / 2) * 4 + (size_t)(t / 2) * 4 + (size_t)(d % 4)];
                    assert_int_equal((t % 2 ? byte >> 4 : byte & 0x0F), 0);
                }
                j++;
            }
            assert_int_equal(j, R);
        }
    free(x);
    free(back);
    free(blk);
}

static void test_bad_descriptions(void **state) {
    (void)state;
    float x[64 * 16];
    uint8_t out[4096];
    char err[KVP_ERR_SIZE];
    memset(x, 0, sizeof x);
    struct {
        kvp_quant_desc_t d;
        const char *needle;
    } cases[10];
    int n = 0;
    kvp_quant_desc_t base = desc_of(KVP_FORMAT_INT8, 0, 0, 16, 64, 1);
    cases[n].d = base; cases[n].d.format = 9; cases[n++].needle = "format";
    cases[n].d = base; cases[n].d.head_dim = 12; cases[n++].needle = "head_dim";
    cases[n].d = base; cases[n].d.page_size = 0; cases[n++].needle = "page_size";
    cases[n].d = base; cases[n].d.format = KVP_FORMAT_INT4; cases[n].d.page_size = 15; cases[n++].needle = "even";
    cases[n].d = base; cases[n].d.format = KVP_FORMAT_FP8_E4M3; cases[n].d.fp8_scale = 0; cases[n++].needle = "fp8_scale";
    cases[n].d = base; cases[n].d.dtype = KVP_FORMAT_INT8; cases[n++].needle = "dtype";
    cases[n].d = base; cases[n].d.heads = 0; cases[n++].needle = "heads";
    cases[n].d = base; cases[n].d.is_value = 2; cases[n++].needle = "is_value";
    cases[n].d = base; cases[n].d.struct_size = 4; cases[n++].needle = "struct_size";
    for (int i = 0; i < n; i++) {
        memset(out, 0xAB, sizeof out);
        err[0] = 0;
        assert_int_equal(kvp_quantize(&cases[i].d, x, 1, out, err, sizeof err), KVP_EINVAL);
        if (strstr(err, cases[i].needle) == NULL) print_error("'%s' lacks '%s'\n", err, cases[i].needle);
        assert_non_null(strstr(err, cases[i].needle));
        for (size_t k = 0; k < sizeof out; k++) assert_int_equal(out[k], 0xAB);
        assert_int_equal(kvp_dequantize(&cases[i].d, out, 1, x, NULL, 0), KVP_EINVAL);
    }
    assert_int_equal(kvp_quantize(&base, NULL, 1, out, err, sizeof err), KVP_EINVAL);
    assert_int_equal(kvp_quantize(&base, x, 0, out, err, sizeof err), KVP_EINVAL);
    assert_int_equal(kvp_quantize(&base, x, 1, NULL, err, sizeof err), KVP_EINVAL);
    assert_int_equal(kvp_quantize(NULL, x, 1, out, err, sizeof err), KVP_EINVAL);
    assert_int_equal(kvp_quant_block_bytes(&base, NULL, err, sizeof err), KVP_EINVAL);
    assert_int_equal(kvp_quantize(&base, x, INT64_MAX, out, err, sizeof err), KVP_EINVAL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp16_conversion),
        cmocka_unit_test(test_bf16_conversion),
        cmocka_unit_test(test_e4m3_conversion),
        cmocka_unit_test(test_round_trip_all_formats),
        cmocka_unit_test(test_input_dtypes),
        cmocka_unit_test(test_nonfinite_rules),
        cmocka_unit_test(test_all_nan_channel),
        cmocka_unit_test(test_bad_descriptions),
        cmocka_unit_test(test_block_decode_matches_elements),
        cmocka_unit_test(test_int4_key_layout),
        cmocka_unit_test(test_value_rotation),
    };
    return cmocka_run_group_tests_name("quant", tests, NULL, NULL);
}
