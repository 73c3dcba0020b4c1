/*
 * kvpage-sim's engine: traces (presets or files), a step-time cost model, and
 * strategies that drive the real pool, table, tier and scheduler. The CLI
 * (sim_cli.c) formats what sim_run() measures. Not part of the library.
 */
#ifndef KVPAGE_TOOLS_SIM_H
#define KVPAGE_TOOLS_SIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* ---- traces ---------------------------------------------------------------- */

typedef struct {
    double arrival;         /* seconds from the start of the trace */
    int64_t prompt;         /* prompt tokens */
    int64_t output;         /* tokens generated before EOS */
    int64_t max_new;        /* the request's max_new_tokens (>= output) */
    int32_t priority;       /* higher runs first */
} sim_request;

typedef struct {
    sim_request *r;         /* sorted by arrival */
    int64_t n;
    double duration;        /* seconds of arrivals the trace was generated for (presets) */
} sim_trace;

/* Names of the presets, NULL-terminated. */
extern const char *const sim_preset_names[];

/* Generate a preset trace (deterministic for a seed). `scale` multiplies the
 * traffic's duration and `load` its arrival rates (1.0 = the preset as
 * documented). Returns 0, or -1 with a sentence in err. */
int sim_trace_preset(const char *name, uint64_t seed, double scale, double load, sim_trace *out,
                     char *err, size_t err_size);
/* Read a trace from a CSV or JSONL file (see kvpage-sim --help). */
int sim_trace_load(const char *path, sim_trace *out, char *err, size_t err_size);
/* Write a trace as CSV (the format sim_trace_load reads). */
int sim_trace_save(const sim_trace *t, const char *path, char *err, size_t err_size);
void sim_trace_free(sim_trace *t);

/* ---- configuration ------------------------------------------------------------ */

enum { SIM_STATIC, SIM_PAGED, SIM_PAGED_INT8, SIM_PAGED_INT4, SIM_FULL, SIM_NSTRATEGIES };
extern const char *const sim_strategy_names[SIM_NSTRATEGIES];

typedef struct {
    /* model */
    int32_t layers, kv_heads, head_dim, q_heads;
    uint64_t params;            /* parameter count: weight bytes and flops per token */
    uint64_t weight_bytes;
    /* memory */
    uint64_t kv_budget;         /* bytes for the KV cache (pages + staging pages) */
    uint64_t host_bytes;        /* the host tier's budget (strategy full) */
    int32_t page_size;
    /* cost model */
    double device_gbps;         /* device memory bandwidth, GB/s */
    double host_gbps;           /* host link, GB/s */
    double tflops;              /* dense matmul rate actually reached, TFLOP/s */
    double step_overhead_s;     /* fixed cost of a step (launches, sampling, scheduling) */
    /* engine */
    int32_t max_batch, token_budget, prefill_chunk;
    int32_t horizon, hysteresis;   /* strategy full */
    int32_t drop_below;            /* strategy full: kvp_sched_params_t::drop_below_priority */
    int32_t full_k, full_v;        /* strategy full: K and V formats */
    int64_t static_max_len;        /* strategy static: slot length; 0 = the trace's longest */
    double drain_s;                /* simulate this long after the last arrival at most */
    bool check;                    /* verify the pool/table/tier invariants every step (slow) */
} sim_config;

void sim_config_default(sim_config *c);

/* ---- results ---------------------------------------------------------------- */

#define SIM_MAX_CLASSES 16

typedef struct {
    int32_t priority;
    int64_t requests, completed;
    double latency_p50, latency_p99; /* seconds, arrival to last token */
    double ttft_p50, ttft_p99;       /* seconds, arrival to first token */
} sim_class;

typedef struct {
    double t;                   /* end of the step, seconds */
    float mem_gib;              /* KV memory in use (pages held, reserved pages included) */
    float host_gib;             /* host tier in use */
    int32_t queue;              /* requests waiting (queued, or swapped out) */
} sim_sample;

typedef struct {
    int strategy;
    char format[24];            /* "fp16", "int8/int4", ... */
    int64_t pages, staging_pages;
    int64_t batch_limit;        /* static: slots; paged: max_batch */
    int64_t slot_len;           /* static: tokens per slot */
    int64_t requests, completed, dropped, rejected, failed, unfinished;
    int64_t oom;                /* allocation failures the engine would crash on */
    int64_t preemptions, swap_outs, swap_ins, drops;
    int64_t steps, output_tokens;
    double sim_time;            /* seconds simulated */
    double throughput;          /* output tokens of completed requests per second */
    double utilization, utilization_p5;
    double swap_gib;            /* bytes moved over the host link */
    double peak_mem_gib, peak_host_gib;
    int32_t nclasses;
    sim_class cls[SIM_MAX_CLASSES]; /* by priority, ascending */
    sim_sample *series;
    int64_t nseries;
} sim_result;

/* Run one strategy over a trace. Returns 0, or -1 with a sentence in err
 * (a setup failure: the library refused the configuration). */
int sim_run(const sim_config *c, const sim_trace *t, int strategy, sim_result *out, char *err,
            size_t err_size);
void sim_result_free(sim_result *r);

#endif
