/* bench_common.h — small helpers the CPU benchmarks share: the machine's CPU
 * model for the tables' header, and exiting on a failed setup step. Timing
 * uses core/log.h's time_now(). */
#ifndef COLT_BENCH_COMMON_H
#define COLT_BENCH_COMMON_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The "model name" line of /proc/cpuinfo, or "unknown CPU". */
static inline void bench_cpu_model_name(char *buf, size_t size) {
    snprintf(buf, size, "unknown CPU");
    FILE *fp = fopen("/proc/cpuinfo", "r");
    if (!fp) return;
    char line[512];
    while (fgets(line, sizeof(line), fp)) {
        if (strncmp(line, "model name", 10) == 0) {
            char *p = strchr(line, ':');
            if (p) {
                p += 2;
                p[strcspn(p, "\n")] = '\0';
                snprintf(buf, size, "%s", p);
            }
            break;
        }
    }
    fclose(fp);
}

/* Exits with "PROGRAM: err" when a setup step failed. */
static inline void bench_check(int rc, const char *program, const char *err) {
    if (rc != 0) {
        fprintf(stderr, "%s: %s\n", program, err);
        exit(1);
    }
}

#endif
