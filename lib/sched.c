/*
 * Layer `sched`: the policy an engine consults once per step. It decides
 * (admission, chunked prefill, decode batch, forecast-driven swap / recompute
 * / drop, swap-in), the engine executes. No memory but its own tables, all
 * allocated at creation.
 *
 * Page accounting per sequence mirrors the page table: a sequence whose K/V
 * hold `len` tokens holds pages(len) pool pages (ceil(len/P), or floor(len/P)
 * plus a staging page in staging layouts).
 *
 * Token accounting: after prefilling `target` tokens the sequence has
 * produced one new token; each decode step appends the previous token's K/V
 * and produces the next. So a decoding sequence has
 * kv_len == prompt + generated - 1, and finishes when generated reaches
 * max_new. A recompute prefills prompt + generated tokens and produces the
 * next token, which keeps that relation.
 */
#include "internal.h"

#include <limits.h>
#include <string.h>

enum seq_state { S_FREE = 0, S_WAITING, S_PREFILLING, S_RUNNING, S_SWAPPED };

typedef struct {
    int64_t id;
    int64_t prompt, max_new, cached, arrival, deadline;
    int64_t kv_len;        /* tokens whose K/V are held (device or host) */
    int64_t generated;     /* tokens produced so far */
    int64_t target;        /* prefill goal: tokens in K/V before decoding */
    int64_t order;         /* submit order: FIFO among equals */
    int64_t admitted_at;   /* step of admission or swap-in: LIFO victim order */
    int64_t protect_until; /* not a victim before this step (hysteresis) */
    int64_t horizon_need;  /* scratch: pages needed over the horizon */
    int64_t evicted_at;    /* step it was last moved out: not brought back that step */
    int32_t priority;
    int32_t state;
    int32_t heap_pos;      /* in the waiting or swapped heap */
    int32_t res_pos;       /* in the resident array */
} seq_t;

typedef struct {
    int32_t *idx; /* seq indices */
    int32_t n;
} heap_t;

struct kvp_sched {
    kvp_sched_params_t p;
    kvp_allocator_t alloc;
    seq_t *seqs;
    int32_t *free_list;
    int32_t n_free;
    /* id -> seq index, open addressing with linear probing */
    int64_t *map_keys;
    int32_t *map_vals; /* -1 = empty */
    uint32_t map_mask;
    heap_t waiting, swapped;
    int32_t *resident;
    int32_t n_resident;
    int32_t *pending_reject; /* TOO_LONG found at submit */
    int32_t n_pending_reject;
    int64_t n_deadlines;     /* live requests with a deadline: skip scans when 0 */
    int64_t next_order;
    int64_t step;
    /* plan storage */
    kvp_sched_item_t *l_swap_out, *l_preempt, *l_drop, *l_swap_in, *l_prefill, *l_reject;
    int64_t *l_decode, *l_finished;
    int32_t *scratch;        /* victim candidates */
    kvp_sched_plan_t plan;
    kvp_sched_stats_t stats;
    char err[KVP_ERR_SIZE];
};

/* ---- helpers ------------------------------------------------------------ */

/* Limits that keep every page and token sum in int64 (checked at create and
 * submit): a request holds at most KVP__SCHED_MAX_TOKENS tokens of prompt and
 * as many of output, so its pages fit in 2^62; at most 2^24 of them are
 * tracked, and no sum the planner forms (forecast, pages released, pages
 * allocated) exceeds 2^24 x (total_pages + 2^32) < 2^62. */
#define KVP__SCHED_MAX_TOKENS (INT64_MAX / 4)
#define KVP__SCHED_MAX_PAGES (INT64_C(1) << 36)

static int set_err(kvp_sched_t *s, int status, const char *fmt, ...) KVP__PRINTF(3, 4);
static int set_err(kvp_sched_t *s, int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    kvp__verrf(s->err, sizeof s->err, status, fmt, ap);
    va_end(ap);
    return status;
}

static int64_t pages_for(const kvp_sched_t *s, int64_t len) {
    int64_t P = s->p.page_size;
    return s->p.needs_staging ? len / P : (len + P - 1) / P;
}

static int64_t final_len(const seq_t *q) { return q->prompt + q->max_new - 1; }

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* Host bytes a swapped-out sequence occupies; UINT64_MAX when that overflows
 * 64 bits (no host tier can hold it). */
static uint64_t host_bytes(const kvp_sched_t *s, const seq_t *q) {
    uint64_t b;
    if (!kvp__mul_u64((uint64_t)pages_for(s, q->kv_len), s->p.page_bytes, &b)) return UINT64_MAX;
    if (s->p.needs_staging && !kvp__add_u64(b, s->p.staging_page_bytes, &b)) return UINT64_MAX;
    return b;
}

/* now - then without overflow, saturated to the int64 range. */
static int64_t elapsed(int64_t now, int64_t then) {
    int64_t d;
#if defined(__GNUC__) || defined(__clang__)
    if (__builtin_sub_overflow(now, then, &d)) return now < then ? INT64_MIN : INT64_MAX;
#else
    if (then < 0 && now > INT64_MAX + then) return INT64_MAX;
    if (then > 0 && now < INT64_MIN + then) return INT64_MIN;
    d = now - then;
#endif
    return d;
}

/* ---- id map ------------------------------------------------------------- */

static uint32_t hash_id(int64_t id) {
    uint64_t x = (uint64_t)id * 0x9E3779B97F4A7C15ull;
    return (uint32_t)(x >> 32);
}

static int32_t map_find(const kvp_sched_t *s, int64_t id) {
    for (uint32_t i = hash_id(id) & s->map_mask;; i = (i + 1) & s->map_mask) {
        if (s->map_vals[i] < 0) return -1;
        if (s->map_keys[i] == id) return s->map_vals[i];
    }
}

static void map_put(kvp_sched_t *s, int64_t id, int32_t v) {
    uint32_t i = hash_id(id) & s->map_mask;
    while (s->map_vals[i] >= 0) i = (i + 1) & s->map_mask;
    s->map_keys[i] = id;
    s->map_vals[i] = v;
}

/* Linear-probing delete with backward shift (no tombstones). */
static void map_del(kvp_sched_t *s, int64_t id) {
    uint32_t i = hash_id(id) & s->map_mask;
    while (s->map_keys[i] != id || s->map_vals[i] < 0) i = (i + 1) & s->map_mask;
    uint32_t hole = i;
    for (uint32_t j = (i + 1) & s->map_mask; s->map_vals[j] >= 0; j = (j + 1) & s->map_mask) {
        uint32_t home = hash_id(s->map_keys[j]) & s->map_mask;
        /* move j into the hole if its home is not in (hole, j] cyclically */
        bool between = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
        if (!between) {
            s->map_keys[hole] = s->map_keys[j];
            s->map_vals[hole] = s->map_vals[j];
            hole = j;
        }
    }
    s->map_vals[hole] = -1;
}

/* ---- heaps: highest priority first, then oldest ------------------------- */

static bool before(const kvp_sched_t *s, int32_t a, int32_t b) {
    const seq_t *x = &s->seqs[a], *y = &s->seqs[b];
    if (x->priority != y->priority) return x->priority > y->priority;
    return x->order < y->order;
}

static void heap_swap(kvp_sched_t *s, heap_t *h, int32_t i, int32_t j) {
    int32_t t = h->idx[i];
    h->idx[i] = h->idx[j];
    h->idx[j] = t;
    s->seqs[h->idx[i]].heap_pos = i;
    s->seqs[h->idx[j]].heap_pos = j;
}

static void heap_up(kvp_sched_t *s, heap_t *h, int32_t i) {
    while (i > 0) {
        int32_t parent = (i - 1) / 2;
        if (!before(s, h->idx[i], h->idx[parent])) break;
        heap_swap(s, h, i, parent);
        i = parent;
    }
}

static void heap_down(kvp_sched_t *s, heap_t *h, int32_t i) {
    for (;;) {
        int32_t l = 2 * i + 1, r = l + 1, best = i;
        if (l < h->n && before(s, h->idx[l], h->idx[best])) best = l;
        if (r < h->n && before(s, h->idx[r], h->idx[best])) best = r;
        if (best == i) return;
        heap_swap(s, h, i, best);
        i = best;
    }
}

static void heap_push(kvp_sched_t *s, heap_t *h, int32_t q) {
    h->idx[h->n] = q;
    s->seqs[q].heap_pos = h->n;
    h->n++;
    heap_up(s, h, h->n - 1);
}

static void heap_remove(kvp_sched_t *s, heap_t *h, int32_t q) {
    int32_t i = s->seqs[q].heap_pos;
    h->n--;
    if (i != h->n) {
        h->idx[i] = h->idx[h->n];
        s->seqs[h->idx[i]].heap_pos = i;
        heap_down(s, h, i);
        heap_up(s, h, s->seqs[h->idx[i]].heap_pos);
    }
    s->seqs[q].heap_pos = -1;
}

/* ---- resident set ------------------------------------------------------- */

static void resident_add(kvp_sched_t *s, int32_t q) {
    s->seqs[q].res_pos = s->n_resident;
    s->resident[s->n_resident++] = q;
}

static void resident_remove(kvp_sched_t *s, int32_t q) {
    int32_t i = s->seqs[q].res_pos;
    s->n_resident--;
    if (i != s->n_resident) {
        s->resident[i] = s->resident[s->n_resident];
        s->seqs[s->resident[i]].res_pos = i;
    }
    s->seqs[q].res_pos = -1;
}

static void seq_release(kvp_sched_t *s, int32_t q) {
    seq_t *x = &s->seqs[q];
    if (x->deadline > 0) s->n_deadlines--;
    map_del(s, x->id);
    x->state = S_FREE;
    s->free_list[s->n_free++] = q;
}

/* Take a sequence out of whichever container holds it. */
static void detach(kvp_sched_t *s, int32_t q) {
    switch (s->seqs[q].state) {
    case S_WAITING: heap_remove(s, &s->waiting, q); break;
    case S_SWAPPED: heap_remove(s, &s->swapped, q); break;
    case S_PREFILLING:
    case S_RUNNING: resident_remove(s, q); break;
    default: break;
    }
}

/* ---- create / destroy --------------------------------------------------- */

void kvp_sched_params_init(kvp_sched_params_t *p) {
    if (p == NULL) return;
    memset(p, 0, sizeof *p);
    p->struct_size = sizeof *p;
    p->max_requests = 4096;
    p->max_batch = 256;
    p->token_budget = 8192;
    p->horizon = 64;
    p->hysteresis = 16;
    p->actions = KVP_SCHED_SWAP | KVP_SCHED_RECOMPUTE | KVP_SCHED_DROP;
    p->drop_below_priority = INT32_MIN;
    p->watermark_pages = -1; /* 1% of the pool, resolved at create */
    p->host_bytes_per_s = 25e9;
    p->prefill_tokens_per_s = 10000.0;
}

static int check_params(const kvp_sched_params_t *p, char *err, size_t err_size) {
    int rc = kvp__check_struct(p, sizeof *p, "params", err, err_size);
    if (rc != KVP_OK) return rc;
    if (p->page_size < 1 || p->page_size > KVP_MAX_PAGE_SIZE)
        return kvp__errf(err, err_size, KVP_EINVAL, "page_size must be 1..%d, got %d",
                         KVP_MAX_PAGE_SIZE, (int)p->page_size);
    if (p->total_pages < 1 || p->total_pages > KVP__SCHED_MAX_PAGES)
        return kvp__errf(err, err_size, KVP_EINVAL, "total_pages must be 1..%lld, got %lld",
                         (long long)KVP__SCHED_MAX_PAGES, (long long)p->total_pages);
    if (p->max_requests < 1 || p->max_requests > (1 << 24))
        return kvp__errf(err, err_size, KVP_EINVAL, "max_requests must be 1..%d, got %d",
                         1 << 24, (int)p->max_requests);
    if (p->max_batch < 1 || p->token_budget < 1 || p->max_prefill_chunk < 0)
        return kvp__errf(err, err_size, KVP_EINVAL,
                         "max_batch and token_budget must be > 0, max_prefill_chunk >= 0");
    if (p->horizon < 0 || p->hysteresis < 0)
        return kvp__errf(err, err_size, KVP_EINVAL, "horizon and hysteresis must be >= 0");
    if (p->actions & ~(KVP_SCHED_SWAP | KVP_SCHED_RECOMPUTE | KVP_SCHED_DROP) || p->actions == 0)
        return kvp__errf(err, err_size, KVP_EINVAL,
                         "actions must be a non-empty OR of KVP_SCHED_SWAP, _RECOMPUTE, _DROP");
    if (p->watermark_pages < -1 || p->watermark_pages >= p->total_pages)
        return kvp__errf(err, err_size, KVP_EINVAL,
                         "watermark_pages must be below total_pages, got %lld",
                         (long long)p->watermark_pages);
    if (p->max_queue_delay < 0)
        return kvp__errf(err, err_size, KVP_EINVAL, "max_queue_delay must be >= 0");
    if (!(p->host_bytes_per_s > 0) || !(p->prefill_tokens_per_s > 0))
        return kvp__errf(err, err_size, KVP_EINVAL,
                         "host_bytes_per_s and prefill_tokens_per_s must be > 0");
    if (p->needs_staging != 0 && p->needs_staging != 1)
        return kvp__errf(err, err_size, KVP_EINVAL, "needs_staging must be 0 or 1");
    return kvp__allocator_check(&p->allocator, err, err_size);
}

void kvp_sched_destroy(kvp_sched_t *s) {
    if (s == NULL) return;
    kvp_allocator_t a = s->alloc;
    void *blocks[] = {s->seqs, s->free_list, s->map_keys, s->map_vals, s->waiting.idx,
                      s->swapped.idx, s->resident, s->pending_reject, s->l_swap_out,
                      s->l_preempt, s->l_drop, s->l_swap_in, s->l_prefill, s->l_reject,
                      s->l_decode, s->l_finished, s->scratch};
    for (size_t i = 0; i < sizeof blocks / sizeof blocks[0]; i++) kvp__free(&a, blocks[i]);
    kvp__free(&a, s);
}

int kvp_sched_create(const kvp_sched_params_t *params, kvp_sched_t **out, char *err,
                     size_t err_size) {
    if (out == NULL) return kvp__errf(err, err_size, KVP_EINVAL, "out is NULL");
    int rc = check_params(params, err, err_size);
    if (rc != KVP_OK) return rc;
    const kvp_allocator_t *a = &params->allocator;
    kvp_sched_t *s = kvp__calloc(a, 1, sizeof *s, 0);
    if (s == NULL) return kvp__errf(err, err_size, KVP_ENOMEM, "out of memory (scheduler)");
    s->alloc = *a;
    s->p = *params;
    if (s->p.max_prefill_chunk == 0) s->p.max_prefill_chunk = s->p.token_budget;
    if (s->p.watermark_pages < 0) s->p.watermark_pages = s->p.total_pages / 100;
    size_t n = (size_t)params->max_requests;
    uint32_t cap = 1;
    while (cap < 2 * n) cap <<= 1;
    s->map_mask = cap - 1;
    s->seqs = kvp__calloc(a, n, sizeof *s->seqs, 0);
    s->free_list = kvp__calloc(a, n, sizeof(int32_t), 0);
    s->map_keys = kvp__calloc(a, cap, sizeof(int64_t), 0);
    s->map_vals = kvp__calloc(a, cap, sizeof(int32_t), 0);
    s->waiting.idx = kvp__calloc(a, n, sizeof(int32_t), 0);
    s->swapped.idx = kvp__calloc(a, n, sizeof(int32_t), 0);
    s->resident = kvp__calloc(a, n, sizeof(int32_t), 0);
    s->pending_reject = kvp__calloc(a, n, sizeof(int32_t), 0);
    s->scratch = kvp__calloc(a, n, sizeof(int32_t), 0);
    s->l_swap_out = kvp__calloc(a, n, sizeof(kvp_sched_item_t), 0);
    s->l_preempt = kvp__calloc(a, n, sizeof(kvp_sched_item_t), 0);
    s->l_drop = kvp__calloc(a, n, sizeof(kvp_sched_item_t), 0);
    s->l_swap_in = kvp__calloc(a, n, sizeof(kvp_sched_item_t), 0);
    s->l_prefill = kvp__calloc(a, n, sizeof(kvp_sched_item_t), 0);
    s->l_reject = kvp__calloc(a, n, sizeof(kvp_sched_item_t), 0);
    s->l_decode = kvp__calloc(a, n, sizeof(int64_t), 0);
    s->l_finished = kvp__calloc(a, n, sizeof(int64_t), 0);
    if (!s->seqs || !s->free_list || !s->map_keys || !s->map_vals || !s->waiting.idx ||
        !s->swapped.idx || !s->resident || !s->pending_reject || !s->scratch ||
        !s->l_swap_out || !s->l_preempt || !s->l_drop || !s->l_swap_in || !s->l_prefill ||
        !s->l_reject || !s->l_decode || !s->l_finished) {
        kvp_sched_destroy(s);
        return kvp__errf(err, err_size, KVP_ENOMEM, "out of memory (scheduler tables for %zu "
                         "requests)", n);
    }
    for (uint32_t i = 0; i < cap; i++) s->map_vals[i] = -1;
    for (size_t i = 0; i < n; i++) s->free_list[i] = (int32_t)(n - 1 - i);
    s->n_free = (int32_t)n;
    s->stats.struct_size = sizeof s->stats;
    *out = s;
    return KVP_OK;
}

const char *kvp_sched_last_error(const kvp_sched_t *s) {
    return s == NULL ? KVP__NULL_HANDLE : s->err;
}

/* ---- submit / finish ---------------------------------------------------- */

int kvp_sched_submit(kvp_sched_t *s, const kvp_sched_request_t *r) {
    if (s == NULL) return KVP_EINVAL;
    int rc = kvp__check_struct(r, sizeof *r, "request", s->err, sizeof s->err);
    if (rc != KVP_OK) return rc;
    if (r->prompt_tokens < 1 || r->max_new_tokens < 1)
        return set_err(s, KVP_EINVAL, "request %lld: prompt_tokens and max_new_tokens must be > 0",
                       (long long)r->id);
    if (r->prompt_tokens > KVP__SCHED_MAX_TOKENS || r->max_new_tokens > KVP__SCHED_MAX_TOKENS)
        return set_err(s, KVP_EINVAL,
                       "request %lld: prompt_tokens and max_new_tokens must be at most 2^61-1",
                       (long long)r->id);
    if (r->cached_tokens < 0 || r->cached_tokens > r->prompt_tokens)
        return set_err(s, KVP_EINVAL, "request %lld: cached_tokens must be in 0..prompt_tokens",
                       (long long)r->id);
    if (r->arrival < 0 || r->deadline < 0)
        return set_err(s, KVP_EINVAL,
                       "request %lld: arrival and deadline must be >= 0, got %lld and %lld",
                       (long long)r->id, (long long)r->arrival, (long long)r->deadline);
    if (map_find(s, r->id) >= 0)
        return set_err(s, KVP_EINVAL, "request id %lld is already live", (long long)r->id);
    if (s->n_free == 0)
        return set_err(s, KVP_ENOSPC, "request table full (%d requests tracked)",
                       (int)s->p.max_requests);
    int32_t q = s->free_list[--s->n_free];
    seq_t *x = &s->seqs[q];
    memset(x, 0, sizeof *x);
    x->id = r->id;
    x->priority = r->priority;
    x->prompt = r->prompt_tokens;
    x->max_new = r->max_new_tokens;
    /* cached pages are whole pages: only full pages can be attached */
    x->cached = r->cached_tokens / s->p.page_size * s->p.page_size;
    if (x->cached == x->prompt) x->cached -= s->p.page_size; /* the last token is computed */
    if (x->cached < 0) x->cached = 0;
    x->arrival = r->arrival;
    x->deadline = r->deadline;
    x->target = x->prompt;
    x->order = s->next_order++;
    x->heap_pos = x->res_pos = -1;
    x->evicted_at = -1;
    x->state = S_WAITING;
    if (x->deadline > 0) s->n_deadlines++;
    map_put(s, x->id, q);
    int64_t need = pages_for(s, final_len(x));
    if (need > s->p.total_pages - s->p.watermark_pages) {
        s->pending_reject[s->n_pending_reject++] = q; /* never fits: rejected next step */
        return KVP_OK;
    }
    heap_push(s, &s->waiting, q);
    return KVP_OK;
}

int kvp_sched_finish(kvp_sched_t *s, int64_t id) {
    if (s == NULL) return KVP_EINVAL;
    int32_t q = map_find(s, id);
    if (q < 0) return set_err(s, KVP_ENOENT, "request %lld is not live", (long long)id);
    for (int32_t i = 0; i < s->n_pending_reject; i++) {
        if (s->pending_reject[i] == q) {
            s->pending_reject[i] = s->pending_reject[--s->n_pending_reject];
            break;
        }
    }
    if (s->seqs[q].heap_pos >= 0 || s->seqs[q].res_pos >= 0) detach(s, q);
    seq_release(s, q);
    s->stats.finished++;
    return KVP_OK;
}

/* ---- one step ------------------------------------------------------------ */

typedef struct {
    int64_t free_pages;   /* pages this step may still allocate */
    int64_t free_staging;
    uint64_t host_free;
    int64_t forecast;     /* pages the resident set needs over the horizon, plus what
                             this step's newcomers take now */
    int64_t budget;       /* free - watermark */
    int64_t releasing;    /* pages this step's victims hold: free from the next step */
    int32_t tokens_left;
    int32_t batch_left;
    int64_t allocated;    /* pages allocated by this step's plan */
} step_ctx;

static void emit(kvp_sched_item_t *list, int32_t *n, const seq_t *x, int32_t tokens,
                 int32_t reason, int64_t start) {
    kvp_sched_item_t *it = &list[(*n)++];
    it->id = x->id;
    it->tokens = tokens;
    it->reason = reason;
    it->start = start;
}

/* Steps the forecast looks ahead; a purely reactive policy looks one step. */
static int64_t lookahead(const kvp_sched_t *s) { return s->p.horizon > 0 ? s->p.horizon : 1; }

/* Pages a resident sequence needs over the horizon. */
static int64_t horizon_need(const kvp_sched_t *s, const seq_t *x) {
    int64_t reach = x->state == S_PREFILLING ? x->target : x->kv_len;
    reach = min64(reach + lookahead(s), final_len(x));
    if (reach < x->kv_len) reach = x->kv_len;
    return pages_for(s, reach) - pages_for(s, x->kv_len);
}

/* Victim order: lowest priority first, then the most recently admitted. */
static bool victim_before(const kvp_sched_t *s, int32_t a, int32_t b) {
    const seq_t *x = &s->seqs[a], *y = &s->seqs[b];
    if (x->priority != y->priority) return x->priority < y->priority;
    return x->admitted_at > y->admitted_at;
}

/* Decode order: highest priority first, then the longest resident. */
static bool decode_before(const kvp_sched_t *s, int32_t a, int32_t b) {
    return victim_before(s, b, a);
}

typedef bool (*order_fn)(const kvp_sched_t *, int32_t, int32_t);

static void vheap_down(const kvp_sched_t *s, int32_t *h, int32_t n, int32_t i, order_fn first) {
    for (;;) {
        int32_t l = 2 * i + 1, r = l + 1, best = i;
        if (l < n && first(s, h[l], h[best])) best = l;
        if (r < n && first(s, h[r], h[best])) best = r;
        if (best == i) return;
        int32_t t = h[i];
        h[i] = h[best];
        h[best] = t;
        i = best;
    }
}

/* Move a resident victim out: swap, recompute or drop, whichever is allowed
 * and cheapest to come back from. */
static void evict(kvp_sched_t *s, step_ctx *c, int32_t q, int32_t reason) {
    seq_t *x = &s->seqs[q];
    const kvp_sched_params_t *p = &s->p;
    c->forecast -= x->horizon_need;
    c->releasing += pages_for(s, x->kv_len);
    x->evicted_at = s->step;
    resident_remove(s, q);
    uint64_t hb = host_bytes(s, x);
    bool can_swap = (p->actions & KVP_SCHED_SWAP) && hb != UINT64_MAX && hb <= c->host_free &&
                    x->state == S_RUNNING;
    bool can_recompute = (p->actions & KVP_SCHED_RECOMPUTE) != 0;
    double swap_cost = 2.0 * (double)hb / p->host_bytes_per_s;
    double recompute_cost = (double)(x->prompt + x->generated) / p->prefill_tokens_per_s;
    bool shed = x->priority < p->drop_below_priority && (p->actions & KVP_SCHED_DROP);
    kvp_sched_plan_t *plan = &s->plan;
    if (!shed && can_swap && (!can_recompute || swap_cost <= recompute_cost)) {
        c->host_free -= hb;
        emit(s->l_swap_out, &plan->n_swap_out, x, 0, reason, 0);
        x->state = S_SWAPPED;
        heap_push(s, &s->swapped, q);
        s->stats.swap_outs++;
    } else if (!shed && can_recompute) {
        emit(s->l_preempt, &plan->n_preempt, x, 0, reason, 0);
        x->state = S_WAITING;
        x->target = x->prompt + (x->generated > 0 ? x->generated : 0);
        x->kv_len = 0;
        x->cached = 0; /* the prefix may have been evicted meanwhile */
        heap_push(s, &s->waiting, q);
        s->stats.preemptions++;
    } else {
        int32_t why = shed ? reason
                           : ((p->actions & KVP_SCHED_SWAP) ? KVP_REASON_HOST_FULL : reason);
        emit(s->l_drop, &plan->n_drop, x, 0, why, 0);
        seq_release(s, q);
        s->stats.drops++;
    }
}

/* Evict unprotected resident sequences with priority below `below` (lowest
 * first, most recent first) until the forecast plus `extra` fits the budget,
 * counting the pages victims release as free from the next step. Returns true
 * if it fits. */
static bool make_room(kvp_sched_t *s, step_ctx *c, int64_t extra, int32_t below,
                      int32_t reason) {
    if (c->forecast + extra <= c->budget + c->releasing) return true;
    int32_t n = 0;
    for (int32_t i = 0; i < s->n_resident; i++) {
        int32_t q = s->resident[i];
        const seq_t *x = &s->seqs[q];
        if (x->protect_until > s->step || x->priority >= below) continue;
        s->scratch[n++] = q;
    }
    for (int32_t i = n / 2 - 1; i >= 0; i--) vheap_down(s, s->scratch, n, i, victim_before);
    while (c->forecast + extra > c->budget + c->releasing && n > 0) {
        int32_t q = s->scratch[0];
        s->scratch[0] = s->scratch[--n];
        vheap_down(s, s->scratch, n, 0, victim_before);
        evict(s, c, q, reason);
    }
    return c->forecast + extra <= c->budget + c->releasing;
}

static void finish_reached(kvp_sched_t *s) {
    kvp_sched_plan_t *plan = &s->plan;
    for (int32_t i = 0; i < s->n_resident;) {
        int32_t q = s->resident[i];
        seq_t *x = &s->seqs[q];
        if (x->state == S_RUNNING && x->generated >= x->max_new) {
            s->l_finished[plan->n_finished++] = x->id;
            resident_remove(s, q);
            seq_release(s, q);
            s->stats.finished++;
            continue; /* slot i now holds another sequence */
        }
        i++;
    }
}

static bool expired(const kvp_sched_t *s, const seq_t *x, int64_t now) {
    return s->n_deadlines > 0 && x->deadline > 0 && now >= x->deadline;
}

static void enforce_deadlines(kvp_sched_t *s, int64_t now) {
    kvp_sched_plan_t *plan = &s->plan;
    bool queue_limit = s->p.max_queue_delay > 0;
    if (s->n_deadlines == 0 && !queue_limit) return;
    for (int32_t i = 0; i < s->n_resident;) {
        int32_t q = s->resident[i];
        if (expired(s, &s->seqs[q], now)) {
            emit(s->l_drop, &plan->n_drop, &s->seqs[q], 0, KVP_REASON_DEADLINE, 0);
            resident_remove(s, q);
            seq_release(s, q);
            s->stats.drops++;
            continue;
        }
        i++;
    }
    for (int32_t i = 0; i < s->swapped.n;) {
        int32_t q = s->swapped.idx[i];
        if (expired(s, &s->seqs[q], now)) {
            emit(s->l_drop, &plan->n_drop, &s->seqs[q], 0, KVP_REASON_DEADLINE, 0);
            heap_remove(s, &s->swapped, q);
            seq_release(s, q);
            s->stats.drops++;
            continue;
        }
        i++;
    }
    for (int32_t i = 0; i < s->waiting.n;) {
        int32_t q = s->waiting.idx[i];
        seq_t *x = &s->seqs[q];
        bool late = expired(s, x, now);
        /* an arrival after `now` (a clock that went back) has not waited */
        bool stale = queue_limit && x->generated == 0 &&
                     elapsed(now, x->arrival) > s->p.max_queue_delay;
        if (late || stale) {
            emit(s->l_reject, &plan->n_reject, x, 0,
                 late ? KVP_REASON_DEADLINE : KVP_REASON_OVERLOAD, 0);
            heap_remove(s, &s->waiting, q);
            seq_release(s, q);
            s->stats.rejects++;
            continue;
        }
        i++;
    }
}

static bool decode_one(kvp_sched_t *s, step_ctx *c, int32_t q) {
    seq_t *x = &s->seqs[q];
    int64_t grow = pages_for(s, x->kv_len + 1) - pages_for(s, x->kv_len);
    if (grow > c->free_pages) return false; /* stalls this step */
    c->free_pages -= grow;
    c->allocated += grow;
    c->batch_left--;
    c->tokens_left--;
    s->l_decode[s->plan.n_decode++] = x->id;
    return true;
}

/* Decode every running sequence that fits this step's pages, batch and
 * tokens; when they do not all fit, highest priority first. */
static void plan_decode(kvp_sched_t *s, step_ctx *c) {
    int32_t n = 0;
    int64_t need = 0;
    for (int32_t i = 0; i < s->n_resident; i++) {
        int32_t q = s->resident[i];
        const seq_t *x = &s->seqs[q];
        if (x->state != S_RUNNING) continue;
        s->scratch[n++] = q;
        need += pages_for(s, x->kv_len + 1) - pages_for(s, x->kv_len);
    }
    if (n <= c->batch_left && n <= c->tokens_left && need <= c->free_pages) {
        for (int32_t i = 0; i < n; i++) decode_one(s, c, s->scratch[i]);
        return;
    }
    for (int32_t i = n / 2 - 1; i >= 0; i--) vheap_down(s, s->scratch, n, i, decode_before);
    while (n > 0 && c->batch_left > 0 && c->tokens_left > 0) {
        int32_t q = s->scratch[0];
        s->scratch[0] = s->scratch[--n];
        vheap_down(s, s->scratch, n, 0, decode_before);
        decode_one(s, c, q);
    }
}

/* Give a prefilling sequence its next chunk if pages and budget allow. */
static bool plan_chunk(kvp_sched_t *s, step_ctx *c, seq_t *x) {
    if (c->batch_left == 0 || c->tokens_left == 0) return false;
    int64_t left = x->target - x->kv_len;
    int64_t chunk = min64(min64(left, s->p.max_prefill_chunk), c->tokens_left);
    int64_t grow = pages_for(s, x->kv_len + chunk) - pages_for(s, x->kv_len);
    if (grow > c->free_pages) return false;
    c->free_pages -= grow;
    c->allocated += grow;
    c->batch_left--;
    c->tokens_left -= (int32_t)chunk;
    emit(s->l_prefill, &s->plan.n_prefill, x, (int32_t)chunk, KVP_REASON_NONE, x->kv_len);
    return true;
}

/* Pages a newcomer takes over the horizon, counting what it holds at once. */
static int64_t admission_need(const kvp_sched_t *s, const seq_t *x, bool swapped) {
    int64_t reach = swapped ? x->kv_len : x->target;
    int64_t need = pages_for(s, min64(reach + lookahead(s), final_len(x)));
    return need < pages_for(s, reach) ? pages_for(s, reach) : need;
}

/* The next sequence to bring in: the better head of the waiting and swapped
 * queues (swapped first among equals: it already holds progress), or -1. */
static int32_t next_in(const kvp_sched_t *s, bool *swapped) {
    int32_t w = s->waiting.n ? s->waiting.idx[0] : -1;
    int32_t sw = s->swapped.n ? s->swapped.idx[0] : -1;
    *swapped = sw >= 0 && (w < 0 || s->seqs[sw].priority >= s->seqs[w].priority);
    return *swapped ? sw : w;
}

/* If the best newcomer does not fit the forecast, move out work of strictly
 * lower priority for it, before this step's batch is formed. Its pages show
 * next step; meanwhile nothing behind it is admitted. */
static void preempt_for_head(kvp_sched_t *s, step_ctx *c) {
    bool swapped;
    int32_t q = next_in(s, &swapped);
    if (q < 0) return;
    const seq_t *x = &s->seqs[q];
    int64_t need = admission_need(s, x, swapped);
    if (c->forecast + need > c->budget + c->releasing)
        make_room(s, c, need, x->priority, KVP_REASON_PRIORITY);
}

/* Admit the best waiting request or swap in the best swapped sequence while
 * the forecast and this step's pages allow. A head that does not fit blocks
 * everything behind it, so large high-priority requests are not starved. */
static void plan_admissions(kvp_sched_t *s, step_ctx *c) {
    for (;;) {
        bool take_swapped;
        int32_t q = next_in(s, &take_swapped);
        if (q < 0) return;
        seq_t *x = &s->seqs[q];
        if (c->batch_left == 0 || (!take_swapped && c->tokens_left == 0)) return;
        if (s->p.needs_staging && c->free_staging < 1) return;
        if (x->evicted_at == s->step && s->step > 0) return; /* no same-step round trip */
        int64_t start_len = take_swapped ? x->kv_len : x->cached;
        int64_t need_total = admission_need(s, x, take_swapped);
        if (c->forecast + need_total > c->budget + c->releasing) return;
        int64_t now_pages = pages_for(s, start_len);
        if (take_swapped) {
            if (now_pages > c->free_pages) return;
            heap_remove(s, &s->swapped, q);
            c->free_pages -= now_pages;
            c->allocated += now_pages;
            /* its host bytes are not reused this step: swap-outs run first */
            x->state = S_RUNNING;
            emit(s->l_swap_in, &s->plan.n_swap_in, x, 0, KVP_REASON_NONE, 0);
            s->stats.swap_ins++;
        } else {
            /* cached prefix pages become used when attached: count them now */
            if (now_pages > c->free_pages) return;
            int64_t free_before = c->free_pages;
            c->free_pages -= now_pages;
            x->kv_len = start_len;
            x->state = S_PREFILLING;
            if (!plan_chunk(s, c, x)) {
                c->free_pages = free_before;
                x->kv_len = 0;
                x->state = S_WAITING;
                return;
            }
            c->allocated += now_pages;
            heap_remove(s, &s->waiting, q);
            s->stats.admitted++;
        }
        if (s->p.needs_staging) c->free_staging--;
        x->admitted_at = s->step;
        x->protect_until = s->step + s->p.hysteresis;
        resident_add(s, q);
        x->horizon_need = need_total - now_pages;
        c->forecast += need_total;
    }
}

/* Advance every sequence as if the engine executed the plan. */
static void apply_plan(kvp_sched_t *s) {
    const kvp_sched_plan_t *plan = &s->plan;
    for (int32_t i = 0; i < plan->n_decode; i++) {
        seq_t *x = &s->seqs[map_find(s, s->l_decode[i])];
        x->kv_len++;
        x->generated++;
    }
    for (int32_t i = 0; i < plan->n_prefill; i++) {
        seq_t *x = &s->seqs[map_find(s, s->l_prefill[i].id)];
        x->kv_len += s->l_prefill[i].tokens;
        if (x->kv_len == x->target) {
            x->state = S_RUNNING;
            x->generated++; /* the last chunk's logits give the next token */
        }
    }
}

int kvp_sched_step(kvp_sched_t *s, const kvp_sched_input_t *in, kvp_sched_plan_t *out) {
    if (s == NULL) return KVP_EINVAL;
    int rc = kvp__check_struct(in, sizeof *in, "input", s->err, sizeof s->err);
    if (rc == KVP_OK) rc = kvp__check_struct(out, sizeof *out, "plan", s->err, sizeof s->err);
    if (rc != KVP_OK) return rc;
    if (in->free_pages < 0 || in->free_staging < 0)
        return set_err(s, KVP_EINVAL, "free_pages and free_staging must be >= 0, got %lld and %lld",
                       (long long)in->free_pages, (long long)in->free_staging);
    if (in->now < 0)
        return set_err(s, KVP_EINVAL, "now must be >= 0, got %lld", (long long)in->now);
    rc = kvp__check_reserved(in->reserved_, "input", s->err, sizeof s->err);
    if (rc != KVP_OK) return rc;
    /* a pool never has more free pages than it has pages */
    int64_t free_pages = min64(in->free_pages, s->p.total_pages);

    s->step++;
    s->stats.steps++;
    kvp_sched_plan_t *plan = &s->plan;
    memset(plan, 0, sizeof *plan);
    plan->struct_size = sizeof *plan;

    for (int32_t i = 0; i < s->n_pending_reject; i++) {
        int32_t q = s->pending_reject[i];
        emit(s->l_reject, &plan->n_reject, &s->seqs[q], 0, KVP_REASON_TOO_LONG, 0);
        seq_release(s, q);
        s->stats.rejects++;
    }
    s->n_pending_reject = 0;
    finish_reached(s);
    enforce_deadlines(s, in->now);

    step_ctx c;
    memset(&c, 0, sizeof c);
    c.free_pages = free_pages;
    c.free_staging = s->p.needs_staging ? in->free_staging : INT64_MAX;
    c.host_free = in->host_free_bytes;
    c.tokens_left = s->p.token_budget;
    c.batch_left = s->p.max_batch;
    c.budget = free_pages - s->p.watermark_pages;
    for (int32_t i = 0; i < s->n_resident; i++) {
        seq_t *x = &s->seqs[s->resident[i]];
        x->horizon_need = horizon_need(s, x);
        c.forecast += x->horizon_need;
    }
    /* Act on the forecast before the pool runs dry. A purely reactive policy
     * (horizon 0) still moves work out when this step alone would not fit. */
    if (s->p.horizon == 0) c.budget = free_pages; /* reactive: no headroom kept */
    if (c.forecast > c.budget) {
        plan->pressure = 1;
        make_room(s, &c, 0, INT32_MAX, KVP_REASON_PRESSURE);
    }
    preempt_for_head(s, &c);
    plan_decode(s, &c);
    for (int32_t i = 0; i < s->n_resident; i++) {
        seq_t *x = &s->seqs[s->resident[i]];
        if (x->state == S_PREFILLING && x->admitted_at < s->step) plan_chunk(s, &c, x);
    }
    if (!plan->pressure) plan_admissions(s, &c);

    plan->swap_out = s->l_swap_out;
    plan->preempt = s->l_preempt;
    plan->drop = s->l_drop;
    plan->swap_in = s->l_swap_in;
    plan->prefill = s->l_prefill;
    plan->decode = s->l_decode;
    plan->reject = s->l_reject;
    plan->finished = s->l_finished;
    plan->pages_needed = c.allocated;
    plan->forecast_pages = c.forecast;
    apply_plan(s);
    kvp__copy_out(out, plan, sizeof *plan);
    return KVP_OK;
}

int kvp_sched_stats(const kvp_sched_t *s, kvp_sched_stats_t *out) {
    if (s == NULL) return KVP_EINVAL;
    int rc = kvp__check_struct(out, sizeof *out, "stats", NULL, 0);
    if (rc != KVP_OK) return rc;
    kvp_sched_stats_t st = s->stats;
    st.waiting = s->waiting.n + s->n_pending_reject;
    st.running = s->n_resident;
    st.swapped = s->swapped.n;
    kvp__copy_out(out, &st, sizeof st);
    return KVP_OK;
}
