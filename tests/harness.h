/* harness.h — what the tests share: check counting, running the colt binary
 * (run_colt), shell commands, reading an output folder, comparing runs. Include it once,
 * from one test file; every test file is its own program, so the counters and
 * the scratch folder are per test. Unused helpers cost nothing (static inline). */
#ifndef COLT_TESTS_HARNESS_H
#define COLT_TESTS_HARNESS_H

#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/fileio.h"

/* The environment of a multi-rank launch in a sanitizer build (mpirun's -x, or a prefix
 * of colt's own launcher and of a self-started TP server): leak checking off.
 * LeakSanitizer stops the world with a tracer at exit, and with many threads under
 * load (4 ranks x OpenMP, BLAS and MPI threads on 2 cores) that tracer itself crashes
 * at random ("Tracer caught signal 11"), failing a correct run. Every other ASan and
 * UBSan check stays on; the same code paths are leak-checked in single-process runs
 * (docs/testing.md). No effect on a build without sanitizers. */
#define NO_LEAK_CHECK "LSAN_OPTIONS=detect_leaks=0"

static int g_failures = 0, g_checks = 0;
static char g_tmp[256] __attribute__((unused)); /* the test's scratch folder (not every test has one) */

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

/* How run_colt_with runs colt; zero (or NULL) for each: nothing before the binary, no standard input,
 * standard output to g_tmp/stdout, no time limit, no file-size limit. */
typedef struct ColtRun {
    const char *env;        /* shell words first: VAR=value assignments, `cd DIR &&` */
    const char *launcher;   /* words right before the binary, inside the time limit: `mpirun -np 2` */
    const char *subcommand; /* words right after the binary, before ARGS: "train" */
    const char *stdin_text; /* standard input (through g_tmp/stdin) */
    int timeout_s;          /* > 0: killed (SIGKILL) after that many seconds: exit 137 */
    long max_file_bytes;    /* > 0: files limited to that size, SIGXFSZ ignored, so a write past it fails
                             * with EFBIG as on a full disk */
    char **out;             /* when set: standard output (malloc'd, "" when unreadable) */
} ColtRun;

#ifdef COLT_BINARY
/* Runs `[env] [timeout] [launcher] colt [subcommand] ARGS` through sh (ARGS may quote and redirect), standard error
 * into g_tmp/stderr and *err (malloc'd, "" when unreadable; err may be NULL). Returns colt's exit
 * status, or 128 when the shell itself was killed by a signal. */
static inline int run_colt_with(const ColtRun *opt, const char *args, char **err) {
    static const ColtRun none = {0};
    if (!opt) opt = &none;
    if (!g_tmp[0]) {
        fprintf(stderr, "run_colt: the test has no scratch folder (g_tmp) for colt's output\n");
        exit(1);
    }
    char in_path[300], out_path[300], err_path[300], timeout[48] = "", stdin_redirect[320] = "";
    snprintf(in_path, sizeof in_path, "%s/stdin", g_tmp);
    snprintf(out_path, sizeof out_path, "%s/stdout", g_tmp);
    snprintf(err_path, sizeof err_path, "%s/stderr", g_tmp);
    if (opt->stdin_text) {
        FILE *fp = fopen(in_path, "wb");
        if (fp) fputs(opt->stdin_text, fp), fclose(fp);
        snprintf(stdin_redirect, sizeof stdin_redirect, "< %s", in_path);
    }
    if (opt->timeout_s > 0) snprintf(timeout, sizeof timeout, "timeout -s KILL %d", opt->timeout_s);
    size_t cap = strlen(args) + 2048;
    char *cmd = malloc(cap);
    snprintf(cmd, cap, "%s %s %s %s %s %s %s > %s 2> %s", opt->env ? opt->env : "", timeout,
             opt->launcher ? opt->launcher : "", COLT_BINARY, opt->subcommand ? opt->subcommand : "", args,
             stdin_redirect, out_path, err_path);
    fflush(NULL); /* the child must not repeat this process's buffered output */
    pid_t pid = fork();
    if (pid == 0) {
        if (opt->max_file_bytes > 0) {
            struct rlimit rl = {.rlim_cur = (rlim_t)opt->max_file_bytes, .rlim_max = (rlim_t)opt->max_file_bytes};
            signal(SIGXFSZ, SIG_IGN);
            if (setrlimit(RLIMIT_FSIZE, &rl) != 0) _exit(126);
        }
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid) status = -1;
    free(cmd);
    if (opt->out && file_read_all(out_path, opt->out, NULL, NULL) != 0) *opt->out = strdup("");
    if (err && file_read_all(err_path, err, NULL, NULL) != 0) *err = strdup("");
    return status >= 0 && WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

/* `colt ARGS` with run_colt_with's defaults. */
static inline int run_colt(const char *args, char **err) { return run_colt_with(NULL, args, err); }
#endif

/* Starts `sh -c CMD` in the background (CMD starting with `exec` makes the pid colt's own, for signals),
 * standard output and error into the files named, /dev/null for NULL. Returns its pid. */
static inline pid_t start_command(const char *cmd, const char *out_path, const char *err_path) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        if (!freopen(out_path ? out_path : "/dev/null", "w", stdout) ||
            !freopen(err_path ? err_path : "/dev/null", "w", stderr))
            _exit(126);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    return pid;
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

/* The steps a run has logged so far (lines of dir/metrics.jsonl). */
static inline int count_metric_lines(const char *dir) {
    char *text = read_text(dir, "metrics.jsonl");
    int n = count_lines(text);
    free(text);
    return n;
}

/* Waits (at most seconds) until a run has logged n steps. */
static inline void wait_for_metric_lines(const char *dir, int n, double seconds) {
    double start = now_s();
    while (count_metric_lines(dir) < n && now_s() - start < seconds) usleep(20000);
}

/* The step of the newest checkpoint-N folder in dir, or -1. */
static inline int newest_checkpoint(const char *dir) {
    int best = -1;
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        int s;
        char tail;
        if (sscanf(e->d_name, "checkpoint-%d%c", &s, &tail) == 1 && s > best) best = s;
    }
    if (d) closedir(d);
    return best;
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

/* metrics.jsonl's value of key at each step (1-based; NAN where absent), n steps at most. */
static inline void metric_by_step(double *out, int n, const char *dir, const char *key) {
    for (int i = 0; i < n; i++) out[i] = NAN;
    char *text = read_text(dir, "metrics.jsonl");
    for (char *line = text ? strtok(text, "\n") : NULL; line; line = strtok(NULL, "\n")) {
        json_t *o = json_loads(line, 0, NULL);
        int step = (int)json_integer_value(json_object_get(o, "step"));
        if (step >= 1 && step <= n && json_is_number(json_object_get(o, key)))
            out[step - 1] = json_number_value(json_object_get(o, key));
        json_decref(o);
    }
    free(text);
}

/* Comparing the metrics of two runs that did the same work in another order (another
 * world size, TP degree, thread count or BLAS): a relative difference means
 * something only for a value of the size of the terms it sums. The GRPO loss is a
 * sum of advantage-weighted ratios whose advantages cancel within each group
 * (|A| ~ 1), so a loss near zero carries the rounding of O(1) terms: another
 * summation order moves 1e-3 by 0.3%. The same holds for the engine-vs-trainer
 * log-prob differences (rounding of log-probs of size ~1). Such metrics are compared
 * against a floor of 1; every other one against a floor of 1e-3 (rewards, KL,
 * entropy, lengths and norms do not cancel). Returns |x - y| / max(|x|, |y|, floor). */
static inline double metric_scale_floor(const char *key) {
    if (!strcmp(key, "loss") || !strncmp(key, "sampling/sampling_logp_difference/", 34)) return 1.0;
    return 1e-3;
}

static inline double metric_difference(const char *key, double x, double y) {
    return fabs(x - y) / fmax(fmax(fabs(x), fabs(y)), metric_scale_floor(key));
}

/* Metrics that are the world's: not timings, not memory, not one rank's engine. */
static inline bool metric_is_compared(const char *key) {
    return strncmp(key, "time/", 5) != 0 && strcmp(key, "step_time") != 0 && strncmp(key, "engine/", 7) != 0 &&
           strncmp(key, "memory/", 7) != 0;
}

#endif
