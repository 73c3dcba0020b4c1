/*
 * CUDA backend: page operations and page copies.
 *
 *  - COPY (copy-on-write, a fork's staging page) and UNSEAL (a truncation
 *    reopening a sealed page) run as one kernel per group of independent
 *    operations: block (op, layer, kv head) copies that head's K and V
 *    blocks with 16-byte loads, or decodes the quantized tokens into the
 *    fp16 staging blocks with the reference decoder (the CPU's bytes).
 *    Operations run in the order given: a new group starts whenever an
 *    operation touches a page an earlier one of the group writes.
 *  - Page I/O for the host tier: a page's serialization [layer][K][V] to or
 *    from host memory with cudaMemcpy2DAsync on the store's stream (two
 *    calls for a whole page: the K blocks of every layer are one strided
 *    run, the V blocks another), or per (layer, side) for a partial range.
 */
#include "common.cuh"

#define OPS_THREADS 128
/* Operations per launch (and per staging upload). */
#define OPS_GROUP 1024

namespace {

struct ops_args {
    kvp__geo g;                         /* layer 0 */
    int32_t layers;
    uint64_t layer_bytes, slayer_bytes; /* pool / staging bytes of one layer */
    const kvp_page_op_t *ops;
};

__device__ void copy16(uint8_t *dst, const uint8_t *src, uint64_t bytes) {
    /* blocks are 16-byte aligned and a multiple of 16 bytes long */
    uint4 *d = reinterpret_cast<uint4 *>(dst);
    const uint4 *s = reinterpret_cast<const uint4 *>(src);
    for (uint64_t i = threadIdx.x; i < bytes / 16; i += blockDim.x) d[i] = s[i];
}

/* Block (op, layer, head). The geometry is layer 0's; other layers are a
 * fixed number of bytes further. */
__global__ void __launch_bounds__(OPS_THREADS) k_ops(ops_args a) {
    const kvp_page_op_t op = a.ops[blockIdx.x];
    const int32_t layer = (int32_t)blockIdx.y, h = (int32_t)blockIdx.z;
    kvp__geo g = a.g;
    for (int side = 0; side < 2; side++) {
        g.off[side] += (uint64_t)layer * a.layer_bytes;
        g.soff[side] += (uint64_t)layer * a.slayer_bytes;
        if (g.fp8[side] != nullptr) g.fp8[side] += (size_t)layer * (size_t)g.H;
    }
    if (op.kind == KVP_OP_COPY) {
        for (int side = 0; side < 2; side++) {
            uint64_t bytes = op.src < g.num_pages ? g.block[side] : g.sblock;
            copy16(kvp__geo_block(g, side, op.dst, h), kvp__geo_block(g, side, op.src, h), bytes);
        }
        return;
    }
    /* UNSEAL: tokens 0..count-1 of pool page src, decoded, into staging page dst as fp16 */
    const int D = g.D;
    for (int side = 0; side < 2; side++) {
        const kvp__blockfmt &pf = g.fmt[side], &sf = g.sfmt[side];
        const uint8_t *sb = kvp__geo_block(g, side, op.src, h);
        uint8_t *db = kvp__geo_block(g, side, op.dst, h);
        float fp8 = kvp__geo_fp8(g, side, op.src, h);
        for (int i = threadIdx.x; i < op.count * D; i += blockDim.x) {
            int t = i / D, d = i % D;
            float v = kvp__block_decode_one(&pf, sb, t, d, fp8);
            kvp__store_u16(db + kvp__plain_offset(&sf, t, d), kvp__f32_to_f16(v));
        }
    }
}

bool touches(const kvp_page_op_t *a, const kvp_page_op_t *b) {
    /* does b read or write what a writes, or write what a reads? */
    return b->src == a->dst || b->dst == a->dst || b->dst == a->src;
}

} // namespace

int kvp__cuda_apply_ops(kvp_store_t *s, const kvp_page_op_t *ops, int32_t n, char *err,
                        size_t err_size) {
    kvp__cuda_store *cs = kvp__cstore(s);
    kvp__device_guard g;
    int rc = kvp__device_enter(&g, cs->o.device, err, err_size);
    if (rc != KVP_OK) return rc;
    ops_args k;
    memset(&k, 0, sizeof k);
    k.g = kvp__make_geo(s, 0);
    k.layers = s->layout.layers;
    k.layer_bytes = s->layer_bytes;
    k.slayer_bytes = s->slayer_bytes;
    int32_t i = 0;
    while (i < n && rc == KVP_OK) {
        /* the next group: operations that do something, independent of each other */
        int32_t count = 0;
        uint8_t *host = nullptr;
        rc = kvp__stage_begin(&cs->o, OPS_GROUP * sizeof(kvp_page_op_t), &host, err, err_size,
                              "a group of page operations");
        if (rc != KVP_OK) break;
        kvp_page_op_t *group = (kvp_page_op_t *)(void *)host;
        for (; i < n && count < OPS_GROUP; i++) {
            const kvp_page_op_t *op = &ops[i];
            bool useful = (op->kind == KVP_OP_COPY && op->src != op->dst) ||
                          (op->kind == KVP_OP_UNSEAL);
            if (!useful) continue;
            bool dependent = false;
            for (int32_t j = 0; j < count && !dependent; j++)
                dependent = touches(&group[j], op) || touches(op, &group[j]);
            if (dependent) break;
            group[count++] = *op;
        }
        if (count == 0) continue; /* only no-ops were left */
        const uint8_t *dev = nullptr;
        rc = kvp__stage_commit(&cs->o, (uint64_t)count * sizeof(kvp_page_op_t), &dev, err, err_size);
        if (rc != KVP_OK) break;
        k.ops = (const kvp_page_op_t *)(const void *)dev;
        rc = kvp__cuda_status(KVP_LAUNCH(k_ops, dim3((unsigned)count, (unsigned)s->layout.layers,
                                                     (unsigned)s->layout.kv_heads),
                                         dim3(OPS_THREADS), 0, cs->o.stream, k),
                              err, err_size, "page operation kernel");
    }
    kvp__device_leave(&g);
    return rc;
}

/* ---- page I/O --------------------------------------------------------------------------- */

int kvp__cuda_page_io(kvp_store_t *s, int32_t page, uint64_t offset, void *host, uint64_t bytes,
                      int to_host, char *err, size_t err_size) {
    kvp__cuda_store *cs = kvp__cstore(s);
    kvp__device_guard g;
    int rc = kvp__device_enter(&g, cs->o.device, err, err_size);
    if (rc != KVP_OK) return rc;
    bool pool = page < s->num_pages;
    uint64_t kb = pool ? s->page_stride_k : s->spage_stride_k;
    uint64_t vb = pool ? s->page_stride_v : s->spage_stride_v;
    uint64_t pitch = pool ? s->layer_bytes : s->slayer_bytes, row = kb + vb;
    uint8_t *h = (uint8_t *)host;
    cudaStream_t st = cs->o.stream;
    cudaError_t e = cudaSuccess;
    int32_t L = s->layout.layers;
    if (offset == 0 && bytes == row * (uint64_t)L && pitch <= cs->max_pitch &&
        row <= cs->max_pitch) {
        /* whole page: every layer's K blocks are one strided run, the V blocks
         * another (a 2D copy, when the device takes a layer's bytes as its
         * pitch; a store of more than ~2 GiB per layer goes layer by layer) */
        uint8_t *dk = kvp__block_k(s, 0, page, 0), *dv = kvp__block_v(s, 0, page, 0);
        if (to_host) {
            e = cudaMemcpy2DAsync(h, row, dk, pitch, kb, L, cudaMemcpyDeviceToHost, st);
            if (e == cudaSuccess)
                e = cudaMemcpy2DAsync(h + kb, row, dv, pitch, vb, L, cudaMemcpyDeviceToHost, st);
        } else {
            e = cudaMemcpy2DAsync(dk, pitch, h, row, kb, L, cudaMemcpyHostToDevice, st);
            if (e == cudaSuccess)
                e = cudaMemcpy2DAsync(dv, pitch, h + kb, row, vb, L, cudaMemcpyHostToDevice, st);
        }
    } else {
        uint64_t end = offset + bytes, at = 0;
        for (int32_t l = 0; l < L && at < end && e == cudaSuccess; l++)
            for (int side = 0; side < 2 && e == cudaSuccess; side++) {
                uint64_t len = side ? vb : kb;
                uint64_t lo = at > offset ? at : offset, hi = at + len < end ? at + len : end;
                if (lo < hi) {
                    uint8_t *dev = (side ? kvp__block_v(s, l, page, 0) : kvp__block_k(s, l, page, 0)) +
                                   (lo - at);
                    e = to_host ? cudaMemcpyAsync(h + (lo - offset), dev, (size_t)(hi - lo),
                                                  cudaMemcpyDeviceToHost, st)
                                : cudaMemcpyAsync(dev, h + (lo - offset), (size_t)(hi - lo),
                                                  cudaMemcpyHostToDevice, st);
                }
                at += len;
            }
    }
    kvp__device_leave(&g);
    return kvp__cuda_status(e, err, err_size, to_host ? "copying a page to the host"
                                                      : "copying a page from the host");
}
