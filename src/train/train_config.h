/* train_config.h — `colt train` settings, named as TRL's GRPOConfig, read
 * from a YAML or JSON file and from --key value flags (flags override).
 * Defaults are TRL 1.x's. An unknown key, a key given twice in one file, and a
 * value outside its key's range are errors naming the key. The other keys of
 * TRL's GRPOConfig, transformers' TrainingArguments and TRL's ModelConfig are
 * known too, and those of the `trl grpo` command (docs/trl_config.md): a TRL
 * name for a colt setting sets it (model_name_or_path), a TRL key colt
 * translates sets colt's settings (bf16: false -> cuda_f32, datasets ->
 * dataset, reward names -> reward specs), a value that changes nothing in colt
 * is accepted with one notice line, any other value is refused saying what to
 * do instead; TRL's null (None) means the default where TRL allows it.
 * Derived values (epsilon_high, steps_per_generation, generation_batch_size,
 * device, min_lr_rate) are resolved and checked by train_config_finalize. Not
 * the trainer: nothing here opens a model or a dataset. */
#ifndef COLT_TRAIN_TRAIN_CONFIG_H
#define COLT_TRAIN_TRAIN_CONFIG_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/lora.h"

typedef struct TrainConfig {
    /* what to train */
    char *model, *dataset, *eval_dataset, *output_dir;
    char *model_revision; /* with a Hub name as model: the cache revision (NULL: main) */
    char *dataset_prompt_column; /* the column holding the prompt (default "prompt") */
    json_t *chat_template_kwargs; /* extra chat template variables (an object), or NULL */
    json_t *reward_funcs;    /* list of reward specs (see data/rewards.h) */
    char *reward_model_name_or_path; /* TRL's script argument: a reward model put first in reward_funcs by
                                      * train_config_finalize (which then clears it) */
    /* tool calling (agent/agent_tools.h): Python tools ("tools.py:f" or
     * "module.f"), rounds of calls per completion (-1: no bound, TRL's None),
     * seconds a call may run */
    json_t *tools;
    /* TRL's environment_factory: a class ("envs.py:MathEnv" or
     * "module.Class"), one instance per rollout, reset with its dataset row;
     * its public methods are that rollout's tools (agent/tool_worker.h) */
    char *environment_factory;
    /* TRL's rollout_func: a function ("rollouts.py:f" or "module.f") that
     * makes a round's completions (train/rollout_func.h); seconds one call may
     * run (0: no limit) */
    char *rollout_func;
    double rollout_func_timeout;
    /* TRL's dict of environments {name: class}, in order, or NULL; then
     * environment_factory is its compact JSON text */
    json_t *environment_factories;
    int max_tool_calling_iterations;
    double tool_timeout;
    json_t *reward_weights;  /* list of numbers or null */
    int max_rounds_without_reward; /* stop after this many rounds in a row where no completion got a reward (0 = never) */
    /* optimisation */
    double learning_rate, warmup_ratio, weight_decay, max_grad_norm, adam_beta1, adam_beta2, adam_epsilon;
    char *lr_scheduler_type;
    int warmup_steps;
    /* transformers' lr_scheduler_kwargs (an object, or NULL), read by
     * train_config_finalize: cosine_with_min_lr's min_lr_rate (or min_lr, as a
     * fraction of learning_rate) becomes min_lr_rate (0 for the other schedules). */
    json_t *lr_scheduler_kwargs;
    double min_lr_rate;
    /* generation */
    int num_generations, max_completion_length, max_prompt_length, top_k;
    double temperature, top_p, min_p, repetition_penalty;
    /* TRL's generation_kwargs (an object, or NULL): its sampling keys override
     * the settings above in train_config_finalize, as TRL passes them last. */
    json_t *generation_kwargs;
    int num_generations_eval;  /* completions per eval prompt (0: num_generations) */
    bool shuffle_dataset;      /* false: prompts in file order every epoch */
    /* GRPO loss */
    double beta, epsilon, epsilon_high, delta;  /* epsilon_high, delta: NaN = unset */
    /* TR-DPO (TRL's SyncRefModelCallback): every ref_model_sync_steps optimizer steps the reference model
     * becomes ref_model_mixup_alpha x policy + (1 - alpha) x reference. Needs beta > 0, not with use_peft. */
    bool sync_ref_model;
    double ref_model_mixup_alpha;
    int ref_model_sync_steps;
    double sapo_temperature_neg, sapo_temperature_pos;                          /* loss_type sapo */
    double vespo_k_pos, vespo_lambda_pos, vespo_k_neg, vespo_lambda_neg;        /* loss_type vespo */
    /* TRL 1.16's masks and entropy terms (train/grpo.h says what each does): top_entropy_quantile 1 keeps
     * every token; off_policy_mask_threshold NaN = None (off); use_bias_correction_kl TRL's default true;
     * entropy_coef 0 and use_adaptive_entropy false: no entropy bonus. */
    double top_entropy_quantile, off_policy_mask_threshold;
    bool use_bias_correction_kl, use_adaptive_entropy;
    double entropy_coef, entropy_coef_min, entropy_coef_max, entropy_coef_delta, entropy_target;
    char *loss_type, *importance_sampling_level, *scale_rewards;
    char *multi_objective_aggregation; /* sum_then_normalize (default) or normalize_then_sum (grpo.h) */
    int num_iterations;
    bool mask_truncated_completions;
    /* DAPO's dynamic sampling (veRL's algorithm.filter_groups, beyond TRL): groups whose rewards all agree are
     * dropped and more generation batches fill the round, at most max_num_gen_batches of them (0: no bound). */
    bool dynamic_sampling;
    int max_num_gen_batches;
    bool gradient_checkpointing;  /* recompute activations in the backward (transformers' name) */
    /* LoRA (TRL's ModelConfig names): adapters trained on the frozen model (model/lora.h) */
    bool use_peft, use_rslora, merge_lora;
    int lora_r;
    double lora_alpha, lora_dropout;
    json_t *lora_target_modules; /* module names, or ["all-linear"] (the default when NULL) */
    /* Sampler / trainer mismatch: TRL's vLLM importance-sampling correction, with
     * colt's in-process engine in vLLM's place (see train/grpo.h). TRL applies
     * it only when use_vllm; colt always generates with its engine, so use_vllm
     * is accepted for TRL configs but changes nothing (kept, default true, so
     * the saved config says what ran). */
    bool use_vllm;
    char *vllm_mode;                          /* "colocate": in-process; "server": a colt serve generates */
    char *ddp_backend;                        /* transformers' ddp_backend: NULL/"nccl" (NCCL between GPUs), "gloo"/"mpi": the host */
    /* vllm_mode server (TRL's names and defaults, host 127.0.0.1): where colt
     * serve listens (base_url, when set, wins), how long to wait for it, and
     * the weight channel's port. async_generation: the next round is
     * generated while this one trains, at most max_staleness steps behind. */
    char *vllm_server_host, *vllm_server_base_url;
    char *vllm_server_api_key; /* colt serve's --api_key (default: COLT_API_KEY); never saved */
    int vllm_server_port, vllm_group_port;
    double vllm_server_timeout;
    bool async_generation;
    int max_staleness;
    /* The one-command form: GPU indices colt train starts colt serve on
     * itself (cli/cmd_train.c); NULL: none. Sets vllm_mode server.
     * server_data_parallel_size: that many replicas (each its own colt serve
     * on len / dp of them, tensor parallel over those). Servers started by
     * hand are several replicas when vllm_server_base_url lists several URLs
     * (kept comma-separated here). */
    json_t *server_devices;
    int server_data_parallel_size;
    /* The weight channel: "nccl" (GPU to GPU), "gloo" (through the host) or
     * "auto": NCCL when both sides are GPUs known to be different ones (the
     * server on another host, or server_devices apart from the trainer's). */
    char *weight_sync_backend;
    /* Structured outputs: every completion a full match of this regex (PCRE2 on
     * bytes, engine/structured.h); NULL: none. TRL's vllm_structured_outputs_regex. */
    char *vllm_structured_outputs_regex;
    bool vllm_importance_sampling_correction; /* TRL default true */
    char *vllm_importance_sampling_mode;      /* token_truncate, token_mask, sequence_truncate, sequence_mask */
    /* NaN = None. clip_max defaults to 3; vllm_importance_sampling_cap (deprecated in
     * TRL 1.6) replaces clip_max when set, as TRL's __post_init__ does. */
    double vllm_importance_sampling_clip_min, vllm_importance_sampling_clip_max, vllm_importance_sampling_cap;
    /* Cap of the engine's KV pool as a fraction of the device's total memory,
     * set by gpu_memory_utilization or TRL's vllm_gpu_memory_utilization (one
     * value, two names). 0 = auto: take what is free after the trainer's
     * allocations — colt's default, where TRL's is 0.3 (vLLM sizes its pool from
     * that fraction alone). gpu_memory_utilization_set: the user gave either key. */
    double gpu_memory_utilization;
    bool gpu_memory_utilization_set;
    /* Deterministic mode (vLLM's VLLM_BATCH_INVARIANT): batch-invariant kernels
     * in the trainer and the engine, so the engine's log-prob of each sampled
     * token is bit-identical to the trainer's (sampling_logp_difference 0, IS
     * ratio 1) and a completion does not depend on its batch. Unset: on where
     * the weights are bf16 (there the default kernels disagree by ~1e-2 per
     * token; on an H200 the mode costs 10-17% of a GRPO step), off for fp32
     * storage (the CPU and cuda_f32 agree to ~1e-6 without it).
     * deterministic_set: the user gave the key. */
    bool deterministic;
    bool deterministic_set;
    /* Models trained side by side: the launcher's processes / tensor_parallel_size (not a setting):
     * generation_batch_size = per_device_train_batch_size x world_size x
     * steps_per_generation, as TRL counts it. Set before train_config_finalize. */
    int world_size;
    int ddp_timeout;       /* seconds a collective may wait (transformers' name; its default is 1800) */
    int ddp_bucket_cap_mb; /* gradient all-reduce bucket size (DDP's name and default, 25) */
    int nproc_per_node; /* processes colt starts itself without a launcher; 0 = one per GPU */
    int tensor_parallel_size; /* ranks each model is cut across (1: whole models, data-parallel only) */
    json_t *devices;  /* list of GPU indices for this node's local ranks, or NULL (local rank r -> GPU r) */
    /* ZeRO and offload (DeepSpeed's meanings): zero_stage 1 keeps 1/world of the
     * optimizer state per rank; offload_optimizer "cpu" keeps the fp32 master
     * weights and moments in host memory and runs AdamW there ("none": on the
     * device). deepspeed: a DeepSpeed JSON config whose zero_optimization
     * section sets these (train_config_finalize reads it; docs/zero.md).
     * zero_stage_set / offload_set: given as colt keys (a DeepSpeed file must
     * then agree). */
    int zero_stage;
    char *offload_optimizer;
    double offload_optimizer_ratio; /* with offload cpu: the share of the state on the host (DeepSpeed's ratio) */
    char *deepspeed;
    bool zero_stage_set, offload_set, offload_ratio_set;
    /* batching (TRL semantics) */
    int per_device_train_batch_size, gradient_accumulation_steps, generation_batch_size, steps_per_generation;
    /* length of training */
    int max_steps;
    double num_train_epochs;
    /* logging and checkpoints */
    int logging_steps, save_steps, save_total_limit, eval_steps, num_eval_prompts, log_completions_count;
    json_t *report_to;       /* transformers' integrations to report to: a list of "none" / "tensorboard", or NULL */
    char *logging_dir;       /* TensorBoard's folder (NULL: $TENSORBOARD_LOGGING_DIR, else output_dir/runs/...) */
    uint64_t seed;
    char *resume_from_checkpoint;
    char *device;            /* cpu, cuda, cuda_f32 or auto */
    /* transformers' precision and device switches, resolved into device by
     * train_config_finalize: bf16 false asks for fp32 weights (cuda_f32 on a
     * GPU), use_cpu true for the CPU; cast_lm_head_to_fp32 is refused where the
     * weights are bf16. */
    bool bf16, use_cpu, cast_lm_head_to_fp32;
    char *save_strategy;     /* "steps", or "no": save_steps becomes 0 */
    char *eval_strategy;     /* NULL; "no": eval_steps 0; "steps": eval_steps 0 becomes logging_steps (transformers') */
    /* Not a setting: the `trl grpo` dataset_name when it is not a local file
     * (a Hub name), for train_config_finalize's message or notice. */
    char *dataset_name;
    bool logging_first_step; /* also log the first optimizer step (transformers') */
    /* Not a setting: device was "auto" until use_cpu: true made it "cpu" (a later use_cpu: false undoes it). */
    bool device_from_use_cpu;
    /* Not a setting: one line per key given whose value changes nothing in
     * colt ({key: line}, or NULL), printed by train_config_print_notices. */
    json_t *notices;
} TrainConfig;

/* Bounds. No real run comes near them; they keep every count and product the
 * trainer forms far inside int (and int64 for step arithmetic), so no setting
 * can overflow it. Each key's range is in the table of train_config.c and in
 * `colt train --help`; the products are checked by train_config_finalize in
 * 64 bits:
 *   per_device_train_batch_size x (max_prompt_length + max_completion_length) <= MAX_TOKENS
 *   generation_batch_size x (max_prompt_length + max_completion_length)       <= MAX_TOKENS
 * (without max_prompt_length, the default, the trainer checks both again with
 * the dataset's longest prompt: train_config_check_lengths)
 *   generation_batch_size (given or batch x steps_per_generation)             <= MAX_COMPLETIONS
 *   steps_per_generation (given or generation_batch_size / batch)             <= MAX_BATCH
 *   num_eval_prompts x num_generations                                        <= MAX_COMPLETIONS
 *   steps_per_generation x num_iterations <= 2^16 x 2^10 = 2^26
 * and total optimizer steps (max_steps, or train_config_total_steps) <= MAX_STEPS, which the LR schedule's
 * int arithmetic needs. */
#define TRAIN_CONFIG_MAX_STEPS 1000000000        /* max_steps, warmup_steps, *_steps, save_total_limit, total steps */
#define TRAIN_CONFIG_MAX_LENGTH 1048576          /* 2^20 tokens: max_prompt_length, max_completion_length */
#define TRAIN_CONFIG_MAX_BATCH 65536             /* 2^16: batch, accumulation, steps_per_generation, num_generations */
#define TRAIN_CONFIG_MAX_ITERATIONS 1024         /* num_iterations */
#define TRAIN_CONFIG_MAX_COMPLETIONS 1048576     /* 2^20 completions generated at once */
#define TRAIN_CONFIG_MAX_TOKENS (1 << 28)        /* tokens of a micro-batch or a generation round, at most */
#define TRAIN_CONFIG_MAX_TOP_K (1 << 24)         /* top_k: above any vocabulary */
#define TRAIN_CONFIG_MAX_EPOCHS 1e6              /* num_train_epochs, in (0, 1e6] */

void train_config_defaults(TrainConfig *c);
void train_config_free(TrainConfig *c);

typedef enum { TRAIN_CONFIG_YAML, TRAIN_CONFIG_JSON } TrainConfigFormat;

/* Merges settings from len bytes of text (no NUL needed) into c; name stands
 * for the file in messages. The text must hold one mapping (an empty file, or
 * one of only comments, is an error); a key may appear once per mapping, at
 * any depth. On error c may hold some of the settings read before it. */
int train_config_load_text(TrainConfig *c, const char *text, size_t len, TrainConfigFormat format, const char *name,
                           char *err);
/* Merges a JSON (.json) or else YAML file into c (through train_config_load_text). */
int train_config_load_file(TrainConfig *c, const char *path, char *err);
/* Sets one key from text (a flag's value): parsed as a YAML scalar, or as JSON
 * for list-valued keys; numbers must lie in the key's range. */
int train_config_set(TrainConfig *c, const char *key, const char *value, const char *where, char *err);
/* Resolves defaults that depend on other settings and checks every value
 * (num_generations >= 2, divisibility of batch sizes, ranges, names). */
int train_config_finalize(TrainConfig *c, char *err);
/* The completions of one round with world_size data-parallel processes, as train_config_finalize
 * resolves it (generation_batch_size, else per_device_train_batch_size x world_size x
 * steps_per_generation or gradient_accumulation_steps), for a caller that needs it before. */
int train_config_round_size(const TrainConfig *c, int world_size);
/* The token products above for prompts of prompt_tokens at most (the
 * dataset's longest, once tokenized): a one-line error naming the settings. */
int train_config_check_lengths(const TrainConfig *c, int prompt_tokens, char *err);

/* vllm_mode server with tensor_parallel_size > 1 is refused, and
 * server_data_parallel_size that does not divide server_devices or comes
 * without them (checked by finalize, and by colt train before it starts any
 * process). */
int train_config_check_server_tp(const TrainConfig *c, char *err);
/* Optimizer steps of the run over n_prompts prompts (c finalized): max_steps
 * when > 0, else ceil(ceil(num_train_epochs x rounds per epoch) x
 * steps_per_generation x num_iterations / gradient_accumulation_steps), with
 * rounds per epoch = n_prompts / (generation_batch_size / num_generations)
 * (the count trainer.c made itself until now). Checked in 64 bits: an error when a round needs more
 * prompts than there are, or when the count passes TRAIN_CONFIG_MAX_STEPS. */
int train_config_total_steps(int64_t *total_steps, const TrainConfig *c, size_t n_prompts, char *err);

/* The whole config as JSON (saved with checkpoints, printed at start). */
json_t *train_config_to_json(const TrainConfig *c);

/* Prints every key with its default and help to fp. */
void train_config_print_help(void *fp);

/* The adapters use_peft asks for (lora_r, lora_alpha, use_rslora, lora_target_modules). */
int train_config_lora(const TrainConfig *c, LoraConfig *out, char *err);

/* Whether report_to lists the integration (e.g. "tensorboard"). */
bool train_config_reports_to(const TrainConfig *c, const char *integration);

/* Prints the notices of the loads so far (log_info0: rank 0 only), once each. */
void train_config_print_notices(const TrainConfig *c);

/* How colt treats a key of a TRL user's config. */
typedef enum {
    TRAIN_KEY_UNKNOWN,  /* neither colt's nor a known TRL/transformers key: an error names it */
    TRAIN_KEY_HONOURED, /* a colt setting */
    TRAIN_KEY_ALIAS,    /* TRL's name for a colt setting (model_name_or_path: model) */
    TRAIN_KEY_NOOP,     /* accepted whatever its value, with a notice: it changes nothing in colt */
    TRAIN_KEY_LIMITED,  /* accepted with a notice for the values that change nothing in colt; others refused */
    TRAIN_KEY_MAPPED,   /* TRL's key whose values colt translates into its settings (bf16: false -> cuda_f32) */
} TrainKeyClass;

/* The class of a key name, and in text (n bytes) one line (markdown) saying
 * what colt does with it: docs/trl_config.md is made of these. */
TrainKeyClass train_config_describe_key(char *text, size_t n, const char *key);

/* True when a key takes true/false, so that `--key` alone on the command line
 * means true (as transformers' HfArgumentParser reads it). */
bool train_config_key_is_bool(const char *key);

/* True when a key takes a list (reward_funcs, report_to, ...), so that
 * `--key a b` on the command line means [a, b] (HfArgumentParser's nargs, as
 * `trl grpo --reward_funcs accuracy_reward think_format_reward` writes it). */
bool train_config_key_is_list(const char *key);

#endif
