/*
 * libFuzzer harness: page blobs from outside the process — kvp_blob_validate(),
 * kvp_blob_import() and kvp_cache_seq_import() on arbitrary bytes, and on
 * valid blobs mutated and then re-sealed (checksum recomputed), so that the
 * checks behind the checksum (identity, layout, chain hash, token count,
 * payload invariants) and the kernels reading what passes are reached.
 *
 *   make fuzz FUZZ_TARGETS=blob FUZZ_SECONDS=60
 *
 * Input: byte 0 picks the K/V formats, byte 1 the mode; the rest drives it.
 *   mode 0: the rest is one blob, validated and imported into a pool page
 *           and into a staging page;
 *   mode 1: a valid exported blob, mutated (offset, value) pairs from the
 *           input, re-sealed or not, validated and imported;
 *   mode 2: a sequence of 2.5 pages exported from one cache, its bytes
 *           mutated (each blob re-sealed or not), imported into another
 *           cache, which then runs a decode step (append + attention) over it.
 *
 * Oracles besides the sanitizers: statuses are KVP_OK or documented codes; a
 * rejection has a reason in range, counts in the codec's statistics and
 * leaves the target page byte for byte as it was; an accepted blob's header
 * names this codec's identity and layout, and its payload is what the page
 * holds afterwards; a blob whose identity fields were changed is never
 * accepted; a failed sequence import leaves the sequence empty; attention
 * over an imported sequence succeeds.
 * tests/test_fuzz_blob.c replays the corpus and random inputs in `make test`.
 */
#define _POSIX_C_SOURCE 200809L
#include "kvpage.h"
#include "kvpage_blob.h"
#include "kvpage_ext.h"
#include "kvpage_tier.h"

#include <stdlib.h>
#include <string.h>

#ifdef KVP_HAVE_BLOB
#include <xxhash.h>
#endif

#include "fuzz_input.h"

#define FB_LAYERS 2
#define FB_HEADS 2
#define FB_DIM 64
#define FB_PAGE 4
#define FB_PAGES 8
#define FB_HDR KVP_BLOB_HEADER_BYTES

static const int32_t FB_FORMATS[][2] = {
    {KVP_FORMAT_FP16, KVP_FORMAT_FP16}, {KVP_FORMAT_BF16, KVP_FORMAT_BF16},
    {KVP_FORMAT_FP8_E4M3, KVP_FORMAT_FP8_E4M3}, {KVP_FORMAT_INT8, KVP_FORMAT_INT8},
    {KVP_FORMAT_INT8, KVP_FORMAT_INT4}, {KVP_FORMAT_INT4, KVP_FORMAT_INT4},
    {KVP_FORMAT_FP32, KVP_FORMAT_FP32}, {KVP_FORMAT_INT4_V1, KVP_FORMAT_INT4_V1}};
#define FB_NFORMATS ((uint8_t)(sizeof FB_FORMATS / sizeof FB_FORMATS[0]))

static const uint8_t FB_FP[32] = {0x5a, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15,
                                  16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31};

/* Recompute a blob's checksum (and clear the tag flag's effect: these
 * blobs are unauthenticated), as a writer who means harm could. */
static void fb_reseal(uint8_t *b, size_t n) {
#ifdef KVP_HAVE_BLOB
    if (n < FB_HDR) return;
    XXH3_state_t *st = XXH3_createState();
    FZI_ASSERT(st != NULL);
    XXH3_128bits_reset(st);
    XXH3_128bits_update(st, b, 128);
    XXH3_128bits_update(st, b + FB_HDR, n - FB_HDR);
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits_digest(st));
    memcpy(b + 128, c.digest, 16);
    XXH3_freeState(st);
#else
    (void)b, (void)n;
#endif
}

static kvp_cache_t *fb_cache(int32_t kf, int32_t vf) {
    kvp_cache_params_t cp;
    kvp_cache_params_init(&cp);
    cp.layers = FB_LAYERS;
    cp.kv_heads = FB_HEADS;
    cp.head_dim = FB_DIM;
    cp.page_size = FB_PAGE;
    cp.k_format = kf;
    cp.v_format = vf;
    cp.max_seqs = 2;
    cp.num_pages = FB_PAGES;
    kvp_cache_t *c = NULL;
    FZI_ASSERT(kvp_cache_create(&cp, &c, NULL, 0) == KVP_OK);
    kvp_cache_parts_t parts = {.struct_size = sizeof parts};
    kvp_cache_parts(c, &parts);
    for (int32_t l = 0; l < FB_LAYERS; l++)
        for (int32_t h = 0; h < FB_HEADS; h++)
            for (int32_t side = 0; side < 2; side++)
                kvp_store_set_fp8_scale(parts.store, l, h, side, 0.05f); /* fails unless fp8 */
    kvp_blob_params_t bp;
    kvp_blob_params_init(&bp);
    memcpy(bp.fingerprint, FB_FP, 32);
    FZI_ASSERT(kvp_cache_set_blob(c, &bp) == KVP_OK);
    return c;
}

/* One step of `n` tokens for `seq` with K/V and queries from `seed`. */
static int fb_step(kvp_cache_t *c, int32_t seq, int32_t n, const int32_t *tokens, uint32_t seed,
                   int attend) {
    float k[FB_PAGE * 3 * FB_HEADS * FB_DIM], v[FB_PAGE * 3 * FB_HEADS * FB_DIM];
    float q[FB_PAGE * 3 * FB_HEADS * FB_DIM], out[FB_PAGE * 3 * FB_HEADS * FB_DIM];
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        seed = seed * 1664525u + 1013904223u;
        k[i] = (float)((int32_t)(seed >> 8) % 2001 - 1000) * 0.001f;
        v[i] = (float)((int32_t)(seed >> 12) % 2001 - 1000) * 0.001f;
        q[i] = (float)((int32_t)(seed >> 4) % 2001 - 1000) * 0.001f;
    }
    int rc = kvp_cache_begin_step(c, &seq, 1, &n, tokens);
    for (int32_t l = 0; l < FB_LAYERS && rc == KVP_OK; l++) {
        rc = kvp_cache_write(c, l, KVP_FORMAT_FP32, k, v, 0, 0);
        if (rc != KVP_OK || !attend) continue;
        kvp_attention_params_t ap;
        kvp_attention_params_init(&ap);
        ap.layer = l;
        ap.q_heads = FB_HEADS;
        ap.q = q;
        ap.out = out;
        rc = kvp_cache_attend(c, &ap);
    }
    return rc;
}

static kvp_blob_codec_t *fb_codec(kvp_cache_t *c) {
    kvp_blob_codec_t *codec = NULL;
    FZI_ASSERT(kvp_cache_blob_codec(c, &codec) == KVP_OK);
    return codec;
}

static kvp_store_t *fb_store(kvp_cache_t *c) {
    kvp_cache_parts_t parts = {.struct_size = sizeof parts};
    FZI_ASSERT(kvp_cache_parts(c, &parts) == KVP_OK);
    return parts.store;
}

/* Import `blob` into `page`: a rejection leaves the page as it was; an
 * accepted blob leaves the payload in it. */
static void fb_import(kvp_cache_t *c, int32_t page, const uint8_t *blob, size_t n, int32_t tokens) {
    kvp_store_t *s = fb_store(c);
    kvp_blob_codec_t *codec = fb_codec(c);
    kvp_layout_t l = {.struct_size = sizeof l};
    FZI_ASSERT(kvp_store_layout(s, &l) == KVP_OK);
    uint64_t bytes = page >= FB_PAGES ? l.staging_page_bytes : l.page_bytes;
    uint8_t *before = malloc(bytes), *after = malloc(bytes);
    FZI_ASSERT(before && after);
    FZI_ASSERT(kvp_store_page_to_host(s, page, 0, before, bytes) == KVP_OK);
    kvp_blob_stats_t st0 = {.struct_size = sizeof st0}, st1 = {.struct_size = sizeof st1};
    kvp_blob_codec_stats(codec, &st0);
    int32_t reason = -1;
    int rc = kvp_blob_import(codec, page, blob, n, NULL, tokens, &reason);
    FZI_ASSERT(rc == KVP_OK || rc == KVP_EBADBLOB);
    kvp_blob_codec_stats(codec, &st1);
    FZI_ASSERT(kvp_store_page_to_host(s, page, 0, after, bytes) == KVP_OK);
    if (rc == KVP_EBADBLOB) {
        FZI_ASSERT(reason > KVP_BLOB_OK && reason < KVP_BLOB_REASONS);
        FZI_ASSERT(st1.rejected == st0.rejected + 1 && st1.rejects[reason] == st0.rejects[reason] + 1);
        FZI_ASSERT(memcmp(before, after, bytes) == 0);
        FZI_ASSERT(kvp_blob_codec_last_error(codec)[0] != '\0');
    } else {
        FZI_ASSERT(reason == KVP_BLOB_OK && n == FB_HDR + bytes);
        FZI_ASSERT(memcmp(blob + 16, FB_FP, 32) == 0); /* this codec's fingerprint */
        FZI_ASSERT(memcmp(blob + FB_HDR, after, bytes) == 0);
        FZI_ASSERT(kvp_store_page_check(s, page, after, bytes) == KVP_OK);
    }
    free(before);
    free(after);
}

/* A valid blob of page 0 (full) or the staging page (partial). */
static uint8_t *fb_export(kvp_cache_t *c, int staging, size_t *n) {
    kvp_blob_codec_t *codec = fb_codec(c);
    uint64_t size = 0;
    if (kvp_blob_size(codec, staging, &size) != KVP_OK) return NULL;
    uint8_t *b = malloc(size);
    FZI_ASSERT(b != NULL);
    kvp_hash_t h;
    memset(&h, 0x33, sizeof h);
    int rc = kvp_blob_export(codec, staging ? FB_PAGES : 0, staging ? FB_PAGE - 1 : FB_PAGE, &h, b,
                             size);
    FZI_ASSERT(rc == KVP_OK);
    *n = size;
    return b;
}

/* Set bytes of `b` from the input; *identity_changed: whether the first
 * blob's fingerprint, layout, formats, key order or shard (bytes 16..79)
 * differ afterwards, which no reader may accept. */
static void fb_mutate(fzi_cursor *in, uint8_t *b, size_t n, int *identity_changed) {
    uint8_t before[64];
    if (n >= 80) memcpy(before, b + 16, 64);
    int count = (int)fzi_below(in, 8);
    for (int i = 0; i < count && n > 0; i++) {
        size_t range = fzi_u8(in) & 1 ? (FB_HDR < n ? FB_HDR : n) : n;
        size_t off = fzi_u16(in) % range;
        b[off] = fzi_u8(in);
    }
    *identity_changed = n >= 80 && memcmp(before, b + 16, 64) != 0;
}

static void fb_seq(fzi_cursor *in, kvp_cache_t *a, kvp_cache_t *b) {
    int32_t tokens[FB_PAGE * 3], n = FB_PAGE * 2 + FB_PAGE / 2, sa = -1, sb = -1;
    for (int32_t i = 0; i < FB_PAGE * 3; i++) tokens[i] = (int32_t)fzi_u16(in);
    FZI_ASSERT(kvp_cache_seq_create(a, 0, 0, &sa) == KVP_OK);
    FZI_ASSERT(fb_step(a, sa, n, tokens, fzi_u32(in), 0) == KVP_OK);
    int32_t blobs = 0;
    uint64_t bytes = 0;
    FZI_ASSERT(kvp_cache_seq_export_size(a, sa, &blobs, &bytes) == KVP_OK && blobs == 3);
    uint8_t *buf = malloc(bytes);
    FZI_ASSERT(buf != NULL);
    FZI_ASSERT(kvp_cache_seq_export(a, sa, tokens, n, buf, bytes) == KVP_OK);
    int changed = 0;
    fb_mutate(in, buf, (size_t)bytes, &changed);
    uint8_t reseal = fzi_u8(in);
    for (uint64_t off = 0, i = 0; i < 3 && off + FB_HDR <= bytes; i++) {
        uint64_t len = 0;
        for (int j = 7; j >= 0; j--) len = len << 8 | buf[off + 80 + (uint64_t)j];
        if (len > bytes - off - FB_HDR) break;
        if (reseal & (1u << i)) fb_reseal(buf + off, (size_t)(FB_HDR + len));
        off += FB_HDR + len;
    }
    uint64_t cut = fzi_u8(in) == 0 ? fzi_u16(in) % (bytes + 1) : bytes;
    FZI_ASSERT(kvp_cache_seq_create(b, 0, 0, &sb) == KVP_OK);
    int32_t reason = 0;
    int rc = kvp_cache_seq_import(b, sb, tokens, n, buf, cut, &reason);
    FZI_ASSERT(rc == KVP_OK || rc == KVP_EBADBLOB || rc == KVP_ENOSPC);
    kvp_seq_info_t info = {.struct_size = sizeof info};
    kvp_cache_parts_t parts = {.struct_size = sizeof parts};
    kvp_cache_parts(b, &parts);
    FZI_ASSERT(kvp_table_seq_info(parts.table, sb, &info) == KVP_OK);
    if (rc != KVP_OK) {
        FZI_ASSERT(info.length == 0);
    } else {
        FZI_ASSERT(!changed && info.length == n);
        FZI_ASSERT(fb_step(b, sb, 1, tokens + n, 7, 1) == KVP_OK); /* the kernels read it */
    }
    free(buf);
    kvp_cache_seq_release(a, sa);
    kvp_cache_seq_release(b, sb);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fzi_cursor in = fzi_make(data, size);
    const int32_t *f = FB_FORMATS[fzi_u8(&in) % FB_NFORMATS];
    uint8_t mode = fzi_u8(&in) % 3;
    if (!kvp_build_has(KVP_FEATURE_BLOB)) return 0; /* test_blob.c checks KVP_ENOTSUP */
    kvp_cache_t *a = fb_cache(f[0], f[1]), *b = fb_cache(f[0], f[1]);
    int32_t tokens[2 * FB_PAGE];
    for (int32_t i = 0; i < 2 * FB_PAGE; i++) tokens[i] = i;
    int32_t sa = -1;
    FZI_ASSERT(kvp_cache_seq_create(a, 0, 0, &sa) == KVP_OK);
    FZI_ASSERT(fb_step(a, sa, FB_PAGE + FB_PAGE - 1, tokens, 42, 0) == KVP_OK);
    int staged = f[0] == KVP_FORMAT_INT8 || f[0] == KVP_FORMAT_INT4 || f[0] == KVP_FORMAT_INT4_V1;
    if (mode == 0) {
        size_t n = in.n;
        uint8_t *blob = malloc(n + 1);
        FZI_ASSERT(blob != NULL);
        fzi_bytes(&in, blob, n);
        fb_import(b, 0, blob, n, 0);
        if (staged) fb_import(b, FB_PAGES, blob, n, 0);
        free(blob);
    } else if (mode == 1) {
        int staging = staged && (fzi_u8(&in) & 1);
        size_t n = 0;
        uint8_t *blob = fb_export(a, staging, &n);
        int changed = 0;
        fb_mutate(&in, blob, n, &changed);
        if (fzi_u8(&in) & 1) fb_reseal(blob, n);
        int32_t page = staging ? FB_PAGES : 1;
        fb_import(b, page, blob, n, 0);
        kvp_blob_codec_t *codec = fb_codec(b);
        int rc = kvp_blob_validate(codec, blob, n, NULL, 0, NULL, NULL);
        FZI_ASSERT(rc == KVP_OK || rc == KVP_EBADBLOB);
        if (changed) FZI_ASSERT(rc == KVP_EBADBLOB);
        free(blob);
    } else {
        fb_seq(&in, a, b);
    }
    kvp_cache_destroy(a);
    kvp_cache_destroy(b);
    return 0;
}
