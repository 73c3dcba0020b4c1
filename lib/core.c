/*
 * Core: version, status codes, error detail, allocation, versioned structs.
 */
#define _POSIX_C_SOURCE 200112L
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

unsigned kvp_version_number(void) { return KVP_VERSION_NUMBER; }

const char *kvp_version_string(void) { return KVP_VERSION_STRING; }

const char *kvp_strerror(int status) {
#define KVP__STATUS_MSG(name, value, msg) \
    case value: return msg;
    switch (status) { KVP_STATUS_TABLE(KVP__STATUS_MSG) default: break; }
#undef KVP__STATUS_MSG
    return "unknown status";
}

const char *kvp_status_name(int status) {
#define KVP__STATUS_NAME(name, value, msg) \
    case value: return #name;
    switch (status) { KVP_STATUS_TABLE(KVP__STATUS_NAME) default: break; }
#undef KVP__STATUS_NAME
    return "KVP_UNKNOWN";
}

int kvp__verrf(char *err, size_t err_size, int status, const char *fmt,
               va_list ap) {
    if (err != NULL && err_size > 0) {
        int n = vsnprintf(err, err_size, fmt, ap);
        if (n < 0) err[0] = '\0';
    }
    return status;
}

int kvp__errf(char *err, size_t err_size, int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    kvp__verrf(err, err_size, status, fmt, ap);
    va_end(ap);
    return status;
}

int kvp__allocator_check(const kvp_allocator_t *a, char *err, size_t err_size) {
    if (a == NULL) return KVP_OK;
    if ((a->alloc == NULL) != (a->free == NULL))
        return kvp__errf(err, err_size, KVP_EINVAL,
                         "allocator: set both alloc and free, or neither");
    return KVP_OK;
}

void *kvp__malloc(const kvp_allocator_t *a, size_t size, size_t alignment) {
    if (size == 0) return NULL;
    if (alignment < 16) alignment = 16;
    if ((alignment & (alignment - 1)) != 0) return NULL;
    if (a != NULL && a->alloc != NULL) return a->alloc(a->opaque, size, alignment);
    void *p = NULL;
    if (posix_memalign(&p, alignment, size) != 0) return NULL;
    return p;
}

void *kvp__calloc(const kvp_allocator_t *a, size_t n, size_t size,
                  size_t alignment) {
    uint64_t total;
    if (!kvp__mul_u64(n, size, &total) || total > SIZE_MAX) return NULL;
    void *p = kvp__malloc(a, (size_t)total, alignment);
    if (p != NULL) memset(p, 0, (size_t)total);
    return p;
}

void kvp__free(const kvp_allocator_t *a, void *ptr) {
    if (ptr == NULL) return;
    if (a != NULL && a->free != NULL) {
        a->free(a->opaque, ptr);
        return;
    }
    free(ptr);
}

int kvp__check_struct(const void *s, size_t min_size, const char *what,
                      char *err, size_t err_size) {
    if (s == NULL) return kvp__errf(err, err_size, KVP_EINVAL, "%s is NULL", what);
    uint32_t declared;
    memcpy(&declared, s, sizeof declared);
    if (declared < min_size)
        return kvp__errf(err, err_size, KVP_EINVAL,
                         "%s->struct_size is %u, expected at least %zu "
                         "(set it to sizeof the struct, or call its init function)",
                         what, (unsigned)declared, min_size);
    return KVP_OK;
}

int kvp__check_reserved(int32_t value, const char *what, char *err, size_t err_size) {
    if (value == 0) return KVP_OK;
    return kvp__errf(err, err_size, KVP_EINVAL, "%s->reserved_ must be 0, got %d", what,
                     (int)value);
}

void kvp__copy_out(void *dst, const void *src, size_t full_size) {
    uint32_t declared;
    memcpy(&declared, dst, sizeof declared);
    size_t n = declared < full_size ? declared : full_size;
    if (n > sizeof declared)
        memcpy((char *)dst + sizeof declared, (const char *)src + sizeof declared,
               n - sizeof declared);
}

int kvp__strcasecmp(const char *a, const char *b) {
    for (;; a++, b++) {
        int ca = (unsigned char)*a, cb = (unsigned char)*b;
        if (ca >= 'A' && ca <= 'Z') ca += 'a' - 'A';
        if (cb >= 'A' && cb <= 'Z') cb += 'a' - 'A';
        if (ca != cb || ca == 0) return ca - cb;
    }
}

int kvp_build_has(int32_t feature) {
    switch (feature) {
#ifdef KVP_HAVE_CUDA
    case KVP_FEATURE_CUDA: return 1;
#endif
#ifdef KVP_HAVE_BLOB
    case KVP_FEATURE_BLOB: return 1;
#endif
#ifdef KVP_HAVE_REDIS
    case KVP_FEATURE_REDIS: return 1;
#endif
    default: return 0;
    }
}
