/*
 * kvpage-bench utilization: how much of the reserved KV memory holds live
 * tokens, replaying one synthetic workload through
 *
 *   (a) static reservation: every admitted request reserves the maximum
 *       sequence length up front (what engines without paging do);
 *   (b) the page pool + table with page sizes 8, 16 and 32: pages are taken
 *       as sequences grow and returned when they finish.
 *
 * Workload: --requests requests, all waiting at the start, prompt and output
 * lengths log-normal (long-tailed; medians 400 and 200 tokens, clipped to
 * 3000 and 1024), a KV budget of --budget token slots, maximum sequence
 * length 4096. Each step admits waiting requests in order while they fit,
 * then decodes one token for every running request; a request that cannot
 * get a page is handled as engines do, by preempting the newest request
 * (released, re-queued, recomputed later).
 *
 * Utilization = time-averaged live tokens / time-averaged reserved token
 * slots (static: running x 4096; paged: used pages x page size).
 */
#define _POSIX_C_SOURCE 200809L
#include "bench.h"

#include "cli.h"
#include "kvpage.h"
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_LEN 4096

typedef struct {
    int32_t prompt, output;
} request;

typedef struct {
    double utilization, concurrency;
    long steps, preemptions;
} outcome;

static uint64_t rng_state;

static double uniform(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return ((double)(rng_state >> 11) + 0.5) / 9007199254740992.0;
}

static int32_t lognormal(double median, double sigma, int32_t lo, int32_t hi) {
    double z = sqrt(-2.0 * log(uniform())) * cos(6.283185307179586 * uniform());
    double v = median * exp(sigma * z);
    return v < lo ? lo : v > hi ? hi : (int32_t)v;
}

static void make_workload(request *r, int n) {
    rng_state = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < n; i++) {
        r[i].prompt = lognormal(400, 0.9, 8, 3000);
        r[i].output = lognormal(200, 1.0, 1, 1024);
    }
}

/* ---- (a) static reservation ------------------------------------------------ */

static outcome run_static(const request *r, int n, int64_t budget) {
    int64_t capacity = budget / MAX_LEN;
    int32_t *len = malloc((size_t)capacity * sizeof *len), *left = malloc((size_t)capacity * sizeof *left);
    int running = 0, next = 0;
    double live_sum = 0, reserved_sum = 0, conc_sum = 0;
    outcome o = {0, 0, 0, 0};
    while (next < n || running > 0) {
        while (next < n && running < capacity) { /* prefill at admission */
            len[running] = r[next].prompt;
            left[running] = r[next].output;
            running++, next++;
        }
        int64_t live = 0;
        for (int i = 0; i < running; i++) { /* decode one token each */
            len[i]++;
            left[i]--;
            live += len[i];
        }
        live_sum += (double)live;
        reserved_sum += (double)running * MAX_LEN;
        conc_sum += running;
        o.steps++;
        for (int i = 0; i < running;) { /* finished requests leave */
            if (left[i] == 0) {
                len[i] = len[running - 1];
                left[i] = left[running - 1];
                running--;
            } else {
                i++;
            }
        }
    }
    free(len);
    free(left);
    o.utilization = live_sum / reserved_sum;
    o.concurrency = conc_sum / (double)o.steps;
    return o;
}

/* ---- (b) the page pool ----------------------------------------------------------- */

typedef struct {
    int32_t seq, req, left;
} running_req;

typedef struct {
    kvp_pool_t *pool;
    kvp_table_t *t;
    running_req *run;
    int nrun;
    int *queue; /* waiting request indices; preempted ones go to the front */
    int qhead, qtail, qcap;
} sim;

static void die(const char *what, const char *detail) {
    fprintf(stderr, "kvpage-bench utilization: %s: %s\n", what, detail);
    exit(1);
}

static int64_t available(sim *s) {
    kvp_pool_stats_t st = {.struct_size = sizeof st};
    kvp_pool_stats(s->pool, &st);
    return st.available_pages;
}

/* Admit the request at the head of the queue if its prompt fits and leaves a
 * page of headroom per running request (a watermark, as engines keep). */
static bool admit(sim *s, const request *r, int32_t page) {
    int req = s->queue[s->qhead];
    int64_t need = (r[req].prompt + page) / page + s->nrun + 1;
    if (need > available(s)) return false;
    running_req *x = &s->run[s->nrun];
    if (kvp_table_seq_create(s->t, 0, 0, &x->seq) != KVP_OK) die("create", kvp_table_last_error(s->t));
    int32_t nops;
    if (kvp_table_append(s->t, x->seq, r[req].prompt, NULL, NULL, NULL, 0, &nops) != KVP_OK)
        die("prefill", kvp_table_last_error(s->t));
    x->req = req;
    x->left = r[req].output;
    s->nrun++;
    s->qhead++;
    return true;
}

/* Free memory by preempting the newest running request (recomputed later). */
static void preempt_newest(sim *s) {
    running_req *x = &s->run[--s->nrun];
    kvp_table_seq_release(s->t, x->seq);
    s->queue[--s->qhead] = x->req;
}

static outcome run_paged(const request *r, int n, int64_t budget, int32_t page) {
    sim s;
    memset(&s, 0, sizeof s);
    kvp_pool_params_t pp;
    kvp_pool_params_init(&pp);
    pp.page_size = page;
    pp.num_pages = (int32_t)(budget / page);
    pp.prefix_cache = 0; /* no sharing: utilization stays a fraction */
    char err[KVP_ERR_SIZE];
    if (kvp_pool_create(&pp, &s.pool, err, sizeof err) != KVP_OK) die("pool", err);
    int32_t max_seqs = pp.num_pages < (1 << 24) ? pp.num_pages : (1 << 24);
    if (kvp_table_create(s.pool, max_seqs, &s.t, err, sizeof err) != KVP_OK) die("table", err);
    s.run = malloc((size_t)pp.num_pages * sizeof *s.run);
    s.queue = malloc((size_t)n * sizeof *s.queue);
    for (int i = 0; i < n; i++) s.queue[i] = i;
    s.qtail = n;
    double live_sum = 0, reserved_sum = 0, conc_sum = 0;
    outcome o = {0, 0, 0, 0};
    while (s.qhead < s.qtail || s.nrun > 0) {
        while (s.qhead < s.qtail && admit(&s, r, page)) {
        }
        if (s.nrun == 0) die("admission", "a request does not fit in the budget");
        for (int i = 0; i < s.nrun; i++) { /* decode: room for one token each */
            while (kvp_table_reserve(s.t, s.run[i].seq, 1) != KVP_OK) {
                o.preemptions++;
                if (s.nrun - 1 == i) break; /* preempting itself */
                preempt_newest(&s);
            }
        }
        kvp_pool_stats_t st = {.struct_size = sizeof st};
        int32_t nops;
        for (int i = 0; i < s.nrun;) {
            running_req *x = &s.run[i];
            if (kvp_table_append(s.t, x->seq, 1, NULL, NULL, NULL, 0, &nops) != KVP_OK) {
                preempt_newest(&s); /* only the newest can lack its page */
                continue;
            }
            x->left--;
            i++;
        }
        kvp_pool_stats(s.pool, &st);
        live_sum += (double)st.live_tokens;
        reserved_sum += (double)st.used_pages * page;
        conc_sum += s.nrun;
        o.steps++;
        for (int i = 0; i < s.nrun;) {
            if (s.run[i].left == 0) {
                kvp_table_seq_release(s.t, s.run[i].seq);
                s.run[i] = s.run[--s.nrun];
            } else {
                i++;
            }
        }
    }
    o.utilization = live_sum / reserved_sum;
    o.concurrency = conc_sum / (double)o.steps;
    free(s.run);
    free(s.queue);
    kvp_table_destroy(s.t);
    kvp_pool_destroy(s.pool);
    return o;
}

#define TOOL "kvpage-bench utilization"

static void usage(FILE *f) {
    fprintf(f, "usage: kvpage-bench utilization [--requests N (2000; 1..1000000)] "
               "[--budget TOKENS (128k; %d..2^30, k = x1024)]\n", MAX_LEN);
}

int bench_utilization(int argc, char **argv) {
    int n = 2000;
    int64_t budget = 131072;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--requests")) {
            if (!cli_opt_int(TOOL, argc, argv, &i, 1, 1000000, &n, stderr)) return CLI_USAGE;
        } else if (!strcmp(argv[i], "--budget")) {
            if (!cli_opt_i64(TOOL, argc, argv, &i, MAX_LEN, (int64_t)1 << 30, true, &budget, stderr))
                return CLI_USAGE;
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else {
            return cli_reject_option(TOOL, argv[i], usage);
        }
    }
    request *r = malloc((size_t)n * sizeof *r);
    make_workload(r, n);
    double mp = 0, mo = 0;
    for (int i = 0; i < n; i++) mp += r[i].prompt, mo += r[i].output;
    outcome st = run_static(r, n, budget);
    outcome pg[3];
    const int32_t sizes[3] = {8, 16, 32};
    for (int k = 0; k < 3; k++) pg[k] = run_paged(r, n, budget, sizes[k]);

    printf("kvpage-bench utilization: %d requests (mean prompt %.0f, mean output %.0f tokens), "
           "budget %lld token slots, max length %d\n",
           n, mp / n, mo / n, (long long)budget, MAX_LEN);
    printf("  %-24s %12s %14s %8s %12s\n", "", "utilization", "mean running", "steps",
           "preemptions");
    printf("  %-24s %12.3f %14.1f %8ld %12s\n", "static (max length)", st.utilization,
           st.concurrency, st.steps, "-");
    for (int k = 0; k < 3; k++)
        printf("  paged, page size %-6d %12.3f %14.1f %8ld %12ld\n", sizes[k], pg[k].utilization,
               pg[k].concurrency, pg[k].steps, pg[k].preemptions);
    printf("{\"bench\": \"utilization\", \"requests\": %d, \"budget_tokens\": %lld, "
           "\"static_utilization\": %.4f, \"paged8_utilization\": %.4f, "
           "\"paged16_utilization\": %.4f, \"paged32_utilization\": %.4f, "
           "\"static_mean_running\": %.2f, \"paged16_mean_running\": %.2f, "
           "\"static_steps\": %ld, \"paged16_steps\": %ld}\n",
           n, (long long)budget, st.utilization, pg[0].utilization, pg[1].utilization,
           pg[2].utilization, st.concurrency, pg[1].concurrency, st.steps, pg[1].steps);
    free(r);
    return 0;
}
