/* test_serve_security.c — `colt serve` as a stranger meets it: the built
 * binary with the real stories260K on 127.0.0.1, talked to with libcurl and
 * raw sockets, the weight channel's store with colt's own client.
 * - without a key: every trainer endpoint (/colt/...) answers 403 saying how
 *   to start with a key, and no weight-channel store ever listens; greedy
 *   output is the same before and after; POST bodies not sent as
 *   application/json get 415, a foreign Origin 403 (same origin: 200), a
 *   Host that is a DNS name other than localhost (DNS rebinding) 403;
 * - with a key (COLT_API_KEY): every endpoint but /health answers 401
 *   (OpenAI's error object) without it or with a wrong one, 200 with it;
 *   the weight channel's store listens on 127.0.0.1 only, drops a client
 *   that does not show the key (raw c10d greeting) and refuses colt's own
 *   client with a wrong key in one line; nothing changed (greedy identical,
 *   no weight update counted);
 * - a pending init_weight_sync (timeout 86400) blocks neither generation nor
 *   SIGTERM: the server exits 0 within a few seconds;
 * - --host 0.0.0.0 without a key prints a warning (with one it does not);
 * - a connection sending one byte every 0.3 s is cut at its request deadline
 *   (--request_timeout 2); one address holds at most its share of the
 *   connections; a huge Content-Length gets one 413;
 * - colt train --vllm_mode server with the right key (vllm_server_api_key)
 *   trains and pushes; with a wrong one it stops with one line about the
 *   key, pushes nothing, and no key is written into its output folder;
 * - SIGTERM while the server receives a push its trainer stopped sending:
 *   it exits after its grace (5 s), saying so. */
#include <arpa/inet.h>
#include <curl/curl.h>
#include <errno.h>
#include <ifaddrs.h>
#include <jansson.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend/backend.h"
#include "core/error.h"
#include "parallel/weight_sync.h"
#include "harness.h"
#include "serve_harness.h"

#define MODEL COLT_SOURCE_DIR "/models/stories260K"
#define KEY "test-key-0123456789abcdef"
#define GREEDY "{\"prompt\": \"Once upon a time\", \"max_tokens\": 24, \"temperature\": 0}"

/* ---------------------------------------------------------------- processes */

static Server g_servers[4];

/* `colt serve --model MODEL ARGS --port 0` (COLT_API_KEY=env_key when given), waits for its "listening on
 * http://HOST:" line. */
static bool server_start(Server *s, const char *name, const char *host, const char *args, const char *env_key) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "env %s%s %s serve --model %s --host %s %s --port 0", env_key ? "COLT_API_KEY=" : "-u COLT_API_KEY",
             env_key ? env_key : "", COLT_BINARY, MODEL, host, args);
    return serve_start(s, name, cmd, 60, false);
}

/* Sends sig; the exit code, or -1 after timeout_s (then it is killed). *seconds: how long it took. */
static int server_stop(Server *s, int sig, double timeout_s, double *seconds) {
    double t0 = now_s();
    int code = serve_stop(s, sig, timeout_s);
    if (seconds) *seconds = now_s() - t0;
    return code;
}

/* ---------------------------------------------------------------- HTTP */

/* One request (POST when body); headers: NULL-terminated extra header lines. Returns the status; *out the
 * body (malloc'd) when out. */
static long http(const Server *s, const char *path, const char *body, const char *const *headers, char **out) {
    return serve_http_with(s->port, NULL, path, body, headers, 60000L, out);
}

static const char *const JSON[] = {"Content-Type: application/json", NULL};
static const char *const JSON_KEY[] = {"Content-Type: application/json", "Authorization: Bearer " KEY, NULL};
static const char *const JSON_WRONG[] = {"Content-Type: application/json", "Authorization: Bearer not-the-key", NULL};

/* The greedy completion's text (malloc'd), or NULL. */
static char *greedy(const Server *s, const char *const *headers) {
    char *body = NULL;
    long st = http(s, "/v1/completions", GREEDY, headers, &body);
    json_t *o = st == 200 ? json_loads(body, 0, NULL) : NULL;
    const char *text = json_string_value(json_object_get(json_array_get(json_object_get(o, "choices"), 0), "text"));
    char *copy = text ? strdup(text) : NULL;
    json_decref(o);
    free(body);
    return copy;
}

/* An OpenAI error object with this code whose message holds needle. */
static bool error_says(const char *body, long code, const char *needle) {
    json_t *o = json_loads(body, 0, NULL), *e = json_object_get(o, "error");
    const char *msg = json_string_value(json_object_get(e, "message"));
    bool ok = msg && strstr(msg, needle) && json_integer_value(json_object_get(e, "code")) == code &&
              json_is_string(json_object_get(e, "type"));
    json_decref(o);
    return ok;
}

/* headers NULL: none at all (not the JSON ones serve_metric would add). */
static double metric(const Server *s, const char *const *headers, const char *name) {
    static const char *const none[] = {NULL};
    return serve_metric(s->port, headers ? headers : none, name);
}

/* ---------------------------------------------------------------- sockets */

/* A TCP connection to addr:port (network order address), or -1. */
static int connect_to(uint32_t addr, int port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = addr};
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    struct timeval tv = {10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

/* This machine's first IPv4 address that is not loopback (network order), or 0. */
static uint32_t outside_address(void) {
    struct ifaddrs *list = NULL, *i;
    uint32_t addr = 0;
    if (getifaddrs(&list) != 0) return 0;
    for (i = list; i && !addr; i = i->ifa_next)
        if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET) {
            uint32_t a = ((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr;
            if ((ntohl(a) >> 24) != 127) addr = a;
        }
    freeifaddrs(list);
    return addr;
}

/* Whether the peer closed fd (recv 0 or reset) within timeout_s; *seconds: when. */
static bool closed_by_peer(int fd, double timeout_s, double *seconds) {
    double t0 = now_s();
    char buf[4096];
    while (now_s() - t0 < timeout_s) {
        ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
            if (seconds) *seconds = now_s() - t0;
            return true;
        }
        usleep(20 * 1000);
    }
    return false;
}

/* A c10d greeting (VALIDATE) and a CHECK of one key, optionally after a SET of colt's token key. */
static void store_greet(int fd, const char *token) {
    uint8_t msg[256];
    size_t n = 0;
    uint32_t magic = 0x3C85F7CEu;
    msg[n++] = 0; /* VALIDATE */
    memcpy(msg + n, &magic, 4), n += 4;
    if (token) {
        uint64_t kl = strlen("\x01" "colt/token"), vl = strlen(token);
        msg[n++] = 1; /* SET */
        memcpy(msg + n, &kl, 8), n += 8;
        memcpy(msg + n, "\x01" "colt/token", kl), n += kl;
        memcpy(msg + n, &vl, 8), n += 8;
        memcpy(msg + n, token, vl), n += vl;
    }
    uint64_t one = 1, kl = 4;
    msg[n++] = 5; /* CHECK */
    memcpy(msg + n, &one, 8), n += 8;
    memcpy(msg + n, &kl, 8), n += 8;
    memcpy(msg + n, "abcd", 4), n += 4;
    (void)!send(fd, msg, n, MSG_NOSIGNAL);
}

/* ---------------------------------------------------------------- the parts */

static const char *COLT_PATHS[] = {"/colt/generate", "/colt/init_weight_sync", "/colt/update_weights",
                                   "/colt/close_weight_sync"};

/* 1. No key: /colt/... is off, the store never listens, browsers' requests are refused. */
static void check_without_key(Server *s, const char *reference) {
    int port = free_port();
    char *body = NULL, sync[128];
    snprintf(sync, sizeof sync, "{\"port\": %d, \"timeout\": 86400}", port);
    int refused = 0;
    long st = http(s, "/colt/info", NULL, NULL, &body);
    refused += st == 403 && error_says(body, 403, "--api_key");
    free(body);
    for (int i = 0; i < 4; i++) {
        const char *b = i == 1 ? sync : i == 0 ? "{\"prompts\": [[1, 403, 407]], \"streams\": [7]}" : "{}";
        st = http(s, COLT_PATHS[i], b, JSON, &body);
        CHECK(st == 403 && error_says(body, 403, "start colt serve with --api_key KEY"), "%s without a key: %ld %s",
              COLT_PATHS[i], st, body);
        refused += st == 403;
        free(body);
    }
    usleep(300 * 1000);
    int fd = connect_to(htonl(INADDR_LOOPBACK), port);
    CHECK(fd < 0, "without a key, a weight-channel store listens on port %d", port);
    if (fd >= 0) close(fd);
    printf("  no key: %d/5 trainer endpoints answered 403 naming --api_key; no store on port %d\n", refused, port);
    CHECK(refused == 5, "%d of 5 trainer endpoints refused", refused);

    /* browsers: text/plain (a CORS-simple request), no type, a foreign Origin */
    const char *const plain[] = {"Content-Type: text/plain", NULL};
    const char *const none[] = {"Content-Type:", NULL};
    const char *const foreign[] = {"Content-Type: application/json", "Origin: http://evil.example", NULL};
    char origin[128];
    snprintf(origin, sizeof origin, "Origin: http://127.0.0.1:%d", s->port);
    const char *const same[] = {"Content-Type: application/json", origin, NULL};
    long st_plain = http(s, "/v1/completions", GREEDY, plain, &body);
    CHECK(st_plain == 415 && error_says(body, 415, "application/json"), "text/plain: %ld %s", st_plain, body);
    free(body);
    long st_none = http(s, "/v1/chat/completions", "{}", none, &body);
    CHECK(st_none == 415, "no Content-Type: %ld %s", st_none, body);
    free(body);
    long st_foreign = http(s, "/v1/completions", GREEDY, foreign, &body);
    CHECK(st_foreign == 403 && error_says(body, 403, "cross-origin"), "foreign Origin: %ld %s", st_foreign, body);
    free(body);
    long st_same = http(s, "/v1/completions", GREEDY, same, NULL);
    CHECK(st_same == 200, "same-origin Origin: %ld", st_same);
    /* DNS rebinding: a page's own name pointed at 127.0.0.1, so its origin is "the server" */
    const char *const rebound[] = {"Content-Type: application/json", "Host: evil.example:80",
                                   "Origin: http://evil.example:80", NULL};
    long st_rebound = http(s, "/v1/completions", GREEDY, rebound, &body);
    CHECK(st_rebound == 403 && error_says(body, 403, "DNS names other than localhost"), "a rebound Host: %ld %s",
          st_rebound, body);
    free(body);
    const char *const local[] = {"Content-Type: application/json", "Host: localhost", NULL};
    long st_local = http(s, "/v1/completions", GREEDY, local, NULL);
    CHECK(st_local == 200, "Host: localhost: %ld", st_local);
    printf("  browsers: text/plain %ld, no Content-Type %ld, foreign Origin %ld, same origin %ld, a rebound DNS name "
           "%ld, Host localhost %ld\n", st_plain, st_none, st_foreign, st_same, st_rebound, st_local);
    char *after = greedy(s, JSON);
    CHECK(after && reference && strcmp(after, reference) == 0, "greedy changed: '%s' then '%s'", reference, after);
    double updates = metric(s, NULL, "colt_weight_updates_total");
    CHECK(updates == 0, "colt_weight_updates_total %g after the refused requests", updates);
    printf("  greedy before and after: %s; weight updates %g\n", after && reference && !strcmp(after, reference) ?
           "identical" : "DIFFERENT", updates);
    free(after);
}

/* 2. A key: 401 without it; the store binds loopback and admits only the key; SIGTERM while it waits. */
static void check_with_key(Server *s, const char *reference) {
    char *body = NULL;
    long st = http(s, "/health", NULL, NULL, NULL);
    CHECK(st == 200, "/health without the key: %ld", st);
    const char *gets[] = {"/v1/models", "/metrics", "/colt/info"};
    int unauthorized = 0, total = 0;
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < 2; k++, total++) {
            const char *const wrong[] = {"Authorization: Bearer not-the-key", NULL};
            st = http(s, gets[i], NULL, k ? wrong : NULL, &body);
            unauthorized += st == 401 && error_says(body, 401, k ? "wrong API key" : "no API key");
            free(body);
        }
    const char *posts[] = {"/v1/completions", "/v1/chat/completions", "/colt/generate", "/colt/init_weight_sync",
                           "/colt/update_weights", "/colt/close_weight_sync"};
    for (int i = 0; i < 6; i++)
        for (int k = 0; k < 2; k++, total++) {
            st = http(s, posts[i], "{\"port\": 29777, \"timeout\": 86400}", k ? JSON_WRONG : JSON, &body);
            unauthorized += st == 401 && error_says(body, 401, "Authorization: Bearer KEY");
            free(body);
        }
    printf("  key: %d/%d requests without it or with a wrong one answered 401 (OpenAI error object)\n", unauthorized,
           total);
    CHECK(unauthorized == total, "%d of %d unauthorized requests answered 401", unauthorized, total);
    char *with_key = greedy(s, JSON_KEY);
    CHECK(with_key && reference && strcmp(with_key, reference) == 0, "greedy with the key: '%s'", with_key);
    free(with_key);

    /* the weight channel with the key, a trainer that never comes: the store is there, loopback only */
    int port = free_port();
    char sync[128];
    snprintf(sync, sizeof sync, "{\"port\": %d, \"timeout\": 86400}", port);
    st = http(s, "/colt/init_weight_sync", sync, JSON_KEY, &body);
    CHECK(st == 200, "init_weight_sync with the key: %ld %s", st, body);
    free(body);
    int fd = -1;
    for (double t0 = now_s(); fd < 0 && now_s() - t0 < 10; usleep(50 * 1000)) fd = connect_to(htonl(INADDR_LOOPBACK), port);
    CHECK(fd >= 0, "the weight channel's store does not listen on 127.0.0.1:%d", port);
    uint32_t outside = outside_address();
    if (outside) {
        int fo = connect_to(outside, port);
        char a[INET_ADDRSTRLEN];
        inet_ntop(AF_INET, &outside, a, sizeof a);
        CHECK(fo < 0, "the weight channel's store answers on %s:%d (the server is bound to 127.0.0.1)", a, port);
        printf("  store: listens on 127.0.0.1:%d, not on this machine's %s\n", port, a);
        if (fo >= 0) close(fo);
    } else {
        printf("  store: listens on 127.0.0.1:%d (this machine has no other IPv4 address to try)\n", port);
    }
    bool dropped_plain = false, dropped_wrong = false;
    if (fd >= 0) {
        store_greet(fd, NULL);
        dropped_plain = closed_by_peer(fd, 5, NULL);
        close(fd);
    }
    fd = connect_to(htonl(INADDR_LOOPBACK), port);
    if (fd >= 0) {
        store_greet(fd, "not-the-key");
        dropped_wrong = closed_by_peer(fd, 5, NULL);
        close(fd);
    }
    CHECK(dropped_plain && dropped_wrong, "the store kept a client without the key (%d) or with a wrong one (%d)",
          dropped_plain, dropped_wrong);
    /* colt's own client as a trainer with a wrong key: one line */
    char err[ERR_LEN] = "";
    Backend *be = backend_open("cpu", 0, err);
    WeightSync *w = NULL;
    int rc = -1;
    if (be) {
        WeightSyncOptions o = {.host = "127.0.0.1", .port = port, .rank = 1, .world_size = 2, .be = be,
                               .timeout_s = 5, .token = "not-the-key"};
        rc = weight_sync_open(&w, &o, err);
        weight_sync_close(w);
        backend_close(be);
    }
    CHECK(rc != 0 && strstr(err, "wants another key") && !strchr(err, '\n'), "a trainer with a wrong key: %d %s", rc,
          err);
    printf("  store: a raw client without the key %s, with a wrong one %s; colt's client: \"%s\"\n",
           dropped_plain ? "dropped" : "KEPT", dropped_wrong ? "dropped" : "KEPT", err);

    /* the pending open blocks no request */
    double t0 = now_s();
    char *during = greedy(s, JSON_KEY);
    double seconds = now_s() - t0;
    CHECK(during && reference && strcmp(during, reference) == 0 && seconds < 5,
          "greedy while init_weight_sync waits: %.2f s '%s'", seconds, during);
    printf("  greedy while init_weight_sync waits (timeout 86400): %.2f s, %s\n", seconds,
           during && reference && !strcmp(during, reference) ? "identical" : "DIFFERENT");
    free(during);
    const char *const key_only[] = {"Authorization: Bearer " KEY, NULL};
    double updates = metric(s, key_only, "colt_weight_updates_total");
    CHECK(updates == 0, "colt_weight_updates_total %g", updates);
    char *log = read_text(g_tmp, strrchr(s->log, '/') + 1);
    CHECK(log && !strstr(log, "warning"), "a warning with a key on loopback: %s", log);
    free(log);
    /* SIGTERM while the open waits */
    int code = server_stop(s, SIGTERM, 15, &seconds);
    printf("  SIGTERM during a pending init_weight_sync: exit %d after %.2f s\n", code, seconds);
    CHECK(code == 0 && seconds < 5, "SIGTERM during a pending init_weight_sync: exit %d after %.2f s", code, seconds);
}

/* 3. --host 0.0.0.0 without a key warns; a slow connection is cut at its deadline; one peer's share; 413. */
static void check_connections(Server *s) {
    char *log = read_text(g_tmp, strrchr(s->log, '/') + 1);
    CHECK(log && strstr(log, "warning: --host 0.0.0.0 without an API key"), "no warning for 0.0.0.0: %s", log ? log : "(no log)");
    printf("  --host 0.0.0.0 without a key: %s\n", log && strstr(log, "warning") ? "warned" : "NO WARNING");
    free(log);

    /* one byte every 0.3 s: cut at the 2 s deadline, though never idle */
    int fd = connect_to(htonl(INADDR_LOOPBACK), s->port);
    const char *head = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                       "X-Slow: ";
    double t0 = now_s(), cut = -1;
    bool was_cut = false;
    for (size_t i = 0; fd >= 0 && i < strlen(head) && now_s() - t0 < 10; i++) {
        if (send(fd, head + i, 1, MSG_NOSIGNAL) != 1) break;
        if (closed_by_peer(fd, 0.3, NULL)) {
            was_cut = true;
            break;
        }
    }
    cut = now_s() - t0;
    if (fd >= 0) close(fd);
    CHECK(was_cut && cut > 1.5 && cut < 4, "a slow connection: cut %d after %.2f s (deadline 2 s)", was_cut, cut);
    printf("  a connection sending a byte every 0.3 s: cut after %.2f s (request deadline 2 s)\n", cut);

    /* the per-address share: max_connections 8 gives one peer 4 */
    int held[5], n_held = 0, refused_fifth = 0;
    for (int i = 0; i < 5; i++) {
        held[i] = connect_to(htonl(INADDR_LOOPBACK), s->port);
        if (held[i] >= 0) n_held++;
    }
    usleep(200 * 1000);
    int open_after = 0;
    for (int i = 0; i < 5; i++)
        if (held[i] >= 0) {
            if (closed_by_peer(held[i], 0.2, NULL)) refused_fifth++;
            else open_after++;
        }
    CHECK(open_after == 4 && refused_fifth == 1, "5 idle connections from one address: %d kept, %d closed (want 4, 1)",
          open_after, refused_fifth);
    printf("  5 idle connections from one address (max_connections 8): %d kept, %d closed at once\n", open_after,
           refused_fifth);
    for (int i = 0; i < 5; i++)
        if (held[i] >= 0) close(held[i]);
    usleep(200 * 1000);

    /* a huge Content-Length: one 413 answer */
    fd = connect_to(htonl(INADDR_LOOPBACK), s->port);
    const char *big = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      "Content-Length: 99999999999\r\n\r\n{}";
    char answer[4096] = "";
    size_t got = 0;
    if (fd >= 0) {
        (void)!send(fd, big, strlen(big), MSG_NOSIGNAL);
        ssize_t n;
        while (got < sizeof answer - 1 && (n = recv(fd, answer + got, sizeof answer - 1 - got, 0)) > 0) got += (size_t)n;
        answer[got] = '\0';
        close(fd);
    }
    int heads = 0;
    for (const char *at = answer; (at = strstr(at, "HTTP/1.1 ")); at++) heads++;
    CHECK(heads == 1 && strstr(answer, " 413 ") && strstr(answer, "larger than this server's limit"),
          "a huge Content-Length: %d status lines: %s", heads, answer);
    printf("  Content-Length 99999999999: %d status line, 413\n", heads);
    CHECK(http(s, "/health", NULL, NULL, NULL) == 200, "the server is not healthy after the connection tests");
}

/* 4. colt train --vllm_mode server with the right key (the setting), then a wrong one. */
static void check_train(Server *s, const char *reference) {
    char cmd[4096], out[300], err_path[300];
    snprintf(out, sizeof out, "%s/train-right", g_tmp);
    snprintf(err_path, sizeof err_path, "%s/train-right.err", g_tmp);
    const char *base = "--config examples/demo.yaml --per_device_train_batch_size 16 --max_completion_length 16 "
                       "--num_eval_prompts 0 --logging_steps 1 --save_total_limit 0 --save_steps 0 --device cpu "
                       "--max_steps 1 --vllm_mode server --vllm_server_timeout 30";
    snprintf(cmd, sizeof cmd, "env -u COLT_API_KEY timeout -s KILL 300 %s train %s --output_dir %s --vllm_server_port %d "
             "--vllm_group_port %d --vllm_server_api_key %s > /dev/null 2> %s",
             COLT_BINARY, base, out, s->port, free_port(), KEY, err_path);
    int status = system(cmd);
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
    const char *const key_only[] = {"Authorization: Bearer " KEY, NULL};
    double pushes = metric(s, key_only, "colt_weight_updates_total");
    char *err = read_text(g_tmp, "train-right.err");
    CHECK(code == 0 && pushes >= 1, "train with the right key: exit %d, %g pushes: %s", code, pushes, err);
    free(err);
    snprintf(cmd, sizeof cmd, "grep -rl '%s' %s > /dev/null", KEY, out);
    CHECK(system(cmd) != 0, "the API key was written into %s", out);
    printf("  colt train --vllm_server_api_key (right): exit %d, the server counted %g pushes; the key is in no "
           "output file\n", code, pushes);

    snprintf(out, sizeof out, "%s/train-wrong", g_tmp);
    snprintf(err_path, sizeof err_path, "%s/train-wrong.err", g_tmp);
    snprintf(cmd, sizeof cmd, "COLT_API_KEY=not-the-key timeout -s KILL 300 %s train %s --output_dir %s "
             "--vllm_server_port %d --vllm_group_port %d > /dev/null 2> %s",
             COLT_BINARY, base, out, s->port, free_port(), err_path);
    status = system(cmd);
    code = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
    err = read_text(g_tmp, "train-wrong.err");
    double pushes_after = metric(s, key_only, "colt_weight_updates_total");
    CHECK(code != 0 && err && strstr(err, "answered 401") && strstr(err, "wrong API key"),
          "train with a wrong key (COLT_API_KEY): exit %d: %s", code, err);
    CHECK(pushes_after == pushes, "a trainer with a wrong key pushed: %g then %g", pushes, pushes_after);
    const char *line = err ? strstr(err, "answered 401") : NULL;
    printf("  colt train with a wrong COLT_API_KEY: exit %d, pushes %g -> %g: ...%.90s\n", code, pushes, pushes_after,
           line ? line : "(no line)");
    free(err);
    (void)reference;
}

/* 5. SIGTERM while a push is being received and the trainer stopped sending: the server exits anyway. */
static void check_stalled_push(Server *s) {
    int port = free_port();
    char sync[128], *body = NULL, err[ERR_LEN] = "";
    snprintf(sync, sizeof sync, "{\"port\": %d, \"timeout\": 30}", port);
    long st = http(s, "/colt/init_weight_sync", sync, JSON_KEY, &body);
    CHECK(st == 200, "init_weight_sync: %ld %s", st, body);
    free(body);
    Backend *be = backend_open("cpu", 0, err);
    WeightSync *w = NULL;
    int rc = -1;
    if (be) {
        WeightSyncOptions o = {.host = "127.0.0.1", .port = port, .rank = 1, .world_size = 2, .be = be,
                               .timeout_s = 30, .token = KEY};
        rc = weight_sync_open(&w, &o, err);
    }
    CHECK(rc == 0, "a trainer with the right key could not join: %s", err);
    st = http(s, "/colt/update_weights", "{}", JSON_KEY, &body); /* the server waits for a push that never comes */
    CHECK(st == 200, "update_weights: %ld %s", st, body);
    free(body);
    usleep(300 * 1000);
    double seconds = 0;
    int code = server_stop(s, SIGTERM, 20, &seconds);
    char *log = read_text(g_tmp, strrchr(s->log, '/') + 1);
    CHECK(code >= 0 && seconds < 8 && log && strstr(log, "exiting without it"),
          "SIGTERM while a push stalls: exit %d after %.2f s: %s", code, seconds, log ? log : "(no log)");
    printf("  SIGTERM while receiving a push the trainer never sends: exit %d after %.2f s\n", code, seconds);
    free(log);
    weight_sync_close(w);
    if (be) backend_close(be);
}

int main(void) {
    snprintf(g_tmp, sizeof g_tmp, "/tmp/colt_test_serve_security_XXXXXX");
    if (!mkdtemp(g_tmp)) return 1;
    atexit(serve_kill_all);
    signal(SIGPIPE, SIG_IGN);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    double t_start = now_s();

    printf("no key (--request_timeout 2, --max_connections 8)\n");
    Server *open_srv = &g_servers[0];
    char *reference = NULL;
    if (server_start(open_srv, "nokey", "127.0.0.1", "--request_timeout 2 --max_connections 8", NULL)) {
        reference = greedy(open_srv, JSON);
        CHECK(reference && strlen(reference) > 20, "greedy reference: '%s'", reference ? reference : "(none)");
        printf("  greedy: \"%s\"\n", reference ? reference : "(none)");
        check_without_key(open_srv, reference);
    }
    printf("a key (COLT_API_KEY)\n");
    Server *keyed = &g_servers[1];
    if (server_start(keyed, "key", "127.0.0.1", "", KEY)) check_with_key(keyed, reference);

    printf("--host 0.0.0.0 without a key; connections\n");
    Server *wide = &g_servers[2];
    if (server_start(wide, "wide", "0.0.0.0", "--request_timeout 2 --max_connections 8", NULL)) check_connections(wide);

    printf("colt train --vllm_mode server against --api_key\n");
    Server *trained = &g_servers[3];
    if (server_start(trained, "train", "127.0.0.1", "--api_key " KEY, NULL)) {
        check_train(trained, reference);
        printf("a push that stalls\n");
        check_stalled_push(trained);
    }

    for (int i = 0; i < 4; i++)
        if (g_servers[i].pid > 0) {
            int code = server_stop(&g_servers[i], SIGTERM, 30, NULL);
            CHECK(code == 0, "colt serve %s exited %d after SIGTERM", g_servers[i].log, code);
        }
    /* under the sanitizers (build-asan), a report from any colt process fails the test */
    const char *logs[] = {"nokey.log", "key.log", "wide.log", "train.log", "train-right.err", "train-wrong.err"};
    int reports = 0;
    for (int i = 0; i < 6; i++) {
        char *text = read_text(g_tmp, logs[i]);
        bool report = text && (strstr(text, "Sanitizer") || strstr(text, "runtime error:"));
        CHECK(!report, "%s has a sanitizer report:\n%s", logs[i], text);
        reports += report;
        free(text);
    }
    printf("sanitizer reports in the 6 logs of colt processes: %d\n", reports);
    free(reference);
    curl_global_cleanup();
    sh("rm -rf %s", g_tmp);
    printf("test_serve_security: %d checks, %d failures, %.1f s\n", g_checks, g_failures, now_s() - t_start);
    return g_failures ? 1 : 0;
}
