/*
 * The libFuzzer harness tests/fuzz/fuzz_blob.c run without libFuzzer, so every
 * `make test` (gcc, and SAN=1) exercises it: the committed seed corpus, then
 * pseudo-random inputs. The harness traps on any wrong result, failing this
 * program.
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "fuzz/fuzz_blob.c"
#include "fuzz/replay.h"

static void test_seed_corpus(void **state) {
    (void)state;
    assert_true(fzr_run_corpus("tests/fuzz/corpus/blob") >= 6);
}

static void test_random_inputs(void **state) {
    (void)state;
    fzr_run_random(0xb10bb10bull, 3000, 96);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_seed_corpus),
        cmocka_unit_test(test_random_inputs),
    };
    return cmocka_run_group_tests_name("fuzz_blob", tests, NULL, NULL);
}
