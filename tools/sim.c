/*
 * kvpage-sim's engine. Each strategy is an engine loop around the real
 * library objects: the pool and page table hold every sequence's pages
 * (kvp_table_reserve + kvp_table_append each step, exactly as an engine
 * calls them), the host tier swaps sequences out and back, and the scheduler
 * plans every step of the paged strategies. Only the tensors are missing:
 * a step's duration comes from a cost model of the bytes and flops it moves.
 *
 * Cost model (one step):
 *   overhead + max(device bytes / device bandwidth, flops / matmul rate)
 *            + swap bytes / host-link bandwidth
 * device bytes = the weights (once per step that computes anything) + the
 * K/V every decoded token and prefill chunk reads, at the format's stored
 * bytes (sealed pages at page_bytes/P per token, staging tokens at fp16);
 * flops = 2 x params per token processed + attention (4 x layers x q_heads x
 * head_dim per query-key pair). Swaps are not overlapped with compute.
 */
#define _DEFAULT_SOURCE /* mmap's MAP_ANONYMOUS and MAP_NORESERVE */
#include "sim.h"

#include "kvpage.h"
#include "kvpage_plan.h"
#include "kvpage_sched.h"
#include "kvpage_tier.h"
#include "paging.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

const char *const sim_strategy_names[SIM_NSTRATEGIES] = {"static", "paged", "paged-int8",
                                                         "paged-int4", "full"};
const char *const sim_preset_names[] = {"long-context", "burst", "mixed", NULL};

#if defined(__GNUC__) || defined(__clang__)
__attribute__((format(printf, 3, 4)))
#endif
static int errf(char *err, size_t size, const char *fmt, ...);
static int errf(char *err, size_t size, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (err && size) vsnprintf(err, size, fmt, ap);
    va_end(ap);
    return -1;
}

/* ---- random numbers (splitmix64: a seed gives the same trace everywhere) ---- */

typedef struct {
    uint64_t s;
} rng_t;

static uint64_t rng_next(rng_t *r) {
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double rng_unit(rng_t *r) { return (double)(rng_next(r) >> 11) * 0x1.0p-53; }

static double rng_exp(rng_t *r, double rate) { return -log(1.0 - rng_unit(r)) / rate; }

static double rng_normal(rng_t *r) {
    double u1 = 1.0 - rng_unit(r), u2 = rng_unit(r);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

static int64_t clamp64(double x, int64_t lo, int64_t hi) {
    if (!(x >= (double)lo)) return lo;
    if (x > (double)hi) return hi;
    return (int64_t)x;
}

static int64_t lognormal(rng_t *r, double median, double sigma, int64_t lo, int64_t hi) {
    return clamp64(median * exp(sigma * rng_normal(r)), lo, hi);
}

/* ---- traces ------------------------------------------------------------------ */

/* At most this many requests in a trace: the scheduler tracks at most 2^24. */
#define SIM_MAX_REQUESTS (INT64_C(1) << 24)

static int trace_add(sim_trace *t, int64_t *cap, sim_request q) {
    if (t->n >= SIM_MAX_REQUESTS) return -1;
    if (t->n == *cap) {
        int64_t ncap = *cap ? *cap * 2 : 1024;
        sim_request *nr = realloc(t->r, (size_t)ncap * sizeof *nr);
        if (nr == NULL) return -1;
        t->r = nr;
        *cap = ncap;
    }
    t->r[t->n++] = q;
    return 0;
}

/* Stable merge sort by arrival: requests arriving together keep file order. */
static void sort_trace(sim_request *a, sim_request *tmp, int64_t n) {
    if (n < 2) return;
    int64_t h = n / 2;
    sort_trace(a, tmp, h);
    sort_trace(a + h, tmp, n - h);
    int64_t i = 0, j = h, k = 0;
    while (i < h && j < n) tmp[k++] = a[j].arrival < a[i].arrival ? a[j++] : a[i++];
    while (i < h) tmp[k++] = a[i++];
    while (j < n) tmp[k++] = a[j++];
    memcpy(a, tmp, (size_t)n * sizeof *a);
}

static int finish_trace(sim_trace *t, char *err, size_t err_size) {
    if (t->n == 0) return errf(err, err_size, "the trace has no requests");
    sim_request *tmp = malloc((size_t)t->n * sizeof *tmp);
    if (tmp == NULL) return errf(err, err_size, "out of memory sorting the trace");
    sort_trace(t->r, tmp, t->n);
    free(tmp);
    if (t->duration <= 0) t->duration = t->r[t->n - 1].arrival;
    return 0;
}

/* Chat traffic: a steady Poisson rate with sudden spikes of 10-20x lasting
 * about 10 s. Prompts log-normal (median 700 tokens), outputs log-normal
 * (median 220), max_new_tokens 2048. With classes, a quarter is
 * interactive (priority 2), the rest normal (1); otherwise all are 1. */
static int gen_chat(sim_trace *t, int64_t *cap, rng_t *r, double duration, double rate,
                    bool classes) {
    double spike_at = 30.0 + 30.0 * rng_unit(r);
    double at = 0.0;
    while (at < duration) {
        bool spike = at >= spike_at;
        double factor = spike ? 10.0 + 10.0 * rng_unit(r) : 1.0;
        double end = spike ? spike_at + 8.0 + 4.0 * rng_unit(r) : spike_at;
        if (end > duration) end = duration;
        for (double x = at + rng_exp(r, rate * factor); x < end; x += rng_exp(r, rate * factor)) {
            sim_request q;
            q.arrival = x;
            q.prompt = lognormal(r, 700, 0.9, 16, 8192);
            q.output = lognormal(r, 220, 0.8, 4, 2048);
            q.max_new = 2048;
            q.priority = classes ? (rng_unit(r) < 0.25 ? 2 : 1) : 1;
            if (trace_add(t, cap, q)) return -1;
        }
        at = end;
        if (spike) spike_at = end + 60.0 + 40.0 * rng_unit(r);
    }
    return 0;
}

/* Long documents: Poisson arrivals, prompts log-uniform in 32k..124k tokens
 * (so prompt + max_new_tokens fit a 128k context), long-form outputs
 * log-normal (median 1000), max_new_tokens 4096. */
static int gen_long(sim_trace *t, int64_t *cap, rng_t *r, double duration, double rate,
                    int32_t priority) {
    for (double x = rng_exp(r, rate); x < duration; x += rng_exp(r, rate)) {
        sim_request q;
        q.arrival = x;
        q.prompt = clamp64(exp(log(32768.0) + (log(126976.0) - log(32768.0)) * rng_unit(r)),
                           32768, 126976);
        q.output = lognormal(r, 1000, 0.6, 64, 4096);
        q.max_new = 4096;
        q.priority = priority;
        if (trace_add(t, cap, q)) return -1;
    }
    return 0;
}

int sim_trace_preset(const char *name, uint64_t seed, double scale, double load, sim_trace *out,
                     char *err, size_t err_size) {
    sim_trace t = {NULL, 0, 0};
    int64_t cap = 0;
    rng_t r = {seed * 0x9e3779b97f4a7c15ull ^ 0x6b7670616765ull};
    int rc;
    if (!(scale > 0) || !(load > 0)) return errf(err, err_size, "scale and load must be > 0");
    if (!strcmp(name, "long-context")) {
        t.duration = 120.0 * scale;
        rc = gen_long(&t, &cap, &r, t.duration, load / 4.0, 1);
    } else if (!strcmp(name, "burst")) {
        t.duration = 300.0 * scale;
        rc = gen_chat(&t, &cap, &r, t.duration, 6.0 * load, false);
    } else if (!strcmp(name, "mixed")) {
        t.duration = 300.0 * scale;
        rc = gen_chat(&t, &cap, &r, t.duration, 4.0 * load, true);
        rng_t r2 = {r.s ^ 0x4c4f4e47ull};
        if (rc == 0) rc = gen_long(&t, &cap, &r2, t.duration, load / 12.0, 0);
    } else {
        return errf(err, err_size, "unknown preset '%s' (long-context, burst, mixed)", name);
    }
    if (rc != 0) {
        free(t.r);
        return errf(err, err_size, t.n >= SIM_MAX_REQUESTS
                                       ? "the trace would exceed %lld requests (lower --scale "
                                         "or --load)"
                                       : "out of memory generating the trace (%lld requests)",
                    (long long)(t.n >= SIM_MAX_REQUESTS ? SIM_MAX_REQUESTS : t.n));
    }
    if (finish_trace(&t, err, err_size)) {
        free(t.r);
        return -1;
    }
    *out = t;
    return 0;
}

void sim_trace_free(sim_trace *t) {
    if (t == NULL) return;
    free(t->r);
    t->r = NULL;
    t->n = 0;
}

/* ---- trace files -------------------------------------------------------------- */

static char *trim(char *s) {
    while (*s == ' ' || *s == '\t') s++;
    char *e = s + strlen(s);
    while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r' || e[-1] == '\n')) *--e = 0;
    return s;
}

static bool parse_num(const char *s, double *v) {
    char *end;
    errno = 0;
    *v = strtod(s, &end);
    return end != s && *end == 0 && errno != ERANGE && isfinite(*v);
}

/* Validate and add one request read from line `line`. */
static int add_checked(sim_trace *t, int64_t *cap, const char *path, long line, const double v[5],
                       bool has_max, char *err, size_t err_size) {
    static const char *const names[] = {"arrival", "prompt_tokens", "output_tokens", "priority",
                                        "max_new_tokens"};
    /* finite and at most 1e9 s: arrivals become int64 microseconds */
    if (!(v[0] >= 0 && v[0] <= 1e9))
        return errf(err, err_size, "%s:%ld: arrival must be 0..1e9 seconds, got %g", path, line,
                    v[0]);
    for (int k = 1; k < 5; k++) {
        if (k == 4 && !has_max) continue;
        double lo = k == 3 ? -2147483648.0 : 1.0, hi = k == 3 ? 2147483647.0 : 1e9;
        if (v[k] != floor(v[k]) || v[k] < lo || v[k] > hi)
            return errf(err, err_size, "%s:%ld: %s must be a whole number in %.0f..%.0f, got %g",
                        path, line, names[k], lo, hi, v[k]);
    }
    sim_request q;
    q.arrival = v[0];
    q.prompt = (int64_t)v[1];
    q.output = (int64_t)v[2];
    q.priority = (int32_t)v[3];
    q.max_new = has_max ? (int64_t)v[4] : q.output;
    if (q.max_new < q.output)
        return errf(err, err_size, "%s:%ld: max_new_tokens (%lld) is below output_tokens (%lld)",
                    path, line, (long long)q.max_new, (long long)q.output);
    if (trace_add(t, cap, q))
        return errf(err, err_size, "%s:%ld: %s", path, line,
                    t->n >= SIM_MAX_REQUESTS ? "more than 16777216 requests" : "out of memory");
    return 0;
}

/* One CSV line: arrival,prompt_tokens,output_tokens,priority[,max_new_tokens] */
static int csv_line(sim_trace *t, int64_t *cap, const char *path, long line, char *s, char *err,
                    size_t err_size) {
    double v[5] = {0, 0, 0, 0, 0};
    int k = 0;
    for (char *f = s;; k++) {
        char *comma = strchr(f, ',');
        if (comma) *comma = 0;
        if (k >= 5)
            return errf(err, err_size, "%s:%ld: more than 5 fields (arrival, prompt_tokens, "
                        "output_tokens, priority, max_new_tokens)", path, line);
        if (!parse_num(trim(f), &v[k]))
            return errf(err, err_size, "%s:%ld: field %d ('%s') is not a number", path, line,
                        k + 1, trim(f));
        if (!comma) break;
        f = comma + 1;
    }
    if (k < 3)
        return errf(err, err_size, "%s:%ld: %d fields; need arrival, prompt_tokens, "
                    "output_tokens, priority", path, line, k + 1);
    return add_checked(t, cap, path, line, v, k == 4, err, err_size);
}

/* One JSONL line: a flat object; numeric keys arrival (or arrival_s),
 * prompt_tokens, output_tokens, priority, max_new_tokens; others ignored. */
static int jsonl_line(sim_trace *t, int64_t *cap, const char *path, long line, const char *s,
                      char *err, size_t err_size) {
    static const char *const keys[] = {"arrival", "prompt_tokens", "output_tokens", "priority",
                                       "max_new_tokens"};
    double v[5] = {0, 0, 0, 0, 0};
    bool seen[5] = {false, false, false, false, false};
    const char *p = s;
#define WS() while (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n') p++
    WS();
    if (*p++ != '{') return errf(err, err_size, "%s:%ld: expected a JSON object", path, line);
    WS();
    while (*p != '}') {
        if (*p++ != '"') return errf(err, err_size, "%s:%ld: expected a key", path, line);
        const char *k0 = p;
        while (*p && *p != '"') p++;
        if (!*p) return errf(err, err_size, "%s:%ld: unterminated key", path, line);
        size_t klen = (size_t)(p - k0);
        p++;
        WS();
        if (*p++ != ':') return errf(err, err_size, "%s:%ld: expected ':'", path, line);
        WS();
        int which = -1;
        for (int k = 0; k < 5; k++)
            if (strlen(keys[k]) == klen && !strncmp(k0, keys[k], klen)) which = k;
        if (klen == 9 && !strncmp(k0, "arrival_s", 9)) which = 0;
        if (*p == '"') { /* a string value: allowed for keys we ignore */
            if (which >= 0)
                return errf(err, err_size, "%s:%ld: %s must be a number", path, line, keys[which]);
            p++;
            while (*p && *p != '"') p += (*p == '\\' && p[1]) ? 2 : 1;
            if (!*p) return errf(err, err_size, "%s:%ld: unterminated string", path, line);
            p++;
        } else {
            char *end;
            double x = strtod(p, &end);
            if (end == p) {
                if (!strncmp(p, "true", 4) || !strncmp(p, "null", 4)) end = (char *)(uintptr_t)p + 4;
                else if (!strncmp(p, "false", 5)) end = (char *)(uintptr_t)p + 5;
                else return errf(err, err_size, "%s:%ld: bad value", path, line);
                if (which >= 0)
                    return errf(err, err_size, "%s:%ld: %s must be a number", path, line,
                                keys[which]);
            } else if (which >= 0) {
                v[which] = x;
                seen[which] = true;
            }
            p = end;
        }
        WS();
        if (*p == ',') {
            p++;
            WS();
        } else if (*p != '}') {
            return errf(err, err_size, "%s:%ld: expected ',' or '}'", path, line);
        }
    }
    p++;
    WS();
#undef WS
    if (*p) return errf(err, err_size, "%s:%ld: text after the object", path, line);
    for (int k = 0; k < 4; k++)
        if (!seen[k] && k != 3)
            return errf(err, err_size, "%s:%ld: missing \"%s\"", path, line, keys[k]);
    return add_checked(t, cap, path, line, v, seen[4], err, err_size);
}

int sim_trace_load(const char *path, sim_trace *out, char *err, size_t err_size) {
    FILE *f = fopen(path, "r");
    if (f == NULL) return errf(err, err_size, "cannot open %s: %s", path, strerror(errno));
    sim_trace t = {NULL, 0, 0};
    int64_t cap = 0;
    char buf[4096];
    long line = 0;
    int rc = 0;
    bool first = true;
    while (rc == 0 && fgets(buf, sizeof buf, f)) {
        line++;
        if (strlen(buf) == sizeof buf - 1 && buf[sizeof buf - 2] != '\n') {
            rc = errf(err, err_size, "%s:%ld: line too long", path, line);
            break;
        }
        char *s = trim(buf);
        if (*s == 0 || *s == '#') continue;
        if (*s == '{') rc = jsonl_line(&t, &cap, path, line, s, err, err_size);
        else if (first && !((*s >= '0' && *s <= '9') || *s == '.' || *s == '-')) rc = 0; /* header */
        else rc = csv_line(&t, &cap, path, line, s, err, err_size);
        first = false;
    }
    if (rc == 0 && ferror(f)) rc = errf(err, err_size, "cannot read %s", path);
    fclose(f);
    if (rc == 0) rc = finish_trace(&t, err, err_size);
    if (rc != 0) {
        free(t.r);
        return -1;
    }
    *out = t;
    return 0;
}

int sim_trace_save(const sim_trace *t, const char *path, char *err, size_t err_size) {
    FILE *f = fopen(path, "w");
    if (f == NULL) return errf(err, err_size, "cannot write %s: %s", path, strerror(errno));
    fprintf(f, "arrival_s,prompt_tokens,output_tokens,priority,max_new_tokens\n");
    for (int64_t i = 0; i < t->n; i++)
        fprintf(f, "%.17g,%lld,%lld,%d,%lld\n", t->r[i].arrival, (long long)t->r[i].prompt,
                (long long)t->r[i].output, (int)t->r[i].priority, (long long)t->r[i].max_new);
    if (fclose(f) != 0) return errf(err, err_size, "cannot write %s", path);
    return 0;
}

/* ---- configuration -------------------------------------------------------------- */

void sim_config_default(sim_config *c) {
    memset(c, 0, sizeof *c);
    c->page_size = 16;
    c->device_gbps = 3350;
    c->host_gbps = 25;
    c->tflops = 400;
    c->step_overhead_s = 0.0005;
    c->max_batch = 256;
    c->token_budget = 2048;
    c->prefill_chunk = 2048;
    c->horizon = 64;
    c->hysteresis = 16;
    c->drop_below = INT32_MIN;
    c->full_k = KVP_FORMAT_INT8;
    c->full_v = KVP_FORMAT_INT4;
    c->drain_s = 600;
}

/* ---- the engine ------------------------------------------------------------------ */

enum { RQ_FUTURE, RQ_QUEUED, RQ_ACTIVE, RQ_SWAPPED, RQ_DONE, RQ_DROPPED, RQ_REJECTED, RQ_FAILED };

typedef struct {
    int32_t seq;       /* table sequence, or -1 */
    int32_t state;
    int64_t kv_len, generated;
    double first_token, done;
} rq_t;

typedef struct {
    double bytes, flops, host_bytes;
    bool work;
} step_cost;

typedef struct {
    const sim_config *c;
    const sim_trace *tr;
    sim_result *res;
    kvp_layout_t L;
    kvp_pool_t *pool;
    kvp_table_t *table;
    kvp_tier_t *tier;
    kvp_sched_t *sched;
    rq_t *rq;
    kvp_page_op_t *ops;
    int32_t ops_cap;
    uint64_t slot_bytes;
    double now, t0;
    int64_t next;      /* next request to arrive */
    int64_t ended;
    step_cost cost;
    double *util_u, *util_w;
    int64_t nutil, cap_util, cap_series;
    int64_t *prod;     /* requests that produce a token this step [max_batch] */
    int64_t *fin;      /* requests to finish in the scheduler after a plan [requests]:
                          each fails at most once */
    int64_t nfin;
    char *err;
    size_t err_size;
} eng_t;

static double kv_bytes(const eng_t *e, int64_t len) {
    int64_t P = e->L.page_size;
    double tail = (double)(e->L.needs_staging ? e->L.staging_page_bytes : e->L.page_bytes) / (double)P;
    return (double)(len / P) * (double)e->L.page_bytes + (double)(len % P) * tail;
}

static double attn_flops(const sim_config *c) {
    return 4.0 * c->layers * (double)(c->q_heads ? c->q_heads : c->kv_heads) * c->head_dim;
}

/* Cost of processing tokens [start, start + n) of a sequence. */
static void add_tokens(eng_t *e, int64_t start, int64_t n) {
    const sim_config *c = e->c;
    e->cost.work = true;
    e->cost.flops += 2.0 * (double)c->params * (double)n;
    e->cost.flops += attn_flops(c) * ((double)n * (double)start + (double)n * (double)(n + 1) / 2);
    e->cost.bytes += kv_bytes(e, start + n);
}

static double step_seconds(const eng_t *e) {
    const sim_config *c = e->c;
    if (!e->cost.work && e->cost.host_bytes == 0) return 0;
    double mem = (e->cost.work ? (double)c->weight_bytes : 0) + e->cost.bytes;
    double t = mem / (c->device_gbps * 1e9);
    double f = e->cost.flops / (c->tflops * 1e12);
    return c->step_overhead_s + (t > f ? t : f) + e->cost.host_bytes / (c->host_gbps * 1e9);
}

static void end_request(eng_t *e, int64_t i, int32_t state, double t) {
    rq_t *q = &e->rq[i];
    q->state = state;
    q->done = t;
    e->ended++;
    switch (state) {
    case RQ_DONE:
        e->res->completed++;
        e->res->output_tokens += e->tr->r[i].output;
        break;
    case RQ_DROPPED: e->res->dropped++; break;
    case RQ_REJECTED: e->res->rejected++; break;
    default: e->res->failed++; break;
    }
}

/* Free a request's pages (resident or swapped out). */
static void release(eng_t *e, int64_t i) {
    rq_t *q = &e->rq[i];
    if (q->seq < 0) return;
    if (q->state == RQ_SWAPPED) kvp_tier_drop(e->tier, q->seq);
    else kvp_table_seq_release(e->table, q->seq);
    q->seq = -1;
    q->kv_len = 0;
}

/* An allocation the plan promised failed: a real engine would crash. Count
 * it, fail the request and go on. */
static void oom(eng_t *e, int64_t i) {
    e->res->oom++;
    if (e->sched) e->fin[e->nfin++] = i; /* told after the plan: its lists stay valid */
    release(e, i);
    end_request(e, i, RQ_FAILED, e->now);
}

/* Reserve and append `n` tokens, as an engine does each step (static
 * appends inside the slot it reserved at admission: a reservation is set,
 * not added to, so reserving again would give the slot back). */
static bool grow(eng_t *e, int64_t i, int64_t n) {
    rq_t *q = &e->rq[i];
    int32_t nops = 0;
    bool slot = e->sched == NULL;
    if ((!slot && kvp_table_reserve(e->table, q->seq, n) != KVP_OK) ||
        kvp_table_append(e->table, q->seq, n, NULL, NULL, e->ops, e->ops_cap, &nops) != KVP_OK) {
        oom(e, i);
        return false;
    }
    add_tokens(e, q->kv_len, n);
    q->kv_len += n;
    return true;
}

/* A token was produced: the first (after prefill) or the next (decode). */
static void produced(eng_t *e, int64_t i, double t_end) {
    rq_t *q = &e->rq[i];
    if (q->generated++ == 0) q->first_token = t_end;
    if (q->generated >= e->tr->r[i].output) { /* EOS */
        if (e->sched) kvp_sched_finish(e->sched, i);
        release(e, i);
        end_request(e, i, RQ_DONE, t_end);
    }
}

static uint64_t op_bytes(const eng_t *e, const kvp_page_op_t *op) {
    int32_t page = op->kind == KVP_OP_SWAP_OUT ? op->src : op->dst;
    if (page < e->pool->num_pages) return e->L.page_bytes;
    uint64_t off = (uint64_t)op->row * e->slot_bytes, left = e->L.staging_page_bytes - off;
    return left < e->slot_bytes ? left : e->slot_bytes;
}

static void add_host_bytes(eng_t *e, int32_t nops) {
    for (int32_t k = 0; k < nops; k++) {
        double b = (double)op_bytes(e, &e->ops[k]);
        e->cost.host_bytes += b;
        e->res->swap_gib += b / (1024.0 * 1024.0 * 1024.0);
    }
}

static int push_util(eng_t *e, double u, double w) {
    if (e->nutil == e->cap_util) {
        int64_t cap = e->cap_util ? e->cap_util * 2 : 4096;
        double *nu = realloc(e->util_u, (size_t)cap * sizeof *nu);
        if (nu) e->util_u = nu;
        double *nw = realloc(e->util_w, (size_t)cap * sizeof *nw);
        if (nw) e->util_w = nw;
        if (!nu || !nw) return -1;
        e->cap_util = cap;
    }
    e->util_u[e->nutil] = u;
    e->util_w[e->nutil++] = w;
    return 0;
}

static int push_sample(eng_t *e, double t, double mem, double host, int64_t queue) {
    sim_result *r = e->res;
    if (r->nseries == e->cap_series) {
        int64_t cap = e->cap_series ? e->cap_series * 2 : 4096;
        sim_sample *ns = realloc(r->series, (size_t)cap * sizeof *ns);
        if (ns == NULL) return -1;
        r->series = ns;
        e->cap_series = cap;
    }
    const double gib = 1024.0 * 1024.0 * 1024.0;
    sim_sample *s = &r->series[r->nseries++];
    s->t = t;
    s->mem_gib = (float)(mem / gib);
    s->host_gib = (float)(host / gib);
    s->queue = (int32_t)(queue > INT32_MAX ? INT32_MAX : queue);
    if (mem / gib > r->peak_mem_gib) r->peak_mem_gib = mem / gib;
    if (host / gib > r->peak_host_gib) r->peak_host_gib = host / gib;
    return 0;
}

/* Record the state after a step of `dt` seconds: utilization (live tokens /
 * token slots held, time-weighted), memory and queue for the plot. */
static int sample(eng_t *e, double dt, int64_t queue) {
    kvp_pool_stats_t ps = {.struct_size = sizeof ps};
    kvp_pool_stats(e->pool, &ps);
    int64_t slots = (ps.used_pages + ps.reserved_pages + ps.used_staging) * ps.page_size;
    if (slots > 0 && push_util(e, (double)ps.live_tokens / (double)slots, dt)) return -1;
    double mem = (double)(ps.used_pages + ps.reserved_pages) * (double)e->L.page_bytes +
                 (double)ps.used_staging * (double)e->L.staging_page_bytes;
    double host = 0;
    if (e->tier) {
        kvp_tier_stats_t ts = {.struct_size = sizeof ts};
        kvp_tier_stats(e->tier, &ts);
        host = (double)(ts.host_bytes - ts.free_bytes);
    }
    return push_sample(e, e->now, mem, host, queue);
}

static int check(eng_t *e) {
    if (!e->c->check) return 0;
    char msg[KVP_ERR_SIZE];
    int rc = e->tier ? kvp__tier_check(e->tier, msg, sizeof msg)
                     : kvp__table_check(e->table, msg, sizeof msg);
    if (rc != KVP_OK) return errf(e->err, e->err_size, "invariant broken at t=%.3f s: %s", e->now, msg);
    return 0;
}

/* ---- setup ------------------------------------------------------------------------ */

static int formats_of(const sim_config *c, int strategy, int32_t *k, int32_t *v) {
    switch (strategy) {
    case SIM_PAGED_INT8: *k = *v = KVP_FORMAT_INT8; break;
    case SIM_PAGED_INT4: *k = *v = KVP_FORMAT_INT4; break;
    case SIM_FULL: *k = c->full_k; *v = c->full_v; break;
    default: *k = *v = KVP_FORMAT_FP16; break;
    }
    return 0;
}

static int64_t longest(const sim_trace *t) {
    int64_t m = 0;
    for (int64_t i = 0; i < t->n; i++)
        if (t->r[i].prompt + t->r[i].max_new > m) m = t->r[i].prompt + t->r[i].max_new;
    return m;
}

/* Pool, table (and for `full` the tier) sized from the KV budget: staging
 * layouts keep one staging page per batch slot, the rest are pool pages. */
static int setup(eng_t *e, int strategy) {
    const sim_config *c = e->c;
    char msg[KVP_ERR_SIZE];
    int32_t kf, vf;
    formats_of(c, strategy, &kf, &vf);
    e->L.struct_size = sizeof e->L;
    if (kvp_layout_compute(c->layers, c->kv_heads, c->head_dim, c->page_size, kf, vf, &e->L, msg,
                           sizeof msg) != KVP_OK)
        return errf(e->err, e->err_size, "layout: %s", msg);
    uint64_t staging = e->L.needs_staging ? (uint64_t)c->max_batch : 0;
    uint64_t fixed = e->L.fixed_bytes + staging * e->L.staging_page_bytes;
    if (c->kv_budget < fixed + e->L.page_bytes)
        return errf(e->err, e->err_size, "the KV budget holds no page of %s",
                    kvp_format_name(kf));
    uint64_t pages = (c->kv_budget - fixed) / e->L.page_bytes;
    if (pages + staging > (uint64_t)INT32_MAX) pages = (uint64_t)INT32_MAX - staging;
    uint64_t arena;
    if (kvp_arena_bytes(&e->L, pages, staging, &arena, msg, sizeof msg) != KVP_OK ||
        arena > c->kv_budget)
        return errf(e->err, e->err_size, "arena: %s", msg);
    snprintf(e->res->format, sizeof e->res->format, kf == vf ? "%s" : "%s/%s",
             kvp_format_name(kf), kvp_format_name(vf));
    e->res->pages = (int64_t)pages;
    e->res->staging_pages = (int64_t)staging;

    kvp_pool_params_t pp;
    kvp_pool_params_init(&pp);
    pp.page_size = c->page_size;
    pp.num_pages = (int32_t)pages;
    pp.num_staging = (int32_t)staging;
    pp.prefix_cache = 0;
    if (kvp_pool_create(&pp, &e->pool, msg, sizeof msg) != KVP_OK)
        return errf(e->err, e->err_size, "pool: %s", msg);
    int32_t max_seqs = (int32_t)(e->tr->n < (1 << 22) ? e->tr->n : (1 << 22));
    if (kvp_table_create(e->pool, max_seqs, &e->table, msg, sizeof msg) != KVP_OK)
        return errf(e->err, e->err_size, "table: %s", msg);
    int64_t most = longest(e->tr);
    e->ops_cap = (int32_t)(most / c->page_size + c->prefill_chunk / c->page_size + 16);
    e->ops = malloc((size_t)e->ops_cap * sizeof *e->ops);
    e->rq = calloc((size_t)e->tr->n, sizeof *e->rq);
    e->prod = malloc((size_t)c->max_batch * sizeof *e->prod);
    e->fin = malloc((size_t)e->tr->n * sizeof *e->fin);
    if (!e->ops || !e->rq || !e->prod || !e->fin) return errf(e->err, e->err_size, "out of memory");
    for (int64_t i = 0; i < e->tr->n; i++) e->rq[i].seq = -1;
    return 0;
}

/* The simulator moves no data, so the host tier's memory is address space
 * that is reserved and never touched (it may exceed this machine's RAM). */
typedef struct {
    size_t size; /* of the one mapping: munmap needs it */
} mapping;

static void *reserve_only(void *opaque, size_t size, size_t alignment) {
    (void)alignment; /* mmap returns page-aligned memory */
    mapping *m = opaque;
    m->size = size;
    void *p = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static void unreserve(void *opaque, void *ptr) {
    mapping *m = opaque;
    munmap(ptr, m->size);
}

static int setup_tier(eng_t *e, mapping *m) {
    const sim_config *c = e->c;
    char msg[KVP_ERR_SIZE];
    kvp_tier_params_t p;
    kvp_tier_params_init(&p);
    p.layout = &e->L;
    p.host_bytes = c->host_bytes;
    kvp_allocator_t host = {reserve_only, unreserve, m};
    p.host_allocator = host;
    if (kvp_tier_create(e->table, &p, &e->tier, msg, sizeof msg) != KVP_OK)
        return errf(e->err, e->err_size, "host tier: %s", msg);
    kvp_tier_stats_t ts = {.struct_size = sizeof ts};
    kvp_tier_stats(e->tier, &ts);
    e->slot_bytes = ts.slot_bytes;
    return 0;
}

/* ---- strategy static: a fixed number of max-length slots -------------------------- */

static int run_static(eng_t *e) {
    const sim_config *c = e->c;
    const sim_trace *t = e->tr;
    /* slots as long as the longest request (at most the whole pool: longer
     * requests cannot be served, an OOM event each) */
    int64_t slot_len = c->static_max_len ? c->static_max_len : longest(t);
    slot_len = (slot_len + c->page_size - 1) / c->page_size * c->page_size;
    if (slot_len > e->res->pages * c->page_size) slot_len = e->res->pages * c->page_size;
    int64_t slots = e->res->pages * c->page_size / slot_len;
    if (slots > c->max_batch) slots = c->max_batch;
    e->res->batch_limit = slots;
    e->res->slot_len = slot_len;
    int64_t *run = malloc((size_t)slots * sizeof *run);
    if (run == NULL) return errf(e->err, e->err_size, "out of memory");
    int64_t nrun = 0, head = 0;
    double stop = t->r[t->n - 1].arrival + c->drain_s;
    while (e->ended < t->n && e->now <= stop) {
        while (e->next < t->n && t->r[e->next].arrival <= e->now) e->rq[e->next++].state = RQ_QUEUED;
        /* admit in arrival order into free slots, reserving the whole slot */
        while (nrun < slots && head < e->next) {
            int64_t i = head++;
            rq_t *q = &e->rq[i];
            if (t->r[i].prompt + t->r[i].max_new > slot_len) { /* cannot be served */
                e->res->oom++;
                end_request(e, i, RQ_FAILED, e->now);
                continue;
            }
            if (kvp_table_seq_create(e->table, 0, 0, &q->seq) != KVP_OK ||
                kvp_table_reserve(e->table, q->seq, slot_len) != KVP_OK) {
                oom(e, i);
                continue;
            }
            q->state = RQ_ACTIVE;
            run[nrun++] = i;
        }
        if (nrun == 0) {
            if (e->next >= t->n) break;
            e->now = t->r[e->next].arrival;
            continue;
        }
        memset(&e->cost, 0, sizeof e->cost);
        int64_t budget = c->token_budget, ndone = 0;
        for (int64_t k = 0; k < nrun; k++) {
            int64_t i = run[k];
            rq_t *q = &e->rq[i];
            int64_t left = t->r[i].prompt - q->kv_len;
            int64_t n = left > 0 ? (left < c->prefill_chunk ? left : c->prefill_chunk) : 1;
            if (n > budget) n = budget;
            if (n == 0) continue;
            budget -= n;
            if (!grow(e, i, n)) continue;
            if (q->kv_len >= t->r[i].prompt) e->prod[ndone++] = i;
        }
        double dt = step_seconds(e);
        e->now += dt;
        for (int64_t k = 0; k < ndone; k++) produced(e, e->prod[k], e->now);
        /* compact the running set */
        int64_t w = 0;
        for (int64_t k = 0; k < nrun; k++)
            if (e->rq[run[k]].state == RQ_ACTIVE) run[w++] = run[k];
        nrun = w;
        e->res->steps++;
        if (sample(e, dt, e->next - head) || check(e)) {
            free(run);
            return -1;
        }
    }
    free(run);
    return 0;
}

/* ---- paged strategies: the scheduler plans, the engine executes ---------------------- */

static int setup_sched(eng_t *e, int strategy) {
    const sim_config *c = e->c;
    char msg[KVP_ERR_SIZE];
    kvp_sched_params_t p;
    kvp_sched_params_init(&p);
    p.page_size = c->page_size;
    p.needs_staging = e->L.needs_staging;
    p.total_pages = e->res->pages;
    p.max_requests = (int32_t)(e->tr->n < (1 << 24) ? e->tr->n : (1 << 24));
    p.max_batch = c->max_batch;
    p.token_budget = c->token_budget;
    p.max_prefill_chunk = c->prefill_chunk;
    p.host_bytes_per_s = c->host_gbps * 1e9;
    p.prefill_tokens_per_s = c->tflops * 1e12 / (2.0 * (double)c->params);
    p.page_bytes = e->L.page_bytes;
    p.staging_page_bytes = e->L.staging_page_bytes;
    if (strategy == SIM_FULL) {
        kvp_tier_stats_t ts = {.struct_size = sizeof ts};
        kvp_tier_stats(e->tier, &ts);
        p.page_bytes = ts.slot_bytes;          /* what a page takes in the host tier */
        p.staging_page_bytes = ts.staging_bytes;
        p.horizon = c->horizon;
        p.hysteresis = c->hysteresis;
        p.drop_below_priority = c->drop_below;
    } else { /* vLLM-style: reactive, first come first served, recompute */
        p.horizon = 0;
        p.hysteresis = 0;
        p.actions = KVP_SCHED_RECOMPUTE;
    }
    if (kvp_sched_create(&p, &e->sched, msg, sizeof msg) != KVP_OK)
        return errf(e->err, e->err_size, "scheduler: %s", msg);
    e->res->batch_limit = c->max_batch;
    return 0;
}

static int64_t item_index(const eng_t *e, int64_t id) {
    return (id >= 0 && id < e->tr->n) ? id : -1;
}

static void execute(eng_t *e, const kvp_sched_plan_t *pl, double *t_end_out) {
    const sim_trace *t = e->tr;
    int32_t nops = 0;
    for (int32_t k = 0; k < pl->n_finished; k++) { /* reached max_new_tokens */
        int64_t i = item_index(e, pl->finished[k]);
        if (i >= 0 && e->rq[i].state == RQ_ACTIVE) {
            release(e, i);
            end_request(e, i, RQ_DONE, e->now);
        }
    }
    for (int32_t k = 0; k < pl->n_reject; k++) {
        int64_t i = item_index(e, pl->reject[k].id);
        if (i >= 0) end_request(e, i, RQ_REJECTED, e->now);
    }
    for (int32_t k = 0; k < pl->n_swap_out; k++) {
        int64_t i = item_index(e, pl->swap_out[k].id);
        rq_t *q = &e->rq[i];
        if (kvp_tier_swap_out(e->tier, q->seq, e->ops, e->ops_cap, &nops) != KVP_OK) {
            oom(e, i); /* the plan counted host room that is not there */
            continue;
        }
        add_host_bytes(e, nops);
        q->state = RQ_SWAPPED;
        e->res->swap_outs++;
    }
    for (int32_t k = 0; k < pl->n_preempt; k++) {
        int64_t i = item_index(e, pl->preempt[k].id);
        release(e, i);
        e->rq[i].state = RQ_QUEUED;
        e->res->preemptions++;
    }
    for (int32_t k = 0; k < pl->n_drop; k++) {
        int64_t i = item_index(e, pl->drop[k].id);
        release(e, i);
        e->res->drops++;
        end_request(e, i, RQ_DROPPED, e->now);
    }
    for (int32_t k = 0; k < pl->n_swap_in; k++) {
        int64_t i = item_index(e, pl->swap_in[k].id);
        rq_t *q = &e->rq[i];
        if (kvp_tier_swap_in(e->tier, q->seq, e->ops, e->ops_cap, &nops) != KVP_OK) {
            oom(e, i);
            continue;
        }
        add_host_bytes(e, nops);
        q->state = RQ_ACTIVE;
        e->res->swap_ins++;
    }
    /* prefill and decode: reserve + append for each (at most max_batch
     * items), then the step's time */
    int32_t np = pl->n_prefill, nd = pl->n_decode;
    int64_t nprod = 0;
    for (int32_t k = 0; k < np; k++) {
        int64_t i = item_index(e, pl->prefill[k].id);
        rq_t *q = &e->rq[i];
        if (q->state >= RQ_DONE) continue;
        if (q->seq < 0) { /* admitted, or back for recompute */
            if (kvp_table_seq_create(e->table, 0, 0, &q->seq) != KVP_OK) {
                oom(e, i);
                continue;
            }
            q->kv_len = 0;
            q->state = RQ_ACTIVE;
        }
        if (!grow(e, i, pl->prefill[k].tokens)) continue;
        if (q->kv_len == t->r[i].prompt + q->generated) e->prod[nprod++] = i;
    }
    for (int32_t k = 0; k < nd; k++) {
        int64_t i = item_index(e, pl->decode[k]);
        if (e->rq[i].state != RQ_ACTIVE) continue;
        if (grow(e, i, 1)) e->prod[nprod++] = i;
    }
    for (int64_t k = 0; k < e->nfin; k++) kvp_sched_finish(e->sched, e->fin[k]);
    e->nfin = 0;
    double dt = step_seconds(e);
    *t_end_out = e->now + dt;
    for (int64_t k = 0; k < nprod; k++) produced(e, e->prod[k], e->now + dt);
}

static int run_paged(eng_t *e, int strategy) {
    const sim_config *c = e->c;
    const sim_trace *t = e->tr;
    if (setup_sched(e, strategy)) return -1;
    double stop = t->r[t->n - 1].arrival + c->drain_s;
    int idle = 0;
    while (e->ended < t->n && e->now <= stop) {
        while (e->next < t->n && t->r[e->next].arrival <= e->now) {
            int64_t i = e->next++;
            kvp_sched_request_t r = {.struct_size = sizeof r};
            r.id = i;
            r.priority = strategy == SIM_FULL ? t->r[i].priority : 0;
            r.prompt_tokens = t->r[i].prompt;
            r.max_new_tokens = t->r[i].max_new;
            r.arrival = (int64_t)(t->r[i].arrival * 1e6);
            if (kvp_sched_submit(e->sched, &r) != KVP_OK)
                return errf(e->err, e->err_size, "submit: %s", kvp_sched_last_error(e->sched));
            e->rq[i].state = RQ_QUEUED;
        }
        kvp_sched_stats_t st = {.struct_size = sizeof st};
        kvp_sched_stats(e->sched, &st);
        if (st.waiting + st.running + st.swapped == 0) {
            if (e->next >= t->n) break;
            e->now = t->r[e->next].arrival;
            continue;
        }
        kvp_pool_stats_t ps = {.struct_size = sizeof ps};
        kvp_pool_stats(e->pool, &ps);
        kvp_sched_input_t in = {.struct_size = sizeof in};
        in.free_pages = ps.available_pages;
        in.free_staging = ps.total_staging - ps.used_staging;
        if (e->tier) {
            kvp_tier_stats_t ts = {.struct_size = sizeof ts};
            kvp_tier_stats(e->tier, &ts);
            in.host_free_bytes = ts.free_bytes;
        }
        in.now = (int64_t)(e->now * 1e6);
        kvp_sched_plan_t pl = {.struct_size = sizeof pl};
        if (kvp_sched_step(e->sched, &in, &pl) != KVP_OK)
            return errf(e->err, e->err_size, "step: %s", kvp_sched_last_error(e->sched));
        memset(&e->cost, 0, sizeof e->cost);
        double t_end;
        execute(e, &pl, &t_end);
        double dt = t_end - e->now;
        if (dt <= 0) { /* nothing to run: wait for the next arrival */
            if (e->next < t->n) {
                e->now = t->r[e->next].arrival;
                idle = 0;
            } else if (++idle > 4) {
                break;
            }
            continue;
        }
        idle = 0;
        e->now = t_end;
        e->res->steps++;
        kvp_sched_stats(e->sched, &st);
        if (sample(e, dt, st.waiting + st.swapped) || check(e)) return -1;
    }
    return 0;
}

/* ---- results -------------------------------------------------------------------------- */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Nearest-rank percentile of sorted values. */
static double pct(const double *v, int64_t n, double p) {
    if (n == 0) return 0;
    int64_t k = (int64_t)ceil(p / 100.0 * (double)n);
    if (k < 1) k = 1;
    return v[k - 1];
}

typedef struct {
    double u, w;
} uw_t;

static int cmp_uw(const void *a, const void *b) {
    return cmp_double(&((const uw_t *)a)->u, &((const uw_t *)b)->u);
}

static int summarize(eng_t *e) {
    sim_result *r = e->res;
    const sim_trace *t = e->tr;
    double end = e->now;
    r->sim_time = end - e->t0;
    r->requests = t->n;
    r->unfinished = t->n - e->ended;
    r->throughput = r->sim_time > 0 ? (double)r->output_tokens / r->sim_time : 0;
    /* utilization: time-weighted mean and 5th percentile */
    double sw = 0, su = 0;
    uw_t *uw = malloc((size_t)(e->nutil ? e->nutil : 1) * sizeof *uw);
    if (uw == NULL) return errf(e->err, e->err_size, "out of memory");
    for (int64_t k = 0; k < e->nutil; k++) {
        uw[k].u = e->util_u[k];
        uw[k].w = e->util_w[k];
        sw += uw[k].w;
        su += uw[k].u * uw[k].w;
    }
    r->utilization = sw > 0 ? su / sw : 0;
    qsort(uw, (size_t)e->nutil, sizeof *uw, cmp_uw);
    double acc = 0;
    r->utilization_p5 = e->nutil ? uw[0].u : 0;
    for (int64_t k = 0; k < e->nutil; k++) {
        acc += uw[k].w;
        if (acc >= 0.05 * sw) {
            r->utilization_p5 = uw[k].u;
            break;
        }
    }
    free(uw);
    /* classes by priority, ascending */
    for (int64_t i = 0; i < t->n; i++) {
        int32_t p = t->r[i].priority;
        int k = 0;
        while (k < r->nclasses && r->cls[k].priority != p) k++;
        if (k == r->nclasses) {
            if (r->nclasses == SIM_MAX_CLASSES)
                return errf(e->err, e->err_size, "more than %d priority classes",
                            SIM_MAX_CLASSES);
            int j = r->nclasses++;
            while (j > 0 && r->cls[j - 1].priority > p) {
                r->cls[j] = r->cls[j - 1];
                j--;
            }
            memset(&r->cls[j], 0, sizeof r->cls[j]);
            r->cls[j].priority = p;
        }
    }
    double *lat = malloc((size_t)t->n * sizeof *lat), *ttft = malloc((size_t)t->n * sizeof *ttft);
    if (lat == NULL || ttft == NULL) {
        free(lat);
        free(ttft);
        return errf(e->err, e->err_size, "out of memory");
    }
    for (int k = 0; k < r->nclasses; k++) {
        sim_class *cl = &r->cls[k];
        int64_t nl = 0, nt = 0;
        for (int64_t i = 0; i < t->n; i++) {
            if (t->r[i].priority != cl->priority) continue;
            const rq_t *q = &e->rq[i];
            cl->requests++;
            double a = t->r[i].arrival;
            if (q->state == RQ_DONE) {
                cl->completed++;
                lat[nl++] = q->done - a;
            } else if (q->state < RQ_DONE) {
                lat[nl++] = end - a; /* unfinished: a lower bound of its latency */
            }
            if (q->generated > 0) ttft[nt++] = q->first_token - a;
            else if (q->state < RQ_DONE) ttft[nt++] = end - a;
        }
        qsort(lat, (size_t)nl, sizeof *lat, cmp_double);
        qsort(ttft, (size_t)nt, sizeof *ttft, cmp_double);
        cl->latency_p50 = pct(lat, nl, 50);
        cl->latency_p99 = pct(lat, nl, 99);
        cl->ttft_p50 = pct(ttft, nt, 50);
        cl->ttft_p99 = pct(ttft, nt, 99);
    }
    free(lat);
    free(ttft);
    return 0;
}

int sim_run(const sim_config *c, const sim_trace *t, int strategy, sim_result *out, char *err,
            size_t err_size) {
    memset(out, 0, sizeof *out);
    out->strategy = strategy;
    if (t->n == 0) return errf(err, err_size, "empty trace");
    if (strategy < 0 || strategy >= SIM_NSTRATEGIES) return errf(err, err_size, "bad strategy");
    eng_t e;
    memset(&e, 0, sizeof e);
    e.c = c;
    e.tr = t;
    e.res = out;
    e.err = err;
    e.err_size = err_size;
    e.t0 = t->r[0].arrival;
    e.now = e.t0;
    mapping m = {0};
    int rc = setup(&e, strategy);
    if (rc == 0 && strategy == SIM_FULL) rc = setup_tier(&e, &m);
    if (rc == 0) rc = strategy == SIM_STATIC ? run_static(&e) : run_paged(&e, strategy);
    if (rc == 0) rc = summarize(&e);
    kvp_sched_destroy(e.sched);
    kvp_tier_destroy(e.tier);
    kvp_table_destroy(e.table);
    kvp_pool_destroy(e.pool);
    free(e.ops);
    free(e.rq);
    free(e.prod);
    free(e.fin);
    free(e.util_u);
    free(e.util_w);
    if (rc != 0) sim_result_free(out);
    return rc;
}

void sim_result_free(sim_result *r) {
    if (r == NULL) return;
    free(r->series);
    r->series = NULL;
    r->nseries = 0;
}
