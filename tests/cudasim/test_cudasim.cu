/*
 * Self-tests of the kernel simulator: each CUDA feature the backend relies on,
 * run on kernels whose results are known, plus the failures the simulator
 * must report (barrier divergence, bad launches, bad pointers, injected
 * allocation failures). nvcc compiles this file too (syntax check), so the
 * kernels here are real CUDA.
 */
#include "../../cuda/compat.cuh"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}
#include <stdio.h>
#include <string.h>

#include <string>
#include <thread>
#include <vector>

#ifdef KVP_CUDASIM
#include <sys/wait.h>
#include <unistd.h>
#endif

/* ---- kernels ----------------------------------------------------------------- */

__global__ void k_saxpy(int n, float a, const float *x, float *y) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x)
        y[i] = a * x[i] + y[i];
}

/* Tree reduction in static shared memory: needs every __syncthreads. */
__global__ void k_block_sum(const int *x, int n, int *out) {
    __shared__ int buf[256];
    int t = threadIdx.x;
    int i = blockIdx.x * blockDim.x + t;
    buf[t] = i < n ? x[i] : 0;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (t < s) buf[t] += buf[t + s];
        __syncthreads();
    }
    if (t == 0) out[blockIdx.x] = buf[0];
}

__device__ float warp_sum_xor(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ float warp_sum_down(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    return v;
}

__global__ void k_warp_sums(const float *x, float *xor_out, float *down_out) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float v = x[threadIdx.x];
    float a = warp_sum_xor(v);
    float b = warp_sum_down(v);
    xor_out[threadIdx.x] = a; /* every lane has the total */
    if (lane == 0) down_out[warp] = b;
}

/* Shuffles with width 8: each 8-lane section is its own ring. */
__global__ void k_shfl_width(int *idx_out, int *up_out, int *down_out) {
    int lane = threadIdx.x & 31;
    idx_out[threadIdx.x] = __shfl_sync(0xffffffffu, lane * 10, 3, 8);
    up_out[threadIdx.x] = __shfl_up_sync(0xffffffffu, lane, 1, 8);
    down_out[threadIdx.x] = __shfl_down_sync(0xffffffffu, lane, 2, 8);
}

__global__ void k_votes(const int *pred, unsigned *ballot, int *all, int *any) {
    int p = pred[threadIdx.x];
    unsigned b = __ballot_sync(0xffffffffu, p);
    int a = __all_sync(0xffffffffu, p);
    int y = __any_sync(0xffffffffu, p);
    if ((threadIdx.x & 31) == 0) {
        ballot[threadIdx.x >> 5] = b;
        all[threadIdx.x >> 5] = a;
        any[threadIdx.x >> 5] = y;
    }
}

__global__ void k_histogram(const int *x, int n, int *bins) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) atomicAdd(&bins[x[i] & 15], 1);
}

/* Reverse each block's slice through dynamic shared memory. */
__global__ void k_reverse(const float *x, float *y) {
    KVP_DYNAMIC_SMEM(float, tile);
    int t = threadIdx.x, base = blockIdx.x * blockDim.x;
    tile[t] = x[base + t];
    __syncthreads();
    y[base + t] = tile[blockDim.x - 1 - t];
}

__global__ void k_index3d(int *out) {
    int linear = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    int block = blockIdx.x + gridDim.x * blockIdx.y;
    out[block * blockDim.x * blockDim.y * blockDim.z + linear] =
        (int)(threadIdx.x * 100 + threadIdx.y * 10 + threadIdx.z) + 1000 * block;
}

/* Block of 40 threads: the second warp has 8 lanes. Sums over 8-lane
 * groups, so every source lane exists in both warps. */
__global__ void k_partial_warp(float *out) {
    unsigned m = __activemask();
    float v = 1.0f;
    for (int o = 4; o > 0; o >>= 1) v += __shfl_xor_sync(m, v, o);
    out[threadIdx.x] = (float)__popc(m) * 100.0f + v;
}

/* Thread 0 returns before the barrier the others wait at: on a GPU this is
 * undefined (often a hang); the simulator must report it. */
__global__ void k_diverge(int *x) {
    if (threadIdx.x == 0) return;
    __syncthreads();
    x[threadIdx.x] = 1;
}

/* Lanes 0-15 shuffle, lanes 16-31 wait at __syncthreads: divergence. */
__global__ void k_diverge_warp(float *x) {
    if ((threadIdx.x & 31) < 16) x[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
    else __syncthreads();
}

__global__ void k_half(const float *x, float *y, __half *h, __nv_bfloat16 *b) {
    int i = threadIdx.x;
    __half hv = __float2half_rn(x[i]);
    __nv_bfloat16 bv = __float2bfloat16_rn(x[i]);
    h[i] = hv;
    b[i] = bv;
    __half2 pair = __halves2half2(hv, hv);
    y[i] = __low2float(pair) + __high2float(pair) + __bfloat162float(bv);
}

__global__ void k_dp4a(const int *a, const int *b, int *out) {
    out[threadIdx.x] = __dp4a(a[threadIdx.x], b[threadIdx.x], 7);
}

__global__ void k_read_smem_uninit(unsigned char *out) {
    KVP_DYNAMIC_SMEM(unsigned char, s);
    out[threadIdx.x] = s[threadIdx.x];
}

/* Reads static shared memory before writing it (undefined on a GPU: whatever
 * the SM's shared memory held), then writes it: a block that ran before must
 * not leak its values into the next. In a template too (the backend's kernels
 * are templates), and of a class type. */
template <int N> __device__ unsigned short half_bits_before_write(int t) {
    __shared__ __half h[N];
    unsigned short b;
    memcpy(&b, &h[t], sizeof b);
    __syncthreads();
    h[t] = __float2half(1.0f);
    return b;
}

__global__ void k_static_smem_uninit(unsigned char *out, unsigned short *hbits) {
    __shared__ unsigned char s[64];
    int t = threadIdx.x;
    out[blockIdx.x * 64 + t] = s[t];
    __syncthreads();
    s[t] = 7;
    hbits[blockIdx.x * 64 + t] = half_bits_before_write<64>(t);
}

/* Touches the first and last byte of its dynamic shared memory. */
__global__ void k_big_smem(size_t bytes, int *out) {
    KVP_DYNAMIC_SMEM(unsigned char, s);
    if (threadIdx.x == 0) {
        s[0] = 1;
        s[bytes - 1] = 2;
        out[0] = s[0] + s[bytes - 1];
    }
}

/* 16 KiB of static shared memory, and dynamic shared memory on top. */
__global__ void k_static_16k(size_t dyn_bytes, int *out) {
    __shared__ float big[4096];
    KVP_DYNAMIC_SMEM(unsigned char, s);
    for (int i = threadIdx.x; i < 4096; i += blockDim.x) big[i] = (float)i;
    if (threadIdx.x == 0 && dyn_bytes) s[dyn_bytes - 1] = 1;
    __syncthreads();
    if (threadIdx.x == 0) out[0] = (int)big[4095];
}

/* 16-byte vector loads from p + offset: misaligned unless offset % 16 == 0. */
__global__ void k_vector_load(const unsigned char *p, int offset, uint4 *out) {
    out[threadIdx.x] = *reinterpret_cast<const uint4 *>(p + offset + 16 * threadIdx.x);
}

/* cp.async (sm_80+) in these kernels: the simulator's model, or the PTX
 * under nvcc. Not cuda/compat.cuh's wrappers, which copy 16 bytes only:
 * the tests here need 4 and 8 too, and sizes that are wrong. */
#ifdef KVP_CUDASIM
static inline void cpa_copy(void *smem_dst, const void *src, size_t bytes) {
    cudasim::cp_async(smem_dst, src, bytes);
}
static inline void cpa_commit() { cudasim::cp_async_commit(); }
template <int N> static inline void cpa_wait() { cudasim::cp_async_wait(N); }
#else
__device__ __forceinline__ void cpa_copy(void *smem_dst, const void *src, size_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned d = (unsigned)__cvta_generic_to_shared(smem_dst);
    if (bytes == 16) asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src) : "memory");
    else if (bytes == 8) asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(d), "l"(src) : "memory");
    else asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(d), "l"(src) : "memory");
#else
    memcpy(smem_dst, src, bytes);
#endif
}
__device__ __forceinline__ void cpa_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
template <int N> __device__ __forceinline__ void cpa_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}
#endif

/* One tile of a block: two 16-byte chunks per thread, into one stage. */
__device__ void cpa_start_tile(uint4 *stage, const uint4 *tile) {
    cpa_copy(&stage[threadIdx.x], &tile[threadIdx.x], 16);
    cpa_copy(&stage[threadIdx.x + blockDim.x], &tile[threadIdx.x + blockDim.x], 16);
}

/* A STAGES-deep cp.async pipeline: each block streams `tiles` tiles (two
 * 16-byte chunks per thread) through a ring of STAGES shared-memory stages
 * and writes them out. PENDING is the wait's count: STAGES - 1 is right
 * (tile k has landed), STAGES is one too many. Each thread writes out chunks
 * that another thread copied, so the wait alone is not enough: the barrier
 * after it is needed too. */
template <int STAGES, int PENDING>
__global__ void k_cp_async_pipeline(const uint4 *src, int tiles, uint4 *out) {
    KVP_DYNAMIC_SMEM(uint4, ring);
    const int per_tile = 2 * blockDim.x;
    const uint4 *in = src + (size_t)blockIdx.x * tiles * per_tile;
    uint4 *res = out + (size_t)blockIdx.x * tiles * per_tile;
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < tiles) cpa_start_tile(ring + s * per_tile, in + s * per_tile);
        cpa_commit(); /* one group per tile, empty or not: the wait counts them */
    }
    for (int k = 0; k < tiles; k++) {
        int next = k + STAGES - 1;
        /* the stage tile `next` goes to was read in the previous round,
         * before its closing barrier */
        if (next < tiles) cpa_start_tile(ring + (next % STAGES) * per_tile, in + next * per_tile);
        cpa_commit();
        cpa_wait<PENDING>();
        __syncthreads();
        const uint4 *stage = ring + (k % STAGES) * per_tile;
        int j0 = per_tile - 1 - (int)threadIdx.x, j1 = j0 - (int)blockDim.x;
        res[k * per_tile + j0] = stage[j0];
        res[k * per_tile + j1] = stage[j1];
        __syncthreads();
    }
}

/* Reads its cp.async destination before the wait, and after. */
__global__ void k_cp_async_read_early(const uint4 *src, uint4 *before, uint4 *after) {
    KVP_DYNAMIC_SMEM(uint4, s);
    int t = threadIdx.x;
    cpa_copy(&s[t], &src[t], 16);
    cpa_commit();
    before[t] = s[t];
    cpa_wait<0>();
    after[t] = s[t];
}

/* Each thread owns 48 bytes of shared memory: a = [0,16) (group 0, copied
 * as 8 + 4 + 4 bytes), b = [16,32) (group 1), c = [32,48) (started after an
 * empty group 2, in the open group, committed last). `snap` receives the 48
 * bytes after each of four waits. */
__global__ void k_cp_async_groups(const unsigned char *src, unsigned char *snap) {
    KVP_DYNAMIC_SMEM(unsigned char, smem);
    unsigned char *mine = smem + 48 * threadIdx.x;
    const unsigned char *from = src + 48 * threadIdx.x;
    unsigned char *out = snap + 4 * 48 * threadIdx.x;
    cpa_copy(mine, from, 8);
    cpa_copy(mine + 8, from + 8, 4);
    cpa_copy(mine + 12, from + 12, 4);
    cpa_commit();
    cpa_copy(mine + 16, from + 16, 16);
    cpa_commit();
    cpa_wait<1>(); /* group 0 lands, group 1 does not */
    memcpy(out, mine, 48);
    cpa_commit(); /* group 2, empty */
    cpa_copy(mine + 32, from + 32, 16);
    cpa_wait<1>(); /* group 1 lands; c, not committed, is not waited for */
    memcpy(out + 48, mine, 48);
    cpa_wait<0>(); /* still not c */
    memcpy(out + 96, mine, 48);
    cpa_commit();
    cpa_wait<0>();
    memcpy(out + 144, mine, 48);
}

/* Misuses of cp.async, by thread 3 of block 1 only (block 0 runs first and
 * must pass): every other thread copies its 16 bytes of `src` into shared
 * memory correctly, waits, and writes them to `dst`. */
enum {
    CPA_NONE,
    CPA_STATIC_DST,     /* every thread copies into static __shared__: fine */
    CPA_SIZE,           /* 12 bytes */
    CPA_MISALIGNED_DST, /* 16 bytes to an 8-byte boundary */
    CPA_MISALIGNED_SRC,
    CPA_DST_GLOBAL,     /* the destination is device memory */
    CPA_DST_PAST_SMEM,  /* the destination is past the dynamic shared memory */
    CPA_SRC_PAST_END,   /* the source runs 8 bytes past its allocation */
    CPA_SRC_HOST,       /* the source is host memory */
    CPA_DST_RACE,       /* thread 4 writes thread 3's destination before the wait */
    CPA_SRC_RACE,       /* thread 4 writes thread 3's source before the wait */
    CPA_EXIT_COMMITTED, /* thread 3 never waits */
    CPA_EXIT_OPEN,      /* thread 3 starts a copy after its wait, never committed */
    CPA_NEGATIVE_WAIT,  /* the simulator only: PTX takes no negative count */
    CPA_CASES
};

__global__ void k_cp_async_misuse(int what, unsigned char *src, size_t src_bytes, const unsigned char *host,
                                  size_t smem_bytes, unsigned char *dst) {
    KVP_DYNAMIC_SMEM(unsigned char, smem);
    __shared__ uint4 stat[64];
    const int t = threadIdx.x;
    const bool bad = blockIdx.x == 1 && t == 3, writer = blockIdx.x == 1 && t == 4;
    unsigned char *mine = what == CPA_STATIC_DST ? reinterpret_cast<unsigned char *>(&stat[t]) : smem + 16 * t;
    unsigned char *from = src + 16 * t;
    if (!bad) {
        cpa_copy(mine, from, 16);
    } else {
        switch (what) {
        case CPA_SIZE: cpa_copy(mine, from, 12); break;
        case CPA_MISALIGNED_DST: cpa_copy(mine + 8, from, 16); break;
        case CPA_MISALIGNED_SRC: cpa_copy(mine, from + 4, 16); break;
        case CPA_DST_GLOBAL: cpa_copy(dst, from, 16); break;
        case CPA_DST_PAST_SMEM: cpa_copy(smem + smem_bytes, from, 16); break;
        case CPA_SRC_PAST_END: cpa_copy(mine, src + src_bytes - 8, 16); break;
        case CPA_SRC_HOST: cpa_copy(mine, host, 16); break;
        default: cpa_copy(mine, from, 16); break;
        }
    }
    cpa_commit();
    __syncthreads();
    if (what == CPA_DST_RACE && writer) smem[16 * 3 + 5] = 1;
    if (what == CPA_SRC_RACE && writer) src[16 * 3] ^= 1;
    __syncthreads();
    if (!(what == CPA_EXIT_COMMITTED && bad)) cpa_wait<0>();
#ifdef KVP_CUDASIM
    if (what == CPA_NEGATIVE_WAIT && bad) cudasim::cp_async_wait(-1);
#endif
    if (what == CPA_EXIT_OPEN && bad) cpa_copy(mine, from, 16);
    reinterpret_cast<uint4 *>(dst)[blockIdx.x * blockDim.x + t] = *reinterpret_cast<const uint4 *>(mine);
}

/* ---- helpers -------------------------------------------------------------------- */

/* KVP_LAUNCH's commas cannot go inside cmocka's macros directly. */
#define LAUNCH_EXPECT(status, ...)                     \
    do {                                               \
        cudaError_t launch_rc_ = KVP_LAUNCH(__VA_ARGS__); \
        assert_int_equal(launch_rc_, (status));        \
    } while (0)

template <typename T> static T *dev_alloc(size_t n) {
    void *p = nullptr;
    assert_int_equal(cudaMalloc(&p, n * sizeof(T)), cudaSuccess);
    return static_cast<T *>(p);
}

template <typename T> static void to_dev(T *d, const std::vector<T> &h) {
    assert_int_equal(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
}

template <typename T> static std::vector<T> from_dev(const T *d, size_t n) {
    std::vector<T> h(n);
    assert_int_equal(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
}

/* ---- tests ------------------------------------------------------------------------- */

static void test_grid_stride(void **state) {
    (void)state;
    const int n = 5000;
    std::vector<float> x(n), y(n);
    for (int i = 0; i < n; i++) {
        x[i] = (float)i;
        y[i] = 1.0f;
    }
    float *dx = dev_alloc<float>(n), *dy = dev_alloc<float>(n);
    to_dev(dx, x);
    to_dev(dy, y);
    LAUNCH_EXPECT(cudaSuccess, k_saxpy, 7, 64, 0, 0, n, 2.0f, dx, dy);
    std::vector<float> r = from_dev(dy, n);
    for (int i = 0; i < n; i++) assert_true(r[i] == 2.0f * (float)i + 1.0f);
    cudaFree(dx);
    cudaFree(dy);
}

static void test_block_reduction(void **state) {
    (void)state;
    const int n = 1000, blocks = 4;
    std::vector<int> x(n);
    for (int i = 0; i < n; i++) x[i] = i * 3 - 500;
    int *dx = dev_alloc<int>(n), *dout = dev_alloc<int>(blocks);
    to_dev(dx, x);
    LAUNCH_EXPECT(cudaSuccess, k_block_sum, blocks, 256, 0, 0, dx, n, dout);
    std::vector<int> out = from_dev(dout, blocks);
    for (int b = 0; b < blocks; b++) {
        int want = 0;
        for (int i = b * 256; i < (b + 1) * 256 && i < n; i++) want += x[i];
        assert_int_equal(out[b], want);
    }
    cudaFree(dx);
    cudaFree(dout);
}

static void test_warp_shuffles(void **state) {
    (void)state;
    std::vector<float> x(128);
    for (int i = 0; i < 128; i++) x[i] = (float)(i % 7) + 0.25f * (float)(i / 32);
    float *dx = dev_alloc<float>(128), *dxor = dev_alloc<float>(128), *ddown = dev_alloc<float>(4);
    to_dev(dx, x);
    LAUNCH_EXPECT(cudaSuccess, k_warp_sums, 1, 128, 0, 0, dx, dxor, ddown);
    std::vector<float> a = from_dev(dxor, 128), b = from_dev(ddown, 4);
    for (int w = 0; w < 4; w++) {
        float want = 0;
        for (int l = 0; l < 32; l++) want += x[w * 32 + l];
        for (int l = 0; l < 32; l++) assert_true(a[w * 32 + l] == want);
        assert_true(b[w] == want);
    }
    cudaFree(dx);
    cudaFree(dxor);
    cudaFree(ddown);
}

static void test_shuffle_width(void **state) {
    (void)state;
    int *di = dev_alloc<int>(32), *du = dev_alloc<int>(32), *dd = dev_alloc<int>(32);
    LAUNCH_EXPECT(cudaSuccess, k_shfl_width, 1, 32, 0, 0, di, du, dd);
    std::vector<int> idx = from_dev(di, 32), up = from_dev(du, 32), down = from_dev(dd, 32);
    for (int lane = 0; lane < 32; lane++) {
        int section = lane & ~7;
        assert_int_equal(idx[lane], (section + 3) * 10);
        /* lanes that would read outside their section keep their own value */
        assert_int_equal(up[lane], (lane & 7) >= 1 ? lane - 1 : lane);
        assert_int_equal(down[lane], (lane & 7) + 2 < 8 ? lane + 2 : lane);
    }
    cudaFree(di);
    cudaFree(du);
    cudaFree(dd);
}

static void test_votes(void **state) {
    (void)state;
    std::vector<int> pred(64);
    for (int i = 0; i < 32; i++) pred[i] = (i % 3 == 0); /* warp 0: mixed */
    for (int i = 32; i < 64; i++) pred[i] = 1;          /* warp 1: all */
    int *dp = dev_alloc<int>(64), *dall = dev_alloc<int>(2), *dany = dev_alloc<int>(2);
    unsigned *db = dev_alloc<unsigned>(2);
    to_dev(dp, pred);
    LAUNCH_EXPECT(cudaSuccess, k_votes, 1, 64, 0, 0, dp, db, dall, dany);
    std::vector<unsigned> b = from_dev(db, 2);
    std::vector<int> all = from_dev(dall, 2), any = from_dev(dany, 2);
    unsigned want = 0;
    for (int i = 0; i < 32; i++) want |= (unsigned)(i % 3 == 0) << i;
    assert_int_equal(b[0], want);
    assert_int_equal(b[1], 0xffffffffu);
    assert_int_equal(all[0], 0);
    assert_int_equal(all[1], 1);
    assert_int_equal(any[0], 1);
    assert_int_equal(any[1], 1);
    cudaFree(dp);
    cudaFree(db);
    cudaFree(dall);
    cudaFree(dany);
}

static void test_atomics_across_blocks(void **state) {
    (void)state;
    const int n = 3001;
    std::vector<int> x(n), bins(16, 0);
    for (int i = 0; i < n; i++) x[i] = i * 7;
    int *dx = dev_alloc<int>(n), *dbins = dev_alloc<int>(16);
    to_dev(dx, x);
    to_dev(dbins, bins);
    LAUNCH_EXPECT(cudaSuccess, k_histogram, (n + 127) / 128, 128, 0, 0, dx, n, dbins);
    std::vector<int> got = from_dev(dbins, 16);
    std::vector<int> want(16, 0);
    for (int i = 0; i < n; i++) want[(i * 7) & 15]++;
    for (int k = 0; k < 16; k++) assert_int_equal(got[k], want[k]);
    cudaFree(dx);
    cudaFree(dbins);
}

static void test_dynamic_shared_memory(void **state) {
    (void)state;
    std::vector<float> x(3 * 96);
    for (size_t i = 0; i < x.size(); i++) x[i] = (float)i;
    float *dx = dev_alloc<float>(x.size()), *dy = dev_alloc<float>(x.size());
    to_dev(dx, x);
    LAUNCH_EXPECT(cudaSuccess, k_reverse, 3, 96, 96 * sizeof(float), 0, dx, dy);
    std::vector<float> y = from_dev(dy, x.size());
    for (int b = 0; b < 3; b++)
        for (int t = 0; t < 96; t++) assert_true(y[b * 96 + t] == x[b * 96 + 95 - t]);
    cudaFree(dx);
    cudaFree(dy);
}

static void test_multi_dimensional_indices(void **state) {
    (void)state;
    dim3 block(4, 3, 2), grid(2, 2);
    int n = 24 * 4;
    int *d = dev_alloc<int>(n);
    LAUNCH_EXPECT(cudaSuccess, k_index3d, grid, block, 0, 0, d);
    std::vector<int> out = from_dev(d, n);
    for (int b = 0; b < 4; b++)
        for (int z = 0; z < 2; z++)
            for (int y = 0; y < 3; y++)
                for (int x = 0; x < 4; x++)
                    assert_int_equal(out[b * 24 + x + 4 * (y + 3 * z)], x * 100 + y * 10 + z + 1000 * b);
    cudaFree(d);
}

static void test_partial_warp(void **state) {
    (void)state;
    float *d = dev_alloc<float>(40);
    LAUNCH_EXPECT(cudaSuccess, k_partial_warp, 1, 40, 0, 0, d);
    std::vector<float> out = from_dev(d, 40);
    /* __activemask: 32 lanes in the first warp, 8 in the second */
    for (int i = 0; i < 32; i++) assert_true(out[i] == 3200.0f + 8.0f);
    for (int i = 32; i < 40; i++) assert_true(out[i] == 800.0f + 8.0f);
    cudaFree(d);
}

static void test_divergence_is_reported(void **state) {
    (void)state;
    int *d = dev_alloc<int>(64);
    cudaGetLastError();
    LAUNCH_EXPECT(cudaErrorLaunchFailure, k_diverge, 1, 64, 0, 0, d);
    assert_non_null(strstr(cudaGetErrorString(cudaErrorLaunchFailure), "divergence"));
    /* returned by the launch, and pending like any failed runtime call's error */
    assert_int_equal(cudaGetLastError(), cudaErrorLaunchFailure);
    assert_int_equal(cudaGetLastError(), cudaSuccess);
    float *f = dev_alloc<float>(32);
    LAUNCH_EXPECT(cudaErrorLaunchFailure, k_diverge_warp, 1, 32, 0, 0, f);
    cudaGetLastError();
    /* the simulator is usable afterwards */
    LAUNCH_EXPECT(cudaSuccess, k_saxpy, 1, 32, 0, 0, 32, 1.0f, f, f);
    cudaFree(d);
    cudaFree(f);
}

static void test_half_types(void **state) {
    (void)state;
    std::vector<float> x = {0.1f, -2.5f, 65504.0f, 1e-8f, 3.14159f, -0.0f, 70000.0f, 1.0f / 3.0f};
    int n = (int)x.size();
    float *dx = dev_alloc<float>(n), *dy = dev_alloc<float>(n);
    __half *dh = dev_alloc<__half>(n);
    __nv_bfloat16 *db = dev_alloc<__nv_bfloat16>(n);
    to_dev(dx, x);
    LAUNCH_EXPECT(cudaSuccess, k_half, 1, n, 0, 0, dx, dy, dh, db);
    std::vector<float> y = from_dev(dy, n);
    std::vector<__half> h = from_dev(dh, n);
    for (int i = 0; i < n; i++) {
        float hf = __half2float(h[i]);
        if (x[i] == 70000.0f) assert_true(std::isinf(hf)); /* above fp16 max rounds to inf */
        else assert_true(std::fabs(hf - x[i]) <= std::fabs(x[i]) * 1e-3f + 6e-8f);
        assert_true(std::isfinite(y[i]) || x[i] == 70000.0f);
    }
    cudaFree(dx);
    cudaFree(dy);
    cudaFree(dh);
    cudaFree(db);
}

static void test_dp4a(void **state) {
    (void)state;
    std::vector<int> a = {0x01020304, (int)0xff80017f, 0}, b = {0x01010101, 0x02020202, 5};
    int *da = dev_alloc<int>(3), *db = dev_alloc<int>(3), *dout = dev_alloc<int>(3);
    to_dev(da, a);
    to_dev(db, b);
    LAUNCH_EXPECT(cudaSuccess, k_dp4a, 1, 3, 0, 0, da, db, dout);
    std::vector<int> out = from_dev(dout, 3);
    assert_int_equal(out[0], 1 + 2 + 3 + 4 + 7);
    assert_int_equal(out[1], (127 + 1 - 128 - 1) * 2 + 7);
    assert_int_equal(out[2], 7);
    cudaFree(da);
    cudaFree(db);
    cudaFree(dout);
}

static void test_shared_memory_starts_poisoned(void **state) {
    (void)state;
    unsigned char *d = dev_alloc<unsigned char>(32);
    LAUNCH_EXPECT(cudaSuccess, k_read_smem_uninit, 1, 32, 64, 0, d);
    std::vector<unsigned char> out = from_dev(d, 32);
    for (int i = 0; i < 32; i++) assert_int_equal(out[i], 0xA5);
    cudaFree(d);
}

/* Strided copies (the host tier's page copies): rows of `width` bytes at
 * two pitches, both directions, and a row that leaves its allocation. */
static void test_memcpy_2d(void **state) {
    (void)state;
    const size_t width = 24, rows = 5, dpitch = 40, spitch = 64;
    std::vector<unsigned char> src(rows * spitch), back(rows * width, 0);
    for (size_t i = 0; i < src.size(); i++) src[i] = (unsigned char)(i * 7 + 3);
    unsigned char *d = nullptr;
    assert_int_equal(cudaMalloc((void **)&d, rows * dpitch), cudaSuccess);
    assert_int_equal(cudaMemset(d, 0, rows * dpitch), cudaSuccess);
    assert_int_equal(cudaMemcpy2DAsync(d, dpitch, src.data(), spitch, width, rows, cudaMemcpyHostToDevice,
                                       0),
                     cudaSuccess);
    assert_int_equal(cudaMemcpy2D(back.data(), width, d, dpitch, width, rows, cudaMemcpyDeviceToHost),
                     cudaSuccess);
    for (size_t r = 0; r < rows; r++)
        assert_memory_equal(back.data() + r * width, src.data() + r * spitch, width);
    std::vector<unsigned char> whole(rows * dpitch);
    assert_int_equal(cudaMemcpy(whole.data(), d, whole.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    assert_int_equal(whole[width], 0); /* the pitch padding is untouched */
#ifdef KVP_CUDASIM
    /* at a pitch of 45 the last row ends 4 bytes past the allocation */
    assert_int_equal(cudaMemcpy2D(d, dpitch + 5, src.data(), spitch, width, rows, cudaMemcpyHostToDevice),
                     cudaErrorInvalidValue);
    cudaGetLastError();
#endif
    assert_int_equal(cudaFree(d), cudaSuccess);
}

static void test_runtime_errors(void **state) {
    (void)state;
#ifndef KVP_CUDASIM
    skip(); /* the failure-injection hooks exist only in the simulator */
#else
    cudaGetLastError();
    void *p = nullptr;
    long before = cudasim::live_allocations();
    cudasim::fail_malloc_at(0);
    assert_int_equal(cudaMalloc(&p, 64), cudaErrorMemoryAllocation);
    assert_int_equal(cudaGetLastError(), cudaErrorMemoryAllocation);
    assert_int_equal(cudaMalloc(&p, 64), cudaSuccess);
    assert_int_equal(cudasim::live_allocations(), before + 1);
    /* a copy running past the end of an allocation */
    std::vector<char> host(128);
    assert_int_equal(cudaMemcpy(p, host.data(), 128, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
    assert_int_equal(cudaMemcpy(static_cast<char *>(p) + 32, host.data(), 32, cudaMemcpyHostToDevice),
                     cudaSuccess);
    int x = 0;
    assert_int_equal(cudaFree(&x), cudaErrorInvalidDevicePointer);
    assert_int_equal(cudaFree(p), cudaSuccess);
    assert_int_equal(cudasim::live_allocations(), before);
    float *f = dev_alloc<float>(8);
    LAUNCH_EXPECT(cudaErrorInvalidConfiguration, k_partial_warp, 1, 2048, 0, 0, f);
    cudasim::fail_next_launch(cudaErrorLaunchFailure);
    LAUNCH_EXPECT(cudaErrorLaunchFailure, k_partial_warp, 1, 8, 0, 0, f);
    LAUNCH_EXPECT(cudaSuccess, k_partial_warp, 1, 8, 0, 0, f);
    cudaFree(f);
    int n = -1;
    cudasim::set_no_device(true);
    assert_int_equal(cudaGetDeviceCount(&n), cudaErrorNoDevice);
    cudasim::set_no_device(false);
    assert_int_equal(cudaGetDeviceCount(&n), cudaSuccess);
    assert_int_equal(n, 1);
    cudaGetLastError();
#endif
}

/* Static __shared__ memory starts poisoned in every block of every launch,
 * as dynamic shared memory does: the second block must not see the first's
 * writes (class types included: __half). */
static void test_static_shared_starts_poisoned(void **state) {
    (void)state;
#ifndef KVP_CUDASIM
    skip(); /* on a GPU the values are undefined, not 0xA5 */
#else
    const int blocks = 3;
    unsigned char *d = dev_alloc<unsigned char>(64 * blocks);
    unsigned short *h = dev_alloc<unsigned short>(64 * blocks);
    for (int launch = 0; launch < 2; launch++) {
        LAUNCH_EXPECT(cudaSuccess, k_static_smem_uninit, blocks, 64, 0, 0, d, h);
        std::vector<unsigned char> out = from_dev(d, 64 * blocks);
        std::vector<unsigned short> hb = from_dev(h, 64 * blocks);
        for (int i = 0; i < 64 * blocks; i++) assert_int_equal(out[i], 0xA5);
        for (int i = 0; i < 64 * blocks; i++) assert_int_equal(hb[i], 0xA5A5);
    }
    cudaFree(d);
    cudaFree(h);
#endif
}

/* The CUDA runtime's per-thread last error: set by any failing call (a failed
 * launch included), returned and cleared by cudaGetLastError, returned by
 * cudaPeekAtLastError; KVP_LAUNCH reports its own launch only. */
static void test_last_error(void **state) {
    (void)state;
    (void)cudaGetLastError();
    assert_int_equal(cudaSetDevice(1 << 20), cudaErrorInvalidDevice); /* now pending */
    assert_int_equal(cudaPeekAtLastError(), cudaErrorInvalidDevice);
    assert_int_equal(cudaPeekAtLastError(), cudaErrorInvalidDevice); /* not cleared */
    /* another host thread has its own last error */
    cudaError_t other = cudaErrorUnknown;
    std::thread([&other]() { other = cudaPeekAtLastError(); }).join();
    assert_int_equal(other, cudaSuccess);
    /* a good launch returns its own status, and the engine's error stays pending */
    float *f = dev_alloc<float>(32);
    LAUNCH_EXPECT(cudaSuccess, k_saxpy, 1, 32, 0, 0, 32, 1.0f, f, f);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidDevice);
    assert_int_equal(cudaGetLastError(), cudaSuccess);
    /* a failed launch is returned and recorded */
    LAUNCH_EXPECT(cudaErrorInvalidConfiguration, k_saxpy, 1, 0, 0, 0, 32, 1.0f, f, f);
    assert_int_equal(cudaPeekAtLastError(), cudaErrorInvalidConfiguration);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidConfiguration);
    assert_int_equal(cudaGetLastError(), cudaSuccess);
    cudaFree(f);
}

/* Launch dimensions as an sm_90 GPU checks them. */
static void test_launch_limits(void **state) {
    (void)state;
    float *f = dev_alloc<float>(32);
    (void)cudaGetLastError();
    const dim3 bad_grids[] = {dim3(0, 1, 1), dim3(1, 0, 1), dim3(1, 1, 0), dim3(1, 65536, 1),
                              dim3(1, 1, 65536), dim3(2147483648u, 1, 1)};
    for (const dim3 &g : bad_grids) {
        LAUNCH_EXPECT(cudaErrorInvalidConfiguration, k_saxpy, g, 32, 0, 0, 0, 1.0f, f, f);
        assert_int_equal(cudaGetLastError(), cudaErrorInvalidConfiguration);
    }
    const dim3 bad_blocks[] = {dim3(0, 1, 1), dim3(1025, 1, 1), dim3(1, 1025, 1), dim3(1, 1, 65),
                               dim3(512, 2, 2), dim3(32, 32, 2)};
    for (const dim3 &b : bad_blocks) {
        LAUNCH_EXPECT(cudaErrorInvalidConfiguration, k_saxpy, 1, b, 0, 0, 0, 1.0f, f, f);
        assert_int_equal(cudaGetLastError(), cudaErrorInvalidConfiguration);
    }
#ifdef KVP_CUDASIM
    assert_non_null(strstr(cudasim::last_launch_error(), "1024 threads per block"));
#endif
    /* the largest blocks and grid.y/z still launch */
    LAUNCH_EXPECT(cudaSuccess, k_saxpy, 1, dim3(1, 1, 64), 0, 0, 0, 1.0f, f, f);
    LAUNCH_EXPECT(cudaSuccess, k_saxpy, 1, dim3(32, 32, 1), 0, 0, 0, 1.0f, f, f);
    LAUNCH_EXPECT(cudaSuccess, k_saxpy, dim3(1, 65535, 1), 1, 0, 0, 0, 1.0f, f, f);
    assert_int_equal(cudaGetLastError(), cudaSuccess);
    cudaFree(f);
}

/* Shared memory per block: 48 KiB (static + dynamic) by default; up to the
 * opt-in limit (227 KiB less the static) after cudaFuncSetAttribute. */
static void test_shared_memory_limits(void **state) {
    (void)state;
    (void)cudaGetLastError();
    cudaDeviceProp prop;
    assert_int_equal(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
    cudaFuncAttributes fa;
    assert_int_equal(cudaFuncGetAttributes(&fa, k_big_smem), cudaSuccess);
    size_t st = fa.sharedSizeBytes;
    assert_true(st < prop.sharedMemPerBlock);
    assert_int_equal((size_t)fa.maxDynamicSharedSizeBytes, prop.sharedMemPerBlock - st);
    int *d = dev_alloc<int>(1);
    size_t fits = prop.sharedMemPerBlock - st;
    LAUNCH_EXPECT(cudaSuccess, k_big_smem, 1, 32, fits, 0, fits, d);
    assert_int_equal(from_dev(d, 1)[0], 3);
    /* one byte more needs the opt-in */
    LAUNCH_EXPECT(cudaErrorInvalidValue, k_big_smem, 1, 32, fits + 1, 0, fits + 1, d);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidValue);
#ifdef KVP_CUDASIM
    assert_non_null(strstr(cudaGetErrorString(cudaErrorInvalidValue), "cudaFuncAttributeMaxDynamicSharedMemorySize"));
#endif
    size_t most = prop.sharedMemPerBlockOptin - st;
    assert_int_equal(prop.sharedMemPerBlockOptin, 232448);
    assert_int_equal(cudaFuncSetAttribute(k_big_smem, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)most + 1),
                     cudaErrorInvalidValue);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidValue);
    assert_int_equal(cudaFuncSetAttribute(k_big_smem, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)most),
                     cudaSuccess);
    assert_int_equal(cudaFuncGetAttributes(&fa, k_big_smem), cudaSuccess);
    assert_int_equal((size_t)fa.maxDynamicSharedSizeBytes, most);
    LAUNCH_EXPECT(cudaSuccess, k_big_smem, 1, 32, most, 0, most, d);
    assert_int_equal(from_dev(d, 1)[0], 3);
    LAUNCH_EXPECT(cudaErrorInvalidValue, k_big_smem, 1, 32, most + 1, 0, most + 1, d);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidValue);
    /* the attribute is the kernel's: another kernel keeps the default */
    LAUNCH_EXPECT(cudaErrorInvalidValue, k_reverse, 1, 32, fits + 1, 0, (const float *)nullptr, (float *)nullptr);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidValue);
    cudaFree(d);
}

/* Static + dynamic shared memory count together against the limits. */
static void test_static_plus_dynamic_shared_memory(void **state) {
    (void)state;
    (void)cudaGetLastError();
    int *d = dev_alloc<int>(1);
    LAUNCH_EXPECT(cudaSuccess, k_static_16k, 2, 128, 0, 0, (size_t)0, d);
    assert_int_equal(from_dev(d, 1)[0], 4095);
    cudaFuncAttributes fa;
    assert_int_equal(cudaFuncGetAttributes(&fa, k_static_16k), cudaSuccess);
    assert_int_equal(fa.sharedSizeBytes, 16384);
    assert_int_equal(fa.maxDynamicSharedSizeBytes, 48 * 1024 - 16384);
    size_t fits = 48 * 1024 - 16384;
    LAUNCH_EXPECT(cudaSuccess, k_static_16k, 2, 128, fits, 0, fits, d);
    LAUNCH_EXPECT(cudaErrorInvalidValue, k_static_16k, 2, 128, fits + 1, 0, fits + 1, d);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidValue);
    int most = 232448 - 16384;
    assert_int_equal(cudaFuncSetAttribute(k_static_16k, cudaFuncAttributeMaxDynamicSharedMemorySize, most + 1),
                     cudaErrorInvalidValue);
    assert_int_equal(cudaFuncSetAttribute(k_static_16k, cudaFuncAttributeMaxDynamicSharedMemorySize, most),
                     cudaSuccess);
    LAUNCH_EXPECT(cudaSuccess, k_static_16k, 1, 128, (size_t)most, 0, (size_t)most, d);
    /* occupancy: (16 KiB + 100 KiB + 1 KiB reserved) per block: one per SM */
    int n = -1;
    assert_int_equal(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k_static_16k, 128, 100 * 1024), cudaSuccess);
    assert_int_equal(n, 1);
    assert_int_equal(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k_static_16k, 128, 0), cudaSuccess);
    assert_int_equal(n, 13); /* 233472 / (16384 + 1024) */
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidValue); /* the refused attribute */
    cudaFree(d);
}

/* Device properties and the occupancy model of an H200 (sm_90). */
static void test_occupancy_and_properties(void **state) {
    (void)state;
    cudaDeviceProp prop;
    assert_int_equal(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
    assert_int_equal(prop.major, 9);
    assert_int_equal(prop.maxThreadsPerBlock, 1024);
    assert_int_equal(prop.maxThreadsDim[2], 64);
    assert_int_equal(prop.maxGridSize[0], 2147483647);
    assert_int_equal(prop.maxGridSize[1], 65535);
    assert_int_equal(prop.maxThreadsPerMultiProcessor, 2048);
    assert_int_equal(prop.maxBlocksPerMultiProcessor, 32);
    assert_int_equal(prop.sharedMemPerMultiprocessor, 233472);
    assert_int_equal(prop.reservedSharedMemPerBlock, 1024);
    int v = 0;
    assert_int_equal(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
    assert_int_equal(v, prop.multiProcessorCount);
    assert_int_equal(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0), cudaSuccess);
    assert_int_equal(v, 232448);
    assert_int_equal(cudaDeviceGetAttribute(&v, cudaDevAttrMaxBlockDimZ, 0), cudaSuccess);
    assert_int_equal(v, 64);
    assert_int_equal(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerMultiprocessor, 0), cudaSuccess);
    assert_int_equal(v, 233472);
    int n = -1;
    /* threads: 2048 per SM */
    assert_int_equal(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k_saxpy, 256, 0), cudaSuccess);
    assert_int_equal(n, 8);
    assert_int_equal(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k_saxpy, 1024, 0), cudaSuccess);
    assert_int_equal(n, 2);
    assert_int_equal(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k_saxpy, 40, 0), cudaSuccess);
    assert_int_equal(n, 32); /* 2 warps a block: the 32-block limit */
    /* shared memory: 228 KiB per SM, 1 KiB reserved per block */
    assert_int_equal(cudaFuncSetAttribute(k_saxpy, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024),
                     cudaSuccess);
    assert_int_equal(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k_saxpy, 128, 100 * 1024), cudaSuccess);
    assert_int_equal(n, 2);
    assert_int_equal(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k_saxpy, 128, 120 * 1024), cudaSuccess);
    assert_int_equal(n, 1);
    assert_int_equal(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k_saxpy, 128, 20 * 1024), cudaSuccess);
    assert_int_equal(n, 10);
    assert_int_equal(cudaFuncSetAttribute(k_saxpy, cudaFuncAttributeMaxDynamicSharedMemorySize, 0), cudaSuccess);
    assert_int_equal(cudaGetLastError(), cudaSuccess);
}

/* A misaligned 16-byte vector load faults on a GPU; in the simulator the
 * alignment sanitizer (SIM_CXXFLAGS) stops the program with a report. Run in
 * a child process, whose death and report are the test's result. */
static void test_misaligned_vector_load(void **state) {
    (void)state;
#ifndef KVP_CUDASIM
    skip(); /* on a GPU: cudaErrorMisalignedAddress, a sticky error */
#else
    unsigned char *p = dev_alloc<unsigned char>(16 * 33);
    uint4 *out = dev_alloc<uint4>(32);
    assert_int_equal(cudaMemset(p, 1, 16 * 33), cudaSuccess);
    LAUNCH_EXPECT(cudaSuccess, k_vector_load, 1, 32, 0, 0, p, 16, out); /* aligned: fine */
    assert_int_equal(from_dev(out, 1)[0].x, 0x01010101u);
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(fds[1], 2);
        close(fds[0]);
        cudaError_t e = KVP_LAUNCH(k_vector_load, 1, 32, 0, 0, p, 4, out);
        _exit(e == cudaSuccess ? 0 : 3); /* 0: the load went through unnoticed */
    }
    close(fds[1]);
    std::string report;
    char buf[512];
    ssize_t got;
    while ((got = read(fds[0], buf, sizeof buf)) > 0) report.append(buf, (size_t)got);
    close(fds[0]);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (!report.empty()) fprintf(stderr, "(expected) child's report: %.300s\n", report.c_str());
    assert_false(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    assert_non_null(strstr(report.c_str(), "misaligned address"));
    assert_non_null(strstr(report.c_str(), "uint4"));
    cudaFree(p);
    cudaFree(out);
#endif
}

/* Bytes i % 251: never 0xFF, the simulator's mark of a copy not landed. */
static std::vector<unsigned char> cpa_pattern(size_t n) {
    std::vector<unsigned char> v(n);
    for (size_t i = 0; i < n; i++) v[i] = (unsigned char)(i % 251);
    return v;
}

#ifdef KVP_CUDASIM
/* The launch failed, and its description says `phrase` and names the thread. */
static void expect_cp_async_report(cudaError_t rc, const char *phrase) {
    assert_int_equal(rc, cudaErrorLaunchFailure);
    assert_int_equal(cudaGetLastError(), cudaErrorLaunchFailure);
    const char *msg = cudasim::last_launch_error();
    if (strstr(msg, phrase) == NULL || strstr(msg, "block (1,0,0), thread (3,0,0)") == NULL)
        fail_msg("the launch's error \"%s\" lacks \"%s\" or the thread", msg, phrase);
}
#endif

/* Two- and three-stage cp.async pipelines deliver exactly the source. */
template <int STAGES> static void run_cp_async_pipeline(int blocks, int threads, int tiles) {
    size_t chunks = (size_t)blocks * tiles * 2 * threads;
    std::vector<unsigned char> src = cpa_pattern(chunks * 16);
    uint4 *dsrc = dev_alloc<uint4>(chunks), *dout = dev_alloc<uint4>(chunks);
    assert_int_equal(cudaMemcpy(dsrc, src.data(), src.size(), cudaMemcpyHostToDevice), cudaSuccess);
    size_t smem = (size_t)STAGES * 2 * threads * sizeof(uint4);
    LAUNCH_EXPECT(cudaSuccess, (k_cp_async_pipeline<STAGES, STAGES - 1>), blocks, threads, smem, 0,
                  (const uint4 *)dsrc, tiles, dout);
    std::vector<unsigned char> out(src.size());
    assert_int_equal(cudaMemcpy(out.data(), dout, out.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    assert_memory_equal(out.data(), src.data(), src.size());
    cudaFree(dsrc);
    cudaFree(dout);
}

static void test_cp_async_pipeline(void **state) {
    (void)state;
    run_cp_async_pipeline<2>(3, 64, 5);
    run_cp_async_pipeline<3>(3, 64, 5);
    run_cp_async_pipeline<3>(2, 96, 1); /* fewer tiles than stages: empty groups only */
}

/* The same pipeline waiting for one group too few: tile 0 is read before it
 * lands (0xFF), and tile 2 is copied into the stage where tile 0 is still in
 * flight (a race, which fails the launch). */
static void test_cp_async_pipeline_wait_too_short(void **state) {
    (void)state;
#ifndef KVP_CUDASIM
    skip(); /* on a GPU the copies may land early: the values are undefined */
#else
    const int threads = 64, tiles = 4, per_tile = 2 * threads;
    std::vector<unsigned char> src = cpa_pattern((size_t)tiles * per_tile * 16);
    uint4 *dsrc = dev_alloc<uint4>((size_t)tiles * per_tile), *dout = dev_alloc<uint4>((size_t)tiles * per_tile);
    assert_int_equal(cudaMemcpy(dsrc, src.data(), src.size(), cudaMemcpyHostToDevice), cudaSuccess);
    (void)cudaGetLastError();
    cudaError_t rc = KVP_LAUNCH((k_cp_async_pipeline<2, 2>), 1, threads, 2 * per_tile * sizeof(uint4), 0,
                                (const uint4 *)dsrc, tiles, dout);
    assert_int_equal(rc, cudaErrorLaunchFailure);
    assert_int_equal(cudaGetLastError(), cudaErrorLaunchFailure);
    assert_non_null(strstr(cudasim::last_launch_error(), "while a cp.async to it was in flight"));
    std::vector<unsigned char> out = from_dev(reinterpret_cast<unsigned char *>(dout), (size_t)per_tile * 16);
    for (unsigned char c : out) assert_int_equal(c, 0xFF);
    cudaFree(dsrc);
    cudaFree(dout);
#endif
}

/* A cp.async destination read before the wait holds 0xFF; after it, the source. */
static void test_cp_async_read_before_wait(void **state) {
    (void)state;
#ifndef KVP_CUDASIM
    skip(); /* on a GPU the copy may have landed: the value is undefined */
#else
    const int n = 64;
    std::vector<unsigned char> src = cpa_pattern(n * 16);
    uint4 *dsrc = dev_alloc<uint4>(n), *before = dev_alloc<uint4>(n), *after = dev_alloc<uint4>(n);
    assert_int_equal(cudaMemcpy(dsrc, src.data(), src.size(), cudaMemcpyHostToDevice), cudaSuccess);
    LAUNCH_EXPECT(cudaSuccess, k_cp_async_read_early, 1, n, n * sizeof(uint4), 0, (const uint4 *)dsrc, before,
                  after);
    std::vector<unsigned char> b = from_dev(reinterpret_cast<unsigned char *>(before), n * 16);
    std::vector<unsigned char> a = from_dev(reinterpret_cast<unsigned char *>(after), n * 16);
    for (unsigned char c : b) assert_int_equal(c, 0xFF);
    assert_memory_equal(a.data(), src.data(), src.size());
    cudaFree(dsrc);
    cudaFree(before);
    cudaFree(after);
#endif
}

/* wait_group N lands the committed groups but the newest N, oldest first;
 * empty groups count; the open group is never waited for. */
static void test_cp_async_groups_land_oldest_first(void **state) {
    (void)state;
#ifndef KVP_CUDASIM
    skip(); /* on a GPU a group may land before its wait */
#else
    const int n = 40;
    std::vector<unsigned char> src = cpa_pattern(n * 48);
    unsigned char *dsrc = dev_alloc<unsigned char>(n * 48), *dsnap = dev_alloc<unsigned char>(n * 4 * 48);
    to_dev(dsrc, src);
    LAUNCH_EXPECT(cudaSuccess, k_cp_async_groups, 1, n, n * 48, 0, (const unsigned char *)dsrc, dsnap);
    std::vector<unsigned char> snap = from_dev(dsnap, n * 4 * 48);
    const unsigned char ff[16] = {0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF,
                                  0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF};
    std::vector<unsigned char> untouched(16, 0xA5); /* shared memory's poison: c not yet started */
    for (int t = 0; t < n; t++) {
        const unsigned char *want = src.data() + 48 * t, *s = snap.data() + 4 * 48 * t;
        /* after wait(1) with groups 0 and 1 committed: a landed, b not */
        assert_memory_equal(s, want, 16);
        assert_memory_equal(s + 16, ff, 16);
        assert_memory_equal(s + 32, untouched.data(), 16);
        /* after wait(1) with the empty group 2 newest: b landed, c (open) not */
        assert_memory_equal(s + 48, want, 32);
        assert_memory_equal(s + 48 + 32, ff, 16);
        /* wait(0) leaves the open group in flight */
        assert_memory_equal(s + 96, want, 32);
        assert_memory_equal(s + 96 + 32, ff, 16);
        /* committed, then waited for */
        assert_memory_equal(s + 144, want, 48);
    }
    cudaFree(dsrc);
    cudaFree(dsnap);
#endif
}

/* Every misuse of cp.async fails the launch with a description naming the
 * thread; a correct launch of the same kernel passes before and after. */
static void test_cp_async_misuse_is_reported(void **state) {
    (void)state;
#ifndef KVP_CUDASIM
    skip(); /* on a GPU: faults (sticky) or silent races */
#else
    const int threads = 64;
    const size_t src_bytes = threads * 16 + 8, smem = threads * 16;
    std::vector<unsigned char> src = cpa_pattern(src_bytes);
    unsigned char *dsrc = dev_alloc<unsigned char>(src_bytes), *ddst = dev_alloc<unsigned char>(2 * threads * 16);
    alignas(16) static const unsigned char host[16] = {1, 2, 3};
    const struct {
        int what;
        const char *phrase;
    } cases[] = {
        {CPA_SIZE, "the size must be 4, 8 or 16"},
        {CPA_MISALIGNED_DST, "misaligned destination"},
        {CPA_MISALIGNED_SRC, "misaligned source"},
        {CPA_DST_GLOBAL, "not in the block's shared memory"},
        {CPA_DST_PAST_SMEM, "not in the block's shared memory"},
        {CPA_SRC_PAST_END, "not inside a live device allocation"},
        {CPA_SRC_HOST, "not inside a live device allocation"},
        {CPA_DST_RACE, "was written while a cp.async to it was in flight"},
        {CPA_SRC_RACE, "changed while the copy was in flight"},
        {CPA_EXIT_COMMITTED, "not waited for: 1 committed, 0 never committed"},
        {CPA_EXIT_OPEN, "not waited for: 0 committed, 1 never committed"},
        {CPA_NEGATIVE_WAIT, "negative count"},
    };
    static_assert(sizeof cases / sizeof cases[0] == CPA_CASES - 2, "one row per misuse");
    (void)cudaGetLastError();
    for (int what : {(int)CPA_NONE, (int)CPA_STATIC_DST}) {
        to_dev(dsrc, src);
        LAUNCH_EXPECT(cudaSuccess, k_cp_async_misuse, 2, threads, smem, 0, what, dsrc, src_bytes, host, smem,
                      ddst);
        std::vector<unsigned char> out = from_dev(ddst, 2 * threads * 16);
        assert_memory_equal(out.data(), src.data(), threads * 16);
        assert_memory_equal(out.data() + threads * 16, src.data(), threads * 16);
    }
    for (const auto &c : cases) {
        to_dev(dsrc, src);
        cudaError_t rc = KVP_LAUNCH(k_cp_async_misuse, 2, threads, smem, 0, c.what, dsrc, src_bytes, host, smem,
                                    ddst);
        expect_cp_async_report(rc, c.phrase);
    }
    to_dev(dsrc, src);
    LAUNCH_EXPECT(cudaSuccess, k_cp_async_misuse, 2, threads, smem, 0, (int)CPA_NONE, dsrc, src_bytes, host,
                  smem, ddst);
    cudaFree(dsrc);
    cudaFree(ddst);
#endif
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grid_stride),
        cmocka_unit_test(test_block_reduction),
        cmocka_unit_test(test_warp_shuffles),
        cmocka_unit_test(test_shuffle_width),
        cmocka_unit_test(test_votes),
        cmocka_unit_test(test_atomics_across_blocks),
        cmocka_unit_test(test_dynamic_shared_memory),
        cmocka_unit_test(test_multi_dimensional_indices),
        cmocka_unit_test(test_partial_warp),
        cmocka_unit_test(test_divergence_is_reported),
        cmocka_unit_test(test_half_types),
        cmocka_unit_test(test_dp4a),
        cmocka_unit_test(test_shared_memory_starts_poisoned),
        cmocka_unit_test(test_memcpy_2d),
        cmocka_unit_test(test_runtime_errors),
        cmocka_unit_test(test_static_shared_starts_poisoned),
        cmocka_unit_test(test_last_error),
        cmocka_unit_test(test_launch_limits),
        cmocka_unit_test(test_shared_memory_limits),
        cmocka_unit_test(test_static_plus_dynamic_shared_memory),
        cmocka_unit_test(test_occupancy_and_properties),
        cmocka_unit_test(test_misaligned_vector_load),
        cmocka_unit_test(test_cp_async_pipeline),
        cmocka_unit_test(test_cp_async_pipeline_wait_too_short),
        cmocka_unit_test(test_cp_async_read_before_wait),
        cmocka_unit_test(test_cp_async_groups_land_oldest_first),
        cmocka_unit_test(test_cp_async_misuse_is_reported),
    };
    return cmocka_run_group_tests_name("cudasim", tests, NULL, NULL);
}
