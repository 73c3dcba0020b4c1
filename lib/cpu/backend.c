/*
 * The CPU backend: the arena in host memory, append (with seals), page
 * operations, reads and page I/O; the context's resources (worker threads,
 * workspace, per-thread scratch); and the function table that lib/store.c
 * and lib/ctx.c call through. Arguments arrive validated. The attention
 * driver is lib/cpu/attn.c, its kernels lib/cpu/kern_*.c.
 */
#define _DEFAULT_SOURCE /* madvise(MADV_HUGEPAGE) */
#include "../backend.h"
#include "cpu.h"

#include <string.h>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#define HUGE_PAGE (2u << 20)

/* Attention reads pages in table order, not address order: with 4 KiB
 * pages every block is a TLB miss and a cold prefetch stream. Ask Linux for
 * transparent huge pages on arenas we allocated ourselves (libc). */
static void advise_huge_pages(uint8_t *p, uint64_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    uintptr_t a = ((uintptr_t)p + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1);
    uintptr_t e = ((uintptr_t)p + (uintptr_t)bytes) & ~(uintptr_t)(HUGE_PAGE - 1);
    if (e > a) (void)madvise((void *)a, (size_t)(e - a), MADV_HUGEPAGE);
#else
    (void)p;
    (void)bytes;
#endif
}

static int cpu_arena_alloc(kvp_store_t *s, const void *bparams, char *err, size_t err_size) {
    (void)bparams;
    bool libc = s->allocator.alloc == NULL;
    size_t align = libc && s->arena_bytes >= 4 * (uint64_t)HUGE_PAGE ? HUGE_PAGE : KVP_ARENA_ALIGN;
    s->arena = (uint8_t *)kvp__malloc(&s->allocator, (size_t)s->arena_bytes, align);
    if (s->arena != NULL && libc) advise_huge_pages(s->arena, s->arena_bytes);
    if (s->arena == NULL)
        return kvp__errf(err, err_size, KVP_ENOMEM, "cannot allocate an arena of %llu bytes",
                         (unsigned long long)s->arena_bytes);
    memset(s->arena, 0, (size_t)s->layout.fixed_bytes); /* fp8 scales: 0 = not calibrated */
    s->enc = kvp__pick_enc(kvp__cpu_best_isa());
    size_t table = (size_t)s->layout.layers * (size_t)s->layout.kv_heads;
    float *next = (float *)(void *)s->arena;
    if (s->layout.k_format == KVP_FORMAT_FP8_E4M3) {
        s->fp8_k = next;
        next += table;
    }
    if (s->layout.v_format == KVP_FORMAT_FP8_E4M3) s->fp8_v = next;
    return KVP_OK;
}

static void cpu_store_fini(kvp_store_t *s) {
    kvp__free(&s->allocator, s->arena);
    s->arena = NULL;
}

static int cpu_set_fp8_scale(kvp_store_t *s, int side, int32_t layer, int32_t h, float scale,
                             char *err, size_t err_size) {
    (void)err;
    (void)err_size;
    *kvp__fp8_scale(s, side, layer, h) = scale;
    return KVP_OK;
}

static int cpu_get_fp8_scale(const kvp_store_t *s, int side, int32_t layer, int32_t h,
                             float *scale, char *err, size_t err_size) {
    (void)err;
    (void)err_size;
    *scale = *kvp__fp8_scale(s, side, layer, h);
    return KVP_OK;
}

static int cpu_nonfinite(const kvp_store_t *s, uint64_t *count, char *err, size_t err_size) {
    (void)err;
    (void)err_size;
    *count = s->nonfinite;
    return KVP_OK;
}

/* fp8 scale of a block's side, or 0 when the side is not fp8. */
static float block_fp8_scale(const kvp_store_t *s, const kvp__blockfmt *f, int32_t layer,
                             int32_t h) {
    if (f->format != KVP_FORMAT_FP8_E4M3) return 0.0f;
    return *kvp__fp8_scale(s, f->is_key ? 0 : 1, layer, h);
}

/* ---- append ------------------------------------------------------------------ */

typedef struct {
    const uint8_t *base;
    int64_t row_stride; /* elements */
    size_t esize;
    int32_t dtype;
} row_source;

static row_source source_of(const kvp_store_t *s, const kvp_append_params_t *a, bool value) {
    row_source r;
    r.base = (const uint8_t *)(value ? a->v : a->k);
    int64_t st = value ? a->v_row_stride : a->k_row_stride;
    r.row_stride = st != 0 ? st : (int64_t)s->layout.kv_heads * s->layout.head_dim;
    r.esize = kvp__dtype_size(a->dtype);
    r.dtype = a->dtype;
    return r;
}

/* fp32 copy of head h of row r. */
static void load_head(const kvp_store_t *s, const row_source *src, int64_t r, int32_t h, int32_t D,
                      float *dst) {
    const uint8_t *p = src->base + ((size_t)r * (size_t)src->row_stride + (size_t)h * (size_t)D) *
                                       src->esize;
    if (src->dtype == KVP_FORMAT_FP16) {
        uint16_t row[KVP_MAX_HEAD_DIM];
        memcpy(row, p, (size_t)D * 2);
        s->enc->from_f16(row, dst, D);
    } else {
        kvp__load_f32(src->dtype, p, (size_t)D, dst);
    }
}

/* Calibrate still-unset fp8 scales of this layer from this call's rows. */
static void calibrate_fp8(kvp_store_t *s, const kvp_append_params_t *a, const row_source *src,
                          int side) {
    int32_t H = s->layout.kv_heads, D = s->layout.head_dim;
    for (int32_t h = 0; h < H; h++) {
        float *scale = kvp__fp8_scale(s, side, a->layer, h);
        if (*scale != 0.0f) continue;
        float amax = 0.0f;
        for (int64_t r = 0; r < a->rows; r++) {
            if (a->slots[r] < 0) continue;
            load_head(s, src, r, h, D, s->scratch);
            for (int32_t d = 0; d < D; d++)
                if (isfinite(s->scratch[d]) && fabsf(s->scratch[d]) > amax)
                    amax = fabsf(s->scratch[d]);
        }
        bool any = false;
        for (int64_t r = 0; r < a->rows && !any; r++) any = a->slots[r] >= 0;
        if (any) *scale = kvp__fp8_calibrated_scale(amax);
    }
}

/* Quantize pool page op->dst of this layer, one side, from staging + rows.
 * Returns the non-finite inputs among the appended rows (the staged tokens
 * were counted when they were appended). */
static uint64_t seal_side(kvp_store_t *s, const kvp_append_params_t *a, const kvp_page_op_t *op,
                          const row_source *src, bool value) {
    uint64_t bad = 0;
    int32_t H = s->layout.kv_heads, D = s->layout.head_dim, P = s->layout.page_size;
    const kvp__blockfmt *pf = value ? &s->vfmt : &s->kfmt;
    const kvp__blockfmt *sf = value ? &s->svfmt : &s->skfmt;
    for (int32_t h = 0; h < H; h++) {
        float *rows = s->scratch; /* [P][D] */
        if (op->count > 0) {
            const uint8_t *sb = value ? kvp__block_v(s, a->layer, op->src, h)
                                      : kvp__block_k(s, a->layer, op->src, h);
            kvp__decode_f16(s->enc, sf, sb, op->count, rows);
        }
        for (int32_t t = op->count; t < P; t++)
            load_head(s, src, op->row + (t - op->count), h, D, rows + (size_t)t * (size_t)D);
        uint8_t *db = value ? kvp__block_v(s, a->layer, op->dst, h)
                            : kvp__block_k(s, a->layer, op->dst, h);
        if (pf->rot) {
            /* the staged rows are in the rotated basis already: the appended
             * ones join them there, and the page is encoded as it stands */
            kvp__blockfmt raw = *pf;
            raw.rot = 0;
            for (int32_t t = op->count; t < P; t++) {
                bad += (uint64_t)s->enc->nonfinite(rows + (size_t)t * (size_t)D, D);
                kvp__rot_forward(rows + (size_t)t * (size_t)D, D);
            }
            (void)kvp__encode(s->enc, &raw, db, 0, P, rows, (size_t)D, 0.0f);
            continue;
        }
        bad += kvp__encode(s->enc, pf, db, 0, P, rows, (size_t)D, block_fp8_scale(s, pf, a->layer, h));
        for (int32_t t = 0; t < op->count; t++) /* counted when they were staged */
            bad -= (uint64_t)s->enc->nonfinite(rows + (size_t)t * (size_t)D, D);
    }
    return bad;
}

static bool in_seal(const kvp_append_params_t *a, int64_t r, int32_t P) {
    for (int i = 0; i < a->num_ops; i++) {
        const kvp_page_op_t *op = &a->ops[i];
        if (op->kind == KVP_OP_SEAL && r >= op->row && r < (int64_t)op->row + (P - op->count))
            return true;
    }
    return false;
}

/* Write the rows no seal took; returns their non-finite inputs (the encoder
 * counts them as it converts). Rows whose slots follow each other in one
 * page (a prefill's) are encoded as one run, head by head. */
static uint64_t write_rows(kvp_store_t *s, const kvp_append_params_t *a, const row_source *src,
                           bool value) {
    int32_t H = s->layout.kv_heads, D = s->layout.head_dim, P = s->layout.page_size;
    uint64_t bad = 0;
    for (int64_t r = 0; r < a->rows;) {
        int64_t slot = a->slots[r];
        if (slot < 0 || in_seal(a, r, P)) {
            r++;
            continue;
        }
        int32_t page = (int32_t)(slot / P), t = (int32_t)(slot % P), n = 1;
        while (r + n < a->rows && t + n < P && a->slots[r + n] == slot + n && !in_seal(a, r + n, P)) n++;
        const kvp__blockfmt *f = value ? kvp__fmt_v(s, page) : kvp__fmt_k(s, page);
        for (int32_t h = 0; h < H; h++) {
            /* fp32 rows are read where they are; others converted into scratch
             * (page_size rows) first */
            const float *x = s->scratch;
            size_t stride = (size_t)D;
            if (src->dtype == KVP_FORMAT_FP32 && ((uintptr_t)src->base & 3u) == 0) {
                x = (const float *)(const void *)src->base + (size_t)r * (size_t)src->row_stride +
                    (size_t)h * (size_t)D;
                stride = (size_t)src->row_stride;
            } else {
                for (int32_t i = 0; i < n; i++)
                    load_head(s, src, r + i, h, D, s->scratch + (size_t)i * (size_t)D);
            }
            uint8_t *b = value ? kvp__block_v(s, a->layer, page, h)
                               : kvp__block_k(s, a->layer, page, h);
            bad += kvp__encode(s->enc, f, b, t, n, x, stride, block_fp8_scale(s, f, a->layer, h));
        }
        r += n;
    }
    return bad;
}

static int cpu_append(kvp_store_t *s, const kvp_append_params_t *a, char *err, size_t err_size) {
    (void)err;
    (void)err_size;
    row_source ks = source_of(s, a, false), vs = source_of(s, a, true);
    if (s->layout.k_format == KVP_FORMAT_FP8_E4M3) calibrate_fp8(s, a, &ks, 0);
    if (s->layout.v_format == KVP_FORMAT_FP8_E4M3) calibrate_fp8(s, a, &vs, 1);
    /* Seals first: a seal's staging page may receive this step's later rows. */
    uint64_t bad = 0;
    for (int i = 0; i < a->num_ops; i++) {
        if (a->ops[i].kind != KVP_OP_SEAL) continue;
        bad += seal_side(s, a, &a->ops[i], &ks, false);
        bad += seal_side(s, a, &a->ops[i], &vs, true);
    }
    bad += write_rows(s, a, &ks, false);
    bad += write_rows(s, a, &vs, true);
    s->nonfinite += bad;
    return KVP_OK;
}

/* ---- page operations ------------------------------------------------------------ */

static void copy_page(kvp_store_t *s, int32_t src, int32_t dst) {
    for (int32_t l = 0; l < s->layout.layers; l++) {
        bool pool = src < s->num_pages;
        size_t kb = (size_t)(pool ? s->page_stride_k : s->spage_stride_k);
        size_t vb = (size_t)(pool ? s->page_stride_v : s->spage_stride_v);
        memmove(kvp__block_k(s, l, dst, 0), kvp__block_k(s, l, src, 0), kb);
        memmove(kvp__block_v(s, l, dst, 0), kvp__block_v(s, l, src, 0), vb);
    }
}

static void unseal_page(kvp_store_t *s, const kvp_page_op_t *op) {
    int32_t D = s->layout.head_dim;
    kvp__blockfmt svraw = s->svfmt; /* rotated values stay in their basis */
    svraw.rot = 0;
    for (int32_t l = 0; l < s->layout.layers; l++)
        for (int32_t h = 0; h < s->layout.kv_heads; h++) {
            kvp__block_decode(&s->kfmt, kvp__block_k(s, l, op->src, h), 0, op->count, s->scratch,
                              (size_t)D, block_fp8_scale(s, &s->kfmt, l, h));
            kvp__encode(s->enc, &s->skfmt, kvp__block_k(s, l, op->dst, h), 0, op->count, s->scratch,
                        (size_t)D, 0.0f);
            kvp__block_decode(&s->vfmt, kvp__block_v(s, l, op->src, h), 0, op->count, s->scratch,
                              (size_t)D, block_fp8_scale(s, &s->vfmt, l, h));
            kvp__encode(s->enc, &svraw, kvp__block_v(s, l, op->dst, h), 0, op->count, s->scratch,
                        (size_t)D, 0.0f);
        }
}

static int cpu_apply_ops(kvp_store_t *s, const kvp_page_op_t *ops, int32_t n, char *err,
                         size_t err_size) {
    (void)err;
    (void)err_size;
    for (int32_t i = 0; i < n; i++) {
        if (ops[i].kind == KVP_OP_COPY && ops[i].src != ops[i].dst) copy_page(s, ops[i].src, ops[i].dst);
        else if (ops[i].kind == KVP_OP_UNSEAL) unseal_page(s, &ops[i]);
    }
    return KVP_OK;
}

static int cpu_read(const kvp_store_t *s, int32_t layer, int32_t page, int32_t t0, int32_t n,
                    float *k, float *v, char *err, size_t err_size) {
    (void)err;
    (void)err_size;
    int32_t H = s->layout.kv_heads, D = s->layout.head_dim;
    size_t stride = (size_t)H * (size_t)D;
    for (int32_t h = 0; h < H; h++) {
        const kvp__blockfmt *kf = kvp__fmt_k(s, page), *vf = kvp__fmt_v(s, page);
        if (k != NULL)
            kvp__block_read(kf, kvp__block_k(s, layer, page, h), t0, n, k + (size_t)h * (size_t)D,
                            stride, block_fp8_scale(s, kf, layer, h));
        if (v != NULL)
            kvp__block_read(vf, kvp__block_v(s, layer, page, h), t0, n, v + (size_t)h * (size_t)D,
                            stride, block_fp8_scale(s, vf, layer, h));
    }
    return KVP_OK;
}

/* ---- page I/O: the serialization [layer][K blocks][V blocks] ------------------------- */

static int cpu_page_io(kvp_store_t *s, int32_t page, uint64_t offset, void *host, uint64_t bytes,
                       int to_host, char *err, size_t err_size) {
    (void)err;
    (void)err_size;
    bool pool = page < s->num_pages;
    uint64_t kb = pool ? s->page_stride_k : s->spage_stride_k;
    uint64_t vb = pool ? s->page_stride_v : s->spage_stride_v;
    uint64_t end = offset + bytes, at = 0;
    uint8_t *h = (uint8_t *)host;
    for (int32_t l = 0; l < s->layout.layers && at < end; l++)
        for (int side = 0; side < 2; side++) {
            uint64_t len = side ? vb : kb;
            uint64_t lo = at > offset ? at : offset, hi = at + len < end ? at + len : end;
            if (lo < hi) {
                uint8_t *dev = (side ? kvp__block_v(s, l, page, 0) : kvp__block_k(s, l, page, 0)) +
                               (lo - at);
                if (to_host) memcpy(h + (lo - offset), dev, (size_t)(hi - lo));
                else memcpy(dev, h + (lo - offset), (size_t)(hi - lo));
            }
            at += len;
        }
    return KVP_OK;
}

static int cpu_synchronize(kvp_store_t *s, char *err, size_t err_size) {
    (void)s;
    (void)err;
    (void)err_size;
    return KVP_OK;
}

/* ---- the context: threads, workspace, scratch --------------------------------------- */

static void cpu_ctx_fini(kvp_ctx_t *c) {
    kvp__workers_destroy(c->workers);
    c->workers = NULL;
    kvp__free(&c->allocator, c->scratch);
    kvp__free(&c->allocator, c->workspace);
    c->scratch = NULL;
    c->workspace = NULL;
}

/* Everything attention needs, allocated and started once, so that a call
 * neither allocates nor spawns. */
static int cpu_ctx_init(kvp_ctx_t *c, const void *bparams, char *err, size_t err_size) {
    (void)bparams;
    c->scratch_stride = (kvp__cpu_thread_scratch_bytes() + 63) & ~(uint64_t)63;
    c->scratch = (uint8_t *)kvp__malloc(&c->allocator,
                                        (size_t)(c->scratch_stride * (uint64_t)c->threads), 64);
    c->workspace = (uint8_t *)kvp__malloc(&c->allocator, (size_t)c->workspace_bytes, 64);
    if (c->scratch == NULL || c->workspace == NULL) {
        cpu_ctx_fini(c);
        return kvp__errf(err, err_size, KVP_ENOMEM, "cannot allocate %llu bytes of workspace",
                         (unsigned long long)c->workspace_bytes);
    }
    if (kvp__workers_create(&c->allocator, c->threads, &c->workers) != KVP_OK) {
        cpu_ctx_fini(c);
        return kvp__errf(err, err_size, KVP_ENOMEM, "cannot start %d worker threads",
                         (int)c->threads - 1);
    }
    return KVP_OK;
}

/* ---- the function table ------------------------------------------------------------ */

const kvp__backend kvp__cpu_backend = {
    "cpu",
    KVP_BACKEND_CPU,
    cpu_arena_alloc,
    cpu_store_fini,
    cpu_append,
    cpu_apply_ops,
    cpu_read,
    cpu_set_fp8_scale,
    cpu_get_fp8_scale,
    cpu_nonfinite,
    cpu_page_io,
    cpu_synchronize,
    cpu_ctx_init,
    cpu_ctx_fini,
    kvp__cpu_attention,
};
