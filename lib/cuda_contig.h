/*
 * The CUDA backend's contiguous-layout attention, the baseline that
 * kvpage-bench attention --device cuda compares paged attention with.
 *
 * It stays in the library because it is the backend's own launch path
 * (cuda/attention.cu: the schedule, the workspace and the kernels, which
 * read a contiguous cache when a call has no page indices); the rest of
 * the benchmark's CUDA helpers live in bench/cuda_bench.cu. Internal: not
 * installed, not exported from the shared library, and not in a CPU-only
 * build (kvpage-bench then brings a stub: bench/cuda_bench_stub.c).
 */
#ifndef KVPAGE_CUDA_CONTIG_H
#define KVPAGE_CUDA_CONTIG_H

#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The same K/V blocks as a store's, laid end to end per (sequence, kv head):
 * block of (b, h, page j) at base + ((b*kv_heads + h)*pages + j) * block. */
typedef struct {
    const void *k, *v;          /* device memory */
    uint64_t k_block, v_block;  /* bytes per block (the layout's k/v_block_bytes) */
    int32_t k_format, v_format, k_order;
    int32_t page_size, head_dim;
    int32_t batch, kv_heads, pages, kv_len;
    int32_t q_heads;
    float sm_scale;
} kvp__cuda_contig;

/* Decode attention (one fp32 query row per sequence, [batch][q_heads][D] in
 * device memory) over a contiguous cache with the paged kernels, on a CUDA
 * context's stream. */
int kvp__cuda_attention_contig(kvp_ctx_t *ctx, const kvp__cuda_contig *kv, const float *q,
                               float *out);

#ifdef __cplusplus
}
#endif

#endif
