/*
 * Small fp32 vector helpers for the attention and norms, with AVX-512/AVX2
 * builds of the same C code chosen with the matmul kernels' ISA. The order of
 * summation is fixed per ISA, so results do not depend on the batch.
 */
#ifndef ENGINE_VEC_H
#define ENGINE_VEC_H

/* sum a[i]*b[i], 16 partial sums (n a multiple of 16 is fastest). */
float vec_dot(const float *a, const float *b, int n);
/* y[i] += a * x[i] */
void vec_axpy(float a, const float *x, float *y, int n);

/* Causal attention of one query head over n keys/values (rows `stride`
 * floats apart): exact softmax (max subtracted, two passes) of q.k*scale,
 * then the weighted sum of the values into out[hd]. scores: n floats. */
void vec_attend(const float *q, const float *k, const float *v, long stride, int n, int hd, float scale,
                float *scores, float *out);

#endif
