/*
 * Which instruction sets this CPU (and OS) can run, probed at run time so the
 * library is built without -march flags and runs anywhere.
 */
#include "../backend.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

static bool has_f16c(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
    return (c & (1u << 29)) != 0;
}

bool kvp__cpu_has_avx2(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c();
}

bool kvp__cpu_has_avx512(void) {
    __builtin_cpu_init();
    return kvp__cpu_has_avx2() && __builtin_cpu_supports("avx512f") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512vnni");
}

bool kvp__cpu_has_avx512_bf16(void) {
    return kvp__cpu_has_avx512() && __builtin_cpu_supports("avx512bf16");
}
#else
bool kvp__cpu_has_avx2(void) { return false; }
bool kvp__cpu_has_avx512(void) { return false; }
bool kvp__cpu_has_avx512_bf16(void) { return false; }
#endif

#if defined(__aarch64__) && !defined(__AARCH64EB__) && defined(__linux__)
#include <sys/auxv.h>

/* The kernel's hwcap bits (asm/hwcap.h), spelled out for libcs whose
 * headers lack them. */
#define KVP_HWCAP_FP (1ul << 0)
#define KVP_HWCAP_ASIMD (1ul << 1)
#define KVP_HWCAP_ASIMDDP (1ul << 20)

bool kvp__cpu_has_neon(void) {
    unsigned long h = getauxval(AT_HWCAP);
    return (h & KVP_HWCAP_FP) && (h & KVP_HWCAP_ASIMD);
}

bool kvp__cpu_has_neon_dotprod(void) {
    return kvp__cpu_has_neon() && (getauxval(AT_HWCAP) & KVP_HWCAP_ASIMDDP) != 0;
}
#elif defined(__aarch64__) && !defined(__AARCH64EB__)
/* Advanced SIMD is part of every AArch64 ABI; the dot products are not
 * assumed where the OS has no way to say. (Big-endian AArch64 runs the
 * portable kernels: the NEON ones read bytes as little-endian lanes.) */
bool kvp__cpu_has_neon(void) { return true; }
bool kvp__cpu_has_neon_dotprod(void) { return false; }
#else
bool kvp__cpu_has_neon(void) { return false; }
bool kvp__cpu_has_neon_dotprod(void) { return false; }
#endif

int32_t kvp__cpu_best_isa(void) {
    if (kvp__cpu_has_avx512_bf16()) return KVP_ISA_AVX512_BF16;
    if (kvp__cpu_has_avx512()) return KVP_ISA_AVX512;
    if (kvp__cpu_has_avx2()) return KVP_ISA_AVX2;
    if (kvp__cpu_has_neon_dotprod()) return KVP_ISA_NEON_DOTPROD;
    if (kvp__cpu_has_neon()) return KVP_ISA_NEON;
    return KVP_ISA_PORTABLE;
}
