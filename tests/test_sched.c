/*
 * Layer: sched — the scheduling policy, checked against an engine model
 * written here that executes every plan and keeps its own page accounting.
 *
 * Invariants checked after every step of many random traces:
 *   - following the plan, no reservation fails (the model's free pages and
 *     staging pages never go negative) and the pool is never over budget;
 *   - plan lists are consistent with each sequence's state (decode only
 *     running sequences, prefill from the sequence's current length, swap in
 *     only swapped ones), within max_batch and token_budget;
 *   - victims go in priority order: no unprotected resident sequence of lower
 *     priority survives a pressure eviction;
 *   - no sequence is evicted within `hysteresis` steps of being admitted or
 *     swapped in;
 *   - liveness: every request ends (finished, rejected or dropped), and high
 *     priority is not starved.
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <limits.h>
#include <stdio.h>

#include "kvpage.h"
#include "kvpage_plan.h"
#include "kvpage_sched.h"
#include "testutil.h"

enum { M_NONE, M_WAITING, M_PREFILL, M_RUNNING, M_SWAPPED, M_GONE };

typedef struct {
    int64_t prompt, max_new, kv_len, generated, cached;
    int32_t priority, state;
    int64_t submitted_step, first_token_step, end_step;
    int64_t protected_from; /* last admission or swap-in step */
    int ended_how;          /* 1 finished, 2 rejected, 3 dropped */
} mseq;

typedef struct {
    kvp_sched_params_t p;
    kvp_sched_t *s;
    mseq *q;
    int64_t n;
    int64_t free_pages, free_staging;
    uint64_t host_cap, host_used;
    int64_t step;
    uint64_t rng;
    int64_t evictions, finished, rejected, dropped;
} model;

static uint64_t rnd(model *m) {
    m->rng ^= m->rng << 13;
    m->rng ^= m->rng >> 7;
    m->rng ^= m->rng << 17;
    return m->rng;
}

static int64_t pages(const model *m, int64_t len) {
    int64_t P = m->p.page_size;
    return m->p.needs_staging ? len / P : (len + P - 1) / P;
}

static uint64_t hbytes(const model *m, const mseq *x) {
    return (uint64_t)pages(m, x->kv_len) * m->p.page_bytes +
           (m->p.needs_staging ? m->p.staging_page_bytes : 0);
}

static mseq *get(model *m, int64_t id) {
    assert_true(id >= 0 && id < m->n);
    return &m->q[id];
}

static void release_resident(model *m, mseq *x) {
    m->free_pages += pages(m, x->kv_len);
    if (m->p.needs_staging) m->free_staging++;
}

static void submit(model *m, int64_t id, int32_t prio, int64_t prompt, int64_t max_new,
                   int64_t cached) {
    mseq *x = &m->q[id];
    memset(x, 0, sizeof *x);
    x->prompt = prompt;
    x->max_new = max_new;
    x->priority = prio;
    x->state = M_WAITING;
    x->submitted_step = m->step;
    x->first_token_step = -1;
    x->protected_from = -1000000;
    kvp_sched_request_t r = {.struct_size = sizeof r};
    r.id = id;
    r.priority = prio;
    r.prompt_tokens = prompt;
    r.max_new_tokens = max_new;
    r.cached_tokens = cached;
    r.arrival = m->step;
    assert_int_equal(kvp_sched_submit(m->s, &r), KVP_OK);
}

/* Check a victim: priority order and hysteresis. */
static void check_victim(model *m, const kvp_sched_plan_t *pl, const kvp_sched_item_t *v) {
    mseq *x = get(m, v->id);
    assert_true(x->state == M_RUNNING || x->state == M_PREFILL);
    if (m->step - x->protected_from < m->p.hysteresis)
        print_error("seq %lld evicted %lld steps after admission (hysteresis %d)\n",
                    (long long)v->id, (long long)(m->step - x->protected_from),
                    m->p.hysteresis);
    assert_true(m->step - x->protected_from >= m->p.hysteresis);
    (void)pl;
    m->evictions++;
}

/* After the evictions of a step: a pressure victim of priority p means no
 * unprotected resident of lower priority remains. */
static void check_priority_order(model *m, const kvp_sched_plan_t *pl) {
    int32_t max_victim = INT32_MIN;
    const kvp_sched_item_t *lists[3] = {pl->swap_out, pl->preempt, pl->drop};
    int32_t counts[3] = {pl->n_swap_out, pl->n_preempt, pl->n_drop};
    for (int l = 0; l < 3; l++)
        for (int32_t i = 0; i < counts[l]; i++)
            if (lists[l][i].reason == KVP_REASON_PRESSURE ||
                lists[l][i].reason == KVP_REASON_PRIORITY)
                if (m->q[lists[l][i].id].priority > max_victim)
                    max_victim = m->q[lists[l][i].id].priority;
    if (max_victim == INT32_MIN) return;
    for (int64_t id = 0; id < m->n; id++) {
        mseq *x = &m->q[id];
        if (x->state != M_RUNNING && x->state != M_PREFILL) continue;
        if (m->step - x->protected_from < m->p.hysteresis) continue;
        if (x->priority < max_victim) {
            print_error("seq %lld (prio %d, state %d, admitted %lld, step %lld) survived while "
                        "prio %d was evicted\n",
                        (long long)id, x->priority, x->state, (long long)x->protected_from,
                        (long long)m->step, max_victim);
            for (int l = 0; l < 3; l++)
                for (int32_t i = 0; i < counts[l]; i++)
                    print_error("  list %d: seq %lld prio %d reason %d\n", l,
                                (long long)lists[l][i].id, m->q[lists[l][i].id].priority,
                                lists[l][i].reason);
        }
        assert_false(x->priority < max_victim);
    }
}

/* One engine step: report, plan, execute, check. */
static void engine_step(model *m, int64_t now) {
    kvp_sched_input_t in = {.struct_size = sizeof in};
    in.free_pages = m->free_pages;
    in.free_staging = m->free_staging;
    in.host_free_bytes = m->host_cap - m->host_used;
    in.now = now;
    kvp_sched_plan_t pl;
    memset(&pl, 0, sizeof pl);
    pl.struct_size = sizeof pl;
    assert_int_equal(kvp_sched_step(m->s, &in, &pl), KVP_OK);
    m->step++;

    for (int32_t i = 0; i < pl.n_finished; i++) {
        mseq *x = get(m, pl.finished[i]);
        assert_int_equal(x->state, M_RUNNING);
        assert_true(x->generated >= x->max_new);
        release_resident(m, x);
        x->state = M_GONE;
        x->ended_how = 1;
        x->end_step = m->step;
        m->finished++;
    }
    for (int32_t i = 0; i < pl.n_reject; i++) {
        mseq *x = get(m, pl.reject[i].id);
        assert_int_equal(x->state, M_WAITING);
        assert_int_equal(x->generated, 0);
        x->state = M_GONE;
        x->ended_how = 2;
        m->rejected++;
    }
    for (int32_t i = 0; i < pl.n_swap_out; i++) {
        mseq *x = get(m, pl.swap_out[i].id);
        check_victim(m, &pl, &pl.swap_out[i]);
        assert_int_equal(x->state, M_RUNNING);
        release_resident(m, x);
        m->host_used += hbytes(m, x);
        assert_true(m->host_used <= m->host_cap); /* the host tier never overflows */
        x->state = M_SWAPPED;
    }
    for (int32_t i = 0; i < pl.n_preempt; i++) {
        mseq *x = get(m, pl.preempt[i].id);
        check_victim(m, &pl, &pl.preempt[i]);
        release_resident(m, x);
        x->kv_len = 0;
        x->cached = 0;
        x->state = M_WAITING;
    }
    for (int32_t i = 0; i < pl.n_drop; i++) {
        mseq *x = get(m, pl.drop[i].id);
        if (pl.drop[i].reason != KVP_REASON_DEADLINE) check_victim(m, &pl, &pl.drop[i]);
        if (x->state == M_SWAPPED) m->host_used -= hbytes(m, x);
        else {
            assert_true(x->state == M_RUNNING || x->state == M_PREFILL);
            release_resident(m, x);
        }
        x->state = M_GONE;
        x->ended_how = 3;
        m->dropped++;
    }
    check_priority_order(m, &pl); /* victims are out now: compare with who stayed */
    int32_t batch = 0, tokens = 0;
    for (int32_t i = 0; i < pl.n_swap_in; i++) {
        mseq *x = get(m, pl.swap_in[i].id);
        assert_int_equal(x->state, M_SWAPPED);
        m->host_used -= hbytes(m, x);
        m->free_pages -= pages(m, x->kv_len);
        if (m->p.needs_staging) m->free_staging--;
        assert_true(m->free_pages >= 0);
        assert_true(m->free_staging >= 0);
        x->state = M_RUNNING;
        x->protected_from = m->step;
    }
    for (int32_t i = 0; i < pl.n_prefill; i++) {
        const kvp_sched_item_t *it = &pl.prefill[i];
        mseq *x = get(m, it->id);
        int64_t target = x->prompt + x->generated;
        if (x->state == M_WAITING) { /* admission: attach cached pages, take staging */
            assert_int_equal(it->start, x->cached);
            x->kv_len = x->cached;
            m->free_pages -= pages(m, x->kv_len);
            if (m->p.needs_staging) m->free_staging--;
            x->state = M_PREFILL;
            x->protected_from = m->step;
        } else {
            assert_int_equal(x->state, M_PREFILL);
            assert_int_equal(it->start, x->kv_len);
        }
        assert_true(it->tokens > 0 && x->kv_len + it->tokens <= target);
        m->free_pages -= pages(m, x->kv_len + it->tokens) - pages(m, x->kv_len);
        assert_true(m->free_pages >= 0);
        assert_true(m->free_staging >= 0);
        x->kv_len += it->tokens;
        if (x->kv_len == target) {
            x->state = M_RUNNING;
            x->generated++;
            if (x->first_token_step < 0) x->first_token_step = m->step;
        }
        batch++;
        tokens += it->tokens;
    }
    for (int32_t i = 0; i < pl.n_decode; i++) {
        mseq *x = get(m, pl.decode[i]);
        assert_int_equal(x->state, M_RUNNING);
        assert_true(x->generated < x->max_new);
        m->free_pages -= pages(m, x->kv_len + 1) - pages(m, x->kv_len);
        assert_true(m->free_pages >= 0); /* the promise: reserve never fails */
        x->kv_len++;
        x->generated++;
        batch++;
        tokens++;
    }
    assert_true(batch <= m->p.max_batch);
    assert_true(tokens <= m->p.token_budget);
    /* EOS: some running sequences end early */
    for (int64_t id = 0; id < m->n; id++) {
        mseq *x = &m->q[id];
        if (x->state == M_RUNNING && x->generated < x->max_new && rnd(m) % 97 == 0) {
            assert_int_equal(kvp_sched_finish(m->s, id), KVP_OK);
            release_resident(m, x);
            x->state = M_GONE;
            x->ended_how = 1;
            x->end_step = m->step;
            m->finished++;
        }
    }
}

static bool all_gone(const model *m) {
    for (int64_t i = 0; i < m->n; i++)
        if (m->q[i].state != M_GONE) return false;
    return true;
}

typedef struct {
    int32_t page_size, staging, horizon, actions;
    int64_t total_pages;
    uint64_t host_cap_pages;
    int32_t max_batch, token_budget, chunk;
} trace_cfg;

static void run_trace(uint64_t seed, const trace_cfg *cfg, int64_t requests, int64_t *hi_wait,
                      int64_t *lo_wait) {
    model m;
    memset(&m, 0, sizeof m);
    m.rng = seed * 2654435761u + 1;
    kvp_sched_params_init(&m.p);
    m.p.page_size = cfg->page_size;
    m.p.needs_staging = cfg->staging;
    m.p.total_pages = cfg->total_pages;
    m.p.horizon = cfg->horizon;
    m.p.actions = cfg->actions;
    m.p.max_batch = cfg->max_batch;
    m.p.token_budget = cfg->token_budget;
    m.p.max_prefill_chunk = cfg->chunk;
    m.p.hysteresis = 8;
    m.p.page_bytes = 1000;
    m.p.staging_page_bytes = cfg->staging ? 2000 : 0;
    m.p.max_requests = (int32_t)requests;
    assert_int_equal(kvp_sched_create(&m.p, &m.s, NULL, 0), KVP_OK);
    m.n = requests;
    m.q = calloc((size_t)requests, sizeof *m.q);
    assert_non_null(m.q);
    m.free_pages = cfg->total_pages;
    m.free_staging = cfg->staging ? requests : 0;
    m.host_cap = cfg->host_cap_pages * 1000;
    int64_t submitted = 0;
    for (int64_t step = 0; step < 200000 && (submitted < requests || !all_gone(&m)); step++) {
        /* bursts: sometimes many arrivals at once */
        int64_t arrivals = rnd(&m) % 10 == 0 ? (int64_t)(rnd(&m) % 12) : (int64_t)(rnd(&m) % 2);
        for (int64_t a = 0; a < arrivals && submitted < requests; a++) {
            int32_t prio = (int32_t)(rnd(&m) % 3);
            int64_t prompt = 1 + (int64_t)(rnd(&m) % (rnd(&m) % 8 == 0 ? 400 : 60));
            int64_t max_new = 1 + (int64_t)(rnd(&m) % (rnd(&m) % 8 == 0 ? 300 : 40));
            int64_t cached = rnd(&m) % 4 == 0 ? (int64_t)(rnd(&m) % (uint64_t)prompt) : 0;
            submit(&m, submitted, prio, prompt, max_new, cached);
            m.q[submitted].cached = cached / cfg->page_size * cfg->page_size;
            if (m.q[submitted].cached == prompt) m.q[submitted].cached -= cfg->page_size;
            submitted++;
        }
        engine_step(&m, step);
        /* the pool is never over budget */
        assert_true(m.free_pages >= 0 && m.free_pages <= cfg->total_pages);
    }
    assert_true(all_gone(&m)); /* liveness: everything ended */
    kvp_sched_stats_t st = {.struct_size = sizeof st};
    assert_int_equal(kvp_sched_stats(m.s, &st), KVP_OK);
    assert_int_equal(st.waiting + st.running + st.swapped, 0);
    assert_int_equal(m.free_pages, cfg->total_pages);
    assert_int_equal(m.host_used, 0);
    for (int64_t i = 0; i < requests; i++) {
        mseq *x = &m.q[i];
        if (x->ended_how != 1 || x->first_token_step < 0) continue;
        int64_t wait = x->first_token_step - x->submitted_step;
        if (x->priority == 2) hi_wait[0] += wait, hi_wait[1]++;
        if (x->priority == 0) lo_wait[0] += wait, lo_wait[1]++;
    }
    kvp_sched_destroy(m.s);
    free(m.q);
}

static void test_random_traces(void **state) {
    (void)state;
    static const trace_cfg cfgs[] = {
        /* page, staging, horizon, actions, pages, host pages, batch, tokens, chunk */
        {16, 0, 32, KVP_SCHED_SWAP | KVP_SCHED_RECOMPUTE | KVP_SCHED_DROP, 300, 2000, 64, 512, 128},
        {16, 1, 32, KVP_SCHED_SWAP | KVP_SCHED_RECOMPUTE | KVP_SCHED_DROP, 300, 100, 64, 512, 64},
        {8, 0, 0, KVP_SCHED_RECOMPUTE, 200, 0, 32, 256, 0},
        {32, 0, 64, KVP_SCHED_SWAP | KVP_SCHED_DROP, 120, 300, 16, 1024, 256},
        {4, 1, 16, KVP_SCHED_DROP, 600, 0, 128, 256, 32},
        {16, 0, 8, KVP_SCHED_SWAP, 400, 1 << 20, 8, 64, 16},
    };
    int64_t hi[2] = {0, 0}, lo[2] = {0, 0};
    for (size_t c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++)
        for (uint64_t seed = 1; seed <= 12; seed++) run_trace(seed * 7919 + c, &cfgs[c], 300, hi, lo);
    /* high priority waits less for its first token than low priority */
    assert_true(hi[1] > 0 && lo[1] > 0);
    double hw = (double)hi[0] / (double)hi[1], lw = (double)lo[0] / (double)lo[1];
    print_message("mean wait to first token: high %.1f steps, low %.1f steps\n", hw, lw);
    assert_true(hw <= lw);
}

/* A request that can never fit is rejected, not queued forever. */
static void test_too_long_rejected(void **state) {
    (void)state;
    kvp_sched_params_t p;
    kvp_sched_params_init(&p);
    p.page_size = 16;
    p.total_pages = 10;
    p.watermark_pages = 0;
    kvp_sched_t *s = NULL;
    assert_int_equal(kvp_sched_create(&p, &s, NULL, 0), KVP_OK);
    kvp_sched_request_t r = {.struct_size = sizeof r, .id = 7, .prompt_tokens = 150,
                             .max_new_tokens = 20};
    assert_int_equal(kvp_sched_submit(s, &r), KVP_OK);
    r.id = 8;
    r.prompt_tokens = 100;
    r.max_new_tokens = 61; /* 160 tokens = exactly 10 pages: fits */
    assert_int_equal(kvp_sched_submit(s, &r), KVP_OK);
    kvp_sched_input_t in = {.struct_size = sizeof in, .free_pages = 10};
    kvp_sched_plan_t pl = {.struct_size = sizeof pl};
    assert_int_equal(kvp_sched_step(s, &in, &pl), KVP_OK);
    assert_int_equal(pl.n_reject, 1);
    assert_int_equal(pl.reject[0].id, 7);
    assert_int_equal(pl.reject[0].reason, KVP_REASON_TOO_LONG);
    assert_int_equal(pl.n_prefill, 1);
    assert_int_equal(pl.prefill[0].id, 8);
    assert_int_equal(pl.prefill[0].tokens, 100);
    kvp_sched_destroy(s);
}

/* The forecast acts before the pool runs dry: with room for now but not for
 * the next `horizon` steps, low priority goes out while decode still fits. */
static void test_forecast_acts_early(void **state) {
    (void)state;
    kvp_sched_params_t p;
    kvp_sched_params_init(&p);
    p.page_size = 16;
    p.total_pages = 64;
    p.watermark_pages = 0;
    p.horizon = 64;
    p.hysteresis = 0;
    p.page_bytes = 4096;
    kvp_sched_t *s = NULL;
    assert_int_equal(kvp_sched_create(&p, &s, NULL, 0), KVP_OK);
    /* two sequences of 16*14 tokens that will each grow by 16*20 tokens */
    for (int64_t id = 0; id < 2; id++) {
        kvp_sched_request_t r = {.struct_size = sizeof r, .id = id, .priority = (int32_t)id,
                                 .prompt_tokens = 16 * 14, .max_new_tokens = 16 * 20};
        assert_int_equal(kvp_sched_submit(s, &r), KVP_OK);
    }
    kvp_sched_input_t in = {.struct_size = sizeof in, .free_pages = 64,
                            .host_free_bytes = 1 << 30};
    kvp_sched_plan_t pl = {.struct_size = sizeof pl};
    assert_int_equal(kvp_sched_step(s, &in, &pl), KVP_OK);
    /* admission respects the forecast: 14 + 4 pages over the horizon each -> both fit 64 */
    assert_int_equal(pl.n_prefill, 2);
    int64_t used = 2 * 14;
    bool swapped = false;
    for (int step = 0; step < 1000 && !swapped; step++) {
        in.free_pages = 64 - used;
        assert_int_equal(kvp_sched_step(s, &in, &pl), KVP_OK);
        if (pl.n_swap_out > 0) {
            swapped = true;
            assert_int_equal(pl.swap_out[0].id, 0); /* the lower priority */
            assert_int_equal(pl.swap_out[0].reason, KVP_REASON_PRESSURE);
            assert_true(in.free_pages > 0); /* acted while pages were still free */
            assert_int_equal(pl.pressure, 1);
        }
        used += pl.pages_needed;
    }
    assert_true(swapped);
    kvp_sched_destroy(s);
}

/* A higher-priority arrival preempts lower-priority work, and nothing of
 * lower priority overtakes it while it waits for the pages. */
static void test_priority_preemption(void **state) {
    (void)state;
    kvp_sched_params_t p;
    kvp_sched_params_init(&p);
    p.page_size = 16;
    p.total_pages = 40;
    p.watermark_pages = 0;
    p.hysteresis = 0;
    p.actions = KVP_SCHED_RECOMPUTE;
    kvp_sched_t *s = NULL;
    assert_int_equal(kvp_sched_create(&p, &s, NULL, 0), KVP_OK);
    kvp_sched_request_t r = {.struct_size = sizeof r, .id = 1, .priority = 0,
                             .prompt_tokens = 16 * 30, .max_new_tokens = 16};
    assert_int_equal(kvp_sched_submit(s, &r), KVP_OK);
    kvp_sched_input_t in = {.struct_size = sizeof in, .free_pages = 40};
    kvp_sched_plan_t pl = {.struct_size = sizeof pl};
    assert_int_equal(kvp_sched_step(s, &in, &pl), KVP_OK);
    assert_int_equal(pl.n_prefill, 1);
    r.id = 2;
    r.priority = 5;
    r.prompt_tokens = 16 * 20;
    assert_int_equal(kvp_sched_submit(s, &r), KVP_OK);
    r.id = 3;
    r.priority = 0;
    r.prompt_tokens = 16;
    assert_int_equal(kvp_sched_submit(s, &r), KVP_OK);
    in.free_pages = 40 - 30;
    assert_int_equal(kvp_sched_step(s, &in, &pl), KVP_OK);
    assert_int_equal(pl.n_preempt, 1);
    assert_int_equal(pl.preempt[0].id, 1);
    assert_int_equal(pl.preempt[0].reason, KVP_REASON_PRIORITY);
    for (int32_t i = 0; i < pl.n_prefill; i++) assert_int_not_equal(pl.prefill[i].id, 3);
    in.free_pages = 40;
    assert_int_equal(kvp_sched_step(s, &in, &pl), KVP_OK);
    assert_true(pl.n_prefill >= 1);
    assert_int_equal(pl.prefill[0].id, 2);
    kvp_sched_destroy(s);
}

static void test_deadlines_and_queue_delay(void **state) {
    (void)state;
    kvp_sched_params_t p;
    kvp_sched_params_init(&p);
    p.page_size = 16;
    p.total_pages = 4;
    p.watermark_pages = 0;
    p.max_queue_delay = 100;
    kvp_sched_t *s = NULL;
    assert_int_equal(kvp_sched_create(&p, &s, NULL, 0), KVP_OK);
    kvp_sched_request_t r = {.struct_size = sizeof r, .id = 1, .prompt_tokens = 40,
                             .max_new_tokens = 20, .arrival = 0, .deadline = 50};
    assert_int_equal(kvp_sched_submit(s, &r), KVP_OK);
    r.id = 2;
    r.deadline = 0;
    assert_int_equal(kvp_sched_submit(s, &r), KVP_OK); /* waits: no room for both */
    kvp_sched_input_t in = {.struct_size = sizeof in, .free_pages = 4, .now = 10};
    kvp_sched_plan_t pl = {.struct_size = sizeof pl};
    assert_int_equal(kvp_sched_step(s, &in, &pl), KVP_OK);
    assert_int_equal(pl.n_prefill, 1);
    assert_int_equal(pl.prefill[0].id, 1);
    in.free_pages = 1;
    in.now = 60; /* request 1 is past its deadline */
    assert_int_equal(kvp_sched_step(s, &in, &pl), KVP_OK);
    assert_int_equal(pl.n_drop, 1);
    assert_int_equal(pl.drop[0].id, 1);
    assert_int_equal(pl.drop[0].reason, KVP_REASON_DEADLINE);
    in.free_pages = 0;
    in.now = 200; /* request 2 has waited longer than max_queue_delay */
    assert_int_equal(kvp_sched_step(s, &in, &pl), KVP_OK);
    assert_int_equal(pl.n_reject, 1);
    assert_int_equal(pl.reject[0].id, 2);
    assert_int_equal(pl.reject[0].reason, KVP_REASON_OVERLOAD);
    kvp_sched_destroy(s);
}

static void test_bad_input(void **state) {
    (void)state;
    char err[KVP_ERR_SIZE];
    kvp_sched_params_t p;
    kvp_sched_params_init(&p);
    kvp_sched_t *s = NULL;
    assert_int_equal(kvp_sched_create(&p, &s, err, sizeof err), KVP_EINVAL); /* page_size 0 */
    assert_non_null(strstr(err, "page_size"));
    p.page_size = 16;
    assert_int_equal(kvp_sched_create(&p, &s, err, sizeof err), KVP_EINVAL);
    assert_non_null(strstr(err, "total_pages"));
    p.total_pages = 100;
    p.actions = 0;
    assert_int_equal(kvp_sched_create(&p, &s, err, sizeof err), KVP_EINVAL);
    p.actions = 8;
    assert_int_equal(kvp_sched_create(&p, &s, err, sizeof err), KVP_EINVAL);
    p.actions = KVP_SCHED_SWAP;
    p.watermark_pages = 100;
    assert_int_equal(kvp_sched_create(&p, &s, err, sizeof err), KVP_EINVAL);
    p.watermark_pages = -1;
    p.host_bytes_per_s = 0;
    assert_int_equal(kvp_sched_create(&p, &s, err, sizeof err), KVP_EINVAL);
    p.host_bytes_per_s = 1e9;
    assert_int_equal(kvp_sched_create(&p, NULL, err, sizeof err), KVP_EINVAL);
    assert_null(s);
    p.max_requests = 2;
    assert_int_equal(kvp_sched_create(&p, &s, err, sizeof err), KVP_OK);

    kvp_sched_request_t r = {.struct_size = sizeof r, .id = 1, .prompt_tokens = 10,
                             .max_new_tokens = 5};
    kvp_sched_request_t bad = r;
    bad.prompt_tokens = 0;
    assert_int_equal(kvp_sched_submit(s, &bad), KVP_EINVAL);
    bad = r;
    bad.max_new_tokens = -1;
    assert_int_equal(kvp_sched_submit(s, &bad), KVP_EINVAL);
    bad = r;
    bad.cached_tokens = 11;
    assert_int_equal(kvp_sched_submit(s, &bad), KVP_EINVAL);
    bad = r;
    bad.struct_size = 4;
    assert_int_equal(kvp_sched_submit(s, &bad), KVP_EINVAL);
    assert_int_equal(kvp_sched_submit(s, NULL), KVP_EINVAL);
    assert_int_equal(kvp_sched_submit(s, &r), KVP_OK);
    assert_int_equal(kvp_sched_submit(s, &r), KVP_EINVAL); /* duplicate id */
    assert_non_null(strstr(kvp_sched_last_error(s), "already live"));
    r.id = 2;
    assert_int_equal(kvp_sched_submit(s, &r), KVP_OK);
    r.id = 3;
    assert_int_equal(kvp_sched_submit(s, &r), KVP_ENOSPC); /* table full */
    assert_int_equal(kvp_sched_finish(s, 99), KVP_ENOENT);
    assert_int_equal(kvp_sched_finish(s, 2), KVP_OK);
    assert_int_equal(kvp_sched_finish(s, 2), KVP_ENOENT); /* double finish */
    assert_int_equal(kvp_sched_submit(s, &r), KVP_OK);     /* the slot is reused */

    kvp_sched_input_t in = {.struct_size = sizeof in, .free_pages = -1};
    kvp_sched_plan_t pl = {.struct_size = sizeof pl};
    assert_int_equal(kvp_sched_step(s, &in, &pl), KVP_EINVAL);
    in.free_pages = 10;
    pl.struct_size = 8;
    assert_int_equal(kvp_sched_step(s, &in, &pl), KVP_EINVAL);
    assert_int_equal(kvp_sched_step(NULL, &in, &pl), KVP_EINVAL);
    kvp_sched_stats_t st = {.struct_size = sizeof st};
    assert_int_equal(kvp_sched_stats(s, &st), KVP_OK);
    assert_int_equal(st.waiting, 2);
    kvp_sched_destroy(s);
    kvp_sched_destroy(NULL);
    assert_string_equal(kvp_sched_last_error(NULL), "NULL handle");
}

/* Every allocation made by create can fail; nothing leaks. */
static void test_allocation_failures(void **state) {
    (void)state;
    kvp_sched_params_t p;
    kvp_sched_params_init(&p);
    p.page_size = 16;
    p.total_pages = 100;
    test_alloc_state st = {0, -1, 0, 0};
    p.allocator = test_allocator(&st);
    kvp_sched_t *s = NULL;
    assert_int_equal(kvp_sched_create(&p, &s, NULL, 0), KVP_OK);
    long calls = st.calls;
    kvp_sched_destroy(s);
    assert_int_equal(st.live, 0);
    for (long k = 0; k < calls; k++) {
        st.calls = 0;
        st.fail_at = k;
        s = NULL;
        assert_int_equal(kvp_sched_create(&p, &s, NULL, 0), KVP_ENOMEM);
        assert_null(s);
        assert_int_equal(st.live, 0);
    }
}

/* The detail text: "" until a call fails, kept (sticky) through calls that
 * succeed, replaced by the next failure; "NULL handle" for NULL. */
static void test_last_error_is_sticky(void **state) {
    (void)state;
    assert_string_equal(kvp_sched_last_error(NULL), "NULL handle");
    kvp_sched_params_t p;
    kvp_sched_params_init(&p);
    p.page_size = 16;
    p.total_pages = 100;
    kvp_sched_t *s = NULL;
    assert_int_equal(kvp_sched_create(&p, &s, NULL, 0), KVP_OK);
    assert_string_equal(kvp_sched_last_error(s), "");
    kvp_sched_request_t r = {.struct_size = sizeof r, .id = 1, .prompt_tokens = 10,
                             .max_new_tokens = 5};
    assert_int_equal(kvp_sched_submit(s, &r), KVP_OK);
    assert_string_equal(kvp_sched_last_error(s), "");
    assert_int_equal(kvp_sched_submit(s, &r), KVP_EINVAL); /* duplicate id */
    char first[KVP_ERR_SIZE];
    snprintf(first, sizeof first, "%s", kvp_sched_last_error(s));
    assert_non_null(strstr(first, "already live"));
    /* successful calls leave it as it was */
    r.id = 2;
    assert_int_equal(kvp_sched_submit(s, &r), KVP_OK);
    kvp_sched_input_t in = {.struct_size = sizeof in, .free_pages = 100};
    kvp_sched_plan_t pl = {.struct_size = sizeof pl};
    assert_int_equal(kvp_sched_step(s, &in, &pl), KVP_OK);
    kvp_sched_stats_t st = {.struct_size = sizeof st};
    assert_int_equal(kvp_sched_stats(s, &st), KVP_OK);
    assert_int_equal(kvp_sched_finish(s, 2), KVP_OK);
    assert_string_equal(kvp_sched_last_error(s), first);
    /* the next failure replaces it */
    assert_int_equal(kvp_sched_finish(s, 2), KVP_ENOENT);
    assert_true(strlen(kvp_sched_last_error(s)) > 0);
    assert_string_not_equal(kvp_sched_last_error(s), first);
    kvp_sched_destroy(s);
}

/* Times and sizes at the int64 limits: refused with a message and nothing
 * changed, or planned without overflow (arrivals later than `now`, `now`
 * going back, free pages above the pool, page bytes that overflow). */
static void test_extreme_times_and_sizes(void **state) {
    (void)state;
    kvp_sched_params_t p;
    kvp_sched_params_init(&p);
    p.page_size = 16;
    p.total_pages = INT64_MAX; /* above the documented 2^36 */
    kvp_sched_t *s = NULL;
    char err[KVP_ERR_SIZE];
    assert_int_equal(kvp_sched_create(&p, &s, err, sizeof err), KVP_EINVAL);
    assert_non_null(strstr(err, "total_pages"));
    p.total_pages = 100;
    p.max_queue_delay = 10;
    p.page_bytes = UINT64_MAX / 2; /* host bytes of a sequence overflow 64 bits */
    p.hysteresis = 0;
    assert_int_equal(kvp_sched_create(&p, &s, err, sizeof err), KVP_OK);

    kvp_sched_stats_t before = {.struct_size = sizeof before}, after = before;
    assert_int_equal(kvp_sched_stats(s, &before), KVP_OK);
    kvp_sched_request_t r = {.struct_size = sizeof r, .id = 1, .prompt_tokens = 10,
                             .max_new_tokens = 5, .arrival = INT64_MIN};
    assert_int_equal(kvp_sched_submit(s, &r), KVP_EINVAL);
    assert_non_null(strstr(kvp_sched_last_error(s), "arrival"));
    r.arrival = 0;
    r.prompt_tokens = INT64_MAX;
    assert_int_equal(kvp_sched_submit(s, &r), KVP_EINVAL);
    r.prompt_tokens = 10;
    r.max_new_tokens = INT64_MAX / 4 + 1;
    assert_int_equal(kvp_sched_submit(s, &r), KVP_EINVAL);
    assert_int_equal(kvp_sched_stats(s, &after), KVP_OK);
    assert_memory_equal(&before, &after, sizeof before);

    /* an arrival at INT64_MAX (later than any now) has not waited */
    r.max_new_tokens = 5;
    r.arrival = INT64_MAX;
    assert_int_equal(kvp_sched_submit(s, &r), KVP_OK);
    /* a request of the largest size: rejected as too long, no overflow */
    kvp_sched_request_t big = r;
    big.id = 2;
    big.arrival = 0;
    big.prompt_tokens = INT64_MAX / 4;
    big.max_new_tokens = INT64_MAX / 4;
    assert_int_equal(kvp_sched_submit(s, &big), KVP_OK);

    kvp_sched_input_t in = {.struct_size = sizeof in, .free_pages = 0, .now = -1};
    kvp_sched_plan_t pl = {.struct_size = sizeof pl};
    assert_int_equal(kvp_sched_stats(s, &before), KVP_OK);
    assert_int_equal(kvp_sched_step(s, &in, &pl), KVP_EINVAL);
    assert_non_null(strstr(kvp_sched_last_error(s), "now"));
    in.now = 0;
    in.reserved_ = 1;
    assert_int_equal(kvp_sched_step(s, &in, &pl), KVP_EINVAL);
    assert_non_null(strstr(kvp_sched_last_error(s), "reserved_"));
    assert_int_equal(kvp_sched_stats(s, &after), KVP_OK);
    assert_memory_equal(&before, &after, sizeof before);

    in.reserved_ = 0;
    in.now = INT64_MAX; /* INT64_MAX - INT64_MAX: no overflow, not stale */
    assert_int_equal(kvp_sched_step(s, &in, &pl), KVP_OK);
    assert_int_equal(pl.n_reject, 1);
    assert_true(pl.reject[0].id == 2 && pl.reject[0].reason == KVP_REASON_TOO_LONG);
    in.now = 0; /* time went back: request 1 arrived "later", so it has not waited */
    in.free_pages = INT64_MAX; /* counts as the pool's 100 pages */
    in.host_free_bytes = UINT64_MAX;
    assert_int_equal(kvp_sched_step(s, &in, &pl), KVP_OK);
    assert_int_equal(pl.n_reject, 0);
    assert_int_equal(pl.n_prefill, 1);
    assert_true(pl.pages_needed <= 100);
    /* pressure with host bytes that overflow 64 bits: recompute, not swap */
    in.free_pages = 0;
    for (int i = 0; i < 20 && pl.n_swap_out + pl.n_preempt + pl.n_drop == 0; i++)
        assert_int_equal(kvp_sched_step(s, &in, &pl), KVP_OK);
    assert_int_equal(pl.n_swap_out, 0);
    assert_int_equal(pl.n_preempt, 1);
    kvp_sched_destroy(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_traces),
        cmocka_unit_test(test_too_long_rejected),
        cmocka_unit_test(test_forecast_acts_early),
        cmocka_unit_test(test_priority_preemption),
        cmocka_unit_test(test_deadlines_and_queue_delay),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_allocation_failures),
        cmocka_unit_test(test_last_error_is_sticky),
        cmocka_unit_test(test_extreme_times_and_sizes),
    };
    return cmocka_run_group_tests_name("sched", tests, NULL, NULL);
}
