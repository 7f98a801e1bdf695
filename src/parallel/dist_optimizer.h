/* dist_optimizer.h — the distributed optimizer: AdamW over the data-parallel
 * ranks with ZeRO stages 0-3, tensor parallelism and CPU offload behind one
 * interface, so the training loop never asks which stage or layout runs
 * (DeepSpeed keeps its stage logic in its optimizer the same way).
 *
 *   stage 0  every rank the whole state; gradients all-reduced (in buckets
 *            during the last backward of a step where NCCL runs).
 *   stage 1  each rank its shard of the state; it updates its shard of the
 *            weights, then the ranks gather each other's.
 *   stage 2  stage 1 and each layer's gradients reduced to the rank keeping
 *            them as the backward finishes it (no whole gradient buffer).
 *   stage 3  stage 2 and each rank keeps only its part of the weights; a
 *            layer is gathered while a pass uses it, the whole weights for
 *            generation and saving (dist_optimizer_gather_weights).
 *   TP       each rank steps its part's state; the gradient norm over the
 *            launch, parameters several ranks hold counted once.
 *   offload  the state and AdamW on the host (optim.h).
 *
 * A step:
 *   dist_optimizer_begin_step(o);
 *   for each micro-batch: dist_optimizer_backward_begin(o, last);
 *                         backward into o->grads;
 *                         rc = dist_optimizer_backward_end(o, rc, err);
 *   dist_optimizer_finish(o, &seconds, err);     the ranks' gradients summed
 *   dist_optimizer_clip(o, max_norm, &norm, err);
 *   dist_optimizer_step(o, lr, err);             AdamW, weights in sync
 *   dist_optimizer_check_replicas(o, err);
 *
 * It is not the communication itself (parallel/train_dist.h: the gradient
 * paths, ZeRO-2's reduce and ZeRO-3's gathers), nor AdamW's arithmetic
 * (parallel/optim.h), nor the groups (taken as they are: the data-parallel
 * TrainDist and the TpGroup; the mesh will own them). */
#ifndef COLT_PARALLEL_DIST_OPTIMIZER_H
#define COLT_PARALLEL_DIST_OPTIMIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "dist/launch_env.h"
#include "parallel/tp_group.h"
#include "model/model.h"
#include "model/model_train.h"
#include "parallel/optim.h"
#include "parallel/train_dist.h"

typedef struct DistOptimizerOptions {
    int zero_stage;       /* 0 .. 3 */
    bool offload;         /* offload_optimizer cpu */
    double device_share;  /* with offload: the share of the state kept on the device (1 - offload_optimizer_ratio) */
    size_t bucket_bytes;  /* gradient all-reduce buckets (ddp_bucket_cap_mb) */
    double timeout_s;     /* bounded waits of the gradient exchange (ddp_timeout) */
    int host_threads;     /* the offloaded AdamW's threads (Mesh.host_threads; 0: OpenMP's default) */
    bool host_gradients;  /* sum the gradients through the host even where NCCL could (ddp_backend gloo / mpi) */
} DistOptimizerOptions;

typedef struct DistOptimizer {
    DistOptimizerOptions opts;
    Model *model;         /* the trained model (borrowed) */
    const Backend *be;
    TrainDist *dist;      /* the data-parallel group; dist->all the launch under TP (borrowed) */
    TpGroup *tp;          /* tensor_parallel_size 1: no tensor parallelism (borrowed) */
    Optimizer *opt;       /* this rank's AdamW state: whole, a shard, or its part's (checkpoints read it) */
    ModelGrads *grads;    /* the gradients backward accumulates into */
    bool overlap;         /* this backward hands its gradients over as it goes */
} DistOptimizer;

/* Wires o to the model, backend and groups; allocates nothing. */
void dist_optimizer_init(DistOptimizer *o, Model *model, const Backend *be, TrainDist *dist, TpGroup *tp,
                         const DistOptimizerOptions *opts);

/* zero_stage 3: m (the trained model or the reference model, loaded whole
 * just before) keeps only this rank's part of its weights, gathered per use
 * over dist. Nothing at other stages. */
int dist_optimizer_partition(DistOptimizer *o, Model *m, char *err);

/* zero_stage 3 over several ranks: hooks (model.h) that partition a model
 * which only runs forward passes (a reward model) over the same ranks, its
 * part alone kept at rest, gathered whole per use as the trained model is for
 * generation. Returns false (nothing filled) otherwise: such a model stays
 * whole. */
bool dist_optimizer_forward_partition(DistOptimizer *o, WeightPartition *out);

/* The AdamW state (this rank's shard at zero_stage >= 1, on the host with
 * offload), then the gradients (per-layer windows at zero_stage >= 2). */
int dist_optimizer_create_state(DistOptimizer *o, const AdamWConfig *adamw, char *err);
int dist_optimizer_create_gradients(DistOptimizer *o, char *err);

/* The gradient exchange, opened last in setup since it gathers from every
 * rank; logs how gradients travel. Collective. */
int dist_optimizer_open_gradients(DistOptimizer *o, const LaunchEnv *env, char *err);

/* A step: begin_step zeroes the gradients; around each backward,
 * backward_begin installs the gradient-ready hooks (last: the step's last
 * micro-batch) and backward_end completes what the backward handed over and
 * removes them (rc: the backward's outcome, returned updated). */
void dist_optimizer_begin_step(DistOptimizer *o);
void dist_optimizer_backward_begin(DistOptimizer *o, bool last);
int dist_optimizer_backward_end(DistOptimizer *o, int rc, char *err);

/* The ranks' gradients summed (collective, agreed). *seconds: the exchange's
 * time, or -1 when there is no other rank. */
int dist_optimizer_finish(DistOptimizer *o, double *seconds, char *err);

/* The global gradient norm (over every rank's gradients) into *norm, and the
 * gradients scaled to max_norm when it exceeds it (max_norm <= 0: never). */
int dist_optimizer_clip(DistOptimizer *o, double max_norm, double *norm, char *err);

/* One AdamW update at lr, then every rank's weights whole and current again
 * (stage 1-2: the shards gathered; stage 3: the partitions marked changed). */
int dist_optimizer_step(DistOptimizer *o, float lr, char *err);

/* The host AdamW's seconds in the last step, or -1 without offload. */
double dist_optimizer_host_seconds(const DistOptimizer *o);

/* Replicated state (stage 0, several ranks): the ranks' weights and moments
 * must be the same bits; a rank that drifted fails all. Nothing otherwise. */
int dist_optimizer_check_replicas(DistOptimizer *o, char *err);

/* zero_stage 3: the whole weights gathered (collective) for the engine or for
 * saving, and given back; gathered_bytes is what they take (0 at other stages,
 * where the weights are always whole and these do nothing). */
bool dist_optimizer_weights_partitioned(const DistOptimizer *o);
size_t dist_optimizer_gathered_bytes(const DistOptimizer *o);
int dist_optimizer_gather_weights(DistOptimizer *o, char *err);
void dist_optimizer_release_weights(DistOptimizer *o);

/* True when rank 0 alone holds the whole state and weights (no shards, no
 * parts): a checkpoint then needs no other rank. */
bool dist_optimizer_state_on_rank0(const DistOptimizer *o);

/* Whether the state holds only finite values on every rank: collective when
 * the state is split over ranks; otherwise rank 0's answer (true elsewhere). */
bool dist_optimizer_state_finite(DistOptimizer *o);

/* ---------------------------------------------------------------- checkpoints (dist_optimizer_files.c) */

/* The process id of rank 0, on every rank that writes into a checkpoint's
 * temporary folder (collective unless state_on_rank0): the folder carries it,
 * so a stale one is recognised as such. */
int dist_optimizer_rank0_pid(DistOptimizer *o, long *pid, char *err);

/* The state into checkpoint folder dir (of step `step`): rank 0 one file, or
 * one per tensor-parallel part; sharded, every rank its shard and rank 0 the
 * list of them. Collective unless state_on_rank0; rc: the folder's outcome so
 * far (nothing is written after a failure, the ranks still agree). */
int dist_optimizer_save(DistOptimizer *o, const char *dir, int64_t step, int rc, char *err);

/* The state from checkpoint ckpt: its whole file, or the shards of any world
 * size its list names. saved_tensor_parallel_size: what the checkpoint says it
 * was saved with (0: unknown), to name it when this run's differs. */
int dist_optimizer_load(DistOptimizer *o, const char *ckpt, int saved_tensor_parallel_size, char *err);

void dist_optimizer_free(DistOptimizer *o);

#endif
