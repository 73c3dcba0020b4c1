/*
 * The attention and store libFuzzer harnesses on the CUDA backend, in the
 * kernel simulator (tests/cudasim): tests/fuzz/cuda_attention.c and
 * tests/fuzz/cuda_store.c build them with FZ_CUDA (CUDA stores and
 * contexts, device tensors, a CPU twin whose statuses and arena bytes the
 * CUDA store must match; see the harnesses' comments). Each replays its
 * committed seed corpus, then pseudo-random inputs: FZ_CUDA_RANDOM of them
 * per harness (default 5000, 1000 under AddressSanitizer: the simulator runs
 * every CUDA thread as a fiber, which the sanitizer slows down). A wrong
 * result traps.
 * FZ_CUDA_LAST=path writes each input to `path` before running it, so the
 * one that failed is there afterwards.
 *
 * Built by `make` as build/tests/test_fuzz_cuda_sim when the CUDA headers
 * are there (HAVE_CUDA=1); not by the generic rule for tests/test_*.c.
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>

int fz_cuda_attention_one(const uint8_t *data, size_t size);
int fz_cuda_store_one(const uint8_t *data, size_t size);

/* replay.h drives LLVMFuzzerTestOneInput: this one runs the harness of
 * the test at hand. */
static int (*fz_target)(const uint8_t *data, size_t size);
static long fz_inputs;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *last = getenv("FZ_CUDA_LAST");
    if (last != NULL && last[0] != '\0') {
        FILE *f = fopen(last, "wb");
        if (f != NULL) {
            if (size > 0) fwrite(data, 1, size, f);
            fclose(f);
        }
    }
    fz_inputs++;
    return fz_target(data, size);
}

#include "fuzz/replay.h"

#if defined(__SANITIZE_ADDRESS__)
#define FZ_RANDOM_DEFAULT 1000
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FZ_RANDOM_DEFAULT 1000
#endif
#endif
#ifndef FZ_RANDOM_DEFAULT
#define FZ_RANDOM_DEFAULT 5000
#endif

static int fz_random_count(void) {
    const char *e = getenv("FZ_CUDA_RANDOM");
    if (e == NULL || e[0] == '\0') return FZ_RANDOM_DEFAULT;
    long n = strtol(e, NULL, 10);
    return n < 0 ? 0 : n > 1000000 ? 1000000 : (int)n;
}

static void test_attention_corpus(void **state) {
    (void)state;
    fz_target = fz_cuda_attention_one;
    assert_true(fzr_run_corpus("tests/fuzz/corpus/attention") >= 5);
}

static void test_attention_random(void **state) {
    (void)state;
    fz_target = fz_cuda_attention_one;
    fzr_run_random(0x082efa98ec4e6c89ull, fz_random_count(), 600);
}

static void test_store_corpus(void **state) {
    (void)state;
    fz_target = fz_cuda_store_one;
    assert_true(fzr_run_corpus("tests/fuzz/corpus/store") >= 5);
}

static void test_store_random(void **state) {
    (void)state;
    fz_target = fz_cuda_store_one;
    fzr_run_random(0xa4093822299f31d0ull, fz_random_count(), 600);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_attention_corpus),
        cmocka_unit_test(test_attention_random),
        cmocka_unit_test(test_store_corpus),
        cmocka_unit_test(test_store_random),
    };
    int rc = cmocka_run_group_tests_name("fuzz_cuda", tests, NULL, NULL);
    printf("fuzz_cuda: %ld inputs\n", fz_inputs);
    return rc;
}
