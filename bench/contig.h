/*
 * The contiguous-layout baseline of kvpage-bench attention: the same K/V
 * blocks as a store's, laid end to end per (sequence, kv head) as a
 * contiguous KV cache holds them, read by the library's own attention
 * (kvp_attention: the same driver, schedule and kernels) through a view of
 * the store whose strides describe that layout. So "paged ÷ contiguous"
 * compares the two layouts and nothing else, and stays true as the driver
 * changes.
 */
#ifndef KVPAGE_BENCH_CONTIG_H
#define KVPAGE_BENCH_CONTIG_H

#include "backend.h"

/* The contiguous cache of `copies` layers: copy l holds its K blocks
 * [batch][kv_heads][pages] end to end, then its V blocks likewise. */
typedef struct {
    uint8_t *base;          /* the copies, end to end */
    uint64_t k_bytes, v_bytes; /* one copy's K blocks, V blocks */
    int32_t batch, pages;   /* pages per sequence (all full) */
} bench_contig;

/* Bytes of one copy for `like`'s block sizes. */
uint64_t bench_contig_copy_bytes(const kvp_store_t *like, int32_t batch, int32_t pages);

/* A view of `like` (same formats, fp8 scales, backend) whose arena is the
 * contiguous cache: its page ids b*kv_heads*pages + j are sequence b's j-th
 * page, in every layer l < copies. `view` (struct_size set, arrays of
 * batch+1, batch*pages and batch entries) lists them. */
void bench_contig_view(const kvp_store_t *like, const bench_contig *c, kvp_store_t *store,
                       kvp_kv_view_t *view, int32_t *indptr, int32_t *indices, int32_t *last);

#endif
