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

#ifdef __cplusplus
}
#endif

#endif /* KVPAGE_BLOBTIER_H */
