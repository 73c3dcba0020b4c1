/*
 * Internal CUDA helpers for the benchmark (bench/attention_cuda.c), so tools
 * written in C need neither CUDA headers nor the toolkit to build: device
 * memory, copies, event timing, the copy-bandwidth probe, and the
 * contiguous-layout attention baseline. Implemented in cuda/util.cu; in a
 * CPU-only build lib/cuda_stub.c returns KVP_ENOTSUP. Not installed.
 */
#ifndef KVPAGE_CUDA_UTIL_H
#define KVPAGE_CUDA_UTIL_H

#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* cudaMalloc on `device` (made current). */
int kvp__cuda_malloc(int32_t device, uint64_t bytes, void **ptr, char *err, size_t err_size);
void kvp__cuda_free(int32_t device, void *ptr);
/* Synchronous copy; kind 0: host to device, 1: device to host, 2: device to device. */
int kvp__cuda_memcpy(void *dst, const void *src, uint64_t bytes, int kind, char *err,
                     size_t err_size);
/* Device-to-device copy of `bytes` bytes, timed with events (median of
 * `reps`); *gbps counts bytes read plus bytes written (2 x bytes), the
 * usual convention for a copy's bandwidth. */
int kvp__cuda_copy_bandwidth(int32_t device, uint64_t bytes, int reps, double *gbps, char *err,
                             size_t err_size);
/* Time fn(arg) on `stream` with events: one warm-up, then `reps` timed
 * calls; *seconds is their median. fn returns a kvp status. */
int kvp__cuda_time(void *stream, int (*fn)(void *), void *arg, int reps, double *seconds,
                   char *err, size_t err_size);

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
