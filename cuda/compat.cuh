/*
 * One source, two compilers: the CUDA backend's .cu files include this header
 * instead of <cuda_runtime.h>. Under nvcc it is the CUDA runtime; with
 * -DKVP_CUDASIM the same sources compile as C++ against the kernel simulator
 * in tests/cudasim/, which is how CI (no GPU) executes every kernel.
 *
 * Kernel code uses two macros instead of syntax a C++ compiler lacks:
 *   KVP_LAUNCH(kernel, grid, block, smem_bytes, stream, args...)
 *       launches and evaluates to the launch's cudaError_t
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

/* Evaluates to the launch's status, like cudasim::launch. */
#define KVP_LAUNCH(kernel, grid, block, smem, stream, ...) \
    (kernel<<<(grid), (block), (smem), (stream)>>>(__VA_ARGS__), cudaGetLastError())
#define KVP_DYNAMIC_SMEM(type, name)                                  \
    extern __shared__ __align__(16) unsigned char kvp_dynamic_smem_[]; \
    type *name = reinterpret_cast<type *>(kvp_dynamic_smem_)
#endif

#endif
