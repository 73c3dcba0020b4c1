/*
 * AVX-512 kernel stages.
 */
#include "cpu.h"

const kvp__kernels kvp__kernels_avx512 = {"avx512", {0}, {{0}}, NULL, {0}};
