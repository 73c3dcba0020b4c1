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
#endif

#endif
