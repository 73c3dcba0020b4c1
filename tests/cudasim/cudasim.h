/*
 * cudasim — run CUDA kernel sources on the CPU, for tests on machines
 * without a GPU (in the spirit of Numba's CUDA simulator).
 *
 * The same .cu source is compiled as C++ with -DKVP_CUDASIM; this header
 * replaces what nvcc provides:
 *
 *   - threadIdx / blockIdx / blockDim / gridDim / warpSize;
 *   - __shared__ (static, sized at compile time) and dynamic shared memory
 *     (KVP_DYNAMIC_SMEM, see below); both start every block poisoned (0xA5),
 *     so a kernel that reads shared memory before writing it sees garbage as
 *     on a GPU, never the previous block's values;
 *   - __syncthreads, __syncwarp, warp shuffles (__shfl_sync, _up, _down,
 *     _xor), votes (__ballot_sync, __all_sync, __any_sync, __activemask);
 *   - atomics (atomicAdd, atomicSub, atomicMax, atomicMin, atomicExch,
 *     atomicCAS, atomicOr, atomicAnd) and common device intrinsics;
 *   - fp16 / bf16 / fp8 types: the toolkit's own cuda_fp16.h, cuda_bf16.h
 *     and cuda_fp8.h, which compile for the host;
 *   - a small CUDA runtime (cudaMalloc, cudaMallocHost, cudaMemcpy[2D][Async],
 *     cudaMemset[Async], streams, events, errors, device properties and
 *     attributes, cudaFuncSetAttribute / cudaFuncGetAttributes,
 *     cudaOccupancyMaxActiveBlocksPerMultiprocessor) backed by host memory;
 *     copies check that device and pinned ranges lie inside one live
 *     allocation;
 *   - the runtime's per-thread last error: every failing call, a failed
 *     launch included, records its error; cudaGetLastError returns and
 *     clears it, cudaPeekAtLastError returns it;
 *   - the launch limits of an sm_90 GPU (H100 / H200): grid.x <= 2^31 - 1,
 *     grid.y/z <= 65535, blocks of at most 1024 threads with x, y <= 1024 and
 *     z <= 64, no zero dimension (else cudaErrorInvalidConfiguration); shared
 *     memory per block (static + dynamic) at most 48 KiB unless the kernel
 *     opted in with cudaFuncSetAttribute(kernel,
 *     cudaFuncAttributeMaxDynamicSharedMemorySize, n), and at most 227 KiB
 *     (sharedMemPerBlockOptin) even then (else cudaErrorInvalidValue);
 *   - occupancy (cudaOccupancyMaxActiveBlocksPerMultiprocessor) from threads
 *     (2048 per SM), blocks (32 per SM) and shared memory (228 KiB per SM,
 *     1 KiB reserved per block); NOT registers, which the simulator does not
 *     know (cudaFuncGetAttributes reports numRegs 0), so a GPU may fit fewer;
 *   - cp.async, the asynchronous global -> shared copy of sm_80+
 *     (cudasim::cp_async / cp_async_commit / cp_async_wait: cp.async,
 *     commit_group, wait_group; the CUDA sources reach them through the
 *     wrappers of cuda/compat.cuh), per CUDA thread: a copy joins the
 *     thread's open group, and its destination is filled with 0xFF at once
 *     (NaN in fp32 / fp16 / bf16, 255 in a byte), so a kernel that reads
 *     it before waiting gets wrong results; the source is read, and the
 *     bytes land, only when a wait retires the copy's group (committed
 *     groups oldest first; the open group never). Each of these makes the
 *     launch fail (cudaErrorLaunchFailure) with a description naming the
 *     block and thread: a size other than 4, 8 or 16 bytes, a misaligned
 *     address, a destination outside the block's shared memory (its
 *     dynamic shared memory, or the storage of static __shared__
 *     variables: the launching thread's thread-local storage, so a copy
 *     into a host thread-local passes too), a source outside every live
 *     cudaMalloc allocation (pinned or plain host memory is outside), a
 *     destination written between the start and the landing, a source
 *     written in that time (races), and a thread that exits with copies
 *     not waited for, committed or not. A copy lands at its wait, never
 *     earlier (on a GPU, at any time in between): the latest landing, so
 *     a read that is correct only once the copy has landed fails here
 *     unless a wait comes first;
 *   - misaligned vector loads (uint4, float4, int2, __half2 ... through
 *     reinterpret_cast), which fault on a GPU: the simulator's objects are
 *     built with -fsanitize=alignment -fno-sanitize-recover=alignment (the
 *     Makefile's SIM_CXXFLAGS; the toolkit's vector types carry their
 *     alignment on the host), so the test stops with a report naming the
 *     type and source line.
 *
 * Kernels are launched with KVP_LAUNCH(kernel, grid, block, smem, stream,
 * args...), which is cudaLaunchKernelEx under nvcc and cudasim::launch(...)
 * here: both evaluate to this launch's status, leave an error the caller had
 * pending untouched, and record a failed launch as the last error.
 *
 * Static shared memory: `__shared__` makes the variable static and
 * thread_local (a section attribute would be simpler, but GCC before 14
 * drops it from the statics of function templates, and kernels are
 * templates). The blocks run on the launching thread; its thread-local
 * storage (the PT_TLS segment of the module holding the simulator) is saved,
 * memset to 0xA5 before each block, and restored after the grid, so the host
 * code's own thread-locals (the last error, ...) survive the launch. Kernels
 * must not use host thread-locals (they see them poisoned; none do).
 * AddressSanitizer puts no redzones around thread-locals: under SAN=1 an
 * overflow from one __shared__ array into the next goes unreported (as on a
 * GPU, where shared memory is one window). The simulator does not know
 * which kernel declares which variable: after each block it counts the
 * 16-byte granules of that storage the block wrote, and the largest count
 * seen so far is the kernel's static shared memory, for the limits above,
 * cudaFuncGetAttributes (sharedSizeBytes) and occupancy. That is a lower
 * bound of what nvcc gives it (a variable never written is not counted) and
 * is 0 before the kernel's first launch: a first launch whose static memory
 * turns out too large has run by the time it fails.
 *
 * Execution model: blocks run one after another; inside a block every CUDA
 * thread is a cooperative fiber that runs until it reaches a barrier
 * (__syncthreads, a warp collective) or returns. Fibers switch with a few
 * instructions of assembly on x86-64 (callee-saved registers, SSE/x87
 * control words, stack pointer: about 7 million thread-barrier crossings a
 * second, 4x swapcontext, which makes two system calls per switch), and
 * with ucontext elsewhere or when CUDASIM_UCONTEXT=1 is set. So within a block,
 * all threads see each other's shared-memory writes at every barrier, exactly
 * as CUDA promises, and a kernel whose threads disagree on barriers (one
 * thread skips a __syncthreads the others reach, a shuffle with lanes
 * missing) is reported as a launch failure with a description, instead of
 * hanging.
 *
 * What it does NOT model (kernels must not rely on any of it):
 *   - memory ordering and races between blocks (blocks never overlap here;
 *     on a GPU they do), nor between threads of a block between barriers
 *     (a fiber runs uninterrupted until its next barrier);
 *   - timing, registers (per thread, per block, per SM: a launch that needs
 *     more registers than a GPU has runs here), bank conflicts, the shared
 *     memory carveout (cudaFuncAttributePreferredSharedMemoryCarveout is
 *     accepted and stored only), clusters, cooperative launches;
 *   - errors a GPU reports asynchronously (a fault in a kernel, a
 *     divergence): here the launch itself returns them, and they are not
 *     sticky (the simulator stays usable);
 *   - independent thread scheduling within a warp between collectives;
 *   - threads that exit while others wait at __syncthreads: reported as a
 *     divergence (undefined in CUDA, though recent GPUs often let it pass);
 *   - warp collectives whose lanes use different masks: every lane named in
 *     `mask` must call the same collective with the same mask (CUDA's rule);
 *   - asynchronous streams: every call completes before it returns, so a
 *     host buffer reused before an async copy would have run on a GPU goes
 *     unnoticed;
 *   - out-of-bounds accesses to device memory inside kernels, except under
 *     `make test SAN=1` (AddressSanitizer sees the host allocations behind
 *     cudaMalloc), and except the sources of cp.async, always checked;
 *   - a write to a cp.async destination while the copy is in flight is
 *     seen only when the write leaves a byte other than 0xFF, and one to
 *     its source only when the value changes.
 */
#ifndef KVPAGE_CUDASIM_H
#define KVPAGE_CUDASIM_H

#ifndef __cplusplus
#error "cudasim.h is C++: compile .cu sources as C++ (-x c++) with -DKVP_CUDASIM"
#endif

/* Location qualifiers, defined before the toolkit headers see them. */
#define __host__
#define __device__
#define __global__
/* Static shared memory: a __shared__ variable is thread-local; the launcher
 * saves the launching thread's thread-local storage, poisons it (0xA5) before
 * each block, as it does dynamic shared memory, and restores it after the
 * grid (see the header comment). CUDA forbids initializers on __shared__, so
 * constructors are trivial: class types (__half arrays, ...) work. */
#define __shared__ static thread_local __attribute__((aligned(16)))
#define __constant__ static
#define __managed__
#define __launch_bounds__(...)
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __restrict__ __restrict

#include <builtin_types.h>
#include <cuda_runtime_api.h>
#include <vector_functions.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <tuple>
#include <utility>

namespace cudasim {

/* ---- per-thread built-ins: set by the scheduler before a fiber runs ------ */
extern uint3 cur_threadIdx;
extern uint3 cur_blockIdx;
extern dim3 cur_blockDim;
extern dim3 cur_gridDim;

/* ---- barriers and collectives (implemented in cudasim.cpp) ----------------- */
void syncthreads();
void syncwarp(unsigned mask);
/* Exchange 8 bytes among the lanes of `mask`; returns lane `src`'s value. */
uint64_t warp_exchange(unsigned mask, uint64_t mine, int src_lane);
/* Ballot among the lanes of `mask`; *participants (optional) receives the
 * lanes that took part (those of `mask` that exist and have not exited). */
unsigned warp_ballot(unsigned mask, int pred, unsigned *participants);
unsigned active_mask();
unsigned lane_id();

/* Pointer to the dynamic shared memory of the running block. */
void *dynamic_smem();

/* ---- cp.async (sm_80+), per CUDA thread; see the header comment ------------------ */
/* cp.async.{ca,cg}.shared.global: a copy of `bytes` (4, 8 or 16; both
 * addresses aligned to it) into the calling thread's open group. The
 * destination reads 0xFF until a wait lands the copy. */
void cp_async(void *smem_dst, const void *gmem_src, size_t bytes);
/* cp.async.commit_group: closes the open group (an empty one too). */
void cp_async_commit();
/* cp.async.wait_group N: lands every committed group but the newest
 * `pending`, oldest first; 0 lands them all. The open group is not waited
 * for (nor committed: PTX's wait_all, which commits, is not modelled). */
void cp_async_wait(int pending);

/* ---- launching --------------------------------------------------------------- */
/* Runs body(thread) for every thread of every block of `func` (the kernel, for
 * its attributes: cudaFuncSetAttribute). Returns cudaSuccess or the launch's
 * error (cudaErrorInvalidConfiguration for bad dimensions, cudaErrorInvalidValue
 * for too much shared memory, cudaErrorLaunchFailure for a divergence or a
 * misused cp.async), with a description readable via last_launch_error() and
 * cudaGetErrorString. Like the CUDA runtime's cudaLaunchKernelEx (which
 * KVP_LAUNCH is under nvcc), a failure is also recorded as the thread's last
 * error (cudaGetLastError); a success leaves an error already pending
 * untouched. */
cudaError_t launch_blocks(const void *func, dim3 grid, dim3 block, size_t smem,
                          const std::function<void()> &body);
const char *last_launch_error();

template <typename... KArgs, typename... Args>
cudaError_t launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                   cudaStream_t stream, Args &&...args) {
    (void)stream;
    /* Arguments are passed by value to every thread, as CUDA copies them. */
    std::tuple<typename std::decay<KArgs>::type...> packed(std::forward<Args>(args)...);
    return launch_blocks(reinterpret_cast<const void *>(kernel), grid, block, smem,
                         [&]() { std::apply(kernel, packed); });
}


/* ---- test hooks -------------------------------------------------------------- */
/* Make the n-th next cudaMalloc / cudaMallocHost fail (0 = the next one);
 * -1 disables. */
void fail_malloc_at(long n);
/* Make the next kernel launch fail with `e` without running it. */
void fail_next_launch(cudaError_t e);
/* Number of device allocations not yet freed. */
long live_allocations();
/* Pretend there is no device (cudaGetDeviceCount -> cudaErrorNoDevice). */
void set_no_device(bool none);
/* The device's largest pitch for 2D copies (cudaDevAttrMaxPitch; a copy with
 * a larger pitch fails with cudaErrorInvalidPitchValue, as on hardware);
 * 0 restores the hardware's 2^31 - 1. */
void set_max_pitch(size_t bytes);

} // namespace cudasim

/* The CUDA runtime's C++ overloads (cuda_runtime.h, which the simulator does
 * not include): a kernel is passed as itself, not as `const void *`. */
template <class T>
static inline cudaError_t cudaFuncSetAttribute(T *func, enum cudaFuncAttribute attr, int value) {
    return ::cudaFuncSetAttribute(reinterpret_cast<const void *>(func), attr, value);
}
template <class T>
static inline cudaError_t cudaFuncGetAttributes(struct cudaFuncAttributes *attr, T *entry) {
    return ::cudaFuncGetAttributes(attr, reinterpret_cast<const void *>(entry));
}
template <class T>
static inline cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *numBlocks, T func,
                                                                        int blockSize,
                                                                        size_t dynamicSMemSize) {
    return ::cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        numBlocks, reinterpret_cast<const void *>(func), blockSize, dynamicSMemSize);
}

#define threadIdx (cudasim::cur_threadIdx)
#define blockIdx (cudasim::cur_blockIdx)
#define blockDim (cudasim::cur_blockDim)
#define gridDim (cudasim::cur_gridDim)
static constexpr int warpSize = 32;

#define KVP_LAUNCH(kernel, grid, block, smem, stream, ...) \
    cudasim::launch(kernel, dim3(grid), dim3(block), (smem), (stream), __VA_ARGS__)

/* Dynamic shared memory: `KVP_DYNAMIC_SMEM(float, buf);` declares `float *buf`. */
#define KVP_DYNAMIC_SMEM(type, name) type *name = static_cast<type *>(cudasim::dynamic_smem())

/* ---- synchronisation ------------------------------------------------------------ */
inline void __syncthreads() { cudasim::syncthreads(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { cudasim::syncwarp(mask); }
inline void __threadfence() {}
inline void __threadfence_block() {}
inline unsigned __activemask() { return cudasim::active_mask(); }

/* ---- warp shuffles and votes ------------------------------------------------------ */
namespace cudasim {
template <typename T> inline uint64_t to_bits(T v) {
    static_assert(sizeof(T) <= 8, "shuffle of a type wider than 8 bytes");
    uint64_t b = 0;
    std::memcpy(&b, &v, sizeof v);
    return b;
}
template <typename T> inline T from_bits(uint64_t b) {
    T v;
    std::memcpy(&v, &b, sizeof v);
    return v;
}
/* The lane a shuffle reads, CUDA's rules for `width` sub-sections. */
inline int shfl_src_idx(int lane, int src, int width) { return (lane & ~(width - 1)) + (src & (width - 1)); }
} // namespace cudasim

template <typename T> inline T __shfl_sync(unsigned mask, T var, int src, int width = 32) {
    int lane = (int)cudasim::lane_id();
    int from = cudasim::shfl_src_idx(lane, src, width);
    return cudasim::from_bits<T>(cudasim::warp_exchange(mask, cudasim::to_bits(var), from));
}
template <typename T> inline T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32) {
    int lane = (int)cudasim::lane_id();
    int from = lane ^ lane_mask;
    if ((from & ~(width - 1)) != (lane & ~(width - 1))) from = lane; /* outside the section */
    return cudasim::from_bits<T>(cudasim::warp_exchange(mask, cudasim::to_bits(var), from));
}
template <typename T> inline T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32) {
    int lane = (int)cudasim::lane_id();
    int from = lane + (int)delta;
    if ((from & ~(width - 1)) != (lane & ~(width - 1))) from = lane;
    return cudasim::from_bits<T>(cudasim::warp_exchange(mask, cudasim::to_bits(var), from));
}
template <typename T> inline T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = 32) {
    int lane = (int)cudasim::lane_id();
    int from = lane - (int)delta;
    if (from < (lane & ~(width - 1))) from = lane;
    return cudasim::from_bits<T>(cudasim::warp_exchange(mask, cudasim::to_bits(var), from));
}
inline unsigned __ballot_sync(unsigned mask, int pred) {
    return cudasim::warp_ballot(mask, pred, nullptr);
}
inline int __all_sync(unsigned mask, int pred) {
    unsigned who = 0;
    unsigned yes = cudasim::warp_ballot(mask, pred, &who);
    return yes == who;
}
inline int __any_sync(unsigned mask, int pred) { return cudasim::warp_ballot(mask, pred, nullptr) != 0; }

/* ---- atomics (fibers never interleave inside one: plain read-modify-write) ---- */
template <typename T> inline T atomicAdd(T *p, T v) { T o = *p; *p = o + v; return o; }
template <typename T> inline T atomicSub(T *p, T v) { T o = *p; *p = o - v; return o; }
template <typename T> inline T atomicMax(T *p, T v) { T o = *p; if (v > o) *p = v; return o; }
template <typename T> inline T atomicMin(T *p, T v) { T o = *p; if (v < o) *p = v; return o; }
template <typename T> inline T atomicExch(T *p, T v) { T o = *p; *p = v; return o; }
template <typename T> inline T atomicCAS(T *p, T cmp, T v) { T o = *p; if (o == cmp) *p = v; return o; }
template <typename T> inline T atomicOr(T *p, T v) { T o = *p; *p = o | v; return o; }
template <typename T> inline T atomicAnd(T *p, T v) { T o = *p; *p = o & v; return o; }

/* ---- device intrinsics ------------------------------------------------------------ */
template <typename T> inline T __ldg(const T *p) { return *p; }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __log2f(float x) { return std::log2(x); }
inline float __powf(float x, float y) { return std::pow(x, y); }
inline float __fdividef(float x, float y) { return x / y; }
inline float __saturatef(float x) { return x < 0.f ? 0.f : (x > 1.f ? 1.f : (x == x ? x : 0.f)); }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fsqrt_rn(float x) { return std::sqrt(x); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __int_as_float(int x) { float f; std::memcpy(&f, &x, 4); return f; }
inline int __float_as_int(float f) { int x; std::memcpy(&x, &f, 4); return x; }
inline float __uint_as_float(unsigned x) { float f; std::memcpy(&f, &x, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned x; std::memcpy(&x, &f, 4); return x; }
inline int __float2int_rn(float x) { return (int)std::nearbyint(x); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
inline unsigned __brev(unsigned x) {
    unsigned r = 0;
    for (int i = 0; i < 32; i++) r |= ((x >> i) & 1u) << (31 - i);
    return r;
}
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    uint64_t v = ((uint64_t)y << 32) | x;
    unsigned r = 0;
    for (int i = 0; i < 4; i++) r |= (unsigned)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
    return r;
}
/* Four signed 8-bit products summed into c (sm_61+). */
inline int __dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; i++) c += (int)(int8_t)(a >> (8 * i)) * (int)(int8_t)(b >> (8 * i));
    return c;
}
inline unsigned __dp4a(unsigned a, unsigned b, unsigned c) {
    for (int i = 0; i < 4; i++) c += ((a >> (8 * i)) & 0xffu) * ((b >> (8 * i)) & 0xffu);
    return c;
}
inline int __mul24(int a, int b) { return a * b; }
inline long long clock64() { return 0; }

#endif /* KVPAGE_CUDASIM_H */
