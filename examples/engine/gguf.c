/*
 * GGUF reader. The file is mapped read-only; metadata and tensor infos are
 * parsed once with bounds checks on every read, so a truncated or corrupt
 * file is an error message, never a crash.
 */
#define _POSIX_C_SOURCE 200809L
#include "gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define GGUF_MAGIC 0x46554747u /* "GGUF" little-endian */
#define GGUF_DEFAULT_ALIGNMENT 32

typedef struct {
    const uint8_t *p, *end;
    char *err;
    size_t err_size;
    int failed;
} cursor;

static void fail(cursor *c, const char *fmt, ...) {
    if (c->failed) return;
    c->failed = 1;
    if (c->err && c->err_size) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->err, c->err_size, fmt, ap);
        va_end(ap);
    }
}

static const uint8_t *take(cursor *c, uint64_t n) {
    if (c->failed) return NULL;
    if ((uint64_t)(c->end - c->p) < n) {
        fail(c, "file is truncated (needs %llu more bytes at offset %ld)", (unsigned long long)n,
             (long)(c->end - c->p));
        return NULL;
    }
    const uint8_t *r = c->p;
    c->p += n;
    return r;
}

/* GGUF is little-endian; so is every machine this engine targets, but read
 * through memcpy so unaligned fields are fine. */
static uint32_t rd_u32(cursor *c) {
    uint32_t v = 0;
    const uint8_t *p = take(c, 4);
    if (p) memcpy(&v, p, 4);
    return v;
}

static uint64_t rd_u64(cursor *c) {
    uint64_t v = 0;
    const uint8_t *p = take(c, 8);
    if (p) memcpy(&v, p, 8);
    return v;
}

static gguf_str rd_str(cursor *c) {
    gguf_str s = {NULL, 0};
    s.len = rd_u64(c);
    s.ptr = (const char *)take(c, s.len);
    if (!s.ptr) s.len = 0;
    return s;
}

static const uint64_t vtype_size[GGUF_VTYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

const char *gguf_vtype_name(uint32_t t) {
    static const char *const names[GGUF_VTYPE_COUNT] = {
        "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64"};
    return t < GGUF_VTYPE_COUNT ? names[t] : "invalid";
}

const char *ggml_type_name(uint32_t t) {
    /* ggml's full numbering, so a refusal can name the type the file has. */
    static const char *const names[] = {
        "F32", "F16", "Q4_0", "Q4_1", "Q4_2(removed)", "Q4_3(removed)", "Q5_0", "Q5_1",
        "Q8_0", "Q8_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K", "IQ2_XXS", "IQ2_XS",
        "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS", "I8", "I16", "I32", "I64",
        "F64", "IQ1_M", "BF16", "Q4_0_4_4", "Q4_0_4_8", "Q4_0_8_8", "TQ1_0", "TQ2_0",
        "IQ4_NL_4_4", "IQ4_NL_4_8", "IQ4_NL_8_8", "MXFP4"};
    return t < sizeof names / sizeof names[0] ? names[t] : "unknown";
}

int ggml_type_supported(uint32_t t) {
    return t == GGML_F32 || t == GGML_F16 || t == GGML_Q4_1 || t == GGML_Q8_0;
}

uint64_t ggml_block_size(uint32_t t) {
    return (t == GGML_Q4_1 || t == GGML_Q8_0) ? 32 : 1;
}

uint64_t ggml_row_bytes(uint32_t t, uint64_t n) {
    switch (t) {
    case GGML_F32: return n * 4;
    case GGML_F16: return n * 2;
    case GGML_Q4_1: return n / 32 * 20; /* fp16 d, fp16 m, 16 bytes of nibbles */
    case GGML_Q8_0: return n / 32 * 34; /* fp16 d, 32 int8 */
    default: return 0;
    }
}

/* Skip or index one value of type t; for string arrays, remember each string. */
static void read_value(cursor *c, uint32_t t, gguf_str *str_out) {
    if (t == GGUF_STRING) {
        gguf_str s = rd_str(c);
        if (str_out) *str_out = s;
    } else if (t < GGUF_VTYPE_COUNT && vtype_size[t]) {
        take(c, vtype_size[t]);
    } else {
        fail(c, "invalid metadata value type %u", t);
    }
}

static void read_kv(cursor *c, gguf_kv *kv) {
    kv->key = rd_str(c);
    kv->type = rd_u32(c);
    if (c->failed) return;
    if (kv->type != GGUF_ARRAY) {
        kv->data = c->p;
        read_value(c, kv->type, NULL);
        return;
    }
    kv->arr_type = rd_u32(c);
    kv->arr_len = rd_u64(c);
    kv->data = c->p;
    if (c->failed) return;
    if (kv->arr_type == GGUF_ARRAY || kv->arr_type >= GGUF_VTYPE_COUNT) {
        fail(c, "metadata '%.*s': arrays of type %u are not supported", (int)kv->key.len,
             kv->key.ptr, kv->arr_type);
        return;
    }
    if (kv->arr_type != GGUF_STRING) {
        /* divide, not multiply: a corrupt length must not overflow */
        if (kv->arr_len > (uint64_t)(c->end - c->p) / vtype_size[kv->arr_type])
            fail(c, "metadata '%.*s': array of %llu elements runs past the end of the file",
                 (int)kv->key.len, kv->key.ptr, (unsigned long long)kv->arr_len);
        else
            take(c, kv->arr_len * vtype_size[kv->arr_type]);
        return;
    }
    /* each string needs at least its 8-byte length */
    if (kv->arr_len > (uint64_t)(c->end - c->p) / 8) {
        fail(c, "metadata '%.*s': string array too long for the file", (int)kv->key.len,
             kv->key.ptr);
        return;
    }
    kv->strs = calloc(kv->arr_len ? kv->arr_len : 1, sizeof *kv->strs);
    if (!kv->strs) {
        fail(c, "out of memory");
        return;
    }
    for (uint64_t i = 0; i < kv->arr_len && !c->failed; i++) read_value(c, GGUF_STRING, &kv->strs[i]);
}

static void read_tensor_info(cursor *c, gguf_tensor *t) {
    t->name = rd_str(c);
    t->n_dims = rd_u32(c);
    if (c->failed) return;
    if (t->n_dims == 0 || t->n_dims > GGUF_MAX_DIMS) {
        fail(c, "tensor '%.*s' has %u dimensions", (int)t->name.len, t->name.ptr, t->n_dims);
        return;
    }
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = d < t->n_dims ? rd_u64(c) : 1;
    t->type = rd_u32(c);
    t->offset = rd_u64(c);
}

/* Type, shape and bounds of every tensor, now that the data section is known. */
static void check_tensor(cursor *c, const gguf_file *f, gguf_tensor *t) {
    const int nl = (int)t->name.len;
    if (!ggml_type_supported(t->type)) {
        fail(c, "tensor '%.*s' has type %s (%u), which this engine does not support "
                "(supported: F32, F16, Q8_0, Q4_1)", nl, t->name.ptr, ggml_type_name(t->type), t->type);
        return;
    }
    uint64_t n = 1;
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) {
        if (t->ne[d] == 0 || n > UINT64_MAX / t->ne[d] || t->ne[d] > (1ull << 40)) {
            fail(c, "tensor '%.*s' has a bad shape", nl, t->name.ptr);
            return;
        }
        n *= t->ne[d];
    }
    if (t->ne[0] % ggml_block_size(t->type)) {
        fail(c, "tensor '%.*s': row of %llu elements is not a multiple of %s's block", nl,
             t->name.ptr, (unsigned long long)t->ne[0], ggml_type_name(t->type));
        return;
    }
    t->nbytes = ggml_row_bytes(t->type, t->ne[0]) * (n / t->ne[0]);
    uint64_t avail = f->size - f->data_offset;
    if (t->offset % f->alignment || t->offset > avail || t->nbytes > avail - t->offset) {
        fail(c, "tensor '%.*s' (offset %llu, %llu bytes) lies outside the data section", nl,
             t->name.ptr, (unsigned long long)t->offset, (unsigned long long)t->nbytes);
        return;
    }
    t->data = f->map + f->data_offset + t->offset;
}

static void read_header(cursor *c, gguf_file *f) {
    uint32_t magic = rd_u32(c);
    if (!c->failed && magic != GGUF_MAGIC) fail(c, "not a GGUF file (bad magic)");
    f->version = rd_u32(c);
    if (!c->failed && (f->version < 2 || f->version > 3))
        fail(c, "GGUF version %u is not supported (2 and 3 are)", f->version);
    f->n_tensors = rd_u64(c);
    f->n_kv = rd_u64(c);
    /* every kv needs >= 12 bytes and every tensor info >= 28: bound the counts
     * by the file size before allocating */
    if (!c->failed && (f->n_kv > f->size / 12 || f->n_tensors > f->size / 28))
        fail(c, "header counts (%llu keys, %llu tensors) are impossible for a %zu-byte file",
             (unsigned long long)f->n_kv, (unsigned long long)f->n_tensors, f->size);
}

static void read_alignment(cursor *c, gguf_file *f) {
    f->alignment = GGUF_DEFAULT_ALIGNMENT;
    const gguf_kv *kv = gguf_find(f, "general.alignment");
    if (!kv) return;
    uint32_t a = 0;
    if (kv->type == GGUF_U32) memcpy(&a, kv->data, 4);
    if (a == 0 || (a & (a - 1))) fail(c, "general.alignment must be a power of two (u32)");
    else f->alignment = a;
}

gguf_file *gguf_parse(const void *buf, size_t size, char *err, size_t err_size) {
    if (err && err_size) err[0] = 0;
    gguf_file *f = calloc(1, sizeof *f);
    if (!f) return NULL;
    f->map = buf;
    f->size = size;
    cursor c = {buf, (const uint8_t *)buf + size, err, err_size, 0};
    read_header(&c, f);
    if (!c.failed) {
        f->kv = calloc(f->n_kv ? f->n_kv : 1, sizeof *f->kv);
        f->tensors = calloc(f->n_tensors ? f->n_tensors : 1, sizeof *f->tensors);
        if (!f->kv || !f->tensors) fail(&c, "out of memory");
    }
    for (uint64_t i = 0; i < f->n_kv && !c.failed; i++) read_kv(&c, &f->kv[i]);
    if (!c.failed) read_alignment(&c, f);
    for (uint64_t i = 0; i < f->n_tensors && !c.failed; i++) read_tensor_info(&c, &f->tensors[i]);
    if (!c.failed) {
        uint64_t off = (uint64_t)(c.p - f->map);
        f->data_offset = (off + f->alignment - 1) / f->alignment * f->alignment;
        if (f->data_offset > size) { /* fine without tensors: no data section at all */
            if (f->n_tensors) fail(&c, "file ends before its data section");
            else f->data_offset = size;
        }
    }
    for (uint64_t i = 0; i < f->n_tensors && !c.failed; i++) check_tensor(&c, f, &f->tensors[i]);
    if (c.failed) {
        gguf_close(f); /* owns_map is 0: the caller's buffer stays */
        return NULL;
    }
    return f;
}

gguf_file *gguf_open(const char *path, char *err, size_t err_size) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        snprintf(err, err_size, "cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size <= 0) {
        snprintf(err, err_size, "cannot read %s: %s", path, st.st_size <= 0 ? "empty file" : strerror(errno));
        close(fd);
        return NULL;
    }
    void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
        snprintf(err, err_size, "cannot map %s: %s", path, strerror(errno));
        return NULL;
    }
    char detail[512];
    gguf_file *f = gguf_parse(map, (size_t)st.st_size, detail, sizeof detail);
    if (!f) {
        snprintf(err, err_size, "%s: %s", path, detail);
        munmap(map, (size_t)st.st_size);
        return NULL;
    }
    f->owns_map = 1;
    return f;
}

void gguf_close(gguf_file *f) {
    if (!f) return;
    for (uint64_t i = 0; f->kv && i < f->n_kv; i++) free(f->kv[i].strs);
    free(f->kv);
    free(f->tensors);
    if (f->map && f->owns_map) munmap((void *)(uintptr_t)f->map, f->size);
    free(f);
}

static int str_is(gguf_str s, const char *z) {
    size_t n = strlen(z);
    return s.len == n && memcmp(s.ptr, z, n) == 0;
}

const gguf_kv *gguf_find(const gguf_file *f, const char *key) {
    for (uint64_t i = 0; i < f->n_kv; i++)
        if (str_is(f->kv[i].key, key)) return &f->kv[i];
    return NULL;
}

const gguf_tensor *gguf_tensor_find(const gguf_file *f, const char *name) {
    for (uint64_t i = 0; i < f->n_tensors; i++)
        if (str_is(f->tensors[i].name, name)) return &f->tensors[i];
    return NULL;
}

int gguf_get_i64(const gguf_file *f, const char *key, int64_t *out) {
    const gguf_kv *kv = gguf_find(f, key);
    if (!kv) return -1;
    union { uint8_t u8; int8_t i8; uint16_t u16; int16_t i16; uint32_t u32; int32_t i32;
            uint64_t u64; int64_t i64; } v;
    switch (kv->type) {
    case GGUF_U8: memcpy(&v.u8, kv->data, 1); *out = v.u8; return 0;
    case GGUF_I8: memcpy(&v.i8, kv->data, 1); *out = v.i8; return 0;
    case GGUF_U16: memcpy(&v.u16, kv->data, 2); *out = v.u16; return 0;
    case GGUF_I16: memcpy(&v.i16, kv->data, 2); *out = v.i16; return 0;
    case GGUF_U32: memcpy(&v.u32, kv->data, 4); *out = v.u32; return 0;
    case GGUF_I32: memcpy(&v.i32, kv->data, 4); *out = v.i32; return 0;
    case GGUF_I64: memcpy(&v.i64, kv->data, 8); *out = v.i64; return 0;
    case GGUF_U64:
        memcpy(&v.u64, kv->data, 8);
        if (v.u64 > INT64_MAX) return -1;
        *out = (int64_t)v.u64;
        return 0;
    default: return -1;
    }
}

int gguf_get_f64(const gguf_file *f, const char *key, double *out) {
    const gguf_kv *kv = gguf_find(f, key);
    if (!kv) return -1;
    if (kv->type == GGUF_F32) {
        float v;
        memcpy(&v, kv->data, 4);
        *out = v;
        return 0;
    }
    if (kv->type == GGUF_F64) {
        memcpy(out, kv->data, 8);
        return 0;
    }
    return -1;
}

int gguf_get_str(const gguf_file *f, const char *key, gguf_str *out) {
    const gguf_kv *kv = gguf_find(f, key);
    if (!kv || kv->type != GGUF_STRING) return -1;
    uint64_t len;
    memcpy(&len, kv->data, 8);
    out->len = len;
    out->ptr = (const char *)kv->data + 8;
    return 0;
}

/* ---- dump ------------------------------------------------------------------ */

static void dump_scalar(FILE *o, uint32_t t, const uint8_t *p) {
    union { uint8_t u8; int8_t i8; uint16_t u16; int16_t i16; uint32_t u32; int32_t i32;
            uint64_t u64; int64_t i64; float f32; double f64; } v;
    if (t < GGUF_VTYPE_COUNT && vtype_size[t]) memcpy(&v, p, vtype_size[t]);
    switch (t) {
    case GGUF_U8: fprintf(o, "%u", v.u8); break;
    case GGUF_I8: fprintf(o, "%d", v.i8); break;
    case GGUF_U16: fprintf(o, "%u", v.u16); break;
    case GGUF_I16: fprintf(o, "%d", v.i16); break;
    case GGUF_U32: fprintf(o, "%u", v.u32); break;
    case GGUF_I32: fprintf(o, "%d", v.i32); break;
    case GGUF_U64: fprintf(o, "%llu", (unsigned long long)v.u64); break;
    case GGUF_I64: fprintf(o, "%lld", (long long)v.i64); break;
    case GGUF_F32: fprintf(o, "%g", v.f32); break;
    case GGUF_F64: fprintf(o, "%g", v.f64); break;
    case GGUF_BOOL: fprintf(o, "%s", v.u8 ? "true" : "false"); break;
    default: fprintf(o, "?"); break;
    }
}

/* Strings are printed escaped and cut at 120 bytes (chat templates are long). */
static void dump_string(FILE *o, gguf_str s) {
    fputc('"', o);
    for (uint64_t i = 0; i < s.len && i < 120; i++) {
        unsigned char ch = (unsigned char)s.ptr[i];
        if (ch == '\n') fputs("\\n", o);
        else if (ch == '"' || ch == '\\') fprintf(o, "\\%c", ch);
        else if (ch < 0x20) fprintf(o, "\\x%02x", ch);
        else fputc(ch, o);
    }
    fputc('"', o);
    if (s.len > 120) fprintf(o, "... (%llu bytes)", (unsigned long long)s.len);
}

static void dump_kv(FILE *o, const gguf_kv *kv) {
    fprintf(o, "  %-42.*s ", (int)kv->key.len, kv->key.ptr);
    if (kv->type == GGUF_STRING) {
        fprintf(o, "string = ");
        gguf_str s;
        memcpy(&s.len, kv->data, 8);
        s.ptr = (const char *)kv->data + 8;
        dump_string(o, s);
    } else if (kv->type == GGUF_ARRAY) {
        fprintf(o, "%s[%llu] = [", gguf_vtype_name(kv->arr_type), (unsigned long long)kv->arr_len);
        for (uint64_t i = 0; i < kv->arr_len && i < 5; i++) {
            if (i) fputs(", ", o);
            if (kv->arr_type == GGUF_STRING) dump_string(o, kv->strs[i]);
            else dump_scalar(o, kv->arr_type, kv->data + i * vtype_size[kv->arr_type]);
        }
        fputs(kv->arr_len > 5 ? ", ...]" : "]", o);
    } else {
        fprintf(o, "%s = ", gguf_vtype_name(kv->type));
        dump_scalar(o, kv->type, kv->data);
    }
    fputc('\n', o);
}

void gguf_dump(const gguf_file *f, void *stream) {
    FILE *o = stream;
    fprintf(o, "GGUF version %u, %llu metadata keys, %llu tensors, alignment %llu, data at %llu\n",
            f->version, (unsigned long long)f->n_kv, (unsigned long long)f->n_tensors,
            (unsigned long long)f->alignment, (unsigned long long)f->data_offset);
    fprintf(o, "metadata:\n");
    for (uint64_t i = 0; i < f->n_kv; i++) dump_kv(o, &f->kv[i]);
    fprintf(o, "tensors:\n");
    uint64_t count[64] = {0}, bytes[64] = {0};
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        fprintf(o, "  %-28.*s %-5s [", (int)t->name.len, t->name.ptr, ggml_type_name(t->type));
        for (uint32_t d = 0; d < t->n_dims; d++)
            fprintf(o, "%s%llu", d ? ", " : "", (unsigned long long)t->ne[d]);
        fprintf(o, "] %llu bytes\n", (unsigned long long)t->nbytes);
        count[t->type & 63]++;
        bytes[t->type & 63] += t->nbytes;
    }
    fprintf(o, "types:");
    for (uint32_t ty = 0; ty < 64; ty++)
        if (count[ty])
            fprintf(o, " %s x%llu (%.1f MiB)", ggml_type_name(ty), (unsigned long long)count[ty],
                    bytes[ty] / 1048576.0);
    fputc('\n', o);
}
