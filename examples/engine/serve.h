/*
 * Serving several requests through one decode loop with continuous batching:
 * each step gathers, for every active sequence, either its next prefill chunk
 * or its last sampled token, runs one forward pass over all of them, samples,
 * and retires finished sequences so waiting requests can join the batch.
 */
#ifndef ENGINE_SERVE_H
#define ENGINE_SERVE_H

#include <stdint.h>

#include "kv.h"
#include "model.h"
#include "pool.h"

typedef struct {
    /* input */
    const int32_t *prompt;
    int32_t n_prompt;
    int32_t max_new;     /* tokens to generate at most */
    int32_t arrive_step; /* the request is not admitted before this step */
    /* output (caller-provided buffer of max_new tokens) */
    int32_t *out;
    int32_t n_out;
    int32_t cached;      /* prompt tokens served by the cache's prefix cache */
    int32_t admit_step, finish_step;
    int finished;        /* 1: eos, 2: max_new, 3: cache full (length) */
    double t_arrive;     /* now_seconds() when it arrived (the start of step arrive_step) */
    double t_first;      /* ... when its first token was sampled: t_first - t_arrive is its
                            time to first token (queueing included); -1 if none */
    /* state */
    int32_t seq, n_fed;
} request_t;

typedef struct serve_cfg serve_cfg_t;

typedef void (*serve_token_fn)(void *ctx, int32_t req, int32_t token);
typedef void (*serve_event_fn)(void *ctx, int32_t req, const char *what);

struct serve_cfg {
    model_t *model;
    kv_cache_t *kv;
    pool_t *pool;
    int32_t max_active;    /* sequences in the batch at once */
    int32_t prefill_chunk; /* prompt tokens per sequence per step */
    int32_t step_rows;     /* rows per forward step at most (>= max_active) */
    int32_t eos;           /* -1: never stop early */
    float temperature;     /* 0: greedy (ties to the lowest id) */
    uint64_t seed;
    serve_token_fn on_token;
    serve_event_fn on_event; /* "join", "leave" */
    void *ctx;
    int32_t chunk_align;   /* 0 or 1: none; else (a paged cache's page size, <= prefill_chunk)
                              prefill chunks cut short by the step's room end on a multiple of it,
                              so a page's K/V never depend on how the batch was cut: int8/int4
                              keys are quantized when their page fills, and the rows of that
                              step see the quantized page, earlier steps' rows the fp16 one */
};

typedef struct {
    int32_t steps;
    int64_t prefill_tokens, decode_tokens;
    double prefill_s, decode_s;  /* wall time of steps that were pure prefill / pure decode */
    double total_s;
    int64_t peak_live_tokens;    /* most tokens held at once, all sequences */
    int64_t peak_paged16_tokens; /* same, with each sequence rounded up to pages of 16 */
    int32_t peak_active;
} serve_stats_t;

/* Serve every request to completion. Returns 0, or a KV_E* code. */
int serve_run(const serve_cfg_t *cfg, request_t *reqs, int32_t n_reqs, serve_stats_t *st);

/* Sampling: greedy, or temperature with a xorshift generator. */
int32_t sample_argmax(const float *logits, int32_t n);
int32_t sample_temperature(const float *logits, int32_t n, float temp, uint64_t *rng);

double now_seconds(void);

#endif
