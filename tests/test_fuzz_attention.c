/*
 * kvp_attentionize / kvp_deattentionize — the libFuzzer harness
 * (tests/fuzz/fuzz_attention.c) run without libFuzzer, so every `make test` (gcc,
 * and SAN=1) exercises it: the committed seed corpus, then pseudo-random
 * inputs. The harness traps on any wrong result, failing this program.
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "fuzz/fuzz_attention.c"
#include "fuzz/replay.h"

static void test_seed_corpus(void **state) {
    (void)state;
    assert_true(fzr_run_corpus("tests/fuzz/corpus/attention") >= 5);
}

static void test_random_inputs(void **state) {
    (void)state;
    fzr_run_random(0x082efa98ec4e6c89ull, 12000, 600);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_seed_corpus),
        cmocka_unit_test(test_random_inputs),
    };
    return cmocka_run_group_tests_name("fuzz_attention", tests, NULL, NULL);
}
