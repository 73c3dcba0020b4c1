/*
 * The block encoders of the append path (and kvp_quantize): the same bytes
 * as the reference codec (lib/blockfmt.c: kvp__block_encode), computed a row
 * at a time through one ISA's encoder primitives (kvp__enc_prims) instead of
 * an element at a time: conversions, ranges and codes over whole rows or
 * columns, then the format's layout filled from them. The portable
 * primitives are here; the SIMD ones sit with each ISA's kernels.
 *
 * What keeps the bytes identical: every primitive does the reference's
 * arithmetic in the same order per element (no contraction: the codes are
 * rne((x - min) * inv), a subtraction then a product), and the ranges are
 * minima and maxima, which do not depend on the order of a reduction, but
 * for one thing: the sign of a zero. The reference keeps the first of equal
 * values, so where a range ends at zero, its sign is that of the first zero
 * in the row or column (fix_zero_sign).
 */
#include "cpu.h"

#include <string.h>

/* ---- portable primitives ------------------------------------------------------ */

static void p_to_f16(const float *x, uint16_t *y, int n) {
    for (int i = 0; i < n; i++) y[i] = kvp__f32_to_f16(x[i]);
}

static void p_to_bf16(const float *x, uint16_t *y, int n) {
    for (int i = 0; i < n; i++) y[i] = kvp__f32_to_bf16(x[i]);
}

static void p_to_e4m3(const float *x, uint8_t *y, int n, float inv) {
    for (int i = 0; i < n; i++) y[i] = kvp__f32_to_e4m3(x[i] * inv);
}

static void p_from_f16(const uint16_t *x, float *y, int n) {
    for (int i = 0; i < n; i++) y[i] = kvp__f16_to_f32(x[i]);
}

static void p_minmax_cols(const float *x, size_t stride, int rows, int n, float *lo, float *hi) {
    for (int d = 0; d < n; d++) {
        lo[d] = INFINITY;
        hi[d] = -INFINITY;
    }
    for (int t = 0; t < rows; t++) {
        const float *r = x + (size_t)t * stride;
        for (int d = 0; d < n; d++) {
            float v = r[d];
            if (!isfinite(v)) continue;
            if (v < lo[d]) lo[d] = v;
            if (v > hi[d]) hi[d] = v;
        }
    }
}

static void p_minmax(const float *x, int n, float *lo, float *hi) {
    float a = INFINITY, b = -INFINITY;
    for (int i = 0; i < n; i++) {
        float v = x[i];
        if (!isfinite(v)) continue;
        if (v < a) a = v;
        if (v > b) b = v;
    }
    *lo = a;
    *hi = b;
}

static float p_absmax(const float *x, int n) {
    float m = 0.0f;
    for (int i = 0; i < n; i++)
        if (isfinite(x[i]) && fabsf(x[i]) > m) m = fabsf(x[i]);
    return m;
}

static void p_asym_codes(const float *x, int n, const float *mn, const float *inv, const float *lv,
                         uint8_t *c) {
    for (int i = 0; i < n; i++) {
        kvp__asym a;
        a.min = mn[i];
        a.inv = inv[i];
        c[i] = (uint8_t)kvp__asym_code(&a, x[i], (int)lv[i]);
    }
}

static void p_asym_codes1(const float *x, int n, float mn, float inv, float lv, uint8_t *c) {
    kvp__asym a;
    a.min = mn;
    a.inv = inv;
    for (int i = 0; i < n; i++) c[i] = (uint8_t)kvp__asym_code(&a, x[i], (int)lv);
}

static void p_sym8_codes(const float *x, int n, float inv, int8_t *c) {
    for (int i = 0; i < n; i++) c[i] = kvp__sym8_code(x[i], inv);
}

static int p_nonfinite(const float *x, int n) {
    int bad = 0;
    for (int i = 0; i < n; i++) bad += !isfinite(x[i]);
    return bad;
}

static void p_cols16(const uint16_t *h, size_t hstride, int m, int n, uint16_t *out, size_t ostride) {
    for (int d = 0; d < n; d++)
        for (int j = 0; j < m; j++) out[(size_t)d * ostride + (size_t)j] = h[(size_t)j * hstride + (size_t)d];
}

const kvp__enc_prims kvp__enc_portable = {
    "portable",   p_to_f16,      p_to_bf16,     p_to_e4m3,     p_from_f16,   p_minmax_cols, p_minmax,
    p_absmax,     p_asym_codes,  p_asym_codes1, p_sym8_codes,  p_nonfinite,  p_cols16,
};

const kvp__enc_prims *kvp__pick_enc(int32_t isa) {
    const kvp__enc_prims *e;
    switch (isa) {
    case KVP_ISA_AVX2: e = &kvp__enc_avx2; break;
    case KVP_ISA_AVX512:
    case KVP_ISA_AVX512_BF16: e = &kvp__enc_avx512; break;
    case KVP_ISA_NEON:
    case KVP_ISA_NEON_DOTPROD: e = &kvp__enc_neon; break;
    default: e = &kvp__enc_portable; break;
    }
    return e->to_f16 != NULL ? e : &kvp__enc_portable; /* NULL: not built for this target */
}

/* ---- the formats ----------------------------------------------------------------- */

/* Where a range [lo, hi] ends at zero, the sign the reference gives it: that
 * of the first finite zero among the n values (stride apart). */
static float fix_zero_sign(float v, const float *x, size_t stride, int n) {
    if (v != 0.0f) return v;
    for (int i = 0; i < n; i++) {
        float u = x[(size_t)i * stride];
        if (u == 0.0f) return u;
    }
    return v;
}

/* Plain formats. Token-major: each row converted in place. Dim-major
 * (channel d of token t at d*P + t): rows converted 8 at a time, then
 * written channel by channel, 8 tokens in a run (fp16 and bf16: an 8 x 8
 * transpose in registers where the ISA has one). */
#define PLAIN_ROWS 8
static void encode_plain(const kvp__enc_prims *e, const kvp__blockfmt *f, uint8_t *b, int t0, int n,
                         const float *x, size_t stride, float fp8_scale) {
    const size_t P = (size_t)f->page_size, D = (size_t)f->head_dim;
    const int32_t fmt = f->format;
    const float inv8 = fmt == KVP_FORMAT_FP8_E4M3 ? 1.0f / fp8_scale : 0.0f;
    if (!kvp__blockfmt_dim_major(f)) {
        for (int i = 0; i < n; i++) {
            const float *row = x + (size_t)i * stride;
            uint8_t *out = b + (size_t)(t0 + i) * D * kvp__plain_size(fmt);
            if (fmt == KVP_FORMAT_FP32) memcpy(out, row, D * 4);
            else if (fmt == KVP_FORMAT_FP16) e->to_f16(row, (uint16_t *)(void *)out, (int)D);
            else if (fmt == KVP_FORMAT_BF16) e->to_bf16(row, (uint16_t *)(void *)out, (int)D);
            else e->to_e4m3(row, out, (int)D, inv8);
        }
        return;
    }
    uint16_t h[PLAIN_ROWS][KVP_MAX_HEAD_DIM];
    uint8_t q[PLAIN_ROWS][KVP_MAX_HEAD_DIM];
    for (int i0 = 0; i0 < n; i0 += PLAIN_ROWS) {
        const int m = n - i0 < PLAIN_ROWS ? n - i0 : PLAIN_ROWS;
        const float *rows = x + (size_t)i0 * stride;
        const size_t t = (size_t)(t0 + i0);
        switch (fmt) {
        case KVP_FORMAT_FP32:
            for (size_t d = 0; d < D; d++) {
                float *out = (float *)(void *)b + d * P + t;
                for (int j = 0; j < m; j++) out[j] = rows[(size_t)j * stride + d];
            }
            break;
        case KVP_FORMAT_FP16:
        case KVP_FORMAT_BF16:
            for (int j = 0; j < m; j++)
                (fmt == KVP_FORMAT_FP16 ? e->to_f16 : e->to_bf16)(rows + (size_t)j * stride, h[j], (int)D);
            e->cols16(&h[0][0], KVP_MAX_HEAD_DIM, m, (int)D, (uint16_t *)(void *)b + t, P);
            break;
        default:
            for (int j = 0; j < m; j++) e->to_e4m3(rows + (size_t)j * stride, q[j], (int)D, inv8);
            for (size_t d = 0; d < D; d++) {
                uint8_t *out = b + d * P + t;
                for (int j = 0; j < m; j++) out[j] = q[j][d];
            }
            break;
        }
    }
}

/* int8 / int4 keys: the whole page, per channel over its P tokens. */
static void encode_key_int(const kvp__enc_prims *e, const kvp__blockfmt *f, uint8_t *b,
                           const float *x, size_t stride) {
    const int P = f->page_size, D = f->head_dim;
    const bool int8 = f->format == KVP_FORMAT_INT8;
    float lo[KVP_MAX_HEAD_DIM], hi[KVP_MAX_HEAD_DIM], mn[KVP_MAX_HEAD_DIM], inv[KVP_MAX_HEAD_DIM],
        lv[KVP_MAX_HEAD_DIM];
    uint8_t *sc = b + kvp__block_data_bytes(f), *mnb = sc + 2 * (size_t)D;
    e->minmax_cols(x, stride, P, D, lo, hi);
    for (int d = 0; d < D; d++) {
        lo[d] = fix_zero_sign(lo[d], x + d, stride, P);
        hi[d] = fix_zero_sign(hi[d], x + d, stride, P);
    }
    /* int4: the channels of widest range go to the int8 outlier table */
    uint16_t outl[KVP__K4_MAX_OUTLIERS] = {0};
    int R = 0;
    if (!int8) {
        float range[KVP_MAX_HEAD_DIM];
        for (int d = 0; d < D; d++) range[d] = lo[d] > hi[d] ? 0.0f : hi[d] - lo[d];
        R = kvp__k4_pick(range, D, kvp__k4_outliers(f->format, D), outl);
    }
    uint8_t *ot = mnb + 2 * (size_t)D, *codes8 = ot + 6 * (size_t)R;
    for (int d = 0, j = 0; d < D; d++) {
        bool is_outlier = j < R && outl[j] == d;
        int levels = int8 || is_outlier ? 255 : 15;
        kvp__asym a = kvp__asym_make(lo[d], hi[d], levels);
        mn[d] = a.min;
        inv[d] = a.inv;
        lv[d] = (float)levels;
        if (is_outlier) {
            kvp__store_u16(ot + 2 * (size_t)j, (uint16_t)d);
            kvp__store_u16(ot + 2 * (size_t)R + 2 * (size_t)j, a.scale16);
            kvp__store_u16(ot + 4 * (size_t)R + 2 * (size_t)j, a.min16);
            kvp__store_u16(sc + 2 * (size_t)d, 0);
            kvp__store_u16(mnb + 2 * (size_t)d, 0);
            j++;
        } else {
            kvp__store_u16(sc + 2 * (size_t)d, a.scale16);
            kvp__store_u16(mnb + 2 * (size_t)d, a.min16);
        }
    }
    uint8_t c0[KVP_MAX_HEAD_DIM], c1[KVP_MAX_HEAD_DIM];
    if (int8) {
        /* channel quads: 4 bytes of token t at (d/4)*P*4 + t*4 */
        for (int t = 0; t < P; t++) {
            e->asym_codes(x + (size_t)t * stride, D, mn, inv, lv, c0);
            uint8_t *tok = b + (size_t)t * 4;
            for (int d = 0; d < D; d += 4) memcpy(tok + (size_t)(d / 4) * (size_t)P * 4, c0 + d, 4);
        }
        return;
    }
    /* int4: tokens t, t+1 share the bytes of a channel quad (low nibble:
     * the even token) at (d/4)*(P/2)*4 + (t/2)*4; outlier channels: 0
     * there, their codes in the table */
    for (int t = 0; t < P; t += 2) {
        e->asym_codes(x + (size_t)t * stride, D, mn, inv, lv, c0);
        e->asym_codes(x + (size_t)(t + 1) * stride, D, mn, inv, lv, c1);
        for (int j = 0; j < R; j++) {
            codes8[kvp__k4_code_offset(f->format, P, j, t)] = c0[outl[j]];
            codes8[kvp__k4_code_offset(f->format, P, j, t + 1)] = c1[outl[j]];
            c0[outl[j]] = c1[outl[j]] = 0;
        }
        uint8_t *pair = b + (size_t)(t / 2) * 4;
        for (int d = 0; d < D; d += 4) {
            uint8_t w[4];
            for (int k = 0; k < 4; k++) w[k] = (uint8_t)(c0[d + k] | (c1[d + k] << 4));
            memcpy(pair + (size_t)(d / 4) * (size_t)(P / 2) * 4, w, 4);
        }
    }
}

/* int8 values: per token, symmetric; channel d of token t at
 * group(t)*4*D + d*u + t%4 (u: the tokens of t's group). */
static void encode_value_int8(const kvp__enc_prims *e, const kvp__blockfmt *f, uint8_t *b, int t0,
                              int n, const float *x, size_t stride) {
    const int P = f->page_size, D = f->head_dim;
    uint8_t *sc = b + kvp__block_data_bytes(f);
    int8_t c[KVP_MAX_HEAD_DIM];
    for (int i = 0; i < n; i++) {
        const float *row = x + (size_t)i * stride;
        const int t = t0 + i, u = kvp__v_group_tokens(P, t);
        uint16_t s16 = kvp__sym8_scale16(e->absmax(row, D));
        kvp__store_u16(sc + 2 * (size_t)t, s16);
        e->sym8_codes(row, D, kvp__sym8_inv(s16), c);
        uint8_t *g = b + (size_t)(t / KVP__V_TOKGROUP) * KVP__V_TOKGROUP * (size_t)D + (size_t)(t % KVP__V_TOKGROUP);
        for (int d = 0; d < D; d++) g[(size_t)d * (size_t)u] = (uint8_t)c[d];
    }
}

/* int4 values: per token and 32-channel group, asymmetric; slot j of a
 * group holds channels j (low nibble) and j + w/2 (high). */
static void encode_value_int4(const kvp__enc_prims *e, const kvp__blockfmt *f, uint8_t *b, int t0,
                              int n, const float *x, size_t stride) {
    const int P = f->page_size, D = f->head_dim, G = kvp__v4_groups(D);
    uint8_t *sc = b + kvp__block_data_bytes(f), *mnb = sc + 2 * (size_t)G * (size_t)P;
    uint8_t c[KVP__V4_GROUP];
    for (int i = 0; i < n; i++) {
        const float *row = x + (size_t)i * stride;
        const int t = t0 + i, u = kvp__v_group_tokens(P, t);
        uint8_t *tg = b + (size_t)(t / KVP__V_TOKGROUP) * KVP__V_TOKGROUP * (size_t)D / 2 + (size_t)(t % KVP__V_TOKGROUP);
        for (int g = 0; g < G; g++) {
            const int d0 = g * KVP__V4_GROUP, w = kvp__v4_width(D, g), half = w / 2;
            float lo, hi;
            e->minmax(row + d0, w, &lo, &hi);
            lo = fix_zero_sign(lo, row + d0, 1, w);
            hi = fix_zero_sign(hi, row + d0, 1, w);
            kvp__asym a = kvp__asym_make(lo, hi, 15);
            kvp__store_u16(sc + 2 * ((size_t)g * (size_t)P + (size_t)t), a.scale16);
            kvp__store_u16(mnb + 2 * ((size_t)g * (size_t)P + (size_t)t), a.min16);
            e->asym_codes1(row + d0, w, a.min, a.inv, 15.0f, c);
            uint8_t *slot = tg + (size_t)g * (KVP__V4_GROUP / 2) * (size_t)u;
            for (int j = 0; j < half; j++) slot[(size_t)j * (size_t)u] = (uint8_t)(c[j] | (c[half + j] << 4));
        }
    }
}

/* Rows [t0, t0+n) in f's format, as given (f->rot aside). */
static void encode_rows(const kvp__enc_prims *e, const kvp__blockfmt *f, uint8_t *b, int t0, int n,
                        const float *x, size_t stride, float fp8_scale) {
    if (kvp__format_is_plain(f->format)) encode_plain(e, f, b, t0, n, x, stride, fp8_scale);
    else if (f->is_key) encode_key_int(e, f, b, x, stride);
    else if (f->format == KVP_FORMAT_INT8) encode_value_int8(e, f, b, t0, n, x, stride);
    else encode_value_int4(e, f, b, t0, n, x, stride);
}

/* Rows into the rotated basis (kvp__rot_forward), then encoded one at a
 * time: values only, per token. */
static void encode_rotated(const kvp__enc_prims *e, const kvp__blockfmt *f, uint8_t *b, int t0, int n,
                           const float *x, size_t stride, float fp8_scale) {
    const int D = f->head_dim;
    float row[KVP_MAX_HEAD_DIM];
    for (int i = 0; i < n; i++) {
        memcpy(row, x + (size_t)i * stride, (size_t)D * sizeof(float));
        kvp__rot_forward(row, D);
        encode_rows(e, f, b, t0 + i, 1, row, (size_t)D, fp8_scale);
    }
}

uint64_t kvp__encode(const kvp__enc_prims *e, const kvp__blockfmt *f, void *block, int t0, int n,
                     const float *x, size_t stride, float fp8_scale) {
    uint8_t *b = (uint8_t *)block;
    if (f->rot) encode_rotated(e, f, b, t0, n, x, stride, fp8_scale);
    else encode_rows(e, f, b, t0, n, x, stride, fp8_scale);
    uint64_t used = kvp__block_used_bytes(f), padded = kvp__round_up_u64(used, KVP_BLOCK_ALIGN);
    if (padded > used) memset(b + used, 0, (size_t)(padded - used));
    uint64_t bad = 0;
    for (int i = 0; i < n; i++) bad += (uint64_t)e->nonfinite(x + (size_t)i * stride, f->head_dim);
    return bad;
}

void kvp__decode_f16(const kvp__enc_prims *e, const kvp__blockfmt *f, const void *block, int n,
                     float *y) {
    const uint16_t *h = (const uint16_t *)block;
    const int P = f->page_size, D = f->head_dim;
    if (!kvp__blockfmt_dim_major(f)) {
        e->from_f16(h, y, n * D);
        return;
    }
    float col[256];
    for (int d = 0; d < D; d++)
        for (int t0 = 0; t0 < n; t0 += 256) {
            int m = n - t0 < 256 ? n - t0 : 256;
            e->from_f16(h + (size_t)d * (size_t)P + (size_t)t0, col, m);
            for (int t = 0; t < m; t++) y[(size_t)(t0 + t) * (size_t)D + (size_t)d] = col[t];
        }
}
