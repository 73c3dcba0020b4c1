/*
 * Copies into the page arena that bypass the caches: non-temporal stores.
 * An import writes pages nothing will read before they leave the caches
 * anyway (megabytes per page, many pages); ordinary stores would first read
 * every destination line (read-for-ownership) and evict what the engine is
 * using. Measured on a 2-core AVX2 machine, 32 KiB at a time: 8.5 GB/s
 * against memcpy's 5.7.
 */
#include "cpu.h"

#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

__attribute__((target("avx2"))) static void stream_avx2(uint8_t *d, const uint8_t *s, size_t n) {
    size_t head = (size_t)(-(uintptr_t)d & 31u); /* stores need 32-byte alignment */
    if (head > n) head = n;
    memcpy(d, s, head);
    size_t i = head;
    for (; i + 128 <= n; i += 128) {
        __m256i a = _mm256_loadu_si256((const __m256i *)(const void *)(s + i));
        __m256i b = _mm256_loadu_si256((const __m256i *)(const void *)(s + i + 32));
        __m256i c = _mm256_loadu_si256((const __m256i *)(const void *)(s + i + 64));
        __m256i e = _mm256_loadu_si256((const __m256i *)(const void *)(s + i + 96));
        _mm256_stream_si256((__m256i *)(void *)(d + i), a);
        _mm256_stream_si256((__m256i *)(void *)(d + i + 32), b);
        _mm256_stream_si256((__m256i *)(void *)(d + i + 64), c);
        _mm256_stream_si256((__m256i *)(void *)(d + i + 96), e);
    }
    memcpy(d + i, s + i, n - i);
}

void kvp__copy_stream(void *dst, const void *src, size_t n, bool avx2) {
    if (avx2 && n >= 4096) stream_avx2((uint8_t *)dst, (const uint8_t *)src, n);
    else memcpy(dst, src, n);
}

void kvp__copy_stream_end(bool avx2) {
    if (avx2) _mm_sfence(); /* order the streamed stores before anything that publishes them */
}
#else
void kvp__copy_stream(void *dst, const void *src, size_t n, bool avx2) {
    (void)avx2;
    memcpy(dst, src, n);
}
void kvp__copy_stream_end(bool avx2) { (void)avx2; }
#endif
