/*
 * kvpage-bench: shared declarations. Each subcommand is a function
 * `int bench_<name>(int argc, char **argv)` returning the exit status; it
 * prints a readable table and, as its last line, one JSON object.
 */
#ifndef KVPAGE_BENCH_H
#define KVPAGE_BENCH_H

#include <stddef.h>
#include <stdint.h>

/* Monotonic time in seconds. */
double bench_now(void);
/* Median of n values (sorts a copy; n <= 64). */
double bench_median(const double *v, int n);

/* Roofs measured in the same process as a benchmark, so figures can be read
 * as fractions of what this machine does right now. */
typedef struct {
    int threads;
    double read_gbps;      /* streaming read over a buffer far larger than the caches */
    double fma_per_s;      /* fp32 fused multiply-adds per second (not flops) */
    double int8_macs_per_s; /* int8 multiply-adds per second through AVX-512 VNNI
                               (vpdpbusd: 64 per instruction) or the ARM dot product
                               (sdot: 16); 0 without either */
    const char *int8_insn;  /* that instruction ("vpdpbusd", "sdot"), NULL without */
    int int8_per_insn;      /* its multiply-adds per instruction */
    const char *isa;       /* vector ISA the probes used */
} bench_roofs;

/* Measure both roofs with `threads` threads over a `bytes` buffer
 * (0 = 512 MiB). `reps` repetitions, median reported. Returns 0 or -1. */
int bench_measure_roofs(int threads, size_t bytes, int reps, bench_roofs *out);
/* One streaming read of buf[0 .. n) floats (64-byte aligned, n far larger
 * than the caches), split over `threads` threads: GB/s, or -1. */
double bench_read_once(int threads, const float *buf, size_t n);

/* One run of the FMA probe on `threads` threads, sized to last about
 * `seconds`: fp32 FMAs per second, or -1. */
double bench_fma_once(int threads, double seconds);

int bench_roofline(int argc, char **argv);
int bench_sched(int argc, char **argv);
/* Page pool and table against a naive baseline (bench/pool.c). */
int bench_pool(int argc, char **argv);
/* Memory utilization: static reservation vs. paging (bench/utilization.c). */
int bench_utilization(int argc, char **argv);
int bench_attention(int argc, char **argv);
/* K/V rows written into pages per format, vs fp32 (bench/append.c). */
int bench_append(int argc, char **argv);
/* The CPU attention kernels' stages on in-cache pages (bench/stages.c). */
int bench_stages(int argc, char **argv);
/* Page blobs: export, import, validation, the file tier and, with --remote,
 * the Redis tier against redis-benchmark (bench/tiers.c). */
int bench_tiers(int argc, char **argv);
/* The Redis programs kvpage-bench tiers --remote runs (bench/redisproc.c). */
typedef struct {
    int pid;       /* the server's process; 0 when none */
    int port;      /* its loopback port */
    char dir[64];  /* its working directory, removed when it stops */
    char log[96];  /* its log, in dir */
    char uri[64];  /* redis://127.0.0.1:port */
} bench_redis_server;
/* The first of `names` found as an executable on PATH: its index, its full
 * path in `path`; -1 when none is. */
int bench_find_program(const char *const *names, int n, char *path, size_t size);
/* Start `exe` (redis-server or valkey-server) on a free 127.0.0.1 port, no
 * persistence (--save "" --appendonly no), and wait (10 s at most) until it
 * answers PING. Returns 0, or -1 with the reason (its log's tail) in err. */
int bench_redis_start(const char *exe, bench_redis_server *s, char *err, size_t err_size);
/* Stop it (SIGTERM, then SIGKILL after 5 s) and remove its directory. */
void bench_redis_stop(bench_redis_server *s);
/* A server as redis-benchmark and redis-cli take it (their -u does not
 * percent-decode a password, so the bench passes -h -p --user -a --dbnum). */
typedef struct {
    char host[256];
    int port, db;
    char user[256], pass[256]; /* decoded; "" when none */
} bench_redis_addr;
/* The first of the URIs ("redis://[user:password@]host[:port][/db]", commas
 * or spaces between several). Returns 0, or -1 when it is not one. */
int bench_redis_parse_uri(const char *uris, bench_redis_addr *a);
/* redis-benchmark on `a` [--cluster] -t set,get -d value_bytes -n requests
 * -P pipeline -c 1 --csv, killed past timeout_s: SET and GET requests per
 * second. Returns 0, or -1 with its words in err. */
int bench_redis_benchmark(const char *exe, const bench_redis_addr *a, int cluster,
                          uint64_t value_bytes, int requests, int pipeline, double timeout_s,
                          double *set_rps, double *get_rps, char *err, size_t err_size);
/* redis-cli on `a` [-c] DEL key, quietly, killed past 10 s; its exit status or -1. */
int bench_redis_del(const char *cli, const bench_redis_addr *a, int cluster, const char *key);
/* kvpage-bench attention --device cuda (bench/attention_cuda.c). */
int bench_attention_cuda(int argc, char **argv);

#endif
