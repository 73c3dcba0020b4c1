/*
 * Layer: blob — page blobs, chain hashes, and the cache façade's use of
 * them: the published chain-hash test vectors, bit-exact export/import for
 * every format, a reason for every corrupt, foreign or forged blob,
 * sequence transfer between two caches, blob tiers (a small in-memory tier
 * written here, so this program does not depend on the file tier), events,
 * and allocation failures.
 *
 * The header fields, checksum, tag and chain hashes are checked against
 * OpenSSL and libxxhash directly, from docs/blob-format.md's description,
 * not against the library's own helpers.
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>

#include "kvpage.h"
#include "kvpage_blob.h"
#include "kvpage_ext.h"
#include "kvpage_plan.h"
#include "kvpage_tier.h"
#include "testutil.h"

#include "backend.h" /* the store's block formats: which bytes are padding */

#ifdef KVP_HAVE_BLOB
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <xxhash.h>
#endif

#define HDR KVP_BLOB_HEADER_BYTES

/* ---- little-endian fields --------------------------------------------------- */

static uint32_t rd16(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8; }
static uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t rd64(const uint8_t *p) { return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32; }
static void wr16(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static void wr32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void wr64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* ---- the primitives, straight from the libraries --------------------------- */

#ifdef KVP_HAVE_BLOB
static void ref_sha256(const void *a, size_t na, const void *b, size_t nb, uint8_t out[32]) {
    EVP_MD_CTX *m = EVP_MD_CTX_new();
    assert_non_null(m);
    unsigned len = 0;
    assert_int_equal(EVP_DigestInit_ex(m, EVP_sha256(), NULL), 1);
    assert_int_equal(EVP_DigestUpdate(m, a, na), 1);
    if (nb > 0) assert_int_equal(EVP_DigestUpdate(m, b, nb), 1);
    assert_int_equal(EVP_DigestFinal_ex(m, out, &len), 1);
    assert_int_equal(len, 32);
    EVP_MD_CTX_free(m);
}

static void ref_hmac(const uint8_t *key, int keylen, const uint8_t *a, size_t na,
                     const uint8_t *b, size_t nb, uint8_t out[32]) {
    uint8_t *cat = malloc(na + nb);
    assert_non_null(cat);
    memcpy(cat, a, na);
    memcpy(cat + na, b, nb);
    unsigned len = 0;
    assert_non_null(HMAC(EVP_sha256(), key, keylen, cat, na + nb, out, &len));
    assert_int_equal(len, 32);
    free(cat);
}

/* XXH3-128, seed 0, canonical (big-endian) bytes. */
static void ref_xxh128(const void *a, size_t na, const void *b, size_t nb, uint8_t out[16]) {
    XXH3_state_t *s = XXH3_createState();
    assert_non_null(s);
    XXH3_128bits_reset(s);
    XXH3_128bits_update(s, a, na);
    XXH3_128bits_update(s, b, nb);
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits_digest(s));
    memcpy(out, c.digest, 16);
    XXH3_freeState(s);
}

static uint64_t ref_xxh64(const void *a, size_t n) { return XXH3_64bits(a, n); }
#else
static void ref_sha256(const void *a, size_t na, const void *b, size_t nb, uint8_t out[32]) {
    (void)a, (void)na, (void)b, (void)nb, (void)out;
    fail_msg("built without the blob feature");
}
static void ref_hmac(const uint8_t *key, int keylen, const uint8_t *a, size_t na,
                     const uint8_t *b, size_t nb, uint8_t out[32]) {
    (void)key, (void)keylen, (void)a, (void)na, (void)b, (void)nb, (void)out;
    fail_msg("built without the blob feature");
}
static void ref_xxh128(const void *a, size_t na, const void *b, size_t nb, uint8_t out[16]) {
    (void)a, (void)na, (void)b, (void)nb, (void)out;
    fail_msg("built without the blob feature");
}
static uint64_t ref_xxh64(const void *a, size_t n) {
    (void)a, (void)n;
    fail_msg("built without the blob feature");
    return 0;
}
#endif

/* Recompute a forged blob's checksum (and tag, with a key), as a writer
 * that means harm, or a buggy one, would. */
static void reseal(uint8_t *b, uint64_t bytes, const uint8_t *key, int keylen) {
    ref_xxh128(b, 128, b + HDR, (size_t)(bytes - HDR), b + 128);
    if (keylen > 0) ref_hmac(key, keylen, b, 144, b + HDR, (size_t)(bytes - HDR), b + 144);
}

/* The chain root and a page's hash as docs/blob-format.md defines them. */
static void ref_root(const uint8_t fp[32], const int32_t fields[7], uint32_t shard,
                     uint32_t count, uint64_t salt, uint8_t out[32]) {
    uint8_t b[88];
    memset(b, 0, sizeof b);
    memcpy(b, "kvpage chain v1", 15);
    memcpy(b + 16, fp, 32);
    for (int i = 0; i < 7; i++) wr32(b + 48 + 4 * i, (uint32_t)fields[i]);
    wr16(b + 76, shard);
    wr16(b + 78, count);
    wr64(b + 80, salt);
    ref_sha256(b, sizeof b, NULL, 0, out);
}

static void ref_page(const uint8_t parent[32], const int32_t *tokens, int n, uint8_t out[32]) {
    uint8_t *b = malloc(4 * (size_t)n + 1);
    assert_non_null(b);
    for (int i = 0; i < n; i++) wr32(b + 4 * i, (uint32_t)tokens[i]);
    ref_sha256(parent, 32, b, 4 * (size_t)n, out);
    free(b);
}

/* ---- random data --------------------------------------------------------------- */

typedef struct {
    uint64_t s;
} rng_t;

static uint64_t rng_next(rng_t *r) {
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [-2, 2). */
static float rng_float(rng_t *r) {
    return (float)((double)(rng_next(r) >> 11) * (4.0 / 9007199254740992.0) - 2.0);
}

static kvp_hash_t rand_hash(uint64_t seed) {
    rng_t r = {seed * 7919u + 1};
    kvp_hash_t h;
    for (int i = 0; i < 32; i++) h.bytes[i] = (uint8_t)rng_next(&r);
    return h;
}

/* ---- stores and codecs --------------------------------------------------------- */

typedef struct {
    int32_t layers, heads, dim, page, kf, vf, order;
} shape_t;

static kvp_layout_t layout_of(const kvp_store_t *s) {
    kvp_layout_t l;
    memset(&l, 0, sizeof l);
    l.struct_size = sizeof l;
    assert_int_equal(kvp_store_layout(s, &l), KVP_OK);
    return l;
}

static kvp_store_info_t info_of(const kvp_store_t *s) {
    kvp_store_info_t in;
    memset(&in, 0, sizeof in);
    in.struct_size = sizeof in;
    assert_int_equal(kvp_store_info(s, &in), KVP_OK);
    return in;
}

static bool is_fp8(int32_t f) { return f == KVP_FORMAT_FP8_E4M3; }

/* fp8 scales: a function of (layer, head, side), times `mul`. */
static void set_fp8(kvp_store_t *st, int32_t layers, int32_t heads, int32_t kf, int32_t vf,
                    float mul) {
    for (int side = 0; side < 2; side++) {
        if (!is_fp8(side ? vf : kf)) continue;
        for (int32_t l = 0; l < layers; l++)
            for (int32_t h = 0; h < heads; h++)
                assert_int_equal(kvp_store_set_fp8_scale(st, l, h, side,
                                                         mul * 0.01f * (float)(1 + l + 2 * h + 4 * side)),
                                 KVP_OK);
    }
}

/* A store of `pages` pool pages (and 2 staging pages when the layout needs them). */
static kvp_store_t *store_make(const shape_t *s, int32_t pages, const kvp_allocator_t *a) {
    kvp_layout_t l;
    memset(&l, 0, sizeof l);
    l.struct_size = sizeof l;
    assert_int_equal(kvp_layout_compute(s->layers, s->heads, s->dim, s->page, s->kf, s->vf, &l,
                                        NULL, 0),
                     KVP_OK);
    kvp_store_params_t p;
    kvp_store_params_init(&p);
    p.layers = s->layers;
    p.kv_heads = s->heads;
    p.head_dim = s->dim;
    p.page_size = s->page;
    p.k_format = s->kf;
    p.v_format = s->vf;
    p.k_order = s->order;
    p.num_pages = (uint64_t)pages;
    p.num_staging = l.needs_staging ? 2 : 0;
    if (a != NULL) p.allocator = *a;
    kvp_store_t *st = NULL;
    char err[KVP_ERR_SIZE] = "";
    int rc = kvp_store_create(&p, &st, err, sizeof err);
    if (rc != KVP_OK) print_error("store: %s\n", err);
    assert_int_equal(rc, KVP_OK);
    set_fp8(st, s->layers, s->heads, s->kf, s->vf, 1.0f);
    return st;
}

/* Write `tokens` random rows into a page: a pool page of a staging layout
 * through a seal of the whole page, any other page row by row. */
static void fill_page(kvp_store_t *st, int32_t page, int32_t tokens, uint64_t seed) {
    kvp_layout_t l = layout_of(st);
    kvp_store_info_t in = info_of(st);
    int32_t P = l.page_size, row = l.kv_heads * l.head_dim;
    bool staging = page >= in.num_pages;
    bool seal = l.needs_staging && !staging;
    if (seal) assert_int_equal(tokens, P);
    float *k = malloc(sizeof(float) * (size_t)P * (size_t)row);
    float *v = malloc(sizeof(float) * (size_t)P * (size_t)row);
    int64_t *slots = malloc(sizeof(int64_t) * (size_t)P);
    assert_true(k && v && slots);
    for (int32_t j = 0; j < tokens; j++) slots[j] = (int64_t)page * P + j;
    kvp_page_op_t op = {KVP_OP_SEAL, -1, page, 0, 0};
    rng_t r = {seed};
    for (int32_t layer = 0; layer < l.layers; layer++) {
        for (int32_t i = 0; i < tokens * row; i++) {
            k[i] = rng_float(&r) + ((i % 32) == 3 ? 4.0f : 0.0f);
            v[i] = rng_float(&r);
        }
        kvp_append_params_t a;
        kvp_append_params_init(&a);
        a.layer = layer;
        a.rows = tokens;
        a.dtype = KVP_FORMAT_FP32;
        a.k = k;
        a.v = v;
        a.slots = slots;
        if (seal) {
            a.ops = &op;
            a.num_ops = 1;
        }
        int rc = kvp_store_append(st, &a);
        if (rc != KVP_OK) print_error("append: %s\n", kvp_store_last_error(st));
        assert_int_equal(rc, KVP_OK);
    }
    free(k);
    free(v);
    free(slots);
}

static uint64_t page_size_bytes(const kvp_store_t *st, int32_t page) {
    kvp_layout_t l = layout_of(st);
    return page >= info_of(st).num_pages ? l.staging_page_bytes : l.page_bytes;
}

/* Fill a page's serialization with 0xff bytes (NaN in fp16 scales). */
static void junk_page(kvp_store_t *st, int32_t page) {
    uint64_t n = page_size_bytes(st, page);
    uint8_t *b = malloc((size_t)n);
    assert_non_null(b);
    memset(b, 0xff, (size_t)n);
    assert_int_equal(kvp_store_page_from_host(st, page, 0, b, n), KVP_OK);
    free(b);
}

/* A copy of a page's serialization. */
static uint8_t *page_copy(kvp_store_t *st, int32_t page) {
    uint64_t n = page_size_bytes(st, page);
    uint8_t *b = malloc((size_t)n);
    assert_non_null(b);
    assert_int_equal(kvp_store_page_to_host(st, page, 0, b, n), KVP_OK);
    return b;
}

/* A page's serialization as a blob carries it: block padding zeroed (what
 * no token wrote never leaves the process). */
static uint8_t *page_copy_scrubbed(kvp_store_t *st, int32_t page) {
    uint8_t *b = page_copy(st, page);
    bool staging = page >= st->num_pages;
    const kvp__blockfmt *fmt[2] = {staging ? &st->skfmt : &st->kfmt,
                                   staging ? &st->svfmt : &st->vfmt};
    uint64_t side[2] = {staging ? st->spage_stride_k : st->page_stride_k,
                        staging ? st->spage_stride_v : st->page_stride_v};
    int32_t H = st->layout.kv_heads;
    uint8_t *p = b;
    for (int32_t l = 0; l < st->layout.layers; l++)
        for (int sd = 0; sd < 2; sd++) {
            uint64_t block = side[sd] / (uint64_t)H, used = kvp__block_used_bytes(fmt[sd]);
            for (int32_t h = 0; h < H; h++)
                memset(p + (uint64_t)h * block + used, 0, (size_t)(block - used));
            p += side[sd];
        }
    return b;
}

static void fingerprint_of(uint8_t seed, uint8_t fp[KVP_FINGERPRINT_BYTES]) {
    for (int i = 0; i < KVP_FINGERPRINT_BYTES; i++) fp[i] = (uint8_t)(seed + i);
}

static kvp_blob_params_t bparams(uint8_t seed, int32_t shard, int32_t count, const uint8_t *key,
                                 int32_t keylen) {
    kvp_blob_params_t p;
    kvp_blob_params_init(&p);
    fingerprint_of(seed, p.fingerprint);
    p.shard_index = shard;
    p.shard_count = count;
    p.auth_key = key;
    p.auth_key_bytes = keylen;
    return p;
}

static kvp_blob_codec_t *codec_make(kvp_store_t *st, uint8_t seed, int32_t shard, int32_t count,
                                    const uint8_t *key, int32_t keylen) {
    kvp_blob_params_t p = bparams(seed, shard, count, key, keylen);
    kvp_blob_codec_t *c = NULL;
    char err[KVP_ERR_SIZE] = "";
    int rc = kvp_blob_codec_create(st, &p, &c, err, sizeof err);
    if (rc != KVP_OK) print_error("codec: %s\n", err);
    assert_int_equal(rc, KVP_OK);
    assert_non_null(c);
    return c;
}

static kvp_blob_stats_t stats_of(const kvp_blob_codec_t *c) {
    kvp_blob_stats_t st;
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    assert_int_equal(kvp_blob_codec_stats(c, &st), KVP_OK);
    return st;
}

/* A blob of one page (malloc'd; its size in *bytes). */
static uint8_t *blob_of(kvp_blob_codec_t *c, kvp_store_t *st, int32_t page, int32_t tokens,
                        const kvp_hash_t *hash, uint64_t *bytes) {
    uint64_t n = HDR + page_size_bytes(st, page);
    uint8_t *b = malloc((size_t)n + 64);
    assert_non_null(b);
    int rc = kvp_blob_export(c, page, tokens, hash, b, n);
    if (rc != KVP_OK) print_error("export: %s\n", kvp_blob_codec_last_error(c));
    assert_int_equal(rc, KVP_OK);
    *bytes = n;
    return b;
}

static void assert_hex(const kvp_hash_t *h, const char *hex) {
    char got[65];
    assert_int_equal(kvp_hash_hex(h, got), KVP_OK);
    assert_string_equal(got, hex);
}

/* Validation must refuse the blob for exactly `reason`, count it, and say it. */
static void expect_reject(kvp_blob_codec_t *c, const uint8_t *b, uint64_t n,
                          const kvp_hash_t *expect, int32_t tokens, int32_t reason) {
    kvp_blob_stats_t before = stats_of(c);
    int32_t r = -1;
    int rc = kvp_blob_validate(c, b, n, expect, tokens, NULL, &r);
    if (rc != KVP_EBADBLOB || r != reason)
        print_error("got %s (%s), expected %s: %s\n", kvp_status_name(rc),
                    kvp_blob_reason_name(r), kvp_blob_reason_name(reason),
                    kvp_blob_codec_last_error(c));
    assert_int_equal(rc, KVP_EBADBLOB);
    assert_int_equal(r, reason);
    kvp_blob_stats_t after = stats_of(c);
    assert_int_equal(after.rejected, before.rejected + 1);
    assert_int_equal(after.rejects[reason], before.rejects[reason] + 1);
    assert_int_equal(after.imported, before.imported);
    char want[64];
    snprintf(want, sizeof want, "(%s)", kvp_blob_reason_name(reason));
    assert_non_null(strstr(kvp_blob_codec_last_error(c), want));
}

static void expect_accept(kvp_blob_codec_t *c, const uint8_t *b, uint64_t n,
                          const kvp_hash_t *expect, int32_t tokens) {
    int32_t r = -1;
    int rc = kvp_blob_validate(c, b, n, expect, tokens, NULL, &r);
    if (rc != KVP_OK) print_error("rejected: %s\n", kvp_blob_codec_last_error(c));
    assert_int_equal(rc, KVP_OK);
    assert_int_equal(r, KVP_BLOB_OK);
}

/* Without the blob feature the codec says so, and the test stops here. */
static void require_blob(void) {
    if (kvp_build_has(KVP_FEATURE_BLOB)) return;
    shape_t s = {1, 1, 32, 4, KVP_FORMAT_FP16, KVP_FORMAT_FP16, 0};
    kvp_store_t *st = store_make(&s, 1, NULL);
    kvp_blob_params_t p = bparams(0, 0, 1, NULL, 0);
    kvp_blob_codec_t *c = NULL;
    assert_int_equal(kvp_blob_codec_create(st, &p, &c, NULL, 0), KVP_ENOTSUP);
    assert_null(c);
    kvp_store_destroy(st);
    skip();
}

/* ---- 1. chain hashes ---------------------------------------------------------- */

static void test_chain_vectors(void **state) {
    (void)state;
    require_blob();
    /* vector A */
    shape_t a = {2, 2, 64, 4, KVP_FORMAT_FP16, KVP_FORMAT_FP16, KVP_K_ORDER_TOKEN_MAJOR};
    kvp_store_t *sa = store_make(&a, 2, NULL);
    kvp_blob_codec_t *ca = codec_make(sa, 0, 0, 1, NULL, 0);
    kvp_hash_t root, h[3];
    assert_int_equal(kvp_blob_chain_root(ca, 0, &root), KVP_OK);
    assert_hex(&root, "f923d2b8c429134788bfc004d575b3c05b790a46036eafc0261aa9b7658c7f7f");
    int32_t ta[10];
    for (int i = 0; i < 10; i++) ta[i] = i + 1;
    assert_int_equal(kvp_blob_chain(ca, &root, ta, 10, h), KVP_OK);
    assert_hex(&h[0], "786beae07bd63d796af386a23212aed594684bb54288819d2508eaee340cad2b");
    assert_hex(&h[1], "a5eb7d2bdfedc79877c64713f58c10e48413f26bf552ee62d8aed595f1267389");
    assert_hex(&h[2], "0afe237f591e09f33fc34676f48b496dc83247ba3f175435012ecd7ef8526b7a");
    /* a chain continues from any page's hash */
    kvp_hash_t rest[2];
    assert_int_equal(kvp_blob_chain(ca, &h[0], ta + 4, 6, rest), KVP_OK);
    assert_memory_equal(rest[0].bytes, h[1].bytes, 32);
    assert_memory_equal(rest[1].bytes, h[2].bytes, 32);
    /* a partly filled page is named by its tokens only: not any full page */
    kvp_hash_t part[3];
    int32_t tb[12];
    memcpy(tb, ta, sizeof ta);
    tb[10] = 11;
    tb[11] = 12;
    assert_int_equal(kvp_blob_chain(ca, &root, tb, 12, part), KVP_OK);
    assert_memory_equal(part[1].bytes, h[1].bytes, 32);
    assert_memory_not_equal(part[2].bytes, h[2].bytes, 32);
    /* n = 0 names nothing and touches nothing */
    assert_int_equal(kvp_blob_chain(ca, &root, NULL, 0, NULL), KVP_OK);
    /* the salt is in the root */
    kvp_hash_t root1;
    assert_int_equal(kvp_blob_chain_root(ca, 1, &root1), KVP_OK);
    assert_memory_not_equal(root1.bytes, root.bytes, 32);

    /* vector B: int8 keys, int4_v1 values, shard 1 of 2 */
    shape_t b = {2, 2, 64, 4, KVP_FORMAT_INT8, KVP_FORMAT_INT4_V1, KVP_K_ORDER_TOKEN_MAJOR};
    kvp_store_t *sb = store_make(&b, 2, NULL);
    kvp_blob_codec_t *cb = codec_make(sb, 0, 1, 2, NULL, 0);
    assert_int_equal(kvp_blob_chain_root(cb, 0x0123456789abcdefull, &root), KVP_OK);
    assert_hex(&root, "1efd0f8f085a6886235ca1b122f8af5285ec3f4f1cbfbf150e9c32f2898ff549");
    const int32_t tbv[5] = {0, -1, 2147483647, INT32_MIN, 100000};
    assert_int_equal(kvp_blob_chain(cb, &root, tbv, 5, h), KVP_OK);
    assert_hex(&h[0], "a70df438596718211798ab5a623c5e840f80104b06d325b2437f722c5e92bc40");
    assert_hex(&h[1], "fc0d22b469f8f5d61bab35eff09a7f4c9172f28a40524b3664bd0c07ba3466c4");

    /* any shape: the library computes what the format page describes */
    shape_t c = {3, 4, 48, 6, KVP_FORMAT_FP8_E4M3, KVP_FORMAT_BF16, KVP_K_ORDER_DIM_MAJOR};
    kvp_store_t *sc = store_make(&c, 2, NULL);
    kvp_blob_codec_t *cc = codec_make(sc, 0x40, 3, 5, NULL, 0);
    rng_t r = {99};
    uint64_t salt = rng_next(&r);
    int32_t tc[23];
    for (int i = 0; i < 23; i++) tc[i] = (int32_t)(uint32_t)rng_next(&r);
    uint8_t fp[32], want[32];
    fingerprint_of(0x40, fp);
    const int32_t fields[7] = {3, 4, 48, 6, KVP_FORMAT_FP8_E4M3, KVP_FORMAT_BF16,
                               KVP_K_ORDER_DIM_MAJOR};
    ref_root(fp, fields, 3, 5, salt, want);
    assert_int_equal(kvp_blob_chain_root(cc, salt, &root), KVP_OK);
    assert_memory_equal(root.bytes, want, 32);
    kvp_hash_t hc[4];
    assert_int_equal(kvp_blob_chain(cc, &root, tc, 23, hc), KVP_OK);
    const uint8_t *prev = root.bytes;
    for (int i = 0; i < 4; i++) {
        ref_page(prev, tc + 6 * i, i == 3 ? 5 : 6, want);
        assert_memory_equal(hc[i].bytes, want, 32);
        prev = hc[i].bytes;
    }
    /* the key order is hashed into the root */
    c.order = KVP_K_ORDER_TOKEN_MAJOR;
    kvp_store_t *sd = store_make(&c, 2, NULL);
    kvp_blob_codec_t *cd = codec_make(sd, 0x40, 3, 5, NULL, 0);
    kvp_hash_t rootd;
    assert_int_equal(kvp_blob_chain_root(cd, salt, &rootd), KVP_OK);
    assert_memory_not_equal(rootd.bytes, root.bytes, 32);

    kvp_blob_codec_destroy(ca);
    kvp_blob_codec_destroy(cb);
    kvp_blob_codec_destroy(cc);
    kvp_blob_codec_destroy(cd);
    kvp_store_destroy(sa);
    kvp_store_destroy(sb);
    kvp_store_destroy(sc);
    kvp_store_destroy(sd);
}

/* ---- 2. export and import, every format ----------------------------------- */

static const int32_t FORMAT_PAIRS[][2] = {
    {KVP_FORMAT_FP32, KVP_FORMAT_FP32},     {KVP_FORMAT_FP16, KVP_FORMAT_FP16},
    {KVP_FORMAT_BF16, KVP_FORMAT_BF16},     {KVP_FORMAT_FP8_E4M3, KVP_FORMAT_FP8_E4M3},
    {KVP_FORMAT_INT8, KVP_FORMAT_INT8},     {KVP_FORMAT_INT4, KVP_FORMAT_INT4},
    {KVP_FORMAT_INT8, KVP_FORMAT_INT4},     {KVP_FORMAT_FP16, KVP_FORMAT_INT8},
    {KVP_FORMAT_BF16, KVP_FORMAT_INT4},     {KVP_FORMAT_FP8_E4M3, KVP_FORMAT_FP16},
};
#define NUM_PAIRS ((int)(sizeof FORMAT_PAIRS / sizeof FORMAT_PAIRS[0]))

/* Page `pb` of `stb` holds what page `pa` of `sta` holds in its first
 * `tokens` tokens (decoded bit for bit alike), and zeros after them: an
 * exported partly filled page carries encoded zeros past its tokens. */
static void assert_same_tokens(kvp_store_t *sta, int32_t pa, kvp_store_t *stb, int32_t pb,
                               int32_t tokens) {
    kvp_layout_t l = layout_of(sta);
    size_t row = (size_t)l.kv_heads * (size_t)l.head_dim, n = (size_t)l.page_size * row;
    float *ka = calloc(n, 4), *va = calloc(n, 4), *kb = calloc(n, 4), *vb = calloc(n, 4);
    assert_true(ka && va && kb && vb);
    for (int32_t layer = 0; layer < l.layers; layer++) {
        assert_int_equal(kvp_store_read(sta, layer, pa, 0, tokens, ka, va), KVP_OK);
        assert_int_equal(kvp_store_read(stb, layer, pb, 0, l.page_size, kb, vb), KVP_OK);
        assert_memory_equal(ka, kb, (size_t)tokens * row * 4);
        assert_memory_equal(va, vb, (size_t)tokens * row * 4);
        for (size_t i = (size_t)tokens * row; i < n; i++) {
            assert_true(kb[i] == 0.0f);
            assert_true(vb[i] == 0.0f);
        }
    }
    free(ka);
    free(va);
    free(kb);
    free(vb);
}

static void roundtrip(int32_t kf, int32_t vf, int32_t order) {
    const int32_t P = 4, np = 3;
    shape_t s = {2, 2, 64, P, kf, vf, order};
    kvp_store_t *src = store_make(&s, np, NULL), *dst = store_make(&s, np, NULL);
    kvp_layout_t l = layout_of(src);
    bool staging = l.needs_staging != 0;
    fill_page(src, 0, P, 11);
    fill_page(src, 1, P, 12);
    /* a sequence's partly filled last page: a pool page without staging; the
     * slots of the tokens it does not hold keep bytes no encoder wrote */
    int32_t last = staging ? P : 2;
    junk_page(src, 2);
    fill_page(src, 2, last, 13);
    if (staging) fill_page(src, np, P - 1, 14);
    kvp_blob_codec_t *cs = codec_make(src, 0, 0, 1, NULL, 0);
    kvp_blob_codec_t *cd = codec_make(dst, 0, 0, 1, NULL, 0);
    uint64_t pool_blob = 0, staging_blob = 0;
    assert_int_equal(kvp_blob_size(cs, 0, &pool_blob), KVP_OK);
    assert_int_equal(pool_blob, HDR + l.page_bytes);
    if (staging) {
        assert_int_equal(kvp_blob_size(cs, 1, &staging_blob), KVP_OK);
        assert_int_equal(staging_blob, HDR + l.staging_page_bytes);
    } else {
        assert_int_equal(kvp_blob_size(cs, 1, &staging_blob), KVP_EINVAL);
    }
    /* page, tokens, destination page */
    const int32_t jobs[4][3] = {{0, P, 2}, {1, P, 0}, {2, last, 1}, {np, P - 1, np + 1}};
    int njobs = staging ? 4 : 3;
    uint64_t total = 0;
    for (int j = 0; j < njobs; j++) {
        int32_t page = jobs[j][0], tokens = jobs[j][1], to = jobs[j][2];
        kvp_hash_t h = rand_hash((uint64_t)j + 100 * (uint64_t)kf);
        uint64_t bytes = 0;
        uint8_t *blob = blob_of(cs, src, page, tokens, &h, &bytes);
        total += bytes;
        uint8_t *want = page_copy_scrubbed(src, page);
        /* the payload is the page's serialization, padding zeroed (past a partly filled
         * page's tokens: encoded zeros, checked after the import) */
        if (tokens == P) assert_memory_equal(blob + HDR, want, bytes - HDR);
        kvp_blob_info_t info;
        memset(&info, 0x5a, sizeof info);
        info.struct_size = sizeof info;
        int32_t r = -1;
        int vrc = kvp_blob_validate(cd, blob, bytes, &h, tokens, &info, &r);
        if (vrc != KVP_OK)
            print_error("%s/%s order %d page %d: %s\n", kvp_format_name(kf), kvp_format_name(vf),
                        (int)order, (int)page, kvp_blob_codec_last_error(cd));
        assert_int_equal(vrc, KVP_OK);
        assert_int_equal(r, KVP_BLOB_OK);
        assert_int_equal(info.staging, page >= np);
        assert_int_equal(info.tokens, tokens);
        assert_int_equal(info.reserved_, 0);
        assert_int_equal(info.payload_bytes, bytes - HDR);
        assert_memory_equal(info.hash.bytes, h.bytes, 32);
        r = -1;
        int rc = kvp_blob_import(cd, to, blob, bytes, &h, tokens, &r);
        if (rc != KVP_OK) print_error("import: %s\n", kvp_blob_codec_last_error(cd));
        assert_int_equal(rc, KVP_OK);
        assert_int_equal(r, KVP_BLOB_OK);
        uint8_t *got = page_copy(dst, to);
        if (tokens == P) assert_memory_equal(got, want, bytes - HDR);
        else assert_same_tokens(src, page, dst, to, tokens);
        free(got);
        free(want);
        free(blob);
    }
    kvp_blob_stats_t so = stats_of(cs), si = stats_of(cd);
    assert_int_equal(so.exported, (uint64_t)njobs);
    assert_int_equal(so.bytes_out, total);
    assert_int_equal(so.imported, 0);
    assert_int_equal(si.imported, 2 * (uint64_t)njobs); /* validate, then import */
    assert_int_equal(si.bytes_in, 2 * total);
    assert_int_equal(si.rejected, 0);
    assert_int_equal(si.exported, 0);
    kvp_blob_codec_destroy(cs);
    kvp_blob_codec_destroy(cd);
    kvp_store_destroy(src);
    kvp_store_destroy(dst);
}

static void test_roundtrip_every_format(void **state) {
    (void)state;
    require_blob();
    for (int i = 0; i < NUM_PAIRS; i++)
        for (int32_t order = 0; order <= 1; order++)
            roundtrip(FORMAT_PAIRS[i][0], FORMAT_PAIRS[i][1], order);
}

/* Every header field at the offset the format page gives, the checksum and
 * tag over the bytes it says, and the fp8 scale digest. */
static void test_header_bytes(void **state) {
    (void)state;
    require_blob();
    const int32_t P = 4;
    shape_t s = {2, 3, 64, P, KVP_FORMAT_FP8_E4M3, KVP_FORMAT_INT4, KVP_K_ORDER_DIM_MAJOR};
    kvp_store_t *st = store_make(&s, 2, NULL);
    kvp_layout_t l = layout_of(st);
    fill_page(st, 1, 3, 5);
    uint8_t key[40];
    for (int i = 0; i < 40; i++) key[i] = (uint8_t)(0xa0 + i);
    kvp_blob_codec_t *c = codec_make(st, 0x11, 2, 3, key, 40);
    kvp_hash_t h = rand_hash(77);
    uint64_t n = 0;
    uint8_t *b = blob_of(c, st, 1, 3, &h, &n);
    assert_int_equal(n, HDR + l.page_bytes);
    assert_memory_equal(b, "KVPB", 4);
    assert_int_equal(rd16(b + 4), KVP_BLOB_FORMAT_VERSION);
    assert_int_equal(rd16(b + 6), HDR);
    assert_int_equal(rd32(b + 8), 2); /* authenticated, a pool page */
    assert_int_equal(rd32(b + 12), 3);
    uint8_t fp[32];
    fingerprint_of(0x11, fp);
    assert_memory_equal(b + 16, fp, 32);
    const uint32_t fields[7] = {2, 3, 64, (uint32_t)P, KVP_FORMAT_FP8_E4M3, KVP_FORMAT_INT4,
                                KVP_K_ORDER_DIM_MAJOR};
    for (int i = 0; i < 7; i++) assert_int_equal(rd32(b + 48 + 4 * i), fields[i]);
    assert_int_equal(rd16(b + 76), 2);
    assert_int_equal(rd16(b + 78), 3);
    assert_int_equal(rd64(b + 80), l.page_bytes);
    assert_memory_equal(b + 88, h.bytes, 32);
    /* K's scale table [layer][head], then V's (not fp8: zeros) */
    uint8_t tab[2 * 2 * 3 * 4];
    memset(tab, 0, sizeof tab);
    for (int32_t layer = 0; layer < 2; layer++)
        for (int32_t head = 0; head < 3; head++) {
            float f = 0.0f;
            assert_int_equal(kvp_store_get_fp8_scale(st, layer, head, 0, &f), KVP_OK);
            assert_true(f > 0.0f);
            uint32_t bits;
            memcpy(&bits, &f, 4);
            wr32(tab + 4 * (layer * 3 + head), bits);
        }
    assert_int_equal(rd64(b + 120), ref_xxh64(tab, sizeof tab));
    uint8_t sum[16], tag[32];
    ref_xxh128(b, 128, b + HDR, (size_t)(n - HDR), sum);
    assert_memory_equal(b + 128, sum, 16);
    ref_hmac(key, 40, b, 144, b + HDR, (size_t)(n - HDR), tag);
    assert_memory_equal(b + 144, tag, 32);
    uint8_t zero[32];
    memset(zero, 0, sizeof zero);
    assert_memory_equal(b + 176, zero, 16);
    free(b);
    kvp_blob_codec_destroy(c);
    kvp_store_destroy(st);

    /* a staging blob without a key: flag 1, no tag, no scale digest */
    shape_t s8 = {1, 1, 32, 4, KVP_FORMAT_INT8, KVP_FORMAT_FP16, 0};
    st = store_make(&s8, 1, NULL);
    l = layout_of(st);
    fill_page(st, 1, 2, 6);
    c = codec_make(st, 0x22, 0, 1, NULL, 0);
    b = blob_of(c, st, 1, 2, &h, &n);
    assert_int_equal(n, HDR + l.staging_page_bytes);
    assert_int_equal(rd32(b + 8), 1);
    assert_int_equal(rd32(b + 12), 2);
    assert_int_equal(rd64(b + 80), l.staging_page_bytes);
    assert_int_equal(rd64(b + 120), 0);
    assert_memory_equal(b + 144, zero, 32);
    assert_memory_equal(b + 176, zero, 16);
    ref_xxh128(b, 128, b + HDR, (size_t)(n - HDR), sum);
    assert_memory_equal(b + 128, sum, 16);
    free(b);
    kvp_blob_codec_destroy(c);
    kvp_store_destroy(st);
}

/* ---- 3. a flipped bit anywhere is refused, for the reason its field gives ---- */

static int32_t flip_reason(uint64_t off, int bit, bool keyed) {
    if (off < 4) return KVP_BLOB_MAGIC;
    if (off < 8) return KVP_BLOB_VERSION;   /* version, header_bytes */
    if (off < 12) /* flags: the known bits are checksummed, the others must be 0 */
        return off == 8 && bit < 2 ? KVP_BLOB_CHECKSUM : KVP_BLOB_RESERVED;
    if (off >= 80 && off < 88) return KVP_BLOB_TRUNCATED; /* payload_bytes */
    if (off >= 144 && off < 176) return keyed ? KVP_BLOB_AUTH : KVP_BLOB_RESERVED; /* tag */
    if (off >= 176 && off < HDR) return KVP_BLOB_RESERVED;
    return KVP_BLOB_CHECKSUM; /* every other header byte, the checksum, the payload */
}

static void sweep(const shape_t *s, bool keyed, bool staging) {
    kvp_store_t *st = store_make(s, 2, NULL);
    const uint8_t key[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
    kvp_blob_codec_t *c = codec_make(st, 0, 0, 1, keyed ? key : NULL, keyed ? 16 : 0);
    int32_t page = staging ? 2 : 0, tokens = staging ? s->page - 1 : s->page;
    fill_page(st, page, tokens, 21);
    kvp_hash_t h = rand_hash(3);
    uint64_t n = 0;
    uint8_t *b = blob_of(c, st, page, tokens, &h, &n);
    expect_accept(c, b, n, &h, tokens);
    kvp_blob_stats_t before = stats_of(c);
    uint64_t tally[KVP_BLOB_REASONS];
    memset(tally, 0, sizeof tally);
    for (uint64_t off = 0; off < n; off++)
        for (int bit = 0; bit < 8; bit++) {
            b[off] ^= (uint8_t)(1u << bit);
            int32_t r = -1;
            int rc = kvp_blob_validate(c, b, n, &h, tokens, NULL, &r);
            int32_t want = flip_reason(off, bit, keyed);
            if (rc != KVP_EBADBLOB || r != want)
                print_error("offset %llu bit %d: %s (%s), expected %s\n", (unsigned long long)off,
                            bit, kvp_status_name(rc), kvp_blob_reason_name(r),
                            kvp_blob_reason_name(want));
            assert_int_equal(rc, KVP_EBADBLOB);
            assert_int_equal(r, want);
            tally[r]++;
            b[off] ^= (uint8_t)(1u << bit);
        }
    kvp_blob_stats_t after = stats_of(c);
    assert_int_equal(after.rejected - before.rejected, n * 8);
    uint64_t sum = 0;
    for (int r = 0; r < KVP_BLOB_REASONS; r++) {
        assert_int_equal(after.rejects[r] - before.rejects[r], tally[r]);
        sum += tally[r];
    }
    assert_int_equal(sum, n * 8);
    assert_int_equal(after.rejects[KVP_BLOB_OK], 0);
    assert_int_equal(after.imported, before.imported);
    assert_int_equal(after.bytes_in, before.bytes_in);
    assert_true(tally[KVP_BLOB_CHECKSUM] > 0 && tally[KVP_BLOB_MAGIC] == 32 &&
                tally[KVP_BLOB_TRUNCATED] == 64);
    /* restored, it passes again */
    expect_accept(c, b, n, &h, tokens);
    free(b);
    kvp_blob_codec_destroy(c);
    kvp_store_destroy(st);
}

static void test_every_flipped_bit_is_refused(void **state) {
    (void)state;
    require_blob();
    shape_t plain = {1, 1, 32, 4, KVP_FORMAT_FP16, KVP_FORMAT_FP16, 0};
    shape_t quant = {1, 1, 32, 4, KVP_FORMAT_INT8, KVP_FORMAT_INT4, 0};
    sweep(&plain, false, false);
    sweep(&plain, true, false);
    sweep(&quant, true, false);
    sweep(&quant, false, true); /* a staging page */
}

/* ---- 4. foreign and forged blobs: the right reason ---------------------------- */

static void test_identity_reasons(void **state) {
    (void)state;
    require_blob();
    const int32_t P = 4;
    shape_t base = {2, 2, 64, P, KVP_FORMAT_FP16, KVP_FORMAT_FP16, 0};
    kvp_store_t *S = store_make(&base, 2, NULL);
    fill_page(S, 0, P, 1);
    kvp_blob_codec_t *C = codec_make(S, 0, 0, 1, NULL, 0);
    const int32_t toks[4] = {5, 6, 7, 8};
    kvp_hash_t root0, root1, h0, h1;
    assert_int_equal(kvp_blob_chain_root(C, 0, &root0), KVP_OK);
    assert_int_equal(kvp_blob_chain_root(C, 1, &root1), KVP_OK);
    assert_int_equal(kvp_blob_chain(C, &root0, toks, 4, &h0), KVP_OK);
    assert_int_equal(kvp_blob_chain(C, &root1, toks, 4, &h1), KVP_OK);
    uint64_t n = 0, m = 0;
    uint8_t *blob = blob_of(C, S, 0, P, &h0, &n);
    expect_accept(C, blob, n, &h0, P);
    expect_accept(C, blob, n, NULL, 0); /* any hash, any count */

    /* another model */
    kvp_blob_codec_t *o = codec_make(S, 1, 0, 1, NULL, 0);
    uint8_t *b = blob_of(o, S, 0, P, &h0, &m);
    expect_reject(C, b, m, &h0, P, KVP_BLOB_FINGERPRINT);
    expect_reject(o, blob, n, &h0, P, KVP_BLOB_FINGERPRINT);
    free(b);
    kvp_blob_codec_destroy(o);
    /* another shard */
    const int32_t shards[2][2] = {{1, 2}, {0, 2}};
    for (int i = 0; i < 2; i++) {
        o = codec_make(S, 0, shards[i][0], shards[i][1], NULL, 0);
        b = blob_of(o, S, 0, P, &h0, &m);
        expect_reject(C, b, m, &h0, P, KVP_BLOB_SHARD);
        free(b);
        kvp_blob_codec_destroy(o);
    }
    /* another layout: key order, page size, head dim, layers, kv heads */
    const shape_t layouts[5] = {
        {2, 2, 64, P, KVP_FORMAT_FP16, KVP_FORMAT_FP16, KVP_K_ORDER_DIM_MAJOR},
        {2, 2, 64, 8, KVP_FORMAT_FP16, KVP_FORMAT_FP16, 0},
        {2, 2, 32, P, KVP_FORMAT_FP16, KVP_FORMAT_FP16, 0},
        {1, 2, 64, P, KVP_FORMAT_FP16, KVP_FORMAT_FP16, 0},
        {2, 1, 64, P, KVP_FORMAT_FP16, KVP_FORMAT_FP16, 0},
    };
    for (int i = 0; i < 5; i++) {
        kvp_store_t *so = store_make(&layouts[i], 1, NULL);
        fill_page(so, 0, layouts[i].page, 2);
        o = codec_make(so, 0, 0, 1, NULL, 0);
        b = blob_of(o, so, 0, layouts[i].page, &h0, &m);
        expect_reject(C, b, m, &h0, 0, KVP_BLOB_LAYOUT);
        free(b);
        kvp_blob_codec_destroy(o);
        kvp_store_destroy(so);
    }
    /* other formats: the same payload length (bf16) or another (fp32, int8):
     * formats are identity, checked before the payload length */
    const int32_t formats[4][2] = {{KVP_FORMAT_BF16, KVP_FORMAT_BF16},
                                   {KVP_FORMAT_FP16, KVP_FORMAT_BF16},
                                   {KVP_FORMAT_FP32, KVP_FORMAT_FP32},
                                   {KVP_FORMAT_FP16, KVP_FORMAT_INT8}};
    for (int i = 0; i < 4; i++) {
        shape_t f = {2, 2, 64, P, formats[i][0], formats[i][1], 0};
        kvp_store_t *so = store_make(&f, 1, NULL);
        fill_page(so, 0, P, 3);
        o = codec_make(so, 0, 0, 1, NULL, 0);
        b = blob_of(o, so, 0, P, &h0, &m);
        expect_reject(C, b, m, &h0, P, KVP_BLOB_FORMAT);
        expect_reject(o, blob, n, &h0, P, KVP_BLOB_FORMAT);
        free(b);
        kvp_blob_codec_destroy(o);
        kvp_store_destroy(so);
    }
    /* fp8 scales: blobs of other scales are another format, read again per call */
    shape_t f8 = {2, 2, 64, P, KVP_FORMAT_FP8_E4M3, KVP_FORMAT_FP8_E4M3, 0};
    kvp_store_t *s8a = store_make(&f8, 1, NULL), *s8b = store_make(&f8, 1, NULL);
    set_fp8(s8b, 2, 2, f8.kf, f8.vf, 2.0f);
    fill_page(s8b, 0, P, 4);
    kvp_blob_codec_t *c8a = codec_make(s8a, 0, 0, 1, NULL, 0);
    kvp_blob_codec_t *c8b = codec_make(s8b, 0, 0, 1, NULL, 0);
    b = blob_of(c8b, s8b, 0, P, &h0, &m);
    expect_reject(c8a, b, m, &h0, P, KVP_BLOB_FORMAT);
    set_fp8(s8a, 2, 2, f8.kf, f8.vf, 2.0f);
    expect_accept(c8a, b, m, &h0, P);
    assert_int_equal(kvp_store_set_fp8_scale(s8a, 1, 1, 1, 0.5f), KVP_OK);
    expect_reject(c8a, b, m, &h0, P, KVP_BLOB_FORMAT);
    free(b);
    kvp_blob_codec_destroy(c8a);
    kvp_blob_codec_destroy(c8b);
    kvp_store_destroy(s8a);
    kvp_store_destroy(s8b);

    /* another salt names another page; another count */
    expect_reject(C, blob, n, &h1, P, KVP_BLOB_HASH);
    expect_reject(C, blob, n, &h0, P - 1, KVP_BLOB_TOKENS);
    /* lengths */
    uint8_t *big = calloc(1, (size_t)n + 1);
    memcpy(big, blob, (size_t)n);
    expect_reject(C, big, n + 1, &h0, P, KVP_BLOB_TRUNCATED);
    expect_reject(C, blob, n - 1, &h0, P, KVP_BLOB_TRUNCATED);
    expect_reject(C, blob, HDR, &h0, P, KVP_BLOB_TRUNCATED);
    expect_reject(C, blob, HDR - 1, &h0, P, KVP_BLOB_TRUNCATED);
    expect_reject(C, blob, 0, &h0, P, KVP_BLOB_TRUNCATED);
    free(big);
    /* structure, whatever the checksum says */
    b = malloc((size_t)n + 16);
    memcpy(b, blob, (size_t)n);
    b[3] = 'X';
    expect_reject(C, b, n, &h0, P, KVP_BLOB_MAGIC);
    memcpy(b, blob, (size_t)n);
    wr16(b + 4, 2);
    reseal(b, n, NULL, 0);
    expect_reject(C, b, n, &h0, P, KVP_BLOB_VERSION);
    memcpy(b, blob, (size_t)n);
    wr16(b + 6, 128);
    expect_reject(C, b, n, &h0, P, KVP_BLOB_VERSION);
    memcpy(b, blob, (size_t)n);
    wr32(b + 8, 4);
    reseal(b, n, NULL, 0);
    expect_reject(C, b, n, &h0, P, KVP_BLOB_RESERVED);
    memcpy(b, blob, (size_t)n);
    b[190] = 1;
    expect_reject(C, b, n, &h0, P, KVP_BLOB_RESERVED);
    /* forged, checksummed again: the checks after integrity hold on their own */
    memcpy(b, blob, (size_t)n);
    memset(b + n, 0, 16);
    wr64(b + 80, n + 16 - HDR);
    reseal(b, n + 16, NULL, 0);
    expect_reject(C, b, n + 16, &h0, 0, KVP_BLOB_LAYOUT); /* not this layout's page */
    const uint32_t bad_tokens[2] = {0, (uint32_t)P + 1};
    for (int i = 0; i < 2; i++) {
        memcpy(b, blob, (size_t)n);
        wr32(b + 12, bad_tokens[i]);
        reseal(b, n, NULL, 0);
        expect_reject(C, b, n, &h0, 0, KVP_BLOB_TOKENS);
    }
    memcpy(b, blob, (size_t)n);
    wr32(b + 12, 2);
    reseal(b, n, NULL, 0);
    expect_accept(C, b, n, &h0, 2); /* a partly filled pool page: fine without staging */
    memcpy(b, blob, (size_t)n);
    wr32(b + 8, 1); /* "a staging page": this store has none */
    wr32(b + 12, 2);
    reseal(b, n, NULL, 0);
    expect_reject(C, b, n, &h0, 0, KVP_BLOB_TOKENS);
    free(b);

    /* authentication */
    uint8_t k1[32], k2[32];
    for (int i = 0; i < 32; i++) {
        k1[i] = (uint8_t)(3 * i + 1);
        k2[i] = (uint8_t)(3 * i + 2);
    }
    kvp_blob_codec_t *ck1 = codec_make(S, 0, 0, 1, k1, 32);
    kvp_blob_codec_t *ck1b = codec_make(S, 0, 0, 1, k1, 32);
    kvp_blob_codec_t *ck2 = codec_make(S, 0, 0, 1, k2, 32);
    kvp_blob_codec_t *ck16 = codec_make(S, 0, 0, 1, k1, 16); /* a prefix of k1 */
    uint8_t *bk = blob_of(ck1, S, 0, P, &h0, &m);
    expect_reject(ck1, blob, n, &h0, P, KVP_BLOB_AUTH); /* no tag */
    expect_reject(C, bk, m, &h0, P, KVP_BLOB_AUTH);     /* a tag, and no key here */
    expect_reject(ck2, bk, m, &h0, P, KVP_BLOB_AUTH);   /* another key */
    expect_reject(ck16, bk, m, &h0, P, KVP_BLOB_AUTH);
    expect_accept(ck1b, bk, m, &h0, P);                 /* the same key */
    expect_accept(ck1, bk, m, &h0, P);
    /* the tag without its flag */
    b = malloc((size_t)m);
    memcpy(b, bk, (size_t)m);
    wr32(b + 8, 0);
    reseal(b, m, NULL, 0);
    expect_reject(C, b, m, &h0, P, KVP_BLOB_RESERVED);
    expect_reject(ck1, b, m, &h0, P, KVP_BLOB_AUTH);
    /* a tag forged with another key over the right bytes */
    memcpy(b, bk, (size_t)m);
    reseal(b, m, k2, 32);
    expect_reject(ck1, b, m, &h0, P, KVP_BLOB_AUTH);
    expect_accept(ck2, b, m, &h0, P);
    free(b);
    free(bk);
    kvp_blob_codec_destroy(ck1);
    kvp_blob_codec_destroy(ck1b);
    kvp_blob_codec_destroy(ck2);
    kvp_blob_codec_destroy(ck16);

    /* staging-ness: a staging blob only into a staging page, and back */
    shape_t q = {2, 2, 64, P, KVP_FORMAT_INT8, KVP_FORMAT_INT4, 0};
    kvp_store_t *sq = store_make(&q, 2, NULL);
    fill_page(sq, 0, P, 7);
    fill_page(sq, 2, P - 1, 8);
    kvp_blob_codec_t *cq = codec_make(sq, 0, 0, 1, NULL, 0);
    uint64_t mp = 0, ms = 0;
    uint8_t *bp = blob_of(cq, sq, 0, P, &h0, &mp), *bs = blob_of(cq, sq, 2, P - 1, &h0, &ms);
    uint8_t *keep1 = page_copy(sq, 1), *keep3 = page_copy(sq, 3);
    int32_t r = -1;
    assert_int_equal(kvp_blob_import(cq, 1, bs, ms, &h0, 0, &r), KVP_EBADBLOB);
    assert_int_equal(r, KVP_BLOB_TOKENS);
    r = -1;
    assert_int_equal(kvp_blob_import(cq, 3, bp, mp, &h0, 0, &r), KVP_EBADBLOB);
    assert_int_equal(r, KVP_BLOB_TOKENS);
    uint8_t *now1 = page_copy(sq, 1), *now3 = page_copy(sq, 3);
    assert_memory_equal(now1, keep1, (size_t)(mp - HDR)); /* nothing written */
    assert_memory_equal(now3, keep3, (size_t)(ms - HDR));
    assert_int_equal(kvp_blob_import(cq, 3, bs, ms, &h0, P - 1, &r), KVP_OK);
    assert_int_equal(kvp_blob_import(cq, 1, bp, mp, &h0, P, &r), KVP_OK);
    /* with staging, a pool page is always full; a staging page never is */
    b = malloc((size_t)mp);
    memcpy(b, bp, (size_t)mp);
    wr32(b + 12, (uint32_t)P - 1);
    reseal(b, mp, NULL, 0);
    expect_reject(cq, b, mp, NULL, 0, KVP_BLOB_TOKENS);
    free(b);
    b = malloc((size_t)ms);
    memcpy(b, bs, (size_t)ms);
    wr32(b + 12, (uint32_t)P);
    reseal(b, ms, NULL, 0);
    expect_reject(cq, b, ms, NULL, 0, KVP_BLOB_TOKENS);
    /* a staging flag on a pool page's payload: not this layout's staging page */
    free(b);
    b = malloc((size_t)mp);
    memcpy(b, bp, (size_t)mp);
    wr32(b + 8, 1);
    wr32(b + 12, 2);
    reseal(b, mp, NULL, 0);
    expect_reject(cq, b, mp, NULL, 0, KVP_BLOB_LAYOUT);
    free(b);
    free(bp);
    free(bs);
    free(keep1);
    free(keep3);
    free(now1);
    free(now3);
    kvp_blob_codec_destroy(cq);
    kvp_store_destroy(sq);

    free(blob);
    kvp_blob_codec_destroy(C);
    kvp_store_destroy(S);
}

/* ---- 5. payloads that break their formats' invariants ------------------------ */

typedef struct {
    uint64_t off; /* byte of the page's serialization */
    uint16_t value;
} patch_t;

/* Write `patch` into a copy of page 0, make it page 1 (the exporter then
 * checksums the bad bytes), export: validation and import refuse it. */
static void expect_payload_reject(kvp_store_t *st, kvp_blob_codec_t *c, const patch_t *patch) {
    kvp_layout_t l = layout_of(st);
    uint8_t *bytes = page_copy(st, 0);
    wr16(bytes + patch->off, patch->value);
    assert_int_equal(kvp_store_page_from_host(st, 1, 0, bytes, l.page_bytes), KVP_OK);
    kvp_hash_t h = rand_hash(patch->off);
    uint64_t n = 0;
    uint8_t *b = blob_of(c, st, 1, l.page_size, &h, &n);
    expect_reject(c, b, n, &h, l.page_size, KVP_BLOB_PAYLOAD);
    assert_non_null(strstr(kvp_blob_codec_last_error(c), "block"));
    uint8_t *before = page_copy(st, 2);
    int32_t r = -1;
    assert_int_equal(kvp_blob_import(c, 2, b, n, &h, 0, &r), KVP_EBADBLOB);
    assert_int_equal(r, KVP_BLOB_PAYLOAD);
    uint8_t *after = page_copy(st, 2);
    assert_memory_equal(before, after, (size_t)l.page_bytes); /* nothing written */
    free(before);
    free(after);
    free(b);
    free(bytes);
}

static void test_payload_invariants(void **state) {
    (void)state;
    require_blob();
    const int32_t P = 4, D = 64;
    /* int8 keys, int4 values */
    shape_t s = {2, 2, D, P, KVP_FORMAT_INT8, KVP_FORMAT_INT4, 0};
    kvp_store_t *st = store_make(&s, 3, NULL);
    kvp_layout_t l = layout_of(st);
    fill_page(st, 0, P, 31);
    fill_page(st, 2, P, 32);
    kvp_blob_codec_t *c = codec_make(st, 0, 0, 1, NULL, 0);
    uint64_t kb = l.k_block_bytes, vb = l.v_block_bytes, layer1 = 2 * (kb + vb);
    const uint64_t k8_scale = (uint64_t)P * D, k8_min = k8_scale + 2 * D;
    const uint64_t v4_scale = (uint64_t)P * D / 2, v4_min = v4_scale + 2 * 2 * P; /* G = 2 */
    const patch_t bad8[] = {
        {k8_scale, 0x7e00},                   /* K scale NaN */
        {k8_scale + 10, 0xbc00},              /* K scale -1 */
        {k8_min + 6, 0x7c00},                 /* K min +Inf */
        {layer1 + kb + k8_scale + 2, 0xfc00}, /* layer 1, head 1: K scale -Inf */
        {2 * kb + v4_scale, 0x7e00},          /* V scale NaN */
        {2 * kb + v4_min + 2, 0xfc00},        /* V min -Inf */
        {layer1 + 2 * kb + vb + v4_scale, 0x8400}, /* layer 1, head 1: V scale < 0 */
    };
    for (size_t i = 0; i < sizeof bad8 / sizeof bad8[0]; i++) expect_payload_reject(st, c, &bad8[i]);
    /* a staging page may hold any bits */
    uint8_t *junk = malloc((size_t)l.staging_page_bytes);
    memset(junk, 0xff, (size_t)l.staging_page_bytes);
    assert_int_equal(kvp_store_page_from_host(st, 3, 0, junk, l.staging_page_bytes), KVP_OK);
    kvp_hash_t h = rand_hash(1);
    uint64_t n = 0;
    uint8_t *b = blob_of(c, st, 3, 1, &h, &n);
    expect_accept(c, b, n, &h, 1);
    free(b);
    free(junk);
    kvp_blob_codec_destroy(c);
    kvp_store_destroy(st);

    /* int4 keys: the outlier channels must increase and stay below head_dim */
    shape_t s4 = {2, 2, D, P, KVP_FORMAT_INT4, KVP_FORMAT_INT8, 0};
    st = store_make(&s4, 3, NULL);
    fill_page(st, 0, P, 33);
    fill_page(st, 2, P, 34);
    c = codec_make(st, 0, 0, 1, NULL, 0);
    const uint64_t idx = (uint64_t)P * D / 2 + 4 * D; /* idx[R], R = 2 */
    uint8_t *page = page_copy(st, 0);
    uint32_t i0 = rd16(page + idx), i1 = rd16(page + idx + 2);
    assert_true(i0 < i1 && i1 < (uint32_t)D); /* what the encoder wrote */
    free(page);
    const patch_t bad4[] = {
        {idx, (uint16_t)D},          /* past the head */
        {idx + 2, (uint16_t)i0},     /* not increasing */
        {idx + 2, 0xffff},
        {(uint64_t)P * D / 2, 0x7e00}, /* int4 K scale NaN */
    };
    for (size_t i = 0; i < sizeof bad4 / sizeof bad4[0]; i++) expect_payload_reject(st, c, &bad4[i]);
    /* the same, forged on a valid blob and checksummed again */
    b = blob_of(c, st, 0, P, &h, &n);
    wr16(b + HDR + idx + 2, 1000);
    reseal(b, n, NULL, 0);
    expect_reject(c, b, n, &h, P, KVP_BLOB_PAYLOAD);
    free(b);
    kvp_blob_codec_destroy(c);
    kvp_store_destroy(st);

    /* a partly filled page (values int8, no staging): only the tokens it holds count */
    shape_t sv = {2, 2, D, P, KVP_FORMAT_FP16, KVP_FORMAT_INT8, 0};
    st = store_make(&sv, 1, NULL);
    l = layout_of(st);
    c = codec_make(st, 0, 0, 1, NULL, 0);
    junk_page(st, 0);
    fill_page(st, 0, 2, 35);
    b = blob_of(c, st, 0, 2, &h, &n);
    expect_accept(c, b, n, &h, 2); /* the export wrote zeros past its 2 tokens */
    const uint64_t v8_scale = HDR + 2 * l.k_block_bytes + (uint64_t)P * D;
    assert_int_equal(rd16(b + v8_scale + 6), 0); /* token 3's scale, exported as zero */
    wr16(b + v8_scale + 6, 0x7e00); /* a forged NaN where the page holds no token */
    reseal(b, n, NULL, 0);
    expect_accept(c, b, n, &h, 2);  /* not read */
    wr16(b + v8_scale + 2, 0x7e00); /* token 1's scale: one the page holds */
    reseal(b, n, NULL, 0);
    expect_reject(c, b, n, &h, 2, KVP_BLOB_PAYLOAD);
    wr16(b + v8_scale + 2, 0x3c00);
    reseal(b, n, NULL, 0);
    expect_accept(c, b, n, &h, 2);
    wr32(b + 12, (uint32_t)P); /* the same bytes as a full page: token 3 counts now */
    reseal(b, n, NULL, 0);
    expect_reject(c, b, n, &h, P, KVP_BLOB_PAYLOAD);
    free(b);
    kvp_blob_codec_destroy(c);
    kvp_store_destroy(st);

    /* plain formats: any bits */
    shape_t sp = {1, 1, 32, P, KVP_FORMAT_FP16, KVP_FORMAT_BF16, 0};
    st = store_make(&sp, 1, NULL);
    l = layout_of(st);
    junk = malloc((size_t)l.page_bytes);
    memset(junk, 0xff, (size_t)l.page_bytes);
    assert_int_equal(kvp_store_page_from_host(st, 0, 0, junk, l.page_bytes), KVP_OK);
    c = codec_make(st, 0, 0, 1, NULL, 0);
    b = blob_of(c, st, 0, P, &h, &n);
    expect_accept(c, b, n, &h, P);
    free(b);
    free(junk);
    kvp_blob_codec_destroy(c);
    kvp_store_destroy(st);
}

/* ---- 6. argument checks ------------------------------------------------------------ */

static void test_arguments(void **state) {
    (void)state;
    /* no feature needed for these */
    static const char *const names[KVP_BLOB_REASONS] = {
        "ok",    "truncated", "magic",  "version",  "fingerprint", "layout", "format",
        "shard", "hash",      "tokens", "checksum", "auth",        "payload", "reserved"};
    for (int32_t r = 0; r < KVP_BLOB_REASONS; r++)
        assert_string_equal(kvp_blob_reason_name(r), names[r]);
    assert_string_equal(kvp_blob_reason_name(-1), "unknown");
    assert_string_equal(kvp_blob_reason_name(KVP_BLOB_REASONS), "unknown");
    assert_string_equal(kvp_blob_reason_name(INT32_MAX), "unknown");
    kvp_hash_t h;
    for (int i = 0; i < 32; i++) h.bytes[i] = (uint8_t)(i * 17);
    char hex[65];
    memset(hex, 'x', sizeof hex);
    assert_int_equal(kvp_hash_hex(&h, hex), KVP_OK);
    assert_string_equal(hex, "00112233445566778899aabbccddeeff"
                             "102132435465768798a9bacbdcedfe0f");
    assert_int_equal(kvp_hash_hex(NULL, hex), KVP_EINVAL);
    assert_int_equal(kvp_hash_hex(&h, NULL), KVP_EINVAL);
    kvp_blob_params_init(NULL);
    kvp_blob_params_t p;
    memset(&p, 0x77, sizeof p);
    kvp_blob_params_init(&p);
    assert_int_equal(p.struct_size, sizeof p);
    assert_int_equal(p.shard_index, 0);
    assert_int_equal(p.shard_count, 1);
    assert_int_equal(p.auth_key_bytes, 0);
    assert_null(p.auth_key);
    assert_null(p.allocator.alloc);
    uint8_t zero[32];
    memset(zero, 0, sizeof zero);
    assert_memory_equal(p.fingerprint, zero, 32);
    assert_string_equal(kvp_blob_codec_last_error(NULL), "NULL handle");
    kvp_blob_codec_destroy(NULL);

    require_blob();
    /* fingerprints: SHA-256 of the parts' concatenation */
    const void *parts[3] = {"a", "bc", NULL};
    const uint64_t sizes[3] = {1, 2, 0};
    uint8_t fp[32], want[32];
    assert_int_equal(kvp_fingerprint(parts, sizes, 2, fp), KVP_OK);
    static const uint8_t abc[32] = {
        0xba, 0x78, 0x16, 0xbf, 0x8f, 0x01, 0xcf, 0xea, 0x41, 0x41, 0x40, 0xde, 0x5d, 0xae, 0x22, 0x23,
        0xb0, 0x03, 0x61, 0xa3, 0x96, 0x17, 0x7a, 0x9c, 0xb4, 0x10, 0xff, 0x61, 0xf2, 0x00, 0x15, 0xad};
    assert_memory_equal(fp, abc, 32);
    assert_int_equal(kvp_fingerprint(parts, sizes, 3, fp), KVP_OK); /* NULL with 0 bytes */
    assert_memory_equal(fp, abc, 32);
    const void *one[1] = {"abc"};
    const uint64_t one_size[1] = {3};
    assert_int_equal(kvp_fingerprint(one, one_size, 1, fp), KVP_OK);
    assert_memory_equal(fp, abc, 32);
    const void *empty[1] = {""};
    const uint64_t zero_size[1] = {0};
    assert_int_equal(kvp_fingerprint(empty, zero_size, 1, fp), KVP_OK);
    ref_sha256("", 0, NULL, 0, want);
    assert_memory_equal(fp, want, 32);
    const void *holes[2] = {"a", NULL};
    const uint64_t hole_sizes[2] = {1, 1};
    assert_int_equal(kvp_fingerprint(holes, hole_sizes, 2, fp), KVP_EINVAL);
    assert_int_equal(kvp_fingerprint(NULL, sizes, 2, fp), KVP_EINVAL);
    assert_int_equal(kvp_fingerprint(parts, NULL, 2, fp), KVP_EINVAL);
    assert_int_equal(kvp_fingerprint(parts, sizes, 2, NULL), KVP_EINVAL);
    assert_int_equal(kvp_fingerprint(parts, sizes, 0, fp), KVP_EINVAL);

    /* codec creation */
    const int32_t P = 4;
    shape_t s = {1, 1, 32, P, KVP_FORMAT_INT8, KVP_FORMAT_FP16, 0};
    kvp_store_t *st = store_make(&s, 2, NULL);
    kvp_blob_codec_t *c = (kvp_blob_codec_t *)(uintptr_t)0x1, *sentinel = c;
    char err[KVP_ERR_SIZE];
    p = bparams(0, 0, 1, NULL, 0);
    assert_int_equal(kvp_blob_codec_create(NULL, &p, &c, err, sizeof err), KVP_EINVAL);
    assert_int_equal(kvp_blob_codec_create(st, &p, NULL, err, sizeof err), KVP_EINVAL);
    assert_int_equal(kvp_blob_codec_create(st, NULL, &c, err, sizeof err), KVP_EINVAL);
    kvp_blob_params_t q = p;
    q.struct_size = 0;
    assert_int_equal(kvp_blob_codec_create(st, &q, &c, err, sizeof err), KVP_EINVAL);
    assert_non_null(strstr(err, "struct_size"));
    q = p;
    memset(q.fingerprint, 0, sizeof q.fingerprint);
    assert_int_equal(kvp_blob_codec_create(st, &q, &c, err, sizeof err), KVP_EINVAL);
    assert_non_null(strstr(err, "fingerprint"));
    const int32_t bad_shards[5][2] = {{0, 0}, {0, 65536}, {-1, 2}, {2, 2}, {0, -1}};
    for (int i = 0; i < 5; i++) {
        q = p;
        q.shard_index = bad_shards[i][0];
        q.shard_count = bad_shards[i][1];
        assert_int_equal(kvp_blob_codec_create(st, &q, &c, err, sizeof err), KVP_EINVAL);
        assert_non_null(strstr(err, "shard"));
    }
    uint8_t key[80];
    memset(key, 9, sizeof key);
    const int32_t bad_keys[4] = {-1, 1, 15, KVP_BLOB_MAX_KEY_BYTES + 1};
    for (int i = 0; i < 4; i++) {
        q = p;
        q.auth_key = key;
        q.auth_key_bytes = bad_keys[i];
        assert_int_equal(kvp_blob_codec_create(st, &q, &c, err, sizeof err), KVP_EINVAL);
        assert_non_null(strstr(err, "auth_key_bytes"));
    }
    q = p;
    q.auth_key_bytes = 16; /* and no key */
    assert_int_equal(kvp_blob_codec_create(st, &q, &c, err, sizeof err), KVP_EINVAL);
    q = p;
    q.allocator.alloc = kvt_alloc; /* half an allocator */
    assert_int_equal(kvp_blob_codec_create(st, &q, &c, err, sizeof err), KVP_EINVAL);
    assert_ptr_equal(c, sentinel); /* untouched on error */
    q = p;
    q.auth_key = key;
    q.auth_key_bytes = KVP_BLOB_MAX_KEY_BYTES;
    c = NULL;
    assert_int_equal(kvp_blob_codec_create(st, &q, &c, NULL, 0), KVP_OK);
    kvp_blob_codec_destroy(c);
    q.shard_index = 65534;
    q.shard_count = 65535;
    q.auth_key_bytes = 16;
    assert_int_equal(kvp_blob_codec_create(st, &q, &c, NULL, 0), KVP_OK);
    kvp_blob_codec_destroy(c);
    c = codec_make(st, 0, 0, 1, NULL, 0);
    assert_string_equal(kvp_blob_codec_last_error(c), "");

    /* chain hashes */
    kvp_hash_t root, out[2];
    const int32_t toks[4] = {1, 2, 3, 4};
    assert_int_equal(kvp_blob_chain_root(NULL, 0, &root), KVP_EINVAL);
    assert_int_equal(kvp_blob_chain_root(c, 0, NULL), KVP_EINVAL);
    assert_non_null(strstr(kvp_blob_codec_last_error(c), "root"));
    assert_int_equal(kvp_blob_chain_root(c, 0, &root), KVP_OK);
    assert_int_equal(kvp_blob_chain(NULL, &root, toks, 4, out), KVP_EINVAL);
    assert_int_equal(kvp_blob_chain(c, NULL, toks, 4, out), KVP_EINVAL);
    assert_int_equal(kvp_blob_chain(c, &root, NULL, 4, out), KVP_EINVAL);
    assert_int_equal(kvp_blob_chain(c, &root, toks, 4, NULL), KVP_EINVAL);
    assert_int_equal(kvp_blob_chain(c, &root, toks, -1, out), KVP_EINVAL);
    /* sizes */
    uint64_t bytes = 0;
    assert_int_equal(kvp_blob_size(NULL, 0, &bytes), KVP_EINVAL);
    assert_int_equal(kvp_blob_size(c, 0, NULL), KVP_EINVAL);
    assert_int_equal(kvp_blob_size(c, 2, &bytes), KVP_EINVAL);
    assert_int_equal(kvp_blob_size(c, -1, &bytes), KVP_EINVAL);
    /* export */
    kvp_layout_t l = layout_of(st);
    fill_page(st, 0, P, 1);
    fill_page(st, 2, 2, 2);
    uint64_t pool = HDR + l.page_bytes, stg = HDR + l.staging_page_bytes;
    uint8_t *b = malloc((size_t)pool + (size_t)stg);
    assert_int_equal(kvp_blob_export(NULL, 0, P, &root, b, pool), KVP_EINVAL);
    assert_int_equal(kvp_blob_export(c, 0, P, NULL, b, pool), KVP_EINVAL);
    assert_int_equal(kvp_blob_export(c, 0, P, &root, NULL, pool), KVP_EINVAL);
    assert_int_equal(kvp_blob_export(c, -1, P, &root, b, pool), KVP_EINVAL);
    assert_int_equal(kvp_blob_export(c, 4, P, &root, b, pool), KVP_EINVAL); /* 2 + 2 staging */
    assert_non_null(strstr(kvp_blob_codec_last_error(c), "out of range"));
    assert_int_equal(kvp_blob_export(c, 0, 0, &root, b, pool), KVP_EINVAL);
    assert_int_equal(kvp_blob_export(c, 0, P + 1, &root, b, pool), KVP_EINVAL);
    assert_int_equal(kvp_blob_export(c, 0, P - 1, &root, b, pool), KVP_EINVAL); /* sealed: full */
    assert_int_equal(kvp_blob_export(c, 2, P, &root, b, stg), KVP_EINVAL);      /* staging: partial */
    assert_int_equal(kvp_blob_export(c, 2, 0, &root, b, stg), KVP_EINVAL);
    assert_int_equal(kvp_blob_export(c, 0, P, &root, b, pool - 1), KVP_EINVAL);
    assert_int_equal(kvp_blob_export(c, 2, 2, &root, b, stg - 1), KVP_EINVAL);
    assert_int_equal(stats_of(c).exported, 0);
    assert_int_equal(kvp_blob_export(c, 0, P, &root, b, pool), KVP_OK);
    assert_int_equal(kvp_blob_export(c, 2, 2, &root, b + pool, stg), KVP_OK);
    /* validation and import */
    kvp_blob_info_t info = {.struct_size = sizeof info};
    int32_t r = 99;
    assert_int_equal(kvp_blob_validate(NULL, b, pool, &root, P, &info, &r), KVP_EINVAL);
    assert_int_equal(kvp_blob_validate(c, NULL, pool, &root, P, &info, &r), KVP_EINVAL);
    assert_int_equal(kvp_blob_validate(c, b, pool, &root, -1, &info, &r), KVP_EINVAL);
    assert_int_equal(kvp_blob_validate(c, b, pool, &root, P + 1, &info, &r), KVP_EINVAL);
    info.struct_size = 4;
    assert_int_equal(kvp_blob_validate(c, b, pool, &root, P, &info, &r), KVP_EINVAL);
    assert_non_null(strstr(kvp_blob_codec_last_error(c), "struct_size"));
    info.struct_size = sizeof info;
    assert_int_equal(kvp_blob_validate(c, b, pool, &root, P, NULL, NULL), KVP_OK);
    assert_int_equal(kvp_blob_import(NULL, 1, b, pool, &root, P, &r), KVP_EINVAL);
    assert_int_equal(kvp_blob_import(c, -1, b, pool, &root, P, &r), KVP_EINVAL);
    assert_int_equal(kvp_blob_import(c, 4, b, pool, &root, P, &r), KVP_EINVAL);
    assert_int_equal(kvp_blob_import(c, 1, NULL, pool, &root, P, &r), KVP_EINVAL);
    assert_int_equal(kvp_blob_import(c, 1, b, pool, &root, P + 1, &r), KVP_EINVAL);
    assert_int_equal(stats_of(c).rejected, 0); /* argument errors are not rejections */
    assert_int_equal(kvp_blob_import(c, 1, b, pool, &root, P, NULL), KVP_OK);
    assert_int_equal(kvp_blob_import(c, 3, b + pool, stg, NULL, 0, NULL), KVP_OK);
    /* statistics */
    kvp_blob_stats_t bs;
    memset(&bs, 0, sizeof bs);
    assert_int_equal(kvp_blob_codec_stats(NULL, &bs), KVP_EINVAL);
    assert_int_equal(kvp_blob_codec_stats(c, NULL), KVP_EINVAL);
    bs.struct_size = 8;
    assert_int_equal(kvp_blob_codec_stats(c, &bs), KVP_EINVAL);
    bs = stats_of(c);
    assert_int_equal(bs.struct_size, sizeof bs);
    assert_int_equal(bs.exported, 2);
    assert_int_equal(bs.imported, 3);
    assert_int_equal(bs.bytes_out, pool + stg);
    assert_int_equal(bs.bytes_in, 2 * pool + stg);
    free(b);
    kvp_blob_codec_destroy(c);
    kvp_store_destroy(st);
}

/* ---- the cache façade ------------------------------------------------------------ */

#define CL 2
#define CH 2
#define CD 64
#define QH 4
#define CROW (CH * CD)

static kvp_cache_t *cache_make(int32_t kf, int32_t vf, int32_t P, int64_t pages, int32_t max_seqs,
                               const kvp_allocator_t *a) {
    kvp_cache_params_t p;
    kvp_cache_params_init(&p);
    p.layers = CL;
    p.kv_heads = CH;
    p.head_dim = CD;
    p.page_size = P;
    p.k_format = kf;
    p.v_format = vf;
    p.num_pages = pages;
    p.max_seqs = max_seqs;
    if (a != NULL) p.allocator = *a;
    kvp_cache_t *c = NULL;
    char err[KVP_ERR_SIZE] = "";
    int rc = kvp_cache_create(&p, &c, err, sizeof err);
    if (rc != KVP_OK) print_error("cache: %s\n", err);
    assert_int_equal(rc, KVP_OK);
    kvp_cache_parts_t parts = {.struct_size = sizeof parts};
    assert_int_equal(kvp_cache_parts(c, &parts), KVP_OK);
    set_fp8(parts.store, CL, CH, kf, vf, 1.0f); /* both caches of a transfer alike */
    return c;
}

static kvp_cache_parts_t parts_of(const kvp_cache_t *c) {
    kvp_cache_parts_t parts;
    memset(&parts, 0, sizeof parts);
    parts.struct_size = sizeof parts;
    assert_int_equal(kvp_cache_parts(c, &parts), KVP_OK);
    return parts;
}

static void cache_identity(kvp_cache_t *c, uint8_t seed, const uint8_t *key, int32_t keylen) {
    kvp_blob_params_t p = bparams(seed, 0, 1, key, keylen);
    int rc = kvp_cache_set_blob(c, &p);
    if (rc != KVP_OK) print_error("set_blob: %s\n", kvp_cache_last_error(c));
    assert_int_equal(rc, KVP_OK);
}

static kvp_blob_codec_t *codec_of(const kvp_cache_t *c) {
    kvp_blob_codec_t *codec = NULL;
    assert_int_equal(kvp_cache_blob_codec(c, &codec), KVP_OK);
    assert_non_null(codec);
    return codec;
}

static kvp_pool_stats_t pool_stats_of(const kvp_cache_t *c) {
    kvp_pool_stats_t st;
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    assert_int_equal(kvp_pool_stats(parts_of(c).pool, &st), KVP_OK);
    return st;
}

static kvp_cache_tier_stats_t tier_stats_of(const kvp_cache_t *c, int32_t index) {
    kvp_cache_tier_stats_t st;
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    assert_int_equal(kvp_cache_tier_stats(c, index, &st), KVP_OK);
    return st;
}

static int64_t seq_len(const kvp_cache_t *c, int32_t seq) {
    kvp_seq_info_t in = {.struct_size = sizeof in};
    assert_int_equal(kvp_table_seq_info(parts_of(c).table, seq, &in), KVP_OK);
    return in.length;
}

#define MAX_SEQ_PAGES 64

/* A sequence's pages (a partly filled staging page last). */
static int32_t seq_pages(const kvp_cache_t *c, int32_t seq, int32_t pages[MAX_SEQ_PAGES]) {
    kvp_table_t *t = parts_of(c).table;
    kvp_seq_info_t in = {.struct_size = sizeof in};
    assert_int_equal(kvp_table_seq_info(t, seq, &in), KVP_OK);
    assert_true(in.num_pages <= MAX_SEQ_PAGES);
    assert_int_equal(kvp_table_seq_pages(t, seq, pages, MAX_SEQ_PAGES), KVP_OK);
    return in.num_pages;
}

/* The first `count` pages of two sequences (all when count < 0) hold the same bytes. */
static void assert_same_pages(const kvp_cache_t *a, int32_t sa, const kvp_cache_t *b, int32_t sb,
                              int32_t count) {
    int32_t pa[MAX_SEQ_PAGES], pb[MAX_SEQ_PAGES];
    int32_t na = seq_pages(a, sa, pa), nb = seq_pages(b, sb, pb);
    if (count < 0) {
        assert_int_equal(na, nb);
        assert_int_equal(seq_len(a, sa), seq_len(b, sb));
        count = na;
    }
    assert_true(count <= na && count <= nb);
    kvp_store_t *sta = parts_of(a).store, *stb = parts_of(b).store;
    int64_t len = seq_len(a, sa);
    int32_t P = layout_of(sta).page_size;
    for (int32_t i = 0; i < count; i++) {
        uint64_t n = page_size_bytes(sta, pa[i]);
        assert_int_equal(page_size_bytes(stb, pb[i]), n);
        if ((int64_t)(i + 1) * P > len) { /* the partly filled last page */
            assert_same_tokens(sta, pa[i], stb, pb[i], (int32_t)(len - (int64_t)i * P));
            continue;
        }
        uint8_t *x = page_copy_scrubbed(sta, pa[i]), *y = page_copy_scrubbed(stb, pb[i]);
        if (memcmp(x, y, (size_t)n) != 0) print_error("page %d differs\n", (int)i);
        assert_memory_equal(x, y, (size_t)n);
        free(x);
        free(y);
    }
}

/* K/V of position `pos` of layer `layer`: a function of (seed, layer, pos). */
static void kv_rows(uint64_t seed, int32_t layer, int64_t pos0, int32_t n, float *k, float *v) {
    for (int32_t t = 0; t < n; t++) {
        rng_t r = {seed * 1000003u + (uint64_t)(pos0 + t) * 7919u + (uint64_t)layer};
        for (int i = 0; i < CROW; i++) {
            k[(size_t)t * CROW + (size_t)i] = rng_float(&r) + ((i % 32) == 3 ? 4.0f : 0.0f);
            v[(size_t)t * CROW + (size_t)i] = rng_float(&r);
        }
    }
}

/* One step of `n` new tokens at positions pos0..: writes K/V of every layer;
 * with `out` ([CL][n][QH][CD]), attends with queries of (seed, layer, pos0). */
static void step(kvp_cache_t *c, int32_t seq, const int32_t *tokens, int32_t n, int64_t pos0,
                 uint64_t seed, float *out) {
    int rc = kvp_cache_begin_step(c, &seq, 1, &n, tokens);
    if (rc != KVP_OK) print_error("begin_step: %s\n", kvp_cache_last_error(c));
    assert_int_equal(rc, KVP_OK);
    float *k = malloc(sizeof(float) * (size_t)n * CROW);
    float *v = malloc(sizeof(float) * (size_t)n * CROW);
    float *q = malloc(sizeof(float) * (size_t)n * QH * CD);
    assert_true(k && v && q);
    for (int32_t layer = 0; layer < CL; layer++) {
        kv_rows(seed, layer, pos0, n, k, v);
        rc = kvp_cache_write(c, layer, KVP_FORMAT_FP32, k, v, 0, 0);
        if (rc != KVP_OK) print_error("write: %s\n", kvp_cache_last_error(c));
        assert_int_equal(rc, KVP_OK);
        if (out == NULL) continue;
        rng_t r = {seed ^ (0x5151u + (uint64_t)layer * 31u + (uint64_t)pos0 * 977u)};
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

/* Export a whole sequence (malloc'd, one spare byte). */
static uint8_t *seq_export(kvp_cache_t *c, int32_t seq, const int32_t *tokens, int64_t n,
                           int32_t *blobs, uint64_t *bytes) {
    assert_int_equal(kvp_cache_seq_export_size(c, seq, blobs, bytes), KVP_OK);
    uint8_t *buf = calloc(1, (size_t)*bytes + 1);
    assert_non_null(buf);
    int rc = kvp_cache_seq_export(c, seq, tokens, n, buf, *bytes);
    if (rc != KVP_OK) print_error("seq_export: %s\n", kvp_cache_last_error(c));
    assert_int_equal(rc, KVP_OK);
    return buf;
}

/* Chain root and hashes of a prompt under a cache's identity. */
static void chain_of(const kvp_cache_t *c, uint64_t salt, const int32_t *tokens, int64_t n,
                     kvp_hash_t *root, kvp_hash_t *hashes) {
    kvp_blob_codec_t *codec = codec_of(c);
    assert_int_equal(kvp_blob_chain_root(codec, salt, root), KVP_OK);
    assert_int_equal(kvp_blob_chain(codec, root, tokens, n, hashes), KVP_OK);
}

/* ---- 7. sequence transfer ----------------------------------------------------------- */

static void transfer(int32_t kf, int32_t vf, int32_t P, int32_t n) {
    const uint64_t salt = 5;
    int32_t pages_needed = (n + P - 1) / P;
    int64_t pool = pages_needed + 16;
    kvp_cache_t *a = cache_make(kf, vf, P, pool, 6, NULL), *b = cache_make(kf, vf, P, pool, 6, NULL);
    cache_identity(a, 0, NULL, 0);
    cache_identity(b, 0, NULL, 0);
    kvp_layout_t l = layout_of(parts_of(a).store);
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)n);
    for (int32_t i = 0; i < n; i++) toks[i] = 100 + 7 * i;
    /* bytes nobody wrote: a partly filled last page keeps them */
    for (int32_t i = 0; i < (int32_t)pool; i++) junk_page(parts_of(a).store, i);
    int32_t sa = new_seq(a, salt);
    step(a, sa, toks, n, 0, 1, NULL);

    int32_t blobs = 0;
    uint64_t bytes = 0;
    uint8_t *buf = seq_export(a, sa, toks, n, &blobs, &bytes);
    int32_t full = n / P, tail = n % P;
    assert_int_equal(blobs, pages_needed);
    uint64_t last = tail == 0 ? HDR + l.page_bytes
                              : HDR + (l.needs_staging ? l.staging_page_bytes : l.page_bytes);
    assert_int_equal(bytes, (uint64_t)full * (HDR + l.page_bytes) + (tail ? last : 0));
    /* consecutive blobs, each named by kvp_blob_chain */
    kvp_hash_t root, *hashes = malloc(sizeof(kvp_hash_t) * (size_t)blobs);
    chain_of(a, salt, toks, n, &root, hashes);
    uint64_t off = 0;
    for (int32_t i = 0; i < blobs; i++) {
        bool partial = i == full;
        uint64_t size = partial ? last : HDR + l.page_bytes;
        kvp_blob_info_t info = {.struct_size = sizeof info};
        assert_int_equal(kvp_blob_validate(codec_of(b), buf + off, size, &hashes[i],
                                           partial ? tail : P, &info, NULL),
                         KVP_OK);
        assert_int_equal(info.staging, partial && l.needs_staging);
        off += size;
    }
    assert_int_equal(off, bytes);
    /* export's own checks */
    assert_int_equal(kvp_cache_seq_export(a, sa, toks, n - 1, buf, bytes), KVP_EINVAL);
    assert_int_equal(kvp_cache_seq_export(a, sa, toks, n, buf, bytes - 1), KVP_EINVAL);
    assert_int_equal(kvp_cache_seq_export(a, sa, NULL, n, buf, bytes), KVP_EINVAL);
    assert_int_equal(kvp_cache_seq_export(a, sa, toks, n, NULL, bytes), KVP_EINVAL);
    assert_int_equal(kvp_cache_seq_export(a, 12345, toks, n, buf, bytes), KVP_ENOENT);
    assert_int_equal(kvp_cache_seq_export(NULL, sa, toks, n, buf, bytes), KVP_EINVAL);

    /* import: every page bit for bit */
    kvp_blob_stats_t before = stats_of(codec_of(b));
    int32_t sb = new_seq(b, salt), r = -1;
    int rc = kvp_cache_seq_import(b, sb, toks, n, buf, bytes, &r);
    if (rc != KVP_OK) print_error("seq_import: %s\n", kvp_cache_last_error(b));
    assert_int_equal(rc, KVP_OK);
    assert_int_equal(r, KVP_BLOB_OK);
    assert_int_equal(stats_of(codec_of(b)).imported - before.imported, (uint64_t)blobs);
    assert_same_pages(a, sa, b, sb, -1);
    /* decoding goes on identically, across a page edge */
    float *oa = malloc(sizeof(float) * CL * QH * CD), *ob = malloc(sizeof(float) * CL * QH * CD);
    for (int32_t s = 0; s <= P - tail; s++) {
        int32_t tok = 900 + s;
        step(a, sa, &tok, 1, n + s, 77 + (uint64_t)s, oa);
        step(b, sb, &tok, 1, n + s, 77 + (uint64_t)s, ob);
        assert_memory_equal(oa, ob, sizeof(float) * CL * QH * CD);
    }
    /* (pages each cache took fresh hold bytes nobody wrote: compare the imported ones) */
    assert_int_equal(seq_len(a, sa), seq_len(b, sb));
    assert_same_pages(a, sa, b, sb, full);

    /* refusals leave the sequence empty and the pool as it was */
    kvp_pool_stats_t ps = pool_stats_of(b);
    int32_t *other = malloc(sizeof(int32_t) * (size_t)n);
    memcpy(other, toks, sizeof(int32_t) * (size_t)n);
    other[n > P ? P + 1 : 0] += 1; /* another token id in the second page */
    int32_t s1 = new_seq(b, salt);
    before = stats_of(codec_of(b));
    r = -1;
    assert_int_equal(kvp_cache_seq_import(b, s1, other, n, buf, bytes, &r), KVP_EBADBLOB);
    assert_int_equal(r, KVP_BLOB_HASH);
    assert_int_equal(stats_of(codec_of(b)).rejects[KVP_BLOB_HASH] - before.rejects[KVP_BLOB_HASH], 1);
    assert_non_null(strstr(kvp_cache_last_error(b), "hash"));
    assert_int_equal(seq_len(b, s1), 0);
    int32_t s2 = new_seq(b, salt + 1); /* another salt: another chain */
    r = -1;
    assert_int_equal(kvp_cache_seq_import(b, s2, toks, n, buf, bytes, &r), KVP_EBADBLOB);
    assert_int_equal(r, KVP_BLOB_HASH);
    assert_int_equal(seq_len(b, s2), 0);
    r = -1;
    assert_int_equal(kvp_cache_seq_import(b, sb, toks, n, buf, bytes, &r), KVP_ESTATE);
    r = -1;
    assert_int_equal(kvp_cache_seq_import(b, s1, toks, n, buf, bytes - 1, &r), KVP_EBADBLOB);
    assert_int_equal(r, KVP_BLOB_TRUNCATED);
    r = -1;
    assert_int_equal(kvp_cache_seq_import(b, s1, toks, n, buf, bytes + 1, &r), KVP_EBADBLOB);
    assert_int_equal(r, KVP_BLOB_TRUNCATED);
    r = -1;
    assert_int_equal(kvp_cache_seq_import(b, s1, toks, n, buf, HDR - 1, &r), KVP_EBADBLOB);
    assert_int_equal(r, KVP_BLOB_TRUNCATED);
    assert_int_equal(seq_len(b, s1), 0);
    kvp_pool_stats_t ps2 = pool_stats_of(b);
    assert_int_equal(ps2.used_pages, ps.used_pages);
    assert_int_equal(ps2.available_pages, ps.available_pages);
    assert_int_equal(kvp_cache_seq_import(b, s1, NULL, n, buf, bytes, &r), KVP_EINVAL);
    assert_int_equal(kvp_cache_seq_import(b, s1, toks, 0, buf, bytes, &r), KVP_EINVAL);
    assert_int_equal(kvp_cache_seq_import(b, s1, toks, n, NULL, bytes, &r), KVP_EINVAL);
    assert_int_equal(kvp_cache_seq_import(b, 12345, toks, n, buf, bytes, &r), KVP_ENOENT);
    assert_int_equal(kvp_cache_seq_import(NULL, s1, toks, n, buf, bytes, &r), KVP_EINVAL);

    /* the prefix B holds already is attached, not copied */
    int32_t s3 = new_seq(b, salt);
    before = stats_of(codec_of(b));
    ps = pool_stats_of(b);
    assert_int_equal(kvp_cache_seq_import(b, s3, toks, n, buf, bytes, &r), KVP_OK);
    assert_int_equal(stats_of(codec_of(b)).imported - before.imported, (uint64_t)(blobs - full));
    ps2 = pool_stats_of(b);
    assert_int_equal(ps2.prefix_hit_tokens - ps.prefix_hit_tokens, (uint64_t)full * (uint64_t)P);
    int32_t p3[MAX_SEQ_PAGES], pbb[MAX_SEQ_PAGES];
    seq_pages(b, s3, p3);
    seq_pages(b, sb, pbb);
    for (int32_t i = 0; i < full; i++) assert_int_equal(p3[i], pbb[i]);
    assert_int_equal(seq_len(b, s3), n);
    assert_same_pages(a, sa, b, s3, full);

    /* too few free pages: refused before anything is written */
    kvp_cache_t *small = cache_make(kf, vf, P, full > 1 ? full - 1 : 1, 2, NULL);
    cache_identity(small, 0, NULL, 0);
    int32_t s4 = new_seq(small, salt);
    if (full >= 2) {
        assert_int_equal(kvp_cache_seq_import(small, s4, toks, n, buf, bytes, &r), KVP_ENOSPC);
        assert_int_equal(seq_len(small, s4), 0);
        kvp_pool_stats_t sps = pool_stats_of(small);
        assert_int_equal(sps.used_pages, 0);
        assert_int_equal(sps.available_pages, full - 1);
    }
    kvp_cache_destroy(small);

    free(other);
    free(oa);
    free(ob);
    free(hashes);
    free(buf);
    free(toks);
    kvp_cache_destroy(a);
    kvp_cache_destroy(b);
}

static void test_seq_transfer_every_format(void **state) {
    (void)state;
    require_blob();
    for (int i = 0; i < NUM_PAIRS; i++) transfer(FORMAT_PAIRS[i][0], FORMAT_PAIRS[i][1], 8, 28);
    /* whole pages only; more pages than one import batch */
    transfer(KVP_FORMAT_FP16, KVP_FORMAT_FP16, 8, 32);
    transfer(KVP_FORMAT_FP16, KVP_FORMAT_FP16, 4, 154);
    transfer(KVP_FORMAT_INT8, KVP_FORMAT_INT4, 4, 154);
}

/* Caches that are not the exporter's kind refuse, and say why. */
static void test_seq_import_refusals(void **state) {
    (void)state;
    require_blob();
    const int32_t P = 8, n = 28;
    int32_t toks[32];
    for (int i = 0; i < 32; i++) toks[i] = 40 + i;
    typedef struct {
        int32_t akf, avf, bkf, bvf, bP, n;
        uint8_t bseed;
        int32_t reason;
    } case_t;
    const case_t cases[] = {
        {KVP_FORMAT_FP16, KVP_FORMAT_FP16, KVP_FORMAT_FP16, KVP_FORMAT_FP16, 16, 8, 0, KVP_BLOB_LAYOUT},
        {KVP_FORMAT_BF16, KVP_FORMAT_BF16, KVP_FORMAT_FP16, KVP_FORMAT_FP16, P, n, 0, KVP_BLOB_FORMAT},
        {KVP_FORMAT_FP32, KVP_FORMAT_FP32, KVP_FORMAT_FP16, KVP_FORMAT_FP16, P, n, 0, KVP_BLOB_FORMAT},
        {KVP_FORMAT_INT8, KVP_FORMAT_INT8, KVP_FORMAT_INT8, KVP_FORMAT_INT4, P, n, 0, KVP_BLOB_FORMAT},
        {KVP_FORMAT_FP16, KVP_FORMAT_FP16, KVP_FORMAT_FP16, KVP_FORMAT_FP16, P, n, 1, KVP_BLOB_FINGERPRINT},
        {KVP_FORMAT_FP16, KVP_FORMAT_FP16, KVP_FORMAT_FP16, KVP_FORMAT_FP16, 16, n, 0, KVP_BLOB_TRUNCATED},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const case_t *k = &cases[i];
        kvp_cache_t *a = cache_make(k->akf, k->avf, P, 16, 2, NULL);
        kvp_cache_t *b = cache_make(k->bkf, k->bvf, k->bP, 16, 2, NULL);
        cache_identity(a, 0, NULL, 0);
        cache_identity(b, k->bseed, NULL, 0);
        int32_t sa = new_seq(a, 0), sb = new_seq(b, 0), blobs = 0, r = -1;
        step(a, sa, toks, k->n, 0, 2, NULL);
        uint64_t bytes = 0;
        uint8_t *buf = seq_export(a, sa, toks, k->n, &blobs, &bytes);
        kvp_pool_stats_t before = pool_stats_of(b);
        assert_int_equal(kvp_cache_seq_import(b, sb, toks, k->n, buf, bytes, &r), KVP_EBADBLOB);
        if (r != k->reason)
            print_error("case %d: %s, expected %s (%s)\n", (int)i, kvp_blob_reason_name(r),
                        kvp_blob_reason_name(k->reason), kvp_cache_last_error(b));
        assert_int_equal(r, k->reason);
        assert_int_equal(seq_len(b, sb), 0);
        assert_int_equal(pool_stats_of(b).used_pages, before.used_pages);
        free(buf);
        kvp_cache_destroy(a);
        kvp_cache_destroy(b);
    }
    /* keys: a keyed cache refuses blobs without a tag, and blobs of another key */
    uint8_t k1[16], k2[16];
    memset(k1, 1, sizeof k1);
    memset(k2, 2, sizeof k2);
    kvp_cache_t *a = cache_make(KVP_FORMAT_FP16, KVP_FORMAT_FP16, P, 16, 2, NULL);
    kvp_cache_t *b1 = cache_make(KVP_FORMAT_FP16, KVP_FORMAT_FP16, P, 16, 2, NULL);
    kvp_cache_t *b2 = cache_make(KVP_FORMAT_FP16, KVP_FORMAT_FP16, P, 16, 2, NULL);
    kvp_cache_t *b3 = cache_make(KVP_FORMAT_FP16, KVP_FORMAT_FP16, P, 16, 2, NULL);
    cache_identity(a, 0, k1, 16);
    cache_identity(b1, 0, NULL, 0);
    cache_identity(b2, 0, k2, 16);
    cache_identity(b3, 0, k1, 16);
    int32_t sa = new_seq(a, 0), blobs = 0, r = -1;
    step(a, sa, toks, n, 0, 2, NULL);
    uint64_t bytes = 0;
    uint8_t *buf = seq_export(a, sa, toks, n, &blobs, &bytes);
    int32_t s = new_seq(b1, 0);
    assert_int_equal(kvp_cache_seq_import(b1, s, toks, n, buf, bytes, &r), KVP_EBADBLOB);
    assert_int_equal(r, KVP_BLOB_AUTH);
    s = new_seq(b2, 0);
    assert_int_equal(kvp_cache_seq_import(b2, s, toks, n, buf, bytes, &r), KVP_EBADBLOB);
    assert_int_equal(r, KVP_BLOB_AUTH);
    s = new_seq(b3, 0);
    assert_int_equal(kvp_cache_seq_import(b3, s, toks, n, buf, bytes, &r), KVP_OK);
    assert_same_pages(a, sa, b3, s, -1);
    free(buf);
    kvp_cache_destroy(a);
    kvp_cache_destroy(b1);
    kvp_cache_destroy(b2);
    kvp_cache_destroy(b3);

    /* fp8 caches whose scales differ */
    a = cache_make(KVP_FORMAT_FP8_E4M3, KVP_FORMAT_FP8_E4M3, P, 16, 2, NULL);
    b1 = cache_make(KVP_FORMAT_FP8_E4M3, KVP_FORMAT_FP8_E4M3, P, 16, 2, NULL);
    set_fp8(parts_of(b1).store, CL, CH, KVP_FORMAT_FP8_E4M3, KVP_FORMAT_FP8_E4M3, 3.0f);
    cache_identity(a, 0, NULL, 0);
    cache_identity(b1, 0, NULL, 0);
    sa = new_seq(a, 0);
    step(a, sa, toks, n, 0, 2, NULL);
    buf = seq_export(a, sa, toks, n, &blobs, &bytes);
    s = new_seq(b1, 0);
    assert_int_equal(kvp_cache_seq_import(b1, s, toks, n, buf, bytes, &r), KVP_EBADBLOB);
    assert_int_equal(r, KVP_BLOB_FORMAT);
    free(buf);
    kvp_cache_destroy(a);
    kvp_cache_destroy(b1);

    /* without an identity: nothing of this group works */
    a = cache_make(KVP_FORMAT_FP16, KVP_FORMAT_FP16, P, 16, 2, NULL);
    sa = new_seq(a, 0);
    step(a, sa, toks, n, 0, 2, NULL);
    kvp_blob_codec_t *codec = NULL;
    assert_int_equal(kvp_cache_blob_codec(a, &codec), KVP_ESTATE);
    assert_int_equal(kvp_cache_blob_codec(a, NULL), KVP_EINVAL);
    assert_int_equal(kvp_cache_blob_codec(NULL, &codec), KVP_EINVAL);
    assert_int_equal(kvp_cache_seq_export_size(a, sa, &blobs, &bytes), KVP_ESTATE);
    uint8_t one[HDR];
    assert_int_equal(kvp_cache_seq_export(a, sa, toks, n, one, sizeof one), KVP_ESTATE);
    s = new_seq(a, 0);
    assert_int_equal(kvp_cache_seq_import(a, s, toks, n, one, sizeof one, &r), KVP_ESTATE);
    assert_int_equal(kvp_cache_set_blob(a, NULL), KVP_EINVAL);
    assert_int_equal(kvp_cache_set_blob(NULL, NULL), KVP_EINVAL);
    cache_identity(a, 0, NULL, 0);
    kvp_blob_params_t p = bparams(0, 0, 1, NULL, 0);
    assert_int_equal(kvp_cache_set_blob(a, &p), KVP_ESTATE); /* once */
    assert_int_equal(kvp_cache_seq_export_size(a, sa, NULL, &bytes), KVP_EINVAL);
    assert_int_equal(kvp_cache_seq_export_size(a, 12345, &blobs, &bytes), KVP_ENOENT);
    assert_int_equal(kvp_cache_seq_export_size(NULL, sa, &blobs, &bytes), KVP_EINVAL);
    assert_int_equal(kvp_cache_seq_export(a, s, toks, 0, one, sizeof one), KVP_EINVAL);
    kvp_cache_destroy(a);
}

/* ---- a tier in memory ------------------------------------------------------------------ */

#define MT_CAP 128

typedef struct {
    int32_t n;
    kvp_hash_t key[MT_CAP];
    uint8_t *blob[MT_CAP];
    uint64_t size[MT_CAP];
    int fail_get;
    int puts, removes;
} memtier;

static int mt_find(const memtier *m, const kvp_hash_t *k) {
    for (int32_t i = 0; i < m->n; i++)
        if (memcmp(m->key[i].bytes, k->bytes, 32) == 0) return i;
    return -1;
}

static int mt_get(void *self, int32_t n, const kvp_hash_t *keys, void *const *bufs,
                  const uint64_t *caps, uint64_t *sizes) {
    memtier *m = (memtier *)self;
    if (m->fail_get) return KVP_EIO;
    for (int32_t i = 0; i < n; i++) {
        int j = mt_find(m, &keys[i]);
        sizes[i] = 0;
        if (j < 0 || m->size[j] > caps[i]) continue;
        memcpy(bufs[i], m->blob[j], (size_t)m->size[j]);
        sizes[i] = m->size[j];
    }
    return KVP_OK;
}

static int mt_put(void *self, int32_t n, const kvp_hash_t *keys, const void *const *blobs,
                  const uint64_t *sizes) {
    memtier *m = (memtier *)self;
    for (int32_t i = 0; i < n; i++) {
        int j = mt_find(m, &keys[i]);
        if (j < 0) {
            if (m->n == MT_CAP) return KVP_EIO;
            j = m->n++;
            m->key[j] = keys[i];
            m->blob[j] = NULL;
        }
        free(m->blob[j]);
        m->blob[j] = malloc((size_t)sizes[i]);
        assert_non_null(m->blob[j]);
        memcpy(m->blob[j], blobs[i], (size_t)sizes[i]);
        m->size[j] = sizes[i];
        m->puts++;
    }
    return KVP_OK;
}

static int mt_exists(void *self, int32_t n, const kvp_hash_t *keys, uint8_t *present) {
    memtier *m = (memtier *)self;
    for (int32_t i = 0; i < n; i++) present[i] = mt_find(m, &keys[i]) >= 0;
    return KVP_OK;
}

static int mt_remove(void *self, int32_t n, const kvp_hash_t *keys) {
    memtier *m = (memtier *)self;
    for (int32_t i = 0; i < n; i++) {
        int j = mt_find(m, &keys[i]);
        if (j < 0) continue;
        free(m->blob[j]);
        m->n--;
        m->key[j] = m->key[m->n];
        m->blob[j] = m->blob[m->n];
        m->size[j] = m->size[m->n];
        m->removes++;
    }
    return KVP_OK;
}

static int mt_usage(void *self, uint64_t *entries, uint64_t *bytes) {
    memtier *m = (memtier *)self;
    *entries = (uint64_t)m->n;
    *bytes = 0;
    for (int32_t i = 0; i < m->n; i++) *bytes += m->size[i];
    return KVP_OK;
}

static const char *mt_last_error(void *self) {
    (void)self;
    return "the memory tier fails on purpose";
}

static void mt_destroy(void *self) {
    memtier *m = (memtier *)self;
    for (int32_t i = 0; i < m->n; i++) free(m->blob[i]);
    free(m);
}

static kvp_blob_tier_t *mt_make(memtier **out) {
    memtier *m = calloc(1, sizeof *m);
    assert_non_null(m);
    kvp_blob_tier_ops_t ops;
    memset(&ops, 0, sizeof ops);
    ops.struct_size = sizeof ops;
    ops.get = mt_get;
    ops.put = mt_put;
    ops.exists = mt_exists;
    ops.remove = mt_remove;
    ops.usage = mt_usage;
    ops.last_error = mt_last_error;
    ops.destroy = mt_destroy;
    kvp_blob_tier_t *t = NULL;
    char err[KVP_ERR_SIZE] = "";
    int rc = kvp_blob_tier_create(&ops, m, "mem", &t, err, sizeof err);
    if (rc != KVP_OK) print_error("tier: %s\n", err);
    assert_int_equal(rc, KVP_OK);
    *out = m;
    return t;
}

/* ---- events ------------------------------------------------------------------------------ */

#define MAX_EVENTS 512

typedef struct {
    int n;
    kvp_cache_event_t ev[MAX_EVENTS];
} evlog;

static void ev_record(void *opaque, const kvp_cache_event_t *e) {
    evlog *l = (evlog *)opaque;
    assert_int_equal(e->struct_size, sizeof *e);
    if (l->n < MAX_EVENTS) l->ev[l->n] = *e;
    l->n++;
}

static evlog *ev_new(kvp_cache_t *c) {
    evlog *l = calloc(1, sizeof *l);
    assert_non_null(l);
    assert_int_equal(kvp_cache_set_event_callback(c, ev_record, l), KVP_OK);
    return l;
}

/* The events of one kind, in order (at most `cap`). */
static int ev_of(const evlog *l, int32_t kind, const kvp_cache_event_t **out, int cap) {
    int k = 0;
    for (int i = 0; i < l->n && i < MAX_EVENTS; i++)
        if (l->ev[i].kind == kind && k < cap) out[k++] = &l->ev[i];
    return k;
}

/* STORED events of a prompt's first `count` pages: chain hashes, parents and tier. */
static void assert_stored(const evlog *l, const kvp_hash_t *root, const kvp_hash_t *hashes,
                          const int32_t *pages, int count, int32_t tier) {
    const kvp_cache_event_t *st[64];
    int k = ev_of(l, KVP_EVENT_PAGE_STORED, st, 64);
    assert_int_equal(k, count);
    for (int i = 0; i < count; i++) {
        assert_int_equal(st[i]->page, pages[i]);
        assert_int_equal(st[i]->parent, i == 0 ? -1 : pages[i - 1]);
        assert_int_equal(st[i]->tier, tier);
        assert_memory_equal(st[i]->chain.bytes, hashes[i].bytes, 32);
        assert_memory_equal(st[i]->parent_chain.bytes, i == 0 ? root->bytes : hashes[i - 1].bytes,
                            32);
    }
}

/* ---- 8, 9. tiers and their events ----------------------------------------------------------- */

static void tier_roundtrip(int32_t kf, int32_t vf) {
    const int32_t P = 8, n = 28, full = 3;
    const uint64_t salt = 9;
    memtier *m = NULL;
    kvp_blob_tier_t *tier = mt_make(&m);
    int32_t toks[48];
    for (int i = 0; i < 48; i++) toks[i] = 1000 + 3 * i;

    /* A writes every full page through */
    kvp_cache_t *a = cache_make(kf, vf, P, 16, 4, NULL);
    cache_identity(a, 0, NULL, 0);
    int32_t idx = -1;
    assert_int_equal(kvp_cache_add_tier(a, tier, KVP_TIER_WRITE_THROUGH, &idx), KVP_OK);
    assert_int_equal(idx, 0);
    evlog *ea = ev_new(a);
    int32_t sa = new_seq(a, salt);
    step(a, sa, toks, n, 0, 3, NULL);
    assert_int_equal(m->n, 0); /* K/V complete only after the step: written at the next */
    kvp_hash_t root, hx[4];
    chain_of(a, salt, toks, n, &root, hx);
    int32_t pa[MAX_SEQ_PAGES];
    seq_pages(a, sa, pa);
    assert_stored(ea, &root, hx, pa, full, KVP_TIER_NONE);
    assert_int_equal(kvp_cache_flush(a), KVP_OK);
    assert_int_equal(kvp_cache_flush(NULL), KVP_EINVAL);
    assert_int_equal(m->n, full);
    uint64_t bb = 0;
    assert_int_equal(kvp_blob_size(codec_of(a), 0, &bb), KVP_OK);
    for (int i = 0; i < full; i++) {
        int j = mt_find(m, &hx[i]);
        assert_true(j >= 0);
        assert_int_equal(m->size[j], bb);
        expect_accept(codec_of(a), m->blob[j], m->size[j], &hx[i], P);
        uint8_t *want = page_copy(parts_of(a).store, pa[i]);
        assert_memory_equal(m->blob[j] + HDR, want, (size_t)(bb - HDR));
        free(want);
    }
    kvp_cache_tier_stats_t ts = tier_stats_of(a, 0);
    assert_int_equal(ts.written, full);
    assert_int_equal(ts.bytes_out, full * bb);
    assert_int_equal(ts.errors, 0);
    assert_int_equal(ts.lookups, 0);
    /* the next step writes nothing again */
    float *oa = malloc(sizeof(float) * CL * QH * CD), *ob = malloc(sizeof(float) * CL * QH * CD);
    int32_t tok = 500;
    step(a, sa, &tok, 1, n, 44, oa);
    assert_int_equal(m->puts, full);

    /* B finds the prompt in the tier */
    kvp_cache_t *b = cache_make(kf, vf, P, 16, 4, NULL);
    cache_identity(b, 0, NULL, 0);
    assert_int_equal(kvp_cache_add_tier(b, tier, KVP_TIER_READ, NULL), KVP_OK);
    evlog *eb = ev_new(b);
    int32_t sb = new_seq(b, salt);
    int64_t matched = -1;
    assert_int_equal(kvp_cache_seq_attach_prefix(b, sb, toks, n, &matched), KVP_OK);
    assert_int_equal(matched, full * P); /* whole pages only */
    assert_same_pages(a, sa, b, sb, full);
    ts = tier_stats_of(b, 0);
    assert_int_equal(ts.lookups, full);
    assert_int_equal(ts.hit_pages, full);
    assert_int_equal(ts.miss_pages, 0);
    assert_int_equal(ts.rejected, 0);
    assert_int_equal(ts.bytes_in, full * bb);
    assert_int_equal(ts.written, 0);
    assert_int_equal(stats_of(codec_of(b)).imported, full);
    int32_t pb[MAX_SEQ_PAGES];
    seq_pages(b, sb, pb);
    assert_stored(eb, &root, hx, pb, full, 0);
    /* ... and continues as A did, bit for bit */
    step(b, sb, toks + full * P, n - full * P, full * P, 3, NULL);
    step(b, sb, &tok, 1, n, 44, ob);
    assert_memory_equal(oa, ob, sizeof(float) * CL * QH * CD);
    assert_same_pages(a, sa, b, sb, full);

    /* a corrupt blob: the pages before it are imported, it is counted and removed */
    int j = mt_find(m, &hx[1]);
    assert_true(j >= 0);
    m->blob[j][HDR + 5] ^= 0x10;
    kvp_cache_t *c = cache_make(kf, vf, P, 16, 4, NULL);
    cache_identity(c, 0, NULL, 0);
    assert_int_equal(kvp_cache_add_tier(c, tier, KVP_TIER_READ, NULL), KVP_OK);
    int32_t sc = new_seq(c, salt);
    assert_int_equal(kvp_cache_seq_attach_prefix(c, sc, toks, n, &matched), KVP_OK);
    assert_int_equal(matched, P);
    assert_same_pages(a, sa, c, sc, 1);
    ts = tier_stats_of(c, 0);
    assert_int_equal(ts.lookups, full);
    assert_int_equal(ts.hit_pages, 1);
    assert_int_equal(ts.rejected, 1);
    assert_int_equal(ts.rejects[KVP_BLOB_CHECKSUM], 1);
    assert_int_equal(ts.miss_pages, 1);
    assert_int_equal(ts.bytes_in, bb);
    assert_int_equal(stats_of(codec_of(c)).rejects[KVP_BLOB_CHECKSUM], 1);
    assert_true(mt_find(m, &hx[1]) < 0);
    assert_int_equal(m->n, full - 1);

    /* a failing tier: misses and an error; the pool's match stands */
    m->fail_get = 1;
    int32_t sc2 = new_seq(c, salt);
    assert_int_equal(kvp_cache_seq_attach_prefix(c, sc2, toks, n, &matched), KVP_OK);
    assert_int_equal(matched, P);
    ts = tier_stats_of(c, 0);
    assert_int_equal(ts.errors, 1);
    assert_int_equal(ts.lookups, full + 2);
    assert_int_equal(ts.miss_pages, 3);
    assert_int_equal(ts.hit_pages, 1);
    kvp_blob_tier_stats_t bts;
    memset(&bts, 0, sizeof bts);
    bts.struct_size = sizeof bts;
    assert_int_equal(kvp_blob_tier_stats(tier, &bts), KVP_OK);
    assert_int_equal(bts.errors, 1);
    assert_int_equal(bts.entries, full - 1);
    assert_non_null(strstr(kvp_blob_tier_last_error(tier), "on purpose"));
    m->fail_get = 0;

    /* the pool's page first, the rest from the tier (page 1 written again) */
    uint64_t n1 = 0;
    uint8_t *b1 = blob_of(codec_of(a), parts_of(a).store, pa[1], P, &hx[1], &n1);
    const void *blobs[1] = {b1};
    assert_int_equal(kvp_blob_tier_put(tier, 1, &hx[1], blobs, &n1), KVP_OK);
    free(b1);
    evlog *ec = ev_new(c);
    int32_t sc3 = new_seq(c, salt);
    assert_int_equal(kvp_cache_seq_attach_prefix(c, sc3, toks, n, &matched), KVP_OK);
    assert_int_equal(matched, full * P);
    assert_same_pages(a, sa, c, sc3, full);
    int32_t pc[MAX_SEQ_PAGES];
    seq_pages(c, sc3, pc);
    const kvp_cache_event_t *st[8];
    assert_int_equal(ev_of(ec, KVP_EVENT_PAGE_STORED, st, 8), 2);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(st[i]->tier, 0);
        assert_int_equal(st[i]->page, pc[i + 1]);
        assert_int_equal(st[i]->parent, pc[i]);
        assert_memory_equal(st[i]->chain.bytes, hx[i + 1].bytes, 32);
        assert_memory_equal(st[i]->parent_chain.bytes, hx[i].bytes, 32);
    }
    ts = tier_stats_of(c, 0);
    assert_int_equal(ts.lookups, full + 4);
    assert_int_equal(ts.hit_pages, 3);
    free(ec);

    free(oa);
    free(ob);
    free(ea);
    free(eb);
    kvp_cache_destroy(a);
    kvp_cache_destroy(b);
    kvp_cache_destroy(c);
    kvp_blob_tier_destroy(tier);
}

static void test_tier_write_through_and_read(void **state) {
    (void)state;
    require_blob();
    tier_roundtrip(KVP_FORMAT_FP16, KVP_FORMAT_FP16);
    tier_roundtrip(KVP_FORMAT_INT8, KVP_FORMAT_INT4);
}

static void tier_write_back(int32_t kf, int32_t vf) {
    const int32_t P = 8;
    const uint64_t salt = 3;
    memtier *m = NULL;
    kvp_blob_tier_t *tier = mt_make(&m);
    int32_t t1[24], t2[48];
    for (int i = 0; i < 24; i++) t1[i] = 7 + i;
    for (int i = 0; i < 48; i++) t2[i] = 9000 + i;
    kvp_cache_t *w = cache_make(kf, vf, P, 6, 4, NULL);
    cache_identity(w, 0, NULL, 0);
    int32_t idx = -1;
    assert_int_equal(kvp_cache_add_tier(w, tier, KVP_TIER_WRITE_BACK, &idx), KVP_OK);
    evlog *e = ev_new(w);
    int32_t s1 = new_seq(w, salt);
    step(w, s1, t1, 24, 0, 5, NULL);
    int32_t p1[MAX_SEQ_PAGES];
    assert_int_equal(seq_pages(w, s1, p1), 3);
    uint8_t *saved[3];
    for (int i = 0; i < 3; i++) saved[i] = page_copy(parts_of(w).store, p1[i]);
    kvp_hash_t root, hx[3];
    chain_of(w, salt, t1, 24, &root, hx);
    assert_int_equal(kvp_cache_seq_release(w, s1), KVP_OK);
    assert_int_equal(kvp_cache_flush(w), KVP_OK);
    assert_int_equal(m->n, 0); /* cached, not evicted: nothing to write yet */
    /* a new prompt needs every page: the cached ones are evicted, and written */
    int32_t s2 = new_seq(w, salt);
    step(w, s2, t2, 48, 0, 6, NULL);
    assert_int_equal(m->n, 3);
    uint64_t bb = 0;
    assert_int_equal(kvp_blob_size(codec_of(w), 0, &bb), KVP_OK);
    for (int i = 0; i < 3; i++) {
        int j = mt_find(m, &hx[i]);
        assert_true(j >= 0);
        assert_memory_equal(m->blob[j] + HDR, saved[i], (size_t)(bb - HDR));
        expect_accept(codec_of(w), m->blob[j], m->size[j], &hx[i], P);
    }
    const kvp_cache_event_t *ev[16];
    assert_int_equal(ev_of(e, KVP_EVENT_PAGE_EVICTED, ev, 16), 3);
    for (int i = 0; i < 3; i++) {
        int k = -1;
        for (int q = 0; q < 3; q++)
            if (ev[i]->page == p1[q]) k = q;
        assert_true(k >= 0);
        assert_int_equal(ev[i]->tier, idx);
        assert_memory_equal(ev[i]->chain.bytes, hx[k].bytes, 32);
        assert_memory_equal(ev[i]->parent_chain.bytes, k == 0 ? root.bytes : hx[k - 1].bytes, 32);
    }
    kvp_cache_tier_stats_t ts = tier_stats_of(w, idx);
    assert_int_equal(ts.written, 3);
    assert_int_equal(ts.bytes_out, 3 * bb);

    /* read back elsewhere; pages that came from a tier are not written back again */
    kvp_cache_t *r = cache_make(kf, vf, P, 3, 4, NULL);
    cache_identity(r, 0, NULL, 0);
    assert_int_equal(kvp_cache_add_tier(r, tier, KVP_TIER_READ | KVP_TIER_WRITE_BACK, NULL), KVP_OK);
    evlog *er = ev_new(r);
    int32_t sr = new_seq(r, salt);
    int64_t matched = 0;
    assert_int_equal(kvp_cache_seq_attach_prefix(r, sr, t1, 24, &matched), KVP_OK);
    assert_int_equal(matched, 24);
    int32_t pr[MAX_SEQ_PAGES];
    assert_int_equal(seq_pages(r, sr, pr), 3);
    for (int i = 0; i < 3; i++) {
        uint8_t *got = page_copy(parts_of(r).store, pr[i]);
        assert_memory_equal(got, saved[i], (size_t)(bb - HDR));
        free(got);
    }
    assert_stored(er, &root, hx, pr, 3, 0);
    assert_int_equal(kvp_cache_seq_release(r, sr), KVP_OK);
    int puts = m->puts;
    int32_t sr2 = new_seq(r, salt);
    step(r, sr2, t2, 24, 0, 6, NULL); /* evicts the three */
    assert_int_equal(m->puts, puts);
    assert_int_equal(ev_of(er, KVP_EVENT_PAGE_EVICTED, ev, 16), 3);
    for (int i = 0; i < 3; i++) assert_int_equal(ev[i]->tier, KVP_TIER_NONE);
    assert_int_equal(tier_stats_of(r, 0).written, 0);

    /* pages prefilled again elsewhere, which the tier holds already: not put again */
    kvp_cache_t *d = cache_make(kf, vf, P, 3, 4, NULL);
    cache_identity(d, 0, NULL, 0);
    assert_int_equal(kvp_cache_add_tier(d, tier, KVP_TIER_WRITE_BACK | KVP_TIER_WRITE_THROUGH,
                                        NULL), KVP_OK);
    int32_t sd = new_seq(d, salt);
    step(d, sd, t1, 24, 0, 5, NULL);
    assert_int_equal(kvp_cache_seq_release(d, sd), KVP_OK); /* its pages: through, skipped */
    assert_int_equal(m->puts, puts);
    int32_t sd2 = new_seq(d, salt);
    step(d, sd2, t2, 8, 0, 6, NULL); /* evicts one of them: back, skipped */
    assert_int_equal(m->puts, puts);
    assert_int_equal(kvp_cache_flush(d), KVP_OK); /* the new prompt's page goes through */
    assert_int_equal(m->puts, puts + 1);
    assert_int_equal(tier_stats_of(d, 0).written, 1);
    kvp_cache_destroy(d);

    for (int i = 0; i < 3; i++) free(saved[i]);
    free(e);
    free(er);
    kvp_cache_destroy(w);
    kvp_cache_destroy(r);
    kvp_blob_tier_destroy(tier);
}

static void test_tier_write_back(void **state) {
    (void)state;
    require_blob();
    tier_write_back(KVP_FORMAT_FP16, KVP_FORMAT_FP16);
    tier_write_back(KVP_FORMAT_INT8, KVP_FORMAT_INT4);
}

/* ---- the event stream against what the cache holds ----------------------------------------- */

#define HSET_CAP 256

typedef struct {
    int n;
    kvp_hash_t h[HSET_CAP];
} hset;

static int hset_find(const hset *s, const kvp_hash_t *h) {
    for (int i = 0; i < s->n; i++)
        if (memcmp(s->h[i].bytes, h->bytes, 32) == 0) return i;
    return -1;
}

static void hset_add(hset *s, const kvp_hash_t *h) {
    if (hset_find(s, h) >= 0) return;
    assert_true(s->n < HSET_CAP);
    s->h[s->n++] = *h;
}

static void hset_del(hset *s, const kvp_hash_t *h) {
    int i = hset_find(s, h);
    if (i >= 0) s->h[i] = s->h[--s->n];
}

/* Replay a stream: the pool's set and tier 0's set; the numbers run on. */
static void replay(const evlog *l, int32_t P, hset *pool, hset *tier) {
    memset(pool, 0, sizeof *pool);
    memset(tier, 0, sizeof *tier);
    assert_true(l->n <= MAX_EVENTS);
    for (int i = 0; i < l->n; i++) {
        const kvp_cache_event_t *e = &l->ev[i];
        assert_int_equal(e->seq_no, l->ev[0].seq_no + (uint64_t)i);
        assert_int_equal(e->page_size, P);
        switch (e->kind) {
        case KVP_EVENT_PAGE_STORED:
            assert_int_equal(e->num_tokens, P);
            assert_non_null(e->tokens);
            hset_add(pool, &e->chain);
            break;
        case KVP_EVENT_PAGE_EVICTED: hset_del(pool, &e->chain); break;
        case KVP_EVENT_CLEARED:
            assert_int_equal(e->tier, KVP_TIER_NONE);
            pool->n = 0;
            break;
        case KVP_EVENT_TIER_STORED:
            assert_int_equal(e->tier, 0);
            assert_int_equal(e->page, -1);
            hset_add(tier, &e->chain);
            break;
        case KVP_EVENT_TIER_REMOVED:
            assert_int_equal(e->tier, 0);
            hset_del(tier, &e->chain);
            break;
        default: assert_int_equal(e->kind, KVP_EVENT_PAGE_FREED); break;
        }
    }
}

/* Prompts that share prefixes run through a small pool with a write-back and
 * write-through tier: replaying the events gives exactly the tier's keys and
 * the pool's cached pages, at every point; a corrupt blob read back is
 * removed with an event; clearing the prefix cache is one event. */
static void test_event_stream_matches_contents(void **state) {
    (void)state;
    require_blob();
    enum { P = 4, L = 24 };
    memtier *m = NULL;
    kvp_blob_tier_t *tier = mt_make(&m);
    kvp_cache_t *c = cache_make(KVP_FORMAT_INT8, KVP_FORMAT_INT8, P, 16, 2, NULL);
    cache_identity(c, 0, NULL, 0);
    assert_int_equal(kvp_cache_add_tier(c, tier, KVP_TIER_READ | KVP_TIER_WRITE_BACK |
                                        KVP_TIER_WRITE_THROUGH, NULL), KVP_OK);
    evlog *l = ev_new(c);
    hset pool, held;
    int32_t toks[L];
    for (int r = 0; r < 10; r++) {
        /* prompts of 24 tokens (6 pages): the first 8 shared by all, the rest
         * by pairs; 22 pages in all go through a pool of 16 */
        for (int i = 0; i < L; i++) toks[i] = i < 8 ? 7 * i : 1000 * (r / 2 + 1) + i;
        int32_t s = new_seq(c, 3);
        int64_t matched = 0;
        assert_int_equal(kvp_cache_seq_attach_prefix(c, s, toks, L, &matched), KVP_OK);
        if (matched < L) step(c, s, toks + matched, (int32_t)(L - matched), matched, 5, NULL);
        assert_int_equal(kvp_cache_seq_release(c, s), KVP_OK);
        replay(l, P, &pool, &held);
        assert_int_equal(held.n, m->n);
        for (int i = 0; i < m->n; i++) assert_true(hset_find(&held, &m->key[i]) >= 0);
        assert_int_equal(pool.n, pool_stats_of(c).cached_pages);
    }
    const kvp_cache_event_t *ev[MAX_EVENTS];
    assert_true(ev_of(l, KVP_EVENT_PAGE_EVICTED, ev, MAX_EVENTS) > 0);
    assert_int_equal(m->n, 22);
    const kvp_cache_event_t *first = NULL;
    for (int i = 0; i < l->n && first == NULL; i++)
        if (l->ev[i].kind == KVP_EVENT_PAGE_STORED) first = &l->ev[i];
    assert_non_null(first);
    int32_t want[4] = {0, 7, 14, 21};
    assert_memory_equal(first->tokens, want, sizeof want);

    /* a corrupt blob of a prompt the pool no longer holds: removed, with an event */
    assert_int_equal(kvp_cache_clear_prefix(c), KVP_OK);
    assert_int_equal(pool_stats_of(c).cached_pages, 0);
    const kvp_cache_event_t *cl[4];
    assert_int_equal(ev_of(l, KVP_EVENT_CLEARED, cl, 4), 1);
    assert_true(cl[0] == &l->ev[l->n - 1] || l->ev[l->n - 1].kind == KVP_EVENT_CLEARED);
    for (int i = 0; i < L; i++) toks[i] = i < 8 ? 7 * i : 1000 + i;
    kvp_hash_t root, hx[6];
    chain_of(c, 3, toks, L, &root, hx);
    int j = mt_find(m, &hx[0]);
    assert_true(j >= 0);
    m->blob[j][HDR + 3] ^= 1;
    int before = l->n;
    int32_t s = new_seq(c, 3);
    int64_t matched = 0;
    assert_int_equal(kvp_cache_seq_attach_prefix(c, s, toks, L, &matched), KVP_OK);
    assert_int_equal(matched, 0);
    const kvp_cache_event_t *rm[4];
    assert_int_equal(ev_of(l, KVP_EVENT_TIER_REMOVED, rm, 4), 1);
    assert_true(rm[0] >= &l->ev[before]);
    assert_memory_equal(rm[0]->chain.bytes, hx[0].bytes, 32);
    step(c, s, toks, L, 0, 5, NULL);
    /* a live sequence keeps the prefix cache from being cleared */
    assert_int_equal(kvp_cache_clear_prefix(c), KVP_ESTATE);
    assert_non_null(strstr(kvp_cache_last_error(c), "live"));
    assert_int_equal(kvp_cache_clear_prefix(NULL), KVP_EINVAL);
    assert_int_equal(kvp_cache_seq_release(c, s), KVP_OK);
    replay(l, P, &pool, &held);
    assert_int_equal(held.n, m->n);
    for (int i = 0; i < m->n; i++) assert_true(hset_find(&held, &m->key[i]) >= 0);
    assert_true(mt_find(m, &hx[0]) >= 0); /* written again after its removal */
    assert_int_equal(pool.n, pool_stats_of(c).cached_pages);
    /* clearing sends no EVICTED event and writes nothing back */
    int puts = m->puts, evicted = 0;
    before = l->n;
    assert_int_equal(kvp_cache_clear_prefix(c), KVP_OK);
    for (int i = before; i < l->n; i++) evicted += l->ev[i].kind == KVP_EVENT_PAGE_EVICTED;
    assert_int_equal(evicted, 0);
    assert_int_equal(m->puts, puts);
    assert_int_equal(l->ev[l->n - 1].kind, KVP_EVENT_CLEARED);
    replay(l, P, &pool, &held);
    assert_int_equal(pool.n, 0);
    free(l);
    kvp_cache_destroy(c);
    kvp_blob_tier_destroy(tier);
}

/* More pages than one buffer holds: written and read in several batches. */
static void test_tier_many_pages(void **state) {
    (void)state;
    require_blob();
    const int32_t P = 4, n = 150, full = n / P;
    memtier *m = NULL;
    kvp_blob_tier_t *tier = mt_make(&m);
    int32_t toks[150];
    for (int i = 0; i < n; i++) toks[i] = i * 11;
    kvp_cache_t *a = cache_make(KVP_FORMAT_INT8, KVP_FORMAT_INT8, P, 64, 2, NULL);
    kvp_cache_t *b = cache_make(KVP_FORMAT_INT8, KVP_FORMAT_INT8, P, 64, 2, NULL);
    cache_identity(a, 0, NULL, 0);
    cache_identity(b, 0, NULL, 0);
    assert_int_equal(kvp_cache_add_tier(a, tier, KVP_TIER_WRITE_THROUGH, NULL), KVP_OK);
    assert_int_equal(kvp_cache_add_tier(b, tier, KVP_TIER_READ, NULL), KVP_OK);
    int32_t sa = new_seq(a, 1), sb = new_seq(b, 1);
    step(a, sa, toks, n, 0, 8, NULL);
    assert_int_equal(kvp_cache_flush(a), KVP_OK);
    assert_int_equal(m->n, full);
    assert_int_equal(tier_stats_of(a, 0).written, full);
    int64_t matched = 0;
    assert_int_equal(kvp_cache_seq_attach_prefix(b, sb, toks, n, &matched), KVP_OK);
    assert_int_equal(matched, full * P);
    assert_same_pages(a, sa, b, sb, full);
    kvp_cache_tier_stats_t ts = tier_stats_of(b, 0);
    assert_int_equal(ts.hit_pages, full);
    assert_int_equal(ts.lookups, full);
    kvp_cache_destroy(a);
    kvp_cache_destroy(b);
    kvp_blob_tier_destroy(tier);
}

/* Pages written through are queued once per page stored: importing,
 * truncating and importing again before any step keeps the queue within
 * the pool, and only pages that still hold their K/V are written. */
static void test_write_through_queue_stays_bounded(void **state) {
    (void)state;
    require_blob();
    const int32_t P = 8, n = 32;
    memtier *m = NULL;
    kvp_blob_tier_t *tier = mt_make(&m);
    kvp_cache_t *x = cache_make(KVP_FORMAT_FP16, KVP_FORMAT_FP16, P, 64, 2, NULL);
    kvp_cache_t *w = cache_make(KVP_FORMAT_FP16, KVP_FORMAT_FP16, P, 4, 2, NULL);
    cache_identity(x, 0, NULL, 0);
    cache_identity(w, 0, NULL, 0);
    assert_int_equal(kvp_cache_add_tier(w, tier, KVP_TIER_WRITE_THROUGH, NULL), KVP_OK);
    int32_t sw = new_seq(w, 0);
    int32_t toks[32];
    uint8_t *last[4] = {NULL, NULL, NULL, NULL};
    kvp_hash_t root, hx[4];
    for (int round = 0; round < 6; round++) {
        for (int i = 0; i < n; i++) toks[i] = 1000 * round + i;
        int32_t sx = new_seq(x, 0), blobs = 0;
        step(x, sx, toks, n, 0, (uint64_t)round + 50, NULL);
        uint64_t bytes = 0;
        uint8_t *buf = seq_export(x, sx, toks, n, &blobs, &bytes);
        int32_t px[MAX_SEQ_PAGES];
        seq_pages(x, sx, px);
        for (int i = 0; i < 4; i++) {
            free(last[i]);
            last[i] = page_copy(parts_of(x).store, px[i]);
        }
        assert_int_equal(kvp_cache_seq_release(x, sx), KVP_OK);
        int32_t r = -1;
        int rc = kvp_cache_seq_import(w, sw, toks, n, buf, bytes, &r);
        if (rc != KVP_OK) print_error("round %d: %s\n", round, kvp_cache_last_error(w));
        assert_int_equal(rc, KVP_OK);
        free(buf);
        if (round < 5) assert_int_equal(kvp_cache_seq_truncate(w, sw, 0), KVP_OK);
    }
    chain_of(w, 0, toks, n, &root, hx);
    assert_int_equal(kvp_cache_flush(w), KVP_OK);
    assert_int_equal(m->n, 4);
    for (int i = 0; i < 4; i++) {
        int j = mt_find(m, &hx[i]);
        assert_true(j >= 0);
        assert_memory_equal(m->blob[j] + HDR, last[i], (size_t)(m->size[j] - HDR));
        free(last[i]);
    }
    kvp_cache_destroy(x);
    kvp_cache_destroy(w);
    kvp_blob_tier_destroy(tier);
}

static void test_tier_arguments(void **state) {
    (void)state;
    require_blob();
    memtier *m = NULL;
    kvp_blob_tier_t *tiers[9];
    for (int i = 0; i < 9; i++) tiers[i] = mt_make(&m);
    kvp_cache_t *c = cache_make(KVP_FORMAT_FP16, KVP_FORMAT_FP16, 8, 8, 2, NULL);
    assert_int_equal(kvp_cache_add_tier(c, tiers[0], KVP_TIER_READ, NULL), KVP_ESTATE);
    cache_identity(c, 0, NULL, 0);
    assert_int_equal(kvp_cache_add_tier(NULL, tiers[0], KVP_TIER_READ, NULL), KVP_EINVAL);
    assert_int_equal(kvp_cache_add_tier(c, NULL, KVP_TIER_READ, NULL), KVP_EINVAL);
    assert_int_equal(kvp_cache_add_tier(c, tiers[0], 0, NULL), KVP_EINVAL);
    assert_int_equal(kvp_cache_add_tier(c, tiers[0], 8, NULL), KVP_EINVAL);
    int32_t idx = -1;
    for (int i = 0; i < 8; i++) {
        assert_int_equal(kvp_cache_add_tier(c, tiers[i], KVP_TIER_READ, &idx), KVP_OK);
        assert_int_equal(idx, i);
    }
    assert_int_equal(kvp_cache_add_tier(c, tiers[0], KVP_TIER_READ, NULL), KVP_EINVAL); /* twice */
    assert_int_equal(kvp_cache_add_tier(c, tiers[8], KVP_TIER_READ, NULL), KVP_ENOSPC);
    kvp_cache_tier_stats_t ts;
    memset(&ts, 0, sizeof ts);
    ts.struct_size = sizeof ts;
    assert_int_equal(kvp_cache_tier_stats(c, 8, &ts), KVP_EINVAL);
    assert_int_equal(kvp_cache_tier_stats(c, -1, &ts), KVP_EINVAL);
    assert_int_equal(kvp_cache_tier_stats(NULL, 0, &ts), KVP_EINVAL);
    assert_int_equal(kvp_cache_tier_stats(c, 0, NULL), KVP_EINVAL);
    ts.struct_size = 4;
    assert_int_equal(kvp_cache_tier_stats(c, 0, &ts), KVP_EINVAL);
    assert_int_equal(kvp_cache_set_event_callback(NULL, ev_record, NULL), KVP_EINVAL);
    kvp_cache_destroy(c);
    for (int i = 0; i < 9; i++) kvp_blob_tier_destroy(tiers[i]);
}

/* Events without an identity carry no chain hash; set_blob later keeps the
 * callback, and the events get their hashes. */
static void test_events_without_identity(void **state) {
    (void)state;
    require_blob();
    const int32_t P = 8;
    kvp_cache_t *c = cache_make(KVP_FORMAT_FP16, KVP_FORMAT_FP16, P, 8, 2, NULL);
    evlog *e = ev_new(c);
    int32_t toks[24];
    for (int i = 0; i < 24; i++) toks[i] = i;
    int32_t s = new_seq(c, 0);
    step(c, s, toks, 2 * P, 0, 1, NULL);
    const kvp_cache_event_t *ev[8];
    assert_int_equal(ev_of(e, KVP_EVENT_PAGE_STORED, ev, 8), 2);
    kvp_hash_t zero;
    memset(&zero, 0, sizeof zero);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(ev[i]->tier, KVP_TIER_NONE);
        assert_memory_equal(ev[i]->chain.bytes, zero.bytes, 32);
    }
    cache_identity(c, 0, NULL, 0);
    int32_t s2 = new_seq(c, 0);
    step(c, s2, toks + 2 * P, P, 0, 2, NULL);
    assert_int_equal(ev_of(e, KVP_EVENT_PAGE_STORED, ev, 8), 3);
    kvp_hash_t root, h;
    chain_of(c, 0, toks + 2 * P, P, &root, &h);
    assert_memory_equal(ev[2]->chain.bytes, h.bytes, 32);
    assert_memory_equal(ev[2]->parent_chain.bytes, root.bytes, 32);
    /* no callback: nothing delivered */
    assert_int_equal(kvp_cache_set_event_callback(c, NULL, NULL), KVP_OK);
    int before = e->n;
    assert_int_equal(kvp_cache_seq_release(c, s2), KVP_OK);
    assert_int_equal(kvp_cache_seq_release(c, s), KVP_OK);
    assert_int_equal(e->n, before);
    free(e);
    kvp_cache_destroy(c);
}

/* ---- 10. allocation failures ----------------------------------------------------------- */

static void test_codec_allocation_failures(void **state) {
    (void)state;
    require_blob();
    test_alloc_state st = {0, -1, 0, 0};
    kvp_allocator_t a = test_allocator(&st);
    shape_t s = {2, 2, 64, 4, KVP_FORMAT_FP8_E4M3, KVP_FORMAT_INT4, 0};
    kvp_store_t *store = store_make(&s, 2, &a);
    fill_page(store, 0, 4, 3);
    long base = st.live;
    uint8_t key[16];
    memset(key, 5, sizeof key);
    kvp_blob_params_t p = bparams(0, 0, 1, key, 16);
    p.allocator = a;
    kvp_blob_codec_t *c = NULL;
    long k = 0;
    for (;; k++) {
        assert_true(k < 100);
        st.calls = 0;
        st.fail_at = k;
        char err[KVP_ERR_SIZE] = "";
        int rc = kvp_blob_codec_create(store, &p, &c, err, sizeof err);
        if (rc == KVP_OK) break;
        assert_int_equal(rc, KVP_ENOMEM);
        assert_null(c);
        assert_true(strlen(err) > 0);
        assert_int_equal(st.live, base);
    }
    assert_true(k >= 3); /* the codec, its hasher, the fp8 scale digest */
    st.fail_at = -1;
    kvp_hash_t h = rand_hash(4);
    uint64_t n = 0;
    uint8_t *b = blob_of(c, store, 0, 4, &h, &n);
    expect_accept(c, b, n, &h, 4);
    /* fp8 scales are read again per call: that can fail too, and is no rejection */
    kvp_blob_stats_t before = stats_of(c);
    st.calls = 0;
    st.fail_at = 0;
    assert_int_equal(kvp_blob_validate(c, b, n, &h, 4, NULL, NULL), KVP_ENOMEM);
    st.calls = 0;
    assert_int_equal(kvp_blob_export(c, 0, 4, &h, b, n), KVP_ENOMEM);
    st.fail_at = -1;
    kvp_blob_stats_t after = stats_of(c);
    assert_int_equal(after.rejected, before.rejected);
    assert_int_equal(after.exported, before.exported);
    expect_accept(c, b, n, &h, 4);
    free(b);
    /* a partly filled page is checked in place, over the tokens it holds */
    fill_page(store, 1, 2, 4);
    b = blob_of(c, store, 1, 2, &h, &n);
    st.calls = 0;
    st.fail_at = 1; /* after the scale digest's: nothing else allocates */
    expect_accept(c, b, n, &h, 2);
    st.fail_at = -1;
    free(b);
    kvp_blob_codec_destroy(c);
    kvp_store_destroy(store);
    assert_int_equal(st.live, 0);
}

static void test_cache_allocation_failures(void **state) {
    (void)state;
    require_blob();
    const int32_t P = 8, n = 28;
    test_alloc_state st = {0, -1, 0, 0};
    kvp_allocator_t a = test_allocator(&st);
    kvp_cache_t *c = cache_make(KVP_FORMAT_INT8, KVP_FORMAT_INT4, P, 16, 4, &a);
    long base = st.live;
    kvp_blob_params_t p = bparams(0, 0, 1, NULL, 0);
    p.allocator = a;
    long k = 0;
    for (;; k++) {
        assert_true(k < 100);
        st.calls = 0;
        st.fail_at = k;
        int rc = kvp_cache_set_blob(c, &p);
        if (rc == KVP_OK) break;
        assert_int_equal(rc, KVP_ENOMEM);
        assert_int_equal(st.live, base);
        kvp_blob_codec_t *codec = NULL;
        assert_int_equal(kvp_cache_blob_codec(c, &codec), KVP_ESTATE);
    }
    assert_true(k >= 10); /* codec, hasher, eight buffers, the event state */
    st.fail_at = -1;
    /* it works afterwards: write through, then a transfer */
    memtier *m = NULL;
    kvp_blob_tier_t *tier = mt_make(&m);
    assert_int_equal(kvp_cache_add_tier(c, tier, KVP_TIER_WRITE_THROUGH, NULL), KVP_OK);
    int32_t toks[32];
    for (int i = 0; i < 32; i++) toks[i] = 3 * i + 1;
    int32_t s = new_seq(c, 0), blobs = 0;
    step(c, s, toks, n, 0, 9, NULL);
    assert_int_equal(kvp_cache_flush(c), KVP_OK);
    assert_int_equal(m->n, 3);
    uint64_t bytes = 0;
    uint8_t *buf = seq_export(c, s, toks, n, &blobs, &bytes);

    /* an import whose allocations fail leaves the sequence empty */
    kvp_cache_t *d = cache_make(KVP_FORMAT_INT8, KVP_FORMAT_INT4, P, 16, 4, &a);
    cache_identity(d, 0, NULL, 0);
    int32_t sd = new_seq(d, 0);
    for (k = 0;; k++) {
        assert_true(k < 100);
        st.calls = 0;
        st.fail_at = k;
        int32_t r = -1;
        int rc = kvp_cache_seq_import(d, sd, toks, n, buf, bytes, &r);
        st.fail_at = -1;
        if (rc == KVP_OK) break;
        assert_int_equal(rc, KVP_ENOMEM);
        assert_int_equal(seq_len(d, sd), 0);
        assert_int_equal(pool_stats_of(d).used_pages, 0);
    }
    assert_true(k >= 2);
    assert_same_pages(c, s, d, sd, -1);
    free(buf);
    kvp_cache_destroy(c);
    kvp_cache_destroy(d);
    kvp_blob_tier_destroy(tier);
    assert_int_equal(st.live, 0);
}

/* ---- the build switch ---------------------------------------------------------------- */

static void test_feature_switch(void **state) {
    (void)state;
    shape_t s = {1, 1, 32, 4, KVP_FORMAT_FP16, KVP_FORMAT_FP16, 0};
    kvp_store_t *st = store_make(&s, 1, NULL);
    kvp_blob_params_t p = bparams(0, 0, 1, NULL, 0);
    kvp_blob_codec_t *c = NULL;
    int rc = kvp_blob_codec_create(st, &p, &c, NULL, 0);
    kvp_cache_t *cache = cache_make(KVP_FORMAT_FP16, KVP_FORMAT_FP16, 8, 4, 2, NULL);
    const void *parts[1] = {"x"};
    const uint64_t sizes[1] = {1};
    uint8_t fp[32];
    if (kvp_build_has(KVP_FEATURE_BLOB)) {
        assert_int_equal(rc, KVP_OK);
        assert_int_equal(kvp_fingerprint(parts, sizes, 1, fp), KVP_OK);
        assert_int_equal(kvp_cache_set_blob(cache, &p), KVP_OK);
    } else {
        assert_int_equal(rc, KVP_ENOTSUP);
        assert_null(c);
        assert_int_equal(kvp_fingerprint(parts, sizes, 1, fp), KVP_ENOTSUP);
        assert_int_equal(kvp_cache_set_blob(cache, &p), KVP_ENOTSUP);
        assert_non_null(strstr(kvp_cache_last_error(cache), "without"));
    }
    kvp_blob_codec_destroy(c);
    kvp_cache_destroy(cache);
    kvp_store_destroy(st);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_feature_switch),
        cmocka_unit_test(test_chain_vectors),
        cmocka_unit_test(test_roundtrip_every_format),
        cmocka_unit_test(test_header_bytes),
        cmocka_unit_test(test_every_flipped_bit_is_refused),
        cmocka_unit_test(test_identity_reasons),
        cmocka_unit_test(test_payload_invariants),
        cmocka_unit_test(test_arguments),
        cmocka_unit_test(test_seq_transfer_every_format),
        cmocka_unit_test(test_seq_import_refusals),
        cmocka_unit_test(test_tier_write_through_and_read),
        cmocka_unit_test(test_tier_write_back),
        cmocka_unit_test(test_tier_many_pages),
        cmocka_unit_test(test_write_through_queue_stays_bounded),
        cmocka_unit_test(test_tier_arguments),
        cmocka_unit_test(test_events_without_identity),
        cmocka_unit_test(test_event_stream_matches_contents),
        cmocka_unit_test(test_codec_allocation_failures),
        cmocka_unit_test(test_cache_allocation_failures),
    };
    return cmocka_run_group_tests_name("blob", tests, NULL, NULL);
}
