/* comm.c — the communicator front: choosing a backend for a launch, opening it,
 * checking every op's arguments, abort, and the world-of-one communicator
 * ("self") whose ops copy or do nothing. The backends live in comm_mpi.c,
 * comm_nccl.c and comm_gloo.cc; this file makes no MPI, NCCL or Gloo call. */
#include "dist/comm_internal.h"

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifdef COLT_HAVE_CUDA
#include <cuda_runtime.h>
#endif

/* ------------------------------------------------------------------ helpers */

double comm_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void comm_sleep(double seconds) {
    struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

int comm_fail(const Comm *c, char *err, const char *fmt, ...) {
    char msg[ERR_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return errorf(err, "rank %d on host %s: %s", c->rank, c->host, msg);
}

size_t comm_dtype_size(CommDtype dtype) {
    switch (dtype) {
    case COMM_FLOAT32: return 4;
    case COMM_FLOAT64: return 8;
    case COMM_INT64: return 8;
    case COMM_BYTE: return 1;
    case COMM_BFLOAT16: return 2;
    }
    return 0;
}

static const char *dtype_plural(CommDtype dtype) {
    switch (dtype) {
    case COMM_FLOAT32: return "floats";
    case COMM_FLOAT64: return "doubles";
    case COMM_INT64: return "int64s";
    case COMM_BYTE: return "bytes";
    case COMM_BFLOAT16: return "bfloat16s";
    }
    return "elements";
}

void comm_describe(char *out, size_t out_len, const char *op, size_t count, CommDtype dtype) {
    snprintf(out, out_len, "%s of %zu %s", op, count, dtype_plural(dtype));
}

const char *comm_kind_name(CommKind kind) {
    switch (kind) {
    case COMM_AUTO: return "auto";
    case COMM_SELF: return "self";
    case COMM_MPI: return "mpi";
    case COMM_NCCL: return "nccl";
    case COMM_GLOO: return "gloo";
    }
    return "?";
}

int comm_need_store(Comm *c, const CommOptions *opt, char *err) {
    if (opt->store) {
        c->store = opt->store;
        return COLT_OK;
    }
    if (store_open_for_launch(&c->store, c->env, c->timeout_s, err) != COLT_OK) return COLT_ERR;
    c->owns_store = true;
    return COLT_OK;
}

/* ------------------------------------------------------------------ self */

/* A world of one: the sum over one rank is its own data, so reductions,
 * gathers and broadcasts are copies (or nothing when in place). */
static int self_copy(Comm *c, void *out, const void *in, size_t bytes, void *stream, char *err) {
    if (out == in || !bytes) return COLT_OK;
#ifdef COLT_HAVE_CUDA
    if (c->gpu) {
        cudaError_t e = cudaMemcpyAsync(out, in, bytes, cudaMemcpyDefault, (cudaStream_t)stream);
        if (e != cudaSuccess) return comm_fail(c, err, "copy of %zu bytes on the GPU failed: %s", bytes, cudaGetErrorString(e));
        return COLT_OK;
    }
#endif
    memmove(out, in, bytes);
    return COLT_OK;
}

static int self_all_reduce(Comm *c, void *data, size_t count, CommDtype dtype, void *stream, char *err) { return COLT_OK; }

static int self_reduce(Comm *c, void *data, size_t count, CommDtype dtype, int root, void *stream, char *err) {
    return COLT_OK;
}

static int self_reduce_scatter(Comm *c, void *out, const void *in, size_t count, CommDtype dtype, void *stream, char *err) {
    return self_copy(c, out, in, count * comm_dtype_size(dtype), stream, err);
}

static int self_all_gather(Comm *c, void *out, const void *in, size_t count, CommDtype dtype, void *stream, char *err) {
    return self_copy(c, out, in, count * comm_dtype_size(dtype), stream, err);
}

static int self_broadcast(Comm *c, void *data, size_t count, CommDtype dtype, int root, void *stream, char *err) { return COLT_OK; }

static int self_barrier(Comm *c, char *err) { return COLT_OK; }

static const CommOps SELF_OPS;
static int self_split(Comm *c, int color, int key, Comm *child, char *err) {
    child->ops = &SELF_OPS;
    child->rank = 0;
    child->world_size = 1;
    return COLT_OK;
}

static void self_close(Comm *c) {}

static const CommOps SELF_OPS = {
    .all_reduce = self_all_reduce,
    .reduce = self_reduce,
    .reduce_scatter = self_reduce_scatter,
    .all_gather = self_all_gather,
    .broadcast = self_broadcast,
    .barrier = self_barrier,
    .split = self_split,
    .close = self_close,
};

/* ------------------------------------------------------------------ open */

int comm_choose_kind(CommKind *out, const LaunchEnv *env, bool gpu, char *err) {
    if (env->world_size == 1) {
        *out = COMM_SELF;
        return COLT_OK;
    }
    if (gpu) {
#ifdef COLT_HAVE_NCCL
        *out = COMM_NCCL;
        return COLT_OK;
#else
        return errorf(err, "rank %d: GPU ranks communicate through NCCL, and this colt was built without it "
                      "(configure with -DCOLT_CUDA=ON where nccl.h and libnccl are installed)", env->rank);
#endif
    }
    if (env->launcher == LAUNCHER_OPENMPI || env->launcher == LAUNCHER_SLURM) {
#ifdef COLT_HAVE_MPI
        *out = COMM_MPI;
        return COLT_OK;
#else
        return errorf(err, "rank %d: CPU ranks under %s communicate through MPI, and this colt was built without it "
                      "(install libopenmpi-dev, e.g. with scripts/setup.sh, and rebuild)", env->rank, launcher_name(env->launcher));
#endif
    }
#ifdef COLT_HAVE_GLOO
    *out = COMM_GLOO;
    return COLT_OK;
#else
    return errorf(err, "rank %d: CPU ranks need mpirun or srun with MPI; under %s use GPUs (this colt was built "
                  "without Gloo, which would carry CPU collectives there: install libgloo-dev and rebuild)",
                  env->rank, launcher_name(env->launcher));
#endif
}

int comm_open(Comm **out, const LaunchEnv *env, const CommOptions *opt, char *err) {
    CommOptions o = *opt;
    if (o.kind == COMM_AUTO && comm_choose_kind(&o.kind, env, o.gpu, err) != COLT_OK) return COLT_ERR;
    Comm *c = xcalloc(1, sizeof *c);
    c->kind = o.kind;
    c->rank = env->rank;
    c->world_size = env->world_size;
    c->timeout_s = o.timeout_s > 0 ? o.timeout_s : COMM_DEFAULT_TIMEOUT_S;
    c->gpu = o.gpu;
    c->cuda_device = o.cuda_device >= 0 ? o.cuda_device : env->local_rank;
    c->env = env;
    if (gethostname(c->host, sizeof c->host) != 0) snprintf(c->host, sizeof c->host, "?");
    c->host[sizeof c->host - 1] = '\0';
    int rc = COLT_ERR;
    switch (o.kind) {
    case COMM_SELF:
        if (env->world_size != 1) {
            comm_fail(c, err, "the self communicator is for a world of one, and this launch has %d ranks", env->world_size);
            break;
        }
#ifndef COLT_HAVE_CUDA
        if (o.gpu) {
            comm_fail(c, err, "a GPU rank needs a CUDA build of colt (configure with -DCOLT_CUDA=ON)");
            break;
        }
#endif
        c->ops = &SELF_OPS;
        rc = COLT_OK;
        break;
    case COMM_MPI:
#ifdef COLT_HAVE_MPI
        rc = comm_mpi_open(c, &o, err);
#else
        comm_fail(c, err, "this colt was built without MPI (libopenmpi-dev was not found when it was configured): "
                  "install it, e.g. with scripts/setup.sh, and rebuild");
#endif
        break;
    case COMM_NCCL:
#ifdef COLT_HAVE_NCCL
        rc = comm_nccl_open(c, &o, err);
#else
        comm_fail(c, err, "this colt was built without NCCL: configure with -DCOLT_CUDA=ON where nccl.h and libnccl are installed");
#endif
        break;
    case COMM_GLOO:
#ifdef COLT_HAVE_GLOO
        rc = comm_gloo_open(c, &o, err);
#else
        comm_fail(c, err, "CPU ranks need mpirun or srun with MPI; under torchrun use GPUs (this colt was built without "
                  "Gloo: install libgloo-dev and rebuild to run CPU ranks under torchrun)");
#endif
        break;
    case COMM_AUTO:
        break;
    }
    c->env = NULL;
    if (rc != COLT_OK) {
        if (c->owns_store) store_close(c->store);
        free(c);
        return COLT_ERR;
    }
    *out = c;
    return COLT_OK;
}

/* ------------------------------------------------------------------ ops */

static int check_op(Comm *c, const char *op, bool sums, CommDtype dtype, size_t count, const void *a, const void *b, char *err) {
    if (c->broken) return comm_fail(c, err, "%s on a communicator that failed earlier: call comm_abort after an error", op);
    if ((unsigned)dtype > COMM_BFLOAT16) return comm_fail(c, err, "%s: unknown element type %d", op, (int)dtype);
    if (sums && dtype == COMM_BYTE) return comm_fail(c, err, "%s sums numbers: bytes cannot be summed", op);
    if (sums && dtype == COMM_BFLOAT16 && c->kind != COMM_NCCL && c->kind != COMM_SELF)
        return comm_fail(c, err, "%s of bfloat16s: only the nccl communicator sums them", op);
    if (count && (!a || !b)) return comm_fail(c, err, "%s of %zu elements with a NULL buffer", op, count);
    if (count > SIZE_MAX / 8 / (size_t)c->world_size) return comm_fail(c, err, "%s of %zu elements is too large", op, count);
    return COLT_OK;
}

static int after(Comm *c, int rc) {
    if (rc != COLT_OK) c->broken = true;
    return rc;
}

int comm_all_reduce(Comm *c, void *data, size_t count, CommDtype dtype, void *stream, char *err) {
    if (check_op(c, "all_reduce", true, dtype, count, data, data, err) != COLT_OK) return COLT_ERR;
    if (!count) return COLT_OK;
    return after(c, c->ops->all_reduce(c, data, count, dtype, stream, err));
}

int comm_reduce(Comm *c, void *data, size_t count, CommDtype dtype, int root, void *stream, char *err) {
    if (check_op(c, "reduce", true, dtype, count, data, data, err) != COLT_OK) return COLT_ERR;
    if (root < 0 || root >= c->world_size) return comm_fail(c, err, "reduce to rank %d, which is not in 0..%d", root, c->world_size - 1);
    if (!count) return COLT_OK;
    return after(c, c->ops->reduce(c, data, count, dtype, root, stream, err));
}

int comm_reduce_scatter(Comm *c, void *out, const void *in, size_t count, CommDtype dtype, void *stream, char *err) {
    if (check_op(c, "reduce_scatter", true, dtype, count, out, in, err) != COLT_OK) return COLT_ERR;
    if (!count) return COLT_OK;
    return after(c, c->ops->reduce_scatter(c, out, in, count, dtype, stream, err));
}

int comm_all_gather(Comm *c, void *out, const void *in, size_t count, CommDtype dtype, void *stream, char *err) {
    if (check_op(c, "all_gather", false, dtype, count, out, in, err) != COLT_OK) return COLT_ERR;
    if (!count) return COLT_OK;
    return after(c, c->ops->all_gather(c, out, in, count, dtype, stream, err));
}

int comm_broadcast(Comm *c, void *data, size_t count, CommDtype dtype, int root, void *stream, char *err) {
    if (check_op(c, "broadcast", false, dtype, count, data, data, err) != COLT_OK) return COLT_ERR;
    if (root < 0 || root >= c->world_size) return comm_fail(c, err, "broadcast from rank %d, which is not in 0..%d", root, c->world_size - 1);
    if (!count) return COLT_OK;
    return after(c, c->ops->broadcast(c, data, count, dtype, root, stream, err));
}

int comm_barrier(Comm *c, char *err) {
    if (c->broken) return comm_fail(c, err, "barrier on a communicator that failed earlier: call comm_abort after an error");
    return after(c, c->ops->barrier(c, err));
}

int comm_wait(Comm *c, void *stream, char *err) {
    if (c->broken) return comm_fail(c, err, "wait on a communicator that failed earlier: call comm_abort after an error");
    if (!c->ops->wait) return COLT_OK;
    return after(c, c->ops->wait(c, stream, err));
}

void comm_abort(Comm *c, const char *reason) {
    fflush(stdout);
    if (c) {
        /* The reason is usually an error of this communicator: say who only once. */
        char who[128];
        int n = snprintf(who, sizeof who, "rank %d on host %s: ", c->rank, c->host);
        if (n > 0 && (size_t)n < sizeof who && !strncmp(reason, who, (size_t)n)) reason += n;
    }
    if (c) fprintf(stderr, "colt: rank %d on host %s: aborting the job: %s\n", c->rank, c->host, reason);
    else fprintf(stderr, "colt: aborting: %s\n", reason);
    fflush(stderr);
    if (c && c->store) {
        /* Ranks that wait on the store (NCCL's bounded waits) see this key and stop. */
        char msg[ERR_LEN], ignored[ERR_LEN];
        snprintf(msg, sizeof msg, "rank %d on host %s: %s", c->rank, c->host, reason);
        store_set(c->store, "abort", msg, strlen(msg), ignored);
    }
    if (c && c->ops && c->ops->abort) c->ops->abort(c, reason); /* MPI_Abort does not return */
    /* _exit: no atexit handlers or leak checks racing the other ranks' teardown. */
    _exit(1);
}

void comm_cancel(Comm *c) {
    if (!c) return;
    if (c->ops->cancel) c->ops->cancel(c);
    c->broken = true;
}

bool comm_built(CommKind kind) {
    switch (kind) {
    case COMM_SELF: return true;
#ifdef COLT_HAVE_MPI
    case COMM_MPI: return true;
#endif
#ifdef COLT_HAVE_NCCL
    case COMM_NCCL: return true;
#endif
#ifdef COLT_HAVE_GLOO
    case COMM_GLOO: return true;
#endif
    default: return false;
    }
}

int comm_split(Comm *c, int color, int key, Comm **out, char *err) {
    *out = NULL;
    if (c->broken) return comm_fail(c, err, "split on a communicator that failed earlier: call comm_abort after an error");
    if (color < 0) return comm_fail(c, err, "split with color %d: colors are >= 0", color);
    if (!c->ops->split)
        return comm_fail(c, err, "splitting a %s communicator into groups is not supported yet", comm_kind_name(c->kind));
    Comm *child = xcalloc(1, sizeof *child);
    child->kind = c->kind;
    child->timeout_s = c->timeout_s;
    child->gpu = c->gpu;
    child->cuda_device = c->cuda_device;
    child->store = c->store; /* not owned: the parent's rendezvous (a Gloo split connects through it) */
    memcpy(child->host, c->host, sizeof child->host);
    if (after(c, c->ops->split(c, color, key, child, err)) != COLT_OK) {
        free(child);
        return COLT_ERR;
    }
    *out = child;
    return COLT_OK;
}

void comm_close(Comm *c) {
    if (!c) return;
    c->ops->close(c);
    if (c->owns_store) store_close(c->store);
    free(c);
}

Store *comm_store(const Comm *c) { return c->store; }
int comm_rank(const Comm *c) { return c->rank; }
int comm_world_size(const Comm *c) { return c->world_size; }
CommKind comm_kind(const Comm *c) { return c->kind; }
