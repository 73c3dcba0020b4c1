/*
 * Scalar number conversions with exactly defined rounding (docs/formats.md).
 * The reference every backend must reproduce bit for bit:
 *   fp32 -> fp16, bf16: IEEE round-to-nearest-even; NaN stays NaN (quiet,
 *                       sign kept); fp16 overflow gives +-Inf, as F16C does.
 *   fp32 -> fp8 e4m3:   round-to-nearest-even, saturating to +-448; NaN -> 0
 *                       (the store never writes an fp8 NaN).
 * Header-only so tests, tools and every backend use the same code: the
 * CUDA backend compiles these very functions for the device (KVP__HD), so
 * its bytes are the CPU's by construction, not by imitation.
 */
#ifndef KVPAGE_NUMERIC_H
#define KVPAGE_NUMERIC_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* Host and device under nvcc; plain functions for C compilers and for the
 * kernel simulator (which compiles .cu files as host C++). */
#if defined(__CUDACC__)
#define KVP__HD __host__ __device__
#else
#define KVP__HD
#endif

KVP__HD static inline uint32_t kvp__f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

KVP__HD static inline float kvp__bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

KVP__HD static inline float kvp__f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1Fu, mant = h & 0x3FFu;
    if (exp == 0x1F) /* Inf or NaN */
        return kvp__bits_f32(sign | 0x7F800000u | (mant << 13));
    if (exp == 0) { /* zero or subnormal: mant * 2^-24 */
        float v = (float)mant * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    return kvp__bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

KVP__HD static inline uint16_t kvp__f32_to_f16(float f) {
    uint32_t x = kvp__f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7FFFFFFFu;
    if (ax > 0x7F800000u) /* NaN: keep it quiet */
        return (uint16_t)(sign | 0x7E00u | ((ax >> 13) & 0x3FFu));
    if (ax >= 0x477FF000u) /* rounds to >= 65520: Inf */
        return (uint16_t)(sign | 0x7C00u);
    if (ax < 0x38800000u) { /* below 2^-14: subnormal half (or zero) */
        /* ax as float times 2^24, rounded to nearest even, is the mantissa */
        float v = kvp__bits_f32(ax) * 16777216.0f;
        /* v < 1024 exactly representable range; nearbyint rounds to even */
        uint32_t m = (uint32_t)nearbyintf(v);
        return (uint16_t)(sign | m);
    }
    /* normal: rebias exponent, round mantissa 23 -> 10 bits, ties to even */
    uint32_t r = ax - 0x38000000u; /* exponent 127 -> 15 */
    uint32_t lsb = (r >> 13) & 1u;
    r += 0xFFFu + lsb;
    return (uint16_t)(sign | (r >> 13));
}

KVP__HD static inline float kvp__bf16_to_f32(uint16_t b) { return kvp__bits_f32((uint32_t)b << 16); }

KVP__HD static inline uint16_t kvp__f32_to_bf16(float f) {
    uint32_t x = kvp__f32_bits(f);
    if ((x & 0x7FFFFFFFu) > 0x7F800000u) /* NaN: quiet, sign kept */
        return (uint16_t)((x >> 16) | 0x0040u);
    uint32_t lsb = (x >> 16) & 1u;
    x += 0x7FFFu + lsb;
    return (uint16_t)(x >> 16);
}

/* OCP FP8 E4M3 (bias 7, no infinities, max 448, NaN = S.1111.111). */
KVP__HD static inline float kvp__e4m3_to_f32(uint8_t v) {
    uint32_t exp = (v >> 3) & 0xFu, mant = v & 0x7u;
    float mag;
    if (exp == 0xF && mant == 0x7) mag = NAN;
    else if (exp == 0) mag = (float)mant * 0.001953125f; /* mant/8 * 2^-6 */
    else mag = ldexpf(1.0f + (float)mant * 0.125f, (int)exp - 7);
    return (v & 0x80u) ? -mag : mag;
}

/* Round to nearest even, saturate to +-448, NaN -> +0. */
KVP__HD static inline uint8_t kvp__f32_to_e4m3(float f) {
    if (isnan(f)) return 0;
    uint8_t sign = signbit(f) ? 0x80 : 0;
    float a = fabsf(f);
    if (a >= 448.0f) return (uint8_t)(sign | 0x7E); /* 1.75 * 2^8 */
    if (a < 0.015625f) { /* below 2^-6: subnormal step 2^-9 */
        uint32_t m = (uint32_t)nearbyintf(a * 512.0f); /* 0..8; 8 = smallest normal */
        return (uint8_t)(sign | m);
    }
    int e;
    (void)frexpf(a, &e); /* a = f * 2^e, f in [0.5, 1) */
    int exp = e - 1;     /* a in [2^exp, 2^(exp+1)) */
    float scaled = ldexpf(a, 3 - exp); /* in [8, 16): 8 + mantissa */
    uint32_t q = (uint32_t)nearbyintf(scaled);
    if (q == 16) { q = 8; exp++; }
    if (exp > 8 || (exp == 8 && q > 14)) return (uint8_t)(sign | 0x7E);
    return (uint8_t)(sign | (uint32_t)((exp + 7) << 3) | (q - 8));
}

/* Round to nearest, ties to even, for |x| < 2^22 (what quantizers need). */
KVP__HD static inline float kvp__rne(float x) { return nearbyintf(x); }

#endif
