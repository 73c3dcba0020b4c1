/*
 * The byte-level BPE tokenizer stored in a GGUF file (tokenizer.ggml.model =
 * "gpt2"): vocabulary, merges, token types, special ids, the pre-tokenizer
 * named by tokenizer.ggml.pre, and the chat template.
 *
 * Text is split into pieces by the pre-tokenizer (for "smollm": every digit
 * alone, then GPT-2's regex on the rest), each piece's bytes are mapped to
 * GPT-2's printable byte alphabet and merged by rank. Decoding maps back to
 * bytes, so encode-then-decode gives the input back byte for byte for any
 * input whose bytes all have a token (tokenizer_byte_has_token): for
 * SmolLM2, every UTF-8 text without the control characters 0x04 0x06 0x13
 * 0x14 0x16 0x1D and without code points U+40000..U+BFFFF.
 */
#ifndef ENGINE_TOKENIZER_H
#define ENGINE_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "gguf.h"

typedef struct tokenizer tokenizer_t;

/* Token types (tokenizer.ggml.token_type). */
enum { TOK_NORMAL = 1, TOK_UNKNOWN = 2, TOK_CONTROL = 3, TOK_USER_DEFINED = 4, TOK_UNUSED = 5,
       TOK_BYTE = 6 };

tokenizer_t *tokenizer_load(const gguf_file *f, char *err, size_t err_size);
void tokenizer_free(tokenizer_t *t);

int32_t tokenizer_vocab(const tokenizer_t *t);
int32_t tokenizer_bos(const tokenizer_t *t); /* -1 if none */
int32_t tokenizer_eos(const tokenizer_t *t);
int tokenizer_add_bos(const tokenizer_t *t); /* tokenizer.ggml.add_bos_token */
const char *tokenizer_pre(const tokenizer_t *t);
int32_t tokenizer_find(const tokenizer_t *t, const char *token_text); /* -1 if absent */
int tokenizer_is_control(const tokenizer_t *t, int32_t id);

/* Encode len bytes of text. With parse_special, the text of control and
 * user-defined tokens (e.g. "<|im_start|>") becomes those tokens; without
 * it, such text is ordinary text. Returns the number of tokens written (at
 * most cap), or -1 if they would not fit (*needed says how many) or on no
 * memory. */
int32_t tokenizer_encode(const tokenizer_t *t, const char *text, size_t len, int parse_special,
                         int32_t *out, int32_t cap, int32_t *needed);

/* 0 for the bytes the vocabulary has no token for (they encode as the
 * unknown token, so text containing them does not round-trip). */
int tokenizer_byte_has_token(const tokenizer_t *t, unsigned char b);

/* The bytes of one token (control tokens give their text). */
const char *tokenizer_piece(const tokenizer_t *t, int32_t id, size_t *len);

/* Decode n tokens into buf (NUL-terminated); returns the byte count, or -1
 * when buf is too small. skip_control leaves control tokens out. */
long tokenizer_decode(const tokenizer_t *t, const int32_t *ids, int32_t n, int skip_control, char *buf,
                      size_t cap);

/* Chat prompt from the file's template (ChatML, "<|im_start|>role\n...<|im_end|>\n"),
 * system message first (the template's default when system is NULL), then the
 * user message, then the assistant header. Returns a malloc'ed string, or
 * NULL with err set if the template is not ChatML. */
char *tokenizer_chat_prompt(const tokenizer_t *t, const char *system, const char *user, char *err,
                            size_t err_size);

/* Unicode classes used by the pre-tokenizer (exposed for tests). */
int unicode_is_letter(uint32_t cp);
int unicode_is_number(uint32_t cp);
int unicode_is_space(uint32_t cp);

#endif
