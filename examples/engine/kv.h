/*
 * The engine's KV-cache interface: everything the model code knows about
 * where keys and values live.
 *
 * The model calls, per forward step:
 *
 *     kv->ops->begin_step(kv, &batch)        once: room for the batch's new tokens
 *     for each layer:
 *         kv->ops->append(kv, layer, k, v)   K/V rows of every new token
 *         kv->ops->attend(kv, layer, q, out) causal GQA attention of every new token
 *     kv->ops->end_step(kv)                  once: the new tokens become part of the sequences
 *
 * A batch is ragged, in FlashInfer's qo_indptr style: sequence i brings rows
 * q_start[i] .. q_start[i+1]-1 (q_len >= 1: a prefill chunk, a decode token,
 * or several), and every per-row array (tokens, K, V, Q, output) is laid out
 * in that row order. Append comes before attend in each layer, so a row sees
 * the rows of its own sequence before it (causal), plus everything stored
 * earlier.
 *
 * Implementations:
 *   - kv_contig.c: a contiguous fp32 cache, one max-length reservation per
 *     sequence, attention computed directly (two passes, exact softmax). It
 *     is the reference the paged implementation is compared against, and it
 *     stays.
 *   - kv_paged.c: libkvpage's kvp_cache_t. begin_step reserves and appends
 *     in the page table and exports the CSR view and slot mapping once for
 *     all layers; append quantizes on write through the slot mapping; attend
 *     runs paged attention over the CSR view; seq_attach_prefix looks the
 *     prompt up in the prefix cache, then in the KV stores behind it
 *     (--kv-store); seq_fork is the table's fork. K and V
 *     formats fp32, fp16, bf16, fp8_e4m3, int8, int4, chosen separately.
 */
#ifndef ENGINE_KV_H
#define ENGINE_KV_H

#include <stddef.h>
#include <stdint.h>

#include "pool.h"

typedef struct {
    int32_t n_layers;
    int32_t n_q_heads;
    int32_t n_kv_heads;  /* n_q_heads is a multiple (GQA group size) */
    int32_t head_dim;
    int32_t max_seqs;    /* sequences open at once */
    int32_t max_len;     /* tokens per sequence (contiguous: reserved up front) */
} kv_shape_t;

/* One step's batch. Rows are this step's new tokens, grouped by sequence. */
typedef struct {
    int32_t n_seqs;
    const int32_t *seq_ids; /* [n_seqs], distinct, open */
    const int32_t *q_start; /* [n_seqs+1], q_start[0] = 0, strictly increasing */
    const int32_t *tokens;  /* [rows] token ids (a paged cache hashes full pages) */
} kv_batch_t;

/* KV stores one paged cache can have behind its pool (--kv-store, repeated). */
#define KV_MAX_STORES 4
/* Bytes of a model fingerprint (kvpage_blob.h's KVP_FINGERPRINT_BYTES). */
#define KV_FINGERPRINT_BYTES 32

typedef struct {
    const char *impl;           /* e.g. "contiguous fp32" */
    const char *k_format;       /* "fp32", ... */
    const char *v_format;
    int32_t live_seqs;
    int64_t live_tokens;        /* tokens held, all sequences */
    uint64_t bytes_reserved;    /* bytes the cache has set aside for K/V */
    uint64_t bytes_live;        /* bytes the live tokens occupy */
    int64_t prefix_hit_tokens;  /* prompt tokens served from a prefix cache */
    int64_t prefix_hit_pages;   /* pages attached from it */
    int64_t prefix_lookups;     /* prompts looked up */
    int64_t prefix_lookup_tokens; /* prompt tokens looked up (hits + misses) */
    /* paged caches (page_size 0 otherwise) */
    int32_t page_size;
    uint64_t page_bytes, staging_page_bytes; /* one page, all layers, K+V, scales included */
    int64_t pages_total, pages_used, pages_cached, pages_peak; /* pool pages */
    int64_t staging_used, staging_peak;  /* fp16 staging pages (int8/int4 keys) */
    uint64_t bytes_peak;        /* most bytes held by used pages + staging pages after a step */
    /* KV stores behind the pool (kv_paged_opts_t::stores), in lookup order */
    int32_t n_stores;
    struct kv_store_stats {
        const char *spec;       /* as given, e.g. "dir:/tmp/kv" */
        int64_t lookups;        /* pages looked up there (the pool and earlier stores missed) */
        int64_t hit_pages;      /* pages found there, validated and imported */
        int64_t written;        /* pages written to it (write-back and write-through) */
        int64_t rejected;       /* pages found but refused by validation */
        int64_t misses;         /* pages not found there (or found after a missing one) */
        int64_t errors;         /* store calls that failed (their pages were misses) */
        uint64_t bytes_in, bytes_out;
        double read_s, write_s; /* time looking up + importing, exporting + writing */
        /* the queue in front of the store (puts never wait): blobs dropped
         * because it was full, blobs the store behind refused */
        int64_t queue_dropped, queue_failed;
        const char *detail;     /* e.g. "Redis/Valkey: 1 server, key prefix ..." ("" for a directory) */
        char last_error[256];   /* the store's last failure, as its tier says it ("" for none) */
        int is_redis;           /* a redis:// store: the counters below are set */
        struct {
            int32_t cluster, nodes, nodes_down; /* nodes_down: waiting to be reconnected */
            int64_t connects, failures;         /* connections made; refused, lost or timed out */
            int64_t timeouts, skipped;          /* calls out of budget; keys not sent (server down) */
            int64_t server_errors;              /* error replies (e.g. OOM) */
        } redis;
    } stores[KV_MAX_STORES];
} kv_stats_t;

/* Return codes: 0, or one of these. */
enum { KV_OK = 0, KV_EINVAL = -1, KV_ENOSPC = -2, KV_ENOMEM = -3, KV_ENOTSUP = -4 };

typedef struct kv_cache kv_cache_t;

typedef struct {
    const char *name;
    void (*destroy)(kv_cache_t *kv);
    /* A new empty sequence; its id is returned in *seq_id. KV_ENOSPC when
     * max_seqs are open. */
    int (*seq_open)(kv_cache_t *kv, int32_t *seq_id);
    /* A new sequence holding a copy of (or sharing) parent's tokens. */
    int (*seq_fork)(kv_cache_t *kv, int32_t parent, int32_t *child);
    void (*seq_close)(kv_cache_t *kv, int32_t seq_id);
    int32_t (*seq_len)(const kv_cache_t *kv, int32_t seq_id);
    /* For an empty sequence about to be prefilled with tokens[0..n): attach
     * whatever leading part of it the cache already holds (prefix cache) and
     * return how many tokens that is; the caller prefills only the rest.
     * Always a multiple of the cache's page size and < n, so at least one
     * token is left to compute logits from. A cache without a prefix cache
     * returns 0. */
    int32_t (*seq_attach_prefix)(kv_cache_t *kv, int32_t seq_id, const int32_t *tokens, int32_t n);
    /* Make room for the batch's rows: all of it or nothing (KV_ENOSPC). */
    int (*begin_step)(kv_cache_t *kv, const kv_batch_t *batch);
    /* k, v: [rows][n_kv_heads][head_dim] fp32 for this layer, after RoPE.
     * Fails only on an inconsistent call (e.g. outside a step). */
    int (*append)(kv_cache_t *kv, int32_t layer, const float *k, const float *v);
    /* q: [rows][n_q_heads][head_dim] after RoPE; out: same shape. Causal. */
    int (*attend)(kv_cache_t *kv, int32_t layer, const float *q, float *out, float scale);
    /* The rows become part of their sequences (lengths advance). */
    void (*end_step)(kv_cache_t *kv);
    void (*stats)(const kv_cache_t *kv, kv_stats_t *out);
} kv_ops_t;

struct kv_cache {
    const kv_ops_t *ops;
    kv_shape_t shape;
    pool_t *pool; /* threads for attention; owned by the caller */
};

/* The contiguous fp32 reference cache. NULL on bad shape or no memory. */
kv_cache_t *kv_contig_create(const kv_shape_t *shape, pool_t *pool);
/* Its storage of one sequence and layer: [max_len][n_kv_heads][head_dim]
 * keys (is_v 0) or values; NULL for another cache or a bad id. For kv_sim. */
float *kv_contig_data(kv_cache_t *kv, int32_t seq_id, int32_t layer, int is_v);

/* Quantization experiments (kv_sim.c): the contiguous cache with its K/V
 * rounded as a paged int8/int4 cache would store them (fp16 tail page, each
 * full page quantized when it fills), in schemes libkvpage does not have,
 * so they can be measured before anyone builds them:
 * keys fp16, int8, int4 (per channel over the page, as libkvpage's int4_v1), int4wN
 * (int4, but the N channels of widest range in each page kept as int8),
 * int4sN (int4, but the first N tokens of the sequence kept in fp16);
 * values fp16, int8, int4 (as libkvpage's int4_v1), int4 values ending in sym
 * (symmetric, codes -7..7) and gN (N channels a group, not 32):
 * int4g16, int4hsymg16; int8/int4 keys or values with an
 * h (int4h, int4hwN, int8h) quantized in a randomized Hadamard basis
 * (head_dim a power of two); "+rN" at the end: the last N tokens stay
 * fp16. libkvpage's int4 is close to "int4w8/int4h" at head_dim 64 (its
 * rotation's signs differ). Spec "KEY/VALUE[@PAGE][+rN]". NULL with err on
 * a bad spec. */
kv_cache_t *kv_sim_create(const kv_shape_t *shape, pool_t *pool, const char *spec, char *err, size_t err_size);
int kv_sim_check(const char *spec, char *err, size_t err_size); /* 0, or -1 with err */
/* The rounded values it holds (as kv_contig_data), for tests. */
float *kv_sim_data(kv_cache_t *kv, int32_t seq_id, int32_t layer, int is_v);

/* The paged cache on libkvpage (kv_paged.c). Formats are kvp_format values
 * (KVP_FORMAT_FP32 = 0 ... KVP_FORMAT_INT4 = 5, see <kvpage.h>). */
typedef struct {
    int32_t k_format, v_format;
    int32_t page_size;    /* tokens per page (default 16; even for int4 keys) */
    int32_t prefix_cache; /* 1 (default): full pages stay cached for later prompts */
    int32_t threads;      /* the library's attention threads; 0 (default): the pool's count */
    int32_t decode_threads; /* ... in steps of one row per sequence (decode); 0 (default): 1 */
    int32_t k_order;      /* kvp_k_order of plain-format keys (default token-major) */
    int32_t isa;          /* kvp_isa of the attention kernels (default auto) */
    int64_t num_pages;    /* pool pages; 0 (default): max_seqs x ceil(max_len / page_size) */
    /* KV beyond the process (<kvpage_blob.h>). With an identity the cache can
     * export and import sequences (kv_paged_seq_export / _import); with
     * stores too, prompts are looked up in the pool, then in each store in
     * order (the longest chain of valid pages is imported), and pages are
     * written to them as `store_policy` says. */
    int has_identity;     /* 1: fingerprint is set (model_fingerprint()) */
    uint8_t fingerprint[KV_FINGERPRINT_BYTES];
    int32_t n_stores;     /* 0 .. KV_MAX_STORES; needs the identity and the prefix cache */
    const char *stores[KV_MAX_STORES]; /* specs, see kv_store_check() (the strings must outlive the cache) */
    int32_t store_policy; /* kvp_tier_policy flags; 0 (default): READ | WRITE_BACK | WRITE_THROUGH */
} kv_paged_opts_t;

void kv_paged_opts_init(kv_paged_opts_t *o); /* fp16/fp16, page 16, prefix cache on */
/* Parse a KV variant name into formats and page size: "fp32", "fp16",
 * "bf16", "fp8" (or "fp8_e4m3"), "int8", "int4", "int4_v1", "k8v4" (K int8, V int4),
 * "KFMT/VFMT" (e.g. "int4/fp16"), each optionally followed by "@PAGE"
 * ("int4@32"). Other fields of *o are left as they are. 0, or -1 with a
 * sentence in err. */
int kv_paged_parse(const char *spec, kv_paged_opts_t *o, char *err, size_t err_size);
/* NULL with the reason in err (the library's detail text) on failure. */
kv_cache_t *kv_paged_create(const kv_shape_t *shape, pool_t *pool, const kv_paged_opts_t *o, char *err,
                            size_t err_size);
/* The detail of the paged cache's last failed call, and its description
 * ("libkvpage paged int8/int8, page 16"). */
const char *kv_paged_last_error(const kv_cache_t *kv);
const char *kv_paged_name(const kv_cache_t *kv);

/* A KV store spec: "SCHEME:REST". Built in:
 *   "dir:PATH", a directory of page blobs, one file per page named by its
 *   chain hash (libkvpage's file tier; created if missing, its parent must
 *   exist; several processes may share it);
 *   "redis://[user[:password]@]host[:port][/db]" (several comma-separated:
 *   a sharded set, or a Cluster's nodes), a Redis or Valkey server shared by
 *   every process and machine that uses it (libkvpage's Redis tier; needs a
 *   build with hiredis). The password is better given in the environment,
 *   KVPAGE_REDIS_PASSWORD, with an ACL user in KVPAGE_REDIS_USER (both used
 *   for URIs that carry none), and the key prefix in KVPAGE_REDIS_PREFIX
 *   (default "kvp:").
 * Each has a queue tier in front, so the decode loop never waits for a disk
 * or the network to write. Any other scheme is refused, naming the ones
 * built in. 0, or -1 with a sentence in err (passwords masked). */
int kv_store_check(const char *spec, char *err, size_t err_size);
/* "read,write-back,write-through" (any non-empty subset, comma-separated)
 * into kvp_tier_policy flags. 0, or -1 with a sentence in err. */
int kv_store_policy_parse(const char *list, int32_t *policy, char *err, size_t err_size);
/* Write pending write-through pages to the stores now (kvp_cache_flush)
 * and wait for the queues in front of them to be written (or refused), so
 * that the counters are final; destroy does it too. 0 or a KV_E* code. */
int kv_paged_flush(kv_cache_t *kv);
/* Export sequence seq (n tokens, all of it) as consecutive page blobs
 * (kvp_cache_seq_export); *buf is malloc'ed. Needs the identity. 0, or a
 * KV_E* code with the detail in kv_paged_last_error(). */
int kv_paged_seq_export(kv_cache_t *kv, int32_t seq, const int32_t *tokens, int32_t n, void **buf,
                        uint64_t *bytes);
/* Import such an export into the empty sequence seq (kvp_cache_seq_import):
 * every blob is validated against this cache's identity, layout and the
 * chain hashes of `tokens`; all or nothing. */
int kv_paged_seq_import(kv_cache_t *kv, int32_t seq, const int32_t *tokens, int32_t n, const void *buf,
                        uint64_t bytes);

#endif
