/*
 * AVX-512 kernel stages (F, BW, VL, VNNI, F16C). Compiled with target
 * attributes, used only when the CPU has them (lib/cpu/isa.c).
 *
 * Floating keys/values: dequantize 16 elements per instruction (fp16/bf16/
 * fp8 -> fp32) and FMA; the query heads of the tile share every load.
 * Integer keys/values use VNNI (vpdpbusd: 64 u8 x s8 products per
 * instruction): keys are unsigned codes, the query is folded with the page's
 * channel scales and quantized to 15 bits (two s8 halves); for values the
 * probabilities, folded with the value scales, are quantized to u8 per chunk
 * and row. See docs/formats.md for the error these add.
 */
#include "cpu.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#include <string.h>

#define TGT_INLINE __attribute__((always_inline, target("avx512f,avx512bw,avx512vl,avx512vnni,avx512dq,avx2,fma,f16c"))) inline
#define TGT __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx512dq,avx2,fma,f16c")))
#define R KVP__TILE_ROWS
#define RN (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
/* Register blocking needs these small loops unrolled, or the accumulators
 * live on the stack. */
#define UNROLL _Pragma("GCC unroll 8")
/* acc += a(u8) . b(s8) in place. GCC 12 copies the accumulator around every
 * vpdpbusd intrinsic (tripling the instruction count of these loops); the
 * one-instruction asm keeps it in its register. */
/* Expand X(r) for the 4 rows of a tile: named accumulators stay in registers
 * where arrays of vectors (with the asm below) would live on the stack. */
#define R4(X) X(0) X(1) X(2) X(3)
/* DPBUSD_B: the s8 operand is a 32-bit value in memory broadcast to every
 * lane (embedded {1to16}: no separate broadcast instruction). */
#if defined(__clang__)
#define DPBUSD(acc, a, b) ((acc) = _mm512_dpbusd_epi32((acc), (a), (b)))
#define DPBUSD_B(acc, a, p32) ((acc) = _mm512_dpbusd_epi32((acc), (a), _mm512_set1_epi32(load32(p32))))
#else
#define DPBUSD(acc, a, b) __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b))
#define DPBUSD_B(acc, a, p32)                                                                      \
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(a), "m"(*(const int32_t *)(const void *)(p32)))
#endif
/* Software prefetch, into L2, the same place in the block the item reads
 * some steps later (dist = t->pf_k or t->pf_v, set per step by
 * lib/cpu/attn.c to a fixed lead in bytes; 0 at the item's end). Spread
 * through the stream this way, prefetches interleave with the arithmetic;
 * whole-block bursts measured slower. Earlier measurements (2 threads, 32k
 * tokens, shared machine): no prefetch vs 2 KiB ahead: fp16 13.1 -> 16.0
 * GB/s, int8 10.0 -> 11.8, int4 6.4 -> 9.2. */
#define PF_AHEAD_BY(p, dist, lines)                                                                \
    do {                                                                                           \
        for (int pf_ = 0; pf_ < (lines); pf_++)                                                    \
            _mm_prefetch((const char *)(p) + (dist) + 64 * pf_, _MM_HINT_T2);                      \
    } while (0)
/* 16 int32 lanes to 16 bytes, kept in a register: PACK_S8 truncating,
 * PACK_U8S with unsigned saturation (0..255). Compilers fuse the intrinsic
 * with a following store into vpmovdb-to-memory, which is microcoded and
 * slow on AMD Zen 4 (it dominated the query preparation). */
#if defined(__clang__)
#define PACK_S8(x) _mm512_cvtepi32_epi8(x)
#define PACK_U8S(x) _mm512_cvtusepi32_epi8(x)
#else
#define PACK_REG(name, insn)                                                                       \
    TGT_INLINE static __m128i name(__m512i x) {                                                    \
        __m128i r;                                                                                 \
        __asm__(insn " %1, %0" : "=v"(r) : "v"(x));                                                \
        return r;                                                                                  \
    }
PACK_REG(pack_s8_reg, "vpmovdb")
PACK_REG(pack_u8s_reg, "vpmovusdb")
#define PACK_S8(x) pack_s8_reg(x)
#define PACK_U8S(x) pack_u8s_reg(x)
#endif
static inline int32_t load32(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* ---- small helpers -------------------------------------------------------------------- */

TGT_INLINE static __mmask16 mask16(int n) {
    return n >= 16 ? (__mmask16)0xFFFF : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1u);
}

/* Sums (or maxima) of 4 vectors at once: lane 4*i of the result holds
 * vector i's, 13 instructions where 4 separate reductions take about 30. */
#define REDUCE4(OP, a0, a1, a2, a3, out)                                                           \
    do {                                                                                           \
        __m512 x01_ = OP(_mm512_shuffle_f32x4(a0, a1, 0x44), _mm512_shuffle_f32x4(a0, a1, 0xEE)); \
        __m512 x23_ = OP(_mm512_shuffle_f32x4(a2, a3, 0x44), _mm512_shuffle_f32x4(a2, a3, 0xEE)); \
        __m512 y_ = OP(_mm512_shuffle_f32x4(x01_, x23_, 0x88), _mm512_shuffle_f32x4(x01_, x23_, 0xDD)); \
        y_ = OP(y_, _mm512_permute_ps(y_, 0x4E));                                                  \
        (out) = OP(y_, _mm512_permute_ps(y_, 0xB1));                                               \
    } while (0)

/* exp(x) for x <= 0 (and -inf -> 0): 2^n * poly(r), r in [-ln2/2, ln2/2],
 * poly a degree-5 fit of e^r for relative error (max 1e-7 in exact
 * arithmetic; one FMA less than the degree-6 Taylor series it replaced). */
TGT static inline __m512 exp512(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
    __m512 p = _mm512_set1_ps(0.0082903f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.04189791f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.16667636f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.4999915f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.99999971f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* 16 plain elements (fp32/fp16/bf16/fp8 bits) at p, first n valid, as fp32.
 * fp8 comes out as value / (256 * scale): the caller folds 256*scale into q. */
TGT_INLINE static __m512 load_plain(int32_t fmt, const uint8_t *p, int n) {
    __mmask16 m = mask16(n);
    switch (fmt) {
    case KVP_FORMAT_FP32: return _mm512_maskz_loadu_ps(m, p);
    case KVP_FORMAT_FP16: return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
    case KVP_FORMAT_BF16:
        return _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
    default: { /* e4m3 -> fp16 bits: sign to bit 15, exponent+mantissa to bits 7..13 */
        __m256i b = _mm256_cvtepu8_epi16(_mm_maskz_loadu_epi8(m, p));
        __m256i h = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0x7F)), 7),
                                    _mm256_slli_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0x80)), 8));
        return _mm512_cvtph_ps(h);
    }
    }
}

/* Multiplier that turns load_plain()'s value into the stored value. */
static inline float plain_unit(int32_t fmt, float fp8_scale) {
    return fmt == KVP_FORMAT_FP8_E4M3 ? 256.0f * fp8_scale : 1.0f;
}

/* ---- K: plain formats, dim-major ([D][P]) ----------------------------------------------------- */

TGT static void kprep_plain(kvp__tile *t, const uint8_t *kb, const kvp__blockfmt *f) {
    (void)kb;
    float u = plain_unit(f->format, t->fp8_k);
    for (int r = 0; r < R; r++)
        for (int d = 0; d < t->D; d += 16)
            _mm512_store_ps(&t->qf[r][d], _mm512_mul_ps(_mm512_load_ps(&t->q[r][d]), _mm512_set1_ps(u)));
}

TGT_INLINE static void klogits_dm(int fmt, kvp__tile *t, const uint8_t *kb,
                                  const kvp__blockfmt *f, int t0, int n) {
    const int es = kvp__plain_size(fmt), P = f->page_size, D = t->D;
    const uint8_t *base = kb + (size_t)t0 * (size_t)es;
    const size_t row = (size_t)P * (size_t)es;
    __m512 a0[R], a1[R]; /* n > 16: tokens 0-15 / 16-31; else even / odd channels */
    UNROLL for (int r = 0; r < R; r++) a0[r] = a1[r] = _mm512_setzero_ps();
    if (n > 16) {
        for (int d = 0; d < D; d++) {
            const uint8_t *p = base + (size_t)d * row;
            PF_AHEAD_BY(p, t->pf_k, row >= 128 ? (int)(row / 64) : 1);
            __m512 k0 = load_plain(fmt, p, 16), k1 = load_plain(fmt, p + 16 * es, n - 16);
            UNROLL for (int r = 0; r < R; r++) {
                __m512 q = _mm512_set1_ps(t->qf[r][d]);
                a0[r] = _mm512_fmadd_ps(q, k0, a0[r]);
                a1[r] = _mm512_fmadd_ps(q, k1, a1[r]);
            }
        }
        UNROLL for (int r = 0; r < R; r++) {
            _mm512_store_ps(&t->logits[r][0], a0[r]);
            _mm512_store_ps(&t->logits[r][16], a1[r]);
        }
    } else {
        for (int d = 0; d < D; d += 2) {
            const uint8_t *p = base + (size_t)d * row;
            PF_AHEAD_BY(p, t->pf_k, row >= 128 ? (int)(row / 64) : 1);
            __m512 k0 = load_plain(fmt, p, n), k1 = load_plain(fmt, p + row, n);
            UNROLL for (int r = 0; r < R; r++) {
                a0[r] = _mm512_fmadd_ps(_mm512_set1_ps(t->qf[r][d]), k0, a0[r]);
                a1[r] = _mm512_fmadd_ps(_mm512_set1_ps(t->qf[r][d + 1]), k1, a1[r]);
            }
        }
        UNROLL for (int r = 0; r < R; r++) _mm512_store_ps(&t->logits[r][0], _mm512_add_ps(a0[r], a1[r]));
    }
}

/* ---- K: plain formats, token-major ([P][D], FlashInfer HND) ------------------------------------- */

TGT_INLINE static void klogits_tm(int fmt, kvp__tile *t, const uint8_t *kb,
                                  const kvp__blockfmt *f, int t0, int n) {
    (void)f;
    const int es = kvp__plain_size(fmt), D = t->D;
    for (int i = 0; i < n; i++) {
        const uint8_t *p = kb + (size_t)(t0 + i) * (size_t)D * (size_t)es;
        __m512 acc[R];
        UNROLL for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
        for (int d = 0; d < D; d += 16) {
            __m512 k = load_plain(fmt, p + (size_t)d * (size_t)es, 16);
            UNROLL for (int r = 0; r < R; r++)
                acc[r] = _mm512_fmadd_ps(_mm512_load_ps(&t->qf[r][d]), k, acc[r]);
        }
        UNROLL for (int r = 0; r < R; r++) t->logits[r][i] = _mm512_reduce_add_ps(acc[r]);
    }
}

/* ---- K: int8 / int4, integer dot products ----------------------------------------------------------- */

/* Lanes 0, 4, 8, 12 (REDUCE4's results) as 4 floats: one permute, where
 * storing the vector and reading scalars back stalls store forwarding. */
TGT_INLINE static __m128 lanes_to_rows(__m512 v) {
    return _mm512_castps512_ps128(_mm512_permutexvar_ps(_mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 12, 8, 4, 0), v));
}

/* Row values v[0..3] to lanes 4r (the layout of REDUCE4 results). */
TGT_INLINE static __m512 rows_to_lanes(const float *v) {
    return _mm512_permutexvar_ps(_mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0),
                                 _mm512_castps128_ps512(_mm_loadu_ps(v)));
}

/* num / x in the lanes where x > 0 and the quotient is finite, else 0
 * (kvp__inv_or_zero: x may be denormal). */
TGT_INLINE static __m512 div_or_zero(float num, __m512 x) {
    __mmask16 nz = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_GT_OQ);
    __m512 q = _mm512_maskz_div_ps(nz, _mm512_set1_ps(num), x);
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(q, _mm512_set1_ps(3.4028234e38f), _CMP_LE_OQ), q);
}

/* The integer-key preps quantize q' = q * scale per page and row against
 * the bound max|q| * max(scale) rather than max|q'|: x = rne(qn * scale /
 * max(scale)) with qn = q * target / max|q| formed once per tile (t->qn,
 * t->qamax; t->qnvalid holds the target it was formed for), so a page
 * costs one pass over its scales and one multiply per element, with no q'
 * to store, reload and reduce. Measured (int4): error 9.77e-2 -> 9.78e-2,
 * in place 1 - 2.4% faster (2 threads, batch 1 at 8k and 32k, batch 16 at
 * 8k; in-process A/B). */
TGT_INLINE static void qn_prepare(kvp__tile *t, int32_t target) {
    if (t->qnvalid == target) return;
    const int D = t->D;
    __m512 am[R], a4;
    UNROLL for (int r = 0; r < R; r++) am[r] = _mm512_setzero_ps();
    for (int d = 0; d < D; d += 16)
        UNROLL for (int r = 0; r < R; r++) am[r] = _mm512_range_ps(am[r], _mm512_load_ps(&t->q[r][d]), 0x0B);
    REDUCE4(_mm512_max_ps, am[0], am[1], am[2], am[3], a4);
    float inv[16] KVP__ALIGN64;
    _mm512_store_ps(inv, div_or_zero((float)target, a4));
    _mm_storeu_ps(t->qamax, lanes_to_rows(a4));
    for (int r = 0; r < R; r++) {
        __m512 vi = _mm512_set1_ps(inv[4 * r]);
        for (int d = 0; d < D; d += 16) _mm512_store_ps(&t->qn[r][d], _mm512_mul_ps(_mm512_load_ps(&t->q[r][d]), vi));
    }
    t->qnvalid = target;
}

/* Pass 1 of a page: returns max(scale) and, in lane 4r of *cst4, row r's
 * Σ q·(min + mid·scale) (mid: the code the query's rounding error is
 * charged at). */
TGT_INLINE static float scale_pass(const kvp__tile *t, const uint8_t *kb, const kvp__blockfmt *f, float mid,
                                   __m512 *cst4) {
    const int D = t->D;
    const uint8_t *sc = kb + kvp__block_data_bytes(f), *mn = sc + 2 * (size_t)D;
    __m512 mx = _mm512_setzero_ps(), cst[R];
    UNROLL for (int r = 0; r < R; r++) cst[r] = _mm512_setzero_ps();
    for (int d = 0; d < D; d += 16) {
        __m512 s = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(sc + 2 * d)));
        __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(mn + 2 * d)));
        if (mid != 0.0f) m = _mm512_fmadd_ps(s, _mm512_set1_ps(mid), m);
        mx = _mm512_max_ps(mx, s); /* scales are >= 0 */
        UNROLL for (int r = 0; r < R; r++) cst[r] = _mm512_fmadd_ps(_mm512_load_ps(&t->q[r][d]), m, cst[r]);
    }
    REDUCE4(_mm512_add_ps, cst[0], cst[1], cst[2], cst[3], *cst4);
    return _mm512_reduce_max_ps(mx);
}

/* scale / max(scale) for channels d .. d+15 of the page's scales. */
TGT_INLINE static __m512 scale_norm(const uint8_t *kb, const kvp__blockfmt *f, int d, __m512 sinv) {
    const uint8_t *sc = kb + kvp__block_data_bytes(f);
    return _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(sc + 2 * d))), sinv);
}

/* The rows' steps qamax * unit in lanes 4r (REDUCE4's layout). */
TGT_INLINE static __m512 rows_step4(const kvp__tile *t, float unit) {
    return _mm512_mul_ps(rows_to_lanes(t->qamax), _mm512_set1_ps(unit));
}

/* Where the two parts of channels d..d+3 (d % 4 == 0) sit in t->qhl[r]:
 * each 32 channels take 64 bytes as vpackssdw/vpacksswb leave them, 128-bit
 * lane k holding qh of channels 4k.., qh of 16+4k.., ql of 4k.., ql of
 * 16+4k.. (4 bytes each); ql is 8 bytes after its qh. */
static inline int qhl_at(int d) {
    int g = (d & 31) >> 2;
    return (d & ~31) * 2 + (g & 3) * 16 + (g >> 2) * 4;
}

/* Vector version of kvp__qprep_int (int8 keys): fold the page's channel
 * scales into q and quantize it to 15 bits as two s8 parts, x = 128*qh +
 * ql with qh = x >> 7 in -127..127 and ql = x & 127, against the bound
 * max|q|·max(scale) (qn_prepare). 32 channels at a time are packed to
 * words and then bytes in-lane (qhl_at: where they land). */
TGT static void kprep_int8(kvp__tile *t, const uint8_t *kb, const kvp__blockfmt *f) {
    const int D = t->D;
    qn_prepare(t, 16256);
    __m512 cst4;
    const float smax = scale_pass(t, kb, f, 0.0f, &cst4);
    const __m512 sinv = _mm512_set1_ps(kvp__inv_or_zero(1.0f, smax));
    const __m512i m127 = _mm512_set1_epi16(127);
    for (int d = 0; d < D; d += 32) {
        const __m512 sn0 = scale_norm(kb, f, d, sinv), sn1 = d + 16 < D ? scale_norm(kb, f, d + 16, sinv) : sn0;
        UNROLL for (int r = 0; r < R; r++) {
            /* x = rne(qn·scale/smax) in -16256..16256 (MXCSR: nearest-even) */
            __m512i x0 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_load_ps(&t->qn[r][d]), sn0));
            __m512i x1 = d + 16 < D ? _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_load_ps(&t->qn[r][d + 16]), sn1))
                                    : x0;
            __m512i w = _mm512_packs_epi32(x0, x1);
            __m512i b = _mm512_packs_epi16(_mm512_srai_epi16(w, 7), _mm512_and_si512(w, m127));
            _mm512_store_si512((void *)&t->qhl[r][2 * d], b);
        }
    }
    _mm_storeu_ps(t->qstep, lanes_to_rows(rows_step4(t, smax * (1.0f / 16256.0f))));
    _mm_storeu_ps(t->qconst, lanes_to_rows(cst4)); /* 15 bits: the residual is fp32 noise */
}


/* The int4 keys' outlier channels (docs/formats.md): Σ_j q[r][idx_j]·omin_j
 * returned in lane 4r, and q[r][idx_j]·oscale_j as t->k4a (int4_v1, as
 * kvp__k4_outlier_prep) or as t->k4hl / k4step (int4). The q values at the
 * outlier channels are kept with the channel list (k4q, k4idx) and
 * gathered again only when the list differs: int4_v1's 4 channels (head_dim
 * 128) rarely change from page to page, int4's 16 mostly do, so the gather
 * is vgatherdps, 16 channels a row at a time; the rest goes 16 channels a
 * vector. */
TGT_INLINE static __m512 k4_outlier_fold(kvp__tile *t, const uint8_t *kb, const kvp__blockfmt *f) {
    kvp__k4_outl o = kvp__k4_outliers_of(kb, f);
    const int C = o.count; /* at most KVP__ATTN_MAX_D / 8 = 32 */
    if (C <= 0) return _mm512_setzero_ps();
    const __mmask32 m32 = C >= 32 ? 0xFFFFFFFFu : (__mmask32)((1u << C) - 1u);
    __m512i idx = _mm512_maskz_loadu_epi16(m32, o.table);
    /* int4 (channel quads) gathers qn (q·127/max|q|, kprep_int4 formed it),
     * int4_v1 q: k4valid says which (1: q, 2: qn) */
    const int32_t want = o.quads ? 2 : 1;
    if (t->k4valid != want || _mm512_cmpneq_epi16_mask(idx, _mm512_loadu_si512((const void *)t->k4idx)) != 0) {
        /* 16 channels a gather (as fast as vpermt2ps over each 32
         * channels of q, measured); an index past head_dim reads nothing
         * and gives 0 (kvp__k4_outlier_q), as do the lanes past the count */
        _mm512_storeu_si512((void *)t->k4idx, idx);
        for (int h = 0; 16 * h < C; h++) {
            __m512i ix = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)(t->k4idx + 16 * h)));
            __mmask16 ok = mask16(C - 16 * h) & _mm512_cmplt_epu32_mask(ix, _mm512_set1_epi32(t->D));
            UNROLL for (int r = 0; r < R; r++)
                _mm512_store_ps(&t->k4q[r][16 * h], _mm512_mask_i32gather_ps(_mm512_setzero_ps(), ok, ix,
                                                                              o.quads ? &t->qn[r][0] : &t->q[r][0], 4));
        }
        t->k4valid = want;
    }
    /* 16 channels a vector: the constant sum q * omin, and k4a = q * oscale
     * (int4_v1), or for int4's channel quads q * oscale in 15 bits against
     * the bound max|q|·max(oscale), split as x = 128·hi + lo (hi = x >> 7,
     * lo = x & 127), for k4_outliers_int */
    const int H = (C + 15) / 16; /* 1 or 2 */
    __m512 sc[2], mn[2];
    for (int h = 0; h < H; h++) {
        const __mmask16 m = mask16(C - 16 * h);
        sc[h] = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, o.table + 2 * (size_t)C + 32 * (size_t)h));
        mn[h] = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, o.table + 4 * (size_t)C + 32 * (size_t)h));
    }
    __m512 c[R];
    UNROLL for (int r = 0; r < R; r++) c[r] = _mm512_setzero_ps();
    if (o.quads) {
        /* k4q is qn = q·127/max|q|: x = rne(qn·oscale·128/max(oscale)) */
        const float omax = _mm512_reduce_max_ps(H > 1 ? _mm512_max_ps(sc[0], sc[1]) : sc[0]); /* >= 0 */
        const __m512 oinv = _mm512_set1_ps(kvp__inv_or_zero(128.0f, omax));
        const __m512i m127 = _mm512_set1_epi32(127);
        __m512 sn[2];
        for (int h = 0; h < H; h++) sn[h] = _mm512_mul_ps(sc[h], oinv);
        UNROLL for (int r = 0; r < R; r++) {
            for (int h = 0; h < H; h++) {
                __m512 q = _mm512_load_ps(&t->k4q[r][16 * h]);
                __m512i x = _mm512_cvtps_epi32(_mm512_mul_ps(q, sn[h]));
                _mm_store_si128((__m128i *)(void *)&t->k4hl[r][0][16 * h], PACK_S8(_mm512_srai_epi32(x, 7)));
                _mm_store_si128((__m128i *)(void *)&t->k4hl[r][1][16 * h], PACK_S8(_mm512_and_si512(x, m127)));
                c[r] = _mm512_fmadd_ps(q, mn[h], c[r]);
            }
            t->k4step[r] = t->qamax[r] * omax * (1.0f / 16256.0f);
        }
    } else {
        for (int h = 0; h < H; h++)
            UNROLL for (int r = 0; r < R; r++) {
                __m512 q = _mm512_load_ps(&t->k4q[r][16 * h]);
                _mm512_store_ps(&t->k4a[r][16 * h], _mm512_mul_ps(q, sc[h]));
                c[r] = _mm512_fmadd_ps(q, mn[h], c[r]);
            }
    }
    float lanes[16] KVP__ALIGN64 = {0};
    UNROLL for (int r = 0; r < R; r++) /* int4: back from qn's unit */
        lanes[4 * r] = _mm512_reduce_add_ps(c[r]) * (o.quads ? t->qamax[r] * (1.0f / 127.0f) : 1.0f);
    return _mm512_load_ps(lanes);
}

/* Where vpackssdw + vpacksswb (or their unsigned forms) leave 4 vectors'
 * dwords (128-bit lane k of the result holds lane k of vector 0, 1, 2, 3):
 * this permutation puts vector 0's 16 bytes first, then vector 1's, ... */
#define PACK4_ORDER _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0)

/* int4 keys: q' = q * scale quantized to 8 bits per row against the bound
 * max|q|·max(scale) (qn_prepare): one vpdpbusd per quad and row, half the
 * two-part 15-bit form. 8 bits suffice against 4-bit codes once the
 * outlier channels do not set the step, and they do not: those are the int8
 * outlier table's (their int4 scales are 0, so q' is 0 there). 64 channels
 * at a time are packed with vpackssdw/vpacksswb and one permute
 * (PACK4_ORDER) instead of four truncating packs, and Σx is one vpdpbusd
 * against ones per 64: 0.9 - 1.9% faster in place.
 *
 * The rounding error times the middle code (7.5) goes to the constant:
 * 7.5·Σ (q' - step*x), with Σ q'·7.5 inside the min term's dot product
 * (q·(min + 7.5·scale)) and Σ x summed as x is formed. */
TGT static void kprep_int4(kvp__tile *t, const uint8_t *kb, const kvp__blockfmt *f) {
    const int D = t->D;
    qn_prepare(t, 127);
    __m512 cst4;
    const float smax = scale_pass(t, kb, f, 7.5f, &cst4);
    const __m512 sinv = _mm512_set1_ps(kvp__inv_or_zero(1.0f, smax));
    /* x = rne(qn · scale/smax) in -127..127 (MXCSR: nearest-even) */
    __m512i xs[R];
    UNROLL for (int r = 0; r < R; r++) xs[r] = _mm512_setzero_si512();
    int d0 = 0;
    for (; d0 + 64 <= D; d0 += 64) {
        __m512 sn[4];
        UNROLL for (int k = 0; k < 4; k++) sn[k] = scale_norm(kb, f, d0 + 16 * k, sinv);
        UNROLL for (int r = 0; r < R; r++) {
            __m512i x[4];
            UNROLL for (int k = 0; k < 4; k++)
                x[k] = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_load_ps(&t->qn[r][d0 + 16 * k]), sn[k]));
            __m512i b = _mm512_permutexvar_epi32(PACK4_ORDER, _mm512_packs_epi16(_mm512_packs_epi32(x[0], x[1]),
                                                                                 _mm512_packs_epi32(x[2], x[3])));
            _mm512_store_si512((void *)&t->qh[r][d0], b);
            DPBUSD(xs[r], _mm512_set1_epi8(1), b);
        }
    }
    for (int d = d0; d < D; d += 16) { /* head_dim 80, 96: the last 16 or 32 channels */
        __m512 sn = scale_norm(kb, f, d, sinv);
        UNROLL for (int r = 0; r < R; r++) {
            __m512i x = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_load_ps(&t->qn[r][d]), sn));
            _mm_store_si128((__m128i *)(void *)&t->qh[r][d], PACK_S8(x));
            xs[r] = _mm512_add_epi32(xs[r], x);
        }
    }
    __m512 x4;
    REDUCE4(_mm512_add_ps, _mm512_cvtepi32_ps(xs[0]), _mm512_cvtepi32_ps(xs[1]),
            _mm512_cvtepi32_ps(xs[2]), _mm512_cvtepi32_ps(xs[3]), x4);
    const __m512 step4 = rows_step4(t, smax * (1.0f / 127.0f));
    __m512 c4 = _mm512_fnmadd_ps(_mm512_mul_ps(step4, _mm512_set1_ps(7.5f)), x4, cst4);
    c4 = _mm512_add_ps(c4, k4_outlier_fold(t, kb, f));
    _mm_storeu_ps(t->qstep, lanes_to_rows(step4));
    _mm_storeu_ps(t->qconst, lanes_to_rows(c4));
}

/* logits = qconst + qstep * (128*hi + lo), hi/lo int32 dot products. */
TGT static inline __m512 int_logits(const kvp__tile *t, int r, __m512i hi, __m512i lo) {
    __m512 x = _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_slli_epi32(hi, 7), lo));
    return _mm512_fmadd_ps(x, _mm512_set1_ps(t->qstep[r]), _mm512_set1_ps(t->qconst[r]));
}

/* int8 keys: [D/4][P][4] u8 codes; 16 tokens x 4 channels per 64 bytes. */
TGT static void klogits_int8(kvp__tile *t, const uint8_t *kb, const kvp__blockfmt *f, int t0, int n) {
    const int P = f->page_size, D = t->D;
    const __mmask64 m0 = n >= 16 ? ~(__mmask64)0 : (((__mmask64)1 << (4 * n)) - 1);
    const __mmask64 m1 = n >= 32 ? ~(__mmask64)0 : n <= 16 ? 0 : (((__mmask64)1 << (4 * (n - 16))) - 1);
#define K8_DECL(r) __m512i h0_##r = _mm512_setzero_si512(), h1_##r = h0_##r, l0_##r = h0_##r, l1_##r = h0_##r;
    R4(K8_DECL)
    const uint8_t *base = kb + (size_t)t0 * 4;
    if (n <= 16) { /* pages of 16 tokens or fewer: one 16-token slab */
        for (int d = 0; d < D; d += 4) {
            PF_AHEAD_BY(base + (size_t)(d / 4) * (size_t)P * 4, t->pf_k, 1);
            __m512i k0 = _mm512_maskz_loadu_epi8(m0, base + (size_t)(d / 4) * (size_t)P * 4);
            const int at = qhl_at(d);
#define K8_STEP1(r)                                                                                \
    DPBUSD_B(h0_##r, k0, &t->qhl[r][at]);                                                          \
    DPBUSD_B(l0_##r, k0, &t->qhl[r][at + 8]);
            R4(K8_STEP1)
        }
#define K8_OUT1(r) _mm512_store_ps(&t->logits[r][0], int_logits(t, r, h0_##r, l0_##r));
        R4(K8_OUT1)
        return;
    }
    for (int d = 0; d < D; d += 4) {
        const uint8_t *p = base + (size_t)(d / 4) * (size_t)P * 4;
        PF_AHEAD_BY(p, t->pf_k, 2);
        __m512i k0 = _mm512_maskz_loadu_epi8(m0, p), k1 = _mm512_maskz_loadu_epi8(m1, p + 64);
        const int at = qhl_at(d);
#define K8_STEP(r)                                                                                 \
    DPBUSD_B(h0_##r, k0, &t->qhl[r][at]);                                                          \
    DPBUSD_B(l0_##r, k0, &t->qhl[r][at + 8]);                                                      \
    DPBUSD_B(h1_##r, k1, &t->qhl[r][at]);                                                          \
    DPBUSD_B(l1_##r, k1, &t->qhl[r][at + 8]);
        R4(K8_STEP)
    }
#define K8_OUT(r)                                                                                  \
    _mm512_store_ps(&t->logits[r][0], int_logits(t, r, h0_##r, l0_##r));                          \
    _mm512_store_ps(&t->logits[r][16], int_logits(t, r, h1_##r, l1_##r));
    R4(K8_OUT)
}

/* int4's outlier channels, codes in channel quads [R/4][P][4] (u8):
 * logits += k4step·(128·Σ hi·c + Σ lo·c), two vpdpbusd per quad, row and
 * 16 tokens, exact int32 sums (hi and lo from k4_outlier_fold; the
 * constant is in qconst). */
TGT static void k4_outliers_int(kvp__tile *t, const kvp__k4_outl *o, int P, int t0, int n) {
    for (int i0 = 0; i0 < n; i0 += 16) {
        const __mmask64 m = n - i0 >= 16 ? ~(__mmask64)0 : (((__mmask64)1 << (4 * (n - i0))) - 1);
        __m512i h[R], l[R];
        UNROLL for (int r = 0; r < R; r++) h[r] = l[r] = _mm512_setzero_si512();
        for (int g = 0; 4 * g < o->count; g++) {
            __m512i k = _mm512_maskz_loadu_epi8(m, o->codes + ((size_t)g * (size_t)P + (size_t)(t0 + i0)) * 4);
            UNROLL for (int r = 0; r < R; r++) {
                DPBUSD_B(h[r], k, &t->k4hl[r][0][4 * g]);
                DPBUSD_B(l[r], k, &t->k4hl[r][1][4 * g]);
            }
        }
        const __mmask16 mt = mask16(n - i0);
        UNROLL for (int r = 0; r < R; r++) {
            __m512 x = _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_slli_epi32(h[r], 7), l[r]));
            _mm512_mask_storeu_ps(&t->logits[r][i0], mt,
                                  _mm512_fmadd_ps(x, _mm512_set1_ps(t->k4step[r]),
                                                  _mm512_maskz_loadu_ps(mt, &t->logits[r][i0])));
        }
    }
}

/* int4 keys' outlier channels: int4's by k4_outliers_int, int4_v1's (int8
 * codes, [R][P]) as logits += a . code, 16 tokens per vector (a and the
 * constant from k4_outlier_prep). */
TGT static void k4_outliers(kvp__tile *t, const uint8_t *kb, const kvp__blockfmt *f, int t0, int n) {
    kvp__k4_outl o = kvp__k4_outliers_of(kb, f);
    if (o.quads) {
        k4_outliers_int(t, &o, f->page_size, t0, n);
        return;
    }
    for (int i0 = 0; i0 < n; i0 += 16) {
        __mmask16 m = mask16(n - i0);
        __m512 acc[R];
        UNROLL for (int r = 0; r < R; r++) acc[r] = _mm512_maskz_loadu_ps(m, &t->logits[r][i0]);
        for (int j = 0; j < o.count; j++) {
            const uint8_t *p = o.codes + (size_t)j * (size_t)f->page_size + (size_t)(t0 + i0);
            __m512 c = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(m, p)));
            UNROLL for (int r = 0; r < R; r++) acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(t->k4a[r][j]), c, acc[r]);
        }
        UNROLL for (int r = 0; r < R; r++) _mm512_mask_storeu_ps(&t->logits[r][i0], m, acc[r]);
    }
}

/* int4 keys: [D/4][P/2][4] bytes, token 2i in the low nibble and 2i+1 in
 * the high nibble: one 64-byte load holds 32 tokens x 4 channels. */
/* int4 keys at page 16: a block row (8 token pairs x 4 channels) is 32
 * bytes, so one vector holds two channel quads, the query's two quads
 * broadcast to its two halves; half the vpdpbusd of the 32-token loop. */
TGT static void klogits_int4_p16(kvp__tile *t, const uint8_t *kb, const kvp__blockfmt *f, int n) {
    const int D = t->D, pairs = (n + 1) / 2;
    const uint64_t half = pairs >= 8 ? 0xFFFFFFFFu : (((uint64_t)1 << (4 * pairs)) - 1);
    const __mmask64 m = (__mmask64)(half | (half << 32));
    const __m512i low = _mm512_set1_epi8(0x0F), top = _mm512_set1_epi8((char)0xF0);
#define K4P_DECL(r) __m512i e_##r = _mm512_setzero_si512(), o_##r = e_##r;
    R4(K4P_DECL)
    for (int d = 0; d < D; d += 8) { /* D is a multiple of 8 */
        const uint8_t *p = kb + (size_t)(d / 4) * 32;
        PF_AHEAD_BY(p, t->pf_k, 1);
        __m512i b = _mm512_maskz_loadu_epi8(m, p);
        __m512i ke = _mm512_and_si512(b, low), ko = _mm512_and_si512(b, top); /* odd: 16c */
#define K4P_STEP(r)                                                                                \
    {                                                                                              \
        __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi32(load32(&t->qh[r][d]))), \
                                       _mm256_set1_epi32(load32(&t->qh[r][d + 4])), 1);           \
        DPBUSD(e_##r, ke, q);                                                                      \
        DPBUSD(o_##r, ko, q);                                                                      \
    }
        R4(K4P_STEP)
    }
    /* halves: the two quads' partial sums; then even/odd tokens interleaved */
    const __m512i order = _mm512_set_epi32(15, 7, 14, 6, 13, 5, 12, 4, 11, 3, 10, 2, 9, 1, 8, 0);
    const __mmask16 mn = mask16(n);
#define K4P_OUT(r)                                                                                 \
    {                                                                                              \
        __m256i es = _mm256_add_epi32(_mm512_castsi512_si256(e_##r), _mm512_extracti64x4_epi64(e_##r, 1)); \
        __m256i os = _mm256_srai_epi32(_mm256_add_epi32(_mm512_castsi512_si256(o_##r), _mm512_extracti64x4_epi64(o_##r, 1)), 4); \
        __m512i x = _mm512_permutexvar_epi32(order, _mm512_inserti64x4(_mm512_castsi256_si512(es), os, 1)); \
        _mm512_mask_storeu_ps(&t->logits[r][0], mn,                                                \
                              _mm512_fmadd_ps(_mm512_cvtepi32_ps(x), _mm512_set1_ps(t->qstep[r]),   \
                                              _mm512_set1_ps(t->qconst[r])));                      \
    }
    R4(K4P_OUT)
    k4_outliers(t, kb, f, 0, n);
}

TGT static void klogits_int4(kvp__tile *t, const uint8_t *kb, const kvp__blockfmt *f, int t0, int n) {
    const int P = f->page_size, D = t->D, pairs = (n + 1) / 2;
    if (P == 16) {
        klogits_int4_p16(t, kb, f, n); /* t0 is 0: a chunk holds the whole page */
        return;
    }
    const __mmask64 m = pairs >= 16 ? ~(__mmask64)0 : (((__mmask64)1 << (4 * pairs)) - 1);
    const __m512i low = _mm512_set1_epi8(0x0F), top = _mm512_set1_epi8((char)0xF0);
    const uint8_t *base = kb + (size_t)(t0 / 2) * 4;
    const size_t row = (size_t)(P / 2) * 4;
#define K4_DECL(r) __m512i e_##r = _mm512_setzero_si512(), o_##r = e_##r;
    R4(K4_DECL)
    for (int d = 0; d < D; d += 4) {
        const uint8_t *p = base + (size_t)(d / 4) * row;
        PF_AHEAD_BY(p, t->pf_k, 1);
        __m512i b = _mm512_maskz_loadu_epi8(m, p);
        /* odd tokens as 16c (b & 0xF0): one and instead of a shift and an
         * and; their sums are 16x, exactly, and shifted back below */
        __m512i ke = _mm512_and_si512(b, low), ko = _mm512_and_si512(b, top);
#define K4_STEP(r)                                                                                 \
    DPBUSD_B(e_##r, ke, &t->qh[r][d]);                                                             \
    DPBUSD_B(o_##r, ko, &t->qh[r][d]);
        R4(K4_STEP)
    }
    /* lanes are tokens 0,2,..,30 and 1,3,..,31: interleave into token order */
    const __m512i lo_idx = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const __m512i hi_idx = _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
#define K4_LOGITS(r, X)                                                                            \
    _mm512_fmadd_ps(_mm512_cvtepi32_ps(X), _mm512_set1_ps(t->qstep[r]), _mm512_set1_ps(t->qconst[r]))
    /* the outlier channels' terms (k4_outliers' arithmetic, in the same
     * order) added before the logits are stored, not in a second pass over
     * them: their codes as fp32, tokens 0-15 and 16-31 */
    const kvp__k4_outl ol = kvp__k4_outliers_of(kb, f);
    const int fc = ol.quads ? 0 : ol.count; /* int4_v1's, in fp32 here; int4's below */
    __m512 oc[KVP__ATTN_MAX_D / 32][2];
    for (int jo = 0; jo < fc; jo++)
        UNROLL for (int hh = 0; hh < 2; hh++)
            oc[jo][hh] = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(
                _mm_maskz_loadu_epi8(mask16(n - 16 * hh), ol.codes + (size_t)jo * (size_t)P + (size_t)(t0 + 16 * hh))));
#define K4_OUT(r)                                                                                  \
    {                                                                                              \
        __m512 e = K4_LOGITS(r, e_##r), o = K4_LOGITS(r, _mm512_srai_epi32(o_##r, 4));             \
        __m512 l0 = _mm512_permutex2var_ps(e, lo_idx, o), l1 = _mm512_permutex2var_ps(e, hi_idx, o); \
        for (int jo = 0; jo < fc; jo++) {                                                          \
            l0 = _mm512_fmadd_ps(_mm512_set1_ps(t->k4a[r][jo]), oc[jo][0], l0);                     \
            l1 = _mm512_fmadd_ps(_mm512_set1_ps(t->k4a[r][jo]), oc[jo][1], l1);                     \
        }                                                                                          \
        _mm512_store_ps(&t->logits[r][0], l0);                                                     \
        _mm512_store_ps(&t->logits[r][16], l1);                                                    \
    }
    R4(K4_OUT)
    if (ol.quads) k4_outliers_int(t, &ol, P, t0, n);
}

/* ---- softmax ---------------------------------------------------------------------------------------- */

/* Row r's logits j*16 .. j*16+15 of the chunk, -inf where not visible
 * (vis: the whole chunk is). */
TGT_INLINE static __m512 masked_logits(const kvp__tile *t, int r, int j, int n, int32_t pos0, bool vis) {
    if (vis) return _mm512_mask_load_ps(_mm512_set1_ps(-INFINITY), mask16(n - 16 * j), &t->logits[r][16 * j]);
    const __m512i iota = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    __m512i pos = _mm512_add_epi32(iota, _mm512_set1_epi32(pos0 + 16 * j));
    __mmask16 ok = mask16(n - 16 * j) & _mm512_cmpge_epi32_mask(pos, _mm512_set1_epi32(t->lo[r])) &
                   _mm512_cmple_epi32_mask(pos, _mm512_set1_epi32(t->hi[r]));
    return _mm512_mask_load_ps(_mm512_set1_ps(-INFINITY), ok, &t->logits[r][16 * j]);
}

/* NH: the chunk's 16-token halves (1: the second is neither loaded nor
 * exponentiated; its p are stored as 0). The logits are read twice, for
 * the maximum and for the exponentials, rather than held: 4 rows of up to
 * 8 vectors would take every register and spill. */
TGT_INLINE static void softmax_body(kvp__tile *t, int n, int32_t pos0, const int NH) {
    __m512 cm[R], cm4;
    bool vis[R];
    float cmax4[16] KVP__ALIGN64, cmax[R], m_new[R], e[16] KVP__ALIGN64;
    UNROLL for (int r = 0; r < R; r++) {
        if (t->soft_cap > 0.0f)
            for (int i = 0; i < n; i++) t->logits[r][i] = t->soft_cap * tanhf(t->logits[r][i] / t->soft_cap);
        vis[r] = t->lo[r] <= pos0 && t->hi[r] >= pos0 + n - 1;
        cm[r] = masked_logits(t, r, 0, n, pos0, vis[r]);
        UNROLL for (int j = 1; j < NH; j++) cm[r] = _mm512_max_ps(cm[r], masked_logits(t, r, j, n, pos0, vis[r]));
    }
    REDUCE4(_mm512_max_ps, cm[0], cm[1], cm[2], cm[3], cm4);
    _mm512_store_ps(cmax4, cm4);
    for (int r = 0; r < R; r++) {
        cmax[r] = cmax4[4 * r];
        m_new[r] = t->m[r] > cmax[r] ? t->m[r] : cmax[r];
        /* one vector exp for every row's rescale factor and chunk maximum */
        e[r] = m_new[r] == -INFINITY || t->m[r] == m_new[r] ? 0.0f : t->m[r] - m_new[r];
        e[R + r] = m_new[r] == -INFINITY || cmax[r] == m_new[r] ? 0.0f : cmax[r] - m_new[r];
    }
    for (int k = 2 * R; k < 16; k++) e[k] = 0.0f;
    _mm512_store_ps(e, exp512(_mm512_load_ps(e)));
    for (int r = 0; r < R; r++) {
        if (m_new[r] == -INFINITY) { /* nothing visible yet */
            memset(t->p[r], 0, sizeof t->p[r]);
            t->pmax[r] = 0.0f;
            continue;
        }
        float alpha = e[r];
        __m512 lv = _mm512_load_ps(t->lvec[r]);
        if (alpha != 1.0f) {
            __m512 a = _mm512_set1_ps(alpha);
            float *o = t->o + (size_t)r * (size_t)t->D;
            for (int d = 0; d < t->D; d += 16) _mm512_store_ps(o + d, _mm512_mul_ps(_mm512_load_ps(o + d), a));
            lv = _mm512_mul_ps(lv, a);
            t->l[r] *= alpha;
        }
        __m512 mv = _mm512_set1_ps(m_new[r]);
        UNROLL for (int j = 0; j < NH; j++) {
            __m512 pj = exp512(_mm512_sub_ps(masked_logits(t, r, j, n, pos0, vis[r]), mv));
            _mm512_store_ps(&t->p[r][16 * j], pj);
            lv = _mm512_add_ps(lv, pj);
        }
        if (NH == 1) _mm512_store_ps(&t->p[r][16], _mm512_setzero_ps());
        _mm512_store_ps(t->lvec[r], lv);
        t->pmax[r] = e[R + r];
        t->m[r] = m_new[r];
    }
}

TGT static void softmax_avx512(kvp__tile *t, int n, int32_t pos0) {
    if (n <= 16) softmax_body(t, n, pos0, 1);
    else if (n <= 32) softmax_body(t, n, pos0, 2);
    else if (n <= 64) softmax_body(t, n, pos0, 4); /* a pair of pages (vacc2) */
    else softmax_body(t, n, pos0, 8);              /* four pages of 32 (vacc4) */
}

/* ---- V: plain formats, token-major --------------------------------------------------------------------- */

/* o[:, d0 .. d0+16*NZ) += p . v for NZ full 16-channel vectors (NZ constant
 * after inlining: 4 rows x NZ accumulators stay in registers). */
TGT_INLINE static void vacc_pl_chunk(int fmt, int NZ, kvp__tile *t, const uint8_t *vb, int d0,
                                     int t0, int n, float u) {
    const int es = kvp__plain_size(fmt), D = t->D;
    __m512 acc[R][4];
    UNROLL for (int r = 0; r < R; r++) UNROLL for (int c = 0; c < NZ; c++) acc[r][c] = _mm512_setzero_ps();
    for (int i = 0; i < n; i++) {
        const uint8_t *p = vb + ((size_t)(t0 + i) * (size_t)D + (size_t)d0) * (size_t)es;
        PF_AHEAD_BY(p, t->pf_v, NZ * es / 4);
        __m512 v[4];
        UNROLL for (int c = 0; c < NZ; c++) v[c] = load_plain(fmt, p + (size_t)(16 * c * es), 16);
        UNROLL for (int r = 0; r < R; r++) {
            __m512 pr = _mm512_set1_ps(t->p[r][i]);
            UNROLL for (int c = 0; c < NZ; c++) acc[r][c] = _mm512_fmadd_ps(pr, v[c], acc[r][c]);
        }
    }
    UNROLL for (int r = 0; r < R; r++) {
        float *o = t->o + (size_t)r * (size_t)D + (size_t)d0;
        UNROLL for (int c = 0; c < NZ; c++)
            _mm512_store_ps(o + 16 * c, _mm512_fmadd_ps(acc[r][c], _mm512_set1_ps(u), _mm512_load_ps(o + 16 * c)));
    }
}

TGT_INLINE static void vacc_pl(int fmt, kvp__tile *t, const uint8_t *vb, const kvp__blockfmt *f,
                               int t0, int n) {
    (void)f;
    const int D = t->D;
    const float u = plain_unit(fmt, t->fp8_v);
    int d0 = 0;
    for (; d0 + 64 <= D; d0 += 64) vacc_pl_chunk(fmt, 4, t, vb, d0, t0, n, u);
    for (; d0 < D; d0 += 16) vacc_pl_chunk(fmt, 1, t, vb, d0, t0, n, u);
}

/* ---- V: int8 / int4, integer dot products ------------------------------------------------------------- */


typedef struct {
    uint32_t hi[R][2 * KVP__CHUNK / 4 + 4], lo[R][2 * KVP__CHUNK / 4 + 4];
    float step[R];
} probs16;

/* The token groups of a chunk: `groups` of base (block 0), then as many of
 * base1 (block 1 of a pair; NULL if none), with their prefetch distances. */
typedef struct {
    const uint8_t *base[2];
    ptrdiff_t pf[2];
    int groups;
} v8_blocks;

/* int8 values: o[:, d0 .. d0+32) (VNNI over token groups, 16-bit p). */
TGT static void vacc_i8_chunk2(kvp__tile *t, const v8_blocks *vbk, int d0, const probs16 *pq) {
    const int D = t->D, groups = vbk->groups, nb = vbk->base[1] != NULL ? 2 : 1;
#define V8_DECL(r) __m512i h0_##r = _mm512_setzero_si512(), h1_##r = h0_##r, l0_##r = h0_##r, l1_##r = h0_##r;
    R4(V8_DECL)
    for (int g = 0; g < nb * groups; g++) {
        const int bk = g >= groups;
        const uint8_t *p = vbk->base[bk] + (size_t)(g - bk * groups) * 4 * (size_t)D + (size_t)d0 * 4;
        PF_AHEAD_BY(p, vbk->pf[bk], 2);
        __m512i v0 = _mm512_loadu_si512((const void *)p), v1 = _mm512_loadu_si512((const void *)(p + 64));
#define V8_STEP(r)                                                                                 \
    {                                                                                              \
        __m512i ph = _mm512_set1_epi32((int)pq->hi[r][g]), pl = _mm512_set1_epi32((int)pq->lo[r][g]); \
        DPBUSD(h0_##r, ph, v0);                                                                    \
        DPBUSD(h1_##r, ph, v1);                                                                    \
        DPBUSD(l0_##r, pl, v0);                                                                    \
        DPBUSD(l1_##r, pl, v1);                                                                    \
    }
        R4(V8_STEP)
    }
#define V8_ONE(r, c, h, l)                                                                         \
    _mm512_store_ps(o + 16 * c,                                                                    \
                    _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_slli_epi32(h, 8), l)), \
                                    _mm512_set1_ps(pq->step[r]), _mm512_load_ps(o + 16 * c)));
#define V8_OUT(r)                                                                                  \
    {                                                                                              \
        float *o = t->o + (size_t)r * (size_t)D + (size_t)d0;                                      \
        V8_ONE(r, 0, h0_##r, l0_##r) V8_ONE(r, 1, h1_##r, l1_##r)                                  \
    }
    R4(V8_OUT)
}

/* int8 values: o[:, d0 .. d0+16). */
TGT static void vacc_i8_chunk1(kvp__tile *t, const v8_blocks *vbk, int d0, const probs16 *pq) {
    const int D = t->D, groups = vbk->groups, nb = vbk->base[1] != NULL ? 2 : 1;
#define V8S_DECL(r) __m512i h0_##r = _mm512_setzero_si512(), l0_##r = h0_##r;
    R4(V8S_DECL)
    for (int g = 0; g < nb * groups; g++) {
        const int bk = g >= groups;
        __m512i v0 = _mm512_loadu_si512(
            (const void *)(vbk->base[bk] + (size_t)(g - bk * groups) * 4 * (size_t)D + (size_t)d0 * 4));
#define V8S_STEP(r)                                                                                \
    DPBUSD(h0_##r, _mm512_set1_epi32((int)pq->hi[r][g]), v0);                                      \
    DPBUSD(l0_##r, _mm512_set1_epi32((int)pq->lo[r][g]), v0);
        R4(V8S_STEP)
    }
#define V8S_OUT(r)                                                                                 \
    {                                                                                              \
        float *o = t->o + (size_t)r * (size_t)D + (size_t)d0;                                      \
        V8_ONE(r, 0, h0_##r, l0_##r)                                                               \
    }
    R4(V8S_OUT)
}

/* int8 values: token groups [D][4] (s8), one fp16 scale per token. NB:
 * blocks (2: a pair of full pages, p[r][P*b + i] block b's token i, as
 * vacc_int4_body); NH: 16-token halves per block. */
TGT_INLINE static void vacc_int8_body(kvp__tile *t, const uint8_t *vb, const uint8_t *vb1, ptrdiff_t pf1,
                                      const kvp__blockfmt *f, int t0, int n, const int NB) {
    const int D = t->D, P = f->page_size, n4 = n / 4 * 4;
    const __mmask16 mk[2] = {mask16(n4), mask16(n4 - 16)};
    const uint8_t *const blk[2] = {vb, vb1};
    __m512 sc[2][2], mx = _mm512_setzero_ps();
    UNROLL for (int bb = 0; bb < NB; bb++) {
        const uint8_t *sp = blk[bb] + kvp__block_data_bytes(f) + 2 * (size_t)t0;
        UNROLL for (int j = 0; j < 2; j++) {
            sc[bb][j] = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mk[j], sp + 32 * j));
            mx = _mm512_max_ps(mx, sc[bb][j]); /* scales are >= 0 */
        }
    }
    float smax = _mm512_reduce_max_ps(mx);
    /* Probabilities get 16 bits, as two u8 halves (p' ~= step * (256*hi +
     * lo)), against the bound top = pmax * smax: 8 bits would add ~0.4% to
     * the output error, as much as the values' own quantization. */
    __m512 top4 = _mm512_mul_ps(rows_to_lanes(t->pmax), _mm512_set1_ps(smax));
    float inv[16] KVP__ALIGN64, step[16] KVP__ALIGN64; /* lane 4r: row r's */
    _mm512_store_ps(inv, div_or_zero(65535.0f, top4));
    _mm512_store_ps(step, _mm512_mul_ps(top4, _mm512_set1_ps(1.0f / 65535.0f)));
    probs16 pq KVP__ALIGN64;
    UNROLL for (int r = 0; r < R; r++) {
        __m512 vinv = _mm512_set1_ps(inv[4 * r]);
        UNROLL for (int bb = 0; bb < NB; bb++) for (int j = 0; j < (n4 > 16 ? 2 : 1); j++) {
            /* block b's quads at n4/4 * b: the chunk loops' group order */
            int at = bb * (n4 / 4) + 4 * j;
            __m512 pv = _mm512_mul_ps(_mm512_maskz_loadu_ps(mk[j], &t->p[r][P * bb + 16 * j]), sc[bb][j]);
            __m512i x = _mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(pv, vinv)), _mm512_set1_epi32(65535));
            _mm_storeu_si128((__m128i *)(void *)&pq.hi[r][at], PACK_S8(_mm512_srli_epi32(x, 8)));
            _mm_storeu_si128((__m128i *)(void *)&pq.lo[r][at], PACK_S8(_mm512_and_si512(x, _mm512_set1_epi32(255))));
        }
        pq.step[r] = step[4 * r];
    }
    v8_blocks vbk = {{vb + (size_t)t0 * (size_t)D, NB > 1 ? vb1 : NULL}, {t->pf_v, pf1}, n4 / 4};
    int d0 = 0;
    for (; d0 + 32 <= D; d0 += 32) vacc_i8_chunk2(t, &vbk, d0, &pq);
    for (; d0 < D; d0 += 16) vacc_i8_chunk1(t, &vbk, d0, &pq);
    if (n4 < n) kvp__vacc_tail(t, vb, f, t0, n4, n);
}

TGT static void vacc_int8(kvp__tile *t, const uint8_t *vb, const kvp__blockfmt *f, int t0, int n) {
    vacc_int8_body(t, vb, NULL, 0, f, t0, n, 1);
}

/* Two full pages (P = 16 or 32). */
TGT static void vacc2_int8(kvp__tile *t, const uint8_t *vb0, const uint8_t *vb1, ptrdiff_t pf1,
                           const kvp__blockfmt *f) {
    vacc_int8_body(t, vb0, vb1, pf1, f, 0, f->page_size, 2);
}

/* int4 values: token groups of [D/2][4] bytes; in each 32-channel scale
 * group, channel i is the low nibble and i + W/2 the high nibble.
 * Per group g and row r: p'[t] = p[t]·scale[g][t] quantized to u8 against
 * the bound pmax_r·smax_g (p / pmax_r and scale·255/smax_g are formed once,
 * so a code costs one multiply), and mterm = Σ p·(min + 8·scale) with the
 * 4 rows' sums reduced together. */
/* NH: 16-token halves each block's part of the chunk has (1 at page 16 and
 * below: the second half's vector work is skipped, not done on zeros). NB:
 * blocks (1, or 2 or 4 full pages: p[r][P * b + i] is block b's token i,
 * blk[b] its block, pfd[b] that block's prefetch distance). The blocks
 * share the probabilities' bound, the integer accumulators and the output
 * update, which are per chunk, not per token. */
TGT_INLINE static void vacc_int4_body(kvp__tile *t, const uint8_t *const *blk, const ptrdiff_t *pfd,
                                      const kvp__blockfmt *f, int t0, int n, const int NH, const int NB) {
    const int D = t->D, P = f->page_size, G = kvp__v4_groups(D), n4 = n / 4 * 4;
    const __m512i top = _mm512_set1_epi8((char)0xF0), flip = _mm512_set1_epi8((char)0x80);
    const __mmask16 mk[2] = {mask16(n4), mask16(n4 - 16)};
    /* per group: scales and min + 8·scale as fp32 (block b's half j at
     * 32b + 16j), the largest scale */
    float sv[KVP__ATTN_MAX_D / 32][4 * KVP__CHUNK] KVP__ALIGN64, wv[KVP__ATTN_MAX_D / 32][4 * KVP__CHUNK] KVP__ALIGN64;
    /* lane 0 of each: group g's largest scale and 255 / it (0 if 0) */
    float smax[KVP__ATTN_MAX_D / 32 + 3][4] KVP__ALIGN64, sinv[KVP__ATTN_MAX_D / 32 + 3][4] KVP__ALIGN64;
    for (int g0 = 0; g0 < G; g0 += 4) {
        __m512 mx[4];
        for (int k = 0; k < 4; k++) {
            int g = g0 + k;
            mx[k] = _mm512_setzero_ps();
            if (g >= G) continue;
            UNROLL for (int bb = 0; bb < NB; bb++) {
                const uint8_t *sc = blk[bb] + kvp__block_data_bytes(f), *mn = sc + 2 * (size_t)G * (size_t)P;
                const uint8_t *sg = sc + 2 * ((size_t)g * (size_t)P + (size_t)t0);
                const uint8_t *mg = mn + 2 * ((size_t)g * (size_t)P + (size_t)t0);
                UNROLL for (int j = 0; j < NH; j++) {
                    __m512 sj = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mk[j], sg + 32 * j));
                    _mm512_store_ps(&sv[g][32 * bb + 16 * j], sj);
                    /* v = s*(c-8) + (m + 8s): see the codes below */
                    _mm512_store_ps(&wv[g][32 * bb + 16 * j],
                                    _mm512_fmadd_ps(sj, _mm512_set1_ps(8.0f),
                                                    _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mk[j], mg + 32 * j))));
                    mx[k] = _mm512_max_ps(mx[k], sj); /* scales are >= 0 */
                }
            }
        }
        __m512 m4;
        REDUCE4(_mm512_max_ps, mx[0], mx[1], mx[2], mx[3], m4);
        _mm512_store_ps(&smax[g0][0], m4);
        _mm512_store_ps(&sinv[g0][0], div_or_zero(255.0f, m4));
    }
    /* rows: p / pmax (lane 4r of pmax4 / pinv: row r's) */
    __m512 pr[R][8];
    const __m512 pmax4 = rows_to_lanes(t->pmax);
    float pinv[16] KVP__ALIGN64;
    _mm512_store_ps(pinv, div_or_zero(1.0f, pmax4));
    UNROLL for (int r = 0; r < R; r++) {
        __m512 inv = _mm512_set1_ps(pinv[4 * r]);
        UNROLL for (int bb = 0; bb < NB; bb++) UNROLL for (int j = 0; j < NH; j++)
            pr[r][2 * bb + j] = _mm512_mul_ps(_mm512_maskz_loadu_ps(mk[j], &t->p[r][P * bb + 16 * j]), inv);
    }
    for (int g = 0; g < G; g++) {
        int w = D - 32 * g < 32 ? D - 32 * g : 32, half = w / 2;
        __m512 sn = _mm512_set1_ps(sinv[g][0]);
        __m512 sq[8], wq[8];
        UNROLL for (int bb = 0; bb < NB; bb++) UNROLL for (int j = 0; j < NH; j++) {
            sq[2 * bb + j] = _mm512_mul_ps(_mm512_load_ps(&sv[g][32 * bb + 16 * j]), sn);
            wq[2 * bb + j] = _mm512_load_ps(&wv[g][32 * bb + 16 * j]);
        }
        uint32_t pq[R][4 * KVP__CHUNK / 4] KVP__ALIGN64; /* block b's quad i at 8b + i */
        __m512 mt[R], mt4;
        /* p/pmax * s*255/smax <= 255 (saturating in case exp rounds p above
         * pmax; the product is >= 0) */
        if (NH == 2 && NB >= 2) {
            /* blocks of 32 tokens back to back in pq: 64 tokens at a time
             * packed with vpackusdw/vpackuswb and one permute rather than
             * four saturating vpmovusdb (0.2 - 1.6% faster in place) */
            UNROLL for (int r = 0; r < R; r++) {
                mt[r] = _mm512_mul_ps(pr[r][0], wq[0]);
                UNROLL for (int v = 1; v < 2 * NB; v++) mt[r] = _mm512_fmadd_ps(pr[r][v], wq[v], mt[r]);
                UNROLL for (int h = 0; h < NB / 2; h++) {
                    __m512i c[4];
                    UNROLL for (int k = 0; k < 4; k++) c[k] = _mm512_cvtps_epi32(_mm512_mul_ps(pr[r][4 * h + k], sq[4 * h + k]));
                    __m512i b = _mm512_permutexvar_epi32(PACK4_ORDER, _mm512_packus_epi16(_mm512_packus_epi32(c[0], c[1]),
                                                                                         _mm512_packus_epi32(c[2], c[3])));
                    _mm512_store_si512((void *)&pq[r][16 * h], b);
                }
            }
        } else {
            UNROLL for (int r = 0; r < R; r++) {
                mt[r] = _mm512_mul_ps(pr[r][0], wq[0]);
                UNROLL for (int bb = 0; bb < NB; bb++) UNROLL for (int j = 0; j < NH; j++) {
                    __m512i c = _mm512_cvtps_epi32(_mm512_mul_ps(pr[r][2 * bb + j], sq[2 * bb + j]));
                    _mm_store_si128((__m128i *)(void *)&pq[r][8 * bb + 4 * j], PACK_U8S(c));
                    if (bb + j > 0) mt[r] = _mm512_fmadd_ps(pr[r][2 * bb + j], wq[2 * bb + j], mt[r]);
                }
            }
        }
        REDUCE4(_mm512_add_ps, mt[0], mt[1], mt[2], mt[3], mt4);
        float mterm[16] KVP__ALIGN64, step[16] KVP__ALIGN64; /* lane 4r: row r's */
        _mm512_store_ps(mterm, _mm512_mul_ps(mt4, pmax4));
        /* 1/16: the codes are 16(c - 8) (below); a power of two, so the
         * result is the same to the bit as with c - 8 */
        _mm512_store_ps(step, _mm512_mul_ps(pmax4, _mm512_set1_ps(smax[g][0] * (1.0f / (255.0f * 16.0f)))));
        const __mmask64 m = half == 16 ? ~(__mmask64)0 : (((__mmask64)1 << (4 * half)) - 1);
#define V4_DECL(r) __m512i lo_##r = _mm512_setzero_si512(), hi_##r = lo_##r;
        R4(V4_DECL)
        UNROLL for (int bb = 0; bb < NB; bb++) {
            const uint8_t *base = blk[bb] + (size_t)t0 * (size_t)D / 2;
            const ptrdiff_t pf = pfd[bb];
            const uint32_t *pqb = &pq[0][8 * bb];
            for (int tg = 0; tg < n4 / 4; tg++) {
                PF_AHEAD_BY(base + (size_t)tg * 2 * (size_t)D + (size_t)g * 64, pf, 1);
                __m512i b = _mm512_maskz_loadu_epi8(m, base + (size_t)tg * 2 * (size_t)D + (size_t)g * 64);
                /* codes centred on 0 (c - 8): the rounding error of the u8
                 * probabilities then does not add up coherently over tokens, as
                 * it would with codes averaging 7.5. Each nibble is taken to
                 * the byte's top (16c) and its top bit flipped: 16(c - 8) as
                 * s8, one vpternlogd ((x & 0xF0) ^ 0x80) for the high nibbles,
                 * a shift and one for the low ones, against an and, shift and
                 * two subtractions for c - 8 itself; the 16 goes to the step.
                 * Measured: int4 1.2 - 1.3% faster (2 threads, batch 1, 8k and
                 * 32k; 1 thread 32k; in-process A/B). */
                __m512i vlo = _mm512_ternarylogic_epi32(_mm512_slli_epi16(b, 4), top, flip, 0x6A);
                __m512i vhi = _mm512_ternarylogic_epi32(b, top, flip, 0x6A);
#define V4_STEP(r)                                                                                 \
    {                                                                                              \
        __m512i pb = _mm512_set1_epi32((int)pqb[(r) * (4 * KVP__CHUNK / 4) + tg]);                 \
        DPBUSD(lo_##r, pb, vlo);                                                                   \
        DPBUSD(hi_##r, pb, vhi);                                                                   \
    }
                R4(V4_STEP)
            }
        }
        const __mmask16 mh = mask16(half);
#define V4_OUT(r)                                                                                  \
    {                                                                                              \
        float *o = t->o + (size_t)r * (size_t)D + (size_t)(32 * g);                                \
        __m512 st = _mm512_set1_ps(step[4 * r]);                                                   \
        __m512 mtv = _mm512_set1_ps(mterm[4 * r]);                                                 \
        if (half == 16) { /* unmasked where possible: measured 3% faster here (Zen 4) */         \
            __m512 c0 = _mm512_loadu_ps(o), c1 = _mm512_loadu_ps(o + 16);                          \
            _mm512_storeu_ps(o, _mm512_add_ps(_mm512_fmadd_ps(_mm512_cvtepi32_ps(lo_##r), st, c0), mtv)); \
            _mm512_storeu_ps(o + 16, _mm512_add_ps(_mm512_fmadd_ps(_mm512_cvtepi32_ps(hi_##r), st, c1), mtv)); \
        } else {                                                                                   \
            __m512 c0 = _mm512_maskz_loadu_ps(mh, o), c1 = _mm512_maskz_loadu_ps(mh, o + half);    \
            c0 = _mm512_add_ps(_mm512_fmadd_ps(_mm512_cvtepi32_ps(lo_##r), st, c0), mtv);          \
            c1 = _mm512_add_ps(_mm512_fmadd_ps(_mm512_cvtepi32_ps(hi_##r), st, c1), mtv);          \
            _mm512_mask_storeu_ps(o, mh, c0);                                                      \
            _mm512_mask_storeu_ps(o + half, mh, c1);                                               \
        }                                                                                          \
    }
        R4(V4_OUT)
    }
    if (n4 < n) kvp__vacc_tail(t, blk[0], f, t0, n4, n);
}

TGT static void vacc_int4(kvp__tile *t, const uint8_t *vb, const kvp__blockfmt *f, int t0, int n) {
    const uint8_t *const blk[1] = {vb};
    const ptrdiff_t pfd[1] = {t->pf_v};
    if (n / 4 * 4 <= 16) vacc_int4_body(t, blk, pfd, f, t0, n, 1, 1);
    else vacc_int4_body(t, blk, pfd, f, t0, n, 2, 1);
}

/* Two full pages (P = 32, or 16: NH halves per block). */
TGT static void vacc2_int4(kvp__tile *t, const uint8_t *vb0, const uint8_t *vb1, ptrdiff_t pf1,
                           const kvp__blockfmt *f) {
    const uint8_t *const blk[2] = {vb0, vb1};
    const ptrdiff_t pfd[2] = {t->pf_v, pf1};
    if (f->page_size <= 16) vacc_int4_body(t, blk, pfd, f, 0, f->page_size, 1, 2);
    else vacc_int4_body(t, blk, pfd, f, 0, f->page_size, 2, 2);
}

/* Four full pages (P = 32, or 16). */
TGT static void vacc4_int4(kvp__tile *t, const uint8_t *const vb[4], const ptrdiff_t pf[4],
                           const kvp__blockfmt *f) {
    if (f->page_size <= 16) vacc_int4_body(t, vb, pf, f, 0, f->page_size, 1, 4);
    else vacc_int4_body(t, vb, pf, f, 0, f->page_size, 2, 4);
}

/* One copy of each plain-format stage per format, so loads are branch-free. */
#define PLAIN_STAGES(name, FMT)                                                                    \
    TGT static void klogits_dm_##name(kvp__tile *t, const uint8_t *kb, const kvp__blockfmt *f,   \
                                      int t0, int n) {                                          \
        klogits_dm(FMT, t, kb, f, t0, n);                                                        \
    }                                                                                            \
    TGT static void klogits_tm_##name(kvp__tile *t, const uint8_t *kb, const kvp__blockfmt *f,   \
                                      int t0, int n) {                                          \
        klogits_tm(FMT, t, kb, f, t0, n);                                                        \
    }                                                                                            \
    TGT static void vacc_##name(kvp__tile *t, const uint8_t *vb, const kvp__blockfmt *f, int t0, \
                                int n) {                                                         \
        vacc_pl(FMT, t, vb, f, t0, n);                                                           \
    }
PLAIN_STAGES(fp32, KVP_FORMAT_FP32)
PLAIN_STAGES(fp16, KVP_FORMAT_FP16)
PLAIN_STAGES(bf16, KVP_FORMAT_BF16)
PLAIN_STAGES(fp8, KVP_FORMAT_FP8_E4M3)

/* ---- prefill blocks (cpu.h) ------------------------------------------------------------------------------ */

#define PFC KVP__PF_CHUNK
#define PFB KVP__PF_BLOCK

/* Plain keys, dim-major: each channel's tokens converted where they lie. */
TGT_INLINE static void pf_kdec_dm(int fmt, const uint8_t *kb, const kvp__blockfmt *f, int t0, int n,
                                  float fp8_scale, float *kc) {
    const int es = kvp__plain_size(fmt), P = f->page_size, D = f->head_dim;
    const __m512 u = _mm512_set1_ps(plain_unit(fmt, fp8_scale));
    for (int d = 0; d < D; d++) {
        const uint8_t *p = kb + ((size_t)d * (size_t)P + (size_t)t0) * (size_t)es;
        for (int i = 0; i < n; i += 16) {
            __m512 v = load_plain(fmt, p + (size_t)i * (size_t)es, n - i);
            if (fmt == KVP_FORMAT_FP8_E4M3) v = _mm512_mul_ps(v, u);
            _mm512_mask_storeu_ps(kc + (size_t)d * PFC + (size_t)i, mask16(n - i), v);
        }
    }
}

/* Plain keys, token-major: 16 tokens x 16 channels at a time, transposed
 * in registers (four rounds of shuffles), stored as channel rows. */
TGT_INLINE static void pf_kdec_tm(int fmt, const uint8_t *kb, const kvp__blockfmt *f, int t0, int n,
                                  float fp8_scale, float *kc) {
    const int es = kvp__plain_size(fmt), D = f->head_dim;
    const __m512 u = _mm512_set1_ps(plain_unit(fmt, fp8_scale));
    for (int i0 = 0; i0 < n; i0 += 16) {
        const __mmask16 keep = mask16(n - i0);
        for (int d = 0; d < D; d += 16) {
            __m512 r[16], t[16];
            UNROLL for (int i = 0; i < 16; i++) {
                r[i] = i0 + i < n ? load_plain(fmt, kb + ((size_t)(t0 + i0 + i) * (size_t)D + (size_t)d) * (size_t)es, 16)
                                  : _mm512_setzero_ps();
                if (fmt == KVP_FORMAT_FP8_E4M3) r[i] = _mm512_mul_ps(r[i], u);
            }
            UNROLL for (int i = 0; i < 8; i++) {
                t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
                t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
            }
            /* r[4g + k]: tokens 4g..4g+3 of channel 4L + k in 128-bit lane L */
            UNROLL for (int g = 0; g < 4; g++) {
                r[4 * g + 0] = _mm512_shuffle_ps(t[4 * g], t[4 * g + 2], 0x44);
                r[4 * g + 1] = _mm512_shuffle_ps(t[4 * g], t[4 * g + 2], 0xEE);
                r[4 * g + 2] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0x44);
                r[4 * g + 3] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0xEE);
            }
            UNROLL for (int h = 0; h < 2; h++)
                UNROLL for (int k = 0; k < 4; k++) {
                    t[8 * h + k] = _mm512_shuffle_f32x4(r[8 * h + k], r[8 * h + k + 4], 0x88);
                    t[8 * h + k + 4] = _mm512_shuffle_f32x4(r[8 * h + k], r[8 * h + k + 4], 0xDD);
                }
            float *o = kc + (size_t)d * PFC + (size_t)i0;
            UNROLL for (int k = 0; k < 4; k++) {
                _mm512_mask_storeu_ps(o + (size_t)k * PFC, keep, _mm512_shuffle_f32x4(t[k], t[k + 8], 0x88));
                _mm512_mask_storeu_ps(o + (size_t)(8 + k) * PFC, keep, _mm512_shuffle_f32x4(t[k], t[k + 8], 0xDD));
                _mm512_mask_storeu_ps(o + (size_t)(4 + k) * PFC, keep, _mm512_shuffle_f32x4(t[k + 4], t[k + 12], 0x88));
                _mm512_mask_storeu_ps(o + (size_t)(12 + k) * PFC, keep, _mm512_shuffle_f32x4(t[k + 4], t[k + 12], 0xDD));
            }
        }
    }
}

/* Plain values: rows converted. */
TGT_INLINE static void pf_vdec_pl(int fmt, const uint8_t *vb, const kvp__blockfmt *f, int t0, int n,
                                  float fp8_scale, float *vc) {
    const int es = kvp__plain_size(fmt), D = f->head_dim;
    const __m512 u = _mm512_set1_ps(plain_unit(fmt, fp8_scale));
    for (int i = 0; i < n; i++) {
        const uint8_t *p = vb + (size_t)(t0 + i) * (size_t)D * (size_t)es;
        for (int d = 0; d < D; d += 16) {
            __m512 v = load_plain(fmt, p + (size_t)d * (size_t)es, 16);
            if (fmt == KVP_FORMAT_FP8_E4M3) v = _mm512_mul_ps(v, u);
            _mm512_store_ps(vc + (size_t)i * KVP__ATTN_MAX_D + (size_t)d, v);
        }
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

/* A block's D fp16 values at p as fp32 (D a multiple of 16). */
TGT_INLINE static void f16_row(const uint8_t *p, int D, float *out) {
    for (int d = 0; d < D; d += 16)
        _mm512_store_ps(out + d, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(p + 2 * (size_t)d))));
}

/* int8 keys ([D/4][P][4] codes, per-channel scale and minimum): the four
 * channels of each 32-bit lane taken apart by shifts. */
TGT static void pf_kdec_int8(const uint8_t *kb, const kvp__blockfmt *f, int t0, int n, float fp8_scale,
                             float *kc) {
    (void)fp8_scale;
    const int P = f->page_size, D = f->head_dim;
    float sc[KVP__ATTN_MAX_D] KVP__ALIGN64, mn[KVP__ATTN_MAX_D] KVP__ALIGN64;
    f16_row(kb + kvp__block_data_bytes(f), D, sc);
    f16_row(kb + kvp__block_data_bytes(f) + 2 * (size_t)D, D, mn);
    const __m512i ff = _mm512_set1_epi32(0xFF);
    for (int q = 0; q < D / 4; q++) {
        const uint8_t *p = kb + ((size_t)q * (size_t)P + (size_t)t0) * 4;
        for (int i = 0; i < n; i += 16) {
            __m512i x = _mm512_maskz_loadu_epi32(mask16(n - i), p + 4 * (size_t)i);
            UNROLL for (int c = 0; c < 4; c++) {
                int d = 4 * q + c;
                __m512 code = _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(x, 8 * c), ff));
                _mm512_mask_storeu_ps(kc + (size_t)d * PFC + (size_t)i, mask16(n - i),
                                      _mm512_fmadd_ps(_mm512_set1_ps(sc[d]), code, _mm512_set1_ps(mn[d])));
            }
        }
    }
}

/* int4 keys ([D/4][P/2][4]: tokens 2i and 2i+1 in a byte's low and high
 * nibble): each channel's even and odd tokens decoded, then interleaved;
 * the outlier channels decoded from their int8 codes over them. Odd
 * offsets or page sizes (never seen from the table's own pages) go
 * through the portable decoder. */
TGT static void pf_kdec_int4(const uint8_t *kb, const kvp__blockfmt *f, int t0, int n, float fp8_scale,
                             float *kc) {
    const int P = f->page_size, D = f->head_dim;
    if ((t0 | P) & 1) {
        kvp__kernels_portable.pf_kdec[KVP_FORMAT_INT4_V1][0](kb, f, t0, n, fp8_scale, kc);
        return;
    }
    float sc[KVP__ATTN_MAX_D] KVP__ALIGN64, mn[KVP__ATTN_MAX_D] KVP__ALIGN64;
    f16_row(kb + kvp__block_data_bytes(f), D, sc);
    f16_row(kb + kvp__block_data_bytes(f) + 2 * (size_t)D, D, mn);
    const __m512i f4 = _mm512_set1_epi32(0x0F);
    const __m512i lo_idx = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const __m512i hi_idx = _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
    const int pairs = (n + 1) / 2; /* <= 16 */
    for (int q = 0; q < D / 4; q++) {
        const uint8_t *p = kb + ((size_t)q * (size_t)(P / 2) + (size_t)(t0 / 2)) * 4;
        __m512i x = _mm512_maskz_loadu_epi32(mask16(pairs), p);
        UNROLL for (int c = 0; c < 4; c++) {
            int d = 4 * q + c;
            __m512i byte = _mm512_srli_epi32(x, 8 * c);
            __m512 s = _mm512_set1_ps(sc[d]), m = _mm512_set1_ps(mn[d]);
            __m512 ev = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(_mm512_and_si512(byte, f4)), m);
            __m512 od = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(byte, 4), f4)), m);
            float *o = kc + (size_t)d * PFC;
            _mm512_mask_storeu_ps(o, mask16(n), _mm512_permutex2var_ps(ev, lo_idx, od));
            _mm512_mask_storeu_ps(o + 16, mask16(n - 16), _mm512_permutex2var_ps(ev, hi_idx, od));
        }
    }
    /* outliers, last entry first: where a (foreign) table repeats a
     * channel, the first entry wins, as in the reference decoder */
    kvp__k4_outl ol = kvp__k4_outliers_of(kb, f);
    for (int j = ol.count - 1; j >= 0; j--) {
        unsigned d = kvp__load_u16(ol.table + 2 * (size_t)j);
        if (d >= (unsigned)D) continue;
        __m512 os = _mm512_set1_ps(kvp__f16_to_f32(kvp__load_u16(ol.table + 2 * (size_t)(ol.count + j))));
        __m512 om = _mm512_set1_ps(kvp__f16_to_f32(kvp__load_u16(ol.table + 2 * (size_t)(2 * ol.count + j))));
        for (int i = 0; i < n; i += 16) {
            __m512i w;
            if (ol.quads) /* [R/4][P][4]: entry j is byte j%4 of each token's word */
                w = _mm512_and_si512(_mm512_srli_epi32(_mm512_maskz_loadu_epi32(mask16(n - i), ol.codes +
                                                           ((size_t)(j / 4) * (size_t)P + (size_t)(t0 + i)) * 4),
                                                       8 * (unsigned)(j % 4)),
                                     _mm512_set1_epi32(0xFF));
            else
                w = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(mask16(n - i), ol.codes + (size_t)j * (size_t)P + (size_t)(t0 + i)));
            __m512 c = _mm512_cvtepi32_ps(w);
            _mm512_mask_storeu_ps(kc + (size_t)d * PFC + (size_t)i, mask16(n - i), _mm512_fmadd_ps(os, c, om));
        }
    }
}

/* int8 / int4 values come in token groups of 4; a group that is not whole
 * (the last of a page whose size is not a multiple of 4) or not aligned to
 * t0 goes through the reference decoder, token by token. */
static void pf_vdec_tokens(const uint8_t *vb, const kvp__blockfmt *f, int t0, int n, float *vc) {
    kvp__block_decode(f, vb, t0, n, vc, KVP__ATTN_MAX_D, 0.0f);
}

/* int8 values: a token group is [D][4] bytes, a 32-bit lane the four
 * tokens of one channel, each token a sign-extending shift apart. */
TGT static void pf_vdec_int8(const uint8_t *vb, const kvp__blockfmt *f, int t0, int n, float fp8_scale,
                             float *vc) {
    (void)fp8_scale;
    const int P = f->page_size, D = f->head_dim;
    const uint8_t *sc = vb + kvp__block_data_bytes(f);
    int i = 0;
    if (t0 % KVP__V_TOKGROUP == 0)
        for (; i < n && kvp__v_group_tokens(P, t0 + i) == KVP__V_TOKGROUP; i += KVP__V_TOKGROUP) {
            int g = (t0 + i) / KVP__V_TOKGROUP, u = n - i < 4 ? n - i : 4;
            const uint8_t *p = vb + (size_t)g * KVP__V_TOKGROUP * (size_t)D;
            __m512 s[4];
            UNROLL for (int k = 0; k < 4; k++)
                s[k] = _mm512_set1_ps(kvp__f16_to_f32(kvp__load_u16(sc + 2 * (size_t)(t0 + i + k))));
            for (int d = 0; d < D; d += 16) {
                __m512i x = _mm512_loadu_si512(p + 4 * (size_t)d);
                UNROLL for (int k = 0; k < 4; k++)
                    if (k < u)
                        _mm512_store_ps(vc + (size_t)(i + k) * KVP__ATTN_MAX_D + (size_t)d,
                                        _mm512_mul_ps(s[k], _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(x, 24 - 8 * k), 24))));
            }
        }
    if (i < n) pf_vdec_tokens(vb, f, t0 + i, n - i, vc + (size_t)i * KVP__ATTN_MAX_D);
}

/* int4 values: per token group and 32-channel scale group, 64 bytes whose
 * 32-bit lanes are slots s (channel s low, s + 16 high) of four tokens. A
 * narrower last group (head_dim % 32 == 16) is decoded channel by channel. */
TGT static void pf_vdec_int4(const uint8_t *vb, const kvp__blockfmt *f, int t0, int n, float fp8_scale,
                             float *vc) {
    (void)fp8_scale;
    const int P = f->page_size, D = f->head_dim, G = kvp__v4_groups(D), GW = D / KVP__V4_GROUP;
    const uint8_t *sc = vb + kvp__block_data_bytes(f);
    const __m512i f4 = _mm512_set1_epi32(0x0F);
    int i = 0;
    if (t0 % KVP__V_TOKGROUP == 0)
        for (; i < n && kvp__v_group_tokens(P, t0 + i) == KVP__V_TOKGROUP; i += KVP__V_TOKGROUP) {
            int g = (t0 + i) / KVP__V_TOKGROUP, u = n - i < 4 ? n - i : 4;
            const uint8_t *p = vb + (size_t)g * KVP__V_TOKGROUP * (size_t)D / 2;
            for (int k = 0; k < GW; k++) {
                __m512i x = _mm512_loadu_si512(p + 64 * (size_t)k);
                for (int tk = 0; tk < u; tk++) {
                    size_t si = (size_t)k * (size_t)P + (size_t)(t0 + i + tk);
                    __m512 s = _mm512_set1_ps(kvp__f16_to_f32(kvp__load_u16(sc + 2 * si)));
                    __m512 m = _mm512_set1_ps(kvp__f16_to_f32(kvp__load_u16(sc + 2 * (size_t)G * (size_t)P + 2 * si)));
                    __m512i byte = _mm512_srli_epi32(x, 8 * tk);
                    float *o = vc + (size_t)(i + tk) * KVP__ATTN_MAX_D + (size_t)k * KVP__V4_GROUP;
                    _mm512_store_ps(o, _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(_mm512_and_si512(byte, f4)), m));
                    _mm512_store_ps(o + 16, _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(byte, 4), f4)), m));
                }
            }
            for (int tk = 0; tk < u; tk++) /* the narrow last group, if any */
                for (int d = GW * KVP__V4_GROUP; d < D; d++)
                    vc[(size_t)(i + tk) * KVP__ATTN_MAX_D + (size_t)d] = kvp__block_decode_one(f, vb, t0 + i + tk, d, 0.0f);
        }
    if (i < n) pf_vdec_tokens(vb, f, t0 + i, n - i, vc + (size_t)i * KVP__ATTN_MAX_D);
}

/* The block stage in three parts, so the bf16 products (further down)
 * reuse the softmax and whichever side stays fp32. Rows r0 .. r0+7
 * against the chunk: 8 x 32 logits in 16 registers (one K load feeds 8
 * FMAs), softmax with the rows' maxima reduced four at a time and one
 * vector exp for the 8 rescale factors, then o += p.v over slices of 32
 * channels, 16 accumulators, the rescale folded into their load. */
TGT_INLINE static void pf_logits_f32(const kvp__pblock *b, int r0, __m512 *a, __m512 *c) {
    UNROLL for (int r = 0; r < PFB; r++) a[r] = c[r] = _mm512_setzero_ps();
    for (int d = 0; d < b->D; d++) {
        __m512 k0 = _mm512_load_ps(&b->kc[d][0]), k1 = _mm512_load_ps(&b->kc[d][16]);
        UNROLL for (int r = 0; r < PFB; r++) {
            __m512 q = _mm512_set1_ps(b->q[r0 + r][d]);
            a[r] = _mm512_fmadd_ps(q, k0, a[r]);
            c[r] = _mm512_fmadd_ps(q, k1, c[r]);
        }
    }
}

/* Logits a (tokens 0-15) and c (16-31) in, p out in their place and in
 * b->s; m and lv updated, al[r] = row r's rescale factor. */
TGT_INLINE static void pf_softmax(kvp__pblock *b, int r0, int32_t pos0, int n, int masked, __m512 *a,
                                  __m512 *c, float *al) {
    __mmask16 v0[PFB], v1[PFB];
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    __m512 x[PFB];
    if (masked) {
        const __m512i iota = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
        __m512i p0 = _mm512_add_epi32(iota, _mm512_set1_epi32(pos0));
        __m512i p1 = _mm512_add_epi32(p0, _mm512_set1_epi32(16));
        UNROLL for (int r = 0; r < PFB; r++) {
            __m512i lo = _mm512_set1_epi32(b->lo[r0 + r]), hi = _mm512_set1_epi32(b->hi[r0 + r]);
            v0[r] = mask16(n) & _mm512_cmpge_epi32_mask(p0, lo) & _mm512_cmple_epi32_mask(p0, hi);
            v1[r] = mask16(n - 16) & _mm512_cmpge_epi32_mask(p1, lo) & _mm512_cmple_epi32_mask(p1, hi);
        }
    } else {
        UNROLL for (int r = 0; r < PFB; r++) v0[r] = v1[r] = (__mmask16)0xFFFF;
    }
    UNROLL for (int r = 0; r < PFB; r++)
        x[r] = _mm512_max_ps(_mm512_mask_mov_ps(ninf, v0[r], a[r]), _mm512_mask_mov_ps(ninf, v1[r], c[r]));
    __m512 cm_a, cm_b;
    REDUCE4(_mm512_max_ps, x[0], x[1], x[2], x[3], cm_a);
    REDUCE4(_mm512_max_ps, x[4], x[5], x[6], x[7], cm_b);
    /* lanes 0..7: the rows' chunk maxima */
    __m512 cm = _mm512_permutex2var_ps(cm_a, _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 28, 24, 20, 16, 12, 8, 4, 0), cm_b);
    __m512 mold = _mm512_maskz_loadu_ps(0xFF, &b->m[r0]);
    __m512 mnew = _mm512_max_ps(mold, cm);
    __mmask16 chg = _mm512_cmp_ps_mask(mnew, ninf, _CMP_NEQ_OQ) & _mm512_cmp_ps_mask(mold, mnew, _CMP_NEQ_OQ) & 0xFF;
    __m512 alpha = _mm512_mask_mov_ps(_mm512_set1_ps(1.0f), chg, exp512(_mm512_sub_ps(mold, mnew)));
    float mn[16] KVP__ALIGN64;
    _mm512_store_ps(mn, mnew);
    _mm512_store_ps(al, alpha);
    _mm512_mask_storeu_ps(&b->m[r0], 0xFF, mnew);
    UNROLL for (int r = 0; r < PFB; r++) {
        __m512 mv = _mm512_set1_ps(mn[r]);
        a[r] = _mm512_maskz_mov_ps(v0[r], exp512(_mm512_sub_ps(a[r], mv)));
        c[r] = _mm512_maskz_mov_ps(v1[r], exp512(_mm512_sub_ps(c[r], mv)));
        _mm512_store_ps(&b->s[r0 + r][0], a[r]);
        _mm512_store_ps(&b->s[r0 + r][16], c[r]);
        __m512 lv = _mm512_fmadd_ps(_mm512_load_ps(b->lv[r0 + r]), _mm512_set1_ps(al[r]), _mm512_add_ps(a[r], c[r]));
        _mm512_store_ps(b->lv[r0 + r], lv);
    }
}

/* The 8 rows' output channels d0 .. d0+15 (o0) and, with `two`, d0+16 ..
 * d0+31 (o1), times the rows' rescale factors al; and their store. */
TGT_INLINE static void pf_o_load(const float *ob, int D, int d0, const float *al, __m512 *o0, __m512 *o1,
                                 const bool two) {
    UNROLL for (int r = 0; r < PFB; r++) {
        __m512 s = _mm512_set1_ps(al[r]);
        o0[r] = _mm512_mul_ps(_mm512_loadu_ps(ob + (size_t)r * (size_t)D + (size_t)d0), s);
        if (two) o1[r] = _mm512_mul_ps(_mm512_loadu_ps(ob + (size_t)r * (size_t)D + (size_t)d0 + 16), s);
    }
}
TGT_INLINE static void pf_o_store(float *ob, int D, int d0, const __m512 *o0, const __m512 *o1, const bool two) {
    UNROLL for (int r = 0; r < PFB; r++) {
        _mm512_storeu_ps(ob + (size_t)r * (size_t)D + (size_t)d0, o0[r]);
        if (two) _mm512_storeu_ps(ob + (size_t)r * (size_t)D + (size_t)d0 + 16, o1[r]);
    }
}

/* o = o * al + p.v from vc (fp32), p from b->s. */
TGT_INLINE static void pf_pv_f32(kvp__pblock *b, int r0, int n, const float *al) {
    const int D = b->D;
    float *ob = b->o + (size_t)r0 * (size_t)D;
    int d0 = 0;
    for (; d0 + 32 <= D; d0 += 32) {
        __m512 o0[PFB], o1[PFB];
        pf_o_load(ob, D, d0, al, o0, o1, true);
        for (int i = 0; i < n; i++) {
            __m512 w0 = _mm512_load_ps(&b->vc[i][d0]), w1 = _mm512_load_ps(&b->vc[i][d0 + 16]);
            UNROLL for (int r = 0; r < PFB; r++) {
                __m512 p = _mm512_set1_ps(b->s[r0 + r][i]);
                o0[r] = _mm512_fmadd_ps(p, w0, o0[r]);
                o1[r] = _mm512_fmadd_ps(p, w1, o1[r]);
            }
        }
        pf_o_store(ob, D, d0, o0, o1, true);
    }
    if (d0 < D) { /* head_dim % 32 == 16 */
        __m512 o0[PFB];
        pf_o_load(ob, D, d0, al, o0, NULL, false);
        for (int i = 0; i < n; i++) {
            __m512 w0 = _mm512_load_ps(&b->vc[i][d0]);
            UNROLL for (int r = 0; r < PFB; r++)
                o0[r] = _mm512_fmadd_ps(_mm512_set1_ps(b->s[r0 + r][i]), w0, o0[r]);
        }
        pf_o_store(ob, D, d0, o0, NULL, false);
    }
}

TGT static void pf_block_avx512(kvp__pblock *b, int r0, int32_t pos0, int n, int masked) {
    __m512 a[PFB], c[PFB];
    float al[16] KVP__ALIGN64;
    pf_logits_f32(b, r0, a, c);
    pf_softmax(b, r0, pos0, n, masked, a, c, al);
    pf_pv_f32(b, r0, n, al);
}

/* ---- prefill blocks: bf16 products (AVX-512 BF16) ------------------------------------------------------
 *
 * vdpbf16ps multiplies 16 pairs of bf16 and adds both products to an fp32
 * lane: 32 multiply-adds per instruction, twice vfmadd231ps. Keys and
 * values are decoded to fp32 as for the fp32 blocks, then rounded to bf16
 * once per chunk (kb: a key's channels 2i, 2i+1 per word; vb: tokens 2i,
 * 2i+1 of a value channel per word); the query once per item (qb), the
 * probabilities once per block and chunk. Rounding to nearest even, at most
 * 2^-9 relative: used only for formats whose own rounding is far coarser
 * (int4: 4-bit codes; fp8 e4m3: 3 mantissa bits, which bf16 holds exactly). */
#define TGT_BF __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx512dq,avx512bf16,avx2,fma,f16c")))
#define TGT_BF_INLINE __attribute__((always_inline, target("avx512f,avx512bw,avx512vl,avx512vnni,avx512dq,avx512bf16,avx2,fma,f16c"))) inline
/* acc += a . b (bf16 pairs). GCC's intrinsic, like vpdpbusd's, copies the
 * accumulator around each use; the one-instruction asm does not. */
#if defined(__clang__)
#define DPBF16(acc, a, b) ((acc) = _mm512_dpbf16_ps((acc), (__m512bh)(a), (__m512bh)(b)))
#else
#define DPBF16(acc, a, b) __asm__("vdpbf16ps %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b))
#endif

/* 16-bit lanes [x0..x15 | y0..y15] (two vectors' bf16 halves) to pairs
 * (x_i, y_i) per 32-bit lane. */
TGT_BF_INLINE static __m512i bf16_pairs(__m512 lo16, __m512 hi16) {
    const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                         23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    return _mm512_permutexvar_epi16(idx, (__m512i)_mm512_cvtne2ps_pbh(hi16, lo16));
}

TGT_BF static void pf_qpack_bf16(kvp__pblock *b, int rows) {
    const int D = b->D;
    for (int r = 0; r < rows; r++) {
        int d = 0;
        for (; d + 32 <= D; d += 32) /* bf16 in channel order: pairs as they come */
            _mm512_store_si512((void *)&b->qb[r][d / 2],
                               (__m512i)_mm512_cvtne2ps_pbh(_mm512_load_ps(&b->q[r][d + 16]), _mm512_load_ps(&b->q[r][d])));
        if (d < D)
            _mm256_store_si256((__m256i *)(void *)&b->qb[r][d / 2], (__m256i)_mm512_cvtneps_pbh(_mm512_load_ps(&b->q[r][d])));
    }
}

TGT_BF static void pf_kvpack_bf16(kvp__pblock *b, int kbf, int vbf) {
    const int D = b->D;
    if (kbf)
        for (int i = 0; i < D / 2; i++)
            UNROLL for (int h = 0; h < 2; h++)
                _mm512_store_si512((void *)&b->kb[i][16 * h],
                                   bf16_pairs(_mm512_load_ps(&b->kc[2 * i][16 * h]), _mm512_load_ps(&b->kc[2 * i + 1][16 * h])));
    if (vbf)
        for (int i = 0; i < KVP__PF_CHUNK / 2; i++)
            for (int d = 0; d < D; d += 16)
                _mm512_store_si512((void *)&b->vb[i][d],
                                   bf16_pairs(_mm512_load_ps(&b->vc[2 * i][d]), _mm512_load_ps(&b->vc[2 * i + 1][d])));
}

TGT_BF_INLINE static void pf_logits_bf16(const kvp__pblock *b, int r0, __m512 *a, __m512 *c) {
    UNROLL for (int r = 0; r < PFB; r++) a[r] = c[r] = _mm512_setzero_ps();
    for (int i = 0; i < b->D / 2; i++) {
        __m512i k0 = _mm512_load_si512(&b->kb[i][0]), k1 = _mm512_load_si512(&b->kb[i][16]);
        UNROLL for (int r = 0; r < PFB; r++) {
            __m512i q = _mm512_set1_epi32((int)b->qb[r0 + r][i]);
            DPBF16(a[r], q, k0);
            DPBF16(c[r], q, k1);
        }
    }
}

/* o = o * al + p.v over token pairs, p (a: tokens 0-15, c: 16-31) rounded
 * to bf16 pairs. */
TGT_BF_INLINE static void pf_pv_bf16(kvp__pblock *b, int r0, int n, const __m512 *a, const __m512 *c,
                                     const float *al) {
    const int D = b->D, np = (n + 1) / 2;
    uint32_t pp[PFB][16] KVP__ALIGN64; /* row r's tokens 2i, 2i+1 */
    UNROLL for (int r = 0; r < PFB; r++) _mm512_store_si512((void *)pp[r], (__m512i)_mm512_cvtne2ps_pbh(c[r], a[r]));
    float *ob = b->o + (size_t)r0 * (size_t)D;
    int d0 = 0;
    for (; d0 + 32 <= D; d0 += 32) {
        __m512 o0[PFB], o1[PFB];
        pf_o_load(ob, D, d0, al, o0, o1, true);
        for (int i = 0; i < np; i++) {
            __m512i w0 = _mm512_load_si512(&b->vb[i][d0]), w1 = _mm512_load_si512(&b->vb[i][d0 + 16]);
            UNROLL for (int r = 0; r < PFB; r++) {
                __m512i p = _mm512_set1_epi32((int)pp[r][i]);
                DPBF16(o0[r], p, w0);
                DPBF16(o1[r], p, w1);
            }
        }
        pf_o_store(ob, D, d0, o0, o1, true);
    }
    if (d0 < D) { /* head_dim % 32 == 16 */
        __m512 o0[PFB];
        pf_o_load(ob, D, d0, al, o0, NULL, false);
        for (int i = 0; i < np; i++) {
            __m512i w0 = _mm512_load_si512(&b->vb[i][d0]);
            UNROLL for (int r = 0; r < PFB; r++) DPBF16(o0[r], _mm512_set1_epi32((int)pp[r][i]), w0);
        }
        pf_o_store(ob, D, d0, o0, NULL, false);
    }
}

/* KB / VB: keys / values multiply in bf16 (the other side in fp32). */
TGT_BF_INLINE static void pf_block_bf16_body(kvp__pblock *b, int r0, int32_t pos0, int n, int masked, const int KB,
                                             const int VB) {
    __m512 a[PFB], c[PFB];
    float al[16] KVP__ALIGN64;
    if (KB) pf_logits_bf16(b, r0, a, c);
    else pf_logits_f32(b, r0, a, c);
    pf_softmax(b, r0, pos0, n, masked, a, c, al);
    if (VB) pf_pv_bf16(b, r0, n, a, c, al);
    else pf_pv_f32(b, r0, n, al);
}

TGT_BF static void pf_block_bf16_k(kvp__pblock *b, int r0, int32_t pos0, int n, int masked) {
    pf_block_bf16_body(b, r0, pos0, n, masked, 1, 0);
}
TGT_BF static void pf_block_bf16_v(kvp__pblock *b, int r0, int32_t pos0, int n, int masked) {
    pf_block_bf16_body(b, r0, pos0, n, masked, 0, 1);
}
TGT_BF static void pf_block_bf16_kv(kvp__pblock *b, int r0, int32_t pos0, int n, int masked) {
    pf_block_bf16_body(b, r0, pos0, n, masked, 1, 1);
}
/* ---- prefill blocks: int8 keys and values, integer products ------------------------------------------
 *
 * The codes are read where they lie (pool pages of a multiple of 16
 * tokens: each 16-token half of a chunk lies in one page) and multiplied
 * with vpdpbusd in the same integer forms as decode (docs/formats.md): per
 * block of 8 rows and page, the query folded with the keys' channel scales
 * and quantized to 15 bits against max|q|·max scale, as two s8 parts (two
 * passes over the codes, the first one's sums shifted 7 bits before the
 * second adds to them); per block and chunk, the probabilities folded with
 * the value scales and quantized to 16 bits against max p·max scale, as two
 * u8 parts. 16 vpdpbusd per K or V load, 64 multiply-adds each. */

TGT static void pf_int8_rows(kvp__pblock *b, int rows) {
    for (int r = 0; r < rows; r++) {
        __m512 am = _mm512_setzero_ps();
        for (int d = 0; d < b->D; d += 16) am = _mm512_range_ps(am, _mm512_load_ps(&b->q[r][d]), 0x0B);
        b->qamax[r] = _mm512_reduce_max_ps(am);
    }
}

TGT static void pf_int8_chunk(kvp__pblock *b, int n, const kvp__blockfmt *kf, const kvp__blockfmt *vf) {
    const int D = b->D;
    b->cP = kf->page_size;
    for (int h = 0; h < (b->ck[1] == b->ck[0] ? 1 : 2); h++) {
        const uint8_t *sc = b->ck[h] + kvp__block_data_bytes(kf), *mn = sc + 2 * (size_t)D;
        __m512 mx = _mm512_setzero_ps();
        for (int d = 0; d < D; d += 16) {
            __m512 s = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(sc + 2 * d)));
            _mm512_store_ps(&b->ksn[h][d], s);
            _mm512_store_ps(&b->kmin[h][d], _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(mn + 2 * d))));
            mx = _mm512_max_ps(mx, s); /* scales are >= 0 */
        }
        float smax = _mm512_reduce_max_ps(mx);
        __m512 sinv = _mm512_set1_ps(kvp__inv_or_zero(1.0f, smax));
        for (int d = 0; d < D; d += 16) _mm512_store_ps(&b->ksn[h][d], _mm512_mul_ps(_mm512_load_ps(&b->ksn[h][d]), sinv));
        b->ksmax[h] = smax;
    }
    __m512 vmx = _mm512_setzero_ps();
    for (int h = 0; h < 2; h++) {
        const uint8_t *sc = b->cv[h] + kvp__block_data_bytes(vf) + 2 * (size_t)b->coff[h];
        __m512 s = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask16(n - 16 * h), sc));
        _mm512_store_ps(&b->vs[16 * h], s);
        vmx = _mm512_max_ps(vmx, s);
    }
    b->vsmax = _mm512_reduce_max_ps(vmx);
}

/* Rows r0 .. r0+7's query for half h's page: two s8 parts per channel in
 * decode's packed order (qhl_at), the step and Σ q·min per row. */
TGT_INLINE static void pf_int8_qprep(const kvp__pblock *b, int r0, int h, int8_t (*qhl)[2 * KVP__ATTN_MAX_D],
                                     float *step, float *cst) {
    const int D = b->D;
    const __m512i m127 = _mm512_set1_epi16(127);
    __m512 cs[PFB];
    UNROLL for (int r = 0; r < PFB; r++) {
        float am = b->qamax[r0 + r];
        __m512 vi = _mm512_set1_ps(kvp__inv_or_zero(16256.0f, am));
        cs[r] = _mm512_setzero_ps();
        for (int d = 0; d < D; d += 32) {
            const bool two = d + 16 < D;
            __m512 q0 = _mm512_load_ps(&b->q[r0 + r][d]), q1 = two ? _mm512_load_ps(&b->q[r0 + r][d + 16]) : q0;
            /* x = rne(q·16256/max|q| · scale/max scale), as decode */
            __m512i x0 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_mul_ps(q0, vi), _mm512_load_ps(&b->ksn[h][d])));
            __m512i x1 = two ? _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_mul_ps(q1, vi), _mm512_load_ps(&b->ksn[h][d + 16])))
                             : x0;
            cs[r] = _mm512_fmadd_ps(q0, _mm512_load_ps(&b->kmin[h][d]), cs[r]);
            if (two) cs[r] = _mm512_fmadd_ps(q1, _mm512_load_ps(&b->kmin[h][d + 16]), cs[r]);
            __m512i w = _mm512_packs_epi32(x0, x1);
            _mm512_store_si512((void *)&qhl[r][2 * d], _mm512_packs_epi16(_mm512_srai_epi16(w, 7), _mm512_and_si512(w, m127)));
        }
        step[r] = am * b->ksmax[h] * (1.0f / 16256.0f);
    }
    __m512 c4a, c4b;
    REDUCE4(_mm512_add_ps, cs[0], cs[1], cs[2], cs[3], c4a);
    REDUCE4(_mm512_add_ps, cs[4], cs[5], cs[6], cs[7], c4b);
    _mm_storeu_ps(cst, lanes_to_rows(c4a));
    _mm_storeu_ps(cst + 4, lanes_to_rows(c4b));
}

/* Logits of rows r0 .. r0+7: a (tokens 0-15), c (16-31). */
TGT_INLINE static void pf_int8_logits(const kvp__pblock *b, int r0, __m512 *a, __m512 *c) {
    const int D = b->D, P = b->cP, same = b->ck[1] == b->ck[0];
    int8_t qhl[2][PFB][2 * KVP__ATTN_MAX_D] KVP__ALIGN64;
    float step[2][PFB], cst[2][PFB];
    pf_int8_qprep(b, r0, 0, qhl[0], step[0], cst[0]);
    if (!same) pf_int8_qprep(b, r0, 1, qhl[1], step[1], cst[1]);
    const int h1 = same ? 0 : 1;
    const uint8_t *k0p = b->ck[0] + (size_t)b->coff[0] * 4, *k1p = b->ck[1] + (size_t)b->coff[1] * 4;
    __m512i A[PFB], C[PFB];
    UNROLL for (int r = 0; r < PFB; r++) A[r] = C[r] = _mm512_setzero_si512();
    for (int part = 0; part < 2; part++) { /* qh, then ql (8 bytes on) */
        if (part == 1)
            UNROLL for (int r = 0; r < PFB; r++) {
                A[r] = _mm512_slli_epi32(A[r], 7);
                C[r] = _mm512_slli_epi32(C[r], 7);
            }
        for (int g = 0; g < D / 4; g++) {
            __m512i k0 = _mm512_loadu_si512(k0p + (size_t)g * (size_t)P * 4);
            __m512i k1 = _mm512_loadu_si512(k1p + (size_t)g * (size_t)P * 4);
            const int at = qhl_at(4 * g) + 8 * part;
            UNROLL for (int r = 0; r < PFB; r++) {
                __m512i q0 = _mm512_set1_epi32(load32(&qhl[0][r][at]));
                DPBUSD(A[r], k0, q0);
                if (same) DPBUSD(C[r], k1, q0);
                else DPBUSD_B(C[r], k1, &qhl[1][r][at]);
            }
        }
    }
    UNROLL for (int r = 0; r < PFB; r++) {
        a[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(A[r]), _mm512_set1_ps(step[0][r]), _mm512_set1_ps(cst[0][r]));
        c[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(C[r]), _mm512_set1_ps(step[h1][r]), _mm512_set1_ps(cst[h1][r]));
    }
}

/* o = o * al + p.v: p (a, c) folded with the token scales and quantized to
 * two u8 parts per row; value codes in token groups of 4 ([D][4] bytes). */
TGT_INLINE static void pf_int8_pv(kvp__pblock *b, int r0, int n, const __m512 *a, const __m512 *c, const float *al) {
    const int D = b->D, ng = (n + 3) / 4;
    /* row maxima of p, lanes 4r of each half */
    __m512 x[PFB], pm4a, pm4b;
    UNROLL for (int r = 0; r < PFB; r++) x[r] = _mm512_max_ps(a[r], c[r]);
    REDUCE4(_mm512_max_ps, x[0], x[1], x[2], x[3], pm4a);
    REDUCE4(_mm512_max_ps, x[4], x[5], x[6], x[7], pm4b);
    float pm[PFB], step[PFB];
    _mm_storeu_ps(pm, lanes_to_rows(pm4a));
    _mm_storeu_ps(pm + 4, lanes_to_rows(pm4b));
    uint8_t pq[2][PFB][KVP__PF_CHUNK] KVP__ALIGN64; /* [part][row][token] */
    const __m512 vs0 = _mm512_load_ps(&b->vs[0]), vs1 = _mm512_load_ps(&b->vs[16]);
    const __m512i top = _mm512_set1_epi32(65535), low = _mm512_set1_epi32(255);
    UNROLL for (int r = 0; r < PFB; r++) {
        float t = pm[r] * b->vsmax;
        __m512 inv = _mm512_set1_ps(kvp__inv_or_zero(65535.0f, t));
        step[r] = t * (1.0f / 65535.0f);
        __m512i x0 = _mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_mul_ps(a[r], vs0), inv)), top);
        __m512i x1 = _mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_mul_ps(c[r], vs1), inv)), top);
        _mm_store_si128((__m128i *)(void *)&pq[0][r][0], PACK_S8(_mm512_srli_epi32(x0, 8)));
        _mm_store_si128((__m128i *)(void *)&pq[0][r][16], PACK_S8(_mm512_srli_epi32(x1, 8)));
        _mm_store_si128((__m128i *)(void *)&pq[1][r][0], PACK_S8(_mm512_and_si512(x0, low)));
        _mm_store_si128((__m128i *)(void *)&pq[1][r][16], PACK_S8(_mm512_and_si512(x1, low)));
    }
    const uint8_t *grp[KVP__PF_CHUNK / 4]; /* token group tg's bytes */
    for (int tg = 0; tg < ng; tg++) {
        int h = tg / 4;
        grp[tg] = b->cv[h] + (size_t)((b->coff[h] + 4 * (tg % 4)) / 4) * 4 * (size_t)D;
    }
    float *ob = b->o + (size_t)r0 * (size_t)D;
    for (int d0 = 0; d0 < D; d0 += 32) {
        const bool two = d0 + 16 < D; /* head_dim % 32 == 16: the last slice is one vector */
        __m512i A[PFB], C[PFB];
        UNROLL for (int r = 0; r < PFB; r++) A[r] = C[r] = _mm512_setzero_si512();
        for (int part = 0; part < 2; part++) {
            if (part == 1)
                UNROLL for (int r = 0; r < PFB; r++) {
                    A[r] = _mm512_slli_epi32(A[r], 8);
                    C[r] = _mm512_slli_epi32(C[r], 8);
                }
            for (int tg = 0; tg < ng; tg++) {
                __m512i w0 = _mm512_loadu_si512(grp[tg] + 4 * (size_t)d0);
                __m512i w1 = two ? _mm512_loadu_si512(grp[tg] + 4 * (size_t)(d0 + 16)) : w0;
                UNROLL for (int r = 0; r < PFB; r++) {
                    __m512i pb = _mm512_set1_epi32(load32(&pq[part][r][4 * tg]));
                    DPBUSD(A[r], pb, w0);
                    if (two) DPBUSD(C[r], pb, w1);
                }
            }
        }
        UNROLL for (int r = 0; r < PFB; r++) {
            float *o = ob + (size_t)r * (size_t)D + (size_t)d0;
            __m512 s = _mm512_set1_ps(al[r]), st = _mm512_set1_ps(step[r]);
            _mm512_storeu_ps(o, _mm512_fmadd_ps(_mm512_cvtepi32_ps(A[r]), st, _mm512_mul_ps(_mm512_loadu_ps(o), s)));
            if (two)
                _mm512_storeu_ps(o + 16, _mm512_fmadd_ps(_mm512_cvtepi32_ps(C[r]), st, _mm512_mul_ps(_mm512_loadu_ps(o + 16), s)));
        }
    }
}

TGT static void pf_int8_block(kvp__pblock *b, int r0, int32_t pos0, int n, int masked) {
    __m512 a[PFB], c[PFB];
    float al[16] KVP__ALIGN64;
    pf_int8_logits(b, r0, a, c);
    pf_softmax(b, r0, pos0, n, masked, a, c, al);
    pf_int8_pv(b, r0, n, a, c, al);
}

/* The stages both AVX-512 tables share (all but the prefill blocks'). */
#define AVX512_STAGES                                                                              \
    {kprep_plain, kprep_plain, kprep_plain, kprep_plain, kprep_int8, kprep_int4},                 \
        {{klogits_tm_fp32, klogits_dm_fp32},                                                       \
         {klogits_tm_fp16, klogits_dm_fp16},                                                       \
         {klogits_tm_bf16, klogits_dm_bf16},                                                       \
         {klogits_tm_fp8, klogits_dm_fp8},                                                         \
         {klogits_int8, klogits_int8},                                                             \
         {klogits_int4, klogits_int4}},                                                            \
        softmax_avx512, {vacc_fp32, vacc_fp16, vacc_bf16, vacc_fp8, vacc_int8, vacc_int4},         \
        {NULL, NULL, NULL, NULL, vacc2_int8, vacc2_int4}, {NULL, NULL, NULL, NULL, NULL, vacc4_int4}
#define AVX512_PF_DECODERS                                                                         \
    {{pf_kdec_tm_fp32, pf_kdec_dm_fp32},                                                           \
     {pf_kdec_tm_fp16, pf_kdec_dm_fp16},                                                           \
     {pf_kdec_tm_bf16, pf_kdec_dm_bf16},                                                           \
     {pf_kdec_tm_fp8, pf_kdec_dm_fp8},                                                             \
     {pf_kdec_int8, pf_kdec_int8},                                                                 \
     {pf_kdec_int4, pf_kdec_int4}},                                                                \
        {pf_vdec_fp32, pf_vdec_fp16, pf_vdec_bf16, pf_vdec_fp8, pf_vdec_int8, pf_vdec_int4}

const kvp__kernels kvp__kernels_avx512 = {
    "avx512",
    AVX512_STAGES,
    pf_block_avx512,
    /* Which formats the blocks take, measured against the tiles' integer
     * dot products (prefill, chunk 512 over 8k, 2 threads, speed over fp16
     * blocks, two runs each): int8 as blocks 1.02 - 1.10x at page 16 and
     * 1.02 - 1.07x at page 32, as tiles 0.81 - 0.83x and 0.98 - 1.13x;
     * int4 as blocks 0.97 - 1.07x and 0.92 - 0.99x, as tiles 0.86 - 0.94x
     * and 1.32 - 1.71x. The tiles prepare the query per page: pages under
     * 32 tokens cost them twice. int4 keys or values at page 32 and more
     * keep the tiles. */
    ((1u << KVP_FORMAT_COUNT) - 1u) & ~(1u << KVP_FORMAT_INT4_V1), /* entries: int4 is int4_v1's */
    (1u << KVP_FORMAT_COUNT) - 1u,
    AVX512_PF_DECODERS,
    0,
    {NULL, NULL, NULL, NULL},
    NULL,
    NULL,
    pf_int8_block,
    pf_int8_rows,
    pf_int8_chunk,
};

const kvp__kernels kvp__kernels_avx512_bf16 = {
    "avx512-bf16",
    AVX512_STAGES,
    pf_block_avx512,
    /* every format: int4 multiplies in bf16 here, faster than the tiles */
    (1u << KVP_FORMAT_COUNT) - 1u,
    (1u << KVP_FORMAT_COUNT) - 1u,
    AVX512_PF_DECODERS,
    (1u << KVP_FORMAT_INT4_V1) | (1u << KVP_FORMAT_FP8_E4M3),
    {NULL, pf_block_bf16_k, pf_block_bf16_v, pf_block_bf16_kv},
    pf_qpack_bf16,
    pf_kvpack_bf16,
    pf_int8_block,
    pf_int8_rows,
    pf_int8_chunk,
};

#else
const kvp__kernels kvp__kernels_avx512 = {"avx512", {0}, {{0}}, NULL, {0}, {0}, {0}, NULL, 0, 0, {{0}}, {0},
                                          0,        {0}, NULL, NULL, NULL, NULL, NULL};
const kvp__kernels kvp__kernels_avx512_bf16 = {"avx512-bf16", {0}, {{0}}, NULL, {0}, {0}, {0}, NULL, 0, 0,
                                               {{0}},         {0}, 0,     {0},  NULL, NULL, NULL, NULL, NULL};
#endif
