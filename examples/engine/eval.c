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

/* ---- scoring: log-softmax, NLL and KL per row, on the pool's threads ------------------ */

/* max, argmax (first of equals, as sample_argmax) and log-sum-exp of a row;
 * float exponentials summed in double (the logits are fp32: their own
 * rounding is far above expf's). */
static double row_lse(const float *x, int32_t n, int32_t *argmax) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    const float mx = x[best];
    double s = 0;
    for (int32_t i = 0; i < n; i++) s += expf(x[i] - mx);
    if (argmax) *argmax = best;
    return mx + log(s);
}

/* KL(P || Q) from P's logits x with their probabilities p and lse, and Q's
 * logits y with their lse: sum p_i ((x_i - y_i) - (lse_p - lse_q)), the
 * difference of logits taken before anything is rounded (identical rows give
 * exactly 0). */
static double row_kl(const float *x, const double *p, double lse_p, const float *y, double lse_q, int32_t n) {
    const double shift = lse_p - lse_q;
    double kl = 0;
    for (int32_t i = 0; i < n; i++) kl += p[i] * (((double)x[i] - (double)y[i]) - shift);
    return kl > 0 ? kl : 0; /* rounding can give -1e-17 for near-identical rows */
}

double eval_kl_fast(const float *p_logits, const float *q_logits, int32_t n) {
    double *p = malloc((size_t)n * sizeof *p);
    if (!p) return NAN;
    double lp = row_lse(p_logits, n, NULL), lq = row_lse(q_logits, n, NULL);
    for (int32_t i = 0; i < n; i++) p[i] = exp((double)p_logits[i] - lp);
    double kl = row_kl(p_logits, p, lp, q_logits, lq, n);
    free(p);
    return kl;
}

typedef struct {
    int32_t vocab, n;
    const float *logits, *ref; /* [n][vocab] */
    const int32_t *targets;
    int is_ref;
    /* the reference's, per row (filled when is_ref) */
    double *ref_p;             /* [n][vocab] probabilities (double: KL of near-equal rows cancels) */
    double *ref_lse;
    int32_t *ref_top;
    /* per row results */
    double *nll, *kl;
    int32_t *top1;
} score_job;

static void score_row(void *arg, long i, int tid) {
    (void)tid;
    score_job *j = arg;
    const size_t at = (size_t)i * j->vocab;
    const float *lg = j->logits + at;
    int32_t top;
    double lse = row_lse(lg, j->vocab, &top);
    j->nll[i] = lse - lg[j->targets[i]];
    if (j->is_ref) {
        double *p = j->ref_p + at;
        for (int32_t k = 0; k < j->vocab; k++) p[k] = exp((double)lg[k] - lse);
        j->ref_lse[i] = lse;
        j->ref_top[i] = top;
        j->kl[i] = 0;
    } else {
        j->kl[i] = row_kl(j->ref + at, j->ref_p + at, j->ref_lse[i], lg, lse, j->vocab);
    }
    j->top1[i] = top == j->ref_top[i];
}

/* Sums in row order, so the result does not depend on the threads. */
static void score(pool_t *pool, score_job *j, eval_result_t *r, double *kl_values) {
    pool_run(pool, score_row, j, j->n);
    for (int32_t i = 0; i < j->n; i++) {
        r->nll_sum += j->nll[i];
        r->kl_sum += j->kl[i];
        if (j->kl[i] > r->kl_max) r->kl_max = j->kl[i];
        kl_values[r->scored] = j->kl[i];
        r->top1_same += j->top1[i];
        r->scored++;
    }
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The q-quantile of n values (nearest rank), sorting them. */
static double quantile(double *v, int64_t n, double q) {
    if (n == 0) return 0;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    int64_t k = (int64_t)ceil(q * (double)n) - 1;
    return v[k < 0 ? 0 : k >= n ? n - 1 : k];
}

int eval_run(model_t *m, pool_t *pool, const int32_t *tokens, int32_t n_tokens, const eval_cfg_t *cfg,
             const eval_variant_t *variants, int32_t n_variants, eval_result_t *results) {
    if (n_tokens < 2 || cfg->window < 2 || cfg->stride < 1 || cfg->stride > cfg->window || n_variants < 1 ||
        cfg->chunk < 1)
        return KV_EINVAL;
    const int32_t vocab = model_cfg(m)->vocab, n_win = eval_windows(n_tokens, cfg->window, cfg->stride);
    const size_t per = (size_t)cfg->window * vocab, rows = (size_t)cfg->window;
    float *ref = malloc(per * sizeof(float)), *cur = malloc(per * sizeof(float));
    score_job j = {0};
    j.vocab = vocab;
    j.ref = ref;
    j.ref_p = malloc(per * sizeof(double));
    j.ref_lse = malloc(rows * sizeof(double));
    j.ref_top = malloc(rows * sizeof(int32_t));
    j.nll = malloc(rows * sizeof(double));
    j.kl = malloc(rows * sizeof(double));
    j.top1 = malloc(rows * sizeof(int32_t));
    double *kl_values = malloc((size_t)n_variants * (size_t)n_tokens * sizeof(double));
    kv_cache_t **kvs = calloc((size_t)n_variants, sizeof *kvs);
    int rc = ref && cur && j.ref_p && j.ref_lse && j.ref_top && j.nll && j.kl && j.top1 && kl_values && kvs
                 ? 0
                 : KV_ENOMEM;
    kv_shape_t shape = model_kv_shape(m, 1, cfg->window);
    for (int32_t v = 0; rc == 0 && v < n_variants; v++) {
        memset(&results[v], 0, sizeof results[v]);
        kvs[v] = variants[v].make(&shape, pool, variants[v].ctx);
        if (!kvs[v]) rc = KV_ENOTSUP;
    }
    for (int32_t w = 0; rc == 0 && w < n_win; w++) {
        if (cfg->progress) cfg->progress(cfg->ctx, w, n_win);
        window_t win = window_at(w, n_tokens, cfg);
        j.n = win.len - 1 - win.first_scored;
        j.targets = tokens + win.start + win.first_scored + 1;
        for (int32_t v = 0; rc == 0 && v < n_variants; v++) {
            double t0 = now_seconds();
            rc = run_window(m, kvs[v], pool, tokens, win, cfg->chunk, v == 0 ? ref : cur);
            j.logits = v == 0 ? ref : cur;
            j.is_ref = v == 0;
            if (rc == 0) score(pool, &j, &results[v], kl_values + (size_t)v * n_tokens);
            results[v].seconds += now_seconds() - t0;
        }
    }
    for (int32_t v = 0; rc == 0 && v < n_variants; v++)
        results[v].kl_p99 = quantile(kl_values + (size_t)v * n_tokens, results[v].scored, 0.99);
    for (int32_t v = 0; kvs && v < n_variants; v++)
        if (kvs[v]) kvs[v]->ops->destroy(kvs[v]);
    free(kvs);
    free(kl_values);
    free(j.ref_p), free(j.ref_lse), free(j.ref_top), free(j.nll), free(j.kl), free(j.top1);
    free(ref);
    free(cur);
    return rc;
}
