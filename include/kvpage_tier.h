/**
 * @file kvpage_tier.h
 * @brief libkvpage — the host tier: swap sequences out to host memory and
 *        back, bit for bit; and page I/O, the store's way of moving a page's
 *        bytes in and out.
 *
 * Before 1.0 these functions may still change in a minor release
 * (CHANGELOG.md lists every change); kvpage.h carries the ABI promise.
 */
#ifndef KVPAGE_TIER_H
#define KVPAGE_TIER_H

#include "kvpage.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Page I/O: a page's bytes in and out of a store                            */
/* ------------------------------------------------------------------------ */

/**
 * @brief How the host tier moves a page's bytes: the only way it touches
 *        tensor memory.
 *
 * A page's bytes are the storage's own serialization of it: `page_bytes`
 * bytes for a pool page, `staging_page_bytes` for a staging page
 * (#kvp_layout_t), in whatever order the storage likes, as long as
 * `copy_from_host` of what `copy_to_host` wrote restores the page bit for
 * bit. A pool page moves in one call (`offset` 0, `bytes` = page_bytes). A
 * staging page larger than a host slot moves in chunks of
 * #kvp_tier_stats_t::slot_bytes (`offset` = chunk x slot_bytes), each in its
 * own slot, so host memory never fragments.
 *
 * The CPU store implements both with memcpy of the page's blocks across
 * layers; a CUDA store may enqueue cudaMemcpyAsync on one stream into
 * pinned host memory (give the tier a pinned #kvp_tier_params_t::host_allocator)
 * and return at once, provided that every later kernel and copy on the
 * device is ordered after it on that stream.
 *
 * Both functions return #KVP_OK or a negative status (e.g. #KVP_ECUDA); on
 * failure the tier undoes the swap and returns that status.
 */
typedef struct kvp_page_io {
    uint32_t struct_size; /**< Set by the caller to sizeof(kvp_page_io_t). */
    int32_t reserved_;    /**< Padding; 0. */
    /** Copy bytes `[offset, offset + bytes)` of device page `page` (a pool or
     *  staging id) to host memory `dst`. */
    int (*copy_to_host)(void *opaque, int32_t page, uint64_t offset, void *dst, uint64_t bytes);
    /** Copy `bytes` bytes from host memory `src` into bytes `[offset, offset +
     *  bytes)` of device page `page`. */
    int (*copy_from_host)(void *opaque, int32_t page, uint64_t offset, const void *src,
                          uint64_t bytes);
    void *opaque; /**< Passed unchanged to both functions. */
} kvp_page_io_t;

/**
 * @brief Copy bytes of one page's serialization into host memory (the host
 *        tier's swap-out).
 *
 * A page's serialization is its blocks of every layer, K then V:
 * `[layer][K blocks of the kv heads][V blocks of the kv heads]`,
 * kvp_layout_t::page_bytes bytes for a pool page and
 * kvp_layout_t::staging_page_bytes for a staging page; scales and padding
 * included, so kvp_store_page_from_host() of these bytes restores the page
 * bit for bit. Any byte range of it can be copied (`offset`, `bytes`), e.g. a
 * staging page in host-slot-sized chunks.
 *
 * CPU store: memcpy, done when the call returns. CUDA store: cudaMemcpyAsync
 * on the store's stream (`dst` should be pinned memory, kvp_cuda_host_alloc(),
 * for an asynchronous copy): `dst` is complete after kvp_store_synchronize()
 * or anything else that waits for the stream, and every later kernel or copy
 * on the stream is ordered after it.
 *
 * @param[in,out] store  The store (its error text on failure).
 * @param[in]     page   A pool page id, or a staging id (>= num_pages).
 * @param[in]     offset First byte of the serialization to copy.
 * @param[out]    dst    Host memory for `bytes` bytes.
 * @param[in]     bytes  Bytes to copy; offset + bytes <= the page's size.
 * @return #KVP_OK; #KVP_EINVAL for a bad page id, range or NULL `dst`;
 *         #KVP_ECUDA when the CUDA runtime fails (detail in the store's
 *         last error). Cost: `bytes` bytes over memory or the host link;
 *         two copy calls per page on CUDA, one per (layer, side) for a
 *         partial range.
 */
KVP_API int kvp_store_page_to_host(kvp_store_t *store, int32_t page, uint64_t offset, void *dst,
                                   uint64_t bytes);

/**
 * @brief Copy host bytes into one page's serialization (the host tier's
 *        swap-in): the inverse of kvp_store_page_to_host().
 *
 * CUDA store: cudaMemcpyAsync on the store's stream; `src` must stay
 * unchanged until the stream has passed the copy (kvp_store_synchronize()).
 * The bytes are copied as they are: bytes that did not come from
 * kvp_store_page_to_host() of a store with the same layout are read safely
 * but mean nothing; kvp_store_page_check() tells well-formed ones apart.
 *
 * @param[in,out] store  The store.
 * @param[in]     page   A pool page id, or a staging id (>= num_pages).
 * @param[in]     offset First byte of the serialization to write.
 * @param[in]     src    Host memory holding `bytes` bytes.
 * @param[in]     bytes  Bytes to copy; offset + bytes <= the page's size.
 * @return #KVP_OK; #KVP_EINVAL for a bad page id, range or NULL `src`;
 *         #KVP_ECUDA when the CUDA runtime fails.
 */
KVP_API int kvp_store_page_from_host(kvp_store_t *store, int32_t page, uint64_t offset,
                                     const void *src, uint64_t bytes);

/**
 * @brief Check that bytes are a well-formed serialization of one page of this
 *        store: the invariants every encoder of its formats keeps.
 *
 * For pages whose bytes come from outside the process (a file, another
 * machine, a store shared between tenants), before
 * kvp_store_page_from_host() and after the transport's own integrity
 * check. Checked, in every block: int8/int4 scales are finite and not
 * negative, minimums are finite, and an int4 key block's outlier channels
 * increase and lie below head_dim. Plain-format elements (fp32, fp16, bf16,
 * fp8) and staging pages may hold any bits (non-finite inputs are stored as
 * such), and padding is not read. Passing says the bytes are well formed,
 * not that they are the KV the engine wants: fingerprints and chain hashes
 * say that. The kernels stay memory-safe without this check (kvpage.h,
 * conventions, "Page bytes"); with it, what they read means something.
 *
 * @param[in] store The store (its layout and formats).
 * @param[in] page  A pool page id (the store's formats) or a staging id
 *                  (fp16): which serialization the bytes are.
 * @param[in] src   Host memory holding the whole serialization.
 * @param[in] bytes Its length: page_bytes, or staging_page_bytes for a
 *                  staging id (#kvp_layout_t).
 * @return #KVP_OK; #KVP_EINVAL for a bad page id, another length, NULL `src`,
 *         or bytes that break an invariant (the store's last error names the
 *         layer, side, kv head and what). Cost: reads the scale data only,
 *         O(layers x kv_heads x (head_dim + page_size)); never allocates.
 */
KVP_API int kvp_store_page_check(const kvp_store_t *store, int32_t page, const void *src,
                                 uint64_t bytes);

/**
 * @brief The store's page I/O for a host tier (#kvp_page_io_t).
 *
 * A page's bytes are serialized as, for each layer, the page's K blocks of
 * every kv head followed by its V blocks (`page_bytes` for a pool page,
 * `staging_page_bytes` for a staging page): the functions are
 * kvp_store_page_to_host() and kvp_store_page_from_host() (see them for the
 * CUDA store's stream). The store must outlive the tier that uses them.
 *
 * @param[in,out] store The store (the functions' `opaque`).
 * @param[out]    io    Filled in (`io->struct_size` must be set).
 * @return #KVP_OK or #KVP_EINVAL.
 */
KVP_API int kvp_store_page_io(kvp_store_t *store, kvp_page_io_t *io);

/* ------------------------------------------------------------------------ */
/* Host tier                                                                 */
/* ------------------------------------------------------------------------ */

/**
 * @defgroup tier Host tier
 * @brief A host tier (#kvp_tier_t): sequences of one page table swapped out
 *        to host memory.
 *
 * The tier owns a host memory area of its own byte budget, cut into slots of
 * `slot_bytes` (a pool page, rounded up to #KVP_ARENA_ALIGN). **Swapping out**
 * a sequence copies its private pages (reference count 1: no other sequence
 * and no engine reference holds them) to host slots and gives the device
 * pages back to the pool; the sequence keeps its id, its length and its page
 * list, with the moved entries empty. Pages it shares stay on the device,
 * held by reference, so they are never copied twice nor freed under another
 * user. In layouts with staging, its staging page moves too (in
 * `staging_chunks` slots, or none when it holds no token) and is given back,
 * so a swapped-out sequence holds no staging page. **Swapping in** takes
 * pages (and a staging page) from the pool, copies the data back bit for bit
 * and fills the page list again; page ids may differ, everything else
 * (length, token ids, priority, salt) is as before. **Dropping** frees
 * everything; the engine recomputes the sequence if it wants it back.
 *
 * A private page that is also stored in the prefix cache is copied like any
 * other and its reference dropped, so it becomes an evictable cached page
 * that other prompts may still use. If it is still cached, unchanged, when
 * the sequence swaps in, it is attached again instead of copied back.
 *
 * Data moves through #kvp_page_io_t when the tier has one; otherwise each
 * swap returns #KVP_OP_SWAP_OUT / #KVP_OP_SWAP_IN operations for engines that
 * keep their own storage (host slot `s` is at `base + s x slot_bytes`,
 * kvp_tier_host_memory()).
 *
 * A swapped-out sequence refuses kvp_table_append(), kvp_table_reserve(),
 * kvp_table_fork(), kvp_table_truncate(), kvp_table_attach_prefix(),
 * kvp_table_seq_pages(), kvp_table_export() and kvp_table_seq_release()
 * with #KVP_ESTATE until it is swapped in (or dropped with kvp_tier_drop()).
 *
 * Every call is all-or-nothing: a swap that fails (#KVP_EHOSTFULL,
 * #KVP_ENOSPC, #KVP_ENOMEM, a page I/O error) leaves the sequence, the table
 * and the pool as they were.
 *
 * **Threads.** A tier belongs to its table and pool: serialise all calls on
 * the three. One tier per table. Destroy the tier before the table.
 *
 * (#kvp_tier_t is declared in kvpage.h.)
 */

/** @brief Parameters of kvp_tier_create(). Fill with kvp_tier_params_init(). */
typedef struct kvp_tier_params {
    uint32_t struct_size;     /**< sizeof(kvp_tier_params_t); set by init. */
    int32_t reserved_;        /**< Must be 0 (checked). */
    uint64_t host_bytes;      /**< Byte budget (required): the tier holds
                                   floor(host_bytes / slot_bytes) slots and allocates exactly
                                   that many slots' bytes, once. */
    const kvp_layout_t *layout; /**< The pages' byte counts (required): the store's
                                     (kvp_store_layout()) or kvp_layout_compute()'s. Its page size must be the pool's, and it needs
                                     staging exactly when the pool has staging pages. Copied. */
    const kvp_page_io_t *page_io; /**< How to move page bytes; NULL: swaps return operations
                                       instead. Copied. */
    kvp_allocator_t allocator;      /**< Metadata allocator; zeroed hooks = libc. */
    kvp_allocator_t host_allocator; /**< Allocator of the host memory (e.g. pinned memory for
                                         CUDA); zeroed hooks = `allocator`. */
} kvp_tier_params_t;

/**
 * @brief Fill `p` with defaults (no page I/O, libc allocators) and set its
 *        struct_size; host_bytes and layout must be set.
 * @param[out] p Parameters to initialise; NULL is ignored.
 */
KVP_API void kvp_tier_params_init(kvp_tier_params_t *p);

/**
 * @brief Create a host tier for the sequences of `table`.
 *
 * @param[in,out] table    The page table (it must outlive the tier).
 * @param[in]     params   Budget, layout, page I/O, allocators.
 * @param[out]    tier     The new tier; untouched on error.
 * @param[out]    err      Optional error-detail buffer.
 * @param[in]     err_size Its size.
 * @return #KVP_OK; #KVP_EINVAL (NULL, bad struct_size, a layout that does not
 *         match kvp_layout_compute() or the pool, a budget below one slot or
 *         above 2^31-1 slots, page I/O with a NULL function); #KVP_ESTATE (the
 *         table already has a tier); #KVP_ENOMEM. O(slots + table slots).
 */
KVP_API int kvp_tier_create(kvp_table_t *table, const kvp_tier_params_t *params,
                            kvp_tier_t **tier, char *err, size_t err_size);

/**
 * @brief Destroy a tier: every sequence still swapped out is dropped (its id
 *        becomes invalid, its shared pages are released), then the host
 *        memory is freed. NULL is a no-op.
 * @param[in] tier The tier.
 */
KVP_API void kvp_tier_destroy(kvp_tier_t *tier);

/**
 * @brief Detail of the most recent failed call on this tier.
 * @param[in] tier The tier.
 * @return A NUL-terminated sentence, "" if no call has failed, or a static
 *         message for NULL. Valid until the next call on the tier.
 */
KVP_API const char *kvp_tier_last_error(const kvp_tier_t *tier);

/**
 * @brief Swap a resident sequence out to the host tier.
 *
 * Copies its private pages (and its staging page, if it holds tokens) to
 * host slots, gives those device pages back to the pool, keeps shared pages
 * by reference, and drops its reservation. With page I/O the copies are made
 * here and no operation is returned (`ops` may be NULL); without, one
 * #KVP_OP_SWAP_OUT per pool page and per staging chunk is returned, in page
 * order, to execute before any later call allocates pages.
 *
 * @param[in,out] tier         The tier.
 * @param[in]     seq          A live, resident sequence of the tier's table.
 * @param[out]    ops          Room for the operations (#kvp_tier_seq_info_t::ops), or NULL
 *                             with page I/O.
 * @param[in]     ops_capacity Size of `ops`.
 * @param[out]    num_ops      Operations written (required).
 * @return #KVP_OK; #KVP_EINVAL (NULL, `ops_capacity` too small: the detail
 *         says how many are needed); #KVP_ENOENT (not a live sequence);
 *         #KVP_ESTATE (already swapped out); #KVP_EHOSTFULL (too few free
 *         slots: nothing changed, the sequence stays on the device);
 *         #KVP_ENOMEM; a page I/O status. Nothing changed on error.
 *         O(pages of the sequence) plus the copies.
 */
KVP_API int kvp_tier_swap_out(kvp_tier_t *tier, int32_t seq, kvp_page_op_t *ops,
                              int32_t ops_capacity, int32_t *num_ops);

/**
 * @brief Swap a sequence back in from the host tier.
 *
 * Takes a staging page (in layouts with staging) and one pool page per
 * page on the host from the pool, all or none: a page still cached and
 * unchanged since the swap-out is attached again, the others are fresh
 * pages the data is copied into (with page I/O, here; without, as one
 * #KVP_OP_SWAP_IN per page and per staging chunk, to execute before kernels
 * read them). Its host slots are free again when the call returns.
 *
 * @param[in,out] tier         The tier.
 * @param[in]     seq          A sequence swapped out by this tier.
 * @param[out]    ops          Room for the operations (#kvp_tier_seq_info_t::ops), or NULL
 *                             with page I/O.
 * @param[in]     ops_capacity Size of `ops`.
 * @param[out]    num_ops      Operations written (required).
 * @return #KVP_OK; #KVP_EINVAL (NULL, `ops_capacity` too small);
 *         #KVP_ENOENT; #KVP_ESTATE (the sequence is resident); #KVP_ENOSPC
 *         (too few available pages, or no free staging page; nothing
 *         changed); a page I/O status (the sequence stays swapped out; cached
 *         pages evicted to make room stay evicted). O(pages) plus the copies.
 */
KVP_API int kvp_tier_swap_in(kvp_tier_t *tier, int32_t seq, kvp_page_op_t *ops,
                             int32_t ops_capacity, int32_t *num_ops);

/**
 * @brief Drop a sequence, resident or swapped out: free its host slots and
 *        release it from the table (its id becomes invalid). The engine
 *        recomputes it if it wants it back.
 * @param[in,out] tier The tier.
 * @param[in]     seq  A live sequence of the tier's table.
 * @return #KVP_OK, #KVP_EINVAL (NULL) or #KVP_ENOENT. O(pages).
 */
KVP_API int kvp_tier_drop(kvp_tier_t *tier, int32_t seq);

/** @brief What a swap of one sequence moves (kvp_tier_seq_info()). */
typedef struct kvp_tier_seq_info {
    uint32_t struct_size;  /**< Set by the caller to sizeof(kvp_tier_seq_info_t). */
    int32_t swapped;       /**< 1 if the sequence is in the host tier, 0 if resident. */
    int32_t private_pages; /**< Resident: pool pages a swap-out copies. Swapped: pool
                                pages on the host (each takes a pool page at swap-in). */
    int32_t shared_pages;  /**< Pool pages shared with other sequences or the engine, kept on
                                the device by reference. */
    int32_t host_slots;    /**< Resident: slots a swap-out takes. Swapped: slots it holds. */
    int32_t ops;           /**< Operations the next swap (out or in) returns without page I/O,
                                as of now. */
    int32_t staging;       /**< 1 if a swap moves a staging page with tokens. */
    int32_t reserved_;     /**< Padding; 0. */
    uint64_t host_bytes;   /**< host_slots x slot_bytes. */
    uint64_t copy_bytes;   /**< Bytes the next swap copies, as of now. */
} kvp_tier_seq_info_t;

/**
 * @brief Describe what swapping a sequence out (or in) moves.
 * @param[in,out] tier The tier (its last error is set on failure).
 * @param[in]     seq  A live sequence of the tier's table.
 * @param[out]    info Result; `info->struct_size` must be set.
 * @return #KVP_OK, #KVP_EINVAL or #KVP_ENOENT. O(pages).
 */
KVP_API int kvp_tier_seq_info(kvp_tier_t *tier, int32_t seq, kvp_tier_seq_info_t *info);

/** @brief Sizes and counters of a host tier (kvp_tier_stats()). */
typedef struct kvp_tier_stats {
    uint32_t struct_size;    /**< Set by the caller to sizeof(kvp_tier_stats_t). */
    int32_t staging_chunks;  /**< Slots a staging page takes (0 without staging). */
    uint64_t slot_bytes;     /**< Bytes of a host slot: page_bytes rounded up to
                                  #KVP_ARENA_ALIGN. Give it to the scheduler as
                                  kvp_sched_params_t::page_bytes. */
    uint64_t staging_bytes;  /**< staging_chunks x slot_bytes: host bytes of a staging page
                                  (kvp_sched_params_t::staging_page_bytes). */
    uint64_t host_bytes;     /**< total_slots x slot_bytes: the host memory allocated. */
    int64_t total_slots;     /**< Slots. */
    int64_t free_slots;      /**< Slots free now. */
    uint64_t free_bytes;     /**< free_slots x slot_bytes (kvp_sched_input_t::host_free_bytes). */
    int64_t swapped_seqs;    /**< Sequences in the tier now. */
    int64_t swapped_tokens;  /**< Their tokens. */
    uint64_t swap_outs;      /**< Successful swap-outs since creation. */
    uint64_t swap_ins;       /**< Successful swap-ins. */
    uint64_t drops;          /**< Sequences dropped (resident or swapped). */
    uint64_t pages_out;      /**< Pages copied to the host (pool pages and staging pages). */
    uint64_t pages_in;       /**< Pages copied back. */
    uint64_t pages_kept;     /**< Shared pool pages left on the device by swap-outs. */
    uint64_t pages_reattached; /**< Cached pages found unchanged at swap-in (not copied). */
    uint64_t bytes_out;      /**< Bytes copied to the host. */
    uint64_t bytes_in;       /**< Bytes copied back. */
} kvp_tier_stats_t;

/**
 * @brief Read a tier's sizes and counters.
 * @param[in]  tier  The tier.
 * @param[out] stats Result; `stats->struct_size` must be set.
 * @return #KVP_OK or #KVP_EINVAL. O(1).
 */
KVP_API int kvp_tier_stats(const kvp_tier_t *tier, kvp_tier_stats_t *stats);

/**
 * @brief The tier's host memory, for engines that execute swap operations
 *        themselves: slot `s` is at `base + s x slot_bytes`.
 * @param[in]  tier  The tier.
 * @param[out] base  Its first byte (aligned to #KVP_ARENA_ALIGN).
 * @param[out] bytes Its size: total_slots x slot_bytes.
 * @return #KVP_OK or #KVP_EINVAL (NULL).
 */
KVP_API int kvp_tier_host_memory(const kvp_tier_t *tier, void **base, uint64_t *bytes);

/* ------------------------------------------------------------------------ */
/* The cache façade's host tier                                              */
/* ------------------------------------------------------------------------ */

/**
 * @brief Swap a sequence's KV out to the host tier (bit-exact; see
 *        kvp_tier_swap_out()). Its device pages go back to the pool.
 * @param[in] c   The cache (with a host tier).
 * @param[in] seq A live, resident sequence.
 * @return #KVP_OK; #KVP_ESTATE (no host tier, or already swapped out);
 *         #KVP_EHOSTFULL (nothing changed); as kvp_tier_swap_out().
 */
KVP_API int kvp_cache_seq_swap_out(kvp_cache_t *c, int32_t seq);

/**
 * @brief Bring a swapped-out sequence back (all pages or none).
 * @param[in] c   The cache (with a host tier).
 * @param[in] seq A sequence swapped out by this cache.
 * @return #KVP_OK; #KVP_ENOSPC (too few free pages; nothing changed);
 *         #KVP_ESTATE (no host tier, or not swapped out); as kvp_tier_swap_in().
 */
KVP_API int kvp_cache_seq_swap_in(kvp_cache_t *c, int32_t seq);

#ifdef __cplusplus
}
#endif

#endif /* KVPAGE_TIER_H */
