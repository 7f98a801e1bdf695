/* train_config.c — see train_config.h. One table lists every key: its type,
 * where it lives in TrainConfig, its range and its help; loading, flags,
 * range checks, help text and the JSON dump all walk it. YAML comes through
 * libyaml's event parser and becomes a jansson value, so YAML and JSON files
 * share one code path (train_config_load_text). Not a schema for the reward
 * specs: reward_funcs is checked by data/rewards.c. */
#include "train/train_config.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <yaml.h>

#include "core/error.h"
#include "core/fileio.h"
#include "core/log.h"
#include "backend/backend.h"
#include "model/lora.h"
#include "train/deepspeed_config.h"
#include "train/tensorboard.h"

typedef enum {
    KEY_DOUBLE,
    KEY_DOUBLE_OR_NULL,
    KEY_INT,
    KEY_U64,
    KEY_BOOL,
    KEY_STRING,
    KEY_JSON_LIST,  /* a JSON list (one object or string alone becomes a list of it) */
    KEY_JSON_OBJECT /* a JSON object (a mapping in YAML) */
} KeyType;

/* Which ends of a double key's range are open: [min, max], (min, max], [min, max). */
typedef enum { RANGE_CLOSED, RANGE_OPEN_MIN, RANGE_OPEN_MAX } RangeEnds;

typedef struct ConfigKey {
    const char *name;
    KeyType type;
    size_t offset;
    const char *help;
    int64_t imin, imax; /* KEY_INT, KEY_U64: allowed values, both included */
    double min, max;    /* KEY_DOUBLE, KEY_DOUBLE_OR_NULL: finite bounds, ends per `ends` */
    RangeEnds ends;
    bool nullable;      /* KEY_INT, KEY_DOUBLE, KEY_BOOL: null (TRL's None) sets the default */
    const char *notice; /* set for a key kept for TRL configs whose value changes nothing in colt: why (one
                         * notice line when the key is given, see add_notice) */
    bool secret;        /* never written out (saved configs, help): a key */
} ConfigKey;

#define STEPS TRAIN_CONFIG_MAX_STEPS
#define K(key, t, h) {.name = #key, .type = t, .offset = offsetof(TrainConfig, key), .help = h}
#define KI(key, lo, hi, h) \
    {.name = #key, .type = KEY_INT, .offset = offsetof(TrainConfig, key), .help = h, .imin = lo, .imax = hi}
#define KI_NULL(key, lo, hi, h)                                                                                      \
    {.name = #key, .type = KEY_INT, .offset = offsetof(TrainConfig, key), .help = h, .imin = lo, .imax = hi, \
     .nullable = true}
#define KD(key, t, lo, e, hi, h) \
    {.name = #key, .type = t, .offset = offsetof(TrainConfig, key), .help = h, .min = lo, .max = hi, .ends = e}
#define KD_NULL(key, lo, e, hi, h)                                                                                   \
    {.name = #key, .type = KEY_DOUBLE, .offset = offsetof(TrainConfig, key), .help = h, .min = lo, .max = hi,    \
     .ends = e, .nullable = true}
#define KB_NULL(key, h) \
    {.name = #key, .type = KEY_BOOL, .offset = offsetof(TrainConfig, key), .help = h, .nullable = true}
/* Ranges: the meaningful interval where there is one (betas, probabilities,
 * fractions); elsewhere a cap no run meets that keeps the value finite as a
 * float and every product of train_config.h's list inside int. Temperature
 * and repetition_penalty stop at 1e-3 and adam_epsilon at 1e-30 because the
 * float a smaller value becomes divides logits or updates (0 would give inf). */
static const ConfigKey KEYS[] = {
    K(model, KEY_STRING,
      "Hugging Face model folder to train, or a Hub name (Qwen/Qwen2.5-0.5B-Instruct) read from the local Hugging Face "
      "cache, as transformers does offline"),
    K(model_revision, KEY_STRING,
      "with a Hub name as model: the revision in the local cache (a branch, tag or commit; null: main)"),
    K(dataset, KEY_STRING, "prompts: .jsonl (or .json: JSON Lines or an array) of objects with a prompt column"),
    K(dataset_prompt_column, KEY_STRING,
      "the dataset column holding the prompt (a string, or a list of {role, content} messages)"),
    K(chat_template_kwargs, KEY_JSON_OBJECT,
      "extra variables of the chat template for conversational prompts, e.g. {enable_thinking: false} (Qwen3)"),
    K(eval_dataset, KEY_STRING, "held-out prompts, scored before and after training"),
    K(output_dir, KEY_STRING, "where metrics, checkpoints and the final model go"),
    K(reward_funcs, KEY_JSON_LIST, "list of reward specs ({type: length|regex|math|command|python|model|judge, ...}, "
                                   "\"rewards.py:FUNCTION\", a reward model's folder, or TRL's think_format_reward / "
                                   "accuracy_reward; docs/rewards.md)"),
    K(reward_model_name_or_path, KEY_STRING,
      "a reward model (folder, or Hub name in the local cache) scoring before reward_funcs, as TRL's `trl grpo "
      "--reward_model_name_or_path` puts it first in reward_funcs (a reward_weights list counts it)"),
    K(tools, KEY_JSON_LIST,
      "Python functions the model may call (TRL's tools=[...]): \"tools.py:calculator\" or \"module.function\"; "
      "their JSON schemas come from type hints and docstrings, the prompt is rendered with them, a completion's "
      "calls run in a Python worker and their results are appended for the model to go on (never trained on)"),
    K(environment_factory, KEY_STRING,
      "a Python class (TRL's environment_factory): \"envs.py:MathEnv\" or \"module.Class\"; one instance per "
      "completion, reset(**row) with its dataset row, whose returned text is appended to the prompt's last message; "
      "its public methods are that completion's tools, and get_reward(), when defined, an extra reward named after "
      "the class (weight 1); Python reward functions get environments=[...]. Or TRL's dict of environments, "
      "{math: \"envs.py:MathEnv\", game: \"games.py:Guess\"} (JSON on the command line): each row's "
      "'environment' column picks one, whose tools alone its prompt shows (docs/agents.md)"),
    K(rollout_func, KEY_STRING,
      "a Python function that makes each round's completions (TRL's rollout_func): \"rollouts.py:my_rollout\" or "
      "\"module.function\"; called with this process's prompts (each repeated num_generations times) and a trainer "
      "object (args, processing_class, generate on colt's engine), it returns prompt_ids, completion_ids, logprobs, "
      "optionally env_mask (0: not the model's token, not trained on) and extra fields for the rewards "
      "(docs/agents.md)"),
    KD(rollout_func_timeout, KEY_DOUBLE, 0, RANGE_CLOSED, 604800,
       "seconds one rollout_func call may run, its generation included; past it the run stops (0: no limit)"),
    KI_NULL(max_tool_calling_iterations, -1, 1000000,
            "rounds of tool calls per completion (null or -1: no bound, as TRL's None)"),
    KD(tool_timeout, KEY_DOUBLE, 0, RANGE_OPEN_MIN, 86400,
       "seconds one tool call may run; past it the model gets an error text, as for a tool that raised"),
    K(reward_weights, KEY_JSON_LIST, "one weight per reward function (default 1 each; each within +-1e6)"),
    KI(max_rounds_without_reward, 0, STEPS,
       "stop with an error after N generation rounds in a row in which no completion got a usable reward (every "
       "reward function gave NaN/None, so nothing trains); each such round also warns (0 = warn, never stop)"),
    KD(learning_rate, KEY_DOUBLE, 0, RANGE_CLOSED, 100, "AdamW learning rate"),
    K(lr_scheduler_type, KEY_STRING, "constant, constant_with_warmup, linear, cosine or cosine_with_min_lr"),
    K(lr_scheduler_kwargs, KEY_JSON_OBJECT,
      "transformers' schedule arguments: with cosine_with_min_lr {min_lr_rate: R} (the cosine ends at R x "
      "learning_rate) or {min_lr: LR}; the other schedules take none"),
    KD(warmup_ratio, KEY_DOUBLE, 0, RANGE_CLOSED, 1, "fraction of steps for linear warmup"),
    KI(warmup_steps, 0, STEPS, "warmup steps (overrides warmup_ratio when > 0)"),
    KD(weight_decay, KEY_DOUBLE, 0, RANGE_CLOSED, 100, "AdamW decoupled weight decay"),
    KD(adam_beta1, KEY_DOUBLE, 0, RANGE_OPEN_MAX, 1, "AdamW beta1"),
    KD(adam_beta2, KEY_DOUBLE, 0, RANGE_OPEN_MAX, 1, "AdamW beta2"),
    KD(adam_epsilon, KEY_DOUBLE, 1e-30, RANGE_CLOSED, 1, "AdamW epsilon"),
    KD(max_grad_norm, KEY_DOUBLE, 0, RANGE_CLOSED, 1e9, "clip the global gradient norm to this (0 = off)"),
    KI(num_generations, 2, TRAIN_CONFIG_MAX_BATCH, "completions per prompt (G; GRPO compares them, so >= 2)"),
    KI_NULL(num_generations_eval, 0, TRAIN_CONFIG_MAX_BATCH,
            "completions per eval_dataset prompt (0 or null: num_generations)"),
    KI(max_completion_length, 1, TRAIN_CONFIG_MAX_LENGTH, "tokens per completion at most"),
    KI_NULL(max_prompt_length, 0, TRAIN_CONFIG_MAX_LENGTH,
            "prompt tokens kept (longer prompts lose their left part); null or 0 (the default): whole prompts, as "
            "TRL 1.16, which has no such setting (engine and memory plan sized from the dataset's longest prompt)"),
    KD(temperature, KEY_DOUBLE, 1e-3, RANGE_CLOSED, 100, "sampling temperature (also divides the logits when scoring)"),
    KD(top_p, KEY_DOUBLE, 0, RANGE_OPEN_MIN, 1, "nucleus sampling"),
    KI_NULL(top_k, 0, TRAIN_CONFIG_MAX_TOP_K, "top-k sampling (0 = off)"),
    KD_NULL(min_p, 0, RANGE_CLOSED, 1, "min-p sampling (0 or null = off)"),
    KD(repetition_penalty, KEY_DOUBLE, 1e-3, RANGE_CLOSED, 100, "repetition penalty (1 = off)"),
    K(generation_kwargs, KEY_JSON_OBJECT,
      "TRL's sampling arguments, which override the settings above: temperature, top_p, top_k, min_p, "
      "repetition_penalty, max_tokens or max_new_tokens (max_completion_length); do_sample: true, num_beams: 1, "
      "skip_special_tokens: true and output options (logprobs, use_cache, ...) change nothing; other keys are "
      "refused"),
    KD(beta, KEY_DOUBLE, 0, RANGE_CLOSED, 1000,
       "KL coefficient against the reference model: the initial model, frozen unless sync_ref_model (0 = no "
       "reference model)"),
    K(sync_ref_model, KEY_BOOL,
      "TR-DPO (TRL's SyncRefModelCallback): every ref_model_sync_steps optimizer steps the reference model becomes "
      "ref_model_mixup_alpha x the policy + (1 - ref_model_mixup_alpha) x the reference (needs beta > 0; not with "
      "use_peft, as TRL); checkpoints then hold the reference model (ref_model/)"),
    KD(ref_model_mixup_alpha, KEY_DOUBLE, 0, RANGE_CLOSED, 1, "sync_ref_model: the policy's share alpha of the mix"),
    KI(ref_model_sync_steps, 1, STEPS, "sync_ref_model: optimizer steps between two syncs (at global_step % N == 0)"),
    KD(epsilon, KEY_DOUBLE, 0, RANGE_CLOSED, 1000, "lower clipping epsilon"),
    KD(epsilon_high, KEY_DOUBLE_OR_NULL, 0, RANGE_CLOSED, 1000, "upper clipping epsilon (default: epsilon)"),
    KD(delta, KEY_DOUBLE_OR_NULL, 1, RANGE_OPEN_MIN, 1e9, "cap on the importance ratio (two-sided clipping; null = off)"),
    K(loss_type, KEY_STRING, "grpo, bnpo, dr_grpo, dapo, cispo, sapo, luspo or vespo (TRL's losses)"),
    KD(sapo_temperature_neg, KEY_DOUBLE, 0, RANGE_OPEN_MIN, 1e6, "sapo: the gate's temperature for advantages <= 0"),
    KD(sapo_temperature_pos, KEY_DOUBLE, 0, RANGE_OPEN_MIN, 1e6, "sapo: the gate's temperature for advantages > 0"),
    KD(vespo_k_pos, KEY_DOUBLE, 0, RANGE_CLOSED, 1e6, "vespo: the gamma weight's power for advantages >= 0"),
    KD(vespo_lambda_pos, KEY_DOUBLE, 0, RANGE_CLOSED, 1e6, "vespo: the gamma weight's decay for advantages >= 0"),
    KD(vespo_k_neg, KEY_DOUBLE, 0, RANGE_CLOSED, 1e6, "vespo: the gamma weight's power for advantages < 0"),
    KD(vespo_lambda_neg, KEY_DOUBLE, 0, RANGE_CLOSED, 1e6, "vespo: the gamma weight's decay for advantages < 0"),
    KD(top_entropy_quantile, KEY_DOUBLE, 0, RANGE_CLOSED, 1,
       "keep in the policy loss only the top quantile of tokens by entropy, over each micro-batch of every process "
       "(1 = every token; 0 = the highest-entropy token alone)"),
    KD(off_policy_mask_threshold, KEY_DOUBLE_OR_NULL, -1e9, RANGE_CLOSED, 1e9,
       "drop from the policy loss each sequence with a negative advantage whose mean log-prob gap (engine minus "
       "trainer) exceeds this (DeepSeek-V3.2's off-policy sequence mask; null = off)"),
    K(use_bias_correction_kl, KEY_BOOL,
      "with beta > 0: multiply the KL term by the importance ratio (the unbiased reverse-KL gradient; false: plain k3)"),
    KD(entropy_coef, KEY_DOUBLE, -1e6, RANGE_CLOSED, 1e6,
       "entropy bonus: loss -= entropy_coef x the mean per-token entropy (0 = off; with use_adaptive_entropy, its "
       "starting value)"),
    K(use_adaptive_entropy, KEY_BOOL,
      "adaptive entropy control (Skywork-OR1): each optimizer step moves entropy_coef by entropy_coef_delta toward "
      "keeping the entropy above entropy_target, and applies it only while the entropy is at or below the target"),
    KD(entropy_coef_min, KEY_DOUBLE, -1e6, RANGE_CLOSED, 1e6, "use_adaptive_entropy: lower bound of entropy_coef"),
    KD(entropy_coef_max, KEY_DOUBLE, -1e6, RANGE_CLOSED, 1e6, "use_adaptive_entropy: upper bound of entropy_coef"),
    KD(entropy_coef_delta, KEY_DOUBLE, 0, RANGE_CLOSED, 1e6, "use_adaptive_entropy: entropy_coef's step"),
    KD(entropy_target, KEY_DOUBLE, 0, RANGE_CLOSED, 1e6,
       "use_adaptive_entropy: target mean per-token entropy (nats), over the tokens in the loss"),
    K(importance_sampling_level, KEY_STRING, "token or sequence (GSPO)"),
    K(scale_rewards, KEY_STRING, "group, batch or none"),
    K(multi_objective_aggregation, KEY_STRING,
      "with several reward functions: sum_then_normalize (the weighted sum, then scale_rewards) or "
      "normalize_then_sum (GDPO: each function normalised within its group, then the weighted sum over the "
      "batch; scale_rewards does not apply), as TRL"),
    KI(num_iterations, 1, TRAIN_CONFIG_MAX_ITERATIONS, "optimisation passes over each generation batch (mu)"),
    K(mask_truncated_completions, KEY_BOOL, "drop completions that hit max_completion_length from the loss"),
    K(dynamic_sampling, KEY_BOOL,
      "DAPO's dynamic sampling (veRL's filter_groups; beyond TRL): a group whose rewards all agree (std 0: no "
      "signal) is dropped and more generation batches are made until the round has generation_batch_size "
      "completions of groups that differ; logs num_gen_batches and num_dropped_groups"),
    KI(max_num_gen_batches, 0, 1000000,
       "dynamic_sampling: generation batches a round may take; past it the run stops with an error, as veRL's "
       "(0: no bound)"),
    K(gradient_checkpointing, KEY_BOOL, "recompute activations in the backward: ~1 more forward, far less memory"),
    K(use_peft, KEY_BOOL,
      "train LoRA adapters on the frozen model instead of every weight (saved in PEFT's format: "
      "adapter_config.json + adapter_model.safetensors)"),
    KI(lora_r, 1, 4096, "LoRA rank"),
    KD(lora_alpha, KEY_DOUBLE, 0, RANGE_OPEN_MIN, 1e6, "LoRA alpha: the adapter term is scaled by lora_alpha / lora_r"),
    KD(lora_dropout, KEY_DOUBLE, 0, RANGE_OPEN_MAX, 1,
       "dropout on the adapters' input in the training forward (TRL's default 0.05; PEFT's nn.Dropout)"),
    K(lora_target_modules, KEY_JSON_LIST,
      "layers that get adapters: all-linear (default: q_proj k_proj v_proj o_proj gate_proj up_proj down_proj) or "
      "a list of those names"),
    K(use_rslora, KEY_BOOL, "rank-stabilised LoRA: scale by lora_alpha / sqrt(lora_r)"),
    K(merge_lora, KEY_BOOL,
      "with use_peft: also write the merged model (weights + adapters, a plain Hugging Face checkpoint) to "
      "output_dir/merged at the end"),
    {.name = "use_vllm", .type = KEY_BOOL, .offset = offsetof(TrainConfig, use_vllm),
     .help = "accepted for TRL configs; colt always generates with its in-process engine",
     .notice = "colt always generates with its own in-process engine on the trainer's weights (vLLM is not used)"},
    K(vllm_mode, KEY_STRING,
      "colocate (generation in-process on the trainer's weights) or server (a running colt serve generates; the "
      "trainer pushes its weights to it after every optimizer step, with use_peft the adapters alone: "
      "docs/training.md)"),
    K(vllm_server_host, KEY_STRING, "vllm_mode server: the colt serve host (ignored when vllm_server_base_url is set)"),
    KI(vllm_server_port, 1, 65535, "vllm_mode server: the colt serve port"),
    K(vllm_server_base_url, KEY_STRING,
      "vllm_mode server: the colt serve URL, e.g. http://10.0.0.7:8000 (overrides host and port); several "
      "data-parallel replicas (colt serves of the same model): a list of URLs, or them comma-separated; replica i's "
      "weight channel is at vllm_group_port + i"),
    {.name = "vllm_server_api_key", .type = KEY_STRING, .offset = offsetof(TrainConfig, vllm_server_api_key),
     .secret = true,
     .help = "vllm_mode server: colt serve's --api_key, sent on every request and to join the weight channel "
             "(default: the environment's COLT_API_KEY, which ps does not show; never saved)"},
    KD(vllm_server_timeout, KEY_DOUBLE, 0, RANGE_OPEN_MIN, 86400,
       "vllm_mode server: seconds to wait for the server to come up, and the bound on every wait for it after"),
    KI(vllm_group_port, 1, 65535,
       "vllm_mode server: the port of the weight channel's group (its store listens on the server's host)"),
    K(async_generation, KEY_BOOL,
      "vllm_mode server: the server generates the next round while the trainer trains on this one (one-step "
      "off-policy; the importance-sampling correction applies; metrics log staleness)"),
    K(server_devices, KEY_JSON_LIST,
      "the one-command form of server mode: colt train starts colt serve itself on these GPUs (e.g. [7]; bound to "
      "127.0.0.1, a free port), trains on the others (or on devices), and stops it at the end; sets vllm_mode "
      "server. Several GPUs: the model is cut across them (colt serve --tensor_parallel_size, one process per GPU). "
      "On the CPU the server runs on the CPU, one process per entry"),
    KI(server_data_parallel_size, 1, 1024,
       "server_devices: how many data-parallel replicas of colt serve to start (each its own server on its own "
       "ports, on len(server_devices) / this many of the GPUs, tensor parallel over them); each round's completions "
       "are split over them"),
    K(weight_sync_backend, KEY_STRING,
      "vllm_mode server: auto (NCCL when trainer and server are on different GPUs: another host, or server_devices "
      "apart from the trainer's; else through the host), nccl, or gloo (through the host)"),
    KI(max_staleness, 1, 1,
       "async_generation: optimizer steps a round's weights may lag the weights it trains (1: one round in flight)"),
    K(vllm_structured_outputs_regex, KEY_STRING,
      "every completion is generated as a full match of this regex (PCRE2, on bytes; structured outputs: the "
      "engine masks the tokens that cannot continue a match, eos only after a full match); null: none"),
    K(vllm_importance_sampling_correction, KEY_BOOL,
      "weight the loss by exp(trainer old log-prob - sampler log-prob), bounded per vllm_importance_sampling_mode"),
    K(vllm_importance_sampling_mode, KEY_STRING, "token_truncate, token_mask, sequence_truncate or sequence_mask"),
    KD(vllm_importance_sampling_clip_min, KEY_DOUBLE_OR_NULL, 0, RANGE_CLOSED, 1e9,
       "lower bound of the IS ratio (null = none)"),
    KD(vllm_importance_sampling_clip_max, KEY_DOUBLE_OR_NULL, 0, RANGE_OPEN_MIN, 1e9,
       "upper bound of the IS ratio (null = none)"),
    KD(vllm_importance_sampling_cap, KEY_DOUBLE_OR_NULL, 0, RANGE_OPEN_MIN, 1e9,
       "deprecated (TRL): sets vllm_importance_sampling_clip_max"),
    KD(gpu_memory_utilization, KEY_DOUBLE, 0, RANGE_CLOSED, 1,
       "KV pool cap, fraction of total device memory (0 = auto: what is free)"),
    {.name = "vllm_gpu_memory_utilization", .type = KEY_DOUBLE, .offset = offsetof(TrainConfig, gpu_memory_utilization),
     .help = "TRL's name for gpu_memory_utilization (colt's default 0 = auto, not TRL's 0.3)", .min = 0, .max = 1},
    K(deterministic, KEY_BOOL,
      "batch-invariant kernels: engine log-probs bit-identical to the trainer's, completions independent of the "
      "batch (default: on for bf16 weights, where it costs ~10-17% of a GRPO step; off for fp32)"),
    KI(per_device_train_batch_size, 1, TRAIN_CONFIG_MAX_BATCH, "completions per micro-batch"),
    KI(gradient_accumulation_steps, 1, TRAIN_CONFIG_MAX_BATCH, "micro-batches per optimizer step"),
    KI_NULL(generation_batch_size, 0, TRAIN_CONFIG_MAX_COMPLETIONS,
            "completions per generation round (default: batch * steps_per_generation)"),
    KI_NULL(steps_per_generation, 0, TRAIN_CONFIG_MAX_BATCH,
            "micro-batches per generation round (default: gradient_accumulation_steps)"),
    KI(max_steps, -1, STEPS, "optimizer steps (-1: from num_train_epochs)"),
    KD(num_train_epochs, KEY_DOUBLE, 0, RANGE_OPEN_MIN, TRAIN_CONFIG_MAX_EPOCHS,
       "passes over the prompts when max_steps is -1"),
    KI(logging_steps, 1, STEPS, "log metrics every N optimizer steps"),
    K(logging_first_step, KEY_BOOL, "also log the first optimizer step (transformers')"),
    KI(save_steps, 0, STEPS, "save a checkpoint every N optimizer steps (0 = only at the end)"),
    K(save_strategy, KEY_STRING, "steps (checkpoints every save_steps), or no (none: save_steps 0); the model is "
                                 "saved at the end either way"),
    KI_NULL(save_total_limit, 0, STEPS, "keep at most N checkpoints (0 = all)"),
    KI_NULL(eval_steps, 0, STEPS, "evaluate on eval_dataset every N steps (0 or null = only before and after)"),
    K(eval_strategy, KEY_STRING,
      "transformers' switch: steps (with eval_steps 0 or null: every logging_steps steps) or no (no scoring "
      "between the first and last: eval_steps 0); unset (null): eval_steps alone decides. eval_dataset is scored "
      "before and after training either way"),
    KI(num_eval_prompts, 0, TRAIN_CONFIG_MAX_COMPLETIONS, "eval prompts used (0 = all)"),
    KI(log_completions_count, 0, TRAIN_CONFIG_MAX_COMPLETIONS, "sample completions printed and saved per logging step"),
    K(report_to, KEY_JSON_LIST,
      "where metrics go besides output_dir/metrics.jsonl: none, or tensorboard (event files in logging_dir, tagged "
      "as transformers' TensorBoardCallback tags them)"),
    K(logging_dir, KEY_STRING,
      "the TensorBoard folder for report_to tensorboard (default: $TENSORBOARD_LOGGING_DIR, else "
      "output_dir/runs/<Mon DD_HH-MM-SS>_<host>, as transformers)"),
    {.name = "seed", .type = KEY_U64, .offset = offsetof(TrainConfig, seed), .help = "seed for shuffling and sampling",
     .imin = 0, .imax = INT64_MAX},
    KB_NULL(shuffle_dataset, "shuffle the prompts every epoch with seed (false: file order, as TRL)"),
    K(resume_from_checkpoint, KEY_STRING, "checkpoint folder to continue from"),
    K(device, KEY_STRING,
      "cpu, cuda (bf16 weights), cuda_f32 (fp32 weights) or auto (cuda when a GPU is usable, else cpu)"),
    KB_NULL(bf16, "transformers' switch: true (default) keeps bf16 weights on a GPU; false asks for fp32 weights "
                  "(device auto picks cuda_f32 on a GPU; the CPU computes in fp32 either way)"),
    K(use_cpu, KEY_BOOL, "transformers' switch: true trains on the CPU (device cpu)"),
    K(cast_lm_head_to_fp32, KEY_BOOL,
      "TRL's fp32 lm_head: where the weights are fp32 (cpu, cuda_f32) lm_head already is; refused on bf16 weights "
      "(set bf16: false instead)"),
    K(devices, KEY_JSON_LIST,
      "GPU indices this node's processes use, local rank r taking the r-th (default: 0, 1, ...; list one twice to "
      "share a GPU on purpose)"),
    KI(tensor_parallel_size, 1, 1024,
       "processes each model is cut across (Megatron-style: heads, MLP columns, vocabulary); groups of consecutive "
       "ranks, data-parallel across groups; the world size must be a multiple"),
    {.name = "vllm_tensor_parallel_size", .type = KEY_INT, .offset = offsetof(TrainConfig, tensor_parallel_size),
     .help = "TRL's name for tensor_parallel_size (colt trains and generates with the same parts)", .imin = 1,
     .imax = 1024},
    KI(nproc_per_node, 0, 1024,
       "processes colt starts on this node when no launcher started it (0 = one per visible GPU, or per entry of "
       "devices; 1 = this process alone)"),
    K(ddp_backend, KEY_STRING,
      "how data-parallel ranks sum their gradients (transformers' ddp_backend): nccl (the default between processes "
      "that each have a GPU; the host otherwise), or gloo / mpi: through host memory even on GPUs (slow: for "
      "comparison and debugging)"),
    KI(ddp_timeout, 1, 604800,
       "seconds any rank waits for the others in a collective before the job stops with an error (several processes)"),
    KI_NULL(ddp_bucket_cap_mb, 1, 65536,
       "MB of gradients per all-reduce bucket (null: 25): GPU ranks reduce a bucket over NCCL as soon as the "
       "backward pass finished its layers (several processes)"),
    KI(zero_stage, 0, 3,
       "ZeRO stage (DeepSpeed's meaning): 0 = full optimizer state on every rank, 1 = optimizer state sharded over "
       "the ranks, 2 = gradients sharded too, 3 = weights sharded too (each layer gathered while a pass uses it)"),
    K(offload_optimizer, KEY_STRING,
      "none, or cpu: fp32 master weights and AdamW moments in host memory, AdamW run on the host's cores"),
    KD(offload_optimizer_ratio, KEY_DOUBLE, 0, RANGE_CLOSED, 1,
       "with offload_optimizer cpu: the share of the optimizer state kept and updated on the host (DeepSpeed's "
       "offload_optimizer.ratio); the device keeps the rest and updates it itself, in milliseconds"),
    K(deepspeed, KEY_STRING,
      "a DeepSpeed JSON config (TRL's key): its zero_optimization stage and offload_optimizer device and ratio set "
      "zero_stage, offload_optimizer and offload_optimizer_ratio; every other key is named as honoured, ignored or "
      "refused"),
};
#undef K
#undef KI
#undef KI_NULL
#undef KD
#undef KD_NULL
#undef KB_NULL
#undef STEPS
#define N_KEYS (sizeof KEYS / sizeof KEYS[0])

/* ---------------------------------------------------------------- TRL's other keys */

/* The keys of TRL's GRPOConfig, transformers' TrainingArguments and TRL's
 * ModelConfig (tests/data/trl_config_keys.txt, from the installed trl; a few
 * older names besides) that are not colt settings. Each is one of:
 *   - an alias: TRL's name for a colt setting, which it sets;
 *   - accepted values ("*" = any): values that change nothing in colt. They
 *     load with one notice line saying why; any other value is refused as a
 *     known setting colt does not support (yet). The text serves both: what
 *     colt does, and what to do instead.
 *   - translated (apply): a function turns the value into colt's settings
 *     (datasets -> dataset), adds a notice, or refuses it in one line.
 * Values are YAML scalars (true, null, 1, none) compared as loaded (numbers by
 * value, strings ignoring case), or [] and {} (empty), or [x] (a list of x),
 * or "" (the empty string). test_train_config checks that every key of the
 * list is here or in KEYS, and docs/trl_config.md is made from both tables. */
typedef struct TrlKey TrlKey;
/* A key whose values colt translates (datasets -> dataset): sets c, or adds a
 * notice, or fills err with one line. */
typedef int (*TrlKeyApply)(TrainConfig *c, const TrlKey *t, const json_t *v, const char *where, char *err);
struct TrlKey {
    const char *name;
    const char *alias;    /* the colt key it sets, or NULL */
    const char *accepted; /* space-separated values that change nothing in colt ("*": any) */
    const char *text;     /* what colt does instead (for apply: what it does with the key) */
    TrlKeyApply apply;    /* set for a translated key (TRAIN_KEY_MAPPED) */
};

#define ALIAS(n, target) {.name = n, .alias = target}
#define NOOP(n, t) {.name = n, .accepted = "*", .text = t}
#define ONLY(n, values, t) {.name = n, .accepted = values, .text = t}
#define BOOL_NOOP(n, t) ONLY(n, "true false null", t) /* a bool (or None) that changes nothing */
#define APPLY(n, fn, t) {.name = n, .apply = fn, .text = t}

#define T_PRECISION                                                                                                  \
    "colt's precision follows device: on a GPU bf16 weights and compute with fp32 master weights, gradients and " \
    "AdamW moments (bf16: false or device cuda_f32: fp32 throughout), on the CPU fp32"
#define T_FP16 T_PRECISION "; fp16 is not supported: use bf16"
#define T_COMPILE \
    "colt runs its own compiled C/CUDA kernels (fused where it pays): there is nothing to compile or swap in"
#define T_LOG "colt prints progress on rank 0 and writes every metric to output_dir/metrics.jsonl"
#define T_TRACKERS \
    "colt writes its metrics to output_dir/metrics.jsonl and completions.jsonl, and to TensorBoard with report_to " \
    "tensorboard; it reports to no other tracker (wandb, ...)"
#define T_HUB "colt saves to output_dir and uploads nothing: upload the folder yourself (hf upload REPO_ID OUTPUT_DIR)"
#define T_EVAL \
    "colt scores eval_dataset (when given) by mean reward before and after training and every eval_steps steps"
#define T_LOADER "colt holds the whole prompt file in memory: there is no DataLoader"
#define T_DIST \
    "colt's data parallelism (one process per GPU, every gradient all-reduced in buckets) has no such switch"
#define T_SHARDING \
    "FSDP is not supported: colt shards with ZeRO instead (zero_stage 1-3, offload_optimizer, or a DeepSpeed " \
    "config in deepspeed) and cuts models with tensor_parallel_size; remove the setting"
#define T_PEFT_ONLY "colt's LoRA adapts the linear layers of every decoder block (lora_target_modules)"
#define T_QUANT "quantized loading (bitsandbytes) is not supported: colt trains the model's full-precision weights"
#define T_BNB "used only with load_in_4bit or load_in_8bit, which colt does not support"
#define T_SAMPLER \
    "TRL's GRPO sampler (RepeatSampler) ignores it: it shuffles the prompts with seed when shuffle_dataset is true, " \
    "as colt does"
#define T_COMPLETIONS \
    "colt writes every completion to output_dir/completions.jsonl and prints log_completions_count of them at each " \
    "logging step"
#define T_GENERATE_HF "used only when use_vllm is false; colt's engine batches continuously over a paged KV cache"
#define T_DATASET \
    "colt reads a local .jsonl or .json file: set dataset to it (export a hub dataset with " \
    "datasets.load_dataset(NAME, split=SPLIT).to_json(\"x.jsonl\"))"

static const ConfigKey *find_key(const char *name);
static int set_from_json(TrainConfig *c, const ConfigKey *k, json_t *v, const char *where, char *err);
static void add_notice(TrainConfig *c, const char *key, const json_t *v, const char *why, const char *where);
static void value_text(char *out, size_t n, const json_t *v);

/* Whether path names a JSON Lines or JSON file by its extension (what dataset reads). */
static bool is_json_file_name(const char *path) {
    size_t n = strlen(path);
    return (n > 6 && strcmp(path + n - 6, ".jsonl") == 0) || (n > 5 && strcmp(path + n - 5, ".json") == 0);
}

/* accelerator_config: Accelerate's options change nothing in colt at their
 * defaults (the object GRPOConfig().to_dict() writes); another value would
 * ask for a behaviour colt does not have, so it is refused. */
static int apply_accelerator_config(TrainConfig *c, const TrlKey *t, const json_t *v, const char *where, char *err) {
    static const struct {
        const char *key, *value; /* the default, as JSON */
    } defaults[] = {{"split_batches", "false"},       {"dispatch_batches", "null"},
                    {"even_batches", "true"},         {"use_seedable_sampler", "true"},
                    {"non_blocking", "false"},        {"gradient_accumulation_kwargs", "null"},
                    {"use_configured_state", "false"}};
    if (!json_is_null(v) && !json_is_object(v))
        return errorf(err, "%s: accelerator_config must be a mapping (Accelerate's options) or null", where);
    const char *key;
    json_t *value;
    json_object_foreach((json_t *)v, key, value) {
        size_t i = 0, n = sizeof defaults / sizeof defaults[0];
        while (i < n && strcmp(defaults[i].key, key) != 0) i++;
        json_t *want = i < n ? json_loads(defaults[i].value, JSON_DECODE_ANY, NULL) : NULL;
        bool same = want && json_equal(want, value);
        json_decref(want);
        if (!same) {
            char text[80];
            value_text(text, sizeof text, value);
            return errorf(err, "%s: accelerator_config.%s: %s is not supported: colt does not run on Accelerate (it "
                               "launches and synchronises its processes itself); leave Accelerate's default%s",
                          where, key, text, i < n ? "" : " keys only");
        }
    }
    add_notice(c, t->name, v, "colt does not run on Accelerate: it launches and synchronises its processes itself",
               where);
    return COLT_OK;
}

/* dataset_name (TRL's scripts): a local .jsonl / .json file is colt's dataset;
 * a Hub name is kept for train_config_finalize (usable only beside dataset). */
static int apply_dataset_name(TrainConfig *c, const TrlKey *t, const json_t *v, const char *where, char *err) {
    (void)t;
    if (json_is_null(v)) return COLT_OK;
    if (!json_is_string(v)) return errorf(err, "%s: dataset_name must be a string (a local .jsonl file)", where);
    const char *name = json_string_value(v);
    if (is_json_file_name(name)) return set_from_json(c, find_key("dataset"), (json_t *)v, where, err);
    free(c->dataset_name);
    c->dataset_name = xstrdup(name);
    return COLT_OK;
}

/* datasets (`trl grpo`'s DatasetMixtureConfig): one entry naming a local
 * JSON Lines / JSON file, as datasets.load_dataset reads it, is colt's
 * dataset. Anything that would select, mix or fetch rows is refused. */
static int apply_datasets(TrainConfig *c, const TrlKey *t, const json_t *v, const char *where, char *err) {
    (void)t;
    if (json_is_null(v) || (json_is_array(v) && json_array_size(v) == 0)) return COLT_OK;
    const json_t *d = json_is_array(v) && json_array_size(v) == 1 ? json_array_get(v, 0) : v;
    if (json_is_array(v) && json_array_size(v) > 1)
        return errorf(err, "%s: datasets: %zu datasets: mixtures are not supported; concatenate them into one .jsonl "
                           "file and set dataset", where, json_array_size(v));
    if (!json_is_object(d) || !json_is_string(json_object_get(d, "path")))
        return errorf(err, "%s: datasets: each entry must be a mapping with a path (e.g. {path: json, data_files: "
                           "prompts.jsonl})", where);
    const char *key;
    json_t *value;
    json_object_foreach((json_t *)d, key, value) {
        bool is_train = json_is_string(value) && !strcmp(json_string_value(value), "train");
        bool harmless = !strcmp(key, "path") || !strcmp(key, "data_files") || !strcmp(key, "fraction") ||
                        ((!strcmp(key, "name") || !strcmp(key, "data_dir") || !strcmp(key, "columns")) &&
                         json_is_null(value)) ||
                        (!strcmp(key, "split") && (json_is_null(value) || is_train));
        if (!harmless) {
            char text[80];
            value_text(text, sizeof text, value);
            return errorf(err, "%s: datasets[0].%s: %s is not supported: colt reads every row of one local file "
                               "(datasets: [{path: json, data_files: prompts.jsonl}], or dataset: prompts.jsonl)",
                          where, key, text);
        }
    }
    const char *path = json_string_value(json_object_get(d, "path"));
    const json_t *files = json_object_get(d, "data_files");
    if (json_is_array(files) && json_array_size(files) == 1) files = json_array_get(files, 0);
    else if (json_is_object(files) && json_object_size(files) == 1) files = json_object_get(files, "train");
    const char *file = NULL;
    if ((!strcmp(path, "json") || is_json_file_name(path)) && json_is_string(files) &&
        is_json_file_name(json_string_value(files)))
        file = json_string_value(files);
    else if (is_json_file_name(path) && (!files || json_is_null(files)))
        file = path;
    if (!file)
        return errorf(err, "%s: datasets[0]: path '%s' is not a local JSON file colt can read: " T_DATASET
                           " and set datasets: [{path: json, data_files: x.jsonl}]", where, path);
    json_t *f = json_string(file);
    int rc = set_from_json(c, find_key("dataset"), f, where, err);
    json_decref(f);
    return rc;
}

static const TrlKey TRL_KEYS[] = {
    /* transformers' TrainingArguments */
    ONLY("optim", "adamw_torch adamw_torch_fused",
         "colt's optimizer is AdamW with decoupled weight decay, as adamw_torch; others are not supported"),
    ONLY("optim_args", "null \"\"", "colt's AdamW takes adam_beta1, adam_beta2, adam_epsilon and weight_decay"),
    ONLY("optim_target_modules", "null", "colt's AdamW updates every parameter"),
    BOOL_NOOP("average_tokens_across_devices",
              "colt normalises the GRPO loss as loss_type says, over every process, as TRL does"),
    ONLY("label_smoothing_factor", "0", "GRPO's loss has no labels to smooth"),
    ONLY("fp16", "false", T_FP16),
    BOOL_NOOP("bf16_full_eval", "colt evaluates with the weights and precision it trains with"),
    ONLY("fp16_full_eval", "false", T_FP16),
    BOOL_NOOP("tf32",
              "colt chooses its own GPU math (bf16 products with fp32 accumulation); the TF32 switch does not apply"),
    ALIAS("activation_checkpointing", "gradient_checkpointing"),
    NOOP("activation_checkpointing_kwargs",
         "colt's gradient checkpointing recomputes each layer in the backward; it takes no options"),
    NOOP("gradient_checkpointing_kwargs",
         "colt's gradient checkpointing recomputes each layer in the backward; it takes no options"),
    BOOL_NOOP("torch_compile", T_COMPILE),
    NOOP("torch_compile_backend", T_COMPILE),
    NOOP("torch_compile_mode", T_COMPILE),
    BOOL_NOOP("use_liger_kernel", T_COMPILE),
    NOOP("liger_kernel_config", T_COMPILE),
    BOOL_NOOP("use_cache", "colt's engine keeps its own KV cache for generation; training passes need none"),
    ONLY("neftune_noise_alpha", "null", "NEFTune embedding noise is not supported"),
    NOOP("torch_empty_cache_steps", "colt plans and allocates its memory once: there is no allocator cache to empty"),
    ONLY("auto_find_batch_size", "false", "colt does not search for a batch size: set per_device_train_batch_size"),
    ONLY("logging_strategy", "steps", "colt logs every logging_steps optimizer steps and at the last step"),
    BOOL_NOOP("log_on_each_node", T_LOG),
    BOOL_NOOP("logging_nan_inf_filter", "a non-finite loss or gradient norm stops colt's run, without saving"),
    ONLY("include_num_input_tokens_seen", "no false", T_LOG),
    NOOP("log_level", T_LOG),
    NOOP("log_level_replica", T_LOG),
    BOOL_NOOP("disable_tqdm", "colt prints one progress line per logging step (no progress bar)"),
    NOOP("run_name", T_TRACKERS),
    NOOP("project", T_TRACKERS),
    NOOP("trackio_space_id", T_TRACKERS),
    NOOP("trackio_bucket_id", T_TRACKERS),
    NOOP("trackio_static_space_id", T_TRACKERS),
    ONLY("eval_delay", "0", T_EVAL),
    NOOP("per_device_eval_batch_size",
         "colt's evaluation generates in batches of its own; the score does not depend on them"),
    BOOL_NOOP("prediction_loss_only", T_EVAL),
    BOOL_NOOP("eval_on_start", T_EVAL),
    BOOL_NOOP("eval_do_concat_batches", T_EVAL),
    BOOL_NOOP("eval_use_gather_object", T_EVAL),
    NOOP("eval_accumulation_steps", T_EVAL),
    NOOP("include_for_metrics", T_EVAL),
    BOOL_NOOP("batch_eval_metrics", T_EVAL),
    ONLY("save_only_model", "false",
         "colt's checkpoints hold the model, the optimizer state and the data position so that a run resumes exactly"),
    ONLY("save_on_each_node", "false", "rank 0 alone writes checkpoints"),
    BOOL_NOOP("enable_jit_checkpoint", "colt always finishes the step and saves a checkpoint on SIGINT or SIGTERM"),
    ONLY("push_to_hub", "false", T_HUB),
    NOOP("hub_token", T_HUB),
    BOOL_NOOP("hub_private_repo", T_HUB),
    NOOP("hub_model_id", T_HUB),
    NOOP("hub_strategy", T_HUB),
    BOOL_NOOP("hub_always_push", T_HUB),
    NOOP("hub_revision", T_HUB),
    ONLY("load_best_model_at_end", "false",
         "colt keeps the last weights: output_dir holds the final model, checkpoint-N folders the earlier ones"),
    NOOP("metric_for_best_model", "used only with load_best_model_at_end, which colt does not support"),
    BOOL_NOOP("greater_is_better", "used only with load_best_model_at_end, which colt does not support"),
    ONLY("ignore_data_skip", "false", "on resume colt continues at the prompt where the checkpoint stopped"),
    BOOL_NOOP("restore_callback_states_from_checkpoint", "colt has no callbacks"),
    ONLY("full_determinism", "false",
         "for reproducible runs colt has seed and deterministic (batch-invariant kernels, on by default for bf16)"),
    NOOP("data_seed", T_SAMPLER),
    APPLY("accelerator_config", apply_accelerator_config,
          "accepted: null, {} or Accelerate's default object (what GRPOConfig().to_dict() holds), with a notice: colt "
          "launches and synchronises its processes itself; other values are refused"),
    ONLY("parallelism_config", "null",
         "Accelerate's ParallelismConfig is not read: colt's parallelism is tensor_parallel_size, zero_stage and the "
         "processes it starts (one per GPU); remove the setting and set those"),
    BOOL_NOOP("dataloader_drop_last", "colt, as TRL's sampler, uses whole generation rounds only"),
    NOOP("dataloader_num_workers", T_LOADER),
    BOOL_NOOP("dataloader_pin_memory", T_LOADER),
    BOOL_NOOP("dataloader_persistent_workers", T_LOADER),
    NOOP("dataloader_prefetch_factor", T_LOADER),
    NOOP("dataloader_multiprocessing_context", T_LOADER),
    BOOL_NOOP("dataloader_in_order", T_LOADER),
    BOOL_NOOP("remove_unused_columns",
              "colt passes every dataset column to the reward functions (TRL's default false)"),
    ONLY("label_names", "null []", "GRPO has no labels"),
    NOOP("train_sampling_strategy", T_SAMPLER),
    NOOP("length_column_name", T_SAMPLER),
    BOOL_NOOP("ddp_find_unused_parameters", T_DIST),
    BOOL_NOOP("ddp_broadcast_buffers", T_DIST),
    BOOL_NOOP("ddp_static_graph", T_DIST),
    ONLY("fsdp", "null \"\" false []", T_SHARDING),
    ONLY("fsdp_config", "null {}", T_SHARDING),
    ONLY("debug", "\"\" [] null", "colt has no debug modes; its errors name what failed and where"),
    BOOL_NOOP("skip_memory_metrics", T_LOG),
    BOOL_NOOP("do_train", "read only by example scripts: colt train always trains"),
    BOOL_NOOP("do_eval", "read only by example scripts: colt evaluates when eval_dataset is given"),
    BOOL_NOOP("do_predict", "read only by example scripts: colt train does not predict"),
    NOOP("local_rank",
         "colt reads LOCAL_RANK from its launcher (torchrun, srun, mpirun) or starts its processes itself"),
    /* TRL's GRPOConfig */
    NOOP("model_init_kwargs",
         "colt loads config.json and the safetensors weights itself, in the precision its device sets (see dtype)"),
    BOOL_NOOP("trust_remote_code",
              "colt runs no code from a model folder: it implements the llama, qwen2 and qwen3 architectures"),
    NOOP("router_aux_loss_coef", "applies to mixture-of-experts models, which colt does not load"),
    BOOL_NOOP("disable_dropout", "colt applies no dropout, as disable_dropout: true"),
    BOOL_NOOP("ds3_gather_for_generation", "DeepSpeed only: colt generates with the very weights it trains"),
    NOOP("pad_to_multiple_of", "colt does not pad sequences to a multiple: its results do not depend on it"),
    NOOP("cache_implementation", T_GENERATE_HF),
    NOOP("vllm_model_impl", "colt generates with its own engine"),
    BOOL_NOOP("vllm_enable_sleep_mode",
              "colt's engine borrows the trainer's weights and gives its KV cache back before every training phase"),
    NOOP("vllm_max_model_length", "colt's engine sizes sequences from the longest prompt + max_completion_length"),
    BOOL_NOOP("log_completions", T_COMPLETIONS),
    BOOL_NOOP("log_multimodal", "colt trains text-only models"),
    NOOP("num_completions_to_print", T_COMPLETIONS),
    BOOL_NOOP("log_unique_prompts", T_COMPLETIONS),
    ONLY("log_completions_hub_repo", "null", T_HUB),
    BOOL_NOOP("use_transformers_continuous_batching", T_GENERATE_HF),
    NOOP("transformers_continuous_batching_config", T_GENERATE_HF),
    BOOL_NOOP("use_transformers_paged", T_GENERATE_HF),
    /* TRL's ModelConfig */
    ALIAS("model_name_or_path", "model"),
    ONLY("dtype", "auto bfloat16 bf16 float32 fp32 null", T_FP16),
    NOOP("attn_implementation", "colt computes attention with its own kernels (FlashAttention-style on a GPU)"),
    ONLY("lora_target_parameters", "null []", T_PEFT_ONLY "; adapting parameters directly is not supported"),
    ONLY("lora_modules_to_save", "null []",
         T_PEFT_ONLY "; training other modules fully beside the adapters is not supported"),
    ONLY("lora_task_type", "CAUSAL_LM", "colt trains causal language models"),
    ONLY("use_dora", "false", "DoRA is not supported: use plain LoRA (use_dora: false)"),
    ONLY("load_in_8bit", "false", T_QUANT),
    ONLY("load_in_4bit", "false", T_QUANT),
    NOOP("bnb_4bit_quant_type", T_BNB),
    BOOL_NOOP("use_bnb_nested_quant", T_BNB),
    NOOP("bnb_4bit_quant_storage", T_BNB),
    /* older TRL and transformers names, and TRL's ScriptArguments */
    ONLY("torch_dtype", "auto bfloat16 bf16 float32 fp32 null", T_FP16),
    NOOP("vllm_device", "colt generates on each process's own GPU, inside the training process"),
    NOOP("vllm_dtype", T_PRECISION),
    BOOL_NOOP("vllm_enable_prefix_caching",
              "colt's engine shares each prompt's KV cache among its num_generations completions"),
    ALIAS("vllm_guided_decoding_regex", "vllm_structured_outputs_regex"), /* TRL's name before 0.24 */
    NOOP("vllm_max_model_len", "colt's engine sizes sequences from the longest prompt + max_completion_length"),
    BOOL_NOOP("overwrite_output_dir", "colt writes into output_dir whether or not it exists"),
    ALIAS("evaluation_strategy", "eval_strategy"),
    BOOL_NOOP("group_by_length", T_SAMPLER),
    ALIAS("no_cuda", "use_cpu"), /* transformers' older name */
    ONLY("use_mps_device", "false", "colt runs on NVIDIA GPUs (device cuda) or on the CPU"),
    ONLY("save_safetensors", "true null", "colt saves safetensors"),
    BOOL_NOOP("use_liger_loss", T_COMPILE),
    APPLY("dataset_name", apply_dataset_name,
          "a local .jsonl or .json file sets dataset; a Hub name loads only beside dataset (a notice says dataset is "
          "used), alone it is refused: " T_DATASET),
    NOOP("dataset_config", T_DATASET),
    NOOP("dataset_train_split", T_DATASET),
    NOOP("dataset_test_split", "colt reads held-out prompts from eval_dataset, a local .jsonl or .json file"),
    ONLY("dataset_streaming", "false", T_DATASET),
    /* the `trl grpo` command's own keys (trl/scripts/grpo.py's GRPOScriptArguments, DatasetMixtureConfig) */
    APPLY("datasets", apply_datasets,
          "one entry naming a local file ({path: x.jsonl}, or {path: json, data_files: x.jsonl}) sets dataset; "
          "mixtures, Hub datasets and column selections are refused: " T_DATASET),
    ONLY("streaming", "false null", T_DATASET),
    ONLY("test_split_size", "null 0", "colt reads held-out prompts from eval_dataset"),
    BOOL_NOOP("ignore_bias_buffers", "colt's models have no buffers to ignore"),
};
#undef ALIAS
#undef NOOP
#undef ONLY
#undef BOOL_NOOP
#undef APPLY
#define N_TRL_KEYS (sizeof TRL_KEYS / sizeof TRL_KEYS[0])

/* Reward weights are applied as floats; a cap keeps them (and their sums) finite. */
#define MAX_REWARD_WEIGHT 1e6

void train_config_defaults(TrainConfig *c) {
    memset(c, 0, sizeof *c);
    c->output_dir = xstrdup("runs/grpo");
    c->dataset_prompt_column = xstrdup("prompt");
    c->world_size = 1;
    c->learning_rate = 1e-6;
    c->lr_scheduler_type = xstrdup("linear");
    c->weight_decay = 0.0;
    c->adam_beta1 = 0.9;
    c->adam_beta2 = 0.999;
    c->adam_epsilon = 1e-8;
    c->max_grad_norm = 1.0;
    c->num_generations = 8;
    c->max_completion_length = 512; /* TRL 1.16's */
    c->max_prompt_length = 0; /* no cut: TRL 1.16 has no max_prompt_length */
    c->temperature = 1.0;
    c->top_p = 1.0;
    c->top_k = 0;
    c->min_p = 0.0;
    c->repetition_penalty = 1.0;
    c->beta = 0.0;
    c->epsilon = 0.2;
    c->epsilon_high = NAN;
    c->sapo_temperature_neg = 1.05, c->sapo_temperature_pos = 1.0; /* TRL 1.16's defaults */
    c->vespo_k_pos = 2.0, c->vespo_lambda_pos = 3.0, c->vespo_k_neg = 3.0, c->vespo_lambda_neg = 2.0;
    c->delta = NAN;
    c->ref_model_mixup_alpha = 0.6, c->ref_model_sync_steps = 512; /* TRL's defaults */
    c->max_num_gen_batches = 10; /* DAPO's recipe (veRL's own default 0 never stops a run whose groups all agree) */
    c->top_entropy_quantile = 1.0; /* TRL 1.16's defaults */
    c->off_policy_mask_threshold = NAN;
    c->use_bias_correction_kl = true;
    c->entropy_coef = 0.0, c->use_adaptive_entropy = false;
    c->entropy_coef_min = 0.0, c->entropy_coef_max = 1.0, c->entropy_coef_delta = 0.005, c->entropy_target = 0.2;
    c->loss_type = xstrdup("dapo");
    c->importance_sampling_level = xstrdup("token");
    c->scale_rewards = xstrdup("group");
    c->multi_objective_aggregation = xstrdup("sum_then_normalize");
    c->lora_r = 16; /* TRL's ModelConfig defaults */
    c->lora_alpha = 32.0;
    c->lora_dropout = 0.05;
    c->num_iterations = 1;
    c->use_vllm = true;
    c->vllm_mode = xstrdup("colocate");
    c->vllm_server_host = xstrdup("127.0.0.1");
    c->vllm_server_port = 8000; /* TRL's defaults */
    c->vllm_server_timeout = 240.0;
    c->vllm_group_port = 51216;
    c->server_data_parallel_size = 1;
    c->max_staleness = 1;
    c->weight_sync_backend = xstrdup("auto");
    c->vllm_importance_sampling_correction = true;
    c->vllm_importance_sampling_mode = xstrdup("sequence_mask");
    c->vllm_importance_sampling_clip_min = NAN;
    c->vllm_importance_sampling_clip_max = 3.0;
    c->vllm_importance_sampling_cap = NAN;
    c->gpu_memory_utilization = 0.0;
    c->per_device_train_batch_size = 8;
    c->gradient_accumulation_steps = 1;
    c->max_steps = -1;
    c->num_train_epochs = 3.0;
    c->logging_steps = 10;
    c->max_rounds_without_reward = 3;
    c->max_tool_calling_iterations = -1;
    c->tool_timeout = 60.0;
    c->rollout_func_timeout = 3600.0;
    c->save_steps = 500;
    c->eval_steps = 0;
    c->log_completions_count = 2;
    c->seed = 42;
    c->shuffle_dataset = true;
    c->device = xstrdup("auto");
    c->bf16 = true;
    c->save_strategy = xstrdup("steps");
    c->ddp_timeout = 600;
    c->ddp_bucket_cap_mb = 25;
    c->tensor_parallel_size = 1;
    c->offload_optimizer = xstrdup("none");
    c->offload_optimizer_ratio = 1.0;
}

void train_config_free(TrainConfig *c) {
    for (size_t i = 0; i < N_KEYS; i++) {
        void *p = (char *)c + KEYS[i].offset;
        if (KEYS[i].type == KEY_STRING) {
            free(*(char **)p);
            *(char **)p = NULL;
        } else if (KEYS[i].type == KEY_JSON_LIST || KEYS[i].type == KEY_JSON_OBJECT) {
            json_decref(*(json_t **)p);
            *(json_t **)p = NULL;
        }
    }
    json_decref(c->notices);
    c->notices = NULL;
    json_decref(c->environment_factories);
    c->environment_factories = NULL;
    free(c->dataset_name);
    c->dataset_name = NULL;
}

/* ---------------------------------------------------------------- closest key */

static size_t edit_distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    size_t *row = xmalloc((lb + 1) * sizeof(size_t));
    for (size_t j = 0; j <= lb; j++) row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t prev = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t cur = row[j];
            size_t best = prev + (a[i - 1] != b[j - 1]);
            if (row[j] + 1 < best) best = row[j] + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            row[j] = best;
            prev = cur;
        }
    }
    size_t d = row[lb];
    free(row);
    return d;
}

static const ConfigKey *find_key(const char *name) {
    for (size_t i = 0; i < N_KEYS; i++)
        if (strcmp(KEYS[i].name, name) == 0) return &KEYS[i];
    return NULL;
}

/* The error for a key no table knows. The closest name of colt's or TRL's is
 * suggested only when it is a likely typo: at most one edit in four letters
 * (learnig_rate, max_stepz), not the nearest of unrelated names. */
static int unknown_key(const char *name, const char *where, char *err) {
    const char *best = NULL;
    size_t best_d = (size_t)-1;
    for (size_t i = 0; i < N_KEYS + N_TRL_KEYS; i++) {
        const char *candidate = i < N_KEYS ? KEYS[i].name : TRL_KEYS[i - N_KEYS].name;
        size_t d = edit_distance(name, candidate);
        if (d < best_d) best_d = d, best = candidate;
    }
    size_t len = strlen(name);
    if (best && best_d <= (len < 8 ? 1 : len / 4))
        return errorf(err, "%s: unknown setting '%s' (did you mean '%s'?)", where, name, best);
    return errorf(err, "%s: unknown setting '%s' (not a colt, TRL or transformers setting: see colt train --help and "
                       "docs/trl_config.md)", where, name);
}

/* ---------------------------------------------------------------- ranges */

/* "1 .. 1048576" or "0 < top_p <= 1": the range as it reads in messages and help. */
static void range_text(char *out, size_t n, const ConfigKey *k) {
    if (k->type == KEY_INT || k->type == KEY_U64) {
        snprintf(out, n, "%lld .. %lld", (long long)k->imin, (long long)k->imax);
    } else {
        snprintf(out, n, "%.10g %s %s %s %.10g%s", k->min, k->ends == RANGE_OPEN_MIN ? "<" : "<=", k->name,
                 k->ends == RANGE_OPEN_MAX ? "<" : "<=", k->max, k->type == KEY_DOUBLE_OR_NULL ? ", or null" : "");
    }
}

static bool double_in_range(const ConfigKey *k, double d) {
    bool above_min = k->ends == RANGE_OPEN_MIN ? d > k->min : d >= k->min;
    bool below_max = k->ends == RANGE_OPEN_MAX ? d < k->max : d <= k->max;
    return above_min && below_max; /* false for NaN */
}

static int range_error(const ConfigKey *k, const char *value, bool is_nan, const char *where, char *err) {
    char range[128];
    range_text(range, sizeof range, k);
    return errorf(err, "%s: %s: %s is %s (%s)", where, k->name, value, is_nan ? "not a number" : "out of range", range);
}

/* The shortest text that reads back as d, with ".0" on whole numbers so an
 * int key's error shows that a real was given. */
static void real_text(char *out, size_t n, double d) {
    for (int precision = 6; precision <= 17; precision++) {
        snprintf(out, n, "%.*g", precision, d);
        if (!isfinite(d) || strtod(out, NULL) == d) break;
    }
    if (isfinite(d) && strspn(out, "-0123456789") == strlen(out)) snprintf(out + strlen(out), n - strlen(out), ".0");
}

/* Every numeric setting within its key's range (values put into the struct
 * directly, not through the loaders, meet the same bounds). */
static int check_ranges(const TrainConfig *c, const char *where, char *err) {
    char value[64];
    for (size_t i = 0; i < N_KEYS; i++) {
        const ConfigKey *k = &KEYS[i];
        const void *p = (const char *)c + k->offset;
        if (k->type == KEY_INT) {
            int v = *(const int *)p;
            if (v < k->imin || v > k->imax) {
                snprintf(value, sizeof value, "%d", v);
                return range_error(k, value, false, where, err);
            }
        } else if (k->type == KEY_U64) {
            uint64_t v = *(const uint64_t *)p;
            if (v > (uint64_t)k->imax) {
                snprintf(value, sizeof value, "%llu", (unsigned long long)v);
                return range_error(k, value, false, where, err);
            }
        } else if (k->type == KEY_DOUBLE || k->type == KEY_DOUBLE_OR_NULL) {
            double d = *(const double *)p;
            if (k->type == KEY_DOUBLE_OR_NULL && isnan(d)) continue; /* unset */
            if (!double_in_range(k, d)) {
                real_text(value, sizeof value, d);
                return range_error(k, value, isnan(d), where, err);
            }
        }
    }
    return COLT_OK;
}

/* ---------------------------------------------------------------- values */

static bool is_null_text(const char *s) {
    return !*s || strcmp(s, "~") == 0 || strcasecmp(s, "null") == 0 || strcmp(s, "None") == 0;
}

/* A YAML plain scalar (or a flag's text) as JSON: null, bool, int, real or
 * string. Numbers a double or int64 cannot hold (1e400, nan, 2^64) stay
 * strings, so a setting's error can quote them as written. */
static json_t *scalar_to_json(const char *s, bool quoted) {
    if (quoted) return json_string(s);
    if (is_null_text(s)) return json_null();
    if (strcasecmp(s, "true") == 0 || strcasecmp(s, "yes") == 0) return json_true();
    if (strcasecmp(s, "false") == 0 || strcasecmp(s, "no") == 0) return json_false();
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (end != s && *end == '\0') return errno ? json_string(s) : json_integer(v);
    errno = 0;
    double d = strtod(s, &end);
    if (end != s && !errno && *end == '\0' && isfinite(d)) return json_real(d);
    return json_string(s);
}

/* A value for a numeric key, classified once from JSON or from text. */
typedef enum { NUM_NULL, NUM_INT, NUM_BIG_INT, NUM_REAL, NUM_OTHER } NumKind;
typedef struct Number {
    NumKind kind;
    long long i;    /* NUM_INT */
    double d;       /* NUM_INT, NUM_BIG_INT, NUM_REAL (may be inf or nan) */
    char text[64];  /* as the user wrote it, for messages */
} Number;

static void number_from_text(Number *n, const char *s) {
    size_t len = strlen(s);
    snprintf(n->text, sizeof n->text, "%.40s%s", s, len > 40 ? "..." : "");
    if (is_null_text(s)) {
        n->kind = NUM_NULL;
        return;
    }
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (end != s && *end == '\0') {
        n->kind = errno == ERANGE ? NUM_BIG_INT : NUM_INT;
        n->i = v;
        n->d = errno == ERANGE ? strtod(s, NULL) : (double)v;
        return;
    }
    double d = strtod(s, &end); /* also nan, inf and 1e400 (inf, ERANGE): the range check reports them */
    if (end != s && *end == '\0') {
        n->kind = NUM_REAL;
        n->d = d;
        return;
    }
    const char *t = s + (*s == '+' || *s == '-'); /* YAML's .inf and .nan */
    if (strcmp(t, ".inf") == 0 || strcmp(t, ".Inf") == 0 || strcmp(t, ".INF") == 0) {
        n->kind = NUM_REAL;
        n->d = *s == '-' ? -INFINITY : INFINITY;
        return;
    }
    if (t == s && (strcmp(s, ".nan") == 0 || strcmp(s, ".NaN") == 0 || strcmp(s, ".NAN") == 0)) {
        n->kind = NUM_REAL;
        n->d = NAN;
        return;
    }
    n->kind = NUM_OTHER;
    snprintf(n->text, sizeof n->text, "'%.40s%s'", s, len > 40 ? "..." : "");
}

static void number_from_json(Number *n, const json_t *v) {
    memset(n, 0, sizeof *n);
    if (json_is_string(v)) number_from_text(n, json_string_value(v));
    else if (json_is_null(v)) n->kind = NUM_NULL, snprintf(n->text, sizeof n->text, "null");
    else if (json_is_integer(v)) {
        n->kind = NUM_INT;
        n->i = json_integer_value(v);
        n->d = (double)n->i;
        snprintf(n->text, sizeof n->text, "%lld", n->i);
    } else if (json_is_real(v)) {
        n->kind = NUM_REAL;
        n->d = json_real_value(v);
        real_text(n->text, sizeof n->text, n->d);
    } else {
        n->kind = NUM_OTHER;
        snprintf(n->text, sizeof n->text, "%s",
                 json_is_boolean(v) ? (json_is_true(v) ? "true" : "false") : json_is_array(v) ? "a list" : "a mapping");
    }
}

/* A nullable key given null (TRL's None): its default, as TRL's None means. */
static void set_default(TrainConfig *c, const ConfigKey *k) {
    TrainConfig d;
    train_config_defaults(&d);
    size_t size = k->type == KEY_BOOL ? sizeof(bool) : k->type == KEY_INT ? sizeof(int) : k->type == KEY_U64
                                                                                          ? sizeof(uint64_t)
                                                                                          : sizeof(double);
    COLT_ASSERT(k->type == KEY_BOOL || k->type == KEY_INT || k->type == KEY_U64 || k->type == KEY_DOUBLE);
    memcpy((char *)c + k->offset, (const char *)&d + k->offset, size);
    train_config_free(&d);
}

/* Sets a numeric key (int, u64, double) after its range check; on error the
 * setting keeps its value. */
static int set_number(TrainConfig *c, const ConfigKey *k, const json_t *v, const char *where, char *err) {
    void *p = (char *)c + k->offset;
    Number n;
    number_from_json(&n, v);
    char range[128];
    range_text(range, sizeof range, k);
    if (n.kind == NUM_NULL && k->nullable) {
        set_default(c, k);
        return COLT_OK;
    }
    if (k->type == KEY_DOUBLE || k->type == KEY_DOUBLE_OR_NULL) {
        if (n.kind == NUM_NULL && k->type == KEY_DOUBLE_OR_NULL) {
            *(double *)p = NAN;
            return COLT_OK;
        }
        if (n.kind == NUM_NULL || n.kind == NUM_OTHER)
            return errorf(err, "%s: %s must be a number (%s), not %s", where, k->name, range, n.text);
        if (!double_in_range(k, n.d)) return range_error(k, n.text, isnan(n.d), where, err);
        *(double *)p = n.d;
        return COLT_OK;
    }
    if (n.kind == NUM_BIG_INT || (n.kind == NUM_INT && (n.i < k->imin || n.i > k->imax)))
        return range_error(k, n.text, false, where, err);
    if (n.kind != NUM_INT)
        return errorf(err, "%s: %s must be an integer (%s), not %s", where, k->name, range, n.text);
    if (k->type == KEY_INT) *(int *)p = (int)n.i;
    else *(uint64_t *)p = (uint64_t)n.i;
    return COLT_OK;
}

/* A value as messages show it: a string as written, anything else as compact
 * JSON, cut to a readable length. */
static void value_text(char *out, size_t n, const json_t *v) {
    if (json_is_real(v)) { /* 0.6, not 0.59999999999999998 */
        real_text(out, n, json_real_value(v));
        return;
    }
    char *s = json_is_string(v) ? NULL : json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT | JSON_REAL_PRECISION(10));
    const char *t = json_is_string(v) ? json_string_value(v) : s ? s : "?";
    snprintf(out, n, "%.60s%s", t, strlen(t) > 60 ? "..." : "");
    free(s);
}

/* One notice line for a key whose value changes nothing in colt; a key given
 * again (in a file, then as a flag) keeps one line, the last. */
static void add_notice(TrainConfig *c, const char *key, const json_t *v, const char *why, const char *where) {
    char value[80], line[ERR_LEN];
    value_text(value, sizeof value, v);
    snprintf(line, sizeof line, "%s: %s: %s changes nothing in colt: %s", where, key, value, why);
    if (!c->notices) c->notices = json_object();
    json_object_set_new(c->notices, key, json_string(line));
}

void train_config_notice(TrainConfig *c, const char *key, const char *line) {
    if (!c->notices) c->notices = json_object();
    json_object_set_new(c->notices, key, json_string(line));
}

/* lora_target_modules: "all-linear" or names of the block's linear layers. A
 * refused value leaves the key unset. */
static int check_lora_targets(TrainConfig *c, const char *where, char *err) {
    size_t i;
    json_t *v;
    json_array_foreach(c->lora_target_modules, i, v) {
        LoraTarget t;
        const char *s = json_is_string(v) ? json_string_value(v) : NULL;
        if (s && (strcmp(s, "all-linear") == 0 || lora_target_parse(s, &t) == 0)) continue;
        json_decref(c->lora_target_modules);
        c->lora_target_modules = NULL;
        return errorf(err, "%s: lora_target_modules: %s%s%s is not a layer colt adapts (all-linear, or a list of "
                           "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)",
                      where, s ? "'" : "", s ? s : "a non-string entry", s ? "'" : "");
    }
    return COLT_OK;
}

/* The adapters use_peft asks for. */
int train_config_lora(const TrainConfig *c, LoraConfig *out, char *err) {
    memset(out, 0, sizeof *out);
    out->r = c->lora_r;
    out->alpha = (float)c->lora_alpha;
    out->use_rslora = c->use_rslora;
    out->dropout = (float)c->lora_dropout;
    if (!c->lora_target_modules) out->targets = LORA_ALL_TARGETS;
    size_t i;
    json_t *v;
    json_array_foreach(c->lora_target_modules, i, v) {
        LoraTarget t;
        if (strcmp(json_string_value(v), "all-linear") == 0) out->targets = LORA_ALL_TARGETS;
        else if (lora_target_parse(json_string_value(v), &t) == 0) out->targets |= 1u << t;
    }
    if (!out->targets) return errorf(err, "settings: lora_target_modules is empty");
    return COLT_OK;
}

/* report_to as transformers reads it: "none", "tensorboard", or a list of
 * them; colt has no other integration. A refused value leaves report_to unset. */
static int check_report_to(TrainConfig *c, const json_t *given, const char *where, char *err) {
    size_t i;
    json_t *v;
    json_array_foreach(c->report_to, i, v) {
        const char *name = json_string_value(v);
        if (name && (strcasecmp(name, "none") == 0 || strcasecmp(name, "tensorboard") == 0)) continue;
        char value[80];
        value_text(value, sizeof value, given);
        json_decref(c->report_to);
        c->report_to = NULL;
        return errorf(err, "%s: report_to: %s is not supported: colt reports to tensorboard (event files beside "
                           "metrics.jsonl) or none, and always writes output_dir/metrics.jsonl; wandb, mlflow and "
                           "transformers' other integrations are not supported",
                      where, value);
    }
    if (train_config_reports_to(c, "tensorboard") && !tensorboard_available())
        return errorf(err, "%s: report_to: tensorboard: this colt was built without protobuf-c, which writes the event "
                           "files (apt-get install libprotobuf-c-dev protobuf-c-compiler, or scripts/setup.sh, then "
                           "rebuild)",
                      where);
    return COLT_OK;
}

bool train_config_reports_to(const TrainConfig *c, const char *integration) {
    size_t i;
    json_t *v;
    json_array_foreach(c->report_to, i, v) if (json_is_string(v) && strcasecmp(json_string_value(v), integration) == 0)
        return true;
    return false;
}

/* TRL's reward function names (`trl grpo --reward_funcs`, trl/rewards) as
 * colt's reward specs where colt computes the same reward; the others are
 * refused saying how to run TRL's own function. A refused entry leaves
 * reward_funcs unset. */
static int translate_trl_rewards(TrainConfig *c, const char *where, char *err) {
    size_t i;
    json_t *v;
    json_array_foreach(c->reward_funcs, i, v) {
        const char *s = json_is_string(v) ? json_string_value(v) : "";
        json_t *spec = NULL;
        if (strcmp(s, "think_format_reward") == 0) {
            /* trl.rewards.think_format_reward: re.match with DOTALL, so only the start anchors (flags s, not m) */
            spec = json_pack("{s:s,s:s,s:s,s:s}", "type", "regex", "name", s, "pattern",
                             "^<think>(?!.*<think>)(.*?)</think>.*$", "flags", "s");
        } else if (strcmp(s, "accuracy_reward") == 0) {
            spec = json_pack("{s:s,s:s,s:s}", "type", "math", "name", s, "column", "solution");
            char line[ERR_LEN];
            snprintf(line, sizeof line, "%s: reward_funcs: accuracy_reward is colt's math reward against the solution "
                                        "column (numbers and normalised answers, not math_verify's symbolic check; "
                                        "trl.rewards.accuracy_reward runs TRL's own through Python)", where);
            train_config_notice(c, "reward_funcs.accuracy_reward", line);
        } else if (strcmp(s, "reasoning_accuracy_reward") == 0 || strcmp(s, "get_soft_overlong_punishment") == 0) {
            json_decref(c->reward_funcs);
            c->reward_funcs = NULL;
            return errorf(err, "%s: reward_funcs: %s is not built into colt: %s", where, s,
                          s[0] == 'r'
                              ? "run TRL's own function through Python with trl.rewards.reasoning_accuracy_reward"
                              : "write it as a Python reward function (rewards.py:FUNCTION, docs/rewards.md)");
        }
        if (spec) json_array_set_new(c->reward_funcs, i, spec);
    }
    return COLT_OK;
}

/* generation_kwargs' keys colt has (applied by train_config_finalize, over
 * the settings of the same name, as TRL passes them last to the sampler). */
static const char *generation_kwarg_setting(const char *key) {
    static const char *const same[] = {"temperature", "top_p", "top_k", "min_p", "repetition_penalty", NULL};
    for (const char *const *p = same; *p; p++)
        if (strcmp(key, *p) == 0) return *p;
    if (strcmp(key, "max_tokens") == 0 || strcmp(key, "max_new_tokens") == 0) return "max_completion_length";
    return NULL;
}

/* generation_kwargs: a key colt's sampler has, or one whose value changes
 * nothing in the completions (what colt does anyway: sampling, no beams,
 * special tokens dropped from the text; or output options of HF's generate and
 * vLLM that do not touch the tokens drawn). Any other would change the
 * completions, so it is refused; a refused object leaves the key unset. */
static int check_generation_kwargs(TrainConfig *c, const char *where, char *err) {
    static const struct {
        const char *key, *value; /* the value that changes nothing, as JSON; NULL: any */
    } harmless[] = {{"do_sample", "true"},   {"skip_special_tokens", "true"}, {"detokenize", "true"},
                    {"num_beams", "1"},      {"use_cache", NULL},             {"logprobs", NULL},
                    {"output_scores", NULL}, {"output_logits", NULL},         {"return_dict_in_generate", NULL}};
    const char *key;
    json_t *v;
    json_object_foreach(c->generation_kwargs, key, v) {
        if (generation_kwarg_setting(key)) continue;
        size_t h = 0, n = sizeof harmless / sizeof harmless[0];
        while (h < n && strcmp(harmless[h].key, key) != 0) h++;
        json_t *want = h < n && harmless[h].value ? json_loads(harmless[h].value, JSON_DECODE_ANY, NULL) : NULL;
        bool noop = h < n && (!harmless[h].value || (want && json_equal(want, v)));
        json_decref(want);
        if (noop) {
            char name[96];
            snprintf(name, sizeof name, "generation_kwargs.%s", key);
            add_notice(c, name, v, "colt samples one token at a time (no beams) and decodes completions without "
                                   "special tokens; output options do not change what is drawn", where);
            continue;
        }
        char text[80];
        value_text(text, sizeof text, v);
        errorf(err, "%s: generation_kwargs.%s: %s is not supported: it would change the completions; colt samples "
                    "with temperature, top_p, top_k, min_p, repetition_penalty and max_tokens",
               where, key, text);
        json_decref(c->generation_kwargs);
        c->generation_kwargs = NULL;
        return COLT_ERR;
    }
    return COLT_OK;
}

/* environment_factory: a class name, or TRL's dict {name: class} (a YAML
 * mapping, or its JSON text on the command line). A dict keeps its order
 * (TRL's reward columns and error messages follow it) in
 * environment_factories; environment_factory then holds its compact JSON,
 * so "environments are on" stays one test and a resume compares it. */
static int set_environment_factory(TrainConfig *c, json_t *v, const char *where, char *err) {
    json_t *map = NULL;
    if (json_is_string(v) && json_string_value(v)[0] == '{') {
        json_error_t jerr;
        map = json_loads(json_string_value(v), JSON_REJECT_DUPLICATES, &jerr);
        if (!map)
            return errorf(err, "%s: 'environment_factory' starts with '{' but is not a JSON mapping: %s", where,
                          jerr.text);
        v = map;
    }
    int rc = COLT_OK;
    if (json_is_object(v)) {
        const char *name;
        json_t *cls;
        if (json_object_size(v) == 0)
            rc = errorf(err, "%s: 'environment_factory' is an empty mapping; give {name: \"envs.py:Class\", ...}",
                        where);
        json_object_foreach(v, name, cls) {
            if (rc != COLT_OK) break;
            if (!*name) rc = errorf(err, "%s: 'environment_factory' has an empty environment name", where);
            else if (!json_is_string(cls) || !*json_string_value(cls))
                rc = errorf(err, "%s: environment_factory.%s must name a Python class (\"envs.py:MathEnv\" or "
                                 "\"module.Class\")", where, name);
        }
    } else if (!json_is_string(v) && !json_is_null(v)) {
        rc = errorf(err, "%s: 'environment_factory' must be a class (\"envs.py:MathEnv\") or a mapping of "
                         "environment names to classes ({math: \"envs.py:MathEnv\", ...})", where);
    }
    if (rc == COLT_OK) {
        free(c->environment_factory);
        json_decref(c->environment_factories);
        c->environment_factory = NULL, c->environment_factories = NULL;
        if (json_is_object(v)) {
            c->environment_factories = json_deep_copy(v);
            c->environment_factory = json_dumps(v, JSON_COMPACT | JSON_PRESERVE_ORDER);
        } else if (json_is_string(v)) {
            c->environment_factory = xstrdup(json_string_value(v));
        }
    }
    json_decref(map);
    return rc;
}

/* vllm_server_base_url given as a list (several replicas): kept comma-separated. */
static int set_url_list(char **out, const json_t *list, const char *where, char *err) {
    size_t len = 1, i;
    json_t *u;
    json_array_foreach(list, i, u) {
        if (!json_is_string(u) || json_string_length(u) == 0 || strchr(json_string_value(u), ','))
            return errorf(err, "%s: vllm_server_base_url[%zu] is not a URL (e.g. http://10.0.0.7:8000)", where, i);
        len += json_string_length(u) + 1;
    }
    char *joined = xcalloc(len, 1);
    json_array_foreach(list, i, u) strcat(strcat(joined, i ? "," : ""), json_string_value(u));
    free(*out);
    *out = json_array_size(list) ? joined : (free(joined), NULL);
    return COLT_OK;
}

/* vllm_server_base_url's replicas: a JSON list given on the command line
 * becomes the comma-separated form; each URL non-empty and listed once.
 * *n_replicas: how many (1 when unset). */
static int check_server_urls(TrainConfig *c, int *n_replicas, char *err) {
    *n_replicas = 1;
    if (!c->vllm_server_base_url) return COLT_OK;
    if (c->vllm_server_base_url[0] == '[') {
        json_t *list = json_loads(c->vllm_server_base_url, 0, NULL);
        int rc = json_is_array(list)
                     ? set_url_list(&c->vllm_server_base_url, list, "settings", err)
                     : errorf(err, "settings: vllm_server_base_url '%.200s' is neither a URL nor a JSON list of URLs",
                              c->vllm_server_base_url);
        json_decref(list);
        if (rc != 0) return COLT_ERR;
        if (!c->vllm_server_base_url) return COLT_OK;
    }
    char *copy = xstrdup(c->vllm_server_base_url), *joined = xcalloc(strlen(copy) + 1, 1);
    int n = 0, rc = COLT_OK;
    for (char *u = copy, *next; u && rc == 0; u = next, n++) {
        next = strchr(u, ',');
        if (next) *next++ = '\0';
        while (*u == ' ') u++;
        for (size_t e = strlen(u); e > 0 && (u[e - 1] == ' ' || u[e - 1] == '/'); e--) u[e - 1] = '\0';
        if (!u[0]) {
            rc = errorf(err, "settings: vllm_server_base_url's entry %d is empty ('%.200s')", n,
                        c->vllm_server_base_url);
            break;
        }
        for (const char *seen = joined; rc == 0 && (seen = strstr(seen, u)); seen++)
            if ((seen == joined || seen[-1] == ',') && (seen[strlen(u)] == ',' || !seen[strlen(u)]))
                rc = errorf(err, "settings: vllm_server_base_url lists %s twice (each replica once)", u);
        strcat(strcat(joined, n ? "," : ""), u);
    }
    if (rc == 0) {
        free(c->vllm_server_base_url);
        c->vllm_server_base_url = joined;
        *n_replicas = n;
    } else free(joined);
    free(copy);
    return rc;
}

static int set_from_json(TrainConfig *c, const ConfigKey *k, json_t *v, const char *where, char *err) {
    void *p = (char *)c + k->offset;
    int rc = COLT_OK;
    if (k->offset == offsetof(TrainConfig, environment_factory)) return set_environment_factory(c, v, where, err);
    switch (k->type) {
    case KEY_DOUBLE:
    case KEY_DOUBLE_OR_NULL:
    case KEY_INT:
    case KEY_U64:
        rc = set_number(c, k, v, where, err);
        break;
    case KEY_BOOL: {
        /* "true" given as a string (a quoted YAML value, a flag) is accepted */
        json_t *b = json_is_string(v) ? scalar_to_json(json_string_value(v), false) : json_incref(v);
        if (json_is_boolean(b)) *(bool *)p = json_is_true(b);
        else if (json_is_null(b) && k->nullable) set_default(c, k);
        else rc = errorf(err, "%s: '%s' must be true or false", where, k->name);
        json_decref(b);
        break;
    }
    case KEY_STRING:
        if (json_is_array(v) && k->offset == offsetof(TrainConfig, vllm_server_base_url)) {
            rc = set_url_list((char **)p, v, where, err); /* several replicas */
        } else if (json_is_string(v)) {
            free(*(char **)p);
            *(char **)p = xstrdup(json_string_value(v));
        } else if (json_is_null(v)) {
            free(*(char **)p);
            *(char **)p = NULL;
        } else if (json_is_boolean(v)) { /* e.g. scale_rewards: true (TRL accepts booleans there) */
            free(*(char **)p);
            *(char **)p = xstrdup(json_is_true(v) ? "true" : "false");
        } else rc = errorf(err, "%s: '%s' must be a string", where, k->name);
        break;
    case KEY_JSON_LIST: {
        json_t *list = v;
        if (json_is_object(v) || json_is_string(v)) list = json_pack("[O]", v);  /* one spec alone */
        else json_incref(list);
        if (!json_is_array(list) && !json_is_null(list)) {
            json_decref(list);
            rc = errorf(err, "%s: '%s' must be a list", where, k->name);
            break;
        }
        json_decref(*(json_t **)p);
        *(json_t **)p = json_is_null(list) ? NULL : list;
        if (json_is_null(list)) json_decref(list);
        break;
    }
    case KEY_JSON_OBJECT:
        if (!json_is_object(v) && !json_is_null(v)) {
            rc = errorf(err, "%s: '%s' must be a mapping (a JSON object)", where, k->name);
            break;
        }
        json_decref(*(json_t **)p);
        *(json_t **)p = json_is_null(v) ? NULL : json_deep_copy(v);
        break;
    }
    if (rc == COLT_OK && k->offset == offsetof(TrainConfig, report_to)) rc = check_report_to(c, v, where, err);
    if (rc == COLT_OK && k->offset == offsetof(TrainConfig, lora_target_modules))
        rc = check_lora_targets(c, where, err);
    if (rc == COLT_OK && k->offset == offsetof(TrainConfig, reward_funcs)) rc = translate_trl_rewards(c, where, err);
    if (rc == COLT_OK && k->offset == offsetof(TrainConfig, generation_kwargs))
        rc = check_generation_kwargs(c, where, err);
    /* either name of the KV pool cap: remember that the user chose it */
    if (rc == COLT_OK && k->offset == offsetof(TrainConfig, gpu_memory_utilization))
        c->gpu_memory_utilization_set = true;
    if (rc == COLT_OK && k->offset == offsetof(TrainConfig, deterministic)) c->deterministic_set = true;
    /* use_cpu: true picks the CPU as soon as it is read (with device auto): colt train counts the processes to
     * start from device before it finalizes */
    if (rc == COLT_OK && c->use_cpu && c->device && strcmp(c->device, "auto") == 0 &&
        (k->offset == offsetof(TrainConfig, use_cpu) || k->offset == offsetof(TrainConfig, device))) {
        free(c->device);
        c->device = xstrdup("cpu");
        c->device_from_use_cpu = true;
    }
    /* a later use_cpu: false (the command line over a config file) gives back what use_cpu took */
    if (rc == COLT_OK && !c->use_cpu && c->device_from_use_cpu && k->offset == offsetof(TrainConfig, use_cpu)) {
        free(c->device);
        c->device = xstrdup("auto");
        c->device_from_use_cpu = false;
    }
    if (rc == COLT_OK && k->offset == offsetof(TrainConfig, device) && !c->use_cpu) c->device_from_use_cpu = false;
    if (rc == COLT_OK && k->offset == offsetof(TrainConfig, zero_stage)) c->zero_stage_set = true;
    if (rc == COLT_OK && k->offset == offsetof(TrainConfig, offload_optimizer)) c->offload_set = true;
    if (rc == COLT_OK && k->offset == offsetof(TrainConfig, offload_optimizer_ratio)) c->offload_ratio_set = true;
    if (rc == COLT_OK && k->notice) add_notice(c, k->name, v, k->notice, where);
    return rc;
}

/* ---------------------------------------------------------------- TRL keys */

static const TrlKey *find_trl_key(const char *name) {
    for (size_t i = 0; i < N_TRL_KEYS; i++)
        if (strcmp(TRL_KEYS[i].name, name) == 0) return &TRL_KEYS[i];
    return NULL;
}

/* Whether v is the accepted value written as token[0 .. len) (see TRL_KEYS). */
static bool trl_value_matches(const json_t *v, const char *token, size_t len) {
    if (len == 1 && token[0] == '*') return true;
    if (len == 2 && memcmp(token, "[]", 2) == 0) return json_is_array(v) && json_array_size(v) == 0;
    if (len == 2 && memcmp(token, "{}", 2) == 0) return json_is_object(v) && json_object_size(v) == 0;
    if (len == 2 && memcmp(token, "\"\"", 2) == 0) return json_is_string(v) && !*json_string_value(v);
    if (len > 2 && token[0] == '[' && token[len - 1] == ']')
        return json_is_array(v) && json_array_size(v) == 1 &&
               trl_value_matches(json_array_get(v, 0), token + 1, len - 2);
    char text[64];
    snprintf(text, sizeof text, "%.*s", (int)len, token);
    json_t *want = scalar_to_json(text, false);
    /* a string that reads as a scalar ("false" quoted in YAML, a flag's text) counts as that scalar */
    json_t *got = json_is_string(v) ? scalar_to_json(json_string_value(v), false) : json_incref((json_t *)v);
    bool same = got && want &&
                (json_is_number(got) && json_is_number(want)
                     ? json_number_value(got) == json_number_value(want)
                     : json_is_string(got) && json_is_string(want)
                           ? strcasecmp(json_string_value(got), json_string_value(want)) == 0
                           : json_equal(got, want));
    json_decref(got);
    json_decref(want);
    return same;
}

static bool trl_value_accepted(const TrlKey *t, const json_t *v) {
    for (const char *p = t->accepted; *p;) {
        size_t len = strcspn(p, " ");
        if (len > 0 && trl_value_matches(v, p, len)) return true;
        p += len + (p[len] == ' ');
    }
    return false;
}

/* "none, [], null": the accepted values as a message lists them. */
static void accepted_text(char *out, size_t n, const TrlKey *t) {
    size_t at = 0;
    out[0] = '\0';
    for (const char *p = t->accepted; *p && at < n;) {
        size_t len = strcspn(p, " ");
        at += (size_t)snprintf(out + at, n - at, "%s%.*s", at ? ", " : "", (int)len, p);
        p += len + (p[len] == ' ');
    }
}

/* A TRL key that is not a colt setting: an alias sets its colt key (null
 * leaves it as it is: TRL's None is its default); any other key is accepted
 * with a notice when its value changes nothing in colt, else refused. */
static int set_trl_key(TrainConfig *c, const TrlKey *t, json_t *v, const char *where, char *err) {
    if (t->alias) return json_is_null(v) ? COLT_OK : set_from_json(c, find_key(t->alias), v, where, err);
    if (t->apply) return t->apply(c, t, v, where, err);
    if (trl_value_accepted(t, v)) {
        add_notice(c, t->name, v, t->text, where);
        return COLT_OK;
    }
    char value[80], accepted[128];
    value_text(value, sizeof value, v);
    accepted_text(accepted, sizeof accepted, t);
    return errorf(err, "%s: %s: %s is a known TRL/transformers setting that colt does not support (yet) with this "
                       "value (colt accepts %s): %s",
                  where, t->name, value, accepted, t->text);
}

TrainKeyClass train_config_describe_key(char *text, size_t n, const char *key) {
    const ConfigKey *k = find_key(key);
    if (k && k->notice) {
        snprintf(text, n, "kept in the saved config, changes nothing: %s", k->notice);
        return TRAIN_KEY_NOOP;
    }
    if (k) {
        snprintf(text, n, "%s", k->help);
        return TRAIN_KEY_HONOURED;
    }
    const TrlKey *t = find_trl_key(key);
    if (!t) {
        snprintf(text, n, "unknown");
        return TRAIN_KEY_UNKNOWN;
    }
    if (t->alias) {
        snprintf(text, n, "sets `%s`: %s", t->alias, find_key(t->alias)->help);
        return TRAIN_KEY_ALIAS;
    }
    if (t->apply) {
        snprintf(text, n, "%s", t->text);
        return TRAIN_KEY_MAPPED;
    }
    if (strcmp(t->accepted, "*") == 0) {
        snprintf(text, n, "%s", t->text);
        return TRAIN_KEY_NOOP;
    }
    char accepted[128];
    accepted_text(accepted, sizeof accepted, t);
    snprintf(text, n, "accepted: %s; other values refused. %s", accepted, t->text);
    return TRAIN_KEY_LIMITED;
}

bool train_config_key_is_bool(const char *key) {
    const TrlKey *t = find_trl_key(key);
    if (t && t->alias) key = t->alias;
    const ConfigKey *k = find_key(key);
    if (k) return k->type == KEY_BOOL;
    if (!t || t->apply) return false;
    json_t *yes = json_true(), *no = json_false();
    bool is_bool = strcmp(t->accepted, "*") != 0 && (trl_value_accepted(t, yes) || trl_value_accepted(t, no));
    json_decref(yes);
    json_decref(no);
    return is_bool;
}

bool train_config_key_is_list(const char *key) {
    const TrlKey *t = find_trl_key(key);
    if (t && t->alias) key = t->alias;
    const ConfigKey *k = find_key(key);
    return k && k->type == KEY_JSON_LIST;
}

void train_config_print_notices(const TrainConfig *c) {
    const char *key;
    json_t *line;
    json_object_foreach(c->notices, key, line) log_info0("%s", json_string_value(line));
}

int train_config_set(TrainConfig *c, const char *key, const char *value, const char *where, char *err) {
    const ConfigKey *k = find_key(key);
    const TrlKey *t = k ? NULL : find_trl_key(key);
    if (!k && !t) return unknown_key(key, where, err);
    if (t && t->alias) return is_null_text(value) ? COLT_OK : train_config_set(c, t->alias, value, where, err);
    json_t *v;
    if (t) { /* a scalar, or a list or mapping written as JSON (report_to '[]') */
        v = NULL;
        if (value[0] == '[' || value[0] == '{') v = json_loads(value, JSON_DECODE_ANY, NULL);
        if (!v) v = scalar_to_json(value, false);
        if (!v) return errorf(err, "%s: '%s' is not valid UTF-8", where, key);
        int rc = set_trl_key(c, t, v, where, err);
        json_decref(v);
        return rc;
    }
    if (k->type == KEY_JSON_OBJECT) {
        json_error_t jerr;
        v = is_null_text(value) ? json_null() : json_loads(value, JSON_REJECT_DUPLICATES, &jerr);
        if (!v) return errorf(err, "%s: '%s' must be a JSON object: %s", where, key, jerr.text);
    } else if (k->type == KEY_JSON_LIST) {
        json_error_t jerr;
        v = json_loads(value, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &jerr);
        /* --report_to tensorboard, as transformers' parser takes it; --reward_funcs think_format_reward or
         * rewards.py:f, as trl grpo's */
        if (!v && (k->offset == offsetof(TrainConfig, report_to) || k->offset == offsetof(TrainConfig, reward_funcs)) &&
            value[0] != '[' && value[0] != '{')
            v = scalar_to_json(value, false);
        if (!v) return errorf(err, "%s: '%s' must be JSON (a list): %s", where, key, jerr.text);
    } else if (k->type == KEY_INT || k->type == KEY_U64 || k->type == KEY_DOUBLE || k->type == KEY_DOUBLE_OR_NULL) {
        v = json_string(value); /* set_number reads the text itself, so errors quote it as typed ("1e18") */
    } else if (k->type == KEY_BOOL && (strcmp(value, "1") == 0 || strcmp(value, "0") == 0)) {
        v = json_boolean(value[0] == '1'); /* as transformers' HfArgumentParser reads a flag */
    } else {
        v = scalar_to_json(value, false);
        if (k->type == KEY_STRING && !json_is_null(v)) {  /* "null" unsets a path */
            json_decref(v);
            v = json_string(value);
        }
    }
    if (!v) return errorf(err, "%s: '%s' is not valid UTF-8", where, key);
    int rc = set_from_json(c, k, v, where, err);
    json_decref(v);
    return rc;
}

/* ---------------------------------------------------------------- YAML */

static void yaml_syntax_error(const yaml_parser_t *parser, const char *name, char *err) {
    errorf(err, "%s line %zu: %s", name, parser->problem_mark.line + 1,
           parser->problem ? parser->problem : "YAML syntax error");
}

/* Builds a jansson value from libyaml events (mappings, sequences, scalars;
 * anchors and aliases are rejected). A key given twice in one mapping is an
 * error, as JSON_REJECT_DUPLICATES makes it for JSON: last-wins would let a
 * forgotten line silently override the one the user is looking at. */
static json_t *yaml_node(yaml_parser_t *parser, yaml_event_t *first, const char *name, char *err, int depth) {
    if (depth > 64) {
        errorf(err, "%s line %zu: nesting deeper than 64", name, first->start_mark.line + 1);
        return NULL;
    }
    if (first->type == YAML_SCALAR_EVENT) {
        const char *s = (const char *)first->data.scalar.value;
        bool quoted = first->data.scalar.style == YAML_SINGLE_QUOTED_SCALAR_STYLE ||
                      first->data.scalar.style == YAML_DOUBLE_QUOTED_SCALAR_STYLE ||
                      first->data.scalar.style == YAML_LITERAL_SCALAR_STYLE ||
                      first->data.scalar.style == YAML_FOLDED_SCALAR_STYLE;
        json_t *v = scalar_to_json(s, quoted);
        if (!v) errorf(err, "%s line %zu: invalid UTF-8", name, first->start_mark.line + 1);
        return v;
    }
    if (first->type == YAML_ALIAS_EVENT) {
        errorf(err, "%s line %zu: YAML aliases are not supported", name, first->start_mark.line + 1);
        return NULL;
    }
    bool is_map = first->type == YAML_MAPPING_START_EVENT;
    if (!is_map && first->type != YAML_SEQUENCE_START_EVENT) {
        errorf(err, "%s line %zu: unexpected YAML content", name, first->start_mark.line + 1);
        return NULL;
    }
    json_t *out = is_map ? json_object() : json_array();
    json_t *key_lines = is_map ? json_object() : NULL; /* key -> line of its first appearance */
    for (;;) {
        yaml_event_t ev;
        if (!yaml_parser_parse(parser, &ev)) {
            yaml_syntax_error(parser, name, err);
            break;
        }
        if (ev.type == YAML_MAPPING_END_EVENT || ev.type == YAML_SEQUENCE_END_EVENT) {
            yaml_event_delete(&ev);
            json_decref(key_lines);
            return out;
        }
        if (is_map) {
            size_t line = ev.start_mark.line + 1;
            if (ev.type != YAML_SCALAR_EVENT) {
                errorf(err, "%s line %zu: mapping keys must be plain strings", name, line);
                yaml_event_delete(&ev);
                break;
            }
            char *key = xstrdup((const char *)ev.data.scalar.value);
            yaml_event_delete(&ev);
            json_t *first_line = json_object_get(key_lines, key);
            if (first_line) {
                errorf(err, "%s line %zu: duplicate key '%.100s' (first on line %lld); give each key once", name, line,
                       key, (long long)json_integer_value(first_line));
                free(key);
                break;
            }
            yaml_event_t vev;
            if (!yaml_parser_parse(parser, &vev)) {
                yaml_syntax_error(parser, name, err);
                free(key);
                break;
            }
            json_t *v = yaml_node(parser, &vev, name, err, depth + 1);
            yaml_event_delete(&vev);
            if (!v || json_object_set_new(out, key, v) != 0) { /* set_new frees v when the key is not UTF-8 */
                if (v) errorf(err, "%s line %zu: key is not valid UTF-8", name, line);
                free(key);
                break;
            }
            json_object_set_new(key_lines, key, json_integer((json_int_t)line));
            free(key);
        } else {
            json_t *v = yaml_node(parser, &ev, name, err, depth + 1);
            yaml_event_delete(&ev);
            if (!v) break;
            json_array_append_new(out, v);
        }
    }
    json_decref(key_lines);
    json_decref(out);
    return NULL;
}

/* The one document of a YAML text; NULL with err set on error. An empty
 * text (or only comments) gives json null. */
static json_t *yaml_load(const char *text, size_t len, const char *name, char *err) {
    yaml_parser_t parser;
    yaml_parser_initialize(&parser);
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    json_t *root = NULL;
    bool seen = false, done = false, failed = false;
    while (!done) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&parser, &ev)) {
            yaml_syntax_error(&parser, name, err);
            failed = true;
            break;
        }
        switch (ev.type) {
        case YAML_STREAM_END_EVENT:
            done = true;
            break;
        case YAML_MAPPING_START_EVENT:
        case YAML_SEQUENCE_START_EVENT:
        case YAML_SCALAR_EVENT:
        case YAML_ALIAS_EVENT:
            if (seen) {
                errorf(err, "%s line %zu: more than one YAML document (one mapping of settings is expected)", name,
                       ev.start_mark.line + 1);
                failed = done = true;
                break;
            }
            seen = true;
            root = yaml_node(&parser, &ev, name, err, 0);
            if (!root) failed = done = true;
            break;
        default:
            break;
        }
        yaml_event_delete(&ev);
    }
    yaml_parser_delete(&parser);
    if (failed) {
        json_decref(root);
        return NULL;
    }
    return root ? root : json_null();
}

/* ---------------------------------------------------------------- loading */

static json_t *json_text_load(const char *text, size_t len, const char *name, char *err) {
    size_t blank = 0;
    while (blank < len && strchr(" \t\r\n", text[blank]) && text[blank]) blank++;
    if (blank == len) return json_null(); /* empty: reported as for YAML */
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (root) return root;
    const char *near = strstr(jerr.text, "near '");
    if (json_error_code(&jerr) == json_error_duplicate_key && near) {
        /* jansson's text: duplicate object key near '"name"' */
        const char *key = near + 6;
        int n = (int)strlen(key) - 1; /* without the closing ' */
        if (n >= 2 && key[0] == '"' && key[n - 1] == '"') key++, n -= 2;
        errorf(err, "%s line %d: duplicate key '%.*s'; give each key once", name, jerr.line, n > 100 ? 100 : n, key);
    } else {
        errorf(err, "%s line %d: invalid JSON: %s", name, jerr.line, jerr.text);
    }
    return NULL;
}

static const char *json_kind(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "a mapping";
    case JSON_ARRAY: return "a list";
    case JSON_STRING: return "a string";
    case JSON_INTEGER:
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "true/false";
    case JSON_NULL: return "null";
    }
    return "something else";
}

int train_config_load_text(TrainConfig *c, const char *text, size_t len, TrainConfigFormat format, const char *name,
                           char *err) {
    bool is_json = format == TRAIN_CONFIG_JSON;
    json_t *root = is_json ? json_text_load(text, len, name, err) : yaml_load(text, len, name, err);
    if (!root) return COLT_ERR;
    if (json_is_null(root)) {
        json_decref(root);
        return errorf(err, "%s: no settings in the file (it is empty%s); expected %s", name,
                      is_json ? "" : " or only comments",
                      is_json ? "a JSON object such as {\"model\": \"...\"}" : "'key: value' lines such as 'model: ...'");
    }
    if (!json_is_object(root)) {
        const char *kind = json_kind(root);
        json_decref(root);
        return errorf(err, "%s: expected %s of settings at the top level, found %s", name,
                      is_json ? "a JSON object" : "'key: value' lines", kind);
    }
    const char *key;
    json_t *v;
    int rc = COLT_OK;
    json_object_foreach(root, key, v) {
        const ConfigKey *k = find_key(key);
        const TrlKey *t = k ? NULL : find_trl_key(key);
        /* both names at once: fine when they agree (GRPOConfig().to_dict() writes both) */
        if (t && t->alias && json_object_get(root, t->alias) && !json_equal(json_object_get(root, t->alias), v)) {
            rc = errorf(err, "%s: %s and %s name the same setting with different values; give one of them", name,
                        t->alias, key);
            break;
        }
        if (k ? set_from_json(c, k, v, name, err) != 0 : t ? set_trl_key(c, t, v, name, err) != 0
                                                           : unknown_key(key, name, err) != 0) {
            rc = COLT_ERR;
            break;
        }
    }
    json_decref(root);
    return rc;
}

int train_config_load_file(TrainConfig *c, const char *path, char *err) {
    char *text = NULL;
    size_t len = 0;
    if (file_read_all(path, &text, &len, err) != 0) return COLT_ERR;
    size_t plen = strlen(path);
    bool is_json = plen > 5 && strcmp(path + plen - 5, ".json") == 0;
    int rc = train_config_load_text(c, text, len, is_json ? TRAIN_CONFIG_JSON : TRAIN_CONFIG_YAML, path, err);
    free(text);
    return rc;
}

/* ---------------------------------------------------------------- checks */

static bool one_of(const char *s, const char *const *names) {
    for (; *names; names++)
        if (s && strcmp(s, *names) == 0) return true;
    return false;
}

/* The batch and length products the trainer forms, in 64 bits (each factor is
 * already within its key's range), for prompts of prompt_tokens at most:
 * max_prompt_length when set; the dataset's longest once known (the trainer
 * checks again then, train_config_check_lengths). */
int train_config_check_lengths(const TrainConfig *c, int prompt_tokens, char *err) {
    const char *what = c->max_prompt_length > 0 ? "max_prompt_length" : "the longest prompt";
    int64_t seq = (int64_t)prompt_tokens + c->max_completion_length;
    int64_t micro_tokens = (int64_t)c->per_device_train_batch_size * seq;
    if (micro_tokens > TRAIN_CONFIG_MAX_TOKENS)
        return errorf(err, "settings: per_device_train_batch_size %d x (%s %d + max_completion_length %d) "
                           "= %lld tokens per micro-batch, more than the %d allowed: lower one of them",
                      c->per_device_train_batch_size, what, prompt_tokens, c->max_completion_length,
                      (long long)micro_tokens, TRAIN_CONFIG_MAX_TOKENS);
    int64_t round_tokens = (int64_t)c->generation_batch_size * seq;
    if (round_tokens > TRAIN_CONFIG_MAX_TOKENS)
        return errorf(err, "settings: generation_batch_size %d x (%s %d + max_completion_length %d) = "
                           "%lld tokens per generation round, more than the %d allowed: lower one of them",
                      c->generation_batch_size, what, prompt_tokens, c->max_completion_length,
                      (long long)round_tokens, TRAIN_CONFIG_MAX_TOKENS);
    return COLT_OK;
}

static int check_products(const TrainConfig *c, char *err) {
    if (train_config_check_lengths(c, c->max_prompt_length, err) != 0) return COLT_ERR;
    int64_t eval_completions = (int64_t)c->num_eval_prompts * c->num_generations;
    if (eval_completions > TRAIN_CONFIG_MAX_COMPLETIONS)
        return errorf(err, "settings: num_eval_prompts %d x num_generations %d = %lld eval completions, more than the %d "
                           "allowed: lower num_eval_prompts",
                      c->num_eval_prompts, c->num_generations, (long long)eval_completions,
                      TRAIN_CONFIG_MAX_COMPLETIONS);
    return COLT_OK;
}

/* lr_scheduler_kwargs as transformers' get_scheduler takes them: with
 * cosine_with_min_lr one of min_lr_rate and min_lr (a fraction of
 * learning_rate, as transformers computes it); num_cycles only at its default
 * 0.5 (the half cosine colt computes); the other schedules take none. */
static int resolve_schedule(TrainConfig *c, char *err) {
    static const char *const schedulers[] = {"constant", "constant_with_warmup", "linear", "cosine",
                                             "cosine_with_min_lr", NULL};
    if (!one_of(c->lr_scheduler_type, schedulers))
        return errorf(err, "settings: unknown lr_scheduler_type '%s' (constant, constant_with_warmup, linear, cosine, "
                           "cosine_with_min_lr)",
                      c->lr_scheduler_type ? c->lr_scheduler_type : "null");
    bool with_min = strcmp(c->lr_scheduler_type, "cosine_with_min_lr") == 0;
    bool cosine = with_min || strcmp(c->lr_scheduler_type, "cosine") == 0;
    json_t *rate = NULL, *min_lr = NULL;
    const char *key;
    json_t *v;
    json_object_foreach(c->lr_scheduler_kwargs, key, v) {
        if (with_min && strcmp(key, "min_lr_rate") == 0) rate = v;
        else if (with_min && strcmp(key, "min_lr") == 0) min_lr = v;
        else if (!(cosine && strcmp(key, "num_cycles") == 0 && json_is_number(v) && json_number_value(v) == 0.5)) {
            char text[80];
            value_text(text, sizeof text, v);
            return errorf(err, "settings: lr_scheduler_kwargs.%s: %s is not supported with lr_scheduler_type %s (%s)",
                          key, text, c->lr_scheduler_type,
                          with_min ? "it takes min_lr_rate or min_lr" : cosine ? "only num_cycles: 0.5"
                                                                             : "it takes no arguments");
        }
    }
    c->min_lr_rate = 0.0;
    if (!with_min) return COLT_OK;
    if (rate && min_lr) return errorf(err, "settings: lr_scheduler_kwargs: give min_lr_rate or min_lr, not both");
    if (!rate && !min_lr)
        return errorf(err, "settings: lr_scheduler_type cosine_with_min_lr needs lr_scheduler_kwargs {min_lr_rate: R} "
                           "or {min_lr: LR}");
    json_t *given = rate ? rate : min_lr;
    if (!json_is_number(given))
        return errorf(err, "settings: lr_scheduler_kwargs.%s must be a number", rate ? "min_lr_rate" : "min_lr");
    double r = rate ? json_number_value(rate) : c->learning_rate > 0 ? json_number_value(min_lr) / c->learning_rate
                                                                     : NAN;
    if (!(r >= 0 && r <= 1))
        return errorf(err, "settings: lr_scheduler_kwargs: %s %g is outside [0, 1] of learning_rate %g",
                      rate ? "min_lr_rate" : "min_lr / learning_rate =", r, c->learning_rate);
    c->min_lr_rate = r;
    return COLT_OK;
}

/* transformers' and TRL's switches as colt's settings: generation_kwargs
 * over the sampling settings, save_strategy, use_cpu / bf16 /
 * cast_lm_head_to_fp32 into device, a Hub dataset_name. The GPU count is
 * asked only when device auto must become cuda_f32 or cpu. */
static int resolve_trl_switches(TrainConfig *c, char *err) {
    const char *key;
    json_t *v;
    json_object_foreach(c->generation_kwargs, key, v) {
        const char *setting = generation_kwarg_setting(key);
        if (setting && set_from_json(c, find_key(setting), v, "settings: generation_kwargs", err) != 0)
            return COLT_ERR;
    }
    /* "no" unquoted is YAML's false: the same wish */
    if (c->save_strategy && (strcmp(c->save_strategy, "no") == 0 || strcmp(c->save_strategy, "false") == 0))
        c->save_steps = 0;
    else if (!c->save_strategy || strcmp(c->save_strategy, "steps") != 0)
        return errorf(err, "settings: save_strategy '%s' is not supported: use steps (a checkpoint every save_steps) "
                           "or no (none; the model is saved at the end)",
                      c->save_strategy ? c->save_strategy : "null");
    /* eval_strategy as transformers reads it ("no" unquoted is YAML's false); unset, colt's eval_steps decides */
    if (c->eval_strategy && !strcmp(c->eval_strategy, "steps")) {
        if (c->eval_steps == 0) c->eval_steps = c->logging_steps;
    } else if (c->eval_strategy && (!strcmp(c->eval_strategy, "no") || !strcmp(c->eval_strategy, "false"))) {
        c->eval_steps = 0;
    } else if (c->eval_strategy) {
        return errorf(err, "settings: eval_strategy '%s' is not supported: use steps (eval_steps) or no",
                      c->eval_strategy);
    }
    const char *dev = c->device ? c->device : "auto";
    if (c->use_cpu) {
        if (strcmp(dev, "cpu") != 0 && strcmp(dev, "auto") != 0)
            return errorf(err, "settings: use_cpu: true asks for the CPU but device is %s; give one of them", dev);
        dev = "cpu";
    }
    bool gpu_auto = strcmp(dev, "auto") == 0 && (!c->bf16 || c->cast_lm_head_to_fp32) && backend_gpu_count() > 0;
    if (!c->bf16) {
        if (strcmp(dev, "cuda") == 0)
            return errorf(err, "settings: bf16: false asks for fp32 weights but device cuda keeps bf16 weights: use "
                               "device cuda_f32 (or auto)");
        if (strcmp(dev, "auto") == 0) dev = gpu_auto ? "cuda_f32" : "cpu";
    }
    if (c->cast_lm_head_to_fp32 && (strcmp(dev, "cuda") == 0 || (strcmp(dev, "auto") == 0 && gpu_auto)))
        return errorf(err, "settings: cast_lm_head_to_fp32: true is not supported with bf16 weights on a GPU: set "
                           "bf16: false (fp32 weights, lm_head included: device cuda_f32)");
    if (c->cast_lm_head_to_fp32) {
        json_t *yes = json_true();
        add_notice(c, "cast_lm_head_to_fp32", yes, "the weights are fp32 here, lm_head included", "settings");
        json_decref(yes);
    }
    if (strcmp(dev, c->device ? c->device : "auto") != 0) {
        free(c->device);
        c->device = xstrdup(dev);
    }
    if (c->dataset_name && !c->dataset)
        return errorf(err, "settings: dataset_name '%s' is a Hub dataset; " T_DATASET, c->dataset_name);
    if (c->dataset_name) {
        char line[ERR_LEN];
        snprintf(line, sizeof line, "settings: dataset_name: %s is not read: colt trains on dataset %s",
                 c->dataset_name, c->dataset);
        train_config_notice(c, "dataset_name", line);
    }
    return COLT_OK;
}

int train_config_round_size(const TrainConfig *c, int world_size) {
    if (c->generation_batch_size > 0) return c->generation_batch_size;
    int64_t n = (int64_t)c->per_device_train_batch_size * world_size *
                (c->steps_per_generation > 0 ? c->steps_per_generation : c->gradient_accumulation_steps);
    return n > TRAIN_CONFIG_MAX_COMPLETIONS ? TRAIN_CONFIG_MAX_COMPLETIONS : (int)n;
}

int train_config_finalize(TrainConfig *c, char *err) {
    if (!c->model) return errorf(err, "settings: 'model' is required (a Hugging Face model folder)");
    if (!c->dataset && c->environment_factories) /* TRL's words: the dict routes rows by their environment */
        return errorf(err, "settings: a mapping environment_factory (several environments) needs a 'dataset' with "
                           "an 'environment' column to route each row to its environment");
    if (!c->dataset) return errorf(err, "settings: 'dataset' is required (a .jsonl or .json file of prompts)");
    if (!c->output_dir || !*c->output_dir) return errorf(err, "settings: 'output_dir' must be set");
    if (!c->dataset_prompt_column || !*c->dataset_prompt_column)
        return errorf(err, "settings: 'dataset_prompt_column' must name a column (default prompt)");
    /* TRL's script: the reward model first, then reward_funcs (trl/scripts/grpo.py); an empty name is none */
    if (c->reward_model_name_or_path) {
        json_t *spec = *c->reward_model_name_or_path
                           ? json_pack("{s:s, s:s}", "type", "model", "path", c->reward_model_name_or_path)
                           : NULL;
        bool named = *c->reward_model_name_or_path != '\0';
        free(c->reward_model_name_or_path);
        c->reward_model_name_or_path = NULL;
        if (named && !spec) return errorf(err, "settings: reward_model_name_or_path must be UTF-8 text");
        if (spec) {
            if (!c->reward_funcs) c->reward_funcs = json_array();
            json_array_insert_new(c->reward_funcs, 0, spec);
        }
    }
    /* TRL: an environment with get_reward may be the only reward (checked when its class is loaded) */
    if ((!c->reward_funcs || json_array_size(c->reward_funcs) == 0) && !c->environment_factory)
        return errorf(err, "settings: 'reward_funcs' needs at least one reward function");
    for (size_t i = 0; c->devices && i < json_array_size(c->devices); i++) {
        json_t *d = json_array_get(c->devices, i);
        if (!json_is_integer(d) || json_integer_value(d) < 0 || json_integer_value(d) > 1023)
            return errorf(err, "settings: devices[%zu] must be a GPU index (0 .. 1023)", i);
    }
    if (c->devices && json_array_size(c->devices) == 0) return errorf(err, "settings: devices is an empty list");
    for (size_t i = 0; c->tools && i < json_array_size(c->tools); i++)
        if (!json_is_string(json_array_get(c->tools, i)))
            return errorf(err, "settings: tools[%zu] must name a Python function (\"tools.py:calculator\" or "
                               "\"module.function\")", i);
    if (c->environment_factory && !*c->environment_factory)
        return errorf(err, "settings: environment_factory must name a Python class (\"envs.py:MathEnv\" or "
                           "\"module.Class\")");
    if (c->rollout_func) {
        if (!*c->rollout_func)
            return errorf(err, "settings: rollout_func must name a Python function (\"rollouts.py:my_rollout\" or "
                               "\"module.function\")");
        /* TRL hands generation to the rollout function instead of its own (tool) loop */
        if ((c->tools && json_array_size(c->tools) > 0) || c->environment_factory)
            return errorf(err, "settings: rollout_func with %s: the rollout function makes the completions itself "
                               "(call tools or environments inside it)",
                          c->environment_factory ? "environment_factory" : "tools");
        if (c->tensor_parallel_size > 1)
            return errorf(err, "settings: rollout_func with tensor_parallel_size > 1: each rank asks its engine when "
                               "its function does, and those engine calls would have to be collective; not "
                               "supported yet");
        if (c->async_generation || c->dynamic_sampling)
            return errorf(err, "settings: rollout_func with %s is not supported yet",
                          c->async_generation ? "async_generation" : "dynamic_sampling");
        if (c->eval_dataset)
            return errorf(err, "settings: rollout_func with eval_dataset: evaluation would not go through the "
                               "rollout function (as TRL's does); not supported yet");
        if (c->vllm_structured_outputs_regex)
            return errorf(err, "settings: rollout_func with vllm_structured_outputs_regex is not supported (the "
                               "function's completions are its own)");
    }
    const bool agent = (c->tools && json_array_size(c->tools) > 0) || c->environment_factory;
    if (c->vllm_structured_outputs_regex && agent)
        return errorf(err, "settings: vllm_structured_outputs_regex with tools is not supported (a regex over a "
                           "multi-turn completion and its tool results)");
    if (c->reward_weights && json_array_size(c->reward_weights) != json_array_size(c->reward_funcs))
        return errorf(err, "settings: reward_weights has %zu values for %zu reward functions",
                      json_array_size(c->reward_weights), json_array_size(c->reward_funcs));
    for (size_t i = 0; c->reward_weights && i < json_array_size(c->reward_weights); i++) {
        json_t *w = json_array_get(c->reward_weights, i);
        if (!json_is_number(w)) return errorf(err, "settings: reward_weights[%zu] must be a number", i);
        if (!(fabs(json_number_value(w)) <= MAX_REWARD_WEIGHT))
            return errorf(err, "settings: reward_weights[%zu]: %g is out of range (-%g .. %g)", i, json_number_value(w),
                          MAX_REWARD_WEIGHT, MAX_REWARD_WEIGHT);
    }
    if (resolve_trl_switches(c, err) != 0) return COLT_ERR;
    if (check_ranges(c, "settings", err) != 0) return COLT_ERR;
    if (resolve_schedule(c, err) != 0) return COLT_ERR;
    if (isnan(c->epsilon_high)) c->epsilon_high = c->epsilon;
    if (c->use_adaptive_entropy && c->entropy_coef_min > c->entropy_coef_max)
        return errorf(err, "settings: entropy_coef_min (%g) must not exceed entropy_coef_max (%g) with "
                           "use_adaptive_entropy", c->entropy_coef_min, c->entropy_coef_max);
    static const char *const losses[] = {"grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo", NULL};
    if (!one_of(c->loss_type, losses))
        return errorf(err, "settings: unknown loss_type '%s' (grpo, bnpo, dr_grpo, dapo, cispo, sapo, luspo, vespo)",
                      c->loss_type ? c->loss_type : "null");
    /* TRL refuses vespo with a sequence-level sampling correction (its weight is built per token) */
    if (!strcmp(c->loss_type, "vespo") && c->vllm_importance_sampling_correction && c->vllm_importance_sampling_mode &&
        strcmp(c->vllm_importance_sampling_mode, "token_truncate") != 0 &&
        strcmp(c->vllm_importance_sampling_mode, "token_mask") != 0)
        return errorf(err, "settings: loss_type vespo needs vllm_importance_sampling_mode token_truncate or token_mask "
                           "(got %s), as TRL", c->vllm_importance_sampling_mode);
    static const char *const levels[] = {"token", "sequence", NULL};
    if (!one_of(c->importance_sampling_level, levels))
        return errorf(err, "settings: unknown importance_sampling_level '%s' (token, sequence)",
                      c->importance_sampling_level ? c->importance_sampling_level : "null");
    if (c->scale_rewards && strcmp(c->scale_rewards, "true") == 0) {
        free(c->scale_rewards);
        c->scale_rewards = xstrdup("group");
    c->multi_objective_aggregation = xstrdup("sum_then_normalize");
    } else if (c->scale_rewards && strcmp(c->scale_rewards, "false") == 0) {
        free(c->scale_rewards);
        c->scale_rewards = xstrdup("none");
    }
    static const char *const scales[] = {"group", "batch", "none", NULL};
    if (!one_of(c->scale_rewards, scales))
        return errorf(err, "settings: unknown scale_rewards '%s' (group, batch, none)",
                      c->scale_rewards ? c->scale_rewards : "null");
    static const char *const aggregations[] = {"sum_then_normalize", "normalize_then_sum", NULL};
    if (!one_of(c->multi_objective_aggregation, aggregations))
        return errorf(err, "settings: unknown multi_objective_aggregation '%s' (sum_then_normalize, normalize_then_sum)",
                      c->multi_objective_aggregation ? c->multi_objective_aggregation : "null");
    static const char *const vllm_modes[] = {"colocate", "server", NULL};
    if (!one_of(c->vllm_mode, vllm_modes))
        return errorf(err, "settings: unknown vllm_mode '%s' (colocate, server)", c->vllm_mode ? c->vllm_mode : "null");
    if (c->server_devices) {
        if (json_array_size(c->server_devices) == 0)
            return errorf(err, "settings: server_devices is an empty list (GPU indices for colt serve, e.g. [7])");
        for (size_t i = 0; i < json_array_size(c->server_devices); i++) {
            json_t *d = json_array_get(c->server_devices, i);
            if (!json_is_integer(d) || json_integer_value(d) < 0 || json_integer_value(d) > 1023)
                return errorf(err, "settings: server_devices[%zu] is not a GPU index (0 .. 1023)", i);
        }
        free(c->vllm_mode);
        c->vllm_mode = xstrdup("server");
    }
    int n_replicas;
    if (check_server_urls(c, &n_replicas, err) != 0) return COLT_ERR;
    if (c->vllm_group_port + n_replicas - 1 > 65535)
        return errorf(err, "settings: vllm_group_port %d + %d replicas runs past port 65535 (replica i's weight channel "
                           "is at vllm_group_port + i)", c->vllm_group_port, n_replicas);
    bool server = strcmp(c->vllm_mode, "server") == 0;
    if (c->vllm_structured_outputs_regex && server)
        return errorf(err, "settings: vllm_structured_outputs_regex runs in colt's colocated engine; vllm_mode server "
                           "does not carry it yet (remove vllm_mode server)");
    if (train_config_check_server_tp(c, err) != 0) return COLT_ERR;
    if (server && !c->vllm_server_base_url && (!c->vllm_server_host || !c->vllm_server_host[0]))
        return errorf(err, "settings: vllm_mode server needs vllm_server_host (or vllm_server_base_url)");
    const char *env_key = getenv("COLT_API_KEY");
    if (server && !c->vllm_server_api_key && env_key && env_key[0]) c->vllm_server_api_key = xstrdup(env_key);
    static const char *const sync_backends[] = {"auto", "nccl", "gloo", NULL};
    if (!one_of(c->weight_sync_backend, sync_backends))
        return errorf(err, "settings: unknown weight_sync_backend '%s' (auto, nccl, gloo)",
                      c->weight_sync_backend ? c->weight_sync_backend : "null");
    if (c->async_generation && !server)
        return errorf(err, "settings: async_generation needs vllm_mode server (colocated generation shares the "
                           "devices with training, so there is nothing to overlap)");
    static const char *const is_modes[] = {"token_truncate", "token_mask", "sequence_truncate", "sequence_mask", NULL};
    if (!one_of(c->vllm_importance_sampling_mode, is_modes))
        return errorf(err,
                      "settings: unknown vllm_importance_sampling_mode '%s' (token_truncate, token_mask, "
                      "sequence_truncate, sequence_mask)",
                      c->vllm_importance_sampling_mode ? c->vllm_importance_sampling_mode : "null");
    if (!isnan(c->vllm_importance_sampling_cap)) {  /* TRL's __post_init__: the deprecated cap wins */
        log_info0("settings: vllm_importance_sampling_cap is deprecated (TRL 1.6); use vllm_importance_sampling_clip_max");
        c->vllm_importance_sampling_clip_max = c->vllm_importance_sampling_cap;
    }
    double is_min = c->vllm_importance_sampling_clip_min, is_max = c->vllm_importance_sampling_clip_max;
    if (!isnan(is_min) && !isnan(is_max) && is_min >= is_max)
        return errorf(err, "settings: vllm_importance_sampling_clip_min (%g) must be less than "
                           "vllm_importance_sampling_clip_max (%g)", is_min, is_max);
    if (c->vllm_importance_sampling_correction && strstr(c->vllm_importance_sampling_mode, "_truncate") &&
        isnan(is_min) && isnan(is_max))
        return errorf(err, "settings: vllm_importance_sampling_mode %s needs vllm_importance_sampling_clip_min or "
                           "vllm_importance_sampling_clip_max",
                      c->vllm_importance_sampling_mode);
    if (c->world_size < 1 || c->world_size > TRAIN_CONFIG_MAX_BATCH)
        return errorf(err, "settings: world size %d is out of range (1 .. %d)", c->world_size, TRAIN_CONFIG_MAX_BATCH);
    /* TRL: generation_batch_size and steps_per_generation are alternatives;
     * both (GRPOConfig().to_dict() writes both, resolved) load when they agree. */
    if (c->generation_batch_size > 0 && c->steps_per_generation > 0) {
        int64_t implied = (int64_t)c->per_device_train_batch_size * c->world_size * c->steps_per_generation;
        if (implied != c->generation_batch_size)
            return errorf(err, "settings: generation_batch_size %d and steps_per_generation %d disagree "
                               "(per_device_train_batch_size %d x %d processes x %d = %lld); set one of them",
                          c->generation_batch_size, c->steps_per_generation, c->per_device_train_batch_size,
                          c->world_size, c->steps_per_generation, (long long)implied);
        c->steps_per_generation = 0; /* derived again below from generation_batch_size */
    }
    /* A micro-batch spans the world: per_device_train_batch_size on each process. */
    int64_t global_batch = (int64_t)c->per_device_train_batch_size * c->world_size;
    if (global_batch > TRAIN_CONFIG_MAX_COMPLETIONS)
        return errorf(err, "settings: per_device_train_batch_size %d x %d processes is more than %d completions",
                      c->per_device_train_batch_size, c->world_size, TRAIN_CONFIG_MAX_COMPLETIONS);
    int bs = (int)global_batch;
    if (c->generation_batch_size > 0) {
        if (c->generation_batch_size % bs != 0)
            return c->world_size > 1
                       ? errorf(err, "settings: generation_batch_size (%d) must be divisible by "
                                     "per_device_train_batch_size x processes (%d x %d)",
                                c->generation_batch_size, c->per_device_train_batch_size, c->world_size)
                       : errorf(err, "settings: generation_batch_size (%d) must be divisible by "
                                     "per_device_train_batch_size (%d)",
                                c->generation_batch_size, bs);
        int steps = c->generation_batch_size / bs;
        if (steps > TRAIN_CONFIG_MAX_BATCH)
            return errorf(err, "settings: steps_per_generation: generation_batch_size %d / per_device_train_batch_size %d "
                               "= %d is out of range (1 .. %d): raise per_device_train_batch_size",
                          c->generation_batch_size, bs, steps, TRAIN_CONFIG_MAX_BATCH);
        c->steps_per_generation = steps;
    } else {
        if (c->steps_per_generation == 0) c->steps_per_generation = c->gradient_accumulation_steps;
        int64_t n = (int64_t)bs * c->steps_per_generation;
        if (n > TRAIN_CONFIG_MAX_COMPLETIONS)
            return errorf(err, "settings: generation_batch_size: per_device_train_batch_size %d x steps_per_generation %d "
                               "= %lld is out of range (1 .. %d)",
                          bs, c->steps_per_generation, (long long)n, TRAIN_CONFIG_MAX_COMPLETIONS);
        c->generation_batch_size = (int)n;
    }
    if (c->generation_batch_size % c->num_generations != 0)
        return errorf(err, "settings: generation_batch_size (%d = per_device_train_batch_size x steps_per_generation) "
                           "must be divisible by num_generations (%d)",
                      c->generation_batch_size, c->num_generations);
    if (check_products(c, err) != 0) return COLT_ERR;
    if (c->merge_lora && !c->use_peft) return errorf(err, "settings: merge_lora needs use_peft: true");
    if (c->dynamic_sampling && c->async_generation)
        return errorf(err, "settings: dynamic_sampling with async_generation: a round's size is known only once its "
                           "groups are scored, so the next one cannot be asked for in advance; turn one off");
    if (c->sync_ref_model && c->beta == 0)
        return errorf(err, "settings: sync_ref_model needs a reference model, which beta 0 does not load: set beta > 0 "
                           "or sync_ref_model: false (as TRL)");
    if (c->sync_ref_model && c->use_peft)
        return errorf(err, "settings: sync_ref_model with use_peft: the reference model is the base model with the "
                           "adapters off, there is no separate one to sync (TRL refuses it too); use full fine-tuning or "
                           "sync_ref_model: false");
    if (c->deepspeed && deepspeed_config_apply(c, c->deepspeed, err) != 0) return COLT_ERR;
    if (c->rollout_func && c->zero_stage == 3) /* after the DeepSpeed file, which may set the stage */
        return errorf(err, "settings: rollout_func with zero_stage 3: each rank's engine would gather the weights "
                           "when its function asks, and those gathers are collective; not supported yet (zero_stage "
                           "0-2)");
    if (strcmp(c->offload_optimizer, "none") != 0 && strcmp(c->offload_optimizer, "cpu") != 0)
        return errorf(err, "settings: offload_optimizer '%s': use none or cpu%s", c->offload_optimizer,
                      strcmp(c->offload_optimizer, "nvme") == 0 ? " (NVMe offload is not supported)" : "");
    if (c->offload_optimizer_ratio != 1.0 && strcmp(c->offload_optimizer, "cpu") != 0)
        return errorf(err, "settings: offload_optimizer_ratio %g without offload_optimizer cpu: the ratio is the share "
                           "of the offloaded state; give offload_optimizer: cpu, or leave the ratio out",
                      c->offload_optimizer_ratio);
    if (c->zero_stage >= 2 && c->use_peft)
        return errorf(err, "settings: zero_stage %d with use_peft: LoRA's gradients are a few MB and its frozen "
                           "weights are not sharded; use zero_stage 0 or 1", c->zero_stage);
    if (c->lora_target_modules && json_array_size(c->lora_target_modules) == 0)
        return errorf(err, "settings: lora_target_modules is an empty list");
    if (c->max_steps == 0) return errorf(err, "settings: max_steps must be > 0, or -1 to use num_train_epochs");
    /* async: a round is generated with the weights of the step before the round it follows was trained from */
    int round_steps = (c->steps_per_generation * c->num_iterations + c->gradient_accumulation_steps - 1) /
                      c->gradient_accumulation_steps;
    if (c->async_generation && round_steps > c->max_staleness)
        return errorf(err, "settings: async_generation: a generation round lasts %d optimizer steps "
                           "(steps_per_generation %d x num_iterations %d / gradient_accumulation_steps %d), so its "
                           "samples would be %d steps stale, more than max_staleness %d: make a round one optimizer step",
                      round_steps, c->steps_per_generation, c->num_iterations, c->gradient_accumulation_steps,
                      round_steps, c->max_staleness);
    return COLT_OK;
}

int train_config_check_server_tp(const TrainConfig *c, char *err) {
    size_t n_devices = json_array_size(c->server_devices);
    if (c->server_devices && n_devices > 0 && n_devices % (size_t)c->server_data_parallel_size != 0)
        return errorf(err, "settings: server_devices lists %zu GPU(s), which server_data_parallel_size %d does not "
                           "divide (each replica takes the same number of them)",
                      n_devices, c->server_data_parallel_size);
    if (!c->server_devices && c->server_data_parallel_size > 1)
        return errorf(err, "settings: server_data_parallel_size %d goes with server_devices (colt train starts the "
                           "replicas); for servers started by hand, list their URLs in vllm_server_base_url",
                      c->server_data_parallel_size);
    if (c->ddp_backend && strcmp(c->ddp_backend, "nccl") != 0 && strcmp(c->ddp_backend, "gloo") != 0 &&
        strcmp(c->ddp_backend, "mpi") != 0)
        return errorf(err, "settings: ddp_backend '%s' is not one colt has (nccl, gloo or mpi)", c->ddp_backend);
    if (c->vllm_mode && strcmp(c->vllm_mode, "server") == 0 && c->tensor_parallel_size > 1)
        return errorf(err, "settings: vllm_mode server needs tensor_parallel_size 1, not %d (the trainer pushes its "
                           "whole model over the weight channel; the server may be tensor parallel: several "
                           "server_devices, or colt serve --tensor_parallel_size)",
                      c->tensor_parallel_size);
    return COLT_OK;
}

int train_config_total_steps(int64_t *total_steps, const TrainConfig *c, size_t n_prompts, char *err) {
    *total_steps = 0;
    if (c->max_steps > 0) {
        *total_steps = c->max_steps;
        return COLT_OK;
    }
    /* finalized: these hold, so the divisions below are defined */
    COLT_ASSERT(c->num_generations >= 2 && c->generation_batch_size >= c->num_generations);
    COLT_ASSERT(c->steps_per_generation >= 1 && c->num_iterations >= 1 && c->gradient_accumulation_steps >= 1);
    double epochs = c->num_train_epochs;
    if (!(epochs > 0 && epochs <= TRAIN_CONFIG_MAX_EPOCHS))
        return errorf(err, "settings: num_train_epochs: %g is out of range (0 < num_train_epochs <= %g)", epochs,
                      TRAIN_CONFIG_MAX_EPOCHS);
    size_t per_round = (size_t)(c->generation_batch_size / c->num_generations);
    size_t rounds_per_epoch = n_prompts / per_round;
    if (rounds_per_epoch == 0)
        return errorf(err, "settings: %zu prompts are fewer than the %zu unique prompts a generation round needs "
                           "(generation_batch_size %d / num_generations %d)",
                      n_prompts, per_round, c->generation_batch_size, c->num_generations);
    int64_t micro_per_round = (int64_t)c->steps_per_generation * c->num_iterations; /* <= 2^26 */
    double rounds = ceil(epochs * (double)rounds_per_epoch);
    /* Reject in double first: past 2^53 a double skips integers and past 2^63
     * the cast to int64 is undefined. Below 2^53 rounds x micro_per_round
     * fits in int64 (2^53 x 2^26 would not: hence the division test). */
    double approx = rounds * (double)micro_per_round / c->gradient_accumulation_steps;
    int64_t steps = -1;
    if (rounds <= 9007199254740992.0 && (int64_t)rounds <= INT64_MAX / micro_per_round) {
        int64_t micro = (int64_t)rounds * micro_per_round;
        steps = micro / c->gradient_accumulation_steps + (micro % c->gradient_accumulation_steps != 0);
    }
    if (steps < 0 || steps > TRAIN_CONFIG_MAX_STEPS)
        return errorf(err, "settings: num_train_epochs %g over %zu prompts makes %.4g optimizer steps, more than the %d "
                           "allowed: lower num_train_epochs or set max_steps",
                      epochs, n_prompts, approx, TRAIN_CONFIG_MAX_STEPS);
    *total_steps = steps > 0 ? steps : 1;
    return COLT_OK;
}

/* ---------------------------------------------------------------- dump / help */

static json_t *key_to_json(const TrainConfig *c, const ConfigKey *k) {
    const void *p = (const char *)c + k->offset;
    if (k->secret) return json_null();
    if (k->offset == offsetof(TrainConfig, environment_factory) && c->environment_factories)
        return json_deep_copy(c->environment_factories);
    switch (k->type) {
    case KEY_DOUBLE: return json_real(*(const double *)p);
    case KEY_DOUBLE_OR_NULL: return isnan(*(const double *)p) ? json_null() : json_real(*(const double *)p);
    case KEY_INT: return json_integer(*(const int *)p);
    case KEY_U64: return json_integer((json_int_t) * (const uint64_t *)p);
    case KEY_BOOL: return json_boolean(*(const bool *)p);
    case KEY_STRING: return *(char *const *)p ? json_string(*(char *const *)p) : json_null();
    case KEY_JSON_LIST:
    case KEY_JSON_OBJECT: return *(json_t *const *)p ? json_deep_copy(*(json_t *const *)p) : json_null();
    }
    return json_null();
}

json_t *train_config_to_json(const TrainConfig *c) {
    json_t *o = json_object();
    for (size_t i = 0; i < N_KEYS; i++) json_object_set_new(o, KEYS[i].name, key_to_json(c, &KEYS[i]));
    return o;
}

void train_config_print_help(void *fp) {
    TrainConfig d;
    train_config_defaults(&d);
    for (size_t i = 0; i < N_KEYS; i++) {
        const ConfigKey *k = &KEYS[i];
        json_t *v = key_to_json(&d, k);
        char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_REAL_PRECISION(6));
        char range[128] = "";
        if (k->type == KEY_INT || k->type == KEY_U64 || k->type == KEY_DOUBLE || k->type == KEY_DOUBLE_OR_NULL) {
            range[0] = ';', range[1] = ' ';
            range_text(range + 2, sizeof range - 2, k);
        }
        fprintf(fp, "  --%-28s %s (default %s%s)\n", k->name, k->help, s, range);
        free(s);
        json_decref(v);
    }
    fprintf(fp, "  (ranges keep every batch and length product far inside 32-bit arithmetic; batch x (prompt + "
                "completion length) and generation_batch_size x (prompt + completion length) are at most %d tokens)\n",
            TRAIN_CONFIG_MAX_TOKENS);
    fprintf(fp, "  (the other keys of TRL's GRPOConfig, transformers' TrainingArguments, TRL's ModelConfig and the trl "
                "grpo command are known: model_name_or_path sets model, datasets and dataset_name a local file set "
                "dataset, a value that changes nothing in colt loads with a notice, others are refused saying what to "
                "do instead; TRL's null is the default; a list setting takes several words (--reward_funcs a b); "
                "docs/trl_config.md lists them)\n");
    train_config_free(&d);
}
