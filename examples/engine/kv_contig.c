/*
 * The contiguous fp32 KV cache: what engines without paging do. Each open
 * sequence reserves max_len tokens of K and V for every layer up front, and
 * attention reads them directly, with an exact two-pass softmax.
 *
 * It is the reference implementation: the paged libkvpage cache must give the
 * same greedy tokens (fp32) as this one.
 */
#include <stdlib.h>
#include <string.h>

#include "kv.h"
#include "vec.h"

typedef struct {
    int open;
    int32_t len;
    float *k, *v; /* [layer][max_len][kv_heads][head_dim] */
} contig_seq;

typedef struct {
    kv_cache_t base;
    contig_seq *seqs;
    size_t seq_floats; /* floats of K (or V) per sequence */
    /* the current step */
    int32_t rows, rows_cap;
    int32_t *row_seq, *row_pos;
    float *scratch; /* per thread: max_len scores */
    /* for attend's workers */
    int32_t layer;
    const float *q;
    float *out;
    float scale;
} contig_kv;

static contig_kv *as_contig(kv_cache_t *kv) { return (contig_kv *)(void *)kv; }
static const contig_kv *as_contig_c(const kv_cache_t *kv) { return (const contig_kv *)(const void *)kv; }

static int valid_seq(const contig_kv *c, int32_t id) {
    return id >= 0 && id < c->base.shape.max_seqs && c->seqs[id].open;
}

static void contig_destroy(kv_cache_t *kv) {
    contig_kv *c = as_contig(kv);
    if (!c) return;
    for (int32_t i = 0; c->seqs && i < kv->shape.max_seqs; i++) {
        free(c->seqs[i].k);
        free(c->seqs[i].v);
    }
    free(c->seqs);
    free(c->row_seq);
    free(c->row_pos);
    free(c->scratch);
    free(c);
}

static int contig_open(kv_cache_t *kv, int32_t *seq_id) {
    contig_kv *c = as_contig(kv);
    for (int32_t i = 0; i < kv->shape.max_seqs; i++) {
        contig_seq *s = &c->seqs[i];
        if (s->open) continue;
        /* the max-length reservation, kept while the slot is reused */
        if (!s->k) s->k = malloc(c->seq_floats * sizeof(float));
        if (!s->v) s->v = malloc(c->seq_floats * sizeof(float));
        if (!s->k || !s->v) return KV_ENOMEM;
        s->open = 1;
        s->len = 0;
        *seq_id = i;
        return KV_OK;
    }
    return KV_ENOSPC;
}

static int contig_fork(kv_cache_t *kv, int32_t parent, int32_t *child) {
    contig_kv *c = as_contig(kv);
    if (!valid_seq(c, parent)) return KV_EINVAL;
    int rc = contig_open(kv, child);
    if (rc != KV_OK) return rc;
    const contig_seq *p = &c->seqs[parent];
    contig_seq *s = &c->seqs[*child];
    const kv_shape_t *sh = &kv->shape;
    size_t tok = (size_t)sh->n_kv_heads * sh->head_dim, per_layer = (size_t)sh->max_len * tok;
    for (int32_t l = 0; l < sh->n_layers; l++) {
        memcpy(s->k + l * per_layer, p->k + l * per_layer, (size_t)p->len * tok * sizeof(float));
        memcpy(s->v + l * per_layer, p->v + l * per_layer, (size_t)p->len * tok * sizeof(float));
    }
    s->len = p->len;
    return KV_OK;
}

static void contig_close(kv_cache_t *kv, int32_t seq_id) {
    contig_kv *c = as_contig(kv);
    if (valid_seq(c, seq_id)) c->seqs[seq_id].open = 0;
}

static int32_t contig_len(const kv_cache_t *kv, int32_t seq_id) {
    const contig_kv *c = as_contig_c(kv);
    return valid_seq(c, seq_id) ? c->seqs[seq_id].len : -1;
}

static int32_t contig_attach_prefix(kv_cache_t *kv, int32_t seq_id, const int32_t *tokens, int32_t n) {
    (void)kv, (void)seq_id, (void)tokens, (void)n;
    return 0; /* no prefix cache: every prompt is prefilled in full */
}

static int grow_rows(contig_kv *c, int32_t rows) {
    if (rows <= c->rows_cap) return KV_OK;
    int32_t *a = realloc(c->row_seq, (size_t)rows * sizeof *a);
    if (a) c->row_seq = a;
    int32_t *b = realloc(c->row_pos, (size_t)rows * sizeof *b);
    if (b) c->row_pos = b;
    if (!a || !b) return KV_ENOMEM;
    c->rows_cap = rows;
    return KV_OK;
}

static int contig_begin(kv_cache_t *kv, const kv_batch_t *batch) {
    contig_kv *c = as_contig(kv);
    if (batch->n_seqs < 1 || batch->q_start[0] != 0) return KV_EINVAL;
    for (int32_t i = 0; i < batch->n_seqs; i++) {
        int32_t id = batch->seq_ids[i], n = batch->q_start[i + 1] - batch->q_start[i];
        if (!valid_seq(c, id) || n < 1) return KV_EINVAL;
        if (c->seqs[id].len + n > kv->shape.max_len) return KV_ENOSPC;
    }
    int32_t rows = batch->q_start[batch->n_seqs];
    if (grow_rows(c, rows) != KV_OK) return KV_ENOMEM;
    for (int32_t i = 0; i < batch->n_seqs; i++)
        for (int32_t r = batch->q_start[i]; r < batch->q_start[i + 1]; r++) {
            c->row_seq[r] = batch->seq_ids[i];
            c->row_pos[r] = c->seqs[batch->seq_ids[i]].len + (r - batch->q_start[i]);
        }
    c->rows = rows;
    return KV_OK;
}

static size_t cache_index(const kv_shape_t *sh, int32_t layer, int32_t pos) {
    return ((size_t)layer * sh->max_len + (size_t)pos) * (size_t)sh->n_kv_heads * sh->head_dim;
}

static int contig_append(kv_cache_t *kv, int32_t layer, const float *k, const float *v) {
    contig_kv *c = as_contig(kv);
    const kv_shape_t *sh = &kv->shape;
    size_t tok = (size_t)sh->n_kv_heads * sh->head_dim;
    for (int32_t r = 0; r < c->rows; r++) {
        contig_seq *s = &c->seqs[c->row_seq[r]];
        size_t at = cache_index(sh, layer, c->row_pos[r]);
        memcpy(s->k + at, k + r * tok, tok * sizeof(float));
        memcpy(s->v + at, v + r * tok, tok * sizeof(float));
    }
    return KV_OK;
}

/* One (row, kv head): the GQA group's query heads share each K/V row. */
static void attend_item(contig_kv *c, int32_t r, int32_t kvh, float *scores) {
    const kv_shape_t *sh = &c->base.shape;
    const int32_t hd = sh->head_dim, group = sh->n_q_heads / sh->n_kv_heads, n = c->row_pos[r] + 1;
    const contig_seq *s = &c->seqs[c->row_seq[r]];
    const size_t tok = (size_t)sh->n_kv_heads * hd;
    const float *kbase = s->k + cache_index(sh, c->layer, 0) + (size_t)kvh * hd;
    const float *vbase = s->v + cache_index(sh, c->layer, 0) + (size_t)kvh * hd;
    for (int32_t g = 0; g < group; g++) {
        int32_t h = kvh * group + g;
        vec_attend(c->q + ((size_t)r * sh->n_q_heads + h) * hd, kbase, vbase, (long)tok, n, hd, c->scale,
                   scores, c->out + ((size_t)r * sh->n_q_heads + h) * hd);
    }
}

/* One chunk = one (row, kv head); scratch memory per thread. */
static void attend_chunk(void *arg, long item, int tid) {
    contig_kv *c = arg;
    const kv_shape_t *sh = &c->base.shape;
    attend_item(c, (int32_t)(item / sh->n_kv_heads), (int32_t)(item % sh->n_kv_heads),
                c->scratch + (size_t)tid * sh->max_len);
}

static int contig_attend(kv_cache_t *kv, int32_t layer, const float *q, float *out, float scale) {
    contig_kv *c = as_contig(kv);
    c->layer = layer;
    c->q = q;
    c->out = out;
    c->scale = scale;
    pool_run(kv->pool, attend_chunk, c, (long)c->rows * kv->shape.n_kv_heads);
    return KV_OK;
}

static void contig_end(kv_cache_t *kv) {
    contig_kv *c = as_contig(kv);
    /* a sequence's new length is its last row's position + 1 */
    for (int32_t r = 0; r < c->rows; r++) c->seqs[c->row_seq[r]].len = c->row_pos[r] + 1;
    c->rows = 0;
}

static void contig_stats(const kv_cache_t *kv, kv_stats_t *st) {
    const contig_kv *c = as_contig_c(kv);
    memset(st, 0, sizeof *st);
    st->impl = "contiguous";
    st->k_format = st->v_format = "fp32";
    uint64_t per_token = (uint64_t)kv->shape.n_layers * kv->shape.n_kv_heads * kv->shape.head_dim * 2 * 4;
    for (int32_t i = 0; i < kv->shape.max_seqs; i++) {
        if (!c->seqs[i].open) continue;
        st->live_seqs++;
        st->live_tokens += c->seqs[i].len;
        st->bytes_reserved += per_token * (uint64_t)kv->shape.max_len;
    }
    st->bytes_live = per_token * (uint64_t)st->live_tokens;
}

static const kv_ops_t contig_ops = {
    "contiguous fp32", contig_destroy, contig_open,  contig_fork, contig_close, contig_len,
    contig_attach_prefix, contig_begin, contig_append, contig_attend, contig_end, contig_stats,
};

float *kv_contig_data(kv_cache_t *kv, int32_t seq_id, int32_t layer, int is_v) {
    contig_kv *c = as_contig(kv);
    if (kv->ops != &contig_ops || !valid_seq(c, seq_id) || layer < 0 || layer >= kv->shape.n_layers) return NULL;
    contig_seq *s = &c->seqs[seq_id];
    return (is_v ? s->v : s->k) + cache_index(&kv->shape, layer, 0);
}

kv_cache_t *kv_contig_create(const kv_shape_t *shape, pool_t *pool) {
    if (shape->n_layers < 1 || shape->n_kv_heads < 1 || shape->head_dim < 1 || shape->max_seqs < 1 ||
        shape->max_len < 1 || shape->n_q_heads % shape->n_kv_heads != 0 || !pool)
        return NULL;
    contig_kv *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->base.ops = &contig_ops;
    c->base.shape = *shape;
    c->base.pool = pool;
    c->seq_floats = (size_t)shape->n_layers * shape->max_len * shape->n_kv_heads * shape->head_dim;
    c->seqs = calloc((size_t)shape->max_seqs, sizeof *c->seqs);
    c->scratch = malloc((size_t)pool_threads(pool) * shape->max_len * sizeof(float));
    if (!c->seqs || !c->scratch) {
        contig_destroy(&c->base);
        return NULL;
    }
    return &c->base;
}
