/*
 * kvpage-plan: how many concurrent requests fit on this card, at this
 * context length, with this KV format? The arithmetic is the library's
 * (kvp_plan_compute); this file parses arguments and prints.
 */
#include "plan_cli.h"

#include "cli.h"
#include "kvpage.h"
#include "kvpage_cuda.h"
#include "kvpage_ext.h"
#include "kvpage_plan.h"

#include <stdlib.h>
#include <string.h>

#define TOOL "kvpage-plan"

typedef struct {
    const char *preset, *gpu, *vram, *weights, *weight_dtype, *reserve, *kv_budget;
    const char *format, *k_format, *v_format;
    int64_t layers, kv_heads, head_dim, q_heads, page_size, context;
    double utilization;
    bool json, list_presets, list_gpus, help, version, utilization_set;
} options;

static void usage(FILE *f) {
    fputs(
        "usage: kvpage-plan [model] [memory] [format] [--json]\n"
        "\n"
        "How many tokens and concurrent sequences fit in a KV-cache budget.\n"
        "\n"
        "model (a preset, or the shape; flags override the preset):\n"
        "  --preset NAME        a public model config (see --list-presets)\n"
        "  --layers N --kv-heads N --head-dim N [--q-heads N]\n"
        "memory (optional; without it only per-token and per-page sizes are shown):\n"
        "  --gpu NAME           a card's memory (see --list-gpus), or cuda:N to ask\n"
        "                       the CUDA device N of this machine\n"
        "  --vram SIZE          device memory, e.g. 80GiB, 24GB, 16384MiB\n"
        "  --weights SIZE       memory the weights take (default: from the preset's\n"
        "                       parameter count and --weight-dtype, else 0)\n"
        "  --weight-dtype T     fp32 fp16 bf16 fp8 int8 int4 (default bf16)\n"
        "  --reserve SIZE       activations, workspace, runtime (default 0)\n"
        "  --utilization F      fraction of what weights and reserve leave that the KV\n"
        "                       cache takes (default 0.90)\n"
        "  --kv-budget SIZE     the KV budget directly, instead of all of the above\n"
        "format:\n"
        "  --format F           K and V format: fp32 fp16 bf16 fp8_e4m3 int8 int4 int4_v1\n"
        "  --k-format F --v-format F   chosen separately (e.g. int8 and int4)\n"
        "  --page-size N        tokens per page (default 16)\n"
        "  --context N          tokens per sequence, e.g. 8192 or 32k (default 4096)\n"
        "output:\n"
        "  --json               one JSON object instead of the table\n"
        "  --list-presets, --list-gpus, --version, --help\n",
        f);
}

/* Returns 0, or -1 after a message. */
static int parse_args(int argc, char **argv, options *o, FILE *errf) {
    memset(o, 0, sizeof *o);
    o->page_size = 16;
    o->context = 4096;
    o->utilization = 0.90;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        const char *eq = strchr(arg, '=');
        char name[64];
        const char *value = NULL;
        size_t n = eq != NULL ? (size_t)(eq - arg) : strlen(arg);
        if (n >= sizeof name) n = sizeof name - 1;
        memcpy(name, arg, n);
        name[n] = '\0';
        if (eq != NULL) value = eq + 1;

        /* flags without a value */
        bool *flag = NULL;
        if (!strcmp(name, "--json")) flag = &o->json;
        else if (!strcmp(name, "--list-presets")) flag = &o->list_presets;
        else if (!strcmp(name, "--list-gpus")) flag = &o->list_gpus;
        else if (!strcmp(name, "--help") || !strcmp(name, "-h")) flag = &o->help;
        else if (!strcmp(name, "--version")) flag = &o->version;
        if (flag != NULL) {
            if (value != NULL) {
                fprintf(errf, "%s: %s takes no value\n", TOOL, name);
                return -1;
            }
            *flag = true;
            continue;
        }
        if (name[0] != '-') {
            fprintf(errf, "%s: unexpected argument '%s' (see --help)\n", TOOL, arg);
            return -1;
        }
        /* which option, before its value: an unknown one is named as such */
        const char **str = NULL;
        int64_t *num = NULL, lo = 1, hi = INT32_MAX;
        bool allow_k = false, real = false;
        if (!strcmp(name, "--preset")) str = &o->preset;
        else if (!strcmp(name, "--gpu")) str = &o->gpu;
        else if (!strcmp(name, "--vram")) str = &o->vram;
        else if (!strcmp(name, "--weights")) str = &o->weights;
        else if (!strcmp(name, "--weight-dtype")) str = &o->weight_dtype;
        else if (!strcmp(name, "--reserve")) str = &o->reserve;
        else if (!strcmp(name, "--kv-budget")) str = &o->kv_budget;
        else if (!strcmp(name, "--format")) str = &o->format;
        else if (!strcmp(name, "--k-format")) str = &o->k_format;
        else if (!strcmp(name, "--v-format")) str = &o->v_format;
        else if (!strcmp(name, "--layers")) num = &o->layers;
        else if (!strcmp(name, "--kv-heads")) num = &o->kv_heads;
        else if (!strcmp(name, "--head-dim")) num = &o->head_dim;
        else if (!strcmp(name, "--q-heads")) num = &o->q_heads;
        else if (!strcmp(name, "--page-size")) num = &o->page_size;
        else if (!strcmp(name, "--context")) {
            num = &o->context;
            hi = INT64_MAX;
            allow_k = true;
        } else if (!strcmp(name, "--utilization")) {
            real = true;
        } else {
            int len = eq != NULL ? (int)(eq - arg) : (int)strlen(arg);
            fprintf(errf, "%s: unknown option '%.*s' (see --help)\n", TOOL, len, arg);
            return -1;
        }
        if (value == NULL) {
            if (i + 1 >= argc) {
                fprintf(errf, "%s: %s needs a value\n", TOOL, name);
                return -1;
            }
            value = argv[++i];
        }
        if (real) {
            if (!cli_parse_double(TOOL, name, value, 1e-9, 1.0, &o->utilization, errf)) return -1;
            o->utilization_set = true;
        } else if (str != NULL) {
            if (*value == '\0') {
                fprintf(errf, "%s: %s needs a value\n", TOOL, name);
                return -1;
            }
            *str = value;
        } else if (!cli_parse_i64(TOOL, name, value, lo, hi, allow_k, num, errf)) {
            return -1;
        }
    }
    return 0;
}

static bool parse_size_opt(const char *option, const char *text, uint64_t *out, FILE *errf) {
    char err[KVP_ERR_SIZE];
    if (kvp_parse_size(text, out, err, sizeof err) != KVP_OK) {
        fprintf(errf, "%s: %s: %s\n", TOOL, option, err);
        return false;
    }
    return true;
}

static bool parse_format_opt(const char *option, const char *text, int32_t *out, FILE *errf) {
    char err[KVP_ERR_SIZE];
    if (kvp_format_parse(text, out, err, sizeof err) != KVP_OK) {
        fprintf(errf, "%s: %s: %s\n", TOOL, option, err);
        return false;
    }
    return true;
}

static void list_presets(FILE *out) {
    fprintf(out, "%-14s %7s %8s %9s %9s %12s %15s  %s\n", "preset", "layers", "q_heads",
            "kv_heads", "head_dim", "max_context", "params", "source");
    for (int32_t i = 0; i < kvp_model_preset_count(); i++) {
        kvp_model_preset_t m = {.struct_size = sizeof m};
        char buf[32];
        if (kvp_model_preset_get(i, &m) != KVP_OK) continue;
        fprintf(out, "%-14s %7d %8d %9d %9d %12d %15s  %s\n", m.name, m.layers, m.q_heads,
                m.kv_heads, m.head_dim, m.max_context, cli_thousands(buf, sizeof buf, m.params),
                m.source);
    }
}

static void list_gpus(FILE *out) {
    fprintf(out, "%-16s %12s  %s\n", "gpu", "memory", "what");
    for (int32_t i = 0; i < kvp_gpu_preset_count(); i++) {
        kvp_gpu_preset_t g = {.struct_size = sizeof g};
        char buf[32];
        if (kvp_gpu_preset_get(i, &g) != KVP_OK) continue;
        fprintf(out, "%-16s %12s  %s\n", g.name, cli_bytes(buf, sizeof buf, g.memory_bytes),
                g.description);
    }
}

/* What the user asked for, resolved to numbers. */
typedef struct {
    kvp_plan_params_t p;
    bool have_memory;
    const char *memory_source; /* gpu name, "vram", "kv-budget" */
    char device_name[320];
    uint64_t params;           /* parameter count if known */
    const char *weight_dtype;  /* if weights were computed */
    kvp_model_preset_t preset;
    bool have_preset;
} request;

static int resolve(const options *o, request *r, FILE *errf) {
    char err[KVP_ERR_SIZE];
    memset(r, 0, sizeof *r);
    kvp_plan_params_init(&r->p);
    r->preset.struct_size = sizeof r->preset;
    if (o->preset != NULL) {
        if (kvp_model_preset_find(o->preset, &r->preset, err, sizeof err) != KVP_OK) {
            fprintf(errf, "%s: --preset: %s\n", TOOL, err);
            return -1;
        }
        r->have_preset = true;
        r->p.layers = r->preset.layers;
        r->p.kv_heads = r->preset.kv_heads;
        r->p.head_dim = r->preset.head_dim;
        r->p.q_heads = r->preset.q_heads;
        r->params = r->preset.params;
    }
    if (o->layers) r->p.layers = (int32_t)o->layers;
    if (o->kv_heads) r->p.kv_heads = (int32_t)o->kv_heads;
    if (o->head_dim) r->p.head_dim = (int32_t)o->head_dim;
    if (o->q_heads) r->p.q_heads = (int32_t)o->q_heads;
    if (r->p.layers == 0 || r->p.kv_heads == 0 || r->p.head_dim == 0) {
        fprintf(errf, "%s: give --preset NAME, or --layers, --kv-heads and --head-dim\n", TOOL);
        return -1;
    }
    if (o->kv_heads && r->have_preset && !o->q_heads) r->p.q_heads = 0;
    if (r->p.q_heads > 0 && r->p.q_heads % r->p.kv_heads != 0) {
        fprintf(errf, "%s: --q-heads %d must be a multiple of kv_heads (%d)\n", TOOL,
                (int)r->p.q_heads, (int)r->p.kv_heads);
        return -1;
    }

    if (o->format != NULL && (o->k_format != NULL || o->v_format != NULL)) {
        fprintf(errf, "%s: use --format, or --k-format and --v-format, not both\n", TOOL);
        return -1;
    }
    if (o->format != NULL) {
        if (!parse_format_opt("--format", o->format, &r->p.k_format, errf)) return -1;
        r->p.v_format = r->p.k_format;
    }
    if (o->k_format != NULL && !parse_format_opt("--k-format", o->k_format, &r->p.k_format, errf))
        return -1;
    if (o->v_format != NULL && !parse_format_opt("--v-format", o->v_format, &r->p.v_format, errf))
        return -1;
    r->p.page_size = (int32_t)o->page_size;
    r->p.context = (uint64_t)o->context;

    if (o->kv_budget != NULL) {
        if (o->gpu || o->vram || o->weights || o->reserve || o->weight_dtype ||
            o->utilization_set) {
            fprintf(errf,
                    "%s: --kv-budget is the KV budget itself: do not combine it with --gpu, "
                    "--vram, --weights, --weight-dtype, --reserve or --utilization\n",
                    TOOL);
            return -1;
        }
        if (!parse_size_opt("--kv-budget", o->kv_budget, &r->p.kv_budget_bytes, errf)) return -1;
        r->have_memory = true;
        r->memory_source = "kv-budget";
        return 0;
    }
    if (o->gpu != NULL && o->vram != NULL) {
        fprintf(errf, "%s: use --gpu or --vram, not both\n", TOOL);
        return -1;
    }
    if (o->gpu == NULL && o->vram == NULL) {
        if (o->weights || o->reserve || o->weight_dtype || o->utilization_set) {
            fprintf(errf,
                    "%s: --weights, --weight-dtype, --reserve and --utilization need the "
                    "device memory: add --gpu NAME or --vram SIZE\n",
                    TOOL);
            return -1;
        }
        return 0; /* per-token figures only */
    }
    if (o->gpu != NULL && strncmp(o->gpu, "cuda", 4) == 0 &&
        (o->gpu[4] == '\0' || o->gpu[4] == ':')) {
        int64_t dev = 0;
        if (o->gpu[4] == ':' &&
            !cli_parse_i64(TOOL, "--gpu cuda:N", o->gpu + 5, 0, 1024, false, &dev, errf))
            return -1;
        kvp_cuda_device_info_t info = {.struct_size = sizeof info};
        if (kvp_cuda_device_query((int32_t)dev, &info, err, sizeof err) != KVP_OK) {
            fprintf(errf, "%s: --gpu %s: %s\n", TOOL, o->gpu, err);
            return -1;
        }
        r->p.memory_bytes = info.total_bytes;
        snprintf(r->device_name, sizeof r->device_name, "%s (%s)", o->gpu, info.name);
        r->memory_source = r->device_name;
    } else if (o->gpu != NULL) {
        kvp_gpu_preset_t g = {.struct_size = sizeof g};
        if (kvp_gpu_preset_find(o->gpu, &g, err, sizeof err) != KVP_OK) {
            fprintf(errf, "%s: --gpu: %s\n", TOOL, err);
            return -1;
        }
        r->p.memory_bytes = g.memory_bytes;
        r->memory_source = g.name;
    } else {
        if (!parse_size_opt("--vram", o->vram, &r->p.memory_bytes, errf)) return -1;
        r->memory_source = "vram";
    }
    r->have_memory = true;
    r->p.utilization = o->utilization;
    if (o->reserve != NULL && !parse_size_opt("--reserve", o->reserve, &r->p.reserve_bytes, errf))
        return -1;
    if (o->weights != NULL && o->weight_dtype != NULL) {
        fprintf(errf, "%s: use --weights or --weight-dtype, not both\n", TOOL);
        return -1;
    }
    if (o->weights != NULL) {
        if (!parse_size_opt("--weights", o->weights, &r->p.weight_bytes, errf)) return -1;
    } else if (r->have_preset) {
        r->weight_dtype = o->weight_dtype != NULL ? o->weight_dtype : "bf16";
        if (kvp_weight_bytes(r->params, r->weight_dtype, &r->p.weight_bytes, err, sizeof err) !=
            KVP_OK) {
            fprintf(errf, "%s: --weight-dtype: %s\n", TOOL, err);
            return -1;
        }
    } else if (o->weight_dtype != NULL) {
        fprintf(errf,
                "%s: --weight-dtype needs --preset (for the parameter count); or give "
                "--weights SIZE\n",
                TOOL);
        return -1;
    }
    return 0;
}

typedef struct {
    const char *label;
    int32_t k, v;
    bool selected;
    int layout_rc, plan_rc;
    char error[KVP_ERR_SIZE];
    kvp_layout_t layout;
    kvp_plan_t plan;
} row;

static void compute_row(const request *r, row *w) {
    kvp_plan_params_t p = r->p;
    p.k_format = w->k;
    p.v_format = w->v;
    w->layout.struct_size = sizeof w->layout;
    w->plan.struct_size = sizeof w->plan;
    w->layout_rc = kvp_layout_compute(p.layers, p.kv_heads, p.head_dim, p.page_size, p.k_format,
                                      p.v_format, &w->layout, w->error, sizeof w->error);
    w->plan_rc = KVP_ENOENT;
    if (w->layout_rc == KVP_OK && r->have_memory)
        w->plan_rc = kvp_plan_compute(&p, &w->plan, w->error, sizeof w->error);
}

#define MAX_ROWS 8

static int build_rows(const request *r, row *rows) {
    static const struct { const char *label; int32_t k, v; } std_rows[] = {
        {"fp32", KVP_FORMAT_FP32, KVP_FORMAT_FP32},
        {"fp16", KVP_FORMAT_FP16, KVP_FORMAT_FP16},
        {"bf16", KVP_FORMAT_BF16, KVP_FORMAT_BF16},
        {"fp8_e4m3", KVP_FORMAT_FP8_E4M3, KVP_FORMAT_FP8_E4M3},
        {"int8", KVP_FORMAT_INT8, KVP_FORMAT_INT8},
        {"int4", KVP_FORMAT_INT4, KVP_FORMAT_INT4},
        {"k8v4", KVP_FORMAT_INT8, KVP_FORMAT_INT4},
    };
    int n = 0;
    bool found = false;
    for (size_t i = 0; i < sizeof std_rows / sizeof std_rows[0]; i++) {
        memset(&rows[n], 0, sizeof rows[n]);
        rows[n].label = std_rows[i].label;
        rows[n].k = std_rows[i].k;
        rows[n].v = std_rows[i].v;
        rows[n].selected = std_rows[i].k == r->p.k_format && std_rows[i].v == r->p.v_format;
        found |= rows[n].selected;
        compute_row(r, &rows[n]);
        n++;
    }
    if (!found) {
        memset(&rows[n], 0, sizeof rows[n]);
        rows[n].label = "selected";
        rows[n].k = r->p.k_format;
        rows[n].v = r->p.v_format;
        rows[n].selected = true;
        compute_row(r, &rows[n]);
        n++;
    }
    return n;
}

static const row *selected_row(const row *rows, int n) {
    for (int i = 0; i < n; i++)
        if (rows[i].selected) return &rows[i];
    return &rows[0];
}

static void print_json(const request *r, const row *rows, int n, FILE *out) {
    const row *s = selected_row(rows, n);
    cli_json j;
    cli_json_begin(&j, out);
    cli_json_str(&j, "tool", TOOL);
    cli_json_str(&j, "version", kvp_version_string());
    cli_json_object(&j, "model");
    cli_json_str(&j, "preset", r->have_preset ? r->preset.name : NULL);
    cli_json_i64(&j, "layers", r->p.layers);
    cli_json_i64(&j, "kv_heads", r->p.kv_heads);
    cli_json_i64(&j, "head_dim", r->p.head_dim);
    if (r->p.q_heads) cli_json_i64(&j, "q_heads", r->p.q_heads);
    else cli_json_null(&j, "q_heads");
    if (r->params) cli_json_u64(&j, "params", r->params);
    else cli_json_null(&j, "params");
    cli_json_close(&j);
    cli_json_object(&j, "memory");
    cli_json_str(&j, "source", r->memory_source);
    if (r->have_memory && r->p.kv_budget_bytes == 0) {
        cli_json_u64(&j, "memory_bytes", r->p.memory_bytes);
        cli_json_num(&j, "utilization", r->p.utilization);
        cli_json_u64(&j, "weight_bytes", r->p.weight_bytes);
        cli_json_str(&j, "weight_dtype", r->weight_dtype);
        cli_json_u64(&j, "reserve_bytes", r->p.reserve_bytes);
    }
    if (s->plan_rc == KVP_OK) cli_json_u64(&j, "kv_budget_bytes", s->plan.kv_budget_bytes);
    else cli_json_null(&j, "kv_budget_bytes");
    cli_json_close(&j);
    cli_json_i64(&j, "page_size", r->p.page_size);
    cli_json_u64(&j, "context", r->p.context);
    cli_json_str(&j, "k_format", kvp_format_name(r->p.k_format));
    cli_json_str(&j, "v_format", kvp_format_name(r->p.v_format));
    for (int pass = 0; pass <= n; pass++) {
        const row *w = pass == 0 ? s : &rows[pass - 1];
        if (pass == 1) cli_json_object(&j, "formats");
        if (pass >= 1) {
            cli_json_object(&j, w->label);
            cli_json_str(&j, "k_format", kvp_format_name(w->k));
            cli_json_str(&j, "v_format", kvp_format_name(w->v));
        }
        if (w->layout_rc != KVP_OK) {
            cli_json_str(&j, "error", w->error);
        } else {
            cli_json_u64(&j, "bytes_per_token", w->layout.element_bytes_per_token);
            cli_json_num(&j, "bytes_per_token_stored", w->layout.bytes_per_token);
            cli_json_num(&j, "bytes_per_token_per_layer",
                         w->layout.bytes_per_token / (double)w->layout.layers);
            cli_json_u64(&j, "bytes_per_page", w->layout.page_bytes);
            cli_json_u64(&j, "staging_page_bytes",
                         w->layout.needs_staging ? w->layout.staging_page_bytes : 0);
            if (w->plan_rc == KVP_OK) {
                cli_json_u64(&j, "pages", w->plan.num_pages);
                cli_json_u64(&j, "staging_pages", w->plan.num_staging);
                cli_json_u64(&j, "max_tokens", w->plan.max_tokens);
                cli_json_u64(&j, "max_seqs", w->plan.max_seqs);
                cli_json_u64(&j, "seq_bytes", w->plan.seq_bytes);
                cli_json_u64(&j, "arena_bytes", w->plan.arena_bytes);
            } else {
                cli_json_null(&j, "pages");
                cli_json_null(&j, "max_tokens");
                cli_json_null(&j, "max_seqs");
                if (r->have_memory) cli_json_str(&j, "error", w->error);
            }
        }
        if (pass >= 1) cli_json_close(&j);
    }
    cli_json_close(&j);
    cli_json_end(&j);
}

static void print_table(const request *r, const row *rows, int n, FILE *out) {
    char a[32], b[32], c[32], d[32], e[32];
    const row *s = selected_row(rows, n);
    fprintf(out, "kvpage-plan %s\n", kvp_version_string());
    fprintf(out, "model    ");
    if (r->have_preset) fprintf(out, "%s (%s): ", r->preset.name, r->preset.source);
    fprintf(out, "%d layers, %d kv heads x head_dim %d", r->p.layers, r->p.kv_heads,
            r->p.head_dim);
    if (r->p.q_heads) fprintf(out, ", %d query heads", r->p.q_heads);
    fputc('\n', out);
    if (r->have_memory && s->plan_rc == KVP_OK) {
        if (r->p.kv_budget_bytes)
            fprintf(out, "memory   KV budget %s (given)\n", cli_bytes(a, sizeof a, r->p.kv_budget_bytes));
        else {
            fprintf(out, "memory   %s %s - weights %s", r->memory_source,
                    cli_bytes(a, sizeof a, r->p.memory_bytes),
                    cli_bytes(b, sizeof b, r->p.weight_bytes));
            if (r->weight_dtype) fprintf(out, " (%s params, %s)", cli_thousands(c, sizeof c, r->params), r->weight_dtype);
            else if (r->p.weight_bytes == 0) fprintf(out, " (none given)");
            fprintf(out, " - reserve %s\n         x %.2f utilization = KV budget %s\n",
                    cli_bytes(d, sizeof d, r->p.reserve_bytes), r->p.utilization,
                    cli_bytes(e, sizeof e, s->plan.kv_budget_bytes));
        }
    } else if (!r->have_memory) {
        fprintf(out, "memory   not given (add --gpu NAME, --vram SIZE or --kv-budget SIZE for "
                     "capacities)\n");
    }
    fprintf(out, "page     %d tokens; context %llu tokens per sequence\n\n", r->p.page_size,
            (unsigned long long)r->p.context);

    fprintf(out, "  %-9s %-9s %13s %13s %12s", "format", "K/V", "bytes/token", "stored/token",
            "page bytes");
    if (r->have_memory) {
        char ctx[32];
        snprintf(ctx, sizeof ctx, "seqs@%llu", (unsigned long long)r->p.context);
        fprintf(out, " %12s %14s %11s %8s", "pages", "max tokens", ctx, "vs fp16");
    }
    fputc('\n', out);
    uint64_t fp16_seqs = 0;
    for (int i = 0; i < n; i++)
        if (rows[i].k == KVP_FORMAT_FP16 && rows[i].v == KVP_FORMAT_FP16 && rows[i].plan_rc == KVP_OK)
            fp16_seqs = rows[i].plan.max_seqs;
    for (int i = 0; i < n; i++) {
        const row *w = &rows[i];
        char kv[32];
        snprintf(kv, sizeof kv, "%s/%s", kvp_format_name(w->k), kvp_format_name(w->v));
        fprintf(out, "%c %-9s %-9s ", w->selected ? '*' : ' ', w->label, w->k == w->v ? kvp_format_name(w->k) : kv);
        if (w->layout_rc != KVP_OK) {
            fprintf(out, "n/a: %s\n", w->error);
            continue;
        }
        uint64_t bpt = w->layout.element_bytes_per_token;
        char st[32];
        snprintf(st, sizeof st, "%.1f", w->layout.bytes_per_token);
        fprintf(out, "%13s %13s %12s", cli_thousands(a, sizeof a, bpt), st,
                cli_thousands(b, sizeof b, w->layout.page_bytes));
        if (r->have_memory) {
            if (w->plan_rc != KVP_OK) {
                fprintf(out, "  n/a: %s", w->error);
            } else {
                fprintf(out, " %12s %14s %11s", cli_thousands(c, sizeof c, w->plan.num_pages),
                        cli_thousands(d, sizeof d, w->plan.max_tokens),
                        cli_thousands(e, sizeof e, w->plan.max_seqs));
                if (fp16_seqs > 0) fprintf(out, " %7.2fx", (double)w->plan.max_seqs / (double)fp16_seqs);
            }
        }
        fputc('\n', out);
    }
    if (s->layout.needs_staging && s->layout_rc == KVP_OK)
        fprintf(out, "\nint8/int4 keys: each sequence also holds one fp16 staging page (%s) for "
                     "its partly filled page; counted in seqs.\n",
                cli_bytes(a, sizeof a, s->layout.staging_page_bytes));
    if (r->have_memory) {
        fputc('\n', out);
        bool first = true;
        for (int i = 0; i < n; i++) {
            if (rows[i].plan_rc != KVP_OK) continue;
            fprintf(out, "%s%s: %llu%s", first ? "" : " · ", rows[i].label,
                    (unsigned long long)rows[i].plan.max_seqs, first ? " sequences" : "");
            first = false;
        }
        fprintf(out, " (at %llu tokens each)\n", (unsigned long long)r->p.context);
    }
}

int kvp_tool_plan(int argc, char **argv, FILE *out, FILE *errf) {
    options o;
    if (parse_args(argc, argv, &o, errf) != 0) return 2;
    if (o.help) {
        usage(out);
        return 0;
    }
    if (o.version) {
        fprintf(out, "%s %s\n", TOOL, kvp_version_string());
        return 0;
    }
    if (o.list_presets || o.list_gpus) {
        if (o.list_presets) list_presets(out);
        if (o.list_gpus) list_gpus(out);
        return 0;
    }
    request r;
    if (resolve(&o, &r, errf) != 0) return 2;
    row rows[MAX_ROWS];
    int n = build_rows(&r, rows);
    const row *s = selected_row(rows, n);
    if (s->layout_rc != KVP_OK || (r.have_memory && s->plan_rc != KVP_OK)) {
        fprintf(errf, "%s: %s\n", TOOL, s->error);
        return 2;
    }
    if (o.json) print_json(&r, rows, n, out);
    else print_table(&r, rows, n, out);
    return 0;
}
