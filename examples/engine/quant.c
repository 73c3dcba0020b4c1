/*
 * Dequantize-on-the-fly matmul kernels: portable C, AVX2+FMA and AVX-512,
 * chosen at run time with __builtin_cpu_supports (the file is compiled for
 * the baseline ISA; only the functions marked with a target attribute use
 * wider instructions).
 */
#include "quant.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ENGINE_X86 1
#include <immintrin.h>
#endif

#define QK 32   /* weights per Q4_1 / Q8_0 block */
#define TILE 8  /* activation rows per kernel call */
#define ROW_BLOCK 64 /* weight rows reused from L1/L2 while a tile of tokens passes (64: 9% faster prefill than 16) */

typedef struct {
    uint16_t d, m;
    uint8_t qs[QK / 2]; /* element i in the low nibble of qs[i], i+16 in the high */
} block_q4_1;

typedef struct {
    uint16_t d;
    int8_t qs[QK];
} block_q8_0;

_Static_assert(sizeof(block_q4_1) == 20, "Q4_1 block is 20 bytes");
_Static_assert(sizeof(block_q8_0) == 34, "Q8_0 block is 34 bytes");

/* ---- fp16 ------------------------------------------------------------------ */

float fp16_to_fp32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13); /* inf / nan */
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else { /* subnormal: value is man * 2^-24 */
        float f = ldexpf((float)man, -24);
        return sign ? -f : f;
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t fp32_to_fp16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000, ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00); /* nan */
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00); /* rounds to inf */
    if (ax < 0x38800000u) { /* subnormal or zero in fp16: round man*2^-24 */
        float a;
        memcpy(&a, &ax, 4);
        return (uint16_t)(sign | (uint32_t)lrintf(a * 16777216.0f));
    }
    uint32_t r = ax + 0xfff + ((ax >> 13) & 1); /* round to nearest even */
    return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
}

/* ---- portable kernels -------------------------------------------------------- */

/* nr (1 or 2) weight rows, `stride` bytes apart, against tn <= TILE
 * activation rows: y[t*ldy + r] = row_r . x_t. */
typedef void (*tile_fn)(const uint8_t *row, size_t stride, int nr, int64_t n, const float *x, int64_t ldx,
                        int tn, float *y, int64_t ldy);

/* Kernels written for one row serve nr rows by looping. */
#define ROWS_WRAPPER(name, single)                                                              \
    static void name(const uint8_t *row, size_t stride, int nr, int64_t n, const float *x,      \
                     int64_t ldx, int tn, float *y, int64_t ldy) {                               \
        for (int r = 0; r < nr; r++) single(row + (size_t)r * stride, n, x, ldx, tn, y + r, ldy); \
    }

static void row_f32_portable(const uint8_t *row, int64_t n, const float *x, int64_t ldx, int tn,
                              float *y, int64_t ldy) {
    const float *w = (const float *)(const void *)row;
    for (int t = 0; t < tn; t++) {
        float s = 0;
        for (int64_t i = 0; i < n; i++) s += w[i] * x[t * ldx + i];
        y[t * ldy] = s;
    }
}

static void row_f16_portable(const uint8_t *row, int64_t n, const float *x, int64_t ldx, int tn,
                              float *y, int64_t ldy) {
    float acc[TILE] = {0};
    for (int64_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, row + 2 * i, 2);
        float w = fp16_to_fp32(h);
        for (int t = 0; t < tn; t++) acc[t] += w * x[t * ldx + i];
    }
    for (int t = 0; t < tn; t++) y[t * ldy] = acc[t];
}

static void row_q4_1_portable(const uint8_t *row, int64_t n, const float *x, int64_t ldx, int tn,
                               float *y, int64_t ldy) {
    float acc[TILE] = {0};
    for (int64_t b = 0; b < n / QK; b++) {
        block_q4_1 blk;
        memcpy(&blk, row + b * sizeof blk, sizeof blk);
        float d = fp16_to_fp32(blk.d), m = fp16_to_fp32(blk.m), w[QK];
        for (int i = 0; i < QK / 2; i++) {
            w[i] = (float)(blk.qs[i] & 15) * d + m;
            w[i + QK / 2] = (float)(blk.qs[i] >> 4) * d + m;
        }
        for (int t = 0; t < tn; t++) {
            const float *xb = x + t * ldx + b * QK;
            float s = 0;
            for (int i = 0; i < QK; i++) s += w[i] * xb[i];
            acc[t] += s;
        }
    }
    for (int t = 0; t < tn; t++) y[t * ldy] = acc[t];
}

static void row_q8_0_portable(const uint8_t *row, int64_t n, const float *x, int64_t ldx, int tn,
                               float *y, int64_t ldy) {
    float acc[TILE] = {0};
    for (int64_t b = 0; b < n / QK; b++) {
        block_q8_0 blk;
        memcpy(&blk, row + b * sizeof blk, sizeof blk);
        float d = fp16_to_fp32(blk.d);
        for (int t = 0; t < tn; t++) {
            const float *xb = x + t * ldx + b * QK;
            float s = 0;
            for (int i = 0; i < QK; i++) s += (float)blk.qs[i] * xb[i];
            acc[t] += s * d;
        }
    }
    for (int t = 0; t < tn; t++) y[t * ldy] = acc[t];
}

/* ---- AVX2 + FMA ------------------------------------------------------------------ */
#ifdef ENGINE_X86
#define AVX2_ATTR __attribute__((target("avx2,fma,f16c")))

AVX2_ATTR static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* The four 8-float quarters of a Q4_1 block, dequantized. */
AVX2_ATTR static inline void q4_1_dequant_avx2(const block_q4_1 *b, __m256 w[4]) {
    __m128i raw = _mm_loadu_si128((const __m128i *)(const void *)b->qs);
    __m128i lo = _mm_and_si128(raw, _mm_set1_epi8(15));
    __m128i hi = _mm_and_si128(_mm_srli_epi16(raw, 4), _mm_set1_epi8(15));
    __m256 d = _mm256_set1_ps(_cvtsh_ss(b->d)), m = _mm256_set1_ps(_cvtsh_ss(b->m));
    w[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo)), d, m);
    w[1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8))), d, m);
    w[2] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi)), d, m);
    w[3] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8))), d, m);
}

AVX2_ATTR static inline void q8_0_dequant_avx2(const block_q8_0 *b, __m256 w[4]) {
    __m256 d = _mm256_set1_ps(_cvtsh_ss(b->d));
    for (int k = 0; k < 4; k++) {
        __m128i raw = _mm_loadl_epi64((const __m128i *)(const void *)(b->qs + 8 * k));
        w[k] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(raw)), d);
    }
}

/* One weight row against tn <= 4 activation rows, one named accumulator pair
 * per token (tn is a constant after inlining, so they stay in registers). */
#define AVX2_TILE 4
#define EACH_T4(X) X(0) X(1) X(2) X(3)
#define DECL_ACC2(k) __m256 p##k = _mm256_setzero_ps(), q##k = _mm256_setzero_ps();
#define FMA_T2(k)                                                                      \
    if ((k) < tn) {                                                                    \
        const float *xb = x + (k) * ldx + b * QK;                                      \
        p##k = _mm256_fmadd_ps(w[0], _mm256_loadu_ps(xb), p##k);                       \
        q##k = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(xb + 8), q##k);                   \
        p##k = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(xb + 16), p##k);                  \
        q##k = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(xb + 24), q##k);                  \
    }
#define STORE_T2(k) \
    if ((k) < tn) y[(k) * ldy] = hsum256(_mm256_add_ps(p##k, q##k));

static inline __attribute__((always_inline, target("avx2,fma,f16c"))) void
blocks_avx2(const uint8_t *row, int64_t n, const float *x, int64_t ldx, const int tn, float *y, int64_t ldy,
            const int is_q4) {
    EACH_T4(DECL_ACC2)
    const size_t bsz = is_q4 ? sizeof(block_q4_1) : sizeof(block_q8_0);
    for (int64_t b = 0; b < n / QK; b++) {
        __m256 w[4];
        if (is_q4) q4_1_dequant_avx2((const block_q4_1 *)(const void *)(row + b * bsz), w);
        else q8_0_dequant_avx2((const block_q8_0 *)(const void *)(row + b * bsz), w);
        EACH_T4(FMA_T2)
    }
    EACH_T4(STORE_T2)
}

AVX2_ATTR static void tile_blocks_avx2(const uint8_t *row, int64_t n, const float *x, int64_t ldx, int tn,
                                       float *y, int64_t ldy, int is_q4) {
    switch (tn * 2 + is_q4) {
    case 2: blocks_avx2(row, n, x, ldx, 1, y, ldy, 0); break;
    case 3: blocks_avx2(row, n, x, ldx, 1, y, ldy, 1); break;
    case 4: blocks_avx2(row, n, x, ldx, 2, y, ldy, 0); break;
    case 5: blocks_avx2(row, n, x, ldx, 2, y, ldy, 1); break;
    case 6: blocks_avx2(row, n, x, ldx, 3, y, ldy, 0); break;
    case 7: blocks_avx2(row, n, x, ldx, 3, y, ldy, 1); break;
    case 8: blocks_avx2(row, n, x, ldx, 4, y, ldy, 0); break;
    case 9: blocks_avx2(row, n, x, ldx, 4, y, ldy, 1); break;
    default: break;
    }
}

AVX2_ATTR static void row_q4_1_avx2(const uint8_t *row, int64_t n, const float *x, int64_t ldx,
                                    int tn, float *y, int64_t ldy) {
    for (int t0 = 0; t0 < tn; t0 += AVX2_TILE) {
        int k = tn - t0 < AVX2_TILE ? tn - t0 : AVX2_TILE;
        tile_blocks_avx2(row, n, x + t0 * ldx, ldx, k, y + t0 * ldy, ldy, 1);
    }
}

AVX2_ATTR static void row_q8_0_avx2(const uint8_t *row, int64_t n, const float *x, int64_t ldx,
                                    int tn, float *y, int64_t ldy) {
    for (int t0 = 0; t0 < tn; t0 += AVX2_TILE) {
        int k = tn - t0 < AVX2_TILE ? tn - t0 : AVX2_TILE;
        tile_blocks_avx2(row, n, x + t0 * ldx, ldx, k, y + t0 * ldy, ldy, 0);
    }
}

/* Plain-float rows (F32, F16) are rare in llama files (norms are vectors);
 * one AVX2 kernel each, used by the AVX-512 path too. n % 8 == 0 assumed by
 * the vector loop, with a scalar tail. */
AVX2_ATTR static void row_f32_avx2(const uint8_t *row, int64_t n, const float *x, int64_t ldx,
                                    int tn, float *y, int64_t ldy) {
    const float *w = (const float *)(const void *)row;
    for (int t = 0; t < tn; t++) {
        __m256 acc = _mm256_setzero_ps();
        int64_t i = 0;
        for (; i + 8 <= n; i += 8)
            acc = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + t * ldx + i), acc);
        float s = hsum256(acc);
        for (; i < n; i++) s += w[i] * x[t * ldx + i];
        y[t * ldy] = s;
    }
}

AVX2_ATTR static void row_f16_avx2(const uint8_t *row, int64_t n, const float *x, int64_t ldx,
                                    int tn, float *y, int64_t ldy) {
    for (int t = 0; t < tn; t++) {
        __m256 acc = _mm256_setzero_ps();
        int64_t i = 0;
        for (; i + 8 <= n; i += 8) {
            __m256 w = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(row + 2 * i)));
            acc = _mm256_fmadd_ps(w, _mm256_loadu_ps(x + t * ldx + i), acc);
        }
        float s = hsum256(acc);
        for (; i < n; i++) {
            uint16_t h;
            memcpy(&h, row + 2 * i, 2);
            s += fp16_to_fp32(h) * x[t * ldx + i];
        }
        y[t * ldy] = s;
    }
}

/* ---- AVX-512 ------------------------------------------------------------------------ */
#define AVX512_ATTR __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#define AVX512_INLINE static inline __attribute__((always_inline, target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

/* The kernels below keep one accumulator per (row, token) in a named
 * variable, for 2 rows x up to 8 tokens: with tn and nr constant after
 * inlining, dead cases fold away and all 16 accumulators stay in registers
 * (an indexed array would be spilled). Each x load feeds 2 rows' FMAs. */
#define EACH_T(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
#define DECL_ACC(k) __m512 a0_##k = _mm512_setzero_ps(), a1_##k = _mm512_setzero_ps();
#define FMA_T(k)                                                                  \
    if ((k) < tn) {                                                               \
        const float *xb = x + (k) * ldx + b * QK;                                 \
        __m512 xl = _mm512_loadu_ps(xb), xh = _mm512_loadu_ps(xb + 16);           \
        a0_##k = _mm512_fmadd_ps(w0h, xh, _mm512_fmadd_ps(w0l, xl, a0_##k));      \
        if (nr == 2) a1_##k = _mm512_fmadd_ps(w1h, xh, _mm512_fmadd_ps(w1l, xl, a1_##k)); \
    }
#define STORE_T(k)                                                                \
    if ((k) < tn) {                                                               \
        y[(k) * ldy] = _mm512_reduce_add_ps(a0_##k);                              \
        if (nr == 2) y[(k) * ldy + 1] = _mm512_reduce_add_ps(a1_##k);             \
    }

AVX512_INLINE void q4_1_dequant_512(const block_q4_1 *b, __m512 *lo, __m512 *hi) {
    __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)b->qs));
    __m512 d = _mm512_set1_ps(_cvtsh_ss(b->d)), m = _mm512_set1_ps(_cvtsh_ss(b->m));
    *lo = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_and_si512(v, _mm512_set1_epi32(15))), d, m);
    *hi = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4)), d, m);
}

AVX512_INLINE void q8_0_dequant_512(const block_q8_0 *b, __m512 *lo, __m512 *hi) {
    __m512 d = _mm512_set1_ps(_cvtsh_ss(b->d));
    __m512i q0 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(const void *)b->qs));
    __m512i q1 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(b->qs + 16)));
    *lo = _mm512_mul_ps(_mm512_cvtepi32_ps(q0), d);
    *hi = _mm512_mul_ps(_mm512_cvtepi32_ps(q1), d);
}

AVX512_INLINE void q4_1_rows_512(const uint8_t *row, size_t stride, const int nr, int64_t n, const float *x,
                                 int64_t ldx, const int tn, float *y, int64_t ldy) {
    EACH_T(DECL_ACC)
    const block_q4_1 *r0 = (const block_q4_1 *)(const void *)row;
    const block_q4_1 *r1 = (const block_q4_1 *)(const void *)(row + stride);
    for (int64_t b = 0; b < n / QK; b++) {
        __m512 w0l, w0h, w1l = _mm512_setzero_ps(), w1h = _mm512_setzero_ps();
        q4_1_dequant_512(&r0[b], &w0l, &w0h);
        if (nr == 2) q4_1_dequant_512(&r1[b], &w1l, &w1h);
        EACH_T(FMA_T)
    }
    EACH_T(STORE_T)
}

AVX512_INLINE void q8_0_rows_512(const uint8_t *row, size_t stride, const int nr, int64_t n, const float *x,
                                 int64_t ldx, const int tn, float *y, int64_t ldy) {
    EACH_T(DECL_ACC)
    const block_q8_0 *r0 = (const block_q8_0 *)(const void *)row;
    const block_q8_0 *r1 = (const block_q8_0 *)(const void *)(row + stride);
    for (int64_t b = 0; b < n / QK; b++) {
        __m512 w0l, w0h, w1l = _mm512_setzero_ps(), w1h = _mm512_setzero_ps();
        q8_0_dequant_512(&r0[b], &w0l, &w0h);
        if (nr == 2) q8_0_dequant_512(&r1[b], &w1l, &w1h);
        EACH_T(FMA_T)
    }
    EACH_T(STORE_T)
}

/* Instantiate every (nr, tn) with constants, so each copy is specialised. */
#define CASES_TN(fn, NR)                                                                     \
    case NR * 16 + 1: fn(row, stride, NR, n, x, ldx, 1, y, ldy); break;                     \
    case NR * 16 + 2: fn(row, stride, NR, n, x, ldx, 2, y, ldy); break;                     \
    case NR * 16 + 3: fn(row, stride, NR, n, x, ldx, 3, y, ldy); break;                     \
    case NR * 16 + 4: fn(row, stride, NR, n, x, ldx, 4, y, ldy); break;                     \
    case NR * 16 + 5: fn(row, stride, NR, n, x, ldx, 5, y, ldy); break;                     \
    case NR * 16 + 6: fn(row, stride, NR, n, x, ldx, 6, y, ldy); break;                     \
    case NR * 16 + 7: fn(row, stride, NR, n, x, ldx, 7, y, ldy); break;                     \
    case NR * 16 + 8: fn(row, stride, NR, n, x, ldx, 8, y, ldy); break;

AVX512_ATTR static void tile_q4_1_avx512(const uint8_t *row, size_t stride, int nr, int64_t n, const float *x,
                                         int64_t ldx, int tn, float *y, int64_t ldy) {
    switch (nr * 16 + tn) {
        CASES_TN(q4_1_rows_512, 1)
        CASES_TN(q4_1_rows_512, 2)
    default: break;
    }
}

AVX512_ATTR static void tile_q8_0_avx512(const uint8_t *row, size_t stride, int nr, int64_t n, const float *x,
                                         int64_t ldx, int tn, float *y, int64_t ldy) {
    switch (nr * 16 + tn) {
        CASES_TN(q8_0_rows_512, 1)
        CASES_TN(q8_0_rows_512, 2)
    default: break;
    }
}
/* ---- AVX-512 prefill: row blocks dequantized once, then an fp32 kernel ------------
 *
 * With many tokens (prefill), dequantizing a 32-weight block for every tile
 * of 8 tokens costs about a third of the FP work. Here a block of rows is
 * dequantized once into fp32 (on the thread's stack) and reused by every
 * tile of tokens; the kernel keeps 4 rows x 6 tokens of accumulators.
 * Bit-identical to the kernels above: the weights are dequantized by the
 * same instructions, and each (row, token) accumulator takes the same FMAs
 * in the same order (16-wide halves of each block, low then high), then the
 * same horizontal sum. So prefill, chunked prefill and decode still agree to
 * the bit. */
#define PANEL_MIN_T 16      /* tokens from which a matmul takes this path */
#define PANEL_FLOATS 32768  /* dequantized weights per thread: 128 KiB of stack */
#define PR 4                /* rows per kernel call */
#define PT 6                /* tokens per kernel call */

#define P_EACH_T(X, r) X(r, 0) X(r, 1) X(r, 2) X(r, 3) X(r, 4) X(r, 5)
#define P_EACH(X) P_EACH_T(X, 0) P_EACH_T(X, 1) P_EACH_T(X, 2) P_EACH_T(X, 3)
#define P_DECL(r, t) __m512 c##r##_##t = _mm512_setzero_ps();
#define P_STORE(r, t) \
    if ((r) < nr && (t) < tn) y[(t) * ldy + (r)] = _mm512_reduce_add_ps(c##r##_##t);
#define P_TOKEN(t)                                                              \
    if ((t) < tn) {                                                             \
        __m512 xv = _mm512_loadu_ps(x + (t) * ldx + k);                         \
        c0_##t = _mm512_fmadd_ps(w0, xv, c0_##t);                               \
        if (nr > 1) c1_##t = _mm512_fmadd_ps(w1, xv, c1_##t);                   \
        if (nr > 2) c2_##t = _mm512_fmadd_ps(w2, xv, c2_##t);                   \
        if (nr > 3) c3_##t = _mm512_fmadd_ps(w3, xv, c3_##t);                   \
    }

/* nr <= 4 rows of fp32 weights (ldw apart) against tn <= 6 tokens. */
AVX512_INLINE void panel_512(const float *w, int64_t ldw, const int nr, int64_t n, const float *x, int64_t ldx,
                             const int tn, float *y, int64_t ldy) {
    P_EACH(P_DECL)
    for (int64_t k = 0; k < n; k += 16) {
        __m512 w0 = _mm512_loadu_ps(w + k), w1 = w0, w2 = w0, w3 = w0;
        if (nr > 1) w1 = _mm512_loadu_ps(w + ldw + k);
        if (nr > 2) w2 = _mm512_loadu_ps(w + 2 * ldw + k);
        if (nr > 3) w3 = _mm512_loadu_ps(w + 3 * ldw + k);
        P_TOKEN(0) P_TOKEN(1) P_TOKEN(2) P_TOKEN(3) P_TOKEN(4) P_TOKEN(5)
    }
    P_EACH(P_STORE)
}

#define P_CASES_TN(NR)                                                                 \
    case NR * 8 + 1: panel_512(w, ldw, NR, n, x, ldx, 1, y, ldy); break;               \
    case NR * 8 + 2: panel_512(w, ldw, NR, n, x, ldx, 2, y, ldy); break;               \
    case NR * 8 + 3: panel_512(w, ldw, NR, n, x, ldx, 3, y, ldy); break;               \
    case NR * 8 + 4: panel_512(w, ldw, NR, n, x, ldx, 4, y, ldy); break;               \
    case NR * 8 + 5: panel_512(w, ldw, NR, n, x, ldx, 5, y, ldy); break;               \
    case NR * 8 + 6: panel_512(w, ldw, NR, n, x, ldx, 6, y, ldy); break;

AVX512_ATTR static void panel_tile_512(const float *w, int64_t ldw, int nr, int64_t n, const float *x,
                                       int64_t ldx, int tn, float *y, int64_t ldy) {
    switch (nr * 8 + tn) {
        P_CASES_TN(1)
        P_CASES_TN(2)
        P_CASES_TN(3)
        P_CASES_TN(4)
    default: break;
    }
}

/* Rows r0 .. r0+nr-1 of a Q4_1 or Q8_0 matrix into dst[nr][n_in]. */
AVX512_ATTR static void dequant_rows_512(const qmat_t *m, long r0, long nr, float *dst) {
    const int64_t nb = m->n_in / QK;
    for (long r = 0; r < nr; r++) {
        const uint8_t *row = (const uint8_t *)m->data + (size_t)(r0 + r) * m->row_bytes;
        float *d = dst + r * m->n_in;
        for (int64_t b = 0; b < nb; b++) {
            __m512 lo, hi;
            if (m->type == GGML_Q4_1) q4_1_dequant_512((const block_q4_1 *)(const void *)row + b, &lo, &hi);
            else q8_0_dequant_512((const block_q8_0 *)(const void *)row + b, &lo, &hi);
            _mm512_storeu_ps(d + b * QK, lo);
            _mm512_storeu_ps(d + b * QK + 16, hi);
        }
    }
}

static int panel_fits(const qmat_t *m, int T) {
    return T >= PANEL_MIN_T && (m->type == GGML_Q4_1 || m->type == GGML_Q8_0) &&
           m->n_in * PR <= PANEL_FLOATS;
}

/* Rows [lo, hi) against all T tokens. */
AVX512_ATTR static void matmul_rows_panel_512(const qmat_t *m, float *y, const float *x, int T, long lo,
                                              long hi) {
    float buf[PANEL_FLOATS];
    long rb = (long)(PANEL_FLOATS / m->n_in);
    if (rb > ROW_BLOCK) rb = ROW_BLOCK;
    rb -= rb % PR;
    for (long r0 = lo; r0 < hi; r0 += rb) {
        long r1 = r0 + rb < hi ? r0 + rb : hi;
        dequant_rows_512(m, r0, r1 - r0, buf);
        for (int t0 = 0; t0 < T; t0 += PT) {
            int tn = T - t0 < PT ? T - t0 : PT;
            for (long r = r0; r < r1; r += PR) {
                int nr = r1 - r < PR ? (int)(r1 - r) : PR;
                panel_tile_512(buf + (r - r0) * m->n_in, m->n_in, nr, m->n_in, x + (size_t)t0 * m->n_in,
                               m->n_in, tn, y + (size_t)t0 * m->n_out + r, m->n_out);
            }
        }
    }
}
#endif /* ENGINE_X86 */

ROWS_WRAPPER(tile_f32_portable, row_f32_portable)
ROWS_WRAPPER(tile_f16_portable, row_f16_portable)
ROWS_WRAPPER(tile_q4_1_portable, row_q4_1_portable)
ROWS_WRAPPER(tile_q8_0_portable, row_q8_0_portable)
#ifdef ENGINE_X86
ROWS_WRAPPER(tile_f32_avx2, row_f32_avx2)
ROWS_WRAPPER(tile_f16_avx2, row_f16_avx2)
ROWS_WRAPPER(tile_q4_1_avx2, row_q4_1_avx2)
ROWS_WRAPPER(tile_q8_0_avx2, row_q8_0_avx2)
#endif

/* ---- dispatch ------------------------------------------------------------------------- */

#include <stdatomic.h>

/* Set once (first use, or a test), read by every kernel call on any thread. */
static atomic_int g_isa = -1;

static int cpu_best_isa(void) {
#ifdef ENGINE_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma"))
        return ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return ISA_AVX2;
#endif
    return ISA_PORTABLE;
}

int qmat_set_isa(int isa) {
    int best = cpu_best_isa();
    int v = isa < 0 ? best : (isa > best ? best : isa);
    atomic_store(&g_isa, v);
    return v;
}

int qmat_isa(void) {
    int v = atomic_load_explicit(&g_isa, memory_order_relaxed);
    if (v >= 0) return v;
    const char *env = getenv("KVPAGE_ENGINE_ISA");
    int want = -1;
    if (env && !strcmp(env, "portable")) want = ISA_PORTABLE;
    else if (env && !strcmp(env, "avx2")) want = ISA_AVX2;
    else if (env && !strcmp(env, "avx512")) want = ISA_AVX512;
    return qmat_set_isa(want); /* racing first calls all store the same value */
}

const char *qmat_isa_name(int isa) {
    return isa == ISA_AVX512 ? "avx512" : isa == ISA_AVX2 ? "avx2" : "portable";
}

static tile_fn pick_tile(uint32_t type) {
    int isa = qmat_isa();
#ifdef ENGINE_X86
    if (isa == ISA_AVX512 && type == GGML_Q4_1) return tile_q4_1_avx512;
    if (isa == ISA_AVX512 && type == GGML_Q8_0) return tile_q8_0_avx512;
    if (isa >= ISA_AVX2) {
        switch (type) {
        case GGML_Q4_1: return tile_q4_1_avx2;
        case GGML_Q8_0: return tile_q8_0_avx2;
        case GGML_F16: return tile_f16_avx2;
        case GGML_F32: return tile_f32_avx2;
        default: break;
        }
    }
#else
    (void)isa;
#endif
    switch (type) {
    case GGML_Q4_1: return tile_q4_1_portable;
    case GGML_Q8_0: return tile_q8_0_portable;
    case GGML_F16: return tile_f16_portable;
    case GGML_F32: return tile_f32_portable;
    default: return NULL; /* gguf_open refuses other types */
    }
}

void qmat_row(const qmat_t *m, int64_t row, float *out) {
    const uint8_t *r = (const uint8_t *)m->data + (size_t)row * m->row_bytes;
    switch (m->type) {
    case GGML_F32: memcpy(out, r, (size_t)m->n_in * 4); break;
    case GGML_F16:
        for (int64_t i = 0; i < m->n_in; i++) {
            uint16_t h;
            memcpy(&h, r + 2 * i, 2);
            out[i] = fp16_to_fp32(h);
        }
        break;
    case GGML_Q8_0:
        for (int64_t b = 0; b < m->n_in / QK; b++) {
            block_q8_0 blk;
            memcpy(&blk, r + b * sizeof blk, sizeof blk);
            float d = fp16_to_fp32(blk.d);
            for (int i = 0; i < QK; i++) out[b * QK + i] = (float)blk.qs[i] * d;
        }
        break;
    case GGML_Q4_1:
        for (int64_t b = 0; b < m->n_in / QK; b++) {
            block_q4_1 blk;
            memcpy(&blk, r + b * sizeof blk, sizeof blk);
            float d = fp16_to_fp32(blk.d), mn = fp16_to_fp32(blk.m);
            for (int i = 0; i < QK / 2; i++) {
                out[b * QK + i] = (float)(blk.qs[i] & 15) * d + mn;
                out[b * QK + i + QK / 2] = (float)(blk.qs[i] >> 4) * d + mn;
            }
        }
        break;
    default: memset(out, 0, (size_t)m->n_in * 4); break;
    }
}

typedef struct {
    int n_mats;
    const qmat_t *const *w;
    float *const *y;
    const float *x;
    int T;
    long total_rows;
} matmul_job;

/* Rows [lo, hi) of matrix k, every token, ROW_BLOCK rows at a time. */
static void matmul_rows(const qmat_t *w, float *y, const float *x, int T, long lo, long hi) {
#ifdef ENGINE_X86
    if (qmat_isa() == ISA_AVX512 && panel_fits(w, T)) {
        matmul_rows_panel_512(w, y, x, T, lo, hi);
        return;
    }
#endif
    tile_fn fn = pick_tile(w->type);
    for (long r0 = lo; r0 < hi; r0 += ROW_BLOCK) {
        long r1 = r0 + ROW_BLOCK < hi ? r0 + ROW_BLOCK : hi;
        for (int t0 = 0; t0 < T; t0 += TILE) {
            int tn = T - t0 < TILE ? T - t0 : TILE;
            for (long r = r0; r < r1; r += 2) {
                int nr = r + 1 < r1 ? 2 : 1;
                fn((const uint8_t *)w->data + (size_t)r * w->row_bytes, w->row_bytes, nr, w->n_in,
                   x + (size_t)t0 * w->n_in, w->n_in, tn, y + (size_t)t0 * w->n_out + r, w->n_out);
            }
        }
    }
}

/* Chunk c is rows [c*ROW_CHUNK, (c+1)*ROW_CHUNK) of the matrices' rows laid
 * end to end (a chunk may span two matrices). */
#define ROW_CHUNK 64
static void matmul_chunk(void *arg, long chunk, int tid) {
    (void)tid;
    const matmul_job *j = arg;
    long lo = chunk * ROW_CHUNK, hi = lo + ROW_CHUNK < j->total_rows ? lo + ROW_CHUNK : j->total_rows;
    long base = 0;
    for (int k = 0; k < j->n_mats && lo < hi; k++) {
        long n = (long)j->w[k]->n_out;
        long a = lo > base ? lo - base : 0, b = hi - base < n ? hi - base : n;
        if (a < b) matmul_rows(j->w[k], j->y[k], j->x, j->T, a, b);
        base += n;
    }
}

void qmat_matmul(pool_t *pool, int n_mats, const qmat_t *const *w, const float *x, int T,
                 float *const *y) {
    matmul_job j = {n_mats, w, y, x, T, 0};
    for (int k = 0; k < n_mats; k++) j.total_rows += (long)w[k]->n_out;
    pool_run(pool, matmul_chunk, &j, (j.total_rows + ROW_CHUNK - 1) / ROW_CHUNK);
}
