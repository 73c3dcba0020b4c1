/*
 * The queue tier: puts that never wait for the tier behind.
 *
 *   - while the tier behind is stuck in a put, more puts return at once,
 *     and what they queued is visible to get and exists;
 *   - a full queue drops (counted), and a dropped blob is a miss later;
 *   - a removed blob is not written behind, whether it was waiting or
 *     being written when it was removed;
 *   - failures of the tier behind are counted with its words;
 *   - destruction writes what is queued; drain waits for it;
 *   - a cache writes back and through into a file tier behind a queue;
 *   - arguments, allocation failures at creation.
 *
 * Every wait is bounded in time.
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "blobtier.h"
#include "testutil.h"

/* ---- a tier behind: an array, whose put can be held at a gate ------------ */

#define SLOTS 64

typedef struct {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int gate_closed;  /* puts wait while set */
    int in_put;       /* a put is waiting at the gate */
    int fail;         /* puts return KVP_EIO */
    int n;
    kvp_hash_t key[SLOTS];
    uint64_t size[SLOTS];
    uint8_t blob[SLOTS][256];
    long puts, removes;
} slow_t;

static int slot_of(slow_t *s, const kvp_hash_t *k) {
    for (int i = 0; i < s->n; i++)
        if (memcmp(s->key[i].bytes, k->bytes, 32) == 0) return i;
    return -1;
}

static int slow_put(void *self, int32_t n, const kvp_hash_t *keys, const void *const *blobs,
                    const uint64_t *sizes) {
    slow_t *s = (slow_t *)self;
    pthread_mutex_lock(&s->lock);
    s->in_put = 1;
    pthread_cond_broadcast(&s->cond);
    while (s->gate_closed) pthread_cond_wait(&s->cond, &s->lock);
    s->in_put = 0;
    s->puts++;
    int rc = s->fail ? KVP_EIO : KVP_OK;
    for (int32_t i = 0; i < n && rc == KVP_OK; i++) {
        int j = slot_of(s, &keys[i]);
        if (j < 0 && s->n < SLOTS) j = s->n++;
        if (j < 0) continue;
        s->key[j] = keys[i];
        s->size[j] = sizes[i];
        memcpy(s->blob[j], blobs[i], (size_t)sizes[i]);
    }
    pthread_mutex_unlock(&s->lock);
    return rc;
}

static int slow_get(void *self, int32_t n, const kvp_hash_t *keys, void *const *bufs,
                    const uint64_t *caps, uint64_t *sizes) {
    slow_t *s = (slow_t *)self;
    pthread_mutex_lock(&s->lock);
    for (int32_t i = 0; i < n; i++) {
        int j = slot_of(s, &keys[i]);
        sizes[i] = 0;
        if (j >= 0 && s->size[j] <= caps[i]) {
            memcpy(bufs[i], s->blob[j], (size_t)s->size[j]);
            sizes[i] = s->size[j];
        }
    }
    pthread_mutex_unlock(&s->lock);
    return KVP_OK;
}

static int slow_exists(void *self, int32_t n, const kvp_hash_t *keys, uint8_t *present) {
    slow_t *s = (slow_t *)self;
    pthread_mutex_lock(&s->lock);
    for (int32_t i = 0; i < n; i++) present[i] = slot_of(s, &keys[i]) >= 0;
    pthread_mutex_unlock(&s->lock);
    return KVP_OK;
}

static int slow_remove(void *self, int32_t n, const kvp_hash_t *keys) {
    slow_t *s = (slow_t *)self;
    pthread_mutex_lock(&s->lock);
    s->removes++;
    for (int32_t i = 0; i < n; i++) {
        int j = slot_of(s, &keys[i]);
        if (j < 0) continue;
        s->n--;
        s->key[j] = s->key[s->n];
        s->size[j] = s->size[s->n];
        memcpy(s->blob[j], s->blob[s->n], sizeof s->blob[j]);
    }
    pthread_mutex_unlock(&s->lock);
    return KVP_OK;
}

static const char *slow_error(void *self) {
    (void)self;
    return "the disk is on fire";
}

static kvp_blob_tier_t *slow_make(slow_t *s) {
    memset(s, 0, sizeof *s);
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->cond, NULL);
    kvp_blob_tier_ops_t ops;
    memset(&ops, 0, sizeof ops);
    ops.struct_size = sizeof ops;
    ops.get = slow_get;
    ops.put = slow_put;
    ops.exists = slow_exists;
    ops.remove = slow_remove;
    ops.last_error = slow_error;
    kvp_blob_tier_t *t = NULL;
    assert_int_equal(kvp_blob_tier_create(&ops, s, "slow", &t, NULL, 0), KVP_OK);
    return t;
}

static void slow_free(slow_t *s, kvp_blob_tier_t *t) {
    kvp_blob_tier_destroy(t);
    pthread_cond_destroy(&s->cond);
    pthread_mutex_destroy(&s->lock);
}

static void gate(slow_t *s, int closed) {
    pthread_mutex_lock(&s->lock);
    s->gate_closed = closed;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->lock);
}

/* Wait (at most 10 s) until the writer is held at the gate. */
static void wait_in_put(slow_t *s) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 10;
    pthread_mutex_lock(&s->lock);
    while (!s->in_put)
        if (pthread_cond_timedwait(&s->cond, &s->lock, &until) != 0) break;
    int held = s->in_put;
    pthread_mutex_unlock(&s->lock);
    assert_true(held);
}

static kvp_hash_t key_of(int i) {
    kvp_hash_t k;
    memset(&k, 0, sizeof k);
    k.bytes[0] = (uint8_t)i;
    k.bytes[31] = 0xab;
    return k;
}

static kvp_blob_tier_t *queue_make(kvp_blob_tier_t *inner, uint64_t max_bytes) {
    kvp_queue_tier_params_t p;
    kvp_queue_tier_params_init(&p);
    p.inner = inner;
    if (max_bytes) p.max_bytes = max_bytes;
    kvp_blob_tier_t *q = NULL;
    char err[KVP_ERR_SIZE];
    int rc = kvp_queue_tier_create(&p, &q, err, sizeof err);
    if (rc != KVP_OK) print_error("%s\n", err);
    assert_int_equal(rc, KVP_OK);
    return q;
}

static void put_one(kvp_blob_tier_t *q, int i, uint64_t size) {
    uint8_t blob[256];
    memset(blob, i, sizeof blob);
    kvp_hash_t k = key_of(i);
    const void *b = blob;
    assert_int_equal(kvp_blob_tier_put(q, 1, &k, &b, &size), KVP_OK);
}

/* 0 when absent, else its size (and its bytes are all `i`). */
static uint64_t get_one(kvp_blob_tier_t *t, int i) {
    uint8_t buf[256];
    void *b = buf;
    uint64_t cap = sizeof buf, size = 99;
    kvp_hash_t k = key_of(i);
    assert_int_equal(kvp_blob_tier_get(t, 1, &k, &b, &cap, &size), KVP_OK);
    for (uint64_t j = 0; j < size; j++) assert_int_equal(buf[j], (uint8_t)i);
    return size;
}

static kvp_queue_tier_info_t info_of(kvp_blob_tier_t *q) {
    kvp_queue_tier_info_t in = {.struct_size = sizeof in};
    assert_int_equal(kvp_queue_tier_info(q, &in), KVP_OK);
    return in;
}

/* ---- tests ------------------------------------------------------------------ */

static void test_puts_do_not_wait(void **state) {
    (void)state;
    slow_t s;
    kvp_blob_tier_t *inner = slow_make(&s), *q = queue_make(inner, 0);
    gate(&s, 1);
    put_one(q, 1, 100);
    wait_in_put(&s); /* the writer holds blob 1 at the gate */
    for (int i = 2; i <= 9; i++) put_one(q, i, 100); /* and these return anyway */
    for (int i = 1; i <= 9; i++) assert_int_equal(get_one(q, i), 100); /* no wait either */
    kvp_hash_t keys[2] = {key_of(3), key_of(42)};
    uint8_t present[2] = {9, 9};
    assert_int_equal(kvp_blob_tier_exists(q, 1, keys, present), KVP_OK);
    assert_int_equal(present[0], 1);
    kvp_queue_tier_info_t in = info_of(q);
    assert_int_equal(in.queued, 9);
    assert_int_equal(in.queued_bytes, 900);
    assert_int_equal(s.n, 0); /* nothing behind yet */
    kvp_blob_tier_stats_t st = {.struct_size = sizeof st};
    assert_int_equal(kvp_blob_tier_stats(q, &st), KVP_OK);
    assert_int_equal(st.entries, 9);
    gate(&s, 0); /* what is not queued is asked behind */
    assert_int_equal(get_one(q, 42), 0);
    assert_int_equal(kvp_blob_tier_exists(q, 2, keys, present), KVP_OK);
    assert_int_equal(present[0], 1);
    assert_int_equal(present[1], 0);
    assert_int_equal(kvp_queue_tier_drain(q), KVP_OK);
    assert_int_equal(s.n, 9);
    assert_int_equal(info_of(q).queued, 0);
    for (int i = 1; i <= 9; i++) assert_int_equal(get_one(inner, i), 100);
    assert_string_equal(kvp_blob_tier_name(q), "queue:slow");
    kvp_blob_tier_destroy(q);
    slow_free(&s, inner);
}

static void test_full_queue_drops(void **state) {
    (void)state;
    slow_t s;
    kvp_blob_tier_t *inner = slow_make(&s), *q = queue_make(inner, 250);
    gate(&s, 1);
    put_one(q, 1, 100);
    put_one(q, 2, 100);
    put_one(q, 3, 100); /* 300 > 250: dropped */
    kvp_queue_tier_info_t in = info_of(q);
    assert_int_equal(in.dropped, 1);
    assert_int_equal(in.queued, 2);
    gate(&s, 0);
    assert_int_equal(get_one(q, 3), 0);
    assert_int_equal(kvp_queue_tier_drain(q), KVP_OK);
    put_one(q, 4, 200); /* room again */
    assert_int_equal(kvp_queue_tier_drain(q), KVP_OK);
    assert_int_equal(get_one(inner, 4), 200);
    assert_int_equal(info_of(q).dropped, 1);
    kvp_blob_tier_destroy(q);
    slow_free(&s, inner);
}

typedef struct {
    kvp_blob_tier_t *q;
    int n;
    kvp_hash_t keys[4];
    int rc;
} remove_job;

static void *remove_thread(void *arg) {
    remove_job *j = (remove_job *)arg;
    j->rc = kvp_blob_tier_remove(j->q, j->n, j->keys);
    return NULL;
}

static void test_removed_blobs_stay_removed(void **state) {
    (void)state;
    slow_t s;
    kvp_blob_tier_t *inner = slow_make(&s), *q = queue_make(inner, 0);
    gate(&s, 1);
    put_one(q, 1, 50);
    wait_in_put(&s); /* 1 is being written */
    put_one(q, 2, 50); /* 2 and 3 wait */
    put_one(q, 3, 50);
    /* a remove waits for the tier behind, which the stuck put holds: it runs
     * on a thread while the gate opens */
    remove_job j = {q, 2, {key_of(1), key_of(2)}, -100};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, remove_thread, &j), 0);
    gate(&s, 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_int_equal(j.rc, KVP_OK);
    assert_int_equal(kvp_queue_tier_drain(q), KVP_OK);
    assert_int_equal(get_one(inner, 1), 0); /* written, then removed behind */
    assert_int_equal(get_one(inner, 2), 0); /* never written */
    assert_int_equal(get_one(inner, 3), 50);
    assert_int_equal(get_one(q, 1), 0);
    assert_int_equal(get_one(q, 2), 0);
    kvp_blob_tier_destroy(q);
    slow_free(&s, inner);
}

static void test_failures_behind_are_counted(void **state) {
    (void)state;
    slow_t s;
    kvp_blob_tier_t *inner = slow_make(&s), *q = queue_make(inner, 0);
    s.fail = 1;
    put_one(q, 1, 10);
    put_one(q, 2, 10);
    assert_int_equal(kvp_queue_tier_drain(q), KVP_OK);
    kvp_queue_tier_info_t in = info_of(q);
    assert_int_equal(in.failed, 2);
    assert_int_equal(in.queued, 0);
    kvp_hash_t k = key_of(1);
    uint8_t present = 9;
    assert_int_equal(kvp_blob_tier_exists(q, 1, &k, &present), KVP_OK);
    assert_int_equal(present, 0);
    assert_string_equal(kvp_blob_tier_last_error(q), ""); /* puts behind failed, not ours */
    kvp_blob_tier_destroy(q);
    slow_free(&s, inner);
}

static void test_destroy_writes_what_is_queued(void **state) {
    (void)state;
    slow_t s;
    kvp_blob_tier_t *inner = slow_make(&s), *q = queue_make(inner, 0);
    gate(&s, 1);
    for (int i = 1; i <= 20; i++) put_one(q, i, 20); /* more than one batch */
    wait_in_put(&s);
    gate(&s, 0);
    kvp_blob_tier_destroy(q);
    assert_int_equal(s.n, 20);
    for (int i = 1; i <= 20; i++) assert_int_equal(get_one(inner, i), 20);
    slow_free(&s, inner);
}

static void test_arguments(void **state) {
    (void)state;
    slow_t s;
    kvp_blob_tier_t *inner = slow_make(&s), *q = NULL;
    kvp_queue_tier_params_t p;
    kvp_queue_tier_params_init(&p);
    assert_int_equal(p.max_bytes, 256ull << 20);
    char err[KVP_ERR_SIZE];
    assert_int_equal(kvp_queue_tier_create(&p, &q, err, sizeof err), KVP_EINVAL);
    assert_non_null(strstr(err, "inner"));
    p.inner = inner;
    assert_int_equal(kvp_queue_tier_create(&p, NULL, err, sizeof err), KVP_EINVAL);
    assert_int_equal(kvp_queue_tier_create(NULL, &q, err, sizeof err), KVP_EINVAL);
    p.max_bytes = 0;
    assert_int_equal(kvp_queue_tier_create(&p, &q, err, sizeof err), KVP_EINVAL);
    p.max_bytes = 1;
    p.reserved_ = 1;
    assert_int_equal(kvp_queue_tier_create(&p, &q, err, sizeof err), KVP_EINVAL);
    p.reserved_ = 0;
    p.struct_size = 4;
    assert_int_equal(kvp_queue_tier_create(&p, &q, err, sizeof err), KVP_EINVAL);
    assert_null(q);
    kvp_queue_tier_params_init(NULL);
    /* info and drain on another kind of tier, or bad arguments */
    kvp_queue_tier_info_t in = {.struct_size = sizeof in};
    assert_int_equal(kvp_queue_tier_info(inner, &in), KVP_EINVAL);
    assert_non_null(strstr(kvp_blob_tier_last_error(inner), "not a queue tier"));
    assert_int_equal(kvp_queue_tier_drain(inner), KVP_EINVAL);
    assert_int_equal(kvp_queue_tier_info(NULL, &in), KVP_EINVAL);
    assert_int_equal(kvp_queue_tier_drain(NULL), KVP_EINVAL);
    q = queue_make(inner, 0);
    assert_int_equal(kvp_queue_tier_info(q, NULL), KVP_EINVAL);
    in.struct_size = 4;
    assert_int_equal(kvp_queue_tier_info(q, &in), KVP_EINVAL);
    kvp_blob_tier_destroy(q);
    slow_free(&s, inner);
}

static void test_allocation_failures(void **state) {
    (void)state;
    slow_t s;
    kvp_blob_tier_t *inner = slow_make(&s);
    for (long n = 0;; n++) {
        test_alloc_state st = {0, n, 0, 0};
        kvp_queue_tier_params_t p;
        kvp_queue_tier_params_init(&p);
        p.inner = inner;
        p.allocator = test_allocator(&st);
        kvp_blob_tier_t *q = NULL;
        int rc = kvp_queue_tier_create(&p, &q, NULL, 0);
        if (rc == KVP_OK) {
            assert_true(n >= 1);
            kvp_blob_tier_destroy(q); /* no put: every allocation is the creation's */
            assert_int_equal(st.live, 0);
            break;
        }
        assert_int_equal(rc, KVP_ENOMEM);
        assert_null(q);
        assert_int_equal(st.live, 0);
        assert_true(n < 10);
    }
    slow_free(&s, inner);
}

/* A cache writes back and through into a file tier behind a queue. */
static void test_cache_through_a_queue(void **state) {
    (void)state;
    if (!kvp_build_has(KVP_FEATURE_BLOB)) skip();
    char dir[] = "/tmp/kvp_queuetier_XXXXXX";
    assert_non_null(mkdtemp(dir));
    kvp_file_tier_params_t fp;
    kvp_file_tier_params_init(&fp);
    fp.path = dir;
    fp.fsync = 0;
    kvp_blob_tier_t *files = NULL;
    assert_int_equal(kvp_file_tier_create(&fp, &files, NULL, 0), KVP_OK);
    kvp_blob_tier_t *q = queue_make(files, 0);
    kvp_cache_params_t cp;
    kvp_cache_params_init(&cp);
    cp.layers = 2;
    cp.kv_heads = 2;
    cp.head_dim = 64;
    cp.page_size = 4;
    cp.k_format = cp.v_format = KVP_FORMAT_INT8;
    cp.max_seqs = 2;
    cp.num_pages = 4;
    kvp_cache_t *c = NULL;
    assert_int_equal(kvp_cache_create(&cp, &c, NULL, 0), KVP_OK);
    kvp_blob_params_t bp;
    kvp_blob_params_init(&bp);
    bp.fingerprint[0] = 7;
    assert_int_equal(kvp_cache_set_blob(c, &bp), KVP_OK);
    assert_int_equal(kvp_cache_add_tier(c, q, KVP_TIER_WRITE_BACK | KVP_TIER_WRITE_THROUGH, NULL),
                     KVP_OK);
    int32_t seq = -1, n = 12, tokens[12];
    for (int i = 0; i < 12; i++) tokens[i] = 100 + i;
    float kv[12 * 2 * 64];
    for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++) kv[i] = (float)(i % 13) * 0.1f;
    assert_int_equal(kvp_cache_seq_create(c, 0, 0, &seq), KVP_OK);
    assert_int_equal(kvp_cache_begin_step(c, &seq, 1, &n, tokens), KVP_OK);
    for (int32_t l = 0; l < 2; l++)
        assert_int_equal(kvp_cache_write(c, l, KVP_FORMAT_FP32, kv, kv, 0, 0), KVP_OK);
    assert_int_equal(kvp_cache_flush(c), KVP_OK);
    assert_int_equal(kvp_queue_tier_drain(q), KVP_OK);
    kvp_blob_tier_stats_t st = {.struct_size = sizeof st};
    assert_int_equal(kvp_blob_tier_stats(files, &st), KVP_OK);
    assert_int_equal(st.entries, 3);
    kvp_cache_tier_stats_t ts = {.struct_size = sizeof ts};
    assert_int_equal(kvp_cache_tier_stats(c, 0, &ts), KVP_OK);
    assert_int_equal(ts.written, 3);
    kvp_cache_destroy(c);
    kvp_blob_tier_destroy(q);
    kvp_blob_tier_t *again = NULL;
    assert_int_equal(kvp_file_tier_create(&fp, &again, NULL, 0), KVP_OK);
    kvp_blob_tier_stats_t st2 = {.struct_size = sizeof st2};
    assert_int_equal(kvp_blob_tier_stats(again, &st2), KVP_OK);
    assert_int_equal(st2.entries, 3);
    kvp_blob_tier_destroy(again);
    kvp_blob_tier_destroy(files);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_puts_do_not_wait),
        cmocka_unit_test(test_full_queue_drops),
        cmocka_unit_test(test_removed_blobs_stay_removed),
        cmocka_unit_test(test_failures_behind_are_counted),
        cmocka_unit_test(test_destroy_writes_what_is_queued),
        cmocka_unit_test(test_arguments),
        cmocka_unit_test(test_allocation_failures),
        cmocka_unit_test(test_cache_through_a_queue),
    };
    return cmocka_run_group_tests_name("queuetier", tests, NULL, NULL);
}
