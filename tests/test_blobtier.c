/*
 * Blob tiers: the checked, counted wrapper in front of any implementation,
 * and the file tier behind it.
 *
 *   - the wrapper refuses bad arguments (NULL handle, counts, arrays, empty
 *     buffers and blobs, the ops' struct_size and reserved_, missing
 *     functions) with a detail text and without calling the tier, and
 *     counts keys, hits, bytes and failures;
 *   - an implementation that fails has every output of its batch cleared,
 *     the failure counted and its own words kept (on one line); one that
 *     reports more bytes than the buffer holds has a miss;
 *   - the file tier round-trips blobs, rebuilds its index when a directory
 *     is opened again (removing dead writers' temporaries, keeping live
 *     ones), evicts least recently used blobs under its byte cap (a get in
 *     another tier on the same directory counts), refuses a blob larger
 *     than the cap, and leaves no temporary behind when a write fails;
 *   - several processes: a writer killed mid-write leaves no partial blob
 *     visible; two writers of one key leave one whole version, and a reader
 *     meanwhile sees only whole versions; writers sharing a cap stay within
 *     the bound the design gives and leave whole files;
 *   - allocation failures at creation and in a put: KVP_ENOMEM, nothing
 *     leaked, nothing left on disk.
 *
 * Child processes report through their exit status only (no cmocka in a
 * child); every loop is bounded in count, every wait in time.
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "blobtier.h"
#include "testutil.h"

/* ---- an implementation to wrap ---------------------------------------------- */

/* Holds nothing: byte 0 of a key is the length of its blob (0: absent), and
 * the blob's bytes are all byte 1 of the key. */
typedef struct {
    int status;        /* what every call returns; KVP_OK: work */
    int oversize;      /* get reports caps[i] + 1 bytes */
    uint8_t present;   /* what exists writes for a held key (any non-zero) */
    const char *why;   /* last_error's text */
    long calls;
    long destroyed;
    uint64_t put_bytes;
} mock_t;

static int mock_get(void *self, int32_t n, const kvp_hash_t *keys, void *const *bufs,
                    const uint64_t *caps, uint64_t *sizes) {
    mock_t *m = self;
    m->calls++;
    for (int32_t i = 0; i < n; i++) {
        uint64_t len = keys[i].bytes[0];
        if (len > caps[i]) len = 0;
        memset(bufs[i], keys[i].bytes[1], (size_t)len);
        sizes[i] = m->oversize ? caps[i] + 1 : len;
        if (m->status != KVP_OK) sizes[i] = 99; /* what a failing tier may leave */
    }
    return m->status;
}

static int mock_put(void *self, int32_t n, const kvp_hash_t *keys, const void *const *blobs,
                    const uint64_t *sizes) {
    mock_t *m = self;
    (void)keys;
    (void)blobs;
    m->calls++;
    if (m->status == KVP_OK)
        for (int32_t i = 0; i < n; i++) m->put_bytes += sizes[i];
    return m->status;
}

static int mock_exists(void *self, int32_t n, const kvp_hash_t *keys, uint8_t *present) {
    mock_t *m = self;
    m->calls++;
    for (int32_t i = 0; i < n; i++)
        present[i] = m->status != KVP_OK ? 1 : keys[i].bytes[0] ? m->present : 0;
    return m->status;
}

static int mock_remove(void *self, int32_t n, const kvp_hash_t *keys) {
    mock_t *m = self;
    (void)n;
    (void)keys;
    m->calls++;
    return m->status;
}

static int mock_usage(void *self, uint64_t *entries, uint64_t *bytes) {
    (void)self;
    *entries = 3;
    *bytes = 300;
    return KVP_OK;
}

static const char *mock_last_error(void *self) {
    const mock_t *m = self;
    return m->why;
}

static void mock_destroy(void *self) {
    mock_t *m = self;
    m->destroyed++;
}

static kvp_blob_tier_ops_t mock_ops(void) {
    kvp_blob_tier_ops_t ops;
    memset(&ops, 0, sizeof ops);
    ops.struct_size = sizeof ops;
    ops.get = mock_get;
    ops.put = mock_put;
    ops.exists = mock_exists;
    ops.remove = mock_remove;
    ops.usage = mock_usage;
    ops.last_error = mock_last_error;
    ops.destroy = mock_destroy;
    return ops;
}

static kvp_hash_t mock_key(uint8_t len, uint8_t fill) {
    kvp_hash_t k;
    memset(&k, 0, sizeof k);
    k.bytes[0] = len;
    k.bytes[1] = fill;
    return k;
}

static kvp_blob_tier_t *mock_tier(mock_t *m) {
    kvp_blob_tier_ops_t ops = mock_ops();
    kvp_blob_tier_t *t = NULL;
    char err[KVP_ERR_SIZE];
    assert_int_equal(kvp_blob_tier_create(&ops, m, "mock", &t, err, sizeof err), KVP_OK);
    assert_non_null(t);
    return t;
}

static kvp_blob_tier_stats_t stats_of(kvp_blob_tier_t *t) {
    kvp_blob_tier_stats_t s;
    memset(&s, 0, sizeof s);
    s.struct_size = sizeof s;
    assert_int_equal(kvp_blob_tier_stats(t, &s), KVP_OK);
    return s;
}

static void assert_contains(const char *text, const char *part) {
    if (strstr(text, part) == NULL) fail_msg("\"%s\" does not contain \"%s\"", text, part);
}

/* ---- the wrapper ---------------------------------------------------------------- */

static void test_create_checks(void **state) {
    (void)state;
    mock_t m;
    memset(&m, 0, sizeof m);
    kvp_blob_tier_ops_t ops = mock_ops(), bad;
    kvp_blob_tier_t *t = NULL;
    char err[KVP_ERR_SIZE];

    assert_int_equal(kvp_blob_tier_create(NULL, &m, "mock", &t, err, sizeof err), KVP_EINVAL);
    assert_contains(err, "ops");
    assert_int_equal(kvp_blob_tier_create(&ops, &m, "mock", NULL, err, sizeof err), KVP_EINVAL);
    assert_contains(err, "out");
    bad = ops;
    bad.struct_size = sizeof bad - 1;
    assert_int_equal(kvp_blob_tier_create(&bad, &m, "mock", &t, err, sizeof err), KVP_EINVAL);
    assert_contains(err, "struct_size");
    bad = ops;
    bad.reserved_ = 1;
    assert_int_equal(kvp_blob_tier_create(&bad, &m, "mock", &t, err, sizeof err), KVP_EINVAL);
    assert_contains(err, "reserved_");
    const char *required[] = {"ops->get", "ops->put", "ops->exists", "ops->remove"};
    for (int i = 0; i < 4; i++) {
        bad = ops;
        if (i == 0) bad.get = NULL;
        if (i == 1) bad.put = NULL;
        if (i == 2) bad.exists = NULL;
        if (i == 3) bad.remove = NULL;
        assert_int_equal(kvp_blob_tier_create(&bad, &m, "mock", &t, err, sizeof err), KVP_EINVAL);
        assert_contains(err, required[i]);
    }
    assert_int_equal(kvp_blob_tier_create(&ops, &m, NULL, &t, err, sizeof err), KVP_EINVAL);
    assert_contains(err, "name");
    assert_int_equal(kvp_blob_tier_create(&ops, &m, NULL, &t, NULL, 0), KVP_EINVAL);
    kvp_allocator_t half;
    memset(&half, 0, sizeof half);
    test_alloc_state st = {0, -1, 0, 0};
    half.alloc = kvt_alloc;
    half.opaque = &st;
    assert_int_equal(kvp__blob_tier_create(&ops, &m, "mock", &half, &t, err, sizeof err),
                     KVP_EINVAL);
    assert_contains(err, "allocator");
    assert_null(t);
    assert_int_equal(m.calls + m.destroyed, 0);

    /* the optional functions may be missing; a long name is cut to 31 bytes */
    bad = ops;
    bad.usage = NULL;
    bad.last_error = NULL;
    bad.destroy = NULL;
    const char *long_name = "a-name-far-longer-than-thirty-one-bytes";
    assert_int_equal(kvp_blob_tier_create(&bad, &m, long_name, &t, err, sizeof err), KVP_OK);
    assert_int_equal(strlen(kvp_blob_tier_name(t)), 31);
    assert_memory_equal(kvp_blob_tier_name(t), long_name, 31);
    assert_string_equal(kvp_blob_tier_last_error(t), "");
    kvp_blob_tier_stats_t s = stats_of(t);
    assert_int_equal(s.entries, 0);
    assert_int_equal(s.bytes, 0);
    kvp_blob_tier_destroy(t);
    assert_int_equal(m.destroyed, 0);

    /* a newer implementation's larger struct is accepted */
    struct {
        kvp_blob_tier_ops_t ops;
        void *later;
    } newer;
    memset(&newer, 0, sizeof newer);
    newer.ops = ops;
    newer.ops.struct_size = sizeof newer;
    t = NULL;
    assert_int_equal(kvp_blob_tier_create(&newer.ops, &m, "newer", &t, err, sizeof err), KVP_OK);
    kvp_blob_tier_destroy(t);
    assert_int_equal(m.destroyed, 1);
}

static void test_null_handle(void **state) {
    (void)state;
    kvp_hash_t k = mock_key(1, 1);
    uint8_t buf[4], present = 7;
    void *bufs[1] = {buf};
    const void *blobs[1] = {buf};
    uint64_t cap = 4, size = 9;
    kvp_blob_tier_stats_t s;
    memset(&s, 0, sizeof s);
    s.struct_size = sizeof s;
    assert_int_equal(kvp_blob_tier_get(NULL, 1, &k, bufs, &cap, &size), KVP_EINVAL);
    assert_int_equal(kvp_blob_tier_put(NULL, 1, &k, blobs, &cap), KVP_EINVAL);
    assert_int_equal(kvp_blob_tier_exists(NULL, 1, &k, &present), KVP_EINVAL);
    assert_int_equal(kvp_blob_tier_remove(NULL, 1, &k), KVP_EINVAL);
    assert_int_equal(kvp_blob_tier_stats(NULL, &s), KVP_EINVAL);
    assert_string_equal(kvp_blob_tier_last_error(NULL), "NULL handle");
    assert_string_equal(kvp_blob_tier_name(NULL), "");
    kvp_blob_tier_destroy(NULL);
}

/* A refused call: KVP_EINVAL, and the detail says why. */
#define assert_refused(t, call, words)                                    \
    do {                                                                  \
        assert_int_equal((call), KVP_EINVAL);                             \
        assert_contains(kvp_blob_tier_last_error(t), (words));            \
    } while (0)

static void test_call_checks(void **state) {
    (void)state;
    mock_t m;
    memset(&m, 0, sizeof m);
    kvp_blob_tier_t *t = mock_tier(&m);
    kvp_hash_t keys[2] = {mock_key(4, 1), mock_key(4, 2)};
    uint8_t b0[8], b1[8], present[2];
    void *bufs[2] = {b0, b1}, *bufs_hole[2] = {b0, NULL};
    const void *blobs[2] = {b0, b1}, *blobs_hole[2] = {b0, NULL};
    uint64_t caps[2] = {8, 8}, caps_zero[2] = {8, 0}, sizes[2];
    uint64_t lens[2] = {4, 4}, lens_zero[2] = {4, 0};

    assert_refused(t, kvp_blob_tier_get(t, 0, keys, bufs, caps, sizes), "get: n is 0");
    assert_refused(t, kvp_blob_tier_get(t, -3, keys, bufs, caps, sizes), "get: n is -3");
    assert_refused(t, kvp_blob_tier_get(t, 2, NULL, bufs, caps, sizes), "get: keys");
    assert_refused(t, kvp_blob_tier_get(t, 2, keys, NULL, caps, sizes), "get: bufs is NULL");
    assert_refused(t, kvp_blob_tier_get(t, 2, keys, bufs, NULL, sizes), "get: caps is NULL");
    assert_refused(t, kvp_blob_tier_get(t, 2, keys, bufs, caps, NULL), "get: sizes");
    assert_refused(t, kvp_blob_tier_get(t, 2, keys, bufs, caps_zero, sizes), "get: caps[1]");
    /* a refused get still reports misses */
    sizes[0] = sizes[1] = 77;
    assert_refused(t, kvp_blob_tier_get(t, 2, keys, bufs_hole, caps, sizes), "get: bufs[1]");
    assert_int_equal(sizes[0] + sizes[1], 0);

    assert_refused(t, kvp_blob_tier_put(t, 0, keys, blobs, lens), "put: n is 0");
    assert_refused(t, kvp_blob_tier_put(t, 2, NULL, blobs, lens), "put: keys");
    assert_refused(t, kvp_blob_tier_put(t, 2, keys, NULL, lens), "put: blobs is NULL");
    assert_refused(t, kvp_blob_tier_put(t, 2, keys, blobs, NULL), "put: sizes is NULL");
    assert_refused(t, kvp_blob_tier_put(t, 2, keys, blobs_hole, lens), "put: blobs[1]");
    assert_refused(t, kvp_blob_tier_put(t, 2, keys, blobs, lens_zero), "put: sizes[1]");

    assert_refused(t, kvp_blob_tier_exists(t, -1, keys, present), "exists: n is -1");
    assert_refused(t, kvp_blob_tier_exists(t, 2, NULL, present), "exists: keys");
    assert_refused(t, kvp_blob_tier_exists(t, 2, keys, NULL), "exists: present");
    assert_refused(t, kvp_blob_tier_remove(t, 0, keys), "remove: n is 0");
    assert_refused(t, kvp_blob_tier_remove(t, 2, NULL), "remove: keys");

    kvp_blob_tier_stats_t s;
    assert_int_equal(kvp_blob_tier_stats(t, NULL), KVP_EINVAL);
    memset(&s, 0, sizeof s);
    s.struct_size = 8;
    assert_refused(t, kvp_blob_tier_stats(t, &s), "struct_size");

    /* nothing reached the implementation, nothing was counted */
    assert_int_equal(m.calls, 0);
    s = stats_of(t);
    assert_int_equal(s.gets + s.hits + s.puts + s.errors + s.bytes_in + s.bytes_out, 0);
    kvp_blob_tier_destroy(t);
    assert_int_equal(m.destroyed, 1);
}

static void test_counters(void **state) {
    (void)state;
    mock_t m;
    memset(&m, 0, sizeof m);
    m.present = 5;
    kvp_blob_tier_t *t = mock_tier(&m);
    assert_string_equal(kvp_blob_tier_name(t), "mock");
    /* a hit, an absent key, a blob larger than its buffer */
    kvp_hash_t keys[3] = {mock_key(10, 0xab), mock_key(0, 0), mock_key(200, 1)};
    uint8_t b0[16], b1[16], b2[100];
    void *bufs[3] = {b0, b1, b2};
    uint64_t caps[3] = {16, 16, 100}, sizes[3] = {5, 5, 5};
    assert_int_equal(kvp_blob_tier_get(t, 3, keys, bufs, caps, sizes), KVP_OK);
    assert_int_equal(sizes[0], 10);
    assert_int_equal(sizes[1], 0);
    assert_int_equal(sizes[2], 0);
    for (int i = 0; i < 10; i++) assert_int_equal(b0[i], 0xab);

    const void *blobs[2] = {b0, b1};
    uint64_t lens[2] = {5, 7};
    assert_int_equal(kvp_blob_tier_put(t, 2, keys, blobs, lens), KVP_OK);
    uint8_t present[3] = {9, 9, 9};
    assert_int_equal(kvp_blob_tier_exists(t, 3, keys, present), KVP_OK);
    assert_int_equal(present[0], 1); /* any non-zero answer is "held" */
    assert_int_equal(present[1], 0);
    assert_int_equal(present[2], 1);
    assert_int_equal(kvp_blob_tier_remove(t, 3, keys), KVP_OK);

    kvp_blob_tier_stats_t s = stats_of(t);
    assert_int_equal(s.gets, 3);
    assert_int_equal(s.hits, 1);
    assert_int_equal(s.bytes_in, 10);
    assert_int_equal(s.puts, 2);
    assert_int_equal(s.bytes_out, 12);
    assert_int_equal(m.put_bytes, 12);
    assert_int_equal(s.errors, 0);
    assert_int_equal(s.entries, 3);
    assert_int_equal(s.bytes, 300);
    assert_int_equal(m.calls, 4);
    assert_string_equal(kvp_blob_tier_last_error(t), "");

    /* an older caller's smaller struct gets its fields only */
    struct {
        kvp_blob_tier_stats_t s;
        uint64_t canary;
    } big;
    memset(&big, 0, sizeof big);
    big.s.struct_size = sizeof big.s;
    big.canary = 0x5a5a;
    assert_int_equal(kvp_blob_tier_stats(t, &big.s), KVP_OK);
    assert_int_equal(big.canary, 0x5a5a);
    assert_int_equal(big.s.struct_size, sizeof big.s);
    kvp_blob_tier_destroy(t);
}

static void test_failing_implementation(void **state) {
    (void)state;
    mock_t m;
    memset(&m, 0, sizeof m);
    m.status = KVP_EIO;
    m.why = "disk on fire\nand a second line";
    kvp_blob_tier_t *t = mock_tier(&m);
    kvp_hash_t keys[3] = {mock_key(4, 1), mock_key(4, 2), mock_key(0, 0)};
    uint8_t b[3][8];
    void *bufs[3] = {b[0], b[1], b[2]};
    const void *blobs[3] = {b[0], b[1], b[2]};
    uint64_t caps[3] = {8, 8, 8}, sizes[3];

    assert_int_equal(kvp_blob_tier_get(t, 3, keys, bufs, caps, sizes), KVP_EIO);
    for (int i = 0; i < 3; i++) assert_int_equal(sizes[i], 0);
    const char *e = kvp_blob_tier_last_error(t);
    assert_contains(e, "mock tier: get");
    assert_contains(e, "disk on fire");
    assert_null(strchr(e, '\n'));
    uint8_t present[3];
    assert_int_equal(kvp_blob_tier_exists(t, 3, keys, present), KVP_EIO);
    for (int i = 0; i < 3; i++) assert_int_equal(present[i], 0);
    assert_contains(kvp_blob_tier_last_error(t), "exists");
    assert_int_equal(kvp_blob_tier_put(t, 3, keys, blobs, caps), KVP_EIO);
    assert_contains(kvp_blob_tier_last_error(t), "put");
    assert_int_equal(kvp_blob_tier_remove(t, 3, keys), KVP_EIO);
    assert_contains(kvp_blob_tier_last_error(t), "remove");

    kvp_blob_tier_stats_t s = stats_of(t);
    assert_int_equal(s.errors, 4);
    assert_int_equal(s.gets, 3); /* asked for, all missed */
    assert_int_equal(s.hits, 0);
    assert_int_equal(s.puts, 0);
    assert_int_equal(s.bytes_in + s.bytes_out, 0);

    /* without words of its own, the status names the failure */
    m.why = NULL;
    m.status = KVP_ENOMEM;
    assert_int_equal(kvp_blob_tier_get(t, 1, keys, bufs, caps, sizes), KVP_ENOMEM);
    assert_contains(kvp_blob_tier_last_error(t), "KVP_ENOMEM");
    m.why = "";
    assert_int_equal(kvp_blob_tier_put(t, 1, keys, blobs, caps), KVP_ENOMEM);
    assert_contains(kvp_blob_tier_last_error(t), "KVP_ENOMEM");
    /* a positive value is no status: the tier failed */
    m.status = 5;
    assert_int_equal(kvp_blob_tier_remove(t, 1, keys), KVP_EIO);
    assert_contains(kvp_blob_tier_last_error(t), "returned 5");

    /* the detail is sticky: a call that works leaves it */
    m.status = KVP_OK;
    assert_int_equal(kvp_blob_tier_get(t, 1, keys, bufs, caps, sizes), KVP_OK);
    assert_int_equal(sizes[0], 4);
    assert_contains(kvp_blob_tier_last_error(t), "returned 5");
    assert_int_equal(stats_of(t).errors, 7);
    kvp_blob_tier_destroy(t);

    /* an implementation without last_error */
    kvp_blob_tier_ops_t ops = mock_ops();
    ops.last_error = NULL;
    m.status = KVP_EIO;
    assert_int_equal(kvp_blob_tier_create(&ops, &m, "quiet", &t, NULL, 0), KVP_OK);
    assert_int_equal(kvp_blob_tier_exists(t, 1, keys, present), KVP_EIO);
    assert_contains(kvp_blob_tier_last_error(t), "quiet tier: exists failed (KVP_EIO)");
    kvp_blob_tier_destroy(t);
}

static void test_oversize_implementation(void **state) {
    (void)state;
    mock_t m;
    memset(&m, 0, sizeof m);
    m.oversize = 1;
    kvp_blob_tier_t *t = mock_tier(&m);
    kvp_hash_t keys[2] = {mock_key(4, 1), mock_key(0, 0)};
    uint8_t b[2][8];
    void *bufs[2] = {b[0], b[1]};
    uint64_t caps[2] = {8, 8}, sizes[2];
    assert_int_equal(kvp_blob_tier_get(t, 2, keys, bufs, caps, sizes), KVP_OK);
    assert_int_equal(sizes[0], 0);
    assert_int_equal(sizes[1], 0);
    kvp_blob_tier_stats_t s = stats_of(t);
    assert_int_equal(s.gets, 2);
    assert_int_equal(s.hits, 0);
    assert_int_equal(s.bytes_in, 0);
    kvp_blob_tier_destroy(t);
}

/* The functions are copied: the caller's struct may go away. */
static void test_ops_copied(void **state) {
    (void)state;
    mock_t m;
    memset(&m, 0, sizeof m);
    kvp_blob_tier_ops_t ops = mock_ops();
    kvp_blob_tier_t *t = NULL;
    assert_int_equal(kvp_blob_tier_create(&ops, &m, "mock", &t, NULL, 0), KVP_OK);
    memset(&ops, 0, sizeof ops);
    kvp_hash_t k = mock_key(3, 9);
    uint8_t b[4];
    void *bufs[1] = {b};
    uint64_t cap = 4, size = 0;
    assert_int_equal(kvp_blob_tier_get(t, 1, &k, bufs, &cap, &size), KVP_OK);
    assert_int_equal(size, 3);
    kvp_blob_tier_destroy(t);
    assert_int_equal(m.destroyed, 1);
}

static void test_wrapper_allocation_failure(void **state) {
    (void)state;
    mock_t m;
    memset(&m, 0, sizeof m);
    kvp_blob_tier_ops_t ops = mock_ops();
    test_alloc_state st = {0, 0, 0, 0};
    kvp_allocator_t a = test_allocator(&st);
    kvp_blob_tier_t *t = NULL;
    char err[KVP_ERR_SIZE];
    assert_int_equal(kvp__blob_tier_create(&ops, &m, "mock", &a, &t, err, sizeof err),
                     KVP_ENOMEM);
    assert_null(t);
    assert_int_equal(st.live, 0);
    assert_int_equal(m.destroyed, 0); /* the caller still owns its implementation */
    st.fail_at = -1;
    assert_int_equal(kvp__blob_tier_create(&ops, &m, "mock", &a, &t, err, sizeof err), KVP_OK);
    assert_int_equal(st.live, 1);
    kvp_blob_tier_destroy(t);
    assert_int_equal(st.live, 0);
    assert_int_equal(m.destroyed, 1);
}

/* ---- the file tier: helpers ------------------------------------------------------- */

#define PATH_BYTES 512

static void make_dir(char out[PATH_BYTES]) {
    snprintf(out, PATH_BYTES, "/tmp/kvp_blobtier_XXXXXX");
    assert_non_null(mkdtemp(out));
}

/* Remove a test directory and what it holds (one level of subdirectories:
 * the tests plant no deeper ones). */
static void remove_tree(const char *path) {
    DIR *d = opendir(path);
    if (d == NULL) return;
    const struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0) continue;
        char p[PATH_BYTES];
        snprintf(p, sizeof p, "%s/%s", path, de->d_name);
        if (unlink(p) != 0 && (errno == EISDIR || errno == EPERM)) remove_tree(p);
    }
    closedir(d);
    rmdir(path);
}

/* A key that says what its blob is: id, length, and which content. */
static kvp_hash_t blob_key(uint32_t id, uint32_t bytes) {
    kvp_hash_t k;
    for (int i = 0; i < 32; i++) k.bytes[i] = (uint8_t)(0x5a ^ (i * 37));
    memcpy(k.bytes, &id, sizeof id);
    memcpy(k.bytes + 8, &bytes, sizeof bytes);
    return k;
}

static uint32_t key_bytes(const kvp_hash_t *k) {
    uint32_t b;
    memcpy(&b, k->bytes + 8, sizeof b);
    return b;
}

/* Content derived from the key (and a variant, for two versions of one key). */
static void fill(uint8_t *p, uint64_t n, const kvp_hash_t *key, uint32_t variant) {
    uint64_t s = 0x9e3779b97f4a7c15ull * (variant + 1);
    for (int i = 0; i < 4; i++) {
        uint64_t w;
        memcpy(&w, key->bytes + 8 * i, sizeof w);
        s = (s ^ w) * 0xbf58476d1ce4e5b9ull + 1;
    }
    for (uint64_t i = 0; i < n; i++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        p[i] = (uint8_t)(s >> 24);
    }
}

static bool content_is(const uint8_t *p, uint64_t n, const kvp_hash_t *key, uint32_t variant) {
    uint8_t *want = malloc(n ? n : 1);
    if (want == NULL) return false;
    fill(want, n, key, variant);
    bool same = memcmp(p, want, n) == 0;
    free(want);
    return same;
}

static void hex_of(const kvp_hash_t *k, char out[65]) {
    for (int i = 0; i < 32; i++) snprintf(out + 2 * i, 3, "%02x", k->bytes[i]);
}

static bool key_of_name(const char *name, kvp_hash_t *k) {
    if (strlen(name) != 69 || strcmp(name + 64, ".kvpb") != 0) return false;
    for (int i = 0; i < 32; i++) {
        unsigned v;
        char two[3] = {name[2 * i], name[2 * i + 1], 0};
        if (sscanf(two, "%2x", &v) != 1) return false;
        k->bytes[i] = (uint8_t)v;
    }
    return true;
}

/* Read a whole file; NULL if it cannot be read. */
static uint8_t *slurp(const char *path, uint64_t *bytes) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return NULL;
    struct stat st;
    uint8_t *p = NULL;
    if (fstat(fd, &st) == 0 && (p = malloc((size_t)st.st_size + 1)) != NULL) {
        ssize_t got = 0;
        while (got < st.st_size) {
            ssize_t r = read(fd, p + got, (size_t)(st.st_size - got));
            if (r <= 0) break;
            got += r;
        }
        *bytes = (uint64_t)got;
    }
    close(fd);
    return p;
}

typedef struct {
    int blobs;       /* visible .kvpb files */
    int whole;       /* of which exactly the size and content of their key */
    int temporaries; /* .tmp.* files */
    int of_pid;      /* of which named for `pid` */
    uint64_t bytes;  /* of the blobs */
} survey_t;

/* What a directory holds, checking every blob against its key. */
static survey_t survey(const char *dir, pid_t pid) {
    survey_t s;
    memset(&s, 0, sizeof s);
    char pid_prefix[64];
    snprintf(pid_prefix, sizeof pid_prefix, ".tmp.%ld.", (long)pid);
    DIR *d = opendir(dir);
    assert_non_null(d);
    const struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        kvp_hash_t k;
        if (strncmp(de->d_name, ".tmp.", 5) == 0) {
            s.temporaries++;
            if (strncmp(de->d_name, pid_prefix, strlen(pid_prefix)) == 0) s.of_pid++;
            continue;
        }
        if (!key_of_name(de->d_name, &k)) continue;
        char p[PATH_BYTES];
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        uint64_t n = 0;
        uint8_t *data = slurp(p, &n);
        if (data == NULL) continue; /* evicted while we looked */
        s.blobs++;
        s.bytes += n;
        if (n == key_bytes(&k) && content_is(data, n, &k, 0)) s.whole++;
        free(data);
    }
    closedir(d);
    return s;
}

static kvp_blob_tier_t *open_file_tier(const char *dir, uint64_t max_bytes, int fsync_each) {
    kvp_file_tier_params_t p;
    kvp_file_tier_params_init(&p);
    p.path = dir;
    p.max_bytes = max_bytes;
    p.fsync = fsync_each;
    kvp_blob_tier_t *t = NULL;
    char err[KVP_ERR_SIZE];
    int rc = kvp_file_tier_create(&p, &t, err, sizeof err);
    if (rc != KVP_OK) fail_msg("kvp_file_tier_create: %s", err);
    return t;
}

/* Store the blob of `key` (its length and content come from the key). */
static int put_key(kvp_blob_tier_t *t, const kvp_hash_t *key) {
    uint64_t n = key_bytes(key);
    uint8_t *buf = malloc((size_t)n);
    if (buf == NULL) return KVP_ENOMEM;
    fill(buf, n, key, 0);
    const void *blobs[1] = {buf};
    int rc = kvp_blob_tier_put(t, 1, key, blobs, &n);
    free(buf);
    return rc;
}

static bool held(kvp_blob_tier_t *t, const kvp_hash_t *key) {
    uint8_t present = 0;
    assert_int_equal(kvp_blob_tier_exists(t, 1, key, &present), KVP_OK);
    return present != 0;
}

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* Wait for a child (its work is bounded); its exit status, or -1. */
static int child_status(pid_t pid) {
    int status = 0;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* ---- the file tier ------------------------------------------------------------------ */

static void test_file_params(void **state) {
    (void)state;
    kvp_file_tier_params_t p;
    memset(&p, 0xff, sizeof p);
    kvp_file_tier_params_init(&p);
    assert_int_equal(p.struct_size, sizeof p);
    assert_int_equal(p.fsync, 1);
    assert_null(p.path);
    assert_int_equal(p.max_bytes, 0);
    assert_null(p.allocator.alloc);
    assert_null(p.allocator.free);
    kvp_file_tier_params_init(NULL);

    char dir[PATH_BYTES], sub[PATH_BYTES + 32], err[KVP_ERR_SIZE];
    make_dir(dir);
    kvp_blob_tier_t *t = NULL;
    assert_int_equal(kvp_file_tier_create(NULL, &t, err, sizeof err), KVP_EINVAL);
    p.path = dir;
    assert_int_equal(kvp_file_tier_create(&p, NULL, err, sizeof err), KVP_EINVAL);
    p.struct_size = 4;
    assert_int_equal(kvp_file_tier_create(&p, &t, err, sizeof err), KVP_EINVAL);
    assert_contains(err, "struct_size");
    kvp_file_tier_params_init(&p);
    assert_int_equal(kvp_file_tier_create(&p, &t, err, sizeof err), KVP_EINVAL);
    assert_contains(err, "path is NULL");
    p.path = "";
    assert_int_equal(kvp_file_tier_create(&p, &t, err, sizeof err), KVP_EINVAL);
    assert_contains(err, "path is empty");
    p.path = dir;
    p.fsync = 2;
    assert_int_equal(kvp_file_tier_create(&p, &t, err, sizeof err), KVP_EINVAL);
    assert_contains(err, "fsync");
    p.fsync = 1;
    test_alloc_state st = {0, -1, 0, 0};
    p.allocator.free = kvt_free;
    p.allocator.opaque = &st;
    assert_int_equal(kvp_file_tier_create(&p, &t, err, sizeof err), KVP_EINVAL);
    assert_contains(err, "allocator");
    memset(&p.allocator, 0, sizeof p.allocator);

    /* parents must exist; a file is not a directory */
    snprintf(sub, sizeof sub, "%s/missing/child", dir);
    p.path = sub;
    assert_int_equal(kvp_file_tier_create(&p, &t, err, sizeof err), KVP_EIO);
    assert_contains(err, "create directory");
    assert_contains(err, sub);
    snprintf(sub, sizeof sub, "%s/plain", dir);
    int fd = open(sub, O_WRONLY | O_CREAT, 0600);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(kvp_file_tier_create(&p, &t, err, sizeof err), KVP_EIO);
    assert_contains(err, "open directory");
    assert_null(t);

    /* a missing directory is made, private to its user */
    snprintf(sub, sizeof sub, "%s/blobs", dir);
    t = open_file_tier(sub, 0, 1);
    struct stat sb;
    assert_int_equal(stat(sub, &sb), 0);
    assert_true(S_ISDIR(sb.st_mode));
    assert_int_equal(sb.st_mode & 077, 0);
    assert_string_equal(kvp_blob_tier_name(t), "file");
    kvp_blob_tier_destroy(t);
    remove_tree(dir);
}

static void test_file_round_trip(void **state) {
    (void)state;
    char dir[PATH_BYTES];
    make_dir(dir);
    kvp_blob_tier_t *t = open_file_tier(dir, 0, 1);
    kvp_hash_t keys[4] = {blob_key(1, 100), blob_key(2, 5000), blob_key(3, 1),
                          blob_key(4, 64)};
    uint8_t *data[4], *bufs_mem[4];
    const void *blobs[4];
    void *bufs[4];
    uint64_t lens[4], caps[4], sizes[4];
    for (int i = 0; i < 4; i++) {
        lens[i] = caps[i] = key_bytes(&keys[i]);
        data[i] = malloc((size_t)lens[i]);
        bufs_mem[i] = malloc((size_t)lens[i]);
        assert_non_null(data[i]);
        assert_non_null(bufs_mem[i]);
        fill(data[i], lens[i], &keys[i], 0);
        blobs[i] = data[i];
        bufs[i] = bufs_mem[i];
    }
    assert_int_equal(kvp_blob_tier_put(t, 3, keys, blobs, lens), KVP_OK);

    /* one file per blob, named by the key's hex */
    char hex[65], path[PATH_BYTES + 80];
    hex_of(&keys[1], hex);
    snprintf(path, sizeof path, "%s/%s.kvpb", dir, hex);
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    assert_int_equal(sb.st_size, 5000);

    assert_int_equal(kvp_blob_tier_get(t, 4, keys, bufs, caps, sizes), KVP_OK);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(sizes[i], lens[i]);
        assert_memory_equal(bufs_mem[i], data[i], (size_t)lens[i]);
    }
    assert_int_equal(sizes[3], 0);
    /* a buffer too small is a miss */
    uint64_t small = 4999;
    assert_int_equal(kvp_blob_tier_get(t, 1, &keys[1], &bufs[1], &small, &sizes[1]), KVP_OK);
    assert_int_equal(sizes[1], 0);

    uint8_t present[4];
    assert_int_equal(kvp_blob_tier_exists(t, 4, keys, present), KVP_OK);
    assert_int_equal(present[0] + present[1] + present[2], 3);
    assert_int_equal(present[3], 0);
    kvp_blob_tier_stats_t s = stats_of(t);
    assert_int_equal(s.entries, 3);
    assert_int_equal(s.bytes, 5101);
    assert_int_equal(s.gets, 5);
    assert_int_equal(s.hits, 3);
    assert_int_equal(s.bytes_in, 5101);
    assert_int_equal(s.puts, 3);
    assert_int_equal(s.bytes_out, 5101);
    assert_int_equal(s.errors, 0);

    /* replacing a blob: the new bytes, the new size */
    uint64_t shorter = 3000;
    fill(data[1], shorter, &keys[1], 7);
    assert_int_equal(kvp_blob_tier_put(t, 1, &keys[1], &blobs[1], &shorter), KVP_OK);
    assert_int_equal(kvp_blob_tier_get(t, 1, &keys[1], &bufs[1], &caps[1], &sizes[1]), KVP_OK);
    assert_int_equal(sizes[1], 3000);
    assert_true(content_is(bufs_mem[1], 3000, &keys[1], 7));
    assert_int_equal(stats_of(t).bytes, 3101);

    /* removing: absent keys are no error */
    assert_int_equal(kvp_blob_tier_remove(t, 1, &keys[0]), KVP_OK);
    assert_int_equal(kvp_blob_tier_remove(t, 2, &keys[2]), KVP_OK);
    assert_false(held(t, &keys[0]));
    assert_false(held(t, &keys[2]));
    assert_int_equal(kvp_blob_tier_get(t, 1, &keys[0], &bufs[0], &caps[0], &sizes[0]), KVP_OK);
    assert_int_equal(sizes[0], 0);
    s = stats_of(t);
    assert_int_equal(s.entries, 1);
    assert_int_equal(s.bytes, 3000);
    assert_int_equal(survey(dir, 0).temporaries, 0);

    kvp_blob_tier_destroy(t);
    for (int i = 0; i < 4; i++) {
        free(data[i]);
        free(bufs_mem[i]);
    }
    remove_tree(dir);
}

/* Names a tier did not write are misses, not errors: a directory, a
 * symbolic link, an empty file under a blob's name. */
static void test_file_foreign_entries(void **state) {
    (void)state;
    char dir[PATH_BYTES], hex[65], path[PATH_BYTES + 80];
    make_dir(dir);
    kvp_blob_tier_t *t = open_file_tier(dir, 0, 0);
    kvp_hash_t keys[4] = {blob_key(1, 64), blob_key(2, 64), blob_key(3, 64), blob_key(4, 64)};
    assert_int_equal(put_key(t, &keys[3]), KVP_OK);
    hex_of(&keys[0], hex);
    snprintf(path, sizeof path, "%s/%s.kvpb", dir, hex);
    assert_int_equal(mkdir(path, 0700), 0);
    char target[PATH_BYTES + 80];
    hex_of(&keys[3], hex);
    snprintf(target, sizeof target, "%s/%s.kvpb", dir, hex);
    hex_of(&keys[1], hex);
    snprintf(path, sizeof path, "%s/%s.kvpb", dir, hex);
    assert_int_equal(symlink(target, path), 0);
    hex_of(&keys[2], hex);
    snprintf(path, sizeof path, "%s/%s.kvpb", dir, hex);
    int fd = open(path, O_WRONLY | O_CREAT, 0600);
    assert_true(fd >= 0);
    close(fd);

    uint8_t b[4][64];
    void *bufs[4] = {b[0], b[1], b[2], b[3]};
    uint64_t caps[4] = {64, 64, 64, 64}, sizes[4];
    assert_int_equal(kvp_blob_tier_get(t, 4, keys, bufs, caps, sizes), KVP_OK);
    assert_int_equal(sizes[0] + sizes[1] + sizes[2], 0);
    assert_int_equal(sizes[3], 64);
    uint8_t present[4];
    assert_int_equal(kvp_blob_tier_exists(t, 4, keys, present), KVP_OK);
    assert_int_equal(present[0] + present[1] + present[2], 0);
    assert_int_equal(present[3], 1);
    kvp_blob_tier_destroy(t);

    /* and reopening indexes only the real blob */
    t = open_file_tier(dir, 0, 0);
    assert_int_equal(stats_of(t).entries, 1);
    kvp_blob_tier_destroy(t);
    remove_tree(dir);
}

/* Plant a temporary as writer `pid` would have left it. */
static void plant_temporary(const char *dir, pid_t pid, int64_t age_s) {
    char path[PATH_BYTES + 128];
    snprintf(path, sizeof path, "%s/.tmp.%ld.%lld.%064d", dir, (long)pid, (long long)age_s, 0);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "partial", 7), 7);
    if (age_s > 0) {
        struct timespec times[2];
        clock_gettime(CLOCK_REALTIME, &times[0]);
        times[0].tv_sec -= age_s;
        times[1] = times[0];
        assert_int_equal(futimens(fd, times), 0);
    }
    close(fd);
}

/* A pid that no process has: a child that has exited and been reaped. */
static pid_t dead_pid(void) {
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) _exit(0);
    assert_int_equal(child_status(pid), 0);
    return pid;
}

static void test_file_reopen(void **state) {
    (void)state;
    char dir[PATH_BYTES];
    make_dir(dir);
    kvp_blob_tier_t *t = open_file_tier(dir, 0, 0);
    uint64_t total = 0;
    /* more blobs than the first index holds: it grows while scanning */
    for (uint32_t i = 0; i < 100; i++) {
        kvp_hash_t k = blob_key(i, 100 + i);
        assert_int_equal(put_key(t, &k), KVP_OK);
        total += 100 + i;
    }
    kvp_blob_tier_destroy(t);

    pid_t gone = dead_pid();
    plant_temporary(dir, gone, 0);         /* its writer died: removed */
    plant_temporary(dir, getpid(), 0);     /* a live writer's: kept */
    plant_temporary(dir, getpid(), 3600);  /* live but stuck for an hour: removed */
    char path[PATH_BYTES + 16];
    snprintf(path, sizeof path, "%s/README", dir);
    int fd = open(path, O_WRONLY | O_CREAT, 0600);
    assert_true(fd >= 0);
    close(fd);

    t = open_file_tier(dir, 0, 0);
    kvp_blob_tier_stats_t s = stats_of(t);
    assert_int_equal(s.entries, 100);
    assert_int_equal(s.bytes, total);
    survey_t v = survey(dir, gone);
    assert_int_equal(v.of_pid, 0);
    assert_int_equal(v.temporaries, 1);
    assert_int_equal(v.blobs, 100);
    assert_int_equal(v.whole, 100);
    assert_int_equal(access(path, F_OK), 0);
    kvp_hash_t k = blob_key(42, 142);
    uint8_t buf[200];
    void *bufs[1] = {buf};
    uint64_t cap = sizeof buf, size = 0;
    assert_int_equal(kvp_blob_tier_get(t, 1, &k, bufs, &cap, &size), KVP_OK);
    assert_int_equal(size, 142);
    assert_true(content_is(buf, 142, &k, 0));
    kvp_blob_tier_destroy(t);
    remove_tree(dir);
}

static void test_file_cap_evicts_lru(void **state) {
    (void)state;
    enum { B = 1000, N = 10 };
    char dir[PATH_BYTES];
    make_dir(dir);
    kvp_blob_tier_t *t = open_file_tier(dir, (uint64_t)N * B, 0);
    kvp_hash_t keys[N + 2];
    for (uint32_t i = 0; i < N + 2; i++) keys[i] = blob_key(i, B);
    for (int i = 0; i < N; i++) assert_int_equal(put_key(t, &keys[i]), KVP_OK);
    assert_int_equal(stats_of(t).bytes, (uint64_t)N * B); /* exactly at the cap: kept */

    /* used since: 0, 1 and 2 */
    uint8_t buf[B];
    void *bufs[1] = {buf};
    uint64_t cap = B, size;
    for (int i = 0; i < 3; i++) {
        assert_int_equal(kvp_blob_tier_get(t, 1, &keys[i], bufs, &cap, &size), KVP_OK);
        assert_int_equal(size, B);
    }
    assert_int_equal(put_key(t, &keys[N]), KVP_OK);
    assert_int_equal(put_key(t, &keys[N + 1]), KVP_OK);
    for (int i = 0; i < 3; i++) assert_true(held(t, &keys[i]));
    assert_false(held(t, &keys[3])); /* the least recently used */
    for (int i = N; i < N + 2; i++) assert_true(held(t, &keys[i]));
    survey_t v = survey(dir, 0);
    assert_true(v.bytes <= (uint64_t)N * B);
    assert_int_equal(v.whole, v.blobs);
    assert_int_equal(stats_of(t).bytes, v.bytes);
    kvp_blob_tier_destroy(t);
    remove_tree(dir);
}

/* A get through another tier on the same directory (as another process
 * would) makes a blob recent for every writer. */
static void test_file_cap_lru_across_tiers(void **state) {
    (void)state;
    enum { B = 1000, N = 10 };
    char dir[PATH_BYTES];
    make_dir(dir);
    kvp_blob_tier_t *writer = open_file_tier(dir, (uint64_t)N * B, 0);
    kvp_hash_t keys[N + 1];
    for (uint32_t i = 0; i <= N; i++) keys[i] = blob_key(100 + i, B);
    for (int i = 0; i < N; i++) assert_int_equal(put_key(writer, &keys[i]), KVP_OK);
    /* past the file system's timestamp granularity (a clock tick) */
    sleep_ms(30);
    kvp_blob_tier_t *reader = open_file_tier(dir, 0, 0);
    uint8_t buf[B];
    void *bufs[1] = {buf};
    uint64_t cap = B, size = 0;
    assert_int_equal(kvp_blob_tier_get(reader, 1, &keys[0], bufs, &cap, &size), KVP_OK);
    assert_int_equal(size, B);
    assert_int_equal(put_key(writer, &keys[N]), KVP_OK);
    assert_true(held(writer, &keys[0]));
    assert_false(held(writer, &keys[1]));
    kvp_blob_tier_destroy(reader);
    kvp_blob_tier_destroy(writer);
    remove_tree(dir);
}

static void test_file_blob_over_cap_refused(void **state) {
    (void)state;
    char dir[PATH_BYTES];
    make_dir(dir);
    kvp_blob_tier_t *t = open_file_tier(dir, 1000, 1);
    kvp_hash_t big = blob_key(1, 1001), fits = blob_key(2, 1000);
    assert_int_equal(put_key(t, &big), KVP_EINVAL);
    assert_contains(kvp_blob_tier_last_error(t), "cap");
    assert_false(held(t, &big));
    /* a batch with one blob too large stores none of it */
    kvp_hash_t keys[2] = {fits, big};
    uint8_t data[1001];
    const void *blobs[2] = {data, data};
    uint64_t lens[2] = {1000, 1001};
    fill(data, 1000, &fits, 0);
    assert_int_equal(kvp_blob_tier_put(t, 2, keys, blobs, lens), KVP_EINVAL);
    assert_false(held(t, &fits));
    kvp_blob_tier_stats_t s = stats_of(t);
    assert_int_equal(s.errors, 2);
    assert_int_equal(s.puts, 0);
    assert_int_equal(s.entries, 0);
    /* exactly the cap fits */
    assert_int_equal(put_key(t, &fits), KVP_OK);
    survey_t v = survey(dir, 0);
    assert_int_equal(v.blobs, 1);
    assert_int_equal(v.whole, 1);
    assert_int_equal(v.temporaries, 0);
    kvp_blob_tier_destroy(t);
    remove_tree(dir);
}

/* A write that fails (here: the file size limit) leaves no temporary and
 * no blob. Run in a child: the limit is the process's. */
static void test_file_failed_write_leaves_nothing(void **state) {
    (void)state;
    char dir[PATH_BYTES];
    make_dir(dir);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit lim = {4096, 4096};
        if (setrlimit(RLIMIT_FSIZE, &lim) != 0) _exit(10);
        kvp_file_tier_params_t p;
        kvp_file_tier_params_init(&p);
        p.path = dir;
        kvp_blob_tier_t *t = NULL;
        if (kvp_file_tier_create(&p, &t, NULL, 0) != KVP_OK) _exit(11);
        kvp_hash_t big = blob_key(1, 65536), small = blob_key(2, 1000);
        if (put_key(t, &big) != KVP_EIO) _exit(12);
        if (strstr(kvp_blob_tier_last_error(t), "write") == NULL) _exit(13);
        if (put_key(t, &small) != KVP_OK) _exit(14);
        kvp_blob_tier_stats_t s;
        memset(&s, 0, sizeof s);
        s.struct_size = sizeof s;
        if (kvp_blob_tier_stats(t, &s) != KVP_OK || s.entries != 1 || s.errors != 1) _exit(15);
        kvp_blob_tier_destroy(t);
        _exit(0);
    }
    assert_int_equal(child_status(pid), 0);
    survey_t v = survey(dir, 0);
    assert_int_equal(v.temporaries, 0);
    assert_int_equal(v.blobs, 1);
    assert_int_equal(v.whole, 1);
    remove_tree(dir);
}

/* ---- several processes ------------------------------------------------------------------ */

/* A writer killed with SIGKILL during its writes leaves only whole blobs
 * visible; opening the directory again removes what it left. */
static void killed_writer_round(long delay_ms) {
    enum { B = 1 << 20, PUTS = 200, KEYS = 8 };
    char dir[PATH_BYTES];
    make_dir(dir);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        kvp_file_tier_params_t p;
        kvp_file_tier_params_init(&p);
        p.path = dir;
        kvp_blob_tier_t *t = NULL;
        if (kvp_file_tier_create(&p, &t, NULL, 0) != KVP_OK) _exit(1);
        for (uint32_t i = 0; i < PUTS; i++) {
            kvp_hash_t k = blob_key(i % KEYS, B);
            if (put_key(t, &k) != KVP_OK) _exit(2);
        }
        kvp_blob_tier_destroy(t);
        _exit(0);
    }
    /* wait (bounded) until it is writing, then a moment more */
    for (int i = 0; i < 2000; i++) {
        survey_t v = survey(dir, pid);
        if (v.blobs > 0 || v.temporaries > 0) break;
        sleep_ms(1);
    }
    sleep_ms(delay_ms);
    assert_int_equal(kill(pid, SIGKILL), 0);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);

    survey_t v = survey(dir, pid);
    assert_int_equal(v.whole, v.blobs);
    print_message("  killed after %ld ms: %d whole blobs, %d temporaries\n", delay_ms, v.blobs,
                  v.temporaries);
    plant_temporary(dir, pid, 0); /* at least one, whatever the timing */
    kvp_blob_tier_t *t = open_file_tier(dir, 0, 0);
    survey_t after = survey(dir, pid);
    assert_int_equal(after.temporaries, 0);
    assert_int_equal(after.blobs, v.blobs);
    assert_int_equal(after.whole, after.blobs);
    kvp_blob_tier_stats_t s = stats_of(t);
    assert_int_equal(s.entries, (uint64_t)v.blobs);
    assert_int_equal(s.bytes, (uint64_t)v.blobs * B);
    kvp_blob_tier_destroy(t);
    remove_tree(dir);
}

static void test_killed_writer_leaves_nothing_visible(void **state) {
    (void)state;
    /* a few moments to be killed at: inside a write, an fsync, a rename */
    for (long delay_ms = 0; delay_ms <= 12; delay_ms += 4) killed_writer_round(delay_ms);
}

/* Two writers of one key, with different contents and lengths: a reader
 * meanwhile gets one whole version or nothing, and one whole version stays. */
static void test_two_writers_same_key(void **state) {
    (void)state;
    enum { PUTS = 60, READS = 20000 };
    const uint64_t len[2] = {300000, 200000};
    char dir[PATH_BYTES];
    make_dir(dir);
    const kvp_hash_t key = blob_key(7, 0);
    pid_t pids[2];
    for (int w = 0; w < 2; w++) {
        pids[w] = fork();
        assert_true(pids[w] >= 0);
        if (pids[w] == 0) {
            kvp_file_tier_params_t p;
            kvp_file_tier_params_init(&p);
            p.path = dir;
            p.fsync = 0;
            kvp_blob_tier_t *t = NULL;
            uint8_t *data = malloc((size_t)len[w]);
            if (data == NULL || kvp_file_tier_create(&p, &t, NULL, 0) != KVP_OK) _exit(1);
            fill(data, len[w], &key, (uint32_t)w + 1);
            const void *blobs[1] = {data};
            for (int i = 0; i < PUTS; i++)
                if (kvp_blob_tier_put(t, 1, &key, blobs, &len[w]) != KVP_OK) _exit(2);
            kvp_blob_tier_destroy(t);
            free(data);
            _exit(0);
        }
    }
    kvp_blob_tier_t *t = open_file_tier(dir, 0, 0);
    uint8_t *buf = malloc((size_t)len[0]);
    assert_non_null(buf);
    void *bufs[1] = {buf};
    uint64_t cap = len[0], size = 0;
    int torn = 0, hits = 0, status[2] = {-1, -1};
    bool done[2] = {false, false};
    for (int i = 0; i < READS && !(done[0] && done[1]); i++) {
        assert_int_equal(kvp_blob_tier_get(t, 1, &key, bufs, &cap, &size), KVP_OK);
        if (size > 0) {
            hits++;
            int w = size == len[0] ? 0 : size == len[1] ? 1 : -1;
            if (w < 0 || !content_is(buf, size, &key, (uint32_t)w + 1)) torn++;
        }
        for (int w = 0; w < 2; w++) {
            int st = 0;
            if (!done[w] && waitpid(pids[w], &st, WNOHANG) == pids[w]) {
                done[w] = true;
                status[w] = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
            }
        }
    }
    assert_int_equal(torn, 0);
    for (int w = 0; w < 2; w++)
        if (!done[w]) status[w] = child_status(pids[w]);
    assert_int_equal(status[0], 0);
    assert_int_equal(status[1], 0);

    char hex[65], path[PATH_BYTES + 80];
    hex_of(&key, hex);
    snprintf(path, sizeof path, "%s/%s.kvpb", dir, hex);
    uint64_t n = 0;
    uint8_t *final = slurp(path, &n);
    assert_non_null(final);
    int w = n == len[0] ? 0 : n == len[1] ? 1 : -1;
    assert_true(w >= 0);
    assert_true(content_is(final, n, &key, (uint32_t)w + 1));
    assert_int_equal(survey(dir, 0).temporaries, 0);
    print_message("  reader saw %d whole versions while two writers raced\n", hits);
    free(final);
    free(buf);
    kvp_blob_tier_destroy(t);
    remove_tree(dir);
}

/*
 * Writers sharing a directory under one cap.
 *
 * The bound asserted while they were all writing is WRITERS x cap, not
 * cap + one blob: each writer keeps its own view of the directory under the
 * cap, but sees the others' blobs only when it scans, which it does when
 * its own view is full. Every blob left is in its writer's view (what it
 * wrote since its last scan, or what that scan saw and it did not evict),
 * so the directory holds at most the sum of the views; writers that start
 * together on an empty directory can each fill a cap before any of them
 * scans, so nothing tighter holds. Once they are done, one more put scans
 * and brings the directory under the cap itself: that is asserted too.
 */
static void test_writers_share_a_cap(void **state) {
    (void)state;
    enum { WRITERS = 4, PUTS = 40, B = 4096, CAP_BLOBS = 16 };
    const uint64_t cap = (uint64_t)CAP_BLOBS * B;
    char dir[PATH_BYTES];
    make_dir(dir);
    pid_t pids[WRITERS];
    for (int w = 0; w < WRITERS; w++) {
        pids[w] = fork();
        assert_true(pids[w] >= 0);
        if (pids[w] == 0) {
            kvp_file_tier_params_t p;
            kvp_file_tier_params_init(&p);
            p.path = dir;
            p.fsync = 0;
            p.max_bytes = cap;
            kvp_blob_tier_t *t = NULL;
            if (kvp_file_tier_create(&p, &t, NULL, 0) != KVP_OK) _exit(1);
            for (uint32_t i = 0; i < PUTS; i++) {
                kvp_hash_t k = blob_key((uint32_t)w * 1000 + i, B);
                if (put_key(t, &k) != KVP_OK) _exit(2);
            }
            kvp_blob_tier_destroy(t);
            _exit(0);
        }
    }
    for (int w = 0; w < WRITERS; w++) assert_int_equal(child_status(pids[w]), 0);
    survey_t v = survey(dir, 0);
    print_message("  %d writers left %llu bytes under a cap of %llu\n", WRITERS,
                  (unsigned long long)v.bytes, (unsigned long long)cap);
    assert_int_equal(v.whole, v.blobs);
    assert_int_equal(v.temporaries, 0);
    assert_true(v.bytes <= WRITERS * cap);
    assert_true(v.bytes < (uint64_t)WRITERS * PUTS * B); /* they did evict */

    kvp_blob_tier_t *t = open_file_tier(dir, cap, 0);
    kvp_hash_t last = blob_key(99999, B);
    assert_int_equal(put_key(t, &last), KVP_OK);
    v = survey(dir, 0);
    assert_true(v.bytes <= cap);
    assert_int_equal(v.whole, v.blobs);
    assert_int_equal(stats_of(t).bytes, v.bytes);
    kvp_blob_tier_destroy(t);
    remove_tree(dir);
}

/* ---- allocation failures ----------------------------------------------------------------- */

/* Fail each allocation of creation in turn, on an empty directory and on
 * one whose index must grow while it is scanned. */
static void test_file_create_allocation_failures(void **state) {
    (void)state;
    char dir[PATH_BYTES];
    make_dir(dir);
    for (int populated = 0; populated <= 1; populated++) {
        if (populated) {
            kvp_blob_tier_t *t = open_file_tier(dir, 0, 0);
            for (uint32_t i = 0; i < 100; i++) {
                kvp_hash_t k = blob_key(i, 16);
                assert_int_equal(put_key(t, &k), KVP_OK);
            }
            kvp_blob_tier_destroy(t);
        }
        long fail_at = 0;
        for (;; fail_at++) {
            test_alloc_state st = {0, fail_at, 0, 0};
            kvp_file_tier_params_t p;
            kvp_file_tier_params_init(&p);
            p.path = dir;
            p.allocator = test_allocator(&st);
            kvp_blob_tier_t *t = NULL;
            char err[KVP_ERR_SIZE];
            int rc = kvp_file_tier_create(&p, &t, err, sizeof err);
            if (rc == KVP_OK) {
                assert_int_equal(st.calls, fail_at); /* every allocation was failed once */
                assert_int_equal(stats_of(t).entries, populated ? 100 : 0);
                kvp_blob_tier_destroy(t);
                assert_int_equal(st.live, 0);
                break;
            }
            assert_int_equal(rc, KVP_ENOMEM);
            assert_null(t);
            assert_int_equal(st.live, 0);
        }
        /* the tier, its path, its index and the wrapper; two more growths */
        assert_true(fail_at >= (populated ? 6 : 4));
    }
    remove_tree(dir);
}

/* A put that needs memory (a scan before evicting) and cannot have it
 * fails whole: nothing written, the index as it was. */
static void test_file_put_allocation_failure(void **state) {
    (void)state;
    enum { B = 100, N = 8 };
    char dir[PATH_BYTES];
    make_dir(dir);
    test_alloc_state st = {0, -1, 0, 0};
    kvp_file_tier_params_t p;
    kvp_file_tier_params_init(&p);
    p.path = dir;
    p.fsync = 0;
    p.max_bytes = (uint64_t)N * B;
    p.allocator = test_allocator(&st);
    kvp_blob_tier_t *t = NULL;
    assert_int_equal(kvp_file_tier_create(&p, &t, NULL, 0), KVP_OK);
    for (uint32_t i = 0; i < N; i++) {
        kvp_hash_t k = blob_key(i, B);
        assert_int_equal(put_key(t, &k), KVP_OK);
    }
    long before = st.live;
    kvp_hash_t next = blob_key(N, B);
    for (long k = 0; k < 2; k++) { /* the new index of the scan; the eviction order */
        st.fail_at = st.calls + k;
        assert_int_equal(put_key(t, &next), KVP_ENOMEM);
        assert_int_equal(st.live, before);
        assert_false(held(t, &next));
        assert_int_equal(survey(dir, 0).temporaries, 0);
        kvp_blob_tier_stats_t s = stats_of(t);
        assert_int_equal(s.bytes, (uint64_t)N * B);
    }
    st.fail_at = -1;
    assert_int_equal(put_key(t, &next), KVP_OK);
    assert_true(held(t, &next));
    kvp_blob_tier_destroy(t);
    assert_int_equal(st.live, 0);
    remove_tree(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create_checks),
        cmocka_unit_test(test_null_handle),
        cmocka_unit_test(test_call_checks),
        cmocka_unit_test(test_counters),
        cmocka_unit_test(test_failing_implementation),
        cmocka_unit_test(test_oversize_implementation),
        cmocka_unit_test(test_ops_copied),
        cmocka_unit_test(test_wrapper_allocation_failure),
        cmocka_unit_test(test_file_params),
        cmocka_unit_test(test_file_round_trip),
        cmocka_unit_test(test_file_foreign_entries),
        cmocka_unit_test(test_file_reopen),
        cmocka_unit_test(test_file_cap_evicts_lru),
        cmocka_unit_test(test_file_cap_lru_across_tiers),
        cmocka_unit_test(test_file_blob_over_cap_refused),
        cmocka_unit_test(test_file_failed_write_leaves_nothing),
        cmocka_unit_test(test_killed_writer_leaves_nothing_visible),
        cmocka_unit_test(test_two_writers_same_key),
        cmocka_unit_test(test_writers_share_a_cap),
        cmocka_unit_test(test_file_create_allocation_failures),
        cmocka_unit_test(test_file_put_allocation_failure),
    };
    return cmocka_run_group_tests_name("blobtier", tests, NULL, NULL);
}
