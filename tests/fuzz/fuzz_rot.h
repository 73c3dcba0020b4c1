/*
 * The rotated basis of int4 values (docs/formats.md, "int4 values"),
 * written out from its definition for the harnesses that check what a read
 * returns: the largest error of each element of a token's row.
 */
#ifndef KVPAGE_FUZZ_ROT_H
#define KVPAGE_FUZZ_ROT_H

#include <math.h>
#include <stdint.h>

#include "kvpage.h"

/* Whether channel d changes sign. */
static inline int fz_rot_neg(uint32_t d) {
    uint32_t h = d * 0x9E3779B1u;
    h ^= h >> 15;
    h *= 0x2C1B3C6Du;
    h ^= h >> 12;
    return (int)(h >> 31);
}

/* tol[d]: how far a stored int4 value row may read back from x[0..D)
 * (finite values): the rotated row in double, each 32-wide group's half
 * step (with the fp16 scale's and minimum's rounding), summed back over
 * the rotation's block with its weight 2^-ceil(k/2). */
static inline void fz_rot_bound(const float *x, int D, double *tol) {
    static double r[KVP_MAX_HEAD_DIM], e[KVP_MAX_HEAD_DIM];
    double big = 0.0;
    for (int base = 0, bit = 1 << 12; bit >= 1; bit >>= 1) {
        if (!(D & bit)) continue;
        int k = 0;
        while ((1 << k) < bit) k++;
        for (int i = 0; i < bit; i++) {
            double acc = 0.0;
            for (int j = 0; j < bit; j++) {
                double v = fz_rot_neg((uint32_t)(base + j)) ? -(double)x[base + j] : (double)x[base + j];
                acc += (__builtin_popcount((unsigned)(i & j)) & 1) ? -v : v;
            }
            r[base + i] = ldexp(acc, -(k / 2));
            if (fabs(r[base + i]) > big) big = fabs(r[base + i]);
        }
        base += bit;
    }
    for (int g = 0; g < D; g += 32) {
        double lo = INFINITY, hi = -INFINITY;
        for (int i = g; i < D && i < g + 32; i++) lo = fmin(lo, r[i]), hi = fmax(hi, r[i]);
        for (int i = g; i < D && i < g + 32; i++) e[i] = (hi - lo) / 30.0 * 1.01 + fabs(lo) * 1e-3 + big * 1e-6;
    }
    for (int base = 0, bit = 1 << 12; bit >= 1; bit >>= 1) {
        if (!(D & bit)) continue;
        int k = 0;
        while ((1 << k) < bit) k++;
        double sum = 0.0;
        for (int i = base; i < base + bit; i++) sum += e[i];
        for (int i = base; i < base + bit; i++) tol[i] = ldexp(sum, -((k + 1) / 2));
        base += bit;
    }
}

/* The same for fp16 of the rotated row (a staging page of int4 values):
 * each rotated element rounded by at most 2^-11 of itself. */
static inline void fz_rot_bound_f16(const float *x, int D, double *tol) {
    for (int base = 0, bit = 1 << 12; bit >= 1; bit >>= 1) {
        if (!(D & bit)) continue;
        double sum = 0.0;
        for (int j = base; j < base + bit; j++) sum += fabs((double)x[j]);
        for (int j = base; j < base + bit; j++) tol[j] = sum * ldexp(1.0, -11) * 1.01 + 1e-7;
        base += bit;
    }
}

#endif
