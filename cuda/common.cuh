/*
 * Shared helpers of the CUDA backend.
 *
 * Host side: error mapping (every CUDA call goes through kvp__cuda_status(),
 * which turns a cudaError_t into KVP_ECUDA, or KVP_ENODEV for "no device" /
 * "no driver", with the runtime's text), the device guard every entry point
 * holds, and the per-object state (device, stream, device allocator, the
 * staging area that uploads per-call metadata). Device side: the store's
 * geometry as kernels see it, and small load/convert helpers.
 *
 * Host code here uses no C++ library (no new/delete, exceptions or RTTI):
 * libkvpage.a then links into C programs with the C compiler alone.
 */
#ifndef KVPAGE_CUDA_COMMON_CUH
#define KVPAGE_CUDA_COMMON_CUH

#include "compat.cuh"

#include "../include/kvpage_cuda.h"
#include "../lib/backend.h"

#include <stdint.h>
#include <string.h>

/* ---- errors ------------------------------------------------------------------ */

static inline int kvp__cuda_status(cudaError_t e, char *err, size_t err_size,
                                   const char *what) {
    if (e == cudaSuccess) return KVP_OK;
    int status = KVP_ECUDA;
    if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver ||
        e == cudaErrorInvalidDevice || e == cudaErrorDevicesUnavailable ||
        e == cudaErrorCompatNotSupportedOnDevice)
        status = KVP_ENODEV;
    else if (e == cudaErrorMemoryAllocation)
        status = KVP_ENOMEM;
    return kvp__errf(err, err_size, status, "%s: %s (%s)", what, cudaGetErrorString(e),
                     cudaGetErrorName(e));
}

/* `return` the status of a failed CUDA call. */
#define KVP_CUDA_TRY(call, err, err_size, what)                              \
    do {                                                                     \
        cudaError_t kvp_e_ = (call);                                         \
        if (kvp_e_ != cudaSuccess) return kvp__cuda_status(kvp_e_, err, err_size, what); \
    } while (0)

/* ---- the device guard: entry points run on their object's device ------------- */

struct kvp__device_guard {
    int previous;
    bool switched;
};

/* Make `device` current; remembers the previous device for release. */
int kvp__device_enter(kvp__device_guard *g, int device, char *err, size_t err_size);
void kvp__device_leave(kvp__device_guard *g);

/* ---- staging: per-call metadata, pinned host -> device ---------------------------
 *
 * Slots, seals, the CSR view and the attention schedule are built on the
 * host, where the page table makes them. They go up through a pinned buffer
 * of two halves: a call builds into the half not used last (waiting, at
 * worst, for that half's previous copy to have left, i.e. two uploads ago),
 * then either finds the bytes equal to the last upload's (every layer of a
 * step: no copy at all) or copies them on the stream. */
struct kvp__stager {
    uint8_t *host;        /* pinned, 2 x half */
    uint8_t *dev;         /* device, 2 x half */
    uint64_t half;
    uint64_t size[2];     /* bytes of the last upload through each half */
    cudaEvent_t done[2];  /* recorded after each half's copy */
    bool pending[2];
    int last;             /* half of the last upload, -1 before the first */
    int building;         /* half being built, -1 when none */
};

/* ---- a CUDA object: device, stream, device memory ----------------------------- */

struct kvp__cuda_obj {
    int device;
    cudaStream_t stream;
    kvp_cuda_allocator_t alloc;
    cudaEvent_t order;   /* recorded on the old stream when the stream changes */
    bool order_ok;
    kvp__stager stage;
};

#define KVP__DEFAULT_STAGING (4ull << 20)
#define KVP__OCC_WAYS 4

/* Check the parameters, make the device current (the guard is left for the
 * caller to release), create events and the staging area. */
int kvp__obj_init(kvp__cuda_obj *o, const kvp_cuda_params_t *p, kvp__device_guard *g, char *err,
                  size_t err_size);
void kvp__obj_fini(kvp__cuda_obj *o);
int kvp__obj_set_stream(kvp__cuda_obj *o, cudaStream_t s, char *err, size_t err_size);
int kvp__obj_alloc(kvp__cuda_obj *o, uint64_t bytes, void **p, char *err, size_t err_size,
                   const char *what);
void kvp__obj_free(kvp__cuda_obj *o, void *p, uint64_t bytes);

/* Start building `bytes` of metadata: *host is where to write them. */
int kvp__stage_begin(kvp__cuda_obj *o, uint64_t bytes, uint8_t **host, char *err, size_t err_size,
                     const char *what);
/* Upload what was built (or reuse the identical last upload); *dev is its
 * device address, valid for work enqueued on the object's stream. */
int kvp__stage_commit(kvp__cuda_obj *o, uint64_t bytes, const uint8_t **dev, char *err,
                      size_t err_size);

/* ---- the store's and the context's state ---------------------------------------- */

enum { KVP__ARENA_ENGINE = 0, KVP__ARENA_CUDAMALLOC = 1, KVP__ARENA_HOOK = 2 };

struct kvp__cuda_store {
    kvp__cuda_obj o;
    int arena_mode;
    uint8_t *dev_small;          /* device: nonfinite counter, then read scratch */
    uint64_t dev_small_bytes;
    unsigned long long *nonfinite;
    float *scratch;              /* kvp_store_read() chunks: [tokens][kv_heads][D] K, then V */
    int32_t scratch_tokens;
    uint8_t *fp8_known;          /* host [2][layers][kv_heads]: scale known to be > 0 */
    uint64_t nonfinite_seen;     /* last count read back */
    uint64_t max_pitch;          /* the device's largest pitch of a 2D copy */
};

struct kvp__cuda_ctx {
    kvp__cuda_obj o;
    float *partials;             /* device workspace: split-KV partial results */
    uint64_t partial_bytes;
    int sm_count;
    int smem_optin;              /* cudaDevAttrMaxSharedMemoryPerBlockOptin */
    bool pipeline;               /* kvp_cuda_ctx_set_pipeline(); default on */
    /* CTAs of each attention kernel variant one SM holds at once with a given
     * dynamic shared memory size (cudaOccupancyMaxActiveBlocksPerMultiprocessor,
     * asked at first use of a (variant, size) pair): [head_dim index][log2 R]
     * [copy pipeline][the last KVP__OCC_WAYS sizes seen] */
    struct {
        int smem, ctas;          /* ctas 0: empty */
    } occ[5][4][2][KVP__OCC_WAYS];
    int occ_next[5][4][2];       /* the entry replaced next */
    /* the last call (tests): CTAs its split sizing aimed at, its shared
     * memory, whether it used the copy pipeline, with how many stages, and
     * integer dot products for the keys */
    int64_t split_target;
    int last_smem, last_stages;
    bool last_pipe, last_kint;
    /* kvp_cuda_ctx_set_timing(): events recorded on the stream right before
     * an attention call's first kernel and right after its last */
    cudaEvent_t timing_ev[2];
    bool timing_ev_ok;           /* both created */
    bool timing;                 /* calls record them */
    bool timed;                  /* the last call with timing on recorded both */
};

static inline kvp__cuda_store *kvp__cstore(const kvp_store_t *s) {
    return (kvp__cuda_store *)s->backend_state;
}
static inline kvp__cuda_ctx *kvp__cctx(const kvp_ctx_t *c) {
    return (kvp__cuda_ctx *)c->backend_state;
}

/* Backend entry points, one file per concern. */
int kvp__cuda_arena_alloc(kvp_store_t *s, const void *bparams, char *err, size_t err_size);
void kvp__cuda_store_fini(kvp_store_t *s);
int kvp__cuda_append(kvp_store_t *s, const kvp_append_params_t *a, char *err, size_t err_size);
int kvp__cuda_apply_ops(kvp_store_t *s, const kvp_page_op_t *ops, int32_t n, char *err,
                        size_t err_size);
int kvp__cuda_read(const kvp_store_t *s, int32_t layer, int32_t page, int32_t t0, int32_t n,
                   float *k, float *v, char *err, size_t err_size);
int kvp__cuda_set_fp8_scale(kvp_store_t *s, int side, int32_t layer, int32_t h, float scale,
                            char *err, size_t err_size);
int kvp__cuda_get_fp8_scale(const kvp_store_t *s, int side, int32_t layer, int32_t h,
                            float *scale, char *err, size_t err_size);
int kvp__cuda_nonfinite(const kvp_store_t *s, uint64_t *count, char *err, size_t err_size);
int kvp__cuda_page_io(kvp_store_t *s, int32_t page, uint64_t offset, void *host, uint64_t bytes,
                      int to_host, char *err, size_t err_size);
int kvp__cuda_synchronize(kvp_store_t *s, char *err, size_t err_size);
int kvp__cuda_ctx_init(kvp_ctx_t *c, const void *bparams, char *err, size_t err_size);
void kvp__cuda_ctx_fini(kvp_ctx_t *c);
int kvp__cuda_attention(kvp_ctx_t *c, const kvp__attn_args *a);
int kvp__cuda_ctx_set_timing(kvp_ctx_t *c, int enable);
int kvp__cuda_ctx_kernel_time(kvp_ctx_t *c, double *seconds);

/* ---- what kernels know about a store ----------------------------------------------- */

/* One layer of a store, by value in kernel parameters. Block (page p, kv
 * head h) of side `v` (0 = K, 1 = V) is at kvp__geo_block(). */
struct kvp__geo {
    uint8_t *arena;
    uint64_t off[2];       /* pool K / V region of the layer */
    uint64_t soff[2];      /* staging K / V region of the layer */
    uint64_t pstride[2];   /* bytes per pool page in a region */
    uint64_t sstride[2];   /* bytes per staging page */
    uint64_t block[2];     /* bytes per pool block */
    uint64_t used[2];      /* bytes of a pool block's element and scale data; zero padding
                              follows up to block[side] (staging blocks have none) */
    uint64_t hstride[2];   /* bytes from a pool block to the next kv head's (the store's
                              head_stride_k/v: the block size, or a view's own stride) */
    uint64_t sblock;       /* bytes per staging block: P*D*2 */
    const float *fp8[2];   /* this layer's fp8 scales [kv_heads], or NULL */
    float *fp8w[2];        /* the same, writable (calibration) */
    int32_t num_pages, P, D, H;
    kvp__blockfmt fmt[2];  /* pool K / V */
    kvp__blockfmt sfmt[2]; /* staging K / V (fp16) */
};

kvp__geo kvp__make_geo(const kvp_store_t *s, int32_t layer);

__device__ __forceinline__ uint8_t *kvp__geo_block(const kvp__geo &g, int side, int32_t page,
                                                   int32_t h) {
    return g.arena + kvp__block_offset(page, h, g.num_pages, g.off[side], g.pstride[side],
                                       g.hstride[side], g.soff[side], g.sstride[side], g.sblock);
}
__device__ __forceinline__ const kvp__blockfmt &kvp__geo_fmt(const kvp__geo &g, int side,
                                                             int32_t page) {
    return page < g.num_pages ? g.fmt[side] : g.sfmt[side];
}
/* fp8 scale of a block (0 when its format is not fp8). */
__device__ __forceinline__ float kvp__geo_fp8(const kvp__geo &g, int side, int32_t page,
                                              int32_t h) {
    return (page < g.num_pages && g.fp8[side] != nullptr) ? g.fp8[side][h] : 0.0f;
}

/* ---- small device helpers ------------------------------------------------------------ */

/* Zero the padding of a block, bytes [used, bytes), by the threads
 * i, i + step, ... of whoever writes the block: a block's bytes then never
 * depend on what the arena held (page blobs, checksums, the CPU's bytes). At
 * most KVP_BLOCK_ALIGN - 1 bytes. */
__device__ __forceinline__ void kvp__zero_padding(uint8_t *b, uint64_t used, uint64_t bytes, int i,
                                                  int step) {
    for (uint64_t o = used + (uint64_t)i; o < bytes; o += (uint64_t)step) b[o] = 0;
}

/* An element of an fp32 / fp16 / bf16 tensor (dtype: kvp_format) as fp32. */
__device__ __forceinline__ float kvp__load_elem(const uint8_t *p, int32_t dtype) {
    if (dtype == KVP_FORMAT_FP32) return *reinterpret_cast<const float *>(p);
    uint16_t u = *reinterpret_cast<const uint16_t *>(p);
    return dtype == KVP_FORMAT_FP16 ? kvp__f16_to_f32(u) : kvp__bf16_to_f32(u);
}

template <typename T> __device__ __forceinline__ T kvp__warp_max(T v) {
    for (int o = 16; o > 0; o >>= 1) {
        T w = __shfl_xor_sync(0xffffffffu, v, o);
        v = w > v ? w : v;
    }
    return v;
}
template <typename T> __device__ __forceinline__ T kvp__warp_sum(T v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* ---- the rotated basis of int4 values (lib/blockfmt.h, kvp__rot_forward) ------------------
 *
 * Rows of D floats in shared memory, transformed by a group of threads
 * (i = 0 .. n-1: the lanes of a warp, or a whole block) one butterfly stage
 * at a time, every block of the row and every row of the group in the same
 * stage, with the group's barrier between stages. A butterfly is the CPU's
 * (a, b) -> (a + b, a - b) on the same two elements and the scales are
 * powers of two, so each element sees the same IEEE operations in the same
 * order as on the CPU: the same bits. */

/* The group's barrier between stages. */
struct kvp__warp_sync {
    __device__ __forceinline__ void operator()() const { __syncwarp(); }
};
struct kvp__block_sync {
    __device__ __forceinline__ void operator()() const { __syncthreads(); }
};

/* Size of the rotation block holding channel d (< D). The blocks are the set
 * bits of D, largest first, so the bits of d above its block's size are
 * D's, and the size is the highest bit where d and D differ. */
__device__ __forceinline__ int kvp__rot_block_of(int D, int d) {
    unsigned x = (unsigned)(d ^ D);
    while ((x & (x - 1u)) != 0u) x &= x - 1u;
    return (int)x;
}

/* Channel d's value as the forward transform starts from it: non-finite
 * as 0, the sign flipped where kvp__rot_neg(d). */
__device__ __forceinline__ float kvp__rot_load(float v, int d) {
    if (!isfinite(v)) v = 0.0f;
    return kvp__rot_neg(d) ? -v : v;
}

/* The unnormalized Walsh-Hadamard transform of every block of `rows` rows
 * at x (row r at x + r * D): stage `len` pairs channels j and j + len of
 * each block larger than len. Ends with a barrier. */
template <typename Sync>
__device__ void kvp__rot_butterflies(float *x, int rows, int D, int i, int n, Sync sync) {
    const int half = D / 2; /* pairs of a row per stage (blocks too small for a stage skip theirs) */
    for (int len = 1; 2 * len <= D; len *= 2) {
        for (int c = i; c < rows * half; c += n) {
            const int r = c / half, k = c - r * half;
            const int j = (k - k % len) * 2 + k % len; /* the k-th channel with bit `len` clear */
            if (len >= kvp__rot_block_of(D, j)) continue;
            float *p = x + (size_t)r * (size_t)D;
            const float a = p[j], b = p[j + len];
            p[j] = a + b;
            p[j + len] = a - b;
        }
        sync();
    }
}

/* kvp__rot_forward() of rows whose elements were loaded through
 * kvp__rot_load() (and published by a barrier): transform, then each
 * block's scale. Ends with a barrier. */
template <typename Sync>
__device__ void kvp__rot_forward_rows(float *x, int rows, int D, int i, int n, Sync sync) {
    kvp__rot_butterflies(x, rows, D, i, n, sync);
    for (int c = i; c < rows * D; c += n) {
        const int d = c % D;
        x[c] *= kvp__rot_scale(kvp__rot_block_of(D, d), 0);
    }
    sync();
}

/* kvp__rot_inverse() of rows published by a barrier: transform, each
 * block's scale, the signs. Ends with a barrier. */
template <typename Sync>
__device__ void kvp__rot_inverse_rows(float *x, int rows, int D, int i, int n, Sync sync) {
    kvp__rot_butterflies(x, rows, D, i, n, sync);
    for (int c = i; c < rows * D; c += n) {
        const int d = c % D;
        float v = x[c] * kvp__rot_scale(kvp__rot_block_of(D, d), 1);
        x[c] = kvp__rot_neg(d) ? -v : v;
    }
    sync();
}

#endif
