/*
 * Tool: kvpage-sim, run in-process (the function main() calls) and through
 * its engine (sim_run). Checks determinism for a seed, that the paged
 * strategies never hit an allocation failure while the library's invariants
 * hold after every step, that every request is accounted for, the
 * figures the default mixed run must reach, the JSON and the SVG, trace
 * files, and bad input.
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <unistd.h>

#include "kvpage.h"
#include "kvpage_plan.h"
#include "sim.h"
#include "sim_cli.h"
#include "testutil.h"

typedef struct {
    int rc;
    char *out;
    char err[8192];
} cli_result;

static char *slurp_all(FILE *f) {
    long n = ftell(f);
    rewind(f);
    char *buf = malloc((size_t)n + 1);
    assert_non_null(buf);
    size_t got = fread(buf, 1, (size_t)n, f);
    buf[got] = '\0';
    fclose(f);
    return buf;
}

static cli_result *run(const char *first, ...) {
    static cli_result r;
    free(r.out);
    char *argv[64];
    int argc = 0;
    argv[argc++] = (char *)"kvpage-sim";
    va_list ap;
    va_start(ap, first);
    for (const char *a = first; a != NULL && argc < 63; a = va_arg(ap, const char *))
        argv[argc++] = (char *)(uintptr_t)a;
    va_end(ap);
    argv[argc] = NULL;
    FILE *out = tmpfile(), *err = tmpfile();
    assert_non_null(out);
    assert_non_null(err);
    r.rc = kvp_tool_sim(argc, argv, out, err);
    r.out = slurp_all(out);
    char *e = slurp_all(err);
    snprintf(r.err, sizeof r.err, "%s", e);
    free(e);
    return &r;
}

static const char *last_line(const char *text) {
    size_t n = strlen(text);
    while (n > 0 && text[n - 1] == '\n') n--;
    while (n > 0 && text[n - 1] != '\n') n--;
    return text + n;
}

/* The number after "key": inside the object of `strategy`. */
static double json_num(const char *json, const char *strategy, const char *key) {
    char pat[96];
    snprintf(pat, sizeof pat, "\"%s\": {", strategy);
    const char *p = strstr(json, pat);
    assert_non_null(p);
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    p = strstr(p, pat);
    assert_non_null(p);
    return strtod(p + strlen(pat), NULL);
}

/* A small configuration under memory pressure: Llama-3.2-1B, 1.5 GiB of KV
 * (about 49k fp16 tokens), a short mixed trace. */
#define SMALL "--model", "llama-3.2-1b", "--gpu", "h100-80g", "--kv-budget", "1536MiB", \
              "--host", "3GiB", "--scale", "0.1"

static void test_deterministic(void **state) {
    (void)state;
    cli_result *r = run("--preset", "mixed", SMALL, "--seed", "7", "--json", NULL);
    assert_int_equal(r->rc, 0);
    char *first = strdup(r->out);
    r = run("--preset", "mixed", SMALL, "--seed", "7", "--json", NULL);
    assert_int_equal(r->rc, 0);
    assert_string_equal(first, r->out); /* every figure, to the last digit */
    r = run("--preset", "mixed", SMALL, "--seed", "8", "--json", NULL);
    assert_int_equal(r->rc, 0);
    assert_string_not_equal(first, r->out);
    free(first);
}

/* A trace under memory pressure: four long low-priority documents with long
 * outputs, then a burst of high- and normal-priority chat while they decode;
 * more than 100k tokens wanted at once from a budget of 49k fp16 tokens
 * (Llama-3.2-1B, 1.5 GiB). */
static void pressure_trace(sim_trace *t) {
    t->n = 0;
    t->r = calloc(100, sizeof *t->r);
    assert_non_null(t->r);
    uint64_t x = 12345;
    for (int i = 0; i < 4; i++)
        t->r[t->n++] = (sim_request){0.1 * i, 12000, 2500 + 100 * i, 4096, 0};
    for (int i = 0; i < 90; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        bool high = i % 3 == 0;
        t->r[t->n++] = (sim_request){0.5 + 0.02 * i, high ? 400 + (int64_t)(x >> 56) : 2000,
                                     100 + (int64_t)((x >> 40) % 300), 512, high ? 2 : 1};
    }
    t->duration = t->r[t->n - 1].arrival;
}

static void small_config(sim_config *c) {
    sim_config_default(c);
    kvp_model_preset_t m = {.struct_size = sizeof m};
    assert_int_equal(kvp_model_preset_find("llama-3.2-1b", &m, NULL, 0), KVP_OK);
    c->layers = m.layers;
    c->kv_heads = m.kv_heads;
    c->head_dim = m.head_dim;
    c->q_heads = m.q_heads;
    c->params = m.params;
    c->weight_bytes = m.params * 2;
    c->kv_budget = 1536ull << 20;
    c->host_bytes = 3ull << 30;
}

/* Every strategy on the pressure trace, with the pool/table/tier invariants
 * checked after every step: the paged strategies never fail an allocation,
 * and every request is accounted for. */
static void test_pressure_invariants(void **state) {
    (void)state;
    sim_config c;
    small_config(&c);
    c.check = true;
    sim_trace t;
    pressure_trace(&t);
    char err[512];
    int64_t evictions = 0;
    for (int s = 0; s < SIM_NSTRATEGIES; s++) {
        sim_result r;
        int rc = sim_run(&c, &t, s, &r, err, sizeof err);
        if (rc) print_error("%s: %s\n", sim_strategy_names[s], err);
        assert_int_equal(rc, 0);
        assert_int_equal(r.requests, t.n);
        assert_int_equal(r.completed + r.dropped + r.rejected + r.failed + r.unfinished, t.n);
        assert_true(r.utilization > 0 && r.utilization <= 1);
        assert_true(r.nseries == r.steps);
        for (int64_t i = 1; i < r.nseries; i++) assert_true(r.series[i].t > r.series[i - 1].t);
        if (s != SIM_STATIC) {
            assert_int_equal(r.oom, 0);
            assert_int_equal(r.completed, t.n); /* nothing dropped or lost */
            assert_true(r.peak_mem_gib <= 1.5);
        }
        if (s == SIM_FULL) {
            assert_true(r.swap_outs > 0); /* the documents made room for the chat */
            assert_int_equal(r.swap_ins, r.swap_outs);
            assert_true(r.peak_host_gib > 0 && r.peak_host_gib <= 3.0);
            /* the high class waits less than the documents it displaced */
            assert_true(r.cls[r.nclasses - 1].ttft_p99 < r.cls[0].latency_p99);
        }
        evictions += r.preemptions + r.swap_outs;
        sim_result_free(&r);
    }
    assert_true(evictions > 0);
    /* a host tier of a few pages: full recomputes instead, still no OOM */
    c.host_bytes = 8ull << 20;
    sim_result r;
    assert_int_equal(sim_run(&c, &t, SIM_FULL, &r, err, sizeof err), 0);
    assert_int_equal(r.oom, 0);
    assert_true(r.preemptions > 0);
    assert_true(r.peak_host_gib <= 8.0 / 1024);
    sim_result_free(&r);
    /* static with slots shorter than the documents: each is an OOM event */
    c.static_max_len = 4096;
    assert_int_equal(sim_run(&c, &t, SIM_STATIC, &r, err, sizeof err), 0);
    assert_int_equal(r.oom, 4);
    assert_int_equal(r.failed, 4);
    sim_result_free(&r);
    sim_trace_free(&t);
}

/* Every preset, shortened: the paged strategies never fail an allocation
 * and every request is accounted for. */
static void test_presets_no_oom(void **state) {
    (void)state;
    static const char *const presets[] = {"long-context", "burst", "mixed"};
    for (int k = 0; k < 3; k++) {
        cli_result *r = run("--preset", presets[k], "--model", "llama-3.2-1b", "--kv-budget",
                            "6GiB", "--host", "6GiB", "--scale", k == 0 ? "0.3" : "0.1",
                            "--json", NULL);
        if (r->rc != 0) print_error("%s\n%s", r->err, r->out);
        assert_int_equal(r->rc, 0);
        const char *json = last_line(r->out);
        assert_true(json_valid(json));
        for (int s = 0; s < SIM_NSTRATEGIES; s++) {
            const char *name = sim_strategy_names[s];
            double req = json_num(json, name, "requests");
            double sum = json_num(json, name, "completed") + json_num(json, name, "dropped") +
                         json_num(json, name, "rejected") + json_num(json, name, "failed") +
                         json_num(json, name, "unfinished");
            assert_true(req > 0);
            assert_true(sum == req); /* every request is accounted for */
            double u = json_num(json, name, "utilization");
            assert_true(u > 0 && u <= 1.0);
            if (s != SIM_STATIC) {
                assert_true(json_num(json, name, "oom") == 0);
                assert_true(json_num(json, name, "failed") == 0);
            }
        }
    }
}

/* The default run, build/bin/kvpage-sim --preset mixed --json: no OOM for
 * the paged strategies, full at least twice static's throughput with 90%
 * utilization, and its high priority no slower than paged's. */
static void test_default_mixed_run(void **state) {
    (void)state;
    char svg[] = "/tmp/kvpage-sim-test-XXXXXX";
    int fd = mkstemp(svg);
    assert_true(fd >= 0);
    close(fd);
    cli_result *r = run("--preset", "mixed", "--json", "--plot", svg, NULL);
    assert_int_equal(r->rc, 0);
    const char *json = last_line(r->out);
    assert_true(json_valid(json));
    assert_true(json_num(json, "full", "oom") == 0);
    assert_true(json_num(json, "full", "throughput") >= 2 * json_num(json, "static", "throughput"));
    assert_true(json_num(json, "full", "utilization") >= 0.9);
    assert_true(json_num(json, "full", "high_latency_p99") <=
                json_num(json, "paged", "high_latency_p99"));
    for (int s = 1; s < SIM_NSTRATEGIES; s++)
        assert_true(json_num(json, sim_strategy_names[s], "oom") == 0);
    /* the table says the same */
    assert_non_null(strstr(r->out, "OOM events"));
    assert_non_null(strstr(r->out, "prio 2: latency p99"));
    /* the plot: well-formed XML with a line per strategy and a legend */
    FILE *f = fopen(svg, "r");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    char *text = slurp_all(f);
    unlink(svg);
    assert_true(xml_well_formed(text));
    int lines = 0;
    for (const char *p = text; (p = strstr(p, "<polyline")) != NULL; p++) lines++;
    assert_true(lines >= 2 * SIM_NSTRATEGIES);
    for (int s = 0; s < SIM_NSTRATEGIES; s++) assert_non_null(strstr(text, sim_strategy_names[s]));
    assert_non_null(strstr(text, "KV memory in use"));
    assert_non_null(strstr(text, "time (s)"));
    free(text);
}

/* A trace saved as CSV reads back to the same results; JSONL too. */
static void test_trace_files(void **state) {
    (void)state;
    char csv[] = "/tmp/kvpage-sim-csv-XXXXXX", jl[] = "/tmp/kvpage-sim-jl-XXXXXX";
    int fd = mkstemp(csv);
    close(fd);
    fd = mkstemp(jl);
    close(fd);
    cli_result *r = run("--preset", "burst", SMALL, "--save-trace", csv, "--json", NULL);
    assert_int_equal(r->rc, 0);
    char *a = strdup(last_line(r->out));
    r = run("--trace", csv, "--model", "llama-3.2-1b", "--gpu", "h100-80g", "--kv-budget",
            "1536MiB", "--host", "3GiB", "--json", NULL);
    if (r->rc) print_error("%s", r->err);
    assert_int_equal(r->rc, 0);
    assert_string_equal(a, last_line(r->out));
    free(a);

    FILE *f = fopen(jl, "w");
    assert_non_null(f);
    fputs("{\"arrival\": 0.5, \"prompt_tokens\": 100, \"output_tokens\": 20, \"priority\": 2}\n"
          "\n# a comment\n"
          "{\"arrival_s\": 0, \"prompt_tokens\": 3000, \"output_tokens\": 200, \"priority\": 0, "
          "\"max_new_tokens\": 512, \"user\": \"x\"}\n",
          f);
    fclose(f);
    r = run("--trace", jl, "--model", "llama-3.2-1b", "--json", NULL);
    assert_int_equal(r->rc, 0);
    const char *json = last_line(r->out);
    assert_true(json_num(json, "full", "requests") == 2);
    assert_true(json_num(json, "full", "completed") == 2);
    assert_non_null(strstr(r->out, "2 requests"));

    f = fopen(jl, "w");
    fputs("arrival_s,prompt_tokens,output_tokens,priority\n1,10,5,0\n2,x,5,0\n", f);
    fclose(f);
    r = run("--trace", jl, NULL);
    assert_int_equal(r->rc, 2);
    assert_non_null(strstr(r->err, ":3: field 2 ('x') is not a number"));
    f = fopen(jl, "w");
    fputs("1,10,5,0,3\n", f); /* max_new_tokens below output_tokens */
    fclose(f);
    r = run("--trace", jl, NULL);
    assert_int_equal(r->rc, 2);
    assert_non_null(strstr(r->err, ":1: max_new_tokens (3) is below output_tokens (5)"));
    f = fopen(jl, "w");
    fputs("{\"arrival\": 1, \"prompt_tokens\": 0, \"output_tokens\": 5}\n", f);
    fclose(f);
    r = run("--trace", jl, NULL);
    assert_int_equal(r->rc, 2);
    assert_non_null(strstr(r->err, ":1: prompt_tokens must be a whole number"));
    f = fopen(jl, "w");
    fputs("{\"arrival\": 1, \"output_tokens\": 5}\n", f);
    fclose(f);
    r = run("--trace", jl, NULL);
    assert_int_equal(r->rc, 2);
    assert_non_null(strstr(r->err, "missing \"prompt_tokens\""));
    /* arrivals that are not finite or beyond 1e9 s (JSON numbers are read by
     * strtod: inf, nan and 1e308 got through and overflowed the conversion to
     * int64 microseconds) */
    static const char *const bad_arrivals[] = {"1e308", "inf", "nan", "-0.5", "1000000001"};
    for (size_t k = 0; k < sizeof bad_arrivals / sizeof *bad_arrivals; k++) {
        f = fopen(jl, "w");
        fprintf(f, "{\"arrival\": 0, \"prompt_tokens\": 10, \"output_tokens\": 5}\n"
                   "{\"arrival\": %s, \"prompt_tokens\": 10, \"output_tokens\": 5}\n",
                bad_arrivals[k]);
        fclose(f);
        r = run("--trace", jl, NULL);
        assert_int_equal(r->rc, 2);
        assert_non_null(strstr(r->err, ":2: arrival must be 0..1e9 seconds"));
    }
    f = fopen(jl, "w");
    fclose(f);
    r = run("--trace", jl, NULL);
    assert_int_equal(r->rc, 2);
    assert_non_null(strstr(r->err, "no requests"));
    unlink(csv);
    unlink(jl);
    r = run("--trace", "/nonexistent/trace.csv", NULL);
    assert_int_equal(r->rc, 2);
    assert_non_null(strstr(r->err, "cannot open"));
}

static void test_bad_arguments(void **state) {
    (void)state;
    static const char *const cases[][3] = {
        {"--preset", "nope", "unknown preset 'nope'"},
        {"--strategies", "static,fast", "unknown strategy 'fast'"},
        {"--model", "gpt-9", "--model"},
        {"--gpu", "tpu", "--gpu"},
        {"--kv-budget", "lots", "--kv-budget"},
        {"--seed", "-1", "--seed"},
        {"--host-gbps", "0", "--host-gbps"},
        {"--full-format", "int8/int3", "--full-format"},
        {"--bogus", "1", "unknown option '--bogus'"},
        {"--strategies", "", "--strategies"},
        {"--strategies", "paged,,full", "empty strategy name"},
        {"--drop-below", "x", "--drop-below: 'x'"},
        {"--max-batch", "0", "--max-batch must be in 1..65536, got 0"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        cli_result *r = run(cases[k][0], cases[k][1], NULL);
        if (r->rc != 2 || !strstr(r->err, cases[k][2]))
            print_error("case %zu: rc %d, stderr: %s\n", k, r->rc, r->err);
        assert_int_equal(r->rc, 2);
        assert_non_null(strstr(r->err, cases[k][2]));
        assert_string_equal(r->out, "");
    }
    cli_result *r = run("--preset", "mixed", "--trace", "x.csv", NULL);
    assert_int_equal(r->rc, 2);
    r = run("--seed", NULL);
    assert_int_equal(r->rc, 2);
    assert_non_null(strstr(r->err, "needs a value"));
    r = run("--kv-budget", "1MiB", "--strategies", "paged", NULL);
    assert_int_equal(r->rc, 1);
    assert_non_null(strstr(r->err, "holds no page"));
    r = run("--help", NULL);
    assert_int_equal(r->rc, 0);
    assert_non_null(strstr(r->out, "usage: kvpage-sim"));
    r = run("--drop-below", "-5", "--help", NULL); /* a negative priority is a value */
    assert_int_equal(r->rc, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_deterministic),
        cmocka_unit_test(test_pressure_invariants),
        cmocka_unit_test(test_presets_no_oom),
        cmocka_unit_test(test_default_mixed_run),
        cmocka_unit_test(test_trace_files),
        cmocka_unit_test(test_bad_arguments),
    };
    return cmocka_run_group_tests_name("sim", tests, NULL, NULL);
}
