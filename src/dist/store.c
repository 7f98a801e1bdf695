/* store.c — the store client (c10d TCPStore wire subset, see store.h) with a
 * deadline on every wait, and the choice of which store a launch uses. The
 * server half is store_server.c. Not thread-safe: one thread per Store. */
#include "dist/store.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "core/error.h"
#include "dist/store_server.h"

#define STORE_TIMED_OUT (-2) /* internal: a wait hit its deadline */
/* What answers on the port must answer the first query within this, or it is
 * not a c10d store of the protocol colt speaks (an older PyTorch's). */
#define PROBE_TIMEOUT_S 30.0

struct Store {
    int fd;
    int rank, world_size;
    double timeout_s;
    char host[LAUNCH_HOST_LEN]; /* the store's */
    int port;
    char self[64];              /* this machine's name, for messages */
    char *prefix;
    unsigned long long barriers; /* barrier generation: every call is a new barrier */
    bool broken;                 /* a wait was cut off mid-reply: the stream is out of step */
    StoreServer *server;
    const atomic_bool *cancel;   /* NULL: never */
};

static bool cancelled(const Store *s) { return s->cancel && atomic_load(s->cancel); }

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

/* errorf with "rank R on host H: " in front. */
static int store_fail(const Store *s, char *err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int store_fail(const Store *s, char *err, const char *fmt, ...) {
    char msg[ERR_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return errorf(err, "rank %d on host %s: %s", s->rank, s->self, msg);
}

/* ------------------------------------------------------------------ socket I/O */

/* Polls fd for events until deadline: 1 ready, 0 timed out, -1 error (errno
 * ECANCELED: s's cancel flag was set; it is looked at every 0.1 s). */
static int wait_fd(const Store *s, int fd, short events, double deadline) {
    for (;;) {
        if (cancelled(s)) {
            errno = ECANCELED;
            return -1;
        }
        double left = deadline - now_s();
        if (left <= 0) return 0;
        struct pollfd p = {fd, events, 0};
        int ms = left > 0.1 ? 100 : (int)(left * 1000) + 1;
        int rc = poll(&p, 1, ms);
        if (rc < 0 && errno == EINTR) continue;
        if (rc < 0) return -1;
        if (rc > 0) return 1;
    }
}

static int lost(const Store *s, char *err, const char *doing, const char *why) {
    return store_fail(s, err, "lost the connection to the store at %s:%d while %s (%s; did the rank serving it exit?)",
                      s->host, s->port, doing, why);
}

static int send_by(Store *s, const void *buf, size_t n, double deadline, const char *doing, char *err) {
    const char *p = buf;
    while (n) {
        ssize_t k = send(s->fd, p, n, MSG_NOSIGNAL);
        if (k > 0) {
            p += k;
            n -= (size_t)k;
            continue;
        }
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int rc = wait_fd(s, s->fd, POLLOUT, deadline);
            if (rc > 0) continue;
            if (rc == 0) {
                s->broken = true;
                return store_fail(s, err, "the store at %s:%d did not take a request within %g s while %s", s->host,
                                  s->port, s->timeout_s, doing);
            }
        }
        s->broken = true;
        return lost(s, err, doing, strerror(errno));
    }
    return COLT_OK;
}

/* Receives exactly n bytes: COLT_OK, STORE_TIMED_OUT (err untouched), or COLT_ERR. */
static int recv_by(Store *s, void *buf, size_t n, double deadline, const char *doing, char *err) {
    char *p = buf;
    while (n) {
        ssize_t k = recv(s->fd, p, n, 0);
        if (k > 0) {
            p += k;
            n -= (size_t)k;
            continue;
        }
        if (k == 0) {
            s->broken = true;
            return lost(s, err, doing, "closed by the other end");
        }
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            int rc = wait_fd(s, s->fd, POLLIN, deadline);
            if (rc > 0) continue;
            if (rc == 0) return STORE_TIMED_OUT;
        }
        s->broken = true;
        return lost(s, err, doing, strerror(errno));
    }
    return COLT_OK;
}

/* A request under construction. */
typedef struct {
    char *p;
    size_t n, cap;
} Buf;

static void buf_put(Buf *b, const void *data, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = 2 * (b->n + n) + 64;
        b->p = xrealloc(b->p, b->cap);
    }
    if (n) memcpy(b->p + b->n, data, n);
    b->n += n;
}

static void buf_u8(Buf *b, uint8_t v) { buf_put(b, &v, 1); }
static void buf_u64(Buf *b, uint64_t v) { buf_put(b, &v, sizeof v); }

static int buf_key(Buf *b, const Store *s, const char *key, char *err) {
    size_t np = strlen(s->prefix), nk = strlen(key);
    if (np + nk > STORE_MAX_KEY) return store_fail(s, err, "store key '%.64s...' is longer than %d bytes", key, STORE_MAX_KEY);
    buf_u64(b, np + nk);
    buf_put(b, s->prefix, np);
    buf_put(b, key, nk);
    return COLT_OK;
}

static int usable(const Store *s, char *err) {
    if (s->broken) return store_fail(s, err, "the store connection is unusable after an earlier error");
    return COLT_OK;
}

/* ------------------------------------------------------------------ queries */

/* Sends WAIT for keys and waits until deadline for the answer. On a timeout it
 * cancels the wait (as c10d's client does) and returns STORE_TIMED_OUT. */
static int wait_keys(Store *s, const char *const *keys, int n, double deadline, char *err) {
    Buf b = {0};
    buf_u8(&b, STORE_Q_WAIT);
    buf_u64(&b, (uint64_t)n);
    int rc = COLT_OK;
    for (int i = 0; i < n && rc == COLT_OK; i++) rc = buf_key(&b, s, keys[i], err);
    if (rc == COLT_OK) rc = send_by(s, b.p, b.n, deadline, "waiting for a key", err);
    free(b.p);
    if (rc != COLT_OK) return rc;
    uint8_t reply;
    rc = recv_by(s, &reply, 1, deadline, "waiting for a key", err);
    if (rc == COLT_OK) return reply == STORE_WAIT_STOP_WAITING ? COLT_OK : lost(s, err, "waiting for a key", "unexpected reply");
    if (rc != STORE_TIMED_OUT) return rc;
    /* Cancel; the answer may be STOP_WAITING first if the key came just now. */
    uint8_t cancel = STORE_Q_CANCEL_WAIT;
    double cancel_deadline = now_s() + 10.0;
    if (send_by(s, &cancel, 1, cancel_deadline, "cancelling a wait", err) != COLT_OK) return COLT_ERR;
    for (int i = 0; i < 2; i++) {
        rc = recv_by(s, &reply, 1, cancel_deadline, "cancelling a wait", err);
        if (rc != COLT_OK) {
            s->broken = true;
            return rc == STORE_TIMED_OUT ? STORE_TIMED_OUT : COLT_ERR;
        }
        if (reply == STORE_WAIT_CANCELED) return STORE_TIMED_OUT;
    }
    s->broken = true;
    return STORE_TIMED_OUT;
}

int store_set(Store *s, const char *key, const void *data, size_t len, char *err) {
    if (usable(s, err) != COLT_OK) return COLT_ERR;
    if (len > STORE_MAX_VALUE) return store_fail(s, err, "store value for '%s' has %zu bytes, more than %u", key, len, STORE_MAX_VALUE);
    Buf b = {0};
    buf_u8(&b, STORE_Q_SET);
    int rc = buf_key(&b, s, key, err);
    if (rc == COLT_OK) {
        buf_u64(&b, len);
        buf_put(&b, data, len);
        rc = send_by(s, b.p, b.n, now_s() + s->timeout_s, "setting a key", err);
    }
    free(b.p);
    return rc;
}

int store_get(Store *s, void **data, size_t *len, const char *key, char *err) {
    if (usable(s, err) != COLT_OK) return COLT_ERR;
    double deadline = now_s() + s->timeout_s;
    int rc = wait_keys(s, &key, 1, deadline, err);
    if (rc == STORE_TIMED_OUT)
        return store_fail(s, err, "no rank set key '%s' in the store at %s:%d within %g s (a rank died or hung?)", key,
                          s->host, s->port, s->timeout_s);
    if (rc != COLT_OK) return rc;
    Buf b = {0};
    buf_u8(&b, STORE_Q_GET);
    rc = buf_key(&b, s, key, err);
    if (rc == COLT_OK) rc = send_by(s, b.p, b.n, deadline, "reading a key", err);
    free(b.p);
    if (rc != COLT_OK) return rc;
    uint64_t n;
    double reply_deadline = now_s() + 60.0; /* the key exists: the answer is on its way */
    if ((rc = recv_by(s, &n, sizeof n, reply_deadline, "reading a key", err)) != COLT_OK) goto reply_failed;
    if (n > STORE_MAX_VALUE) {
        s->broken = true;
        return lost(s, err, "reading a key", "value longer than the limit");
    }
    char *value = xmalloc((size_t)n + 1);
    if ((rc = recv_by(s, value, (size_t)n, reply_deadline, "reading a key", err)) != COLT_OK) {
        free(value);
        goto reply_failed;
    }
    value[n] = '\0';
    *data = value;
    *len = (size_t)n;
    return COLT_OK;
reply_failed:
    s->broken = true;
    if (rc == STORE_TIMED_OUT) return store_fail(s, err, "the store at %s:%d stopped answering while reading key '%s'", s->host, s->port, key);
    return rc;
}

/* One query whose answer is a fixed-size value. */
static int query_fixed(Store *s, void *reply, size_t reply_len, const Buf *b, double deadline, const char *doing, char *err) {
    int rc = send_by(s, b->p, b->n, deadline, doing, err);
    if (rc != COLT_OK) return rc;
    rc = recv_by(s, reply, reply_len, deadline, doing, err);
    if (rc == STORE_TIMED_OUT) {
        s->broken = true;
        return store_fail(s, err, "the store at %s:%d did not answer within %g s while %s (is it a c10d TCPStore?)",
                          s->host, s->port, s->timeout_s, doing);
    }
    return rc;
}

int store_check(Store *s, bool *present, const char *key, char *err) {
    if (usable(s, err) != COLT_OK) return COLT_ERR;
    Buf b = {0};
    buf_u8(&b, STORE_Q_CHECK);
    buf_u64(&b, 1);
    int rc = buf_key(&b, s, key, err);
    uint8_t reply = 0;
    if (rc == COLT_OK) rc = query_fixed(s, &reply, 1, &b, now_s() + s->timeout_s, "checking a key", err);
    free(b.p);
    if (rc == COLT_OK) *present = reply == STORE_CHECK_READY;
    return rc;
}

int store_add(Store *s, int64_t *value, const char *key, int64_t delta, char *err) {
    if (usable(s, err) != COLT_OK) return COLT_ERR;
    Buf b = {0};
    buf_u8(&b, STORE_Q_ADD);
    int rc = buf_key(&b, s, key, err);
    buf_put(&b, &delta, sizeof delta);
    if (rc == COLT_OK) rc = query_fixed(s, value, sizeof *value, &b, now_s() + s->timeout_s, "adding to a key", err);
    free(b.p);
    return rc;
}

int store_barrier(Store *s, const char *name, char *err) {
    if (usable(s, err) != COLT_OK) return COLT_ERR;
    double deadline = now_s() + s->timeout_s;
    char key[256], done[272];
    snprintf(key, sizeof key, "barrier/%.200s/%llu", name, ++s->barriers);
    snprintf(done, sizeof done, "%s/done", key);
    int64_t arrived = 0;
    if (store_add(s, &arrived, key, 1, err) != COLT_OK) return COLT_ERR;
    if (arrived == s->world_size && store_set(s, done, "1", 1, err) != COLT_OK) return COLT_ERR;
    const char *keys[1] = {done};
    int rc = wait_keys(s, keys, 1, deadline, err);
    if (rc != STORE_TIMED_OUT) return rc;
    if (!s->broken) store_add(s, &arrived, key, 0, err);
    return store_fail(s, err, "barrier '%s' did not complete within %g s: %lld of %d ranks arrived (a rank died or hung?)",
                      name, s->timeout_s, (long long)arrived, s->world_size);
}

int store_port(const Store *s) { return s->port; }

/* ------------------------------------------------------------------ open / close */

bool store_host_is_loopback(const char *host) {
    struct in_addr a4;
    struct in6_addr a6;
    if (strcmp(host, "localhost") == 0) return true;
    if (inet_pton(AF_INET, host, &a4) == 1) return (ntohl(a4.s_addr) >> 24) == 127;
    return inet_pton(AF_INET6, host, &a6) == 1 && IN6_IS_ADDR_LOOPBACK(&a6);
}

/* Connects to host:port, retrying (the serving rank may not listen yet) until
 * deadline. The socket is left non-blocking. */
static int connect_by(Store *s, double deadline, char *err) {
    char last[160] = "no attempt finished", port[8];
    snprintf(port, sizeof port, "%d", s->port);
    double pause = 0.05;
    for (;;) {
        struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
        int gai = getaddrinfo(s->host, port, &hints, &res);
        if (gai) snprintf(last, sizeof last, "cannot resolve the name: %s", gai_strerror(gai));
        for (struct addrinfo *ai = gai ? NULL : res; ai; ai = ai->ai_next) {
            int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
            if (fd < 0) {
                snprintf(last, sizeof last, "%s", strerror(errno));
                continue;
            }
            int e = 0;
            if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
                e = errno;
                if (e == EINPROGRESS) {
                    double attempt = now_s() + 5.0;
                    int rc = wait_fd(s, fd, POLLOUT, attempt < deadline ? attempt : deadline);
                    socklen_t sl = sizeof e;
                    if (rc > 0) getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &sl);
                    else e = rc == 0 ? ETIMEDOUT : errno;
                }
            }
            if (e == 0) {
                int one = 1;
                setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                s->fd = fd;
                freeaddrinfo(res);
                return COLT_OK;
            }
            snprintf(last, sizeof last, "%s", strerror(e));
            close(fd);
        }
        if (res) freeaddrinfo(res);
        if (now_s() + pause > deadline || cancelled(s)) break;
        sleep_s(pause);
        pause = pause * 2 > 1.0 ? 1.0 : pause * 2;
    }
    return errorf(err, "rank %d: cannot reach MASTER_ADDR=%s:%d within %g s (last attempt: %s)", s->rank, s->host, s->port,
                  s->timeout_s, last);
}

int store_open(Store **out, const StoreOptions *opt, char *err) {
    Store *s = xcalloc(1, sizeof *s);
    s->fd = -1;
    s->rank = opt->rank;
    s->world_size = opt->world_size;
    s->timeout_s = opt->timeout_s > 0 ? opt->timeout_s : STORE_DEFAULT_TIMEOUT_S;
    snprintf(s->host, sizeof s->host, "%s", opt->host ? opt->host : "127.0.0.1");
    s->port = opt->port;
    s->prefix = xstrdup(opt->key_prefix ? opt->key_prefix : "");
    s->cancel = opt->cancel;
    if (gethostname(s->self, sizeof s->self) != 0) snprintf(s->self, sizeof s->self, "?");
    s->self[sizeof s->self - 1] = '\0';
    double deadline = now_s() + s->timeout_s;
    if (opt->serve) {
        char sub[ERR_LEN];
        /* a store on a loopback address is for this machine alone: nothing else may reach it */
        const char *bind_host = opt->bind_host ? opt->bind_host : store_host_is_loopback(s->host) ? s->host : NULL;
        if (store_server_start(&s->server, bind_host, opt->port, opt->token, sub) != COLT_OK) {
            errorf(err, "rank %d: %s", s->rank, sub);
            goto fail;
        }
        s->port = store_server_port(s->server);
    }
    if (connect_by(s, deadline, err) != COLT_OK) goto fail;
    /* VALIDATE, then a CHECK whose answer proves the other end speaks c10d. */
    Buf b = {0};
    uint32_t magic = STORE_MAGIC;
    buf_u8(&b, STORE_Q_VALIDATE);
    buf_put(&b, &magic, sizeof magic);
    if (opt->token) { /* colt's own store of a channel that must not let strangers in (store.h) */
        buf_u8(&b, STORE_Q_SET);
        buf_u64(&b, strlen(STORE_TOKEN_KEY));
        buf_put(&b, STORE_TOKEN_KEY, strlen(STORE_TOKEN_KEY));
        buf_u64(&b, strlen(opt->token));
        buf_put(&b, opt->token, strlen(opt->token));
    }
    buf_u8(&b, STORE_Q_CHECK);
    buf_u64(&b, 1);
    buf_key(&b, s, "colt_probe", err);
    double probe = now_s() + PROBE_TIMEOUT_S;
    uint8_t reply = 0xff;
    int rc = send_by(s, b.p, b.n, probe < deadline ? probe : deadline, "greeting the store", err);
    free(b.p);
    if (rc == COLT_OK) rc = recv_by(s, &reply, 1, probe < deadline ? probe : deadline, "greeting the store", err);
    if (rc == STORE_TIMED_OUT || (rc == COLT_OK && reply > STORE_CHECK_NOT_READY)) {
        store_fail(s, err, "%s:%d accepted a connection but did not answer as a c10d TCPStore (an older PyTorch "
                   "speaks another protocol; set COLT_STORE_PORT to a free port to use colt's own store)", s->host, s->port);
        goto fail;
    }
    if (rc != COLT_OK && opt->token && !cancelled(s)) {
        errorf(err, "rank %d: the store at %s:%d closed the connection at the greeting: it wants another key (the "
                    "server's API key: vllm_server_api_key or COLT_API_KEY)", s->rank, s->host, s->port);
        goto fail;
    }
    if (rc != COLT_OK) goto fail;
    *out = s;
    return COLT_OK;
fail:
    if (s->fd >= 0) close(s->fd);
    store_server_stop(s->server);
    free(s->prefix);
    free(s);
    return COLT_ERR;
}

int store_open_for_launch(Store **out, const LaunchEnv *env, double timeout_s, char *err) {
    StoreOptions opt = {.host = env->master_addr, .rank = env->rank, .world_size = env->world_size, .timeout_s = timeout_s};
    char prefix[128];
    if (env->world_size == 1 && !env->master_addr[0]) {
        /* A world of one: a private store on a free local port (nothing waits on it). */
        opt.host = "127.0.0.1";
        opt.serve = true;
        opt.key_prefix = "/colt/";
        return store_open(out, &opt, err);
    }
    if (!env->master_addr[0])
        return errorf(err, "rank %d: no rendezvous address for the store: set MASTER_ADDR and MASTER_PORT", env->rank);
    if (env->store_port) {
        opt.port = env->store_port;
        opt.serve = env->rank == 0;
        opt.key_prefix = "/colt/";
    } else if (env->launcher == LAUNCHER_TORCHRUN && env->torchrun_agent_store) {
        /* torchrun's agent serves this store for the whole run, across restarts:
         * keys per run and restart, so a restarted job never reads stale ones.
         * The leading '/' is what PyTorch's clients put before every key, so a
         * torch client sees these as "colt/...". */
        snprintf(prefix, sizeof prefix, "/colt/%.64s/%d/", env->run_id[0] ? env->run_id : "run", env->restart_count);
        opt.port = env->master_port;
        opt.key_prefix = prefix;
    } else {
        opt.port = env->master_port;
        opt.serve = env->rank == 0;
        opt.key_prefix = "/colt/";
    }
    return store_open(out, &opt, err);
}

void store_close(Store *s) {
    if (!s) return;
    if (s->fd >= 0) close(s->fd);
    if (s->server) {
        /* Others may still be reading keys: wait for their connections to close. */
        double deadline = now_s() + s->timeout_s;
        while (store_server_clients(s->server) > 0 && now_s() < deadline && !cancelled(s)) sleep_s(0.01);
        store_server_stop(s->server);
    }
    free(s->prefix);
    free(s);
}
