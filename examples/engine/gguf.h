/*
 * A GGUF reader: header, typed metadata (arrays included), tensor infos and
 * the aligned data section, with the file mapped read-only.
 *
 * Only what a llama-family engine needs. Tensor types this engine cannot
 * compute with are refused at open, with the type's name, so a model never
 * half-loads.
 */
#ifndef ENGINE_GGUF_H
#define ENGINE_GGUF_H

#include <stddef.h>
#include <stdint.h>

/* Metadata value types, as numbered in the GGUF specification. */
enum gguf_vtype {
    GGUF_U8 = 0, GGUF_I8 = 1, GGUF_U16 = 2, GGUF_I16 = 3, GGUF_U32 = 4, GGUF_I32 = 5,
    GGUF_F32 = 6, GGUF_BOOL = 7, GGUF_STRING = 8, GGUF_ARRAY = 9, GGUF_U64 = 10,
    GGUF_I64 = 11, GGUF_F64 = 12, GGUF_VTYPE_COUNT = 13
};

/* Tensor element types (ggml's numbering). The engine computes with the four
 * marked *; every other value is refused with its name. */
enum ggml_type {
    GGML_F32 = 0,  /* * */
    GGML_F16 = 1,  /* * */
    GGML_Q4_0 = 2,
    GGML_Q4_1 = 3, /* * */
    GGML_Q8_0 = 8, /* * */
    GGML_BF16 = 30
};

/* A string inside the mapped file (not NUL-terminated). */
typedef struct {
    const char *ptr;
    uint64_t len;
} gguf_str;

typedef struct {
    gguf_str key;
    uint32_t type;       /* enum gguf_vtype */
    uint32_t arr_type;   /* element type when type == GGUF_ARRAY */
    uint64_t arr_len;    /* element count when type == GGUF_ARRAY */
    const uint8_t *data; /* the value (or the first array element) in the map */
    /* For arrays of strings: each element's string, filled at open. */
    gguf_str *strs;
} gguf_kv;

#define GGUF_MAX_DIMS 4

typedef struct {
    gguf_str name;
    uint32_t n_dims;
    uint64_t ne[GGUF_MAX_DIMS]; /* ne[0] is the contiguous (row) dimension */
    uint32_t type;              /* enum ggml_type */
    uint64_t offset;            /* from the start of the data section */
    uint64_t nbytes;
    const void *data;           /* into the map */
} gguf_tensor;

typedef struct {
    const uint8_t *map;
    size_t size;
    int owns_map;          /* 1 when gguf_open mapped it (unmapped at close) */
    uint32_t version;
    uint64_t alignment;
    uint64_t data_offset;
    uint64_t n_kv, n_tensors;
    gguf_kv *kv;
    gguf_tensor *tensors;
} gguf_file;

/* Open and validate `path`. On failure returns NULL and writes a sentence
 * to err (e.g. "tensor 'blk.0.attn_q.weight' has type Q5_K (13), which this
 * engine does not support (F32, F16, Q8_0, Q4_1)"). */
gguf_file *gguf_open(const char *path, char *err, size_t err_size);
void gguf_close(gguf_file *f);

/* Parse an in-memory image (tests use this with hand-made files); the buffer
 * must outlive the result and is not freed by gguf_close. */
gguf_file *gguf_parse(const void *buf, size_t size, char *err, size_t err_size);

const gguf_kv *gguf_find(const gguf_file *f, const char *key);
const gguf_tensor *gguf_tensor_find(const gguf_file *f, const char *name);

/* Typed getters: 0 on success; -1 if the key is missing or its type cannot be
 * converted without loss (integers of any width convert to int64 when they
 * fit; f32/f64 convert to double). */
int gguf_get_i64(const gguf_file *f, const char *key, int64_t *out);
int gguf_get_f64(const gguf_file *f, const char *key, double *out);
int gguf_get_str(const gguf_file *f, const char *key, gguf_str *out);

const char *gguf_vtype_name(uint32_t t);
const char *ggml_type_name(uint32_t t);   /* "Q4_1", or "type 13" style for unknown */
int ggml_type_supported(uint32_t t);
/* Bytes of a row of n elements of type t (n must be a multiple of the block). */
uint64_t ggml_row_bytes(uint32_t t, uint64_t n);
uint64_t ggml_block_size(uint32_t t);

/* Print every metadata key (long arrays summarised) and every tensor's type
 * and shape, then a count per type. */
void gguf_dump(const gguf_file *f, void *stream);

#endif
