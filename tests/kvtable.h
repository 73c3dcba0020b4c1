/*
 * A tiny page table for tests and the benchmark, standing in for the real
 * one (issue 3): it hands out page ids, computes the slot mapping and the
 * SEAL operations exactly as include/kvpage.h's "Paged-KV views" section
 * documents, and exports a sequence as CSR. Bump allocation only.
 */
#ifndef KVPAGE_KVTABLE_H
#define KVPAGE_KVTABLE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "kvpage.h"

typedef struct {
    int32_t page_size, num_pages, num_staging;
    bool staging;              /* the layout needs staging pages */
    int32_t next_pool, next_staging;
} kvt_pool;

typedef struct {
    int32_t *pages;            /* pool pages in token order */
    int32_t npages, cap;
    int32_t staging;           /* staging page id, or -1 */
    int32_t len;
} kvt_seq;

static inline void kvt_pool_init(kvt_pool *p, int32_t page_size, int32_t num_pages,
                                 int32_t num_staging, bool staging) {
    p->page_size = page_size;
    p->num_pages = num_pages;
    p->num_staging = num_staging;
    p->staging = staging;
    p->next_pool = 0;
    p->next_staging = 0;
}

static inline void kvt_seq_init(kvt_seq *s) {
    s->pages = NULL;
    s->npages = s->cap = 0;
    s->staging = -1;
    s->len = 0;
}

static inline void kvt_seq_free(kvt_seq *s) {
    free(s->pages);
    kvt_seq_init(s);
}

static inline int kvt_push_page(kvt_pool *p, kvt_seq *s) {
    if (p->next_pool >= p->num_pages) return -1;
    if (s->npages == s->cap) {
        int32_t cap = s->cap ? 2 * s->cap : 16;
        int32_t *n = (int32_t *)realloc(s->pages, (size_t)cap * sizeof *n);
        if (n == NULL) return -1;
        s->pages = n;
        s->cap = cap;
    }
    s->pages[s->npages++] = p->next_pool++;
    return 0;
}

/* Plan `n` new tokens of sequence `s`, which are rows row_base.. of the
 * step's batch: writes n slots and appends SEAL ops at ops[*nops..].
 * Returns 0, or -1 when pages run out. */
static inline int kvt_plan_append(kvt_pool *p, kvt_seq *s, int32_t n, int32_t row_base,
                                  int64_t *slots, kvp_page_op_t *ops, int32_t *nops) {
    int32_t P = p->page_size, L = s->len;
    for (int32_t i = 0; i < n; i++) {
        int32_t pos = L + i, off = pos % P, page_idx = pos / P;
        bool completes = (int64_t)page_idx * P + P <= (int64_t)L + n;
        if (!p->staging) {
            if (off == 0 && kvt_push_page(p, s) != 0) return -1;
        } else if (completes && (off == 0 || pos == L)) {
            /* this step fills the page: seal it from staging + these rows */
            if (kvt_push_page(p, s) != 0) return -1;
            kvp_page_op_t *op = &ops[(*nops)++];
            op->kind = KVP_OP_SEAL;
            op->count = off;
            op->src = off > 0 ? s->staging : -1;
            op->dst = s->pages[s->npages - 1];
            op->row = row_base + i;
        }
        if (!p->staging || completes) {
            slots[i] = (int64_t)s->pages[page_idx] * P + off;
        } else {
            if (s->staging < 0) {
                if (p->next_staging >= p->num_staging) return -1;
                s->staging = p->num_pages + p->next_staging++;
            }
            slots[i] = (int64_t)s->staging * P + off;
        }
    }
    s->len = L + n;
    return 0;
}

/* Pages a sequence exports (pool pages + its staging page when partial). */
static inline int32_t kvt_view_pages(const kvt_pool *p, const kvt_seq *s) {
    if (s->len == 0) return 0;
    return s->npages + (p->staging && s->len % p->page_size != 0 ? 1 : 0);
}

/* Export sequences as CSR. indptr [n+1], indices [sum pages], last [n]. */
static inline void kvt_export(const kvt_pool *p, const kvt_seq *seqs, int32_t n, int32_t *indptr,
                              int32_t *indices, int32_t *last, kvp_kv_view_t *view) {
    int32_t P = p->page_size, at = 0;
    indptr[0] = 0;
    for (int32_t b = 0; b < n; b++) {
        const kvt_seq *s = &seqs[b];
        for (int32_t i = 0; i < s->npages; i++) indices[at++] = s->pages[i];
        if (p->staging && s->len % P != 0) indices[at++] = s->staging;
        indptr[b + 1] = at;
        last[b] = s->len == 0 ? 0 : (s->len % P == 0 ? P : s->len % P);
    }
    view->batch = n;
    view->page_size = P;
    view->num_pages = p->num_pages;
    view->num_staging = p->staging ? p->num_staging : 0;
    view->indptr = indptr;
    view->indices = indices;
    view->last_page_len = last;
}

#endif
