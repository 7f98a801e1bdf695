/* train_dist.c — see train_dist.h. */
#include "parallel/train_dist.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


#include "core/error.h"
#include "parallel/mesh.h"
#include "parallel/optim.h"

int train_dist_gather(TrainDist *d, void *out, const void *mine, size_t bytes_each, char *err) {
    if (d->world == 1) {
        if (bytes_each && out != mine) memmove(out, mine, bytes_each);
        return COLT_OK;
    }
    return comm_all_gather(d->comm, out, mine, bytes_each, COMM_BYTE, NULL, err);
}

/* ---------------------------------------------------------------- overlap path */

int train_dist_open_gradients(TrainDist *d, const LaunchEnv *env, const Backend *be, int device, void *grads,
                              size_t n, size_t bucket_bytes, double timeout_s, char *how, size_t how_size, char *err) {
    snprintf(how, how_size, "%s", d->world == 1 ? "one process" : "summed on the host in rank order");
    if (d->world == 1 || !be->nccl_capable || !comm_built(COMM_NCCL)) return COLT_OK;
    /* NCCL refuses two ranks on one GPU: those keep the host path. */
    bool own = false;
    char why[128];
    if (mesh_ranks_own_devices(&own, why, sizeof why, d->comm, be, err) != 0) return COLT_ERR;
    if (!own) {
        snprintf(how, how_size, "summed on the host in rank order: %s, which NCCL refuses", why);
        return COLT_OK;
    }
    /* The host communicator's store, where it has one (the NCCL id travels over MPI otherwise). */
    CommOptions co = {.kind = COMM_NCCL, .gpu = true, .cuda_device = device, .timeout_s = timeout_s,
                      .store = comm_store(d->comm)};
    Comm *grad_comm = NULL;
    if (comm_open(&grad_comm, env, &co, err) != 0) return COLT_ERR;
    train_dist_adopt_gradients(d, grad_comm, be, grads, n, bucket_bytes);
    snprintf(how, how_size, "NCCL, all-reduced in buckets of %.0f MB during the backward pass",
             (double)bucket_bytes / (1 << 20));
    return COLT_OK;
}

void train_dist_adopt_gradients(TrainDist *d, Comm *grad_comm, const Backend *be, void *grads, size_t n,
                                size_t bucket_bytes) {
    d->grad_comm = grad_comm;
    d->be = be;
    d->grads = grads;
    d->grads_n = n;
    d->bucket_n = bucket_bytes / sizeof(float);
    if (d->bucket_n == 0) d->bucket_n = 1;
}

bool train_dist_overlaps(const TrainDist *d) { return d->grad_comm != NULL; }

/* Enqueues the pending ranges' all-reduce on the communication stream, after
 * everything the compute stream has been given so far. */
static int launch_bucket(TrainDist *d, char *err) {
    if (d->n_pending == 0) return COLT_OK;
    backend_comm_after_compute(d->be);
    void *stream = backend_comm_stream(d->be);
    d->in_flight = true;
    for (int i = 0; i < d->n_pending; i++)
        if (comm_all_reduce(d->grad_comm, d->grads + d->pending[i][0], d->pending[i][1] - d->pending[i][0],
                            COMM_FLOAT32, stream, err) != 0)
            return COLT_ERR;
    d->n_pending = 0;
    d->pending_n = 0;
    return COLT_OK;
}

int train_dist_gradients_ready(void *ctx, size_t lo, size_t hi, char *err) {
    TrainDist *d = ctx;
    COLT_ASSERT(d->grad_comm && lo < hi && hi <= d->grads_n);
    /* The backward announces neighbouring ranges one after another: extend a
     * pending one where possible. */
    int i = 0;
    while (i < d->n_pending && d->pending[i][0] != hi && d->pending[i][1] != lo) i++;
    if (i == d->n_pending) {
        if (d->n_pending == TRAIN_DIST_PENDING && launch_bucket(d, err) != 0) return COLT_ERR;
        i = d->n_pending++;
        d->pending[i][0] = lo;
        d->pending[i][1] = hi;
    } else if (d->pending[i][0] == hi) d->pending[i][0] = lo;
    else d->pending[i][1] = hi;
    d->pending_n += hi - lo;
    d->announced_n += hi - lo;
    return d->pending_n >= d->bucket_n ? launch_bucket(d, err) : COLT_OK;
}

static int overlap_finish(TrainDist *d, char *err) {
    if (d->announced_n == 0) { /* no backward announced anything: all of it now */
        d->pending[0][0] = 0;
        d->pending[0][1] = d->grads_n;
        d->n_pending = 1;
    } else COLT_ASSERT(d->announced_n == d->grads_n);
    int rc = launch_bucket(d, err);
    if (rc == 0) rc = comm_wait(d->grad_comm, backend_comm_stream(d->be), err);
    if (rc == 0) d->in_flight = false;
    d->announced_n = 0;
    d->n_pending = 0;
    d->pending_n = 0;
    return rc;
}

void train_dist_cancel_gradients(TrainDist *d) {
    if (d->grad_comm) comm_cancel(d->grad_comm); /* also spares comm_close a collective finalize */
    d->in_flight = false;
}

/* ---------------------------------------------------------------- host path */

int train_dist_sum_gradients(TrainDist *d, const Backend *be, void *grads, size_t n, char *err) {
    if (d->world == 1 || n == 0) return COLT_OK;
    if (d->grad_comm) {
        COLT_ASSERT(grads == d->grads && n == d->grads_n);
        return overlap_finish(d, err);
    }
    /* All ranks' gradients side by side, then summed in rank order: memory of
     * world x the gradients on the host, which is what makes the order fixed
     * (an all-reduce's order depends on its algorithm). */
    if (d->staging_n < n) {
        free(d->staging);
        d->staging = xmalloc(sizeof(float) * n * ((size_t)d->world + 1));
        d->staging_n = n;
    }
    float *mine = d->staging, *all = d->staging + n;
    be->download_f32(be, mine, grads, n);
    if (comm_all_gather(d->comm, all, mine, n, COMM_FLOAT32, NULL, err) != 0) return COLT_ERR;
    for (size_t i = 0; i < n; i++) {
        float s = all[i];
        for (int r = 1; r < d->world; r++) s += all[(size_t)r * n + i];
        mine[i] = s;
    }
    be->upload_f32(be, grads, mine, n);
    return COLT_OK;
}

int train_dist_gather_shards(TrainDist *d, const Backend *be, void *buf, size_t numel, char *err) {
    if (d->world == 1 || numel == 0) return COLT_OK;
    size_t es = dtype_size(be->storage), lo, hi;
    if (d->grad_comm) {
        backend_comm_after_compute(be);
        void *stream = backend_comm_stream(be);
        d->in_flight = true;
        for (int r = 0; r < d->world; r++) {
            optim_shard_bounds(numel, d->world, r, &lo, &hi);
            if (hi > lo && comm_broadcast(d->grad_comm, (char *)buf + lo * es, (hi - lo) * es, COMM_BYTE, r, stream,
                                          err) != 0)
                return COLT_ERR;
        }
        if (comm_wait(d->grad_comm, stream, err) != 0) return COLT_ERR;
        d->in_flight = false;
        return COLT_OK;
    }
    /* Equal pieces of a shard's size from every rank (the short last ones padded). */
    size_t piece = optim_shard_elements(numel, d->world) * es;
    optim_shard_bounds(numel, d->world, d->rank, &lo, &hi);
    uint8_t *mine = xcalloc(piece ? piece : 1, 1), *all = xmalloc(piece * (size_t)d->world + 1);
    if (hi > lo) be->copy_to_host(be, mine, (char *)buf + lo * es, (hi - lo) * es);
    int rc = comm_all_gather(d->comm, all, mine, piece, COMM_BYTE, NULL, err);
    if (rc == 0) be->copy_from_host(be, buf, all, numel * es);
    free(mine);
    free(all);
    return rc;
}

/* The part of the flat range [lo, hi) that rank r keeps when numel elements
 * are cut into shards by optim_shard_bounds: [*a, *b), empty when *a >= *b. */
static void rank_piece(size_t numel, int world, int r, size_t lo, size_t hi, size_t *a, size_t *b) {
    size_t rlo, rhi;
    optim_shard_bounds(numel, world, r, &rlo, &rhi);
    *a = lo > rlo ? lo : rlo;
    *b = hi < rhi ? hi : rhi;
}

/* ---------------------------------------------------------------- ZeRO-2 */

int train_dist_zero2_open(TrainDist *d, const Backend *be, const ModelGrads *g, size_t lo, size_t hi, char *err) {
    if (!be->add_f32) return errorf(err, "zero_stage 2: backend %s has no add_f32 op", be->name);
    d->be = be;
    d->z2_grads = g;
    d->z2_lo = lo;
    d->z2_hi = hi;
    d->z2_shard = be->alloc_f32(be, hi > lo ? hi - lo : 1);
    be->zero_f32(be, d->z2_shard, hi - lo);
    if (d->world > 1 && !d->grad_comm) d->z2_host = xcalloc(hi > lo ? hi - lo : 1, sizeof(float));
    return COLT_OK;
}

void train_dist_zero2_begin_step(TrainDist *d) {
    size_t n = d->z2_hi - d->z2_lo;
    d->be->zero_f32(d->be, d->z2_shard, n);
    if (d->z2_host) memset(d->z2_host, 0, n * sizeof(float));
}

void *train_dist_zero2_shard(const TrainDist *d) { return d->z2_shard; }

/* Adds the part of the summed range [lo, hi) (now in data) that falls in this rank's shard. */
static void zero2_add(TrainDist *d, const void *data, size_t lo, size_t hi) {
    size_t a = lo > d->z2_lo ? lo : d->z2_lo, b = hi < d->z2_hi ? hi : d->z2_hi;
    if (a < b)
        d->be->add_f32(d->be, (char *)d->z2_shard + (a - d->z2_lo) * sizeof(float),
                       (const char *)data + (a - lo) * sizeof(float), b - a);
}

int train_dist_zero2_finish_backward(TrainDist *d, char *err) {
    if (!d->z2_pending) return COLT_OK;
    if (comm_wait(d->grad_comm, backend_comm_stream(d->be), err) != 0) return COLT_ERR;
    d->in_flight = false;
    d->z2_pending = false;
    zero2_add(d, d->z2_pdata, d->z2_plo, d->z2_phi);
    return COLT_OK;
}

int train_dist_zero2_ready(void *ctx, size_t lo, size_t hi, char *err) {
    TrainDist *d = ctx;
    void *data = model_grads_range_data(d->z2_grads, lo);
    COLT_ASSERT(data && lo < hi);
    size_t n = hi - lo;
    if (d->world == 1) {
        zero2_add(d, data, lo, hi);
        return COLT_OK;
    }
    if (d->grad_comm) {
        /* The stage before this one is summed by now (or soon): add it, then
         * send this one; it overlaps the next layer's backward. */
        if (train_dist_zero2_finish_backward(d, err) != 0) return COLT_ERR;
        backend_comm_after_compute(d->be);
        d->in_flight = true;
        /* each rank's part of the stage reduced to it alone: half an all_reduce's traffic */
        size_t numel = 0, a, b;
        model_grads_flat(d->z2_grads, &numel);
        for (int r = 0; r < d->world; r++) {
            rank_piece(numel, d->world, r, lo, hi, &a, &b);
            if (a < b && comm_reduce(d->grad_comm, (char *)data + (a - lo) * sizeof(float), b - a, COMM_FLOAT32, r,
                                     backend_comm_stream(d->be), err) != 0)
                return COLT_ERR;
        }
        d->z2_pending = true;
        d->z2_pdata = data;
        d->z2_plo = lo;
        d->z2_phi = hi;
        return COLT_OK;
    }
    /* Host path: every rank's copy of the stage, added in rank order for this
     * rank's part only (the same bits as the unsharded host path's sum). */
    size_t a = lo > d->z2_lo ? lo : d->z2_lo, b = hi < d->z2_hi ? hi : d->z2_hi;
    if (d->z2_stage_n < n) {
        free(d->z2_stage);
        d->z2_stage = xmalloc(sizeof(float) * n * ((size_t)d->world + 1));
        d->z2_stage_n = n;
    }
    float *mine = d->z2_stage, *all = d->z2_stage + n;
    d->be->copy_to_host(d->be, mine, data, n * sizeof(float));
    if (comm_all_gather(d->comm, all, mine, n, COMM_FLOAT32, NULL, err) != 0) return COLT_ERR;
    for (size_t i = a; i < b; i++) {
        size_t k = i - lo;
        float s = all[k];
        for (int r = 1; r < d->world; r++) s += all[(size_t)r * n + k];
        d->z2_host[i - d->z2_lo] += s;
    }
    return COLT_OK;
}

int train_dist_zero2_finish_step(TrainDist *d, char *err) {
    if (train_dist_zero2_finish_backward(d, err) != 0) return COLT_ERR;
    if (d->z2_host) d->be->upload_f32(d->be, d->z2_shard, d->z2_host, d->z2_hi - d->z2_lo);
    return COLT_OK;
}

int train_dist_zero2_norm(TrainDist *d, double *norm, char *err) {
    double mine = d->be->sum_squares(d->be, d->z2_shard, d->z2_hi - d->z2_lo);
    double *all = xcalloc((size_t)d->world, sizeof(double));
    int rc = train_dist_gather(d, all, &mine, sizeof mine, err);
    double total = 0;
    for (int r = 0; r < d->world; r++) total += all[r];
    free(all);
    *norm = sqrt(total);
    return rc;
}

/* ---------------------------------------------------------------- ZeRO-3 */

/* Host path: ranges gathered in chunks of this many elements (bounded host memory). */
#define ZERO3_HOST_CHUNK ((size_t)32 << 20)

/* The part of the weights' range [lo, hi) that rank r keeps. */
static void zero3_piece(const TrainDist *d, size_t numel, int r, size_t lo, size_t hi, size_t *a, size_t *b) {
    rank_piece(numel, d->world, r, lo, hi, a, b);
}

/* Host path, one chunk: every rank's piece of [lo, hi) (each padded to the
 * largest) gathered, then laid out in rank order and copied to dst. */
static int zero3_host_chunk(TrainDist *d, void *dst, size_t lo, size_t hi, size_t numel, const void *shard,
                            char *err) {
    const Backend *be = d->be;
    size_t es = dtype_size(be->storage), piece = 0, a, b, my_lo, my_hi;
    for (int r = 0; r < d->world; r++) {
        zero3_piece(d, numel, r, lo, hi, &a, &b);
        if (b > a && b - a > piece) piece = b - a;
    }
    size_t need = (piece * ((size_t)d->world + 1) + (hi - lo)) * es + 1;
    if (d->z3_host_n < need) {
        free(d->z3_host);
        d->z3_host = xmalloc(need);
        d->z3_host_n = need;
    }
    uint8_t *mine = d->z3_host, *all = mine + piece * es, *out = all + piece * (size_t)d->world * es;
    optim_shard_bounds(numel, d->world, d->rank, &my_lo, &my_hi);
    zero3_piece(d, numel, d->rank, lo, hi, &a, &b);
    if (b > a) be->copy_to_host(be, mine, (const char *)shard + (a - my_lo) * es, (b - a) * es);
    if (comm_all_gather(d->comm, all, mine, piece * es, COMM_BYTE, NULL, err) != 0) return COLT_ERR;
    for (int r = 0; r < d->world; r++) {
        zero3_piece(d, numel, r, lo, hi, &a, &b);
        if (b > a) memcpy(out + (a - lo) * es, all + (size_t)r * piece * es, (b - a) * es);
    }
    be->copy_from_host(be, dst, out, (hi - lo) * es);
    return COLT_OK;
}

static int zero3_start(void *ctx, void *dst, size_t lo, size_t hi, size_t numel, const void *shard, char *err) {
    TrainDist *d = ctx;
    const Backend *be = d->be;
    size_t es = dtype_size(be->storage), a, b, my_lo, my_hi;
    optim_shard_bounds(numel, d->world, d->rank, &my_lo, &my_hi);
    zero3_piece(d, numel, d->rank, lo, hi, &a, &b);
    if (d->world == 1 || d->grad_comm) {
        /* this rank's piece in place (on the compute stream, after the
         * window's last user); NCCL then broadcasts each piece from its rank */
        if (b > a) be->copy(be, dst, a - lo, shard, a - my_lo, b - a);
        if (d->world == 1) return COLT_OK;
        backend_comm_after_compute(be);
        void *stream = backend_comm_stream(be);
        d->in_flight = true;
        for (int r = 0; r < d->world; r++) {
            zero3_piece(d, numel, r, lo, hi, &a, &b);
            if (b > a && comm_broadcast(d->grad_comm, (char *)dst + (a - lo) * es, (b - a) * es, COMM_BYTE, r, stream,
                                        err) != 0)
                return COLT_ERR;
        }
        return COLT_OK;
    }
    for (size_t c = lo; c < hi; c += ZERO3_HOST_CHUNK) {
        size_t e = hi - c < ZERO3_HOST_CHUNK ? hi : c + ZERO3_HOST_CHUNK;
        if (zero3_host_chunk(d, (char *)dst + (c - lo) * es, c, e, numel, shard, err) != 0) return COLT_ERR;
    }
    return COLT_OK;
}

static int zero3_wait(void *ctx, char *err) {
    TrainDist *d = ctx;
    if (!d->grad_comm || !d->in_flight) return COLT_OK;
    if (comm_wait(d->grad_comm, backend_comm_stream(d->be), err) != 0) return COLT_ERR;
    d->in_flight = false;
    return COLT_OK;
}

void train_dist_zero3_gather(TrainDist *d, const Backend *be, ParamsGather *out) {
    d->be = be;
    *out = (ParamsGather){.start = zero3_start, .wait = zero3_wait, .ctx = d};
}

typedef struct StatusRecord {
    int rc;
    char message[ERR_LEN];
} StatusRecord;

int train_dist_agree(TrainDist *d, int rc, char *err) {
    Comm *comm = d->all ? d->all : d->comm;
    int world = d->all ? d->all_world : d->world;
    if (world == 1) return rc == 0 ? COLT_OK : COLT_ERR;
    StatusRecord mine = {.rc = rc != 0};
    if (rc != 0) snprintf(mine.message, sizeof mine.message, "%s", err);
    StatusRecord *all = xcalloc((size_t)world, sizeof(StatusRecord));
    char gather_err[ERR_LEN];
    if (comm_all_gather(comm, all, &mine, sizeof mine, COMM_BYTE, NULL, gather_err) != 0) {
        free(all);
        comm_abort(comm, gather_err);
    }
    /* A failed rank reports its own message; the others the first failed rank's. */
    int out = rc != 0 ? COLT_ERR : COLT_OK;
    for (int r = 0; r < world && out == COLT_OK; r++)
        if (all[r].rc) {
            errorf(err, "rank %d: %s", r, all[r].message);
            out = COLT_ERR;
        }
    free(all);
    return out;
}

int train_dist_check_same(TrainDist *d, const double *values, int n, const char *what, char *err) {
    if (d->world == 1) return COLT_OK;
    double *all = xcalloc((size_t)d->world * (size_t)n, sizeof(double));
    int rc = train_dist_gather(d, all, values, (size_t)n * sizeof(double), err);
    for (int r = 1; rc == 0 && r < d->world; r++)
        for (int i = 0; i < n && rc == 0; i++)
            if (memcmp(&all[(size_t)r * n + i], &all[i], sizeof(double)) != 0)
                rc = errorf(err, "the ranks' %s differ: rank %d has %.17g where rank 0 has %.17g (value %d)", what, r,
                            all[(size_t)r * n + i], all[i], i);
    free(all);
    return rc;
}

bool train_dist_any(TrainDist *d, bool flag) {
    Comm *comm = d->all ? d->all : d->comm;
    if ((d->all ? d->all_world : d->world) == 1) return flag;
    long long v = flag ? 1 : 0;
    char err[ERR_LEN];
    if (comm_all_reduce(comm, &v, 1, COMM_INT64, NULL, err) != 0) comm_abort(comm, err);
    return v != 0;
}

void train_dist_free(TrainDist *d) {
    if (d->in_flight) train_dist_cancel_gradients(d);
    if (d->z2_shard) d->be->free(d->be, d->z2_shard);
    free(d->z2_host);
    free(d->z2_stage);
    free(d->z3_host);
    if (d->grad_comm) comm_close(d->grad_comm);
    free(d->staging);
    memset(d, 0, sizeof *d);
}
