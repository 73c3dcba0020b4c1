/*
 * libFuzzer harness: the capacity planner and the parsers of kvpage_plan.h.
 *
 *   make fuzz FUZZ_TARGETS=plan FUZZ_SECONDS=60
 *
 * The first byte picks a function; the rest are its inputs:
 *   0  kvp_parse_size on arbitrary text (a NUL-terminated copy);
 *   1  kvp_format_parse, kvp_model_preset_find and kvp_gpu_preset_find on
 *      arbitrary names;
 *   2  kvp_weight_bytes with any parameter count and a known or arbitrary
 *      weight type;
 *   3  kvp_layout_compute, then kvp_arena_bytes, with valid, edge or
 *      arbitrary dimensions and page counts;
 *   4  kvp_plan_compute with fuzzed shape, formats, memory, utilization
 *      (NaN and infinities included) and context.
 *
 * Oracles: every return is one the header documents, and it is KVP_OK
 * exactly when the inputs are in the documented ranges (or, for byte counts,
 * when the result fits in 64 bits); a failure leaves a non-empty error text
 * and the output untouched. On success the outputs are checked against the
 * documented formulas, computed here independently in 128 bits: a parsed
 * size is whole x unit (plus less than one unit for a fraction), weight
 * bytes are ceil(params x bytes per parameter), a layout's page bytes are
 * layers x kv_heads x (K block + V block), the arena is fixed + pages +
 * staging, and a plan's arena fits its budget, which is the one given or
 * utilization x (memory - weights - reserve).
 * tests/test_fuzz_plan.c replays the corpus and random inputs in `make test`.
 */
#define _POSIX_C_SOURCE 200809L
#include "kvpage.h"
#include "kvpage_plan.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "fuzz_input.h"

__extension__ typedef unsigned __int128 fp_u128;

#define FP_TEXT 96

/* Sentinel bytes that an output must keep when a call fails. */
#define FP_POISON 0xA5

static bool fp_poisoned(const void *p, size_t n, size_t skip) {
    const uint8_t *b = (const uint8_t *)p;
    for (size_t i = skip; i < n; i++)
        if (b[i] != FP_POISON) return false;
    return true;
}

static int fp_lower(int ch) { return ch >= 'A' && ch <= 'Z' ? ch - 'A' + 'a' : ch; }

static bool fp_caseeq(const char *a, const char *b) {
    for (; *a && *b; a++, b++)
        if (fp_lower((unsigned char)*a) != fp_lower((unsigned char)*b)) return false;
    return *a == *b;
}

/* A NUL-terminated text from the input: raw bytes, or a word from a
 * dictionary with fuzzed decorations, so the parsers' success paths are
 * reached. */
static void fp_text(fzi_cursor *c, char *out, size_t size, const char *const *dict, int n) {
    uint8_t k = fzi_u8(c);
    size_t len = 0;
    if (k < 96 || n == 0) {
        len = fzi_below(c, (uint32_t)size);
        fzi_bytes(c, out, len);
    } else {
        const char *w = dict[k % n];
        len = strlen(w);
        memcpy(out, w, len);
        uint8_t deco = fzi_u8(c);
        if ((deco & 3) == 1 && len > 0) out[fzi_below(c, (uint32_t)len)] ^= 0x20; /* case */
        if ((deco & 3) == 2 && len + 1 < size) out[len++] = (char)fzi_u8(c);
        if ((deco & 3) == 3 && len > 0) len--;
    }
    out[len] = '\0';
}

/* ---- 0: sizes ----------------------------------------------------------- */

static void fp_size(fzi_cursor *c) {
    static const char *const dict[] = {
        "80GiB", "24GB", "512MiB", "1.5T", "4096", " 7 kb ", "0.5", "18446744073709551615",
        "18446744073709551616", "16EiB", "17179869184GiB", "16777216TiB", "16777215.9999TiB",
        "1.", ".5G", "0", "0.0000000000000000001", "3.99999999999999999999999b", "1e9",
        "-1", "+1", "1 GiB x", "\t2\tg\t", "99999999999999999999999", "1.0000000000000000001K"};
    char text[FP_TEXT];
    fp_text(c, text, sizeof text, dict, (int)(sizeof dict / sizeof dict[0]));
    char err[KVP_ERR_SIZE];
    err[0] = '\0';
    uint64_t bytes = 0x5555;
    int rc = kvp_parse_size(text, &bytes, err, sizeof err);
    FZI_ASSERT(rc == KVP_OK || rc == KVP_EINVAL);
    if (rc != KVP_OK) {
        FZI_ASSERT(err[0] != '\0' && bytes == 0x5555);
        return;
    }
    FZI_ASSERT(bytes > 0);
    /* the grammar: spaces, digits, [. digits], spaces, unit, spaces */
    const char *p = text;
    while (*p == ' ' || *p == '\t') p++;
    FZI_ASSERT(*p >= '0' && *p <= '9');
    fp_u128 whole = 0;
    for (; *p >= '0' && *p <= '9'; p++) {
        whole = whole * 10 + (unsigned)(*p - '0');
        FZI_ASSERT(whole <= UINT64_MAX);
    }
    bool frac = false;
    if (*p == '.') {
        p++;
        FZI_ASSERT(*p >= '0' && *p <= '9');
        while (*p >= '0' && *p <= '9') frac |= *p++ != '0';
    }
    while (*p == ' ' || *p == '\t') p++;
    char unit[8] = {0};
    size_t n = 0;
    while (*p && *p != ' ' && *p != '\t') {
        FZI_ASSERT(n < sizeof unit - 1);
        unit[n++] = (char)fp_lower((unsigned char)*p++);
    }
    while (*p == ' ' || *p == '\t') p++;
    FZI_ASSERT(*p == '\0');
    static const struct { const char *u; uint64_t m; } units[] = {
        {"", 1}, {"b", 1}, {"k", 1ull << 10}, {"kib", 1ull << 10}, {"kb", 1000ull},
        {"m", 1ull << 20}, {"mib", 1ull << 20}, {"mb", 1000000ull}, {"g", 1ull << 30},
        {"gib", 1ull << 30}, {"gb", 1000000000ull}, {"t", 1ull << 40}, {"tib", 1ull << 40},
        {"tb", 1000000000000ull}};
    uint64_t mult = 0;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (!strcmp(unit, units[i].u)) mult = units[i].m;
    FZI_ASSERT(mult != 0);
    fp_u128 lo = whole * mult;
    FZI_ASSERT((fp_u128)bytes >= lo);
    if (frac) FZI_ASSERT((fp_u128)bytes < lo + mult);
    else FZI_ASSERT((fp_u128)bytes == lo);
}

/* ---- 1: names ----------------------------------------------------------- */

static void fp_names(fzi_cursor *c) {
    static const char *const dict[] = {
        "fp32", "fp16", "bf16", "fp8_e4m3", "fp8", "int8", "int4", "FP8_E4M3", "llama-3.1-8b",
        "llama-3.1-70b", "qwen2.5-0.5b", "smollm2-135m", "mistral-7b", "h100-80g", "h200-141g",
        "a100-40g", "jetson-orin-8g", "RTX4090-24G", "", "fp", "llama"};
    char name[FP_TEXT];
    fp_text(c, name, sizeof name, dict, (int)(sizeof dict / sizeof dict[0]));
    char err[KVP_ERR_SIZE];

    /* formats */
    int32_t f = -7;
    err[0] = '\0';
    int rc = kvp_format_parse(name, &f, err, sizeof err);
    bool known = fp_caseeq(name, "fp8");
    for (int32_t k = 0; k < KVP_FORMAT_COUNT; k++) known |= fp_caseeq(name, kvp_format_name(k));
    FZI_ASSERT(rc == (known ? KVP_OK : KVP_EINVAL));
    if (rc == KVP_OK)
        FZI_ASSERT(fp_caseeq(name, kvp_format_name(f)) ||
                   (fp_caseeq(name, "fp8") && f == KVP_FORMAT_FP8_E4M3));
    else
        FZI_ASSERT(f == -7 && err[0] != '\0');

    /* model presets: found exactly when a preset has that name */
    kvp_model_preset_t m;
    memset(&m, FP_POISON, sizeof m);
    m.struct_size = sizeof m;
    err[0] = '\0';
    rc = kvp_model_preset_find(name, &m, err, sizeof err);
    int want = -1;
    for (int32_t i = 0; i < kvp_model_preset_count(); i++) {
        kvp_model_preset_t g = {.struct_size = sizeof g};
        FZI_ASSERT(kvp_model_preset_get(i, &g) == KVP_OK);
        if (fp_caseeq(name, g.name)) want = i;
    }
    FZI_ASSERT(rc == (want >= 0 ? KVP_OK : KVP_ENOENT));
    if (rc == KVP_OK) {
        FZI_ASSERT(fp_caseeq(name, m.name) && m.layers > 0 && m.kv_heads > 0 &&
                   m.head_dim > 0 && m.q_heads % m.kv_heads == 0 && m.reserved_ == 0);
    } else {
        FZI_ASSERT(err[0] != '\0' && fp_poisoned(&m, sizeof m, sizeof m.struct_size));
    }

    kvp_gpu_preset_t g;
    memset(&g, FP_POISON, sizeof g);
    g.struct_size = sizeof g;
    err[0] = '\0';
    rc = kvp_gpu_preset_find(name, &g, err, sizeof err);
    want = -1;
    for (int32_t i = 0; i < kvp_gpu_preset_count(); i++) {
        kvp_gpu_preset_t h = {.struct_size = sizeof h};
        FZI_ASSERT(kvp_gpu_preset_get(i, &h) == KVP_OK);
        if (fp_caseeq(name, h.name)) want = i;
    }
    FZI_ASSERT(rc == (want >= 0 ? KVP_OK : KVP_ENOENT));
    if (rc == KVP_OK) FZI_ASSERT(fp_caseeq(name, g.name) && g.memory_bytes > 0);
    else FZI_ASSERT(err[0] != '\0' && fp_poisoned(&g, sizeof g, sizeof g.struct_size));

    /* indexes out of range, NULLs, short structs */
    int32_t idx = fzi_edgy_i32(c);
    kvp_model_preset_t m2 = {.struct_size = sizeof m2};
    rc = kvp_model_preset_get(idx, &m2);
    FZI_ASSERT(rc == ((idx >= 0 && idx < kvp_model_preset_count()) ? KVP_OK : KVP_EINVAL));
    kvp_gpu_preset_t g2 = {.struct_size = sizeof g2};
    rc = kvp_gpu_preset_get(idx, &g2);
    FZI_ASSERT(rc == ((idx >= 0 && idx < kvp_gpu_preset_count()) ? KVP_OK : KVP_EINVAL));
    m2.struct_size = (uint32_t)fzi_below(c, sizeof m2);
    FZI_ASSERT(kvp_model_preset_find(name, &m2, NULL, 0) == KVP_EINVAL);
    FZI_ASSERT(kvp_model_preset_find(NULL, &m, err, sizeof err) == KVP_EINVAL);
    FZI_ASSERT(kvp_gpu_preset_find(NULL, &g, err, sizeof err) == KVP_EINVAL);
    FZI_ASSERT(kvp_format_parse(NULL, &f, err, sizeof err) == KVP_EINVAL);
}

/* ---- 2: weights ------------------------------------------------------------ */

static void fp_weights(fzi_cursor *c) {
    static const char *const dict[] = {"fp32", "fp16", "bf16", "fp8", "int8", "int4", "INT4",
                                       "fp4", "int"};
    char type[FP_TEXT];
    fp_text(c, type, sizeof type, dict, (int)(sizeof dict / sizeof dict[0]));
    uint64_t params = (uint64_t)fzi_edgy_i64(c);
    static const struct { const char *name; unsigned num, den; } types[] = {
        {"fp32", 4, 1}, {"fp16", 2, 1}, {"bf16", 2, 1}, {"fp8", 1, 1}, {"int8", 1, 1},
        {"int4", 17, 32}};
    int t = -1;
    for (int i = 0; i < 6; i++)
        if (fp_caseeq(type, types[i].name)) t = i;
    char err[KVP_ERR_SIZE];
    err[0] = '\0';
    uint64_t bytes = 0x5555;
    int rc = kvp_weight_bytes(params, type, &bytes, err, sizeof err);
    fp_u128 want = 0;
    if (t >= 0) want = ((fp_u128)params * types[t].num + types[t].den - 1) / types[t].den;
    bool ok = t >= 0 && params > 0 && want <= UINT64_MAX;
    FZI_ASSERT(rc == (ok ? KVP_OK : KVP_EINVAL));
    if (ok) FZI_ASSERT(bytes == (uint64_t)want);
    else FZI_ASSERT(bytes == 0x5555 && err[0] != '\0');
}

/* ---- 3: layouts and arenas ------------------------------------------------- */

static int32_t fp_dim(fzi_cursor *c, int32_t small_max, int32_t step) {
    uint8_t k = fzi_u8(c);
    if (k < 200) return step * (1 + (int32_t)(k % (uint8_t)small_max));
    if (k < 230) {
        static const int32_t edges[] = {65536, 65537, 1024, 1032, 4096, 4097, 8, 0, 7, 2};
        return edges[k % 10];
    }
    return fzi_edgy_i32(c);
}

static int fp_bits(int32_t f) {
    static const int bits[KVP_FORMAT_COUNT] = {32, 16, 16, 8, 8, 4, 4};
    return bits[f];
}

/* Check a layout against the header's formulas. */
static void fp_check_layout(const kvp_layout_t *l, int32_t layers, int32_t kvh, int32_t hd,
                            int32_t ps, int32_t kf, int32_t vf) {
    FZI_ASSERT(l->layers == layers && l->kv_heads == kvh && l->head_dim == hd &&
               l->page_size == ps && l->k_format == kf && l->v_format == vf);
    bool staged = kf == KVP_FORMAT_INT8 || kf == KVP_FORMAT_INT4 || kf == KVP_FORMAT_INT4_V1;
    FZI_ASSERT(l->needs_staging == (staged ? 1 : 0));
    FZI_ASSERT(l->k_block_bytes % KVP_BLOCK_ALIGN == 0 && l->v_block_bytes % KVP_BLOCK_ALIGN == 0);
    /* each block holds at least its elements */
    FZI_ASSERT((fp_u128)l->k_block_bytes * 8 >= (fp_u128)ps * (unsigned)hd * (unsigned)fp_bits(kf));
    FZI_ASSERT((fp_u128)l->v_block_bytes * 8 >= (fp_u128)ps * (unsigned)hd * (unsigned)fp_bits(vf));
    fp_u128 lh = (fp_u128)(unsigned)layers * (unsigned)kvh;
    FZI_ASSERT((fp_u128)l->page_bytes == lh * ((fp_u128)l->k_block_bytes + l->v_block_bytes));
    if (staged)
        FZI_ASSERT((fp_u128)l->staging_page_bytes == lh * (unsigned)ps * (unsigned)hd * 4u);
    FZI_ASSERT(l->fixed_bytes % KVP_ARENA_ALIGN == 0);
    FZI_ASSERT((fp_u128)l->element_bytes_per_token ==
               lh * (unsigned)hd * (unsigned)(fp_bits(kf) + fp_bits(vf)) / 8);
    FZI_ASSERT(l->bytes_per_token == (double)l->page_bytes / (double)ps);
}

static void fp_layout(fzi_cursor *c) {
    int32_t layers = fp_dim(c, 96, 1), kvh = fp_dim(c, 16, 1), hd = fp_dim(c, 32, 8);
    int32_t ps = fp_dim(c, 64, 1);
    uint8_t fk = fzi_u8(c);
    int32_t kf = fk < 240 ? (int32_t)(fk % KVP_FORMAT_COUNT) : fzi_edgy_i32(c);
    uint8_t fv = fzi_u8(c);
    int32_t vf = fv < 240 ? (int32_t)(fv % KVP_FORMAT_COUNT) : fzi_edgy_i32(c);
    kvp_layout_t l;
    memset(&l, FP_POISON, sizeof l);
    l.struct_size = sizeof l;
    char err[KVP_ERR_SIZE];
    err[0] = '\0';
    int rc = kvp_layout_compute(layers, kvh, hd, ps, kf, vf, &l, err, sizeof err);
    bool valid = layers >= 1 && layers <= 65536 && kvh >= 1 && kvh <= 65536 && hd >= 8 &&
                 hd <= KVP_MAX_HEAD_DIM && hd % 8 == 0 && ps >= 1 && ps <= KVP_MAX_PAGE_SIZE &&
                 kf >= 0 && kf < KVP_FORMAT_COUNT && vf >= 0 && vf < KVP_FORMAT_COUNT &&
                 !((kf == KVP_FORMAT_INT4 || kf == KVP_FORMAT_INT4_V1) && ps % 2 != 0);
    FZI_ASSERT(rc == (valid ? KVP_OK : KVP_EINVAL));
    if (!valid) {
        FZI_ASSERT(err[0] != '\0' && fp_poisoned(&l, sizeof l, sizeof l.struct_size));
        return;
    }
    fp_check_layout(&l, layers, kvh, hd, ps, kf, vf);

    /* the arena for fuzzed page counts: fixed + pages + staging, or overflow */
    for (int i = 0; i < 2; i++) {
        uint64_t pages = (fzi_u8(c) & 1) ? (uint64_t)fzi_edgy_i64(c) : fzi_u16(c);
        uint64_t staging = (fzi_u8(c) & 1) ? (uint64_t)fzi_edgy_i64(c) : fzi_u8(c);
        uint64_t bytes = 0x5555;
        err[0] = '\0';
        rc = kvp_arena_bytes(&l, pages, staging, &bytes, err, sizeof err);
        fp_u128 want = (fp_u128)l.fixed_bytes + (fp_u128)pages * l.page_bytes;
        bool over = want > UINT64_MAX;
        if (l.needs_staging) {
            fp_u128 st = (fp_u128)staging * l.staging_page_bytes;
            over |= st > UINT64_MAX;
            want += st;
        }
        over |= want > UINT64_MAX;
        FZI_ASSERT(rc == (over ? KVP_EINVAL : KVP_OK));
        if (over) FZI_ASSERT(bytes == 0x5555 && err[0] != '\0');
        else FZI_ASSERT(bytes == (uint64_t)want);
    }
    /* a layout the caller filled in wrongly is refused or computed safely */
    kvp_layout_t forged = l;
    forged.page_bytes = (uint64_t)fzi_edgy_i64(c);
    forged.staging_page_bytes = (uint64_t)fzi_edgy_i64(c);
    forged.fixed_bytes = (uint64_t)fzi_edgy_i64(c);
    forged.needs_staging = (int32_t)fzi_below(c, 3);
    uint64_t bytes = 0;
    rc = kvp_arena_bytes(&forged, (uint64_t)fzi_edgy_i64(c), (uint64_t)fzi_edgy_i64(c), &bytes,
                         err, sizeof err);
    FZI_ASSERT(rc == KVP_OK || rc == KVP_EINVAL);
    FZI_ASSERT(kvp_arena_bytes(&l, 1, 1, NULL, err, sizeof err) == KVP_EINVAL);
    FZI_ASSERT(kvp_arena_bytes(NULL, 1, 1, &bytes, err, sizeof err) == KVP_EINVAL);
}

/* ---- 4: the planner ---------------------------------------------------------- */

static uint64_t fp_bytes(fzi_cursor *c) {
    uint8_t k = fzi_u8(c);
    if (k < 64) return 0;
    if (k < 192) return (uint64_t)fzi_u16(c) << (k % 40);
    return (uint64_t)fzi_edgy_i64(c);
}

static void fp_plan(fzi_cursor *c) {
    kvp_plan_params_t p;
    kvp_plan_params_init(&p);
    uint8_t k = fzi_u8(c);
    p.layers = fp_dim(c, 96, 1);
    p.kv_heads = fp_dim(c, 16, 1);
    p.head_dim = fp_dim(c, 32, 8);
    p.q_heads = (k & 1) ? fzi_edgy_i32(c)
                        : (int32_t)((uint32_t)p.kv_heads * fzi_below(c, 4)); /* may wrap */
    p.k_format = (int32_t)fzi_below(c, KVP_FORMAT_COUNT);
    p.v_format = (int32_t)fzi_below(c, KVP_FORMAT_COUNT);
    p.page_size = (k & 2) ? fp_dim(c, 64, 1) : 16;
    p.context = (k & 4) ? (uint64_t)fzi_edgy_i64(c) : (uint64_t)fzi_u16(c);
    if (k & 8) {
        p.kv_budget_bytes = fp_bytes(c);
        if (k & 16) p.memory_bytes = fp_bytes(c); /* both: refused */
    } else {
        p.memory_bytes = fp_bytes(c);
        p.weight_bytes = fp_bytes(c);
        p.reserve_bytes = (k & 16) ? fp_bytes(c) : 0;
    }
    static const double utils[] = {0.9, 1.0, 0.5, 1e-9, 0.0, -0.5, 1.0000001, 1e300};
    uint8_t u = fzi_u8(c);
    p.utilization = u < 200 ? utils[u % 3] : u < 250 ? utils[u % 8] : u == 250 ? NAN : INFINITY;
    if ((k & 0xE0) == 0xE0) p.struct_size = (uint32_t)fzi_below(c, sizeof p);

    kvp_plan_t plan;
    memset(&plan, FP_POISON, sizeof plan);
    plan.struct_size = sizeof plan;
    char err[KVP_ERR_SIZE];
    err[0] = '\0';
    int rc = kvp_plan_compute(&p, &plan, err, sizeof err);
    FZI_ASSERT(rc == KVP_OK || rc == KVP_EINVAL);
    if (rc != KVP_OK) {
        FZI_ASSERT(err[0] != '\0' && fp_poisoned(&plan, sizeof plan, sizeof plan.struct_size));
        return;
    }
    /* what was accepted is in range */
    FZI_ASSERT(p.struct_size >= sizeof p && p.q_heads >= 0 &&
               (p.q_heads == 0 || p.q_heads % p.kv_heads == 0));
    kvp_layout_t l = {.struct_size = sizeof l};
    FZI_ASSERT(kvp_layout_compute(p.layers, p.kv_heads, p.head_dim, p.page_size, p.k_format,
                                  p.v_format, &l, NULL, 0) == KVP_OK);
    /* the budget: given, or utilization of what weights and reserve leave */
    if (p.kv_budget_bytes != 0) {
        FZI_ASSERT(plan.kv_budget_bytes == p.kv_budget_bytes && p.memory_bytes == 0);
    } else {
        FZI_ASSERT(p.utilization > 0 && p.utilization <= 1);
        fp_u128 taken = (fp_u128)p.weight_bytes + p.reserve_bytes;
        FZI_ASSERT(taken < p.memory_bytes);
        FZI_ASSERT(plan.kv_budget_bytes <= p.memory_bytes - (uint64_t)taken);
    }
    FZI_ASSERT(plan.k_format == p.k_format && plan.v_format == p.v_format &&
               plan.page_size == p.page_size && plan.needs_staging == l.needs_staging &&
               plan.reserved_ == 0 && plan.context == p.context);
    FZI_ASSERT(plan.page_bytes == l.page_bytes && plan.fixed_bytes == l.fixed_bytes &&
               plan.staging_page_bytes == (l.needs_staging ? l.staging_page_bytes : 0));
    FZI_ASSERT(plan.bytes_per_token == l.element_bytes_per_token);
    /* the arena is what kvp_arena_bytes says, and fits the budget */
    uint64_t arena = 0;
    FZI_ASSERT(kvp_arena_bytes(&l, plan.num_pages, plan.num_staging, &arena, NULL, 0) == KVP_OK);
    FZI_ASSERT(arena == plan.arena_bytes && arena <= plan.kv_budget_bytes);
    FZI_ASSERT(plan.num_pages >= 1 || plan.num_staging >= 1);
    FZI_ASSERT((fp_u128)plan.max_tokens == (fp_u128)plan.num_pages * (unsigned)p.page_size);
    /* one more page would not fit (the planner counts every page it can) */
    fp_u128 more = (fp_u128)plan.arena_bytes + plan.page_bytes;
    FZI_ASSERT(more > plan.kv_budget_bytes);
    if (p.context > 0) {
        uint64_t ps = (uint64_t)p.page_size;
        uint64_t pages = p.context / ps + (!l.needs_staging && p.context % ps != 0);
        FZI_ASSERT(plan.pages_per_seq == pages);
        FZI_ASSERT((fp_u128)plan.seq_bytes ==
                   (fp_u128)pages * l.page_bytes + plan.staging_page_bytes);
        FZI_ASSERT((fp_u128)plan.max_seqs * plan.seq_bytes <= plan.kv_budget_bytes - l.fixed_bytes);
        FZI_ASSERT(plan.num_staging == (l.needs_staging ? plan.max_seqs : 0));
        /* max_seqs sequences of `context` tokens hold no more pages than planned */
        FZI_ASSERT((fp_u128)plan.max_seqs * pages <= plan.num_pages);
    } else {
        FZI_ASSERT(plan.max_seqs == 0 && plan.num_staging == 0);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fzi_cursor c = fzi_make(data, size);
    switch (fzi_u8(&c) % 5) {
    case 0: fp_size(&c); break;
    case 1: fp_names(&c); break;
    case 2: fp_weights(&c); break;
    case 3: fp_layout(&c); break;
    default: fp_plan(&c); break;
    }
    return 0;
}
