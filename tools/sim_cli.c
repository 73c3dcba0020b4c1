/*
 * kvpage-sim: run KV-cache strategies side by side on one trace and memory
 * budget (sim.c does the work), and print a table, a JSON object and an SVG
 * plot of memory and queue length over time.
 */
#include "sim_cli.h"

#include "cli.h"
#include "kvpage.h"
#include "kvpage_plan.h"
#include "sim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define TOOL "kvpage-sim"

/* Peak memory bandwidth and dense bf16 matmul rate of the planner's cards
 * (vendor datasheets). The cost model uses half the matmul peak by default. */
static const struct {
    const char *name;
    double gbps, tflops;
} cards[] = {
    {"h100-80g", 3350, 989},    {"h200-141g", 4800, 989}, {"a100-40g", 1555, 312},
    {"a100-80g", 2039, 312},    {"l4-24g", 300, 121},     {"rtx4090-24g", 1008, 165},
    {"jetson-orin-8g", 102, 17},
};

typedef struct {
    const char *preset, *trace, *save_trace, *model, *gpu, *kv_budget, *host, *weight_dtype;
    const char *strategies, *full_format, *plot;
    int64_t seed, page_size, max_batch, token_budget, prefill_chunk, horizon, hysteresis;
    int64_t drop_below, static_max_len;
    double scale, load, device_gbps, host_gbps, tflops, overhead_ms, drain;
    bool json, check, help, drop_below_set;
} options;

static void usage(FILE *f) {
    fputs(
        "usage: kvpage-sim [trace] [model and memory] [cost model] [engine] [output]\n"
        "\n"
        "Replays a trace through KV-cache strategies side by side, on the same memory\n"
        "budget, driving libkvpage's real pool, page table, host tier and scheduler;\n"
        "a step's duration comes from the bytes and flops it moves.\n"
        "\n"
        "strategies (--strategies, comma-separated; default all):\n"
        "  static      a slot of the longest request's length per running request,\n"
        "              fixed batch (engines without paging); fp16\n"
        "  paged       pages, fp16, no host tier, reactive recompute preemption, FCFS\n"
        "  paged-int8, paged-int4   the same with int8 or int4 K/V\n"
        "  full        pages + int8 K / int4 V + host tier + priorities + forecast\n"
        "trace:\n"
        "  --preset NAME        long-context, burst or mixed (default mixed)\n"
        "  --trace FILE         a trace file instead: CSV lines arrival_s,prompt_tokens,\n"
        "                       output_tokens,priority[,max_new_tokens] (a header line is\n"
        "                       skipped), or JSONL objects with those keys\n"
        "  --seed N             seed of the preset (default 1)\n"
        "  --scale F            stretch the preset's duration (default 1)\n"
        "  --load F             multiply the preset's arrival rates (default 1)\n"
        "  --save-trace FILE    write the trace as CSV\n"
        "model and memory:\n"
        "  --model NAME         a planner preset (default llama-3.1-8b)\n"
        "  --gpu NAME           the card: memory, bandwidth, matmul rate (default h100-80g)\n"
        "  --kv-budget SIZE     the KV budget (default: the planner's, 90% of what the\n"
        "                       weights leave)\n"
        "  --weight-dtype T     bf16 (default), fp16, fp8, int8, int4\n"
        "  --host SIZE          host tier of strategy full (default: the KV budget)\n"
        "  --page-size N        tokens per page (default 16)\n"
        "cost model:\n"
        "  --device-gbps F      device memory bandwidth, GB/s (default: the card's)\n"
        "  --host-gbps F        host link, GB/s (default 25)\n"
        "  --tflops F           matmul rate reached, TFLOP/s (default: half the card's peak)\n"
        "  --step-overhead-ms F fixed cost per step (default 0.5)\n"
        "engine:\n"
        "  --max-batch N        sequences per step (default 256)\n"
        "  --token-budget N     tokens per step (default 2048)\n"
        "  --prefill-chunk N    prefill tokens per sequence per step (default 2048)\n"
        "  --horizon N          full: forecast horizon in steps (default 64)\n"
        "  --hysteresis N       full: steps a sequence is protected (default 16)\n"
        "  --full-format K[/V]  full: K and V formats (default int8/int4)\n"
        "  --drop-below P       full: drop victims of priority below P (default never)\n"
        "  --static-max-len N   static: slot length (default the longest request)\n"
        "  --drain S            stop S seconds after the last arrival (default 600)\n"
        "  --check              verify the library's invariants every step (slow)\n"
        "output:\n"
        "  --json               after the table, one JSON object keyed by strategy (last line)\n"
        "  --plot FILE.svg      memory in use and queue length over time, per strategy\n"
        "  --help\n",
        f);
}

static int parse_args(int argc, char **argv, options *o, FILE *errf) {
    memset(o, 0, sizeof *o);
    o->preset = NULL;
    o->model = "llama-3.1-8b";
    o->gpu = "h100-80g";
    o->weight_dtype = "bf16";
    o->seed = 1;
    o->scale = 1;
    o->load = 1;
    o->page_size = 16;
    o->max_batch = 256;
    o->token_budget = 2048;
    o->prefill_chunk = 2048;
    o->horizon = 64;
    o->hysteresis = 16;
    o->host_gbps = 25;
    o->overhead_ms = 0.5;
    o->drain = 600;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char **str = NULL;
        int64_t *num = NULL, lo = 0, hi = 0;
        bool allow_k = false; /* token counts take a k suffix (x1024) */
        double *real = NULL, rlo = 0, rhi = 0;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) o->help = true;
        else if (!strcmp(a, "--json")) o->json = true;
        else if (!strcmp(a, "--check")) o->check = true;
        else if (!strcmp(a, "--preset")) str = &o->preset;
        else if (!strcmp(a, "--trace")) str = &o->trace;
        else if (!strcmp(a, "--save-trace")) str = &o->save_trace;
        else if (!strcmp(a, "--model")) str = &o->model;
        else if (!strcmp(a, "--gpu")) str = &o->gpu;
        else if (!strcmp(a, "--kv-budget")) str = &o->kv_budget;
        else if (!strcmp(a, "--host")) str = &o->host;
        else if (!strcmp(a, "--weight-dtype")) str = &o->weight_dtype;
        else if (!strcmp(a, "--strategies")) str = &o->strategies;
        else if (!strcmp(a, "--full-format")) str = &o->full_format;
        else if (!strcmp(a, "--plot")) str = &o->plot;
        else if (!strcmp(a, "--seed")) num = &o->seed, lo = 0, hi = INT64_MAX;
        else if (!strcmp(a, "--page-size")) num = &o->page_size, lo = 2, hi = KVP_MAX_PAGE_SIZE;
        else if (!strcmp(a, "--max-batch")) num = &o->max_batch, lo = 1, hi = 65536;
        else if (!strcmp(a, "--token-budget"))
            num = &o->token_budget, lo = 1, hi = 1 << 24, allow_k = true;
        else if (!strcmp(a, "--prefill-chunk"))
            num = &o->prefill_chunk, lo = 1, hi = 1 << 24, allow_k = true;
        else if (!strcmp(a, "--horizon")) num = &o->horizon, lo = 0, hi = 1 << 20;
        else if (!strcmp(a, "--hysteresis")) num = &o->hysteresis, lo = 0, hi = 1 << 20;
        else if (!strcmp(a, "--drop-below")) {
            num = &o->drop_below, lo = INT32_MIN, hi = INT32_MAX;
            o->drop_below_set = true;
        } else if (!strcmp(a, "--static-max-len"))
            num = &o->static_max_len, lo = 1, hi = 1 << 30, allow_k = true;
        else if (!strcmp(a, "--scale")) real = &o->scale, rlo = 1e-3, rhi = 1e3;
        else if (!strcmp(a, "--load")) real = &o->load, rlo = 1e-3, rhi = 1e3;
        else if (!strcmp(a, "--device-gbps")) real = &o->device_gbps, rlo = 1e-3, rhi = 1e6;
        else if (!strcmp(a, "--host-gbps")) real = &o->host_gbps, rlo = 1e-3, rhi = 1e6;
        else if (!strcmp(a, "--tflops")) real = &o->tflops, rlo = 1e-3, rhi = 1e6;
        else if (!strcmp(a, "--step-overhead-ms")) real = &o->overhead_ms, rlo = 0, rhi = 1e4;
        else if (!strcmp(a, "--drain")) real = &o->drain, rlo = 0, rhi = 1e9;
        else return cli_unknown_option(TOOL, a, errf);
        if (str != NULL) {
            if ((*str = cli_opt_value(TOOL, argc, argv, &i, errf)) == NULL) return 2;
            if (**str == '\0') return cli_error(errf, TOOL, "%s: the value is empty ('')", a);
        }
        if (num != NULL && !cli_opt_i64(TOOL, argc, argv, &i, lo, hi, allow_k, num, errf))
            return 2;
        if (real != NULL && !cli_opt_double(TOOL, argc, argv, &i, rlo, rhi, real, errf))
            return 2;
    }
    if (o->preset && o->trace) {
        fprintf(errf, "%s: --preset and --trace are exclusive\n", TOOL);
        return 2;
    }
    if (!o->preset && !o->trace) o->preset = "mixed";
    return 0;
}

static int strategy_list(const char *text, bool on[SIM_NSTRATEGIES], FILE *errf) {
    for (int s = 0; s < SIM_NSTRATEGIES; s++) on[s] = text == NULL;
    if (text == NULL) return 0;
    /* comma-separated names, each one known; no empty item, not empty */
    int count = 0;
    for (const char *p = text;; p++) {
        const char *comma = strchr(p, ',');
        size_t len = comma != NULL ? (size_t)(comma - p) : strlen(p);
        int found = -1;
        for (int s = 0; s < SIM_NSTRATEGIES; s++)
            if (strlen(sim_strategy_names[s]) == len && !strncmp(p, sim_strategy_names[s], len))
                found = s;
        if (found < 0) {
            fprintf(errf, "%s: --strategies '%s': %s '%.*s' (static, paged, paged-int8, "
                    "paged-int4, full)\n", TOOL, text,
                    len == 0 ? "empty strategy name" : "unknown strategy", (int)len, p);
            return 2;
        }
        on[found] = true;
        count++;
        if (comma == NULL) break;
        p = comma;
    }
    return count > 0 ? 0 : 2;
}

/* Model, budget and cost model from the options. */
static int configure(const options *o, sim_config *c, FILE *errf) {
    char err[KVP_ERR_SIZE];
    sim_config_default(c);
    kvp_model_preset_t m = {.struct_size = sizeof m};
    if (kvp_model_preset_find(o->model, &m, err, sizeof err) != KVP_OK) {
        fprintf(errf, "%s: --model: %s\n", TOOL, err);
        return 2;
    }
    c->layers = m.layers;
    c->kv_heads = m.kv_heads;
    c->head_dim = m.head_dim;
    c->q_heads = m.q_heads;
    c->params = m.params;
    if (kvp_weight_bytes(m.params, o->weight_dtype, &c->weight_bytes, err, sizeof err) != KVP_OK) {
        fprintf(errf, "%s: --weight-dtype: %s\n", TOOL, err);
        return 2;
    }
    int card = -1;
    for (size_t k = 0; k < sizeof cards / sizeof cards[0]; k++)
        if (!strcmp(cards[k].name, o->gpu)) card = (int)k;
    kvp_gpu_preset_t g = {.struct_size = sizeof g};
    if (kvp_gpu_preset_find(o->gpu, &g, err, sizeof err) != KVP_OK || card < 0) {
        fprintf(errf, "%s: --gpu: %s\n", TOOL,
                card < 0 ? "unknown card (h100-80g h200-141g a100-40g a100-80g l4-24g "
                           "rtx4090-24g jetson-orin-8g)" : err);
        return 2;
    }
    c->page_size = (int32_t)o->page_size;
    if (o->kv_budget) {
        if (kvp_parse_size(o->kv_budget, &c->kv_budget, err, sizeof err) != KVP_OK) {
            fprintf(errf, "%s: --kv-budget: %s\n", TOOL, err);
            return 2;
        }
    } else {
        kvp_plan_params_t pp;
        kvp_plan_params_init(&pp);
        pp.layers = c->layers;
        pp.kv_heads = c->kv_heads;
        pp.head_dim = c->head_dim;
        pp.page_size = c->page_size;
        pp.memory_bytes = g.memory_bytes;
        pp.weight_bytes = c->weight_bytes;
        kvp_plan_t plan = {.struct_size = sizeof plan};
        if (kvp_plan_compute(&pp, &plan, err, sizeof err) != KVP_OK) {
            fprintf(errf, "%s: %s on %s: %s\n", TOOL, o->model, o->gpu, err);
            return 2;
        }
        c->kv_budget = plan.kv_budget_bytes;
    }
    c->host_bytes = c->kv_budget;
    if (o->host && kvp_parse_size(o->host, &c->host_bytes, err, sizeof err) != KVP_OK) {
        fprintf(errf, "%s: --host: %s\n", TOOL, err);
        return 2;
    }
    c->device_gbps = o->device_gbps > 0 ? o->device_gbps : cards[card].gbps;
    c->tflops = o->tflops > 0 ? o->tflops : cards[card].tflops * 0.5;
    c->host_gbps = o->host_gbps;
    c->step_overhead_s = o->overhead_ms / 1000.0;
    c->max_batch = (int32_t)o->max_batch;
    c->token_budget = (int32_t)o->token_budget;
    c->prefill_chunk = (int32_t)o->prefill_chunk;
    c->horizon = (int32_t)o->horizon;
    c->hysteresis = (int32_t)o->hysteresis;
    c->drop_below = o->drop_below_set ? (int32_t)o->drop_below : INT32_MIN;
    c->static_max_len = o->static_max_len;
    c->drain_s = o->drain;
    c->check = o->check;
    if (o->full_format) {
        char buf[64];
        if (strlen(o->full_format) >= sizeof buf) {
            fprintf(errf, "%s: --full-format: '%.64s...' is not K[/V]\n", TOOL, o->full_format);
            return 2;
        }
        snprintf(buf, sizeof buf, "%s", o->full_format);
        char *slash = strchr(buf, '/');
        if (slash) *slash = 0;
        if (kvp_format_parse(buf, &c->full_k, err, sizeof err) != KVP_OK ||
            kvp_format_parse(slash ? slash + 1 : buf, &c->full_v, err, sizeof err) != KVP_OK) {
            fprintf(errf, "%s: --full-format: %s\n", TOOL, err);
            return 2;
        }
    }
    return 0;
}

/* ---- the table -------------------------------------------------------------- */

#define COLW 13

static void row_head(FILE *f, const char *label) { fprintf(f, "%-24s", label); }

static void cell(FILE *f, const char *text) { fprintf(f, "%*s", COLW, text); }

static const sim_class *class_of(const sim_result *r, int32_t prio) {
    for (int k = 0; k < r->nclasses; k++)
        if (r->cls[k].priority == prio) return &r->cls[k];
    return NULL;
}

static void print_table(FILE *f, const sim_result *res, int n) {
    char b[64], b2[32];
    row_head(f, "strategy");
    for (int s = 0; s < n; s++) cell(f, sim_strategy_names[res[s].strategy]);
    fputc('\n', f);
#define ROW(label, ...)                               \
    do {                                              \
        row_head(f, label);                           \
        for (int s = 0; s < n; s++) {                 \
            const sim_result *r = &res[s];            \
            (void)r;                                  \
            snprintf(b, sizeof b, __VA_ARGS__);       \
            cell(f, b);                               \
        }                                             \
        fputc('\n', f);                               \
    } while (0)
    ROW("KV format", "%s", r->format);
    ROW("pages", "%s", cli_thousands(b2, sizeof b2, (uint64_t)r->pages));
    ROW("batch limit", r->slot_len ? "%lld x %lldk" : "%lld", (long long)r->batch_limit,
        (long long)(r->slot_len / 1024));
    ROW("OOM events", "%lld", (long long)r->oom);
    ROW("KV utilization, mean", "%.3f", r->utilization);
    ROW("KV utilization, p5", "%.3f", r->utilization_p5);
    ROW("throughput, tok/s", "%.0f", r->throughput);
    ROW("completed", "%lld/%lld", (long long)r->completed, (long long)r->requests);
    for (int k = 0; k < res[0].nclasses; k++) {
        int32_t p = res[0].cls[k].priority;
        char label[64];
        snprintf(label, sizeof label, "prio %d: completed", (int)p);
        ROW(label, "%.1f%%", class_of(r, p)->requests
                                 ? 100.0 * (double)class_of(r, p)->completed /
                                       (double)class_of(r, p)->requests
                                 : 0.0);
        snprintf(label, sizeof label, "prio %d: latency p50", (int)p);
        ROW(label, "%.2f s", class_of(r, p)->latency_p50);
        snprintf(label, sizeof label, "prio %d: latency p99", (int)p);
        ROW(label, "%.2f s", class_of(r, p)->latency_p99);
        snprintf(label, sizeof label, "prio %d: TTFT p99", (int)p);
        ROW(label, "%.2f s", class_of(r, p)->ttft_p99);
    }
    ROW("preemptions", "%lld", (long long)r->preemptions);
    ROW("swaps out / in", "%lld/%lld", (long long)r->swap_outs, (long long)r->swap_ins);
    ROW("drops", "%lld", (long long)r->drops);
    ROW("swapped, GiB", "%.1f", r->swap_gib);
    ROW("peak KV / host, GiB", "%.1f/%.1f", r->peak_mem_gib, r->peak_host_gib);
    ROW("unfinished at the end", "%lld", (long long)r->unfinished);
    ROW("simulated", "%.0f s", r->sim_time);
    ROW("steps", "%lld", (long long)r->steps);
#undef ROW
}

static void print_json(FILE *f, const sim_result *res, int n) {
    cli_json j;
    cli_json_begin(&j, f);
    for (int s = 0; s < n; s++) {
        const sim_result *r = &res[s];
        cli_json_object(&j, sim_strategy_names[r->strategy]);
        cli_json_str(&j, "format", r->format);
        cli_json_i64(&j, "pages", r->pages);
        cli_json_i64(&j, "staging_pages", r->staging_pages);
        cli_json_i64(&j, "batch_limit", r->batch_limit);
        cli_json_i64(&j, "oom", r->oom);
        cli_json_num(&j, "utilization", r->utilization);
        cli_json_num(&j, "utilization_p5", r->utilization_p5);
        cli_json_num(&j, "throughput", r->throughput);
        cli_json_i64(&j, "requests", r->requests);
        cli_json_i64(&j, "completed", r->completed);
        cli_json_i64(&j, "dropped", r->dropped);
        cli_json_i64(&j, "rejected", r->rejected);
        cli_json_i64(&j, "failed", r->failed);
        cli_json_i64(&j, "unfinished", r->unfinished);
        cli_json_i64(&j, "preemptions", r->preemptions);
        cli_json_i64(&j, "swaps", r->swap_outs);
        cli_json_i64(&j, "swap_ins", r->swap_ins);
        cli_json_i64(&j, "drops", r->drops);
        cli_json_num(&j, "swap_gib", r->swap_gib);
        cli_json_num(&j, "peak_kv_gib", r->peak_mem_gib);
        cli_json_num(&j, "peak_host_gib", r->peak_host_gib);
        const sim_class *hi = r->nclasses ? &r->cls[r->nclasses - 1] : NULL;
        if (hi) {
            cli_json_i64(&j, "high_priority", hi->priority);
            cli_json_num(&j, "high_completed_share",
                         hi->requests ? (double)hi->completed / (double)hi->requests : 0);
            cli_json_num(&j, "high_latency_p99", hi->latency_p99);
        }
        static const char *const keys[] = {"latency_p50", "latency_p99", "ttft_p50", "ttft_p99",
                                           "completed_share"};
        for (int m = 0; m < 5; m++) {
            cli_json_object(&j, keys[m]);
            for (int k = 0; k < r->nclasses; k++) {
                const sim_class *cl = &r->cls[k];
                char key[16];
                snprintf(key, sizeof key, "%d", (int)cl->priority);
                double v = m == 0 ? cl->latency_p50 : m == 1 ? cl->latency_p99
                         : m == 2 ? cl->ttft_p50 : m == 3 ? cl->ttft_p99
                         : (cl->requests ? (double)cl->completed / (double)cl->requests : 0);
                cli_json_num(&j, key, v);
            }
            cli_json_close(&j);
        }
        cli_json_num(&j, "sim_time", r->sim_time);
        cli_json_i64(&j, "steps", r->steps);
        cli_json_close(&j);
    }
    cli_json_end(&j);
}

/* ---- the plot: hand-written SVG ------------------------------------------------ */

static const char *const colors[SIM_NSTRATEGIES] = {"#7f7f7f", "#1f77b4", "#2ca02c", "#9467bd",
                                                    "#d62728"};

static void xml_text(FILE *f, const char *s) {
    for (; *s; s++) {
        if (*s == '&') fputs("&amp;", f);
        else if (*s == '<') fputs("&lt;", f);
        else if (*s == '>') fputs("&gt;", f);
        else if (*s == '"') fputs("&quot;", f);
        else fputc(*s, f);
    }
}

/* A "nice" tick step (1, 2 or 5 x 10^k) for about 5 ticks over [0, hi]. */
static double tick_step(double hi) {
    if (!(hi > 0)) return 1;
    double raw = hi / 5, p = pow(10, floor(log10(raw))), m = raw / p;
    return (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10) * p;
}

typedef struct {
    double x0, y0, w, h, tmax, ymax;
} panel;

static double px(const panel *p, double t) { return p->x0 + p->w * (t / p->tmax); }
static double py(const panel *p, double v) { return p->y0 + p->h * (1 - v / p->ymax); }

static void axes(FILE *f, const panel *p, const char *ylabel, bool xlabels) {
    fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" "
            "stroke=\"#333\"/>\n", p->x0, p->y0, p->w, p->h);
    double ys = tick_step(p->ymax);
    for (double v = 0; v <= p->ymax * 1.0001; v += ys) {
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n",
                p->x0, py(p, v), p->x0 + p->w, py(p, v));
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\" font-size=\"12\">%g</text>\n",
                p->x0 - 6, py(p, v) + 4, v);
    }
    double xs = tick_step(p->tmax);
    for (double t = 0; t <= p->tmax * 1.0001; t += xs) {
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#eee\"/>\n",
                px(p, t), p->y0, px(p, t), p->y0 + p->h);
        if (xlabels)
            fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" font-size=\"12\">%g"
                    "</text>\n", px(p, t), p->y0 + p->h + 16, t);
    }
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"13\" text-anchor=\"middle\" "
            "transform=\"rotate(-90 %.1f %.1f)\">", p->x0 - 52, p->y0 + p->h / 2, p->x0 - 52,
            p->y0 + p->h / 2);
    xml_text(f, ylabel);
    fputs("</text>\n", f);
}

/* One line per strategy: the maximum of each pixel column. */
static void series(FILE *f, const panel *p, const sim_result *r, double t0, int which,
                   const char *color, const char *dash) {
    int cols = (int)p->w;
    double *best = malloc((size_t)cols * sizeof *best);
    if (best == NULL) return;
    for (int k = 0; k < cols; k++) best[k] = -1;
    for (int64_t i = 0; i < r->nseries; i++) {
        const sim_sample *s = &r->series[i];
        int k = (int)((s->t - t0) / p->tmax * (cols - 1));
        if (k < 0 || k >= cols) continue;
        double v = which == 0 ? s->mem_gib : which == 1 ? s->host_gib : (double)s->queue;
        if (v > best[k]) best[k] = v;
    }
    fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\"%s points=\"", color,
            dash);
    int npts = 0;
    for (int k = 0; k < cols; k++) {
        if (best[k] < 0) continue;
        fprintf(f, "%s%.1f,%.1f", npts++ ? " " : "", p->x0 + k, py(p, best[k]));
    }
    fputs("\"/>\n", f);
    free(best);
}

static int write_svg(const char *path, const sim_result *res, int n, double t0, double budget_gib,
                     const char *title, FILE *errf) {
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        fprintf(errf, "%s: --plot: cannot write %s\n", TOOL, path);
        return 1;
    }
    double tmax = 1, mem = budget_gib, queue = 1;
    bool host = false;
    for (int s = 0; s < n; s++)
        for (int64_t i = 0; i < res[s].nseries; i++) {
            const sim_sample *x = &res[s].series[i];
            if (x->t - t0 > tmax) tmax = x->t - t0;
            if (x->mem_gib > mem) mem = x->mem_gib;
            if (x->host_gib > mem) mem = x->host_gib;
            if (x->queue > queue) queue = x->queue;
            host |= x->host_gib > 0;
        }
    const double W = 1000, H = 720;
    panel top = {80, 60, 700, 260, tmax, mem * 1.05};
    panel bottom = {80, 390, 700, 260, tmax, queue * 1.05};
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
            "viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\">\n"
            "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n", W, H, W, H);
    fprintf(f, "<text x=\"%.0f\" y=\"28\" font-size=\"16\" text-anchor=\"middle\">", W / 2);
    xml_text(f, title);
    fputs("</text>\n", f);
    axes(f, &top, "KV memory in use (GiB)", false);
    axes(f, &bottom, "queue (waiting or swapped out)", true);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"13\" text-anchor=\"middle\">time (s)"
            "</text>\n", bottom.x0 + bottom.w / 2, bottom.y0 + bottom.h + 40);
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#000\" "
            "stroke-dasharray=\"2,3\"/>\n", top.x0, py(&top, budget_gib), top.x0 + top.w,
            py(&top, budget_gib));
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\">KV budget</text>\n",
            top.x0 + 4, py(&top, budget_gib) - 4);
    for (int s = 0; s < n; s++) {
        const char *color = colors[res[s].strategy];
        series(f, &top, &res[s], t0, 0, color, "");
        if (res[s].peak_host_gib > 0)
            series(f, &top, &res[s], t0, 1, color, " stroke-dasharray=\"6,3\"");
        series(f, &bottom, &res[s], t0, 2, color, "");
    }
    /* legend */
    double lx = top.x0 + top.w + 24, ly = top.y0 + 10;
    for (int s = 0; s < n; s++, ly += 22) {
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
                "stroke-width=\"3\"/>\n", lx, ly, lx + 24, ly, colors[res[s].strategy]);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"13\">", lx + 30, ly + 4);
        xml_text(f, sim_strategy_names[res[s].strategy]);
        fprintf(f, " (%s)</text>\n", res[s].format);
    }
    if (host) {
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#555\" "
                "stroke-width=\"2\" stroke-dasharray=\"6,3\"/>\n", lx, ly, lx + 24, ly);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"13\">host tier in use</text>\n",
                lx + 30, ly + 4);
    }
    fputs("</svg>\n", f);
    if (fclose(f) != 0) {
        fprintf(errf, "%s: --plot: cannot write %s\n", TOOL, path);
        return 1;
    }
    return 0;
}

/* ---- main ------------------------------------------------------------------------- */

int kvp_tool_sim(int argc, char **argv, FILE *out, FILE *errf) {
    options o;
    int rc = parse_args(argc, argv, &o, errf);
    if (rc) return rc;
    if (o.help) {
        usage(out);
        return 0;
    }
    bool on[SIM_NSTRATEGIES];
    sim_config c;
    if ((rc = strategy_list(o.strategies, on, errf)) || (rc = configure(&o, &c, errf))) return rc;
    char err[512];
    sim_trace t;
    if (o.trace ? sim_trace_load(o.trace, &t, err, sizeof err)
                : sim_trace_preset(o.preset, (uint64_t)o.seed, o.scale, o.load, &t, err,
                                   sizeof err)) {
        fprintf(errf, "%s: %s\n", TOOL, err);
        return 2;
    }
    if (o.save_trace && sim_trace_save(&t, o.save_trace, err, sizeof err)) {
        fprintf(errf, "%s: --save-trace: %s\n", TOOL, err);
        sim_trace_free(&t);
        return 1;
    }
    char b1[32], b2[32], b3[32], what[512];
    int64_t classes[SIM_MAX_CLASSES][2];
    int nc = 0;
    for (int64_t i = 0; i < t.n; i++) {
        int k = 0;
        while (k < nc && classes[k][0] != t.r[i].priority) k++;
        if (k == nc && nc < SIM_MAX_CLASSES) classes[nc][0] = t.r[i].priority, classes[nc++][1] = 0;
        if (k < nc) classes[k][1]++;
    }
    if (o.trace) snprintf(what, sizeof what, "trace %s", o.trace);
    else snprintf(what, sizeof what, "preset %s, seed %lld", o.preset, (long long)o.seed);
    fprintf(out, "kvpage-sim %s: %s: %s requests over %.0f s (priority:requests", KVP_VERSION_STRING,
            what, cli_thousands(b1, sizeof b1, (uint64_t)t.n), t.duration);
    for (int k = 0; k < nc; k++) fprintf(out, " %lld:%lld", (long long)classes[k][0], (long long)classes[k][1]);
    fprintf(out, ")\n");
    fprintf(out, "model %s on %s: KV budget %s, weights %s, host tier %s\n", o.model, o.gpu,
            cli_bytes(b1, sizeof b1, c.kv_budget), cli_bytes(b2, sizeof b2, c.weight_bytes),
            cli_bytes(b3, sizeof b3, c.host_bytes));
    fprintf(out, "cost model: device %.0f GB/s, host link %.0f GB/s, matmul %.0f TFLOP/s, "
            "%.2f ms per step\n\n", c.device_gbps, c.host_gbps, c.tflops, c.step_overhead_s * 1e3);
    fflush(out);

    sim_result res[SIM_NSTRATEGIES];
    int n = 0;
    rc = 0;
    for (int s = 0; s < SIM_NSTRATEGIES && rc == 0; s++) {
        if (!on[s]) continue;
        clock_t w0 = clock();
        if (sim_run(&c, &t, s, &res[n], err, sizeof err)) {
            fprintf(errf, "%s: %s: %s\n", TOOL, sim_strategy_names[s], err);
            rc = 1;
            break;
        }
        fprintf(errf, "%s: %s simulated in %.2f s of CPU\n", TOOL, sim_strategy_names[s],
                (double)(clock() - w0) / CLOCKS_PER_SEC);
        n++;
    }
    if (rc == 0) {
        print_table(out, res, n);
        if (o.plot) {
            char title[1024];
            snprintf(title, sizeof title, "kvpage-sim: %s; %s on %s, KV budget %s", what, o.model,
                     o.gpu, cli_bytes(b1, sizeof b1, c.kv_budget));
            rc = write_svg(o.plot, res, n, t.r[0].arrival,
                           (double)c.kv_budget / (1024.0 * 1024.0 * 1024.0), title, errf);
        }
        if (o.json) print_json(out, res, n);
    }
    for (int s = 0; s < n; s++) sim_result_free(&res[s]);
    sim_trace_free(&t);
    return rc;
}
