/*
 * Quantization experiments: the contiguous fp32 cache, with every K/V row
 * rounded the way a paged cache with int8/int4 keys stores it, in schemes
 * libkvpage may or may not have. It answers "what would scheme X do to the
 * model's perplexity?" before anyone writes its kernels.
 *
 * What it reproduces of libkvpage (docs/formats.md): with int8/int4 keys a
 * sequence's partly filled page is held in fp16 (the staging page), and a
 * page is quantized when it fills — keys asymmetric per channel over the
 * page's tokens (int4 keys: the head_dim / 32 channels of widest range in
 * int8), int8 values symmetric per token, int4 values asymmetric per
 * token in groups of 32 channels, scales and minimums rounded to fp16,
 * codes rounded to nearest even. Without int keys, values are quantized as
 * they are written (no staging), as libkvpage does. One simplification:
 * every row is rounded to fp16 before its page is quantized, where the
 * library quantizes rows written in the step that fills the page from their
 * fp32 values (a difference far below the formats' own). What it does not: the
 * library's integer dot products (their added error is ~1% of the format's,
 * docs/formats.md) — attention here is the contiguous cache's fp32 code
 * over the dequantized values.
 *
 * Key schemes beyond libkvpage's:
 *   int4wN  int4 keys whose N channels of widest range (max - min over the
 *           page) in each (page, kv head) are kept as int8 (the outlier
 *           channels KIVI and KVQuant describe: their range sets a coarse
 *           step). libkvpage's int4 keys are int4wN with N = head_dim / 32
 *           (plain `int4` here); int4w0 is int4 without them;
 *   int4sN  int4, but the sequence's first N tokens stay fp16 and are left
 *           out of their page's ranges (the attention-sink tokens).
 *   ...h    (a suffix, keys or values: int4h, int4hw2, int8h) quantized in
 *           a rotated basis: each head's vector times a fixed randomized
 *           Hadamard matrix (sign flips, then the fast Walsh-Hadamard
 *           transform, scaled by 1/sqrt(head_dim); orthogonal, so q.k and
 *           p.v keep their values), quantized there and rotated back. It
 *           spreads outlier channels over all of them. int4h keys keep no
 *           int8 channels (int4hwN: N of them). head_dim a power of two.
 * Value schemes: int4 values may be symmetric (int4sym: codes -7..7, one
 * fp16 scale a group) and take N channels a group (int4g16; 32 by default).
 * A spec may end in +rN: the sequence's last N tokens stay fp16 (a
 * full-precision recent window, KIVI's residual): a page is quantized once
 * N tokens have come after it, not when it fills.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv.h"
#include "quant.h"

enum { FMT_FP16, FMT_INT8, FMT_INT4 };

typedef struct {
    kv_cache_t base;
    kv_cache_t *inner; /* the contiguous cache holding the (rounded) values */
    int kf, vf;        /* FMT_* of keys and values */
    int wide, sink;    /* int4wN, int4sN */
    int krot, vrot;    /* ...h: keys / values quantized in the rotated basis */
    int vgroup, vsym;  /* int4 values: channels per group (gN), symmetric (sym) */
    int32_t window;    /* +rN: the last N tokens stay fp16 */
    float *signs;      /* [head_dim] the rotation's sign flips (+1 / -1) */
    int32_t page;
    int32_t rows, cap;
    int32_t *row_seq, *row_pos;
    float *range;      /* [head_dim] scratch */
    int *taken;        /* [head_dim] scratch: 1 = kept as int8 */
    char name[64];
} sim_kv;

static sim_kv *as_sim(kv_cache_t *kv) { return (sim_kv *)(void *)kv; }
static const sim_kv *as_sim_c(const kv_cache_t *kv) { return (const sim_kv *)(const void *)kv; }

static float f16r(float x) { return fp16_to_fp32(fp32_to_fp16(x)); }

/* Asymmetric codes 0..levels over n elements `stride` apart (finite ones
 * set the range), as libkvpage's int8/int4 keys and int4 values. */
static void quant_asym(float *x, int n, long stride, int levels) {
    float lo = INFINITY, hi = -INFINITY;
    for (int i = 0; i < n; i++)
        if (isfinite(x[i * stride])) lo = fminf(lo, x[i * stride]), hi = fmaxf(hi, x[i * stride]);
    if (lo > hi) lo = hi = 0;
    float s = f16r((hi - lo) / (float)levels), m = f16r(lo), inv = s > 0 ? 1 / s : 0;
    for (int i = 0; i < n; i++) {
        float c = nearbyintf((x[i * stride] - m) * inv);
        c = c < 0 ? 0 : c > (float)levels ? (float)levels : c;
        x[i * stride] = fmaf(s, c, m);
    }
}

/* Symmetric codes -levels..levels over n elements (int4 values' sym). */
static void quant_sym(float *x, int n, int levels) {
    float amax = 0;
    for (int i = 0; i < n; i++)
        if (isfinite(x[i])) amax = fmaxf(amax, fabsf(x[i]));
    float s = f16r(amax / (float)levels), inv = s > 0 ? 1 / s : 0;
    for (int i = 0; i < n; i++) {
        float c = nearbyintf(x[i] * inv);
        x[i] = s * (float)(int)(c < -levels ? -levels : c > levels ? levels : c);
    }
}

/* int8 values: symmetric per (token, head). */
static void quant_sym8(float *x, int n) {
    float amax = 0;
    for (int i = 0; i < n; i++)
        if (isfinite(x[i])) amax = fmaxf(amax, fabsf(x[i]));
    float s = f16r(amax / 127), inv = s > 0 ? 1 / s : 0;
    for (int i = 0; i < n; i++) {
        float c = nearbyintf(x[i] * inv); /* an integer code: no -0 */
        x[i] = s * (float)(int)(c < -127 ? -127 : c > 127 ? 127 : c);
    }
}

static void round_f16(float *x, long n) {
    for (long i = 0; i < n; i++) x[i] = f16r(x[i]);
}

/* In-place fast Walsh-Hadamard transform of n (a power of two) floats
 * `stride` apart, scaled by 1/sqrt(n): orthogonal and its own inverse. */
static void fwht(float *x, int n, long stride) {
    for (int len = 1; len < n; len *= 2)
        for (int i = 0; i < n; i += 2 * len)
            for (int j = i; j < i + len; j++) {
                float a = x[j * stride], b = x[(j + len) * stride];
                x[j * stride] = a + b;
                x[(j + len) * stride] = a - b;
            }
    float k = 1.0f / sqrtf((float)n);
    for (int i = 0; i < n; i++) x[i * stride] *= k;
}

/* The rotation R = H.S / sqrt(n) (S: sign flips) and its inverse S.H / sqrt(n). */
static void rotate(const sim_kv *s, float *x, int n, long stride) {
    for (int i = 0; i < n; i++) x[i * stride] *= s->signs[i];
    fwht(x, n, stride);
}
static void unrotate(const sim_kv *s, float *x, int n, long stride) {
    fwht(x, n, stride);
    for (int i = 0; i < n; i++) x[i * stride] *= s->signs[i];
}

/* One token's values of one head, in the value format. */
static void quant_value(const sim_kv *s, float *v, int hd) {
    if (s->vrot && s->vf != FMT_FP16) rotate(s, v, hd, 1);
    if (s->vf == FMT_INT8) quant_sym8(v, hd);
    else if (s->vf == FMT_INT4)
        for (int g = 0; g < hd; g += s->vgroup) {
            const int w = hd - g < s->vgroup ? hd - g : s->vgroup;
            if (s->vsym) quant_sym(v + g, w, 7);
            else quant_asym(v + g, w, 1, 15);
        }
    else round_f16(v, hd);
    if (s->vrot && s->vf != FMT_FP16) unrotate(s, v, hd, 1);
}


/* Keys of one (page, head): P tokens `stride` floats apart, per channel. */
static void quant_key_page_basis(sim_kv *s, float *k, int32_t first_pos, long stride, int hd);

static void quant_key_page(sim_kv *s, float *k, int32_t first_pos, long stride, int hd) {
    if (!s->krot) {
        quant_key_page_basis(s, k, first_pos, stride, hd);
        return;
    }
    for (int32_t t = 0; t < s->page; t++)
        if (first_pos + t >= s->sink) rotate(s, k + t * stride, hd, 1);
    quant_key_page_basis(s, k, first_pos, stride, hd);
    for (int32_t t = 0; t < s->page; t++)
        if (first_pos + t >= s->sink) unrotate(s, k + t * stride, hd, 1);
}

/* Keys of one (page, head) in the basis they are in. */
static void quant_key_page_basis(sim_kv *s, float *k, int32_t first_pos, long stride, int hd) {
    int32_t P = s->page, skip = 0; /* leading sink tokens, left in fp16 */
    if (s->sink > first_pos) skip = s->sink - first_pos < P ? s->sink - first_pos : P;
    if (skip == P) return;
    float *kk = k + skip * stride;
    int n = P - skip, levels = s->kf == FMT_INT8 ? 255 : 15;
    if (s->kf == FMT_INT8 || s->wide == 0) {
        for (int d = 0; d < hd; d++) quant_asym(kk + d, n, stride, levels);
        return;
    }
    /* the `wide` channels of widest finite range as int8, the others int4;
     * ties go to the lower channel, as libkvpage picks them (kvp__k4_pick) */
    for (int d = 0; d < hd; d++) {
        float lo = INFINITY, hi = -INFINITY;
        for (int t = 0; t < n; t++)
            if (isfinite(kk[t * stride + d])) lo = fminf(lo, kk[t * stride + d]), hi = fmaxf(hi, kk[t * stride + d]);
        s->range[d] = lo > hi ? 0 : hi - lo;
        s->taken[d] = 0;
    }
    for (int i = 0; i < s->wide && i < hd; i++) {
        int best = -1;
        for (int d = 0; d < hd; d++)
            if (!s->taken[d] && (best < 0 || s->range[d] > s->range[best])) best = d;
        s->taken[best] = 1;
    }
    for (int d = 0; d < hd; d++) quant_asym(kk + d, n, stride, s->taken[d] ? 255 : 15);
}

static void sim_destroy(kv_cache_t *kv) {
    sim_kv *s = as_sim(kv);
    if (!s) return;
    if (s->inner) s->inner->ops->destroy(s->inner);
    free(s->row_seq), free(s->row_pos), free(s->range), free(s->taken), free(s->signs);
    free(s);
}

static int sim_open(kv_cache_t *kv, int32_t *id) { return as_sim(kv)->inner->ops->seq_open(as_sim(kv)->inner, id); }
static int sim_fork(kv_cache_t *kv, int32_t p, int32_t *c) {
    return as_sim(kv)->inner->ops->seq_fork(as_sim(kv)->inner, p, c);
}
static void sim_close(kv_cache_t *kv, int32_t id) { as_sim(kv)->inner->ops->seq_close(as_sim(kv)->inner, id); }
static int32_t sim_len(const kv_cache_t *kv, int32_t id) {
    return as_sim_c(kv)->inner->ops->seq_len(as_sim_c(kv)->inner, id);
}
static int32_t sim_attach(kv_cache_t *kv, int32_t id, const int32_t *t, int32_t n) {
    (void)kv, (void)id, (void)t, (void)n;
    return 0;
}

static int sim_begin(kv_cache_t *kv, const kv_batch_t *b) {
    sim_kv *s = as_sim(kv);
    int32_t rows = b->n_seqs > 0 ? b->q_start[b->n_seqs] : 0;
    if (rows > s->cap) {
        int32_t *a = realloc(s->row_seq, (size_t)rows * sizeof *a);
        if (a) s->row_seq = a;
        int32_t *c = realloc(s->row_pos, (size_t)rows * sizeof *c);
        if (c) s->row_pos = c;
        if (!a || !c) return KV_ENOMEM;
        s->cap = rows;
    }
    for (int32_t i = 0; i < b->n_seqs; i++) {
        int32_t len = sim_len(kv, b->seq_ids[i]);
        for (int32_t r = b->q_start[i]; r < b->q_start[i + 1]; r++) {
            s->row_seq[r] = b->seq_ids[i];
            s->row_pos[r] = len + (r - b->q_start[i]);
        }
    }
    int rc = s->inner->ops->begin_step(s->inner, b);
    s->rows = rc == KV_OK ? rows : 0;
    return rc;
}

static int sim_append(kv_cache_t *kv, int32_t layer, const float *k, const float *v) {
    sim_kv *s = as_sim(kv);
    int rc = s->inner->ops->append(s->inner, layer, k, v);
    if (rc != KV_OK) return rc;
    const kv_shape_t *sh = &kv->shape;
    const int hd = sh->head_dim, H = sh->n_kv_heads;
    const long row = (long)H * hd;
    /* per-channel keys, or a recent window: the newest tokens in fp16 */
    const int staged = s->kf != FMT_FP16 || s->window > 0;
    for (int32_t r = 0; r < s->rows; r++) {
        float *K = kv_contig_data(s->inner, s->row_seq[r], layer, 0), *V = kv_contig_data(s->inner, s->row_seq[r], layer, 1);
        const int32_t pos = s->row_pos[r];
        round_f16(K + pos * row, row);
        if (staged) round_f16(V + pos * row, row);
        else
            for (int h = 0; h < H; h++) quant_value(s, V + pos * row + h * hd, hd);
        /* a page is quantized when it fills, or (a recent window) once
         * `window` tokens have come after it: keys per channel, values per
         * token */
        const int32_t end = pos + 1 - s->window; /* the page that may end here */
        if (!staged || end < s->page || end % s->page != 0) continue;
        const int32_t first = end - s->page;
        for (int h = 0; h < H; h++) {
            if (s->kf != FMT_FP16) quant_key_page(s, K + first * row + h * hd, first, row, hd);
            for (int32_t t = first; t < end; t++) quant_value(s, V + t * row + h * hd, hd);
        }
    }
    return KV_OK;
}

static int sim_attend(kv_cache_t *kv, int32_t layer, const float *q, float *out, float scale) {
    return as_sim(kv)->inner->ops->attend(as_sim(kv)->inner, layer, q, out, scale);
}

static void sim_end(kv_cache_t *kv) { as_sim(kv)->inner->ops->end_step(as_sim(kv)->inner); }

static void sim_stats(const kv_cache_t *kv, kv_stats_t *out) {
    as_sim_c(kv)->inner->ops->stats(as_sim_c(kv)->inner, out);
    out->impl = "simulated (contiguous)";
    out->k_format = out->v_format = as_sim_c(kv)->name;
}

static const kv_ops_t sim_ops = {
    "simulated quantization", sim_destroy, sim_open, sim_fork, sim_close, sim_len, sim_attach,
    sim_begin, sim_append, sim_attend, sim_end, sim_stats,
};

/* "fp16" | "int8" | "int4" | "int4wN" | "int4sN" (keys) of `len` bytes,
 * with an optional rotation: "int8h", "int4h" (no int8 channels), "int4hwN";
 * int4 values may end in "sym" (symmetric) and "gN" (N channels a group):
 * "int4hsymg16". */
static int parse_scheme(const char *p, size_t len, int is_key, int *fmt, int *wide, int *sink, int *rot,
                        int *group, int *sym) {
    char buf[24];
    if (len == 0 || len >= sizeof buf) return -1;
    memcpy(buf, p, len);
    buf[len] = 0;
    *wide = *sink = *rot = *sym = 0;
    *group = 32;
    if (!is_key && !strncmp(buf, "int4", 4)) {
        char *g = strstr(buf, "g"), *y = strstr(buf, "sym");
        if (g) {
            char *end;
            long n = strtol(g + 1, &end, 10);
            if (*end || end == g + 1 || n < 2 || n > 1024 || n % 2) return -1;
            *group = (int)n;
            *g = 0;
        }
        if (y) {
            if (y[3]) return -1;
            *sym = 1;
            *y = 0;
        }
        len = strlen(buf);
    }
    if (len > 4 && buf[4] == 'h' && (!strncmp(buf, "int4", 4) || !strncmp(buf, "int8", 4))) {
        *rot = 1;
        memmove(buf + 4, buf + 5, len - 4); /* "int4hw2" -> "int4w2"; "int4h" -> "int4" */
        if (!strcmp(buf, "int4") && is_key) {
            *fmt = FMT_INT4; /* rotated keys: no int8 channels unless asked (int4hwN) */
            return 0;
        }
    }
    if (!strcmp(buf, "fp16")) *fmt = FMT_FP16;
    else if (!strcmp(buf, "int8")) *fmt = FMT_INT8;
    else if (!strcmp(buf, "int4")) *fmt = FMT_INT4, *wide = -1; /* libkvpage's int4_v1: head_dim / 32 */
    else if (is_key && (!strncmp(buf, "int4w", 5) || !strncmp(buf, "int4s", 5))) {
        char *end;
        long n = strtol(buf + 5, &end, 10);
        if (*end || end == buf + 5 || n < (buf[4] == 'w' ? 0 : 1) || n > 1024) return -1;
        *fmt = FMT_INT4;
        *(buf[4] == 'w' ? wide : sink) = (int)n;
    } else return -1;
    return 0;
}

float *kv_sim_data(kv_cache_t *kv, int32_t seq_id, int32_t layer, int is_v) {
    return kv->ops == &sim_ops ? kv_contig_data(as_sim(kv)->inner, seq_id, layer, is_v) : NULL;
}

typedef struct {
    int kf, vf, wide, sink, krot, vrot, vgroup, vsym;
    long page, window;
} sim_spec;

static int sim_parse(const char *spec, sim_spec *o, char *err, size_t err_size) {
    const char *plus = strchr(spec, '+'), *stop = plus ? plus : spec + strlen(spec);
    const char *slash = strchr(spec, '/'), *at = memchr(spec, '@', (size_t)(stop - spec));
    const char *vend = at ? at : stop;
    int w2, s2, g1, y1;
    o->page = 16;
    o->window = 0;
    if (at) {
        char *end;
        o->page = strtol(at + 1, &end, 10);
        if (end != stop || o->page < 2 || o->page > 4096 || o->page % 2) o->page = -1;
    }
    if (plus) {
        char *end;
        o->window = plus[1] == 'r' ? strtol(plus + 2, &end, 10) : -1;
        if (plus[1] != 'r' || *end || end == plus + 2 || o->window < 1 || o->window > 1 << 20) o->window = -1;
    }
    if (!slash || slash > vend || o->page < 0 || o->window < 0 ||
        parse_scheme(spec, (size_t)(slash - spec), 1, &o->kf, &o->wide, &o->sink, &o->krot, &g1, &y1) ||
        parse_scheme(slash + 1, (size_t)(vend - slash - 1), 0, &o->vf, &w2, &s2, &o->vrot, &o->vgroup,
                     &o->vsym)) {
        snprintf(err, err_size, "bad simulation spec '%s': KEY/VALUE[@PAGE][+rN], keys fp16|int8|int4|int4wN|int4sN, "
                 "values fp16|int8|int4 (int4[h][sym][gN]: symmetric, N channels a group), int8/int4 with an "
                 "h for the rotated basis (int4h, int4hwN), an even "
                 "page size, N tokens in fp16 at the end", spec);
        return -1;
    }
    return 0;
}

int kv_sim_check(const char *spec, char *err, size_t err_size) {
    sim_spec o;
    return sim_parse(spec, &o, err, err_size);
}

kv_cache_t *kv_sim_create(const kv_shape_t *shape, pool_t *pool, const char *spec, char *err, size_t err_size) {
    sim_spec o;
    if (sim_parse(spec, &o, err, err_size)) return NULL;
    sim_kv *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->base.ops = &sim_ops;
    s->base.shape = *shape;
    s->base.pool = pool;
    s->kf = o.kf, s->vf = o.vf, s->sink = o.sink;
    s->wide = o.wide < 0 ? (int)(shape->head_dim / 32) : o.wide;
    s->page = (int32_t)o.page;
    s->krot = o.krot, s->vrot = o.vrot;
    s->vgroup = o.vgroup, s->vsym = o.vsym;
    s->window = (int32_t)o.window;
    const int hd = (int)shape->head_dim;
    if ((s->krot || s->vrot) && (hd & (hd - 1)) != 0) {
        snprintf(err, err_size, "'%s': the rotation needs a head_dim that is a power of two (this model's: %d)", spec, hd);
        free(s);
        return NULL;
    }
    s->signs = malloc((size_t)hd * sizeof *s->signs);
    if (s->signs) { /* fixed pseudo-random signs: the same rotation in every run */
        uint32_t x = 0x2545F491u;
        for (int i = 0; i < hd; i++) {
            x ^= x << 13, x ^= x >> 17, x ^= x << 5;
            s->signs[i] = (x >> 31) ? -1.0f : 1.0f;
        }
    }
    snprintf(s->name, sizeof s->name, "sim %s", spec);
    s->inner = kv_contig_create(shape, pool);
    s->range = malloc((size_t)shape->head_dim * sizeof *s->range);
    s->taken = malloc((size_t)shape->head_dim * sizeof *s->taken);
    if (!s->inner || !s->range || !s->taken || !s->signs) {
        snprintf(err, err_size, "cannot create the contiguous cache");
        sim_destroy(&s->base);
        return NULL;
    }
    return &s->base;
}
