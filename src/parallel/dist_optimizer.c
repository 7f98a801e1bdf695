/* dist_optimizer.c — ZeRO 0-3 x tensor parallel x offload behind one
 * interface (dist_optimizer.h). Every choice between stages and layouts is
 * made here, from opts.zero_stage and tp->tensor_parallel_size; the collectives are
 * train_dist.h's. Not the loop that calls it (train/trainer.c). */
#include "parallel/dist_optimizer.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "core/log.h"

static bool zero2(const DistOptimizer *o) { return o->opts.zero_stage >= 2; }
static bool tensor_parallel(const DistOptimizer *o) { return o->tp && o->tp->tensor_parallel_size > 1; }

void dist_optimizer_init(DistOptimizer *o, Model *model, const Backend *be, TrainDist *dist, TpGroup *tp,
                         const DistOptimizerOptions *opts) {
    memset(o, 0, sizeof *o);
    o->opts = *opts;
    o->model = model;
    o->be = be;
    o->dist = dist;
    o->tp = tp;
}

/* ---------------------------------------------------------------- setup */

/* m keeps this rank's part of its flat weights (per_layer: with the layer
 * windows a training pass gathers into). The gathers run over o->dist, whose
 * NCCL path opens later (dist_optimizer_open_gradients): none happens here. */
static int partition_model(DistOptimizer *o, Model *m, bool per_layer, char *err) {
    size_t lo = 0, hi = 0, numel = 0;
    model_params_flat(m, &numel);
    optim_shard_bounds(numel, o->dist->world, o->dist->rank, &lo, &hi);
    ParamsGather pg;
    train_dist_zero3_gather(o->dist, o->be, &pg);
    return model_params_partition(m, lo, hi, &pg, per_layer, err);
}

/* m's whole weights gathered, the outcome agreed over the launch. */
static int gather_model(DistOptimizer *o, Model *m, char *err) {
    return train_dist_agree(o->dist, model_params_gather_all(m, err), err);
}

int dist_optimizer_partition(DistOptimizer *o, Model *m, char *err) {
    if (o->opts.zero_stage < 3) return COLT_OK;
    size_t lo = 0, hi = 0, numel = 0;
    model_params_flat(m, &numel);
    optim_shard_bounds(numel, o->dist->world, o->dist->rank, &lo, &hi);
    if (partition_model(o, m, true, err) != 0) return COLT_ERR;
    if (m == o->model)
        log_info0("weights: zero_stage 3 over %d rank(s): this rank keeps parameters %zu .. %zu of %zu; each layer is "
                  "gathered while a pass uses it, the whole weights for generation and saving",
                  o->dist->world, lo, hi, numel);
    return COLT_OK;
}

static int forward_partition(void *ctx, Model *m, char *err) { return partition_model(ctx, m, false, err); }
static int forward_gather(void *ctx, Model *m, char *err) { return gather_model(ctx, m, err); }
static void forward_release(void *ctx, Model *m) {
    (void)ctx;
    model_params_release_all(m);
}

bool dist_optimizer_forward_partition(DistOptimizer *o, WeightPartition *out) {
    if (o->opts.zero_stage < 3 || o->dist->world < 2) return false;
    *out = (WeightPartition){.ranks = o->dist->world, .partition = forward_partition, .gather = forward_gather,
                             .release = forward_release, .ctx = o};
    return true;
}

int dist_optimizer_create_state(DistOptimizer *o, const AdamWConfig *adamw, char *err) {
    /* zero_stage >= 1: each rank keeps its shard of the optimizer state (and
     * updates that shard of the weights); offload: that state in host memory. */
    const int stage = o->opts.zero_stage;
    OptimShardOptions so = {.rank = stage >= 1 ? o->dist->rank : 0, .world = stage >= 1 ? o->dist->world : 1,
                            .offload = o->opts.offload, .host_threads = o->opts.host_threads,
                            .device_share = o->opts.device_share};
    if (optim_create_sharded(&o->opt, o->model, adamw, o->be, &so, err) != 0) return COLT_ERR;
    if (so.world > 1 || so.offload) {
        size_t lo = 0, hi = 0;
        optim_shard_range(o->opt, &lo, &hi);
        char where[96] = "device";
        if (so.offload && so.device_share > 0.0)
            snprintf(where, sizeof where, "host for %.0f%% (offload_optimizer cpu, ratio %g), the device for the rest",
                     100.0 * (1.0 - so.device_share), 1.0 - so.device_share);
        else if (so.offload) snprintf(where, sizeof where, "host (offload_optimizer cpu)");
        log_info0("optimizer: zero_stage %d over %d rank(s) (this rank: parameters %zu .. %zu of the flat layout), "
                  "state on the %s",
                  stage, so.world, lo, hi, where);
    }
    return COLT_OK;
}

/* zero_stage 2: the gradients of a layer exist only while they are handed over (train_dist.h). */
int dist_optimizer_create_gradients(DistOptimizer *o, char *err) {
    return zero2(o) ? model_grads_create_windowed(&o->grads, o->model, err) : model_grads_create(&o->grads, o->model, err);
}

int dist_optimizer_open_gradients(DistOptimizer *o, const LaunchEnv *env, char *err) {
    TrainDist *d = o->dist;
    size_t n_grads = 0;
    void *grads = model_grads_flat(o->grads, &n_grads);
    char how[256];
    int rc = COLT_OK;
    if (o->opts.host_gradients) {
        snprintf(how, sizeof how, "summed on the host in rank order (ddp_backend)");
    } else if (tensor_parallel(o)) { /* over the data-parallel group: NCCL when the groups are, else the host */
        Comm *dp = NULL;
        if (d->world > 1) rc = tp_group_data_parallel_nccl(o->tp, &dp, err);
        if (dp) train_dist_adopt_gradients(d, dp, o->be, grads, n_grads, o->opts.bucket_bytes);
        snprintf(how, sizeof how, "%s",
                 d->world == 1 ? "one data-parallel group"
                 : dp ? "NCCL across the tensor-parallel groups, all-reduced in buckets during the backward pass"
                      : "summed on the host in rank order");
    } else
        rc = train_dist_open_gradients(d, env, o->be, o->be->device, grads, n_grads, o->opts.bucket_bytes,
                                       o->opts.timeout_s, how, sizeof how, err);
    if (train_dist_agree(d, rc, err) != 0) return COLT_ERR;
    if (zero2(o)) {
        size_t lo = 0, hi = 0;
        optim_shard_range(o->opt, &lo, &hi);
        if (train_dist_agree(d, train_dist_zero2_open(d, o->be, o->grads, lo, hi, err), err) != 0) return COLT_ERR;
        snprintf(how, sizeof how, "zero_stage %d: each layer's gradients %s as the backward finishes it; this rank "
                                  "keeps its shard of the sum",
                 o->opts.zero_stage, d->world == 1 ? "added to the shard" : d->grad_comm ? "reduced over NCCL, each part to the rank keeping it," : "summed on the host in rank order");
    }
    if (d->world > 1 || zero2(o)) log_info0("gradients: %s", how);
    return COLT_OK;
}

/* ---------------------------------------------------------------- a step */

void dist_optimizer_begin_step(DistOptimizer *o) {
    model_grads_zero(o->grads);
    if (zero2(o)) train_dist_zero2_begin_step(o->dist);
}

void dist_optimizer_backward_begin(DistOptimizer *o, bool last) {
    /* The last backward of the step hands its finished gradients to the
     * all-reduce as it goes (GPU ranks over NCCL); at zero_stage 2 every
     * backward hands them over (earlier ones would otherwise keep them). */
    if (zero2(o)) {
        model_grads_on_ready(o->grads, train_dist_zero2_ready, o->dist);
        o->overlap = true;
    } else if (last && train_dist_overlaps(o->dist)) {
        model_grads_on_ready(o->grads, train_dist_gradients_ready, o->dist);
        o->overlap = true;
    }
}

int dist_optimizer_backward_end(DistOptimizer *o, int rc, char *err) {
    if (rc == 0 && zero2(o)) rc = train_dist_zero2_finish_backward(o->dist, err);
    if (o->overlap) model_grads_on_ready(o->grads, NULL, NULL);
    o->overlap = false;
    return rc;
}

int dist_optimizer_finish(DistOptimizer *o, double *seconds, char *err) {
    TrainDist *d = o->dist;
    size_t n_grads = 0;
    void *grads = model_grads_flat(o->grads, &n_grads);
    /* Time the exchange, not the backward still running on the GPU: the
     * host would wait for it here anyway. */
    if (d->world > 1 && o->be->synchronize) o->be->synchronize(o->be);
    double s0 = time_now();
    int rc = train_dist_agree(d,
                              zero2(o) ? train_dist_zero2_finish_step(d, err)
                                       : train_dist_sum_gradients(d, o->be, grads, n_grads, err),
                              err);
    *seconds = d->world > 1 ? time_now() - s0 : -1.0;
    return rc;
}

/* zero_stage 2 or 3 under tensor parallelism: the global gradient norm from
 * every rank's shard of its part's summed gradients, over the whole launch,
 * a parameter several ranks of a group hold (the norms; replicated KV heads)
 * counted once. */
static int zero2_norm_tp(DistOptimizer *o, double *norm, char *err) {
    size_t lo = 0, hi = 0;
    optim_shard_range(o->opt, &lo, &hi);
    const Backend *be = o->be;
    const char *shard = train_dist_zero2_shard(o->dist);
    double mine = be->sum_squares(be, shard, hi - lo);
    for (int i = 0; i < model_param_count(o->model); i++) {
        int copies = model_param_copies(o->model, i);
        if (copies == 1) continue;
        size_t a = model_param_offset(o->model, i), b = a + model_param(o->model, i).numel;
        a = a > lo ? a : lo;
        b = b < hi ? b : hi;
        if (b > a) mine -= be->sum_squares(be, shard + (a - lo) * sizeof(float), b - a) * (1.0 - 1.0 / copies);
    }
    int rc = comm_all_reduce(o->dist->all, &mine, 1, COMM_FLOAT64, NULL, err);
    *norm = sqrt(mine);
    return rc;
}

static bool needs_clipping(double max_norm, double norm) {
    return max_norm > 0 && isfinite(norm) && max_norm / (norm + 1e-6) < 1.0;
}

int dist_optimizer_clip(DistOptimizer *o, double max_norm, double *norm_out, char *err) {
    const Backend *be = o->be;
    double norm = 0;
    if (zero2(o)) {
        /* The global norm from the ranks' shards; each clips its own. */
        if (train_dist_agree(o->dist,
                             tensor_parallel(o) ? zero2_norm_tp(o, &norm, err) : train_dist_zero2_norm(o->dist, &norm, err),
                             err) != 0)
            return COLT_ERR;
        if (needs_clipping(max_norm, norm)) {
            size_t lo = 0, hi = 0;
            optim_shard_range(o->opt, &lo, &hi);
            be->scale(be, train_dist_zero2_shard(o->dist), (float)(max_norm / (norm + 1e-6)), hi - lo);
        }
    } else if (tensor_parallel(o)) {
        /* every part's gradients: the norm over the group, each rank clips its part */
        double sq = 0;
        if (train_dist_agree(o->dist, model_grads_sum_squares(o->model, o->grads, &sq, err), err) != 0)
            return COLT_ERR;
        norm = sqrt(sq);
        size_t n_grads = 0;
        void *grads = model_grads_flat(o->grads, &n_grads);
        if (needs_clipping(max_norm, norm)) be->scale(be, grads, (float)(max_norm / (norm + 1e-6)), n_grads);
    } else norm = optim_clip_grad_norm(o->model, o->grads, max_norm, be);
    *norm_out = norm;
    return COLT_OK;
}

int dist_optimizer_step(DistOptimizer *o, float lr, char *err) {
    if (zero2(o)) optim_step_shard(o->opt, train_dist_zero2_shard(o->dist), lr);
    else optim_step(o->opt, o->grads, lr);
    if (model_params_partitioned(o->model)) model_params_changed(o->model); /* zero_stage 3: gathered per use */
    else if (optim_is_sharded(o->opt)) {
        /* Each rank updated its shard of the weights: exchange them. */
        size_t n_weights = 0;
        void *weights = model_params_flat(o->model, &n_weights);
        if (train_dist_agree(o->dist, train_dist_gather_shards(o->dist, o->be, weights, n_weights, err), err) != 0)
            return COLT_ERR;
    }
    if (o->be->synchronize) o->be->synchronize(o->be);
    return COLT_OK;
}

double dist_optimizer_host_seconds(const DistOptimizer *o) {
    return o->opts.offload ? optim_last_host_seconds(o->opt) : -1.0;
}

/* Unsharded ranks hold whole states that must agree; sharded ones hold
 * different shards, and every rank's weights come from the same gather. */
int dist_optimizer_check_replicas(DistOptimizer *o, char *err) {
    if (o->dist->world == 1 || optim_is_sharded(o->opt)) return COLT_OK;
    /* Every rank applied the same sum of gradients: the weights must be the
     * same bits everywhere. Two passes over the state, cheap beside a step. */
    double fingerprint[2];
    optim_fingerprint(o->opt, fingerprint);
    return train_dist_agree(o->dist, train_dist_check_same(o->dist, fingerprint, 2, "weights and first moments", err),
                            err);
}

/* ---------------------------------------------------------------- weights in sync */

bool dist_optimizer_weights_partitioned(const DistOptimizer *o) { return model_params_partitioned(o->model); }

size_t dist_optimizer_gathered_bytes(const DistOptimizer *o) {
    if (!model_params_partitioned(o->model)) return 0;
    size_t numel = 0;
    model_params_flat(o->model, &numel);
    return numel * dtype_size(o->be->storage);
}

int dist_optimizer_gather_weights(DistOptimizer *o, char *err) {
    if (!model_params_partitioned(o->model)) return COLT_OK;
    return gather_model(o, o->model, err);
}

void dist_optimizer_release_weights(DistOptimizer *o) { model_params_release_all(o->model); }

/* ---------------------------------------------------------------- state */

bool dist_optimizer_state_on_rank0(const DistOptimizer *o) {
    return !optim_is_sharded(o->opt) && !tensor_parallel(o);
}

bool dist_optimizer_state_finite(DistOptimizer *o) {
    bool sharded = optim_is_sharded(o->opt);
    bool finite = sharded || o->dist->rank == 0 ? optim_state_finite(o->opt) : true;
    if (sharded || tensor_parallel(o)) finite = !train_dist_any(o->dist, !finite);
    return finite;
}

void dist_optimizer_free(DistOptimizer *o) {
    model_grads_free(o->grads);
    optim_free(o->opt);
    o->grads = NULL;
    o->opt = NULL;
}
