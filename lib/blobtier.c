/*
 * Blob tiers: the checked, counted interface in front of any implementation
 * of kvp_blob_tier_ops_t (a directory, a shared store, the engine's own).
 *
 * An implementation is trusted as code (like an allocator hook) but not in
 * what it reports: the wrapper clears every output before the call, so one
 * that forgets a key reports a miss; a length beyond the caller's buffer
 * becomes a miss; and when a call fails, every output of the batch is
 * cleared again, whatever the implementation left there. The wrapper counts
 * keys, hits, bytes and time, and keeps the implementation's own words
 * about a failure in its sticky detail text.
 */
#define _POSIX_C_SOURCE 200809L
#include "blobtier.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

/* Bytes kept of a tier's name, with its NUL (the header promises 31). */
#define NAME_BYTES 32

struct kvp_blob_tier {
    kvp_blob_tier_ops_t ops; /* copied at creation */
    void *self;
    kvp_allocator_t alloc;
    char name[NAME_BYTES];
    kvp_blob_tier_stats_t counters; /* entries and bytes are asked for at read time */
    char err[KVP_ERR_SIZE];
};

static int fail(kvp_blob_tier_t *t, int status, const char *fmt, ...) KVP__PRINTF(3, 4);
static int fail(kvp_blob_tier_t *t, int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    kvp__verrf(t->err, sizeof t->err, status, fmt, ap);
    va_end(ap);
    return status;
}

int kvp__blob_tier_fail(kvp_blob_tier_t *t, int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    kvp__verrf(t->err, sizeof t->err, status, fmt, ap);
    va_end(ap);
    return status;
}

void *kvp__blob_tier_self(const kvp_blob_tier_t *t,
                          int (*put)(void *, int32_t, const kvp_hash_t *, const void *const *,
                                     const uint64_t *)) {
    return t != NULL && t->ops.put == put ? t->self : NULL;
}

static uint64_t monotonic_ns(void) {
    struct timespec ts = {0, 0};
    (void)clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t since(uint64_t start) {
    uint64_t now = monotonic_ns();
    return now > start ? now - start : 0;
}

/* ---- creation ------------------------------------------------------------- */

static const char *missing_function(const kvp_blob_tier_ops_t *ops) {
    if (ops->get == NULL) return "get";
    if (ops->put == NULL) return "put";
    if (ops->exists == NULL) return "exists";
    if (ops->remove == NULL) return "remove";
    return NULL;
}

int kvp__blob_tier_create(const kvp_blob_tier_ops_t *ops, void *self, const char *name,
                          const kvp_allocator_t *alloc, kvp_blob_tier_t **out, char *err,
                          size_t err_size) {
    if (out == NULL) return kvp__errf(err, err_size, KVP_EINVAL, "out is NULL");
    int rc = kvp__check_struct(ops, sizeof *ops, "ops", err, err_size);
    if (rc == KVP_OK) rc = kvp__check_reserved(ops->reserved_, "ops", err, err_size);
    if (rc == KVP_OK) rc = kvp__allocator_check(alloc, err, err_size);
    if (rc != KVP_OK) return rc;
    const char *missing = missing_function(ops);
    if (missing != NULL)
        return kvp__errf(err, err_size, KVP_EINVAL,
                         "ops->%s is NULL (get, put, exists and remove are required)", missing);
    if (name == NULL)
        return kvp__errf(err, err_size, KVP_EINVAL,
                         "name is NULL (give a short name, e.g. \"file\")");

    kvp_allocator_t hooks;
    memset(&hooks, 0, sizeof hooks);
    if (alloc != NULL) hooks = *alloc;
    kvp_blob_tier_t *t = kvp__calloc(&hooks, 1, sizeof *t, 0);
    if (t == NULL) return kvp__errf(err, err_size, KVP_ENOMEM, "cannot allocate the blob tier");
    /* A newer implementation's larger struct is cut to the functions we know. */
    memcpy(&t->ops, ops, sizeof t->ops);
    t->ops.struct_size = sizeof t->ops;
    t->self = self;
    t->alloc = hooks;
    snprintf(t->name, sizeof t->name, "%s", name);
    t->counters.struct_size = sizeof t->counters;
    *out = t;
    return KVP_OK;
}

int kvp_blob_tier_create(const kvp_blob_tier_ops_t *ops, void *self, const char *name,
                         kvp_blob_tier_t **out, char *err, size_t err_size) {
    return kvp__blob_tier_create(ops, self, name, NULL, out, err, err_size);
}

void kvp_blob_tier_destroy(kvp_blob_tier_t *tier) {
    if (tier == NULL) return;
    kvp_allocator_t a = tier->alloc;
    if (tier->ops.destroy != NULL) tier->ops.destroy(tier->self);
    kvp__free(&a, tier);
}

const char *kvp_blob_tier_last_error(const kvp_blob_tier_t *tier) {
    return tier ? tier->err : KVP__NULL_HANDLE;
}

const char *kvp_blob_tier_name(const kvp_blob_tier_t *tier) { return tier ? tier->name : ""; }

/* ---- failures of the implementation ------------------------------------------ */

/* The detail text is one line: an implementation's message may not be. */
static void one_line(char *s) {
    for (; *s; s++)
        if (*s == '\n' || *s == '\r') *s = ' ';
}

/* The implementation's call `fn` returned `rc` != KVP_OK: count it and keep
 * its words. A positive value breaks the contract and becomes KVP_EIO (the
 * tier failed, whatever it meant). */
static int impl_failed(kvp_blob_tier_t *t, const char *fn, int rc) {
    t->counters.errors++;
    if (rc > 0)
        return fail(t, KVP_EIO, "%s tier: %s returned %d, not a status", t->name, fn, rc);
    const char *why = t->ops.last_error != NULL ? t->ops.last_error(t->self) : NULL;
    if (why == NULL || why[0] == '\0')
        return fail(t, rc, "%s tier: %s failed (%s)", t->name, fn, kvp_status_name(rc));
    /* bounded: the text is the implementation's, the buffer is ours */
    fail(t, rc, "%s tier: %s: %.*s", t->name, fn, KVP_ERR_SIZE, why);
    one_line(t->err);
    return rc;
}

/* ---- argument checks ------------------------------------------------------------ */

static int check_batch(kvp_blob_tier_t *t, const char *fn, int32_t n, const kvp_hash_t *keys) {
    if (n < 1) return fail(t, KVP_EINVAL, "%s: n is %d, expected at least 1", fn, (int)n);
    if (keys == NULL) return fail(t, KVP_EINVAL, "%s: keys is NULL", fn);
    return KVP_OK;
}

static int check_get(kvp_blob_tier_t *t, int32_t n, void *const *bufs, const uint64_t *caps) {
    if (bufs == NULL || caps == NULL)
        return fail(t, KVP_EINVAL, "get: %s is NULL", bufs == NULL ? "bufs" : "caps");
    for (int32_t i = 0; i < n; i++) {
        if (bufs[i] == NULL) return fail(t, KVP_EINVAL, "get: bufs[%d] is NULL", (int)i);
        if (caps[i] == 0) return fail(t, KVP_EINVAL, "get: caps[%d] is 0", (int)i);
    }
    return KVP_OK;
}

static int check_put(kvp_blob_tier_t *t, int32_t n, const void *const *blobs,
                     const uint64_t *sizes) {
    if (blobs == NULL || sizes == NULL)
        return fail(t, KVP_EINVAL, "put: %s is NULL", blobs == NULL ? "blobs" : "sizes");
    for (int32_t i = 0; i < n; i++) {
        if (blobs[i] == NULL) return fail(t, KVP_EINVAL, "put: blobs[%d] is NULL", (int)i);
        if (sizes[i] == 0) return fail(t, KVP_EINVAL, "put: sizes[%d] is 0", (int)i);
    }
    return KVP_OK;
}

/* ---- calls ---------------------------------------------------------------------- */

int kvp_blob_tier_get(kvp_blob_tier_t *tier, int32_t n, const kvp_hash_t *keys,
                      void *const *bufs, const uint64_t *caps, uint64_t *sizes) {
    if (tier == NULL) return KVP_EINVAL;
    int rc = check_batch(tier, "get", n, keys);
    if (rc != KVP_OK) return rc;
    if (sizes == NULL) return fail(tier, KVP_EINVAL, "get: sizes is NULL");
    /* every key a miss until the implementation says otherwise, even when
     * the call is refused below */
    memset(sizes, 0, (size_t)n * sizeof *sizes);
    rc = check_get(tier, n, bufs, caps);
    if (rc != KVP_OK) return rc;

    uint64_t start = monotonic_ns();
    rc = tier->ops.get(tier->self, n, keys, bufs, caps, sizes);
    tier->counters.get_ns += since(start);
    tier->counters.gets += (uint64_t)n;
    if (rc != KVP_OK) {
        memset(sizes, 0, (size_t)n * sizeof *sizes);
        return impl_failed(tier, "get", rc);
    }
    for (int32_t i = 0; i < n; i++) {
        if (sizes[i] > caps[i]) sizes[i] = 0; /* it wrote past the buffer, or lies */
        if (sizes[i] == 0) continue;
        tier->counters.hits++;
        tier->counters.bytes_in += sizes[i];
    }
    return KVP_OK;
}

int kvp_blob_tier_put(kvp_blob_tier_t *tier, int32_t n, const kvp_hash_t *keys,
                      const void *const *blobs, const uint64_t *sizes) {
    if (tier == NULL) return KVP_EINVAL;
    int rc = check_batch(tier, "put", n, keys);
    if (rc == KVP_OK) rc = check_put(tier, n, blobs, sizes);
    if (rc != KVP_OK) return rc;

    uint64_t start = monotonic_ns();
    rc = tier->ops.put(tier->self, n, keys, blobs, sizes);
    tier->counters.put_ns += since(start);
    if (rc != KVP_OK) return impl_failed(tier, "put", rc);
    tier->counters.puts += (uint64_t)n;
    for (int32_t i = 0; i < n; i++) tier->counters.bytes_out += sizes[i];
    return KVP_OK;
}

int kvp_blob_tier_exists(kvp_blob_tier_t *tier, int32_t n, const kvp_hash_t *keys,
                         uint8_t *present) {
    if (tier == NULL) return KVP_EINVAL;
    int rc = check_batch(tier, "exists", n, keys);
    if (rc != KVP_OK) return rc;
    if (present == NULL) return fail(tier, KVP_EINVAL, "exists: present is NULL");
    memset(present, 0, (size_t)n);

    rc = tier->ops.exists(tier->self, n, keys, present);
    if (rc != KVP_OK) {
        memset(present, 0, (size_t)n);
        return impl_failed(tier, "exists", rc);
    }
    for (int32_t i = 0; i < n; i++) present[i] = present[i] != 0;
    return KVP_OK;
}

int kvp_blob_tier_remove(kvp_blob_tier_t *tier, int32_t n, const kvp_hash_t *keys) {
    if (tier == NULL) return KVP_EINVAL;
    int rc = check_batch(tier, "remove", n, keys);
    if (rc != KVP_OK) return rc;
    rc = tier->ops.remove(tier->self, n, keys);
    return rc == KVP_OK ? KVP_OK : impl_failed(tier, "remove", rc);
}

int kvp_blob_tier_stats(kvp_blob_tier_t *tier, kvp_blob_tier_stats_t *stats) {
    if (tier == NULL) return KVP_EINVAL;
    int rc = kvp__check_struct(stats, sizeof *stats, "stats", tier->err, sizeof tier->err);
    if (rc != KVP_OK) return rc;
    kvp_blob_tier_stats_t o = tier->counters;
    o.entries = 0;
    o.bytes = 0;
    /* what the tier holds is its own to say; a failure means "unknown" */
    uint64_t entries = 0, bytes = 0;
    if (tier->ops.usage != NULL && tier->ops.usage(tier->self, &entries, &bytes) == KVP_OK) {
        o.entries = entries;
        o.bytes = bytes;
    }
    kvp__copy_out(stats, &o, sizeof o);
    return KVP_OK;
}
