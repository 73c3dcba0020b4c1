/**
 * @file kvpage_sched.h
 * @brief libkvpage — a scheduling policy the engine consults once per step:
 *        admission, priorities, a forecast of memory pressure, and which
 *        sequences to swap out, recompute or drop before the pool runs dry.
 *
 * Before 1.0 these functions may still change in a minor release
 * (CHANGELOG.md lists every change); kvpage.h carries the ABI promise.
 */
#ifndef KVPAGE_SCHED_H
#define KVPAGE_SCHED_H

#include "kvpage.h"

#ifdef __cplusplus
extern "C" {
#endif

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
    int64_t total_pages;        /**< Pool pages (required, 1 .. 2^36). */
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
    int64_t prompt_tokens;  /**< Prompt length, 1 .. 2^61-1. */
    int64_t max_new_tokens; /**< Tokens it may generate, 1 .. 2^61-1. */
    int64_t cached_tokens;  /**< Prompt tokens already in the prefix cache (shared pages the
                                 engine will attach), 0 .. prompt_tokens; 0 if unknown. */
    int64_t arrival;        /**< Arrival time in the engine's units, >= 0 (see
                                 kvp_sched_input_t::now). */
    int64_t deadline;       /**< Absolute deadline in the same units, >= 0; 0 = none. */
} kvp_sched_request_t;

/**
 * @brief Queue a request. O(log waiting).
 * @param[in] s   The scheduler.
 * @param[in] req The request.
 * @return #KVP_OK; #KVP_EINVAL (NULL, bad struct_size, a field outside the
 *         range #kvp_sched_request_t gives, duplicate id); #KVP_ENOSPC when
 *         max_requests are already tracked. On error nothing changes and
 *         kvp_sched_last_error() says why. A request that can never fit is
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
    int32_t reserved_;       /**< Padding; must be 0 (checked). */
    int64_t free_pages;      /**< Pool pages free now, evictable cached pages included; >= 0.
                                  More than total_pages counts as total_pages. */
    int64_t free_staging;    /**< Staging pages free now, >= 0 (ignored without staging). */
    uint64_t host_free_bytes;/**< Bytes free in the host tier now. */
    int64_t now;             /**< Current time in the engine's units (for deadlines and
                                  max_queue_delay), >= 0. It need not increase: a request
                                  whose arrival is later than `now` has not waited yet. */
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
 * The plan never reserves more pages than the input reports free
 * (`pages_needed <= free_pages`), nor more staging pages than are free; its
 * prefill and decode entries stay within max_batch and token_budget.
 *
 * @param[in]  s    The scheduler.
 * @param[in]  in   The pool and host-tier state now.
 * @param[out] plan The plan (struct_size set by the caller).
 * @return #KVP_OK or #KVP_EINVAL (NULL, bad struct_size, negative free_pages,
 *         free_staging or now, reserved_ not 0; nothing changes and
 *         kvp_sched_last_error() says why). O(resident + changed); no
 *         allocation.
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

#ifdef __cplusplus
}
#endif

#endif /* KVPAGE_SCHED_H */
