/*
 * libFuzzer harness: kvp_attention() — batch views (CSR indptr, indices,
 * last_page_len), qo_indptr and attention parameters — over a small CPU
 * store whose pages hold arbitrary bytes, on every instruction set this CPU
 * runs (portable, AVX2, AVX-512).
 *
 *   make fuzz FUZZ_TARGETS=attention FUZZ_SECONDS=60
 *
 * The first four bytes choose the store: layers 1-2, kv heads 1-2,
 * head_dim (64 and 128 mostly, sometimes 80, 96, 256, or 32 which the
 * kernels do not support), page size 1..32, K and V formats (all six,
 * int8/int4 keys with staging pages), key order, 1-8 pool pages and 1-4
 * staging pages. The arena comes from an allocator that does not zero
 * memory (it fills it with 0xA5 or an input byte), like pages never
 * written. Then pages are filled: with arbitrary bytes through
 * kvp_store_page_from_host() (for int4 keys sometimes with u16 outlier
 * channel indices far past head_dim, which kvp_store_page_check() must
 * refuse; it must accept any bits in staging pages and plain formats), or
 * with real rows through
 * kvp_store_append() (staging pages, and sealed pool pages). Then up to
 * three attention calls with fuzzed views (batch, page lists, some
 * corrupted with limit values from fzi_edgy_i32), qo_indptr, q_heads
 * (huge values too), layer, dtype, causal, window_left, sm_scale,
 * logit_soft_cap and an optional lse.
 *
 * The harness predicts from the documented rules (kvpage.h,
 * kvp_attention()) whether the call must fail, in 64-bit arithmetic.
 * Buffers: q, out and lse are as large as qo_indptr[batch] x q_heads x
 * head_dim says when that fits in 1 MiB. A call the rules accept but
 * whose buffers would be larger is made with q = out = NULL (it must then
 * fail); a call the rules reject gets buffers capped at that size, so an
 * implementation that wrongly accepts it reads or writes out of bounds
 * (ASan). The indices array has room for 128 ids; an indptr past that
 * meets an id -1 first, which makes the view invalid.
 *
 * Oracles besides the sanitizers: the status is KVP_OK or a documented
 * code, the same on every instruction set; a call the rules reject fails;
 * on error the context's last error is non-empty and out and lse are
 * untouched (sentinel-filled); a call the rules accept succeeds (or reports
 * KVP_ENOMEM for a too small workspace); when every token the call reads was
 * written by kvp_store_append() (no arbitrary bytes) the outputs and the
 * log-sum-exp are finite. tests/test_fuzz_attention.c replays the corpus
 * and random inputs in `make test`.
 *
 * With FZ_CUDA defined (tests/fuzz/cuda_attention.c, replayed in the kernel
 * simulator by tests/test_fuzz_cuda.c) the store under test is a CUDA store
 * and the calls run on a CUDA context (one per workspace size instead of
 * one per instruction set), with q, out and lse in device buffers of the
 * same sizes (fuzz_device.h), copied back before the oracles. A CPU store
 * with the same parameters gets the same fills and its arena is uploaded
 * into the CUDA store's after creation, so both start with the same
 * never-written bytes (cudaMalloc'd memory is not the allocator's); the
 * instruction-set loop then runs on it. What changes: "the same status on
 * every instruction set" also covers the CUDA context, except that either
 * backend may report KVP_ENOMEM where the other does not (their workspaces
 * hold different things); the two arenas must stay byte for byte equal
 * (docs/formats.md: one format on both backends); and a destroyed store
 * gives back all its device memory.
 */
#define _POSIX_C_SOURCE 200809L
#include "kvpage.h"
#include "kvpage_ext.h"
#include "kvpage_tier.h"
#include "fuzz_input.h"
#include "fuzz_device.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define FA_CAP (1u << 20) /* largest q / out buffer (bytes) */
#define FA_REJECT_CAP (64u << 10) /* q / out of a call that must fail */
#define FA_MAX_PAGES 12   /* pool + staging */
#define FA_NI 128         /* ids in the indices array */
#define FA_MAXB 6         /* sequences in a view (arrays hold this many) */
#define FA_SENT 0x7B

/* ---- an allocator that does not zero ----------------------------------- */

typedef struct {
    uint8_t fill;
    long live;
} fa_alloc;

static void *fa_malloc(void *opaque, size_t size, size_t alignment) {
    fa_alloc *a = opaque;
    void *p = NULL;
    if (alignment < sizeof(void *)) alignment = sizeof(void *);
    if (posix_memalign(&p, alignment, size ? size : 1) != 0) return NULL;
    memset(p, a->fill, size);
    a->live++;
    return p;
}
static void fa_free(void *opaque, void *p) {
    ((fa_alloc *)opaque)->live--;
    free(p);
}

/* ---- contexts: one per instruction set and workspace, made once ---------- */

static kvp_ctx_t *fa_ctx[KVP_ISA_COUNT][2];
static kvp_ctx_t *fa_dev_ctx[2]; /* FZ_CUDA: a CUDA context per workspace */
static bool fa_ctx_done;

static void fa_contexts(void) {
    if (fa_ctx_done) return;
    fa_ctx_done = true;
    for (int32_t isa = KVP_ISA_PORTABLE; isa < KVP_ISA_COUNT; isa++) {
        if (!kvp_isa_supported(isa)) continue;
        for (int k = 0; k < 2; k++) {
            kvp_ctx_params_t p;
            kvp_ctx_params_init(&p);
            p.isa = isa;
            p.threads = k == 0 ? 1 : 2;
            p.workspace_bytes = k == 0 ? 4096 : (1u << 20);
            FZI_ASSERT(kvp_ctx_create(&p, &fa_ctx[isa][k], NULL, 0) == KVP_OK);
            if (FZ_DEV && isa == KVP_ISA_PORTABLE)
                FZI_ASSERT(fz_ctx_create(&p, &fa_dev_ctx[k], NULL, 0) == KVP_OK);
        }
    }
}

/* ---- the world ------------------------------------------------------------ */

typedef struct {
    kvp_store_t *s;   /* the store under test */
    kvp_store_t *cpu; /* s on the CPU; FZ_CUDA: a CPU store with the same contents */
    kvp_layout_t l;
    int32_t L, H, D, P, N, S;
    void *arena;           /* FZ_CUDA: s's arena (device) ... */
    const void *cpu_arena; /* ... and cpu's, of arena_bytes each */
    uint64_t arena_bytes;
    /* per (layer, page): tokens written by appends; garbage pages are 0 */
    uint64_t written[2][FA_MAX_PAGES];
} fa_world;

static uint16_t fa_f16(float f) { /* |f| in the normal fp16 range or 0; truncates */
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u;
    int32_t e = (int32_t)((x >> 23) & 0xff) - 112;
    if ((x & 0x7fffffffu) == 0 || e <= 0) return (uint16_t)sign;
    return (uint16_t)(sign | ((uint32_t)e << 10) | ((x & 0x7fffffu) >> 13));
}
static void fa_put(int32_t dtype, void *base, size_t i, float x) {
    if (dtype == KVP_FORMAT_FP32) {
        ((float *)base)[i] = x;
        return;
    }
    uint16_t h;
    if (dtype == KVP_FORMAT_FP16) {
        h = fa_f16(x);
    } else {
        uint32_t b;
        memcpy(&b, &x, 4);
        h = (uint16_t)(b >> 16);
    }
    memcpy((uint8_t *)base + 2 * i, &h, 2);
}
static float fa_get(int32_t dtype, const void *base, size_t i) {
    if (dtype == KVP_FORMAT_FP32) return ((const float *)base)[i];
    uint16_t h;
    memcpy(&h, (const uint8_t *)base + 2 * i, 2);
    if (dtype == KVP_FORMAT_BF16) {
        uint32_t b = (uint32_t)h << 16;
        float f;
        memcpy(&f, &b, 4);
        return f;
    }
    uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff;
    if (e == 31) return m ? NAN : INFINITY;
    float v = e == 0 ? ldexpf((float)m, -24) : ldexpf((float)(m | 0x400), (int)e - 25);
    return (h & 0x8000) ? -v : v;
}

static uint64_t fa_page_size_bytes(const fa_world *w, int32_t page) {
    return page < w->N ? w->l.page_bytes : w->l.staging_page_bytes;
}

/* Arbitrary bytes into a page (or part of it). */
static void fa_fill_garbage(fa_world *w, fzi_cursor *c) {
    int32_t page = (int32_t)fzi_below(c, (uint32_t)(w->N + w->S));
    uint64_t size = fa_page_size_bytes(w, page);
    uint8_t m = fzi_u8(c);
    uint64_t off = 0, n = size;
    if (m & 1) {
        off = (uint64_t)fzi_u16(c) % size;
        n = 1 + (uint64_t)fzi_u16(c) % (size - off);
    }
    uint8_t *buf = malloc(size);
    FZI_ASSERT(buf);
    if (m & 2) {
        memset(buf, fzi_u8(c), size); /* e.g. 0xFF: NaN scales, huge indices */
    } else {
        fzi_bytes(c, buf, size);
    }
    /* int4 keys: outlier channel indices far out of range in every K block */
    const bool k4 = w->l.k_format == KVP_FORMAT_INT4 || w->l.k_format == KVP_FORMAT_INT4_V1;
    if ((m & 4) && page < w->N && k4 && w->D >= 32) {
        uint64_t kb = w->l.k_block_bytes, vb = w->l.v_block_bytes;
        /* the documented counts: int4 4 per 32 channels or part, int4_v1 D/32 */
        const int32_t R = w->l.k_format == KVP_FORMAT_INT4 ? (w->D + 31) / 32 * 4 : w->D / 32;
        for (int32_t l = 0; l < w->L; l++)
            for (int32_t h = 0; h < w->H; h++) {
                uint64_t at = (uint64_t)l * (uint64_t)w->H * (kb + vb) + (uint64_t)h * kb +
                              (uint64_t)w->P * (uint64_t)w->D / 2 + 4 * (uint64_t)w->D;
                for (int32_t j = 0; j < R; j++) {
                    uint16_t idx = (uint16_t)((m & 8) ? 0xffffu - (uint32_t)j : (uint32_t)w->D + (uint32_t)j * 97u);
                    memcpy(buf + at + 2 * (uint64_t)j, &idx, 2);
                }
            }
    }
    /* the check of whole serializations: staging pages and plain formats
     * take any bits; an outlier list pushed past head_dim never passes */
    int crc = kvp_store_page_check(w->s, page, buf, size);
    FZI_ASSERT(crc == KVP_OK || crc == KVP_EINVAL);
    bool plain_k = w->l.k_format != KVP_FORMAT_INT8 && !k4;
    bool plain_v = w->l.v_format != KVP_FORMAT_INT8 && w->l.v_format != KVP_FORMAT_INT4 &&
                   w->l.v_format != KVP_FORMAT_INT4_V1;
    if (page >= w->N || (plain_k && plain_v)) FZI_ASSERT(crc == KVP_OK);
    if ((m & 4) && page < w->N && k4 && w->D >= 32)
        FZI_ASSERT(crc == KVP_EINVAL);
    if (crc != KVP_OK) FZI_ASSERT(kvp_store_last_error(w->s)[0] != '\0');
    FZI_ASSERT(kvp_store_page_from_host(w->s, page, off, buf + off, n) == KVP_OK);
    if (w->cpu != w->s) FZI_ASSERT(kvp_store_page_from_host(w->cpu, page, off, buf + off, n) == KVP_OK);
    FZI_ASSERT(kvp_store_synchronize(w->s) == KVP_OK); /* buf is read until then */
    free(buf);
    for (int32_t l = 0; l < w->L; l++) w->written[l][page] = 0;
}

/* Real rows through kvp_store_append(), every layer. */
static void fa_fill_rows(fa_world *w, fzi_cursor *c) {
    const int32_t P = w->P;
    int64_t slots[32];
    kvp_page_op_t op;
    int32_t rows, page, t0 = 0;
    bool seal = false;
    if (w->l.needs_staging && (fzi_u8(c) & 1)) {
        /* seal a pool page from P appended rows (count 0) */
        page = (int32_t)fzi_below(c, (uint32_t)w->N);
        rows = P;
        for (int32_t j = 0; j < P; j++) slots[j] = (int64_t)page * P + j;
        op.kind = KVP_OP_SEAL;
        op.src = -1;
        op.dst = page;
        op.count = 0;
        op.row = 0;
        seal = true;
    } else {
        page = w->l.needs_staging ? w->N + (int32_t)fzi_below(c, (uint32_t)w->S)
                                  : (int32_t)fzi_below(c, (uint32_t)w->N);
        t0 = (int32_t)fzi_below(c, (uint32_t)P);
        rows = 1 + (int32_t)fzi_below(c, (uint32_t)(P - t0));
        for (int32_t j = 0; j < rows; j++) slots[j] = (int64_t)page * P + t0 + j;
    }
    int32_t dtype = (int32_t)fzi_below(c, 3);
    size_t n = (size_t)rows * (size_t)(w->H * w->D);
    uint8_t *k = malloc(n * 4), *v = malloc(n * 4);
    FZI_ASSERT(k && v);
    void *dk = fz_dev_mirror(k, n * 4), *dv = fz_dev_mirror(v, n * 4);
    uint8_t scale = fzi_u8(c);
    float mag = scale < 200 ? 1.0f : 50.0f;
    uint32_t rng = fzi_u32(c) | 1;
    for (int32_t l = 0; l < w->L; l++) {
        for (size_t i = 0; i < n; i++) {
            rng = rng * 1103515245u + 12345u;
            fa_put(dtype, k, i, (float)(int8_t)(rng >> 24) / 64.0f * mag);
            rng = rng * 1103515245u + 12345u;
            fa_put(dtype, v, i, (float)(int8_t)(rng >> 24) / 64.0f * mag);
        }
        kvp_append_params_t a;
        kvp_append_params_init(&a);
        a.layer = l;
        a.rows = rows;
        a.dtype = dtype;
        a.k = dk;
        a.v = dv;
        a.slots = slots;
        a.ops = seal ? &op : NULL;
        a.num_ops = seal ? 1 : 0;
        fz_dev_upload(dk, k, n * 4);
        fz_dev_upload(dv, v, n * 4);
        FZI_ASSERT(kvp_store_append(w->s, &a) == KVP_OK);
        FZI_ASSERT(kvp_store_synchronize(w->s) == KVP_OK); /* before k, v change */
        if (w->cpu != w->s) {
            a.k = k;
            a.v = v;
            FZI_ASSERT(kvp_store_append(w->cpu, &a) == KVP_OK);
        }
        if (seal) w->written[l][page] = P == 64 ? ~0ull : ((1ull << P) - 1);
        else
            for (int32_t j = 0; j < rows; j++) w->written[l][page] |= 1ull << (t0 + j);
    }
    fz_dev_release(dk, k);
    fz_dev_release(dv, v);
    free(k);
    free(v);
}

/* ---- the documented rules of kvp_attention() ------------------------------ */

typedef struct {
    int32_t batch;
    int32_t indptr[FA_MAXB + 1];
    int32_t indices[FA_NI];
    int32_t last[FA_MAXB];
    int32_t qo[FA_MAXB + 1];
} fa_view;

/* 0: valid; else the status the rules require. `clean`: every token read
 * was written by an append. */
static int fa_rules(const fa_world *w, const fa_view *v, const kvp_attention_params_t *p,
                    bool *clean) {
    *clean = true;
    if (p->layer < 0 || p->layer >= w->L) return KVP_EINVAL;
    if (p->q_heads < 1 || p->q_heads > 65536 || p->q_heads % w->H != 0) return KVP_EINVAL;
    if (p->dtype < 0 || p->dtype > 2) return KVP_EINVAL;
    if (p->causal != 0 && p->causal != 1) return KVP_EINVAL;
    if (p->window_left < -1) return KVP_EINVAL;
    if (!(p->sm_scale >= 0.0f) || !isfinite(p->sm_scale)) return KVP_EINVAL;
    if (!(p->logit_soft_cap >= 0.0f) || !isfinite(p->logit_soft_cap)) return KVP_EINVAL;
    bool dim_ok = w->D == 64 || w->D == 80 || w->D == 96 || w->D == 128 || w->D == 256;
    if (v->batch < 0) return KVP_EINVAL;
    if (v->batch > 0 && v->indptr[0] != 0) return KVP_EINVAL;
    if (v->qo[0] != 0) return KVP_EINVAL;
    int64_t limit = (int64_t)w->N + w->S;
    for (int32_t b = 0; b < v->batch; b++) {
        int64_t lo = v->indptr[b], hi = v->indptr[b + 1], n = hi - lo;
        if (n < 0) return KVP_EINVAL;
        if (hi > FA_NI) hi = FA_NI + 1; /* the id -1 at the array's end stops it */
        int64_t last = v->last[b];
        if (n > 0 && (last < 1 || last > w->P)) return KVP_EINVAL;
        for (int64_t i = lo; i < hi; i++) {
            int64_t id = i < FA_NI ? v->indices[i] : -1;
            if (id < 0 || id >= limit) return KVP_EINVAL;
            if (id >= w->N && i != hi - 1) return KVP_EINVAL;
        }
        int64_t kv_len = n == 0 ? 0 : (n - 1) * w->P + last;
        if (kv_len > INT32_MAX) return KVP_EINVAL;
        int64_t q_len = (int64_t)v->qo[b + 1] - v->qo[b];
        if (q_len < 0 || q_len > kv_len) return KVP_EINVAL;
        /* which tokens does it read (layer p->layer): all kv_len of them */
        for (int64_t i = lo; i < hi && *clean; i++) {
            int32_t id = v->indices[i];
            int64_t tokens = i == hi - 1 ? last : w->P;
            uint64_t need = tokens >= 64 ? ~0ull : ((1ull << tokens) - 1);
            if ((w->written[p->layer][id] & need) != need) *clean = false;
        }
    }
    if (v->batch > 0 && (int64_t)v->qo[v->batch] * p->q_heads > INT32_MAX) return KVP_EINVAL;
    if (!dim_ok) return KVP_ENOTSUP;
    return KVP_OK;
}

static void fa_make_view(const fa_world *w, fzi_cursor *c, fa_view *v) {
    uint8_t m = fzi_u8(c);
    v->batch = m < 240 ? (int32_t)(m % (FA_MAXB + 1)) : -(int32_t)(m - 239);
    int32_t nb = v->batch > 0 ? v->batch : 0;
    /* the indices array: valid ids everywhere, -1 at its end */
    for (int i = 0; i < FA_NI; i++)
        v->indices[i] = (int32_t)((uint32_t)(i * 7 + m) % (uint32_t)w->N);
    v->indices[FA_NI - 1] = -1;
    int32_t at = 0;
    v->indptr[0] = 0;
    v->qo[0] = 0;
    for (int32_t b = 0; b < nb; b++) {
        int32_t n = (int32_t)fzi_below(c, 4);
        if (at + n > FA_NI - 2) n = 0;
        for (int32_t i = 0; i < n; i++) {
            uint8_t k = fzi_u8(c);
            int32_t id = (int32_t)(k % (uint32_t)w->N);
            /* staging layouts: the last page is often a staging page */
            if (w->S > 0 && i == n - 1 && (k & 0x80)) id = w->N + (int32_t)((k >> 3) % (uint32_t)w->S);
            v->indices[at + i] = id;
        }
        at += n;
        v->indptr[b + 1] = at;
        uint8_t lm = fzi_u8(c);
        v->last[b] = n == 0 ? 0 : 1 + (int32_t)(lm % (uint32_t)w->P);
        int64_t kv_len = n == 0 ? 0 : (int64_t)(n - 1) * w->P + v->last[b];
        int32_t q = kv_len == 0 ? 0 : (int32_t)(fzi_u8(c) % (uint32_t)(kv_len < 5 ? kv_len + 1 : 5));
        v->qo[b + 1] = v->qo[b] + q;
    }
    /* corruptions: limit values in any of the arrays */
    int32_t k = (int32_t)fzi_below(c, 4);
    for (int32_t i = 0; i < k; i++) {
        uint8_t where = fzi_u8(c);
        int32_t val = fzi_edgy_i32(c);
        switch (where % 5) {
        case 0: v->indptr[where / 5 % (nb + 1)] = val; break;
        case 1: v->qo[where / 5 % (nb + 1)] = val; break;
        case 2:
            if (nb > 0) v->last[where / 5 % nb] = val;
            break;
        case 3: v->indices[where / 5 % (FA_NI - 1)] = val; break;
        default:
            /* a sequence whose qo range runs past its tokens (an earlier
             * corruption may have left INT32_MAX there: no overflow) */
            if (nb > 0) {
                int64_t x = (int64_t)v->qo[nb] + 1 + (int64_t)(where % 3);
                v->qo[nb] = x > INT32_MAX ? INT32_MAX : (int32_t)x;
            }
            break;
        }
    }
}

static bool fa_untouched(const void *p, size_t n) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++)
        if (b[i] != FA_SENT) return false;
    return true;
}

static void fa_attend(fa_world *w, fzi_cursor *c) {
    fa_view fv;
    fa_make_view(w, c, &fv);
    kvp_kv_view_t view;
    memset(&view, 0, sizeof view);
    view.struct_size = sizeof view;
    view.batch = fv.batch;
    view.page_size = w->P;
    view.num_pages = w->N;
    view.num_staging = w->S;
    view.indptr = fv.indptr;
    view.indices = fv.indices;
    view.last_page_len = fv.last;

    kvp_attention_params_t p;
    kvp_attention_params_init(&p);
    uint8_t m = fzi_u8(c);
    p.layer = m < 240 ? (int32_t)(m % (uint32_t)w->L) : fzi_edgy_i32(c);
    m = fzi_u8(c);
    p.q_heads = m < 200 ? w->H * (1 + (int32_t)(m % 4)) : m < 230 ? 1 + (int32_t)(m % 3)
                                                                   : fzi_edgy_i32(c);
    m = fzi_u8(c);
    p.dtype = m < 250 ? (int32_t)(m % 3) : fzi_edgy_i32(c);
    m = fzi_u8(c);
    p.causal = m < 250 ? (int32_t)(m & 1) : fzi_edgy_i32(c);
    m = fzi_u8(c);
    p.window_left = m < 128 ? -1 : m < 240 ? (int32_t)(m % 8) : fzi_edgy_i32(c);
    static const float scales[] = {0.0f, 0.125f, 1.0f, 1e-20f, 1e20f, -1.0f, NAN, INFINITY};
    m = fzi_u8(c);
    p.sm_scale = m < 128 ? 0.0f : scales[m % 8];
    static const float caps[] = {0.0f, 30.0f, 1e-3f, 50.0f, -1.0f, NAN, INFINITY, 1e30f};
    m = fzi_u8(c);
    p.logit_soft_cap = m < 128 ? 0.0f : caps[m % 8];
    uint8_t opt = fzi_u8(c);
    p.qo_indptr = fv.qo;
    view.indptr = (opt & 0x30) == 0x30 && fv.batch > 0 ? NULL : fv.indptr;
    bool clean;
    int want = fa_rules(w, &fv, &p, &clean);
    if (view.indptr == NULL) want = KVP_EINVAL;

    /* buffer sizes from qo_indptr[batch] x q_heads x head_dim */
    int64_t rows = fv.batch > 0 ? fv.qo[fv.batch] : 0;
    size_t es = p.dtype == KVP_FORMAT_FP32 || p.dtype < 0 || p.dtype > 2 ? 4 : 2;
    uint64_t elems = 0, bytes = 0;
    bool fits = rows >= 0 && p.q_heads >= 0 &&
                !__builtin_mul_overflow((uint64_t)rows, (uint64_t)p.q_heads, &elems) &&
                !__builtin_mul_overflow(elems, (uint64_t)w->D, &elems) &&
                !__builtin_mul_overflow(elems, (uint64_t)es, &bytes) && bytes <= FA_CAP;
    bool null_bufs = false;
    if (!fits) {
        if (want == KVP_OK) {
            if (rows <= 0) return; /* cannot happen: no rows need no buffers */
            null_bufs = true;      /* accepted shapes too large to back: q = out = NULL */
            want = KVP_EINVAL;
        }
        elems = FA_REJECT_CAP / es; /* a rejected call gets capped buffers */
        bytes = elems * es;
    }
    size_t nlse = elems / (size_t)w->D;
    uint8_t *q = malloc(bytes ? bytes : 1), *out = malloc(bytes ? bytes : 1);
    float *lse = malloc((nlse ? nlse : 1) * sizeof(float));
    FZI_ASSERT(q && out && lse);
    uint32_t rng = fzi_u32(c) | 1;
    float qmag = (opt & 1) ? 20.0f : 1.0f;
    for (size_t i = 0; i < bytes / es; i++) {
        rng = rng * 1103515245u + 12345u;
        fa_put(p.dtype >= 0 && p.dtype <= 2 ? p.dtype : 0, q, i, (float)(int8_t)(rng >> 24) / 64.0f * qmag);
    }
    p.q = null_bufs ? NULL : q;
    p.out = null_bufs ? NULL : out;
    p.lse = (opt & 2) ? lse : NULL;

    fa_contexts();
    int first_rc = 1, dev_rc = 1;
    int k = (opt >> 2) & 1;
    size_t obytes = bytes ? bytes : 1, lbytes = (nlse ? nlse : 1) * sizeof(float);
    void *dq = fz_dev_mirror(q, obytes), *dout = fz_dev_mirror(out, obytes);
    void *dlse = fz_dev_mirror(lse, lbytes);
    /* run 0: the CUDA context (FZ_CUDA only); then every instruction set */
    for (int32_t run = 0; run < KVP_ISA_COUNT; run++) {
        bool dev = run == 0;
        kvp_ctx_t *ctx = dev ? fa_dev_ctx[k] : fa_ctx[run][k];
        if (ctx == NULL) continue;
        memset(out, FA_SENT, obytes);
        memset(lse, FA_SENT, lbytes);
        kvp_attention_params_t pr = p;
        if (dev) {
            fz_dev_upload(dout, out, obytes);
            fz_dev_upload(dlse, lse, lbytes);
            pr.q = p.q ? dq : NULL;
            pr.out = p.out ? dout : NULL;
            pr.lse = p.lse ? dlse : NULL;
        }
        int rc = kvp_attention(ctx, dev ? w->s : w->cpu, &view, &pr);
        if (dev) {
            fz_dev_sync();
            fz_dev_download(out, dout, obytes);
            fz_dev_download(lse, dlse, lbytes);
        }
        FZI_ASSERT(rc == KVP_OK || rc == KVP_EINVAL || rc == KVP_ENOTSUP || rc == KVP_ENOMEM);
        if (dev) {
            dev_rc = rc;
        } else {
            if (first_rc == 1) first_rc = rc;
            FZI_ASSERT(rc == first_rc); /* every instruction set checks the same way */
        }
        if (rc != KVP_OK) {
            FZI_ASSERT(kvp_ctx_last_error(ctx)[0] != '\0');
            FZI_ASSERT(fa_untouched(out, bytes ? bytes : 1));
            FZI_ASSERT(fa_untouched(lse, (nlse ? nlse : 1) * sizeof(float)));
            /* an unsupported head_dim may be reported before or after the view */
            bool dim_ok = w->D == 64 || w->D == 80 || w->D == 96 || w->D == 128 || w->D == 256;
            if (want != KVP_OK) FZI_ASSERT(rc == KVP_EINVAL || (rc == KVP_ENOTSUP && !dim_ok));
            else FZI_ASSERT(rc == KVP_ENOMEM);
            continue;
        }
        FZI_ASSERT(want == KVP_OK);
        if (clean && rows > 0) {
            for (size_t i = 0; i < (size_t)elems; i++) FZI_ASSERT(isfinite(fa_get(p.dtype, out, i)));
            if (p.lse != NULL)
                for (size_t i = 0; i < (size_t)rows * (size_t)p.q_heads; i++)
                    FZI_ASSERT(isfinite(lse[i]));
        }
    }
    /* the CUDA context checks as the CPU does, but for its own workspace */
    if (dev_rc != 1 && first_rc != 1)
        FZI_ASSERT(dev_rc == first_rc || dev_rc == KVP_ENOMEM || first_rc == KVP_ENOMEM);
    fz_dev_release(dq, q);
    fz_dev_release(dout, out);
    fz_dev_release(dlse, lse);
    free(q);
    free(out);
    free(lse);
}

/* FZ_CUDA: the CUDA arena holds the CPU arena's bytes (both had the same
 * fills; the formats are the same on both backends). */
static void fa_same_arenas(fa_world *w) {
    if (w->cpu == w->s) return;
    uint8_t *now = malloc(w->arena_bytes);
    FZI_ASSERT(now);
    FZI_ASSERT(kvp_store_synchronize(w->s) == KVP_OK);
    fz_dev_download(now, w->arena, w->arena_bytes);
    FZI_ASSERT(memcmp(now, w->cpu_arena, w->arena_bytes) == 0);
    free(now);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fzi_cursor c = fzi_make(data, size);
    static const int32_t dims[] = {64, 128, 64, 128, 80, 96, 256, 32};
    static const int32_t psz[] = {1, 2, 4, 8, 16, 32};
    uint8_t b0 = fzi_u8(&c), b1 = fzi_u8(&c), b2 = fzi_u8(&c), b3 = fzi_u8(&c);
    kvp_store_params_t sp;
    kvp_store_params_init(&sp);
    sp.layers = 1 + (b0 & 1);
    sp.kv_heads = 1 + ((b0 >> 1) & 1);
    sp.head_dim = dims[(b0 >> 2) & 7];
    sp.page_size = psz[b1 % 6];
    sp.k_order = (b1 >> 3) & 1;
    sp.k_format = b2 % KVP_FORMAT_COUNT;
    sp.v_format = (b2 / KVP_FORMAT_COUNT) % KVP_FORMAT_COUNT;
    sp.num_pages = 1 + (b3 & 7);
    sp.num_staging = 1 + ((b3 >> 3) & 3);
    fa_alloc al = {0xA5, 0};
    if (b3 & 0x40) al.fill = fzi_u8(&c);
    sp.allocator.alloc = fa_malloc;
    sp.allocator.free = fa_free;
    sp.allocator.opaque = &al;

    fa_contexts();
    size_t dev_used = fz_dev_used();
    fa_world w;
    memset(&w, 0, sizeof w);
    int rc = fz_store_create(&sp, &w.s, NULL, 0);
    if (FZ_DEV) {
        int cpu_rc = kvp_store_create(&sp, &w.cpu, NULL, 0);
        FZI_ASSERT(cpu_rc == rc); /* the same parameter checks */
    } else {
        w.cpu = w.s;
    }
    if (rc != KVP_OK) {
        FZI_ASSERT(rc == KVP_EINVAL && al.live == 0 && fz_dev_used() == dev_used);
        return 0;
    }
    w.l.struct_size = sizeof w.l;
    FZI_ASSERT(kvp_store_layout(w.s, &w.l) == KVP_OK);
    kvp_store_info_t info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    FZI_ASSERT(kvp_store_info(w.s, &info) == KVP_OK);
    w.L = sp.layers;
    w.H = sp.kv_heads;
    w.D = sp.head_dim;
    w.P = sp.page_size;
    w.N = info.num_pages;
    w.S = w.l.needs_staging ? info.num_staging : 0;
    if (!w.l.needs_staging && info.num_staging != 0) {
        /* the view must name the store's staging count */
        w.S = info.num_staging;
    }
    FZI_ASSERT(w.N + w.S <= FA_MAX_PAGES);
    if (w.cpu != w.s) {
        /* the CUDA arena starts with the CPU arena's (never written) bytes */
        kvp_store_info_t ci;
        memset(&ci, 0, sizeof ci);
        ci.struct_size = sizeof ci;
        FZI_ASSERT(kvp_store_info(w.cpu, &ci) == KVP_OK && ci.arena_bytes == info.arena_bytes);
        fz_dev_upload(info.arena, ci.arena, ci.arena_bytes);
        w.arena = info.arena;
        w.cpu_arena = ci.arena;
        w.arena_bytes = ci.arena_bytes;
    }

    int fills = (int)fzi_below(&c, 10);
    for (int i = 0; i < fills; i++) {
        if (fzi_u8(&c) < 90) fa_fill_garbage(&w, &c);
        else fa_fill_rows(&w, &c);
        fa_same_arenas(&w);
    }
    int calls = 1 + (int)fzi_below(&c, 3);
    for (int i = 0; i < calls; i++) fa_attend(&w, &c);
    if (w.cpu != w.s) kvp_store_destroy(w.cpu);
    kvp_store_destroy(w.s);
    FZI_ASSERT(al.live == 0 && fz_dev_used() == dev_used);
    return 0;
}
