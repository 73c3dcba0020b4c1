/*
 * Helpers shared by the command-line tools (kvpage-plan, kvpage-sim,
 * kvpage-bench): strict argument parsing, byte formatting, and a small JSON
 * writer. Not part of the library.
 *
 * Every numeric option of every tool goes through cli_parse_i64() or
 * cli_parse_double() (directly or through the cli_opt_* helpers): the whole
 * text must be a number, within the option's range. A bad value is a
 * message "<tool>: <option>..." that names the option and the value, and
 * the tools then exit with status 2; nothing falls back to a default.
 */
#ifndef KVPAGE_TOOLS_CLI_H
#define KVPAGE_TOOLS_CLI_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#if defined(__GNUC__) || defined(__clang__)
#define CLI_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define CLI_PRINTF(f, a)
#endif

/* The exit status of a bad command line. */
#define CLI_USAGE 2

/* Parse a whole decimal integer in [min, max]: optional '-' (only where min
 * is negative), digits, and, when allow_k is true, a k suffix (x1024: "32k"
 * tokens). No sign '+', no spaces, no other suffix, no empty text. On
 * failure print "<tool>: <option>..." with the text to errf and return
 * false; *out is then untouched. */
bool cli_parse_i64(const char *tool, const char *option, const char *text,
                   int64_t min, int64_t max, bool allow_k, int64_t *out, FILE *errf);
/* The same for an int (min and max within int's range). */
bool cli_parse_int(const char *tool, const char *option, const char *text, int min, int max,
                   int *out, FILE *errf);
/* Parse a finite real number in [min, max] (decimal, optional exponent; no
 * "inf", "nan", hex or spaces). */
bool cli_parse_double(const char *tool, const char *option, const char *text,
                      double min, double max, double *out, FILE *errf);

/* ---- options in argv ------------------------------------------------------
 * For loops of the form `for (i = first; i < argc; i++)`, with argv[*i] an
 * option that takes a value: the value is argv[*i + 1], and *i moves past
 * it. Each returns false after printing a message (a missing value: "<tool>:
 * <option> needs a value"). */

/* The value itself (any text, "" included). */
const char *cli_opt_value(const char *tool, int argc, char **argv, int *i, FILE *errf);
/* The value as an int in [min, max]. */
bool cli_opt_int(const char *tool, int argc, char **argv, int *i, int min, int max, int *out,
                 FILE *errf);
/* The value as an int64 in [min, max] (allow_k: a k suffix, x1024). */
bool cli_opt_i64(const char *tool, int argc, char **argv, int *i, int64_t min, int64_t max,
                 bool allow_k, int64_t *out, FILE *errf);
/* The value as a real number in [min, max]. */
bool cli_opt_double(const char *tool, int argc, char **argv, int *i, double min, double max,
                    double *out, FILE *errf);
/* The value as one of n names (exact match): *out = its index. The
 * message of a bad one lists the names. */
bool cli_opt_choice(const char *tool, int argc, char **argv, int *i, const char *const *names,
                    int n, int *out, FILE *errf);

/* "<tool>: unknown option '<arg>' (see --help)" (or "unexpected argument"
 * for one that is not an option); returns CLI_USAGE. */
int cli_unknown_option(const char *tool, const char *arg, FILE *errf);
/* The same on stderr, followed by the command's usage; returns CLI_USAGE. */
int cli_reject_option(const char *tool, const char *arg, void (*usage)(FILE *));
/* "<tool>: " then the message and a newline; returns CLI_USAGE. */
int cli_error(FILE *errf, const char *tool, const char *fmt, ...) CLI_PRINTF(3, 4);

/* ---- formatting ------------------------------------------------------------ */

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
