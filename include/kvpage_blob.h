/**
 * @file kvpage_blob.h
 * @brief KV beyond one process: portable page blobs, chain hashes, blob
 *        tiers (a file tier, a queue, a Redis/Valkey tier, the engine's own),
 *        and the cache façade's use of them (prefix reuse across processes
 *        and machines, KV events, sequence export/import).
 *
 * A *page blob* is one page of KV (every layer's K and V blocks, in the
 * store's own bytes: int8/int4 travel quantized with their scales) behind a
 * 192-byte header that says exactly what it is: the engine's model
 * fingerprint, the layout and formats, the tensor-parallel shard, the page's
 * chain hash, the payload length, an XXH3-128 checksum of header and payload
 * and, with a key, an HMAC-SHA256 tag. docs/blob-format.md specifies the
 * bytes and publishes test vectors.
 *
 * A page is named by its *chain hash*: SHA-256 over the previous page's hash
 * and the page's token ids (little-endian u32), starting from a root into
 * which the fingerprint, layout, formats, shard and the sequence's salt are
 * hashed. Any process (or language) computes the same names from the same
 * tokens; a name carries no token id or text, and a blob is only ever
 * attached to a page whose chain hash it echoes.
 *
 * Every read is validated (kvp_blob_validate()): header fields, lengths,
 * checksum, tag, chain hash echo, and the payload's own invariants
 * (kvp_store_page_check()). A failure is a miss whose reason is counted;
 * nothing unvalidated reaches a page.
 *
 * This layer is an optional build feature: it needs OpenSSL's libcrypto
 * (SHA-256, HMAC) and libxxhash (XXH3), which the Makefile detects
 * (Debian: `libssl-dev`, `libxxhash-dev`). kvp_build_has(#KVP_FEATURE_BLOB)
 * tells; without it, the codec and the façade calls return #KVP_ENOTSUP
 * (the tier interface and the file tier, which move opaque bytes, still
 * work). The Redis/Valkey tier is a feature of its own, on hiredis (Debian:
 * `libhiredis-dev`; kvp_build_has(#KVP_FEATURE_REDIS)).
 */
#ifndef KVPAGE_BLOB_H
#define KVPAGE_BLOB_H

#include "kvpage.h"

#ifdef __cplusplus
extern "C" {
#endif

/**
 * @defgroup blob Page blobs
 * @brief One page of KV as a portable, self-validating object.
 * @{
 */

/** @brief Version of the blob format this library writes and reads. */
#define KVP_BLOB_FORMAT_VERSION 1
/** @brief Bytes of a blob's header; the payload follows it. */
#define KVP_BLOB_HEADER_BYTES 192
/** @brief Bytes of a model fingerprint. */
#define KVP_FINGERPRINT_BYTES 32
/** @brief Most bytes of an authentication key. */
#define KVP_BLOB_MAX_KEY_BYTES 64

/** @brief A 256-bit chain hash: a page's name and its blob's key. */
typedef struct kvp_hash {
    uint8_t bytes[32]; /**< SHA-256 output. */
} kvp_hash_t;

/**
 * @brief Why a blob was rejected (kvp_blob_validate()); also the index of
 *        the per-reason counters in the statistics.
 */
enum kvp_blob_reason {
    KVP_BLOB_OK = 0,          /**< Accepted. */
    KVP_BLOB_TRUNCATED = 1,   /**< Shorter than its header or than header + payload says,
                                   or longer. */
    KVP_BLOB_MAGIC = 2,       /**< Not a page blob (magic). */
    KVP_BLOB_VERSION = 3,     /**< Another format version or header size. */
    KVP_BLOB_FINGERPRINT = 4, /**< Another model fingerprint. */
    KVP_BLOB_LAYOUT = 5,      /**< Another layout: layers, kv heads, head dim, page size,
                                   key order, or payload length. */
    KVP_BLOB_FORMAT = 6,      /**< Other K/V formats, or different fp8 scales. */
    KVP_BLOB_SHARD = 7,       /**< Another tensor-parallel shard. */
    KVP_BLOB_HASH = 8,        /**< Its chain hash is not the one asked for (another prefix,
                                   salt, or a key that names the wrong blob). */
    KVP_BLOB_TOKENS = 9,      /**< Another token count, or a staging flag that does not fit. */
    KVP_BLOB_CHECKSUM = 10,   /**< The checksum does not match (corrupt bytes). */
    KVP_BLOB_AUTH = 11,       /**< Tag missing, unexpected, or wrong (other key). */
    KVP_BLOB_PAYLOAD = 12,    /**< The payload breaks an invariant of its formats
                                   (kvp_store_page_check()). */
    KVP_BLOB_RESERVED = 13,   /**< Unknown flags or non-zero reserved bytes. */
    KVP_BLOB_REASONS = 14     /**< Number of reasons (array size). */
};

/**
 * @brief The name of a #kvp_blob_reason, e.g. "checksum".
 * @param[in] reason A #kvp_blob_reason.
 * @return A static string; "unknown" for values out of range.
 */
KVP_API const char *kvp_blob_reason_name(int32_t reason);

/** @brief Identity of the blobs a codec writes and accepts. Fill with kvp_blob_params_init(). */
typedef struct kvp_blob_params {
    uint32_t struct_size;     /**< sizeof(kvp_blob_params_t); set by init. */
    int32_t shard_index;      /**< Tensor-parallel shard of this store, 0 .. shard_count-1;
                                   default 0. */
    int32_t shard_count;      /**< Shards, 1 .. 65535; default 1. */
    int32_t auth_key_bytes;   /**< 0 (default): no authentication; else 16 ..
                                   #KVP_BLOB_MAX_KEY_BYTES bytes of `auth_key`. */
    uint8_t fingerprint[KVP_FINGERPRINT_BYTES]; /**< The model's identity, supplied by the
                                   engine (e.g. SHA-256 of its weights file and
                                   architecture); all zero is refused. */
    const uint8_t *auth_key;  /**< HMAC-SHA256 key (copied at creation): blobs written
                                   carry a tag, blobs read must carry a valid one. */
    kvp_allocator_t allocator; /**< Host allocator hooks; NULL functions = libc. */
} kvp_blob_params_t;

/**
 * @brief A fingerprint from the engine's own description of its model:
 *        SHA-256 of the concatenation of `n` byte strings (e.g. the
 *        architecture's name and hyperparameters, then the weights file).
 *
 * A convenience: any 32 bytes that change whenever the weights, the
 * architecture or the way K/V are computed change will do.
 *
 * @param[in]  parts `n` pointers.
 * @param[in]  sizes `n` lengths.
 * @param[in]  n     >= 1.
 * @param[out] out   #KVP_FINGERPRINT_BYTES bytes.
 * @return #KVP_OK, #KVP_EINVAL, #KVP_ENOMEM, #KVP_ENOTSUP (built without
 *         the blob feature). O(bytes).
 */
KVP_API int kvp_fingerprint(const void *const *parts, const uint64_t *sizes, int32_t n,
                            uint8_t out[KVP_FINGERPRINT_BYTES]);

/**
 * @brief Fill `p` with defaults (shard 0 of 1, no authentication, libc
 *        allocator) and set its struct_size; the fingerprint stays zero and
 *        must be set.
 * @param[out] p Parameters; NULL is ignored.
 */
KVP_API void kvp_blob_params_init(kvp_blob_params_t *p);

/** @brief Writes and reads the blobs of one store (opaque). */
typedef struct kvp_blob_codec kvp_blob_codec_t;

/**
 * @brief A codec for the pages of `store`, with the identity in `params`.
 *
 * The codec keeps a pointer to the store (which must outlive it) and reads
 * its layout, formats and, for fp8_e4m3, its scales (set them first: blobs
 * carry a digest of them, and blobs of other scales are rejected).
 *
 * @param[in]  store    A CPU or CUDA store.
 * @param[in]  params   Identity.
 * @param[out] out      The codec; untouched on error.
 * @param[out] err      Optional error-detail buffer (#KVP_ERR_SIZE).
 * @param[in]  err_size Its size.
 * @return #KVP_OK, #KVP_EINVAL, #KVP_ENOMEM, #KVP_ENOTSUP (built without
 *         the blob feature).
 */
KVP_API int kvp_blob_codec_create(kvp_store_t *store, const kvp_blob_params_t *params,
                                  kvp_blob_codec_t **out, char *err, size_t err_size);

/** @brief Destroy a codec; NULL is a no-op. @param[in] codec The codec. */
KVP_API void kvp_blob_codec_destroy(kvp_blob_codec_t *codec);

/**
 * @brief Detail of the most recent failed call on this codec (sticky).
 * @param[in] codec The codec.
 * @return A sentence owned by the codec; "" if none; "NULL handle" for NULL.
 */
KVP_API const char *kvp_blob_codec_last_error(const kvp_blob_codec_t *codec);

/**
 * @brief The chain root for a salt: SHA-256 over a domain string, the
 *        fingerprint, the layout, formats, shard and `salt`
 *        (docs/blob-format.md).
 * @param[in]  codec The codec.
 * @param[in]  salt  The sequence's salt (#kvp_cache_seq_create()).
 * @param[out] root  The root hash.
 * @return #KVP_OK or #KVP_EINVAL.
 */
KVP_API int kvp_blob_chain_root(kvp_blob_codec_t *codec, uint64_t salt, kvp_hash_t *root);

/**
 * @brief Chain hashes of the pages of `n` tokens following `parent`.
 *
 * Page `i` covers `tokens[i*page_size ..]`; its hash is SHA-256 of the
 * previous page's hash (`parent` for i = 0) followed by its token ids as
 * little-endian u32. When `n` is not a multiple of page_size the last hash
 * is that of the partly filled page (its tokens only).
 *
 * @param[in]  codec  The codec.
 * @param[in]  parent The hash before the first page (kvp_blob_chain_root()
 *                    for a prompt's first page).
 * @param[in]  tokens `n` token ids (any int32 value).
 * @param[in]  n      >= 0.
 * @param[out] hashes `ceil(n / page_size)` hashes.
 * @return #KVP_OK or #KVP_EINVAL. O(n).
 */
KVP_API int kvp_blob_chain(kvp_blob_codec_t *codec, const kvp_hash_t *parent,
                           const int32_t *tokens, int64_t n, kvp_hash_t *hashes);

/**
 * @brief The text form of a hash: 64 lowercase hexadecimal digits and a NUL.
 *        Tiers use it as the blob's key (file name, Redis key).
 * @param[in]  hash The hash.
 * @param[out] out  65 bytes.
 * @return #KVP_OK or #KVP_EINVAL (NULL).
 */
KVP_API int kvp_hash_hex(const kvp_hash_t *hash, char out[65]);

/**
 * @brief Bytes of one blob of this codec's store: header plus a pool page
 *        (`staging` 0) or an fp16 staging page (`staging` 1).
 * @param[in]  codec   The codec.
 * @param[in]  staging 0 or 1 (1 only for layouts with staging pages).
 * @param[out] bytes   The blob's size.
 * @return #KVP_OK or #KVP_EINVAL.
 */
KVP_API int kvp_blob_size(const kvp_blob_codec_t *codec, int32_t staging, uint64_t *bytes);

/**
 * @brief Serialize one page of the store into a blob.
 *
 * @param[in]  codec  The codec.
 * @param[in]  page   A pool page id, or a staging page id (the blob is then
 *                    marked as a staging page).
 * @param[in]  tokens Tokens the page holds: page_size for a full pool page,
 *                    1 .. page_size for a partly filled one (a sequence's
 *                    last page), 1 .. page_size-1 for a staging page.
 * @param[in]  hash   The page's chain hash (kvp_blob_chain()).
 * @param[out] dst    The blob: kvp_blob_size() bytes.
 * @param[in]  dst_bytes Size of `dst`.
 * @return #KVP_OK, #KVP_EINVAL, #KVP_ECUDA (page read failed). O(page bytes):
 *         one copy and one checksum pass (and an HMAC pass with a key).
 */
KVP_API int kvp_blob_export(kvp_blob_codec_t *codec, int32_t page, int32_t tokens,
                            const kvp_hash_t *hash, void *dst, uint64_t dst_bytes);

/** @brief What a blob's header says (kvp_blob_validate()). */
typedef struct kvp_blob_info {
    uint32_t struct_size;   /**< Set by the caller to sizeof(kvp_blob_info_t). */
    int32_t staging;        /**< 1: an fp16 staging page. */
    int32_t tokens;         /**< Tokens the page holds. */
    int32_t reserved_;      /**< Padding; 0. */
    uint64_t payload_bytes; /**< Payload length. */
    kvp_hash_t hash;        /**< The chain hash it echoes. */
} kvp_blob_info_t;

/**
 * @brief Validate a blob against this codec (identity, layout, lengths,
 *        checksum, tag, chain hash, payload invariants) without writing
 *        anything.
 *
 * @param[in]  codec  The codec (its reject counters count a failure).
 * @param[in]  blob   The bytes.
 * @param[in]  bytes  Their length.
 * @param[in]  expect The chain hash it must echo, or NULL to accept any.
 * @param[in]  tokens The token count it must hold, or 0 for any.
 * @param[out] info   Optional: the header's fields (set on success).
 * @param[out] reason Optional: a #kvp_blob_reason (#KVP_BLOB_OK on success).
 * @return #KVP_OK, #KVP_EINVAL (bad arguments), #KVP_EBADBLOB (rejected;
 *         `reason` and the detail text say why). O(blob bytes).
 */
KVP_API int kvp_blob_validate(kvp_blob_codec_t *codec, const void *blob, uint64_t bytes,
                              const kvp_hash_t *expect, int32_t tokens, kvp_blob_info_t *info,
                              int32_t *reason);

/**
 * @brief Validate a blob, then write its payload into a page of the store.
 *
 * @param[in]  codec  The codec.
 * @param[in]  page   A pool page (for a pool-page blob) or a staging page
 *                    (for a staging blob).
 * @param[in]  blob   The bytes.
 * @param[in]  bytes  Their length.
 * @param[in]  expect As kvp_blob_validate().
 * @param[in]  tokens As kvp_blob_validate().
 * @param[out] reason Optional: a #kvp_blob_reason.
 * @return As kvp_blob_validate(); #KVP_ECUDA. A rejected blob writes nothing.
 */
KVP_API int kvp_blob_import(kvp_blob_codec_t *codec, int32_t page, const void *blob,
                            uint64_t bytes, const kvp_hash_t *expect, int32_t tokens,
                            int32_t *reason);

/** @brief A codec's counters (kvp_blob_codec_stats()). */
typedef struct kvp_blob_stats {
    uint32_t struct_size;     /**< Set by the caller to sizeof(kvp_blob_stats_t). */
    int32_t reserved_;        /**< Padding; 0. */
    uint64_t exported;        /**< Blobs written. */
    uint64_t imported;        /**< Blobs validated (and, by import, written to a page). */
    uint64_t rejected;        /**< Blobs rejected, all reasons. */
    uint64_t bytes_out;       /**< Bytes of blobs written. */
    uint64_t bytes_in;        /**< Bytes of blobs accepted. */
    uint64_t rejects[KVP_BLOB_REASONS]; /**< Rejections by #kvp_blob_reason. */
} kvp_blob_stats_t;

/**
 * @brief A codec's counters.
 * @param[in]  codec The codec.
 * @param[out] stats Filled in; `stats->struct_size` must be set.
 * @return #KVP_OK or #KVP_EINVAL.
 */
KVP_API int kvp_blob_codec_stats(const kvp_blob_codec_t *codec, kvp_blob_stats_t *stats);

/** @} */

/**
 * @defgroup blobtier Blob tiers
 * @brief One small interface to anywhere blobs can be kept: a directory, a
 *        shared store, the engine's own.
 *
 * A tier keeps blobs by key (a chain hash). The library wraps any
 * implementation of #kvp_blob_tier_ops_t in a #kvp_blob_tier_t that checks
 * arguments and counts calls, hits, misses, bytes and time. Tiers are
 * untrusted: whatever a `get` returns is validated before use.
 * @{
 */

/**
 * @brief The functions a tier implements. Every batched call gets `n` >= 1
 *        keys; `self` is the pointer given to kvp_blob_tier_create().
 *
 * A call returns #KVP_OK or a negative status for the whole batch (the
 * wrapper then counts every key of the batch as a miss and records the
 * detail text from `last_error`). Implementations must not block for long:
 * the cache calls them from the engine's thread.
 */
typedef struct kvp_blob_tier_ops {
    uint32_t struct_size; /**< sizeof(kvp_blob_tier_ops_t) the implementation was built with. */
    int32_t reserved_;    /**< Must be 0. */
    /** Fetch: for each key, copy the blob into `bufs[i]` (room `caps[i]`)
     *  and set `sizes[i]` to its length; 0 when absent or larger than
     *  `caps[i]`. */
    int (*get)(void *self, int32_t n, const kvp_hash_t *keys, void *const *bufs,
               const uint64_t *caps, uint64_t *sizes);
    /** Store `n` blobs (replacing any under the same key). Only whole blobs
     *  may ever become visible to a `get`. */
    int (*put)(void *self, int32_t n, const kvp_hash_t *keys, const void *const *blobs,
               const uint64_t *sizes);
    /** Set `present[i]` to 1 if key `i` is held, else 0. */
    int (*exists)(void *self, int32_t n, const kvp_hash_t *keys, uint8_t *present);
    /** Remove the keys (absent keys are not an error). */
    int (*remove)(void *self, int32_t n, const kvp_hash_t *keys);
    /** Optional: entries and bytes held now (`entries`, `bytes` of
     *  #kvp_blob_tier_stats_t); NULL if unknown. */
    int (*usage)(void *self, uint64_t *entries, uint64_t *bytes);
    /** Optional: a sentence about the last failure; NULL for none. */
    const char *(*last_error)(void *self);
    /** Optional: called by kvp_blob_tier_destroy(). */
    void (*destroy)(void *self);
} kvp_blob_tier_ops_t;

/** @brief A tier behind the checked, counted interface (opaque). */
typedef struct kvp_blob_tier kvp_blob_tier_t;

/**
 * @brief Wrap an implementation in a tier.
 * @param[in]  ops      Its functions (copied); get, put, exists and remove
 *                      are required.
 * @param[in]  self     Passed to every function.
 * @param[in]  name     A short name for reports ("file", "redis", ...),
 *                      copied (at most 31 bytes are kept).
 * @param[out] out      The tier.
 * @param[out] err      Optional error-detail buffer.
 * @param[in]  err_size Its size.
 * @return #KVP_OK, #KVP_EINVAL, #KVP_ENOMEM.
 */
KVP_API int kvp_blob_tier_create(const kvp_blob_tier_ops_t *ops, void *self, const char *name,
                                 kvp_blob_tier_t **out, char *err, size_t err_size);

/** @brief Destroy a tier (calling its `destroy`); NULL is a no-op. @param[in] tier The tier. */
KVP_API void kvp_blob_tier_destroy(kvp_blob_tier_t *tier);

/**
 * @brief Detail of the most recent failed call on this tier (sticky).
 * @param[in] tier The tier.
 * @return A sentence owned by the tier; "" if none; "NULL handle" for NULL.
 */
KVP_API const char *kvp_blob_tier_last_error(const kvp_blob_tier_t *tier);

/**
 * @brief The tier's name.
 * @param[in] tier The tier.
 * @return The name given at creation; "" for NULL.
 */
KVP_API const char *kvp_blob_tier_name(const kvp_blob_tier_t *tier);

/**
 * @brief Fetch blobs (see #kvp_blob_tier_ops_t::get).
 * @param[in]  tier  The tier.
 * @param[in]  n     Keys, >= 1.
 * @param[in]  keys  `n` keys.
 * @param[out] bufs  `n` buffers.
 * @param[in]  caps  Their sizes.
 * @param[out] sizes `n` lengths; 0 = miss.
 * @return #KVP_OK (hits and misses alike), #KVP_EINVAL, or the
 *         implementation's error (every `sizes[i]` is then 0).
 */
KVP_API int kvp_blob_tier_get(kvp_blob_tier_t *tier, int32_t n, const kvp_hash_t *keys,
                              void *const *bufs, const uint64_t *caps, uint64_t *sizes);

/**
 * @brief Store blobs (see #kvp_blob_tier_ops_t::put).
 * @param[in] tier  The tier.
 * @param[in] n     Blobs, >= 1.
 * @param[in] keys  Their keys.
 * @param[in] blobs Their bytes.
 * @param[in] sizes Their lengths (>= 1 each).
 * @return #KVP_OK, #KVP_EINVAL, or the implementation's error.
 */
KVP_API int kvp_blob_tier_put(kvp_blob_tier_t *tier, int32_t n, const kvp_hash_t *keys,
                              const void *const *blobs, const uint64_t *sizes);

/**
 * @brief Which keys the tier holds.
 * @param[in]  tier    The tier.
 * @param[in]  n       Keys, >= 1.
 * @param[in]  keys    The keys.
 * @param[out] present `n` flags (0 on error).
 * @return #KVP_OK, #KVP_EINVAL, or the implementation's error.
 */
KVP_API int kvp_blob_tier_exists(kvp_blob_tier_t *tier, int32_t n, const kvp_hash_t *keys,
                                 uint8_t *present);

/**
 * @brief Remove keys.
 * @param[in] tier The tier.
 * @param[in] n    Keys, >= 1.
 * @param[in] keys The keys.
 * @return #KVP_OK, #KVP_EINVAL, or the implementation's error.
 */
KVP_API int kvp_blob_tier_remove(kvp_blob_tier_t *tier, int32_t n, const kvp_hash_t *keys);

/** @brief A tier's counters (kvp_blob_tier_stats()). */
typedef struct kvp_blob_tier_stats {
    uint32_t struct_size; /**< Set by the caller to sizeof(kvp_blob_tier_stats_t). */
    int32_t reserved_;    /**< Padding; 0. */
    uint64_t gets;        /**< Keys asked for by get. */
    uint64_t hits;        /**< Of which found. */
    uint64_t puts;        /**< Blobs stored by put. */
    uint64_t errors;      /**< Calls that returned an error. */
    uint64_t bytes_in;    /**< Bytes fetched. */
    uint64_t bytes_out;   /**< Bytes stored. */
    uint64_t get_ns;      /**< Time in get (monotonic clock). */
    uint64_t put_ns;      /**< Time in put. */
    uint64_t entries;     /**< Blobs held now (from `usage`; 0 if unknown). */
    uint64_t bytes;       /**< Bytes held now (from `usage`; 0 if unknown). */
} kvp_blob_tier_stats_t;

/**
 * @brief A tier's counters.
 * @param[in]  tier  The tier.
 * @param[out] stats Filled in; `stats->struct_size` must be set.
 * @return #KVP_OK or #KVP_EINVAL.
 */
KVP_API int kvp_blob_tier_stats(kvp_blob_tier_t *tier, kvp_blob_tier_stats_t *stats);

/** @brief File tier parameters. Fill with kvp_file_tier_params_init(). */
typedef struct kvp_file_tier_params {
    uint32_t struct_size;      /**< sizeof(kvp_file_tier_params_t); set by init. */
    int32_t fsync;             /**< 1 (default): fsync each blob and the directory before
                                    it becomes visible; 0: leave it to the kernel. */
    const char *path;          /**< The directory (created if missing, parents must
                                    exist); copied. */
    uint64_t max_bytes;        /**< Byte cap of the blobs; least recently used blobs are
                                    removed to stay under it; 0 = no cap. */
    kvp_allocator_t allocator; /**< Host allocator hooks; NULL functions = libc. */
} kvp_file_tier_params_t;

/**
 * @brief Defaults: fsync on, no cap, libc allocator; `path` must be set.
 * @param[out] p Parameters; NULL is ignored.
 */
KVP_API void kvp_file_tier_params_init(kvp_file_tier_params_t *p);

/**
 * @brief A tier on a local directory: one file per blob, named by its key.
 *
 * A blob is written to a temporary name, fsync'd, and renamed into place,
 * so a crash never leaves a partial blob visible. Several processes may
 * share the directory: each renames complete files only, and a `get` reads
 * a whole file. The byte cap is enforced by whoever writes: a put that
 * would pass it rescans the directory and removes blobs, least recently
 * used first (access times, which gets refresh), down to 15/16 of the cap.
 * Writers that fill the directory at the same moment each count only what
 * they have seen, so together they can pass the cap until one of them
 * rescans at its next put. Opening a directory rebuilds the index from the
 * files and removes temporary files of writers that died.
 *
 * @param[in]  params   Parameters.
 * @param[out] out      The tier.
 * @param[out] err      Optional error-detail buffer.
 * @param[in]  err_size Its size.
 * @return #KVP_OK, #KVP_EINVAL, #KVP_ENOMEM, #KVP_EIO (the directory cannot
 *         be created or read).
 */
KVP_API int kvp_file_tier_create(const kvp_file_tier_params_t *params, kvp_blob_tier_t **out,
                                 char *err, size_t err_size);

/** @brief Queue tier parameters. Fill with kvp_queue_tier_params_init(). */
typedef struct kvp_queue_tier_params {
    uint32_t struct_size;      /**< sizeof(kvp_queue_tier_params_t); set by init. */
    int32_t reserved_;         /**< Must be 0. */
    kvp_blob_tier_t *inner;    /**< The tier written from the queue's thread (required; not
                                    owned: destroy it after the queue tier). */
    uint64_t max_bytes;        /**< Most blob bytes waiting at once (default 256 MiB); a put
                                    beyond it is dropped and counted. */
    kvp_allocator_t allocator; /**< Host allocator hooks; NULL functions = libc. */
} kvp_queue_tier_params_t;

/**
 * @brief Defaults: 256 MiB of queue, libc allocator; `inner` must be set.
 * @param[out] p Parameters; NULL is ignored.
 */
KVP_API void kvp_queue_tier_params_init(kvp_queue_tier_params_t *p);

/**
 * @brief A tier whose puts never wait: blobs are copied into a queue and
 *        written to `inner` by a thread of the queue's own.
 *
 * For a cache whose decode loop must not wait for a disk or a network:
 * write-back and write-through then cost a copy per page. When the queue
 * is full a put drops the blob (kvp_queue_tier_info() counts it): a later
 * miss, never a stall. Blobs waiting or being written are visible to `get`
 * and `exists`. Every call on `inner` is made under one lock, so `inner`
 * need not be thread-safe; a `get` may wait for the batch being written.
 * Destroying the queue tier first writes what is queued.
 *
 * @param[in]  params   Parameters.
 * @param[out] out      The tier.
 * @param[out] err      Optional error-detail buffer.
 * @param[in]  err_size Its size.
 * @return #KVP_OK, #KVP_EINVAL, #KVP_ENOMEM (also when the thread cannot start).
 */
KVP_API int kvp_queue_tier_create(const kvp_queue_tier_params_t *params, kvp_blob_tier_t **out,
                                  char *err, size_t err_size);

/** @brief A queue tier's state (kvp_queue_tier_info()). */
typedef struct kvp_queue_tier_info {
    uint32_t struct_size;  /**< Set by the caller to sizeof(kvp_queue_tier_info_t). */
    int32_t reserved_;     /**< Padding; 0. */
    uint64_t queued;       /**< Blobs waiting or being written. */
    uint64_t queued_bytes; /**< Their bytes. */
    uint64_t dropped;      /**< Blobs not queued: the queue was full (or out of memory). */
    uint64_t failed;       /**< Blobs the tier behind refused (its put failed; why:
                                kvp_blob_tier_last_error() of that tier). */
} kvp_queue_tier_info_t;

/**
 * @brief A queue tier's counters.
 * @param[in]  tier A tier made by kvp_queue_tier_create().
 * @param[out] info Filled in; `info->struct_size` must be set.
 * @return #KVP_OK or #KVP_EINVAL (another kind of tier, bad `info`).
 */
KVP_API int kvp_queue_tier_info(kvp_blob_tier_t *tier, kvp_queue_tier_info_t *info);

/**
 * @brief Wait until every queued blob has been written (or refused) behind.
 * @param[in] tier A tier made by kvp_queue_tier_create().
 * @return #KVP_OK or #KVP_EINVAL (another kind of tier).
 */
KVP_API int kvp_queue_tier_drain(kvp_blob_tier_t *tier);

/** @brief Redis/Valkey tier parameters. Fill with kvp_redis_tier_params_init(). */
typedef struct kvp_redis_tier_params {
    uint32_t struct_size;      /**< sizeof(kvp_redis_tier_params_t); set by init. */
    int32_t cluster;           /**< -1 (default): ask the first server that answers
                                    (`CLUSTER SLOTS`); 0: standalone servers; 1: a
                                    Redis/Valkey Cluster whose nodes `uri` lists some of. */
    const char *uri;           /**< Required: one or more
                                    `redis://[user[:password]@]host[:port][/db]` (port
                                    6379, db 0 by default; user and password
                                    percent-encoded; `redis://:password@host` for a
                                    password alone),
                                    separated by commas or spaces. Several standalone
                                    servers form a sharded set: each key lives on one of
                                    them, chosen by rendezvous hashing. Copied. */
    const char *user;          /**< ACL user for URIs that name none (NULL: none, or the
                                    server's `default` user with a password). Copied. */
    const char *password;      /**< Password for URIs that carry none, so that it need not
                                    appear in a URI (NULL: none). Copied. */
    const char *prefix;        /**< Key namespace: a blob's key is the prefix and its chain
                                    hash in hex. Default "kvp:"; at most 64 bytes; copied. */
    int32_t connect_timeout_ms; /**< Longest wait for one connection (default 250). */
    int32_t timeout_ms;        /**< Budget of one call, whatever it waits for (the lock,
                                    connections, every server's replies): keys not answered
                                    in time are misses (default 100). */
    int32_t ttl_s;             /**< Expire each stored blob after this many seconds; 0
                                    (default): never (the server's eviction policy decides). */
    int32_t retry_min_ms;      /**< After a server fails, keys routed to it are misses at
                                    once for this long before a reconnection is tried; the
                                    wait doubles with each failure in a row (default 100). */
    int32_t retry_max_ms;      /**< Longest wait between reconnection attempts (default
                                    5000). */
    int32_t reserved_;         /**< Must be 0. */
    kvp_allocator_t allocator; /**< Host allocator hooks for the tier's own state; NULL
                                    functions = libc (hiredis's buffers use libc). */
} kvp_redis_tier_params_t;

/**
 * @brief Defaults: cluster auto-detected, prefix "kvp:", 250 ms connect,
 *        100 ms per call, no TTL, reconnect backoff 100 ms to 5 s, libc
 *        allocator; `uri` must be set.
 * @param[out] p Parameters; NULL is ignored.
 */
KVP_API void kvp_redis_tier_params_init(kvp_redis_tier_params_t *p);

/**
 * @brief A tier on Redis or Valkey: one key per blob, shared by every
 *        process that uses the same servers, prefix and identity.
 *
 * Each call is one pipelined exchange per server (`GET`, `SET` with an
 * optional `EX`, `EXISTS`, `UNLINK`), every server's batch written before
 * any reply is read. In a Cluster, keys are routed to their hash slot's
 * node from the slot map (`CLUSTER SLOTS`); a `MOVED` reply updates the map
 * and sends the key to its new node, an `ASK` reply sends it once to the
 * importing node, and the whole map is read again at the next call, so
 * slots that move or nodes that join during a run are followed.
 *
 * A call never waits longer than `timeout_ms` in all: a server that is
 * slow, dead or unreachable turns its keys into misses (gets), refusals
 * (puts) or "absent" (exists), counted in kvp_redis_tier_info(); its
 * connection is closed and retried after a backoff (kvp_redis_tier_reconnect()
 * retries at once). A get or exists returns #KVP_EIO only when none of its
 * keys could be asked (else the keys that could are answered); a put or
 * removal returns it when any key failed. A cache counts such a call as an
 * error and its keys as misses. A blob the server evicted or that expired is a miss
 * like any other; every blob read is validated by the cache before use,
 * so a corrupt, foreign or unauthenticated one is rejected, never attached.
 *
 * Creation connects to every URI, authenticates (`AUTH`), selects the
 * database (`SELECT`, standalone only), reads the slot map, and checks that
 * the server lets the tier run each command it uses on a probe key under
 * the prefix, so that a wrong password or a missing ACL permission fails
 * here, with the server's words, not later. Calls on one tier are
 * serialized by a lock (waiting for it counts against the budget).
 *
 * @param[in]  params   Parameters.
 * @param[out] out      The tier.
 * @param[out] err      Optional error-detail buffer.
 * @param[in]  err_size Its size.
 * @return #KVP_OK; #KVP_EINVAL (a malformed URI, bad parameters);
 *         #KVP_EIO (a server cannot be reached or answers wrongly);
 *         #KVP_EACCES (credentials or a command refused); #KVP_ENOMEM;
 *         #KVP_ENOTSUP (built without hiredis, see
 *         kvp_build_has(#KVP_FEATURE_REDIS)).
 */
KVP_API int kvp_redis_tier_create(const kvp_redis_tier_params_t *params, kvp_blob_tier_t **out,
                                  char *err, size_t err_size);

/** @brief A Redis tier's state (kvp_redis_tier_info()). */
typedef struct kvp_redis_tier_info {
    uint32_t struct_size;    /**< Set by the caller to sizeof(kvp_redis_tier_info_t). */
    int32_t cluster;         /**< 1: a Cluster; 0: standalone servers. */
    int32_t nodes;           /**< Servers known: the URIs, or the Cluster's nodes. */
    int32_t nodes_down;      /**< Of which failed and not connected again since. */
    uint64_t round_trips;    /**< Pipelined exchanges with a server. */
    uint64_t commands;       /**< Commands sent. */
    uint64_t connects;       /**< Connections made (the first ones and reconnections). */
    uint64_t failures;       /**< Connections refused, lost or timed out (each attempt:
                                  a server down for a while fails once per backoff). */
    uint64_t timeouts;       /**< Calls that ran out of their budget. */
    uint64_t skipped;        /**< Keys not sent because their server was down. */
    uint64_t server_errors;  /**< Error replies other than redirects (e.g. `OOM`). */
    uint64_t moved;          /**< `MOVED` redirects followed. */
    uint64_t asked;          /**< `ASK` redirects followed. */
    uint64_t slot_refreshes; /**< Times the Cluster's slot map was read. */
} kvp_redis_tier_info_t;

/**
 * @brief A Redis tier's counters and connection state.
 * @param[in]  tier A tier made by kvp_redis_tier_create().
 * @param[out] info Filled in; `info->struct_size` must be set.
 * @return #KVP_OK or #KVP_EINVAL (another kind of tier, bad `info`).
 */
KVP_API int kvp_redis_tier_info(kvp_blob_tier_t *tier, kvp_redis_tier_info_t *info);

/**
 * @brief Re-enable a tier whose servers failed: forget every backoff and
 *        connect now (each within the connect timeout), reading the slot
 *        map again in a Cluster.
 * @param[in] tier A tier made by kvp_redis_tier_create().
 * @return #KVP_OK (every server answers), #KVP_EIO (some do not: they are
 *         retried after their backoff), #KVP_EACCES, #KVP_EINVAL (another
 *         kind of tier).
 */
KVP_API int kvp_redis_tier_reconnect(kvp_blob_tier_t *tier);

/** @} */

/**
 * @defgroup cacheblob Cache façade: tiers and sequence transfer
 * @brief Prefix reuse across processes and machines, and moving a sequence
 *        to another cache.
 * @{
 */

/**
 * @brief What a cache does with a tier (flags of kvp_cache_add_tier()).
 *
 * Where the cost lands: a lookup costs the tier's `get` and a validated copy
 * per page found, in kvp_cache_seq_attach_prefix(). Write-back serializes
 * each evicted page (a copy and a checksum) in the call whose allocation
 * evicted it, usually kvp_cache_begin_step(), and puts the buffered blobs
 * when that call returns. Write-through puts the pages stored by the
 * previous step at the start of kvp_cache_begin_step() (or on
 * kvp_cache_flush(), a release, destruction). A tier's `put` runs on the
 * calling thread: a file tier with fsync waits for the disk there, so an
 * engine whose decode loop must not wait on a disk puts a queue in front
 * of it (kvp_queue_tier_create(): a put is then a copy).
 */
enum kvp_tier_policy {
    KVP_TIER_READ = 1,          /**< Look prompts up in it on admission. */
    KVP_TIER_WRITE_BACK = 2,    /**< Write cached pages the pool evicts to it. */
    KVP_TIER_WRITE_THROUGH = 4  /**< Write every full page stored in the prefix cache to
                                     it (at the next step, once its K/V are written). */
};

/** @brief Where a page came from or went to, in cache events: no tier. */
#define KVP_TIER_NONE (-1)

/**
 * @brief Give the cache its blob identity (fingerprint, shard, key); needed
 *        by every other call of this group. Call once, before any tier.
 *
 * Allocates the cache's blob state: 64 bytes and one flag per pool page
 * (chain hashes: its own and its parent's), and two buffers of up to 32
 * pool-page blobs each, at most
 * 16 MiB each (lookups and write-back are batched in that many pages).
 *
 * @param[in] c      The cache.
 * @param[in] params Identity (as kvp_blob_codec_create()).
 * @return #KVP_OK, #KVP_EINVAL, #KVP_ESTATE (already set), #KVP_ENOMEM,
 *         #KVP_ENOTSUP.
 */
KVP_API int kvp_cache_set_blob(kvp_cache_t *c, const kvp_blob_params_t *params);

/**
 * @brief The cache's codec (after kvp_cache_set_blob()), e.g. for its chain
 *        hashes and counters; owned by the cache.
 * @param[in]  c     The cache.
 * @param[out] codec The codec.
 * @return #KVP_OK, #KVP_EINVAL, #KVP_ESTATE (no identity set).
 */
KVP_API int kvp_cache_blob_codec(const kvp_cache_t *c, kvp_blob_codec_t **codec);

/**
 * @brief Add a tier behind the pool: prompts are looked up in the tiers in
 *        the order they were added, after the pool.
 *
 * The cache does not own the tier: destroy it after the cache. Up to 8
 * tiers.
 *
 * @param[in]  c      The cache (with an identity).
 * @param[in]  tier   The tier.
 * @param[in]  policy #kvp_tier_policy flags (at least one).
 * @param[out] index  Optional: its index (0, 1, ...) in events and stats.
 * @return #KVP_OK, #KVP_EINVAL, #KVP_ESTATE, #KVP_ENOSPC (8 tiers),
 *         #KVP_ENOMEM.
 */
KVP_API int kvp_cache_add_tier(kvp_cache_t *c, kvp_blob_tier_t *tier, int32_t policy,
                               int32_t *index);

/** @brief What one of a cache's tiers did for it (kvp_cache_tier_stats()). */
typedef struct kvp_cache_tier_stats {
    uint32_t struct_size;  /**< Set by the caller to sizeof(kvp_cache_tier_stats_t). */
    int32_t reserved_;     /**< Padding; 0. */
    uint64_t lookups;      /**< Pages looked up (after the pool and earlier tiers missed). */
    uint64_t hit_pages;    /**< Pages found, validated and imported. */
    uint64_t miss_pages;   /**< Pages not found (or found after a missing one). */
    uint64_t rejected;     /**< Pages found but rejected (validation). */
    uint64_t rejects[KVP_BLOB_REASONS]; /**< Rejections by #kvp_blob_reason. */
    uint64_t written;      /**< Pages written (write-back and write-through). */
    uint64_t errors;       /**< Tier calls that failed (their pages were misses). */
    uint64_t bytes_in;     /**< Blob bytes read. */
    uint64_t bytes_out;    /**< Blob bytes written. */
    uint64_t read_ns;      /**< Time looking up and importing. */
    uint64_t write_ns;     /**< Time exporting and writing. */
} kvp_cache_tier_stats_t;

/**
 * @brief Counters of one tier of the cache.
 * @param[in]  c     The cache.
 * @param[in]  index The tier's index.
 * @param[out] stats Filled in; `stats->struct_size` must be set.
 * @return #KVP_OK or #KVP_EINVAL.
 */
KVP_API int kvp_cache_tier_stats(const kvp_cache_t *c, int32_t index,
                                 kvp_cache_tier_stats_t *stats);

/**
 * @brief Write pending write-through pages now (the cache also does it at
 *        the start of each step and before a sequence is released).
 * @param[in] c The cache.
 * @return #KVP_OK, #KVP_EINVAL. Tier failures are counted, not returned.
 */
KVP_API int kvp_cache_flush(kvp_cache_t *c);

/**
 * @brief Event kinds a cache adds to its pool's (#kvp_cache_event_t::kind;
 *        the pool's are #kvp_pool_event_kind).
 *
 * Together they describe what the cache holds where, in the terms prefix-aware
 * routers use (vLLM's and Dynamo's KV events): a page is *stored* in a medium
 * (#KVP_EVENT_PAGE_STORED: the pool; #KVP_EVENT_TIER_STORED: a tier), *removed*
 * from it (#KVP_EVENT_PAGE_EVICTED, #KVP_EVENT_TIER_REMOVED), or the medium is
 * *cleared* (#KVP_EVENT_CLEARED). Pages are named by chain hash, with their
 * parent's, so a router that knows the hashing (docs/blob-format.md) matches
 * a request's pages without token ids.
 */
enum kvp_cache_event_kind {
    /** A page's blob was written to tier `tier` (write-back or write-through):
     *  the tier holds `chain` now. Blobs the tier held already are not written
     *  again and give no event. */
    KVP_EVENT_TIER_STORED = 16,
    /** The cache removed `chain` from tier `tier`: the blob it read there was
     *  rejected (corrupt, or not this cache's), so that it is not fetched again
     *  and a good blob can take its place. */
    KVP_EVENT_TIER_REMOVED = 17,
    /** The pool's prefix cache was emptied at once (kvp_cache_clear_prefix()):
     *  every page stored before is gone; no EVICTED event is sent for them. */
    KVP_EVENT_CLEARED = 18
};

/** @brief A cache event: a pool event with its tier and chain hash, or a tier
 *         event (kvp_cache_set_event_callback()). */
typedef struct kvp_cache_event {
    uint32_t struct_size;  /**< sizeof(kvp_cache_event_t) of the library; read fields up
                                to it. */
    int32_t kind;          /**< A #kvp_pool_event_kind or a #kvp_cache_event_kind. */
    int32_t page;          /**< The pool page; -1 for TIER_STORED of a page no longer in the
                                pool, TIER_REMOVED and CLEARED. */
    int32_t parent;        /**< As #kvp_pool_event_t; -1 for tier events and CLEARED. */
    int32_t priority;      /**< As #kvp_pool_event_t; 0 for tier events and CLEARED. */
    int32_t tier;          /**< STORED: the tier index it was imported from; EVICTED:
                                the tier index it was written back to; TIER_STORED,
                                TIER_REMOVED: the tier; else #KVP_TIER_NONE (CLEARED: the
                                pool). */
    uint64_t hash;         /**< The pool's 64-bit hash, as #kvp_pool_event_t; 0 for tier
                                events and CLEARED. */
    kvp_hash_t chain;      /**< STORED/EVICTED/TIER_*: the page's chain hash (its blob key);
                                zero for FREED, CLEARED, and pages of a cache with no
                                identity (kvp_cache_set_blob()). */
    kvp_hash_t parent_chain; /**< STORED/EVICTED/TIER_STORED: the parent page's chain hash
                                (the chain root for a first page); zero where `chain` is,
                                and for TIER_REMOVED. */
    uint64_t seq_no;       /**< The event's number in this cache's stream: 0, 1, 2, ...
                                A gap means events were produced while no callback was set
                                (a router then resynchronizes). */
    int32_t page_size;     /**< Tokens per page (vLLM's block_size). */
    int32_t num_tokens;    /**< STORED: `page_size` (the page's token ids are in `tokens`);
                                else 0. */
    const int32_t *tokens; /**< STORED: the page's token ids, valid during the call;
                                else NULL. */
} kvp_cache_event_t;

/**
 * @brief Cache event callback: called synchronously from inside the cache's
 *        calls. It must not call back into the cache.
 * @param[in] opaque The pointer given to kvp_cache_set_event_callback().
 * @param[in] event  The event; valid during the call only.
 */
typedef void (*kvp_cache_event_fn)(void *opaque, const kvp_cache_event_t *event);

/**
 * @brief The cache's events: pool events with the tier a page came from
 *        (STORED) or went to (EVICTED) and its chain hash, and tier events
 *        (#kvp_cache_event_kind), numbered in one stream.
 *
 * Replaying the stream gives what the cache holds: STORED adds `chain` to
 * the pool's set and EVICTED removes it, CLEARED empties it; TIER_STORED
 * adds `chain` to tier `tier`'s set and TIER_REMOVED removes it. A tier's
 * own removals (a server's LRU eviction or TTL, another process) are not
 * seen by the cache: for a shared tier the set is what this cache put
 * there, a hint that a lookup confirms.
 *
 * With tiers, the cache listens to its pool's events itself: set the
 * engine's callback here, not with kvp_pool_set_event_callback() on the
 * cache's pool (that would replace the cache's).
 *
 * @param[in] c      The cache.
 * @param[in] fn     Callback, or NULL.
 * @param[in] opaque Passed to `fn`.
 * @return #KVP_OK, #KVP_EINVAL, #KVP_ENOMEM.
 */
KVP_API int kvp_cache_set_event_callback(kvp_cache_t *c,
                                         kvp_cache_event_fn fn,
                                         void *opaque);

/**
 * @brief Empty the pool's prefix cache: every cached page is dropped, not
 *        written back to any tier, and one #KVP_EVENT_CLEARED event is sent
 *        (vLLM's reset of its prefix cache).
 *
 * For when cached KV must not be reused any more (new weights, a new
 * adapter) or to measure a cold start. Tiers keep their blobs: they are
 * named by a fingerprint that changes with the weights.
 *
 * @param[in] c The cache, with no live sequence.
 * @return #KVP_OK, #KVP_EINVAL, #KVP_ESTATE (sequences are live: their pages
 *         are in the prefix cache too; release them first).
 */
KVP_API int kvp_cache_clear_prefix(kvp_cache_t *c);

/**
 * @brief Blobs and bytes kvp_cache_seq_export() writes for a sequence.
 * @param[in]  c     The cache (with an identity).
 * @param[in]  seq   A resident sequence with at least one token.
 * @param[out] blobs Blobs: one per page, the partly filled last page included.
 * @param[out] bytes Their total size.
 * @return #KVP_OK, #KVP_EINVAL, #KVP_ENOENT, #KVP_ESTATE (no identity,
 *         swapped out).
 */
KVP_API int kvp_cache_seq_export_size(kvp_cache_t *c, int32_t seq, int32_t *blobs,
                                      uint64_t *bytes);

/**
 * @brief Export a sequence as consecutive blobs, for another cache to
 *        continue it (disaggregated serving: one process prefills, another
 *        decodes).
 *
 * `tokens` are the sequence's token ids (all of them): they name the pages
 * (chain hashes) and never enter a blob. The output is the blobs of its
 * pages in order, each self-describing; the last may be a partly filled
 * page (an fp16 staging page for int8/int4 keys).
 *
 * @param[in]  c         The cache.
 * @param[in]  seq       A resident sequence.
 * @param[in]  tokens    Its `n` token ids.
 * @param[in]  n         Its length.
 * @param[out] dst       kvp_cache_seq_export_size() bytes.
 * @param[in]  dst_bytes Size of `dst`.
 * @return #KVP_OK, #KVP_EINVAL (n is not the length, room too small),
 *         #KVP_ENOENT, #KVP_ESTATE, #KVP_ECUDA. O(sequence bytes).
 */
KVP_API int kvp_cache_seq_export(kvp_cache_t *c, int32_t seq, const int32_t *tokens, int64_t n,
                                 void *dst, uint64_t dst_bytes);

/**
 * @brief Import an exported sequence into an empty sequence of this cache.
 *
 * Pages this cache already holds in its prefix cache are attached, not
 * copied; every other blob is validated (the chain hashes are recomputed
 * from `tokens`, so blobs of other tokens, salt, model, layout, formats or
 * shard are refused) and written to a fresh page. All or nothing: on any
 * failure the sequence is left empty and the detail text names the blob
 * and the reason. Caches of another page size, layout or format refuse.
 *
 * @param[in]  c      The cache (with an identity).
 * @param[in]  seq    An empty resident sequence (its salt must be the
 *                    exporter's).
 * @param[in]  tokens The sequence's `n` token ids.
 * @param[in]  n      Its length, >= 1.
 * @param[in]  src    The exported bytes.
 * @param[in]  bytes  Their length.
 * @param[out] reason Optional: a #kvp_blob_reason when a blob was rejected.
 * @return #KVP_OK, #KVP_EINVAL, #KVP_ENOENT, #KVP_ESTATE, #KVP_EBADBLOB,
 *         #KVP_ENOSPC (too few free pages), #KVP_ECUDA.
 */
KVP_API int kvp_cache_seq_import(kvp_cache_t *c, int32_t seq, const int32_t *tokens, int64_t n,
                                 const void *src, uint64_t bytes, int32_t *reason);

/** @} */

#ifdef __cplusplus
}
#endif

#endif /* KVPAGE_BLOB_H */
