/*
 * AVX2 + FMA + F16C kernel stages. Compiled with target attributes (never
 * global -march flags) and used only when the CPU has them (lib/cpu/isa.c).
 *
 * Float formats: convert 8 elements per instruction and FMA, the tile's 4
 * query rows sharing each load. int8 keys and values: vpmaddwd on 16-bit
 * operands (AVX2 has no VNNI, and vpmaddubsw would saturate u8 x s8 pairs
 * of 8-bit codes): codes widened to 16 bits, the folded query (keys) or
 * the folded probabilities (values) quantized to 15 bits, sums exact in
 * int32. int4 keys and values: vpmaddubsw, with the 8-bit query and u8
 * probabilities of the AVX-512 kernels, which 4-bit codes cannot saturate;
 * its 16-bit sums are widened before they could overflow.
 */
#include "cpu.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#include <string.h>

#define TGT __attribute__((target("avx2,fma,f16c")))
#define TGT_INLINE __attribute__((always_inline, target("avx2,fma,f16c"))) inline
#define R KVP__TILE_ROWS
#define UNROLL _Pragma("GCC unroll 8")
/* Loops prefetch one block ahead, the next kv head's block (see kern_avx512.c). */

/* ---- helpers ---------------------------------------------------------------------------- */

/* 8 plain elements at p (all valid) as fp32; fp8 comes out as value/(256*scale). */
TGT_INLINE static __m256 load8(int32_t fmt, const uint8_t *p) {
    switch (fmt) {
    case KVP_FORMAT_FP32: return _mm256_loadu_ps((const float *)(const void *)p);
    case KVP_FORMAT_FP16: return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)p));
    case KVP_FORMAT_BF16:
        return _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)p)), 16));
    default: {
        __m128i b = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(const void *)p));
        __m128i h = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x7F)), 7),
                                 _mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x80)), 8));
        return _mm256_cvtph_ps(h);
    }
    }
}

/* The first n (< 8) elements at p, zeros after. */
TGT_INLINE static __m256 load8_part(int32_t fmt, const uint8_t *p, int n) {
    uint8_t tmp[32] = {0};
    memcpy(tmp, p, (size_t)n * (size_t)kvp__plain_size(fmt));
    return load8(fmt, tmp);
}

static inline float plain_unit(int32_t fmt, float fp8_scale) {
    return fmt == KVP_FORMAT_FP8_E4M3 ? 256.0f * fp8_scale : 1.0f;
}

TGT_INLINE static float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

TGT_INLINE static float hmax8(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* exp(x) for x <= 0 (-inf -> 0), |rel err| < 2e-7. */
TGT_INLINE static __m256 exp256(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187e-06f), r);
    __m256 p = _mm256_set1_ps(1.0f / 720.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    /* 2^n for n in [-126, 0]: exponent bits; smaller n already clamped */
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* ---- K: plain formats ------------------------------------------------------------------------ */

TGT static void kprep_plain(kvp__tile *t, const uint8_t *kb, const kvp__blockfmt *f) {
    (void)kb;
    __m256 u = _mm256_set1_ps(plain_unit(f->format, t->fp8_k));
    for (int r = 0; r < R; r++)
        for (int d = 0; d < t->D; d += 8)
            _mm256_store_ps(&t->qf[r][d], _mm256_mul_ps(_mm256_load_ps(&t->q[r][d]), u));
}

/* dim-major [D][P]: 16 tokens per pass, 4 rows x 2 vectors of accumulators. */
TGT_INLINE static void klogits_dm(int fmt, kvp__tile *t, const uint8_t *kb, const kvp__blockfmt *f,
                                  int t0, int n) {
    const int es = kvp__plain_size(fmt), P = f->page_size, D = t->D;
    const size_t row = (size_t)P * (size_t)es;
    for (int c0 = 0; c0 < n; c0 += 16) {
        int w = n - c0 < 16 ? n - c0 : 16;
        const uint8_t *base = kb + (size_t)(t0 + c0) * (size_t)es;
        __m256 a0[R], a1[R];
        UNROLL for (int r = 0; r < R; r++) a0[r] = a1[r] = _mm256_setzero_ps();
        for (int d = 0; d < D; d++) {
            const uint8_t *p = base + (size_t)d * row;
            _mm_prefetch((const char *)p + t->pf_k, _MM_HINT_T2);
            __m256 k0 = w >= 8 ? load8(fmt, p) : load8_part(fmt, p, w);
            __m256 k1 = w >= 16 ? load8(fmt, p + 8 * es) : w > 8 ? load8_part(fmt, p + 8 * es, w - 8)
                                                                  : _mm256_setzero_ps();
            UNROLL for (int r = 0; r < R; r++) {
                __m256 q = _mm256_broadcast_ss(&t->qf[r][d]);
                a0[r] = _mm256_fmadd_ps(q, k0, a0[r]);
                a1[r] = _mm256_fmadd_ps(q, k1, a1[r]);
            }
        }
        UNROLL for (int r = 0; r < R; r++) {
            _mm256_storeu_ps(&t->logits[r][c0], a0[r]);
            _mm256_storeu_ps(&t->logits[r][c0 + 8], a1[r]);
        }
    }
}

/* token-major [P][D]: one dot product per token and row. */
TGT_INLINE static void klogits_tm(int fmt, kvp__tile *t, const uint8_t *kb, int t0, int n) {
    const int es = kvp__plain_size(fmt), D = t->D;
    for (int i = 0; i < n; i++) {
        const uint8_t *p = kb + (size_t)(t0 + i) * (size_t)D * (size_t)es;
        __m256 acc[R];
        UNROLL for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
        for (int d = 0; d < D; d += 8) {
            __m256 k = load8(fmt, p + (size_t)d * (size_t)es);
            UNROLL for (int r = 0; r < R; r++) acc[r] = _mm256_fmadd_ps(_mm256_load_ps(&t->qf[r][d]), k, acc[r]);
        }
        UNROLL for (int r = 0; r < R; r++) t->logits[r][i] = hsum8(acc[r]);
    }
}

/* ---- softmax ------------------------------------------------------------------------------------ */

TGT static void softmax_avx2(kvp__tile *t, int n, int32_t pos0) {
    const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    for (int r = 0; r < R; r++) {
        if (t->soft_cap > 0.0f)
            for (int i = 0; i < n; i++) t->logits[r][i] = t->soft_cap * tanhf(t->logits[r][i] / t->soft_cap);
        const int nv = n > 32 ? 8 : 4; /* 8-token vectors: 64 tokens for a pair of pages */
        __m256 x[8], cm = ninf;
        for (int j = 0; j < nv; j++) {
            __m256i idx = _mm256_add_epi32(iota, _mm256_set1_epi32(8 * j));
            __m256i pos = _mm256_add_epi32(idx, _mm256_set1_epi32(pos0));
            __m256i ok = _mm256_and_si256(
                _mm256_cmpgt_epi32(_mm256_set1_epi32(n), idx),
                _mm256_and_si256(_mm256_cmpgt_epi32(pos, _mm256_set1_epi32(t->lo[r] - 1)),
                                 _mm256_cmpgt_epi32(_mm256_set1_epi32(t->hi[r] + 1), pos)));
            x[j] = _mm256_blendv_ps(ninf, _mm256_load_ps(&t->logits[r][8 * j]), _mm256_castsi256_ps(ok));
            cm = _mm256_max_ps(cm, x[j]);
        }
        float cmax = hmax8(cm), m_new = t->m[r] > cmax ? t->m[r] : cmax;
        if (m_new == -INFINITY) {
            memset(t->p[r], 0, sizeof t->p[r]);
            t->pmax[r] = 0.0f;
            continue;
        }
        float alpha = t->m[r] == m_new ? 1.0f : expf(t->m[r] - m_new);
        t->pmax[r] = cmax == m_new ? 1.0f : expf(cmax - m_new);
        if (alpha != 1.0f) {
            float *o = t->o + (size_t)r * (size_t)t->D;
            for (int d = 0; d < t->D; d += 8)
                _mm256_store_ps(o + d, _mm256_mul_ps(_mm256_load_ps(o + d), _mm256_set1_ps(alpha)));
        }
        __m256 mv = _mm256_set1_ps(m_new), sum = _mm256_setzero_ps();
        for (int j = 0; j < nv; j++) {
            __m256 p = exp256(_mm256_sub_ps(x[j], mv));
            _mm256_store_ps(&t->p[r][8 * j], p);
            sum = _mm256_add_ps(sum, p);
        }
        t->l[r] = t->l[r] * alpha + hsum8(sum);
        t->m[r] = m_new;
    }
}

/* ---- V: plain formats (token-major) --------------------------------------------------------------- */

TGT_INLINE static void vacc_pl(int fmt, kvp__tile *t, const uint8_t *vb, int t0, int n) {
    const int es = kvp__plain_size(fmt), D = t->D;
    const __m256 u = _mm256_set1_ps(plain_unit(fmt, t->fp8_v));
    for (int d0 = 0; d0 < D; d0 += 16) { /* D is a multiple of 16 for attention */
        __m256 a0[R], a1[R];
        UNROLL for (int r = 0; r < R; r++) a0[r] = a1[r] = _mm256_setzero_ps();
        for (int i = 0; i < n; i++) {
            const uint8_t *p = vb + ((size_t)(t0 + i) * (size_t)D + (size_t)d0) * (size_t)es;
            if (d0 == 0) /* the first pass over the tokens fetches whole rows ahead */
                for (int l = 0; l < D * es; l += 64) _mm_prefetch((const char *)p + t->pf_v + l, _MM_HINT_T2);
            __m256 v0 = load8(fmt, p), v1 = load8(fmt, p + 8 * es);
            UNROLL for (int r = 0; r < R; r++) {
                __m256 pr = _mm256_broadcast_ss(&t->p[r][i]);
                a0[r] = _mm256_fmadd_ps(pr, v0, a0[r]);
                a1[r] = _mm256_fmadd_ps(pr, v1, a1[r]);
            }
        }
        UNROLL for (int r = 0; r < R; r++) {
            float *o = t->o + (size_t)r * (size_t)D + (size_t)d0;
            _mm256_store_ps(o, _mm256_fmadd_ps(a0[r], u, _mm256_load_ps(o)));
            _mm256_store_ps(o + 8, _mm256_fmadd_ps(a1[r], u, _mm256_load_ps(o + 8)));
        }
    }
}

#define PLAIN_STAGES(name, FMT)                                                                    \
    TGT static void klogits_dm_##name(kvp__tile *t, const uint8_t *kb, const kvp__blockfmt *f,   \
                                      int t0, int n) {                                          \
        klogits_dm(FMT, t, kb, f, t0, n);                                                        \
    }                                                                                            \
    TGT static void klogits_tm_##name(kvp__tile *t, const uint8_t *kb, const kvp__blockfmt *f,   \
                                      int t0, int n) {                                          \
        (void)f;                                                                                 \
        klogits_tm(FMT, t, kb, t0, n);                                                           \
    }                                                                                            \
    TGT static void vacc_##name(kvp__tile *t, const uint8_t *vb, const kvp__blockfmt *f, int t0, \
                                int n) {                                                         \
        (void)f;                                                                                 \
        vacc_pl(FMT, t, vb, t0, n);                                                              \
    }
PLAIN_STAGES(fp32, KVP_FORMAT_FP32)
PLAIN_STAGES(fp16, KVP_FORMAT_FP16)
PLAIN_STAGES(bf16, KVP_FORMAT_BF16)
PLAIN_STAGES(fp8, KVP_FORMAT_FP8_E4M3)

/* ---- K: int8 / int4 through vpmaddwd ----------------------------------------------------------------- */

/* q' = q * channel scale, quantized per row to 15 bits as int16 (t->q16):
 * x = rne(q' / step), step = max|q'| / 16383. vpmaddwd then sums u8 codes
 * times x exactly in int32 (2 * 255 * 16383 per pair, 128 pairs at most at
 * head_dim 256). */
/* Pass 1 of the integer-key preps: q' = q * scale (to t->qf), and per row
 * the vectors of max|q'| and Σ q·(min + mid·scale) (mid: the code the
 * query's rounding error is charged at, 0 for a 15-bit query). */
TGT_INLINE static void kprep_fold(kvp__tile *t, const uint8_t *kb, const kvp__blockfmt *f, float mid,
                                  __m256 *amax, __m256 *cst) {
    const int D = t->D;
    const uint8_t *sc = kb + kvp__block_data_bytes(f), *mn = sc + 2 * (size_t)D;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    UNROLL for (int r = 0; r < R; r++) amax[r] = cst[r] = _mm256_setzero_ps();
    for (int d = 0; d < D; d += 8) {
        __m256 s = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(sc + 2 * d)));
        __m256 m = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(mn + 2 * d)));
        if (mid != 0.0f) m = _mm256_fmadd_ps(s, _mm256_set1_ps(mid), m);
        UNROLL for (int r = 0; r < R; r++) {
            __m256 q = _mm256_load_ps(&t->q[r][d]), qf = _mm256_mul_ps(q, s);
            _mm256_store_ps(&t->qf[r][d], qf);
            cst[r] = _mm256_fmadd_ps(q, m, cst[r]);
            amax[r] = _mm256_max_ps(amax[r], _mm256_andnot_ps(sign, qf));
        }
    }
}

TGT static void kprep_int16(kvp__tile *t, const uint8_t *kb, const kvp__blockfmt *f) {
    const int D = t->D;
    __m256 amax[R], cst[R];
    kprep_fold(t, kb, f, 0.0f, amax, cst);
    UNROLL for (int r = 0; r < R; r++) {
        float am = hmax8(amax[r]), step = am / 16383.0f;
        __m256 inv = _mm256_set1_ps(kvp__inv_or_zero(16383.0f, am));
        for (int d = 0; d < D; d += 16) { /* D is a multiple of 8; 16-wide with a tail */
            __m256i x0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_load_ps(&t->qf[r][d]), inv));
            __m256i x1 = d + 8 < D ? _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_load_ps(&t->qf[r][d + 8]), inv)) : x0;
            /* packs interleave the 128-bit lanes: put quads back in order */
            __m256i w = _mm256_permute4x64_epi64(_mm256_packs_epi32(x0, x1), 0xD8);
            if (d + 8 < D) _mm256_store_si256((__m256i *)(void *)&t->q16[r][d], w);
            else _mm_store_si128((__m128i *)(void *)&t->q16[r][d], _mm256_castsi256_si128(w));
        }
        t->qstep[r] = step;
        t->qconst[r] = hsum8(cst[r]); /* 15 bits: the rounding residual is fp32 noise */
    }
}

/* count <= 8 fp16 values at p as a vector (lanes past count 0), read with
 * exact-size integer loads: no read past the table, and no vector load of a
 * just-written buffer (which would stall on store forwarding). */
TGT_INLINE static __m128i load_halves(const uint8_t *p, int count) {
    uint64_t lo = 0, hi = 0;
    switch (count) {
    case 8: memcpy(&hi, p + 8, 8); /* fall through */
    case 4: memcpy(&lo, p, 8); break;
    case 3: memcpy(&lo, p, 4); memcpy((uint8_t *)&lo + 4, p + 4, 2); break;
    case 2: memcpy(&lo, p, 4); break;
    default: /* head dims the attention kernels do not take; kept exact anyway */
        for (int j = 0; j < count; j++) memcpy((uint8_t *)(j < 4 ? &lo : &hi) + 2 * (j % 4), p + 2 * j, 2);
    }
    return _mm_set_epi64x((long long)hi, (long long)lo);
}

TGT void kvp__k4_outlier_prep(kvp__tile *t, const uint8_t *kb, const kvp__blockfmt *f) {
    kvp__k4_outl o = kvp__k4_outliers_of(kb, f);
    if (o.count == 0) return;
    /* count <= KVP__ATTN_MAX_D / 8 = 32: scales and mins converted 8 at a time */
    float cst[R] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int j0 = 0; j0 < o.count; j0 += 8) {
        const int c = o.count - j0 < 8 ? o.count - j0 : 8;
        uint16_t idx[8];
        memcpy(idx, o.table + 2 * (size_t)j0, 2 * (size_t)c);
        float sm[16] KVP__ALIGN64; /* scales, then mins */
        _mm256_store_ps(sm, _mm256_cvtph_ps(load_halves(o.table + 2 * (size_t)(o.count + j0), c)));
        _mm256_store_ps(sm + 8, _mm256_cvtph_ps(load_halves(o.table + 2 * (size_t)(2 * o.count + j0), c)));
        for (int j = 0; j < c; j++)
            for (int r = 0; r < R; r++) {
                float q = kvp__k4_outlier_q(t, r, idx[j]);
                t->k4a[r][j0 + j] = q * sm[j];
                cst[r] += q * sm[8 + j];
            }
    }
    for (int r = 0; r < R; r++) t->qconst[r] += cst[r];
}

/* int4 keys: q' = q * scale to 8 bits per row (step = max|q'| / 127), as
 * the AVX-512 prep: the outlier channels are the int8 table's, so they do
 * not set the step, and the rounding error times the middle code (7.5)
 * goes to the constant. vpmaddubsw then takes the u8 codes (0..15) against
 * s8 q with no saturation (2 * 15 * 127 per pair). */
TGT static void kprep_int4(kvp__tile *t, const uint8_t *kb, const kvp__blockfmt *f) {
    const int D = t->D;
    __m256 amax[R], cst[R];
    kprep_fold(t, kb, f, 7.5f, amax, cst); /* cst: Σ q·(min + 7.5·scale) */
    UNROLL for (int r = 0; r < R; r++) {
        float am = hmax8(amax[r]), step = am / 127.0f;
        __m256 inv = _mm256_set1_ps(kvp__inv_or_zero(127.0f, am));
        __m256i xs = _mm256_setzero_si256();
        for (int d = 0; d < D; d += 8) {
            __m256i x = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_load_ps(&t->qf[r][d]), inv));
            xs = _mm256_add_epi32(xs, x);
            __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
            _mm_storel_epi64((__m128i *)(void *)&t->qh[r][d], _mm_packs_epi16(w, w));
        }
        t->qstep[r] = step;
        t->qconst[r] = hsum8(cst[r]) - 7.5f * step * (float)hsum8(_mm256_cvtepi32_ps(xs));
    }
    kvp__k4_outlier_prep(t, kb, f);
}

/* Tokens [i0, i0+8) of n: 32-bit lanes valid for token < n. */
TGT_INLINE static __m256i token_mask8(int i0, int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n - i0), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* acc (lanes: token a's channel pairs 01, 23, token b's, ...) for tokens
 * 0-3 and 4-7 -> 8 logits in token order, stored for the valid tokens. */
TGT_INLINE static void store_logits8(kvp__tile *t, int r, int i0, __m256i sums, __m256i valid) {
    __m256 l = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_set1_ps(t->qstep[r]), _mm256_set1_ps(t->qconst[r]));
    _mm256_maskstore_ps(&t->logits[r][i0], valid, l);
}

/* int8 keys, [D/4][P][4]: 8 tokens x 4 channels per 32 bytes, widened to
 * two vectors of 16-bit codes, vpmaddwd against (q0 q1 q2 q3) broadcast. */
TGT static void klogits_int8(kvp__tile *t, const uint8_t *kb, const kvp__blockfmt *f, int t0, int n) {
    const int P = f->page_size, D = t->D;
    for (int i0 = 0; i0 < n; i0 += 8) {
        const __m256i valid = token_mask8(i0, n);
        __m256i a0[R], a1[R];
        UNROLL for (int r = 0; r < R; r++) a0[r] = a1[r] = _mm256_setzero_si256();
        const uint8_t *base = kb + (size_t)(t0 + i0) * 4;
        for (int d = 0; d < D; d += 4) {
            const uint8_t *p = base + (size_t)(d / 4) * (size_t)P * 4;
            _mm_prefetch((const char *)p + t->pf_k, _MM_HINT_T2);
            __m256i b = _mm256_maskload_epi32((const int *)(const void *)p, valid);
            __m256i c0 = _mm256_cvtepu8_epi16(_mm256_castsi256_si128(b));
            __m256i c1 = _mm256_cvtepu8_epi16(_mm256_extracti128_si256(b, 1));
            UNROLL for (int r = 0; r < R; r++) {
                int64_t qq;
                memcpy(&qq, &t->q16[r][d], 8);
                __m256i q = _mm256_set1_epi64x(qq);
                a0[r] = _mm256_add_epi32(a0[r], _mm256_madd_epi16(c0, q));
                a1[r] = _mm256_add_epi32(a1[r], _mm256_madd_epi16(c1, q));
            }
        }
        /* hadd: per 128 bits [t0 t1 t4 t5] / [t2 t3 t6 t7] -> quads in order */
        UNROLL for (int r = 0; r < R; r++)
            store_logits8(t, r, i0, _mm256_permute4x64_epi64(_mm256_hadd_epi32(a0[r], a1[r]), 0xD8), valid);
    }
}


/* int4 keys' outlier channels: logits += a . code, 8 tokens per vector (a
 * and the constant from kvp__k4_outlier_prep). int4's codes come in channel
 * quads ([R/4][P][4]: a token's 4 codes in one 32-bit lane, taken apart
 * with shifts), int4_v1's as [R][P]. */
TGT static void k4_outliers(kvp__tile *t, const uint8_t *kb, const kvp__blockfmt *f, int t0, int n) {
    kvp__k4_outl o = kvp__k4_outliers_of(kb, f);
    const __m256i byte = _mm256_set1_epi32(0xFF);
    for (int i0 = 0; i0 < n; i0 += 8) {
        const __m256i valid = token_mask8(i0, n);
        __m256 acc[R];
        UNROLL for (int r = 0; r < R; r++) acc[r] = _mm256_maskload_ps(&t->logits[r][i0], valid);
        if (o.quads) {
            for (int j = 0; j < o.count; j += 4) {
                const uint8_t *p = o.codes + ((size_t)(j / 4) * (size_t)f->page_size + (size_t)(t0 + i0)) * 4;
                __m256i w = _mm256_maskload_epi32((const int *)(const void *)p, valid);
                UNROLL for (int k = 0; k < 4; k++) {
                    __m256 c = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(w, 8 * k), byte));
                    UNROLL for (int r = 0; r < R; r++)
                        acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(t->k4a[r][j + k]), c, acc[r]);
                }
            }
        } else {
            for (int j = 0; j < o.count; j++) {
                const uint8_t *p = o.codes + (size_t)j * (size_t)f->page_size + (size_t)(t0 + i0);
                uint8_t tmp[8] = {0};
                memcpy(tmp, p, (size_t)(n - i0 < 8 ? n - i0 : 8));
                __m256 c = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)tmp)));
                UNROLL for (int r = 0; r < R; r++) acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(t->k4a[r][j]), c, acc[r]);
            }
        }
        UNROLL for (int r = 0; r < R; r++) _mm256_maskstore_ps(&t->logits[r][i0], valid, acc[r]);
    }
}

/* int4 keys, [D/4][P/2][4] with tokens 2i / 2i+1 in the low / high nibble:
 * 16 bytes hold 8 tokens x 4 channels; the low nibbles (even tokens) and the
 * high ones (odd) make one vector of u8 codes for vpmaddubsw against the
 * 8-bit query. The 16-bit pair sums (|.| <= 3810) add up over 8 channel
 * quads before vpmaddwd widens them to one int32 per token. */
TGT static void klogits_int4(kvp__tile *t, const uint8_t *kb, const kvp__blockfmt *f, int t0, int n) {
    const int P = f->page_size, D = t->D;
    const __m128i low = _mm_set1_epi8(0x0F);
    const __m256i ones = _mm256_set1_epi16(1);
    for (int i0 = 0; i0 < n; i0 += 8) {
        const __m256i valid = token_mask8(i0, n);
        /* token pairs present: 4 bytes each */
        const __m128i pairs = _mm_cmpgt_epi32(_mm_set1_epi32((n - i0 + 1) / 2), _mm_setr_epi32(0, 1, 2, 3));
        __m256i acc[R], a16[R];
        UNROLL for (int r = 0; r < R; r++) acc[r] = a16[r] = _mm256_setzero_si256();
        const uint8_t *base = kb + (size_t)((t0 + i0) / 2) * 4;
        for (int d = 0; d < D; d += 4) {
            const uint8_t *p = base + (size_t)(d / 4) * (size_t)(P / 2) * 4;
            _mm_prefetch((const char *)p + t->pf_k, _MM_HINT_T2);
            __m128i b = _mm_maskload_epi32((const int *)(const void *)p, pairs);
            __m256i c = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), low), _mm_and_si128(b, low));
            UNROLL for (int r = 0; r < R; r++) {
                int32_t qq;
                memcpy(&qq, &t->qh[r][d], 4);
                a16[r] = _mm256_add_epi16(a16[r], _mm256_maddubs_epi16(c, _mm256_set1_epi32(qq)));
            }
            if ((d & 31) == 28 || d + 4 >= D) /* every 8 quads: widen before 16 bits overflow */
                UNROLL for (int r = 0; r < R; r++) {
                    acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(a16[r], ones));
                    a16[r] = _mm256_setzero_si256();
                }
        }
        /* lanes: tokens 0 2 4 6 | 1 3 5 7 */
        const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        UNROLL for (int r = 0; r < R; r++)
            store_logits8(t, r, i0, _mm256_permutevar8x32_epi32(acc[r], order), valid);
    }
    k4_outliers(t, kb, f, t0, n);
}

/* ---- V: int8 / int4, decoded per token group -------------------------------------------------- */





/* Probabilities times token scales (w = p·s, n4 tokens of one row, <= bound
 * top) quantized to 15 bits, as int16 in token order; returns the step. */
TGT_INLINE static float quantize_w15(const float *p, const float *s, int n4, float top, int16_t *out) {
    const __m256 inv = _mm256_set1_ps(kvp__inv_or_zero(32767.0f, top));
    for (int i = 0; i < KVP__CHUNK; i += 16) {
        __m256i x0 = _mm256_setzero_si256(), x1 = x0;
        if (i < n4) x0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_mul_ps(_mm256_load_ps(p + i), _mm256_load_ps(s + i)), inv));
        if (i + 8 < n4) x1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_mul_ps(_mm256_load_ps(p + i + 8), _mm256_load_ps(s + i + 8)), inv));
        /* saturating pack: exp may round p a hair above pmax */
        _mm256_store_si256((__m256i *)(void *)(out + i), _mm256_permute4x64_epi64(_mm256_packs_epi32(x0, x1), 0xD8));
    }
    return top / 32767.0f;
}

/* Scales of n4 tokens (fp16 at src) as fp32 in dst (zero past n4); returns
 * the largest (scales are >= 0). Reads only the n4 scales: a block's scales
 * may end the arena. */
TGT_INLINE static float load_scales8(const uint8_t *src, int n4, float *dst) {
    __m256 mx = _mm256_setzero_ps();
    for (int i = 0; i < KVP__CHUNK; i += 8) {
        __m256 v = _mm256_setzero_ps();
        const __m128i *p = (const __m128i *)(const void *)(src + 2 * (size_t)i);
        if (i + 8 <= n4) v = _mm256_cvtph_ps(_mm_loadu_si128(p));
        else if (i < n4) v = _mm256_cvtph_ps(_mm_loadl_epi64(p)); /* n4 is a multiple of 4 */
        _mm256_store_ps(dst + i, v);
        mx = _mm256_max_ps(mx, v);
    }
    return hmax8(mx);
}

/* 4 int16 weights (a token group's) as one 64-bit value. */
static inline int64_t load64(const int16_t *p) {
    int64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* o[r][d..d+8) += step[r] * (lane pairs of lo: channels d..d+3, hi: d+4..d+7
 * or, for int4, the group's other half) + add[r]. */
TGT_INLINE static __m256 pair_sums(__m256i lo, __m256i hi) {
    /* hadd: per 128 bits [lo c0 c1, hi c0 c1] / [lo c2 c3, hi c2 c3] */
    return _mm256_cvtepi32_ps(_mm256_permute4x64_epi64(_mm256_hadd_epi32(lo, hi), 0xD8));
}

/* int8 values: token groups [D][4] (s8), one fp16 scale per token;
 * vpmaddwd of the codes widened to 16 bits against 15-bit p·scale. nb
 * blocks: 2 for a pair of full pages (block b's token i at p[r][P*b + i],
 * one bound and one output update for both). */
TGT_INLINE static void vacc_int8_body(kvp__tile *t, const uint8_t *const *vbs, const ptrdiff_t *pfs, int nb,
                                      const kvp__blockfmt *f, int t0, int n) {
    const int D = t->D, P = f->page_size, n4 = n / 4 * 4, groups = n4 / 4;
    float s[2 * KVP__CHUNK + KVP__CHUNK] KVP__ALIGN64, step[R], smax = 0.0f;
    int16_t pq[R][2 * KVP__CHUNK + KVP__CHUNK] KVP__ALIGN64;
    for (int bk = 0; bk < nb; bk++) { /* in order: a block's zeros past n4 are the next one's start */
        float mx = load_scales8(vbs[bk] + kvp__block_data_bytes(f) + 2 * (size_t)t0, n4, s + P * bk);
        smax = mx > smax ? mx : smax;
    }
    for (int r = 0; r < R; r++)
        for (int bk = 0; bk < nb; bk++)
            step[r] = quantize_w15(t->p[r] + P * bk, s + P * bk, n4, t->pmax[r] * smax, pq[r] + P * bk);
    for (int d = 0; d < D; d += 8) {
        __m256i lo[R], hi[R];
        UNROLL for (int r = 0; r < R; r++) lo[r] = hi[r] = _mm256_setzero_si256();
        for (int bk = 0; bk < nb; bk++) {
            const uint8_t *base = vbs[bk] + (size_t)t0 * (size_t)D;
            for (int g = 0; g < groups; g++) {
                const uint8_t *p = base + (size_t)g * 4 * (size_t)D + (size_t)d * 4;
                _mm_prefetch((const char *)p + pfs[bk], _MM_HINT_T2);
                __m256i b = _mm256_loadu_si256((const __m256i *)(const void *)p);
                __m256i c0 = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(b));
                __m256i c1 = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(b, 1));
                UNROLL for (int r = 0; r < R; r++) {
                    __m256i w = _mm256_set1_epi64x(load64(pq[r] + P * bk + 4 * g));
                    lo[r] = _mm256_add_epi32(lo[r], _mm256_madd_epi16(c0, w));
                    hi[r] = _mm256_add_epi32(hi[r], _mm256_madd_epi16(c1, w));
                }
            }
        }
        UNROLL for (int r = 0; r < R; r++) {
            float *o = t->o + (size_t)r * (size_t)D + (size_t)d;
            _mm256_store_ps(o, _mm256_fmadd_ps(pair_sums(lo[r], hi[r]), _mm256_set1_ps(step[r]), _mm256_load_ps(o)));
        }
    }
    if (n4 < n) kvp__vacc_tail(t, vbs[0], f, t0, n4, n);
}

/* The one-block and two-block (pair) entry points of an integer V stage. */
#define INT_V_STAGES(fmt)                                                                          \
    TGT static void vacc_##fmt(kvp__tile *t, const uint8_t *vb, const kvp__blockfmt *f, int t0,   \
                               int n) {                                                            \
        const uint8_t *vbs[1] = {vb};                                                              \
        const ptrdiff_t pfs[1] = {t->pf_v};                                                        \
        vacc_##fmt##_body(t, vbs, pfs, 1, f, t0, n);                                               \
    }                                                                                              \
    TGT static void vacc2_##fmt(kvp__tile *t, const uint8_t *vb0, const uint8_t *vb1,             \
                                ptrdiff_t pf1, const kvp__blockfmt *f) {                           \
        const uint8_t *vbs[2] = {vb0, vb1};                                                        \
        const ptrdiff_t pfs[2] = {t->pf_v, pf1};                                                   \
        vacc_##fmt##_body(t, vbs, pfs, 2, f, 0, f->page_size);                                     \
    }
INT_V_STAGES(int8)

/* w = p·s (n4 tokens of one row, <= bound top) quantized to u8 codes in
 * token order (zero past n4); returns the step. */
TGT_INLINE static float quantize_w8(const float *p, const float *s, int n4, float top, uint8_t *out) {
    const __m256 inv = _mm256_set1_ps(kvp__inv_or_zero(255.0f, top));
    __m256i x[4];
    for (int k = 0; k < 4; k++)
        x[k] = 8 * k < n4 ? _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_mul_ps(_mm256_load_ps(p + 8 * k), _mm256_load_ps(s + 8 * k)), inv))
                          : _mm256_setzero_si256();
    /* packs work per 128-bit lane: dwords 0-3 of x0 x1 | 4-7 of x0 x1 ... */
    __m256i w01 = _mm256_packs_epi32(x[0], x[1]), w23 = _mm256_packs_epi32(x[2], x[3]);
    __m256i b = _mm256_packus_epi16(w01, w23); /* saturating: exp may round p above pmax */
    /* dword order now 0 2 4 6 1 3 5 7 (4 tokens each): restore 0..7 */
    _mm256_storeu_si256((__m256i *)(void *)out, /* at a pair's second page of 16: 16-byte aligned */
                        _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    return top / 255.0f;
}

/* int4 values: per 32-channel group, channel i low nibble, i + W/2 high;
 * p·scale to u8 and the codes centred (c - 8) as s8, as the AVX-512
 * kernel: vpmaddubsw pair sums (|.| <= 4080) add up in 16 bits over a
 * block's <= 8 token groups, then vpmaddwd widens them, one int32 per
 * channel; Σ p·(min + 8·scale) is added per group. nb blocks as
 * vacc_int8_body. */
TGT_INLINE static void vacc_int4_body(kvp__tile *t, const uint8_t *const *vbs, const ptrdiff_t *pfs, int nb,
                                      const kvp__blockfmt *f, int t0, int n) {
    const int D = t->D, P = f->page_size, G = kvp__v4_groups(D), n4 = n / 4 * 4, groups = n4 / 4;
    const __m128i low = _mm_set1_epi8(0x0F), eight = _mm_set1_epi8(8);
    const __m256i ones = _mm256_set1_epi16(1);
    for (int g = 0; g < G; g++) {
        int width = D - 32 * g < 32 ? D - 32 * g : 32, half = width / 2;
        float s[2 * KVP__CHUNK + KVP__CHUNK] KVP__ALIGN64, m[2 * KVP__CHUNK + KVP__CHUNK] KVP__ALIGN64;
        float step[R], mterm[R], smax = 0.0f;
        uint8_t pq[R][2 * KVP__CHUNK + KVP__CHUNK] KVP__ALIGN64;
        for (int bk = 0; bk < nb; bk++) { /* in order: a block's zeros past n4 are the next one's start */
            const uint8_t *sc = vbs[bk] + kvp__block_data_bytes(f), *mn = sc + 2 * (size_t)G * (size_t)P;
            float mx = load_scales8(sc + 2 * ((size_t)g * (size_t)P + (size_t)t0), n4, s + P * bk);
            smax = mx > smax ? mx : smax;
            load_scales8(mn + 2 * ((size_t)g * (size_t)P + (size_t)t0), n4, m + P * bk);
        }
        UNROLL for (int r = 0; r < R; r++) {
            for (int bk = 0; bk < nb; bk++)
                step[r] = quantize_w8(t->p[r] + P * bk, s + P * bk, n4, t->pmax[r] * smax, pq[r] + P * bk);
            __m256 acc = _mm256_setzero_ps();
            for (int i = 0; i < P * (nb - 1) + n4; i += 8) { /* past the tokens the scales are 0 */
                __m256 wv = _mm256_fmadd_ps(_mm256_load_ps(s + i), _mm256_set1_ps(8.0f), _mm256_load_ps(m + i));
                acc = _mm256_fmadd_ps(_mm256_loadu_ps(&t->p[r][i]), wv, acc);
            }
            mterm[r] = hsum8(acc);
        }
        for (int c = 0; c < half; c += 4) { /* byte channels c..c+3: channels c.., half+c.. */
            __m256i a32[R];
            UNROLL for (int r = 0; r < R; r++) a32[r] = _mm256_setzero_si256();
            for (int bk = 0; bk < nb; bk++) {
                const uint8_t *gb = vbs[bk] + (size_t)t0 * (size_t)D / 2 + (size_t)g * 64;
                __m256i a16[R];
                UNROLL for (int r = 0; r < R; r++) a16[r] = _mm256_setzero_si256();
                for (int tg = 0; tg < groups; tg++) { /* <= 8 groups: 16-bit sums do not overflow */
                    const uint8_t *p = gb + (size_t)tg * 2 * (size_t)D + (size_t)c * 4;
                    _mm_prefetch((const char *)p + pfs[bk], _MM_HINT_T2);
                    __m128i b = _mm_loadu_si128((const __m128i *)(const void *)p);
                    __m256i cv = _mm256_set_m128i(_mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(b, 4), low), eight),
                                                  _mm_sub_epi8(_mm_and_si128(b, low), eight));
                    UNROLL for (int r = 0; r < R; r++) {
                        int32_t pp;
                        memcpy(&pp, &pq[r][P * bk + 4 * tg], 4);
                        a16[r] = _mm256_add_epi16(a16[r], _mm256_maddubs_epi16(_mm256_set1_epi32(pp), cv));
                    }
                }
                UNROLL for (int r = 0; r < R; r++) a32[r] = _mm256_add_epi32(a32[r], _mm256_madd_epi16(a16[r], ones));
            }
            UNROLL for (int r = 0; r < R; r++) {
                /* lanes 0-3: channels c..c+3; 4-7: half+c.. */
                float *o = t->o + (size_t)r * (size_t)D + (size_t)(32 * g);
                __m256 sum = _mm256_cvtepi32_ps(a32[r]);
                __m256 prev = _mm256_set_m128(_mm_loadu_ps(o + half + c), _mm_loadu_ps(o + c));
                __m256 v = _mm256_add_ps(_mm256_fmadd_ps(sum, _mm256_set1_ps(step[r]), prev), _mm256_set1_ps(mterm[r]));
                _mm_storeu_ps(o + c, _mm256_castps256_ps128(v));
                _mm_storeu_ps(o + half + c, _mm256_extractf128_ps(v, 1));
            }
        }
    }
    if (n4 < n) kvp__vacc_tail(t, vbs[0], f, t0, n4, n);
}

INT_V_STAGES(int4)

/* ---- prefill blocks (cpu.h) ------------------------------------------------------------------ */

#define PFC KVP__PF_CHUNK

/* The first n (<= 8) lanes set. */
TGT_INLINE static __m256i lanes8(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_set_epi32(7, 6, 5, 4, 3, 2, 1, 0));
}

/* 8 plain elements at p, the first n valid (n < 8: the rest zero). */
TGT_INLINE static __m256 load8_n(int fmt, const uint8_t *p, int n, __m256 u) {
    __m256 v = n >= 8 ? load8(fmt, p) : load8_part(fmt, p, n);
    return fmt == KVP_FORMAT_FP8_E4M3 ? _mm256_mul_ps(v, u) : v;
}

TGT_INLINE static void store8_n(float *dst, __m256 v, int n) {
    if (n >= 8) _mm256_storeu_ps(dst, v);
    else _mm256_maskstore_ps(dst, lanes8(n), v);
}

/* Plain keys, dim-major: each channel's tokens converted where they lie. */
TGT_INLINE static void pf_kdec_dm(int fmt, const uint8_t *kb, const kvp__blockfmt *f, int t0, int n,
                                  float fp8_scale, float *kc) {
    const int es = kvp__plain_size(fmt), P = f->page_size, D = f->head_dim;
    const __m256 u = _mm256_set1_ps(plain_unit(fmt, fp8_scale));
    for (int d = 0; d < D; d++) {
        const uint8_t *p = kb + ((size_t)d * (size_t)P + (size_t)t0) * (size_t)es;
        for (int i = 0; i < n; i += 8)
            store8_n(kc + (size_t)d * PFC + (size_t)i, load8_n(fmt, p + (size_t)i * (size_t)es, n - i, u), n - i);
    }
}

/* Plain keys, token-major: 8 tokens x 8 channels at a time, transposed in
 * registers. */
TGT_INLINE static void pf_kdec_tm(int fmt, const uint8_t *kb, const kvp__blockfmt *f, int t0, int n,
                                  float fp8_scale, float *kc) {
    const int es = kvp__plain_size(fmt), D = f->head_dim;
    const __m256 u = _mm256_set1_ps(plain_unit(fmt, fp8_scale));
    for (int i0 = 0; i0 < n; i0 += 8)
        for (int d = 0; d < D; d += 8) {
            __m256 r[8], t[8];
            UNROLL for (int i = 0; i < 8; i++)
                r[i] = i0 + i < n ? load8_n(fmt, kb + ((size_t)(t0 + i0 + i) * (size_t)D + (size_t)d) * (size_t)es, 8, u)
                                  : _mm256_setzero_ps();
            UNROLL for (int i = 0; i < 4; i++) {
                t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
                t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
            }
            /* r[4h + k]: tokens 4h..4h+3 of channel 4L + k in 128-bit lane L */
            UNROLL for (int h = 0; h < 2; h++) {
                r[4 * h + 0] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], 0x44);
                r[4 * h + 1] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], 0xEE);
                r[4 * h + 2] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0x44);
                r[4 * h + 3] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0xEE);
            }
            float *o = kc + (size_t)d * PFC + (size_t)i0;
            UNROLL for (int k = 0; k < 4; k++) {
                store8_n(o + (size_t)k * PFC, _mm256_permute2f128_ps(r[k], r[k + 4], 0x20), n - i0);
                store8_n(o + (size_t)(k + 4) * PFC, _mm256_permute2f128_ps(r[k], r[k + 4], 0x31), n - i0);
            }
        }
}

/* Plain values: rows converted. */
TGT_INLINE static void pf_vdec_pl(int fmt, const uint8_t *vb, const kvp__blockfmt *f, int t0, int n,
                                  float fp8_scale, float *vc) {
    const int es = kvp__plain_size(fmt), D = f->head_dim;
    const __m256 u = _mm256_set1_ps(plain_unit(fmt, fp8_scale));
    for (int i = 0; i < n; i++) {
        const uint8_t *p = vb + (size_t)(t0 + i) * (size_t)D * (size_t)es;
        for (int d = 0; d < D; d += 8)
            _mm256_store_ps(vc + (size_t)i * KVP__ATTN_MAX_D + (size_t)d, load8_n(fmt, p + (size_t)d * (size_t)es, 8, u));
    }
}

#define PF_PLAIN(name, FMT)                                                                        \
    TGT static void pf_kdec_dm_##name(const uint8_t *kb, const kvp__blockfmt *f, int t0, int n,   \
                                      float s, float *kc) {                                         \
        pf_kdec_dm(FMT, kb, f, t0, n, s, kc);                                                      \
    }                                                                                              \
    TGT static void pf_kdec_tm_##name(const uint8_t *kb, const kvp__blockfmt *f, int t0, int n,   \
                                      float s, float *kc) {                                         \
        pf_kdec_tm(FMT, kb, f, t0, n, s, kc);                                                      \
    }                                                                                              \
    TGT static void pf_vdec_##name(const uint8_t *vb, const kvp__blockfmt *f, int t0, int n,       \
                                   float s, float *vc) {                                            \
        pf_vdec_pl(FMT, vb, f, t0, n, s, vc);                                                      \
    }
PF_PLAIN(fp32, KVP_FORMAT_FP32)
PF_PLAIN(fp16, KVP_FORMAT_FP16)
PF_PLAIN(bf16, KVP_FORMAT_BF16)
PF_PLAIN(fp8, KVP_FORMAT_FP8_E4M3)

/* 16 registers: the logits go 4 rows x 16 tokens at a time (8
 * accumulators, each K load feeding 4 FMAs), to b->s; the softmax works
 * row by row from there; o += p.v takes 4 rows x 16 channels (8
 * accumulators, the rescale folded into their load). */
TGT static void pf_block_avx2(kvp__pblock *b, int r0, int32_t pos0, int n, int masked) {
    const int D = b->D;
    for (int rh = r0; rh < r0 + KVP__PF_BLOCK; rh += 4)
        for (int c0 = 0; c0 < PFC; c0 += 16) {
            __m256 a[4], c[4];
            UNROLL for (int r = 0; r < 4; r++) a[r] = c[r] = _mm256_setzero_ps();
            for (int d = 0; d < D; d++) {
                __m256 k0 = _mm256_load_ps(&b->kc[d][c0]), k1 = _mm256_load_ps(&b->kc[d][c0 + 8]);
                UNROLL for (int r = 0; r < 4; r++) {
                    __m256 q = _mm256_broadcast_ss(&b->q[rh + r][d]);
                    a[r] = _mm256_fmadd_ps(q, k0, a[r]);
                    c[r] = _mm256_fmadd_ps(q, k1, c[r]);
                }
            }
            UNROLL for (int r = 0; r < 4; r++) {
                _mm256_store_ps(&b->s[rh + r][c0], a[r]);
                _mm256_store_ps(&b->s[rh + r][c0 + 8], c[r]);
            }
        }
    float al[KVP__PF_BLOCK];
    const __m256i iota = _mm256_set_epi32(7, 6, 5, 4, 3, 2, 1, 0);
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    for (int r = r0; r < r0 + KVP__PF_BLOCK; r++) {
        __m256 x[PFC / 8], vis[PFC / 8], mx = ninf;
        UNROLL for (int j = 0; j < PFC / 8; j++) {
            x[j] = _mm256_load_ps(&b->s[r][8 * j]);
            vis[j] = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
            if (masked) {
                __m256i pos = _mm256_add_epi32(iota, _mm256_set1_epi32(pos0 + 8 * j));
                __m256i ok = _mm256_and_si256(lanes8(n - 8 * j),
                                              _mm256_andnot_si256(_mm256_cmpgt_epi32(_mm256_set1_epi32(b->lo[r]), pos),
                                                                  _mm256_cmpgt_epi32(_mm256_set1_epi32(b->hi[r] + 1), pos)));
                vis[j] = _mm256_castsi256_ps(ok);
            }
            mx = _mm256_max_ps(mx, _mm256_blendv_ps(ninf, x[j], vis[j]));
        }
        float cm = hmax8(mx), m_old = b->m[r], m_new = m_old > cm ? m_old : cm;
        al[r - r0] = 1.0f;
        if (m_new == -INFINITY) { /* nothing visible yet: p = 0 */
            UNROLL for (int j = 0; j < PFC / 8; j++) _mm256_store_ps(&b->s[r][8 * j], _mm256_setzero_ps());
            continue;
        }
        if (m_old != m_new) al[r - r0] = _mm_cvtss_f32(_mm256_castps256_ps128(exp256(_mm256_set1_ps(m_old - m_new))));
        __m256 mv = _mm256_set1_ps(m_new), lv = _mm256_mul_ps(_mm256_load_ps(b->lv[r]), _mm256_set1_ps(al[r - r0]));
        UNROLL for (int j = 0; j < PFC / 8; j++) {
            __m256 p = _mm256_and_ps(exp256(_mm256_sub_ps(x[j], mv)), vis[j]);
            _mm256_store_ps(&b->s[r][8 * j], p);
            lv = _mm256_add_ps(lv, p);
        }
        _mm256_store_ps(b->lv[r], lv);
        b->m[r] = m_new;
    }
    for (int rh = r0; rh < r0 + KVP__PF_BLOCK; rh += 4)
        for (int d0 = 0; d0 < D; d0 += 16) {
            __m256 o0[4], o1[4];
            UNROLL for (int r = 0; r < 4; r++) {
                float *o = b->o + (size_t)(rh + r) * (size_t)D + (size_t)d0;
                __m256 s = _mm256_set1_ps(al[rh + r - r0]);
                o0[r] = _mm256_mul_ps(_mm256_loadu_ps(o), s);
                o1[r] = _mm256_mul_ps(_mm256_loadu_ps(o + 8), s);
            }
            for (int i = 0; i < n; i++) {
                __m256 w0 = _mm256_load_ps(&b->vc[i][d0]), w1 = _mm256_load_ps(&b->vc[i][d0 + 8]);
                UNROLL for (int r = 0; r < 4; r++) {
                    __m256 p = _mm256_broadcast_ss(&b->s[rh + r][i]);
                    o0[r] = _mm256_fmadd_ps(p, w0, o0[r]);
                    o1[r] = _mm256_fmadd_ps(p, w1, o1[r]);
                }
            }
            UNROLL for (int r = 0; r < 4; r++) {
                float *o = b->o + (size_t)(rh + r) * (size_t)D + (size_t)d0;
                _mm256_storeu_ps(o, o0[r]);
                _mm256_storeu_ps(o + 8, o1[r]);
            }
        }
}

const kvp__kernels kvp__kernels_avx2 = {
    "avx2",
    {kprep_plain, kprep_plain, kprep_plain, kprep_plain, kprep_int16, kprep_int4},
    {{klogits_tm_fp32, klogits_dm_fp32},
     {klogits_tm_fp16, klogits_dm_fp16},
     {klogits_tm_bf16, klogits_dm_bf16},
     {klogits_tm_fp8, klogits_dm_fp8},
     {klogits_int8, klogits_int8},
     {klogits_int4, klogits_int4}},
    softmax_avx2,
    {vacc_fp32, vacc_fp16, vacc_bf16, vacc_fp8, vacc_int8, vacc_int4},
    {NULL, NULL, NULL, NULL, vacc2_int8, vacc2_int4},
    {NULL, NULL, NULL, NULL, NULL, NULL},
    pf_block_avx2,
    /* plain formats; int8/int4 keep the tiles' integer dot products */
    (1u << KVP_FORMAT_FP32) | (1u << KVP_FORMAT_FP16) | (1u << KVP_FORMAT_BF16) |
        (1u << KVP_FORMAT_FP8_E4M3),
    (1u << KVP_FORMAT_FP32) | (1u << KVP_FORMAT_FP16) | (1u << KVP_FORMAT_BF16) |
        (1u << KVP_FORMAT_FP8_E4M3),
    {{pf_kdec_tm_fp32, pf_kdec_dm_fp32},
     {pf_kdec_tm_fp16, pf_kdec_dm_fp16},
     {pf_kdec_tm_bf16, pf_kdec_dm_bf16},
     {pf_kdec_tm_fp8, pf_kdec_dm_fp8},
     {NULL, NULL},
     {NULL, NULL}},
    {pf_vdec_fp32, pf_vdec_fp16, pf_vdec_bf16, pf_vdec_fp8, NULL, NULL},
    0,
    {NULL, NULL, NULL, NULL},
    NULL,
    NULL,
    NULL,
    NULL,
    NULL,
};

#else
const kvp__kernels kvp__kernels_avx2 = {"avx2", {0}, {{0}}, NULL, {0}, {0}, {0}, NULL, 0, 0, {{0}}, {0},
                                        0,      {0}, NULL,   NULL, NULL, NULL, NULL};
#endif
