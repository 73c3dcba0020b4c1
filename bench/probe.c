/*
 * Roof probes: streaming read bandwidth and fp32 FMA rate, measured with the
 * same thread count as the benchmark that reports against them. The read
 * buffer asks for transparent huge pages, as the page arena does: on the
 * dev VM one read of 256 MiB over 4 KiB pages measured 3 - 20% slower
 * (2 threads, 8 runs alternating with the huge-page buffer: 22.7 - 29.1
 * against 27.2 - 31.4 GB/s).
 */
#define _DEFAULT_SOURCE /* madvise(MADV_HUGEPAGE) */
#define _POSIX_C_SOURCE 200809L
#include "bench.h"
#include "cli.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define BENCH_X86 1
#elif defined(__aarch64__)
#include <arm_neon.h>
#include <sys/auxv.h>
#define BENCH_NEON 1
#endif

double bench_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double bench_median(const double *v, int n) {
    double tmp[64];
    if (n <= 0) return 0;
    if (n > 64) n = 64;
    memcpy(tmp, v, (size_t)n * sizeof *v);
    qsort(tmp, (size_t)n, sizeof *tmp, cmp_double);
    return n % 2 ? tmp[n / 2] : 0.5 * (tmp[n / 2 - 1] + tmp[n / 2]);
}

/* ---- kernels ----------------------------------------------------------- */

typedef float (*read_fn)(const float *p, size_t n);
typedef float (*fma_fn)(long iters, float seed);

static float read_portable(const float *p, size_t n) {
    float a[8] = {0};
    for (size_t i = 0; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) a[k] += p[i + k];
    return a[0] + a[1] + a[2] + a[3] + a[4] + a[5] + a[6] + a[7];
}

static float fma_portable(long iters, float seed) {
    float acc[12];
    for (int k = 0; k < 12; k++) acc[k] = seed + (float)k;
    for (long i = 0; i < iters; i++)
        for (int k = 0; k < 12; k++) acc[k] = acc[k] * 0.999999f + 1e-7f;
    float s = 0;
    for (int k = 0; k < 12; k++) s += acc[k];
    return s;
}

#ifdef BENCH_X86
__attribute__((target("avx2,fma"))) static float read_avx2(const float *p, size_t n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i + 32 <= n; i += 32) {
        a0 = _mm256_add_ps(a0, _mm256_load_ps(p + i));
        a1 = _mm256_add_ps(a1, _mm256_load_ps(p + i + 8));
        a2 = _mm256_add_ps(a2, _mm256_load_ps(p + i + 16));
        a3 = _mm256_add_ps(a3, _mm256_load_ps(p + i + 24));
    }
    __m256 s = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
    float out[8];
    _mm256_storeu_ps(out, s);
    return out[0] + out[1] + out[2] + out[3] + out[4] + out[5] + out[6] + out[7];
}

/* Twelve independent accumulators, named so they stay in registers. */
#define FMA12(op, m, c)                                                       \
    a0 = op(a0, m, c); a1 = op(a1, m, c); a2 = op(a2, m, c);                  \
    a3 = op(a3, m, c); a4 = op(a4, m, c); a5 = op(a5, m, c);                  \
    a6 = op(a6, m, c); a7 = op(a7, m, c); a8 = op(a8, m, c);                  \
    a9 = op(a9, m, c); a10 = op(a10, m, c); a11 = op(a11, m, c)

__attribute__((target("avx2,fma"))) static float fma_avx2(long iters, float seed) {
    const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
    __m256 a0 = _mm256_set1_ps(seed), a1 = _mm256_add_ps(a0, c), a2 = _mm256_add_ps(a1, c),
           a3 = _mm256_add_ps(a2, c), a4 = _mm256_add_ps(a3, c), a5 = _mm256_add_ps(a4, c),
           a6 = _mm256_add_ps(a5, c), a7 = _mm256_add_ps(a6, c), a8 = _mm256_add_ps(a7, c),
           a9 = _mm256_add_ps(a8, c), a10 = _mm256_add_ps(a9, c), a11 = _mm256_add_ps(a10, c);
    for (long i = 0; i < iters; i++) {
        FMA12(_mm256_fmadd_ps, m, c);
    }
    __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                             _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)));
    s = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(a8, a9), _mm256_add_ps(a10, a11)));
    float out[8];
    _mm256_storeu_ps(out, s);
    return out[0] + out[7];
}

__attribute__((target("avx512f"))) static float read_avx512(const float *p, size_t n) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i + 64 <= n; i += 64) {
        a0 = _mm512_add_ps(a0, _mm512_load_ps(p + i));
        a1 = _mm512_add_ps(a1, _mm512_load_ps(p + i + 16));
        a2 = _mm512_add_ps(a2, _mm512_load_ps(p + i + 32));
        a3 = _mm512_add_ps(a3, _mm512_load_ps(p + i + 48));
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

__attribute__((target("avx512f"))) static float fma_avx512(long iters, float seed) {
    const __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
    __m512 a0 = _mm512_set1_ps(seed), a1 = _mm512_add_ps(a0, c), a2 = _mm512_add_ps(a1, c),
           a3 = _mm512_add_ps(a2, c), a4 = _mm512_add_ps(a3, c), a5 = _mm512_add_ps(a4, c),
           a6 = _mm512_add_ps(a5, c), a7 = _mm512_add_ps(a6, c), a8 = _mm512_add_ps(a7, c),
           a9 = _mm512_add_ps(a8, c), a10 = _mm512_add_ps(a9, c), a11 = _mm512_add_ps(a10, c);
    for (long i = 0; i < iters; i++) {
        FMA12(_mm512_fmadd_ps, m, c);
    }
    __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                             _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)));
    s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11)));
    return _mm512_reduce_add_ps(s);
}

/* vpdpbusd with twelve independent accumulators. GCC copies the accumulator
 * around the intrinsic (lib/cpu/kern_avx512.c), so the instruction is asm. */
#define DPB(acc) __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(x), "v"(y))
__attribute__((target("avx512f,avx512vnni"))) static int dpbusd_avx512(long iters, int seed) {
    const __m512i x = _mm512_set1_epi8(3), y = _mm512_set1_epi8((char)(seed | 1));
    __m512i a0 = _mm512_set1_epi32(seed), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0,
            a7 = a0, a8 = a0, a9 = a0, a10 = a0, a11 = a0;
    for (long i = 0; i < iters; i++) {
        DPB(a0); DPB(a1); DPB(a2); DPB(a3); DPB(a4); DPB(a5);
        DPB(a6); DPB(a7); DPB(a8); DPB(a9); DPB(a10); DPB(a11);
    }
    __m512i s = _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(a0, a1), _mm512_add_epi32(a2, a3)),
                                 _mm512_add_epi32(_mm512_add_epi32(a4, a5), _mm512_add_epi32(a6, a7)));
    s = _mm512_add_epi32(s, _mm512_add_epi32(_mm512_add_epi32(a8, a9), _mm512_add_epi32(a10, a11)));
    /* summed as unsigned: the lanes wrap, and _mm512_reduce_add_epi32's
     * signed adds are undefined behaviour on overflow (UBSan flags them) */
    uint32_t lanes[16], sum = 0;
    _mm512_storeu_si512((void *)lanes, s);
    for (int i = 0; i < 16; i++) sum += lanes[i];
    return (int)(sum & 0x7fffffff);
}
#undef DPB
#endif

#ifdef BENCH_NEON
/* ARMv8-A: Advanced SIMD is part of the base architecture (4 fp32 lanes). */
static float read_neon(const float *p, size_t n) {
    float32x4_t a0 = vdupq_n_f32(0.0f), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i + 16 <= n; i += 16) {
        a0 = vaddq_f32(a0, vld1q_f32(p + i));
        a1 = vaddq_f32(a1, vld1q_f32(p + i + 4));
        a2 = vaddq_f32(a2, vld1q_f32(p + i + 8));
        a3 = vaddq_f32(a3, vld1q_f32(p + i + 12));
    }
    return vaddvq_f32(vaddq_f32(vaddq_f32(a0, a1), vaddq_f32(a2, a3)));
}

static inline float32x4_t fma_neon_op(float32x4_t m, float32x4_t acc, float32x4_t c) {
    return vfmaq_f32(c, acc, m); /* c + acc * m */
}

static float fma_neon(long iters, float seed) {
    const float32x4_t m = vdupq_n_f32(0.999999f), c = vdupq_n_f32(1e-7f);
    float32x4_t a0 = vdupq_n_f32(seed), a1 = vaddq_f32(a0, c), a2 = vaddq_f32(a1, c),
                a3 = vaddq_f32(a2, c), a4 = vaddq_f32(a3, c), a5 = vaddq_f32(a4, c),
                a6 = vaddq_f32(a5, c), a7 = vaddq_f32(a6, c), a8 = vaddq_f32(a7, c),
                a9 = vaddq_f32(a8, c), a10 = vaddq_f32(a9, c), a11 = vaddq_f32(a10, c);
    for (long i = 0; i < iters; i++) {
        a0 = fma_neon_op(m, a0, c), a1 = fma_neon_op(m, a1, c), a2 = fma_neon_op(m, a2, c);
        a3 = fma_neon_op(m, a3, c), a4 = fma_neon_op(m, a4, c), a5 = fma_neon_op(m, a5, c);
        a6 = fma_neon_op(m, a6, c), a7 = fma_neon_op(m, a7, c), a8 = fma_neon_op(m, a8, c);
        a9 = fma_neon_op(m, a9, c), a10 = fma_neon_op(m, a10, c), a11 = fma_neon_op(m, a11, c);
    }
    float32x4_t s = vaddq_f32(vaddq_f32(vaddq_f32(a0, a1), vaddq_f32(a2, a3)),
                              vaddq_f32(vaddq_f32(a4, a5), vaddq_f32(a6, a7)));
    s = vaddq_f32(s, vaddq_f32(vaddq_f32(a8, a9), vaddq_f32(a10, a11)));
    return vaddvq_f32(s);
}

#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif
/* sdot (ARMv8.2 dot product: 16 int8 products per instruction into 4
 * int32 lanes) with twelve independent accumulators; the function alone is
 * built for the extension, run only where HWCAP says the CPU has it. */
#define SDOT(acc) ((acc) = vdotq_s32((acc), x, y))
__attribute__((target("arch=armv8.2-a+dotprod"))) static int sdot_neon(long iters, int seed) {
    const int8x16_t x = vdupq_n_s8(3), y = vdupq_n_s8((int8_t)(seed | 1));
    int32x4_t a0 = vdupq_n_s32(seed), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0,
              a7 = a0, a8 = a0, a9 = a0, a10 = a0, a11 = a0;
    for (long i = 0; i < iters; i++) {
        SDOT(a0); SDOT(a1); SDOT(a2); SDOT(a3); SDOT(a4); SDOT(a5);
        SDOT(a6); SDOT(a7); SDOT(a8); SDOT(a9); SDOT(a10); SDOT(a11);
    }
    uint32x4_t s = vreinterpretq_u32_s32(a0);
    int32x4_t rest[11] = {a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11};
    for (int k = 0; k < 11; k++) s = vaddq_u32(s, vreinterpretq_u32_s32(rest[k])); /* wraps */
    return (int)(vaddvq_u32(s) & 0x7fffffff);
}
#undef SDOT
#endif

static const char *pick(read_fn *r, fma_fn *f, int *lanes) {
#ifdef BENCH_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) {
        *r = read_avx512;
        *f = fma_avx512;
        *lanes = 16;
        return "avx512";
    }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        *r = read_avx2;
        *f = fma_avx2;
        *lanes = 8;
        return "avx2";
    }
#endif
#ifdef BENCH_NEON
    *r = read_neon;
    *f = fma_neon;
    *lanes = 4;
    return "neon";
#endif
    *r = read_portable;
    *f = fma_portable;
    *lanes = 1;
    return "portable";
}

/* ---- threads ----------------------------------------------------------- */

typedef struct {
    pthread_barrier_t *start;
    read_fn read;
    fma_fn fma;
    const float *p;
    size_t n;
    long iters;
    volatile float sink;
    double t0, t1; /* when this worker started and finished */
} worker;

static void *read_worker(void *arg) {
    worker *w = arg;
    pthread_barrier_wait(w->start);
    w->t0 = bench_now();
    w->sink = w->read(w->p, w->n);
    w->t1 = bench_now();
    return NULL;
}

#if defined(BENCH_X86) || defined(BENCH_NEON)
/* The int8 multiply-add probe: vpdpbusd (AVX-512 VNNI) or sdot (ARM dot
 * product), as the CPU has. */
static void *int8_worker(void *arg) {
    worker *w = arg;
    pthread_barrier_wait(w->start);
    w->t0 = bench_now();
#ifdef BENCH_X86
    w->sink = (float)dpbusd_avx512(w->iters, (int)w->n);
#else
    w->sink = (float)sdot_neon(w->iters, (int)w->n);
#endif
    w->t1 = bench_now();
    return NULL;
}
#endif

static void *fma_worker(void *arg) {
    worker *w = arg;
    pthread_barrier_wait(w->start);
    w->t0 = bench_now();
    w->sink = w->fma(w->iters, (float)w->n);
    w->t1 = bench_now();
    return NULL;
}

/* Run `fn` on `threads` workers; the wall time from the first worker's
 * start to the last one's finish, as the workers clock it. (Timing from the
 * caller's side of the barrier measured reads of 256 MiB at up to 113 GB/s
 * on the 2-vCPU VM: the caller, a third thread, was sometimes scheduled
 * only after the workers had done much of their work.) */
static double run_workers(int threads, worker *ws, void *(*fn)(void *)) {
    pthread_t tid[64];
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, (unsigned)threads + 1);
    for (int t = 0; t < threads; t++) {
        ws[t].start = &start;
        pthread_create(&tid[t], NULL, fn, &ws[t]);
    }
    pthread_barrier_wait(&start);
    for (int t = 0; t < threads; t++) pthread_join(tid[t], NULL);
    double first = ws[0].t0, last = ws[0].t1;
    for (int t = 1; t < threads; t++) {
        if (ws[t].t0 < first) first = ws[t].t0;
        if (ws[t].t1 > last) last = ws[t].t1;
    }
    pthread_barrier_destroy(&start);
    return last - first;
}

double bench_read_once(int threads, const float *buf, size_t n) {
    if (threads < 1 || threads > 64 || buf == NULL) return -1.0;
    read_fn rf;
    fma_fn ff;
    int lanes;
    (void)pick(&rf, &ff, &lanes);
    n -= n % ((size_t)64 * (size_t)threads);
    size_t per = n / (size_t)threads;
    worker ws[64];
    memset(ws, 0, sizeof ws);
    for (int t = 0; t < threads; t++) {
        ws[t].read = rf;
        ws[t].p = buf + (size_t)t * per;
        ws[t].n = per;
    }
    double dt = run_workers(threads, ws, read_worker);
    return dt > 0.0 ? (double)(per * (size_t)threads * sizeof(float)) / dt / 1e9 : -1.0;
}

double bench_fma_once(int threads, double seconds) {
    if (threads < 1 || threads > 64 || !(seconds > 0.0)) return -1.0;
    read_fn rf;
    fma_fn ff;
    int lanes;
    (void)pick(&rf, &ff, &lanes);
    /* sized as bench_measure_roofs sizes its loop (4 G vector FMA/s per thread) */
    long iters = (long)(4e9 * seconds / 12.0) / (lanes >= 8 ? 1 : 8);
    if (iters < 1) iters = 1;
    worker ws[64];
    memset(ws, 0, sizeof ws);
    for (int t = 0; t < threads; t++) {
        ws[t].fma = ff;
        ws[t].iters = iters;
        ws[t].n = (size_t)t;
    }
    double dt = run_workers(threads, ws, fma_worker);
    return dt > 0.0 ? (double)iters * 12.0 * (double)lanes * (double)threads / dt : -1.0;
}

int bench_measure_roofs(int threads, size_t bytes, int reps, bench_roofs *out) {
    if (threads < 1 || threads > 64 || reps < 1) return -1;
    if (bytes == 0) bytes = (size_t)512 << 20;
    if (reps > 64) reps = 64;
    read_fn rf;
    fma_fn ff;
    int lanes;
    out->isa = pick(&rf, &ff, &lanes);
    out->threads = threads;

    size_t n = bytes / sizeof(float);
    n -= n % ((size_t)64 * (size_t)threads);
    float *buf = NULL;
    if (posix_memalign((void **)&buf, (size_t)2 << 20, n * sizeof(float)) != 0) return -1;
#ifdef MADV_HUGEPAGE
    (void)madvise(buf, (n * sizeof(float)) & ~(((size_t)2 << 20) - 1), MADV_HUGEPAGE);
#endif
    for (size_t i = 0; i < n; i++) buf[i] = (float)(i & 1023) * 1e-3f; /* touch every page */

    worker ws[64];
    double times[64];
    for (int r = 0; r < reps; r++) times[r] = bench_read_once(threads, buf, n);
    out->read_gbps = bench_median(times, reps);
    free(buf);

    /* FMA: size the loop to ~0.2 s at 4 G vector FMA/s per thread. */
    long iters = 4000000000L / 12 / 5 / (lanes >= 8 ? 1 : 8);
    for (int r = 0; r < reps; r++) {
        memset(ws, 0, sizeof ws);
        for (int t = 0; t < threads; t++) {
            ws[t].fma = ff;
            ws[t].iters = iters;
            ws[t].n = (size_t)t;
        }
        times[r] = run_workers(threads, ws, fma_worker);
    }
    out->fma_per_s = (double)iters * 12.0 * (double)lanes * (double)threads / bench_median(times, reps);

    out->int8_macs_per_s = 0.0;
    out->int8_insn = NULL;
    out->int8_per_insn = 0;
#ifdef BENCH_X86
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vnni")) {
        out->int8_insn = "vpdpbusd";
        out->int8_per_insn = 64;
    }
#elif defined(BENCH_NEON)
    if (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) {
        out->int8_insn = "sdot";
        out->int8_per_insn = 16;
    }
#endif
#if defined(BENCH_X86) || defined(BENCH_NEON)
    if (out->int8_insn != NULL) {
        for (int r = 0; r < reps; r++) {
            memset(ws, 0, sizeof ws);
            for (int t = 0; t < threads; t++) {
                ws[t].iters = iters;
                ws[t].n = (size_t)t;
            }
            times[r] = run_workers(threads, ws, int8_worker);
        }
        out->int8_macs_per_s =
            (double)iters * 12.0 * out->int8_per_insn * (double)threads / bench_median(times, reps);
    }
#endif
    return 0;
}

#define TOOL "kvpage-bench roofline"

static void usage(FILE *f) {
    fprintf(f, "usage: kvpage-bench roofline [--threads N (2; 1..64)] [--mib N (512; 16..1048576)] "
               "[--reps N (5; 1..64)]\n");
}

int bench_roofline(int argc, char **argv) {
    int threads = 2, reps = 5, mib_arg = 512;
    for (int i = 2; i < argc; i++) {
        bool ok = true;
        if (!strcmp(argv[i], "--threads")) ok = cli_opt_int(TOOL, argc, argv, &i, 1, 64, &threads, stderr);
        else if (!strcmp(argv[i], "--mib")) ok = cli_opt_int(TOOL, argc, argv, &i, 16, 1 << 20, &mib_arg, stderr);
        else if (!strcmp(argv[i], "--reps")) ok = cli_opt_int(TOOL, argc, argv, &i, 1, 64, &reps, stderr);
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else {
            return cli_reject_option(TOOL, argv[i], usage);
        }
        if (!ok) return CLI_USAGE;
    }
    size_t mib = (size_t)mib_arg;
    bench_roofs r;
    if (bench_measure_roofs(threads, mib << 20, reps, &r) != 0) {
        fprintf(stderr, "kvpage-bench roofline: could not allocate %zu MiB\n", mib);
        return 1;
    }
    printf("roofline (%d threads, %s, %zu MiB buffer, median of %d)\n", threads, r.isa, mib, reps);
    printf("  streaming read   %8.1f GB/s\n", r.read_gbps);
    printf("  fp32 FMA         %8.1f G/s  (%.1f GFLOP/s)\n", r.fma_per_s / 1e9, 2 * r.fma_per_s / 1e9);
    printf("  FMA per byte     %8.2f\n", r.fma_per_s / (r.read_gbps * 1e9));
    if (r.int8_macs_per_s > 0)
        printf("  int8 MAC         %8.1f G/s  (%.2f G %s/s per thread)\n", r.int8_macs_per_s / 1e9,
               r.int8_macs_per_s / r.int8_per_insn / threads / 1e9, r.int8_insn);
    printf("{\"bench\": \"roofline\", \"threads\": %d, \"isa\": \"%s\", \"read_gbps\": %.3f, "
           "\"fma_per_s\": %.6g, \"int8_macs_per_s\": %.6g}\n",
           threads, r.isa, r.read_gbps, r.fma_per_s, r.int8_macs_per_s);
    return 0;
}
