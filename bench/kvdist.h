/*
 * The K/V/Q distribution every accuracy figure uses, defined once for the
 * tests and the benchmark:
 *   keys    N(0,1), with 4 of every 128 channels scaled x10, plus a
 *           per-channel offset N(0,1) (outlier channels and offsets, as in
 *           KIVI / KVQuant);
 *   values  N(0,1);
 *   queries N(0,1);
 *   softmax scale chosen so the logits q.k * scale have standard deviation 2.
 * Plus the float64 reference attention the kernels are measured against.
 * Header-only (static functions): each program includes it once.
 */
#ifndef KVPAGE_KVDIST_H
#define KVPAGE_KVDIST_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

typedef struct {
    uint64_t s[4];
} kvd_rng;

static inline uint64_t kvd_rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static inline uint64_t kvd_next(kvd_rng *r) { /* xoshiro256** */
    uint64_t *s = r->s, out = kvd_rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = kvd_rotl(s[3], 45);
    return out;
}

static inline void kvd_seed(kvd_rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) { /* splitmix64 */
        uint64_t z = (seed += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        r->s[i] = z ^ (z >> 31);
    }
}

/* Uniform in (0, 1). */
static inline double kvd_uniform(kvd_rng *r) {
    return ((double)(kvd_next(r) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

static inline double kvd_normal(kvd_rng *r) {
    double u = kvd_uniform(r), v = kvd_uniform(r);
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

#define KVD_OUTLIERS_PER_128 4
#define KVD_OUTLIER_SCALE 10.0
#define KVD_LOGIT_STD 2.0

/* Per (kv head, channel) key statistics: scale 1 or 10, offset N(0,1). */
typedef struct {
    int heads, head_dim;
    double *scale, *offset; /* [heads][head_dim] */
} kvd_keys;

/* Draw key statistics: in every 128 channels of every head, 4 distinct
 * channels chosen at random are outliers. Returns 0, or -1 without memory. */
static inline int kvd_keys_init(kvd_keys *k, kvd_rng *r, int heads, int head_dim) {
    size_t n = (size_t)heads * (size_t)head_dim;
    k->heads = heads;
    k->head_dim = head_dim;
    k->scale = (double *)malloc(n * sizeof(double));
    k->offset = (double *)malloc(n * sizeof(double));
    if (k->scale == NULL || k->offset == NULL) { /* nothing left held */
        free(k->scale);
        free(k->offset);
        k->scale = k->offset = NULL;
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        k->scale[i] = 1.0;
        k->offset[i] = kvd_normal(r);
    }
    for (int h = 0; h < heads; h++)
        for (int base = 0; base < head_dim; base += 128) {
            int width = head_dim - base < 128 ? head_dim - base : 128;
            int want = (KVD_OUTLIERS_PER_128 * width + 127) / 128;
            for (int chosen = 0; chosen < want;) {
                int c = base + (int)(kvd_next(r) % (uint64_t)width);
                double *s = &k->scale[(size_t)h * (size_t)head_dim + (size_t)c];
                if (*s != 1.0) continue;
                *s = KVD_OUTLIER_SCALE;
                chosen++;
            }
        }
    return 0;
}

static inline void kvd_keys_free(kvd_keys *k) {
    free(k->scale);
    free(k->offset);
    k->scale = k->offset = NULL;
}

/* Softmax scale giving logits of standard deviation 2 for N(0,1) queries:
 * var(q.k) = sum_d E[k_d^2] = sum_d (scale^2 + offset^2), averaged over heads. */
static inline double kvd_sm_scale(const kvd_keys *k) {
    double sum = 0.0;
    for (int h = 0; h < k->heads; h++)
        for (int d = 0; d < k->head_dim; d++) {
            size_t i = (size_t)h * (size_t)k->head_dim + (size_t)d;
            sum += k->scale[i] * k->scale[i] + k->offset[i] * k->offset[i];
        }
    return KVD_LOGIT_STD / sqrt(sum / k->heads);
}

/* Fill `tokens` rows of [heads][head_dim] keys / values / queries. */
static inline void kvd_fill_keys(const kvd_keys *k, kvd_rng *r, size_t tokens, float *out) {
    size_t row = (size_t)k->heads * (size_t)k->head_dim;
    for (size_t t = 0; t < tokens; t++)
        for (size_t i = 0; i < row; i++)
            out[t * row + i] = (float)(kvd_normal(r) * k->scale[i] + k->offset[i]);
}

static inline void kvd_fill_normal(kvd_rng *r, size_t n, float *out) {
    for (size_t i = 0; i < n; i++) out[i] = (float)kvd_normal(r);
}

/* ---- float64 reference attention -------------------------------------------------- */

typedef struct {
    int q_heads, kv_heads, head_dim;
    double sm_scale, soft_cap; /* soft_cap 0 = off */
    int causal, window_left;   /* window_left -1 = none */
} kvd_attn;

/* One sequence: q [q_len][q_heads][D], k/v [kv_len][kv_heads][D] (fp32
 * inputs, as appended), out [q_len][q_heads][D] in double. Returns 0, or
 * -1 when it cannot allocate its scratch (out not written). */
static inline int kvd_reference(const kvd_attn *a, const float *q, int q_len, const float *k,
                                const float *v, int kv_len, double *out) {
    int D = a->head_dim, group = a->q_heads / a->kv_heads;
    double *w = (double *)malloc((size_t)(kv_len > 0 ? kv_len : 1) * sizeof(double));
    if (w == NULL) return -1;
    for (int i = 0; i < q_len; i++)
        for (int qh = 0; qh < a->q_heads; qh++) {
            int h = qh / group, pos = kv_len - q_len + i;
            int hi = a->causal ? pos : kv_len - 1;
            int lo = a->window_left >= 0 && pos - a->window_left > 0 ? pos - a->window_left : 0;
            const float *qr = q + ((size_t)i * (size_t)a->q_heads + (size_t)qh) * (size_t)D;
            double m = -INFINITY;
            for (int t = lo; t <= hi; t++) {
                const float *kr = k + ((size_t)t * (size_t)a->kv_heads + (size_t)h) * (size_t)D;
                double s = 0.0;
                for (int d = 0; d < D; d++) s += (double)qr[d] * (double)kr[d];
                s *= a->sm_scale;
                if (a->soft_cap > 0.0) s = a->soft_cap * tanh(s / a->soft_cap);
                w[t] = s;
                if (s > m) m = s;
            }
            double l = 0.0;
            for (int t = lo; t <= hi; t++) {
                w[t] = exp(w[t] - m);
                l += w[t];
            }
            double *o = out + ((size_t)i * (size_t)a->q_heads + (size_t)qh) * (size_t)D;
            for (int d = 0; d < D; d++) o[d] = 0.0;
            for (int t = lo; t <= hi; t++) {
                const float *vr = v + ((size_t)t * (size_t)a->kv_heads + (size_t)h) * (size_t)D;
                for (int d = 0; d < D; d++) o[d] += w[t] / l * (double)vr[d];
            }
        }
    free(w);
    return 0;
}

/* Relative L2 error ||got - ref|| / ||ref|| over n values. */
static inline double kvd_rel_l2(const float *got, const double *ref, size_t n) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        double e = (double)got[i] - ref[i];
        num += e * e;
        den += ref[i] * ref[i];
    }
    return den > 0.0 ? sqrt(num / den) : sqrt(num);
}

#endif
