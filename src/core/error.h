/* error.h — how colt reports errors.
 *
 * Library code returns int (0 = ok, negative = error) and fills a caller's
 * char err[ERR_LEN] with one sentence a user can act on. Broken invariants are
 * not errors a caller can handle: they abort with file:line. Running out of
 * host memory is not a bug in colt: it ends the process with one line naming
 * the size asked for, and exit status 1.
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

/* Host allocation that never returns NULL: when the memory is not there it
 * calls colt_out_of_memory. A size of 0 allocates 1 byte. */
void *xmalloc(size_t n);
void *xcalloc(size_t n, size_t size);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);

/* Prints "colt: out of memory: could not allocate N bytes (M GB)" on stderr
 * ("[rank r] " before it on ranks other than 0) and exits with status 1. For
 * allocators other than the ones above (aligned, mapped) that fail the same way;
 * bytes 0 when the size is not known (a library's own allocation). */
_Noreturn void colt_out_of_memory(size_t bytes);

#endif
