/* comm_internal.h — what the communicator backends share (private to
 * src/dist): the instance, its op table, the open function of each backend and
 * the helpers for bounded waits and messages. Users include comm.h. */
#ifndef COLT_DIST_COMM_INTERNAL_H
#define COLT_DIST_COMM_INTERNAL_H

#ifdef __cplusplus
extern "C" {
#endif

#include "core/error.h"
#include "dist/comm.h"

/* Arguments are checked by comm.c before an op runs (dtype allowed, root in
 * range, communicator not broken). An op returns COLT_OK or COLT_ERR with err
 * filled through comm_fail. */
typedef struct CommOps {
    int (*all_reduce)(Comm *c, void *data, size_t count, CommDtype dtype, void *stream, char *err);
    int (*reduce)(Comm *c, void *data, size_t count, CommDtype dtype, int root, void *stream, char *err);
    int (*reduce_scatter)(Comm *c, void *out, const void *in, size_t count, CommDtype dtype, void *stream, char *err);
    int (*all_gather)(Comm *c, void *out, const void *in, size_t count, CommDtype dtype, void *stream, char *err);
    int (*broadcast)(Comm *c, void *data, size_t count, CommDtype dtype, int root, void *stream, char *err);
    int (*barrier)(Comm *c, char *err);
    /* fills child's ops, impl, rank and world_size; NULL: not supported */
    int (*split)(Comm *c, int color, int key, Comm *child, char *err);
    int (*wait)(Comm *c, void *stream, char *err); /* NULL: nothing to wait for */
    void (*abort)(Comm *c, const char *reason);    /* tell the others; may end the process */
    void (*cancel)(Comm *c);                       /* drop in-flight ops; NULL: none can be in flight */
    void (*close)(Comm *c);                        /* frees impl */
} CommOps;

struct Comm {
    const CommOps *ops;
    CommKind kind;
    int rank, world_size;
    double timeout_s;
    char host[64];
    bool gpu;
    int cuda_device;
    const LaunchEnv *env; /* valid during open only */
    Store *store;         /* rendezvous store, if any */
    bool owns_store;
    bool broken;
    void *impl;
};

/* errorf with "rank R on host H: " in front. Returns COLT_ERR. */
int comm_fail(const Comm *c, char *err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* "1048576 floats", "3 int64s", "128 bytes". */
void comm_describe(char *out, size_t out_len, const char *op, size_t count, CommDtype dtype);
size_t comm_dtype_size(CommDtype dtype);

double comm_now(void);
void comm_sleep(double seconds);

/* Opens the rendezvous store for c if opt has none (nccl / gloo without MPI). */
int comm_need_store(Comm *c, const CommOptions *opt, char *err);

/* Backends: fill c->ops and c->impl, or return COLT_ERR. */
int comm_mpi_open(Comm *c, const CommOptions *opt, char *err);
int comm_nccl_open(Comm *c, const CommOptions *opt, char *err);
int comm_gloo_open(Comm *c, const CommOptions *opt, char *err);

/* MPI as a bootstrap for NCCL under mpirun (comm_mpi.c): initializes MPI if
 * needed (counted, so the last user finalizes), broadcasts bytes from root with
 * a bounded wait, aborts the job. */
int comm_mpi_session_begin(Comm *c, char *err);
void comm_mpi_session_end(void);
int comm_mpi_bootstrap_bcast(Comm *c, void *data, size_t bytes, int root, const char *what, char *err);
void comm_mpi_abort_job(int status);

#ifdef __cplusplus
}
#endif

#endif
