/*
 * The internal backend interface: what a backend (cpu, cuda) must
 * implement so the public store / append / attention API works on it
 * (lib/cpu/: the CPU; cuda/: CUDA devices).
 *
 * The front end (lib/store.c, lib/ctx.c) validates every argument and
 * owns error text; a backend receives only checked arguments and moves
 * bytes. All backends produce the same bytes for the same inputs (the block
 * formats of lib/blockfmt.h), and attention results within the tolerances of
 * docs/formats.md. The CPU backend is the reference.
 */
#ifndef KVPAGE_BACKEND_H
#define KVPAGE_BACKEND_H

#include "blockfmt.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvp__backend kvp__backend;

/* Addresses of one layer's blocks (the public kvp_region_t, as offsets). */
typedef struct {
    uint64_t k_offset, v_offset;   /* pool K / V region of the layer, from the arena base */
    uint64_t sk_offset, sv_offset; /* staging K / V region of the layer */
} kvp__layer_offsets;

/* The store: immutable after creation except the arena's bytes, the
 * non-finite counter and the error text. */
struct kvp_store {
    const kvp__backend *backend;
    void *backend_state;            /* e.g. a CUDA device and stream */
    int32_t device;                 /* CUDA device ordinal; -1 on the CPU */
    kvp_allocator_t allocator;
    kvp_layout_t layout;
    int32_t k_order;
    int32_t num_pages, num_staging; /* ids: pool 0..num_pages-1, staging after */
    uint8_t *arena;                 /* kvp_arena_bytes() bytes, KVP_ARENA_ALIGN-aligned */
    uint64_t arena_bytes;
    float *fp8_k, *fp8_v;           /* fp8 scale tables [layers][kv_heads] in the arena's
                                       fixed region (K first when both); NULL if unused */
    kvp__blockfmt kfmt, vfmt, skfmt, svfmt; /* pool K, pool V, staging K, staging V */
    uint64_t page_stride_k, page_stride_v;   /* bytes per page in a layer's region */
    uint64_t head_stride_k, head_stride_v;   /* bytes from a pool block to the next kv head's
                                                (the block size): addressing reads strides and
                                                never assumes the packing, so the kernels also
                                                run over a view of the same blocks laid out
                                                otherwise (e.g. one sequence's end to end) */
    uint64_t spage_stride_k, spage_stride_v;
    uint64_t layer_bytes, slayer_bytes;      /* one layer's pool / staging regions */
    uint64_t pool_offset, staging_offset;    /* region starts in the arena */
    float *scratch;                 /* host: page_size x head_dim fp32 rows (seals, runs of rows) */
    const struct kvp__enc_prims *enc; /* host: the encoders' primitives (lib/cpu/encode.c) */
    uint64_t nonfinite;
    char *error;                    /* -> error_text: writable from const-taking getters */
    char error_text[KVP_ERR_SIZE];
};

/* Offsets of one layer's regions. */
static inline kvp__layer_offsets kvp__store_layer(const kvp_store_t *s, int32_t layer) {
    kvp__layer_offsets o;
    o.k_offset = s->pool_offset + (uint64_t)layer * s->layer_bytes;
    o.v_offset = o.k_offset + (uint64_t)s->num_pages * s->page_stride_k;
    o.sk_offset = s->staging_offset + (uint64_t)layer * s->slayer_bytes;
    o.sv_offset = o.sk_offset + (uint64_t)s->num_staging * s->spage_stride_k;
    return o;
}

/* The arena offset of block (page p, kv head h) of one side of a layer: the
 * one addressing formula of both backends (kvp__block_k/v below on the CPU,
 * kvp__geo_block in CUDA kernels). Pool pages 0..num_pages-1 are in the
 * layer's pool region, staging pages (ids from num_pages on) in its staging
 * region; within a region, page after page, each page's kv heads' blocks
 * one after another. */
KVP__HD static inline uint64_t kvp__block_offset(int32_t p, int32_t h, int32_t num_pages,
                                                 uint64_t pool_region, uint64_t pool_page,
                                                 uint64_t pool_block, uint64_t staging_region,
                                                 uint64_t staging_page, uint64_t staging_block) {
    if (p < num_pages) return pool_region + (uint64_t)p * pool_page + (uint64_t)h * pool_block;
    return staging_region + (uint64_t)(p - num_pages) * staging_page + (uint64_t)h * staging_block;
}

/* A block's address: page id p (pool or staging), kv head h. */
static inline uint8_t *kvp__block_k(const kvp_store_t *s, int32_t layer, int32_t p, int32_t h) {
    kvp__layer_offsets o = kvp__store_layer(s, layer);
    return s->arena + kvp__block_offset(p, h, s->num_pages, o.k_offset, s->page_stride_k,
                                        s->head_stride_k, o.sk_offset, s->spage_stride_k,
                                        s->spage_stride_k / (uint64_t)s->layout.kv_heads);
}
static inline uint8_t *kvp__block_v(const kvp_store_t *s, int32_t layer, int32_t p, int32_t h) {
    kvp__layer_offsets o = kvp__store_layer(s, layer);
    return s->arena + kvp__block_offset(p, h, s->num_pages, o.v_offset, s->page_stride_v,
                                        s->head_stride_v, o.sv_offset, s->spage_stride_v,
                                        s->spage_stride_v / (uint64_t)s->layout.kv_heads);
}
static inline const kvp__blockfmt *kvp__fmt_k(const kvp_store_t *s, int32_t p) {
    return p < s->num_pages ? &s->kfmt : &s->skfmt;
}
static inline const kvp__blockfmt *kvp__fmt_v(const kvp_store_t *s, int32_t p) {
    return p < s->num_pages ? &s->vfmt : &s->svfmt;
}
/* fp8 scale of (layer, head), keys (side 0) or values (side 1). */
static inline float *kvp__fp8_scale(const kvp_store_t *s, int side, int32_t layer, int32_t h) {
    float *t = side ? s->fp8_v : s->fp8_k;
    return t == NULL ? NULL : t + (size_t)layer * (size_t)s->layout.kv_heads + (size_t)h;
}

/* ---- the context ---------------------------------------------------------- */

typedef struct kvp__workers kvp__workers; /* worker threads (lib/cpu/threads.c) */

struct kvp_ctx {
    const kvp__backend *backend;
    void *backend_state;         /* e.g. a CUDA device, stream and workspace */
    int32_t device;              /* CUDA device ordinal; -1 on the CPU */
    kvp_allocator_t allocator;
    int32_t threads;
    int32_t isa;                 /* resolved: never KVP_ISA_AUTO */
    kvp__workers *workers;
    uint8_t *workspace;          /* split-KV partials and the schedule */
    uint64_t workspace_bytes;
    uint8_t *scratch;            /* per-thread kernel scratch, threads x scratch_stride */
    uint64_t scratch_stride;
    char *error;                 /* -> error_text: writable from const-taking getters */
    char error_text[KVP_ERR_SIZE];
};

/* Size of a store's error buffer. */
#define KVP__STORE_ERR_SIZE KVP_ERR_SIZE

/* Checked attention arguments, as the backends get them. */
typedef struct {
    const kvp_store_t *store;
    const kvp_kv_view_t *view;
    const kvp_attention_params_t *p;
    int32_t group;              /* q_heads / kv_heads */
    int32_t total_rows;         /* qo_indptr[batch] */
    float sm_scale;             /* p->sm_scale, or its default 1/sqrt(head_dim) for 0 */
} kvp__attn_args;

/* ---- the interface ---------------------------------------------------------- */

/* Store and context creation with a backend (lib/store.c, lib/ctx.c): the
 * front end checks the parameters, builds the geometry and calls the
 * backend's arena_alloc / ctx_init with its own parameters (`bparams`: NULL
 * for the CPU, a kvp_cuda_params_t for CUDA). */
int kvp__store_create(const kvp_store_params_t *params, const kvp__backend *backend,
                      const void *bparams, kvp_store_t **out, char *err, size_t err_size);
int kvp__ctx_create(const kvp_ctx_params_t *params, const kvp__backend *backend,
                    const void *bparams, kvp_ctx_t **out, char *err, size_t err_size);
/* Argument checks shared by every backend's entry points. */
int kvp__check_page_io(const kvp_store_t *s, int32_t page, uint64_t offset, const void *host,
                       uint64_t bytes);
/* kvp_store_page_check() of a page whose first `tokens` tokens were written
 * (per-token scales past them are not read). */
int kvp__store_page_check(const kvp_store_t *s, int32_t page, const void *src, uint64_t bytes,
                          int32_t tokens);
/* Bytes of one page's serialization (kvp_store_page_to_host()). */
uint64_t kvp__page_io_bytes(const kvp_store_t *s, int32_t page);

struct kvp__backend {
    const char *name;
    int32_t id; /* kvp_backend */
    /* Arena memory: allocate s->arena_bytes at KVP_ARENA_ALIGN, zero the
     * fixed region, set fp8_k / fp8_v. */
    int (*arena_alloc)(kvp_store_t *s, const void *bparams, char *err, size_t err_size);
    /* Free the arena and every backend resource of the store. */
    void (*store_fini)(kvp_store_t *s);
    /* Append (seals first, then rows); arguments validated. */
    int (*append)(kvp_store_t *s, const kvp_append_params_t *a, char *err, size_t err_size);
    /* COPY and UNSEAL operations, validated, in order, all layers. */
    int (*apply_ops)(kvp_store_t *s, const kvp_page_op_t *ops, int32_t n, char *err,
                     size_t err_size);
    /* Dequantize tokens of a page to host fp32 rows [count][kv_heads][head_dim]. */
    int (*read)(const kvp_store_t *s, int32_t layer, int32_t page, int32_t t0, int32_t n,
                float *k, float *v, char *err, size_t err_size);
    /* fp8 scale table access (device memory on GPUs). */
    int (*set_fp8_scale)(kvp_store_t *s, int side, int32_t layer, int32_t h, float scale,
                         char *err, size_t err_size);
    int (*get_fp8_scale)(const kvp_store_t *s, int side, int32_t layer, int32_t h, float *scale,
                         char *err, size_t err_size);
    /* Non-finite inputs so far. */
    int (*nonfinite)(const kvp_store_t *s, uint64_t *count, char *err, size_t err_size);
    /* Bytes [offset, offset+bytes) of a page's serialization to or from host
     * memory; arguments validated. */
    int (*page_io)(kvp_store_t *s, int32_t page, uint64_t offset, void *host, uint64_t bytes,
                   int to_host, char *err, size_t err_size);
    /* Wait for the store's pending work. */
    int (*synchronize)(kvp_store_t *s, char *err, size_t err_size);
    /* Context resources (threads, workspace) and attention. */
    int (*ctx_init)(kvp_ctx_t *c, const void *bparams, char *err, size_t err_size);
    void (*ctx_fini)(kvp_ctx_t *c);
    int (*attention)(kvp_ctx_t *c, const kvp__attn_args *a);
};



extern const kvp__backend kvp__cpu_backend;
extern const kvp__backend kvp__cuda_backend; /* cuda/backend.cu, in CUDA builds */

/* ISA probing (lib/cpu/isa.c). */
bool kvp__cpu_has_avx2(void);
bool kvp__cpu_has_avx512(void);
bool kvp__cpu_has_avx512_bf16(void);
bool kvp__cpu_has_neon(void);         /* AArch64 Advanced SIMD */
bool kvp__cpu_has_neon_dotprod(void); /* and the ARMv8.2 dot products */
/* The fastest KVP_ISA_* this CPU runs (what KVP_ISA_AUTO picks). */
int32_t kvp__cpu_best_isa(void);

#ifdef __cplusplus
}
#endif

#endif
