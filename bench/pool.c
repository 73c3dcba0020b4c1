/*
 * kvpage-bench pool: the page pool and page table against a straightforward
 * baseline run in the same process (per-sequence page arrays in realloc'ed
 * vectors, linear free-page search, linear prefix search).
 *
 *   1. alloc+free pairs of one page, pool 90% full (filled in order, as a
 *      pool fills while an engine warms up);
 *   2. decode steps: reserve + append 1 token for each of 256 sequences;
 *   3. batch export of 256 sequences x 4096 tokens (CSR + one new slot each);
 *   4. prefix lookup of a 2048-token prompt among 16k other cached pages.
 *
 * Each figure is the median of --reps repetitions. speedup_vs_naive is the
 * geometric mean of the four baseline/library time ratios.
 */
#define _POSIX_C_SOURCE 200809L
#include "bench.h"

#include "cli.h"
#include "kvpage_ext.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PAGE 16
#define SEQS 256

static void die(const char *what, const char *detail) {
    fprintf(stderr, "kvpage-bench pool: %s: %s\n", what, detail);
    exit(1);
}

static kvp_pool_t *make_pool(int32_t pages, int cache) {
    kvp_pool_params_t p;
    kvp_pool_params_init(&p);
    p.page_size = PAGE;
    p.num_pages = pages;
    p.prefix_cache = cache;
    kvp_pool_t *pool = NULL;
    char err[KVP_ERR_SIZE];
    if (kvp_pool_create(&p, &pool, err, sizeof err) != KVP_OK) die("pool", err);
    return pool;
}

static kvp_table_t *make_table(kvp_pool_t *pool) {
    kvp_table_t *t = NULL;
    char err[KVP_ERR_SIZE];
    if (kvp_table_create(pool, 0, &t, err, sizeof err) != KVP_OK) die("table", err);
    return t;
}

static void check(int rc, kvp_table_t *t, const char *what) {
    if (rc != KVP_OK) die(what, t ? kvp_table_last_error(t) : kvp_status_name(rc));
}

/* ---- the naive baseline ------------------------------------------------------ */

typedef struct {
    unsigned char *used; /* one flag per page */
    int32_t pages, free_count;
} naive_pool;

static int32_t naive_alloc(naive_pool *p) {
    for (int32_t i = 0; i < p->pages; i++)
        if (!p->used[i]) {
            p->used[i] = 1;
            p->free_count--;
            return i;
        }
    return -1;
}

static void naive_free(naive_pool *p, int32_t page) {
    p->used[page] = 0;
    p->free_count++;
}

typedef struct {
    int32_t *pages; /* grown with realloc, one page at a time */
    int32_t npages;
    int64_t len;
} naive_seq;

static int naive_append(naive_pool *p, naive_seq *s, int64_t *slot) {
    if (s->len % PAGE == 0) {
        int32_t page = naive_alloc(p);
        if (page < 0) return -1;
        int32_t *grown = realloc(s->pages, (size_t)(s->npages + 1) * sizeof *grown);
        if (grown == NULL) return -1;
        s->pages = grown;
        s->pages[s->npages++] = page;
    }
    *slot = (int64_t)s->pages[s->len / PAGE] * PAGE + s->len % PAGE;
    s->len++;
    return 0;
}

/* ---- 1. alloc + free ------------------------------------------------------------ */

static double time_alloc_free(int32_t pages, long pairs) {
    kvp_pool_t *pool = make_pool(pages, 1);
    int32_t *held = malloc((size_t)pages * sizeof *held);
    int32_t fill = pages / 10 * 9;
    if (kvp_pool_alloc(pool, fill, held) != KVP_OK) die("fill", kvp_pool_last_error(pool));
    double t0 = bench_now();
    for (long i = 0; i < pairs; i++) {
        int32_t page;
        kvp_pool_alloc(pool, 1, &page);
        kvp_pool_release(pool, 1, &page);
    }
    double ns = (bench_now() - t0) * 1e9 / (double)pairs;
    free(held);
    kvp_pool_destroy(pool);
    return ns;
}

static double time_naive_alloc_free(int32_t pages, long pairs) {
    naive_pool p = {calloc((size_t)pages, 1), pages, pages};
    for (int32_t i = 0; i < pages / 10 * 9; i++) naive_alloc(&p);
    double t0 = bench_now();
    for (long i = 0; i < pairs; i++) naive_free(&p, naive_alloc(&p));
    double ns = (bench_now() - t0) * 1e9 / (double)pairs;
    free(p.used);
    return ns;
}

/* ---- 2. decode steps --------------------------------------------------------------- */

static double time_decode(int32_t prompt, int32_t steps) {
    int32_t pages = SEQS * ((prompt + steps) / PAGE + 2);
    kvp_pool_t *pool = make_pool(pages, 1);
    kvp_table_t *t = make_table(pool);
    int32_t seqs[SEQS], *tokens = malloc((size_t)prompt * sizeof *tokens);
    int64_t *slots = malloc((size_t)prompt * sizeof *slots);
    kvp_page_op_t ops[4];
    int32_t nops;
    for (int32_t i = 0; i < prompt; i++) tokens[i] = i;
    for (int b = 0; b < SEQS; b++) {
        check(kvp_table_seq_create(t, 0, 0, &seqs[b]), t, "create");
        tokens[0] = b; /* distinct prompts: no sharing */
        check(kvp_table_append(t, seqs[b], prompt, tokens, slots, NULL, 0, &nops), t, "prompt");
    }
    double t0 = bench_now();
    for (int32_t s = 0; s < steps; s++)
        for (int b = 0; b < SEQS; b++) {
            int32_t token = s;
            int64_t slot;
            kvp_table_reserve(t, seqs[b], 1);
            kvp_table_append(t, seqs[b], 1, &token, &slot, ops, 4, &nops);
        }
    double ns = (bench_now() - t0) * 1e9 / ((double)steps * SEQS);
    free(tokens);
    free(slots);
    kvp_table_destroy(t);
    kvp_pool_destroy(pool);
    return ns;
}

static double time_naive_decode(int32_t prompt, int32_t steps) {
    int32_t pages = SEQS * ((prompt + steps) / PAGE + 2);
    naive_pool p = {calloc((size_t)pages, 1), pages, pages};
    naive_seq seqs[SEQS];
    memset(seqs, 0, sizeof seqs);
    int64_t slot;
    for (int b = 0; b < SEQS; b++)
        for (int32_t i = 0; i < prompt; i++) naive_append(&p, &seqs[b], &slot);
    double t0 = bench_now();
    for (int32_t s = 0; s < steps; s++)
        for (int b = 0; b < SEQS; b++) {
            if (p.free_count < 1) die("naive decode", "out of pages");
            naive_append(&p, &seqs[b], &slot);
        }
    double ns = (bench_now() - t0) * 1e9 / ((double)steps * SEQS);
    for (int b = 0; b < SEQS; b++) free(seqs[b].pages);
    free(p.used);
    return ns;
}

/* ---- 3. batch export ---------------------------------------------------------------- */

typedef struct {
    int32_t *indptr, *indices, *last;
    int64_t *slots;
} export_bufs;

static export_bufs export_alloc(int64_t entries) {
    export_bufs b;
    b.indptr = malloc((SEQS + 1) * sizeof *b.indptr);
    b.indices = malloc((size_t)entries * sizeof *b.indices);
    b.last = malloc(SEQS * sizeof *b.last);
    b.slots = malloc(SEQS * sizeof *b.slots);
    return b;
}

static void export_free(export_bufs *b) {
    free(b->indptr);
    free(b->indices);
    free(b->last);
    free(b->slots);
}

static double time_export(int32_t tokens, int reps_inner) {
    int32_t per_seq = tokens / PAGE;
    kvp_pool_t *pool = make_pool(SEQS * per_seq, 0);
    kvp_table_t *t = make_table(pool);
    int32_t seqs[SEQS], num_new[SEQS], nops;
    kvp_page_op_t ops[1];
    for (int b = 0; b < SEQS; b++) {
        check(kvp_table_seq_create(t, 0, 0, &seqs[b]), t, "create");
        check(kvp_table_append(t, seqs[b], tokens, NULL, NULL, ops, 1, &nops), t, "fill");
        num_new[b] = 1;
    }
    int64_t ni, ns;
    check(kvp_table_export_size(t, seqs, SEQS, num_new, &ni, &ns), t, "export size");
    export_bufs e = export_alloc(ni);
    kvp_batch_buffers_t buf = {.struct_size = sizeof buf};
    buf.indptr = e.indptr;
    buf.indices = e.indices;
    buf.last_page_len = e.last;
    buf.slot_mapping = e.slots;
    buf.indices_capacity = ni;
    buf.slots_capacity = ns;
    kvp_kv_view_t view;
    double t0 = bench_now();
    for (int r = 0; r < reps_inner; r++)
        check(kvp_table_export(t, seqs, SEQS, num_new, &buf, &view), t, "export");
    double ns_per_page = (bench_now() - t0) * 1e9 / ((double)reps_inner * (double)ni);
    export_free(&e);
    kvp_table_destroy(t);
    kvp_pool_destroy(pool);
    return ns_per_page;
}

static double time_naive_export(int32_t tokens, int reps_inner) {
    int32_t per_seq = tokens / PAGE;
    naive_pool p = {calloc((size_t)SEQS * (size_t)per_seq, 1), SEQS * per_seq, SEQS * per_seq};
    naive_seq seqs[SEQS];
    memset(seqs, 0, sizeof seqs);
    int64_t slot;
    /* fill page by page (the per-token path of the baseline is measured above) */
    for (int b = 0; b < SEQS; b++) {
        seqs[b].pages = malloc((size_t)per_seq * sizeof(int32_t));
        for (int32_t k = 0; k < per_seq; k++) seqs[b].pages[k] = b * per_seq + k;
        seqs[b].npages = per_seq;
        seqs[b].len = tokens;
    }
    export_bufs e = export_alloc((int64_t)SEQS * per_seq);
    double t0 = bench_now();
    for (int r = 0; r < reps_inner; r++) {
        int32_t at = 0;
        e.indptr[0] = 0;
        for (int b = 0; b < SEQS; b++) {
            const naive_seq *s = &seqs[b];
            for (int32_t k = 0; k < s->npages; k++) e.indices[at++] = s->pages[k];
            e.indptr[b + 1] = at;
            e.last[b] = (int32_t)(s->len - (int64_t)(s->npages - 1) * PAGE);
            slot = (int64_t)s->pages[(s->len - 1) / PAGE] * PAGE + (s->len - 1) % PAGE;
            e.slots[b] = slot;
        }
    }
    double ns_per_page = (bench_now() - t0) * 1e9 / ((double)reps_inner * SEQS * per_seq);
    volatile int32_t sink = e.indices[SEQS * per_seq - 1] + (int32_t)e.slots[0];
    (void)sink;
    export_free(&e);
    for (int b = 0; b < SEQS; b++) free(seqs[b].pages);
    free(p.used);
    return ns_per_page;
}

/* ---- 4. prefix lookup ------------------------------------------------------------------ */

#define PROMPT 2048
#define OTHER_PAGES 16384

static double time_prefix_lookup(int lookups) {
    kvp_pool_t *pool = make_pool(OTHER_PAGES + PROMPT / PAGE + 64, 1);
    kvp_table_t *t = make_table(pool);
    int32_t *tokens = malloc(OTHER_PAGES * PAGE * sizeof *tokens), seq, nops;
    kvp_page_op_t ops[1];
    /* 16k cached pages of other prompts (128 prompts of 2048 tokens) */
    for (int32_t i = 0; i < OTHER_PAGES * PAGE; i++) tokens[i] = (int32_t)(i * 2654435761u >> 8);
    for (int k = 0; k < OTHER_PAGES * PAGE / PROMPT; k++) {
        check(kvp_table_seq_create(t, 0, 0, &seq), t, "create");
        check(kvp_table_append(t, seq, PROMPT, tokens + (size_t)k * PROMPT, NULL, ops, 1, &nops),
              t, "fill");
        check(kvp_table_seq_release(t, seq), t, "release");
    }
    int32_t prompt[PROMPT];
    for (int i = 0; i < PROMPT; i++) prompt[i] = 7 * i + 1;
    check(kvp_table_seq_create(t, 0, 0, &seq), t, "create");
    check(kvp_table_append(t, seq, PROMPT, prompt, NULL, ops, 1, &nops), t, "prompt");
    check(kvp_table_seq_release(t, seq), t, "release");
    int64_t matched = 0;
    double t0 = bench_now();
    for (int i = 0; i < lookups; i++) kvp_table_lookup_prefix(t, 0, prompt, PROMPT, &matched);
    double us = (bench_now() - t0) * 1e6 / lookups;
    if (matched != PROMPT) die("prefix lookup", "the prompt was not found");
    free(tokens);
    kvp_table_destroy(t);
    kvp_pool_destroy(pool);
    return us;
}

/* Baseline: cached pages in an array; each prompt page is found by scanning
 * them all, comparing the parent and the tokens. */
typedef struct {
    int32_t parent;
    int32_t tokens[PAGE];
} naive_cached;

static double time_naive_prefix_lookup(int lookups) {
    int32_t n = OTHER_PAGES + PROMPT / PAGE;
    naive_cached *cache = malloc((size_t)n * sizeof *cache);
    for (int32_t i = 0; i < OTHER_PAGES; i++) {
        cache[i].parent = i % (PROMPT / PAGE) == 0 ? -1 : i - 1;
        for (int k = 0; k < PAGE; k++)
            cache[i].tokens[k] = (int32_t)((uint32_t)(i * PAGE + k) * 2654435761u >> 8);
    }
    int32_t prompt[PROMPT];
    for (int i = 0; i < PROMPT; i++) prompt[i] = 7 * i + 1;
    for (int32_t j = 0; j < PROMPT / PAGE; j++) {
        naive_cached *c = &cache[OTHER_PAGES + j];
        c->parent = j == 0 ? -1 : OTHER_PAGES + j - 1;
        memcpy(c->tokens, prompt + j * PAGE, sizeof c->tokens);
    }
    int64_t matched = 0;
    double t0 = bench_now();
    for (int r = 0; r < lookups; r++) {
        int32_t parent = -1;
        matched = 0;
        for (int32_t j = 0; j < PROMPT / PAGE; j++) {
            int32_t found = -1;
            for (int32_t i = 0; i < n && found < 0; i++)
                if (cache[i].parent == parent &&
                    !memcmp(cache[i].tokens, prompt + j * PAGE, sizeof cache[i].tokens))
                    found = i;
            if (found < 0) break;
            parent = found;
            matched += PAGE;
        }
    }
    double us = (bench_now() - t0) * 1e6 / lookups;
    if (matched != PROMPT) die("naive prefix lookup", "the prompt was not found");
    free(cache);
    return us;
}

/* ---- driver -------------------------------------------------------------------------------- */

static int reps = 5;

static double median_of(double (*fn)(int32_t, long), int32_t a, long b) {
    double v[64];
    for (int r = 0; r < reps; r++) v[r] = fn(a, b);
    return bench_median(v, reps);
}

static double af_lib(int32_t a, long b) { return time_alloc_free(a, b); }
static double af_naive(int32_t a, long b) { return time_naive_alloc_free(a, b); }
static double dec_lib(int32_t a, long b) { return time_decode(a, (int32_t)b); }
static double dec_naive(int32_t a, long b) { return time_naive_decode(a, (int32_t)b); }
static double ex_lib(int32_t a, long b) { return time_export(a, (int)b); }
static double ex_naive(int32_t a, long b) { return time_naive_export(a, (int)b); }
static double pf_lib(int32_t a, long b) { (void)a; return time_prefix_lookup((int)b); }
static double pf_naive(int32_t a, long b) { (void)a; return time_naive_prefix_lookup((int)b); }

#define TOOL "kvpage-bench pool"

static void usage(FILE *f) { fprintf(f, "usage: kvpage-bench pool [--reps N (5; 1..64)]\n"); }

int bench_pool(int argc, char **argv) {
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--reps")) {
            if (!cli_opt_int(TOOL, argc, argv, &i, 1, 64, &reps, stderr)) return CLI_USAGE;
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else {
            return cli_reject_option(TOOL, argv[i], usage);
        }
    }
    const int32_t pages = 65536;
    double af = median_of(af_lib, pages, 10000000L);
    double af_n = median_of(af_naive, pages, 20000L);
    double dec = median_of(dec_lib, 512, 1024);
    double dec_n = median_of(dec_naive, 512, 1024);
    double ex = median_of(ex_lib, 4096, 200);
    double ex_n = median_of(ex_naive, 4096, 200);
    double pf = median_of(pf_lib, 0, 2000);
    double pf_n = median_of(pf_naive, 0, 5);
    double s_af = af_n / af, s_dec = dec_n / dec, s_ex = ex_n / ex, s_pf = pf_n / pf;
    double speedup = pow(s_af * s_dec * s_ex * s_pf, 0.25);

    printf("kvpage-bench pool (page size %d, median of %d)\n", PAGE, reps);
    printf("  %-44s %12s %12s %9s\n", "", "libkvpage", "naive", "speedup");
    printf("  %-44s %9.1f ns %9.1f ns %8.1fx\n", "alloc+free 1 page, 64k-page pool 90% full", af,
           af_n, s_af);
    printf("  %-44s %9.1f ns %9.1f ns %8.1fx\n", "decode step (reserve+append 1), per sequence",
           dec, dec_n, s_dec);
    printf("  %-44s %9.2f ns %9.2f ns %8.1fx\n", "export 256 seqs x 4096 tokens, per page", ex,
           ex_n, s_ex);
    printf("  %-44s %9.2f us %9.0f us %8.0fx\n", "prefix lookup, 2048 tokens, 16k cached pages",
           pf, pf_n, s_pf);
    printf("  geometric mean speedup %.1fx\n", speedup);
    printf("{\"bench\": \"pool\", \"page_size\": %d, \"reps\": %d, \"alloc_free_ns\": %.2f, "
           "\"decode_step_ns\": %.2f, \"export_ns_per_page\": %.3f, \"prefix_lookup_us\": %.3f, "
           "\"naive_alloc_free_ns\": %.1f, \"naive_decode_step_ns\": %.2f, "
           "\"naive_export_ns_per_page\": %.3f, \"naive_prefix_lookup_us\": %.1f, "
           "\"speedup_alloc_free\": %.2f, \"speedup_decode\": %.2f, \"speedup_export\": %.2f, "
           "\"speedup_prefix\": %.1f, \"speedup_vs_naive\": %.2f}\n",
           PAGE, reps, af, dec, ex, pf, af_n, dec_n, ex_n, pf_n, s_af, s_dec, s_ex, s_pf,
           speedup);
    return 0;
}
