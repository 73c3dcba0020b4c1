/*
 * CUDA backend: quantize / dequantize plain device tensors into the store's
 * block formats (kvp_cuda_quantize, kvp_cuda_dequantize), and
 * kvp_store_read() on a CUDA store. The bytes and the decoded values are the
 * CPU's: the encoders of codec.cuh and the reference decoder of
 * lib/blockfmt.h, compiled for the device. Rotated blocks (int4 values)
 * are read back as kvp__block_read() does: each token's row decoded, then
 * taken out of the rotated basis (kvp__rot_inverse, the same operations).
 */
#include "codec.cuh"

#define QUANT_THREADS 128
#define QUANT_MAX_BLOCKS 65535u

namespace {

/* Token t of block (page, head) of a [pages*P][heads][D] tensor. */
struct tensor_source {
    const uint8_t *base;
    int64_t page;
    int32_t h, heads, P, D, dtype, esize;
    __device__ __forceinline__ float operator()(int t, int d) const {
        int64_t at = (((page * P + t) * heads + h) * (int64_t)D + d) * esize;
        return kvp__load_elem(base + at, dtype);
    }
    __device__ __forceinline__ bool rotated(int) const { return false; }
};

struct quant_args {
    kvp__blockfmt f;
    const uint8_t *src;
    uint8_t *dst;
    int64_t blocks;      /* pages x heads */
    uint64_t block_bytes;
    uint64_t used;       /* element and scale bytes of a block; zeros up to block_bytes */
    int32_t heads, dtype, esize;
    float fp8_scale;
};

__global__ void __launch_bounds__(QUANT_THREADS) k_quantize(quant_args a) {
    for (int64_t i = blockIdx.x; i < a.blocks; i += gridDim.x) { /* uniform per block */
        tensor_source src;
        src.base = a.src;
        src.page = i / a.heads;
        src.h = (int32_t)(i % a.heads);
        src.heads = a.heads;
        src.P = a.f.page_size;
        src.D = a.f.head_dim;
        src.dtype = a.dtype;
        src.esize = a.esize;
        uint8_t *b = a.dst + (uint64_t)i * a.block_bytes;
        if (kvp__blockfmt_per_page(&a.f)) kvp__encode_key_page(a.f, b, src);
        else kvp__encode_tokens(a.f, b, 0, a.f.page_size, src, a.fp8_scale);
        kvp__zero_padding(b, a.used, a.block_bytes, (int)threadIdx.x, (int)blockDim.x);
    }
}

/* An fp32 / fp16 / bf16 output element. */
__device__ __forceinline__ void store_elem(uint8_t *o, int32_t dtype, float v) {
    if (dtype == KVP_FORMAT_FP32) memcpy(o, &v, 4);
    else kvp__store_u16(o, dtype == KVP_FORMAT_FP16 ? kvp__f32_to_f16(v) : kvp__f32_to_bf16(v));
}

__global__ void __launch_bounds__(QUANT_THREADS) k_dequantize(quant_args a) {
    const int64_t P = a.f.page_size, D = a.f.head_dim, per = P * D, n = a.blocks * per;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n;
         e += (int64_t)gridDim.x * blockDim.x) {
        int64_t i = e / per, r = e % per;
        int t = (int)(r / D), d = (int)(r % D);
        float v = kvp__block_decode_one(&a.f, a.src + (uint64_t)i * a.block_bytes, t, d, a.fp8_scale);
        int64_t page = i / a.heads, h = i % a.heads;
        uint8_t *o = a.dst + (((page * P + t) * a.heads + h) * D + d) * a.esize;
        store_elem(o, a.dtype, v);
    }
}

/* Rotated blocks: one warp per (block, token), the row decoded into the
 * warp's row of dynamic shared memory (kvp__enc_smem()), then out of the
 * rotated basis. */
__global__ void __launch_bounds__(QUANT_THREADS) k_dequantize_rotated(quant_args a) {
    const int64_t P = a.f.page_size, D = a.f.head_dim, n = a.blocks * P;
    const int lane = (int)(threadIdx.x & 31u), wpb = (int)(blockDim.x >> 5);
    float *row = kvp__enc_row((int)D);
    const int64_t step = (int64_t)gridDim.x * wpb;
    for (int64_t w = (int64_t)blockIdx.x * wpb + (threadIdx.x >> 5); w < n; w += step) { /* per warp */
        const int64_t i = w / P, page = i / a.heads, h = i % a.heads;
        const int t = (int)(w % P);
        const uint8_t *b = a.src + (uint64_t)i * a.block_bytes;
        for (int d = lane; d < (int)D; d += 32)
            row[d] = kvp__block_decode_one(&a.f, b, t, d, a.fp8_scale);
        __syncwarp();
        kvp__rot_inverse_rows(row, 1, (int)D, lane, 32, kvp__warp_sync());
        uint8_t *o = a.dst + ((page * P + t) * a.heads + h) * D * a.esize;
        for (int d = lane; d < (int)D; d += 32)
            store_elem(o + (int64_t)d * a.esize, a.dtype, row[d]);
        __syncwarp(); /* the row is read before the warp's next token overwrites it */
    }
}

/* kvp_store_read: tokens t0..t0+n-1 of a page into [n][H][D] K, then V. */
struct read_args {
    kvp__geo g;
    int32_t page, t0, n;
    float *out;
};

__global__ void __launch_bounds__(QUANT_THREADS) k_read(read_args a) {
    const int32_t i = (int32_t)blockIdx.x, h = (int32_t)blockIdx.y, side = (int32_t)blockIdx.z;
    const kvp__blockfmt &f = kvp__geo_fmt(a.g, side, a.page);
    const uint8_t *b = kvp__geo_block(a.g, side, a.page, h);
    float fp8 = kvp__geo_fp8(a.g, side, a.page, h);
    float *o = a.out + (size_t)side * a.n * a.g.H * a.g.D + ((size_t)i * a.g.H + h) * a.g.D;
    if (!f.rot) { /* uniform per block */
        for (int d = threadIdx.x; d < a.g.D; d += blockDim.x)
            o[d] = kvp__block_decode_one(&f, b, a.t0 + i, d, fp8);
        return;
    }
    __shared__ float row[KVP_MAX_HEAD_DIM];
    for (int d = threadIdx.x; d < a.g.D; d += blockDim.x)
        row[d] = kvp__block_decode_one(&f, b, a.t0 + i, d, fp8);
    __syncthreads();
    kvp__rot_inverse_rows(row, 1, a.g.D, (int)threadIdx.x, (int)blockDim.x, kvp__block_sync());
    for (int d = threadIdx.x; d < a.g.D; d += blockDim.x) o[d] = row[d];
}

int run_quant(const kvp_quant_desc_t *desc, const void *src, int64_t pages, void *dst,
              void *stream, char *err, size_t err_size, bool quantize) {
    kvp__blockfmt f;
    uint64_t block = 0;
    int rc = kvp__quant_check(desc, src, pages, dst, &f, &block, err, err_size);
    if (rc != KVP_OK) return rc;
    quant_args a;
    memset(&a, 0, sizeof a);
    a.f = f;
    a.src = (const uint8_t *)src;
    a.dst = (uint8_t *)dst;
    a.blocks = pages * desc->heads;
    a.block_bytes = block;
    a.used = kvp__block_used_bytes(&f);
    a.heads = desc->heads;
    a.dtype = desc->dtype;
    a.esize = (int32_t)kvp__dtype_size(desc->dtype);
    a.fp8_scale = desc->fp8_scale;
    cudaStream_t st = (cudaStream_t)stream;
    const size_t rsmem = kvp__enc_smem(f.rot != 0, QUANT_THREADS, f.head_dim); /* a row per warp */
    if (quantize) {
        unsigned grid = a.blocks < (int64_t)QUANT_MAX_BLOCKS ? (unsigned)a.blocks : QUANT_MAX_BLOCKS;
        return kvp__cuda_status(KVP_LAUNCH(k_quantize, dim3(grid), dim3(QUANT_THREADS), rsmem, st, a),
                                err, err_size, "quantize kernel");
    }
    if (f.rot) { /* a warp per token */
        int64_t want = (a.blocks * f.page_size + QUANT_THREADS / 32 - 1) / (QUANT_THREADS / 32);
        unsigned grid = want < (int64_t)QUANT_MAX_BLOCKS ? (unsigned)want : QUANT_MAX_BLOCKS;
        return kvp__cuda_status(KVP_LAUNCH(k_dequantize_rotated, dim3(grid), dim3(QUANT_THREADS),
                                           rsmem, st, a),
                                err, err_size, "dequantize kernel");
    }
    int64_t n = a.blocks * f.page_size * f.head_dim;
    int64_t want = (n + QUANT_THREADS - 1) / QUANT_THREADS;
    unsigned grid = want < (int64_t)QUANT_MAX_BLOCKS ? (unsigned)want : QUANT_MAX_BLOCKS;
    return kvp__cuda_status(KVP_LAUNCH(k_dequantize, dim3(grid), dim3(QUANT_THREADS), 0, st, a),
                            err, err_size, "dequantize kernel");
}

} // namespace

extern "C" int kvp_cuda_quantize(const kvp_quant_desc_t *desc, const void *src, int64_t pages,
                                 void *dst, void *stream, char *err, size_t err_size) {
    return run_quant(desc, src, pages, dst, stream, err, err_size, true);
}

extern "C" int kvp_cuda_dequantize(const kvp_quant_desc_t *desc, const void *src, int64_t pages,
                                   void *dst, void *stream, char *err, size_t err_size) {
    return run_quant(desc, src, pages, dst, stream, err, err_size, false);
}

int kvp__cuda_read(const kvp_store_t *s, int32_t layer, int32_t page, int32_t t0, int32_t n,
                   float *k, float *v, char *err, size_t err_size) {
    kvp__cuda_store *cs = kvp__cstore(s);
    kvp__device_guard g;
    int rc = kvp__device_enter(&g, cs->o.device, err, err_size);
    if (rc != KVP_OK) return rc;
    read_args a;
    memset(&a, 0, sizeof a);
    a.g = kvp__make_geo(s, layer);
    a.page = page;
    a.out = cs->scratch;
    size_t row = (size_t)s->layout.kv_heads * (size_t)s->layout.head_dim;
    cudaError_t e = cudaSuccess;
    for (int32_t done = 0; done < n && e == cudaSuccess; done += cs->scratch_tokens) {
        a.t0 = t0 + done;
        a.n = n - done < cs->scratch_tokens ? n - done : cs->scratch_tokens;
        e = KVP_LAUNCH(k_read, dim3((unsigned)a.n, (unsigned)s->layout.kv_heads, 2),
                       dim3(QUANT_THREADS), 0, cs->o.stream, a);
        if (e == cudaSuccess && k != nullptr)
            e = cudaMemcpyAsync(k + (size_t)done * row, a.out, (size_t)a.n * row * sizeof(float),
                                cudaMemcpyDeviceToHost, cs->o.stream);
        if (e == cudaSuccess && v != nullptr)
            e = cudaMemcpyAsync(v + (size_t)done * row, a.out + (size_t)a.n * row,
                                (size_t)a.n * row * sizeof(float), cudaMemcpyDeviceToHost,
                                cs->o.stream);
        if (e == cudaSuccess) e = cudaStreamSynchronize(cs->o.stream); /* the scratch is reused */
    }
    kvp__device_leave(&g);
    return kvp__cuda_status(e, err, err_size, "reading a page");
}
