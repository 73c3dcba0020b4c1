/*
 * libFuzzer harness: kvp_quant_block_bytes(), kvp_quantize() and
 * kvp_dequantize() (kvpage.h) over arbitrary block descriptions and bytes.
 *
 *   make fuzz FUZZ_TARGETS=quant FUZZ_SECONDS=60
 *
 * The input chooses a kvp_quant_desc_t (every format, keys or values, both
 * key orders, page sizes and head dims valid or not, heads, dtype, fp8
 * scale, reserved_, each field sometimes a limit value), a page count
 * (sometimes one whose byte count overflows) and a mode:
 * - dequantize arbitrary block bytes (int4 keys whose u16 outlier-channel
 *   indices point far past head_dim, NaN scales, ...): it must not crash,
 *   and with a quantized format (fp8, int8, int4) it must not write past
 *   the output tensor;
 * - quantize arbitrary floats (NaN, +-Inf, huge, subnormal), then
 *   dequantize: the blocks of fp8/int8/int4 hold nothing non-finite
 *   (docs/formats.md), so the fp32 output is finite;
 * - quantize finite data of a moderate range, then dequantize: the result
 *   is finite and within a per-format error bound of the input.
 * Every description is also checked against the byte counts of
 * docs/formats.md. Oracles besides the sanitizers: every status is KVP_OK or
 * documented; on error the error text is non-empty and the destination
 * untouched (it is filled with a sentinel first). Buffers always have the
 * size the description says; a page count too large to allocate is only
 * passed when the call must reject it (its byte count overflows).
 * tests/test_fuzz_quant.c replays the corpus and random inputs in `make test`.
 */
#define _POSIX_C_SOURCE 200809L
#include "kvpage.h"
#include "fuzz_input.h"
#include "fuzz_rot.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define FQ_CAP (1u << 20) /* largest tensor or block buffer the harness allocates */
#define FQ_SENTINEL 0xC3

static const int32_t fq_page_sizes[] = {1, 2, 3, 4, 6, 8, 16, 32};
static const int32_t fq_head_dims[] = {8, 16, 32, 64, 80, 96, 128, 256, 24, 40, 0, 12};

/* A field: usually one of the listed values, sometimes a limit value. */
static int32_t fq_pick(fzi_cursor *c, const int32_t *vals, size_t n) {
    uint8_t m = fzi_u8(c);
    if (m >= 240) return fzi_edgy_i32(c);
    return vals[m % n];
}

static size_t fq_dtype_size(int32_t dtype) { return dtype == KVP_FORMAT_FP32 ? 4 : 2; }

/* fp32 -> fp16 bits, round to nearest even (inputs that are exactly
 * representable keep their value), Inf/NaN kept. */
static uint16_t fq_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t e = (x >> 23) & 0xffu, m = x & 0x7fffffu;
    if (e == 0xff) return (uint16_t)(sign | 0x7c00u | (m ? 0x200u : 0));
    int32_t ue = (int32_t)e - 127 + 15;
    if (ue >= 31) return (uint16_t)(sign | 0x7c00u);
    if (ue <= 0) {
        if (ue < -10) return (uint16_t)sign;
        m |= 0x800000u;
        uint32_t shift = (uint32_t)(14 - ue);
        uint32_t h = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1))) h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((uint32_t)ue << 10) | (m >> 13), rem = m & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) h++;
    return (uint16_t)(sign | h);
}
static float fq_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    float v;
    if (e == 0) v = ldexpf((float)m, -24);
    else if (e == 31) v = m ? NAN : INFINITY;
    else v = ldexpf((float)(m | 0x400u), (int)e - 25);
    uint32_t bits;
    memcpy(&bits, &v, 4);
    bits |= sign;
    memcpy(&v, &bits, 4);
    return v;
}
/* Store x in the tensor element type; returns the value actually stored. */
static float fq_put(int32_t dtype, void *base, size_t i, float x) {
    if (dtype == KVP_FORMAT_FP32) {
        ((float *)base)[i] = x;
        return x;
    }
    uint16_t h;
    float back;
    if (dtype == KVP_FORMAT_FP16) {
        h = fq_f32_to_f16(x);
        back = fq_f16_to_f32(h);
    } else {
        uint32_t b;
        memcpy(&b, &x, 4);
        h = (uint16_t)(b >> 16); /* bf16 by truncation: exact in and out */
        b = (uint32_t)h << 16;
        memcpy(&back, &b, 4);
    }
    memcpy((uint8_t *)base + 2 * i, &h, 2);
    return back;
}
static float fq_get(int32_t dtype, const void *base, size_t i) {
    if (dtype == KVP_FORMAT_FP32) return ((const float *)base)[i];
    uint16_t h;
    memcpy(&h, (const uint8_t *)base + 2 * i, 2);
    if (dtype == KVP_FORMAT_FP16) return fq_f16_to_f32(h);
    uint32_t b = (uint32_t)h << 16;
    float f;
    memcpy(&f, &b, 4);
    return f;
}

/* Block bytes per docs/formats.md ("Byte counts"), padded to 16. */
static uint64_t fq_doc_block_bytes(int32_t fmt, bool key, uint64_t P, uint64_t D) {
    uint64_t b;
    switch (fmt) {
    case KVP_FORMAT_FP32: b = P * D * 4; break;
    case KVP_FORMAT_FP16:
    case KVP_FORMAT_BF16: b = P * D * 2; break;
    case KVP_FORMAT_FP8_E4M3: b = P * D; break;
    case KVP_FORMAT_INT8: b = key ? P * D + 4 * D : P * D + 2 * P; break;
    case KVP_FORMAT_INT4: b = key ? P * D / 2 + 4 * D + 4 * ((D + 31) / 32) * (6 + P) : P * D / 2 + 4 * P * ((D + 31) / 32); break;
    default: b = key ? P * D / 2 + 4 * D + (D / 32) * (6 + P) : P * D / 2 + 4 * P * ((D + 31) / 32);
    }
    return (b + 15) / 16 * 16;
}

static bool fq_all_untouched(const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != FQ_SENTINEL) return false;
    return true;
}

static bool fq_status_ok(int rc) { return rc == KVP_OK || rc == KVP_EINVAL || rc == KVP_ENOMEM; }

/* One value of the "arbitrary" float kind. */
static float fq_wild(fzi_cursor *c) {
    static const float special[] = {NAN, INFINITY, -INFINITY, 3.4e38f, -3.4e38f, 65504.0f,
                                    65520.0f, 1e-45f, -1e-40f, 0.0f, -0.0f, 448.0f, 1e20f};
    uint8_t m = fzi_u8(c);
    if (m < 64) return special[m % (sizeof special / sizeof special[0])];
    if (m < 128) {
        uint32_t b = fzi_u32(c);
        float f;
        memcpy(&f, &b, 4);
        return f;
    }
    return (float)(int8_t)fzi_u8(c) * 0.25f;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fzi_cursor c = fzi_make(data, size);
    uint8_t mode = fzi_u8(&c) % 4; /* 0: dequantize bytes, 1: wild quantize, 2/3: round trip */
    kvp_quant_desc_t d;
    memset(&d, 0, sizeof d);
    d.struct_size = sizeof d;
    static const int32_t formats[] = {0, 1, 2, 3, 4, 5, 6};
    static const int32_t bools[] = {0, 1};
    static const int32_t dtypes[] = {0, 1, 2};
    static const int32_t heads[] = {1, 2, 3};
    d.format = fq_pick(&c, formats, sizeof formats / sizeof formats[0]);
    d.is_value = fq_pick(&c, bools, 2);
    d.k_order = fq_pick(&c, bools, 2);
    d.page_size = fq_pick(&c, fq_page_sizes, sizeof fq_page_sizes / sizeof fq_page_sizes[0]);
    d.head_dim = fq_pick(&c, fq_head_dims, sizeof fq_head_dims / sizeof fq_head_dims[0]);
    d.heads = fq_pick(&c, heads, 3);
    d.dtype = fq_pick(&c, dtypes, 3);
    static const float scales[] = {1.0f, 0.01f, 1e-30f, 3.0f, 1e30f, 0.0f, -1.0f, NAN, INFINITY};
    uint8_t sm = fzi_u8(&c);
    d.fp8_scale = sm < 200 ? scales[sm % 5] : scales[sm % 9];
    uint8_t misc = fzi_u8(&c);
    if (misc == 255) d.reserved_ = (int32_t)fzi_u32(&c);
    if (misc == 254) d.struct_size = fzi_u32(&c);
    int64_t pages = 1 + fzi_below(&c, 3);
    uint8_t pm = fzi_u8(&c);
    if (pm >= 240) pages = fzi_edgy_i64(&c);

    char err[KVP_ERR_SIZE];
    err[0] = '\0';
    uint64_t block = 0;
    int rc = kvp_quant_block_bytes(&d, &block, err, sizeof err);
    FZI_ASSERT(rc == KVP_OK || rc == KVP_EINVAL);
    if (rc != KVP_OK) {
        FZI_ASSERT(err[0] != '\0');
        /* then quantize and dequantize reject it too, writing nothing */
        uint8_t src[64], dst[64];
        memset(src, 0, sizeof src);
        memset(dst, FQ_SENTINEL, sizeof dst);
        err[0] = '\0';
        FZI_ASSERT(kvp_quantize(&d, src, 1, dst, err, sizeof err) == KVP_EINVAL);
        FZI_ASSERT(err[0] != '\0' && fq_all_untouched(dst, sizeof dst));
        err[0] = '\0';
        FZI_ASSERT(kvp_dequantize(&d, src, 1, dst, err, sizeof err) == KVP_EINVAL);
        FZI_ASSERT(err[0] != '\0' && fq_all_untouched(dst, sizeof dst));
        return 0;
    }
    /* a valid description: the documented field ranges and byte count */
    FZI_ASSERT(d.format >= 0 && d.format < KVP_FORMAT_COUNT && d.heads >= 1);
    FZI_ASSERT(d.head_dim >= 8 && d.head_dim <= KVP_MAX_HEAD_DIM && d.head_dim % 8 == 0);
    FZI_ASSERT(d.page_size >= 1 && d.page_size <= KVP_MAX_PAGE_SIZE);
    FZI_ASSERT(!((d.format == KVP_FORMAT_INT4 || d.format == KVP_FORMAT_INT4_V1) && !d.is_value &&
                 d.page_size % 2 != 0));
    FZI_ASSERT(block == fq_doc_block_bytes(d.format, !d.is_value, (uint64_t)d.page_size,
                                           (uint64_t)d.head_dim));
    FZI_ASSERT(kvp_quant_block_bytes(&d, NULL, NULL, 0) == KVP_EINVAL);

    size_t P = (size_t)d.page_size, D = (size_t)d.head_dim, H = (size_t)d.heads;
    size_t es = fq_dtype_size(d.dtype);
    /* page counts: genuine buffers when they fit, otherwise only counts the
     * call must reject (below 1, or bytes that overflow the address space) */
    bool must_reject = pages < 1;
    size_t blocks_bytes = 0, tensor_elems = 0;
    if (!must_reject) {
        uint64_t bb, te;
        bool over = __builtin_mul_overflow((uint64_t)pages, (uint64_t)H, &bb) ||
                    __builtin_mul_overflow(bb, block, &bb) || bb > SIZE_MAX;
        uint64_t tb;
        bool over_t = __builtin_mul_overflow((uint64_t)pages, (uint64_t)(P * H * D), &te) ||
                      __builtin_mul_overflow(te, (uint64_t)es, &tb) || tb > SIZE_MAX;
        /* either side's bytes overflowing the address space must be refused */
        if (over || over_t) must_reject = true;
        else if (bb > FQ_CAP || tb > FQ_CAP) return 0; /* cannot allocate it: skip */
        else {
            blocks_bytes = (size_t)bb;
            tensor_elems = (size_t)te;
        }
    }
    if (must_reject) {
        uint8_t src[64], dst[64];
        memset(src, 0, sizeof src);
        memset(dst, FQ_SENTINEL, sizeof dst);
        err[0] = '\0';
        FZI_ASSERT(kvp_quantize(&d, src, pages, dst, err, sizeof err) == KVP_EINVAL);
        FZI_ASSERT(err[0] != '\0' && fq_all_untouched(dst, sizeof dst));
        err[0] = '\0';
        FZI_ASSERT(kvp_dequantize(&d, src, pages, dst, err, sizeof err) == KVP_EINVAL);
        FZI_ASSERT(err[0] != '\0' && fq_all_untouched(dst, sizeof dst));
        return 0;
    }
    size_t tensor_bytes = tensor_elems * es;
    uint8_t *blocks = malloc(blocks_bytes);
    uint8_t *tensor = malloc(tensor_bytes);
    uint8_t *back = malloc(tensor_bytes);
    float *want = malloc(tensor_elems * sizeof(float));
    FZI_ASSERT(blocks && tensor && back && want);
    bool quantized = d.format == KVP_FORMAT_FP8_E4M3 || d.format == KVP_FORMAT_INT8 ||
                     d.format == KVP_FORMAT_INT4 || d.format == KVP_FORMAT_INT4_V1;
    /* fp8 decodes up to 448 x scale: finite in the output type? */
    float out_max = d.dtype == KVP_FORMAT_FP16 ? 65504.0f : 3.0e38f;
    bool fp8_finite = d.format != KVP_FORMAT_FP8_E4M3 || 448.0 * d.fp8_scale < out_max;

    if (mode == 0) {
        /* arbitrary block bytes */
        fzi_bytes(&c, blocks, blocks_bytes);
        if (fzi_u8(&c) & 1) {
            /* int4 keys: put huge outlier-channel indices in every block */
            if ((d.format == KVP_FORMAT_INT4 || d.format == KVP_FORMAT_INT4_V1) && !d.is_value && D >= 32)
                for (size_t b = 0; b < (size_t)pages * H; b++) {
                    size_t at = b * block + P * D / 2 + 4 * D;
                    for (size_t j = 0; j < (d.format == KVP_FORMAT_INT4 ? (D + 31) / 32 * 4 : D / 32); j++) {
                        uint16_t idx = (uint16_t)(0xffffu - j * 977u);
                        memcpy(blocks + at + 2 * j, &idx, 2);
                    }
                }
        }
        memset(tensor, FQ_SENTINEL, tensor_bytes);
        rc = kvp_dequantize(&d, blocks, pages, tensor, err, sizeof err);
        FZI_ASSERT(rc == KVP_OK);
    } else {
        size_t n = tensor_elems;
        float amax = 0.0f;
        bool finite = mode >= 2;
        float mag = 1.0f;
        if (finite) {
            static const float mags[] = {1.0f, 1e-3f, 100.0f, 1e-6f, 3000.0f};
            mag = mags[fzi_below(&c, 5)];
        }
        uint8_t outlier = fzi_u8(&c);
        for (size_t i = 0; i < n; i++) {
            float x;
            if (finite) {
                x = (float)(int8_t)fzi_u8(&c) / 128.0f * mag;
                /* a few channels ten times wider, as real keys have */
                if (outlier & 1 && (i % D) % 29 == (size_t)(outlier >> 3) % 29) x *= 10.0f;
                if (c.n == 0) x = (float)((int)((i * 37) % 17) - 8) / 8.0f * mag;
            } else {
                x = fq_wild(&c);
            }
            want[i] = fq_put(d.dtype, tensor, i, x);
            if (isfinite(want[i]) && fabsf(want[i]) > amax) amax = fabsf(want[i]);
            if (!isfinite(want[i])) finite = false;
        }
        memset(blocks, FQ_SENTINEL, blocks_bytes);
        rc = kvp_quantize(&d, tensor, pages, blocks, err, sizeof err);
        FZI_ASSERT(fq_status_ok(rc));
        if (rc != KVP_OK) {
            FZI_ASSERT(rc == KVP_ENOMEM && err[0] != '\0' && fq_all_untouched(blocks, blocks_bytes));
            goto done;
        }
        memset(back, FQ_SENTINEL, tensor_bytes);
        rc = kvp_dequantize(&d, blocks, pages, back, err, sizeof err);
        FZI_ASSERT(rc == KVP_OK);
        /* quantized blocks never hold a non-finite value (docs/formats.md) */
        if (quantized && fp8_finite && d.dtype == KVP_FORMAT_FP32)
            for (size_t i = 0; i < n; i++) FZI_ASSERT(isfinite(fq_get(d.dtype, back, i)));
        if (finite && fp8_finite) {
            /* error bound per format, relative to the largest magnitude */
            double rel;
            switch (d.format) {
            case KVP_FORMAT_FP32: rel = 0.0; break;
            case KVP_FORMAT_FP16: rel = 1.0 / 1024; break;
            case KVP_FORMAT_BF16: rel = 1.0 / 128; break;
            case KVP_FORMAT_FP8_E4M3: rel = 1.0 / 8; break;
            case KVP_FORMAT_INT8: rel = 1.0 / 64; break;
            default: rel = 1.0 / 6; break;
            }
            if (d.dtype == KVP_FORMAT_FP16) rel += 1.0 / 1024;
            if (d.dtype == KVP_FORMAT_BF16) rel += 1.0 / 128;
            double tol = rel * amax + 1e-4;
            if (d.format == KVP_FORMAT_FP8_E4M3) {
                /* saturation above 448 x scale, subnormal steps below */
                if (amax > 448.0f * d.fp8_scale) goto done;
                tol += (double)d.fp8_scale / 256;
            }
            static double rtol[KVP_MAX_HEAD_DIM];
            const bool rotated = d.format == KVP_FORMAT_INT4 && d.is_value;
            for (size_t i = 0; i < n; i++) {
                float got = fq_get(d.dtype, back, i);
                FZI_ASSERT(isfinite(got));
                double t = tol;
                if (rotated) { /* the row's own bound, and the output type's rounding */
                    if (i % D == 0) fz_rot_bound(want + i, (int)D, rtol);
                    t = rtol[i % D] + (tol - rel * amax) + (d.dtype == KVP_FORMAT_FP32 ? 0.0
                        : (d.dtype == KVP_FORMAT_FP16 ? 1.0 / 1024 : 1.0 / 128) * amax) + 1e-5 * amax;
                }
                FZI_ASSERT(fabs((double)got - (double)want[i]) <= t);
            }
        }
    }
done:
    free(blocks);
    free(tensor);
    free(back);
    free(want);
    return 0;
}
