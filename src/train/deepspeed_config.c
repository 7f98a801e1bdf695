/* deepspeed_config.c — see deepspeed_config.h. */
#include "train/deepspeed_config.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "core/error.h"

/* "auto" (accelerate fills it from the trainer's arguments) or a number equal
 * to colt's value; anything else contradicts colt's setting. */
static int check_auto_or_equal(const json_t *v, double colt, const char *key, const char *colt_key,
                               const char *path, char *err) {
    if (json_is_string(v) && strcmp(json_string_value(v), "auto") == 0) return 0;
    if (json_is_number(v) && fabs(json_number_value(v) - colt) < 1e-9 * fmax(1.0, fabs(colt))) return 0;
    return errorf(err, "%s: %s is %s%g%s but colt's %s is %g: set it to \"auto\" or to the same value", path, key,
                  json_is_number(v) ? "" : "not a number (", json_is_number(v) ? json_number_value(v) : 0.0,
                  json_is_number(v) ? "" : ")", colt_key, colt);
}

static void notice(TrainConfig *c, const char *path, const char *key, const char *why) {
    char line[ERR_LEN], name[160];
    snprintf(line, sizeof line, "%s: %s changes nothing in colt: %s", path, key, why);
    snprintf(name, sizeof name, "deepspeed.%s", key);
    train_config_notice(c, name, line);
}

static bool is_enabled(const json_t *section) {
    const json_t *e = json_object_get(section, "enabled");
    return json_is_true(e) || (json_is_string(e) && strcmp(json_string_value(e), "auto") == 0);
}

/* zero_optimization.offload_optimizer / offload_param: {"device": ..., "pin_memory": ...} */
static int offload_device(const json_t *o, const char **device, const char *key, const char *path, char *err) {
    *device = "none";
    if (!o || json_is_null(o)) return 0;
    if (!json_is_object(o)) return errorf(err, "%s: zero_optimization.%s must be an object", path, key);
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)o, k, v) {
        if (strcmp(k, "device") == 0) {
            if (!json_is_string(v)) return errorf(err, "%s: zero_optimization.%s.device must be a string", path, key);
            *device = json_string_value(v);
        } else if (strcmp(k, "pin_memory") != 0 && strcmp(k, "buffer_count") != 0 && strcmp(k, "fast_init") != 0 &&
                   strcmp(k, "ratio") != 0 && strcmp(k, "nvme_path") != 0 && strcmp(k, "buffer_size") != 0 &&
                   strcmp(k, "max_in_cpu") != 0 && strcmp(k, "pipeline_read") != 0 && strcmp(k, "pipeline_write") != 0)
            return errorf(err, "%s: zero_optimization.%s.%s is not a DeepSpeed key colt knows", path, key, k);
    }
    return 0;
}

static int apply_zero(TrainConfig *c, const json_t *z, const char *path, char *err) {
    if (!json_is_object(z)) return errorf(err, "%s: zero_optimization must be an object", path);
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)z, k, v) {
        char key[96];
        snprintf(key, sizeof key, "zero_optimization.%s", k);
        if (strcmp(k, "stage") == 0) {
            if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 3)
                return errorf(err, "%s: %s must be 0, 1, 2 or 3", path, key);
            int stage = (int)json_integer_value(v);
            if (c->zero_stage_set && c->zero_stage != stage)
                return errorf(err, "%s: %s is %d but zero_stage is %d: give one of them", path, key, stage,
                              c->zero_stage);
            c->zero_stage = stage;
        } else if (strcmp(k, "offload_optimizer") == 0) {
            const char *device;
            if (offload_device(v, &device, k, path, err) != 0) return COLT_ERR;
            if (strcmp(device, "none") != 0 && strcmp(device, "cpu") != 0)
                return errorf(err, "%s: %s.device '%s' is not supported: use cpu or none", path, key, device);
            if (c->offload_set && strcmp(c->offload_optimizer, device) != 0)
                return errorf(err, "%s: %s.device is %s but offload_optimizer is %s: give one of them", path, key,
                              device, c->offload_optimizer);
            free(c->offload_optimizer);
            c->offload_optimizer = xstrdup(device);
            const json_t *ratio = json_object_get(v, "ratio");
            if (ratio && !json_is_null(ratio)) {
                double r = json_number_value(ratio);
                if (!json_is_number(ratio) || !(r >= 0.0 && r <= 1.0))
                    return errorf(err, "%s: %s.ratio must be a number in [0, 1] (the share of the state on the host)",
                                  path, key);
                if (c->offload_ratio_set && c->offload_optimizer_ratio != r)
                    return errorf(err, "%s: %s.ratio is %g but offload_optimizer_ratio is %g: give one of them", path,
                                  key, r, c->offload_optimizer_ratio);
                if (strcmp(device, "cpu") == 0) c->offload_optimizer_ratio = r;
                else notice(c, path, "zero_optimization.offload_optimizer.ratio",
                            "the optimizer is not offloaded (device none)");
            }
            if (json_object_get(v, "pin_memory"))
                notice(c, path, "zero_optimization.offload_optimizer.pin_memory",
                       "colt keeps the offloaded state in pageable memory and stages copies through pinned buffers");
        } else if (strcmp(k, "offload_param") == 0) {
            const char *device;
            if (offload_device(v, &device, k, path, err) != 0) return COLT_ERR;
            if (strcmp(device, "none") != 0)
                return errorf(err, "%s: %s.device '%s' is not supported: colt keeps the parameters on the GPU "
                                   "(use none)",
                              path, key, device);
        } else if (strcmp(k, "reduce_bucket_size") == 0) {
            if (json_is_string(v) && strcmp(json_string_value(v), "auto") == 0) continue;
            if (!json_is_number(v) || json_number_value(v) < 1)
                return errorf(err, "%s: %s must be a number of elements or \"auto\"", path, key);
            /* DeepSpeed counts elements; colt's buckets are MB of fp32 gradients. */
            double mb = json_number_value(v) * 4.0 / (1 << 20);
            c->ddp_bucket_cap_mb = mb < 1 ? 1 : mb > 65536 ? 65536 : (int)(mb + 0.5);
        } else if (strcmp(k, "overlap_comm") == 0) {
            notice(c, path, key,
                   "GPU ranks on distinct GPUs always reduce gradients during the backward pass, over NCCL");
        } else if (strcmp(k, "contiguous_gradients") == 0) {
            notice(c, path, key, "colt's gradients are always one contiguous buffer");
        } else if (strcmp(k, "allgather_partitions") == 0 || strcmp(k, "allgather_bucket_size") == 0 ||
                   strcmp(k, "reduce_scatter") == 0 || strcmp(k, "round_robin_gradients") == 0 ||
                   strcmp(k, "sub_group_size") == 0 || strcmp(k, "load_from_fp32_weights") == 0 ||
                   strcmp(k, "elastic_checkpoint") == 0 || strcmp(k, "ignore_unused_parameters") == 0) {
            notice(c, path, key, "colt gathers the updated shards once per step in one pass; no bucketing to tune");
        } else if (strcmp(k, "stage3_prefetch_bucket_size") == 0) {
            notice(c, path, key, "zero_stage 3 prefetches the next layer's weights while one computes");
        } else if (strcmp(k, "stage3_param_persistence_threshold") == 0) {
            notice(c, path, key, "zero_stage 3 keeps the embedding, final norm and lm_head gathered; every decoder "
                                 "layer is gathered when used");
        } else if (strcmp(k, "stage3_gather_16bit_weights_on_model_save") == 0) {
            notice(c, path, key, "colt always saves the whole weights, as a Hugging Face checkpoint");
        } else if (strncmp(k, "stage3_", 7) == 0) {
            notice(c, path, key, "a stage-3 tuning knob colt does not have: two layer windows, one prefetch");
        } else if (strcmp(k, "zero_hpz_partition_size") == 0 || strcmp(k, "zero_quantized_weights") == 0 ||
                   strcmp(k, "zero_quantized_gradients") == 0) {
            notice(c, path, key, "ZeRO++ is not implemented: weights and gradients travel in full precision");
        } else {
            return errorf(err, "%s: %s is not a DeepSpeed key colt knows", path, key);
        }
    }
    return 0;
}

int deepspeed_config_apply(TrainConfig *c, const char *path, char *err) {
    json_error_t jerr;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) return errorf(err, "deepspeed: %s line %d: %s", path, jerr.line, jerr.text);
    int rc = 0;
    if (!json_is_object(root)) rc = errorf(err, "deepspeed: %s: not a JSON object", path);
    const char *k;
    json_t *v;
    int world = c->world_size > 0 ? c->world_size : 1;
    json_object_foreach(root, k, v) {
        if (rc != 0) break;
        if (strcmp(k, "zero_optimization") == 0) rc = apply_zero(c, v, path, err);
        else if (strcmp(k, "train_micro_batch_size_per_gpu") == 0)
            rc = check_auto_or_equal(v, c->per_device_train_batch_size, k, "per_device_train_batch_size", path, err);
        else if (strcmp(k, "gradient_accumulation_steps") == 0)
            rc = check_auto_or_equal(v, c->gradient_accumulation_steps, k, "gradient_accumulation_steps", path, err);
        else if (strcmp(k, "train_batch_size") == 0)
            rc = check_auto_or_equal(v, (double)c->per_device_train_batch_size * c->gradient_accumulation_steps * world,
                                     k, "per_device_train_batch_size x gradient_accumulation_steps x world size",
                                     path, err);
        else if (strcmp(k, "gradient_clipping") == 0)
            rc = check_auto_or_equal(v, c->max_grad_norm, k, "max_grad_norm", path, err);
        else if (strcmp(k, "fp16") == 0) {
            if (is_enabled(v)) rc = errorf(err, "%s: fp16 is not supported: colt trains in bf16 on GPUs (set fp16.enabled false)", path);
        } else if (strcmp(k, "bf16") == 0 || strcmp(k, "bfloat16") == 0)
            notice(c, path, k, "colt's precision follows device: bf16 weights with fp32 master weights on GPUs");
        else if (strcmp(k, "optimizer") == 0) {
            const char *type = json_string_value(json_object_get(v, "type"));
            if (type && strcasecmp(type, "AdamW") != 0 && strcasecmp(type, "Adam") != 0)
                rc = errorf(err, "%s: optimizer type '%s' is not supported: colt's optimizer is AdamW", path, type);
            else notice(c, path, k, "colt's optimizer is AdamW with the trainer's settings (learning_rate, adam_beta1, ...)");
        } else if (strcmp(k, "scheduler") == 0)
            notice(c, path, k, "colt's schedule is lr_scheduler_type with warmup_steps / warmup_ratio");
        else if (strcmp(k, "steps_per_print") == 0 || strcmp(k, "wall_clock_breakdown") == 0 ||
                 strcmp(k, "zero_allow_untested_optimizer") == 0 || strcmp(k, "flops_profiler") == 0 ||
                 strcmp(k, "comms_logger") == 0 || strcmp(k, "tensorboard") == 0 || strcmp(k, "wandb") == 0 ||
                 strcmp(k, "csv_monitor") == 0 || strcmp(k, "prescale_gradients") == 0 ||
                 strcmp(k, "gradient_predivide_factor") == 0 || strcmp(k, "communication_data_type") == 0 ||
                 strcmp(k, "activation_checkpointing") == 0 || strcmp(k, "memory_breakdown") == 0 ||
                 strcmp(k, "dump_state") == 0)
            notice(c, path, k, "a DeepSpeed engine setting with no counterpart in colt (colt logs its own timings "
                               "and metrics; gradient_checkpointing is colt's own key)");
        else rc = errorf(err, "%s: '%s' is not a DeepSpeed key colt knows", path, k);
    }
    json_decref(root);
    return rc;
}
