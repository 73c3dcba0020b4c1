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
    X(KVP_EINTERNAL, -9, "internal error in libkvpage (please report)")        \
    X(KVP_EHOSTFULL, -10, "the host tier has no room for this sequence")

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
 * `floor((memory_bytes - weight_bytes - reserve_bytes) * utilization)`:
 * the KV cache takes `utilization` of the memory the weights and the reserve
 * leave, as TensorRT-LLM's `kv_cache_free_gpu_mem_fraction` does. (vLLM's
 * `gpu_memory_utilization` is a fraction of the whole memory instead: to
 * reproduce its budget, set `utilization` to 1 and put the memory vLLM leaves
 * unused into `reserve_bytes`.)
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
    double utilization;       /**< Fraction of the memory left after weights and reserve that
                                   the KV cache takes; default 0.90. */
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
 *         weights plus reserve not smaller than the memory, a budget smaller
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
/* Page pool: page ids, reference counts, prefix cache                       */
/* ------------------------------------------------------------------------ */

/* Defined in the "Paged-KV views" section below; declared here so the page
 * table's functions can take them. */
struct kvp_page_op;
struct kvp_kv_view;

/**
 * @brief A pool of KV pages: page ids, reference counts, the prefix cache.
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
 *   kvp_pool_retain());
 * - **cached**: reference count 0 but kept by the prefix cache, because it
 *   holds a full page of tokens a later prompt may reuse. Cached pages are
 *   evicted (made free) only when an allocation needs them, lowest priority
 *   first, then least recently used, and only pages no other cached page
 *   depends on.
 *
 * `free + used + cached = num_pages` at all times, and an allocation of `k`
 * pages succeeds whenever `free + cached - reserved >= k` (see
 * kvp_table_reserve()).
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
 */
typedef struct kvp_pool kvp_pool_t;

/** @brief Parameters of kvp_pool_create(). Fill with kvp_pool_params_init(). */
typedef struct kvp_pool_params {
    uint32_t struct_size;  /**< sizeof(kvp_pool_params_t); set by init. */
    int32_t page_size;     /**< Tokens per page, 1 .. #KVP_MAX_PAGE_SIZE; default 16. */
    int32_t num_pages;     /**< Pool pages, >= 1 (ids 0 .. num_pages-1); required. */
    int32_t num_staging;   /**< Staging pages (ids from num_pages on); 0 (default) when
                                the layout has none. num_pages + num_staging <= 2^31-1. */
    int32_t prefix_cache;  /**< 1 (default): keep full pages in the prefix cache after
                                their sequences end; 0: pages are freed at once. */
    int32_t reserved_;     /**< Padding; set to 0. */
    uint64_t hash_seed;    /**< Seed of the prefix hash (default 0). Results never depend
                                on it (matches compare the stored token ids); set it from
                                a secret when prompts come from untrusted users, so they
                                cannot craft prompts that fill one hash bucket. */
    const kvp_allocator_t *allocator; /**< Host allocator hooks; NULL = libc. Copied. */
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
 * @brief Create a pool with exactly the pages a plan counted.
 *
 * Takes `page_size`, `num_pages` and `num_staging` from `plan` (the result of
 * kvp_plan_compute()), so the pool admits exactly what the planner printed:
 * `plan->max_seqs` sequences of `plan->context` tokens fit at once.
 *
 * @param[in]  plan     A plan from kvp_plan_compute().
 * @param[in]  params   Other options (allocator, prefix cache, seed), or NULL
 *                      for defaults; its page and staging counts are ignored.
 * @param[out] pool     The new pool; untouched on error.
 * @param[out] err      Optional error-detail buffer.
 * @param[in]  err_size Its size.
 * @return #KVP_OK; #KVP_EINVAL for a NULL or uninitialised plan, a plan whose
 *         layout needs staging pages but that counted none (plan context 0),
 *         or more pages than int32 page ids can name; #KVP_ENOMEM.
 *         O(num_pages).
 */
KVP_API int kvp_pool_create_from_plan(const kvp_plan_t *plan,
                                      const kvp_pool_params_t *params,
                                      kvp_pool_t **pool, char *err,
                                      size_t err_size);

/**
 * @brief Plan a memory budget and create the pool it holds, in one call.
 *
 * kvp_plan_compute() followed by kvp_pool_create_from_plan().
 *
 * @param[in]  plan_params Model shape, formats, memory (see #kvp_plan_params_t);
 *                         set `context` when the key format needs staging pages.
 * @param[in]  params      Other pool options, or NULL for defaults.
 * @param[out] pool        The new pool; untouched on error.
 * @param[out] plan        Optional: the plan (`plan->struct_size` must be set).
 * @param[out] err         Optional error-detail buffer.
 * @param[in]  err_size    Its size.
 * @return As kvp_plan_compute() and kvp_pool_create_from_plan().
 */
KVP_API int kvp_pool_create_for_budget(const kvp_plan_params_t *plan_params,
                                       const kvp_pool_params_t *params,
                                       kvp_pool_t **pool, kvp_plan_t *plan,
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
 * @brief Detail of the most recent failed call on this pool.
 * @param[in] pool The pool.
 * @return A NUL-terminated sentence (e.g. "page 70 is out of range
 *         0..63"), "" if no call has failed, or a static message for NULL.
 *         Valid until the next call on the pool.
 */
KVP_API const char *kvp_pool_last_error(const kvp_pool_t *pool);

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
/* Page table: sequences, copy-on-write, prefix reuse, batch export          */
/* ------------------------------------------------------------------------ */

/**
 * @brief A page table: sequences of tokens mapped onto a pool's pages.
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
 */
typedef struct kvp_table kvp_table_t;

/** @brief Parameters of kvp_table_create(). Fill with kvp_table_params_init(). */
typedef struct kvp_table_params {
    uint32_t struct_size;  /**< sizeof(kvp_table_params_t); set by init. */
    int32_t max_seqs;      /**< Sequence slots, 1 .. 2^24; 0 (default) = the pool's staging
                                page count for layouts with staging, else 4096. */
    const kvp_allocator_t *allocator; /**< Host allocator hooks; NULL = libc. Copied. */
} kvp_table_params_t;

/**
 * @brief Fill `p` with defaults (max_seqs 0 = automatic, libc allocator) and
 *        set its struct_size.
 * @param[out] p Parameters to initialise; NULL is ignored.
 */
KVP_API void kvp_table_params_init(kvp_table_params_t *p);

/**
 * @brief Create a page table on `pool`.
 *
 * The pool must outlive the table. Several tables may share one pool.
 *
 * @param[in,out] pool     The pool the table takes pages from.
 * @param[in]     params   Options, or NULL for defaults.
 * @param[out]    table    The new table; untouched on error.
 * @param[out]    err      Optional error-detail buffer.
 * @param[in]     err_size Its size.
 * @return #KVP_OK; #KVP_EINVAL (NULL pool or table, struct_size too small,
 *         max_seqs out of range); #KVP_ENOMEM. O(max_seqs).
 */
KVP_API int kvp_table_create(kvp_pool_t *pool, const kvp_table_params_t *params,
                             kvp_table_t **table, char *err, size_t err_size);

/**
 * @brief Destroy a table, releasing every live sequence's pages to the pool
 *        (full pages stay in the prefix cache). NULL is a no-op. Destroy its
 *        host tier (kvp_tier_destroy()) first.
 * @param[in] table The table.
 */
KVP_API void kvp_table_destroy(kvp_table_t *table);

/**
 * @brief Detail of the most recent failed call on this table.
 * @param[in] table The table.
 * @return A NUL-terminated sentence, "" if no call has failed, or a static
 *         message for NULL. Valid until the next call on the table.
 */
KVP_API const char *kvp_table_last_error(const kvp_table_t *table);

/**
 * @brief The pool a table takes its pages from.
 * @param[in] table The table.
 * @return The pool, or NULL for a NULL table.
 */
KVP_API kvp_pool_t *kvp_table_pool(const kvp_table_t *table);

/** @brief Options of a new sequence. Fill with kvp_seq_params_init(). */
typedef struct kvp_seq_params {
    uint32_t struct_size; /**< sizeof(kvp_seq_params_t); set by init. */
    int32_t priority;     /**< Eviction priority of the pages it fills (higher is kept
                               longer); default 0. See kvp_table_set_priority(). */
    uint64_t salt;        /**< Prefix-cache namespace (default 0, shared). Sequences with
                               different salts never share cached pages, so tenants
                               cannot probe each other's prompts: derive it from a
                               secret and the tenant id. */
} kvp_seq_params_t;

/**
 * @brief Fill `p` with defaults (priority 0, salt 0) and set its struct_size.
 * @param[out] p Parameters to initialise; NULL is ignored.
 */
KVP_API void kvp_seq_params_init(kvp_seq_params_t *p);

/**
 * @brief Create an empty sequence.
 *
 * In layouts with staging it takes a staging page, which it keeps until it
 * is released.
 *
 * @param[in,out] table  The table.
 * @param[in]     params Options, or NULL for defaults.
 * @param[out]    seq    The new sequence id (>= 0); untouched on error.
 * @return #KVP_OK; #KVP_EINVAL (NULL, struct_size too small); #KVP_ENOSPC if
 *         all max_seqs slots are live or, with staging, no staging page is
 *         free. O(1); never allocates.
 */
KVP_API int kvp_table_seq_create(kvp_table_t *table, const kvp_seq_params_t *params,
                                 int32_t *seq);

/**
 * @brief Release a sequence: drop its references (full pages stored in the
 *        prefix cache stay cached), its staging page and its reservation.
 *        The id becomes invalid.
 * @param[in,out] table The table.
 * @param[in]     seq   A live sequence.
 * @return #KVP_OK, #KVP_EINVAL (NULL table) or #KVP_ENOENT (unknown or
 *         already released id; nothing changed); #KVP_ESTATE (swapped out to
 *         a host tier: drop it with kvp_tier_drop()). O(pages of the sequence).
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
                             struct kvp_page_op *ops, int32_t ops_capacity,
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
                               struct kvp_page_op *ops, int32_t ops_capacity,
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
                           struct kvp_page_op *ops, int32_t ops_capacity,
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
 * @brief How many leading tokens of a prompt the prefix cache holds, without
 *        attaching anything or counting stats.
 *
 * @param[in,out] table   The table (its last error is set on failure).
 * @param[in]     salt    The prefix-cache namespace (see #kvp_seq_params_t).
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
 * @brief Caller-owned buffers filled by kvp_table_export().
 *
 * Size them with kvp_table_export_size(). Plain pointers and fixed-width
 * integers, for FFI.
 */
typedef struct kvp_batch_buffers {
    uint32_t struct_size;     /**< Set by the caller to sizeof(kvp_batch_buffers_t). */
    int32_t reserved_;        /**< Padding; set to 0. */
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
 * @param[out]    view    Optional: a view pointing at the buffers.
 * @return #KVP_OK; #KVP_EINVAL (NULL, buffers too small, more than 2^31-1
 *         entries); #KVP_ENOENT; #KVP_ESTATE (a sequence is swapped out).
 *         Buffers are untouched on error.
 *         O(batch + pages + rows); never allocates.
 */
KVP_API int kvp_table_export(kvp_table_t *table, const int32_t *seqs, int32_t batch,
                             const int32_t *num_new, const kvp_batch_buffers_t *buffers,
                             struct kvp_kv_view *view);

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
typedef struct kvp_page_op {
    int32_t kind;  /**< A #kvp_page_op_kind. */
    int32_t src;   /**< Source page id (pool or staging), or -1; #KVP_OP_SWAP_IN: a host slot. */
    int32_t dst;   /**< Destination page id (pool or staging); #KVP_OP_SWAP_OUT: a host slot. */
    int32_t count; /**< Tokens taken from `src` (swaps: tokens the page holds). */
    int32_t row;   /**< #KVP_OP_SEAL: first appended row landing in `dst`; swaps: the chunk
                        index within the page (0 for pool pages); else -1. */
} kvp_page_op_t;

/* ------------------------------------------------------------------------ */
/* Host tier: swap sequences out to host memory and back                     */
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
 * @brief A host tier: sequences of one page table swapped out to host memory
 *        (opaque).
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
 */
typedef struct kvp_tier kvp_tier_t;

/** @brief Parameters of kvp_tier_create(). Fill with kvp_tier_params_init(). */
typedef struct kvp_tier_params {
    uint32_t struct_size;     /**< sizeof(kvp_tier_params_t); set by init. */
    int32_t reserved_;        /**< Padding; 0. */
    uint64_t host_bytes;      /**< Byte budget (required): the tier holds
                                   floor(host_bytes / slot_bytes) slots and allocates exactly
                                   that many slots' bytes, once. */
    const kvp_layout_t *layout; /**< The pages' byte counts, from kvp_layout_compute()
                                     (required). Its page size must be the pool's, and it needs
                                     staging exactly when the pool has staging pages. Copied. */
    const kvp_page_io_t *page_io; /**< How to move page bytes; NULL: swaps return operations
                                       instead. Copied. */
    const kvp_allocator_t *allocator;      /**< Metadata allocator; NULL = libc. Copied. */
    const kvp_allocator_t *host_allocator; /**< Allocator of the host memory (e.g. pinned
                                                memory for CUDA); NULL = `allocator`. Copied. */
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

/**
 * @brief Opaque page arena on a backend: host memory (kvp_store_create()) or
 *        a CUDA device (kvp_cuda_store_create() in kvpage_cuda.h).
 *
 * The store functions below work on either backend with the same bytes and
 * the same results. On a CUDA store the *tensors* an engine passes (the rows
 * of kvp_append_t, the queries, outputs and log-sum-exp of
 * kvp_attention_params_t) are device pointers, while the *metadata* (slots,
 * page operations, the CSR view, `qo_indptr`) stays in host memory, where the
 * page table makes it and where it is checked before anything runs.
 */
typedef struct kvp_store kvp_store_t;

/** @brief Where a store keeps its arena and a context runs its kernels. */
enum kvp_backend {
    KVP_BACKEND_CPU = 0, /**< Host memory, CPU kernels (portable, AVX2, AVX-512). */
    KVP_BACKEND_CUDA = 1 /**< A CUDA device (kvpage_cuda.h). */
};

/**
 * @brief The backend of a store.
 * @param[in] store The store.
 * @return A #kvp_backend, or -1 for NULL.
 */
KVP_API int32_t kvp_store_backend(const kvp_store_t *store);

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
 * @param[out] base  Base address (aligned to #KVP_ARENA_ALIGN); a device
 *                   address on a CUDA store.
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
 * token_stride = dim_stride = 0: their bytes are in docs/formats.md. On a
 * CUDA store `base` is a device address.
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
 *         operations are checked before any is executed; #KVP_ECUDA for a
 *         CUDA failure (CUDA store: enqueued on its stream). Cost: one page
 *         of bytes per operation.
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
 * On a CUDA store the count lives on the device: this waits for the store's
 * stream and reads it (on a CUDA failure it returns the last count read and
 * the store's last error says why).
 * @param[in] store The store (NULL gives 0).
 * @return The count since creation.
 */
KVP_API uint64_t kvp_store_nonfinite_count(const kvp_store_t *store);

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
 * The bytes are not checked: they must come from kvp_store_page_to_host() of
 * a store with the same layout.
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
KVP_API int kvp_store_page_io(kvp_store_t *store, struct kvp_page_io *io);

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

/**
 * @brief Opaque execution context: worker threads and workspace (CPU,
 *        kvp_ctx_create()), or a device, stream and device workspace (CUDA,
 *        kvp_cuda_ctx_create()). A context runs attention over stores of its
 *        own backend.
 */
typedef struct kvp_ctx kvp_ctx_t;

/**
 * @brief The backend of a context.
 * @param[in] ctx The context.
 * @return A #kvp_backend, or -1 for NULL.
 */
KVP_API int32_t kvp_ctx_backend(const kvp_ctx_t *ctx);

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
 * @brief The instruction set the context's CPU kernels use.
 * @param[in] ctx The context.
 * @return A #kvp_isa other than #KVP_ISA_AUTO; -1 for NULL or a CUDA context.
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
 *         or a bad scale; #KVP_ENOTSUP for a head_dim the kernels do not
 *         support (64, 80, 96, 128, 256 are); #KVP_EINVAL when the context
 *         and the store are of different backends or devices; #KVP_ENOMEM
 *         when the schedule or the uploaded view exceed the context's
 *         workspace; #KVP_ECUDA for a CUDA failure. On error `out` is not
 *         written. Cost (CPU): one read of the batch's K/V bytes per 32 query
 *         rows of a kv head; (CUDA): per 8 rows. No allocation.
 */
KVP_API int kvp_attention(kvp_ctx_t *ctx, const kvp_store_t *store, const kvp_kv_view_t *view,
                          const kvp_attention_params_t *params);

/* ------------------------------------------------------------------------ */
/* Cache: pool + table + store + context for the common decode loop         */
/* ------------------------------------------------------------------------ */

/**
 * @brief The common case in one object (opaque): a page pool, a page table, a
 *        page arena and an attention context, kept consistent.
 *
 * The layers stay usable alone; this façade only sequences them. Per step:
 *
 * 1. kvp_cache_begin_step() with the batch's sequences and their new tokens:
 *    reserves and appends them in the table (all or nothing), runs the
 *    copy-on-write operations on the arena, and exports the batch.
 * 2. For each layer: kvp_cache_write() the new rows' K/V (rows in batch
 *    order), then kvp_cache_attend() with the queries of those rows.
 *
 * Forks and truncations run their page operations on the arena at once.
 * Buffers grow to the largest step seen and are reused: after the first
 * steps, a step allocates nothing.
 */
typedef struct kvp_cache kvp_cache_t;

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
    int32_t reserved_;         /**< Padding; 0. */
    int64_t num_pages;         /**< Pool pages; 0 = as many as kv_budget_bytes holds. */
    uint64_t kv_budget_bytes;  /**< With num_pages 0: the arena's byte budget (pool pages
                                    plus max_seqs staging pages when needed). */
    uint64_t hash_seed;        /**< Prefix-cache hash seed (see kvp_pool_params_t). */
    uint64_t host_bytes;       /**< Host tier budget in bytes; 0 (default) = no host tier. */
    kvp_allocator_t allocator; /**< Host allocator hooks; NULL functions = libc. */
} kvp_cache_params_t;

/**
 * @brief Fill `p` with defaults and set its struct_size (shape and size
 *        stay 0: required).
 * @param[out] p Parameters; NULL is ignored.
 */
KVP_API void kvp_cache_params_init(kvp_cache_params_t *p);

/**
 * @brief Create the pool, table, arena and context of a cache.
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
 * @brief Detail text of the cache's last failed call ("" if none).
 * @param[in] c The cache (NULL gives a static message).
 * @return A string owned by the cache, valid until its next call.
 */
KVP_API const char *kvp_cache_last_error(const kvp_cache_t *c);

/** @brief The cache's pool (owned by the cache). @param[in] c The cache. @return The pool. */
KVP_API kvp_pool_t *kvp_cache_pool(const kvp_cache_t *c);
/** @brief The cache's table (owned by the cache). @param[in] c The cache. @return The table. */
KVP_API kvp_table_t *kvp_cache_table(const kvp_cache_t *c);
/** @brief The cache's arena (owned by the cache). @param[in] c The cache. @return The store. */
KVP_API kvp_store_t *kvp_cache_store(const kvp_cache_t *c);
/** @brief The cache's attention context (owned by the cache). @param[in] c The cache.
 *  @return The context. */
KVP_API kvp_ctx_t *kvp_cache_ctx(const kvp_cache_t *c);
/** @brief The cache's host tier, or NULL without one (host_bytes 0). @param[in] c The cache.
 *  @return The tier (owned by the cache). */
KVP_API kvp_tier_t *kvp_cache_tier(const kvp_cache_t *c);

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

/**
 * @brief A new, empty sequence.
 * @param[in]  c        The cache.
 * @param[in]  priority Eviction priority of its cached pages (see kvp_seq_params_t).
 * @param[in]  salt     Prefix-cache namespace (0 = shared).
 * @param[out] seq      Its id.
 * @return #KVP_OK, #KVP_EINVAL, #KVP_ENOSPC (no sequence slot or staging page).
 */
KVP_API int kvp_cache_seq_create(kvp_cache_t *c, int32_t priority, uint64_t salt, int32_t *seq);

/**
 * @brief End a sequence; its full pages stay in the prefix cache.
 * @param[in] c   The cache.
 * @param[in] seq A live sequence.
 * @return #KVP_OK or #KVP_ENOENT.
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
 * @param[out] matched Tokens attached (whole pages; prefill the rest).
 * @return As kvp_table_attach_prefix().
 */
KVP_API int kvp_cache_seq_attach_prefix(kvp_cache_t *c, int32_t seq, const int32_t *tokens,
                                        int64_t n, int64_t *matched);

/**
 * @brief Fork a sequence: the child shares its pages; copies run on the arena.
 * @param[in]  c      The cache.
 * @param[in]  parent A live sequence.
 * @param[out] child  The child's id.
 * @return As kvp_table_fork(), or an error of kvp_store_apply_ops() (the child
 *         is then released again).
 */
KVP_API int kvp_cache_seq_fork(kvp_cache_t *c, int32_t parent, int32_t *child);

/**
 * @brief Shorten a sequence (e.g. rejected speculative tokens); an unseal
 *        runs on the arena at once.
 * @param[in] c      The cache.
 * @param[in] seq    A live sequence.
 * @param[in] length New length, 0 .. current length.
 * @return As kvp_table_truncate() and kvp_store_apply_ops().
 */
KVP_API int kvp_cache_seq_truncate(kvp_cache_t *c, int32_t seq, int64_t length);

/**
 * @brief A sequence's length in tokens.
 * @param[in]  c      The cache.
 * @param[in]  seq    A live sequence.
 * @param[out] length Tokens.
 * @return #KVP_OK, #KVP_EINVAL or #KVP_ENOENT.
 */
KVP_API int kvp_cache_seq_length(kvp_cache_t *c, int32_t seq, int64_t *length);

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
 * after kvp_cache_write() for the same layer.
 *
 * @param[in] c      The cache.
 * @param[in] params Attention parameters.
 * @return As kvp_attention(); #KVP_ESTATE outside a step.
 */
KVP_API int kvp_cache_attend(kvp_cache_t *c, const kvp_attention_params_t *params);

/**
 * @brief The step's exported batch (for engines with their own kernels).
 * @param[in]  c         The cache.
 * @param[out] view      The CSR view; it points into the cache's buffers, valid
 *                       until the next kvp_cache_begin_step().
 * @param[out] slots     Optional: the step's row slots.
 * @param[out] qo_indptr Optional: the step's `[batch+1]` row offsets.
 * @param[out] rows      Optional: the step's row count.
 * @return #KVP_OK, #KVP_EINVAL, #KVP_ESTATE outside a step.
 */
KVP_API int kvp_cache_step_view(const kvp_cache_t *c, kvp_kv_view_t *view, const int64_t **slots,
                                const int32_t **qo_indptr, int32_t *rows);

/* ------------------------------------------------------------------------ */
/* Scheduler: admission, priorities, pressure forecast, victims              */
/* ------------------------------------------------------------------------ */

/**
 * @brief A scheduling policy the engine consults once per step (opaque).
 *
 * It decides, the engine executes: it touches no memory and owns no pages.
 * Each step the engine reports the pool's free pages (kvp_sched_step()), and
 * the scheduler returns a plan: which sequences to swap out, preempt for
 * recompute or drop (freeing memory), which to swap in, which prefill how many
 * tokens, which decode, and which requests to reject. If the engine executes
 * the plan in that order, every page reservation it makes succeeds.
 *
 * How it keeps that promise: it counts, per sequence, the pages its tokens
 * hold (`ceil(len/page_size)`, or `floor(len/page_size)` plus a staging page
 * for int8/int4 keys), forecasts the pages the running sequences need over the
 * next `horizon` steps, and acts before the pool runs dry: it holds new
 * arrivals and moves low-priority work out (swap, recompute or drop, whichever
 * costs least to bring back) while there is still room. Pages freed by this
 * step's victims are not counted until the engine reports them free next step,
 * so shared (prefix-cached) pages can never make it over-promise.
 *
 * Priorities: higher values run first. A waiting request may preempt running
 * work of strictly lower priority. A sequence just admitted or swapped in is
 * not preempted again for `hysteresis` steps.
 *
 * Cost: kvp_sched_step() is O(running + changed) with no allocation; 1,000
 * running and 1,000 waiting sequences take tens of microseconds
 * (`kvpage-bench sched`).
 */
typedef struct kvp_sched kvp_sched_t;

/** @brief Reasons attached to a reject, drop or preemption (kvp_sched_item_t::reason). */
enum kvp_sched_reason {
    KVP_REASON_NONE = 0,       /**< Not applicable (prefill, swap-in items). */
    KVP_REASON_PRESSURE = 1,   /**< Moved out because the forecast said memory would run short. */
    KVP_REASON_PRIORITY = 2,   /**< Moved out to make room for higher-priority work. */
    KVP_REASON_TOO_LONG = 3,   /**< Prompt plus max_new_tokens can never fit in the pool. */
    KVP_REASON_DEADLINE = 4,   /**< Its deadline passed. */
    KVP_REASON_HOST_FULL = 5,  /**< Dropped: swapping was needed but the host tier is full
                                    and recompute is disabled. */
    KVP_REASON_OVERLOAD = 6    /**< Rejected: waited longer than max_queue_delay. */
};

/** @brief Actions the scheduler may take on a victim (kvp_sched_params_t::actions bits). */
enum kvp_sched_action {
    KVP_SCHED_SWAP = 1,      /**< Swap its KV to the host tier, bring it back later. */
    KVP_SCHED_RECOMPUTE = 2, /**< Free its KV; prefill prompt + generated tokens again later. */
    KVP_SCHED_DROP = 4       /**< Abandon it (the engine fails the request). */
};

/** @brief Scheduler parameters. Fill with kvp_sched_params_init(). */
typedef struct kvp_sched_params {
    uint32_t struct_size;       /**< sizeof(kvp_sched_params_t); set by init. */
    int32_t page_size;          /**< Tokens per page (required). */
    int32_t needs_staging;      /**< 1 if each resident sequence holds a staging page
                                     (kvp_layout_t::needs_staging). */
    int32_t max_requests;       /**< Requests tracked at once (waiting + running + swapped);
                                     default 4096. */
    int32_t max_batch;          /**< Sequences per step (decode + prefill); default 256. */
    int32_t token_budget;       /**< Tokens per step (1 per decode + prefill chunks); default 8192. */
    int32_t max_prefill_chunk;  /**< Prefill tokens per sequence per step; 0 = token_budget. */
    int32_t horizon;            /**< Forecast horizon in steps; default 64; 0 disables the
                                     forecast (purely reactive). */
    int32_t hysteresis;         /**< Steps a sequence is protected after admission or swap-in;
                                     default 16. */
    int32_t actions;            /**< OR of #kvp_sched_action; default swap | recompute | drop. */
    int32_t drop_below_priority;/**< Victims with a priority below this are dropped rather than
                                     swapped or recomputed ("shed low-priority work when
                                     memory is tight"); default INT32_MIN (never). */
    int64_t total_pages;        /**< Pool pages (required, > 0). */
    int64_t watermark_pages;    /**< Free pages kept back from admissions; default 1% of the pool. */
    int64_t max_queue_delay;    /**< Reject a waiting request older than this many time units
                                     (see kvp_sched_input_t::now); 0 = never. */
    uint64_t page_bytes;        /**< Bytes of one page: swap cost and host-tier footprint. 0 makes
                                     swapping free (always chosen while the host tier has room). */
    uint64_t staging_page_bytes;/**< Bytes of a staging page (swap cost and host footprint). */
    double host_bytes_per_s;    /**< Host link bandwidth for swap costs; default 25e9. */
    double prefill_tokens_per_s;/**< Prefill rate for recompute costs; default 10000. */
    kvp_allocator_t allocator;  /**< Host allocator hooks (NULL functions: libc). */
} kvp_sched_params_t;

/**
 * @brief Fill `p` with defaults and set its struct_size (page_size and
 *        total_pages stay 0: required).
 * @param[out] p Parameters; NULL is ignored.
 */
KVP_API void kvp_sched_params_init(kvp_sched_params_t *p);

/**
 * @brief Create a scheduler. Allocates every table it will need, once.
 * @param[in]  params   Parameters.
 * @param[out] out      The new scheduler.
 * @param[out] err      Optional error-detail buffer.
 * @param[in]  err_size Its size.
 * @return #KVP_OK, #KVP_EINVAL (bad parameter), #KVP_ENOMEM.
 */
KVP_API int kvp_sched_create(const kvp_sched_params_t *params, kvp_sched_t **out, char *err,
                             size_t err_size);

/** @brief Destroy a scheduler; NULL is a no-op. @param[in] s The scheduler. */
KVP_API void kvp_sched_destroy(kvp_sched_t *s);

/**
 * @brief Detail text of the scheduler's last failed call ("" if none).
 * @param[in] s The scheduler (NULL gives a static message).
 * @return A string owned by the scheduler, valid until its next call.
 */
KVP_API const char *kvp_sched_last_error(const kvp_sched_t *s);

/** @brief A request handed to the scheduler. */
typedef struct kvp_sched_request {
    uint32_t struct_size;   /**< Set by the caller to sizeof(kvp_sched_request_t). */
    int32_t priority;       /**< Higher runs first; may be negative. */
    int64_t id;             /**< The engine's id for the request (unique among live ones). */
    int64_t prompt_tokens;  /**< Prompt length (> 0). */
    int64_t max_new_tokens; /**< Tokens it may generate (> 0). */
    int64_t cached_tokens;  /**< Prompt tokens already in the prefix cache (shared pages the
                                 engine will attach); 0 if unknown. */
    int64_t arrival;        /**< Arrival time in the engine's units (see kvp_sched_input_t::now). */
    int64_t deadline;       /**< Absolute deadline in the same units; 0 = none. */
} kvp_sched_request_t;

/**
 * @brief Queue a request. O(log waiting).
 * @param[in] s   The scheduler.
 * @param[in] req The request.
 * @return #KVP_OK; #KVP_EINVAL (bad field, duplicate id); #KVP_ENOSPC when
 *         max_requests are already tracked. A request that can never fit is
 *         accepted and rejected in the next plan (#KVP_REASON_TOO_LONG).
 */
KVP_API int kvp_sched_submit(kvp_sched_t *s, const kvp_sched_request_t *req);

/**
 * @brief The engine finished (EOS) or abandoned a request; forget it. O(1).
 * @param[in] s  The scheduler.
 * @param[in] id The request id.
 * @return #KVP_OK or #KVP_ENOENT.
 */
KVP_API int kvp_sched_finish(kvp_sched_t *s, int64_t id);

/** @brief What the engine reports before each step. */
typedef struct kvp_sched_input {
    uint32_t struct_size;    /**< Set by the caller to sizeof(kvp_sched_input_t). */
    int32_t reserved_;       /**< Padding; 0. */
    int64_t free_pages;      /**< Pool pages free now, evictable cached pages included. */
    int64_t free_staging;    /**< Staging pages free now (ignored without staging). */
    uint64_t host_free_bytes;/**< Bytes free in the host tier now. */
    int64_t now;             /**< Current time in the engine's units (for deadlines). */
} kvp_sched_input_t;

/** @brief One entry of a plan list. */
typedef struct kvp_sched_item {
    int64_t id;      /**< Request id. */
    int32_t tokens;  /**< Prefill: tokens to prefill this step (from position `start`). */
    int32_t reason;  /**< #kvp_sched_reason for rejects, drops, preemptions, swap-outs. */
    int64_t start;   /**< Prefill: first token position of this chunk. */
} kvp_sched_item_t;

/**
 * @brief One step's plan. The arrays belong to the scheduler and stay valid
 *        until its next call. Execute in this order: swap_out, preempt, drop,
 *        then swap_in, then prefill and decode (reserve, append, attend).
 */
typedef struct kvp_sched_plan {
    uint32_t struct_size;            /**< Set by the caller to sizeof(kvp_sched_plan_t). */
    int32_t n_swap_out;              /**< Entries in swap_out. */
    int32_t n_preempt;               /**< Entries in preempt. */
    int32_t n_drop;                  /**< Entries in drop. */
    int32_t n_swap_in;               /**< Entries in swap_in. */
    int32_t n_prefill;               /**< Entries in prefill. */
    int32_t n_decode;                /**< Entries in decode. */
    int32_t n_reject;                /**< Entries in reject. */
    int32_t n_finished;              /**< Entries in finished. */
    int32_t pressure;                /**< 1 if the forecast found memory short this step. */
    const kvp_sched_item_t *swap_out; /**< Move these sequences' KV to the host tier. */
    const kvp_sched_item_t *preempt;  /**< Free these sequences' KV; they will be recomputed. */
    const kvp_sched_item_t *drop;     /**< Abandon these running or swapped sequences. */
    const kvp_sched_item_t *swap_in;  /**< Bring these sequences back from the host tier. */
    const kvp_sched_item_t *prefill;  /**< Prefill `tokens` tokens from `start` (a new request,
                                           a recompute, or the next chunk). */
    const int64_t *decode;            /**< Decode one token for these sequences. */
    const kvp_sched_item_t *reject;   /**< Requests refused before they started. */
    const int64_t *finished;          /**< Sequences that reached max_new_tokens last step. */
    int64_t pages_needed;             /**< Pages this step's prefill, decode and swap-in reserve. */
    int64_t forecast_pages;           /**< Pages the resident sequences need over the horizon. */
} kvp_sched_plan_t;

/**
 * @brief Plan one step. Assumes the previous plan was executed.
 *
 * @param[in]  s    The scheduler.
 * @param[in]  in   The pool and host-tier state now.
 * @param[out] plan The plan (struct_size set by the caller).
 * @return #KVP_OK or #KVP_EINVAL. O(resident + changed); no allocation.
 */
KVP_API int kvp_sched_step(kvp_sched_t *s, const kvp_sched_input_t *in, kvp_sched_plan_t *plan);

/** @brief Counters since creation. */
typedef struct kvp_sched_stats {
    uint32_t struct_size;   /**< Set by the caller to sizeof(kvp_sched_stats_t). */
    int32_t reserved_;      /**< Padding; 0. */
    int64_t waiting;        /**< Requests not yet started (or waiting for recompute). */
    int64_t running;        /**< Resident sequences (prefilling or decoding). */
    int64_t swapped;        /**< Sequences in the host tier. */
    int64_t steps;          /**< kvp_sched_step() calls. */
    int64_t admitted;       /**< Requests started. */
    int64_t swap_outs;      /**< Swap-outs planned. */
    int64_t swap_ins;       /**< Swap-ins planned. */
    int64_t preemptions;    /**< Preemptions for recompute planned. */
    int64_t drops;          /**< Running or swapped sequences dropped. */
    int64_t rejects;        /**< Requests rejected. */
    int64_t finished;       /**< Requests finished. */
} kvp_sched_stats_t;

/**
 * @brief Read the scheduler's counters.
 * @param[in]  s   The scheduler.
 * @param[out] out Counters (struct_size set by the caller).
 * @return #KVP_OK or #KVP_EINVAL.
 */
KVP_API int kvp_sched_stats(const kvp_sched_t *s, kvp_sched_stats_t *out);

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
