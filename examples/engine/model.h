/*
 * A llama-architecture model read from a GGUF file, and its forward pass over
 * a ragged batch of new tokens from several sequences.
 *
 * Every constant comes from the file's metadata (architecture prefix
 * "<arch>." as general.architecture says); nothing is assumed about the
 * particular model.
 */
#ifndef ENGINE_MODEL_H
#define ENGINE_MODEL_H

#include <stdint.h>

#include "gguf.h"
#include "kv.h"
#include "pool.h"
#include "quant.h"

typedef struct {
    char arch[32];
    int32_t n_layers;     /* <arch>.block_count */
    int32_t dim;          /* <arch>.embedding_length */
    int32_t ffn_dim;      /* <arch>.feed_forward_length */
    int32_t n_heads;      /* <arch>.attention.head_count */
    int32_t n_kv_heads;   /* <arch>.attention.head_count_kv (default: n_heads) */
    int32_t head_dim;     /* <arch>.attention.key_length (default: dim / n_heads) */
    int32_t rope_dim;     /* <arch>.rope.dimension_count (default: head_dim) */
    int32_t vocab;        /* rows of token_embd.weight (<arch>.vocab_size must agree) */
    int32_t context;      /* <arch>.context_length */
    float rope_base;      /* <arch>.rope.freq_base (default 10000) */
    float norm_eps;       /* <arch>.attention.layer_norm_rms_epsilon */
    int tied_output;      /* 1 when output.weight is absent and token_embd is reused */
} model_cfg_t;

typedef struct {
    const float *attn_norm, *ffn_norm;
    qmat_t wq, wk, wv, wo, w_gate, w_up, w_down;
} layer_t;

typedef struct model model_t;

model_t *model_load(const char *path, char *err, size_t err_size);
/* Build a model over an already open GGUF (not closed by model_free). */
model_t *model_from_gguf(gguf_file *f, char *err, size_t err_size);
void model_free(model_t *m);
const model_cfg_t *model_cfg(const model_t *m);
gguf_file *model_gguf(const model_t *m);

/* The model's identity for KV that leaves the process (kvp_fingerprint):
 * SHA-256 over a description of the architecture and of how this engine
 * computes K/V, then every byte of the GGUF file. 0, or -1 with err. */
int model_fingerprint(const model_t *m, uint8_t out[32], char *err, size_t err_size);

/* The KV shape this model needs, for max_seqs sequences of max_len tokens. */
kv_shape_t model_kv_shape(const model_t *m, int32_t max_seqs, int32_t max_len);

/*
 * One forward step over `batch` (see kv.h): embeds batch->tokens, runs every
 * layer with the KV cache, and writes the logits of the rows listed in
 * logit_rows[0..n_logits) to logits[n_logits][vocab]. Positions continue each
 * sequence's length in the cache.
 * Returns 0, or a KV_E* code from the cache's begin_step (nothing computed;
 * KV_ENOSPC when the cache has no room), or KV_ENOMEM; or, after a
 * successful begin_step, a code from append/attend, which only an
 * inconsistent cache gives (the step's sequences are then unusable: close
 * them).
 */
int model_forward(model_t *m, kv_cache_t *kv, pool_t *pool, const kv_batch_t *batch,
                  const int32_t *logit_rows, int32_t n_logits, float *logits);

#endif
