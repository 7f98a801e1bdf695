/* trainer.h — `colt train`: the GRPO loop, colocated. Each round generates
 * completions with the live weights (engine/generate.h: no copy, no sync),
 * scores them with the reward functions, computes group advantages, then runs
 * steps_per_generation x num_iterations micro-batches of TRL's GRPO loss with
 * gradient accumulation and AdamW. Logs TRL's metric names, saves HF-format
 * checkpoints that resume bit-identically, and stops cleanly on SIGINT/SIGTERM.
 * This is the loop only: the math lives in grpo.h / optim.h / model_train.h. */
#ifndef COLT_TRAIN_TRAINER_H
#define COLT_TRAIN_TRAINER_H

#include "backend/backend.h"
#include "dist/launch_env.h"
#include "model/lora.h"
#include "model/model.h"
#include "train/train_config.h"

/* Runs training as configured (cfg must be finalized with cfg->world_size =
 * env->world_size) as rank env->rank of env's launch. Returns 0 when training
 * finished or was interrupted and checkpointed, -1 with err set. */
int trainer_run(TrainConfig *cfg, const LaunchEnv *env, char *err);

/* The memory plan's inputs for a run of cfg on a model of shape mc: be the
 * backend it would run on (NULL: as cfg->device says, planned for an unseen
 * machine), the world size, and the longest prompt in tokens. lora_out holds
 * the adapters' settings in->lora points to (use_peft). Device memory is left
 * for the caller to fill in. */
struct MemoryPlanInput;
void trainer_plan_input(struct MemoryPlanInput *in, const TrainConfig *cfg, const ModelConfig *mc, const Backend *be,
                        int world_size, int max_prompt_tokens, LoraConfig *lora_out);

#endif
