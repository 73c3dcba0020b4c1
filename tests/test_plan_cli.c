/*
 * Tool: kvpage-plan, run in-process (the same function main() calls).
 * Checks the bytes per token of a known shape, that the table's numbers
 * are the API's, and that every kind of bad input is a clear message and
 * exit status 2.
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>

#include "kvpage.h"
#include "kvpage_plan.h"
#include "plan_cli.h"
#include "testutil.h"

typedef struct {
    int rc;
    char out[65536];
    char err[4096];
} cli_result;

static void slurp(FILE *f, char *buf, size_t size) {
    rewind(f);
    size_t n = fread(buf, 1, size - 1, f);
    buf[n] = '\0';
    fclose(f);
}

static cli_result *run(const char *first, ...) {
    static cli_result r;
    char *argv[64];
    int argc = 0;
    argv[argc++] = (char *)"kvpage-plan";
    va_list ap;
    va_start(ap, first);
    for (const char *a = first; a != NULL && argc < 63; a = va_arg(ap, const char *))
        argv[argc++] = (char *)(uintptr_t)a;
    va_end(ap);
    argv[argc] = NULL;
    FILE *out = tmpfile(), *err = tmpfile();
    assert_non_null(out);
    assert_non_null(err);
    r.rc = kvp_tool_plan(argc, argv, out, err);
    slurp(out, r.out, sizeof r.out);
    slurp(err, r.err, sizeof r.err);
    return &r;
}

static void test_json_bytes_per_token_80_layers(void **state) {
    (void)state;
    cli_result *r = run("--layers", "80", "--kv-heads", "8", "--head-dim", "128", "--format",
                        "fp16", "--json", NULL);
    assert_int_equal(r->rc, 0);
    assert_true(json_valid(r->out));
    assert_non_null(strstr(r->out, "\"bytes_per_token\": 327680,"));
    assert_string_equal(r->err, "");
}

static uint64_t json_u64_after(const char *text, const char *anchor, const char *key) {
    const char *p = anchor ? strstr(text, anchor) : text;
    assert_non_null(p);
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    p = strstr(p, pat);
    assert_non_null(p);
    return strtoull(p + strlen(pat), NULL, 10);
}

/* The table and the JSON carry the API's numbers for every format. */
static void test_table_matches_api(void **state) {
    (void)state;
    cli_result *r = run("--preset", "llama-3.1-8b", "--gpu", "h100-80g", "--context", "8192", NULL);
    assert_int_equal(r->rc, 0);
    char table[65536];
    memcpy(table, r->out, sizeof table);

    kvp_plan_params_t p;
    kvp_plan_params_init(&p);
    p.layers = 32;
    p.kv_heads = 8;
    p.head_dim = 128;
    p.memory_bytes = 81559ull << 20;
    p.weight_bytes = 2 * 8030261248ull;
    p.context = 8192;
    static const struct { const char *label; int32_t k, v; } fmts[] = {
        {"fp16", KVP_FORMAT_FP16, KVP_FORMAT_FP16},
        {"int8", KVP_FORMAT_INT8, KVP_FORMAT_INT8},
        {"int4", KVP_FORMAT_INT4, KVP_FORMAT_INT4},
    };
    r = run("--preset", "llama-3.1-8b", "--gpu", "h100-80g", "--context", "8192", "--json", NULL);
    assert_int_equal(r->rc, 0);
    assert_true(json_valid(r->out));
    for (size_t i = 0; i < 3; i++) {
        p.k_format = fmts[i].k;
        p.v_format = fmts[i].v;
        kvp_plan_t plan = {.struct_size = sizeof plan};
        assert_int_equal(kvp_plan_compute(&p, &plan, NULL, 0), KVP_OK);
        char anchor[64], line[64];
        snprintf(anchor, sizeof anchor, "\"%s\": {", fmts[i].label);
        assert_int_equal(json_u64_after(r->out, anchor, "max_seqs"), plan.max_seqs);
        assert_int_equal(json_u64_after(r->out, anchor, "pages"), plan.num_pages);
        /* the summary line of the table: "fp16: N" */
        snprintf(line, sizeof line, "%s: %llu", fmts[i].label, (unsigned long long)plan.max_seqs);
        assert_non_null(strstr(table, line));
    }
    assert_non_null(strstr(table, "seqs@8192"));
}

static void test_memory_sources(void **state) {
    (void)state;
    cli_result *r = run("--preset", "mistral-7b", "--vram", "24GB", "--weight-dtype", "int4",
                        "--reserve", "1GiB", "--json", NULL);
    assert_int_equal(r->rc, 0);
    assert_true(json_valid(r->out));
    assert_int_equal(json_u64_after(r->out, "\"memory\"", "memory_bytes"), 24000000000ull);
    assert_int_equal(json_u64_after(r->out, "\"memory\"", "reserve_bytes"), 1ull << 30);
    uint64_t w = 0;
    assert_int_equal(kvp_weight_bytes(7248023552ull, "int4", &w, NULL, 0), KVP_OK);
    assert_int_equal(json_u64_after(r->out, "\"memory\"", "weight_bytes"), w);

    r = run("--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--kv-budget", "16GiB",
            "--k-format", "int8", "--v-format", "int4", "--page-size", "32", "--context", "32k",
            "--json", NULL);
    assert_int_equal(r->rc, 0);
    assert_true(json_valid(r->out));
    assert_int_equal(json_u64_after(r->out, NULL, "kv_budget_bytes"), 16ull << 30);
    assert_int_equal(json_u64_after(r->out, NULL, "context"), 32768);
    assert_non_null(strstr(r->out, "\"k_format\": \"int8\", \"v_format\": \"int4\""));
}

static void test_lists_help_version(void **state) {
    (void)state;
    cli_result *r = run("--list-presets", NULL);
    assert_int_equal(r->rc, 0);
    for (int32_t i = 0; i < kvp_model_preset_count(); i++) {
        kvp_model_preset_t m = {.struct_size = sizeof m};
        assert_int_equal(kvp_model_preset_get(i, &m), KVP_OK);
        assert_non_null(strstr(r->out, m.name));
    }
    r = run("--list-gpus", NULL);
    assert_int_equal(r->rc, 0);
    assert_non_null(strstr(r->out, "jetson-orin-8g"));
    r = run("--help", NULL);
    assert_int_equal(r->rc, 0);
    assert_non_null(strstr(r->out, "--kv-budget"));
    r = run("--version", NULL);
    assert_int_equal(r->rc, 0);
    assert_non_null(strstr(r->out, KVP_VERSION_STRING));
}

/* Each bad input: exit status 2, nothing on stdout, the problem named. */
static void test_bad_input(void **state) {
    (void)state;
    static const struct { const char *args[12]; const char *needle; } cases[] = {
        {{"--layers", "0", "--kv-heads", "8", "--head-dim", "128"}, "--layers must be in"},
        {{"--layers", "-3", "--kv-heads", "8", "--head-dim", "128"}, "--layers must be at least"},
        {{"--layers", "abc", "--kv-heads", "8", "--head-dim", "128"}, "not a whole number"},
        {{"--layers", "12x", "--kv-heads", "8", "--head-dim", "128"}, "not a whole number"},
        {{"--layers", "99999999999999999999", "--kv-heads", "8", "--head-dim", "128"}, "--layers"},
        {{"--layers", "32", "--kv-heads", "8", "--head-dim", "100"}, "head_dim"},
        {{"--layers", "32", "--kv-heads", "8"}, "give --preset"},
        {{"--preset", "gpt-5"}, "unknown preset 'gpt-5'"},
        {{"--preset", "llama-3.1-8b", "--gpu", "tpu-v9"}, "unknown GPU 'tpu-v9'"},
        {{"--preset", "llama-3.1-8b", "--format", "fp7"}, "unknown format 'fp7'"},
        {{"--preset", "llama-3.1-8b", "--format", "int8", "--k-format", "int4"}, "not both"},
        {{"--preset", "llama-3.1-8b", "--vram", "0"}, "zero"},
        {{"--preset", "llama-3.1-8b", "--vram", "12XB"}, "unknown unit"},
        {{"--preset", "llama-3.1-8b", "--vram", "-4GiB"}, "not a positive number"},
        {{"--preset", "llama-3.1-8b", "--gpu", "h100-80g", "--vram", "8GiB"}, "not both"},
        {{"--preset", "llama-3.1-8b", "--kv-budget", "1KiB"}, "smaller than one page"},
        {{"--preset", "llama-3.1-70b", "--gpu", "l4-24g"}, "do not fit in the device memory"},
        {{"--preset", "llama-3.1-8b", "--vram", "16GiB", "--weights", "20GiB"}, "do not fit"},
        {{"--preset", "llama-3.1-8b", "--kv-budget", "8GiB", "--gpu", "h100-80g"}, "do not combine"},
        {{"--preset", "llama-3.1-8b", "--weights", "2GiB"}, "need the device memory"},
        {{"--layers", "4", "--kv-heads", "8", "--head-dim", "128", "--vram", "8GiB",
          "--weight-dtype", "fp16"}, "needs --preset"},
        {{"--preset", "llama-3.1-8b", "--gpu", "h100-80g", "--utilization", "0"}, "--utilization"},
        {{"--preset", "llama-3.1-8b", "--gpu", "h100-80g", "--utilization", "1.5"}, "--utilization"},
        {{"--preset", "llama-3.1-8b", "--gpu", "h100-80g", "--utilization", "nan"}, "not a number"},
        {{"--preset", "llama-3.1-8b", "--page-size", "0"}, "--page-size"},
        {{"--preset", "llama-3.1-8b", "--page-size", "9", "--format", "int4"}, "even"},
        {{"--preset", "llama-3.1-8b", "--kv-budget", "16GiB", "--context",
          "9223372036854775807"}, "overflow"},
        {{"--preset", "llama-3.1-8b", "--context", "-1"}, "--context"},
        {{"--preset", "llama-3.1-8b", "--q-heads", "12"}, "multiple of kv_heads"},
        {{"--preset"}, "needs a value"},
        {{"--preset", ""}, "needs a value"},
        {{"--bogus", "1"}, "unknown option '--bogus'"},
        {{"--bogus"}, "unknown option '--bogus'"},
        {{"--preset", "llama-3.1-8b", "--layers", ""}, "--layers: '' is not a whole number"},
        {{"llama"}, "unexpected argument"},
        {{"--json=yes"}, "takes no value"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *argv[16];
        int argc = 0;
        argv[argc++] = (char *)"kvpage-plan";
        for (int k = 0; k < 12 && cases[i].args[k]; k++) argv[argc++] = (char *)(uintptr_t)cases[i].args[k];
        argv[argc] = NULL;
        FILE *out = tmpfile(), *err = tmpfile();
        int rc = kvp_tool_plan(argc, argv, out, err);
        char o[4096], e[4096];
        slurp(out, o, sizeof o);
        slurp(err, e, sizeof e);
        if (rc != 2 || strstr(e, cases[i].needle) == NULL)
            print_error("case %zu (%s ...): rc %d, stderr '%s'\n", i, cases[i].args[0], rc, e);
        assert_int_equal(rc, 2);
        assert_non_null(strstr(e, cases[i].needle));
        assert_non_null(strstr(e, "kvpage-plan: "));
        assert_string_equal(o, "");
    }
}

/* --option=value works like --option value. */
static void test_equals_syntax(void **state) {
    (void)state;
    cli_result *r = run("--preset=qwen2.5-7b", "--gpu=l4-24g", "--format=int4", "--json", NULL);
    assert_int_equal(r->rc, 0);
    assert_true(json_valid(r->out));
    assert_non_null(strstr(r->out, "\"preset\": \"qwen2.5-7b\""));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json_bytes_per_token_80_layers),
        cmocka_unit_test(test_table_matches_api),
        cmocka_unit_test(test_memory_sources),
        cmocka_unit_test(test_lists_help_version),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_equals_syntax),
    };
    return cmocka_run_group_tests_name("plan_cli", tests, NULL, NULL);
}
