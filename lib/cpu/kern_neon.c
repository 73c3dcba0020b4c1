/*
 * ARM64 Advanced SIMD (NEON) kernel stages: two tables, KVP_ISA_NEON for
 * every AArch64 CPU and KVP_ISA_NEON_DOTPROD where the ARMv8.2 dot
 * products exist (lib/cpu/isa.c asks the kernel's hwcaps).
 *
 * Float formats: eight elements converted per load (fp16 by fcvtl, bf16 by
 * a widening shift, fp8 E4M3 through fp16 bits as the x86 paths do it) and
 * multiplied with fmla by lane, so one register of query (or probability)
 * values feeds four channels' (tokens') FMAs and the tile's 4 rows share
 * every K/V load. int8 and int4 keys and values: integer dot products of
 * the codes against a quantized query or quantized probabilities, exact in
 * int32, the same arithmetic as the AVX-512 kernels:
 *   - int8 keys: the query folded with the channel scales, 15 bits as two
 *     signed 8-bit parts (128*qh + ql); the codes shifted to signed
 *     (c - 128), the shift's share (128 * sum x) put back in integer;
 *   - int4 keys: an 8-bit query against the 4-bit codes;
 *   - int8 values: probabilities times token scales, 14 bits as two parts;
 *   - int4 values: probabilities times scales as 8 bits shifted to signed,
 *     the codes centred (c - 8), the shift's share (128 * the codes' sum,
 *     one dot product per load for all rows) put back in integer.
 * The integer stages are written once (kern_neon_int.h) and built twice:
 * with sdot for KVP_ISA_NEON_DOTPROD, and with the same 4-way sums made of
 * widening multiplies (smull, pairwise adds) for cores without it. Both
 * give the same integers, so the two tables' results are identical.
 */
#include "cpu.h"

/* little-endian only: the loads reinterpret bytes as lanes */
#if defined(__aarch64__) && !defined(__AARCH64EB__) && (defined(__GNUC__) || defined(__clang__))
#include <arm_neon.h>
#include <string.h>

#define R KVP__TILE_ROWS
/* the format-generic helpers are specialized per format by inlining */
#define INLINE __attribute__((always_inline)) inline
#define UNROLL _Pragma("GCC unroll 8")
/* into L2, as the x86 kernels' prefetcht1 (lib/cpu/attn.c sets the lead) */
#define PREFETCH(p) __builtin_prefetch((const void *)(p), 0, 2)

/* ---- helpers ---------------------------------------------------------------------------- */

/* 8 plain elements at p as fp32 (lo: 0-3, hi: 4-7); fp8 comes out as
 * value / (256 * scale) (plain_unit puts the factor back). Byte loads: no
 * alignment is assumed. */
static INLINE void load8(int fmt, const uint8_t *p, float32x4_t *lo, float32x4_t *hi) {
    switch (fmt) {
    case KVP_FORMAT_FP32:
        *lo = vreinterpretq_f32_u8(vld1q_u8(p));
        *hi = vreinterpretq_f32_u8(vld1q_u8(p + 16));
        return;
    case KVP_FORMAT_FP16: {
        float16x8_t h = vreinterpretq_f16_u8(vld1q_u8(p));
        *lo = vcvt_f32_f16(vget_low_f16(h));
        *hi = vcvt_high_f32_f16(h);
        return;
    }
    case KVP_FORMAT_BF16: {
        uint16x8_t h = vreinterpretq_u16_u8(vld1q_u8(p));
        *lo = vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(h), 16));
        *hi = vreinterpretq_f32_u32(vshll_high_n_u16(h, 16));
        return;
    }
    default: { /* E4M3: exponent and mantissa under fp16's (bias 7 -> 15: x 2^8), sign moved */
        uint16x8_t b = vmovl_u8(vld1_u8(p));
        uint16x8_t h = vorrq_u16(vshlq_n_u16(vandq_u16(b, vdupq_n_u16(0x7F)), 7),
                                 vshlq_n_u16(vandq_u16(b, vdupq_n_u16(0x80)), 8));
        float16x8_t x = vreinterpretq_f16_u16(h);
        *lo = vcvt_f32_f16(vget_low_f16(x));
        *hi = vcvt_high_f32_f16(x);
        return;
    }
    }
}

/* The first n (< 8) elements at p, zeros after: reads only those. */
static INLINE void load8_part(int fmt, const uint8_t *p, int n, float32x4_t *lo, float32x4_t *hi) {
    uint8_t tmp[32] = {0};
    memcpy(tmp, p, (size_t)n * (size_t)kvp__plain_size(fmt));
    load8(fmt, tmp, lo, hi);
}

/* n elements at p, n of them valid (any n >= 0; past n: zeros). */
static INLINE void load8_n(int fmt, const uint8_t *p, int n, float32x4_t *lo, float32x4_t *hi) {
    if (n >= 8) load8(fmt, p, lo, hi);
    else if (n > 0) load8_part(fmt, p, n, lo, hi);
    else *lo = *hi = vdupq_n_f32(0.0f);
}

static inline float plain_unit(int32_t fmt, float fp8_scale) {
    return fmt == KVP_FORMAT_FP8_E4M3 ? 256.0f * fp8_scale : 1.0f;
}

/* The first n lanes of v to dst (n >= 4: all four). */
static inline void store4_n(float *dst, float32x4_t v, int n) {
    if (n >= 4) {
        vst1q_f32(dst, v);
    } else if (n > 0) {
        float tmp[4];
        vst1q_f32(tmp, v);
        memcpy(dst, tmp, (size_t)n * sizeof(float));
    }
}

/* 4 fp16 values at p (byte address) as fp32. */
static inline float32x4_t load_h4(const uint8_t *p) {
    return vcvt_f32_f16(vreinterpret_f16_u8(vld1_u8(p)));
}

/* a[r][j] += kv[j] * q[r][lane] for 4 rows and 4 vectors (lane: a constant). */
#define FMA_4X4_LANE(a, kv, q, lane)                                                               \
    UNROLL for (int r_ = 0; r_ < 4; r_++) UNROLL for (int j_ = 0; j_ < 4; j_++)                    \
        a[r_][j_] = vfmaq_laneq_f32(a[r_][j_], kv[j_], q[r_], lane)

/* a[r][j] += kv[j] * sc(r) for 4 rows and 4 vectors (sc: a macro of the row). */
#define FMA_4X4_N(a, kv, sc)                                                                       \
    UNROLL for (int r_ = 0; r_ < 4; r_++) UNROLL for (int j_ = 0; j_ < 4; j_++)                    \
        a[r_][j_] = vfmaq_n_f32(a[r_][j_], kv[j_], sc(r_))

/* exp(x) for x <= 0, |rel err| < 2e-7 (the x86 kernels' polynomial); the
 * caller zeroes what it masked (here -inf gives 2^-126-ish, not 0). */
static inline float32x4_t exp4(float32x4_t x) {
    x = vmaxq_f32(x, vdupq_n_f32(-87.0f));
    float32x4_t n = vrndnq_f32(vmulq_f32(x, vdupq_n_f32(1.44269504088896341f)));
    float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(0.693145751953125f));
    r = vfmsq_f32(r, n, vdupq_n_f32(1.428606765330187e-06f));
    float32x4_t p = vdupq_n_f32(1.0f / 720.0f);
    p = vfmaq_f32(vdupq_n_f32(1.0f / 120.0f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f / 24.0f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f / 6.0f), p, r);
    p = vfmaq_f32(vdupq_n_f32(0.5f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
    /* 2^n for n in [-126, 0]: exponent bits; smaller n already clamped */
    int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
    return vmulq_f32(p, vreinterpretq_f32_s32(e));
}

/* Lanes i (0..3) + base valid: base + i < n and lo <= pos0 + base + i <= hi. */
static inline uint32x4_t visible4(int base, int n, int32_t pos0, int32_t lo, int32_t hi) {
    const int32_t iota[4] = {0, 1, 2, 3};
    int32x4_t idx = vaddq_s32(vld1q_s32(iota), vdupq_n_s32(base));
    int32x4_t pos = vaddq_s32(idx, vdupq_n_s32(pos0));
    return vandq_u32(vcltq_s32(idx, vdupq_n_s32(n)),
                     vandq_u32(vcgeq_s32(pos, vdupq_n_s32(lo)), vcleq_s32(pos, vdupq_n_s32(hi))));
}

/* ---- K: plain formats ------------------------------------------------------------------------ */

static void kprep_plain(kvp__tile *t, const uint8_t *kb, const kvp__blockfmt *f) {
    (void)kb;
    const float u = plain_unit(f->format, t->fp8_k);
    for (int r = 0; r < R; r++)
        for (int d = 0; d < t->D; d += 4) vst1q_f32(&t->qf[r][d], vmulq_n_f32(vld1q_f32(&t->q[r][d]), u));
}

/* dim-major [D][P]: 16 tokens per pass, 4 rows x 4 vectors of accumulators;
 * 4 channels' query values in one register per row, taken by lane. A
 * partial pass reads a zero-padded copy of its tokens, so that the loop
 * has no call (around which the accumulators would be spilled). */
static INLINE void klogits_dm(int fmt, kvp__tile *t, const uint8_t *kb, const kvp__blockfmt *f,
                              int t0, int n) {
    const int es = kvp__plain_size(fmt), P = f->page_size, D = t->D;
    uint8_t pad[KVP__ATTN_MAX_D * 16 * 4];
    for (int c0 = 0; c0 < n; c0 += 16) {
        const int w = n - c0 < 16 ? n - c0 : 16;
        const uint8_t *base = kb + (size_t)(t0 + c0) * (size_t)es;
        size_t row = (size_t)P * (size_t)es;
        if (w < 16) {
            const size_t rb = 16 * (size_t)es, wb = (size_t)w * (size_t)es;
            for (int d = 0; d < D; d++) {
                memcpy(pad + (size_t)d * rb, base + (size_t)d * row, wb);
                memset(pad + (size_t)d * rb + wb, 0, rb - wb);
            }
            base = pad;
            row = rb;
        }
        float32x4_t a[R][4];
        UNROLL for (int r = 0; r < R; r++) a[r][0] = a[r][1] = a[r][2] = a[r][3] = vdupq_n_f32(0.0f);
        for (int d = 0; d < D; d += 4) {
            float32x4_t q[R];
            UNROLL for (int r = 0; r < R; r++) q[r] = vld1q_f32(&t->qf[r][d]);
#define KCH(k)                                                                                     \
    do {                                                                                           \
        const uint8_t *p = base + (size_t)(d + (k)) * row;                                         \
        PREFETCH(p + t->pf_k);                                                                     \
        float32x4_t kv[4];                                                                         \
        load8(fmt, p, &kv[0], &kv[1]);                                                             \
        load8(fmt, p + 8 * es, &kv[2], &kv[3]);                                                    \
        FMA_4X4_LANE(a, kv, q, k);                                                                 \
    } while (0)
            KCH(0);
            KCH(1);
            KCH(2);
            KCH(3);
#undef KCH
        }
        UNROLL for (int r = 0; r < R; r++)
            for (int j = 0; j < 4; j++) vst1q_f32(&t->logits[r][c0 + 4 * j], a[r][j]);
    }
}

/* token-major [P][D]: one dot product per token and row. */
static INLINE void klogits_tm(int fmt, kvp__tile *t, const uint8_t *kb, int t0, int n) {
    const int es = kvp__plain_size(fmt), D = t->D;
    for (int i = 0; i < n; i++) {
        const uint8_t *p = kb + (size_t)(t0 + i) * (size_t)D * (size_t)es;
        float32x4_t a[R][2];
        UNROLL for (int r = 0; r < R; r++) a[r][0] = a[r][1] = vdupq_n_f32(0.0f);
        for (int d = 0; d < D; d += 8) {
            float32x4_t k0, k1;
            load8(fmt, p + (size_t)d * (size_t)es, &k0, &k1);
            UNROLL for (int r = 0; r < R; r++) {
                a[r][0] = vfmaq_f32(a[r][0], vld1q_f32(&t->qf[r][d]), k0);
                a[r][1] = vfmaq_f32(a[r][1], vld1q_f32(&t->qf[r][d + 4]), k1);
            }
        }
        UNROLL for (int r = 0; r < R; r++) t->logits[r][i] = vaddvq_f32(vaddq_f32(a[r][0], a[r][1]));
    }
}

/* ---- softmax ------------------------------------------------------------------------------------ */

/* n <= 4 * KVP__CHUNK (four pages as one chunk); p written for the whole
 * 4-token vectors, 0 where masked. */
static void softmax_neon(kvp__tile *t, int n, int32_t pos0) {
    const float32x4_t ninf = vdupq_n_f32(-INFINITY);
    const int nv = (n + 3) / 4;
    for (int r = 0; r < R; r++) {
        float *x = t->logits[r], *pr = t->p[r];
        if (t->soft_cap > 0.0f)
            for (int i = 0; i < n; i++) x[i] = t->soft_cap * tanhf(x[i] / t->soft_cap);
        float32x4_t cm = ninf;
        for (int j = 0; j < nv; j++) {
            uint32x4_t ok = visible4(4 * j, n, pos0, t->lo[r], t->hi[r]);
            float32x4_t v = vbslq_f32(ok, vld1q_f32(x + 4 * j), ninf);
            vst1q_f32(x + 4 * j, v);
            cm = vmaxq_f32(cm, v);
        }
        float cmax = vmaxvq_f32(cm), m_new = t->m[r] > cmax ? t->m[r] : cmax;
        if (m_new == -INFINITY) {
            memset(pr, 0, sizeof t->p[r]);
            t->pmax[r] = 0.0f;
            continue;
        }
        float alpha = t->m[r] == m_new ? 1.0f : expf(t->m[r] - m_new);
        t->pmax[r] = cmax == m_new ? 1.0f : expf(cmax - m_new);
        if (alpha != 1.0f) {
            float *o = t->o + (size_t)r * (size_t)t->D;
            for (int d = 0; d < t->D; d += 4) vst1q_f32(o + d, vmulq_n_f32(vld1q_f32(o + d), alpha));
        }
        const float32x4_t mv = vdupq_n_f32(m_new), zero = vdupq_n_f32(0.0f);
        float32x4_t sum = zero;
        for (int j = 0; j < nv; j++) {
            float32x4_t v = vld1q_f32(x + 4 * j);
            float32x4_t p = vbslq_f32(vceqq_f32(v, ninf), zero, exp4(vsubq_f32(v, mv)));
            vst1q_f32(pr + 4 * j, p);
            sum = vaddq_f32(sum, p);
        }
        t->l[r] = t->l[r] * alpha + vaddvq_f32(sum);
        t->m[r] = m_new;
    }
}

/* ---- V: plain formats (token-major) --------------------------------------------------------------- */

/* 16 channels per pass, 4 rows x 4 vectors of accumulators; 4 tokens'
 * probabilities in one register per row, taken by lane. */
static INLINE void vacc_pl(int fmt, kvp__tile *t, const uint8_t *vb, int t0, int n) {
    const int es = kvp__plain_size(fmt), D = t->D;
    const float u = plain_unit(fmt, t->fp8_v);
    for (int d0 = 0; d0 < D; d0 += 16) { /* D is a multiple of 16 for attention */
        float32x4_t a[R][4];
        UNROLL for (int r = 0; r < R; r++) a[r][0] = a[r][1] = a[r][2] = a[r][3] = vdupq_n_f32(0.0f);
/* token i's 16 channels from d0 into v[4] */
#define VLOAD(i, v)                                                                                \
    do {                                                                                           \
        const uint8_t *p = vb + ((size_t)(t0 + (i)) * (size_t)D + (size_t)d0) * (size_t)es;       \
        if (d0 == 0) /* the first pass over the tokens fetches whole rows ahead */                 \
            for (int l = 0; l < D * es; l += 64) PREFETCH(p + t->pf_v + l);                        \
        load8(fmt, p, &v[0], &v[1]);                                                               \
        load8(fmt, p + 8 * es, &v[2], &v[3]);                                                      \
    } while (0)
        float32x4_t v[4];
        int i = 0;
        for (; i + 4 <= n; i += 4) {
            float32x4_t pv[R];
            UNROLL for (int r = 0; r < R; r++) pv[r] = vld1q_f32(&t->p[r][i]);
            VLOAD(i, v);
            FMA_4X4_LANE(a, v, pv, 0);
            VLOAD(i + 1, v);
            FMA_4X4_LANE(a, v, pv, 1);
            VLOAD(i + 2, v);
            FMA_4X4_LANE(a, v, pv, 2);
            VLOAD(i + 3, v);
            FMA_4X4_LANE(a, v, pv, 3);
        }
        for (; i < n; i++) {
#define P_OF(r) t->p[r][i]
            VLOAD(i, v);
            FMA_4X4_N(a, v, P_OF);
#undef P_OF
        }
#undef VLOAD
        UNROLL for (int r = 0; r < R; r++) {
            float *o = t->o + (size_t)r * (size_t)D + (size_t)d0;
            for (int j = 0; j < 4; j++) vst1q_f32(o + 4 * j, vfmaq_n_f32(vld1q_f32(o + 4 * j), a[r][j], u));
        }
    }
}

#define PLAIN_STAGES(name, FMT)                                                                    \
    static void klogits_dm_##name(kvp__tile *t, const uint8_t *kb, const kvp__blockfmt *f, int t0, \
                                  int n) {                                                         \
        klogits_dm(FMT, t, kb, f, t0, n);                                                          \
    }                                                                                              \
    static void klogits_tm_##name(kvp__tile *t, const uint8_t *kb, const kvp__blockfmt *f, int t0, \
                                  int n) {                                                         \
        (void)f;                                                                                   \
        klogits_tm(FMT, t, kb, t0, n);                                                             \
    }                                                                                              \
    static void vacc_##name(kvp__tile *t, const uint8_t *vb, const kvp__blockfmt *f, int t0,       \
                            int n) {                                                               \
        (void)f;                                                                                   \
        vacc_pl(FMT, t, vb, t0, n);                                                                \
    }
PLAIN_STAGES(fp32, KVP_FORMAT_FP32)
PLAIN_STAGES(fp16, KVP_FORMAT_FP16)
PLAIN_STAGES(bf16, KVP_FORMAT_BF16)
PLAIN_STAGES(fp8, KVP_FORMAT_FP8_E4M3)

/* ---- K: int8 / int4 preparation (per page) ----------------------------------------------------- */

/* q' = q * channel scale (to t->qf), and per row max|q'| and
 * Σ q·(min + mid·scale) (mid: the code the query's rounding error is
 * charged at). */
static void kprep_fold(kvp__tile *t, const uint8_t *kb, const kvp__blockfmt *f, float mid,
                       float amax[R], float cst[R]) {
    const int D = t->D;
    const uint8_t *sc = kb + kvp__block_data_bytes(f), *mn = sc + 2 * (size_t)D;
    float32x4_t am[R], cs[R];
    UNROLL for (int r = 0; r < R; r++) am[r] = cs[r] = vdupq_n_f32(0.0f);
    for (int d = 0; d < D; d += 4) {
        float32x4_t s = load_h4(sc + 2 * (size_t)d), m = load_h4(mn + 2 * (size_t)d);
        if (mid != 0.0f) m = vfmaq_n_f32(m, s, mid);
        UNROLL for (int r = 0; r < R; r++) {
            float32x4_t q = vld1q_f32(&t->q[r][d]), qf = vmulq_f32(q, s);
            vst1q_f32(&t->qf[r][d], qf);
            cs[r] = vfmaq_f32(cs[r], q, m);
            am[r] = vmaxq_f32(am[r], vabsq_f32(qf));
        }
    }
    UNROLL for (int r = 0; r < R; r++) {
        amax[r] = vmaxvq_f32(am[r]);
        cst[r] = vaddvq_f32(cs[r]);
    }
}

/* int8 keys: x = rne(q' * 16256 / max|q'|), 15 bits as qh = (x + 64) >> 7
 * and ql = x - 128 qh (both signed 8-bit); the klogits take the codes as
 * c - 128, and qcorr = 128 Σx puts the shift back. */
static void kprep_int8(kvp__tile *t, const uint8_t *kb, const kvp__blockfmt *f) {
    const int D = t->D;
    float amax[R], cst[R];
    kprep_fold(t, kb, f, 0.0f, amax, cst);
    const int32x4_t lo_x = vdupq_n_s32(-16320), hi_x = vdupq_n_s32(16319), half = vdupq_n_s32(64);
    for (int r = 0; r < R; r++) {
        const float inv = kvp__inv_or_zero(16256.0f, amax[r]);
        int32x4_t xs = vdupq_n_s32(0);
        for (int d = 0; d < D; d += 8) {
            int32x4_t x0 = vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(&t->qf[r][d]), inv));
            int32x4_t x1 = vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(&t->qf[r][d + 4]), inv));
            x0 = vminq_s32(vmaxq_s32(x0, lo_x), hi_x);
            x1 = vminq_s32(vmaxq_s32(x1, lo_x), hi_x);
            xs = vaddq_s32(xs, vaddq_s32(x0, x1));
            int32x4_t h0 = vshrq_n_s32(vaddq_s32(x0, half), 7), h1 = vshrq_n_s32(vaddq_s32(x1, half), 7);
            int32x4_t l0 = vsubq_s32(x0, vshlq_n_s32(h0, 7)), l1 = vsubq_s32(x1, vshlq_n_s32(h1, 7));
            vst1_s8(&t->qh[r][d], vmovn_s16(vcombine_s16(vmovn_s32(h0), vmovn_s32(h1))));
            vst1_s8(&t->ql[r][d], vmovn_s16(vcombine_s16(vmovn_s32(l0), vmovn_s32(l1))));
        }
        t->qstep[r] = amax[r] / 16256.0f;
        t->qconst[r] = cst[r];
        t->qcorr[r] = 128 * vaddvq_s32(xs); /* |.| <= 128 * 256 * 16320 < 2^31 */
    }
}

/* The outlier channels' fold of an int4 key page: k4a[r][j] = q[r][idx_j] *
 * scale_j, and Σ_j q[r][idx_j] * min_j added to qconst (count <= 32). */
static void k4_outlier_prep(kvp__tile *t, const uint8_t *kb, const kvp__blockfmt *f) {
    kvp__k4_outl o = kvp__k4_outliers_of(kb, f);
    for (int j = 0; j < o.count; j++) {
        unsigned d = kvp__load_u16(o.table + 2 * (size_t)j);
        float s = kvp__f16_to_f32(kvp__load_u16(o.table + 2 * (size_t)(o.count + j)));
        float m = kvp__f16_to_f32(kvp__load_u16(o.table + 2 * (size_t)(2 * o.count + j)));
        for (int r = 0; r < R; r++) {
            float q = kvp__k4_outlier_q(t, r, d);
            t->k4a[r][j] = q * s;
            t->qconst[r] += q * m;
        }
    }
}

/* int4 keys: q' to 8 bits per row (step = max|q'| / 127) as the x86
 * kernels: the outlier channels (scale 0 in the int4 tables) do not set
 * the step; the rounding error times the middle code (7.5) goes to the
 * constant. */
static void kprep_int4(kvp__tile *t, const uint8_t *kb, const kvp__blockfmt *f) {
    const int D = t->D;
    float amax[R], cst[R];
    kprep_fold(t, kb, f, 7.5f, amax, cst); /* cst: Σ q·(min + 7.5·scale) */
    for (int r = 0; r < R; r++) {
        const float inv = kvp__inv_or_zero(127.0f, amax[r]), step = amax[r] / 127.0f;
        int32x4_t xs = vdupq_n_s32(0);
        for (int d = 0; d < D; d += 8) {
            int32x4_t x0 = vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(&t->qf[r][d]), inv));
            int32x4_t x1 = vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(&t->qf[r][d + 4]), inv));
            xs = vaddq_s32(xs, vaddq_s32(x0, x1));
            int16x8_t w = vcombine_s16(vqmovn_s32(x0), vqmovn_s32(x1));
            vst1_s8(&t->qh[r][d], vqmovn_s16(w));
        }
        t->qstep[r] = step;
        t->qconst[r] = cst[r] - 7.5f * step * (float)vaddvq_s32(xs);
    }
    k4_outlier_prep(t, kb, f);
}

/* int4 keys' outlier channels: logits += a . code, 8 tokens per pass
 * (codes: int4's channel quads [R/4][P][4], int4_v1's [R][P]). */
static void k4_outliers(kvp__tile *t, const uint8_t *kb, const kvp__blockfmt *f, int t0, int n) {
    kvp__k4_outl o = kvp__k4_outliers_of(kb, f);
    if (o.count == 0) return;
    for (int i0 = 0; i0 < n; i0 += 8) {
        const int w = n - i0 < 8 ? n - i0 : 8;
        float32x4_t a[R][2];
        UNROLL for (int r = 0; r < R; r++) {
            a[r][0] = vld1q_f32(&t->logits[r][i0]);
            a[r][1] = vld1q_f32(&t->logits[r][i0 + 4]);
        }
        uint8_t quad[4][8];
        for (int j = 0; j < o.count; j++) {
            uint8_t tmp[8] = {0};
            if (o.quads) { /* [R/4][P][4]: one de-interleaving load per quad */
                if (j % 4 == 0) {
                    uint8_t q4[32] = {0};
                    memcpy(q4, o.codes + ((size_t)(j / 4) * (size_t)f->page_size + (size_t)(t0 + i0)) * 4,
                           4 * (size_t)w);
                    uint8x8x4_t v = vld4_u8(q4);
                    vst1_u8(quad[0], v.val[0]);
                    vst1_u8(quad[1], v.val[1]);
                    vst1_u8(quad[2], v.val[2]);
                    vst1_u8(quad[3], v.val[3]);
                }
                memcpy(tmp, quad[j % 4], 8);
            } else {
                memcpy(tmp, o.codes + (size_t)j * (size_t)f->page_size + (size_t)(t0 + i0), (size_t)w);
            }
            uint16x8_t c = vmovl_u8(vld1_u8(tmp));
            float32x4_t c0 = vcvtq_f32_u32(vmovl_u16(vget_low_u16(c)));
            float32x4_t c1 = vcvtq_f32_u32(vmovl_high_u16(c));
            UNROLL for (int r = 0; r < R; r++) {
                a[r][0] = vfmaq_n_f32(a[r][0], c0, t->k4a[r][j]);
                a[r][1] = vfmaq_n_f32(a[r][1], c1, t->k4a[r][j]);
            }
        }
        UNROLL for (int r = 0; r < R; r++) {
            store4_n(&t->logits[r][i0], a[r][0], w);
            store4_n(&t->logits[r][i0 + 4], a[r][1], w - 4);
        }
    }
}

/* ---- V: int8 / int4 helpers ---------------------------------------------------------------------- */

/* Scales of n4 tokens (fp16 at src; n4 a multiple of 4) as fp32 in
 * dst[0, KVP__CHUNK) (zero past n4); returns the largest (scales are
 * >= 0). Reads only the n4 scales: a block's scales may end the arena. */
static float load_scales(const uint8_t *src, int n4, float *dst) {
    float32x4_t mx = vdupq_n_f32(0.0f);
    for (int i = 0; i < KVP__CHUNK; i += 4) {
        float32x4_t v = i < n4 ? load_h4(src + 2 * (size_t)i) : vdupq_n_f32(0.0f);
        vst1q_f32(dst + i, v);
        mx = vmaxq_f32(mx, v);
    }
    return vmaxvq_f32(mx);
}

/* int8 values' weights: x = rne(p * s * 16256 / top) (top bounds p·s),
 * as two signed 8-bit parts (hi = (x + 64) >> 7, lo = x - 128 hi) for
 * tokens [0, n4), zeros to the next 16; returns the step. */
static float quantize_w14(const float *p, const float *s, int n4, float top, int8_t *wh, int8_t *wl) {
    const float inv = kvp__inv_or_zero(16256.0f, top);
    const uint32x4_t cap = vdupq_n_u32(16319), half = vdupq_n_u32(64);
    int i = 0;
    for (; i < n4; i += 4) {
        uint32x4_t x = vcvtnq_u32_f32(vmulq_n_f32(vmulq_f32(vld1q_f32(p + i), vld1q_f32(s + i)), inv));
        x = vminq_u32(x, cap); /* exp may round p a hair above pmax */
        uint32x4_t h = vshrq_n_u32(vaddq_u32(x, half), 7);
        int32x4_t l = vsubq_s32(vreinterpretq_s32_u32(x), vreinterpretq_s32_u32(vshlq_n_u32(h, 7)));
        int16x4_t h16 = vmovn_s32(vreinterpretq_s32_u32(h)), l16 = vmovn_s32(l);
        int8x8_t h8 = vmovn_s16(vcombine_s16(h16, h16)), l8 = vmovn_s16(vcombine_s16(l16, l16));
        vst1_lane_s32((int32_t *)(void *)(wh + i), vreinterpret_s32_s8(h8), 0);
        vst1_lane_s32((int32_t *)(void *)(wl + i), vreinterpret_s32_s8(l8), 0);
    }
    for (; i % 16 != 0; i += 4) {
        memset(wh + i, 0, 4);
        memset(wl + i, 0, 4);
    }
    return top / 16256.0f;
}

/* int4 values' weights: x = rne(p * s * 255 / top) in 0..255, stored as
 * x - 128 (signed) for tokens [0, n4), zeros to the next 16 (unused:
 * the stages read whole token groups below n4 only); returns the step. */
static float quantize_w8(const float *p, const float *s, int n4, float top, int8_t *out) {
    const float inv = kvp__inv_or_zero(255.0f, top);
    int i = 0;
    for (; i < n4; i += 4) {
        uint32x4_t x = vcvtnq_u32_f32(vmulq_n_f32(vmulq_f32(vld1q_f32(p + i), vld1q_f32(s + i)), inv));
        uint16x4_t x16 = vqmovn_u32(x);
        uint8x8_t x8 = vqmovn_u16(vcombine_u16(x16, x16)); /* saturating: p may pass pmax a hair */
        int8x8_t w = vreinterpret_s8_u8(veor_u8(x8, vdup_n_u8(0x80)));
        vst1_lane_s32((int32_t *)(void *)(out + i), vreinterpret_s32_s8(w), 0);
    }
    for (; i % 16 != 0; i += 4) memset(out + i, 0, 4);
    return top / 255.0f;
}

/* Σ p_i (m_i + 8 s_i), i < n4 (n4 a multiple of 4). */
static float mid_term(const float *p, const float *s, const float *m, int n4) {
    float32x4_t acc = vdupq_n_f32(0.0f);
    for (int i = 0; i < n4; i += 4)
        acc = vfmaq_f32(acc, vld1q_f32(p + i), vfmaq_n_f32(vld1q_f32(m + i), vld1q_f32(s + i), 8.0f));
    return vaddvq_f32(acc);
}

/* ---- the integer stages, twice ------------------------------------------------------------------ */

/* Without dot products: the same 4-way sums from widening multiplies. */
static inline int32x4_t dot4_smull(int32x4_t acc, int8x16_t a, int8x16_t b) {
    int16x8_t lo = vmull_s8(vget_low_s8(a), vget_low_s8(b));
    int16x8_t hi = vmull_high_s8(a, b);
    return vaddq_s32(acc, vpaddq_s32(vpaddlq_s16(lo), vpaddlq_s16(hi)));
}
#define NI(name) name##_smull
#define NI_TGT
#define NI_DOT(acc, a, b) dot4_smull(acc, a, b)
#define NI_DOTL(acc, a, b, lane)                                                                   \
    dot4_smull(acc, a, vreinterpretq_s8_s32(vdupq_laneq_s32(vreinterpretq_s32_s8(b), lane)))
#include "kern_neon_int.h"
#undef NI
#undef NI_TGT
#undef NI_DOT
#undef NI_DOTL

#if defined(__clang__) && __clang_major__ < 16 && !defined(__ARM_FEATURE_DOTPROD)
/* Clang before 16 declares the dot-product intrinsics only for a whole
 * translation unit built with them, not per function: there the dotprod
 * table takes the widening-multiply stages (the same results). */
#define klogits_int8_sdot klogits_int8_smull
#define klogits_int4_sdot klogits_int4_smull
#define vacc_int8_sdot vacc_int8_smull
#define vacc_int4_sdot vacc_int4_smull
#define vacc2_int8_sdot vacc2_int8_smull
#define vacc2_int4_sdot vacc2_int4_smull
#else
#define NI(name) name##_sdot
#if defined(__clang__)
#define NI_TGT __attribute__((target("dotprod")))
#else
#define NI_TGT __attribute__((target("arch=armv8.2-a+dotprod")))
#endif
#define NI_DOT(acc, a, b) vdotq_s32(acc, a, b)
#define NI_DOTL(acc, a, b, lane) vdotq_laneq_s32(acc, a, b, lane)
#include "kern_neon_int.h"
#undef NI
#undef NI_TGT
#undef NI_DOT
#undef NI_DOTL
#endif

/* ---- prefill blocks (cpu.h) ------------------------------------------------------------------ */

#define PFC KVP__PF_CHUNK

/* Plain keys, dim-major: each channel's tokens converted where they lie. */
static INLINE void pf_kdec_dm(int fmt, const uint8_t *kb, const kvp__blockfmt *f, int t0, int n,
                              float fp8_scale, float *kc) {
    const int es = kvp__plain_size(fmt), P = f->page_size, D = f->head_dim;
    const float u = plain_unit(fmt, fp8_scale);
    for (int d = 0; d < D; d++) {
        const uint8_t *p = kb + ((size_t)d * (size_t)P + (size_t)t0) * (size_t)es;
        float *o = kc + (size_t)d * PFC;
        for (int i = 0; i < n; i += 8) {
            float32x4_t lo, hi;
            load8_n(fmt, p + (size_t)i * (size_t)es, n - i, &lo, &hi);
            store4_n(o + i, vmulq_n_f32(lo, u), n - i);
            store4_n(o + i + 4, vmulq_n_f32(hi, u), n - i - 4);
        }
    }
}

/* Plain keys, token-major: 4 tokens x 4 channels at a time, transposed in
 * registers. */
static INLINE void pf_kdec_tm(int fmt, const uint8_t *kb, const kvp__blockfmt *f, int t0, int n,
                              float fp8_scale, float *kc) {
    const int es = kvp__plain_size(fmt), D = f->head_dim;
    const float u = plain_unit(fmt, fp8_scale);
    for (int i0 = 0; i0 < n; i0 += 4)
        for (int d = 0; d < D; d += 8) {
            float32x4_t a[4], b[4]; /* token i's channels d..d+3 (a), d+4..d+7 (b) */
            for (int i = 0; i < 4; i++) {
                if (i0 + i < n) {
                    load8(fmt, kb + ((size_t)(t0 + i0 + i) * (size_t)D + (size_t)d) * (size_t)es, &a[i], &b[i]);
                    a[i] = vmulq_n_f32(a[i], u);
                    b[i] = vmulq_n_f32(b[i], u);
                } else {
                    a[i] = b[i] = vdupq_n_f32(0.0f);
                }
            }
            for (int h = 0; h < 2; h++) {
                const float32x4_t *x = h == 0 ? a : b;
                float32x4_t t0v = vtrn1q_f32(x[0], x[1]), t1v = vtrn2q_f32(x[0], x[1]);
                float32x4_t t2v = vtrn1q_f32(x[2], x[3]), t3v = vtrn2q_f32(x[2], x[3]);
                float32x4_t c[4];
                c[0] = vreinterpretq_f32_f64(vtrn1q_f64(vreinterpretq_f64_f32(t0v), vreinterpretq_f64_f32(t2v)));
                c[1] = vreinterpretq_f32_f64(vtrn1q_f64(vreinterpretq_f64_f32(t1v), vreinterpretq_f64_f32(t3v)));
                c[2] = vreinterpretq_f32_f64(vtrn2q_f64(vreinterpretq_f64_f32(t0v), vreinterpretq_f64_f32(t2v)));
                c[3] = vreinterpretq_f32_f64(vtrn2q_f64(vreinterpretq_f64_f32(t1v), vreinterpretq_f64_f32(t3v)));
                for (int k = 0; k < 4; k++)
                    store4_n(kc + (size_t)(d + 4 * h + k) * PFC + (size_t)i0, c[k], n - i0);
            }
        }
}

/* Plain values: rows converted. */
static INLINE void pf_vdec_pl(int fmt, const uint8_t *vb, const kvp__blockfmt *f, int t0, int n,
                              float fp8_scale, float *vc) {
    const int es = kvp__plain_size(fmt), D = f->head_dim;
    const float u = plain_unit(fmt, fp8_scale);
    for (int i = 0; i < n; i++) {
        const uint8_t *p = vb + (size_t)(t0 + i) * (size_t)D * (size_t)es;
        float *o = vc + (size_t)i * KVP__ATTN_MAX_D;
        for (int d = 0; d < D; d += 8) {
            float32x4_t lo, hi;
            load8(fmt, p + (size_t)d * (size_t)es, &lo, &hi);
            vst1q_f32(o + d, vmulq_n_f32(lo, u));
            vst1q_f32(o + d + 4, vmulq_n_f32(hi, u));
        }
    }
}

#define PF_PLAIN(name, FMT)                                                                        \
    static void pf_kdec_dm_##name(const uint8_t *kb, const kvp__blockfmt *f, int t0, int n,        \
                                  float s, float *kc) {                                            \
        pf_kdec_dm(FMT, kb, f, t0, n, s, kc);                                                      \
    }                                                                                              \
    static void pf_kdec_tm_##name(const uint8_t *kb, const kvp__blockfmt *f, int t0, int n,        \
                                  float s, float *kc) {                                            \
        pf_kdec_tm(FMT, kb, f, t0, n, s, kc);                                                      \
    }                                                                                              \
    static void pf_vdec_##name(const uint8_t *vb, const kvp__blockfmt *f, int t0, int n, float s,  \
                               float *vc) {                                                        \
        pf_vdec_pl(FMT, vb, f, t0, n, s, vc);                                                      \
    }
PF_PLAIN(fp32, KVP_FORMAT_FP32)
PF_PLAIN(fp16, KVP_FORMAT_FP16)
PF_PLAIN(bf16, KVP_FORMAT_BF16)
PF_PLAIN(fp8, KVP_FORMAT_FP8_E4M3)

/* 32 registers: the logits go 4 rows x 16 tokens at a time (16
 * accumulators, 4 channels of q per register taken by lane), to b->s; the
 * softmax works row by row from there; o += p.v takes 4 rows x 16 channels
 * (the rescale folded into the accumulators' load), 4 tokens of p per
 * register. */
static void pf_block_neon(kvp__pblock *b, int r0, int32_t pos0, int n, int masked) {
    const int D = b->D;
    for (int rh = r0; rh < r0 + KVP__PF_BLOCK; rh += 4)
        for (int c0 = 0; c0 < PFC; c0 += 16) {
            float32x4_t a[4][4];
            UNROLL for (int r = 0; r < 4; r++) a[r][0] = a[r][1] = a[r][2] = a[r][3] = vdupq_n_f32(0.0f);
            for (int d = 0; d < D; d += 4) {
                float32x4_t q[4];
                UNROLL for (int r = 0; r < 4; r++) q[r] = vld1q_f32(&b->q[rh + r][d]);
#define PCH(k)                                                                                     \
    do {                                                                                           \
        const float *kr = &b->kc[d + (k)][c0];                                                     \
        const float32x4_t kv[4] = {vld1q_f32(kr), vld1q_f32(kr + 4), vld1q_f32(kr + 8),             \
                                   vld1q_f32(kr + 12)};                                            \
        FMA_4X4_LANE(a, kv, q, k);                                                                 \
    } while (0)
                PCH(0);
                PCH(1);
                PCH(2);
                PCH(3);
#undef PCH
            }
            UNROLL for (int r = 0; r < 4; r++)
                for (int j = 0; j < 4; j++) vst1q_f32(&b->s[rh + r][c0 + 4 * j], a[r][j]);
        }
    float al[KVP__PF_BLOCK];
    const float32x4_t ninf = vdupq_n_f32(-INFINITY), zero = vdupq_n_f32(0.0f);
    for (int r = r0; r < r0 + KVP__PF_BLOCK; r++) {
        float32x4_t x[PFC / 4], mx = ninf;
        uint32x4_t vis[PFC / 4];
        UNROLL for (int j = 0; j < PFC / 4; j++) {
            x[j] = vld1q_f32(&b->s[r][4 * j]);
            vis[j] = masked ? visible4(4 * j, n, pos0, b->lo[r], b->hi[r]) : vdupq_n_u32(~0u);
            mx = vmaxq_f32(mx, vbslq_f32(vis[j], x[j], ninf));
        }
        float cm = vmaxvq_f32(mx), m_old = b->m[r], m_new = m_old > cm ? m_old : cm;
        al[r - r0] = 1.0f;
        if (m_new == -INFINITY) { /* nothing visible yet: p = 0 */
            UNROLL for (int j = 0; j < PFC / 4; j++) vst1q_f32(&b->s[r][4 * j], zero);
            continue;
        }
        if (m_old != m_new) al[r - r0] = vgetq_lane_f32(exp4(vdupq_n_f32(m_old - m_new)), 0);
        const float32x4_t mv = vdupq_n_f32(m_new);
        float32x4_t lv = vmulq_n_f32(vld1q_f32(b->lv[r]), al[r - r0]);
        UNROLL for (int j = 0; j < PFC / 4; j++) {
            float32x4_t p = vbslq_f32(vis[j], exp4(vsubq_f32(x[j], mv)), zero);
            vst1q_f32(&b->s[r][4 * j], p);
            lv = vaddq_f32(lv, p);
        }
        vst1q_f32(b->lv[r], lv);
        b->m[r] = m_new;
    }
    for (int rh = r0; rh < r0 + KVP__PF_BLOCK; rh += 4)
        for (int d0 = 0; d0 < D; d0 += 16) {
            float32x4_t o[4][4];
            UNROLL for (int r = 0; r < 4; r++) {
                const float *op = b->o + (size_t)(rh + r) * (size_t)D + (size_t)d0;
                for (int j = 0; j < 4; j++) o[r][j] = vmulq_n_f32(vld1q_f32(op + 4 * j), al[rh + r - r0]);
            }
#define PLOAD(i, w)                                                                                \
    do {                                                                                           \
        const float *vr = &b->vc[(i)][d0];                                                         \
        for (int j_ = 0; j_ < 4; j_++) w[j_] = vld1q_f32(vr + 4 * j_);                             \
    } while (0)
            float32x4_t w[4];
            int i = 0;
            for (; i + 4 <= n; i += 4) {
                float32x4_t pv[4];
                UNROLL for (int r = 0; r < 4; r++) pv[r] = vld1q_f32(&b->s[rh + r][i]);
                PLOAD(i, w);
                FMA_4X4_LANE(o, w, pv, 0);
                PLOAD(i + 1, w);
                FMA_4X4_LANE(o, w, pv, 1);
                PLOAD(i + 2, w);
                FMA_4X4_LANE(o, w, pv, 2);
                PLOAD(i + 3, w);
                FMA_4X4_LANE(o, w, pv, 3);
            }
            for (; i < n; i++) {
#define S_OF(r) b->s[rh + (r)][i]
                PLOAD(i, w);
                FMA_4X4_N(o, w, S_OF);
#undef S_OF
            }
#undef PLOAD
            UNROLL for (int r = 0; r < 4; r++) {
                float *op = b->o + (size_t)(rh + r) * (size_t)D + (size_t)d0;
                for (int j = 0; j < 4; j++) vst1q_f32(op + 4 * j, o[r][j]);
            }
        }
}

#define NEON_TABLE(NAME, SFX)                                                                      \
    {                                                                                              \
        NAME,                                                                                      \
        {kprep_plain, kprep_plain, kprep_plain, kprep_plain, kprep_int8, kprep_int4},              \
        {{klogits_tm_fp32, klogits_dm_fp32},                                                       \
         {klogits_tm_fp16, klogits_dm_fp16},                                                       \
         {klogits_tm_bf16, klogits_dm_bf16},                                                       \
         {klogits_tm_fp8, klogits_dm_fp8},                                                         \
         {klogits_int8_##SFX, klogits_int8_##SFX},                                                 \
         {klogits_int4_##SFX, klogits_int4_##SFX}},                                                \
        softmax_neon,                                                                              \
        {vacc_fp32, vacc_fp16, vacc_bf16, vacc_fp8, vacc_int8_##SFX, vacc_int4_##SFX},             \
        {NULL, NULL, NULL, NULL, vacc2_int8_##SFX, vacc2_int4_##SFX},                              \
        {NULL, NULL, NULL, NULL, NULL, NULL},                                                      \
        pf_block_neon,                                                                             \
        /* plain formats; int8/int4 keep the tiles' integer dot products */                        \
        (1u << KVP_FORMAT_FP32) | (1u << KVP_FORMAT_FP16) | (1u << KVP_FORMAT_BF16) |              \
            (1u << KVP_FORMAT_FP8_E4M3),                                                           \
        (1u << KVP_FORMAT_FP32) | (1u << KVP_FORMAT_FP16) | (1u << KVP_FORMAT_BF16) |              \
            (1u << KVP_FORMAT_FP8_E4M3),                                                           \
        {{pf_kdec_tm_fp32, pf_kdec_dm_fp32},                                                       \
         {pf_kdec_tm_fp16, pf_kdec_dm_fp16},                                                       \
         {pf_kdec_tm_bf16, pf_kdec_dm_bf16},                                                       \
         {pf_kdec_tm_fp8, pf_kdec_dm_fp8},                                                         \
         {NULL, NULL},                                                                             \
         {NULL, NULL}},                                                                            \
        {pf_vdec_fp32, pf_vdec_fp16, pf_vdec_bf16, pf_vdec_fp8, NULL, NULL},                       \
        0,                                                                                         \
        {NULL, NULL, NULL, NULL},                                                                  \
        NULL,                                                                                      \
        NULL,                                                                                      \
        NULL,                                                                                      \
        NULL,                                                                                      \
        NULL,                                                                                      \
    }

const kvp__kernels kvp__kernels_neon = NEON_TABLE("neon", smull);
const kvp__kernels kvp__kernels_neon_dotprod = NEON_TABLE("neon-dotprod", sdot);

#else
const kvp__kernels kvp__kernels_neon = {"neon", {0}, {{0}}, NULL, {0}, {0}, {0}, NULL, 0, 0, {{0}}, {0},
                                        0,      {0}, NULL,   NULL, NULL, NULL, NULL};
const kvp__kernels kvp__kernels_neon_dotprod = {"neon-dotprod", {0}, {{0}}, NULL, {0}, {0}, {0}, NULL, 0,
                                                0, {{0}}, {0}, 0, {0}, NULL, NULL, NULL, NULL, NULL};
#endif
