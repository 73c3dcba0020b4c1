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
    double int8_macs_per_s; /* u8 x s8 multiply-adds per second through AVX-512 VNNI
                               (vpdpbusd: 64 per instruction); 0 without VNNI */
    const char *isa;       /* vector ISA the probes used */
} bench_roofs;

/* Measure both roofs with `threads` threads over a `bytes` buffer
 * (0 = 512 MiB). `reps` repetitions, median reported. Returns 0 or -1. */
int bench_measure_roofs(int threads, size_t bytes, int reps, bench_roofs *out);
/* One streaming read of buf[0 .. n) floats (64-byte aligned, n far larger
 * than the caches), split over `threads` threads: GB/s, or -1. */
double bench_read_once(int threads, const float *buf, size_t n);

int bench_roofline(int argc, char **argv);
int bench_sched(int argc, char **argv);
/* Page pool and table against a naive baseline (bench/pool.c). */
int bench_pool(int argc, char **argv);
/* Memory utilization: static reservation vs. paging (bench/utilization.c). */
int bench_utilization(int argc, char **argv);
int bench_attention(int argc, char **argv);
/* The CPU attention kernels' stages on in-cache pages (bench/stages.c). */
int bench_stages(int argc, char **argv);
/* Page blobs: export, import, validation and the file tier (bench/tiers.c). */
int bench_tiers(int argc, char **argv);
/* kvpage-bench attention --device cuda (bench/attention_cuda.c). */
int bench_attention_cuda(int argc, char **argv);

#endif
