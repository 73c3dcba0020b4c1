/*
 * Run a libFuzzer harness without libFuzzer, inside a cmocka test (so every
 * `make test`, with gcc and with SAN=1, exercises it): every file of its
 * committed seed corpus, then pseudo-random inputs. Include after the
 * harness (which defines LLVMFuzzerTestOneInput).
 */
#ifndef KVPAGE_FUZZ_REPLAY_H
#define KVPAGE_FUZZ_REPLAY_H

#include <dirent.h>
#include <stdio.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Feed every file of `dir` (at most 64 KiB each); returns how many. */
static int fzr_run_corpus(const char *dir) {
    DIR *d = opendir(dir);
    if (d == NULL) print_error("cannot open %s (run from the repository root)\n", dir);
    assert_non_null(d);
    int files = 0;
    struct dirent *e;
    static uint8_t buf[1 << 16];
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        char path[512];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        FILE *f = fopen(path, "rb");
        assert_non_null(f);
        size_t n = fread(buf, 1, sizeof buf, f);
        fclose(f);
        assert_int_equal(LLVMFuzzerTestOneInput(buf, n), 0);
        files++;
    }
    closedir(d);
    return files;
}

/* `count` inputs of 0..max_len pseudo-random bytes from `seed`. */
static void fzr_run_random(uint64_t seed, int count, size_t max_len) {
    uint8_t *buf = malloc(max_len + 1);
    assert_non_null(buf);
    uint64_t rng = seed;
    for (int i = 0; i < count; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        size_t n = (size_t)(rng >> 33) % (max_len + 1);
        for (size_t k = 0; k < n; k++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            buf[k] = (uint8_t)(rng >> 56);
        }
        assert_int_equal(LLVMFuzzerTestOneInput(buf, n), 0);
    }
    free(buf);
}

#endif
