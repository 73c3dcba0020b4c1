/*
 * The Redis/Valkey tier, against real servers this program starts on
 * loopback (tests/redis_server.c: redis-server children, no persistence):
 *
 *   - arguments: malformed URIs and parameters are refused with a reason,
 *     an unreachable server is an I/O error, info and reconnect refuse
 *     other kinds of tier;
 *   - one server: put, get, exists, remove, batches in one exchange, a
 *     2 MiB blob, a buffer too small, prefixes and databases apart, TTLs,
 *     passwords (in the URI, percent-encoded, or in the parameters), ACL
 *     users with too few or exactly the documented permissions;
 *   - a sharded set of two servers: keys spread over both, all found;
 *   - faults: a server killed mid-run (misses and refusals, counted, no
 *     crash; back after a restart, by reconnect or once the backoff
 *     elapses), a server that hangs (calls end within their budget, and no
 *     late reply is taken for another call's), a server out of memory
 *     (refusals with its words) or evicting (misses), allocation failures,
 *     threads sharing a tier;
 *   - two caches sharing one server (two engines): a prompt prefilled by
 *     one is attached by the other with the same K/V; deleted, corrupt and
 *     foreign blobs are misses or rejections, counted; the keys are the
 *     prefix and a chain hash, nothing of the tokens;
 *   - a 3-node Cluster: keys spread, a slot moved during the run (MOVED), a
 *     slot left half moved (ASK), a node joining, the same cache round trip
 *     through it, and a node that dies and comes back empty.
 *
 * Without redis-server the tests report SKIPPED with the reason; built
 * without hiredis, the tier's creation must say KVP_ENOTSUP. Every wait is
 * bounded; no assertion is about time.
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "kvpage.h"
#include "kvpage_blob.h"
#include "kvpage_ext.h"
#include "redis_server.h"
#include "testutil.h"

#include "backend.h" /* the store's block formats: which bytes are padding */

#define HDR KVP_BLOB_HEADER_BYTES

/* ---- what every test may leave behind: stopped by the teardown ----------------------- */

#define MAX_OBJ 16

typedef struct {
    rs_server srv[4];
    kvp_blob_tier_t *tier[MAX_OBJ];
    int ntier;
    kvp_cache_t *cache[MAX_OBJ];
    int ncache;
    char dir[64];
} fixture_t;

static fixture_t FX;
static rs_cluster CL;
static int CL_UP;

static int fx_setup(void **state) {
    memset(&FX, 0, sizeof FX);
    *state = &FX;
    return 0;
}

/* Caches first (they hold tiers), then tiers, then servers. */
static int fx_teardown(void **state) {
    (void)state;
    for (int i = 0; i < FX.ncache; i++) kvp_cache_destroy(FX.cache[i]);
    for (int i = 0; i < FX.ntier; i++) kvp_blob_tier_destroy(FX.tier[i]);
    for (int i = 0; i < 4; i++) rs_stop(&FX.srv[i]);
    if (FX.dir[0]) rs_remove_dir(FX.dir);
    memset(&FX, 0, sizeof FX);
    return 0;
}

static const char *skip_reason(void) {
    if (!kvp_build_has(KVP_FEATURE_REDIS))
        return "this build has no Redis tier (HAVE_REDIS=0: hiredis is missing; Debian: "
               "libhiredis-dev)";
    return rs_unavailable();
}

/* Without hiredis the tier says so; without a server, the test is skipped. */
static void require_tier(void) {
    if (kvp_build_has(KVP_FEATURE_REDIS)) return;
    kvp_redis_tier_params_t p;
    kvp_redis_tier_params_init(&p);
    p.uri = "redis://127.0.0.1:6379";
    kvp_blob_tier_t *t = NULL;
    char err[KVP_ERR_SIZE] = "";
    assert_int_equal(kvp_redis_tier_create(&p, &t, err, sizeof err), KVP_ENOTSUP);
    assert_null(t);
    print_message("SKIPPED: %s\n", skip_reason());
    skip();
}

static void require_servers(void) {
    require_tier();
    const char *why = rs_unavailable();
    if (why == NULL) return;
    print_message("SKIPPED: %s\n", why);
    skip();
}

static void require_blob(void) {
    if (kvp_build_has(KVP_FEATURE_BLOB)) return;
    print_message("SKIPPED: this build has no blob layer (HAVE_BLOB=0)\n");
    skip();
}

static rs_server *server_start(int i, const char *conf, const char *const *args, int nargs) {
    int rc = rs_start(&FX.srv[i], conf, args, nargs);
    if (rc != 0) print_error("redis-server: %s\n", rs_error());
    assert_int_equal(rc, 0);
    return &FX.srv[i];
}

/* ---- tiers --------------------------------------------------------------------------- */

/* Short budgets: a dead server fails fast. */
static kvp_redis_tier_params_t params_for(const char *uri) {
    kvp_redis_tier_params_t p;
    kvp_redis_tier_params_init(&p);
    p.uri = uri;
    p.connect_timeout_ms = 200;
    p.timeout_ms = 500;
    p.retry_min_ms = 50;
    p.retry_max_ms = 200;
    return p;
}

static kvp_blob_tier_t *tier_open(const kvp_redis_tier_params_t *p) {
    assert_true(FX.ntier < MAX_OBJ);
    kvp_blob_tier_t *t = NULL;
    char err[KVP_ERR_SIZE] = "";
    int rc = kvp_redis_tier_create(p, &t, err, sizeof err);
    if (rc != KVP_OK) print_error("redis tier on %s: %s (%s)\n", p->uri, kvp_strerror(rc), err);
    assert_int_equal(rc, KVP_OK);
    assert_non_null(t);
    FX.tier[FX.ntier++] = t;
    return t;
}

static kvp_blob_tier_t *tier_at(const char *uri) {
    kvp_redis_tier_params_t p = params_for(uri);
    return tier_open(&p);
}

/* Creation fails with `want`; the detail text. */
static const char *tier_refused(const kvp_redis_tier_params_t *p, int want, const char *what) {
    static char err[KVP_ERR_SIZE];
    err[0] = 0;
    kvp_blob_tier_t *t = NULL;
    int rc = kvp_redis_tier_create(p, &t, err, sizeof err);
    if (rc != want)
        print_error("%s: %s, not %s (%s)\n", what, kvp_strerror(rc), kvp_strerror(want), err);
    if (t != NULL) kvp_blob_tier_destroy(t);
    assert_int_equal(rc, want);
    assert_null(t);
    if (err[0] == 0) print_error("%s: no detail text\n", what);
    assert_true(err[0] != 0);
    return err;
}

static kvp_redis_tier_info_t rinfo(kvp_blob_tier_t *t) {
    kvp_redis_tier_info_t in;
    memset(&in, 0, sizeof in);
    in.struct_size = sizeof in;
    assert_int_equal(kvp_redis_tier_info(t, &in), KVP_OK);
    return in;
}

static kvp_blob_tier_stats_t tstats(kvp_blob_tier_t *t) {
    kvp_blob_tier_stats_t st;
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    assert_int_equal(kvp_blob_tier_stats(t, &st), KVP_OK);
    return st;
}

/* ---- keys and blobs ------------------------------------------------------------------ */

static uint64_t mix(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static kvp_hash_t hkey(uint32_t seed, int i) {
    kvp_hash_t h;
    uint64_t s = mix(((uint64_t)seed << 32) ^ (uint64_t)(uint32_t)i);
    for (int j = 0; j < 4; j++) {
        s = mix(s);
        memcpy(h.bytes + 8 * j, &s, 8);
    }
    return h;
}

/* The server's key of a blob: prefix and 64 lowercase hex digits. */
static void server_key(const char *prefix, const kvp_hash_t *h, char out[160]) {
    size_t n = (size_t)snprintf(out, 160, "%s", prefix);
    for (int i = 0; i < 32; i++) n += (size_t)snprintf(out + n, 160 - n, "%02x", h->bytes[i]);
}

/* A key of that form. */
static int is_blob_key(const char *key, const char *prefix) {
    size_t p = strlen(prefix);
    if (strncmp(key, prefix, p) != 0 || strlen(key) != p + 64) return 0;
    for (size_t i = p; i < p + 64; i++)
        if (!((key[i] >= '0' && key[i] <= '9') || (key[i] >= 'a' && key[i] <= 'f'))) return 0;
    return 1;
}

static uint64_t size_of(int i, uint64_t base) {
    return base ? base : 64 + (uint64_t)(i * 97 % 4000);
}

static uint8_t byte_of(uint32_t seed, int i, uint64_t j) {
    return (uint8_t)(seed * 131u + (uint32_t)i * 17u + (uint32_t)(j * 7u) + (uint32_t)(j >> 9));
}

/* Put blobs i0 .. i0+n-1 of `seed` (sizes size_of(i, base)) in one call; the
 * status (KVP_ENOMEM if this program ran out of memory). No cmocka
 * assertion: threads call it. */
static int put_range(kvp_blob_tier_t *t, uint32_t seed, int i0, int n, uint64_t base) {
    kvp_hash_t *keys = malloc(sizeof *keys * (size_t)n);
    const void **blobs = calloc((size_t)n, sizeof *blobs);
    uint64_t *sizes = malloc(sizeof *sizes * (size_t)n);
    int rc = keys && blobs && sizes ? KVP_OK : KVP_ENOMEM;
    for (int k = 0; k < n && rc == KVP_OK; k++) {
        int i = i0 + k;
        keys[k] = hkey(seed, i);
        sizes[k] = size_of(i, base);
        uint8_t *b = malloc((size_t)sizes[k]);
        if (b == NULL) rc = KVP_ENOMEM;
        for (uint64_t j = 0; b != NULL && j < sizes[k]; j++) b[j] = byte_of(seed, i, j);
        blobs[k] = b;
    }
    if (rc == KVP_OK) rc = kvp_blob_tier_put(t, n, keys, blobs, sizes);
    for (int k = 0; blobs != NULL && k < n; k++) free((void *)(uintptr_t)blobs[k]);
    free(keys);
    free(blobs);
    free(sizes);
    return rc;
}

/* Get them in one call with room `extra` bytes more (or fewer) than each
 * needs: the number found; the status in *rc; *wrong counts blobs found
 * with another size or other bytes. -1 if this program ran out of memory.
 * No cmocka assertion: threads call it. */
static int get_quiet(kvp_blob_tier_t *t, uint32_t seed, int i0, int n, uint64_t base,
                     int64_t extra, int *rc, int *wrong) {
    *wrong = 0;
    size_t room = 0;
    for (int k = 0; k < n; k++) room += (size_t)((int64_t)size_of(i0 + k, base) + extra) + 1;
    /* keys, buffers, capacities, sizes, then the bytes: one allocation */
    size_t head = (sizeof(kvp_hash_t) + sizeof(void *) + 2 * sizeof(uint64_t)) * (size_t)n;
    uint8_t *mem = calloc(1, head + room);
    if (mem == NULL) return -1;
    kvp_hash_t *keys = (kvp_hash_t *)(void *)mem;
    void **bufs = (void **)(void *)(mem + sizeof(kvp_hash_t) * (size_t)n);
    uint64_t *caps = (uint64_t *)(void *)((uint8_t *)bufs + sizeof(void *) * (size_t)n);
    uint64_t *sizes = caps + n;
    uint8_t *bytes = mem + head;
    for (int k = 0; k < n; k++) {
        keys[k] = hkey(seed, i0 + k);
        caps[k] = (uint64_t)((int64_t)size_of(i0 + k, base) + extra);
        bufs[k] = bytes;
        bytes += caps[k] + 1;
        sizes[k] = 12345;
    }
    *rc = kvp_blob_tier_get(t, n, keys, (void *const *)bufs, caps, sizes);
    int found = 0;
    for (int k = 0; k < n; k++) {
        int i = i0 + k;
        if (sizes[k] == 0) continue;
        found++;
        int ok = sizes[k] == size_of(i, base);
        const uint8_t *b = bufs[k];
        for (uint64_t j = 0; ok && j < sizes[k]; j++) ok = b[j] == byte_of(seed, i, j);
        if (!ok) (*wrong)++;
    }
    free(mem);
    return found;
}

/* As get_quiet(); every blob found must be the one put. */
static int get_range(kvp_blob_tier_t *t, uint32_t seed, int i0, int n, uint64_t base,
                     int64_t extra, int *rc) {
    int wrong = 0, found = get_quiet(t, seed, i0, n, base, extra, rc, &wrong);
    assert_true(found >= 0);
    if (wrong) print_error("%d blobs of %d found are not the ones put\n", wrong, found);
    assert_int_equal(wrong, 0);
    return found;
}

/* Found, asserting a KVP_OK status. */
static int got(kvp_blob_tier_t *t, uint32_t seed, int i0, int n, uint64_t base) {
    int rc = KVP_OK, found = get_range(t, seed, i0, n, base, 0, &rc);
    if (rc != KVP_OK) print_error("get: %s (%s)\n", kvp_strerror(rc), kvp_blob_tier_last_error(t));
    assert_int_equal(rc, KVP_OK);
    return found;
}

static void put_ok(kvp_blob_tier_t *t, uint32_t seed, int i0, int n, uint64_t base) {
    int rc = put_range(t, seed, i0, n, base);
    if (rc != KVP_OK) print_error("put: %s (%s)\n", kvp_strerror(rc), kvp_blob_tier_last_error(t));
    assert_int_equal(rc, KVP_OK);
}

/* How many of keys i0 .. i0+n-1 the tier holds (status KVP_OK). */
static int present(kvp_blob_tier_t *t, uint32_t seed, int i0, int n) {
    kvp_hash_t keys[64];
    uint8_t flags[64];
    assert_true(n <= 64);
    for (int k = 0; k < n; k++) {
        keys[k] = hkey(seed, i0 + k);
        flags[k] = 7;
    }
    int rc = kvp_blob_tier_exists(t, n, keys, flags);
    if (rc != KVP_OK)
        print_error("exists: %s (%s)\n", kvp_strerror(rc), kvp_blob_tier_last_error(t));
    assert_int_equal(rc, KVP_OK);
    int count = 0;
    for (int k = 0; k < n; k++) {
        assert_true(flags[k] <= 1);
        count += flags[k];
    }
    return count;
}

static void remove_range(kvp_blob_tier_t *t, uint32_t seed, int i0, int n) {
    kvp_hash_t keys[64];
    assert_true(n <= 64);
    for (int k = 0; k < n; k++) keys[k] = hkey(seed, i0 + k);
    int rc = kvp_blob_tier_remove(t, n, keys);
    if (rc != KVP_OK)
        print_error("remove: %s (%s)\n", kvp_strerror(rc), kvp_blob_tier_last_error(t));
    assert_int_equal(rc, KVP_OK);
}

/* Keys of the form prefix + 64 hex on a server's database; -1 if any other
 * key matches the prefix. */
static int blob_keys_on(const rs_server *s, int db, const char *prefix) {
    char pattern[80], **keys = NULL;
    snprintf(pattern, sizeof pattern, "%s*", prefix);
    int n = rs_keys(s, db, pattern, &keys);
    if (n < 0) print_error("SCAN: %s\n", rs_error());
    assert_true(n >= 0);
    int count = 0, stray = 0;
    for (int i = 0; i < n; i++) {
        if (is_blob_key(keys[i], prefix)) count++;
        else {
            print_error("a key that is no blob's: %s\n", keys[i]);
            stray = 1;
        }
    }
    rs_keys_free(keys, n);
    return stray ? -1 : count;
}

static void lower(const char *s, char *out, size_t size) {
    size_t i;
    for (i = 0; s[i] && i + 1 < size; i++)
        out[i] = (char)(s[i] >= 'A' && s[i] <= 'Z' ? s[i] + 32 : s[i]);
    out[i] = 0;
}

/* `needle` in `hay`, ignoring case. */
static int contains(const char *hay, const char *needle) {
    char a[KVP_ERR_SIZE * 2], b[64];
    lower(hay, a, sizeof a);
    lower(needle, b, sizeof b);
    return strstr(a, b) != NULL;
}

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* ---- 1. arguments -------------------------------------------------------------------- */

static void test_feature_switch(void **state) {
    (void)state;
    kvp_redis_tier_params_t p;
    memset(&p, 0x5a, sizeof p);
    kvp_redis_tier_params_init(&p);
    kvp_redis_tier_params_init(NULL);
    assert_int_equal(p.struct_size, sizeof p);
    assert_int_equal(p.cluster, -1);
    assert_null(p.uri);
    assert_null(p.user);
    assert_null(p.password);
    if (p.prefix == NULL) print_error("params_init leaves prefix NULL, not \"kvp:\"\n");
    assert_non_null(p.prefix);
    assert_string_equal(p.prefix, "kvp:");
    assert_int_equal(p.connect_timeout_ms, 250);
    assert_int_equal(p.timeout_ms, 100);
    assert_int_equal(p.ttl_s, 0);
    assert_int_equal(p.retry_min_ms, 100);
    assert_int_equal(p.retry_max_ms, 5000);
    assert_int_equal(p.reserved_, 0);
    assert_null(p.allocator.alloc);
    assert_null(p.allocator.free);
#ifdef KVP_HAVE_REDIS
    assert_int_equal(kvp_build_has(KVP_FEATURE_REDIS), 1);
#else
    assert_int_equal(kvp_build_has(KVP_FEATURE_REDIS), 0);
    /* without hiredis: the tier says so, whatever it is given */
    p.uri = "redis://127.0.0.1:6379";
    kvp_blob_tier_t *t = NULL;
    char err[KVP_ERR_SIZE] = "";
    assert_int_equal(kvp_redis_tier_create(&p, &t, err, sizeof err), KVP_ENOTSUP);
    assert_null(t);
    assert_true(contains(err, "hiredis"));
    kvp_redis_tier_info_t in;
    memset(&in, 0, sizeof in);
    in.struct_size = sizeof in;
    assert_int_equal(kvp_redis_tier_info(NULL, &in), KVP_EINVAL);
    assert_int_equal(kvp_redis_tier_reconnect(NULL), KVP_EINVAL);
#endif
}

static void test_arguments(void **state) {
    (void)state;
    require_tier();
    kvp_redis_tier_params_t p = params_for("redis://127.0.0.1:6379");
    kvp_blob_tier_t *t = NULL;
    char err[KVP_ERR_SIZE];
    assert_int_equal(kvp_redis_tier_create(NULL, &t, err, sizeof err), KVP_EINVAL);
    assert_int_equal(kvp_redis_tier_create(&p, NULL, err, sizeof err), KVP_EINVAL);
    assert_null(t);
    kvp_redis_tier_params_t q = p;
    q.struct_size = 0;
    tier_refused(&q, KVP_EINVAL, "struct_size 0");
    q.struct_size = 4;
    tier_refused(&q, KVP_EINVAL, "struct_size 4");
    q = p;
    q.uri = NULL;
    tier_refused(&q, KVP_EINVAL, "no uri");
    static const char *const bad_uris[] = {
        "",
        "http://x",
        "redis://",
        "redis://host:notaport",
        "redis://h:70000",
        "redis://127.0.0.1:6379/abc",
        "redis://127.0.0.1:6379,http://x",
        "redis://:%zz@127.0.0.1:6379",
    };
    for (size_t i = 0; i < sizeof bad_uris / sizeof bad_uris[0]; i++) {
        q = p;
        q.uri = bad_uris[i];
        tier_refused(&q, KVP_EINVAL, bad_uris[i]);
    }
    char prefix[80];
    memset(prefix, 'p', 65);
    prefix[65] = 0;
    q = p;
    q.prefix = prefix;
    assert_true(contains(tier_refused(&q, KVP_EINVAL, "65-byte prefix"), "prefix"));
    q.connect_timeout_ms = -1;
    q.prefix = "kvp:";
    tier_refused(&q, KVP_EINVAL, "connect_timeout_ms -1");
    q = p;
    q.timeout_ms = -1;
    tier_refused(&q, KVP_EINVAL, "timeout_ms -1");
    q = p;
    q.ttl_s = -1;
    tier_refused(&q, KVP_EINVAL, "ttl_s -1");
    q = p;
    q.retry_min_ms = -1;
    tier_refused(&q, KVP_EINVAL, "retry_min_ms -1");
    q = p;
    q.retry_max_ms = -1;
    tier_refused(&q, KVP_EINVAL, "retry_max_ms -1");
    q = p;
    q.cluster = 2;
    tier_refused(&q, KVP_EINVAL, "cluster 2");
    q = p;
    q.reserved_ = 1;
    tier_refused(&q, KVP_EINVAL, "reserved_ 1");

    /* nothing listens there: an I/O error, after the arguments passed (a
     * 64-byte prefix is allowed) */
    int port = rs_free_port();
    assert_true(port > 0);
    char uri[64];
    snprintf(uri, sizeof uri, "redis://127.0.0.1:%d", port);
    q = params_for(uri);
    memset(prefix, 'p', 64);
    prefix[64] = 0;
    q.prefix = prefix;
    tier_refused(&q, KVP_EIO, "nothing listening");
    q.cluster = 0;
    tier_refused(&q, KVP_EIO, "nothing listening, standalone");

    /* info and reconnect belong to Redis tiers */
    assert_true(snprintf(FX.dir, sizeof FX.dir, "/tmp/kvp_redistier_XXXXXX") > 0);
    assert_non_null(mkdtemp(FX.dir));
    kvp_file_tier_params_t fp;
    kvp_file_tier_params_init(&fp);
    fp.path = FX.dir;
    fp.fsync = 0;
    kvp_blob_tier_t *files = NULL;
    assert_int_equal(kvp_file_tier_create(&fp, &files, NULL, 0), KVP_OK);
    FX.tier[FX.ntier++] = files;
    kvp_redis_tier_info_t in;
    memset(&in, 0, sizeof in);
    in.struct_size = sizeof in;
    assert_int_equal(kvp_redis_tier_info(files, &in), KVP_EINVAL);
    assert_int_equal(kvp_redis_tier_reconnect(files), KVP_EINVAL);
    assert_int_equal(kvp_redis_tier_info(NULL, &in), KVP_EINVAL);
    assert_int_equal(kvp_redis_tier_reconnect(NULL), KVP_EINVAL);
    kvp_queue_tier_params_t qp;
    kvp_queue_tier_params_init(&qp);
    qp.inner = files;
    kvp_blob_tier_t *queue = NULL;
    assert_int_equal(kvp_queue_tier_create(&qp, &queue, NULL, 0), KVP_OK);
    assert_int_equal(kvp_redis_tier_info(queue, &in), KVP_EINVAL);
    assert_int_equal(kvp_redis_tier_reconnect(queue), KVP_EINVAL);
    kvp_blob_tier_destroy(queue);
}

/* A password never shows in a detail text (they end up in logs). */
static void test_no_password_in_errors(void **state) {
    (void)state;
    require_tier();
    int port = rs_free_port();
    assert_true(port > 0);
    char unreachable[96];
    snprintf(unreachable, sizeof unreachable, "redis://alice:s3cret@127.0.0.1:%d", port);
    const struct {
        const char *uri;
        int want;
    } cases[] = {
        {"redis://alice:s3cret@127.0.0.1:notaport", KVP_EINVAL},
        {"redis://:s3cret@127.0.0.1:6379/abc", KVP_EINVAL},
        {"redis://:s3cret@h:70000", KVP_EINVAL},
        {"redis://127.0.0.1:6379,redis://:s3cret@h:70000", KVP_EINVAL},
        {unreachable, KVP_EIO},
    };
    int leaks = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kvp_redis_tier_params_t p = params_for(cases[i].uri);
        const char *err = tier_refused(&p, cases[i].want, cases[i].uri);
        if (strstr(err, "s3cret") != NULL) {
            print_error("the password shows: %s\n", err);
            leaks++;
        }
    }
    assert_int_equal(leaks, 0);
}

/* ---- 2. one server ------------------------------------------------------------------- */

static void test_roundtrip(void **state) {
    (void)state;
    require_servers();
    rs_server *s = server_start(0, NULL, NULL, 0);
    char uri[64];
    rs_uri(s, NULL, uri, sizeof uri);
    kvp_blob_tier_t *t = tier_at(uri);
    assert_non_null(strstr(kvp_blob_tier_name(t), "redis"));
    kvp_redis_tier_info_t in = rinfo(t);
    assert_int_equal(in.cluster, 0);
    assert_int_equal(in.nodes, 1);
    assert_int_equal(in.nodes_down, 0);
    assert_true(in.connects >= 1);
    assert_int_equal(in.failures, 0);

    /* one blob, as the server keeps it */
    put_ok(t, 1, 0, 1, 1000);
    assert_int_equal(got(t, 1, 0, 1, 1000), 1);
    assert_int_equal(present(t, 1, 0, 2), 1);
    char key[160];
    kvp_hash_t h = hkey(1, 0);
    server_key("kvp:", &h, key);
    rs_reply *r = rs_command(s, "GET %s", key);
    assert_non_null(r);
    assert_int_equal(r->type, RS_STRING);
    assert_int_equal(r->len, 1000);
    for (uint64_t j = 0; j < 1000; j++) assert_int_equal((uint8_t)r->str[j], byte_of(1, 0, j));
    rs_reply_free(r);
    assert_int_equal(blob_keys_on(s, 0, "kvp:"), 1);
    remove_range(t, 1, 0, 2); /* an absent key is no error */
    assert_int_equal(got(t, 1, 0, 1, 1000), 0);
    assert_int_equal(present(t, 1, 0, 1), 0);
    assert_int_equal(rs_int(s, 0, "EXISTS %s", key), 0);

    /* 32 blobs of various sizes: one exchange each way */
    in = rinfo(t);
    put_ok(t, 2, 0, 32, 0);
    kvp_redis_tier_info_t in2 = rinfo(t);
    assert_int_equal(in2.round_trips - in.round_trips, 1);
    assert_int_equal(in2.commands - in.commands, 32);
    assert_int_equal(got(t, 2, 0, 32, 0), 32);
    kvp_redis_tier_info_t in3 = rinfo(t);
    assert_int_equal(in3.round_trips - in2.round_trips, 1);
    assert_int_equal(in3.commands - in2.commands, 32);
    assert_int_equal(present(t, 2, 0, 32), 32);
    assert_int_equal(got(t, 2, 16, 32, 0), 16); /* half of them there */
    assert_int_equal(blob_keys_on(s, 0, "kvp:"), 32);
    kvp_blob_tier_stats_t st = tstats(t);
    assert_int_equal(st.puts, 33);
    assert_int_equal(st.errors, 0);

    /* 2 MiB; and a buffer one byte too small is a miss */
    const uint64_t big = 2u << 20;
    put_ok(t, 3, 0, 1, big);
    assert_int_equal(got(t, 3, 0, 1, big), 1);
    int rc = KVP_EIO;
    assert_int_equal(get_range(t, 3, 0, 1, big, -1, &rc), 0);
    assert_int_equal(rc, KVP_OK);
    assert_int_equal(get_range(t, 2, 5, 3, 0, -1, &rc), 0);
    assert_int_equal(rc, KVP_OK);
    assert_int_equal(get_range(t, 2, 5, 3, 0, 1000, &rc), 3); /* room to spare */
    assert_int_equal(rc, KVP_OK);

    in = rinfo(t);
    assert_int_equal(in.failures, 0);
    assert_int_equal(in.timeouts, 0);
    assert_int_equal(in.server_errors, 0);
    assert_int_equal(in.skipped, 0);
    assert_int_equal(in.moved, 0);
    assert_int_equal(in.asked, 0);
    assert_int_equal(kvp_redis_tier_reconnect(t), KVP_OK);
    assert_int_equal(got(t, 2, 0, 32, 0), 32);
    in.struct_size = 4;
    assert_int_equal(kvp_redis_tier_info(t, &in), KVP_EINVAL);
    assert_int_equal(kvp_redis_tier_info(t, NULL), KVP_EINVAL);

    /* the same key twice in one call */
    kvp_hash_t twice[2] = {hkey(2, 7), hkey(2, 7)};
    uint8_t b0[8192], b1[8192];
    void *bufs[2] = {b0, b1};
    uint64_t caps[2] = {sizeof b0, sizeof b1}, sizes[2] = {0, 0};
    assert_int_equal(kvp_blob_tier_get(t, 2, twice, bufs, caps, sizes), KVP_OK);
    assert_int_equal(sizes[0], size_of(7, 0));
    assert_int_equal(sizes[1], size_of(7, 0));
    assert_memory_equal(b0, b1, (size_t)sizes[0]);

    /* 300 blobs in one call */
    put_ok(t, 4, 0, 300, 100);
    assert_int_equal(got(t, 4, 0, 300, 100), 300);

    /* a key of ours holding another type (someone else's doing): a miss
     * and a server error, the other keys of the call answered */
    h = hkey(2, 0);
    server_key("kvp:", &h, key);
    assert_int_equal(rs_int(s, 0, "UNLINK %s", key), 1);
    assert_int_equal(rs_int(s, 0, "LPUSH %s x", key), 1);
    uint64_t errors = rinfo(t).server_errors;
    rc = KVP_EIO;
    assert_int_equal(get_range(t, 2, 0, 8, 0, 0, &rc), 7);
    assert_int_equal(rc, KVP_OK);
    in = rinfo(t);
    assert_true(in.server_errors > errors);
    assert_int_equal(in.nodes_down, 0);
    assert_int_equal(got(t, 2, 1, 7, 0), 7);
    put_ok(t, 2, 0, 1, 0); /* SET replaces it */
    assert_int_equal(got(t, 2, 0, 8, 0), 8);

    /* a host name */
    char named[64];
    snprintf(named, sizeof named, "redis://localhost:%d", s->port);
    assert_int_equal(got(tier_at(named), 2, 0, 32, 0), 32);
}

static void test_prefixes_and_databases(void **state) {
    (void)state;
    require_servers();
    rs_server *s = server_start(0, NULL, NULL, 0);
    char uri[64], uri1[64], uri2[64];
    rs_uri(s, NULL, uri, sizeof uri);
    rs_uri(s, "/1", uri1, sizeof uri1);
    rs_uri(s, "/2", uri2, sizeof uri2);
    kvp_redis_tier_params_t p = params_for(uri);
    p.prefix = "a:";
    kvp_blob_tier_t *a = tier_open(&p);
    p.prefix = "b:";
    kvp_blob_tier_t *b = tier_open(&p);
    put_ok(a, 4, 0, 8, 0);
    assert_int_equal(got(b, 4, 0, 8, 0), 0);
    assert_int_equal(present(b, 4, 0, 8), 0);
    remove_range(b, 4, 0, 8);
    assert_int_equal(got(a, 4, 0, 8, 0), 8);
    assert_int_equal(blob_keys_on(s, 0, "a:"), 8);
    assert_int_equal(blob_keys_on(s, 0, "b:"), 0);

    kvp_blob_tier_t *d1 = tier_at(uri1), *d2 = tier_at(uri2);
    put_ok(d1, 5, 0, 8, 0);
    assert_int_equal(got(d2, 5, 0, 8, 0), 0);
    assert_int_equal(present(d2, 5, 0, 8), 0);
    remove_range(d2, 5, 0, 8);
    assert_int_equal(got(d1, 5, 0, 8, 0), 8);
    assert_int_equal(blob_keys_on(s, 1, "kvp:"), 8);
    assert_int_equal(blob_keys_on(s, 2, "kvp:"), 0);
    assert_int_equal(blob_keys_on(s, 0, "kvp:"), 0);

    /* a database the server does not have: refused with its words */
    char uri99[64];
    rs_uri(s, "/99", uri99, sizeof uri99);
    kvp_redis_tier_params_t q = params_for(uri99);
    kvp_blob_tier_t *none = NULL;
    char err[KVP_ERR_SIZE] = "";
    int rc = kvp_redis_tier_create(&q, &none, err, sizeof err);
    print_message("database 99: %s (%s)\n", kvp_strerror(rc), err);
    assert_true(rc == KVP_EIO || rc == KVP_EINVAL);
    assert_null(none);
    assert_true(contains(err, "range"));

    /* a prefix with a space and a colon is one key, as given */
    p.prefix = "my app:v1 ";
    kvp_blob_tier_t *sp = tier_open(&p);
    put_ok(sp, 4, 0, 8, 0);
    assert_int_equal(got(sp, 4, 0, 8, 0), 8);
    assert_int_equal(blob_keys_on(s, 0, "my app:v1 "), 8);
}

static void test_ttl(void **state) {
    (void)state;
    require_servers();
    rs_server *s = server_start(0, NULL, NULL, 0);
    char uri[64], key[160];
    rs_uri(s, NULL, uri, sizeof uri);
    kvp_redis_tier_params_t p = params_for(uri);
    p.ttl_s = 100;
    p.prefix = "ttl:";
    kvp_blob_tier_t *t = tier_open(&p);
    p.ttl_s = 0;
    p.prefix = "forever:";
    kvp_blob_tier_t *u = tier_open(&p);
    put_ok(t, 6, 0, 4, 0);
    put_ok(u, 6, 0, 4, 0);
    for (int i = 0; i < 4; i++) {
        kvp_hash_t h = hkey(6, i);
        server_key("ttl:", &h, key);
        long long ttl = rs_int(s, 0, "TTL %s", key);
        if (ttl < 1 || ttl > 100) print_error("TTL %s = %lld\n", key, ttl);
        assert_true(ttl >= 1 && ttl <= 100);
        server_key("forever:", &h, key);
        assert_int_equal(rs_int(s, 0, "TTL %s", key), -1);
    }
    assert_int_equal(got(t, 6, 0, 4, 0), 4);
    /* expired: a miss like any other */
    kvp_hash_t h = hkey(6, 0);
    server_key("ttl:", &h, key);
    assert_int_equal(rs_int(s, 0, "PEXPIRE %s 1", key), 1);
    int left = 1;
    for (int i = 0; i < 100 && left; i++) { /* at most ~1 s */
        sleep_ms(10);
        left = got(t, 6, 0, 1, 0);
    }
    assert_int_equal(left, 0);
    assert_int_equal(got(t, 6, 1, 3, 0), 3);
    assert_int_equal(rinfo(t).server_errors, 0);
}

/* A password with characters a URI must escape. */
#define PASSWORD "p@ss:w/rd%x y"
#define PASSWORD_ESC "p%40ss%3Aw%2Frd%25x%20y"

static void test_passwords(void **state) {
    (void)state;
    require_servers();
    const char *args[] = {"--requirepass", PASSWORD};
    rs_server *s = server_start(0, "user alice on >alices-secret ~kvp:* +@all\n", args, 2);
    rs_set_auth(s, NULL, PASSWORD);
    char uri[256], plain[64];
    rs_uri(s, NULL, plain, sizeof plain);

    snprintf(uri, sizeof uri, "redis://:%s@127.0.0.1:%d", PASSWORD_ESC, s->port);
    kvp_blob_tier_t *t = tier_at(uri);
    put_ok(t, 7, 0, 4, 0);
    assert_int_equal(got(t, 7, 0, 4, 0), 4);
    snprintf(uri, sizeof uri, "redis://default:%s@127.0.0.1:%d/0", PASSWORD_ESC, s->port);
    assert_int_equal(got(tier_at(uri), 7, 0, 4, 0), 4);
    kvp_redis_tier_params_t p = params_for(plain);
    p.password = PASSWORD;
    assert_int_equal(got(tier_open(&p), 7, 0, 4, 0), 4);
    p.user = "alice";
    p.password = "alices-secret";
    assert_int_equal(got(tier_open(&p), 7, 0, 4, 0), 4);
    snprintf(uri, sizeof uri, "redis://alice:alices-secret@127.0.0.1:%d", s->port);
    assert_int_equal(got(tier_at(uri), 7, 0, 4, 0), 4);

    /* refused, with the server's words */
    p = params_for(plain);
    p.password = "nope";
    const char *err = tier_refused(&p, KVP_EACCES, "wrong password");
    assert_null(strstr(err, "nope"));
    if (!contains(err, "WRONGPASS") && !contains(err, "invalid username-password"))
        print_error("no server words: %s\n", err);
    assert_true(contains(err, "WRONGPASS") || contains(err, "invalid username-password"));
    snprintf(uri, sizeof uri, "redis://:nope@127.0.0.1:%d", s->port);
    p.uri = uri;
    p.password = NULL;
    assert_null(strstr(tier_refused(&p, KVP_EACCES, "wrong password in the URI"), "nope"));
    p.uri = plain;
    err = tier_refused(&p, KVP_EACCES, "no password");
    if (!contains(err, "NOAUTH") && !contains(err, "authentication"))
        print_error("no server words: %s\n", err);
    assert_true(contains(err, "NOAUTH") || contains(err, "authentication"));

    /* the password changes under a running tier: reconnecting is refused */
    assert_true(rs_ok(s, 0, "CONFIG SET requirepass %s", "changed"));
    rs_set_auth(s, NULL, "changed");
    assert_true(rs_ok(s, 0, "CLIENT KILL TYPE normal"));
    assert_int_equal(kvp_redis_tier_reconnect(t), KVP_EACCES);
    assert_true(contains(kvp_blob_tier_last_error(t), "WRONGPASS") ||
                contains(kvp_blob_tier_last_error(t), "invalid username-password"));
    int rc = KVP_OK;
    assert_int_equal(get_range(t, 7, 0, 4, 0, 0, &rc), 0);
    assert_true(rc == KVP_OK || rc == KVP_EIO || rc == KVP_EACCES);
    assert_true(rs_ok(s, 0, "CONFIG SET requirepass %s", PASSWORD));
    rs_set_auth(s, NULL, PASSWORD);
    assert_int_equal(kvp_redis_tier_reconnect(t), KVP_OK);
    assert_int_equal(got(t, 7, 0, 4, 0), 4);
}

static void test_acl_users(void **state) {
    (void)state;
    require_servers();
    const char *conf = "user reader on >pw ~kvp:* +get +exists +unlink +ping +cluster|slots "
                       "+select\n"
                       "user elsewhere on >pw ~other:* +get +set +exists +unlink +ping "
                       "+cluster|slots +select\n"
                       "user engine on >pw ~kvp:* +get +set +exists +unlink +ping +cluster|slots "
                       "+asking +select\n"
                       "user bare on >pw ~kvp:* +get +set +exists +unlink +ping\n";
    rs_server *s = server_start(0, conf, NULL, 0);
    char uri[160];

    snprintf(uri, sizeof uri, "redis://reader:pw@127.0.0.1:%d", s->port);
    kvp_redis_tier_params_t p = params_for(uri);
    const char *err = tier_refused(&p, KVP_EACCES, "a user without +set");
    if (!contains(err, "set")) print_error("the command is not named: %s\n", err);
    assert_true(contains(err, "set"));
    snprintf(uri, sizeof uri, "redis://elsewhere:pw@127.0.0.1:%d", s->port);
    tier_refused(&p, KVP_EACCES, "a user without the prefix's keys");
    snprintf(uri, sizeof uri, "redis://engine:wrong@127.0.0.1:%d", s->port);
    tier_refused(&p, KVP_EACCES, "a wrong password");

    /* exactly the documented permissions suffice */
    snprintf(uri, sizeof uri, "redis://engine:pw@127.0.0.1:%d/3", s->port);
    kvp_blob_tier_t *t = tier_at(uri);
    put_ok(t, 8, 0, 8, 0);
    assert_int_equal(got(t, 8, 0, 8, 0), 8);
    assert_int_equal(present(t, 8, 0, 8), 8);
    remove_range(t, 8, 0, 4);
    assert_int_equal(got(t, 8, 0, 8, 0), 4);
    assert_int_equal(blob_keys_on(s, 3, "kvp:"), 4);
    /* user and password in the parameters */
    char plain[64];
    rs_uri(s, "/3", plain, sizeof plain);
    p = params_for(plain);
    p.user = "engine";
    p.password = "pw";
    assert_int_equal(got(tier_open(&p), 8, 0, 8, 0), 4);
    /* standalone by configuration, database 0: no CLUSTER, no SELECT needed */
    snprintf(uri, sizeof uri, "redis://bare:pw@127.0.0.1:%d", s->port);
    p = params_for(uri);
    p.cluster = 0;
    t = tier_open(&p);
    put_ok(t, 9, 0, 8, 0);
    assert_int_equal(got(t, 9, 0, 8, 0), 8);
    assert_int_equal(present(t, 9, 0, 8), 8);
    remove_range(t, 9, 0, 8);
    assert_int_equal(got(t, 9, 0, 8, 0), 0);
    assert_int_equal(rinfo(t).server_errors, 0);
}

/* ---- 3. a sharded set ---------------------------------------------------------------- */

static void test_sharded_set(void **state) {
    (void)state;
    require_servers();
    rs_server *a = server_start(0, NULL, NULL, 0), *b = server_start(1, NULL, NULL, 0);
    char uri[160], rev[160];
    snprintf(uri, sizeof uri, "redis://127.0.0.1:%d,redis://127.0.0.1:%d", a->port, b->port);
    snprintf(rev, sizeof rev, "redis://127.0.0.1:%d redis://127.0.0.1:%d", b->port, a->port);
    kvp_blob_tier_t *t = tier_at(uri);
    kvp_redis_tier_info_t in = rinfo(t);
    assert_int_equal(in.cluster, 0);
    assert_int_equal(in.nodes, 2);
    put_ok(t, 10, 0, 64, 0);
    int na = blob_keys_on(a, 0, "kvp:"), nb = blob_keys_on(b, 0, "kvp:");
    print_message("sharded: %d and %d keys\n", na, nb);
    assert_true(na > 0 && nb > 0);
    assert_int_equal(na + nb, 64);
    assert_int_equal(rs_int(a, 0, "DBSIZE") + rs_int(b, 0, "DBSIZE"), 64);
    in = rinfo(t);
    assert_int_equal(got(t, 10, 0, 64, 0), 64);
    kvp_redis_tier_info_t in2 = rinfo(t);
    assert_int_equal(in2.round_trips - in.round_trips, 2); /* one per server */
    assert_int_equal(present(t, 10, 0, 64), 64);
    /* another engine listing the servers in another order finds the same */
    assert_int_equal(got(tier_at(rev), 10, 0, 64, 0), 64);
    remove_range(t, 10, 0, 64);
    assert_int_equal(blob_keys_on(a, 0, "kvp:") + blob_keys_on(b, 0, "kvp:"), 0);

    /* one of them dies: its keys are misses, the other's are found, and
     * the call succeeds */
    put_ok(t, 10, 0, 64, 0);
    na = blob_keys_on(a, 0, "kvp:");
    assert_int_equal(rs_kill(b), 0);
    assert_int_equal(got(t, 10, 0, 64, 0), na);
    int rc = put_range(t, 14, 0, 64, 0); /* refusals for b's share: an error, counted */
    in = rinfo(t);
    assert_int_equal(in.nodes_down, 1);
    assert_true(in.failures + in.skipped >= 1);
    assert_true(rc == KVP_OK || rc == KVP_EIO);
    assert_int_equal(got(t, 14, 0, 64, 0), blob_keys_on(a, 0, "kvp:") - na);
    int alive = 0;
    kvp_hash_t keys[64];
    uint8_t flags[64];
    for (int i = 0; i < 64; i++) keys[i] = hkey(10, i);
    assert_int_equal(kvp_blob_tier_exists(t, 64, keys, flags), KVP_OK);
    for (int i = 0; i < 64; i++) alive += flags[i];
    assert_int_equal(alive, na);
}

/* A get or exists whose server is dead: every key a miss (sizes 0, flags
 * 0); the call says KVP_OK, or KVP_EIO when none of its keys could be
 * asked (the tier's choice: the cache then counts an error). Found. */
static int dead_get(kvp_blob_tier_t *t, uint32_t seed, int i0, int n) {
    int rc = KVP_OK, found = get_range(t, seed, i0, n, 0, 0, &rc);
    if (rc != KVP_OK && rc != KVP_EIO)
        print_error("get: %s (%s)\n", kvp_strerror(rc), kvp_blob_tier_last_error(t));
    assert_true(rc == KVP_OK || rc == KVP_EIO);
    return found;
}

static int dead_exists(kvp_blob_tier_t *t, uint32_t seed, int i0, int n) {
    kvp_hash_t keys[64];
    uint8_t flags[64];
    assert_true(n <= 64);
    for (int k = 0; k < n; k++) {
        keys[k] = hkey(seed, i0 + k);
        flags[k] = 7;
    }
    int rc = kvp_blob_tier_exists(t, n, keys, flags);
    assert_true(rc == KVP_OK || rc == KVP_EIO);
    int count = 0;
    for (int k = 0; k < n; k++) {
        assert_true(flags[k] <= 1);
        count += flags[k];
    }
    return count;
}

/* ---- 4. faults ----------------------------------------------------------------------- */

static void test_server_killed(void **state) {
    (void)state;
    require_servers();
    rs_server *s = server_start(0, NULL, NULL, 0);
    char uri[64];
    rs_uri(s, NULL, uri, sizeof uri);
    kvp_blob_tier_t *t = tier_at(uri);
    put_ok(t, 11, 0, 8, 0);
    assert_int_equal(got(t, 11, 0, 8, 0), 8);

    assert_int_equal(rs_kill(s), 0);
    /* a large put first: the dead connection is written to at length (no
     * SIGPIPE may end the program) */
    int rc = put_range(t, 12, 0, 32, 64 << 10);
    print_message("put to a dead server: %s (%s)\n", kvp_strerror(rc), kvp_blob_tier_last_error(t));
    kvp_redis_tier_info_t in = rinfo(t);
    assert_true(rc != KVP_OK || in.failures + in.skipped >= 1);
    assert_int_equal(dead_get(t, 11, 0, 8), 0);
    assert_int_equal(dead_exists(t, 11, 0, 8), 0);
    rc = put_range(t, 11, 8, 4, 0);
    in = rinfo(t);
    assert_true(rc != KVP_OK || in.failures + in.skipped >= 2);
    kvp_hash_t k = hkey(11, 0);
    rc = kvp_blob_tier_remove(t, 1, &k); /* whatever it says, no crash */
    (void)rc;
    in = rinfo(t);
    print_message("dead: failures %llu skipped %llu timeouts %llu nodes_down %d\n",
                  (unsigned long long)in.failures, (unsigned long long)in.skipped,
                  (unsigned long long)in.timeouts, (int)in.nodes_down);
    assert_true(in.failures >= 1);
    assert_int_equal(in.nodes_down, 1);
    assert_int_equal(kvp_redis_tier_reconnect(t), KVP_EIO);
    assert_true(kvp_blob_tier_last_error(t)[0] != 0);
    assert_int_equal(dead_get(t, 11, 0, 8), 0);

    /* back on the same port, empty: reconnect now */
    assert_int_equal(rs_restart(s), 0);
    uint64_t connects = rinfo(t).connects;
    assert_int_equal(kvp_redis_tier_reconnect(t), KVP_OK);
    in = rinfo(t);
    assert_int_equal(in.nodes_down, 0);
    assert_true(in.connects > connects);
    assert_int_equal(got(t, 11, 0, 8, 0), 0); /* its data went with it */
    put_ok(t, 11, 0, 8, 0);
    assert_int_equal(got(t, 11, 0, 8, 0), 8);

    /* killed and back again, and nobody calls reconnect: after the backoff
     * the tier tries by itself */
    assert_int_equal(rs_kill(s), 0);
    assert_int_equal(dead_get(t, 11, 0, 8), 0);
    assert_int_equal(rinfo(t).nodes_down, 1);
    assert_int_equal(rs_restart(s), 0);
    int back = 0;
    for (int i = 0; i < 60 && !back; i++) { /* at most ~3 s; the backoff is <= 200 ms */
        sleep_ms(50);
        if (put_range(t, 13, 0, 1, 0) == KVP_OK) {
            int r2 = KVP_OK;
            back = get_range(t, 13, 0, 1, 0, 0, &r2) == 1;
        }
    }
    assert_true(back);
    assert_int_equal(rinfo(t).nodes_down, 0);
    put_ok(t, 11, 0, 8, 0);
    assert_int_equal(got(t, 11, 0, 8, 0), 8);
}

/* A server that hangs (stopped: the kernel still accepts connections):
 * calls end within their budget with misses, counted; once it answers
 * again, no reply meant for an abandoned call is taken for another's. */
static void test_server_stalls(void **state) {
    (void)state;
    require_servers();
    rs_server *s = server_start(0, NULL, NULL, 0);
    char uri[64];
    rs_uri(s, NULL, uri, sizeof uri);
    kvp_redis_tier_params_t p = params_for(uri);
    p.timeout_ms = 300;
    kvp_blob_tier_t *t = tier_open(&p);
    put_ok(t, 15, 0, 16, 0); /* sizes differ from key to key */
    assert_int_equal(got(t, 15, 0, 16, 0), 16);

    assert_int_equal(rs_freeze(s, 1), 0);
    assert_int_equal(dead_get(t, 15, 0, 8), 0);
    int rc = put_range(t, 16, 0, 4, 0);
    assert_true(rc == KVP_OK || rc == KVP_EIO);
    assert_int_equal(dead_get(t, 15, 8, 8), 0);
    kvp_redis_tier_info_t in = rinfo(t);
    print_message("hung: timeouts %llu failures %llu skipped %llu\n",
                  (unsigned long long)in.timeouts, (unsigned long long)in.failures,
                  (unsigned long long)in.skipped);
    assert_true(in.timeouts >= 1);
    assert_true(kvp_blob_tier_last_error(t)[0] != 0);

    assert_int_equal(rs_freeze(s, 0), 0);
    int back = 0;
    for (int i = 0; i < 60 && back < 8; i++) { /* at most ~3 s; backoff <= 200 ms */
        sleep_ms(50);
        int r2 = KVP_OK;
        back = get_range(t, 15, 8, 8, 0, 0, &r2); /* each checked: size and bytes */
    }
    assert_int_equal(back, 8);
    assert_int_equal(got(t, 15, 0, 16, 0), 16);
    assert_int_equal(present(t, 15, 0, 16), 16);
    put_ok(t, 17, 0, 8, 0);
    assert_int_equal(got(t, 17, 0, 8, 0), 8);
    assert_int_equal(got(t, 15, 3, 5, 0), 5);
}

/* A server out of memory refuses puts (counted, with its words); one that
 * evicts drops old blobs, which are then misses, no error. */
static void test_server_full(void **state) {
    (void)state;
    require_servers();
    const char *refuse[] = {"--maxmemory", "3mb", "--maxmemory-policy", "noeviction"};
    rs_server *s = server_start(0, NULL, refuse, 4);
    char uri[64];
    rs_uri(s, NULL, uri, sizeof uri);
    kvp_blob_tier_t *t = tier_at(uri);
    put_ok(t, 18, 0, 4, 100);
    int rc = KVP_OK;
    for (int i = 0; i < 8 && rc == KVP_OK; i++) rc = put_range(t, 19, i, 1, 1 << 20);
    print_message("full: %s (%s)\n", kvp_strerror(rc), kvp_blob_tier_last_error(t));
    assert_int_equal(rc, KVP_EIO);
    assert_true(contains(kvp_blob_tier_last_error(t), "OOM"));
    kvp_redis_tier_info_t in = rinfo(t);
    assert_true(in.server_errors >= 1);
    assert_int_equal(in.nodes_down, 0); /* the server answers: it is not down */
    assert_int_equal(got(t, 18, 0, 4, 100), 4);

    const char *evict[] = {"--maxmemory", "4mb", "--maxmemory-policy", "allkeys-lru"};
    rs_server *e = server_start(1, NULL, evict, 4);
    rs_uri(e, NULL, uri, sizeof uri);
    kvp_blob_tier_t *u = tier_at(uri);
    for (int i = 0; i < 24; i++) put_ok(u, 20, i, 1, 256 << 10);
    int found = got(u, 20, 0, 24, 256 << 10);
    print_message("evicting: %d of 24 blobs kept\n", found);
    assert_true(found >= 1 && found < 24);
    in = rinfo(u);
    assert_int_equal(in.server_errors, 0);
    assert_int_equal(in.failures, 0);
}

/* Creation and calls with an allocator that fails: KVP_ENOMEM, nothing leaked. */
static void test_allocation_failures(void **state) {
    (void)state;
    require_servers();
    rs_server *s = server_start(0, NULL, NULL, 0);
    char uri[64];
    rs_uri(s, NULL, uri, sizeof uri);
    kvp_redis_tier_params_t p = params_for(uri);
    long created = 0;
    for (long n = 0;; n++) {
        test_alloc_state st = {0, n, 0, 0};
        p.allocator = test_allocator(&st);
        kvp_blob_tier_t *t = NULL;
        int rc = kvp_redis_tier_create(&p, &t, NULL, 0);
        if (rc == KVP_OK) {
            put_ok(t, 21, 0, 32, 0);
            assert_int_equal(got(t, 21, 0, 32, 0), 32);
            kvp_blob_tier_destroy(t);
            assert_int_equal(st.live, 0);
            created = n;
            break;
        }
        if (rc != KVP_ENOMEM) print_error("allocation %ld: %s\n", n, kvp_strerror(rc));
        assert_int_equal(rc, KVP_ENOMEM);
        assert_null(t);
        assert_int_equal(st.live, 0);
        assert_true(n < 1000);
    }
    /* every allocation of a call fails in turn: ENOMEM or success, never a crash */
    long k = 0;
    for (; k < 200; k++) {
        test_alloc_state st = {0, -1, 0, 0};
        p.allocator = test_allocator(&st);
        kvp_blob_tier_t *t = NULL;
        assert_int_equal(kvp_redis_tier_create(&p, &t, NULL, 0), KVP_OK);
        long base = st.calls;
        st.fail_at = base + k;
        int rc = put_range(t, 22, 0, 64, 0);
        assert_true(rc == KVP_OK || rc == KVP_ENOMEM);
        int r2 = KVP_OK;
        get_range(t, 22, 0, 64, 0, 0, &r2); /* what it finds is checked */
        assert_true(r2 == KVP_OK || r2 == KVP_ENOMEM);
        long used = st.calls - base;
        st.fail_at = -1;
        put_ok(t, 22, 0, 64, 0);
        assert_int_equal(got(t, 22, 0, 64, 0), 64);
        kvp_blob_tier_destroy(t);
        assert_int_equal(st.live, 0);
        if (used <= k) break; /* no allocation failed: past the last one */
    }
    print_message("allocations: %ld at creation, %ld in the calls\n", created, k);
    assert_true(k < 200);
}

/* Several threads on one tier: the lock serializes them, every answer is right. */
typedef struct {
    kvp_blob_tier_t *t;
    uint32_t seed;
    int ok;
} worker_t;

static void *worker(void *arg) {
    worker_t *w = (worker_t *)arg;
    w->ok = 1;
    for (int it = 0; it < 16 && w->ok; it++) {
        if (put_range(w->t, w->seed, it * 8, 8, 0) != KVP_OK) w->ok = 0;
        int rc = KVP_OK, wrong = 0, n = (it + 1) * 8;
        if (get_quiet(w->t, w->seed, 0, n, 0, 0, &rc, &wrong) != n || rc != KVP_OK || wrong)
            w->ok = 0;
    }
    return NULL;
}

static void test_threads(void **state) {
    (void)state;
    require_servers();
    rs_server *s = server_start(0, NULL, NULL, 0);
    char uri[64];
    rs_uri(s, NULL, uri, sizeof uri);
    kvp_redis_tier_params_t p = params_for(uri);
    p.timeout_ms = 5000; /* waiting for the lock counts against it */
    kvp_blob_tier_t *t = tier_open(&p);
    worker_t w[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        w[i] = (worker_t){t, 40u + (uint32_t)i, 0};
        assert_int_equal(pthread_create(&th[i], NULL, worker, &w[i]), 0);
    }
    for (int i = 0; i < 4; i++) assert_int_equal(pthread_join(th[i], NULL), 0);
    for (int i = 0; i < 4; i++) assert_true(w[i].ok);
    assert_int_equal(blob_keys_on(s, 0, "kvp:"), 4 * 128);
    assert_int_equal(rinfo(t).failures, 0);
}

/* ---- 5. two caches, one server ------------------------------------------------------- */

#define CL_ 2
#define CH 2
#define CD 64
#define QH 4
#define CROW (CH * CD)
#define P 8
#define MAX_SEQ_PAGES 16

static kvp_cache_t *cache_make(int32_t kf, int32_t vf) {
    kvp_cache_params_t p;
    kvp_cache_params_init(&p);
    p.layers = CL_;
    p.kv_heads = CH;
    p.head_dim = CD;
    p.page_size = P;
    p.k_format = kf;
    p.v_format = vf;
    p.num_pages = 16;
    p.max_seqs = 4;
    kvp_cache_t *c = NULL;
    char err[KVP_ERR_SIZE] = "";
    int rc = kvp_cache_create(&p, &c, err, sizeof err);
    if (rc != KVP_OK) print_error("cache: %s\n", err);
    assert_int_equal(rc, KVP_OK);
    assert_true(FX.ncache < MAX_OBJ);
    FX.cache[FX.ncache++] = c;
    return c;
}

static void cache_identity(kvp_cache_t *c, uint8_t seed, int32_t shard, int32_t count,
                           const uint8_t *key, int32_t keylen) {
    kvp_blob_params_t p;
    kvp_blob_params_init(&p);
    for (int i = 0; i < KVP_FINGERPRINT_BYTES; i++) p.fingerprint[i] = (uint8_t)(seed + i);
    p.shard_index = shard;
    p.shard_count = count;
    p.auth_key = key;
    p.auth_key_bytes = keylen;
    int rc = kvp_cache_set_blob(c, &p);
    if (rc != KVP_OK) print_error("set_blob: %s\n", kvp_cache_last_error(c));
    assert_int_equal(rc, KVP_OK);
}

/* A cache of the usual shape (fp16) with identity `seed` and one tier. */
static kvp_cache_t *engine(kvp_blob_tier_t *t, int32_t policy, uint8_t seed) {
    kvp_cache_t *c = cache_make(KVP_FORMAT_FP16, KVP_FORMAT_FP16);
    cache_identity(c, seed, 0, 1, NULL, 0);
    int32_t idx = -1;
    assert_int_equal(kvp_cache_add_tier(c, t, policy, &idx), KVP_OK);
    assert_int_equal(idx, 0);
    return c;
}

static kvp_cache_parts_t parts_of(const kvp_cache_t *c) {
    kvp_cache_parts_t parts;
    memset(&parts, 0, sizeof parts);
    parts.struct_size = sizeof parts;
    assert_int_equal(kvp_cache_parts(c, &parts), KVP_OK);
    return parts;
}

static kvp_cache_tier_stats_t cstats(const kvp_cache_t *c) {
    kvp_cache_tier_stats_t st;
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    assert_int_equal(kvp_cache_tier_stats(c, 0, &st), KVP_OK);
    return st;
}

static int32_t seq_pages(const kvp_cache_t *c, int32_t seq, int32_t pages[MAX_SEQ_PAGES]) {
    kvp_table_t *t = parts_of(c).table;
    kvp_seq_info_t in = {.struct_size = sizeof in};
    assert_int_equal(kvp_table_seq_info(t, seq, &in), KVP_OK);
    assert_true(in.num_pages <= MAX_SEQ_PAGES);
    assert_int_equal(kvp_table_seq_pages(t, seq, pages, MAX_SEQ_PAGES), KVP_OK);
    return in.num_pages;
}

/* A page's serialization with its block padding zeroed (as a blob carries it). */
static uint8_t *page_scrubbed(kvp_store_t *st, int32_t page) {
    uint64_t n = st->layout.page_bytes;
    uint8_t *b = malloc((size_t)n);
    assert_non_null(b);
    assert_int_equal(kvp_store_page_to_host(st, page, 0, b, n), KVP_OK);
    const kvp__blockfmt *fmt[2] = {&st->kfmt, &st->vfmt};
    uint64_t side[2] = {st->page_stride_k, st->page_stride_v};
    int32_t H = st->layout.kv_heads;
    uint8_t *q = b;
    for (int32_t l = 0; l < st->layout.layers; l++)
        for (int sd = 0; sd < 2; sd++) {
            uint64_t block = side[sd] / (uint64_t)H, used = kvp__block_used_bytes(fmt[sd]);
            for (int32_t h = 0; h < H; h++)
                memset(q + (uint64_t)h * block + used, 0, (size_t)(block - used));
            q += side[sd];
        }
    return b;
}

/* The first `count` pages of two sequences hold the same K/V bytes. */
static void assert_same_pages(const kvp_cache_t *a, int32_t sa, const kvp_cache_t *b, int32_t sb,
                              int32_t count) {
    int32_t pa[MAX_SEQ_PAGES], pb[MAX_SEQ_PAGES];
    assert_true(seq_pages(a, sa, pa) >= count);
    assert_true(seq_pages(b, sb, pb) >= count);
    kvp_store_t *sta = parts_of(a).store, *stb = parts_of(b).store;
    for (int32_t i = 0; i < count; i++) {
        uint8_t *x = page_scrubbed(sta, pa[i]), *y = page_scrubbed(stb, pb[i]);
        if (memcmp(x, y, (size_t)sta->layout.page_bytes) != 0)
            print_error("page %d differs\n", (int)i);
        assert_memory_equal(x, y, (size_t)sta->layout.page_bytes);
        free(x);
        free(y);
    }
}

typedef struct {
    uint64_t s;
} rng_t;

static float rng_float(rng_t *r) {
    r->s = mix(r->s);
    return (float)((double)(r->s >> 11) * (4.0 / 9007199254740992.0) - 2.0);
}

/* One step of `n` tokens at pos0..: K/V of every layer from (seed, layer,
 * pos); with `out` ([CL_][n][QH][CD]), attention of queries of (seed, layer). */
static void step(kvp_cache_t *c, int32_t seq, const int32_t *tokens, int32_t n, int64_t pos0,
                 uint64_t seed, float *out) {
    int rc = kvp_cache_begin_step(c, &seq, 1, &n, tokens);
    if (rc != KVP_OK) print_error("begin_step: %s\n", kvp_cache_last_error(c));
    assert_int_equal(rc, KVP_OK);
    float *k = malloc(sizeof(float) * (size_t)n * CROW);
    float *v = malloc(sizeof(float) * (size_t)n * CROW);
    float *q = malloc(sizeof(float) * (size_t)n * QH * CD);
    assert_true(k && v && q);
    for (int32_t layer = 0; layer < CL_; layer++) {
        for (int32_t t = 0; t < n; t++) {
            rng_t r = {seed * 1000003u + (uint64_t)(pos0 + t) * 7919u + (uint64_t)layer};
            for (int i = 0; i < CROW; i++) {
                k[(size_t)t * CROW + (size_t)i] = rng_float(&r);
                v[(size_t)t * CROW + (size_t)i] = rng_float(&r);
            }
        }
        rc = kvp_cache_write(c, layer, KVP_FORMAT_FP32, k, v, 0, 0);
        if (rc != KVP_OK) print_error("write: %s\n", kvp_cache_last_error(c));
        assert_int_equal(rc, KVP_OK);
        if (out == NULL) continue;
        rng_t r = {seed ^ (0x5151u + (uint64_t)layer * 31u)};
        for (size_t i = 0; i < (size_t)n * QH * CD; i++) q[i] = rng_float(&r);
        kvp_attention_params_t ap;
        kvp_attention_params_init(&ap);
        ap.layer = layer;
        ap.q_heads = QH;
        ap.sm_scale = 0.125f;
        ap.q = q;
        ap.out = out + (size_t)layer * (size_t)n * QH * CD;
        rc = kvp_cache_attend(c, &ap);
        if (rc != KVP_OK) print_error("attend: %s\n", kvp_cache_last_error(c));
        assert_int_equal(rc, KVP_OK);
    }
    free(k);
    free(v);
    free(q);
}

static int32_t new_seq(kvp_cache_t *c, uint64_t salt) {
    int32_t s = -1;
    assert_int_equal(kvp_cache_seq_create(c, 0, salt, &s), KVP_OK);
    return s;
}

/* Attach as much of the prompt as the cache finds; the tokens matched. */
static int64_t attach(kvp_cache_t *c, uint64_t salt, const int32_t *toks, int64_t n, int32_t *seq) {
    *seq = new_seq(c, salt);
    int64_t matched = -1;
    int rc = kvp_cache_seq_attach_prefix(c, *seq, toks, n, &matched);
    if (rc != KVP_OK) print_error("attach: %s\n", kvp_cache_last_error(c));
    assert_int_equal(rc, KVP_OK);
    return matched;
}

#define SALT 9
#define NTOK 36 /* 4 full pages and 4 tokens */
#define FULL (NTOK / P)

/* The prompt: token ids no hex digit string or blob byte run could hide. */
static void prompt(int32_t toks[NTOK]) {
    for (int i = 0; i < NTOK; i++) toks[i] = 0x7a5a0000 + 977 * i;
}

/* Cache A prefills the prompt and writes it through; its chain hashes. */
static int32_t prefill(kvp_cache_t *a, const int32_t *toks, kvp_hash_t hashes[FULL]) {
    int32_t sa = new_seq(a, SALT);
    step(a, sa, toks, NTOK, 0, 3, NULL);
    assert_int_equal(kvp_cache_flush(a), KVP_OK);
    kvp_cache_tier_stats_t ts = cstats(a);
    if (ts.errors != 0) print_error("write-through errors: %llu\n", (unsigned long long)ts.errors);
    assert_int_equal(ts.written, FULL);
    assert_int_equal(ts.errors, 0);
    kvp_blob_codec_t *codec = NULL;
    assert_int_equal(kvp_cache_blob_codec(a, &codec), KVP_OK);
    kvp_hash_t root, all[FULL + 1];
    assert_int_equal(kvp_blob_chain_root(codec, SALT, &root), KVP_OK);
    assert_int_equal(kvp_blob_chain(codec, &root, toks, NTOK, all), KVP_OK);
    memcpy(hashes, all, sizeof(kvp_hash_t) * FULL);
    return sa;
}

/* The blob keys a server (database 0) holds under `prefix` are exactly
 * those of `hashes`, and no value carries a page's token ids. */
static void assert_server_holds(const rs_server *const *servers, int nservers, const char *prefix,
                                const kvp_hash_t *hashes, int n, const int32_t *toks) {
    int found = 0;
    for (int s = 0; s < nservers; s++) {
        char pattern[80], **keys = NULL;
        snprintf(pattern, sizeof pattern, "%s*", prefix);
        int nk = rs_keys(servers[s], 0, pattern, &keys);
        assert_true(nk >= 0);
        for (int i = 0; i < nk; i++) {
            if (!is_blob_key(keys[i], prefix)) print_error("stray key %s\n", keys[i]);
            assert_true(is_blob_key(keys[i], prefix));
            int which = -1;
            char want[160];
            for (int j = 0; j < n && which < 0; j++) {
                server_key(prefix, &hashes[j], want);
                if (strcmp(want, keys[i]) == 0) which = j;
            }
            if (which < 0) print_error("a key of no page: %s\n", keys[i]);
            assert_true(which >= 0);
            found++;
            rs_reply *r = rs_command(servers[s], "GET %s", keys[i]);
            assert_non_null(r);
            assert_int_equal(r->type, RS_STRING);
            const uint8_t *page_toks = (const uint8_t *)(toks + which * P);
            for (size_t off = 0; off + sizeof(int32_t) * P <= r->len; off++)
                assert_false(memcmp(r->str + off, page_toks, sizeof(int32_t) * P) == 0);
            for (int t = 0; t < P; t++) { /* nor the ids in decimal in its key */
                char dec[16];
                snprintf(dec, sizeof dec, "%d", (int)toks[which * P + t]);
                assert_null(strstr(keys[i], dec));
            }
            rs_reply_free(r);
        }
        rs_keys_free(keys, nk);
    }
    assert_int_equal(found, n);
}

/* A and B share a prompt through tiers `ta` and `tb` (two connections to
 * the same servers): B attaches A's pages with A's K/V, and continues as A
 * does, bit for bit. */
static void shared_prefix(kvp_blob_tier_t *ta, kvp_blob_tier_t *tb, const rs_server *const *servers,
                          int nservers, const char *prefix) {
    int32_t toks[NTOK];
    prompt(toks);
    kvp_cache_t *a = engine(ta, KVP_TIER_WRITE_THROUGH, 0);
    kvp_hash_t hx[FULL];
    int32_t sa = prefill(a, toks, hx);
    assert_server_holds(servers, nservers, prefix, hx, FULL, toks);

    kvp_cache_t *b = engine(tb, KVP_TIER_READ, 0);
    int32_t sb = -1;
    assert_int_equal(attach(b, SALT, toks, NTOK, &sb), FULL * P);
    kvp_cache_tier_stats_t ts = cstats(b);
    assert_int_equal(ts.lookups, FULL);
    assert_int_equal(ts.hit_pages, FULL);
    assert_int_equal(ts.miss_pages, 0);
    assert_int_equal(ts.rejected, 0);
    assert_int_equal(ts.errors, 0);
    assert_same_pages(a, sa, b, sb, FULL);
    float *oa = malloc(sizeof(float) * CL_ * QH * CD), *ob = malloc(sizeof(float) * CL_ * QH * CD);
    assert_true(oa && ob);
    int32_t tok = 0x7a5a7a5a;
    step(a, sa, &tok, 1, NTOK, 44, oa);
    step(b, sb, toks + FULL * P, NTOK - FULL * P, FULL * P, 3, NULL);
    step(b, sb, &tok, 1, NTOK, 44, ob);
    assert_memory_equal(oa, ob, sizeof(float) * CL_ * QH * CD);
    free(oa);
    free(ob);
}

static void test_cache_shared_prefix(void **state) {
    (void)state;
    require_servers();
    require_blob();
    rs_server *s = server_start(0, NULL, NULL, 0);
    char uri[64];
    rs_uri(s, NULL, uri, sizeof uri);
    const rs_server *servers[1] = {s};
    shared_prefix(tier_at(uri), tier_at(uri), servers, 1, "kvp:");
}

/* Blobs deleted or corrupted in the server between A's write and B's lookup. */
static void test_cache_missing_and_corrupt(void **state) {
    (void)state;
    require_servers();
    require_blob();
    rs_server *s = server_start(0, NULL, NULL, 0);
    char uri[64], key[160];
    rs_uri(s, NULL, uri, sizeof uri);
    kvp_blob_tier_t *t = tier_at(uri);
    int32_t toks[NTOK];
    prompt(toks);
    kvp_cache_t *a = engine(t, KVP_TIER_WRITE_THROUGH, 0);
    kvp_hash_t hx[FULL];
    int32_t sa = prefill(a, toks, hx);

    /* page 2 deleted: pages 0 and 1 attach, the rest are misses */
    server_key("kvp:", &hx[2], key);
    assert_int_equal(rs_int(s, 0, "UNLINK %s", key), 1);
    kvp_cache_t *b = engine(tier_at(uri), KVP_TIER_READ, 0);
    int32_t sb = -1;
    assert_int_equal(attach(b, SALT, toks, NTOK, &sb), 2 * P);
    assert_same_pages(a, sa, b, sb, 2);
    kvp_cache_tier_stats_t ts = cstats(b);
    assert_int_equal(ts.hit_pages, 2);
    assert_int_equal(ts.miss_pages, 2);
    assert_int_equal(ts.rejected, 0);
    assert_int_equal(ts.errors, 0);

    /* page 1 corrupted: one payload byte flipped in the server */
    server_key("kvp:", &hx[1], key);
    rs_reply *r = rs_command(s, "GETRANGE %s %d %d", key, HDR + 5, HDR + 5);
    assert_non_null(r);
    assert_int_equal(r->type, RS_STRING);
    assert_int_equal(r->len, 1);
    char flipped = (char)(r->str[0] ^ 0x10);
    rs_reply_free(r);
    assert_true(rs_int(s, 0, "SETRANGE %s %d %b", key, HDR + 5, &flipped, (size_t)1) > HDR);
    kvp_cache_t *c = engine(tier_at(uri), KVP_TIER_READ, 0);
    int32_t sc = -1;
    assert_int_equal(attach(c, SALT, toks, NTOK, &sc), P);
    assert_same_pages(a, sa, c, sc, 1);
    ts = cstats(c);
    assert_int_equal(ts.hit_pages, 1);
    assert_int_equal(ts.rejected, 1);
    assert_int_equal(ts.rejects[KVP_BLOB_CHECKSUM], 1);
    assert_int_equal(ts.errors, 0);
    assert_int_equal(rs_int(s, 0, "EXISTS %s", key), 0); /* the cache removed it */

    /* and every blob deleted: nothing found, nothing failed */
    assert_true(rs_ok(s, 0, "FLUSHDB"));
    kvp_cache_t *d = engine(tier_at(uri), KVP_TIER_READ, 0);
    int32_t sd = -1;
    assert_int_equal(attach(d, SALT, toks, NTOK, &sd), 0);
    ts = cstats(d);
    assert_int_equal(ts.hit_pages, 0);
    assert_int_equal(ts.errors, 0);
    assert_true(ts.miss_pages >= 1);
}

/* B's lookup of A's prompt, from a cache of another identity: no page. */
static void expect_foreign(kvp_cache_t *b, uint64_t salt, const int32_t *toks, const char *what) {
    int32_t sb = -1;
    int64_t matched = attach(b, salt, toks, NTOK, &sb);
    kvp_cache_tier_stats_t ts = cstats(b);
    print_message("%s: matched %lld, lookups %llu, misses %llu, rejected %llu\n", what,
                  (long long)matched, (unsigned long long)ts.lookups,
                  (unsigned long long)ts.miss_pages, (unsigned long long)ts.rejected);
    assert_int_equal(matched, 0);
    assert_int_equal(ts.hit_pages, 0);
    assert_int_equal(ts.errors, 0);
    assert_true(ts.lookups >= 1);
    assert_true(ts.miss_pages + ts.rejected >= 1);
}

static void test_cache_foreign_identities(void **state) {
    (void)state;
    require_servers();
    require_blob();
    rs_server *s = server_start(0, NULL, NULL, 0);
    char uri[64];
    rs_uri(s, NULL, uri, sizeof uri);
    int32_t toks[NTOK];
    prompt(toks);
    kvp_cache_t *a = engine(tier_at(uri), KVP_TIER_WRITE_THROUGH, 0);
    kvp_hash_t hx[FULL];
    prefill(a, toks, hx);

    expect_foreign(engine(tier_at(uri), KVP_TIER_READ, 1), SALT, toks, "another fingerprint");
    kvp_cache_t *f = cache_make(KVP_FORMAT_INT8, KVP_FORMAT_INT8);
    cache_identity(f, 0, 0, 1, NULL, 0);
    assert_int_equal(kvp_cache_add_tier(f, tier_at(uri), KVP_TIER_READ, NULL), KVP_OK);
    expect_foreign(f, SALT, toks, "another format");
    kvp_cache_t *sh = cache_make(KVP_FORMAT_FP16, KVP_FORMAT_FP16);
    cache_identity(sh, 0, 1, 2, NULL, 0);
    assert_int_equal(kvp_cache_add_tier(sh, tier_at(uri), KVP_TIER_READ, NULL), KVP_OK);
    expect_foreign(sh, SALT, toks, "another shard");
    expect_foreign(engine(tier_at(uri), KVP_TIER_READ, 0), SALT + 1, toks, "another salt");

    /* an authentication key: A's blobs carry no tag, so they are refused
     * (last: a refused blob may be removed) */
    static const uint8_t key[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
    kvp_cache_t *k = cache_make(KVP_FORMAT_FP16, KVP_FORMAT_FP16);
    cache_identity(k, 0, 0, 1, key, 16);
    kvp_blob_tier_t *tk = tier_at(uri);
    assert_int_equal(kvp_cache_add_tier(k, tk, KVP_TIER_READ | KVP_TIER_WRITE_THROUGH, NULL),
                     KVP_OK);
    expect_foreign(k, SALT, toks, "another authentication key");
    kvp_cache_tier_stats_t ts = cstats(k);
    assert_int_equal(ts.rejected, 1);
    assert_int_equal(ts.rejects[KVP_BLOB_AUTH], 1);

    /* two engines with the same key share a prompt of their own */
    int32_t sk = new_seq(k, 77);
    step(k, sk, toks, NTOK, 0, 5, NULL);
    assert_int_equal(kvp_cache_flush(k), KVP_OK);
    kvp_cache_t *k2 = cache_make(KVP_FORMAT_FP16, KVP_FORMAT_FP16);
    cache_identity(k2, 0, 0, 1, key, 16);
    assert_int_equal(kvp_cache_add_tier(k2, tier_at(uri), KVP_TIER_READ, NULL), KVP_OK);
    int32_t sk2 = -1;
    assert_int_equal(attach(k2, 77, toks, NTOK, &sk2), FULL * P);
    assert_same_pages(k, sk, k2, sk2, FULL);
    assert_int_equal(cstats(k2).hit_pages, FULL);
}

/* ---- 6. a Cluster -------------------------------------------------------------------- */

static int cluster_setup(void **state) {
    (void)state;
    CL_UP = 0;
    memset(&CL, 0, sizeof CL);
    if (skip_reason() != NULL) return 0; /* each test says why it skips */
    if (rs_cluster_start(&CL, 3, 1) != 0) {
        print_error("Cluster: %s\n", rs_error());
        return -1;
    }
    CL_UP = 1;
    return 0;
}

static int cluster_teardown(void **state) {
    (void)state;
    rs_cluster_stop(&CL);
    CL_UP = 0;
    return 0;
}

static void require_cluster(void) {
    require_servers();
    assert_true(CL_UP);
}

static const rs_server *const *cluster_nodes(void) {
    static const rs_server *nodes[RS_MAX_NODES];
    for (int i = 0; i < RS_MAX_NODES; i++) nodes[i] = &CL.node[i];
    return nodes;
}

static kvp_blob_tier_t *cluster_tier(int node, const char *prefix) {
    char uri[64];
    rs_uri(&CL.node[node], NULL, uri, sizeof uri);
    kvp_redis_tier_params_t p = params_for(uri);
    p.prefix = prefix;
    return tier_open(&p);
}

/* The slot of blob (seed, i) under `prefix`. */
static int slot_of(const char *prefix, uint32_t seed, int i) {
    char key[160];
    kvp_hash_t h = hkey(seed, i);
    server_key(prefix, &h, key);
    return rs_key_slot(key, strlen(key));
}

static void test_cluster_spread(void **state) {
    (void)state;
    require_cluster();
    kvp_blob_tier_t *t = cluster_tier(1, "c1:");
    kvp_redis_tier_info_t in = rinfo(t);
    assert_int_equal(in.cluster, 1);
    assert_int_equal(in.nodes, 3);
    assert_true(in.slot_refreshes >= 1);
    put_ok(t, 20, 0, 64, 0);
    int per[RS_MAX_NODES] = {0};
    assert_int_equal(rs_cluster_count(&CL, "c1:*", per), 64);
    int used = 0;
    for (int i = 0; i < CL.n; i++) used += per[i] > 0;
    print_message("Cluster: %d, %d, %d keys\n", per[0], per[1], per[2]);
    assert_true(used >= 2);
    for (int i = 0; i < 64; i++) { /* each on its slot's node */
        char key[160];
        kvp_hash_t h = hkey(20, i);
        server_key("c1:", &h, key);
        assert_int_equal(rs_int(&CL.node[CL.owner[slot_of("c1:", 20, i)]], 0, "EXISTS %s", key), 1);
    }
    in = rinfo(t);
    assert_int_equal(got(t, 20, 0, 64, 0), 64);
    kvp_redis_tier_info_t in2 = rinfo(t);
    assert_true(in2.round_trips - in.round_trips >= (uint64_t)used);
    assert_true(in2.round_trips - in.round_trips <= 2 * (uint64_t)used);
    assert_int_equal(present(t, 20, 0, 64), 64);
    /* another engine, starting from another node */
    kvp_blob_tier_t *u = cluster_tier(2, "c1:");
    assert_int_equal(got(u, 20, 0, 64, 0), 64);
    remove_range(u, 20, 0, 64);
    assert_int_equal(rs_cluster_count(&CL, "c1:*", NULL), 0);
    assert_int_equal(got(t, 20, 0, 64, 0), 0);
    in = rinfo(t);
    assert_int_equal(in.failures, 0);
    assert_int_equal(in.server_errors, 0);
}

static void test_cluster_slot_moves(void **state) {
    (void)state;
    require_cluster();
    kvp_blob_tier_t *t = cluster_tier(0, "c2:");
    put_ok(t, 21, 0, 64, 0);
    assert_int_equal(got(t, 21, 0, 64, 0), 64);
    int slot = slot_of("c2:", 21, 0), from = CL.owner[slot], to = (from + 1) % 3;
    int moved = rs_cluster_move_slot(&CL, slot, to);
    if (moved < 1) print_error("move: %s\n", rs_error());
    assert_true(moved >= 1);
    uint64_t refreshes = rinfo(t).slot_refreshes;
    assert_int_equal(got(t, 21, 0, 64, 0), 64);
    kvp_redis_tier_info_t in = rinfo(t);
    print_message("moved: %llu, refreshes %llu\n", (unsigned long long)in.moved,
                  (unsigned long long)in.slot_refreshes);
    assert_true(in.moved >= 1);
    assert_int_equal(got(t, 21, 0, 64, 0), 64); /* the map read again */
    assert_true(rinfo(t).slot_refreshes > refreshes);
    /* writes follow too: the moved slot's blob written again, then removed */
    put_ok(t, 21, 0, 1, 0);
    char key[160];
    kvp_hash_t h = hkey(21, 0);
    server_key("c2:", &h, key);
    assert_int_equal(rs_int(&CL.node[to], 0, "EXISTS %s", key), 1);
    remove_range(t, 21, 0, 1);
    assert_int_equal(rs_int(&CL.node[to], 0, "EXISTS %s", key), 0);
    assert_int_equal(got(t, 21, 1, 63, 0), 63);
    in = rinfo(t);
    assert_int_equal(in.failures, 0);
}

static void test_cluster_ask(void **state) {
    (void)state;
    require_cluster();
    /* two blobs in one slot */
    static int first[RS_SLOTS];
    for (int s = 0; s < RS_SLOTS; s++) first[s] = -1;
    int x = -1, y = -1;
    for (int i = 0; i < 20000 && y < 0; i++) {
        int s = slot_of("c3:", 22, i);
        if (first[s] >= 0) {
            x = first[s];
            y = i;
        } else {
            first[s] = i;
        }
    }
    assert_true(y >= 0);
    int slot = slot_of("c3:", 22, x), from = CL.owner[slot], to = (from + 2) % 3;
    kvp_blob_tier_t *t = cluster_tier(0, "c3:");
    put_ok(t, 22, x, 1, 0);
    put_ok(t, 22, y, 1, 0);
    put_ok(t, 23, 0, 32, 0);
    assert_int_equal(rs_int(&CL.node[from], 0, "CLUSTER COUNTKEYSINSLOT %d", slot), 2);

    int moved = rs_cluster_half_move_slot(&CL, slot, to, 1);
    if (moved != 1) print_error("half move: %s\n", rs_error());
    assert_int_equal(moved, 1);
    assert_int_equal(got(t, 22, x, 1, 0), 1);
    assert_int_equal(got(t, 22, y, 1, 0), 1);
    kvp_redis_tier_info_t in = rinfo(t);
    print_message("asked: %llu, moved %llu\n", (unsigned long long)in.asked,
                  (unsigned long long)in.moved);
    assert_true(in.asked >= 1);
    assert_int_equal(present(t, 22, x, 1), 1);
    assert_int_equal(present(t, 22, y, 1), 1);
    assert_int_equal(got(t, 23, 0, 32, 0), 32);
    /* both removed, wherever each is */
    remove_range(t, 22, x, 1);
    remove_range(t, 22, y, 1);
    assert_int_equal(got(t, 22, x, 1, 0), 0);
    assert_int_equal(got(t, 22, y, 1, 0), 0);
    put_ok(t, 22, x, 1, 0);
    put_ok(t, 22, y, 1, 0);
    assert_int_equal(got(t, 22, x, 1, 0), 1);
    assert_int_equal(got(t, 22, y, 1, 0), 1);

    /* the move completes: MOVED from then on */
    assert_true(rs_cluster_finish_move(&CL, slot, to) >= 0);
    assert_int_equal(got(t, 22, x, 1, 0), 1);
    assert_int_equal(got(t, 22, y, 1, 0), 1);
    assert_int_equal(rs_int(&CL.node[to], 0, "CLUSTER COUNTKEYSINSLOT %d", slot), 2);
    in = rinfo(t);
    assert_int_equal(in.failures, 0);
}

static void test_cluster_new_node(void **state) {
    (void)state;
    require_cluster();
    kvp_blob_tier_t *t = cluster_tier(2, "c4:");
    put_ok(t, 24, 0, 64, 0);
    int added = rs_cluster_add_node(&CL);
    if (added < 0) print_error("add node: %s\n", rs_error());
    assert_int_equal(added, 3);
    int slot = slot_of("c4:", 24, 0);
    int moved = rs_cluster_move_slot(&CL, slot, added);
    if (moved < 1) print_error("move: %s\n", rs_error());
    assert_true(moved >= 1);
    int slot2 = slot_of("c4:", 24, 1);
    if (slot2 != slot) assert_true(rs_cluster_move_slot(&CL, slot2, added) >= 1);
    assert_int_equal(got(t, 24, 0, 64, 0), 64);
    assert_true(rinfo(t).moved >= 1);
    assert_int_equal(got(t, 24, 0, 64, 0), 64);
    kvp_redis_tier_info_t in = rinfo(t);
    assert_int_equal(in.nodes, 4);
    assert_int_equal(in.nodes_down, 0);
    /* new blobs in its slots are written there */
    remove_range(t, 24, 0, 2);
    put_ok(t, 24, 0, 2, 0);
    char key[160];
    kvp_hash_t h = hkey(24, 0);
    server_key("c4:", &h, key);
    assert_int_equal(rs_int(&CL.node[added], 0, "EXISTS %s", key), 1);
    assert_int_equal(got(cluster_tier(added, "c4:"), 24, 0, 64, 0), 64);
}

static void test_cluster_cache(void **state) {
    (void)state;
    require_cluster();
    require_blob();
    shared_prefix(cluster_tier(2, "cc:"), cluster_tier(0, "cc:"), cluster_nodes(), CL.n, "cc:");
}

/* A user with exactly the documented permissions, through MOVED and ASK. */
static void test_cluster_acl(void **state) {
    (void)state;
    require_cluster();
    for (int i = 0; i < CL.n; i++)
        assert_true(rs_ok(&CL.node[i], 0,
                          "ACL SETUSER engine on >pw ~kvp:* +get +set +exists +unlink +ping "
                          "+cluster|slots +asking"));
    char uri[96];
    snprintf(uri, sizeof uri, "redis://engine:pw@127.0.0.1:%d", CL.node[1].port);
    kvp_blob_tier_t *t = tier_at(uri);
    put_ok(t, 27, 0, 64, 0);
    int slot = slot_of("kvp:", 27, 0), from = CL.owner[slot], to = (from + 1) % CL.n;
    int moved = rs_cluster_half_move_slot(&CL, slot, to, 1);
    if (moved != 1) print_error("half move: %s\n", rs_error());
    assert_int_equal(moved, 1);
    assert_int_equal(got(t, 27, 0, 64, 0), 64);
    assert_true(rinfo(t).asked >= 1);
    assert_true(rs_cluster_finish_move(&CL, slot, to) >= 0);
    assert_int_equal(got(t, 27, 0, 64, 0), 64);
    kvp_redis_tier_info_t in = rinfo(t);
    assert_true(in.moved >= 1);
    assert_int_equal(in.server_errors, 0);
    remove_range(t, 27, 0, 64);
    assert_int_equal(got(t, 27, 0, 64, 0), 0);
    assert_int_equal(rs_cluster_count(&CL, "kvp:*", NULL), 0);
    /* without +asking or +cluster|slots it is refused at creation */
    for (int i = 0; i < CL.n; i++)
        assert_true(rs_ok(&CL.node[i], 0, "ACL SETUSER engine -cluster|slots"));
    kvp_redis_tier_params_t p = params_for(uri);
    const char *err = tier_refused(&p, KVP_EACCES, "a Cluster user without +cluster|slots");
    if (!contains(err, "cluster")) print_error("the command is not named: %s\n", err);
    assert_true(contains(err, "cluster"));
}

/* A node dies: its keys are misses, the others' are found; it comes back
 * empty (no persistence), the Cluster agrees again, and so does the tier. */
static void test_cluster_node_killed(void **state) {
    (void)state;
    require_cluster();
    kvp_blob_tier_t *t = cluster_tier(0, "c5:");
    put_ok(t, 25, 0, 64, 0);
    int per[RS_MAX_NODES] = {0};
    assert_int_equal(rs_cluster_count(&CL, "c5:*", per), 64);
    assert_true(per[1] > 0);
    assert_int_equal(rs_kill(&CL.node[1]), 0);
    int found = dead_get(t, 25, 0, 64); /* each one found is checked */
    print_message("node 1 dead: %d of 64 found (it held %d)\n", found, per[1]);
    assert_true(found <= 64 - per[1]);
    kvp_redis_tier_info_t in = rinfo(t);
    assert_true(in.failures + in.skipped + in.server_errors >= 1);
    assert_true(in.nodes_down >= 1);
    int rc = put_range(t, 26, 0, 64, 0);
    assert_true(rc == KVP_OK || rc == KVP_EIO);

    assert_int_equal(rs_restart(&CL.node[1]), 0);
    if (rs_cluster_wait(&CL) != 0) print_error("Cluster: %s\n", rs_error());
    int back = 0;
    for (int i = 0; i < 100 && back < 64 - per[1]; i++) { /* at most ~5 s */
        kvp_redis_tier_reconnect(t);
        int r2 = KVP_OK;
        back = get_range(t, 25, 0, 64, 0, 0, &r2);
        if (back < 64 - per[1]) sleep_ms(50);
    }
    assert_int_equal(back, 64 - per[1]); /* what node 1 held went with it */
    put_ok(t, 25, 0, 64, 0);
    assert_int_equal(got(t, 25, 0, 64, 0), 64);
    assert_int_equal(rinfo(t).nodes_down, 0);
}

/* ---- a server that answers what a script says: malformed replies ------------------------ */

/* Accepts one connection and answers each command it receives (one per
 * read: the tier's creation sends its probes one at a time) with the next
 * reply of the script; after the script, closes. Every wait is bounded. */
typedef struct {
    int listener;
    const char *const *replies;
    const size_t *lens;
    int n;
} script_t;

static void *script_server(void *arg) {
    script_t *sc = (script_t *)arg;
    struct pollfd pl = {sc->listener, POLLIN, 0};
    if (poll(&pl, 1, 5000) != 1) return NULL;
    int fd = accept(sc->listener, NULL, NULL);
    if (fd < 0) return NULL;
    char buf[4096];
    for (int i = 0; i < sc->n; i++) {
        struct pollfd pf = {fd, POLLIN, 0};
        if (poll(&pf, 1, 5000) != 1 || recv(fd, buf, sizeof buf, 0) <= 0) break;
        size_t off = 0;
        while (off < sc->lens[i]) {
            ssize_t w = send(fd, sc->replies[i] + off, sc->lens[i] - off, MSG_NOSIGNAL);
            if (w <= 0) break;
            off += (size_t)w;
        }
    }
    struct pollfd pf = {fd, POLLIN, 0};
    (void)poll(&pf, 1, 200); /* let the last reply be read before the close */
    close(fd);
    return NULL;
}

/* Create a tier on a scripted server whose creation replies come first,
 * then `data` answers one get of key 0 into a 64-byte buffer; returns the
 * get's status and the size it found. */
static int scripted_get(const char *data, size_t data_len, uint64_t *size, char *out) {
    int lf = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(lf >= 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(lf, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(lf, 1), 0);
    socklen_t al = sizeof a;
    assert_int_equal(getsockname(lf, (struct sockaddr *)&a, &al), 0);
    /* creation with cluster = 0: the probe's SET, GET, EXISTS, UNLINK */
    const char *replies[5] = {"+OK\r\n", "$0\r\n\r\n", ":1\r\n", ":1\r\n", data};
    size_t lens[5] = {5, 6, 4, 4, data_len};
    script_t sc = {lf, replies, lens, 5};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, script_server, &sc), 0);
    char uri[64];
    snprintf(uri, sizeof uri, "redis://127.0.0.1:%d", (int)ntohs(a.sin_port));
    kvp_redis_tier_params_t p = params_for(uri);
    p.cluster = 0;
    kvp_blob_tier_t *t = NULL;
    char err[KVP_ERR_SIZE] = "";
    int rc = kvp_redis_tier_create(&p, &t, err, sizeof err);
    if (rc != KVP_OK) print_error("scripted server: %s\n", err);
    assert_int_equal(rc, KVP_OK);
    kvp_hash_t k = hkey(99, 0);
    void *bufs[1] = {out};
    uint64_t caps[1] = {64};
    rc = kvp_blob_tier_get(t, 1, &k, bufs, caps, size);
    size_t shown = strcspn(data, "\r\n");
    print_message("reply '%.*s': %s, %llu bytes (%.120s)\n", (int)(shown < 40 ? shown : 40), data,
                  kvp_status_name(rc),
                  (unsigned long long)*size, rc == KVP_OK ? "" : kvp_blob_tier_last_error(t));
    kvp_redis_tier_info_t in = rinfo(t);
    if (rc != KVP_OK) assert_true(in.failures + in.server_errors >= 1);
    kvp_blob_tier_destroy(t);
    pthread_join(th, NULL);
    close(lf);
    return rc;
}

/* Whatever a server sends, a get is a hit with the right bytes, or a miss
 * and a counted failure: never a crash, a write past the buffer, or bytes
 * from another reply. */
static void test_malformed_replies(void **state) {
    (void)state;
    require_tier();
    char out[64 + 16];
    uint64_t size = 1;
    memset(out, 0x5a, sizeof out);
    assert_int_equal(scripted_get("$5\r\nhello\r\n", 11, &size, out), KVP_OK);
    assert_int_equal(size, 5);
    assert_memory_equal(out, "hello", 5);
    /* larger than the buffer: a miss, nothing written past it */
    static char big[100 + 16];
    memcpy(big, "$100\r\n", 6);
    memset(big + 6, 'b', 100);
    memcpy(big + 106, "\r\n", 2);
    memset(out, 0x5a, sizeof out);
    assert_int_equal(scripted_get(big, 108, &size, out), KVP_OK);
    assert_int_equal(size, 0);
    for (size_t i = 64; i < sizeof out; i++) assert_int_equal((unsigned char)out[i], 0x5a);
    assert_int_equal(scripted_get("$-1\r\n", 5, &size, out), KVP_OK); /* absent */
    assert_int_equal(size, 0);
    static const struct {
        const char *bytes;
        size_t len;
    } bad[] = {
        {"$5\r\nhel", 8},                      /* cut off, then closed */
        {"$5\r\nhelloXY", 11},                 /* no CRLF after the payload */
        {"*1\r\n$1\r\na\r\n", 11},              /* an array */
        {"$-7\r\n", 5},                        /* a negative length */
        {"$abc\r\n", 6},                       /* not a number */
        {"$99999999999999999999\r\n", 24},     /* beyond any buffer, never sent */
        {"!x\r\n", 4},                         /* an unknown type */
        {"hello\n", 6},                        /* a line without CR */
        {"-ERR out of luck\r\n", 18},          /* an error reply */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        size = 1;
        int rc = scripted_get(bad[i].bytes, bad[i].len, &size, out);
        assert_int_equal(rc, KVP_EIO);
        assert_int_equal(size, 0);
    }
    /* a long error line: cut, counted */
    static char longerr[2000];
    longerr[0] = '-';
    memset(longerr + 1, 'E', sizeof longerr - 3);
    memcpy(longerr + sizeof longerr - 2, "\r\n", 2);
    assert_int_equal(scripted_get(longerr, sizeof longerr, &size, out), KVP_EIO);
    /* two replies to one command: the first counts, the connection is not trusted after */
    int rc = scripted_get("$1\r\na\r\n$1\r\nb\r\n", 14, &size, out);
    assert_true(rc == KVP_OK || rc == KVP_EIO);
    if (rc == KVP_OK) assert_int_equal(out[0], 'a');
}

int main(void) {
    const struct CMUnitTest standalone[] = {
        cmocka_unit_test_setup_teardown(test_feature_switch, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_malformed_replies, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_arguments, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_no_password_in_errors, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_roundtrip, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_prefixes_and_databases, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_ttl, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_passwords, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_acl_users, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_sharded_set, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_server_killed, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_server_stalls, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_server_full, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_allocation_failures, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_threads, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_cache_shared_prefix, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_cache_missing_and_corrupt, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_cache_foreign_identities, fx_setup, fx_teardown),
    };
    const struct CMUnitTest cluster[] = {
        cmocka_unit_test_setup_teardown(test_cluster_spread, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_cluster_slot_moves, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_cluster_ask, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_cluster_new_node, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_cluster_cache, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_cluster_acl, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_cluster_node_killed, fx_setup, fx_teardown),
    };
    int failed = cmocka_run_group_tests_name("redistier", standalone, NULL, NULL);
    failed += cmocka_run_group_tests_name("redistier_cluster", cluster, cluster_setup,
                                          cluster_teardown);
    return failed;
}
