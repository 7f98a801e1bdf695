/* optim.h — AdamW over a model's parameters (moments allocated once through
 * the backend), learning-rate schedules as transformers' get_scheduler, and
 * global-norm gradient clipping. The trainer calls, per optimizer step:
 *   norm = optim_clip_grad_norm(model, grads, max_grad_norm, backend);
 *   optim_step(opt, grads, lr_schedule_value(...));
 * Not the GRPO loss (grpo.h) and not the trainer loop. */
#ifndef COLT_PARALLEL_OPTIM_H
#define COLT_PARALLEL_OPTIM_H

#include <stdbool.h>
#include <stdint.h>

#include "model/model.h"
#include "model/model_train.h"

typedef enum { LR_CONSTANT = 0, LR_CONSTANT_WITH_WARMUP, LR_LINEAR, LR_COSINE, LR_COSINE_WITH_MIN_LR } LrSchedulerType;

/* Parses transformers' names: "constant", "constant_with_warmup", "linear", "cosine", "cosine_with_min_lr". */
int lr_scheduler_parse(LrSchedulerType *out, const char *s, char *err);

/* The learning rate for optimizer step `step` (0-based: the lr used by the
 * (step+1)-th update, as transformers' LambdaLR gives it) of total_steps, with
 * warmup_steps of linear warmup. min_lr_rate: where cosine_with_min_lr ends,
 * as a fraction of base_lr (the other schedules ignore it). Matches
 * transformers exactly. */
float lr_schedule_value(LrSchedulerType type, float base_lr, int step, int total_steps, int warmup_steps,
                        double min_lr_rate);

/* transformers' warmup: warmup_steps if > 0, else ceil(warmup_ratio * total_steps). */
int lr_warmup_steps(int total_steps, float warmup_ratio, int warmup_steps);

typedef struct AdamWConfig {
    float beta1, beta2, eps, weight_decay;  /* defaults as TRL: 0.9, 0.999, 1e-8, 0.0 */
} AdamWConfig;

/* Moments for every parameter of m (model_param order), allocated with be and
 * zeroed. be must be the backend m was created with (model.h has no accessor
 * for it); m must outlive the optimizer. */
typedef struct Optimizer Optimizer;
int optim_create(Optimizer **out, Model *m, const AdamWConfig *cfg, const Backend *be, char *err);

/* ZeRO and offload: which part of the state this process keeps, and where. */
typedef struct OptimShardOptions {
    int rank, world;  /* this rank's shard of the flat parameters (zero_stage >= 1); world 1: all of them */
    bool offload;     /* offload_optimizer cpu: fp32 master weights and moments in host memory, AdamW on the host */
    /* With offload: the share of the shard whose state stays on the device and updates there; the host
     * updates the rest (1 - DeepSpeed's offload_optimizer.ratio; 0, the default: all of it on the host). */
    double device_share;
    int host_threads; /* the host AdamW's threads (0: OpenMP's default, all cores) */
} OptimShardOptions;
/* The state of one shard of model_params_flat: elements [lo, hi), lo =
 * rank x optim_shard_elements(numel, world) (optim_shard_bounds).
 * optim_step then updates only the weights of that range; the caller gathers
 * the other ranks' ranges (train_dist.h). */
int optim_create_sharded(Optimizer **out, Model *m, const AdamWConfig *cfg, const Backend *be,
                         const OptimShardOptions *so, char *err);
/* Elements per shard of numel over world ranks (a multiple of 64), and rank's
 * shard [lo, hi) (the last ones shorter or empty). */
size_t optim_shard_elements(size_t numel, int world);
void optim_shard_bounds(size_t numel, int world, int rank, size_t *lo, size_t *hi);
void optim_shard_range(const Optimizer *o, size_t *lo, size_t *hi);
bool optim_is_sharded(const Optimizer *o);
void optim_free(Optimizer *o);
/* One AdamW update of the shard's parameters with learning rate lr; increments
 * the step count. Offloaded: the device part's update is launched first, then
 * the host part's gradients are copied to the host in chunks, AdamW runs
 * there, the new weights are copied back, the copies overlapping the host's work. */
void optim_step(Optimizer *o, const ModelGrads *g, float lr);
/* The same with only this shard's gradients ([f32] buffer of hi - lo
 * elements: ZeRO-2's reduced shard). */
void optim_step_shard(Optimizer *o, const void *shard_grads, float lr);
/* The host AdamW's seconds in the last offloaded step (0 when not offloaded). */
double optim_last_host_seconds(const Optimizer *o);
int64_t optim_step_count(const Optimizer *o);
/* Device bytes of the moments (and fp32 master weights when the storage is
 * not fp32) of the part on the device: 0 when all is offloaded.
 * optim_state_host_bytes: the host bytes of the offloaded part (master,
 * moments and the pinned staging). */
size_t optim_state_bytes(const Optimizer *o);
size_t optim_state_host_bytes(const Optimizer *o);
/* The host bytes an offloaded part of host_numel elements takes (for the memory plan; 0 for none). */
size_t optim_offload_host_bytes(size_t host_numel, DType storage);
/* Where a shard [lo, hi) with offload splits: [lo, mid) on the device, [mid, hi) on the host, mid - lo
 * the device_share of it rounded down to a multiple of 64 (device_share 1: all on the device). */
size_t optim_offload_split(size_t lo, size_t hi, double device_share);

/* Global L2 norm of all gradients (before clipping), and, when max_norm > 0,
 * scales every gradient by min(1, max_norm / (norm + 1e-6)) as
 * torch.nn.utils.clip_grad_norm_ does. Returns the norm. A non-finite norm
 * leaves the gradients as they are (torch would turn them all into NaN); the
 * caller should skip that step. be as for optim_create. */
double optim_clip_grad_norm(const Model *m, ModelGrads *g, double max_norm, const Backend *be);

/* Saves / restores the moments and step count (an F32 safetensors file with
 * 1-D tensors "<param name>.exp_avg" / ".exp_avg_sq" (/ ".master") of the
 * parameter's numel, and metadata "step"), written atomically. Saving needs
 * the whole state (world 1); loading fills this optimizer's shard from it.
 * Loading checks names and element counts against the model (ModelParam
 * carries no shape) and names the first mismatch. */
int optim_save(const Optimizer *o, const char *path, char *err);
int optim_load(Optimizer *o, const char *path, char *err);
/* optim_load on a file's bytes (path: for messages). Checks everything —
 * format, step, names, shapes, every value finite — before changing anything. */
int optim_load_bytes(Optimizer *o, const void *data, size_t size, const char *path, char *err);
/* A sharded state: each rank saves its shard (tensors "exp_avg",
 * "exp_avg_sq", "master" over [lo, hi) of the flat layout, with metadata lo,
 * hi, flat_numel, step and a fingerprint of the layout); loading reads the
 * part of this optimizer's shard from every file that has some, whatever the
 * world size that saved them (resharding), after checking that the files are
 * of this model, at one step, and together cover every element. */
int optim_save_shard(const Optimizer *o, const char *path, char *err);
int optim_load_shards(Optimizer *o, const char *const *paths, int n_files, char *err);
/* True when the weights AdamW updates (the fp32 masters, or the weights
 * themselves in fp32) and both moments are all finite (this shard's). */
bool optim_state_finite(const Optimizer *o);

/* The sums of squares (in double, in a fixed order) of the weights AdamW
 * updates and of the first moments (this shard's): equal on ranks whose state
 * has the same bits, so data-parallel ranks compare them to catch a rank that
 * drifted (unsharded states only). */
void optim_fingerprint(const Optimizer *o, double out[2]);

#endif
