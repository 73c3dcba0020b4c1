/*
 * Layer `blob`: one page of KV as a portable, self-validating object, and
 * the chain hashes that name pages across processes. docs/blob-format.md
 * specifies every byte written here; the field offsets below are that
 * table.
 *
 * Validation order: structure (length, magic, version, reserved bytes),
 * then integrity (checksum, then the tag), then identity (fingerprint,
 * layout, formats, shard, chain hash, tokens), then the payload's own
 * invariants. Integrity comes before identity so that a flipped bit is
 * counted as corruption, not as another model's blob.
 */
#include "blob.h"
#include "backend.h"
#include "cpu/cpu.h"

#include <string.h>

/* ---- header fields (docs/blob-format.md) ----------------------------------- */

enum {
    OFF_MAGIC = 0,
    OFF_VERSION = 4,
    OFF_HEADER_BYTES = 6,
    OFF_FLAGS = 8,
    OFF_TOKENS = 12,
    OFF_FINGERPRINT = 16,
    OFF_LAYERS = 48,
    OFF_KV_HEADS = 52,
    OFF_HEAD_DIM = 56,
    OFF_PAGE_SIZE = 60,
    OFF_K_FORMAT = 64,
    OFF_V_FORMAT = 68,
    OFF_K_ORDER = 72,
    OFF_SHARD_INDEX = 76,
    OFF_SHARD_COUNT = 78,
    OFF_PAYLOAD_BYTES = 80,
    OFF_CHAIN = 88,
    OFF_SCALES = 120,
    OFF_CHECKSUM = 128, /* XXH3-128 of bytes [0, 128) and the payload */
    OFF_TAG = 144,      /* HMAC-SHA256 of bytes [0, 144) and the payload */
    OFF_RESERVED = 176,
    HEADER_BYTES = KVP_BLOB_HEADER_BYTES
};

enum { FLAG_STAGING = 1, FLAG_AUTH = 2, FLAGS_KNOWN = FLAG_STAGING | FLAG_AUTH };

static const uint8_t MAGIC[4] = {'K', 'V', 'P', 'B'};
/* The chain root's domain string: 15 characters and a NUL. */
static const char CHAIN_DOMAIN[16] = "kvpage chain v1";

static void put16(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get16(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8; }
static uint32_t get32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get64(const uint8_t *p) { return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32; }

/* ---- the codec ------------------------------------------------------------- */

struct kvp_blob_codec {
    kvp_allocator_t alloc;
    kvp_store_t *store;
    kvp_layout_t layout;
    int32_t k_order;
    int32_t num_pages, num_staging;
    int32_t shard_index, shard_count;
    int32_t auth;
    uint8_t fingerprint[KVP_FINGERPRINT_BYTES];
    uint64_t scale_digest; /* fp8: XXH3-64 of the scale tables; else 0 */
    kvp__hasher *h;
    bool cpu;              /* a CPU store: payloads are copied into the arena here */
    bool stream;           /* ... with non-temporal stores (AVX2) */
    bool quiet;            /* reject() records the first reason without counting it */
    int32_t quiet_reason;
    char quiet_text[KVP_ERR_SIZE];
    kvp_blob_stats_t stats;
    char err[KVP_ERR_SIZE];
};

static int codec_fail(kvp_blob_codec_t *c, int status, const char *fmt, ...)
    KVP__PRINTF(3, 4);
static int codec_fail(kvp_blob_codec_t *c, int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    kvp__verrf(c->err, sizeof c->err, status, fmt, ap);
    va_end(ap);
    return status;
}

static const char *const REASON_NAMES[KVP_BLOB_REASONS] = {
    "ok",   "truncated", "magic",  "version", "fingerprint", "layout",  "format",
    "shard", "hash",     "tokens", "checksum", "auth",       "payload", "reserved"};

const char *kvp_blob_reason_name(int32_t reason) {
    return reason >= 0 && reason < KVP_BLOB_REASONS ? REASON_NAMES[reason] : "unknown";
}

void kvp_blob_params_init(kvp_blob_params_t *p) {
    if (p == NULL) return;
    memset(p, 0, sizeof *p);
    p->struct_size = sizeof *p;
    p->shard_count = 1;
}

int kvp_fingerprint(const void *const *parts, const uint64_t *sizes, int32_t n,
                    uint8_t out[KVP_FINGERPRINT_BYTES]) {
    if (parts == NULL || sizes == NULL || out == NULL || n < 1) return KVP_EINVAL;
    for (int32_t i = 0; i < n; i++)
        if (parts[i] == NULL && sizes[i] > 0) return KVP_EINVAL;
    kvp__hasher *h = NULL;
    int rc = kvp__hasher_create(NULL, NULL, 0, &h, NULL, 0);
    if (rc != KVP_OK) return rc;
    rc = kvp__sha_begin(h);
    for (int32_t i = 0; i < n && rc == KVP_OK; i++) {
        const uint8_t *p = (const uint8_t *)parts[i];
        for (uint64_t off = 0; off < sizes[i] && rc == KVP_OK; off += 1u << 30) {
            uint64_t m = sizes[i] - off < (1u << 30) ? sizes[i] - off : (1u << 30);
            rc = kvp__sha_update(h, p + off, (size_t)m);
        }
    }
    if (rc == KVP_OK) rc = kvp__sha_end(h, out);
    kvp__hasher_destroy(NULL, h);
    return rc;
}

static int check_params(const kvp_blob_params_t *p, char *err, size_t err_size) {
    int rc = kvp__check_struct(p, sizeof *p, "params", err, err_size);
    if (rc == KVP_OK) rc = kvp__allocator_check(&p->allocator, err, err_size);
    if (rc != KVP_OK) return rc;
    if (p->shard_count < 1 || p->shard_count > 65535)
        return kvp__errf(err, err_size, KVP_EINVAL, "shard_count must be 1..65535, got %d",
                         (int)p->shard_count);
    if (p->shard_index < 0 || p->shard_index >= p->shard_count)
        return kvp__errf(err, err_size, KVP_EINVAL, "shard_index must be 0..%d, got %d",
                         (int)p->shard_count - 1, (int)p->shard_index);
    if (p->auth_key_bytes != 0 &&
        (p->auth_key_bytes < 16 || p->auth_key_bytes > KVP_BLOB_MAX_KEY_BYTES))
        return kvp__errf(err, err_size, KVP_EINVAL, "auth_key_bytes must be 0 or 16..%d, got %d",
                         KVP_BLOB_MAX_KEY_BYTES, (int)p->auth_key_bytes);
    if (p->auth_key_bytes != 0 && p->auth_key == NULL)
        return kvp__errf(err, err_size, KVP_EINVAL, "auth_key is NULL");
    uint8_t any = 0;
    for (int i = 0; i < KVP_FINGERPRINT_BYTES; i++) any |= p->fingerprint[i];
    if (!any)
        return kvp__errf(err, err_size, KVP_EINVAL,
                         "fingerprint is all zero: set it to a digest of the model");
    return KVP_OK;
}

/* fp8 scales change what an fp8 payload means: blobs carry a digest of them. */
static int scale_digest(kvp_store_t *s, uint64_t *out, char *err, size_t err_size) {
    *out = 0;
    const kvp_layout_t *l = &s->layout;
    bool k8 = l->k_format == KVP_FORMAT_FP8_E4M3, v8 = l->v_format == KVP_FORMAT_FP8_E4M3;
    if (!k8 && !v8) return KVP_OK;
    size_t n = (size_t)l->layers * (size_t)l->kv_heads * 2;
    uint8_t *buf = (uint8_t *)kvp__calloc(&s->allocator, n, 4, 0);
    if (buf == NULL) return kvp__errf(err, err_size, KVP_ENOMEM, "out of memory (fp8 scales)");
    size_t i = 0;
    int rc = KVP_OK;
    for (int side = 0; side < 2 && rc == KVP_OK; side++)
        for (int32_t layer = 0; layer < l->layers && rc == KVP_OK; layer++)
            for (int32_t h = 0; h < l->kv_heads && rc == KVP_OK; h++, i++) {
                float f = 0.0f;
                if (side == 0 ? k8 : v8)
                    rc = kvp_store_get_fp8_scale(s, layer, h, side, &f);
                uint32_t bits;
                memcpy(&bits, &f, 4);
                put32(buf + 4 * i, bits);
            }
    if (rc == KVP_OK) *out = kvp__xxh64(buf, n * 4);
    else rc = kvp__errf(err, err_size, rc, "reading fp8 scales: %s", kvp_store_last_error(s));
    kvp__free(&s->allocator, buf);
    return rc;
}

/* fp8 scales may be set or calibrated after the codec is made: read them
 * again before each export and validation (a no-op for other formats). */
static int refresh_scales(kvp_blob_codec_t *c) {
    if (c->layout.k_format != KVP_FORMAT_FP8_E4M3 && c->layout.v_format != KVP_FORMAT_FP8_E4M3)
        return KVP_OK;
    return scale_digest(c->store, &c->scale_digest, c->err, sizeof c->err);
}

int kvp_blob_codec_create(kvp_store_t *store, const kvp_blob_params_t *params,
                          kvp_blob_codec_t **out, char *err, size_t err_size) {
    if (store == NULL || out == NULL)
        return kvp__errf(err, err_size, KVP_EINVAL, "%s is NULL", store ? "out" : "store");
    if (!kvp_build_has(KVP_FEATURE_BLOB)) /* the hasher says why */
        return kvp__hasher_create(NULL, NULL, 0, NULL, err, err_size);
    int rc = check_params(params, err, err_size);
    if (rc != KVP_OK) return rc;
    kvp_blob_codec_t *c = (kvp_blob_codec_t *)kvp__calloc(&params->allocator, 1, sizeof *c, 0);
    if (c == NULL) return kvp__errf(err, err_size, KVP_ENOMEM, "out of memory (blob codec)");
    c->alloc = params->allocator;
    c->store = store;
    c->layout = store->layout;
    c->k_order = store->k_order;
    c->num_pages = store->num_pages;
    c->num_staging = store->num_staging;
    c->shard_index = params->shard_index;
    c->shard_count = params->shard_count;
    c->auth = params->auth_key_bytes > 0;
    memcpy(c->fingerprint, params->fingerprint, KVP_FINGERPRINT_BYTES);
    c->stats.struct_size = sizeof c->stats;
    c->cpu = store->backend->id == KVP_BACKEND_CPU;
    c->stream = c->cpu && kvp__cpu_has_avx2();
    rc = kvp__hasher_create(&c->alloc, params->auth_key, (size_t)params->auth_key_bytes, &c->h,
                            err, err_size);
    if (rc == KVP_OK) rc = scale_digest(store, &c->scale_digest, err, err_size);
    if (rc != KVP_OK) {
        kvp_blob_codec_destroy(c);
        return rc;
    }
    *out = c;
    return KVP_OK;
}

void kvp_blob_codec_destroy(kvp_blob_codec_t *c) {
    if (c == NULL) return;
    kvp_allocator_t a = c->alloc;
    kvp__hasher_destroy(&a, c->h);
    kvp__free(&a, c);
}

const char *kvp_blob_codec_last_error(const kvp_blob_codec_t *c) {
    return c == NULL ? KVP__NULL_HANDLE : c->err;
}

int kvp_blob_codec_stats(const kvp_blob_codec_t *c, kvp_blob_stats_t *stats) {
    if (c == NULL) return KVP_EINVAL;
    int rc = kvp__check_struct(stats, sizeof *stats, "stats",
                               ((kvp_blob_codec_t *)(uintptr_t)c)->err, KVP_ERR_SIZE);
    if (rc != KVP_OK) return rc;
    kvp__copy_out(stats, &c->stats, sizeof c->stats);
    return KVP_OK;
}

/* ---- chain hashes ------------------------------------------------------------ */

int kvp_blob_chain_root(kvp_blob_codec_t *c, uint64_t salt, kvp_hash_t *root) {
    if (c == NULL) return KVP_EINVAL;
    if (root == NULL) return codec_fail(c, KVP_EINVAL, "root is NULL");
    uint8_t b[88];
    const kvp_layout_t *l = &c->layout;
    memcpy(b, CHAIN_DOMAIN, 16);
    memcpy(b + 16, c->fingerprint, 32);
    const int32_t fields[7] = {l->layers,   l->kv_heads, l->head_dim, l->page_size,
                               l->k_format, l->v_format, c->k_order};
    for (int i = 0; i < 7; i++) put32(b + 48 + 4 * i, (uint32_t)fields[i]);
    put16(b + 76, (uint32_t)c->shard_index);
    put16(b + 78, (uint32_t)c->shard_count);
    put64(b + 80, salt);
    int rc = kvp__sha_begin(c->h);
    if (rc == KVP_OK) rc = kvp__sha_update(c->h, b, sizeof b);
    if (rc == KVP_OK) rc = kvp__sha_end(c->h, root->bytes);
    return rc == KVP_OK ? KVP_OK : codec_fail(c, rc, "libcrypto's SHA-256 failed");
}

/* One page's hash: SHA-256(parent || its token ids as little-endian u32). */
static int page_hash(kvp_blob_codec_t *c, const uint8_t parent[32], const int32_t *tokens,
                     int64_t n, uint8_t out[32]) {
    int rc = kvp__sha_begin(c->h);
    if (rc == KVP_OK) rc = kvp__sha_update(c->h, parent, 32);
    uint8_t buf[256];
    for (int64_t i = 0; i < n && rc == KVP_OK; i += 64) {
        int64_t m = n - i < 64 ? n - i : 64;
        for (int64_t j = 0; j < m; j++) put32(buf + 4 * j, (uint32_t)tokens[i + j]);
        rc = kvp__sha_update(c->h, buf, (size_t)m * 4);
    }
    if (rc == KVP_OK) rc = kvp__sha_end(c->h, out);
    return rc;
}

int kvp_blob_chain(kvp_blob_codec_t *c, const kvp_hash_t *parent, const int32_t *tokens,
                   int64_t n, kvp_hash_t *hashes) {
    if (c == NULL) return KVP_EINVAL;
    if (parent == NULL || (n > 0 && (tokens == NULL || hashes == NULL)))
        return codec_fail(c, KVP_EINVAL, "parent, tokens or hashes is NULL");
    if (n < 0) return codec_fail(c, KVP_EINVAL, "n must be >= 0, got %lld", (long long)n);
    int64_t P = c->layout.page_size;
    const uint8_t *prev = parent->bytes;
    for (int64_t i = 0; i * P < n; i++) {
        int64_t m = n - i * P < P ? n - i * P : P;
        if (page_hash(c, prev, tokens + i * P, m, hashes[i].bytes) != KVP_OK)
            return codec_fail(c, KVP_EINTERNAL, "libcrypto's SHA-256 failed");
        prev = hashes[i].bytes;
    }
    return KVP_OK;
}

int kvp_hash_hex(const kvp_hash_t *hash, char out[65]) {
    if (hash == NULL || out == NULL) return KVP_EINVAL;
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < 32; i++) {
        out[2 * i] = digits[hash->bytes[i] >> 4];
        out[2 * i + 1] = digits[hash->bytes[i] & 15];
    }
    out[64] = '\0';
    return KVP_OK;
}

/* ---- sizes ------------------------------------------------------------------- */

static uint64_t payload_of(const kvp_blob_codec_t *c, bool staging) {
    return staging ? c->layout.staging_page_bytes : c->layout.page_bytes;
}

int kvp_blob_size(const kvp_blob_codec_t *c, int32_t staging, uint64_t *bytes) {
    if (c == NULL) return KVP_EINVAL;
    kvp_blob_codec_t *w = (kvp_blob_codec_t *)(uintptr_t)c; /* the error text is mutable */
    if (bytes == NULL) return codec_fail(w, KVP_EINVAL, "bytes is NULL");
    if (staging != 0 && staging != 1)
        return codec_fail(w, KVP_EINVAL, "staging must be 0 or 1, got %d", (int)staging);
    if (staging && !c->layout.needs_staging)
        return codec_fail(w, KVP_EINVAL, "this layout has no staging pages");
    *bytes = HEADER_BYTES + payload_of(c, staging);
    return KVP_OK;
}

/* ---- integrity ------------------------------------------------------------------ */

static void checksum(kvp_blob_codec_t *c, const uint8_t *hdr, const uint8_t *payload,
                     uint64_t n, uint8_t out[16]) {
    kvp__xxh_begin(c->h);
    kvp__xxh_update(c->h, hdr, OFF_CHECKSUM);
    kvp__xxh_update(c->h, payload, (size_t)n);
    kvp__xxh_end(c->h, out);
}

static int tag(kvp_blob_codec_t *c, const uint8_t *hdr, const uint8_t *payload, uint64_t n,
               uint8_t out[32]) {
    int rc = kvp__mac_begin(c->h);
    if (rc == KVP_OK) rc = kvp__mac_update(c->h, hdr, OFF_TAG);
    if (rc == KVP_OK) rc = kvp__mac_update(c->h, payload, (size_t)n);
    if (rc == KVP_OK) rc = kvp__mac_end(c->h, out);
    return rc;
}

/* ---- export ---------------------------------------------------------------------- */

static void write_header(const kvp_blob_codec_t *c, uint8_t *b, bool staging, int32_t tokens,
                         const kvp_hash_t *hash, uint64_t payload) {
    const kvp_layout_t *l = &c->layout;
    memset(b, 0, HEADER_BYTES);
    memcpy(b + OFF_MAGIC, MAGIC, 4);
    put16(b + OFF_VERSION, KVP_BLOB_FORMAT_VERSION);
    put16(b + OFF_HEADER_BYTES, HEADER_BYTES);
    put32(b + OFF_FLAGS, (staging ? FLAG_STAGING : 0u) | (c->auth ? FLAG_AUTH : 0u));
    put32(b + OFF_TOKENS, (uint32_t)tokens);
    memcpy(b + OFF_FINGERPRINT, c->fingerprint, 32);
    put32(b + OFF_LAYERS, (uint32_t)l->layers);
    put32(b + OFF_KV_HEADS, (uint32_t)l->kv_heads);
    put32(b + OFF_HEAD_DIM, (uint32_t)l->head_dim);
    put32(b + OFF_PAGE_SIZE, (uint32_t)l->page_size);
    put32(b + OFF_K_FORMAT, (uint32_t)l->k_format);
    put32(b + OFF_V_FORMAT, (uint32_t)l->v_format);
    put32(b + OFF_K_ORDER, (uint32_t)c->k_order);
    put16(b + OFF_SHARD_INDEX, (uint32_t)c->shard_index);
    put16(b + OFF_SHARD_COUNT, (uint32_t)c->shard_count);
    put64(b + OFF_PAYLOAD_BYTES, payload);
    memcpy(b + OFF_CHAIN, hash->bytes, 32);
    put64(b + OFF_SCALES, c->scale_digest);
}

/* Bytes of a page that no token of it wrote leave the process as zeros: a
 * partly filled page's slots past its tokens (they hold whatever the page
 * held before: another sequence's K/V, another tenant's), as encoded zeros
 * so every scale stays well formed; and every block's padding, which
 * nothing writes (a CPU arena's comes from the allocator, a CUDA arena's
 * from the device). CPU and CUDA blobs of a page are then equal, and equal
 * pages give equal blobs. Keys quantized per channel are never partly
 * filled (they stage). */
static void scrub(const kvp_blob_codec_t *c, uint8_t *payload, bool staging, int32_t tokens) {
    const kvp_store_t *s = c->store;
    const int32_t P = c->layout.page_size, H = c->layout.kv_heads;
    static const float zeros[KVP_MAX_HEAD_DIM]; /* one row, read with stride 0 */
    const kvp__blockfmt *fmt[2] = {staging ? &s->skfmt : &s->kfmt, staging ? &s->svfmt : &s->vfmt};
    const uint64_t side_bytes[2] = {staging ? s->spage_stride_k : s->page_stride_k,
                                    staging ? s->spage_stride_v : s->page_stride_v};
    uint8_t *p = payload;
    for (int32_t layer = 0; layer < c->layout.layers; layer++)
        for (int side = 0; side < 2; side++) {
            const kvp__blockfmt *f = fmt[side];
            bool per_channel = f->is_key && !kvp__format_is_plain(f->format);
            uint64_t block = side_bytes[side] / (uint64_t)H, used = kvp__block_used_bytes(f);
            for (int32_t h = 0; h < H; h++) {
                uint8_t *blk = p + (uint64_t)h * block;
                if (tokens < P && !per_channel)
                    kvp__block_encode(f, blk, tokens, P - tokens, zeros, 0, 1.0f);
                if (used < block) memset(blk + used, 0, (size_t)(block - used));
            }
            p += side_bytes[side];
        }
}

int kvp_blob_export(kvp_blob_codec_t *c, int32_t page, int32_t tokens, const kvp_hash_t *hash,
                    void *dst, uint64_t dst_bytes) {
    if (c == NULL) return KVP_EINVAL;
    if (hash == NULL || dst == NULL) return codec_fail(c, KVP_EINVAL, "hash or dst is NULL");
    if (page < 0 || page >= c->num_pages + c->num_staging)
        return codec_fail(c, KVP_EINVAL, "page %d is out of range (0..%d)", (int)page,
                              (int)(c->num_pages + c->num_staging - 1));
    bool staging = page >= c->num_pages;
    int32_t P = c->layout.page_size;
    /* what validation accepts: with staging pages, a pool page is always full */
    int32_t least = c->layout.needs_staging && !staging ? P : 1, most = staging ? P - 1 : P;
    if (tokens < least || tokens > most)
        return codec_fail(c, KVP_EINVAL, "tokens must be %d..%d for a %s page, got %d",
                              (int)least, (int)most, staging ? "staging" : "pool", (int)tokens);
    uint64_t payload = payload_of(c, staging);
    if (dst_bytes < HEADER_BYTES + payload)
        return codec_fail(c, KVP_EINVAL, "dst has %llu bytes, the blob needs %llu",
                              (unsigned long long)dst_bytes,
                              (unsigned long long)(HEADER_BYTES + payload));
    uint8_t *b = (uint8_t *)dst;
    int rc = refresh_scales(c);
    if (rc != KVP_OK) return rc;
    rc = kvp_store_page_to_host(c->store, page, 0, b + HEADER_BYTES, payload);
    if (rc == KVP_OK) rc = kvp_store_synchronize(c->store);
    if (rc != KVP_OK)
        return codec_fail(c, rc, "reading page %d: %s", (int)page,
                              kvp_store_last_error(c->store));
    scrub(c, b + HEADER_BYTES, staging, tokens);
    write_header(c, b, staging, tokens, hash, payload);
    checksum(c, b, b + HEADER_BYTES, payload, b + OFF_CHECKSUM);
    if (c->auth && tag(c, b, b + HEADER_BYTES, payload, b + OFF_TAG) != KVP_OK)
        return codec_fail(c, KVP_EINTERNAL, "libcrypto's HMAC failed");
    c->stats.exported++;
    c->stats.bytes_out += HEADER_BYTES + payload;
    return KVP_OK;
}

/* ---- validation -------------------------------------------------------------------- */

/* Count a rejection for `reason` with its explanation `what`. */
static int count_reject(kvp_blob_codec_t *c, int32_t reason, int32_t *reason_out,
                        const char *what) {
    c->stats.rejected++;
    c->stats.rejects[reason]++;
    if (reason_out) *reason_out = reason;
    return codec_fail(c, KVP_EBADBLOB, "blob rejected (%s): %s", REASON_NAMES[reason], what);
}

static int reject(kvp_blob_codec_t *c, int32_t reason, int32_t *reason_out, const char *fmt,
                  ...) KVP__PRINTF(4, 5);
static int reject(kvp_blob_codec_t *c, int32_t reason, int32_t *reason_out, const char *fmt,
                  ...) {
    char what[KVP_ERR_SIZE];
    va_list ap;
    va_start(ap, fmt);
    kvp__verrf(what, sizeof what, KVP_EBADBLOB, fmt, ap);
    va_end(ap);
    if (!c->quiet) return count_reject(c, reason, reason_out, what);
    if (c->quiet_reason == KVP_BLOB_OK) { /* the first reason found is the one */
        c->quiet_reason = reason;
        memcpy(c->quiet_text, what, sizeof what);
    }
    return KVP_EBADBLOB;
}

/* Header fields that must equal this codec's. */
static int check_identity(kvp_blob_codec_t *c, const uint8_t *b, int32_t *reason) {
    const kvp_layout_t *l = &c->layout;
    if (memcmp(b + OFF_FINGERPRINT, c->fingerprint, 32) != 0)
        return reject(c, KVP_BLOB_FINGERPRINT, reason, "another model fingerprint");
    static const struct {
        int off;
        const char *name;
    } lay[] = {{OFF_LAYERS, "layers"},      {OFF_KV_HEADS, "kv_heads"},
               {OFF_HEAD_DIM, "head_dim"},  {OFF_PAGE_SIZE, "page_size"},
               {OFF_K_ORDER, "k_order"}};
    const int32_t mine[] = {l->layers, l->kv_heads, l->head_dim, l->page_size, c->k_order};
    for (size_t i = 0; i < sizeof lay / sizeof lay[0]; i++)
        if (get32(b + lay[i].off) != (uint32_t)mine[i])
            return reject(c, KVP_BLOB_LAYOUT, reason, "%s %u, this store %d", lay[i].name,
                          (unsigned)get32(b + lay[i].off), (int)mine[i]);
    uint32_t kf = get32(b + OFF_K_FORMAT), vf = get32(b + OFF_V_FORMAT);
    if (kf != (uint32_t)l->k_format || vf != (uint32_t)l->v_format)
        return reject(c, KVP_BLOB_FORMAT, reason, "formats %u/%u, this store %s/%s",
                      (unsigned)kf, (unsigned)vf, kvp_format_name(l->k_format),
                      kvp_format_name(l->v_format));
    if (get64(b + OFF_SCALES) != c->scale_digest)
        return reject(c, KVP_BLOB_FORMAT, reason, "written with other fp8 scales");
    if (get16(b + OFF_SHARD_INDEX) != (uint32_t)c->shard_index ||
        get16(b + OFF_SHARD_COUNT) != (uint32_t)c->shard_count)
        return reject(c, KVP_BLOB_SHARD, reason, "shard %u of %u, this store %d of %d",
                      (unsigned)get16(b + OFF_SHARD_INDEX), (unsigned)get16(b + OFF_SHARD_COUNT),
                      (int)c->shard_index, (int)c->shard_count);
    return KVP_OK;
}

/* Structure: everything that must hold before the bytes can be hashed. */
static int check_structure(kvp_blob_codec_t *c, const uint8_t *b, uint64_t bytes,
                           int32_t *reason) {
    if (bytes < HEADER_BYTES)
        return reject(c, KVP_BLOB_TRUNCATED, reason, "%llu bytes, shorter than a header",
                      (unsigned long long)bytes);
    if (memcmp(b + OFF_MAGIC, MAGIC, 4) != 0)
        return reject(c, KVP_BLOB_MAGIC, reason, "not a page blob");
    if (get16(b + OFF_VERSION) != KVP_BLOB_FORMAT_VERSION || get16(b + OFF_HEADER_BYTES) != HEADER_BYTES)
        return reject(c, KVP_BLOB_VERSION, reason, "format version %u, header %u bytes",
                      (unsigned)get16(b + OFF_VERSION), (unsigned)get16(b + OFF_HEADER_BYTES));
    uint32_t flags = get32(b + OFF_FLAGS);
    bool zero = true;
    for (int i = OFF_RESERVED; i < HEADER_BYTES; i++) zero = zero && b[i] == 0;
    if ((flags & ~(uint32_t)FLAGS_KNOWN) != 0 || !zero)
        return reject(c, KVP_BLOB_RESERVED, reason, "unknown flags or non-zero reserved bytes");
    uint64_t payload = get64(b + OFF_PAYLOAD_BYTES);
    if (payload != bytes - HEADER_BYTES)
        return reject(c, KVP_BLOB_TRUNCATED, reason, "payload %llu bytes, %llu present",
                      (unsigned long long)payload, (unsigned long long)(bytes - HEADER_BYTES));
    return KVP_OK;
}

static int check_integrity(kvp_blob_codec_t *c, const uint8_t *b, uint64_t payload,
                           int32_t *reason) {
    uint8_t sum[16];
    checksum(c, b, b + HEADER_BYTES, payload, sum);
    if (memcmp(sum, b + OFF_CHECKSUM, 16) != 0)
        return reject(c, KVP_BLOB_CHECKSUM, reason, "checksum mismatch (corrupt bytes)");
    bool authed = (get32(b + OFF_FLAGS) & FLAG_AUTH) != 0;
    if (authed != (c->auth != 0))
        return reject(c, KVP_BLOB_AUTH, reason, "%s",
                      c->auth ? "no authentication tag (this codec has a key)"
                              : "an authentication tag, and this codec has no key");
    if (!authed) {
        for (int i = OFF_TAG; i < OFF_TAG + 32; i++)
            if (b[i] != 0) return reject(c, KVP_BLOB_RESERVED, reason, "a tag without the flag");
        return KVP_OK;
    }
    uint8_t t[32];
    if (tag(c, b, b + HEADER_BYTES, payload, t) != KVP_OK)
        return codec_fail(c, KVP_EINTERNAL, "libcrypto's HMAC failed");
    if (!kvp__memeq_const(t, b + OFF_TAG, 32))
        return reject(c, KVP_BLOB_AUTH, reason, "wrong authentication tag (another key?)");
    return KVP_OK;
}

/* The page the blob says it is, against what the caller expects. */
static int check_page(kvp_blob_codec_t *c, const uint8_t *b, const kvp_hash_t *expect,
                      int32_t tokens, int32_t want_staging, int32_t *reason) {
    if (expect != NULL && memcmp(b + OFF_CHAIN, expect->bytes, 32) != 0)
        return reject(c, KVP_BLOB_HASH, reason, "its chain hash is not the one asked for");
    bool staging = (get32(b + OFF_FLAGS) & FLAG_STAGING) != 0;
    if (want_staging >= 0 && staging != (want_staging != 0))
        return reject(c, KVP_BLOB_TOKENS, reason, "a %s page, a %s page expected",
                      staging ? "staging" : "pool", want_staging ? "staging" : "pool");
    uint32_t n = get32(b + OFF_TOKENS), P = (uint32_t)c->layout.page_size;
    if (staging && (!c->layout.needs_staging || c->num_staging == 0))
        return reject(c, KVP_BLOB_TOKENS, reason, "a staging page, and this store has none");
    /* with staging pages, a pool page is always full */
    uint32_t most = staging ? P - 1 : P, least = c->layout.needs_staging && !staging ? P : 1;
    if (n < least || n > most || (tokens != 0 && n != (uint32_t)tokens))
        return reject(c, KVP_BLOB_TOKENS, reason, "%u tokens in a %s page%s", (unsigned)n,
                      staging ? "staging" : "pool", tokens != 0 ? ", another count expected" : "");
    if (get64(b + OFF_PAYLOAD_BYTES) != payload_of(c, staging))
        return reject(c, KVP_BLOB_LAYOUT, reason, "payload %llu bytes, this store's page %llu",
                      (unsigned long long)get64(b + OFF_PAYLOAD_BYTES),
                      (unsigned long long)payload_of(c, staging));
    return KVP_OK;
}

/* The payload's invariants, over the tokens the page holds: a partly
 * filled page's per-token scale slots past them were never written. */
static int check_payload(kvp_blob_codec_t *c, bool staging, uint32_t tokens, const uint8_t *p,
                         uint64_t bytes, int32_t *reason) {
    if (kvp__store_page_check(c->store, staging ? c->num_pages : 0, p, bytes, (int32_t)tokens) !=
        KVP_OK)
        return reject(c, KVP_BLOB_PAYLOAD, reason, "%s", kvp_store_last_error(c->store));
    return KVP_OK;
}

static int full_check(kvp_blob_codec_t *c, const uint8_t *b, uint64_t bytes,
                    const kvp_hash_t *expect, int32_t tokens, int32_t want_staging,
                    kvp_blob_info_t *info, int32_t *reason, const uint8_t **payload) {
    if (reason) *reason = KVP_BLOB_OK;
    int rc = refresh_scales(c);
    if (rc != KVP_OK) return rc;
    rc = check_structure(c, b, bytes, reason);
    if (rc == KVP_OK) rc = check_integrity(c, b, bytes - HEADER_BYTES, reason);
    if (rc == KVP_OK) rc = check_identity(c, b, reason);
    if (rc == KVP_OK) rc = check_page(c, b, expect, tokens, want_staging, reason);
    if (rc != KVP_OK) return rc;
    bool staging = (get32(b + OFF_FLAGS) & FLAG_STAGING) != 0;
    rc = check_payload(c, staging, get32(b + OFF_TOKENS), b + HEADER_BYTES, bytes - HEADER_BYTES,
                       reason);
    if (rc != KVP_OK) return rc;
    if (info != NULL) {
        kvp_blob_info_t r;
        memset(&r, 0, sizeof r);
        r.struct_size = sizeof r;
        r.staging = staging;
        r.tokens = (int32_t)get32(b + OFF_TOKENS);
        r.payload_bytes = bytes - HEADER_BYTES;
        memcpy(r.hash.bytes, b + OFF_CHAIN, 32);
        kvp__copy_out(info, &r, sizeof r);
    }
    if (payload) *payload = b + HEADER_BYTES;
    c->stats.imported++;
    c->stats.bytes_in += bytes;
    return KVP_OK;
}

int kvp__blob_precheck(kvp_blob_codec_t *c, const uint8_t *b, uint64_t bytes,
                       const kvp_hash_t *expect, int32_t tokens, int32_t want_staging,
                       int32_t *reason) {
    if (reason) *reason = KVP_BLOB_OK;
    int rc = refresh_scales(c);
    if (rc == KVP_OK) rc = check_structure(c, b, bytes, reason);
    if (rc != KVP_OK) return rc;
    c->quiet = true;
    c->quiet_reason = KVP_BLOB_OK;
    rc = check_identity(c, b, reason);
    if (rc == KVP_OK) rc = check_page(c, b, expect, tokens, want_staging, reason);
    if (rc == KVP_EBADBLOB) { /* corruption, or what the header says? integrity decides */
        int32_t first = c->quiet_reason;
        char what[KVP_ERR_SIZE];
        memcpy(what, c->quiet_text, sizeof what);
        c->quiet_reason = KVP_BLOB_OK;
        rc = check_integrity(c, b, bytes - HEADER_BYTES, reason);
        c->quiet = false;
        if (rc == KVP_EBADBLOB) return count_reject(c, c->quiet_reason, reason, c->quiet_text);
        if (rc != KVP_OK) return rc;
        return count_reject(c, first, reason, what);
    }
    c->quiet = false;
    return rc;
}

/* The (layer, side) run of a page's blocks in the CPU arena: the next
 * `len` bytes of its serialization. */
static const uint8_t *arena_run(const kvp_store_t *s, int32_t page, int32_t layer, int side,
                                uint64_t *len) {
    bool pool = page < s->num_pages;
    *len = side ? (pool ? s->page_stride_v : s->spage_stride_v)
                : (pool ? s->page_stride_k : s->spage_stride_k);
    return side ? kvp__block_v(s, layer, page, 0) : kvp__block_k(s, layer, page, 0);
}

/* Stream a payload into a CPU page run by run, feeding each run to the
 * checksum (and the tag) first when asked, while it is in the cache. */
static int stream_runs(kvp_blob_codec_t *c, int32_t page, const uint8_t *p, bool sum, bool mac) {
    int rc = KVP_OK;
    for (int32_t layer = 0; layer < c->layout.layers && rc == KVP_OK; layer++)
        for (int side = 0; side < 2 && rc == KVP_OK; side++) {
            uint64_t len = 0;
            uint8_t *dst = (uint8_t *)(uintptr_t)arena_run(c->store, page, layer, side, &len);
            if (sum) kvp__xxh_update(c->h, p, (size_t)len);
            if (mac) rc = kvp__mac_update(c->h, p, (size_t)len);
            kvp__copy_stream(dst, p, (size_t)len, c->stream);
            p += len;
        }
    kvp__copy_stream_end(c->stream);
    return rc;
}

/* Copy a checked payload into a page: streamed runs on the CPU, the store's
 * page I/O elsewhere. */
static int write_payload(kvp_blob_codec_t *c, int32_t page, const uint8_t *p, uint64_t n) {
    if (!c->cpu) {
        int rc = kvp_store_page_from_host(c->store, page, 0, p, n);
        if (rc == KVP_OK) rc = kvp_store_synchronize(c->store); /* the caller may free p */
        return rc == KVP_OK ? KVP_OK
                            : codec_fail(c, rc, "writing page %d: %s", (int)page,
                                             kvp_store_last_error(c->store));
    }
    return stream_runs(c, page, p, false, false);
}

int kvp__blob_write(kvp_blob_codec_t *c, int32_t page, const uint8_t *b, uint64_t bytes,
                    int32_t *reason) {
    if (reason) *reason = KVP_BLOB_OK;
    uint64_t n = bytes - HEADER_BYTES;
    bool staging = (get32(b + OFF_FLAGS) & FLAG_STAGING) != 0;
    uint32_t tokens = get32(b + OFF_TOKENS);
    bool authed = (get32(b + OFF_FLAGS) & FLAG_AUTH) != 0, tag_zero = true;
    for (int i = OFF_TAG; i < OFF_TAG + 32 && !authed; i++) tag_zero = tag_zero && b[i] == 0;
    if (!c->cpu || authed != (c->auth != 0) || !tag_zero) { /* check everything, then copy */
        int rc = check_integrity(c, b, n, reason);
        if (rc == KVP_OK) rc = check_payload(c, staging, tokens, b + HEADER_BYTES, n, reason);
        if (rc == KVP_OK) rc = write_payload(c, page, b + HEADER_BYTES, n);
        if (rc == KVP_OK) {
            c->stats.imported++;
            c->stats.bytes_in += bytes;
        }
        return rc;
    }
    /* One pass: each run is checksummed while it is in the cache, then
     * streamed into the arena; the payload's invariants are checked last,
     * on bytes the pass left in the cache. A failure leaves the page to the
     * caller. */
    kvp__xxh_begin(c->h);
    kvp__xxh_update(c->h, b, OFF_CHECKSUM);
    int rc = authed ? kvp__mac_begin(c->h) : KVP_OK;
    if (rc == KVP_OK && authed) rc = kvp__mac_update(c->h, b, OFF_TAG);
    if (rc == KVP_OK) rc = stream_runs(c, page, b + HEADER_BYTES, true, authed);
    uint8_t sum[16], t[32];
    kvp__xxh_end(c->h, sum);
    if (rc == KVP_OK && authed) rc = kvp__mac_end(c->h, t);
    if (rc != KVP_OK) return codec_fail(c, KVP_EINTERNAL, "libcrypto's HMAC failed");
    if (memcmp(sum, b + OFF_CHECKSUM, 16) != 0)
        return reject(c, KVP_BLOB_CHECKSUM, reason, "checksum mismatch (corrupt bytes)");
    if (authed && !kvp__memeq_const(t, b + OFF_TAG, 32))
        return reject(c, KVP_BLOB_AUTH, reason, "wrong authentication tag (another key?)");
    rc = check_payload(c, staging, tokens, b + HEADER_BYTES, n, reason);
    if (rc != KVP_OK) return rc;
    c->stats.imported++;
    c->stats.bytes_in += bytes;
    return KVP_OK;
}

static int check_call(kvp_blob_codec_t *c, const void *blob, int32_t tokens,
                      kvp_blob_info_t *info) {
    if (blob == NULL) return codec_fail(c, KVP_EINVAL, "blob is NULL");
    if (tokens < 0 || tokens > c->layout.page_size)
        return codec_fail(c, KVP_EINVAL, "tokens must be 0..%d, got %d",
                              (int)c->layout.page_size, (int)tokens);
    if (info != NULL) return kvp__check_struct(info, sizeof *info, "info", c->err, KVP_ERR_SIZE);
    return KVP_OK;
}

int kvp_blob_validate(kvp_blob_codec_t *c, const void *blob, uint64_t bytes,
                      const kvp_hash_t *expect, int32_t tokens, kvp_blob_info_t *info,
                      int32_t *reason) {
    if (c == NULL) return KVP_EINVAL;
    int rc = check_call(c, blob, tokens, info);
    if (rc != KVP_OK) return rc;
    return full_check(c, (const uint8_t *)blob, bytes, expect, tokens, -1, info, reason,
                           NULL);
}

int kvp_blob_import(kvp_blob_codec_t *c, int32_t page, const void *blob, uint64_t bytes,
                    const kvp_hash_t *expect, int32_t tokens, int32_t *reason) {
    if (c == NULL) return KVP_EINVAL;
    int rc = check_call(c, blob, tokens, NULL);
    if (rc != KVP_OK) return rc;
    if (page < 0 || page >= c->num_pages + c->num_staging)
        return codec_fail(c, KVP_EINVAL, "page %d is out of range (0..%d)", (int)page,
                              (int)(c->num_pages + c->num_staging - 1));
    kvp_blob_info_t info = {.struct_size = sizeof info};
    const uint8_t *payload = NULL;
    rc = full_check(c, (const uint8_t *)blob, bytes, expect, tokens, page >= c->num_pages,
                         &info, reason, &payload);
    if (rc != KVP_OK) return rc;
    return write_payload(c, page, payload, info.payload_bytes);
}
