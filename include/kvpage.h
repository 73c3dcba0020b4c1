/**
 * @file kvpage.h
 * @brief libkvpage — the core API: the cache façade, page pool, page table,
 *        batch views, page store (formats, append, quantize) and attention.
 *
 * This header is everything an engine needs for the decode loop. Layered
 * extras, each including this header and usable alone:
 * - kvpage_ext.h   finer control of the core objects (engine-held pages,
 *                  priorities, prefix lookups, the arena's addressing, fp8
 *                  calibration, inspection, CPU instruction sets, events);
 * - kvpage_plan.h  capacity planning: page byte counts, budgets, model and
 *                  GPU presets, size and format parsing;
 * - kvpage_tier.h  the host tier (swap sequences to host memory) and page I/O;
 * - kvpage_sched.h the scheduling policy (admission, priorities, pressure);
 * - kvpage_cuda.h  the CUDA backend's entry points;
 * - kvpage_blob.h  KV beyond one process: page blobs, chain hashes, blob
 *                  tiers, sequence export/import (an optional feature).
 */
#ifndef KVPAGE_H
#define KVPAGE_H

#include <stddef.h>
#include <stdint.h>

/**
 * @mainpage libkvpage
 *
 * libkvpage manages the KV cache of an LLM inference engine: where each
 * token's keys and values live (pages of a pool, mapped by a page table
 * with a prefix cache), in which precision (fp32 down to int4, quantized as
 * they are written), how attention reads them (paged attention on the CPU
 * or a CUDA device), how many fit in a memory budget (kvpage_plan.h) and
 * what happens when memory runs out (kvpage_tier.h, kvpage_sched.h), and how
 * KV leaves the process to a file, a shared store or another process
 * (kvpage_blob.h).
 *
 * Start with the cache façade (#kvp_cache_t, @ref cache): one object, four
 * calls per step. docs/concepts.md explains the ideas, docs/paging.md the
 * page table, docs/formats.md the bytes of every format.
 *
 * @section conventions Conventions
 *
 * - **Status.** Every fallible function returns an `int` status: #KVP_OK
 *   (0) or a negative `KVP_E*` code (#KVP_STATUS_TABLE). Results come back
 *   through out-parameters, which are left untouched on failure. A failed
 *   call changes nothing: every object is left as it was.
 * - **Detail text.** Functions of an object record a one-line explanation
 *   of their failure (which argument, which limit, the CUDA runtime's
 *   message) in the object, read with its `*_last_error()` function. The
 *   text is *sticky*: it describes the most recent call on that object that
 *   failed, and calls that succeed leave it unchanged (like `errno`), so
 *   read it right after a call returned an error. It is "" until a call
 *   fails; for a NULL handle every `*_last_error()` returns "NULL handle".
 *   Functions that create an object, or belong to none, take an optional
 *   buffer instead (`char *err, size_t err_size`; NULL/0: no detail
 *   wanted), #KVP_ERR_SIZE bytes always suffice.
 * - **Parameter structs** start with `uint32_t struct_size`, the `sizeof`
 *   the caller was compiled with; `kvp_<thing>_params_init()` sets it and
 *   the defaults. Result structs (`*_stats_t`, `*_info_t`, ...) also start
 *   with `struct_size`, set by the caller. The library reads and writes only
 *   the bytes the caller declared, so fields can be appended in later
 *   versions without breaking the ABI. The structs used as array elements
 *   (#kvp_page_op_t, `kvp_sched_item_t`) and the allocator hooks
 *   (#kvp_allocator_t) have no `struct_size`: they are fixed for good.
 * - **Plain data.** No public struct contains bitfields, unions or enums:
 *   enumerated values are stored as `int32_t`. Bindings (ctypes, cffi,
 *   bindgen, cgo) mirror the structs mechanically.
 * - **Objects** that own memory are opaque, made by `*_create()` and freed
 *   by `*_destroy()`; `*_destroy(NULL)` is a no-op.
 * - **Allocation.** Host memory comes only from the #kvp_allocator_t hooks
 *   given by value in an object's parameters (zeroed hooks: libc); a table
 *   uses its pool's. Device memory has its own hooks (kvpage_cuda.h). The
 *   library never aborts, exits, prints or asserts on the caller's behalf.
 * - **What is checked.** Every argument is validated, with arithmetic that
 *   cannot overflow, before anything changes: handles, counts, ids, ranges,
 *   strides, enumerated values, `reserved_` fields of the caller's structs
 *   (they must be 0). What C cannot check is trusted: that a pointer is
 *   valid for the length its parameter states (the docs say so at each such
 *   parameter), and the caller's thread discipline (@ref threads).
 * - **Page bytes.** The kernels and decoders are memory-safe for any bytes
 *   a page holds: unwritten memory, bytes brought in with
 *   kvp_store_page_from_host() (kvpage_tier.h) or written by the engine
 *   through kvp_store_region() (kvpage_ext.h). Every read stays inside the
 *   page's blocks and the kernels' own buffers, whatever a length or index
 *   in a block says (an int4 key block's outlier channel past head_dim is
 *   ignored). Such bytes give numbers (possibly NaN) of no meaning, never a
 *   fault; only bytes an encoder wrote give attention results.
 *
 * @section threads Thread safety
 *
 * Functions without an object argument are thread-safe. An object may be
 * used from several threads only if the caller serialises the calls on it,
 * unless a function says otherwise; a pool and the tables (and host tier)
 * on it count as one object. The library has no global mutable state.
 *
 * @section abi Versions and the ABI
 *
 * Releases with the same major version are ABI compatible from 1.0 on. Until
 * 1.0 the promise covers this header only: its functions, structs, values
 * and their meaning change only by additions (new functions, fields appended
 * behind `struct_size`, new status codes), so a program built against 0.x
 * runs against any later 0.y. The layered extras (kvpage_ext.h,
 * kvpage_plan.h, kvpage_tier.h, kvpage_sched.h, kvpage_cuda.h,
 * kvpage_blob.h) may still
 * change in a minor release before 1.0; CHANGELOG.md lists every change.
 * kvp_version_number() tells which library was loaded.
 */

#ifdef __cplusplus
extern "C" {
#endif

/**
 * @def KVP_API
 * @brief Marks a public symbol. The library is built with
 *        `-fvisibility=hidden`; only `KVP_API` symbols are exported from the
 *        shared object.
 */
#if defined(_WIN32) && defined(KVP_BUILDING_SHARED)
#define KVP_API __declspec(dllexport)
#elif defined(_WIN32) && defined(KVP_USING_SHARED)
#define KVP_API __declspec(dllimport)
#elif defined(__GNUC__) || defined(__clang__)
#define KVP_API __attribute__((visibility("default")))
#else
#define KVP_API
#endif

/* ------------------------------------------------------------------------ */
/* Version                                                                   */
/* ------------------------------------------------------------------------ */

/** @brief Major version: releases with the same major version are ABI compatible. */
#define KVP_VERSION_MAJOR 0
/** @brief Minor version: new features, ABI compatible within a major version. */
#define KVP_VERSION_MINOR 2
/** @brief Patch version: fixes only. */
#define KVP_VERSION_PATCH 0
/** @brief The version as one number: MAJOR*10000 + MINOR*100 + PATCH. */
#define KVP_VERSION_NUMBER \
    (KVP_VERSION_MAJOR * 10000 + KVP_VERSION_MINOR * 100 + KVP_VERSION_PATCH)

/** @cond KVP_INTERNAL */
#define KVP__STR2(x) #x
#define KVP__STR(x) KVP__STR2(x)
/** @endcond */

/** @brief The version as a string, e.g. "0.2.0". */
#define KVP_VERSION_STRING                                                    \
    KVP__STR(KVP_VERSION_MAJOR) "." KVP__STR(KVP_VERSION_MINOR) "." KVP__STR( \
        KVP_VERSION_PATCH)

/**
 * @brief Version of the library actually loaded at run time.
 * @return #KVP_VERSION_NUMBER of the library that was built; compare with the
 *         header's macro to detect a mismatched shared object.
 */
KVP_API unsigned kvp_version_number(void);

/* ------------------------------------------------------------------------ */
/* Status codes                                                              */
/* ------------------------------------------------------------------------ */

/**
 * @brief The status table: X(name, value, message).
 *
 * Values are never renumbered; new codes are appended with the next negative
 * value. Expanding this table generates #kvp_status, kvp_strerror() and
 * kvp_status_name().
 */
#define KVP_STATUS_TABLE(X)                                                   \
    X(KVP_OK, 0, "success")                                                   \
    X(KVP_EINVAL, -1, "invalid argument")                                     \
    X(KVP_ENOMEM, -2, "out of memory")                                        \
    X(KVP_ENOSPC, -3, "not enough free pages")                                \
    X(KVP_ENOENT, -4, "no such sequence or entry")                            \
    X(KVP_ENOTSUP, -5, "not supported by this build, backend or format")      \
    X(KVP_ENODEV, -6, "no usable device")                                     \
    X(KVP_ECUDA, -7, "CUDA runtime error")                                    \
    X(KVP_ESTATE, -8, "object is in the wrong state for this call")           \
    X(KVP_EINTERNAL, -9, "internal error in libkvpage (please report)")        \
    X(KVP_EHOSTFULL, -10, "the host tier has no room for this sequence")     \
    X(KVP_EBADBLOB, -11, "a page blob failed validation")                     \
    X(KVP_EIO, -12, "a tier's storage or connection failed")                  \
    X(KVP_EACCES, -13, "a server refused the credentials or a command")

/** @brief Internal: expands one row of #KVP_STATUS_TABLE into an enumerator. */
#define KVP__STATUS_ENUM(name, value, msg) name = value,

/**
 * @brief Status codes returned by every fallible function (see
 *        #KVP_STATUS_TABLE for the values; they are never renumbered).
 */
enum kvp_status { KVP_STATUS_TABLE(KVP__STATUS_ENUM) };

/** @var KVP_OK
 *  @brief Success (0). */
/** @var KVP_EINVAL
 *  @brief An argument is invalid: NULL, out of range, inconsistent with
 *         another, or a struct_size that is too small. Nothing was changed. */
/** @var KVP_ENOMEM
 *  @brief A host (or device) allocation failed. Nothing was changed. */
/** @var KVP_ENOSPC
 *  @brief The pool has fewer free pages than the request needs; all-or-nothing
 *         requests leave the pool as it was. */
/** @var KVP_ENOENT
 *  @brief An id or name refers to no live sequence, entry or preset. */
/** @var KVP_ENOTSUP
 *  @brief Valid, but not supported by this build, backend or format. */
/** @var KVP_ENODEV
 *  @brief No usable device: no GPU, no driver, or an ordinal out of range. */
/** @var KVP_ECUDA
 *  @brief The CUDA runtime reported an error; the detail text has its message. */
/** @var KVP_ESTATE
 *  @brief The object is in the wrong state for this call (e.g. a sequence that
 *         is swapped out). */
/** @var KVP_EINTERNAL
 *  @brief An internal invariant failed: a bug in libkvpage. Please report it
 *         with the detail text. */
/** @var KVP_EHOSTFULL
 *  @brief The host tier has too few free slots for a swap-out (see
 *         kvp_tier_swap_out()). Nothing was changed: the sequence stays on
 *         the device, whole. */

/** @var KVP_EBADBLOB
 *  @brief A page blob (kvpage_blob.h) was rejected: wrong identity, layout,
 *         chain hash, checksum, tag or payload. The detail text and the
 *         reason code say which. Nothing was written. */
/** @var KVP_EIO
 *  @brief A blob tier's storage or connection failed (file system error,
 *         unreachable server); the detail text has the system's message. */
/** @var KVP_EACCES
 *  @brief A server refused the credentials (wrong password, unknown user)
 *         or a command the caller needs (an ACL without it); the detail text
 *         has the server's reply. Retrying does not help: fix the
 *         configuration. */

/** @brief Recommended size of an error-detail buffer (`char err[KVP_ERR_SIZE]`). */
#define KVP_ERR_SIZE 256

/**
 * @brief A short human-readable message for a status code.
 * @param[in] status A value returned by a libkvpage function.
 * @return A static string; "unknown status" for values not in the table.
 */
KVP_API const char *kvp_strerror(int status);

/* ------------------------------------------------------------------------ */
/* Allocator hooks                                                           */
/* ------------------------------------------------------------------------ */

/**
 * @brief Host allocator hooks, given per object at creation.
 *
 * Leave both function pointers NULL to use libc. If one is set, both must be.
 * `alloc` must return memory aligned to at least `alignment` (a power of two,
 * at most 4096) or NULL on failure; the library handles NULL as #KVP_ENOMEM.
 */
typedef struct kvp_allocator {
    /** Allocate `size` bytes aligned to `alignment`; NULL on failure. */
    void *(*alloc)(void *opaque, size_t size, size_t alignment);
    /** Free memory returned by `alloc`; `ptr` is never NULL. */
    void (*free)(void *opaque, void *ptr);
    /** Passed unchanged to both hooks. */
    void *opaque;
} kvp_allocator_t;

/* ------------------------------------------------------------------------ */
/* KV formats and page layout                                                */
/* ------------------------------------------------------------------------ */

/**
 * @brief Element formats for keys and values (chosen independently).
 *
 * Stored in structs as `int32_t`. Byte counts per format are defined in
 * docs/formats.md and computed by kvp_layout_compute().
 */
enum kvp_format {
    KVP_FORMAT_FP32 = 0,     /**< 32-bit float, the reference. */
    KVP_FORMAT_FP16 = 1,     /**< IEEE binary16. */
    KVP_FORMAT_BF16 = 2,     /**< bfloat16. */
    KVP_FORMAT_FP8_E4M3 = 3, /**< OCP FP8 E4M3 (max 448), fp32 scale per layer and kv head. */
    KVP_FORMAT_INT8 = 4,     /**< K: asymmetric per channel over a page; V: symmetric per token and head. */
    /** The first int4 (libkvpage 0.2, name "int4_v1"). K: asymmetric per channel over a page,
     *  the head_dim/32 widest channels of each page as int8; V: asymmetric per 32-wide group.
     *  Still read and written (stored pages and blobs, 8% fewer bytes than #KVP_FORMAT_INT4). */
    KVP_FORMAT_INT4_V1 = 5,
    /** int4 (name "int4"). K: as #KVP_FORMAT_INT4_V1 with 4 int8 channels per 32 (head_dim/8)
     *  per page, their codes in channel quads;
     *  V: asymmetric per 32-wide group of the token's values in a fixed rotated basis (sign
     *  flips and a Walsh-Hadamard transform; attention and every decoder undo it). About 30%
     *  less error than #KVP_FORMAT_INT4_V1 for 9% more bytes (docs/formats.md). */
    KVP_FORMAT_INT4 = 6
};

/** @brief Number of formats in #kvp_format (valid values are 0 .. KVP_FORMAT_COUNT-1). */
#define KVP_FORMAT_COUNT 7

/**
 * @brief The canonical name of a format ("fp32", "fp16", "bf16", "fp8_e4m3",
 *        "int8", "int4_v1", "int4").
 * @param[in] format A #kvp_format value.
 * @return A static string, or NULL if `format` is not a known format.
 */
KVP_API const char *kvp_format_name(int32_t format);

/** @brief Alignment, in bytes, of every K or V block of one (page, layer, kv head). */
#define KVP_BLOCK_ALIGN 16
/** @brief Alignment, in bytes, of the arena base and of its page region. */
#define KVP_ARENA_ALIGN 256
/** @brief Largest accepted page size, in tokens. */
#define KVP_MAX_PAGE_SIZE 4096
/** @brief Largest accepted head dimension. */
#define KVP_MAX_HEAD_DIM 1024

/**
 * @brief Exact byte counts of one page for a model shape and K/V formats.
 *
 * A page holds `page_size` tokens of one sequence for every layer. For each
 * (layer, kv head) it holds one K block and one V block: the elements plus
 * their scale data, padded to #KVP_BLOCK_ALIGN bytes. When the K format is
 * int8 or int4 (scales per channel over the page's tokens), a sequence's page
 * that is still filling lives in an fp16 *staging page* (K and V of every
 * layer) and is quantized into a pool page when it fills; every active
 * sequence then holds one staging page.
 *
 * The planner, the pool and the page arena all use these numbers.
 */
typedef struct kvp_layout {
    uint32_t struct_size;        /**< Set by the caller to sizeof(kvp_layout_t). */
    int32_t layers;              /**< Number of transformer layers. */
    int32_t kv_heads;            /**< K/V heads per layer. */
    int32_t head_dim;            /**< Elements per head vector. */
    int32_t page_size;           /**< Tokens per page. */
    int32_t k_format;            /**< #kvp_format of keys. */
    int32_t v_format;            /**< #kvp_format of values. */
    int32_t needs_staging;       /**< 1 if sequences need an fp16 staging page (K int8/int4). */
    uint64_t k_block_bytes;      /**< One (page, layer, kv head) K block, scales included, padded. */
    uint64_t v_block_bytes;      /**< One (page, layer, kv head) V block, scales included, padded. */
    uint64_t page_bytes;         /**< One page, all layers, K and V: layers*kv_heads*(k_block+v_block). */
    uint64_t staging_page_bytes; /**< One fp16 staging page (all layers, K and V), or 0. */
    uint64_t fixed_bytes;        /**< Per-arena data (fp8 scale tables), padded to #KVP_ARENA_ALIGN. */
    uint64_t element_bytes_per_token; /**< K+V element bytes per token before scales, all layers:
                                           layers*kv_heads*head_dim*(k_bits+v_bits)/8. */
    double bytes_per_token;      /**< Stored bytes per token: page_bytes / page_size. */
} kvp_layout_t;

/* ------------------------------------------------------------------------ */
/* Objects and shared types                                                  */
/* ------------------------------------------------------------------------ */

/** @brief The common case in one object: pool, table, store and context (@ref cache). */
typedef struct kvp_cache kvp_cache_t;
/** @brief Page ids, reference counts and the prefix cache (@ref pool). */
typedef struct kvp_pool kvp_pool_t;
/** @brief Sequences mapped onto a pool's pages (@ref table). */
typedef struct kvp_table kvp_table_t;
/** @brief The page arena on the CPU or a CUDA device (@ref store). */
typedef struct kvp_store kvp_store_t;
/** @brief Threads and workspace (CPU) or stream and workspace (CUDA) for
 *         attention (@ref attention). */
typedef struct kvp_ctx kvp_ctx_t;
/** @brief A host tier: sequences swapped out to host memory (kvpage_tier.h). */
typedef struct kvp_tier kvp_tier_t;
/** @brief A batch of sequences' pages in CSR form (@ref view). */
typedef struct kvp_kv_view kvp_kv_view_t;
/** @brief A data operation the page table asks the storage to perform (@ref view). */
typedef struct kvp_page_op kvp_page_op_t;
/** @brief Inputs of kvp_attention() and kvp_cache_attend() (@ref attention). */
typedef struct kvp_attention_params kvp_attention_params_t;

/* ======================================================================== */
/**
 * @defgroup cache Cache façade
 * @brief The common decode loop in one object.
 *
 * A #kvp_cache_t bundles a page pool, a page table, a page store and an
 * attention context (and, with `host_bytes`, a host tier) and keeps them
 * consistent. The layers stay usable alone; the façade only sequences them.
 * Per step:
 *
 * 1. kvp_cache_begin_step() with the batch's sequences and their new tokens:
 *    reserves and appends them in the table (all or nothing), runs the
 *    copy-on-write operations on the arena, and exports the batch.
 * 2. For each layer: kvp_cache_write() the new rows' K/V (rows in batch
 *    order), then kvp_cache_attend() with the queries of those rows.
 *
 * Sequences are made with kvp_cache_seq_create(), reuse a cached prompt
 * prefix with kvp_cache_seq_attach_prefix(), and end with
 * kvp_cache_seq_release(). Forks and truncations run their page operations
 * on the arena at once. Buffers grow to the largest step seen and are
 * reused: after the first steps, a step allocates nothing. The parts
 * (kvp_cache_parts()) are there for everything else: pool statistics,
 * sequence lengths (kvp_table_seq_info() in kvpage_ext.h), the step's view
 * for an engine's own kernels.
 * @{
 */

/** @brief Cache parameters. Fill with kvp_cache_params_init(). */
typedef struct kvp_cache_params {
    uint32_t struct_size;      /**< sizeof(kvp_cache_params_t); set by init. */
    int32_t layers;            /**< Transformer layers (required). */
    int32_t kv_heads;          /**< K/V heads per layer (required). */
    int32_t head_dim;          /**< Head dimension (required). */
    int32_t page_size;         /**< Tokens per page; default 16. */
    int32_t k_format;          /**< Key #kvp_format; default #KVP_FORMAT_FP16. */
    int32_t v_format;          /**< Value #kvp_format; default #KVP_FORMAT_FP16. */
    int32_t k_order;           /**< #kvp_k_order; default token-major. */
    int32_t max_seqs;          /**< Live sequences at once (also the staging pages for
                                    int8/int4 keys); default 256. */
    int32_t prefix_cache;      /**< 1 (default): keep full pages for prefix reuse. */
    int32_t threads;           /**< Attention threads (caller included); default 1. */
    int32_t isa;               /**< #kvp_isa; default #KVP_ISA_AUTO. */
    int32_t reserved_;         /**< Must be 0 (checked). */
    int64_t num_pages;         /**< Pool pages; 0 = as many as kv_budget_bytes holds. */
    uint64_t kv_budget_bytes;  /**< With num_pages 0: the arena's byte budget (pool pages
                                    plus max_seqs staging pages when needed). */
    uint64_t hash_seed;        /**< Prefix-cache hash seed (see kvp_pool_params_t). */
    uint64_t host_bytes;       /**< Host tier budget in bytes; 0 (default) = no host tier. */
    kvp_allocator_t allocator; /**< Host allocator hooks; NULL functions = libc. */
} kvp_cache_params_t;

/**
 * @brief Fill `p` with defaults (fp16 K/V, page 16, token-major keys, 256
 *        sequences, prefix cache on, 1 thread, automatic ISA, no host tier,
 *        libc allocator) and set its struct_size; the shape and the size
 *        (num_pages or kv_budget_bytes) stay 0 and must be set.
 * @param[out] p Parameters; NULL is ignored.
 */
KVP_API void kvp_cache_params_init(kvp_cache_params_t *p);

/**
 * @brief Create the pool, table, arena and context of a cache on the CPU
 *        (on a CUDA device: kvp_cuda_cache_create(), kvpage_cuda.h).
 *
 * The arena is one allocation of the exact bytes the page layout needs
 * (docs/formats.md); the context's worker threads start here.
 *
 * @param[in]  params   Parameters.
 * @param[out] out      The cache; untouched on error.
 * @param[out] err      Optional error-detail buffer.
 * @param[in]  err_size Its size.
 * @return #KVP_OK, #KVP_EINVAL (bad parameter; a budget smaller than one page
 *         plus the staging pages), #KVP_ENOMEM.
 */
KVP_API int kvp_cache_create(const kvp_cache_params_t *params, kvp_cache_t **out, char *err,
                             size_t err_size);

/** @brief Destroy a cache and everything it owns; NULL is a no-op. @param[in] c The cache. */
KVP_API void kvp_cache_destroy(kvp_cache_t *c);

/**
 * @brief Detail of the most recent failed call on this cache (sticky: see
 *        @ref conventions).
 * @param[in] c The cache.
 * @return A NUL-terminated sentence owned by the cache, "" if no call has
 *         failed, "NULL handle" for NULL. Valid until its next failed call.
 */
KVP_API const char *kvp_cache_last_error(const kvp_cache_t *c);

/** @brief The objects a cache is made of (kvp_cache_parts()); all owned by the cache. */
typedef struct kvp_cache_parts {
    uint32_t struct_size; /**< Set by the caller to sizeof(kvp_cache_parts_t). */
    int32_t reserved_;    /**< Padding; 0. */
    kvp_pool_t *pool;     /**< Its page pool (kvp_pool_stats() for a memory report). */
    kvp_table_t *table;   /**< Its page table (sequence ids are the table's). */
    kvp_store_t *store;   /**< Its page arena. */
    kvp_ctx_t *ctx;       /**< Its attention context. */
    kvp_tier_t *tier;     /**< Its host tier, or NULL without one (`host_bytes` 0). */
} kvp_cache_parts_t;

/**
 * @brief The pool, table, store, context and host tier of a cache.
 *
 * They stay owned by the cache: do not destroy them. Reading them is always
 * allowed (kvp_pool_stats(), kvp_table_seq_info(), ...). Change sequences
 * (fork, truncate, release, swap) through the cache's own calls, which run
 * the page operations on the arena; a change made on the table directly
 * between kvp_cache_begin_step() and the step's last kvp_cache_attend() is
 * not seen by that step.
 *
 * @param[in]  c   The cache.
 * @param[out] out Filled in; `out->struct_size` must be set.
 * @return #KVP_OK or #KVP_EINVAL (NULL, struct_size too small). O(1).
 */
KVP_API int kvp_cache_parts(const kvp_cache_t *c, kvp_cache_parts_t *out);

/**
 * @brief A new, empty sequence (kvp_table_seq_create() on the cache's table).
 * @param[in]  c        The cache.
 * @param[in]  priority Eviction priority of the pages it fills (higher is kept
 *                      longer in the prefix cache); 0 is the usual value.
 * @param[in]  salt     Prefix-cache namespace: 0 shares cached prompts with
 *                      every sequence of salt 0; see kvp_table_seq_create().
 * @param[out] seq      Its id.
 * @return #KVP_OK, #KVP_EINVAL, #KVP_ENOSPC (no sequence slot or staging page).
 */
KVP_API int kvp_cache_seq_create(kvp_cache_t *c, int32_t priority, uint64_t salt, int32_t *seq);

/**
 * @brief End a sequence; its full pages stay in the prefix cache.
 *
 * Works on a sequence swapped out to the cache's host tier too: its host
 * copy is dropped (kvp_tier_drop()).
 *
 * @param[in] c   The cache.
 * @param[in] seq A live sequence, resident or swapped out.
 * @return #KVP_OK, #KVP_EINVAL (NULL) or #KVP_ENOENT (not a live sequence).
 */
KVP_API int kvp_cache_seq_release(kvp_cache_t *c, int32_t seq);

/**
 * @brief Attach the longest cached prefix of a prompt to an empty sequence.
 *
 * Pass the prompt without its last token (`n - 1`) when the engine needs the
 * logits of the whole prompt: at least that token is then prefilled.
 *
 * @param[in]  c       The cache.
 * @param[in]  seq     An empty sequence.
 * @param[in]  tokens  The prompt's token ids.
 * @param[in]  n       Their count.
 * With blob tiers (kvpage_blob.h, kvp_cache_add_tier()), the pages after
 * the pool's match are then looked up in the tiers, in order, and the
 * longest chain of valid blobs is imported into fresh pages.
 *
 * @param[out] matched Tokens attached (whole pages; prefill the rest).
 * @return As kvp_table_attach_prefix(); #KVP_ECUDA if writing imported
 *         pages fails (the pool's match stays attached).
 */
KVP_API int kvp_cache_seq_attach_prefix(kvp_cache_t *c, int32_t seq, const int32_t *tokens,
                                        int64_t n, int64_t *matched);

/**
 * @brief Fork a sequence (parallel sampling, beam search): the child shares
 *        its pages; copies run on the arena.
 * @param[in]  c      The cache.
 * @param[in]  parent A live sequence.
 * @param[out] child  The child's id.
 * @return As kvp_table_fork(), or an error of kvp_store_apply_ops() (the child
 *         is then released again).
 */
KVP_API int kvp_cache_seq_fork(kvp_cache_t *c, int32_t parent, int32_t *child);

/**
 * @brief Shorten a sequence (e.g. rejected speculative tokens); an unseal
 *        runs on the arena at once. The sequence's length is then `length`.
 * @param[in] c      The cache.
 * @param[in] seq    A live sequence.
 * @param[in] length New length, 0 .. current length.
 * @return As kvp_table_truncate() and kvp_store_apply_ops().
 */
KVP_API int kvp_cache_seq_truncate(kvp_cache_t *c, int32_t seq, int64_t length);

/**
 * @brief Start a step: append each sequence's new tokens and export the batch.
 *
 * All or nothing: if any sequence lacks pages, nothing changes and the call
 * returns #KVP_ENOSPC with the batch index in the detail (the engine then
 * preempts or swaps something out). The step's rows are the new tokens in
 * batch order: sequence `b` owns rows `qo_indptr[b] .. qo_indptr[b+1]-1`.
 *
 * @param[in] c       The cache.
 * @param[in] seqs    `batch` distinct live sequences.
 * @param[in] batch   >= 1.
 * @param[in] num_new `batch` counts of new tokens (>= 1 each).
 * @param[in] tokens  The new tokens' ids, `sum(num_new)` in batch order (they
 *                    feed the prefix cache), or NULL.
 * @return #KVP_OK, #KVP_EINVAL, #KVP_ENOENT, #KVP_ENOSPC, #KVP_ENOMEM, or an
 *         error of kvp_store_apply_ops(). O(new tokens + pages of the batch).
 */
KVP_API int kvp_cache_begin_step(kvp_cache_t *c, const int32_t *seqs, int32_t batch,
                                 const int32_t *num_new, const int32_t *tokens);

/**
 * @brief Write one layer's K/V for the step's rows (quantizing on the way).
 * @param[in] c        The cache.
 * @param[in] layer    0 .. layers-1.
 * @param[in] dtype    #KVP_FORMAT_FP32, #KVP_FORMAT_FP16 or #KVP_FORMAT_BF16.
 * @param[in] k        Keys, rows x `[kv_heads][head_dim]` (row stride `k_stride`).
 * @param[in] v        Values, same.
 * @param[in] k_stride Elements between rows of `k`; 0 = kv_heads*head_dim.
 * @param[in] v_stride Elements between rows of `v`; 0 = kv_heads*head_dim.
 * @return As kvp_store_append(); #KVP_ESTATE outside a step.
 */
KVP_API int kvp_cache_write(kvp_cache_t *c, int32_t layer, int32_t dtype, const void *k,
                            const void *v, int64_t k_stride, int64_t v_stride);

/**
 * @brief Paged attention of the step's rows over their sequences, one layer.
 *
 * The step's `qo_indptr` replaces `params->qo_indptr`; set the other fields
 * (layer, q_heads, dtype, sm_scale, q, out, ...) as for kvp_attention(). Call
 * after kvp_cache_write() for the same layer: until then the step's new rows
 * have no K/V in the pages (and int8/int4 keys' completed pages are not
 * sealed), so attending earlier is an error the cache reports.
 *
 * @param[in] c      The cache.
 * @param[in] params Attention parameters.
 * @return As kvp_attention(); #KVP_ESTATE outside a step, or when
 *         kvp_cache_write() has not succeeded for `params->layer` in this
 *         step (nothing is written to `out`).
 */
KVP_API int kvp_cache_attend(kvp_cache_t *c, const kvp_attention_params_t *params);

/**
 * @brief The step's exported batch, for engines with their own kernels
 *        (e.g. FlashInfer's paged decode reads the CSR as is).
 * @param[in]  c         The cache.
 * @param[out] view      The CSR view (`view->struct_size` must be set); it
 *                       points into the cache's buffers, valid until the next
 *                       kvp_cache_begin_step().
 * @param[out] slots     Optional: the step's row slots.
 * @param[out] qo_indptr Optional: the step's `[batch+1]` row offsets.
 * @param[out] rows      Optional: the step's row count.
 * @return #KVP_OK, #KVP_EINVAL, #KVP_ESTATE outside a step.
 */
KVP_API int kvp_cache_step_view(const kvp_cache_t *c, kvp_kv_view_t *view, const int64_t **slots,
                                const int32_t **qo_indptr, int32_t *rows);

/** @} */

/* ======================================================================== */
/**
 * @defgroup pool Page pool
 * @brief Page ids, reference counts, the prefix cache.
 *
 * A pool of KV pages: page ids, reference counts, the prefix cache.
 *
 * The pool hands out integer page ids; it touches no tensor memory (the page
 * arena, sized by the same kvp_layout_compute(), holds the data). Pool pages
 * have ids `0 .. num_pages-1`; in layouts with staging (int8/int4 keys) the
 * fp16 staging pages have ids `num_pages .. num_pages+num_staging-1`, as in
 * #kvp_kv_view_t.
 *
 * Every pool page is in exactly one of three states:
 * - **free**: on the free list;
 * - **used**: its reference count is at least 1 (sequences of a
 *   #kvp_table_t, or references the engine took with kvp_pool_alloc() and
 *   kvp_pool_retain(), kvpage_ext.h);
 * - **cached**: reference count 0 but kept by the prefix cache, because it
 *   holds a full page of tokens a later prompt may reuse. Cached pages are
 *   evicted (made free) only when an allocation needs them, lowest priority
 *   first, then least recently used, and only pages no other cached page
 *   depends on.
 *
 * `free + used + cached = num_pages` at all times, and an allocation of `k`
 * pages succeeds whenever `free + cached - reserved >= k` (see
 * kvp_table_reserve()). The pool's sizes come from a plan
 * (kvp_pool_create_from_plan(), kvpage_plan.h) or are given directly.
 *
 * **Cost.** Allocating and releasing a page is O(1) (an intrusive free list
 * in arrays sized at creation); nothing is allocated after creation.
 * Evicting a cached page is O(log cached). Host memory: 56 bytes per pool
 * page and 12 per staging page; with the prefix cache, 4 more per pool page
 * (eviction heap), `4 x page_size` per page (pool and staging) for the token
 * ids it compares, and 4 per hash bucket (one per page, rounded up to a power
 * of two). For Llama-3.1-8B in fp16 at page 16 that is about 130 bytes of
 * metadata per 2 MiB page.
 *
 * **Determinism.** The same calls in the same order give the same page ids
 * and the same operations, so tensor-parallel replicas stay in lockstep.
 *
 * **Threads.** A pool and the tables created on it form one object for
 * thread safety: serialise all calls on them.
 * @{
 */

/** @brief Parameters of kvp_pool_create(). Fill with kvp_pool_params_init(). */
typedef struct kvp_pool_params {
    uint32_t struct_size;  /**< sizeof(kvp_pool_params_t); set by init. */
    int32_t page_size;     /**< Tokens per page, 1 .. #KVP_MAX_PAGE_SIZE; default 16. */
    int32_t num_pages;     /**< Pool pages, >= 1 (ids 0 .. num_pages-1); required. */
    int32_t num_staging;   /**< Staging pages (ids from num_pages on); 0 (default) when
                                the layout has none. num_pages + num_staging <= 2^31-1. */
    int32_t prefix_cache;  /**< 1 (default): keep full pages in the prefix cache after
                                their sequences end; 0: pages are freed at once. */
    int32_t reserved_;     /**< Must be 0 (checked). */
    uint64_t hash_seed;    /**< Seed of the prefix hash (default 0). Results never depend
                                on it (matches compare the stored token ids); set it from
                                a secret when prompts come from untrusted users, so they
                                cannot craft prompts that fill one hash bucket. */
    kvp_allocator_t allocator; /**< Host allocator hooks of the pool and its tables; zeroed
                                    hooks = libc. */
} kvp_pool_params_t;

/**
 * @brief Fill `p` with defaults (page size 16, no staging, prefix cache on,
 *        seed 0, libc allocator) and set its struct_size. num_pages is 0 and
 *        must be set.
 * @param[out] p Parameters to initialise; NULL is ignored.
 */
KVP_API void kvp_pool_params_init(kvp_pool_params_t *p);

/**
 * @brief Create a pool of `params->num_pages` pages.
 *
 * @param[in]  params   Sizes and options (see #kvp_pool_params_t).
 * @param[out] pool     The new pool; untouched on error.
 * @param[out] err      Optional error-detail buffer.
 * @param[in]  err_size Its size.
 * @return #KVP_OK; #KVP_EINVAL for NULL arguments, a struct_size too small,
 *         a zero or negative page count, a page size out of range, more than
 *         2^31-1 page ids, or metadata that would overflow `size_t`;
 *         #KVP_ENOMEM if an allocation fails. O(num_pages).
 */
KVP_API int kvp_pool_create(const kvp_pool_params_t *params, kvp_pool_t **pool,
                            char *err, size_t err_size);

/**
 * @brief Destroy a pool. NULL is a no-op.
 *
 * Destroy every table created on the pool first.
 *
 * @param[in] pool The pool.
 */
KVP_API void kvp_pool_destroy(kvp_pool_t *pool);

/**
 * @brief Detail of the most recent failed call on this pool (sticky: see
 *        @ref conventions).
 * @param[in] pool The pool.
 * @return A NUL-terminated sentence (e.g. "page 70 is out of range
 *         0..63"), "" if no call has failed, "NULL handle" for NULL. Valid
 *         until the pool's next failed call.
 */
KVP_API const char *kvp_pool_last_error(const kvp_pool_t *pool);

/**
 * @brief Counters of a pool and the tables on it (kvp_pool_stats()).
 *
 * `free_pages + used_pages + cached_pages = total_pages`.
 */
typedef struct kvp_pool_stats {
    uint32_t struct_size;      /**< Set by the caller to sizeof(kvp_pool_stats_t). */
    int32_t page_size;         /**< Tokens per page. */
    int64_t total_pages;       /**< Pool pages (num_pages). */
    int64_t used_pages;        /**< Pool pages with a reference count >= 1. */
    int64_t cached_pages;      /**< Pool pages kept only by the prefix cache (evictable). */
    int64_t free_pages;        /**< Pool pages on the free list. */
    int64_t reserved_pages;    /**< Free or cached pages promised by kvp_table_reserve(). */
    int64_t available_pages;   /**< free + cached - reserved: what kvp_pool_alloc() can get. */
    int64_t total_staging;     /**< Staging pages (num_staging). */
    int64_t used_staging;      /**< Staging pages in use. */
    int64_t live_seqs;         /**< Live sequences of all tables on this pool (swapped-out
                                    ones included: their ids stay valid). */
    int64_t live_tokens;       /**< Sum of their lengths, except sequences swapped out to a
                                    host tier (their tokens are not on the device). */
    double utilization;        /**< live_tokens / ((used_pages + used_staging) x page_size);
                                    0 when nothing is used. Above 1 when sequences share
                                    pages (fork, prefix cache): memory saved by sharing. */
    uint64_t prefix_lookups;   /**< kvp_table_attach_prefix() calls. */
    uint64_t prefix_hit_tokens;  /**< Prompt tokens found in the cache (attached). */
    uint64_t prefix_miss_tokens; /**< Prompt tokens looked up but not attached. */
    uint64_t pages_stored;     /**< Pages ever stored in the prefix cache. */
    uint64_t pages_evicted;    /**< Pages ever removed from the prefix cache. */
} kvp_pool_stats_t;

/**
 * @brief Read the pool's counters.
 * @param[in,out] pool  The pool.
 * @param[out]    stats Result; `stats->struct_size` must be set.
 * @return #KVP_OK or #KVP_EINVAL (NULL, struct_size too small). O(1).
 */
KVP_API int kvp_pool_stats(kvp_pool_t *pool, kvp_pool_stats_t *stats);

/** @} */

/* ======================================================================== */
/**
 * @defgroup table Page table
 * @brief Sequences, copy-on-write, prefix reuse, batch export.
 *
 * A page table: sequences of tokens mapped onto a pool's pages.
 *
 * Sequences are named by non-negative int32 ids that the table hands out.
 * An id is a handle (slot and generation): a released id is rejected with
 * #KVP_ENOENT, and is not handed out again until its slot has been reused
 * 2^(31 - ceil(log2(max_seqs))) times.
 *
 * **Pages of a sequence** of length L with page size P:
 * - layouts without staging: `ceil(L/P)` pool pages; the last holds
 *   `L - (pages-1) x P` tokens;
 * - layouts with staging (the pool has staging pages): `floor(L/P)` full,
 *   quantized ("sealed") pool pages, plus, while `L % P != 0`, its staging
 *   page holding the last `L % P` tokens in fp16. Each sequence takes one
 *   staging page when it is created (or forked) and keeps it until it is
 *   released, so appends and truncations never need a staging page and the
 *   planner's count (`floor(context/P)` pool pages + 1 staging page per
 *   sequence) is exact. The pool's staging pages therefore bound the number
 *   of live sequences.
 *
 * **Sharing.** Forked sequences share pages (reference counted); a partly
 * filled shared page is copied on write (#KVP_OP_COPY) by the first append
 * that would write into it. Full pages are never written again.
 *
 * **Prefix cache.** When an append fills a page and every token id of the
 * sequence so far is known, the page is stored in the pool's prefix cache,
 * under a chained hash of its parent page, its token ids and the sequence's
 * salt. kvp_table_attach_prefix() gives a new sequence the longest run of
 * cached pages matching its prompt. Matches compare the stored token ids,
 * parent page and salt, never only the hash: a hash collision costs one
 * comparison and never returns wrong pages.
 *
 * **Threads.** See #kvp_pool_t: a table and its pool are one object.
 * @{
 */

/**
 * @brief Create a page table on `pool`.
 *
 * The pool must outlive the table; the table allocates its memory through
 * the pool's allocator hooks. Several tables may share one pool (e.g. groups
 * of layers with different attention windows).
 *
 * @param[in,out] pool     The pool the table takes pages from.
 * @param[in]     max_seqs Sequence slots, 1 .. 2^24, or 0: the pool's staging
 *                         page count in layouts with staging, else 4096.
 * @param[out]    table    The new table; untouched on error.
 * @param[out]    err      Optional error-detail buffer.
 * @param[in]     err_size Its size.
 * @return #KVP_OK; #KVP_EINVAL (NULL pool or table, max_seqs out of range);
 *         #KVP_ENOMEM. O(max_seqs).
 */
KVP_API int kvp_table_create(kvp_pool_t *pool, int32_t max_seqs, kvp_table_t **table,
                             char *err, size_t err_size);

/**
 * @brief Destroy a table, releasing every live sequence's pages to the pool
 *        (full pages stay in the prefix cache). NULL is a no-op. Destroy its
 *        host tier (kvp_tier_destroy()) first.
 * @param[in] table The table.
 */
KVP_API void kvp_table_destroy(kvp_table_t *table);

/**
 * @brief Detail of the most recent failed call on this table (sticky: see
 *        @ref conventions).
 * @param[in] table The table.
 * @return A NUL-terminated sentence, "" if no call has failed, "NULL handle"
 *         for NULL. Valid until the table's next failed call.
 */
KVP_API const char *kvp_table_last_error(const kvp_table_t *table);

/**
 * @brief Create an empty sequence.
 *
 * In layouts with staging it takes a staging page, which it keeps until it
 * is released.
 *
 * @param[in,out] table    The table.
 * @param[in]     priority Eviction priority of the pages it fills (higher is
 *                         kept longer once they are only cached); 0 is the
 *                         usual value. See kvp_table_set_priority()
 *                         (kvpage_ext.h).
 * @param[in]     salt     Prefix-cache namespace. Sequences with different
 *                         salts never share cached pages, so tenants cannot
 *                         probe each other's prompts: derive it from a secret
 *                         and the tenant id. 0 is shared by every sequence of
 *                         salt 0.
 * @param[out]    seq      The new sequence id (>= 0); untouched on error.
 * @return #KVP_OK; #KVP_EINVAL (NULL); #KVP_ENOSPC if all max_seqs slots are
 *         live or, with staging, no staging page is free. O(1); never
 *         allocates.
 */
KVP_API int kvp_table_seq_create(kvp_table_t *table, int32_t priority, uint64_t salt,
                                 int32_t *seq);

/**
 * @brief Release a sequence: drop its references (full pages stored in the
 *        prefix cache stay cached), its staging page and its reservation.
 *        The id becomes invalid.
 * @param[in,out] table The table.
 * @param[in]     seq   A live sequence.
 * @return #KVP_OK, #KVP_EINVAL (NULL table) or #KVP_ENOENT (unknown or
 *         already released id; nothing changed); #KVP_ESTATE (swapped out to
 *         a host tier, which owns it until it is swapped in or dropped:
 *         kvp_tier_drop(), or kvp_cache_seq_release() for a cache's
 *         sequence). O(pages of the sequence).
 */
KVP_API int kvp_table_seq_release(kvp_table_t *table, int32_t seq);

/**
 * @brief Guarantee room for `n` more tokens: the next appends of up to `n`
 *        tokens in total cannot fail.
 *
 * Sets (does not add to) the sequence's reservation: room for `length + n`
 * tokens, counting the pages those tokens will fill and, for a partly filled
 * page shared with a fork, its copy-on-write page. Reserved pages are not
 * chosen yet; they are set aside from the free and cached pages, so other
 * allocations cannot take them. `n = 0` drops the reservation. Appends
 * consume it; kvp_table_truncate() and kvp_table_attach_prefix() drop it.
 *
 * @param[in,out] table The table.
 * @param[in]     seq   A live sequence.
 * @param[in]     n     Tokens, >= 0; `length + n <= 2^31-1`.
 * @return #KVP_OK; #KVP_EINVAL (NULL, n < 0, too long); #KVP_ENOENT;
 *         #KVP_ESTATE (swapped out to a host tier); #KVP_ENOSPC if the pages
 *         are not available (free + cached minus other reservations);
 *         #KVP_ENOMEM (growing the page list). Nothing changed on error.
 *         O(1) amortised.
 */
KVP_API int kvp_table_reserve(kvp_table_t *table, int32_t seq, int64_t n);

/**
 * @brief Append `n` tokens to a sequence: choose their slots and say what
 *        the storage must do first.
 *
 * Row `i` (0-based) of this append is written at `slots[i] = page x
 * page_size + offset` (#kvp_kv_view_t). Operations, in order:
 * - without staging: at most one #KVP_OP_COPY, when the sequence's partly
 *   filled last page is shared (after a fork) or stored in the prefix cache
 *   (after a truncation): `count` tokens of page `src` are copied to the new
 *   page `dst` before the rows are written;
 * - with staging: one #KVP_OP_SEAL per pool page this append fills (see
 *   #kvp_page_op_kind for `src`, `count` and `row`); rows that land in a page
 *   being sealed have slots in that pool page, the others in the
 *   sequence's staging page.
 *
 * An append of `n` tokens produces at most `n / page_size + 1` operations.
 * Full pages are stored in the prefix cache when `tokens` is given for every
 * token of the sequence so far.
 *
 * **Several sequences in one store append.** A #KVP_OP_SEAL's `row` counts
 * from this call's first token. To write a batch's rows with one
 * kvp_store_append() per layer, concatenate the sequences' rows and slots in
 * batch order and add each sequence's first row in the batch (the sum of
 * the earlier sequences' `n`) to the `row` of its SEAL operations
 * (kvp_cache_begin_step() does exactly this).
 *
 * @param[in,out] table        The table.
 * @param[in]     seq          A live sequence.
 * @param[in]     n            Tokens, >= 0 (0 is a no-op).
 * @param[in]     tokens       `n` token ids, or NULL (the sequence's later pages
 *                             are then not stored in the prefix cache).
 * @param[out]    slots        `n` slots, or NULL if not wanted.
 * @param[out]    ops          `ops_capacity` operations, may be NULL if 0.
 * @param[in]     ops_capacity Size of `ops`.
 * @param[out]    num_ops      Operations written (required).
 * @return #KVP_OK; #KVP_EINVAL (NULL, n < 0, length over 2^31-1,
 *         `ops_capacity` too small: the detail says how many are needed);
 *         #KVP_ENOENT; #KVP_ESTATE (swapped out to a host tier); #KVP_ENOSPC
 *         (pages beyond the reservation not available); #KVP_ENOMEM (growing
 *         the page list). Nothing changed on error. Within a reservation it cannot fail for lack of pages or
 *         memory, and allocates nothing. O(n + pages filled).
 */
KVP_API int kvp_table_append(kvp_table_t *table, int32_t seq, int64_t n,
                             const int32_t *tokens, int64_t *slots,
                             kvp_page_op_t *ops, int32_t ops_capacity,
                             int32_t *num_ops);

/**
 * @brief Shorten a sequence to `length` tokens (e.g. rejected speculative
 *        tokens), dropping pages past the new end and any reservation.
 *
 * With staging, cutting into a sealed page reopens it: one #KVP_OP_UNSEAL
 * brings its first `length % page_size` tokens back into the staging page,
 * and the pool page is released. Execute it before any later append writes:
 * that append may hand the released page to another sequence. Without
 * staging no operation is needed; a page that becomes partly filled and is
 * still shared or cached is copied on the next append, one held only by this
 * sequence is taken out of the prefix cache.
 *
 * @param[in,out] table        The table.
 * @param[in]     seq          A live sequence.
 * @param[in]     length       New length, 0 .. current length.
 * @param[out]    ops          Room for 1 operation (may be NULL if
 *                             `ops_capacity` is 0 and none is needed).
 * @param[in]     ops_capacity Size of `ops`.
 * @param[out]    num_ops      Operations written, 0 or 1 (required).
 * @return #KVP_OK; #KVP_EINVAL (NULL, length < 0 or past the end, no room
 *         for the operation); #KVP_ENOENT; #KVP_ESTATE (swapped out to a host
 *         tier). Nothing changed on error. Never fails for lack of pages or
 *         memory. O(pages dropped).
 */
KVP_API int kvp_table_truncate(kvp_table_t *table, int32_t seq, int64_t length,
                               kvp_page_op_t *ops, int32_t ops_capacity,
                               int32_t *num_ops);

/**
 * @brief Fork a sequence: the child shares every page of the parent.
 *
 * Full pages are shared (reference counted). Without staging the partly
 * filled last page is shared too and copied on write by whichever sequence
 * appends to it first. With staging the child gets its own staging page, a
 * #KVP_OP_COPY of the parent's (`count` = tokens in it; no operation when
 * the length is a multiple of the page size). The child has the parent's
 * length, priority and salt, and no reservation. If the parent has a
 * reservation and its last page becomes shared, one more page is reserved
 * for its copy-on-write.
 *
 * @param[in,out] table        The table.
 * @param[in]     parent       A live sequence.
 * @param[out]    child        The new sequence id; untouched on error.
 * @param[out]    ops          Room for 1 operation (may be NULL if
 *                             `ops_capacity` is 0 and none is needed).
 * @param[in]     ops_capacity Size of `ops`.
 * @param[out]    num_ops      Operations written, 0 or 1 (required).
 * @return #KVP_OK; #KVP_EINVAL (NULL, no room for the operation);
 *         #KVP_ENOENT (unknown or released parent); #KVP_ESTATE (the parent is
 *         swapped out to a host tier); #KVP_ENOSPC (no sequence
 *         slot, no staging page, or no page for the parent's reserved
 *         copy-on-write); #KVP_ENOMEM. Nothing changed on error.
 *         O(pages of the parent).
 */
KVP_API int kvp_table_fork(kvp_table_t *table, int32_t parent, int32_t *child,
                           kvp_page_op_t *ops, int32_t ops_capacity,
                           int32_t *num_ops);

/**
 * @brief Give an empty sequence the longest cached prefix of its prompt.
 *
 * Walks the prompt a full page at a time through the prefix cache (under the
 * sequence's salt) and attaches the matching pages (reference counted); the
 * sequence's length becomes `*matched`, a multiple of the page size, and
 * only tokens `matched ..` need prefill. To keep the last prompt token for
 * prefill (its logits are needed), pass `n - 1` tokens. Cached pages that
 * other sequences' reservations count on are not taken (the match stops
 * before them). Counts one lookup, `matched` hit tokens and `n - matched`
 * missed tokens in the stats. With the prefix cache off it matches nothing.
 *
 * @param[in,out] table   The table.
 * @param[in]     seq     A live sequence of length 0.
 * @param[in]     tokens  The prompt's token ids (may be NULL if n is 0).
 * @param[in]     n       Prompt length, >= 0.
 * @param[out]    matched Tokens attached (0 .. n, a multiple of the page size).
 * @return #KVP_OK; #KVP_EINVAL (NULL, n < 0 or over 2^31-1); #KVP_ENOENT;
 *         #KVP_ESTATE (the sequence is not empty, or swapped out); #KVP_ENOMEM. Nothing
 *         changed on error. O(n) plus O(1) expected per page looked up.
 */
KVP_API int kvp_table_attach_prefix(kvp_table_t *table, int32_t seq,
                                    const int32_t *tokens, int64_t n,
                                    int64_t *matched);

/**
 * @brief Caller-owned buffers filled by kvp_table_export().
 *
 * Size them with kvp_table_export_size(). Plain pointers and fixed-width
 * integers, for FFI.
 */
typedef struct kvp_batch_buffers {
    uint32_t struct_size;     /**< Set by the caller to sizeof(kvp_batch_buffers_t). */
    int32_t reserved_;        /**< Must be 0 (checked). */
    int32_t *indptr;          /**< [batch+1] CSR offsets (required). */
    int32_t *indices;         /**< [indices_capacity] page ids (required). */
    int32_t *last_page_len;   /**< [batch] tokens in each last page (required). */
    int64_t *slot_mapping;    /**< [slots_capacity] slots of this step's rows, or NULL. */
    int32_t *qo_indptr;       /**< [batch+1] offsets of each sequence's rows in
                                   slot_mapping, or NULL. */
    int64_t indices_capacity; /**< Entries `indices` can hold. */
    int64_t slots_capacity;   /**< Entries `slot_mapping` can hold. */
} kvp_batch_buffers_t;

/**
 * @brief Sizes of a batch export: total page entries and total new rows.
 *
 * @param[in,out] table       The table.
 * @param[in]     seqs        `batch` live sequence ids (repeats allowed).
 * @param[in]     batch       >= 0.
 * @param[in]     num_new     `batch` counts of each sequence's last rows to map
 *                            (this step's tokens), or NULL for none.
 * @param[out]    num_indices Entries `indices` needs.
 * @param[out]    num_slots   Entries `slot_mapping` needs (sum of num_new).
 * @return #KVP_OK, #KVP_EINVAL (NULL, num_new[b] outside 0..length),
 *         #KVP_ENOENT (the detail names the batch index) or #KVP_ESTATE (a
 *         sequence is swapped out to a host tier). O(batch).
 */
KVP_API int kvp_table_export_size(kvp_table_t *table, const int32_t *seqs,
                                  int32_t batch, const int32_t *num_new,
                                  int64_t *num_indices, int64_t *num_slots);

/**
 * @brief Export a batch for the kernels: CSR page table and slot mapping.
 *
 * Fills `indptr[batch+1]`, `indices`, `last_page_len[batch]` in FlashInfer's
 * convention (#kvp_kv_view_t), and, when `slot_mapping` is given, the slots
 * of the last `num_new[b]` tokens of each sequence `b` in batch order (what
 * this step's appends returned, after any later copy-on-write), with
 * `qo_indptr` their offsets.
 *
 * @param[in,out] table   The table.
 * @param[in]     seqs    `batch` live sequence ids.
 * @param[in]     batch   >= 0.
 * @param[in]     num_new `batch` counts, or NULL (no rows).
 * @param[in]     buffers Where to write (see #kvp_batch_buffers_t).
 * @param[out]    view    Optional: filled to point at the buffers
 *                        (`view->struct_size` must be set).
 * @return #KVP_OK; #KVP_EINVAL (NULL, buffers too small, more than 2^31-1
 *         entries); #KVP_ENOENT; #KVP_ESTATE (a sequence is swapped out).
 *         Buffers are untouched on error.
 *         O(batch + pages + rows); never allocates.
 */
KVP_API int kvp_table_export(kvp_table_t *table, const int32_t *seqs, int32_t batch,
                             const int32_t *num_new, const kvp_batch_buffers_t *buffers,
                             kvp_kv_view_t *view);

/** @} */

/* ======================================================================== */
/**
 * @defgroup view Batch views and page operations
 * @brief What the page table hands to kernels and to the storage.
 * @{
 */

/**
 * @brief A batch of sequences' pages, in FlashInfer's CSR convention.
 *
 * Sequence `b` owns pages `indices[indptr[b]] .. indices[indptr[b+1]-1]`, in
 * token order, and its length is
 * `(indptr[b+1] - indptr[b] - 1) * page_size + last_page_len[b]`
 * (0 when it has no pages; then `last_page_len[b]` is 0).
 *
 * **Staging pages.** Page ids `0 .. num_pages-1` are pool pages. When the key
 * format is int8 or int4 (kvp_layout_t::needs_staging), a sequence's partly
 * filled last page lives in an fp16 staging page, whose id in `indices` is
 * `num_pages + slot` (slot `0 .. num_staging-1`). Kernels read an id
 * `>= num_pages` as an fp16 staging page and every other id in the pool's
 * formats. Full pool pages are never partly filled in such layouts.
 *
 * **Slot mapping.** The rows appended in a step are addressed by
 * `slot = page_id * page_size + offset` (int64, vLLM's convention); `page_id`
 * may be a staging id.
 *
 * The arrays belong to the caller (e.g. filled by the table's batch export);
 * the view only points at them. Plain fixed-width fields, for FFI. A view
 * made by hand sets `struct_size` to `sizeof(kvp_kv_view_t)`.
 */
struct kvp_kv_view {
    uint32_t struct_size;         /**< sizeof(kvp_kv_view_t), set by the caller, also when a
                                       function fills the view (kvp_table_export()). */
    int32_t batch;                /**< Number of sequences B. */
    int32_t page_size;            /**< Tokens per page. */
    int32_t num_pages;            /**< Pool pages; ids >= num_pages are staging pages. */
    int32_t num_staging;          /**< Staging pages (0 when the layout needs none). */
    int32_t reserved_;            /**< Must be 0 (checked by kvp_attention()). */
    const int32_t *indptr;        /**< [B+1] offsets into indices; indptr[0] = 0. */
    const int32_t *indices;       /**< [indptr[B]] page ids. */
    const int32_t *last_page_len; /**< [B] tokens in each sequence's last page, 1..page_size. */
};

/** @brief Page operation kinds (#kvp_page_op_t::kind). */
enum kvp_page_op_kind {
    /** Copy page `src` to page `dst` whole (elements and scales): the
     *  copy-on-write of a shared, partly filled pool page before an append
     *  writes into it, or a fork's copy of a staging page. */
    KVP_OP_COPY = 0,
    /** Pool page `dst` is completed by this step's append (staging layouts
     *  only): its first `count` tokens are in staging page `src` (fp16; `src`
     *  is -1 when `count` is 0), the other `page_size - count` are the
     *  appended rows `row .. row + page_size - count - 1`, whose slots point
     *  into `dst`. The append quantizes the whole page into `dst`, and does so
     *  before it writes any row into a staging page (`src` may receive this
     *  step's later tokens). */
    KVP_OP_SEAL = 1,
    /** Dequantize the first `count` tokens of pool page `src` into staging
     *  page `dst` (staging layouts only): a truncation reopened a sealed page.
     *  Lossy by nature: the tokens come back as their quantized values. */
    KVP_OP_UNSEAL = 2,
    /** Copy device page `src` (pool or staging) to host slot `dst` of the
     *  host tier (kvp_tier_swap_out()): bytes `[row x slot_bytes, row x
     *  slot_bytes + n)` of the page, `n = min(slot_bytes, its size - row x
     *  slot_bytes)`, where its size is `page_bytes` or `staging_page_bytes`
     *  (#kvp_tier_stats_t::slot_bytes; `row` is 0 for pool pages). `count` is
     *  the tokens of the sequence the page holds. Execute before any later
     *  call allocates pages: `src` is already free in the pool. */
    KVP_OP_SWAP_OUT = 3,
    /** Copy host slot `src` of the host tier back into device page `dst`
     *  (kvp_tier_swap_in()): the same byte range as #KVP_OP_SWAP_OUT, with
     *  `row` the chunk index and `count` the tokens. Execute before kernels
     *  read `dst`, and before a later swap-out writes host slot `src` (it is
     *  free again). */
    KVP_OP_SWAP_IN = 4
};

/**
 * @brief A data operation the page table (or the host tier) asks the
 *        storage to perform.
 *
 * The table touches no tensor memory. When a call changes where tokens live
 * (fork, copy-on-write, a staging page filling, a truncation into a sealed
 * page) it returns these operations. #KVP_OP_COPY and #KVP_OP_UNSEAL are
 * executed on the storage before the next append or kernel reads the pages,
 * in the order given; #KVP_OP_SEAL operations are executed by the append
 * they belong to. A host tier without page I/O returns #KVP_OP_SWAP_OUT and
 * #KVP_OP_SWAP_IN operations (kvp_tier_swap_out(), kvp_tier_swap_in()).
 * Execute all operations in the order the calls returned them.
 */
struct kvp_page_op {
    int32_t kind;  /**< A #kvp_page_op_kind. */
    int32_t src;   /**< Source page id (pool or staging), or -1; #KVP_OP_SWAP_IN: a host slot. */
    int32_t dst;   /**< Destination page id (pool or staging); #KVP_OP_SWAP_OUT: a host slot. */
    int32_t count; /**< Tokens taken from `src` (swaps: tokens the page holds). */
    int32_t row;   /**< #KVP_OP_SEAL: first appended row landing in `dst`; swaps: the chunk
                        index within the page (0 for pool pages); else -1. */
};

/** @} */

/* ======================================================================== */
/**
 * @defgroup store Page store
 * @brief The page arena: formats, appends (quantize on write), page operations.
 *
 * A store (#kvp_store_t) is the page arena on a backend: host memory
 * (kvp_store_create()) or a CUDA device (kvp_cuda_store_create() in
 * kvpage_cuda.h): one allocation holding every pool and staging page of
 * every layer, in the formats of docs/formats.md.
 *
 * The store functions below work on either backend with the same bytes and
 * the same results. On a CUDA store the *tensors* an engine passes (the rows
 * of kvp_append_params_t, the queries, outputs and log-sum-exp of
 * kvp_attention_params_t) are device pointers, while the *metadata* (slots,
 * page operations, the CSR view, `qo_indptr`) stays in host memory, where the
 * page table makes it and where it is checked before anything runs.
 * @{
 */

/**
 * @brief Order of the elements of a key block in a plain-element format
 *        (fp32, fp16, bf16, fp8_e4m3) and of staging keys
 *        (#kvp_store_params_t::k_order). int8 and int4 keys have one fixed
 *        layout (docs/formats.md); values are always token-major.
 */
enum kvp_k_order {
    /** `[token][head_dim]` within a block: FlashInfer's HND page layout, so
     *  outside kernels can read the pages. The default. */
    KVP_K_ORDER_TOKEN_MAJOR = 0,
    /** `[head_dim][token]` within a block: the logits of a page are plain
     *  vector multiply-adds with the query broadcast (no horizontal sums). */
    KVP_K_ORDER_DIM_MAJOR = 1
};

/** @brief Where a store keeps its arena and a context runs its kernels. */
enum kvp_backend {
    KVP_BACKEND_CPU = 0, /**< Host memory, CPU kernels (portable, AVX2, AVX-512). */
    KVP_BACKEND_CUDA = 1 /**< A CUDA device (kvpage_cuda.h). */
};

/**
 * @brief Inputs of kvp_store_create(). Fill with kvp_store_params_init().
 */
typedef struct kvp_store_params {
    uint32_t struct_size;  /**< sizeof(kvp_store_params_t); set by init. */
    int32_t layers;        /**< Transformer layers (required). */
    int32_t kv_heads;      /**< K/V heads per layer (required). */
    int32_t head_dim;      /**< Head dimension (required; see kvp_layout_compute()). */
    int32_t page_size;     /**< Tokens per page; default 16. */
    int32_t k_format;      /**< Key #kvp_format; default #KVP_FORMAT_FP16. */
    int32_t v_format;      /**< Value #kvp_format; default #KVP_FORMAT_FP16. */
    int32_t k_order;       /**< #kvp_k_order of plain-format and staging keys; default token-major. */
    uint64_t num_pages;    /**< Pool pages (required, >= 1, < 2^31 with the staging pages). */
    uint64_t num_staging;  /**< Staging pages; required >= 1 when the layout needs them, else ignored. */
    kvp_allocator_t allocator; /**< Host allocator for the arena and metadata; NULL hooks = libc. */
} kvp_store_params_t;

/**
 * @brief Fill `p` with defaults (fp16 K/V, page size 16, token-major keys,
 *        libc allocator) and set its struct_size. Shape and counts are zeroed.
 * @param[out] p Parameters to initialise; NULL is ignored.
 */
KVP_API void kvp_store_params_init(kvp_store_params_t *p);

/**
 * @brief Create a page arena: one allocation of exactly
 *        kvp_arena_bytes(layout, num_pages, num_staging) bytes, aligned to
 *        #KVP_ARENA_ALIGN.
 *
 * Element bytes hold whatever the allocator left until written (an append
 * or an operation writes them): reading them is memory-safe but meaningless
 * (@ref conventions, "Page bytes"); the fp8 scale table starts at 0,
 * meaning "not calibrated".
 *
 * @param[in]  params   Shape, formats, page counts, allocator.
 * @param[out] out      The new store; untouched on error.
 * @param[out] err      Optional error-detail buffer.
 * @param[in]  err_size Its size.
 * @return #KVP_OK; #KVP_EINVAL for a bad parameter (the detail names it);
 *         #KVP_ENOMEM when the arena or metadata cannot be allocated.
 *         Cost: the allocation, plus O(layers x kv_heads).
 */
KVP_API int kvp_store_create(const kvp_store_params_t *params, kvp_store_t **out,
                             char *err, size_t err_size);

/**
 * @brief Free a store and its arena. NULL is a no-op.
 * @param[in] store The store.
 */
KVP_API void kvp_store_destroy(kvp_store_t *store);

/**
 * @brief Detail of the most recent failed call on this store (sticky: see
 *        @ref conventions).
 * @param[in] store The store.
 * @return A NUL-terminated sentence owned by the store, "" if no call has
 *         failed, "NULL handle" for NULL. Valid until its next failed call.
 */
KVP_API const char *kvp_store_last_error(const kvp_store_t *store);

/**
 * @brief Rows of new K/V written by kvp_store_append(), for one layer.
 *
 * Row `r` of `k` holds `[kv_heads][head_dim]` elements of `dtype` at
 * `k + r * k_row_stride` (in elements), so K and V can be read straight out
 * of a fused QKV projection. It is written to slot `slots[r]`
 * (`page_id * page_size + offset`, see #kvp_kv_view_t); a negative slot
 * skips the row (padding).
 */
typedef struct kvp_append_params {
    uint32_t struct_size;       /**< sizeof(kvp_append_params_t); set by init. */
    int32_t layer;              /**< 0 .. layers-1. */
    int32_t rows;               /**< Number of new rows (>= 0). */
    int32_t dtype;              /**< #KVP_FORMAT_FP32, #KVP_FORMAT_FP16 or #KVP_FORMAT_BF16. */
    const void *k;              /**< Keys, rows x `[kv_heads][head_dim]`. */
    const void *v;              /**< Values, same shape. */
    int64_t k_row_stride;       /**< Elements between rows of `k`; 0 = kv_heads*head_dim. */
    int64_t v_row_stride;       /**< Elements between rows of `v`; 0 = kv_heads*head_dim. */
    const int64_t *slots;       /**< [rows] destination slots; negative = skip. */
    const kvp_page_op_t *ops;   /**< The step's page operations; #KVP_OP_SEAL ones are
                                     executed here, others are ignored. May be NULL. */
    int32_t num_ops;            /**< Entries in `ops`. */
    int32_t reserved_;          /**< Must be 0 (checked). */
} kvp_append_params_t;

/**
 * @brief Fill `a` with defaults (every field 0: no rows, dense strides, no
 *        operations) and set its struct_size.
 * @param[out] a The parameters; NULL is ignored.
 */
KVP_API void kvp_append_params_init(kvp_append_params_t *a);

/**
 * @brief Write this step's new K/V rows of one layer into their slots,
 *        quantizing on the way in.
 *
 * First the #KVP_OP_SEAL operations in `ops`, in order: each quantizes pool
 * page `dst` from the first `count` tokens of staging page `src` and the
 * appended rows `row .. row + page_size - count - 1` (whose slots must be
 * `dst*page_size + count ..`). Then every other row is written into its slot:
 * staging pages in fp16; pool pages in their format (only in layouts
 * without staging: per-channel keys need the whole page, so a staging
 * layout writes pool pages only through seals). fp8 scales still 0 are
 * calibrated from this call's rows first. Non-finite inputs follow the
 * format's rules (docs/formats.md) and are counted
 * (kvp_store_nonfinite_count(), kvpage_ext.h). Call once per layer with the same slots
 * and ops; apply #KVP_OP_COPY / #KVP_OP_UNSEAL first (kvp_store_apply_ops()).
 *
 * CUDA store: `k` and `v` are device pointers, `slots` and `ops` host
 * arrays; the work is enqueued on the store's stream (the slots and seals
 * are uploaded once for a run of calls with the same ones, e.g. every
 * layer of a step) and the call returns.
 *
 * @param[in,out] store The store.
 * @param[in]     a     The rows, slots and operations.
 * @return #KVP_OK; #KVP_EINVAL for NULL pointers, a bad layer, dtype, stride
 *         or struct_size, a slot or page id out of range, a row writing into
 *         a pool page of a staging layout without a seal, or a malformed
 *         seal. On error nothing is written. Cost: O(rows x kv_heads x
 *         head_dim) plus O(page_size x kv_heads x head_dim) per seal.
 */
KVP_API int kvp_store_append(kvp_store_t *store, const kvp_append_params_t *a);

/**
 * @brief Execute the #KVP_OP_COPY and #KVP_OP_UNSEAL operations of `ops`,
 *        in order, for every layer (#KVP_OP_SEAL entries are skipped: the
 *        append executes them).
 *
 * COPY copies page `src` to `dst` whole (both pool pages or both staging
 * pages). UNSEAL dequantizes the first `count` tokens of pool page `src`
 * into staging page `dst` as fp16.
 *
 * @param[in,out] store   The store.
 * @param[in]     ops     The operations (may be NULL when num_ops is 0).
 * @param[in]     num_ops Their number.
 * @return #KVP_OK; #KVP_EINVAL for an unknown kind, page ids out of range or
 *         of the wrong kind, a bad count, or UNSEAL without staging. All
 *         operations are checked before any is executed; #KVP_ECUDA for a
 *         CUDA failure (CUDA store: enqueued on its stream). Cost: one page
 *         of bytes per operation.
 */
KVP_API int kvp_store_apply_ops(kvp_store_t *store, const kvp_page_op_t *ops, int32_t num_ops);

/** @} */

/* ======================================================================== */
/**
 * @defgroup quant Quantize and dequantize plain tensors
 * @brief The store's block formats, for engines that keep their own storage.
 * @{
 */

/**
 * @brief Shape and format of blocks quantized from a plain tensor
 *        (kvp_quantize(), kvp_dequantize()), for engines that keep their own
 *        storage. Blocks are byte-identical to a store's blocks.
 */
typedef struct kvp_quant_desc {
    uint32_t struct_size; /**< Set by the caller to sizeof(kvp_quant_desc_t). */
    int32_t format;       /**< #kvp_format of the blocks. */
    int32_t is_value;     /**< 0: key blocks, 1: value blocks. */
    int32_t k_order;      /**< #kvp_k_order for plain-format keys. */
    int32_t page_size;    /**< Tokens per block (even for int4 keys). */
    int32_t head_dim;     /**< A multiple of 8, 8 .. #KVP_MAX_HEAD_DIM. */
    int32_t heads;        /**< Heads per token (>= 1). */
    int32_t dtype;        /**< Tensor element type: fp32, fp16 or bf16. */
    float fp8_scale;      /**< fp8_e4m3 only: the scale (> 0, finite). */
    int32_t reserved_;    /**< Must be 0 (checked). */
} kvp_quant_desc_t;

/**
 * @brief Bytes of one block of `desc` (scale data and padding included: the
 *        same as kvp_layout_t::k_block_bytes / v_block_bytes).
 * @param[in]  desc     The block description.
 * @param[out] bytes    Result.
 * @param[out] err      Optional error-detail buffer.
 * @param[in]  err_size Its size.
 * @return #KVP_OK or #KVP_EINVAL.
 */
KVP_API int kvp_quant_block_bytes(const kvp_quant_desc_t *desc, uint64_t *bytes, char *err,
                                  size_t err_size);

/**
 * @brief Quantize `pages` pages of a plain tensor into blocks.
 * @param[in]  desc     Format and shape.
 * @param[in]  src      `[pages*page_size][heads][head_dim]` elements of `dtype`.
 * @param[in]  pages    Number of pages (>= 1).
 * @param[out] dst      `[pages][heads]` blocks of kvp_quant_block_bytes() each;
 *                      every byte is written (the padding as zeros), so equal
 *                      inputs give equal bytes whatever `dst` held.
 * @param[out] err      Optional error-detail buffer.
 * @param[in]  err_size Its size.
 * @return #KVP_OK or #KVP_EINVAL (bad description, NULL, overflow); nothing
 *         written on error. Non-finite inputs follow docs/formats.md.
 */
KVP_API int kvp_quantize(const kvp_quant_desc_t *desc, const void *src, int64_t pages, void *dst,
                         char *err, size_t err_size);

/**
 * @brief Dequantize `pages` pages of blocks into a plain tensor.
 *
 * #KVP_FORMAT_INT4 values come back from their rotated basis (to within a
 * few units in the last place of the rotation's arithmetic), so the result
 * compares directly with what was quantized.
 * @param[in]  desc     Format and shape (as given to kvp_quantize()).
 * @param[in]  src      `[pages][heads]` blocks.
 * @param[in]  pages    Number of pages (>= 1).
 * @param[out] dst      `[pages*page_size][heads][head_dim]` elements of `dtype`.
 * @param[out] err      Optional error-detail buffer.
 * @param[in]  err_size Its size.
 * @return #KVP_OK or #KVP_EINVAL; nothing written on error.
 */
KVP_API int kvp_dequantize(const kvp_quant_desc_t *desc, const void *src, int64_t pages,
                           void *dst, char *err, size_t err_size);

/** @} */

/* ======================================================================== */
/**
 * @defgroup attention Execution context and paged attention
 * @brief Paged attention (decode and chunked prefill) over a store's pages.
 *
 * An execution context (#kvp_ctx_t) holds what attention runs with: worker
 * threads and a workspace on the CPU (kvp_ctx_create()), or a device,
 * stream and device workspace (kvp_cuda_ctx_create(), kvpage_cuda.h). A
 * context runs attention over stores of its own backend.
 * @{
 */

/** @brief Instruction sets the CPU kernels can use (#kvp_ctx_params_t::isa). */
enum kvp_isa {
    KVP_ISA_AUTO = 0,     /**< The best this CPU supports (chosen at run time). */
    KVP_ISA_PORTABLE = 1, /**< Plain C: the reference path. */
    KVP_ISA_AVX2 = 2,     /**< AVX2 + FMA + F16C. */
    KVP_ISA_AVX512 = 3,   /**< AVX-512 F/BW/VL + VNNI (integer dot products). */
    /** #KVP_ISA_AVX512 plus AVX-512 BF16: prefill attention over int4 and
     *  fp8 keys/values multiplies in bf16 (`vdpbf16ps`, twice the fp32 FMA
     *  rate): query, decoded K/V and softmax weights rounded to bf16 (at
     *  most 2^-9 relative), far below those formats' own rounding; every
     *  other path is #KVP_ISA_AVX512's. docs/formats.md gives the error. */
    KVP_ISA_AVX512_BF16 = 4,
    /** ARM64 Advanced SIMD (every AArch64 CPU): fp16/bf16/fp8 converted
     *  four lanes at a time and FMA'd, int8/int4 keys and values through
     *  integer dot products built from widening multiplies (`smull`). */
    KVP_ISA_NEON = 5,
    /** #KVP_ISA_NEON plus the ARMv8.2 dot-product instructions (`sdot`;
     *  Cortex-A76/A78, Neoverse N1 and later, Apple M1 and later): the
     *  same integer sums, exact, one instruction per 16 products. */
    KVP_ISA_NEON_DOTPROD = 6
};

/** @brief Number of values of #kvp_isa (valid values are 0 .. KVP_ISA_COUNT-1). */
#define KVP_ISA_COUNT 7

/** @brief Inputs of kvp_ctx_create(). Fill with kvp_ctx_params_init(). */
typedef struct kvp_ctx_params {
    uint32_t struct_size;     /**< sizeof(kvp_ctx_params_t); set by init. */
    int32_t threads;          /**< Threads that run kernels, caller included (1 .. 256); default 1. */
    int32_t isa;              /**< #kvp_isa; default #KVP_ISA_AUTO. */
    int32_t reserved_;        /**< Must be 0 (checked). */
    uint64_t workspace_bytes; /**< Split-KV partial results; default 16 MiB (0 = default). */
    kvp_allocator_t allocator; /**< Host allocator; NULL hooks = libc. */
} kvp_ctx_params_t;

/**
 * @brief Fill `p` with defaults (1 thread, automatic ISA, 16 MiB workspace)
 *        and set its struct_size.
 * @param[out] p Parameters to initialise; NULL is ignored.
 */
KVP_API void kvp_ctx_params_init(kvp_ctx_params_t *p);

/**
 * @brief Create an execution context: its `threads - 1` worker threads are
 *        started here, once, and its workspace allocated, so that
 *        kvp_attention() neither allocates nor spawns.
 * @param[in]  params   Threads, ISA, workspace, allocator.
 * @param[out] out      The new context; untouched on error.
 * @param[out] err      Optional error-detail buffer.
 * @param[in]  err_size Its size.
 * @return #KVP_OK; #KVP_EINVAL for bad parameters; #KVP_ENOTSUP when the
 *         requested ISA is not available on this CPU; #KVP_ENOMEM when memory
 *         or a thread cannot be had.
 */
KVP_API int kvp_ctx_create(const kvp_ctx_params_t *params, kvp_ctx_t **out, char *err,
                           size_t err_size);

/**
 * @brief Stop the worker threads and free the context. NULL is a no-op.
 * @param[in] ctx The context.
 */
KVP_API void kvp_ctx_destroy(kvp_ctx_t *ctx);

/**
 * @brief Detail of the most recent failed call on this context (sticky: see
 *        @ref conventions).
 * @param[in] ctx The context.
 * @return A NUL-terminated sentence owned by the context, "" if no call has
 *         failed, "NULL handle" for NULL. Valid until its next failed call.
 */
KVP_API const char *kvp_ctx_last_error(const kvp_ctx_t *ctx);

/**
 * @brief Inputs of kvp_attention(). Fill with kvp_attention_params_init().
 *
 * Sequence `b` of the view brings query rows `qo_indptr[b] .. qo_indptr[b+1]-1`
 * (FlashInfer's convention), the last `q_len` tokens of the sequence, whose
 * K/V are already in the store. Row `i` of a sequence of length `n` is at
 * position `n - q_len + i`; with `causal` it attends to positions
 * `<= n - q_len + i`, and with a window also `>= n - q_len + i - window_left`.
 */
struct kvp_attention_params {
    uint32_t struct_size;     /**< sizeof(kvp_attention_params_t); set by init. */
    int32_t layer;            /**< 0 .. layers-1. */
    int32_t q_heads;          /**< Query heads: a multiple of the store's kv_heads (GQA/MQA),
                                   at most 65536, with qo_indptr[batch] x q_heads < 2^31.
                                   Query head `h` reads kv head `h / (q_heads / kv_heads)`:
                                   consecutive query heads share a kv head, as in Llama. */
    int32_t dtype;            /**< Type of q and out: fp32, fp16 or bf16; default fp32. */
    int32_t causal;           /**< 1 (default): causal mask; 0: every token of the sequence. */
    int32_t window_left;      /**< Sliding window (tokens to the left); -1 (default) = none. */
    float sm_scale;           /**< Softmax scale applied to q.k (> 0); 0 (default) means
                                   1/sqrt(head_dim). */
    float logit_soft_cap;     /**< If > 0: logits become cap * tanh(logit / cap) (Gemma 2). */
    const int32_t *qo_indptr; /**< [batch+1] query row offsets, qo_indptr[0] = 0, non-decreasing
                                   (the view's `batch`; its length is not checkable). */
    const void *q;            /**< [qo_indptr[batch]][q_heads][head_dim] queries; the library
                                   trusts this length (it cannot check it). */
    void *out;                /**< Same shape: the attention output (length trusted too). */
    float *lse;               /**< Optional [rows][q_heads] log-sum-exp of the scaled logits
                                   (natural log); length trusted. */
};

/**
 * @brief Fill `p` with defaults (fp32, causal, no window, softmax scale
 *        1/sqrt(head_dim), no soft cap) and set its struct_size; pointers,
 *        layer and q_heads are zeroed.
 * @param[out] p Parameters to initialise; NULL is ignored.
 */
KVP_API void kvp_attention_params_init(kvp_attention_params_t *p);

/**
 * @brief Paged attention over the pages of a batch (decode and chunked
 *        prefill), reading every format with dequantization fused into the
 *        dot products, fp32 accumulation and online softmax.
 *
 * Work is split over (sequence, kv head, range of pages); long sequences are
 * split across threads and merged (flash-decoding). The query heads of one
 * GQA group share each K/V load. On the AVX-512 path int8/int4 keys and
 * values use integer dot products (VNNI); their added error is bounded in
 * docs/formats.md. A sequence with at least 32 query rows per kv head
 * (q_len x GQA group: a prefill chunk) goes, without a soft cap, through
 * prefill blocks instead (portable path and #KVP_ISA_AVX512_BF16: every
 * format; AVX2: fp32, fp16, bf16, fp8; AVX-512: those and int8, and int4
 * with pages under 32 tokens): its K/V are decoded exactly to fp32 once per
 * 32 tokens and multiplied as small matrices in fp32; on AVX-512, int8
 * keys and values (pages of a multiple of 16 tokens) are multiplied as
 * codes in decode's integer forms, and with #KVP_ISA_AVX512_BF16 int4 and
 * fp8 K/V in bf16 (docs/formats.md).
 * Thread-safe only with distinct contexts.
 *
 * **CUDA** (a CUDA context and store on the same device): `q`, `out` and
 * `lse` are device pointers; the view and `qo_indptr` are host arrays,
 * checked here and uploaded on the context's stream (once for a run of
 * calls with the same view, e.g. every layer of a step). The call enqueues
 * the kernels and returns; `out` is ready when the stream is.
 *
 * @param[in,out] ctx    Context (threads, workspace); its last error gets the detail.
 * @param[in]     store  The store holding the pages.
 * @param[in]     view   The batch's pages (CSR), from the page table.
 * @param[in]     params Queries, output, scale, masks.
 * @return #KVP_OK; #KVP_EINVAL for NULL pointers, shapes that disagree with
 *         the store (page size, page counts, q_heads), a page id out of range,
 *         a last_page_len outside 1..page_size, more query rows than tokens,
 *         a sequence over 2^31 - 1 tokens, q_heads over 65536 or
 *         qo_indptr[batch] x q_heads over 2^31 - 1, or a negative or
 *         non-finite scale; #KVP_ENOTSUP for a head_dim
 *         the kernels do not support (64, 80, 96, 128, 256 are); #KVP_EINVAL when the context
 *         and the store are of different backends or devices; #KVP_ENOMEM
 *         when the schedule or the uploaded view exceed the context's
 *         workspace; #KVP_ECUDA for a CUDA failure. On error `out` is not
 *         written. Cost (CPU): one read of the batch's K/V bytes per 32 query
 *         rows of a kv head; (CUDA): per 8 rows. No allocation.
 */
KVP_API int kvp_attention(kvp_ctx_t *ctx, const kvp_store_t *store, const kvp_kv_view_t *view,
                          const kvp_attention_params_t *params);

/** @} */

#ifdef __cplusplus
}
#endif

#endif /* KVPAGE_H */
