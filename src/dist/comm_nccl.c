/* comm_nccl.c — the NCCL communicator for GPU ranks (CUDA builds with NCCL,
 * COLT_HAVE_NCCL). Ops are enqueued on the caller's cudaStream_t; comm_wait
 * waits for them. Every wait is bounded: the communicator is non-blocking
 * (ncclCommInitRankConfig with blocking = 0), its state is polled with
 * ncclCommGetAsyncError, and on a timeout it is ncclCommAbort'ed. The unique id
 * travels over MPI under mpirun, otherwise over colt's store, where an abort
 * key set by a failing rank also stops the others' waits.
 * NCCL's own environment (NCCL_NVLS_ENABLE, NCCL_DEBUG, ...) is left as the user
 * set it. Not here: device choice beyond the local rank, groups, user buffers. */
#include "dist/comm_internal.h"

#ifdef COLT_HAVE_NCCL

#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    ncclComm_t comm;    /* NULL once aborted */
    cudaEvent_t done;   /* recorded on the stream by comm_wait */
    char last_op[128];  /* the latest op enqueued, for messages */
    int pending;        /* ops enqueued since the last wait */
    bool via_mpi;       /* the id came over MPI: MPI_Abort ends the job */
} NcclImpl;

static ncclDataType_t nccl_type(CommDtype dtype) {
    switch (dtype) {
    case COMM_FLOAT32: return ncclFloat32;
    case COMM_FLOAT64: return ncclFloat64;
    case COMM_INT64: return ncclInt64;
    case COMM_BYTE: return ncclUint8;
    case COMM_BFLOAT16: return ncclBfloat16;
    }
    return ncclUint8;
}

static void nccl_abort_comm(NcclImpl *n) {
    if (n->comm) ncclCommAbort(n->comm);
    n->comm = NULL;
}

/* A rank that failed set the store's abort key (comm_abort): say so, and what
 * this rank was waiting for. */
static int peer_aborted(Comm *c, const char *what, char *err) {
    if (!c->store) return COLT_OK;
    bool present = false;
    char ignored[ERR_LEN];
    if (store_check(c->store, &present, "abort", ignored) != COLT_OK || !present) return COLT_OK;
    void *msg = NULL;
    size_t len = 0;
    if (store_get(c->store, &msg, &len, "abort", ignored) != COLT_OK)
        return comm_fail(c, err, "%s stopped: another rank aborted the job", what);
    comm_fail(c, err, "%s stopped: another rank aborted the job (%s)", what, (char *)msg);
    free(msg);
    return COLT_ERR;
}

/* Polls the communicator until its pending call leaves ncclInProgress (also
 * until the event, when given, completed). Aborts the communicator at deadline. */
static int nccl_poll(Comm *c, NcclImpl *n, cudaEvent_t event, const char *what, double deadline, char *err) {
    double next_store_check = comm_now() + 1.0;
    for (unsigned long spin = 0;; spin++) {
        ncclResult_t state = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError(n->comm, &state);
        if (r != ncclSuccess) state = r;
        if (state != ncclSuccess && state != ncclInProgress) {
            const char *detail = ncclGetLastError(n->comm);
            nccl_abort_comm(n);
            return comm_fail(c, err, "%s failed: %s%s%s (a rank died?)", what, ncclGetErrorString(state),
                             detail && detail[0] ? ": " : "", detail ? detail : "");
        }
        bool ready = state == ncclSuccess;
        if (ready && event) {
            cudaError_t e = cudaEventQuery(event);
            if (e != cudaSuccess && e != cudaErrorNotReady) {
                nccl_abort_comm(n);
                return comm_fail(c, err, "%s failed on the GPU: %s", what, cudaGetErrorString(e));
            }
            ready = e == cudaSuccess;
        }
        if (ready) return COLT_OK;
        if (spin % 64) continue;
        double t = comm_now();
        if (t > deadline) {
            nccl_abort_comm(n);
            return comm_fail(c, err, "%s did not complete within %g s (a rank died or hung?)", what, c->timeout_s);
        }
        if (t > next_store_check) {
            next_store_check = t + 1.0;
            if (peer_aborted(c, what, err) != COLT_OK) {
                nccl_abort_comm(n);
                return COLT_ERR;
            }
        }
        comm_sleep(5e-5);
    }
}

/* After enqueueing: a non-blocking communicator may still be enqueueing. */
static int enqueued(Comm *c, ncclResult_t r, const char *what, char *err) {
    NcclImpl *n = c->impl;
    if (r != ncclSuccess && r != ncclInProgress) {
        const char *detail = ncclGetLastError(n->comm);
        return comm_fail(c, err, "%s could not start: %s%s%s", what, ncclGetErrorString(r), detail && detail[0] ? ": " : "",
                         detail ? detail : "");
    }
    snprintf(n->last_op, sizeof n->last_op, "%s", what);
    n->pending++;
    if (r == ncclSuccess) return COLT_OK;
    return nccl_poll(c, n, NULL, what, comm_now() + c->timeout_s, err);
}

static int nccl_all_reduce(Comm *c, void *data, size_t count, CommDtype dtype, void *stream, char *err) {
    NcclImpl *n = c->impl;
    char what[96];
    comm_describe(what, sizeof what, "all_reduce", count, dtype);
    return enqueued(c, ncclAllReduce(data, data, count, nccl_type(dtype), ncclSum, n->comm, (cudaStream_t)stream), what, err);
}

static int nccl_reduce(Comm *c, void *data, size_t count, CommDtype dtype, int root, void *stream, char *err) {
    NcclImpl *n = c->impl;
    char what[128];
    comm_describe(what, sizeof what, "reduce", count, dtype);
    snprintf(what + strlen(what), sizeof what - strlen(what), " to rank %d", root);
    return enqueued(c, ncclReduce(data, data, count, nccl_type(dtype), ncclSum, root, n->comm, (cudaStream_t)stream), what,
                    err);
}

static int nccl_reduce_scatter(Comm *c, void *out, const void *in, size_t count, CommDtype dtype, void *stream, char *err) {
    NcclImpl *n = c->impl;
    char what[96];
    comm_describe(what, sizeof what, "reduce_scatter", count, dtype);
    return enqueued(c, ncclReduceScatter(in, out, count, nccl_type(dtype), ncclSum, n->comm, (cudaStream_t)stream), what, err);
}

static int nccl_all_gather(Comm *c, void *out, const void *in, size_t count, CommDtype dtype, void *stream, char *err) {
    NcclImpl *n = c->impl;
    char what[96];
    comm_describe(what, sizeof what, "all_gather", count, dtype);
    return enqueued(c, ncclAllGather(in, out, count, nccl_type(dtype), n->comm, (cudaStream_t)stream), what, err);
}

static int nccl_broadcast(Comm *c, void *data, size_t count, CommDtype dtype, int root, void *stream, char *err) {
    NcclImpl *n = c->impl;
    char what[128];
    comm_describe(what, sizeof what, "broadcast", count, dtype);
    snprintf(what + strlen(what), sizeof what - strlen(what), " from rank %d", root);
    return enqueued(c, ncclBroadcast(data, data, count, nccl_type(dtype), root, n->comm, (cudaStream_t)stream), what, err);
}

static int nccl_wait(Comm *c, void *stream, char *err) {
    NcclImpl *n = c->impl;
    if (!n->pending) return COLT_OK;
    char what[192];
    if (n->pending > 1) snprintf(what, sizeof what, "%s (and %d earlier ops)", n->last_op, n->pending - 1);
    else snprintf(what, sizeof what, "%s", n->last_op);
    cudaError_t e = cudaEventRecord(n->done, (cudaStream_t)stream);
    if (e != cudaSuccess) return comm_fail(c, err, "waiting for %s: %s", what, cudaGetErrorString(e));
    if (nccl_poll(c, n, n->done, what, comm_now() + c->timeout_s, err) != COLT_OK) return COLT_ERR;
    n->pending = 0;
    return COLT_OK;
}

/* A barrier: an all_reduce of one float through a scratch word, waited for. */
static int nccl_barrier(Comm *c, char *err) {
    float *word = NULL;
    cudaError_t e = cudaMalloc((void **)&word, sizeof *word);
    if (e != cudaSuccess) return comm_fail(c, err, "barrier: cudaMalloc of 4 bytes failed: %s", cudaGetErrorString(e));
    cudaMemset(word, 0, sizeof *word);
    NcclImpl *n = c->impl;
    int rc = enqueued(c, ncclAllReduce(word, word, 1, ncclFloat32, ncclSum, n->comm, NULL), "barrier", err);
    if (rc == COLT_OK) rc = nccl_wait(c, NULL, err);
    cudaFree(word);
    return rc;
}

static void nccl_abort(Comm *c, const char *reason) {
    NcclImpl *n = c->impl;
    nccl_abort_comm(n);
#ifdef COLT_HAVE_MPI
    if (n->via_mpi) comm_mpi_abort_job(1);
#endif
}

static void nccl_cancel(Comm *c) {
    NcclImpl *n = c->impl;
    nccl_abort_comm(n);
    n->pending = 0;
}

static void nccl_close(Comm *c) {
    NcclImpl *n = c->impl;
    if (n->comm) {
        char err[ERR_LEN];
        ncclResult_t r = ncclCommFinalize(n->comm);
        if (r == ncclInProgress) nccl_poll(c, n, NULL, "finalizing NCCL", comm_now() + c->timeout_s, err);
        if (n->comm) ncclCommDestroy(n->comm);
    }
    cudaEventDestroy(n->done);
#ifdef COLT_HAVE_MPI
    if (n->via_mpi) comm_mpi_session_end();
#endif
    free(n);
}

static const CommOps NCCL_OPS;

/* ncclCommSplit, non-blocking like the parent and its wait bounded the same way. */
static int nccl_split(Comm *c, int color, int key, Comm *child, char *err) {
    NcclImpl *n = c->impl, *s = xcalloc(1, sizeof *s);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t r = ncclCommSplit(n->comm, color, key, &s->comm, &config);
    char what[96];
    snprintf(what, sizeof what, "NCCL's split of %d ranks into groups", c->world_size);
    if (r != ncclSuccess && r != ncclInProgress) {
        free(s);
        return comm_fail(c, err, "%s failed: %s", what, ncclGetErrorString(r));
    }
    /* Non-blocking: the parent carries the split's progress; the new handle exists once it is done. */
    double deadline = comm_now() + c->timeout_s;
    if (nccl_poll(c, n, NULL, what, deadline, err) != COLT_OK) {
        free(s);
        return COLT_ERR;
    }
    cudaError_t e = cudaSuccess;
    if (!s->comm) {
        free(s);
        return comm_fail(c, err, "%s gave no communicator", what);
    }
    if (nccl_poll(c, s, NULL, what, deadline, err) != COLT_OK ||
        (e = cudaEventCreateWithFlags(&s->done, cudaEventDisableTiming)) != cudaSuccess) {
        if (e != cudaSuccess) comm_fail(c, err, "cudaEventCreate failed: %s", cudaGetErrorString(e));
        nccl_abort_comm(s);
        free(s);
        return COLT_ERR;
    }
    ncclCommUserRank(s->comm, &child->rank);
    ncclCommCount(s->comm, &child->world_size);
    child->impl = s;
    child->ops = &NCCL_OPS;
    return COLT_OK;
}

static const CommOps NCCL_OPS = {
    .all_reduce = nccl_all_reduce,
    .reduce = nccl_reduce,
    .reduce_scatter = nccl_reduce_scatter,
    .all_gather = nccl_all_gather,
    .broadcast = nccl_broadcast,
    .barrier = nccl_barrier,
    .split = nccl_split,
    .wait = nccl_wait,
    .abort = nccl_abort,
    .cancel = nccl_cancel,
    .close = nccl_close,
};

/* Rank 0 makes the unique id; the others receive it over MPI or the store. */
static int share_unique_id(Comm *c, NcclImpl *n, const CommOptions *opt, ncclUniqueId *id, char *err) {
    if (c->rank == 0) {
        ncclResult_t r = ncclGetUniqueId(id);
        if (r != ncclSuccess) return comm_fail(c, err, "ncclGetUniqueId failed: %s", ncclGetErrorString(r));
    }
#ifdef COLT_HAVE_MPI
    if (!opt->store && c->env->launcher == LAUNCHER_OPENMPI) {
        if (comm_mpi_session_begin(c, err) != COLT_OK) return COLT_ERR;
        n->via_mpi = true;
        return comm_mpi_bootstrap_bcast(c, id, sizeof *id, 0, "broadcast of NCCL's unique id from rank 0", err);
    }
#endif
    if (comm_need_store(c, opt, err) != COLT_OK) return COLT_ERR;
    /* The n-th communicator a rank opens reads nccl/<n>/id: the same n on every rank. */
    char key[64];
    int64_t nth = 0;
    snprintf(key, sizeof key, "nccl/opened/%d", c->rank);
    if (store_add(c->store, &nth, key, 1, err) != COLT_OK) return COLT_ERR;
    snprintf(key, sizeof key, "nccl/%lld/id", (long long)nth);
    if (c->rank == 0) return store_set(c->store, key, id, sizeof *id, err);
    void *value = NULL;
    size_t len = 0;
    if (store_get(c->store, &value, &len, key, err) != COLT_OK) return COLT_ERR;
    if (len != sizeof *id) {
        free(value);
        return comm_fail(c, err, "NCCL's unique id in the store has %zu bytes, not %zu (a colt of another version?)", len, sizeof *id);
    }
    memcpy(id, value, sizeof *id);
    free(value);
    return COLT_OK;
}

int comm_nccl_open(Comm *c, const CommOptions *opt, char *err) {
    if (!c->gpu) return comm_fail(c, err, "the NCCL communicator moves device memory: set gpu in the options");
    int devices = 0;
    cudaError_t e = cudaGetDeviceCount(&devices);
    if (e != cudaSuccess) return comm_fail(c, err, "no CUDA device: %s", cudaGetErrorString(e));
    if (c->cuda_device >= devices) {
        const char *visible = getenv("CUDA_VISIBLE_DEVICES");
        return comm_fail(c, err, "wants GPU %d (local rank %d) but sees %d GPU%s (CUDA_VISIBLE_DEVICES=%s): start at most "
                         "one rank per GPU on each node", c->cuda_device, c->env->local_rank, devices, devices == 1 ? "" : "s",
                         visible ? visible : "unset");
    }
    if ((e = cudaSetDevice(c->cuda_device)) != cudaSuccess)
        return comm_fail(c, err, "cudaSetDevice(%d) failed: %s", c->cuda_device, cudaGetErrorString(e));
    NcclImpl *n = xcalloc(1, sizeof *n);
    c->impl = n;
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (share_unique_id(c, n, opt, &id, err) != COLT_OK) goto fail;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0; /* every NCCL call returns at once; nccl_poll bounds the wait */
    ncclResult_t r = ncclCommInitRankConfig(&n->comm, c->world_size, id, c->rank, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
        comm_fail(c, err, "ncclCommInitRankConfig failed: %s", ncclGetErrorString(r));
        goto fail;
    }
    char what[96];
    snprintf(what, sizeof what, "NCCL's setup of %d ranks", c->world_size);
    if (nccl_poll(c, n, NULL, what, comm_now() + c->timeout_s, err) != COLT_OK) goto fail;
    if ((e = cudaEventCreateWithFlags(&n->done, cudaEventDisableTiming)) != cudaSuccess) {
        comm_fail(c, err, "cudaEventCreate failed: %s", cudaGetErrorString(e));
        nccl_abort_comm(n);
        goto fail;
    }
    c->ops = &NCCL_OPS;
    return COLT_OK;
fail:
    /* MPI stays up if the id came over it: after an error the caller aborts the job. */
    free(n);
    c->impl = NULL;
    return COLT_ERR;
}

#else
typedef int comm_nccl_not_built; /* ISO C wants a declaration in every file */
#endif
