/*
 * libFuzzer harness: the page store's data-plane inputs — kvp_store_append()
 * (rows, strides, slots, SEAL operations), kvp_store_apply_ops() (COPY,
 * UNSEAL, unknown kinds), kvp_store_read(), page I/O
 * (kvp_store_page_to_host(), kvp_store_page_from_host(), the functions of
 * kvp_store_page_io()) and the inspection calls (info, layout, region, fp8
 * scales, non-finite count).
 *
 *   make fuzz FUZZ_TARGETS=store FUZZ_SECONDS=60
 *
 * The first bytes choose a small CPU store (layers, kv heads, head_dim,
 * page size, K and V formats, key order, pool and staging pages) created
 * through a counting allocator that can fail the n-th allocation
 * (KVP_ENOMEM with nothing leaked: every allocation is freed again by
 * kvp_store_destroy()). Every following byte is an operation with fuzzed
 * arguments: layers, page ids, slots, strides, offsets and byte counts are
 * often limit values (fzi_edgy_i64), ops carry fuzzed kinds, pages, counts
 * and rows, struct sizes and reserved_ fields are sometimes wrong.
 *
 * Buffers: every buffer the harness passes is as large as the call's
 * arguments say, except where the arguments themselves are invalid by the
 * documented rules (a row extent beyond the address space, a token range
 * outside the page, a byte range outside the page): those calls must fail,
 * so they get small buffers, and a library that accepts them reads or
 * writes out of bounds, which ASan reports. Calls the harness cannot back
 * with a real buffer and that may legally succeed are not made.
 *
 * Oracles besides the sanitizers: statuses are KVP_OK or documented codes;
 * a failed call leaves the whole arena byte for byte as it was, leaves
 * output buffers untouched and sets a non-empty last error; calls the
 * documented rules reject (reserved_ != 0, a stride whose rows overflow,
 * bad ids and ranges) fail; a successful append reads back (kvp_store_read)
 * as the rows written, within the format's rounding, and finite; a page
 * written with kvp_store_page_from_host() reads back bit for bit and no
 * byte outside the written range changed; a single COPY makes the
 * destination page's bytes equal the source's; a single UNSEAL makes the
 * staging tokens read as the pool page's, rounded to fp16.
 * tests/test_fuzz_store.c replays the corpus and random inputs in `make test`.
 *
 * With FZ_CUDA defined (tests/fuzz/cuda_store.c, replayed in the kernel
 * simulator by tests/test_fuzz_cuda.c) the store under test is a CUDA store
 * (the failing allocator serves its host metadata) and the append's k and v
 * are device buffers of the same sizes (fuzz_device.h); the arena is read
 * with cudaMemcpy after kvp_store_synchronize(), and page copies to the
 * host are waited for before their bytes are checked. A CPU store of the
 * same parameters (its own allocator, which never fails) runs every call
 * that writes (append, apply_ops, page_from_host, fp8 scales) with the same
 * arguments, its arena uploaded into the CUDA store's after creation. What
 * changes: both stores must give the same status for each of those calls
 * (and for the creation), their arenas must be byte for byte equal after
 * every operation (docs/formats.md: one format on both backends), and the
 * destroyed store must give back all its device memory.
 */
#define _POSIX_C_SOURCE 200809L
#include "kvpage.h"
#include "kvpage_ext.h"
#include "kvpage_plan.h"
#include "kvpage_tier.h"
#include "fuzz_input.h"
#include "fuzz_device.h"
#include "fuzz_rot.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define FS_CAP (1u << 20)   /* largest row tensor the harness allocates (bytes) */
#define FS_OPS 24           /* operations per input at most */
#define FS_SENT 0x5A

typedef struct {
    kvp_store_t *s;   /* the store under test */
    kvp_store_t *cpu; /* s on the CPU; FZ_CUDA: a CPU store given the same writes */
    kvp_layout_t l;
    int32_t N, S, P, H, D, L;
    uint8_t *arena; /* s's (a device address under FZ_CUDA) */
    uint64_t arena_bytes;
    uint8_t *snap;
    uint8_t *now;               /* FZ_CUDA: s's arena, read back */
    const uint8_t *cpu_arena;   /* FZ_CUDA: cpu's arena */
    uint64_t max_page;
} fs_world;

static int32_t fs_small_or_edgy(fzi_cursor *c, int32_t n) {
    uint8_t m = fzi_u8(c);
    if (m >= 224) return fzi_edgy_i32(c);
    return (int32_t)(m % (uint32_t)n);
}

/* The arena's bytes as they are now (on a device: copied back). */
static const uint8_t *fs_arena_now(const fs_world *w) {
    if (w->cpu == w->s) return w->arena;
    FZI_ASSERT(kvp_store_synchronize(w->s) == KVP_OK);
    fz_dev_download(w->now, w->arena, w->arena_bytes);
    return w->now;
}
static void fs_snapshot(fs_world *w) { memcpy(w->snap, fs_arena_now(w), w->arena_bytes); }
static bool fs_unchanged(const fs_world *w) {
    return memcmp(w->snap, fs_arena_now(w), w->arena_bytes) == 0;
}
/* FZ_CUDA: the CPU twin holds the same bytes. */
static void fs_same_arenas(const fs_world *w) {
    if (w->cpu == w->s) return;
    FZI_ASSERT(memcmp(fs_arena_now(w), w->cpu_arena, w->arena_bytes) == 0);
}
static bool fs_untouched(const void *p, size_t n) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++)
        if (b[i] != FS_SENT) return false;
    return true;
}
/* A failed call: documented status, detail text, arena unchanged. */
static void fs_failed(const fs_world *w, int rc) {
    FZI_ASSERT(rc == KVP_EINVAL || rc == KVP_ENOMEM);
    FZI_ASSERT(kvp_store_last_error(w->s)[0] != '\0');
    FZI_ASSERT(fs_unchanged(w));
}

static size_t fs_es(int32_t dtype) { return dtype == KVP_FORMAT_FP32 ? 4 : 2; }

static uint16_t fs_f16(float f) { /* round to nearest even; inputs are small */
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u;
    int32_t e = (int32_t)((x >> 23) & 0xff) - 112;
    uint32_t m = x & 0x7fffffu;
    if ((x & 0x7fffffffu) == 0) return (uint16_t)sign;
    if (e <= 0) return (uint16_t)sign; /* the harness's values never get this small */
    uint32_t h = ((uint32_t)e << 10) | (m >> 13), rem = m & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) h++;
    return (uint16_t)(sign | h);
}
static float fs_h2f(uint16_t h) {
    uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff;
    float v = e == 0 ? ldexpf((float)m, -24) : ldexpf((float)(m | 0x400), (int)e - 25);
    return (h & 0x8000) ? -v : v;
}
/* Write x in dtype at element i; returns the stored value. */
static float fs_put(int32_t dtype, uint8_t *base, size_t i, float x) {
    if (dtype == KVP_FORMAT_FP32) {
        memcpy(base + 4 * i, &x, 4);
        return x;
    }
    uint16_t h;
    float back;
    if (dtype == KVP_FORMAT_FP16) {
        h = fs_f16(x);
        back = fs_h2f(h);
    } else {
        uint32_t b;
        memcpy(&b, &x, 4);
        h = (uint16_t)(b >> 16);
        b = (uint32_t)h << 16;
        memcpy(&back, &b, 4);
    }
    memcpy(base + 2 * i, &h, 2);
    return back;
}

/* ---- append ------------------------------------------------------------ */

/* Element e of row r of an append's K and V input, as fp32. */
static void fs_input(const kvp_append_params_t *a, const uint8_t *k, const uint8_t *v, int64_t kst,
                     int64_t vst, int32_t r, int64_t e, float *xk, float *xv) {
    if (a->dtype == KVP_FORMAT_FP32) {
        memcpy(xk, k + 4 * (size_t)(r * kst + e), 4);
        memcpy(xv, v + 4 * (size_t)(r * vst + e), 4);
        return;
    }
    uint16_t hk, hv;
    memcpy(&hk, k + 2 * (size_t)(r * kst + e), 2);
    memcpy(&hv, v + 2 * (size_t)(r * vst + e), 2);
    if (a->dtype == KVP_FORMAT_FP16) {
        *xk = fs_h2f(hk);
        *xv = fs_h2f(hv);
    } else {
        uint32_t bk = (uint32_t)hk << 16, bv = (uint32_t)hv << 16;
        memcpy(xk, &bk, 4);
        memcpy(xv, &bv, 4);
    }
}

static void fs_append(fs_world *w, fzi_cursor *c) {
    const int32_t P = w->P, N = w->N, S = w->S;
    const int64_t row = (int64_t)w->H * w->D;
    kvp_append_params_t a;
    kvp_append_params_init(&a);
    uint8_t flags = fzi_u8(c);
    a.layer = fs_small_or_edgy(c, w->L);
    a.rows = fs_small_or_edgy(c, 2 * P + 3);
    a.dtype = fs_small_or_edgy(c, 3);
    int64_t strides[2];
    for (int i = 0; i < 2; i++) {
        uint8_t m = fzi_u8(c);
        strides[i] = m < 96 ? 0 : m < 160 ? row + (m % 5) : m < 176 ? row - 1 : fzi_edgy_i64(c);
    }
    a.k_row_stride = strides[0];
    a.v_row_stride = strides[1];
    if (flags & 0x80) a.reserved_ = (int32_t)(fzi_u8(c) | 1);
    if ((flags & 0x60) == 0x60) a.struct_size = fzi_u8(c);

    /* slots: rows into staging pages (or any page without staging), skips,
     * and some limit values */
    int32_t nrows = a.rows > 0 && a.rows <= 4 * P + 8 ? a.rows : 0;
    int64_t slots[4 * 16 + 8];
    int32_t page_base = w->l.needs_staging ? N : 0, page_count = w->l.needs_staging ? S : N;
    for (int32_t r = 0; r < nrows; r++) {
        uint8_t m = fzi_u8(c);
        if (m < 180 && page_count > 0)
            slots[r] = (int64_t)(page_base + (int32_t)(m % (uint32_t)page_count)) * P + fzi_below(c, (uint32_t)P);
        else if (m < 210) slots[r] = -1;
        else slots[r] = fzi_edgy_i64(c);
    }
    /* ops: SEALs consistent with the slots (sometimes bent), and noise */
    kvp_page_op_t ops[4];
    int32_t nops = (int32_t)fzi_below(c, 4);
    for (int32_t i = 0; i < nops; i++) {
        uint8_t m = fzi_u8(c);
        kvp_page_op_t *op = &ops[i];
        op->kind = m < 160 ? KVP_OP_SEAL : (m < 200 ? (int32_t)(m % 5) : fzi_edgy_i32(c));
        op->dst = (int32_t)fzi_below(c, (uint32_t)N);
        op->count = (int32_t)fzi_below(c, (uint32_t)P);
        op->src = op->count > 0 && S > 0 ? N + (int32_t)fzi_below(c, (uint32_t)S) : -1;
        op->row = nrows > 0 ? (int32_t)fzi_below(c, (uint32_t)nrows) : 0;
        if (op->kind == KVP_OP_SEAL && op->row + (P - op->count) <= nrows)
            for (int32_t j = 0; j < P - op->count; j++)
                slots[op->row + j] = (int64_t)op->dst * P + op->count + j;
        uint8_t bend = fzi_u8(c);
        if (bend >= 232) {
            int32_t v = fzi_edgy_i32(c);
            switch (bend % 4) {
            case 0: op->src = v; break;
            case 1: op->dst = v; break;
            case 2: op->count = v; break;
            default: op->row = v; break;
            }
        }
    }
    a.ops = nops > 0 ? ops : NULL;
    a.num_ops = nops;
    if ((flags & 0x18) == 0x18) {
        a.num_ops = -(int32_t)fzi_u8(c) - 1;
    } else if ((flags & 0x18) == 0x10 && nops > 0) {
        a.ops = NULL; /* num_ops > 0 with NULL ops */
    }

    /* the row tensors: exactly as large as rows x stride says */
    size_t es = a.dtype >= 0 && a.dtype <= 2 ? fs_es(a.dtype) : 4;
    bool must_fail = a.reserved_ != 0 || a.layer < 0 || a.layer >= w->L || a.rows < 0 ||
                     a.dtype < 0 || a.dtype > 2 || a.num_ops < 0 ||
                     (a.num_ops > 0 && a.ops == NULL) || a.struct_size < sizeof a;
    size_t need[2] = {0, 0};
    bool skip = false;
    for (int i = 0; i < 2 && a.rows > 0; i++) {
        int64_t st = strides[i] == 0 ? row : strides[i];
        if (st < row) {
            must_fail = true;
            continue;
        }
        uint64_t e;
        if (__builtin_mul_overflow((uint64_t)(a.rows - 1), (uint64_t)st, &e) ||
            __builtin_add_overflow(e, (uint64_t)row, &e) ||
            __builtin_mul_overflow(e, (uint64_t)es, &e) || e > (uint64_t)PTRDIFF_MAX)
            must_fail = true; /* no tensor can be that long */
        else if (e > FS_CAP) skip = true;
        else need[i] = (size_t)e;
    }
    if (a.rows > 0 && nrows == 0) {
        /* more rows than the slot array the harness keeps */
        if (!must_fail) return;
    }
    if (skip && !must_fail) return;
    uint8_t *k = malloc(need[0] ? need[0] : 1);
    uint8_t *v = malloc(need[1] ? need[1] : 1);
    FZI_ASSERT(k && v);
    void *dk = NULL, *dv = NULL;
    float amax = 0.0f;
    float mag = (flags & 1) ? 100.0f : 1.0f;
    for (size_t i = 0; i < need[0] / es; i++) {
        float x = fs_put(a.dtype, k, i, (float)(int8_t)fzi_u8(c) / 64.0f * mag);
        if (fabsf(x) > amax) amax = fabsf(x);
    }
    for (size_t i = 0; i < need[1] / es; i++) {
        float x = fs_put(a.dtype, v, i, (float)(int8_t)fzi_u8(c) / 64.0f * mag);
        if (fabsf(x) > amax) amax = fabsf(x);
    }
    dk = fz_dev_mirror(k, need[0]);
    dv = fz_dev_mirror(v, need[1]);
    a.k = dk;
    a.v = dv;
    a.slots = nrows > 0 ? slots : NULL;
    if ((flags & 0x06) == 0x06 && a.rows > 0) {
        a.k = (flags & 1) ? NULL : a.k;
        a.v = (flags & 1) ? a.v : NULL;
        if (fzi_u8(c) & 1) a.slots = NULL;
        must_fail = true;
    }

    uint64_t nf_before = 0, nf_after = 0;
    FZI_ASSERT(kvp_store_nonfinite_count(w->s, &nf_before) == KVP_OK);
    fs_snapshot(w);
    int rc = kvp_store_append(w->s, &a);
    if (w->cpu != w->s) {
        kvp_append_params_t ha = a;
        ha.k = a.k ? k : NULL;
        ha.v = a.v ? v : NULL;
        FZI_ASSERT(kvp_store_append(w->cpu, &ha) == rc);
    }
    if (rc != KVP_OK) {
        fs_failed(w, rc);
        FZI_ASSERT(rc == KVP_EINVAL);
        goto out;
    }
    FZI_ASSERT(!must_fail);
    bool sealed = false;
    for (int32_t i = 0; i < a.num_ops; i++) sealed |= ops[i].kind == KVP_OP_SEAL;
    FZI_ASSERT(kvp_store_nonfinite_count(w->s, &nf_after) == KVP_OK);
    if (!sealed) FZI_ASSERT(nf_after == nf_before); /* every input was finite */

    /* read back every row with a slot of its own */
    int64_t kst = a.k_row_stride ? a.k_row_stride : row, vst = a.v_row_stride ? a.v_row_stride : row;
    static float rk[2 * 256], rv[2 * 256];
    for (int32_t r = 0; r < a.rows; r++) {
        int64_t slot = slots[r];
        if (slot < 0) continue;
        bool unique = true;
        for (int32_t q = 0; q < a.rows; q++)
            if (q != r && slots[q] == slot) unique = false;
        int32_t page = (int32_t)(slot / P), t = (int32_t)(slot % P);
        /* a page sealed twice in one call holds the last seal's tokens,
         * which may come from a staging page's earlier bytes */
        int seals = 0;
        for (int32_t i = 0; i < a.num_ops; i++)
            seals += ops[i].kind == KVP_OP_SEAL && ops[i].dst == page;
        if (seals > 1) continue;
        FZI_ASSERT(kvp_store_read(w->s, a.layer, page, t, 1, rk, rv) == KVP_OK);
        bool staging = page >= N;
        int32_t kf = staging ? KVP_FORMAT_FP16 : w->l.k_format;
        int32_t vf = staging ? KVP_FORMAT_FP16 : w->l.v_format;
        /* int4 values: rotated, so each element's bound comes from its row */
        const bool vrot = w->l.v_format == KVP_FORMAT_INT4;
        static float xrow[2 * 256];
        static double vtol[2 * 256];
        for (int64_t e = 0; e < row; e++) {
            float xk, xv;
            fs_input(&a, k, v, kst, vst, r, e, &xk, &xv);
            xrow[e] = xv;
        }
        if (vrot)
            for (int64_t h0 = 0; h0 < row; h0 += w->l.head_dim) {
                if (staging) fz_rot_bound_f16(xrow + h0, w->l.head_dim, vtol + h0);
                else fz_rot_bound(xrow + h0, w->l.head_dim, vtol + h0);
            }
        for (int64_t e = 0; e < row; e++) {
            FZI_ASSERT(isfinite(rk[e]) && isfinite(rv[e]));
            if (!unique) continue;
            float xk, xv;
            fs_input(&a, k, v, kst, vst, r, e, &xk, &xv);
            for (int side = 0; side < 2; side++) {
                int32_t f = side ? vf : kf;
                float x = side ? xv : xk, got = side ? rv[e] : rk[e];
                double tol;
                switch (f) {
                case KVP_FORMAT_FP32: tol = 0; break;
                case KVP_FORMAT_FP16: tol = side && vrot ? vtol[e] : fabsf(x) / 1024.0; break;
                case KVP_FORMAT_BF16: tol = fabsf(x) / 128.0; break;
                case KVP_FORMAT_INT8: tol = side ? amax / 100.0 : -1; break;
                case KVP_FORMAT_INT4_V1: tol = side ? amax / 6.0 : -1; break;
                case KVP_FORMAT_INT4: tol = side ? vtol[e] : -1; break;
                default: tol = -1; break; /* fp8: the scale may predate these rows */
                }
                if (tol >= 0) FZI_ASSERT(fabs((double)got - (double)x) <= tol + 1e-6);
            }
        }
    }
out:
    FZI_ASSERT(kvp_store_synchronize(w->s) == KVP_OK);
    fz_dev_release(dk, k);
    fz_dev_release(dv, v);
    free(k);
    free(v);
}

/* ---- apply_ops ---------------------------------------------------------- */

static int32_t fs_page_id(const fs_world *w, fzi_cursor *c) {
    uint8_t m = fzi_u8(c);
    if (m >= 232) return fzi_edgy_i32(c);
    return (int32_t)(m % (uint32_t)(w->N + w->S + 1)) - (m >= 200 ? 1 : 0);
}

static void fs_page_bytes(fs_world *w, int32_t page, uint8_t *dst) {
    uint64_t n = page < w->N ? w->l.page_bytes : w->l.staging_page_bytes;
    FZI_ASSERT(kvp_store_page_to_host(w->s, page, 0, dst, n) == KVP_OK);
    FZI_ASSERT(kvp_store_synchronize(w->s) == KVP_OK);
}

static void fs_apply(fs_world *w, fzi_cursor *c) {
    kvp_page_op_t ops[4];
    int32_t n = (int32_t)fzi_below(c, 5);
    for (int32_t i = 0; i < n; i++) {
        uint8_t m = fzi_u8(c);
        ops[i].kind = m < 240 ? (int32_t)(m % 4) : fzi_edgy_i32(c);
        ops[i].src = fs_page_id(w, c);
        ops[i].dst = fs_page_id(w, c);
        uint8_t cm = fzi_u8(c);
        ops[i].count = cm >= 240 ? fzi_edgy_i32(c) : (int32_t)(cm % (uint32_t)(w->P + 2)) - 1 + (cm & 1);
        ops[i].row = (int32_t)fzi_u8(c) - 1;
    }
    uint8_t how = fzi_u8(c);
    const kvp_page_op_t *arg = n > 0 || (how & 1) ? ops : NULL;
    int32_t num = n;
    if (how >= 250) num = -(int32_t)(how - 249);
    if (how >= 240 && how < 250 && n > 0) arg = NULL;
    uint8_t *before = malloc(w->max_page), *after = malloc(w->max_page);
    FZI_ASSERT(before && after);
    static float a0[2 * 4096], a1[2 * 4096], b0[4096], b1[4096];
    int32_t src = n == 1 ? ops[0].src : -1;
    bool src_ok = src >= 0 && src < w->N + w->S;
    if (src_ok) fs_page_bytes(w, src, before);
    if (src_ok && ops[0].kind == KVP_OP_UNSEAL && ops[0].count >= 1 && ops[0].count <= w->P)
        for (int32_t l = 0; l < w->L; l++)
            FZI_ASSERT(kvp_store_read(w->s, l, src, 0, ops[0].count, a0 + l * 4096, a1 + l * 4096) ==
                       KVP_OK);
    fs_snapshot(w);
    int rc = kvp_store_apply_ops(w->s, arg, num);
    if (w->cpu != w->s) FZI_ASSERT(kvp_store_apply_ops(w->cpu, arg, num) == rc);
    if (rc != KVP_OK) {
        fs_failed(w, rc);
        FZI_ASSERT(rc == KVP_EINVAL);
    } else {
        FZI_ASSERT(num >= 0 && (num == 0 || arg != NULL));
        for (int32_t i = 0; i < num; i++) {
            const kvp_page_op_t *op = &ops[i];
            FZI_ASSERT(op->kind >= KVP_OP_COPY && op->kind <= KVP_OP_UNSEAL);
            if (op->kind == KVP_OP_SEAL) continue;
            FZI_ASSERT(op->src >= 0 && op->src < w->N + w->S && op->dst >= 0 && op->dst < w->N + w->S);
            if (op->kind == KVP_OP_COPY) FZI_ASSERT((op->src < w->N) == (op->dst < w->N));
            if (op->kind == KVP_OP_UNSEAL)
                FZI_ASSERT(w->l.needs_staging && op->src < w->N && op->dst >= w->N &&
                           op->count >= 1 && op->count <= w->P);
        }
        if (n == 1 && num == 1 && ops[0].kind == KVP_OP_COPY) {
            fs_page_bytes(w, ops[0].dst, after);
            FZI_ASSERT(memcmp(before, after, ops[0].dst < w->N ? w->l.page_bytes
                                                               : w->l.staging_page_bytes) == 0);
        }
        if (n == 1 && num == 1 && ops[0].kind == KVP_OP_UNSEAL) {
            for (int32_t l = 0; l < w->L; l++) {
                FZI_ASSERT(kvp_store_read(w->s, l, ops[0].dst, 0, ops[0].count, b0, b1) == KVP_OK);
                size_t cnt = (size_t)ops[0].count * (size_t)(w->H * w->D);
                /* int4 values: the staging page holds fp16 of the rotated rows,
                 * so a read's error is bounded per row (finite rows whose
                 * rotated values stay in fp16's range) */
                const bool vrot = w->l.v_format == KVP_FORMAT_INT4;
                static double vtol[4096];
                static bool vskip[4096 / 8];
                if (vrot)
                    for (size_t r0 = 0; r0 < cnt; r0 += (size_t)w->D) {
                        const float *xr = a1 + l * 4096 + r0;
                        double sum = 0.0;
                        for (int32_t d = 0; d < w->D; d++) sum += isfinite(xr[d]) ? fabs((double)xr[d]) : INFINITY;
                        vskip[r0 / (size_t)w->D] = !(sum <= 65504.0);
                        fz_rot_bound_f16(xr, w->D, vtol + r0);
                    }
                for (size_t e = 0; e < cnt; e++)
                    for (int side = 0; side < 2; side++) {
                        float x = side ? a1[l * 4096 + e] : a0[l * 4096 + e];
                        float y = side ? b1[e] : b0[e];
                        if (side && vrot) {
                            if (!vskip[e / (size_t)w->D]) FZI_ASSERT(fabs((double)x - (double)y) <= vtol[e]);
                        } else if (isnan(x)) FZI_ASSERT(isnan(y));
                        else if (fabsf(x) <= 65504.0f)
                            FZI_ASSERT(fabsf(x - y) <= fabsf(x) / 1024.0f + 6e-8f);
                    }
            }
        }
    }
    free(before);
    free(after);
}

/* ---- read --------------------------------------------------------------- */

static void fs_read(fs_world *w, fzi_cursor *c) {
    int32_t layer = fs_small_or_edgy(c, w->L);
    int32_t page = fs_page_id(w, c);
    int32_t t0 = fs_small_or_edgy(c, w->P + 1);
    int32_t n = fs_small_or_edgy(c, w->P + 2);
    uint8_t how = fzi_u8(c);
    size_t cap = (size_t)w->P * (size_t)(w->H * w->D);
    float *k = malloc(cap * 4), *v = malloc(cap * 4);
    FZI_ASSERT(k && v);
    memset(k, FS_SENT, cap * 4);
    memset(v, FS_SENT, cap * 4);
    float *ka = how & 1 ? NULL : k, *va = how & 2 ? NULL : v;
    bool valid = layer >= 0 && layer < w->L && page >= 0 && page < w->N + w->S && t0 >= 0 &&
                 n >= 0 && (int64_t)t0 + n <= w->P && (ka != NULL || va != NULL);
    fs_snapshot(w);
    int rc = kvp_store_read(w->s, layer, page, t0, n, ka, va);
    if (rc != KVP_OK) {
        fs_failed(w, rc);
        FZI_ASSERT(!valid && fs_untouched(k, cap * 4) && fs_untouched(v, cap * 4));
    } else {
        FZI_ASSERT(valid && fs_unchanged(w));
        size_t used = (size_t)n * (size_t)(w->H * w->D) * 4;
        FZI_ASSERT(fs_untouched((uint8_t *)k + used, cap * 4 - used));
        FZI_ASSERT(fs_untouched((uint8_t *)v + used, cap * 4 - used));
    }
    free(k);
    free(v);
}

/* ---- page I/O ------------------------------------------------------------- */

static void fs_page_io(fs_world *w, fzi_cursor *c, int which) {
    int32_t page = fs_page_id(w, c);
    uint8_t m = fzi_u8(c);
    uint64_t offset = m < 128 ? (uint64_t)fzi_below(c, 64) * 16 : (uint64_t)fzi_edgy_i64(c);
    m = fzi_u8(c);
    uint64_t bytes = m < 64 ? w->max_page : m < 160 ? (uint64_t)fzi_u16(c) % (w->max_page + 1)
                                                  : (uint64_t)fzi_edgy_i64(c);
    uint8_t how = fzi_u8(c);
    bool valid_page = page >= 0 && page < w->N + w->S;
    uint64_t size = !valid_page ? 0 : page < w->N ? w->l.page_bytes : w->l.staging_page_bytes;
    bool valid = valid_page && offset <= size && bytes <= size - offset;
    uint8_t *buf = malloc(w->max_page);
    FZI_ASSERT(buf);
    uint8_t *arg = buf;
    if ((how & 7) == 7) {
        arg = NULL;
        if (bytes > 0) valid = false;
    }
    kvp_page_io_t io;
    memset(&io, 0, sizeof io);
    io.struct_size = sizeof io;
    bool via_io = how & 8;
    if (via_io) {
        FZI_ASSERT(kvp_store_page_io(w->s, &io) == KVP_OK);
        FZI_ASSERT(io.copy_to_host && io.copy_from_host);
    }
    fs_snapshot(w);
    if (which == 0) {
        memset(buf, FS_SENT, w->max_page);
        int rc = via_io ? io.copy_to_host(io.opaque, page, offset, arg, bytes)
                        : kvp_store_page_to_host(w->s, page, offset, arg, bytes);
        FZI_ASSERT(kvp_store_synchronize(w->s) == KVP_OK); /* buf is complete */
        if (rc != KVP_OK) {
            fs_failed(w, rc);
            FZI_ASSERT(!valid && rc == KVP_EINVAL && fs_untouched(buf, w->max_page));
        } else {
            FZI_ASSERT(valid && fs_unchanged(w));
            FZI_ASSERT(fs_untouched(buf + bytes, w->max_page - bytes));
        }
    } else {
        fzi_bytes(c, buf, w->max_page);
        int rc = via_io ? io.copy_from_host(io.opaque, page, offset, arg, bytes)
                        : kvp_store_page_from_host(w->s, page, offset, arg, bytes);
        if (w->cpu != w->s) FZI_ASSERT(kvp_store_page_from_host(w->cpu, page, offset, arg, bytes) == rc);
        FZI_ASSERT(kvp_store_synchronize(w->s) == KVP_OK); /* buf is read until then */
        if (rc != KVP_OK) {
            fs_failed(w, rc);
            FZI_ASSERT(!valid && rc == KVP_EINVAL);
        } else {
            FZI_ASSERT(valid);
            /* at most `bytes` bytes of the arena changed, and they read back */
            uint64_t diff = 0;
            const uint8_t *now = fs_arena_now(w);
            for (uint64_t i = 0; i < w->arena_bytes; i++) diff += w->snap[i] != now[i];
            FZI_ASSERT(diff <= bytes);
            if (bytes > 0) {
                uint8_t *back = malloc(bytes);
                FZI_ASSERT(back);
                FZI_ASSERT(kvp_store_page_to_host(w->s, page, offset, back, bytes) == KVP_OK);
                FZI_ASSERT(kvp_store_synchronize(w->s) == KVP_OK);
                FZI_ASSERT(memcmp(back, buf, bytes) == 0);
                free(back);
            }
        }
    }
    free(buf);
}

/* ---- inspection ------------------------------------------------------------ */

static void fs_inspect(fs_world *w, fzi_cursor *c) {
    uint8_t m = fzi_u8(c);
    fs_snapshot(w);
    if (m % 3 == 0) {
        kvp_region_t r;
        memset(&r, 0, sizeof r);
        r.struct_size = sizeof r;
        int32_t layer = fs_small_or_edgy(c, w->L), kind = fs_small_or_edgy(c, 5);
        int rc = kvp_store_region(w->s, layer, kind, &r);
        bool valid = layer >= 0 && layer < w->L && kind >= 0 && kind <= 3;
        if (rc != KVP_OK) {
            fs_failed(w, rc);
        } else {
            FZI_ASSERT(valid);
            /* every block lies inside the arena */
            if (r.base != NULL && r.pages > 0) {
                uint64_t first = (uint64_t)((uint8_t *)r.base - w->arena);
                uint64_t last = first + (r.pages - 1) * r.page_stride +
                                (uint64_t)(w->H - 1) * r.head_stride + r.block_bytes;
                FZI_ASSERT((uint8_t *)r.base >= w->arena && last <= w->arena_bytes);
            }
        }
    } else if (m % 3 == 1) {
        int32_t layer = fs_small_or_edgy(c, w->L), h = fs_small_or_edgy(c, w->H);
        int32_t side = fs_small_or_edgy(c, 2);
        static const float sc[] = {1.0f, 0.0f, -1.0f, NAN, INFINITY, 1e-30f, 3e38f, 0.5f};
        float s = sc[fzi_below(c, 8)];
        int rc = kvp_store_set_fp8_scale(w->s, layer, h, side, s);
        if (w->cpu != w->s) FZI_ASSERT(kvp_store_set_fp8_scale(w->cpu, layer, h, side, s) == rc);
        if (rc != KVP_OK) {
            fs_failed(w, rc);
        } else {
            FZI_ASSERT(isfinite(s) && s >= 0.0f);
            float got = -1.0f;
            FZI_ASSERT(kvp_store_get_fp8_scale(w->s, layer, h, side, &got) == KVP_OK && got == s);
        }
    } else {
        kvp_store_info_t info;
        memset(&info, 0, sizeof info);
        info.struct_size = (m & 8) ? 4 : sizeof info;
        int rc = kvp_store_info(w->s, &info);
        if (m & 8) FZI_ASSERT(rc == KVP_EINVAL);
        else FZI_ASSERT(rc == KVP_OK && info.arena == w->arena && info.arena_bytes == w->arena_bytes);
        FZI_ASSERT(fs_unchanged(w));
    }
}

/* ---- the input ---------------------------------------------------------------- */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fzi_cursor c = fzi_make(data, size);
    static const int32_t dims[] = {8, 16, 64, 128};
    static const int32_t psz[] = {1, 2, 4, 8, 16, 3};
    uint8_t b0 = fzi_u8(&c), b1 = fzi_u8(&c), b2 = fzi_u8(&c), b3 = fzi_u8(&c);
    kvp_store_params_t sp;
    kvp_store_params_init(&sp);
    sp.layers = 1 + (b0 & 1);
    sp.kv_heads = 1 + ((b0 >> 1) & 1);
    sp.head_dim = dims[(b0 >> 2) & 3];
    sp.page_size = psz[(b0 >> 4) % 6];
    sp.k_format = b1 % KVP_FORMAT_COUNT;
    sp.v_format = (b1 / KVP_FORMAT_COUNT) % KVP_FORMAT_COUNT;
    sp.k_order = (b1 >> 7) & 1;
    sp.num_pages = 1 + (b2 & 7);
    sp.num_staging = (b2 >> 3) & 3;
    fzi_alloc al = {-1, 0};
    if (b3 & 0x80) al.countdown = b3 & 7; /* fail that allocation of the creation */
    sp.allocator.alloc = fzi_malloc;
    sp.allocator.free = fzi_free;
    sp.allocator.opaque = &al;

    fs_world w;
    memset(&w, 0, sizeof w);
    char err[KVP_ERR_SIZE] = "";
    size_t dev_used = fz_dev_used();
    int rc = fz_store_create(&sp, &w.s, err, sizeof err);
    if (rc == KVP_ENOMEM) {
        FZI_ASSERT(w.s == NULL && al.live == 0 && err[0] != '\0' && fz_dev_used() == dev_used);
        al.countdown = -1;
        rc = fz_store_create(&sp, &w.s, err, sizeof err);
    }
    /* FZ_CUDA: the CPU twin, whose allocator never fails */
    fzi_alloc cal = {-1, 0};
    if (FZ_DEV) {
        kvp_store_params_t cp = sp;
        cp.allocator.opaque = &cal;
        FZI_ASSERT(kvp_store_create(&cp, &w.cpu, NULL, 0) == rc);
    } else {
        w.cpu = w.s;
    }
    if (rc != KVP_OK) {
        /* only documented rules reject these shapes */
        FZI_ASSERT(rc == KVP_EINVAL && w.s == NULL && al.live == 0 && err[0] != '\0');
        FZI_ASSERT(cal.live == 0 && fz_dev_used() == dev_used);
        kvp_layout_t l;
        memset(&l, 0, sizeof l);
        l.struct_size = sizeof l;
        int lrc = kvp_layout_compute(sp.layers, sp.kv_heads, sp.head_dim, sp.page_size,
                                     sp.k_format, sp.v_format, &l, NULL, 0);
        FZI_ASSERT(lrc != KVP_OK || (l.needs_staging && sp.num_staging == 0));
        return 0;
    }
    FZI_ASSERT(al.live > 0);
    w.l.struct_size = sizeof w.l;
    FZI_ASSERT(kvp_store_layout(w.s, &w.l) == KVP_OK);
    kvp_store_info_t info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    FZI_ASSERT(kvp_store_info(w.s, &info) == KVP_OK);
    w.N = info.num_pages;
    w.S = info.num_staging;
    FZI_ASSERT(w.N == (int32_t)sp.num_pages && (w.S > 0 || !w.l.needs_staging));
    w.P = sp.page_size;
    w.H = sp.kv_heads;
    w.D = sp.head_dim;
    w.L = sp.layers;
    w.arena = info.arena;
    w.arena_bytes = info.arena_bytes;
    w.max_page = w.l.page_bytes > w.l.staging_page_bytes ? w.l.page_bytes : w.l.staging_page_bytes;
    uint64_t ab = 0;
    FZI_ASSERT(kvp_arena_bytes(&w.l, sp.num_pages, sp.num_staging, &ab, NULL, 0) == KVP_OK &&
               ab == w.arena_bytes);
    w.snap = malloc(w.arena_bytes);
    FZI_ASSERT(w.snap);
    if (w.cpu != w.s) {
        /* the CUDA arena starts with the CPU twin's bytes */
        kvp_store_info_t ci;
        memset(&ci, 0, sizeof ci);
        ci.struct_size = sizeof ci;
        FZI_ASSERT(kvp_store_info(w.cpu, &ci) == KVP_OK && ci.arena_bytes == w.arena_bytes);
        w.cpu_arena = ci.arena;
        fz_dev_upload(w.arena, w.cpu_arena, w.arena_bytes);
        w.now = malloc(w.arena_bytes);
        FZI_ASSERT(w.now);
    }

    for (int i = 0; i < FS_OPS && c.n > 0; i++) {
        switch (fzi_u8(&c) % 7) {
        case 0:
        case 1: fs_append(&w, &c); break;
        case 2: fs_apply(&w, &c); break;
        case 3: fs_read(&w, &c); break;
        case 4: fs_page_io(&w, &c, 0); break;
        case 5: fs_page_io(&w, &c, 1); break;
        default: fs_inspect(&w, &c); break;
        }
        fs_same_arenas(&w);
    }
    free(w.snap);
    free(w.now);
    if (w.cpu != w.s) kvp_store_destroy(w.cpu);
    kvp_store_destroy(w.s);
    FZI_ASSERT(al.live == 0 && cal.live == 0 && fz_dev_used() == dev_used);
    return 0;
}
