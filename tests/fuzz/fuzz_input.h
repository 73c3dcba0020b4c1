/*
 * What every libFuzzer harness in tests/fuzz shares: a cursor over the
 * input bytes (reads past the end give 0, so every input is a valid
 * program), a trap for wrong results, and an allocator that fails on
 * demand.
 */
#ifndef KVPAGE_FUZZ_INPUT_H
#define KVPAGE_FUZZ_INPUT_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* A wrong result: abort the run so libFuzzer (or the replay test) reports it. */
#define FZI_ASSERT(c)                 \
    do {                              \
        if (!(c)) __builtin_trap();   \
    } while (0)

typedef struct {
    const uint8_t *p;
    size_t n;
} fzi_cursor;

static inline fzi_cursor fzi_make(const uint8_t *data, size_t size) {
    fzi_cursor c = {data, size};
    return c;
}
static inline uint8_t fzi_u8(fzi_cursor *c) {
    if (c->n == 0) return 0;
    c->n--;
    return *c->p++;
}
static inline uint16_t fzi_u16(fzi_cursor *c) {
    uint16_t v = fzi_u8(c);
    return (uint16_t)(v | (uint16_t)fzi_u8(c) << 8);
}
static inline uint32_t fzi_u32(fzi_cursor *c) {
    uint32_t v = fzi_u16(c);
    return v | (uint32_t)fzi_u16(c) << 16;
}
static inline uint64_t fzi_u64(fzi_cursor *c) {
    uint64_t v = fzi_u32(c);
    return v | (uint64_t)fzi_u32(c) << 32;
}
/* A value in [0, n) (n > 0). */
static inline uint32_t fzi_below(fzi_cursor *c, uint32_t n) { return fzi_u8(c) % n; }
/* Copy up to n bytes into dst; the rest of dst (input exhausted) is zeroed. */
static inline void fzi_bytes(fzi_cursor *c, void *dst, size_t n) {
    size_t k = n < c->n ? n : c->n;
    memcpy(dst, c->p, k);
    memset((uint8_t *)dst + k, 0, n - k);
    c->p += k;
    c->n -= k;
}
/* An "interesting" 64-bit integer: small values, limits and their
 * neighbours, or raw bytes; what input validation must survive. */
static inline int64_t fzi_edgy_i64(fzi_cursor *c) {
    static const int64_t edges[] = {0, 1, -1, 2, 3, 7, 8, 15, 16, 17, 31, 32, 255, 256, 65535,
                                    65536, INT32_MAX, INT32_MIN, (int64_t)INT32_MAX + 1,
                                    (int64_t)INT32_MIN - 1, (int64_t)UINT32_MAX, INT64_MAX,
                                    INT64_MIN, INT64_MAX / 2, INT64_MAX / 2 + 1, -INT64_MAX / 2};
    uint8_t k = fzi_u8(c);
    if (k < 128) return (int64_t)(k % 16) - 2;
    if (k < 224) return edges[k % (sizeof edges / sizeof edges[0])];
    return (int64_t)fzi_u64(c);
}
static inline int32_t fzi_edgy_i32(fzi_cursor *c) {
    int64_t v = fzi_edgy_i64(c);
    return (int32_t)(uint32_t)(uint64_t)v;
}

/* An allocator (the library's kvp_allocator_t callbacks) that fails the
 * countdown-th allocation from now; -1 = never. */
typedef struct {
    long countdown;
    long live; /* allocations not yet freed */
} fzi_alloc;

static inline void *fzi_malloc(void *opaque, size_t size, size_t alignment) {
    fzi_alloc *a = (fzi_alloc *)opaque;
    if (a->countdown == 0) {
        a->countdown = -1;
        return NULL;
    }
    if (a->countdown > 0) a->countdown--;
    void *p = NULL;
    if (alignment < sizeof(void *)) alignment = sizeof(void *);
    if (posix_memalign(&p, alignment, size ? size : 1) != 0) return NULL;
    a->live++;
    return p;
}
static inline void fzi_free(void *opaque, void *p) {
    fzi_alloc *a = (fzi_alloc *)opaque;
    if (p != NULL) a->live--;
    free(p);
}

#endif
