/*
 * The CUDA backend against the CPU backend (the reference).
 *
 * In CI (no GPU) this file is compiled as C++ with -DKVP_CUDASIM and linked
 * with the backend's .cu files compiled the same way and the kernel simulator
 * (tests/cudasim): every kernel of the backend runs, thread by thread. On a
 * machine with a GPU, `make test-cuda` compiles the same file with nvcc and
 * links it to the library's real kernels (tests that need the simulator's
 * fault injection are skipped there).
 *
 * What is compared:
 *  - stored bytes, bit for bit: whole arenas after every append (seals,
 *    rows, staging pages, padding rows, NaN/Inf inputs, strided fp32 /
 *    fp16 / bf16 inputs), after COPY and UNSEAL operations, fp8 scales and
 *    calibration, the non-finite counter, kvp_store_read() values,
 *    kvp_cuda_quantize / kvp_cuda_dequantize against kvp_quantize /
 *    kvp_dequantize, and swap copies (kvp_store_page_to_host and back);
 *  - attention within a tolerance of the CPU's portable (exact-decode)
 *    kernels, relative L2 over the whole output:
 *      TOL_EXACT 2e-5  when the tiles hold the stored values exactly
 *                      (fp32, fp16, bf16, fp8 and int8 values): only the
 *                      order of fp32 sums and exp/tanh differ;
 *      TOL_F16   3e-3  when int8 / int4 keys or int4 values are
 *                      dequantized into fp16 tiles (docs/cuda.md: the
 *                      rounding adds ~1% of these formats' own error);
 *    and against the float64 reference within test_attention.c's bounds.
 *    Outputs and lse are poisoned (NaN) before each run and checked fully
 *    written.
 */
#include "../cuda/compat.cuh"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <unistd.h>

#include "kvpage.h"
#include "kvpage_blob.h"
#include "kvpage_cuda.h"
#include "kvpage_ext.h"
#include "kvpage_plan.h"
#include "kvpage_tier.h"
#include "internal.h"
#include "numeric.h"
#include "../bench/kvdist.h"
#include "../cuda/attention.cuh" /* the kernels and the context, for test_split_occupancy */

#define TOL_EXACT 2e-5
#define TOL_F16 3e-3

/* ---- device memory helpers --------------------------------------------------------------- */

static void *dev_alloc(size_t bytes) {
    void *p = nullptr;
    assert_int_equal(cudaMalloc(&p, bytes ? bytes : 16), cudaSuccess);
    return p;
}
static void *dev_copy(const void *host, size_t bytes) {
    void *p = dev_alloc(bytes);
    if (bytes) assert_int_equal(cudaMemcpy(p, host, bytes, cudaMemcpyHostToDevice), cudaSuccess);
    return p;
}
static void to_host(void *host, const void *dev, size_t bytes) {
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    if (bytes) assert_int_equal(cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
}

static bool have_device(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return n > 0;
}

/* ---- a CPU store and a CUDA store with the same parameters --------------------------------- */

typedef struct {
    kvp_store_t *cpu, *gpu;
    kvp_layout_t lay;
    int32_t layers, H, D, P, num_pages, num_staging;
} twin;

static kvp_store_params_t store_params(int32_t layers, int32_t H, int32_t D, int32_t P, int32_t kf,
                                       int32_t vf, int32_t order, int32_t pages, int32_t staging) {
    kvp_store_params_t sp;
    kvp_store_params_init(&sp);
    sp.layers = layers;
    sp.kv_heads = H;
    sp.head_dim = D;
    sp.page_size = P;
    sp.k_format = kf;
    sp.v_format = vf;
    sp.k_order = order;
    sp.num_pages = (uint64_t)pages;
    sp.num_staging = (uint64_t)staging;
    return sp;
}

static kvp_store_info_t store_info(const kvp_store_t *s) {
    kvp_store_info_t info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    assert_int_equal(kvp_store_info(s, &info), KVP_OK);
    return info;
}

static kvp_ctx_info_t ctx_info(const kvp_ctx_t *c) {
    kvp_ctx_info_t info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    assert_int_equal(kvp_ctx_info(c, &info), KVP_OK);
    return info;
}

static uint64_t nonfinite(kvp_store_t *s) {
    uint64_t n = 0;
    assert_int_equal(kvp_store_nonfinite_count(s, &n), KVP_OK);
    return n;
}

/* Zero the padding of every pool block of store `s` in `image`, a host copy
 * of its arena (blocks at the store's offsets): bytes past a block's element
 * and scale data up to KVP_BLOCK_ALIGN. Staging blocks (fp16, P x D x 2
 * bytes, head_dim a multiple of 8) have none. Returns the padding bytes. */
static uint64_t zero_padding(const kvp_store_t *s, uint8_t *image) {
    kvp_store_info_t info = store_info(s);
    kvp_layout_t lay;
    memset(&lay, 0, sizeof lay);
    lay.struct_size = sizeof lay;
    assert_int_equal(kvp_store_layout(s, &lay), KVP_OK);
    uint64_t total = 0;
    for (int32_t layer = 0; layer < lay.layers; layer++)
        for (int side = 0; side < 2; side++) {
            kvp_region_t r;
            memset(&r, 0, sizeof r);
            r.struct_size = sizeof r;
            assert_int_equal(kvp_store_region(s, layer, side ? KVP_REGION_V : KVP_REGION_K, &r),
                             KVP_OK);
            if (r.base == nullptr) continue;
            uint64_t used = kvp__block_bytes(side ? lay.v_format : lay.k_format, side == 0,
                                             (uint64_t)lay.page_size, (uint64_t)lay.head_dim);
            assert_true(used <= r.block_bytes && r.block_bytes - used < KVP_BLOCK_ALIGN);
            uint64_t base = (uint64_t)((uint8_t *)r.base - (uint8_t *)info.arena);
            for (uint64_t p = 0; p < r.pages; p++)
                for (int32_t h = 0; h < lay.kv_heads; h++) {
                    uint64_t at = base + p * r.page_stride + (uint64_t)h * r.head_stride + used;
                    memset(image + at, 0, (size_t)(r.block_bytes - used));
                    total += r.block_bytes - used;
                }
        }
    return total;
}

/* Both arenas start with the same bytes, so unwritten bytes compare equal
 * too; block padding starts as zeros, what both backends write there (the
 * padding test starts the device arena with garbage instead). */
static void twin_fill(twin *t, uint8_t pattern) {
    kvp_store_info_t ci = store_info(t->cpu), gi = store_info(t->gpu);
    void *cb = ci.arena, *gb = gi.arena;
    uint64_t cn = ci.arena_bytes, gn = gi.arena_bytes;
    assert_true(cn == gn);
    uint64_t f = t->lay.fixed_bytes;
    memset((uint8_t *)cb + f, pattern, (size_t)(cn - f));
    (void)zero_padding(t->cpu, (uint8_t *)cb);
    assert_int_equal(cudaMemcpy((uint8_t *)gb + f, (uint8_t *)cb + f, (size_t)(gn - f),
                                cudaMemcpyHostToDevice),
                     cudaSuccess);
}

static void twin_make(twin *t, int32_t layers, int32_t H, int32_t D, int32_t P, int32_t kf, int32_t vf,
                      int32_t order, int32_t pages, int32_t staging) {
    memset(t, 0, sizeof *t);
    kvp_store_params_t sp = store_params(layers, H, D, P, kf, vf, order, pages, staging);
    char err[KVP_ERR_SIZE] = "";
    int rc = kvp_store_create(&sp, &t->cpu, err, sizeof err);
    if (rc != KVP_OK) print_error("cpu store: %s\n", err);
    assert_int_equal(rc, KVP_OK);
    rc = kvp_cuda_store_create(&sp, NULL, &t->gpu, err, sizeof err);
    if (rc != KVP_OK) print_error("cuda store: %s\n", err);
    assert_int_equal(rc, KVP_OK);
    assert_int_equal(store_info(t->gpu).backend, KVP_BACKEND_CUDA);
    assert_int_equal(store_info(t->cpu).backend, KVP_BACKEND_CPU);
    t->lay.struct_size = sizeof t->lay;
    assert_int_equal(kvp_store_layout(t->cpu, &t->lay), KVP_OK);
    t->layers = layers;
    t->H = H;
    t->D = D;
    t->P = P;
    t->num_pages = pages;
    t->num_staging = t->lay.needs_staging ? staging : 0;
    twin_fill(t, 0xA7);
}

static void twin_free(twin *t) {
    kvp_store_destroy(t->cpu);
    kvp_store_destroy(t->gpu);
    t->cpu = t->gpu = nullptr;
}

/* Whole arenas, byte for byte; on a difference, say where. */
static void twin_compare(twin *t, const char *what) {
    assert_int_equal(kvp_store_synchronize(t->gpu), KVP_OK);
    kvp_store_info_t ci = store_info(t->cpu), gi = store_info(t->gpu);
    void *cb = ci.arena, *gb = gi.arena;
    uint64_t n = ci.arena_bytes;
    assert_true(gi.arena_bytes == n);
    uint8_t *g = (uint8_t *)malloc((size_t)n);
    assert_non_null(g);
    to_host(g, gb, (size_t)n);
    const uint8_t *c = (const uint8_t *)cb;
    uint64_t diff = 0, first = 0;
    for (uint64_t i = 0; i < n; i++)
        if (c[i] != g[i]) {
            if (diff == 0) first = i;
            diff++;
        }
    if (diff != 0)
        print_error("%s: %llu of %llu arena bytes differ, first at %llu (cpu %02x, cuda %02x); "
                    "formats K %s V %s, P %d, D %d\n",
                    what, (unsigned long long)diff, (unsigned long long)n, (unsigned long long)first,
                    c[first], g[first], kvp_format_name(t->lay.k_format),
                    kvp_format_name(t->lay.v_format), (int)t->P, (int)t->D);
    free(g);
    assert_true(diff == 0);
    assert_true(nonfinite(t->cpu) == nonfinite(t->gpu));
}

/* Rows [rows][stride] of fp32 values as `dtype` bytes. */
static uint8_t *as_dtype(const float *x, size_t n, int32_t dtype) {
    size_t es = dtype == KVP_FORMAT_FP32 ? 4 : 2;
    uint8_t *b = (uint8_t *)malloc(n * es + 1);
    assert_non_null(b);
    for (size_t i = 0; i < n; i++) {
        if (dtype == KVP_FORMAT_FP32) {
            memcpy(b + 4 * i, &x[i], 4);
        } else {
            uint16_t h = dtype == KVP_FORMAT_FP16 ? kvp__f32_to_f16(x[i]) : kvp__f32_to_bf16(x[i]);
            memcpy(b + 2 * i, &h, 2);
        }
    }
    return b;
}

/* Append the same rows to both stores (the CPU's from host memory, the
 * GPU's from a device copy of the same bytes). */
static void twin_append(twin *t, int32_t layer, int32_t rows, int32_t dtype, const float *k,
                        const float *v, int64_t stride, const int64_t *slots,
                        const kvp_page_op_t *ops, int32_t nops) {
    size_t n = (size_t)(rows > 0 ? rows : 1) * (size_t)stride, es = dtype == KVP_FORMAT_FP32 ? 4 : 2;
    uint8_t *hk = as_dtype(k, n, dtype), *hv = as_dtype(v, n, dtype);
    void *dk = dev_copy(hk, n * es), *dv = dev_copy(hv, n * es);
    kvp_append_params_t a;
    kvp_append_params_init(&a);
    a.layer = layer;
    a.rows = rows;
    a.dtype = dtype;
    a.k_row_stride = a.v_row_stride = stride == (int64_t)t->H * t->D ? 0 : stride;
    a.slots = slots;
    a.ops = ops;
    a.num_ops = nops;
    a.k = hk;
    a.v = hv;
    int rc = kvp_store_append(t->cpu, &a);
    if (rc != KVP_OK) print_error("cpu append: %s\n", kvp_store_last_error(t->cpu));
    assert_int_equal(rc, KVP_OK);
    a.k = dk;
    a.v = dv;
    rc = kvp_store_append(t->gpu, &a);
    if (rc != KVP_OK) print_error("cuda append: %s\n", kvp_store_last_error(t->gpu));
    assert_int_equal(rc, KVP_OK);
    assert_int_equal(kvp_store_synchronize(t->gpu), KVP_OK); /* the device copies are freed next */
    assert_int_equal(cudaFree(dk), cudaSuccess);
    assert_int_equal(cudaFree(dv), cudaSuccess);
    free(hk);
    free(hv);
}

/* ---- pages: the real page table (kvp_pool_t + kvp_table_t) chooses the slots and seals ------ */

typedef struct {
    kvp_pool_t *pool;
    kvp_table_t *table;
    int32_t P;
} paging;

/* A pool of `pages` pages (and `staging` staging pages when the twin's
 * layout needs them), no prefix cache, and a table on it. */
static void paging_make(paging *g, const twin *t, int32_t pages, int32_t staging) {
    kvp_pool_params_t pp;
    kvp_pool_params_init(&pp);
    pp.page_size = t->P;
    pp.num_pages = pages;
    pp.num_staging = t->lay.needs_staging ? staging : 0;
    pp.prefix_cache = 0;
    char err[KVP_ERR_SIZE] = "";
    int rc = kvp_pool_create(&pp, &g->pool, err, sizeof err);
    if (rc != KVP_OK) print_error("pool: %s\n", err);
    assert_int_equal(rc, KVP_OK);
    rc = kvp_table_create(g->pool, 0, &g->table, err, sizeof err);
    if (rc != KVP_OK) print_error("table: %s\n", err);
    assert_int_equal(rc, KVP_OK);
    g->P = t->P;
}

static void paging_free(paging *g) {
    kvp_table_destroy(g->table);
    kvp_pool_destroy(g->pool);
    g->table = nullptr;
    g->pool = nullptr;
}

static int32_t paging_seq(paging *g) {
    int32_t id = -1;
    assert_int_equal(kvp_table_seq_create(g->table, 0, 0, &id), KVP_OK);
    return id;
}

/* Append `n` tokens to `seq`, which are rows row_base.. of the step's batch:
 * writes their n slots and appends the sequence's operations (SEALs) at
 * ops[*nops..] (room for ops_capacity in all), their rows counted in the
 * batch (the table counts them from the sequence's first row). */
static void paging_append(paging *g, int32_t seq, int32_t n, int32_t row_base, int64_t *slots,
                          kvp_page_op_t *ops, int32_t ops_capacity, int32_t *nops) {
    int32_t k = 0;
    int rc = kvp_table_append(g->table, seq, n, NULL, slots, ops + *nops, ops_capacity - *nops, &k);
    if (rc != KVP_OK) print_error("table append: %s\n", kvp_table_last_error(g->table));
    assert_int_equal(rc, KVP_OK);
    for (int32_t i = 0; i < k; i++) {
        assert_int_equal(ops[*nops + i].kind, KVP_OP_SEAL); /* no forks, no truncations */
        ops[*nops + i].row += row_base;
    }
    *nops += k;
}

/* A sequence's pages as the batch export lists them (a partial staging page
 * last), and its description. */
static kvp_seq_info_t paging_pages(paging *g, int32_t seq, int32_t *pages, int32_t capacity) {
    kvp_seq_info_t info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    assert_int_equal(kvp_table_seq_info(g->table, seq, &info), KVP_OK);
    assert_true(info.num_pages <= capacity);
    assert_int_equal(kvp_table_seq_pages(g->table, seq, pages, capacity), KVP_OK);
    return info;
}

/* ---- bytes: append, seal, staging, every format ---------------------------------------------- */

/* Several sequences grown in uneven batched steps (prefill chunks, decode
 * steps, padding rows), with NaN / Inf / -0 inputs sprinkled in, every
 * step appended to every layer and compared. */
static void run_append_case(int32_t kf, int32_t vf, int32_t order, int32_t P, int32_t D,
                            int32_t dtype, uint64_t seed) {
    const int32_t H = 2, layers = 2, nseq = 3, steps = 6;
    const int32_t pages = 64 / P + 12;
    twin t;
    twin_make(&t, layers, H, D, P, kf, vf, order, pages * nseq, nseq);
    paging pg;
    paging_make(&pg, &t, pages * nseq, nseq);
    int32_t seqs[3];
    for (int i = 0; i < nseq; i++) seqs[i] = paging_seq(&pg);
    kvd_rng rng;
    kvd_seed(&rng, seed);
    const int64_t stride = (int64_t)H * D + (seed % 2 ? 8 : 0); /* strided rows on odd seeds */
    for (int step = 0; step < steps; step++) {
        int32_t want[3], rows = 0;
        for (int i = 0; i < nseq; i++) {
            want[i] = (int32_t)(kvd_next(&rng) % (uint64_t)(step == 0 ? 2 * P + 3 : P / 2 + 2));
            rows += want[i] + 1; /* one padding row per sequence */
        }
        int64_t *slots = (int64_t *)malloc((size_t)rows * 8);
        kvp_page_op_t *ops = (kvp_page_op_t *)malloc((size_t)(rows + 1) * sizeof *ops);
        float *k = (float *)malloc((size_t)rows * (size_t)stride * 4);
        float *v = (float *)malloc((size_t)rows * (size_t)stride * 4);
        assert_true(slots && ops && k && v);
        kvd_fill_normal(&rng, (size_t)rows * (size_t)stride, k);
        kvd_fill_normal(&rng, (size_t)rows * (size_t)stride, v);
        for (int64_t i = 0; i < (int64_t)rows * stride; i++) k[i] = 3.0f * k[i] + (float)(i % 7) - 3.0f;
        int32_t nops = 0, row = 0;
        for (int i = 0; i < nseq; i++) {
            paging_append(&pg, seqs[i], want[i], row, slots + row, ops, rows + 1, &nops);
            row += want[i];
            slots[row++] = -1; /* padding */
        }
        /* non-finite and signed-zero inputs in a few rows */
        if (step % 2 == 1 && rows > 2) {
            k[1] = NAN;
            v[stride + 2] = INFINITY;
            k[(size_t)(rows - 2) * (size_t)stride + 3] = -INFINITY;
            v[5] = NAN;
            for (int32_t d = 0; d < D; d++) k[(size_t)stride + (size_t)d] = d % 2 ? -0.0f : 0.0f;
        }
        for (int32_t layer = 0; layer < layers; layer++)
            twin_append(&t, layer, rows, dtype, layer ? v : k, layer ? k : v, stride, slots, ops, nops);
        char what[128];
        snprintf(what, sizeof what, "append step %d", step);
        twin_compare(&t, what);
        free(slots);
        free(ops);
        free(k);
        free(v);
    }
    paging_free(&pg);
    twin_free(&t);
}

static void test_append_bytes(void **state) {
    (void)state;
    static const struct {
        int32_t kf, vf, order, P, D, dtype;
    } cases[] = {
        {KVP_FORMAT_FP16, KVP_FORMAT_FP16, 0, 16, 64, KVP_FORMAT_FP32},
        {KVP_FORMAT_FP16, KVP_FORMAT_FP16, 1, 8, 40, KVP_FORMAT_FP16},
        {KVP_FORMAT_FP32, KVP_FORMAT_BF16, 0, 1, 16, KVP_FORMAT_BF16},
        {KVP_FORMAT_BF16, KVP_FORMAT_FP32, 1, 32, 24, KVP_FORMAT_FP32},
        {KVP_FORMAT_FP8_E4M3, KVP_FORMAT_FP8_E4M3, 0, 16, 32, KVP_FORMAT_FP32},
        {KVP_FORMAT_FP8_E4M3, KVP_FORMAT_INT8, 1, 4, 16, KVP_FORMAT_FP16},
        {KVP_FORMAT_INT8, KVP_FORMAT_INT8, 0, 16, 64, KVP_FORMAT_FP32},
        {KVP_FORMAT_INT8, KVP_FORMAT_INT4, 1, 8, 40, KVP_FORMAT_BF16},
        {KVP_FORMAT_INT4, KVP_FORMAT_INT4, 0, 32, 80, KVP_FORMAT_FP32},
        {KVP_FORMAT_INT4, KVP_FORMAT_FP8_E4M3, 1, 2, 24, KVP_FORMAT_FP16},
        {KVP_FORMAT_INT8, KVP_FORMAT_FP16, 1, 64, 16, KVP_FORMAT_FP32},
        {KVP_FORMAT_INT4, KVP_FORMAT_INT8, 0, 6, 8, KVP_FORMAT_FP32},
        {KVP_FORMAT_INT8, KVP_FORMAT_BF16, 0, 5, 16, KVP_FORMAT_FP16},
        {KVP_FORMAT_FP16, KVP_FORMAT_INT4, 0, 3, 48, KVP_FORMAT_FP32},
        {KVP_FORMAT_INT4_V1, KVP_FORMAT_INT4_V1, 0, 8, 40, KVP_FORMAT_FP16},
        {KVP_FORMAT_INT8, KVP_FORMAT_INT4_V1, 1, 4, 32, KVP_FORMAT_FP32},
        /* rotated values over blocks of 32 + 16 + 8 channels, fp16 keys (no staging) */
        {KVP_FORMAT_BF16, KVP_FORMAT_INT4, 1, 4, 56, KVP_FORMAT_BF16},
        /* ... and staged (int4 keys), 64 + 32 + 16 + 8 channels */
        {KVP_FORMAT_INT4, KVP_FORMAT_INT4, 0, 4, 120, KVP_FORMAT_FP16},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        run_append_case(cases[i].kf, cases[i].vf, cases[i].order, cases[i].P, cases[i].D,
                        cases[i].dtype, 1000 + i);
}

/* ---- bytes: page operations, reads, swap copies ------------------------------------------------ */

static void fill_sequence(twin *t, paging *pg, int32_t seq, int32_t tokens, kvd_rng *rng) {
    int64_t stride = (int64_t)t->H * t->D;
    float *k = (float *)malloc((size_t)tokens * (size_t)stride * 4);
    float *v = (float *)malloc((size_t)tokens * (size_t)stride * 4);
    int64_t *slots = (int64_t *)malloc((size_t)tokens * 8);
    kvp_page_op_t *ops = (kvp_page_op_t *)malloc((size_t)(tokens + 1) * sizeof *ops);
    assert_true(k && v && slots && ops);
    kvd_fill_normal(rng, (size_t)tokens * (size_t)stride, k);
    kvd_fill_normal(rng, (size_t)tokens * (size_t)stride, v);
    int32_t nops = 0;
    paging_append(pg, seq, tokens, 0, slots, ops, tokens + 1, &nops);
    for (int32_t layer = 0; layer < t->layers; layer++)
        twin_append(t, layer, tokens, KVP_FORMAT_FP32, k, v, stride, slots, ops, nops);
    free(k);
    free(v);
    free(slots);
    free(ops);
}

static void twin_ops(twin *t, const kvp_page_op_t *ops, int32_t n) {
    int rc = kvp_store_apply_ops(t->cpu, ops, n);
    assert_int_equal(rc, KVP_OK);
    rc = kvp_store_apply_ops(t->gpu, ops, n);
    if (rc != KVP_OK) print_error("cuda ops: %s\n", kvp_store_last_error(t->gpu));
    assert_int_equal(rc, KVP_OK);
}

static void test_ops_read_and_swap(void **state) {
    (void)state;
    static const int32_t fmts[][3] = {
        {KVP_FORMAT_INT8, KVP_FORMAT_INT4, 16}, {KVP_FORMAT_INT4, KVP_FORMAT_FP8_E4M3, 8},
        {KVP_FORMAT_FP16, KVP_FORMAT_INT8, 16}, {KVP_FORMAT_BF16, KVP_FORMAT_FP32, 4},
        {KVP_FORMAT_INT4_V1, KVP_FORMAT_INT4_V1, 8}, {KVP_FORMAT_FP16, KVP_FORMAT_INT4, 4},
    };
    for (size_t f = 0; f < sizeof fmts / sizeof *fmts; f++) {
        twin t;
        const int32_t P = fmts[f][2], D = 32, H = 3;
        twin_make(&t, 3, H, D, P, fmts[f][0], fmts[f][1], (int32_t)(f % 2), 24, 4);
        paging pg;
        paging_make(&pg, &t, 24, 4);
        int32_t seq_a = paging_seq(&pg), seq_b = paging_seq(&pg);
        kvd_rng rng;
        kvd_seed(&rng, 77 + f);
        fill_sequence(&t, &pg, seq_a, 3 * P + P / 2 + 1, &rng);
        fill_sequence(&t, &pg, seq_b, 2 * P, &rng);
        twin_compare(&t, "before ops");
        int32_t a[8], b[8];
        kvp_seq_info_t ai = paging_pages(&pg, seq_a, a, 8);
        paging_pages(&pg, seq_b, b, 8);
        if (t.lay.needs_staging) assert_int_equal(a[3], ai.staging_page); /* partial: staging */
        /* pages no sequence uses, held by the test: two pool pages and (with
         * staging) two staging pages */
        int32_t free_pool[2], free_stg[2];
        assert_int_equal(kvp_pool_alloc(pg.pool, 2, free_pool), KVP_OK);
        if (t.lay.needs_staging) assert_int_equal(kvp_pool_alloc_staging(pg.pool, 2, free_stg), KVP_OK);
        /* COPY pool pages (one a no-op), UNSEAL a sealed page into a free
         * staging page, then a COPY of that staging page (a chain: a second
         * group), and another UNSEAL */
        kvp_page_op_t ops[6];
        int32_t n = 0;
        ops[n++] = {KVP_OP_COPY, a[0], free_pool[0], 0, -1};
        ops[n++] = {KVP_OP_COPY, a[1], a[1], 0, -1};
        if (t.lay.needs_staging) {
            ops[n++] = {KVP_OP_UNSEAL, a[2], free_stg[0], P - 1, -1};
            ops[n++] = {KVP_OP_COPY, free_stg[0], free_stg[1], 0, -1};
            ops[n++] = {KVP_OP_UNSEAL, b[0], free_stg[0], 1, -1};
        } else {
            ops[n++] = {KVP_OP_COPY, b[1], free_pool[1], 0, -1};
        }
        twin_ops(&t, ops, n);
        twin_compare(&t, "after COPY / UNSEAL");

        /* kvp_store_read: the same fp32 values */
        int32_t ids[3] = {a[0], a[2], t.lay.needs_staging ? ai.staging_page : b[1]};
        size_t row = (size_t)H * D;
        float *ck = (float *)malloc((size_t)P * row * 4), *cv = (float *)malloc((size_t)P * row * 4);
        float *gk = (float *)malloc((size_t)P * row * 4), *gv = (float *)malloc((size_t)P * row * 4);
        for (int i = 0; i < 3; i++)
            for (int32_t layer = 0; layer < 3; layer++) {
                int32_t t0 = i == 2 ? 0 : 1, cnt = i == 2 ? P / 2 : P - 1;
                assert_int_equal(kvp_store_read(t.cpu, layer, ids[i], t0, cnt, ck, cv), KVP_OK);
                assert_int_equal(kvp_store_read(t.gpu, layer, ids[i], t0, cnt, gk, gv), KVP_OK);
                assert_memory_equal(ck, gk, (size_t)cnt * row * 4);
                assert_memory_equal(cv, gv, (size_t)cnt * row * 4);
            }
        assert_int_equal(kvp_store_read(t.gpu, 0, ids[0], 0, P, NULL, gv), KVP_OK);
        assert_int_equal(kvp_store_read(t.cpu, 0, ids[0], 0, P, NULL, cv), KVP_OK);
        assert_memory_equal(cv, gv, (size_t)P * row * 4);
        free(ck);
        free(cv);
        free(gk);
        free(gv);

        /* swap copies: every page's serialization is the CPU's; pinned and
         * pageable host memory; a page copied out, clobbered, copied back
         * (whole, and in chunks) restores the arena */
        uint64_t pb = t.lay.page_bytes, sb = t.lay.staging_page_bytes;
        uint8_t *pinned = nullptr;
        char err[KVP_ERR_SIZE];
        assert_int_equal(kvp_cuda_host_alloc(pb + sb, (void **)&pinned, err, sizeof err), KVP_OK);
        uint8_t *cpu_buf = (uint8_t *)malloc((size_t)(pb + sb));
        for (int32_t id = 0; id < t.num_pages + t.num_staging; id += (id < t.num_pages ? 5 : 1)) {
            uint64_t bytes = id < t.num_pages ? pb : sb;
            memset(pinned, 0, (size_t)bytes);
            assert_int_equal(kvp_store_page_to_host(t.cpu, id, 0, cpu_buf, bytes), KVP_OK);
            assert_int_equal(kvp_store_page_to_host(t.gpu, id, 0, pinned, bytes), KVP_OK);
            assert_int_equal(kvp_store_synchronize(t.gpu), KVP_OK);
            assert_memory_equal(cpu_buf, pinned, (size_t)bytes);
            /* a range that starts and ends inside blocks */
            uint64_t off = bytes / 3 + 5, len = bytes / 2;
            memset(pinned, 0, (size_t)len);
            assert_int_equal(kvp_store_page_to_host(t.gpu, id, off, pinned, len), KVP_OK);
            assert_int_equal(kvp_store_synchronize(t.gpu), KVP_OK);
            assert_memory_equal(cpu_buf + off, pinned, (size_t)len);
        }
        int32_t victim = a[1];
        assert_int_equal(kvp_store_page_to_host(t.gpu, victim, 0, pinned, pb), KVP_OK);
        kvp_page_op_t clobber = {KVP_OP_COPY, a[0], victim, 0, -1};
        assert_int_equal(kvp_store_apply_ops(t.gpu, &clobber, 1), KVP_OK);
        /* the second half on a stream of its own (the store's stream, set) */
        cudaStream_t side;
        assert_int_equal(cudaStreamCreate(&side), cudaSuccess);
        assert_int_equal(kvp_store_page_from_host(t.gpu, victim, 0, pinned, pb / 2), KVP_OK);
        assert_int_equal(kvp_store_synchronize(t.gpu), KVP_OK);
        assert_int_equal(kvp_cuda_store_set_stream(t.gpu, side), KVP_OK);
        assert_int_equal(kvp_store_page_from_host(t.gpu, victim, pb / 2, pinned + pb / 2, pb - pb / 2),
                         KVP_OK);
        assert_int_equal(kvp_store_synchronize(t.gpu), KVP_OK);
        assert_int_equal(kvp_cuda_store_set_stream(t.gpu, nullptr), KVP_OK);
        assert_int_equal(cudaStreamDestroy(side), cudaSuccess);
        twin_compare(&t, "after a swap round trip");
        /* bad ranges and ids change nothing */
        assert_int_equal(kvp_store_page_to_host(t.gpu, victim, pb - 4, pinned, 8), KVP_EINVAL);
        assert_non_null(strstr(kvp_store_last_error(t.gpu), "outside"));
        assert_int_equal(kvp_store_page_to_host(t.gpu, t.num_pages + t.num_staging, 0, pinned, 8),
                         KVP_EINVAL);
        assert_int_equal(kvp_store_page_from_host(t.gpu, victim, 0, NULL, 8), KVP_EINVAL);
        kvp_cuda_host_free(pinned);
        free(cpu_buf);
        assert_int_equal(kvp_pool_release(pg.pool, 2, free_pool), KVP_OK);
        if (t.lay.needs_staging) assert_int_equal(kvp_pool_release(pg.pool, 2, free_stg), KVP_OK);
        paging_free(&pg);
        twin_free(&t);
    }
}

/* fp8 scales: set, get, calibration, and the bytes they lead to. */
static void test_fp8_scales(void **state) {
    (void)state;
    twin t;
    twin_make(&t, 2, 2, 16, 8, KVP_FORMAT_FP8_E4M3, KVP_FORMAT_FP8_E4M3, 0, 8, 0);
    assert_int_equal(kvp_store_set_fp8_scale(t.cpu, 1, 1, 0, 0.25f), KVP_OK);
    assert_int_equal(kvp_store_set_fp8_scale(t.gpu, 1, 1, 0, 0.25f), KVP_OK);
    float s = -1.0f;
    assert_int_equal(kvp_store_get_fp8_scale(t.gpu, 1, 1, 0, &s), KVP_OK);
    assert_true(s == 0.25f);
    assert_int_equal(kvp_store_get_fp8_scale(t.gpu, 0, 0, 0, &s), KVP_OK);
    assert_true(s == 0.0f);
    assert_int_equal(kvp_store_set_fp8_scale(t.gpu, 0, 0, 0, -1.0f), KVP_EINVAL);
    paging pg;
    paging_make(&pg, &t, 8, 0);
    int32_t a = paging_seq(&pg);
    kvd_rng rng;
    kvd_seed(&rng, 5);
    fill_sequence(&t, &pg, a, 11, &rng); /* calibrates every other (layer, head, side) */
    twin_compare(&t, "fp8 after calibration");
    for (int32_t layer = 0; layer < 2; layer++)
        for (int32_t h = 0; h < 2; h++)
            for (int32_t side = 0; side < 2; side++) {
                float c = 0.0f, g = 0.0f;
                assert_int_equal(kvp_store_get_fp8_scale(t.cpu, layer, h, side, &c), KVP_OK);
                assert_int_equal(kvp_store_get_fp8_scale(t.gpu, layer, h, side, &g), KVP_OK);
                assert_true(c == g && g > 0.0f);
            }
    /* a scale set back to 0 calibrates again on the next append */
    assert_int_equal(kvp_store_set_fp8_scale(t.cpu, 0, 1, 1, 0.0f), KVP_OK);
    assert_int_equal(kvp_store_set_fp8_scale(t.gpu, 0, 1, 1, 0.0f), KVP_OK);
    fill_sequence(&t, &pg, a, 9, &rng);
    twin_compare(&t, "fp8 after recalibration");
    paging_free(&pg);
    twin_free(&t);
}

/* ---- standalone quantize / dequantize ----------------------------------------------------------- */

/* kvp_cuda_quantize / kvp_cuda_dequantize against kvp_quantize / kvp_dequantize
 * for one block shape: the bytes, then the values back. */
static void quantize_case(int32_t f, int32_t is_value, int32_t order, int32_t P, int32_t D,
                          int32_t heads, int64_t pages, int32_t dtype, kvd_rng *rng) {
    kvp_quant_desc_t q;
    memset(&q, 0, sizeof q);
    q.struct_size = sizeof q;
    q.format = f;
    q.is_value = is_value;
    q.k_order = order;
    q.page_size = P;
    q.head_dim = D;
    q.heads = heads;
    q.dtype = dtype;
    q.fp8_scale = 0.125f;
    size_t n = (size_t)pages * q.page_size * q.heads * q.head_dim;
    float *x = (float *)malloc(n * 4);
    kvd_fill_normal(rng, n, x);
    for (size_t i = 0; i < n; i += 7 * (size_t)D + 3) x[i] *= 20.0f; /* a few wide values */
    x[3] = NAN;
    x[n - 1] = -INFINITY;
    uint8_t *src = as_dtype(x, n, q.dtype);
    size_t es = q.dtype == KVP_FORMAT_FP32 ? 4 : 2;
    uint64_t block = 0;
    char err[KVP_ERR_SIZE];
    assert_int_equal(kvp_quant_block_bytes(&q, &block, err, sizeof err), KVP_OK);
    size_t bytes = (size_t)(pages * q.heads) * (size_t)block;
    uint8_t *cpu = (uint8_t *)malloc(bytes), *gpu = (uint8_t *)malloc(bytes);
    memset(cpu, 0x33, bytes);
    /* every block's padding: zeros (kvp_cuda_quantize writes them over the 0x33) */
    uint64_t used = kvp__block_bytes(f, !is_value, (uint64_t)q.page_size, (uint64_t)q.head_dim);
    for (size_t b = 0; b < (size_t)(pages * q.heads); b++)
        memset(cpu + b * (size_t)block + used, 0, (size_t)(block - used));
    assert_int_equal(kvp_quantize(&q, src, pages, cpu, err, sizeof err), KVP_OK);
    void *dsrc = dev_copy(src, n * es), *dblk = dev_alloc(bytes);
    assert_int_equal(cudaMemset(dblk, 0x33, bytes), cudaSuccess);
    int rc = kvp_cuda_quantize(&q, dsrc, pages, dblk, nullptr, err, sizeof err);
    if (rc != KVP_OK) print_error("kvp_cuda_quantize: %s\n", err);
    assert_int_equal(rc, KVP_OK);
    to_host(gpu, dblk, bytes);
    if (memcmp(cpu, gpu, bytes) != 0)
        print_error("quantize %s %s order %d, P %d, D %d: bytes differ\n", kvp_format_name(f),
                    is_value ? "values" : "keys", (int)order, (int)P, (int)D);
    assert_memory_equal(cpu, gpu, bytes);
    /* and back: the CPU's exact values, in the tensor's dtype */
    uint8_t *cout = (uint8_t *)malloc(n * es), *gout = (uint8_t *)malloc(n * es);
    assert_int_equal(kvp_dequantize(&q, cpu, pages, cout, err, sizeof err), KVP_OK);
    void *dout = dev_alloc(n * es);
    assert_int_equal(kvp_cuda_dequantize(&q, dblk, pages, dout, nullptr, err, sizeof err), KVP_OK);
    to_host(gout, dout, n * es);
    if (memcmp(cout, gout, n * es) != 0)
        print_error("dequantize %s %s order %d, P %d, D %d: values differ\n", kvp_format_name(f),
                    is_value ? "values" : "keys", (int)order, (int)P, (int)D);
    assert_memory_equal(cout, gout, n * es);
    /* bad input: the same checks as the CPU, nothing launched */
    assert_int_equal(kvp_cuda_quantize(&q, dsrc, 0, dblk, nullptr, err, sizeof err), KVP_EINVAL);
    assert_int_equal(kvp_cuda_dequantize(&q, NULL, 1, dout, nullptr, err, sizeof err), KVP_EINVAL);
    cudaFree(dsrc);
    cudaFree(dblk);
    cudaFree(dout);
    free(x);
    free(src);
    free(cpu);
    free(gpu);
    free(cout);
    free(gout);
}

static void test_quantize_standalone(void **state) {
    (void)state;
    kvd_rng rng;
    kvd_seed(&rng, 9);
    for (int32_t f = 0; f < KVP_FORMAT_COUNT; f++)
        for (int32_t is_value = 0; is_value < 2; is_value++)
            for (int32_t order = 0; order < 2; order++) {
                int32_t dtype = (f + order) % 3 == 0 ? KVP_FORMAT_FP32
                                : (f + order) % 3 == 1 ? KVP_FORMAT_FP16 : KVP_FORMAT_BF16;
                quantize_case(f, is_value, order, 2 + 6 * order /* 2 and 8 */, is_value ? 40 : 24, 3,
                              3, dtype, &rng);
            }
    /* int4 at the extremes of head_dim: the most outlier channels (128 at
     * 1024), rotation blocks of every size from 512 down to 8, the smallest row */
    quantize_case(KVP_FORMAT_INT4, 0, 0, 4, 1024, 2, 1, KVP_FORMAT_FP32, &rng);
    quantize_case(KVP_FORMAT_INT4_V1, 0, 0, 4, 1024, 1, 1, KVP_FORMAT_FP16, &rng);
    quantize_case(KVP_FORMAT_INT4, 1, 0, 4, 1016, 2, 1, KVP_FORMAT_FP32, &rng);
    quantize_case(KVP_FORMAT_INT4, 1, 0, 2, 1024, 1, 2, KVP_FORMAT_BF16, &rng);
    quantize_case(KVP_FORMAT_INT4, 1, 0, 3, 8, 5, 2, KVP_FORMAT_FP16, &rng);
    quantize_case(KVP_FORMAT_INT4, 0, 0, 2, 8, 5, 2, KVP_FORMAT_FP32, &rng);
}

/* ---- attention ---------------------------------------------------------------------------------- */

typedef struct {
    int32_t kv_heads, q_heads, head_dim, page_size, k_format, v_format, k_order, batch;
    const int32_t *kv_len, *q_len;
    uint64_t seed;
} batch_spec;

typedef struct {
    batch_spec spec;
    twin t;
    paging pg;
    int32_t *seqs; /* [batch] the table's sequence ids */
    float **k, **v;
    float *q;
    int32_t *qo, *indptr, *indices, *last;
    kvp_kv_view_t view;
    int32_t rows;
    double sm_scale;
} batch;

static void batch_build(batch *bt, const batch_spec *s) {
    memset(bt, 0, sizeof *bt);
    bt->spec = *s;
    kvd_rng rng;
    kvd_seed(&rng, s->seed);
    kvd_keys keys;
    assert_int_equal(kvd_keys_init(&keys, &rng, s->kv_heads, s->head_dim), 0);
    bt->sm_scale = kvd_sm_scale(&keys);
    int32_t pages = 0;
    for (int32_t b = 0; b < s->batch; b++) pages += s->kv_len[b] / s->page_size + 1;
    twin_make(&bt->t, 2, s->kv_heads, s->head_dim, s->page_size, s->k_format, s->v_format, s->k_order,
              pages, s->batch);
    paging_make(&bt->pg, &bt->t, pages, s->batch);
    bt->seqs = (int32_t *)calloc((size_t)s->batch, sizeof *bt->seqs);
    bt->k = (float **)calloc((size_t)s->batch, sizeof *bt->k);
    bt->v = (float **)calloc((size_t)s->batch, sizeof *bt->v);
    bt->qo = (int32_t *)malloc((size_t)(s->batch + 1) * 4);
    size_t row = (size_t)s->kv_heads * (size_t)s->head_dim;
    bt->qo[0] = 0;
    for (int32_t b = 0; b < s->batch; b++) {
        bt->seqs[b] = paging_seq(&bt->pg);
        size_t n = (size_t)(s->kv_len[b] > 0 ? s->kv_len[b] : 1) * row;
        bt->k[b] = (float *)malloc(n * 4);
        bt->v[b] = (float *)malloc(n * 4);
        kvd_fill_keys(&keys, &rng, (size_t)s->kv_len[b], bt->k[b]);
        kvd_fill_normal(&rng, (size_t)s->kv_len[b] * row, bt->v[b]);
        /* uneven steps, as prefill chunks and decode steps come */
        for (int32_t t0 = 0, step = 1; t0 < s->kv_len[b]; t0 += step, step = step * 5 % 61 + 1) {
            if (step > s->kv_len[b] - t0) step = s->kv_len[b] - t0;
            int64_t *slots = (int64_t *)malloc((size_t)step * 8);
            kvp_page_op_t *ops = (kvp_page_op_t *)malloc((size_t)(step + 1) * sizeof *ops);
            int32_t nops = 0;
            paging_append(&bt->pg, bt->seqs[b], step, 0, slots, ops, step + 1, &nops);
            /* layer 1 has the data; layer 0 gets K and V swapped */
            twin_append(&bt->t, 1, step, KVP_FORMAT_FP32, bt->k[b] + (size_t)t0 * row,
                        bt->v[b] + (size_t)t0 * row, (int64_t)row, slots, ops, nops);
            twin_append(&bt->t, 0, step, KVP_FORMAT_FP32, bt->v[b] + (size_t)t0 * row,
                        bt->k[b] + (size_t)t0 * row, (int64_t)row, slots, ops, nops);
            free(slots);
            free(ops);
        }
        bt->qo[b + 1] = bt->qo[b] + s->q_len[b];
    }
    bt->rows = bt->qo[s->batch];
    size_t qn = (size_t)(bt->rows > 0 ? bt->rows : 1) * (size_t)s->q_heads * (size_t)s->head_dim;
    bt->q = (float *)malloc(qn * 4);
    kvd_fill_normal(&rng, qn, bt->q);
    /* the batch's view: the table's export */
    int64_t num_indices = -1, num_slots = -1;
    assert_int_equal(kvp_table_export_size(bt->pg.table, bt->seqs, s->batch, nullptr, &num_indices,
                                           &num_slots), KVP_OK);
    assert_true(num_indices <= pages + s->batch);
    bt->indptr = (int32_t *)malloc((size_t)(s->batch + 1) * 4);
    bt->indices = (int32_t *)malloc((size_t)(num_indices > 0 ? num_indices : 1) * 4);
    bt->last = (int32_t *)malloc((size_t)s->batch * 4);
    kvp_batch_buffers_t buf;
    memset(&buf, 0, sizeof buf);
    buf.struct_size = sizeof buf;
    buf.indptr = bt->indptr;
    buf.indices = bt->indices;
    buf.last_page_len = bt->last;
    buf.indices_capacity = num_indices;
    bt->view.struct_size = sizeof bt->view;
    int rc = kvp_table_export(bt->pg.table, bt->seqs, s->batch, nullptr, &buf, &bt->view);
    if (rc != KVP_OK) print_error("export: %s\n", kvp_table_last_error(bt->pg.table));
    assert_int_equal(rc, KVP_OK);
    kvd_keys_free(&keys);
}

static void batch_free(batch *bt) {
    for (int32_t b = 0; b < bt->spec.batch; b++) {
        free(bt->k[b]);
        free(bt->v[b]);
    }
    free(bt->seqs);
    free(bt->k);
    free(bt->v);
    free(bt->q);
    free(bt->qo);
    free(bt->indptr);
    free(bt->indices);
    free(bt->last);
    paging_free(&bt->pg);
    twin_free(&bt->t);
}

typedef struct {
    int32_t causal, window_left, dtype;
    float soft_cap;
} attn_opts;

static const attn_opts plain_opts = {1, -1, KVP_FORMAT_FP32, 0.0f};

static kvp_ctx_t *cpu_ctx(void) {
    kvp_ctx_params_t cp;
    kvp_ctx_params_init(&cp);
    cp.isa = KVP_ISA_PORTABLE; /* exact decode, fp32: the reference */
    kvp_ctx_t *c = nullptr;
    char err[KVP_ERR_SIZE];
    assert_int_equal(kvp_ctx_create(&cp, &c, err, sizeof err), KVP_OK);
    return c;
}

static kvp_ctx_t *gpu_ctx(uint64_t workspace) {
    kvp_ctx_params_t cp;
    kvp_ctx_params_init(&cp);
    cp.workspace_bytes = workspace;
    kvp_ctx_t *c = nullptr;
    char err[KVP_ERR_SIZE] = "";
    int rc = kvp_cuda_ctx_create(&cp, NULL, &c, err, sizeof err);
    if (rc != KVP_OK) print_error("cuda ctx: %s\n", err);
    assert_int_equal(rc, KVP_OK);
    kvp_ctx_info_t info = ctx_info(c);
    assert_int_equal(info.backend, KVP_BACKEND_CUDA);
    assert_int_equal(info.isa, -1);
    return c;
}

/* Run on one backend: out / lse as fp32 host arrays, checked fully written. */
static void run_attention(kvp_ctx_t *c, batch *bt, bool gpu, const attn_opts *o, float *out,
                          float *lse) {
    const batch_spec *s = &bt->spec;
    size_t n = (size_t)bt->rows * (size_t)s->q_heads * (size_t)s->head_dim;
    size_t nl = (size_t)bt->rows * (size_t)s->q_heads;
    size_t es = o->dtype == KVP_FORMAT_FP32 ? 4 : 2;
    uint8_t *qh = as_dtype(bt->q, n, o->dtype);
    uint8_t *oh = (uint8_t *)malloc(n * es + 1);
    float *lh = (float *)malloc(nl * 4 + 4);
    memset(oh, 0xFF, n * es); /* NaN in every dtype */
    for (size_t i = 0; i < nl; i++) lh[i] = NAN;
    void *qd = nullptr, *od = nullptr, *ld = nullptr;
    kvp_attention_params_t ap;
    kvp_attention_params_init(&ap);
    ap.layer = 1;
    ap.q_heads = s->q_heads;
    ap.dtype = o->dtype;
    ap.causal = o->causal;
    ap.window_left = o->window_left;
    ap.logit_soft_cap = o->soft_cap;
    ap.sm_scale = (float)bt->sm_scale;
    ap.qo_indptr = bt->qo;
    if (gpu) {
        qd = dev_copy(qh, n * es);
        od = dev_copy(oh, n * es);
        ld = dev_copy(lh, nl * 4);
        ap.q = qd;
        ap.out = od;
        ap.lse = lse ? (float *)ld : nullptr;
    } else {
        ap.q = qh;
        ap.out = oh;
        ap.lse = lse ? lh : nullptr;
    }
    int rc = kvp_attention(c, gpu ? bt->t.gpu : bt->t.cpu, &bt->view, &ap);
    if (rc != KVP_OK) print_error("attention (%s): %s\n", gpu ? "cuda" : "cpu", kvp_ctx_last_error(c));
    assert_int_equal(rc, KVP_OK);
    if (gpu) {
        to_host(oh, od, n * es);
        to_host(lh, ld, nl * 4);
        cudaFree(qd);
        cudaFree(od);
        cudaFree(ld);
    }
    for (size_t i = 0; i < n; i++) {
        float x;
        if (es == 4) {
            memcpy(&x, oh + 4 * i, 4);
        } else {
            uint16_t h;
            memcpy(&h, oh + 2 * i, 2);
            x = o->dtype == KVP_FORMAT_BF16 ? kvp__bf16_to_f32(h) : kvp__f16_to_f32(h);
        }
        if (!isfinite(x)) print_error("%s output %zu not written (%g)\n", gpu ? "cuda" : "cpu", i, (double)x);
        assert_true(isfinite(x));
        out[i] = x;
    }
    if (lse != nullptr) {
        for (size_t i = 0; i < nl; i++) assert_true(isfinite(lh[i]));
        memcpy(lse, lh, nl * 4);
    }
    free(qh);
    free(oh);
    free(lh);
}

static double rel_diff(const float *a, const float *ref, size_t n) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        double e = (double)a[i] - (double)ref[i];
        num += e * e;
        den += (double)ref[i] * (double)ref[i];
    }
    return den > 0.0 ? sqrt(num / den) : sqrt(num);
}

static double ref_bound(int32_t f) {
    switch (f) { /* tests/test_attention.c's bounds vs float64 */
    case KVP_FORMAT_FP32: return 1e-5;
    case KVP_FORMAT_FP16: return 2.5e-3;
    case KVP_FORMAT_BF16: return 2e-2;
    case KVP_FORMAT_INT8: return 1.5e-2;
    case KVP_FORMAT_INT4:
    case KVP_FORMAT_INT4_V1: return 0.16;
    default: return 0.3;
    }
}

/* Tiles with fp16-rounded dequantized values: int8/int4 keys, int4 values. */
static double tolerance(int32_t kf, int32_t vf) {
    bool rounded = kf == KVP_FORMAT_INT8 || KVP__IS_INT4(kf) || KVP__IS_INT4(vf);
    return rounded ? TOL_F16 : TOL_EXACT;
}

typedef struct {
    double vs_cpu, vs_ref;
    double lse; /* largest |lse difference| / (1 + |lse|) */
} attn_result;

/* GPU vs CPU (and vs the float64 reference) for one batch and options. */
static attn_result compare_batch(batch *bt, kvp_ctx_t *cc, kvp_ctx_t *gc, const attn_opts *o,
                                 bool check_lse) {
    const batch_spec *s = &bt->spec;
    size_t n = (size_t)bt->rows * (size_t)s->q_heads * (size_t)s->head_dim;
    size_t nl = (size_t)bt->rows * (size_t)s->q_heads;
    float *co = (float *)malloc(n * 4 + 4), *go = (float *)malloc(n * 4 + 4);
    float *cl = (float *)malloc(nl * 4 + 4), *gl = (float *)malloc(nl * 4 + 4);
    run_attention(cc, bt, false, o, co, check_lse ? cl : nullptr);
    run_attention(gc, bt, true, o, go, check_lse ? gl : nullptr);
    attn_result r;
    r.vs_cpu = rel_diff(go, co, n);
    r.lse = 0.0;
    if (check_lse)
        for (size_t i = 0; i < nl; i++) {
            double e = fabs((double)gl[i] - (double)cl[i]) / (1.0 + fabs((double)cl[i]));
            r.lse = e > r.lse ? e : r.lse;
        }
    /* float64 reference over the whole batch */
    double *ref = (double *)malloc(n * 8 + 8);
    kvd_attn a = {s->q_heads, s->kv_heads, s->head_dim, (double)(float)bt->sm_scale, (double)o->soft_cap,
                  o->causal, o->window_left};
    size_t per = (size_t)s->q_heads * (size_t)s->head_dim;
    for (int32_t b = 0; b < s->batch; b++)
        if (s->q_len[b] > 0)
            kvd_reference(&a, bt->q + (size_t)bt->qo[b] * per, s->q_len[b], bt->k[b], bt->v[b],
                          s->kv_len[b], ref + (size_t)bt->qo[b] * per);
    r.vs_ref = kvd_rel_l2(go, ref, n);
    free(ref);
    free(co);
    free(go);
    free(cl);
    free(gl);
    return r;
}

static void check_batch(const batch_spec *s, kvp_ctx_t *cc, kvp_ctx_t *gc, const attn_opts *o,
                        const char *label) {
    batch bt;
    batch_build(&bt, s);
    attn_result r = compare_batch(&bt, cc, gc, o, true);
    double tol = tolerance(s->k_format, s->v_format);
    double rb = ref_bound(s->k_format) > ref_bound(s->v_format) ? ref_bound(s->k_format)
                                                                 : ref_bound(s->v_format);
    if (o->dtype == KVP_FORMAT_BF16) tol += 4e-3; /* out and q in bf16: 8 bits */
    else if (o->dtype == KVP_FORMAT_FP16) tol += 5e-4;
    if (o->dtype == KVP_FORMAT_BF16) rb += 1e-2;
    bool ok = r.vs_cpu < tol && r.vs_ref < 1.5 * rb && r.lse < tol;
    if (!ok || getenv("KVP_TEST_VERBOSE"))
        print_message("  %-8s K %-8s V %-8s D %3d P %2d: vs cpu %.2e (tol %.1e), lse %.2e, vs f64 %.2e\n",
                      label, kvp_format_name(s->k_format), kvp_format_name(s->v_format),
                      (int)s->head_dim, (int)s->page_size, r.vs_cpu, tol, r.lse, r.vs_ref);
    assert_true(ok);
    batch_free(&bt);
}

/* Every K and V format (both key orders for plain keys), including mixed pairs. */
static void test_attention_formats(void **state) {
    (void)state;
    kvp_ctx_t *cc = cpu_ctx(), *gc = gpu_ctx(0);
    int32_t kv_len[] = {93, 40}, q_len[] = {1, 2};
    for (int32_t f = 0; f < KVP_FORMAT_COUNT; f++)
        for (int32_t order = 0; order < 2; order++) {
            if (order == 1 && (f == KVP_FORMAT_INT8 || KVP__IS_INT4(f))) continue;
            batch_spec s = {2, 8, 64, 16, f, f, order, 2, kv_len, q_len, 300 + (uint64_t)f};
            check_batch(&s, cc, gc, &plain_opts, "format");
        }
    static const int32_t pairs[][3] = {
        {KVP_FORMAT_INT8, KVP_FORMAT_INT4, 0},  {KVP_FORMAT_INT4, KVP_FORMAT_INT8, 1},
        {KVP_FORMAT_FP16, KVP_FORMAT_INT8, 1},  {KVP_FORMAT_INT8, KVP_FORMAT_FP8_E4M3, 0},
        {KVP_FORMAT_BF16, KVP_FORMAT_FP32, 0},  {KVP_FORMAT_FP8_E4M3, KVP_FORMAT_BF16, 1},
        {KVP_FORMAT_INT4, KVP_FORMAT_FP16, 0},  {KVP_FORMAT_FP16, KVP_FORMAT_INT4, 1},
        {KVP_FORMAT_INT8, KVP_FORMAT_INT4_V1, 0}, {KVP_FORMAT_INT4_V1, KVP_FORMAT_INT4, 0},
    };
    for (size_t i = 0; i < sizeof pairs / sizeof *pairs; i++) {
        batch_spec s = {2, 4, 64, 8, pairs[i][0], pairs[i][1], pairs[i][2], 2, kv_len, q_len, 320 + i};
        check_batch(&s, cc, gc, &plain_opts, "mixed");
    }
    kvp_ctx_destroy(cc);
    kvp_ctx_destroy(gc);
}

/* Every head_dim x page size (1/8/16/32/64), fp16 and the integer formats. */
static void test_attention_shapes(void **state) {
    (void)state;
    static const int32_t dims[] = {64, 80, 96, 128, 256};
    static const int32_t pages[] = {1, 8, 16, 32, 64};
    static const int32_t fmts[] = {KVP_FORMAT_FP16, KVP_FORMAT_INT8, KVP_FORMAT_INT4};
    kvp_ctx_t *cc = cpu_ctx(), *gc = gpu_ctx(0);
    for (size_t d = 0; d < 5; d++)
        for (size_t p = 0; p < 5; p++)
            for (size_t f = 0; f < 3; f++) {
                if (KVP__IS_INT4(fmts[f]) && pages[p] % 2 != 0) continue;
                int32_t kv_len = pages[p] > 8 ? 2 * pages[p] + 5 : 3 * pages[p] + 5, q_len = 2;
                batch_spec s = {1, 2, dims[d], pages[p], fmts[f], fmts[f], (int32_t)((d + p) % 2), 1,
                                &kv_len, &q_len, 400 + d * 10 + p};
                check_batch(&s, cc, gc, &plain_opts, "shape");
            }
    kvp_ctx_destroy(cc);
    kvp_ctx_destroy(gc);
}

/* Page sizes the 16-byte loaders do not cover (element-wise fallback), in
 * whole-page tiles (P <= 32) and in chunks of a page (P > 32), with a
 * sliding window that skips chunks. */
static void test_attention_odd_pages(void **state) {
    (void)state;
    static const struct {
        int32_t kf, vf, order, P, D;
    } cases[] = {
        {KVP_FORMAT_INT8, KVP_FORMAT_INT8, 0, 50, 64},     {KVP_FORMAT_INT4, KVP_FORMAT_INT4, 0, 36, 80},
        {KVP_FORMAT_INT4, KVP_FORMAT_INT8, 0, 6, 64},      {KVP_FORMAT_FP16, KVP_FORMAT_FP8_E4M3, 1, 3, 96},
        {KVP_FORMAT_FP32, KVP_FORMAT_BF16, 1, 42, 64},     {KVP_FORMAT_FP8_E4M3, KVP_FORMAT_INT4, 1, 40, 128},
        {KVP_FORMAT_BF16, KVP_FORMAT_INT8, 1, 5, 256},
    };
    kvp_ctx_t *cc = cpu_ctx(), *gc = gpu_ctx(0);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int32_t kv_len[] = {3 * cases[i].P + 7, 2 * cases[i].P}, q_len[] = {3, 1};
        batch_spec s = {1, 2, cases[i].D, cases[i].P, cases[i].kf, cases[i].vf, cases[i].order, 2,
                        kv_len, q_len, 800 + i};
        check_batch(&s, cc, gc, &plain_opts, "odd page");
        attn_opts w = {1, cases[i].P / 2 + 3, KVP_FORMAT_FP32, 0.0f};
        check_batch(&s, cc, gc, &w, "window");
    }
    kvp_ctx_destroy(cc);
    kvp_ctx_destroy(gc);
}

/* Ragged batches (chunked prefill, decode, speculative rows, a one-token
 * sequence, one across hundreds of pages), GQA 1/4/8 and MQA; split-KV on
 * (the simulator's 132 SMs want splits for any small batch) and off (a
 * workspace too small for partials). int4 values (with int8 keys: staged
 * values in a partly filled page) leave the rotated basis in the merge
 * kernel with splits, in the attention kernel without. */
static void test_attention_ragged_and_splits(void **state) {
    (void)state;
    static const int32_t groups[][4] = {{4, 4, KVP_FORMAT_FP16, KVP_FORMAT_FP16},
                                        {2, 8, KVP_FORMAT_INT8, KVP_FORMAT_INT8},
                                        {1, 8, KVP_FORMAT_FP16, KVP_FORMAT_FP16},
                                        {4, 32, KVP_FORMAT_INT8, KVP_FORMAT_INT8},
                                        {2, 8, KVP_FORMAT_INT8, KVP_FORMAT_INT4}};
    int32_t kv_len[] = {1, 7, 130, 1603, 33};
    int32_t q_len[] = {1, 7, 5, 1, 16};
    kvp_ctx_t *cc = cpu_ctx(), *split = gpu_ctx(0), *nosplit = gpu_ctx(4096);
    for (size_t g = 0; g < sizeof groups / sizeof groups[0]; g++) {
        const int32_t f = groups[g][2], vf = groups[g][3];
        batch_spec s = {groups[g][0], groups[g][1], 64, 8, f, vf, 0, 5, kv_len, q_len, 500 + g};
        batch bt;
        batch_build(&bt, &s);
        attn_result a = compare_batch(&bt, cc, split, &plain_opts, true);
        attn_result b = compare_batch(&bt, cc, nosplit, &plain_opts, true);
        double tol = tolerance(f, vf), rb = ref_bound(f) > ref_bound(vf) ? ref_bound(f) : ref_bound(vf);
        if (getenv("KVP_TEST_VERBOSE") || !(a.vs_cpu < tol && b.vs_cpu < tol && a.lse < tol && b.lse < tol))
            print_message("  kv %d q %d K %s V %s: split %.2e (lse %.2e), no split %.2e (lse %.2e)\n",
                          (int)groups[g][0], (int)groups[g][1], kvp_format_name(f), kvp_format_name(vf),
                          a.vs_cpu, a.lse, b.vs_cpu, b.lse);
        assert_true(a.vs_cpu < tol && a.lse < tol);
        assert_true(b.vs_cpu < tol && b.lse < tol);
        assert_true(a.vs_ref < rb && b.vs_ref < rb);
        batch_free(&bt);
    }
    kvp_ctx_destroy(cc);
    kvp_ctx_destroy(split);
    kvp_ctx_destroy(nosplit);
}

/* Causal off, sliding windows (with splits that see nothing), soft cap,
 * fp16 / bf16 / fp32 q and out, lse. */
static void test_attention_options(void **state) {
    (void)state;
    int32_t kv_len[] = {290, 300, 17};
    int32_t q_len[] = {4, 1, 17};
    static const attn_opts opts[] = {
        {0, -1, KVP_FORMAT_FP32, 0.0f},  {1, 20, KVP_FORMAT_FP32, 0.0f},
        {1, 0, KVP_FORMAT_FP32, 0.0f},   {1, -1, KVP_FORMAT_FP32, 5.0f},
        {1, 60, KVP_FORMAT_FP16, 30.0f}, {0, 7, KVP_FORMAT_BF16, 0.0f},
        {1, -1, KVP_FORMAT_FP16, 0.0f},
    };
    kvp_ctx_t *cc = cpu_ctx(), *gc = gpu_ctx(0);
    for (size_t i = 0; i < sizeof opts / sizeof *opts; i++) {
        int32_t f = i % 3 == 2 ? KVP_FORMAT_INT4 : i % 3 == 1 ? KVP_FORMAT_INT8 : KVP_FORMAT_FP16;
        batch_spec s = {2, 4, 64, 16, f, f, 0, 3, kv_len, q_len, 600 + i};
        check_batch(&s, cc, gc, &opts[i], "options");
    }
    kvp_ctx_destroy(cc);
    kvp_ctx_destroy(gc);
}

/* The copy pipeline (kvp_cuda_ctx_set_pipeline): taken where pages fit a
 * tile, and its results are the single-buffer loader's bit for bit (the
 * same arithmetic on the same tile values: plain pages read where they
 * landed, quantized ones decoded from shared memory instead of device
 * memory), for every loader: plain token- and dim-major, fp8, int8 and int4
 * (with outliers) through the 16-byte loaders, page sizes only the
 * element-wise loader covers, the staging page, windows that skip tiles,
 * splits, GQA groups up to 8 rows. */
static void test_attention_pipeline(void **state) {
    (void)state;
    static const struct {
        int32_t kf, vf, order, P, D, kv_heads, q_heads;
    } cases[] = {
        {KVP_FORMAT_FP16, KVP_FORMAT_FP16, 0, 16, 128, 2, 16},   /* read in place, GQA 8 */
        {KVP_FORMAT_FP16, KVP_FORMAT_FP16, 1, 16, 64, 2, 8},     /* dim-major keys decoded */
        {KVP_FORMAT_BF16, KVP_FORMAT_BF16, 0, 1, 64, 1, 2},      /* 32 pages a tile */
        {KVP_FORMAT_FP32, KVP_FORMAT_FP32, 0, 16, 256, 1, 4},    /* one page a tile (TT 16) */
        {KVP_FORMAT_FP8_E4M3, KVP_FORMAT_FP8_E4M3, 0, 8, 128, 2, 4},
        {KVP_FORMAT_INT8, KVP_FORMAT_INT8, 0, 16, 128, 2, 8},
        {KVP_FORMAT_INT4, KVP_FORMAT_INT4, 0, 32, 128, 1, 4},    /* int4 keys' outliers */
        {KVP_FORMAT_INT4_V1, KVP_FORMAT_INT4_V1, 0, 16, 128, 1, 4}, /* ... fewer of them */
        {KVP_FORMAT_INT4, KVP_FORMAT_INT4, 0, 4, 256, 2, 4},     /* 32 outliers, 4 pages a tile */
        {KVP_FORMAT_INT8, KVP_FORMAT_INT4, 0, 8, 80, 2, 2},
        {KVP_FORMAT_INT4, KVP_FORMAT_FP16, 0, 16, 96, 1, 1},
        {KVP_FORMAT_INT8, KVP_FORMAT_INT8, 0, 6, 64, 1, 2},      /* element-wise loader */
        {KVP_FORMAT_FP16, KVP_FORMAT_FP8_E4M3, 1, 3, 96, 1, 2},  /* element-wise, dim-major */
        {KVP_FORMAT_BF16, KVP_FORMAT_INT8, 1, 5, 256, 1, 1},
    };
    /* gn: no workspace, no splits (the split count follows each kernel's
     * occupancy, and so would the rounding); gc: splits */
    kvp_ctx_t *cc = cpu_ctx(), *gc = gpu_ctx(0), *gn = gpu_ctx(4096);
    assert_int_equal(kvp_cuda_ctx_set_pipeline(gc, 2), KVP_EINVAL);
    assert_non_null(strstr(kvp_ctx_last_error(gc), "0 or 1"));
    assert_int_equal(kvp_cuda_ctx_set_pipeline(gc, -1), KVP_EINVAL);
    assert_int_equal(kvp_cuda_ctx_set_pipeline(cc, 1), KVP_EINVAL);
    assert_int_equal(kvp_cuda_ctx_set_pipeline(nullptr, 1), KVP_EINVAL);
    const kvp__cuda_ctx *x = kvp__cctx(gn);
    assert_true(x->pipeline); /* on by default */
    static const attn_opts window = {1, 40, KVP_FORMAT_FP32, 0.0f};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const int32_t P = cases[i].P;
        int32_t kv_len[] = {300 + P / 2, 2 * P + 1, 3 * P + 2}, q_len[] = {1, 1, 1};
        batch_spec s = {cases[i].kv_heads, cases[i].q_heads, cases[i].D, P, cases[i].kf, cases[i].vf,
                        cases[i].order, 3, kv_len, q_len, 1700 + i};
        batch bt;
        batch_build(&bt, &s);
        const size_t n = (size_t)bt.rows * (size_t)s.q_heads * (size_t)s.head_dim;
        const size_t nl = (size_t)bt.rows * (size_t)s.q_heads;
        /* int8 / int4 keys take the integer path where a tile holds at most 8 pages */
        const bool kint = (s.k_format == KVP_FORMAT_INT8 || KVP__IS_INT4(s.k_format)) &&
                          P >= (s.head_dim >= 256 ? 2 : 4);
        for (int o = 0; o < 2; o++) {
            const attn_opts *opt = o == 0 ? &plain_opts : &window;
            float *a = (float *)malloc(n * 4), *b = (float *)malloc(n * 4);
            float *la = (float *)malloc(nl * 4), *lb = (float *)malloc(nl * 4);
            assert_int_equal(kvp_cuda_ctx_set_pipeline(gn, 1), KVP_OK);
            run_attention(gn, &bt, true, opt, a, la);
            assert_true(x->last_pipe);
            assert_true(x->last_stages == 2 || x->last_stages == 3);
            assert_true(x->last_kint == kint);
            assert_int_equal(kvp_cuda_ctx_set_pipeline(gn, 0), KVP_OK);
            run_attention(gn, &bt, true, opt, b, lb);
            assert_false(x->last_pipe);
            if (kint) { /* integer dot products against the quantized query: within tolerance */
                const double e = rel_diff(a, b, n);
                if (e > TOL_F16 || getenv("KVP_TEST_VERBOSE"))
                    print_message("  pipeline case %zu (options %d): integer keys vs fp16 tiles %.2e\n", i, o, e);
                assert_true(e <= TOL_F16);
            } else {
                if (memcmp(a, b, n * 4) != 0 || memcmp(la, lb, nl * 4) != 0)
                    print_error("pipeline case %zu (options %d): results differ from the single-buffer "
                                "loader\n", i, o);
                assert_memory_equal(a, b, n * 4);
                assert_memory_equal(la, lb, nl * 4);
            }
            free(a);
            free(b);
            free(la);
            free(lb);
        }
        /* and right against the CPU, with splits and a window */
        check_batch(&s, cc, gc, &plain_opts, "pipeline");
        assert_true(kvp__cctx(gc)->last_pipe);
        check_batch(&s, cc, gc, &window, "pipeline");
        batch_free(&bt);
    }
    /* pages larger than a tile: the single-buffer loader */
    int32_t kv_len[] = {150}, q_len[] = {1};
    batch_spec big = {1, 2, 128, 64, KVP_FORMAT_FP16, KVP_FORMAT_FP16, 0, 1, kv_len, q_len, 1790};
    check_batch(&big, cc, gc, &plain_opts, "pipeline");
    assert_false(kvp__cctx(gc)->last_pipe);
    kvp_ctx_destroy(cc);
    kvp_ctx_destroy(gc);
    kvp_ctx_destroy(gn);
}

/* ---- streams, errors, bad input ------------------------------------------------------------------ */

static void test_streams(void **state) {
    (void)state;
    cudaStream_t s1, s2;
    assert_int_equal(cudaStreamCreate(&s1), cudaSuccess);
    assert_int_equal(cudaStreamCreate(&s2), cudaSuccess);
    int32_t kv_len[] = {70}, q_len[] = {2};
    batch_spec s = {2, 4, 64, 16, KVP_FORMAT_INT8, KVP_FORMAT_FP16, 0, 1, kv_len, q_len, 700};
    batch bt;
    batch_build(&bt, &s);
    kvp_ctx_t *gc = gpu_ctx(0);
    size_t n = (size_t)bt.rows * 4 * 64;
    float *a = (float *)malloc(n * 4), *b = (float *)malloc(n * 4);
    run_attention(gc, &bt, true, &plain_opts, a, nullptr);
    /* the same on two other streams, switching the store's and the context's */
    assert_int_equal(kvp_cuda_store_set_stream(bt.t.gpu, s1), KVP_OK);
    assert_int_equal(kvp_cuda_ctx_set_stream(gc, s2), KVP_OK);
    run_attention(gc, &bt, true, &plain_opts, b, nullptr);
    assert_memory_equal(a, b, n * 4);
    void *q = dev_copy(bt.q, n * 4), *o = dev_alloc(n * 4);
    kvp_attention_params_t ap;
    kvp_attention_params_init(&ap);
    ap.layer = 1;
    ap.q_heads = 4;
    ap.sm_scale = (float)bt.sm_scale;
    ap.qo_indptr = bt.qo;
    ap.q = q;
    ap.out = o;
    /* the context on the store's stream s1: set, then the generic call */
    assert_int_equal(kvp_cuda_ctx_set_stream(gc, s1), KVP_OK);
    assert_int_equal(kvp_attention(gc, bt.t.gpu, &bt.view, &ap), KVP_OK);
    assert_int_equal(cudaStreamSynchronize(s1), cudaSuccess);
    to_host(b, o, n * 4);
    assert_memory_equal(a, b, n * 4);
    /* the stream setters on a CPU store or context say so */
    assert_int_equal(kvp_cuda_store_set_stream(bt.t.cpu, s1), KVP_EINVAL);
    assert_non_null(strstr(kvp_store_last_error(bt.t.cpu), "not a CUDA store"));
    kvp_ctx_t *cc = cpu_ctx();
    assert_int_equal(kvp_cuda_ctx_set_stream(cc, s1), KVP_EINVAL);
    assert_true(strlen(kvp_ctx_last_error(cc)) > 0);
    kvp_ctx_destroy(cc);
    assert_int_equal(kvp_cuda_store_set_stream(bt.t.gpu, nullptr), KVP_OK);
    assert_int_equal(kvp_cuda_ctx_set_stream(gc, nullptr), KVP_OK);
    cudaFree(q);
    cudaFree(o);
    free(a);
    free(b);
    kvp_ctx_destroy(gc);
    batch_free(&bt);
    assert_int_equal(cudaStreamDestroy(s1), cudaSuccess);
    assert_int_equal(cudaStreamDestroy(s2), cudaSuccess);
}

/* kvp_cuda_ctx_set_timing / kvp_cuda_ctx_kernel_time: what they return, never
 * a duration (the simulator does not model time). */
static void test_kernel_timing(void **state) {
    (void)state;
    int32_t kv_len[] = {600, 40}, q_len[] = {1, 1};
    batch_spec s = {2, 4, 64, 16, KVP_FORMAT_FP16, KVP_FORMAT_INT8, 0, 2, kv_len, q_len, 710};
    batch bt;
    batch_build(&bt, &s);
    kvp_ctx_t *gc = gpu_ctx(0), *nosplit = gpu_ctx(4096), *cc = cpu_ctx();
    size_t n = (size_t)bt.rows * 4 * 64;
    float *a = (float *)malloc(n * 4), *b = (float *)malloc(n * 4);
    assert_true(a && b);
    double sec = -1.0;
    /* bad arguments, other contexts */
    assert_int_equal(kvp_cuda_ctx_set_timing(nullptr, 1), KVP_EINVAL);
    assert_int_equal(kvp_cuda_ctx_kernel_time(nullptr, &sec), KVP_EINVAL);
    assert_int_equal(kvp_cuda_ctx_set_timing(gc, 2), KVP_EINVAL);
    assert_non_null(strstr(kvp_ctx_last_error(gc), "enable"));
    assert_int_equal(kvp_cuda_ctx_set_timing(gc, -1), KVP_EINVAL);
    assert_int_equal(kvp_cuda_ctx_kernel_time(gc, nullptr), KVP_EINVAL);
    assert_int_equal(kvp_cuda_ctx_set_timing(cc, 1), KVP_EINVAL);
    assert_non_null(strstr(kvp_ctx_last_error(cc), "not a CUDA context"));
    assert_int_equal(kvp_cuda_ctx_kernel_time(cc, &sec), KVP_EINVAL);
    /* nothing timed yet: timing off, then on without a call */
    assert_int_equal(kvp_cuda_ctx_kernel_time(gc, &sec), KVP_ESTATE);
    assert_non_null(strstr(kvp_ctx_last_error(gc), "timing is off"));
    run_attention(gc, &bt, true, &plain_opts, a, nullptr); /* untimed */
    assert_int_equal(kvp_cuda_ctx_kernel_time(gc, &sec), KVP_ESTATE);
    assert_int_equal(kvp_cuda_ctx_set_timing(gc, 1), KVP_OK);
    assert_int_equal(kvp_cuda_ctx_kernel_time(gc, &sec), KVP_ESTATE);
    assert_non_null(strstr(kvp_ctx_last_error(gc), "no attention call"));
    assert_true(sec == -1.0);
    /* a timed call (split: attention and merge kernels), the same results */
    run_attention(gc, &bt, true, &plain_opts, b, nullptr);
    assert_memory_equal(a, b, n * 4);
    assert_int_equal(kvp_cuda_ctx_kernel_time(gc, &sec), KVP_OK);
    assert_true(isfinite(sec) && sec >= 0.0);
    sec = -1.0;
    assert_int_equal(kvp_cuda_ctx_kernel_time(gc, &sec), KVP_OK); /* readable again */
    assert_true(isfinite(sec) && sec >= 0.0);
    assert_int_equal(kvp_cuda_ctx_set_timing(gc, 1), KVP_OK); /* on again: a fresh start */
    assert_int_equal(kvp_cuda_ctx_kernel_time(gc, &sec), KVP_ESTATE);
    /* one kernel (no split), on another stream */
    cudaStream_t st;
    assert_int_equal(cudaStreamCreate(&st), cudaSuccess);
    assert_int_equal(kvp_cuda_ctx_set_timing(nosplit, 1), KVP_OK);
    assert_int_equal(kvp_cuda_ctx_set_stream(nosplit, st), KVP_OK);
    run_attention(nosplit, &bt, true, &plain_opts, b, nullptr);
    sec = -1.0;
    assert_int_equal(kvp_cuda_ctx_kernel_time(nosplit, &sec), KVP_OK);
    assert_true(isfinite(sec) && sec >= 0.0);
    /* off: the last timed call stays readable until an untimed one */
    assert_int_equal(kvp_cuda_ctx_set_timing(nosplit, 0), KVP_OK);
    assert_int_equal(kvp_cuda_ctx_kernel_time(nosplit, &sec), KVP_OK);
    run_attention(nosplit, &bt, true, &plain_opts, b, nullptr);
    assert_int_equal(kvp_cuda_ctx_kernel_time(nosplit, &sec), KVP_ESTATE);
    assert_non_null(strstr(kvp_ctx_last_error(nosplit), "timing is off"));
    assert_int_equal(kvp_cuda_ctx_set_stream(nosplit, nullptr), KVP_OK);
    assert_int_equal(cudaStreamDestroy(st), cudaSuccess);
    free(a);
    free(b);
    kvp_ctx_destroy(gc);
    kvp_ctx_destroy(nosplit);
    kvp_ctx_destroy(cc);
    batch_free(&bt);
}

/* An error the engine has pending from its own CUDA work (the runtime's
 * last error) is neither blamed on a library call nor cleared by it: the
 * calls succeed, and the engine's cudaGetLastError() still reports it. */
static void test_pending_error_untouched(void **state) {
    (void)state;
    int32_t kv_len[] = {600, 40}, q_len[] = {1, 1};
    batch_spec s = {2, 4, 64, 16, KVP_FORMAT_FP16, KVP_FORMAT_INT4, 0, 2, kv_len, q_len, 730};
    batch bt;
    kvp_ctx_t *gc = gpu_ctx(0);
    (void)cudaGetLastError();
    size_t n = 0;
    float *a = nullptr, *b = nullptr;
    /* pending while the store is built and written (append kernels) */
    int ndev = 0;
    assert_int_equal(cudaGetDeviceCount(&ndev), cudaSuccess);
    assert_int_equal(cudaSetDevice(ndev + 7), cudaErrorInvalidDevice);
    batch_build(&bt, &s);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidDevice);
    assert_int_equal(cudaGetLastError(), cudaSuccess);
    n = (size_t)bt.rows * 4 * 64;
    a = (float *)malloc(n * 4);
    b = (float *)malloc(n * 4);
    assert_true(a && b);
    /* pending across attention: the first call (occupancy query, attention
     * and merge kernels) and a later one */
    for (int i = 0; i < 2; i++) {
        assert_int_equal(cudaSetDevice(ndev + 7), cudaErrorInvalidDevice);
        run_attention(gc, &bt, true, &plain_opts, i ? b : a, nullptr);
        assert_int_equal(cudaGetLastError(), cudaErrorInvalidDevice);
        assert_int_equal(cudaGetLastError(), cudaSuccess);
    }
    assert_memory_equal(a, b, n * 4);
    free(a);
    free(b);
    kvp_ctx_destroy(gc);
    batch_free(&bt);
}

/* Split-KV sizing aims at SMs x the CTAs of the kernel variant one SM holds
 * (cudaOccupancyMaxActiveBlocksPerMultiprocessor, asked once per context
 * and variant), not a fixed count. */
template <int D, int R>
static void check_occupancy(int32_t kf, int32_t vf, int32_t q_heads, int32_t kv_heads) {
    int32_t kv_len[] = {600, 40}, q_len[] = {1, 1};
    batch_spec s = {kv_heads, q_heads, D, 16, kf, vf, 0, 2, kv_len, q_len, 720 + (uint64_t)D + R};
    kvp_ctx_t *gc = gpu_ctx(0), *cc = cpu_ctx();
    check_batch(&s, cc, gc, &plain_opts, "occupancy");
    using namespace kvp_attn;
    const kvp__cuda_ctx *x = kvp__cctx(gc);
    /* pages of 16 fit a tile: the copy pipeline, with its own shared memory */
    assert_true(x->last_pipe);
    assert_true(x->last_smem > 0);
    int n = 0, sms = 0;
    /* the library's kernels (not instances of this file: they would be
     * compiled again here, for every architecture) */
    const dim_kernels &dk = D == 64 ? dims_64 : D == 128 ? dims_128 : dims_256;
    const int ri = R == 1 ? 0 : R == 2 ? 1 : R == 4 ? 2 : 3;
    assert_int_equal(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, dk.pipe_attn[ri], NT,
                                                                   (size_t)x->last_smem),
                     cudaSuccess);
    assert_int_equal(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
    assert_true(n >= 1 && sms >= 1);
    if (x->split_target != (int64_t)sms * n)
        print_error("occupancy D %d R %d: split sizing aimed at %lld CTAs, %d SMs x %d fit\n", D, R,
                    (long long)x->split_target, sms, n);
    assert_true(x->split_target == (int64_t)sms * n);
    /* the single-buffer loader: its own size and occupancy */
    assert_int_equal(kvp_cuda_ctx_set_pipeline(gc, 0), KVP_OK);
    check_batch(&s, cc, gc, &plain_opts, "occupancy");
    const int32_t kk = kf == KVP_FORMAT_FP32 ? KIND_F32 : KIND_F16;
    const int32_t vk = vf == KVP_FORMAT_FP32 ? KIND_F32 : KIND_F16;
    assert_false(x->last_pipe);
    assert_int_equal(x->last_smem, smem_plan<D>::bytes(kk, vk, R));
    assert_int_equal(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, dk.attn[ri], NT,
                                                                   (size_t)x->last_smem),
                     cudaSuccess);
    assert_true(x->split_target == (int64_t)sms * n);
    kvp_ctx_destroy(gc);
    kvp_ctx_destroy(cc);
}

static void test_split_occupancy(void **state) {
    (void)state;
    /* (head dimensions 64, 128 and 256: check_occupancy picks their tables) */
    check_occupancy<64, 4>(KVP_FORMAT_FP16, KVP_FORMAT_FP16, 8, 2);
    check_occupancy<128, 1>(KVP_FORMAT_FP32, KVP_FORMAT_INT8, 2, 2);
    check_occupancy<256, 2>(KVP_FORMAT_INT4, KVP_FORMAT_FP32, 4, 2);
}

/* Engine-provided memory: an arena handed over, and a device allocator hook. */
typedef struct {
    int allocs, frees;
    size_t live;
} hook_state;

static void *hook_alloc(void *opaque, size_t size, void *stream) {
    (void)stream;
    hook_state *h = (hook_state *)opaque;
    void *p = nullptr;
    if (cudaMalloc(&p, size) != cudaSuccess) return nullptr;
    h->allocs++;
    h->live += size;
    return p;
}
static void hook_free(void *opaque, void *ptr, size_t size, void *stream) {
    (void)stream;
    hook_state *h = (hook_state *)opaque;
    h->frees++;
    h->live -= size;
    cudaFree(ptr);
}

static void test_engine_memory(void **state) {
    (void)state;
    kvp_store_params_t sp = store_params(2, 2, 64, 16, KVP_FORMAT_INT8, KVP_FORMAT_INT4, 0, 10, 2);
    kvp_layout_t lay;
    memset(&lay, 0, sizeof lay);
    lay.struct_size = sizeof lay;
    char err[KVP_ERR_SIZE] = "";
    assert_int_equal(kvp_layout_compute(2, 2, 64, 16, KVP_FORMAT_INT8, KVP_FORMAT_INT4, &lay, err,
                                        sizeof err),
                     KVP_OK);
    uint64_t need = 0;
    assert_int_equal(kvp_arena_bytes(&lay, 10, 2, &need, err, sizeof err), KVP_OK);
    void *mem = dev_alloc((size_t)need + 512);
    kvp_cuda_params_t cp;
    kvp_cuda_params_init(&cp);
    cp.arena = mem;
    cp.arena_bytes = need - 1;
    kvp_store_t *s = nullptr;
    assert_int_equal(kvp_cuda_store_create(&sp, &cp, &s, err, sizeof err), KVP_EINVAL);
    assert_non_null(strstr(err, "needs"));
    assert_null(s);
    cp.arena = (uint8_t *)mem + 16;
    cp.arena_bytes = need;
    assert_int_equal(kvp_cuda_store_create(&sp, &cp, &s, err, sizeof err), KVP_EINVAL);
    assert_non_null(strstr(err, "aligned"));
    cp.arena = mem;
    assert_int_equal(kvp_cuda_store_create(&sp, &cp, &s, err, sizeof err), KVP_OK);
    kvp_store_info_t info = store_info(s);
    assert_ptr_equal(info.arena, mem);
    assert_true(info.arena_bytes == need);
    assert_int_equal(info.backend, KVP_BACKEND_CUDA);
    assert_int_equal(info.device, 0);
    kvp_region_t r;
    memset(&r, 0, sizeof r);
    r.struct_size = sizeof r;
    assert_int_equal(kvp_store_region(s, 1, KVP_REGION_STAGING_K, &r), KVP_OK);
    assert_true((uint8_t *)r.base > (uint8_t *)mem && (uint8_t *)r.base < (uint8_t *)mem + need);
    kvp_store_destroy(s); /* the engine's memory is not freed */
    assert_int_equal(cudaMemset(mem, 0, (size_t)need), cudaSuccess);
    assert_int_equal(cudaFree(mem), cudaSuccess);

    hook_state h = {0, 0, 0};
    kvp_cuda_params_init(&cp);
    cp.allocator.alloc = hook_alloc;
    cp.allocator.free = hook_free;
    cp.allocator.opaque = &h;
    assert_int_equal(kvp_cuda_store_create(&sp, &cp, &s, err, sizeof err), KVP_OK);
    assert_true(h.allocs >= 2 && h.live >= need);
    kvp_ctx_params_t xp;
    kvp_ctx_params_init(&xp);
    kvp_ctx_t *c = nullptr;
    int before = h.allocs;
    assert_int_equal(kvp_cuda_ctx_create(&xp, &cp, &c, err, sizeof err), KVP_OK);
    assert_true(h.allocs > before);
    kvp_ctx_destroy(c);
    kvp_store_destroy(s);
    assert_true(h.live == 0 && h.frees == h.allocs);
    cp.allocator.free = nullptr;
    assert_int_equal(kvp_cuda_store_create(&sp, &cp, &s, err, sizeof err), KVP_EINVAL);
}

/* ---- block padding: written as zeros, whatever the arena held ---------------------------- */

/* A page's serialization (kvp_store_page_to_host), padding included. */
static uint8_t *page_bytes(kvp_store_t *s, int32_t page, uint64_t bytes) {
    uint8_t *b = (uint8_t *)malloc((size_t)bytes);
    assert_non_null(b);
    assert_int_equal(kvp_store_page_to_host(s, page, 0, b, bytes), KVP_OK);
    assert_int_equal(kvp_store_synchronize(s), KVP_OK);
    return b;
}

/* The engine hands over an arena full of garbage (its own, not the
 * simulator's poison); the CPU store's arena holds the same garbage with
 * zero padding. After appends (rows into pool and staging pages, seals), a
 * COPY and kvp_cuda_quantize, every page written has the CPU's bytes,
 * padding included. */
static void padding_case(int32_t kf, int32_t vf, int32_t P, uint64_t seed) {
    const int32_t layers = 2, H = 2, D = 40, pages = 12, staging = 2;
    kvp_store_params_t sp = store_params(layers, H, D, P, kf, vf, 0, pages, staging);
    twin t;
    memset(&t, 0, sizeof t);
    char err[KVP_ERR_SIZE] = "";
    assert_int_equal(kvp_store_create(&sp, &t.cpu, err, sizeof err), KVP_OK);
    t.lay.struct_size = sizeof t.lay;
    assert_int_equal(kvp_store_layout(t.cpu, &t.lay), KVP_OK);
    assert_true(t.lay.k_block_bytes % KVP_BLOCK_ALIGN == 0);
    t.layers = layers;
    t.H = H;
    t.D = D;
    t.P = P;
    t.num_pages = pages;
    t.num_staging = t.lay.needs_staging ? staging : 0;
    kvp_store_info_t ci = store_info(t.cpu);
    const uint64_t n = ci.arena_bytes, f = t.lay.fixed_bytes;
    uint8_t *garbage = (uint8_t *)malloc((size_t)n);
    assert_non_null(garbage);
    kvd_rng rng;
    kvd_seed(&rng, seed);
    for (uint64_t i = 0; i < n; i++) garbage[i] = (uint8_t)(kvd_next(&rng) >> 56);
    void *mem = dev_copy(garbage, (size_t)n);
    kvp_cuda_params_t cp;
    kvp_cuda_params_init(&cp);
    cp.arena = mem;
    cp.arena_bytes = n;
    assert_int_equal(kvp_cuda_store_create(&sp, &cp, &t.gpu, err, sizeof err), KVP_OK);
    memcpy((uint8_t *)ci.arena + f, garbage + f, (size_t)(n - f));
    uint64_t pad = zero_padding(t.cpu, (uint8_t *)ci.arena);
    /* fp32 / fp16 / bf16 blocks have none (P x D x 2 is a multiple of 16); the others here do */
    assert_true(kvp__format_bits(kf) >= 16 && kvp__format_bits(vf) >= 16 ? pad == 0 : pad > 0);

    paging pg;
    paging_make(&pg, &t, pages, staging);
    int32_t seq = paging_seq(&pg);
    const int32_t want[] = {2 * P + 1, 1, P - 1, 2, 1};
    const int64_t stride = (int64_t)H * D;
    for (size_t step = 0; step < sizeof want / sizeof *want; step++) {
        int32_t rows = want[step], nops = 0;
        int64_t *slots = (int64_t *)malloc((size_t)rows * 8);
        kvp_page_op_t *ops = (kvp_page_op_t *)malloc((size_t)(rows + 1) * sizeof *ops);
        float *k = (float *)malloc((size_t)rows * (size_t)stride * 4);
        float *v = (float *)malloc((size_t)rows * (size_t)stride * 4);
        assert_true(slots && ops && k && v);
        kvd_fill_normal(&rng, (size_t)rows * (size_t)stride, k);
        kvd_fill_normal(&rng, (size_t)rows * (size_t)stride, v);
        paging_append(&pg, seq, rows, 0, slots, ops, rows + 1, &nops);
        for (int32_t layer = 0; layer < layers; layer++)
            twin_append(&t, layer, rows, KVP_FORMAT_FP32, k, v, stride, slots, ops, nops);
        free(slots);
        free(ops);
        free(k);
        free(v);
    }
    int32_t ids[32];
    kvp_seq_info_t si = paging_pages(&pg, seq, ids, 32);
    assert_true(si.num_pages >= 2);
    /* a COPY of the first page to a page no sequence holds */
    int32_t spare = -1;
    for (int32_t p = pages - 1; p >= 0 && spare < 0; p--) {
        bool held = false;
        for (int32_t i = 0; i < si.num_pages; i++) held |= ids[i] == p;
        if (!held) spare = p;
    }
    assert_true(spare >= 0);
    kvp_page_op_t op;
    memset(&op, 0, sizeof op);
    op.kind = KVP_OP_COPY;
    op.src = ids[0];
    op.dst = spare;
    twin_ops(&t, &op, 1);
    ids[si.num_pages] = spare;
    for (int32_t i = 0; i <= si.num_pages; i++) {
        bool stage = ids[i] >= pages;
        uint64_t bytes = stage ? t.lay.staging_page_bytes : t.lay.page_bytes;
        uint8_t *c = page_bytes(t.cpu, ids[i], bytes), *g = page_bytes(t.gpu, ids[i], bytes);
        uint64_t diff = 0, first = 0;
        for (uint64_t j = 0; j < bytes; j++)
            if (c[j] != g[j] && diff++ == 0) first = j;
        if (diff != 0)
            print_error("padding: formats K %s V %s, P %d: page %d (%s): %llu of %llu bytes differ, "
                        "first at %llu (cpu %02x, cuda %02x)\n",
                        kvp_format_name(kf), kvp_format_name(vf), (int)P, (int)ids[i],
                        stage ? "staging" : "pool", (unsigned long long)diff,
                        (unsigned long long)bytes, (unsigned long long)first, c[first], g[first]);
        assert_true(diff == 0);
        free(c);
        free(g);
    }
    paging_free(&pg);
    twin_free(&t);
    assert_int_equal(cudaFree(mem), cudaSuccess);

    /* kvp_cuda_quantize into garbage: the padding of every block is zeros */
    for (int side = 0; side < 2; side++) {
        kvp_quant_desc_t q;
        memset(&q, 0, sizeof q);
        q.struct_size = sizeof q;
        q.format = side ? vf : kf;
        q.is_value = side;
        q.page_size = P;
        q.head_dim = D;
        q.heads = H;
        q.dtype = KVP_FORMAT_FP32;
        q.fp8_scale = 0.25f;
        const int64_t qpages = 2;
        size_t elems = (size_t)qpages * (size_t)P * (size_t)H * (size_t)D;
        float *x = (float *)malloc(elems * 4);
        assert_non_null(x);
        kvd_fill_normal(&rng, elems, x);
        uint64_t block = 0;
        assert_int_equal(kvp_quant_block_bytes(&q, &block, err, sizeof err), KVP_OK);
        size_t bytes = (size_t)(qpages * H) * (size_t)block;
        uint8_t *cpu = (uint8_t *)malloc(bytes), *gpu = (uint8_t *)malloc(bytes);
        assert_true(cpu && gpu);
        memcpy(cpu, garbage, bytes < n ? bytes : (size_t)n);
        uint64_t used = kvp__block_bytes(q.format, !side, (uint64_t)P, (uint64_t)D);
        for (size_t b = 0; b < (size_t)(qpages * H); b++)
            memset(cpu + b * (size_t)block + used, 0, (size_t)(block - used));
        assert_int_equal(kvp_quantize(&q, x, qpages, cpu, err, sizeof err), KVP_OK);
        void *dx = dev_copy(x, elems * 4), *dblk = dev_copy(garbage, bytes < n ? bytes : (size_t)n);
        assert_int_equal(kvp_cuda_quantize(&q, dx, qpages, dblk, nullptr, err, sizeof err), KVP_OK);
        to_host(gpu, dblk, bytes);
        if (memcmp(cpu, gpu, bytes) != 0)
            print_error("padding: kvp_cuda_quantize %s %s, P %d: bytes differ\n",
                        kvp_format_name(q.format), side ? "values" : "keys", (int)P);
        assert_memory_equal(cpu, gpu, bytes);
        assert_int_equal(cudaFree(dx), cudaSuccess);
        assert_int_equal(cudaFree(dblk), cudaSuccess);
        free(x);
        free(cpu);
        free(gpu);
    }
    free(garbage);
}

static void test_block_padding(void **state) {
    (void)state;
    /* every format on both sides, head_dim 40, page sizes that leave padding */
    static const struct {
        int32_t kf, vf, P;
    } cases[] = {
        {KVP_FORMAT_FP8_E4M3, KVP_FORMAT_INT8, 3},  {KVP_FORMAT_INT8, KVP_FORMAT_FP8_E4M3, 5},
        {KVP_FORMAT_INT4, KVP_FORMAT_INT4, 6},      {KVP_FORMAT_INT8, KVP_FORMAT_INT4, 3},
        {KVP_FORMAT_INT4, KVP_FORMAT_INT8, 4},      {KVP_FORMAT_FP16, KVP_FORMAT_BF16, 3},
        {KVP_FORMAT_FP32, KVP_FORMAT_FP8_E4M3, 3},  {KVP_FORMAT_BF16, KVP_FORMAT_INT4, 5},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        padding_case(cases[i].kf, cases[i].vf, cases[i].P, 4000 + i);
}

/* ---- the cache façade on the device ------------------------------------------------------ */

typedef struct {
    kvp_cache_t *cpu, *gpu;
    int32_t layers, H, QH, D, kf, vf;
    uint32_t seed;
} cache_twin;

static float cache_rand(uint32_t *s) {
    *s = *s * 1664525u + 1013904223u;
    return (float)((*s >> 8) & 0xFFFF) / 32768.0f - 1.0f;
}

static kvp_cache_params_t cache_params(int32_t kf, int32_t vf, uint64_t host_bytes) {
    kvp_cache_params_t p;
    kvp_cache_params_init(&p);
    p.layers = 2;
    p.kv_heads = 2;
    p.head_dim = 64;
    p.page_size = 16;
    p.k_format = kf;
    p.v_format = vf;
    p.max_seqs = 8;
    p.num_pages = 24;
    p.host_bytes = host_bytes;
    return p;
}

/* The two caches' stores as a twin (owned by the caches: not twin_free'd),
 * for twin_fill and twin_compare. */
static twin cache_stores(const cache_twin *t) {
    twin w;
    memset(&w, 0, sizeof w);
    kvp_cache_parts_t cp, gp;
    memset(&cp, 0, sizeof cp);
    memset(&gp, 0, sizeof gp);
    cp.struct_size = gp.struct_size = sizeof cp;
    assert_int_equal(kvp_cache_parts(t->cpu, &cp), KVP_OK);
    assert_int_equal(kvp_cache_parts(t->gpu, &gp), KVP_OK);
    w.cpu = cp.store;
    w.gpu = gp.store;
    w.lay.struct_size = sizeof w.lay;
    assert_int_equal(kvp_store_layout(w.cpu, &w.lay), KVP_OK);
    w.layers = t->layers;
    w.H = t->H;
    w.D = t->D;
    w.P = w.lay.page_size;
    return w;
}

/* One step on both caches: the same rows written, attention compared. */
static void cache_step(cache_twin *t, const int32_t *seqs, int32_t batch, const int32_t *num_new) {
    int32_t rows = 0;
    for (int32_t b = 0; b < batch; b++) rows += num_new[b];
    assert_int_equal(kvp_cache_begin_step(t->cpu, seqs, batch, num_new, NULL), KVP_OK);
    int rc = kvp_cache_begin_step(t->gpu, seqs, batch, num_new, NULL);
    if (rc != KVP_OK) print_error("gpu begin_step: %s\n", kvp_cache_last_error(t->gpu));
    assert_int_equal(rc, KVP_OK);
    size_t kv_n = (size_t)rows * (size_t)(t->H * t->D), q_n = (size_t)rows * (size_t)(t->QH * t->D);
    float *k = (float *)malloc(kv_n * 4), *v = (float *)malloc(kv_n * 4), *q = (float *)malloc(q_n * 4);
    float *co = (float *)malloc(q_n * 4), *go = (float *)malloc(q_n * 4);
    for (int32_t layer = 0; layer < t->layers; layer++) {
        for (size_t i = 0; i < kv_n; i++) {
            k[i] = cache_rand(&t->seed) + (i % 64 == 7 ? 4.0f : 0.0f); /* an outlier channel */
            v[i] = cache_rand(&t->seed);
        }
        for (size_t i = 0; i < q_n; i++) q[i] = cache_rand(&t->seed);
        void *kd = dev_copy(k, kv_n * 4), *vd = dev_copy(v, kv_n * 4), *qd = dev_copy(q, q_n * 4);
        void *od = dev_alloc(q_n * 4);
        assert_int_equal(kvp_cache_write(t->cpu, layer, KVP_FORMAT_FP32, k, v, 0, 0), KVP_OK);
        rc = kvp_cache_write(t->gpu, layer, KVP_FORMAT_FP32, kd, vd, 0, 0);
        if (rc != KVP_OK) print_error("gpu write: %s\n", kvp_cache_last_error(t->gpu));
        assert_int_equal(rc, KVP_OK);
        kvp_attention_params_t ap;
        kvp_attention_params_init(&ap);
        ap.layer = layer;
        ap.q_heads = t->QH;
        ap.dtype = KVP_FORMAT_FP32;
        ap.sm_scale = 0.125f;
        ap.q = q;
        ap.out = co;
        assert_int_equal(kvp_cache_attend(t->cpu, &ap), KVP_OK);
        ap.q = qd;
        ap.out = od;
        rc = kvp_cache_attend(t->gpu, &ap);
        if (rc != KVP_OK) print_error("gpu attend: %s\n", kvp_cache_last_error(t->gpu));
        assert_int_equal(rc, KVP_OK);
        to_host(go, od, q_n * 4);
        double d = rel_diff(go, co, q_n), tol = tolerance(t->kf, t->vf);
        if (d >= tol) print_error("cache attention layer %d: vs cpu %.2e (tol %.1e)\n", (int)layer, d, tol);
        assert_true(d < tol);
        cudaFree(kd);
        cudaFree(vd);
        cudaFree(qd);
        cudaFree(od);
    }
    free(k), free(v), free(q), free(co), free(go);
}

/* kvp_cuda_cache_create: prefill chunks, decode, fork (copy on write),
 * swap out / in through the pinned host tier, truncate (unseal) — the same
 * calls on a CPU cache give the same arena, bit for bit, and attention
 * within the backend's tolerance. */
static void test_cache_facade(void **state) {
    (void)state;
    static const int32_t fmts[][2] = {{KVP_FORMAT_FP16, KVP_FORMAT_FP16},
                                      {KVP_FORMAT_INT8, KVP_FORMAT_INT4},
                                      {KVP_FORMAT_INT4, KVP_FORMAT_INT4}};
    for (size_t f = 0; f < sizeof fmts / sizeof fmts[0]; f++) {
        cache_twin t = {};
        t.layers = 2, t.H = 2, t.QH = 4, t.D = 64, t.kf = fmts[f][0], t.vf = fmts[f][1];
        t.seed = 11u + (uint32_t)f;
        kvp_cache_params_t p = cache_params(t.kf, t.vf, 4u << 20);
        kvp_cache_params_t pc = p;
        pc.isa = KVP_ISA_PORTABLE;
        char err[KVP_ERR_SIZE] = "";
        assert_int_equal(kvp_cache_create(&pc, &t.cpu, err, sizeof err), KVP_OK);
        int rc = kvp_cuda_cache_create(&p, NULL, &t.gpu, err, sizeof err);
        if (rc != KVP_OK) print_error("kvp_cuda_cache_create: %s\n", err);
        assert_int_equal(rc, KVP_OK);
        kvp_cache_parts_t cparts, gparts;
        memset(&cparts, 0, sizeof cparts);
        memset(&gparts, 0, sizeof gparts);
        cparts.struct_size = gparts.struct_size = sizeof cparts;
        assert_int_equal(kvp_cache_parts(t.cpu, &cparts), KVP_OK);
        assert_int_equal(kvp_cache_parts(t.gpu, &gparts), KVP_OK);
        assert_int_equal(store_info(gparts.store).backend, KVP_BACKEND_CUDA);
        assert_int_equal(ctx_info(gparts.ctx).backend, KVP_BACKEND_CUDA);
        assert_non_null(gparts.tier); /* host_bytes given: a (pinned) host tier */
        twin stores = cache_stores(&t);
        twin_fill(&stores, 0x5A);
        int32_t s[4], c0, c1;
        for (int i = 0; i < 3; i++) {
            assert_int_equal(kvp_cache_seq_create(t.cpu, 0, 0, &c0), KVP_OK);
            assert_int_equal(kvp_cache_seq_create(t.gpu, 0, 0, &c1), KVP_OK);
            assert_int_equal(c0, c1);
            s[i] = c0;
        }
        const int32_t pre[3] = {21, 5, 40}, one[3] = {1, 1, 1};
        cache_step(&t, s, 3, pre);             /* prefill, ragged */
        cache_step(&t, s, 3, one);             /* decode */
        assert_int_equal(kvp_cache_seq_fork(t.cpu, s[0], &c0), KVP_OK);
        assert_int_equal(kvp_cache_seq_fork(t.gpu, s[0], &c1), KVP_OK);
        assert_int_equal(c0, c1);
        s[3] = c0;
        const int32_t fk[2] = {s[0], s[3]}, two[2] = {2, 3};
        cache_step(&t, fk, 2, two);            /* both sides of the shared page append */
        twin_compare(&stores, "cache");
        assert_int_equal(kvp_cache_seq_swap_out(t.cpu, s[1]), KVP_OK);
        rc = kvp_cache_seq_swap_out(t.gpu, s[1]);
        if (rc != KVP_OK) print_error("gpu swap_out: %s\n", kvp_cache_last_error(t.gpu));
        assert_int_equal(rc, KVP_OK);
        const int32_t rest[3] = {s[0], s[2], s[3]}, big[3] = {17, 16, 1};
        cache_step(&t, rest, 3, big);          /* may reuse the swapped-out pages */
        assert_int_equal(kvp_cache_seq_swap_in(t.cpu, s[1]), KVP_OK);
        assert_int_equal(kvp_cache_seq_swap_in(t.gpu, s[1]), KVP_OK);
        assert_int_equal(kvp_cache_seq_truncate(t.cpu, s[2], 50), KVP_OK);
        assert_int_equal(kvp_cache_seq_truncate(t.gpu, s[2], 50), KVP_OK);
        cache_step(&t, s, 4, (const int32_t[]){1, 2, 3, 1});
        twin_compare(&stores, "cache");
        kvp_pool_stats_t a = {}, b = {};
        a.struct_size = b.struct_size = sizeof a;
        assert_int_equal(kvp_pool_stats(cparts.pool, &a), KVP_OK);
        assert_int_equal(kvp_pool_stats(gparts.pool, &b), KVP_OK);
        assert_int_equal(a.used_pages, b.used_pages);
        assert_int_equal(a.live_tokens, b.live_tokens);
        kvp_cache_destroy(t.cpu);
        kvp_cache_destroy(t.gpu);
    }
}

static void test_bad_input(void **state) {
    (void)state;
    char err[KVP_ERR_SIZE] = "";
    kvp_store_params_t sp = store_params(1, 2, 64, 16, KVP_FORMAT_FP16, KVP_FORMAT_FP16, 0, 4, 0);
    kvp_store_t *s = nullptr;
    kvp_cuda_params_t cp;
    kvp_cuda_params_init(&cp);
    /* parameters */
    assert_int_equal(kvp_cuda_store_create(NULL, &cp, &s, err, sizeof err), KVP_EINVAL);
    assert_int_equal(kvp_cuda_store_create(&sp, &cp, NULL, err, sizeof err), KVP_EINVAL);
    cp.struct_size = 0;
    assert_int_equal(kvp_cuda_store_create(&sp, &cp, &s, err, sizeof err), KVP_EINVAL);
    kvp_cuda_params_init(&cp);
    cp.device = -1;
    assert_int_equal(kvp_cuda_store_create(&sp, &cp, &s, err, sizeof err), KVP_EINVAL);
    cp.device = 4096;
    assert_int_equal(kvp_cuda_store_create(&sp, &cp, &s, err, sizeof err), KVP_ENODEV);
    assert_non_null(strstr(err, "does not exist"));
    cp.device = 0;
    cp.staging_bytes = 100;
    assert_int_equal(kvp_cuda_store_create(&sp, &cp, &s, err, sizeof err), KVP_EINVAL);
    assert_null(s);
    sp.head_dim = 7;
    kvp_cuda_params_init(&cp);
    assert_int_equal(kvp_cuda_store_create(&sp, &cp, &s, err, sizeof err), KVP_EINVAL);
    sp.head_dim = 64;

    /* backends do not mix */
    twin t;
    twin_make(&t, 1, 2, 64, 16, KVP_FORMAT_FP16, KVP_FORMAT_FP16, 0, 8, 0);
    kvp_ctx_t *cc = cpu_ctx(), *gc = gpu_ctx(0);
    int32_t indptr[2] = {0, 1}, indices[1] = {0}, last[1] = {1}, qo[2] = {0, 1};
    kvp_kv_view_t v = {sizeof(kvp_kv_view_t), 1, 16, 8, 0, 0, indptr, indices, last};
    float qh[128] = {0}, oh[128];
    kvp_attention_params_t ap;
    kvp_attention_params_init(&ap);
    ap.q_heads = 2;
    ap.sm_scale = 0.125f;
    ap.qo_indptr = qo;
    ap.q = qh;
    ap.out = oh;
    assert_int_equal(kvp_attention(cc, t.gpu, &v, &ap), KVP_EINVAL);
    assert_non_null(strstr(kvp_ctx_last_error(cc), "backend"));
    assert_int_equal(kvp_attention(gc, t.cpu, &v, &ap), KVP_EINVAL);
    /* the generic checks apply to CUDA stores (nothing enqueued) */
    indices[0] = 99;
    assert_int_equal(kvp_attention(gc, t.gpu, &v, &ap), KVP_EINVAL);
    assert_non_null(strstr(kvp_ctx_last_error(gc), "not a page"));
    indices[0] = 0;
    kvp_kv_view_t unsized = v;
    unsized.struct_size = 0;
    assert_int_equal(kvp_attention(gc, t.gpu, &unsized, &ap), KVP_EINVAL);
    assert_non_null(strstr(kvp_ctx_last_error(gc), "struct_size"));
    ap.sm_scale = -1.0f;
    assert_int_equal(kvp_attention(gc, t.gpu, &v, &ap), KVP_EINVAL);
    assert_non_null(strstr(kvp_ctx_last_error(gc), "sm_scale"));
    ap.sm_scale = 0.125f;
    int64_t slot = 999;
    kvp_append_params_t a;
    kvp_append_params_init(&a);
    a.rows = 1;
    a.dtype = KVP_FORMAT_FP32;
    a.k = a.v = qh;
    a.slots = &slot;
    assert_int_equal(kvp_store_append(t.gpu, &a), KVP_EINVAL);
    kvp_page_op_t bad = {KVP_OP_UNSEAL, 0, 1, 1, -1};
    assert_int_equal(kvp_store_apply_ops(t.gpu, &bad, 1), KVP_EINVAL);
    twin_compare(&t, "after rejected calls");
    /* a workspace too small for the view: a clear error, nothing run */
    kvp_cuda_params_init(&cp);
    cp.staging_bytes = 4096;
    kvp_ctx_params_t xp;
    kvp_ctx_params_init(&xp);
    kvp_ctx_t *small = nullptr;
    assert_int_equal(kvp_cuda_ctx_create(&xp, &cp, &small, err, sizeof err), KVP_OK);
    int32_t big_indptr[2] = {0, 600};
    int32_t *big = (int32_t *)calloc(600, 4);
    int32_t big_last[1] = {16};
    kvp_store_params_t bp = store_params(1, 2, 64, 16, KVP_FORMAT_FP16, KVP_FORMAT_FP16, 0, 600, 0);
    kvp_store_t *bs = nullptr;
    assert_int_equal(kvp_cuda_store_create(&bp, NULL, &bs, err, sizeof err), KVP_OK);
    for (int i = 0; i < 600; i++) big[i] = i;
    kvp_kv_view_t bv = {sizeof(kvp_kv_view_t), 1, 16, 600, 0, 0, big_indptr, big, big_last};
    assert_int_equal(kvp_attention(small, bs, &bv, &ap), KVP_ENOMEM);
    assert_non_null(strstr(kvp_ctx_last_error(small), "staging_bytes"));
    free(big);
    kvp_store_destroy(bs);
    kvp_ctx_destroy(small);
    kvp_ctx_destroy(cc);
    kvp_ctx_destroy(gc);
    twin_free(&t);
    /* stores and contexts of NULL */
    assert_int_equal(kvp_cuda_store_set_stream(NULL, nullptr), KVP_EINVAL);
    assert_int_equal(kvp_cuda_ctx_set_stream(NULL, nullptr), KVP_EINVAL);
    kvp_store_info_t si;
    memset(&si, 0, sizeof si);
    si.struct_size = sizeof si;
    kvp_ctx_info_t ci;
    memset(&ci, 0, sizeof ci);
    ci.struct_size = sizeof ci;
    assert_int_equal(kvp_store_info(NULL, &si), KVP_EINVAL);
    assert_int_equal(kvp_ctx_info(NULL, &ci), KVP_EINVAL);
    assert_int_equal(kvp_store_synchronize(NULL), KVP_EINVAL);
    void *p = nullptr;
    assert_int_equal(kvp_cuda_host_alloc(0, &p, err, sizeof err), KVP_EINVAL);
    kvp_cuda_host_free(NULL);
}

/* What a CUDA build, store and context report about themselves; the
 * conventions they share with the CPU backend: sticky detail text, the
 * non-finite counter's status, the default softmax scale. */
static void test_info_and_conventions(void **state) {
    (void)state;
    assert_int_equal(kvp_build_has(KVP_FEATURE_CUDA), 1); /* this program is the CUDA build */
    twin t;
    twin_make(&t, 2, 2, 64, 16, KVP_FORMAT_INT8, KVP_FORMAT_FP16, 0, 10, 3);
    kvp_store_info_t gi = store_info(t.gpu), ci = store_info(t.cpu);
    assert_int_equal(gi.backend, KVP_BACKEND_CUDA);
    assert_int_equal(gi.device, 0);
    assert_int_equal(ci.device, -1);
    assert_int_equal(gi.num_pages, 10);
    assert_int_equal(gi.num_staging, 3);
    assert_int_equal(gi.k_order, KVP_K_ORDER_TOKEN_MAJOR);
    uint64_t need = 0;
    assert_int_equal(kvp_arena_bytes(&t.lay, 10, 3, &need, NULL, 0), KVP_OK);
    assert_true(gi.arena_bytes == need && ci.arena_bytes == need);
    assert_non_null(gi.arena);
    assert_int_equal((uintptr_t)gi.arena % KVP_ARENA_ALIGN, 0);
    kvp_store_info_t small;
    memset(&small, 0, sizeof small);
    assert_int_equal(kvp_store_info(t.gpu, &small), KVP_EINVAL); /* struct_size 0 */
    assert_non_null(strstr(kvp_store_last_error(t.gpu), "struct_size"));
    uint64_t n = 5;
    assert_int_equal(kvp_store_nonfinite_count(t.gpu, NULL), KVP_EINVAL);
    assert_int_equal(kvp_store_nonfinite_count(t.gpu, &n), KVP_OK);
    assert_true(n == 0);
    /* a fresh store's detail is "", a failure's detail stays after successes */
    kvp_store_t *fresh = nullptr;
    kvp_store_params_t sp = store_params(1, 2, 64, 16, KVP_FORMAT_FP16, KVP_FORMAT_FP16, 0, 4, 0);
    char err[KVP_ERR_SIZE] = "";
    assert_int_equal(kvp_cuda_store_create(&sp, NULL, &fresh, err, sizeof err), KVP_OK);
    assert_string_equal(kvp_store_last_error(fresh), "");
    float scale = 0.0f;
    assert_int_equal(kvp_store_get_fp8_scale(fresh, 0, 0, 0, &scale), KVP_EINVAL); /* not fp8 */
    char first[KVP_ERR_SIZE];
    snprintf(first, sizeof first, "%s", kvp_store_last_error(fresh));
    assert_true(strlen(first) > 0);
    assert_int_equal(kvp_store_synchronize(fresh), KVP_OK);
    (void)store_info(fresh);
    assert_string_equal(kvp_store_last_error(fresh), first);
    kvp_store_destroy(fresh);
    twin_free(&t);

    kvp_ctx_t *gc = gpu_ctx(0);
    assert_string_equal(kvp_ctx_last_error(gc), "");
    kvp_ctx_info_t xi = ctx_info(gc);
    assert_int_equal(xi.backend, KVP_BACKEND_CUDA);
    assert_int_equal(xi.device, 0);
    assert_int_equal(xi.isa, -1);
    assert_int_equal(xi.threads, 1);
    assert_true(xi.workspace_bytes > 0);
    kvp_ctx_info_t xsmall;
    memset(&xsmall, 0, sizeof xsmall);
    xsmall.struct_size = 4;
    assert_int_equal(kvp_ctx_info(gc, &xsmall), KVP_EINVAL);
    assert_non_null(strstr(kvp_ctx_last_error(gc), "struct_size"));

    /* sm_scale 0 is 1/sqrt(head_dim): the same output and lse, bit for bit */
    int32_t kv_len[] = {45, 17}, q_len[] = {2, 1};
    batch_spec bs = {2, 4, 64, 16, KVP_FORMAT_INT8, KVP_FORMAT_FP16, 0, 2, kv_len, q_len, 950};
    batch bt;
    batch_build(&bt, &bs);
    size_t qn = (size_t)bt.rows * 4 * 64, ln = (size_t)bt.rows * 4;
    void *qd = dev_copy(bt.q, qn * 4), *o0 = dev_alloc(qn * 4), *o1 = dev_alloc(qn * 4);
    void *l0 = dev_alloc(ln * 4), *l1 = dev_alloc(ln * 4);
    kvp_attention_params_t ap;
    kvp_attention_params_init(&ap);
    assert_true(ap.sm_scale == 0.0f);
    ap.layer = 1;
    ap.q_heads = 4;
    ap.qo_indptr = bt.qo;
    ap.q = qd;
    ap.out = o0;
    ap.lse = (float *)l0;
    assert_int_equal(kvp_attention(gc, bt.t.gpu, &bt.view, &ap), KVP_OK);
    ap.sm_scale = 1.0f / sqrtf(64.0f);
    ap.out = o1;
    ap.lse = (float *)l1;
    assert_int_equal(kvp_attention(gc, bt.t.gpu, &bt.view, &ap), KVP_OK);
    float *h0 = (float *)malloc(qn * 4), *h1 = (float *)malloc(qn * 4);
    float *hl0 = (float *)malloc(ln * 4), *hl1 = (float *)malloc(ln * 4);
    to_host(h0, o0, qn * 4);
    to_host(h1, o1, qn * 4);
    to_host(hl0, l0, ln * 4);
    to_host(hl1, l1, ln * 4);
    assert_memory_equal(h0, h1, qn * 4);
    assert_memory_equal(hl0, hl1, ln * 4);
    for (size_t i = 0; i < qn; i++) assert_true(isfinite(h0[i]));
    ap.sm_scale = NAN;
    assert_int_equal(kvp_attention(gc, bt.t.gpu, &bt.view, &ap), KVP_EINVAL);
    assert_non_null(strstr(kvp_ctx_last_error(gc), "sm_scale"));
    free(h0);
    free(h1);
    free(hl0);
    free(hl1);
    cudaFree(qd);
    cudaFree(o0);
    cudaFree(o1);
    cudaFree(l0);
    cudaFree(l1);
    batch_free(&bt);
    kvp_ctx_destroy(gc);
}

#ifdef KVP_CUDASIM
/* A device whose largest 2D-copy pitch is below a layer's bytes (on
 * hardware, cudaDevAttrMaxPitch is 2^31 - 1: any store of more than 2 GiB
 * per layer): whole-page swaps still copy every byte, layer by layer. */
static void test_swap_beyond_max_pitch(void **state) {
    (void)state;
    cudasim::set_max_pitch(4096);
    twin t;
    twin_make(&t, 3, 2, 32, 16, KVP_FORMAT_INT8, KVP_FORMAT_FP16, 0, 24, 4);
    paging pg;
    paging_make(&pg, &t, 24, 4);
    int32_t seq = paging_seq(&pg);
    kvd_rng rng;
    kvd_seed(&rng, 401);
    fill_sequence(&t, &pg, seq, 3 * 16 + 5, &rng);
    uint64_t pb = t.lay.page_bytes;
    assert_true(pb / 3 <= 4096); /* one layer of a page fits the limit ... */
    uint8_t *pinned = nullptr, *cpu_buf = (uint8_t *)malloc((size_t)pb);
    char err[KVP_ERR_SIZE];
    assert_int_equal(kvp_cuda_host_alloc(pb, (void **)&pinned, err, sizeof err), KVP_OK);
    for (int32_t id = 0; id < t.num_pages; id += 3) {
        memset(pinned, 0, (size_t)pb);
        assert_int_equal(kvp_store_page_to_host(t.cpu, id, 0, cpu_buf, pb), KVP_OK);
        int rc = kvp_store_page_to_host(t.gpu, id, 0, pinned, pb);
        if (rc != KVP_OK) print_error("page_to_host: %s\n", kvp_store_last_error(t.gpu));
        assert_int_equal(rc, KVP_OK);
        assert_int_equal(kvp_store_synchronize(t.gpu), KVP_OK);
        assert_memory_equal(cpu_buf, pinned, (size_t)pb);
    }
    /* ... the arena's layer, the pitch of a whole-page copy, does not */
    void *d = nullptr;
    assert_int_equal(cudaMalloc(&d, 3 * 8192), cudaSuccess);
    assert_int_equal(cudaMemcpy2D(d, 8192, cpu_buf, 16, 16, 3, cudaMemcpyHostToDevice),
                     cudaErrorInvalidPitchValue);
    (void)cudaGetLastError();
    cudaFree(d);
    /* out, clobbered, back in whole: the arena is restored */
    int32_t victim = 1;
    assert_int_equal(kvp_store_page_to_host(t.gpu, victim, 0, pinned, pb), KVP_OK);
    assert_int_equal(kvp_store_page_to_host(t.cpu, victim, 0, cpu_buf, pb), KVP_OK);
    kvp_page_op_t clobber = {KVP_OP_COPY, 0, victim, 0, -1};
    twin_ops(&t, &clobber, 1);
    assert_int_equal(kvp_store_page_from_host(t.gpu, victim, 0, pinned, pb), KVP_OK);
    assert_int_equal(kvp_store_page_from_host(t.cpu, victim, 0, cpu_buf, pb), KVP_OK);
    assert_int_equal(kvp_store_synchronize(t.gpu), KVP_OK);
    twin_compare(&t, "after a swap beyond the pitch limit");
    kvp_cuda_host_free(pinned);
    free(cpu_buf);
    paging_free(&pg);
    twin_free(&t);
    cudasim::set_max_pitch(0);
}

/* Faults the simulator can inject: allocation failures at every step of
 * creation (nothing leaks), a failing kernel launch (KVP_ECUDA with the
 * runtime's text, the store usable afterwards), no device at all. */
static void test_injected_failures(void **state) {
    (void)state;
    char err[KVP_ERR_SIZE] = "";
    kvp_store_params_t sp = store_params(1, 2, 64, 16, KVP_FORMAT_INT8, KVP_FORMAT_FP16, 0, 4, 2);
    long base = cudasim::live_allocations();
    for (long i = 0; i < 6; i++) {
        cudasim::fail_malloc_at(i);
        kvp_store_t *s = nullptr;
        int rc = kvp_cuda_store_create(&sp, NULL, &s, err, sizeof err);
        cudasim::fail_malloc_at(-1);
        if (rc == KVP_OK) {
            kvp_store_destroy(s);
            continue;
        }
        assert_int_equal(rc, KVP_ENOMEM);
        assert_true(strlen(err) > 0);
        assert_null(s);
        assert_int_equal(cudasim::live_allocations(), base);
    }
    for (long i = 0; i < 4; i++) {
        cudasim::fail_malloc_at(i);
        kvp_ctx_params_t xp;
        kvp_ctx_params_init(&xp);
        kvp_ctx_t *c = nullptr;
        int rc = kvp_cuda_ctx_create(&xp, NULL, &c, err, sizeof err);
        cudasim::fail_malloc_at(-1);
        if (rc == KVP_OK) kvp_ctx_destroy(c);
        else assert_int_equal(rc, KVP_ENOMEM);
        assert_int_equal(cudasim::live_allocations(), base);
    }
    /* a launch that fails */
    twin t;
    twin_make(&t, 1, 2, 64, 16, KVP_FORMAT_INT8, KVP_FORMAT_FP16, 0, 4, 2);
    float rows[2 * 128];
    for (int i = 0; i < 256; i++) rows[i] = (float)i;
    void *d = dev_copy(rows, sizeof rows);
    int64_t slots[2] = {(int64_t)t.num_pages * 16, (int64_t)t.num_pages * 16 + 1};
    kvp_append_params_t a;
    kvp_append_params_init(&a);
    a.rows = 2;
    a.dtype = KVP_FORMAT_FP32;
    a.k = a.v = d;
    a.slots = slots;
    cudasim::fail_next_launch(cudaErrorLaunchFailure);
    assert_int_equal(kvp_store_append(t.gpu, &a), KVP_ECUDA);
    assert_non_null(strstr(kvp_store_last_error(t.gpu), "append kernel"));
    assert_int_equal(kvp_store_append(t.gpu, &a), KVP_OK); /* usable again */
    /* the detail stays (sticky) until the next failure */
    assert_non_null(strstr(kvp_store_last_error(t.gpu), "append kernel"));
    cudaFree(d);
    twin_free(&t);
    /* no device: create says ENODEV cleanly */
    cudasim::set_no_device(true);
    kvp_store_t *s = nullptr;
    assert_int_equal(kvp_cuda_store_create(&sp, NULL, &s, err, sizeof err), KVP_ENODEV);
    assert_non_null(strstr(err, "cudaGetDeviceCount"));
    kvp_ctx_params_t xp;
    kvp_ctx_params_init(&xp);
    kvp_ctx_t *c = nullptr;
    assert_int_equal(kvp_cuda_ctx_create(&xp, NULL, &c, err, sizeof err), KVP_ENODEV);
    kvp_cache_params_t cp = cache_params(KVP_FORMAT_INT8, KVP_FORMAT_INT4, 1u << 20);
    kvp_cache_t *cache = nullptr;
    assert_int_equal(kvp_cuda_cache_create(&cp, NULL, &cache, err, sizeof err), KVP_ENODEV);
    assert_null(cache);
    cudasim::set_no_device(false);
    assert_int_equal(cudasim::live_allocations(), base);
    /* a cache whose every device or pinned allocation fails in turn */
    bool made = false;
    for (long i = 0; i < 16 && !made; i++) {
        cudasim::fail_malloc_at(i);
        int rc = kvp_cuda_cache_create(&cp, NULL, &cache, err, sizeof err);
        cudasim::fail_malloc_at(-1);
        if (rc == KVP_OK) {
            made = true;
            kvp_cache_destroy(cache);
        } else {
            if (rc != KVP_ENOMEM) print_error("allocation %ld: %s\n", i, err);
            assert_int_equal(rc, KVP_ENOMEM);
            assert_null(cache);
        }
        assert_int_equal(cudasim::live_allocations(), base);
    }
    assert_true(made);
    kvp_cuda_params_t bad;
    kvp_cuda_params_init(&bad);
    bad.struct_size = 4;
    assert_int_equal(kvp_cuda_cache_create(&cp, &bad, &cache, err, sizeof err), KVP_EINVAL);
}
#endif

/* ---- page bytes no encoder wrote ------------------------------------------------------------ */

/* One query row over page 0 of a store (1 layer, 1 kv head), on one backend. */
static int attend_page0(kvp_ctx_t *c, kvp_store_t *st, bool gpu, int32_t D, int32_t P,
                        const float *q, float *out) {
    static const int32_t indptr[] = {0, 1}, indices[] = {0}, qo[] = {0, 1};
    const int32_t last[] = {P};
    kvp_store_info_t info = store_info(st);
    kvp_kv_view_t v;
    memset(&v, 0, sizeof v);
    v.struct_size = sizeof v;
    v.batch = 1;
    v.page_size = P;
    v.num_pages = info.num_pages;
    v.num_staging = info.num_staging;
    v.indptr = indptr;
    v.indices = indices;
    v.last_page_len = last;
    kvp_attention_params_t ap;
    kvp_attention_params_init(&ap);
    ap.q_heads = 1;
    ap.qo_indptr = qo;
    void *qd = gpu ? dev_copy(q, (size_t)D * 4) : nullptr, *od = gpu ? dev_alloc((size_t)D * 4) : nullptr;
    ap.q = gpu ? qd : q;
    ap.out = gpu ? od : out;
    int rc = kvp_attention(c, st, &v, &ap);
    if (rc != KVP_OK) print_error("attention over page 0: %s\n", kvp_ctx_last_error(c));
    if (gpu) {
        if (rc == KVP_OK) to_host(out, od, (size_t)D * 4);
        cudaFree(qd);
        cudaFree(od);
    }
    return rc;
}

/* int4 key blocks with outlier-channel indices past head_dim (foreign or
 * unwritten bytes): the CUDA kernels ignore such an entry as the CPU
 * kernels and kvp_dequantize() do, and never write outside their tiles;
 * pages of arbitrary bytes in every format are read without a fault. */
static void test_foreign_page_bytes(void **state) {
    (void)state;
    const int32_t D = 128, P = 16, R = KVP__K4_OUTLIERS(KVP_FORMAT_INT4, D);
    kvd_rng rng;
    kvd_seed(&rng, 77);
    float *k = (float *)malloc((size_t)P * D * 4), *v = (float *)malloc((size_t)P * D * 4);
    float q[128], co[128], go[128];
    kvd_fill_normal(&rng, (size_t)P * D, k);
    kvd_fill_normal(&rng, (size_t)P * D, v);
    kvd_fill_normal(&rng, (size_t)D, q);
    for (int32_t t = 0; t < P; t++) k[t * D + 7] *= 15.0f; /* an outlier channel */
    kvp_ctx_t *cc = cpu_ctx(), *gc = gpu_ctx(0);
    twin tw;
    twin_make(&tw, 1, 1, D, P, KVP_FORMAT_INT4, KVP_FORMAT_FP16, 0, 2, 1);
    uint8_t *page = (uint8_t *)calloc(1, (size_t)tw.lay.page_bytes);
    kvp_quant_desc_t qd;
    memset(&qd, 0, sizeof qd);
    qd.struct_size = sizeof qd;
    qd.format = KVP_FORMAT_INT4;
    qd.page_size = P;
    qd.head_dim = D;
    qd.heads = 1;
    qd.dtype = KVP_FORMAT_FP32;
    char err[KVP_ERR_SIZE];
    assert_int_equal(kvp_quantize(&qd, k, 1, page, err, sizeof err), KVP_OK);
    qd.format = KVP_FORMAT_FP16;
    qd.is_value = 1;
    assert_int_equal(kvp_quantize(&qd, v, 1, page + tw.lay.k_block_bytes, err, sizeof err), KVP_OK);
    uint8_t *idx = page + (size_t)P * D / 2 + 4 * (size_t)D; /* docs/formats.md */
    const uint16_t bad[3] = {200, 1029, 0xFFFF}, big = 0x63D0;
    for (int32_t j = 1; j < R; j += 3) { /* every third entry past the first */
        memcpy(idx + 2 * j, &bad[j / 3 % 3], 2);
        memcpy(idx + 2 * R + 2 * j, &big, 2);
        for (int32_t t = 0; t < P; t++) idx[6 * R + j * P + t] = (uint8_t)(t * 37);
    }
    /* the check refuses these bytes on either backend; the kernels read them anyway */
    assert_int_equal(kvp_store_page_check(tw.gpu, 0, page, tw.lay.page_bytes), KVP_EINVAL);
    assert_non_null(strstr(kvp_store_last_error(tw.gpu), "outlier"));
    assert_int_equal(kvp_store_page_from_host(tw.cpu, 0, 0, page, tw.lay.page_bytes), KVP_OK);
    assert_int_equal(kvp_store_page_from_host(tw.gpu, 0, 0, page, tw.lay.page_bytes), KVP_OK);
    assert_int_equal(attend_page0(cc, tw.cpu, false, D, P, q, co), KVP_OK);
    assert_int_equal(attend_page0(gc, tw.gpu, true, D, P, q, go), KVP_OK);
    double e = rel_diff(go, co, (size_t)D);
    if (e > TOL_F16) print_error("cuda vs cpu over bad outlier indices: %g\n", e);
    assert_true(e <= TOL_F16);
    twin_free(&tw);
    /* every format pair over arbitrary bytes (the arenas start as 0xA7,
     * then page 0 gets random bytes): a status, no fault */
    static const int32_t formats[] = {KVP_FORMAT_FP32,     KVP_FORMAT_FP16, KVP_FORMAT_BF16,
                                      KVP_FORMAT_FP8_E4M3, KVP_FORMAT_INT8, KVP_FORMAT_INT4,
                                      KVP_FORMAT_INT4_V1};
    for (int32_t kf : formats)
        for (int32_t vf : formats) {
            twin_make(&tw, 1, 1, D, P, kf, vf, 0, 2, 1);
            assert_int_equal(attend_page0(gc, tw.gpu, true, D, P, q, go), KVP_OK);
            uint8_t *junk = (uint8_t *)malloc((size_t)tw.lay.page_bytes);
            for (uint64_t i = 0; i < tw.lay.page_bytes; i++) junk[i] = (uint8_t)(kvd_next(&rng) >> 56);
            assert_int_equal(kvp_store_page_from_host(tw.gpu, 0, 0, junk, tw.lay.page_bytes), KVP_OK);
            assert_int_equal(attend_page0(gc, tw.gpu, true, D, P, q, go), KVP_OK);
            free(junk);
            twin_free(&tw);
        }
    free(page);
    free(k);
    free(v);
    kvp_ctx_destroy(cc);
    kvp_ctx_destroy(gc);
}

/* ---- page blobs: sequences between CPU and CUDA caches ------------------------------------ */

/* Formats the blob tests run over: int8 and int4 keys keep a partly filled
 * last page in an fp16 staging page; k8v4 is int8 keys with int4 values. */
static const int32_t blob_formats[][2] = {
    {KVP_FORMAT_FP16, KVP_FORMAT_FP16},
    {KVP_FORMAT_INT8, KVP_FORMAT_INT8},
    {KVP_FORMAT_INT4, KVP_FORMAT_INT4},
    {KVP_FORMAT_INT8, KVP_FORMAT_INT4},
    {KVP_FORMAT_FP16, KVP_FORMAT_INT8}, /* a partly filled pool page with per-token value scales */
    {KVP_FORMAT_INT4_V1, KVP_FORMAT_INT4_V1},
};
#define BLOB_NUM_FORMATS ((int)(sizeof blob_formats / sizeof blob_formats[0]))
#define BLOB_MAX_PAGES 16
#define BLOB_LAYERS 2
#define BLOB_H 2
#define BLOB_QH 4
#define BLOB_D 64
#define BLOB_P 16 /* cache_params()'s shape */

/* A cache of cache_params()'s shape: on the CPU (portable kernels, the
 * reference) or on the device. */
static kvp_cache_t *blob_cache(int32_t kf, int32_t vf, bool gpu) {
    kvp_cache_params_t p = cache_params(kf, vf, 0);
    char err[KVP_ERR_SIZE] = "";
    kvp_cache_t *c = nullptr;
    int rc;
    if (gpu) {
        rc = kvp_cuda_cache_create(&p, NULL, &c, err, sizeof err);
    } else {
        p.isa = KVP_ISA_PORTABLE;
        rc = kvp_cache_create(&p, &c, err, sizeof err);
    }
    if (rc != KVP_OK) print_error("%s cache: %s\n", gpu ? "cuda" : "cpu", err);
    assert_int_equal(rc, KVP_OK);
    return c;
}

/* Every cache of these tests gets the same identity (fingerprint, shard 0 of 1, no key). */
static void blob_identity(kvp_cache_t *c) {
    kvp_blob_params_t bp;
    kvp_blob_params_init(&bp);
    for (int i = 0; i < KVP_FINGERPRINT_BYTES; i++) bp.fingerprint[i] = (uint8_t)(0xC3 ^ (7 * i + 1));
    int rc = kvp_cache_set_blob(c, &bp);
    if (rc != KVP_OK) print_error("set_blob: %s\n", kvp_cache_last_error(c));
    assert_int_equal(rc, KVP_OK);
}

/* Built without page blobs: the façade says KVP_ENOTSUP on a CUDA cache too,
 * and the caller skips. */
static bool blob_built(void) {
    if (kvp_build_has(KVP_FEATURE_BLOB)) return true;
    kvp_cache_t *g = blob_cache(KVP_FORMAT_FP16, KVP_FORMAT_FP16, true);
    kvp_blob_params_t bp;
    kvp_blob_params_init(&bp);
    bp.fingerprint[0] = 1;
    assert_int_equal(kvp_cache_set_blob(g, &bp), KVP_ENOTSUP);
    kvp_cache_destroy(g);
    print_message("built without page blobs (KVP_FEATURE_BLOB): skipped\n");
    return false;
}

static kvp_cache_parts_t blob_parts(const kvp_cache_t *c) {
    kvp_cache_parts_t p;
    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    assert_int_equal(kvp_cache_parts(c, &p), KVP_OK);
    return p;
}

/* A sequence's description and (with `pages`) its pages, a staging page last. */
static kvp_seq_info_t blob_seq_info(const kvp_cache_t *c, int32_t seq, int32_t *pages) {
    kvp_table_t *t = blob_parts(c).table;
    kvp_seq_info_t info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    assert_int_equal(kvp_table_seq_info(t, seq, &info), KVP_OK);
    assert_true(info.num_pages <= BLOB_MAX_PAGES);
    if (pages != nullptr) assert_int_equal(kvp_table_seq_pages(t, seq, pages, BLOB_MAX_PAGES), KVP_OK);
    return info;
}

static int32_t blob_new_seq(kvp_cache_t *c, uint64_t salt) {
    int32_t s = -1;
    assert_int_equal(kvp_cache_seq_create(c, 0, salt, &s), KVP_OK);
    return s;
}

static kvp_pool_stats_t blob_pool_stats(const kvp_cache_t *c) {
    kvp_pool_stats_t st;
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    assert_int_equal(kvp_pool_stats(blob_parts(c).pool, &st), KVP_OK);
    return st;
}

static kvp_cache_tier_stats_t blob_tier_stats(const kvp_cache_t *c, int32_t index) {
    kvp_cache_tier_stats_t st;
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    assert_int_equal(kvp_cache_tier_stats(c, index, &st), KVP_OK);
    return st;
}

/* K/V rows of positions pos0.. of one layer: a function of (seed, layer,
 * position), so every cache that asks gets the same rows. */
static void blob_rows(uint32_t seed, int32_t layer, int64_t pos0, int32_t n, float *k, float *v) {
    const int32_t width = BLOB_H * BLOB_D;
    for (int32_t t = 0; t < n; t++) {
        uint32_t s = seed * 2654435761u + (uint32_t)(pos0 + t) * 40503u + (uint32_t)layer * 977u;
        for (int32_t i = 0; i < width; i++) {
            k[(size_t)t * width + i] = cache_rand(&s) + (i % 64 == 7 ? 4.0f : 0.0f); /* an outlier channel */
            v[(size_t)t * width + i] = cache_rand(&s);
        }
    }
}

/* One step of `n` new tokens (ids `tokens`, positions pos0..) of one
 * sequence: every layer's K/V written (device copies for a CUDA cache);
 * with `out` (host, [layers][n][QH][D]), attention with queries of
 * (seed, layer, pos0) after each layer's write. */
static void blob_step(kvp_cache_t *c, bool gpu, int32_t seq, const int32_t *tokens, int32_t n,
                      int64_t pos0, uint32_t seed, float *out) {
    int rc = kvp_cache_begin_step(c, &seq, 1, &n, tokens);
    if (rc != KVP_OK) print_error("%s begin_step: %s\n", gpu ? "cuda" : "cpu", kvp_cache_last_error(c));
    assert_int_equal(rc, KVP_OK);
    size_t kv_n = (size_t)n * BLOB_H * BLOB_D, q_n = (size_t)n * BLOB_QH * BLOB_D;
    float *k = (float *)malloc(kv_n * 4), *v = (float *)malloc(kv_n * 4), *q = (float *)malloc(q_n * 4);
    assert_true(k && v && q);
    for (int32_t layer = 0; layer < BLOB_LAYERS; layer++) {
        blob_rows(seed, layer, pos0, n, k, v);
        void *kd = gpu ? dev_copy(k, kv_n * 4) : nullptr, *vd = gpu ? dev_copy(v, kv_n * 4) : nullptr;
        rc = kvp_cache_write(c, layer, KVP_FORMAT_FP32, gpu ? kd : (void *)k, gpu ? vd : (void *)v, 0, 0);
        if (rc != KVP_OK) print_error("%s write: %s\n", gpu ? "cuda" : "cpu", kvp_cache_last_error(c));
        assert_int_equal(rc, KVP_OK);
        if (out != nullptr) {
            uint32_t s = seed ^ (0x9E3779B9u * (uint32_t)(layer + 1)) ^ ((uint32_t)pos0 * 31u);
            for (size_t i = 0; i < q_n; i++) q[i] = cache_rand(&s);
            float *o = out + (size_t)layer * q_n;
            void *qd = gpu ? dev_copy(q, q_n * 4) : nullptr, *od = gpu ? dev_alloc(q_n * 4) : nullptr;
            kvp_attention_params_t ap;
            kvp_attention_params_init(&ap);
            ap.layer = layer;
            ap.q_heads = BLOB_QH;
            ap.dtype = KVP_FORMAT_FP32;
            ap.sm_scale = 0.125f;
            ap.q = gpu ? qd : (void *)q;
            ap.out = gpu ? od : (void *)o;
            rc = kvp_cache_attend(c, &ap);
            if (rc != KVP_OK) print_error("%s attend: %s\n", gpu ? "cuda" : "cpu", kvp_cache_last_error(c));
            assert_int_equal(rc, KVP_OK);
            if (gpu) {
                to_host(o, od, q_n * 4);
                assert_int_equal(cudaFree(qd), cudaSuccess);
                assert_int_equal(cudaFree(od), cudaSuccess);
            }
        }
        if (gpu) { /* the write has read the device copies before they go */
            assert_int_equal(kvp_store_synchronize(blob_parts(c).store), KVP_OK);
            assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
            assert_int_equal(cudaFree(kd), cudaSuccess);
            assert_int_equal(cudaFree(vd), cudaSuccess);
        }
    }
    free(k);
    free(v);
    free(q);
}

/* A whole sequence's blobs (malloc'd). */
static uint8_t *blob_export(kvp_cache_t *c, int32_t seq, const int32_t *tokens, int64_t n,
                            int32_t *blobs, uint64_t *bytes) {
    int rc = kvp_cache_seq_export_size(c, seq, blobs, bytes);
    if (rc != KVP_OK) print_error("seq_export_size: %s\n", kvp_cache_last_error(c));
    assert_int_equal(rc, KVP_OK);
    uint8_t *buf = (uint8_t *)malloc((size_t)*bytes);
    assert_non_null(buf);
    rc = kvp_cache_seq_export(c, seq, tokens, n, buf, *bytes);
    if (rc != KVP_OK) print_error("seq_export: %s\n", kvp_cache_last_error(c));
    assert_int_equal(rc, KVP_OK);
    return buf;
}

/* The first `count` pages of two sequences (every page when count < 0:
 * then the sequences have the same length and page count) decode
 * (kvp_store_read, the tokens each page holds) to the same values; either
 * cache on either backend. */
static void blob_same_decode(const kvp_cache_t *a, int32_t sa, const kvp_cache_t *b, int32_t sb,
                             int32_t count, const char *what) {
    int32_t pa[BLOB_MAX_PAGES], pb[BLOB_MAX_PAGES];
    kvp_seq_info_t ia = blob_seq_info(a, sa, pa), ib = blob_seq_info(b, sb, pb);
    if (count < 0) {
        assert_int_equal(ia.num_pages, ib.num_pages);
        assert_true(ia.length == ib.length);
        count = ia.num_pages;
    }
    assert_true(count <= ia.num_pages && count <= ib.num_pages);
    assert_true((int64_t)count * BLOB_P <= ia.length + BLOB_P - 1);
    kvp_store_t *xa = blob_parts(a).store, *xb = blob_parts(b).store;
    kvp_layout_t l;
    memset(&l, 0, sizeof l);
    l.struct_size = sizeof l;
    assert_int_equal(kvp_store_layout(xa, &l), KVP_OK);
    size_t row = (size_t)BLOB_H * BLOB_D;
    float *ka = (float *)malloc((size_t)BLOB_P * row * 4), *va = (float *)malloc((size_t)BLOB_P * row * 4);
    float *kb = (float *)malloc((size_t)BLOB_P * row * 4), *vb = (float *)malloc((size_t)BLOB_P * row * 4);
    assert_true(ka && va && kb && vb);
    for (int32_t i = 0; i < count; i++) {
        int64_t left = ia.length - (int64_t)i * BLOB_P;
        int32_t tokens = (int32_t)(left < BLOB_P ? left : BLOB_P);
        assert_true(tokens >= 1);
        for (int32_t layer = 0; layer < BLOB_LAYERS; layer++) {
            int rc = kvp_store_read(xa, layer, pa[i], 0, tokens, ka, va);
            if (rc != KVP_OK) print_error("read: %s\n", kvp_store_last_error(xa));
            assert_int_equal(rc, KVP_OK);
            rc = kvp_store_read(xb, layer, pb[i], 0, tokens, kb, vb);
            if (rc != KVP_OK) print_error("read: %s\n", kvp_store_last_error(xb));
            assert_int_equal(rc, KVP_OK);
            size_t n = (size_t)tokens * row * 4;
            bool same_k = memcmp(ka, kb, n) == 0, same_v = memcmp(va, vb, n) == 0;
            if (!same_k || !same_v)
                print_error("%s: page %d (ids %d / %d), layer %d, %d tokens: %s differ; K %s V %s\n",
                            what, (int)i, (int)pa[i], (int)pb[i], (int)layer, (int)tokens,
                            same_k ? "values" : "keys", kvp_format_name(l.k_format),
                            kvp_format_name(l.v_format));
            assert_true(same_k && same_v);
        }
    }
    free(ka);
    free(va);
    free(kb);
    free(vb);
}

/* Attention outputs ([layers][rows][QH][D]) of a CUDA cache within the CPU
 * reference's tolerance, layer by layer. */
static void blob_close(const float *gpu_out, const float *cpu_out, int32_t rows, int32_t kf,
                       int32_t vf, const char *what) {
    size_t per = (size_t)rows * BLOB_QH * BLOB_D;
    double tol = tolerance(kf, vf);
    for (int32_t layer = 0; layer < BLOB_LAYERS; layer++) {
        double d = rel_diff(gpu_out + (size_t)layer * per, cpu_out + (size_t)layer * per, per);
        if (d >= tol)
            print_error("%s: K %s V %s layer %d: cuda vs cpu %.2e (tol %.1e)\n", what,
                        kvp_format_name(kf), kvp_format_name(vf), (int)layer, d, tol);
        assert_true(d < tol);
    }
}

/* A sequence of 2.5 pages prefilled alike in a CPU cache A and a CUDA cache
 * G; G's blobs imported into a CPU cache B decode as A's pages; A's blobs
 * imported into a CUDA cache G2 decode as A's, and decoding goes on (across
 * the staging page's seal) within the CUDA tolerance of A, B bit for bit. */
static void blob_transfer_case(int32_t kf, int32_t vf) {
    const int32_t n = 2 * BLOB_P + BLOB_P / 2, tail = n % BLOB_P;
    const uint64_t salt = 7;
    const uint32_t seed = 4242u + (uint32_t)kf * 16u + (uint32_t)vf;
    int32_t toks[2 * BLOB_P + BLOB_P / 2];
    for (int32_t i = 0; i < n; i++) toks[i] = 3000 + 11 * i;
    kvp_cache_t *a = blob_cache(kf, vf, false), *g = blob_cache(kf, vf, true);
    blob_identity(a);
    blob_identity(g);
    int32_t sa = blob_new_seq(a, salt), sg = blob_new_seq(g, salt);
    blob_step(a, false, sa, toks, n, 0, seed, nullptr);
    blob_step(g, true, sg, toks, n, 0, seed, nullptr);
    blob_same_decode(a, sa, g, sg, -1, "prefill, cpu vs cuda");

    /* the CUDA cache's blobs: as many, as long as the CPU cache's */
    int32_t gblobs = 0, ablobs = 0;
    uint64_t gbytes = 0, abytes = 0;
    uint8_t *gbuf = blob_export(g, sg, toks, n, &gblobs, &gbytes);
    uint8_t *abuf = blob_export(a, sa, toks, n, &ablobs, &abytes);
    assert_int_equal(gblobs, 3);
    assert_int_equal(ablobs, 3);
    assert_true(gbytes == abytes);

    /* CUDA -> CPU */
    kvp_cache_t *b = blob_cache(kf, vf, false);
    blob_identity(b);
    int32_t sb = blob_new_seq(b, salt), r = -1;
    int rc = kvp_cache_seq_import(b, sb, toks, n, gbuf, gbytes, &r);
    if (rc != KVP_OK) print_error("import into a cpu cache: %s\n", kvp_cache_last_error(b));
    assert_int_equal(rc, KVP_OK);
    assert_int_equal(r, KVP_BLOB_OK);
    assert_true(blob_seq_info(b, sb, nullptr).length == n);
    blob_same_decode(a, sa, b, sb, -1, "cuda blobs in a cpu cache");

    /* CPU -> CUDA */
    kvp_cache_t *g2 = blob_cache(kf, vf, true);
    blob_identity(g2);
    int32_t s2 = blob_new_seq(g2, salt);
    r = -1;
    rc = kvp_cache_seq_import(g2, s2, toks, n, abuf, abytes, &r);
    if (rc != KVP_OK) print_error("import into a cuda cache: %s\n", kvp_cache_last_error(g2));
    assert_int_equal(rc, KVP_OK);
    assert_int_equal(r, KVP_BLOB_OK);
    assert_true(blob_seq_info(g2, s2, nullptr).length == n);
    blob_same_decode(a, sa, g2, s2, -1, "cpu blobs in a cuda cache");

    /* decode steps, the last page filled and one more token: the CUDA
     * cache within its tolerance of A, the CPU cache B as A exactly */
    size_t per = (size_t)BLOB_LAYERS * BLOB_QH * BLOB_D;
    float *oa = (float *)malloc(per * 4), *ob = (float *)malloc(per * 4), *og = (float *)malloc(per * 4);
    assert_true(oa && ob && og);
    for (int32_t s = 0; s <= BLOB_P - tail; s++) {
        int32_t tok = 5000 + s;
        uint32_t step_seed = seed + 100u + (uint32_t)s;
        blob_step(a, false, sa, &tok, 1, n + s, step_seed, oa);
        blob_step(b, false, sb, &tok, 1, n + s, step_seed, ob);
        blob_step(g2, true, s2, &tok, 1, n + s, step_seed, og);
        blob_close(og, oa, 1, kf, vf, "decode after import into a cuda cache");
        if (memcmp(oa, ob, per * 4) != 0)
            print_error("decode step %d after import into a cpu cache: outputs differ\n", (int)s);
        assert_memory_equal(oa, ob, per * 4);
    }
    blob_same_decode(a, sa, g2, s2, -1, "cuda cache after decoding on");
    blob_same_decode(a, sa, b, sb, -1, "cpu cache after decoding on");
    free(oa);
    free(ob);
    free(og);
    free(gbuf);
    free(abuf);
    kvp_cache_destroy(a);
    kvp_cache_destroy(b);
    kvp_cache_destroy(g);
    kvp_cache_destroy(g2);
}

static void test_blob_transfer(void **state) {
    (void)state;
    if (!blob_built()) skip();
    for (int i = 0; i < BLOB_NUM_FORMATS; i++) blob_transfer_case(blob_formats[i][0], blob_formats[i][1]);
}

/* A file tier on `dir`, without fsync (a test directory). */
static kvp_blob_tier_t *blob_file_tier(const char *dir) {
    kvp_file_tier_params_t fp;
    kvp_file_tier_params_init(&fp);
    fp.path = dir;
    fp.fsync = 0;
    kvp_blob_tier_t *t = nullptr;
    char err[KVP_ERR_SIZE] = "";
    int rc = kvp_file_tier_create(&fp, &t, err, sizeof err);
    if (rc != KVP_OK) print_error("file tier: %s\n", err);
    assert_int_equal(rc, KVP_OK);
    return t;
}

/* Files in `dir` whose names end in `suffix`. */
static int blob_count_files(const char *dir, const char *suffix) {
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    size_t sl = strlen(suffix);
    const struct dirent *de;
    while ((de = readdir(d)) != nullptr) {
        size_t l = strlen(de->d_name);
        if (l >= sl && strcmp(de->d_name + l - sl, suffix) == 0) n++;
    }
    closedir(d);
    return n;
}

/* Remove a test directory of files (the file tier makes no subdirectories). */
static int blob_remove_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (d != nullptr) {
        const struct dirent *de;
        while ((de = readdir(d)) != nullptr) {
            if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0) continue;
            char p[512];
            snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
            (void)unlink(p);
        }
        closedir(d);
    }
    return rmdir(dir);
}

/* The file tier test's directory while it exists: removed by the teardown
 * too, when a failed assertion ends the test early. */
static char blob_tier_dir[64];

static int blob_tier_teardown(void **state) {
    (void)state;
    if (blob_tier_dir[0] != '\0') (void)blob_remove_dir(blob_tier_dir);
    blob_tier_dir[0] = '\0';
    return 0;
}

/* A CUDA cache writes 3 full pages through to a file tier; a CPU cache
 * reading the same directory (its own tier, open all along, as another
 * process's would be) attaches the prompt from it: the same values, and
 * decoding goes on within the CUDA tolerance. A second CUDA cache reading
 * the directory does the same. */
static void blob_tier_case(int32_t kf, int32_t vf) {
    const int32_t full = 3, n = full * BLOB_P;
    const uint64_t salt = 11;
    const uint32_t seed = 777u + (uint32_t)kf * 16u + (uint32_t)vf;
    char *dir = blob_tier_dir;
    snprintf(dir, sizeof blob_tier_dir, "/tmp/kvp_cuda_blob_XXXXXX");
    if (mkdtemp(dir) == nullptr) dir[0] = '\0';
    assert_true(dir[0] != '\0');
    kvp_blob_tier_t *wt = blob_file_tier(dir), *rt = blob_file_tier(dir);
    int32_t toks[3 * BLOB_P];
    for (int32_t i = 0; i < n; i++) toks[i] = 70000 + 13 * i;

    kvp_cache_t *g = blob_cache(kf, vf, true), *c = blob_cache(kf, vf, false);
    blob_identity(g);
    blob_identity(c);
    int32_t gi = -1, ci = -1;
    assert_int_equal(kvp_cache_add_tier(g, wt, KVP_TIER_WRITE_THROUGH, &gi), KVP_OK);
    assert_int_equal(kvp_cache_add_tier(c, rt, KVP_TIER_READ, &ci), KVP_OK);
    assert_int_equal(gi, 0);
    assert_int_equal(ci, 0);
    kvp_blob_codec_t *codec = nullptr;
    assert_int_equal(kvp_cache_blob_codec(g, &codec), KVP_OK);
    uint64_t bb = 0;
    assert_int_equal(kvp_blob_size(codec, 0, &bb), KVP_OK);

    int32_t sg = blob_new_seq(g, salt);
    blob_step(g, true, sg, toks, n, 0, seed, nullptr);
    kvp_cache_tier_stats_t ts = blob_tier_stats(g, gi);
    assert_true(ts.written == 0); /* the step's K/V are complete at the next step or a flush */
    int rc = kvp_cache_flush(g);
    if (rc != KVP_OK) print_error("flush: %s\n", kvp_cache_last_error(g));
    assert_int_equal(rc, KVP_OK);
    ts = blob_tier_stats(g, gi);
    if (ts.written != (uint64_t)full || ts.errors != 0)
        print_error("write-through: %llu pages written, %llu errors (%s)\n",
                    (unsigned long long)ts.written, (unsigned long long)ts.errors,
                    kvp_blob_tier_last_error(wt));
    assert_true(ts.written == (uint64_t)full);
    assert_true(ts.errors == 0);
    assert_true(ts.bytes_out == (uint64_t)full * bb);
    assert_int_equal(blob_count_files(dir, ".kvpb"), full);

    int32_t sc = blob_new_seq(c, salt);
    int64_t matched = -1;
    rc = kvp_cache_seq_attach_prefix(c, sc, toks, n, &matched);
    if (rc != KVP_OK) print_error("attach_prefix: %s\n", kvp_cache_last_error(c));
    assert_int_equal(rc, KVP_OK);
    ts = blob_tier_stats(c, ci);
    if (matched != n || ts.hit_pages != (uint64_t)full)
        print_error("attach_prefix: %lld tokens matched; tier: %llu lookups, %llu hits, %llu misses, "
                    "%llu rejected (%s)\n",
                    (long long)matched, (unsigned long long)ts.lookups, (unsigned long long)ts.hit_pages,
                    (unsigned long long)ts.miss_pages, (unsigned long long)ts.rejected,
                    kvp_cache_last_error(c));
    assert_true(matched == n);
    assert_true(ts.lookups == (uint64_t)full);
    assert_true(ts.hit_pages == (uint64_t)full);
    assert_true(ts.miss_pages == 0);
    assert_true(ts.rejected == 0);
    assert_true(ts.bytes_in == (uint64_t)full * bb);
    assert_true(blob_seq_info(c, sc, nullptr).length == n);
    blob_same_decode(g, sg, c, sc, full, "file tier, cuda writer, cpu reader");

    /* a CUDA reader */
    kvp_blob_tier_t *rt2 = blob_file_tier(dir);
    kvp_cache_t *g2 = blob_cache(kf, vf, true);
    blob_identity(g2);
    assert_int_equal(kvp_cache_add_tier(g2, rt2, KVP_TIER_READ, NULL), KVP_OK);
    int32_t s2 = blob_new_seq(g2, salt);
    matched = -1;
    rc = kvp_cache_seq_attach_prefix(g2, s2, toks, n, &matched);
    if (rc != KVP_OK) print_error("attach_prefix (cuda): %s\n", kvp_cache_last_error(g2));
    assert_int_equal(rc, KVP_OK);
    assert_true(matched == n);
    ts = blob_tier_stats(g2, 0);
    assert_true(ts.hit_pages == (uint64_t)full);
    assert_true(ts.rejected == 0);
    blob_same_decode(g, sg, g2, s2, full, "file tier, cuda writer, cuda reader");

    /* one decode step on each */
    size_t per = (size_t)BLOB_LAYERS * BLOB_QH * BLOB_D;
    float *oc = (float *)malloc(per * 4), *og = (float *)malloc(per * 4), *og2 = (float *)malloc(per * 4);
    assert_true(oc && og && og2);
    int32_t tok = 9;
    blob_step(c, false, sc, &tok, 1, n, seed + 1, oc);
    blob_step(g, true, sg, &tok, 1, n, seed + 1, og);
    blob_step(g2, true, s2, &tok, 1, n, seed + 1, og2);
    blob_close(og, oc, 1, kf, vf, "decode after a file tier's prefix (writer)");
    blob_close(og2, oc, 1, kf, vf, "decode after a file tier's prefix (cuda reader)");
    free(oc);
    free(og);
    free(og2);

    kvp_cache_destroy(c);
    kvp_cache_destroy(g);
    kvp_cache_destroy(g2);
    kvp_blob_tier_destroy(rt2);
    kvp_blob_tier_destroy(rt);
    kvp_blob_tier_destroy(wt);
    assert_int_equal(blob_remove_dir(dir), 0);
    dir[0] = '\0';
}

static void test_blob_file_tier(void **state) {
    (void)state;
    if (!blob_built()) skip();
    for (int i = 0; i < BLOB_NUM_FORMATS; i++) blob_tier_case(blob_formats[i][0], blob_formats[i][1]);
}

/* Corrupt blobs of a CUDA cache's sequence are refused by another CUDA
 * cache (KVP_EBADBLOB, a checksum), the sequence left empty and the pool
 * as it was; then the intact bytes import and decode as the exporter's
 * (pages the failed imports wrote before the bad blob stay cached, and
 * must be right). */
static void blob_corrupt_case(int32_t kf, int32_t vf) {
    const int32_t n = 2 * BLOB_P + BLOB_P / 2;
    const uint64_t salt = 3;
    const uint32_t seed = 31u + (uint32_t)kf * 16u + (uint32_t)vf;
    int32_t toks[2 * BLOB_P + BLOB_P / 2];
    for (int32_t i = 0; i < n; i++) toks[i] = 12 + 5 * i;
    kvp_cache_t *g0 = blob_cache(kf, vf, true), *g = blob_cache(kf, vf, true);
    blob_identity(g0);
    blob_identity(g);
    int32_t s0 = blob_new_seq(g0, salt);
    blob_step(g0, true, s0, toks, n, 0, seed, nullptr);
    int32_t blobs = 0;
    uint64_t bytes = 0;
    uint8_t *buf = blob_export(g0, s0, toks, n, &blobs, &bytes);
    assert_int_equal(blobs, 3);
    /* where each blob starts (the payload length is at offset 80) */
    uint64_t start[4] = {0, 0, 0, 0};
    for (int32_t i = 0; i < blobs; i++) {
        uint64_t payload = 0;
        for (int j = 7; j >= 0; j--) payload = payload << 8 | buf[start[i] + 80 + (uint64_t)j];
        start[i + 1] = start[i] + KVP_BLOB_HEADER_BYTES + payload;
    }
    assert_true(start[blobs] == bytes);
    /* in this order, so that no page a failed import left cached hides a
     * later corruption: a header field (the token count) of the second
     * blob, then a payload byte of the first, the second, the last */
    const struct {
        int32_t blob;
        bool header;
    } flips[] = {{1, true}, {0, false}, {1, false}, {2, false}};
    uint8_t *bad = (uint8_t *)malloc((size_t)bytes);
    assert_non_null(bad);
    kvp_pool_stats_t before = blob_pool_stats(g);
    for (size_t f = 0; f < sizeof flips / sizeof flips[0]; f++) {
        int32_t i = flips[f].blob;
        uint64_t off = flips[f].header ? start[i] + 12
                                       : start[i] + KVP_BLOB_HEADER_BYTES +
                                             (start[i + 1] - start[i] - KVP_BLOB_HEADER_BYTES) / 3;
        memcpy(bad, buf, (size_t)bytes);
        bad[off] ^= 0x10;
        int32_t s = blob_new_seq(g, salt), r = -1;
        int rc = kvp_cache_seq_import(g, s, toks, n, bad, bytes, &r);
        if (rc != KVP_EBADBLOB || r != KVP_BLOB_CHECKSUM)
            print_error("blob %d (%s) flipped: import %d, reason %s: %s\n", (int)i,
                        flips[f].header ? "header" : "payload", rc, kvp_blob_reason_name(r),
                        kvp_cache_last_error(g));
        assert_int_equal(rc, KVP_EBADBLOB);
        assert_int_equal(r, KVP_BLOB_CHECKSUM);
        assert_non_null(strstr(kvp_cache_last_error(g), "checksum"));
        kvp_seq_info_t info = blob_seq_info(g, s, nullptr);
        assert_true(info.length == 0);
        assert_int_equal(info.num_pages, 0);
        assert_int_equal(kvp_cache_seq_release(g, s), KVP_OK);
        kvp_pool_stats_t after = blob_pool_stats(g);
        assert_true(after.used_pages == before.used_pages);
        assert_true(after.live_tokens == before.live_tokens);
        assert_true(after.used_staging == before.used_staging);
    }
    int32_t s = blob_new_seq(g, salt), r = -1;
    int rc = kvp_cache_seq_import(g, s, toks, n, buf, bytes, &r);
    if (rc != KVP_OK) print_error("import of the intact blobs: %s\n", kvp_cache_last_error(g));
    assert_int_equal(rc, KVP_OK);
    assert_int_equal(r, KVP_BLOB_OK);
    blob_same_decode(g0, s0, g, s, -1, "cuda cache after refused imports");
    free(bad);
    free(buf);
    kvp_cache_destroy(g0);
    kvp_cache_destroy(g);
}

static void test_blob_corrupt(void **state) {
    (void)state;
    if (!blob_built()) skip();
    for (int i = 0; i < BLOB_NUM_FORMATS; i++) blob_corrupt_case(blob_formats[i][0], blob_formats[i][1]);
}

static int setup(void **state) {
    (void)state;
    if (!have_device()) {
        print_message("no CUDA device: these tests need one (or the simulator)\n");
        return -1;
    }
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_append_bytes),
        cmocka_unit_test(test_ops_read_and_swap),
        cmocka_unit_test(test_fp8_scales),
        cmocka_unit_test(test_quantize_standalone),
        cmocka_unit_test(test_attention_formats),
        cmocka_unit_test(test_attention_shapes),
        cmocka_unit_test(test_attention_odd_pages),
        cmocka_unit_test(test_attention_ragged_and_splits),
        cmocka_unit_test(test_attention_options),
        cmocka_unit_test(test_attention_pipeline),
        cmocka_unit_test(test_streams),
        cmocka_unit_test(test_kernel_timing),
        cmocka_unit_test(test_pending_error_untouched),
        cmocka_unit_test(test_split_occupancy),
        cmocka_unit_test(test_engine_memory),
        cmocka_unit_test(test_block_padding),
        cmocka_unit_test(test_cache_facade),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_info_and_conventions),
        cmocka_unit_test(test_foreign_page_bytes),
        cmocka_unit_test(test_blob_transfer),
        cmocka_unit_test_teardown(test_blob_file_tier, blob_tier_teardown),
        cmocka_unit_test(test_blob_corrupt),
#ifdef KVP_CUDASIM
        cmocka_unit_test(test_injected_failures),
        cmocka_unit_test(test_swap_beyond_max_pitch),
#endif
    };
#ifdef KVP_CUDASIM
    const char *name = "cuda_backend (simulator)";
#else
    const char *name = "cuda_backend (GPU)";
#endif
    /* KVP_TEST_FILTER=PATTERN (cmocka's wildcards * and ?) runs the matching
     * tests only: scripts/gpu-check.sh runs the sanitizers one test at a time */
    const char *filter = getenv("KVP_TEST_FILTER");
    if (filter != NULL && filter[0] != '\0') cmocka_set_test_filter(filter);
    return cmocka_run_group_tests_name(name, tests, setup, NULL);
}
