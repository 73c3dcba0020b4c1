/*
 * The tools' numeric flags: tools/cli.c's strict parsers, then every tool
 * (kvpage-bench and each of its benchmarks, kvpage-sim, kvpage-plan) run
 * from the build tree with bad values. Each bad value must be an error that
 * names the flag (and the value), with exit status 2 and nothing on stdout,
 * before any benchmark or simulation starts: every run is bounded in time
 * and killed past it.
 *
 * The tools are found next to this program (../bin/ from its directory,
 * as the Makefile lays them out), or in $KVPAGE_BIN_DIR.
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

/* A bad flag must be refused at once; this bound leaves room for a loaded
 * machine, and is far below what any benchmark or simulation takes. */
#define TIME_LIMIT_S 10.0

/* ---- the parsers ----------------------------------------------------------- */

typedef struct {
    char text[1024];
} captured;

/* Runs a parser with its messages going to a temporary file. */
static FILE *errf_open(void) {
    FILE *f = tmpfile();
    assert_non_null(f);
    return f;
}

static void errf_read(FILE *f, captured *c) {
    rewind(f);
    size_t n = fread(c->text, 1, sizeof c->text - 1, f);
    c->text[n] = '\0';
    fclose(f);
}

static bool i64_ok(const char *text, int64_t min, int64_t max, bool allow_k, int64_t *out) {
    FILE *f = errf_open();
    bool ok = cli_parse_i64("tool", "--n", text, min, max, allow_k, out, f);
    captured c;
    errf_read(f, &c);
    if (ok) assert_string_equal(c.text, ""); /* no message on success */
    else {
        assert_non_null(strstr(c.text, "tool: --n"));
        if (text != NULL && text[0] != '\0') assert_non_null(strstr(c.text, text));
    }
    return ok;
}

static void test_parse_integers(void **state) {
    (void)state;
    int64_t v = 0;
    assert_true(i64_ok("12", 1, 100, false, &v));
    assert_int_equal(v, 12);
    assert_true(i64_ok("0", 0, 0, false, &v));
    assert_int_equal(v, 0);
    assert_true(i64_ok("-3", -10, 10, false, &v));
    assert_int_equal(v, -3);
    assert_true(i64_ok("32k", 1, INT64_MAX, true, &v));
    assert_int_equal(v, 32768);
    assert_true(i64_ok("2K", 1, INT64_MAX, true, &v));
    assert_int_equal(v, 2048);
    assert_true(i64_ok("9223372036854775807", 0, INT64_MAX, false, &v));
    assert_int_equal(v, INT64_MAX);
    assert_true(i64_ok("-9223372036854775808", INT64_MIN, 0, false, &v));
    assert_true(v == INT64_MIN);

    /* refused, and *out left as it was */
    static const char *const bad[] = {"",    "abc", "12x", "1.5", "1e3", "+3",  " 3", "3 ",
                                      "0x10", "-",  "--1", "k",   "3kk", "1k2"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        v = 77;
        if (i64_ok(bad[i], -100, 100000, true, &v)) fail_msg("'%s' was accepted", bad[i]);
        assert_int_equal(v, 77);
    }
    assert_false(i64_ok("32k", 1, INT64_MAX, false, &v)); /* no k suffix here */
    assert_false(i64_ok("-1", 0, 10, false, &v));        /* negative count */
    assert_false(i64_ok("0", 1, 10, false, &v));         /* zero where meaningless */
    assert_false(i64_ok("11", 1, 10, false, &v));
    assert_false(i64_ok("9223372036854775808", 0, INT64_MAX, false, &v));  /* overflow */
    assert_false(i64_ok("-9223372036854775809", INT64_MIN, 0, false, &v));
    assert_false(i64_ok("99999999999999999999", 0, INT64_MAX, false, &v));
    assert_false(i64_ok("9007199254740993k", 0, INT64_MAX, true, &v));      /* x1024 overflows */
    assert_false(i64_ok(NULL, 0, 10, false, &v));
    assert_int_equal(v, 77);

    /* the messages */
    FILE *f = errf_open();
    captured c;
    assert_false(cli_parse_i64("t", "--steps", "-1", 1, 10, false, &v, f));
    errf_read(f, &c);
    assert_string_equal(c.text, "t: --steps must be at least 1, got -1\n");
    f = errf_open();
    assert_false(cli_parse_i64("t", "--steps", "abc", 1, 10, false, &v, f));
    errf_read(f, &c);
    assert_string_equal(c.text, "t: --steps: 'abc' is not a whole number\n");
    f = errf_open();
    assert_false(cli_parse_i64("t", "--steps", "", 1, 10, false, &v, f));
    errf_read(f, &c);
    assert_string_equal(c.text, "t: --steps: '' is not a whole number\n");
    f = errf_open();
    assert_false(cli_parse_i64("t", "--steps", "11", 1, 10, false, &v, f));
    errf_read(f, &c);
    assert_string_equal(c.text, "t: --steps must be in 1..10, got 11\n");
    f = errf_open();
    assert_false(cli_parse_i64("t", "--steps", NULL, 1, 10, false, &v, f));
    errf_read(f, &c);
    assert_string_equal(c.text, "t: --steps needs a value\n");
}

static bool dbl_ok(const char *text, double min, double max, double *out) {
    FILE *f = errf_open();
    bool ok = cli_parse_double("tool", "--x", text, min, max, out, f);
    captured c;
    errf_read(f, &c);
    if (!ok) {
        assert_non_null(strstr(c.text, "tool: --x"));
        if (text != NULL && text[0] != '\0') assert_non_null(strstr(c.text, text));
    }
    return ok;
}

static void test_parse_reals(void **state) {
    (void)state;
    double v = 0;
    assert_true(dbl_ok("0.5", 0, 1, &v));
    assert_true(v == 0.5);
    assert_true(dbl_ok(".25", 0, 1, &v));
    assert_true(v == 0.25);
    assert_true(dbl_ok("1e3", 0, 1e6, &v));
    assert_true(v == 1000);
    assert_true(dbl_ok("-2", -5, 5, &v));
    assert_true(dbl_ok("7", 0, 10, &v));
    static const char *const bad[] = {"",    "abc", "nan", "NaN", "inf", "-inf", "infinity",
                                      "0x1p3", " 1", "1 ",  "1,5", "1e",  "e3",  "--1",
                                      "1e999", "."};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        v = 42;
        if (dbl_ok(bad[i], -1e9, 1e9, &v)) fail_msg("'%s' was accepted", bad[i]);
        assert_true(v == 42);
    }
    assert_false(dbl_ok("0", 1e-3, 1, &v)); /* zero where meaningless */
    assert_false(dbl_ok("-0.5", 0, 1, &v));
    assert_false(dbl_ok("1.5", 0, 1, &v));
}

static void test_options_in_argv(void **state) {
    (void)state;
    char *argv[] = {(char *)"tool", (char *)"--n", (char *)"5", (char *)"--f", (char *)"fp16",
                    (char *)"--last", NULL};
    int argc = 6, i = 1, n = 0, k = -1;
    FILE *f = errf_open();
    assert_true(cli_opt_int("tool", argc, argv, &i, 1, 9, &n, f));
    assert_int_equal(n, 5);
    assert_int_equal(i, 2);
    i = 3;
    static const char *const names[] = {"fp32", "fp16"};
    assert_true(cli_opt_choice("tool", argc, argv, &i, names, 2, &k, f));
    assert_int_equal(k, 1);
    i = 5;
    assert_null(cli_opt_value("tool", argc, argv, &i, f)); /* --last has no value */
    captured c;
    errf_read(f, &c);
    assert_string_equal(c.text, "tool: --last needs a value\n");
    f = errf_open();
    i = 3;
    static const char *const others[] = {"int8", "int4"};
    assert_false(cli_opt_choice("tool", argc, argv, &i, others, 2, &k, f));
    errf_read(f, &c);
    assert_string_equal(c.text, "tool: --f: 'fp16' is not one of int8 int4\n");
    f = errf_open();
    assert_int_equal(cli_unknown_option("tool", "--bogus", f), 2);
    errf_read(f, &c);
    assert_string_equal(c.text, "tool: unknown option '--bogus' (see --help)\n");
}

/* ---- the tools, run as programs ---------------------------------------------- */

static char bin_dir[PATH_MAX + 16];

static int find_tools(void **state) {
    (void)state;
    const char *env = getenv("KVPAGE_BIN_DIR");
    if (env != NULL && env[0] != '\0') {
        snprintf(bin_dir, sizeof bin_dir, "%s", env);
        return 0;
    }
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 8);
    if (n <= 0) return -1;
    self[n] = '\0';
    char *slash = strrchr(self, '/'); /* .../tests/test_tool_flags */
    if (slash == NULL) return -1;
    *slash = '\0';
    snprintf(bin_dir, sizeof bin_dir, "%s/../bin", self);
    return 0;
}

typedef struct {
    int status;      /* exit status, or -1 if killed */
    bool timed_out;
    double seconds;
    char out[4096];
    char err[4096];
} run_result;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void read_all(FILE *f, char *buf, size_t size) {
    rewind(f);
    size_t n = fread(buf, 1, size - 1, f);
    buf[n] = '\0';
    fclose(f);
}

/* Runs bin_dir/tool with args (NULL-terminated), stdin from /dev/null,
 * stdout and stderr captured; killed after TIME_LIMIT_S. */
static void run_tool(const char *tool, const char *const *args, run_result *r) {
    char path[sizeof bin_dir + 64];
    snprintf(path, sizeof path, "%s/%s", bin_dir, tool);
    if (access(path, X_OK) != 0) fail_msg("%s: not built (run make tools first)", path);
    char *argv[32];
    int argc = 0;
    argv[argc++] = path;
    for (int k = 0; args[k] != NULL && argc < 31; k++) argv[argc++] = (char *)(uintptr_t)args[k];
    argv[argc] = NULL;
    FILE *out = tmpfile(), *err = tmpfile();
    assert_non_null(out);
    assert_non_null(err);
    fflush(NULL);
    double t0 = now_s();
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        FILE *in = fopen("/dev/null", "r");
        if (in != NULL) dup2(fileno(in), 0);
        dup2(fileno(out), 1);
        dup2(fileno(err), 2);
        execv(path, argv);
        _exit(127);
    }
    int wstatus = 0;
    r->timed_out = false;
    for (;;) {
        pid_t w = waitpid(pid, &wstatus, WNOHANG);
        if (w == pid) break;
        if (w < 0 && errno != EINTR) fail_msg("waitpid: %s", strerror(errno));
        if (now_s() - t0 > TIME_LIMIT_S) {
            r->timed_out = true;
            kill(pid, SIGKILL);
            waitpid(pid, &wstatus, 0);
            break;
        }
        struct timespec nap = {0, 2000000}; /* 2 ms */
        nanosleep(&nap, NULL);
    }
    r->seconds = now_s() - t0;
    r->status = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : -1;
    read_all(out, r->out, sizeof r->out);
    read_all(err, r->err, sizeof r->err);
}

/* A bad command line: exit status 2, a message naming the flag (and the
 * value, when it is not empty), nothing on stdout, and fast. */
typedef struct {
    const char *args[8];
    const char *flag;  /* the message names it */
    const char *value; /* ... and this, when not NULL */
} bad_case;

static int check_bad(const char *tool, const bad_case *c) {
    run_result r;
    run_tool(tool, c->args, &r);
    bool ok = !r.timed_out && r.status == 2 && strstr(r.err, c->flag) != NULL &&
              (c->value == NULL || strstr(r.err, c->value) != NULL) && r.out[0] == '\0';
    if (!ok) {
        print_error("%s", tool);
        for (int k = 0; c->args[k] != NULL; k++) print_error(" '%s'", c->args[k]);
        print_error(": %s, exit %d after %.2f s\n  stderr: %s  stdout: %.200s\n",
                    r.timed_out ? "TIMED OUT (killed)" : "finished", r.status, r.seconds, r.err,
                    r.out);
    }
    return ok ? 0 : 1;
}

static void run_bad_cases(const char *tool, const bad_case *cases, size_t n) {
    int failed = 0;
    for (size_t i = 0; i < n; i++) failed += check_bad(tool, &cases[i]);
    if (failed) fail_msg("%s: %d of %zu bad command lines not refused as they should be", tool,
                         failed, n);
}

#define RUN_BAD(tool, cases) run_bad_cases(tool, cases, sizeof cases / sizeof *cases)

static void test_bench_sched(void **state) {
    (void)state;
    static const bad_case cases[] = {
        {{"sched", "--steps", "abc"}, "--steps", "'abc'"},
        {{"sched", "--steps", ""}, "--steps", "''"},
        {{"sched", "--steps", "-1"}, "--steps", "-1"},
        {{"sched", "--steps", "0"}, "--steps", "got 0"},
        {{"sched", "--steps", "10x"}, "--steps", "10x"},
        {{"sched", "--steps", "1e3"}, "--steps", "1e3"},
        {{"sched", "--steps", "99999999999999999999"}, "--steps", "99999999999999999999"},
        {{"sched", "--quick", "--steps"}, "--steps", "needs a value"},
        {{"sched", "--stepz", "5"}, "unknown option '--stepz'", NULL},
    };
    RUN_BAD("kvpage-bench", cases);
}

static void test_bench_attention(void **state) {
    (void)state;
    static const bad_case cases[] = {
        {{"attention", "--batch", "-1"}, "--batch", "-1"},
        {{"attention", "--batch", "3"}, "--batch", "3"},
        {{"attention", "--batch", "abc"}, "--batch", "'abc'"},
        {{"attention", "--batch", ""}, "--batch", "''"},
        {{"attention", "--page", "0"}, "--page", "got 0"},
        {{"attention", "--page", "-16"}, "--page", "-16"},
        {{"attention", "--page", "99999"}, "--page", "99999"},
        {{"attention", "--context", "0"}, "--context", "got 0"},
        {{"attention", "--context", "1000"}, "--context", "1000"},
        {{"attention", "--context", "8q"}, "--context", "8q"},
        {{"attention", "--threads", "0"}, "--threads", "got 0"},
        {{"attention", "--threads", "65"}, "--threads", "65"},
        {{"attention", "--threads", "two"}, "--threads", "two"},
        {{"attention", "--seconds", "0"}, "--seconds", "got 0"},
        {{"attention", "--seconds", "-1"}, "--seconds", "-1"},
        {{"attention", "--seconds", "nan"}, "--seconds", "nan"},
        {{"attention", "--seconds", "inf"}, "--seconds", "inf"},
        {{"attention", "--seconds", "1s"}, "--seconds", "1s"},
        {{"attention", "--acc-seqs", "0"}, "--acc-seqs", "got 0"},
        {{"attention", "--acc-seqs", "257"}, "--acc-seqs", "257"},
        {{"attention", "--layers", "-1"}, "--layers", "-1"},
        {{"attention", "--layers", "65"}, "--layers", "65"},
        {{"attention", "--format", "fp8"}, "--format", "'fp8'"},
        {{"attention", "--isa", "avx9"}, "--isa", "'avx9'"},
        {{"attention", "--device", "gpu"}, "--device", "'gpu'"},
        {{"attention", "--device"}, "--device", "needs a value"},
        {{"attention", "--quick", "--threads"}, "--threads", "needs a value"},
        {{"attention", "--accuracy-only", "--no-accuracy"}, "--accuracy-only", NULL},
        {{"attention", "--prefill", "--decode"}, "--prefill and --decode", NULL},
        {{"attention", "--chunk", "0"}, "--chunk", "got 0"},
        {{"attention", "--chunk", "abc"}, "--chunk", "'abc'"},
        {{"attention", "--chunk"}, "--chunk", "needs a value"},
        {{"attention", "--chunk", "9000", "--context", "8192"}, "--chunk", "9000"},
        {{"attention", "--decode", "--chunk", "128"}, "--chunk", "--decode"},
        {{"attention", "--bogus"}, "unknown option '--bogus'", NULL},
    };
    RUN_BAD("kvpage-bench", cases);
}

/* --device cuda parses its own flags (and needs no device to refuse them). */
static void test_bench_attention_cuda(void **state) {
    (void)state;
    static const bad_case cases[] = {
        {{"attention", "--device", "cuda", "--gpu", "-1"}, "--gpu", "-1"},
        {{"attention", "--device", "cuda", "--gpu", "x"}, "--gpu", "'x'"},
        {{"attention", "--device", "cuda", "--gpu", ""}, "--gpu", "''"},
        {{"attention", "--device", "cuda", "--batch", "0"}, "--batch", "got 0"},
        {{"attention", "--device", "cuda", "--page", "abc"}, "--page", "'abc'"},
        {{"attention", "--device", "cuda", "--context", "-8192"}, "--context", "-8192"},
        {{"attention", "--device", "cuda", "--format", "fp16-hnd"}, "--format", "'fp16-hnd'"},
        {{"attention", "--device", "cuda", "--threads", "2"}, "unknown option '--threads'", NULL},
    };
    RUN_BAD("kvpage-bench", cases);
}

static void test_bench_others(void **state) {
    (void)state;
    static const bad_case cases[] = {
        {{"pool", "--reps", "0"}, "--reps", "got 0"},
        {{"pool", "--reps", "65"}, "--reps", "65"},
        {{"pool", "--reps", "x"}, "--reps", "'x'"},
        {{"pool", "--reps", ""}, "--reps", "''"},
        {{"pool", "--reps"}, "--reps", "needs a value"},
        {{"utilization", "--requests", "0"}, "--requests", "got 0"},
        {{"utilization", "--requests", "-5"}, "--requests", "-5"},
        {{"utilization", "--requests", "1.5"}, "--requests", "1.5"},
        {{"utilization", "--budget", "100"}, "--budget", "100"},
        {{"utilization", "--budget", "abc"}, "--budget", "'abc'"},
        {{"utilization", "--budget", "99999999999999999999"}, "--budget", "99999999999999999999"},
        {{"roofline", "--threads", "0"}, "--threads", "got 0"},
        {{"roofline", "--mib", "15"}, "--mib", "15"},
        {{"roofline", "--mib", "1x"}, "--mib", "'1x'"},
        {{"roofline", "--reps", "-2"}, "--reps", "-2"},
        {{"stages", "--page", "3"}, "--page", "3"},
        {{"stages", "--page", "0"}, "--page", "got 0"},
        {{"stages", "--page", "66"}, "--page", "66"},
        {{"stages", "--page", "x"}, "--page", "'x'"},
        {{"stages", "--head-dim", "100"}, "--head-dim", "'100'"},
        {{"stages", "--iters", "0"}, "--iters", "got 0"},
        {{"stages", "--iters", "-1"}, "--iters", "-1"},
        {{"stages", "--format", "fp8"}, "--format", "'fp8'"},
        {{"stages", "--isa", "none"}, "--isa", "'none'"},
        {{"append", "--tokens", "16"}, "--tokens", "16"},
        {{"append", "--tokens", "x"}, "--tokens", "'x'"},
        {{"append", "--reps", "0"}, "--reps", "got 0"},
        {{"append", "--reps", "65"}, "--reps", "65"},
        {{"append", "--format", "int2"}, "--format", "'int2'"},
        {{"append", "--format"}, "--format", "needs a value"},
        {{"append", "--bogus"}, "unknown option '--bogus'", NULL},
        {{"nope"}, "unknown benchmark 'nope'", NULL},
    };
    RUN_BAD("kvpage-bench", cases);
    /* the harness itself: a good command line exits 0 */
    static const char *const help[] = {"sched", "--help", NULL};
    run_result r;
    run_tool("kvpage-bench", help, &r);
    assert_false(r.timed_out);
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "usage: kvpage-bench sched"));
}

static void test_sim(void **state) {
    (void)state;
    static const bad_case cases[] = {
        {{"--seed", "-1"}, "--seed", "-1"},
        {{"--seed", "abc"}, "--seed", "'abc'"},
        {{"--seed", ""}, "--seed", "''"},
        {{"--seed"}, "--seed", "needs a value"},
        {{"--page-size", "1"}, "--page-size", "got 1"},
        {{"--page-size", "9999"}, "--page-size", "9999"},
        {{"--max-batch", "0"}, "--max-batch", "got 0"},
        {{"--token-budget", "-1"}, "--token-budget", "-1"},
        {{"--prefill-chunk", "x"}, "--prefill-chunk", "'x'"},
        {{"--horizon", "-1"}, "--horizon", "-1"},
        {{"--hysteresis", "abc"}, "--hysteresis", "'abc'"},
        {{"--drop-below", "x"}, "--drop-below", "'x'"},
        {{"--drop-below", "99999999999"}, "--drop-below", "99999999999"},
        {{"--static-max-len", "0"}, "--static-max-len", "got 0"},
        {{"--scale", "0"}, "--scale", "got 0"},
        {{"--scale", "nan"}, "--scale", "'nan'"},
        {{"--load", "-1"}, "--load", "-1"},
        {{"--device-gbps", "0"}, "--device-gbps", "got 0"},
        {{"--host-gbps", "inf"}, "--host-gbps", "'inf'"},
        {{"--tflops", "x"}, "--tflops", "'x'"},
        {{"--step-overhead-ms", "-1"}, "--step-overhead-ms", "-1"},
        {{"--drain", "abc"}, "--drain", "'abc'"},
        {{"--strategies", ""}, "--strategies", "''"},
        {{"--strategies", ","}, "--strategies", "','"},
        {{"--strategies", "paged,"}, "--strategies", "'paged,'"},
        {{"--strategies", "fast"}, "--strategies", "'fast'"},
        {{"--bogus"}, "unknown option '--bogus'", NULL},
    };
    RUN_BAD("kvpage-sim", cases);
}

static void test_plan(void **state) {
    (void)state;
    static const bad_case cases[] = {
        {{"--layers", "-1", "--kv-heads", "8", "--head-dim", "128"}, "--layers", "-1"},
        {{"--layers", "abc", "--kv-heads", "8", "--head-dim", "128"}, "--layers", "'abc'"},
        {{"--layers", "", "--kv-heads", "8", "--head-dim", "128"}, "--layers", "''"},
        {{"--layers", "0", "--kv-heads", "8", "--head-dim", "128"}, "--layers", "got 0"},
        {{"--layers=abc", "--kv-heads", "8", "--head-dim", "128"}, "--layers", "'abc'"},
        {{"--preset", "llama-3.1-8b", "--kv-heads", "0"}, "--kv-heads", "got 0"},
        {{"--preset", "llama-3.1-8b", "--head-dim", "x"}, "--head-dim", "'x'"},
        {{"--preset", "llama-3.1-8b", "--q-heads", "-1"}, "--q-heads", "-1"},
        {{"--preset", "llama-3.1-8b", "--page-size", "0"}, "--page-size", "got 0"},
        {{"--preset", "llama-3.1-8b", "--context", "-1"}, "--context", "-1"},
        {{"--preset", "llama-3.1-8b", "--context", "1q"}, "--context", "'1q'"},
        {{"--preset", "llama-3.1-8b", "--gpu", "h100-80g", "--utilization", "0"}, "--utilization",
         "got 0"},
        {{"--preset", "llama-3.1-8b", "--gpu", "h100-80g", "--utilization", "2"}, "--utilization",
         "got 2"},
        {{"--preset", "llama-3.1-8b", "--gpu", "h100-80g", "--utilization", "nan"}, "--utilization",
         "'nan'"},
        {{"--preset", "llama-3.1-8b", "--gpu", "cuda:x"}, "--gpu", "'x'"},
        {{"--preset", "llama-3.1-8b", "--vram", "lots"}, "--vram", "lots"},
        {{"--bogus"}, "unknown option '--bogus'", NULL},
        {{"--bogus", "1"}, "unknown option '--bogus'", NULL},
        {{"--bogus=1"}, "unknown option '--bogus'", NULL},
        {{"--layers"}, "--layers", "needs a value"},
    };
    RUN_BAD("kvpage-plan", cases);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_integers),
        cmocka_unit_test(test_parse_reals),
        cmocka_unit_test(test_options_in_argv),
        cmocka_unit_test(test_bench_sched),
        cmocka_unit_test(test_bench_attention),
        cmocka_unit_test(test_bench_attention_cuda),
        cmocka_unit_test(test_bench_others),
        cmocka_unit_test(test_sim),
        cmocka_unit_test(test_plan),
    };
    return cmocka_run_group_tests_name("tool_flags", tests, find_tools, NULL);
}
