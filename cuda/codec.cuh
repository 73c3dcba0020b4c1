/*
 * Device encoders of the block formats (docs/formats.md), built from the
 * same scalar rules the CPU's reference codec uses (lib/blockfmt.h:
 * kvp__asym_make, kvp__asym_code, kvp__sym8_*, kvp__f32_to_*), so the bytes
 * are the CPU's, bit for bit. What differs is only who computes what:
 *
 *  - one warp encodes one token of one head (plain formats, int8 values,
 *    int4 values): lanes over channels, the token's scale from a warp
 *    reduction;
 *  - one thread encodes one channel of a page (int8 / int4 keys, per
 *    channel over the page's tokens): it walks the tokens in order.
 *
 * Ranges are taken over finite values with the reference's tie rule: of
 * equal values (-0.0 and +0.0) the first in channel order wins, so even the
 * sign of a zero minimum is the CPU's.
 *
 * Values come from a Source: src(t, d) is token t, channel d of the block
 * being encoded, as fp32 (rows of an append, a staging page, a tensor), and
 * src.rotated(t) says whether token t is in the rotated basis already (a
 * staged row of rotated values).
 *
 * Rotated blocks (int4 values, and the fp16 staging values of such a store:
 * kvp__blockfmt::rot) encode each token's row after kvp__rot_forward(): the
 * warp forms the rotated row in a shared-memory row of its own, then
 * encodes from it as from any other source.
 */
#ifndef KVPAGE_CUDA_CODEC_CUH
#define KVPAGE_CUDA_CODEC_CUH

#include "common.cuh"

/* Rows of an fp32 / fp16 / bf16 tensor: token t is row row0 + t, head h. */
struct kvp__row_source {
    const uint8_t *base;
    int64_t row_stride; /* elements between rows */
    int64_t row0;
    int32_t h, D, dtype, esize;
    __device__ __forceinline__ float operator()(int t, int d) const {
        int64_t at = ((row0 + t) * row_stride + (int64_t)h * D + d) * esize;
        return kvp__load_elem(base + at, dtype);
    }
    __device__ __forceinline__ bool rotated(int) const { return false; }
};

/* A seal's page: its first `count` tokens from an fp16 staging block, the
 * rest from the appended rows. */
struct kvp__seal_source {
    const uint8_t *staging; /* may be NULL when count is 0 */
    kvp__blockfmt sfmt;
    int32_t count;
    kvp__row_source rows;   /* rows.row0 = the seal's first appended row */
    __device__ __forceinline__ float operator()(int t, int d) const {
        if (t < count)
            return kvp__f16_to_f32(kvp__load_u16(staging + kvp__plain_offset(&sfmt, t, d)));
        return rows(t - count, d);
    }
    /* staged rows of rotated values were rotated when they were staged */
    __device__ __forceinline__ bool rotated(int t) const { return t < count && sfmt.rot != 0; }
};

/* A token's row already in the rotated basis, in shared memory. */
struct kvp__rotated_row {
    const float *row;
    __device__ __forceinline__ float operator()(int, int d) const { return row[d]; }
    __device__ __forceinline__ bool rotated(int) const { return true; }
};

/* Rotated tokens are formed in a row of D floats per warp, in the dynamic
 * shared memory of the kernel: its launch gives kvp__enc_smem() bytes
 * (none where nothing is rotated, so that other kernels pay nothing). */
static inline size_t kvp__enc_smem(bool rotated, int threads, int D) {
    return rotated ? (size_t)(threads / 32) * (size_t)D * sizeof(float) : 0;
}

/* The calling warp's row. */
__device__ __forceinline__ float *kvp__enc_row(int D) {
    KVP_DYNAMIC_SMEM(float, rows);
    return rows + (size_t)(threadIdx.x >> 5) * (size_t)D;
}

/* ---- warp reductions with the reference's tie rule ----------------------------------- */

/* Smallest finite value (first index among equals); +INF when none. */
__device__ __forceinline__ float kvp__warp_min_first(float v, int idx) {
    for (int o = 16; o > 0; o >>= 1) {
        float w = __shfl_xor_sync(0xffffffffu, v, o);
        int j = __shfl_xor_sync(0xffffffffu, idx, o);
        if (w < v || (w == v && j < idx)) {
            v = w;
            idx = j;
        }
    }
    return v;
}
/* Largest finite value (first index among equals); -INF when none. */
__device__ __forceinline__ float kvp__warp_max_first(float v, int idx) {
    for (int o = 16; o > 0; o >>= 1) {
        float w = __shfl_xor_sync(0xffffffffu, v, o);
        int j = __shfl_xor_sync(0xffffffffu, idx, o);
        if (w > v || (w == v && j < idx)) {
            v = w;
            idx = j;
        }
    }
    return v;
}

/* ---- one token, one warp ------------------------------------------------------------------ */

/* Encode token t of block b (format f, which is not a per-page key format)
 * from src(t, d) as it stands (no rotation). All 32 lanes of the warp call
 * it. fp8: `fp8_scale` > 0. */
template <typename Source>
__device__ void kvp__encode_token_raw(const kvp__blockfmt &f, uint8_t *b, int t, const Source &src,
                                      float fp8_scale) {
    const int lane = (int)(threadIdx.x & 31u), D = f.head_dim, P = f.page_size;
    if (kvp__format_is_plain(f.format)) {
        float inv8 = f.format == KVP_FORMAT_FP8_E4M3 ? 1.0f / fp8_scale : 0.0f;
        for (int d = lane; d < D; d += 32) {
            float v = src(t, d);
            uint8_t *p = b + kvp__plain_offset(&f, t, d);
            switch (f.format) {
            case KVP_FORMAT_FP32: memcpy(p, &v, 4); break;
            case KVP_FORMAT_FP16: kvp__store_u16(p, kvp__f32_to_f16(v)); break;
            case KVP_FORMAT_BF16: kvp__store_u16(p, kvp__f32_to_bf16(v)); break;
            default: *p = kvp__f32_to_e4m3(v * inv8); break;
            }
        }
        return;
    }
    uint8_t *sc = b + kvp__block_data_bytes(&f);
    if (f.format == KVP_FORMAT_INT8) { /* values: symmetric per token */
        float amax = 0.0f;
        for (int d = lane; d < D; d += 32) {
            float v = src(t, d);
            if (isfinite(v) && fabsf(v) > amax) amax = fabsf(v);
        }
        amax = kvp__warp_max(amax);
        uint16_t s16 = kvp__sym8_scale16(amax);
        float inv = kvp__sym8_inv(s16);
        if (lane == 0) kvp__store_u16(sc + 2 * (size_t)t, s16);
        for (int d = lane; d < D; d += 32)
            b[kvp__v8_offset(P, D, t, d)] = (uint8_t)kvp__sym8_code(src(t, d), inv);
        return;
    }
    /* int4 values: asymmetric per token in groups of 32 channels */
    const int G = kvp__v4_groups(D);
    uint8_t *mn = sc + 2 * (size_t)G * (size_t)P;
    for (int g = 0; g < G; g++) {
        int w = kvp__v4_width(D, g), d0 = g * KVP__V4_GROUP;
        float v = lane < w ? src(t, d0 + lane) : 0.0f;
        bool fin = lane < w && isfinite(v);
        float lo = kvp__warp_min_first(fin ? v : INFINITY, fin ? lane : 64);
        float hi = kvp__warp_max_first(fin ? v : -INFINITY, fin ? lane : 64);
        kvp__asym a = kvp__asym_make(lo, hi, 15);
        if (lane == 0) {
            size_t si = (size_t)g * (size_t)P + (size_t)t;
            kvp__store_u16(sc + 2 * si, a.scale16);
            kvp__store_u16(mn + 2 * si, a.min16);
        }
        if (lane < w / 2) {
            unsigned c0 = kvp__asym_code(&a, src(t, d0 + lane), 15);
            unsigned c1 = kvp__asym_code(&a, src(t, d0 + lane + w / 2), 15);
            int high = 0;
            uint64_t o = kvp__v4_offset(P, D, t, d0 + lane, &high);
            b[o] = (uint8_t)(c0 | (c1 << 4));
        }
    }
}

/* Encode token t of block b from src(t, d): into the rotated basis first
 * where the block is rotated and the token is not yet (in the warp's row of
 * dynamic shared memory: kvp__enc_smem()). All 32 lanes of the warp call it. */
template <typename Source>
__device__ void kvp__encode_token(const kvp__blockfmt &f, uint8_t *b, int t, const Source &src,
                                  float fp8_scale) {
    if (!f.rot || src.rotated(t)) {
        kvp__encode_token_raw(f, b, t, src, fp8_scale);
        return;
    }
    const int lane = (int)(threadIdx.x & 31u), D = f.head_dim;
    float *row = kvp__enc_row(D);
    for (int d = lane; d < D; d += 32) row[d] = kvp__rot_load(src(t, d), d);
    __syncwarp();
    kvp__rot_forward_rows(row, 1, D, lane, 32, kvp__warp_sync());
    kvp__rotated_row rr;
    rr.row = row;
    kvp__encode_token_raw(f, b, t, rr, fp8_scale);
    __syncwarp(); /* the row is read before the warp's next token overwrites it */
}

/* ---- one channel of a page, one thread (int8 / int4 keys) -------------------------------- */

/* The range of channel d over the page's finite values, in token order (the
 * reference's tie rule). */
template <typename Source>
__device__ void kvp__key_channel_range(const kvp__blockfmt &f, int d, const Source &src, float *lo,
                                       float *hi) {
    float a = INFINITY, b = -INFINITY;
    for (int t = 0; t < f.page_size; t++) {
        float v = src(t, d);
        if (!isfinite(v)) continue;
        if (v < a) a = v;
        if (v > b) b = v;
    }
    *lo = a;
    *hi = b;
}

/* Channel d of a per-page key block. `j` >= 0: int4 keys' outlier entry j of
 * R (int8 codes in the table, zeros in the int4 part). */
template <typename Source>
__device__ void kvp__encode_key_channel(const kvp__blockfmt &f, uint8_t *b, int d,
                                        const Source &src, int j, int R) {
    const int P = f.page_size, D = f.head_dim;
    const int levels = f.format == KVP_FORMAT_INT8 || j >= 0 ? 255 : 15;
    float lo, hi;
    kvp__key_channel_range(f, d, src, &lo, &hi);
    kvp__asym a = kvp__asym_make(lo, hi, levels);
    uint8_t *sc = b + kvp__block_data_bytes(&f);
    if (j >= 0) {
        uint8_t *ot = sc + 4 * (size_t)D;
        kvp__store_u16(ot + 2 * (size_t)j, (uint16_t)d);
        kvp__store_u16(ot + 2 * (size_t)(R + j), a.scale16);
        kvp__store_u16(ot + 2 * (size_t)(2 * R + j), a.min16);
        kvp__store_u16(sc + 2 * (size_t)d, 0);
        kvp__store_u16(sc + 2 * (size_t)D + 2 * (size_t)d, 0);
        uint8_t *codes = ot + 6 * (size_t)R;
        for (int t = 0; t < P; t++)
            codes[kvp__k4_code_offset(f.format, P, j, t)] = (uint8_t)kvp__asym_code(&a, src(t, d), 255);
        for (int t = 0; t < P; t += 2) {
            int high = 0;
            b[kvp__k4_offset(P, t, d, &high)] = 0;
        }
        return;
    }
    kvp__store_u16(sc + 2 * (size_t)d, a.scale16);
    kvp__store_u16(sc + 2 * (size_t)D + 2 * (size_t)d, a.min16);
    if (levels == 255) {
        for (int t = 0; t < P; t++) b[kvp__k8_offset(P, t, d)] = (uint8_t)kvp__asym_code(&a, src(t, d), 255);
    } else {
        for (int t = 0; t < P; t += 2) { /* both nibbles of a byte: tokens t, t+1 */
            unsigned c0 = kvp__asym_code(&a, src(t, d), 15);
            unsigned c1 = kvp__asym_code(&a, src(t + 1, d), 15);
            int high = 0;
            b[kvp__k4_offset(P, t, d, &high)] = (uint8_t)(c0 | (c1 << 4));
        }
    }
}

/* Every channel of a per-page key block, by the threads of a block (all of
 * them must call it: int4 keys pick their outlier channels together). */
template <typename Source>
__device__ void kvp__encode_key_page(const kvp__blockfmt &f, uint8_t *b, const Source &src) {
    const int D = f.head_dim, R = KVP__K4_OUTLIERS(f.format, D); /* 0 but for int4 */
    __shared__ float range[KVP_MAX_HEAD_DIM];
    __shared__ uint16_t outl[KVP__K4_MAX_OUTLIERS];
    __shared__ int8_t entry[KVP_MAX_HEAD_DIM]; /* a channel's outlier entry, or -1 */
    static_assert(KVP__K4_MAX_OUTLIERS <= 128, "outlier entries are kept as int8");
    if (R > 0) {
        for (int d = (int)threadIdx.x; d < D; d += (int)blockDim.x) {
            float lo, hi;
            kvp__key_channel_range(f, d, src, &lo, &hi);
            range[d] = lo > hi ? 0.0f : hi - lo;
            entry[d] = -1;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            kvp__k4_pick(range, D, R, outl);
            for (int j = 0; j < R; j++) entry[outl[j]] = (int8_t)j;
        }
        __syncthreads();
    }
    for (int d = (int)threadIdx.x; d < D; d += (int)blockDim.x)
        kvp__encode_key_channel(f, b, d, src, R > 0 ? entry[d] : -1, R);
    if (R > 0) __syncthreads(); /* the shared tables are reused by the next page */
}

/* Every token of a per-token block, by the warps of a block (rotated
 * blocks: kvp__enc_smem() bytes of dynamic shared memory). */
template <typename Source>
__device__ void kvp__encode_tokens(const kvp__blockfmt &f, uint8_t *b, int t0, int n,
                                   const Source &src, float fp8_scale) {
    const int warp = (int)(threadIdx.x >> 5), warps = (int)(blockDim.x >> 5);
    for (int t = t0 + warp; t < t0 + n; t += warps) kvp__encode_token(f, b, t, src, fp8_scale);
}

#endif
