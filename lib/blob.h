/*
 * Internal declarations of the blob layer (blob.c, blobcrypto.c, and the
 * cache façade's use of it). Not installed.
 *
 * The hash primitives come from well-kept libraries (OpenSSL's libcrypto
 * for SHA-256 and HMAC-SHA256, libxxhash for XXH3-128); blobcrypto.c is the
 * only file that includes them, and without them (a build without
 * KVP_HAVE_BLOB) kvp__hasher_create() returns KVP_ENOTSUP.
 */
#ifndef KVPAGE_BLOB_INTERNAL_H
#define KVPAGE_BLOB_INTERNAL_H

#include "internal.h"
#include "kvpage_blob.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Streaming SHA-256, HMAC-SHA256 (with the key given at creation) and
 * XXH3-128 states, allocated once per codec. */
typedef struct kvp__hasher kvp__hasher;

int kvp__hasher_create(const kvp_allocator_t *a, const uint8_t *key, size_t key_bytes,
                       kvp__hasher **out, char *err, size_t err_size);
void kvp__hasher_destroy(const kvp_allocator_t *a, kvp__hasher *h);

/* SHA-256. Return KVP_OK, or KVP_ENOMEM/KVP_EINTERNAL if libcrypto fails. */
int kvp__sha_begin(kvp__hasher *h);
int kvp__sha_update(kvp__hasher *h, const void *data, size_t n);
int kvp__sha_end(kvp__hasher *h, uint8_t out[32]);

/* HMAC-SHA256 with the creation key (only when one was given). */
int kvp__mac_begin(kvp__hasher *h);
int kvp__mac_update(kvp__hasher *h, const void *data, size_t n);
int kvp__mac_end(kvp__hasher *h, uint8_t out[32]);

/* XXH3-128, seed 0, written in XXH3's canonical (big-endian) byte order. */
void kvp__xxh_begin(kvp__hasher *h);
void kvp__xxh_update(kvp__hasher *h, const void *data, size_t n);
void kvp__xxh_end(kvp__hasher *h, uint8_t out[16]);
/* XXH3-64 of a buffer, seed 0. */
uint64_t kvp__xxh64(const void *data, size_t n);

/* Compare secrets in time independent of where they differ. */
int kvp__memeq_const(const uint8_t *a, const uint8_t *b, size_t n);

/* ---- the codec, for the cache façade --------------------------------------- */

/* Every check of the header (a blob the cache then writes with
 * kvp__blob_write(), which checks the payload and integrity); when one
 * fails, integrity decides the reason, so corruption is counted as such.
 * Counts a rejection, not an accepted blob. */
int kvp__blob_precheck(kvp_blob_codec_t *c, const uint8_t *blob, uint64_t bytes,
                       const kvp_hash_t *expect, int32_t tokens, int32_t want_staging,
                       int32_t *reason);
/* Write a prechecked blob's payload into `page`, checking its integrity on
 * the way (one pass on the CPU) and then the payload's invariants.
 * KVP_EBADBLOB when either fails: the page may then hold bytes of no
 * meaning, and the caller must not let anything read it (roll the import
 * back). Counts the blob as accepted or rejected. */
int kvp__blob_write(kvp_blob_codec_t *c, int32_t page, const uint8_t *blob, uint64_t bytes,
                    int32_t *reason);

#ifdef __cplusplus
}
#endif

#endif /* KVPAGE_BLOB_INTERNAL_H */
