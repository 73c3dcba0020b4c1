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
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <kvpage.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eval.h"
#include "gguf.h"
#include "model.h"
#include "serve.h"
#include "tokenizer.h"

#define ERR_LEN 512

static void usage(FILE *o) {
    fprintf(o,
            "usage: kvpage-engine COMMAND MODEL.gguf [options]\n"
            "  dump (or --dump)             print metadata keys and every tensor's type/shape\n"
            "  tokenize [--ids] [--file F | TEXT]  token ids (all with --ids); checks decoding gives the text back\n"
            "  demo [options]               serve several prompts at once (continuous batching)\n"
            "      --prompt TEXT            a user prompt (repeat; default: five built-in prompts)\n"
            "      --system TEXT            the shared system prompt\n"
            "      --max-tokens N           tokens to generate per prompt (default 48)\n"
            "      --max-active N           sequences in the batch at once (default 3)\n"
            "      --temperature T --seed S sampling (default: greedy)\n"
            "      --raw                    prompts are plain text (no chat template)\n"
            "  eval [options]               perplexity over a text\n"
            "      --file F                 the text (default /usr/share/common-licenses/GPL-3)\n"
            "      --window N --stride N    window and stride in tokens (default 512, 256)\n"
            "      --max-tokens N           score at most the first N tokens of the text\n"
            "      --kv LIST                KV variants, comma-separated (default fp32)\n"
            "  bench [--prompt-tokens N] [--decode-tokens N] [--reps N]\n"
            "                               prefill and decode tokens/s, batch 1 and 4 (last line JSON)\n"
            "common: --threads N (default 2)\n");
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
} demo_ctx;

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
        printf("  [%d] joins the batch (prompt %d tokens)\n", i + 1, r->n_prompt);
    } else {
        flush_line(d, i, "");
        static const char *const why[] = {"", "end of turn", "token limit", "cache full"};
        printf("  [%d] leaves the batch: %d tokens, %s\n", i + 1, r->n_out, why[r->finished]);
    }
    fflush(stdout);
}

static int32_t total_prompt(const request_t *reqs, int32_t n) {
    int32_t t = 0;
    for (int32_t i = 0; i < n; i++) t += reqs[i].n_prompt;
    return t;
}

static const char *const default_prompts[] = {
    "What is the capital of France? Answer in one sentence.",
    "Write a haiku about the sea.",
    "Give three tips for writing clear C code.",
    "Explain in two sentences why the sky is blue.",
    "List the first five prime numbers.",
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
    long max_tokens, max_active, threads, seed;
    double temperature;
    int raw; /* prompts as plain text, no chat template */
} demo_opts;

/* Tokens every prompt starts with (the shared system prompt), and what a
 * prefix cache with 16-token pages would have saved. */
static void shared_prefix_report(const request_t *reqs, int32_t n) {
    int32_t common = reqs[0].n_prompt;
    for (int32_t i = 1; i < n; i++) {
        int32_t k = 0;
        while (k < common && k < reqs[i].n_prompt && reqs[i].prompt[k] == reqs[0].prompt[k]) k++;
        common = k;
    }
    int32_t pages = common / 16;
    if (common == reqs[0].n_prompt && pages * 16 == common) pages--; /* one token must stay to prefill */
    printf("  shared prompt prefix: %d tokens in all %d prompts; a prefix cache with 16-token pages would "
           "reuse %d pages (%d tokens) for each of %d later prompts: %d of %d prompt tokens not prefilled\n",
           common, n, pages, pages * 16, n - 1, pages * 16 * (n - 1), total_prompt(reqs, n));
}

static void memory_report(const model_cfg_t *c, const kv_stats_t *kvs, const serve_stats_t *st,
                          int32_t max_len) {
    kvp_layout_t fp16 = {.struct_size = sizeof fp16}, int8 = {.struct_size = sizeof int8};
    char err[KVP_ERR_SIZE];
    if (kvp_layout_compute(c->n_layers, c->n_kv_heads, c->head_dim, 16, KVP_FORMAT_FP16, KVP_FORMAT_FP16,
                           &fp16, err, sizeof err) != KVP_OK ||
        kvp_layout_compute(c->n_layers, c->n_kv_heads, c->head_dim, 16, KVP_FORMAT_INT8, KVP_FORMAT_INT8,
                           &int8, err, sizeof err) != KVP_OK) {
        fprintf(stderr, "kvpage-engine: kvp_layout_compute: %s\n", err);
        return;
    }
    double f16_tok = fp16.bytes_per_token;
    double reserve = (double)st->peak_active * max_len * f16_tok;
    double reserve_ctx = (double)st->peak_active * c->context * f16_tok;
    double live = (double)st->peak_live_tokens * f16_tok;
    double paged = (double)st->peak_paged16_tokens / 16 * (double)fp16.page_bytes;
    double paged8 = (double)st->peak_paged16_tokens / 16 * (double)int8.page_bytes +
                    (double)st->peak_active * (double)int8.staging_page_bytes;
    printf("\nmemory report (KV bytes from libkvpage %s's kvp_layout_compute; %d layers x %d kv heads x %d)\n",
           kvp_version_string(), c->n_layers, c->n_kv_heads, c->head_dim);
    printf("  this run's cache: %s %s/%s, %d sequences open at peak, %lld tokens held at peak\n", kvs->impl,
           kvs->k_format, kvs->v_format, st->peak_active, (long long)st->peak_live_tokens);
    char what[96];
    snprintf(what, sizeof what, "fp16 contiguous, %d-token reservation (model context)", c->context);
    printf("  %-56s %10.2f MiB\n", what, reserve_ctx / 1048576);
    snprintf(what, sizeof what, "fp16 contiguous, %d-token reservation (this run's max)", max_len);
    printf("  %-56s %10.2f MiB\n", what, reserve / 1048576);
    printf("  %-56s %10.2f MiB (%.1f%% of the run's reservation, %.2f%% of the context's)\n",
           "fp16, tokens actually held (peak)", live / 1048576, 100 * live / reserve, 100 * live / reserve_ctx);
    printf("  %-56s %10.2f MiB\n", "fp16 paged, 16-token pages (peak)", paged / 1048576);
    printf("  %-56s %10.2f MiB\n", "int8 paged, 16-token pages + staging (peak)", paged8 / 1048576);
    printf("  prefix-cache hits: %lld of %lld prompt tokens (no prefix cache in the contiguous cache)\n",
           (long long)kvs->prefix_hit_tokens, (long long)kvs->prefix_lookups);
}

static void demo_parse(int argc, char **argv, demo_opts *o) {
    *o = (demo_opts){.system = default_system, .max_tokens = 48, .max_active = 3, .threads = 2};
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--prompt") && o->n_prompts < 16) o->prompts[o->n_prompts++] = opt_value(argc, argv, &i);
        else if (!strcmp(argv[i], "--system")) o->system = opt_value(argc, argv, &i);
        else if (!strcmp(argv[i], "--max-tokens")) o->max_tokens = opt_long(argc, argv, &i, 1, 4096);
        else if (!strcmp(argv[i], "--max-active")) o->max_active = opt_long(argc, argv, &i, 1, 64);
        else if (!strcmp(argv[i], "--threads")) o->threads = opt_long(argc, argv, &i, 1, 256);
        else if (!strcmp(argv[i], "--seed")) o->seed = opt_long(argc, argv, &i, 0, 1L << 30);
        else if (!strcmp(argv[i], "--temperature")) o->temperature = atof(opt_value(argc, argv, &i));
        else if (!strcmp(argv[i], "--raw")) o->raw = 1;
        else {
            fprintf(stderr, "kvpage-engine demo: unknown option '%s'\n", argv[i]);
            usage(stderr);
            exit(2);
        }
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

static void demo_header(const model_t *m, const demo_opts *o, const pool_t *pool, const kv_cache_t *kv) {
    const model_cfg_t *c = model_cfg(m);
    printf("kvpage-engine: %s, %d layers, dim %d, %d/%d heads, vocab %d; libkvpage %s; %d threads, %s kernels\n",
           c->arch, c->n_layers, c->dim, c->n_heads, c->n_kv_heads, c->vocab, kvp_version_string(),
           pool_threads(pool), qmat_isa_name(qmat_isa()));
    if (o->raw) printf("raw prompts (no chat template), %d requests\n", o->n_prompts);
    else printf("system prompt (shared by all %d requests): \"%s\"\n", o->n_prompts, o->system);
    for (int32_t i = 0; i < o->n_prompts; i++) printf("  [%d] user: %s\n", i + 1, o->prompts[i]);
    printf("KV cache: %s, %d sequences x %d tokens reserved; %s decoding\n\n", kv->ops->name, kv->shape.max_seqs,
           kv->shape.max_len, o->temperature > 0 ? "temperature" : "greedy");
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

static int cmd_demo(model_t *m, int argc, char **argv) {
    demo_opts o;
    demo_parse(argc, argv, &o);
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
    kv_cache_t *kv = pool ? kv_contig_create(&shape, pool) : NULL;
    if (!kv) {
        fprintf(stderr, "kvpage-engine: cannot create the KV cache\n");
        return 1;
    }
    char lines[16][160];
    size_t line_len[16] = {0};
    /* stop at ChatML's end-of-turn token, else at the file's eos */
    int32_t im_end = tokenizer_find(tok, "<|im_end|>"), eos = im_end >= 0 ? im_end : tokenizer_eos(tok);
    demo_ctx d = {tok, reqs, lines, line_len, eos};
    serve_cfg_t cfg = {m, kv, pool, (int32_t)o.max_active, 64, 64 + (int32_t)o.max_active, eos,
                       (float)o.temperature, (uint64_t)o.seed, demo_token, demo_event, &d};
    demo_header(m, &o, pool, kv);
    serve_stats_t st;
    int rc = serve_run(&cfg, reqs, n, &st);
    if (rc != 0) fprintf(stderr, "kvpage-engine: serving failed (%d)\n", rc);
    kv_stats_t ks;
    kv->ops->stats(kv, &ks);
    demo_answers(tok, reqs, n, &st);
    memory_report(model_cfg(m), &ks, &st, max_len);
    if (n > 1) shared_prefix_report(reqs, n);
    kv->ops->destroy(kv);
    pool_destroy(pool);
    for (int32_t i = 0; i < n; i++) {
        free((void *)(uintptr_t)reqs[i].prompt);
        free(reqs[i].out);
    }
    tokenizer_free(tok);
    return rc == 0 ? 0 : 1;
}

/* ---- bench ------------------------------------------------------------------------------------ */

/* Prefill `n` tokens of GPL-3 text in one chunk per sequence, then decode
 * `steps` greedy tokens, for `batch` sequences at once; best of `reps`. */
static int bench_case(model_t *m, pool_t *pool, const int32_t *text, int32_t n, int32_t batch, int32_t steps,
                      double *prefill_tps, double *decode_tps) {
    kv_shape_t shape = model_kv_shape(m, batch, n + steps + 1);
    kv_cache_t *kv = kv_contig_create(&shape, pool);
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
    double t0 = now_seconds();
    if (rc == 0) {
        kv_batch_t bt = {batch, seqs, q_start, toks};
        rc = model_forward(m, kv, pool, &bt, rows, batch, logits);
    }
    double t1 = now_seconds();
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
    if (kv) kv->ops->destroy(kv);
    free(toks);
    free(logits);
    return rc;
}

static int cmd_bench(model_t *m, int argc, char **argv) {
    long threads = 2, n = 256, steps = 64, reps = 3;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--threads")) threads = opt_long(argc, argv, &i, 1, 256);
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
    double pf[2] = {0}, dc[2] = {0};
    printf("kvpage-engine bench: %ld threads, %s kernels, contiguous fp32 KV; prompt %ld tokens, %ld decode steps,"
           " best of %ld\n", threads, qmat_isa_name(qmat_isa()), n, steps, reps);
    printf("%-8s %16s %16s\n", "batch", "prefill tok/s", "decode tok/s");
    int rc = 0;
    for (int k = 0; k < 2 && rc == 0; k++) {
        for (long r = 0; r < reps && rc == 0; r++) {
            double p, d;
            rc = bench_case(m, pool, ids, (int32_t)n, batches[k], (int32_t)steps, &p, &d);
            if (p > pf[k]) pf[k] = p;
            if (d > dc[k]) dc[k] = d;
        }
        printf("%-8d %16.1f %16.1f\n", batches[k], pf[k], dc[k]);
    }
    printf("{\"threads\": %ld, \"isa\": \"%s\", \"prompt_tokens\": %ld, \"prefill_tps\": %.1f, "
           "\"decode_tps\": %.1f, \"prefill4_tps\": %.1f, \"decode4_tps\": %.1f}\n",
           threads, qmat_isa_name(qmat_isa()), n, pf[0], dc[0], pf[1], dc[1]);
    pool_destroy(pool);
    free(ids);
    free(text);
    tokenizer_free(tok);
    return rc == 0 ? 0 : 1;
}

/* ---- eval ------------------------------------------------------------------------------------- */

static kv_cache_t *make_contig(const kv_shape_t *shape, pool_t *pool, void *ctx) {
    (void)ctx;
    return kv_contig_create(shape, pool);
}

/* KV variants the eval knows. The libkvpage formats (fp16, bf16, int8,
 * int4, k8v4, fp8_e4m3) join this table once the paged cache lands. */
static const eval_variant_t known_variants[] = {{"fp32", make_contig, NULL}};

static void eval_progress(void *ctx, int32_t w, int32_t n) {
    (void)ctx;
    fprintf(stderr, "\reval: window %d/%d", w + 1, n);
    if (w + 1 == n) fputc('\n', stderr);
}

static int parse_variants(const char *list, eval_variant_t *out, int32_t *n) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", list);
    *n = 0;
    for (char *save = NULL, *name = strtok_r(buf, ",", &save); name; name = strtok_r(NULL, ",", &save)) {
        size_t k = 0;
        while (k < sizeof known_variants / sizeof *known_variants && strcmp(known_variants[k].name, name)) k++;
        if (k == sizeof known_variants / sizeof *known_variants || *n >= 16) {
            fprintf(stderr, "kvpage-engine eval: KV variant '%s' is not available yet (have: fp32)\n", name);
            return -1;
        }
        out[(*n)++] = known_variants[k];
    }
    return *n > 0 ? 0 : -1;
}

static void eval_print(const char *file, int32_t n_tokens, const eval_cfg_t *cfg, const eval_variant_t *v,
                       const eval_result_t *r, int32_t nv) {
    double ref = eval_ppl(&r[0]);
    printf("\n%-10s %10s %9s %12s %10s %8s %9s\n", "kv", "ppl", "dppl%", "mean KLD", "max KLD", "top1", "seconds");
    for (int32_t i = 0; i < nv; i++)
        printf("%-10s %10.4f %+8.3f%% %12.6f %10.6f %7.2f%% %9.1f\n", v[i].name, eval_ppl(&r[i]),
               100 * (eval_ppl(&r[i]) / ref - 1), r[i].kl_sum / r[i].scored, r[i].kl_max,
               100.0 * r[i].top1_same / r[i].scored, r[i].seconds);
    printf("(%s: %d tokens, window %d, stride %d, %lld tokens scored; KLD and top-1 against %s)\n", file,
           n_tokens, cfg->window, cfg->stride, (long long)r[0].scored, v[0].name);
    printf("{\"ppl\": {");
    for (int32_t i = 0; i < nv; i++) printf("%s\"%s\": %.6f", i ? ", " : "", v[i].name, eval_ppl(&r[i]));
    printf("}, \"kld\": {");
    for (int32_t i = 0; i < nv; i++) printf("%s\"%s\": %.8f", i ? ", " : "", v[i].name, r[i].kl_sum / r[i].scored);
    printf("}, \"top1\": {");
    for (int32_t i = 0; i < nv; i++)
        printf("%s\"%s\": %.6f", i ? ", " : "", v[i].name, (double)r[i].top1_same / r[i].scored);
    printf("}, \"tokens\": %lld, \"window\": %d, \"stride\": %d, \"reference\": \"%s\"}\n", (long long)r[0].scored,
           cfg->window, cfg->stride, v[0].name);
}

static int cmd_eval(model_t *m, int argc, char **argv) {
    const char *file = "/usr/share/common-licenses/GPL-3", *kvlist = "fp32";
    eval_cfg_t cfg = {512, 256, 512, eval_progress, NULL};
    long max_tokens = 0, threads = 2;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--file")) file = opt_value(argc, argv, &i);
        else if (!strcmp(argv[i], "--window")) cfg.window = (int32_t)opt_long(argc, argv, &i, 2, 1 << 16);
        else if (!strcmp(argv[i], "--stride")) cfg.stride = (int32_t)opt_long(argc, argv, &i, 1, 1 << 16);
        else if (!strcmp(argv[i], "--max-tokens")) max_tokens = opt_long(argc, argv, &i, 2, 1L << 30);
        else if (!strcmp(argv[i], "--threads")) threads = opt_long(argc, argv, &i, 1, 256);
        else if (!strcmp(argv[i], "--kv")) kvlist = opt_value(argc, argv, &i);
        else {
            fprintf(stderr, "kvpage-engine eval: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    if (cfg.stride > cfg.window) {
        fprintf(stderr, "kvpage-engine eval: --stride must not exceed --window\n");
        return 2;
    }
    cfg.chunk = cfg.window;
    eval_variant_t variants[16];
    int32_t nv;
    if (parse_variants(kvlist, variants, &nv)) return 2;
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
    eval_result_t res[16];
    printf("kvpage-engine eval: %s, %zu bytes -> %d tokens; %d windows; %ld threads, %s kernels\n", file, len, n,
           eval_windows(n, cfg.window, cfg.stride), threads, qmat_isa_name(qmat_isa()));
    int rc = pool ? eval_run(m, pool, ids, n, &cfg, variants, nv, res) : KV_ENOMEM;
    if (rc == 0) eval_print(file, n, &cfg, variants, res, nv);
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
    const char *cmd = argv[1], *path = argv[2];
    if (!strcmp(cmd, "dump") || !strcmp(cmd, "--dump")) return cmd_dump(path);
    if (strcmp(cmd, "tokenize") && strcmp(cmd, "demo") && strcmp(cmd, "eval") && strcmp(cmd, "bench")) {
        fprintf(stderr, "kvpage-engine: unknown command '%s'\n", cmd);
        usage(stderr);
        return 2;
    }
    char err[ERR_LEN];
    model_t *m = model_load(path, err, sizeof err);
    if (!m) {
        fprintf(stderr, "kvpage-engine: %s\n", err);
        return 1;
    }
    int rc = !strcmp(cmd, "tokenize") ? cmd_tokenize(m, argc - 3, argv + 3)
             : !strcmp(cmd, "demo")   ? cmd_demo(m, argc - 3, argv + 3)
             : !strcmp(cmd, "bench")  ? cmd_bench(m, argc - 3, argv + 3)
                                      : cmd_eval(m, argc - 3, argv + 3);
    model_free(m);
    return rc;
}
