/*
 * One request split across two processes (disaggregated serving): one
 * process prefills the prompt and samples the first token, exports the
 * sequence's KV as page blobs (kvp_cache_seq_export) into a handoff file;
 * another imports it into a fresh cache (kvp_cache_seq_import, every blob
 * validated) and continues decoding. Also the one-process path the two must
 * agree with: the same prefill and decode functions, back to back.
 *
 * The handoff file is the engine's own (little-endian):
 *
 *   offset size
 *        0    8  magic "KVPGHND1"
 *        8    4  version 1
 *       12    4  header bytes (96)
 *       16    4  n: the sequence's tokens (the prompt), >= 1
 *       20    4  the first sampled token (not in the KV yet)
 *       24    4  K format (kvp_format)
 *       28    4  V format
 *       32    4  page size
 *       36    4  flags, 0
 *       40    8  bytes of the blobs
 *       48   32  the model's fingerprint (model_fingerprint)
 *       80   16  reserved, 0
 *       96  4*n  the token ids (int32): the importer needs them, the blobs never carry them
 *  96+4*n    .   the blobs, as kvp_cache_seq_export wrote them (docs/blob-format.md)
 *
 * The header lets the importer size its cache and refuse another model with
 * a plain message; the blobs are validated by libkvpage whatever it says.
 */
#ifndef ENGINE_HANDOFF_H
#define ENGINE_HANDOFF_H

#include <stddef.h>
#include <stdint.h>

#include "kv.h"
#include "model.h"
#include "pool.h"

/* Greedy generation of one sequence, in the steps serve_run takes for one
 * request alone: the prompt's leading pages attached from the cache's
 * prefix cache (pool, then stores), the rest prefilled in chunks of `chunk`
 * tokens, then one token per step. */
typedef struct {
    model_t *model;
    kv_cache_t *kv;
    pool_t *pool;
    int32_t chunk; /* prefill tokens per step (the demo's 64) */
    int32_t eos;   /* stop after sampling it; -1: never */
} gen_cfg_t;

/* Open a sequence, attach what the cache already holds, prefill the rest
 * and sample the first token greedily. The sequence stays open (*seq);
 * *cached: prompt tokens attached instead of prefilled. 0 or a KV_E* code. */
int gen_prefill(const gen_cfg_t *g, const int32_t *prompt, int32_t n, int32_t *seq, int32_t *cached,
                int32_t *first);
/* Continue sequence `seq` from `first` (sampled, not yet fed): out[0] =
 * first, then greedy tokens until max_new in all or eos. 0 or a KV_E* code. */
int gen_decode(const gen_cfg_t *g, int32_t seq, int32_t first, int32_t max_new, int32_t *out,
               int32_t *n_out);

#define HANDOFF_MAGIC "KVPGHND1"
#define HANDOFF_HEADER_BYTES 96

typedef struct {
    int32_t n_tokens, first_token;
    int32_t k_format, v_format, page_size;
    uint8_t fingerprint[KV_FINGERPRINT_BYTES];
    int32_t *tokens;     /* [n_tokens] */
    void *blobs;
    uint64_t blob_bytes;
} handoff_t;

/* Write `h` to `path` (through a temporary name and a rename: a reader never
 * sees half a file). 0, or -1 with err. */
int handoff_write(const char *path, const handoff_t *h, char *err, size_t err_size);
/* Read and check the header and the sizes; tokens and blobs are malloc'ed
 * (handoff_free). 0, or -1 with err. */
int handoff_read(const char *path, handoff_t *h, char *err, size_t err_size);
void handoff_free(handoff_t *h);

#endif
