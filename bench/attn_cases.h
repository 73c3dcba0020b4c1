/*
 * What the CPU and CUDA attention benchmarks share: a measured case, the
 * headline figures over the cases, and the options that pick cases.
 */
#ifndef KVPAGE_BENCH_ATTN_CASES_H
#define KVPAGE_BENCH_ATTN_CASES_H

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "cli.h"
#include "kvdist.h"
#include "kvpage_ext.h"

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
    double t_single; /* CUDA: paged with the single-buffer loader (0: not measured) */
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

/* The batches the benchmarks measure (--batch picks one of them). */
#define KVB_BATCH_SMALL 1
#define KVB_BATCH_LARGE 16
/* The longest --context: 1M tokens. */
#define KVB_MAX_CONTEXT (1 << 20)

/* --format NAME (one of fmt_names[0..nfmt)), --page N, --batch N, --context N
 * at argv[*i]: 1 if taken (*i moves past its value), -1 after a message
 * naming the option and the bad value, 0 if argv[*i] is none of these. */
static inline int kvb_parse_only(const char *tool, int argc, char **argv, int *i,
                                 const char *const *fmt_names, int nfmt, kvb_only *only) {
    const char *a = argv[*i];
    bool ok;
    if (!strcmp(a, "--page")) {
        ok = cli_opt_int(tool, argc, argv, i, 1, KVP_MAX_PAGE_SIZE, &only->page, stderr);
    } else if (!strcmp(a, "--batch")) {
        ok = cli_opt_int(tool, argc, argv, i, 1, KVB_BATCH_LARGE, &only->batch, stderr);
        if (ok && only->batch != KVB_BATCH_SMALL && only->batch != KVB_BATCH_LARGE) {
            fprintf(stderr, "%s: --batch must be %d or %d (the batches measured), got %s\n", tool,
                    KVB_BATCH_SMALL, KVB_BATCH_LARGE, argv[*i]);
            ok = false;
        }
    } else if (!strcmp(a, "--context")) {
        int64_t v = 0;
        ok = cli_opt_i64(tool, argc, argv, i, 1, KVB_MAX_CONTEXT, true, &v, stderr);
        if (ok) only->context = (int)v;
    } else if (!strcmp(a, "--format")) {
        ok = cli_opt_choice(tool, argc, argv, i, fmt_names, nfmt, &only->fmt, stderr);
    } else {
        return 0;
    }
    return ok ? 1 : -1;
}

/* After the options: every case holds whole pages, so --context must be a
 * multiple of each page size run (--page, else 16 and 32). Returns 0, or -1
 * after a message. */
static inline int kvb_check_context(const char *tool, const kvb_only *only) {
    if (only->context <= 0) return 0;
    int page = only->page > 0 ? only->page : 32; /* 32 is a multiple of 16 */
    if (only->context % page == 0) return 0;
    fprintf(stderr, "%s: --context must be a multiple of the page size (%s%d), got %d\n", tool,
            only->page > 0 ? "--page " : "16 and ", page, only->context);
    return -1;
}

static inline void kvb_shuffle(int32_t *a, int64_t n, kvd_rng *rng) {
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)(kvd_next(rng) % (uint64_t)(i + 1));
        int32_t t = a[i];
        a[i] = a[j];
        a[j] = t;
    }
}

/* A page pool and table sized like a store (`pages` pool pages, `staging`
 * staging pages, 0 when the layout has none; no prefix cache). Returns 0,
 * or -1 after a message. */
static inline int kvb_pool_table(const char *tool, int32_t P, int64_t pages, int32_t staging,
                                 int32_t max_seqs, kvp_pool_t **pool, kvp_table_t **table) {
    char err[KVP_ERR_SIZE];
    kvp_pool_params_t pp;
    kvp_pool_params_init(&pp);
    pp.page_size = P;
    pp.num_pages = (int32_t)pages;
    pp.num_staging = staging;
    pp.prefix_cache = 0;
    *pool = NULL;
    *table = NULL;
    if (pages > INT32_MAX || kvp_pool_create(&pp, pool, err, sizeof err) != KVP_OK) {
        fprintf(stderr, "%s: pool: %s\n", tool, pages > INT32_MAX ? "too many pages" : err);
        return -1;
    }
    if (kvp_table_create(*pool, max_seqs, table, err, sizeof err) != KVP_OK) {
        fprintf(stderr, "%s: table: %s\n", tool, err);
        kvp_pool_destroy(*pool);
        *pool = NULL;
        return -1;
    }
    return 0;
}

/* The decode batch of a case: B sequences of `context` tokens (a multiple
 * of P) on a fresh pool of `pages` = B x context/P pages, whose pages are
 * handed out in a shuffled order, as by a pool that has been running for a
 * while: every page is taken and then released in a random order, before
 * the sequences are appended one after another. The batch is exported
 * (kvp_table_export) into indptr[B+1], indices[pages] and last[B], and
 * `view` points at them; the pool and table are gone on return (the arrays
 * are the caller's). No data moves: the pages' contents are the store's.
 * Returns 0, or -1 after a message. */
static inline int kvb_shuffled_batch(const char *tool, int32_t B, int32_t P, int32_t context,
                                     int64_t pages, int32_t staging, kvd_rng *rng,
                                     int32_t *indptr, int32_t *indices, int32_t *last,
                                     kvp_kv_view_t *view) {
    kvp_pool_t *pool;
    kvp_table_t *t;
    if (kvb_pool_table(tool, P, pages, staging, B, &pool, &t) != 0) return -1;
    int rc = -1;
    int32_t *seqs = (int32_t *)malloc((size_t)B * sizeof *seqs);
    int32_t cap = context / P + 2;
    kvp_page_op_t *ops = (kvp_page_op_t *)malloc((size_t)cap * sizeof *ops);
    int64_t ni = 0, ns = 0;
    kvp_batch_buffers_t buf = {.struct_size = sizeof buf};
    const char *what = "out of memory";
    if (seqs == NULL || ops == NULL) goto out;
    /* shuffle the free list: take every page, give them back in a random order */
    what = "shuffle";
    if (kvp_pool_alloc(pool, (int32_t)pages, indices) != KVP_OK) goto out;
    kvb_shuffle(indices, pages, rng);
    if (kvp_pool_release(pool, (int32_t)pages, indices) != KVP_OK) goto out;
    for (int32_t b = 0; b < B; b++) {
        int32_t nops = 0;
        what = "append";
        if (kvp_table_seq_create(t, 0, 0, &seqs[b]) != KVP_OK ||
            kvp_table_append(t, seqs[b], context, NULL, NULL, ops, cap, &nops) != KVP_OK)
            goto out;
    }
    what = "export";
    if (kvp_table_export_size(t, seqs, B, NULL, &ni, &ns) != KVP_OK) goto out;
    if (ni != pages) {
        fprintf(stderr, "%s: the batch holds %lld pages, not %lld\n", tool, (long long)ni,
                (long long)pages);
        what = NULL;
        goto out;
    }
    buf.indptr = indptr;
    buf.indices = indices;
    buf.last_page_len = last;
    buf.indices_capacity = ni;
    view->struct_size = sizeof *view;
    if (kvp_table_export(t, seqs, B, NULL, &buf, view) != KVP_OK) goto out;
    rc = 0;
out:
    if (rc != 0 && what != NULL)
        fprintf(stderr, "%s: page table: %s: %s\n", tool, what,
                kvp_table_last_error(t)[0] ? kvp_table_last_error(t) : kvp_pool_last_error(pool));
    free(seqs);
    free(ops);
    kvp_table_destroy(t);
    kvp_pool_destroy(pool);
    return rc;
}

/* The attention parameters of a decode call over `view` (one query row per
 * sequence: qo[b] = b; q_heads; 1/sqrt(head_dim)). */
static inline void kvb_decode_call(kvp_attention_params_t *ap, const int32_t *qo, int32_t q_heads,
                                   int32_t head_dim, const void *q, void *out) {
    kvp_attention_params_init(ap);
    ap->q_heads = q_heads;
    ap->sm_scale = 1.0f / sqrtf((float)head_dim);
    ap->qo_indptr = qo;
    ap->q = q;
    ap->out = out;
}

/* Useful FMAs of one sequence's causal attention (QK and PV): q_len query
 * rows, the last q_len of `context` tokens, row i attending to
 * context - q_len + i + 1 of them. Exact in a double: at most
 * 2^12 x context x (context + 1), below 2^53 for contexts up to
 * KVB_MAX_CONTEXT. */
static inline double kvb_attn_fmas(int64_t q_len, int64_t context) {
    /* sum_{i<q_len} (context - q_len + i + 1) */
    int64_t pairs = q_len * (context - q_len) + q_len * (q_len + 1) / 2;
    return 2.0 * Q_HEADS * HEAD_DIM * (double)pairs;
}

#endif
