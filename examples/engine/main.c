/*
 * kvpage-engine: a small llama engine, written as an outside user of
 * libkvpage would write it (built against the installed library with
 * pkg-config), running SmolLM2-135M-Instruct from its GGUF file.
 *
 *   kvpage-engine dump     MODEL                    metadata keys, tensor types and shapes
 *   kvpage-engine tokenize MODEL [--file F | TEXT]  token ids; checks the round trip
 *   kvpage-engine demo     MODEL [options]          several prompts, one decode loop
 *   kvpage-engine eval     MODEL [options]          perplexity table + JSON
 *   kvpage-engine bench    MODEL [options]          prefill / decode tokens per second
 *   kvpage-engine run      MODEL --prompt TEXT      one prompt, greedy, in this process
 *   kvpage-engine prefill  MODEL --prompt TEXT --out FILE   prefill + first token, KV exported to FILE
 *   kvpage-engine decode   MODEL --in FILE          import FILE's KV, continue decoding
 *
 * --kv-store SPEC (demo, run, prefill, decode) puts a KV store behind the
 * paged cache (dir:PATH, or redis://HOST:PORT for a shared Redis/Valkey):
 * prompts are looked up in the pool, then in the store, and the cache's
 * full pages are written to it, so another process over the same store
 * prefills only what is new.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <kvpage.h>
#include <kvpage_blob.h> /* kvp_tier_policy */
#include <kvpage_ext.h>  /* kvp_version_string */
#include <kvpage_plan.h> /* kvp_layout_compute */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eval.h"
#include "gguf.h"
#include "handoff.h"
#include "model.h"
#include "serve.h"
#include "tokenizer.h"

#define ERR_LEN 512
#define EVAL_MAX_VARIANTS 16

static void usage(FILE *o) {
    fprintf(o,
            "usage: kvpage-engine COMMAND MODEL.gguf [options]\n"
            "  dump (or --dump)             print metadata keys and every tensor's type/shape\n"
            "  tokenize [--ids] [--file F | TEXT]  token ids (all with --ids); checks decoding gives the text back\n"
            "  demo [options]               serve several prompts at once (continuous batching)\n"
            "      --prompt TEXT            a user prompt (repeat; default: eight built-in prompts)\n"
            "      --system TEXT            the shared system prompt (--system-file F: read from F)\n"
            "      --max-tokens N           tokens to generate per prompt (default 96)\n"
            "      --max-active N           sequences in the batch at once (default 4)\n"
            "      --temperature T --seed S sampling (default: greedy)\n"
            "      --raw                    prompts are plain text (no chat template)\n"
            "      --kv SPEC                the KV cache: fp32, fp16, bf16, fp8, int8 (default), int4, k8v4\n"
            "                               (K int8, V int4), KFMT/VFMT (e.g. int4/fp16), each with an\n"
            "                               optional @PAGE (int4@32); or contig (the contiguous fp32 reference);\n"
            "                               or sim:KEY/VALUE[@PAGE][+rN], a quantization experiment (kv.h)\n"
            "      --page N                 tokens per page (default 16)\n"
            "      --no-prefix-cache        prefill every prompt in full\n"
            "  run --prompt TEXT [options]  one prompt, greedy (demo's --system, --raw, --max-tokens, --kv, --page):\n"
            "                               the text on stdout, timings on stderr\n"
            "  prefill --prompt TEXT --out FILE [options]   prefill it and sample the first token, then\n"
            "                               write the token ids and the sequence's KV (page blobs) to FILE\n"
            "  decode --in FILE [--max-tokens N] [options]  import FILE's KV into a fresh cache (validated)\n"
            "                               and continue greedily: the same text as run (--kv, --page: the\n"
            "                               file's unless given)\n"
            "  eval [options]               perplexity over a text\n"
            "      --file F                 the text (default /usr/share/common-licenses/GPL-3)\n"
            "      --window N --stride N    window and stride in tokens (default 512, 256)\n"
            "      --max-tokens N           only the first N tokens of the text (0, the default: all)\n"
            "      --kv LIST                KV variants, comma-separated, as demo's --kv; the first is the\n"
            "                               reference for KL (default contig,fp32,fp16,bf16,fp8,int8,int4,k8v4)\n"
            "      --page N                 default tokens per page (16)\n"
            "  bench [--prompt-tokens N] [--decode-tokens N] [--reps N] [--kv SPEC] [--page N]\n"
            "                               prefill and decode tokens/s, batch 1 and 4, and attention's share\n"
            "                               of the prefill time (last line JSON)\n"
            "common: --threads N (default 2): the engine's threads; --kv-threads N: libkvpage's attention\n"
            "        threads (default: the same number; the engine's workers sleep while they run);\n"
            "        --kv-decode-threads N: libkvpage's threads in pure decode steps (default 1)\n"
            "        --kv-store SPEC (demo, run, prefill, decode; repeat for more, looked up in order):\n"
            "        a KV store behind the paged cache: dir:PATH, a directory of page blobs (created if\n"
            "        missing) that later runs over the same prompts read instead of prefilling; or\n"
            "        redis://[user[:password]@]host[:port][/db] (several: comma-separated), a Redis or\n"
            "        Valkey server shared by processes and machines (password: better in the environment,\n"
            "        KVPAGE_REDIS_PASSWORD, ACL user KVPAGE_REDIS_USER; key prefix: KVPAGE_REDIS_PREFIX,\n"
            "        default \"kvp:\");\n"
            "        --kv-store-policy LIST: read,write-back,write-through (default all three)\n");
}

/* ---- small helpers ---------------------------------------------------------------------- */

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    for (size_t got; buf && (got = fread(buf + n, 1, cap - n - 1, f)) > 0;) {
        n += got;
        if (cap - n - 1 == 0) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) free(buf);
            buf = nb;
        }
    }
    fclose(f);
    if (buf) buf[n] = 0;
    *len = n;
    return buf;
}

static int32_t *encode_alloc(const tokenizer_t *tok, const char *text, size_t len, int special, int32_t *n) {
    int32_t need = 0;
    tokenizer_encode(tok, text, len, special, NULL, 0, &need);
    int32_t *ids = malloc(((size_t)need + 1) * sizeof *ids);
    if (ids && tokenizer_encode(tok, text, len, special, ids, need, NULL) != need) {
        free(ids);
        return NULL;
    }
    *n = need;
    return ids;
}

static const char *opt_value(int argc, char **argv, int *i) {
    if (*i + 1 >= argc) {
        fprintf(stderr, "kvpage-engine: %s needs a value\n", argv[*i]);
        exit(2);
    }
    return argv[++*i];
}

static long opt_long(int argc, char **argv, int *i, long lo, long hi) {
    const char *name = argv[*i], *v = opt_value(argc, argv, i);
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || *end || x < lo || x > hi) {
        fprintf(stderr, "kvpage-engine: %s must be an integer in %ld..%ld, got '%s'\n", name, lo, hi, v);
        exit(2);
    }
    return x;
}

/* ---- dump / tokenize ------------------------------------------------------------------------ */

static int cmd_dump(const char *path) {
    char err[ERR_LEN];
    gguf_file *f = gguf_open(path, err, sizeof err);
    if (!f) {
        fprintf(stderr, "kvpage-engine: %s\n", err);
        return 1;
    }
    gguf_dump(f, stdout);
    gguf_close(f);
    return 0;
}

static int cmd_tokenize(model_t *m, int argc, char **argv) {
    char err[ERR_LEN];
    tokenizer_t *tok = tokenizer_load(model_gguf(m), err, sizeof err);
    if (!tok) {
        fprintf(stderr, "kvpage-engine: %s\n", err);
        return 1;
    }
    size_t len = 0;
    char *text = NULL;
    int all_ids = 0;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--ids")) {
            all_ids = 1;
        } else if (!strcmp(argv[i], "--file")) {
            text = read_file(opt_value(argc, argv, &i), &len);
            if (!text) { perror("kvpage-engine: --file"); return 1; }
        } else if (!text) {
            text = strdup(argv[i]);
            len = strlen(text);
        }
    }
    if (!text) text = strdup("Hello, world! 12345 héllo  \n\tend");
    if (!text) return 1;
    len = text ? len : 0;
    int32_t n;
    int32_t *ids = encode_alloc(tok, text, len, 0, &n);
    char *back = malloc(len * 2 + 64);
    long k = ids && back ? tokenizer_decode(tok, ids, n, 0, back, len * 2 + 64) : -1;
    int same = k == (long)len && memcmp(back, text, len) == 0;
    if (n <= 64 || all_ids)
        for (int32_t i = 0; i < n; i++) printf("%d%s", ids[i], i + 1 < n ? " " : "\n");
    printf("%zu bytes -> %d tokens (%.2f bytes/token); round trip %s\n", len, n, n ? (double)len / n : 0.0,
           same ? "exact" : "DIFFERS");
    free(ids);
    free(back);
    free(text);
    tokenizer_free(tok);
    return same ? 0 : 1;
}

/* ---- demo ----------------------------------------------------------------------------------- */

typedef struct {
    const tokenizer_t *tok;
    request_t *reqs;
    char (*line)[160];
    size_t *line_len;
    int32_t eos;
    const kv_cache_t *kv;   /* the paged cache with stores, or NULL */
    int32_t kv_page;        /* its page size */
    int64_t store_pages;    /* pages found in the stores so far */
} demo_ctx;

/* Pages found in the cache's stores so far (all of them). */
static int64_t store_hit_pages(const kv_cache_t *kv) {
    if (!kv) return 0;
    kv_stats_t ks;
    kv->ops->stats(kv, &ks);
    int64_t pages = 0;
    for (int32_t t = 0; t < ks.n_stores; t++) pages += ks.stores[t].hit_pages;
    return pages;
}

static void flush_line(demo_ctx *d, int32_t i, const char *suffix) {
    if (d->line_len[i] == 0 && !*suffix) return;
    printf("  [%d] %.*s%s\n", i + 1, (int)d->line_len[i], d->line[i], suffix);
    fflush(stdout);
    d->line_len[i] = 0;
}

/* Stream each sequence's text in lines tagged with its number, so the
 * interleaving of the batch stays readable. */
static void demo_token(void *ctx, int32_t i, int32_t token) {
    demo_ctx *d = ctx;
    if (token == d->eos || tokenizer_is_control(d->tok, token)) return;
    size_t n;
    const char *p = tokenizer_piece(d->tok, token, &n);
    for (size_t k = 0; k < n; k++) {
        if (p[k] == '\n') {
            flush_line(d, i, " \\n");
            continue;
        }
        d->line[i][d->line_len[i]++] = p[k];
        /* break long lines at a space, but never inside a UTF-8 sequence */
        if (d->line_len[i] >= 72 && (p[k] == ' ' || d->line_len[i] >= 150) &&
            (k + 1 >= n || ((unsigned char)p[k + 1] & 0xC0) != 0x80))
            flush_line(d, i, "");
    }
}

static void demo_event(void *ctx, int32_t i, const char *what) {
    demo_ctx *d = ctx;
    request_t *r = &d->reqs[i];
    if (!strcmp(what, "join")) {
        int64_t now = store_hit_pages(d->kv), from_store = (now - d->store_pages) * d->kv_page;
        d->store_pages = now;
        if (d->kv && r->cached)
            printf("  [%d] joins the batch (prompt %d tokens, %d of them found: %lld in the KV store, %lld in the "
                   "pool)\n", i + 1, r->n_prompt, r->cached, (long long)from_store,
                   (long long)(r->cached - from_store));
        else if (r->cached)
            printf("  [%d] joins the batch (prompt %d tokens, %d of them found in the prefix cache)\n", i + 1,
                   r->n_prompt, r->cached);
        else printf("  [%d] joins the batch (prompt %d tokens)\n", i + 1, r->n_prompt);
    } else {
        flush_line(d, i, "");
        static const char *const why[] = {"", "end of turn", "token limit", "cache full"};
        printf("  [%d] leaves the batch: %d tokens, %s\n", i + 1, r->n_out, why[r->finished]);
    }
    fflush(stdout);
}

static const char *const default_prompts[] = {
    "What is the capital of France? Answer in one sentence.",
    "Write a haiku about the sea.",
    "Give three tips for writing clear C code.",
    "Explain in two sentences why the sky is blue.",
    "List the first five prime numbers.",
    "Write a short story about a robot who learns to paint.",
    "What are the main differences between cats and dogs as pets?",
    "Describe how a bicycle works.",
};
/* Long enough to fill a few 16-token pages, so a prefix cache has something
 * to share between the requests. */
static const char default_system[] =
    "You are a concise, helpful assistant. Answer accurately and briefly, in plain English. "
    "If you do not know something, say so instead of guessing. Prefer short sentences, "
    "concrete facts and simple words, and do not repeat the question.";

typedef struct {
    const char *prompts[16];
    int n_prompts;
    const char *system;
    long max_tokens, max_active, threads, seed, page;
    double temperature;
    int raw;          /* prompts as plain text, no chat template */
    const char *kv;   /* "contig" or a paged spec (kv_paged_parse) */
    int prefix_cache; /* 0: --no-prefix-cache */
    int kv_given, page_given;
    char *system_buf; /* --system-file's text (malloc'ed) */
    const char *in, *out; /* decode's --in, prefill's --out */
} demo_opts;

/* The KV cache named by `spec`: "contig" (the engine's contiguous fp32
 * reference), or libkvpage's paged cache in the formats kv_paged_parse()
 * reads, with `page` tokens per page unless the spec says "@PAGE". */
/* --kv-threads: libkvpage's attention threads (0: as many as the engine's);
 * --kv-decode-threads: theirs in pure decode steps (0: 1) */
static long g_kv_threads, g_kv_decode_threads;

/* --kv-store (repeatable) and --kv-store-policy; the identity (model
 * fingerprint) is set once the model is loaded, for the stores and for
 * prefill/decode's export and import. */
static struct {
    int32_t n;
    const char *specs[KV_MAX_STORES];
    int32_t policy;
    int has_identity;
    uint8_t fingerprint[KV_FINGERPRINT_BYTES];
    double fingerprint_s;
} g_store;

static kv_cache_t *make_kv(const char *spec, long page, int prefix_cache, const kv_shape_t *shape, pool_t *pool,
                           char *err, size_t err_size) {
    if ((!strcmp(spec, "contig") || !strncmp(spec, "sim:", 4)) && g_store.n > 0 && prefix_cache) {
        snprintf(err, err_size, "--kv-store needs libkvpage's paged cache (not '%s')", spec);
        return NULL;
    }
    if (!strcmp(spec, "contig")) {
        kv_cache_t *kv = kv_contig_create(shape, pool);
        if (!kv) snprintf(err, err_size, "cannot create the contiguous cache");
        return kv;
    }
    if (!strncmp(spec, "sim:", 4)) return kv_sim_create(shape, pool, spec + 4, err, err_size);
    kv_paged_opts_t o;
    kv_paged_opts_init(&o);
    o.page_size = (int32_t)page;
    o.prefix_cache = prefix_cache;
    o.threads = (int32_t)g_kv_threads;
    o.decode_threads = (int32_t)g_kv_decode_threads;
    /* libkvpage's kernels: KVPAGE_ENGINE_KV_ISA=portable|avx2|avx512|avx512-bf16|neon|neon-dotprod (to compare
     * their accuracy) */
    const char *isa = getenv("KVPAGE_ENGINE_KV_ISA");
    if (isa) {
        o.isa = KVP_ISA_AUTO;
        for (int32_t k = KVP_ISA_PORTABLE; k < KVP_ISA_COUNT; k++)
            if (!strcmp(isa, kvp_isa_name(k))) o.isa = k;
    }
    if (kv_paged_parse(spec, &o, err, err_size)) return NULL;
    o.has_identity = g_store.has_identity;
    memcpy(o.fingerprint, g_store.fingerprint, sizeof o.fingerprint);
    o.store_policy = g_store.policy;
    if (prefix_cache) { /* without it nothing is looked up (eval, bench): no store */
        o.n_stores = g_store.n;
        memcpy(o.stores, g_store.specs, sizeof o.stores);
    }
    return kv_paged_create(shape, pool, &o, err, err_size);
}

static const char *kv_name(const char *spec, const kv_cache_t *kv) {
    return !strcmp(spec, "contig")       ? "contiguous fp32 (the engine's reference)"
           : !strncmp(spec, "sim:", 4) ? "simulated quantization (contiguous fp32 storage)"
                                       : kv_paged_name(kv);
}

/* Tokens every prompt starts with (the shared system prompt). */
static int32_t shared_prefix(const request_t *reqs, int32_t n) {
    int32_t common = reqs[0].n_prompt;
    for (int32_t i = 1; i < n; i++) {
        int32_t k = 0;
        while (k < common && k < reqs[i].n_prompt && reqs[i].prompt[k] == reqs[0].prompt[k]) k++;
        common = k;
    }
    return common;
}

static double mib(double bytes) { return bytes / 1048576.0; }

/* What the run's KV memory would have been in an fp16 contiguous cache that
 * reserves max_len tokens per sequence (what engines without paging do),
 * against what the cache really held. Byte counts: libkvpage's layout. */
static void memory_report(const model_cfg_t *c, const kv_stats_t *kvs, const serve_stats_t *st,
                          const request_t *reqs, int32_t n, int32_t max_len) {
    kvp_layout_t fp16 = {.struct_size = sizeof fp16};
    char err[KVP_ERR_SIZE];
    if (kvp_layout_compute(c->n_layers, c->n_kv_heads, c->head_dim, 16, KVP_FORMAT_FP16, KVP_FORMAT_FP16, &fp16,
                           err, sizeof err) != KVP_OK) {
        fprintf(stderr, "kvpage-engine: kvp_layout_compute: %s\n", err);
        return;
    }
    const double f16_tok = fp16.bytes_per_token;
    const double reserve = (double)st->peak_active * max_len * f16_tok;
    const double reserve_ctx = (double)st->peak_active * c->context * f16_tok;
    printf("\nmemory report (libkvpage %s; %d layers x %d kv heads x %d dims; %d sequences open at peak, "
           "%lld tokens held at peak)\n",
           kvp_version_string(), c->n_layers, c->n_kv_heads, c->head_dim, st->peak_active,
           (long long)st->peak_live_tokens);
    char what[112];
    snprintf(what, sizeof what, "fp16 contiguous, %d x %d-token reservation (model context)", st->peak_active,
             c->context);
    printf("  %-62s %9.2f MiB\n", what, mib(reserve_ctx));
    snprintf(what, sizeof what, "fp16 contiguous, %d x %d-token reservation (this run's max)", st->peak_active,
             max_len);
    printf("  %-62s %9.2f MiB\n", what, mib(reserve));
    if (kvs->page_size > 0) {
        snprintf(what, sizeof what, "%s/%s pages in use at peak: %lld x %llu B%s", kvs->k_format, kvs->v_format,
                 (long long)kvs->pages_peak, (unsigned long long)kvs->page_bytes,
                 kvs->staging_peak ? " + staging" : "");
        printf("  %-62s %9.2f MiB  = %.1f%% of the run's reservation (%.1fx less), %.2f%% of the context's\n",
               what, mib((double)kvs->bytes_peak), 100 * kvs->bytes_peak / reserve, reserve / kvs->bytes_peak,
               100 * kvs->bytes_peak / reserve_ctx);
        if (kvs->staging_peak)
            printf("  %-62s\n", "  (staging: each sequence's partly filled page, fp16, until it seals)");
        printf("  pool: %lld pages of %d tokens (%.2f MiB arena with %s), %lld in use and %lld cached now\n",
               (long long)kvs->pages_total, kvs->page_size, mib((double)kvs->bytes_reserved),
               kvs->staging_page_bytes ? "the staging pages" : "no staging pages", (long long)kvs->pages_used,
               (long long)kvs->pages_cached);
        int32_t common = shared_prefix(reqs, n);
        printf("  prefix cache: %lld prompt tokens (%lld pages) attached from it instead of prefilled, of %lld "
               "looked up in %lld prompts (shared system prompt: %d tokens)\n",
               (long long)kvs->prefix_hit_tokens, (long long)kvs->prefix_hit_pages,
               (long long)kvs->prefix_lookup_tokens, (long long)kvs->prefix_lookups, n > 1 ? common : 0);
    } else {
        double live = (double)st->peak_live_tokens * f16_tok;
        printf("  %-62s %9.2f MiB\n", "this cache: fp32 contiguous, the same reservation",
               mib(reserve * 2));
        printf("  %-62s %9.2f MiB (%.1f%% of the run's reservation)\n", "fp16, tokens actually held (peak)",
               mib(live), 100 * live / reserve);
        printf("  prefix cache: none (the contiguous cache prefills every prompt in full)\n");
    }
    int64_t gen = 0, prefilled = 0;
    for (int32_t i = 0; i < n; i++) gen += reqs[i].n_out, prefilled += reqs[i].n_prompt - reqs[i].cached;
    printf("  throughput: %lld tokens generated and %lld prompt tokens prefilled in %.2f s: %.1f generated tok/s; "
           "decode steps %.1f tok/s, prefill steps %.1f tok/s\n",
           (long long)gen, (long long)prefilled, st->total_s, st->total_s > 0 ? gen / st->total_s : 0.0,
           st->decode_s > 0 ? st->decode_tokens / st->decode_s : 0.0,
           st->prefill_s > 0 ? st->prefill_tokens / st->prefill_s : 0.0);
}

/* demo's options; run, prefill and decode take the same (one --prompt),
 * plus prefill's --out and decode's --in. */
static void demo_parse(const char *cmd, int argc, char **argv, demo_opts *o) {
    *o = (demo_opts){.system = default_system, .max_tokens = 96, .max_active = 4, .threads = 2, .page = 16,
                     .kv = "int8", .prefix_cache = 1};
    int demo = !strcmp(cmd, "demo");
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--system-file")) {
            size_t len;
            free(o->system_buf);
            o->system = o->system_buf = read_file(opt_value(argc, argv, &i), &len);
            if (!o->system_buf) {
                fprintf(stderr, "kvpage-engine %s: --system-file %s: %s\n", cmd, argv[i], strerror(errno));
                exit(2);
            }
            continue;
        }
        if (!strcmp(cmd, "prefill") && !strcmp(argv[i], "--out")) {
            o->out = opt_value(argc, argv, &i);
            continue;
        }
        if (!strcmp(cmd, "decode") && !strcmp(argv[i], "--in")) {
            o->in = opt_value(argc, argv, &i);
            continue;
        }
        if (!strcmp(argv[i], "--kv")) o->kv_given = 1;
        if (!strcmp(argv[i], "--page")) o->page_given = 1;
        if (!demo && (!strcmp(argv[i], "--max-active") || !strcmp(argv[i], "--temperature") ||
                      !strcmp(argv[i], "--seed") || (!strcmp(cmd, "decode") && !strcmp(argv[i], "--prompt")))) {
            fprintf(stderr, "kvpage-engine %s: %s is not an option of this command\n", cmd, argv[i]);
            exit(2);
        }
        if (!strcmp(argv[i], "--prompt") && o->n_prompts < 16) o->prompts[o->n_prompts++] = opt_value(argc, argv, &i);
        else if (!strcmp(argv[i], "--system")) o->system = opt_value(argc, argv, &i);
        else if (!strcmp(argv[i], "--max-tokens")) o->max_tokens = opt_long(argc, argv, &i, 1, 4096);
        else if (!strcmp(argv[i], "--max-active")) o->max_active = opt_long(argc, argv, &i, 1, 64);
        else if (!strcmp(argv[i], "--threads")) o->threads = opt_long(argc, argv, &i, 1, 256);
        else if (!strcmp(argv[i], "--seed")) o->seed = opt_long(argc, argv, &i, 0, 1L << 30);
        else if (!strcmp(argv[i], "--temperature")) o->temperature = atof(opt_value(argc, argv, &i));
        else if (!strcmp(argv[i], "--raw")) o->raw = 1;
        else if (!strcmp(argv[i], "--kv")) o->kv = opt_value(argc, argv, &i);
        else if (!strcmp(argv[i], "--page")) o->page = opt_long(argc, argv, &i, 1, 4096);
        else if (!strcmp(argv[i], "--no-prefix-cache")) o->prefix_cache = 0;
        else {
            fprintf(stderr, "kvpage-engine %s: unknown option '%s'\n", cmd, argv[i]);
            usage(stderr);
            exit(2);
        }
    }
    if (!demo) {
        const char *missing = !strcmp(cmd, "decode") ? (o->in ? NULL : "--in FILE")
                              : o->n_prompts != 1   ? "exactly one --prompt TEXT"
                              : !strcmp(cmd, "prefill") && !o->out ? "--out FILE"
                                                                   : NULL;
        if (missing) {
            fprintf(stderr, "kvpage-engine %s: needs %s\n", cmd, missing);
            exit(2);
        }
        return;
    }
    if (o->n_prompts == 0)
        for (size_t i = 0; i < sizeof default_prompts / sizeof *default_prompts; i++)
            o->prompts[o->n_prompts++] = default_prompts[i];
}

/* Tokenize every prompt (chat template unless --raw) into requests that
 * arrive over the first steps, so the batch changes while it runs. */
static int demo_requests(const tokenizer_t *tok, const demo_opts *o, request_t *reqs, int32_t *max_prompt) {
    char err[ERR_LEN];
    *max_prompt = 0;
    for (int32_t i = 0; i < o->n_prompts; i++) {
        char *text = o->raw ? strdup(o->prompts[i]) : tokenizer_chat_prompt(tok, o->system, o->prompts[i], err, sizeof err);
        if (!text) {
            fprintf(stderr, "kvpage-engine: %s\n", o->raw ? "out of memory" : err);
            return -1;
        }
        reqs[i].prompt = encode_alloc(tok, text, strlen(text), 1, &reqs[i].n_prompt);
        free(text);
        reqs[i].out = malloc((size_t)o->max_tokens * sizeof(int32_t));
        if (!reqs[i].prompt || !reqs[i].out) return -1;
        reqs[i].max_new = (int32_t)o->max_tokens;
        reqs[i].arrive_step = i < 2 ? 0 : (i - 1) * 4; /* requests keep arriving while others decode */
        if (reqs[i].n_prompt > *max_prompt) *max_prompt = reqs[i].n_prompt;
    }
    return 0;
}

/* `text` on one line, newlines as spaces, cut after about `max` bytes (at
 * a UTF-8 character's start) with its full length said. */
static void print_abbreviated(const char *text, size_t max) {
    size_t len = strlen(text), k = 0;
    for (; k < len && (k < max || ((unsigned char)text[k] & 0xC0) == 0x80); k++)
        putchar(text[k] == '\n' ? ' ' : text[k]);
    if (k < len) printf("... (%zu bytes in all)", len);
}

static void store_header(const kv_cache_t *kv);

static void demo_header(const model_t *m, const demo_opts *o, const pool_t *pool, const kv_cache_t *kv) {
    const model_cfg_t *c = model_cfg(m);
    printf("kvpage-engine: %s, %d layers, dim %d, %d/%d heads, vocab %d; libkvpage %s; %d threads, %s kernels\n",
           c->arch, c->n_layers, c->dim, c->n_heads, c->n_kv_heads, c->vocab, kvp_version_string(),
           pool_threads(pool), qmat_isa_name(qmat_isa()));
    if (o->raw) printf("raw prompts (no chat template), %d requests\n", o->n_prompts);
    else {
        printf("system prompt (shared by all %d requests): \"", o->n_prompts);
        print_abbreviated(o->system, 240);
        printf("\"\n");
    }
    for (int32_t i = 0; i < o->n_prompts; i++) printf("  [%d] user: %s\n", i + 1, o->prompts[i]);
    printf("KV cache: %s; up to %d sequences at once, %d tokens each; %s decoding\n", kv_name(o->kv, kv),
           kv->shape.max_seqs, kv->shape.max_len, o->temperature > 0 ? "temperature" : "greedy");
    store_header(kv);
    printf("\n");
}

/* The stores behind the cache and the model's identity. */
static void store_header(const kv_cache_t *kv) {
    if (g_store.n == 0 || !kv || kv->ops->stats == NULL) return;
    kv_stats_t ks;
    kv->ops->stats(kv, &ks);
    int32_t pol = g_store.policy ? g_store.policy : KVP_TIER_READ | KVP_TIER_WRITE_BACK | KVP_TIER_WRITE_THROUGH;
    for (int32_t t = 0; t < ks.n_stores; t++) {
        printf("KV store %d: %s (%s%s%s), after the pool", t, ks.stores[t].spec,
               pol & KVP_TIER_READ ? "read " : "", pol & KVP_TIER_WRITE_BACK ? "write-back " : "",
               pol & KVP_TIER_WRITE_THROUGH ? "write-through" : "");
        if (ks.stores[t].detail && *ks.stores[t].detail) printf("; %s", ks.stores[t].detail);
        printf("; writes queued\n");
    }
    printf("model fingerprint ");
    for (int i = 0; i < 8; i++) printf("%02x", g_store.fingerprint[i]);
    printf("... (SHA-256 of the architecture and the whole weights file, %.2f s)\n", g_store.fingerprint_s);
}

static void demo_answers(const tokenizer_t *tok, const request_t *reqs, int32_t n, const serve_stats_t *st) {
    printf("\nanswers:\n");
    for (int32_t i = 0; i < n; i++) {
        size_t cap = 1;
        for (int32_t k = 0; k < reqs[i].n_out; k++) {
            size_t len;
            tokenizer_piece(tok, reqs[i].out[k], &len);
            cap += len;
        }
        char *text = malloc(cap);
        if (text && tokenizer_decode(tok, reqs[i].out, reqs[i].n_out, 1, text, cap) >= 0)
            printf("  [%d] %s\n", i + 1, text);
        free(text);
    }
    printf("\n%d steps in %.2f s: prefill %lld tokens at %.1f tok/s, decode %lld tokens at %.1f tok/s "
           "(steps of one kind only)\n",
           st->steps, st->total_s, (long long)st->prefill_tokens,
           st->prefill_s > 0 ? st->prefill_tokens / st->prefill_s : 0.0, (long long)st->decode_tokens,
           st->decode_s > 0 ? st->decode_tokens / st->decode_s : 0.0);
}

/* Per store: the prompt tokens found there, misses, pages written,
 * rejected, errors; its queue; a Redis store's connection counters. */
static void store_report(FILE *f, const kv_stats_t *ks) {
    for (int32_t t = 0; t < ks->n_stores; t++) {
        const struct kv_store_stats *s = &ks->stores[t];
        fprintf(f, "  KV store %d (%s): %lld prompt tokens found there (%lld pages x %d) of %lld pages looked up, "
               "%lld missed; %lld pages written (%.2f MiB); %lld rejected, %lld errors; reading %.3f s, writing "
               "%.3f s\n",
               t, s->spec, (long long)(s->hit_pages * ks->page_size), (long long)s->hit_pages, ks->page_size,
               (long long)s->lookups, (long long)s->misses, (long long)s->written, mib((double)s->bytes_out),
               (long long)s->rejected, (long long)s->errors, s->read_s, s->write_s);
        if (s->queue_dropped || s->queue_failed)
            fprintf(f, "    its write queue: %lld pages dropped (queue full), %lld refused by the store\n",
                    (long long)s->queue_dropped, (long long)s->queue_failed);
        if (s->is_redis)
            fprintf(f, "    redis: %d %s%s, %d down; %lld connections made, %lld failed (refused, lost or timed "
                    "out); %lld calls out of time, %lld keys skipped (server down), %lld server errors\n",
                    s->redis.nodes, s->redis.cluster ? "Cluster node" : "server", s->redis.nodes == 1 ? "" : "s",
                    s->redis.nodes_down, (long long)s->redis.connects, (long long)s->redis.failures,
                    (long long)s->redis.timeouts, (long long)s->redis.skipped, (long long)s->redis.server_errors);
        if ((s->errors || s->queue_failed || s->redis.failures || s->redis.timeouts) && s->last_error[0])
            fprintf(f, "    its last failure: %s\n", s->last_error);
    }
}

/* Time to first token of each request (from its arrival: queueing, prefix
 * lookups and store reads included), then one JSON line a script can
 * compare between runs (e.g. a cold and a warm run over the same store). */
static void demo_summary(const request_t *reqs, int32_t n, const kv_stats_t *ks, const serve_stats_t *st) {
    printf("\ntime to first token:");
    for (int32_t i = 0; i < n; i++)
        printf(" [%d] %.1f ms", i + 1, reqs[i].t_first >= 0 ? 1e3 * (reqs[i].t_first - reqs[i].t_arrive) : -1.0);
    printf("\n");
    int64_t prompt = 0, cached = 0, gen = 0, store = 0, written = 0, rejected = 0, errors = 0, misses = 0;
    int64_t dropped = 0, refused = 0, failures = 0, skipped = 0, down = 0, remote = 0;
    uint64_t digest = 1469598103934665603ull; /* FNV-1a 64 of every request's output token ids */
    for (int32_t i = 0; i < n; i++) {
        prompt += reqs[i].n_prompt, cached += reqs[i].cached, gen += reqs[i].n_out;
        for (int32_t k = 0; k < reqs[i].n_out; k++)
            for (int b = 0; b < 4; b++) digest = (digest ^ (((uint32_t)reqs[i].out[k] >> (8 * b)) & 0xFF)) * 1099511628211ull;
        digest = (digest ^ 0xFF) * 1099511628211ull; /* end of a request */
    }
    for (int32_t t = 0; t < ks->n_stores; t++) {
        store += ks->stores[t].hit_pages * ks->page_size;
        written += ks->stores[t].written, rejected += ks->stores[t].rejected, errors += ks->stores[t].errors;
        misses += ks->stores[t].misses;
        dropped += ks->stores[t].queue_dropped, refused += ks->stores[t].queue_failed;
        if (ks->stores[t].is_redis) {
            remote += ks->stores[t].hit_pages * ks->page_size;
            failures += ks->stores[t].redis.failures, skipped += ks->stores[t].redis.skipped;
            down += ks->stores[t].redis.nodes_down;
        }
    }
    printf("{\"requests\": %d, \"prompt_tokens\": %lld, \"store_hit_tokens\": %lld, \"pool_hit_tokens\": %lld, "
           "\"prefilled_tokens\": %lld, \"generated_tokens\": %lld, \"ttft_ms_first\": %.1f, \"ttft_ms\": [",
           n, (long long)prompt, (long long)store, (long long)(cached - store), (long long)(prompt - cached),
           (long long)gen, reqs[0].t_first >= 0 ? 1e3 * (reqs[0].t_first - reqs[0].t_arrive) : -1.0);
    for (int32_t i = 0; i < n; i++)
        printf("%s%.1f", i ? ", " : "", reqs[i].t_first >= 0 ? 1e3 * (reqs[i].t_first - reqs[i].t_arrive) : -1.0);
    printf("], \"store_pages_written\": %lld, \"store_misses\": %lld, \"store_rejected\": %lld, "
           "\"store_errors\": %lld, \"store_queue_dropped\": %lld, \"store_queue_refused\": %lld, ",
           (long long)written, (long long)misses, (long long)rejected, (long long)errors, (long long)dropped,
           (long long)refused);
    int redis = 0; /* a Redis store's counters, when there is one */
    for (int32_t t = 0; t < ks->n_stores; t++) redis |= ks->stores[t].is_redis;
    if (redis)
        printf("\"remote_hit_tokens\": %lld, \"redis_failures\": %lld, \"redis_skipped\": %lld, "
               "\"redis_nodes_down\": %lld, ",
               (long long)remote, (long long)failures, (long long)skipped, (long long)down);
    printf("\"output_digest\": \"%016llx\", \"seconds\": %.2f}\n", (unsigned long long)digest, st->total_s);
}

static int cmd_demo(model_t *m, int argc, char **argv) {
    demo_opts o;
    demo_parse("demo", argc, argv, &o);
    char err[ERR_LEN];
    tokenizer_t *tok = tokenizer_load(model_gguf(m), err, sizeof err);
    if (!tok) {
        fprintf(stderr, "kvpage-engine: %s\n", err);
        return 1;
    }
    int32_t n = o.n_prompts, max_prompt;
    request_t reqs[16] = {0};
    if (demo_requests(tok, &o, reqs, &max_prompt)) return 1;
    int32_t max_len = max_prompt + (int32_t)o.max_tokens;
    pool_t *pool = pool_create((int)o.threads);
    kv_shape_t shape = model_kv_shape(m, (int32_t)o.max_active, max_len);
    kv_cache_t *kv = pool ? make_kv(o.kv, o.page, o.prefix_cache, &shape, pool, err, sizeof err) : NULL;
    if (!kv) {
        fprintf(stderr, "kvpage-engine: cannot create the KV cache '%s': %s\n", o.kv, pool ? err : "no threads");
        pool_destroy(pool);
        for (int32_t i = 0; i < n; i++) {
            free((void *)(uintptr_t)reqs[i].prompt);
            free(reqs[i].out);
        }
        free(o.system_buf);
        tokenizer_free(tok);
        return 1;
    }
    char lines[16][160];
    size_t line_len[16] = {0};
    /* stop at ChatML's end-of-turn token, else at the file's eos */
    int32_t im_end = tokenizer_find(tok, "<|im_end|>"), eos = im_end >= 0 ? im_end : tokenizer_eos(tok);
    kv_stats_t ks;
    kv->ops->stats(kv, &ks);
    demo_ctx d = {tok, reqs, lines, line_len, eos, g_store.n > 0 ? kv : NULL, ks.page_size, 0};
    serve_cfg_t cfg = {m, kv, pool, (int32_t)o.max_active, 64, 64 + (int32_t)o.max_active, eos,
                       (float)o.temperature, (uint64_t)o.seed, demo_token, demo_event, &d,
                       /* paged: prefill chunks end on page edges (serve.h) */ ks.page_size};
    demo_header(m, &o, pool, kv);
    serve_stats_t st;
    int rc = serve_run(&cfg, reqs, n, &st);
    int paged = strcmp(o.kv, "contig") && strncmp(o.kv, "sim:", 4);
    if (rc != 0)
        fprintf(stderr, "kvpage-engine: serving failed (%d)%s%s\n", rc, paged ? ": " : "",
                paged ? kv_paged_last_error(kv) : "");
    if (paged && kv_paged_flush(kv) != KV_OK) /* pending write-through pages, before the counts */
        fprintf(stderr, "kvpage-engine: flushing the KV stores: %s\n", kv_paged_last_error(kv));
    kv->ops->stats(kv, &ks);
    demo_answers(tok, reqs, n, &st);
    memory_report(model_cfg(m), &ks, &st, reqs, n, max_len);
    store_report(stdout, &ks);
    demo_summary(reqs, n, &ks, &st);
    kv->ops->destroy(kv);
    pool_destroy(pool);
    free(o.system_buf);
    for (int32_t i = 0; i < n; i++) {
        free((void *)(uintptr_t)reqs[i].prompt);
        free(reqs[i].out);
    }
    tokenizer_free(tok);
    return rc == 0 ? 0 : 1;
}

/* ---- run / prefill / decode: one request, in one process or split across two ------------------ */

static char *ids_text(const tokenizer_t *tok, const int32_t *ids, int32_t n) {
    size_t cap = 1;
    for (int32_t k = 0; k < n; k++) {
        size_t len;
        tokenizer_piece(tok, ids[k], &len);
        cap += len;
    }
    char *text = malloc(cap);
    if (text && tokenizer_decode(tok, ids, n, 1, text, cap) < 0) text[0] = 0;
    return text;
}

/* run: prefill + decode here. prefill: prefill + first token, then the
 * sequence's KV and token ids to --out. decode: --in's KV imported into a
 * fresh cache, then decode. The text goes to stdout (run, decode), the rest
 * to stderr, so `run` and `decode` outputs compare with cmp. */
static int cmd_one(model_t *m, const char *cmd, int argc, char **argv) {
    demo_opts o;
    demo_parse(cmd, argc, argv, &o);
    const int is_run = !strcmp(cmd, "run"), is_prefill = !strcmp(cmd, "prefill"), is_decode = !strcmp(cmd, "decode");
    char err[ERR_LEN], spec[64];
    tokenizer_t *tok = tokenizer_load(model_gguf(m), err, sizeof err);
    if (!tok) {
        fprintf(stderr, "kvpage-engine: %s\n", err);
        return 1;
    }
    int32_t im_end = tokenizer_find(tok, "<|im_end|>"), eos = im_end >= 0 ? im_end : tokenizer_eos(tok);
    handoff_t h = {0};
    int32_t *prompt = NULL, n = 0;
    const char *kvspec = o.kv;
    long page = o.page;
    int rc = 0;
    if (is_decode) {
        if (handoff_read(o.in, &h, err, sizeof err)) {
            fprintf(stderr, "kvpage-engine decode: %s\n", err);
            rc = 1;
        } else if (memcmp(h.fingerprint, g_store.fingerprint, KV_FINGERPRINT_BYTES) != 0) {
            fprintf(stderr, "kvpage-engine decode: %s was prefilled with another model (its fingerprint differs "
                    "from this one's)\n", o.in);
            rc = 1;
        } else {
            prompt = h.tokens, n = h.n_tokens;
            if (!o.kv_given) { /* the exporter's formats and page size, unless told otherwise */
                snprintf(spec, sizeof spec, "%s/%s", kvp_format_name(h.k_format), kvp_format_name(h.v_format));
                kvspec = spec;
            }
            if (!o.page_given) page = h.page_size;
        }
    } else {
        char *text = o.raw ? strdup(o.prompts[0]) : tokenizer_chat_prompt(tok, o.system, o.prompts[0], err, sizeof err);
        prompt = text ? encode_alloc(tok, text, strlen(text), 1, &n) : NULL;
        if (!prompt || n < 1) {
            fprintf(stderr, "kvpage-engine %s: %s\n", cmd, text ? "empty prompt" : err);
            rc = 1;
        }
        free(text);
    }
    if (rc == 0 && !is_run && (!strcmp(kvspec, "contig") || !strncmp(kvspec, "sim:", 4))) {
        fprintf(stderr, "kvpage-engine %s: needs libkvpage's paged cache (--kv), not '%s'\n", cmd, kvspec);
        rc = 2;
    }
    pool_t *pool = rc == 0 ? pool_create((int)o.threads) : NULL;
    kv_shape_t shape = model_kv_shape(m, 1, n + (int32_t)o.max_tokens);
    kv_cache_t *kv = pool ? make_kv(kvspec, page, o.prefix_cache, &shape, pool, err, sizeof err) : NULL;
    if (rc == 0 && !kv) {
        fprintf(stderr, "kvpage-engine %s: cannot create the KV cache '%s': %s\n", cmd, kvspec,
                pool ? err : "no threads");
        rc = 1;
    }
    int paged = kv && strcmp(kvspec, "contig") && strncmp(kvspec, "sim:", 4);
    gen_cfg_t g = {m, kv, pool, 64, eos}; /* prefill chunks of 64, as demo's */
    int32_t seq = -1, cached = 0, first = -1, n_out = 0;
    int32_t *out = malloc(sizeof(int32_t) * (size_t)o.max_tokens);
    double t0 = now_seconds(), t1 = t0, t2 = t0;
    if (rc == 0 && is_decode) {
        int k = kv->ops->seq_open(kv, &seq);
        if (k == KV_OK) k = kv_paged_seq_import(kv, seq, prompt, n, h.blobs, h.blob_bytes);
        if (k != KV_OK) {
            fprintf(stderr, "kvpage-engine decode: importing %s: %s\n", o.in, kv_paged_last_error(kv));
            rc = 1;
        }
        first = h.first_token;
    } else if (rc == 0 && gen_prefill(&g, prompt, n, &seq, &cached, &first) != KV_OK) {
        fprintf(stderr, "kvpage-engine %s: prefill failed: %s\n", cmd, paged ? kv_paged_last_error(kv) : "");
        rc = 1;
    }
    t1 = now_seconds();
    if (rc == 0 && is_prefill) {
        handoff_t w = {.n_tokens = n, .first_token = first, .tokens = prompt};
        kv_paged_opts_t po;
        kv_paged_opts_init(&po);
        po.page_size = (int32_t)page;
        kv_paged_parse(kvspec, &po, err, sizeof err); /* checked by make_kv */
        w.k_format = po.k_format, w.v_format = po.v_format, w.page_size = po.page_size;
        memcpy(w.fingerprint, g_store.fingerprint, KV_FINGERPRINT_BYTES);
        if (kv_paged_seq_export(kv, seq, prompt, n, &w.blobs, &w.blob_bytes) != KV_OK) {
            fprintf(stderr, "kvpage-engine prefill: export: %s\n", kv_paged_last_error(kv));
            rc = 1;
        } else if (handoff_write(o.out, &w, err, sizeof err)) {
            fprintf(stderr, "kvpage-engine prefill: %s\n", err);
            rc = 1;
        }
        t2 = now_seconds();
        if (rc == 0) {
            size_t len;
            const char *piece = tokenizer_piece(tok, first, &len);
            fprintf(stderr, "kvpage-engine prefill: prompt %d tokens (%d found in the cache), prefilled in %.3f s; "
                    "first token %d \"%.*s\"; KV (%s, page %ld): %llu bytes of page blobs -> %s (%.3f s)\n",
                    n, cached, t1 - t0, first, (int)len, piece, kvspec, page, (unsigned long long)w.blob_bytes,
                    o.out, t2 - t1);
        }
        free(w.blobs);
    } else if (rc == 0) {
        if (gen_decode(&g, seq, first, (int32_t)o.max_tokens, out, &n_out) != KV_OK) {
            fprintf(stderr, "kvpage-engine %s: decode failed: %s\n", cmd, paged ? kv_paged_last_error(kv) : "");
            rc = 1;
        }
        t2 = now_seconds();
        char *text = ids_text(tok, out, n_out);
        printf("%s\n", text ? text : "");
        fflush(stdout);
        free(text);
        if (is_decode)
            fprintf(stderr, "kvpage-engine decode: the KV of %d prompt tokens imported from %s (%llu bytes of page "
                    "blobs) in %.3f s; %d tokens in %.3f s (KV %s)\n", n, o.in, (unsigned long long)h.blob_bytes,
                    t1 - t0, n_out, t2 - t1, kv_name(kvspec, kv));
        else
            fprintf(stderr, "kvpage-engine run: prompt %d tokens (%d found in the cache), first token after %.3f s; "
                    "%d tokens in %.3f s (KV %s)\n", n, cached, t1 - t0, n_out, t2 - t1, kv_name(kvspec, kv));
    }
    if (kv) {
        if (seq >= 0) kv->ops->seq_close(kv, seq);
        if (paged) {
            kv_stats_t ks;
            kv_paged_flush(kv);
            kv->ops->stats(kv, &ks);
            store_report(stderr, &ks);
        }
        kv->ops->destroy(kv);
    }
    pool_destroy(pool);
    free(out);
    if (is_decode) handoff_free(&h);
    else free(prompt);
    free(o.system_buf);
    tokenizer_free(tok);
    return rc;
}

/* ---- bench ------------------------------------------------------------------------------------ */

/* The time the cache's attention takes inside a forward pass: bench_case
 * routes the cache's attend through timed_attend (the other operations
 * unchanged), which adds each call's time to g_attend_s. */
static const kv_ops_t *g_bench_ops;
static kv_ops_t g_timed_ops;
static double g_attend_s;

static int timed_attend(kv_cache_t *kv, int32_t layer, const float *q, float *out, float scale) {
    double t = now_seconds();
    int rc = g_bench_ops->attend(kv, layer, q, out, scale);
    g_attend_s += now_seconds() - t;
    return rc;
}

/* Prefill `n` tokens of GPL-3 text in one chunk per sequence, then decode
 * `steps` greedy tokens, for `batch` sequences at once; best of `reps`.
 * *prefill_attn: the share of the prefill's time spent in attention. */
static int bench_case(model_t *m, pool_t *pool, const char *spec, long page, const int32_t *text, int32_t n,
                      int32_t batch, int32_t steps, double *prefill_tps, double *decode_tps,
                      double *prefill_attn) {
    kv_shape_t shape = model_kv_shape(m, batch, n + steps + 1);
    char err[ERR_LEN];
    kv_cache_t *kv = make_kv(spec, page, 0, &shape, pool, err, sizeof err);
    if (!kv) fprintf(stderr, "kvpage-engine bench: %s\n", err);
    if (kv) {
        g_bench_ops = kv->ops;
        g_timed_ops = *kv->ops;
        g_timed_ops.attend = timed_attend;
        kv->ops = &g_timed_ops;
    }
    int32_t vocab = model_cfg(m)->vocab, seqs[64], q_start[65], rows[64], *toks = malloc((size_t)n * batch * 4);
    float *logits = malloc((size_t)batch * vocab * sizeof(float));
    int rc = kv && toks && logits && batch <= 64 ? 0 : KV_ENOMEM;
    for (int32_t b = 0; rc == 0 && b < batch; b++) {
        rc = kv->ops->seq_open(kv, &seqs[b]);
        q_start[b] = b * n;
        rows[b] = b * n + n - 1;
        memcpy(toks + (size_t)b * n, text + b, (size_t)n * 4); /* distinct prompts: shifted text */
    }
    q_start[batch] = batch * n;
    g_attend_s = 0.0;
    double t0 = now_seconds();
    if (rc == 0) {
        kv_batch_t bt = {batch, seqs, q_start, toks};
        rc = model_forward(m, kv, pool, &bt, rows, batch, logits);
    }
    double t1 = now_seconds();
    *prefill_attn = t1 > t0 ? g_attend_s / (t1 - t0) : 0.0;
    for (int32_t s = 0; rc == 0 && s < steps; s++) {
        for (int32_t b = 0; b < batch; b++) {
            toks[b] = sample_argmax(logits + (size_t)b * vocab, vocab);
            q_start[b] = b;
            rows[b] = b;
        }
        q_start[batch] = batch;
        kv_batch_t bt = {batch, seqs, q_start, toks};
        rc = model_forward(m, kv, pool, &bt, rows, batch, logits);
    }
    double t2 = now_seconds();
    *prefill_tps = (double)n * batch / (t1 - t0);
    *decode_tps = (double)steps * batch / (t2 - t1);
    if (kv) {
        kv->ops = g_bench_ops;
        kv->ops->destroy(kv);
    }
    free(toks);
    free(logits);
    return rc;
}

static int cmd_bench(model_t *m, int argc, char **argv) {
    long threads = 2, n = 256, steps = 64, reps = 3, page = 16;
    const char *spec = "contig";
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--threads")) threads = opt_long(argc, argv, &i, 1, 256);
        else if (!strcmp(argv[i], "--kv")) spec = opt_value(argc, argv, &i);
        else if (!strcmp(argv[i], "--page")) page = opt_long(argc, argv, &i, 1, 4096);
        else if (!strcmp(argv[i], "--prompt-tokens")) n = opt_long(argc, argv, &i, 1, 4096);
        else if (!strcmp(argv[i], "--decode-tokens")) steps = opt_long(argc, argv, &i, 1, 4096);
        else if (!strcmp(argv[i], "--reps")) reps = opt_long(argc, argv, &i, 1, 100);
        else {
            fprintf(stderr, "kvpage-engine bench: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    char err[ERR_LEN];
    tokenizer_t *tok = tokenizer_load(model_gguf(m), err, sizeof err);
    size_t len;
    char *text = tok ? read_file("/usr/share/common-licenses/GPL-3", &len) : NULL;
    int32_t nt = 0, *ids = text ? encode_alloc(tok, text, len, 0, &nt) : NULL;
    pool_t *pool = pool_create((int)threads);
    if (!ids || !pool || nt < n + 8) {
        fprintf(stderr, "kvpage-engine bench: cannot prepare the input\n");
        return 1;
    }
    static const int32_t batches[] = {1, 4};
    double pf[2] = {0}, dc[2] = {0}, pa[2] = {0}; /* pa: attention's share of the best prefill */
    printf("kvpage-engine bench: %ld threads, %s kernels, KV %s; prompt %ld tokens, %ld decode steps, best of %ld\n",
           threads, qmat_isa_name(qmat_isa()), spec, n, steps, reps);
    printf("%-8s %16s %16s %16s\n", "batch", "prefill tok/s", "attention share", "decode tok/s");
    int rc = 0;
    for (int k = 0; k < 2 && rc == 0; k++) {
        for (long r = 0; r < reps && rc == 0; r++) {
            double p, d, a;
            rc = bench_case(m, pool, spec, page, ids, (int32_t)n, batches[k], (int32_t)steps, &p, &d, &a);
            if (p > pf[k]) pf[k] = p, pa[k] = a;
            if (d > dc[k]) dc[k] = d;
        }
        printf("%-8d %16.1f %16.2f %16.1f\n", batches[k], pf[k], pa[k], dc[k]);
    }
    printf("{\"threads\": %ld, \"isa\": \"%s\", \"kv\": \"%s\", \"prompt_tokens\": %ld, \"prefill_tps\": %.1f, "
           "\"prefill_attention_share\": %.3f, \"decode_tps\": %.1f, \"prefill4_tps\": %.1f, "
           "\"prefill4_attention_share\": %.3f, \"decode4_tps\": %.1f}\n",
           threads, qmat_isa_name(qmat_isa()), spec, n, pf[0], pa[0], dc[0], pf[1], pa[1], dc[1]);
    pool_destroy(pool);
    free(ids);
    free(text);
    tokenizer_free(tok);
    return rc == 0 ? 0 : 1;
}

/* ---- eval ------------------------------------------------------------------------------------- */

/* One KV variant of the eval: a spec for make_kv(). */
typedef struct {
    char spec[32];
    long page;
} eval_spec;

static kv_cache_t *make_variant(const kv_shape_t *shape, pool_t *pool, void *ctx) {
    const eval_spec *e = ctx;
    char err[ERR_LEN];
    /* one sequence at a time and no attach: no prefix cache */
    kv_cache_t *kv = make_kv(e->spec, e->page, 0, shape, pool, err, sizeof err);
    if (!kv) fprintf(stderr, "kvpage-engine eval: KV variant '%s': %s\n", e->spec, err);
    return kv;
}

static void eval_progress(void *ctx, int32_t w, int32_t n) {
    (void)ctx;
    fprintf(stderr, "\reval: window %d/%d", w + 1, n);
    if (w + 1 == n) fputc('\n', stderr);
}

/* Comma-separated specs; each is checked here, so a typo fails before any
 * work. */
static int parse_variants(const char *list, long page, eval_spec *specs, eval_variant_t *out, int32_t *n) {
    char buf[512];
    snprintf(buf, sizeof buf, "%s", list);
    *n = 0;
    for (char *save = NULL, *name = strtok_r(buf, ",", &save); name; name = strtok_r(NULL, ",", &save)) {
        if (*n >= EVAL_MAX_VARIANTS || strlen(name) >= sizeof specs[0].spec) {
            fprintf(stderr, "kvpage-engine eval: at most %d variants of < 32 characters\n", EVAL_MAX_VARIANTS);
            return -1;
        }
        kv_paged_opts_t o;
        kv_paged_opts_init(&o);
        char err[ERR_LEN];
        if (!strncmp(name, "sim:", 4) ? kv_sim_check(name + 4, err, sizeof err) != 0
                                      : strcmp(name, "contig") && kv_paged_parse(name, &o, err, sizeof err)) {
            fprintf(stderr, "kvpage-engine eval: KV variant '%s': %s\n", name, err);
            return -1;
        }
        snprintf(specs[*n].spec, sizeof specs[*n].spec, "%s", name);
        specs[*n].page = page;
        out[*n] = (eval_variant_t){specs[*n].spec, make_variant, &specs[*n]};
        (*n)++;
    }
    return *n > 0 ? 0 : -1;
}

static void eval_print(const char *file, int32_t n_tokens, const eval_cfg_t *cfg, const eval_variant_t *v,
                       const eval_result_t *r, int32_t nv, double total_s) {
    double ref = eval_ppl(&r[0]);
    printf("\n%-14s %10s %9s %12s %11s %10s %8s %8s\n", "kv (K/V)", "ppl", "dppl%", "mean KLD", "p99 KLD", "max KLD",
           "top1", "seconds");
    for (int32_t i = 0; i < nv; i++)
        printf("%-14s %10.4f %+8.3f%% %12.6f %11.6f %10.6f %7.2f%% %8.1f\n", v[i].name, eval_ppl(&r[i]),
               100 * (eval_ppl(&r[i]) / ref - 1), r[i].kl_sum / r[i].scored, r[i].kl_p99, r[i].kl_max,
               100.0 * r[i].top1_same / r[i].scored, r[i].seconds);
    printf("(%s: %d tokens, window %d, stride %d, %lld tokens scored; dppl, KLD and top-1 against %s%s; %.1f s)\n",
           file, n_tokens, cfg->window, cfg->stride, (long long)r[0].scored, v[0].name,
           strcmp(v[0].name, "contig") ? "" : ", the contiguous fp32 cache", total_s);
    printf("{\"ppl\": {");
    for (int32_t i = 0; i < nv; i++) printf("%s\"%s\": %.6f", i ? ", " : "", v[i].name, eval_ppl(&r[i]));
    printf("}, \"kld\": {");
    for (int32_t i = 0; i < nv; i++) printf("%s\"%s\": %.8f", i ? ", " : "", v[i].name, r[i].kl_sum / r[i].scored);
    printf("}, \"kld_p99\": {");
    for (int32_t i = 0; i < nv; i++) printf("%s\"%s\": %.8f", i ? ", " : "", v[i].name, r[i].kl_p99);
    printf("}, \"top1\": {");
    for (int32_t i = 0; i < nv; i++)
        printf("%s\"%s\": %.6f", i ? ", " : "", v[i].name, (double)r[i].top1_same / r[i].scored);
    printf("}, \"tokens\": %lld, \"window\": %d, \"stride\": %d, \"reference\": \"%s\", \"seconds\": %.1f}\n",
           (long long)r[0].scored, cfg->window, cfg->stride, v[0].name, total_s);
}

static int cmd_eval(model_t *m, int argc, char **argv) {
    const char *file = "/usr/share/common-licenses/GPL-3", *kvlist = "contig,fp32,fp16,bf16,fp8,int8,int4,k8v4";
    eval_cfg_t cfg = {512, 256, 512, eval_progress, NULL};
    long max_tokens = 0, threads = 2, page = 16;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--file")) file = opt_value(argc, argv, &i);
        else if (!strcmp(argv[i], "--window")) cfg.window = (int32_t)opt_long(argc, argv, &i, 2, 1 << 16);
        else if (!strcmp(argv[i], "--stride")) cfg.stride = (int32_t)opt_long(argc, argv, &i, 1, 1 << 16);
        else if (!strcmp(argv[i], "--max-tokens")) max_tokens = opt_long(argc, argv, &i, 0, 1L << 30);
        else if (!strcmp(argv[i], "--threads")) threads = opt_long(argc, argv, &i, 1, 256);
        else if (!strcmp(argv[i], "--kv")) kvlist = opt_value(argc, argv, &i);
        else if (!strcmp(argv[i], "--page")) page = opt_long(argc, argv, &i, 1, 4096);
        else {
            fprintf(stderr, "kvpage-engine eval: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    if (cfg.stride > cfg.window || max_tokens == 1) {
        fprintf(stderr, "kvpage-engine eval: --stride must not exceed --window, --max-tokens must be 0 or >= 2\n");
        return 2;
    }
    cfg.chunk = cfg.window;
    eval_variant_t variants[EVAL_MAX_VARIANTS];
    eval_spec specs[EVAL_MAX_VARIANTS];
    int32_t nv;
    if (parse_variants(kvlist, page, specs, variants, &nv)) return 2;
    char err[ERR_LEN];
    tokenizer_t *tok = tokenizer_load(model_gguf(m), err, sizeof err);
    size_t len;
    char *text = tok ? read_file(file, &len) : NULL;
    if (!text) {
        fprintf(stderr, "kvpage-engine: %s\n", tok ? strerror(errno) : err);
        return 1;
    }
    int32_t n;
    int32_t *ids = encode_alloc(tok, text, len, 0, &n);
    if (!ids) return 1;
    if (max_tokens && n > max_tokens) n = (int32_t)max_tokens;
    pool_t *pool = pool_create((int)threads);
    eval_result_t res[EVAL_MAX_VARIANTS];
    printf("kvpage-engine eval: %s, %zu bytes -> %d tokens; %d windows; %ld threads, %s kernels\n", file, len, n,
           eval_windows(n, cfg.window, cfg.stride), threads, qmat_isa_name(qmat_isa()));
    double t0 = now_seconds();
    int rc = pool ? eval_run(m, pool, ids, n, &cfg, variants, nv, res) : KV_ENOMEM;
    if (rc == 0) eval_print(file, n, &cfg, variants, res, nv, now_seconds() - t0);
    else fprintf(stderr, "kvpage-engine eval: failed (%d)\n", rc);
    pool_destroy(pool);
    free(ids);
    free(text);
    tokenizer_free(tok);
    return rc == 0 ? 0 : 1;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        usage(argc < 2 ? stderr : stdout);
        return argc == 2 && !strcmp(argv[1], "--help") ? 0 : 2;
    }
    if (kvp_version_number() != KVP_VERSION_NUMBER) {
        fprintf(stderr, "kvpage-engine: built with libkvpage %s but loaded %s\n", KVP_VERSION_STRING,
                kvp_version_string());
        return 1;
    }
    char err[ERR_LEN];
    for (int i = 3; i < argc; i++) { /* a common option: take it out of the command's arguments */
        int taken = 1;
        if (!strcmp(argv[i], "--kv-threads") || !strcmp(argv[i], "--kv-decode-threads")) {
            long *dst = !strcmp(argv[i], "--kv-threads") ? &g_kv_threads : &g_kv_decode_threads;
            *dst = opt_long(argc, argv, &i, 1, 256);
        } else if (!strcmp(argv[i], "--kv-store")) {
            const char *spec = opt_value(argc, argv, &i);
            if (g_store.n == KV_MAX_STORES || kv_store_check(spec, err, sizeof err)) {
                fprintf(stderr, "kvpage-engine: --kv-store: %s\n",
                        g_store.n == KV_MAX_STORES ? "too many stores" : err);
                return 2;
            }
            g_store.specs[g_store.n++] = spec;
        } else if (!strcmp(argv[i], "--kv-store-policy")) {
            if (kv_store_policy_parse(opt_value(argc, argv, &i), &g_store.policy, err, sizeof err)) {
                fprintf(stderr, "kvpage-engine: --kv-store-policy: %s\n", err);
                return 2;
            }
        } else {
            taken = 0;
        }
        if (taken) {
            memmove(argv + i - 1, argv + i + 1, sizeof *argv * (size_t)(argc - i));
            argc -= 2, i -= 2;
        }
    }
    const char *cmd = argv[1], *path = argv[2];
    if (!strcmp(cmd, "dump") || !strcmp(cmd, "--dump")) return cmd_dump(path);
    static const char *const commands[] = {"tokenize", "demo", "eval", "bench", "run", "prefill", "decode"};
    int known = 0, one = !strcmp(cmd, "run") || !strcmp(cmd, "prefill") || !strcmp(cmd, "decode");
    for (size_t k = 0; k < sizeof commands / sizeof *commands; k++) known |= !strcmp(cmd, commands[k]);
    if (!known) {
        fprintf(stderr, "kvpage-engine: unknown command '%s'\n", cmd);
        usage(stderr);
        return 2;
    }
    if (g_store.n > 0 && !one && strcmp(cmd, "demo")) {
        fprintf(stderr, "kvpage-engine %s: --kv-store applies to demo, run, prefill and decode\n", cmd);
        return 2;
    }
    model_t *m = model_load(path, err, sizeof err);
    if (!m) {
        fprintf(stderr, "kvpage-engine: %s\n", err);
        return 1;
    }
    /* the identity: for the stores, and for prefill/decode's export and import */
    if (g_store.n > 0 || (one && strcmp(cmd, "run"))) {
        double t0 = now_seconds();
        if (model_fingerprint(m, g_store.fingerprint, err, sizeof err)) {
            fprintf(stderr, "kvpage-engine: %s\n", err);
            model_free(m);
            return 1;
        }
        g_store.fingerprint_s = now_seconds() - t0;
        g_store.has_identity = 1;
    }
    int rc = !strcmp(cmd, "tokenize") ? cmd_tokenize(m, argc - 3, argv + 3)
             : !strcmp(cmd, "demo")   ? cmd_demo(m, argc - 3, argv + 3)
             : !strcmp(cmd, "bench")  ? cmd_bench(m, argc - 3, argv + 3)
             : one                    ? cmd_one(m, cmd, argc - 3, argv + 3)
                                      : cmd_eval(m, argc - 3, argv + 3);
    model_free(m);
    return rc;
}
