/*
 * Internal declarations shared by lib/ and cuda/. Not installed.
 */
#ifndef KVPAGE_INTERNAL_H
#define KVPAGE_INTERNAL_H

#include "kvpage.h"
#include "kvpage_ext.h"
#include "kvpage_plan.h"
#include "kvpage_sched.h"
#include "kvpage_tier.h"
#include "kvpage_cuda.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__) || defined(__clang__)
#define KVP__PRINTF(fmt, args) __attribute__((format(printf, fmt, args)))
#define KVP__LIKELY(x) __builtin_expect(!!(x), 1)
#define KVP__UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#define KVP__PRINTF(fmt, args)
#define KVP__LIKELY(x) (x)
#define KVP__UNLIKELY(x) (x)
#endif

/* ---- error detail ------------------------------------------------------ */

/* What every *_last_error() returns for a NULL handle. */
#define KVP__NULL_HANDLE "NULL handle"
/* Most query heads kvp_attention() takes (the layout's kv_heads limit). */
#define KVP__MAX_Q_HEADS 65536

/* Write a formatted detail message into `err` (if non-NULL and err_size > 0)
 * and return `status`. Never prints; truncates silently. */
int kvp__errf(char *err, size_t err_size, int status, const char *fmt, ...)
    KVP__PRINTF(4, 5);
int kvp__verrf(char *err, size_t err_size, int status, const char *fmt,
               va_list ap) KVP__PRINTF(4, 0);

/* ---- allocation -------------------------------------------------------- */

/* Validate allocator hooks: both NULL or both set. */
int kvp__allocator_check(const kvp_allocator_t *a, char *err, size_t err_size);

/* The one internal allocation path. `a` may be NULL (libc). `alignment` is a
 * power of two (0 means the default, 16). Returns NULL on failure or for
 * size 0. */
void *kvp__malloc(const kvp_allocator_t *a, size_t size, size_t alignment);
/* Zero-filled variant; checks n*size for overflow. */
void *kvp__calloc(const kvp_allocator_t *a, size_t n, size_t size,
                  size_t alignment);
void kvp__free(const kvp_allocator_t *a, void *ptr);

/* ---- checked arithmetic ------------------------------------------------ */

static inline bool kvp__mul_u64(uint64_t a, uint64_t b, uint64_t *r) {
#if defined(__GNUC__) || defined(__clang__)
    return !__builtin_mul_overflow(a, b, r);
#else
    if (a != 0 && b > UINT64_MAX / a) return false;
    *r = a * b;
    return true;
#endif
}

static inline bool kvp__add_u64(uint64_t a, uint64_t b, uint64_t *r) {
    if (b > UINT64_MAX - a) return false;
    *r = a + b;
    return true;
}

static inline uint64_t kvp__round_up_u64(uint64_t x, uint64_t align) {
    return (x + align - 1) / align * align;
}

/* ---- versioned structs ------------------------------------------------- */

/* Check the struct_size of a caller's struct: at least the size of the first
 * public version of that struct (`min_size`). */
int kvp__check_struct(const void *s, size_t min_size, const char *what,
                      char *err, size_t err_size);
/* A caller's struct's `reserved_` field must be 0 (so a later version can
 * give it a meaning without old callers' garbage taking it). */
int kvp__check_reserved(int32_t value, const char *what, char *err, size_t err_size);

/* Copy a full result `src` (of our `full_size`) to the caller's `dst`,
 * writing only the bytes the caller declared in dst->struct_size and keeping
 * that field. Both structs start with uint32_t struct_size. */
void kvp__copy_out(void *dst, const void *src, size_t full_size);

/* ---- formats ----------------------------------------------------------- */

static inline bool kvp__format_valid(int32_t f) {
    return f >= 0 && f < KVP_FORMAT_COUNT;
}
/* Element bits of a format (32, 16, 8 or 4); 0 for an unknown format. */
int kvp__format_bits(int32_t f);
/* The two int4 formats (one layout; they differ in the number of int8 key
 * channels and in the values' rotation). */
#define KVP__IS_INT4(f) ((f) == KVP_FORMAT_INT4 || (f) == KVP_FORMAT_INT4_V1)
static inline bool kvp__format_is_int4(int32_t f) { return KVP__IS_INT4(f); }
/* int4 keys keep the channels with the widest range in each page as int8
 * (docs/formats.md, "int4 keys"): int4 4 per 32 channels or part of 32
 * (head_dim/8 rounded up to a multiple of 4, so the codes fill channel
 * quads), int4_v1 head_dim/32. */
#define KVP__K4_OUTLIERS(format, head_dim)                                                         \
    ((format) == KVP_FORMAT_INT4 ? ((head_dim) + 31) / 32 * 4                                      \
     : (format) == KVP_FORMAT_INT4_V1 ? (head_dim) / 32                                             \
                                      : 0)
/* The most outlier channels of any int4 key block. */
#define KVP__K4_MAX_OUTLIERS (KVP_MAX_HEAD_DIM / 8)
static inline int kvp__k4_outliers(int32_t format, int32_t head_dim) {
    return KVP__K4_OUTLIERS(format, head_dim);
}
/* int4 values are stored in a rotated basis (docs/formats.md, "int4 values"). */
static inline bool kvp__format_v_rotated(int32_t f) { return f == KVP_FORMAT_INT4; }

/* Bytes of one (page, layer, kv head) block before padding: elements plus
 * scale data. The one formula kvp_layout_compute() and the codec share. */
uint64_t kvp__block_bytes(int32_t format, bool is_key, uint64_t page_size, uint64_t head_dim);

/* Keys quantized per channel over a page need an fp16 staging page. */
static inline bool kvp__format_k_needs_staging(int32_t f) {
    return f == KVP_FORMAT_INT8 || KVP__IS_INT4(f);
}

/* Case-insensitive ASCII string compare (no locale). */
int kvp__strcasecmp(const char *a, const char *b);

#ifdef __cplusplus
}
#endif

#endif /* KVPAGE_INTERNAL_H */
