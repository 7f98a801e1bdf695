/* store.h — a small key-value store over TCP for the rendezvous of ranks that
 * have no MPI: passing the NCCL unique id, Gloo's addresses, and checking that
 * every rank arrived (a barrier).
 *
 * The wire format is a subset of PyTorch's c10d TCPStore protocol as its
 * current servers speak it (libuv and classic; read from TCPStore.cpp,
 * TCPStoreBackend.cpp and TCPStoreLibUvBackend.cpp, and checked against PyTorch
 * 2.15 by tests/dist_torch_store.sh): a client first sends VALIDATE with the
 * magic number, then SET / GET / ADD / CHECK / WAIT / CANCEL_WAIT / DELETE_KEY /
 * GETNUMKEYS / PING, lengths as native-endian uint64. So colt can be a client
 * of the store that torchrun's agent already serves on MASTER_PORT, and colt's
 * own server (store_server.c, a thread in rank 0) speaks the same subset. An
 * older PyTorch whose server does not expect VALIDATE is refused with an error
 * at open (set COLT_STORE_PORT to use colt's own store then).
 *
 * colt's server may want a token: its clients then send a SET of the key
 * STORE_TOKEN_KEY with the token right after VALIDATE, and a client that
 * sends anything else, or another token, is dropped (the weight channel of
 * colt serve, which must not let strangers in). It binds loopback when the
 * store's address is loopback, so a job on one machine is not reachable from
 * others.
 *
 * Every wait is bounded by the store's timeout: connecting (with retries),
 * waiting for a key, a barrier. Errors say which rank on which host waited for
 * what. A Store is used by one thread at a time. Not a database: values live in
 * rank 0's (or torchrun's) memory for the job's lifetime, and it is not meant
 * for bulk data (values up to 16 MiB). */
#ifndef COLT_DIST_STORE_H
#define COLT_DIST_STORE_H

#ifndef __cplusplus
#include <stdatomic.h>
#endif
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dist/launch_env.h"

#define STORE_DEFAULT_TIMEOUT_S 600.0
#define STORE_MAX_VALUE (16u << 20)
#define STORE_MAX_KEY 4096
#define STORE_TOKEN_KEY "\x01colt/token" /* no key of a job starts with \x01 */

typedef struct Store Store;

typedef struct StoreOptions {
    const char *host;       /* where the store is (MASTER_ADDR) */
    int port;               /* its port; with serve, 0 picks a free one (store_port tells) */
    bool serve;             /* host the store in this process (a background thread) */
    int rank, world_size;   /* who this is, for barriers and messages */
    double timeout_s;       /* bound on every wait; 0 means STORE_DEFAULT_TIMEOUT_S */
    const char *key_prefix; /* prepended to every key; NULL for none */
    const char *bind_host;  /* serve: the address to listen on; NULL: host when it is loopback (only this
                             * machine may join), else every interface */
    const char *token;      /* serve: clients must show it before any query (colt's own extension, sent
                             * right after VALIDATE); a client: shows it; NULL: none */
#ifdef __cplusplus
    const void *cancel; /* C++ units (Gloo's) only pass Stores around */
#else
    const atomic_bool *cancel; /* set by another thread: every wait ends now with an error; NULL: never */
#endif
} StoreOptions;

/* Connects to (and with serve, first starts) the store. Returns COLT_OK, or
 * COLT_ERR: the port is in use, the host cannot be reached within the timeout,
 * or what answers does not speak the protocol. */
int store_open(Store **out, const StoreOptions *opt, char *err);

/* The store for a launch: under torchrun with its agent's store
 * (TORCHELASTIC_USE_AGENT_STORE=True), a client of that store on MASTER_PORT
 * with keys under /colt/<run id>/<restart>/ ("colt/..." to a torch client); otherwise colt's own store on
 * MASTER_ADDR:MASTER_PORT (or COLT_STORE_PORT when set), served by rank 0. */
int store_open_for_launch(Store **out, const LaunchEnv *env, double timeout_s, char *err);

/* Sets key to len bytes of data (replacing any earlier value). */
int store_set(Store *s, const char *key, const void *data, size_t len, char *err);

/* Waits (up to the timeout) until key exists, then returns a copy of its value
 * in *data (malloc'd, caller frees; NUL-terminated one past *len). */
int store_get(Store *s, void **data, size_t *len, const char *key, char *err);

/* Whether key exists now, without waiting. */
int store_check(Store *s, bool *present, const char *key, char *err);

/* Adds delta to the integer at key (0 if absent) and returns the new value. */
int store_add(Store *s, int64_t *value, const char *key, int64_t delta, char *err);

/* Returns once all world_size ranks called store_barrier with this name (each
 * call with the same name is a new barrier), or an error after the timeout that
 * says how many ranks arrived. */
int store_barrier(Store *s, const char *name, char *err);

/* Whether host is a loopback address (127.0.0.0/8, ::1, localhost): only this machine reaches it. */
bool store_host_is_loopback(const char *host);

/* The port the store listens on (useful after serving on port 0). */
int store_port(const Store *s);

/* Closes the connection. The serving rank first waits (up to the timeout) until
 * the other ranks have closed theirs, so no rank loses the store mid-rendezvous. */
void store_close(Store *s);

#endif
