/*
 * Helpers shared by the command-line tools: strict argument parsing, byte
 * formatting, and a small JSON writer. Not part of the library.
 */
#ifndef KVPAGE_TOOLS_CLI_H
#define KVPAGE_TOOLS_CLI_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/* Parse a whole decimal integer in [min, max]; on failure print
 * "<tool>: <option>: ..." to errf and return false. Accepts a k suffix
 * (x1024) when allow_k is true, e.g. "32k" tokens. */
bool cli_parse_i64(const char *tool, const char *option, const char *text,
                   int64_t min, int64_t max, bool allow_k, int64_t *out, FILE *errf);
/* Parse a real number in [min, max]. */
bool cli_parse_double(const char *tool, const char *option, const char *text,
                      double min, double max, double *out, FILE *errf);
/* Format bytes as "79.6 GiB" / "512 B". Returns buf. */
const char *cli_bytes(char *buf, size_t size, uint64_t bytes);
/* Format an integer with thousands separators: 1,234,567. Returns buf. */
const char *cli_thousands(char *buf, size_t size, uint64_t v);

/* ---- JSON writer ------------------------------------------------------- */

typedef struct {
    FILE *f;
    int depth;
    bool need_comma[32];
} cli_json;

void cli_json_begin(cli_json *j, FILE *f);   /* writes "{" */
void cli_json_end(cli_json *j);              /* writes "}\n" */
void cli_json_object(cli_json *j, const char *key); /* "key": { */
void cli_json_close(cli_json *j);            /* } */
void cli_json_str(cli_json *j, const char *key, const char *value); /* NULL -> null */
void cli_json_u64(cli_json *j, const char *key, uint64_t value);
void cli_json_i64(cli_json *j, const char *key, int64_t value);
void cli_json_num(cli_json *j, const char *key, double value); /* non-finite -> null */
void cli_json_bool(cli_json *j, const char *key, bool value);
void cli_json_null(cli_json *j, const char *key);

#endif
