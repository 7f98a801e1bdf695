/* train_dist.h — the trainer's data-parallel collectives over dist/comm.h:
 * gathering each rank's share of a round (completions, rewards, log-probs),
 * summing gradients in a fixed order, and agreeing on errors and stop signals.
 * A world of one calls nothing: every function is then a copy or a no-op.
 *
 * Buffers passed here are host memory, except the gradient buffer, which is
 * the backend's [f32] buffer.
 *
 * Gradients take one of two paths:
 *   host     (CPU ranks; GPU ranks sharing a GPU, which NCCL refuses): every
 *            rank's gradients gathered to the host and summed in rank order,
 *            so the result has the same bits as one process — what makes CPU
 *            runs independent of the world size.
 *   overlap  (GPU ranks on distinct GPUs with NCCL): the backward pass
 *            announces the gradients it finished (model_grads_on_ready); they
 *            are all-reduced in buckets of ddp_bucket_cap_mb on the backend's
 *            communication stream while the backward goes on with the layers
 *            below, as PyTorch DDP does. The sum's order is NCCL's, so the
 *            result matches the host path within float rounding; every rank
 *            gets the same bits. */
#ifndef COLT_PARALLEL_TRAIN_DIST_H
#define COLT_PARALLEL_TRAIN_DIST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "dist/comm.h"
#include "model/model_train.h"

/* Gradient ranges announced by the backward and not yet in a bucket (they
 * arrive in two runs, the decayed and the no-decay part of the arena). */
#define TRAIN_DIST_PENDING 4

typedef struct TrainDist {
    int rank, world;  /* in the data-parallel group */
    Comm *comm;       /* host collectives; NULL for a world of one (borrowed: the mesh's) */
    /* Tensor parallelism (parallel/tp_group.h): the launch's world, when larger
     * than the data-parallel group. Agreements (train_dist_agree, _any) go
     * over it, so a failure on any rank of any group stops every rank. */
    Comm *all;        /* borrowed: the mesh's world */
    int all_rank, all_world;
    float *staging;   /* host copy of the gradients (host path) */
    size_t staging_n;
    /* overlap path (grad_comm != NULL) */
    Comm *grad_comm;  /* NCCL, on the backend's communication stream */
    const Backend *be;
    float *grads;     /* the flat gradient buffer */
    size_t grads_n, bucket_n;  /* elements: all, per bucket */
    size_t pending[TRAIN_DIST_PENDING][2];
    int n_pending;
    size_t pending_n, announced_n;  /* elements waiting; announced in this step */
    bool in_flight;   /* collectives enqueued and not yet waited for */
    /* ZeRO-2 (train_dist_zero2_open): this rank's shard [z2_lo, z2_hi) of the
     * summed gradients, accumulated over a step's micro-batches */
    const struct ModelGrads *z2_grads;
    size_t z2_lo, z2_hi;
    void *z2_shard;      /* [f32] backend buffer [z2_hi - z2_lo] */
    float *z2_host;      /* host path: the accumulator, uploaded at the step's end */
    float *z2_stage;     /* host path: one stage of every rank's gradients */
    size_t z2_stage_n;
    bool z2_pending;     /* NCCL: a stage's all-reduce enqueued, not yet added */
    size_t z2_plo, z2_phi;
    void *z2_pdata;
    /* ZeRO-3 (train_dist_zero3_gather) */
    uint8_t *z3_host;    /* host path: this rank's piece, every rank's, the assembled range */
    size_t z3_host_n;
} TrainDist;

/* Chooses the gradient path (collective): GPU ranks of a CUDA backend on
 * distinct GPUs (PCI bus id and host gathered from all ranks) open an NCCL
 * communicator on `device` for the gradients of grads[n]; otherwise the host
 * path stays. `how` gets a few words for the log ("NCCL, buckets of 25 MB"). */
int train_dist_open_gradients(TrainDist *d, const LaunchEnv *env, const Backend *be, int device, void *grads,
                              size_t n, size_t bucket_bytes, double timeout_s, char *how, size_t how_size, char *err);

/* The overlap path over a given NCCL communicator of the data-parallel group
 * (tensor parallelism's, split from the launch), which d then owns. */
void train_dist_adopt_gradients(TrainDist *d, Comm *grad_comm, const Backend *be, void *grads, size_t n,
                                size_t bucket_bytes);

/* A GradsReadyFn (model_train.h) for the overlap path: ctx is the TrainDist.
 * Install it for the last backward of a step only (earlier micro-batches
 * still add to the gradients). */
int train_dist_gradients_ready(void *ctx, size_t lo, size_t hi, char *err);

/* True when gradients take the overlap path. */
bool train_dist_overlaps(const TrainDist *d);

/* out[world * bytes_each] = every rank's mine[bytes_each], in rank order. */
int train_dist_gather(TrainDist *d, void *out, const void *mine, size_t bytes_each, char *err);

/* The sum over ranks of grads[n] ([f32] buffer of be), on every rank when
 * this returns. Host path: added in rank order (r0 + r1 + r2 ...: the same
 * bits as one process accumulating the ranks' micro-batches one after the
 * other). Overlap path: the buckets not yet launched are, then all are waited
 * for (bounded by the timeout); if the backward announced nothing, the whole
 * buffer is reduced here. */
int train_dist_sum_gradients(TrainDist *d, const Backend *be, void *grads, size_t n, char *err);

/* ZeRO: every rank updated its shard of the flat weights buf[numel] (storage
 * dtype of be; rank r's shard as optim_shard_bounds gives it); afterwards
 * every rank holds all of them. Overlap path: each shard broadcast in place by
 * its rank over NCCL; host path: the shards gathered through the host.
 * Collective. */
int train_dist_gather_shards(TrainDist *d, const Backend *be, void *buf, size_t numel, char *err);

/* ZeRO-2 (zero_stage 2). The backward's windowed gradients
 * (model_grads_create_windowed) are handed over stage by stage:
 * train_dist_zero2_ready (a GradsReadyFn, ctx the TrainDist, installed for
 * every backward) sums each stage over the ranks — over NCCL each rank's part
 * reduced to that rank, on the communication stream, overlapping the next
 * layer's backward; or through the host in rank order — and adds this rank's
 * part of it to its shard
 * [lo, hi) of the flat layout. Per step: begin_step zeroes the shard; after
 * each backward, finish_backward adds the last stage still in flight; after
 * the last, finish_step completes the shard (host path: uploads it). Then
 * train_dist_zero2_norm gives the global gradient norm (the ranks' sums of
 * squares added in rank order) and train_dist_zero2_shard the shard to clip
 * and step. A world of one works the same with no communication. */
int train_dist_zero2_open(TrainDist *d, const Backend *be, const struct ModelGrads *g, size_t lo, size_t hi,
                          char *err);
void train_dist_zero2_begin_step(TrainDist *d);
int train_dist_zero2_ready(void *ctx, size_t lo, size_t hi, char *err);
int train_dist_zero2_finish_backward(TrainDist *d, char *err);
int train_dist_zero2_finish_step(TrainDist *d, char *err);
int train_dist_zero2_norm(TrainDist *d, double *norm, char *err);
void *train_dist_zero2_shard(const TrainDist *d);

/* ZeRO-3 (zero_stage 3): the gathers of model_params_partition (model_train.h)
 * over this TrainDist, for flat weights cut into ranks' parts by
 * optim_shard_bounds (any number of models, each its own numel). Overlap path: each rank's piece of a range
 * broadcast by it over NCCL on the communication stream, after the compute
 * enqueued so far (so a window is refilled only once its last user ran); wait
 * blocks, bounded, until they completed. Host path: the pieces gathered
 * through the host, in chunks, done when start returns. */
void train_dist_zero3_gather(TrainDist *d, const Backend *be, ParamsGather *out);

/* After an error (the ranks may not all have enqueued the same collectives,
 * so some may never complete): drops the overlap path's in-flight ones and
 * makes train_dist_free skip NCCL's collective finalize. */
void train_dist_cancel_gradients(TrainDist *d);

/* The ranks agree on a status (every rank of the launch, also under tensor
 * parallelism): every rank passes its rc (and err when failed).
 * Returns COLT_OK when all succeeded; else COLT_ERR on every rank: a rank that
 * failed keeps its own message, the others get the first failing rank's
 * ("rank 2: reward 'x': ...") — so rank 0 can save and report what another
 * rank hit. */
int train_dist_agree(TrainDist *d, int rc, char *err);

/* Checks that values[n] have the same bits on every rank (e.g. a fingerprint of
 * the weights), else an error naming the first rank that differs. Collective. */
int train_dist_check_same(TrainDist *d, const double *values, int n, const char *what, char *err);

/* True on every rank when flag is true on any (a stop signal seen by one). */
bool train_dist_any(TrainDist *d, bool flag);

void train_dist_free(TrainDist *d);

#endif
