/*
 * libFuzzer harness: the command lines of kvpage-plan and kvpage-sim, run
 * in-process (kvp_tool_plan, kvp_tool_sim) with their output going to
 * /dev/null.
 *
 *   make fuzz FUZZ_TARGETS=cli FUZZ_SECONDS=60
 *
 * The first byte picks the tool. The rest is split on 0x00 into at most 12
 * arguments; an argument that starts with 0x01 is a word of the tool's
 * vocabulary instead (its option names from --help, and values that mean
 * something to them: presets, formats, sizes, edge numbers), chosen by the
 * next byte, so the fuzzer reaches past the option parser.
 *
 * kvpage-sim runs a simulation, so each run is bounded here the way a user
 * bounds it: the harness reads the command line as the tool does and, if
 * the tool would run, caps --scale (and --load) so a preset holds a few
 * dozen requests, --drain at 1 s and raises --step-overhead-ms to 5 ms (so
 * a strategy takes at most a few thousand steps), and caps --kv-budget and
 * --host at 4 GiB. Files: --plot and --save-trace write to /dev/null or to
 * a directory that does not exist; --trace reads a file the harness writes
 * from the input (lines of CSV or JSONL built from fuzzed fields; numbers
 * in raw lines are cut to one digit, so a trace spans seconds), or a file
 * that does not exist. Nothing else on disk is touched.
 *
 * Oracle: the exit status is 0, 1 or 2, and no crash, leak or undefined
 * behaviour (ASan, UBSan). tests/test_fuzz_cli.c replays the corpus and
 * random inputs in `make test`.
 */
#define _POSIX_C_SOURCE 200809L
#include "kvpage.h"
#include "kvpage_plan.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz_input.h"

int kvp_tool_plan(int argc, char **argv, FILE *out, FILE *errf);
int kvp_tool_sim(int argc, char **argv, FILE *out, FILE *err);

#define FC_MAX_ARGS 12
#define FC_ARG_LEN 64
#define FC_EXTRA 10 /* arguments the harness may append */

static const char *const fc_plan_words[] = {
    "--preset", "--layers", "--kv-heads", "--head-dim", "--q-heads", "--gpu", "--vram",
    "--weights", "--weight-dtype", "--reserve", "--utilization", "--kv-budget", "--format",
    "--k-format", "--v-format", "--page-size", "--context", "--json", "--list-presets",
    "--list-gpus", "--version", "--help", "-h", "--context=32k", "--page-size=16",
    "--preset=llama-3.1-8b", "--gpu=h100-80g", "--json=1", "llama-3.1-8b", "qwen2.5-0.5b",
    "llama-3.1-70b", "smollm2-135m", "h100-80g", "jetson-orin-8g", "cuda", "cuda:0", "cuda:x",
    "80GiB", "24GB", "1.5T", "16EiB", "1", "0", "-1", "8", "16", "32", "64", "128", "4096",
    "32k", "9223372036854775807", "9223372036854775808", "2147483647", "2147483648",
    "18446744073709551615", "0.9", "1", "1e-9", "0.5", "nan", "inf", "fp16", "fp8", "int8",
    "int4", "fp32", "bf16", "fp8_e4m3", "int4=", "bf16", "fp4", "", "-", "--", "="};

static const char *const fc_sim_words[] = {
    "--help", "-h", "--json", "--check", "--preset", "--trace", "--seed", "--scale", "--load",
    "--save-trace", "--model", "--gpu", "--kv-budget", "--weight-dtype", "--host", "--page-size",
    "--device-gbps", "--host-gbps", "--tflops", "--step-overhead-ms", "--max-batch",
    "--token-budget", "--prefill-chunk", "--horizon", "--hysteresis", "--full-format",
    "--drop-below", "--static-max-len", "--drain", "--strategies", "--plot", "long-context",
    "burst", "mixed", "static", "paged", "paged-int8", "paged-int4", "full", "static,full",
    "paged,,full", "full,paged-int4", "llama-3.1-8b", "qwen2.5-0.5b", "smollm2-135m",
    "llama-3.2-1b", "h100-80g", "l4-24g", "jetson-orin-8g", "bf16", "int4", "fp8", "int8/int4",
    "fp16/fp8", "int4/", "/int8", "512MiB", "2GiB", "1", "0", "-1", "2", "3", "16", "64", "1k",
    "2k", "0.001", "0.005", "1000", "1e3", "2147483647", "-2147483648", "9223372036854775807",
    "0.5", "nan", "", "/tmp/x.svg"};

/* The trace file the harness writes (per process), and paths that fail. */
static char fc_trace_path[64];
static char fc_missing[] = "/nonexistent-kvpage-fuzz/x";
static char fc_devnull[] = "/dev/null";
static char fc_4gib[] = "4GiB", fc_scale[] = "0.01", fc_one[] = "1", fc_five[] = "5";

static FILE *fc_null(void) {
    static FILE *f;
    if (f == NULL) f = fopen("/dev/null", "w");
    return f;
}

/* ---- the trace file ------------------------------------------------------ */

static const char *fc_field(fzi_cursor *c, int which) {
    static const char *const arrivals[] = {"0", "0.5", "1", "2.25", "-1", "1e308", "inf",
                                           "nan", "1e10", "x", ""};
    static const char *const counts[] = {"1", "4", "16", "100", "2048", "0", "-3", "1.5",
                                         "1000000000", "1000000001", "inf", "nan", "0x10", "a"};
    static const char *const prios[] = {"0", "1", "2", "-1", "2147483647", "-2147483648",
                                        "2147483648", "0.5"};
    uint8_t k = fzi_u8(c);
    if (which == 0) return arrivals[k % (sizeof arrivals / sizeof *arrivals)];
    if (which == 3) return prios[k % (sizeof prios / sizeof *prios)];
    return counts[k % (sizeof counts / sizeof *counts)];
}

static void fc_write_trace(fzi_cursor *c) {
    if (fc_trace_path[0] == '\0')
        snprintf(fc_trace_path, sizeof fc_trace_path, "/tmp/kvpage-fuzz-cli-%ld.trace",
                 (long)getpid());
    FILE *f = fopen(fc_trace_path, "w");
    if (f == NULL) return;
    static const char *const keys[] = {"arrival", "prompt_tokens", "output_tokens", "priority",
                                       "max_new_tokens", "arrival_s", "other"};
    int lines = 1 + (int)fzi_below(c, 6);
    for (int l = 0; l < lines; l++) {
        uint8_t kind = fzi_u8(c) % 4;
        if (kind == 0) { /* CSV */
            int fields = 3 + (int)fzi_below(c, 4);
            for (int k = 0; k < fields; k++)
                fprintf(f, "%s%s", k ? "," : "", fc_field(c, k < 5 ? k : 1));
        } else if (kind == 1) { /* JSONL */
            int fields = 2 + (int)fzi_below(c, 5);
            fputc('{', f);
            for (int k = 0; k < fields; k++) {
                int key = (int)fzi_below(c, 7);
                int which = key == 5 ? 0 : key == 6 ? 1 : key;
                if (key == 6 && (fzi_u8(c) & 1)) fprintf(f, "%s\"other\": \"s\\\"x\"", k ? ", " : "");
                else fprintf(f, "%s\"%s\": %s", k ? ", " : "", keys[key], fc_field(c, which));
            }
            fputs(fzi_u8(c) < 240 ? "}" : "", f);
        } else if (kind == 2) { /* a header or a comment */
            fputs(fzi_u8(c) & 1 ? "arrival_s,prompt_tokens,output_tokens,priority" : "# note", f);
        } else { /* raw bytes; numbers cut to one digit, no exponents or hex */
            size_t n = fzi_below(c, 48);
            bool digit = false;
            for (size_t i = 0; i < n; i++) {
                char ch = (char)fzi_u8(c);
                if (ch == '\n' || ch == '\0') ch = ' ';
                bool d = ch >= '0' && ch <= '9';
                if (d && digit) continue;
                if (digit && (ch == 'e' || ch == 'E' || ch == 'x' || ch == 'X' || ch == 'p' ||
                              ch == 'P' || ch == '.'))
                    continue;
                if (ch == 'i' || ch == 'I' || ch == 'n' || ch == 'N') ch = '_'; /* inf, nan */
                digit = d;
                fputc(ch, f);
            }
        }
        fputc('\n', f);
    }
    fclose(f);
}

/* ---- kvpage-sim's command line, read as the tool reads it ------------------ */

static bool fc_sim_takes_value(const char *a) {
    static const char *const v[] = {
        "--preset", "--trace", "--save-trace", "--model", "--gpu", "--kv-budget", "--host",
        "--weight-dtype", "--strategies", "--full-format", "--plot", "--seed", "--page-size",
        "--max-batch", "--token-budget", "--prefill-chunk", "--horizon", "--hysteresis",
        "--drop-below", "--static-max-len", "--scale", "--load", "--device-gbps", "--host-gbps",
        "--tflops", "--step-overhead-ms", "--drain"};
    for (size_t i = 0; i < sizeof v / sizeof *v; i++)
        if (!strcmp(a, v[i])) return true;
    return false;
}

/* A number as strtod reads it, or `dflt` when it is not one. */
static double fc_num(const char *s, double dflt) {
    char *end;
    double v = strtod(s, &end);
    return (end != s && *end == '\0' && v == v) ? v : dflt;
}

/* Bound a simulation: returns the new argc (arguments may be appended). */
static int fc_bound_sim(int argc, char **argv, char extra[FC_EXTRA][FC_ARG_LEN]) {
    int last[5] = {-1, -1, -1, -1, -1}; /* value index: scale, load, drain, overhead, budget */
    bool runs = true;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) runs = false;
        if (!strcmp(a, "--help") || !strcmp(a, "-h") || !strcmp(a, "--json") ||
            !strcmp(a, "--check"))
            continue;
        if (!fc_sim_takes_value(a)) {
            runs = false; /* an unknown option: the tool stops here */
            break;
        }
        if (i + 1 >= argc) {
            runs = false;
            break;
        }
        i++;
        /* files: never a path of the fuzzer's choosing */
        if (!strcmp(a, "--plot") || !strcmp(a, "--save-trace"))
            argv[i] = (argv[i][0] & 1) ? fc_devnull : fc_missing;
        else if (!strcmp(a, "--trace"))
            argv[i] = (argv[i][0] & 1) ? fc_trace_path : fc_missing;
        else if (!strcmp(a, "--scale")) last[0] = i;
        else if (!strcmp(a, "--load")) last[1] = i;
        else if (!strcmp(a, "--drain")) last[2] = i;
        else if (!strcmp(a, "--step-overhead-ms")) last[3] = i;
        else if (!strcmp(a, "--kv-budget") || !strcmp(a, "--host")) {
            uint64_t b;
            if (kvp_parse_size(argv[i], &b, NULL, 0) == KVP_OK && b > (4ull << 30))
                argv[i] = fc_4gib;
        }
    }
    if (!runs) return argc;
    double scale = last[0] >= 0 ? fc_num(argv[last[0]], 0) : 1;
    double load = last[1] >= 0 ? fc_num(argv[last[1]], 0) : 1;
    double drain = last[2] >= 0 ? fc_num(argv[last[2]], 0) : 600;
    double overhead = last[3] >= 0 ? fc_num(argv[last[3]], 5) : 0.5;
    int n = 0;
    /* a preset of 300 s x scale at a few requests per second x load */
    if (scale > 0.01 || scale * (load > 1 ? load : 1) > 0.01) {
        if (last[0] >= 0) argv[last[0]] = fc_scale;
        else snprintf(extra[n++], FC_ARG_LEN, "--scale"), snprintf(extra[n++], FC_ARG_LEN, "0.01");
        if (load > 1) {
            if (last[1] >= 0) argv[last[1]] = fc_one;
            else snprintf(extra[n++], FC_ARG_LEN, "--load"), snprintf(extra[n++], FC_ARG_LEN, "1");
        }
    }
    if (drain > 1) {
        if (last[2] >= 0) argv[last[2]] = fc_one;
        else snprintf(extra[n++], FC_ARG_LEN, "--drain"), snprintf(extra[n++], FC_ARG_LEN, "1");
    }
    if (overhead < 5) {
        if (last[3] >= 0) argv[last[3]] = fc_five;
        else snprintf(extra[n++], FC_ARG_LEN, "--step-overhead-ms"),
             snprintf(extra[n++], FC_ARG_LEN, "5");
    }
    for (int k = 0; k < n; k++) argv[argc++] = extra[k];
    return argc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fzi_cursor c = fzi_make(data, size);
    bool sim = fzi_u8(&c) & 1;
    const char *const *words = sim ? fc_sim_words : fc_plan_words;
    size_t nwords = sim ? sizeof fc_sim_words / sizeof *fc_sim_words
                        : sizeof fc_plan_words / sizeof *fc_plan_words;
    if (sim) fc_write_trace(&c);

    static char args[FC_MAX_ARGS][FC_ARG_LEN];
    static char extra[FC_EXTRA][FC_ARG_LEN];
    char *argv[1 + FC_MAX_ARGS + FC_EXTRA + 1];
    int argc = 0;
    static char name_sim[] = "kvpage-sim", name_plan[] = "kvpage-plan";
    argv[argc++] = sim ? name_sim : name_plan;
    while (c.n > 0 && argc <= FC_MAX_ARGS) {
        char *a = args[argc - 1];
        size_t len = 0;
        if (c.p[0] == 0x01) { /* a word */
            fzi_u8(&c);
            snprintf(a, FC_ARG_LEN, "%s", words[fzi_u8(&c) % nwords]);
            if (c.n > 0 && c.p[0] == 0x00) fzi_u8(&c);
        } else {
            while (c.n > 0 && c.p[0] != 0x00 && len < FC_ARG_LEN - 1) a[len++] = (char)fzi_u8(&c);
            a[len] = '\0';
            if (c.n > 0 && c.p[0] == 0x00) fzi_u8(&c);
        }
        argv[argc++] = a;
    }
    if (sim) argc = fc_bound_sim(argc, argv, extra);
    argv[argc] = NULL;
    FILE *null = fc_null();
    FZI_ASSERT(null != NULL);
    int rc = sim ? kvp_tool_sim(argc, argv, null, null) : kvp_tool_plan(argc, argv, null, null);
    FZI_ASSERT(rc == 0 || rc == 1 || rc == 2);
    return 0;
}
