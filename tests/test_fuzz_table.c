/*
 * Layers: pool + table (+ tier) — the libFuzzer harness (tests/fuzz/fuzz_table.c)
 * run without libFuzzer, so every `make test` (gcc, and SAN=1) exercises it:
 * the committed seed corpus, then pseudo-random inputs. The harness traps on
 * any wrong result, failing this program.
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <dirent.h>
#include <stdio.h>

#include "fuzz/fuzz_table.c"

#define CORPUS "tests/fuzz/corpus/table"

static void test_seed_corpus(void **state) {
    (void)state;
    DIR *d = opendir(CORPUS);
    if (d == NULL) print_error("cannot open %s (run from the repository root)\n", CORPUS);
    assert_non_null(d);
    int files = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        char path[512];
        snprintf(path, sizeof path, "%s/%s", CORPUS, e->d_name);
        FILE *f = fopen(path, "rb");
        assert_non_null(f);
        uint8_t buf[1 << 16];
        size_t n = fread(buf, 1, sizeof buf, f);
        fclose(f);
        assert_int_equal(LLVMFuzzerTestOneInput(buf, n), 0);
        files++;
    }
    closedir(d);
    assert_true(files >= 5);
}

/* Random bytes, with the first four (the configuration) biased towards
 * small pools so memory pressure and eviction happen. */
static void test_random_inputs(void **state) {
    (void)state;
    uint64_t rng = 0x243f6a8885a308d3ull;
    uint8_t buf[700];
    for (int i = 0; i < 3000; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        size_t n = (size_t)(rng >> 33) % sizeof buf;
        for (size_t k = 0; k < n; k++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            buf[k] = (uint8_t)(rng >> 56);
        }
        if (n > 1) buf[1] %= 24;
        assert_int_equal(LLVMFuzzerTestOneInput(buf, n), 0);
    }
}

/* The same with a host tier (flag bit 2), so swaps happen on small pools. */
static void test_random_inputs_with_tier(void **state) {
    (void)state;
    uint64_t rng = 0x13198a2e03707344ull;
    uint8_t buf[700];
    for (int i = 0; i < 3000; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        size_t n = 4 + (size_t)(rng >> 33) % (sizeof buf - 4);
        for (size_t k = 0; k < n; k++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            buf[k] = (uint8_t)(rng >> 56);
        }
        buf[1] %= 24;
        buf[3] |= 4;
        assert_int_equal(LLVMFuzzerTestOneInput(buf, n), 0);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_seed_corpus),
        cmocka_unit_test(test_random_inputs),
        cmocka_unit_test(test_random_inputs_with_tier),
    };
    return cmocka_run_group_tests_name("fuzz_table", tests, NULL, NULL);
}
