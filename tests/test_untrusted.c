/*
 * Inputs a careless or hostile caller may pass, and page bytes that no
 * encoder wrote: every call either does its documented job or fails with a
 * status and a detail, changing nothing; no kernel reads outside a page or
 * its query tile, whatever the page holds (ASan/UBSan in `make test SAN=1`
 * watch the reads).
 */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kvpage.h"
#include "kvpage_ext.h"
#include "kvpage_plan.h"
#include "kvpage_tier.h"
#include "testutil.h"

#define D 128
#define P 16

/* Every storage format. */
static const int32_t formats[] = {KVP_FORMAT_FP32, KVP_FORMAT_FP16, KVP_FORMAT_BF16,
                                  KVP_FORMAT_FP8_E4M3, KVP_FORMAT_INT8, KVP_FORMAT_INT4};
#define NFORMATS (sizeof formats / sizeof formats[0])

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static float frand(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(rng_state >> 40) / (double)(1ull << 24)) * 2.0f - 1.0f;
}

static kvp_ctx_t *make_ctx(int32_t isa) {
    kvp_ctx_params_t cp;
    kvp_ctx_params_init(&cp);
    cp.isa = isa;
    cp.threads = 2;
    kvp_ctx_t *c = NULL;
    char err[KVP_ERR_SIZE];
    int rc = kvp_ctx_create(&cp, &c, err, sizeof err);
    if (rc != KVP_OK) print_error("ctx: %s\n", err);
    assert_int_equal(rc, KVP_OK);
    return c;
}

/* An allocator whose memory holds 0xA5 bytes, not zeros: what a page holds
 * before anything is written to it, with allocators that do not clear. */
static void *dirty_alloc(void *opaque, size_t size, size_t alignment) {
    (void)opaque;
    if (alignment < sizeof(void *)) alignment = sizeof(void *);
    void *p = NULL;
    if (posix_memalign(&p, alignment, size ? size : 1) != 0) return NULL;
    memset(p, 0xA5, size);
    return p;
}
static void dirty_free(void *opaque, void *p) {
    (void)opaque;
    free(p);
}

/* A store of one layer and one kv head. */
static kvp_store_t *store_of(int32_t kfmt, int32_t vfmt, int32_t head_dim, int32_t page_size,
                             int32_t pages, kvp_allocator_t alloc) {
    kvp_store_params_t sp;
    kvp_store_params_init(&sp);
    sp.layers = 1;
    sp.kv_heads = 1;
    sp.head_dim = head_dim;
    sp.page_size = page_size;
    sp.k_format = kfmt;
    sp.v_format = vfmt;
    sp.num_pages = (uint64_t)pages;
    sp.num_staging = 1;
    sp.allocator = alloc;
    kvp_store_t *s = NULL;
    char err[KVP_ERR_SIZE];
    int rc = kvp_store_create(&sp, &s, err, sizeof err);
    if (rc != KVP_OK) print_error("store: %s\n", err);
    assert_int_equal(rc, KVP_OK);
    return s;
}

/* head_dim 128, page 16, two pages; `dirty`: memory not cleared. */
static kvp_store_t *make_store(int32_t kfmt, int32_t vfmt, bool dirty) {
    kvp_allocator_t a = {dirty ? dirty_alloc : NULL, dirty ? dirty_free : NULL, NULL};
    return store_of(kfmt, vfmt, D, P, 2, a);
}

/* Two layers, one kv head, head_dim 128, page 16, 8 pages, 2 sequences. */
static kvp_cache_params_t small_cache(int32_t format) {
    kvp_cache_params_t cp;
    kvp_cache_params_init(&cp);
    cp.layers = 2;
    cp.kv_heads = 1;
    cp.head_dim = D;
    cp.page_size = P;
    cp.k_format = format;
    cp.v_format = format;
    cp.max_seqs = 2;
    cp.num_pages = 8;
    return cp;
}

static int quant(int32_t format, int32_t is_value, const float *x, void *block, bool back) {
    kvp_quant_desc_t q = {.struct_size = sizeof q};
    q.format = format;
    q.is_value = is_value;
    q.page_size = P;
    q.head_dim = D;
    q.heads = 1;
    q.dtype = KVP_FORMAT_FP32;
    char err[KVP_ERR_SIZE];
    int rc = back ? kvp_dequantize(&q, block, 1, (void *)(uintptr_t)x, err, sizeof err)
                  : kvp_quantize(&q, x, 1, block, err, sizeof err);
    if (rc != KVP_OK) print_error("quantize: %s\n", err);
    return rc;
}

/* A view of `batch` sequences over `s` (its page counts) and the
 * parameters of a call with one query head per kv head. */
static void make_call(const kvp_store_t *s, int32_t page_size, int32_t batch,
                      const int32_t *indptr, const int32_t *indices, const int32_t *last,
                      const int32_t *qo, const float *q, float *out, kvp_kv_view_t *v,
                      kvp_attention_params_t *ap) {
    kvp_store_info_t info = {.struct_size = sizeof info};
    assert_int_equal(kvp_store_info(s, &info), KVP_OK);
    memset(v, 0, sizeof *v);
    v->struct_size = sizeof *v;
    v->batch = batch;
    v->page_size = page_size;
    v->num_pages = info.num_pages;
    v->num_staging = info.num_staging;
    v->indptr = indptr;
    v->indices = indices;
    v->last_page_len = last;
    kvp_attention_params_init(ap);
    ap->q_heads = 1;
    ap->qo_indptr = qo;
    ap->q = q;
    ap->out = out;
}

/* Attention of one query row over page 0 (16 tokens) of `s`. */
static int attend(kvp_ctx_t *c, kvp_store_t *s, const float *q, float *out) {
    static const int32_t indptr[] = {0, 1}, indices[] = {0}, last[] = {P}, qo[] = {0, 1};
    kvp_kv_view_t v;
    kvp_attention_params_t ap;
    make_call(s, P, 1, indptr, indices, last, qo, q, out, &v, &ap);
    return kvp_attention(c, s, &v, &ap);
}

/* float64 attention of q over 16 decoded key and value rows. */
static void reference(const float *q, const float *k, const float *v, double *out) {
    double logit[P], m = -INFINITY, l = 0.0;
    for (int t = 0; t < P; t++) {
        double dot = 0.0;
        for (int d = 0; d < D; d++) dot += (double)q[d] * (double)k[t * D + d];
        logit[t] = dot / sqrt((double)D);
        if (logit[t] > m) m = logit[t];
    }
    for (int d = 0; d < D; d++) out[d] = 0.0;
    for (int t = 0; t < P; t++) {
        double p = exp(logit[t] - m);
        l += p;
        for (int d = 0; d < D; d++) out[d] += p * (double)v[t * D + d];
    }
    for (int d = 0; d < D; d++) out[d] /= l;
}

/* int4 key blocks keep head_dim/32 outlier channels as int8 in a table of
 * u16 channel indices (docs/formats.md). Indices past head_dim, as in
 * foreign or unwritten bytes, must not steer a kernel's reads: such an
 * entry is ignored by every kernel, as kvp_dequantize() ignores it. The
 * bad entries get a large scale and codes that differ from token to token,
 * so a kernel that reads any nonzero value for them misses the reference by
 * far: 200 lies in the
 * padding of the kernels' 256-wide query rows, 1029 in the tile's next
 * arrays (inside the tile: only the result can show that read), 0xFFFF far
 * outside it (ASan's). */
static void test_int4_outlier_index_out_of_range(void **state) {
    (void)state;
    float k[P * D], v[P * D], q[D], kd[P * D], vd[P * D];
    for (int i = 0; i < P * D; i++) {
        k[i] = frand() * ((i % D) % 29 == 3 ? 12.0f : 1.0f); /* outlier channels */
        v[i] = frand();
    }
    for (int d = 0; d < D; d++) q[d] = frand();
    kvp_store_t *s = make_store(KVP_FORMAT_INT4, KVP_FORMAT_FP16, false);
    kvp_layout_t lay = {.struct_size = sizeof lay};
    assert_int_equal(kvp_store_layout(s, &lay), KVP_OK);
    uint8_t *page = calloc(1, lay.page_bytes);
    assert_non_null(page);
    assert_int_equal(quant(KVP_FORMAT_INT4, 0, k, page, false), KVP_OK);
    assert_int_equal(quant(KVP_FORMAT_FP16, 1, v, page + lay.k_block_bytes, false), KVP_OK);
    /* the outlier table (R = D/32 entries): u16 indices, fp16 scales, fp16
     * minimums, then R x P int8 codes; after P*D/2 code bytes and D scales
     * + D minimums */
    enum { R = D / 32 };
    uint8_t *idx = page + P * D / 2 + 4 * D;
    uint16_t first;
    memcpy(&first, idx, 2);
    assert_true(first < D); /* an encoder's table */
    const uint16_t bad[R - 1] = {200, 1029, 0xFFFF}, big = 0x63D0; /* fp16 1000 */
    for (int j = 1; j < R; j++) {
        memcpy(idx + 2 * j, &bad[j - 1], 2);
        memcpy(idx + 2 * R + 2 * j, &big, 2);
        for (int t = 0; t < P; t++) idx[6 * R + j * P + t] = (uint8_t)(t * 37); /* not a constant */
    }
    assert_int_equal(kvp_store_page_from_host(s, 0, 0, page, lay.page_bytes), KVP_OK);
    /* what the bytes mean: kvp_dequantize of the same block */
    assert_int_equal(quant(KVP_FORMAT_INT4, 0, kd, page, true), KVP_OK);
    assert_int_equal(quant(KVP_FORMAT_FP16, 1, vd, page + lay.k_block_bytes, true), KVP_OK);
    double ref[D];
    reference(q, kd, vd, ref);
    for (int32_t isa = KVP_ISA_PORTABLE; isa < KVP_ISA_COUNT; isa++) {
        if (!kvp_isa_supported(isa)) continue;
        kvp_ctx_t *c = make_ctx(isa);
        float out[D];
        int rc = attend(c, s, q, out);
        if (rc != KVP_OK) print_error("%s: %s\n", kvp_isa_name(isa), kvp_ctx_last_error(c));
        assert_int_equal(rc, KVP_OK);
        double num = 0.0, den = 0.0;
        for (int d = 0; d < D; d++) {
            assert_true(isfinite(out[d]));
            num += (out[d] - ref[d]) * (out[d] - ref[d]);
            den += ref[d] * ref[d];
        }
        double rel = sqrt(num / den);
        if (rel > 0.02) print_error("%s: rel err %g against the decoded page\n", kvp_isa_name(isa), rel);
        assert_true(rel <= 0.02);
        kvp_ctx_destroy(c);
    }
    free(page);
    kvp_store_destroy(s);
}

/* Pages nothing has written (an allocator that does not clear memory),
 * read in every format by every kernel: KVP_OK, numbers of no meaning, no
 * read outside the arena or the kernels' tiles. */
static void test_unwritten_pages_every_format(void **state) {
    (void)state;
    float q[D];
    for (int d = 0; d < D; d++) q[d] = frand();
    for (size_t kf = 0; kf < NFORMATS; kf++)
        for (size_t vf = 0; vf < NFORMATS; vf++) {
            kvp_store_t *s = make_store(formats[kf], formats[vf], true);
            for (int32_t isa = KVP_ISA_PORTABLE; isa < KVP_ISA_COUNT; isa++) {
                if (!kvp_isa_supported(isa)) continue;
                kvp_ctx_t *c = make_ctx(isa);
                float out[D];
                int rc = attend(c, s, q, out);
                if (rc != KVP_OK) print_error("%s: %s\n", kvp_isa_name(isa), kvp_ctx_last_error(c));
                assert_int_equal(rc, KVP_OK);
                kvp_ctx_destroy(c);
            }
            kvp_store_destroy(s);
        }
}

/* kvp_store_page_check(): what every encoder writes passes, in every format
 * pair; each broken invariant is refused with its place named. */
static void test_page_check(void **state) {
    (void)state;
    const size_t nf = NFORMATS;
    float k[P * D], v[P * D];
    for (int i = 0; i < P * D; i++) {
        k[i] = frand() * ((i % D) % 29 == 3 ? 12.0f : 1.0f);
        v[i] = frand();
    }
    k[5] = NAN; /* non-finite inputs still give finite scales */
    v[9] = INFINITY;
    kvp_allocator_t libc = {NULL, NULL, NULL};
    for (size_t kf = 0; kf < nf; kf++)
        for (size_t vf = 0; vf < nf; vf++) {
            kvp_store_t *s = store_of(formats[kf], formats[vf], D, P, 2, libc);
            kvp_layout_t lay = {.struct_size = sizeof lay};
            assert_int_equal(kvp_store_layout(s, &lay), KVP_OK);
            uint8_t *page = calloc(1, lay.page_bytes);
            assert_non_null(page);
            kvp_quant_desc_t q = {.struct_size = sizeof q};
            q.page_size = P;
            q.head_dim = D;
            q.heads = 1;
            q.dtype = KVP_FORMAT_FP32;
            q.fp8_scale = 0.05f;
            char err[KVP_ERR_SIZE];
            q.format = formats[kf];
            assert_int_equal(kvp_quantize(&q, k, 1, page, err, sizeof err), KVP_OK);
            q.format = formats[vf];
            q.is_value = 1;
            assert_int_equal(kvp_quantize(&q, v, 1, page + lay.k_block_bytes, err, sizeof err), KVP_OK);
            int rc = kvp_store_page_check(s, 0, page, lay.page_bytes);
            if (rc != KVP_OK) print_error("%s/%s: %s\n", kvp_format_name(formats[kf]),
                                          kvp_format_name(formats[vf]), kvp_store_last_error(s));
            assert_int_equal(rc, KVP_OK);
            /* the whole serialization, nothing else; a real page id */
            assert_int_equal(kvp_store_page_check(s, 0, page, lay.page_bytes - 1), KVP_EINVAL);
            assert_int_equal(kvp_store_page_check(s, 0, NULL, lay.page_bytes), KVP_EINVAL);
            assert_int_equal(kvp_store_page_check(s, -1, page, lay.page_bytes), KVP_EINVAL);
            assert_int_equal(kvp_store_page_check(NULL, 0, page, lay.page_bytes), KVP_EINVAL);
            /* a NaN scale in the first scale of each quantized side */
            const uint16_t nan16 = 0x7E00, neg16 = 0xBC00 /* -1 */;
            for (int side = 0; side < 2; side++) {
                int32_t f = side == 0 ? formats[kf] : formats[vf];
                if (f != KVP_FORMAT_INT8 && f != KVP_FORMAT_INT4) continue;
                uint8_t *b = page + (side == 0 ? 0 : lay.k_block_bytes);
                size_t data = (size_t)P * D / (f == KVP_FORMAT_INT4 ? 2 : 1);
                uint8_t keep[2];
                memcpy(keep, b + data, 2);
                memcpy(b + data, &nan16, 2);
                assert_int_equal(kvp_store_page_check(s, 0, page, lay.page_bytes), KVP_EINVAL);
                assert_non_null(strstr(kvp_store_last_error(s), side == 0 ? "K block" : "V block"));
                memcpy(b + data, &neg16, 2);
                assert_int_equal(kvp_store_page_check(s, 0, page, lay.page_bytes), KVP_EINVAL);
                memcpy(b + data, keep, 2);
            }
            if (formats[kf] == KVP_FORMAT_INT4) { /* the outlier list: in range, increasing */
                uint8_t *idx = page + P * D / 2 + 4 * D, keep[4];
                memcpy(keep, idx, 4);
                const uint16_t big = D, dup[2] = {7, 7};
                memcpy(idx, &big, 2);
                assert_int_equal(kvp_store_page_check(s, 0, page, lay.page_bytes), KVP_EINVAL);
                assert_non_null(strstr(kvp_store_last_error(s), "outlier"));
                memcpy(idx, dup, 4);
                assert_int_equal(kvp_store_page_check(s, 0, page, lay.page_bytes), KVP_EINVAL);
                memcpy(idx, keep, 4);
            }
            assert_int_equal(kvp_store_page_check(s, 0, page, lay.page_bytes), KVP_OK);
            /* plain formats and staging pages hold any bits */
            if (lay.needs_staging) {
                uint8_t *junk = malloc(lay.staging_page_bytes);
                memset(junk, 0xFF, lay.staging_page_bytes);
                assert_int_equal(kvp_store_page_check(s, 2, junk, lay.staging_page_bytes), KVP_OK);
                free(junk);
            } else if (formats[kf] != KVP_FORMAT_INT8 && formats[vf] != KVP_FORMAT_INT8 &&
                       formats[vf] != KVP_FORMAT_INT4) {
                memset(page, 0xFF, lay.page_bytes);
                assert_int_equal(kvp_store_page_check(s, 0, page, lay.page_bytes), KVP_OK);
            }
            free(page);
            kvp_store_destroy(s);
        }
}

/* What a store writes through appends and seals passes the check, read back
 * with kvp_store_page_to_host() (the host tier's bytes). */
static void test_page_check_of_written_pages(void **state) {
    (void)state;
    kvp_cache_params_t cp = small_cache(KVP_FORMAT_INT4);
    kvp_cache_t *c = NULL;
    char err[KVP_ERR_SIZE];
    assert_int_equal(kvp_cache_create(&cp, &c, err, sizeof err), KVP_OK);
    int32_t seq, num_new = P + 3;
    assert_int_equal(kvp_cache_seq_create(c, 0, 0, &seq), KVP_OK);
    static float kv[(P + 3) * D];
    for (int i = 0; i < (P + 3) * D; i++) kv[i] = frand() * (i % D == 17 ? 20.0f : 1.0f);
    assert_int_equal(kvp_cache_begin_step(c, &seq, 1, &num_new, NULL), KVP_OK);
    for (int32_t layer = 0; layer < cp.layers; layer++)
        assert_int_equal(kvp_cache_write(c, layer, KVP_FORMAT_FP32, kv, kv, 0, 0), KVP_OK);
    kvp_kv_view_t view = {.struct_size = sizeof view};
    assert_int_equal(kvp_cache_step_view(c, &view, NULL, NULL, NULL), KVP_OK);
    assert_int_equal(view.indptr[1], 2); /* a sealed pool page, then a staging page */
    kvp_cache_parts_t parts = {.struct_size = sizeof parts};
    assert_int_equal(kvp_cache_parts(c, &parts), KVP_OK);
    kvp_layout_t lay = {.struct_size = sizeof lay};
    assert_int_equal(kvp_store_layout(parts.store, &lay), KVP_OK);
    for (int32_t i = 0; i < 2; i++) {
        int32_t page = view.indices[i];
        uint64_t n = i == 0 ? lay.page_bytes : lay.staging_page_bytes;
        uint8_t *buf = malloc(n);
        assert_int_equal(kvp_store_page_to_host(parts.store, page, 0, buf, n), KVP_OK);
        int rc = kvp_store_page_check(parts.store, page, buf, n);
        if (rc != KVP_OK) print_error("page %d: %s\n", (int)page, kvp_store_last_error(parts.store));
        assert_int_equal(rc, KVP_OK);
        free(buf);
    }
    kvp_cache_destroy(c);
}

/* An allocator that ends every large allocation at an inaccessible page,
 * so a read past the end faults in any build, not only under ASan. */
typedef struct {
    void *user, *base;
    size_t total;
} guard_map;
static guard_map guard_maps[8];

static void *guard_alloc(void *opaque, size_t size, size_t alignment) {
    (void)opaque;
    if (alignment < sizeof(void *)) alignment = sizeof(void *);
    if (size < 1024) {
        void *p = NULL;
        return posix_memalign(&p, alignment, size ? size : 1) == 0 ? p : NULL;
    }
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t total = (size + alignment + page - 1) / page * page + page;
    uint8_t *base = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) return NULL;
    if (mprotect(base + total - page, page, PROT_NONE) != 0) {
        munmap(base, total);
        return NULL;
    }
    uintptr_t user = ((uintptr_t)(base + total - page) - size) & ~(uintptr_t)(alignment - 1);
    for (size_t i = 0; i < sizeof guard_maps / sizeof guard_maps[0]; i++)
        if (guard_maps[i].user == NULL) {
            guard_maps[i] = (guard_map){(void *)user, base, total};
            return (void *)user;
        }
    munmap(base, total);
    return NULL;
}
static void guard_free(void *opaque, void *p) {
    (void)opaque;
    for (size_t i = 0; i < sizeof guard_maps / sizeof guard_maps[0]; i++)
        if (guard_maps[i].user == p && p != NULL) {
            munmap(guard_maps[i].base, guard_maps[i].total);
            guard_maps[i].user = NULL;
            return;
        }
    free(p);
}

/* A block whose scale data ends the arena (the last V block of the last
 * layer, no staging pages, no padding): int4 values at page 4 and head_dim
 * 64 are 128 code bytes + 32 scale bytes = 160 bytes. Every kernel reads
 * the page's last tokens without touching the byte after the arena (the
 * AVX2 int4-value stage loaded 8 fp16 scales where 4 were left). */
static void test_reads_end_at_the_arena(void **state) {
    (void)state;
    enum { PS = 4, HD = 64 };
    for (size_t vf = 0; vf < NFORMATS; vf++) {
        /* enough pages that the arena is a multiple of its alignment and so
         * ends exactly at the guard page */
        kvp_layout_t lay = {.struct_size = sizeof lay};
        char err[KVP_ERR_SIZE];
        assert_int_equal(kvp_layout_compute(1, 1, HD, PS, KVP_FORMAT_FP16, formats[vf], &lay,
                                            err, sizeof err), KVP_OK);
        int32_t pages = 1;
        while ((lay.fixed_bytes + (uint64_t)pages * lay.page_bytes) % KVP_ARENA_ALIGN != 0) pages++;
        kvp_allocator_t guard = {guard_alloc, guard_free, NULL};
        kvp_store_t *s = store_of(KVP_FORMAT_FP16, formats[vf], HD, PS, pages, guard);
        float rows[PS * HD];
        for (int i = 0; i < PS * HD; i++) rows[i] = frand();
        int64_t slots[PS];
        for (int t = 0; t < PS; t++) slots[t] = (int64_t)(pages - 1) * PS + t; /* the last page */
        kvp_append_params_t a;
        kvp_append_params_init(&a);
        a.rows = PS;
        a.dtype = KVP_FORMAT_FP32;
        a.k = rows;
        a.v = rows;
        a.slots = slots;
        assert_int_equal(kvp_store_append(s, &a), KVP_OK);
        static const int32_t indptr[] = {0, 1}, last[] = {PS}, qo[] = {0, 1};
        const int32_t indices[] = {pages - 1};
        float q[HD], out[HD];
        for (int d = 0; d < HD; d++) q[d] = frand();
        kvp_kv_view_t v;
        kvp_attention_params_t ap;
        make_call(s, PS, 1, indptr, indices, last, qo, q, out, &v, &ap);
        for (int32_t isa = KVP_ISA_PORTABLE; isa < KVP_ISA_COUNT; isa++) {
            if (!kvp_isa_supported(isa)) continue;
            kvp_ctx_t *c = make_ctx(isa);
            assert_int_equal(kvp_attention(c, s, &v, &ap), KVP_OK);
            for (int d = 0; d < HD; d++) assert_true(isfinite(out[d]));
            kvp_ctx_destroy(c);
        }
        kvp_store_destroy(s);
    }
}

/* kvp_quantize() / kvp_dequantize(): a page count whose blocks fit in 64
 * bits but whose tensor does not (fp8 blocks are smaller than the fp32
 * tensor) is refused, not read past. */
static void test_quantize_size_overflow(void **state) {
    (void)state;
    kvp_quant_desc_t q = {.struct_size = sizeof q};
    q.format = KVP_FORMAT_FP8_E4M3;
    q.page_size = 2;
    q.head_dim = 8;
    q.heads = 1;
    q.dtype = KVP_FORMAT_FP32;
    q.fp8_scale = 1.0f;
    float x[16] = {0};
    uint8_t block[64] = {0};
    char err[KVP_ERR_SIZE];
    const int64_t pages = 970000000000000000ll;
    assert_int_equal(kvp_quantize(&q, x, pages, block, err, sizeof err), KVP_EINVAL);
    assert_non_null(strstr(err, "overflow"));
    assert_int_equal(kvp_dequantize(&q, block, pages, x, err, sizeof err), KVP_EINVAL);
    assert_int_equal(kvp_quantize(&q, x, 1, block, err, sizeof err), KVP_OK);
}

/* The view's CSR arrays with extreme values: differences and products that
 * wrap in 32 bits are errors, not huge or negative counts. */
static void test_view_extremes(void **state) {
    (void)state;
    kvp_store_t *s = make_store(KVP_FORMAT_FP16, KVP_FORMAT_FP16, false);
    kvp_ctx_t *c = make_ctx(KVP_ISA_AUTO);
    enum { PAGES = 2049 };
    int32_t *indices = calloc(PAGES, sizeof *indices); /* page 0, repeated */
    assert_non_null(indices);
    int32_t indptr[3] = {0, 1, 2}, last[2] = {P, P}, qo[3] = {0, 1, 2};
    float *q = calloc((size_t)D * 8, sizeof *q), *out = calloc((size_t)D * 8, sizeof *out);
    kvp_kv_view_t v;
    kvp_attention_params_t ap;
    make_call(s, P, 2, indptr, indices, last, qo, q, out, &v, &ap);
    assert_int_equal(kvp_attention(c, s, &v, &ap), KVP_OK);
#define EXPECT_EINVAL(needle)                                                                      \
    do {                                                                                           \
        memset(out, 0x7F, 8 * D * sizeof *out);                                                    \
        int rc_ = kvp_attention(c, s, &v, &ap);                                                    \
        if (rc_ != KVP_EINVAL || strstr(kvp_ctx_last_error(c), needle) == NULL)                    \
            print_error("expected EINVAL '%s', got %s: %s\n", needle, kvp_status_name(rc_),      \
                        kvp_ctx_last_error(c));                                                    \
        assert_int_equal(rc_, KVP_EINVAL);                                                         \
        assert_non_null(strstr(kvp_ctx_last_error(c), needle));                                    \
        for (int i_ = 0; i_ < 8 * D; i_++) assert_true(((uint32_t *)(void *)out)[i_] == 0x7F7F7F7Fu); \
    } while (0)
    /* INT32_MIN - 1 wraps to INT32_MAX in 32 bits: a "valid" huge page count */
    indptr[1] = 1;
    indptr[2] = INT32_MIN;
    EXPECT_EINVAL("decreases");
    indptr[1] = INT32_MAX; /* 2^31 - 1 pages of 16 tokens */
    indptr[2] = INT32_MAX;
    EXPECT_EINVAL("2^31 - 1");
    indptr[1] = 1;
    indptr[2] = 2;
    qo[1] = 1;
    qo[2] = INT32_MIN;
    EXPECT_EINVAL("decreases");
    qo[1] = INT32_MAX;
    qo[2] = INT32_MAX;
    EXPECT_EINVAL("query rows");
    qo[1] = 1;
    qo[2] = 2;
    /* q_heads: bounded, and so is rows x q_heads (what the kernels count in
     * 32 bits): 2048 pages of page 0 give 32768 tokens, and 32769 rows of
     * 65536 heads are more than 2^31 head rows */
    ap.q_heads = 1 << 20;
    EXPECT_EINVAL("65536");
    ap.q_heads = 65536;
    indptr[1] = PAGES - 1;
    indptr[2] = PAGES;
    qo[1] = (PAGES - 1) * P;
    qo[2] = qo[1] + 1;
    EXPECT_EINVAL("head rows");
    ap.q_heads = 1;
    indptr[1] = 1;
    indptr[2] = 2;
    qo[1] = 1;
    qo[2] = 2;
    v.reserved_ = 1;
    EXPECT_EINVAL("reserved_");
    v.reserved_ = 0;
    assert_int_equal(kvp_attention(c, s, &v, &ap), KVP_OK);
#undef EXPECT_EINVAL
    free(indices);
    free(q);
    free(out);
    kvp_ctx_destroy(c);
    kvp_store_destroy(s);
}

/* Append descriptors: row strides whose products wrap, reserved_ fields,
 * and error text with extreme token ranges. Nothing is written on error. */
static void test_append_and_read_extremes(void **state) {
    (void)state;
    kvp_store_t *s = make_store(KVP_FORMAT_FP16, KVP_FORMAT_FP16, false);
    kvp_layout_t lay = {.struct_size = sizeof lay};
    assert_int_equal(kvp_store_layout(s, &lay), KVP_OK);
    uint8_t *before = malloc(lay.page_bytes), *after = malloc(lay.page_bytes);
    assert_int_equal(kvp_store_page_to_host(s, 0, 0, before, lay.page_bytes), KVP_OK);
    float rows[2 * D];
    for (int i = 0; i < 2 * D; i++) rows[i] = frand();
    int64_t slots[2] = {0, 1};
    kvp_append_params_t a;
    kvp_append_params_init(&a);
    a.rows = 2;
    a.dtype = KVP_FORMAT_FP32;
    a.k = rows;
    a.v = rows;
    a.slots = slots;
    const int64_t strides[] = {INT64_MAX / 2, INT64_MAX, INT64_MAX / 4 + 1};
    for (size_t i = 0; i < sizeof strides / sizeof strides[0]; i++) {
        a.k_row_stride = strides[i];
        assert_int_equal(kvp_store_append(s, &a), KVP_EINVAL);
        assert_non_null(strstr(kvp_store_last_error(s), "address space"));
        a.k_row_stride = 0;
        a.v_row_stride = strides[i];
        assert_int_equal(kvp_store_append(s, &a), KVP_EINVAL);
        a.v_row_stride = 0;
    }
    a.reserved_ = 7;
    assert_int_equal(kvp_store_append(s, &a), KVP_EINVAL);
    assert_non_null(strstr(kvp_store_last_error(s), "reserved_"));
    assert_int_equal(kvp_store_page_to_host(s, 0, 0, after, lay.page_bytes), KVP_OK);
    assert_memory_equal(before, after, lay.page_bytes);
    a.reserved_ = 0;
    a.k_row_stride = D; /* the densest legal stride */
    assert_int_equal(kvp_store_append(s, &a), KVP_OK);
    /* store read: t0 + n - 1 must not wrap while the message is written */
    float k[D];
    assert_int_equal(kvp_store_read(s, 0, 0, INT32_MAX, INT32_MAX, k, NULL), KVP_EINVAL);
    assert_non_null(strstr(kvp_store_last_error(s), "4294967293"));
    assert_int_equal(kvp_store_read(s, 0, 0, 1, INT32_MAX, k, NULL), KVP_EINVAL);
    free(before);
    free(after);
    kvp_store_destroy(s);
}

/* reserved_ fields of caller-filled structs must be 0. */
static void test_reserved_fields(void **state) {
    (void)state;
    char err[KVP_ERR_SIZE];
    kvp_pool_params_t pp;
    kvp_pool_params_init(&pp);
    pp.page_size = P;
    pp.num_pages = 4;
    pp.reserved_ = 1;
    kvp_pool_t *pool = NULL;
    assert_int_equal(kvp_pool_create(&pp, &pool, err, sizeof err), KVP_EINVAL);
    assert_null(pool);
    assert_non_null(strstr(err, "reserved_"));
    pp.reserved_ = 0;
    assert_int_equal(kvp_pool_create(&pp, &pool, err, sizeof err), KVP_OK);
    kvp_table_t *t = NULL;
    assert_int_equal(kvp_table_create(pool, 2, &t, err, sizeof err), KVP_OK);
    int32_t seq, indptr[2], indices[4], last[1];
    assert_int_equal(kvp_table_seq_create(t, 0, 0, &seq), KVP_OK);
    int32_t nops = 0;
    assert_int_equal(kvp_table_append(t, seq, 3, NULL, NULL, NULL, 0, &nops), KVP_OK);
    kvp_batch_buffers_t bb = {.struct_size = sizeof bb};
    bb.indptr = indptr;
    bb.indices = indices;
    bb.last_page_len = last;
    bb.indices_capacity = 4;
    bb.reserved_ = 3;
    kvp_kv_view_t view = {.struct_size = sizeof view};
    assert_int_equal(kvp_table_export(t, &seq, 1, NULL, &bb, &view), KVP_EINVAL);
    assert_non_null(strstr(kvp_table_last_error(t), "reserved_"));
    bb.reserved_ = 0;
    assert_int_equal(kvp_table_export(t, &seq, 1, NULL, &bb, &view), KVP_OK);
    assert_int_equal(view.reserved_, 0);

    kvp_layout_t lay = {.struct_size = sizeof lay};
    assert_int_equal(kvp_layout_compute(1, 1, D, P, KVP_FORMAT_FP16, KVP_FORMAT_FP16, &lay, err,
                                        sizeof err), KVP_OK);
    kvp_tier_params_t tp;
    kvp_tier_params_init(&tp);
    tp.host_bytes = 1 << 20;
    tp.layout = &lay;
    tp.reserved_ = -1;
    kvp_tier_t *tier = NULL;
    assert_int_equal(kvp_tier_create(t, &tp, &tier, err, sizeof err), KVP_EINVAL);
    assert_non_null(strstr(err, "reserved_"));
    assert_null(tier);
    kvp_table_destroy(t);
    kvp_pool_destroy(pool);

    kvp_cache_params_t cp = small_cache(KVP_FORMAT_FP16);
    cp.reserved_ = 2;
    kvp_cache_t *c = NULL;
    assert_int_equal(kvp_cache_create(&cp, &c, err, sizeof err), KVP_EINVAL);
    assert_non_null(strstr(err, "reserved_"));
    assert_null(c);
}

/* kvp_cache_attend() before kvp_cache_write() of the layer in this step is
 * an error the cache reports (the step's rows are not in the pages yet). */
static void test_cache_attend_before_write(void **state) {
    (void)state;
    kvp_cache_params_t cp = small_cache(KVP_FORMAT_INT4);
    kvp_allocator_t dirty = {dirty_alloc, dirty_free, NULL};
    cp.allocator = dirty;
    kvp_cache_t *c = NULL;
    char err[KVP_ERR_SIZE];
    int rc = kvp_cache_create(&cp, &c, err, sizeof err);
    if (rc != KVP_OK) print_error("cache: %s\n", err);
    assert_int_equal(rc, KVP_OK);
    int32_t seq;
    assert_int_equal(kvp_cache_seq_create(c, 0, 0, &seq), KVP_OK);
    enum { N = P + 3 };
    static float kv[N * D], q[N * D], out[N * D];
    for (int i = 0; i < N * D; i++) kv[i] = q[i] = frand();
    int32_t num_new = N;
    assert_int_equal(kvp_cache_begin_step(c, &seq, 1, &num_new, NULL), KVP_OK);
    kvp_attention_params_t ap;
    kvp_attention_params_init(&ap);
    ap.layer = 1;
    ap.q_heads = 1;
    ap.q = q;
    ap.out = out;
    memset(out, 0x7F, sizeof out);
    assert_int_equal(kvp_cache_attend(c, &ap), KVP_ESTATE);
    assert_non_null(strstr(kvp_cache_last_error(c), "kvp_cache_write"));
    uint32_t first;
    memcpy(&first, out, sizeof first);
    assert_true(first == 0x7F7F7F7Fu);
    assert_int_equal(kvp_cache_write(c, 0, KVP_FORMAT_FP32, kv, kv, 0, 0), KVP_OK);
    assert_int_equal(kvp_cache_attend(c, &ap), KVP_ESTATE); /* layer 1 still unwritten */
    ap.layer = 0;
    assert_int_equal(kvp_cache_attend(c, &ap), KVP_OK);
    ap.layer = 1;
    assert_int_equal(kvp_cache_write(c, 1, KVP_FORMAT_FP32, kv, kv, 0, 0), KVP_OK);
    assert_int_equal(kvp_cache_attend(c, &ap), KVP_OK);
    for (int i = 0; i < N * D; i++) assert_true(isfinite(out[i]));
    /* a new step starts with no layer written */
    num_new = 1;
    assert_int_equal(kvp_cache_begin_step(c, &seq, 1, &num_new, NULL), KVP_OK);
    assert_int_equal(kvp_cache_attend(c, &ap), KVP_ESTATE);
    kvp_cache_destroy(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_int4_outlier_index_out_of_range),
        cmocka_unit_test(test_unwritten_pages_every_format),
        cmocka_unit_test(test_page_check),
        cmocka_unit_test(test_page_check_of_written_pages),
        cmocka_unit_test(test_reads_end_at_the_arena),
        cmocka_unit_test(test_quantize_size_overflow),
        cmocka_unit_test(test_view_extremes),
        cmocka_unit_test(test_append_and_read_extremes),
        cmocka_unit_test(test_reserved_fields),
        cmocka_unit_test(test_cache_attend_before_write),
    };
    return cmocka_run_group_tests_name("untrusted", tests, NULL, NULL);
}
