/*
 * The store harness (fuzz_store.c) on the CUDA backend, as a function of
 * its own (fz_cuda_store_one) for tests/test_fuzz_cuda.c, which replays it
 * in the kernel simulator. A translation unit of its own: the harnesses'
 * static helpers stay apart.
 */
#define _POSIX_C_SOURCE 200809L
#define FZ_CUDA 1
#define LLVMFuzzerTestOneInput fz_cuda_store_one

#include <stddef.h>
#include <stdint.h>

int fz_cuda_store_one(const uint8_t *data, size_t size);

#include "fuzz_store.c"
