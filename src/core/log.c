/* log.c — see log.h. */
#define _POSIX_C_SOURCE 200809L
#include "core/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <time.h>

static int g_rank = 0;

void log_set_rank(int rank) { g_rank = rank; }
int log_rank(void) { return g_rank; }

void log_info0(const char *fmt, ...) {
    if (g_rank != 0) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

void log_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (g_rank != 0) fprintf(stderr, "[rank %d] ", g_rank);
    fputs("colt: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

double time_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
