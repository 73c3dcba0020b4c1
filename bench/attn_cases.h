/*
 * What the CPU and CUDA attention benchmarks share: a measured case, the
 * headline figures over the cases, and the options that pick cases.
 */
#ifndef KVPAGE_BENCH_ATTN_CASES_H
#define KVPAGE_BENCH_ATTN_CASES_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "kvpage.h"

/* The cases' shape: llama-3.1-8b, one layer; pages are filled from a
 * template of TEMPLATE_PAGES pages; accuracy runs use ACC_TOKENS tokens. */
#define Q_HEADS 32
#define KV_HEADS 8
#define HEAD_DIM 128
#define TEMPLATE_PAGES 64
#define ACC_TOKENS 4096

/* One measured case: format index (0 = fp16, the baseline), page size,
 * batch, context; seconds per call paged and contiguous; KV bytes read. */
typedef struct {
    int fmt, page, batch, context;
    int layers; /* layers the timed calls cycle over (0: not recorded) */
    double t_paged, t_contig, bytes;
    /* medians of per-round ratios where the cases were timed in rounds
     * together (0: not measured; the ratio of the medians is used) */
    double speedup, vs_contig, bw_fraction;
} kvb_result;

static inline const kvb_result *kvb_find(const kvb_result *rs, int n, int fmt, int page, int batch,
                                         int context) {
    for (int i = 0; i < n; i++)
        if (rs[i].fmt == fmt && rs[i].page == page && rs[i].batch == batch && rs[i].context == context)
            return &rs[i];
    return NULL;
}

enum { KVB_BW_FRACTION = 0, KVB_SPEEDUP = 1, KVB_PAGED_VS_CONTIG = 2 };

/* Median over the page-32 cases with context >= 8k of: the fraction of the
 * roof (GB/s) the KV reads reach, the speedup over fp16, or paged ÷
 * contiguous at the longest context (max_ctx). */
static inline double kvb_headline(const kvb_result *rs, int n, int fmt, int what, double roof_gbps,
                                  int max_ctx) {
    double v[128];
    int k = 0;
    for (int i = 0; i < n && k < 128; i++) {
        const kvb_result *r = &rs[i];
        if (r->fmt != fmt || r->page != 32 || r->context < 8192) continue;
        if (what == KVB_PAGED_VS_CONTIG && r->context != max_ctx) continue;
        const kvb_result *base = kvb_find(rs, n, 0, r->page, r->batch, r->context);
        if (what == KVB_BW_FRACTION)
            v[k++] = r->bw_fraction > 0.0 ? r->bw_fraction : r->bytes / r->t_paged / 1e9 / roof_gbps;
        else if (what == KVB_SPEEDUP && r->speedup > 0.0) v[k++] = r->speedup;
        else if (what == KVB_SPEEDUP && base != NULL) v[k++] = base->t_paged / r->t_paged;
        else if (what == KVB_PAGED_VS_CONTIG) v[k++] = r->vs_contig > 0.0 ? r->vs_contig : r->t_contig / r->t_paged;
    }
    return k > 0 ? bench_median(v, k) : 0.0;
}

/* Which cases to run (-1: all). */
typedef struct {
    int fmt, page, batch, context;
} kvb_only;

/* --format NAME (format_index(NAME) >= 0), --page N, --batch N, --context N
 * at argv[*i]: 1 if taken (*i moves past its value), -1 for an unknown
 * format name, 0 if argv[*i] is none of these. */
static inline int kvb_parse_only(int argc, char **argv, int *i, int (*format_index)(const char *),
                                 kvb_only *only) {
    const char *a = argv[*i];
    if (*i + 1 >= argc) return 0;
    const char *val = argv[*i + 1];
    if (!strcmp(a, "--page")) only->page = atoi(val);
    else if (!strcmp(a, "--batch")) only->batch = atoi(val);
    else if (!strcmp(a, "--context")) only->context = atoi(val);
    else if (!strcmp(a, "--format")) {
        if ((only->fmt = format_index(val)) < 0) return -1;
    } else return 0;
    (*i)++;
    return 1;
}

/* The decode batch's view (B sequences of `P`-token pages) and attention
 * parameters (q_heads, 1/sqrt(head_dim), one query row per sequence). */
static inline void kvb_decode_call(kvp_kv_view_t *view, kvp_attention_params_t *ap, int32_t B,
                                   int32_t P, int64_t pages, int32_t staging, const int32_t *indptr,
                                   const int32_t *ids, const int32_t *last, const int32_t *qo,
                                   int32_t q_heads, int32_t head_dim, const void *q, void *out) {
    view->batch = B;
    view->page_size = P;
    view->num_pages = (int32_t)pages;
    view->num_staging = staging;
    view->indptr = indptr;
    view->indices = ids;
    view->last_page_len = last;
    kvp_attention_params_init(ap);
    ap->q_heads = q_heads;
    ap->sm_scale = 1.0f / sqrtf((float)head_dim);
    ap->qo_indptr = qo;
    ap->q = q;
    ap->out = out;
}

#endif
