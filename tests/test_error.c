/* test_error.c — what a user sees when the host runs out of memory: each
 * allocator (xmalloc, xcalloc, xrealloc) asked for more than any machine has
 * prints exactly one line naming the size, "colt: out of memory: could not
 * allocate N bytes (M GB)", and exits with status 1 (no abort, no source file).
 * Each case runs in a child process. Also: size 0 still gives a pointer. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/error.h"
#include "harness.h"

/* Under AddressSanitizer a huge malloc would be reported as a bug instead of
 * returning NULL, which is what these cases need to reach colt's handler. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }


enum { CASE_MALLOC, CASE_CALLOC_PRODUCT, CASE_CALLOC_OVERFLOW, CASE_REALLOC };

static void run_case(int which) {
    switch (which) {
    case CASE_MALLOC: (void)xmalloc((size_t)1 << 62); break;
    case CASE_CALLOC_PRODUCT: (void)xcalloc((size_t)1 << 40, (size_t)1 << 22); break;
    case CASE_CALLOC_OVERFLOW: (void)xcalloc(SIZE_MAX / 2 + 1, 4); break; /* 2^65 bytes: past size_t */
    case CASE_REALLOC: {
        void *p = xmalloc(16);
        (void)xrealloc(p, (size_t)1 << 62);
        break;
    }
    }
}

/* Runs one case in a child; returns its exit status (-1 if it did not exit)
 * and its stderr in buf. */
static int run_child(int which, char *buf, size_t cap) {
    int fds[2];
    if (pipe(fds) != 0) return -1;
    fflush(stdout); /* exit(1) in the child flushes its copy of the buffer too */
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        dup2(fds[1], 2);
        run_case(which);
        _exit(0); /* the allocation succeeded: the caller sees status 0 */
    }
    close(fds[1]);
    size_t n = 0;
    ssize_t k;
    while (n + 1 < cap && (k = read(fds[0], buf + n, cap - 1 - n)) > 0) n += (size_t)k;
    buf[n] = '\0';
    close(fds[0]);
    /* AddressSanitizer adds its own "==PID==WARNING: ... failed to allocate" line: not colt's, left out */
    char *line = buf, *kept = buf;
    while (*line) {
        char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) + 1 : strlen(line);
        if (strncmp(line, "==", 2) != 0) memmove(kept, line, len), kept += len;
        line += len;
    }
    *kept = '\0';
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

int main(void) {
    static const struct {
        int which;
        const char *name, *want;
    } cases[] = {
        {CASE_MALLOC, "xmalloc(2^62)",
         "colt: out of memory: could not allocate 4611686018427387904 bytes (4611686018.43 GB)\n"},
        {CASE_CALLOC_PRODUCT, "xcalloc(2^40, 2^22)",
         "colt: out of memory: could not allocate 4611686018427387904 bytes (4611686018.43 GB)\n"},
        {CASE_CALLOC_OVERFLOW, "xcalloc(2^63, 4)",
         "colt: out of memory: could not allocate 36893488147419103232 bytes (36893488147.42 GB)\n"},
        {CASE_REALLOC, "xrealloc(p, 2^62)",
         "colt: out of memory: could not allocate 4611686018427387904 bytes (4611686018.43 GB)\n"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char out[4096];
        int status = run_child(cases[i].which, out, sizeof out);
        CHECK(status == 1, "%s: exit status %d, want 1", cases[i].name, status);
        CHECK(strcmp(out, cases[i].want) == 0, "%s: stderr was\n  %s want\n  %s", cases[i].name, out, cases[i].want);
        printf("%-22s -> exit %d: %s", cases[i].name, status, out);
    }

    void *a = xmalloc(0), *b = xcalloc(0, 8), *c = xrealloc(NULL, 0);
    char *d = xstrdup("colt");
    CHECK(a && b && c && d && strcmp(d, "colt") == 0, "size 0 allocations and xstrdup give usable pointers");
    free(a), free(b), free(c), free(d);

    printf("%s: %d checks, %d failed\n", g_failures ? "FAIL" : "OK", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
