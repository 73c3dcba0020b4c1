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

#include <vector>

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
    assert_int_equal(cudaGetLastError(), cudaSuccess); /* returned by the launch, not pending */
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
    };
    return cmocka_run_group_tests_name("cudasim", tests, NULL, NULL);
}
