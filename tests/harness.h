/* harness.h — what the tests that run the colt binary share: check counting,
 * shell commands, reading an output folder, comparing runs. Include it once,
 * from one test file; every test file is its own program, so the counters and
 * the scratch folder are per test. Unused helpers cost nothing (static inline). */
#ifndef COLT_TESTS_HARNESS_H
#define COLT_TESTS_HARNESS_H

#include <jansson.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "core/fileio.h"

static int g_failures = 0, g_checks = 0;
static char g_tmp[256]; /* the test's scratch folder */

#define CHECK(cond, ...)                                         \
    do {                                                         \
        g_checks++;                                              \
        if (!(cond)) {                                           \
            g_failures++;                                        \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                        \
            fputc('\n', stderr);                                 \
        }                                                        \
    } while (0)

static inline double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Runs a shell command (printf-style); says so on stderr when it fails. */
static inline void sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static inline void sh(const char *fmt, ...) {
    char cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    if (system(cmd) != 0) fprintf(stderr, "command failed: %s\n", cmd);
}

/* dir/name's contents (malloc'd, NUL-terminated), or NULL. */
static inline char *read_text(const char *dir, const char *name) {
    char *p = path_join(dir, name), *data = NULL;
    size_t len;
    if (file_read_all(p, &data, &len, NULL) != 0) data = NULL;
    free(p);
    return data;
}

static inline bool exists_in(const char *dir, const char *name) {
    char *p = path_join(dir, name);
    struct stat st;
    bool e = lstat(p, &st) == 0;
    free(p);
    return e;
}

/* True when dir_a/name and dir_b/name have the same bytes. */
static inline bool same_file(const char *a_dir, const char *b_dir, const char *name) {
    char *pa = path_join(a_dir, name), *pb = path_join(b_dir, name), *da = NULL, *db = NULL;
    size_t la = 0, lb = 0;
    bool same = file_read_all(pa, &da, &la, NULL) == 0 && file_read_all(pb, &db, &lb, NULL) == 0 && la == lb &&
                memcmp(da, db, la) == 0;
    free(pa), free(pb), free(da), free(db);
    return same;
}

static inline int count_lines(const char *s) {
    int n = 0;
    for (; s && *s; s++) n += *s == '\n';
    return n;
}

/* metrics.jsonl with sorted keys and without the timings (step_time, time/...),
 * which differ run to run: two runs that did the same work give equal text. */
static inline char *metrics_without_timing(const char *dir) {
    char *text = read_text(dir, "metrics.jsonl");
    if (!text) return strdup("(missing)");
    size_t cap = strlen(text) + 1, len = 0;
    char *out = malloc(cap);
    out[0] = '\0';
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        json_t *o = json_loads(line, 0, NULL);
        const char *key;
        json_t *value;
        void *next;
        json_object_foreach_safe(o, next, key, value) {
            if (!strcmp(key, "step_time") || !strncmp(key, "time/", 5)) json_object_del(o, key);
        }
        char *s = o ? json_dumps(o, JSON_SORT_KEYS | JSON_COMPACT) : strdup("(bad line)");
        size_t l = strlen(s);
        if (len + l + 2 > cap) cap = (len + l + 2) * 2, out = realloc(out, cap);
        memcpy(out + len, s, l);
        len += l;
        out[len++] = '\n';
        out[len] = '\0';
        free(s);
        json_decref(o);
    }
    free(text);
    return out;
}

#endif
