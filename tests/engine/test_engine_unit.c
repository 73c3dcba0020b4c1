/*
 * The engine's parts without the model: GGUF parsing (hand-made files, every
 * truncation, refused types), fp16 conversion, the matmul kernels of every
 * ISA against a double-precision reference (and batch/thread invariance),
 * the thread pool, the contiguous and the paged (libkvpage) KV caches'
 * attention against a naive reference, the tokenizer on a hand-made vocabulary, eval's windows and KL.
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kvpage.h>
#include <kvpage_ext.h> /* kvp_build_has */

#include "eval.h"
#include "gguf.h"
#include "kv.h"
#include "pool.h"
#include "quant.h"
#include "serve.h"
#include "tokenizer.h"
#include "vec.h"

/* ---- a tiny GGUF writer ------------------------------------------------------------ */

typedef struct {
    uint8_t *p;
    size_t n, cap;
} buf_t;

static void put(buf_t *b, const void *src, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        assert_non_null(b->p);
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}
static void put_u32(buf_t *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(buf_t *b, uint64_t v) { put(b, &v, 8); }
static void put_str(buf_t *b, const char *s) {
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}
static void put_key(buf_t *b, const char *key, uint32_t type) {
    put_str(b, key);
    put_u32(b, type);
}
static void pad_to(buf_t *b, size_t align) {
    static const uint8_t zero[64];
    while (b->n % align) put(b, zero, 1);
}

/* A file with every scalar type, two arrays, an F32 and a Q8_0 tensor. */
static buf_t make_small_gguf(uint32_t tensor1_type, uint64_t tensor1_offset) {
    buf_t b = {0};
    put_u32(&b, 0x46554747u);
    put_u32(&b, 3);
    put_u64(&b, 2);  /* tensors */
    put_u64(&b, 7);  /* kv */
    put_key(&b, "general.architecture", GGUF_STRING);
    put_str(&b, "llama");
    put_key(&b, "x.u32", GGUF_U32);
    put_u32(&b, 4000000000u);
    put_key(&b, "x.i8", GGUF_I8);
    int8_t i8 = -5;
    put(&b, &i8, 1);
    put_key(&b, "x.f32", GGUF_F32);
    float f = 1e-5f;
    put(&b, &f, 4);
    put_key(&b, "x.strs", GGUF_ARRAY);
    put_u32(&b, GGUF_STRING);
    put_u64(&b, 3);
    put_str(&b, "a");
    put_str(&b, "");
    put_str(&b, "ccc");
    put_key(&b, "x.ints", GGUF_ARRAY);
    put_u32(&b, GGUF_I32);
    put_u64(&b, 2);
    put_u32(&b, 7);
    put_u32(&b, (uint32_t)-9);
    put_key(&b, "general.alignment", GGUF_U32);
    put_u32(&b, 64);
    /* tensor infos */
    put_str(&b, "vec");
    put_u32(&b, 1);
    put_u64(&b, 8);
    put_u32(&b, GGML_F32);
    put_u64(&b, 0);
    put_str(&b, "mat");
    put_u32(&b, 2);
    put_u64(&b, 32);
    put_u64(&b, 2);
    put_u32(&b, tensor1_type);
    put_u64(&b, tensor1_offset);
    pad_to(&b, 64);
    for (int i = 0; i < 8; i++) {
        float v = (float)i;
        put(&b, &v, 4);
    }
    pad_to(&b, 64);
    for (int r = 0; r < 2; r++) { /* two Q8_0 rows of one block: d = 0.5, q = r+1 */
        uint16_t d = fp32_to_fp16(0.5f);
        put(&b, &d, 2);
        for (int i = 0; i < 32; i++) {
            int8_t q = (int8_t)(r + 1);
            put(&b, &q, 1);
        }
    }
    return b;
}

static void test_gguf_parse(void **state) {
    (void)state;
    buf_t b = make_small_gguf(GGML_Q8_0, 64);
    char err[256];
    gguf_file *f = gguf_parse(b.p, b.n, err, sizeof err);
    assert_non_null(f);
    assert_int_equal(f->alignment, 64);
    int64_t v;
    double d;
    gguf_str s;
    assert_int_equal(gguf_get_i64(f, "x.u32", &v), 0);
    assert_int_equal(v, 4000000000ll);
    assert_int_equal(gguf_get_i64(f, "x.i8", &v), 0);
    assert_int_equal(v, -5);
    assert_int_equal(gguf_get_f64(f, "x.f32", &d), 0);
    assert_true(fabs(d - 1e-5) < 1e-12);
    assert_int_equal(gguf_get_str(f, "general.architecture", &s), 0);
    assert_int_equal(s.len, 5);
    assert_memory_equal(s.ptr, "llama", 5);
    assert_int_equal(gguf_get_i64(f, "missing", &v), -1);
    assert_int_equal(gguf_get_i64(f, "x.f32", &v), -1); /* no lossy conversion */
    const gguf_kv *a = gguf_find(f, "x.strs");
    assert_non_null(a);
    assert_int_equal(a->arr_len, 3);
    assert_int_equal(a->strs[2].len, 3);
    assert_int_equal(a->strs[1].len, 0);
    const gguf_kv *ints = gguf_find(f, "x.ints");
    int32_t second;
    memcpy(&second, ints->data + 4, 4);
    assert_int_equal(second, -9);
    const gguf_tensor *t = gguf_tensor_find(f, "mat");
    assert_non_null(t);
    assert_int_equal(t->nbytes, 68);
    assert_int_equal(((uintptr_t)t->data - (uintptr_t)b.p) % 64, 0);
    const float *vec = gguf_tensor_find(f, "vec")->data;
    assert_true(vec[7] == 7.0f);
    qmat_t m = {t->data, t->type, 32, 2, ggml_row_bytes(t->type, 32)};
    float row[32];
    qmat_row(&m, 1, row);
    assert_true(row[31] == 1.0f); /* 0.5 * 2 */
    gguf_close(f);
    free(b.p);
}

/* Every strict prefix of a valid file is refused with a message, never read past. */
static void test_gguf_truncated(void **state) {
    (void)state;
    buf_t b = make_small_gguf(GGML_Q8_0, 64);
    char err[256];
    for (size_t n = 0; n < b.n; n++) {
        uint8_t *copy = malloc(n ? n : 1); /* exact size: ASan catches any overread */
        memcpy(copy, b.p, n);
        err[0] = 0;
        gguf_file *f = gguf_parse(copy, n, err, sizeof err);
        assert_null(f);
        assert_true(strlen(err) > 0);
        free(copy);
    }
    free(b.p);
}

static void test_gguf_refusals(void **state) {
    (void)state;
    char err[256];
    buf_t b = make_small_gguf(13 /* Q5_K */, 64);
    assert_null(gguf_parse(b.p, b.n, err, sizeof err));
    assert_non_null(strstr(err, "Q5_K"));
    assert_non_null(strstr(err, "'mat'"));
    free(b.p);
    b = make_small_gguf(GGML_Q8_0, 65); /* misaligned */
    assert_null(gguf_parse(b.p, b.n, err, sizeof err));
    free(b.p);
    b = make_small_gguf(GGML_Q8_0, 1 << 20); /* beyond the file */
    assert_null(gguf_parse(b.p, b.n, err, sizeof err));
    assert_non_null(strstr(err, "outside"));
    free(b.p);
    b = make_small_gguf(GGML_Q8_0, 64);
    b.p[0] = 'X';
    assert_null(gguf_parse(b.p, b.n, err, sizeof err));
    assert_non_null(strstr(err, "magic"));
    free(b.p);
    assert_null(gguf_open("/nonexistent/model.gguf", err, sizeof err));
    assert_non_null(strstr(err, "/nonexistent/model.gguf"));
    assert_string_equal(ggml_type_name(14), "Q6_K");
    assert_false(ggml_type_supported(GGML_Q4_0));
}

/* ---- fp16 ------------------------------------------------------------------------ */

static void test_fp16(void **state) {
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = fp16_to_fp32((uint16_t)h);
        if (isnan(f)) {
            assert_true(isnan(fp16_to_fp32(fp32_to_fp16(f))));
            continue;
        }
        assert_int_equal(fp32_to_fp16(f), h); /* every half survives the round trip */
    }
    assert_true(fp16_to_fp32(0x3c00) == 1.0f);
    assert_true(fp16_to_fp32(0x0001) == ldexpf(1, -24));
    assert_int_equal(fp32_to_fp16(1.0f + ldexpf(1, -11)), 0x3c00); /* tie: to even */
    assert_int_equal(fp32_to_fp16(1.0f + 3 * ldexpf(1, -11)), 0x3c02);
    assert_int_equal(fp32_to_fp16(70000.0f), 0x7c00);
    assert_int_equal(fp32_to_fp16(-1e-9f), 0x8000);
}

/* ---- matmul kernels ------------------------------------------------------------- */

static uint64_t rng_state = 12345;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}
static float rndf(void) { return (float)rnd() / 4294967296.0f * 2 - 1; }

/* Random weights in `type`, n_out rows of n_in. */
static void *random_matrix(uint32_t type, int64_t n_in, int64_t n_out) {
    size_t rb = ggml_row_bytes(type, (uint64_t)n_in);
    uint8_t *p = malloc(rb * (size_t)n_out);
    for (size_t i = 0; i < rb * (size_t)n_out; i++) p[i] = (uint8_t)rnd();
    /* keep scales finite and small: rewrite every fp16 scale field */
    for (int64_t r = 0; r < n_out; r++) {
        uint8_t *row = p + (size_t)r * rb;
        if (type == GGML_F32)
            for (int64_t i = 0; i < n_in; i++) ((float *)(void *)row)[i] = rndf();
        if (type == GGML_F16)
            for (int64_t i = 0; i < n_in; i++) {
                uint16_t h = fp32_to_fp16(rndf());
                memcpy(row + 2 * i, &h, 2);
            }
        for (int64_t blk = 0; blk < n_in / 32 && (type == GGML_Q4_1 || type == GGML_Q8_0); blk++) {
            uint8_t *bp = row + blk * (type == GGML_Q4_1 ? 20 : 34);
            uint16_t d = fp32_to_fp16(rndf() * 0.1f), m = fp32_to_fp16(rndf());
            memcpy(bp, &d, 2);
            if (type == GGML_Q4_1) memcpy(bp + 2, &m, 2);
        }
    }
    return p;
}

/* T = 13 takes the tile kernels; T = 40 (>= 16 tokens) the AVX-512 prefill
 * path, whose results must be the same bits as one token's alone. */
static void check_matmul_type(uint32_t type, int isa, int T) {
    const int64_t n_in = 96, n_out = 37;
    void *w = random_matrix(type, n_in, n_out);
    qmat_t m = {w, type, n_in, n_out, ggml_row_bytes(type, n_in)};
    float *x = malloc(sizeof(float) * T * n_in), *y = malloc(sizeof(float) * T * n_out),
          *y1 = malloc(sizeof(float) * n_out), *row = malloc(sizeof(float) * n_in);
    for (int64_t i = 0; i < T * n_in; i++) x[i] = rndf();
    pool_t *pools[2] = {pool_create(1), pool_create(2)};
    const qmat_t *wp = &m;
    for (int pi = 0; pi < 2; pi++) {
        qmat_matmul(pools[pi], 1, &wp, x, T, &y);
        for (int t = 0; t < T; t++) {
            qmat_matmul(pools[pi], 1, &wp, x + t * n_in, 1, &y1);
            for (int64_t r = 0; r < n_out; r++) {
                /* batch invariance: one token alone gives the very same bits */
                assert_memory_equal(&y1[r], &y[t * n_out + r], sizeof(float));
                qmat_row(&m, r, row);
                double ref = 0, mag = 0;
                for (int64_t i = 0; i < n_in; i++) {
                    ref += (double)row[i] * x[t * n_in + i];
                    mag += fabs((double)row[i] * x[t * n_in + i]);
                }
                if (fabs(y[t * n_out + r] - ref) > 1e-5 * mag + 1e-6)
                    fail_msg("%s isa %s row %lld token %d: %g vs %g", ggml_type_name(type), qmat_isa_name(isa),
                             (long long)r, t, y[t * n_out + r], ref);
            }
        }
    }
    pool_destroy(pools[0]);
    pool_destroy(pools[1]);
    free(w);
    free(x);
    free(y);
    free(y1);
    free(row);
}

static void test_matmul_all_isas(void **state) {
    (void)state;
    const uint32_t types[] = {GGML_F32, GGML_F16, GGML_Q8_0, GGML_Q4_1};
    int best = qmat_set_isa(-1);
    for (int isa = ISA_PORTABLE; isa <= best; isa++) {
        assert_int_equal(qmat_set_isa(isa), isa);
        for (size_t k = 0; k < sizeof types / sizeof *types; k++) {
            check_matmul_type(types[k], isa, 13);
            check_matmul_type(types[k], isa, 40);
        }
    }
    qmat_set_isa(-1);
    print_message("matmul checked on ISAs up to %s\n", qmat_isa_name(best));
}

/* Several matrices in one dispatch give what separate dispatches give. */
static void test_matmul_fused(void **state) {
    (void)state;
    void *a = random_matrix(GGML_Q4_1, 64, 40), *b = random_matrix(GGML_Q8_0, 64, 9);
    qmat_t ma = {a, GGML_Q4_1, 64, 40, ggml_row_bytes(GGML_Q4_1, 64)};
    qmat_t mb = {b, GGML_Q8_0, 64, 9, ggml_row_bytes(GGML_Q8_0, 64)};
    float x[3 * 64], ya[3 * 40], yb[3 * 9], za[3 * 40], zb[3 * 9];
    for (int i = 0; i < 3 * 64; i++) x[i] = rndf();
    pool_t *p = pool_create(2);
    const qmat_t *both[2] = {&ma, &mb}, *one;
    float *ys[2] = {ya, yb}, *z;
    qmat_matmul(p, 2, both, x, 3, ys);
    one = &ma, z = za;
    qmat_matmul(p, 1, &one, x, 3, &z);
    one = &mb, z = zb;
    qmat_matmul(p, 1, &one, x, 3, &z);
    assert_memory_equal(ya, za, sizeof ya);
    assert_memory_equal(yb, zb, sizeof yb);
    pool_destroy(p);
    free(a);
    free(b);
}

/* ---- pool ---------------------------------------------------------------------- */

typedef struct {
    _Atomic long runs[1000];
    _Atomic int by_thread[8];
    int n_threads;
} pool_probe;

static void probe_fn(void *arg, long chunk, int tid) {
    pool_probe *p = arg;
    assert_true(tid >= 0 && tid < p->n_threads);
    p->runs[chunk]++;
    p->by_thread[tid]++;
}

/* Every chunk runs exactly once, on a valid thread, job after job. */
static void test_pool(void **state) {
    (void)state;
    for (int n = 1; n <= 4; n++) {
        pool_t *p = pool_create(n);
        assert_non_null(p);
        assert_int_equal(pool_threads(p), n);
        for (int rep = 0; rep < 300; rep++) {
            static pool_probe pr;
            memset(&pr, 0, sizeof pr);
            pr.n_threads = n;
            long chunks = 1 + rep % 997;
            pool_run(p, probe_fn, &pr, chunks);
            for (long i = 0; i < 1000; i++) assert_int_equal(pr.runs[i], i < chunks ? 1 : 0);
        }
        pool_run(p, probe_fn, NULL, 0); /* nothing to do: fn is not called */
        pool_destroy(p);
    }
    assert_null(pool_create(0));
}

/* ---- the contiguous KV cache ------------------------------------------------------- */

/* Naive attention in double for row (seq history + new rows), head h. */
static void ref_attention(const float *keys, const float *vals, int n, int kvh, int n_kv, int hd, const float *q,
                          float scale, double *out) {
    double *s = malloc(sizeof(double) * n), mx = -INFINITY, sum = 0;
    for (int j = 0; j < n; j++) {
        double d = 0;
        for (int i = 0; i < hd; i++) d += (double)q[i] * keys[((size_t)j * n_kv + kvh) * hd + i];
        s[j] = d * scale;
        if (s[j] > mx) mx = s[j];
    }
    for (int j = 0; j < n; j++) sum += (s[j] = exp(s[j] - mx));
    for (int i = 0; i < hd; i++) {
        out[i] = 0;
        for (int j = 0; j < n; j++) out[i] += s[j] / sum * vals[((size_t)j * n_kv + kvh) * hd + i];
    }
    free(s);
}

static void test_kv_contig_attention(void **state) {
    (void)state;
    enum { L = 2, QH = 6, KVH = 2, HD = 32, MAXLEN = 40 };
    pool_t *pool = pool_create(2);
    kv_shape_t sh = {L, QH, KVH, HD, 3, MAXLEN};
    kv_cache_t *kv = kv_contig_create(&sh, pool);
    assert_non_null(kv);
    int32_t ids[3];
    for (int i = 0; i < 3; i++) assert_int_equal(kv->ops->seq_open(kv, &ids[i]), KV_OK);
    int32_t extra;
    assert_int_equal(kv->ops->seq_open(kv, &extra), KV_ENOSPC);
    /* history of every (seq, layer) kept here for the reference */
    float *hk = calloc((size_t)3 * L * MAXLEN * KVH * HD, sizeof(float));
    float *hv = calloc((size_t)3 * L * MAXLEN * KVH * HD, sizeof(float));
    int len[3] = {0, 0, 0};
    const int steps[][3] = {{5, 1, 3}, {1, 7, 1}, {2, 1, 1}};
    for (int st = 0; st < 3; st++) {
        int32_t q_start[4] = {0}, tokens[32] = {0};
        for (int i = 0; i < 3; i++) q_start[i + 1] = q_start[i] + steps[st][i];
        int rows = q_start[3];
        kv_batch_t b = {3, ids, q_start, tokens};
        assert_int_equal(kv->ops->begin_step(kv, &b), KV_OK);
        for (int l = 0; l < L; l++) {
            float *k = malloc(sizeof(float) * rows * KVH * HD), *v = malloc(sizeof(float) * rows * KVH * HD);
            float *q = malloc(sizeof(float) * rows * QH * HD), *o = malloc(sizeof(float) * rows * QH * HD);
            for (int i = 0; i < rows * KVH * HD; i++) k[i] = rndf() * 3, v[i] = rndf();
            for (int i = 0; i < rows * QH * HD; i++) q[i] = rndf();
            for (int s = 0; s < 3; s++)
                for (int r = q_start[s]; r < q_start[s + 1]; r++) {
                    size_t at = (((size_t)s * L + l) * MAXLEN + len[s] + (r - q_start[s])) * KVH * HD;
                    memcpy(hk + at, k + (size_t)r * KVH * HD, sizeof(float) * KVH * HD);
                    memcpy(hv + at, v + (size_t)r * KVH * HD, sizeof(float) * KVH * HD);
                }
            kv->ops->append(kv, l, k, v);
            kv->ops->attend(kv, l, q, o, 0.25f);
            for (int s = 0; s < 3; s++)
                for (int r = q_start[s]; r < q_start[s + 1]; r++)
                    for (int h = 0; h < QH; h++) {
                        double ref[32];
                        int n = len[s] + (r - q_start[s]) + 1; /* causal */
                        ref_attention(hk + ((size_t)s * L + l) * MAXLEN * KVH * HD,
                                      hv + ((size_t)s * L + l) * MAXLEN * KVH * HD, n, h / (QH / KVH), KVH, HD,
                                      q + ((size_t)r * QH + h) * HD, 0.25f, ref);
                        for (int i = 0; i < HD; i++)
                            assert_true(fabs(o[((size_t)r * QH + h) * HD + i] - ref[i]) < 1e-5);
                    }
            free(k), free(v), free(q), free(o);
        }
        kv->ops->end_step(kv);
        for (int s = 0; s < 3; s++) {
            len[s] += steps[st][s];
            assert_int_equal(kv->ops->seq_len(kv, ids[s]), len[s]);
        }
    }
    kv_stats_t ks;
    kv->ops->stats(kv, &ks);
    assert_int_equal(ks.live_seqs, 3);
    assert_int_equal(ks.live_tokens, len[0] + len[1] + len[2]);
    assert_int_equal(ks.bytes_reserved, (uint64_t)3 * MAXLEN * L * KVH * HD * 2 * 4);
    /* too long: nothing changes */
    int32_t q_start[2] = {0, MAXLEN}, tokens[MAXLEN] = {0};
    kv_batch_t b = {1, ids, q_start, tokens};
    assert_int_equal(kv->ops->begin_step(kv, &b), KV_ENOSPC);
    assert_int_equal(kv->ops->seq_len(kv, ids[0]), len[0]);
    /* a closed id is refused */
    kv->ops->seq_close(kv, ids[2]);
    int32_t bad[1] = {ids[2]}, q1[2] = {0, 1};
    kv_batch_t b2 = {1, bad, q1, tokens};
    assert_int_equal(kv->ops->begin_step(kv, &b2), KV_EINVAL);
    assert_int_equal(kv->ops->seq_len(kv, ids[2]), -1);
    kv->ops->destroy(kv);
    pool_destroy(pool);
    free(hk);
    free(hv);
}

/* A fork holds the parent's tokens: attention over it gives the parent's result. */
static void test_kv_contig_fork(void **state) {
    (void)state;
    pool_t *pool = pool_create(1);
    kv_shape_t sh = {1, 2, 1, 16, 2, 8};
    kv_cache_t *kv = kv_contig_create(&sh, pool);
    int32_t a, c, q_start[2] = {0, 3}, tokens[3] = {0};
    assert_int_equal(kv->ops->seq_open(kv, &a), KV_OK);
    /* 3 rows: K/V [3][1 head][16], Q and output [3][2 heads][16] */
    float k[3 * 16], v[3 * 16], q[3 * 2 * 16], o0[3 * 2 * 16], o1[2 * 16], o2[2 * 16];
    for (int i = 0; i < 48; i++) k[i] = rndf(), v[i] = rndf();
    for (int i = 0; i < 96; i++) q[i] = rndf();
    kv_batch_t b = {1, &a, q_start, tokens};
    kv->ops->begin_step(kv, &b);
    kv->ops->append(kv, 0, k, v);
    kv->ops->attend(kv, 0, q, o0, 0.5f);
    kv->ops->end_step(kv);
    assert_int_equal(kv->ops->seq_fork(kv, a, &c), KV_OK);
    assert_int_equal(kv->ops->seq_len(kv, c), 3);
    int32_t one[2] = {0, 1};
    float kn[16], vn[16];
    for (int i = 0; i < 16; i++) kn[i] = rndf(), vn[i] = rndf();
    for (int who = 0; who < 2; who++) {
        int32_t id = who ? c : a;
        kv_batch_t bb = {1, &id, one, tokens};
        assert_int_equal(kv->ops->begin_step(kv, &bb), KV_OK);
        kv->ops->append(kv, 0, kn, vn);
        kv->ops->attend(kv, 0, q, who ? o2 : o1, 0.5f);
        kv->ops->end_step(kv);
    }
    assert_memory_equal(o1, o2, sizeof(float) * 32);
    assert_int_equal(kv->ops->seq_attach_prefix(kv, a, tokens, 3), 0);
    kv->ops->destroy(kv);
    pool_destroy(pool);
}

/* ---- the paged KV cache (libkvpage) ------------------------------------------------- */

/* The kv_ops mapping onto kvp_cache_t, checked like the contiguous cache:
 * ragged steps of three sequences across page edges (page 4), every row
 * against naive attention in double over the history kept here; then the
 * prefix cache, the per-sequence limit, a closed id and the statistics.
 * head_dim 64: the library's kernels take 64/80/96/128/256. */
static void check_paged(const char *spec, double tol) {
    enum { L = 2, QH = 6, KVH = 2, HD = 64, MAXLEN = 40, ROW = KVH * HD };
    pool_t *pool = pool_create(2);
    kv_shape_t sh = {L, QH, KVH, HD, 4, MAXLEN};
    kv_paged_opts_t o;
    kv_paged_opts_init(&o);
    o.page_size = 4;
    char err[256];
    assert_int_equal(kv_paged_parse(spec, &o, err, sizeof err), 0);
    kv_cache_t *kv = kv_paged_create(&sh, pool, &o, err, sizeof err);
    if (!kv) print_error("%s: %s\n", spec, err);
    assert_non_null(kv);
    int32_t ids[3];
    for (int i = 0; i < 3; i++) assert_int_equal(kv->ops->seq_open(kv, &ids[i]), KV_OK);
    /* K/V of (sequence, layer, position) are a function of them, so a
     * sequence that attaches a cached prefix holds exactly these values */
    float *hk = calloc((size_t)4 * L * MAXLEN * ROW, sizeof(float)), *hv = calloc((size_t)4 * L * MAXLEN * ROW, sizeof(float));
    for (size_t i = 0; i < (size_t)4 * L * MAXLEN * ROW; i++) hk[i] = rndf() * 3, hv[i] = rndf();
    int32_t toks[3][MAXLEN];
    for (int s = 0; s < 3; s++)
        for (int t = 0; t < MAXLEN; t++) toks[s][t] = 100 * s + t;
    int len[3] = {0, 0, 0};
    const int steps[][3] = {{5, 1, 3}, {1, 7, 1}, {2, 1, 4}, {1, 1, 1}};
    for (int st = 0; st < 4; st++) {
        int32_t q_start[4] = {0}, tokens[32];
        for (int i = 0; i < 3; i++) {
            q_start[i + 1] = q_start[i] + steps[st][i];
            memcpy(tokens + q_start[i], toks[i] + len[i], sizeof(int32_t) * (size_t)steps[st][i]);
        }
        int rows = q_start[3];
        kv_batch_t b = {3, ids, q_start, tokens};
        assert_int_equal(kv->ops->begin_step(kv, &b), KV_OK);
        for (int l = 0; l < L; l++) {
            float *k = malloc(sizeof(float) * rows * ROW), *v = malloc(sizeof(float) * rows * ROW);
            float *q = malloc(sizeof(float) * rows * QH * HD), *out = malloc(sizeof(float) * rows * QH * HD);
            for (int s = 0; s < 3; s++)
                for (int r = q_start[s]; r < q_start[s + 1]; r++) {
                    size_t at = (((size_t)s * L + l) * MAXLEN + len[s] + (r - q_start[s])) * ROW;
                    memcpy(k + (size_t)r * ROW, hk + at, sizeof(float) * ROW);
                    memcpy(v + (size_t)r * ROW, hv + at, sizeof(float) * ROW);
                }
            for (int i = 0; i < rows * QH * HD; i++) q[i] = rndf();
            assert_int_equal(kv->ops->append(kv, l, k, v), KV_OK);
            assert_int_equal(kv->ops->attend(kv, l, q, out, 0.125f), KV_OK);
            double worst = 0;
            for (int s = 0; s < 3; s++)
                for (int r = q_start[s]; r < q_start[s + 1]; r++)
                    for (int h = 0; h < QH; h++) {
                        double ref[HD];
                        ref_attention(hk + ((size_t)s * L + l) * MAXLEN * ROW, hv + ((size_t)s * L + l) * MAXLEN * ROW,
                                      len[s] + (r - q_start[s]) + 1, h / (QH / KVH), KVH, HD,
                                      q + ((size_t)r * QH + h) * HD, 0.125f, ref);
                        for (int i = 0; i < HD; i++) {
                            double e = fabs(out[((size_t)r * QH + h) * HD + i] - ref[i]);
                            if (e > worst) worst = e;
                        }
                    }
            if (!(worst <= tol)) print_error("%s: layer %d step %d: error %.3g > %.3g\n", spec, l, st, worst, tol);
            assert_true(worst <= tol);
            free(k), free(v), free(q), free(out);
        }
        kv->ops->end_step(kv);
        for (int s = 0; s < 3; s++) {
            len[s] += steps[st][s];
            assert_int_equal(kv->ops->seq_len(kv, ids[s]), len[s]);
        }
    }
    kv_stats_t ks;
    kv->ops->stats(kv, &ks);
    assert_int_equal(ks.live_seqs, 3);
    assert_int_equal(ks.live_tokens, len[0] + len[1] + len[2]);
    assert_int_equal(ks.page_size, 4);
    assert_true(ks.pages_peak >= ks.pages_used && ks.pages_used >= 1 && ks.bytes_peak >= ks.bytes_live);
    assert_true(ks.bytes_live > 0 && ks.bytes_reserved >= ks.bytes_live);
    /* sequence 1 (12 tokens) closes; its three full pages stay cached, and a
     * new sequence with the same prompt attaches two of them (n - 1 = 11
     * tokens are looked up: the prompt's last token is always prefilled) */
    kv->ops->seq_close(kv, ids[1]);
    int32_t again;
    assert_int_equal(kv->ops->seq_open(kv, &again), KV_OK);
    assert_int_equal(kv->ops->seq_attach_prefix(kv, again, toks[1], 12), 8);
    assert_int_equal(kv->ops->seq_len(kv, again), 8);
    kv->ops->stats(kv, &ks);
    assert_int_equal(ks.prefix_hit_tokens, 8);
    assert_int_equal(ks.prefix_hit_pages, 2);
    assert_int_equal(ks.prefix_lookups, 1);
    /* the attached sequence continues like the original: its next row sees
     * the cached pages plus its own new token */
    {
        int32_t q_start[2] = {0, 1}, tok = toks[1][8];
        kv_batch_t b = {1, &again, q_start, &tok};
        assert_int_equal(kv->ops->begin_step(kv, &b), KV_OK);
        for (int l = 0; l < L; l++) {
            float q[QH * HD], out[QH * HD];
            for (int i = 0; i < QH * HD; i++) q[i] = rndf();
            size_t at = (((size_t)1 * L + l) * MAXLEN + 8) * ROW;
            assert_int_equal(kv->ops->append(kv, l, hk + at, hv + at), KV_OK);
            assert_int_equal(kv->ops->attend(kv, l, q, out, 0.125f), KV_OK);
            for (int h = 0; h < QH; h++) {
                double ref[HD];
                ref_attention(hk + ((size_t)1 * L + l) * MAXLEN * ROW, hv + ((size_t)1 * L + l) * MAXLEN * ROW, 9,
                              h / (QH / KVH), KVH, HD, q + h * HD, 0.125f, ref);
                for (int i = 0; i < HD; i++) assert_true(fabs(out[h * HD + i] - ref[i]) <= tol);
            }
        }
        kv->ops->end_step(kv);
    }
    /* the per-sequence limit (the engine's max_len): nothing changes */
    int32_t q_start[2] = {0, MAXLEN}, tokens[MAXLEN] = {0};
    kv_batch_t b = {1, ids, q_start, tokens};
    assert_int_equal(kv->ops->begin_step(kv, &b), KV_ENOSPC);
    assert_int_equal(kv->ops->seq_len(kv, ids[0]), len[0]);
    /* a closed id is refused, with the library's detail kept */
    int32_t bad[1] = {ids[1]}, q1[2] = {0, 1};
    kv_batch_t b2 = {1, bad, q1, tokens};
    assert_int_equal(kv->ops->begin_step(kv, &b2), KV_EINVAL);
    assert_int_equal(kv->ops->seq_len(kv, ids[1]), -1);
    /* four sequences are open (max_seqs): a fifth is refused */
    int32_t extra, extra2;
    assert_int_equal(kv->ops->seq_open(kv, &extra), KV_OK);
    assert_int_equal(kv->ops->seq_open(kv, &extra2), KV_ENOSPC);
    assert_true(strlen(kv_paged_last_error(kv)) > 0);
    kv->ops->destroy(kv);
    pool_destroy(pool);
    free(hk);
    free(hv);
}

/* Largest absolute error of an output element (values in [-1, 1], keys in
 * [-3, 3]). Measured: fp32 1.7e-7 (summation order only), fp16 4.0e-4,
 * bf16 3.6e-3, int8 5.4e-3, int4 keys 4.1e-2, int8 keys with int4_v1
 * values 6.2e-2, k8v4 0.138; the bounds are 2-6x those. (int4 values are
 * rotated: on uniform values, with no wide channel to spread, the rotated
 * rows' groups have a wider range and each output element's error is a
 * sum of many, so the largest one is twice int4_v1's; on a model's values
 * the mean error falls, docs/PERFORMANCE.md.) */
static void test_kv_paged_attention(void **state) {
    (void)state;
    check_paged("fp32", 1e-6);
    check_paged("fp16", 1.5e-3);
    check_paged("bf16", 1e-2);
    check_paged("int8", 1.5e-2);
    check_paged("k8v4", 3e-1);
    check_paged("int8/int4_v1", 1.2e-1);
    check_paged("int4/fp16", 1e-1);
}

/* A fork shares the parent's pages; a partly filled last page is copied on
 * write (fp32) or the staging page copied (int8): both continue alike. */
static void test_kv_paged_fork(void **state) {
    (void)state;
    static const char *const specs[] = {"fp32", "int8"};
    for (int k = 0; k < 2; k++) {
        pool_t *pool = pool_create(1);
        kv_shape_t sh = {1, 2, 1, 64, 2, 16};
        kv_paged_opts_t o;
        kv_paged_opts_init(&o);
        o.page_size = 4;
        char err[256];
        assert_int_equal(kv_paged_parse(specs[k], &o, err, sizeof err), 0);
        kv_cache_t *kv = kv_paged_create(&sh, pool, &o, err, sizeof err);
        assert_non_null(kv);
        int32_t a, c, q_start[2] = {0, 6}, tokens[6] = {1, 2, 3, 4, 5, 6};
        assert_int_equal(kv->ops->seq_open(kv, &a), KV_OK);
        float kk[6 * 64], vv[6 * 64], q[6 * 2 * 64], o0[6 * 2 * 64], o1[2 * 64], o2[2 * 64];
        for (int i = 0; i < 6 * 64; i++) kk[i] = rndf(), vv[i] = rndf();
        for (int i = 0; i < 6 * 128; i++) q[i] = rndf();
        kv_batch_t b = {1, &a, q_start, tokens};
        assert_int_equal(kv->ops->begin_step(kv, &b), KV_OK);
        assert_int_equal(kv->ops->append(kv, 0, kk, vv), KV_OK);
        assert_int_equal(kv->ops->attend(kv, 0, q, o0, 0.5f), KV_OK);
        kv->ops->end_step(kv);
        assert_int_equal(kv->ops->seq_fork(kv, a, &c), KV_OK);
        assert_int_equal(kv->ops->seq_len(kv, c), 6);
        int32_t one[2] = {0, 1};
        float kn[64], vn[64];
        for (int i = 0; i < 64; i++) kn[i] = rndf(), vn[i] = rndf();
        for (int who = 0; who < 2; who++) {
            int32_t id = who ? c : a;
            kv_batch_t bb = {1, &id, one, tokens};
            assert_int_equal(kv->ops->begin_step(kv, &bb), KV_OK);
            assert_int_equal(kv->ops->append(kv, 0, kn, vn), KV_OK);
            assert_int_equal(kv->ops->attend(kv, 0, q, who ? o2 : o1, 0.5f), KV_OK);
            kv->ops->end_step(kv);
        }
        assert_memory_equal(o1, o2, sizeof o1);
        assert_int_equal(kv->ops->seq_len(kv, a), 7);
        assert_int_equal(kv->ops->seq_len(kv, c), 7);
        kv->ops->destroy(kv);
        pool_destroy(pool);
    }
}

static void test_kv_paged_parse(void **state) {
    (void)state;
    kv_paged_opts_t o;
    kv_paged_opts_init(&o);
    char err[256];
    assert_int_equal(o.page_size, 16);
    assert_int_equal(kv_paged_parse("int8", &o, err, sizeof err), 0);
    assert_int_equal(o.k_format, 4), assert_int_equal(o.v_format, 4), assert_int_equal(o.page_size, 16);
    assert_int_equal(kv_paged_parse("k8v4", &o, err, sizeof err), 0);
    assert_int_equal(o.k_format, KVP_FORMAT_INT8), assert_int_equal(o.v_format, KVP_FORMAT_INT4);
    assert_int_equal(kv_paged_parse("int4/fp16@32", &o, err, sizeof err), 0);
    assert_int_equal(o.k_format, KVP_FORMAT_INT4), assert_int_equal(o.v_format, 1), assert_int_equal(o.page_size, 32);
    assert_int_equal(kv_paged_parse("int4_v1/int4", &o, err, sizeof err), 0);
    assert_int_equal(o.k_format, KVP_FORMAT_INT4_V1), assert_int_equal(o.v_format, KVP_FORMAT_INT4);
    assert_int_equal(kv_paged_parse("fp8", &o, err, sizeof err), 0);
    assert_int_equal(o.k_format, 3), assert_int_equal(o.v_format, 3), assert_int_equal(o.page_size, 32);
    assert_int_equal(kv_paged_parse("k8v4@16", &o, err, sizeof err), 0);
    assert_int_equal(o.page_size, 16);
    static const char *const bad[] = {"int3", "int4@0", "int4@x", "/int4", "int4/", "", "@16", "k8v4@"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        err[0] = 0;
        assert_int_equal(kv_paged_parse(bad[i], &o, err, sizeof err), -1);
        assert_true(strlen(err) > 0);
    }
    assert_int_equal(o.k_format, KVP_FORMAT_INT8), assert_int_equal(o.v_format, KVP_FORMAT_INT4), assert_int_equal(o.page_size, 16);
    /* a shape the library refuses (head_dim 20) is reported, not crashed on */
    kv_shape_t sh = {1, 2, 1, 20, 1, 8};
    kv_paged_opts_init(&o);
    assert_null(kv_paged_create(&sh, NULL, &o, err, sizeof err));
    assert_non_null(strstr(err, "KVP_EINVAL"));
}

/* --kv-store specs are checked before any work, and no error message shows
 * a password given in a URI. */
static void test_kv_store_check(void **state) {
    (void)state;
    char err[512];
    assert_int_equal(kv_store_check("dir:/tmp/kv", err, sizeof err), 0);
    static const char *const bad[] = {"dir:", "/tmp/kv", "s3://alice:hunter2@bucket/kv", "redis:", "redis:host",
                                      "redis://", "redis:alice:hunter2@host:6379"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        err[0] = 0;
        assert_int_equal(kv_store_check(bad[i], err, sizeof err), -1);
        assert_true(strlen(err) > 0);
    }
    assert_int_equal(kv_store_check("redis:alice:hunter2@host:6379", err, sizeof err), -1);
    assert_null(strstr(err, "hunter2"));
    assert_int_equal(kv_store_check("s3://hunter2@bucket/kv", err, sizeof err), -1);
    assert_non_null(strstr(err, "s3://***@bucket/kv")); /* a lone userinfo: the Redis tier's password */
    assert_int_equal(kv_store_check("s3://alice:hunter2@bucket/kv", err, sizeof err), -1);
    assert_non_null(strstr(err, "not built in"));
    assert_non_null(strstr(err, "s3://alice:***@bucket/kv"));
    assert_null(strstr(err, "hunter2"));
    int rc = kv_store_check("redis://alice:hunter2@127.0.0.1:6379/2,redis://:pw2@10.0.0.2", err, sizeof err);
    if (kvp_build_has(KVP_FEATURE_REDIS)) {
        assert_int_equal(rc, 0);
    } else { /* a build without hiredis says so at once */
        assert_int_equal(rc, -1);
        assert_non_null(strstr(err, "built without"));
        assert_non_null(strstr(err, "redis://alice:***@127.0.0.1:6379/2,redis://:***@10.0.0.2"));
        assert_null(strstr(err, "hunter2"));
    }
}

/* kv_sim rounds a full page exactly as libkvpage stores it: its values are
 * the bits kvp_quantize + kvp_dequantize give for the page (from the fp16
 * staging values), for int8 and int4 keys and values (int4 keys: the
 * head_dim / 32 widest channels in int8, so int4w2 at head_dim 64); the tail
 * page is fp16; int4w4 keeps 4 channels to int8 precision, int4w0 none. */
static void test_kv_sim_matches_library(void **state) {
    (void)state;
    enum { P = 16, KVH = 2, HD = 64, ROW = KVH * HD, N = P + 5 };
    static const char *const specs[] = {"int8/int8", "int4/int4", "int4/int8", "int4w2/int4",
                                          "int4w4/int4", "int4w0/int4"};
    float *k = malloc(sizeof(float) * N * ROW), *v = malloc(sizeof(float) * N * ROW);
    for (int i = 0; i < N * ROW; i++) {
        k[i] = rndf() + ((i % HD) % 16 == 5 ? 8.0f * rndf() : 0.0f); /* outlier channels */
        v[i] = rndf();
    }
    pool_t *pool = pool_create(1);
    for (size_t c = 0; c < sizeof specs / sizeof *specs; c++) {
        kv_shape_t sh = {1, KVH, KVH, HD, 1, 64};
        char err[256];
        kv_cache_t *kv = kv_sim_create(&sh, pool, specs[c], err, sizeof err);
        assert_non_null(kv);
        int32_t seq, q_start[2] = {0, N}, tokens[N] = {0};
        assert_int_equal(kv->ops->seq_open(kv, &seq), KV_OK);
        kv_batch_t b = {1, &seq, q_start, tokens};
        assert_int_equal(kv->ops->begin_step(kv, &b), KV_OK);
        assert_int_equal(kv->ops->append(kv, 0, k, v), KV_OK);
        kv->ops->end_step(kv);
        const float *ks = kv_sim_data(kv, seq, 0, 0), *vs = kv_sim_data(kv, seq, 0, 1);
        /* the library's blocks from the fp16-rounded rows */
        float *k16 = malloc(sizeof(float) * P * ROW), *v16 = malloc(sizeof(float) * P * ROW);
        float *kl = malloc(sizeof(float) * P * ROW), *vl = malloc(sizeof(float) * P * ROW);
        for (int i = 0; i < P * ROW; i++) {
            k16[i] = fp16_to_fp32(fp32_to_fp16(k[i]));
            v16[i] = fp16_to_fp32(fp32_to_fp16(v[i]));
        }
        int kf = specs[c][3] == '8' ? 4 : 5, vf = specs[c][strlen(specs[c]) - 1] == '8' ? 4 : 5;
        for (int side = 0; side < 2; side++) {
            kvp_quant_desc_t d = {.struct_size = sizeof d, .format = side ? vf : kf, .is_value = side,
                                  .page_size = P, .head_dim = HD, .heads = KVH, .dtype = KVP_FORMAT_FP32};
            uint64_t bytes;
            assert_int_equal(kvp_quant_block_bytes(&d, &bytes, NULL, 0), KVP_OK);
            void *blk = malloc(bytes * KVH);
            assert_int_equal(kvp_quantize(&d, side ? v16 : k16, 1, blk, NULL, 0), KVP_OK);
            assert_int_equal(kvp_dequantize(&d, blk, 1, side ? vl : kl, NULL, 0), KVP_OK);
            free(blk);
        }
        if (strncmp(specs[c], "int4w", 5) || specs[c][5] == '2') {
            assert_memory_equal(ks, kl, sizeof(float) * P * ROW);
        } else { /* the test's 4 outlier channels per head: w4 takes all of them, w0 none */
            double e_sim = 0, e_lib = 0;
            for (int i = 0; i < P * ROW; i++) e_sim += fabs(ks[i] - k16[i]), e_lib += fabs(kl[i] - k16[i]);
            if (specs[c][5] == '4') assert_true(e_sim < 0.9 * e_lib);
            else assert_true(e_sim > 1.1 * e_lib);
        }
        assert_memory_equal(vs, vl, sizeof(float) * P * ROW);
        for (int i = P * ROW; i < N * ROW; i++) { /* the tail page: fp16 */
            assert_true(ks[i] == fp16_to_fp32(fp32_to_fp16(k[i])));
            assert_true(vs[i] == fp16_to_fp32(fp32_to_fp16(v[i])));
        }
        free(k16), free(v16), free(kl), free(vl);
        kv->ops->destroy(kv);
    }
    pool_destroy(pool);
    free(k);
    free(v);
    char err[256];
    assert_int_equal(kv_sim_check("int4w4/int4@32", err, sizeof err), 0);
    assert_int_equal(kv_sim_check("int4w0/int4", err, sizeof err), 0);
    assert_int_equal(kv_sim_check("int4w/int4", err, sizeof err), -1);
    assert_int_equal(kv_sim_check("int4s0/int4", err, sizeof err), -1);
    assert_int_equal(kv_sim_check("int4/int4w4", err, sizeof err), -1); /* widest channels: keys only */
    assert_int_equal(kv_sim_check("int4", err, sizeof err), -1);
    assert_int_equal(kv_sim_check("int4/int4@15", err, sizeof err), -1);
}

/* kv_sim's rotated basis and recent window: int8h values come back within
 * int8 rounding of their fp16 values (the rotation is undone: a wrong
 * inverse would be off by O(1)) but not equal to plain int8's; int4h keys
 * on outlier channels differ from int4's; with +rN a full page stays fp16
 * until N tokens have come after it, then holds exactly what the spec
 * without the window gives; the specs parse; a head_dim that is not a
 * power of two refuses the rotation. */
static void test_kv_sim_rotation_and_window(void **state) {
    (void)state;
    enum { P = 16, KVH = 2, HD = 64, ROW = KVH * HD, N = 2 * P };
    float *k = malloc(sizeof(float) * N * ROW), *v = malloc(sizeof(float) * N * ROW);
    for (int i = 0; i < N * ROW; i++) {
        k[i] = rndf() + ((i % HD) % 16 == 5 ? 8.0f * rndf() : 0.0f);
        v[i] = rndf();
    }
    pool_t *pool = pool_create(1);
    kv_shape_t sh = {1, KVH, KVH, HD, 1, 64};
    char err[256];
    /* each spec after lens[c] tokens, one a step as decode appends them */
    float *got[3];
    static const char *const specs[] = {"int4/int8", "int4h/int8h", "int4/int4+r8"};
    const int32_t lens[] = {P, P, P + 7};
    kv_cache_t *kvs[3];
    for (int c = 0; c < 3; c++) {
        kvs[c] = kv_sim_create(&sh, pool, specs[c], err, sizeof err);
        assert_non_null(kvs[c]);
        int32_t seq, tokens[N] = {0};
        assert_int_equal(kvs[c]->ops->seq_open(kvs[c], &seq), KV_OK);
        for (int32_t at = 0; at < lens[c]; at++) {
            int32_t q_start[2] = {0, 1};
            kv_batch_t b = {1, &seq, q_start, tokens};
            assert_int_equal(kvs[c]->ops->begin_step(kvs[c], &b), KV_OK);
            assert_int_equal(kvs[c]->ops->append(kvs[c], 0, k + (size_t)at * ROW, v + (size_t)at * ROW), KV_OK);
            kvs[c]->ops->end_step(kvs[c]);
        }
        got[c] = kv_sim_data(kvs[c], seq, 0, 0);
        assert_non_null(got[c]);
    }
    const float *v_plain = kv_sim_data(kvs[0], 0, 0, 1), *v_rot = kv_sim_data(kvs[1], 0, 0, 1);
    double err_rot = 0, diff = 0, kdiff = 0;
    for (int i = 0; i < P * ROW; i++) {
        err_rot = fmax(err_rot, fabs(v_rot[i] - v[i]));
        diff += fabs(v_rot[i] - v_plain[i]);
        kdiff += fabs(got[1][i] - got[0][i]);
    }
    assert_true(err_rot < 0.05); /* |v| < 1: int8 steps of at most 2/254 after the rotation */
    assert_true(diff > 0.0 && kdiff > 0.0);
    /* the window: 7 tokens after the page, page 0 still fp16; 8, quantized as without it */
    for (int i = 0; i < P * ROW; i++) assert_true(got[2][i] == fp16_to_fp32(fp32_to_fp16(k[i])));
    for (int c = 0; c < 3; c++) kvs[c]->ops->destroy(kvs[c]);
    kv_cache_t *w = kv_sim_create(&sh, pool, "int4/int4+r8", err, sizeof err), *plain = kv_sim_create(&sh, pool, "int4/int4", err, sizeof err);
    assert_non_null(w);
    assert_non_null(plain);
    kv_cache_t *pair[2] = {w, plain};
    for (int c = 0; c < 2; c++) {
        int32_t seq, tokens[N] = {0};
        assert_int_equal(pair[c]->ops->seq_open(pair[c], &seq), KV_OK);
        for (int32_t at = 0; at < P + 8; at++) {
            int32_t q_start[2] = {0, 1};
            kv_batch_t b = {1, &seq, q_start, tokens};
            assert_int_equal(pair[c]->ops->begin_step(pair[c], &b), KV_OK);
            assert_int_equal(pair[c]->ops->append(pair[c], 0, k + (size_t)at * ROW, v + (size_t)at * ROW), KV_OK);
            pair[c]->ops->end_step(pair[c]);
        }
    }
    assert_memory_equal(kv_sim_data(w, 0, 0, 0), kv_sim_data(plain, 0, 0, 0), sizeof(float) * P * ROW);
    assert_memory_equal(kv_sim_data(w, 0, 0, 1), kv_sim_data(plain, 0, 0, 1), sizeof(float) * P * ROW);
    w->ops->destroy(w);
    plain->ops->destroy(plain);
    /* parsing; the rotation needs a power-of-two head_dim */
    assert_int_equal(kv_sim_check("int4h/int4h", err, sizeof err), 0);
    assert_int_equal(kv_sim_check("int4hw2/int4", err, sizeof err), 0);
    assert_int_equal(kv_sim_check("int8h/int4h@32+r64", err, sizeof err), 0);
    assert_int_equal(kv_sim_check("fp16h/int4", err, sizeof err), -1);
    assert_int_equal(kv_sim_check("int4/int4+r", err, sizeof err), -1);
    assert_int_equal(kv_sim_check("int4/int4+r0", err, sizeof err), -1);
    assert_int_equal(kv_sim_check("int4/int4+x8", err, sizeof err), -1);
    kv_shape_t sh80 = {1, KVH, KVH, 80, 1, 64};
    assert_null(kv_sim_create(&sh80, pool, "int4/int4h", err, sizeof err));
    assert_non_null(strstr(err, "power of two"));
    pool_destroy(pool);
    free(k);
    free(v);
}

/* kv_sim's int4 value groups and symmetric values: int4g32 is int4 bit for
 * bit; int4g16 rounds each 16-channel group within about half its own step
 * (finer than int4's 32-channel groups); int4sym's values of a group are
 * whole multiples, -7..7, of one scale; the specs parse (value suffixes on
 * int4 values only, an even group size). */
static void test_kv_sim_value_groups(void **state) {
    (void)state;
    enum { P = 16, KVH = 2, HD = 64, ROW = KVH * HD };
    float *k = malloc(sizeof(float) * P * ROW), *v = malloc(sizeof(float) * P * ROW);
    for (int i = 0; i < P * ROW; i++) {
        k[i] = rndf();
        v[i] = rndf() * ((i % HD) < 16 ? 0.1f : 1.0f); /* a narrow group beside wide ones */
    }
    pool_t *pool = pool_create(1);
    kv_shape_t sh = {1, KVH, KVH, HD, 1, 64};
    char err[256];
    static const char *const specs[] = {"int4/int4", "int4/int4g32", "int4/int4g16", "int4/int4sym"};
    kv_cache_t *kvs[4];
    const float *got[4];
    for (int c = 0; c < 4; c++) {
        kvs[c] = kv_sim_create(&sh, pool, specs[c], err, sizeof err);
        assert_non_null(kvs[c]);
        int32_t seq, q_start[2] = {0, P}, tokens[P] = {0};
        assert_int_equal(kvs[c]->ops->seq_open(kvs[c], &seq), KV_OK);
        kv_batch_t b = {1, &seq, q_start, tokens};
        assert_int_equal(kvs[c]->ops->begin_step(kvs[c], &b), KV_OK);
        assert_int_equal(kvs[c]->ops->append(kvs[c], 0, k, v), KV_OK);
        kvs[c]->ops->end_step(kvs[c]);
        got[c] = kv_sim_data(kvs[c], seq, 0, 1);
        assert_non_null(got[c]);
    }
    assert_memory_equal(got[0], got[1], sizeof(float) * P * ROW);
    double e32 = 0, e16 = 0;
    for (int t = 0; t < P; t++)
        for (int h = 0; h < KVH; h++)
            for (int g = 0; g < HD; g += 16) {
                const size_t o = (size_t)t * ROW + (size_t)h * HD + (size_t)g;
                float lo = INFINITY, hi = -INFINITY;
                for (int d = 0; d < 16; d++) {
                    const float x = fp16_to_fp32(fp32_to_fp16(v[o + d]));
                    lo = fminf(lo, x), hi = fmaxf(hi, x);
                }
                const float step = (hi - lo) / 15;
                for (int d = 0; d < 16; d++) {
                    const float x = fp16_to_fp32(fp32_to_fp16(v[o + d]));
                    assert_true(fabsf(got[2][o + d] - x) <= 0.5f * step * 1.01f + 1e-4f);
                    e16 += fabs(got[2][o + d] - x), e32 += fabs(got[0][o + d] - x);
                }
            }
    /* sym (groups of 32): the largest magnitude is code 7; every value a whole multiple */
    for (size_t o = 0; o < (size_t)P * ROW; o += 32) {
        float amax = 0;
        for (int d = 0; d < 32; d++) amax = fmaxf(amax, fabsf(got[3][o + d]));
        const float s = amax / 7;
        assert_true(s > 0);
        for (int d = 0; d < 32; d++) {
            const float c = got[3][o + d] / s;
            assert_true(fabsf(c - rintf(c)) < 1e-4f && fabsf(c) <= 7.0001f);
        }
    }
    assert_true(e16 < 0.9 * e32);
    for (int c = 0; c < 4; c++) kvs[c]->ops->destroy(kvs[c]);
    assert_int_equal(kv_sim_check("int4/int4hsymg16", err, sizeof err), 0);
    assert_int_equal(kv_sim_check("int4w8/int4hg16@32+r64", err, sizeof err), 0);
    assert_int_equal(kv_sim_check("int4/int4g15", err, sizeof err), -1);
    assert_int_equal(kv_sim_check("int4/int4g", err, sizeof err), -1);
    assert_int_equal(kv_sim_check("int4/int4symx", err, sizeof err), -1);
    assert_int_equal(kv_sim_check("int4g16/int4", err, sizeof err), -1); /* groups: values only */
    assert_int_equal(kv_sim_check("int4/int8g16", err, sizeof err), -1);
    pool_destroy(pool);
    free(k);
    free(v);
}

/* ---- tokenizer on a hand-made vocabulary ----------------------------------------- */

static uint32_t gpt2_cp(int b) {
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) return (uint32_t)b;
    int n = 0;
    for (int i = 0; i < b; i++)
        if (!((i >= 33 && i <= 126) || (i >= 161 && i <= 172) || (i >= 174 && i <= 255))) n++;
    return 256u + (uint32_t)n;
}

static void utf8(uint32_t cp, char *out) {
    if (cp < 0x80) out[0] = (char)cp, out[1] = 0;
    else out[0] = (char)(0xC0 | cp >> 6), out[1] = (char)(0x80 | (cp & 63)), out[2] = 0;
}

/* 256 byte tokens, then "he", "ll", "hell", "Ġw" (merges in that order), then
 * two control tokens "<s>" and "<|im_end|>". */
static buf_t make_tok_gguf(void) {
    buf_t b = {0};
    const char *extra[] = {"he", "ll", "hell", "\xc4\xa0w", "<s>", "<|im_end|>"};
    const int n_vocab = 256 + 6;
    put_u32(&b, 0x46554747u);
    put_u32(&b, 3);
    put_u64(&b, 0);
    put_u64(&b, 7);
    put_key(&b, "tokenizer.ggml.model", GGUF_STRING);
    put_str(&b, "gpt2");
    put_key(&b, "tokenizer.ggml.pre", GGUF_STRING);
    put_str(&b, "smollm");
    put_key(&b, "tokenizer.ggml.tokens", GGUF_ARRAY);
    put_u32(&b, GGUF_STRING);
    put_u64(&b, (uint64_t)n_vocab);
    for (int i = 0; i < 256; i++) {
        char s[4];
        utf8(gpt2_cp(i), s);
        put_str(&b, s);
    }
    for (int i = 0; i < 6; i++) put_str(&b, extra[i]);
    put_key(&b, "tokenizer.ggml.token_type", GGUF_ARRAY);
    put_u32(&b, GGUF_I32);
    put_u64(&b, (uint64_t)n_vocab);
    for (int i = 0; i < n_vocab; i++) put_u32(&b, i >= 260 ? TOK_CONTROL : TOK_NORMAL);
    put_key(&b, "tokenizer.ggml.merges", GGUF_ARRAY);
    put_u32(&b, GGUF_STRING);
    put_u64(&b, 4);
    put_str(&b, "h e");
    put_str(&b, "l l");
    put_str(&b, "he ll");
    put_str(&b, "\xc4\xa0 w");
    put_key(&b, "tokenizer.ggml.eos_token_id", GGUF_U32);
    put_u32(&b, 261);
    put_key(&b, "tokenizer.chat_template", GGUF_STRING);
    put_str(&b, "{{ '<|im_start|>system\\nDefault system.<|im_end|>' }}");
    return b;
}

static void test_tokenizer_synthetic(void **state) {
    (void)state;
    buf_t b = make_tok_gguf();
    char err[256];
    gguf_file *f = gguf_parse(b.p, b.n, err, sizeof err);
    if (!f) fail_msg("gguf: %s", err);
    tokenizer_t *t = tokenizer_load(f, err, sizeof err);
    if (!t) fail_msg("%s", err);
    int32_t ids[64], n;
    n = tokenizer_encode(t, "hello world", 11, 0, ids, 64, NULL);
    /* "hello" -> hell + o ; " world" -> Ġw + o r l d */
    const int32_t want[] = {258, 'o', 259, 'o', 'r', 'l', 'd'};
    assert_int_equal(n, 7);
    assert_memory_equal(ids, want, sizeof want);
    /* specials only with parse_special */
    n = tokenizer_encode(t, "a<|im_end|>b", 12, 1, ids, 64, NULL);
    assert_int_equal(n, 3);
    assert_int_equal(ids[1], 261);
    n = tokenizer_encode(t, "a<|im_end|>b", 12, 0, ids, 64, NULL);
    assert_true(n > 3);
    /* too small a buffer: -1 and the size needed */
    int32_t need = 0;
    assert_int_equal(tokenizer_encode(t, "hello world", 11, 0, ids, 2, &need), -1);
    assert_int_equal(need, 7);
    /* random bytes (invalid UTF-8 included) round-trip exactly */
    char text[300], back[1200];
    int32_t many[400];
    for (int rep = 0; rep < 200; rep++) {
        size_t len = rnd() % 300;
        for (size_t i = 0; i < len; i++) text[i] = rep % 2 ? (char)rnd() : " \n\thel0123'sdw\xc3\xa9!"[rnd() % 17];
        n = tokenizer_encode(t, text, len, 0, many, 400, NULL);
        assert_true(n >= 0);
        long k = tokenizer_decode(t, many, n, 0, back, sizeof back);
        assert_int_equal(k, (long)len);
        assert_memory_equal(back, text, len);
    }
    /* digits always alone (smollm pre-tokenizer) */
    n = tokenizer_encode(t, "12", 2, 0, ids, 64, NULL);
    assert_int_equal(n, 2);
    char *chat = tokenizer_chat_prompt(t, NULL, "hi", err, sizeof err);
    assert_non_null(chat);
    assert_string_equal(chat, "<|im_start|>system\nDefault system.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
                              "<|im_start|>assistant\n");
    free(chat);
    tokenizer_free(t);
    gguf_close(f);
    free(b.p);
}

static void test_unicode_classes(void **state) {
    (void)state;
    assert_true(unicode_is_letter('a') && unicode_is_letter(0xE9) && unicode_is_letter(0x6771)); /* é 東 */
    assert_false(unicode_is_letter('1') || unicode_is_letter(' ') || unicode_is_letter(0x1F916));
    assert_true(unicode_is_number('7') && unicode_is_number(0x0663) && unicode_is_number(0x2163)); /* ٣ Ⅳ */
    assert_false(unicode_is_number('x'));
    assert_true(unicode_is_space(' ') && unicode_is_space('\n') && unicode_is_space(0x3000) &&
                unicode_is_space(0xA0));
    assert_false(unicode_is_space(0x200B)); /* zero width space is not White_Space */
}

/* ---- eval and sampling ------------------------------------------------------------- */

static void test_eval_math(void **state) {
    (void)state;
    float p[3] = {1, 2, 3}, q[3] = {1, 2, 3}, r[3] = {0, 0, 0};
    assert_true(eval_kl(p, q, 3) == 0);
    /* KL(softmax(p) || uniform) = sum p log(3p) */
    double lse = log(exp(1.0) + exp(2.0) + exp(3.0)), want = 0;
    for (int i = 0; i < 3; i++) want += exp(p[i] - lse) * ((p[i] - lse) + log(3.0));
    assert_true(fabs(eval_kl(p, r, 3) - want) < 1e-9);
    assert_true(fabs(eval_logsumexp(p, 3) - lse) < 1e-9);
    assert_true(eval_kl_fast(p, q, 3) == 0);
    assert_true(fabs(eval_kl_fast(p, r, 3) - want) < 1e-7);
    /* eval_run's KL (its log-sum-exps from float exponentials) against the
     * double one, on vocabulary-sized rows: differences like fp16's (KL
     * ~3e-7; eval_run's absolute error is ~2e-10 there) and large ones */
    enum { V = 49152 };
    float *a = malloc(sizeof(float) * V), *b = malloc(sizeof(float) * V), *c = malloc(sizeof(float) * V);
    for (int i = 0; i < V; i++) {
        a[i] = rndf() * 8;
        b[i] = a[i] + rndf() * 1e-2f;
        c[i] = a[i] + rndf();
    }
    a[17] = 20; /* a peaked distribution, as a model's */
    b[17] = 20.005f, c[17] = 19;
    double kb = eval_kl(a, b, V), kc = eval_kl(a, c, V);
    assert_true(kb > 1e-8 && kb < 1e-5 && kc > 1e-3);
    assert_true(fabs(eval_kl_fast(a, b, V) - kb) < 2e-9);
    assert_true(fabs(eval_kl_fast(a, c, V) - kc) < 1e-6 * kc);
    assert_true(eval_kl_fast(a, a, V) == 0);
    free(a), free(b), free(c);
    assert_int_equal(eval_windows(100, 512, 256), 1);
    assert_int_equal(eval_windows(512, 512, 256), 1);
    assert_int_equal(eval_windows(513, 512, 256), 2);
    assert_int_equal(eval_windows(1024, 512, 256), 3);
    float tie[4] = {1, 5, 5, 0};
    assert_int_equal(sample_argmax(tie, 4), 1);
    uint64_t s1 = 7, s2 = 7;
    float lg[50];
    for (int i = 0; i < 50; i++) lg[i] = rndf();
    for (int i = 0; i < 20; i++)
        assert_int_equal(sample_temperature(lg, 50, 0.8f, &s1), sample_temperature(lg, 50, 0.8f, &s2));
    assert_int_equal(sample_temperature(lg, 50, 0, &s1), sample_argmax(lg, 50));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gguf_parse),          cmocka_unit_test(test_gguf_truncated),
        cmocka_unit_test(test_gguf_refusals),       cmocka_unit_test(test_fp16),
        cmocka_unit_test(test_matmul_all_isas),     cmocka_unit_test(test_matmul_fused),
        cmocka_unit_test(test_pool),                cmocka_unit_test(test_kv_contig_attention),
        cmocka_unit_test(test_kv_contig_fork),      cmocka_unit_test(test_kv_paged_attention),
        cmocka_unit_test(test_kv_paged_fork),       cmocka_unit_test(test_kv_paged_parse),
        cmocka_unit_test(test_kv_store_check),
        cmocka_unit_test(test_kv_sim_matches_library),
        cmocka_unit_test(test_kv_sim_rotation_and_window),
        cmocka_unit_test(test_kv_sim_value_groups),
        cmocka_unit_test(test_tokenizer_synthetic),
        cmocka_unit_test(test_unicode_classes),     cmocka_unit_test(test_eval_math),
    };
    return cmocka_run_group_tests_name("engine (no model)", tests, NULL, NULL);
}
