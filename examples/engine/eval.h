/*
 * Perplexity and KL divergence over a text, for several KV-cache variants.
 *
 * The text is cut into windows of `window` tokens that start every `stride`
 * tokens; the first window scores all its predictions, later ones only the
 * last `stride` (tokens not scored before), so every scored token but the
 * first window's has at least window - stride tokens of context. Windows run
 * outermost and variants inside, so the reference variant's (index 0) next-
 * token distributions of one window are held while the others are compared
 * with it: KL(P_ref || P_variant) per scored token, without storing a
 * distribution per token of the text. Scoring (log-softmax over the
 * vocabulary, NLL, KL, top-1) runs on the pool's threads, a row each, and
 * is summed in row order: the results do not depend on the thread count.
 */
#ifndef ENGINE_EVAL_H
#define ENGINE_EVAL_H

#include <stdint.h>

#include "kv.h"
#include "model.h"
#include "pool.h"

typedef struct {
    const char *name;                  /* "fp32", "fp16", "int8", ... */
    /* Make a cache for one sequence of max_len tokens; NULL if unavailable. */
    kv_cache_t *(*make)(const kv_shape_t *shape, pool_t *pool, void *ctx);
    void *ctx;
} eval_variant_t;

typedef struct {
    double nll_sum;     /* sum of -log p(target) */
    double kl_sum;      /* sum over scored tokens of KL(ref || this) */
    double kl_max;
    double kl_p99;      /* 99th percentile of the per-token KL */
    int64_t top1_same;  /* scored tokens whose argmax equals the reference's */
    int64_t scored;
    double seconds;
} eval_result_t;

typedef struct {
    int32_t window, stride;
    int32_t chunk;           /* rows per forward pass (bounds activation memory) */
    void (*progress)(void *ctx, int32_t window_index, int32_t n_windows);
    void *ctx;
} eval_cfg_t;

/* Windows the text gives: 1 + ceil((n_tokens - window) / stride), >= 1. */
int32_t eval_windows(int32_t n_tokens, int32_t window, int32_t stride);

/* Run every variant over the windows; results[v] for variants[v]. Returns 0,
 * or a KV_E* code (KV_ENOTSUP if a variant's cache cannot be made). */
int eval_run(model_t *m, pool_t *pool, const int32_t *tokens, int32_t n_tokens, const eval_cfg_t *cfg,
             const eval_variant_t *variants, int32_t n_variants, eval_result_t *results);

double eval_ppl(const eval_result_t *r);

/* log-softmax helpers (exposed for tests): logsumexp of n logits, and
 * KL(p || q) of two logit vectors' softmaxes. */
double eval_logsumexp(const float *logits, int32_t n);
double eval_kl(const float *ref_logits, const float *logits, int32_t n);
/* The same KL as eval_run computes it (the log-sum-exps from float
 * exponentials summed in double, the reference's probabilities in double);
 * NaN if out of memory. */
double eval_kl_fast(const float *ref_logits, const float *logits, int32_t n);

#endif
