/*
 * AVX2 + FMA + F16C kernel stages. Compiled with target attributes (never
 * global -march flags) and used only when the CPU has them.
 */
#include "cpu.h"

const kvp__kernels kvp__kernels_avx2 = {"avx2", {0}, {{0}}, NULL, {0}};
