/* error.c — error messages, always-on asserts, and allocators that end the
 * process with one line when the host is out of memory. */
#include "core/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"

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

/* bytes is a double so that a calloc product that overflows size_t is still named right */
static _Noreturn void out_of_memory(double bytes) {
    int rank = log_rank();
    if (rank != 0) fprintf(stderr, "[rank %d] ", rank);
    if (bytes > 0) fprintf(stderr, "colt: out of memory: could not allocate %.0f bytes (%.2f GB)\n", bytes, bytes / 1e9);
    else fprintf(stderr, "colt: out of memory (a library could not allocate what it needed)\n");
    exit(1);
}

_Noreturn void colt_out_of_memory(size_t bytes) { out_of_memory((double)bytes); }

void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) colt_out_of_memory(n);
    return p;
}

void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) out_of_memory((double)n * (double)size);
    return p;
}

void *xrealloc(void *p, size_t n) {
    void *q = realloc(p, n ? n : 1);
    if (!q) colt_out_of_memory(n);
    return q;
}

char *xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = xmalloc(n);
    memcpy(p, s, n);
    return p;
}
