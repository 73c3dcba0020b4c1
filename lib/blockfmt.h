/*
 * Block formats: the bytes of one (page, layer, kv head) K or V block, as
 * docs/formats.md defines them. This is the backend-independent reference
 * codec: the CPU kernels read these bytes directly, and the CUDA backend is
 * tested against these functions.
 */
#ifndef KVPAGE_BLOCKFMT_H
#define KVPAGE_BLOCKFMT_H

#include "internal.h"
#include "numeric.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What one block holds. `order` matters for plain-element keys only. */
typedef struct {
    int32_t format;    /* kvp_format */
    int32_t is_key;    /* 1: K block, 0: V block */
    int32_t order;     /* kvp_k_order for plain-element keys; token-major otherwise */
    int32_t page_size; /* tokens per block (P) */
    int32_t head_dim;  /* channels per token (D) */
    int32_t rot;       /* 1: rows are stored in the rotated basis (kvp__rot_forward) */
} kvp__blockfmt;

/* int4 values are quantized per token in groups of this many channels. */
#define KVP__V4_GROUP 32
/* Tokens interleaved in a token group of int8/int4 values. */
#define KVP__V_TOKGROUP 4
/* fp8 calibration maps amax to 448 / this headroom: e4m3 keeps its relative
 * precision down to 2^-6 of its range, so a wide margin for later, larger
 * rows costs almost nothing (and the first append may be a single token). */
#define KVP__FP8_HEADROOM 8.0f

KVP__HD static inline kvp__blockfmt kvp__blockfmt_make(int32_t format, int32_t is_key,
                                               int32_t order, int32_t page_size,
                                               int32_t head_dim) {
    kvp__blockfmt f;
    f.format = format;
    f.is_key = is_key;
    f.order = order;
    f.page_size = page_size;
    f.head_dim = head_dim;
    f.rot = !is_key && format == KVP_FORMAT_INT4;
    return f;
}

/* Plain element formats: one value per element, no per-block scale data. */
KVP__HD static inline bool kvp__format_is_plain(int32_t f) {
    return f == KVP_FORMAT_FP32 || f == KVP_FORMAT_FP16 || f == KVP_FORMAT_BF16 ||
           f == KVP_FORMAT_FP8_E4M3;
}
/* Element size of a plain format in bytes. */
KVP__HD static inline int kvp__plain_size(int32_t f) {
    return f == KVP_FORMAT_FP32 ? 4 : f == KVP_FORMAT_FP8_E4M3 ? 1 : 2;
}
/* Key order of a block: dim-major only for plain keys stored that way. */
KVP__HD static inline bool kvp__blockfmt_dim_major(const kvp__blockfmt *f) {
    return f->is_key && kvp__format_is_plain(f->format) && f->order == KVP_K_ORDER_DIM_MAJOR;
}
/* Number of int4 value groups along head_dim. */
KVP__HD static inline int kvp__v4_groups(int32_t head_dim) {
    return (head_dim + KVP__V4_GROUP - 1) / KVP__V4_GROUP;
}
/* Tokens quantized together (a whole page for per-channel keys). */
KVP__HD static inline bool kvp__blockfmt_per_page(const kvp__blockfmt *f) {
    return f->is_key && (f->format == KVP_FORMAT_INT8 || KVP__IS_INT4(f->format));
}

/* Byte offset of the element data of (token t, channel d) in a plain block. */
KVP__HD static inline uint64_t kvp__plain_offset(const kvp__blockfmt *f, int t, int d) {
    uint64_t idx = kvp__blockfmt_dim_major(f) ? (uint64_t)d * (uint64_t)f->page_size + (uint64_t)t
                                              : (uint64_t)t * (uint64_t)f->head_dim + (uint64_t)d;
    return idx * (uint64_t)kvp__plain_size(f->format);
}

/* Bytes of element data (scale data follows at this offset). */
KVP__HD static inline uint64_t kvp__block_data_bytes(const kvp__blockfmt *f) {
    uint64_t elems = (uint64_t)f->page_size * (uint64_t)f->head_dim;
    if (kvp__format_is_plain(f->format)) return elems * (uint64_t)kvp__plain_size(f->format);
    return f->format == KVP_FORMAT_INT8 ? elems : elems / 2;
}

/* ---- element addressing of the quantized layouts (docs/formats.md) -------- */

/* int8 keys: channel quads, [D/4][P][4]: the 4 bytes of a 32-bit lane are
 * four consecutive channels of one token (what vpdpbusd/dp4a multiply). */
KVP__HD static inline uint64_t kvp__k8_offset(int P, int t, int d) {
    return (uint64_t)(d / 4) * (uint64_t)P * 4 + (uint64_t)t * 4 + (uint64_t)(d % 4);
}
/* int4 keys: the int8 layout with tokens 2i (low nibble) and 2i+1 (high
 * nibble) sharing a byte: [D/4][P/2][4]. */
KVP__HD static inline uint64_t kvp__k4_offset(int P, int t, int d, int *high) {
    *high = t & 1;
    return (uint64_t)(d / 4) * (uint64_t)(P / 2) * 4 + (uint64_t)(t / 2) * 4 + (uint64_t)(d % 4);
}
/* Tokens in the token group of t (4, or fewer for the last group of a page
 * whose size is not a multiple of 4). */
KVP__HD static inline int kvp__v_group_tokens(int P, int t) {
    int u = P - t / KVP__V_TOKGROUP * KVP__V_TOKGROUP;
    return u > KVP__V_TOKGROUP ? KVP__V_TOKGROUP : u;
}
/* int8 values: token groups of 4 (the last may be shorter, u tokens), each
 * [D][u]: the bytes of a 32-bit lane are four tokens of one channel. */
KVP__HD static inline uint64_t kvp__v8_offset(int P, int D, int t, int d) {
    int g = t / KVP__V_TOKGROUP, u = kvp__v_group_tokens(P, t);
    return (uint64_t)g * KVP__V_TOKGROUP * (uint64_t)D + (uint64_t)d * (uint64_t)u +
           (uint64_t)(t % KVP__V_TOKGROUP);
}
/* Width of int4 value group g (32, or what is left of head_dim). */
KVP__HD static inline int kvp__v4_width(int D, int g) {
    int w = D - g * KVP__V4_GROUP;
    return w > KVP__V4_GROUP ? KVP__V4_GROUP : w;
}
/* int4 values: the int8 layout with channels i (low nibble) and i + W/2
 * (high nibble) of each 32-wide scale group (W = its width) sharing a byte. */
KVP__HD static inline uint64_t kvp__v4_offset(int P, int D, int t, int d, int *high) {
    int g = t / KVP__V_TOKGROUP, u = kvp__v_group_tokens(P, t);
    int k = d / KVP__V4_GROUP, i = d % KVP__V4_GROUP, w = kvp__v4_width(D, k);
    *high = i >= w / 2;
    int slot = k * (KVP__V4_GROUP / 2) + (*high ? i - w / 2 : i);
    return (uint64_t)g * KVP__V_TOKGROUP * (uint64_t)D / 2 + (uint64_t)slot * (uint64_t)u +
           (uint64_t)(t % KVP__V_TOKGROUP);
}

KVP__HD static inline uint16_t kvp__load_u16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}
KVP__HD static inline void kvp__store_u16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }

/* ---- the scale rules (docs/formats.md "Quantization rules") ---------------- */

/* An fp16 scale or minimum: fp32 value rounded to nearest even, clamped to
 * the finite fp16 range so a huge range saturates instead of becoming Inf. */
KVP__HD static inline uint16_t kvp__f16_saturating(float v) {
    if (v > 65504.0f) v = 65504.0f;
    if (v < -65504.0f) v = -65504.0f;
    return kvp__f32_to_f16(v);
}

/* Asymmetric quantization to codes 0..levels, from the range [lo, hi] of a
 * group's finite values (lo > hi: none is finite). */
typedef struct {
    float scale, min, inv;
    uint16_t scale16, min16;
} kvp__asym;

KVP__HD static inline kvp__asym kvp__asym_make(float lo, float hi, int levels) {
    if (lo > hi) lo = hi = 0.0f; /* no finite value */
    kvp__asym a;
    a.scale16 = kvp__f16_saturating((hi - lo) / (float)levels);
    a.min16 = kvp__f16_saturating(lo);
    a.scale = kvp__f16_to_f32(a.scale16);
    a.min = kvp__f16_to_f32(a.min16);
    a.inv = a.scale > 0.0f ? 1.0f / a.scale : 0.0f;
    return a;
}

/* NaN encodes as the code nearest 0.0, +Inf as `levels`, -Inf as 0. */
KVP__HD static inline unsigned kvp__asym_code(const kvp__asym *a, float v, int levels) {
    if (isnan(v)) v = 0.0f;
    if (v == INFINITY) return (unsigned)levels;
    if (v == -INFINITY) return 0;
    float c = kvp__rne((v - a->min) * a->inv);
    if (!(c >= 0.0f)) c = 0.0f;
    if (c > (float)levels) c = (float)levels;
    return (unsigned)c;
}

/* Symmetric int8 (values per token): the fp16 scale of a row whose finite
 * values have max |x| = amax, and the code of one element. */
KVP__HD static inline uint16_t kvp__sym8_scale16(float amax) {
    return kvp__f16_saturating(amax / 127.0f);
}
KVP__HD static inline float kvp__sym8_inv(uint16_t s16) {
    float s = kvp__f16_to_f32(s16);
    return s > 0.0f ? 1.0f / s : 0.0f;
}
KVP__HD static inline int8_t kvp__sym8_code(float v, float inv) {
    float c;
    if (isnan(v)) c = 0.0f;
    else if (isinf(v)) c = v > 0 ? 127.0f : -127.0f;
    else {
        c = kvp__rne(v * inv);
        if (c > 127.0f) c = 127.0f;
        if (c < -127.0f) c = -127.0f;
    }
    return (int8_t)c;
}

/* ---- the rotated basis of int4 values (docs/formats.md, "int4 values") -------- */

/* The channels of a row split into blocks whose sizes are the set bits of
 * head_dim, largest first (80 = 64 + 16). Each block is multiplied by a
 * Walsh-Hadamard matrix after fixed sign flips of its channels: an
 * orthogonal map up to a power-of-two factor, which spreads a channel of
 * large values over the block before the values are quantized. */

/* Whether channel d's sign is flipped (a fixed hash of d). */
KVP__HD static inline int kvp__rot_neg(int d) {
    uint32_t h = (uint32_t)d * 0x9E3779B1u;
    h ^= h >> 15;
    h *= 0x2C1B3C6Du;
    h ^= h >> 12;
    return (int)(h >> 31);
}
/* Size of the block that starts at channel `base` of a D-channel row. */
KVP__HD static inline int kvp__rot_block(int D, int base) {
    int left = D - base, b = 1;
    while (b * 2 <= left) b *= 2;
    return b;
}
/* The power of two a block of size B = 2^k is multiplied by after the
 * transform: 2^-floor(k/2) going into the basis, 2^-ceil(k/2) coming back,
 * so that the two maps are exact inverses in exact arithmetic. */
KVP__HD static inline float kvp__rot_scale(int B, int inverse) {
    int k = 0;
    while ((1 << k) < B) k++;
    return 1.0f / (float)(1 << (inverse ? (k + 1) / 2 : k / 2));
}
/* Unnormalized fast Walsh-Hadamard transform of n floats: stages of pair
 * distance 1, 2, 4, ...; (a, b) -> (a + b, a - b). Every backend keeps this
 * order of operations, so the rotated values are the same bits everywhere. */
KVP__HD static inline void kvp__rot_fwht(float *x, int n) {
    for (int len = 1; len < n; len *= 2)
        for (int i = 0; i < n; i += 2 * len)
            for (int j = i; j < i + len; j++) {
                float a = x[j], b = x[j + len];
                x[j] = a + b;
                x[j + len] = a - b;
            }
}
/* A row of D values into the rotated basis, in place: signs, transform,
 * scale. A non-finite value counts as 0 (it would spread over its block). */
KVP__HD static inline void kvp__rot_forward(float *x, int D) {
    for (int d = 0; d < D; d++) {
        if (!isfinite(x[d])) x[d] = 0.0f;
        if (kvp__rot_neg(d)) x[d] = -x[d];
    }
    for (int base = 0; base < D;) {
        int B = kvp__rot_block(D, base);
        float k = kvp__rot_scale(B, 0);
        kvp__rot_fwht(x + base, B);
        for (int d = base; d < base + B; d++) x[d] *= k;
        base += B;
    }
}
/* A row of the rotated basis back to D values, in place: kvp__rot_forward's inverse. */
KVP__HD static inline void kvp__rot_inverse(float *x, int D) {
    for (int base = 0; base < D;) {
        int B = kvp__rot_block(D, base);
        float k = kvp__rot_scale(B, 1);
        kvp__rot_fwht(x + base, B);
        for (int d = base; d < base + B; d++) x[d] *= k;
        base += B;
    }
    for (int d = 0; d < D; d++)
        if (kvp__rot_neg(d)) x[d] = -x[d];
}

/* int4 keys' outlier table (docs/formats.md): after scale[D], min[D],
 * idx[R] (u16), oscale[R], omin[R] (fp16), then the u8 codes at
 * kvp__k4_code_offset. */
KVP__HD static inline const uint8_t *kvp__k4_table(const kvp__blockfmt *f, const uint8_t *b) {
    return b + kvp__block_data_bytes(f) + 4 * (size_t)f->head_dim;
}

/* Whether a format's outlier codes are in channel quads [R/4][P][4], the
 * int8 keys' layout (4 entries of one token in a 32-bit word): int4's;
 * int4_v1 keeps [R][P]. */
KVP__HD static inline bool kvp__k4_quads(int32_t format) { return format == KVP_FORMAT_INT4; }

/* Where outlier entry j's code of token t sits in the codes (after the
 * table's 6R bytes). */
KVP__HD static inline size_t kvp__k4_code_offset(int32_t format, int P, int j, int t) {
    if (kvp__k4_quads(format)) return ((size_t)(j / 4) * (size_t)P + (size_t)t) * 4 + (size_t)(j % 4);
    return (size_t)j * (size_t)P + (size_t)t;
}

/* The R channels of widest range, in increasing channel order (ties: the
 * lower channel): what both backends' encoders pick. O(D*R). */
KVP__HD static inline int kvp__k4_pick(const float *range, int D, int R, uint16_t *idx) {
    uint32_t taken[KVP_MAX_HEAD_DIM / 32] = {0};
    for (int j = 0; j < R; j++) {
        int best = -1;
        for (int d = 0; d < D; d++)
            if (!((taken[d / 32] >> (d % 32)) & 1u) && (best < 0 || range[d] > range[best])) best = d;
        taken[best / 32] |= 1u << (best % 32);
    }
    int n = 0;
    for (int d = 0; d < D; d++)
        if ((taken[d / 32] >> (d % 32)) & 1u) idx[n++] = (uint16_t)d;
    return n;
}

/* Entry of channel d in an int4 key block's outlier table, or -1. */
KVP__HD static inline int kvp__k4_find(const uint8_t *table, int R, int d) {
    for (int j = 0; j < R; j++)
        if (kvp__load_u16(table + 2 * (size_t)j) == d) return j;
    return -1;
}

/* One element (token t, channel d) of a block, as fp32: the decoding every
 * backend and kernel reproduces. Rotated values (f->rot) come out in the
 * rotated basis, as the kernels see them. */
KVP__HD static inline float kvp__block_decode_one(const kvp__blockfmt *f, const uint8_t *b, int t,
                                                  int d, float fp8_scale) {
    int P = f->page_size, D = f->head_dim, high = 0;
    const uint8_t *sc = b + kvp__block_data_bytes(f);
    switch (f->format) {
    case KVP_FORMAT_FP32: {
        float v;
        memcpy(&v, b + kvp__plain_offset(f, t, d), 4);
        return v;
    }
    case KVP_FORMAT_FP16: return kvp__f16_to_f32(kvp__load_u16(b + kvp__plain_offset(f, t, d)));
    case KVP_FORMAT_BF16: return kvp__bf16_to_f32(kvp__load_u16(b + kvp__plain_offset(f, t, d)));
    case KVP_FORMAT_FP8_E4M3: return kvp__e4m3_to_f32(b[kvp__plain_offset(f, t, d)]) * fp8_scale;
    default: break;
    }
    if (f->is_key) {
        float s = kvp__f16_to_f32(kvp__load_u16(sc + 2 * (size_t)d));
        float m = kvp__f16_to_f32(kvp__load_u16(sc + 2 * (size_t)D + 2 * (size_t)d));
        unsigned c;
        if (f->format == KVP_FORMAT_INT8) {
            c = b[kvp__k8_offset(P, t, d)];
        } else {
            const int R = KVP__K4_OUTLIERS(f->format, D);
            const uint8_t *ot = kvp__k4_table(f, b);
            int j = kvp__k4_find(ot, R, d);
            if (j >= 0) {
                float os = kvp__f16_to_f32(kvp__load_u16(ot + 2 * (size_t)(R + j)));
                float om = kvp__f16_to_f32(kvp__load_u16(ot + 2 * (size_t)(2 * R + j)));
                return fmaf(os, (float)ot[6 * (size_t)R + kvp__k4_code_offset(f->format, P, j, t)], om);
            }
            uint64_t o = kvp__k4_offset(P, t, d, &high); /* sets `high` before it is read */
            c = high ? (unsigned)(b[o] >> 4) : (unsigned)(b[o] & 0x0F);
        }
        return fmaf(s, (float)c, m);
    }
    if (f->format == KVP_FORMAT_INT8) {
        float s = kvp__f16_to_f32(kvp__load_u16(sc + 2 * (size_t)t));
        return s * (float)(int8_t)b[kvp__v8_offset(P, D, t, d)];
    }
    int G = kvp__v4_groups(D), g = d / KVP__V4_GROUP;
    size_t si = (size_t)g * (size_t)P + (size_t)t;
    float s = kvp__f16_to_f32(kvp__load_u16(sc + 2 * si));
    float m = kvp__f16_to_f32(kvp__load_u16(sc + 2 * (size_t)G * (size_t)P + 2 * si));
    uint64_t o = kvp__v4_offset(P, D, t, d, &high);
    unsigned c = high ? (unsigned)(b[o] >> 4) : (unsigned)(b[o] & 0x0F);
    return fmaf(s, (float)c, m);
}

/* Whether a block's bytes keep the invariants every encoder keeps (what
 * kvp_store_page_check() promises): int8/int4 scales finite and >= 0,
 * minimums finite, int4 keys' outlier channels increasing and below
 * head_dim. Plain formats hold any bits. 0 if they do; else -1 with the
 * reason in `why`. */
int kvp__block_check(const kvp__blockfmt *f, const uint8_t *b, char *why, size_t why_size);
/* The same for a block whose first `tokens` tokens were written (a
 * sequence's partly filled page): per-token scales past them are not read.
 * Per-channel scales (keys) cover the whole block either way. */
int kvp__block_check_tokens(const kvp__blockfmt *f, const uint8_t *b, int32_t tokens, char *why,
                            size_t why_size);

/* Element data plus scale data, before padding to KVP_BLOCK_ALIGN. */
uint64_t kvp__block_used_bytes(const kvp__blockfmt *f);

/* Non-finite values among n rows of d floats, `stride` floats apart. */
uint64_t kvp__count_nonfinite(const float *x, size_t stride, int n, int d);
/* Encode tokens [t0, t0+n) of a block from fp32 rows x[i*stride + d]
 * (rotated first where f->rot). Per-page formats (int8/int4 keys) need
 * t0 == 0 and n == page_size.
 * fp8 uses `fp8_scale` (> 0). Returns the number of non-finite inputs. */
uint64_t kvp__block_encode(const kvp__blockfmt *f, void *block, int t0, int n,
                           const float *x, size_t stride, float fp8_scale);
/* Decode tokens [t0, t0+n) into fp32 rows y[i*stride + d], as stored:
 * rotated values (f->rot) stay in the rotated basis (what kernels and
 * re-encoding into another block of the same basis use). */
void kvp__block_decode(const kvp__blockfmt *f, const void *block, int t0, int n,
                       float *y, size_t stride, float fp8_scale);
/* kvp__block_decode(), then rotated rows back to the values that were
 * encoded: what the public decoders return. */
void kvp__block_read(const kvp__blockfmt *f, const void *block, int t0, int n, float *y,
                     size_t stride, float fp8_scale);


/* Checks of kvp_quantize() / kvp_dequantize() (lib/quant.c): the block
 * format and the bytes of one block. */
int kvp__quant_check(const kvp_quant_desc_t *q, const void *src, int64_t pages, void *dst,
                     kvp__blockfmt *f, uint64_t *block, char *err, size_t err_size);

/* Convert n elements of an fp32/fp16/bf16 array to fp32 and back. */
void kvp__load_f32(int32_t dtype, const void *src, size_t n, float *dst);
void kvp__store_f32(int32_t dtype, const float *src, size_t n, void *dst);
/* Bytes of one element of an input dtype (fp32/fp16/bf16), 0 otherwise. */
KVP__HD static inline size_t kvp__dtype_size(int32_t dtype) {
    return dtype == KVP_FORMAT_FP32 ? 4
           : (dtype == KVP_FORMAT_FP16 || dtype == KVP_FORMAT_BF16) ? 2 : 0;
}

/* fp8 calibration: scale for a head whose first rows have max |x| = amax. */
KVP__HD static inline float kvp__fp8_calibrated_scale(float amax) {
    if (!(amax > 0.0f) || !isfinite(amax)) return 1.0f;
    return amax * KVP__FP8_HEADROOM / 448.0f;
}

#ifdef __cplusplus
}
#endif

#endif
