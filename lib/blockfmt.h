/*
 * Block formats: the bytes of one (page, layer, kv head) K or V block, as
 * docs/formats.md defines them. This is the backend-independent reference
 * codec: the CPU kernels read these bytes directly, and the CUDA backend is
 * tested against these functions.
 */
#ifndef KVPAGE_BLOCKFMT_H
#define KVPAGE_BLOCKFMT_H

#include "internal.h"
#include "numeric.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What one block holds. `order` matters for plain-element keys only. */
typedef struct {
    int32_t format;    /* kvp_format */
    int32_t is_key;    /* 1: K block, 0: V block */
    int32_t order;     /* kvp_k_order for plain-element keys; token-major otherwise */
    int32_t page_size; /* tokens per block (P) */
    int32_t head_dim;  /* channels per token (D) */
} kvp__blockfmt;

/* int4 values are quantized per token in groups of this many channels. */
#define KVP__V4_GROUP 32
/* Tokens interleaved in a token group of int8/int4 values. */
#define KVP__V_TOKGROUP 4
/* fp8 calibration maps amax to 448 / this headroom: e4m3 keeps its relative
 * precision down to 2^-6 of its range, so a wide margin for later, larger
 * rows costs almost nothing (and the first append may be a single token). */
#define KVP__FP8_HEADROOM 8.0f

static inline kvp__blockfmt kvp__blockfmt_make(int32_t format, int32_t is_key,
                                               int32_t order, int32_t page_size,
                                               int32_t head_dim) {
    kvp__blockfmt f;
    f.format = format;
    f.is_key = is_key;
    f.order = order;
    f.page_size = page_size;
    f.head_dim = head_dim;
    return f;
}

/* Plain element formats: one value per element, no per-block scale data. */
static inline bool kvp__format_is_plain(int32_t f) {
    return f == KVP_FORMAT_FP32 || f == KVP_FORMAT_FP16 || f == KVP_FORMAT_BF16 ||
           f == KVP_FORMAT_FP8_E4M3;
}
/* Element size of a plain format in bytes. */
static inline int kvp__plain_size(int32_t f) {
    return f == KVP_FORMAT_FP32 ? 4 : f == KVP_FORMAT_FP8_E4M3 ? 1 : 2;
}
/* Key order of a block: dim-major only for plain keys stored that way. */
static inline bool kvp__blockfmt_dim_major(const kvp__blockfmt *f) {
    return f->is_key && kvp__format_is_plain(f->format) && f->order == KVP_K_ORDER_DIM_MAJOR;
}
/* Number of int4 value groups along head_dim. */
static inline int kvp__v4_groups(int32_t head_dim) {
    return (head_dim + KVP__V4_GROUP - 1) / KVP__V4_GROUP;
}
/* Tokens quantized together (a whole page for per-channel keys). */
static inline bool kvp__blockfmt_per_page(const kvp__blockfmt *f) {
    return f->is_key && (f->format == KVP_FORMAT_INT8 || f->format == KVP_FORMAT_INT4);
}

/* Byte offset of the element data of (token t, channel d) in a plain block. */
static inline uint64_t kvp__plain_offset(const kvp__blockfmt *f, int t, int d) {
    uint64_t idx = kvp__blockfmt_dim_major(f) ? (uint64_t)d * (uint64_t)f->page_size + (uint64_t)t
                                              : (uint64_t)t * (uint64_t)f->head_dim + (uint64_t)d;
    return idx * (uint64_t)kvp__plain_size(f->format);
}

/* Bytes of element data (scale data follows at this offset). */
uint64_t kvp__block_data_bytes(const kvp__blockfmt *f);
/* Element data plus scale data, before padding to KVP_BLOCK_ALIGN. */
uint64_t kvp__block_used_bytes(const kvp__blockfmt *f);

/* Encode tokens [t0, t0+n) of a block from fp32 rows x[i*stride + d].
 * Per-page formats (int8/int4 keys) need t0 == 0 and n == page_size.
 * fp8 uses `fp8_scale` (> 0). Returns the number of non-finite inputs. */
uint64_t kvp__block_encode(const kvp__blockfmt *f, void *block, int t0, int n,
                           const float *x, size_t stride, float fp8_scale);
/* Decode tokens [t0, t0+n) into fp32 rows y[i*stride + d]. */
void kvp__block_decode(const kvp__blockfmt *f, const void *block, int t0, int n,
                       float *y, size_t stride, float fp8_scale);

/* One element (token t, channel d) of a block, as fp32. */
float kvp__block_decode_one(const kvp__blockfmt *f, const uint8_t *block, int t, int d,
                            float fp8_scale);

/* Convert n elements of an fp32/fp16/bf16 array to fp32 and back. */
void kvp__load_f32(int32_t dtype, const void *src, size_t n, float *dst);
void kvp__store_f32(int32_t dtype, const float *src, size_t n, void *dst);
/* Bytes of one element of an input dtype (fp32/fp16/bf16), 0 otherwise. */
static inline size_t kvp__dtype_size(int32_t dtype) {
    return dtype == KVP_FORMAT_FP32 ? 4
           : (dtype == KVP_FORMAT_FP16 || dtype == KVP_FORMAT_BF16) ? 2 : 0;
}

/* fp8 calibration: scale for a head whose first rows have max |x| = amax. */
static inline float kvp__fp8_calibrated_scale(float amax) {
    if (!(amax > 0.0f) || !isfinite(amax)) return 1.0f;
    return amax * KVP__FP8_HEADROOM / 448.0f;
}

#ifdef __cplusplus
}
#endif

#endif
