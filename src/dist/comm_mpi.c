/* comm_mpi.c — the MPI communicator (Open MPI), for CPU ranks started by
 * mpirun or srun: every collective is the non-blocking MPI call (MPI_Iallreduce,
 * MPI_Ireduce_scatter_block, MPI_Iallgather, MPI_Ibcast, MPI_Ibarrier) polled
 * with MPI_Test against a deadline, so a dead or hung rank becomes an error on
 * every other rank instead of a hang. Also MPI as the bootstrap that carries
 * NCCL's unique id under mpirun. Compiled to nothing without MPI (COLT_HAVE_MPI).
 * Not a general MPI wrapper: one duplicated world communicator, sums only. */
#include "dist/comm_internal.h"

#ifdef COLT_HAVE_MPI

#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* MPI is initialized once per process and finalized once: its users are
 * counted here (the one process-wide state in colt, because MPI's is), and MPI
 * is finalized only if colt initialized it, so a host program's MPI is left alone. */
static int session_users;
static bool session_colt_initialized;

typedef struct {
    MPI_Comm comm;
} MpiImpl;

static const char *mpi_error(int code, char *buf) {
    int len = 0;
    if (MPI_Error_string(code, buf, &len) != MPI_SUCCESS) snprintf(buf, MPI_MAX_ERROR_STRING, "MPI error %d", code);
    return buf;
}

static MPI_Datatype mpi_type(CommDtype dtype) {
    switch (dtype) {
    case COMM_FLOAT32: return MPI_FLOAT;
    case COMM_FLOAT64: return MPI_DOUBLE;
    case COMM_INT64: return MPI_INT64_T;
    case COMM_BYTE: return MPI_BYTE;
    case COMM_BFLOAT16: return MPI_UINT16_T; /* moved, never summed (comm.c checks) */
    }
    return MPI_BYTE;
}

int comm_mpi_session_begin(Comm *c, char *err) {
    char msg[MPI_MAX_ERROR_STRING];
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (finalized) return comm_fail(c, err, "MPI was already finalized in this process: open every communicator before closing the last");
    if (!initialized) {
        int provided = 0;
        int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided);
        if (rc != MPI_SUCCESS) return comm_fail(c, err, "MPI_Init_thread failed: %s", mpi_error(rc, msg));
        session_colt_initialized = true;
    }
    session_users++;
    int rank = -1, size = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (rank != c->rank || size != c->world_size) {
        comm_mpi_session_end();
        return comm_fail(c, err, "MPI sees rank %d of %d but the launch environment says rank %d of %d "
                         "(start colt with mpirun, or under srun pass --mpi=pmix)", rank, size, c->rank, c->world_size);
    }
    return COLT_OK;
}

void comm_mpi_session_end(void) {
    if (session_users > 0 && --session_users == 0 && session_colt_initialized) {
        MPI_Finalize();
        session_colt_initialized = false;
    }
}

void comm_mpi_abort_job(int status) {
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, status);
}

/* Polls req until it completes or the communicator's timeout passes. */
static int mpi_wait(Comm *c, MPI_Request *req, const char *what, char *err) {
    char msg[MPI_MAX_ERROR_STRING];
    double start = comm_now(), deadline = start + c->timeout_s;
    for (unsigned long spin = 0;; spin++) {
        int done = 0;
        int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) return comm_fail(c, err, "%s failed: %s", what, mpi_error(rc, msg));
        if (done) return COLT_OK;
        if (spin % 64) continue;
        double t = comm_now();
        if (t > deadline) return comm_fail(c, err, "%s did not complete within %g s (a rank died or hung?)", what, c->timeout_s);
        /* Spin through the first millisecond (small collectives end there), then
         * give the core away between tests: ranks may share cores (--oversubscribe). */
        if (t - start > 1e-3) comm_sleep(t - start > 1.0 ? 1e-3 : 5e-5);
    }
}

static int started(Comm *c, int rc, const char *what, char *err) {
    char msg[MPI_MAX_ERROR_STRING];
    if (rc != MPI_SUCCESS) return comm_fail(c, err, "%s could not start: %s", what, mpi_error(rc, msg));
    return COLT_OK;
}

/* MPI counts are int: large buffers go in pieces of at most INT_MAX elements. */
#define MPI_PIECE ((size_t)INT_MAX)

static int mpi_all_reduce(Comm *c, void *data, size_t count, CommDtype dtype, void *stream, char *err) {
    MpiImpl *m = c->impl;
    char what[96];
    comm_describe(what, sizeof what, "all_reduce", count, dtype);
    char *p = data;
    for (size_t done = 0; done < count;) {
        int n = (int)(count - done < MPI_PIECE ? count - done : MPI_PIECE);
        MPI_Request req;
        if (started(c, MPI_Iallreduce(MPI_IN_PLACE, p, n, mpi_type(dtype), MPI_SUM, m->comm, &req), what, err) != COLT_OK ||
            mpi_wait(c, &req, what, err) != COLT_OK)
            return COLT_ERR;
        done += (size_t)n;
        p += (size_t)n * comm_dtype_size(dtype);
    }
    return COLT_OK;
}

static int mpi_reduce(Comm *c, void *data, size_t count, CommDtype dtype, int root, void *stream, char *err) {
    MpiImpl *m = c->impl;
    char what[128];
    comm_describe(what, sizeof what, "reduce", count, dtype);
    snprintf(what + strlen(what), sizeof what - strlen(what), " to rank %d", root);
    char *p = data;
    for (size_t done = 0; done < count;) {
        int n = (int)(count - done < MPI_PIECE ? count - done : MPI_PIECE);
        MPI_Request req;
        if (started(c, MPI_Ireduce(c->rank == root ? MPI_IN_PLACE : p, p, n, mpi_type(dtype), MPI_SUM, root, m->comm, &req),
                    what, err) != COLT_OK ||
            mpi_wait(c, &req, what, err) != COLT_OK)
            return COLT_ERR;
        done += (size_t)n;
        p += (size_t)n * comm_dtype_size(dtype);
    }
    return COLT_OK;
}

static int mpi_reduce_scatter(Comm *c, void *out, const void *in, size_t count, CommDtype dtype, void *stream, char *err) {
    MpiImpl *m = c->impl;
    char what[96];
    comm_describe(what, sizeof what, "reduce_scatter", count, dtype);
    if (count > MPI_PIECE) return comm_fail(c, err, "%s: MPI takes at most %d elements per rank", what, INT_MAX);
    MPI_Request req;
    if (started(c, MPI_Ireduce_scatter_block(in, out, (int)count, mpi_type(dtype), MPI_SUM, m->comm, &req), what, err) != COLT_OK)
        return COLT_ERR;
    return mpi_wait(c, &req, what, err);
}

static int mpi_all_gather(Comm *c, void *out, const void *in, size_t count, CommDtype dtype, void *stream, char *err) {
    MpiImpl *m = c->impl;
    char what[96];
    comm_describe(what, sizeof what, "all_gather", count, dtype);
    if (count > MPI_PIECE) return comm_fail(c, err, "%s: MPI takes at most %d elements per rank", what, INT_MAX);
    MPI_Datatype t = mpi_type(dtype);
    MPI_Request req;
    if (started(c, MPI_Iallgather(in, (int)count, t, out, (int)count, t, m->comm, &req), what, err) != COLT_OK) return COLT_ERR;
    return mpi_wait(c, &req, what, err);
}

static int bcast_on(Comm *c, MPI_Comm comm, void *data, size_t count, CommDtype dtype, int root, const char *what, char *err) {
    char *p = data;
    for (size_t done = 0; done < count;) {
        int n = (int)(count - done < MPI_PIECE ? count - done : MPI_PIECE);
        MPI_Request req;
        if (started(c, MPI_Ibcast(p, n, mpi_type(dtype), root, comm, &req), what, err) != COLT_OK ||
            mpi_wait(c, &req, what, err) != COLT_OK)
            return COLT_ERR;
        done += (size_t)n;
        p += (size_t)n * comm_dtype_size(dtype);
    }
    return COLT_OK;
}

static int mpi_broadcast(Comm *c, void *data, size_t count, CommDtype dtype, int root, void *stream, char *err) {
    char what[128];
    comm_describe(what, sizeof what, "broadcast", count, dtype);
    snprintf(what + strlen(what), sizeof what - strlen(what), " from rank %d", root);
    return bcast_on(c, ((MpiImpl *)c->impl)->comm, data, count, dtype, root, what, err);
}

static int mpi_barrier(Comm *c, char *err) {
    MpiImpl *m = c->impl;
    MPI_Request req;
    if (started(c, MPI_Ibarrier(m->comm, &req), "barrier", err) != COLT_OK) return COLT_ERR;
    return mpi_wait(c, &req, "barrier", err);
}

static void mpi_abort(Comm *c, const char *reason) { comm_mpi_abort_job(1); }

static const CommOps MPI_OPS;
/* MPI_Comm_split has no bounded form: a bounded all-gather of the colors
 * first, so a dead rank is an error here rather than a hang inside it. */
static int mpi_split(Comm *c, int color, int key, Comm *child, char *err) {
    MpiImpl *m = c->impl;
    int64_t mine[2] = {color, key}, *all = xcalloc((size_t)c->world_size * 2, sizeof(int64_t));
    int rc = mpi_all_gather(c, all, mine, 2, COMM_INT64, NULL, err);
    free(all);
    if (rc != COLT_OK) return COLT_ERR;
    MpiImpl *sub = xcalloc(1, sizeof *sub);
    char msg[MPI_MAX_ERROR_STRING];
    int code = MPI_Comm_split(m->comm, color, key, &sub->comm);
    if (code != MPI_SUCCESS) {
        free(sub);
        return comm_fail(c, err, "MPI_Comm_split failed: %s", mpi_error(code, msg));
    }
    MPI_Comm_set_errhandler(sub->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(sub->comm, &child->rank);
    MPI_Comm_size(sub->comm, &child->world_size);
    session_users++; /* the child's close ends its share of the MPI session */
    child->impl = sub;
    child->ops = &MPI_OPS;
    return COLT_OK;
}

static void mpi_close(Comm *c) {
    MpiImpl *m = c->impl;
    MPI_Comm_free(&m->comm);
    free(m);
    comm_mpi_session_end();
}

static const CommOps MPI_OPS = {
    .all_reduce = mpi_all_reduce,
    .reduce = mpi_reduce,
    .reduce_scatter = mpi_reduce_scatter,
    .all_gather = mpi_all_gather,
    .broadcast = mpi_broadcast,
    .barrier = mpi_barrier,
    .split = mpi_split,
    .abort = mpi_abort,
    .close = mpi_close,
};

int comm_mpi_open(Comm *c, const CommOptions *opt, char *err) {
    if (c->gpu) return comm_fail(c, err, "the MPI communicator moves host memory: GPU ranks use NCCL");
    if (comm_mpi_session_begin(c, err) != COLT_OK) return COLT_ERR;
    MpiImpl *m = xcalloc(1, sizeof *m);
    /* A communicator of colt's own: no tag clashes with a host program's MPI,
     * and errors come back as codes instead of ending the process. */
    MPI_Comm_dup(MPI_COMM_WORLD, &m->comm);
    MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN);
    c->impl = m;
    c->ops = &MPI_OPS;
    /* Every rank arrived (bounded): a rank missing from the job shows here. */
    return mpi_barrier(c, err); /* on a timeout the barrier stays pending: the caller aborts */
}

int comm_mpi_bootstrap_bcast(Comm *c, void *data, size_t bytes, int root, const char *what, char *err) {
    return bcast_on(c, MPI_COMM_WORLD, data, bytes, COMM_BYTE, root, what, err);
}

#else
typedef int comm_mpi_not_built; /* ISO C wants a declaration in every file */
#endif
