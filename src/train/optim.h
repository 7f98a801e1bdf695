/* optim.h — AdamW over a model's parameters (moments allocated once through
 * the backend), learning-rate schedules as transformers' get_scheduler, and
 * global-norm gradient clipping. The trainer calls, per optimizer step:
 *   norm = optim_clip_grad_norm(model, grads, max_grad_norm, backend);
 *   optim_step(opt, grads, lr_schedule_value(...));
 * Not the GRPO loss (grpo.h) and not the trainer loop. */
#ifndef COLT_TRAIN_OPTIM_H
#define COLT_TRAIN_OPTIM_H

#include <stdint.h>

#include "model/model.h"
#include "model/model_train.h"

typedef enum { LR_CONSTANT = 0, LR_CONSTANT_WITH_WARMUP, LR_LINEAR, LR_COSINE } LrSchedulerType;

/* Parses transformers' names: "constant", "constant_with_warmup", "linear", "cosine". */
int lr_scheduler_parse(LrSchedulerType *out, const char *s, char *err);

/* The learning rate for optimizer step `step` (0-based: the lr used by the
 * (step+1)-th update, as transformers' LambdaLR gives it) of total_steps, with
 * warmup_steps of linear warmup. Matches transformers exactly. */
float lr_schedule_value(LrSchedulerType type, float base_lr, int step, int total_steps, int warmup_steps);

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
void optim_free(Optimizer *o);
/* One AdamW update of every parameter with learning rate lr; increments the step count. */
void optim_step(Optimizer *o, const ModelGrads *g, float lr);
int64_t optim_step_count(const Optimizer *o);
/* Device bytes of the moments (and fp32 master weights when the storage is not fp32). */
size_t optim_state_bytes(const Optimizer *o);

/* Global L2 norm of all gradients (before clipping), and, when max_norm > 0,
 * scales every gradient by min(1, max_norm / (norm + 1e-6)) as
 * torch.nn.utils.clip_grad_norm_ does. Returns the norm. A non-finite norm
 * leaves the gradients as they are (torch would turn them all into NaN); the
 * caller should skip that step. be as for optim_create. */
double optim_clip_grad_norm(const Model *m, ModelGrads *g, double max_norm, const Backend *be);

/* Saves / restores the moments and step count (an F32 safetensors file with
 * 1-D tensors "<param name>.exp_avg" / ".exp_avg_sq" of the parameter's numel,
 * and metadata "step"), written atomically. Loading checks names and element
 * counts against the model (ModelParam carries no shape) and names the first
 * mismatch. */
int optim_save(const Optimizer *o, const char *path, char *err);
int optim_load(Optimizer *o, const char *path, char *err);
/* optim_load on a file's bytes (path: for messages). Checks everything —
 * format, step, names, shapes, every value finite — before changing anything. */
int optim_load_bytes(Optimizer *o, const void *data, size_t size, const char *path, char *err);
/* True when the weights AdamW updates (the fp32 masters, or the weights
 * themselves in fp32) and both moments are all finite. */
bool optim_state_finite(const Optimizer *o);

/* The sums of squares (in double, in a fixed order) of the weights AdamW
 * updates and of the first moments: equal on ranks whose state has the same
 * bits, so data-parallel ranks compare them to catch a rank that drifted. */
void optim_fingerprint(const Optimizer *o, double out[2]);

#endif
