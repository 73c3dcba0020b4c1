/*
 * kvpage-bench append: writing new K/V rows into pages (kvp_store_append on
 * the CPU backend), per format, against the same rows written as fp32 (a
 * copy into the pages: the rest of each format's time is its conversion).
 *
 * Shapes of one llama-3.1-8b layer (8 kv heads, head_dim 128), page 32,
 * fp32 input rows of random keys (outlier channels) and values, in cache
 * (an engine appends a step's K/V right after computing them):
 *   prefill: one sequence of --tokens tokens, 256 rows per call, the pages
 *            sealed as they fill (what a prompt's prefill writes);
 *   decode:  64 sequences, one row each per call, for 4 pages' worth of
 *            calls (every page sealed once on the way).
 * Figures: ns per token (K and V, every head) and GB/s of fp32 input, each
 * the median of --reps repetitions; "vs fp32" is fp32's time over the
 * format's. The last line is JSON.
 */
#define _POSIX_C_SOURCE 200809L
#include "bench.h"
#include "cli.h"
#include "kvdist.h"
#include "kvpage_ext.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOOL "kvpage-bench append"
#define KV_HEADS 8
#define HEAD_DIM 128
#define PAGE 32
#define CHUNK 256      /* prefill rows per call */
#define BATCH 64       /* decode sequences */
#define DECODE_PAGES 4 /* decode calls: this many pages' worth */
#define MAX_REPS 64

typedef struct {
    const char *name;
    int32_t k_format, v_format, k_order;
} append_format;

static const append_format formats[] = {
    {"fp32", KVP_FORMAT_FP32, KVP_FORMAT_FP32, KVP_K_ORDER_DIM_MAJOR},
    {"fp16", KVP_FORMAT_FP16, KVP_FORMAT_FP16, KVP_K_ORDER_DIM_MAJOR},
    {"fp16-hnd", KVP_FORMAT_FP16, KVP_FORMAT_FP16, KVP_K_ORDER_TOKEN_MAJOR},
    {"bf16", KVP_FORMAT_BF16, KVP_FORMAT_BF16, KVP_K_ORDER_DIM_MAJOR},
    {"fp8", KVP_FORMAT_FP8_E4M3, KVP_FORMAT_FP8_E4M3, KVP_K_ORDER_DIM_MAJOR},
    {"int8", KVP_FORMAT_INT8, KVP_FORMAT_INT8, KVP_K_ORDER_DIM_MAJOR},
    {"int4", KVP_FORMAT_INT4, KVP_FORMAT_INT4, KVP_K_ORDER_DIM_MAJOR},
    {"k8v4", KVP_FORMAT_INT8, KVP_FORMAT_INT4, KVP_K_ORDER_DIM_MAJOR},
};
#define NFORMATS ((int)(sizeof formats / sizeof formats[0]))

static void usage(FILE *f) {
    fprintf(f,
            "usage: kvpage-bench append [--format F] [--tokens N] [--reps N] [--quick]\n"
            "  K/V rows written into pages per format (one layer: 8 kv heads, head_dim 128,\n"
            "  page 32), against fp32 (a copy): a prefill of N tokens (default 8192) in calls\n"
            "  of 256 rows, and decode calls of one row for each of 64 sequences.\n"
            "  --format: fp32 (always run: the baseline) and this one of fp16, fp16-hnd (keys\n"
            "  token-major), bf16, fp8, int8, int4, k8v4 (int8 keys, int4 values).\n"
            "  --quick: 2048 tokens, 5 repetitions (default 9).\n");
}

typedef struct {
    kvp_pool_t *pool;
    kvp_table_t *table;
    kvp_store_t *store;
} bench_kv;

static void kv_destroy(bench_kv *kv) {
    kvp_table_destroy(kv->table);
    kvp_pool_destroy(kv->pool);
    kvp_store_destroy(kv->store);
    memset(kv, 0, sizeof *kv);
}

/* A store of one layer with `pages` pool pages and `staging` staging pages
 * (when the format needs them), and a pool and table over the same pages. */
static int kv_create(const append_format *f, int32_t pages, int32_t staging, bench_kv *kv) {
    char err[KVP_ERR_SIZE];
    memset(kv, 0, sizeof *kv);
    kvp_store_params_t sp;
    kvp_store_params_init(&sp);
    sp.layers = 1;
    sp.kv_heads = KV_HEADS;
    sp.head_dim = HEAD_DIM;
    sp.page_size = PAGE;
    sp.k_format = f->k_format;
    sp.v_format = f->v_format;
    sp.k_order = f->k_order;
    sp.num_pages = (uint64_t)pages;
    sp.num_staging = (uint64_t)staging;
    if (kvp_store_create(&sp, &kv->store, err, sizeof err) != KVP_OK) goto fail;
    kvp_layout_t lay = {.struct_size = sizeof lay};
    kvp_store_layout(kv->store, &lay);
    kvp_pool_params_t pp;
    kvp_pool_params_init(&pp);
    pp.page_size = PAGE;
    pp.num_pages = pages;
    pp.num_staging = lay.needs_staging ? staging : 0;
    pp.prefix_cache = 0;
    if (kvp_pool_create(&pp, &kv->pool, err, sizeof err) != KVP_OK) goto fail;
    if (kvp_table_create(kv->pool, 0, &kv->table, err, sizeof err) != KVP_OK) goto fail;
    return 0;
fail:
    fprintf(stderr, "%s: %s: %s\n", TOOL, f->name, err);
    kv_destroy(kv);
    return -1;
}

/* One call: rows of k/v (dense [rows][heads][dim] fp32) to the given slots,
 * with the page operations the table returned (copies and unseals applied
 * first, as an engine does). */
static int kv_write(bench_kv *kv, int32_t rows, const float *k, const float *v,
                    const int64_t *slots, const kvp_page_op_t *ops, int32_t nops) {
    if (nops > 0 && kvp_store_apply_ops(kv->store, ops, nops) != KVP_OK) goto fail;
    kvp_append_params_t a;
    kvp_append_params_init(&a);
    a.rows = rows;
    a.dtype = KVP_FORMAT_FP32;
    a.k = k;
    a.v = v;
    a.slots = slots;
    a.ops = ops;
    a.num_ops = nops;
    if (kvp_store_append(kv->store, &a) != KVP_OK) goto fail;
    return 0;
fail:
    fprintf(stderr, "%s: append: %s\n", TOOL, kvp_store_last_error(kv->store));
    return -1;
}

static int table_fail(bench_kv *kv) {
    fprintf(stderr, "%s: table: %s\n", TOOL, kvp_table_last_error(kv->table));
    return -1;
}

/* Seconds for one prefill of `tokens` rows (a fresh sequence, released
 * after): every call writes the same CHUNK rows of k/v, as an engine
 * writes a chunk's K/V just after computing them (in cache). */
static double prefill_once(bench_kv *kv, int32_t tokens, const float *k, const float *v) {
    int64_t slots[CHUNK];
    kvp_page_op_t ops[CHUNK / PAGE + 2];
    int32_t seq = -1;
    if (kvp_table_seq_create(kv->table, 0, 0, &seq) != KVP_OK) return table_fail(kv);
    double t0 = bench_now();
    for (int32_t r = 0; r < tokens; r += CHUNK) {
        int32_t n = tokens - r < CHUNK ? tokens - r : CHUNK, nops = 0;
        if (kvp_table_append(kv->table, seq, n, NULL, slots, ops, CHUNK / PAGE + 2, &nops) != KVP_OK)
            return table_fail(kv);
        if (kv_write(kv, n, k, v, slots, ops, nops) != 0) return -1;
    }
    double dt = bench_now() - t0;
    if (kvp_table_seq_release(kv->table, seq) != KVP_OK) return table_fail(kv);
    return dt;
}

/* Seconds for `steps` decode calls of BATCH rows (fresh sequences, released
 * after), each the first BATCH rows of k/v. */
static double decode_once(bench_kv *kv, int32_t steps, const float *k, const float *v) {
    int64_t slots[BATCH];
    kvp_page_op_t ops[2 * BATCH];
    int32_t seqs[BATCH];
    for (int b = 0; b < BATCH; b++)
        if (kvp_table_seq_create(kv->table, 0, 0, &seqs[b]) != KVP_OK) return table_fail(kv);
    double t0 = bench_now();
    for (int32_t s = 0; s < steps; s++) {
        int32_t nops = 0;
        for (int b = 0; b < BATCH; b++) {
            int32_t n = 0;
            if (kvp_table_append(kv->table, seqs[b], 1, NULL, &slots[b], ops + nops, 2 * BATCH - nops,
                                 &n) != KVP_OK)
                return table_fail(kv);
            nops += n;
        }
        /* a seal names its rows by their index in this call */
        for (int32_t i = 0, b = 0; i < nops; i++) {
            if (ops[i].kind != KVP_OP_SEAL) continue;
            while (b < BATCH && slots[b] / PAGE != ops[i].dst) b++;
            ops[i].row = b < BATCH ? b : 0;
        }
        if (kv_write(kv, BATCH, k, v, slots, ops, nops) != 0) return -1;
    }
    double dt = bench_now() - t0;
    for (int b = 0; b < BATCH; b++)
        if (kvp_table_seq_release(kv->table, seqs[b]) != KVP_OK) return table_fail(kv);
    return dt;
}

typedef struct {
    double prefill_ns, decode_ns; /* per token, K and V of every head */
} append_result;

int bench_append(int argc, char **argv) {
    int tokens = 8192, reps = 9, quick = 0, only = -1;
    const char *fmt_names[NFORMATS];
    for (int f = 0; f < NFORMATS; f++) fmt_names[f] = formats[f].name;
    bool tokens_set = false, reps_set = false;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        bool ok = true;
        if (!strcmp(a, "--tokens")) {
            ok = cli_opt_int(TOOL, argc, argv, &i, PAGE, 1 << 20, &tokens, stderr);
            tokens_set = true;
        } else if (!strcmp(a, "--reps")) {
            ok = cli_opt_int(TOOL, argc, argv, &i, 1, MAX_REPS, &reps, stderr);
            reps_set = true;
        } else if (!strcmp(a, "--format")) {
            ok = cli_opt_choice(TOOL, argc, argv, &i, fmt_names, NFORMATS, &only, stderr);
        } else if (!strcmp(a, "--quick")) {
            quick = 1;
        } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else {
            return cli_reject_option(TOOL, a, usage);
        }
        if (!ok) return CLI_USAGE;
    }
    if (quick) {
        if (!tokens_set) tokens = 2048;
        if (!reps_set) reps = 5;
    }
    const int32_t steps = DECODE_PAGES * PAGE;
    const size_t row = (size_t)KV_HEADS * HEAD_DIM;
    const size_t nrows = CHUNK > BATCH ? CHUNK : BATCH;
    float *k = malloc(nrows * row * sizeof *k), *v = malloc(nrows * row * sizeof *v);
    kvd_rng rng;
    kvd_keys keys = {0, 0, NULL, NULL};
    kvd_seed(&rng, 20261203);
    append_result res[NFORMATS];
    int rc = 1;
    if (k == NULL || v == NULL || kvd_keys_init(&keys, &rng, KV_HEADS, HEAD_DIM) != 0) {
        fprintf(stderr, "%s: out of memory\n", TOOL);
        goto out;
    }
    kvd_fill_keys(&keys, &rng, nrows, k);
    kvd_fill_normal(&rng, nrows * row, v);

    printf("kvpage-bench append: one layer, %d kv heads x head_dim %d, page %d, fp32 rows in;\n"
           "prefill: %d tokens in calls of %d rows; decode: %d calls of one row for each of %d sequences\n"
           "(ns per token: K and V of every head; median of %d)\n\n",
           KV_HEADS, HEAD_DIM, PAGE, tokens, CHUNK, steps, BATCH, reps);
    printf("%-9s %12s %9s %8s   %12s %9s %8s\n", "format", "prefill ns", "GB/s in", "vs fp32",
           "decode ns", "GB/s in", "vs fp32");
    const double in_bytes = 2.0 * (double)row * sizeof(float); /* per token */
    for (int f = 0; f < NFORMATS; f++) {
        res[f].prefill_ns = res[f].decode_ns = -1.0;
        if (only >= 0 && f != only && f != 0) continue; /* fp32: the baseline */
        bench_kv kv;
        int32_t pages = (tokens + PAGE - 1) / PAGE + BATCH * (DECODE_PAGES + 1);
        if (kv_create(&formats[f], pages, BATCH, &kv) != 0) goto out;
        double tp[MAX_REPS], td[MAX_REPS];
        /* one untimed run of each warms the pages and the code */
        bool ok = prefill_once(&kv, tokens, k, v) >= 0 && decode_once(&kv, steps, k, v) >= 0;
        for (int r = 0; ok && r < reps; r++) {
            tp[r] = prefill_once(&kv, tokens, k, v);
            td[r] = decode_once(&kv, steps, k, v);
            ok = tp[r] >= 0 && td[r] >= 0;
        }
        kv_destroy(&kv);
        if (!ok) goto out;
        res[f].prefill_ns = bench_median(tp, reps) / tokens * 1e9;
        res[f].decode_ns = bench_median(td, reps) / ((double)steps * BATCH) * 1e9;
        printf("%-9s %12.1f %9.2f %8.2f   %12.1f %9.2f %8.2f\n", formats[f].name, res[f].prefill_ns,
               in_bytes / res[f].prefill_ns, res[0].prefill_ns / res[f].prefill_ns, res[f].decode_ns,
               in_bytes / res[f].decode_ns, res[0].decode_ns / res[f].decode_ns);
        fflush(stdout);
    }

    cli_json j;
    cli_json_begin(&j, stdout);
    cli_json_str(&j, "bench", "append");
    cli_json_i64(&j, "tokens", tokens);
    cli_json_i64(&j, "reps", reps);
    cli_json_i64(&j, "page_size", PAGE);
    cli_json_i64(&j, "kv_heads", KV_HEADS);
    cli_json_i64(&j, "head_dim", HEAD_DIM);
    cli_json_object(&j, "ns_per_token");
    for (int f = 0; f < NFORMATS; f++) {
        if (res[f].prefill_ns < 0) continue;
        cli_json_object(&j, formats[f].name);
        cli_json_num(&j, "prefill", res[f].prefill_ns);
        cli_json_num(&j, "decode", res[f].decode_ns);
        cli_json_close(&j);
    }
    cli_json_close(&j);
    cli_json_end(&j);
    rc = 0;
out:
    kvd_keys_free(&keys);
    free(k);
    free(v);
    return rc;
}
