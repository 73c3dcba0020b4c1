/**
 * @file kvpage_cuda.h
 * @brief libkvpage — CUDA-specific entry points.
 *
 * Needs no CUDA headers: streams are passed as `void *` (a cudaStream_t).
 * In a CPU-only build these functions exist and return KVP_ENOTSUP, so one
 * binding works with either build (kvp_build_has(#KVP_FEATURE_CUDA) tells,
 * kvpage_ext.h).
 *
 * **How an engine uses the GPU.** Create the store with
 * kvp_cuda_store_create() and the context with kvp_cuda_ctx_create(); then
 * the generic functions of kvpage.h (kvp_store_append(),
 * kvp_store_apply_ops(), kvp_attention(), ...) and of the extras
 * (kvp_store_page_to_host(), ...) run on the device, enqueued on the
 * object's stream: the one given at creation (#kvp_cuda_params_t::stream),
 * or set later with kvp_cuda_store_set_stream() / kvp_cuda_ctx_set_stream().
 * Tensors are device pointers; metadata (slots, operations, the CSR view)
 * stays on the host, where the page table makes it, and is checked there
 * and uploaded once per change. Nothing on the hot path allocates,
 * synchronizes or prints; a CUDA failure becomes #KVP_ECUDA with the
 * runtime's text in the object's last error. kvp_store_synchronize()
 * (kvpage_ext.h) waits for a store's stream.
 */
#ifndef KVPAGE_CUDA_H
#define KVPAGE_CUDA_H

#include "kvpage.h"

#ifdef __cplusplus
extern "C" {
#endif

/** @brief Facts about one CUDA device, from kvp_cuda_device_query(). */
typedef struct kvp_cuda_device_info {
    uint32_t struct_size;     /**< Set by the caller to sizeof(kvp_cuda_device_info_t). */
    int32_t device;           /**< Device ordinal. */
    int32_t cc_major;         /**< Compute capability, major (9 for Hopper). */
    int32_t cc_minor;         /**< Compute capability, minor. */
    int32_t sm_count;         /**< Streaming multiprocessors. */
    int32_t runtime_version;  /**< CUDA runtime version the library was built with (e.g. 13000). */
    int32_t driver_version;   /**< CUDA version the installed driver supports. */
    int32_t reserved_;        /**< Padding; always 0. */
    uint64_t total_bytes;     /**< Total device memory. */
    uint64_t free_bytes;      /**< Free device memory at the time of the call. */
    char name[256];           /**< Device name, NUL-terminated. */
} kvp_cuda_device_info_t;

/**
 * @brief Number of CUDA devices visible to this process.
 * @param[out] count    Number of devices (0 is reported as #KVP_ENODEV).
 * @param[out] err      Optional error-detail buffer (the CUDA runtime's text).
 * @param[in]  err_size Its size.
 * @return #KVP_OK; #KVP_ENODEV when no device or no driver is usable;
 *         #KVP_ENOTSUP in a CPU-only build; #KVP_EINVAL for NULL.
 */
KVP_API int kvp_cuda_device_count(int32_t *count, char *err, size_t err_size);

/**
 * @brief Query a CUDA device: name, compute capability, memory.
 *
 * Useful to plan from the device actually present
 * (`kvp_plan_params_t::memory_bytes = info.total_bytes`).
 *
 * @param[in]  device   Device ordinal (0-based).
 * @param[out] info     Result; `info->struct_size` must be set.
 * @param[out] err      Optional error-detail buffer (the CUDA runtime's text).
 * @param[in]  err_size Its size.
 * @return #KVP_OK; #KVP_ENODEV when the device does not exist or no driver is
 *         usable; #KVP_ECUDA for another CUDA error; #KVP_ENOTSUP in a
 *         CPU-only build; #KVP_EINVAL for bad arguments.
 */
KVP_API int kvp_cuda_device_query(int32_t device, kvp_cuda_device_info_t *info,
                                  char *err, size_t err_size);

/* ------------------------------------------------------------------------ */
/* CUDA stores and contexts                                                  */
/* ------------------------------------------------------------------------ */

/**
 * @brief Device memory hooks (e.g. an engine's caching allocator).
 *
 * Leave both NULL for cudaMalloc / cudaFree. If one is set, both must be.
 * `alloc` returns device memory of the store's or context's device, aligned
 * to at least 256 bytes, or NULL on failure (reported as #KVP_ENOMEM); it is
 * called with that device current. `stream` is the object's stream at the
 * time (allocators that order memory by stream may use it). Called only
 * from kvp_cuda_store_create() / kvp_cuda_ctx_create() (alloc) and the
 * destroy functions (free): never on the hot path.
 */
typedef struct kvp_cuda_allocator {
    /** Allocate `size` bytes of device memory; NULL on failure. */
    void *(*alloc)(void *opaque, size_t size, void *stream);
    /** Free memory returned by `alloc` (`ptr` is never NULL; `size` as allocated). */
    void (*free)(void *opaque, void *ptr, size_t size, void *stream);
    /** Passed unchanged to both hooks. */
    void *opaque;
} kvp_cuda_allocator_t;

/**
 * @brief Device, stream and memory of a CUDA store or context. Fill with
 *        kvp_cuda_params_init().
 */
typedef struct kvp_cuda_params {
    uint32_t struct_size;      /**< sizeof(kvp_cuda_params_t); set by init. */
    int32_t device;            /**< Device ordinal; default 0. */
    void *stream;              /**< cudaStream_t of every call until changed; NULL (default)
                                    is the default stream. Never destroyed by libkvpage. */
    void *arena;               /**< Store only: device memory the engine hands over for the
                                    arena (aligned to #KVP_ARENA_ALIGN), or NULL to allocate.
                                    The engine keeps ownership and must keep it alive until
                                    kvp_store_destroy(). */
    uint64_t arena_bytes;      /**< Size of `arena`: at least kvp_arena_bytes() of the
                                    store's layout. Ignored when `arena` is NULL. */
    uint64_t staging_bytes;    /**< Pinned host memory (and as much device memory) for the
                                    metadata uploaded per call: slots and seals (store),
                                    the CSR view and the schedule (context). 0 = default
                                    (4 MiB: a 1M-page view, or 256k appended rows). */
    kvp_cuda_allocator_t allocator; /**< Device allocations: the arena when `arena` is
                                    NULL, the context's workspace, small per-object buffers. */
} kvp_cuda_params_t;

/**
 * @brief Fill `p` with defaults (device 0, default stream, allocate the arena
 *        with cudaMalloc, 4 MiB of staging) and set its struct_size.
 * @param[out] p Parameters to initialise; NULL is ignored.
 */
KVP_API void kvp_cuda_params_init(kvp_cuda_params_t *p);

/**
 * @brief Create a store whose arena lives on a CUDA device.
 *
 * The arena is the CPU store's, byte for byte (docs/formats.md): one device
 * allocation of exactly kvp_arena_bytes(), or the engine's memory
 * (`cuda->arena`), or one call of the device allocator hook. Every generic
 * store function then works on it (kvp_store_append(), kvp_store_apply_ops(),
 * kvp_store_read(), kvp_store_region() with device addresses,
 * kvp_store_page_to_host(), ...), enqueuing its kernels and copies on the
 * store's stream. The fixed region (fp8 scales) is zeroed here, on the
 * stream, before this returns.
 *
 * @param[in]  params   Shape, formats, page counts; `params->allocator` is
 *                      used for the host-side metadata only.
 * @param[in]  cuda     Device, stream, memory (NULL = kvp_cuda_params_init() defaults).
 * @param[out] out      The new store; untouched on error.
 * @param[out] err      Optional error-detail buffer (the CUDA runtime's text).
 * @param[in]  err_size Its size.
 * @return #KVP_OK; #KVP_EINVAL for bad parameters (an engine arena that is
 *         too small or misaligned); #KVP_ENODEV when the device does not
 *         exist or no driver is usable; #KVP_ENOMEM when device or pinned
 *         memory cannot be had; #KVP_ECUDA for another CUDA error;
 *         #KVP_ENOTSUP in a CPU-only build.
 */
KVP_API int kvp_cuda_store_create(const kvp_store_params_t *params, const kvp_cuda_params_t *cuda,
                                  kvp_store_t **out, char *err, size_t err_size);

/**
 * @brief Create a context that runs attention on a CUDA device.
 *
 * Its device workspace (split-KV partial results) of
 * `params->workspace_bytes` (default 16 MiB) and its staging memory are
 * allocated here, so kvp_attention() allocates nothing. `params->threads`
 * must be valid (1..256) but is not used; `params->isa` is ignored.
 *
 * @param[in]  params   Workspace size; host allocator for the context object.
 * @param[in]  cuda     Device, stream, device allocator (NULL = defaults);
 *                      `arena` and `arena_bytes` are ignored.
 * @param[out] out      The new context; untouched on error.
 * @param[out] err      Optional error-detail buffer.
 * @param[in]  err_size Its size.
 * @return #KVP_OK; #KVP_EINVAL; #KVP_ENODEV; #KVP_ENOMEM; #KVP_ECUDA;
 *         #KVP_ENOTSUP in a CPU-only build.
 */
KVP_API int kvp_cuda_ctx_create(const kvp_ctx_params_t *params, const kvp_cuda_params_t *cuda,
                                kvp_ctx_t **out, char *err, size_t err_size);

/**
 * @brief Create a cache façade (kvpage.h, #kvp_cache_t) whose store and
 *        context live on a CUDA device.
 *
 * The same object as kvp_cache_create() gives, with the store from
 * kvp_cuda_store_create() and the context from kvp_cuda_ctx_create() (both
 * with `cuda`: one device, one stream, so appends and attention are ordered
 * on it), and, with `params->host_bytes`, a host tier in pinned memory
 * (kvp_cuda_host_alloc()) whose swaps are asynchronous copies on that
 * stream. Every kvp_cache_* function then works unchanged:
 * kvp_cache_write() takes device K/V rows, kvp_cache_attend() device
 * queries and outputs; sequences, pages and the step's metadata stay on the
 * host. Call kvp_store_synchronize() on its store (kvp_cache_parts()) before reading
 * results on the host.
 *
 * @param[in]  params   As for kvp_cache_create() (`threads` must be valid, is not used; `isa`
 *                      is ignored).
 * @param[in]  cuda     Device, stream, device allocator, and optionally the engine's arena
 *                      memory for the store (NULL = kvp_cuda_params_init() defaults).
 * @param[out] out      The new cache; untouched on error.
 * @param[out] err      Optional error-detail buffer.
 * @param[in]  err_size Its size.
 * @return #KVP_OK; #KVP_EINVAL as kvp_cache_create() or for a bad `cuda`;
 *         #KVP_ENODEV; #KVP_ENOMEM (device, pinned or host memory);
 *         #KVP_ECUDA; #KVP_ENOTSUP in a CPU-only build.
 */
KVP_API int kvp_cuda_cache_create(const kvp_cache_params_t *params, const kvp_cuda_params_t *cuda,
                                  kvp_cache_t **out, char *err, size_t err_size);

/**
 * @brief Make `stream` the store's stream for every later call.
 *
 * Work already enqueued on the previous stream is ordered before any later
 * work (an event the new stream waits for), so switching is always safe; it
 * costs one event record and wait, and nothing when the stream is the same.
 *
 * @param[in,out] store  A CUDA store.
 * @param[in]     stream A cudaStream_t (NULL: the default stream).
 * @return #KVP_OK; #KVP_EINVAL for NULL or a CPU store; #KVP_ECUDA;
 *         #KVP_ENOTSUP in a CPU-only build.
 */
KVP_API int kvp_cuda_store_set_stream(kvp_store_t *store, void *stream);

/**
 * @brief Make `stream` the context's stream for every later call (see
 *        kvp_cuda_store_set_stream()).
 * @param[in,out] ctx    A CUDA context.
 * @param[in]     stream A cudaStream_t (NULL: the default stream).
 * @return #KVP_OK; #KVP_EINVAL for NULL or a CPU context; #KVP_ECUDA;
 *         #KVP_ENOTSUP in a CPU-only build.
 */
KVP_API int kvp_cuda_ctx_set_stream(kvp_ctx_t *ctx, void *stream);

/**
 * @brief Time the device work of the context's attention calls.
 *
 * With timing on, every kvp_attention() call on `ctx` records an event on
 * the context's stream right before its first kernel and one right after
 * its last (the split merge, when there is one); kvp_cuda_ctx_kernel_time()
 * then gives the time between them. The host's share of a call (checking
 * the arguments, building the schedule, uploading it) is left out, and so is
 * any other work on the stream before or after the call. A call that runs no
 * kernel (an empty batch) times an empty interval. Costs two event records
 * per call; off by default. Events are created at the first enable.
 *
 * @param[in,out] ctx    A CUDA context.
 * @param[in]     enable 1: record from the next call on (and forget the
 *                       last time); 0: stop recording (the last call timed
 *                       stays readable until the next call).
 * @return #KVP_OK; #KVP_EINVAL for NULL, a CPU context or `enable` not 0 or 1;
 *         #KVP_ECUDA; #KVP_ENOTSUP in a CPU-only build. Details in
 *         kvp_ctx_last_error().
 */
KVP_API int kvp_cuda_ctx_set_timing(kvp_ctx_t *ctx, int enable);

/**
 * @brief Device time of the context's last kvp_attention() call, timed as
 *        kvp_cuda_ctx_set_timing() says.
 *
 * Waits for that call's kernels to finish (the end event), not for anything
 * enqueued after them.
 *
 * @param[in,out] ctx     A CUDA context.
 * @param[out]    seconds The time from the call's first kernel's start to its
 *                        last kernel's end (>= 0); untouched on error.
 * @return #KVP_OK; #KVP_EINVAL for NULL, a CPU context or a NULL `seconds`;
 *         #KVP_ESTATE when the context's last call was not timed (timing
 *         was off, no call since timing was turned on, or the call failed);
 *         #KVP_ECUDA (a kernel fault surfaces here); #KVP_ENOTSUP in a
 *         CPU-only build. Details in kvp_ctx_last_error().
 */
KVP_API int kvp_cuda_ctx_kernel_time(kvp_ctx_t *ctx, double *seconds);

/**
 * @brief Choose how the context's attention kernels bring K/V pages on chip.
 *
 * On (the default), when pages are no larger than a kernel tile (32 tokens;
 * 16 at head_dim 256) and every block is 16-byte aligned (always so for a
 * store's own arena), each CTA copies its tiles' blocks whole, in their
 * stored layout, into a ring of 2 or 3 shared-memory stages with
 * asynchronous copies (`cp.async`, sm_80+), a tile's page ids fetched a
 * tile earlier, so the next tiles' loads overlap the current tile's
 * arithmetic; fp16, bf16 and fp32 token-major pages are computed where
 * they land, quantized ones decoded from shared memory. Off, or when the
 * conditions do not hold, a single-buffer loader reads each tile from device
 * memory and decodes it on the way. Both give the same results within the
 * stated tolerances; the switch exists to compare them
 * (`kvpage-bench attention --device cuda`) and as a fallback.
 *
 * @param[in,out] ctx    A CUDA context.
 * @param[in]     enable 1 (default) or 0; takes effect at the next call.
 * @return #KVP_OK; #KVP_EINVAL for NULL, a CPU context or `enable` not 0 or 1;
 *         #KVP_ENOTSUP in a CPU-only build.
 */
KVP_API int kvp_cuda_ctx_set_pipeline(kvp_ctx_t *ctx, int enable);

/**
 * @brief kvp_quantize() on the device: `src` and `dst` are device memory;
 *        the blocks are byte-identical to kvp_quantize()'s, and their padding
 *        (up to #KVP_BLOCK_ALIGN) is written as zeros.
 *
 * Enqueued on `stream` (which is not waited for). Unlike a store, nothing is
 * kept between calls: the device the stream belongs to must be current.
 *
 * @param[in]  desc     Format and shape (as for kvp_quantize()).
 * @param[in]  src      `[pages*page_size][heads][head_dim]` elements of `dtype` (device).
 * @param[in]  pages    Number of pages (>= 1).
 * @param[out] dst      `[pages][heads]` blocks (device).
 * @param[in]  stream   A cudaStream_t.
 * @param[out] err      Optional error-detail buffer.
 * @param[in]  err_size Its size.
 * @return #KVP_OK; #KVP_EINVAL as kvp_quantize(); #KVP_ECUDA;
 *         #KVP_ENOTSUP in a CPU-only build.
 */
KVP_API int kvp_cuda_quantize(const kvp_quant_desc_t *desc, const void *src, int64_t pages,
                              void *dst, void *stream, char *err, size_t err_size);

/**
 * @brief kvp_dequantize() on the device (`src`, `dst` device memory), with
 *        kvp_dequantize()'s exact output.
 * @param[in]  desc     Format and shape.
 * @param[in]  src      `[pages][heads]` blocks (device).
 * @param[in]  pages    Number of pages (>= 1).
 * @param[out] dst      `[pages*page_size][heads][head_dim]` elements of `dtype` (device).
 * @param[in]  stream   A cudaStream_t.
 * @param[out] err      Optional error-detail buffer.
 * @param[in]  err_size Its size.
 * @return #KVP_OK; #KVP_EINVAL; #KVP_ECUDA; #KVP_ENOTSUP in a CPU-only build.
 */
KVP_API int kvp_cuda_dequantize(const kvp_quant_desc_t *desc, const void *src, int64_t pages,
                                void *dst, void *stream, char *err, size_t err_size);

/**
 * @brief Allocate pinned (page-locked) host memory, for asynchronous page
 *        copies (kvp_store_page_to_host()) and the host tier.
 * @param[in]  bytes    Size (> 0).
 * @param[out] ptr      The memory; untouched on error.
 * @param[out] err      Optional error-detail buffer.
 * @param[in]  err_size Its size.
 * @return #KVP_OK; #KVP_EINVAL; #KVP_ENOMEM; #KVP_ENODEV; #KVP_ENOTSUP in a
 *         CPU-only build.
 */
KVP_API int kvp_cuda_host_alloc(uint64_t bytes, void **ptr, char *err, size_t err_size);

/**
 * @brief Free memory from kvp_cuda_host_alloc(). NULL is a no-op.
 * @param[in] ptr The memory.
 */
KVP_API void kvp_cuda_host_free(void *ptr);

#ifdef __cplusplus
}
#endif

#endif /* KVPAGE_CUDA_H */
