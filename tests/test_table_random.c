/*
 * Layers: pool + table — randomized differential test.
 *
 * Random operations (create, reserve, append, truncate, fork, release,
 * prefix attach and lookup, eviction, priorities, engine-held pages, batch
 * export) run against a reference model written here:
 *
 * - each sequence is a plain vector of token ids;
 * - a simulated KV store holds one int per slot: the test writes every
 *   appended row at the slot the table returned and executes the page
 *   operations (COPY, SEAL, UNSEAL) as the header specifies, so reading a
 *   sequence back through the exported CSR must give exactly its tokens;
 * - a mirror of the prefix cache is kept from the pool's events, and the
 *   result of every prefix attach is predicted from it.
 *
 * After every operation: refcounts equal the references held, free + used +
 * cached = total, no page is in two places, the exported CSR and slots match
 * each sequence, reservations hold (an append within one never fails), and
 * the library's own invariant check passes. Failed operations must change
 * nothing.
 *
 * 1,000,000 operations in total (five configurations of 200,000), counting
 * only calls that were made: those that succeeded and those that failed as
 * the model expected (e.g. KVP_ENOSPC under memory pressure).
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>

#include "paging.h"
#include "testutil.h"

/* Operations per configuration; five configurations make 1,000,000. The
 * whole run takes about 2 s, and about 7 s under ASan + UBSan. */
#define OPS_PER_CONFIG 200000

#define MAX_SEQS 10
#define MAX_LEN_T 96
#define MAX_PAGES 48
#define MAX_ENGINE 16

typedef struct {
    bool live;
    int32_t id;
    int32_t toks[MAX_LEN_T];
    int64_t len;
    int64_t room; /* tokens an append is guaranteed (reservation) */
    uint64_t salt;
} rseq;

typedef struct {
    int32_t page, parent, priority;
    int32_t kind;
} pending_event;

typedef struct {
    int P, N, S;
    bool staged, cache;
    kvp_pool_t *pool;
    kvp_table_t *t;
    int32_t store[(MAX_PAGES + MAX_SEQS) * 8];
    rseq seqs[MAX_SEQS];
    int32_t engine[MAX_ENGINE]; /* pages the "engine" holds, with repeats */
    int nengine;
    /* prefix-cache mirror, from events */
    bool m_stored[MAX_PAGES];
    int32_t m_parent[MAX_PAGES];
    uint64_t m_salt[MAX_PAGES];
    int32_t m_data[MAX_PAGES * 8];
    pending_event pend[256];
    int npend;
    uint64_t rng;
    long ops_ok, ops_failed, attach_hits;
} world;

static uint32_t rnd(world *w, uint32_t n) {
    w->rng ^= w->rng << 13;
    w->rng ^= w->rng >> 7;
    w->rng ^= w->rng << 17;
    return (uint32_t)((w->rng >> 11) % n);
}

/* Token ids follow one of three templates with occasional noise, so prompts
 * share prefixes and the cache gets hits. */
static int32_t template_token(int tmpl, int64_t pos) { return (int32_t)((tmpl * 7 + pos * 3) % 11); }

static void on_event(void *opaque, const kvp_pool_event_t *ev) {
    world *w = opaque;
    assert_true(w->npend < 256);
    w->pend[w->npend].page = ev->page;
    w->pend[w->npend].parent = ev->parent;
    w->pend[w->npend].priority = ev->priority;
    w->pend[w->npend].kind = ev->kind;
    w->npend++;
}

static void report_failure(world *w, const char *what) {
    char err[KVP_ERR_SIZE];
    kvp__table_check(w->t, err, sizeof err);
    print_error("%s\nlast table error: %s\ninvariants: %s\n", what, kvp_table_last_error(w->t),
                err);
}

/* ---- reference bookkeeping ----------------------------------------------------- */

static int32_t seq_pages(world *w, const rseq *s, int32_t *pages) {
    kvp_seq_info_t info = {.struct_size = sizeof info};
    assert_int_equal(kvp_table_seq_info(w->t, s->id, &info), KVP_OK);
    assert_int_equal(kvp_table_seq_pages(w->t, s->id, pages, MAX_PAGES + 1), KVP_OK);
    return info.num_pages;
}

/* Process events after a call: STORED pages are named from the sequence
 * that filled them (`s`); EVICTED pages must be leaves of the mirror. */
static void apply_events(world *w, const rseq *s) {
    for (int e = 0; e < w->npend; e++) {
        pending_event *ev = &w->pend[e];
        if (ev->kind == KVP_EVENT_PAGE_FREED) {
            assert_false(w->m_stored[ev->page]);
            continue;
        }
        if (ev->kind == KVP_EVENT_PAGE_EVICTED) {
            assert_true(w->m_stored[ev->page]);
            for (int i = 0; i < w->N; i++)
                if (w->m_stored[i] && w->m_parent[i] == ev->page) {
                    print_error("evicted page %d while page %d extends it\n", ev->page, i);
                    fail();
                }
            w->m_stored[ev->page] = false;
            continue;
        }
        /* STORED: only appends store, and only into the appending sequence. */
        assert_non_null(s);
        int32_t pages[MAX_PAGES + 1];
        int32_t n = seq_pages(w, s, pages);
        int k = -1;
        for (int i = 0; i < n; i++)
            if (pages[i] == ev->page) k = i;
        assert_true(k >= 0);
        assert_int_equal(ev->parent, k > 0 ? pages[k - 1] : -1);
        assert_false(w->m_stored[ev->page]);
        w->m_stored[ev->page] = true;
        w->m_parent[ev->page] = ev->parent;
        w->m_salt[ev->page] = s->salt;
        memcpy(&w->m_data[ev->page * w->P], &s->toks[k * w->P], (size_t)w->P * sizeof(int32_t));
    }
    w->npend = 0;
}

/* Longest prefix the mirror predicts, cut where the cached pages taken would
 * exceed `budget`. */
static int64_t predict_match(world *w, uint64_t salt, const int32_t *toks, int64_t n,
                             int64_t budget) {
    if (!w->cache) return 0;
    int32_t parent = -1;
    int64_t cost = 0, k;
    for (k = 0; k < n / w->P; k++) {
        int found = -1;
        for (int i = 0; i < w->N; i++)
            if (w->m_stored[i] && w->m_parent[i] == parent && w->m_salt[i] == salt &&
                !memcmp(&w->m_data[i * w->P], toks + k * w->P, (size_t)w->P * sizeof *toks)) {
                assert_int_equal(found, -1); /* a name is stored at most once */
                found = i;
            }
        if (found < 0) break;
        int32_t ref;
        assert_int_equal(kvp_pool_refcount(w->pool, found, &ref), KVP_OK);
        cost += ref == 0;
        if (cost > budget) break;
        parent = found;
    }
    return k * w->P;
}

/* ---- the storage simulation ---------------------------------------------------- */

static void copy_page(world *w, int32_t src, int32_t dst, int32_t count) {
    memmove(&w->store[dst * w->P], &w->store[src * w->P], (size_t)count * sizeof(int32_t));
}

static void run_ops(world *w, const kvp_page_op_t *ops, int32_t nops) {
    for (int i = 0; i < nops; i++) {
        const kvp_page_op_t *op = &ops[i];
        switch (op->kind) {
        case KVP_OP_COPY:
            assert_int_equal(op->row, -1);
            copy_page(w, op->src, op->dst, w->P); /* whole page, as specified */
            break;
        case KVP_OP_SEAL:
            assert_true(w->staged);
            assert_true(op->dst >= 0 && op->dst < w->N);
            assert_true(op->count == 0 ? op->src == -1 : op->src >= w->N);
            if (op->count > 0) copy_page(w, op->src, op->dst, op->count);
            break;
        case KVP_OP_UNSEAL:
            assert_true(w->staged && op->src < w->N && op->dst >= w->N);
            copy_page(w, op->src, op->dst, op->count);
            break;
        default: fail();
        }
    }
}

/* ---- invariants after every operation ------------------------------------------ */

static const char *last_op = "";
static long op_index;

typedef struct {
    int32_t indptr[MAX_SEQS + 1], indices[(MAX_PAGES + 1) * MAX_SEQS],
        last[MAX_SEQS], qo[MAX_SEQS + 1];
    int64_t slots[MAX_LEN_T * MAX_SEQS];
    int32_t ids[MAX_SEQS], num_new[MAX_SEQS], who[MAX_SEQS];
    int32_t batch;
    kvp_pool_stats_t stats;
} snapshot;

static void take_snapshot(world *w, snapshot *sn) {
    sn->batch = 0;
    for (int i = 0; i < MAX_SEQS; i++) {
        if (!w->seqs[i].live) continue;
        sn->who[sn->batch] = i;
        sn->ids[sn->batch] = w->seqs[i].id;
        sn->num_new[sn->batch] = (int32_t)rnd(w, (uint32_t)w->seqs[i].len + 1);
        sn->batch++;
    }
    int64_t ni = -1, ns = -1;
    assert_int_equal(kvp_table_export_size(w->t, sn->ids, sn->batch, sn->num_new, &ni, &ns), KVP_OK);
    kvp_batch_buffers_t b = {.struct_size = sizeof b};
    b.indptr = sn->indptr;
    b.indices = sn->indices;
    b.last_page_len = sn->last;
    b.slot_mapping = sn->slots;
    b.qo_indptr = sn->qo;
    b.indices_capacity = ni;
    b.slots_capacity = ns;
    kvp_kv_view_t view = {.struct_size = sizeof view};
    assert_int_equal(kvp_table_export(w->t, sn->ids, sn->batch, sn->num_new, &b, &view), KVP_OK);
    assert_int_equal(sn->indptr[sn->batch], ni);
    assert_int_equal(sn->qo[sn->batch], ns);
    assert_int_equal(view.num_pages, w->N);
    assert_int_equal(view.num_staging, w->S);
    memset(&sn->stats, 0, sizeof sn->stats);
    sn->stats.struct_size = sizeof sn->stats;
    assert_int_equal(kvp_pool_stats(w->pool, &sn->stats), KVP_OK);
}

static bool same_snapshot(const snapshot *a, const snapshot *b) {
    if (a->batch != b->batch) return false;
    int32_t n = a->indptr[a->batch];
    return !memcmp(a->indptr, b->indptr, (size_t)(a->batch + 1) * 4) &&
           !memcmp(a->indices, b->indices, (size_t)n * 4) &&
           !memcmp(a->last, b->last, (size_t)a->batch * 4) &&
           a->stats.free_pages == b->stats.free_pages &&
           a->stats.cached_pages == b->stats.cached_pages &&
           a->stats.reserved_pages == b->stats.reserved_pages &&
           a->stats.live_tokens == b->stats.live_tokens &&
           a->stats.used_staging == b->stats.used_staging;
}

static void check_sequence(world *w, const snapshot *sn, int b, int32_t *refs) {
    const rseq *s = &w->seqs[sn->who[b]];
    int64_t P = w->P;
    int32_t n = sn->indptr[b + 1] - sn->indptr[b];
    int32_t want = (int32_t)(w->staged ? s->len / P + (s->len % P != 0) : (s->len + P - 1) / P);
    assert_int_equal(n, want);
    assert_int_equal(sn->last[b], s->len == 0 ? 0 : (s->len % P ? s->len % P : P));
    const int32_t *pg = &sn->indices[sn->indptr[b]];
    for (int i = 0; i < n; i++) {
        bool staging_entry = w->staged && i == n - 1 && s->len % P != 0;
        if (staging_entry) assert_true(pg[i] >= w->N && pg[i] < w->N + w->S);
        else {
            assert_true(pg[i] >= 0 && pg[i] < w->N);
            refs[pg[i]]++;
        }
        for (int j = 0; j < i; j++) assert_int_not_equal(pg[i], pg[j]);
    }
    for (int64_t pos = 0; pos < s->len; pos++) {
        int32_t page = pg[pos / P];
        if (w->store[page * P + pos % P] != s->toks[pos]) {
            print_error("after op %ld (%s): seq slot %d token %lld: store has %d, expected %d (page %d)\n",
                        op_index, last_op, sn->who[b], (long long)pos, w->store[page * P + pos % P], s->toks[pos],
                        page);
            fail();
        }
    }
    /* the rows of "this step" map to the pages that hold them */
    int32_t q = sn->num_new[b];
    for (int32_t r = 0; r < q; r++) {
        int64_t pos = s->len - q + r;
        assert_int_equal(sn->slots[sn->qo[b] + r], (int64_t)pg[pos / P] * P + pos % P);
    }
}

static void check_world(world *w) {
    snapshot sn;
    take_snapshot(w, &sn);
    int32_t refs[MAX_PAGES] = {0};
    int32_t staging_seen[MAX_SEQS];
    int nstaging = 0;
    int64_t tokens = 0;
    for (int b = 0; b < sn.batch; b++) {
        check_sequence(w, &sn, b, refs);
        tokens += w->seqs[sn.who[b]].len;
        kvp_seq_info_t info = {.struct_size = sizeof info};
        assert_int_equal(kvp_table_seq_info(w->t, sn.ids[b], &info), KVP_OK);
        if (w->staged) {
            for (int j = 0; j < nstaging; j++) assert_int_not_equal(staging_seen[j], info.staging_page);
            staging_seen[nstaging++] = info.staging_page;
        }
    }
    for (int e = 0; e < w->nengine; e++) refs[w->engine[e]]++;
    int64_t used = 0, cached = 0;
    for (int p = 0; p < w->N; p++) {
        int32_t ref;
        assert_int_equal(kvp_pool_refcount(w->pool, p, &ref), KVP_OK);
        if (ref != refs[p]) {
            print_error("page %d: refcount %d, references held %d\n", p, ref, refs[p]);
            fail();
        }
        used += ref > 0;
        cached += ref == 0 && w->m_stored[p];
    }
    const kvp_pool_stats_t *st = &sn.stats;
    assert_int_equal(st->free_pages + st->used_pages + st->cached_pages, st->total_pages);
    assert_int_equal(st->used_pages, used);
    assert_int_equal(st->cached_pages, cached);
    assert_int_equal(st->live_tokens, tokens);
    assert_int_equal(st->live_seqs, sn.batch);
    assert_int_equal(st->used_staging, w->staged ? sn.batch : 0);
    assert_int_equal(st->available_pages, st->free_pages + st->cached_pages - st->reserved_pages);
    if (st->available_pages < 0) {
        print_error("after op %ld (%s): free %lld cached %lld reserved %lld\n", op_index, last_op,
                    (long long)st->free_pages, (long long)st->cached_pages,
                    (long long)st->reserved_pages);
        fail();
    }
    char err[KVP_ERR_SIZE];
    if (kvp__table_check(w->t, err, sizeof err) != KVP_OK) {
        print_error("invariant: %s\n", err);
        fail();
    }
}

/* ---- operations -------------------------------------------------------------------- */

static rseq *pick_live(world *w) {
    int live[MAX_SEQS], n = 0;
    for (int i = 0; i < MAX_SEQS; i++)
        if (w->seqs[i].live) live[n++] = i;
    return n ? &w->seqs[live[rnd(w, (uint32_t)n)]] : NULL;
}

static rseq *free_ref(world *w) {
    for (int i = 0; i < MAX_SEQS; i++)
        if (!w->seqs[i].live) return &w->seqs[i];
    return NULL;
}

static void op_create(world *w) {
    rseq *s = free_ref(w);
    if (s == NULL) return;
    uint64_t salt = rnd(w, 4) == 0 ? 77 : 0;
    int32_t priority = (int32_t)rnd(w, 3);
    int32_t id;
    int rc = kvp_table_seq_create(w->t, priority, salt, &id);
    if (rc != KVP_OK) {
        assert_int_equal(rc, KVP_ENOSPC); /* staging pages all held */
        assert_true(w->staged);
        return;
    }
    memset(s, 0, sizeof *s);
    s->live = true;
    s->id = id;
    s->salt = salt;
}

static void fill_tokens(world *w, int32_t *toks, int64_t from, int64_t n) {
    int tmpl = (int)rnd(w, 3);
    for (int64_t i = 0; i < n; i++)
        toks[i] = rnd(w, 16) == 0 ? (int32_t)rnd(w, 11) : template_token(tmpl, from + i);
}

static void op_append(world *w) {
    rseq *s = pick_live(w);
    if (s == NULL) return;
    int64_t n = rnd(w, 3) == 0 ? rnd(w, (uint32_t)(3 * w->P + 1)) : 1;
    if (s->len + n > MAX_LEN_T) n = MAX_LEN_T - s->len;
    int32_t toks[MAX_LEN_T];
    fill_tokens(w, toks, s->len, n);
    bool give_tokens = rnd(w, 10) != 0;
    int64_t slots[MAX_LEN_T];
    kvp_page_op_t ops[MAX_LEN_T + 1];
    int32_t nops = -1;
    int32_t cap = (int32_t)(n / w->P + 1);
    snapshot before;
    take_snapshot(w, &before);
    int rc = kvp_table_append(w->t, s->id, n, give_tokens ? toks : NULL, slots, ops, cap, &nops);
    if (rc != KVP_OK) {
        if (n <= s->room) report_failure(w, "an append within the reservation failed");
        assert_int_equal(rc, KVP_ENOSPC);
        assert_int_equal(w->npend, 0);
        snapshot after;
        take_snapshot(w, &after);
        assert_true(same_snapshot(&before, &after));
        w->ops_failed++;
        return;
    }
    assert_true(nops >= 0 && nops <= cap);
    run_ops(w, ops, nops);
    for (int64_t i = 0; i < n; i++) {
        assert_true(slots[i] >= 0 && slots[i] < (int64_t)(w->N + w->S) * w->P);
        w->store[slots[i]] = toks[i];
    }
    memcpy(&s->toks[s->len], toks, (size_t)n * sizeof *toks);
    s->len += n;
    s->room = s->room > n ? s->room - n : 0;
    apply_events(w, s);
    w->ops_ok++;
}

static void op_reserve(world *w) {
    rseq *s = pick_live(w);
    if (s == NULL) return;
    int64_t n = rnd(w, (uint32_t)(2 * w->P + 2));
    if (s->len + n > MAX_LEN_T) n = MAX_LEN_T - s->len;
    snapshot before;
    take_snapshot(w, &before);
    int rc = kvp_table_reserve(w->t, s->id, n);
    if (rc == KVP_OK) {
        s->room = n;
        kvp_seq_info_t info = {.struct_size = sizeof info};
        assert_int_equal(kvp_table_seq_info(w->t, s->id, &info), KVP_OK);
        assert_int_equal(info.reserved_tokens, n);
        w->ops_ok++;
        return;
    }
    assert_int_equal(rc, KVP_ENOSPC);
    snapshot after;
    take_snapshot(w, &after);
    assert_true(same_snapshot(&before, &after));
    w->ops_failed++;
}

static void op_truncate(world *w) {
    rseq *s = pick_live(w);
    if (s == NULL) return;
    int64_t len = rnd(w, 2) ? s->len - rnd(w, (uint32_t)(s->len < 4 ? s->len + 1 : 4))
                            : rnd(w, (uint32_t)s->len + 1);
    kvp_page_op_t op;
    int32_t nops = -1;
    assert_int_equal(kvp_table_truncate(w->t, s->id, len, &op, 1, &nops), KVP_OK);
    run_ops(w, &op, nops);
    s->len = len;
    s->room = 0;
    apply_events(w, NULL);
    w->ops_ok++;
}

static void op_fork(world *w) {
    rseq *s = pick_live(w), *c = free_ref(w);
    if (s == NULL || c == NULL) return;
    kvp_page_op_t op;
    int32_t nops = -1, id;
    int rc = kvp_table_fork(w->t, s->id, &id, &op, 1, &nops);
    if (rc != KVP_OK) {
        assert_int_equal(rc, KVP_ENOSPC);
        w->ops_failed++;
        return;
    }
    run_ops(w, &op, nops);
    *c = *s;
    c->id = id;
    c->room = 0;
    assert_int_equal(w->npend, 0);
    w->ops_ok++;
}

static void op_release(world *w) {
    rseq *s = pick_live(w);
    if (s == NULL) return;
    assert_int_equal(kvp_table_seq_release(w->t, s->id), KVP_OK);
    assert_int_equal(kvp_table_seq_release(w->t, s->id), KVP_ENOENT);
    s->live = false;
    apply_events(w, NULL);
    w->ops_ok++;
}

static void op_attach(world *w) {
    rseq *s = free_ref(w);
    if (s == NULL) return;
    op_create(w);
    if (!s->live) return;
    int64_t n = rnd(w, MAX_LEN_T / 2);
    int32_t prompt[MAX_LEN_T];
    fill_tokens(w, prompt, 0, n);
    kvp_pool_stats_t st = {.struct_size = sizeof st};
    assert_int_equal(kvp_pool_stats(w->pool, &st), KVP_OK);
    int64_t expect = predict_match(w, s->salt, prompt, n, st.available_pages);
    int64_t looked = -1, matched = -1;
    assert_int_equal(kvp_table_lookup_prefix(w->t, s->salt, prompt, n, &looked), KVP_OK);
    assert_int_equal(kvp_table_attach_prefix(w->t, s->id, prompt, n, &matched), KVP_OK);
    if (matched != expect) {
        print_error("attach matched %lld tokens, the mirror predicts %lld\n", (long long)matched,
                    (long long)expect);
        fail();
    }
    assert_true(matched <= looked && looked % w->P == 0);
    memcpy(s->toks, prompt, (size_t)matched * sizeof *prompt);
    s->len = matched;
    w->attach_hits += matched > 0;
    assert_int_equal(w->npend, 0);
    w->ops_ok++;
}

static void op_evict(world *w) {
    int32_t evicted = -1;
    assert_int_equal(kvp_pool_evict(w->pool, (int32_t)rnd(w, 3), &evicted), KVP_OK);
    apply_events(w, NULL);
    w->ops_ok++;
}

static void op_engine(world *w) {
    if (w->nengine > 0 && rnd(w, 2)) {
        int i = (int)rnd(w, (uint32_t)w->nengine);
        int32_t page = w->engine[i];
        assert_int_equal(kvp_pool_release(w->pool, 1, &page), KVP_OK);
        w->engine[i] = w->engine[--w->nengine];
    } else if (w->nengine + 2 <= MAX_ENGINE) {
        int32_t pages[2];
        int32_t k = 1 + (int32_t)rnd(w, 2);
        int rc = kvp_pool_alloc(w->pool, k, pages);
        if (rc != KVP_OK) {
            assert_int_equal(rc, KVP_ENOSPC);
            w->ops_failed++;
        } else {
            for (int i = 0; i < k; i++) w->engine[w->nengine++] = pages[i];
            if (rnd(w, 2) && w->nengine < MAX_ENGINE) {
                assert_int_equal(kvp_pool_retain(w->pool, 1, pages), KVP_OK);
                w->engine[w->nengine++] = pages[0];
            }
        }
    }
    apply_events(w, NULL);
    w->ops_ok++;
}

static void op_priority(world *w) {
    rseq *s = pick_live(w);
    if (s == NULL) return;
    if (rnd(w, 2)) {
        assert_int_equal(kvp_table_set_priority(w->t, s->id, (int32_t)rnd(w, 4) - 1), KVP_OK);
    } else {
        int64_t a = rnd(w, (uint32_t)s->len + 1), b = a + rnd(w, (uint32_t)(s->len - a) + 1);
        assert_int_equal(kvp_table_set_range_priority(w->t, s->id, a, b, (int32_t)rnd(w, 5) - 2),
                         KVP_OK);
    }
    w->ops_ok++;
}

static void run_config(int P, int N, int S, int cache, uint64_t hash_mask, uint64_t seed) {
    static world w; /* large: keep off the stack */
    memset(&w, 0, sizeof w);
    w.P = P;
    w.N = N;
    w.S = S;
    w.staged = S > 0;
    w.cache = cache;
    w.rng = seed;
    assert_true(N <= MAX_PAGES && P <= 8 && S <= MAX_SEQS);
    kvp_pool_params_t pp;
    kvp_pool_params_init(&pp);
    pp.page_size = P;
    pp.num_pages = N;
    pp.num_staging = S;
    pp.prefix_cache = cache;
    char err[KVP_ERR_SIZE];
    assert_int_equal(kvp_pool_create(&pp, &w.pool, err, sizeof err), KVP_OK);
    kvp__pool_set_hash_mask(w.pool, hash_mask);
    assert_int_equal(kvp_pool_set_event_callback(w.pool, on_event, &w), KVP_OK);
    assert_int_equal(kvp_table_create(w.pool, MAX_SEQS, &w.t, err, sizeof err), KVP_OK);
    for (long i = 0; w.ops_ok + w.ops_failed < OPS_PER_CONFIG; i++) {
        uint32_t r = rnd(&w, 100);
        op_index = i;
        if (r < 10) last_op = "create", op_create(&w);
        else if (r < 40) last_op = "append", op_append(&w);
        else if (r < 50) last_op = "reserve", op_reserve(&w);
        else if (r < 58) last_op = "truncate", op_truncate(&w);
        else if (r < 64) last_op = "fork", op_fork(&w);
        else if (r < 74) last_op = "release", op_release(&w);
        else if (r < 86) last_op = "attach", op_attach(&w);
        else if (r < 89) last_op = "evict", op_evict(&w);
        else if (r < 94) last_op = "engine", op_engine(&w);
        else last_op = "priority", op_priority(&w);
        check_world(&w);
    }
    print_message("P=%d N=%d S=%d cache=%d mask=%llx: %ld ok, %ld failed as expected, "
                  "%ld attaches hit\n",
                  P, N, S, cache, (unsigned long long)hash_mask, w.ops_ok, w.ops_failed,
                  w.attach_hits);
    assert_true(w.ops_failed > 0); /* memory pressure was reached */
    if (cache) assert_true(w.attach_hits > 0);
    kvp_table_destroy(w.t);
    kvp_pool_destroy(w.pool);
}

static void test_random_paged(void **state) {
    (void)state;
    run_config(4, 24, 0, 1, UINT64_MAX, 0x9e3779b97f4a7c15ull);
}
static void test_random_staged(void **state) {
    (void)state;
    run_config(4, 24, 6, 1, UINT64_MAX, 0x1234567887654321ull);
}
/* Every hash collides: matches must still be exact. */
static void test_random_collisions(void **state) {
    (void)state;
    run_config(2, 20, 0, 1, 0, 0xdeadbeefcafef00dull);
}
static void test_random_staged_odd_page(void **state) {
    (void)state;
    run_config(3, 20, 5, 1, 1, 0x0123456789abcdefull);
}
static void test_random_no_cache(void **state) {
    (void)state;
    run_config(4, 24, 0, 0, UINT64_MAX, 0x5555aaaa5555aaaaull);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_paged),
        cmocka_unit_test(test_random_staged),
        cmocka_unit_test(test_random_collisions),
        cmocka_unit_test(test_random_staged_odd_page),
        cmocka_unit_test(test_random_no_cache),
    };
    return cmocka_run_group_tests_name("table_random", tests, NULL, NULL);
}
