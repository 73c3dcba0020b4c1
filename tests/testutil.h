/*
 * Helpers shared by the cmocka test programs (header-only: each test is one
 * program). Include after <cmocka.h>'s prerequisites.
 */
#ifndef KVPAGE_TESTUTIL_H
#define KVPAGE_TESTUTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvpage.h"

/* ---- an allocator that fails on demand --------------------------------- */

typedef struct {
    long calls;       /* alloc calls so far */
    long fail_at;     /* fail the call with this index (0-based); -1 = never */
    long live;        /* allocations not yet freed */
    size_t live_bytes;
} test_alloc_state;

static inline void *kvt_alloc(void *opaque, size_t size, size_t alignment) {
    test_alloc_state *s = (test_alloc_state *)opaque;
    long call = s->calls++;
    if (s->fail_at >= 0 && call == s->fail_at) return NULL;
    if (alignment < sizeof(void *)) alignment = sizeof(void *);
    /* header before the block remembers the size for the byte count */
    size_t header = alignment > 16 ? alignment : 16;
    void *raw = NULL;
    if (posix_memalign(&raw, alignment, size + header) != 0) return NULL;
    memcpy(raw, &size, sizeof size);
    s->live++;
    s->live_bytes += size;
    void *user = (char *)raw + header;
    /* remember the header size just before the user pointer */
    memcpy((char *)user - sizeof(size_t), &header, sizeof header);
    return user;
}

static inline void kvt_free(void *opaque, void *ptr) {
    test_alloc_state *s = (test_alloc_state *)opaque;
    size_t header, size;
    memcpy(&header, (char *)ptr - sizeof(size_t), sizeof header);
    void *raw = (char *)ptr - header;
    memcpy(&size, raw, sizeof size);
    s->live--;
    s->live_bytes -= size;
    free(raw);
}

static inline kvp_allocator_t test_allocator(test_alloc_state *s) {
    kvp_allocator_t a;
    a.alloc = kvt_alloc;
    a.free = kvt_free;
    a.opaque = s;
    return a;
}

/* ---- a strict JSON syntax checker (RFC 8259 grammar, no semantics) ----- */

typedef struct {
    const char *p;
    int depth;
} json_cursor;

static inline void json_ws(json_cursor *c) {
    while (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r') c->p++;
}

static bool json_value(json_cursor *c);

static inline bool json_string_(json_cursor *c) {
    if (*c->p != '"') return false;
    c->p++;
    while (*c->p != '"') {
        unsigned char ch = (unsigned char)*c->p;
        if (ch == 0 || ch < 0x20) return false;
        if (ch == '\\') {
            c->p++;
            if (strchr("\"\\/bfnrt", *c->p) != NULL && *c->p) {
                c->p++;
            } else if (*c->p == 'u') {
                for (int i = 1; i <= 4; i++)
                    if (!strchr("0123456789abcdefABCDEF", c->p[i]) || !c->p[i]) return false;
                c->p += 5;
            } else {
                return false;
            }
        } else {
            c->p++;
        }
    }
    c->p++;
    return true;
}

static inline bool json_number_(json_cursor *c) {
    const char *s = c->p;
    if (*c->p == '-') c->p++;
    if (*c->p == '0') c->p++;
    else if (*c->p >= '1' && *c->p <= '9') while (*c->p >= '0' && *c->p <= '9') c->p++;
    else return false;
    if (*c->p == '.') {
        c->p++;
        if (!(*c->p >= '0' && *c->p <= '9')) return false;
        while (*c->p >= '0' && *c->p <= '9') c->p++;
    }
    if (*c->p == 'e' || *c->p == 'E') {
        c->p++;
        if (*c->p == '+' || *c->p == '-') c->p++;
        if (!(*c->p >= '0' && *c->p <= '9')) return false;
        while (*c->p >= '0' && *c->p <= '9') c->p++;
    }
    return c->p > s;
}

static bool json_value(json_cursor *c) {
    json_ws(c);
    if (++c->depth > 64) return false;
    bool ok = false;
    if (*c->p == '{') {
        c->p++;
        json_ws(c);
        if (*c->p == '}') { c->p++; ok = true; }
        else for (;;) {
            json_ws(c);
            if (!json_string_(c)) break;
            json_ws(c);
            if (*c->p != ':') break;
            c->p++;
            if (!json_value(c)) break;
            json_ws(c);
            if (*c->p == ',') { c->p++; continue; }
            if (*c->p == '}') { c->p++; ok = true; }
            break;
        }
    } else if (*c->p == '[') {
        c->p++;
        json_ws(c);
        if (*c->p == ']') { c->p++; ok = true; }
        else for (;;) {
            if (!json_value(c)) break;
            json_ws(c);
            if (*c->p == ',') { c->p++; continue; }
            if (*c->p == ']') { c->p++; ok = true; }
            break;
        }
    } else if (*c->p == '"') {
        ok = json_string_(c);
    } else if (!strncmp(c->p, "true", 4)) { c->p += 4; ok = true; }
    else if (!strncmp(c->p, "false", 5)) { c->p += 5; ok = true; }
    else if (!strncmp(c->p, "null", 4)) { c->p += 4; ok = true; }
    else ok = json_number_(c);
    c->depth--;
    return ok;
}

/* True if `text` is exactly one JSON value (plus surrounding whitespace). */
static inline bool json_valid(const char *text) {
    json_cursor c = {text, 0};
    if (!json_value(&c)) return false;
    json_ws(&c);
    return *c.p == '\0';
}

/* ---- a minimal XML well-formedness checker ------------------------------ */
/* Elements nest and close in order, names are names, attributes are quoted
 * and unique in spirit (not checked), text and values contain no '<' and
 * only known entities; an optional XML declaration and comments. One root. */

static inline bool xml_name_(const char **p) {
    const char *s = *p;
    while ((**p >= 'a' && **p <= 'z') || (**p >= 'A' && **p <= 'Z') || (**p >= '0' && **p <= '9') ||
           **p == '-' || **p == '_' || **p == ':' || **p == '.')
        (*p)++;
    return *p > s && !(*s >= '0' && *s <= '9') && *s != '-' && *s != '.';
}

static inline bool xml_entity_(const char **p) { /* at '&' */
    static const char *const names[] = {"&amp;", "&lt;", "&gt;", "&quot;", "&apos;"};
    for (int i = 0; i < 5; i++)
        if (!strncmp(*p, names[i], strlen(names[i]))) {
            *p += strlen(names[i]);
            return true;
        }
    if ((*p)[1] != '#') return false;
    const char *q = *p + 2;
    while (*q >= '0' && *q <= '9') q++;
    if (q == *p + 2 || *q != ';') return false;
    *p = q + 1;
    return true;
}

static inline bool xml_well_formed(const char *s) {
    const char *open[256];
    size_t open_len[256];
    int depth = 0;
    bool root = false;
    const char *p = s;
    while (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r') p++;
    if (!strncmp(p, "<?xml", 5)) {
        p = strstr(p, "?>");
        if (p == NULL) return false;
        p += 2;
    }
    while (*p) {
        if (!strncmp(p, "<!--", 4)) {
            p = strstr(p + 4, "-->");
            if (p == NULL) return false;
            p += 3;
        } else if (p[0] == '<' && p[1] == '/') {
            p += 2;
            const char *n = p;
            if (!xml_name_(&p) || depth == 0) return false;
            depth--;
            if ((size_t)(p - n) != open_len[depth] || strncmp(n, open[depth], open_len[depth]))
                return false;
            while (*p == ' ') p++;
            if (*p++ != '>') return false;
        } else if (*p == '<') {
            p++;
            if (depth == 0 && root) return false; /* a second root */
            const char *n = p;
            if (!xml_name_(&p)) return false;
            size_t nlen = (size_t)(p - n);
            for (;;) {
                bool ws = false;
                while (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r') p++, ws = true;
                if (p[0] == '/' && p[1] == '>') {
                    p += 2;
                    if (depth == 0) root = true;
                    break;
                }
                if (*p == '>') {
                    p++;
                    if (depth == 256) return false;
                    open[depth] = n;
                    open_len[depth++] = nlen;
                    root = true;
                    break;
                }
                if (!ws || !xml_name_(&p) || *p++ != '=') return false;
                char q = *p++;
                if (q != '"' && q != '\'') return false;
                while (*p != q) {
                    if (*p == 0 || *p == '<') return false;
                    if (*p == '&') {
                        if (!xml_entity_(&p)) return false;
                    } else {
                        p++;
                    }
                }
                p++;
            }
        } else if (*p == '&') {
            if (depth == 0 || !xml_entity_(&p)) return false;
        } else {
            if (depth == 0 && !(*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r'))
                return false;
            p++;
        }
    }
    return root && depth == 0;
}

#ifdef cmocka_unit_test
/* Run a group's tests, or, where the environment's KVP_TEST_ONLY names
 * some of them (comma-separated), only those: for targets on which the
 * whole program takes too long (emulation), and that run a chosen few. */
static inline int kvt_run_group(const char *name, const struct CMUnitTest *tests, size_t n) {
    const char *only = getenv("KVP_TEST_ONLY");
    if (only == NULL || *only == '\0') return _cmocka_run_group_tests(name, tests, n, NULL, NULL);
    struct CMUnitTest *pick = (struct CMUnitTest *)calloc(n, sizeof *pick);
    if (pick == NULL) return 1;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        size_t len = strlen(tests[i].name);
        for (const char *p = only; *p != '\0';) {
            const char *e = strchr(p, ',');
            size_t l = e != NULL ? (size_t)(e - p) : strlen(p);
            if (l == len && strncmp(p, tests[i].name, len) == 0) {
                pick[k++] = tests[i];
                break;
            }
            p += l + (e != NULL);
        }
    }
    int rc = _cmocka_run_group_tests(name, pick, k, NULL, NULL);
    free(pick);
    return rc;
}
#endif

#endif
