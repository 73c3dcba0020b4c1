/**
 * @file kvpage_plan.h
 * @brief libkvpage — capacity planning: exact page byte counts, how many
 *        pages, tokens and sequences a memory budget holds, model and GPU
 *        presets, and parsing of sizes and format names.
 *
 * The numbers the planner prints are the numbers the pool and the store
 * admit: one function (kvp_layout_compute()) computes the bytes of a page,
 * and the store, the pool and the planner all call it. No object, no
 * allocation: every function here is thread-safe.
 *
 * Before 1.0 these functions may still change in a minor release
 * (CHANGELOG.md lists every change); kvpage.h carries the ABI promise.
 */
#ifndef KVPAGE_PLAN_H
#define KVPAGE_PLAN_H

#include "kvpage.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Page layout and arena size (the one byte-count function)                  */
/* ------------------------------------------------------------------------ */

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

/**
 * @brief Parse a format name (case-insensitive; "fp8" is accepted for
 *        "fp8_e4m3").
 * @param[in]  name     The name: a NUL-terminated string (its length is not
 *                      known to the function; not checked).
 * @param[out] format   The #kvp_format value.
 * @param[out] err      Optional error-detail buffer.
 * @param[in]  err_size Its size in bytes.
 * @return #KVP_OK, or #KVP_EINVAL for NULL arguments or an unknown name.
 */
KVP_API int kvp_format_parse(const char *name, int32_t *format, char *err,
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
 * @param[in]  err_size Its size: the function writes at most err_size bytes,
 *                      NUL included, so `err` must hold at least err_size
 *                      bytes (not checked).
 * @return #KVP_OK, or #KVP_EINVAL for a bad or inconsistent input: zero sizes,
 *         q_heads negative or not a multiple of kv_heads, utilization outside
 *         (0, 1] (NaN included),
 *         weights plus reserve not smaller than the memory, a budget smaller
 *         than one page (plus one staging page when needed), or products that
 *         overflow 64 bits. O(1).
 */
KVP_API int kvp_plan_compute(const kvp_plan_params_t *params, kvp_plan_t *plan,
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

/* ------------------------------------------------------------------------ */
/* Presets and parsing                                                       */
/* ------------------------------------------------------------------------ */

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
KVP_API int32_t kvp_model_preset_count(void);

/**
 * @brief Get a model preset by index.
 * @param[in]  index 0 .. kvp_model_preset_count()-1.
 * @param[out] out   Result; `out->struct_size` must be set.
 * @return #KVP_OK or #KVP_EINVAL (NULL, bad struct_size, index out of range).
 */
KVP_API int kvp_model_preset_get(int32_t index, kvp_model_preset_t *out);

/**
 * @brief Find a model preset by name (case-insensitive).
 * @param[in]  name     e.g. "llama-3.1-8b"; NUL-terminated (not checked).
 * @param[out] out      Result; `out->struct_size` must be set.
 * @param[out] err      Optional error-detail buffer (lists the known names).
 * @param[in]  err_size Its size.
 * @return #KVP_OK, #KVP_ENOENT for an unknown name, #KVP_EINVAL for NULL.
 */
KVP_API int kvp_model_preset_find(const char *name, kvp_model_preset_t *out,
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
KVP_API int32_t kvp_gpu_preset_count(void);

/**
 * @brief Get a GPU preset by index.
 * @param[in]  index 0 .. kvp_gpu_preset_count()-1.
 * @param[out] out   Result; `out->struct_size` must be set.
 * @return #KVP_OK or #KVP_EINVAL.
 */
KVP_API int kvp_gpu_preset_get(int32_t index, kvp_gpu_preset_t *out);

/**
 * @brief Find a GPU preset by name (case-insensitive).
 * @param[in]  name     e.g. "h200-141g"; NUL-terminated (not checked).
 * @param[out] out      Result; `out->struct_size` must be set.
 * @param[out] err      Optional error-detail buffer (lists the known names).
 * @param[in]  err_size Its size.
 * @return #KVP_OK, #KVP_ENOENT for an unknown name, #KVP_EINVAL for NULL.
 */
KVP_API int kvp_gpu_preset_find(const char *name, kvp_gpu_preset_t *out, char *err,
                         size_t err_size);

/**
 * @brief Weight bytes of a model from its parameter count and weight type.
 *
 * Weight types: "fp32" (4 bytes), "fp16"/"bf16" (2), "fp8"/"int8" (1),
 * "int4" (4.25 bits: 4-bit weights plus a 16-bit scale per group of 64).
 *
 * @param[in]  params      Parameter count (> 0).
 * @param[in]  weight_type One of the names above (case-insensitive);
 *                         NUL-terminated (not checked).
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
 * @param[in]  text     The text: a NUL-terminated string (its length is not
 *                      known to the function; not checked).
 * @param[out] bytes    Result (> 0).
 * @param[out] err      Optional error-detail buffer.
 * @param[in]  err_size Its size.
 * @return #KVP_OK or #KVP_EINVAL (NULL, empty, not a number, unknown
 *         suffix, zero, negative, or larger than 2^64-1).
 */
KVP_API int kvp_parse_size(const char *text, uint64_t *bytes, char *err,
                           size_t err_size);

#ifdef __cplusplus
}
#endif

#endif /* KVPAGE_PLAN_H */
