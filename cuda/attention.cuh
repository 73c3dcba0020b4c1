/*
 * Paged attention on CUDA: the kernels (decode and chunked prefill, every
 * format, split-KV with a merge kernel). docs/cuda.md describes the design;
 * in short:
 *
 * Work item = one CTA of 128 threads = (sequence, kv head, block of R query
 * rows of that head, split of its pages). Rows are (query token i, head g of
 * the GQA group) pairs, so the query heads of a group share every K/V tile.
 * The CTA walks its pages in tiles of TT tokens (32; 16 at head_dim 256).
 * Where pages fit a tile and blocks are 16-byte aligned, the copy pipeline
 * brings them on chip: a ring of 2-3 stages, each one tile's K and V blocks
 * copied whole (cp.async, 16 bytes a thread), S-1 tiles ahead of the tile
 * being computed, page ids fetched a tile before their copy starts; plain
 * token-major 16/32-bit pages are then computed in the stage itself,
 * int8 / int4 keys dotted in their codes with dp4a against the query
 * quantized per page (prep_int, logits_int), the other formats decoded from
 * the stage in phase B. Otherwise (the single-buffer loader), per tile:
 *
 *   A  page ids of the tile -> shared memory (block addresses per page,
 *      page and token per tile row)
 *   B  load: K and V blocks -> shared-memory tiles with coalesced 16-byte
 *      loads, dequantized on the way (fused: no page-sized temporary in
 *      device memory); elements kept as fp32, fp16 or bf16 ("kinds")
 *
 * and then, with either loader:
 *   C  logits: 16 lanes per token (32 at head_dim 256), each with its
 *      slice of the R query rows in registers; one reduce-scatter over
 *      the lanes gives each row's dot product
 *   D  online softmax: one warp per row, lanes over the tile's tokens
 *   E  o += p v: each thread owns 2 channels of the R rows' accumulators
 *      (fp32, registers) for a slice of the tile's tokens.
 *
 * Quantized formats land in the tiles as fp16: fp8 e4m3 exactly (its
 * per-head scale multiplies the logit, and p for values), int8 value codes
 * exactly (the token's scale multiplies p), int8/int4 keys and int4 values
 * dequantized (rounding to fp16 adds far less error than the format's own:
 * docs/cuda.md). A sequence's staging page is a tile of its own.
 *
 * int4 values are stored in a rotated basis (kvp__rot_forward), their fp16
 * staging pages too: the tiles hold rotated values, and attention over them
 * is the rotated output. Each output row is taken back (kvp__rot_inverse,
 * in fp32, before the conversion to the output dtype) where it is
 * finished: in shared memory at the end of the attention kernel, or in the
 * merge kernel for split sequences (the merge is linear, so the partials
 * stay rotated).
 *
 * Everything here compiles both with nvcc and, for CI, as C++ against the
 * kernel simulator (tests/cudasim): no block relies on another, every
 * thread reaches every barrier, every warp collective has all 32 lanes.
 */
#ifndef KVPAGE_CUDA_ATTENTION_CUH
#define KVPAGE_CUDA_ATTENTION_CUH

#include "common.cuh"

#define KVP_ATTN_THREADS 128

namespace kvp_attn {

constexpr int NT = KVP_ATTN_THREADS;

#if defined(__CUDACC__)
#define KVP_UNROLL _Pragma("unroll")
#else
#define KVP_UNROLL
#endif
constexpr int NW = NT / 32;

/* Element kinds of a shared-memory tile. */
enum : int32_t { KIND_F32 = 0, KIND_F16 = 1, KIND_BF16 = 2 };

/* Tile shape per head_dim. */
template <int D> struct shape {
    static constexpr int TT = D >= 256 ? 16 : 32;   /* tokens per tile */
    static constexpr int LPT = D >= 256 ? 32 : 16;  /* lanes per token (logits) */
    static constexpr int VEC = D / LPT;             /* channels per lane (logits) */
    static constexpr int TG = NT / LPT;             /* tokens in flight (logits) */
    static constexpr int TPR = D / 2;               /* threads per token row (o += p v) */
    static constexpr int TS = NT / TPR;             /* token slices (o += p v) */
};

/* Everything a launch needs, by value. */
struct params {
    kvp__geo g;                 /* the layer's blocks */
    int32_t kind[2];            /* tile kinds of pool pages: K, V */
    int32_t fast[2];            /* the 16-byte loader applies to pool pages (K, V) */
    int32_t sfast;              /* ... to staging pages (dim-major fp16 keys need P % 8 == 0) */
    int32_t batch, group, q_heads, R;
    const int32_t *qo, *indptr, *indices, *last;
    const int32_t *item_start, *splits, *split_pages;
    const int64_t *part_off;
    const int32_t *merge_start;
    const uint8_t *q;
    uint8_t *out;
    float *lse;
    int32_t dtype, esize;
    float sm_scale, soft_cap;
    int32_t causal, window;
    float *partials;
    /* The copy pipeline (pipe != 0; pages no larger than a tile, every block
     * 16-byte aligned): each tile's K and V blocks are copied whole, in their
     * own layout, into a ring of `stages` shared-memory stages with cp.async,
     * `stages` - 1 tiles ahead of the one being computed. */
    int32_t pipe, stages;
    int32_t stage_k, stage_v;   /* bytes of a stage's K and V areas */
    int32_t copy_k, copy_v;     /* bytes copied per pool block (and between pool pages in a stage) */
    int32_t direct[2];          /* pool K / V tiles are read where they landed (plain, token-major,
                                   16 or 32 bits: the block is the tile) */
    int32_t sdirect;            /* the same for staging K pages (token-major); staging V always */
    int32_t dec_k, dec_v;       /* bytes of the decoded K / V tile (0: that side is always direct) */
    int32_t slot_k, slot_v;     /* bytes between pool pages in a stage (copy_k / copy_v, plus a
                                   64-byte skew between blocks that are decoded, not read in place) */
    int32_t kint;               /* pool int8 / int4 keys: logits by integer dot products (dp4a)
                                   against the query quantized per page (the kvp_int_* layout below) */
};

/* ---- shared-memory layout --------------------------------------------------------------- */

template <int D> struct smem_plan {
    static constexpr int TT = shape<D>::TT;
    /* row pitch in bytes: 16 bytes of padding keep 16-byte rows conflict-free */
    static __host__ __device__ int pitch(int32_t kind) { return kind == KIND_F32 ? (D + 4) * 4 : (D + 8) * 2; }
    static __host__ __device__ int tile_bytes(int32_t kind) { return TT * pitch(kind); }
    /* offsets: K tile | V tile | S [R][TT] | P [TT][R] | vs [TT] | row info | tables */
    /* what follows the tiles: S, P, vs, row info, pj / tt, kblk / vblk */
    static __host__ __device__ int rest(int R) { return 2 * R * TT * 4 + TT * 4 + 16 * R + TT * 8 + TT * 16; }
    /* the tiles, or the final reduction when larger (it reuses them) */
    static __host__ __device__ int main_area(int tiles, int R) {
        int red = shape<D>::TS * R * D * 4;
        return red > tiles ? red : tiles;
    }
    static __host__ __device__ int bytes(int32_t kk, int32_t vk, int R) {
        return main_area(tile_bytes(kk) + tile_bytes(vk), R) + rest(R) + 64;
    }
    /* With the copy pipeline: the stages, then the decoded tiles; after the
     * rest, each stage's block pointers (K, V) and page ids. */
    static __host__ __device__ int pipe_bytes(int stages, int stage_k, int stage_v, int dec_k, int dec_v,
                                              int R, bool kint, int ppt, int ro) {
        return main_area(stages * (stage_k + stage_v) + dec_k + dec_v, R) + rest(R) + stages * TT * 20 +
               (kint ? kint_bytes(R, ppt, ro) : 0) + 64;
    }
    /* Integer keys, after the page ids (offsets in this order, each a
     * multiple of 16): the rows' scaled queries qf [R][D] (fp32); per page
     * of the tile, the query quantized against the page's channel scales,
     * qq [ppt][R][D/4] x (hi, lo) words, a page's part padded by 16 bytes
     * so the pages' words fall in different banks; per page and row the
     * step and constant of the logits, sc [ppt][R][2]; the warps' partial
     * dot products part [NW][R][TT] (int32); int4 outlier coefficients
     * ko [ppt][R][ro] (ro: the key format's outlier channels, 0 for int8),
     * last, so that no other offset depends on the format. */
    static __host__ __device__ int qq_page(int R) { return R * D * 2 + 16; }
    static __host__ __device__ int up16(int x) { return (x + 15) & ~15; }
    static __host__ __device__ int kint_bytes(int R, int ppt, int ro) {
        return R * D * 4 + ppt * qq_page(R) + up16(ppt * R * 8) + NW * R * TT * 4 +
               up16(ppt * R * ro * 4);
    }
};

/* ---- small helpers ------------------------------------------------------------------------- */

__device__ __forceinline__ float f16_bits(uint16_t u) {
    __half_raw r;
    r.x = u;
    return __half2float(__half(r));
}
__device__ __forceinline__ uint16_t f16_from(float v) {
    __half h = __float2half_rn(v);
    uint16_t u;
    memcpy(&u, &h, 2);
    return u;
}
__device__ __forceinline__ uint16_t bf16_from(float v) {
    __nv_bfloat16 h = __float2bfloat16_rn(v);
    uint16_t u;
    memcpy(&u, &h, 2);
    return u;
}

/* Store one element of a tile. */
__device__ __forceinline__ void put(uint8_t *row, int d, int32_t kind, float v) {
    if (kind == KIND_F32) reinterpret_cast<float *>(row)[d] = v;
    else if (kind == KIND_F16) reinterpret_cast<uint16_t *>(row)[d] = f16_from(v);
    else reinterpret_cast<uint16_t *>(row)[d] = (uint16_t)(kvp__f32_bits(v) >> 16); /* exact for bf16 data */
}

/* Read N consecutive elements of a tile row as fp32 (16-byte, 8, 4 or 2-byte
 * accesses: the widest the alignment of N elements allows). */
template <int N>
__device__ __forceinline__ void get(const uint8_t *p, int32_t kind, float *out) {
    if (kind == KIND_F32) {
        if constexpr (N % 4 == 0) {
            KVP_UNROLL
            for (int i = 0; i < N; i += 4) {
                float4 v = *reinterpret_cast<const float4 *>(p + 4 * i);
                out[i] = v.x; out[i + 1] = v.y; out[i + 2] = v.z; out[i + 3] = v.w;
            }
        } else if constexpr (N % 2 == 0) {
            KVP_UNROLL
            for (int i = 0; i < N; i += 2) {
                float2 v = *reinterpret_cast<const float2 *>(p + 4 * i);
                out[i] = v.x; out[i + 1] = v.y;
            }
        } else {
            KVP_UNROLL
            for (int i = 0; i < N; i++) out[i] = reinterpret_cast<const float *>(p)[i];
        }
        return;
    }
    uint16_t h[N];
    if constexpr (N % 8 == 0) {
        KVP_UNROLL
        for (int i = 0; i < N; i += 8) {
            uint4 v = *reinterpret_cast<const uint4 *>(p + 2 * i);
            memcpy(h + i, &v, 16);
        }
    } else if constexpr (N % 4 == 0) {
        KVP_UNROLL
        for (int i = 0; i < N; i += 4) {
            uint2 v = *reinterpret_cast<const uint2 *>(p + 2 * i);
            memcpy(h + i, &v, 8);
        }
    } else if constexpr (N % 2 == 0) {
        KVP_UNROLL
        for (int i = 0; i < N; i += 2) {
            uint32_t v = *reinterpret_cast<const uint32_t *>(p + 2 * i);
            memcpy(h + i, &v, 4);
        }
    } else {
        KVP_UNROLL
        for (int i = 0; i < N; i++) h[i] = reinterpret_cast<const uint16_t *>(p)[i];
    }
    if (kind == KIND_F16) {
        KVP_UNROLL
        for (int i = 0; i < N; i++) out[i] = f16_bits(h[i]);
    } else {
        KVP_UNROLL
        for (int i = 0; i < N; i++) out[i] = kvp__bf16_to_f32(h[i]);
    }
}

/* Reduce-scatter of R partial sums over the L lanes of a token (L >= R,
 * both powers of two): each halving step trades half of the values with the
 * partner lane, then the last value is summed over what remains. Every lane
 * ends with the full sum of row row_of(lane); R - 1 + log2(L/R) shuffles
 * instead of R log2(L). */
template <int R, int L> struct rscatter {
    static __device__ __forceinline__ int row_of(int ln) {
        int r = 0;
        int n = R, off = L / 2;
        while (n > 1) {
            if (ln & off) r += n / 2;
            n /= 2;
            off /= 2;
        }
        return r;
    }
    static __device__ __forceinline__ float run(float *v, int ln) {
        int off = L / 2;
KVP_UNROLL
        for (int n = R; n > 1; n /= 2, off /= 2) {
            const bool upper = (ln & off) != 0;
KVP_UNROLL
            for (int i = 0; i < n / 2; i++) {
                float send = upper ? v[i] : v[i + n / 2];
                float keep = upper ? v[i + n / 2] : v[i];
                v[i] = keep + __shfl_xor_sync(0xffffffffu, send, off);
            }
        }
        float x = v[0];
        for (; off > 0; off /= 2) x += __shfl_xor_sync(0xffffffffu, x, off);
        return x;
    }
};

/* ---- loaders: one tile of K or V blocks into shared memory ------------------------------------
 *
 * Tile row i is token tt[i] of tile page pj[i], whose block (this kv head)
 * starts at blk[pj[i]]. The 16-byte loaders read words in the layout's own
 * order (consecutive threads, consecutive words: coalesced) and scatter the
 * decoded elements into token-major rows. They run in two steps: gather
 * (every word of a thread, K's and V's, loaded into registers back to back,
 * so a thread has all its loads in flight at once) and scatter (decode and
 * store); a load cannot be hoisted above a shared-memory store the compiler
 * cannot tell apart from it, so one fused loop would wait for each load in
 * turn. Page sizes the 16-byte loaders do not cover use the generic loader,
 * which decodes element by element with the reference decoder. */

struct tile_ref {
    uint8_t *base;          /* row 0 */
    int pitch;              /* bytes per row */
    int32_t kind;
    uint8_t *const *blk;    /* [pages of the tile] */
    const int32_t *pj, *tt; /* [TT] */
    float *vs;              /* value tiles: per-row multiplier of p (int8 value scales) */
    int ntok;
};

enum : int32_t { LD_GENERIC = 0, LD_PLAIN_TM, LD_PLAIN_DM, LD_K8, LD_K4, LD_V8, LD_V4 };

__device__ __forceinline__ int32_t loader_of(const kvp__blockfmt &f, bool fast) {
    if (!fast) return LD_GENERIC;
    if (f.format == KVP_FORMAT_INT8) return f.is_key ? LD_K8 : LD_V8;
    if (KVP__IS_INT4(f.format)) return f.is_key ? LD_K4 : LD_V4;
    return kvp__blockfmt_dim_major(&f) ? LD_PLAIN_DM : LD_PLAIN_TM;
}

__device__ __forceinline__ int esize_of(int32_t format) {
    return format == KVP_FORMAT_FP32 ? 4 : format == KVP_FORMAT_FP8_E4M3 ? 1 : 2;
}

/* Work items (16-byte words) of a tile. */
template <int D> __device__ __forceinline__ int items_of(int32_t ld, int32_t format, int ntok) {
    switch (ld) {
    case LD_PLAIN_TM: return ntok * (D * esize_of(format) / 16);
    case LD_PLAIN_DM: return (ntok + 16 / esize_of(format) - 1) / (16 / esize_of(format)) * D;
    case LD_K8: return (ntok + 3) / 4 * (D / 4);
    case LD_K4: return (ntok + 7) / 8 * (D / 4);
    case LD_V8: return (ntok + 3) / 4 * (D / 4);
    case LD_V4: return (ntok + 3) / 4 * (D / 8);
    default: return 0;
    }
}

/* A thread's words of one round: up to N of them (16-bit tiles need one
 * round; fp32 two), and the scale words of the integer formats (at most NS
 * items a thread). */
template <int D> struct frag {
    static constexpr int N = (shape<D>::TT * D * 2 / 16 + NT - 1) / NT;
    static constexpr int NS = (shape<D>::TT * D / 16 + NT - 1) / NT;
    uint4 w[N];
    uint2 s[NS], m[NS];
};

__device__ __forceinline__ bool scaled(int32_t ld) { return ld >= LD_K8; }

/* Items a thread handles per round, and a round's items for the block. */
template <int D> __device__ __forceinline__ int per_thread(int32_t ld) {
    return scaled(ld) ? frag<D>::NS : frag<D>::N;
}

/* Run f(k, c) for this thread's items c of a round: item k of PER. */
template <int PER, typename F>
__device__ __forceinline__ void each_item(int round, int total, F f) {
    const int first = round * PER * NT + (int)threadIdx.x;
    KVP_UNROLL
    for (int k = 0; k < PER; k++) {
        const int c = first + k * NT;
        if (c >= total) break;
        f(k, c);
    }
}

template <int D>
__device__ __forceinline__ void gather(const tile_ref &T, int32_t ld, int32_t format, int P, int round,
                                       frag<D> &fr) {
    constexpr int N = frag<D>::N, NS = frag<D>::NS;
    const int total = items_of<D>(ld, format, T.ntok), es = esize_of(format);
    switch (ld) {
    case LD_PLAIN_TM:
        each_item<N>(round, total, [&](int k, int c) {
            const int cpr = D * es / 16, i = c / cpr, w = c % cpr;
            fr.w[k] = *reinterpret_cast<const uint4 *>(T.blk[T.pj[i]] + (size_t)T.tt[i] * D * es + 16 * w);
        });
        break;
    case LD_PLAIN_DM:
        each_item<N>(round, total, [&](int k, int c) {
            const int i0 = c / D * (16 / es), d = c % D;
            fr.w[k] = *reinterpret_cast<const uint4 *>(T.blk[T.pj[i0]] + ((size_t)d * P + T.tt[i0]) * es);
        });
        break;
    case LD_K8:
    case LD_K4:
        each_item<NS>(round, total, [&](int k, int c) {
            const int q = c % (D / 4), i0 = c / (D / 4) * (ld == LD_K8 ? 4 : 8);
            const uint8_t *blk = T.blk[T.pj[i0]];
            const size_t data = ld == LD_K8 ? (size_t)P * D : (size_t)P * D / 2;
            const uint8_t *src = ld == LD_K8 ? blk + ((size_t)q * P + T.tt[i0]) * 4
                                             : blk + ((size_t)q * (P / 2) + T.tt[i0] / 2) * 4;
            fr.w[k] = *reinterpret_cast<const uint4 *>(src);
            fr.s[k] = *reinterpret_cast<const uint2 *>(blk + data + 8 * q);
            fr.m[k] = *reinterpret_cast<const uint2 *>(blk + data + 2 * D + 8 * q);
        });
        break;
    case LD_V8:
        each_item<NS>(round, total, [&](int k, int c) {
            const int q = c % (D / 4), i0 = c / (D / 4) * 4, t = T.tt[i0];
            const uint8_t *blk = T.blk[T.pj[i0]];
            fr.w[k] = *reinterpret_cast<const uint4 *>(blk + (size_t)(t / 4) * 4 * D + 16 * q);
            fr.s[k] = *reinterpret_cast<const uint2 *>(blk + (size_t)P * D + 2 * t);
        });
        break;
    case LD_V4:
        each_item<NS>(round, total, [&](int k, int c) {
            constexpr int G = (D + KVP__V4_GROUP - 1) / KVP__V4_GROUP;
            const int sq = c % (D / 8), i0 = c / (D / 8) * 4, t = T.tt[i0], g = (4 * sq) / 16;
            const uint8_t *blk = T.blk[T.pj[i0]];
            const uint8_t *sc = blk + (size_t)P * D / 2;
            fr.w[k] = *reinterpret_cast<const uint4 *>(blk + (size_t)(t / 4) * 2 * D + 16 * sq);
            fr.s[k] = *reinterpret_cast<const uint2 *>(sc + 2 * ((size_t)g * P + t));
            fr.m[k] = *reinterpret_cast<const uint2 *>(sc + 2 * (size_t)G * P + 2 * ((size_t)g * P + t));
        });
        break;
    default: break; /* LD_GENERIC */
    }
}

__device__ __forceinline__ void fp16x4(float s0, float s1, float s2, float s3, uint8_t *dst) {
    uint16_t h[4] = {f16_from(s0), f16_from(s1), f16_from(s2), f16_from(s3)};
    uint2 w;
    memcpy(&w, h, 8);
    *reinterpret_cast<uint2 *>(dst) = w;
}

template <int D>
__device__ __forceinline__ void scatter_item(const tile_ref &T, int32_t ld, int32_t format, uint4 word,
                                             uint2 sw, uint2 mw, int c) {
    const int es = esize_of(format);
    uint8_t b[16];
    memcpy(b, &word, 16);
    switch (ld) {
    case LD_PLAIN_TM: {
        const int cpr = D * es / 16, i = c / cpr, w = c % cpr;
        uint8_t *row = T.base + i * T.pitch;
        if (format != KVP_FORMAT_FP8_E4M3) { /* the same bytes in the tile */
            *reinterpret_cast<uint4 *>(row + 16 * w) = word;
        } else { /* 16 e4m3 -> 16 fp16, exactly */
            uint16_t h[16];
            KVP_UNROLL
            for (int e = 0; e < 16; e += 2) {
                __half2_raw r = __nv_cvt_fp8x2_to_halfraw2(
                    (__nv_fp8x2_storage_t)(b[e] | (b[e + 1] << 8)), __NV_E4M3);
                h[e] = r.x;
                h[e + 1] = r.y;
            }
            uint4 lo, hi;
            memcpy(&lo, h, 16);
            memcpy(&hi, h + 8, 16);
            *reinterpret_cast<uint4 *>(row + 32 * w) = lo;
            *reinterpret_cast<uint4 *>(row + 32 * w + 16) = hi;
        }
        break;
    }
    case LD_PLAIN_DM: { /* E tokens of channel d, transposed into rows */
        const int E = 16 / es, i0 = c / D * E, d = c % D;
        for (int e = 0; e < E; e++) {
            uint8_t *row = T.base + (i0 + e) * T.pitch;
            if (format == KVP_FORMAT_FP32) {
                float x;
                memcpy(&x, b + 4 * e, 4);
                reinterpret_cast<float *>(row)[d] = x;
            } else if (format == KVP_FORMAT_FP8_E4M3) {
                reinterpret_cast<uint16_t *>(row)[d] =
                    __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)b[e], __NV_E4M3).x;
            } else {
                uint16_t u;
                memcpy(&u, b + 2 * e, 2);
                reinterpret_cast<uint16_t *>(row)[d] = u;
            }
        }
        break;
    }
    case LD_K8: case LD_K4: { /* fmaf(scale, code, min) -> fp16 */
        const int q = c % (D / 4), i0 = c / (D / 4) * (ld == LD_K8 ? 4 : 8);
        uint16_t sh[4], mh[4];
        memcpy(sh, &sw, 8);
        memcpy(mh, &mw, 8);
        float sc[4], mn[4];
        KVP_UNROLL
        for (int j = 0; j < 4; j++) {
            sc[j] = kvp__f16_to_f32(sh[j]);
            mn[j] = kvp__f16_to_f32(mh[j]);
        }
        if (ld == LD_K8) {
            KVP_UNROLL
            for (int e = 0; e < 4; e++) /* token e: bytes 4e .. 4e+3 are channels 4q .. 4q+3 */
                fp16x4(fmaf(sc[0], (float)b[4 * e], mn[0]), fmaf(sc[1], (float)b[4 * e + 1], mn[1]),
                       fmaf(sc[2], (float)b[4 * e + 2], mn[2]), fmaf(sc[3], (float)b[4 * e + 3], mn[3]),
                       T.base + (i0 + e) * T.pitch + 8 * q);
        } else {
            KVP_UNROLL
            for (int e = 0; e < 8; e++) { /* token e: pair e/2, nibble e%2 */
                const int o = 4 * (e / 2), sh4 = 4 * (e & 1);
                fp16x4(fmaf(sc[0], (float)((b[o] >> sh4) & 15u), mn[0]),
                       fmaf(sc[1], (float)((b[o + 1] >> sh4) & 15u), mn[1]),
                       fmaf(sc[2], (float)((b[o + 2] >> sh4) & 15u), mn[2]),
                       fmaf(sc[3], (float)((b[o + 3] >> sh4) & 15u), mn[3]),
                       T.base + (i0 + e) * T.pitch + 8 * q);
            }
        }
        break;
    }
    case LD_V8: { /* codes exactly; the token scales go to vs */
        const int q = c % (D / 4), i0 = c / (D / 4) * 4;
        KVP_UNROLL
        for (int e = 0; e < 4; e++) /* token e: channel 4q + j is byte 4j + e */
            fp16x4((float)(int8_t)b[e], (float)(int8_t)b[4 + e], (float)(int8_t)b[8 + e],
                   (float)(int8_t)b[12 + e], T.base + (i0 + e) * T.pitch + 8 * q);
        if (q == 0) {
            uint16_t sh[4];
            memcpy(sh, &sw, 8);
            KVP_UNROLL
            for (int e = 0; e < 4; e++) T.vs[i0 + e] = kvp__f16_to_f32(sh[e]);
        }
        break;
    }
    default: { /* LD_V4: slot 4sq + j of group g holds channels 32g + s (low), + W/2 (high) */
        const int sq = c % (D / 8), i0 = c / (D / 8) * 4, g = (4 * sq) / 16;
        const int w = D - g * KVP__V4_GROUP < KVP__V4_GROUP ? D - g * KVP__V4_GROUP : KVP__V4_GROUP;
        const int d0 = g * KVP__V4_GROUP + (4 * sq) % 16;
        uint16_t sh[4], mh[4];
        memcpy(sh, &sw, 8);
        memcpy(mh, &mw, 8);
        KVP_UNROLL
        for (int e = 0; e < 4; e++) {
            const float sc = kvp__f16_to_f32(sh[e]), mn = kvp__f16_to_f32(mh[e]);
            uint8_t *row = T.base + (i0 + e) * T.pitch;
            fp16x4(fmaf(sc, (float)(b[e] & 15u), mn), fmaf(sc, (float)(b[4 + e] & 15u), mn),
                   fmaf(sc, (float)(b[8 + e] & 15u), mn), fmaf(sc, (float)(b[12 + e] & 15u), mn),
                   row + 2 * d0);
            fp16x4(fmaf(sc, (float)(b[e] >> 4), mn), fmaf(sc, (float)(b[4 + e] >> 4), mn),
                   fmaf(sc, (float)(b[8 + e] >> 4), mn), fmaf(sc, (float)(b[12 + e] >> 4), mn),
                   row + 2 * (d0 + w / 2));
        }
        break;
    }
    }
}

template <int D>
__device__ __forceinline__ void scatter(const tile_ref &T, int32_t ld, int32_t format, int round,
                                        const frag<D> &fr) {
    const int total = items_of<D>(ld, format, T.ntok);
    if (ld == LD_GENERIC) return;
    if (scaled(ld)) {
        each_item<frag<D>::NS>(round, total, [&](int k, int c) {
            scatter_item<D>(T, ld, format, fr.w[k], fr.s[k], fr.m[k], c);
        });
    } else {
        const uint2 none = make_uint2(0u, 0u);
        each_item<frag<D>::N>(round, total, [&](int k, int c) {
            scatter_item<D>(T, ld, format, fr.w[k], none, none, c);
        });
    }
}

template <int D>
__device__ void load_generic(const tile_ref &T, const kvp__blockfmt &f) {
    const bool v8 = !f.is_key && f.format == KVP_FORMAT_INT8;
    for (int c = threadIdx.x; c < T.ntok * D; c += NT) {
        int i = c / D, d = c % D;
        const uint8_t *blk = T.blk[T.pj[i]];
        float v;
        if (v8) { /* as the 16-byte loader: the code exactly, the token's scale to vs */
            v = (float)(int8_t)blk[kvp__v8_offset(f.page_size, D, T.tt[i], d)];
            if (d == 0)
                T.vs[i] = kvp__f16_to_f32(kvp__load_u16(blk + (size_t)f.page_size * D + 2 * T.tt[i]));
        } else { /* fp8: the scale is applied later (logit / p), decode with 1 */
            v = kvp__block_decode_one(&f, blk, T.tt[i], d, 1.0f);
        }
        put(T.base + i * T.pitch, d, T.kind, v);
    }
}

/* int4 keys: the 16-byte loader decoded the outlier channels from zeroed int4
 * entries (0); write their int8 values (docs/formats.md) over them. The
 * generic loader's kvp__block_decode_one handles them already. */
template <int D>
__device__ void fix_k4_outliers(const tile_ref &T, const kvp__blockfmt &f) {
    const int R = KVP__K4_OUTLIERS(f.format, D); /* the format's count: 4 per 32 channels, or D/32 (int4_v1) */
    if (R == 0) return; /* uniform */
    __syncthreads(); /* the loader's writes to these channels come first */
    for (int c = threadIdx.x; c < T.ntok * R; c += NT) {
        const int i = c / R, j = c % R;
        const uint8_t *ot = kvp__k4_table(&f, T.blk[T.pj[i]]);
        const int d = kvp__load_u16(ot + 2 * j);
        if (d >= D) continue; /* not written by the encoder: the entry is ignored */
        const float os = kvp__f16_to_f32(kvp__load_u16(ot + 2 * (R + j)));
        const float om = kvp__f16_to_f32(kvp__load_u16(ot + 2 * (2 * R + j)));
        put(T.base + i * T.pitch, d, T.kind, fmaf(os, (float)ot[6 * R + kvp__k4_code_offset(f.format, f.page_size, j, T.tt[i])], om));
    }
}

/* Phase B: the K and V tiles. Value tiles also set vs[i], the multiplier of
 * p for row i: int8 values' token scales (16-byte loader), else `vuni` (an
 * fp8 scale, or 1). */
template <int D>
__device__ void load_tiles(const tile_ref &K, const kvp__blockfmt &fk, bool fast_k, const tile_ref &V,
                           const kvp__blockfmt &fv, bool fast_v, int P, float vuni) {
    const int32_t lk = loader_of(fk, fast_k), lv = loader_of(fv, fast_v);
    if (fv.format != KVP_FORMAT_INT8) /* int8 values: the loaders set the token scales */
        for (int i = threadIdx.x; i < V.ntok; i += NT) V.vs[i] = vuni;
    const int nk = items_of<D>(lk, fk.format, K.ntok), nv = items_of<D>(lv, fv.format, V.ntok);
    const int ck = per_thread<D>(lk) * NT, cv = per_thread<D>(lv) * NT;
    const int rounds_k = (nk + ck - 1) / ck, rounds_v = (nv + cv - 1) / cv;
    const int rounds = rounds_k > rounds_v ? rounds_k : rounds_v;
    for (int r = 0; r < rounds; r++) {
        frag<D> a, b;
        gather<D>(K, lk, fk.format, P, r, a);
        gather<D>(V, lv, fv.format, P, r, b);
        scatter<D>(K, lk, fk.format, r, a);
        scatter<D>(V, lv, fv.format, r, b);
    }
    if (lk == LD_GENERIC) load_generic<D>(K, fk);
    if (lv == LD_GENERIC) load_generic<D>(V, fv);
    if (lk == LD_K4) fix_k4_outliers<D>(K, fk);
}

/* ---- the kernel ------------------------------------------------------------------------------- */

/* CTAs per SM the register allocation must leave room for: 3 (168
 * registers a thread) up to 4 query rows per CTA, 2 (255) at 8. Left to
 * itself ptxas aims at more CTAs for some variants and spills (up to 200 bytes
 * a thread at head_dim 80/96, 8 rows); make cuda-resources gates on it. */
template <int R> constexpr int min_ctas() { return R == 8 ? 2 : 3; }

/* A tile of the copy pipeline: pages [cur, cur + np) of the sequence, its
 * tokens from position pos0 on. */
struct ptile {
    int32_t cur, np, pos0, ntok;
};

/* The tiles of a CTA's pages when pages are no larger than a tile: as many
 * whole pages as fit, the staging page alone, tiles no row can see skipped.
 * Every thread walks them itself (the pipeline keeps three cursors: the tile
 * computed, the tile whose copy starts, the tile whose page ids are fetched). */
struct walk {
    int32_t end, npages, ppt, P, kv_len, lo_min, hi_max;
    bool last_staging;
    /* The tile at cursor pg (then moved past it), or false after the last. */
    __device__ __forceinline__ bool next(int32_t &pg, ptile &t) const {
        while (pg < end) {
            int32_t np = ppt < end - pg ? ppt : end - pg;
            if (last_staging && np > 1 && pg + np == npages) np--; /* the staging page alone */
            t.cur = pg;
            t.np = np;
            t.pos0 = pg * P;
            t.ntok = np * P < kv_len - t.pos0 ? np * P : kv_len - t.pos0;
            pg += np;
            if (t.pos0 <= hi_max && t.pos0 + t.ntok - 1 >= lo_min) return true;
        }
        return false;
    }
};

/* Element d of output row `row` (token, query head) in the output dtype. */
__device__ __forceinline__ void store_out(const params &p, size_t row, int d, float x) {
    uint8_t *op = p.out + (row * (size_t)p.g.D + (size_t)d) * (size_t)p.esize;
    if (p.dtype == KVP_FORMAT_FP32) *reinterpret_cast<float *>(op) = x;
    else if (p.dtype == KVP_FORMAT_FP16) *reinterpret_cast<uint16_t *>(op) = f16_from(x);
    else *reinterpret_cast<uint16_t *>(op) = bf16_from(x);
}

/* The kernel body; PIPE: the copy pipeline, else the single-buffer loader
 * (two kernels, so that each gets the registers of its own path). */
template <int D, int R, bool PIPE>
__device__ __forceinline__ void attention_body(const params &p) {
    using S = shape<D>;
    constexpr int TT = S::TT, LPT = S::LPT, VEC = S::VEC, TG = S::TG, TPR = S::TPR, TS = S::TS;
    constexpr int RW = (R + NW - 1) / NW; /* softmax rows per warp */
    const int tid = (int)threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const kvp__geo &g = p.g;
    const int P = g.P;

    /* ---- shared memory ---- */
    KVP_DYNAMIC_SMEM(uint8_t, smem);
    int32_t kind_k = p.kind[0], kind_v = p.kind[1];
    constexpr bool pipe = PIPE;
    /* staging tiles are fp16 on both sides; size the tiles for the widest kind */
    const int kpitch_max = smem_plan<D>::pitch(kind_k), vpitch_max = smem_plan<D>::pitch(kind_v);
    const int stage_bytes = p.stage_k + p.stage_v; /* pipeline: stage s at smem + s * stage_bytes */
    uint8_t *ktile = pipe ? smem + p.stages * stage_bytes : smem; /* decoded tiles */
    uint8_t *vtile = ktile + (pipe ? p.dec_k : TT * kpitch_max);
    const int tiles = pipe ? p.stages * stage_bytes + p.dec_k + p.dec_v : TT * (kpitch_max + vpitch_max);
    uint8_t *after = smem + smem_plan<D>::main_area(tiles, R);
    float *Sl = reinterpret_cast<float *>(after);            /* [R][TT] logits */
    float *Pv = Sl + R * TT;                                   /* [TT][R] p for o += p v */
    float *vs = Pv + TT * R;                                   /* [TT] value multipliers */
    float *alpha = vs + TT;                                    /* [R] */
    float *mfin = alpha + R;                                   /* [R] */
    float *lfin = mfin + R;                                    /* [R] */
    int32_t *rlo = reinterpret_cast<int32_t *>(lfin + R);      /* [R] */
    int32_t *pj = rlo + R;                                     /* [TT] */
    int32_t *tt = pj + TT;                                     /* [TT] */
    uint8_t **kblk = reinterpret_cast<uint8_t **>(after + 2 * R * TT * 4 + TT * 4 + 16 * R + TT * 8);
    uint8_t **vblk = kblk + TT;
    uint8_t **ptab = reinterpret_cast<uint8_t **>(after + smem_plan<D>::rest(R)); /* [stages][K, V][TT] */
    int32_t *s_ids = reinterpret_cast<int32_t *>(ptab + 2 * TT * (pipe ? p.stages : 0)); /* [stages][TT] */
    float *red = reinterpret_cast<float *>(smem);              /* [TS][R][D], after the tiles */
    __shared__ int32_t s_item[4];
    __shared__ int32_t s_rhi[8];
    __shared__ int32_t s_tile_staging;

    /* ---- which work item ---- */
    const int32_t item = (int32_t)blockIdx.x;
    if (tid == 0) {
        int32_t lo = 0, hi = p.batch - 1;
        while (lo < hi) { /* last b with item_start[b] <= item */
            int32_t mid = (lo + hi + 1) / 2;
            if (p.item_start[mid] <= item) lo = mid;
            else hi = mid - 1;
        }
        s_item[0] = lo;
    }
    __syncthreads();
    const int32_t b = s_item[0];
    const int32_t q_len = p.qo[b + 1] - p.qo[b];
    const int32_t npages = p.indptr[b + 1] - p.indptr[b];
    const int32_t kv_len = npages == 0 ? 0 : (npages - 1) * P + p.last[b];
    const int32_t rows_per_head = q_len * p.group, RB = (rows_per_head + R - 1) / R;
    const int32_t nsplit = p.splits[b], local = item - p.item_start[b];
    const int32_t split = local % nsplit, unit = local / nsplit;
    const int32_t h = unit / RB, rb = unit % RB;
    const int32_t qbase = p.qo[b];

    /* ---- rows: positions, masks; q slices in registers ---- */
    if (tid < R) {
        int32_t rr = rb * R + tid, lo = INT32_MAX, hi = -1;
        if (rr < rows_per_head) {
            int32_t i = rr / p.group, pos = kv_len - q_len + i;
            hi = p.causal ? pos : kv_len - 1;
            lo = p.window >= 0 && pos - p.window > 0 ? pos - p.window : 0;
        }
        rlo[tid] = lo;
        s_rhi[tid] = hi;
    }
    const int tg = tid / LPT, ln = tid % LPT;
    float qv[R][VEC];
    KVP_UNROLL
    for (int r = 0; r < R; r++) {
        int32_t rr = rb * R + r;
        if (rr < rows_per_head) {
            int32_t i = rr / p.group, qh = h * p.group + rr % p.group;
            const uint8_t *qp = p.q + (((size_t)(qbase + i) * p.q_heads + qh) * D + ln * VEC) * p.esize;
            KVP_UNROLL
            for (int v = 0; v < VEC; v++) qv[r][v] = kvp__load_elem(qp + v * p.esize, p.dtype) * p.sm_scale;
        } else {
            KVP_UNROLL
            for (int v = 0; v < VEC; v++) qv[r][v] = 0.0f;
        }
    }
    __syncthreads();
    int32_t lo_min = INT32_MAX, hi_max = -1;
    KVP_UNROLL
    for (int r = 0; r < R; r++) {
        lo_min = rlo[r] < lo_min ? rlo[r] : lo_min;
        hi_max = s_rhi[r] > hi_max ? s_rhi[r] : hi_max;
    }

    /* ---- pages of this split, trimmed to what the rows can see ---- */
    int32_t first = split * p.split_pages[b];
    int32_t end = first + p.split_pages[b] < npages ? first + p.split_pages[b] : npages;
    while (first < end && (first + 1) * P - 1 < lo_min) first++;
    while (end > first && (end - 1) * P > hi_max) end--;
    const bool last_staging = npages > 0 && p.indices[p.indptr[b] + npages - 1] >= g.num_pages;
    const float kscale_pool = g.fp8[0] != nullptr ? g.fp8[0][h] : 1.0f;
    const float vscale_pool = g.fp8[1] != nullptr ? g.fp8[1][h] : 1.0f;

    /* online-softmax state: rows r = warp + NW*k, lanes over tokens */
    float m_run[RW], l_run[RW];
    KVP_UNROLL
    for (int k = 0; k < RW; k++) {
        m_run[k] = -INFINITY;
        l_run[k] = 0.0f;
    }
    /* o accumulators: 2 channels of the R rows, for token slice `slice` */
    const int slice = tid / TPR, c2 = 2 * (tid % TPR);
    float acc[R][2];
    KVP_UNROLL
    for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = 0.0f;

    const int ppt = P <= TT ? TT / P : 1; /* whole pages per tile */

    /* ---- integer keys (copy pipeline, pool int8 / int4 keys): the layout of smem_plan::kint_bytes ---- */
    constexpr int QD = D / 4; /* channel quads */
    static_assert(QD <= 64 && KVP__K4_OUTLIERS(KVP_FORMAT_INT4, D) <= 32, "a lane holds at most 2 quads, and at most 1 outlier entry");
    const bool kint = pipe && p.kint != 0;
    uint8_t *kint_at = reinterpret_cast<uint8_t *>(s_ids + TT * (pipe ? p.stages : 0));
    float *s_qf = reinterpret_cast<float *>(kint_at);                      /* [R][D] */
    uint8_t *s_qq = kint_at + R * D * 4;                                   /* [ppt] x qq_page */
    float *s_sc = reinterpret_cast<float *>(s_qq + ppt * smem_plan<D>::qq_page(R)); /* [ppt][R][2] */
    int32_t *s_part = reinterpret_cast<int32_t *>(s_sc + smem_plan<D>::up16(ppt * R * 8) / 4); /* [NW][R][TT] */
    float *s_ko = reinterpret_cast<float *>(s_part + NW * R * TT);        /* [ppt][R][ro] */
    const bool k8 = g.fmt[0].format == KVP_FORMAT_INT8;

    /* Per page j of the tile in stage blocks kb and row r: the query folded
     * with the page's channel scales, q' = q * scale, quantized to 15 bits
     * against max|q'| (the CPU's VNNI kernels use the cheaper bound
     * max|q| * max(scale), which wastes bits when a few channels are wide):
     * x = rne(q' * 16256 / max|q'|) = 128 hi + lo, hi in -127..127 and lo in
     * 0..127 as two signed bytes per channel, the rounding error times the
 * middle code (127.5, 7.5) moved to the constant. The
     * logit is then step * (128 dot(hi, c) + dot(lo, c)) + sum q * min, and
     * for int4 keys the outlier channels' int8 part in fp32 (their int4
     * scale and min are excluded even when the bytes are not 0). One warp
     * per (page, row). */
    auto prep_int = [&](uint8_t *const *kb, int32_t np) {
        const int RO = KVP__K4_OUTLIERS(g.fmt[0].format, D); /* int4 keys' outlier channels; 0 for int8 */
        for (int pr = warp; pr < np * R; pr += NW) { /* uniform per warp */
            const int j = pr / R, r = pr - j * R;
            const uint8_t *blk = kb[j];
            const uint8_t *sc = blk + (k8 ? (size_t)P * D : (size_t)P * D / 2), *mn = sc + 2 * D;
            const float *qr = s_qf + r * D;
            const uint8_t *ot = k8 ? nullptr : blk + (size_t)P * D / 2 + 4 * D; /* the outlier table */
            /* int4: which of this lane's channels (4 qd + k of its quads qd =
             * lane + 32 m: bit 4 m + k) are outlier channels, whose int4 scale
             * and min do not count; lane o holds entry o (D and above: none) */
            const int oent = !k8 && lane < RO ? (int)kvp__load_u16(ot + 2 * lane) : D;
            unsigned omask = 0;
            for (int o = 0; o < RO; o++) { /* uniform */
                const int d = __shfl_sync(0xffffffffu, oent, o);
                if (d < D && ((d >> 2) & 31) == lane) omask |= 1u << (4 * (d >> 7) + (d & 3));
            }
            float am = 0.0f; /* max |q'| */
            for (int qd = lane, mq = 0; qd < QD; qd += 32, mq++)
                KVP_UNROLL
                for (int k = 0; k < 4; k++) {
                    const int d = 4 * qd + k;
                    const bool outl = (omask >> (4 * mq + k)) & 1u;
                    const float sd = outl ? 0.0f : f16_bits(kvp__load_u16(sc + 2 * d));
                    am = fmaxf(am, fabsf(qr[d] * sd));
                }
            am = kvp__warp_max(am);
            const float inv = am > 0.0f ? 16256.0f / am : 0.0f, step = am * (1.0f / 16256.0f);
            const float mid = k8 ? 127.5f : 7.5f;
            float cst = 0.0f;
            uint2 *qq = reinterpret_cast<uint2 *>(s_qq + j * smem_plan<D>::qq_page(R)) + r * QD;
            for (int qd = lane, mq = 0; qd < QD; qd += 32, mq++) {
                uint32_t hw = 0, lw = 0;
                KVP_UNROLL
                for (int k = 0; k < 4; k++) {
                    const int d = 4 * qd + k;
                    const bool outl = (omask >> (4 * mq + k)) & 1u;
                    const float s = outl ? 0.0f : f16_bits(kvp__load_u16(sc + 2 * d));
                    const float m = outl ? 0.0f : f16_bits(kvp__load_u16(mn + 2 * d));
                    float v = qr[d] * s * inv; /* |v| <= 16256, but for rounding */
                    v = v != v ? 0.0f : fminf(fmaxf(v, -16256.0f), 16256.0f); /* NaN: foreign bytes */
                    const int x = __float2int_rn(v);
                    /* q * min, and q's rounding error charged at the middle code */
                    cst = fmaf(qr[d], m, fmaf(qr[d] * s - step * (float)x, mid, cst));
                    hw |= (uint32_t)(uint8_t)(int8_t)(x >> 7) << (8 * k);
                    lw |= (uint32_t)(x & 127) << (8 * k);
                }
                qq[qd] = make_uint2(hw, lw);
            }
            float ko = 0.0f, oc = 0.0f; /* lane o < RO: outlier o's coefficient and constant */
            if (!k8 && lane < RO) {
                const int d = oent;
                if (d < D) {
                    ko = qr[d] * f16_bits(kvp__load_u16(ot + 2 * (RO + lane)));
                    oc = qr[d] * f16_bits(kvp__load_u16(ot + 2 * (2 * RO + lane)));
                }
            }
            cst = kvp__warp_sum(cst + oc);
            if (lane < RO) s_ko[(j * R + r) * RO + lane] = ko;
            if (lane == 0) {
                s_sc[2 * (j * R + r)] = step;
                s_sc[2 * (j * R + r) + 1] = cst;
            }
        }
    };

    /* Logits of a tile of integer keys: a lane per token (two at 16 tokens a
     * tile), each warp (and half) a share of the channel quads of every token,
     * dp4a of the key codes (u8) against hi and lo (s8);
     * the warps' sums meet in s_part. Then a thread per (row, token) forms
     * the logit, adds int4 outliers, soft cap and mask, into Sl. */
    auto logits_int = [&](uint8_t *const *kb, int32_t ntok, int32_t pos0) {
        const int RO = KVP__K4_OUTLIERS(g.fmt[0].format, D);
        constexpr int LT = 32 / TT; /* lanes per token: 1, or 2 at head_dim 256 */
        const int t = lane % TT, half = lane / TT;
        int acc8[R]; /* 128 dot(hi, c) + dot(lo, c), at most 2^30 in magnitude */
        KVP_UNROLL
        for (int r = 0; r < R; r++) acc8[r] = 0;
        if (t < ntok) {
            const int j = pj[t], tk = tt[t];
            const uint8_t *blk = kb[j];
            const uint4 *qq = reinterpret_cast<const uint4 *>(s_qq + j * smem_plan<D>::qq_page(R));
            /* quad pairs (2pp, 2pp+1), dealt round the (warp, half) lanes:
             * one 16-byte broadcast read of the query words a pair and row */
            for (int pp = warp * LT + half; pp < QD / 2; pp += NW * LT) {
                uint32_t w0, w1;
                if (k8) {
                    w0 = *reinterpret_cast<const uint32_t *>(blk + ((size_t)(2 * pp) * P + tk) * 4);
                    w1 = *reinterpret_cast<const uint32_t *>(blk + ((size_t)(2 * pp + 1) * P + tk) * 4);
                } else {
                    const int sh = 4 * (tk & 1);
                    w0 = *reinterpret_cast<const uint32_t *>(blk + ((size_t)(2 * pp) * (P / 2) + tk / 2) * 4);
                    w1 = *reinterpret_cast<const uint32_t *>(blk + ((size_t)(2 * pp + 1) * (P / 2) + tk / 2) * 4);
                    w0 = (w0 >> sh) & 0x0F0F0F0Fu;
                    w1 = (w1 >> sh) & 0x0F0F0F0Fu;
                }
                KVP_UNROLL
                for (int r = 0; r < R; r++) {
                    const uint4 x = qq[r * (QD / 2) + pp]; /* hi, lo of quad 2pp; hi, lo of 2pp+1 */
                    acc8[r] = kvp_dp4a_us(w1, x.w, kvp_dp4a_us(w0, x.y, acc8[r])) +
                              128 * kvp_dp4a_us(w1, x.z, kvp_dp4a_us(w0, x.x, 0));
                }
            }
        }
        KVP_UNROLL
        for (int r = 0; r < R; r++) {
            int x = acc8[r];
            if (LT == 2) x += __shfl_xor_sync(0xffffffffu, x, 16);
            if (half == 0) s_part[(warp * R + r) * TT + t] = x;
        }
        __syncthreads(); /* the warps' parts */
        for (int e = tid; e < R * TT; e += NT) {
            const int r = e / TT, u = e - r * TT;
            if (u >= ntok) continue;
            int32_t sum = 0;
            KVP_UNROLL
            for (int w = 0; w < NW; w++) sum += s_part[(w * R + r) * TT + u];
            const int j = pj[u];
            float x = fmaf(s_sc[2 * (j * R + r)], (float)sum, s_sc[2 * (j * R + r) + 1]);
            if (!k8) {
                const uint8_t *codes = kb[j] + (size_t)P * D / 2 + 4 * D + 6 * RO;
                const float *ko = &s_ko[(j * R + r) * RO];
                if (kvp__k4_quads(g.fmt[0].format)) {
                    /* channel quads: a token's 4 codes in one aligned word
                     * (the offset P*D/2 + 4D + 6*RO is a multiple of 8) */
                    for (int o = 0; o < RO; o += 4) {
                        const uint32_t w = *reinterpret_cast<const uint32_t *>(codes + ((size_t)(o / 4) * P + tt[u]) * 4);
                        x = fmaf(ko[o], (float)(w & 0xFFu), x);
                        x = fmaf(ko[o + 1], (float)((w >> 8) & 0xFFu), x);
                        x = fmaf(ko[o + 2], (float)((w >> 16) & 0xFFu), x);
                        x = fmaf(ko[o + 3], (float)(w >> 24), x);
                    }
                } else {
                    for (int o = 0; o < RO; o++) x = fmaf(ko[o], (float)codes[(size_t)o * P + tt[u]], x);
                }
            }
            if (p.soft_cap > 0.0f) x = p.soft_cap * tanhf(x / p.soft_cap);
            const int32_t pos = pos0 + u;
            if (pos < rlo[r] || pos > s_rhi[r]) x = -INFINITY;
            Sl[r * TT + u] = x;
        }
    };

    /* C, D, E of one tile: K rows at kt (pitch kp, kind kk), V rows at vt. */
    auto compute = [&](const uint8_t *kt, int kp, int32_t kk, const uint8_t *vt, int vp, int32_t vk,
                       float kscale, int32_t ntok, int32_t pos0, uint8_t *const *kint_blocks) {
        /* C: logits. Tokens base+tg; lanes ln hold channels [ln*VEC, +VEC). */
        if (kint_blocks != nullptr) {
            logits_int(kint_blocks, ntok, pos0);
        } else {
            const int es = kk == KIND_F32 ? 4 : 2;
            for (int base = 0; base < ntok; base += TG) { /* uniform trip count */
                const int t = base + tg;
                float kv[VEC];
                if (t < ntok) get<VEC>(kt + t * kp + ln * VEC * es, kk, kv);
                else
                    KVP_UNROLL
                    for (int v = 0; v < VEC; v++) kv[v] = 0.0f;
                float part[R];
                KVP_UNROLL
                for (int r = 0; r < R; r++) {
                    float a = 0.0f;
                    KVP_UNROLL
                    for (int v = 0; v < VEC; v++) a = fmaf(qv[r][v], kv[v], a);
                    part[r] = a;
                }
                float x = rscatter<R, LPT>::run(part, ln);
                const int r = rscatter<R, LPT>::row_of(ln);
                if (t < ntok && ln % (LPT / R) == 0) {
                    x *= kscale;
                    if (p.soft_cap > 0.0f) x = p.soft_cap * tanhf(x / p.soft_cap);
                    int32_t pos = pos0 + t;
                    if (pos < rlo[r] || pos > s_rhi[r]) x = -INFINITY;
                    Sl[r * TT + t] = x;
                }
            }
        }
        __syncthreads(); /* C */

        /* D: online softmax, one warp per row, lanes over tokens */
        KVP_UNROLL
        for (int k = 0; k < RW; k++) {
            const int r = warp + NW * k;
            if (r >= R) break; /* uniform per warp */
            float s = lane < ntok ? Sl[r * TT + lane] : -INFINITY;
            float mt = kvp__warp_max(s);
            float m_new = m_run[k] > mt ? m_run[k] : mt, a = 1.0f, pr = 0.0f;
            if (m_new != -INFINITY) {
                a = expf(m_run[k] - m_new); /* 0 when nothing was seen yet */
                pr = s == -INFINITY ? 0.0f : expf(s - m_new);
            }
            l_run[k] = l_run[k] * a + pr;
            m_run[k] = m_new;
            if (lane < ntok) Pv[lane * R + r] = pr * vs[lane];
            if (lane == 0) alpha[r] = a;
        }
        __syncthreads(); /* D */

        /* E: o = o * alpha + sum_t p v */
        if (slice < TS) {
            const int es = vk == KIND_F32 ? 4 : 2;
            KVP_UNROLL
            for (int r = 0; r < R; r++) {
                acc[r][0] *= alpha[r];
                acc[r][1] *= alpha[r];
            }
            for (int t = slice; t < ntok; t += TS) {
                float v[2], pr[R];
                get<2>(vt + t * vp + c2 * es, vk, v);
                get<R>(reinterpret_cast<const uint8_t *>(Pv + t * R), KIND_F32, pr);
                KVP_UNROLL
                for (int r = 0; r < R; r++) {
                    if (pr[r] != 0.0f) { /* masked tokens never touch o (as the CPU) */
                        acc[r][0] = fmaf(pr[r], v[0], acc[r][0]);
                        acc[r][1] = fmaf(pr[r], v[1], acc[r][1]);
                    }
                }
            }
        }
    };

    if constexpr (PIPE) {
        /* ---- the copy pipeline: tile i is computed while tiles i+1 .. i+S-1 are in flight ---- */
        const int S = p.stages;
        for (int e = tid; e < S * ppt; e += NT) { /* block j of stage s, K and V */
            const int s = e / ppt, j = e % ppt;
            uint8_t *st = smem + s * stage_bytes;
            ptab[2 * s * TT + j] = st + j * p.slot_k;
            ptab[(2 * s + 1) * TT + j] = st + p.stage_k + j * p.slot_v;
        }
        if (kint) /* the rows' queries, scaled (published by the barrier below) */
            for (int e = tid; e < R * D; e += NT) {
                const int r = e / D, d = e - r * D;
                const int32_t rr = rb * R + r;
                float v = 0.0f;
                if (rr < rows_per_head) {
                    const int32_t i = rr / p.group, qh = h * p.group + rr % p.group;
                    v = kvp__load_elem(p.q + (((size_t)(qbase + i) * p.q_heads + qh) * D + d) * p.esize,
                                       p.dtype) * p.sm_scale;
                }
                s_qf[e] = v;
            }
        for (int i = tid; i < TT; i += NT) {
            pj[i] = i / P;
            tt[i] = i % P;
        }
        const walk W = {end, npages, ppt, P, kv_len, lo_min, hi_max, last_staging};
        const int32_t *ids_b = p.indices + p.indptr[b];
        /* Start copying tile F into stage s: its blocks whole (pool: copy_k / copy_v
         * bytes; the staging page: sblock), 16 bytes a thread at a time, page
         * ids from s_ids[s] (fetched a tile earlier). */
        auto issue = [&](const ptile &F, int s) {
            const bool fstg = last_staging && F.cur == npages - 1;
            const int ck = (fstg ? (int)g.sblock : p.copy_k) >> 4, cv = (fstg ? (int)g.sblock : p.copy_v) >> 4;
            const int nk = F.np * ck, total = nk + F.np * cv;
            const int32_t *ids = s_ids + s * TT;
            uint8_t *st = smem + s * stage_bytes;
            for (int c = tid; c < total; c += NT) {
                const int side = c >= nk ? 1 : 0, cc = side ? c - nk : c, per = side ? cv : ck;
                const int j = cc / per, w = cc - j * per;
                const uint8_t *src = kvp__geo_block(g, side, ids[j], h) + 16 * w;
                uint8_t *dst = st + (side ? p.stage_k + j * p.slot_v : j * p.slot_k) + 16 * w;
                kvp_cp_async16(dst, src);
            }
        };
        int32_t c_comp = first, c_issue = first, c_ids = first; /* the three cursors */
        ptile T, F;
        for (int s = 0; s < S; s++) /* page ids of the first S tiles */
            if (W.next(c_ids, F) && tid < F.np) s_ids[s * TT + tid] = ids_b[F.cur + tid];
        __syncthreads();
        for (int s = 0; s < S - 1; s++) {
            if (W.next(c_issue, F)) issue(F, s);
            kvp_cp_async_commit(); /* one group per tile, empty or not */
        }
        for (int i = 0; W.next(c_comp, T); i++) {
            if (S == 3) kvp_cp_async_wait<1>();
            else kvp_cp_async_wait<0>();
            __syncthreads(); /* tile i has landed for every thread; tile i-1 is done with */
            if (W.next(c_issue, F)) issue(F, (i + S - 1) % S); /* into tile i-1's stage */
            kvp_cp_async_commit();
            /* page ids of tile i+S: loaded now, stored once this tile is done
             * (into s_ids[i % S], whose tile was issued S-1 tiles ago) */
            const bool idn = W.next(c_ids, F) && tid < F.np;
            const int32_t nid = idn ? ids_b[F.cur + tid] : 0;

            const int s = i % S;
            const bool stg = last_staging && T.cur == npages - 1;
            const int32_t kk = stg ? KIND_F16 : kind_k, vk = stg ? KIND_F16 : kind_v;
            const bool dk = stg ? p.sdirect != 0 : p.direct[0] != 0;
            const bool dv = stg || p.direct[1] != 0;
            const bool ki = kint && !stg; /* integer keys: no K tile, logits from the codes */
            uint8_t *st = smem + s * stage_bytes;
            if (!dk || !dv) { /* B: decode from the stage into the tiles */
                if (ki) prep_int(ptab + 2 * s * TT, T.np);
                tile_ref K, V;
                K.base = ktile;
                K.pitch = smem_plan<D>::pitch(kk);
                K.kind = kk;
                K.blk = ptab + 2 * s * TT;
                K.pj = pj;
                K.tt = tt;
                K.vs = nullptr;
                K.ntok = dk || ki ? 0 : T.ntok;
                V = K;
                V.base = vtile;
                V.pitch = smem_plan<D>::pitch(vk);
                V.kind = vk;
                V.blk = ptab + (2 * s + 1) * TT;
                V.vs = vs;
                V.ntok = dv ? 0 : T.ntok;
                load_tiles<D>(K, stg ? g.sfmt[0] : g.fmt[0], stg ? p.sfast != 0 : p.fast[0] != 0, V,
                              stg ? g.sfmt[1] : g.fmt[1], stg ? true : p.fast[1] != 0, P,
                              stg ? 1.0f : vscale_pool);
            }
            if (dv) /* plain 16/32-bit values: p is not scaled (C's barrier orders this before D) */
                for (int e = tid; e < T.ntok; e += NT) vs[e] = 1.0f;
            if (!dk || !dv) __syncthreads(); /* B */
            const int es_k = kk == KIND_F32 ? 4 : 2, es_v = vk == KIND_F32 ? 4 : 2;
            compute(dk ? st : ktile, dk ? D * es_k : smem_plan<D>::pitch(kk), kk,
                    dv ? st + p.stage_k : vtile, dv ? D * es_v : smem_plan<D>::pitch(vk), vk,
                    stg ? 1.0f : kscale_pool, T.ntok, T.pos0, ki ? ptab + 2 * s * TT : nullptr);
            if (idn) s_ids[s * TT + tid] = nid;
        }
        kvp_cp_async_wait<0>(); /* only empty groups remain; the stages become `red` below */
    } else {
        int32_t pg = first, tin = 0;
        while (pg < end) {
            /* ---- the next tile: pages [pg, pg+np) or tokens [tin, tin+ntok) of page pg ---- */
            int32_t np, t0, ntok, pos0;
            if (P <= TT) {
                np = ppt < end - pg ? ppt : end - pg;
                if (last_staging && np > 1 && pg + np == npages) np--; /* the staging page alone */
                t0 = 0;
                pos0 = pg * P;
                ntok = np * P < kv_len - pos0 ? np * P : kv_len - pos0;
            } else {
                np = 1;
                t0 = tin;
                pos0 = pg * P + tin;
                int32_t left = (P - tin) < (kv_len - pos0) ? (P - tin) : (kv_len - pos0);
                ntok = TT < left ? TT : left;
            }
            const int32_t cur = pg;
            if (P <= TT) {
                pg += np;
            } else {
                tin += TT;
                if (tin >= P || pg * P + tin >= kv_len) {
                    pg++;
                    tin = 0;
                }
            }
            if (pos0 > hi_max || pos0 + ntok - 1 < lo_min) continue; /* nothing visible (uniform) */

            /* A: page ids -> block addresses; rows -> (page, token) */
            if (tid < np) {
                const int32_t id = p.indices[p.indptr[b] + cur + tid];
                kblk[tid] = kvp__geo_block(g, 0, id, h);
                vblk[tid] = kvp__geo_block(g, 1, id, h);
                if (tid == 0) s_tile_staging = id >= g.num_pages;
            }
            if (tid < ntok) {
                pj[tid] = P <= TT ? tid / P : 0;
                tt[tid] = P <= TT ? tid % P : t0 + tid;
            }
            __syncthreads(); /* A */
            const bool stg = s_tile_staging != 0;
            const int32_t kk = stg ? KIND_F16 : kind_k, vk = stg ? KIND_F16 : kind_v;

            /* B: K and V tiles, loaded from device memory */
            {
                tile_ref K, V;
                K.base = ktile;
                K.pitch = smem_plan<D>::pitch(kk);
                K.kind = kk;
                K.blk = kblk;
                K.pj = pj;
                K.tt = tt;
                K.vs = nullptr;
                K.ntok = ntok;
                V = K;
                V.base = vtile;
                V.pitch = smem_plan<D>::pitch(vk);
                V.kind = vk;
                V.blk = vblk;
                V.vs = vs;
                load_tiles<D>(K, stg ? g.sfmt[0] : g.fmt[0], stg ? p.sfast != 0 : p.fast[0] != 0, V,
                              stg ? g.sfmt[1] : g.fmt[1], stg ? true : p.fast[1] != 0, P,
                              stg ? 1.0f : vscale_pool);
            }
            __syncthreads(); /* B */
            compute(ktile, smem_plan<D>::pitch(kk), kk, vtile, smem_plan<D>::pitch(vk), vk,
                    stg ? 1.0f : kscale_pool, ntok, pos0, nullptr);
        }
    }

    /* ---- finish: l and m per row, the token slices summed, out or partials ---- */
    KVP_UNROLL
    for (int k = 0; k < RW; k++) {
        const int r = warp + NW * k;
        if (r >= R) break;
        float l = kvp__warp_sum(l_run[k]);
        if (lane == 0) {
            lfin[r] = l;
            mfin[r] = m_run[k];
        }
    }
    __syncthreads(); /* every tile read is done: the tiles become `red` */
    if (slice < TS)
        KVP_UNROLL
        for (int r = 0; r < R; r++) {
            red[(slice * R + r) * D + c2] = acc[r][0];
            red[(slice * R + r) * D + c2 + 1] = acc[r][1];
        }
    __syncthreads();
    /* rotated values, unsplit: the rows' outputs go back to red's slice 0
     * (in place: each (r, d) is summed and written by one thread), out of
     * the rotated basis there, then out */
    const bool unrot = g.fmt[1].rot != 0 && nsplit == 1;
    for (int e = tid; e < R * D; e += NT) {
        const int r = e / D, d = e % D;
        const int32_t rr = rb * R + r;
        if (rr >= rows_per_head) continue;
        float o = 0.0f;
        KVP_UNROLL
        for (int s = 0; s < TS; s++) o += red[(s * R + r) * D + d];
        const int32_t i = rr / p.group, qh = h * p.group + rr % p.group;
        if (nsplit > 1) {
            size_t at = (size_t)p.part_off[b] +
                        (((size_t)unit * nsplit + split) * R + r) * (size_t)(D + 2);
            if (d == 0) {
                p.partials[at] = mfin[r];
                p.partials[at + 1] = lfin[r];
            }
            p.partials[at + 2 + d] = o;
            continue;
        }
        const float l = lfin[r], inv = l > 0.0f ? 1.0f / l : 0.0f;
        const size_t row = (size_t)(qbase + i) * p.q_heads + qh;
        if (d == 0 && p.lse != nullptr) p.lse[row] = mfin[r] + logf(l);
        const float x = o * inv;
        if (unrot) red[r * D + d] = x;
        else store_out(p, row, d, x);
    }
    if (unrot) { /* uniform */
        const int nr = rows_per_head - rb * R < R ? rows_per_head - rb * R : R;
        __syncthreads();
        kvp__rot_inverse_rows(red, nr, D, tid, NT, kvp__block_sync());
        for (int e = tid; e < nr * D; e += NT) {
            const int r = e / D, d = e % D;
            const int32_t rr = rb * R + r, i = rr / p.group, qh = h * p.group + rr % p.group;
            store_out(p, (size_t)(qbase + i) * p.q_heads + qh, d, red[e]);
        }
    }
}

template <int D, int R>
__global__ void __launch_bounds__(NT, min_ctas<R>()) k_attention(params p) {
    attention_body<D, R, false>(p);
}

/* The copy pipeline's kernel: as min_ctas, except head_dim 80 at 4 rows,
 * which spills 8 bytes a thread on sm_80 within 3 CTAs' registers. */
template <int D, int R> constexpr int min_ctas_pipe() { return D == 80 && R == 4 ? 2 : min_ctas<R>(); }

/* The copy pipeline (the host sets params::pipe and the stage sizes). */
template <int D, int R>
__global__ void __launch_bounds__(NT, (min_ctas_pipe<D, R>())) k_attention_pipe(params p) {
    attention_body<D, R, true>(p);
}

/* Merge the split partials of one (sequence, unit): block per unit of the
 * split sequences (merge_start prefix), threads over (row, channel).
 * Rotated values: the merged rows are taken out of the rotated basis in
 * shared memory before they are written. */
template <int D, int R>
__global__ void __launch_bounds__(NT) k_merge(params p) {
    __shared__ int32_t s_b;
    __shared__ float s_o[R * D]; /* the merged rows (rotated values) */
    const int32_t m = (int32_t)blockIdx.x;
    if (threadIdx.x == 0) {
        int32_t lo = 0, hi = p.batch - 1;
        while (lo < hi) {
            int32_t mid = (lo + hi + 1) / 2;
            if (p.merge_start[mid] <= m) lo = mid;
            else hi = mid - 1;
        }
        s_b = lo;
    }
    __syncthreads();
    const int32_t b = s_b, unit = m - p.merge_start[b], S = p.splits[b];
    const int32_t q_len = p.qo[b + 1] - p.qo[b];
    const int32_t rows_per_head = q_len * p.group, RB = (rows_per_head + R - 1) / R;
    const int32_t h = unit / RB, rb = unit % RB;
    const int32_t qbase = p.qo[b];
    const bool unrot = p.g.fmt[1].rot != 0;
    for (int e = threadIdx.x; e < R * D; e += NT) {
        const int r = e / D, d = e % D;
        const int32_t rr = rb * R + r;
        if (rr >= rows_per_head) continue;
        const float *part = p.partials + p.part_off[b] + ((size_t)unit * S * R + r) * (size_t)(D + 2);
        const size_t sstride = (size_t)R * (D + 2);
        float M = -INFINITY;
        for (int s = 0; s < S; s++) M = part[s * sstride] > M ? part[s * sstride] : M;
        float L = 0.0f, o = 0.0f;
        for (int s = 0; s < S; s++) {
            const float *q = part + s * sstride;
            if (q[1] == 0.0f) continue; /* this split saw no token of the row */
            float w = expf(q[0] - M);
            L += q[1] * w;
            o += q[2 + d] * w;
        }
        const int32_t i = rr / p.group, qh = h * p.group + rr % p.group;
        const size_t row = (size_t)(qbase + i) * p.q_heads + qh;
        const float x = L > 0.0f ? o / L : 0.0f;
        if (d == 0 && p.lse != nullptr) p.lse[row] = M + logf(L);
        if (unrot) s_o[e] = x;
        else store_out(p, row, d, x);
    }
    if (unrot) { /* uniform */
        const int nr = rows_per_head - rb * R < R ? rows_per_head - rb * R : R;
        __syncthreads();
        kvp__rot_inverse_rows(s_o, nr, D, (int)threadIdx.x, NT, kvp__block_sync());
        for (int e = threadIdx.x; e < nr * D; e += NT) {
            const int r = e / D, d = e % D;
            const int32_t rr = rb * R + r, i = rr / p.group, qh = h * p.group + rr % p.group;
            store_out(p, (size_t)(qbase + i) * p.q_heads + qh, d, s_o[e]);
        }
    }
}

/* ---- host side: the kernels of one head dimension ------------------------ */

typedef void (*attn_kernel)(params);

/* The copy pipeline's shape for a store and tile shape; ok = false when it
 * does not apply (pages larger than a tile, blocks not 16-byte aligned, or
 * more shared memory than the device gives a block even with 2 stages). */
struct pipe_plan {
    bool ok;
    int stages, stage_k, stage_v, copy_k, copy_v, slot_k, slot_v, dec_k, dec_v, smem;
    bool direct[2], sdirect, kint;
};

inline bool a16(uint64_t x) { return (x & 15u) == 0; }
inline int up16(uint64_t x) { return (int)((x + 15u) & ~(uint64_t)15u); }

template <int D> pipe_plan plan_pipe(const kvp__geo &g, int32_t kind_k, int32_t kind_v, int R, int limit) {
    pipe_plan pl;
    memset(&pl, 0, sizeof pl);
    constexpr int TT = shape<D>::TT;
    const int32_t P = g.P;
    if (P > TT || !a16((uint64_t)(uintptr_t)g.arena) || !a16(g.sblock)) return pl;
    for (int s = 0; s < 2; s++)
        if (!a16(g.off[s]) || !a16(g.soff[s]) || !a16(g.pstride[s]) || !a16(g.sstride[s]) ||
            !a16(g.hstride[s]) || !a16(g.block[s]) || g.block[s] < g.used[s])
            return pl;
    const int ppt = TT / P;
    pl.copy_k = up16(g.used[0]);
    pl.copy_v = up16(g.used[1]);
    for (int s = 0; s < 2; s++) {
        const kvp__blockfmt &f = g.fmt[s];
        pl.direct[s] = (f.format == KVP_FORMAT_FP16 || f.format == KVP_FORMAT_BF16 ||
                        f.format == KVP_FORMAT_FP32) &&
                       !kvp__blockfmt_dim_major(&f) &&
                       g.used[s] == (uint64_t)P * (uint64_t)D * (uint64_t)kvp__plain_size(f.format);
    }
    pl.sdirect = !kvp__blockfmt_dim_major(&g.sfmt[0]);
    /* blocks decoded from the stage sit 64 bytes (16 banks) off the previous
     * one's bank alignment, so a warp reading the same offset in two pages
     * is not a 2-way conflict; blocks read in place must be rows end to end */
    pl.slot_k = pl.copy_k + (pl.direct[0] ? 0 : 64);
    pl.slot_v = pl.copy_v + (pl.direct[1] ? 0 : 64);
    /* int8 / int4 keys: integer dot products (up to 8 pages a tile) */
    pl.kint = (g.fmt[0].format == KVP_FORMAT_INT8 || KVP__IS_INT4(g.fmt[0].format)) && ppt <= 8;
    const int ro = KVP__K4_OUTLIERS(g.fmt[0].format, D); /* int4 keys' outlier channels */
    const int sb = (int)g.sblock;
    pl.stage_k = ppt * pl.slot_k > sb ? ppt * pl.slot_k : sb;
    pl.stage_v = ppt * pl.slot_v > sb ? ppt * pl.slot_v : sb;
    pl.dec_k = (pl.direct[0] || pl.kint) && pl.sdirect ? 0 : smem_plan<D>::tile_bytes(kind_k);
    pl.dec_v = pl.direct[1] ? 0 : smem_plan<D>::tile_bytes(kind_v);
    for (int st = 3; st >= 2; st--) {
        int bytes =
            smem_plan<D>::pipe_bytes(st, pl.stage_k, pl.stage_v, pl.dec_k, pl.dec_v, R, pl.kint, ppt, ro);
        if (bytes <= limit) {
            pl.ok = true;
            pl.stages = st;
            pl.smem = bytes;
            return pl;
        }
    }
    return pl;
}

/* Everything the launch needs of one head dimension D: its kernels by rows
 * per CTA (1, 2, 4, 8), their shared memory and the copy pipeline's plan.
 * Each is defined (KVP_ATTN_DIM) in a file of its own, attention_dD.cu:
 * nvcc then compiles the head dimensions' kernels in parallel. */
struct dim_kernels {
    attn_kernel attn[4], pipe_attn[4], merge[4];
    int (*smem)(int32_t kind_k, int32_t kind_v, int R);
    pipe_plan (*plan)(const kvp__geo &g, int32_t kind_k, int32_t kind_v, int R, int limit);
};

extern const dim_kernels dims_64, dims_80, dims_96, dims_128, dims_256;

#define KVP_ATTN_DIM(Dv)                                                                           \
    const dim_kernels dims_##Dv = {                                                                \
        {k_attention<Dv, 1>, k_attention<Dv, 2>, k_attention<Dv, 4>, k_attention<Dv, 8>},          \
        {k_attention_pipe<Dv, 1>, k_attention_pipe<Dv, 2>, k_attention_pipe<Dv, 4>,                \
         k_attention_pipe<Dv, 8>},                                                                 \
        {k_merge<Dv, 1>, k_merge<Dv, 2>, k_merge<Dv, 4>, k_merge<Dv, 8>},                          \
        smem_plan<Dv>::bytes,                                                                      \
        plan_pipe<Dv>};

} // namespace kvp_attn

#endif
