#include "eval.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "serve.h"

int32_t eval_windows(int32_t n, int32_t window, int32_t stride) {
    if (n <= window) return 1;
    return 1 + (n - window + stride - 1) / stride;
}

double eval_ppl(const eval_result_t *r) { return r->scored ? exp(r->nll_sum / (double)r->scored) : NAN; }

double eval_logsumexp(const float *x, int32_t n) {
    float mx = x[0];
    for (int32_t i = 1; i < n; i++)
        if (x[i] > mx) mx = x[i];
    double s = 0;
    for (int32_t i = 0; i < n; i++) s += exp((double)x[i] - mx);
    return mx + log(s);
}

double eval_kl(const float *p_logits, const float *q_logits, int32_t n) {
    double lp = eval_logsumexp(p_logits, n), lq = eval_logsumexp(q_logits, n), kl = 0;
    for (int32_t i = 0; i < n; i++) {
        double a = p_logits[i] - lp, b = q_logits[i] - lq;
        kl += exp(a) * (a - b);
    }
    return kl > 0 ? kl : 0; /* rounding can give -1e-17 for identical inputs */
}

typedef struct {
    int32_t start, len;       /* window tokens [start, start+len) */
    int32_t first_scored;     /* index in the window of the first row whose prediction counts */
} window_t;

static window_t window_at(int32_t w, int32_t n, const eval_cfg_t *cfg) {
    window_t x;
    x.start = w == 0 ? 0 : w * cfg->stride;
    if (x.start + cfg->window > n) x.start = n > cfg->window ? n - cfg->window : 0;
    x.len = n - x.start < cfg->window ? n - x.start : cfg->window;
    /* score what earlier windows did not: their last predicted token was
     * (w-1)*stride + window - 1 (or n-1 for the tail shifted back) */
    int32_t prev_end = w == 0 ? 1 : (w - 1) * cfg->stride + cfg->window;
    x.first_scored = (prev_end - x.start) - 1; /* row r predicts token start+r+1 */
    if (x.first_scored < 0) x.first_scored = 0;
    return x;
}

/* Prefill one window through a fresh sequence of `kv`; logits of rows
 * first_scored .. len-2 (each predicts the next token) into out. */
static int run_window(model_t *m, kv_cache_t *kv, pool_t *pool, const int32_t *tokens, window_t w,
                      int32_t chunk, float *out) {
    int32_t seq;
    int rc = kv->ops->seq_open(kv, &seq);
    if (rc != KV_OK) return rc;
    int32_t vocab = model_cfg(m)->vocab, *rows = malloc((size_t)chunk * sizeof *rows), n_out = 0;
    if (!rows) rc = KV_ENOMEM;
    for (int32_t at = 0; rc == 0 && at < w.len - 1; at += chunk) {
        int32_t take = w.len - 1 - at < chunk ? w.len - 1 - at : chunk, n_logits = 0;
        for (int32_t r = 0; r < take; r++)
            if (at + r >= w.first_scored) rows[n_logits++] = r;
        int32_t q_start[2] = {0, take};
        kv_batch_t b = {1, &seq, q_start, tokens + w.start + at};
        rc = model_forward(m, kv, pool, &b, rows, n_logits, out + (size_t)n_out * vocab);
        n_out += n_logits;
    }
    free(rows);
    kv->ops->seq_close(kv, seq);
    return rc;
}

static void score(const float *logits, const float *ref, const int32_t *targets, int32_t n, int32_t vocab,
                  int is_ref, eval_result_t *r) {
    for (int32_t i = 0; i < n; i++) {
        const float *lg = logits + (size_t)i * vocab;
        r->nll_sum += eval_logsumexp(lg, vocab) - lg[targets[i]];
        if (!is_ref) {
            const float *rl = ref + (size_t)i * vocab;
            double kl = eval_kl(rl, lg, vocab);
            r->kl_sum += kl;
            if (kl > r->kl_max) r->kl_max = kl;
        }
        r->top1_same += sample_argmax(lg, vocab) == sample_argmax(ref + (size_t)i * vocab, vocab);
        r->scored++;
    }
}

int eval_run(model_t *m, pool_t *pool, const int32_t *tokens, int32_t n_tokens, const eval_cfg_t *cfg,
             const eval_variant_t *variants, int32_t n_variants, eval_result_t *results) {
    if (n_tokens < 2 || cfg->window < 2 || cfg->stride < 1 || cfg->stride > cfg->window || n_variants < 1 ||
        cfg->chunk < 1)
        return KV_EINVAL;
    const int32_t vocab = model_cfg(m)->vocab, n_win = eval_windows(n_tokens, cfg->window, cfg->stride);
    const size_t per = (size_t)cfg->window * vocab;
    float *ref = malloc(per * sizeof(float)), *cur = malloc(per * sizeof(float));
    kv_cache_t **kvs = calloc((size_t)n_variants, sizeof *kvs);
    int rc = ref && cur && kvs ? 0 : KV_ENOMEM;
    kv_shape_t shape = model_kv_shape(m, 1, cfg->window);
    for (int32_t v = 0; rc == 0 && v < n_variants; v++) {
        memset(&results[v], 0, sizeof results[v]);
        kvs[v] = variants[v].make(&shape, pool, variants[v].ctx);
        if (!kvs[v]) rc = KV_ENOTSUP;
    }
    for (int32_t w = 0; rc == 0 && w < n_win; w++) {
        if (cfg->progress) cfg->progress(cfg->ctx, w, n_win);
        window_t win = window_at(w, n_tokens, cfg);
        int32_t n_scored = win.len - 1 - win.first_scored;
        const int32_t *targets = tokens + win.start + win.first_scored + 1;
        for (int32_t v = 0; rc == 0 && v < n_variants; v++) {
            double t0 = now_seconds();
            rc = run_window(m, kvs[v], pool, tokens, win, cfg->chunk, v == 0 ? ref : cur);
            if (rc == 0) score(v == 0 ? ref : cur, ref, targets, n_scored, vocab, v == 0, &results[v]);
            results[v].seconds += now_seconds() - t0;
        }
    }
    for (int32_t v = 0; kvs && v < n_variants; v++)
        if (kvs[v]) kvs[v]->ops->destroy(kvs[v]);
    free(kvs);
    free(ref);
    free(cur);
    return rc;
}
