/*
 * CUDA backend: append (quantize-on-write through the slot mapping).
 *
 * One call = up to three kernels on the store's stream, in the CPU's order:
 *   1. fp8 calibration (only while a scale of this layer is still 0);
 *   2. seals: block (seal, kv head, side) quantizes a whole pool page from
 *      its staging page and this step's rows;
 *   3. rows: one warp per (row, kv head, side) writes the row into its slot
 *      (staging pages in fp16, pool pages in their format) and counts
 *      non-finite inputs.
 * Rotated values (int4, and their fp16 staging pages) go through the
 * rotated basis as each token is encoded (codec.cuh); a seal takes its
 * staged rows as they are, since they were rotated when they were staged.
 * Whoever writes a pool block also zeroes its padding (up to
 * KVP_BLOCK_ALIGN), so its bytes never depend on what the arena held.
 * Slots and seals are uploaded once per distinct set (every layer of a step
 * shares them). The bytes are the CPU's (codec.cuh).
 */
#include "codec.cuh"

#define APPEND_THREADS 128

namespace {

/* Per-row action, uploaded: the slot, or one of these. */
enum : int64_t { ROW_SKIP = -1, ROW_SEALED = -2 };

struct seal_desc {
    int32_t dst, src, count, row;
};

struct append_args {
    kvp__geo g;
    int32_t layer, rows, nseal;
    const int64_t *wslot;    /* [rows] */
    const seal_desc *seals;  /* [nseal] */
    kvp__row_source src[2];  /* K, V rows (row0 = 0, h set per use) */
    unsigned long long *nonfinite;
};

/* fp8: while scale(layer, h) is 0, set it from this call's rows of head h. */
__global__ void __launch_bounds__(APPEND_THREADS) k_calibrate(append_args a, int side) {
    const int32_t h = (int32_t)blockIdx.x;
    float *scale = a.g.fp8w[side] + h;
    if (*scale != 0.0f) return; /* whole block: before any barrier */
    kvp__row_source src = a.src[side];
    src.h = h;
    float amax = 0.0f;
    const int64_t n = (int64_t)a.rows * a.g.D;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        int32_t r = (int32_t)(i / a.g.D), d = (int32_t)(i % a.g.D);
        if (a.wslot[r] == ROW_SKIP) continue;
        float v = src(r, d);
        if (isfinite(v) && fabsf(v) > amax) amax = fabsf(v);
    }
    amax = kvp__warp_max(amax);
    __shared__ float part[APPEND_THREADS / 32];
    if ((threadIdx.x & 31u) == 0) part[threadIdx.x >> 5] = amax;
    __syncthreads();
    if (threadIdx.x == 0) {
        float m = 0.0f;
        for (int w = 0; w < (int)(blockDim.x >> 5); w++) m = part[w] > m ? part[w] : m;
        *scale = kvp__fp8_calibrated_scale(m);
    }
}

/* Block (seal, head, side): quantize pool page `dst` whole. */
__global__ void __launch_bounds__(APPEND_THREADS) k_seal(append_args a) {
    const seal_desc sd = a.seals[blockIdx.x];
    const int32_t h = (int32_t)blockIdx.y, side = (int32_t)blockIdx.z;
    kvp__seal_source src;
    src.count = sd.count;
    src.sfmt = a.g.sfmt[side];
    src.staging = sd.count > 0 ? kvp__geo_block(a.g, side, sd.src, h) : nullptr;
    src.rows = a.src[side];
    src.rows.h = h;
    src.rows.row0 = sd.row;
    const kvp__blockfmt &f = a.g.fmt[side];
    uint8_t *b = kvp__geo_block(a.g, side, sd.dst, h);
    if (kvp__blockfmt_per_page(&f)) kvp__encode_key_page(f, b, src);
    else kvp__encode_tokens(f, b, 0, a.g.P, src, kvp__geo_fp8(a.g, side, sd.dst, h));
    kvp__zero_padding(b, a.g.used[side], a.g.block[side], (int)threadIdx.x, (int)blockDim.x);
}

/* One warp per (row, head, side). */
__global__ void __launch_bounds__(APPEND_THREADS) k_rows(append_args a) {
    const int64_t w = (int64_t)blockIdx.x * (APPEND_THREADS / 32) + (threadIdx.x >> 5);
    const int lane = (int)(threadIdx.x & 31u);
    if (w >= (int64_t)a.rows * a.g.H * 2) return; /* whole warp */
    const int32_t side = (int32_t)(w & 1), h = (int32_t)(w / 2 % a.g.H);
    const int32_t r = (int32_t)(w / 2 / a.g.H);
    const int64_t slot = a.wslot[r];
    if (slot == ROW_SKIP) return;
    kvp__row_source src = a.src[side];
    src.h = h;
    src.row0 = r;
    unsigned bad = 0;
    for (int d = lane; d < a.g.D; d += 32) bad += !isfinite(src(0, d));
    if (bad != 0) atomicAdd(a.nonfinite, (unsigned long long)bad);
    if (slot == ROW_SEALED) return;
    const int32_t page = (int32_t)(slot / a.g.P), t = (int32_t)(slot % a.g.P);
    src.row0 = (int64_t)r - t; /* the encoder asks for token t of the block: row r */
    uint8_t *b = kvp__geo_block(a.g, side, page, h);
    kvp__encode_token(kvp__geo_fmt(a.g, side, page), b, t, src, kvp__geo_fp8(a.g, side, page, h));
    if (page < a.g.num_pages) /* a pool block's padding (a few bytes, with every row) */
        kvp__zero_padding(b, a.g.used[side], a.g.block[side], lane, 32);
}

bool in_seal(const kvp_append_params_t *a, int64_t r, int32_t P) {
    for (int i = 0; i < a->num_ops; i++) {
        const kvp_page_op_t *op = &a->ops[i];
        if (op->kind == KVP_OP_SEAL && r >= op->row && r < (int64_t)op->row + (P - op->count))
            return true;
    }
    return false;
}

} // namespace

int kvp__cuda_append(kvp_store_t *s, const kvp_append_params_t *a, char *err, size_t err_size) {
    kvp__cuda_store *cs = kvp__cstore(s);
    const kvp_layout_t *l = &s->layout;
    int32_t nseal = 0;
    for (int i = 0; i < a->num_ops; i++) nseal += a->ops[i].kind == KVP_OP_SEAL;
    if (a->rows == 0 && nseal == 0) return KVP_OK;
    kvp__device_guard g;
    int rc = kvp__device_enter(&g, cs->o.device, err, err_size);
    if (rc != KVP_OK) return rc;

    /* metadata: wslot[rows] | seals[nseal] */
    uint64_t slot_bytes = (uint64_t)a->rows * 8, bytes = slot_bytes + (uint64_t)nseal * sizeof(seal_desc);
    uint8_t *host = nullptr;
    const uint8_t *dev = nullptr;
    bool any_row = false;
    rc = kvp__stage_begin(&cs->o, bytes, &host, err, err_size, "this append's slots and seals");
    if (rc != KVP_OK) goto out;
    {
        int64_t *ws = (int64_t *)(void *)host;
        for (int64_t r = 0; r < a->rows; r++) {
            int64_t slot = a->slots[r];
            ws[r] = slot < 0 ? ROW_SKIP : in_seal(a, r, l->page_size) ? ROW_SEALED : slot;
            any_row |= slot >= 0;
        }
        seal_desc *sd = (seal_desc *)(void *)(host + slot_bytes);
        for (int i = 0; i < a->num_ops; i++) {
            const kvp_page_op_t *op = &a->ops[i];
            if (op->kind != KVP_OP_SEAL) continue;
            sd->dst = op->dst;
            sd->src = op->src;
            sd->count = op->count;
            sd->row = op->row;
            sd++;
        }
    }
    rc = kvp__stage_commit(&cs->o, bytes, &dev, err, err_size);
    if (rc != KVP_OK) goto out;
    {
        append_args k;
        memset(&k, 0, sizeof k);
        k.g = kvp__make_geo(s, a->layer);
        k.layer = a->layer;
        k.rows = a->rows;
        k.nseal = nseal;
        k.wslot = (const int64_t *)(const void *)dev;
        k.seals = (const seal_desc *)(const void *)(dev + slot_bytes);
        k.nonfinite = cs->nonfinite;
        for (int side = 0; side < 2; side++) {
            kvp__row_source *src = &k.src[side];
            int64_t st = side ? a->v_row_stride : a->k_row_stride;
            src->base = (const uint8_t *)(side ? a->v : a->k);
            src->row_stride = st != 0 ? st : (int64_t)l->kv_heads * l->head_dim;
            src->row0 = 0;
            src->h = 0;
            src->D = l->head_dim;
            src->dtype = a->dtype;
            src->esize = (int32_t)kvp__dtype_size(a->dtype);
        }
        cudaStream_t stream = cs->o.stream;
        /* rotated values: a row per warp (codec.cuh) */
        const size_t rsmem = kvp__enc_smem(k.g.fmt[1].rot || k.g.sfmt[1].rot, APPEND_THREADS, l->head_dim);
        /* 1. fp8 calibration, while some scale of this layer is still 0 */
        size_t table = (size_t)l->layers * (size_t)l->kv_heads;
        for (int side = 0; side < 2 && any_row; side++) {
            int32_t f = side ? l->v_format : l->k_format;
            if (f != KVP_FORMAT_FP8_E4M3) continue;
            uint8_t *known = cs->fp8_known + (size_t)side * table + (size_t)a->layer * (size_t)l->kv_heads;
            bool all = true;
            for (int32_t h = 0; h < l->kv_heads; h++) all &= known[h] != 0;
            if (all) continue;
            rc = kvp__cuda_status(KVP_LAUNCH(k_calibrate, dim3((unsigned)l->kv_heads),
                                             dim3(APPEND_THREADS), 0, stream, k, side),
                                  err, err_size, "fp8 calibration kernel");
            if (rc != KVP_OK) goto out;
            memset(known, 1, (size_t)l->kv_heads); /* every head has a scale > 0 now */
        }
        /* 2. seals, before any row reaches a staging page */
        if (nseal > 0) {
            rc = kvp__cuda_status(KVP_LAUNCH(k_seal, dim3((unsigned)nseal, (unsigned)l->kv_heads, 2),
                                             dim3(APPEND_THREADS), rsmem, stream, k),
                                  err, err_size, "seal kernel");
            if (rc != KVP_OK) goto out;
        }
        /* 3. rows */
        if (a->rows > 0) {
            uint64_t warps = (uint64_t)a->rows * (uint64_t)l->kv_heads * 2;
            uint64_t blocks = (warps + APPEND_THREADS / 32 - 1) / (APPEND_THREADS / 32);
            rc = kvp__cuda_status(KVP_LAUNCH(k_rows, dim3((unsigned)blocks), dim3(APPEND_THREADS), rsmem,
                                             stream, k),
                                  err, err_size, "append kernel");
        }
    }
out:
    kvp__device_leave(&g);
    return rc;
}
