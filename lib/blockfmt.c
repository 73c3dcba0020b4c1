/*
 * The reference codec of every block format (docs/formats.md). Scalar and
 * plain on purpose: it defines the bytes, it is not a hot path (the append
 * and attention kernels have their own fast paths, tested against this).
 */
#include "blockfmt.h"

#include <string.h>

uint64_t kvp__block_used_bytes(const kvp__blockfmt *f) {
    return kvp__block_bytes(f->format, f->is_key != 0, (uint64_t)f->page_size,
                            (uint64_t)f->head_dim);
}

/* ---- the scale rules --------------------------------------------------------- */

/* Range over the finite values only (lib/blockfmt.h: kvp__asym_make). */
static kvp__asym asym_fit(const float *x, size_t stride, int n, int levels) {
    float lo = INFINITY, hi = -INFINITY;
    for (int i = 0; i < n; i++) {
        float v = x[(size_t)i * stride];
        if (!isfinite(v)) continue;
        if (v < lo) lo = v;
        if (v > hi) hi = v;
    }
    return kvp__asym_make(lo, hi, levels);
}

static inline void put_nibble(uint8_t *p, int high, unsigned v) {
    *p = high ? (uint8_t)((*p & 0x0F) | (v << 4)) : (uint8_t)((*p & 0xF0) | v);
}

uint64_t kvp__count_nonfinite(const float *x, size_t stride, int n, int d) {
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
            case KVP_FORMAT_FP16: kvp__store_u16(p, kvp__f32_to_f16(v)); break;
            case KVP_FORMAT_BF16: kvp__store_u16(p, kvp__f32_to_bf16(v)); break;
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

/* The R channels of widest range (lib/blockfmt.h: kvp__k4_pick). */
static int pick_outliers(const float *x, size_t stride, int P, int D, int R, uint16_t *idx) {
    float range[KVP_MAX_HEAD_DIM];
    for (int d = 0; d < D; d++) range[d] = finite_range(x + d, stride, P);
    return kvp__k4_pick(range, D, R, idx);
}

static void encode_key_int(const kvp__blockfmt *f, uint8_t *b, const float *x, size_t stride) {
    int P = f->page_size, D = f->head_dim;
    int levels = f->format == KVP_FORMAT_INT8 ? 255 : 15;
    uint8_t *sc = b + kvp__block_data_bytes(f), *mn = sc + 2 * (size_t)D;
    uint16_t outl[KVP__K4_MAX_OUTLIERS] = {0};
    int R = levels == 15 ? pick_outliers(x, stride, P, D, kvp__k4_outliers(f->format, D), outl) : 0;
    uint8_t *ot = mn + 2 * (size_t)D, *codes8 = ot + 6 * (size_t)R;
    for (int d = 0, j = 0; d < D; d++) {
        bool is_outlier = j < R && outl[j] == d;
        int lv = is_outlier ? 255 : levels;
        kvp__asym a = asym_fit(x + d, stride, P, lv);
        if (is_outlier) { /* int8 in the outlier table; zero in the int4 tables */
            kvp__store_u16(ot + 2 * (size_t)j, (uint16_t)d);
            kvp__store_u16(ot + 2 * (size_t)R + 2 * (size_t)j, a.scale16);
            kvp__store_u16(ot + 4 * (size_t)R + 2 * (size_t)j, a.min16);
            kvp__store_u16(sc + 2 * (size_t)d, 0);
            kvp__store_u16(mn + 2 * (size_t)d, 0);
        } else {
            kvp__store_u16(sc + 2 * (size_t)d, a.scale16);
            kvp__store_u16(mn + 2 * (size_t)d, a.min16);
        }
        for (int t = 0; t < P; t++) {
            unsigned c = kvp__asym_code(&a, x[(size_t)t * stride + (size_t)d], lv);
            if (levels == 255) {
                b[kvp__k8_offset(P, t, d)] = (uint8_t)c;
            } else {
                int high = 0;
                uint64_t o = kvp__k4_offset(P, t, d, &high);
                put_nibble(b + o, high, is_outlier ? 0u : c);
                if (is_outlier) codes8[kvp__k4_code_offset(f->format, P, j, t)] = (uint8_t)c;
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
        uint16_t s16 = kvp__sym8_scale16(amax);
        float inv = kvp__sym8_inv(s16);
        kvp__store_u16(sc + 2 * (size_t)(t0 + i), s16);
        for (int d = 0; d < D; d++)
            b[kvp__v8_offset(P, D, t0 + i, d)] = (uint8_t)kvp__sym8_code(row[d], inv);
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
            kvp__asym a = asym_fit(row + d0, 1, w, 15);
            kvp__store_u16(sc + 2 * ((size_t)g * (size_t)P + (size_t)t), a.scale16);
            kvp__store_u16(mn + 2 * ((size_t)g * (size_t)P + (size_t)t), a.min16);
            for (int d = d0; d < d0 + w; d++) {
                int high = 0;
                uint64_t o = kvp__v4_offset(P, D, t, d, &high);
                put_nibble(b + o, high, kvp__asym_code(&a, row[d], 15));
            }
        }
    }
}

uint64_t kvp__block_encode(const kvp__blockfmt *f, void *block, int t0, int n,
                           const float *x, size_t stride, float fp8_scale) {
    uint8_t *b = (uint8_t *)block;
    if (f->rot) { /* row by row through the rotated basis (per-token formats only) */
        kvp__blockfmt raw = *f;
        raw.rot = 0;
        float row[KVP_MAX_HEAD_DIM];
        for (int i = 0; i < n; i++) {
            memcpy(row, x + (size_t)i * stride, (size_t)f->head_dim * sizeof(float));
            kvp__rot_forward(row, f->head_dim);
            (void)kvp__block_encode(&raw, b, t0 + i, 1, row, (size_t)f->head_dim, fp8_scale);
        }
        if (n == 0) (void)kvp__block_encode(&raw, b, t0, 0, x, stride, fp8_scale); /* the padding */
        return kvp__count_nonfinite(x, stride, n, f->head_dim);
    }
    if (kvp__format_is_plain(f->format)) encode_plain(f, b, t0, n, x, stride, fp8_scale);
    else if (f->is_key) encode_key_int(f, b, x, stride);
    else if (f->format == KVP_FORMAT_INT8) encode_value_int8(f, b, t0, n, x, stride);
    else encode_value_int4(f, b, t0, n, x, stride);
    /* padding: zeros whatever the memory held, so that a block's bytes are the
     * same on every backend (blobs, checksums) */
    uint64_t used = kvp__block_used_bytes(f), padded = kvp__round_up_u64(used, KVP_BLOCK_ALIGN);
    memset(b + used, 0, (size_t)(padded - used));
    return kvp__count_nonfinite(x, stride, n, f->head_dim);
}

/* ---- decode --------------------------------------------------------------- */

/* fp16 bits of a finite value; of a finite value >= 0 (-0 allowed). */
static bool f16_finite(uint16_t h) { return (h & 0x7C00u) != 0x7C00u; }
static bool f16_scale_ok(uint16_t h) { return f16_finite(h) && (!(h & 0x8000u) || !(h & 0x7FFFu)); }

/* Whether `n` (scale, minimum) pairs are all well formed, four fp16 lanes
 * per 64-bit word (imported pages are checked near memory speed); the
 * slow loop below only runs to name a bad pair. Per lane: an exponent of
 * all ones (Inf, NaN) is bad, in a scale or a minimum; a set sign bit is
 * bad in a scale unless the rest is zero (-0). */
static bool pairs_ok(const uint8_t *sc, const uint8_t *mn, size_t n) {
    const uint64_t EXP = 0x7C007C007C007C00ull, LOW = 0x0001000100010001ull;
    const uint64_t SIGN = 0x8000800080008000ull, MAG = 0x7FFF7FFF7FFF7FFFull;
    uint64_t bad = 0;
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        uint64_t w, m = 0;
        memcpy(&w, sc + 2 * i, 8);
        if (mn) memcpy(&m, mn + 2 * i, 8);
        uint64_t ts = (w & EXP) ^ EXP, tm = (m & EXP) ^ EXP; /* 0 in a lane: Inf or NaN */
        bad |= (ts - LOW) & ~ts & SIGN;
        bad |= (tm - LOW) & ~tm & SIGN;
        bad |= w & SIGN & ((w & MAG) + MAG); /* negative and not -0 */
    }
    for (; i < n; i++) {
        unsigned x = kvp__load_u16(sc + 2 * i), y = mn ? kvp__load_u16(mn + 2 * i) : 0;
        bad |= ((x & 0x7C00u) == 0x7C00u) | ((x & 0x8000u) && (x & 0x7FFFu)) |
               ((y & 0x7C00u) == 0x7C00u);
    }
    return bad == 0;
}

/* `n` (scale, minimum) pairs: scales at sc, minimums at mn. -1 at the first bad one. */
static int check_pairs(const uint8_t *sc, const uint8_t *mn, size_t n, const char *what,
                       char *why, size_t why_size) {
    if (pairs_ok(sc, mn, n)) return 0;
    for (size_t i = 0; i < n; i++) {
        uint16_t s = kvp__load_u16(sc + 2 * i), m = mn ? kvp__load_u16(mn + 2 * i) : 0;
        if (!f16_scale_ok(s) || !f16_finite(m)) {
            kvp__errf(why, why_size, KVP_EINVAL, "%s %zu: scale 0x%04x / minimum 0x%04x is not "
                      "finite or the scale is negative", what, i, (unsigned)s, (unsigned)m);
            return -1;
        }
    }
    return 0;
}

int kvp__block_check(const kvp__blockfmt *f, const uint8_t *b, char *why, size_t why_size) {
    return kvp__block_check_tokens(f, b, f->page_size, why, why_size);
}

int kvp__block_check_tokens(const kvp__blockfmt *f, const uint8_t *b, int32_t tokens, char *why,
                            size_t why_size) {
    if (kvp__format_is_plain(f->format)) return 0;
    const size_t P = (size_t)f->page_size, D = (size_t)f->head_dim, T = (size_t)tokens;
    const uint8_t *sc = b + kvp__block_data_bytes(f);
    if (!f->is_key) {
        if (f->format == KVP_FORMAT_INT8) return check_pairs(sc, NULL, T, "token", why, why_size);
        size_t n = (size_t)kvp__v4_groups(f->head_dim) * P; /* [group][token] */
        for (size_t g = 0; g < n; g += P)
            if (check_pairs(sc + 2 * g, sc + 2 * (n + g), T, "group x token", why, why_size) != 0)
                return -1;
        return 0;
    }
    if (check_pairs(sc, sc + 2 * D, D, "channel", why, why_size) != 0) return -1;
    if (!kvp__format_is_int4(f->format)) return 0;
    const int R = KVP__K4_OUTLIERS(f->format, f->head_dim);
    const uint8_t *ot = kvp__k4_table(f, b);
    for (int j = 0; j < R; j++) {
        unsigned d = kvp__load_u16(ot + 2 * (size_t)j);
        if (d >= D || (j > 0 && d <= kvp__load_u16(ot + 2 * (size_t)(j - 1)))) {
            kvp__errf(why, why_size, KVP_EINVAL, "outlier entry %d: channel %u is not above the "
                      "previous one and below head_dim %zu", j, d, D);
            return -1;
        }
    }
    return check_pairs(ot + 2 * (size_t)R, ot + 4 * (size_t)R, (size_t)R, "outlier entry", why,
                       why_size);
}

/* fmaf(s, c, m) for an fp16 scale s and minimum m and a code c in 0..255,
 * without a call to the library's fmaf where the CPU's baseline has no FMA
 * instruction (x86-64): s*c + m is exact in double (s = S*2^a and m = M*2^b
 * with S, M < 2^11 and a, b in -24..5, c < 2^8: at most 49 significant
 * bits), so one rounding to float gives fmaf's result. */
static inline float fma16(float s, float c, float m) { return (float)((double)s * (double)c + (double)m); }

/* The values kvp__block_decode_one() gives, element for element (the same
 * conversions, and fmaf's results), with what a block shares worked out once per call
 * rather than per element: the format's branch, the keys' channel scales
 * and minima, the int4 keys' outlier lookups, each token's value scale. */
void kvp__block_decode(const kvp__blockfmt *f, const void *block, int t0, int n, float *y,
                       size_t stride, float fp8_scale) {
    const uint8_t *b = (const uint8_t *)block, *sc = b + kvp__block_data_bytes(f);
    const int P = f->page_size, D = f->head_dim;
    switch (f->format) {
    case KVP_FORMAT_FP32:
        for (int i = 0; i < n; i++)
            for (int d = 0; d < D; d++)
                memcpy(&y[(size_t)i * stride + (size_t)d], b + kvp__plain_offset(f, t0 + i, d), 4);
        return;
    case KVP_FORMAT_FP16:
        for (int i = 0; i < n; i++)
            for (int d = 0; d < D; d++)
                y[(size_t)i * stride + (size_t)d] = kvp__f16_to_f32(kvp__load_u16(b + kvp__plain_offset(f, t0 + i, d)));
        return;
    case KVP_FORMAT_BF16:
        for (int i = 0; i < n; i++)
            for (int d = 0; d < D; d++)
                y[(size_t)i * stride + (size_t)d] = kvp__bf16_to_f32(kvp__load_u16(b + kvp__plain_offset(f, t0 + i, d)));
        return;
    case KVP_FORMAT_FP8_E4M3:
        for (int i = 0; i < n; i++)
            for (int d = 0; d < D; d++)
                y[(size_t)i * stride + (size_t)d] = kvp__e4m3_to_f32(b[kvp__plain_offset(f, t0 + i, d)]) * fp8_scale;
        return;
    default: break;
    }
    if (f->is_key) {
        float s[KVP_MAX_HEAD_DIM], m[KVP_MAX_HEAD_DIM];
        for (int d = 0; d < D; d++) {
            s[d] = kvp__f16_to_f32(kvp__load_u16(sc + 2 * (size_t)d));
            m[d] = kvp__f16_to_f32(kvp__load_u16(sc + 2 * (size_t)D + 2 * (size_t)d));
        }
        /* head_dim is a multiple of 16: whole channel quads (kvp__k8_offset,
         * kvp__k4_offset) */
        if (f->format == KVP_FORMAT_INT8) {
            for (int i = 0; i < n; i++) {
                const uint8_t *tok = b + (size_t)(t0 + i) * 4;
                float *yi = y + (size_t)i * stride;
                for (int d = 0; d < D; d += 4) {
                    const uint8_t *w = tok + (size_t)(d / 4) * (size_t)P * 4;
                    for (int c = 0; c < 4; c++) yi[d + c] = fma16(s[d + c], (float)w[c], m[d + c]);
                }
            }
            return;
        }
        for (int i = 0; i < n; i++) {
            const int t = t0 + i, shift = (t & 1) * 4;
            const uint8_t *pair = b + (size_t)(t / 2) * 4;
            float *yi = y + (size_t)i * stride;
            for (int d = 0; d < D; d += 4) {
                const uint8_t *w = pair + (size_t)(d / 4) * (size_t)(P / 2) * 4;
                for (int c = 0; c < 4; c++) yi[d + c] = fma16(s[d + c], (float)((w[c] >> shift) & 0x0F), m[d + c]);
            }
        }
        /* the outlier channels over them, last entry first: where a table
         * repeats a channel the first entry wins (kvp__k4_find) */
        const int R = KVP__K4_OUTLIERS(f->format, D);
        const uint8_t *ot = kvp__k4_table(f, b);
        for (int j = R - 1; j >= 0; j--) {
            unsigned d = kvp__load_u16(ot + 2 * (size_t)j);
            if (d >= (unsigned)D) continue;
            float os = kvp__f16_to_f32(kvp__load_u16(ot + 2 * (size_t)(R + j)));
            float om = kvp__f16_to_f32(kvp__load_u16(ot + 2 * (size_t)(2 * R + j)));
            const uint8_t *codes = ot + 6 * (size_t)R;
            for (int i = 0; i < n; i++)
                y[(size_t)i * stride + (size_t)d] =
                    fma16(os, (float)codes[kvp__k4_code_offset(f->format, P, j, t0 + i)], om);
        }
        return;
    }
    /* values: token groups of u tokens, a channel's (or int4 slot's) bytes
     * u apart (kvp__v8_offset, kvp__v4_offset) */
    if (f->format == KVP_FORMAT_INT8) {
        for (int i = 0; i < n; i++) {
            const int t = t0 + i, u = kvp__v_group_tokens(P, t);
            const uint8_t *g = b + (size_t)(t / KVP__V_TOKGROUP) * KVP__V_TOKGROUP * (size_t)D + (size_t)(t % KVP__V_TOKGROUP);
            float s = kvp__f16_to_f32(kvp__load_u16(sc + 2 * (size_t)t));
            float *yi = y + (size_t)i * stride;
            for (int d = 0; d < D; d++) yi[d] = s * (float)(int8_t)g[(size_t)d * (size_t)u];
        }
        return;
    }
    const int G = kvp__v4_groups(D);
    for (int i = 0; i < n; i++) {
        const int t = t0 + i, u = kvp__v_group_tokens(P, t);
        const uint8_t *tg = b + (size_t)(t / KVP__V_TOKGROUP) * KVP__V_TOKGROUP * (size_t)D / 2 + (size_t)(t % KVP__V_TOKGROUP);
        float *yi = y + (size_t)i * stride;
        for (int k = 0; k < G; k++) {
            size_t si = (size_t)k * (size_t)P + (size_t)t;
            float s = kvp__f16_to_f32(kvp__load_u16(sc + 2 * si));
            float m = kvp__f16_to_f32(kvp__load_u16(sc + 2 * (size_t)G * (size_t)P + 2 * si));
            const int w = kvp__v4_width(D, k), half = w / 2, d0 = k * KVP__V4_GROUP;
            /* slot k*16 + j: channel j (low nibble) and j + w/2 (high) */
            const uint8_t *slot = tg + (size_t)k * (KVP__V4_GROUP / 2) * (size_t)u;
            for (int j = 0; j < half; j++) {
                unsigned byte = slot[(size_t)j * (size_t)u];
                yi[d0 + j] = fma16(s, (float)(byte & 0x0F), m);
                yi[d0 + half + j] = fma16(s, (float)(byte >> 4), m);
            }
        }
    }
}

void kvp__block_read(const kvp__blockfmt *f, const void *block, int t0, int n, float *y,
                     size_t stride, float fp8_scale) {
    kvp__block_decode(f, block, t0, n, y, stride, fp8_scale);
    if (f->rot)
        for (int i = 0; i < n; i++) kvp__rot_inverse(y + (size_t)i * stride, f->head_dim);
}

/* ---- plain tensors --------------------------------------------------------- */

void kvp__load_f32(int32_t dtype, const void *src, size_t n, float *dst) {
    const uint8_t *s = (const uint8_t *)src;
    if (dtype == KVP_FORMAT_FP32) {
        memcpy(dst, src, n * 4);
    } else if (dtype == KVP_FORMAT_FP16) {
        for (size_t i = 0; i < n; i++) dst[i] = kvp__f16_to_f32(kvp__load_u16(s + 2 * i));
    } else {
        for (size_t i = 0; i < n; i++) dst[i] = kvp__bf16_to_f32(kvp__load_u16(s + 2 * i));
    }
}

void kvp__store_f32(int32_t dtype, const float *src, size_t n, void *dst) {
    uint8_t *d = (uint8_t *)dst;
    if (dtype == KVP_FORMAT_FP32) {
        memcpy(dst, src, n * 4);
    } else if (dtype == KVP_FORMAT_FP16) {
        for (size_t i = 0; i < n; i++) kvp__store_u16(d + 2 * i, kvp__f32_to_f16(src[i]));
    } else {
        for (size_t i = 0; i < n; i++) kvp__store_u16(d + 2 * i, kvp__f32_to_bf16(src[i]));
    }
}
