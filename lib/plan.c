/*
 * Layer `plan`: capacity arithmetic. How many pages, tokens and concurrent
 * sequences fit in a memory budget. Touches no memory but its outputs.
 */
#include "internal.h"

#include <string.h>

/* ---- presets ----------------------------------------------------------- */

typedef struct {
    const char *name, *source;
    int32_t layers, q_heads, kv_heads, head_dim, max_context;
    uint64_t params;
} model_row;

/* From each model's published config.json (num_hidden_layers,
 * num_attention_heads, num_key_value_heads, head dim, max_position_embeddings)
 * and its published parameter count. */
static const model_row models[] = {
    {"llama-3.1-8b", "meta-llama/Llama-3.1-8B", 32, 32, 8, 128, 131072, 8030261248ull},
    {"llama-3.1-70b", "meta-llama/Llama-3.1-70B", 80, 64, 8, 128, 131072, 70553706496ull},
    {"llama-3.2-1b", "meta-llama/Llama-3.2-1B", 16, 32, 8, 64, 131072, 1235814400ull},
    {"llama-3.2-3b", "meta-llama/Llama-3.2-3B", 28, 24, 8, 128, 131072, 3212749824ull},
    {"llama-2-7b", "meta-llama/Llama-2-7b-hf", 32, 32, 32, 128, 4096, 6738415616ull},
    {"mistral-7b", "mistralai/Mistral-7B-v0.3", 32, 32, 8, 128, 32768, 7248023552ull},
    {"qwen2.5-0.5b", "Qwen/Qwen2.5-0.5B", 24, 14, 2, 64, 32768, 494032768ull},
    {"qwen2.5-7b", "Qwen/Qwen2.5-7B", 28, 28, 4, 128, 32768, 7615616512ull},
    {"qwen2.5-72b", "Qwen/Qwen2.5-72B", 80, 64, 8, 128, 32768, 72706203648ull},
    {"smollm2-135m", "HuggingFaceTB/SmolLM2-135M", 30, 9, 3, 64, 8192, 134515008ull},
};

typedef struct {
    const char *name, *description;
    uint64_t memory_bytes;
} gpu_row;

#define MIB (1024ull * 1024ull)
#define GIB (1024ull * MIB)

/* Total memory as nvidia-smi reports it for the card (the usable size after
 * the ECC/driver carve-out), except the Jetson, whose memory is shared. */
static const gpu_row gpus[] = {
    {"h100-80g", "NVIDIA H100 80GB HBM3: 81559 MiB as reported by nvidia-smi", 81559 * MIB},
    {"h200-141g", "NVIDIA H200 141GB HBM3e: 143771 MiB as reported by nvidia-smi", 143771 * MIB},
    {"a100-40g", "NVIDIA A100-SXM4-40GB: 40960 MiB as reported by nvidia-smi", 40960 * MIB},
    {"a100-80g", "NVIDIA A100 80GB: 81920 MiB as reported by nvidia-smi", 81920 * MIB},
    {"l4-24g", "NVIDIA L4: 23034 MiB as reported by nvidia-smi", 23034 * MIB},
    {"rtx4090-24g", "NVIDIA GeForce RTX 4090: 24564 MiB as reported by nvidia-smi", 24564 * MIB},
    {"jetson-orin-8g",
     "NVIDIA Jetson Orin (Nano/NX) 8GB module: 8 GiB LPDDR5 shared with the CPU "
     "(give the OS and engine share as reserve)",
     8 * GIB},
};

#define COUNT(a) ((int32_t)(sizeof(a) / sizeof((a)[0])))

int32_t kvp_model_preset_count(void) { return COUNT(models); }

static void fill_preset(const model_row *r, kvp_model_preset_t *out) {
    kvp_model_preset_t p;
    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    p.name = r->name;
    p.source = r->source;
    p.layers = r->layers;
    p.q_heads = r->q_heads;
    p.kv_heads = r->kv_heads;
    p.head_dim = r->head_dim;
    p.max_context = r->max_context;
    p.params = r->params;
    kvp__copy_out(out, &p, sizeof p);
}

int kvp_model_preset_get(int32_t index, kvp_model_preset_t *out) {
    if (kvp__check_struct(out, sizeof *out, "out", NULL, 0) != KVP_OK) return KVP_EINVAL;
    if (index < 0 || index >= COUNT(models)) return KVP_EINVAL;
    fill_preset(&models[index], out);
    return KVP_OK;
}

static int unknown_name(char *err, size_t err_size, const char *what,
                        const char *name, const char *known) {
    return kvp__errf(err, err_size, KVP_ENOENT, "unknown %s '%.64s' (known: %s)", what,
                     name, known);
}

int kvp_model_preset_find(const char *name, kvp_model_preset_t *out, char *err,
                    size_t err_size) {
    int rc = kvp__check_struct(out, sizeof *out, "out", err, err_size);
    if (rc != KVP_OK) return rc;
    if (name == NULL) return kvp__errf(err, err_size, KVP_EINVAL, "preset name is NULL");
    for (int32_t i = 0; i < COUNT(models); i++) {
        if (kvp__strcasecmp(name, models[i].name) == 0) {
            fill_preset(&models[i], out);
            return KVP_OK;
        }
    }
    return unknown_name(err, err_size, "preset", name,
                        "llama-3.1-8b llama-3.1-70b llama-3.2-1b llama-3.2-3b llama-2-7b "
                        "mistral-7b qwen2.5-0.5b qwen2.5-7b qwen2.5-72b smollm2-135m");
}

int32_t kvp_gpu_preset_count(void) { return COUNT(gpus); }

static void fill_gpu(const gpu_row *r, kvp_gpu_preset_t *out) {
    kvp_gpu_preset_t g;
    memset(&g, 0, sizeof g);
    g.struct_size = sizeof g;
    g.name = r->name;
    g.description = r->description;
    g.memory_bytes = r->memory_bytes;
    kvp__copy_out(out, &g, sizeof g);
}

int kvp_gpu_preset_get(int32_t index, kvp_gpu_preset_t *out) {
    if (kvp__check_struct(out, sizeof *out, "out", NULL, 0) != KVP_OK) return KVP_EINVAL;
    if (index < 0 || index >= COUNT(gpus)) return KVP_EINVAL;
    fill_gpu(&gpus[index], out);
    return KVP_OK;
}

int kvp_gpu_preset_find(const char *name, kvp_gpu_preset_t *out, char *err,
                 size_t err_size) {
    int rc = kvp__check_struct(out, sizeof *out, "out", err, err_size);
    if (rc != KVP_OK) return rc;
    if (name == NULL) return kvp__errf(err, err_size, KVP_EINVAL, "GPU name is NULL");
    for (int32_t i = 0; i < COUNT(gpus); i++) {
        if (kvp__strcasecmp(name, gpus[i].name) == 0) {
            fill_gpu(&gpus[i], out);
            return KVP_OK;
        }
    }
    return unknown_name(err, err_size, "GPU", name,
                        "h100-80g h200-141g a100-40g a100-80g l4-24g rtx4090-24g "
                        "jetson-orin-8g");
}

int kvp_weight_bytes(uint64_t params, const char *weight_type, uint64_t *bytes,
                     char *err, size_t err_size) {
    if (weight_type == NULL || bytes == NULL)
        return kvp__errf(err, err_size, KVP_EINVAL, "weight type or output is NULL");
    if (params == 0) return kvp__errf(err, err_size, KVP_EINVAL, "parameter count is 0");
    static const struct { const char *name; uint64_t num, den; } types[] = {
        {"fp32", 4, 1}, {"fp16", 2, 1}, {"bf16", 2, 1},
        {"fp8", 1, 1},  {"int8", 1, 1}, {"int4", 17, 32}, /* 4.25 bits */
    };
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        if (kvp__strcasecmp(weight_type, types[i].name) != 0) continue;
        uint64_t whole = params / types[i].den, rest = params % types[i].den, b;
        if (!kvp__mul_u64(whole, types[i].num, &b) ||
            !kvp__add_u64(b, (rest * types[i].num + types[i].den - 1) / types[i].den, &b))
            return kvp__errf(err, err_size, KVP_EINVAL, "weight size overflows 64 bits");
        *bytes = b;
        return KVP_OK;
    }
    return kvp__errf(err, err_size, KVP_EINVAL,
                     "unknown weight type '%.32s' (known: fp32 fp16 bf16 fp8 int8 int4)",
                     weight_type);
}

/* ---- sizes ------------------------------------------------------------- */

static bool is_space(char c) { return c == ' ' || c == '\t'; }

int kvp_parse_size(const char *text, uint64_t *bytes, char *err, size_t err_size) {
    if (text == NULL || bytes == NULL)
        return kvp__errf(err, err_size, KVP_EINVAL, "size text or output is NULL");
    const char *s = text;
    while (is_space(*s)) s++;
    if (*s < '0' || *s > '9')
        return kvp__errf(err, err_size, KVP_EINVAL,
                         "size '%.64s' is not a positive number (e.g. 80GiB, 24GB, 4096)",
                         text);
    uint64_t whole = 0;
    for (; *s >= '0' && *s <= '9'; s++) {
        if (!kvp__mul_u64(whole, 10, &whole) || !kvp__add_u64(whole, (uint64_t)(*s - '0'), &whole))
            return kvp__errf(err, err_size, KVP_EINVAL, "size '%.64s' is too large", text);
    }
    uint64_t frac = 0, frac_den = 1;
    if (*s == '.') {
        s++;
        if (*s < '0' || *s > '9')
            return kvp__errf(err, err_size, KVP_EINVAL,
                             "size '%.64s': expected digits after the decimal point", text);
        for (; *s >= '0' && *s <= '9'; s++) {
            if (frac_den < 1000000000000000000ull) { /* keep 18 digits */
                frac = frac * 10 + (uint64_t)(*s - '0');
                frac_den *= 10;
            }
        }
    }
    while (is_space(*s)) s++;
    const char *suffix = s;
    const char *end = s;
    while (*end != '\0' && !is_space(*end)) end++;
    const char *tail = end;
    while (is_space(*tail)) tail++;
    if (*tail != '\0')
        return kvp__errf(err, err_size, KVP_EINVAL, "size '%.64s' has trailing text", text);
    size_t n = (size_t)(end - suffix);
    char suf[8] = {0};
    if (n >= sizeof suf)
        return kvp__errf(err, err_size, KVP_EINVAL, "size '%.64s': unknown unit", text);
    memcpy(suf, suffix, n);
    static const struct { const char *unit; uint64_t mult; } units[] = {
        {"", 1}, {"b", 1},
        {"k", 1ull << 10}, {"kib", 1ull << 10}, {"kb", 1000ull},
        {"m", 1ull << 20}, {"mib", 1ull << 20}, {"mb", 1000000ull},
        {"g", 1ull << 30}, {"gib", 1ull << 30}, {"gb", 1000000000ull},
        {"t", 1ull << 40}, {"tib", 1ull << 40}, {"tb", 1000000000000ull},
    };
    uint64_t mult = 0;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (kvp__strcasecmp(suf, units[i].unit) == 0) mult = units[i].mult;
    if (mult == 0)
        return kvp__errf(err, err_size, KVP_EINVAL,
                         "size '%.64s': unknown unit '%s' (use B, KB, MB, GB, TB, KiB, "
                         "MiB, GiB, TiB, K, M, G or T)",
                         text, suf);
    uint64_t total;
    if (!kvp__mul_u64(whole, mult, &total))
        return kvp__errf(err, err_size, KVP_EINVAL, "size '%.64s' exceeds 2^64 bytes", text);
    /* fraction: floor(frac / frac_den * mult), exact in long double for the
     * magnitudes that matter (mult <= 2^40, 18 digits) up to rounding of the
     * last byte, which is floored. */
    uint64_t extra = (uint64_t)((long double)frac * (long double)mult / (long double)frac_den);
    if (!kvp__add_u64(total, extra, &total))
        return kvp__errf(err, err_size, KVP_EINVAL, "size '%.64s' exceeds 2^64 bytes", text);
    if (total == 0)
        return kvp__errf(err, err_size, KVP_EINVAL, "size '%.64s' is zero bytes", text);
    *bytes = total;
    return KVP_OK;
}

/* ---- the planner ------------------------------------------------------- */

void kvp_plan_params_init(kvp_plan_params_t *p) {
    if (p == NULL) return;
    memset(p, 0, sizeof *p);
    p->struct_size = sizeof *p;
    p->k_format = KVP_FORMAT_FP16;
    p->v_format = KVP_FORMAT_FP16;
    p->page_size = 16;
    p->utilization = 0.90;
}

static int plan_budget(const kvp_plan_params_t *p, uint64_t *budget, char *err,
                       size_t err_size) {
    if (p->kv_budget_bytes != 0) {
        if (p->memory_bytes != 0 || p->weight_bytes != 0 || p->reserve_bytes != 0)
            return kvp__errf(err, err_size, KVP_EINVAL,
                             "give either a KV budget or device memory (with weights and "
                             "reserve), not both");
        *budget = p->kv_budget_bytes;
        return KVP_OK;
    }
    if (p->memory_bytes == 0)
        return kvp__errf(err, err_size, KVP_EINVAL,
                         "no memory given: set memory_bytes (a GPU) or kv_budget_bytes");
    if (!(p->utilization > 0.0 && p->utilization <= 1.0))
        return kvp__errf(err, err_size, KVP_EINVAL, "utilization must be in (0, 1], got %g",
                         p->utilization);
    uint64_t taken;
    if (!kvp__add_u64(p->weight_bytes, p->reserve_bytes, &taken) || taken >= p->memory_bytes)
        return kvp__errf(err, err_size, KVP_EINVAL,
                         "weights (%llu bytes) plus reserve (%llu bytes) do not fit in the "
                         "device memory (%llu bytes)",
                         (unsigned long long)p->weight_bytes,
                         (unsigned long long)p->reserve_bytes,
                         (unsigned long long)p->memory_bytes);
    /* The KV cache takes `utilization` of what the weights and reserve leave
     * (TensorRT-LLM's kv_cache_free_gpu_mem_fraction); long double keeps the
     * product exact for any 64-bit size where it has a 64-bit mantissa. Where
     * long double is double, 2^64-1 rounds up to 2^64, which does not convert
     * to uint64_t: never exceed what is left. */
    uint64_t left = p->memory_bytes - taken;
    long double kv = (long double)left * (long double)p->utilization;
    *budget = kv >= (long double)left ? left : (uint64_t)kv;
    return KVP_OK;
}

int kvp_plan_compute(const kvp_plan_params_t *p, kvp_plan_t *plan, char *err,
                     size_t err_size) {
    int rc = kvp__check_struct(p, sizeof *p, "params", err, err_size);
    if (rc != KVP_OK) return rc;
    rc = kvp__check_struct(plan, sizeof *plan, "plan", err, err_size);
    if (rc != KVP_OK) return rc;
    if (p->q_heads < 0 || (p->q_heads > 0 && p->kv_heads > 0 && p->q_heads % p->kv_heads != 0))
        return kvp__errf(err, err_size, KVP_EINVAL,
                         "q_heads (%d) must be a multiple of kv_heads (%d)", (int)p->q_heads,
                         (int)p->kv_heads);
    kvp_layout_t l;
    l.struct_size = sizeof l;
    rc = kvp_layout_compute(p->layers, p->kv_heads, p->head_dim, p->page_size, p->k_format,
                            p->v_format, &l, err, err_size);
    if (rc != KVP_OK) return rc;
    uint64_t budget = 0;
    rc = plan_budget(p, &budget, err, err_size);
    if (rc != KVP_OK) return rc;

    uint64_t staging = l.needs_staging ? l.staging_page_bytes : 0;
    uint64_t minimum = l.fixed_bytes + l.page_bytes + staging; /* no overflow: each < 2^58 */
    if (budget < minimum)
        return kvp__errf(err, err_size, KVP_EINVAL,
                         "KV budget of %llu bytes is smaller than one page (%llu bytes%s)",
                         (unsigned long long)budget, (unsigned long long)minimum,
                         staging ? ", with its fp16 staging page" : "");

    kvp_plan_t r;
    memset(&r, 0, sizeof r);
    r.struct_size = sizeof r;
    r.k_format = p->k_format;
    r.v_format = p->v_format;
    r.page_size = p->page_size;
    r.needs_staging = l.needs_staging;
    r.kv_budget_bytes = budget;
    r.bytes_per_token = l.element_bytes_per_token;
    r.bytes_per_token_stored = l.bytes_per_token;
    r.bytes_per_token_per_layer = l.bytes_per_token / (double)l.layers;
    r.page_bytes = l.page_bytes;
    r.staging_page_bytes = staging;
    r.fixed_bytes = l.fixed_bytes;
    r.context = p->context;

    uint64_t room = budget - l.fixed_bytes;
    if (p->context > 0) {
        uint64_t ps = (uint64_t)p->page_size;
        r.pages_per_seq = p->context / ps + (!l.needs_staging && p->context % ps != 0);
        uint64_t pages_b;
        if (!kvp__mul_u64(r.pages_per_seq, l.page_bytes, &pages_b) ||
            !kvp__add_u64(pages_b, staging, &r.seq_bytes))
            return kvp__errf(err, err_size, KVP_EINVAL,
                             "context of %llu tokens: bytes per sequence overflow 64 bits",
                             (unsigned long long)p->context);
        r.max_seqs = room / r.seq_bytes;
        r.num_staging = l.needs_staging ? r.max_seqs : 0;
    }
    r.num_pages = (room - r.num_staging * staging) / l.page_bytes;
    if (!kvp__mul_u64(r.num_pages, (uint64_t)p->page_size, &r.max_tokens))
        return kvp__errf(err, err_size, KVP_EINVAL, "token capacity overflows 64 bits");
    rc = kvp_arena_bytes(&l, r.num_pages, r.num_staging, &r.arena_bytes, err, err_size);
    if (rc != KVP_OK) return rc;
    if (r.arena_bytes > budget)
        return kvp__errf(err, err_size, KVP_EINTERNAL, "planned arena exceeds the budget");
    kvp__copy_out(plan, &r, sizeof r);
    return KVP_OK;
}
