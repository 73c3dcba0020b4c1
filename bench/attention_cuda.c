/*
 * kvpage-bench attention --device cuda: paged decode attention on a CUDA
 * device, read against the device-to-device copy bandwidth measured in the
 * same run, and against the same kernels over a contiguous cache.
 *
 * Same cases and JSON keys as the CPU benchmark (bench/attention.c): q_len 1,
 * llama-3.1-8b shapes (32 q heads, 8 kv heads, head_dim 128, one layer),
 * batch 1 and 16, context 1k/8k/32k, page 16 and 32, K/V fp16, int8, int4
 * (and fp16 with dim-major keys, the CPU's preferred order); here also
 * batch 64, whose figures get JSON keys of their own (the headline keys stay
 * over batch 1 and 16). Pages are handed to sequences in a shuffled order.
 * Times are medians of the kernels alone (kvp_cuda_ctx_set_timing(): CUDA
 * events right before a call's first kernel and after its last, so the
 * host's share of a call, the schedule and its upload, is not counted), each
 * rep after the device's L2 cache was flushed (a write of twice its size,
 * outside the timed interval: batch 1 at 8k, 32 MiB of fp16 K/V, would
 * otherwise be read from an H200's 50 MB L2). Every paged case is also timed
 * with the single-buffer loader (kvp_cuda_ctx_set_pipeline(ctx, 0)): the
 * `vs single` column and the `*_pipeline_speedup` keys (medians over the
 * cases of that time over the pipelined one). The bandwidth probe
 * (`read_gbps`) is a device-to-device copy of 1 GiB (bytes read plus bytes
 * written over the time). The last line is JSON.
 *
 * Without a usable device (or in a CPU-only build) it says why on stderr
 * and exits with status 1.
 */
#define _POSIX_C_SOURCE 200809L
#include "attn_cases.h"
#include "bench.h"
#include "cli.h"
#include "cuda_bench.h"
#include "contig.h"
#include "kvdist.h"
#include "kvpage_cuda.h"
#include "kvpage_ext.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOOL "kvpage-bench attention --device cuda"
#define ACC_SEQS 4
#define PROBE_BYTES (1ull << 30)

typedef struct {
    const char *name;
    int32_t format, k_order;
} cuda_format;

static const cuda_format formats[] = {
    {"fp16", KVP_FORMAT_FP16, KVP_K_ORDER_TOKEN_MAJOR},
    {"int8", KVP_FORMAT_INT8, KVP_K_ORDER_TOKEN_MAJOR},
    {"int4", KVP_FORMAT_INT4, KVP_K_ORDER_TOKEN_MAJOR},
    {"fp16-dm", KVP_FORMAT_FP16, KVP_K_ORDER_DIM_MAJOR},
};
#define NFORMATS ((int)(sizeof formats / sizeof *formats))

typedef kvb_result result;

typedef struct {
    int quick, reps, device;
    kvb_only only; /* -1: all */
    void *flush;   /* the L2 flush buffer (bench_cuda_flush_alloc) */
    uint64_t flush_bytes;
} options;

/* The batches measured: the CPU benchmark's two, and a large one. */
static const int batches[] = {KVB_BATCH_SMALL, KVB_BATCH_LARGE, 64};
#define NBATCHES ((int)(sizeof batches / sizeof *batches))

static char g_err[KVP_ERR_SIZE];

static int fail(const char *what) {
    fprintf(stderr, "%s: %s: %s\n", TOOL, what, g_err);
    return -1;
}

/* ---- a store on the device, filled through the real append path ------------------------- */

static kvp_store_t *make_store(const cuda_format *f, int32_t P, int64_t pages, int32_t staging,
                               int device) {
    kvp_store_params_t sp;
    kvp_store_params_init(&sp);
    sp.layers = 1;
    sp.kv_heads = KV_HEADS;
    sp.head_dim = HEAD_DIM;
    sp.page_size = P;
    sp.k_format = f->format;
    sp.v_format = f->format;
    sp.k_order = f->k_order;
    sp.num_pages = (uint64_t)pages;
    sp.num_staging = (uint64_t)staging;
    kvp_cuda_params_t cp;
    kvp_cuda_params_init(&cp);
    cp.device = device;
    kvp_store_t *s = NULL;
    if (kvp_cuda_store_create(&sp, &cp, &s, g_err, sizeof g_err) != KVP_OK) {
        fail("store");
        return NULL;
    }
    return s;
}

/* Append `tokens` rows (host fp32) of sequence `seq` of table `t`, in steps
 * of 256: the table chooses the slots and the seal operations, the store
 * writes the rows. */
static int append_sequence(kvp_store_t *s, kvp_table_t *t, int32_t seq, const float *k,
                           const float *v, int32_t tokens, int device) {
    enum { STEP = 256 };
    int64_t slots[STEP];
    kvp_page_op_t ops[STEP];
    size_t row = (size_t)KV_HEADS * HEAD_DIM, bytes = (size_t)STEP * row * sizeof(float);
    void *dk = NULL, *dv = NULL;
    int rc = -1;
    if (bench_cuda_malloc(device, bytes, &dk, g_err, sizeof g_err) != KVP_OK ||
        bench_cuda_malloc(device, bytes, &dv, g_err, sizeof g_err) != KVP_OK) {
        fail("device rows");
        goto out;
    }
    for (int32_t t0 = 0; t0 < tokens; t0 += STEP) {
        int32_t n = tokens - t0 < STEP ? tokens - t0 : STEP, nops = 0;
        if (kvp_table_append(t, seq, n, NULL, slots, ops, STEP, &nops) != KVP_OK) {
            snprintf(g_err, sizeof g_err, "%s", kvp_table_last_error(t));
            fail("append (page table)");
            goto out;
        }
        if (bench_cuda_memcpy(dk, k + (size_t)t0 * row, (size_t)n * row * 4, 0, g_err, sizeof g_err) ||
            bench_cuda_memcpy(dv, v + (size_t)t0 * row, (size_t)n * row * 4, 0, g_err, sizeof g_err)) {
            fail("upload");
            goto out;
        }
        kvp_append_params_t a;
        kvp_append_params_init(&a);
        a.rows = n;
        a.dtype = KVP_FORMAT_FP32;
        a.k = dk;
        a.v = dv;
        a.slots = slots;
        a.ops = ops;
        a.num_ops = nops;
        if (kvp_store_append(s, &a) != KVP_OK || kvp_store_synchronize(s) != KVP_OK) {
            snprintf(g_err, sizeof g_err, "%s", kvp_store_last_error(s));
            fail("append");
            goto out;
        }
    }
    rc = 0;
out:
    bench_cuda_free(device, dk);
    bench_cuda_free(device, dv);
    return rc;
}

/* Copy bytes [0, have) of a device buffer over [have, total), doubling. */
static int replicate(uint8_t *base, uint64_t have, uint64_t total) {
    while (have < total) {
        uint64_t n = have < total - have ? have : total - have;
        if (bench_cuda_memcpy(base + have, base, n, 2, g_err, sizeof g_err) != KVP_OK)
            return fail("replicate");
        have += n;
    }
    return 0;
}

/* Copy page `from`'s block of a region over every page of [0, pages) that is
 * not a template page, one page at a time (when the template is not the
 * region's first pages, which replicate() needs). */
static int copy_pages(uint8_t *base, uint64_t stride, const unsigned char *is_template,
                      const int32_t *tmpl, int32_t tpages, int64_t pages) {
    for (int64_t p = 0, j = 0; p < pages; p++) {
        if (is_template[p]) continue;
        int32_t from = tmpl[j++ % tpages];
        if (bench_cuda_memcpy(base + (uint64_t)p * stride, base + (uint64_t)from * stride, stride, 2,
                              g_err, sizeof g_err) != KVP_OK)
            return fail("copy pages");
    }
    return 0;
}

/* TEMPLATE_PAGES pages of random K/V appended as one sequence of a page
 * table on the store's pages, then copies of them over the rest of the
 * pool (timing does not depend on the values). */
static int fill_pages(kvp_store_t *s, int32_t P, int64_t pages, kvd_rng *rng, int device) {
    kvp_layout_t lay;
    memset(&lay, 0, sizeof lay);
    lay.struct_size = sizeof lay;
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
    if (k != NULL && v != NULL && is_template != NULL &&
        kvb_pool_table(TOOL, P, pages, lay.needs_staging ? 1 : 0, 1, &pool, &t) == 0) {
        kvd_fill_keys(&keys, rng, (size_t)tokens, k);
        kvd_fill_normal(rng, n, v);
        if (kvp_table_seq_create(t, 0, 0, &seq) == KVP_OK)
            rc = append_sequence(s, t, seq, k, v, tokens, device);
    }
    if (rc == 0) { /* the template's pages (whole pages: no staging page in the export) */
        kvp_batch_buffers_t buf;
        memset(&buf, 0, sizeof buf);
        buf.struct_size = sizeof buf;
        buf.indptr = indptr;
        buf.indices = tmpl;
        buf.last_page_len = last;
        buf.indices_capacity = TEMPLATE_PAGES + 1;
        if (kvp_table_export(t, &seq, 1, NULL, &buf, NULL) != KVP_OK || indptr[1] != tpages) {
            snprintf(g_err, sizeof g_err, "%s", kvp_table_last_error(t));
            rc = fail("export");
        }
    }
    if (rc == 0) {
        bool first = true; /* the template is pages 0 .. tpages-1: copies by doubling */
        for (int32_t i = 0; i < tpages; i++) {
            is_template[tmpl[i]] = 1;
            first &= tmpl[i] < tpages;
        }
        kvp_region_t rk, rv;
        memset(&rk, 0, sizeof rk);
        memset(&rv, 0, sizeof rv);
        rk.struct_size = rv.struct_size = sizeof rk;
        kvp_store_region(s, 0, KVP_REGION_K, &rk);
        kvp_store_region(s, 0, KVP_REGION_V, &rv);
        if (first) {
            rc = replicate(rk.base, (uint64_t)tpages * rk.page_stride, (uint64_t)pages * rk.page_stride);
            if (rc == 0)
                rc = replicate(rv.base, (uint64_t)tpages * rv.page_stride, (uint64_t)pages * rv.page_stride);
        } else {
            rc = copy_pages(rk.base, rk.page_stride, is_template, tmpl, tpages, pages);
            if (rc == 0) rc = copy_pages(rv.base, rv.page_stride, is_template, tmpl, tpages, pages);
        }
    }
    kvp_table_destroy(t);
    kvp_pool_destroy(pool);
    free(k);
    free(v);
    free(is_template);
    kvd_keys_free(&keys);
    return rc;
}

/* ---- timing --------------------------------------------------------------------------------- */

typedef struct {
    kvp_ctx_t *ctx;
    kvp_store_t *store;
    kvp_kv_view_t view;
    kvp_attention_params_t ap;
    kvp_store_t contig_store; /* a view of `store` over the contiguous cache */
    kvp_kv_view_t contig_view;
} attn_call;

static int run_paged(void *arg) {
    attn_call *c = arg;
    return kvp_attention(c->ctx, c->store, &c->view, &c->ap);
}

static int run_contig(void *arg) {
    attn_call *c = arg;
    return kvp_attention(c->ctx, &c->contig_store, &c->contig_view, &c->ap);
}

static int run_case(const options *o, kvp_ctx_t *ctx, result *r, kvd_rng *rng) {
    const cuda_format *f = &formats[r->fmt];
    int32_t P = r->page, B = r->batch, per = (r->context + P - 1) / P;
    int64_t pages = (int64_t)B * per;
    int rc = -1;
    kvp_store_t *s = make_store(f, P, pages, B, o->device);
    int32_t *ids = malloc((size_t)pages * sizeof *ids), *indptr = malloc((size_t)(B + 1) * 4);
    int32_t *last = malloc((size_t)B * 4), *qo = malloc((size_t)(B + 1) * 4);
    int32_t *cids = malloc((size_t)pages * sizeof *cids), *cindptr = malloc((size_t)(B + 1) * 4);
    int32_t *clast = malloc((size_t)B * 4);
    size_t qn = (size_t)B * Q_HEADS * HEAD_DIM;
    float *qh = malloc(qn * sizeof *qh);
    void *q = NULL, *out = NULL, *cbase = NULL;
    kvp_layout_t lay;
    memset(&lay, 0, sizeof lay);
    lay.struct_size = sizeof lay;
    if (s == NULL || !ids || !indptr || !last || !qo || !qh || !cids || !cindptr || !clast) goto out;
    if (fill_pages(s, P, pages, rng, o->device) != 0) goto out;
    kvp_store_layout(s, &lay);
    uint64_t kb = lay.k_block_bytes, vb = lay.v_block_bytes;
    uint64_t run_k = (uint64_t)per * kb, run_v = (uint64_t)per * vb;
    if (bench_cuda_malloc(o->device, qn * 4, &q, g_err, sizeof g_err) ||
        bench_cuda_malloc(o->device, qn * 4, &out, g_err, sizeof g_err) ||
        bench_cuda_malloc(o->device, bench_contig_copy_bytes(s, B, per), &cbase, g_err,
                          sizeof g_err)) {
        fail("device buffers");
        goto out;
    }
    /* the batch's pages: from a page table, in the shuffled order of a pool
     * that has been running for a while */
    attn_call c;
    memset(&c, 0, sizeof c);
    if (kvb_shuffled_batch(TOOL, B, P, r->context, pages, lay.needs_staging ? B : 0, rng, indptr, ids,
                           last, &c.view) != 0)
        goto out;
    for (int32_t b = 0; b <= B; b++) qo[b] = b;
    kvd_fill_normal(rng, qn, qh);
    if (bench_cuda_memcpy(q, qh, qn * 4, 0, g_err, sizeof g_err) != KVP_OK) {
        fail("upload q");
        goto out;
    }
    /* the contiguous cache: sequence 0, head 0's pages end to end, then that
     * run copied to every (sequence, head); K blocks, then V blocks */
    uint8_t *ck = cbase, *cv = (uint8_t *)cbase + (uint64_t)B * KV_HEADS * run_k;
    {
        kvp_region_t rk, rv;
        memset(&rk, 0, sizeof rk);
        memset(&rv, 0, sizeof rv);
        rk.struct_size = rv.struct_size = sizeof rk;
        kvp_store_region(s, 0, KVP_REGION_K, &rk);
        kvp_store_region(s, 0, KVP_REGION_V, &rv);
        for (int32_t j = 0; j < per; j++) {
            int32_t id = ids[indptr[0] + j];
            if (bench_cuda_memcpy((uint8_t *)ck + (uint64_t)j * kb,
                                 (uint8_t *)rk.base + (uint64_t)id * rk.page_stride, kb, 2, g_err,
                                 sizeof g_err) ||
                bench_cuda_memcpy((uint8_t *)cv + (uint64_t)j * vb,
                                 (uint8_t *)rv.base + (uint64_t)id * rv.page_stride, vb, 2, g_err,
                                 sizeof g_err)) {
                fail("contiguous cache");
                goto out;
            }
        }
        if (replicate(ck, run_k, (uint64_t)B * KV_HEADS * run_k) != 0 ||
            replicate(cv, run_v, (uint64_t)B * KV_HEADS * run_v) != 0)
            goto out;
    }
    c.ctx = ctx;
    c.store = s;
    kvb_decode_call(&c.ap, qo, Q_HEADS, HEAD_DIM, q, out);
    bench_contig contig = {cbase, (uint64_t)B * KV_HEADS * run_k, (uint64_t)B * KV_HEADS * run_v,
                           B, per};
    c.contig_view.struct_size = sizeof c.contig_view;
    bench_contig_view(s, &contig, &c.contig_store, &c.contig_view, cindptr, cids, clast);
    r->bytes = (double)pages * (double)KV_HEADS * (double)(kb + vb);
    if (bench_cuda_time_kernels(ctx, NULL, run_paged, &c, o->reps, o->flush, o->flush_bytes,
                                &r->t_paged, g_err, sizeof g_err) != KVP_OK) {
        fail("paged attention");
        goto out;
    }
    /* the same call with the single-buffer loader (kvp_cuda_ctx_set_pipeline) */
    if (kvp_cuda_ctx_set_pipeline(ctx, 0) != KVP_OK) {
        snprintf(g_err, sizeof g_err, "%s", kvp_ctx_last_error(ctx));
        fail("kvp_cuda_ctx_set_pipeline");
        goto out;
    }
    int trc = bench_cuda_time_kernels(ctx, NULL, run_paged, &c, o->reps, o->flush, o->flush_bytes,
                                      &r->t_single, g_err, sizeof g_err);
    (void)kvp_cuda_ctx_set_pipeline(ctx, 1);
    if (trc != KVP_OK) {
        fail("paged attention, single-buffer loader");
        goto out;
    }
    if (bench_cuda_time_kernels(ctx, NULL, run_contig, &c, o->reps, o->flush, o->flush_bytes,
                                &r->t_contig, g_err, sizeof g_err) != KVP_OK) {
        fail("contiguous attention");
        goto out;
    }
    rc = 0;
out:
    free(ids);
    free(indptr);
    free(last);
    free(qo);
    free(cids);
    free(cindptr);
    free(clast);
    free(qh);
    bench_cuda_free(o->device, q);
    bench_cuda_free(o->device, out);
    bench_cuda_free(o->device, cbase);
    kvp_store_destroy(s);
    return rc;
}

/* ---- accuracy against the float64 reference (4 x 4096 tokens, fresh inputs) ------------------- */

static double accuracy(kvp_ctx_t *ctx, const cuda_format *f, int32_t P, kvd_rng *rng, int device) {
    const int32_t T = ACC_TOKENS, per = T / P + 1;
    kvp_store_t *s = make_store(f, P, (int64_t)per * ACC_SEQS, ACC_SEQS, device);
    size_t n = (size_t)T * KV_HEADS * HEAD_DIM, qn = (size_t)Q_HEADS * HEAD_DIM;
    float *k = malloc(n * 4), *v = malloc(n * 4), *q = malloc(qn * 4), *out = malloc(qn * 4);
    double *ref = malloc(qn * 8), num = 0.0, den = 0.0;
    void *dq = NULL, *dout = NULL;
    int ok = s != NULL && k && v && q && out && ref &&
             bench_cuda_malloc(device, qn * 4, &dq, g_err, sizeof g_err) == KVP_OK &&
             bench_cuda_malloc(device, qn * 4, &dout, g_err, sizeof g_err) == KVP_OK;
    kvp_layout_t lay;
    memset(&lay, 0, sizeof lay);
    lay.struct_size = sizeof lay;
    kvp_pool_t *pool = NULL;
    kvp_table_t *t = NULL;
    if (ok) {
        kvp_store_layout(s, &lay);
        ok = kvb_pool_table(TOOL, P, (int64_t)per * ACC_SEQS, lay.needs_staging ? ACC_SEQS : 0,
                            ACC_SEQS, &pool, &t) == 0;
    }
    for (int b = 0; b < ACC_SEQS && ok; b++) {
        kvd_keys keys;
        if (kvd_keys_init(&keys, rng, KV_HEADS, HEAD_DIM) != 0) {
            ok = 0;
            break;
        }
        kvd_fill_keys(&keys, rng, (size_t)T, k);
        kvd_fill_normal(rng, n, v);
        kvd_fill_normal(rng, qn, q);
        int32_t seq = -1;
        ok = kvp_table_seq_create(t, 0, 0, &seq) == KVP_OK &&
             append_sequence(s, t, seq, k, v, T, device) == 0 &&
             bench_cuda_memcpy(dq, q, qn * 4, 0, g_err, sizeof g_err) == KVP_OK;
        int32_t indptr[2], indices[ACC_TOKENS + 2], last[1], qo[2] = {0, 1};
        kvp_kv_view_t view;
        memset(&view, 0, sizeof view);
        view.struct_size = sizeof view;
        if (ok) {
            kvp_batch_buffers_t buf;
            memset(&buf, 0, sizeof buf);
            buf.struct_size = sizeof buf;
            buf.indptr = indptr;
            buf.indices = indices;
            buf.last_page_len = last;
            buf.indices_capacity = ACC_TOKENS + 2;
            ok = kvp_table_export(t, &seq, 1, NULL, &buf, &view) == KVP_OK;
            if (!ok) {
                snprintf(g_err, sizeof g_err, "%s", kvp_table_last_error(t));
                fail("export");
            }
        }
        if (ok) {
            kvp_attention_params_t ap;
            kvp_attention_params_init(&ap);
            ap.q_heads = Q_HEADS;
            ap.sm_scale = (float)kvd_sm_scale(&keys);
            ap.qo_indptr = qo;
            ap.q = dq;
            ap.out = dout;
            ok = kvp_attention(ctx, s, &view, &ap) == KVP_OK &&
                 bench_cuda_memcpy(out, dout, qn * 4, 1, g_err, sizeof g_err) == KVP_OK;
            kvd_attn ra = {Q_HEADS, KV_HEADS, HEAD_DIM, ap.sm_scale, 0.0, 1, -1};
            ok = ok && kvd_reference(&ra, q, 1, k, v, T, ref) == 0;
            if (ok) {
                for (size_t i = 0; i < qn; i++) {
                    num += ((double)out[i] - ref[i]) * ((double)out[i] - ref[i]);
                    den += ref[i] * ref[i];
                }
            }
        }
        kvd_keys_free(&keys);
    }
    kvp_table_destroy(t);
    kvp_pool_destroy(pool);
    bench_cuda_free(device, dq);
    bench_cuda_free(device, dout);
    kvp_store_destroy(s);
    free(k);
    free(v);
    free(q);
    free(out);
    free(ref);
    return ok && den > 0.0 ? sqrt(num / den) : -1.0;
}

/* ---- report --------------------------------------------------------------------------------- */

static void usage(FILE *f) {
    fprintf(f, "usage: kvpage-bench attention --device cuda [--quick] [--gpu N (0; 0..1023)]\n"
               "       [--format fp16|int8|int4|fp16-dm] [--page N] [--batch 1|16|64] "
               "[--context N (a multiple of the page size; k = x1024)]   (run only matching cases)\n"
               "times: kernels only (events around each call's kernels), L2 flushed before each "
               "rep\n");
}

/* Returns 0 to run, 1 after --help, CLI_USAGE after a message. */
static int parse_options(int argc, char **argv, options *o) {
    memset(o, 0, sizeof *o);
    o->reps = 20;
    o->only.fmt = o->only.page = o->only.batch = o->only.context = -1;
    const char *fmt_names[NFORMATS];
    for (int k = 0; k < NFORMATS; k++) fmt_names[k] = formats[k].name;
    static const char *const devices[] = {"cuda"}; /* cpu: bench_attention */
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        bool ok = true;
        int taken, unused;
        if (!strcmp(a, "--quick")) o->quick = 1;
        else if (!strcmp(a, "--device")) ok = cli_opt_choice(TOOL, argc, argv, &i, devices, 1, &unused, stderr);
        else if (!strcmp(a, "--gpu")) ok = cli_opt_int(TOOL, argc, argv, &i, 0, 1023, &o->device, stderr);
        else if (!strcmp(a, "--batch")) { /* this benchmark's batches: 64 too */
            ok = cli_opt_int(TOOL, argc, argv, &i, 1, batches[NBATCHES - 1], &o->only.batch, stderr);
            bool known = false;
            for (int b = 0; b < NBATCHES; b++) known |= batches[b] == o->only.batch;
            if (ok && !known) {
                fprintf(stderr, "%s: --batch must be %d, %d or %d (the batches measured), got %s\n",
                        TOOL, batches[0], batches[1], batches[2], argv[i]);
                ok = false;
            }
        }
        else if ((taken = kvb_parse_only(TOOL, argc, argv, &i, fmt_names, NFORMATS, &o->only)) != 0)
            ok = taken > 0;
        else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 1;
        } else {
            return cli_reject_option(TOOL, a, usage);
        }
        if (!ok) return CLI_USAGE;
    }
    if (kvb_check_context(TOOL, &o->only) != 0) return CLI_USAGE;
    if (o->quick) o->reps = 10;
    return 0;
}

int bench_attention_cuda(int argc, char **argv) {
    options o;
    int prc = parse_options(argc, argv, &o);
    if (prc != 0) return prc == 1 ? 0 : prc;
    kvp_cuda_device_info_t info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    int rc = kvp_cuda_device_query(o.device, &info, g_err, sizeof g_err);
    if (rc != KVP_OK) {
        fprintf(stderr, "%s: %s: %s\n", TOOL, kvp_status_name(rc), g_err);
        return 1;
    }
    double copy_gbps = 0.0;
    if (bench_cuda_copy_bandwidth(o.device, PROBE_BYTES, 10, &copy_gbps, g_err, sizeof g_err) != KVP_OK) {
        fail("copy bandwidth probe");
        return 1;
    }
    kvp_ctx_params_t xp;
    kvp_ctx_params_init(&xp);
    kvp_cuda_params_t cp;
    kvp_cuda_params_init(&cp);
    cp.device = o.device;
    kvp_ctx_t *ctx = NULL;
    if (kvp_cuda_ctx_create(&xp, &cp, &ctx, g_err, sizeof g_err) != KVP_OK) {
        fail("context");
        return 1;
    }
    if (bench_cuda_flush_alloc(o.device, &o.flush, &o.flush_bytes, g_err, sizeof g_err) != KVP_OK) {
        fail("L2 flush buffer");
        kvp_ctx_destroy(ctx);
        return 1;
    }
    kvd_rng rng;
    kvd_seed(&rng, 20261129);
    printf("attention decode on %s (cc %d.%d, %d SMs): llama-3.1-8b shapes (%d q heads, %d kv heads, "
           "head_dim %d), q_len 1%s\n", info.name, info.cc_major, info.cc_minor, info.sm_count, Q_HEADS,
           KV_HEADS, HEAD_DIM, o.quick ? ", --quick" : "");
    printf("roof (same run): device-to-device copy %.1f GB/s (read + write)\n", copy_gbps);
    printf("times: kernels only (events before a call's first kernel and after its last), median "
           "of %d reps, L2 flushed before each (%.0f MiB written)\n", o.reps,
           (double)o.flush_bytes / (1 << 20));

    double acc[3], acc16[3];
    for (int f = 0; f < 3; f++) {
        acc[f] = accuracy(ctx, &formats[f], 32, &rng, o.device);
        acc16[f] = accuracy(ctx, &formats[f], 16, &rng, o.device);
    }
    printf("accuracy vs float64 reference (rel. L2 of the output; %d sequences of %d tokens, keys "
           "with outlier channels):\n  page 32: fp16 %.2e  int8 %.2e  int4 %.2e\n"
           "  page 16: fp16 %.2e  int8 %.2e  int4 %.2e\n\n", ACC_SEQS, ACC_TOKENS, acc[0], acc[1],
           acc[2], acc16[0], acc16[1], acc16[2]);

    static const int pages_full[] = {16, 32}, pages_quick[] = {32};
    static const int ctx_full[] = {1024, 8192, 32768}, ctx_quick[] = {8192, 32768};
    const int *pg = o.quick ? pages_quick : pages_full;
    int npg = o.quick ? 1 : 2;
    const int *cx = o.quick ? ctx_quick : ctx_full;
    int ncx = o.quick ? 2 : 3;
    int one_ctx[1] = {o.only.context}, one_page[1] = {o.only.page};
    if (o.only.context > 0) {
        cx = one_ctx;
        ncx = 1;
    }
    if (o.only.page > 0) {
        pg = one_page;
        npg = 1;
    }
    int nfmt = o.quick && o.only.fmt != 3 ? 3 : NFORMATS, max_ctx = cx[ncx - 1];
    result rs[128];
    int n = 0;
    printf("%-9s %4s %5s %7s %10s %9s %7s %8s %10s %9s\n", "format", "page", "batch", "context",
           "time ms", "KV GB/s", "of copy", "vs fp16", "paged/contig", "vs single");
    for (int ip = 0; ip < npg; ip++)
        for (int ib = 0; ib < NBATCHES; ib++)
            for (int ic = 0; ic < ncx; ic++)
                for (int f = 0; f < nfmt; f++) {
                    if ((o.only.fmt >= 0 && f != o.only.fmt && f != 0) ||
                        (o.only.batch >= 0 && batches[ib] != o.only.batch) || n >= 128)
                        continue;
                    result *r = &rs[n];
                    memset(r, 0, sizeof *r);
                    r->fmt = f;
                    r->page = pg[ip];
                    r->batch = batches[ib];
                    r->context = cx[ic];
                    if (run_case(&o, ctx, r, &rng) != 0) {
                        bench_cuda_free(o.device, o.flush);
                        kvp_ctx_destroy(ctx);
                        return 1;
                    }
                    const result *base = kvb_find(rs, n + 1, 0, r->page, r->batch, r->context);
                    double gbps = r->bytes / r->t_paged / 1e9;
                    printf("%-9s %4d %5d %7d %10.4f %9.1f %7.2f %8.2f %10.2f %9.2f\n", formats[f].name,
                           r->page, r->batch, r->context, r->t_paged * 1e3, gbps, gbps / copy_gbps,
                           base->t_paged / r->t_paged, r->t_contig / r->t_paged,
                           r->t_single / r->t_paged);
                    fflush(stdout);
                    n++;
                }
    /* the headline over batch 1 and 16, as the CPU benchmark's; batch 64 apart */
    result small[128], large[128];
    int ns = 0, nl = 0;
    for (int i = 0; i < n; i++) {
        if (rs[i].batch == batches[NBATCHES - 1]) large[nl++] = rs[i];
        else small[ns++] = rs[i];
    }
    double bw = kvb_headline(small, ns, 0, KVB_BW_FRACTION, copy_gbps, max_ctx);
    double s8 = kvb_headline(small, ns, 1, KVB_SPEEDUP, copy_gbps, max_ctx);
    double s4 = kvb_headline(small, ns, 2, KVB_SPEEDUP, copy_gbps, max_ctx);
    double pc = kvb_headline(small, ns, 0, KVB_PAGED_VS_CONTIG, copy_gbps, max_ctx);
    double bw64 = kvb_headline(large, nl, 0, KVB_BW_FRACTION, copy_gbps, max_ctx);
    double s8_64 = kvb_headline(large, nl, 1, KVB_SPEEDUP, copy_gbps, max_ctx);
    double s4_64 = kvb_headline(large, nl, 2, KVB_SPEEDUP, copy_gbps, max_ctx);
    /* the copy pipeline against the single-buffer loader, per format, over every case */
    double pipe_gain[3] = {0.0, 0.0, 0.0};
    for (int f = 0; f < 3; f++) {
        double v[128];
        int k = 0;
        for (int i = 0; i < n; i++)
            if (rs[i].fmt == f && rs[i].t_single > 0.0) v[k++] = rs[i].t_single / rs[i].t_paged;
        pipe_gain[f] = k > 0 ? bench_median(v, k) : 0.0;
    }
    printf("\nheadline (page 32, median over batch 1 and 16 at contexts >= 8k; paged/contig at %dk):\n"
           "  fp16 %.2f of copy bandwidth, int8 %.2fx and int4 %.2fx faster than fp16, "
           "paged/contiguous %.3f\n", max_ctx / 1024, bw, s8, s4, pc);
    printf("batch 64 (page 32, contexts >= 8k): fp16 %.2f of copy bandwidth, int8 %.2fx and int4 "
           "%.2fx faster than fp16\n", bw64, s8_64, s4_64);
    printf("copy pipeline vs single-buffer loader (median over the cases): fp16 %.2fx, int8 %.2fx, "
           "int4 %.2fx\n", pipe_gain[0], pipe_gain[1], pipe_gain[2]);
    printf("{\"bench\": \"attention\", \"device\": \"cuda\", \"gpu\": \"%s\", \"threads\": 0, "
           "\"isa\": \"cuda\", \"quick\": %s, \"read_gbps\": %.3f, \"fma_per_s\": null, "
           "\"fp16_bw_fraction\": %.4f, \"int8_speedup\": %.4f, \"int4_speedup\": %.4f, "
           "\"paged_vs_contiguous\": %.4f, \"fp16_rel_err\": %.3e, \"int8_rel_err\": %.3e, "
           "\"int4_rel_err\": %.3e, \"int8_rel_err_page16\": %.3e, \"int4_rel_err_page16\": %.3e, "
           "\"timing\": \"kernels\", \"l2_flush_bytes\": %llu, \"fp16_bw_fraction_batch64\": %.4f, "
           "\"int8_speedup_batch64\": %.4f, \"int4_speedup_batch64\": %.4f, "
           "\"fp16_pipeline_speedup\": %.4f, \"int8_pipeline_speedup\": %.4f, "
           "\"int4_pipeline_speedup\": %.4f}\n",
           info.name, o.quick ? "true" : "false", copy_gbps, bw, s8, s4, pc, acc[0], acc[1], acc[2],
           acc16[1], acc16[2], (unsigned long long)o.flush_bytes, bw64, s8_64, s4_64, pipe_gain[0],
           pipe_gain[1], pipe_gain[2]);
    bench_cuda_free(o.device, o.flush);
    kvp_ctx_destroy(ctx);
    return 0;
}
