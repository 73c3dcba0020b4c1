/*
 * Portable kernel stages (plain C): the reference the SIMD paths are tested
 * against. Each token's K or V vector is decoded as it is used (fused; no
 * page-sized temporary) and accumulated in fp32 with exact float arithmetic
 * (no integer approximation of q or p).
 */
#include "cpu.h"

#include <string.h>

/* A chunk's tokens (n <= KVP__CHUNK) decoded at once: the block's scales
 * are converted once per chunk, not once per element (kvp__block_decode). */
static void klogits_portable(kvp__tile *t, const uint8_t *kb, const kvp__blockfmt *f, int t0,
                             int n) {
    float k[KVP__CHUNK][KVP__ATTN_MAX_D];
    for (int c0 = 0; c0 < n; c0 += KVP__CHUNK) {
        int m = n - c0 < KVP__CHUNK ? n - c0 : KVP__CHUNK;
        kvp__block_decode(f, kb, t0 + c0, m, &k[0][0], KVP__ATTN_MAX_D, t->fp8_k);
        for (int i = 0; i < m; i++)
            for (int r = 0; r < KVP__TILE_ROWS; r++) {
                float acc = 0.0f;
                for (int d = 0; d < t->D; d++) acc += t->q[r][d] * k[i][d];
                t->logits[r][c0 + i] = acc;
            }
    }
}

static void softmax_portable(kvp__tile *t, int n, int32_t pos0) {
    for (int r = 0; r < KVP__TILE_ROWS; r++) {
        float cm = -INFINITY;
        for (int i = 0; i < n; i++) {
            float x = t->logits[r][i];
            if (t->soft_cap > 0.0f) x = t->soft_cap * tanhf(x / t->soft_cap);
            int32_t pos = pos0 + i;
            if (pos < t->lo[r] || pos > t->hi[r]) x = -INFINITY;
            t->logits[r][i] = x;
            if (x > cm) cm = x;
        }
        float m_new = t->m[r] > cm ? t->m[r] : cm;
        if (m_new == -INFINITY) {
            memset(t->p[r], 0, sizeof t->p[r]);
            t->pmax[r] = 0.0f;
            continue;
        }
        float alpha = t->m[r] == m_new ? 1.0f : expf(t->m[r] - m_new); /* 0 when m was -inf */
        t->pmax[r] = cm == m_new ? 1.0f : expf(cm - m_new);
        float *o = t->o + (size_t)r * (size_t)t->D;
        if (alpha != 1.0f)
            for (int d = 0; d < t->D; d++) o[d] *= alpha;
        float l = t->l[r] * alpha;
        for (int i = 0; i < n; i++) {
            float p = expf(t->logits[r][i] - m_new);
            t->p[r][i] = p;
            l += p;
        }
        t->l[r] = l;
        t->m[r] = m_new;
    }
}

static void vacc_portable(kvp__tile *t, const uint8_t *vb, const kvp__blockfmt *f, int t0,
                          int n) {
    float v[KVP__CHUNK][KVP__ATTN_MAX_D];
    for (int c0 = 0; c0 < n; c0 += KVP__CHUNK) {
        int m = n - c0 < KVP__CHUNK ? n - c0 : KVP__CHUNK;
        kvp__block_decode(f, vb, t0 + c0, m, &v[0][0], KVP__ATTN_MAX_D, t->fp8_v);
        for (int i = 0; i < m; i++)
            for (int r = 0; r < KVP__TILE_ROWS; r++) {
                float p = t->p[r][c0 + i];
                if (p == 0.0f) continue;
                float *o = t->o + (size_t)r * (size_t)t->D;
                for (int d = 0; d < t->D; d++) o[d] += p * v[i][d];
            }
    }
}

/* ---- prefill blocks ------------------------------------------------------------------------ */

static void pf_kdec_portable(const uint8_t *kb, const kvp__blockfmt *f, int t0, int n,
                             float fp8_scale, float *kc) {
    float row[KVP__ATTN_MAX_D];
    for (int i = 0; i < n; i++) {
        kvp__block_decode(f, kb, t0 + i, 1, row, (size_t)f->head_dim, fp8_scale);
        for (int d = 0; d < f->head_dim; d++) kc[(size_t)d * KVP__PF_CHUNK + (size_t)i] = row[d];
    }
}

static void pf_vdec_portable(const uint8_t *vb, const kvp__blockfmt *f, int t0, int n,
                             float fp8_scale, float *vc) {
    kvp__block_decode(f, vb, t0, n, vc, KVP__ATTN_MAX_D, fp8_scale);
}

static void pf_block_portable(kvp__pblock *b, int r0, int32_t pos0, int n, int masked) {
    const int D = b->D, C = KVP__PF_CHUNK;
    for (int r = r0; r < r0 + KVP__PF_BLOCK; r++) {
        float *s = b->s[r];
        for (int i = 0; i < C; i++) s[i] = 0.0f;
        for (int d = 0; d < D; d++) {
            const float q = b->q[r][d], *k = b->kc[d];
            for (int i = 0; i < C; i++) s[i] += q * k[i];
        }
        float cm = -INFINITY;
        for (int i = 0; i < C; i++) {
            int32_t pos = pos0 + i;
            if (masked && (i >= n || pos < b->lo[r] || pos > b->hi[r])) s[i] = -INFINITY;
            if (s[i] > cm) cm = s[i];
        }
        float m_new = b->m[r] > cm ? b->m[r] : cm;
        if (m_new == -INFINITY) continue; /* nothing visible yet: o, l stay 0 */
        float alpha = b->m[r] == m_new ? 1.0f : expf(b->m[r] - m_new);
        float *o = b->o + (size_t)r * (size_t)D;
        if (alpha != 1.0f)
            for (int d = 0; d < D; d++) o[d] *= alpha;
        float l = b->l[r] * alpha;
        for (int i = 0; i < 16; i++) b->lv[r][i] *= alpha;
        for (int i = 0; i < C; i++) {
            float p = expf(s[i] - m_new);
            s[i] = p;
            l += p;
        }
        b->l[r] = l;
        b->m[r] = m_new;
        for (int i = 0; i < C; i++) {
            if (s[i] == 0.0f) continue;
            const float p = s[i], *v = b->vc[i];
            for (int d = 0; d < D; d++) o[d] += p * v[d];
        }
    }
}

const kvp__kernels kvp__kernels_portable = {
    "portable",
    {NULL, NULL, NULL, NULL, NULL, NULL},
    {{klogits_portable, klogits_portable},
     {klogits_portable, klogits_portable},
     {klogits_portable, klogits_portable},
     {klogits_portable, klogits_portable},
     {klogits_portable, klogits_portable},
     {klogits_portable, klogits_portable}},
    softmax_portable,
    {vacc_portable, vacc_portable, vacc_portable, vacc_portable, vacc_portable, vacc_portable},
    {NULL, NULL, NULL, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL, NULL},
    pf_block_portable,
    (1u << KVP_FORMAT_COUNT) - 1u, /* every format: decoded once per item, not per tile */
    (1u << KVP_FORMAT_COUNT) - 1u,
    {{pf_kdec_portable, pf_kdec_portable},
     {pf_kdec_portable, pf_kdec_portable},
     {pf_kdec_portable, pf_kdec_portable},
     {pf_kdec_portable, pf_kdec_portable},
     {pf_kdec_portable, pf_kdec_portable},
     {pf_kdec_portable, pf_kdec_portable}},
    {pf_vdec_portable, pf_vdec_portable, pf_vdec_portable, pf_vdec_portable, pf_vdec_portable,
     pf_vdec_portable},
    0,
    {NULL, NULL, NULL, NULL},
    NULL,
    NULL,
    NULL,
    NULL,
    NULL,
};

/* ---- helpers shared by the SIMD paths ----------------------------------------------------- */


/* Fold a page's per-channel key scales into q and quantize it for integer
 * dot products (the AVX2 path; AVX-512 has its own copy of this):
 *   q.k = sum q*m + sum (q*s) * code,  q*s ~= step * (128*qh + ql),
 * 15 bits, since q*s inherits the outlier channels' 10x scales and an 8-bit
 * q would cost more accuracy than the keys' own quantization. */
void kvp__qprep_int(kvp__tile *t, const uint8_t *kb, const kvp__blockfmt *f) {
    int D = t->D;
    const uint8_t *sc = kb + kvp__block_data_bytes(f), *mn = sc + 2 * (size_t)D;
    float s[KVP__ATTN_MAX_D], m[KVP__ATTN_MAX_D];
    for (int d = 0; d < D; d++) {
        uint16_t a, b;
        memcpy(&a, sc + 2 * (size_t)d, 2);
        memcpy(&b, mn + 2 * (size_t)d, 2);
        s[d] = kvp__f16_to_f32(a);
        m[d] = kvp__f16_to_f32(b);
    }
    for (int r = 0; r < KVP__TILE_ROWS; r++) {
        float amax = 0.0f, cst = 0.0f;
        for (int d = 0; d < D; d++) {
            float qf = t->q[r][d] * s[d];
            t->qf[r][d] = qf;
            cst += t->q[r][d] * m[d];
            if (fabsf(qf) > amax) amax = fabsf(qf);
        }
        float step = amax / 16256.0f, inv = kvp__inv_or_zero(1.0f, step);
        for (int d = 0; d < D; d++) { /* x = 128*hi + lo, hi = (x + 64) >> 7, lo in -64..63 */
            float x = kvp__rne(t->qf[r][d] * inv);
            float hi = floorf((x + 64.0f) * (1.0f / 128.0f));
            t->qh[r][d] = (int8_t)hi;
            t->ql[r][d] = (int8_t)(x - 128.0f * hi);
        }
        t->qstep[r] = step;
        t->qconst[r] = cst; /* with 15 bits the rounding residual is fp32 noise */
    }
}

/* Per outlier channel j and tile row r: a[r][j] = q[r][idx_j] * scale_j and
 * the constant sum_j q[r][idx_j] * min_j. Returns the count. (The SIMD
 * preps do this once per page in kvp__k4_outlier_prep, with F16C.) */
static int k4_outlier_fold(const kvp__tile *t, const kvp__k4_outl *o, float a[][KVP__K4_MAX_OUTLIERS],
                           float *cst) {
    for (int r = 0; r < KVP__TILE_ROWS; r++) {
        float c = 0.0f;
        for (int j = 0; j < o->count; j++) {
            uint16_t d, s16, m16;
            memcpy(&d, o->table + 2 * (size_t)j, 2);
            memcpy(&s16, o->table + 2 * (size_t)(o->count + j), 2);
            memcpy(&m16, o->table + 2 * (size_t)(2 * o->count + j), 2);
            float q = kvp__k4_outlier_q(t, r, d);
            a[r][j] = q * kvp__f16_to_f32(s16);
            c += q * kvp__f16_to_f32(m16);
        }
        cst[r] = c;
    }
    return o->count;
}

void kvp__k4_outlier_logits(kvp__tile *t, const uint8_t *kb, const kvp__blockfmt *f, int t0,
                            int n) {
    kvp__k4_outl o = kvp__k4_outliers_of(kb, f);
    float a[KVP__TILE_ROWS][KVP__K4_MAX_OUTLIERS], cst[KVP__TILE_ROWS];
    k4_outlier_fold(t, &o, a, cst);
    for (int r = 0; r < KVP__TILE_ROWS; r++)
        for (int i = 0; i < n; i++) {
            float acc = cst[r];
            for (int j = 0; j < o.count; j++)
                acc += a[r][j] * (float)o.codes[kvp__k4_code_offset(f->format, f->page_size, j, t0 + i)];
            t->logits[r][i] += acc;
        }
}

/* The integer V stages' tokens [i0, n) of a trailing partial token group
 * (page sizes not a multiple of 4), element by element. */
void kvp__vacc_tail(kvp__tile *t, const uint8_t *vb, const kvp__blockfmt *f, int t0, int i0, int n) {
    for (int i = i0; i < n; i++)
        for (int r = 0; r < KVP__TILE_ROWS; r++) {
            float pr = t->p[r][i];
            if (pr == 0.0f) continue;
            float *o = t->o + (size_t)r * (size_t)t->D;
            for (int d = 0; d < t->D; d++) o[d] += pr * kvp__block_decode_one(f, vb, t0 + i, d, 0.0f);
        }
}

/* ---- stage lookup --------------------------------------------------------------------------- */

/* The tables' entry of a format: both int4 formats have one layout and the
 * same kernels (the int8 key channels' count is in the block format; the
 * rotated values' basis is undone on the output rows). */
static int32_t entry_of(int32_t format) {
    return format == KVP_FORMAT_INT4 ? KVP_FORMAT_INT4_V1 : format;
}

static const kvp__kernels *table_of(int32_t isa) {
    switch (isa) {
    case KVP_ISA_AVX512: return &kvp__kernels_avx512;
    case KVP_ISA_AVX512_BF16: return &kvp__kernels_avx512_bf16;
    case KVP_ISA_AVX2: return &kvp__kernels_avx2;
    case KVP_ISA_NEON: return &kvp__kernels_neon;
    case KVP_ISA_NEON_DOTPROD: return &kvp__kernels_neon_dotprod;
    default: return &kvp__kernels_portable;
    }
}

kvp__kprep_fn kvp__pick_kprep(int32_t isa, int32_t format) {
    const kvp__kernels *k = table_of(isa);
    format = entry_of(format);
    /* a SIMD klogits that needs a prep has it in the same table */
    return k->klogits[format][0] != NULL || k->klogits[format][1] != NULL ? k->kprep[format]
                                                                          : NULL;
}

kvp__klogits_fn kvp__pick_klogits(int32_t isa, int32_t format, int dim_major) {
    format = entry_of(format);
    kvp__klogits_fn f = table_of(isa)->klogits[format][dim_major ? 1 : 0];
    return f != NULL ? f : kvp__kernels_portable.klogits[format][dim_major ? 1 : 0];
}

kvp__softmax_fn kvp__pick_softmax(int32_t isa) {
    kvp__softmax_fn f = table_of(isa)->softmax;
    return f != NULL ? f : kvp__kernels_portable.softmax;
}

kvp__vacc_fn kvp__pick_vacc(int32_t isa, int32_t format) {
    format = entry_of(format);
    kvp__vacc_fn f = table_of(isa)->vacc[format];
    return f != NULL ? f : kvp__kernels_portable.vacc[format];
}

kvp__vacc2_fn kvp__pick_vacc2(int32_t isa, int32_t format) {
    /* the ISA's own only: its softmax takes the pair's 2 * P tokens */
    return table_of(isa)->vacc2[entry_of(format)];
}

kvp__vacc4_fn kvp__pick_vacc4(int32_t isa, int32_t format) {
    return table_of(isa)->vacc4[entry_of(format)]; /* as vacc2: 4 * P tokens */
}

kvp__pf_block_fn kvp__pick_pf_block(int32_t isa, int32_t k_format, int32_t v_format,
                                    int32_t page_size, int *kbf, int *vbf) {
    const kvp__kernels *k = table_of(isa); /* the ISA's own, or its tiles take every item */
    k_format = entry_of(k_format);
    v_format = entry_of(v_format);
    uint32_t m = page_size < KVP__PF_CHUNK ? k->pf_formats_small : k->pf_formats;
    *kbf = (int)(k->pf_bf16 >> k_format & 1u);
    *vbf = (int)(k->pf_bf16 >> v_format & 1u);
    if (!(m >> k_format & 1u) || !(m >> v_format & 1u)) {
        *kbf = *vbf = 0;
        return NULL;
    }
    return *kbf || *vbf ? k->pf_block_bf16[*kbf | *vbf << 1] : k->pf_block;
}

kvp__pf_block_fn kvp__pick_pf_int8(int32_t isa, int32_t k_format, int32_t v_format,
                                   int32_t page_size, kvp__pf_int8_rows_fn *rows,
                                   kvp__pf_int8_chunk_fn *chunk) {
    const kvp__kernels *k = table_of(isa);
    bool ok = k->pf_int8_block != NULL && k_format == KVP_FORMAT_INT8 &&
              v_format == KVP_FORMAT_INT8 && page_size % 16 == 0;
    *rows = ok ? k->pf_int8_rows : NULL;
    *chunk = ok ? k->pf_int8_chunk : NULL;
    return ok ? k->pf_int8_block : NULL;
}

void kvp__pick_pf_pack(int32_t isa, kvp__pf_qpack_fn *qpack, kvp__pf_kvpack_fn *kvpack) {
    *qpack = table_of(isa)->pf_qpack;
    *kvpack = table_of(isa)->pf_kvpack;
}

kvp__pf_kdec_fn kvp__pick_pf_kdec(int32_t isa, int32_t format, int dim_major) {
    format = entry_of(format);
    kvp__pf_kdec_fn f = table_of(isa)->pf_kdec[format][dim_major ? 1 : 0];
    return f != NULL ? f : kvp__kernels_portable.pf_kdec[format][dim_major ? 1 : 0];
}

kvp__pf_vdec_fn kvp__pick_pf_vdec(int32_t isa, int32_t format) {
    format = entry_of(format);
    kvp__pf_vdec_fn f = table_of(isa)->pf_vdec[format];
    return f != NULL ? f : kvp__kernels_portable.pf_vdec[format];
}
