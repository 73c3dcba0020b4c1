/*
 * CPU backend internals: worker threads, the attention tile, and the kernel
 * stages each instruction set implements.
 *
 * Attention work item = (sequence, group of kv heads, block of up to 32
 * query rows, range of pages). Its rows are processed in tiles of up to 4
 * rows of one kv head (the query heads of a GQA group share every K/V load),
 * page by page in chunks of up to 32 tokens: K stage (logits) -> softmax
 * stage (mask, soft cap, online softmax) -> V stage (o += p.v). Where the
 * ISA has a two-block V stage for the format (vacc2), two full pages of at
 * most 32 tokens go as one chunk: the per-chunk work (softmax reductions and
 * bookkeeping, the V stage's bounds and output update) is paid once for both.
 * With a four-block V stage (vacc4), four full pages go as one chunk.
 */
#ifndef KVPAGE_CPU_H
#define KVPAGE_CPU_H

#include "../backend.h"

#include <stddef.h>

#define KVP__TILE_ROWS 4
#define KVP__ITEM_ROWS 32
#define KVP__CHUNK 32
#define KVP__ATTN_MAX_D 256

#if defined(__GNUC__) || defined(__clang__)
#define KVP__ALIGN64 __attribute__((aligned(64)))
#else
#define KVP__ALIGN64
#endif

/* The state of up to 4 query rows of one kv head while they stream a
 * sequence's pages. Lives in a thread's scratch. */
typedef struct {
    float q[KVP__TILE_ROWS][KVP__ATTN_MAX_D] KVP__ALIGN64;  /* q * sm_scale */
    float qf[KVP__TILE_ROWS][KVP__ATTN_MAX_D] KVP__ALIGN64; /* q times the plain format's unit, or
                                                               folded with this page's key scales
                                                               (AVX2 integer preps; AVX-512's use qn) */
    int8_t qh[KVP__TILE_ROWS][KVP__ATTN_MAX_D] KVP__ALIGN64; /* integer q, high part (int4 keys,
                                                               SIMD: the whole 8-bit q) */
    int8_t ql[KVP__TILE_ROWS][KVP__ATTN_MAX_D] KVP__ALIGN64; /* integer q, low part */
    int8_t qhl[KVP__TILE_ROWS][2 * KVP__ATTN_MAX_D] KVP__ALIGN64; /* AVX-512 int8 keys: both parts,
                                                                    packed (kern_avx512.c) */
    int16_t q16[KVP__TILE_ROWS][KVP__ATTN_MAX_D] KVP__ALIGN64; /* AVX2 int8 keys: 15-bit q */
    float logits[KVP__TILE_ROWS][4 * KVP__CHUNK] KVP__ALIGN64; /* 4 *: four pages (vacc4) */
    float p[KVP__TILE_ROWS][4 * KVP__CHUNK] KVP__ALIGN64;      /* exp(logit - m) */
    float qstep[KVP__TILE_ROWS];  /* integer q's step: q' ~= qstep * x (x = 128*qh + ql, or
                                     the 8-bit qh, or q16) */
    int32_t qcorr[KVP__TILE_ROWS]; /* NEON int8 keys: 128 * sum(x), what the codes' shift to
                                      signed (c - 128) takes from the integer sum */
    float qconst[KVP__TILE_ROWS]; /* logit terms shared by every token of the page */
    float k4a[KVP__TILE_ROWS][KVP__ATTN_MAX_D / 8] KVP__ALIGN64; /* int4 keys' outliers: q * oscale
                                                                     (SIMD paths) */
    /* AVX-512 int4 prep: the outlier channels' q (k4q[r][j] = q[r][idx_j]
     * for int4_v1, qn[r][idx_j] for int4; 0 past the count) for the channel
     * list k4idx, kept while pages repeat it (k4valid: 1 for q, 2 for qn, 0
     * after the tile's q is set) */
    float k4q[KVP__TILE_ROWS][KVP__ATTN_MAX_D / 8] KVP__ALIGN64;
    uint16_t k4idx[KVP__ATTN_MAX_D / 8];
    int32_t k4valid;
    /* AVX-512, int4's outlier channels (channel quads): q[idx_j]·oscale_j
     * as 15 bits x = 128·hi + lo, k4hl[r][0] the hi parts, [r][1] the lo
     * parts; q' ~= k4step[r]·x */
    int8_t k4hl[KVP__TILE_ROWS][2][KVP__ATTN_MAX_D / 8] KVP__ALIGN64;
    float k4step[KVP__TILE_ROWS];
    /* AVX-512 integer-key preps: q * target / max|q| per row and max|q|
     * (qamax), formed once per tile for the target qnvalid holds (127 for
     * int4 keys, 16256 for int8; 0 after the tile's q is set) */
    float qn[KVP__TILE_ROWS][KVP__ATTN_MAX_D] KVP__ALIGN64;
    float qamax[KVP__TILE_ROWS];
    int32_t qnvalid;
    float lvec[KVP__TILE_ROWS][16] KVP__ALIGN64; /* SIMD paths: l = l + sum(lvec), reduced at the end */
    float m[KVP__TILE_ROWS], l[KVP__TILE_ROWS];
    float pmax[KVP__TILE_ROWS];   /* largest p of the current chunk (exp(chunk max - m)) */
    int32_t lo[KVP__TILE_ROWS], hi[KVP__TILE_ROWS]; /* positions each row may attend */
    float *o;                     /* [rows][D] output accumulators */
    int32_t rows, D, P;
    int32_t head, row0;           /* kv head; first row (i*group + g) of the tile */
    ptrdiff_t pf_k, pf_v;         /* prefetch distance in bytes: from this K / V block to the
                                     one the item reads a few steps on (lib/cpu/attn.c) */
    float fp8_k, fp8_v;           /* this layer/head's fp8 scales (0 if unused) */
    float soft_cap;
} kvp__tile;

/* Stages. `f` describes the block; tokens [t0, t0+n) of the page, n <= 32. */
typedef void (*kvp__kprep_fn)(kvp__tile *t, const uint8_t *kb, const kvp__blockfmt *f);
typedef void (*kvp__klogits_fn)(kvp__tile *t, const uint8_t *kb, const kvp__blockfmt *f, int t0,
                                int n);
/* Mask (absolute position of token 0 of the chunk: pos0), soft cap, online
 * softmax: rescales o, updates m and l, writes p. n <= 32, or <= 64 in an ISA
 * that has a vacc2, <= 128 in one that has a vacc4. */
typedef void (*kvp__softmax_fn)(kvp__tile *t, int n, int32_t pos0);
typedef void (*kvp__vacc_fn)(kvp__tile *t, const uint8_t *vb, const kvp__blockfmt *f, int t0,
                             int n);
/* V stage over two full pages of P <= 32 tokens as one chunk: p[r][P*b + i]
 * is block b's token i; t->pf_v is block 0's prefetch distance, pf1 block
 * 1's. */
typedef void (*kvp__vacc2_fn)(kvp__tile *t, const uint8_t *vb0, const uint8_t *vb1, ptrdiff_t pf1,
                              const kvp__blockfmt *f);
/* V stage over four full pages of P <= 32 tokens as one chunk: p[r][P*b + i]
 * is block b's token i, vb[b] its block and pf[b] its prefetch distance
 * (t->pf_v is not read). The ISA's softmax takes 4 * P tokens. */
typedef void (*kvp__vacc4_fn)(kvp__tile *t, const uint8_t *const vb[4], const ptrdiff_t pf[4],
                              const kvp__blockfmt *f);

/* ---- prefill blocks --------------------------------------------------------------
 *
 * Items whose rows of one kv head are many (chunked prefill, large GQA
 * groups: at least KVP__PF_MIN_ROWS) go through a second path, built like a
 * GEMM: the item's K/V are decoded once per chunk of KVP__PF_CHUNK tokens
 * into fp32 (K dim-major, V token-major) and every block of KVP__PF_BLOCK
 * query rows runs register-blocked products against them (logits, online
 * softmax, o += p.v). A K/V element is then loaded and converted once per
 * item (up to KVP__PF_ITEM_ROWS rows) instead of once per tile of 4 rows, and each load in
 * the products feeds KVP__PF_BLOCK FMAs. */
#define KVP__PF_CHUNK 32
#define KVP__PF_BLOCK 8
#define KVP__PF_MIN_ROWS 32
#define KVP__PF_ITEM_ROWS 128 /* rows of one item at most (lib/cpu/attn.c) */

typedef struct {
    float q[KVP__PF_ITEM_ROWS][KVP__ATTN_MAX_D] KVP__ALIGN64; /* q * sm_scale */
    float acc[KVP__PF_ITEM_ROWS][KVP__ATTN_MAX_D] KVP__ALIGN64; /* where o points */
    float kc[KVP__ATTN_MAX_D][KVP__PF_CHUNK] KVP__ALIGN64;  /* the chunk's keys, [d][token] */
    float vc[KVP__PF_CHUNK][KVP__ATTN_MAX_D] KVP__ALIGN64;  /* its values, [token][d] */
    float s[KVP__PF_ITEM_ROWS][KVP__PF_CHUNK] KVP__ALIGN64; /* logits, then p */
    /* bf16 products (kvp__kernels::pf_bf16): two bf16 in each 32-bit word,
     * the pair one vdpbf16ps lane multiplies */
    uint32_t qb[KVP__PF_ITEM_ROWS][KVP__ATTN_MAX_D / 2] KVP__ALIGN64; /* channels 2i, 2i+1 of q */
    uint32_t kb[KVP__ATTN_MAX_D / 2][KVP__PF_CHUNK] KVP__ALIGN64; /* [i][t]: channels 2i, 2i+1 of
                                                                    token t's key */
    uint32_t vb[KVP__PF_CHUNK / 2][KVP__ATTN_MAX_D] KVP__ALIGN64; /* [i][d]: tokens 2i, 2i+1 of
                                                                    channel d's values */
    /* int8 products (kvp__kernels::pf_int8_block): the chunk's halves of 16
     * tokens as pool blocks and the offset of their first token (filled by
     * lib/cpu/attn.c); per half, its keys' scale / max scale (ksn), minima
     * and max scale, and the values' token scales (vs, 0 past the chunk's
     * n) with their maximum (filled by pf_int8_chunk); per row, max|q| */
    const uint8_t *ck[2], *cv[2];
    int32_t coff[2], cP;        /* cP: the page size (pf_int8_chunk) */
    float ksn[2][KVP__ATTN_MAX_D] KVP__ALIGN64, kmin[2][KVP__ATTN_MAX_D] KVP__ALIGN64;
    float ksmax[2];
    float vs[KVP__PF_CHUNK] KVP__ALIGN64;
    float vsmax;
    float qamax[KVP__PF_ITEM_ROWS];
    float *o;                                                 /* [rows][D] accumulators */
    float lv[KVP__PF_ITEM_ROWS][16] KVP__ALIGN64;             /* SIMD paths' running sum (lanes) */
    float m[KVP__PF_ITEM_ROWS], l[KVP__PF_ITEM_ROWS];         /* running max; portable's sum */
    int32_t lo[KVP__PF_ITEM_ROWS], hi[KVP__PF_ITEM_ROWS];     /* positions each row may attend */
    int32_t D;
} kvp__pblock;

/* Tokens [t0, t0+n) of a block (n <= KVP__PF_CHUNK) decoded to fp32 at
 * kc[d * KVP__PF_CHUNK + i] (keys) or vc[i * KVP__ATTN_MAX_D + d] (values); fp8: the
 * layer and head's scale. */
typedef void (*kvp__pf_kdec_fn)(const uint8_t *kb, const kvp__blockfmt *f, int t0, int n,
                                float fp8_scale, float *kc);
typedef void (*kvp__pf_vdec_fn)(const uint8_t *vb, const kvp__blockfmt *f, int t0, int n,
                                float fp8_scale, float *vc);
/* Rows [r0, r0 + KVP__PF_BLOCK) against the chunk in kc/vc: n tokens
 * (the columns past them are zero), token 0 at position pos0. Logits, then
 * when `masked` the rows' bounds and n applied (else all 32 tokens are
 * visible to every row), online softmax (m, l + lv, o rescaled), o += p.v. */
typedef void (*kvp__pf_block_fn)(kvp__pblock *b, int r0, int32_t pos0, int n, int masked);
/* bf16 products: rows [0, rows) of q into qb; the chunk's kc into kb
 * (kbf) and vc into vb (vbf), all KVP__PF_CHUNK columns (zero past n). */
typedef void (*kvp__pf_qpack_fn)(kvp__pblock *b, int rows);
typedef void (*kvp__pf_kvpack_fn)(kvp__pblock *b, int kbf, int vbf);
/* int8 keys and values, pool pages of a multiple of 16 tokens: per item,
 * qamax of rows [0, rows); per chunk (ck, cv, coff set; n tokens), the
 * scales; then the block stage on the codes themselves (the arguments
 * as kvp__pf_block_fn), with integer dot products as decode's: no kc/vc. */
typedef void (*kvp__pf_int8_rows_fn)(kvp__pblock *b, int rows);
typedef void (*kvp__pf_int8_chunk_fn)(kvp__pblock *b, int n, const kvp__blockfmt *kf,
                                      const kvp__blockfmt *vf);

typedef struct {
    const char *name;
    kvp__kprep_fn kprep[KVP_FORMAT_COUNT];
    kvp__klogits_fn klogits[KVP_FORMAT_COUNT][2]; /* [format][dim-major] */
    kvp__softmax_fn softmax;
    kvp__vacc_fn vacc[KVP_FORMAT_COUNT];
    kvp__vacc2_fn vacc2[KVP_FORMAT_COUNT]; /* NULL: pages go one by one */
    kvp__vacc4_fn vacc4[KVP_FORMAT_COUNT]; /* NULL: no four-page chunks (pairs if vacc2) */
    /* prefill blocks: NULL pf_block, none in this ISA (its tiles take
     * every item); NULL decoders fall back to the portable ones */
    kvp__pf_block_fn pf_block;
    uint32_t pf_formats;       /* bit f: blocks take pool K/V of format f (both must be) */
    uint32_t pf_formats_small; /* the same for pages of fewer than KVP__PF_CHUNK tokens */
    kvp__pf_kdec_fn pf_kdec[KVP_FORMAT_COUNT][2]; /* [format][dim-major] */
    kvp__pf_vdec_fn pf_vdec[KVP_FORMAT_COUNT];
    /* bf16 products in the blocks: the formats whose keys / values take
     * them (0: none), the block stages by (keys do) | (values do) << 1
     * (entry 0 unused: pf_block), and the packers into qb, kb, vb */
    uint32_t pf_bf16;
    kvp__pf_block_fn pf_block_bf16[4];
    kvp__pf_qpack_fn pf_qpack;
    kvp__pf_kvpack_fn pf_kvpack;
    /* int8 K and V: integer products in the blocks (NULL: none) */
    kvp__pf_block_fn pf_int8_block;
    kvp__pf_int8_rows_fn pf_int8_rows;
    kvp__pf_int8_chunk_fn pf_int8_chunk;
} kvp__kernels;

/* Each ISA's table; entries it leaves NULL fall back to the portable ones. */
extern const kvp__kernels kvp__kernels_portable;
extern const kvp__kernels kvp__kernels_avx2;
extern const kvp__kernels kvp__kernels_avx512;
extern const kvp__kernels kvp__kernels_avx512_bf16;
extern const kvp__kernels kvp__kernels_neon;
extern const kvp__kernels kvp__kernels_neon_dotprod;

/* Stage lookup with fallback. */
kvp__kprep_fn kvp__pick_kprep(int32_t isa, int32_t format);
kvp__klogits_fn kvp__pick_klogits(int32_t isa, int32_t format, int dim_major);
kvp__softmax_fn kvp__pick_softmax(int32_t isa);
kvp__vacc_fn kvp__pick_vacc(int32_t isa, int32_t format);
/* The ISA's own two-block V stage, or NULL (no fallback: the portable
 * kernels take pages one by one). */
kvp__vacc2_fn kvp__pick_vacc2(int32_t isa, int32_t format);
/* The ISA's own four-block V stage, or NULL. */
kvp__vacc4_fn kvp__pick_vacc4(int32_t isa, int32_t format);

/* The ISA's prefill-block stage for pool pages of these K and V formats
 * and size, or NULL (tiles take every item); *kbf / *vbf: whether it
 * multiplies keys / values in bf16 (the chunk and q then go through the
 * table's packers). The decoders, with fallback. */
kvp__pf_block_fn kvp__pick_pf_block(int32_t isa, int32_t k_format, int32_t v_format,
                                    int32_t page_size, int *kbf, int *vbf);
/* The ISA's int8 block stages for pool pages of these formats and size
 * (both int8, a multiple of 16 tokens), or NULL; *rows and *chunk: their
 * preparations. */
kvp__pf_block_fn kvp__pick_pf_int8(int32_t isa, int32_t k_format, int32_t v_format,
                                   int32_t page_size, kvp__pf_int8_rows_fn *rows,
                                   kvp__pf_int8_chunk_fn *chunk);
/* The ISA's packers for bf16 products (NULL where it has none). */
void kvp__pick_pf_pack(int32_t isa, kvp__pf_qpack_fn *qpack, kvp__pf_kvpack_fn *kvpack);
kvp__pf_kdec_fn kvp__pick_pf_kdec(int32_t isa, int32_t format, int dim_major);
kvp__pf_vdec_fn kvp__pick_pf_vdec(int32_t isa, int32_t format);

/* Encoder primitives: what the block encoders of the append path
 * (lib/cpu/encode.c) do per row. Each gives, element for element, the
 * reference codec's result (lib/numeric.h, lib/blockfmt.h); n is any count
 * (head_dim and less). */
typedef struct kvp__enc_prims {
    const char *name;
    void (*to_f16)(const float *x, uint16_t *y, int n);          /* kvp__f32_to_f16 */
    void (*to_bf16)(const float *x, uint16_t *y, int n);         /* kvp__f32_to_bf16 */
    void (*to_e4m3)(const float *x, uint8_t *y, int n, float inv); /* kvp__f32_to_e4m3(x * inv) */
    void (*from_f16)(const uint16_t *x, float *y, int n);        /* kvp__f16_to_f32 (NaN: any NaN) */
    /* per column d < n of `rows` rows `stride` floats apart: the least and
     * greatest finite value (+Inf / -Inf when none; a zero's sign unspecified) */
    void (*minmax_cols)(const float *x, size_t stride, int rows, int n, float *lo, float *hi);
    void (*minmax)(const float *x, int n, float *lo, float *hi); /* the same over a row */
    float (*absmax)(const float *x, int n);                      /* max |x| over finite x, or 0 */
    /* kvp__asym_code with per-element minimum, inverse scale and levels; with one of each */
    void (*asym_codes)(const float *x, int n, const float *mn, const float *inv, const float *lv,
                       uint8_t *c);
    void (*asym_codes1)(const float *x, int n, float mn, float inv, float lv, uint8_t *c);
    void (*sym8_codes)(const float *x, int n, float inv, int8_t *c); /* kvp__sym8_code */
    int (*nonfinite)(const float *x, int n);                     /* count of NaN and +-Inf */
    /* m rows of n 16-bit values (h, rows hstride apart) written as n columns:
     * out[d * ostride + j] = h[j * hstride + d], j < m <= 8 */
    void (*cols16)(const uint16_t *h, size_t hstride, int m, int n, uint16_t *out, size_t ostride);
} kvp__enc_prims;

extern const kvp__enc_prims kvp__enc_portable;
extern const kvp__enc_prims kvp__enc_avx2;
extern const kvp__enc_prims kvp__enc_avx512;
extern const kvp__enc_prims kvp__enc_neon;

/* The ISA's encoder primitives (the portable ones where it has none). */
const kvp__enc_prims *kvp__pick_enc(int32_t isa);
/* kvp__block_encode()'s bytes and result, through `e`. */
uint64_t kvp__encode(const kvp__enc_prims *e, const kvp__blockfmt *f, void *block, int t0, int n,
                     const float *x, size_t stride, float fp8_scale);
/* Tokens [0, n) of an fp16 block (either order) as fp32 rows y[n][head_dim]:
 * kvp__block_decode()'s values through `e`. */
void kvp__decode_f16(const kvp__enc_prims *e, const kvp__blockfmt *f, const void *block, int n,
                     float *y);

/* num / x for x > 0 where the quotient is finite, else 0: a step or
 * bound computed from the data (max|q|, the largest probability times a
 * scale) may be denormal, and num / x would then overflow to Inf and turn
 * the zeros it multiplies into NaN. What it zeroes is below 2^-126 of the
 * values that set the output, so dropping it changes nothing fp32 keeps. */
static inline float kvp__inv_or_zero(float num, float x) {
    float r = num / x;
    return x > 0.0f && r <= 3.4028234e38f ? r : 0.0f;
}

/* Shared helpers for the kernels (portable code, used by every ISA). */
/* int4 keys: the outlier channels' table of a block (docs/formats.md). */
typedef struct {
    int count;                /* outlier channels (int4: 4 per 32 channels; int4_v1: head_dim/32) */
    bool quads;               /* codes in channel quads [R/4][P][4] (int4), else [R][P] (int4_v1) */
    const uint8_t *table;     /* idx[R] u16, scale[R] fp16, min[R] fp16 */
    const uint8_t *codes;     /* u8 codes (kvp__k4_code_offset) */
} kvp__k4_outl;

static inline kvp__k4_outl kvp__k4_outliers_of(const uint8_t *kb, const kvp__blockfmt *f) {
    kvp__k4_outl o;
    o.count = kvp__k4_outliers(f->format, f->head_dim);
    o.quads = kvp__k4_quads(f->format);
    o.table = kvp__k4_table(f, kb);
    o.codes = o.table + 6 * (size_t)o.count;
    return o;
}

/* Row r of the query at an outlier channel d read from a page: 0 for an
 * index past head_dim (bytes not written by the encoder, or foreign ones),
 * so such an entry adds nothing and no read leaves the query tile. */
static inline float kvp__k4_outlier_q(const kvp__tile *t, int r, unsigned d) {
    return d < (unsigned)t->D ? t->q[r][d] : 0.0f;
}

/* Once per page, after the prep set qconst: t->k4a = the fold's a, and its
 * constant added to qconst (for kernels that add only a . code per token).
 * F16C code in kern_avx2.c, called by the AVX2 prep (AVX-512 has its own,
 * k4_outlier_fold, which keeps the gathered q while the channels repeat). */
void kvp__k4_outlier_prep(kvp__tile *t, const uint8_t *kb, const kvp__blockfmt *f);
/* Scalar: logits[r][i] += sum_j a[r][j] * code_j(t0+i) + cst[r], i < n. */
void kvp__k4_outlier_logits(kvp__tile *t, const uint8_t *kb, const kvp__blockfmt *f, int t0,
                            int n);

void kvp__qprep_int(kvp__tile *t, const uint8_t *kb, const kvp__blockfmt *f);
/* The integer V stages' tokens [i0, n) of a trailing partial token group
 * (page sizes not a multiple of 4), element by element. */
void kvp__vacc_tail(kvp__tile *t, const uint8_t *vb, const kvp__blockfmt *f, int t0, int i0, int n);

/* ---- threads ------------------------------------------------------------------ */

typedef void (*kvp__job_fn)(void *arg, int32_t thread);
/* Copy n bytes with non-temporal stores when `avx2` (kvp__cpu_has_avx2())
 * and the copy is large, else memcpy; kvp__copy_stream_end() once after a
 * batch of copies, before the bytes are published (stream.c). */
void kvp__copy_stream(void *dst, const void *src, size_t n, bool avx2);
void kvp__copy_stream_end(bool avx2);

/* Start threads-1 workers; the caller is thread 0 during kvp__workers_run. */
int kvp__workers_create(const kvp_allocator_t *a, int32_t threads, kvp__workers **out);
void kvp__workers_destroy(kvp__workers *p);
/* Run fn(arg, thread) on every thread and wait for all. No allocation. */
void kvp__workers_run(kvp__workers *p, kvp__job_fn fn, void *arg);
/* One pause of a wait loop on another thread's progress (spins: how many
 * came before): a spin-wait hint, and after a while a yield, so a waiter
 * does not hold a core the thread it waits for may need. */
void kvp__cpu_wait(int spins);

/* ---- backend entry points ------------------------------------------------------ */

/* Paged attention (lib/cpu/attn.c), and the bytes of one thread's scratch
 * the context sets aside for it (lib/cpu/backend.c allocates them). */
int kvp__cpu_attention(kvp_ctx_t *c, const kvp__attn_args *a);
uint64_t kvp__cpu_thread_scratch_bytes(void);

#endif
