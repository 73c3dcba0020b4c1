#include "vec.h"

#include <math.h>

#include "quant.h"

#define LANES 16

/* The C bodies, compiled three times below. 16 independent partial sums
 * break the addition chain and map onto one zmm, two ymm or four xmm. */
#define DOT_BODY                                                 \
    float acc[LANES] = {0};                                      \
    int i = 0;                                                   \
    for (; i + LANES <= n; i += LANES)                           \
        for (int k = 0; k < LANES; k++) acc[k] += a[i + k] * b[i + k]; \
    float s = 0;                                                 \
    for (int k = 0; k < LANES; k++) s += acc[k];                 \
    for (; i < n; i++) s += a[i] * b[i];                         \
    return s;

#define AXPY_BODY                                                        \
    int i = 0;                                                           \
    for (; i + LANES <= n; i += LANES)                                   \
        for (int k = 0; k < LANES; k++) y[i + k] += alpha * x[i + k];    \
    for (; i < n; i++) y[i] += alpha * x[i];

/* Attention body: the dot product is DOT_BODY inlined by hand (a call per
 * key would cost more than the 64 multiply-adds). */
#define ATTEND_BODY                                                           \
    float mx = -INFINITY;                                                     \
    for (int j = 0; j < n; j++) {                                             \
        const float *a = q, *b = k + j * stride;                              \
        float acc[LANES] = {0}, s = 0;                                        \
        int i = 0;                                                            \
        for (; i + LANES <= hd; i += LANES)                                   \
            for (int l = 0; l < LANES; l++) acc[l] += a[i + l] * b[i + l];    \
        for (int l = 0; l < LANES; l++) s += acc[l];                          \
        for (; i < hd; i++) s += a[i] * b[i];                                 \
        scores[j] = s * scale;                                                \
        if (scores[j] > mx) mx = scores[j];                                   \
    }                                                                         \
    float sum = 0;                                                            \
    for (int j = 0; j < n; j++) sum += (scores[j] = expf(scores[j] - mx));    \
    for (int d = 0; d < hd; d++) out[d] = 0;                                  \
    for (int j = 0; j < n; j++) { /* fixed 16-wide chunks: SLP-vectorised */ \
        const float *restrict vj = v + j * stride;                            \
        const float p = scores[j];                                            \
        int d = 0;                                                            \
        for (; d + LANES <= hd; d += LANES)                                   \
            for (int l = 0; l < LANES; l++) out[d + l] += p * vj[d + l];      \
        for (; d < hd; d++) out[d] += p * vj[d];                              \
    }                                                                         \
    for (int d = 0; d < hd; d++) out[d] /= sum;

static void attend_portable(const float *q, const float *k, const float *v, long stride, int n, int hd,
                            float scale, float *restrict scores, float *restrict out) {
    ATTEND_BODY
}

static float dot_portable(const float *a, const float *b, int n) { DOT_BODY }
static void axpy_portable(float alpha, const float *x, float *y, int n) { AXPY_BODY }

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("avx2,fma"))) static float dot_avx2(const float *a, const float *b, int n) {
    DOT_BODY
}
__attribute__((target("avx2,fma"))) static void axpy_avx2(float alpha, const float *x, float *y, int n) {
    AXPY_BODY
}
__attribute__((target("avx512f,avx512vl,fma"))) static float dot_avx512(const float *a, const float *b,
                                                                         int n) {
    DOT_BODY
}
__attribute__((target("avx512f,avx512vl,fma"))) static void axpy_avx512(float alpha, const float *x,
                                                                        float *y, int n) {
    AXPY_BODY
}
__attribute__((target("avx2,fma"))) static void attend_avx2(const float *q, const float *k, const float *v,
                                                            long stride, int n, int hd, float scale,
                                                            float *restrict scores, float *restrict out) {
    ATTEND_BODY
}
__attribute__((target("avx512f,avx512vl,fma"))) static void attend_avx512(const float *q, const float *k,
                                                                          const float *v, long stride, int n,
                                                                          int hd, float scale, float *restrict scores, float *restrict out) {
    ATTEND_BODY
}
#define HAVE_X86 1
#endif

void vec_attend(const float *q, const float *k, const float *v, long stride, int n, int hd, float scale,
                float *restrict scores, float *restrict out) {
#ifdef HAVE_X86
    switch (qmat_isa()) {
    case ISA_AVX512: attend_avx512(q, k, v, stride, n, hd, scale, scores, out); return;
    case ISA_AVX2: attend_avx2(q, k, v, stride, n, hd, scale, scores, out); return;
    default: break;
    }
#endif
    attend_portable(q, k, v, stride, n, hd, scale, scores, out);
}

float vec_dot(const float *a, const float *b, int n) {
#ifdef HAVE_X86
    switch (qmat_isa()) {
    case ISA_AVX512: return dot_avx512(a, b, n);
    case ISA_AVX2: return dot_avx2(a, b, n);
    default: break;
    }
#endif
    return dot_portable(a, b, n);
}

void vec_axpy(float alpha, const float *x, float *y, int n) {
#ifdef HAVE_X86
    switch (qmat_isa()) {
    case ISA_AVX512: axpy_avx512(alpha, x, y, n); return;
    case ISA_AVX2: axpy_avx2(alpha, x, y, n); return;
    default: break;
    }
#endif
    axpy_portable(alpha, x, y, n);
}
