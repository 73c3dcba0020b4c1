/*
 * Encoder primitives for AArch64 NEON (both NEON tables use them; nothing
 * here needs the dot products). The same arithmetic as the x86 ones
 * (lib/cpu/enc_x86.c), four lanes at a time: fp16 by fcvtn (round to
 * nearest even under the default FPCR; a NaN stays quiet with its
 * payload's top bits, as in the reference), bf16 and fp8 E4M3 by integer
 * rounding on the float's bits, codes by frintn.
 */
#include "cpu.h"

/* little-endian only, as the NEON kernels (kern_neon.c) */
#if defined(__aarch64__) && !defined(__AARCH64EB__) && (defined(__GNUC__) || defined(__clang__))
#include <arm_neon.h>
#include <string.h>

#define INLINE __attribute__((always_inline)) inline

static INLINE uint32x4_t finite_mask(float32x4_t x) { return vcltq_f32(vabsq_f32(x), vdupq_n_f32(INFINITY)); }

/* 8 int32 lanes (two vectors) as 8 bytes: unsigned 0..255, or signed */
static INLINE uint8x8_t narrow_u8(int32x4_t a, int32x4_t b) {
    return vqmovun_s16(vcombine_s16(vqmovn_s32(a), vqmovn_s32(b)));
}
static INLINE int8x8_t narrow_s8(int32x4_t a, int32x4_t b) {
    return vqmovn_s16(vcombine_s16(vqmovn_s32(a), vqmovn_s32(b)));
}

static void to_f16(const float *x, uint16_t *y, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        float16x8_t h = vcvt_high_f16_f32(vcvt_f16_f32(vld1q_f32(x + i)), vld1q_f32(x + i + 4));
        vst1q_u16(y + i, vreinterpretq_u16_f16(h));
    }
    for (; i < n; i++) y[i] = kvp__f32_to_f16(x[i]);
}

static INLINE uint32x4_t bf16_4(float32x4_t xf) {
    uint32x4_t x = vreinterpretq_u32_f32(xf);
    uint32x4_t nan = vcgtq_u32(vandq_u32(x, vdupq_n_u32(0x7FFFFFFFu)), vdupq_n_u32(0x7F800000u));
    uint32x4_t lsb = vandq_u32(vshrq_n_u32(x, 16), vdupq_n_u32(1));
    uint32x4_t r = vshrq_n_u32(vaddq_u32(vaddq_u32(x, vdupq_n_u32(0x7FFFu)), lsb), 16);
    uint32x4_t q = vorrq_u32(vshrq_n_u32(x, 16), vdupq_n_u32(0x40));
    return vbslq_u32(nan, q, r);
}

static void to_bf16(const float *x, uint16_t *y, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8)
        vst1q_u16(y + i, vcombine_u16(vmovn_u32(bf16_4(vld1q_f32(x + i))), vmovn_u32(bf16_4(vld1q_f32(x + i + 4)))));
    for (; i < n; i++) y[i] = kvp__f32_to_bf16(x[i]);
}

/* kvp__f32_to_e4m3(v) of 4 lanes as int32 0..255 (enc_x86.c: e4m3_8) */
static INLINE int32x4_t e4m3_4(float32x4_t v) {
    float32x4_t a = vabsq_f32(v);
    uint32x4_t ai = vreinterpretq_u32_f32(a);
    uint32x4_t sign = vshrq_n_u32(vandq_u32(vreinterpretq_u32_f32(v), vdupq_n_u32(0x80000000u)), 24);
    uint32x4_t lsb = vandq_u32(vshrq_n_u32(ai, 20), vdupq_n_u32(1));
    uint32x4_t r = vaddq_u32(vaddq_u32(ai, vdupq_n_u32(0x7FFFFu)), lsb);
    uint32x4_t normal = vsubq_u32(vshrq_n_u32(r, 20), vdupq_n_u32(120u << 3));
    uint32x4_t sub = vreinterpretq_u32_s32(vcvtq_s32_f32(vrndnq_f32(vmulq_f32(a, vdupq_n_f32(512.0f)))));
    uint32x4_t mag = vbslq_u32(vcltq_f32(a, vdupq_n_f32(0.015625f)), sub, normal);
    mag = vbslq_u32(vcgeq_f32(a, vdupq_n_f32(448.0f)), vdupq_n_u32(0x7E), mag);
    uint32x4_t ok = vceqq_f32(v, v); /* not NaN */
    return vreinterpretq_s32_u32(vandq_u32(ok, vorrq_u32(sign, mag)));
}

static void to_e4m3(const float *x, uint8_t *y, int n, float inv) {
    const float32x4_t s = vdupq_n_f32(inv);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        vst1_u8(y + i, narrow_u8(e4m3_4(vmulq_f32(vld1q_f32(x + i), s)), e4m3_4(vmulq_f32(vld1q_f32(x + i + 4), s))));
    for (; i < n; i++) y[i] = kvp__f32_to_e4m3(x[i] * inv);
}

static void from_f16(const uint16_t *x, float *y, int n) {
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        uint16x4_t h = vld1_u16(x + i);
        float32x4_t f = vcvt_f32_f16(vreinterpret_f16_u16(h));
        /* a NaN's bits as the reference keeps them (fcvtl quiets one) */
        uint32x4_t w = vmovl_u16(h);
        uint32x4_t nan = vcgtq_u32(vandq_u32(w, vdupq_n_u32(0x7FFF)), vdupq_n_u32(0x7C00));
        uint32x4_t bits = vorrq_u32(vorrq_u32(vshlq_n_u32(vandq_u32(w, vdupq_n_u32(0x8000)), 16),
                                              vdupq_n_u32(0x7F800000u)),
                                    vshlq_n_u32(vandq_u32(w, vdupq_n_u32(0x3FF)), 13));
        vst1q_f32(y + i, vbslq_f32(nan, vreinterpretq_f32_u32(bits), f));
    }
    for (; i < n; i++) y[i] = kvp__f16_to_f32(x[i]);
}

static void minmax_cols(const float *x, size_t stride, int rows, int n, float *lo, float *hi) {
    const float32x4_t pinf = vdupq_n_f32(INFINITY), ninf = vdupq_n_f32(-INFINITY);
    int d = 0;
    for (; d + 8 <= n; d += 8) {
        float32x4_t l0 = pinf, l1 = pinf, h0 = ninf, h1 = ninf;
        for (int t = 0; t < rows; t++) {
            const float *p = x + (size_t)t * stride + (size_t)d;
            float32x4_t v0 = vld1q_f32(p), v1 = vld1q_f32(p + 4);
            uint32x4_t f0 = finite_mask(v0), f1 = finite_mask(v1);
            l0 = vminq_f32(l0, vbslq_f32(f0, v0, pinf));
            l1 = vminq_f32(l1, vbslq_f32(f1, v1, pinf));
            h0 = vmaxq_f32(h0, vbslq_f32(f0, v0, ninf));
            h1 = vmaxq_f32(h1, vbslq_f32(f1, v1, ninf));
        }
        vst1q_f32(lo + d, l0);
        vst1q_f32(lo + d + 4, l1);
        vst1q_f32(hi + d, h0);
        vst1q_f32(hi + d + 4, h1);
    }
    if (d < n) kvp__enc_portable.minmax_cols(x + d, stride, rows, n - d, lo + d, hi + d);
}

static void minmax(const float *x, int n, float *lo, float *hi) {
    const float32x4_t pinf = vdupq_n_f32(INFINITY), ninf = vdupq_n_f32(-INFINITY);
    float32x4_t l = pinf, h = ninf;
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        float32x4_t v = vld1q_f32(x + i);
        uint32x4_t f = finite_mask(v);
        l = vminq_f32(l, vbslq_f32(f, v, pinf));
        h = vmaxq_f32(h, vbslq_f32(f, v, ninf));
    }
    float a, b;
    kvp__enc_portable.minmax(x + i, n - i, &a, &b);
    float la = vminvq_f32(l), hb = vmaxvq_f32(h);
    *lo = la < a ? la : a;
    *hi = hb > b ? hb : b;
}

static float absmax(const float *x, int n) {
    float32x4_t m = vdupq_n_f32(0.0f);
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        float32x4_t a = vabsq_f32(vld1q_f32(x + i));
        m = vmaxq_f32(m, vbslq_f32(vcltq_f32(a, vdupq_n_f32(INFINITY)), a, vdupq_n_f32(0.0f)));
    }
    float r = kvp__enc_portable.absmax(x + i, n - i), v = vmaxvq_f32(m);
    return v > r ? v : r;
}

/* kvp__asym_code of 4 lanes as int32 (enc_x86.c: asym_8) */
static INLINE int32x4_t asym_4(float32x4_t v, float32x4_t mn, float32x4_t inv, float32x4_t lv) {
    float32x4_t x = vbslq_f32(vceqq_f32(v, v), v, vdupq_n_f32(0.0f)); /* NaN -> 0 */
    float32x4_t c = vrndnq_f32(vmulq_f32(vsubq_f32(x, mn), inv));
    /* !(c >= 0) -> 0 (NaN included), then at most lv */
    c = vbslq_f32(vcgeq_f32(c, vdupq_n_f32(0.0f)), c, vdupq_n_f32(0.0f));
    c = vbslq_f32(vcgtq_f32(c, lv), lv, c);
    c = vbslq_f32(vceqq_f32(x, vdupq_n_f32(INFINITY)), lv, c);
    c = vbslq_f32(vceqq_f32(x, vdupq_n_f32(-INFINITY)), vdupq_n_f32(0.0f), c);
    return vcvtq_s32_f32(c);
}

static void asym_codes(const float *x, int n, const float *mn, const float *inv, const float *lv,
                       uint8_t *c) {
    int i = 0;
    for (; i + 8 <= n; i += 8)
        vst1_u8(c + i, narrow_u8(asym_4(vld1q_f32(x + i), vld1q_f32(mn + i), vld1q_f32(inv + i), vld1q_f32(lv + i)),
                                 asym_4(vld1q_f32(x + i + 4), vld1q_f32(mn + i + 4), vld1q_f32(inv + i + 4),
                                        vld1q_f32(lv + i + 4))));
    if (i < n) kvp__enc_portable.asym_codes(x + i, n - i, mn + i, inv + i, lv + i, c + i);
}

static void asym_codes1(const float *x, int n, float mn, float inv, float lv, uint8_t *c) {
    const float32x4_t m = vdupq_n_f32(mn), s = vdupq_n_f32(inv), l = vdupq_n_f32(lv);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        vst1_u8(c + i, narrow_u8(asym_4(vld1q_f32(x + i), m, s, l), asym_4(vld1q_f32(x + i + 4), m, s, l)));
    if (i < n) kvp__enc_portable.asym_codes1(x + i, n - i, mn, inv, lv, c + i);
}

static INLINE int32x4_t sym8_4(float32x4_t v, float32x4_t s) {
    const float32x4_t top = vdupq_n_f32(127.0f), bot = vdupq_n_f32(-127.0f);
    float32x4_t r = vminq_f32(vmaxq_f32(vrndnq_f32(vmulq_f32(v, s)), bot), top);
    /* +-Inf: +-127 whatever the scale; NaN: 0 (vmaxq would keep it) */
    uint32x4_t inf = vceqq_f32(vabsq_f32(v), vdupq_n_f32(INFINITY));
    r = vbslq_f32(inf, vbslq_f32(vcltq_f32(v, vdupq_n_f32(0.0f)), bot, top), r);
    r = vbslq_f32(vceqq_f32(v, v), r, vdupq_n_f32(0.0f));
    return vcvtq_s32_f32(r);
}

static void sym8_codes(const float *x, int n, float inv, int8_t *c) {
    const float32x4_t s = vdupq_n_f32(inv);
    int i = 0;
    for (; i + 8 <= n; i += 8) vst1_s8(c + i, narrow_s8(sym8_4(vld1q_f32(x + i), s), sym8_4(vld1q_f32(x + i + 4), s)));
    if (i < n) kvp__enc_portable.sym8_codes(x + i, n - i, inv, c + i);
}

static int nonfinite(const float *x, int n) {
    uint32x4_t acc = vdupq_n_u32(0);
    int i = 0;
    for (; i + 4 <= n; i += 4) /* not (|x| < Inf): NaN and +-Inf; each lane adds 1 */
        acc = vsubq_u32(acc, vmvnq_u32(finite_mask(vld1q_f32(x + i))));
    return (int)vaddvq_u32(acc) + kvp__enc_portable.nonfinite(x + i, n - i);
}

/* 8 rows of 16-bit values as columns: 8 x 8 blocks transposed by trn1/trn2
 * at 16, 32 and 64 bits, one 16-byte store per column */
static void cols16(const uint16_t *h, size_t hs, int m, int n, uint16_t *out, size_t os) {
    int d = 0;
    if (m == 8)
        for (; d + 8 <= n; d += 8) {
            uint16x8_t r[8];
            uint32x4_t t[8];
            uint64x2_t u[8];
            for (int j = 0; j < 8; j++) r[j] = vld1q_u16(h + (size_t)j * hs + (size_t)d);
            for (int j = 0; j < 8; j += 2) { /* rows j, j+1: even columns, odd columns */
                t[j] = vreinterpretq_u32_u16(vtrn1q_u16(r[j], r[j + 1]));
                t[j + 1] = vreinterpretq_u32_u16(vtrn2q_u16(r[j], r[j + 1]));
            }
            for (int j = 0; j < 8; j += 4) /* rows j..j+3: columns 0,4 / 2,6 / 1,5 / 3,7 */
                for (int k = 0; k < 2; k++) {
                    u[j + k] = vreinterpretq_u64_u32(vtrn1q_u32(t[j + k], t[j + 2 + k]));
                    u[j + 2 + k] = vreinterpretq_u64_u32(vtrn2q_u32(t[j + k], t[j + 2 + k]));
                }
            /* u[0]: rows 0-3, columns 0,4; u[1]: 1,5; u[2]: 2,6; u[3]: 3,7; u[4..7]: rows 4-7 */
            for (int c = 0; c < 4; c++) {
                vst1q_u16(out + (size_t)(d + c) * os, vreinterpretq_u16_u64(vtrn1q_u64(u[c], u[4 + c])));
                vst1q_u16(out + (size_t)(d + c + 4) * os, vreinterpretq_u16_u64(vtrn2q_u64(u[c], u[4 + c])));
            }
        }
    if (d < n) kvp__enc_portable.cols16(h + d, hs, m, n - d, out + (size_t)d * os, os);
}

const kvp__enc_prims kvp__enc_neon = {"neon",  to_f16, to_bf16,    to_e4m3,     from_f16,   minmax_cols,
                                      minmax,  absmax, asym_codes, asym_codes1, sym8_codes, nonfinite, cols16};

#else
/* not built for this target: kvp__pick_enc() gives the portable primitives */
const kvp__enc_prims kvp__enc_neon = {"neon", NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
#endif
