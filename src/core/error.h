/* error.h — how colt reports errors.
 *
 * Library code returns int (0 = ok, negative = error) and fills a caller's
 * char err[ERR_LEN] with one sentence a user can act on. Broken invariants and
 * out-of-memory are not errors a caller can handle: they abort with file:line.
 * This file is not a logging system (see log.h). */
#ifndef COLT_CORE_ERROR_H
#define COLT_CORE_ERROR_H

#include <stddef.h>

#define ERR_LEN 512
#define COLT_OK 0
#define COLT_ERR (-1)

/* Formats a message into err (may be NULL) and returns COLT_ERR, so callers
 * can write `return errorf(err, "...", ...);`. */
int errorf(char *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prefixes an existing message: "prefix: old message". Returns COLT_ERR. */
int error_prefix(char *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Always-on assertion (stays in release builds). */
#define COLT_ASSERT(cond)                                                        \
    do {                                                                         \
        if (!(cond)) colt_abort(__FILE__, __LINE__, "assertion failed: " #cond); \
    } while (0)

_Noreturn void colt_abort(const char *file, int line, const char *msg);

/* Allocation that aborts on out-of-memory with file:line. */
#define xmalloc(n) colt_xmalloc((n), __FILE__, __LINE__)
#define xcalloc(n, s) colt_xcalloc((n), (s), __FILE__, __LINE__)
#define xrealloc(p, n) colt_xrealloc((p), (n), __FILE__, __LINE__)
#define xstrdup(s) colt_xstrdup((s), __FILE__, __LINE__)
void *colt_xmalloc(size_t n, const char *file, int line);
void *colt_xcalloc(size_t n, size_t size, const char *file, int line);
void *colt_xrealloc(void *p, size_t n, const char *file, int line);
char *colt_xstrdup(const char *s, const char *file, int line);

#endif
