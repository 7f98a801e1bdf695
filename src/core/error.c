/* error.c — error messages, always-on asserts and aborting allocators. */
#include "core/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int errorf(char *err, const char *fmt, ...) {
    if (!err) return COLT_ERR;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, ERR_LEN, fmt, ap);
    va_end(ap);
    return COLT_ERR;
}

int error_prefix(char *err, const char *fmt, ...) {
    if (!err) return COLT_ERR;
    char old[ERR_LEN], prefix[ERR_LEN];
    snprintf(old, sizeof old, "%s", err);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    char full[2 * ERR_LEN + 2];
    snprintf(full, sizeof full, "%s: %s", prefix, old);
    memcpy(err, full, ERR_LEN - 1);  /* keep what fits */
    err[ERR_LEN - 1] = '\0';
    return COLT_ERR;
}

_Noreturn void colt_abort(const char *file, int line, const char *msg) {
    fprintf(stderr, "colt: fatal: %s:%d: %s\n", file, line, msg);
    fflush(stderr);
    abort();
}

void *colt_xmalloc(size_t n, const char *file, int line) {
    void *p = malloc(n ? n : 1);
    if (!p) colt_abort(file, line, "out of memory");
    return p;
}

void *colt_xcalloc(size_t n, size_t size, const char *file, int line) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) colt_abort(file, line, "out of memory");
    return p;
}

void *colt_xrealloc(void *p, size_t n, const char *file, int line) {
    void *q = realloc(p, n ? n : 1);
    if (!q) colt_abort(file, line, "out of memory");
    return q;
}

char *colt_xstrdup(const char *s, const char *file, int line) {
    size_t n = strlen(s) + 1;
    char *p = colt_xmalloc(n, file, line);
    memcpy(p, s, n);
    return p;
}
