/* store_server.c — colt's own store server: one thread in rank 0 that serves
 * the c10d TCPStore subset of store.h (VALIDATE, SET, GET, ADD, CHECK, WAIT,
 * CANCEL_WAIT, DELETE_KEY, GETNUMKEYS, PING) to every rank over TCP.
 *
 * One poll loop, no locks: the thread owns the keys and the connections; the
 * caller only starts it, reads the client count (atomic) and stops it through
 * a pipe. Keys are a flat array searched linearly: a job sets a few keys per
 * rank. Not a general server: COMPARE_SET, APPEND and the MULTI_* queries,
 * which colt does not send, close the connection. With a token, a client's
 * first query after VALIDATE must be the SET of STORE_TOKEN_KEY to it
 * (compared in constant time), or it is dropped. */
#include "dist/store_server.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "core/error.h"
#include "dist/store.h"

/* A single query may not exceed this (a value plus its key and header), so a
 * peer that sends garbage lengths is dropped instead of growing the buffer. */
#define MAX_QUERY_BYTES ((size_t)STORE_MAX_VALUE + 2 * STORE_MAX_KEY + 64)
#define MAX_WAIT_KEYS 4096

typedef struct {
    uint8_t *key;
    size_t key_len;
    uint8_t *value;
    size_t len;
} Entry;

typedef struct {
    int fd;
    bool validated, admitted; /* admitted: showed the token (or none is wanted) */
    uint8_t *in;
    size_t in_len, in_cap;
    /* Keys this client's WAIT still waits for (copies); n_waiting > 0 while waiting. */
    Entry *waiting;
    size_t n_waiting;
} Client;

struct StoreServer {
    int listen_fd;
    int wake[2]; /* writing a byte to wake[1] stops the thread */
    int port;
    char *token; /* NULL: none wanted */
    pthread_t thread;
    atomic_int n_clients;
    Client *clients;
    size_t n_clients_used, clients_cap;
    Entry *entries;
    size_t n_entries, entries_cap;
};

/* ------------------------------------------------------------------ keys */

static Entry *entry_find(StoreServer *srv, const uint8_t *key, size_t key_len) {
    for (size_t i = 0; i < srv->n_entries; i++)
        if (srv->entries[i].key_len == key_len && !memcmp(srv->entries[i].key, key, key_len)) return &srv->entries[i];
    return NULL;
}

static uint8_t *dup_bytes(const uint8_t *p, size_t n) {
    uint8_t *q = xmalloc(n + 1);
    if (n) memcpy(q, p, n);
    q[n] = 0;
    return q;
}

static void entry_free(Entry *e) {
    free(e->key);
    free(e->value);
    e->key = e->value = NULL;
}

/* A key was set: clients whose WAIT now has every key get STOP_WAITING. */
static int send_all(int fd, const void *buf, size_t n);
static void wake_waiters(StoreServer *srv, const uint8_t *key, size_t key_len) {
    for (size_t c = 0; c < srv->n_clients_used; c++) {
        Client *cl = &srv->clients[c];
        if (!cl->n_waiting) continue;
        for (size_t i = 0; i < cl->n_waiting; i++) {
            if (cl->waiting[i].key_len != key_len || memcmp(cl->waiting[i].key, key, key_len)) continue;
            entry_free(&cl->waiting[i]);
            cl->waiting[i] = cl->waiting[--cl->n_waiting];
            break;
        }
        if (!cl->n_waiting) {
            uint8_t stop = STORE_WAIT_STOP_WAITING;
            /* A failed send surfaces as a closed socket on the next poll. */
            (void)send_all(cl->fd, &stop, 1);
        }
    }
}

static void entry_set(StoreServer *srv, const uint8_t *key, size_t key_len, const uint8_t *value, size_t len) {
    Entry *e = entry_find(srv, key, key_len);
    if (!e) {
        if (srv->n_entries == srv->entries_cap) {
            srv->entries_cap = srv->entries_cap ? 2 * srv->entries_cap : 64;
            srv->entries = xrealloc(srv->entries, srv->entries_cap * sizeof *srv->entries);
        }
        e = &srv->entries[srv->n_entries++];
        e->key = dup_bytes(key, key_len);
        e->key_len = key_len;
        e->value = NULL;
    }
    free(e->value);
    e->value = dup_bytes(value, len);
    e->len = len;
    wake_waiters(srv, key, key_len);
}

/* ------------------------------------------------------------------ I/O */

/* Blocking send with the socket's SO_SNDTIMEO as bound; 0 or -1. */
static int send_all(int fd, const void *buf, size_t n) {
    const uint8_t *p = buf;
    while (n) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

static int send_u8(int fd, uint8_t v) { return send_all(fd, &v, 1); }
static int send_i64(int fd, int64_t v) { return send_all(fd, &v, sizeof v); }

/* Reads typed fields from a client's buffer; `need` says the query is not all
 * here yet, `bad` that it can never be valid. */
typedef struct {
    const uint8_t *p;
    size_t n, off;
    bool need, bad;
} Reader;

static bool rd_bytes(Reader *r, void *out, size_t k) {
    if (r->need || r->bad) return false;
    if (r->n - r->off < k) {
        r->need = true;
        return false;
    }
    memcpy(out, r->p + r->off, k);
    r->off += k;
    return true;
}

/* A length-prefixed byte string, returned as a pointer into the buffer. */
static bool rd_str(Reader *r, const uint8_t **s, size_t *len, size_t max) {
    uint64_t n;
    if (!rd_bytes(r, &n, sizeof n)) return false;
    if (n > max) {
        r->bad = true;
        return false;
    }
    if (r->n - r->off < n) {
        r->need = true;
        return false;
    }
    *s = r->p + r->off;
    *len = (size_t)n;
    r->off += (size_t)n;
    return true;
}

/* Executes the first complete query in cl->in. Returns 1 if one ran, 0 if more
 * bytes are needed, -1 to drop the client. */
static int serve_one(StoreServer *srv, Client *cl) {
    Reader r = {cl->in, cl->in_len, 0, false, false};
    uint8_t q;
    if (!rd_bytes(&r, &q, 1)) return 0;
    if (!cl->validated && q != STORE_Q_VALIDATE) return -1; /* c10d: VALIDATE comes first */
    if (cl->validated && !cl->admitted && q != STORE_Q_SET) return -1; /* the token comes next */
    const uint8_t *key = NULL, *value = NULL;
    size_t key_len = 0, len = 0;
    int rc = 0;
    switch (q) {
    case STORE_Q_VALIDATE: {
        uint32_t magic;
        if (!rd_bytes(&r, &magic, sizeof magic)) break;
        if (magic != STORE_MAGIC) return -1;
        cl->validated = true;
        cl->admitted = srv->token == NULL;
        break;
    }
    case STORE_Q_SET:
        if (!rd_str(&r, &key, &key_len, STORE_MAX_KEY) || !rd_str(&r, &value, &len, STORE_MAX_VALUE)) break;
        if (!cl->admitted) { /* the token, and nothing else */
            size_t n = strlen(srv->token);
            unsigned char diff = (unsigned char)(key_len != strlen(STORE_TOKEN_KEY) || len != n);
            for (size_t i = 0; i < n; i++) diff |= (unsigned char)((i < len ? value[i] : 0) ^ (uint8_t)srv->token[i]);
            if (diff || memcmp(key, STORE_TOKEN_KEY, key_len) != 0) return -1;
            cl->admitted = true;
            break;
        }
        entry_set(srv, key, key_len, value, len);
        break;
    case STORE_Q_GET: {
        if (!rd_str(&r, &key, &key_len, STORE_MAX_KEY)) break;
        Entry *e = entry_find(srv, key, key_len);
        uint64_t n = e ? e->len : 0; /* a missing key reads as empty, as in c10d's libuv server */
        rc = send_all(cl->fd, &n, sizeof n);
        if (!rc && n) rc = send_all(cl->fd, e->value, n);
        break;
    }
    case STORE_Q_ADD: {
        int64_t delta;
        if (!rd_str(&r, &key, &key_len, STORE_MAX_KEY) || !rd_bytes(&r, &delta, sizeof delta)) break;
        Entry *e = entry_find(srv, key, key_len);
        int64_t v = delta;
        if (e) v += strtoll((const char *)e->value, NULL, 10); /* values are decimal text, as in c10d */
        char text[32];
        int n = snprintf(text, sizeof text, "%lld", (long long)v);
        entry_set(srv, key, key_len, (const uint8_t *)text, (size_t)n);
        rc = send_i64(cl->fd, v);
        break;
    }
    case STORE_Q_CHECK:
    case STORE_Q_WAIT: {
        uint64_t n;
        if (!rd_bytes(&r, &n, sizeof n)) break;
        if (n > MAX_WAIT_KEYS) return -1;
        const uint8_t *keys[MAX_WAIT_KEYS];
        size_t lens[MAX_WAIT_KEYS];
        for (uint64_t i = 0; i < n; i++)
            if (!rd_str(&r, &keys[i], &lens[i], STORE_MAX_KEY)) break;
        if (r.need || r.bad) break;
        size_t missing = 0;
        for (uint64_t i = 0; i < n; i++) missing += entry_find(srv, keys[i], lens[i]) == NULL;
        if (q == STORE_Q_CHECK) {
            rc = send_u8(cl->fd, missing ? STORE_CHECK_NOT_READY : STORE_CHECK_READY);
            break;
        }
        for (size_t i = 0; i < cl->n_waiting; i++) entry_free(&cl->waiting[i]);
        cl->n_waiting = 0;
        if (!missing) {
            rc = send_u8(cl->fd, STORE_WAIT_STOP_WAITING);
            break;
        }
        cl->waiting = xrealloc(cl->waiting, missing * sizeof *cl->waiting);
        for (uint64_t i = 0; i < n; i++) {
            if (entry_find(srv, keys[i], lens[i])) continue;
            cl->waiting[cl->n_waiting++] = (Entry){dup_bytes(keys[i], lens[i]), lens[i], NULL, 0};
        }
        break;
    }
    case STORE_Q_CANCEL_WAIT:
        for (size_t i = 0; i < cl->n_waiting; i++) entry_free(&cl->waiting[i]);
        cl->n_waiting = 0;
        rc = send_u8(cl->fd, STORE_WAIT_CANCELED);
        break;
    case STORE_Q_DELETE_KEY: {
        if (!rd_str(&r, &key, &key_len, STORE_MAX_KEY)) break;
        Entry *e = entry_find(srv, key, key_len);
        if (e) {
            entry_free(e);
            *e = srv->entries[--srv->n_entries];
        }
        rc = send_i64(cl->fd, e ? 1 : 0);
        break;
    }
    case STORE_Q_GETNUMKEYS:
        rc = send_i64(cl->fd, (int64_t)srv->n_entries);
        break;
    case STORE_Q_PING: {
        uint32_t nonce;
        if (!rd_bytes(&r, &nonce, sizeof nonce)) break;
        rc = send_all(cl->fd, &nonce, sizeof nonce);
        break;
    }
    default:
        return -1;
    }
    if (r.bad || rc) return -1;
    if (r.need) return 0;
    cl->in_len -= r.off;
    memmove(cl->in, cl->in + r.off, cl->in_len);
    return 1;
}

static void client_drop(StoreServer *srv, size_t i) {
    Client *cl = &srv->clients[i];
    close(cl->fd);
    free(cl->in);
    for (size_t k = 0; k < cl->n_waiting; k++) entry_free(&cl->waiting[k]);
    free(cl->waiting);
    srv->clients[i] = srv->clients[--srv->n_clients_used];
    atomic_fetch_sub(&srv->n_clients, 1);
}

/* Reads what the client sent and runs every complete query; -1 to drop it. */
static int client_readable(StoreServer *srv, Client *cl) {
    if (cl->in_cap - cl->in_len < 4096) {
        if (cl->in_cap >= MAX_QUERY_BYTES) return -1;
        cl->in_cap = cl->in_cap ? 2 * cl->in_cap : 8192;
        cl->in = xrealloc(cl->in, cl->in_cap);
    }
    ssize_t k = recv(cl->fd, cl->in + cl->in_len, cl->in_cap - cl->in_len, 0);
    if (k < 0 && (errno == EINTR || errno == EAGAIN)) return 0;
    if (k <= 0) return -1;
    cl->in_len += (size_t)k;
    int rc;
    while ((rc = serve_one(srv, cl)) == 1) {}
    return rc < 0 ? -1 : 0;
}

static void accept_client(StoreServer *srv) {
    int fd = accept4(srv->listen_fd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0) return;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    /* A client that stops reading cannot wedge the server: sends give up after 10 s. */
    struct timeval tv = {10, 0};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (srv->n_clients_used == srv->clients_cap) {
        srv->clients_cap = srv->clients_cap ? 2 * srv->clients_cap : 16;
        srv->clients = xrealloc(srv->clients, srv->clients_cap * sizeof *srv->clients);
    }
    srv->clients[srv->n_clients_used++] = (Client){.fd = fd};
    atomic_fetch_add(&srv->n_clients, 1);
}

static void *serve_loop(void *arg) {
    StoreServer *srv = arg;
    struct pollfd *fds = NULL;
    size_t fds_cap = 0;
    for (;;) {
        size_t n = 2 + srv->n_clients_used;
        if (n > fds_cap) {
            fds_cap = 2 * n;
            fds = xrealloc(fds, fds_cap * sizeof *fds);
        }
        fds[0] = (struct pollfd){srv->listen_fd, POLLIN, 0};
        fds[1] = (struct pollfd){srv->wake[0], POLLIN, 0};
        for (size_t i = 0; i < srv->n_clients_used; i++) fds[2 + i] = (struct pollfd){srv->clients[i].fd, POLLIN, 0};
        if (poll(fds, n, -1) < 0) {
            if (errno == EINTR) continue;
            break;
        }
        if (fds[1].revents) break;
        /* Clients first (indices are stable until a drop), newest to oldest so a
         * drop, which moves the last client into the hole, skips nobody. */
        for (size_t i = n - 2; i-- > 0;) {
            if (!fds[2 + i].revents) continue;
            if (client_readable(srv, &srv->clients[i]) < 0) client_drop(srv, i);
        }
        if (fds[0].revents & POLLIN) accept_client(srv);
    }
    free(fds);
    return NULL;
}

/* ------------------------------------------------------------------ lifetime */

/* Binds host:port (the first of its addresses that binds). */
static int listen_on(int *fd_out, int *port_out, const char *host, int port, char *err) {
    char service[8];
    snprintf(service, sizeof service, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *res = NULL;
    int gai = getaddrinfo(host, service, &hints, &res);
    if (gai) return errorf(err, "cannot host the store on %s: %s", host, gai_strerror(gai));
    int fd = -1, e = 0, one = 1;
    for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
        fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            e = errno;
            continue;
        }
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 1024) != 0) {
            e = errno;
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    if (fd < 0 && e == EADDRINUSE)
        return errorf(err, "cannot host the store on port %d: it is in use (another job or a leftover process?); "
                           "choose a free MASTER_PORT", port);
    if (fd < 0) return errorf(err, "cannot host the store on %s port %d: %s", host, port, strerror(e));
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    getsockname(fd, (struct sockaddr *)&ss, &sl);
    *port_out = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port : ((struct sockaddr_in *)&ss)->sin_port);
    *fd_out = fd;
    return COLT_OK;
}

/* Binds [::]:port (IPv4 too) or, where IPv6 is off, 0.0.0.0:port. */
static int listen_any(int *fd_out, int *port_out, int port, char *err) {
    int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1, zero = 0;
    if (fd >= 0) {
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
        struct sockaddr_in6 a6 = {.sin6_family = AF_INET6, .sin6_port = htons((uint16_t)port), .sin6_addr = in6addr_any};
        if (bind(fd, (struct sockaddr *)&a6, sizeof a6) == 0) goto bound;
        int e = errno;
        close(fd);
        fd = -1;
        if (e == EADDRINUSE) goto in_use;
    }
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return errorf(err, "cannot create a TCP socket for the store: %s", strerror(errno));
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a4 = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = htonl(INADDR_ANY)};
    if (bind(fd, (struct sockaddr *)&a4, sizeof a4) != 0) {
        int e = errno;
        close(fd);
        if (e == EADDRINUSE) goto in_use;
        return errorf(err, "cannot host the store on port %d: %s", port, strerror(e));
    }
bound:
    if (listen(fd, 1024) != 0) {
        int e = errno;
        close(fd);
        if (e == EADDRINUSE) goto in_use;
        return errorf(err, "cannot listen on port %d for the store: %s", port, strerror(e));
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    getsockname(fd, (struct sockaddr *)&ss, &sl);
    *port_out = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port : ((struct sockaddr_in *)&ss)->sin_port);
    *fd_out = fd;
    return COLT_OK;
in_use:
    return errorf(err, "cannot host the store on port %d: it is in use (another job or a leftover process?); "
                       "choose a free MASTER_PORT", port);
}

int store_server_start(StoreServer **out, const char *bind_host, int port, const char *token, char *err) {
    StoreServer *srv = xcalloc(1, sizeof *srv);
    srv->wake[0] = srv->wake[1] = -1;
    if ((bind_host ? listen_on(&srv->listen_fd, &srv->port, bind_host, port, err)
                   : listen_any(&srv->listen_fd, &srv->port, port, err)) != COLT_OK) {
        free(srv);
        return COLT_ERR;
    }
    srv->token = token ? xstrdup(token) : NULL;
    if (pipe2(srv->wake, O_CLOEXEC) != 0) {
        close(srv->listen_fd);
        free(srv->token);
        free(srv);
        return errorf(err, "cannot create the store's wake-up pipe: %s", strerror(errno));
    }
    atomic_init(&srv->n_clients, 0);
    int rc = pthread_create(&srv->thread, NULL, serve_loop, srv);
    if (rc != 0) {
        close(srv->listen_fd);
        close(srv->wake[0]);
        close(srv->wake[1]);
        free(srv->token);
        free(srv);
        return errorf(err, "cannot start the store's thread: %s", strerror(rc));
    }
    *out = srv;
    return COLT_OK;
}

int store_server_port(const StoreServer *srv) { return srv->port; }

int store_server_clients(const StoreServer *srv) { return atomic_load(&((StoreServer *)srv)->n_clients); }

void store_server_stop(StoreServer *srv) {
    if (!srv) return;
    char b = 0;
    while (write(srv->wake[1], &b, 1) < 0 && errno == EINTR) {}
    pthread_join(srv->thread, NULL);
    while (srv->n_clients_used) client_drop(srv, srv->n_clients_used - 1);
    for (size_t i = 0; i < srv->n_entries; i++) entry_free(&srv->entries[i]);
    free(srv->entries);
    free(srv->clients);
    close(srv->listen_fd);
    close(srv->wake[0]);
    close(srv->wake[1]);
    free(srv->token);
    free(srv);
}
