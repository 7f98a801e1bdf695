/* comm.h — communicators: the collectives data-parallel training needs, behind
 * one small op table, on an instance opened for one rank of a launch.
 *
 * Backends (comm_open picks one, or CommOptions.kind names it):
 *   self  a world of one: ops copy or do nothing; no MPI or NCCL call at all.
 *   mpi   Open MPI, for CPU ranks started by mpirun (or srun with PMIx).
 *   nccl  NCCL, for GPU ranks (CUDA builds): ops are enqueued on a cudaStream_t;
 *         its unique id travels over MPI under mpirun, else over the TCP store.
 *   gloo  Gloo over TCP, for CPU ranks without MPI (torchrun), where built.
 *
 * Every wait is bounded by the timeout (default 600 s): on a timeout or a
 * peer's failure each rank returns an error saying what it waited for, on which
 * rank and host, e.g. "rank 1 on host h: all_reduce of 1048576 floats did not
 * complete within 600 s (a rank died or hung?)"; a peer that called
 * comm_abort ends the others' waits early ("... stopped: another rank aborted
 * the job (its reason)" under NCCL; MPI_Abort and Gloo's closed connections
 * do it for the others). After any error the communicator is unusable; the
 * caller then calls comm_abort, which stops the other ranks too and ends this
 * process.
 *
 * Buffers: host memory for self (CPU ranks), mpi and gloo; device memory for
 * nccl and for self with gpu set. Reductions are sums. This file does not
 * choose devices, split groups or bucket gradients (later layers do). */
#ifndef COLT_DIST_COMM_H
#define COLT_DIST_COMM_H

#include <stdbool.h>
#include <stddef.h>

#include "dist/launch_env.h"
#include "dist/store.h"

#define COMM_DEFAULT_TIMEOUT_S 600.0

typedef enum { COMM_AUTO, COMM_SELF, COMM_MPI, COMM_NCCL, COMM_GLOO } CommKind;

/* Element types. Sums take FLOAT32 / FLOAT64 / INT64, and BFLOAT16 on nccl
 * (tensor parallelism's activations); gathers and broadcasts any (BYTE for
 * raw bytes). */
typedef enum { COMM_FLOAT32, COMM_FLOAT64, COMM_INT64, COMM_BYTE, COMM_BFLOAT16 } CommDtype;

typedef struct CommOptions {
    CommKind kind;    /* COMM_AUTO: see comm_choose_kind */
    bool gpu;         /* this rank computes on a GPU (buffers are device memory) */
    int cuda_device;  /* nccl: device ordinal; -1 means the launch's local_rank */
    double timeout_s; /* bound on every wait; 0 means COMM_DEFAULT_TIMEOUT_S */
    Store *store;     /* rendezvous for nccl / gloo without MPI; NULL: opened from
                       * the launch environment and owned by the communicator */
} CommOptions;

typedef struct Comm Comm;

/* The backend a launch gets: self for a world of one; nccl for GPU ranks; for
 * CPU ranks mpi under mpirun or srun, gloo under torchrun or by hand where
 * built, else an error that says how to launch. */
int comm_choose_kind(CommKind *out, const LaunchEnv *env, bool gpu, char *err);

/* Opens this rank's communicator. Collective: every rank of the launch calls it. */
int comm_open(Comm **out, const LaunchEnv *env, const CommOptions *opt, char *err);

/* Sum over ranks, in place: data holds count elements on every rank. */
int comm_all_reduce(Comm *c, void *data, size_t count, CommDtype dtype, void *stream, char *err);

/* Sum over ranks into root's data (count elements, in place); the other
 * ranks' data is unspecified afterwards. A part of a sum wanted by one rank
 * (ZeRO's gradient shards): half an all_reduce's traffic. */
int comm_reduce(Comm *c, void *data, size_t count, CommDtype dtype, int root, void *stream, char *err);

/* Sum over ranks of in (world_size * count elements); rank r gets block r of
 * the sum in out (count elements). out and in must not overlap. */
int comm_reduce_scatter(Comm *c, void *out, const void *in, size_t count, CommDtype dtype, void *stream, char *err);

/* Every rank's in (count elements) into out (world_size * count, rank order). */
int comm_all_gather(Comm *c, void *out, const void *in, size_t count, CommDtype dtype, void *stream, char *err);

/* root's data (count elements) to every rank's data. */
int comm_broadcast(Comm *c, void *data, size_t count, CommDtype dtype, int root, void *stream, char *err);

/* A communicator of the ranks that pass the same color, ranked by key (ties
 * by rank): the groups of tensor and data parallelism. Collective over c;
 * same kind, timeout and device as c, closed on its own (after c's other
 * users are done with c; c stays open). Built for every backend. */
int comm_split(Comm *c, int color, int key, Comm **out, char *err);

/* Returns once every rank called it. */
int comm_barrier(Comm *c, char *err);

/* nccl: waits (bounded) until the collectives enqueued on stream completed
 * (ops on other streams need their own wait); the other backends finish each
 * op before returning, so this does nothing there. */
int comm_wait(Comm *c, void *stream, char *err);

/* Prints "colt: rank R on host H: aborting the job: reason" on stderr, tells
 * the other ranks to stop (MPI_Abort / ncclCommAbort and the store's abort key /
 * closing Gloo's connections) and ends this process with status 1. */
__attribute__((noreturn)) void comm_abort(Comm *c, const char *reason);

/* Drops the ops still in flight without waiting for them (nccl: ncclCommAbort;
 * the others finish each op before returning, so nothing is in flight), for a
 * rank that learned through another channel that a peer will never join them.
 * The communicator is unusable afterwards except for comm_close, which then
 * returns at once. Does not end the process or tell the other ranks. */
void comm_cancel(Comm *c);

/* True when this build has the backend (self always; mpi, nccl, gloo when found
 * at configure time). */
bool comm_built(CommKind kind);

/* Frees the communicator (after an error: call comm_abort instead). */
void comm_close(Comm *c);

/* The store the communicator rendezvoused through (its own or the one it was
 * given), or NULL (MPI, self): a second communicator of the same launch
 * passes it in CommOptions.store (rank 0 serves the store on MASTER_PORT, and
 * a second server there could not bind). */
Store *comm_store(const Comm *c);

int comm_rank(const Comm *c);
int comm_world_size(const Comm *c);
CommKind comm_kind(const Comm *c);
const char *comm_kind_name(CommKind kind);

#endif
