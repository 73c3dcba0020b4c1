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
#define ROW_BLOCK 16 /* weight rows kept in L1 while a tile of tokens passes */

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

typedef void (*tile_fn)(const uint8_t *row, int64_t n, const float *x, int64_t ldx, int tn,
                        float *y, int64_t ldy);

static void tile_f32_portable(const uint8_t *row, int64_t n, const float *x, int64_t ldx, int tn,
                              float *y, int64_t ldy) {
    const float *w = (const float *)(const void *)row;
    for (int t = 0; t < tn; t++) {
        float s = 0;
        for (int64_t i = 0; i < n; i++) s += w[i] * x[t * ldx + i];
        y[t * ldy] = s;
    }
}

static void tile_f16_portable(const uint8_t *row, int64_t n, const float *x, int64_t ldx, int tn,
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

static void tile_q4_1_portable(const uint8_t *row, int64_t n, const float *x, int64_t ldx, int tn,
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

static void tile_q8_0_portable(const uint8_t *row, int64_t n, const float *x, int64_t ldx, int tn,
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

/* One weight row against tn <= 4 activation rows (16 ymm registers: 4
 * weights, 8 accumulators, loads). */
#define AVX2_TILE 4
AVX2_ATTR static void tile_blocks_avx2(const uint8_t *row, int64_t n, const float *x, int64_t ldx,
                                       int tn, float *y, int64_t ldy, int is_q4) {
    __m256 acc[AVX2_TILE][2];
    for (int t = 0; t < AVX2_TILE; t++) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
    const size_t bsz = is_q4 ? sizeof(block_q4_1) : sizeof(block_q8_0);
    for (int64_t b = 0; b < n / QK; b++) {
        __m256 w[4];
        if (is_q4) q4_1_dequant_avx2((const block_q4_1 *)(const void *)(row + b * bsz), w);
        else q8_0_dequant_avx2((const block_q8_0 *)(const void *)(row + b * bsz), w);
        for (int t = 0; t < tn; t++) {
            const float *xb = x + t * ldx + b * QK;
            acc[t][0] = _mm256_fmadd_ps(w[0], _mm256_loadu_ps(xb), acc[t][0]);
            acc[t][1] = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(xb + 8), acc[t][1]);
            acc[t][0] = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(xb + 16), acc[t][0]);
            acc[t][1] = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(xb + 24), acc[t][1]);
        }
    }
    for (int t = 0; t < tn; t++) y[t * ldy] = hsum256(_mm256_add_ps(acc[t][0], acc[t][1]));
}

AVX2_ATTR static void tile_q4_1_avx2(const uint8_t *row, int64_t n, const float *x, int64_t ldx,
                                     int tn, float *y, int64_t ldy) {
    for (int t0 = 0; t0 < tn; t0 += AVX2_TILE) {
        int k = tn - t0 < AVX2_TILE ? tn - t0 : AVX2_TILE;
        tile_blocks_avx2(row, n, x + t0 * ldx, ldx, k, y + t0 * ldy, ldy, 1);
    }
}

AVX2_ATTR static void tile_q8_0_avx2(const uint8_t *row, int64_t n, const float *x, int64_t ldx,
                                     int tn, float *y, int64_t ldy) {
    for (int t0 = 0; t0 < tn; t0 += AVX2_TILE) {
        int k = tn - t0 < AVX2_TILE ? tn - t0 : AVX2_TILE;
        tile_blocks_avx2(row, n, x + t0 * ldx, ldx, k, y + t0 * ldy, ldy, 0);
    }
}

/* Plain-float rows (F32, F16) are rare in llama files (norms are vectors);
 * one AVX2 kernel each, used by the AVX-512 path too. n % 8 == 0 assumed by
 * the vector loop, with a scalar tail. */
AVX2_ATTR static void tile_f32_avx2(const uint8_t *row, int64_t n, const float *x, int64_t ldx,
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

AVX2_ATTR static void tile_f16_avx2(const uint8_t *row, int64_t n, const float *x, int64_t ldx,
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

/* One weight row against tn <= 8 activation rows: 16 accumulators (two per
 * token, so consecutive FMAs of one token do not wait on each other). */
AVX512_ATTR static void tile_q4_1_avx512(const uint8_t *row, int64_t n, const float *x, int64_t ldx,
                                         int tn, float *y, int64_t ldy) {
    __m512 acc[TILE][2];
    for (int t = 0; t < TILE; t++) acc[t][0] = acc[t][1] = _mm512_setzero_ps();
    const __m512i mask = _mm512_set1_epi32(15);
    const block_q4_1 *blk = (const block_q4_1 *)(const void *)row;
    for (int64_t b = 0; b < n / QK; b++) {
        __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)blk[b].qs));
        __m512 d = _mm512_set1_ps(_cvtsh_ss(blk[b].d)), m = _mm512_set1_ps(_cvtsh_ss(blk[b].m));
        __m512 wl = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_and_si512(v, mask)), d, m);
        __m512 wh = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4)), d, m);
        for (int t = 0; t < tn; t++) {
            const float *xb = x + t * ldx + b * QK;
            acc[t][0] = _mm512_fmadd_ps(wl, _mm512_loadu_ps(xb), acc[t][0]);
            acc[t][1] = _mm512_fmadd_ps(wh, _mm512_loadu_ps(xb + 16), acc[t][1]);
        }
    }
    for (int t = 0; t < tn; t++) y[t * ldy] = _mm512_reduce_add_ps(_mm512_add_ps(acc[t][0], acc[t][1]));
}

AVX512_ATTR static void tile_q8_0_avx512(const uint8_t *row, int64_t n, const float *x, int64_t ldx,
                                         int tn, float *y, int64_t ldy) {
    __m512 acc[TILE][2];
    for (int t = 0; t < TILE; t++) acc[t][0] = acc[t][1] = _mm512_setzero_ps();
    const block_q8_0 *blk = (const block_q8_0 *)(const void *)row;
    for (int64_t b = 0; b < n / QK; b++) {
        __m512 d = _mm512_set1_ps(_cvtsh_ss(blk[b].d));
        __m512i q0 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(const void *)blk[b].qs));
        __m512i q1 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(blk[b].qs + 16)));
        __m512 w0 = _mm512_mul_ps(_mm512_cvtepi32_ps(q0), d);
        __m512 w1 = _mm512_mul_ps(_mm512_cvtepi32_ps(q1), d);
        for (int t = 0; t < tn; t++) {
            const float *xb = x + t * ldx + b * QK;
            acc[t][0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xb), acc[t][0]);
            acc[t][1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xb + 16), acc[t][1]);
        }
    }
    for (int t = 0; t < tn; t++) y[t * ldy] = _mm512_reduce_add_ps(_mm512_add_ps(acc[t][0], acc[t][1]));
}
#endif /* ENGINE_X86 */

/* ---- dispatch ------------------------------------------------------------------------- */

static int g_isa = -1;

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
    g_isa = isa < 0 ? best : (isa > best ? best : isa);
    return g_isa;
}

int qmat_isa(void) {
    if (g_isa < 0) {
        const char *env = getenv("KVPAGE_ENGINE_ISA");
        int want = -1;
        if (env && !strcmp(env, "portable")) want = ISA_PORTABLE;
        else if (env && !strcmp(env, "avx2")) want = ISA_AVX2;
        else if (env && !strcmp(env, "avx512")) want = ISA_AVX512;
        qmat_set_isa(want);
    }
    return g_isa;
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
    tile_fn fn = pick_tile(w->type);
    for (long r0 = lo; r0 < hi; r0 += ROW_BLOCK) {
        long r1 = r0 + ROW_BLOCK < hi ? r0 + ROW_BLOCK : hi;
        for (int t0 = 0; t0 < T; t0 += TILE) {
            int tn = T - t0 < TILE ? T - t0 : TILE;
            for (long r = r0; r < r1; r++)
                fn((const uint8_t *)w->data + (size_t)r * w->row_bytes, w->n_in, x + (size_t)t0 * w->n_in,
                   w->n_in, tn, y + (size_t)t0 * w->n_out + r, w->n_out);
        }
    }
}

/* Thread tid takes a contiguous share of the concatenated rows of all matrices. */
static void matmul_worker(void *arg, int tid, int nthreads) {
    const matmul_job *j = arg;
    long lo, hi;
    pool_split(j->total_rows, ROW_BLOCK, tid, nthreads, &lo, &hi);
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
    pool_run(pool, matmul_worker, &j);
}
