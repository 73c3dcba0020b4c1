/**
 * @file kvpage_ext.h
 * @brief libkvpage — finer control of the core objects.
 *
 * For engines that go beyond the decode loop of kvpage.h: pages the engine
 * holds itself (its own page table on a pool), prefix-cache priorities and
 * lookups, sequence inspection, pool events for prefix-aware routers, the
 * arena's addressing for kernels from elsewhere, fp8 calibration, reading
 * pages back, the CPU instruction sets, and what this build contains.
 *
 * Before 1.0 these functions may still change in a minor release
 * (CHANGELOG.md lists every change); kvpage.h carries the ABI promise.
 */
#ifndef KVPAGE_EXT_H
#define KVPAGE_EXT_H

#include "kvpage.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Library                                                                   */
/* ------------------------------------------------------------------------ */

/**
 * @brief Version string of the library actually loaded at run time.
 * @return A static string such as "0.2.0"; never NULL.
 */
KVP_API const char *kvp_version_string(void);

/**
 * @brief The symbolic name of a status code, e.g. "KVP_ENOSPC".
 * @param[in] status A value returned by a libkvpage function.
 * @return A static string; "KVP_UNKNOWN" for values not in the table.
 */
KVP_API const char *kvp_status_name(int status);

/** @brief Optional parts of the library a build may contain (kvp_build_has()). */
enum kvp_feature {
    KVP_FEATURE_CUDA = 1, /**< The CUDA backend (kvpage_cuda.h). */
    KVP_FEATURE_BLOB = 2, /**< Page blobs and chain hashes (kvpage_blob.h): built with
                               OpenSSL's libcrypto and libxxhash. */
    KVP_FEATURE_REDIS = 4 /**< The Redis/Valkey tier (kvp_redis_tier_create()): built
                               with hiredis. */
};

/**
 * @brief Whether this build of the library contains an optional feature.
 *
 * A feature that is not built still links: its functions return
 * #KVP_ENOTSUP.
 *
 * @param[in] feature A #kvp_feature.
 * @return 1 if built in, 0 if not or for an unknown value.
 */
KVP_API int kvp_build_has(int32_t feature);

/* ------------------------------------------------------------------------ */
/* Pool: pages the engine holds, eviction, events                            */
/* ------------------------------------------------------------------------ */

/**
 * @brief Allocate `n` pool pages, all or none, each with reference count 1.
 *
 * Free pages are taken first; when there are too few, cached pages are
 * evicted (lowest priority, then least recently used, leaves first).
 * Pages reserved for sequences (kvp_table_reserve()) are not taken.
 *
 * @param[in,out] pool  The pool.
 * @param[in]     n     Pages wanted, >= 1.
 * @param[out]    pages `n` page ids; untouched on error.
 * @return #KVP_OK; #KVP_EINVAL (NULL, n < 1); #KVP_ENOSPC if fewer than `n`
 *         pages are free or evictable (the pool is unchanged). O(n), plus
 *         O(log cached) per evicted page.
 */
KVP_API int kvp_pool_alloc(kvp_pool_t *pool, int32_t n, int32_t *pages);

/**
 * @brief Allocate `n` staging pages, all or none, reference count 1.
 *
 * Staging pages are what a #kvp_table_t gives each sequence in layouts with
 * staging; engines that keep their own page table can take them here.
 *
 * @param[in,out] pool  The pool.
 * @param[in]     n     Staging pages wanted, >= 1.
 * @param[out]    pages `n` staging page ids (>= num_pages); untouched on error.
 * @return #KVP_OK; #KVP_EINVAL (NULL, n < 1); #KVP_ENOSPC (too few free
 *         staging pages; nothing changed). O(n).
 */
KVP_API int kvp_pool_alloc_staging(kvp_pool_t *pool, int32_t n, int32_t *pages);

/**
 * @brief Add one reference to each of `n` used pages (pool or staging).
 *
 * The engine's references are counted apart from the ones a table's
 * sequences hold, and only they can be dropped with kvp_pool_release(), so
 * a stray release cannot take a page from under a sequence. A page listed
 * twice gets two references. A page the engine holds is never stored in the
 * prefix cache, and a page already stored cannot be retained: an outside
 * reference would keep its cached ancestors from ever being evicted.
 * Retaining the partly filled last page of a sequence makes that
 * sequence's next append copy it, a page its earlier kvp_table_reserve()
 * did not count.
 *
 * @param[in,out] pool  The pool.
 * @param[in]     n     Number of ids, >= 0.
 * @param[in]     pages Page ids.
 * @return #KVP_OK; #KVP_EINVAL (NULL, n < 0, an id out of range, a page that
 *         is not in use or is in the prefix cache, a count that would
 *         overflow); nothing changed on error. O(n).
 */
KVP_API int kvp_pool_retain(kvp_pool_t *pool, int32_t n, const int32_t *pages);

/**
 * @brief Drop one engine reference from each of `n` pages (pool or staging).
 *
 * Only references taken with kvp_pool_alloc(), kvp_pool_alloc_staging() or
 * kvp_pool_retain() can be dropped here; a table's sequences drop theirs
 * through the table. A pool page whose count reaches 0 goes to the free
 * list (pages the engine held were never stored in the prefix cache), a
 * staging page to the staging free list.
 *
 * @param[in,out] pool  The pool.
 * @param[in]     n     Number of ids, >= 0.
 * @param[in]     pages Page ids; a page may be listed as often as the engine
 *                      holds references to it.
 * @return #KVP_OK; #KVP_EINVAL (NULL, n < 0, an id out of range, more
 *         releases of a page than engine references, e.g. a double release);
 *         nothing changed on error. O(n).
 */
KVP_API int kvp_pool_release(kvp_pool_t *pool, int32_t n, const int32_t *pages);

/**
 * @brief Reference count of a page (pool or staging).
 * @param[in,out] pool     The pool (its last error is set on failure).
 * @param[in]     page     A page id.
 * @param[out]    refcount 0 for free and cached pages.
 * @return #KVP_OK or #KVP_EINVAL (NULL, id out of range). O(1).
 */
KVP_API int kvp_pool_refcount(kvp_pool_t *pool, int32_t page, int32_t *refcount);

/**
 * @brief Evict up to `max_pages` cached pages now, in eviction order.
 *
 * Allocation evicts on demand; call this to drop the prefix cache (e.g.
 * after changing model weights) or to free memory ahead of time.
 *
 * @param[in,out] pool      The pool.
 * @param[in]     max_pages Most pages to evict, >= 0 (INT32_MAX: all).
 * @param[out]    evicted   Optional: pages evicted.
 * @return #KVP_OK or #KVP_EINVAL (NULL pool, max_pages < 0).
 *         O(evicted x log cached).
 */
KVP_API int kvp_pool_evict(kvp_pool_t *pool, int32_t max_pages, int32_t *evicted);

/** @brief Event kinds (#kvp_pool_event_t::kind). */
enum kvp_pool_event_kind {
    /** A full page was stored in the prefix cache (`hash`, `parent` set). */
    KVP_EVENT_PAGE_STORED = 0,
    /** A page left the prefix cache: evicted for memory or by
     *  kvp_pool_evict(), or reopened by a truncation. */
    KVP_EVENT_PAGE_EVICTED = 1,
    /** A pool page went back to the free list. */
    KVP_EVENT_PAGE_FREED = 2
};

/** @brief One pool event, passed to a #kvp_pool_event_fn. */
typedef struct kvp_pool_event {
    uint32_t struct_size; /**< sizeof(kvp_pool_event_t) of the library; read fields up to it. */
    int32_t kind;         /**< A #kvp_pool_event_kind. */
    int32_t page;         /**< The pool page. */
    int32_t parent;       /**< STORED/EVICTED: the cached page it extends, or -1 for a
                               prompt's first page; FREED: -1. */
    int32_t priority;     /**< The page's eviction priority. */
    int32_t reserved_;    /**< Padding; 0. */
    uint64_t hash;        /**< STORED/EVICTED: the page's chained 64-bit hash; FREED: 0. */
} kvp_pool_event_t;

/**
 * @brief Event callback: called synchronously from inside pool and table
 *        calls. It must not call back into the pool or its tables.
 * @param[in] opaque The pointer given to kvp_pool_set_event_callback().
 * @param[in] event  The event; valid during the call only.
 */
typedef void (*kvp_pool_event_fn)(void *opaque, const kvp_pool_event_t *event);

/**
 * @brief Set (or clear, with NULL) the pool's event callback.
 * @param[in,out] pool   The pool.
 * @param[in]     fn     Callback, or NULL for none.
 * @param[in]     opaque Passed to `fn`.
 * @return #KVP_OK or #KVP_EINVAL (NULL pool). O(1).
 */
KVP_API int kvp_pool_set_event_callback(kvp_pool_t *pool, kvp_pool_event_fn fn,
                                        void *opaque);

/* ------------------------------------------------------------------------ */
/* Table: inspection, prefix lookups, priorities                             */
/* ------------------------------------------------------------------------ */

/** @brief What kvp_table_seq_info() reports about a sequence. */
typedef struct kvp_seq_info {
    uint32_t struct_size;   /**< Set by the caller to sizeof(kvp_seq_info_t). */
    int32_t num_pages;      /**< Entries it has in an exported `indices` (incl. a staging page). */
    int64_t length;         /**< Tokens. */
    int32_t last_page_len;  /**< Tokens in its last page, 1 .. page_size; 0 when empty. */
    int32_t staging_page;   /**< Its staging page id, or -1 without staging. */
    int64_t reserved_tokens;/**< Room guaranteed by kvp_table_reserve() beyond the length. */
    int32_t reserved_pages; /**< Pages set aside for that room. */
    int32_t priority;       /**< Its priority. */
    uint64_t salt;          /**< Its prefix-cache salt. */
    int32_t swapped;        /**< 1 while swapped out to a host tier (#kvp_tier_t): it then
                                 holds only the pages it shares, no staging page, and
                                 refuses appends, reservations, forks and exports. */
    int32_t reserved_;      /**< Padding; 0. */
} kvp_seq_info_t;

/**
 * @brief Describe a sequence.
 * @param[in,out] table The table.
 * @param[in]     seq   A live sequence.
 * @param[out]    info  Result; `info->struct_size` must be set.
 * @return #KVP_OK, #KVP_EINVAL or #KVP_ENOENT. O(1).
 */
KVP_API int kvp_table_seq_info(kvp_table_t *table, int32_t seq, kvp_seq_info_t *info);

/**
 * @brief Copy a sequence's page ids, in token order, as the batch export
 *        lists them (a partly filled staging page last).
 * @param[in,out] table    The table.
 * @param[in]     seq      A live sequence.
 * @param[out]    pages    `capacity` entries.
 * @param[in]     capacity At least kvp_seq_info_t::num_pages.
 * @return #KVP_OK, #KVP_EINVAL (NULL, capacity too small), #KVP_ENOENT or
 *         #KVP_ESTATE (swapped out to a host tier). O(pages).
 */
KVP_API int kvp_table_seq_pages(kvp_table_t *table, int32_t seq, int32_t *pages,
                                int32_t capacity);

/**
 * @brief How many leading tokens of a prompt the prefix cache holds, without
 *        attaching anything or counting stats.
 *
 * @param[in,out] table   The table (its last error is set on failure).
 * @param[in]     salt    The prefix-cache namespace (see kvp_table_seq_create()).
 * @param[in]     tokens  Token ids (may be NULL if n is 0).
 * @param[in]     n       Prompt length, >= 0.
 * @param[out]    matched Cached tokens, a multiple of the page size.
 * @return #KVP_OK or #KVP_EINVAL. O(n).
 */
KVP_API int kvp_table_lookup_prefix(kvp_table_t *table, uint64_t salt,
                                    const int32_t *tokens, int64_t n,
                                    int64_t *matched);

/**
 * @brief Set a sequence's priority: the eviction priority of the pages it
 *        fills from now on.
 *
 * A page's priority decides, once it is only cached, when it is evicted:
 * lower priorities first, least recently used first among equals. A page
 * takes the priority of the sequence that fills it; attaching a cached page
 * raises it to the attaching sequence's priority, never lowers it. Pages the
 * sequence already holds are raised to `priority` too (to lower them, use
 * kvp_table_set_range_priority()).
 *
 * @param[in,out] table    The table.
 * @param[in]     seq      A live sequence.
 * @param[in]     priority Any int32; higher is kept longer.
 * @return #KVP_OK, #KVP_EINVAL or #KVP_ENOENT. O(pages of the sequence).
 */
KVP_API int kvp_table_set_priority(kvp_table_t *table, int32_t seq, int32_t priority);

/**
 * @brief Set the priority of the sequence's full pages that lie entirely
 *        within tokens `[begin, end)`, raising or lowering it; e.g. pin a
 *        system prompt with a high value.
 *
 * Pages shared with other sequences get the new value too. Staging pages and
 * partly filled pages are never cached, so they are skipped.
 *
 * @param[in,out] table    The table.
 * @param[in]     seq      A live sequence.
 * @param[in]     begin    First token, >= 0.
 * @param[in]     end      One past the last token, begin .. length.
 * @param[in]     priority Any int32.
 * @return #KVP_OK, #KVP_EINVAL (bad range), #KVP_ENOENT or #KVP_ESTATE
 *         (swapped out to a host tier). O(pages in range).
 */
KVP_API int kvp_table_set_range_priority(kvp_table_t *table, int32_t seq,
                                         int64_t begin, int64_t end,
                                         int32_t priority);

/* ------------------------------------------------------------------------ */
/* Store: layout, addressing, fp8 scales, inspection                         */
/* ------------------------------------------------------------------------ */

/** @brief What kvp_store_info() reports about a store. */
typedef struct kvp_store_info {
    uint32_t struct_size; /**< Set by the caller to sizeof(kvp_store_info_t). */
    int32_t backend;      /**< A #kvp_backend. */
    int32_t device;       /**< CUDA device ordinal; -1 for the CPU. */
    int32_t k_order;      /**< #kvp_k_order of plain-format and staging keys. */
    int32_t num_pages;    /**< Pool pages (ids 0 .. num_pages-1). */
    int32_t num_staging;  /**< Staging pages (ids num_pages .. num_pages+num_staging-1). */
    void *arena;          /**< The arena's first byte (aligned to #KVP_ARENA_ALIGN); a device
                               address on a CUDA store. */
    uint64_t arena_bytes; /**< Its size: exactly kvp_arena_bytes() of the store's layout. */
} kvp_store_info_t;

/**
 * @brief Describe a store: backend, page counts, the arena's address and size
 *        (e.g. to register it for RDMA, or to hand it to kernels from
 *        elsewhere with kvp_store_region()).
 * @param[in]  store The store.
 * @param[out] info  Result; `info->struct_size` must be set.
 * @return #KVP_OK or #KVP_EINVAL (NULL, struct_size too small). O(1).
 */
KVP_API int kvp_store_info(const kvp_store_t *store, kvp_store_info_t *info);

/**
 * @brief The store's page layout (the byte counts kvp_layout_compute() gives).
 * @param[in]  store The store.
 * @param[out] out   Result; `out->struct_size` must be set.
 * @return #KVP_OK or #KVP_EINVAL (NULL, bad struct_size).
 */
KVP_API int kvp_store_layout(const kvp_store_t *store, kvp_layout_t *out);

/** @brief Which blocks a #kvp_region_t describes (kvp_store_region()). */
enum kvp_region_kind {
    KVP_REGION_K = 0,         /**< Key blocks of the pool pages. */
    KVP_REGION_V = 1,         /**< Value blocks of the pool pages. */
    KVP_REGION_STAGING_K = 2, /**< fp16 key blocks of the staging pages. */
    KVP_REGION_STAGING_V = 3  /**< fp16 value blocks of the staging pages. */
};

/**
 * @brief Where the blocks of one layer live, so kernels from elsewhere can
 *        address the arena.
 *
 * The block of page `p` and kv head `h` starts at
 * `base + (p - first_page) * page_stride + h * head_stride`. For plain
 * formats (fp32, fp16, bf16, fp8_e4m3) element `(token t, channel d)` of a
 * block is at `t * token_stride + d * dim_stride` bytes; with token-major
 * keys and values this is FlashInfer's HND layout
 * (`[page][kv_head][token][head_dim]`). Quantized blocks (int8, int4) have
 * token_stride = dim_stride = 0: their bytes are in docs/formats.md. With
 * #KVP_FORMAT_INT4 values, the value blocks (and the fp16 staging value
 * blocks) hold each token's values in a rotated basis (docs/formats.md,
 * "int4 values"). On a CUDA store `base` is a device address.
 */
typedef struct kvp_region {
    uint32_t struct_size;  /**< Set by the caller to sizeof(kvp_region_t). */
    int32_t format;        /**< #kvp_format of the blocks. */
    int32_t order;         /**< #kvp_k_order (values: always token-major). */
    int32_t first_page;    /**< Page id of the first block: 0, or num_pages for staging. */
    void *base;            /**< Block of `first_page`, kv head 0; NULL if the region is empty. */
    uint64_t pages;        /**< Pages in the region. */
    uint64_t page_stride;  /**< Bytes from one page's block to the next page's. */
    uint64_t head_stride;  /**< Bytes from one kv head's block to the next (= block_bytes). */
    uint64_t block_bytes;  /**< Bytes of one block, scale data and padding included. */
    uint64_t scale_offset; /**< Offset of the scale data inside a block (= element bytes). */
    uint64_t token_stride; /**< Plain formats: bytes between tokens; else 0. */
    uint64_t dim_stride;   /**< Plain formats: bytes between channels; else 0. */
} kvp_region_t;

/**
 * @brief Describe the blocks of one layer's K, V or staging region.
 * @param[in]  store The store.
 * @param[in]  layer 0 .. layers-1.
 * @param[in]  kind  A #kvp_region_kind.
 * @param[out] out   Result; `out->struct_size` must be set.
 * @return #KVP_OK or #KVP_EINVAL (NULL, layer or kind out of range, bad
 *         struct_size). O(1).
 */
KVP_API int kvp_store_region(const kvp_store_t *store, int32_t layer, int32_t kind,
                             kvp_region_t *out);

/**
 * @brief Set the fp8 scale of one (layer, kv head) for keys or values.
 *
 * fp8_e4m3 elements store `x / scale`. A scale of 0 (the initial value)
 * means "calibrate from the first rows appended to this layer":
 * `scale = max|x| * 8 / 448` over those rows' finite values for that head
 * (the factor 8 leaves headroom for later, larger rows; e4m3 keeps its
 * relative precision over that range). Set scales before
 * appending; changing one later does not re-encode stored tokens.
 *
 * @param[in] store    The store.
 * @param[in] layer    0 .. layers-1.
 * @param[in] kv_head  0 .. kv_heads-1.
 * @param[in] is_value 0 for keys, 1 for values.
 * @param[in] scale    A finite scale > 0, or 0 to calibrate again.
 * @return #KVP_OK; #KVP_EINVAL for bad arguments, or when that side's
 *         format is not fp8_e4m3; #KVP_ECUDA for a CUDA failure (CUDA
 *         store: the scale is copied on the store's stream).
 */
KVP_API int kvp_store_set_fp8_scale(kvp_store_t *store, int32_t layer, int32_t kv_head,
                                    int32_t is_value, float scale);

/**
 * @brief Read the fp8 scale of one (layer, kv head) for keys or values.
 * @param[in]  store    The store.
 * @param[in]  layer    0 .. layers-1.
 * @param[in]  kv_head  0 .. kv_heads-1.
 * @param[in]  is_value 0 for keys, 1 for values.
 * @param[out] scale    The scale; 0 while not calibrated yet.
 * @return #KVP_OK or #KVP_EINVAL (bad arguments, side not fp8_e4m3);
 *         #KVP_ECUDA for a CUDA failure (CUDA store: waits for its stream).
 */
KVP_API int kvp_store_get_fp8_scale(const kvp_store_t *store, int32_t layer,
                                    int32_t kv_head, int32_t is_value, float *scale);

/**
 * @brief Dequantize tokens of one page to fp32, for inspection and tests.
 *
 * #KVP_FORMAT_INT4 values (pool pages, and the fp16 staging pages that
 * hold them in their rotated basis) come back from that basis.
 * @param[in]  store   The store.
 * @param[in]  layer   0 .. layers-1.
 * @param[in]  page    A pool page id, or a staging id (>= num_pages).
 * @param[in]  token0  First token, 0 .. page_size-1.
 * @param[in]  count   Tokens, token0 + count <= page_size.
 * @param[out] k       `[count][kv_heads][head_dim]` keys, or NULL.
 * @param[out] v       `[count][kv_heads][head_dim]` values, or NULL.
 * @return #KVP_OK or #KVP_EINVAL (bad ids, range or pointers); #KVP_ECUDA
 *         for a CUDA failure. Not a hot path: on a CUDA store `k` and `v` are
 *         host memory and the call waits for the store's stream.
 */
KVP_API int kvp_store_read(const kvp_store_t *store, int32_t layer, int32_t page,
                           int32_t token0, int32_t count, float *k, float *v);

/**
 * @brief Non-finite inputs (NaN, +-Inf) the store has been given so far by
 *        appends and seals. They are stored by the format's rules, never
 *        spread to other elements' scales (docs/formats.md).
 *
 * On a CUDA store the count lives on the device: this waits for the store's
 * stream.
 *
 * @param[in,out] store The store (its last error on failure).
 * @param[out]    count The count since creation.
 * @return #KVP_OK; #KVP_EINVAL (NULL); #KVP_ECUDA when reading it from the
 *         device fails.
 */
KVP_API int kvp_store_nonfinite_count(kvp_store_t *store, uint64_t *count);

/**
 * @brief Wait until the store's pending work (appends, operations, page
 *        copies) is done.
 *
 * CPU store: nothing is ever pending; returns #KVP_OK at once. CUDA store:
 * synchronizes the store's stream.
 *
 * @param[in,out] store The store.
 * @return #KVP_OK; #KVP_EINVAL for NULL; #KVP_ECUDA when the stream reports
 *         an error (e.g. a kernel fault: the detail names it).
 */
KVP_API int kvp_store_synchronize(kvp_store_t *store);

/* ------------------------------------------------------------------------ */
/* Context: backend and CPU instruction sets                                 */
/* ------------------------------------------------------------------------ */

/** @brief What kvp_ctx_info() reports about a context. */
typedef struct kvp_ctx_info {
    uint32_t struct_size;     /**< Set by the caller to sizeof(kvp_ctx_info_t). */
    int32_t backend;          /**< A #kvp_backend. */
    int32_t device;           /**< CUDA device ordinal; -1 for the CPU. */
    int32_t isa;              /**< CPU: the #kvp_isa the kernels use (never #KVP_ISA_AUTO);
                                   CUDA: -1. */
    int32_t threads;          /**< CPU: threads that run kernels, caller included; CUDA: 1. */
    int32_t reserved_;        /**< Padding; 0. */
    uint64_t workspace_bytes; /**< Split-KV workspace (host or device memory). */
} kvp_ctx_info_t;

/**
 * @brief Describe a context: backend, instruction set, threads, workspace.
 * @param[in]  ctx  The context.
 * @param[out] info Result; `info->struct_size` must be set.
 * @return #KVP_OK or #KVP_EINVAL (NULL, struct_size too small). O(1).
 */
KVP_API int kvp_ctx_info(const kvp_ctx_t *ctx, kvp_ctx_info_t *info);

/**
 * @brief Name of an instruction set ("auto", "portable", "avx2", "avx512",
 *        "avx512-bf16").
 * @param[in] isa A #kvp_isa.
 * @return A static string, or NULL for an unknown value.
 */
KVP_API const char *kvp_isa_name(int32_t isa);

/**
 * @brief Whether this CPU can run an instruction set.
 * @param[in] isa A #kvp_isa.
 * @return 1 if supported (always for auto and portable), else 0.
 */
KVP_API int kvp_isa_supported(int32_t isa);

#ifdef __cplusplus
}
#endif

#endif /* KVPAGE_EXT_H */
