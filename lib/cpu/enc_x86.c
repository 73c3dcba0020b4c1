/*
 * Encoder primitives for x86 (AVX2 + F16C; the AVX-512 tables use them as
 * well: appends are bound by memory and the layout's scattered stores, not
 * by the vector width). Each matches the reference conversion element for
 * element (lib/cpu/encode.c says how; tests/test_encode.c checks it over
 * every special value): fp16 by vcvtps2ph with round-to-nearest-even (its
 * NaN is the reference's: quiet, the payload's top bits kept), bf16 and
 * fp8 E4M3 by integer rounding on the float's bits, codes by vroundps.
 */
#include "cpu.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#include <string.h>

#define TGT __attribute__((target("avx2,fma,f16c")))
#define TGT_INLINE __attribute__((always_inline, target("avx2,fma,f16c"))) inline

#define RNE (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

TGT_INLINE static __m256 absf(__m256 x) {
    return _mm256_castsi256_ps(_mm256_and_si256(_mm256_castps_si256(x), _mm256_set1_epi32(0x7FFFFFFF)));
}
/* all ones where x is finite */
TGT_INLINE static __m256 finite_mask(__m256 x) {
    return _mm256_cmp_ps(absf(x), _mm256_set1_ps(INFINITY), _CMP_LT_OQ);
}
/* 8 int32 lanes (0..255 or -128..127, as the pack says) to 8 bytes at c */
TGT_INLINE static void store8_u8(uint8_t *c, __m256i v) {
    __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    _mm_storel_epi64((__m128i *)(void *)c, _mm_packus_epi16(w, w));
}
TGT_INLINE static void store8_s8(int8_t *c, __m256i v) {
    __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    _mm_storel_epi64((__m128i *)(void *)c, _mm_packs_epi16(w, w));
}
/* 8 int32 lanes of 16-bit values to 8 u16 at y */
TGT_INLINE static void store8_u16(uint16_t *y, __m256i v) {
    _mm_storeu_si128((__m128i *)(void *)y,
                     _mm_packus_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1)));
}

TGT static void to_f16(const float *x, uint16_t *y, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(void *)(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), RNE));
    for (; i < n; i++) y[i] = kvp__f32_to_f16(x[i]);
}

TGT_INLINE static __m256i bf16_8(__m256 xf) {
    __m256i x = _mm256_castps_si256(xf);
    __m256i ax = _mm256_and_si256(x, _mm256_set1_epi32(0x7FFFFFFF));
    __m256i nan = _mm256_cmpgt_epi32(ax, _mm256_set1_epi32(0x7F800000));
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7FFF)), lsb), 16);
    __m256i q = _mm256_or_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x40));
    return _mm256_blendv_epi8(r, q, nan);
}

TGT static void to_bf16(const float *x, uint16_t *y, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8) store8_u16(y + i, bf16_8(_mm256_loadu_ps(x + i)));
    for (; i < n; i++) y[i] = kvp__f32_to_bf16(x[i]);
}

/* kvp__f32_to_e4m3(v) of 8 lanes, as int32 0..255 */
TGT_INLINE static __m256i e4m3_8(__m256 v) {
    __m256 a = absf(v);
    __m256i ai = _mm256_castps_si256(a);
    __m256i sign = _mm256_srli_epi32(_mm256_and_si256(_mm256_castps_si256(v), _mm256_set1_epi32((int)0x80000000u)), 24);
    /* normal: the mantissa rounded to 3 bits (ties to even) on the bits, the
     * exponent rebiased 127 -> 7 (the carry of a rounding goes into it) */
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(ai, 20), _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(_mm256_add_epi32(ai, _mm256_set1_epi32(0x7FFFF)), lsb);
    __m256i normal = _mm256_sub_epi32(_mm256_srli_epi32(r, 20), _mm256_set1_epi32(120 << 3));
    /* below 2^-6: steps of 2^-9 */
    __m256i sub = _mm256_cvttps_epi32(_mm256_round_ps(_mm256_mul_ps(a, _mm256_set1_ps(512.0f)), RNE));
    __m256i small = _mm256_castps_si256(_mm256_cmp_ps(a, _mm256_set1_ps(0.015625f), _CMP_LT_OQ));
    __m256i sat = _mm256_castps_si256(_mm256_cmp_ps(a, _mm256_set1_ps(448.0f), _CMP_GE_OQ));
    __m256i mag = _mm256_blendv_epi8(normal, sub, small);
    mag = _mm256_blendv_epi8(mag, _mm256_set1_epi32(0x7E), sat);
    __m256i code = _mm256_or_si256(sign, mag);
    __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    return _mm256_andnot_si256(nan, code);
}

TGT static void to_e4m3(const float *x, uint8_t *y, int n, float inv) {
    const __m256 s = _mm256_set1_ps(inv);
    int i = 0;
    for (; i + 8 <= n; i += 8) store8_u8(y + i, e4m3_8(_mm256_mul_ps(_mm256_loadu_ps(x + i), s)));
    for (; i < n; i++) y[i] = kvp__f32_to_e4m3(x[i] * inv);
}

TGT static void from_f16(const uint16_t *x, float *y, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm_loadu_si128((const __m128i *)(const void *)(x + i));
        __m256 f = _mm256_cvtph_ps(h);
        /* a NaN's bits as the reference keeps them (vcvtph2ps quiets one) */
        __m256i w = _mm256_cvtepu16_epi32(h);
        __m256i mag = _mm256_and_si256(w, _mm256_set1_epi32(0x7FFF));
        __m256i nan = _mm256_cmpgt_epi32(mag, _mm256_set1_epi32(0x7C00));
        if (!_mm256_testz_si256(nan, nan)) {
            __m256i bits = _mm256_or_si256(
                _mm256_or_si256(_mm256_slli_epi32(_mm256_and_si256(w, _mm256_set1_epi32(0x8000)), 16),
                                _mm256_set1_epi32(0x7F800000)),
                _mm256_slli_epi32(_mm256_and_si256(w, _mm256_set1_epi32(0x3FF)), 13));
            f = _mm256_blendv_ps(f, _mm256_castsi256_ps(bits), _mm256_castsi256_ps(nan));
        }
        _mm256_storeu_ps(y + i, f);
    }
    for (; i < n; i++) y[i] = kvp__f16_to_f32(x[i]);
}

TGT static void minmax_cols(const float *x, size_t stride, int rows, int n, float *lo, float *hi) {
    const __m256 pinf = _mm256_set1_ps(INFINITY), ninf = _mm256_set1_ps(-INFINITY);
    int d = 0;
    for (; d + 8 <= n; d += 8) {
        __m256 l = pinf, h = ninf;
        for (int t = 0; t < rows; t++) {
            __m256 v = _mm256_loadu_ps(x + (size_t)t * stride + (size_t)d);
            __m256 fin = finite_mask(v);
            l = _mm256_min_ps(l, _mm256_blendv_ps(pinf, v, fin));
            h = _mm256_max_ps(h, _mm256_blendv_ps(ninf, v, fin));
        }
        _mm256_storeu_ps(lo + d, l);
        _mm256_storeu_ps(hi + d, h);
    }
    if (d < n) kvp__enc_portable.minmax_cols(x + d, stride, rows, n - d, lo + d, hi + d);
}

TGT static void minmax(const float *x, int n, float *lo, float *hi) {
    const __m256 pinf = _mm256_set1_ps(INFINITY), ninf = _mm256_set1_ps(-INFINITY);
    __m256 l = pinf, h = ninf;
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i), fin = finite_mask(v);
        l = _mm256_min_ps(l, _mm256_blendv_ps(pinf, v, fin));
        h = _mm256_max_ps(h, _mm256_blendv_ps(ninf, v, fin));
    }
    float lv[8], hv[8], a, b;
    _mm256_storeu_ps(lv, l);
    _mm256_storeu_ps(hv, h);
    kvp__enc_portable.minmax(x + i, n - i, &a, &b);
    for (int k = 0; k < 8; k++) {
        a = lv[k] < a ? lv[k] : a;
        b = hv[k] > b ? hv[k] : b;
    }
    *lo = a;
    *hi = b;
}

TGT static float absmax(const float *x, int n) {
    __m256 m = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 a = absf(_mm256_loadu_ps(x + i));
        /* not finite: the compare is false, and 0 takes its place */
        m = _mm256_max_ps(m, _mm256_and_ps(a, _mm256_cmp_ps(a, _mm256_set1_ps(INFINITY), _CMP_LT_OQ)));
    }
    float mv[8], r = kvp__enc_portable.absmax(x + i, n - i);
    _mm256_storeu_ps(mv, m);
    for (int k = 0; k < 8; k++) r = mv[k] > r ? mv[k] : r;
    return r;
}

/* kvp__asym_code of 8 lanes as int32 */
TGT_INLINE static __m256i asym_8(__m256 v, __m256 mn, __m256 inv, __m256 lv) {
    __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
    __m256 x = _mm256_andnot_ps(nan, v); /* NaN -> 0 */
    __m256 c = _mm256_round_ps(_mm256_mul_ps(_mm256_sub_ps(x, mn), inv), RNE);
    c = _mm256_max_ps(c, _mm256_setzero_ps()); /* NaN -> 0 (max gives its second operand) */
    c = _mm256_min_ps(c, lv);
    c = _mm256_blendv_ps(c, lv, _mm256_cmp_ps(x, _mm256_set1_ps(INFINITY), _CMP_EQ_OQ));
    c = _mm256_andnot_ps(_mm256_cmp_ps(x, _mm256_set1_ps(-INFINITY), _CMP_EQ_OQ), c);
    return _mm256_cvttps_epi32(c);
}

TGT static void asym_codes(const float *x, int n, const float *mn, const float *inv, const float *lv,
                           uint8_t *c) {
    int i = 0;
    for (; i + 8 <= n; i += 8)
        store8_u8(c + i, asym_8(_mm256_loadu_ps(x + i), _mm256_loadu_ps(mn + i), _mm256_loadu_ps(inv + i),
                                _mm256_loadu_ps(lv + i)));
    if (i < n) kvp__enc_portable.asym_codes(x + i, n - i, mn + i, inv + i, lv + i, c + i);
}

TGT static void asym_codes1(const float *x, int n, float mn, float inv, float lv, uint8_t *c) {
    const __m256 m = _mm256_set1_ps(mn), s = _mm256_set1_ps(inv), l = _mm256_set1_ps(lv);
    int i = 0;
    for (; i + 8 <= n; i += 8) store8_u8(c + i, asym_8(_mm256_loadu_ps(x + i), m, s, l));
    if (i < n) kvp__enc_portable.asym_codes1(x + i, n - i, mn, inv, lv, c + i);
}

TGT static void sym8_codes(const float *x, int n, float inv, int8_t *c) {
    const __m256 s = _mm256_set1_ps(inv), top = _mm256_set1_ps(127.0f), bot = _mm256_set1_ps(-127.0f);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        __m256 r = _mm256_round_ps(_mm256_mul_ps(v, s), RNE);
        r = _mm256_min_ps(_mm256_max_ps(r, bot), top);
        /* +-Inf: +-127 whatever the scale; NaN: 0 */
        __m256 inf = _mm256_cmp_ps(absf(v), _mm256_set1_ps(INFINITY), _CMP_EQ_OQ);
        r = _mm256_blendv_ps(r, _mm256_blendv_ps(top, bot, v), inf);
        r = _mm256_andnot_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q), r);
        store8_s8(c + i, _mm256_cvttps_epi32(r));
    }
    if (i < n) kvp__enc_portable.sym8_codes(x + i, n - i, inv, c + i);
}

TGT static int nonfinite(const float *x, int n) {
    int bad = 0, i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 a = absf(_mm256_loadu_ps(x + i));
        bad += __builtin_popcount((unsigned)_mm256_movemask_ps(_mm256_cmp_ps(a, _mm256_set1_ps(INFINITY), _CMP_NLT_UQ)));
    }
    return bad + kvp__enc_portable.nonfinite(x + i, n - i);
}

/* 8 rows of 16-bit values as columns: 8 x 8 blocks transposed in three
 * rounds of unpacks (16-, 32-, 64-bit), one 16-byte store per column */
TGT static void cols16(const uint16_t *h, size_t hs, int m, int n, uint16_t *out, size_t os) {
    int d = 0;
    if (m == 8)
        for (; d + 8 <= n; d += 8) {
            __m128i r[8], a[8], b[8];
            for (int j = 0; j < 8; j++) r[j] = _mm_loadu_si128((const __m128i *)(const void *)(h + (size_t)j * hs + (size_t)d));
            for (int j = 0; j < 8; j += 2) {
                a[j / 2] = _mm_unpacklo_epi16(r[j], r[j + 1]);     /* a0 a2 a4 a6: columns 0-3 */
                a[4 + j / 2] = _mm_unpackhi_epi16(r[j], r[j + 1]); /* a4..a7: columns 4-7 */
            }
            /* a[0..3]: row pairs (0,1) (2,3) (4,5) (6,7), columns 0-3; a[4..7]: columns 4-7 */
            b[0] = _mm_unpacklo_epi32(a[0], a[1]); /* rows 0-3, columns 0-1 */
            b[1] = _mm_unpackhi_epi32(a[0], a[1]); /* rows 0-3, columns 2-3 */
            b[2] = _mm_unpacklo_epi32(a[2], a[3]); /* rows 4-7, columns 0-1 */
            b[3] = _mm_unpackhi_epi32(a[2], a[3]); /* rows 4-7, columns 2-3 */
            b[4] = _mm_unpacklo_epi32(a[4], a[5]);
            b[5] = _mm_unpackhi_epi32(a[4], a[5]);
            b[6] = _mm_unpacklo_epi32(a[6], a[7]);
            b[7] = _mm_unpackhi_epi32(a[6], a[7]);
            for (int k = 0; k < 2; k++) { /* k = 0: columns 0-3; 1: columns 4-7 */
                uint16_t *o = out + (size_t)(d + 4 * k) * os;
                _mm_storeu_si128((__m128i *)(void *)o, _mm_unpacklo_epi64(b[4 * k], b[4 * k + 2]));
                _mm_storeu_si128((__m128i *)(void *)(o + os), _mm_unpackhi_epi64(b[4 * k], b[4 * k + 2]));
                _mm_storeu_si128((__m128i *)(void *)(o + 2 * os), _mm_unpacklo_epi64(b[4 * k + 1], b[4 * k + 3]));
                _mm_storeu_si128((__m128i *)(void *)(o + 3 * os), _mm_unpackhi_epi64(b[4 * k + 1], b[4 * k + 3]));
            }
        }
    if (d < n) kvp__enc_portable.cols16(h + d, hs, m, n - d, out + (size_t)d * os, os);
}

const kvp__enc_prims kvp__enc_avx2 = {"avx2",     to_f16,     to_bf16,     to_e4m3,    from_f16, minmax_cols,
                                      minmax,     absmax,     asym_codes,  asym_codes1, sym8_codes, nonfinite, cols16};
const kvp__enc_prims kvp__enc_avx512 = {"avx512",   to_f16,     to_bf16,     to_e4m3,    from_f16, minmax_cols,
                                        minmax,     absmax,     asym_codes,  asym_codes1, sym8_codes, nonfinite, cols16};

#else
/* not built for this target: kvp__pick_enc() gives the portable primitives */
const kvp__enc_prims kvp__enc_avx2 = {"avx2", NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
const kvp__enc_prims kvp__enc_avx512 = {"avx512", NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
#endif
