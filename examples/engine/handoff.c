#define _POSIX_C_SOURCE 200809L
#include "handoff.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve.h" /* sample_argmax */

/* ---- greedy generation of one sequence ---------------------------------------------------- */

int gen_prefill(const gen_cfg_t *g, const int32_t *prompt, int32_t n, int32_t *seq, int32_t *cached,
                int32_t *first) {
    kv_cache_t *kv = g->kv;
    const int32_t vocab = model_cfg(g->model)->vocab;
    if (n < 1 || g->chunk < 1) return KV_EINVAL;
    int rc = kv->ops->seq_open(kv, seq);
    if (rc != KV_OK) return rc;
    int32_t at = kv->ops->seq_attach_prefix(kv, *seq, prompt, n);
    *cached = at;
    float *lg = malloc(sizeof(float) * (size_t)vocab);
    if (!lg) return KV_ENOMEM;
    while (rc == KV_OK && at < n) {
        int32_t take = n - at < g->chunk ? n - at : g->chunk, q[2] = {0, take}, row = take - 1;
        kv_batch_t b = {1, seq, q, prompt + at};
        rc = model_forward(g->model, kv, g->pool, &b, &row, at + take == n, lg);
        at += take;
    }
    if (rc == KV_OK) *first = sample_argmax(lg, vocab);
    free(lg);
    return rc;
}

int gen_decode(const gen_cfg_t *g, int32_t seq, int32_t first, int32_t max_new, int32_t *out,
               int32_t *n_out) {
    const int32_t vocab = model_cfg(g->model)->vocab;
    *n_out = 0;
    if (max_new < 1) return KV_EINVAL;
    float *lg = malloc(sizeof(float) * (size_t)vocab);
    if (!lg) return KV_ENOMEM;
    int rc = KV_OK;
    int32_t tok = first;
    out[(*n_out)++] = tok;
    while (rc == KV_OK && *n_out < max_new && tok != g->eos) {
        int32_t q[2] = {0, 1}, row = 0;
        kv_batch_t b = {1, &seq, q, &tok};
        rc = model_forward(g->model, g->kv, g->pool, &b, &row, 1, lg);
        if (rc == KV_OK) out[(*n_out)++] = tok = sample_argmax(lg, vocab);
    }
    free(lg);
    return rc;
}

/* ---- the handoff file ------------------------------------------------------------------ */

static void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

int handoff_write(const char *path, const handoff_t *h, char *err, size_t err_size) {
    if (h->n_tokens < 1 || !h->tokens || (h->blob_bytes && !h->blobs)) {
        snprintf(err, err_size, "handoff: nothing to write");
        return -1;
    }
    uint8_t hdr[HANDOFF_HEADER_BYTES] = {0};
    memcpy(hdr, HANDOFF_MAGIC, 8);
    put_u32(hdr + 8, 1);
    put_u32(hdr + 12, HANDOFF_HEADER_BYTES);
    put_u32(hdr + 16, (uint32_t)h->n_tokens);
    put_u32(hdr + 20, (uint32_t)h->first_token);
    put_u32(hdr + 24, (uint32_t)h->k_format);
    put_u32(hdr + 28, (uint32_t)h->v_format);
    put_u32(hdr + 32, (uint32_t)h->page_size);
    put_u64(hdr + 40, h->blob_bytes);
    memcpy(hdr + 48, h->fingerprint, KV_FINGERPRINT_BYTES);
    uint8_t *ids = malloc((size_t)h->n_tokens * 4);
    if (!ids) {
        snprintf(err, err_size, "handoff: out of memory");
        return -1;
    }
    for (int32_t i = 0; i < h->n_tokens; i++) put_u32(ids + 4 * (size_t)i, (uint32_t)h->tokens[i]);
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 16);
    FILE *f = NULL;
    if (tmp) {
        snprintf(tmp, plen + 16, "%s.tmp", path);
        f = fopen(tmp, "wb");
    }
    int ok = f && fwrite(hdr, 1, sizeof hdr, f) == sizeof hdr &&
             fwrite(ids, 4, (size_t)h->n_tokens, f) == (size_t)h->n_tokens &&
             (h->blob_bytes == 0 || fwrite(h->blobs, 1, (size_t)h->blob_bytes, f) == h->blob_bytes);
    int saved = errno;
    if (f && fclose(f) != 0 && ok) ok = 0, saved = errno;
    if (ok && rename(tmp, path) != 0) ok = 0, saved = errno;
    if (!ok) {
        snprintf(err, err_size, "handoff: cannot write %s: %s", path, strerror(saved));
        if (tmp) remove(tmp);
    }
    free(tmp);
    free(ids);
    return ok ? 0 : -1;
}

int handoff_read(const char *path, handoff_t *h, char *err, size_t err_size) {
    memset(h, 0, sizeof *h);
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, err_size, "handoff: cannot open %s: %s", path, strerror(errno));
        return -1;
    }
    uint8_t hdr[HANDOFF_HEADER_BYTES];
    const char *why = NULL;
    long size = -1;
    if (fseek(f, 0, SEEK_END) == 0) size = ftell(f);
    if (size < 0 || fseek(f, 0, SEEK_SET) != 0) why = "cannot seek";
    else if (fread(hdr, 1, sizeof hdr, f) != sizeof hdr) why = "shorter than its header";
    else if (memcmp(hdr, HANDOFF_MAGIC, 8) != 0) why = "not a kvpage-engine handoff file (magic)";
    else if (get_u32(hdr + 8) != 1 || get_u32(hdr + 12) != HANDOFF_HEADER_BYTES) why = "another version";
    if (!why) {
        uint32_t n = get_u32(hdr + 16);
        h->blob_bytes = get_u64(hdr + 40);
        if (n < 1 || n > (1u << 24)) why = "bad token count";
        else if ((uint64_t)size != HANDOFF_HEADER_BYTES + 4ull * n + h->blob_bytes)
            why = "its size is not what its header says (truncated or extended)";
        else {
            h->n_tokens = (int32_t)n;
            h->first_token = (int32_t)get_u32(hdr + 20);
            h->k_format = (int32_t)get_u32(hdr + 24);
            h->v_format = (int32_t)get_u32(hdr + 28);
            h->page_size = (int32_t)get_u32(hdr + 32);
            memcpy(h->fingerprint, hdr + 48, KV_FINGERPRINT_BYTES);
            uint8_t *ids = malloc(4 * (size_t)n);
            h->tokens = malloc(sizeof(int32_t) * (size_t)n);
            h->blobs = malloc(h->blob_bytes ? (size_t)h->blob_bytes : 1);
            if (!ids || !h->tokens || !h->blobs) why = "out of memory";
            else if (fread(ids, 4, n, f) != n || fread(h->blobs, 1, (size_t)h->blob_bytes, f) != h->blob_bytes)
                why = "read error";
            else
                for (uint32_t i = 0; i < n; i++) h->tokens[i] = (int32_t)get_u32(ids + 4 * (size_t)i);
            free(ids);
        }
    }
    fclose(f);
    if (why) {
        snprintf(err, err_size, "handoff: %s: %s", path, why);
        handoff_free(h);
        return -1;
    }
    return 0;
}

void handoff_free(handoff_t *h) {
    free(h->tokens);
    free(h->blobs);
    h->tokens = NULL;
    h->blobs = NULL;
}
