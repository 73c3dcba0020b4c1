/*
 * kvpage-bench tiers: KV leaving the process. Per format: bytes per token on
 * the wire, sequence export and import GB/s (import includes every check a
 * blob gets: lengths, checksum, identity, chain hash, payload invariants;
 * and, with a key, HMAC), against a single-threaded streaming read measured
 * in the same run; file tier put and get GB/s.
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
#include <unistd.h>

#define TOOL "kvpage-bench tiers"

typedef struct {
    const char *name;
    int32_t k, v;
} fmt_case;

static const fmt_case FORMATS[] = {
    {"fp16", KVP_FORMAT_FP16, KVP_FORMAT_FP16},          {"bf16", KVP_FORMAT_BF16, KVP_FORMAT_BF16},
    {"fp8", KVP_FORMAT_FP8_E4M3, KVP_FORMAT_FP8_E4M3},  {"int8", KVP_FORMAT_INT8, KVP_FORMAT_INT8},
    {"k8v4", KVP_FORMAT_INT8, KVP_FORMAT_INT4},          {"int4", KVP_FORMAT_INT4, KVP_FORMAT_INT4},
};
#define NFORMATS ((int)(sizeof FORMATS / sizeof FORMATS[0]))

typedef struct {
    int32_t layers, kv_heads, head_dim, page, tokens, reps;
    const char *dir;
} opts;

typedef struct {
    double bytes_per_token, export_gbps, import_gbps, import_auth_gbps, validate_gbps;
    double put_gbps, get_gbps;
    uint64_t seq_bytes;
} result;

static void usage(FILE *f) {
    fprintf(f, "usage: kvpage-bench tiers [--tokens N (2048)] [--layers N (32)] [--kv-heads N (8)]\n"
               "                          [--head-dim N (128)] [--page N (16)] [--reps N (5)]\n"
               "                          [--dir PATH (a fresh directory under /tmp)] [--quick]\n"
               "  The default shape is Llama-3.1-8B's (32 layers, 8 kv heads, head_dim 128).\n");
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

static int run_format(const opts *o, const fmt_case *f, const char *dir, result *r) {
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
        else if (!strcmp(a, "--quick")) {
            o->tokens = 256;
            o->layers = 4;
            o->reps = 2;
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

static void print_json(const opts *o, const bench_roofs *roof, const result *r) {
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
    cli_json_end(&j);
}

int bench_tiers(int argc, char **argv) {
    opts o = {32, 8, 128, 16, 2048, 5, NULL};
    int rc = parse(argc, argv, &o);
    if (rc >= 0) return rc;
    if (!kvp_build_has(KVP_FEATURE_BLOB)) {
        fprintf(stderr, TOOL ": libkvpage was built without page blobs (libcrypto, libxxhash)\n");
        return 1;
    }
    char tmp[] = "/tmp/kvpage-bench-tiers-XXXXXX";
    const char *dir = o.dir;
    if (dir == NULL && (dir = mkdtemp(tmp)) == NULL) {
        perror(TOOL ": mkdtemp");
        return 1;
    }
    bench_roofs roof;
    if (bench_measure_roofs(1, 0, 5, &roof) != 0) {
        fprintf(stderr, TOOL ": could not measure the read roof\n");
        return 1;
    }
    printf("page blobs, %d tokens, %d layers x %d kv heads x head_dim %d, page %d; one thread\n",
           (int)o.tokens, (int)o.layers, (int)o.kv_heads, (int)o.head_dim, (int)o.page);
    printf("streaming read, 1 thread: %.1f GB/s; file tier in %s (fsync on)\n\n", roof.read_gbps, dir);
    printf("%-6s %12s %10s %10s %8s %10s %10s %9s %9s\n", "format", "bytes/token", "export",
           "import", "/read", "+HMAC", "validate", "file put", "file get");
    result r[NFORMATS];
    rc = 0;
    for (int f = 0; f < NFORMATS && rc == 0; f++) {
        rc = run_format(&o, &FORMATS[f], dir, &r[f]);
        if (rc != 0) break;
        printf("%-6s %12.0f %7.2f GB/s %5.2f GB/s %8.2f %5.2f GB/s %5.2f GB/s %6.2f GB/s %6.2f GB/s\n",
               FORMATS[f].name, r[f].bytes_per_token, r[f].export_gbps, r[f].import_gbps,
               r[f].import_gbps / roof.read_gbps, r[f].import_auth_gbps, r[f].validate_gbps,
               r[f].put_gbps, r[f].get_gbps);
    }
    if (o.dir == NULL) rmdir(dir);
    if (rc != 0) return 1;
    printf("\nint4 blobs are %.2fx smaller than fp16's (bytes per token, headers and scales "
           "included)\n", r[0].bytes_per_token / r[NFORMATS - 1].bytes_per_token);
    print_json(&o, &roof, r);
    return 0;
}
