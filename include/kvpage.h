/**
 * @file kvpage.h
 * @brief libkvpage — KV-cache management for LLM inference engines.
 *
 * One header for the whole public C API. docs/concepts.md explains the ideas;
 * docs/formats.md the byte layout of every format.
 */
#ifndef KVPAGE_H
#define KVPAGE_H

#include <stddef.h>
#include <stdint.h>

/**
 * @mainpage libkvpage
 *
 * libkvpage manages the KV cache of an LLM inference engine: how many tokens
 * fit in a memory budget (layer `plan`), where each token's keys and values
 * live (pages), in which precision (formats), and what happens when memory
 * runs out.
 *
 * @section conventions Conventions
 *
 * - Every fallible function returns an `int` status: #KVP_OK (0) or a
 *   negative `KVP_E*` code (see #kvp_status). Results come back through
 *   out-parameters, which are left untouched on failure.
 * - Functions that belong to no object take an optional error buffer
 *   (`char *err, size_t err_size`; NULL/0 means "no detail wanted"). On
 *   failure a one-line, NUL-terminated explanation is written there (e.g.
 *   which argument was bad). #KVP_ERR_SIZE bytes always suffice.
 * - Parameter and result structs start with `uint32_t struct_size`, which the
 *   caller sets to `sizeof` the struct it was compiled with (the
 *   `*_params_init()` functions do it). The library reads and writes only the
 *   bytes the caller declared, so fields can be appended in later minor
 *   versions without breaking the ABI.
 * - No public struct contains bitfields, unions or enums: enumerated values are
 *   stored as `int32_t`. Bindings (ctypes, cffi, bindgen, cgo) mirror the
 *   structs mechanically.
 *
 * @section threads Thread safety
 *
 * Functions without an object argument are thread-safe. An object (pool,
 * table, store, …) may be used from several threads only if the caller
 * serialises the calls, unless a function's documentation says otherwise.
 * The library has no global mutable state.
 *
 * @section memory Memory
 *
 * The library allocates host memory only through the #kvp_allocator_t hooks
 * given when an object is created (NULL hooks mean libc). It never aborts,
 * exits or prints.
 */

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Export macro                                                              */
/* ------------------------------------------------------------------------ */

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
#define KVP_VERSION_MINOR 1
/** @brief Patch version: fixes only. */
#define KVP_VERSION_PATCH 0
/** @brief The version as one number: MAJOR*10000 + MINOR*100 + PATCH. */
#define KVP_VERSION_NUMBER \
    (KVP_VERSION_MAJOR * 10000 + KVP_VERSION_MINOR * 100 + KVP_VERSION_PATCH)

/** @cond KVP_INTERNAL */
#define KVP__STR2(x) #x
#define KVP__STR(x) KVP__STR2(x)
/** @endcond */

/** @brief The version as a string, e.g. "0.1.0". */
#define KVP_VERSION_STRING                                                    \
    KVP__STR(KVP_VERSION_MAJOR) "." KVP__STR(KVP_VERSION_MINOR) "." KVP__STR( \
        KVP_VERSION_PATCH)

/**
 * @brief Version of the library actually loaded at run time.
 * @return #KVP_VERSION_NUMBER of the library that was built; compare with the
 *         header's macro to detect a mismatched shared object.
 */
KVP_API unsigned kvp_version_number(void);

/**
 * @brief Version string of the library actually loaded at run time.
 * @return A static string such as "0.1.0"; never NULL.
 */
KVP_API const char *kvp_version_string(void);

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
    X(KVP_EINTERNAL, -9, "internal error in libkvpage (please report)")

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

/** @brief Recommended size of an error-detail buffer (`char err[KVP_ERR_SIZE]`). */
#define KVP_ERR_SIZE 256

/**
 * @brief A short human-readable message for a status code.
 * @param[in] status A value returned by a libkvpage function.
 * @return A static string; "unknown status" for values not in the table.
 */
KVP_API const char *kvp_strerror(int status);

/**
 * @brief The symbolic name of a status code, e.g. "KVP_ENOSPC".
 * @param[in] status A value returned by a libkvpage function.
 * @return A static string; "KVP_UNKNOWN" for values not in the table.
 */
KVP_API const char *kvp_status_name(int status);

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
/* KV formats                                                                */
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
    KVP_FORMAT_INT4 = 5      /**< K: asymmetric per channel over a page; V: asymmetric per 32-wide group. */
};

/** @brief Number of formats in #kvp_format (valid values are 0 .. KVP_FORMAT_COUNT-1). */
#define KVP_FORMAT_COUNT 6

/**
 * @brief The canonical name of a format ("fp32", "fp16", "bf16", "fp8_e4m3",
 *        "int8", "int4").
 * @param[in] format A #kvp_format value.
 * @return A static string, or NULL if `format` is not a known format.
 */
KVP_API const char *kvp_format_name(int32_t format);

/**
 * @brief Parse a format name (case-insensitive; "fp8" is accepted for
 *        "fp8_e4m3").
 * @param[in]  name     The name.
 * @param[out] format   The #kvp_format value.
 * @param[out] err      Optional error-detail buffer.
 * @param[in]  err_size Its size in bytes.
 * @return #KVP_OK, or #KVP_EINVAL for NULL arguments or an unknown name.
 */
KVP_API int kvp_format_parse(const char *name, int32_t *format, char *err,
                             size_t err_size);

/* ------------------------------------------------------------------------ */
/* Page layout and arena size (the one byte-count function)                  */
/* ------------------------------------------------------------------------ */

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

/**
 * @brief Compute the exact byte counts of a page.
 *
 * @param[in]  layers    1 .. 65536.
 * @param[in]  kv_heads  1 .. 65536.
 * @param[in]  head_dim  A multiple of 8, 8 .. #KVP_MAX_HEAD_DIM.
 * @param[in]  page_size 1 .. #KVP_MAX_PAGE_SIZE; even for int4 keys (two
 *                       tokens share a byte along a channel).
 * @param[in]  k_format  #kvp_format of keys.
 * @param[in]  v_format  #kvp_format of values.
 * @param[out] out       Result; `out->struct_size` must be set.
 * @param[out] err       Optional error-detail buffer.
 * @param[in]  err_size  Its size.
 * @return #KVP_OK or #KVP_EINVAL (bad value, unusable page size, overflow).
 *         O(1).
 */
KVP_API int kvp_layout_compute(int32_t layers, int32_t kv_heads,
                               int32_t head_dim, int32_t page_size,
                               int32_t k_format, int32_t v_format,
                               kvp_layout_t *out, char *err, size_t err_size);

/**
 * @brief Bytes of a page arena holding `num_pages` pool pages and
 *        `num_staging` staging pages.
 *
 * `fixed_bytes + num_pages*page_bytes + num_staging*staging_page_bytes`,
 * with an overflow check. This is exactly what the page arena allocates.
 *
 * @param[in]  layout      From kvp_layout_compute().
 * @param[in]  num_pages   Pool pages.
 * @param[in]  num_staging Staging pages (ignored when the layout needs none).
 * @param[out] bytes       The arena size.
 * @param[out] err         Optional error-detail buffer.
 * @param[in]  err_size    Its size.
 * @return #KVP_OK or #KVP_EINVAL (NULL, invalid layout, overflow).
 */
KVP_API int kvp_arena_bytes(const kvp_layout_t *layout, uint64_t num_pages,
                            uint64_t num_staging, uint64_t *bytes, char *err,
                            size_t err_size);

/* ------------------------------------------------------------------------ */
/* Planner                                                                   */
/* ------------------------------------------------------------------------ */

/**
 * @brief Inputs of the capacity planner. Fill with kvp_plan_params_init().
 *
 * The KV budget is either `kv_budget_bytes` (when non-zero) or
 * `floor(memory_bytes * utilization) - weight_bytes - reserve_bytes`.
 */
typedef struct kvp_plan_params {
    uint32_t struct_size;     /**< sizeof(kvp_plan_params_t); set by init. */
    int32_t layers;           /**< Transformer layers (required). */
    int32_t kv_heads;         /**< K/V heads per layer (required). */
    int32_t head_dim;         /**< Head dimension (required). */
    int32_t q_heads;          /**< Query heads; 0 = unknown. If set, a multiple of kv_heads. */
    int32_t k_format;         /**< Key format; default #KVP_FORMAT_FP16. */
    int32_t v_format;         /**< Value format; default #KVP_FORMAT_FP16. */
    int32_t page_size;        /**< Tokens per page; default 16. */
    uint64_t context;         /**< Tokens per sequence for the concurrency figures; 0 = none. */
    uint64_t kv_budget_bytes; /**< Direct KV budget; 0 = derive from memory. */
    uint64_t memory_bytes;    /**< Device memory (used when kv_budget_bytes is 0). */
    uint64_t weight_bytes;    /**< Model weights resident in that memory. */
    uint64_t reserve_bytes;   /**< Activations, workspace, runtime; default 0. */
    double utilization;       /**< Fraction of memory_bytes the engine may use; default 0.90. */
} kvp_plan_params_t;

/**
 * @brief Fill `p` with defaults (fp16 K/V, page size 16, utilization 0.90)
 *        and set its struct_size. Shape and memory fields are zeroed.
 * @param[out] p Parameters to initialise; NULL is ignored.
 */
KVP_API void kvp_plan_params_init(kvp_plan_params_t *p);

/**
 * @brief Result of the capacity planner.
 *
 * With the staging scheme (K int8/int4) a sequence of `context` tokens holds
 * `floor(context/page_size)` pool pages plus one staging page; otherwise
 * `ceil(context/page_size)` pool pages.
 */
typedef struct kvp_plan {
    uint32_t struct_size;         /**< Set by the caller to sizeof(kvp_plan_t). */
    int32_t k_format;             /**< Echo of the key format. */
    int32_t v_format;             /**< Echo of the value format. */
    int32_t page_size;            /**< Echo of the page size. */
    int32_t needs_staging;        /**< 1 if each sequence holds an fp16 staging page. */
    int32_t reserved_;            /**< Padding; always 0. */
    uint64_t kv_budget_bytes;     /**< Bytes available to the KV cache. */
    uint64_t bytes_per_token;     /**< Element bytes per token, all layers, K+V, before scales:
                                       layers*kv_heads*head_dim*(k_bits+v_bits)/8 — for one
                                       format, 2 x layers x kv_heads x head_dim x bytes. */
    double bytes_per_token_stored;/**< Stored bytes per token, scales and padding included:
                                       page_bytes / page_size. */
    double bytes_per_token_per_layer; /**< bytes_per_token_stored / layers. */
    uint64_t page_bytes;          /**< One page, all layers, K and V (kvp_layout_t::page_bytes). */
    uint64_t staging_page_bytes;  /**< One staging page, or 0 (kvp_layout_t::staging_page_bytes). */
    uint64_t fixed_bytes;         /**< Per-arena bytes (kvp_layout_t::fixed_bytes). */
    uint64_t num_pages;           /**< Pool pages the budget holds (after staging pages). */
    uint64_t num_staging;         /**< Staging pages reserved (max_seqs when staging is needed). */
    uint64_t arena_bytes;         /**< kvp_arena_bytes(num_pages, num_staging) <= kv_budget_bytes. */
    uint64_t max_tokens;          /**< num_pages * page_size. */
    uint64_t context;             /**< Echo of the context length. */
    uint64_t pages_per_seq;       /**< Pool pages one sequence of `context` tokens holds. */
    uint64_t seq_bytes;           /**< Bytes one such sequence holds (its pages + staging page). */
    uint64_t max_seqs;            /**< Sequences of `context` tokens that fit at once; 0 if context is 0. */
} kvp_plan_t;

/**
 * @brief Compute how many pages, tokens and concurrent sequences fit.
 *
 * @param[in]  params   Inputs (see #kvp_plan_params_t).
 * @param[out] plan     Result; `plan->struct_size` must be set. Untouched on error.
 * @param[out] err      Optional error-detail buffer; says which input is bad.
 * @param[in]  err_size Its size.
 * @return #KVP_OK, or #KVP_EINVAL for a bad or inconsistent input: zero sizes,
 *         q_heads not a multiple of kv_heads, utilization outside (0, 1],
 *         weights plus reserve larger than usable memory, a budget smaller
 *         than one page (plus one staging page when needed), or products that
 *         overflow 64 bits. O(1).
 */
KVP_API int kvp_plan_compute(const kvp_plan_params_t *params, kvp_plan_t *plan,
                             char *err, size_t err_size);

/**
 * @brief A public model configuration known to the planner.
 */
typedef struct kvp_model_preset {
    uint32_t struct_size;   /**< Set by the caller to sizeof(kvp_model_preset_t). */
    const char *name;       /**< Preset name, e.g. "llama-3.1-8b". */
    const char *source;     /**< Where the numbers come from (the model's config). */
    int32_t layers;         /**< num_hidden_layers. */
    int32_t q_heads;        /**< num_attention_heads. */
    int32_t kv_heads;       /**< num_key_value_heads. */
    int32_t head_dim;       /**< Head dimension. */
    int32_t max_context;    /**< max_position_embeddings. */
    int32_t reserved_;      /**< Padding; always 0. */
    uint64_t params;        /**< Parameter count (for the weight size). */
} kvp_model_preset_t;

/** @brief Number of model presets. @return The count (> 0). */
KVP_API int32_t kvp_preset_count(void);

/**
 * @brief Get a model preset by index.
 * @param[in]  index 0 .. kvp_preset_count()-1.
 * @param[out] out   Result; `out->struct_size` must be set.
 * @return #KVP_OK or #KVP_EINVAL (NULL, bad struct_size, index out of range).
 */
KVP_API int kvp_preset_get(int32_t index, kvp_model_preset_t *out);

/**
 * @brief Find a model preset by name (case-insensitive).
 * @param[in]  name     e.g. "llama-3.1-8b".
 * @param[out] out      Result; `out->struct_size` must be set.
 * @param[out] err      Optional error-detail buffer (lists the known names).
 * @param[in]  err_size Its size.
 * @return #KVP_OK, #KVP_ENOENT for an unknown name, #KVP_EINVAL for NULL.
 */
KVP_API int kvp_preset_find(const char *name, kvp_model_preset_t *out,
                            char *err, size_t err_size);

/** @brief A GPU (or device) memory size known to the planner. */
typedef struct kvp_gpu_preset {
    uint32_t struct_size;  /**< Set by the caller to sizeof(kvp_gpu_preset_t). */
    int32_t reserved_;     /**< Padding; always 0. */
    const char *name;      /**< e.g. "h100-80g". */
    const char *description; /**< The product, and what the memory figure is. */
    uint64_t memory_bytes; /**< Device memory in bytes. */
} kvp_gpu_preset_t;

/** @brief Number of GPU presets. @return The count (> 0). */
KVP_API int32_t kvp_gpu_count(void);

/**
 * @brief Get a GPU preset by index.
 * @param[in]  index 0 .. kvp_gpu_count()-1.
 * @param[out] out   Result; `out->struct_size` must be set.
 * @return #KVP_OK or #KVP_EINVAL.
 */
KVP_API int kvp_gpu_get(int32_t index, kvp_gpu_preset_t *out);

/**
 * @brief Find a GPU preset by name (case-insensitive).
 * @param[in]  name     e.g. "h200-141g".
 * @param[out] out      Result; `out->struct_size` must be set.
 * @param[out] err      Optional error-detail buffer (lists the known names).
 * @param[in]  err_size Its size.
 * @return #KVP_OK, #KVP_ENOENT for an unknown name, #KVP_EINVAL for NULL.
 */
KVP_API int kvp_gpu_find(const char *name, kvp_gpu_preset_t *out, char *err,
                         size_t err_size);

/**
 * @brief Weight bytes of a model from its parameter count and weight type.
 *
 * Weight types: "fp32" (4 bytes), "fp16"/"bf16" (2), "fp8"/"int8" (1),
 * "int4" (4.25 bits: 4-bit weights plus a 16-bit scale per group of 64).
 *
 * @param[in]  params      Parameter count (> 0).
 * @param[in]  weight_type One of the names above (case-insensitive).
 * @param[out] bytes       Result, rounded up.
 * @param[out] err         Optional error-detail buffer.
 * @param[in]  err_size    Its size.
 * @return #KVP_OK or #KVP_EINVAL.
 */
KVP_API int kvp_weight_bytes(uint64_t params, const char *weight_type,
                             uint64_t *bytes, char *err, size_t err_size);

/**
 * @brief Parse a byte size such as "80GiB", "24GB", "512MiB", "1.5T" or
 *        "4096".
 *
 * Suffixes (case-insensitive): B; KB/MB/GB/TB are powers of 1000;
 * KiB/MiB/GiB/TiB and the bare K/M/G/T are powers of 1024. A decimal
 * fraction is allowed before a suffix; the result is rounded down to whole
 * bytes. Surrounding spaces are allowed; anything else is rejected.
 *
 * @param[in]  text     The text.
 * @param[out] bytes    Result (> 0).
 * @param[out] err      Optional error-detail buffer.
 * @param[in]  err_size Its size.
 * @return #KVP_OK or #KVP_EINVAL (NULL, empty, not a number, unknown
 *         suffix, zero, negative, or larger than 2^64-1).
 */
KVP_API int kvp_parse_size(const char *text, uint64_t *bytes, char *err,
                           size_t err_size);

/* ------------------------------------------------------------------------ */
/* Paged-KV views: what the page table hands to kernels                      */
/* ------------------------------------------------------------------------ */

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
 * the view only points at them. Plain fixed-width fields, for FFI.
 */
typedef struct kvp_kv_view {
    int32_t batch;                /**< Number of sequences B. */
    int32_t page_size;            /**< Tokens per page. */
    int32_t num_pages;            /**< Pool pages; ids >= num_pages are staging pages. */
    int32_t num_staging;          /**< Staging pages (0 when the layout needs none). */
    const int32_t *indptr;        /**< [B+1] offsets into indices; indptr[0] = 0. */
    const int32_t *indices;       /**< [indptr[B]] page ids. */
    const int32_t *last_page_len; /**< [B] tokens in each sequence's last page, 1..page_size. */
} kvp_kv_view_t;

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
    KVP_OP_UNSEAL = 2
};

/**
 * @brief A data operation the page table asks the storage to perform.
 *
 * The table touches no tensor memory. When a call changes where tokens live
 * (fork, copy-on-write, a staging page filling, a truncation into a sealed
 * page) it returns these operations. #KVP_OP_COPY and #KVP_OP_UNSEAL are
 * executed on the storage before the next append or kernel reads the pages,
 * in the order given; #KVP_OP_SEAL operations are executed by the append
 * they belong to.
 */
typedef struct kvp_page_op {
    int32_t kind;  /**< A #kvp_page_op_kind. */
    int32_t src;   /**< Source page id (pool or staging), or -1. */
    int32_t dst;   /**< Destination page id (pool or staging). */
    int32_t count; /**< Tokens taken from `src`. */
    int32_t row;   /**< #KVP_OP_SEAL: first appended row landing in `dst`; else -1. */
} kvp_page_op_t;

/* ------------------------------------------------------------------------ */
/* Store: the page arena                                                     */
/* ------------------------------------------------------------------------ */

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

/** @brief Opaque page arena on a backend (CPU here). */
typedef struct kvp_store kvp_store_t;

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
 * Element bytes are undefined until written (an append or an operation
 * writes them); the fp8 scale table starts at 0, meaning "not calibrated".
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
 * @brief Detail text of the last failed call on this store.
 * @param[in] store The store (NULL gives "").
 * @return A NUL-terminated string owned by the store, valid until its next
 *         call; "" when the last call succeeded or nothing failed yet.
 */
KVP_API const char *kvp_store_last_error(const kvp_store_t *store);

/**
 * @brief The store's page layout (the byte counts kvp_layout_compute() gives).
 * @param[in]  store The store.
 * @param[out] out   Result; `out->struct_size` must be set.
 * @return #KVP_OK or #KVP_EINVAL (NULL, bad struct_size).
 */
KVP_API int kvp_store_layout(const kvp_store_t *store, kvp_layout_t *out);

/**
 * @brief The arena: its base address and size in bytes.
 * @param[in]  store The store.
 * @param[out] base  Base address (aligned to #KVP_ARENA_ALIGN).
 * @param[out] bytes Size: exactly kvp_arena_bytes() of the store's layout.
 * @return #KVP_OK or #KVP_EINVAL (NULL).
 */
KVP_API int kvp_store_arena(const kvp_store_t *store, void **base, uint64_t *bytes);

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
 * token_stride = dim_stride = 0: their bytes are in docs/formats.md.
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
 *         format is not fp8_e4m3.
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
 * @return #KVP_OK or #KVP_EINVAL (bad arguments, side not fp8_e4m3).
 */
KVP_API int kvp_store_get_fp8_scale(const kvp_store_t *store, int32_t layer,
                                    int32_t kv_head, int32_t is_value, float *scale);

/**
 * @brief Rows of new K/V written by kvp_store_append(), for one layer.
 *
 * Row `r` of `k` holds `[kv_heads][head_dim]` elements of `dtype` at
 * `k + r * k_row_stride` (in elements), so K and V can be read straight out
 * of a fused QKV projection. It is written to slot `slots[r]`
 * (`page_id * page_size + offset`, see #kvp_kv_view_t); a negative slot
 * skips the row (padding).
 */
typedef struct kvp_append {
    uint32_t struct_size;       /**< sizeof(kvp_append_t); set by kvp_append_init(). */
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
    int32_t reserved_;          /**< Must be 0. */
} kvp_append_t;

/**
 * @brief Zero `a` and set its struct_size.
 * @param[out] a The struct; NULL is ignored.
 */
KVP_API void kvp_append_init(kvp_append_t *a);

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
 * (kvp_store_nonfinite_count()). Call once per layer with the same slots
 * and ops; apply #KVP_OP_COPY / #KVP_OP_UNSEAL first (kvp_store_apply_ops()).
 *
 * @param[in,out] store The store.
 * @param[in]     a     The rows, slots and operations.
 * @return #KVP_OK; #KVP_EINVAL for NULL pointers, a bad layer, dtype, stride
 *         or struct_size, a slot or page id out of range, a row writing into
 *         a pool page of a staging layout without a seal, or a malformed
 *         seal. On error nothing is written. Cost: O(rows x kv_heads x
 *         head_dim) plus O(page_size x kv_heads x head_dim) per seal.
 */
KVP_API int kvp_store_append(kvp_store_t *store, const kvp_append_t *a);

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
 *         operations are checked before any is executed. Cost: one page of
 *         bytes per operation.
 */
KVP_API int kvp_store_apply_ops(kvp_store_t *store, const kvp_page_op_t *ops, int32_t num_ops);

/**
 * @brief Dequantize tokens of one page to fp32, for inspection and tests.
 * @param[in]  store   The store.
 * @param[in]  layer   0 .. layers-1.
 * @param[in]  page    A pool page id, or a staging id (>= num_pages).
 * @param[in]  token0  First token, 0 .. page_size-1.
 * @param[in]  count   Tokens, token0 + count <= page_size.
 * @param[out] k       `[count][kv_heads][head_dim]` keys, or NULL.
 * @param[out] v       `[count][kv_heads][head_dim]` values, or NULL.
 * @return #KVP_OK or #KVP_EINVAL (bad ids, range or pointers). Not a hot path.
 */
KVP_API int kvp_store_read(const kvp_store_t *store, int32_t layer, int32_t page,
                           int32_t token0, int32_t count, float *k, float *v);

/**
 * @brief Non-finite inputs (NaN, +-Inf) the store has been given so far by
 *        appends and seals. They are stored by the format's rules, never
 *        spread to other elements' scales (docs/formats.md).
 * @param[in] store The store (NULL gives 0).
 * @return The count since creation.
 */
KVP_API uint64_t kvp_store_nonfinite_count(const kvp_store_t *store);

/* ------------------------------------------------------------------------ */
/* Quantize / dequantize plain tensors                                       */
/* ------------------------------------------------------------------------ */

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
    int32_t reserved_;    /**< Must be 0. */
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
 * @param[out] dst      `[pages][heads]` blocks of kvp_quant_block_bytes() each.
 * @param[out] err      Optional error-detail buffer.
 * @param[in]  err_size Its size.
 * @return #KVP_OK or #KVP_EINVAL (bad description, NULL, overflow); nothing
 *         written on error. Non-finite inputs follow docs/formats.md.
 */
KVP_API int kvp_quantize(const kvp_quant_desc_t *desc, const void *src, int64_t pages, void *dst,
                         char *err, size_t err_size);

/**
 * @brief Dequantize `pages` pages of blocks into a plain tensor.
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

/* ------------------------------------------------------------------------ */
/* Execution context and paged attention                                     */
/* ------------------------------------------------------------------------ */

/** @brief Opaque execution context: worker threads and workspace. */
typedef struct kvp_ctx kvp_ctx_t;

/** @brief Instruction sets the CPU kernels can use (#kvp_ctx_params_t::isa). */
enum kvp_isa {
    KVP_ISA_AUTO = 0,     /**< The best this CPU supports (chosen at run time). */
    KVP_ISA_PORTABLE = 1, /**< Plain C: the reference path. */
    KVP_ISA_AVX2 = 2,     /**< AVX2 + FMA + F16C. */
    KVP_ISA_AVX512 = 3    /**< AVX-512 F/BW/VL + VNNI (integer dot products). */
};

/** @brief Inputs of kvp_ctx_create(). Fill with kvp_ctx_params_init(). */
typedef struct kvp_ctx_params {
    uint32_t struct_size;     /**< sizeof(kvp_ctx_params_t); set by init. */
    int32_t threads;          /**< Threads that run kernels, caller included (1 .. 256); default 1. */
    int32_t isa;              /**< #kvp_isa; default #KVP_ISA_AUTO. */
    int32_t reserved_;        /**< Must be 0. */
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
 * @brief Detail text of the last failed call on this context.
 * @param[in] ctx The context (NULL gives "").
 * @return A string owned by the context; "" after a success.
 */
KVP_API const char *kvp_ctx_last_error(const kvp_ctx_t *ctx);

/**
 * @brief The instruction set the context's kernels use.
 * @param[in] ctx The context.
 * @return A #kvp_isa other than #KVP_ISA_AUTO, or -1 for NULL.
 */
KVP_API int32_t kvp_ctx_isa(const kvp_ctx_t *ctx);

/**
 * @brief Name of an instruction set ("auto", "portable", "avx2", "avx512").
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

/**
 * @brief Inputs of kvp_attention(). Fill with kvp_attention_params_init().
 *
 * Sequence `b` of the view brings query rows `qo_indptr[b] .. qo_indptr[b+1]-1`
 * (FlashInfer's convention), the last `q_len` tokens of the sequence, whose
 * K/V are already in the store. Row `i` of a sequence of length `n` is at
 * position `n - q_len + i`; with `causal` it attends to positions
 * `<= n - q_len + i`, and with a window also `>= n - q_len + i - window_left`.
 */
typedef struct kvp_attention_params {
    uint32_t struct_size;     /**< sizeof(kvp_attention_params_t); set by init. */
    int32_t layer;            /**< 0 .. layers-1. */
    int32_t q_heads;          /**< Query heads: a multiple of the store's kv_heads (GQA/MQA). */
    int32_t dtype;            /**< Type of q and out: fp32, fp16 or bf16; default fp32. */
    int32_t causal;           /**< 1 (default): causal mask; 0: every token of the sequence. */
    int32_t window_left;      /**< Sliding window (tokens to the left); -1 (default) = none. */
    float sm_scale;           /**< Softmax scale applied to q.k (e.g. 1/sqrt(head_dim); > 0). */
    float logit_soft_cap;     /**< If > 0: logits become cap * tanh(logit / cap) (Gemma 2). */
    const int32_t *qo_indptr; /**< [batch+1] query row offsets, qo_indptr[0] = 0, non-decreasing. */
    const void *q;            /**< [qo_indptr[batch]][q_heads][head_dim] queries. */
    void *out;                /**< Same shape: the attention output. */
    float *lse;               /**< Optional [rows][q_heads] log-sum-exp of the scaled logits (natural log). */
} kvp_attention_params_t;

/**
 * @brief Fill `p` with defaults (fp32, causal, no window, no soft cap) and
 *        set its struct_size; pointers, layer, q_heads and sm_scale are zeroed.
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
 * docs/formats.md. Thread-safe only with distinct contexts.
 *
 * @param[in,out] ctx    Context (threads, workspace); its last error gets the detail.
 * @param[in]     store  The store holding the pages.
 * @param[in]     view   The batch's pages (CSR), from the page table.
 * @param[in]     params Queries, output, scale, masks.
 * @return #KVP_OK; #KVP_EINVAL for NULL pointers, shapes that disagree with
 *         the store (page size, page counts, q_heads), a page id out of range,
 *         a last_page_len outside 1..page_size, more query rows than tokens,
 *         or a bad scale; #KVP_ENOTSUP for a head_dim the kernels do not
 *         support (64, 80, 96, 128, 256 are). On error `out` is not written.
 *         Cost: one read of the batch's K/V bytes per 32 query rows of a
 *         kv head; no allocation.
 */
KVP_API int kvp_attention(kvp_ctx_t *ctx, const kvp_store_t *store, const kvp_kv_view_t *view,
                          const kvp_attention_params_t *params);

/* ------------------------------------------------------------------------ */
/* Build features                                                            */
/* ------------------------------------------------------------------------ */

/**
 * @brief Whether this build of the library contains the CUDA backend.
 * @return 1 if built with CUDA (kvpage_cuda.h functions are functional),
 *         0 if CPU-only (they return #KVP_ENOTSUP).
 */
KVP_API int kvp_build_has_cuda(void);

#ifdef __cplusplus
}
#endif

#endif /* KVPAGE_H */
