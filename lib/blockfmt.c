/*
 * The reference codec of every block format (docs/formats.md). Scalar and
 * plain on purpose: it defines the bytes, it is not a hot path (the append
 * and attention kernels have their own fast paths, tested against this).
 */
#include "blockfmt.h"

#include <string.h>

uint64_t kvp__block_data_bytes(const kvp__blockfmt *f) {
    uint64_t elems = (uint64_t)f->page_size * (uint64_t)f->head_dim;
    if (kvp__format_is_plain(f->format)) return elems * (uint64_t)kvp__plain_size(f->format);
    return f->format == KVP_FORMAT_INT8 ? elems : elems / 2;
}

uint64_t kvp__block_used_bytes(const kvp__blockfmt *f) {
    return kvp__block_bytes(f->format, f->is_key != 0, (uint64_t)f->page_size,
                            (uint64_t)f->head_dim);
}

/* ---- element addressing of the quantized layouts ------------------------ */

/* int8 keys: channel quads, [D/4][P][4]: the 4 bytes of a 32-bit lane are
 * four consecutive channels of one token (what vpdpbusd/dp4a multiply). */
static inline uint64_t k8_offset(int P, int t, int d) {
    return (uint64_t)(d / 4) * (uint64_t)P * 4 + (uint64_t)t * 4 + (uint64_t)(d % 4);
}
/* int4 keys: the int8 layout with tokens 2i (low nibble) and 2i+1 (high
 * nibble) sharing a byte: [D/4][P/2][4]. */
static inline uint64_t k4_offset(int P, int t, int d, int *high) {
    *high = t & 1;
    return (uint64_t)(d / 4) * (uint64_t)(P / 2) * 4 + (uint64_t)(t / 2) * 4 + (uint64_t)(d % 4);
}
/* int8 values: token groups of 4 (the last may be shorter, u tokens), each
 * [D][u]: the bytes of a 32-bit lane are four tokens of one channel. */
static inline uint64_t v8_offset(int P, int D, int t, int d) {
    int g = t / KVP__V_TOKGROUP, u = P - g * KVP__V_TOKGROUP;
    if (u > KVP__V_TOKGROUP) u = KVP__V_TOKGROUP;
    return (uint64_t)g * KVP__V_TOKGROUP * (uint64_t)D + (uint64_t)d * (uint64_t)u +
           (uint64_t)(t % KVP__V_TOKGROUP);
}
/* int4 values: the int8 layout with channels i (low nibble) and i + W/2
 * (high nibble) of each 32-wide scale group (W = its width) sharing a byte. */
static inline uint64_t v4_offset(int P, int D, int t, int d, int *high) {
    int g = t / KVP__V_TOKGROUP, u = P - g * KVP__V_TOKGROUP;
    if (u > KVP__V_TOKGROUP) u = KVP__V_TOKGROUP;
    int k = d / KVP__V4_GROUP, i = d % KVP__V4_GROUP;
    int w = D - k * KVP__V4_GROUP;
    if (w > KVP__V4_GROUP) w = KVP__V4_GROUP;
    *high = i >= w / 2;
    int slot = k * (KVP__V4_GROUP / 2) + (*high ? i - w / 2 : i);
    return (uint64_t)g * KVP__V_TOKGROUP * (uint64_t)D / 2 + (uint64_t)slot * (uint64_t)u +
           (uint64_t)(t % KVP__V_TOKGROUP);
}

static inline void put_nibble(uint8_t *p, int high, unsigned v) {
    *p = high ? (uint8_t)((*p & 0x0F) | (v << 4)) : (uint8_t)((*p & 0xF0) | v);
}
static inline unsigned get_nibble(const uint8_t *p, int high) {
    return high ? (unsigned)(*p >> 4) : (unsigned)(*p & 0x0F);
}

static inline uint16_t load_u16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}
static inline void store_u16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }

/* ---- the scale rules ------------------------------------------------------ */

/* An fp16 scale or minimum: fp32 value rounded to nearest even, clamped to
 * the finite fp16 range so a huge range saturates instead of becoming Inf. */
static inline uint16_t f16_saturating(float v) {
    if (v > 65504.0f) v = 65504.0f;
    if (v < -65504.0f) v = -65504.0f;
    return kvp__f32_to_f16(v);
}

/* Asymmetric quantization of n values x[i*stride] to codes 0..levels.
 * Range over the finite values only; NaN encodes as the code nearest 0.0,
 * +Inf as `levels`, -Inf as 0. Writes fp16 scale and minimum. */
typedef struct {
    float scale, min, inv;
    uint16_t scale16, min16;
} asym_params;

static asym_params asym_fit(const float *x, size_t stride, int n, int levels) {
    float lo = INFINITY, hi = -INFINITY;
    for (int i = 0; i < n; i++) {
        float v = x[(size_t)i * stride];
        if (!isfinite(v)) continue;
        if (v < lo) lo = v;
        if (v > hi) hi = v;
    }
    if (lo > hi) lo = hi = 0.0f; /* no finite value */
    asym_params a;
    a.scale16 = f16_saturating((hi - lo) / (float)levels);
    a.min16 = f16_saturating(lo);
    a.scale = kvp__f16_to_f32(a.scale16);
    a.min = kvp__f16_to_f32(a.min16);
    a.inv = a.scale > 0.0f ? 1.0f / a.scale : 0.0f;
    return a;
}

static inline unsigned asym_code(const asym_params *a, float v, int levels) {
    if (isnan(v)) v = 0.0f;
    if (v == INFINITY) return (unsigned)levels;
    if (v == -INFINITY) return 0;
    float c = kvp__rne((v - a->min) * a->inv);
    if (!(c >= 0.0f)) c = 0.0f;
    if (c > (float)levels) c = (float)levels;
    return (unsigned)c;
}

static uint64_t count_nonfinite(const float *x, size_t stride, int n, int d) {
    uint64_t bad = 0;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < d; j++) bad += !isfinite(x[(size_t)i * stride + (size_t)j]);
    return bad;
}

/* ---- encode --------------------------------------------------------------- */

static void encode_plain(const kvp__blockfmt *f, uint8_t *b, int t0, int n, const float *x,
                         size_t stride, float fp8_scale) {
    float inv8 = f->format == KVP_FORMAT_FP8_E4M3 ? 1.0f / fp8_scale : 0.0f;
    for (int i = 0; i < n; i++)
        for (int d = 0; d < f->head_dim; d++) {
            float v = x[(size_t)i * stride + (size_t)d];
            uint8_t *p = b + kvp__plain_offset(f, t0 + i, d);
            switch (f->format) {
            case KVP_FORMAT_FP32: memcpy(p, &v, 4); break;
            case KVP_FORMAT_FP16: store_u16(p, kvp__f32_to_f16(v)); break;
            case KVP_FORMAT_BF16: store_u16(p, kvp__f32_to_bf16(v)); break;
            default: *p = kvp__f32_to_e4m3(v * inv8); break;
            }
        }
}

/* The range over a channel's finite values (0 if none): what decides the
 * int4 keys' outlier channels. */
static float finite_range(const float *x, size_t stride, int n) {
    float lo = INFINITY, hi = -INFINITY;
    for (int i = 0; i < n; i++) {
        float v = x[(size_t)i * stride];
        if (!isfinite(v)) continue;
        if (v < lo) lo = v;
        if (v > hi) hi = v;
    }
    return lo > hi ? 0.0f : hi - lo;
}

/* The R channels of widest range, in increasing channel order (ties: the
 * lower channel). O(D*R), R = D/32. */
static int pick_outliers(const float *x, size_t stride, int P, int D, int R, uint16_t *idx) {
    float range[KVP_MAX_HEAD_DIM];
    bool taken[KVP_MAX_HEAD_DIM] = {false};
    for (int d = 0; d < D; d++) range[d] = finite_range(x + d, stride, P);
    for (int j = 0; j < R; j++) {
        int best = -1;
        for (int d = 0; d < D; d++)
            if (!taken[d] && (best < 0 || range[d] > range[best])) best = d;
        taken[best] = true;
    }
    int n = 0;
    for (int d = 0; d < D; d++)
        if (taken[d]) idx[n++] = (uint16_t)d;
    return n;
}

static void encode_key_int(const kvp__blockfmt *f, uint8_t *b, const float *x, size_t stride) {
    int P = f->page_size, D = f->head_dim;
    int levels = f->format == KVP_FORMAT_INT8 ? 255 : 15;
    uint8_t *sc = b + kvp__block_data_bytes(f), *mn = sc + 2 * (size_t)D;
    uint16_t outl[KVP_MAX_HEAD_DIM / 32] = {0};
    int R = levels == 15 ? pick_outliers(x, stride, P, D, kvp__k4_outliers(D), outl) : 0;
    uint8_t *ot = mn + 2 * (size_t)D, *codes8 = ot + 6 * (size_t)R;
    for (int d = 0, j = 0; d < D; d++) {
        bool is_outlier = j < R && outl[j] == d;
        int lv = is_outlier ? 255 : levels;
        asym_params a = asym_fit(x + d, stride, P, lv);
        if (is_outlier) { /* int8 in the outlier table; zero in the int4 tables */
            store_u16(ot + 2 * (size_t)j, (uint16_t)d);
            store_u16(ot + 2 * (size_t)R + 2 * (size_t)j, a.scale16);
            store_u16(ot + 4 * (size_t)R + 2 * (size_t)j, a.min16);
            store_u16(sc + 2 * (size_t)d, 0);
            store_u16(mn + 2 * (size_t)d, 0);
        } else {
            store_u16(sc + 2 * (size_t)d, a.scale16);
            store_u16(mn + 2 * (size_t)d, a.min16);
        }
        for (int t = 0; t < P; t++) {
            unsigned c = asym_code(&a, x[(size_t)t * stride + (size_t)d], lv);
            if (levels == 255) {
                b[k8_offset(P, t, d)] = (uint8_t)c;
            } else {
                int high = 0;
                uint64_t o = k4_offset(P, t, d, &high);
                put_nibble(b + o, high, is_outlier ? 0u : c);
                if (is_outlier) codes8[(size_t)j * (size_t)P + (size_t)t] = (uint8_t)c;
            }
        }
        j += is_outlier;
    }
}

static void encode_value_int8(const kvp__blockfmt *f, uint8_t *b, int t0, int n,
                              const float *x, size_t stride) {
    int P = f->page_size, D = f->head_dim;
    uint8_t *sc = b + kvp__block_data_bytes(f);
    for (int i = 0; i < n; i++) {
        const float *row = x + (size_t)i * stride;
        float amax = 0.0f;
        for (int d = 0; d < D; d++)
            if (isfinite(row[d]) && fabsf(row[d]) > amax) amax = fabsf(row[d]);
        uint16_t s16 = f16_saturating(amax / 127.0f);
        float s = kvp__f16_to_f32(s16), inv = s > 0.0f ? 1.0f / s : 0.0f;
        store_u16(sc + 2 * (size_t)(t0 + i), s16);
        for (int d = 0; d < D; d++) {
            float v = row[d], c;
            if (isnan(v)) c = 0.0f;
            else if (isinf(v)) c = v > 0 ? 127.0f : -127.0f;
            else {
                c = kvp__rne(v * inv);
                if (c > 127.0f) c = 127.0f;
                if (c < -127.0f) c = -127.0f;
            }
            b[v8_offset(P, D, t0 + i, d)] = (uint8_t)(int8_t)c;
        }
    }
}

static void encode_value_int4(const kvp__blockfmt *f, uint8_t *b, int t0, int n,
                              const float *x, size_t stride) {
    int P = f->page_size, D = f->head_dim, G = kvp__v4_groups(D);
    uint8_t *sc = b + kvp__block_data_bytes(f), *mn = sc + 2 * (size_t)G * (size_t)P;
    for (int i = 0; i < n; i++) {
        int t = t0 + i;
        const float *row = x + (size_t)i * stride;
        for (int g = 0; g < G; g++) {
            int d0 = g * KVP__V4_GROUP, w = D - d0 < KVP__V4_GROUP ? D - d0 : KVP__V4_GROUP;
            asym_params a = asym_fit(row + d0, 1, w, 15);
            store_u16(sc + 2 * ((size_t)g * (size_t)P + (size_t)t), a.scale16);
            store_u16(mn + 2 * ((size_t)g * (size_t)P + (size_t)t), a.min16);
            for (int d = d0; d < d0 + w; d++) {
                int high = 0;
                uint64_t o = v4_offset(P, D, t, d, &high);
                put_nibble(b + o, high, asym_code(&a, row[d], 15));
            }
        }
    }
}

uint64_t kvp__block_encode(const kvp__blockfmt *f, void *block, int t0, int n,
                           const float *x, size_t stride, float fp8_scale) {
    uint8_t *b = (uint8_t *)block;
    if (kvp__format_is_plain(f->format)) encode_plain(f, b, t0, n, x, stride, fp8_scale);
    else if (f->is_key) encode_key_int(f, b, x, stride);
    else if (f->format == KVP_FORMAT_INT8) encode_value_int8(f, b, t0, n, x, stride);
    else encode_value_int4(f, b, t0, n, x, stride);
    return count_nonfinite(x, stride, n, f->head_dim);
}

/* ---- decode --------------------------------------------------------------- */

float kvp__block_decode_one(const kvp__blockfmt *f, const uint8_t *b, int t, int d, float fp8_scale) {
    int P = f->page_size, D = f->head_dim, high = 0;
    const uint8_t *sc = b + kvp__block_data_bytes(f);
    switch (f->format) {
    case KVP_FORMAT_FP32: {
        float v;
        memcpy(&v, b + kvp__plain_offset(f, t, d), 4);
        return v;
    }
    case KVP_FORMAT_FP16: return kvp__f16_to_f32(load_u16(b + kvp__plain_offset(f, t, d)));
    case KVP_FORMAT_BF16: return kvp__bf16_to_f32(load_u16(b + kvp__plain_offset(f, t, d)));
    case KVP_FORMAT_FP8_E4M3: return kvp__e4m3_to_f32(b[kvp__plain_offset(f, t, d)]) * fp8_scale;
    default: break;
    }
    if (f->is_key) {
        float s = kvp__f16_to_f32(load_u16(sc + 2 * (size_t)d));
        float m = kvp__f16_to_f32(load_u16(sc + 2 * (size_t)D + 2 * (size_t)d));
        unsigned c;
        if (f->format == KVP_FORMAT_INT8) {
            c = b[k8_offset(P, t, d)];
        } else {
            int R = kvp__k4_outliers(D);
            const uint8_t *ot = sc + 4 * (size_t)D;
            for (int j = 0; j < R; j++) {
                if (load_u16(ot + 2 * (size_t)j) != d) continue;
                float os = kvp__f16_to_f32(load_u16(ot + 2 * (size_t)(R + j)));
                float om = kvp__f16_to_f32(load_u16(ot + 2 * (size_t)(2 * R + j)));
                return fmaf(os, (float)ot[6 * (size_t)R + (size_t)j * (size_t)P + (size_t)t], om);
            }
            uint64_t o = k4_offset(P, t, d, &high); /* sets `high` before it is read */
            c = get_nibble(b + o, high);
        }
        return fmaf(s, (float)c, m);
    }
    if (f->format == KVP_FORMAT_INT8) {
        float s = kvp__f16_to_f32(load_u16(sc + 2 * (size_t)t));
        return s * (float)(int8_t)b[v8_offset(P, D, t, d)];
    }
    int G = kvp__v4_groups(D), g = d / KVP__V4_GROUP;
    size_t si = (size_t)g * (size_t)P + (size_t)t;
    float s = kvp__f16_to_f32(load_u16(sc + 2 * si));
    float m = kvp__f16_to_f32(load_u16(sc + 2 * (size_t)G * (size_t)P + 2 * si));
    uint64_t o = v4_offset(P, D, t, d, &high);
    unsigned c = get_nibble(b + o, high);
    return fmaf(s, (float)c, m);
}

void kvp__block_decode(const kvp__blockfmt *f, const void *block, int t0, int n, float *y,
                       size_t stride, float fp8_scale) {
    for (int i = 0; i < n; i++)
        for (int d = 0; d < f->head_dim; d++)
            y[(size_t)i * stride + (size_t)d] =
                kvp__block_decode_one(f, (const uint8_t *)block, t0 + i, d, fp8_scale);
}

/* ---- plain tensors --------------------------------------------------------- */

void kvp__load_f32(int32_t dtype, const void *src, size_t n, float *dst) {
    const uint8_t *s = (const uint8_t *)src;
    if (dtype == KVP_FORMAT_FP32) {
        memcpy(dst, src, n * 4);
    } else if (dtype == KVP_FORMAT_FP16) {
        for (size_t i = 0; i < n; i++) dst[i] = kvp__f16_to_f32(load_u16(s + 2 * i));
    } else {
        for (size_t i = 0; i < n; i++) dst[i] = kvp__bf16_to_f32(load_u16(s + 2 * i));
    }
}

void kvp__store_f32(int32_t dtype, const float *src, size_t n, void *dst) {
    uint8_t *d = (uint8_t *)dst;
    if (dtype == KVP_FORMAT_FP32) {
        memcpy(dst, src, n * 4);
    } else if (dtype == KVP_FORMAT_FP16) {
        for (size_t i = 0; i < n; i++) store_u16(d + 2 * i, kvp__f32_to_f16(src[i]));
    } else {
        for (size_t i = 0; i < n; i++) store_u16(d + 2 * i, kvp__f32_to_bf16(src[i]));
    }
}
