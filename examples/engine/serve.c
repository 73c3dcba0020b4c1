#define _POSIX_C_SOURCE 200809L
#include "serve.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int32_t sample_argmax(const float *logits, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (logits[i] > logits[best]) best = i;
    return best;
}

static uint64_t xorshift64(uint64_t *s) {
    uint64_t x = *s ? *s : 0x9E3779B97F4A7C15ull;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

int32_t sample_temperature(const float *logits, int32_t n, float temp, uint64_t *rng) {
    if (temp <= 0) return sample_argmax(logits, n);
    float mx = logits[sample_argmax(logits, n)];
    double sum = 0;
    for (int32_t i = 0; i < n; i++) sum += exp((logits[i] - mx) / temp);
    double u = (double)(xorshift64(rng) >> 11) / 9007199254740992.0 * sum, acc = 0;
    for (int32_t i = 0; i < n; i++) {
        acc += exp((logits[i] - mx) / temp);
        if (acc > u) return i;
    }
    return n - 1;
}

/* ---- one step ---------------------------------------------------------------- */

typedef struct {
    int32_t n_seqs, rows, n_logits;
    int32_t *seq_ids, *q_start, *tokens, *logit_rows, *logit_req, *member_req;
    float *logits;
} step_buf;

static void step_free(step_buf *b) {
    free(b->seq_ids);
    free(b->q_start);
    free(b->tokens);
    free(b->logit_rows);
    free(b->logit_req);
    free(b->member_req);
    free(b->logits);
}

static int step_alloc(step_buf *b, const serve_cfg_t *cfg) {
    size_t a = (size_t)cfg->max_active, r = (size_t)cfg->step_rows;
    b->seq_ids = malloc(a * sizeof(int32_t));
    b->q_start = malloc((a + 1) * sizeof(int32_t));
    b->tokens = malloc(r * sizeof(int32_t));
    b->logit_rows = malloc(a * sizeof(int32_t));
    b->logit_req = malloc(a * sizeof(int32_t));
    b->member_req = malloc(a * sizeof(int32_t));
    b->logits = malloc(a * (size_t)model_cfg(cfg->model)->vocab * sizeof(float));
    return b->seq_ids && b->q_start && b->tokens && b->logit_rows && b->logit_req && b->member_req &&
                   b->logits
               ? 0
               : KV_ENOMEM;
}

/* Admit arrived requests while there is room in the batch and in the cache. */
static void admit(const serve_cfg_t *cfg, request_t *reqs, int32_t n, int32_t step, int32_t *active) {
    for (int32_t i = 0; i < n && *active < cfg->max_active; i++) {
        request_t *r = &reqs[i];
        if (r->seq >= 0 || r->finished || r->arrive_step > step) continue;
        if (cfg->kv->ops->seq_open(cfg->kv, &r->seq) != KV_OK) {
            r->seq = -1;
            return; /* the cache is full: try again after someone leaves */
        }
        r->cached = cfg->kv->ops->seq_attach_prefix(cfg->kv, r->seq, r->prompt, r->n_prompt);
        r->n_fed = r->cached;
        r->admit_step = step;
        (*active)++;
        if (cfg->on_event) cfg->on_event(cfg->ctx, i, "join");
    }
}

/* Rows of this step: a prefill chunk or the last sampled token per sequence.
 * Logits are wanted for a sequence's last row when that row ends its prompt
 * or is a decode token. */
static void gather(const serve_cfg_t *cfg, request_t *reqs, int32_t n, step_buf *b, int *has_prefill,
                   int *has_decode) {
    b->n_seqs = b->rows = b->n_logits = 0;
    b->q_start[0] = 0;
    *has_prefill = *has_decode = 0;
    for (int32_t i = 0; i < n; i++) {
        request_t *r = &reqs[i];
        if (r->seq < 0 || r->finished) continue;
        int32_t room = cfg->step_rows - b->rows;
        if (room < 1) break;
        int32_t left = r->n_prompt - r->n_fed, take;
        if (left > 0) {
            take = left < cfg->prefill_chunk ? left : cfg->prefill_chunk;
            if (take > room) take = room;
            int32_t a = cfg->chunk_align;
            /* end on a page edge; the first prefilling sequence always has room
             * for one page (the others decode: one row each), so none waits forever */
            if (a > 1 && a <= cfg->prefill_chunk && a <= cfg->step_rows - cfg->max_active + 1 && take < left) {
                int32_t end = (r->n_fed + take) / a * a;
                take = end > r->n_fed ? end - r->n_fed : 0;
                if (take == 0) continue; /* a later step */
            }
            memcpy(b->tokens + b->rows, r->prompt + r->n_fed, (size_t)take * sizeof(int32_t));
            *has_prefill = 1;
        } else {
            take = 1;
            b->tokens[b->rows] = r->out[r->n_out - 1];
            *has_decode = 1;
        }
        if (r->n_fed + take == r->n_prompt || left <= 0) {
            b->logit_rows[b->n_logits] = b->rows + take - 1;
            b->logit_req[b->n_logits++] = i;
        }
        b->member_req[b->n_seqs] = i;
        b->seq_ids[b->n_seqs++] = r->seq;
        b->rows += take;
        b->q_start[b->n_seqs] = b->rows;
    }
}

static void finish(const serve_cfg_t *cfg, request_t *r, int32_t i, int how, int32_t step, int32_t *active) {
    r->finished = how;
    r->finish_step = step;
    cfg->kv->ops->seq_close(cfg->kv, r->seq);
    r->seq = -1;
    (*active)--;
    if (cfg->on_event) cfg->on_event(cfg->ctx, i, "leave");
}

static void track_memory(const serve_cfg_t *cfg, request_t *reqs, int32_t n, serve_stats_t *st) {
    int64_t live = 0, paged = 0;
    int32_t act = 0;
    for (int32_t i = 0; i < n; i++) {
        if (reqs[i].seq < 0) continue;
        int64_t len = cfg->kv->ops->seq_len(cfg->kv, reqs[i].seq);
        live += len;
        paged += (len + 15) / 16 * 16;
        act++;
    }
    if (live > st->peak_live_tokens) st->peak_live_tokens = live;
    if (paged > st->peak_paged16_tokens) st->peak_paged16_tokens = paged;
    if (act > st->peak_active) st->peak_active = act;
}

/* Sample for every sequence that got logits; retire the finished ones. */
static void consume(const serve_cfg_t *cfg, request_t *reqs, step_buf *b, int32_t step, uint64_t *rng,
                    int32_t *active) {
    const int32_t vocab = model_cfg(cfg->model)->vocab;
    for (int32_t s = 0; s < b->n_seqs; s++) { /* prompt tokens fed this step */
        request_t *r = &reqs[b->member_req[s]];
        if (r->n_fed < r->n_prompt) r->n_fed += b->q_start[s + 1] - b->q_start[s];
    }
    for (int32_t k = 0; k < b->n_logits; k++) {
        int32_t i = b->logit_req[k];
        request_t *r = &reqs[i];
        const float *lg = b->logits + (size_t)k * vocab;
        int32_t tok = cfg->temperature > 0 ? sample_temperature(lg, vocab, cfg->temperature, rng)
                                           : sample_argmax(lg, vocab);
        r->out[r->n_out++] = tok;
        if (r->n_out == 1) r->t_first = now_seconds();
        if (cfg->on_token) cfg->on_token(cfg->ctx, i, tok);
        int32_t len = cfg->kv->ops->seq_len(cfg->kv, r->seq);
        if (tok == cfg->eos) finish(cfg, r, i, 1, step, active);
        else if (r->n_out >= r->max_new) finish(cfg, r, i, 2, step, active);
        else if (len + 1 > cfg->kv->shape.max_len) finish(cfg, r, i, 3, step, active);
    }
}

static int all_done(const request_t *reqs, int32_t n) {
    for (int32_t i = 0; i < n; i++)
        if (!reqs[i].finished) return 0;
    return 1;
}

int serve_run(const serve_cfg_t *cfg, request_t *reqs, int32_t n, serve_stats_t *st) {
    memset(st, 0, sizeof *st);
    if (cfg->max_active < 1 || cfg->prefill_chunk < 1 || cfg->step_rows < cfg->max_active) return KV_EINVAL;
    for (int32_t i = 0; i < n; i++) {
        if (reqs[i].n_prompt < 1 || reqs[i].max_new < 1) return KV_EINVAL;
        reqs[i].seq = -1;
        reqs[i].n_out = reqs[i].n_fed = reqs[i].cached = 0;
        reqs[i].finished = 0;
        reqs[i].t_arrive = reqs[i].t_first = -1;
    }
    step_buf b = {0};
    int rc = step_alloc(&b, cfg);
    uint64_t rng = cfg->seed;
    int32_t active = 0;
    double t0 = now_seconds();
    for (int32_t step = 0; rc == 0 && !all_done(reqs, n); step++) {
        double ts0 = now_seconds();
        for (int32_t i = 0; i < n; i++)
            if (reqs[i].t_arrive < 0 && reqs[i].arrive_step <= step) reqs[i].t_arrive = ts0;
        admit(cfg, reqs, n, step, &active);
        int has_prefill, has_decode;
        gather(cfg, reqs, n, &b, &has_prefill, &has_decode);
        if (b.n_seqs == 0) {
            if (active == 0 && step > 100000) rc = KV_ENOSPC; /* nothing can ever run */
            continue;                                        /* waiting for arrivals */
        }
        kv_batch_t batch = {b.n_seqs, b.seq_ids, b.q_start, b.tokens};
        double ts = now_seconds();
        rc = model_forward(cfg->model, cfg->kv, cfg->pool, &batch, b.logit_rows, b.n_logits, b.logits);
        if (rc != 0) break;
        double dt = now_seconds() - ts;
        /* tokens/s figures only from steps that are purely one kind */
        if (has_prefill && !has_decode) st->prefill_s += dt, st->prefill_tokens += b.rows;
        else if (has_decode && !has_prefill) st->decode_s += dt, st->decode_tokens += b.rows;
        track_memory(cfg, reqs, n, st);
        consume(cfg, reqs, &b, step, &rng, &active);
        st->steps = step + 1;
    }
    st->total_s = now_seconds() - t0;
    for (int32_t i = 0; i < n; i++)
        if (reqs[i].seq >= 0) cfg->kv->ops->seq_close(cfg->kv, reqs[i].seq);
    step_free(&b);
    return rc;
}
