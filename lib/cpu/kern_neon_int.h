/*
 * The NEON integer stages (int8/int4 keys and values), included twice by
 * kern_neon.c with:
 *   NI(name)                    the stage's name in this build (a suffix);
 *   NI_TGT                      its target attribute (empty, or +dotprod);
 *   NI_DOT(acc, a, b)           acc[i] += Σ_j a[4i+j] * b[4i+j] (int8 -> int32);
 *   NI_DOTL(acc, a, b, lane)    the same against b's 32-bit lane `lane`
 *                               (a constant) in every group.
 * No include guard: each inclusion defines a new set of functions.
 */

/* int8 keys, [D/4][P][4]: 16 bytes = 4 tokens x 4 channels. 8 tokens per
 * pass; per 16 channels, each row's qh and ql (16 channels each) in one
 * register, 4 channels taken by lane. The codes as c - 128 (an eor): the
 * integer sum is 128 Σ qh·c' + Σ ql·c' + qcorr, |.| < 2^31. */
NI_TGT static void NI(klogits_int8)(kvp__tile *t, const uint8_t *kb, const kvp__blockfmt *f,
                                    int t0, int n) {
    const int P = f->page_size, D = t->D;
    const uint8x16_t flip = vdupq_n_u8(0x80);
    uint8_t pad[KVP__ATTN_MAX_D / 4][32];
    for (int i0 = 0; i0 < n; i0 += 8) {
        const int w = n - i0 < 8 ? n - i0 : 8;
        const uint8_t *base = kb + (size_t)(t0 + i0) * 4;
        size_t row = (size_t)P * 4;
        if (w < 8) { /* a zero-padded copy: no call in the loop (see klogits_dm) */
            for (int j = 0; j < D / 4; j++) {
                memcpy(pad[j], base + (size_t)j * row, (size_t)w * 4);
                memset(pad[j] + w * 4, 0, 32 - (size_t)w * 4);
            }
            base = pad[0];
            row = 32;
        }
        int32x4_t ah[R][2], al[R][2];
        UNROLL for (int r = 0; r < R; r++) {
            ah[r][0] = ah[r][1] = vdupq_n_s32(0);
            al[r][0] = al[r][1] = vdupq_n_s32(t->qcorr[r]);
        }
        for (int d = 0; d < D; d += 16) {
            int8x16_t qh[R], ql[R];
            UNROLL for (int r = 0; r < R; r++) {
                qh[r] = vld1q_s8(&t->qh[r][d]);
                ql[r] = vld1q_s8(&t->ql[r][d]);
            }
#define K8QUAD(k)                                                                                  \
    do {                                                                                           \
        const uint8_t *p = base + (size_t)(d / 4 + (k)) * row;                                     \
        PREFETCH(p + t->pf_k);                                                                     \
        uint8x16_t b0 = vld1q_u8(p), b1 = vld1q_u8(p + 16);                                        \
        int8x16_t c0 = vreinterpretq_s8_u8(veorq_u8(b0, flip));                                    \
        int8x16_t c1 = vreinterpretq_s8_u8(veorq_u8(b1, flip));                                    \
        UNROLL for (int r = 0; r < R; r++) {                                                       \
            ah[r][0] = NI_DOTL(ah[r][0], c0, qh[r], k);                                            \
            ah[r][1] = NI_DOTL(ah[r][1], c1, qh[r], k);                                            \
            al[r][0] = NI_DOTL(al[r][0], c0, ql[r], k);                                            \
            al[r][1] = NI_DOTL(al[r][1], c1, ql[r], k);                                            \
        }                                                                                          \
    } while (0)
            K8QUAD(0);
            K8QUAD(1);
            K8QUAD(2);
            K8QUAD(3);
#undef K8QUAD
        }
        UNROLL for (int r = 0; r < R; r++) {
            const float32x4_t cst = vdupq_n_f32(t->qconst[r]);
            for (int j = 0; j < 2; j++) {
                int32x4_t s = vaddq_s32(vshlq_n_s32(ah[r][j], 7), al[r][j]);
                vst1q_f32(&t->logits[r][i0 + 4 * j], vfmaq_n_f32(cst, vcvtq_f32_s32(s), t->qstep[r]));
            }
        }
    }
}

/* int4 keys, [D/4][P/2][4], tokens 2i / 2i+1 in the low / high nibble:
 * 16 bytes hold 8 tokens x 4 channels; the low nibbles (even tokens) and
 * the high ones (odd) each make a vector of codes 0..15 for the dot
 * products against the 8-bit query. 16 tokens per pass. */
NI_TGT static void NI(klogits_int4)(kvp__tile *t, const uint8_t *kb, const kvp__blockfmt *f,
                                    int t0, int n) {
    const int P = f->page_size, D = t->D;
    const uint8x16_t low = vdupq_n_u8(0x0F);
    uint8_t pad[KVP__ATTN_MAX_D / 4][32];
    for (int i0 = 0; i0 < n; i0 += 16) {
        const int w = n - i0 < 16 ? n - i0 : 16, bytes = (w + 1) / 2 * 4;
        const uint8_t *base = kb + (size_t)((t0 + i0) / 2) * 4;
        size_t row = (size_t)(P / 2) * 4;
        if (w < 16) { /* a zero-padded copy: no call in the loop (see klogits_dm) */
            for (int j = 0; j < D / 4; j++) {
                memcpy(pad[j], base + (size_t)j * row, (size_t)bytes);
                memset(pad[j] + bytes, 0, 32 - (size_t)bytes);
            }
            base = pad[0];
            row = 32;
        }
        int32x4_t a[R][4]; /* tokens 0 2 4 6 | 1 3 5 7 | 8 10 12 14 | 9 11 13 15 */
        UNROLL for (int r = 0; r < R; r++) a[r][0] = a[r][1] = a[r][2] = a[r][3] = vdupq_n_s32(0);
        for (int d = 0; d < D; d += 16) {
            int8x16_t q[R];
            UNROLL for (int r = 0; r < R; r++) q[r] = vld1q_s8(&t->qh[r][d]);
#define K4QUAD(k)                                                                                  \
    do {                                                                                           \
        const uint8_t *p = base + (size_t)(d / 4 + (k)) * row;                                     \
        PREFETCH(p + t->pf_k);                                                                     \
        uint8x16_t b0 = vld1q_u8(p), b1 = vld1q_u8(p + 16);                                        \
        int8x16_t e0 = vreinterpretq_s8_u8(vandq_u8(b0, low));                                     \
        int8x16_t o0 = vreinterpretq_s8_u8(vshrq_n_u8(b0, 4));                                     \
        int8x16_t e1 = vreinterpretq_s8_u8(vandq_u8(b1, low));                                     \
        int8x16_t o1 = vreinterpretq_s8_u8(vshrq_n_u8(b1, 4));                                     \
        UNROLL for (int r = 0; r < R; r++) {                                                       \
            a[r][0] = NI_DOTL(a[r][0], e0, q[r], k);                                               \
            a[r][1] = NI_DOTL(a[r][1], o0, q[r], k);                                               \
            a[r][2] = NI_DOTL(a[r][2], e1, q[r], k);                                               \
            a[r][3] = NI_DOTL(a[r][3], o1, q[r], k);                                               \
        }                                                                                          \
    } while (0)
            K4QUAD(0);
            K4QUAD(1);
            K4QUAD(2);
            K4QUAD(3);
#undef K4QUAD
        }
        UNROLL for (int r = 0; r < R; r++) {
            const float32x4_t cst = vdupq_n_f32(t->qconst[r]);
            const float step = t->qstep[r];
            float *l = &t->logits[r][i0];
            vst1q_f32(l, vfmaq_n_f32(cst, vcvtq_f32_s32(vzip1q_s32(a[r][0], a[r][1])), step));
            vst1q_f32(l + 4, vfmaq_n_f32(cst, vcvtq_f32_s32(vzip2q_s32(a[r][0], a[r][1])), step));
            vst1q_f32(l + 8, vfmaq_n_f32(cst, vcvtq_f32_s32(vzip1q_s32(a[r][2], a[r][3])), step));
            vst1q_f32(l + 12, vfmaq_n_f32(cst, vcvtq_f32_s32(vzip2q_s32(a[r][2], a[r][3])), step));
        }
    }
    k4_outliers(t, kb, f, t0, n);
}

/* int8 values: token groups [D][4] (s8), one fp16 scale per token. 8
 * channels per pass (two 16-byte loads: channels x 4 tokens), dot products
 * against 4 tokens' weights taken by lane from a register that holds 16
 * tokens', two parts (hi, lo). nb blocks: 2 for a pair of full pages
 * (block b's token i at p[r][P*b + i], one bound and one output update
 * for both). */
NI_TGT static void NI(vacc_int8_body)(kvp__tile *t, const uint8_t *const *vbs,
                                      const ptrdiff_t *pfs, int nb, const kvp__blockfmt *f,
                                      int t0, int n) {
    const int D = t->D, P = f->page_size, n4 = n / 4 * 4, groups = n4 / 4;
    float s[3 * KVP__CHUNK] KVP__ALIGN64, step[R], smax = 0.0f;
    int8_t wh[R][3 * KVP__CHUNK] KVP__ALIGN64, wl[R][3 * KVP__CHUNK] KVP__ALIGN64;
    for (int bk = 0; bk < nb; bk++) { /* in order: a block's zeros past n4 are the next one's start */
        float mx = load_scales(vbs[bk] + kvp__block_data_bytes(f) + 2 * (size_t)t0, n4, s + P * bk);
        smax = mx > smax ? mx : smax;
    }
    for (int r = 0; r < R; r++)
        for (int bk = 0; bk < nb; bk++)
            step[r] = quantize_w14(t->p[r] + P * bk, s + P * bk, n4, t->pmax[r] * smax,
                                   wh[r] + P * bk, wl[r] + P * bk);
    for (int d = 0; d < D; d += 8) {
        int32x4_t ah[R][2], al[R][2];
        UNROLL for (int r = 0; r < R; r++) ah[r][0] = ah[r][1] = al[r][0] = al[r][1] = vdupq_n_s32(0);
        for (int bk = 0; bk < nb; bk++) {
            const uint8_t *base = vbs[bk] + (size_t)t0 * (size_t)D + (size_t)d * 4;
            for (int g0 = 0; g0 < groups; g0 += 4) {
                int8x16_t vh[R], vl[R];
                UNROLL for (int r = 0; r < R; r++) {
                    vh[r] = vld1q_s8(wh[r] + P * bk + 4 * g0);
                    vl[r] = vld1q_s8(wl[r] + P * bk + 4 * g0);
                }
#define V8GROUP(k)                                                                                 \
    do {                                                                                           \
        if (g0 + (k) < groups) {                                                                   \
            const uint8_t *p = base + (size_t)(g0 + (k)) * 4 * (size_t)D;                          \
            PREFETCH(p + pfs[bk]);                                                                 \
            int8x16_t c0 = vld1q_s8((const int8_t *)(const void *)p);                              \
            int8x16_t c1 = vld1q_s8((const int8_t *)(const void *)(p + 16));                       \
            UNROLL for (int r = 0; r < R; r++) {                                                   \
                ah[r][0] = NI_DOTL(ah[r][0], c0, vh[r], k);                                        \
                ah[r][1] = NI_DOTL(ah[r][1], c1, vh[r], k);                                        \
                al[r][0] = NI_DOTL(al[r][0], c0, vl[r], k);                                        \
                al[r][1] = NI_DOTL(al[r][1], c1, vl[r], k);                                        \
            }                                                                                      \
        }                                                                                          \
    } while (0)
                V8GROUP(0);
                V8GROUP(1);
                V8GROUP(2);
                V8GROUP(3);
#undef V8GROUP
            }
        }
        UNROLL for (int r = 0; r < R; r++) {
            float *o = t->o + (size_t)r * (size_t)D + (size_t)d;
            for (int j = 0; j < 2; j++) {
                int32x4_t sum = vaddq_s32(vshlq_n_s32(ah[r][j], 7), al[r][j]);
                vst1q_f32(o + 4 * j, vfmaq_n_f32(vld1q_f32(o + 4 * j), vcvtq_f32_s32(sum), step[r]));
            }
        }
    }
    if (n4 < n) kvp__vacc_tail(t, vbs[0], f, t0, n4, n);
}

/* int4 values: token groups of 4 tokens x 16 slots per 32-channel group
 * (slot j: channel j in the low nibble, j + width/2 in the high one),
 * asymmetric (scale, min) per token and group. Per 16-byte load (4 slots x
 * 4 tokens): the codes centred (c - 8), dot products against the 8-bit
 * weights shifted to signed (x - 128) by lane, and one against ones for
 * the codes' sum that puts the shift back (shared by the rows);
 * Σ p·(min + 8·scale) added per group. nb blocks as vacc_int8_body. */
NI_TGT static void NI(vacc_int4_body)(kvp__tile *t, const uint8_t *const *vbs,
                                      const ptrdiff_t *pfs, int nb, const kvp__blockfmt *f,
                                      int t0, int n) {
    const int D = t->D, P = f->page_size, G = kvp__v4_groups(D), n4 = n / 4 * 4, groups = n4 / 4;
    const uint8x16_t low = vdupq_n_u8(0x0F);
    const int8x16_t eight = vdupq_n_s8(8), ones = vdupq_n_s8(1);
    for (int g = 0; g < G; g++) {
        const int width = D - 32 * g < 32 ? D - 32 * g : 32, half = width / 2;
        float s[3 * KVP__CHUNK] KVP__ALIGN64, m[3 * KVP__CHUNK] KVP__ALIGN64;
        float step[R], mterm[R], smax = 0.0f;
        int8_t wq[R][3 * KVP__CHUNK] KVP__ALIGN64;
        for (int bk = 0; bk < nb; bk++) { /* in order, as vacc_int8_body */
            const uint8_t *sc = vbs[bk] + kvp__block_data_bytes(f), *mn = sc + 2 * (size_t)G * (size_t)P;
            float mx = load_scales(sc + 2 * ((size_t)g * (size_t)P + (size_t)t0), n4, s + P * bk);
            smax = mx > smax ? mx : smax;
            load_scales(mn + 2 * ((size_t)g * (size_t)P + (size_t)t0), n4, m + P * bk);
        }
        for (int r = 0; r < R; r++) {
            mterm[r] = 0.0f;
            for (int bk = 0; bk < nb; bk++) {
                step[r] = quantize_w8(t->p[r] + P * bk, s + P * bk, n4, t->pmax[r] * smax, wq[r] + P * bk);
                mterm[r] += mid_term(t->p[r] + P * bk, s + P * bk, m + P * bk, n4);
            }
        }
        for (int c = 0; c < half; c += 4) { /* slots c..c+3: channels c.. (low), half+c.. (high) */
            int32x4_t a[R][2], cs[2] = {vdupq_n_s32(0), vdupq_n_s32(0)};
            UNROLL for (int r = 0; r < R; r++) a[r][0] = a[r][1] = vdupq_n_s32(0);
            for (int bk = 0; bk < nb; bk++) {
                const uint8_t *gb = vbs[bk] + (size_t)t0 * (size_t)D / 2 + (size_t)g * 64 + (size_t)c * 4;
                for (int g0 = 0; g0 < groups; g0 += 4) {
                    int8x16_t wv[R];
                    UNROLL for (int r = 0; r < R; r++) wv[r] = vld1q_s8(wq[r] + P * bk + 4 * g0);
#define V4GROUP(k)                                                                                 \
    do {                                                                                           \
        if (g0 + (k) < groups) {                                                                   \
            const uint8_t *p = gb + (size_t)(g0 + (k)) * 2 * (size_t)D;                            \
            PREFETCH(p + pfs[bk]);                                                                 \
            uint8x16_t b = vld1q_u8(p);                                                            \
            int8x16_t lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(b, low)), eight);                 \
            int8x16_t hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(b, 4)), eight);                 \
            cs[0] = NI_DOT(cs[0], lo, ones);                                                       \
            cs[1] = NI_DOT(cs[1], hi, ones);                                                       \
            UNROLL for (int r = 0; r < R; r++) {                                                   \
                a[r][0] = NI_DOTL(a[r][0], lo, wv[r], k);                                          \
                a[r][1] = NI_DOTL(a[r][1], hi, wv[r], k);                                          \
            }                                                                                      \
        }                                                                                          \
    } while (0)
                    V4GROUP(0);
                    V4GROUP(1);
                    V4GROUP(2);
                    V4GROUP(3);
#undef V4GROUP
                }
            }
            const int32x4_t c0 = vshlq_n_s32(cs[0], 7), c1 = vshlq_n_s32(cs[1], 7);
            UNROLL for (int r = 0; r < R; r++) {
                float *o = t->o + (size_t)r * (size_t)D + (size_t)(32 * g);
                const float32x4_t mt = vdupq_n_f32(mterm[r]);
                float32x4_t v0 = vfmaq_n_f32(vld1q_f32(o + c), vcvtq_f32_s32(vaddq_s32(a[r][0], c0)), step[r]);
                float32x4_t v1 = vfmaq_n_f32(vld1q_f32(o + half + c), vcvtq_f32_s32(vaddq_s32(a[r][1], c1)), step[r]);
                vst1q_f32(o + c, vaddq_f32(v0, mt));
                vst1q_f32(o + half + c, vaddq_f32(v1, mt));
            }
        }
    }
    if (n4 < n) kvp__vacc_tail(t, vbs[0], f, t0, n4, n);
}

/* The one-block and two-block (pair) entry points of the integer V stages. */
#define NI_V_STAGES(fmt)                                                                           \
    NI_TGT static void NI(vacc_##fmt)(kvp__tile *t, const uint8_t *vb, const kvp__blockfmt *f,     \
                                      int t0, int n) {                                             \
        const uint8_t *vbs[1] = {vb};                                                              \
        const ptrdiff_t pfs[1] = {t->pf_v};                                                        \
        NI(vacc_##fmt##_body)(t, vbs, pfs, 1, f, t0, n);                                           \
    }                                                                                              \
    NI_TGT static void NI(vacc2_##fmt)(kvp__tile *t, const uint8_t *vb0, const uint8_t *vb1,       \
                                       ptrdiff_t pf1, const kvp__blockfmt *f) {                    \
        const uint8_t *vbs[2] = {vb0, vb1};                                                        \
        const ptrdiff_t pfs[2] = {t->pf_v, pf1};                                                   \
        NI(vacc_##fmt##_body)(t, vbs, pfs, 2, f, 0, f->page_size);                                 \
    }
NI_V_STAGES(int8)
NI_V_STAGES(int4)
#undef NI_V_STAGES
