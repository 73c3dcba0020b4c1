/*
 * The llama forward pass: RMSNorm, RoPE, GQA attention through the KV-cache
 * interface, SwiGLU feed-forward, tied or separate output head.
 *
 * RoPE layout. llama.cpp's converter permutes the rows of attn_q and attn_k
 * when it writes a llama GGUF, so that the two halves of Hugging Face's
 * rotate_half become adjacent pairs: in this file's weights, rotation i acts
 * on dimensions (2i, 2i+1) of each head, with angle pos * base^(-2i/rope_dim).
 * (Using HF's (i, i + d/2) pairing on these weights instead gives a much
 * worse perplexity; docs/PERFORMANCE.md has the measurement.)
 */
#define _POSIX_C_SOURCE 200809L
#include "model.h"

#include <kvpage_blob.h> /* kvp_fingerprint */
#include <kvpage_ext.h>  /* kvp_status_name */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vec.h"

struct model {
    model_cfg_t cfg;
    gguf_file *f;
    int owns_file;
    qmat_t tok_embd, output;
    const float *output_norm;
    layer_t *layers;
    double *inv_freq; /* [rope_dim/2] */
    int rope_neox;    /* 1: pairs (i, i+d/2) — only for the experiment above */
    /* activations for up to cap rows */
    int32_t cap;
    float *x, *xn, *q, *k, *v, *att, *gate, *up, *tmp;
    float *rope_cos, *rope_sin; /* [rows][rope_dim/2] */
};

/* ---- loading ------------------------------------------------------------------ */

static int meta_i(const gguf_file *f, const char *arch, const char *suffix, int64_t *out) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    return gguf_get_i64(f, key, out);
}

static int meta_f(const gguf_file *f, const char *arch, const char *suffix, double *out) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    return gguf_get_f64(f, key, out);
}

static int read_cfg(const gguf_file *f, model_cfg_t *c, char *err, size_t n) {
    gguf_str a;
    if (gguf_get_str(f, "general.architecture", &a) != 0 || a.len == 0 || a.len >= sizeof c->arch) {
        snprintf(err, n, "general.architecture is missing");
        return -1;
    }
    memcpy(c->arch, a.ptr, a.len);
    c->arch[a.len] = 0;
    if (strcmp(c->arch, "llama") != 0) {
        snprintf(err, n, "architecture '%s' is not supported (llama only)", c->arch);
        return -1;
    }
    int64_t v;
    double d;
    struct { const char *key; int32_t *dst; int64_t dflt; } ints[] = {
        {"block_count", &c->n_layers, -1},         {"embedding_length", &c->dim, -1},
        {"feed_forward_length", &c->ffn_dim, -1},  {"attention.head_count", &c->n_heads, -1},
        {"attention.head_count_kv", &c->n_kv_heads, 0}, {"attention.key_length", &c->head_dim, 0},
        {"rope.dimension_count", &c->rope_dim, 0}, {"context_length", &c->context, -1},
    };
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        if (meta_i(f, c->arch, ints[i].key, &v) != 0) {
            if (ints[i].dflt < 0) {
                snprintf(err, n, "metadata %s.%s is missing", c->arch, ints[i].key);
                return -1;
            }
            v = ints[i].dflt;
        }
        if (v < 0 || v > (1 << 24)) {
            snprintf(err, n, "metadata %s.%s = %lld is out of range", c->arch, ints[i].key, (long long)v);
            return -1;
        }
        *ints[i].dst = (int32_t)v;
    }
    if (!c->n_kv_heads) c->n_kv_heads = c->n_heads;
    if (!c->head_dim && c->n_heads) c->head_dim = c->dim / c->n_heads;
    if (!c->rope_dim) c->rope_dim = c->head_dim;
    c->rope_base = meta_f(f, c->arch, "rope.freq_base", &d) == 0 ? (float)d : 10000.0f;
    if (meta_f(f, c->arch, "attention.layer_norm_rms_epsilon", &d) != 0) {
        snprintf(err, n, "metadata %s.attention.layer_norm_rms_epsilon is missing", c->arch);
        return -1;
    }
    c->norm_eps = (float)d;
    if (c->n_layers < 1 || c->dim < 1 || c->n_heads < 1 || c->n_kv_heads < 1 ||
        c->n_heads % c->n_kv_heads || c->head_dim < 2 || c->rope_dim > c->head_dim || c->rope_dim % 2) {
        snprintf(err, n, "inconsistent shape: %d layers, dim %d, %d heads, %d kv heads, head_dim %d, rope_dim %d",
                 c->n_layers, c->dim, c->n_heads, c->n_kv_heads, c->head_dim, c->rope_dim);
        return -1;
    }
    return 0;
}

/* A matrix with n_in inputs and n_out outputs (GGUF shape [n_in, n_out]). */
static int get_mat(const gguf_file *f, const char *name, int64_t n_in, int64_t n_out, qmat_t *m,
                   char *err, size_t n) {
    const gguf_tensor *t = gguf_tensor_find(f, name);
    if (!t) {
        snprintf(err, n, "tensor %s is missing", name);
        return -1;
    }
    if (t->n_dims != 2 || (int64_t)t->ne[0] != n_in || (n_out >= 0 && (int64_t)t->ne[1] != n_out)) {
        snprintf(err, n, "tensor %s has shape [%llu, %llu], expected [%lld, %lld]", name,
                 (unsigned long long)t->ne[0], (unsigned long long)t->ne[1], (long long)n_in,
                 (long long)n_out);
        return -1;
    }
    *m = (qmat_t){t->data, t->type, (int64_t)t->ne[0], (int64_t)t->ne[1], ggml_row_bytes(t->type, t->ne[0])};
    return 0;
}

static int get_vec(const gguf_file *f, const char *name, int64_t len, const float **out, char *err,
                   size_t n) {
    const gguf_tensor *t = gguf_tensor_find(f, name);
    if (!t || t->type != GGML_F32 || t->n_dims != 1 || (int64_t)t->ne[0] != len) {
        snprintf(err, n, "tensor %s is missing or not an F32 vector of %lld", name, (long long)len);
        return -1;
    }
    *out = t->data;
    return 0;
}

static int load_layer(const gguf_file *f, const model_cfg_t *c, int i, layer_t *L, char *err, size_t n) {
    char name[96];
    const int64_t qdim = (int64_t)c->n_heads * c->head_dim, kvdim = (int64_t)c->n_kv_heads * c->head_dim;
#define NAME(s) (snprintf(name, sizeof name, "blk.%d." s, i), name)
    if (get_vec(f, NAME("attn_norm.weight"), c->dim, &L->attn_norm, err, n) ||
        get_vec(f, NAME("ffn_norm.weight"), c->dim, &L->ffn_norm, err, n) ||
        get_mat(f, NAME("attn_q.weight"), c->dim, qdim, &L->wq, err, n) ||
        get_mat(f, NAME("attn_k.weight"), c->dim, kvdim, &L->wk, err, n) ||
        get_mat(f, NAME("attn_v.weight"), c->dim, kvdim, &L->wv, err, n) ||
        get_mat(f, NAME("attn_output.weight"), qdim, c->dim, &L->wo, err, n) ||
        get_mat(f, NAME("ffn_gate.weight"), c->dim, c->ffn_dim, &L->w_gate, err, n) ||
        get_mat(f, NAME("ffn_up.weight"), c->dim, c->ffn_dim, &L->w_up, err, n) ||
        get_mat(f, NAME("ffn_down.weight"), c->ffn_dim, c->dim, &L->w_down, err, n))
        return -1;
#undef NAME
    return 0;
}

static int load_heads(model_t *m, char *err, size_t n) {
    model_cfg_t *c = &m->cfg;
    if (get_mat(m->f, "token_embd.weight", c->dim, -1, &m->tok_embd, err, n)) return -1;
    c->vocab = (int32_t)m->tok_embd.n_out;
    int64_t v;
    if (meta_i(m->f, c->arch, "vocab_size", &v) == 0 && v != c->vocab) {
        snprintf(err, n, "%s.vocab_size = %lld but token_embd has %d rows", c->arch, (long long)v, c->vocab);
        return -1;
    }
    if (get_vec(m->f, "output_norm.weight", c->dim, &m->output_norm, err, n)) return -1;
    c->tied_output = gguf_tensor_find(m->f, "output.weight") == NULL;
    if (c->tied_output) m->output = m->tok_embd;
    else if (get_mat(m->f, "output.weight", c->dim, c->vocab, &m->output, err, n)) return -1;
    return 0;
}

model_t *model_from_gguf(gguf_file *f, char *err, size_t n) {
    model_t *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->f = f;
    if (read_cfg(f, &m->cfg, err, n) || load_heads(m, err, n)) goto fail;
    m->layers = calloc((size_t)m->cfg.n_layers, sizeof *m->layers);
    m->inv_freq = malloc((size_t)m->cfg.rope_dim / 2 * sizeof *m->inv_freq);
    if (!m->layers || !m->inv_freq) goto fail;
    for (int i = 0; i < m->cfg.n_layers; i++)
        if (load_layer(f, &m->cfg, i, &m->layers[i], err, n)) goto fail;
    for (int i = 0; i < m->cfg.rope_dim / 2; i++)
        m->inv_freq[i] = pow((double)m->cfg.rope_base, -2.0 * i / m->cfg.rope_dim);
    const char *neox = getenv("KVPAGE_ENGINE_ROPE_NEOX"); /* for the layout experiment only */
    m->rope_neox = neox && neox[0] == '1';
    return m;
fail:
    m->f = NULL;
    model_free(m);
    return NULL;
}

model_t *model_load(const char *path, char *err, size_t n) {
    gguf_file *f = gguf_open(path, err, n);
    if (!f) return NULL;
    model_t *m = model_from_gguf(f, err, n);
    if (!m) {
        gguf_close(f);
        return NULL;
    }
    m->owns_file = 1;
    return m;
}

static void free_acts(model_t *m) {
    float **bufs[] = {&m->x, &m->xn, &m->q, &m->k, &m->v, &m->att, &m->gate, &m->up, &m->tmp,
                      &m->rope_cos, &m->rope_sin};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        free(*bufs[i]);
        *bufs[i] = NULL;
    }
    m->cap = 0;
}

void model_free(model_t *m) {
    if (!m) return;
    free_acts(m);
    free(m->layers);
    free(m->inv_freq);
    if (m->owns_file) gguf_close(m->f);
    free(m);
}

const model_cfg_t *model_cfg(const model_t *m) { return &m->cfg; }

/* What decides the K/V this engine computes for a token: the architecture
 * and its hyperparameters, how the engine computes them (fp32 activations,
 * the RoPE pairing), then the whole GGUF file. The file is already mapped
 * (gguf_open maps all of it), so its bytes are hashed straight from the map:
 * every weight, the tokenizer and the metadata, ~0.1-0.3 s for this 98 MB
 * file, once per process. The matmul kernels' instruction set (AVX-512,
 * AVX2, portable) is left out on purpose: they compute the same function,
 * and KV written on one machine is meant to be read on another. */
int model_fingerprint(const model_t *m, uint8_t out[32], char *err, size_t n) {
    const model_cfg_t *c = &m->cfg;
    char desc[512];
    int len = snprintf(desc, sizeof desc,
                       "kvpage-engine K/V v1: arch %s, layers %d, dim %d, ffn %d, heads %d, kv heads %d, "
                       "head dim %d, rope dim %d, rope base %.9g, rope pairs %s, rms eps %.9g, vocab %d, tied %d, "
                       "activations fp32",
                       c->arch, c->n_layers, c->dim, c->ffn_dim, c->n_heads, c->n_kv_heads, c->head_dim,
                       c->rope_dim, (double)c->rope_base, m->rope_neox ? "(i, i+d/2)" : "(2i, 2i+1)",
                       (double)c->norm_eps, c->vocab, c->tied_output);
    const void *parts[2] = {desc, m->f->map};
    const uint64_t sizes[2] = {(uint64_t)len, (uint64_t)m->f->size};
    int rc = kvp_fingerprint(parts, sizes, m->f->size ? 2 : 1, out);
    if (rc != KVP_OK) {
        snprintf(err, n, "kvp_fingerprint: %s%s", kvp_status_name(rc),
                 rc == KVP_ENOTSUP ? " (libkvpage was built without the blob layer: libssl-dev, libxxhash-dev)"
                                   : "");
        return -1;
    }
    return 0;
}
gguf_file *model_gguf(const model_t *m) { return m->f; }

kv_shape_t model_kv_shape(const model_t *m, int32_t max_seqs, int32_t max_len) {
    kv_shape_t s = {m->cfg.n_layers, m->cfg.n_heads, m->cfg.n_kv_heads, m->cfg.head_dim, max_seqs, max_len};
    return s;
}

/* ---- forward ------------------------------------------------------------------------ */

static int ensure_acts(model_t *m, int32_t rows) {
    if (rows <= m->cap) return 0;
    free_acts(m);
    const model_cfg_t *c = &m->cfg;
    size_t r = (size_t)rows, qd = (size_t)c->n_heads * c->head_dim, kvd = (size_t)c->n_kv_heads * c->head_dim;
    size_t wide = (size_t)c->ffn_dim > qd ? (size_t)c->ffn_dim : qd;
    if (wide < (size_t)c->dim) wide = (size_t)c->dim;
    m->x = malloc(r * c->dim * sizeof(float));
    m->xn = malloc(r * c->dim * sizeof(float));
    m->q = malloc(r * qd * sizeof(float));
    m->k = malloc(r * kvd * sizeof(float));
    m->v = malloc(r * kvd * sizeof(float));
    m->att = malloc(r * qd * sizeof(float));
    m->gate = malloc(r * c->ffn_dim * sizeof(float));
    m->up = malloc(r * c->ffn_dim * sizeof(float));
    m->tmp = malloc(r * wide * sizeof(float));
    m->rope_cos = malloc(r * (size_t)(c->rope_dim / 2) * sizeof(float));
    m->rope_sin = malloc(r * (size_t)(c->rope_dim / 2) * sizeof(float));
    if (!m->x || !m->xn || !m->q || !m->k || !m->v || !m->att || !m->gate || !m->up || !m->tmp ||
        !m->rope_cos || !m->rope_sin) {
        free_acts(m);
        return KV_ENOMEM;
    }
    m->cap = rows;
    return 0;
}

static void rmsnorm(float *out, const float *x, const float *w, int n, float eps) {
    float ss = vec_dot(x, x, n) / (float)n;
    float inv = 1.0f / sqrtf(ss + eps);
    for (int i = 0; i < n; i++) out[i] = x[i] * inv * w[i];
}

/* cos/sin of every row's angles, once per step for all layers and heads. */
static void rope_tables(model_t *m, const int32_t *pos, int32_t rows) {
    const int half = m->cfg.rope_dim / 2;
    for (int32_t r = 0; r < rows; r++)
        for (int i = 0; i < half; i++) {
            double a = (double)pos[r] * m->inv_freq[i];
            m->rope_cos[r * half + i] = (float)cos(a);
            m->rope_sin[r * half + i] = (float)sin(a);
        }
}

static void rope_apply(const model_t *m, float *vecs, int32_t rows, int32_t heads) {
    const int half = m->cfg.rope_dim / 2, hd = m->cfg.head_dim;
    for (int32_t r = 0; r < rows; r++) {
        const float *cs = m->rope_cos + r * half, *sn = m->rope_sin + r * half;
        for (int32_t h = 0; h < heads; h++) {
            float *v = vecs + ((size_t)r * heads + h) * hd;
            for (int i = 0; i < half; i++) {
                int a = m->rope_neox ? i : 2 * i, b = m->rope_neox ? i + half : 2 * i + 1;
                float x0 = v[a], x1 = v[b];
                v[a] = x0 * cs[i] - x1 * sn[i];
                v[b] = x0 * sn[i] + x1 * cs[i];
            }
        }
    }
}

static int attention_block(model_t *m, kv_cache_t *kv, pool_t *pool, int l, int32_t rows) {
    const model_cfg_t *c = &m->cfg;
    const layer_t *L = &m->layers[l];
    for (int32_t r = 0; r < rows; r++)
        rmsnorm(m->xn + (size_t)r * c->dim, m->x + (size_t)r * c->dim, L->attn_norm, c->dim, c->norm_eps);
    const qmat_t *w[3] = {&L->wq, &L->wk, &L->wv};
    float *y[3] = {m->q, m->k, m->v};
    qmat_matmul(pool, 3, w, m->xn, rows, y);
    rope_apply(m, m->q, rows, c->n_heads);
    rope_apply(m, m->k, rows, c->n_kv_heads);
    int rc = kv->ops->append(kv, l, m->k, m->v);
    if (rc == 0) rc = kv->ops->attend(kv, l, m->q, m->att, 1.0f / sqrtf((float)c->head_dim));
    if (rc != 0) return rc;
    const qmat_t *wo = &L->wo;
    float *o = m->tmp;
    qmat_matmul(pool, 1, &wo, m->att, rows, &o);
    for (size_t i = 0; i < (size_t)rows * c->dim; i++) m->x[i] += m->tmp[i];
    return 0;
}

static void ffn_block(model_t *m, pool_t *pool, int l, int32_t rows) {
    const model_cfg_t *c = &m->cfg;
    const layer_t *L = &m->layers[l];
    for (int32_t r = 0; r < rows; r++)
        rmsnorm(m->xn + (size_t)r * c->dim, m->x + (size_t)r * c->dim, L->ffn_norm, c->dim, c->norm_eps);
    const qmat_t *w[2] = {&L->w_gate, &L->w_up};
    float *y[2] = {m->gate, m->up};
    qmat_matmul(pool, 2, w, m->xn, rows, y);
    for (size_t i = 0; i < (size_t)rows * c->ffn_dim; i++) {
        float g = m->gate[i];
        m->gate[i] = g / (1.0f + expf(-g)) * m->up[i]; /* SiLU(gate) * up */
    }
    const qmat_t *wd = &L->w_down;
    float *o = m->tmp;
    qmat_matmul(pool, 1, &wd, m->gate, rows, &o);
    for (size_t i = 0; i < (size_t)rows * c->dim; i++) m->x[i] += m->tmp[i];
}

static void output_head(model_t *m, pool_t *pool, const int32_t *logit_rows, int32_t n, float *logits) {
    const model_cfg_t *c = &m->cfg;
    for (int32_t i = 0; i < n; i++) /* gather the wanted rows, normed, into xn */
        rmsnorm(m->xn + (size_t)i * c->dim, m->x + (size_t)logit_rows[i] * c->dim, m->output_norm, c->dim,
                c->norm_eps);
    const qmat_t *w = &m->output;
    qmat_matmul(pool, 1, &w, m->xn, n, &logits);
}

static int positions(const kv_cache_t *kv, const kv_batch_t *b, int32_t *pos) {
    for (int32_t i = 0; i < b->n_seqs; i++) {
        int32_t len = kv->ops->seq_len(kv, b->seq_ids[i]);
        if (len < 0) return KV_EINVAL;
        for (int32_t r = b->q_start[i]; r < b->q_start[i + 1]; r++) pos[r] = len + (r - b->q_start[i]);
    }
    return 0;
}

int model_forward(model_t *m, kv_cache_t *kv, pool_t *pool, const kv_batch_t *batch,
                  const int32_t *logit_rows, int32_t n_logits, float *logits) {
    const model_cfg_t *c = &m->cfg;
    if (batch->n_seqs < 1) return KV_EINVAL;
    int32_t rows = batch->q_start[batch->n_seqs];
    if (rows < 1 || n_logits < 0 || n_logits > rows) return KV_EINVAL;
    for (int32_t r = 0; r < rows; r++)
        if (batch->tokens[r] < 0 || batch->tokens[r] >= c->vocab) return KV_EINVAL;
    for (int32_t i = 0; i < n_logits; i++)
        if (logit_rows[i] < 0 || logit_rows[i] >= rows) return KV_EINVAL;
    if (ensure_acts(m, rows)) return KV_ENOMEM;
    int32_t *pos = malloc((size_t)rows * sizeof *pos);
    if (!pos) return KV_ENOMEM;
    int rc = positions(kv, batch, pos);
    if (rc == 0) rc = kv->ops->begin_step(kv, batch);
    if (rc != 0) {
        free(pos);
        return rc;
    }
    rope_tables(m, pos, rows);
    free(pos);
    for (int32_t r = 0; r < rows; r++) qmat_row(&m->tok_embd, batch->tokens[r], m->x + (size_t)r * c->dim);
    for (int l = 0; l < c->n_layers && rc == 0; l++) {
        rc = attention_block(m, kv, pool, l, rows);
        if (rc == 0) ffn_block(m, pool, l, rows);
    }
    kv->ops->end_step(kv); /* even after a failure: the step's rows are in the cache's lengths */
    if (rc != 0) return rc;
    if (n_logits > 0) output_head(m, pool, logit_rows, n_logits, logits);
    return 0;
}
