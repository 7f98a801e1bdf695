/* test_dist_store.c — the TCP store on 127.0.0.1 with a free port: two forked
 * ranks set / get (text, binary, 1 MiB), add, check and meet at barriers; a get
 * and a barrier that time out with the right message; a port already in use;
 * an address nobody listens on; a listener that does not speak the protocol;
 * a serving rank that dies while another waits; the server's wire format
 * byte by byte as PyTorch's c10d client writes it; the world-of-one store;
 * a store with a token (its members get in, a client without it or with
 * another is dropped in one line), bound to 127.0.0.1 alone, and a wait ended
 * at once by the cancel flag.
 * --torch-peer and --serve are the colt halves of tests/dist_torch_store.sh,
 * which g_checks the same against PyTorch's own TCPStore where torch is installed. */
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/error.h"
#include "dist/store.h"
#include "dist/store_server.h"
#include "harness.h"

static char self[64];

/* A port nobody listens on right now (the kernel's pick for port 0). */
static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    bind(fd, (struct sockaddr *)&a, sizeof a);
    socklen_t sl = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &sl);
    close(fd);
    return ntohs(a.sin_port);
}

/* A socket listening on 127.0.0.1 at a free port that never accepts. */
static int listen_silent(int *port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    bind(fd, (struct sockaddr *)&a, sizeof a);
    listen(fd, 8);
    socklen_t sl = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &sl);
    *port = ntohs(a.sin_port);
    return fd;
}

static StoreOptions opts(int rank, int world, int port, double timeout) {
    return (StoreOptions){.host = "127.0.0.1", .port = port, .serve = rank == 0, .rank = rank, .world_size = world,
                          .timeout_s = timeout, .key_prefix = "test/"};
}

/* Waits for forked ranks; a rank that has not exited by the deadline is killed
 * and counted as a failure. */
static void wait_ranks(const pid_t *pids, int n, double timeout_s, const char *what) {
    double deadline = now_s() + timeout_s;
    for (int i = 0; i < n; i++) {
        int status = 0;
        for (;;) {
            pid_t r = waitpid(pids[i], &status, WNOHANG);
            if (r == pids[i]) break;
            if (now_s() > deadline) {
                kill(pids[i], SIGKILL);
                waitpid(pids[i], &status, 0);
                CHECK(0, "%s: rank %d still running after %g s", what, i, timeout_s);
                break;
            }
            usleep(10000);
        }
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s: rank %d exited with status %d", what, i,
              WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status));
    }
}

/* ---------------------------------------------------------------- two ranks */

static void rank_main(int rank, int port) {
    char err[ERR_LEN] = "", want[ERR_LEN];
    Store *s = NULL;
    StoreOptions o = opts(rank, 2, port, 10.0);
    if (store_open(&s, &o, err) != COLT_OK) {
        fprintf(stderr, "rank %d: %s\n", rank, err);
        _exit(1);
    }
    static unsigned char big[1 << 20];
    for (size_t i = 0; i < sizeof big; i++) big[i] = (unsigned char)(i * 7 + 3);
    const unsigned char binary[5] = {0, 1, 0, 255, 0};
    if (rank == 0) {
        CHECK(store_set(s, "greeting", "hello from 0", 12, err) == COLT_OK, "set: %s", err);
    } else {
        CHECK(store_set(s, "binary", binary, sizeof binary, err) == COLT_OK, "set: %s", err);
        CHECK(store_set(s, "big", big, sizeof big, err) == COLT_OK, "set big: %s", err);
    }
    void *v = NULL;
    size_t n = 0;
    if (rank == 1) {
        CHECK(store_get(s, &v, &n, "greeting", err) == COLT_OK, "get: %s", err);
        CHECK(v && n == 12 && !memcmp(v, "hello from 0", 12), "greeting: got %zu bytes", n);
        free(v);
    } else {
        CHECK(store_get(s, &v, &n, "binary", err) == COLT_OK, "get: %s", err);
        CHECK(v && n == 5 && !memcmp(v, binary, 5), "binary: got %zu bytes", n);
        free(v);
        CHECK(store_get(s, &v, &n, "big", err) == COLT_OK, "get big: %s", err);
        CHECK(v && n == sizeof big && !memcmp(v, big, n), "big: got %zu bytes, want %zu", n, sizeof big);
        free(v);
    }
    int64_t total = 0;
    CHECK(store_add(s, &total, "counter", rank + 1, err) == COLT_OK, "add: %s", err);
    CHECK(store_barrier(s, "after-add", err) == COLT_OK, "barrier: %s", err);
    CHECK(store_add(s, &total, "counter", 0, err) == COLT_OK && total == 3, "counter %lld, want 3 (%s)", (long long)total, err);
    CHECK(store_barrier(s, "after-add", err) == COLT_OK, "second barrier of the same name: %s", err);
    bool present = false;
    CHECK(store_check(s, &present, "greeting", err) == COLT_OK && present, "check greeting: %d %s", present, err);
    CHECK(store_check(s, &present, "never-set", err) == COLT_OK && !present, "check never-set: %d %s", present, err);

    if (rank == 1) {
        /* A second connection with a 1 s bound: a key nobody sets, a barrier nobody joins. */
        Store *quick = NULL;
        StoreOptions q = opts(1, 2, port, 1.0);
        CHECK(store_open(&quick, &q, err) == COLT_OK, "open quick: %s", err);
        if (quick) {
            double t0 = now_s();
            CHECK(store_get(quick, &v, &n, "never", err) == COLT_ERR, "get of a missing key succeeded");
            double took = now_s() - t0;
            snprintf(want, sizeof want, "rank 1 on host %s: no rank set key 'never' in the store at 127.0.0.1:%d within 1 s "
                     "(a rank died or hung?)", self, port);
            CHECK(!strcmp(err, want), "get timeout\n  got  \"%s\"\n  want \"%s\"", err, want);
            CHECK(took >= 0.9 && took < 10.0, "get timed out after %.2f s, want about 1 s", took);
            CHECK(store_barrier(quick, "lonely", err) == COLT_ERR, "a barrier of one of two ranks succeeded");
            snprintf(want, sizeof want, "rank 1 on host %s: barrier 'lonely' did not complete within 1 s: 1 of 2 ranks "
                     "arrived (a rank died or hung?)", self);
            CHECK(!strcmp(err, want), "barrier timeout\n  got  \"%s\"\n  want \"%s\"", err, want);
            /* The connection is still usable after a cancelled wait. */
            CHECK(store_check(quick, &present, "greeting", err) == COLT_OK && present, "check after timeout: %s", err);
            store_close(quick);
        }
    }
    CHECK(store_barrier(s, "end", err) == COLT_OK, "end barrier: %s", err);
    store_close(s);
    exit(g_failures ? 1 : 0); /* exit, not _exit: an ASan build g_checks this rank for leaks */
}

static void test_two_ranks(void) {
    int port = free_port();
    pid_t pids[2];
    for (int r = 0; r < 2; r++) {
        pids[r] = fork();
        if (pids[r] == 0) rank_main(r, port);
    }
    wait_ranks(pids, 2, 30.0, "two ranks");
}

/* ---------------------------------------------------------------- g_failures */

static void test_port_in_use(void) {
    int port = 0, fd = listen_silent(&port);
    char err[ERR_LEN] = "", want[ERR_LEN];
    Store *s = NULL;
    StoreOptions o = opts(0, 2, port, 2.0);
    CHECK(store_open(&s, &o, err) == COLT_ERR, "serving on a port in use succeeded");
    snprintf(want, sizeof want, "rank 0: cannot host the store on port %d: it is in use (another job or a leftover "
             "process?); choose a free MASTER_PORT", port);
    CHECK(!strcmp(err, want), "port in use\n  got  \"%s\"\n  want \"%s\"", err, want);
    close(fd);
}

static void test_unreachable(void) {
    int port = free_port();
    char err[ERR_LEN] = "", want[ERR_LEN];
    Store *s = NULL;
    StoreOptions o = opts(1, 2, port, 1.0);
    double t0 = now_s();
    CHECK(store_open(&s, &o, err) == COLT_ERR, "connecting to a closed port succeeded");
    double took = now_s() - t0;
    snprintf(want, sizeof want, "rank 1: cannot reach MASTER_ADDR=127.0.0.1:%d within 1 s (last attempt: Connection refused)", port);
    CHECK(!strcmp(err, want), "unreachable\n  got  \"%s\"\n  want \"%s\"", err, want);
    CHECK(took >= 0.5 && took < 10.0, "gave up after %.2f s, want about 1 s (retries until the deadline)", took);
}

static void test_not_a_store(void) {
    int port = 0, fd = listen_silent(&port);
    char err[ERR_LEN] = "", want[ERR_LEN];
    Store *s = NULL;
    StoreOptions o = opts(1, 2, port, 1.0);
    CHECK(store_open(&s, &o, err) == COLT_ERR, "a silent listener passed as a store");
    snprintf(want, sizeof want, "rank 1 on host %s: 127.0.0.1:%d accepted a connection but did not answer as a c10d "
             "TCPStore (an older PyTorch speaks another protocol; set COLT_STORE_PORT to a free port to use colt's own store)",
             self, port);
    CHECK(!strcmp(err, want), "silent listener\n  got  \"%s\"\n  want \"%s\"", err, want);
    close(fd);
}

static void test_server_dies(void) {
    int port = free_port();
    pid_t server = fork();
    if (server == 0) {
        char err[ERR_LEN];
        Store *s = NULL;
        StoreOptions o = opts(0, 2, port, 10.0);
        if (store_open(&s, &o, err) != COLT_OK) _exit(1);
        usleep(500000);
        _exit(0); /* dies holding the store, without closing it */
    }
    char err[ERR_LEN] = "", want[ERR_LEN];
    Store *s = NULL;
    StoreOptions o = opts(1, 2, port, 10.0);
    CHECK(store_open(&s, &o, err) == COLT_OK, "open: %s", err);
    if (s) {
        void *v;
        size_t n;
        double t0 = now_s();
        CHECK(store_get(s, &v, &n, "x", err) == COLT_ERR, "get from a dead store succeeded");
        double took = now_s() - t0;
        snprintf(want, sizeof want, "rank 1 on host %s: lost the connection to the store at 127.0.0.1:%d while waiting for a "
                 "key (closed by the other end; did the rank serving it exit?)", self, port);
        CHECK(!strcmp(err, want), "server died\n  got  \"%s\"\n  want \"%s\"", err, want);
        CHECK(took < 8.0, "noticed the dead server after %.2f s, want well under the 10 s timeout", took);
        CHECK(store_set(s, "y", "1", 1, err) == COLT_ERR && strstr(err, "unusable"), "a broken store refuses: %s", err);
        store_close(s);
    }
    int status;
    waitpid(server, &status, 0);
}

/* ---------------------------------------------------------------- wire format */

static void put(int fd, const void *p, size_t n) { CHECK(send(fd, p, n, 0) == (ssize_t)n, "raw send"); }
static void put_u8(int fd, uint8_t v) { put(fd, &v, 1); }
static void put_u64(int fd, uint64_t v) { put(fd, &v, 8); }
static void put_str(int fd, const char *s) {
    put_u64(fd, strlen(s));
    put(fd, s, strlen(s));
}
static void get_exact(int fd, void *p, size_t n) {
    size_t got = 0;
    while (got < n) {
        ssize_t k = recv(fd, (char *)p + got, n - got, 0);
        if (k <= 0) break;
        got += (size_t)k;
    }
    CHECK(got == n, "raw recv: %zu of %zu bytes", got, n);
}

/* The bytes PyTorch's TCPStore client sends (TCPStore.cpp: SendBuffer), with
 * the replies its server sends, against colt's server. */
static void test_wire_format(void) {
    StoreServer *srv = NULL;
    char err[ERR_LEN];
    CHECK(store_server_start(&srv, NULL, 0, NULL, err) == COLT_OK, "server: %s", err);
    if (!srv) return;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)store_server_port(srv)),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    CHECK(connect(fd, (struct sockaddr *)&a, sizeof a) == 0, "connect to the server");
    struct timeval tv = {5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    uint32_t magic = 0x3C85F7CE;
    put_u8(fd, 0); /* VALIDATE */
    put(fd, &magic, 4);
    put_u8(fd, 1); /* SET k = "v1" */
    put_str(fd, "k");
    put_str(fd, "v1");
    put_u8(fd, 3); /* GET k */
    put_str(fd, "k");
    uint64_t len = 0;
    char value[8] = "";
    get_exact(fd, &len, 8);
    get_exact(fd, value, len < 8 ? len : 8);
    CHECK(len == 2 && !memcmp(value, "v1", 2), "GET: %llu bytes '%.2s'", (unsigned long long)len, value);
    int64_t delta = 5, sum = 0;
    put_u8(fd, 4); /* ADD n 5, twice */
    put_str(fd, "n");
    put(fd, &delta, 8);
    get_exact(fd, &sum, 8);
    put_u8(fd, 4);
    put_str(fd, "n");
    put(fd, &delta, 8);
    get_exact(fd, &sum, 8);
    CHECK(sum == 10, "ADD: %lld, want 10", (long long)sum);
    put_u8(fd, 3); /* ADD stores decimal text, as c10d does */
    put_str(fd, "n");
    get_exact(fd, &len, 8);
    get_exact(fd, value, len < 8 ? len : 8);
    CHECK(len == 2 && !memcmp(value, "10", 2), "ADD value as text: '%.*s'", (int)(len < 8 ? len : 8), value);
    uint8_t r = 9;
    put_u8(fd, 5); /* CHECK [k, missing] -> NOT_READY */
    put_u64(fd, 2);
    put_str(fd, "k");
    put_str(fd, "missing");
    get_exact(fd, &r, 1);
    CHECK(r == 1, "CHECK: %d, want NOT_READY (1)", r);
    put_u8(fd, 6); /* WAIT [k] -> STOP_WAITING at once */
    put_u64(fd, 1);
    put_str(fd, "k");
    get_exact(fd, &r, 1);
    CHECK(r == 0, "WAIT on a present key: %d, want STOP_WAITING (0)", r);
    put_u8(fd, 6); /* WAIT [missing], then CANCEL_WAIT -> WAIT_CANCELED */
    put_u64(fd, 1);
    put_str(fd, "missing");
    put_u8(fd, 12);
    get_exact(fd, &r, 1);
    CHECK(r == 1, "CANCEL_WAIT: %d, want WAIT_CANCELED (1)", r);
    uint32_t nonce = 0xdeadbeef, echo = 0;
    put_u8(fd, 13); /* PING */
    put(fd, &nonce, 4);
    get_exact(fd, &echo, 4);
    CHECK(echo == nonce, "PING echo %x", echo);
    int64_t count = -1;
    put_u8(fd, 7); /* GETNUMKEYS: k, n */
    get_exact(fd, &count, 8);
    CHECK(count == 2, "GETNUMKEYS: %lld, want 2", (long long)count);
    put_u8(fd, 8); /* DELETE_KEY k */
    put_str(fd, "k");
    get_exact(fd, &count, 8);
    CHECK(count == 1, "DELETE_KEY: %lld, want 1", (long long)count);
    close(fd);

    /* A client whose first query is not VALIDATE is dropped. */
    fd = socket(AF_INET, SOCK_STREAM, 0);
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    CHECK(connect(fd, (struct sockaddr *)&a, sizeof a) == 0, "connect");
    put_u8(fd, 7);
    CHECK(recv(fd, &count, 8, 0) == 0, "an unvalidated client was answered");
    close(fd);
    store_server_stop(srv);
}

static void test_world_of_one(void) {
    LaunchEnv env = {.launcher = LAUNCHER_NONE, .world_size = 1, .local_world_size = 1};
    Store *s = NULL;
    char err[ERR_LEN] = "";
    CHECK(store_open_for_launch(&s, &env, 5.0, err) == COLT_OK, "world of one: %s", err);
    if (!s) return;
    void *v;
    size_t n;
    CHECK(store_set(s, "id", "abc", 3, err) == COLT_OK && store_get(s, &v, &n, "id", err) == COLT_OK && n == 3,
          "world of one set/get: %s", err);
    if (n == 3) free(v);
    CHECK(store_barrier(s, "b", err) == COLT_OK, "world of one barrier: %s", err);
    store_close(s);
    env = (LaunchEnv){.launcher = LAUNCHER_TORCHRUN, .world_size = 2, .local_world_size = 2};
    CHECK(store_open_for_launch(&s, &env, 5.0, err) == COLT_ERR &&
          !strcmp(err, "rank 0: no rendezvous address for the store: set MASTER_ADDR and MASTER_PORT"), "no address: %s", err);
}

/* ---------------------------------------------------------------- against PyTorch */

/* tests/dist_torch_store.sh: colt as rank 1 against a torch TCPStore server,
 * keys under /colt/x/0/ (what torchrun's agent store would hold). Torch sets
 * from_torch = "hello" and count = 10, reads from_colt, and joins barrier "b". */
static int torch_peer(int port) {
    char err[ERR_LEN] = "", want[ERR_LEN];
    Store *s = NULL, *quick = NULL;
    StoreOptions o = {.host = "127.0.0.1", .port = port, .rank = 1, .world_size = 2, .timeout_s = 20, .key_prefix = "/colt/x/0/"};
    CHECK(store_open(&s, &o, err) == COLT_OK, "open torch's store: %s", err);
    if (!s) return 1;
    void *v = NULL;
    size_t n = 0;
    CHECK(store_get(s, &v, &n, "from_torch", err) == COLT_OK && n == 5 && !memcmp(v, "hello", 5), "get from_torch: %s", err);
    free(v);
    CHECK(store_set(s, "from_colt", "hi", 2, err) == COLT_OK, "set: %s", err);
    int64_t x = 0;
    CHECK(store_add(s, &x, "count", 5, err) == COLT_OK && x == 15, "add to torch's count 10: %lld (%s)", (long long)x, err);
    bool present = false;
    CHECK(store_check(s, &present, "from_torch", err) == COLT_OK && present, "check: %s", err);
    o.timeout_s = 1;
    CHECK(store_open(&quick, &o, err) == COLT_OK, "second connection: %s", err);
    if (quick) {
        CHECK(store_get(quick, &v, &n, "never", err) == COLT_ERR, "get of a missing key succeeded");
        snprintf(want, sizeof want, "rank 1 on host %s: no rank set key 'never' in the store at 127.0.0.1:%d within 1 s "
                 "(a rank died or hung?)", self, port);
        CHECK(!strcmp(err, want), "timeout against torch's server\n  got  \"%s\"\n  want \"%s\"", err, want);
        CHECK(store_check(quick, &present, "from_torch", err) == COLT_OK && present, "torch's server after CANCEL_WAIT: %s", err);
        store_close(quick);
    }
    CHECK(store_barrier(s, "b", err) == COLT_OK, "barrier with torch: %s", err);
    store_close(s);
    printf("torch-peer: %d checks, %d failures\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}

/* tests/dist_torch_store.sh: colt's server on port, with a torch client as the
 * other rank: it sets from_torch = "yo", reads from_colt, and sets done. */
static int serve_for_torch(int port) {
    char err[ERR_LEN] = "";
    Store *s = NULL;
    StoreOptions o = {.host = "127.0.0.1", .port = port, .serve = true, .rank = 0, .world_size = 2, .timeout_s = 30, .key_prefix = "/"};
    CHECK(store_open(&s, &o, err) == COLT_OK, "serve: %s", err);
    if (!s) return 1;
    printf("serving on %d\n", port);
    fflush(stdout);
    void *v = NULL;
    size_t n = 0;
    CHECK(store_get(s, &v, &n, "from_torch", err) == COLT_OK && n == 2 && !memcmp(v, "yo", 2), "get from_torch: %s", err);
    free(v);
    CHECK(store_set(s, "from_colt", "hey", 3, err) == COLT_OK, "set: %s", err);
    CHECK(store_get(s, &v, &n, "done", err) == COLT_OK, "get done: %s", err);
    free(v);
    store_close(s);
    printf("serve-for-torch: %d checks, %d failures\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}

/* The weight channel's store: a token, loopback only, a cancellable wait. */
static void test_token_bind_cancel(void) {
    int port = free_port();
    char err[ERR_LEN] = "";
    Store *server = NULL, *member = NULL, *stranger = NULL, *wrong = NULL;
    StoreOptions o = opts(0, 2, port, 5.0);
    o.token = "s3cret";
    CHECK(store_open(&server, &o, err) == COLT_OK, "a store with a token: %s", err);
    StoreOptions m = opts(1, 2, port, 5.0);
    m.token = "s3cret";
    CHECK(store_open(&member, &m, err) == COLT_OK, "a member with the token: %s", err);
    void *v = NULL;
    size_t n = 0;
    if (server && member) {
        CHECK(store_set(server, "k", "v1", 2, err) == COLT_OK && store_get(member, &v, &n, "k", err) == COLT_OK &&
                  n == 2 && !memcmp(v, "v1", 2),
              "a member reads a key: %s", err);
        free(v);
    }
    m.token = NULL;
    CHECK(store_open(&stranger, &m, err) == COLT_ERR && strstr(err, "lost the connection"),
          "a client without the token: %s", err);
    m.token = "guess";
    CHECK(store_open(&wrong, &m, err) == COLT_ERR && strstr(err, "it wants another key"),
          "a client with another token: %s", err);
    printf("  token: a member gets in; without it: \"%s\"\n", err);
    /* bound to 127.0.0.1 alone: this machine's other addresses find nothing there */
    struct ifaddrs *list = NULL;
    int outside_tried = 0, outside_refused = 0;
    if (getifaddrs(&list) == 0) {
        for (struct ifaddrs *i = list; i; i = i->ifa_next) {
            if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
            struct sockaddr_in a = *(struct sockaddr_in *)i->ifa_addr;
            if ((ntohl(a.sin_addr.s_addr) >> 24) == 127) continue;
            a.sin_port = htons((uint16_t)port);
            int fd = socket(AF_INET, SOCK_STREAM, 0);
            outside_tried++;
            outside_refused += connect(fd, (struct sockaddr *)&a, sizeof a) != 0;
            close(fd);
        }
        freeifaddrs(list);
    }
    CHECK(outside_refused == outside_tried, "the 127.0.0.1 store answered on %d of %d other addresses",
          outside_tried - outside_refused, outside_tried);
    printf("  bound to 127.0.0.1: %d other address(es) of this machine refused\n", outside_tried);
    /* the cancel flag ends a wait at once (a 30 s timeout otherwise) */
    atomic_bool cancel;
    atomic_init(&cancel, false);
    Store *waiter = NULL;
    StoreOptions w = opts(1, 2, port, 30.0);
    w.token = "s3cret";
    w.cancel = &cancel;
    CHECK(store_open(&waiter, &w, err) == COLT_OK, "a cancellable member: %s", err);
    if (waiter) {
        atomic_store(&cancel, true);
        double t0 = now_s();
        int rc = store_get(waiter, &v, &n, "never", err);
        double took = now_s() - t0;
        CHECK(rc == COLT_ERR && took < 1.0, "a cancelled wait: rc %d after %.2f s: %s", rc, took, err);
        printf("  a cancelled wait ended after %.3f s\n", took);
        store_close(waiter);
    }
    store_close(member);
    store_close(server);
    fflush(stdout); /* the ranks forked next must not print it again */
}

int main(int argc, char **argv) {
    gethostname(self, sizeof self);
    self[sizeof self - 1] = '\0';
    signal(SIGPIPE, SIG_IGN);
    if (argc == 3 && !strcmp(argv[1], "--torch-peer")) return torch_peer(atoi(argv[2]));
    if (argc == 3 && !strcmp(argv[1], "--serve")) return serve_for_torch(atoi(argv[2]));
    if (argc != 1) {
        fprintf(stderr, "usage: %s [--torch-peer PORT | --serve PORT]\n", argv[0]);
        return 2;
    }
    gethostname(self, sizeof self);
    self[sizeof self - 1] = '\0';
    signal(SIGPIPE, SIG_IGN);
    double t0 = now_s();
    test_wire_format();
    test_world_of_one();
    test_port_in_use();
    test_unreachable();
    test_not_a_store();
    test_server_dies();
    test_token_bind_cancel();
    test_two_ranks();
    printf("test_dist_store: %d checks in this process, %d failures (%.1f s)\n", g_checks, g_failures, now_s() - t0);
    return g_failures ? 1 : 0;
}
