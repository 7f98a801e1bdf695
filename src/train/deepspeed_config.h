/* deepspeed_config.h — reading a DeepSpeed JSON config (TRL's `deepspeed`
 * key, `accelerate --deepspeed_config_file`) into colt's settings. What colt
 * honours sets it (zero_optimization.stage -> zero_stage,
 * offload_optimizer.device -> offload_optimizer, reduce_bucket_size ->
 * ddp_bucket_cap_mb); a key whose value changes nothing in colt gets one
 * notice line saying why; a value colt cannot honour (fp16, NVMe or parameter
 * offload, batch sizes that disagree with colt's) and an unknown key are
 * errors naming the key. Nothing is accepted silently. */
#ifndef COLT_TRAIN_DEEPSPEED_CONFIG_H
#define COLT_TRAIN_DEEPSPEED_CONFIG_H

#include "train/train_config.h"

int deepspeed_config_apply(TrainConfig *c, const char *path, char *err);

/* One notice line for key (train_config_print_notices prints them). */
void train_config_notice(TrainConfig *c, const char *key, const char *line);

#endif
