#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* ---- numbers ------------------------------------------------------------- */

bool cli_parse_i64(const char *tool, const char *option, const char *text,
                   int64_t min, int64_t max, bool allow_k, int64_t *out, FILE *errf) {
    if (text == NULL) {
        fprintf(errf, "%s: %s needs a value\n", tool, option);
        return false;
    }
    /* By hand rather than strtoll, which skips leading spaces and takes '+'. */
    const char *p = text;
    bool neg = *p == '-';
    if (neg) p++;
    if (*p < '0' || *p > '9') {
        fprintf(errf, "%s: %s: '%s' is not a whole number\n", tool, option, text);
        return false;
    }
    uint64_t mag = 0;
    bool overflow = false;
    for (; *p >= '0' && *p <= '9'; p++) {
        unsigned d = (unsigned)(*p - '0');
        if (mag > (UINT64_MAX - d) / 10) overflow = true;
        else mag = mag * 10 + d;
    }
    if (allow_k && (*p == 'k' || *p == 'K')) {
        if (mag > UINT64_MAX / 1024) overflow = true;
        else mag *= 1024;
        p++;
    }
    if (*p != '\0') {
        fprintf(errf, "%s: %s: '%s' is not a whole number\n", tool, option, text);
        return false;
    }
    /* |INT64_MIN| = INT64_MAX + 1 */
    if (overflow || mag > (uint64_t)INT64_MAX + (neg ? 1u : 0u)) {
        fprintf(errf, "%s: %s must be in %lld..%lld, got %s (out of range)\n", tool, option,
                (long long)min, (long long)max, text);
        return false;
    }
    int64_t v = neg ? (mag == (uint64_t)INT64_MAX + 1u ? INT64_MIN : -(int64_t)mag) : (int64_t)mag;
    if (v < min && v < 0 && min >= 0) {
        fprintf(errf, "%s: %s must be at least %lld, got %s\n", tool, option, (long long)min,
                text);
        return false;
    }
    if (v < min || v > max) {
        fprintf(errf, "%s: %s must be in %lld..%lld, got %s\n", tool, option, (long long)min,
                (long long)max, text);
        return false;
    }
    *out = v;
    return true;
}

bool cli_parse_int(const char *tool, const char *option, const char *text, int min, int max,
                   int *out, FILE *errf) {
    int64_t v;
    if (!cli_parse_i64(tool, option, text, min, max, false, &v, errf)) return false;
    *out = (int)v;
    return true;
}

bool cli_parse_double(const char *tool, const char *option, const char *text,
                      double min, double max, double *out, FILE *errf) {
    if (text == NULL) {
        fprintf(errf, "%s: %s needs a value\n", tool, option);
        return false;
    }
    /* strtod also reads leading spaces, "inf", "nan" and hex: not numbers here */
    bool starts = (*text >= '0' && *text <= '9') || *text == '-' || *text == '+' || *text == '.';
    errno = 0;
    char *end = NULL;
    double v = starts ? strtod(text, &end) : 0.0;
    if (!starts || end == text || *end != '\0' || strpbrk(text, "xXnNiI") != NULL) {
        fprintf(errf, "%s: %s: '%s' is not a number\n", tool, option, text);
        return false;
    }
    if (errno == ERANGE || !isfinite(v)) {
        fprintf(errf, "%s: %s must be in [%g, %g], got %s (out of range)\n", tool, option, min,
                max, text);
        return false;
    }
    if (v < min || v > max) {
        fprintf(errf, "%s: %s must be in [%g, %g], got %s\n", tool, option, min, max, text);
        return false;
    }
    *out = v;
    return true;
}

/* ---- options in argv ----------------------------------------------------- */

const char *cli_opt_value(const char *tool, int argc, char **argv, int *i, FILE *errf) {
    if (*i + 1 >= argc) {
        fprintf(errf, "%s: %s needs a value\n", tool, argv[*i]);
        return NULL;
    }
    (*i)++;
    return argv[*i];
}

bool cli_opt_int(const char *tool, int argc, char **argv, int *i, int min, int max, int *out,
                 FILE *errf) {
    const char *option = argv[*i], *v = cli_opt_value(tool, argc, argv, i, errf);
    return v != NULL && cli_parse_int(tool, option, v, min, max, out, errf);
}

bool cli_opt_i64(const char *tool, int argc, char **argv, int *i, int64_t min, int64_t max,
                 bool allow_k, int64_t *out, FILE *errf) {
    const char *option = argv[*i], *v = cli_opt_value(tool, argc, argv, i, errf);
    return v != NULL && cli_parse_i64(tool, option, v, min, max, allow_k, out, errf);
}

bool cli_opt_double(const char *tool, int argc, char **argv, int *i, double min, double max,
                    double *out, FILE *errf) {
    const char *option = argv[*i], *v = cli_opt_value(tool, argc, argv, i, errf);
    return v != NULL && cli_parse_double(tool, option, v, min, max, out, errf);
}

bool cli_opt_choice(const char *tool, int argc, char **argv, int *i, const char *const *names,
                    int n, int *out, FILE *errf) {
    const char *option = argv[*i], *v = cli_opt_value(tool, argc, argv, i, errf);
    if (v == NULL) return false;
    for (int k = 0; k < n; k++)
        if (names[k] != NULL && !strcmp(v, names[k])) {
            *out = k;
            return true;
        }
    fprintf(errf, "%s: %s: '%s' is not one of", tool, option, v);
    for (int k = 0; k < n; k++)
        if (names[k] != NULL) fprintf(errf, " %s", names[k]);
    fputc('\n', errf);
    return false;
}

int cli_unknown_option(const char *tool, const char *arg, FILE *errf) {
    if (arg[0] == '-')
        fprintf(errf, "%s: unknown option '%s' (see --help)\n", tool, arg);
    else
        fprintf(errf, "%s: unexpected argument '%s' (see --help)\n", tool, arg);
    return CLI_USAGE;
}

int cli_reject_option(const char *tool, const char *arg, void (*usage)(FILE *)) {
    cli_unknown_option(tool, arg, stderr);
    usage(stderr);
    return CLI_USAGE;
}

int cli_error(FILE *errf, const char *tool, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(errf, "%s: ", tool);
    vfprintf(errf, fmt, ap);
    fputc('\n', errf);
    va_end(ap);
    return CLI_USAGE;
}

/* ---- formatting ----------------------------------------------------------- */

const char *cli_bytes(char *buf, size_t size, uint64_t bytes) {
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024.0 && u < 6) {
        v /= 1024.0;
        u++;
    }
    if (u == 0)
        snprintf(buf, size, "%llu B", (unsigned long long)bytes);
    else
        snprintf(buf, size, "%.*f %s", v < 10 ? 2 : 1, v, units[u]);
    return buf;
}

const char *cli_thousands(char *buf, size_t size, uint64_t v) {
    char digits[32];
    int n = snprintf(digits, sizeof digits, "%llu", (unsigned long long)v);
    size_t o = 0;
    for (int i = 0; i < n && o + 2 < size; i++) {
        if (i > 0 && (n - i) % 3 == 0) buf[o++] = ',';
        buf[o++] = digits[i];
    }
    buf[o < size ? o : size - 1] = '\0';
    return buf;
}

/* ---- JSON -------------------------------------------------------------- */

static void json_key(cli_json *j, const char *key) {
    if (j->need_comma[j->depth]) fputs(", ", j->f);
    j->need_comma[j->depth] = true;
    if (key != NULL) {
        fputc('"', j->f);
        for (const char *p = key; *p; p++) fputc(*p, j->f);
        fputs("\": ", j->f);
    }
}

static void json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        switch (*p) {
        case '"': fputs("\\\"", f); break;
        case '\\': fputs("\\\\", f); break;
        case '\n': fputs("\\n", f); break;
        case '\t': fputs("\\t", f); break;
        case '\r': fputs("\\r", f); break;
        default:
            if (*p < 0x20) fprintf(f, "\\u%04x", *p);
            else fputc(*p, f);
        }
    }
    fputc('"', f);
}

void cli_json_begin(cli_json *j, FILE *f) {
    memset(j, 0, sizeof *j);
    j->f = f;
    fputc('{', f);
}

void cli_json_end(cli_json *j) { fputs("}\n", j->f); }

void cli_json_object(cli_json *j, const char *key) {
    json_key(j, key);
    fputc('{', j->f);
    if (j->depth < 31) j->depth++;
    j->need_comma[j->depth] = false;
}

void cli_json_close(cli_json *j) {
    fputc('}', j->f);
    if (j->depth > 0) j->depth--;
}

void cli_json_str(cli_json *j, const char *key, const char *value) {
    json_key(j, key);
    if (value == NULL) fputs("null", j->f);
    else json_string(j->f, value);
}

void cli_json_u64(cli_json *j, const char *key, uint64_t value) {
    json_key(j, key);
    fprintf(j->f, "%llu", (unsigned long long)value);
}

void cli_json_i64(cli_json *j, const char *key, int64_t value) {
    json_key(j, key);
    fprintf(j->f, "%lld", (long long)value);
}

void cli_json_num(cli_json *j, const char *key, double value) {
    json_key(j, key);
    if (!isfinite(value)) fputs("null", j->f);
    else {
        /* shortest of %.15g / %.17g that reads back exactly */
        char buf[40];
        snprintf(buf, sizeof buf, "%.15g", value);
        if (strtod(buf, NULL) != value) snprintf(buf, sizeof buf, "%.17g", value);
        fputs(buf, j->f);
    }
}

void cli_json_bool(cli_json *j, const char *key, bool value) {
    json_key(j, key);
    fputs(value ? "true" : "false", j->f);
}

void cli_json_null(cli_json *j, const char *key) {
    json_key(j, key);
    fputs("null", j->f);
}
