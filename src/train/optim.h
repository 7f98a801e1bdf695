/* optim.h — AdamW over a model's parameters (moments allocated once through
 * the backend), learning-rate schedules as transformers' get_scheduler, and
 * global-norm gradient clipping. The trainer calls, per optimizer step:
 *   norm = optim_clip_grad_norm(grads, max_grad_norm);
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

typedef struct Optimizer Optimizer;
int optim_create(Optimizer **out, Model *m, const AdamWConfig *cfg, char *err);
void optim_free(Optimizer *o);
/* One AdamW update of every parameter with learning rate lr; increments the step count. */
void optim_step(Optimizer *o, const ModelGrads *g, float lr);
int64_t optim_step_count(const Optimizer *o);

/* Global L2 norm of all gradients (before clipping), and, when max_norm > 0 and
 * the norm exceeds it, scales every gradient by max_norm / (norm + 1e-6) as
 * torch.nn.utils.clip_grad_norm_ does. Returns the norm. */
double optim_clip_grad_norm(const Model *m, ModelGrads *g, double max_norm);

/* Saves / restores the moments and step count (a safetensors file with
 * tensors "<param name>.exp_avg" / ".exp_avg_sq" and metadata "step"),
 * written atomically. Loading checks names and shapes against the model. */
int optim_save(const Optimizer *o, const char *path, char *err);
int optim_load(Optimizer *o, const char *path, char *err);

#endif
