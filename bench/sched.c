/*
 * kvpage-bench sched: the cost of one kvp_sched_step with ~1,000 resident and
 * ~1,000 waiting sequences while memory is under pressure (the pool is sized
 * so the forecast keeps moving work out). A small engine model executes each
 * plan so the state evolves as in a real engine; only kvp_sched_step is timed.
 */
#define _POSIX_C_SOURCE 200809L
#include "bench.h"

#include "cli.h"
#include "kvpage_sched.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int64_t kv_len, generated, max_new, prompt;
    int state; /* 0 free, 1 waiting, 2 resident, 3 swapped */
} bseq;

typedef struct {
    kvp_sched_t *s;
    bseq *q;
    int64_t n, next_id, free_pages, page_size;
    uint64_t rng, host_free;
} bmodel;

static uint64_t brnd(bmodel *m) {
    m->rng ^= m->rng << 13;
    m->rng ^= m->rng >> 7;
    m->rng ^= m->rng << 17;
    return m->rng;
}

static int64_t bpages(const bmodel *m, int64_t len) { return (len + m->page_size - 1) / m->page_size; }

static int submit_one(bmodel *m) {
    int64_t id = -1;
    for (int64_t k = 0; k < m->n && id < 0; k++, m->next_id++)
        if (m->q[m->next_id % m->n].state == 0) id = m->next_id % m->n;
    if (id < 0) return 0;
    bseq *x = &m->q[id];
    x->prompt = 128 + (int64_t)(brnd(m) % 512);
    x->max_new = 64 + (int64_t)(brnd(m) % 512);
    x->kv_len = x->generated = 0;
    x->state = 1;
    kvp_sched_request_t r = {.struct_size = sizeof r};
    r.id = id;
    r.priority = (int32_t)(brnd(m) % 3);
    r.prompt_tokens = x->prompt;
    r.max_new_tokens = x->max_new;
    return kvp_sched_submit(m->s, &r) == KVP_OK;
}

static void execute(bmodel *m, const kvp_sched_plan_t *pl) {
    for (int32_t i = 0; i < pl->n_finished; i++) {
        bseq *x = &m->q[pl->finished[i]];
        m->free_pages += bpages(m, x->kv_len);
        x->state = 0;
    }
    for (int32_t i = 0; i < pl->n_reject; i++) m->q[pl->reject[i].id].state = 0;
    for (int32_t i = 0; i < pl->n_swap_out; i++) {
        bseq *x = &m->q[pl->swap_out[i].id];
        m->free_pages += bpages(m, x->kv_len);
        m->host_free -= (uint64_t)bpages(m, x->kv_len) * 4096;
        x->state = 3;
    }
    for (int32_t i = 0; i < pl->n_preempt; i++) {
        bseq *x = &m->q[pl->preempt[i].id];
        m->free_pages += bpages(m, x->kv_len);
        x->kv_len = 0;
        x->state = 1;
    }
    for (int32_t i = 0; i < pl->n_drop; i++) {
        bseq *x = &m->q[pl->drop[i].id];
        if (x->state == 2) m->free_pages += bpages(m, x->kv_len);
        else m->host_free += (uint64_t)bpages(m, x->kv_len) * 4096;
        x->state = 0;
    }
    for (int32_t i = 0; i < pl->n_swap_in; i++) {
        bseq *x = &m->q[pl->swap_in[i].id];
        m->free_pages -= bpages(m, x->kv_len);
        m->host_free += (uint64_t)bpages(m, x->kv_len) * 4096;
        x->state = 2;
    }
    for (int32_t i = 0; i < pl->n_prefill; i++) {
        bseq *x = &m->q[pl->prefill[i].id];
        x->state = 2;
        m->free_pages -= bpages(m, x->kv_len + pl->prefill[i].tokens) - bpages(m, x->kv_len);
        x->kv_len += pl->prefill[i].tokens;
        if (x->kv_len == x->prompt + x->generated) x->generated++;
    }
    for (int32_t i = 0; i < pl->n_decode; i++) {
        bseq *x = &m->q[pl->decode[i]];
        m->free_pages -= bpages(m, x->kv_len + 1) - bpages(m, x->kv_len);
        x->kv_len++;
        x->generated++;
    }
}

#define TOOL "kvpage-bench sched"

static void usage(FILE *f) {
    fprintf(f, "usage: kvpage-bench sched [--steps N (2000; 1..10000000)] [--quick (300 steps)]\n");
}

int bench_sched(int argc, char **argv) {
    int64_t running = 1000, waiting = 1000;
    int steps = 2000, quick = 0, steps_given = 0;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--steps")) {
            if (!cli_opt_int(TOOL, argc, argv, &i, 1, 10000000, &steps, stderr)) return CLI_USAGE;
            steps_given = 1;
        } else if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else {
            return cli_reject_option(TOOL, argv[i], usage);
        }
    }
    if (quick && !steps_given) steps = 300; /* --steps wins, in either order */
    bmodel m;
    memset(&m, 0, sizeof m);
    m.rng = 0x1234567;
    m.n = running + waiting + 256;
    m.page_size = 16;
    /* room for ~1,000 sequences of ~600 tokens: growth keeps it under pressure */
    m.free_pages = running * 44;
    m.host_free = (uint64_t)1 << 34;
    m.q = calloc((size_t)m.n, sizeof *m.q);
    kvp_sched_params_t p;
    kvp_sched_params_init(&p);
    p.page_size = 16;
    p.total_pages = m.free_pages;
    p.max_requests = (int32_t)m.n;
    p.max_batch = 1100;
    p.token_budget = 4096;
    p.max_prefill_chunk = 512;
    p.page_bytes = 4096;
    char err[KVP_ERR_SIZE];
    if (m.q == NULL || kvp_sched_create(&p, &m.s, err, sizeof err) != KVP_OK) {
        fprintf(stderr, "kvpage-bench sched: %s\n", m.q ? err : "out of memory");
        free(m.q);
        return 1;
    }
    for (int64_t i = 0; i < running + waiting; i++) submit_one(&m);

    kvp_sched_input_t in = {.struct_size = sizeof in};
    kvp_sched_plan_t pl = {.struct_size = sizeof pl};
    double *t = malloc((size_t)steps * sizeof *t);
    double *tp = malloc((size_t)steps * sizeof *tp); /* steps that acted on pressure */
    int n_tp = 0;
    int64_t res_sum = 0, wait_sum = 0, pressure_steps = 0, evictions = 0;
    int warm = 200, measured = 0;
    for (int step = 0; step < warm + steps; step++) {
        in.free_pages = m.free_pages;
        in.host_free_bytes = m.host_free;
        in.now = step;
        double t0 = bench_now();
        int rc = kvp_sched_step(m.s, &in, &pl);
        double dt = bench_now() - t0;
        if (rc != KVP_OK) {
            fprintf(stderr, "kvpage-bench sched: %s\n", kvp_sched_last_error(m.s));
            break;
        }
        execute(&m, &pl);
        kvp_sched_stats_t st = {.struct_size = sizeof st};
        kvp_sched_stats(m.s, &st);
        while (st.waiting < waiting && submit_one(&m)) st.waiting++; /* keep the queue full */
        if (step >= warm) {
            t[measured++] = dt * 1e6;
            if (pl.pressure) tp[n_tp++] = dt * 1e6;
            res_sum += st.running;
            wait_sum += st.waiting;
            pressure_steps += pl.pressure;
            evictions += pl.n_swap_out + pl.n_preempt + pl.n_drop;
        }
    }
    if (measured == 0) {
        free(t);
        free(tp);
        free(m.q);
        kvp_sched_destroy(m.s);
        return 1;
    }
    double med, p99;
    {
        /* median and p99 over all measured steps */
        int n = measured;
        for (int i = 1; i < n; i++) { /* insertion sort is fine for a few thousand */
            double v = t[i];
            int j = i - 1;
            while (j >= 0 && t[j] > v) {
                t[j + 1] = t[j];
                j--;
            }
            t[j + 1] = v;
        }
        med = n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
        p99 = t[(int)(0.99 * (n - 1))];
    }
    double med_p = n_tp ? bench_median(tp, n_tp < 64 ? n_tp : 64) : 0;
    printf("sched step (%d steps measured after %d warm-up)\n", measured, warm);
    printf("  resident sequences   %8.0f (mean)\n", (double)res_sum / measured);
    printf("  waiting sequences    %8.0f (mean)\n", (double)wait_sum / measured);
    printf("  steps under pressure %8.1f %%\n", 100.0 * (double)pressure_steps / measured);
    printf("  evictions            %8lld\n", (long long)evictions);
    printf("  step time            %8.1f us median, %.1f us p99\n", med, p99);
    printf("  step time, pressure  %8.1f us median of the first %d steps that evicted\n", med_p,
           n_tp < 64 ? n_tp : 64);
    printf("{\"bench\": \"sched\", \"running\": %.0f, \"waiting\": %.0f, \"pressure_share\": %.3f, "
           "\"evictions\": %lld, \"step_us\": %.2f, \"step_us_p99\": %.2f, "
           "\"step_us_pressure\": %.2f}\n",
           (double)res_sum / measured, (double)wait_sum / measured,
           (double)pressure_steps / measured, (long long)evictions, med, p99, med_p);
    free(t);
    free(tp);
    free(m.q);
    kvp_sched_destroy(m.s);
    return 0;
}
