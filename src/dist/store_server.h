/* store_server.h — colt's own store server (private to src/dist): a thread
 * that serves the c10d TCPStore subset described in store.h. Callers use
 * store.h; this header is for store.c only. */
#ifndef COLT_DIST_STORE_SERVER_H
#define COLT_DIST_STORE_SERVER_H

/* c10d wire constants (torch/csrc/distributed/c10d/TCPStoreBackend.hpp). */
#define STORE_MAGIC 0x3C85F7CEu
enum {
    STORE_Q_VALIDATE = 0,
    STORE_Q_SET = 1,
    STORE_Q_COMPARE_SET = 2,
    STORE_Q_GET = 3,
    STORE_Q_ADD = 4,
    STORE_Q_CHECK = 5,
    STORE_Q_WAIT = 6,
    STORE_Q_GETNUMKEYS = 7,
    STORE_Q_DELETE_KEY = 8,
    STORE_Q_APPEND = 9,
    STORE_Q_MULTI_GET = 10,
    STORE_Q_MULTI_SET = 11,
    STORE_Q_CANCEL_WAIT = 12,
    STORE_Q_PING = 13,
};
enum { STORE_CHECK_READY = 0, STORE_CHECK_NOT_READY = 1 };
enum { STORE_WAIT_STOP_WAITING = 0, STORE_WAIT_CANCELED = 1 };

typedef struct StoreServer StoreServer;

/* Listens on bind_host (NULL: every interface) at port (0: a free one) and
 * starts the serving thread; with a token, clients must show it first
 * (store.h). COLT_OK, or COLT_ERR with err saying why (port in use, ...). */
int store_server_start(StoreServer **out, const char *bind_host, int port, const char *token, char *err);

int store_server_port(const StoreServer *srv);

/* Clients connected now (validated or not). */
int store_server_clients(const StoreServer *srv);

/* Stops the thread, closes every connection, frees everything. */
void store_server_stop(StoreServer *srv);

#endif
