/*
 * Formats and the one byte-count function: what a page of each format holds.
 * The planner, the pool and the page arena all size memory from here.
 */
#include "internal.h"

#include <string.h>

static const char *const format_names[KVP_FORMAT_COUNT] = {
    "fp32", "fp16", "bf16", "fp8_e4m3", "int8", "int4_v1", "int4",
};

const char *kvp_format_name(int32_t format) {
    return kvp__format_valid(format) ? format_names[format] : NULL;
}

int kvp_format_parse(const char *name, int32_t *format, char *err,
                     size_t err_size) {
    if (name == NULL || format == NULL)
        return kvp__errf(err, err_size, KVP_EINVAL, "format name or output is NULL");
    for (int32_t f = 0; f < KVP_FORMAT_COUNT; f++) {
        if (kvp__strcasecmp(name, format_names[f]) == 0) {
            *format = f;
            return KVP_OK;
        }
    }
    if (kvp__strcasecmp(name, "fp8") == 0) {
        *format = KVP_FORMAT_FP8_E4M3;
        return KVP_OK;
    }
    return kvp__errf(err, err_size, KVP_EINVAL,
                     "unknown format '%.64s' (known: fp32 fp16 bf16 fp8_e4m3 int8 int4 int4_v1)",
                     name);
}

int kvp__format_bits(int32_t f) {
    switch (f) {
    case KVP_FORMAT_FP32: return 32;
    case KVP_FORMAT_FP16:
    case KVP_FORMAT_BF16: return 16;
    case KVP_FORMAT_FP8_E4M3:
    case KVP_FORMAT_INT8: return 8;
    case KVP_FORMAT_INT4_V1:
    case KVP_FORMAT_INT4: return 4;
    default: return 0;
    }
}

/* Elements of one (page, layer, kv head) block plus its scale data, before
 * padding. Scales and minimums are fp16 (2 bytes each):
 *   K int8/int4: scale + min per channel (head_dim pairs) over the page;
 *   K int4 also: R = 4*ceil(head_dim/32) (int4_v1: head_dim/32) outlier channels kept as int8:
 *                an index (u16), scale and min (fp16) each, then R x page_size codes;
 *   V int8:      one scale per token;
 *   V int4:      scale + min per token per group of 32 along head_dim. */
uint64_t kvp__block_bytes(int32_t f, bool is_key, uint64_t page_size, uint64_t head_dim) {
    uint64_t elems = page_size * head_dim;
    uint64_t data = elems * (uint64_t)kvp__format_bits(f) / 8;
    uint64_t groups = (head_dim + 31) / 32;
    uint64_t outliers = (uint64_t)kvp__k4_outliers(f, (int32_t)head_dim);
    switch (f) {
    case KVP_FORMAT_INT8:
        return is_key ? data + head_dim * 4 : data + page_size * 2;
    case KVP_FORMAT_INT4_V1:
    case KVP_FORMAT_INT4:
        return is_key ? data + head_dim * 4 + outliers * (6 + page_size)
                      : data + page_size * groups * 4;
    default: return data;
    }
}

int kvp_layout_compute(int32_t layers, int32_t kv_heads, int32_t head_dim,
                       int32_t page_size, int32_t k_format, int32_t v_format,
                       kvp_layout_t *out, char *err, size_t err_size) {
    int rc = kvp__check_struct(out, sizeof(kvp_layout_t), "layout", err, err_size);
    if (rc != KVP_OK) return rc;
    if (layers < 1 || layers > 65536)
        return kvp__errf(err, err_size, KVP_EINVAL, "layers must be 1..65536, got %d",
                         (int)layers);
    if (kv_heads < 1 || kv_heads > 65536)
        return kvp__errf(err, err_size, KVP_EINVAL, "kv_heads must be 1..65536, got %d",
                         (int)kv_heads);
    if (head_dim < 8 || head_dim > KVP_MAX_HEAD_DIM || head_dim % 8 != 0)
        return kvp__errf(err, err_size, KVP_EINVAL,
                         "head_dim must be a multiple of 8 in 8..%d, got %d",
                         KVP_MAX_HEAD_DIM, (int)head_dim);
    if (page_size < 1 || page_size > KVP_MAX_PAGE_SIZE)
        return kvp__errf(err, err_size, KVP_EINVAL, "page_size must be 1..%d, got %d",
                         KVP_MAX_PAGE_SIZE, (int)page_size);
    if (!kvp__format_valid(k_format))
        return kvp__errf(err, err_size, KVP_EINVAL, "unknown K format %d", (int)k_format);
    if (!kvp__format_valid(v_format))
        return kvp__errf(err, err_size, KVP_EINVAL, "unknown V format %d", (int)v_format);
    if (kvp__format_is_int4(k_format) && page_size % 2 != 0)
        return kvp__errf(err, err_size, KVP_EINVAL,
                         "int4 keys pack two tokens per byte: page_size must be even, got %d",
                         (int)page_size);

    kvp_layout_t l;
    memset(&l, 0, sizeof l);
    l.struct_size = sizeof l;
    l.layers = layers;
    l.kv_heads = kv_heads;
    l.head_dim = head_dim;
    l.page_size = page_size;
    l.k_format = k_format;
    l.v_format = v_format;
    l.needs_staging = kvp__format_k_needs_staging(k_format) ? 1 : 0;
    l.k_block_bytes = kvp__round_up_u64(
        kvp__block_bytes(k_format, true, (uint64_t)page_size, (uint64_t)head_dim),
        KVP_BLOCK_ALIGN);
    l.v_block_bytes = kvp__round_up_u64(
        kvp__block_bytes(v_format, false, (uint64_t)page_size, (uint64_t)head_dim),
        KVP_BLOCK_ALIGN);

    /* layers, kv_heads <= 2^16 and blocks <= 2^25 bytes: these products fit,
     * but keep the checks so a future widening of the limits stays safe. */
    uint64_t lh, per_page;
    if (!kvp__mul_u64((uint64_t)layers, (uint64_t)kv_heads, &lh) ||
        !kvp__mul_u64(lh, l.k_block_bytes + l.v_block_bytes, &per_page))
        return kvp__errf(err, err_size, KVP_EINVAL, "page size in bytes overflows 64 bits");
    l.page_bytes = per_page;
    if (l.needs_staging) {
        /* fp16 K and V of every layer and head for page_size tokens */
        uint64_t tok = (uint64_t)page_size * (uint64_t)head_dim * 2u * 2u;
        if (!kvp__mul_u64(lh, tok, &l.staging_page_bytes))
            return kvp__errf(err, err_size, KVP_EINVAL,
                             "staging page size in bytes overflows 64 bits");
    }
    uint64_t fixed = 0;
    if (k_format == KVP_FORMAT_FP8_E4M3) fixed += lh * 4u;
    if (v_format == KVP_FORMAT_FP8_E4M3) fixed += lh * 4u;
    l.fixed_bytes = kvp__round_up_u64(fixed, KVP_ARENA_ALIGN);
    l.element_bytes_per_token =
        lh * (uint64_t)head_dim *
        (uint64_t)(kvp__format_bits(k_format) + kvp__format_bits(v_format)) / 8;
    l.bytes_per_token = (double)l.page_bytes / (double)page_size;
    kvp__copy_out(out, &l, sizeof l);
    return KVP_OK;
}

int kvp_arena_bytes(const kvp_layout_t *layout, uint64_t num_pages,
                    uint64_t num_staging, uint64_t *bytes, char *err,
                    size_t err_size) {
    int rc = kvp__check_struct(layout, sizeof(kvp_layout_t), "layout", err, err_size);
    if (rc != KVP_OK) return rc;
    if (bytes == NULL) return kvp__errf(err, err_size, KVP_EINVAL, "bytes is NULL");
    if (layout->page_bytes == 0 || layout->page_size < 1)
        return kvp__errf(err, err_size, KVP_EINVAL,
                         "layout is not initialised (use kvp_layout_compute)");
    uint64_t pages, staging = 0, total;
    if (!kvp__mul_u64(num_pages, layout->page_bytes, &pages))
        return kvp__errf(err, err_size, KVP_EINVAL,
                         "%llu pages of %llu bytes overflow 64 bits",
                         (unsigned long long)num_pages,
                         (unsigned long long)layout->page_bytes);
    if (layout->needs_staging &&
        !kvp__mul_u64(num_staging, layout->staging_page_bytes, &staging))
        return kvp__errf(err, err_size, KVP_EINVAL,
                         "%llu staging pages overflow 64 bits",
                         (unsigned long long)num_staging);
    if (!kvp__add_u64(layout->fixed_bytes, pages, &total) ||
        !kvp__add_u64(total, staging, &total))
        return kvp__errf(err, err_size, KVP_EINVAL, "arena size overflows 64 bits");
    *bytes = total;
    return KVP_OK;
}
