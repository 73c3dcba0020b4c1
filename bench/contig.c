/*
 * The contiguous-layout baseline (contig.h): a store view with contiguous
 * strides, so that kvp_attention reads the blocks where a contiguous cache
 * keeps them.
 */
#include "contig.h"

uint64_t bench_contig_copy_bytes(const kvp_store_t *like, int32_t batch, int32_t pages) {
    uint64_t blocks = (uint64_t)batch * (uint64_t)like->layout.kv_heads * (uint64_t)pages;
    return blocks * (like->layout.k_block_bytes + like->layout.v_block_bytes);
}

void bench_contig_view(const kvp_store_t *like, const bench_contig *c, kvp_store_t *s,
                       kvp_kv_view_t *view, int32_t *indptr, int32_t *indices, int32_t *last) {
    const kvp_layout_t *l = &like->layout;
    int32_t H = l->kv_heads, P = l->page_size;
    *s = *like; /* formats, scale tables, backend, error text: the store's */
    s->arena = c->base;
    s->num_pages = c->batch * H * c->pages;
    s->num_staging = 0;
    s->pool_offset = 0;
    s->page_stride_k = l->k_block_bytes; /* a sequence's pages of one head, end to end */
    s->page_stride_v = l->v_block_bytes;
    s->head_stride_k = (uint64_t)c->pages * l->k_block_bytes; /* then the next head's */
    s->head_stride_v = (uint64_t)c->pages * l->v_block_bytes;
    s->layer_bytes = c->k_bytes + c->v_bytes; /* copy after copy */
    s->slayer_bytes = 0;
    s->staging_offset = 0;
    for (int32_t b = 0; b <= c->batch; b++) indptr[b] = b * c->pages;
    for (int32_t b = 0; b < c->batch; b++) {
        for (int32_t j = 0; j < c->pages; j++) indices[b * c->pages + j] = b * H * c->pages + j;
        last[b] = P;
    }
    kvp_kv_view_t v = {sizeof v, c->batch, P, s->num_pages, 0, 0, indptr, indices, last};
    *view = v;
}
