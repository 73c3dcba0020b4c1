/*
 * libFuzzer harness: the scheduler (kvpage_sched.h) driven by arbitrary
 * request streams, times and sizes.
 *
 *   make fuzz FUZZ_TARGETS=sched FUZZ_SECONDS=60
 *
 * The first bytes choose the parameters (small, or extreme values that
 * create must refuse), allocation failures at create (KVP_ENOMEM, nothing
 * leaked), and bad struct sizes. Every following byte is an operation:
 * submit (ids from a small set, so duplicates happen, or any id; extreme
 * priorities, token counts, arrivals and deadlines), finish, step (free
 * pages, staging pages, host bytes and times that jump, go back or hit the
 * int64 limits), stats.
 *
 * Oracles, from the header's promises:
 *   - every return is one the function documents; a field outside its
 *     documented range, a duplicate live id or a full table is refused, with
 *     a non-empty kvp_sched_last_error() and the counters unchanged;
 *   - the harness keeps every live request's state (waiting, resident,
 *     swapped) from the plans alone: each id in a plan is live and in a state
 *     its list allows (decode and swap-out: resident; swap-in: swapped;
 *     reject: waiting; ...), and appears in at most one list;
 *   - a plan reserves no more pages than the input said were free, no more
 *     staging pages than free, and stays within max_batch and token_budget;
 *     each prefill chunk is 1 .. max_prefill_chunk tokens;
 *   - the counters move by exactly the plan's list lengths, and
 *     waiting + running + swapped is the number of live requests.
 * tests/test_fuzz_sched.c replays the corpus and random inputs in `make test`.
 */
#define _POSIX_C_SOURCE 200809L
#include "kvpage.h"
#include "kvpage_sched.h"

#include <limits.h>
#include <stdbool.h>
#include <math.h>
#include <string.h>

#include "fuzz_input.h"

#define FS_MAX_REQ 256 /* max_requests the harness tracks (larger ones are clamped) */
#define FS_OPS 400

enum { FS_GONE = 0, FS_WAITING, FS_RESIDENT, FS_SWAPPED };

typedef struct {
    int64_t id;
    int state;
    int seen; /* scratch: in this plan already */
} fs_req;

typedef struct {
    kvp_sched_params_t p;
    kvp_sched_t *s;
    fs_req live[FS_MAX_REQ];
    int n_live;
    int64_t now;
} fs_state;

static fs_req *fs_find(fs_state *f, int64_t id) {
    for (int i = 0; i < f->n_live; i++)
        if (f->live[i].id == id) return &f->live[i];
    return NULL;
}

static void fs_forget(fs_state *f, fs_req *r) { *r = f->live[--f->n_live]; }

static void fs_stats(const fs_state *f, kvp_sched_stats_t *st) {
    memset(st, 0, sizeof *st);
    st->struct_size = sizeof *st;
    FZI_ASSERT(kvp_sched_stats(f->s, st) == KVP_OK);
}

static void fs_same_stats(const kvp_sched_stats_t *a, const kvp_sched_stats_t *b) {
    FZI_ASSERT(memcmp(a, b, sizeof *a) == 0);
}

static void fs_failed(const fs_state *f, const kvp_sched_stats_t *before) {
    const char *e = kvp_sched_last_error(f->s);
    FZI_ASSERT(e != NULL && e[0] != '\0');
    kvp_sched_stats_t after;
    fs_stats(f, &after);
    fs_same_stats(before, &after);
}

/* A token count: small, near a page boundary, or extreme. */
static int64_t fs_tokens(fzi_cursor *c) {
    uint8_t k = fzi_u8(c);
    if (k < 160) return 1 + k % 48;
    if (k < 200) return (int64_t)fzi_u16(c);
    return fzi_edgy_i64(c);
}

static double fs_rate(fzi_cursor *c) {
    static const double rates[] = {25e9, 1e4, 1.0, 1e-300, 1e300, 0.0, -1.0};
    uint8_t k = fzi_u8(c);
    if (k < 200) return rates[k % 2];
    if (k < 250) return rates[k % 7];
    return k == 250 ? NAN : k == 251 ? INFINITY : -INFINITY;
}

static void fs_params(fzi_cursor *c, kvp_sched_params_t *p) {
    kvp_sched_params_init(p);
    /* a quarter of the inputs: each bit of `wild` gives one group of fields
     * extreme values (mostly refused by create) */
    uint8_t wild = fzi_u8(c) >= 192 ? fzi_u8(c) : 0;
    p->page_size = (wild & 1) ? fzi_edgy_i32(c) : 1 + (int32_t)fzi_below(c, 16);
    p->needs_staging = (int32_t)fzi_below(c, 3) == 2 ? (int32_t)(wild & 2 ? 2 : 1) : 0;
    p->total_pages = (wild & 4) ? fzi_edgy_i64(c) : 1 + (int64_t)fzi_u8(c);
    if (wild & 8) {
        p->max_requests = fzi_edgy_i32(c);
        /* valid but large: keep the tables small (the limit itself is tested) */
        if (p->max_requests > FS_MAX_REQ && p->max_requests <= (1 << 24))
            p->max_requests = 1 + p->max_requests % FS_MAX_REQ;
    } else {
        p->max_requests = 1 + (int32_t)fzi_below(c, 32);
    }
    if (wild & 16) {
        p->max_batch = fzi_edgy_i32(c);
        p->token_budget = fzi_edgy_i32(c);
        p->max_prefill_chunk = fzi_edgy_i32(c);
        p->horizon = fzi_edgy_i32(c);
        p->hysteresis = fzi_edgy_i32(c);
    } else {
        p->max_batch = 1 + (int32_t)fzi_below(c, 16);
        p->token_budget = 1 + (int32_t)fzi_u8(c);
        p->max_prefill_chunk = (int32_t)fzi_below(c, 64);
        p->horizon = (int32_t)fzi_below(c, 20);
        p->hysteresis = (int32_t)fzi_below(c, 5);
    }
    p->actions = (wild & 32) ? fzi_edgy_i32(c) : 1 + (int32_t)fzi_below(c, 7);
    if (wild & 64) {
        p->drop_below_priority = fzi_edgy_i32(c);
        p->watermark_pages = fzi_edgy_i64(c);
        p->max_queue_delay = fzi_edgy_i64(c);
        p->page_bytes = (uint64_t)fzi_edgy_i64(c);
        p->staging_page_bytes = (uint64_t)fzi_edgy_i64(c);
    } else {
        uint8_t k = fzi_u8(c);
        p->drop_below_priority = k & 1 ? (int32_t)(k >> 5) : INT32_MIN;
        p->watermark_pages = (k & 2) ? (int64_t)(k >> 6) : -1;
        p->max_queue_delay = (k & 4) ? (int64_t)fzi_below(c, 100) : 0;
        p->page_bytes = (uint64_t)fzi_below(c, 8) * 1000;
        p->staging_page_bytes = (uint64_t)fzi_below(c, 8) * 500;
    }
    p->host_bytes_per_s = fs_rate(c);
    p->prefill_tokens_per_s = fs_rate(c);
    if (wild & 128) p->struct_size = (uint32_t)fzi_below(c, 2) ? 0 : (uint32_t)sizeof *p - 8;
}

/* Which create parameters the header (and the create checks it documents)
 * accepts; used to require KVP_OK for them. */
static bool fs_params_valid(const kvp_sched_params_t *p) {
    int known = KVP_SCHED_SWAP | KVP_SCHED_RECOMPUTE | KVP_SCHED_DROP;
    return p->struct_size >= sizeof *p && p->page_size >= 1 &&
           p->page_size <= KVP_MAX_PAGE_SIZE && p->total_pages >= 1 &&
           p->total_pages <= (INT64_C(1) << 36) && p->max_requests >= 1 &&
           p->max_requests <= (1 << 24) && p->max_batch >= 1 && p->token_budget >= 1 &&
           p->max_prefill_chunk >= 0 && p->horizon >= 0 && p->hysteresis >= 0 &&
           p->actions != 0 && (p->actions & ~known) == 0 && p->watermark_pages >= -1 &&
           p->watermark_pages < p->total_pages && p->max_queue_delay >= 0 &&
           p->host_bytes_per_s > 0 && p->prefill_tokens_per_s > 0 &&
           (p->needs_staging == 0 || p->needs_staging == 1);
}

static void fs_submit(fs_state *f, fzi_cursor *c) {
    kvp_sched_request_t r;
    memset(&r, 0, sizeof r);
    r.struct_size = sizeof r;
    uint8_t k = fzi_u8(c);
    r.id = (k & 1) ? fzi_edgy_i64(c) : (int64_t)fzi_below(c, 24);
    r.priority = (k & 2) ? fzi_edgy_i32(c) : (int32_t)fzi_below(c, 4);
    r.prompt_tokens = fs_tokens(c);
    r.max_new_tokens = fs_tokens(c);
    r.cached_tokens = (k & 4) ? fzi_edgy_i64(c)
                              : (r.prompt_tokens > 0
                                     ? (int64_t)((uint64_t)fzi_u8(c) % ((uint64_t)r.prompt_tokens + 1))
                                     : 0);
    r.arrival = (k & 8) ? fzi_edgy_i64(c) : f->now + (int64_t)fzi_below(c, 8) - 2;
    r.deadline = (k & 16) ? fzi_edgy_i64(c)
                          : ((k & 32) ? f->now + (int64_t)fzi_below(c, 64) : 0);
    if ((k & 0xC0) == 0xC0) r.struct_size = (uint32_t)fzi_below(c, sizeof r);

    const int64_t max_tok = INT64_MAX / 4;
    bool valid = r.struct_size >= sizeof r && r.prompt_tokens >= 1 &&
                 r.prompt_tokens <= max_tok && r.max_new_tokens >= 1 &&
                 r.max_new_tokens <= max_tok && r.cached_tokens >= 0 &&
                 r.cached_tokens <= r.prompt_tokens && r.arrival >= 0 && r.deadline >= 0;
    bool dup = fs_find(f, r.id) != NULL;
    kvp_sched_stats_t before;
    fs_stats(f, &before);
    int rc = kvp_sched_submit(f->s, &r);
    if (!valid || dup) {
        FZI_ASSERT(rc == KVP_EINVAL);
    } else if (f->n_live == f->p.max_requests) {
        FZI_ASSERT(rc == KVP_ENOSPC);
    } else {
        FZI_ASSERT(rc == KVP_OK);
    }
    if (rc != KVP_OK) {
        fs_failed(f, &before);
        return;
    }
    FZI_ASSERT(f->n_live < FS_MAX_REQ);
    f->live[f->n_live].id = r.id;
    f->live[f->n_live].state = FS_WAITING;
    f->n_live++;
}

static void fs_finish(fs_state *f, fzi_cursor *c) {
    uint8_t k = fzi_u8(c);
    int64_t id;
    if (f->n_live > 0 && k < 192) id = f->live[k % f->n_live].id;
    else id = (k & 1) ? fzi_edgy_i64(c) : (int64_t)fzi_below(c, 24);
    fs_req *r = fs_find(f, id);
    kvp_sched_stats_t before;
    fs_stats(f, &before);
    int rc = kvp_sched_finish(f->s, id);
    if (r == NULL) {
        FZI_ASSERT(rc == KVP_ENOENT);
        fs_failed(f, &before);
        return;
    }
    FZI_ASSERT(rc == KVP_OK);
    fs_forget(f, r);
    kvp_sched_stats_t after;
    fs_stats(f, &after);
    FZI_ASSERT(after.finished == before.finished + 1);
}

/* Each id of a plan list: live, in a state the list allows, in no other list. */
static fs_req *fs_item(fs_state *f, int64_t id, int allowed) {
    fs_req *r = fs_find(f, id);
    FZI_ASSERT(r != NULL);
    FZI_ASSERT(!r->seen);
    FZI_ASSERT(allowed & (1 << r->state));
    r->seen = 1;
    return r;
}

static void fs_count(int32_t n, int64_t max_requests) {
    FZI_ASSERT(n >= 0 && n <= max_requests);
}

static void fs_step(fs_state *f, fzi_cursor *c) {
    kvp_sched_input_t in;
    memset(&in, 0, sizeof in);
    in.struct_size = sizeof in;
    uint8_t k = fzi_u8(c);
    int64_t total = f->p.total_pages;
    in.free_pages = (k & 1) ? fzi_edgy_i64(c) : (int64_t)fzi_u8(c) % (total + 3);
    in.free_staging = (k & 2) ? fzi_edgy_i64(c) : (int64_t)fzi_below(c, 6);
    in.host_free_bytes = (k & 4) ? (uint64_t)fzi_edgy_i64(c) : (uint64_t)fzi_u8(c) * 1000;
    if (k & 8) in.now = fzi_edgy_i64(c);
    else in.now = f->now + (int64_t)fzi_below(c, 16) - 3; /* may go back a little */
    if ((k & 0x30) == 0x30) in.reserved_ = fzi_edgy_i32(c);
    kvp_sched_plan_t pl;
    memset(&pl, 0, sizeof pl);
    pl.struct_size = sizeof pl;
    bool bad_struct = false;
    if ((k & 0xC0) == 0xC0) {
        uint8_t which = fzi_u8(c);
        if (which & 1) in.struct_size = (uint32_t)fzi_below(c, sizeof in);
        else pl.struct_size = (uint32_t)fzi_below(c, sizeof pl);
        bad_struct = true;
    }
    bool valid = !bad_struct && in.free_pages >= 0 && in.free_staging >= 0 && in.now >= 0 &&
                 in.reserved_ == 0;
    kvp_sched_stats_t before;
    fs_stats(f, &before);
    int rc = kvp_sched_step(f->s, &in, &pl);
    if (!valid) {
        FZI_ASSERT(rc == KVP_EINVAL);
        fs_failed(f, &before);
        return;
    }
    FZI_ASSERT(rc == KVP_OK);
    if (in.now >= 0 && in.now < INT64_MAX / 2) f->now = in.now;

    const int64_t maxr = f->p.max_requests;
    fs_count(pl.n_swap_out, maxr);
    fs_count(pl.n_preempt, maxr);
    fs_count(pl.n_drop, maxr);
    fs_count(pl.n_swap_in, maxr);
    fs_count(pl.n_prefill, maxr);
    fs_count(pl.n_decode, maxr);
    fs_count(pl.n_reject, maxr);
    fs_count(pl.n_finished, maxr);
    FZI_ASSERT(pl.pressure == 0 || pl.pressure == 1);
    /* pages: never more than the input said were free */
    FZI_ASSERT(pl.pages_needed >= 0 && pl.pages_needed <= in.free_pages);
    FZI_ASSERT(pl.forecast_pages >= 0);

    for (int i = 0; i < f->n_live; i++) f->live[i].seen = 0;
    const int W = 1 << FS_WAITING, R = 1 << FS_RESIDENT, S = 1 << FS_SWAPPED;
    for (int32_t i = 0; i < pl.n_finished; i++) fs_item(f, pl.finished[i], R);
    for (int32_t i = 0; i < pl.n_reject; i++) {
        fs_item(f, pl.reject[i].id, W);
        int32_t why = pl.reject[i].reason;
        FZI_ASSERT(why == KVP_REASON_TOO_LONG || why == KVP_REASON_DEADLINE ||
                   why == KVP_REASON_OVERLOAD);
    }
    for (int32_t i = 0; i < pl.n_drop; i++) {
        fs_item(f, pl.drop[i].id, R | S);
        FZI_ASSERT(pl.drop[i].reason >= KVP_REASON_PRESSURE &&
                   pl.drop[i].reason <= KVP_REASON_HOST_FULL);
    }
    for (int32_t i = 0; i < pl.n_swap_out; i++) fs_item(f, pl.swap_out[i].id, R);
    for (int32_t i = 0; i < pl.n_preempt; i++) fs_item(f, pl.preempt[i].id, R);
    for (int32_t i = 0; i < pl.n_swap_in; i++) fs_item(f, pl.swap_in[i].id, S);
    int64_t tokens = 0, admitted = 0;
    int64_t chunk_max = f->p.max_prefill_chunk ? f->p.max_prefill_chunk : f->p.token_budget;
    for (int32_t i = 0; i < pl.n_prefill; i++) {
        fs_req *r = fs_item(f, pl.prefill[i].id, W | R);
        admitted += r->state == FS_WAITING;
        FZI_ASSERT(pl.prefill[i].tokens >= 1 && pl.prefill[i].tokens <= chunk_max);
        FZI_ASSERT(pl.prefill[i].start >= 0);
        tokens += pl.prefill[i].tokens;
    }
    for (int32_t i = 0; i < pl.n_decode; i++) fs_item(f, pl.decode[i], R);
    FZI_ASSERT(pl.n_prefill + pl.n_decode <= f->p.max_batch);
    FZI_ASSERT(tokens + pl.n_decode <= f->p.token_budget);
    if (f->p.needs_staging) FZI_ASSERT(admitted + pl.n_swap_in <= in.free_staging);

    /* the counters move by the lists */
    kvp_sched_stats_t after;
    fs_stats(f, &after);
    FZI_ASSERT(after.steps == before.steps + 1);
    FZI_ASSERT(after.finished == before.finished + pl.n_finished);
    FZI_ASSERT(after.rejects == before.rejects + pl.n_reject);
    FZI_ASSERT(after.drops == before.drops + pl.n_drop);
    FZI_ASSERT(after.swap_outs == before.swap_outs + pl.n_swap_out);
    FZI_ASSERT(after.preemptions == before.preemptions + pl.n_preempt);
    FZI_ASSERT(after.swap_ins == before.swap_ins + pl.n_swap_in);
    FZI_ASSERT(after.admitted == before.admitted + admitted);

    /* apply the plan to the harness's states */
    for (int32_t i = 0; i < pl.n_finished; i++) fs_forget(f, fs_find(f, pl.finished[i]));
    for (int32_t i = 0; i < pl.n_reject; i++) fs_forget(f, fs_find(f, pl.reject[i].id));
    for (int32_t i = 0; i < pl.n_drop; i++) fs_forget(f, fs_find(f, pl.drop[i].id));
    for (int32_t i = 0; i < pl.n_swap_out; i++) fs_find(f, pl.swap_out[i].id)->state = FS_SWAPPED;
    for (int32_t i = 0; i < pl.n_preempt; i++) fs_find(f, pl.preempt[i].id)->state = FS_WAITING;
    for (int32_t i = 0; i < pl.n_swap_in; i++) fs_find(f, pl.swap_in[i].id)->state = FS_RESIDENT;
    for (int32_t i = 0; i < pl.n_prefill; i++) fs_find(f, pl.prefill[i].id)->state = FS_RESIDENT;
    FZI_ASSERT(after.waiting + after.running + after.swapped == f->n_live);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fzi_cursor c = fzi_make(data, size);
    static fs_state f;
    memset(&f, 0, sizeof f);
    fs_params(&c, &f.p);
    fzi_alloc alloc = {-1, 0};
    uint8_t fail = fzi_u8(&c);
    if (fail & 1) alloc.countdown = (long)(fail >> 1) % 24;
    kvp_allocator_t hooks = {fzi_malloc, fzi_free, &alloc};
    if (f.p.struct_size >= sizeof f.p) f.p.allocator = hooks;

    char err[KVP_ERR_SIZE];
    err[0] = '\0';
    kvp_sched_t *s = NULL;
    int rc = kvp_sched_create(&f.p, &s, err, sizeof err);
    bool valid = fs_params_valid(&f.p);
    if (rc == KVP_ENOMEM) {
        /* a failed allocation: nothing leaked, nothing returned; then retry */
        FZI_ASSERT(valid && s == NULL && alloc.live == 0 && err[0] != '\0');
        alloc.countdown = -1;
        rc = kvp_sched_create(&f.p, &s, err, sizeof err);
    }
    if (!valid) {
        FZI_ASSERT(rc == KVP_EINVAL && s == NULL && err[0] != '\0');
        return 0;
    }
    FZI_ASSERT(rc == KVP_OK && s != NULL);
    FZI_ASSERT(kvp_sched_last_error(s)[0] == '\0');
    f.s = s;
    FZI_ASSERT(f.p.max_requests <= FS_MAX_REQ);

    for (int op = 0; op < FS_OPS && c.n > 0; op++) {
        switch (fzi_u8(&c) % 8) {
        case 0: case 1: case 2: fs_submit(&f, &c); break;
        case 3: fs_finish(&f, &c); break;
        case 4: case 5: case 6: fs_step(&f, &c); break;
        default: {
            kvp_sched_stats_t st;
            fs_stats(&f, &st);
            FZI_ASSERT(st.waiting + st.running + st.swapped == f.n_live);
            FZI_ASSERT(kvp_sched_last_error(s) != NULL);
            /* NULL arguments are refused, not dereferenced */
            FZI_ASSERT(kvp_sched_submit(s, NULL) == KVP_EINVAL);
            FZI_ASSERT(kvp_sched_stats(s, NULL) == KVP_EINVAL);
            break;
        }
        }
    }
    kvp_sched_destroy(s);
    FZI_ASSERT(alloc.live == 0);
    return 0;
}
