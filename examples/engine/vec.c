#include "vec.h"

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

#define AXPY_BODY for (int i = 0; i < n; i++) y[i] += alpha * x[i];

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
#define HAVE_X86 1
#endif

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
