/* serve_harness.h — what the tests that start `colt serve` share: a server
 * process started from the caller's command line (one process, mpirun, ...)
 * with --port 0, its port learned from its "listening" line; a stop by signal
 * (SIGTERM drains) bounded in time; every server still running killed at exit;
 * a free port for the weight channel; and HTTP with libcurl, carrying the API
 * key from COLT_API_KEY. Include it after harness.h. Not a client library:
 * tests that probe headers, streams or disconnects set up their own requests. */
#ifndef COLT_TESTS_SERVE_HARNESS_H
#define COLT_TESTS_SERVE_HARNESS_H

#include <curl/curl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

typedef struct Server {
    pid_t pid;   /* what the test started: colt serve, or mpirun */
    pid_t rank0; /* a tensor-parallel server's rank 0 (its "rank 0: pid N" line), else 0 */
    int port;
    char log[300];
} Server;

#define SERVE_MAX_SERVERS 8
static Server *g_started_servers[SERVE_MAX_SERVERS];

/* SIGKILL to every server still running (atexit, and at the end of a test). */
static inline void serve_kill_all(void) {
    for (int i = 0; i < SERVE_MAX_SERVERS; i++) {
        Server *s = g_started_servers[i];
        if (s && s->pid > 0) {
            kill(s->pid, SIGKILL);
            waitpid(s->pid, NULL, 0);
            s->pid = 0;
        }
    }
}

/* Runs `exec COMMAND > g_tmp/NAME.log 2>&1` (COMMAND ends in --port 0) and waits (timeout_s at most) for
 * the "listening on http://HOST:PORT" line, and for "rank 0: pid N" too when want_rank0. The server
 * dies with the test (PR_SET_PDEATHSIG). False, after a failed check naming the log, when it did not start. */
static inline bool serve_start(Server *s, const char *name, const char *command, double timeout_s, bool want_rank0) {
    snprintf(s->log, sizeof s->log, "%s/%s.log", g_tmp, name);
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "exec %s > %s 2>&1", command, s->log);
    s->port = 0, s->rank0 = 0;
    s->pid = fork();
    if (s->pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < SERVE_MAX_SERVERS; i++)
        if (!g_started_servers[i] || g_started_servers[i] == s) {
            g_started_servers[i] = s;
            break;
        }
    const char *listening = "listening on http://", *rank0 = "rank 0: pid ";
    for (double deadline = now_s() + timeout_s; now_s() < deadline; usleep(50 * 1000)) {
        char *text = NULL; /* file_read_all, not read_text: GCC 12 sees a false dangling pointer through it */
        size_t len;
        if (file_read_all(s->log, &text, &len, NULL) != 0) text = NULL;
        const char *at = text ? strstr(text, listening) : NULL, *r = at ? strstr(at, rank0) : NULL;
        if (at) { /* the port: after the last ':' of HOST:PORT (an IPv6 host has its own) */
            const char *end = at + strlen(listening), *colon = NULL;
            for (; *end && *end != '/' && *end != ' ' && *end != '\n'; end++)
                if (*end == ':') colon = end;
            if (colon) s->port = atoi(colon + 1);
        }
        if (r) s->rank0 = (pid_t)atoi(r + strlen(rank0));
        free(text);
        if (s->port > 0 && (!want_rank0 || s->rank0 > 0)) return true;
        if (waitpid(s->pid, NULL, WNOHANG) == s->pid) {
            s->pid = 0;
            break;
        }
    }
    CHECK(0, "%s did not start (log %s)", command, s->log);
    return false;
}

/* A server that has exited leaves the list serve_kill_all reads (it may live on the caller's stack). */
static inline void serve_forget(Server *s) {
    s->pid = 0;
    for (int i = 0; i < SERVE_MAX_SERVERS; i++)
        if (g_started_servers[i] == s) g_started_servers[i] = NULL;
}

/* Waits (timeout_s at most) for the server to exit: its exit code (128 + signal when killed), or -1 when
 * it had to be killed. */
static inline int serve_wait_exit(Server *s, double timeout_s) {
    if (s->pid <= 0) return -1;
    int status = 0;
    for (double deadline = now_s() + timeout_s; now_s() < deadline; usleep(20 * 1000))
        if (waitpid(s->pid, &status, WNOHANG) == s->pid) {
            serve_forget(s);
            return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        }
    kill(s->pid, SIGKILL);
    waitpid(s->pid, NULL, 0);
    serve_forget(s);
    return -1;
}

/* Sends sig (SIGTERM: the server drains, then exits 0) and waits as serve_wait_exit. */
static inline int serve_stop(Server *s, int sig, double timeout_s) {
    if (s->pid <= 0) return -1;
    kill(s->pid, sig);
    return serve_wait_exit(s, timeout_s);
}

/* A TCP port nobody listens on now (the kernel's pick, released). */
static inline int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int port = 0;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

/* True once pid is gone, waiting up to timeout_s (a zombie counts: its parent reaps it). */
static inline bool process_gone(pid_t pid, double timeout_s) {
    for (double deadline = now_s() + timeout_s;; usleep(50 * 1000)) {
        char path[64], *stat = NULL;
        size_t len;
        snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
        bool alive = file_read_all(path, &stat, &len, NULL) == 0;
        if (alive) {
            const char *state = strrchr(stat, ')');
            alive = !(state && state[1] == ' ' && state[2] == 'Z');
            free(stat);
        }
        if (!alive) return true;
        if (now_s() > deadline) return false;
    }
}

/* ---------------------------------------------------------------- HTTP (libcurl) */

typedef struct HttpBuf {
    char *data;
    size_t len;
} HttpBuf;

static inline size_t http_on_data(char *p, size_t size, size_t n, void *user) {
    HttpBuf *b = user;
    b->data = realloc(b->data, b->len + size * n + 1);
    memcpy(b->data + b->len, p, size * n);
    b->len += size * n;
    b->data[b->len] = '\0';
    return size * n;
}

/* Content-Type: application/json, and Authorization: Bearer $COLT_API_KEY when it is set (made once). */
static inline struct curl_slist *http_json_headers(void) {
    static struct curl_slist *headers = NULL;
    if (!headers) {
        headers = curl_slist_append(NULL, "Content-Type: application/json");
        const char *key = getenv("COLT_API_KEY");
        if (key && *key) {
            char line[512];
            snprintf(line, sizeof line, "Authorization: Bearer %s", key);
            headers = curl_slist_append(headers, line);
        }
    }
    return headers;
}

/* GET (body NULL) or POST of JSON to 127.0.0.1:port/path, bounded by timeout_ms. Returns the HTTP status
 * (0: no answer) and, when out is not NULL, the body in *out (malloc'd, "" when none). */
static inline long serve_http(int port, const char *path, const char *body, long timeout_ms, char **out) {
    char url[256];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", port, path);
    HttpBuf b = {0};
    CURL *h = curl_easy_init();
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, http_on_data);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, http_json_headers());
    if (body) {
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
    }
    long status = 0;
    if (curl_easy_perform(h) == CURLE_OK) curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(h);
    if (out) *out = b.data ? b.data : strdup("");
    else free(b.data);
    return status;
}

#endif
