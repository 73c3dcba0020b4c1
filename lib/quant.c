/*
 * Quantize / dequantize plain tensors into store-identical blocks, for
 * engines that keep their own storage.
 */
#include "blockfmt.h"
#include "cpu/cpu.h"

#include <string.h>

static int check_desc(const kvp_quant_desc_t *q, kvp__blockfmt *f, uint64_t *block, char *err,
                      size_t err_size) {
    int rc = kvp__check_struct(q, sizeof *q, "desc", err, err_size);
    if (rc != KVP_OK) return rc;
    if (q->is_value != 0 && q->is_value != 1)
        return kvp__errf(err, err_size, KVP_EINVAL, "is_value must be 0 or 1, got %d",
                         (int)q->is_value);
    if (q->k_order != KVP_K_ORDER_TOKEN_MAJOR && q->k_order != KVP_K_ORDER_DIM_MAJOR)
        return kvp__errf(err, err_size, KVP_EINVAL, "k_order must be 0 or 1, got %d",
                         (int)q->k_order);
    if (q->heads < 1 || q->heads > 65536)
        return kvp__errf(err, err_size, KVP_EINVAL, "heads must be 1..65536, got %d", (int)q->heads);
    if (kvp__dtype_size(q->dtype) == 0)
        return kvp__errf(err, err_size, KVP_EINVAL, "dtype %d: tensors must be fp32, fp16 or bf16",
                         (int)q->dtype);
    rc = kvp__check_reserved(q->reserved_, "desc", err, err_size);
    if (rc != KVP_OK) return rc;
    /* the layout function checks head_dim, page size and format rules */
    kvp_layout_t l;
    memset(&l, 0, sizeof l);
    l.struct_size = sizeof l;
    int32_t kf = q->is_value ? KVP_FORMAT_FP16 : q->format;
    int32_t vf = q->is_value ? q->format : KVP_FORMAT_FP16;
    rc = kvp_layout_compute(1, 1, q->head_dim, q->page_size, kf, vf, &l, err, err_size);
    if (rc != KVP_OK) return rc;
    if (q->format == KVP_FORMAT_FP8_E4M3 && (!(q->fp8_scale > 0.0f) || !isfinite(q->fp8_scale)))
        return kvp__errf(err, err_size, KVP_EINVAL, "fp8_e4m3 needs a finite fp8_scale > 0, got %g",
                         (double)q->fp8_scale);
    *f = kvp__blockfmt_make(q->format, !q->is_value, q->k_order, q->page_size, q->head_dim);
    *block = q->is_value ? l.v_block_bytes : l.k_block_bytes;
    return KVP_OK;
}

int kvp_quant_block_bytes(const kvp_quant_desc_t *desc, uint64_t *bytes, char *err,
                          size_t err_size) {
    kvp__blockfmt f;
    uint64_t block;
    int rc = check_desc(desc, &f, &block, err, err_size);
    if (rc != KVP_OK) return rc;
    if (bytes == NULL) return kvp__errf(err, err_size, KVP_EINVAL, "bytes is NULL");
    *bytes = block;
    return KVP_OK;
}

/* Shared checks of both directions (and of the CUDA backend's
 * kvp_cuda_quantize / kvp_cuda_dequantize); returns the block format and size. */
int kvp__quant_check(const kvp_quant_desc_t *q, const void *src, int64_t pages, void *dst,
                      kvp__blockfmt *f, uint64_t *block, char *err, size_t err_size) {
    int rc = check_desc(q, f, block, err, err_size);
    if (rc != KVP_OK) return rc;
    if (src == NULL || dst == NULL) return kvp__errf(err, err_size, KVP_EINVAL, "src or dst is NULL");
    if (pages < 1) return kvp__errf(err, err_size, KVP_EINVAL, "pages must be >= 1, got %lld",
                                    (long long)pages);
    /* both sides' byte counts: the blocks, and the tensor of
     * pages x page_size x heads x head_dim elements */
    uint64_t total, elems;
    if (!kvp__mul_u64((uint64_t)pages, (uint64_t)q->heads, &total) ||
        !kvp__mul_u64(total, *block, &total) || total > PTRDIFF_MAX ||
        !kvp__mul_u64((uint64_t)pages * (uint64_t)q->heads, /* <= total: no overflow */
                      (uint64_t)q->page_size * (uint64_t)q->head_dim * kvp__dtype_size(q->dtype),
                      &elems) ||
        elems > PTRDIFF_MAX)
        return kvp__errf(err, err_size, KVP_EINVAL, "%lld pages overflow the address space",
                         (long long)pages);
    return KVP_OK;
}

/* One page of one head as fp32 rows [P][D] (scratch on the stack when small). */
int kvp_quantize(const kvp_quant_desc_t *q, const void *src, int64_t pages, void *dst, char *err,
                 size_t err_size) {
    kvp__blockfmt f;
    uint64_t block;
    int rc = kvp__quant_check(q, src, pages, dst, &f, &block, err, err_size);
    if (rc != KVP_OK) return rc;
    size_t P = (size_t)q->page_size, D = (size_t)q->head_dim, H = (size_t)q->heads;
    size_t es = kvp__dtype_size(q->dtype);
    const kvp__enc_prims *enc = kvp__pick_enc(kvp__cpu_best_isa());
    float *rows = (float *)kvp__malloc(NULL, P * D * sizeof(float), 64);
    if (rows == NULL) return kvp__errf(err, err_size, KVP_ENOMEM, "cannot allocate one page of rows");
    for (int64_t pg = 0; pg < pages; pg++)
        for (size_t h = 0; h < H; h++) {
            for (size_t t = 0; t < P; t++) {
                size_t at = (((size_t)pg * P + t) * H + h) * D;
                kvp__load_f32(q->dtype, (const uint8_t *)src + at * es, D, rows + t * D);
            }
            uint8_t *b = (uint8_t *)dst + ((size_t)pg * H + h) * (size_t)block;
            kvp__encode(enc, &f, b, 0, (int)P, rows, D, q->fp8_scale);
        }
    kvp__free(NULL, rows);
    return KVP_OK;
}

int kvp_dequantize(const kvp_quant_desc_t *q, const void *src, int64_t pages, void *dst, char *err,
                   size_t err_size) {
    kvp__blockfmt f;
    uint64_t block;
    int rc = kvp__quant_check(q, src, pages, dst, &f, &block, err, err_size);
    if (rc != KVP_OK) return rc;
    size_t P = (size_t)q->page_size, D = (size_t)q->head_dim, H = (size_t)q->heads;
    size_t es = kvp__dtype_size(q->dtype);
    float row[KVP_MAX_HEAD_DIM];
    for (int64_t pg = 0; pg < pages; pg++)
        for (size_t h = 0; h < H; h++) {
            const uint8_t *b = (const uint8_t *)src + ((size_t)pg * H + h) * (size_t)block;
            for (size_t t = 0; t < P; t++) {
                kvp__block_read(&f, b, (int)t, 1, row, D, q->fp8_scale);
                size_t at = (((size_t)pg * P + t) * H + h) * D;
                kvp__store_f32(q->dtype, row, D, (uint8_t *)dst + at * es);
            }
        }
    return KVP_OK;
}
