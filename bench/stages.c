/*
 * kvpage-bench stages: the CPU attention kernels' stages one at a time, on
 * pages that stay in cache, one tile of 4 query rows (a GQA group), one
 * thread: where the time of a (page, kv head) step goes, without memory
 * stalls, threads or scheduling. The tool for tuning a kernel: run it
 * before and after a change, in the same quiet moment.
 *
 * Stages (lib/cpu/cpu.h): prep (the query folded with a page's key scales,
 * integer keys), keys (logits), softmax, values (o += p.v); "all" runs the
 * four in order as attention does; "pairs" runs them over two full pages as
 * one chunk, as attention does where the ISA has a two-block values stage
 * for the format (AVX2 and AVX-512 int8 and int4 at page 16 and 32), and
 * "quads" over four, where it has a four-block one (AVX-512 int4), per page.
 * Keys follow the benchmark distribution (bench/kvdist.h: outlier channels,
 * offsets), values and queries N(0,1).
 */
#include "bench.h"
#include "cli.h"
#include "cpu/cpu.h"
#include "kvdist.h"
#include "kvpage_ext.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PAGES 64 /* 64 pages of one head: ~0.3 MiB int4 .. 1 MiB fp16, in L2 */

typedef struct {
    const char *name;
    int32_t format;
} stage_format;

static const stage_format stage_formats[] = {
    {"fp16", KVP_FORMAT_FP16}, {"bf16", KVP_FORMAT_BF16}, {"int8", KVP_FORMAT_INT8}, {"int4", KVP_FORMAT_INT4},
    {"int4_v1", KVP_FORMAT_INT4_V1}};

typedef struct {
    kvp__tile tile;
    float o[KVP__TILE_ROWS][KVP__ATTN_MAX_D] KVP__ALIGN64;
} stage_state;

enum { S_PREP, S_KEYS, S_SOFTMAX, S_VALUES, S_ALL, S_PAIRS, S_QUADS, S_COUNT };
static const char *const stage_names[S_COUNT] = {"prep", "keys", "softmax", "values", "all", "pairs", "quads"};

typedef struct {
    kvp__kprep_fn prep;
    kvp__klogits_fn keys;
    kvp__softmax_fn softmax;
    kvp__vacc_fn values;
    kvp__vacc2_fn values2; /* NULL: no pairs */
    kvp__vacc4_fn values4; /* NULL: no quads */
    kvp__blockfmt kf, vf;
    const uint8_t *k, *v;
    size_t kstride, vstride;
    int P;
} stage_set_t;

/* One timed pass of `iters` steps of stage s; returns seconds. */
static double run_stage(const stage_set_t *ss, stage_state *st, int s, int iters) {
    kvp__tile *t = &st->tile;
    double t0 = bench_now();
    if (s == S_PAIRS || s == S_QUADS) { /* as lib/cpu/attn.c run_group: the last page's keys first */
        const int P = ss->P, nb = s == S_QUADS ? 4 : 2;
        for (int it = 0; it + nb - 1 < iters; it += nb) {
            int p = it % PAGES;
            const uint8_t *vb[4];
            const ptrdiff_t pf[4] = {0, 0, 0, 0};
            for (int k = nb - 1; k >= 0; k--) {
                const uint8_t *kb = ss->k + (size_t)(p + k) * ss->kstride;
                vb[k] = ss->v + (size_t)(p + k) * ss->vstride;
                if (ss->prep != NULL) ss->prep(t, kb, &ss->kf);
                ss->keys(t, kb, &ss->kf, 0, P);
                if (k > 0)
                    for (int r = 0; r < KVP__TILE_ROWS; r++) memcpy(&t->logits[r][k * P], &t->logits[r][0], (size_t)P * 4);
            }
            ss->softmax(t, nb * P, it * P);
            if (nb == 4) ss->values4(t, vb, pf, &ss->vf);
            else ss->values2(t, vb[0], vb[1], 0, &ss->vf);
        }
        return bench_now() - t0;
    }
    for (int it = 0; it < iters; it++) {
        int p = it % PAGES, n = ss->P < KVP__CHUNK ? ss->P : KVP__CHUNK;
        const uint8_t *kb = ss->k + (size_t)p * ss->kstride, *vb = ss->v + (size_t)p * ss->vstride;
        if ((s == S_PREP || s == S_ALL) && ss->prep != NULL) ss->prep(t, kb, &ss->kf);
        if (s == S_KEYS || s == S_ALL) ss->keys(t, kb, &ss->kf, 0, n);
        if (s == S_SOFTMAX || s == S_ALL) ss->softmax(t, n, it * n);
        if (s == S_VALUES || s == S_ALL) ss->values(t, vb, &ss->vf, 0, n);
    }
    return bench_now() - t0;
}

#define TOOL "kvpage-bench stages"

static void usage(FILE *f) {
    fprintf(f, "usage: kvpage-bench stages [--format fp16|bf16|int8|int4|int4_v1 (int4)] "
               "[--isa auto|portable|avx2|avx512|avx512-bf16|neon|neon-dotprod (auto: best here)] [--page N (32; even, 2..64)] "
               "[--head-dim 64|80|96|128|256 (128)] [--iters N (4000; 1..100000000)]\n");
}

int bench_stages(int argc, char **argv) {
    int fmt = 3, isa = KVP_ISA_AUTO, P = 32, D = 128, iters = 4000, reps = 15;
    const char *fmt_names[sizeof stage_formats / sizeof *stage_formats];
    for (size_t k = 0; k < sizeof stage_formats / sizeof *stage_formats; k++)
        fmt_names[k] = stage_formats[k].name;
    const char *isa_names[KVP_ISA_COUNT];
    for (int32_t k = KVP_ISA_AUTO; k < KVP_ISA_COUNT; k++) isa_names[k] = kvp_isa_name(k);
    static const char *const dim_names[] = {"64", "80", "96", "128", "256"};
    static const int dims[] = {64, 80, 96, 128, 256};
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        bool ok = true;
        int dim = 3;
        if (!strcmp(a, "--format"))
            ok = cli_opt_choice(TOOL, argc, argv, &i, fmt_names, (int)(sizeof fmt_names / sizeof *fmt_names),
                                &fmt, stderr);
        else if (!strcmp(a, "--isa"))
            ok = cli_opt_choice(TOOL, argc, argv, &i, isa_names, KVP_ISA_COUNT, &isa, stderr);
        else if (!strcmp(a, "--page")) {
            ok = cli_opt_int(TOOL, argc, argv, &i, 2, 64, &P, stderr);
            if (ok && P % 2 != 0) return cli_error(stderr, TOOL, "--page must be even, got %s", argv[i]);
        } else if (!strcmp(a, "--head-dim")) {
            ok = cli_opt_choice(TOOL, argc, argv, &i, dim_names, 5, &dim, stderr);
            D = dims[dim];
        } else if (!strcmp(a, "--iters"))
            ok = cli_opt_int(TOOL, argc, argv, &i, 1, 100000000, &iters, stderr);
        else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else {
            return cli_reject_option(TOOL, a, usage);
        }
        if (!ok) return CLI_USAGE;
    }
    if (!kvp_isa_supported(isa))
        return cli_error(stderr, TOOL, "--isa %s: this CPU cannot run it", kvp_isa_name(isa));
    if (isa == KVP_ISA_AUTO) {
        kvp_ctx_params_t cp;
        kvp_ctx_params_init(&cp);
        kvp_ctx_t *c = NULL;
        kvp_ctx_info_t info = {.struct_size = sizeof info};
        if (kvp_ctx_create(&cp, &c, NULL, 0) == KVP_OK && kvp_ctx_info(c, &info) == KVP_OK)
            isa = info.isa;
        kvp_ctx_destroy(c);
        if (isa == KVP_ISA_AUTO) {
            fprintf(stderr, "%s: no CPU context: cannot tell which kernels to time\n", TOOL);
            return 1;
        }
    }
    const int32_t f = stage_formats[fmt].format;
    stage_set_t ss;
    memset(&ss, 0, sizeof ss);
    ss.P = P;
    ss.kf = kvp__blockfmt_make(f, 1, KVP_K_ORDER_DIM_MAJOR, P, D);
    ss.vf = kvp__blockfmt_make(f, 0, KVP_K_ORDER_TOKEN_MAJOR, P, D);
    ss.kstride = (size_t)kvp__round_up_u64(kvp__block_used_bytes(&ss.kf), KVP_BLOCK_ALIGN);
    ss.vstride = (size_t)kvp__round_up_u64(kvp__block_used_bytes(&ss.vf), KVP_BLOCK_ALIGN);
    ss.prep = kvp__pick_kprep(isa, f);
    ss.keys = kvp__pick_klogits(isa, f, kvp__blockfmt_dim_major(&ss.kf));
    ss.softmax = kvp__pick_softmax(isa);
    ss.values = kvp__pick_vacc(isa, f);
    if (P == 16 || P == 32) ss.values2 = kvp__pick_vacc2(isa, f);
    if (P == 16 || P == 32) ss.values4 = kvp__pick_vacc4(isa, f);

    /* sizes rounded to the alignment, as aligned_alloc asks */
    uint8_t *k = aligned_alloc(64, (ss.kstride * PAGES + 63) & ~(size_t)63);
    uint8_t *v = aligned_alloc(64, (ss.vstride * PAGES + 63) & ~(size_t)63);
    float *x = malloc(sizeof(float) * (size_t)P * (size_t)D);
    stage_state *st = aligned_alloc(64, sizeof *st);
    kvd_rng rng;
    kvd_keys keys = {0, 0, NULL, NULL};
    kvd_seed(&rng, 20261129);
    int rc = 1;
    if (k == NULL || v == NULL || x == NULL || st == NULL || kvd_keys_init(&keys, &rng, 1, D) != 0) goto out;
    for (int p = 0; p < PAGES; p++) {
        kvd_fill_keys(&keys, &rng, (size_t)P, x);
        kvp__block_encode(&ss.kf, k + (size_t)p * ss.kstride, 0, P, x, (size_t)D, 1.0f);
        kvd_fill_normal(&rng, (size_t)P * (size_t)D, x);
        kvp__block_encode(&ss.vf, v + (size_t)p * ss.vstride, 0, P, x, (size_t)D, 1.0f);
    }
    ss.k = k;
    ss.v = v;
    memset(st, 0, sizeof *st);
    kvp__tile *t = &st->tile;
    t->rows = KVP__TILE_ROWS;
    t->D = D;
    t->P = P;
    t->o = &st->o[0][0];
    float sm = (float)kvd_sm_scale(&keys);
    for (int r = 0; r < KVP__TILE_ROWS; r++) {
        kvd_fill_normal(&rng, (size_t)D, t->q[r]);
        for (int d = 0; d < D; d++) t->q[r][d] *= sm;
        t->m[r] = -INFINITY;
        t->hi[r] = INT32_MAX / 2; /* every position the passes reach is visible */
    }
    double best[S_COUNT];
    for (int s = 0; s < S_COUNT; s++) best[s] = 1e30;
    for (int rep = 0; rep < reps; rep++) /* stages interleaved: the same machine state for each */
        for (int s = 0; s < S_COUNT; s++) {
            if ((s == S_PAIRS && ss.values2 == NULL) || (s == S_QUADS && ss.values4 == NULL)) continue;
            double dt = run_stage(&ss, st, s, iters);
            if (dt < best[s]) best[s] = dt;
        }
    double bytes = (double)(kvp__block_used_bytes(&ss.kf) + kvp__block_used_bytes(&ss.vf));
    printf("attention stages: %s, %s kernels, page %d, head_dim %d, 4 query rows, 1 thread, %d "
           "in-cache pages (best of %d passes of %d steps)\n",
           stage_formats[fmt].name, kvp_isa_name(isa), P, D, PAGES, reps, iters);
    printf("%-8s %14s\n", "stage", "ns per step");
    for (int s = 0; s < S_COUNT; s++)
        if ((s != S_PAIRS || ss.values2 != NULL) && (s != S_QUADS || ss.values4 != NULL))
            printf("%-8s %14.1f\n", stage_names[s], best[s] / iters * 1e9);
    double ns_all = best[S_ALL] / iters * 1e9;
    char pairs[32] = "null", quads[32] = "null";
    if (ss.values2 != NULL) snprintf(pairs, sizeof pairs, "%.1f", best[S_PAIRS] / iters * 1e9);
    if (ss.values4 != NULL) snprintf(quads, sizeof quads, "%.1f", best[S_QUADS] / iters * 1e9);
    printf("one step = one page of one kv head (%.0f bytes of K and V): %.1f GB/s per core in cache\n",
           bytes, bytes / ns_all);
    printf("{\"bench\": \"stages\", \"format\": \"%s\", \"isa\": \"%s\", \"page\": %d, \"head_dim\": %d, "
           "\"prep_ns\": %.1f, \"keys_ns\": %.1f, \"softmax_ns\": %.1f, \"values_ns\": %.1f, "
           "\"all_ns\": %.1f, \"gbps_per_core\": %.2f, \"pairs_ns\": %s, \"quads_ns\": %s}\n",
           stage_formats[fmt].name, kvp_isa_name(isa), P, D, best[S_PREP] / iters * 1e9,
           best[S_KEYS] / iters * 1e9, best[S_SOFTMAX] / iters * 1e9, best[S_VALUES] / iters * 1e9,
           ns_all, bytes / ns_all, pairs, quads);
    rc = 0;
out:
    if (rc != 0) fprintf(stderr, "kvpage-bench stages: out of memory\n");
    kvd_keys_free(&keys);
    free(k);
    free(v);
    free(x);
    free(st);
    return rc;
}
