/*
 * CPU paged attention: schedule (sequence, group of kv heads, row block,
 * page range) items over the context's threads, run the ISA's kernel stages
 * on each, and merge split sequences (flash-decoding). No allocation: the
 * schedule and the split partials live in the context's workspace, tiles in
 * per-thread scratch.
 *
 * An item walks its pages in order and, within a page, its kv heads in
 * order: a page's K (and V) blocks of consecutive heads are adjacent in the
 * arena, so each page is read as two long sequential runs rather than
 * 8 KiB pieces at a 64 KiB stride (measured: paged decode 1.5-2x slower
 * with one item per kv head).
 */
#include "cpu.h"

#include <stdatomic.h>
#include <string.h>

/* A split covers at least this many tokens: shorter ones cost more to merge
 * than they save. */
#define MIN_SPLIT_TOKENS 256
/* Aim for this many items per thread, so uneven sequences still balance.
 * Each split item costs its own setup (query rows), lead prefetch and
 * partial result to merge: 4 measured faster than 8 (2 threads, batch 1,
 * page 32, best of 6 interleaved: 8k tokens fp16 0.95 -> 0.91 ms, int4
 * 0.49 -> 0.46; 32k fp16 3.92 -> 3.80, int4 1.86 -> 1.80; 1k unchanged). */
#define ITEMS_PER_THREAD 4

typedef struct {
    kvp__kprep_fn kprep;
    kvp__klogits_fn klogits;
    kvp__vacc_fn vacc;
    kvp__vacc2_fn vacc2; /* two full pages as one chunk, or NULL */
    kvp__vacc4_fn vacc4; /* four full pages as one chunk, or NULL */
    kvp__pf_kdec_fn pf_kdec; /* prefill blocks' decoders */
    kvp__pf_vdec_fn pf_vdec;
    const kvp__blockfmt *kf, *vf;
    uint64_t kdata, kused, vdata, vused; /* element bytes and used bytes of a K / V block */
} stage_set;

typedef struct {
    kvp_ctx_t *ctx;
    const kvp_store_t *store;
    const kvp_kv_view_t *view;
    const kvp_attention_params_t *params;
    int32_t batch, kv_heads, group, q_heads, D, P, layer;
    float sm_scale;
    /* rotated values (int4): each channel's sign and scale of the way back
     * (kvp__rot_inverse), applied to the output rows; NULL otherwise */
    const float *unrot;
    float unrot_buf[KVP__ATTN_MAX_D];
    stage_set pool_stages, staging_stages;
    kvp__softmax_fn softmax;
    kvp__pf_block_fn pf_block; /* NULL: no prefill blocks (the ISA has none, or a soft cap) */
    int pf_kbf, pf_vbf;        /* the blocks multiply keys / values in bf16 */
    kvp__pf_qpack_fn pf_qpack; /* their packers (kvp__kernels) */
    kvp__pf_kvpack_fn pf_kvpack;
    kvp__pf_block_fn pf_int8_block; /* int8 K and V: integer block stages for whole pool chunks */
    kvp__pf_int8_rows_fn pf_int8_rows;
    kvp__pf_int8_chunk_fn pf_int8_chunk;
    /* schedule, in the workspace */
    int32_t *item_start; /* [B+1] */
    int32_t *splits;     /* [B] */
    int32_t *split_pages;/* [B] pages per split where the splits are equal (split_bounds) */
    int64_t *part_off;   /* [B] float offset of the sequence's partials, or -1 */
    float *partials;
    atomic_int next_item;
    /* [items] splits finished, counted at each unit's split-0 item (only
     * when some sequence is split): the last split to finish starts the
     * unit's merge, so no second pass over the threads waits for the
     * slowest. */
    atomic_int *split_done;
    /* [items] the unit's merge parts (one per kv head) handed out, at the
     * same index: threads that run out of items take parts too. */
    atomic_int *merge_next;
} attn_job;

/* ---- sequence geometry ------------------------------------------------------------ */

static int32_t seq_pages(const attn_job *j, int32_t b) {
    return j->view->indptr[b + 1] - j->view->indptr[b];
}
static int32_t seq_kv_len(const attn_job *j, int32_t b) {
    int32_t n = seq_pages(j, b);
    return n == 0 ? 0 : (n - 1) * j->P + j->view->last_page_len[b];
}
static int32_t seq_q_len(const attn_job *j, int32_t b) {
    return j->params->qo_indptr[b + 1] - j->params->qo_indptr[b];
}
/* Whether sequence b's items are prefill blocks (cpu.h): enough rows of
 * each kv head to share a decoded chunk (rows_per_head >= 32 also gives
 * one head per item). */
static bool seq_block(const attn_job *j, int32_t b) {
    return j->pf_block != NULL && seq_q_len(j, b) * j->group >= KVP__PF_MIN_ROWS;
}

/* How a sequence's query rows are grouped into items: the rows of one kv
 * head (q_len x group) fill whole tiles of 4; an item holds up to
 * KVP__ITEM_ROWS rows, several heads when they fit, else one head's rows in
 * row blocks. Prefill blocks with more rows than that take up to
 * KVP__PF_ITEM_ROWS per item (equal shares, whole blocks of 8): each item
 * decodes and reads the head's K/V once, so four times the rows cut that
 * traffic four times (it was 30% of an fp16 chunk's time at 32 rows). Such
 * items are not split (their partials would not fit the 32-row slots). */
typedef struct {
    int32_t rows_per_head, rows_per_item, heads_per_item, head_groups, rowblocks, units;
} seq_shape;

static seq_shape shape_of(const attn_job *j, int32_t b) {
    seq_shape sh;
    sh.rows_per_head = seq_q_len(j, b) * j->group;
    sh.rows_per_item = KVP__ITEM_ROWS;
    if (sh.rows_per_head == 0) {
        sh.heads_per_item = 1;
        sh.head_groups = sh.rowblocks = sh.units = 0;
        return sh;
    }
    if (sh.rows_per_head <= KVP__ITEM_ROWS) {
        int32_t tiles = (sh.rows_per_head + KVP__TILE_ROWS - 1) / KVP__TILE_ROWS;
        sh.heads_per_item = KVP__ITEM_ROWS / KVP__TILE_ROWS / tiles;
        if (sh.heads_per_item > j->kv_heads) sh.heads_per_item = j->kv_heads;
        sh.rowblocks = 1;
    } else if (seq_block(j, b)) {
        int32_t items = (sh.rows_per_head + KVP__PF_ITEM_ROWS - 1) / KVP__PF_ITEM_ROWS;
        int32_t per = (sh.rows_per_head + items - 1) / items;
        sh.rows_per_item = (per + KVP__PF_BLOCK - 1) / KVP__PF_BLOCK * KVP__PF_BLOCK;
        sh.heads_per_item = 1;
        sh.rowblocks = (sh.rows_per_head + sh.rows_per_item - 1) / sh.rows_per_item;
    } else {
        sh.heads_per_item = 1;
        sh.rowblocks = (sh.rows_per_head + KVP__ITEM_ROWS - 1) / KVP__ITEM_ROWS;
    }
    sh.head_groups = (j->kv_heads + sh.heads_per_item - 1) / sh.heads_per_item;
    sh.units = sh.head_groups * sh.rowblocks;
    return sh;
}

/* ---- schedule ------------------------------------------------------------------------ */

static size_t align_up(size_t x) { return (x + 63) & ~(size_t)63; }

static int plan_schedule(attn_job *j) {
    kvp_ctx_t *c = j->ctx;
    int32_t B = j->batch;
    size_t need = align_up((size_t)(B + 1) * 4) + 2 * align_up((size_t)B * 4) +
                  align_up((size_t)B * 8);
    if (need > c->workspace_bytes)
        return kvp__errf(c->error, KVP_ERR_SIZE, KVP_ENOMEM,
                         "a batch of %d sequences needs %zu bytes of schedule; the context's "
                         "workspace has %llu (raise kvp_ctx_params_t::workspace_bytes)",
                         (int)B, need, (unsigned long long)c->workspace_bytes);
    uint8_t *w = c->workspace;
    j->item_start = (int32_t *)(void *)w;
    w += align_up((size_t)(B + 1) * 4);
    j->splits = (int32_t *)(void *)w;
    w += align_up((size_t)B * 4);
    j->split_pages = (int32_t *)(void *)w;
    w += align_up((size_t)B * 4);
    j->part_off = (int64_t *)(void *)w;
    w += align_up((size_t)B * 8);
    j->partials = (float *)(void *)w;
    uint64_t free_bytes = c->workspace_bytes - need;

    int64_t base_items = 0;
    for (int32_t b = 0; b < B; b++) base_items += shape_of(j, b).units;
    int64_t target = (int64_t)c->threads * ITEMS_PER_THREAD;
    int32_t factor = (c->threads > 1 && base_items < target && base_items > 0)
                         ? (int32_t)((target + base_items - 1) / base_items)
                         : 1;
    int32_t min_pages = (MIN_SPLIT_TOKENS + j->P - 1) / j->P;
    size_t part_floats = (size_t)KVP__ITEM_ROWS * (size_t)(j->D + 2);
    uint64_t used = 0; /* partials' floats */
    for (int pass = 0; pass < 2; pass++) {
        used = 0;
        uint64_t items_total = 0;
        for (int32_t b = 0; b < B; b++) {
            int32_t pages = seq_pages(j, b), s = factor;
            int32_t most = (pages + min_pages - 1) / min_pages;
            if (s > most) s = most;
            if (s < 1 || shape_of(j, b).rows_per_item > KVP__ITEM_ROWS) s = 1;
            int32_t per = pages > 0 ? (pages + s - 1) / s : 1;
            s = pages > 0 ? (pages + per - 1) / per : 1;
            j->splits[b] = s;
            j->split_pages[b] = per;
            j->part_off[b] = -1;
            if (s > 1) {
                j->part_off[b] = (int64_t)used;
                used += (uint64_t)shape_of(j, b).units * (uint64_t)s * part_floats;
            }
            items_total += (uint64_t)shape_of(j, b).units * (uint64_t)s;
        }
        /* partials, then two counters per item (split_done, merge_next) */
        if (used == 0 || align_up((size_t)(used * sizeof(float))) + 2 * items_total * sizeof(atomic_int) <= free_bytes)
            break;
        factor = 1; /* not enough workspace for partials: no splits */
    }
    int32_t items = 0;
    for (int32_t b = 0; b < B; b++) {
        j->item_start[b] = items;
        items += shape_of(j, b).units * j->splits[b];
    }
    j->item_start[B] = items;
    j->split_done = (atomic_int *)(void *)(c->workspace + need + align_up((size_t)(used * sizeof(float))));
    j->merge_next = j->split_done + items;
    if (used > 0)
        for (int32_t i = 0; i < items; i++) {
            atomic_init(&j->split_done[i], 0);
            atomic_init(&j->merge_next[i], 0);
        }
    return KVP_OK;
}

/* ---- one item ---------------------------------------------------------------------------- */

typedef struct {
    int32_t b, unit, split;
    int32_t h0, h1;           /* kv heads [h0, h1) */
    int32_t r0, r1;           /* rows [r0, r1) of each head (row = i*group + g) */
    int32_t tiles_per_head;
} item_id;

static item_id decode_item(const attn_job *j, int32_t item) {
    int32_t lo = 0, hi = j->batch - 1;
    while (lo < hi) { /* last b with item_start[b] <= item */
        int32_t mid = (lo + hi + 1) / 2;
        if (j->item_start[mid] <= item) lo = mid;
        else hi = mid - 1;
    }
    item_id id;
    seq_shape sh = shape_of(j, lo);
    id.b = lo;
    int32_t local = item - j->item_start[lo], s = j->splits[lo];
    id.split = local % s;
    id.unit = local / s;
    int32_t hg = id.unit / sh.rowblocks, rb = id.unit % sh.rowblocks;
    id.h0 = hg * sh.heads_per_item;
    id.h1 = id.h0 + sh.heads_per_item < j->kv_heads ? id.h0 + sh.heads_per_item : j->kv_heads;
    id.r0 = rb * sh.rows_per_item;
    id.r1 = id.r0 + sh.rows_per_item < sh.rows_per_head ? id.r0 + sh.rows_per_item : sh.rows_per_head;
    id.tiles_per_head = (id.r1 - id.r0 + KVP__TILE_ROWS - 1) / KVP__TILE_ROWS;
    return id;
}

/* x *= w over a row (head_dim is a multiple of 16; the fixed inner loop
 * vectorizes, where x[d] *= j->sm_scale reloaded the scale per element). */
static void scale_in_place(float *x, float w, int32_t D) {
    for (int32_t d = 0; d < D; d += 16)
        for (int k = 0; k < 16; k++) x[d + k] *= w;
}

static void load_q_row(const attn_job *j, int32_t b, int32_t i, int32_t qh, float *dst) {
    size_t D = (size_t)j->D;
    const kvp_attention_params_t *p = j->params;
    size_t row = ((size_t)(p->qo_indptr[b] + i) * (size_t)j->q_heads + (size_t)qh) * D;
    kvp__load_f32(p->dtype, (const uint8_t *)p->q + row * kvp__dtype_size(p->dtype), D, dst);
    scale_in_place(dst, j->sm_scale, j->D);
}

static float fp8_scale_of(const attn_job *j, int side, int32_t h) {
    float *s = kvp__fp8_scale(j->store, side, j->layer, h);
    return s != NULL ? *s : 0.0f;
}

/* The positions [lo, hi] that query i of sequence b may attend. */
static void row_bounds(const attn_job *j, int32_t b, int32_t i, int32_t *lo, int32_t *hi) {
    int32_t q_len = seq_q_len(j, b), kv_len = seq_kv_len(j, b);
    int32_t causal = j->params->causal;
    int32_t window = j->params->window_left;
    int32_t pos = kv_len - q_len + i;
    *hi = causal ? pos : kv_len - 1;
    *lo = window >= 0 && pos - window > 0 ? pos - window : 0;
}

/* Set up the item's tiles: heads h0..h1-1 in order, each head's rows
 * [r0, r1) in tiles of 4 (the last one padded with copies of its last row,
 * which the kernels compute and nobody reads). Returns the tile count. */
static int setup_tiles(const attn_job *j, const item_id *id, kvp__tile *tiles, float *o) {
    int ntiles = (id->h1 - id->h0) * id->tiles_per_head;
    memset(o, 0, (size_t)ntiles * KVP__TILE_ROWS * (size_t)j->D * sizeof(float));
    for (int t = 0; t < ntiles; t++) {
        kvp__tile *tl = &tiles[t];
        int32_t h = id->h0 + t / id->tiles_per_head;
        int32_t first = id->r0 + (t % id->tiles_per_head) * KVP__TILE_ROWS;
        tl->rows = id->r1 - first < KVP__TILE_ROWS ? id->r1 - first : KVP__TILE_ROWS;
        tl->head = h;
        tl->row0 = first;
        tl->D = j->D;
        tl->P = j->P;
        tl->o = o + (size_t)t * KVP__TILE_ROWS * (size_t)j->D;
        tl->soft_cap = j->params->logit_soft_cap;
        tl->fp8_k = fp8_scale_of(j, 0, h);
        tl->fp8_v = fp8_scale_of(j, 1, h);
        tl->k4valid = 0; /* new q */
        tl->qnvalid = 0;
        for (int r = 0; r < KVP__TILE_ROWS; r++) {
            int32_t row = first + (r < tl->rows ? r : tl->rows - 1);
            int32_t i = row / j->group, g = row % j->group;
            load_q_row(j, id->b, i, h * j->group + g, tl->q[r]);
            row_bounds(j, id->b, i, &tl->lo[r], &tl->hi[r]);
            tl->m[r] = -INFINITY;
            tl->l[r] = 0.0f;
            memset(tl->lvec[r], 0, sizeof tl->lvec[r]);
        }
    }
    return ntiles;
}

static void resolve_page(const attn_job *j, int32_t b, int32_t h, int32_t page,
                         const uint8_t **kb, const uint8_t **vb, const stage_set **st) {
    int32_t id = j->view->indices[j->view->indptr[b] + page];
    *kb = kvp__block_k(j->store, j->layer, id, h);
    *vb = kvp__block_v(j->store, j->layer, id, h);
    *st = id < j->store->num_pages ? &j->pool_stages : &j->staging_stages;
}

/* How far ahead an item prefetches, in KV bytes: the kernels prefetch, as
 * they stream through a block, the same offsets of the block this many
 * bytes of (page, head) steps further on (t->pf_k / pf_v), and the item
 * fetches that block's scale data. A fixed distance in bytes is a fixed
 * lead in time: one step ahead (the next head's block, as this code first
 * did) is about 1 us for fp16 but only 0.3-0.5 us for int4, which DRAM
 * latency under load does not fit in. Measured (2 threads, 32k tokens,
 * page 32, KV GB/s fp16 / int8 / int4, two runs each): 8 KiB 31-32 / 21-22
 * / 15-16, 16 KiB 33 / 25-27 / 12-17, 32 KiB 30-33 / 26 / 18, 64 KiB 34 /
 * 24-26 / 16; the old one-step lead gave 25 / 19-20 / 14 and paged ran at
 * 0.87 of the contiguous layout's speed, now 0.97-1.07. */
#define PREFETCH_LEAD_BYTES 32768

/* Into L2 (prefetcht1). The scale data goes there once, at the lead; it is
 * not fetched again into L1 one step ahead: that burst of prefetcht0 at
 * every step (earlier code) measured 2 - 8% slower for int4 and no faster
 * for int8 (2 threads, batch 1 at 8k and 32k, batch 16 at 8k; in-process
 * A/B), its samples piling up on the prefetches themselves. */
static void prefetch_range(const uint8_t *b, uint64_t from, uint64_t to) {
    for (uint64_t off = from; off < to; off += 64) __builtin_prefetch(b + off, 0, 2);
}

/* One (page, head) step of an item: its blocks and their stages. */
typedef struct {
    const uint8_t *kb, *vb;
    const stage_set *st;
} step_blocks;

/* Whether any row of the tile may attend a position in [first, last]. */
static bool tile_sees(const kvp__tile *tl, int32_t first, int32_t last) {
    bool any = false;
    for (int r = 0; r < tl->rows; r++) any |= tl->lo[r] <= last && tl->hi[r] >= first;
    return any;
}

/* One head's tiles over one page. */
static void run_page(const attn_job *j, kvp__tile *tiles, int ntiles, const uint8_t *kb,
                     const uint8_t *vb, const stage_set *st, int32_t tok0, int32_t ntok) {
    for (int t = 0; t < ntiles; t++)
        if (st->kprep != NULL) st->kprep(&tiles[t], kb, st->kf);
    for (int32_t c0 = 0; c0 < ntok; c0 += KVP__CHUNK) {
        int n = ntok - c0 < KVP__CHUNK ? ntok - c0 : KVP__CHUNK;
        int32_t first = tok0 + c0, last = first + n - 1;
        for (int t = 0; t < ntiles; t++) {
            kvp__tile *tl = &tiles[t];
            if (!tile_sees(tl, first, last)) continue;
            st->klogits(tl, kb, st->kf, c0, n);
            j->softmax(tl, n, first);
            st->vacc(tl, vb, st->vf, c0, n);
        }
    }
}

/* nb = 2 or 4 full pages (pg .. pg + nb - 1; P = 16 or 32) of one head's
 * tiles as one chunk of nb*P tokens: the pages' keys last page first, each
 * page's logits moved up to [k*P, (k+1)*P), one softmax, one V stage over
 * the nb blocks (vacc2 or vacc4). */
static void run_group(const attn_job *j, kvp__tile *tiles, int ntiles, const step_blocks cb[4],
                      const ptrdiff_t pf_k[4], const ptrdiff_t pf_v[4], int32_t tok0, int nb) {
    const stage_set *st = cb[0].st;
    const int P = j->P;
    int32_t last = tok0 + nb * P - 1;
    for (int t = 0; t < ntiles; t++) {
        kvp__tile *tl = &tiles[t];
        if (!tile_sees(tl, tok0, last)) continue;
        for (int k = nb - 1; k >= 0; k--) {
            tl->pf_k = pf_k[k];
            if (st->kprep != NULL) st->kprep(tl, cb[k].kb, st->kf);
            st->klogits(tl, cb[k].kb, st->kf, 0, P);
            if (k > 0)
                for (int r = 0; r < KVP__TILE_ROWS; r++)
                    memcpy(&tl->logits[r][k * P], &tl->logits[r][0], (size_t)P * sizeof(float));
        }
        j->softmax(tl, nb * P, tok0);
        if (nb == 4) {
            const uint8_t *const vb[4] = {cb[0].vb, cb[1].vb, cb[2].vb, cb[3].vb};
            st->vacc4(tl, vb, pf_v, st->vf);
        } else {
            tl->pf_v = pf_v[0];
            st->vacc2(tl, cb[0].vb, cb[1].vb, pf_v[1], st->vf);
        }
    }
}

/* The merge's and the output's loops: head_dim is a multiple of 16, so
 * fixed 16-wide inner loops over restrict pointers vectorize at -O2. With
 * the scalar loop (the pointers could alias), a merge at batch 1 (8 splits
 * of 32 rows, one thread while the other waited) took 25 - 32 us, then 14
 * - 15: a call at 8k tokens 5.7% faster for int4, 1.8% for fp16 (2
 * threads, page 32, in-process A/B). */
static void axpy(float *restrict acc, const float *restrict x, float w, int32_t D) {
    for (int32_t d = 0; d < D; d += 16)
        for (int k = 0; k < 16; k++) acc[d + k] += x[d + k] * w;
}
static void scale_row(float *restrict dst, const float *restrict src, float w, int32_t D) {
    for (int32_t d = 0; d < D; d += 16)
        for (int k = 0; k < 16; k++) dst[d + k] = src[d + k] * w;
}

/* kvp__rot_inverse() of a row, its signs and scales taken from `unrot`. */
static void unrotate_row(float *restrict x, int32_t D, const float *restrict unrot) {
    for (int32_t base = 0; base < D;) {
        int B = kvp__rot_block(D, base);
        kvp__rot_fwht(x + base, B);
        base += B;
    }
    for (int32_t d = 0; d < D; d++) x[d] *= unrot[d];
}

static void store_out_row(const attn_job *j, int32_t b, int32_t i, int32_t qh, const float *o,
                          float m, float l, float *tmp) {
    size_t D = (size_t)j->D;
    scale_row(tmp, o, l > 0.0f ? 1.0f / l : 0.0f, j->D);
    if (j->unrot != NULL) unrotate_row(tmp, j->D, j->unrot);
    const kvp_attention_params_t *p = j->params;
    size_t row = (size_t)(p->qo_indptr[b] + i) * (size_t)j->q_heads + (size_t)qh;
    kvp__store_f32(p->dtype, tmp, D, (uint8_t *)p->out + row * D * kvp__dtype_size(p->dtype));
    if (p->lse != NULL) p->lse[row] = m + logf(l);
}

/* Partial result of (item's unit, split) at row slot `slot` (tile*4 + r). */
static float *partial_at(const attn_job *j, const item_id *id, int32_t split, int32_t slot) {
    size_t per = (size_t)(j->D + 2);
    size_t idx = ((size_t)id->unit * (size_t)j->splits[id->b] + (size_t)split) * KVP__ITEM_ROWS +
                 (size_t)slot;
    return j->partials + j->part_off[id->b] + idx * per;
}

/* One finished row of kv head h (row = i*group + g): the output, or the
 * split's partial at `slot`. l: the running sum, lv: the SIMD paths' part
 * of it. */
static void finish_row(const attn_job *j, const item_id *id, int32_t h, int32_t row, int32_t slot,
                       const float *o, float m, float l, const float lv[16], float *tmp) {
    for (int k = 0; k < 16; k++) l += lv[k];
    if (j->splits[id->b] == 1) {
        store_out_row(j, id->b, row / j->group, h * j->group + row % j->group, o, m, l, tmp);
    } else {
        float *part = partial_at(j, id, id->split, slot);
        part[0] = m;
        part[1] = l;
        memcpy(part + 2, o, (size_t)j->D * sizeof(float));
    }
}

static void finish_item(const attn_job *j, const item_id *id, kvp__tile *tiles, int ntiles,
                        float *tmp) {
    for (int t = 0; t < ntiles; t++) {
        kvp__tile *tl = &tiles[t];
        for (int r = 0; r < tl->rows; r++)
            finish_row(j, id, tl->head, tl->row0 + r, t * KVP__TILE_ROWS + r,
                       tl->o + (size_t)r * (size_t)j->D, tl->m[r], tl->l[r], tl->lvec[r], tmp);
    }
}

typedef struct {
    union { /* an item has tiles or is a prefill block */
        kvp__tile tiles[KVP__ITEM_ROWS / KVP__TILE_ROWS];
        kvp__pblock pb;
    };
    float o[KVP__ITEM_ROWS][KVP__ATTN_MAX_D] KVP__ALIGN64;
    float tmp[KVP__ATTN_MAX_D] KVP__ALIGN64;
} thread_scratch;

static void merge_parts(attn_job *j, const item_id *id, int32_t unit0, thread_scratch *ts);

/* Pages [*first, *end) of split k of sequence b. The splits shrink toward
 * the end, weights S+1, S, ..., 2 (S splits): the items handed out last are
 * the small ones, so the threads finish closer together (a thread that
 * ran slower takes a smaller last piece). Equal splits where the smallest
 * would fall under MIN_SPLIT_TOKENS. Measured against equal splits (2
 * threads, batch 1, page 32, in-process A/B, 3 runs): 32k tokens fp16
 * 2.5 - 4.8% faster, int4 5.5 - 6.7%; 8k fp16 0.2 - 4.7%, int4 -0.9 -
 * +3.2%. */
static void split_bounds(const attn_job *j, int32_t b, int32_t k, int32_t pages, int32_t *first,
                         int32_t *end) {
    int64_t S = j->splits[b], per = j->split_pages[b];
    int64_t total = S * (S + 1) - S * (S - 1) / 2; /* sum of the weights */
    int64_t min_pages = (MIN_SPLIT_TOKENS + j->P - 1) / j->P;
    if (S > 1 && (int64_t)pages * 2 / total >= min_pages) {
        int64_t before = (int64_t)k * (S + 1) - (int64_t)k * (k - 1) / 2; /* weights of splits < k */
        int64_t upto = before + (S + 1 - k);
        *first = (int32_t)((int64_t)pages * before / total);
        *end = (int32_t)((int64_t)pages * upto / total);
        return;
    }
    *first = (int32_t)(k * per);
    *end = (int32_t)((k + 1) * per < pages ? (k + 1) * per : pages);
}

/* An item's pages and the order of its (page, head) steps. Heads go
 * inner: a page's blocks of consecutive heads are adjacent, so each page
 * is two sequential runs. With a four- (or two-) block V stage, the full
 * pages come first in groups of GP = 4 (or 2), (page group, head, page):
 * each group of one head is one chunk (run_group); the rest go page by
 * page. */
typedef struct {
    int32_t item;
    item_id id;
    int32_t first, end, kv_len; /* pages [first, end) */
    int32_t nh, steps, GP, ngrp, grp_steps;
    bool block; /* a prefill block (process_block): no steps */
} item_plan;

static void split_finished(attn_job *j, const item_plan *pl, thread_scratch *ts);

static void plan_item(const attn_job *j, int32_t item, item_plan *pl) {
    pl->item = item;
    pl->id = decode_item(j, item);
    const item_id *id = &pl->id;
    int32_t lo, hi, unused;
    row_bounds(j, id->b, id->r0 / j->group, &lo, &unused);       /* bounds grow with the row */
    row_bounds(j, id->b, (id->r1 - 1) / j->group, &unused, &hi);
    int32_t pages = seq_pages(j, id->b);
    pl->kv_len = seq_kv_len(j, id->b);
    int32_t first, end;
    split_bounds(j, id->b, id->split, pages, &first, &end);
    while (first < end && (first + 1) * j->P - 1 < lo) first++; /* before every window */
    while (end > first && (end - 1) * j->P > hi) end--;         /* after the last row */
    pl->first = first;
    pl->end = end;
    pl->nh = id->h1 - id->h0;
    pl->block = seq_block(j, id->b);
    pl->steps = pl->block ? 0 : (end - first) * pl->nh;
    pl->GP = 1;
    pl->ngrp = 0;
    if (j->P == 16 || j->P == 32)
        pl->GP = j->pool_stages.vacc4 != NULL ? 4 : j->pool_stages.vacc2 != NULL ? 2 : 1;
    if (pl->GP > 1) {
        int32_t full_end = pl->kv_len / j->P < end ? pl->kv_len / j->P : end;
        pl->ngrp = full_end > first ? (full_end - first) / pl->GP : 0;
    }
    pl->grp_steps = pl->GP * pl->ngrp * pl->nh;
}

static int32_t step_page(const item_plan *pl, int32_t s) {
    if (s < pl->grp_steps) return pl->first + pl->GP * (s / (pl->GP * pl->nh)) + s % pl->GP;
    return pl->first + pl->GP * pl->ngrp + (s - pl->grp_steps) / pl->nh;
}
static int32_t step_head(const item_plan *pl, int32_t s) {
    if (s < pl->grp_steps) return pl->id.h0 + (s % (pl->GP * pl->nh)) / pl->GP;
    return pl->id.h0 + (s - pl->grp_steps) % pl->nh;
}
static void step_at(const attn_job *j, const item_plan *pl, int32_t s, step_blocks *out) {
    resolve_page(j, pl->id.b, step_head(pl, s), step_page(pl, s), &out->kb, &out->vb, &out->st);
}

static int32_t claim_item(attn_job *j) {
    return atomic_fetch_add_explicit(&j->next_item, 1, memory_order_relaxed);
}

/* Runs the planned item. pre: how many of its first steps the previous
 * item already prefetched. The lead (PREFETCH_LEAD_BYTES) runs on past the
 * item's end into the thread's next item, which it then claims and plans
 * (*next, *npl; *next < 0: not claimed yet): without that, every item
 * began with a burst of its first steps and waited on it, 2 - 3% of an
 * int4 call at batch 1, 8k tokens (4 items per thread). Returns how many
 * of the next item's first steps it prefetched. */
static int32_t process_item(attn_job *j, const item_plan *pl, int32_t pre, thread_scratch *ts,
                            int32_t *next, item_plan *npl) {
    const item_id id = pl->id;
    const int32_t steps = pl->steps, grp_steps = pl->grp_steps, GP = pl->GP, kv_len = pl->kv_len;
    const int32_t total = j->item_start[j->batch];
    int ntiles = setup_tiles(j, &id, ts->tiles, &ts->o[0][0]);
    uint64_t step_bytes = j->pool_stages.kused + j->pool_stages.vused;
    int32_t ahead = (int32_t)((PREFETCH_LEAD_BYTES + step_bytes - 1) / step_bytes), npre = 0;
    step_blocks cur[4], ah;
    for (int32_t s = pre > 1 ? pre : 1; s < steps && s < ahead; s++) { /* no lead hid them */
        step_at(j, pl, s, &ah);
        prefetch_range(ah.kb, 0, ah.st->kused);
        prefetch_range(ah.vb, 0, ah.st->vused);
    }
    for (int32_t s = 0; s < steps;) {
        const int cnt = s < grp_steps ? GP : 1;
        ptrdiff_t pf_k[4] = {0, 0, 0, 0}, pf_v[4] = {0, 0, 0, 0};
        for (int k = 0; k < cnt; k++) {
            step_at(j, pl, s + k, &cur[k]);
            const item_plan *lp = pl; /* the kernels stream their prefetches along the lead */
            int32_t la = s + k + ahead;
            if (la >= steps) { /* past the end: the next item's first steps */
                if (*next < 0) {
                    *next = claim_item(j);
                    if (*next < total) plan_item(j, *next, npl);
                }
                lp = *next < total ? npl : NULL;
                la -= steps;
                if (lp != NULL && la < lp->steps) npre = la + 1;
            }
            if (lp != NULL && la < lp->steps) {
                step_at(j, lp, la, &ah);
                prefetch_range(ah.kb, ah.st->kdata, ah.st->kused);
                prefetch_range(ah.vb, ah.st->vdata, ah.st->vused);
                pf_k[k] = ah.kb - cur[k].kb;
                pf_v[k] = ah.vb - cur[k].vb;
            }
        }
        int32_t pg = step_page(pl, s), h = step_head(pl, s), tok0 = pg * j->P;
        kvp__tile *tiles = &ts->tiles[(h - id.h0) * id.tiles_per_head];
        bool pool = true; /* a group's pages are full, but may be staging pages */
        for (int k = 0; k < cnt; k++) pool &= cur[k].st == &j->pool_stages;
        if (cnt > 1 && pool) {
            run_group(j, tiles, id.tiles_per_head, cur, pf_k, pf_v, tok0, cnt);
        } else {
            for (int k = 0; k < cnt; k++) {
                int32_t t0k = (pg + k) * j->P, ntok = kv_len - t0k < j->P ? kv_len - t0k : j->P;
                for (int t = 0; t < id.tiles_per_head; t++) {
                    tiles[t].pf_k = pf_k[k];
                    tiles[t].pf_v = pf_v[k];
                }
                run_page(j, tiles, id.tiles_per_head, cur[k].kb, cur[k].vb, cur[k].st, t0k, ntok);
            }
        }
        s += cnt;
    }
    finish_item(j, &id, ts->tiles, ntiles, ts->tmp);
    split_finished(j, pl, ts);
    return npre;
}

/* ---- prefill blocks ------------------------------------------------------------------------- */

/* The unit's last split to finish starts merging it (acquire: the other
 * splits' partials, released by their own increments, are visible). */
static void split_finished(attn_job *j, const item_plan *pl, thread_scratch *ts) {
    const item_id *id = &pl->id;
    if (j->splits[id->b] > 1 &&
        atomic_fetch_add_explicit(&j->split_done[pl->item - id->split], 1, memory_order_acq_rel) ==
            j->splits[id->b] - 1)
        merge_parts(j, id, pl->item - id->split, ts);
}

/* Tokens [c, c + n) of the item's head decoded into b->kc / b->vc, page by
 * page (a chunk may span pages, or be part of one), the columns past n
 * zeroed. */
static void decode_chunk(const attn_job *j, const item_id *id, kvp__pblock *b, int32_t c, int n,
                         float fp8_k, float fp8_v) {
    const int32_t P = j->P, h = id->h0;
    for (int32_t x = c; x < c + n;) {
        int32_t pg = x / P, off = x % P, seg = P - off < c + n - x ? P - off : c + n - x;
        const uint8_t *kb, *vb;
        const stage_set *st;
        resolve_page(j, id->b, h, pg, &kb, &vb, &st);
        st->pf_kdec(kb, st->kf, off, seg, fp8_k, &b->kc[0][x - c]);
        st->pf_vdec(vb, st->vf, off, seg, fp8_v, &b->vc[x - c][0]);
        x += seg;
    }
    if (n < KVP__PF_CHUNK) {
        for (int32_t d = 0; d < j->D; d++)
            memset(&b->kc[d][n], 0, (size_t)(KVP__PF_CHUNK - n) * sizeof(float));
        for (int i = n; i < KVP__PF_CHUNK; i++) memset(b->vc[i], 0, (size_t)j->D * sizeof(float));
    }
    if (j->pf_kbf || j->pf_vbf) j->pf_kvpack(b, j->pf_kbf, j->pf_vbf);
}

/* Whether the int8 block stage takes the chunk at token c (n tokens):
 * each 16-token half in a pool page (not a staging page); sets the halves'
 * blocks and offsets in b (a half past n repeats the first). */
static bool int8_chunk(const attn_job *j, const item_id *id, kvp__pblock *b, int32_t c, int n) {
    for (int h = 0; h < 2; h++) {
        if (h == 1 && n <= 16) {
            b->ck[1] = b->ck[0];
            b->cv[1] = b->cv[0];
            b->coff[1] = b->coff[0];
            break;
        }
        int32_t x = c + 16 * h;
        const stage_set *st;
        resolve_page(j, id->b, id->h0, x / j->P, &b->ck[h], &b->cv[h], &st);
        if (st != &j->pool_stages) return false;
        b->coff[h] = x % j->P;
    }
    return true;
}

/* Prefetches (into L2) the K/V blocks of the chunk at token c, while the
 * current one is computed. */
static void prefetch_chunk(const attn_job *j, const item_id *id, int32_t c, int32_t stop) {
    for (int32_t x = c; x < stop && x < c + KVP__PF_CHUNK; x = (x / j->P + 1) * j->P) {
        const uint8_t *kb, *vb;
        const stage_set *st;
        resolve_page(j, id->b, id->h0, x / j->P, &kb, &vb, &st);
        prefetch_range(kb, 0, st->kused);
        prefetch_range(vb, 0, st->vused);
    }
}

/* A prefill block item: one kv head, rows [r0, r1) (padded to whole
 * blocks with copies of the last row), the split's pages in chunks of
 * KVP__PF_CHUNK tokens. Blocks of rows skip the chunks they cannot see
 * and apply their bounds only on the chunks the bounds cut (the causal
 * diagonal, a window's edge, the sequence's end). */
static void process_block(attn_job *j, const item_plan *pl, thread_scratch *ts) {
    const item_id *id = &pl->id;
    kvp__pblock *b = &ts->pb;
    const int32_t h = id->h0, rows = id->r1 - id->r0;
    const int32_t nblk = (rows + KVP__PF_BLOCK - 1) / KVP__PF_BLOCK, prow = nblk * KVP__PF_BLOCK;
    b->D = j->D;
    b->o = &b->acc[0][0];
    memset(b->o, 0, (size_t)prow * (size_t)j->D * sizeof(float));
    int32_t lo_min = INT32_MAX, hi_max = -1;
    for (int32_t r = 0; r < prow; r++) {
        int32_t row = id->r0 + (r < rows ? r : rows - 1);
        int32_t i = row / j->group, g = row % j->group;
        load_q_row(j, id->b, i, h * j->group + g, b->q[r]);
        row_bounds(j, id->b, i, &b->lo[r], &b->hi[r]);
        b->m[r] = -INFINITY;
        b->l[r] = 0.0f;
        memset(b->lv[r], 0, sizeof b->lv[r]);
        if (b->lo[r] < lo_min) lo_min = b->lo[r];
        if (b->hi[r] > hi_max) hi_max = b->hi[r];
    }
    if (j->pf_kbf) j->pf_qpack(b, prow);
    if (j->pf_int8_block != NULL) j->pf_int8_rows(b, prow);
    /* each block's bounds: the chunks it sees, and those it sees whole */
    int32_t blo_min[KVP__PF_ITEM_ROWS / KVP__PF_BLOCK], blo_max[KVP__PF_ITEM_ROWS / KVP__PF_BLOCK];
    int32_t bhi_min[KVP__PF_ITEM_ROWS / KVP__PF_BLOCK], bhi_max[KVP__PF_ITEM_ROWS / KVP__PF_BLOCK];
    for (int32_t k = 0; k < nblk; k++) {
        blo_min[k] = bhi_min[k] = INT32_MAX;
        blo_max[k] = bhi_max[k] = INT32_MIN;
        for (int32_t r = k * KVP__PF_BLOCK; r < (k + 1) * KVP__PF_BLOCK; r++) {
            if (b->lo[r] < blo_min[k]) blo_min[k] = b->lo[r];
            if (b->lo[r] > blo_max[k]) blo_max[k] = b->lo[r];
            if (b->hi[r] < bhi_min[k]) bhi_min[k] = b->hi[r];
            if (b->hi[r] > bhi_max[k]) bhi_max[k] = b->hi[r];
        }
    }
    float fp8_k = fp8_scale_of(j, 0, h), fp8_v = fp8_scale_of(j, 1, h);
    int32_t start = pl->first * j->P, stop = pl->end * j->P;
    if (stop > pl->kv_len) stop = pl->kv_len;
    if (stop > hi_max + 1) stop = hi_max + 1;
    while (start + KVP__PF_CHUNK <= lo_min) start += KVP__PF_CHUNK; /* before every window */
    for (int32_t c = start; c < stop; c += KVP__PF_CHUNK) {
        int n = stop - c < KVP__PF_CHUNK ? (int)(stop - c) : KVP__PF_CHUNK;
        kvp__pf_block_fn stage = j->pf_block;
        if (j->pf_int8_block != NULL && int8_chunk(j, id, b, c, n)) { /* the codes as they lie */
            stage = j->pf_int8_block;
            j->pf_int8_chunk(b, n, j->pool_stages.kf, j->pool_stages.vf);
        } else {
            decode_chunk(j, id, b, c, n, fp8_k, fp8_v);
        }
        prefetch_chunk(j, id, c + KVP__PF_CHUNK, stop);
        int32_t last = c + n - 1;
        for (int32_t k = 0; k < nblk; k++) {
            if (c > bhi_max[k] || last < blo_min[k]) continue; /* sees none of it */
            int masked = n < KVP__PF_CHUNK || c < blo_max[k] || last > bhi_min[k];
            stage(b, k * KVP__PF_BLOCK, c, n, masked);
        }
    }
    for (int32_t r = 0; r < rows; r++)
        finish_row(j, id, h, id->r0 + r, r, b->o + (size_t)r * (size_t)j->D, b->m[r], b->l[r],
                   b->lv[r], ts->tmp);
    split_finished(j, pl, ts);
}

/* Merges kv head h's rows of the item's unit from its splits' partials. */
static void merge_head(const attn_job *j, const item_id *id, int32_t h, float *tmp, float *acc) {
    int32_t S = j->splits[id->b];
    for (int32_t row = id->r0; row < id->r1; row++) {
        int32_t slot = (h - id->h0) * id->tiles_per_head * KVP__TILE_ROWS + (row - id->r0);
        float M = -INFINITY, L = 0.0f;
        for (int32_t s = 0; s < S; s++) {
            float m = partial_at(j, id, s, slot)[0];
            if (m > M) M = m;
        }
        memset(acc, 0, (size_t)j->D * sizeof(float));
        for (int32_t s = 0; s < S; s++) {
            const float *part = partial_at(j, id, s, slot);
            if (part[1] == 0.0f) continue;
            float w = expf(part[0] - M);
            L += part[1] * w;
            axpy(acc, part + 2, w, j->D);
        }
        store_out_row(j, id->b, row / j->group, h * j->group + row % j->group, acc, M, L, tmp);
    }
}

/* Takes the unit's merge parts (one kv head each) until none is left; the
 * unit's splits are all done (unit0: its split-0 item). */
static void merge_parts(attn_job *j, const item_id *id, int32_t unit0, thread_scratch *ts) {
    for (;;) {
        int32_t k = atomic_fetch_add_explicit(&j->merge_next[unit0], 1, memory_order_relaxed);
        if (k >= id->h1 - id->h0) return;
        merge_head(j, id, id->h0 + k, ts->tmp, &ts->o[0][0]);
    }
}

/* A thread out of items helps merge the units whose parts are not all
 * handed out, waiting for their last splits (every item is claimed by
 * then, so they finish). At batch 1 the merge is the call's tail, one
 * thread's work while the others wait; shared, int4's 8k-token call is
 * 1.3% faster, fp16's 0.4% (2 threads, page 32, in-process A/B). */
static void help_merge(attn_job *j, thread_scratch *ts) {
    for (int32_t b = 0; b < j->batch; b++) {
        int32_t S = j->splits[b];
        if (S <= 1) continue;
        for (int32_t unit0 = j->item_start[b]; unit0 < j->item_start[b + 1]; unit0 += S) {
            item_id id = decode_item(j, unit0);
            if (atomic_load_explicit(&j->merge_next[unit0], memory_order_relaxed) >= id.h1 - id.h0) continue;
            for (int spins = 0; atomic_load_explicit(&j->split_done[unit0], memory_order_acquire) < S; spins++)
                kvp__cpu_wait(spins);
            merge_parts(j, &id, unit0, ts);
        }
    }
}

static void attn_worker(void *arg, int32_t thread) {
    attn_job *j = (attn_job *)arg;
    thread_scratch *ts =
        (thread_scratch *)(void *)(j->ctx->scratch + (size_t)thread * j->ctx->scratch_stride);
    int32_t total = j->item_start[j->batch];
    item_plan plans[2];
    int32_t item = claim_item(j), pre = 0, at = 0;
    if (item < total) plan_item(j, item, &plans[0]);
    while (item < total) {
        int32_t next = -1;
        if (plans[at].block) process_block(j, &plans[at], ts);
        else pre = process_item(j, &plans[at], pre, ts, &next, &plans[at ^ 1]);
        if (next < 0) {
            next = claim_item(j);
            pre = 0;
            if (next < total) plan_item(j, next, &plans[at ^ 1]);
        }
        item = next;
        at ^= 1;
    }
    help_merge(j, ts);
}

static void set_sizes(stage_set *st) {
    st->kdata = kvp__block_data_bytes(st->kf);
    st->kused = kvp__block_used_bytes(st->kf);
    st->vdata = kvp__block_data_bytes(st->vf);
    st->vused = kvp__block_used_bytes(st->vf);
}

static void pick_stages(attn_job *j, const kvp__blockfmt *kf, const kvp__blockfmt *vf,
                        const kvp__blockfmt *skf, const kvp__blockfmt *svf) {
    int32_t isa = j->ctx->isa;
    j->softmax = kvp__pick_softmax(isa);
    j->pool_stages.kf = kf;
    j->pool_stages.vf = vf;
    j->pool_stages.kprep = kvp__pick_kprep(isa, kf->format);
    j->pool_stages.klogits = kvp__pick_klogits(isa, kf->format, kvp__blockfmt_dim_major(kf));
    j->pool_stages.vacc = kvp__pick_vacc(isa, vf->format);
    j->pool_stages.vacc2 = kvp__pick_vacc2(isa, vf->format);
    j->pool_stages.vacc4 = kvp__pick_vacc4(isa, vf->format);
    j->pool_stages.pf_kdec = kvp__pick_pf_kdec(isa, kf->format, kvp__blockfmt_dim_major(kf));
    j->pool_stages.pf_vdec = kvp__pick_pf_vdec(isa, vf->format);
    set_sizes(&j->pool_stages);
    j->staging_stages.kf = skf;
    j->staging_stages.vf = svf;
    j->staging_stages.kprep = kvp__pick_kprep(isa, skf->format);
    j->staging_stages.klogits = kvp__pick_klogits(isa, skf->format, kvp__blockfmt_dim_major(skf));
    j->staging_stages.vacc = kvp__pick_vacc(isa, svf->format);
    j->staging_stages.vacc2 = NULL; /* staging pages go one by one */
    j->staging_stages.vacc4 = NULL;
    j->staging_stages.pf_kdec = kvp__pick_pf_kdec(isa, skf->format, kvp__blockfmt_dim_major(skf));
    j->staging_stages.pf_vdec = kvp__pick_pf_vdec(isa, svf->format);
    set_sizes(&j->staging_stages);
}

static int run_job(attn_job *j) {
    int rc = plan_schedule(j);
    if (rc != KVP_OK) return rc;
    atomic_init(&j->next_item, 0);
    kvp__workers_run(j->ctx->workers, attn_worker, j);
    return KVP_OK;
}

int kvp__cpu_attention(kvp_ctx_t *c, const kvp__attn_args *a) {
    attn_job j;
    memset(&j, 0, sizeof j);
    const kvp_store_t *s = a->store;
    j.ctx = c;
    j.store = s;
    j.view = a->view;
    j.params = a->p;
    j.batch = a->view->batch;
    j.kv_heads = s->layout.kv_heads;
    j.group = a->group;
    j.q_heads = a->p->q_heads;
    j.D = s->layout.head_dim;
    j.P = s->layout.page_size;
    j.layer = a->p->layer;
    j.sm_scale = a->sm_scale;
    pick_stages(&j, &s->kfmt, &s->vfmt, &s->skfmt, &s->svfmt);
    if (s->vfmt.rot) { /* the attention of rotated values is the rotated output */
        for (int32_t base = 0; base < j.D;) {
            const int B = kvp__rot_block(j.D, base);
            const float k = kvp__rot_scale(B, 1);
            for (int32_t d = base; d < base + B; d++) j.unrot_buf[d] = kvp__rot_neg(d) ? -k : k;
            base += B;
        }
        j.unrot = j.unrot_buf;
    }
    /* prefill blocks have no soft cap */
    if (a->p->logit_soft_cap <= 0.0f)
        j.pf_block = kvp__pick_pf_block(c->isa, s->kfmt.format, s->vfmt.format, s->layout.page_size,
                                        &j.pf_kbf, &j.pf_vbf);
    kvp__pick_pf_pack(c->isa, &j.pf_qpack, &j.pf_kvpack);
    if (j.pf_block != NULL)
        j.pf_int8_block = kvp__pick_pf_int8(c->isa, s->kfmt.format, s->vfmt.format, s->layout.page_size,
                                            &j.pf_int8_rows, &j.pf_int8_chunk);
    return run_job(&j);
}

/* ---- context resources ------------------------------------------------------------------------ */

uint64_t kvp__cpu_thread_scratch_bytes(void) { return sizeof(thread_scratch); }
