/*
 * Weight matrices in GGUF's formats and the matmul kernels that read them.
 *
 * Weights stay in the mapped file in their own format; kernels dequantize a
 * 32-weight block into registers and multiply it with up to 8 activation rows
 * at once, so a batch of T tokens streams each weight once per tile of 8
 * tokens from L1, and once from memory. Activations stay fp32 (no activation
 * quantization), so this engine is a clean fp32 reference over the file's
 * weights.
 *
 * Every (row, token) dot product is computed by the same code in the same
 * order whatever T, the tile a token falls in, or the thread that computes
 * it: batched and one-at-a-time decoding are bit-identical.
 */
#ifndef ENGINE_QUANT_H
#define ENGINE_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "pool.h"

typedef struct {
    const void *data; /* n_out rows of row_bytes */
    uint32_t type;    /* enum ggml_type: F32, F16, Q8_0 or Q4_1 */
    int64_t n_in;     /* elements per row (GGUF ne[0]) */
    int64_t n_out;    /* rows (GGUF ne[1]) */
    size_t row_bytes;
} qmat_t;

enum qmat_isa { ISA_PORTABLE = 0, ISA_AVX2 = 1, ISA_AVX512 = 2 };

float fp16_to_fp32(uint16_t h);
uint16_t fp32_to_fp16(float f); /* round to nearest even */

/* The ISA in use: the best the CPU supports, unless KVPAGE_ENGINE_ISA is
 * "portable", "avx2" or "avx512" (for comparing paths). */
int qmat_isa(void);
const char *qmat_isa_name(int isa);
/* Use `isa` from now on (clamped to what the CPU supports); returns the ISA
 * actually set. For tests. */
int qmat_set_isa(int isa);

/* Dequantize row `row` into out[n_in] (the embedding lookup). */
void qmat_row(const qmat_t *m, int64_t row, float *out);

/* For each matrix k: y[k][t*n_out_k + j] = sum_i x[t*n_in + i] * W_k[j][i],
 * t < T. All matrices share n_in. Rows of all matrices are split over the
 * pool's threads in one dispatch (e.g. Q, K and V together). */
void qmat_matmul(pool_t *pool, int n_mats, const qmat_t *const *w, const float *x, int T,
                 float *const *y);

#endif
