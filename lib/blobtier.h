/*
 * Internal declarations of the blob tier wrapper (lib/blobtier.c), shared
 * with the tiers the library implements itself (lib/filetier.c). Not
 * installed.
 */
#ifndef KVPAGE_BLOBTIER_H
#define KVPAGE_BLOBTIER_H

#include "internal.h"
#include "kvpage_blob.h"

#ifdef __cplusplus
extern "C" {
#endif

/* kvp_blob_tier_create() with the allocator of the wrapper itself: a tier
 * made from parameters that carry allocator hooks (the file tier) keeps
 * every allocation on them. `alloc` may be NULL (libc); it is copied. */
int kvp__blob_tier_create(const kvp_blob_tier_ops_t *ops, void *self, const char *name,
                          const kvp_allocator_t *alloc, kvp_blob_tier_t **out, char *err,
                          size_t err_size);

/* The implementation's `self` of a tier whose put function is `put` (a
 * tier the library made, recognised by its function), else NULL. */
void *kvp__blob_tier_self(const kvp_blob_tier_t *tier,
                          int (*put)(void *, int32_t, const kvp_hash_t *, const void *const *,
                                     const uint64_t *));
/* Record a detail message on the tier and return `status`. */
int kvp__blob_tier_fail(kvp_blob_tier_t *tier, int status, const char *fmt, ...)
    KVP__PRINTF(3, 4);

#ifdef __cplusplus
}
#endif

#endif /* KVPAGE_BLOBTIER_H */
