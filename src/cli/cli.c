/* cli.c — see cli.h. */
#include "cli/cli.h"
#include "core/log.h"

#include <float.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/error.h"
#include "model/hub_cache.h"

/* true/false/yes/no/1/0 (any case) as a flag's value; -1 for other text. */
static int bool_text(const char *text) {
    static const char *const yes[] = {"true", "yes", "1"}, *const no[] = {"false", "no", "0"};
    for (int k = 0; k < 3; k++) {
        if (strcasecmp(text, yes[k]) == 0) return 1;
        if (strcasecmp(text, no[k]) == 0) return 0;
    }
    return -1;
}

static int parse_value(CliOption *o, const char *text, char *err) {
    char *end = NULL;
    errno = 0;
    switch (o->type) {
    case OPT_STRING:
        *(const char **)o->value = text;
        return COLT_OK;
    case OPT_INT: {
        long v = strtol(text, &end, 10);
        if (errno || end == text || *end || v < -2147483647L || v > 2147483647L)
            return errorf(err, "--%s: '%s' is not an integer", o->name, text);
        *(int *)o->value = (int)v;
        return COLT_OK;
    }
    case OPT_U64: {
        if (text[0] == '-') return errorf(err, "--%s: '%s' must not be negative", o->name, text);
        unsigned long long v = strtoull(text, &end, 10);
        if (errno || end == text || *end) return errorf(err, "--%s: '%s' is not a non-negative integer", o->name, text);
        *(uint64_t *)o->value = (uint64_t)v;
        return COLT_OK;
    }
    case OPT_FLOAT: {
        double v = strtod(text, &end);
        /* strtod's ERANGE is also an overflow: 1e308 fits a double, not a float;
         * say so with the value as written, not the float's inf */
        if (end != text && !*end && (errno == ERANGE || (isfinite(v) && fabs(v) > FLT_MAX)) && fabs(v) > 1)
            return errorf(err, "--%s: %s is out of range (a 32-bit float holds at most %g)", o->name, text,
                          (double)FLT_MAX);
        if (errno || end == text || *end || !isfinite(v))
            return errorf(err, "--%s: '%s' is not a number", o->name, text);
        *(float *)o->value = (float)v;
        return COLT_OK;
    }
    case OPT_FLAG:
        break;
    }
    return errorf(err, "--%s: internal option type error", o->name);
}

int cli_parse(CliOption *opts, int n_opts, int argc, char **argv, const char *usage, char *err) {
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            fputs(usage, stdout);
            fputs("options:\n", stdout);
            for (int k = 0; k < n_opts; k++) fprintf(stdout, "  --%-22s %s\n", opts[k].name, opts[k].help);
            return 1;
        }
        if (strncmp(arg, "--", 2) != 0) return errorf(err, "unexpected argument '%s' (options start with --)", arg);
        const char *name = arg + 2;
        const char *eq = strchr(name, '=');
        size_t name_len = eq ? (size_t)(eq - name) : strlen(name);
        CliOption *o = NULL;
        for (int k = 0; k < n_opts; k++)
            if (strlen(opts[k].name) == name_len && strncmp(opts[k].name, name, name_len) == 0) o = &opts[k];
        if (!o) return errorf(err, "unknown option '--%.*s' (see --help)", (int)name_len, name);
        if (o->seen) return errorf(err, "option --%s given twice", o->name);
        o->seen = true;
        if (o->type == OPT_FLAG) {
            /* alone it is true; --flag=false, or a true/false word after it, as HfArgumentParser reads them */
            const char *text = eq ? eq + 1 : i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0 ? argv[++i] : "true";
            int b = bool_text(text);
            if (b < 0) return errorf(err, "option --%s: '%s' is not true or false", o->name, text);
            *(bool *)o->value = b == 1;
            continue;
        }
        const char *text = eq ? eq + 1 : NULL;
        if (!text) {
            if (i + 1 >= argc) return errorf(err, "option --%s needs a value", o->name);
            text = argv[++i];
        }
        if (parse_value(o, text, err) != 0) return COLT_ERR;
    }
    return COLT_OK;
}

void outbuf_append(OutBuf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n + 1) cap *= 2;
        b->data = xrealloc(b->data, cap);
        b->cap = cap;
    }
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
}

void outbuf_puts(OutBuf *b, const char *s) { outbuf_append(b, s, strlen(s)); }

void outbuf_free(OutBuf *b) {
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

int stdin_read_lines(char ***lines, size_t *n_lines, char *err) {
    char **out = NULL;
    size_t n = 0, cap = 0;
    char *line = NULL;
    size_t line_cap = 0;
    ssize_t got;
    while ((got = getline(&line, &line_cap, stdin)) >= 0) {
        size_t len = (size_t)got;
        if (memchr(line, '\0', len)) {
            free(line);
            lines_free(out, n);
            return errorf(err, "stdin line %zu: contains a NUL byte", n + 1);
        }
        bool blank = true;
        for (size_t k = 0; k < len; k++)
            if (line[k] != ' ' && line[k] != '\t' && line[k] != '\n' && line[k] != '\r') blank = false;
        if (blank) continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 64;
            out = xrealloc(out, sizeof(char *) * cap);
        }
        out[n++] = xstrdup(line);
    }
    free(line);
    if (ferror(stdin)) {
        lines_free(out, n);
        return errorf(err, "cannot read stdin");
    }
    *lines = out;
    *n_lines = n;
    return COLT_OK;
}

void lines_free(char **lines, size_t n) {
    for (size_t i = 0; i < n; i++) free(lines[i]);
    free(lines);
}

int cli_fail(const char *cmd, const char *msg) {
    char own[32];
    snprintf(own, sizeof own, "rank %d: ", log_rank());
    bool says_rank = strncmp(msg, own, strlen(own)) == 0; /* messages of src/dist name their rank already */
    if (log_rank() != 0 && !says_rank) fprintf(stderr, "colt %s: rank %d: %s\n", cmd, log_rank(), msg);
    else fprintf(stderr, "colt %s: %s\n", cmd, msg);
    return 1;
}

int cli_model_folder(char *folder, size_t size, const char *cmd, const char *model, const char *revision) {
    char err[ERR_LEN], *found = NULL;
    if (hub_cache_model_folder(&found, model, revision, err) != 0) return cli_fail(cmd, err);
    int n = snprintf(folder, size, "%s", found);
    free(found);
    if (n < 0 || (size_t)n >= size) return cli_fail(cmd, "the model folder's path is too long");
    return 0;
}
