/*
 * One source, two compilers: the CUDA backend's .cu files include this header
 * instead of <cuda_runtime.h>. Under nvcc it is the CUDA runtime; with
 * -DKVP_CUDASIM the same sources compile as C++ against the kernel simulator
 * in tests/cudasim/, which is how CI (no GPU) executes every kernel.
 *
 * Kernel code uses two macros instead of syntax a C++ compiler lacks:
 *   KVP_LAUNCH(kernel, grid, block, smem_bytes, stream, args...)
 *       launches and evaluates to this launch's cudaError_t; an error the
 *       caller had pending (cudaGetLastError) is neither returned nor
 *       cleared, and a failed launch becomes the pending error, as with any
 *       failing runtime call (cudaLaunchKernelEx under nvcc)
 *   KVP_DYNAMIC_SMEM(type, name)   declares `type *name` = dynamic shared memory
 *
 * and three functions for the asynchronous global -> shared copy of sm_80+
 * (cp.async; the simulator models it, see tests/cudasim/cudasim.h):
 *   kvp_cp_async16(smem_dst, global_src)  starts a 16-byte copy (both 16-byte aligned)
 *   kvp_cp_async_commit()                 closes the thread's group of started copies
 *   kvp_cp_async_wait<N>()                waits until at most N of the thread's groups
 *                                         are in flight; their bytes are then visible to
 *                                         this thread, and to the block after a barrier
 * Built for an architecture below sm_80, the copy is a plain load and store.
 *
 * kvp_dp4a_us(a, b, c) is c plus the four products of a's unsigned bytes by
 * b's signed bytes (PTX dp4a.u32.s32, sm_61+), which CUDA's __dp4a
 * overloads (both signed or both unsigned) do not offer.
 */
#ifndef KVPAGE_CUDA_COMPAT_CUH
#define KVPAGE_CUDA_COMPAT_CUH

#ifdef KVP_CUDASIM
#include <cudasim.h> /* the simulator (tests/cudasim), found on the include path */
#else
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <utility>

namespace kvp_compat {
/* A launch through cudaLaunchKernelEx (CUDA 12+, cuda_runtime.h's C++
 * template): it returns this launch's own status. `kernel<<<...>>>` followed by
 * cudaGetLastError() would instead return, and clear, an error the caller had
 * pending from its own earlier CUDA work, and blame the launch for it. A
 * failed launch is still recorded as the thread's last error, as any failing
 * runtime call is. */
template <typename... KArgs, typename... Args>
static inline cudaError_t launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                                 cudaStream_t stream, Args &&...args) {
    cudaLaunchConfig_t config = {};
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = smem;
    config.stream = stream;
    config.attrs = nullptr;
    config.numAttrs = 0;
    return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}
} // namespace kvp_compat

/* Evaluates to the launch's status (not an earlier pending error, which stays
 * pending), like cudasim::launch. */
#define KVP_LAUNCH(kernel, grid, block, smem, stream, ...) \
    kvp_compat::launch((kernel), dim3(grid), dim3(block), (size_t)(smem), (stream), __VA_ARGS__)
#define KVP_DYNAMIC_SMEM(type, name)                                  \
    extern __shared__ __align__(16) unsigned char kvp_dynamic_smem_[]; \
    type *name = reinterpret_cast<type *>(kvp_dynamic_smem_)

__device__ __forceinline__ void kvp_cp_async16(void *smem_dst, const void *global_src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    /* .cg: cached in L2 only; K/V pages are streamed once per call */
    const unsigned dst = (unsigned)__cvta_generic_to_shared(smem_dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(global_src) : "memory");
#else
    *reinterpret_cast<uint4 *>(smem_dst) = *reinterpret_cast<const uint4 *>(global_src);
#endif
}
__device__ __forceinline__ void kvp_cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
template <int N> __device__ __forceinline__ void kvp_cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}
__device__ __forceinline__ int kvp_dp4a_us(unsigned a, unsigned b, int c) {
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
#endif

#ifdef KVP_CUDASIM
static inline void kvp_cp_async16(void *smem_dst, const void *global_src) {
    cudasim::cp_async(smem_dst, global_src, 16);
}
static inline void kvp_cp_async_commit() { cudasim::cp_async_commit(); }
template <int N> static inline void kvp_cp_async_wait() { cudasim::cp_async_wait(N); }
static inline int kvp_dp4a_us(unsigned a, unsigned b, int c) {
    for (int i = 0; i < 4; i++)
        c += (int)((a >> (8 * i)) & 0xffu) * (int)(int8_t)(uint8_t)(b >> (8 * i));
    return c;
}
#endif

#endif
