/*
 * Store: the page arena (public API front end). Validates every argument,
 * keeps the error text, and hands checked work to the store's backend.
 * Arena order (docs/formats.md): fixed region (fp8 scale tables) | pool
 * pages, per layer [K region: page x kv_head blocks][V region] | staging
 * pages, per layer [K][V].
 */
#include "backend.h"

#include <stdio.h>
#include <string.h>

#define STORE_ERR(s, status, ...) kvp__errf((s)->error, KVP__STORE_ERR_SIZE, status, __VA_ARGS__)

void kvp_store_params_init(kvp_store_params_t *p) {
    if (p == NULL) return;
    memset(p, 0, sizeof *p);
    p->struct_size = sizeof *p;
    p->page_size = 16;
    p->k_format = KVP_FORMAT_FP16;
    p->v_format = KVP_FORMAT_FP16;
    p->k_order = KVP_K_ORDER_TOKEN_MAJOR;
}

static void store_init_geometry(kvp_store_t *s) {
    const kvp_layout_t *l = &s->layout;
    uint64_t H = (uint64_t)l->kv_heads, P = (uint64_t)l->page_size, D = (uint64_t)l->head_dim;
    s->kfmt = kvp__blockfmt_make(l->k_format, 1, s->k_order, l->page_size, l->head_dim);
    s->vfmt = kvp__blockfmt_make(l->v_format, 0, KVP_K_ORDER_TOKEN_MAJOR, l->page_size, l->head_dim);
    s->skfmt = kvp__blockfmt_make(KVP_FORMAT_FP16, 1, s->k_order, l->page_size, l->head_dim);
    s->svfmt = kvp__blockfmt_make(KVP_FORMAT_FP16, 0, KVP_K_ORDER_TOKEN_MAJOR, l->page_size,
                                  l->head_dim);
    /* staged values in the pool's basis: attention reads both alike, and a
     * seal quantizes the staged rows as they are */
    s->svfmt.rot = s->vfmt.rot;
    s->page_stride_k = H * l->k_block_bytes;
    s->page_stride_v = H * l->v_block_bytes;
    s->head_stride_k = l->k_block_bytes;
    s->head_stride_v = l->v_block_bytes;
    s->spage_stride_k = l->needs_staging ? H * P * D * 2 : 0;
    s->spage_stride_v = s->spage_stride_k;
    s->layer_bytes = (uint64_t)s->num_pages * (s->page_stride_k + s->page_stride_v);
    s->slayer_bytes = (uint64_t)s->num_staging * (s->spage_stride_k + s->spage_stride_v);
    s->pool_offset = l->fixed_bytes;
    s->staging_offset = s->pool_offset + (uint64_t)l->layers * s->layer_bytes;
}

static int check_store_params(const kvp_store_params_t *p, kvp_layout_t *layout, char *err,
                              size_t err_size) {
    int rc = kvp__check_struct(p, sizeof *p, "params", err, err_size);
    if (rc != KVP_OK) return rc;
    rc = kvp__allocator_check(&p->allocator, err, err_size);
    if (rc != KVP_OK) return rc;
    if (p->k_order != KVP_K_ORDER_TOKEN_MAJOR && p->k_order != KVP_K_ORDER_DIM_MAJOR)
        return kvp__errf(err, err_size, KVP_EINVAL, "k_order must be 0 (token-major) or 1 "
                         "(dim-major), got %d", (int)p->k_order);
    memset(layout, 0, sizeof *layout);
    layout->struct_size = sizeof *layout;
    rc = kvp_layout_compute(p->layers, p->kv_heads, p->head_dim, p->page_size, p->k_format,
                            p->v_format, layout, err, err_size);
    if (rc != KVP_OK) return rc;
    if (p->num_pages < 1)
        return kvp__errf(err, err_size, KVP_EINVAL, "num_pages must be >= 1");
    uint64_t staging = layout->needs_staging ? p->num_staging : 0;
    if (layout->needs_staging && staging < 1)
        return kvp__errf(err, err_size, KVP_EINVAL,
                         "%s keys need fp16 staging pages: num_staging must be >= 1 "
                         "(one per active sequence)", kvp_format_name(p->k_format));
    if (p->num_pages > INT32_MAX || staging > (uint64_t)INT32_MAX - p->num_pages)
        return kvp__errf(err, err_size, KVP_EINVAL,
                         "num_pages + num_staging must be below 2^31 (page ids are int32)");
    return KVP_OK;
}

int kvp__store_create(const kvp_store_params_t *params, const kvp__backend *backend,
                      const void *bparams, kvp_store_t **out, char *err, size_t err_size) {
    kvp_layout_t layout;
    int rc = check_store_params(params, &layout, err, err_size);
    if (rc != KVP_OK) return rc;
    if (out == NULL) return kvp__errf(err, err_size, KVP_EINVAL, "out is NULL");
    uint64_t staging = layout.needs_staging ? params->num_staging : 0, bytes;
    rc = kvp_arena_bytes(&layout, params->num_pages, staging, &bytes, err, err_size);
    if (rc != KVP_OK) return rc;
    if (bytes > SIZE_MAX)
        return kvp__errf(err, err_size, KVP_EINVAL, "arena of %llu bytes exceeds the address space",
                         (unsigned long long)bytes);

    const kvp_allocator_t *a = &params->allocator;
    kvp_store_t *s = (kvp_store_t *)kvp__calloc(a, 1, sizeof *s, 64);
    if (s == NULL) return kvp__errf(err, err_size, KVP_ENOMEM, "cannot allocate the store");
    s->allocator = *a;
    s->error = s->error_text;
    s->backend = backend;
    s->device = -1;
    s->layout = layout;
    s->k_order = params->k_order;
    s->num_pages = (int32_t)params->num_pages;
    s->num_staging = (int32_t)staging;
    s->arena_bytes = bytes;
    store_init_geometry(s);
    size_t P = (size_t)layout.page_size, D = (size_t)layout.head_dim;
    s->scratch = (float *)kvp__malloc(a, P * D * sizeof(float), 64);
    if (s->scratch == NULL) {
        rc = kvp__errf(err, err_size, KVP_ENOMEM, "cannot allocate the store's scratch rows");
        goto fail;
    }
    rc = s->backend->arena_alloc(s, bparams, err, err_size);
    if (rc != KVP_OK) goto fail;
    *out = s;
    return KVP_OK;
fail:
    kvp__free(a, s->scratch);
    kvp__free(a, s);
    return rc;
}

int kvp_store_create(const kvp_store_params_t *params, kvp_store_t **out, char *err,
                     size_t err_size) {
    return kvp__store_create(params, &kvp__cpu_backend, NULL, out, err, err_size);
}

void kvp_store_destroy(kvp_store_t *s) {
    if (s == NULL) return;
    kvp_allocator_t a = s->allocator;
    s->backend->store_fini(s);
    kvp__free(&a, s->scratch);
    kvp__free(&a, s);
}

const char *kvp_store_last_error(const kvp_store_t *s) {
    return s == NULL ? KVP__NULL_HANDLE : s->error;
}

int kvp_store_layout(const kvp_store_t *s, kvp_layout_t *out) {
    if (s == NULL) return KVP_EINVAL;
    int rc = kvp__check_struct(out, sizeof *out, "layout", NULL, 0);
    if (rc != KVP_OK) return STORE_ERR(s, rc, "layout is NULL or too small");
    kvp__copy_out(out, &s->layout, sizeof s->layout);
    return KVP_OK;
}

int kvp_store_info(const kvp_store_t *s, kvp_store_info_t *info) {
    if (s == NULL) return KVP_EINVAL;
    int rc = kvp__check_struct(info, sizeof *info, "info", s->error, KVP__STORE_ERR_SIZE);
    if (rc != KVP_OK) return rc;
    kvp_store_info_t r = {sizeof r, s->backend->id, s->device, s->k_order, s->num_pages,
                          s->num_staging, s->arena, s->arena_bytes};
    kvp__copy_out(info, &r, sizeof r);
    return KVP_OK;
}

int kvp_store_region(const kvp_store_t *cs, int32_t layer, int32_t kind, kvp_region_t *out) {
    if (cs == NULL) return KVP_EINVAL;
    const kvp_store_t *s = cs;
    int rc = kvp__check_struct(out, sizeof *out, "region", s->error, KVP__STORE_ERR_SIZE);
    if (rc != KVP_OK) return rc;
    if (layer < 0 || layer >= s->layout.layers)
        return STORE_ERR(s, KVP_EINVAL, "layer %d out of range 0..%d", (int)layer,
                         (int)s->layout.layers - 1);
    if (kind < KVP_REGION_K || kind > KVP_REGION_STAGING_V)
        return STORE_ERR(s, KVP_EINVAL, "region kind %d is not a kvp_region_kind", (int)kind);
    kvp__layer_offsets o = kvp__store_layer(s, layer);
    bool staging = kind >= KVP_REGION_STAGING_K, key = kind == KVP_REGION_K ||
                                                       kind == KVP_REGION_STAGING_K;
    const kvp__blockfmt *f = staging ? (key ? &s->skfmt : &s->svfmt) : (key ? &s->kfmt : &s->vfmt);
    uint64_t pages = staging ? (uint64_t)s->num_staging : (uint64_t)s->num_pages;
    uint64_t stride = staging ? (key ? s->spage_stride_k : s->spage_stride_v)
                              : (key ? s->page_stride_k : s->page_stride_v);
    uint64_t off = staging ? (key ? o.sk_offset : o.sv_offset) : (key ? o.k_offset : o.v_offset);
    kvp_region_t r;
    memset(&r, 0, sizeof r);
    r.struct_size = sizeof r;
    r.format = f->format;
    r.order = kvp__blockfmt_dim_major(f) ? KVP_K_ORDER_DIM_MAJOR : KVP_K_ORDER_TOKEN_MAJOR;
    r.first_page = staging ? s->num_pages : 0;
    r.base = pages > 0 ? s->arena + off : NULL;
    r.pages = pages;
    r.page_stride = stride;
    r.head_stride = stride / (uint64_t)s->layout.kv_heads;
    r.block_bytes = r.head_stride;
    r.scale_offset = kvp__block_data_bytes(f);
    if (kvp__format_is_plain(f->format)) {
        uint64_t es = (uint64_t)kvp__plain_size(f->format);
        bool dm = kvp__blockfmt_dim_major(f);
        r.token_stride = dm ? es : es * (uint64_t)f->head_dim;
        r.dim_stride = dm ? es * (uint64_t)f->page_size : es;
    }
    kvp__copy_out(out, &r, sizeof r);
    return KVP_OK;
}

/* ---- fp8 scales -------------------------------------------------------------- */

static int check_fp8_target(const kvp_store_t *s, int32_t layer, int32_t h, int32_t is_value) {
    if (layer < 0 || layer >= s->layout.layers)
        return STORE_ERR(s, KVP_EINVAL, "layer %d out of range 0..%d", (int)layer,
                         (int)s->layout.layers - 1);
    if (h < 0 || h >= s->layout.kv_heads)
        return STORE_ERR(s, KVP_EINVAL, "kv_head %d out of range 0..%d", (int)h,
                         (int)s->layout.kv_heads - 1);
    if (is_value != 0 && is_value != 1)
        return STORE_ERR(s, KVP_EINVAL, "is_value must be 0 or 1, got %d", (int)is_value);
    int32_t f = is_value ? s->layout.v_format : s->layout.k_format;
    if (f != KVP_FORMAT_FP8_E4M3)
        return STORE_ERR(s, KVP_EINVAL, "%s are stored as %s, not fp8_e4m3: no scale to set",
                         is_value ? "values" : "keys", kvp_format_name(f));
    return KVP_OK;
}

int kvp_store_set_fp8_scale(kvp_store_t *s, int32_t layer, int32_t h, int32_t is_value,
                            float scale) {
    if (s == NULL) return KVP_EINVAL;
    int rc = check_fp8_target(s, layer, h, is_value);
    if (rc != KVP_OK) return rc;
    if (!(scale >= 0.0f) || !isfinite(scale))
        return STORE_ERR(s, KVP_EINVAL, "fp8 scale must be finite and >= 0, got %g", (double)scale);
    rc = s->backend->set_fp8_scale(s, is_value, layer, h, scale, s->error, KVP__STORE_ERR_SIZE);
    return rc;
}

int kvp_store_get_fp8_scale(const kvp_store_t *cs, int32_t layer, int32_t h, int32_t is_value,
                            float *scale) {
    if (cs == NULL) return KVP_EINVAL;
    const kvp_store_t *s = cs;
    if (scale == NULL) return STORE_ERR(s, KVP_EINVAL, "scale is NULL");
    int rc = check_fp8_target(s, layer, h, is_value);
    if (rc != KVP_OK) return rc;
    rc = s->backend->get_fp8_scale(s, is_value, layer, h, scale, s->error, KVP__STORE_ERR_SIZE);
    return rc;
}

int kvp_store_nonfinite_count(kvp_store_t *s, uint64_t *count) {
    if (s == NULL) return KVP_EINVAL;
    if (count == NULL) return STORE_ERR(s, KVP_EINVAL, "count is NULL");
    uint64_t n = 0;
    int rc = s->backend->nonfinite(s, &n, s->error, KVP__STORE_ERR_SIZE);
    if (rc == KVP_OK) *count = n;
    return rc;
}

/* ---- page ids and operations -------------------------------------------------- */

static bool is_pool(const kvp_store_t *s, int64_t p) { return p >= 0 && p < s->num_pages; }
static bool is_staging(const kvp_store_t *s, int64_t p) {
    return p >= s->num_pages && p < (int64_t)s->num_pages + s->num_staging;
}

/* Check one SEAL against the append's rows and slots. */
static int check_seal(kvp_store_t *s, const kvp_append_params_t *a, int i, const kvp_page_op_t *op) {
    int32_t P = s->layout.page_size;
    if (!s->layout.needs_staging)
        return STORE_ERR(s, KVP_EINVAL, "ops[%d]: SEAL in a layout without staging pages "
                         "(%s keys)", i, kvp_format_name(s->layout.k_format));
    if (!is_pool(s, op->dst))
        return STORE_ERR(s, KVP_EINVAL, "ops[%d]: SEAL dst %d is not a pool page (0..%d)", i,
                         (int)op->dst, (int)s->num_pages - 1);
    if (op->count < 0 || op->count >= P)
        return STORE_ERR(s, KVP_EINVAL, "ops[%d]: SEAL count %d outside 0..%d", i, (int)op->count,
                         (int)P - 1);
    if (op->count > 0 && !is_staging(s, op->src))
        return STORE_ERR(s, KVP_EINVAL, "ops[%d]: SEAL src %d is not a staging page (%d..%d)", i,
                         (int)op->src, (int)s->num_pages, (int)(s->num_pages + s->num_staging - 1));
    int64_t need = P - op->count;
    if (op->row < 0 || (int64_t)op->row + need > a->rows)
        return STORE_ERR(s, KVP_EINVAL, "ops[%d]: SEAL rows %d..%lld outside the %d appended rows",
                         i, (int)op->row, (long long)(op->row + need - 1), (int)a->rows);
    for (int64_t j = 0; j < need; j++) {
        int64_t want = (int64_t)op->dst * P + op->count + j, got = a->slots[op->row + j];
        if (got != want)
            return STORE_ERR(s, KVP_EINVAL, "ops[%d]: SEAL row %lld has slot %lld, expected %lld "
                             "(page %d offset %lld)", i, (long long)(op->row + j), (long long)got,
                             (long long)want, (int)op->dst, (long long)(op->count + j));
    }
    return KVP_OK;
}

/* A row may go to a pool page of a staging layout only through a SEAL. */
static bool row_sealed(const kvp_append_params_t *a, int64_t r, int32_t P) {
    for (int i = 0; i < a->num_ops; i++) {
        const kvp_page_op_t *op = &a->ops[i];
        if (op->kind == KVP_OP_SEAL && r >= op->row && r < (int64_t)op->row + (P - op->count))
            return true;
    }
    return false;
}

static int check_append(kvp_store_t *s, const kvp_append_params_t *a) {
    const kvp_layout_t *l = &s->layout;
    int rc = kvp__check_struct(a, sizeof *a, "append", s->error, KVP__STORE_ERR_SIZE);
    if (rc == KVP_OK) rc = kvp__check_reserved(a->reserved_, "append", s->error, KVP__STORE_ERR_SIZE);
    if (rc != KVP_OK) return rc;
    if (a->layer < 0 || a->layer >= l->layers)
        return STORE_ERR(s, KVP_EINVAL, "layer %d out of range 0..%d", (int)a->layer,
                         (int)l->layers - 1);
    if (a->rows < 0) return STORE_ERR(s, KVP_EINVAL, "rows is negative (%d)", (int)a->rows);
    if (kvp__dtype_size(a->dtype) == 0)
        return STORE_ERR(s, KVP_EINVAL, "dtype %d: inputs must be fp32, fp16 or bf16", (int)a->dtype);
    int64_t row = (int64_t)l->kv_heads * l->head_dim;
    if (a->k_row_stride != 0 && a->k_row_stride < row)
        return STORE_ERR(s, KVP_EINVAL, "k_row_stride %lld is below a row (%lld elements)",
                         (long long)a->k_row_stride, (long long)row);
    if (a->v_row_stride != 0 && a->v_row_stride < row)
        return STORE_ERR(s, KVP_EINVAL, "v_row_stride %lld is below a row (%lld elements)",
                         (long long)a->v_row_stride, (long long)row);
    /* the last row's end, (rows - 1) * stride + row elements, must be an
     * addressable byte offset: larger strides would wrap */
    int64_t esize = (int64_t)kvp__dtype_size(a->dtype);
    int64_t max_stride = a->rows > 1 ? (PTRDIFF_MAX / esize - row) / (a->rows - 1) : INT64_MAX;
    if (a->k_row_stride > max_stride || a->v_row_stride > max_stride)
        return STORE_ERR(s, KVP_EINVAL, "row strides %lld / %lld over %d rows exceed the "
                         "address space", (long long)a->k_row_stride,
                         (long long)a->v_row_stride, (int)a->rows);
    if (a->num_ops < 0 || (a->num_ops > 0 && a->ops == NULL))
        return STORE_ERR(s, KVP_EINVAL, "ops is NULL or num_ops (%d) negative", (int)a->num_ops);
    if (a->rows > 0 && (a->k == NULL || a->v == NULL || a->slots == NULL))
        return STORE_ERR(s, KVP_EINVAL, "k, v and slots must not be NULL when rows > 0");
    int64_t P = l->page_size;
    int64_t limit = ((int64_t)s->num_pages + s->num_staging) * P;
    for (int i = 0; i < a->num_ops; i++) {
        const kvp_page_op_t *op = &a->ops[i];
        if (op->kind != KVP_OP_SEAL) continue;
        rc = check_seal(s, a, i, op);
        if (rc != KVP_OK) return rc;
    }
    for (int64_t r = 0; r < a->rows; r++) {
        int64_t slot = a->slots[r];
        if (slot < 0) continue;
        if (slot >= limit)
            return STORE_ERR(s, KVP_EINVAL, "slots[%lld] = %lld: page %lld is not a page id "
                             "(pool 0..%d, staging %d..%d)", (long long)r, (long long)slot,
                             (long long)(slot / P), (int)s->num_pages - 1, (int)s->num_pages,
                             (int)(s->num_pages + s->num_staging - 1));
        if (l->needs_staging && slot / P < s->num_pages && !row_sealed(a, r, (int32_t)P))
            return STORE_ERR(s, KVP_EINVAL, "slots[%lld] = %lld points into pool page %lld, "
                             "which %s keys fill only through a SEAL op (write partial pages "
                             "to a staging page)", (long long)r, (long long)slot,
                             (long long)(slot / P), kvp_format_name(l->k_format));
    }
    return KVP_OK;
}

void kvp_append_params_init(kvp_append_params_t *a) {
    if (a == NULL) return;
    memset(a, 0, sizeof *a);
    a->struct_size = sizeof *a;
}

int kvp_store_append(kvp_store_t *s, const kvp_append_params_t *a) {
    if (s == NULL) return KVP_EINVAL;
    int rc = check_append(s, a);
    if (rc != KVP_OK) return rc;
    rc = s->backend->append(s, a, s->error, KVP__STORE_ERR_SIZE);
    return rc;
}

static int check_op(kvp_store_t *s, int i, const kvp_page_op_t *op) {
    int32_t P = s->layout.page_size;
    switch (op->kind) {
    case KVP_OP_SEAL: return KVP_OK;
    case KVP_OP_COPY:
        if (!((is_pool(s, op->src) && is_pool(s, op->dst)) ||
              (is_staging(s, op->src) && is_staging(s, op->dst))))
            return STORE_ERR(s, KVP_EINVAL, "ops[%d]: COPY %d -> %d: both must be pool pages "
                             "(0..%d) or both staging pages", i, (int)op->src, (int)op->dst,
                             (int)s->num_pages - 1);
        return KVP_OK;
    case KVP_OP_UNSEAL:
        if (!s->layout.needs_staging)
            return STORE_ERR(s, KVP_EINVAL, "ops[%d]: UNSEAL in a layout without staging pages", i);
        if (!is_pool(s, op->src) || !is_staging(s, op->dst))
            return STORE_ERR(s, KVP_EINVAL, "ops[%d]: UNSEAL %d -> %d: src must be a pool page "
                             "and dst a staging page", i, (int)op->src, (int)op->dst);
        if (op->count < 1 || op->count > P)
            return STORE_ERR(s, KVP_EINVAL, "ops[%d]: UNSEAL count %d outside 1..%d", i,
                             (int)op->count, (int)P);
        return KVP_OK;
    default:
        return STORE_ERR(s, KVP_EINVAL, "ops[%d]: unknown kind %d", i, (int)op->kind);
    }
}

int kvp_store_apply_ops(kvp_store_t *s, const kvp_page_op_t *ops, int32_t n) {
    if (s == NULL) return KVP_EINVAL;
    if (n < 0 || (n > 0 && ops == NULL))
        return STORE_ERR(s, KVP_EINVAL, "ops is NULL or num_ops (%d) negative", (int)n);
    for (int i = 0; i < n; i++) {
        int rc = check_op(s, i, &ops[i]);
        if (rc != KVP_OK) return rc;
    }
    int rc = s->backend->apply_ops(s, ops, n, s->error, KVP__STORE_ERR_SIZE);
    return rc;
}

int kvp_store_read(const kvp_store_t *cs, int32_t layer, int32_t page, int32_t t0, int32_t n,
                   float *k, float *v) {
    if (cs == NULL) return KVP_EINVAL;
    const kvp_store_t *s = cs;
    if (layer < 0 || layer >= s->layout.layers)
        return STORE_ERR(s, KVP_EINVAL, "layer %d out of range", (int)layer);
    if (!is_pool(s, page) && !is_staging(s, page))
        return STORE_ERR(s, KVP_EINVAL, "page %d is not a page id (0..%d)", (int)page,
                         (int)(s->num_pages + s->num_staging - 1));
    if (t0 < 0 || n < 0 || t0 > s->layout.page_size - n)
        return STORE_ERR(s, KVP_EINVAL, "tokens %d..%lld outside the page (size %d)", (int)t0,
                         (long long)t0 + n - 1, (int)s->layout.page_size);
    if (k == NULL && v == NULL) return STORE_ERR(s, KVP_EINVAL, "k and v are both NULL");
    int rc = s->backend->read(s, layer, page, t0, n, k, v, s->error, KVP__STORE_ERR_SIZE);
    return rc;
}

/* ---- page I/O (the host tier's swaps) ------------------------------------------ */

uint64_t kvp__page_io_bytes(const kvp_store_t *s, int32_t page) {
    return page < s->num_pages ? s->layout.page_bytes : s->layout.staging_page_bytes;
}

int kvp__check_page_io(const kvp_store_t *s, int32_t page, uint64_t offset, const void *host,
                       uint64_t bytes) {
    if (!is_pool(s, page) && !is_staging(s, page))
        return STORE_ERR(s, KVP_EINVAL, "page %d is not a page id (pool 0..%d, staging %d..%d)",
                         (int)page, (int)s->num_pages - 1, (int)s->num_pages,
                         (int)(s->num_pages + s->num_staging - 1));
    uint64_t size = kvp__page_io_bytes(s, page);
    if (offset > size || bytes > size - offset)
        return STORE_ERR(s, KVP_EINVAL, "%llu bytes at offset %llu are outside page %d's %llu "
                         "bytes", (unsigned long long)bytes, (unsigned long long)offset,
                         (int)page, (unsigned long long)size);
    if (bytes > 0 && host == NULL) return STORE_ERR(s, KVP_EINVAL, "host buffer is NULL");
    return KVP_OK;
}

static int page_io(kvp_store_t *s, int32_t page, uint64_t offset, void *host, uint64_t bytes,
                   int to_host) {
    if (s == NULL) return KVP_EINVAL;
    int rc = kvp__check_page_io(s, page, offset, host, bytes);
    if (rc != KVP_OK) return rc;
    if (bytes > 0) rc = s->backend->page_io(s, page, offset, host, bytes, to_host, s->error,
                                            KVP__STORE_ERR_SIZE);
    return rc;
}

int kvp_store_page_to_host(kvp_store_t *s, int32_t page, uint64_t offset, void *dst,
                           uint64_t bytes) {
    return page_io(s, page, offset, dst, bytes, 1);
}

int kvp_store_page_from_host(kvp_store_t *s, int32_t page, uint64_t offset, const void *src,
                             uint64_t bytes) {
    /* the backend gets one pointer type for both directions; from_host only reads it */
    void *host;
    memcpy(&host, &src, sizeof host);
    return page_io(s, page, offset, host, bytes, 0);
}

int kvp_store_page_check(const kvp_store_t *cs, int32_t page, const void *src, uint64_t bytes) {
    if (cs == NULL) return KVP_EINVAL;
    return kvp__store_page_check(cs, page, src, bytes, cs->layout.page_size);
}

int kvp__store_page_check(const kvp_store_t *s, int32_t page, const void *src, uint64_t bytes,
                          int32_t tokens) {
    int rc = kvp__check_page_io(s, page, 0, src, bytes);
    if (rc != KVP_OK) return rc;
    uint64_t size = kvp__page_io_bytes(s, page);
    if (bytes != size)
        return STORE_ERR(s, KVP_EINVAL, "%llu bytes: page %d's serialization is %llu bytes",
                         (unsigned long long)bytes, (int)page, (unsigned long long)size);
    if (!is_pool(s, page)) return KVP_OK; /* staging pages: fp16 elements, any bits */
    const kvp_layout_t *l = &s->layout;
    const uint8_t *b = (const uint8_t *)src;
    char why[KVP_ERR_SIZE];
    for (int32_t layer = 0; layer < l->layers; layer++)
        for (int side = 0; side < 2; side++) {
            const kvp__blockfmt *f = side == 0 ? &s->kfmt : &s->vfmt;
            uint64_t block = side == 0 ? l->k_block_bytes : l->v_block_bytes;
            for (int32_t h = 0; h < l->kv_heads; h++, b += block)
                if (kvp__block_check_tokens(f, b, tokens, why, sizeof why) != 0)
                    return STORE_ERR(s, KVP_EINVAL, "layer %d %s block of kv head %d (%s): %s",
                                     (int)layer, side == 0 ? "K" : "V", (int)h,
                                     kvp_format_name(f->format), why);
        }
    return KVP_OK;
}

int kvp_store_synchronize(kvp_store_t *s) {
    if (s == NULL) return KVP_EINVAL;
    int rc = s->backend->synchronize(s, s->error, KVP__STORE_ERR_SIZE);
    return rc;
}

/* The tier's kvp_page_io_t over the functions above (the store is `opaque`). */
static int io_to_host(void *opaque, int32_t page, uint64_t offset, void *dst, uint64_t bytes) {
    return kvp_store_page_to_host((kvp_store_t *)opaque, page, offset, dst, bytes);
}

static int io_from_host(void *opaque, int32_t page, uint64_t offset, const void *src,
                        uint64_t bytes) {
    return kvp_store_page_from_host((kvp_store_t *)opaque, page, offset, src, bytes);
}

int kvp_store_page_io(kvp_store_t *s, kvp_page_io_t *io) {
    if (s == NULL) return KVP_EINVAL;
    int rc = kvp__check_struct(io, sizeof *io, "io", s->error, KVP__STORE_ERR_SIZE);
    if (rc != KVP_OK) return rc;
    kvp_page_io_t r;
    memset(&r, 0, sizeof r);
    r.struct_size = sizeof r;
    r.copy_to_host = io_to_host;
    r.copy_from_host = io_from_host;
    r.opaque = s;
    kvp__copy_out(io, &r, sizeof r);
    return KVP_OK;
}
