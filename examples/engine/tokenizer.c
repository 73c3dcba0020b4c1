/*
 * Byte-level BPE (GPT-2 family), read from GGUF metadata.
 */
#define _POSIX_C_SOURCE 200809L
#include "tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "unicode_tables.h"

/* ---- hash maps (open addressing, power-of-two tables) ---------------------- */

typedef struct {
    uint32_t cap;   /* slots */
    int32_t *slot;  /* token id, or -1 */
} str_map;

typedef struct {
    uint32_t cap;
    uint64_t *key;  /* (left << 32 | right) + 1; 0 = empty */
    int32_t *rank, *merged;
} pair_map;

struct tokenizer {
    int32_t n_vocab;
    char **text;      /* the vocabulary's strings, as stored (GPT-2 byte alphabet) */
    char **bytes;     /* each token decoded to bytes */
    size_t *nbytes;
    int32_t *type;
    int32_t bos, eos, unk;
    int add_bos;
    int n_missing_bytes;
    char pre[32];
    int32_t byte_token[256]; /* token of each single byte */
    str_map vocab;
    pair_map merges;
    int32_t *specials;       /* control + user-defined ids, longest text first */
    int32_t n_specials;
    char *chat_template;
};

static uint64_t fnv1a(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

static uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

static uint32_t pow2_at_least(uint64_t n) {
    uint32_t c = 16;
    while (c < 2 * n) c <<= 1;
    return c;
}

static int32_t vocab_lookup(const tokenizer_t *t, const char *s, size_t n) {
    uint32_t mask = t->vocab.cap - 1;
    for (uint32_t i = (uint32_t)fnv1a(s, n) & mask;; i = (i + 1) & mask) {
        int32_t id = t->vocab.slot[i];
        if (id < 0) return -1;
        if (strlen(t->text[id]) == n && memcmp(t->text[id], s, n) == 0) return id;
    }
}

static void vocab_insert(tokenizer_t *t, int32_t id) {
    uint32_t mask = t->vocab.cap - 1;
    uint32_t i = (uint32_t)fnv1a(t->text[id], strlen(t->text[id])) & mask;
    while (t->vocab.slot[i] >= 0) {
        if (!strcmp(t->text[t->vocab.slot[i]], t->text[id])) return; /* keep the first */
        i = (i + 1) & mask;
    }
    t->vocab.slot[i] = id;
}

static int pair_find(const pair_map *m, int32_t a, int32_t b, int32_t *rank, int32_t *merged) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) + 1;
    uint32_t mask = m->cap - 1;
    for (uint32_t i = (uint32_t)mix64(key) & mask;; i = (i + 1) & mask) {
        if (m->key[i] == 0) return 0;
        if (m->key[i] == key) {
            *rank = m->rank[i];
            *merged = m->merged[i];
            return 1;
        }
    }
}

static void pair_insert(pair_map *m, int32_t a, int32_t b, int32_t rank, int32_t merged) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) + 1;
    uint32_t mask = m->cap - 1;
    uint32_t i = (uint32_t)mix64(key) & mask;
    while (m->key[i] != 0) {
        if (m->key[i] == key) return; /* first (lowest) rank wins */
        i = (i + 1) & mask;
    }
    m->key[i] = key;
    m->rank[i] = rank;
    m->merged[i] = merged;
}

/* ---- GPT-2's byte alphabet --------------------------------------------------- */

/* Printable bytes stand for themselves; the other 68 get code points 256.. in
 * byte order, so every byte has a visible, non-space character. */
static uint32_t byte_to_cp(int b) {
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) return (uint32_t)b;
    int n = 0;
    for (int i = 0; i < b; i++)
        if (!((i >= 33 && i <= 126) || (i >= 161 && i <= 172) || (i >= 174 && i <= 255))) n++;
    return 256u + (uint32_t)n;
}

static int utf8_put(uint32_t cp, char *out) {
    if (cp < 0x80) { out[0] = (char)cp; return 1; }
    if (cp < 0x800) { out[0] = (char)(0xC0 | cp >> 6); out[1] = (char)(0x80 | (cp & 63)); return 2; }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | cp >> 12); out[1] = (char)(0x80 | ((cp >> 6) & 63));
        out[2] = (char)(0x80 | (cp & 63)); return 3;
    }
    out[0] = (char)(0xF0 | cp >> 18); out[1] = (char)(0x80 | ((cp >> 12) & 63));
    out[2] = (char)(0x80 | ((cp >> 6) & 63)); out[3] = (char)(0x80 | (cp & 63)); return 4;
}

/* Decode one UTF-8 sequence at s[0..n); invalid or truncated input is one
 * byte with cp = 0xFFFD, so no byte is ever lost. */
static int utf8_get(const unsigned char *s, size_t n, uint32_t *cp) {
    unsigned char c = s[0];
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 1) { *cp = c; return 1; }
    if (len == 0 || (size_t)len > n) { *cp = 0xFFFD; return 1; }
    uint32_t v = c & (0x7F >> len);
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) { *cp = 0xFFFD; return 1; }
        v = v << 6 | (s[i] & 63);
    }
    static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (v < min_cp[len] || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) { *cp = 0xFFFD; return 1; }
    *cp = v;
    return len;
}

/* The alphabet's inverse: code point (< 512) -> byte, or -1. */
static void alphabet_inverse(int16_t inv[512]) {
    for (int i = 0; i < 512; i++) inv[i] = -1;
    for (int b = 0; b < 256; b++) inv[byte_to_cp(b)] = (int16_t)b;
}

/* Token text (byte alphabet) -> raw bytes; -1 if a character is not in the alphabet. */
static long alphabet_to_bytes(const int16_t inv[512], const char *s, char *out) {
    size_t n = strlen(s);
    long k = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        i += (size_t)utf8_get((const unsigned char *)s + i, n - i, &cp);
        if (cp >= 512 || inv[cp] < 0) return -1;
        out[k++] = (char)inv[cp];
    }
    return k;
}

/* ---- unicode classes ------------------------------------------------------------- */

static int in_ranges(const uint32_t (*r)[2], size_t n, uint32_t cp) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < r[mid][0]) hi = mid;
        else if (cp > r[mid][1]) lo = mid + 1;
        else return 1;
    }
    return 0;
}

int unicode_is_letter(uint32_t cp) {
    if (cp < 0x80) return (cp | 32) >= 'a' && (cp | 32) <= 'z';
    return in_ranges(unicode_letter_ranges, sizeof unicode_letter_ranges / sizeof unicode_letter_ranges[0], cp);
}

int unicode_is_number(uint32_t cp) {
    if (cp < 0x80) return cp >= '0' && cp <= '9';
    return in_ranges(unicode_number_ranges, sizeof unicode_number_ranges / sizeof unicode_number_ranges[0], cp);
}

/* Unicode's White_Space property (what \s matches in the reference regex engines). */
int unicode_is_space(uint32_t cp) {
    return (cp >= 9 && cp <= 13) || cp == 32 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
           cp == 0x205F || cp == 0x3000;
}

/* ---- loading ------------------------------------------------------------------------ */

static int load_vocab(tokenizer_t *t, const gguf_file *f, char *err, size_t n) {
    const gguf_kv *toks = gguf_find(f, "tokenizer.ggml.tokens");
    if (!toks || toks->type != GGUF_ARRAY || toks->arr_type != GGUF_STRING || toks->arr_len == 0 ||
        toks->arr_len > (1u << 24)) {
        snprintf(err, n, "tokenizer.ggml.tokens is missing or not a string array");
        return -1;
    }
    t->n_vocab = (int32_t)toks->arr_len;
    t->text = calloc((size_t)t->n_vocab, sizeof *t->text);
    t->bytes = calloc((size_t)t->n_vocab, sizeof *t->bytes);
    t->nbytes = calloc((size_t)t->n_vocab, sizeof *t->nbytes);
    t->type = malloc((size_t)t->n_vocab * sizeof *t->type);
    t->vocab.cap = pow2_at_least((uint64_t)t->n_vocab);
    t->vocab.slot = malloc(t->vocab.cap * sizeof *t->vocab.slot);
    if (!t->text || !t->bytes || !t->nbytes || !t->type || !t->vocab.slot) goto oom;
    memset(t->vocab.slot, 0xff, t->vocab.cap * sizeof *t->vocab.slot);
    const gguf_kv *types = gguf_find(f, "tokenizer.ggml.token_type");
    int have_types = types && types->type == GGUF_ARRAY && types->arr_type == GGUF_I32 &&
                     types->arr_len == toks->arr_len;
    int16_t inv[512];
    alphabet_inverse(inv);
    for (int32_t i = 0; i < t->n_vocab; i++) {
        gguf_str s = toks->strs[i];
        t->text[i] = malloc(s.len + 1);
        t->bytes[i] = malloc(s.len + 1);
        if (!t->text[i] || !t->bytes[i]) goto oom;
        memcpy(t->text[i], s.ptr, s.len);
        t->text[i][s.len] = 0;
        if (have_types) memcpy(&t->type[i], types->data + 4 * (size_t)i, 4);
        else t->type[i] = TOK_NORMAL;
        long k = t->type[i] == TOK_CONTROL || t->type[i] == TOK_USER_DEFINED ? -1
                                                                            : alphabet_to_bytes(inv, t->text[i], t->bytes[i]);
        if (k < 0) { /* special tokens (and any oddity) decode to their text */
            memcpy(t->bytes[i], s.ptr, s.len);
            k = (long)s.len;
        }
        t->nbytes[i] = (size_t)k;
        vocab_insert(t, i);
    }
    return 0;
oom:
    snprintf(err, n, "out of memory loading the vocabulary");
    return -1;
}

static int load_merges(tokenizer_t *t, const gguf_file *f, char *err, size_t n) {
    const gguf_kv *mk = gguf_find(f, "tokenizer.ggml.merges");
    if (!mk || mk->type != GGUF_ARRAY || mk->arr_type != GGUF_STRING) {
        snprintf(err, n, "tokenizer.ggml.merges is missing");
        return -1;
    }
    t->merges.cap = pow2_at_least(mk->arr_len);
    t->merges.key = calloc(t->merges.cap, sizeof *t->merges.key);
    t->merges.rank = malloc(t->merges.cap * sizeof *t->merges.rank);
    t->merges.merged = malloc(t->merges.cap * sizeof *t->merges.merged);
    if (!t->merges.key || !t->merges.rank || !t->merges.merged) {
        snprintf(err, n, "out of memory loading the merges");
        return -1;
    }
    char buf[512];
    for (uint64_t r = 0; r < mk->arr_len; r++) {
        gguf_str s = mk->strs[r];
        const char *sp = memchr(s.ptr, ' ', s.len);
        if (!sp || s.len >= sizeof buf) {
            snprintf(err, n, "merge %llu is malformed", (unsigned long long)r);
            return -1;
        }
        size_t la = (size_t)(sp - s.ptr), lb = s.len - la - 1;
        int32_t a = vocab_lookup(t, s.ptr, la), b = vocab_lookup(t, sp + 1, lb);
        memcpy(buf, s.ptr, la);
        memcpy(buf + la, sp + 1, lb);
        int32_t m = vocab_lookup(t, buf, la + lb);
        if (a < 0 || b < 0 || m < 0) {
            snprintf(err, n, "merge %llu (%.*s) names a token not in the vocabulary", (unsigned long long)r,
                     (int)s.len, s.ptr);
            return -1;
        }
        pair_insert(&t->merges, a, b, (int32_t)r, m);
    }
    return 0;
}

typedef struct {
    size_t len;
    int32_t id;
} special_ref;

/* Longest text first, then lower id: matching tries specials in this order. */
static int cmp_special(const void *a, const void *b) {
    const special_ref *x = a, *y = b;
    if (x->len != y->len) return x->len < y->len ? 1 : -1;
    return (x->id > y->id) - (x->id < y->id);
}

static int load_specials(tokenizer_t *t, char *err, size_t n) {
    t->specials = malloc((size_t)t->n_vocab * sizeof *t->specials);
    special_ref *refs = malloc((size_t)t->n_vocab * sizeof *refs);
    if (!t->specials || !refs) {
        free(refs);
        snprintf(err, n, "out of memory");
        return -1;
    }
    for (int32_t i = 0; i < t->n_vocab; i++)
        if ((t->type[i] == TOK_CONTROL || t->type[i] == TOK_USER_DEFINED) && t->nbytes[i] > 0)
            refs[t->n_specials++] = (special_ref){t->nbytes[i], i};
    /* longest first, so a special wins over any shorter special it starts with */
    qsort(refs, (size_t)t->n_specials, sizeof *refs, cmp_special);
    for (int32_t k = 0; k < t->n_specials; k++) t->specials[k] = refs[k].id;
    free(refs);
    return 0;
}

/* A vocabulary may lack some bytes (SmolLM2's lacks 21: six control
 * characters, 0xC0/0xC1/0xF5..0xFF that UTF-8 never uses, and the lead bytes
 * 0xF1/0xF2 of planes 4..11). Such a byte becomes the unknown token, the
 * one lossy case of the round trip; without an unknown token the file is
 * refused. */
static int load_byte_tokens(tokenizer_t *t, const gguf_file *f, char *err, size_t n) {
    int64_t unk;
    t->unk = gguf_get_i64(f, "tokenizer.ggml.unknown_token_id", &unk) == 0 && unk >= 0 && unk < t->n_vocab
                 ? (int32_t)unk
                 : -1;
    for (int b = 0; b < 256; b++) {
        char s[4];
        int len = utf8_put(byte_to_cp(b), s);
        t->byte_token[b] = vocab_lookup(t, s, (size_t)len);
        if (t->byte_token[b] >= 0) continue;
        t->n_missing_bytes++;
        t->byte_token[b] = t->unk;
        if (t->unk < 0) {
            snprintf(err, n, "the vocabulary has no token for byte 0x%02x and no unknown token", b);
            return -1;
        }
    }
    return 0;
}

int tokenizer_byte_has_token(const tokenizer_t *t, unsigned char b) {
    return t->byte_token[b] != t->unk || t->unk < 0;
}

static int load_meta(tokenizer_t *t, const gguf_file *f, char *err, size_t n) {
    gguf_str s;
    if (gguf_get_str(f, "tokenizer.ggml.model", &s) != 0 || s.len != 4 || memcmp(s.ptr, "gpt2", 4)) {
        snprintf(err, n, "tokenizer.ggml.model is not \"gpt2\" (byte-level BPE)");
        return -1;
    }
    if (gguf_get_str(f, "tokenizer.ggml.pre", &s) == 0 && s.len < sizeof t->pre) {
        memcpy(t->pre, s.ptr, s.len);
        t->pre[s.len] = 0;
    } else {
        strcpy(t->pre, "default");
    }
    /* Pre-tokenizers this code implements: GPT-2's regex, optionally after
     * splitting every digit alone (llama.cpp's "smollm", "starcoder", ...). */
    static const char *const known[] = {"default", "gpt2", "smollm", "starcoder", "refact", NULL};
    int ok = 0;
    for (int i = 0; known[i]; i++) ok |= !strcmp(t->pre, known[i]);
    if (!ok) {
        snprintf(err, n, "pre-tokenizer '%s' is not supported", t->pre);
        return -1;
    }
    int64_t v;
    t->bos = gguf_get_i64(f, "tokenizer.ggml.bos_token_id", &v) == 0 ? (int32_t)v : -1;
    t->eos = gguf_get_i64(f, "tokenizer.ggml.eos_token_id", &v) == 0 ? (int32_t)v : -1;
    const gguf_kv *kv = gguf_find(f, "tokenizer.ggml.add_bos_token");
    t->add_bos = kv && kv->type == GGUF_BOOL && kv->data[0];
    if (gguf_get_str(f, "tokenizer.chat_template", &s) == 0) {
        t->chat_template = malloc(s.len + 1);
        if (!t->chat_template) return -1;
        memcpy(t->chat_template, s.ptr, s.len);
        t->chat_template[s.len] = 0;
    }
    return 0;
}

tokenizer_t *tokenizer_load(const gguf_file *f, char *err, size_t n) {
    tokenizer_t *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    if (load_meta(t, f, err, n) || load_vocab(t, f, err, n) || load_merges(t, f, err, n) ||
        load_byte_tokens(t, f, err, n) || load_specials(t, err, n)) {
        tokenizer_free(t);
        return NULL;
    }
    return t;
}

void tokenizer_free(tokenizer_t *t) {
    if (!t) return;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        if (t->text) free(t->text[i]);
        if (t->bytes) free(t->bytes[i]);
    }
    free(t->text);
    free(t->bytes);
    free(t->nbytes);
    free(t->type);
    free(t->vocab.slot);
    free(t->merges.key);
    free(t->merges.rank);
    free(t->merges.merged);
    free(t->specials);
    free(t->chat_template);
    free(t);
}

int32_t tokenizer_vocab(const tokenizer_t *t) { return t->n_vocab; }
int32_t tokenizer_bos(const tokenizer_t *t) { return t->bos; }
int32_t tokenizer_eos(const tokenizer_t *t) { return t->eos; }
int tokenizer_add_bos(const tokenizer_t *t) { return t->add_bos; }
const char *tokenizer_pre(const tokenizer_t *t) { return t->pre; }
int32_t tokenizer_find(const tokenizer_t *t, const char *s) { return vocab_lookup(t, s, strlen(s)); }
int tokenizer_is_control(const tokenizer_t *t, int32_t id) {
    return id >= 0 && id < t->n_vocab && t->type[id] == TOK_CONTROL;
}

/* ---- encoding ------------------------------------------------------------------------ */

typedef struct {
    int32_t *ids;
    int32_t n, cap, needed;
    int oom;
} sink;

static void emit(sink *s, int32_t id) {
    if (s->n < s->cap) s->ids[s->n] = id;
    s->n++;
}

/* BPE over one piece: start from single bytes, merge the lowest-ranked
 * adjacent pair until none is in the merge table. O(len^2), pieces are short. */
static void bpe_piece(const tokenizer_t *t, const unsigned char *p, size_t len, sink *out, int32_t *sym) {
    int32_t n = (int32_t)len;
    for (int32_t i = 0; i < n; i++) sym[i] = t->byte_token[p[i]];
    for (;;) {
        int32_t best = -1, best_rank = INT32_MAX, best_id = -1;
        for (int32_t i = 0; i + 1 < n; i++) {
            int32_t rank, merged;
            if (pair_find(&t->merges, sym[i], sym[i + 1], &rank, &merged) && rank < best_rank) {
                best = i;
                best_rank = rank;
                best_id = merged;
            }
        }
        if (best < 0) break;
        sym[best] = best_id;
        memmove(sym + best + 1, sym + best + 2, (size_t)(n - best - 2) * sizeof *sym);
        n--;
    }
    for (int32_t i = 0; i < n; i++) emit(out, sym[i]);
}

typedef struct {
    const unsigned char *s;
    uint32_t *cp;   /* code point of each char */
    size_t *off;    /* byte offset of each char; off[n] = end */
    size_t n;
} chars;

static int is_lnum(uint32_t c) { return unicode_is_letter(c) || unicode_is_number(c); }

/* Length (in chars) of GPT-2's regex match at i, within a piece ending at n
 * (the regex runs on each piece the digit split left, so its look-ahead
 * stops at the piece's end):
 * 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static size_t gpt2_match(const chars *c, size_t i, size_t n) {
    const uint32_t *cp = c->cp;
    if (cp[i] == '\'' && i + 1 < n) {
        uint32_t a = cp[i + 1], b = i + 2 < n ? cp[i + 2] : 0;
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    }
    size_t j = i + (cp[i] == ' ' && i + 1 < n);
    if (j < n && !(j == i + 1 && unicode_is_space(cp[j]))) {
        size_t k = j;
        if (unicode_is_letter(cp[j])) {
            while (k < n && unicode_is_letter(cp[k])) k++;
            return k - i;
        }
        if (unicode_is_number(cp[j])) {
            while (k < n && unicode_is_number(cp[k])) k++;
            return k - i;
        }
        if (!unicode_is_space(cp[j])) {
            while (k < n && !unicode_is_space(cp[k]) && !is_lnum(cp[k])) k++;
            return k - i;
        }
    }
    /* whitespace run [i, k) */
    size_t k = i;
    while (k < n && unicode_is_space(cp[k])) k++;
    if (k == n || k - i == 1) return k - i; /* to the end; or \s+ for a lone one */
    return k - i - 1; /* \s+(?!\S): leave the last one to prefix the next word */
}

static void encode_range(const tokenizer_t *t, const chars *c, size_t a, size_t b, sink *out, int32_t *sym) {
    for (size_t i = a; i < b;) {
        size_t len = gpt2_match(c, i, b);
        bpe_piece(t, c->s + c->off[i], c->off[i + len] - c->off[i], out, sym);
        i += len;
    }
}

/* A text stretch without special tokens: digits alone (for the pre-tokenizers
 * that split them), GPT-2's regex within the stretches between them. */
static void encode_text(const tokenizer_t *t, const chars *c, size_t a, size_t b, sink *out, int32_t *sym) {
    int split_digits = strcmp(t->pre, "default") != 0 && strcmp(t->pre, "gpt2") != 0;
    if (!split_digits) {
        encode_range(t, c, a, b, out, sym);
        return;
    }
    size_t start = a;
    for (size_t i = a; i < b; i++) {
        if (!unicode_is_number(c->cp[i])) continue;
        encode_range(t, c, start, i, out, sym);
        encode_range(t, c, i, i + 1, out, sym);
        start = i + 1;
    }
    encode_range(t, c, start, b, out, sym);
}

/* The special token whose text starts at byte p, if any (longest first). */
static int32_t special_at(const tokenizer_t *t, const char *p, size_t left) {
    for (int32_t k = 0; k < t->n_specials; k++) {
        int32_t id = t->specials[k];
        if (t->nbytes[id] <= left && memcmp(p, t->bytes[id], t->nbytes[id]) == 0) return id;
    }
    return -1;
}

static int to_chars(const char *text, size_t len, chars *c) {
    c->s = (const unsigned char *)text;
    c->cp = malloc((len + 1) * sizeof *c->cp);
    c->off = malloc((len + 1) * sizeof *c->off);
    if (!c->cp || !c->off) return -1;
    c->n = 0;
    for (size_t i = 0; i < len;) {
        c->off[c->n] = i;
        i += (size_t)utf8_get(c->s + i, len - i, &c->cp[c->n]);
        c->n++;
    }
    c->off[c->n] = len;
    return 0;
}

int32_t tokenizer_encode(const tokenizer_t *t, const char *text, size_t len, int parse_special,
                         int32_t *out, int32_t cap, int32_t *needed) {
    chars c = {0};
    int32_t *sym = malloc((len + 1) * sizeof *sym);
    if (!sym || to_chars(text, len, &c)) {
        free(sym);
        free(c.cp);
        free(c.off);
        return -1;
    }
    sink s = {out, 0, cap, 0, 0};
    size_t start = 0;
    for (size_t i = 0; parse_special && i < c.n; i++) {
        int32_t id = special_at(t, text + c.off[i], len - c.off[i]);
        if (id < 0) continue;
        encode_text(t, &c, start, i, &s, sym);
        emit(&s, id);
        size_t end = c.off[i] + t->nbytes[id];
        while (i < c.n && c.off[i] < end) i++;
        start = i--;
    }
    encode_text(t, &c, start, c.n, &s, sym);
    free(sym);
    free(c.cp);
    free(c.off);
    if (needed) *needed = s.n;
    return s.n <= cap ? s.n : -1;
}

/* ---- decoding ------------------------------------------------------------------------ */

const char *tokenizer_piece(const tokenizer_t *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_vocab) {
        *len = 0;
        return "";
    }
    *len = t->nbytes[id];
    return t->bytes[id];
}

long tokenizer_decode(const tokenizer_t *t, const int32_t *ids, int32_t n, int skip_control, char *buf,
                      size_t cap) {
    size_t k = 0;
    for (int32_t i = 0; i < n; i++) {
        if (skip_control && tokenizer_is_control(t, ids[i])) continue;
        size_t len;
        const char *p = tokenizer_piece(t, ids[i], &len);
        if (k + len + 1 > cap) return -1;
        memcpy(buf + k, p, len);
        k += len;
    }
    if (k + 1 > cap) return -1;
    buf[k] = 0;
    return (long)k;
}

/* ---- chat template ------------------------------------------------------------------- */

/* The template's default system message, if it writes one literally:
 * '<|im_start|>system\n' ... '<|im_end|>' inside a string constant. */
static char *default_system(const char *tmpl) {
    const char *a = strstr(tmpl, "<|im_start|>system\\n"), *skip = "<|im_start|>system\\n";
    if (!a) {
        a = strstr(tmpl, "<|im_start|>system\n");
        skip = "<|im_start|>system\n";
    }
    if (!a) return NULL;
    a += strlen(skip);
    const char *b = strstr(a, "<|im_end|>");
    if (!b || memchr(a, '{', (size_t)(b - a))) return NULL; /* not a literal */
    char *s = malloc((size_t)(b - a) + 1);
    if (s) {
        memcpy(s, a, (size_t)(b - a));
        s[b - a] = 0;
    }
    return s;
}

char *tokenizer_chat_prompt(const tokenizer_t *t, const char *system, const char *user, char *err, size_t n) {
    if (!t->chat_template || !strstr(t->chat_template, "<|im_start|>")) {
        snprintf(err, n, "the file's chat template is %s; only ChatML (<|im_start|>) is implemented",
                 t->chat_template ? "not ChatML" : "missing");
        return NULL;
    }
    char *dflt = system ? NULL : default_system(t->chat_template);
    const char *sys = system ? system : dflt;
    size_t len = (sys ? strlen(sys) : 0) + strlen(user) + 128;
    char *out = malloc(len);
    if (out) {
        if (sys) snprintf(out, len, "<|im_start|>system\n%s<|im_end|>\n<|im_start|>user\n%s<|im_end|>\n"
                                    "<|im_start|>assistant\n", sys, user);
        else snprintf(out, len, "<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n", user);
    }
    free(dflt);
    return out;
}
