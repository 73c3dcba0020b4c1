/*
 * The queue tier: puts return at once, a thread of the tier's own writes
 * them to the tier behind it.
 *
 * A cache writes pages back from inside kvp_cache_begin_step() and through
 * at its start; a file tier with fsync, or a network store, would make the
 * decode loop wait for a disk or a round trip there. Behind a queue, a put
 * costs a copy into the queue (or nothing when the queue is full: the blob
 * is dropped and counted, a miss later and never a stall). Blobs waiting in
 * the queue, or being written, are visible to get and exists at once, so a
 * page written back and asked for again in the next step is found.
 *
 * Two locks: `lock` guards the queue and is held only for list work, so a
 * put never waits for the tier behind, nor a get or exists of blobs still
 * queued; `inner_lock` serializes every call on the tier behind (the
 * writer's puts, the caller's gets, exists and removes), so that tier need
 * not be thread-safe (the file tier is not).
 * Order: inner_lock before lock; the writer never holds lock while it
 * waits for inner_lock.
 */
#define _POSIX_C_SOURCE 200809L
#include "blobtier.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

/* Blobs the writer puts in one call of the tier behind. */
#define WRITE_BATCH 16

typedef struct entry {
    struct entry *next;
    kvp_hash_t key;
    uint64_t bytes;
    bool removed; /* removed while being written: remove it behind afterwards */
    uint8_t data[]; /* the blob */
} entry_t;

typedef struct {
    kvp_allocator_t alloc;
    kvp_blob_tier_t *inner;
    uint64_t max_bytes;
    pthread_mutex_t lock, inner_lock;
    pthread_cond_t work; /* the writer waits for entries or stop */
    pthread_cond_t idle; /* drain waits for an empty queue */
    pthread_t thread;
    entry_t *head, *tail; /* waiting, oldest first */
    entry_t *flight[WRITE_BATCH]; /* being written */
    int32_t nflight;
    uint64_t bytes; /* waiting and being written */
    int32_t count;
    bool stop;
    uint64_t dropped, failed; /* blobs not stored: queue full / the tier behind failed */
    uint64_t inner_entries, inner_bytes; /* the tier behind's usage, as last seen */
    char err[KVP_ERR_SIZE];   /* the last failure behind of a caller's get, exists or
                                 remove (the writer's stay on the tier behind) */
} queue_t;

static bool same(const kvp_hash_t *a, const kvp_hash_t *b) {
    return memcmp(a->bytes, b->bytes, 32) == 0;
}

/* The newest blob queued or in flight under `key`, or NULL (lock held). */
static entry_t *find(queue_t *q, const kvp_hash_t *key) {
    entry_t *found = NULL;
    for (int32_t i = 0; i < q->nflight; i++)
        if (!q->flight[i]->removed && same(&q->flight[i]->key, key)) found = q->flight[i];
    for (entry_t *e = q->head; e != NULL; e = e->next)
        if (same(&e->key, key)) found = e;
    return found;
}

static void note_failure(queue_t *q) {
    snprintf(q->err, sizeof q->err, "%s", kvp_blob_tier_last_error(q->inner));
}

/* Write one batch: move it in flight, put it behind, free it. Called with
 * `lock` held and a non-empty queue; returns with `lock` held. */
static void write_batch(queue_t *q) {
    kvp_hash_t keys[WRITE_BATCH];
    const void *blobs[WRITE_BATCH];
    uint64_t sizes[WRITE_BATCH];
    int32_t n = 0;
    while (q->head != NULL && n < WRITE_BATCH) {
        entry_t *e = q->head;
        q->head = e->next;
        q->flight[n] = e;
        keys[n] = e->key;
        blobs[n] = e->data;
        sizes[n++] = e->bytes;
    }
    if (q->head == NULL) q->tail = NULL;
    q->nflight = n;
    pthread_mutex_unlock(&q->lock);

    /* a failure is counted (kvp_queue_tier_info); its words stay on the
     * tier behind (kvp_blob_tier_last_error), not on this caller's tier */
    pthread_mutex_lock(&q->inner_lock);
    int rc = kvp_blob_tier_put(q->inner, n, keys, blobs, sizes);
    pthread_mutex_unlock(&q->inner_lock);

    pthread_mutex_lock(&q->lock);
    int32_t gone = 0;
    for (int32_t i = 0; i < n; i++) {
        entry_t *e = q->flight[i];
        if (e->removed) keys[gone++] = e->key;
        q->bytes -= e->bytes;
        q->count--;
        kvp__free(&q->alloc, e);
    }
    q->nflight = 0;
    if (rc != KVP_OK) q->failed += (uint64_t)n;
    if (gone > 0) { /* removed while in flight: they must not stay behind */
        pthread_mutex_unlock(&q->lock);
        pthread_mutex_lock(&q->inner_lock);
        kvp_blob_tier_remove(q->inner, gone, keys);
        pthread_mutex_unlock(&q->inner_lock);
        pthread_mutex_lock(&q->lock);
    }
}

static void *writer(void *arg) {
    queue_t *q = (queue_t *)arg;
    pthread_mutex_lock(&q->lock);
    for (;;) {
        if (q->head == NULL) {
            pthread_cond_broadcast(&q->idle);
            if (q->stop) break; /* drained */
            pthread_cond_wait(&q->work, &q->lock);
            continue;
        }
        write_batch(q);
    }
    pthread_mutex_unlock(&q->lock);
    return NULL;
}

static int q_put(void *self, int32_t n, const kvp_hash_t *keys, const void *const *blobs,
                 const uint64_t *sizes) {
    queue_t *q = (queue_t *)self;
    pthread_mutex_lock(&q->lock);
    for (int32_t i = 0; i < n; i++) {
        entry_t *e = NULL;
        if (sizes[i] <= q->max_bytes - q->bytes)
            e = (entry_t *)kvp__malloc(&q->alloc, sizeof *e + (size_t)sizes[i], 64);
        if (e == NULL) { /* full (or out of memory): a miss later, no stall now */
            q->dropped++;
            continue;
        }
        e->next = NULL;
        e->key = keys[i];
        e->bytes = sizes[i];
        e->removed = false;
        memcpy(e->data, blobs[i], (size_t)sizes[i]);
        if (q->tail) q->tail->next = e;
        else q->head = e;
        q->tail = e;
        q->bytes += sizes[i];
        q->count++;
    }
    pthread_cond_signal(&q->work);
    pthread_mutex_unlock(&q->lock);
    return KVP_OK;
}

static int q_get(void *self, int32_t n, const kvp_hash_t *keys, void *const *bufs,
                 const uint64_t *caps, uint64_t *sizes) {
    queue_t *q = (queue_t *)self;
    /* the queue first: what waits or is being written is served without
     * waiting for the tier behind */
    pthread_mutex_lock(&q->lock);
    bool behind = false;
    for (int32_t i = 0; i < n; i++) {
        entry_t *e = find(q, &keys[i]);
        sizes[i] = 0;
        if (e == NULL) behind = true;
        else if (e->bytes <= caps[i]) {
            memcpy(bufs[i], e->data, (size_t)e->bytes);
            sizes[i] = e->bytes;
        }
    }
    pthread_mutex_unlock(&q->lock);
    if (!behind) return KVP_OK;
    /* the rest from the tier behind, batched (a blob that landed there in
     * the meantime is found there) */
    int rc = KVP_OK;
    kvp_hash_t rest[WRITE_BATCH];
    void *rbufs[WRITE_BATCH];
    uint64_t rcaps[WRITE_BATCH], rsizes[WRITE_BATCH];
    int32_t at[WRITE_BATCH], m = 0;
    pthread_mutex_lock(&q->inner_lock);
    for (int32_t i = 0; i < n && rc == KVP_OK; i++) {
        if (sizes[i] == 0) {
            rest[m] = keys[i];
            rbufs[m] = bufs[i];
            rcaps[m] = caps[i];
            at[m++] = i;
        }
        if (m == WRITE_BATCH || (i == n - 1 && m > 0)) {
            rc = kvp_blob_tier_get(q->inner, m, rest, rbufs, rcaps, rsizes);
            for (int32_t j = 0; j < m && rc == KVP_OK; j++) sizes[at[j]] = rsizes[j];
            m = 0;
        }
    }
    if (rc != KVP_OK) note_failure(q);
    pthread_mutex_unlock(&q->inner_lock);
    return rc;
}

static int q_exists(void *self, int32_t n, const kvp_hash_t *keys, uint8_t *present) {
    queue_t *q = (queue_t *)self;
    pthread_mutex_lock(&q->lock);
    bool behind = false;
    for (int32_t i = 0; i < n; i++) {
        present[i] = find(q, &keys[i]) != NULL;
        behind = behind || !present[i];
    }
    pthread_mutex_unlock(&q->lock);
    if (!behind) return KVP_OK;
    uint8_t there[WRITE_BATCH];
    int rc = KVP_OK;
    pthread_mutex_lock(&q->inner_lock);
    for (int32_t i0 = 0; i0 < n && rc == KVP_OK; i0 += WRITE_BATCH) {
        int32_t m = n - i0 < WRITE_BATCH ? n - i0 : WRITE_BATCH;
        rc = kvp_blob_tier_exists(q->inner, m, keys + i0, there);
        for (int32_t j = 0; j < m && rc == KVP_OK; j++) present[i0 + j] |= there[j];
    }
    if (rc != KVP_OK) note_failure(q);
    pthread_mutex_unlock(&q->inner_lock);
    return rc;
}

static bool listed(const kvp_hash_t *keys, int32_t n, const kvp_hash_t *key) {
    for (int32_t i = 0; i < n; i++)
        if (same(&keys[i], key)) return true;
    return false;
}

static int q_remove(void *self, int32_t n, const kvp_hash_t *keys) {
    queue_t *q = (queue_t *)self;
    pthread_mutex_lock(&q->inner_lock);
    pthread_mutex_lock(&q->lock);
    for (int32_t i = 0; i < q->nflight; i++)
        if (listed(keys, n, &q->flight[i]->key)) q->flight[i]->removed = true;
    entry_t **link = &q->head, *prev = NULL;
    while (*link != NULL) {
        entry_t *e = *link;
        if (!listed(keys, n, &e->key)) {
            prev = e;
            link = &e->next;
            continue;
        }
        *link = e->next;
        if (q->tail == e) q->tail = prev;
        q->bytes -= e->bytes;
        q->count--;
        kvp__free(&q->alloc, e);
    }
    pthread_mutex_unlock(&q->lock);
    int rc = kvp_blob_tier_remove(q->inner, n, keys);
    if (rc != KVP_OK) note_failure(q);
    pthread_mutex_unlock(&q->inner_lock);
    return rc;
}

static int q_usage(void *self, uint64_t *entries, uint64_t *bytes) {
    queue_t *q = (queue_t *)self;
    /* the tier behind's usage when it is free, else as last seen: a report
     * never waits for a write */
    if (pthread_mutex_trylock(&q->inner_lock) == 0) {
        kvp_blob_tier_stats_t st = {.struct_size = sizeof st};
        if (kvp_blob_tier_stats(q->inner, &st) == KVP_OK) {
            q->inner_entries = st.entries;
            q->inner_bytes = st.bytes;
        }
        pthread_mutex_unlock(&q->inner_lock);
    }
    pthread_mutex_lock(&q->lock);
    *entries = q->inner_entries + (uint64_t)q->count;
    *bytes = q->inner_bytes + q->bytes;
    pthread_mutex_unlock(&q->lock);
    return KVP_OK;
}

static const char *q_last_error(void *self) { return ((queue_t *)self)->err; }

static void q_destroy(void *self) {
    queue_t *q = (queue_t *)self;
    pthread_mutex_lock(&q->lock);
    q->stop = true;
    pthread_cond_signal(&q->work);
    pthread_mutex_unlock(&q->lock);
    pthread_join(q->thread, NULL); /* the writer drains the queue first */
    pthread_cond_destroy(&q->work);
    pthread_cond_destroy(&q->idle);
    pthread_mutex_destroy(&q->inner_lock);
    pthread_mutex_destroy(&q->lock);
    kvp_allocator_t a = q->alloc;
    kvp__free(&a, q);
}

void kvp_queue_tier_params_init(kvp_queue_tier_params_t *p) {
    if (p == NULL) return;
    memset(p, 0, sizeof *p);
    p->struct_size = sizeof *p;
    p->max_bytes = 256ull << 20;
}

/* Start the locks and the writer; false (nothing left to undo) on failure. */
static bool start(queue_t *q) {
    bool lock = pthread_mutex_init(&q->lock, NULL) == 0;
    bool inner = lock && pthread_mutex_init(&q->inner_lock, NULL) == 0;
    bool work = inner && pthread_cond_init(&q->work, NULL) == 0;
    bool idle = work && pthread_cond_init(&q->idle, NULL) == 0;
    if (idle && pthread_create(&q->thread, NULL, writer, q) == 0) return true;
    if (idle) pthread_cond_destroy(&q->idle);
    if (work) pthread_cond_destroy(&q->work);
    if (inner) pthread_mutex_destroy(&q->inner_lock);
    if (lock) pthread_mutex_destroy(&q->lock);
    return false;
}

int kvp_queue_tier_create(const kvp_queue_tier_params_t *p, kvp_blob_tier_t **out, char *err,
                          size_t err_size) {
    if (out == NULL) return kvp__errf(err, err_size, KVP_EINVAL, "out is NULL");
    int rc = kvp__check_struct(p, sizeof *p, "params", err, err_size);
    if (rc == KVP_OK) rc = kvp__check_reserved(p->reserved_, "params", err, err_size);
    if (rc == KVP_OK) rc = kvp__allocator_check(&p->allocator, err, err_size);
    if (rc != KVP_OK) return rc;
    if (p->inner == NULL) return kvp__errf(err, err_size, KVP_EINVAL, "inner is NULL");
    if (p->max_bytes == 0) return kvp__errf(err, err_size, KVP_EINVAL, "max_bytes is 0");
    queue_t *q = (queue_t *)kvp__calloc(&p->allocator, 1, sizeof *q, 0);
    if (q == NULL) return kvp__errf(err, err_size, KVP_ENOMEM, "out of memory (queue tier)");
    q->alloc = p->allocator;
    q->inner = p->inner;
    q->max_bytes = p->max_bytes;
    if (!start(q)) {
        kvp__free(&p->allocator, q);
        return kvp__errf(err, err_size, KVP_ENOMEM, "could not start the queue's thread");
    }
    kvp_blob_tier_ops_t ops;
    memset(&ops, 0, sizeof ops);
    ops.struct_size = sizeof ops;
    ops.get = q_get;
    ops.put = q_put;
    ops.exists = q_exists;
    ops.remove = q_remove;
    ops.usage = q_usage;
    ops.last_error = q_last_error;
    ops.destroy = q_destroy;
    char name[32];
    snprintf(name, sizeof name, "queue:%s", kvp_blob_tier_name(p->inner));
    rc = kvp__blob_tier_create(&ops, q, name, &p->allocator, out, err, err_size);
    if (rc != KVP_OK) q_destroy(q);
    return rc;
}

/* The queue behind a tier made by kvp_queue_tier_create(), or NULL. */
static queue_t *queue_of(kvp_blob_tier_t *tier) {
    return (queue_t *)kvp__blob_tier_self(tier, q_put);
}

int kvp_queue_tier_info(kvp_blob_tier_t *tier, kvp_queue_tier_info_t *info) {
    if (tier == NULL) return KVP_EINVAL;
    queue_t *q = queue_of(tier);
    if (q == NULL) return kvp__blob_tier_fail(tier, KVP_EINVAL, "not a queue tier");
    char why[KVP_ERR_SIZE];
    if (kvp__check_struct(info, sizeof *info, "info", why, sizeof why) != KVP_OK)
        return kvp__blob_tier_fail(tier, KVP_EINVAL, "%s", why);
    kvp_queue_tier_info_t r;
    memset(&r, 0, sizeof r);
    r.struct_size = sizeof r;
    pthread_mutex_lock(&q->lock);
    r.queued = (uint64_t)q->count;
    r.queued_bytes = q->bytes;
    r.dropped = q->dropped;
    r.failed = q->failed;
    pthread_mutex_unlock(&q->lock);
    kvp__copy_out(info, &r, sizeof r);
    return KVP_OK;
}

int kvp_queue_tier_drain(kvp_blob_tier_t *tier) {
    if (tier == NULL) return KVP_EINVAL;
    queue_t *q = queue_of(tier);
    if (q == NULL) return kvp__blob_tier_fail(tier, KVP_EINVAL, "not a queue tier");
    pthread_mutex_lock(&q->lock);
    while (q->count > 0) pthread_cond_wait(&q->idle, &q->lock);
    pthread_mutex_unlock(&q->lock);
    return KVP_OK;
}
