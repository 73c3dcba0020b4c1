/*
 * kvpage-bench: benchmark programs (never timed assertions in tests).
 * Each subcommand prints a readable table and, last, one JSON object. A bad
 * option or value is a message and exit status 2, before anything runs
 * (every numeric option goes through tools/cli.c's strict parsers).
 */
#include "../bench/bench.h"

#include <stdio.h>
#include <string.h>

static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *what;
} benches[] = {
    {"roofline", bench_roofline, "streaming read bandwidth and fp32 FMA rate of this machine"},
    {"sched", bench_sched, "kvp_sched_step cost, 1,000 running + 1,000 waiting under pressure"},
    {"pool", bench_pool, "page pool and table vs. a naive baseline: alloc, decode, export, prefix"},
    {"utilization", bench_utilization, "KV memory utilization: static reservation vs. pages of 8/16/32"},
    {"attention", bench_attention, "paged decode attention per format vs the read roof and a contiguous cache "
                                   "(--device cuda: on the GPU, vs a device copy)"},
    {"tiers", bench_tiers, "page blobs: bytes per token, export/import GB/s vs the read roof, file tier "
                           "(--remote: the Redis tier vs redis-benchmark)"},
    {"append", bench_append, "K/V rows written into pages per format (prefill and decode calls) vs fp32"},
    {"stages", bench_stages, "the CPU attention kernels' stages, one at a time, on in-cache pages (ns per page and head)"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: kvpage-bench BENCH [options]   (kvpage-bench BENCH --help: its options)\n\n"
               "benchmarks:\n");
    for (size_t i = 0; i < sizeof benches / sizeof benches[0]; i++)
        fprintf(f, "  %-12s %s\n", benches[i].name, benches[i].what);
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < sizeof benches / sizeof benches[0]; i++)
        if (!strcmp(argv[1], benches[i].name)) return benches[i].run(argc, argv);
    fprintf(stderr, "kvpage-bench: unknown benchmark '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
