/*
 * kvpage-bench attention: paged decode attention on the CPU backend, read
 * against the machine's streaming-read bandwidth and fp32 FMA rate measured
 * in the same run, and against the same kernels over a contiguous cache.
 *
 * Cases: q_len 1, llama-3.1-8b shapes (32 q heads, 8 kv heads, head_dim 128),
 * batch 1 and 16, context 1k/8k/32k, page 16 and 32, K/V fp16, int8, int4.
 * Pages are handed to sequences in a shuffled order, as a page pool that has
 * been running for a while would. Each timed call reads the next of several
 * layers (cycle_layers), as a decode step does: a layer's KV is not read
 * again until every other layer's has gone through the caches.
 *
 * Prefill cases (causal): one sequence of `context` tokens (pages shuffled
 * as for decode, layers cycled as for decode) whose last `chunk` tokens
 * are the query, read against the fp32 FMA rate (and, for int8/int4, the
 * int8 MAC rate) measured in the same run: chunks 128, 512 and 2048 over 8k
 * and 32k tokens, page 16 and 32, fp16, int8 and int4 (--prefill; a default
 * run or --quick takes the 512-token chunk over 8k at page 32). The mixed
 * case is the batch of one step of an engine with chunked prefill: a
 * 512-token chunk over 8k with 15 decode sequences of 8k. Useful work: the
 * QK and PV FMAs the causal mask leaves, counted exactly. --decode runs
 * only the decode cases. The last line is JSON.
 */
#define _DEFAULT_SOURCE /* madvise(MADV_HUGEPAGE) */
#define _POSIX_C_SOURCE 200809L
#include "attn_cases.h"
#include "bench.h"
#include "cli.h"
#include "contig.h"
#include "kvdist.h"
#include "kvpage_ext.h"
#include "kvpage_plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define TOOL "kvpage-bench attention"

typedef struct {
    const char *name;
    int32_t format;
    int32_t k_order;
} bench_format;

static const bench_format formats[] = {
    {"fp16", KVP_FORMAT_FP16, KVP_K_ORDER_DIM_MAJOR},
    {"int8", KVP_FORMAT_INT8, KVP_K_ORDER_DIM_MAJOR},
    {"int4", KVP_FORMAT_INT4, KVP_K_ORDER_DIM_MAJOR},
    {"fp16-hnd", KVP_FORMAT_FP16, KVP_K_ORDER_TOKEN_MAJOR},
    {"int4_v1", KVP_FORMAT_INT4_V1, KVP_K_ORDER_DIM_MAJOR},
};

typedef kvb_result result;

typedef struct {
    int threads, quick, isa, acc_seqs, accuracy_only, no_accuracy;
    int layers; /* --layers: 0 = cycle_layers() */
    int prefill_only, decode_only; /* --prefill, --decode */
    int chunk;                     /* --chunk: 0 = all */
    double min_seconds;
    kvb_only only; /* -1: all */
} options;

/* ---- building a store -------------------------------------------------------------- */

/* The timed calls cycle over enough layers (up to the model's 32) that one
 * cycle reads at least CYCLE_BYTES, 8 times the dev machine's 32 MiB L3:
 * each call then reads its KV from DRAM, as in a decode step, where a
 * layer's KV comes round again only after all the others'. Looping over one
 * layer instead lets a case that nearly fits in L3 (batch 1, 8k tokens: 32
 * MiB of fp16, 10 MiB of int4) read partly from cache (fp16 measured at
 * 1.2 - 1.5 of the streaming-read roof there). --layers 1 gives that loop. */
#define CYCLE_BYTES ((uint64_t)256 << 20)
#define MODEL_LAYERS 32

static int32_t cycle_layers(uint64_t layer_bytes) {
    uint64_t n = layer_bytes > 0 ? (CYCLE_BYTES + layer_bytes - 1) / layer_bytes : 1;
    return n > MODEL_LAYERS ? MODEL_LAYERS : (int32_t)n;
}

static kvp_store_t *make_store(const bench_format *f, int32_t P, int64_t pages, int32_t staging,
                               int32_t layers) {
    kvp_store_params_t sp;
    kvp_store_params_init(&sp);
    sp.layers = layers;
    sp.kv_heads = KV_HEADS;
    sp.head_dim = HEAD_DIM;
    sp.page_size = P;
    sp.k_format = f->format;
    sp.v_format = f->format;
    sp.k_order = f->k_order;
    sp.num_pages = (uint64_t)pages;
    sp.num_staging = (uint64_t)staging;
    kvp_store_t *s = NULL;
    char err[KVP_ERR_SIZE];
    if (kvp_store_create(&sp, &s, err, sizeof err) != KVP_OK) {
        fprintf(stderr, "%s: %s\n", TOOL, err);
        return NULL;
    }
    return s;
}

/* Append `tokens` rows of sequence `seq` of table `t` through the real
 * append path: the table chooses the slots and the seal operations, the
 * store writes the rows. */
static int append_sequence(kvp_store_t *s, kvp_table_t *t, int32_t seq, const float *k,
                           const float *v, int32_t tokens) {
    enum { STEP = 256 };
    int64_t slots[STEP];
    kvp_page_op_t ops[STEP];
    size_t row = (size_t)KV_HEADS * HEAD_DIM;
    for (int32_t t0 = 0; t0 < tokens; t0 += STEP) {
        int32_t n = tokens - t0 < STEP ? tokens - t0 : STEP, nops = 0;
        if (kvp_table_append(t, seq, n, NULL, slots, ops, STEP, &nops) != KVP_OK) {
            fprintf(stderr, "%s: append: %s\n", TOOL, kvp_table_last_error(t));
            return -1;
        }
        kvp_append_params_t a;
        kvp_append_params_init(&a);
        a.rows = n;
        a.dtype = KVP_FORMAT_FP32;
        a.k = k + (size_t)t0 * row;
        a.v = v + (size_t)t0 * row;
        a.slots = slots;
        a.ops = ops;
        a.num_ops = nops;
        if (kvp_store_append(s, &a) != KVP_OK) {
            fprintf(stderr, "%s: append: %s\n", TOOL, kvp_store_last_error(s));
            return -1;
        }
    }
    return 0;
}

/* Fill every page: TEMPLATE_PAGES pages of random K/V appended as one
 * sequence of a page table on the store's pages, then copies of them over
 * the other pages (timing does not depend on the values). */
static int fill_pages(kvp_store_t *s, int32_t P, int64_t pages, kvd_rng *rng) {
    kvp_layout_t lay = {.struct_size = sizeof lay};
    kvp_store_layout(s, &lay);
    kvd_keys keys;
    if (kvd_keys_init(&keys, rng, KV_HEADS, HEAD_DIM) != 0) return -1;
    int32_t tpages = pages < TEMPLATE_PAGES ? (int32_t)pages : TEMPLATE_PAGES;
    int32_t tokens = tpages * P;
    size_t n = (size_t)tokens * KV_HEADS * HEAD_DIM;
    float *k = malloc(n * sizeof *k), *v = malloc(n * sizeof *v);
    unsigned char *is_template = calloc((size_t)pages, 1);
    int32_t tmpl[TEMPLATE_PAGES + 1], indptr[2], last[1], seq = -1;
    kvp_pool_t *pool = NULL;
    kvp_table_t *t = NULL;
    int rc = -1;
    if (k == NULL || v == NULL || is_template == NULL) goto out;
    kvd_fill_keys(&keys, rng, (size_t)tokens, k);
    kvd_fill_normal(rng, n, v);
    if (kvb_pool_table(TOOL, P, pages, lay.needs_staging ? 1 : 0, 1, &pool, &t) != 0) goto out;
    if (kvp_table_seq_create(t, 0, 0, &seq) != KVP_OK ||
        append_sequence(s, t, seq, k, v, tokens) != 0)
        goto out;
    /* the template's pages (whole pages: no staging page in the export) */
    kvp_batch_buffers_t buf = {.struct_size = sizeof buf};
    buf.indptr = indptr;
    buf.indices = tmpl;
    buf.last_page_len = last;
    buf.indices_capacity = TEMPLATE_PAGES + 1;
    if (kvp_table_export(t, &seq, 1, NULL, &buf, NULL) != KVP_OK || indptr[1] != tpages) {
        fprintf(stderr, "%s: export: %s\n", TOOL, kvp_table_last_error(t));
        goto out;
    }
    for (int32_t i = 0; i < tpages; i++) is_template[tmpl[i]] = 1;
    kvp_region_t rk = {.struct_size = sizeof rk}, rv = {.struct_size = sizeof rv};
    if (kvp_store_region(s, 0, KVP_REGION_K, &rk) != KVP_OK ||
        kvp_store_region(s, 0, KVP_REGION_V, &rv) != KVP_OK) {
        fprintf(stderr, "%s: region: %s\n", TOOL, kvp_store_last_error(s));
        goto out;
    }
    for (int64_t p = 0, j = 0; p < pages; p++) {
        if (is_template[p]) continue;
        int32_t from = tmpl[j++ % tpages];
        memcpy((uint8_t *)rk.base + (size_t)p * rk.page_stride,
               (uint8_t *)rk.base + (size_t)from * rk.page_stride, (size_t)rk.page_stride);
        memcpy((uint8_t *)rv.base + (size_t)p * rv.page_stride,
               (uint8_t *)rv.base + (size_t)from * rv.page_stride, (size_t)rv.page_stride);
    }
    /* the other layers: copies of layer 0 (their page blocks, then staging) */
    for (int32_t l = 1; l < lay.layers; l++)
        for (int32_t kind = KVP_REGION_K; kind <= KVP_REGION_STAGING_V; kind++) {
            kvp_region_t from = {.struct_size = sizeof from}, to = {.struct_size = sizeof to};
            if (kvp_store_region(s, 0, kind, &from) != KVP_OK || kvp_store_region(s, l, kind, &to) != KVP_OK) {
                fprintf(stderr, "%s: region: %s\n", TOOL, kvp_store_last_error(s));
                goto out;
            }
            if (from.base == NULL) continue;
            for (uint64_t p = 0; p < from.pages; p++)
                memcpy((uint8_t *)to.base + p * to.page_stride, (uint8_t *)from.base + p * from.page_stride,
                       (size_t)(KV_HEADS * from.head_stride));
        }
    rc = 0;
out:
    kvp_table_destroy(t);
    kvp_pool_destroy(pool);
    free(k);
    free(v);
    free(is_template);
    kvd_keys_free(&keys);
    return rc;
}

/* ---- timing ----------------------------------------------------------------------------- */

typedef struct {
    kvp_ctx_t *ctx;
    kvp_store_t *store;
    kvp_kv_view_t view;
    kvp_attention_params_t ap;
    bench_contig contig;                   /* the contiguous cache, `layers` copies */
    kvp_store_t contig_store;              /* a view of `store` with its strides */
    kvp_kv_view_t contig_view;
    int32_t layers, next_layer, next_copy; /* the layer (copy of the contiguous cache) read next */
} attn_call;

static int run_paged(void *arg) {
    attn_call *c = arg;
    c->ap.layer = c->next_layer;
    c->next_layer = (c->next_layer + 1) % c->layers;
    int rc = kvp_attention(c->ctx, c->store, &c->view, &c->ap);
    if (rc != KVP_OK) fprintf(stderr, "%s: %s\n", TOOL, kvp_ctx_last_error(c->ctx));
    return rc;
}

static int run_contig(void *arg) {
    attn_call *c = arg;
    c->ap.layer = c->next_copy;
    c->next_copy = (c->next_copy + 1) % c->layers;
    int rc = kvp_attention(c->ctx, &c->contig_store, &c->contig_view, &c->ap);
    if (rc != KVP_OK) fprintf(stderr, "%s: contiguous: %s\n", TOOL, kvp_ctx_last_error(c->ctx));
    return rc;
}

/* ---- one case ----------------------------------------------------------------------------- */

/* The contiguous baseline gets transparent huge pages like the store's arena. */
static uint8_t *huge_alloc(size_t bytes) {
    void *p = NULL;
    if (posix_memalign(&p, (size_t)2 << 20, bytes) != 0) return NULL;
#ifdef MADV_HUGEPAGE
    if (bytes >= ((size_t)2 << 20)) (void)madvise(p, bytes & ~(((size_t)2 << 20) - 1), MADV_HUGEPAGE);
#endif
    return p;
}

/* One case set up to be timed: its store, view, query and contiguous copies. */
typedef struct {
    attn_call c;
    kvp_store_t *s;
    int32_t *ids, *indptr, *last, *qo;
    int32_t *cids, *cindptr, *clast; /* the contiguous view's */
    float *q, *out;
    uint64_t bytes; /* what it holds: store arena and contiguous copies */
} case_state;

static void case_free(case_state *cs) {
    free(cs->ids);
    free(cs->indptr);
    free(cs->last);
    free(cs->qo);
    free(cs->cids);
    free(cs->cindptr);
    free(cs->clast);
    free(cs->q);
    free(cs->out);
    free(cs->c.contig.base);
    kvp_store_destroy(cs->s);
    memset(cs, 0, sizeof *cs);
}

/* The store of a case: `pages` pages of format f (and `staging` staging
 * pages), filled, with --layers layers or as many as cycle_layers() wants
 * for these pages (*layers). NULL after a message. */
static kvp_store_t *case_store(const options *o, const bench_format *f, int32_t P, int64_t pages,
                               int32_t staging, kvd_rng *rng, int32_t *layers) {
    *layers = o->layers;
    if (*layers == 0) { /* from one layer's bytes */
        kvp_layout_t l1 = {.struct_size = sizeof l1};
        char err[KVP_ERR_SIZE];
        if (kvp_layout_compute(1, KV_HEADS, HEAD_DIM, P, f->format, f->format, &l1, err, sizeof err) !=
            KVP_OK) {
            fprintf(stderr, "%s: %s\n", TOOL, err);
            return NULL;
        }
        *layers = cycle_layers((uint64_t)pages * KV_HEADS * (l1.k_block_bytes + l1.v_block_bytes));
    }
    kvp_store_t *s = make_store(f, P, pages, staging, *layers);
    if (s != NULL && fill_pages(s, P, pages, rng) != 0) {
        kvp_store_destroy(s);
        return NULL;
    }
    return s;
}

static int case_setup(const options *o, kvp_ctx_t *ctx, result *r, kvd_rng *rng, case_state *cs) {
    memset(cs, 0, sizeof *cs);
    const bench_format *f = &formats[r->fmt];
    int32_t P = r->page, B = r->batch, per = (r->context + P - 1) / P;
    int64_t pages = (int64_t)B * per;
    int32_t layers = 0;
    kvp_store_t *s = cs->s = case_store(o, f, P, pages, B, rng, &layers);
    if (s == NULL) return -1;
    cs->ids = malloc((size_t)pages * sizeof *cs->ids);
    cs->indptr = malloc((size_t)(B + 1) * 4);
    cs->last = malloc((size_t)B * 4);
    cs->qo = malloc((size_t)(B + 1) * 4);
    size_t qn = (size_t)B * Q_HEADS * HEAD_DIM;
    cs->q = malloc(qn * sizeof *cs->q);
    cs->out = malloc(qn * sizeof *cs->out);
    kvp_layout_t lay = {.struct_size = sizeof lay};
    kvp_store_layout(s, &lay);
    uint64_t kb = lay.k_block_bytes, vb = lay.v_block_bytes;
    size_t ck_bytes = (size_t)pages * KV_HEADS * kb, cv_bytes = (size_t)pages * KV_HEADS * vb;
    size_t copy_bytes = (size_t)bench_contig_copy_bytes(s, B, per);
    uint8_t *cbase = cs->c.contig.base = huge_alloc(copy_bytes * (size_t)layers);
    cs->cids = malloc((size_t)pages * sizeof *cs->cids);
    cs->cindptr = malloc((size_t)(B + 1) * 4);
    cs->clast = malloc((size_t)B * 4);
    int32_t *ids = cs->ids, *indptr = cs->indptr, *last = cs->last, *qo = cs->qo;
    if (!ids || !indptr || !last || !qo || !cs->q || !cs->out || !cbase || !cs->cids ||
        !cs->cindptr || !cs->clast) {
        case_free(cs);
        return -1;
    }
    uint64_t arena = 0;
    char err[KVP_ERR_SIZE];
    if (kvp_arena_bytes(&lay, (uint64_t)pages, lay.needs_staging ? (uint64_t)B : 0, &arena, err,
                        sizeof err) != KVP_OK) {
        fprintf(stderr, "%s: %s\n", TOOL, err);
        case_free(cs);
        return -1;
    }
    cs->bytes = arena + (uint64_t)copy_bytes * (uint64_t)layers;
    /* the batch's pages: from a page table, in the shuffled order of a
     * pool that has been running for a while */
    attn_call *c = &cs->c;
    if (kvb_shuffled_batch(TOOL, B, P, r->context, pages, lay.needs_staging ? B : 0, rng, indptr,
                           ids, last, &c->view) != 0) {
        case_free(cs);
        return -1;
    }
    for (int32_t b = 0; b <= B; b++) qo[b] = b;
    kvd_fill_normal(rng, qn, cs->q);

    c->ctx = ctx;
    c->store = s;
    kvb_decode_call(&c->ap, qo, Q_HEADS, HEAD_DIM, cs->q, cs->out);
    /* the contiguous cache: the same blocks, [batch][kv_head][page] end to end,
     * K then V, one copy per layer */
    uint8_t *ck = cbase, *cv = cbase + ck_bytes;
    for (int32_t b = 0; b < B; b++)
        for (int32_t h = 0; h < KV_HEADS; h++)
            for (int32_t j = 0; j < per; j++) {
                int32_t id = ids[indptr[b] + j];
                size_t at = ((size_t)b * KV_HEADS + (size_t)h) * (size_t)per + (size_t)j;
                memcpy(ck + at * kb, kvp__block_k(s, 0, id, h), (size_t)kb);
                memcpy(cv + at * vb, kvp__block_v(s, 0, id, h), (size_t)vb);
            }
    for (int32_t l = 1; l < layers; l++) /* the other layers' copies */
        memcpy(cbase + (size_t)l * copy_bytes, cbase, copy_bytes);
    c->layers = layers;
    r->layers = layers;
    c->contig.k_bytes = ck_bytes;
    c->contig.v_bytes = cv_bytes;
    c->contig.batch = B;
    c->contig.pages = per;
    c->contig_view.struct_size = sizeof c->contig_view;
    bench_contig_view(s, &c->contig, &c->contig_store, &c->contig_view, cs->cindptr, cs->cids,
                      cs->clast);
    r->bytes = (double)pages * (double)KV_HEADS * (double)(kb + vb);
    return 0;
}

/* Time the cases of one (page, batch, context) together: rounds in which
 * each case takes one paged and one contiguous sample, in alternating
 * order, so that every ratio (int4 / fp16, paged / contiguous) compares
 * samples taken within one round, a few ms apart, rather than cases
 * measured seconds apart while the host's other tenants move the memory
 * bandwidth. Times: medians of the samples; ratios: medians of the
 * rounds' ratios. A sample is enough back-to-back calls to last
 * min_seconds/64; 5 to 64 rounds cover about min_seconds per case. base:
 * the fp16 case's index, or -1. */
#define MAX_ROUNDS 64
/* The streaming read each round also takes (rd: NULL for none): the "of
 * read" fractions are medians of the rounds' fractions, so a host whose
 * memory bandwidth moves by 30% from second to second moves both sides. */
typedef struct {
    const float *buf;
    size_t n;
    int threads;
} read_probe;

static int time_group(result *rs, case_state *cs, int n, int base, double min_seconds,
                      const read_probe *rd) {
    int inner[8];
    double one_round = 0.0, rg[MAX_ROUNDS];
    if (rd != NULL) {
        double t0 = bench_now();
        if (bench_read_once(rd->threads, rd->buf, rd->n) <= 0.0) return -1;
        one_round += bench_now() - t0;
    }
    for (int i = 0; i < n; i++) {
        if (run_paged(&cs[i].c) != 0 || run_contig(&cs[i].c) != 0) return -1; /* warm-up */
        double t0 = bench_now();
        if (run_paged(&cs[i].c) != 0) return -1;
        double one = bench_now() - t0;
        double want = min_seconds / MAX_ROUNDS;
        inner[i] = one > 0.0 && one < want ? (int)(want / one) + 1 : 1;
        one_round += 2.0 * one * inner[i];
    }
    int rounds = one_round > 0.0 ? (int)(min_seconds * n / one_round) : MAX_ROUNDS;
    if (rounds < 5) rounds = 5;
    if (rounds > MAX_ROUNDS) rounds = MAX_ROUNDS;
    static double tp[8][MAX_ROUNDS], tc[8][MAX_ROUNDS];
    for (int k = 0; k < rounds; k++) {
        rg[k] = rd != NULL ? bench_read_once(rd->threads, rd->buf, rd->n) : 0.0;
        for (int m = 0; m < n; m++) {
            int i = k % 2 == 0 ? m : n - 1 - m;
            double t0 = bench_now();
            for (int j = 0; j < inner[i]; j++)
                if (run_paged(&cs[i].c) != 0) return -1;
            double t1 = bench_now();
            for (int j = 0; j < inner[i]; j++)
                if (run_contig(&cs[i].c) != 0) return -1;
            tp[i][k] = (t1 - t0) / inner[i];
            tc[i][k] = (bench_now() - t1) / inner[i];
        }
    }
    for (int i = 0; i < n; i++) {
        double sp[MAX_ROUNDS], pc[MAX_ROUNDS], fr[MAX_ROUNDS];
        for (int k = 0; k < rounds; k++) {
            sp[k] = base >= 0 ? tp[base][k] / tp[i][k] : 0.0;
            pc[k] = tc[i][k] / tp[i][k];
            fr[k] = rg[k] > 0.0 ? rs[i].bytes / tp[i][k] / 1e9 / rg[k] : 0.0;
        }
        rs[i].speedup = base >= 0 ? bench_median(sp, rounds) : 0.0;
        rs[i].vs_contig = bench_median(pc, rounds);
        rs[i].bw_fraction = rd != NULL ? bench_median(fr, rounds) : 0.0;
    }
    for (int i = 0; i < n; i++) {
        rs[i].t_paged = bench_median(tp[i], rounds);
        rs[i].t_contig = bench_median(tc[i], rounds);
    }
    return 0;
}

/* A group whose stores and contiguous copies together exceed this is timed
 * one case after another (its ratios then compare medians taken apart). */
#define GROUP_BYTES_MAX ((uint64_t)6 << 30)

/* Set up and time rs[0..n) (one page, batch and context; rs[0] fp16). */
static int time_cases(const options *o, kvp_ctx_t *ctx, result *rs, int n, kvd_rng *rng,
                      const read_probe *rd) {
    case_state cs[8];
    uint64_t held = 0;
    int ok = 0, together = 1;
    for (int i = 0; i < n; i++) {
        if (case_setup(o, ctx, &rs[i], rng, &cs[i]) != 0) goto out;
        ok = i + 1;
        held += cs[i].bytes;
        if (held > GROUP_BYTES_MAX && i + 1 < n) { /* too big: one at a time */
            together = 0;
            break;
        }
    }
    if (together) {
        int rc = time_group(rs, cs, n, rs[0].fmt == 0 ? 0 : -1, o->min_seconds, rd);
        for (int i = 0; i < n; i++) case_free(&cs[i]);
        return rc;
    }
    for (int i = 0; i < ok; i++) case_free(&cs[i]);
    ok = 0;
    for (int i = 0; i < n; i++) {
        if (case_setup(o, ctx, &rs[i], rng, &cs[0]) != 0) return -1;
        int rc = time_group(&rs[i], &cs[0], 1, -1, o->min_seconds, rd);
        case_free(&cs[0]);
        if (rc != 0) return -1;
        if (rs[0].fmt == 0) rs[i].speedup = rs[0].t_paged / rs[i].t_paged;
    }
    return 0;
out:
    for (int i = 0; i < ok; i++) case_free(&cs[i]);
    return -1;
}

/* ---- prefill: a chunk of one sequence's query tokens, causal -------------------------------- */

/* The mixed case: one step of an engine with chunked prefill, a
 * MIXED_CHUNK-token chunk of one sequence batched with MIXED_DECODES decode
 * sequences (q_len 1), every sequence MIXED_CONTEXT tokens long. */
#define MIXED_CHUNK 512
#define MIXED_DECODES 15
#define MIXED_CONTEXT 8192
/* The longest context --prefill runs. */
#define PREFILL_LONGEST 32768

/* One measured prefill case (fmt: index into formats[], 0 = fp16, the
 * baseline): a query of the last `chunk` tokens of a sequence of `context`
 * tokens, or (mixed) that and MIXED_DECODES decode sequences of `context`
 * tokens in one call. */
typedef struct {
    int fmt, page, chunk, context, mixed;
    int layers;     /* layers the timed calls cycle over */
    double fmas;    /* useful FMAs of one call (QK and PV) */
    double t;       /* seconds per call: median of the rounds' samples */
    double speedup; /* over fp16: median of the rounds' ratios (0: not measured) */
    double fma_fraction; /* of the FMA probe each round takes: median of the rounds' ratios */
} prefill_result;

/* Set up a prefill case: its store (pages shuffled as for decode, layers
 * cycled as for decode), view, query rows and causal call. No contiguous
 * copies. Returns 0, or -1 after a message with nothing held. */
static int prefill_setup(const options *o, kvp_ctx_t *ctx, prefill_result *r, kvd_rng *rng,
                         case_state *cs) {
    memset(cs, 0, sizeof *cs);
    const bench_format *f = &formats[r->fmt];
    int32_t P = r->page, B = r->mixed ? 1 + MIXED_DECODES : 1, per = (r->context + P - 1) / P;
    int32_t rows = r->chunk + B - 1, layers = 0;
    int64_t pages = (int64_t)B * per;
    kvp_store_t *s = cs->s = case_store(o, f, P, pages, B, rng, &layers);
    if (s == NULL) return -1;
    size_t qn = (size_t)rows * Q_HEADS * HEAD_DIM;
    cs->ids = malloc((size_t)pages * sizeof *cs->ids);
    cs->indptr = malloc((size_t)(B + 1) * sizeof *cs->indptr);
    cs->last = malloc((size_t)B * sizeof *cs->last);
    cs->qo = malloc((size_t)(B + 1) * sizeof *cs->qo);
    cs->q = malloc(qn * sizeof *cs->q);
    cs->out = malloc(qn * sizeof *cs->out);
    if (!cs->ids || !cs->indptr || !cs->last || !cs->qo || !cs->q || !cs->out) {
        fprintf(stderr, "%s: out of memory\n", TOOL);
        case_free(cs);
        return -1;
    }
    kvp_layout_t lay = {.struct_size = sizeof lay};
    uint64_t arena = 0;
    char err[KVP_ERR_SIZE];
    if (kvp_store_layout(s, &lay) != KVP_OK) {
        fprintf(stderr, "%s: %s\n", TOOL, kvp_store_last_error(s));
        case_free(cs);
        return -1;
    }
    if (kvp_arena_bytes(&lay, (uint64_t)pages, lay.needs_staging ? (uint64_t)B : 0, &arena, err,
                        sizeof err) != KVP_OK) {
        fprintf(stderr, "%s: %s\n", TOOL, err);
        case_free(cs);
        return -1;
    }
    cs->bytes = arena + 2 * (uint64_t)qn * sizeof *cs->q;
    attn_call *c = &cs->c;
    if (kvb_shuffled_batch(TOOL, B, P, r->context, pages, lay.needs_staging ? B : 0, rng, cs->indptr,
                           cs->ids, cs->last, &c->view) != 0) {
        case_free(cs);
        return -1;
    }
    /* the prefill sequence's chunk, then one row per decode sequence */
    cs->qo[0] = 0;
    for (int32_t b = 0; b < B; b++) cs->qo[b + 1] = r->chunk + b;
    kvd_fill_normal(rng, qn, cs->q);
    c->ctx = ctx;
    c->store = s;
    c->layers = layers;
    kvb_decode_call(&c->ap, cs->qo, Q_HEADS, HEAD_DIM, cs->q, cs->out);
    c->ap.causal = 1;
    r->layers = layers;
    r->fmas = kvb_attn_fmas(r->chunk, r->context) + (B - 1) * kvb_attn_fmas(1, r->context);
    return 0;
}

/* Time the prefill cases of one (page, chunk, context) together, as
 * time_group does the decode cases: rounds in which each case takes one
 * sample, in an order reversed every other round, so that 'vs fp16'
 * compares samples taken within one round. A prefill call is long (a
 * 512-token chunk over 8k tokens of fp16: about 0.4 s on 2 cores; 2048
 * over 32k: several s), so a sample is one call where a call takes more
 * than min_seconds/8, else enough back-to-back calls to last about that
 * long, and PREFILL_MIN_ROUNDS to PREFILL_MAX_ROUNDS rounds cover about
 * min_seconds per case. Each case's warm-up call also sizes its samples
 * (a short one is timed again, warm). Each round also runs the FMA probe
 * for PREFILL_PROBE_SECONDS: 'of fma' is the median of the rounds' ratios,
 * as decode's 'of read' is (this VM's FMA rate has read 117 and 223 G/s in
 * runs minutes apart). base: the fp16 case's index, or -1. */
#define PREFILL_MIN_ROUNDS 3
#define PREFILL_MAX_ROUNDS 16
#define PREFILL_GROUP 8 /* cases of one (page, chunk, context) at most */
#define PREFILL_PROBE_SECONDS 0.05

static int time_prefill(prefill_result *rs, case_state *cs, int n, int base, double min_seconds,
                        int threads) {
    int inner[PREFILL_GROUP];
    double one_round = 0.0, want = min_seconds / 8.0, t[PREFILL_GROUP][PREFILL_MAX_ROUNDS];
    double roof[PREFILL_MAX_ROUNDS];
    for (int i = 0; i < n; i++) {
        double t0 = bench_now();
        if (run_paged(&cs[i].c) != 0) return -1; /* warm-up */
        double one = bench_now() - t0;
        if (one < want) {
            t0 = bench_now();
            if (run_paged(&cs[i].c) != 0) return -1;
            one = bench_now() - t0;
        }
        inner[i] = one > 0.0 && one < want ? (int)(want / one) + 1 : 1;
        one_round += one * inner[i];
    }
    double want_rounds = one_round > 0.0 ? min_seconds * n / one_round : PREFILL_MAX_ROUNDS;
    int rounds = want_rounds < PREFILL_MIN_ROUNDS   ? PREFILL_MIN_ROUNDS
                 : want_rounds > PREFILL_MAX_ROUNDS ? PREFILL_MAX_ROUNDS
                                                    : (int)want_rounds;
    for (int k = 0; k < rounds; k++) {
        roof[k] = bench_fma_once(threads, PREFILL_PROBE_SECONDS);
        for (int m = 0; m < n; m++) {
            int i = k % 2 == 0 ? m : n - 1 - m;
            double t0 = bench_now();
            for (int j = 0; j < inner[i]; j++)
                if (run_paged(&cs[i].c) != 0) return -1;
            t[i][k] = (bench_now() - t0) / inner[i];
        }
    }
    for (int i = 0; i < n; i++) {
        double sp[PREFILL_MAX_ROUNDS], fr[PREFILL_MAX_ROUNDS];
        for (int k = 0; k < rounds; k++) {
            sp[k] = base >= 0 ? t[base][k] / t[i][k] : 0.0;
            fr[k] = roof[k] > 0.0 ? rs[i].fmas / t[i][k] / roof[k] : 0.0;
        }
        rs[i].speedup = base >= 0 ? bench_median(sp, rounds) : 0.0;
        rs[i].fma_fraction = bench_median(fr, rounds);
        rs[i].t = bench_median(t[i], rounds);
    }
    return 0;
}

/* Set up and time rs[0..n) (one page, chunk and context, or the mixed
 * case of one page; rs[0] fp16). Past GROUP_BYTES_MAX the cases are timed
 * one after another, as decode's are, and 'vs fp16' is a ratio of medians. */
static int time_prefill_cases(const options *o, kvp_ctx_t *ctx, prefill_result *rs, int n,
                              kvd_rng *rng) {
    case_state cs[PREFILL_GROUP];
    uint64_t held = 0;
    int ok = 0, together = 1, base = rs[0].fmt == 0 ? 0 : -1;
    for (int i = 0; i < n; i++) {
        if (prefill_setup(o, ctx, &rs[i], rng, &cs[i]) != 0) goto out;
        ok = i + 1;
        held += cs[i].bytes;
        if (held > GROUP_BYTES_MAX && i + 1 < n) { /* too big: one at a time */
            together = 0;
            break;
        }
    }
    if (together) {
        int rc = time_prefill(rs, cs, n, base, o->min_seconds, o->threads);
        for (int i = 0; i < n; i++) case_free(&cs[i]);
        return rc;
    }
    for (int i = 0; i < ok; i++) case_free(&cs[i]);
    for (int i = 0; i < n; i++) {
        if (prefill_setup(o, ctx, &rs[i], rng, &cs[0]) != 0) return -1;
        int rc = time_prefill(&rs[i], &cs[0], 1, -1, o->min_seconds, o->threads);
        case_free(&cs[0]);
        if (rc != 0) return -1;
        if (base == 0) rs[i].speedup = rs[0].t / rs[i].t;
    }
    return 0;
out:
    for (int i = 0; i < ok; i++) case_free(&cs[i]);
    return -1;
}

/* ---- accuracy against the float64 reference (4096 tokens, fresh inputs) -------------------- */

/* Relative L2 error of one decode step of `seqs` fresh sequences of 4096
 * tokens each (errors pooled: one sequence's figure swings by +-20% with the
 * draw, since a few tokens carry most of the softmax weight; --acc-seqs
 * takes more for a steadier figure). */
static double accuracy(kvp_ctx_t *ctx, const bench_format *f, int32_t P, kvd_rng *rng,
                       int seqs) {
    const int32_t T = ACC_TOKENS, per = T / P + 1;
    kvp_store_t *s = make_store(f, P, (int64_t)per * seqs, seqs, 1);
    size_t n = (size_t)T * KV_HEADS * HEAD_DIM, qn = (size_t)Q_HEADS * HEAD_DIM;
    float *k = malloc(n * 4), *v = malloc(n * 4), *q = malloc(qn * 4), *out = malloc(qn * 4);
    double *ref = malloc(qn * 8), num = 0.0, den = 0.0;
    int ok = s != NULL && k && v && q && out && ref;
    kvp_layout_t lay = {.struct_size = sizeof lay};
    kvp_pool_t *pool = NULL;
    kvp_table_t *t = NULL;
    if (ok) {
        kvp_store_layout(s, &lay);
        ok = kvb_pool_table(TOOL, P, (int64_t)per * seqs, lay.needs_staging ? seqs : 0, seqs, &pool,
                            &t) == 0;
    }
    for (int b = 0; b < seqs && ok; b++) {
        kvd_keys keys;
        if (kvd_keys_init(&keys, rng, KV_HEADS, HEAD_DIM) != 0) {
            ok = 0;
            break;
        }
        kvd_fill_keys(&keys, rng, (size_t)T, k);
        kvd_fill_normal(rng, n, v);
        kvd_fill_normal(rng, qn, q);
        int32_t seq = -1;
        if (kvp_table_seq_create(t, 0, 0, &seq) == KVP_OK &&
            append_sequence(s, t, seq, k, v, T) == 0) {
            int32_t indptr[2], indices[ACC_TOKENS + 2], last[1], qo[2] = {0, 1};
            kvp_kv_view_t view = {.struct_size = sizeof view};
            kvp_batch_buffers_t buf = {.struct_size = sizeof buf};
            buf.indptr = indptr;
            buf.indices = indices;
            buf.last_page_len = last;
            buf.indices_capacity = ACC_TOKENS + 2;
            if (kvp_table_export(t, &seq, 1, NULL, &buf, &view) != KVP_OK) {
                fprintf(stderr, "%s: export: %s\n", TOOL, kvp_table_last_error(t));
                ok = 0;
                kvd_keys_free(&keys);
                break;
            }
            kvp_attention_params_t ap;
            kvp_attention_params_init(&ap);
            ap.q_heads = Q_HEADS;
            ap.sm_scale = (float)kvd_sm_scale(&keys);
            ap.qo_indptr = qo;
            ap.q = q;
            ap.out = out;
            kvd_attn ra = {Q_HEADS, KV_HEADS, HEAD_DIM, ap.sm_scale, 0.0, 1, -1};
            if (kvp_attention(ctx, s, &view, &ap) == KVP_OK && kvd_reference(&ra, q, 1, k, v, T, ref) == 0) {
                for (size_t i = 0; i < qn; i++) {
                    num += ((double)out[i] - ref[i]) * ((double)out[i] - ref[i]);
                    den += ref[i] * ref[i];
                }
            } else ok = 0;
        } else ok = 0;
        kvd_keys_free(&keys);
    }
    kvp_table_destroy(t);
    kvp_pool_destroy(pool);
    kvp_store_destroy(s);
    free(k);
    free(v);
    free(q);
    free(out);
    free(ref);
    return ok && den > 0.0 ? sqrt(num / den) : -1.0;
}

/* Relative L2 error of a causal PREFILL_ACC_CHUNK-token chunk at the end of
 * one fresh sequence of ACC_TOKENS tokens, page PREFILL_ACC_PAGE, for each
 * of fp16, int8 and int4 (err[0..3); -1 where a run failed). The three read
 * the same inputs, so one float64 reference serves them all; one sequence
 * is enough, its chunk's 128 x 32 query rows pooling the errors. */
#define PREFILL_ACC_CHUNK 128
#define PREFILL_ACC_PAGE 32

static void prefill_accuracy(kvp_ctx_t *ctx, kvd_rng *rng, double err[3]) {
    enum { T = ACC_TOKENS, C = PREFILL_ACC_CHUNK, P = PREFILL_ACC_PAGE, PER = (T + P - 1) / P };
    size_t n = (size_t)T * KV_HEADS * HEAD_DIM, qn = (size_t)C * Q_HEADS * HEAD_DIM;
    float *k = malloc(n * sizeof *k), *v = malloc(n * sizeof *v), *q = malloc(qn * sizeof *q),
          *out = malloc(qn * sizeof *out);
    double *ref = malloc(qn * sizeof *ref);
    kvd_keys keys;
    memset(&keys, 0, sizeof keys);
    for (int f = 0; f < 3; f++) err[f] = -1.0;
    if (!k || !v || !q || !out || !ref || kvd_keys_init(&keys, rng, KV_HEADS, HEAD_DIM) != 0) {
        fprintf(stderr, "%s: prefill accuracy: out of memory\n", TOOL);
        goto out;
    }
    kvd_fill_keys(&keys, rng, (size_t)T, k);
    kvd_fill_normal(rng, n, v);
    kvd_fill_normal(rng, qn, q);
    kvd_attn ra = {Q_HEADS, KV_HEADS, HEAD_DIM, kvd_sm_scale(&keys), 0.0, 1, -1};
    if (kvd_reference(&ra, q, C, k, v, T, ref) != 0) {
        fprintf(stderr, "%s: prefill accuracy: out of memory\n", TOOL);
        goto out;
    }
    for (int f = 0; f < 3; f++) {
        kvp_store_t *s = make_store(&formats[f], P, PER, 1, 1);
        kvp_pool_t *pool = NULL;
        kvp_table_t *t = NULL;
        kvp_layout_t lay = {.struct_size = sizeof lay};
        int32_t seq = -1, indptr[2], indices[PER + 2], last[1], qo[2] = {0, C};
        kvp_kv_view_t view = {.struct_size = sizeof view};
        kvp_batch_buffers_t buf = {.struct_size = sizeof buf};
        buf.indptr = indptr;
        buf.indices = indices;
        buf.last_page_len = last;
        buf.indices_capacity = PER + 2;
        if (s == NULL || kvp_store_layout(s, &lay) != KVP_OK ||
            kvb_pool_table(TOOL, P, PER, lay.needs_staging ? 1 : 0, 1, &pool, &t) != 0)
            goto next;
        if (kvp_table_seq_create(t, 0, 0, &seq) != KVP_OK) {
            fprintf(stderr, "%s: prefill accuracy: %s\n", TOOL, kvp_table_last_error(t));
            goto next;
        }
        if (append_sequence(s, t, seq, k, v, T) != 0) goto next;
        if (kvp_table_export(t, &seq, 1, NULL, &buf, &view) != KVP_OK) {
            fprintf(stderr, "%s: export: %s\n", TOOL, kvp_table_last_error(t));
            goto next;
        }
        kvp_attention_params_t ap;
        kvp_attention_params_init(&ap);
        ap.q_heads = Q_HEADS;
        ap.sm_scale = (float)ra.sm_scale;
        ap.causal = 1;
        ap.qo_indptr = qo;
        ap.q = q;
        ap.out = out;
        if (kvp_attention(ctx, s, &view, &ap) != KVP_OK) {
            fprintf(stderr, "%s: prefill accuracy: %s\n", TOOL, kvp_ctx_last_error(ctx));
            goto next;
        }
        err[f] = kvd_rel_l2(out, ref, qn);
    next:
        kvp_table_destroy(t);
        kvp_pool_destroy(pool);
        kvp_store_destroy(s);
    }
out:
    kvd_keys_free(&keys);
    free(k);
    free(v);
    free(q);
    free(out);
    free(ref);
}

/* ---- report -------------------------------------------------------------------------------- */

static void usage(FILE *f) {
    fprintf(f, "usage: kvpage-bench attention [--device cpu|cuda] [--quick] [--threads N (2; 1..64)] "
               "[--isa auto|portable|avx2|avx512|avx512-bf16|neon|neon-dotprod]\n"
               "       [--acc-seqs N (8; 1..256)] [--accuracy-only | --no-accuracy] "
               "[--seconds S (per case; 0.25, --quick 0.12; 0.001..600)]\n"
               "       [--format fp16|int8|int4|fp16-hnd|int4_v1] [--page N] [--batch 1|16 (decode)] "
               "[--context N (a multiple of the page size; k = x1024)]   (run only matching cases)\n"
               "       [--prefill (only the prefill cases: chunks 128, 512, 2048 x contexts 8k, 32k x "
               "pages 16, 32, and a mixed batch) | --decode (only the decode cases)]\n"
               "       [--chunk N (only prefill chunks of N query tokens; k = x1024; at most the "
               "context)]\n"
               "       [--layers N (0: as many as make 256 MiB, at most 32; 1: one layer, "
               "partly from cache; 0..64)]\n"
               "       --device cuda: kvpage-bench attention --device cuda --help\n");
}

/* Returns 0 to run, 1 after --help, CLI_USAGE after a message. */
static int parse_options(int argc, char **argv, options *o) {
    o->threads = 2;
    o->quick = 0;
    o->isa = KVP_ISA_AUTO;
    o->min_seconds = 0.25;
    o->only.fmt = o->only.page = o->only.batch = o->only.context = -1;
    o->acc_seqs = 8;
    o->accuracy_only = 0;
    o->no_accuracy = 0;
    o->layers = 0;
    o->prefill_only = 0;
    o->decode_only = 0;
    o->chunk = 0;
    double seconds = 0.0; /* 0: not given */
    const char *fmt_names[sizeof formats / sizeof *formats];
    for (size_t k = 0; k < sizeof formats / sizeof *formats; k++) fmt_names[k] = formats[k].name;
    const char *isa_names[KVP_ISA_COUNT];
    for (int32_t k = KVP_ISA_AUTO; k < KVP_ISA_COUNT; k++) isa_names[k] = kvp_isa_name(k);
    static const char *const devices[] = {"cpu"}; /* cuda: bench_attention_cuda */
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        bool ok = true;
        int taken, unused;
        if (!strcmp(a, "--quick")) o->quick = 1;
        else if (!strcmp(a, "--accuracy-only")) o->accuracy_only = 1;
        else if (!strcmp(a, "--no-accuracy")) o->no_accuracy = 1;
        else if (!strcmp(a, "--prefill")) o->prefill_only = 1;
        else if (!strcmp(a, "--decode")) o->decode_only = 1;
        else if (!strcmp(a, "--chunk")) {
            int64_t v = 0;
            ok = cli_opt_i64(TOOL, argc, argv, &i, 1, KVB_MAX_CONTEXT, true, &v, stderr);
            if (ok) o->chunk = (int)v;
        } else if (!strcmp(a, "--seconds")) ok = cli_opt_double(TOOL, argc, argv, &i, 0.001, 600.0, &seconds, stderr);
        else if (!strcmp(a, "--acc-seqs")) ok = cli_opt_int(TOOL, argc, argv, &i, 1, 256, &o->acc_seqs, stderr);
        else if (!strcmp(a, "--layers")) ok = cli_opt_int(TOOL, argc, argv, &i, 0, 64, &o->layers, stderr);
        else if (!strcmp(a, "--threads")) ok = cli_opt_int(TOOL, argc, argv, &i, 1, 64, &o->threads, stderr);
        else if (!strcmp(a, "--device")) ok = cli_opt_choice(TOOL, argc, argv, &i, devices, 1, &unused, stderr);
        else if (!strcmp(a, "--isa")) {
            int isa = 0;
            ok = cli_opt_choice(TOOL, argc, argv, &i, isa_names, KVP_ISA_COUNT, &isa, stderr);
            o->isa = isa;
            if (ok && !kvp_isa_supported(o->isa))
                return cli_error(stderr, TOOL, "--isa %s: this CPU cannot run it", argv[i]);
        } else if ((taken = kvb_parse_only(TOOL, argc, argv, &i, fmt_names,
                                            (int)(sizeof fmt_names / sizeof *fmt_names), &o->only)) != 0)
            ok = taken > 0;
        else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 1;
        } else {
            return cli_reject_option(TOOL, a, usage);
        }
        if (!ok) return CLI_USAGE;
    }
    if (o->accuracy_only && o->no_accuracy)
        return cli_error(stderr, TOOL, "--accuracy-only and --no-accuracy exclude each other");
    if (o->prefill_only && o->decode_only)
        return cli_error(stderr, TOOL, "--prefill and --decode exclude each other");
    if (o->chunk > 0 && o->decode_only)
        return cli_error(stderr, TOOL, "--chunk picks prefill cases, and --decode runs none");
    if (kvb_check_context(TOOL, &o->only) != 0) return CLI_USAGE;
    if (o->chunk > 0) { /* a chunk is the last tokens of its context */
        int longest = o->only.context > 0                ? o->only.context
                      : o->prefill_only && !o->quick ? PREFILL_LONGEST
                                                       : MIXED_CONTEXT;
        if (o->chunk > longest)
            return cli_error(stderr, TOOL, "--chunk must be at most the context (%s %d), got %d",
                             o->only.context > 0 ? "--context" : "the longest run is", longest, o->chunk);
    }
    if (o->quick) o->min_seconds = 0.12;
    if (seconds > 0.0) o->min_seconds = seconds;
    return 0;
}

static const char *ctx_isa_name(const kvp_ctx_t *ctx) {
    kvp_ctx_info_t info = {.struct_size = sizeof info};
    return kvp_ctx_info(ctx, &info) == KVP_OK ? kvp_isa_name(info.isa) : "?";
}

/* The decode table and its headline: head[] = fp16 fraction of read
 * bandwidth, int8 and int4 speedups, paged / contiguous. Returns 0, or -1
 * after a message. */
static int decode_table(const options *o, kvp_ctx_t *ctx, kvd_rng *rng, const bench_roofs *roofs,
                        double head[4]) {
    static const int pages_full[] = {16, 32}, pages_quick[] = {32};
    static const int batches[] = {1, 16};
    static const int ctx_full[] = {1024, 8192, 32768}, ctx_quick[] = {8192, 32768};
    const int *pg = o->quick ? pages_quick : pages_full;
    int npg = o->quick ? 1 : 2;
    const int *cx = o->quick ? ctx_quick : ctx_full;
    int ncx = o->quick ? 2 : 3;
    int one_ctx[1] = {o->only.context}, one_page[1] = {o->only.page};
    if (o->only.context > 0) { cx = one_ctx; ncx = 1; }
    if (o->only.page > 0) { pg = one_page; npg = 1; }
    /* fp16, int8, int4 (and fp16-hnd unless --quick); int4_v1 when asked for */
    int nfmt = o->only.fmt >= 3 ? o->only.fmt + 1 : o->quick ? 3 : 4, max_ctx = cx[ncx - 1];
    result rs[64];
    int n = 0;
    /* the streaming read that every timing round repeats (time_group):
     * 256 MiB, 8x this machine's L3, on huge pages like the arena */
    read_probe rd = {NULL, ((size_t)256 << 20) / sizeof(float), o->threads};
    float *rbuf = (float *)(void *)huge_alloc(rd.n * sizeof(float));
    if (rbuf == NULL) {
        fprintf(stderr, "%s: out of memory\n", TOOL);
        return -1;
    }
    for (size_t i = 0; i < rd.n; i++) rbuf[i] = (float)(i & 1023) * 1e-3f;
    rd.buf = rbuf;
    printf("timing: the formats of a (page, batch, context) alternate in rounds, each with a 256 MiB "
           "streaming read;\n  'of read', 'vs fp16' and 'paged/contig' are medians of the rounds' "
           "ratios; the timed calls cycle over 'layers' layers\n\n");
    printf("%-9s %4s %5s %7s %10s %9s %7s %8s %10s %6s\n", "format", "page", "batch", "context",
           "time ms", "KV GB/s", "of read", "vs fp16", "paged/contig", "layers");
    for (int ip = 0; ip < npg; ip++)
        for (int ib = 0; ib < 2; ib++)
            for (int ic = 0; ic < ncx; ic++) {
                /* --quick: batch 16 only at 8k (a 32k batch of 16 is 2 GiB of fp16) */
                if (o->quick && o->only.batch < 0 && batches[ib] == 16 && cx[ic] > 8192) continue;
                if (o->only.batch >= 0 && batches[ib] != o->only.batch) continue;
                /* the group: this (page, batch, context)'s formats, fp16 first */
                int g0 = n, g = 0;
                for (int f = 0; f < nfmt; f++) {
                    if (o->only.fmt >= 0 && f != o->only.fmt && f != 0) continue;
                    result *r = &rs[n + g++];
                    memset(r, 0, sizeof *r);
                    r->fmt = f;
                    r->page = pg[ip];
                    r->batch = batches[ib];
                    r->context = cx[ic];
                }
                if (time_cases(o, ctx, &rs[g0], g, rng, &rd) != 0) {
                    fprintf(stderr, "%s: case failed\n", TOOL);
                    free(rbuf);
                    return -1;
                }
                for (; n < g0 + g; n++) {
                    const result *r = &rs[n];
                    double gbps = r->bytes / r->t_paged / 1e9;
                    printf("%-9s %4d %5d %7d %10.3f %9.1f %7.2f %8.2f %10.2f %6d\n", formats[r->fmt].name,
                           r->page, r->batch, r->context, r->t_paged * 1e3, gbps,
                           r->bw_fraction, r->speedup, r->vs_contig, r->layers);
                }
                fflush(stdout);
            }
    head[0] = kvb_headline(rs, n, 0, KVB_BW_FRACTION, roofs->read_gbps, max_ctx);
    head[1] = kvb_headline(rs, n, 1, KVB_SPEEDUP, roofs->read_gbps, max_ctx);
    head[2] = kvb_headline(rs, n, 2, KVB_SPEEDUP, roofs->read_gbps, max_ctx);
    head[3] = kvb_headline(rs, n, 0, KVB_PAGED_VS_CONTIG, roofs->read_gbps, max_ctx);
    printf("\nheadline (page 32, median over batch 1 and 16 at contexts >= 8k; paged/contig at %dk):\n"
           "  fp16 %.2f of read bandwidth, int8 %.2fx and int4 %.2fx faster than fp16, "
           "paged/contiguous %.3f\n", max_ctx / 1024, head[0], head[1], head[2], head[3]);
    free(rbuf);
    return 0;
}

/* The prefill table: groups of (page, context, chunk) with chunk <= context,
 * then each page's mixed case, formats fp16, int8 and int4 (--format X:
 * fp16 and X). The full set with --prefill (without --quick); else page 32,
 * a 512-token chunk over 8k, and the mixed case. --page, --context and
 * --chunk narrow it; the mixed case runs where they allow its 512-token
 * chunk over 8k. Returns 0, or -1 after a message; rs holds *n cases. */
#define PREFILL_CASES_MAX 64

static int prefill_table(const options *o, kvp_ctx_t *ctx, kvd_rng *rng, const bench_roofs *roofs,
                         prefill_result *rs, int *n) {
    static const int pages_full[] = {16, 32}, chunks_full[] = {128, 512, 2048},
                     ctx_full[] = {8192, PREFILL_LONGEST};
    static const int pages_one[] = {32}, chunks_one[] = {MIXED_CHUNK}, ctx_one[] = {MIXED_CONTEXT};
    int full = o->prefill_only && !o->quick;
    const int *pg = full ? pages_full : pages_one, *ch = full ? chunks_full : chunks_one,
              *cx = full ? ctx_full : ctx_one;
    int npg = full ? 2 : 1, nch = full ? 3 : 1, ncx = full ? 2 : 1;
    int one_page[1] = {o->only.page}, one_chunk[1] = {o->chunk}, one_ctx[1] = {o->only.context};
    if (o->only.page > 0) { pg = one_page; npg = 1; }
    if (o->chunk > 0) { ch = one_chunk; nch = 1; }
    if (o->only.context > 0) { cx = one_ctx; ncx = 1; }
    int mixed = (o->chunk <= 0 || o->chunk == MIXED_CHUNK) &&
                (o->only.context <= 0 || o->only.context == MIXED_CONTEXT);
    *n = 0;
    printf("prefill (causal): one sequence of 'context' tokens whose last 'chunk' are the query; "
           "mixed: a %d-token chunk\n  over %dk batched with %d decode sequences of %dk (a step of "
           "chunked prefill). FMAs: QK and PV, causal;\n  'of fma' and 'of int8': of the fp32 FMA and "
           "int8 MAC roofs; 'vs fp16': median of the rounds' ratios\n\n", MIXED_CHUNK,
           MIXED_CONTEXT / 1024, MIXED_DECODES, MIXED_CONTEXT / 1024);
    printf("%-9s %4s %6s %7s %10s %9s %7s %7s %8s %6s\n", "format", "page", "chunk", "context",
           "time ms", "G FMA/s", "of fma", "of int8", "vs fp16", "layers");
    fflush(stdout);
    for (int ip = 0; ip < npg; ip++)
        for (int ic = 0; ic <= ncx; ic++)
            for (int ik = 0; ik < (ic < ncx ? nch : 1); ik++) {
                int is_mixed = ic == ncx; /* after the page's other cases */
                if (is_mixed && !mixed) continue;
                int chunk = is_mixed ? MIXED_CHUNK : ch[ik], context = is_mixed ? MIXED_CONTEXT : cx[ic];
                if (chunk > context) continue;
                /* the group: this (page, chunk, context)'s formats, fp16 first */
                int g0 = *n, g = 0;
                for (int f = 0; f < (int)(sizeof formats / sizeof *formats); f++) {
                    if (o->only.fmt >= 0 ? f != o->only.fmt && f != 0 : f > 2) continue;
                    if (*n + g >= PREFILL_CASES_MAX) {
                        fprintf(stderr, "%s: more than %d prefill cases\n", TOOL, PREFILL_CASES_MAX);
                        return -1;
                    }
                    prefill_result *r = &rs[*n + g++];
                    memset(r, 0, sizeof *r);
                    r->fmt = f;
                    r->page = pg[ip];
                    r->chunk = chunk;
                    r->context = context;
                    r->mixed = is_mixed;
                }
                if (time_prefill_cases(o, ctx, &rs[g0], g, rng) != 0) {
                    fprintf(stderr, "%s: prefill case failed\n", TOOL);
                    return -1;
                }
                for (; *n < g0 + g; (*n)++) {
                    const prefill_result *r = &rs[*n];
                    double rate = r->fmas / r->t;
                    char chunk_s[16], of8[16];
                    if (r->mixed) snprintf(chunk_s, sizeof chunk_s, "mixed");
                    else snprintf(chunk_s, sizeof chunk_s, "%d", r->chunk);
                    /* the int8 roof, scaled as the rounds' FMA probes moved from the run's start */
                    if (formats[r->fmt].format != KVP_FORMAT_FP16 && roofs->int8_macs_per_s > 0.0)
                        snprintf(of8, sizeof of8, "%.2f",
                                 r->fma_fraction * roofs->fma_per_s / roofs->int8_macs_per_s);
                    else snprintf(of8, sizeof of8, "-");
                    printf("%-9s %4d %6s %7d %10.3f %9.1f %7.2f %7s %8.2f %6d\n", formats[r->fmt].name,
                           r->page, chunk_s, r->context, r->t * 1e3, rate / 1e9,
                           r->fma_fraction, of8, r->speedup, r->layers);
                }
                fflush(stdout);
            }
    return 0;
}

static const prefill_result *prefill_find(const prefill_result *rs, int n, int fmt, int page,
                                          int chunk, int context, int mixed) {
    for (int i = 0; i < n; i++)
        if (rs[i].fmt == fmt && rs[i].page == page && rs[i].chunk == chunk &&
            rs[i].context == context && rs[i].mixed == mixed)
            return &rs[i];
    return NULL;
}

/* A JSON number: v with `digits` decimals (sci: in exponent form), or null
 * when it was not measured (NaN). */
static const char *json_num(char *buf, size_t size, double v, int digits, bool sci) {
    if (isnan(v)) snprintf(buf, size, "null");
    else snprintf(buf, size, sci ? "%.*e" : "%.*f", digits, v);
    return buf;
}

/* The prefill keys of the last JSON line, from the page-32 cases: a
 * 512-token chunk over 8k, and the mixed case (null where not measured);
 * the prefill errors (null where not measured). No leading or trailing
 * comma. */
static void print_prefill_keys(const prefill_result *rs, int n,
                               const double perr[3]) {
    const prefill_result *p[3], *m[3];
    for (int f = 0; f < 3; f++) {
        p[f] = prefill_find(rs, n, f, 32, MIXED_CHUNK, MIXED_CONTEXT, 0);
        m[f] = prefill_find(rs, n, f, 32, MIXED_CHUNK, MIXED_CONTEXT, 1);
    }
    char b[11][32];
    printf("\"prefill_fp16_fma_fraction\": %s, \"prefill_int8_speedup\": %s, "
           "\"prefill_int4_speedup\": %s, \"prefill_fp16_gfma\": %s, \"prefill_int8_gfma\": %s, "
           "\"prefill_int4_gfma\": %s, \"mixed_int8_speedup\": %s, \"mixed_int4_speedup\": %s, "
           "\"prefill_fp16_rel_err\": %s, \"prefill_int8_rel_err\": %s, \"prefill_int4_rel_err\": %s",
           json_num(b[0], 32, p[0] ? p[0]->fma_fraction : NAN, 4, false),
           json_num(b[1], 32, p[1] && p[0] ? p[1]->speedup : NAN, 4, false),
           json_num(b[2], 32, p[2] && p[0] ? p[2]->speedup : NAN, 4, false),
           json_num(b[3], 32, p[0] ? p[0]->fmas / p[0]->t / 1e9 : NAN, 3, false),
           json_num(b[4], 32, p[1] ? p[1]->fmas / p[1]->t / 1e9 : NAN, 3, false),
           json_num(b[5], 32, p[2] ? p[2]->fmas / p[2]->t / 1e9 : NAN, 3, false),
           json_num(b[6], 32, m[1] && m[0] ? m[1]->speedup : NAN, 4, false),
           json_num(b[7], 32, m[2] && m[0] ? m[2]->speedup : NAN, 4, false),
           json_num(b[8], 32, perr[0], 3, true), json_num(b[9], 32, perr[1], 3, true),
           json_num(b[10], 32, perr[2], 3, true));
}

int bench_attention(int argc, char **argv) {
    /* --device cuda: the CUDA benchmark parses the command line itself */
    static const char *const devices[] = {"cpu", "cuda"};
    for (int i = 2; i < argc; i++)
        if (!strcmp(argv[i], "--device")) {
            int d = 0;
            if (!cli_opt_choice(TOOL, argc, argv, &i, devices, 2, &d, stderr)) return CLI_USAGE;
            if (d == 1) return bench_attention_cuda(argc, argv);
        }
    options o;
    int prc = parse_options(argc, argv, &o);
    if (prc != 0) return prc == 1 ? 0 : prc;
    bench_roofs roofs;
    if (bench_measure_roofs(o.threads, 0, 5, &roofs) != 0) {
        fprintf(stderr, "%s: roof probes failed\n", TOOL);
        return 1;
    }
    kvp_ctx_params_t cp;
    kvp_ctx_params_init(&cp);
    cp.threads = o.threads;
    cp.isa = o.isa;
    kvp_ctx_t *ctx = NULL;
    char err[KVP_ERR_SIZE];
    if (kvp_ctx_create(&cp, &ctx, err, sizeof err) != KVP_OK) {
        fprintf(stderr, "%s: %s\n", TOOL, err);
        return 1;
    }
    kvd_rng rng, prng;
    kvd_seed(&rng, 20261129);
    kvd_seed(&prng, 20261130); /* the prefill accuracy's inputs: the decode cases' draws stay as they were */
    int decode = !o.prefill_only, prefill = !o.decode_only;
    if (decode)
        printf("attention decode: llama-3.1-8b shapes (%d q heads, %d kv heads, head_dim %d), "
               "q_len 1, %d threads, kernels %s%s\n", Q_HEADS, KV_HEADS, HEAD_DIM, o.threads,
               ctx_isa_name(ctx), o.quick ? ", --quick" : "");
    else
        printf("attention prefill: llama-3.1-8b shapes (%d q heads, %d kv heads, head_dim %d), "
               "causal chunks, %d threads, kernels %s%s\n", Q_HEADS, KV_HEADS, HEAD_DIM, o.threads,
               ctx_isa_name(ctx), o.quick ? ", --quick" : "");
    printf("roofs (same run): streaming read %.1f GB/s, fp32 FMA %.1f G/s (%s), int8 MAC %.1f G/s "
           "(%s)\n", roofs.read_gbps, roofs.fma_per_s / 1e9, roofs.isa, roofs.int8_macs_per_s / 1e9,
           roofs.int8_insn != NULL ? roofs.int8_insn : "none here");

    /* accuracy: decode unless --prefill, prefill unless --decode (NaN: not measured) */
    double acc[3], acc16[3], perr[3];
    for (int f = 0; f < 3; f++) acc[f] = acc16[f] = perr[f] = NAN;
    if (!o.no_accuracy && decode)
        for (int f = 0; f < 3; f++) {
            acc[f] = accuracy(ctx, &formats[f], 32, &rng, o.acc_seqs);
            acc16[f] = accuracy(ctx, &formats[f], 16, &rng, o.acc_seqs);
        }
    if (!o.no_accuracy && prefill) prefill_accuracy(ctx, &prng, perr);
    if (o.no_accuracy) printf("accuracy: not measured (--no-accuracy)\n\n");
    else {
        if (decode)
            printf("accuracy vs float64 reference (rel. L2 of the output; %d sequences of %d tokens, "
                   "keys with outlier channels):\n", o.acc_seqs, ACC_TOKENS);
        else
            printf("accuracy vs float64 reference (rel. L2 of the output; one sequence of %d tokens, "
                   "keys with outlier channels):\n", ACC_TOKENS);
        if (decode)
            printf("  page 32: fp16 %.2e  int8 %.2e  int4 %.2e\n"
                   "  page 16: fp16 %.2e  int8 %.2e  int4 %.2e\n", acc[0], acc[1], acc[2], acc16[0],
                   acc16[1], acc16[2]);
        if (prefill)
            printf("  prefill, page %d, a causal %d-token chunk at the end of one sequence: fp16 %.2e  "
                   "int8 %.2e  int4 %.2e\n", PREFILL_ACC_PAGE, PREFILL_ACC_CHUNK, perr[0], perr[1],
                   perr[2]);
        printf("\n");
    }
    /* errors not measured are JSON nulls */
    char errs[9][16];
    const double *ev[9] = {&acc[0], &acc[1], &acc[2], &acc16[0], &acc16[1], &acc16[2],
                           &perr[0], &perr[1], &perr[2]};
    for (int k = 0; k < 9; k++) json_num(errs[k], sizeof errs[k], *ev[k], 3, true);
    if (o.accuracy_only) {
        printf("{\"bench\": \"attention-accuracy\", \"acc_seqs\": %d, \"fp16_rel_err\": %s, "
               "\"int8_rel_err\": %s, \"int4_rel_err\": %s, \"fp16_rel_err_page16\": %s, "
               "\"int8_rel_err_page16\": %s, \"int4_rel_err_page16\": %s, \"prefill_fp16_rel_err\": %s, "
               "\"prefill_int8_rel_err\": %s, \"prefill_int4_rel_err\": %s}\n",
               o.acc_seqs, errs[0], errs[1], errs[2], errs[3], errs[4], errs[5], errs[6], errs[7],
               errs[8]);
        kvp_ctx_destroy(ctx);
        return 0;
    }

    double head[4] = {0.0, 0.0, 0.0, 0.0};
    if (decode && decode_table(&o, ctx, &rng, &roofs, head) != 0) {
        kvp_ctx_destroy(ctx);
        return 1;
    }
    prefill_result *pr = calloc(PREFILL_CASES_MAX, sizeof *pr);
    int npr = 0;
    if (pr == NULL) {
        fprintf(stderr, "%s: out of memory\n", TOOL);
        kvp_ctx_destroy(ctx);
        return 1;
    }
    if (decode && prefill) printf("\n");
    if (prefill && prefill_table(&o, ctx, &rng, &roofs, pr, &npr) != 0) {
        free(pr);
        kvp_ctx_destroy(ctx);
        return 1;
    }
    if (decode) {
        printf("{\"bench\": \"attention\", \"threads\": %d, \"isa\": \"%s\", \"quick\": %s, "
               "\"read_gbps\": %.3f, \"fma_per_s\": %.6g, \"int8_macs_per_s\": %.6g, \"fp16_bw_fraction\": %.4f, "
               "\"int8_speedup\": %.4f, \"int4_speedup\": %.4f, \"paged_vs_contiguous\": %.4f, "
               "\"fp16_rel_err\": %s, \"int8_rel_err\": %s, \"int4_rel_err\": %s, "
               "\"int8_rel_err_page16\": %s, \"int4_rel_err_page16\": %s, \"layers\": %d, ",
               o.threads, ctx_isa_name(ctx), o.quick ? "true" : "false", roofs.read_gbps,
               roofs.fma_per_s, roofs.int8_macs_per_s, head[0], head[1], head[2], head[3], errs[0],
               errs[1], errs[2], errs[4], errs[5], o.layers);
        print_prefill_keys(pr, npr, perr);
        printf("}\n");
    } else {
        printf("{\"bench\": \"attention-prefill\", \"threads\": %d, \"isa\": \"%s\", \"quick\": %s, "
               "\"fma_per_s\": %.6g, \"int8_macs_per_s\": %.6g, \"layers\": %d, ", o.threads,
               ctx_isa_name(ctx), o.quick ? "true" : "false", roofs.fma_per_s, roofs.int8_macs_per_s,
               o.layers);
        print_prefill_keys(pr, npr, perr);
        printf(", \"cases\": [");
        for (int i = 0; i < npr; i++) {
            const prefill_result *r = &pr[i];
            char chunk_s[16];
            if (r->mixed) snprintf(chunk_s, sizeof chunk_s, "\"mixed\"");
            else snprintf(chunk_s, sizeof chunk_s, "%d", r->chunk);
            printf("%s{\"format\": \"%s\", \"page\": %d, \"chunk\": %s, \"context\": %d, \"ms\": %.4f, "
                   "\"gfma\": %.3f, \"fma_fraction\": %.4f, \"speedup\": %.4f}", i > 0 ? ", " : "",
                   formats[r->fmt].name, r->page, chunk_s, r->context, r->t * 1e3,
                   r->fmas / r->t / 1e9, r->fma_fraction, r->speedup);
        }
        printf("]}\n");
    }
    free(pr);
    kvp_ctx_destroy(ctx);
    return 0;
}
