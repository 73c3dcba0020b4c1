/*
 * kvpage-bench tiers: KV leaving the process. Per format: bytes per token on
 * the wire, sequence export and import GB/s (import includes every check a
 * blob gets: lengths, checksum, identity, chain hash, payload invariants;
 * and, with a key, HMAC), against a single-threaded streaming read measured
 * in the same run; file tier put and get GB/s. With --remote, the Redis
 * tier's put and get GB/s and pages/s for fp16, int8 and int4 blobs, in
 * batches (pipelined) and one page per call, against redis-benchmark on
 * values of the same size in the same run (--remote auto: on a redis-server
 * the bench starts on a free loopback port and stops at the end).
 *
 * The sequence is prefilled with random K/V through the cache façade, so
 * the pages are what the encoders write. Export and import run on one
 * thread, as they do in an engine's admission path.
 */
#define _POSIX_C_SOURCE 200809L
#include "bench.h"

#include "cli.h"
#include "kvpage_blob.h"
#include "kvpage_ext.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define TOOL "kvpage-bench tiers"

typedef struct {
    const char *name;
    int32_t k, v;
    int remote; /* measured on the Redis tier too (--remote) */
} fmt_case;

static const fmt_case FORMATS[] = {
    {"fp16", KVP_FORMAT_FP16, KVP_FORMAT_FP16, 1},         {"bf16", KVP_FORMAT_BF16, KVP_FORMAT_BF16, 0},
    {"fp8", KVP_FORMAT_FP8_E4M3, KVP_FORMAT_FP8_E4M3, 0}, {"int8", KVP_FORMAT_INT8, KVP_FORMAT_INT8, 1},
    {"k8v4", KVP_FORMAT_INT8, KVP_FORMAT_INT4, 0},         {"int4", KVP_FORMAT_INT4, KVP_FORMAT_INT4, 1},
};
#define NFORMATS ((int)(sizeof FORMATS / sizeof FORMATS[0]))

typedef struct {
    int32_t layers, kv_heads, head_dim, page, tokens, reps;
    const char *dir;
    const char *remote; /* --remote: a redis:// URI, "auto", or NULL */
    int32_t remote_batch, remote_mib, remote_timeout_ms;
} opts;

/* The Redis tier, one way of calling it: `per_call` pages per call. */
typedef struct {
    int measured;
    int32_t per_call;
    double put_gbps, get_gbps, put_pps, get_pps;
    double put_rtt, get_rtt;   /* round trips per call (kvp_redis_tier_info) */
    uint64_t misses, wrong;    /* gets that found nothing, or other bytes */
    double rb_set_rps, rb_get_rps; /* redis-benchmark; -1: not run */
} remote_mode;

typedef struct {
    int measured;
    uint64_t blob_bytes;
    int32_t pages; /* pages put and got per measurement */
    remote_mode mode[2]; /* [0]: --remote-batch pages per call (pipelined); [1]: one */
} remote_result;

typedef struct {
    double bytes_per_token, export_gbps, import_gbps, import_auth_gbps, validate_gbps;
    double put_gbps, get_gbps;
    uint64_t seq_bytes;
    remote_result remote;
} result;

/* What --remote measures with. */
typedef struct {
    kvp_blob_tier_t *tier;
    int auto_server;       /* started by the bench */
    int cluster;           /* the tier found a Cluster */
    char uri_shown[512];   /* the URI(s) without credentials */
    bench_redis_addr addr; /* the first URI: redis-benchmark's */
    int have_addr;
    const char *rb_skip;   /* why redis-benchmark is not run; NULL when it is */
    char benchmark[512];   /* redis-benchmark's path; "" when missing */
    char cli[512];         /* redis-cli's; "" when missing */
    char prefix[64];
    uint64_t nonce;
    int misbehaved;        /* a call failed, a get missed or returned other bytes */
} remote_ctx;

static void usage(FILE *f) {
    fprintf(f, "usage: kvpage-bench tiers [--tokens N (2048)] [--layers N (32)] [--kv-heads N (8)]\n"
               "                          [--head-dim N (128)] [--page N (16)] [--reps N (5)]\n"
               "                          [--dir PATH (a fresh directory under /tmp)] [--quick]\n"
               "                          [--remote URI|auto] [--remote-batch N (32)]\n"
               "                          [--remote-mib N (256)] [--remote-timeout MS (10000)]\n"
               "  The default shape is Llama-3.1-8B's (32 layers, 8 kv heads, head_dim 128).\n"
               "  --quick: 256 tokens, 4 layers, 2 reps, --remote-mib 128.\n"
               "  --remote URI: also measure the Redis/Valkey tier (kvp_redis_tier_create) on\n"
               "    redis://[user:password@]host[:port][/db] (several, comma separated: a sharded\n"
               "    set or a Cluster's nodes): put and get GB/s and pages/s of fp16, int8 and int4\n"
               "    pool-page blobs, --remote-batch pages per call (one pipelined exchange) and one\n"
               "    page per call, against redis-benchmark (-t set,get -d <blob bytes> -c 1, -P\n"
               "    the same batch; on the first URI, not on a Cluster), run after each of ours:\n"
               "    medians of --reps.\n"
               "    Keys go under a prefix of the run's own and are removed; redis-benchmark's\n"
               "    one key, key:__rand_int__, is removed with redis-cli. Needs a libkvpage\n"
               "    built with hiredis (the tier) and redis-benchmark on PATH (the comparison).\n"
               "    Exit status 1 when a tier call fails or a get misses or differs.\n"
               "  --remote auto: the same on a redis-server (or valkey-server) from PATH that the\n"
               "    bench starts on a free 127.0.0.1 port (--save \"\" --appendonly no) and stops.\n"
               "  --remote-batch N: pages per pipelined call (1..1024).\n"
               "  --remote-mib N: MiB put (and got) per measurement, at least 64 pages; also\n"
               "    redis-benchmark's -n (it times whole milliseconds: keep runs >= 100 ms).\n"
               "  --remote-timeout MS: the tier's budget of one call (timeout_ms); keys not\n"
               "    answered in time are misses, which the bench reports as failures.\n");
}

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static const uint8_t FINGERPRINT[32] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16,
                                        17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32};
static const uint8_t KEY[32] = {'b', 'e', 'n', 'c', 'h', '-', 'k', 'e', 'y'};

static kvp_cache_t *make_cache(const opts *o, const fmt_case *f, int prefix_cache, int auth) {
    kvp_cache_params_t cp;
    kvp_cache_params_init(&cp);
    cp.layers = o->layers;
    cp.kv_heads = o->kv_heads;
    cp.head_dim = o->head_dim;
    cp.page_size = o->page;
    cp.k_format = f->k;
    cp.v_format = f->v;
    cp.max_seqs = 2;
    cp.prefix_cache = prefix_cache;
    cp.num_pages = o->tokens / o->page + 2;
    char err[KVP_ERR_SIZE];
    kvp_cache_t *c = NULL;
    if (kvp_cache_create(&cp, &c, err, sizeof err) != KVP_OK) {
        fprintf(stderr, TOOL ": %s\n", err);
        return NULL;
    }
    kvp_cache_parts_t parts = {.struct_size = sizeof parts};
    kvp_cache_parts(c, &parts);
    if (f->k == KVP_FORMAT_FP8_E4M3)
        for (int32_t l = 0; l < o->layers; l++)
            for (int32_t h = 0; h < o->kv_heads; h++)
                for (int32_t side = 0; side < 2; side++)
                    kvp_store_set_fp8_scale(parts.store, l, h, side, 0.02f);
    kvp_blob_params_t bp;
    kvp_blob_params_init(&bp);
    memcpy(bp.fingerprint, FINGERPRINT, 32);
    if (auth) {
        bp.auth_key = KEY;
        bp.auth_key_bytes = 32;
    }
    if (kvp_cache_set_blob(c, &bp) != KVP_OK) {
        fprintf(stderr, TOOL ": %s\n", kvp_cache_last_error(c));
        kvp_cache_destroy(c);
        return NULL;
    }
    return c;
}

/* One sequence of o->tokens random K/V, written in one prefill step. */
static int prefill(const opts *o, kvp_cache_t *c, int32_t *tokens, int32_t *seq) {
    size_t row = (size_t)o->kv_heads * (size_t)o->head_dim, n = (size_t)o->tokens * row;
    float *k = malloc(n * sizeof *k), *v = malloc(n * sizeof *v);
    int rc = k && v ? KVP_OK : KVP_ENOMEM;
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (int32_t i = 0; i < o->tokens; i++) tokens[i] = (int32_t)(rng_next(&s) % 49152);
    if (rc == KVP_OK) rc = kvp_cache_seq_create(c, 0, 0, seq);
    int32_t num_new = o->tokens;
    if (rc == KVP_OK) rc = kvp_cache_begin_step(c, seq, 1, &num_new, tokens);
    for (int32_t l = 0; l < o->layers && rc == KVP_OK; l++) {
        for (size_t i = 0; i < n; i++) {
            k[i] = (float)((int64_t)(rng_next(&s) % 2001) - 1000) * 0.002f;
            v[i] = (float)((int64_t)(rng_next(&s) % 2001) - 1000) * 0.002f;
        }
        rc = kvp_cache_write(c, l, KVP_FORMAT_FP32, k, v, 0, 0);
    }
    if (rc != KVP_OK) fprintf(stderr, TOOL ": prefill: %s\n", kvp_cache_last_error(c));
    free(k);
    free(v);
    return rc;
}

/* Median GB/s of `reps` imports of the exported bytes into `dst`. */
static double time_import(const opts *o, kvp_cache_t *dst, const int32_t *tokens,
                          const uint8_t *buf, uint64_t bytes) {
    double t[64];
    int n = 0;
    for (int r = 0; r < o->reps; r++) {
        int32_t seq = -1;
        if (kvp_cache_seq_create(dst, 0, 0, &seq) != KVP_OK) return -1;
        double t0 = bench_now();
        int rc = kvp_cache_seq_import(dst, seq, tokens, o->tokens, buf, bytes, NULL);
        double dt = bench_now() - t0;
        kvp_cache_seq_release(dst, seq);
        if (rc != KVP_OK) {
            fprintf(stderr, TOOL ": import: %s\n", kvp_cache_last_error(dst));
            return -1;
        }
        t[n++] = (double)bytes / dt / 1e9;
    }
    return bench_median(t, n);
}

/* Put every full page's blob into a file tier, then get them all back. */
static int time_file_tier(const uint8_t *buf, int32_t blobs, uint64_t blob_bytes,
                          const char *dir, result *r) {
    kvp_file_tier_params_t fp;
    kvp_file_tier_params_init(&fp);
    fp.path = dir;
    kvp_blob_tier_t *tier = NULL;
    char err[KVP_ERR_SIZE];
    if (kvp_file_tier_create(&fp, &tier, err, sizeof err) != KVP_OK) {
        fprintf(stderr, TOOL ": file tier: %s\n", err);
        return -1;
    }
    enum { BATCH = 32 };
    kvp_hash_t keys[BATCH];
    const void *ptrs[BATCH];
    void *out[BATCH];
    uint64_t sizes[BATCH], caps[BATCH];
    uint8_t *back = malloc(BATCH * blob_bytes);
    double put_s = 0, get_s = 0;
    int rc = back ? 0 : -1;
    for (int32_t b0 = 0; b0 < blobs && rc == 0; b0 += BATCH) {
        int32_t m = blobs - b0 < BATCH ? blobs - b0 : BATCH;
        for (int32_t i = 0; i < m; i++) {
            ptrs[i] = buf + (uint64_t)(b0 + i) * blob_bytes;
            sizes[i] = blob_bytes;
            memcpy(keys[i].bytes, (const uint8_t *)ptrs[i] + 88, 32); /* the chain hash field */
        }
        double t0 = bench_now();
        rc = kvp_blob_tier_put(tier, m, keys, ptrs, sizes) == KVP_OK ? 0 : -1;
        put_s += bench_now() - t0;
        for (int32_t i = 0; i < m; i++) {
            out[i] = back + (uint64_t)i * blob_bytes;
            caps[i] = blob_bytes;
        }
        t0 = bench_now();
        if (rc == 0) rc = kvp_blob_tier_get(tier, m, keys, out, caps, sizes) == KVP_OK ? 0 : -1;
        get_s += bench_now() - t0;
        for (int32_t i = 0; i < m && rc == 0; i++)
            if (sizes[i] != blob_bytes || memcmp(out[i], ptrs[i], blob_bytes) != 0) rc = -1;
        if (rc == 0) kvp_blob_tier_remove(tier, m, keys);
    }
    if (rc != 0) fprintf(stderr, TOOL ": file tier: %s\n", kvp_blob_tier_last_error(tier));
    r->put_gbps = (double)blobs * (double)blob_bytes / put_s / 1e9;
    r->get_gbps = (double)blobs * (double)blob_bytes / get_s / 1e9;
    free(back);
    kvp_blob_tier_destroy(tier);
    return rc;
}

/* The URIs with any user:password@ left out. */
static void redact_uris(const char *list, char *out, size_t size) {
    size_t o = 0;
    while (*list != '\0' && o + 1 < size) {
        size_t n = strcspn(list, ", ");
        const char *start = list, *end = list + n;
        const char *scheme = strstr(start, "://");
        const char *host = scheme != NULL && scheme < end ? scheme + 3 : start;
        const char *at = NULL;
        for (const char *p = host; p < end && *p != '/'; p++)
            if (*p == '@') at = p;
        for (const char *p = start; p < end && o + 1 < size; p++) {
            if (at != NULL && p == host) p = at + 1;
            out[o++] = *p;
        }
        list = end;
        while ((*list == ',' || *list == ' ') && o + 1 < size) out[o++] = *list++;
    }
    out[o] = '\0';
}

/* Key of page i of rep `rep`: the run's nonce, rep and i, then the blob's
 * own chain hash bytes; unique in the run. */
static void remote_key(const remote_ctx *rc, const uint8_t *blob, uint32_t rep, uint32_t i,
                       kvp_hash_t *k) {
    memcpy(k->bytes, blob + 88, 32); /* the chain hash field */
    uint64_t b = ((uint64_t)rep << 32) | i;
    memcpy(k->bytes, &rc->nonce, 8);
    memcpy(k->bytes + 8, &b, 8);
}

static void remote_fail(remote_ctx *rc, const char *fmt_name, int32_t per_call, const char *what,
                        int status) {
    kvp_redis_tier_info_t in = {.struct_size = sizeof in};
    kvp_redis_tier_info(rc->tier, &in);
    fprintf(stderr,
            TOOL ": Redis tier, %s, %d page(s) per call: %s (status %s); last_error: \"%s\"; "
            "round_trips %llu, commands %llu, connects %llu, failures %llu, timeouts %llu, "
            "skipped %llu, server_errors %llu, nodes_down %d\n",
            fmt_name, (int)per_call, what, status ? kvp_strerror(status) : "OK",
            kvp_blob_tier_last_error(rc->tier), (unsigned long long)in.round_trips,
            (unsigned long long)in.commands, (unsigned long long)in.connects,
            (unsigned long long)in.failures, (unsigned long long)in.timeouts,
            (unsigned long long)in.skipped, (unsigned long long)in.server_errors,
            (int)in.nodes_down);
    rc->misbehaved = 1;
}

static uint64_t round_trips(kvp_blob_tier_t *tier) {
    kvp_redis_tier_info_t in = {.struct_size = sizeof in};
    return kvp_redis_tier_info(tier, &in) == KVP_OK ? in.round_trips : 0;
}

/* Pages of the sequence (`blobs` of them, cycled) put and got back through
 * the Redis tier, `per_call` per call, `pages` in all, `reps` times: median
 * GB/s. Each batch is checked and removed (not timed) before the next.
 * After each pass, redis-benchmark with as many values of the same size and
 * the same pipeline depth: median requests/s. */
static int time_remote_mode(const opts *o, remote_ctx *ctx, const fmt_case *f, const uint8_t *buf,
                            int32_t blobs, uint64_t blob_bytes, int32_t pages, int32_t per_call,
                            remote_mode *m) {
    memset(m, 0, sizeof *m);
    m->per_call = per_call;
    m->rb_set_rps = m->rb_get_rps = -1;
    kvp_hash_t *keys = malloc((size_t)per_call * sizeof *keys);
    const void **ptrs = malloc((size_t)per_call * sizeof *ptrs);
    void **out = malloc((size_t)per_call * sizeof *out);
    uint64_t *sizes = malloc((size_t)per_call * sizeof *sizes);
    uint64_t *caps = malloc((size_t)per_call * sizeof *caps);
    uint8_t *back = malloc((size_t)per_call * blob_bytes);
    int rc = keys && ptrs && out && sizes && caps && back ? 0 : -1;
    if (rc != 0) fprintf(stderr, TOOL ": out of memory for %d blobs of %llu bytes\n", (int)per_call,
                         (unsigned long long)blob_bytes);
    double put_t[64] = {0}, get_t[64] = {0}, rb_set[64] = {0}, rb_get[64] = {0};
    int rb_n = 0;
    uint64_t put_calls = 0, get_calls = 0, put_rt = 0, get_rt = 0;
    for (int r = 0; r < o->reps && rc == 0; r++) {
        double put_s = 0, get_s = 0;
        for (int32_t p0 = 0; p0 < pages && rc == 0; p0 += per_call) {
            int32_t n = pages - p0 < per_call ? pages - p0 : per_call;
            for (int32_t i = 0; i < n; i++) {
                ptrs[i] = buf + (uint64_t)((p0 + i) % blobs) * blob_bytes;
                sizes[i] = blob_bytes;
                remote_key(ctx, ptrs[i], (uint32_t)r, (uint32_t)(p0 + i), &keys[i]);
                out[i] = back + (uint64_t)i * blob_bytes;
                caps[i] = blob_bytes;
            }
            uint64_t rt0 = round_trips(ctx->tier);
            double t0 = bench_now();
            int st = kvp_blob_tier_put(ctx->tier, n, keys, ptrs, sizes);
            put_s += bench_now() - t0;
            uint64_t rt1 = round_trips(ctx->tier);
            put_rt += rt1 - rt0;
            put_calls++;
            if (st != KVP_OK) {
                char what[96];
                snprintf(what, sizeof what, "kvp_blob_tier_put of %d blobs failed", (int)n);
                remote_fail(ctx, f->name, per_call, what, st);
                rc = -1;
                break;
            }
            memset(sizes, 0, (size_t)n * sizeof *sizes);
            t0 = bench_now();
            st = kvp_blob_tier_get(ctx->tier, n, keys, out, caps, sizes);
            get_s += bench_now() - t0;
            get_rt += round_trips(ctx->tier) - rt1;
            get_calls++;
            if (st != KVP_OK) {
                char what[96];
                snprintf(what, sizeof what, "kvp_blob_tier_get of %d keys failed", (int)n);
                remote_fail(ctx, f->name, per_call, what, st);
                rc = -1;
                break;
            }
            uint64_t missed = 0, other = 0;
            for (int32_t i = 0; i < n; i++) {
                if (sizes[i] == 0) missed++;
                else if (sizes[i] != blob_bytes || memcmp(out[i], ptrs[i], blob_bytes) != 0) other++;
            }
            if ((missed || other) && m->misses + m->wrong == 0) {
                char what[160];
                snprintf(what, sizeof what,
                         "kvp_blob_tier_get of %d keys just put: %llu missed, %llu other bytes",
                         (int)n, (unsigned long long)missed, (unsigned long long)other);
                remote_fail(ctx, f->name, per_call, what, KVP_OK);
            }
            m->misses += missed;
            m->wrong += other;
            st = kvp_blob_tier_remove(ctx->tier, n, keys);
            if (st != KVP_OK) {
                remote_fail(ctx, f->name, per_call, "kvp_blob_tier_remove failed", st);
                rc = -1;
            }
        }
        put_t[r] = (double)pages * (double)blob_bytes / put_s / 1e9;
        get_t[r] = (double)pages * (double)blob_bytes / get_s / 1e9;
        /* redis-benchmark right after each of our passes, so that both see
         * the same machine (load that comes and goes hits both alike) */
        if (rc == 0 && rb_n >= 0 && ctx->rb_skip == NULL) {
            char err[512];
            if (bench_redis_benchmark(ctx->benchmark, &ctx->addr, ctx->cluster, blob_bytes, pages,
                                      per_call, 300.0, &rb_set[rb_n], &rb_get[rb_n], err,
                                      sizeof err) == 0) {
                rb_n++;
            } else {
                fprintf(stderr, TOOL ": redis-benchmark (-d %llu -P %d): %s\n",
                        (unsigned long long)blob_bytes, (int)per_call, err);
                rb_n = -1; /* not again */
            }
        }
    }
    if (rb_n > 0) {
        m->rb_set_rps = bench_median(rb_set, rb_n);
        m->rb_get_rps = bench_median(rb_get, rb_n);
    }
    if (rc == 0) {
        m->measured = 1;
        m->put_gbps = bench_median(put_t, o->reps);
        m->get_gbps = bench_median(get_t, o->reps);
        m->put_pps = m->put_gbps * 1e9 / (double)blob_bytes;
        m->get_pps = m->get_gbps * 1e9 / (double)blob_bytes;
        m->put_rtt = put_calls ? (double)put_rt / (double)put_calls : 0;
        m->get_rtt = get_calls ? (double)get_rt / (double)get_calls : 0;
    }
    free(keys);
    free(ptrs);
    free(out);
    free(sizes);
    free(caps);
    free(back);
    return rc;
}

static void time_remote(const opts *o, remote_ctx *rc, const fmt_case *f, const uint8_t *buf,
                        int32_t blobs, uint64_t blob_bytes, remote_result *rr) {
    memset(rr, 0, sizeof *rr);
    rr->blob_bytes = blob_bytes;
    uint64_t want = ((uint64_t)o->remote_mib << 20) / blob_bytes + 1;
    if (want < 64) want = 64;
    if (want > (1u << 20)) want = 1u << 20;
    int32_t batch = o->remote_batch;
    rr->pages = (int32_t)((want + (uint64_t)batch - 1) / (uint64_t)batch * (uint64_t)batch);
    int ok = time_remote_mode(o, rc, f, buf, blobs, blob_bytes, rr->pages, batch, &rr->mode[0]) == 0;
    if (batch > 1)
        ok &= time_remote_mode(o, rc, f, buf, blobs, blob_bytes, rr->pages, 1, &rr->mode[1]) == 0;
    rr->measured = ok;
}

static int run_format(const opts *o, const fmt_case *f, const char *dir, remote_ctx *remote,
                      result *r) {
    memset(r, 0, sizeof *r);
    int32_t *tokens = malloc((size_t)o->tokens * sizeof *tokens);
    kvp_cache_t *src = make_cache(o, f, 1, 0), *dst = make_cache(o, f, 0, 0);
    kvp_cache_t *src_a = make_cache(o, f, 1, 1), *dst_a = make_cache(o, f, 0, 1);
    int32_t seq = -1, seq_a = -1, blobs = 0;
    uint64_t bytes = 0;
    uint8_t *buf = NULL, *buf_a = NULL;
    int rc = tokens && src && dst && src_a && dst_a ? 0 : -1;
    if (rc == 0) rc = prefill(o, src, tokens, &seq) == KVP_OK ? 0 : -1;
    if (rc == 0) rc = prefill(o, src_a, tokens, &seq_a) == KVP_OK ? 0 : -1;
    if (rc == 0) rc = kvp_cache_seq_export_size(src, seq, &blobs, &bytes) == KVP_OK ? 0 : -1;
    if (rc == 0) {
        buf = aligned_alloc(64, (bytes + 63) / 64 * 64);
        buf_a = aligned_alloc(64, (bytes + 63) / 64 * 64);
        rc = buf && buf_a ? 0 : -1;
    }
    double t[64];
    for (int i = 0; i < o->reps && rc == 0; i++) {
        double t0 = bench_now();
        rc = kvp_cache_seq_export(src, seq, tokens, o->tokens, buf, bytes) == KVP_OK ? 0 : -1;
        t[i] = (double)bytes / (bench_now() - t0) / 1e9;
    }
    if (rc == 0) {
        r->export_gbps = bench_median(t, o->reps);
        r->seq_bytes = bytes;
        r->bytes_per_token = (double)bytes / o->tokens;
        rc = kvp_cache_seq_export(src_a, seq_a, tokens, o->tokens, buf_a, bytes) == KVP_OK ? 0 : -1;
    }
    if (rc == 0) r->import_gbps = time_import(o, dst, tokens, buf, bytes);
    if (rc == 0) r->import_auth_gbps = time_import(o, dst_a, tokens, buf_a, bytes);
    /* validation alone: every blob through kvp_blob_validate */
    kvp_blob_codec_t *codec = NULL;
    uint64_t blob_bytes = 0;
    if (rc == 0 && kvp_cache_blob_codec(dst, &codec) == KVP_OK &&
        kvp_blob_size(codec, 0, &blob_bytes) == KVP_OK) {
        for (int i = 0; i < o->reps && rc == 0; i++) {
            double t0 = bench_now();
            for (int32_t b = 0; b < o->tokens / o->page && rc == 0; b++)
                rc = kvp_blob_validate(codec, buf + (uint64_t)b * blob_bytes, blob_bytes, NULL, 0,
                                       NULL, NULL) == KVP_OK ? 0 : -1;
            t[i] = (double)(o->tokens / o->page) * (double)blob_bytes / (bench_now() - t0) / 1e9;
        }
        if (rc == 0) r->validate_gbps = bench_median(t, o->reps);
    }
    if (rc == 0 && r->import_gbps > 0 && r->import_auth_gbps > 0)
        rc = time_file_tier(buf, o->tokens / o->page, blob_bytes, dir, r);
    else if (rc == 0) rc = -1;
    if (rc == 0 && remote != NULL && f->remote)
        time_remote(o, remote, f, buf, o->tokens / o->page, blob_bytes, &r->remote);
    free(buf);
    free(buf_a);
    free(tokens);
    kvp_cache_destroy(src);
    kvp_cache_destroy(dst);
    kvp_cache_destroy(src_a);
    kvp_cache_destroy(dst_a);
    return rc;
}

static int parse(int argc, char **argv, opts *o) {
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        bool ok = true;
        if (!strcmp(a, "--tokens")) ok = cli_opt_int(TOOL, argc, argv, &i, 16, 1 << 20, &o->tokens, stderr);
        else if (!strcmp(a, "--layers")) ok = cli_opt_int(TOOL, argc, argv, &i, 1, 1024, &o->layers, stderr);
        else if (!strcmp(a, "--kv-heads")) ok = cli_opt_int(TOOL, argc, argv, &i, 1, 1024, &o->kv_heads, stderr);
        else if (!strcmp(a, "--head-dim")) ok = cli_opt_int(TOOL, argc, argv, &i, 32, 1024, &o->head_dim, stderr);
        else if (!strcmp(a, "--page")) ok = cli_opt_int(TOOL, argc, argv, &i, 1, 4096, &o->page, stderr);
        else if (!strcmp(a, "--reps")) ok = cli_opt_int(TOOL, argc, argv, &i, 1, 64, &o->reps, stderr);
        else if (!strcmp(a, "--dir")) ok = (o->dir = cli_opt_value(TOOL, argc, argv, &i, stderr)) != NULL;
        else if (!strcmp(a, "--remote")) {
            ok = (o->remote = cli_opt_value(TOOL, argc, argv, &i, stderr)) != NULL;
            if (ok && (o->remote[0] == '\0' ||
                       (strcmp(o->remote, "auto") != 0 && strstr(o->remote, "://") == NULL))) {
                cli_error(stderr, TOOL, "--remote: expected a redis:// URI or 'auto', got '%s'",
                          o->remote);
                return CLI_USAGE;
            }
        } else if (!strcmp(a, "--remote-batch")) ok = cli_opt_int(TOOL, argc, argv, &i, 1, 1024, &o->remote_batch, stderr);
        else if (!strcmp(a, "--remote-mib")) ok = cli_opt_int(TOOL, argc, argv, &i, 1, 65536, &o->remote_mib, stderr);
        else if (!strcmp(a, "--remote-timeout")) ok = cli_opt_int(TOOL, argc, argv, &i, 1, 600000, &o->remote_timeout_ms, stderr);
        else if (!strcmp(a, "--quick")) {
            o->tokens = 256;
            o->layers = 4;
            o->reps = 2;
            o->remote_mib = 128;
        } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else {
            return cli_reject_option(TOOL, a, usage);
        }
        if (!ok) return CLI_USAGE;
    }
    if (o->tokens % o->page != 0) {
        cli_error(stderr, TOOL, "--tokens (%d) must be a multiple of --page (%d)", (int)o->tokens,
                  (int)o->page);
        return CLI_USAGE;
    }
    return -1;
}

static void json_rps(cli_json *j, const char *key, double v) {
    if (v > 0) cli_json_num(j, key, v);
    else cli_json_null(j, key);
}

static void print_remote_json(cli_json *j, const opts *o, const remote_ctx *rc, const result *r) {
    cli_json_object(j, "remote");
    cli_json_str(j, "server", rc->auto_server ? "auto" : "given");
    cli_json_str(j, "uri", rc->uri_shown);
    cli_json_i64(j, "cluster", rc->cluster);
    cli_json_i64(j, "batch", o->remote_batch);
    cli_json_i64(j, "timeout_ms", o->remote_timeout_ms);
    cli_json_bool(j, "redis_benchmark", rc->rb_skip == NULL);
    if (rc->rb_skip != NULL) cli_json_str(j, "redis_benchmark_skipped", rc->rb_skip);
    cli_json_bool(j, "misbehaved", rc->misbehaved != 0);
    cli_json_object(j, "formats");
    for (int f = 0; f < NFORMATS; f++) {
        const remote_result *rr = &r[f].remote;
        if (!FORMATS[f].remote || rr->blob_bytes == 0) continue;
        cli_json_object(j, FORMATS[f].name);
        cli_json_u64(j, "blob_bytes", rr->blob_bytes);
        cli_json_i64(j, "pages", rr->pages);
        for (int k = 0; k < 2; k++) {
            const remote_mode *m = &rr->mode[k];
            if (m->per_call == 0) continue;
            cli_json_object(j, k == 0 ? "pipelined" : "one_per_call");
            cli_json_i64(j, "pages_per_call", m->per_call);
            cli_json_bool(j, "measured", m->measured != 0);
            cli_json_num(j, "put_gbps", m->put_gbps);
            cli_json_num(j, "put_pages_per_s", m->put_pps);
            cli_json_num(j, "get_gbps", m->get_gbps);
            cli_json_num(j, "get_pages_per_s", m->get_pps);
            cli_json_num(j, "put_round_trips_per_call", m->put_rtt);
            cli_json_num(j, "get_round_trips_per_call", m->get_rtt);
            cli_json_u64(j, "misses", m->misses);
            cli_json_u64(j, "wrong_bytes", m->wrong);
            json_rps(j, "redis_benchmark_set_rps", m->rb_set_rps);
            json_rps(j, "redis_benchmark_get_rps", m->rb_get_rps);
            json_rps(j, "set_ours_over_redis_benchmark",
                     m->rb_set_rps > 0 && m->measured ? m->put_pps / m->rb_set_rps : -1);
            json_rps(j, "get_ours_over_redis_benchmark",
                     m->rb_get_rps > 0 && m->measured ? m->get_pps / m->rb_get_rps : -1);
            cli_json_close(j);
        }
        cli_json_close(j);
    }
    cli_json_close(j);
    kvp_redis_tier_info_t in = {.struct_size = sizeof in};
    if (kvp_redis_tier_info(rc->tier, &in) == KVP_OK) {
        cli_json_object(j, "tier");
        cli_json_i64(j, "nodes", in.nodes);
        cli_json_i64(j, "nodes_down", in.nodes_down);
        cli_json_u64(j, "round_trips", in.round_trips);
        cli_json_u64(j, "commands", in.commands);
        cli_json_u64(j, "connects", in.connects);
        cli_json_u64(j, "failures", in.failures);
        cli_json_u64(j, "timeouts", in.timeouts);
        cli_json_u64(j, "skipped", in.skipped);
        cli_json_u64(j, "server_errors", in.server_errors);
        cli_json_close(j);
    }
    cli_json_close(j);
}

static void print_json(const opts *o, const bench_roofs *roof, const result *r,
                       const remote_ctx *rc) {
    cli_json j;
    cli_json_begin(&j, stdout);
    cli_json_str(&j, "bench", "tiers");
    cli_json_i64(&j, "tokens", o->tokens);
    cli_json_i64(&j, "page", o->page);
    cli_json_num(&j, "read_gbps_1thread", roof->read_gbps);
    cli_json_object(&j, "formats");
    for (int f = 0; f < NFORMATS; f++) {
        cli_json_object(&j, FORMATS[f].name);
        cli_json_num(&j, "bytes_per_token", r[f].bytes_per_token);
        cli_json_num(&j, "export_gbps", r[f].export_gbps);
        cli_json_num(&j, "import_gbps", r[f].import_gbps);
        cli_json_num(&j, "import_over_read", r[f].import_gbps / roof->read_gbps);
        cli_json_num(&j, "import_hmac_gbps", r[f].import_auth_gbps);
        cli_json_num(&j, "validate_gbps", r[f].validate_gbps);
        cli_json_num(&j, "file_put_gbps", r[f].put_gbps);
        cli_json_num(&j, "file_get_gbps", r[f].get_gbps);
        cli_json_close(&j);
    }
    cli_json_close(&j);
    cli_json_num(&j, "int4_vs_fp16_bytes", r[0].bytes_per_token / r[NFORMATS - 1].bytes_per_token);
    if (rc != NULL) print_remote_json(&j, o, rc, r);
    cli_json_end(&j);
}

static void print_remote_table(const opts *o, const remote_ctx *rc, const result *r) {
    printf("\nRedis tier on %s%s: %d page(s) per call (pipelined) and 1; timeout %d ms;\n"
           "redis-benchmark -c 1 on values of the blob's size, -P the same (\"rb\": its requests/s;\n"
           "ours/rb: our pages/s over them)%s%s\n",
           rc->uri_shown, rc->auto_server ? " (started by the bench)" : "", (int)o->remote_batch,
           (int)o->remote_timeout_ms,
           rc->rb_skip ? "; not run: "
                       : strpbrk(rc->uri_shown, ", ") ? "; on the first server only" : "",
           rc->rb_skip ? rc->rb_skip : "");
    printf("%-6s %10s %6s %5s | %10s %9s %9s %7s | %10s %9s %9s %7s\n", "format", "blob", "pages",
           "/call", "put", "pages/s", "SET rb/s", "ours/rb", "get", "pages/s", "GET rb/s", "ours/rb");
    for (int f = 0; f < NFORMATS; f++) {
        const remote_result *rr = &r[f].remote;
        if (!FORMATS[f].remote || rr->blob_bytes == 0) continue;
        for (int k = 0; k < 2; k++) {
            const remote_mode *m = &rr->mode[k];
            if (m->per_call == 0) continue;
            char size[32], rs[32] = "-", rg[32] = "-", qs[32] = "-", qg[32] = "-";
            cli_bytes(size, sizeof size, rr->blob_bytes);
            if (m->rb_set_rps > 0) snprintf(rs, sizeof rs, "%.0f", m->rb_set_rps);
            if (m->rb_get_rps > 0) snprintf(rg, sizeof rg, "%.0f", m->rb_get_rps);
            if (m->rb_set_rps > 0 && m->measured) snprintf(qs, sizeof qs, "%.2f", m->put_pps / m->rb_set_rps);
            if (m->rb_get_rps > 0 && m->measured) snprintf(qg, sizeof qg, "%.2f", m->get_pps / m->rb_get_rps);
            if (!m->measured) {
                printf("%-6s %10s %6d %5d | failed (see above)\n", FORMATS[f].name, size,
                       (int)rr->pages, (int)m->per_call);
                continue;
            }
            printf("%-6s %10s %6d %5d | %5.2f GB/s %9.0f %9s %7s | %5.2f GB/s %9.0f %9s %7s\n",
                   FORMATS[f].name, size, (int)rr->pages, (int)m->per_call, m->put_gbps, m->put_pps,
                   rs, qs, m->get_gbps, m->get_pps, rg, qg);
        }
    }
}

/* --remote: start the server (auto), find redis-benchmark, make the tier. */
static int remote_open(const opts *o, remote_ctx *rc, bench_redis_server *server) {
    if (!kvp_build_has(KVP_FEATURE_REDIS)) {
        fprintf(stderr, TOOL ": --remote: libkvpage was built without the Redis tier (needs "
                        "hiredis: install libhiredis-dev and rebuild)\n");
        return -1;
    }
    char path[512], err[KVP_ERR_SIZE > 1024 ? KVP_ERR_SIZE : 1024];
    const char *uri = o->remote;
    if (!strcmp(o->remote, "auto")) {
        static const char *const servers[] = {"redis-server", "valkey-server"};
        if (bench_find_program(servers, 2, path, sizeof path) < 0) {
            fprintf(stderr, TOOL ": --remote auto needs redis-server (or valkey-server) on PATH "
                            "and found neither (Debian: apt-get install redis-server); give "
                            "--remote redis://host:port for a running server instead\n");
            return -1;
        }
        if (bench_redis_start(path, server, err, sizeof err) != 0) {
            fprintf(stderr, TOOL ": --remote auto: could not start %s: %s\n", path, err);
            return -1;
        }
        uri = server->uri;
        rc->auto_server = 1;
    }
    static const char *const benchmarks[] = {"redis-benchmark", "valkey-benchmark"};
    static const char *const clis[] = {"redis-cli", "valkey-cli"};
    bench_find_program(benchmarks, 2, rc->benchmark, sizeof rc->benchmark);
    bench_find_program(clis, 2, rc->cli, sizeof rc->cli);
    redact_uris(uri, rc->uri_shown, sizeof rc->uri_shown);
    rc->have_addr = bench_redis_parse_uri(uri, &rc->addr) == 0;
    rc->nonce = (uint64_t)getpid() << 32 ^ (uint64_t)time(NULL);
    snprintf(rc->prefix, sizeof rc->prefix, "kvpage-bench:%ld:", (long)getpid());
    kvp_redis_tier_params_t p;
    kvp_redis_tier_params_init(&p);
    p.uri = uri;
    p.prefix = rc->prefix;
    p.timeout_ms = o->remote_timeout_ms;
    p.connect_timeout_ms = 2000;
    int st = kvp_redis_tier_create(&p, &rc->tier, err, sizeof err);
    if (st != KVP_OK) {
        fprintf(stderr, TOOL ": --remote %s: kvp_redis_tier_create: %s: %s\n", rc->uri_shown,
                kvp_strerror(st), err);
        return -1;
    }
    kvp_redis_tier_info_t in = {.struct_size = sizeof in};
    if (kvp_redis_tier_info(rc->tier, &in) == KVP_OK) rc->cluster = in.cluster;
    if (rc->benchmark[0] == '\0')
        rc->rb_skip = "redis-benchmark is not on PATH";
    else if (!rc->have_addr)
        rc->rb_skip = "the first URI is not one redis-benchmark takes";
    else if (rc->cluster) /* its --cluster mode spreads -c over the nodes and adds a start-up
                             time of about 0.25 s to every run: no figure to compare with */
        rc->rb_skip = "a Cluster (redis-benchmark --cluster has no comparable figure)";
    if (rc->rb_skip != NULL) fprintf(stderr, TOOL ": the comparison is left out: %s\n", rc->rb_skip);
    return 0;
}

static void remote_close(remote_ctx *rc, bench_redis_server *server) {
    kvp_blob_tier_destroy(rc->tier);
    rc->tier = NULL;
    if (!rc->auto_server && rc->rb_skip == NULL && rc->cli[0] != '\0')
        bench_redis_del(rc->cli, &rc->addr, 0, "key:__rand_int__"); /* redis-benchmark's one
                                                                       key (no -r) */
    bench_redis_stop(server);
}

int bench_tiers(int argc, char **argv) {
    opts o = {.layers = 32, .kv_heads = 8, .head_dim = 128, .page = 16, .tokens = 2048, .reps = 5,
              .remote_batch = 32, .remote_mib = 256, .remote_timeout_ms = 10000};
    int rc = parse(argc, argv, &o);
    if (rc >= 0) return rc;
    if (!kvp_build_has(KVP_FEATURE_BLOB)) {
        fprintf(stderr, TOOL ": libkvpage was built without page blobs (libcrypto, libxxhash)\n");
        return 1;
    }
    remote_ctx remote;
    bench_redis_server server;
    memset(&remote, 0, sizeof remote);
    memset(&server, 0, sizeof server);
    if (o.remote != NULL && remote_open(&o, &remote, &server) != 0) {
        remote_close(&remote, &server);
        return 1;
    }
    remote_ctx *rem = o.remote != NULL ? &remote : NULL;
    char tmp[] = "/tmp/kvpage-bench-tiers-XXXXXX";
    const char *dir = o.dir;
    if (dir == NULL && (dir = mkdtemp(tmp)) == NULL) {
        perror(TOOL ": mkdtemp");
        if (rem) remote_close(rem, &server);
        return 1;
    }
    bench_roofs roof;
    if (bench_measure_roofs(1, 0, 5, &roof) != 0) {
        fprintf(stderr, TOOL ": could not measure the read roof\n");
        if (o.dir == NULL) rmdir(dir);
        if (rem) remote_close(rem, &server);
        return 1;
    }
    printf("page blobs, %d tokens, %d layers x %d kv heads x head_dim %d, page %d; one thread\n",
           (int)o.tokens, (int)o.layers, (int)o.kv_heads, (int)o.head_dim, (int)o.page);
    printf("streaming read, 1 thread: %.1f GB/s; file tier in %s (fsync on)\n\n", roof.read_gbps, dir);
    printf("%-6s %12s %10s %10s %8s %10s %10s %9s %9s\n", "format", "bytes/token", "export",
           "import", "/read", "+HMAC", "validate", "file put", "file get");
    result r[NFORMATS];
    memset(r, 0, sizeof r);
    rc = 0;
    for (int f = 0; f < NFORMATS && rc == 0; f++) {
        rc = run_format(&o, &FORMATS[f], dir, rem, &r[f]);
        if (rc != 0) break;
        printf("%-6s %12.0f %7.2f GB/s %5.2f GB/s %8.2f %5.2f GB/s %5.2f GB/s %6.2f GB/s %6.2f GB/s\n",
               FORMATS[f].name, r[f].bytes_per_token, r[f].export_gbps, r[f].import_gbps,
               r[f].import_gbps / roof.read_gbps, r[f].import_auth_gbps, r[f].validate_gbps,
               r[f].put_gbps, r[f].get_gbps);
        fflush(stdout);
    }
    if (o.dir == NULL) rmdir(dir);
    if (rc != 0) {
        if (rem) remote_close(rem, &server);
        return 1;
    }
    printf("\nint4 blobs are %.2fx smaller than fp16's (bytes per token, headers and scales "
           "included)\n", r[0].bytes_per_token / r[NFORMATS - 1].bytes_per_token);
    if (rem) print_remote_table(&o, rem, r);
    print_json(&o, &roof, r, rem);
    int failed = rem != NULL && rem->misbehaved;
    if (rem) remote_close(rem, &server);
    return failed ? 1 : 0;
}
