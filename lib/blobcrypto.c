/*
 * Layer `blob`: the hash primitives, from OpenSSL's libcrypto (SHA-256,
 * HMAC-SHA256) and libxxhash (XXH3). No cryptography is written here; this
 * file only adapts their APIs to the library's allocation and error rules.
 * Built without them (no KVP_HAVE_BLOB), creation reports KVP_ENOTSUP.
 */
#include "blob.h"

#include <string.h>

int kvp__memeq_const(const uint8_t *a, const uint8_t *b, size_t n) {
    uint8_t diff = 0;
    for (size_t i = 0; i < n; i++) diff |= (uint8_t)(a[i] ^ b[i]);
    return diff == 0;
}

#ifdef KVP_HAVE_BLOB

#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the heap of our allocator */
#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <xxhash.h>
/* On x86 the library picks its widest vector code (SSE2, AVX2, AVX-512) at
 * run time through its dispatch entry points; elsewhere its build's own. */
#if (defined(__x86_64__) || defined(__i386__)) && defined(__has_include)
#if __has_include(<xxh_x86dispatch.h>)
#define XXH_DISPATCH_DISABLE_REPLACE
#include <xxh_x86dispatch.h>
#define KVP__XXH3_UPDATE XXH3_128bits_update_dispatch
#endif
#endif
#ifndef KVP__XXH3_UPDATE
#define KVP__XXH3_UPDATE XXH3_128bits_update
#endif

struct kvp__hasher {
    XXH3_state_t xxh; /* first: the struct is allocated with its alignment */
    EVP_MD_CTX *md;
    EVP_MAC *mac;
    EVP_MAC_CTX *mac_ctx;
    uint8_t key[KVP_BLOB_MAX_KEY_BYTES];
    size_t key_bytes;
};

int kvp__hasher_create(const kvp_allocator_t *a, const uint8_t *key, size_t key_bytes,
                       kvp__hasher **out, char *err, size_t err_size) {
    if (key_bytes > KVP_BLOB_MAX_KEY_BYTES)
        return kvp__errf(err, err_size, KVP_EINVAL, "key longer than %d bytes",
                         KVP_BLOB_MAX_KEY_BYTES);
    kvp__hasher *h = (kvp__hasher *)kvp__calloc(a, 1, sizeof *h, 64);
    if (h == NULL) return kvp__errf(err, err_size, KVP_ENOMEM, "out of memory (hasher)");
    h->md = EVP_MD_CTX_new();
    bool ok = h->md != NULL;
    if (ok && key_bytes > 0) {
        memcpy(h->key, key, key_bytes);
        h->key_bytes = key_bytes;
        h->mac = EVP_MAC_fetch(NULL, OSSL_MAC_NAME_HMAC, NULL);
        ok = h->mac != NULL && (h->mac_ctx = EVP_MAC_CTX_new(h->mac)) != NULL;
    }
    if (!ok) {
        kvp__hasher_destroy(a, h);
        return kvp__errf(err, err_size, KVP_ENOMEM, "libcrypto could not create a %s context",
                         key_bytes > 0 ? "SHA-256 or HMAC" : "SHA-256");
    }
    *out = h;
    return KVP_OK;
}

void kvp__hasher_destroy(const kvp_allocator_t *a, kvp__hasher *h) {
    if (h == NULL) return;
    EVP_MD_CTX_free(h->md);
    EVP_MAC_CTX_free(h->mac_ctx);
    EVP_MAC_free(h->mac);
    memset(h->key, 0, sizeof h->key);
    kvp__free(a, h);
}

int kvp__sha_begin(kvp__hasher *h) {
    return EVP_DigestInit_ex(h->md, EVP_sha256(), NULL) == 1 ? KVP_OK : KVP_EINTERNAL;
}

int kvp__sha_update(kvp__hasher *h, const void *data, size_t n) {
    return EVP_DigestUpdate(h->md, data, n) == 1 ? KVP_OK : KVP_EINTERNAL;
}

int kvp__sha_end(kvp__hasher *h, uint8_t out[32]) {
    unsigned len = 0;
    return EVP_DigestFinal_ex(h->md, out, &len) == 1 && len == 32 ? KVP_OK : KVP_EINTERNAL;
}

int kvp__mac_begin(kvp__hasher *h) {
    if (h->mac_ctx == NULL) return KVP_EINTERNAL;
    char digest[] = "SHA256";
    OSSL_PARAM params[2];
    params[0] = OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0);
    params[1] = OSSL_PARAM_construct_end();
    return EVP_MAC_init(h->mac_ctx, h->key, h->key_bytes, params) == 1 ? KVP_OK : KVP_EINTERNAL;
}

int kvp__mac_update(kvp__hasher *h, const void *data, size_t n) {
    return EVP_MAC_update(h->mac_ctx, (const unsigned char *)data, n) == 1 ? KVP_OK
                                                                           : KVP_EINTERNAL;
}

int kvp__mac_end(kvp__hasher *h, uint8_t out[32]) {
    size_t len = 0;
    return EVP_MAC_final(h->mac_ctx, out, &len, 32) == 1 && len == 32 ? KVP_OK : KVP_EINTERNAL;
}

void kvp__xxh_begin(kvp__hasher *h) { XXH3_128bits_reset(&h->xxh); }

void kvp__xxh_update(kvp__hasher *h, const void *data, size_t n) {
    KVP__XXH3_UPDATE(&h->xxh, data, n);
}

void kvp__xxh_end(kvp__hasher *h, uint8_t out[16]) {
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits_digest(&h->xxh));
    memcpy(out, c.digest, 16);
}

uint64_t kvp__xxh64(const void *data, size_t n) { return XXH3_64bits(data, n); }

#else /* built without the blob feature */

struct kvp__hasher {
    int unused;
};

int kvp__hasher_create(const kvp_allocator_t *a, const uint8_t *key, size_t key_bytes,
                       kvp__hasher **out, char *err, size_t err_size) {
    (void)a, (void)key, (void)key_bytes, (void)out;
    return kvp__errf(err, err_size, KVP_ENOTSUP,
                     "libkvpage was built without page blobs (needs libcrypto and libxxhash: "
                     "install libssl-dev and libxxhash-dev and rebuild)");
}

void kvp__hasher_destroy(const kvp_allocator_t *a, kvp__hasher *h) { (void)a, (void)h; }
int kvp__sha_begin(kvp__hasher *h) { return (void)h, KVP_ENOTSUP; }
int kvp__sha_update(kvp__hasher *h, const void *data, size_t n) {
    return (void)h, (void)data, (void)n, KVP_ENOTSUP;
}
int kvp__sha_end(kvp__hasher *h, uint8_t out[32]) { return (void)h, (void)out, KVP_ENOTSUP; }
int kvp__mac_begin(kvp__hasher *h) { return (void)h, KVP_ENOTSUP; }
int kvp__mac_update(kvp__hasher *h, const void *data, size_t n) {
    return (void)h, (void)data, (void)n, KVP_ENOTSUP;
}
int kvp__mac_end(kvp__hasher *h, uint8_t out[32]) { return (void)h, (void)out, KVP_ENOTSUP; }
void kvp__xxh_begin(kvp__hasher *h) { (void)h; }
void kvp__xxh_update(kvp__hasher *h, const void *data, size_t n) { (void)h, (void)data, (void)n; }
void kvp__xxh_end(kvp__hasher *h, uint8_t out[16]) { (void)h, memset(out, 0, 16); }
uint64_t kvp__xxh64(const void *data, size_t n) { return (void)data, (void)n, 0; }

#endif
