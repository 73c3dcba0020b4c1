/*
 * A decode loop on libkvpage's core API (kvpage.h alone), as an engine
 * writes it around its model: three requests share a system prompt, are
 * prefilled in one step and then decode together, their keys and values
 * quantized to int8 as they are written, attention read straight from the
 * pages. Built against the installed library:
 *
 *   cc decode_loop.c $(pkg-config --cflags --libs kvpage) -lm
 *
 * The "model" is a stand-in: each token's K, V and Q are pseudo-random
 * numbers drawn from (sequence, layer, position), so the program runs
 * anywhere in milliseconds and can check itself: at the end it recomputes
 * the last step's attention in double precision from the same numbers and
 * compares. A real engine gets q, k and v from its projections instead.
 */
#include <kvpage.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { LAYERS = 4, KV_HEADS = 2, Q_HEADS = 8, HEAD_DIM = 64, BATCH = 3 };
enum { SYSTEM = 48, PROMPT = 64, STEPS = 20, MAX_ROWS = BATCH * PROMPT };
#define KV_DIM (KV_HEADS * HEAD_DIM)
#define Q_DIM (Q_HEADS * HEAD_DIM)

/* ---- the stand-in model ---------------------------------------------------- */

/* A value in [-1, 1) from a 64-bit mix of its coordinates. */
static float draw(uint64_t seq, uint64_t layer, uint64_t pos, uint64_t i, uint64_t what) {
    uint64_t x = (((seq * 131 + layer) * 1000003 + pos) * 8191 + i) * 4 + what;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return (float)((double)(x >> 11) / (double)(1ull << 52)) - 1.0f;
}

/* Sequences share their first SYSTEM tokens (a system prompt): same token
 * ids, and K/V drawn as if by sequence 0, as a real model computes them. */
static uint64_t kv_owner(int32_t b, int32_t pos) { return pos < SYSTEM ? 0 : (uint64_t)b; }

/* The projections of `rows` rows: row r is sequence row_seq[r] at position
 * row_pos[r]. */
static void model_qkv(int32_t layer, int32_t rows, const int32_t *row_seq, const int32_t *row_pos,
                      float *q, float *k, float *v) {
    for (int32_t r = 0; r < rows; r++) {
        uint64_t o = kv_owner(row_seq[r], row_pos[r]);
        for (int32_t i = 0; i < KV_DIM; i++) {
            k[r * KV_DIM + i] = draw(o, (uint64_t)layer, (uint64_t)row_pos[r], (uint64_t)i, 0);
            v[r * KV_DIM + i] = draw(o, (uint64_t)layer, (uint64_t)row_pos[r], (uint64_t)i, 1);
        }
        for (int32_t i = 0; i < Q_DIM; i++)
            q[r * Q_DIM + i] =
                draw((uint64_t)row_seq[r], (uint64_t)layer, (uint64_t)row_pos[r], (uint64_t)i, 2);
    }
}

/* ---- the decode loop ---------------------------------------------------------- */

/* Buffers of one step: rows in batch order, as kvp_cache_begin_step lays them out. */
typedef struct {
    float q[MAX_ROWS * Q_DIM], k[MAX_ROWS * KV_DIM], v[MAX_ROWS * KV_DIM], out[MAX_ROWS * Q_DIM];
    int32_t row_seq[MAX_ROWS], row_pos[MAX_ROWS], tokens[MAX_ROWS];
} step_buffers;

/* [decode-loop] */
/* The KV cache: pool, page table, page arena and attention threads in one. */
static int create_cache(kvp_cache_t **cache, char err[KVP_ERR_SIZE]) {
    kvp_cache_params_t cp;
    kvp_cache_params_init(&cp); /* fp16, 16-token pages, prefix cache on */
    cp.layers = LAYERS;
    cp.kv_heads = KV_HEADS;
    cp.head_dim = HEAD_DIM;
    cp.k_format = cp.v_format = KVP_FORMAT_INT8; /* quantized as they are written */
    cp.max_seqs = BATCH;
    cp.kv_budget_bytes = 8u << 20; /* or the planner's budget for a card */
    return kvp_cache_create(&cp, cache, err, KVP_ERR_SIZE);
}

/* One step: append each sequence's new tokens, then per layer write their
 * K/V (quantized on the way in) and attend over every page of the sequence. */
static int decode_step(kvp_cache_t *cache, const int32_t *seqs, const int32_t *num_new,
                       step_buffers *s, int32_t rows) {
    int rc = kvp_cache_begin_step(cache, seqs, BATCH, num_new, s->tokens);
    for (int32_t layer = 0; rc == KVP_OK && layer < LAYERS; layer++) {
        model_qkv(layer, rows, s->row_seq, s->row_pos, s->q, s->k, s->v);
        rc = kvp_cache_write(cache, layer, KVP_FORMAT_FP32, s->k, s->v, 0, 0);
        kvp_attention_params_t ap;
        kvp_attention_params_init(&ap); /* fp32, causal, scale 1/sqrt(head_dim) */
        ap.layer = layer;
        ap.q_heads = Q_HEADS;
        ap.q = s->q;
        ap.out = s->out; /* -> the layer's output projection, the next layer */
        if (rc == KVP_OK) rc = kvp_cache_attend(cache, &ap);
    }
    return rc;
}
/* [/decode-loop] */

/* Lay out a step's rows: sequence b brings num_new[b] tokens from len[b] on. */
static int32_t plan_rows(step_buffers *s, const int32_t *num_new, const int32_t *len) {
    int32_t rows = 0;
    for (int32_t b = 0; b < BATCH; b++)
        for (int32_t i = 0; i < num_new[b]; i++, rows++) {
            s->row_seq[rows] = b;
            s->row_pos[rows] = len[b] + i;
            /* token ids feed the prefix cache: shared system prompt, then own */
            s->tokens[rows] = len[b] + i < SYSTEM ? 1000 + len[b] + i : b * 100000 + len[b] + i;
        }
    return rows;
}

/* Attention of sequence b's last token at the last layer, in double
 * precision from the stand-in model's numbers: what the pages should give. */
static double check_last_step(const step_buffers *s, int32_t rows_before_b, int32_t b,
                              int32_t len) {
    enum { GROUP = Q_HEADS / KV_HEADS };
    const int32_t layer = LAYERS - 1, pos = len - 1;
    double err2 = 0, ref2 = 0;
    double *logit = malloc((size_t)len * sizeof *logit);
    if (logit == NULL) return INFINITY;
    for (int32_t h = 0; h < Q_HEADS; h++) {
        int32_t kh = h / GROUP; /* query head h reads kv head h / (Q_HEADS / KV_HEADS) */
        double mx = -INFINITY, sum = 0;
        for (int32_t t = 0; t < len; t++) {
            double dot = 0;
            for (int32_t d = 0; d < HEAD_DIM; d++)
                dot += (double)draw((uint64_t)b, layer, (uint64_t)pos, (uint64_t)(h * HEAD_DIM + d), 2) *
                       draw(kv_owner(b, t), layer, (uint64_t)t, (uint64_t)(kh * HEAD_DIM + d), 0);
            logit[t] = dot / sqrt((double)HEAD_DIM);
            if (logit[t] > mx) mx = logit[t];
        }
        for (int32_t t = 0; t < len; t++) sum += exp(logit[t] - mx);
        for (int32_t d = 0; d < HEAD_DIM; d++) {
            double o = 0;
            for (int32_t t = 0; t < len; t++)
                o += exp(logit[t] - mx) / sum *
                     draw(kv_owner(b, t), layer, (uint64_t)t, (uint64_t)(kh * HEAD_DIM + d), 1);
            double got = s->out[rows_before_b * Q_DIM + h * HEAD_DIM + d];
            err2 += (got - o) * (got - o);
            ref2 += o * o;
        }
    }
    free(logit);
    return sqrt(err2 / ref2);
}

static int fail(const char *what, kvp_cache_t *cache, int rc) {
    fprintf(stderr, "decode_loop: %s: %s (%s)\n", what, kvp_strerror(rc),
            cache ? kvp_cache_last_error(cache) : "");
    kvp_cache_destroy(cache);
    return 1;
}

int main(void) {
    kvp_cache_t *cache = NULL;
    char err[KVP_ERR_SIZE];
    int rc = create_cache(&cache, err);
    if (rc != KVP_OK) {
        fprintf(stderr, "decode_loop: kvp_cache_create: %s\n", err);
        return 1;
    }
    static step_buffers s;
    int32_t seqs[BATCH], len[BATCH], num_new[BATCH];

    /* Prefill: the first request alone, so the others find its system prompt's
     * pages in the prefix cache. */
    for (int32_t b = 0; b < BATCH; b++) {
        rc = kvp_cache_seq_create(cache, 0, 0, &seqs[b]);
        if (rc != KVP_OK) return fail("kvp_cache_seq_create", cache, rc);
        len[b] = 0;
        num_new[b] = b == 0 ? PROMPT : 0;
    }
    int32_t rows = plan_rows(&s, num_new, len);
    rc = kvp_cache_begin_step(cache, seqs, 1, num_new, s.tokens); /* batch of one */
    for (int32_t layer = 0; rc == KVP_OK && layer < LAYERS; layer++) {
        model_qkv(layer, rows, s.row_seq, s.row_pos, s.q, s.k, s.v);
        rc = kvp_cache_write(cache, layer, KVP_FORMAT_FP32, s.k, s.v, 0, 0);
    }
    if (rc != KVP_OK) return fail("prefill of the first request", cache, rc);
    len[0] = PROMPT;

    int64_t cached = 0;
    for (int32_t b = 1; b < BATCH; b++) {
        int64_t matched = 0;
        int32_t prompt[PROMPT];
        for (int32_t i = 0; i < PROMPT; i++) prompt[i] = i < SYSTEM ? 1000 + i : b * 100000 + i;
        /* keep the last prompt token for prefill: its logits are needed */
        rc = kvp_cache_seq_attach_prefix(cache, seqs[b], prompt, PROMPT - 1, &matched);
        if (rc != KVP_OK) return fail("kvp_cache_seq_attach_prefix", cache, rc);
        len[b] = (int32_t)matched;
        num_new[b] = PROMPT - len[b];
        cached += matched;
    }
    num_new[0] = 1; /* the first request decodes while the others prefill */

    for (int32_t step = 0; step < STEPS; step++) {
        rows = plan_rows(&s, num_new, len);
        rc = decode_step(cache, seqs, num_new, &s, rows);
        if (rc != KVP_OK) return fail("decode_step", cache, rc);
        for (int32_t b = 0; b < BATCH; b++) {
            len[b] += num_new[b];
            num_new[b] = 1;
        }
    }

    /* The last step decoded one token per sequence: row b is sequence b's. */
    double worst = 0;
    for (int32_t b = 0; b < BATCH; b++) {
        double e = check_last_step(&s, b, b, len[b]);
        if (!(e <= worst)) worst = e;
    }
    kvp_cache_parts_t parts = {.struct_size = sizeof parts};
    kvp_pool_stats_t st = {.struct_size = sizeof st};
    rc = kvp_cache_parts(cache, &parts);
    if (rc == KVP_OK) rc = kvp_pool_stats(parts.pool, &st);
    if (rc != KVP_OK) return fail("kvp_pool_stats", cache, rc);
    printf("decode_loop: %d sequences, %d steps, %d layers, int8 KV: %lld prompt tokens from the "
           "prefix cache; %lld of %lld pages in use (+%lld staging); attention error vs float64 "
           "%.2e\n",
           BATCH, STEPS, LAYERS, (long long)cached, (long long)st.used_pages,
           (long long)st.total_pages, (long long)st.used_staging, worst);

    for (int32_t b = 0; b < BATCH; b++) kvp_cache_seq_release(cache, seqs[b]);
    kvp_cache_destroy(cache);
    /* int8 keys and values: the attention output stays within about 1% of
     * float64 (docs/formats.md); a page-table or kernel bug gives ~100%. */
    if (cached != (int64_t)(BATCH - 1) * (SYSTEM / 16) * 16 || !(worst < 0.03)) {
        fprintf(stderr, "decode_loop: FAILED (prefix tokens %lld, error %.3e)\n", (long long)cached,
                worst);
        return 1;
    }
    return 0;
}
