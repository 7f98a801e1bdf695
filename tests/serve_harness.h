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
#include <jansson.h>
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
    size_t abort_after; /* > 0: the client hangs up once this many bytes arrived */
} HttpBuf;

static inline size_t http_on_data(char *p, size_t size, size_t n, void *user) {
    HttpBuf *b = user;
    b->data = realloc(b->data, b->len + size * n + 1);
    memcpy(b->data + b->len, p, size * n);
    b->len += size * n;
    b->data[b->len] = '\0';
    if (b->abort_after > 0 && b->len >= b->abort_after) return 0; /* curl aborts the transfer */
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

/* A request to 127.0.0.1:port/path, made but not performed (curl_easy_perform or a multi handle runs it):
 * method NULL for GET, or POST when there is a body; the answer's body into *out; headers as given (NULL:
 * none of ours), bounded by timeout_ms. */
static inline CURL *serve_request(int port, const char *method, const char *path, const char *body, HttpBuf *out,
                                  long timeout_ms, struct curl_slist *headers) {
    char url[256];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", port, path);
    CURL *h = curl_easy_init();
    curl_easy_setopt(h, CURLOPT_URL, url);
    if (method) curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
    if (body) {
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
    }
    if (headers) curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, http_on_data);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, out);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    return h;
}

/* Performs and frees a serve_request; the HTTP status (0: no answer), the body in *out (malloc'd, "" when
 * none) or dropped when out is NULL. */
static inline long serve_perform(CURL *h, HttpBuf *b, char **out) {
    long status = 0;
    if (curl_easy_perform(h) == CURLE_OK) curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(h);
    if (out) *out = b->data ? b->data : strdup("");
    else free(b->data);
    b->data = NULL, b->len = 0;
    return status;
}

/* One request with these extra header lines (NULL-terminated; NULL: none, curl's defaults): method NULL
 * for GET (POST when body). Returns the HTTP status (0: no answer), the body as serve_perform. */
static inline long serve_http_with(int port, const char *method, const char *path, const char *body,
                                   const char *const *header_lines, long timeout_ms, char **out) {
    struct curl_slist *headers = NULL;
    for (int i = 0; header_lines && header_lines[i]; i++) headers = curl_slist_append(headers, header_lines[i]);
    HttpBuf b = {0};
    long status = serve_perform(serve_request(port, method, path, body, &b, timeout_ms, headers), &b, out);
    curl_slist_free_all(headers);
    return status;
}

/* GET (body NULL) or POST of JSON (http_json_headers) to 127.0.0.1:port/path, bounded by timeout_ms.
 * Returns the HTTP status (0: no answer) and, when out is not NULL, the body in *out (malloc'd, "" when none). */
static inline long serve_http(int port, const char *path, const char *body, long timeout_ms, char **out) {
    HttpBuf b = {0};
    return serve_perform(serve_request(port, NULL, path, body, &b, timeout_ms, http_json_headers()), &b, out);
}

/* POSTs body to path and parses the JSON answer: NULL, after a failed check, unless 200. */
static inline json_t *serve_post_json(int port, const char *path, const char *body, long timeout_ms) {
    char *out;
    long status = serve_http(port, path, body, timeout_ms, &out);
    json_t *o = status == 200 ? json_loads(out, 0, NULL) : NULL;
    CHECK(o != NULL, "POST %s %s: status %ld, %.300s", path, body, status, out);
    free(out);
    return o;
}

/* The value of a /metrics line "name value" (header_lines as serve_http_with; NULL: http_json_headers),
 * or -1 when there is none or no 200. */
static inline double serve_metric(int port, const char *const *header_lines, const char *name) {
    char *text = NULL, key[128];
    long status = header_lines ? serve_http_with(port, NULL, "/metrics", NULL, header_lines, 60000L, &text)
                               : serve_http(port, "/metrics", NULL, 60000L, &text);
    snprintf(key, sizeof key, "\n%s ", name);
    const char *at = status == 200 ? strstr(text, key) : NULL;
    double v = at ? atof(at + strlen(key)) : -1;
    free(text);
    return v;
}

/* s as a JSON string literal, quotes and escapes included (malloc'd): for request bodies. */
static inline char *json_quoted(const char *s) {
    json_t *j = json_string(s);
    char *q = json_dumps(j, JSON_ENCODE_ANY);
    json_decref(j);
    return q;
}

#endif
