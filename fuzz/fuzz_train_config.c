/* fuzz_train_config.c — libFuzzer target: the `colt train` settings loader
 * (train_config_load_text) on arbitrary bytes, as YAML, as JSON, and as
 * "key value" flag lines (train_config_set). Must never crash or leak. What it
 * accepts must lie inside every key's range (restated here from
 * train_config.h, not taken from the loader); what then finalizes must keep
 * the trainer's batch and length products and its total steps within bounds;
 * and an accepted config's JSON dump must load back to the same config. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/log.h"
#include "train/train_config.h"

#define IN(v, lo, hi) ((v) >= (lo) && (v) <= (hi))
#define NULL_OR(d, cond) (isnan(d) || (cond))

static void check_ranges(const TrainConfig *c) {
    COLT_ASSERT(IN(c->warmup_steps, 0, TRAIN_CONFIG_MAX_STEPS));
    COLT_ASSERT(IN(c->num_generations, 2, TRAIN_CONFIG_MAX_BATCH));
    COLT_ASSERT(IN(c->max_completion_length, 1, TRAIN_CONFIG_MAX_LENGTH));
    COLT_ASSERT(IN(c->max_prompt_length, 1, TRAIN_CONFIG_MAX_LENGTH));
    COLT_ASSERT(IN(c->top_k, 0, TRAIN_CONFIG_MAX_TOP_K));
    COLT_ASSERT(IN(c->num_iterations, 1, TRAIN_CONFIG_MAX_ITERATIONS));
    COLT_ASSERT(IN(c->per_device_train_batch_size, 1, TRAIN_CONFIG_MAX_BATCH));
    COLT_ASSERT(IN(c->gradient_accumulation_steps, 1, TRAIN_CONFIG_MAX_BATCH));
    COLT_ASSERT(IN(c->generation_batch_size, 0, TRAIN_CONFIG_MAX_COMPLETIONS));
    COLT_ASSERT(IN(c->steps_per_generation, 0, TRAIN_CONFIG_MAX_BATCH));
    COLT_ASSERT(IN(c->max_steps, -1, TRAIN_CONFIG_MAX_STEPS));
    COLT_ASSERT(IN(c->logging_steps, 1, TRAIN_CONFIG_MAX_STEPS));
    COLT_ASSERT(IN(c->save_steps, 0, TRAIN_CONFIG_MAX_STEPS));
    COLT_ASSERT(IN(c->save_total_limit, 0, TRAIN_CONFIG_MAX_STEPS));
    COLT_ASSERT(IN(c->eval_steps, 0, TRAIN_CONFIG_MAX_STEPS));
    COLT_ASSERT(IN(c->num_eval_prompts, 0, TRAIN_CONFIG_MAX_COMPLETIONS));
    COLT_ASSERT(IN(c->log_completions_count, 0, TRAIN_CONFIG_MAX_COMPLETIONS));
    COLT_ASSERT(c->seed <= (uint64_t)INT64_MAX);
    /* doubles: finite, in their ranges (NaN only where it means unset) */
    COLT_ASSERT(IN(c->learning_rate, 0, 100));
    COLT_ASSERT(IN(c->warmup_ratio, 0, 1));
    COLT_ASSERT(IN(c->weight_decay, 0, 100));
    COLT_ASSERT(c->adam_beta1 >= 0 && c->adam_beta1 < 1);
    COLT_ASSERT(c->adam_beta2 >= 0 && c->adam_beta2 < 1);
    COLT_ASSERT(IN(c->adam_epsilon, 1e-30, 1));
    COLT_ASSERT(IN(c->max_grad_norm, 0, 1e9));
    COLT_ASSERT(IN(c->temperature, 1e-3, 100));
    COLT_ASSERT(c->top_p > 0 && c->top_p <= 1);
    COLT_ASSERT(IN(c->min_p, 0, 1));
    COLT_ASSERT(IN(c->repetition_penalty, 1e-3, 100));
    COLT_ASSERT(IN(c->beta, 0, 1000));
    COLT_ASSERT(IN(c->epsilon, 0, 1000));
    COLT_ASSERT(NULL_OR(c->epsilon_high, IN(c->epsilon_high, 0, 1000)));
    COLT_ASSERT(NULL_OR(c->delta, c->delta > 1 && c->delta <= 1e9));
    COLT_ASSERT(NULL_OR(c->vllm_importance_sampling_clip_min, IN(c->vllm_importance_sampling_clip_min, 0, 1e9)));
    COLT_ASSERT(NULL_OR(c->vllm_importance_sampling_clip_max,
                        c->vllm_importance_sampling_clip_max > 0 && c->vllm_importance_sampling_clip_max <= 1e9));
    COLT_ASSERT(NULL_OR(c->vllm_importance_sampling_cap,
                        c->vllm_importance_sampling_cap > 0 && c->vllm_importance_sampling_cap <= 1e9));
    COLT_ASSERT(IN(c->gpu_memory_utilization, 0, 1));
    COLT_ASSERT(c->num_train_epochs > 0 && c->num_train_epochs <= TRAIN_CONFIG_MAX_EPOCHS);
}

/* What the trainer multiplies, after finalize. */
static void check_finalized(const TrainConfig *c) {
    check_ranges(c);
    int64_t seq = (int64_t)c->max_prompt_length + c->max_completion_length;
    COLT_ASSERT(c->steps_per_generation >= 1 && c->steps_per_generation <= TRAIN_CONFIG_MAX_BATCH);
    COLT_ASSERT(c->generation_batch_size >= 1 && c->generation_batch_size <= TRAIN_CONFIG_MAX_COMPLETIONS);
    COLT_ASSERT((int64_t)c->per_device_train_batch_size * c->steps_per_generation == c->generation_batch_size);
    COLT_ASSERT(c->generation_batch_size % c->num_generations == 0);
    COLT_ASSERT((int64_t)c->per_device_train_batch_size * seq <= TRAIN_CONFIG_MAX_TOKENS);
    COLT_ASSERT((int64_t)c->generation_batch_size * seq <= TRAIN_CONFIG_MAX_TOKENS);
    COLT_ASSERT((int64_t)c->num_eval_prompts * c->num_generations <= TRAIN_CONFIG_MAX_COMPLETIONS);
    COLT_ASSERT(c->max_steps != 0 && !isnan(c->epsilon_high));
    size_t per_round = (size_t)(c->generation_batch_size / c->num_generations);
    size_t prompts[] = {0, per_round, per_round * 1000 + 7, (size_t)1 << 40, SIZE_MAX};
    for (size_t i = 0; i < sizeof prompts / sizeof *prompts; i++) {
        int64_t steps = -1;
        char err[ERR_LEN];
        if (train_config_total_steps(&steps, c, prompts[i], err) == 0) {
            COLT_ASSERT(steps >= 1 && steps <= TRAIN_CONFIG_MAX_STEPS);
            COLT_ASSERT(c->max_steps < 0 || steps == c->max_steps);
        } else {
            COLT_ASSERT(err[0] != '\0');
        }
    }
}

/* An accepted config's dump loads back, as JSON, to the same dump. */
static void check_round_trip(const TrainConfig *c) {
    json_t *dump = train_config_to_json(c);
    json_object_del(dump, "vllm_gpu_memory_utilization"); /* an alias of gpu_memory_utilization */
    char *text = json_dumps(dump, 0);
    COLT_ASSERT(text != NULL);
    TrainConfig d;
    char err[ERR_LEN];
    train_config_defaults(&d);
    COLT_ASSERT(train_config_load_text(&d, text, strlen(text), TRAIN_CONFIG_JSON, "dump.json", err) == 0);
    json_t *again = train_config_to_json(&d);
    json_object_del(again, "vllm_gpu_memory_utilization");
    COLT_ASSERT(json_equal(dump, again));
    json_decref(again);
    train_config_free(&d);
    free(text);
    json_decref(dump);
}

/* Load accepted: check it, then fill what finalize requires and finalize. */
static void after_load(TrainConfig *c) {
    char err[ERR_LEN];
    check_ranges(c);
    check_round_trip(c);
    if (!c->model) COLT_ASSERT(train_config_set(c, "model", "m", "fuzz", err) == 0);
    if (!c->dataset) COLT_ASSERT(train_config_set(c, "dataset", "d.jsonl", "fuzz", err) == 0);
    if (!c->reward_funcs) COLT_ASSERT(train_config_set(c, "reward_funcs", "[{\"type\": \"length\"}]", "fuzz", err) == 0);
    if (train_config_finalize(c, err) == 0) check_finalized(c);
    else COLT_ASSERT(err[0] != '\0');
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int quiet = 0;
    if (!quiet) log_set_rank(1), quiet = 1; /* finalize's deprecation note would flood the output */
    char err[ERR_LEN];
    const TrainConfigFormat formats[2] = {TRAIN_CONFIG_YAML, TRAIN_CONFIG_JSON};
    for (int f = 0; f < 2; f++) {
        TrainConfig c;
        train_config_defaults(&c);
        err[0] = '\0';
        if (train_config_load_text(&c, (const char *)data, size, formats[f], f ? "fuzz.json" : "fuzz.yaml", err) == 0)
            after_load(&c);
        else COLT_ASSERT(err[0] != '\0'); /* every refusal says why */
        train_config_free(&c);
    }

    /* flags: "[--]key value" per line, at most 64 lines */
    char *text = malloc(size + 1);
    COLT_ASSERT(text != NULL);
    memcpy(text, data, size);
    text[size] = '\0';
    TrainConfig c;
    train_config_defaults(&c);
    int rc = COLT_OK, lines = 0;
    for (char *line = text; line && rc == 0 && lines < 64; lines++) {
        char *next = strchr(line, '\n');
        if (next) *next++ = '\0';
        char *key = line + (strncmp(line, "--", 2) == 0 ? 2 : 0);
        char *value = strchr(key, ' ');
        if (value) *value++ = '\0';
        err[0] = '\0';
        rc = train_config_set(&c, key, value ? value : "", "command line", err);
        if (rc != 0) COLT_ASSERT(err[0] != '\0');
        line = next;
    }
    if (rc == 0) after_load(&c);
    train_config_free(&c);
    free(text);
    return 0;
}
