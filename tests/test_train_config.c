/* test_train_config.c — `colt train` settings (train/train_config.c):
 *   - every int and double key at both ends of its range, just inside and just
 *     outside, from a flag, a YAML file and a JSON file (the table below
 *     restates the ranges; a numeric key missing from it fails the test);
 *   - text no int or double can hold (2^31, 2^63, 1e400, nan, inf, .inf, 2.5
 *     for an int): a one-line error naming the key, the setting unchanged;
 *   - the products of batch and length settings, and the total-steps helper
 *     at its limit;
 *   - duplicate keys (YAML and JSON, top level and inside reward_funcs), empty
 *     files, comment-only YAML, non-mapping top levels;
 *   - examples/demo.yaml still loading with its values;
 *   - every key of TRL's GRPOConfig / TrainingArguments / ModelConfig
 *     (tests/data/trl_config_keys.txt, from tests/make_trl_keys.py) known:
 *     honoured, an alias, or a no-op (for some or all values) whose accepted
 *     values load with one notice and whose other values are refused as a
 *     known key; the messages of a handful; TRL's colocate GRPOConfig loading
 *     with its values; docs/trl_config.md's table equal to the tables.
 * Not the trainer: nothing here loads a model or a dataset. */
#include <float.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "core/fileio.h"
#include "train/train_config.h"
#include "harness.h"


/* ---------------------------------------------------------------- the ranges, restated */

typedef struct IntRange {
    const char *name;
    long long min, max;
    bool nullable; /* null (TRL's None) sets the default */
} IntRange;

static const IntRange INT_KEYS[] = {
    {"warmup_steps", 0, 1000000000, false},
    {"num_generations", 2, 65536, false},
    {"num_generations_eval", 0, 65536, true},
    {"max_completion_length", 1, 1048576, false},
    {"max_prompt_length", 0, 1048576, true},
    {"top_k", 0, 16777216, true},
    {"num_iterations", 1, 1024, false},
    {"per_device_train_batch_size", 1, 65536, false},
    {"gradient_accumulation_steps", 1, 65536, false},
    {"generation_batch_size", 0, 1048576, true},
    {"steps_per_generation", 0, 65536, true},
    {"max_steps", -1, 1000000000, false},
    {"logging_steps", 1, 1000000000, false},
    {"save_steps", 0, 1000000000, false},
    {"save_total_limit", 0, 1000000000, true},
    {"eval_steps", 0, 1000000000, true},
    {"num_eval_prompts", 0, 1048576, false},
    {"log_completions_count", 0, 1048576, false},
    {"max_rounds_without_reward", 0, 1000000000, false},
    {"ref_model_sync_steps", 1, 1000000000, false},
    {"max_num_gen_batches", 0, 1000000, false},
    {"max_tool_calling_iterations", -1, 1000000, true},
    {"ddp_timeout", 1, 604800, false},
    {"ddp_bucket_cap_mb", 1, 65536, true},
    {"zero_stage", 0, 3, false},
    {"nproc_per_node", 0, 1024, false},
    {"tensor_parallel_size", 1, 1024, false},
    {"vllm_tensor_parallel_size", 1, 1024, false},
    {"lora_r", 1, 4096, false},
    {"seed", 0, INT64_MAX, false},
    {"vllm_server_port", 1, 65535, false},
    {"vllm_group_port", 1, 65535, false},
    {"max_staleness", 1, 1, false},
    {"server_data_parallel_size", 1, 1024, false},
};

typedef struct DoubleRange {
    const char *name;
    double min, max;
    bool min_open, max_open;
    int nullable; /* 1: null = unset (TRL's None), 2: null = the default */
} DoubleRange;

static const DoubleRange DOUBLE_KEYS[] = {
    {"learning_rate", 0, 100, false, false, false},
    {"warmup_ratio", 0, 1, false, false, false},
    {"weight_decay", 0, 100, false, false, false},
    {"offload_optimizer_ratio", 0, 1, false, false, false},
    {"adam_beta1", 0, 1, false, true, false},
    {"adam_beta2", 0, 1, false, true, false},
    {"adam_epsilon", 1e-30, 1, false, false, false},
    {"max_grad_norm", 0, 1e9, false, false, false},
    {"temperature", 1e-3, 100, false, false, false},
    {"top_p", 0, 1, true, false, false},
    {"tool_timeout", 0, 86400, true, false, false},
    {"rollout_func_timeout", 0, 604800, false, false, false},
    {"min_p", 0, 1, false, false, 2},
    {"repetition_penalty", 1e-3, 100, false, false, false},
    {"beta", 0, 1000, false, false, false},
    {"ref_model_mixup_alpha", 0, 1, false, false, false},
    {"epsilon", 0, 1000, false, false, false},
    {"epsilon_high", 0, 1000, false, false, true},
    {"delta", 1, 1e9, true, false, true},
    {"sapo_temperature_neg", 0, 1e6, true, false, false},
    {"sapo_temperature_pos", 0, 1e6, true, false, false},
    {"vespo_k_pos", 0, 1e6, false, false, false},
    {"vespo_lambda_pos", 0, 1e6, false, false, false},
    {"vespo_k_neg", 0, 1e6, false, false, false},
    {"vespo_lambda_neg", 0, 1e6, false, false, false},
    {"top_entropy_quantile", 0, 1, false, false, false},
    {"off_policy_mask_threshold", -1e9, 1e9, false, false, true},
    {"entropy_coef", -1e6, 1e6, false, false, false},
    {"entropy_coef_min", -1e6, 1e6, false, false, false},
    {"entropy_coef_max", -1e6, 1e6, false, false, false},
    {"entropy_coef_delta", 0, 1e6, false, false, false},
    {"entropy_target", 0, 1e6, false, false, false},
    {"vllm_importance_sampling_clip_min", 0, 1e9, false, false, true},
    {"vllm_importance_sampling_clip_max", 0, 1e9, true, false, true},
    {"vllm_importance_sampling_cap", 0, 1e9, true, false, true},
    {"gpu_memory_utilization", 0, 1, false, false, false},
    {"vllm_gpu_memory_utilization", 0, 1, false, false, false},
    {"num_train_epochs", 0, 1e6, true, false, false},
    {"lora_alpha", 0, 1e6, true, false, false},
    {"lora_dropout", 0, 1, false, true, false},
    {"vllm_server_timeout", 0, 86400, true, false, false},
};

#define N_INT_KEYS (sizeof INT_KEYS / sizeof INT_KEYS[0])
#define N_DOUBLE_KEYS (sizeof DOUBLE_KEYS / sizeof DOUBLE_KEYS[0])

/* ---------------------------------------------------------------- helpers */

/* One setting through one of the three ways in. */
enum { VIA_FLAG, VIA_YAML, VIA_JSON, N_VIA };
static const char *VIA_NAME[N_VIA] = {"flag", "yaml", "json"};

static int apply(TrainConfig *c, int via, const char *key, const char *text, char *err) {
    char doc[512];
    switch (via) {
    case VIA_FLAG: return train_config_set(c, key, text, "command line", err);
    case VIA_YAML:
        snprintf(doc, sizeof doc, "# a comment\n%s: %s\n", key, text);
        return train_config_load_text(c, doc, strlen(doc), TRAIN_CONFIG_YAML, "t.yaml", err);
    default:
        snprintf(doc, sizeof doc, "{\"%s\": %s}", key, text);
        return train_config_load_text(c, doc, strlen(doc), TRAIN_CONFIG_JSON, "t.json", err);
    }
}

/* The setting as the JSON dump has it (a new reference). */
static json_t *value_of(const TrainConfig *c, const char *key) {
    json_t *all = train_config_to_json(c);
    json_t *v = json_incref(json_object_get(all, key));
    json_decref(all);
    return v;
}

/* The shortest text that reads back as d (as the loader prints values). */
static void shortest(char *out, size_t n, double d) {
    for (int precision = 6; precision <= 17; precision++) {
        snprintf(out, n, "%.*g", precision, d);
        if (strtod(out, NULL) == d) break;
    }
}

/* A config that finalizes: defaults plus the three required settings. */
static void base_config(TrainConfig *c) {
    char err[ERR_LEN];
    train_config_defaults(c);
    if (train_config_set(c, "model", "m", "test", err) != 0 || train_config_set(c, "dataset", "d.jsonl", "test", err) ||
        train_config_set(c, "reward_funcs", "[{\"type\": \"length\"}]", "test", err) != 0) {
        fprintf(stderr, "base config: %s\n", err);
        exit(1);
    }
}

/* key's default as the dump shows it (null where it is unset). */
static json_t *default_of(const char *key) {
    TrainConfig d;
    train_config_defaults(&d);
    json_t *v = value_of(&d, key);
    train_config_free(&d);
    return v;
}

/* Expects text for key to be accepted and stored as want (a JSON value). */
static void expect_accept(int via, const char *key, const char *text, json_t *want) {
    TrainConfig c;
    train_config_defaults(&c);
    char err[ERR_LEN] = "";
    int rc = apply(&c, via, key, text, err);
    CHECK(rc == 0, "%s %s=%s rejected: %s", VIA_NAME[via], key, text, err);
    json_t *got = value_of(&c, key);
    bool same = json_equal(got, want) ||
                (json_is_number(got) && json_is_number(want) && json_number_value(got) == json_number_value(want));
    char *g = json_dumps(got, JSON_ENCODE_ANY), *w = json_dumps(want, JSON_ENCODE_ANY);
    CHECK(rc != 0 || same, "%s %s=%s stored %s, want %s", VIA_NAME[via], key, text, g, w);
    free(g), free(w);
    json_decref(got);
    json_decref(want);
    train_config_free(&c);
}

/* Expects text for key to be rejected with one line naming the key, every
 * needle in it, and the setting left as it was. */
static void expect_reject(int via, const char *key, const char *text, const char *needle1, const char *needle2) {
    TrainConfig c;
    train_config_defaults(&c);
    json_t *before = value_of(&c, key);
    char err[ERR_LEN] = "";
    int rc = apply(&c, via, key, text, err);
    CHECK(rc != 0, "%s %s=%s accepted", VIA_NAME[via], key, text);
    if (rc != 0) {
        CHECK(strstr(err, key) && !strchr(err, '\n'), "%s %s=%s: error does not name the key: %s", VIA_NAME[via], key,
              text, err);
        CHECK(!needle1 || strstr(err, needle1), "%s %s=%s: error lacks '%s': %s", VIA_NAME[via], key, text, needle1,
              err);
        CHECK(!needle2 || strstr(err, needle2), "%s %s=%s: error lacks '%s': %s", VIA_NAME[via], key, text, needle2,
              err);
    }
    json_t *after = value_of(&c, key);
    CHECK(json_equal(before, after), "%s %s=%s: a rejected value changed the setting", VIA_NAME[via], key, text);
    json_decref(before);
    json_decref(after);
    train_config_free(&c);
}

/* ---------------------------------------------------------------- bounds */

/* Every numeric key of the dump is in one of the tables (a new key needs its range tested). */
static void test_tables_cover_every_key(void) {
    TrainConfig c;
    train_config_defaults(&c);
    json_t *all = train_config_to_json(&c);
    const char *key;
    json_t *v;
    int numeric = 0;
    json_object_foreach(all, key, v) {
        bool listed = false;
        for (size_t i = 0; i < N_INT_KEYS; i++) listed |= strcmp(INT_KEYS[i].name, key) == 0;
        for (size_t i = 0; i < N_DOUBLE_KEYS; i++) listed |= strcmp(DOUBLE_KEYS[i].name, key) == 0;
        if (json_is_number(v)) {
            numeric++;
            CHECK(listed, "numeric setting %s has no range in this test's tables", key);
        }
    }
    CHECK(numeric == (int)(N_INT_KEYS + N_DOUBLE_KEYS) - 5 /* null by default: delta, epsilon_high, clip_min, cap,
                                                              off_policy_mask_threshold */,
          "%d numeric settings in the dump, tables list %zu", numeric, N_INT_KEYS + N_DOUBLE_KEYS);
    json_decref(all);
    train_config_free(&c);
    printf("tables: %d numeric settings with a default, all listed\n", numeric);
}

static void test_int_bounds(void) {
    char text[64], shown[80];
    int before = g_checks;
    for (size_t i = 0; i < N_INT_KEYS; i++) {
        const IntRange *r = &INT_KEYS[i];
        for (int via = 0; via < N_VIA; via++) {
            snprintf(text, sizeof text, "%lld", r->min);
            expect_accept(via, r->name, text, json_integer(r->min));
            snprintf(text, sizeof text, "%lld", r->max);
            expect_accept(via, r->name, text, json_integer(r->max));
            snprintf(text, sizeof text, "%lld", r->min - 1);
            expect_reject(via, r->name, text, text, "out of range");
            /* max + 1 of seed is 2^63: JSON cannot hold it (the YAML and flag text can) */
            if (r->max == INT64_MAX) snprintf(text, sizeof text, "9223372036854775808");
            else snprintf(text, sizeof text, "%lld", r->max + 1);
            if (via == VIA_JSON && r->max == INT64_MAX) {
                snprintf(shown, sizeof shown, "\"%s\"", text); /* the number as a string still gets the range check */
                expect_reject(via, r->name, shown, text, "out of range");
            } else {
                expect_reject(via, r->name, text, text, "out of range");
            }
            snprintf(text, sizeof text, "%lld .. %lld", r->min, r->max);
            expect_reject(via, r->name, "2.5", "integer", text);
            if (r->nullable) expect_accept(via, r->name, "null", default_of(r->name));
            else expect_reject(via, r->name, "null", "integer", NULL);
        }
    }
    printf("int bounds: %zu keys x {min, max, min-1, max+1, 2.5, null} x flag/yaml/json: %d checks\n", N_INT_KEYS,
           g_checks - before);
}

static void test_double_bounds(void) {
    char text[64];
    int before = g_checks;
    for (size_t i = 0; i < N_DOUBLE_KEYS; i++) {
        const DoubleRange *r = &DOUBLE_KEYS[i];
        /* at each end, and the next double outward and inward */
        double ends[2] = {r->min, r->max}, out[2] = {nextafter(r->min, -INFINITY), nextafter(r->max, INFINITY)};
        double in[2] = {nextafter(r->min, INFINITY), nextafter(r->max, -INFINITY)};
        bool open[2] = {r->min_open, r->max_open};
        for (int via = 0; via < N_VIA; via++) {
            for (int e = 0; e < 2; e++) {
                shortest(text, sizeof text, ends[e]);
                if (open[e]) expect_reject(via, r->name, text, text, "out of range");
                else expect_accept(via, r->name, text, json_real(ends[e]));
                shortest(text, sizeof text, in[e]);
                expect_accept(via, r->name, text, json_real(in[e]));
                shortest(text, sizeof text, out[e]);
                expect_reject(via, r->name, text, text, "out of range");
            }
            if (r->nullable) expect_accept(via, r->name, "null", r->nullable == 2 ? default_of(r->name) : json_null());
            else expect_reject(via, r->name, "null", "must be a number", NULL);
        }
    }
    printf("double bounds: %zu keys x {min, max, next inward, next outward, null} x flag/yaml/json: %d checks\n",
           N_DOUBLE_KEYS, g_checks - before);
}

/* Text no int or double of the key can hold, from a flag, YAML, and JSON (as
 * a string where JSON has no such number). */
static void test_overflow_text(void) {
    int before = g_checks;
    static const char *int_texts[] = {"2147483647",  "2147483648", "-2147483649", "4294967296",
                                      "9223372036854775807", "-9223372036854775808", "99999999999999999999",
                                      "-99999999999999999999"};
    static const char *int_keys[] = {"max_completion_length", "max_steps", "per_device_train_batch_size",
                                     "num_generations", "save_steps", "top_k"};
    for (size_t k = 0; k < sizeof int_keys / sizeof *int_keys; k++)
        for (size_t t = 0; t < sizeof int_texts / sizeof *int_texts; t++)
            for (int via = 0; via < N_VIA; via++) {
                char quoted[80];
                snprintf(quoted, sizeof quoted, "\"%s\"", int_texts[t]);
                bool json_holds = strlen(int_texts[t]) < 20;
                expect_reject(via, int_keys[k], via == VIA_JSON && !json_holds ? quoted : int_texts[t], int_texts[t],
                              "out of range");
            }
    /* the tester's case, word for word */
    char err[ERR_LEN];
    TrainConfig c;
    train_config_defaults(&c);
    CHECK(train_config_set(&c, "max_completion_length", "2147483647", "command line", err) != 0 &&
              strcmp(err, "command line: max_completion_length: 2147483647 is out of range (1 .. 1048576)") == 0,
          "max_completion_length 2147483647: %s", err);
    CHECK(train_config_set(&c, "num_train_epochs", "1e18", "command line", err) != 0 &&
              strstr(err, "num_train_epochs") && strstr(err, "out of range") && strstr(err, "1000000"),
          "num_train_epochs 1e18: %s", err);
    train_config_free(&c);

    /* not integers: reals, hex, words, booleans */
    static const char *not_int[] = {"2.5", "1e3", "0x10", "abc", "true", "nan", "inf", "1 000"};
    for (size_t t = 0; t < sizeof not_int / sizeof *not_int; t++)
        for (int via = VIA_FLAG; via <= VIA_YAML; via++) expect_reject(via, "max_steps", not_int[t], NULL, NULL);
    expect_reject(VIA_JSON, "max_steps", "2.5", "integer", NULL);
    expect_reject(VIA_JSON, "max_steps", "100.0", "integer", "100.0");
    expect_reject(VIA_JSON, "max_steps", "\"abc\"", "integer", "'abc'");
    expect_reject(VIA_JSON, "max_steps", "[1]", "integer", "a list");
    expect_reject(VIA_JSON, "max_steps", "true", "integer", NULL);

    /* doubles: non-finite and beyond double */
    static const char *bad_double[] = {"nan", "-nan", "inf", "-inf", "infinity", "1e400", "-1e400", ".inf", "-.inf",
                                       ".nan", ".NaN"};
    static const char *double_keys[] = {"learning_rate", "num_train_epochs", "temperature", "top_p",
                                        "adam_beta2", "delta", "max_grad_norm"};
    for (size_t k = 0; k < sizeof double_keys / sizeof *double_keys; k++)
        for (size_t t = 0; t < sizeof bad_double / sizeof *bad_double; t++)
            for (int via = 0; via < N_VIA; via++) {
                char quoted[80];
                snprintf(quoted, sizeof quoted, "\"%s\"", bad_double[t]);
                bool nan = strstr(bad_double[t], "nan") || strstr(bad_double[t], "NaN");
                expect_reject(via, double_keys[k], via == VIA_JSON ? quoted : bad_double[t], bad_double[t],
                              nan ? "not a number" : "out of range");
            }
    /* JSON's own number syntax: 1e400 does not parse, and says where */
    train_config_defaults(&c);
    const char *j = "{\n\"learning_rate\": 1e400}";
    CHECK(train_config_load_text(&c, j, strlen(j), TRAIN_CONFIG_JSON, "t.json", err) != 0 && strstr(err, "t.json line 2"),
          "JSON 1e400: %s", err);
    train_config_free(&c);
    printf("overflow and non-number text: %d checks\n", g_checks - before);
}

/* ---------------------------------------------------------------- products and steps */

/* Sets flags "k v k v ..." on a base config and finalizes; returns finalize's rc. */
static int finalize_with(const char *const *kv, char *err) {
    TrainConfig c;
    base_config(&c);
    int rc = COLT_OK;
    for (int i = 0; kv[i] && rc == 0; i += 2) rc = train_config_set(&c, kv[i], kv[i + 1], "test", err);
    if (rc == 0) rc = train_config_finalize(&c, err);
    train_config_free(&c);
    return rc;
}

static void test_products(void) {
    char err[ERR_LEN];
    int before = g_checks;
    /* defaults finalize: batch 8, G 8, steps_per_generation 1 */
    const char *none[] = {NULL};
    CHECK(finalize_with(none, err) == 0, "defaults: %s", err);
    /* 65536 x (1048576 + 1048576) tokens overflows int: refused */
    const char *big_micro[] = {"per_device_train_batch_size", "65536", "num_generations", "2", "max_prompt_length",
                               "1048576", "max_completion_length", "1048576", NULL};
    CHECK(finalize_with(big_micro, err) != 0 && strstr(err, "per micro-batch") && strstr(err, "137438953472"),
          "batch x length: %s", err);
    /* just at the token limit: 256 x (2^19 + 2^19) = 2^28 */
    const char *at_limit[] = {"per_device_train_batch_size", "256", "num_generations", "2", "max_prompt_length",
                              "524288", "max_completion_length", "524288", NULL};
    CHECK(finalize_with(at_limit, err) == 0, "2^28 tokens per micro-batch and round: %s", err);
    const char *over_limit[] = {"per_device_train_batch_size", "256", "num_generations", "2", "max_prompt_length",
                                "524288", "max_completion_length", "524289", NULL};
    CHECK(finalize_with(over_limit, err) != 0 && strstr(err, "268435712"), "2^28 + 256 tokens: %s", err);
    /* the round: generation_batch_size x length */
    const char *big_round[] = {"per_device_train_batch_size", "2", "num_generations", "2", "steps_per_generation",
                               "65536", "max_completion_length", "4096", NULL};
    CHECK(finalize_with(big_round, err) != 0 && strstr(err, "per generation round"), "round tokens: %s", err);
    /* batch x steps_per_generation beyond 2^20 completions: 64-bit product, range error */
    const char *big_gen[] = {"per_device_train_batch_size", "65536", "steps_per_generation", "65536",
                             "max_prompt_length", "1", "max_completion_length", "1", NULL};
    CHECK(finalize_with(big_gen, err) != 0 && strstr(err, "generation_batch_size") && strstr(err, "4294967296") &&
              strstr(err, "out of range"),
          "batch x steps_per_generation: %s", err);
    /* generation_batch_size / batch beyond 65536 steps */
    const char *many_steps[] = {"per_device_train_batch_size", "1", "generation_batch_size", "1048576",
                                "max_prompt_length", "16", "max_completion_length", "16", NULL};
    CHECK(finalize_with(many_steps, err) != 0 && strstr(err, "steps_per_generation") && strstr(err, "1048576"),
          "generation_batch_size / batch: %s", err);
    /* eval completions */
    const char *big_eval[] = {"num_eval_prompts", "1048576", NULL};
    CHECK(finalize_with(big_eval, err) != 0 && strstr(err, "num_eval_prompts") && strstr(err, "8388608"),
          "eval completions: %s", err);
    const char *eval_ok[] = {"num_eval_prompts", "131072", NULL};
    CHECK(finalize_with(eval_ok, err) == 0, "131072 x 8 eval completions: %s", err);
    /* max_steps 0 is in the int range but means nothing */
    const char *zero_steps[] = {"max_steps", "0", NULL};
    CHECK(finalize_with(zero_steps, err) != 0 && strstr(err, "max_steps"), "max_steps 0: %s", err);
    /* reward weights are bounded too */
    const char *weights[] = {"reward_weights", "[1e300]", NULL};
    CHECK(finalize_with(weights, err) != 0 && strstr(err, "reward_weights[0]"), "reward weight 1e300: %s", err);

    /* values put straight into the struct meet the same ranges at finalize */
    TrainConfig c;
    base_config(&c);
    c.max_completion_length = INT_MAX;
    CHECK(train_config_finalize(&c, err) != 0 && strstr(err, "max_completion_length: 2147483647 is out of range"),
          "direct INT_MAX: %s", err);
    train_config_free(&c);
    base_config(&c);
    c.num_train_epochs = INFINITY;
    CHECK(train_config_finalize(&c, err) != 0 && strstr(err, "num_train_epochs: inf is out of range"), "direct inf: %s",
          err);
    train_config_free(&c);
    base_config(&c);
    c.temperature = NAN;
    CHECK(train_config_finalize(&c, err) != 0 && strstr(err, "temperature: nan is not a number"), "direct nan: %s",
          err);
    train_config_free(&c);
    printf("products: %d checks\n", g_checks - before);
}

/* total steps for settings kv over n prompts; -1 on error (err set). */
static long long steps_for(const char *const *kv, size_t n_prompts, char *err) {
    TrainConfig c;
    base_config(&c);
    int rc = COLT_OK;
    for (int i = 0; kv[i] && rc == 0; i += 2) rc = train_config_set(&c, kv[i], kv[i + 1], "test", err);
    if (rc == 0) rc = train_config_finalize(&c, err);
    int64_t steps = -7;
    if (rc == 0) rc = train_config_total_steps(&steps, &c, n_prompts, err);
    train_config_free(&c);
    if (rc == 0) CHECK(steps >= 1 && steps <= TRAIN_CONFIG_MAX_STEPS, "total steps %lld out of range", (long long)steps);
    return rc == 0 ? (long long)steps : -1;
}

static void test_total_steps(void) {
    char err[ERR_LEN];
    int before = g_checks;
    /* demo-like: batch 32, G 8 -> 4 prompts a round; 128 prompts -> 32 rounds an epoch */
    const char *demo[] = {"per_device_train_batch_size", "32", "num_train_epochs", "3", NULL};
    long long s = steps_for(demo, 128, err);
    CHECK(s == 96, "3 epochs x 32 rounds: %lld steps (%s)", s, err);
    const char *half[] = {"per_device_train_batch_size", "32", "num_train_epochs", "0.5", NULL};
    CHECK((s = steps_for(half, 128, err)) == 16, "0.5 epochs: %lld", s);
    const char *tiny[] = {"per_device_train_batch_size", "32", "num_train_epochs", "1e-300", NULL};
    CHECK((s = steps_for(tiny, 128, err)) == 1, "1e-300 epochs: %lld (one round at least)", s);
    /* 4 micro-batches a step, 2 per round, reused twice: rounds x 2 x 2 / 4 */
    const char *acc[] = {"per_device_train_batch_size", "8", "gradient_accumulation_steps", "4",
                         "steps_per_generation", "2", "num_iterations", "2", "num_train_epochs", "1", NULL};
    CHECK((s = steps_for(acc, 100, err)) == 50, "accumulation: %lld steps (want 50 rounds x 4 / 4)", s);
    const char *acc_odd[] = {"per_device_train_batch_size", "8", "gradient_accumulation_steps", "3",
                             "num_train_epochs", "1", NULL};
    /* steps_per_generation = 3, G 8: 24 / 8 = 3 prompts a round; 10 rounds x 3 / 3 */
    CHECK((s = steps_for(acc_odd, 30, err)) == 10, "accumulation 3: %lld", s);
    const char *max_steps[] = {"max_steps", "1000000000", NULL};
    CHECK((s = steps_for(max_steps, 1, err)) == 1000000000, "max_steps wins: %lld", s);
    /* at the limit: one prompt a round (G 8, batch 8), 1 epoch over 10^9 prompts = 10^9 steps */
    const char *one[] = {"num_train_epochs", "1", NULL};
    CHECK((s = steps_for(one, 1000000000, err)) == 1000000000, "10^9 steps: %lld (%s)", s, err);
    CHECK(steps_for(one, 1000000001, err) == -1 && strstr(err, "num_train_epochs") && strstr(err, "max_steps"),
          "10^9 + 1 steps: %s", err);
    /* the tester's 1e18 is refused when set; the largest epochs over huge datasets fail cleanly */
    const char *most[] = {"num_train_epochs", "1000000", NULL};
    CHECK(steps_for(most, 1000000, err) == -1 && strstr(err, "more than"), "1e6 epochs x 1e6 prompts: %s", err);
    CHECK(steps_for(most, SIZE_MAX, err) == -1 && strstr(err, "more than"), "1e6 epochs x SIZE_MAX prompts: %s", err);
    const char *most_acc[] = {"num_train_epochs", "1000000", "steps_per_generation", "65536", "num_iterations", "1024",
                              "per_device_train_batch_size", "8", "max_prompt_length", "8", "max_completion_length",
                              "8", NULL};
    CHECK(steps_for(most_acc, SIZE_MAX, err) == -1 && strstr(err, "more than"), "largest product: %s", err);
    /* 10^6 x 2^32 rounds is below 2^53, but x 2^26 micro-batches a round is past int64 */
    CHECK(steps_for(most_acc, (size_t)1 << 48, err) == -1 && strstr(err, "more than"), "past int64: %s", err);
    CHECK(steps_for(one, 0, err) == -1 && strstr(err, "fewer than"), "no prompts: %s", err);
    printf("total steps: %d checks\n", g_checks - before);
}

/* ---------------------------------------------------------------- files */

static int load(TrainConfig *c, const char *text, TrainConfigFormat f, const char *name, char *err) {
    return train_config_load_text(c, text, strlen(text), f, name, err);
}

static void expect_load_error(const char *text, TrainConfigFormat f, const char *name, const char *needle1,
                              const char *needle2) {
    TrainConfig c;
    train_config_defaults(&c);
    char err[ERR_LEN] = "";
    int rc = load(&c, text, f, name, err);
    CHECK(rc != 0, "%s: accepted: %s", name, text);
    CHECK(rc == 0 || (strstr(err, name) == err && !strchr(err, '\n')), "%s: error does not start with the file name: %s",
          name, err);
    CHECK(rc == 0 || !needle1 || strstr(err, needle1), "%s: error lacks '%s': %s", name, needle1, err);
    CHECK(rc == 0 || !needle2 || strstr(err, needle2), "%s: error lacks '%s': %s", name, needle2, err);
    train_config_free(&c);
}

static void test_duplicates_and_empty(void) {
    int before = g_checks;
    expect_load_error("max_steps: 5\nlogging_steps: 1\nmax_steps: 6\n", TRAIN_CONFIG_YAML, "dup.yaml",
                      "line 3: duplicate key 'max_steps'", "first on line 1");
    expect_load_error("{\"max_steps\": 5,\n \"logging_steps\": 1,\n \"max_steps\": 6}", TRAIN_CONFIG_JSON, "dup.json",
                      "line 3: duplicate key 'max_steps'", NULL);
    /* the two names of one setting are two keys: the later wins, as flags do */
    TrainConfig c;
    char err[ERR_LEN];
    train_config_defaults(&c);
    CHECK(load(&c, "gpu_memory_utilization: 0.5\nvllm_gpu_memory_utilization: 0.25\n", TRAIN_CONFIG_YAML, "alias.yaml",
               err) == 0 && c.gpu_memory_utilization == 0.25,
          "alias keys: %s", err);
    train_config_free(&c);
    /* inside reward_funcs too: a spec's key twice is as ambiguous */
    expect_load_error("reward_funcs:\n  - type: length\n    type: regex\n", TRAIN_CONFIG_YAML, "nested.yaml",
                      "line 3: duplicate key 'type'", "first on line 2");
    expect_load_error("reward_funcs: [{type: length, type: regex}]\n", TRAIN_CONFIG_YAML, "flow.yaml",
                      "duplicate key 'type'", NULL);
    expect_load_error("{\"reward_funcs\": [{\"type\": \"length\",\n \"type\": \"regex\"}]}", TRAIN_CONFIG_JSON,
                      "nested.json", "line 2: duplicate key 'type'", NULL);
    /* the same key in two different specs is fine */
    train_config_defaults(&c);
    CHECK(load(&c, "reward_funcs:\n  - {type: length}\n  - {type: regex, pattern: x}\n", TRAIN_CONFIG_YAML, "two.yaml",
               err) == 0 && json_array_size(c.reward_funcs) == 2,
          "two specs: %s", err);
    train_config_free(&c);

    /* empty and non-mapping files: one line naming the file */
    expect_load_error("", TRAIN_CONFIG_YAML, "empty.yaml", "no settings", "empty");
    expect_load_error("# only a comment\n\n   # another\n", TRAIN_CONFIG_YAML, "comments.yaml", "no settings",
                      "comments");
    expect_load_error("---\n", TRAIN_CONFIG_YAML, "dashes.yaml", "no settings", NULL);
    expect_load_error("~\n", TRAIN_CONFIG_YAML, "null.yaml", "no settings", NULL);
    expect_load_error("- model: m\n- dataset: d\n", TRAIN_CONFIG_YAML, "list.yaml", "found a list", NULL);
    expect_load_error("just words\n", TRAIN_CONFIG_YAML, "scalar.yaml", "found a string", NULL);
    expect_load_error("model: m\n---\nmodel: n\n", TRAIN_CONFIG_YAML, "two.yaml", "more than one YAML document", NULL);
    expect_load_error("model: [\n", TRAIN_CONFIG_YAML, "broken.yaml", "line", NULL);
    expect_load_error("a: &x 1\nb: *x\n", TRAIN_CONFIG_YAML, "alias.yaml", "aliases", NULL);
    expect_load_error("", TRAIN_CONFIG_JSON, "empty.json", "no settings", "empty");
    expect_load_error(" \n\t\n", TRAIN_CONFIG_JSON, "blank.json", "no settings", NULL);
    expect_load_error("[1, 2]", TRAIN_CONFIG_JSON, "list.json", "found a list", NULL);
    expect_load_error("{\"max_steps\": ", TRAIN_CONFIG_JSON, "cut.json", "invalid JSON", NULL);
    expect_load_error("max_stepz: 3\n", TRAIN_CONFIG_YAML, "typo.yaml", "did you mean 'max_steps'", NULL);
    /* range errors from a file name the file, the key, the value and the range */
    expect_load_error("model: m\nmax_completion_length: 2147483647\n", TRAIN_CONFIG_YAML, "big.yaml",
                      "big.yaml: max_completion_length: 2147483647 is out of range (1 .. 1048576)", NULL);
    expect_load_error("{\"top_p\": 0}", TRAIN_CONFIG_JSON, "p.json", "p.json: top_p: 0 is out of range (0 < top_p <= 1)",
                      NULL);

    /* an empty mapping is an explicit "nothing to change" */
    train_config_defaults(&c);
    CHECK(load(&c, "{}", TRAIN_CONFIG_JSON, "e.json", err) == 0, "{}: %s", err);
    CHECK(load(&c, "{}\n", TRAIN_CONFIG_YAML, "e.yaml", err) == 0, "YAML {}: %s", err);
    train_config_free(&c);

    /* load_file: the same messages with the path, by extension */
    char dir[] = "/tmp/colt_test_train_config_XXXXXX";
    if (!mkdtemp(dir)) {
        CHECK(0, "mkdtemp failed");
        return;
    }
    const char *names[] = {"empty.yaml", "empty.json", "dup.yml"};
    const char *texts[] = {"# nothing\n", "", "seed: 1\nseed: 2\n"};
    const char *needles[] = {"no settings", "no settings", "duplicate key 'seed'"};
    for (int i = 0; i < 3; i++) {
        char path[256];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        FILE *fp = fopen(path, "w");
        fputs(texts[i], fp);
        fclose(fp);
        train_config_defaults(&c);
        int rc = train_config_load_file(&c, path, err);
        CHECK(rc != 0 && strstr(err, path) == err && strstr(err, needles[i]), "%s: %s", path, err);
        train_config_free(&c);
        unlink(path);
    }
    rmdir(dir);
    printf("duplicates, empty and malformed files: %d checks\n", g_checks - before);
}

static void test_demo_loads(void) {
    int before = g_checks;
    TrainConfig c;
    char err[ERR_LEN];
    train_config_defaults(&c);
    int rc = train_config_load_file(&c, "examples/demo.yaml", err);
    CHECK(rc == 0, "examples/demo.yaml: %s", err);
    rc = rc == 0 ? train_config_finalize(&c, err) : rc;
    CHECK(rc == 0, "examples/demo.yaml finalize: %s", err);
    CHECK(c.model && strcmp(c.model, "models/stories260K") == 0, "model %s", c.model ? c.model : "(null)");
    CHECK(json_array_size(c.reward_funcs) == 1 &&
              strcmp(json_string_value(json_object_get(json_array_get(c.reward_funcs, 0), "pattern")), "\\bpark\\b") == 0,
          "reward_funcs");
    CHECK(c.num_generations == 8 && c.per_device_train_batch_size == 32 && c.gradient_accumulation_steps == 1,
          "batching %d %d %d", c.num_generations, c.per_device_train_batch_size, c.gradient_accumulation_steps);
    CHECK(c.max_completion_length == 48 && c.max_steps == 60 && c.warmup_steps == 5 && c.logging_steps == 5 &&
              c.save_steps == 30 && c.save_total_limit == 2 && c.log_completions_count == 1 && c.seed == 42,
          "ints");
    CHECK(c.learning_rate == 5.0e-4 && c.beta == 0.1 && c.epsilon == 0.2 && c.epsilon_high == 0.2 &&
              c.temperature == 1.0 && c.max_grad_norm == 1.0,
          "doubles lr %g beta %g", c.learning_rate, c.beta);
    CHECK(c.generation_batch_size == 32 && c.steps_per_generation == 1, "derived %d %d", c.generation_batch_size,
          c.steps_per_generation);
    CHECK(strcmp(c.lr_scheduler_type, "constant_with_warmup") == 0 && strcmp(c.loss_type, "dapo") == 0, "strings");
    int64_t steps = 0;
    CHECK(train_config_total_steps(&steps, &c, 128, err) == 0 && steps == 60, "demo total steps %lld",
          (long long)steps);

    /* its JSON dump loads back as JSON to the same settings */
    json_t *dump = train_config_to_json(&c);
    json_object_del(dump, "vllm_gpu_memory_utilization"); /* the aliases, dumped beside their keys */
    json_object_del(dump, "vllm_tensor_parallel_size");
    char *text = json_dumps(dump, 0);
    TrainConfig d;
    train_config_defaults(&d);
    rc = load(&d, text, TRAIN_CONFIG_JSON, "dump.json", err);
    CHECK(rc == 0, "dump reload: %s", err);
    json_t *again = train_config_to_json(&d);
    json_object_del(again, "vllm_gpu_memory_utilization");
    json_object_del(again, "vllm_tensor_parallel_size");
    CHECK(json_equal(dump, again), "the dump does not round-trip");
    json_decref(again);
    json_decref(dump);
    free(text);
    train_config_free(&d);
    train_config_free(&c);
    printf("examples/demo.yaml: %d checks\n", g_checks - before);
}

/* ---------------------------------------------------------------- TRL keys */

#define TRL_KEY_LIST COLT_SOURCE_DIR "/tests/data/trl_config_keys.txt"
#define TRL_DOC COLT_SOURCE_DIR "/docs/trl_config.md"

/* The key names of tests/data/trl_config_keys.txt (from tests/make_trl_keys.py)
 * as a JSON list; its '#' header line (the trl version) in header. */
static json_t *read_trl_keys(char *header, size_t n) {
    FILE *fp = fopen(TRL_KEY_LIST, "r");
    CHECK(fp != NULL, "cannot open %s", TRL_KEY_LIST);
    json_t *keys = json_array();
    header[0] = '\0';
    char line[256];
    while (fp && fgets(line, sizeof line, fp)) {
        line[strcspn(line, "\r\n")] = '\0';
        if (line[0] == '#') snprintf(header, n, "%s", line);
        else if (line[0]) json_array_append_new(keys, json_string(line));
    }
    if (fp) fclose(fp);
    return keys;
}

static const char *CLASS_NAME[] = {"unknown", "honoured", "alias", "no-op", "no-op for some values", "translated"};

/* One key from a one-line YAML file "key: value". */
static int load_one(TrainConfig *c, const char *key, const char *value, char *err) {
    char doc[512];
    snprintf(doc, sizeof doc, "%s: %s\n", key, value);
    return train_config_load_text(c, doc, strlen(doc), TRAIN_CONFIG_YAML, "trl.yaml", err);
}

/* The notice a load left for key ("" when none). */
static const char *notice_of(const TrainConfig *c, const char *key) {
    const char *s = json_string_value(json_object_get(c->notices, key));
    return s ? s : "";
}

/* Every key of TRL's list is known: described in one of the classes, never
 * "unknown setting" from a file or a flag; each value a key accepts loads with
 * one notice naming it, and another value is refused as a known key. */
static void test_trl_keys_classified(void) {
    int before = g_checks;
    char header[256], text[1024], err[ERR_LEN];
    json_t *keys = read_trl_keys(header, sizeof header);
    CHECK(strncmp(header, "# trl ", 6) == 0, "%s: header '%s' does not name the trl version", TRL_KEY_LIST, header);
    CHECK(json_array_size(keys) >= 200, "%s: %zu keys, GRPOConfig + ModelConfig have over 200", TRL_KEY_LIST,
          json_array_size(keys));
    int counts[6] = {0}, values_tried = 0;
    size_t i;
    json_t *jk;
    json_array_foreach(keys, i, jk) {
        const char *key = json_string_value(jk);
        TrainKeyClass cls = train_config_describe_key(text, sizeof text, key);
        counts[cls]++;
        CHECK(cls != TRAIN_KEY_UNKNOWN, "TRL key '%s' is unknown to colt", key);
        /* null and a number, from a file and from a flag: an error may say the value is wrong, never that the key is unknown */
        const char *probes[] = {"null", "7"};
        for (int p = 0; p < 2; p++) {
            TrainConfig c;
            train_config_defaults(&c);
            err[0] = '\0';
            int rc = load_one(&c, key, probes[p], err);
            CHECK(rc == 0 || !strstr(err, "unknown setting"), "%s: %s: %s", key, probes[p], err);
            CHECK(rc == 0 || !strchr(err, '\n'), "%s: error has more than one line", key);
            err[0] = '\0';
            rc = train_config_set(&c, key, probes[p], "command line", err);
            CHECK(rc == 0 || !strstr(err, "unknown setting"), "--%s %s: %s", key, probes[p], err);
            train_config_free(&c);
        }
        if (cls != TRAIN_KEY_NOOP && cls != TRAIN_KEY_LIMITED) continue;
        /* the accepted values, as the description lists them ("accepted: a, b; ..."), load with a notice */
        char accepted[256] = "*";
        if (cls == TRAIN_KEY_LIMITED) {
            CHECK(strncmp(text, "accepted: ", 10) == 0, "%s: description '%s'", key, text);
            snprintf(accepted, sizeof accepted, "%.*s", (int)strcspn(text + 10, ";"), text + 10);
        }
        for (char *v = strtok(accepted, ","); v; v = strtok(NULL, ",")) {
            while (*v == ' ') v++;
            const char *value = strcmp(v, "*") != 0 ? v : train_config_key_is_bool(key) ? "true" : "any-value";
            TrainConfig c;
            train_config_defaults(&c);
            int rc = load_one(&c, key, value, err);
            CHECK(rc == 0, "%s: %s (an accepted value) refused: %s", key, value, err);
            char want[128];
            snprintf(want, sizeof want, "trl.yaml: %s: ", key);
            const char *notice = notice_of(&c, key);
            CHECK(rc != 0 || (strstr(notice, want) == notice && strstr(notice, " changes nothing in colt: ") &&
                              json_object_size(c.notices) == 1),
                  "%s: %s: notice '%s'", key, value, notice);
            values_tried++;
            train_config_free(&c);
        }
        if (cls == TRAIN_KEY_LIMITED) { /* a value no key accepts */
            TrainConfig c;
            train_config_defaults(&c);
            int rc = load_one(&c, key, "colt-test-value", err);
            CHECK(rc != 0 && strstr(err, "trl.yaml: ") == err && strstr(err, key) &&
                      strstr(err, "is a known TRL/transformers setting that colt does not support (yet)") &&
                      !c.notices,
                  "%s: colt-test-value: rc %d, %s", key, rc, err);
            train_config_free(&c);
        }
    }
    printf("TRL keys (%s): %zu keys: %d honoured, %d aliases, %d no-ops, %d no-op for some values, %d translated; %d "
           "accepted values load with a notice\n",
           header, json_array_size(keys), counts[TRAIN_KEY_HONOURED], counts[TRAIN_KEY_ALIAS], counts[TRAIN_KEY_NOOP],
           counts[TRAIN_KEY_LIMITED], counts[TRAIN_KEY_MAPPED], values_tried);
    json_decref(keys);
    printf("TRL keys classified: %d checks\n", g_checks - before);
}

/* Loads text (YAML) into a fresh config; the caller frees it. */
static int load_yaml(TrainConfig *c, const char *text, char *err) {
    train_config_defaults(c);
    err[0] = '\0';
    return train_config_load_text(c, text, strlen(text), TRAIN_CONFIG_YAML, "trl.yaml", err);
}

/* Expects text to be refused in one line holding every needle. */
static void expect_trl_refusal(const char *text, const char *needle1, const char *needle2) {
    TrainConfig c;
    char err[ERR_LEN];
    int rc = load_yaml(&c, text, err);
    CHECK(rc != 0 && !strchr(err, '\n') && strstr(err, needle1) && (!needle2 || strstr(err, needle2)),
          "'%.*s': rc %d, error '%s' should hold '%s' and '%s'", (int)strcspn(text, "\n"), text, rc, err, needle1,
          needle2 ? needle2 : "");
    printf("  %-34.*s -> %s\n", (int)strcspn(text, "\n"), text, err);
    train_config_free(&c);
}

static void test_trl_messages(void) {
    int before = g_checks;
    TrainConfig c;
    char err[ERR_LEN];

    /* a no-op: one notice line, the value and the reason */
    CHECK(load_yaml(&c, "push_to_hub: false\n", err) == 0, "push_to_hub: false: %s", err);
    CHECK(strcmp(notice_of(&c, "push_to_hub"), "trl.yaml: push_to_hub: false changes nothing in colt: colt saves to "
                                                "output_dir and uploads nothing: upload the folder yourself (hf upload "
                                                "REPO_ID OUTPUT_DIR)") == 0,
          "notice '%s'", notice_of(&c, "push_to_hub"));
    printf("  notice: %s\n", notice_of(&c, "push_to_hub"));
    train_config_free(&c);
    CHECK(load_yaml(&c, "report_to: []\nuse_vllm: true\ntf32: true\n", err) == 0, "%s", err);
    CHECK(json_object_size(c.notices) == 2 && strstr(notice_of(&c, "use_vllm"), "in-process engine") &&
              strstr(notice_of(&c, "tf32"), "tf32: true changes nothing"),
          "notices use_vllm '%s' tf32 '%s'", notice_of(&c, "use_vllm"), notice_of(&c, "tf32"));
    CHECK(c.use_vllm, "use_vllm kept (it is in the saved config)");
    /* given again as a flag: still one line, the flag's */
    CHECK(train_config_set(&c, "tf32", "true", "command line", err) == 0, "--tf32 true: %s", err);
    CHECK(json_object_size(c.notices) == 2 &&
              strstr(notice_of(&c, "tf32"), "command line: tf32: true changes nothing") == notice_of(&c, "tf32"),
          "a key given twice keeps one notice: %s", notice_of(&c, "tf32"));
    train_config_free(&c);

    /* report_to and logging_dir are honoured (TensorBoard event files): no notice; tensorboard as a word, a list
     * or a flag; none, [] and null report nowhere */
    const char *reports[][2] = {{"report_to: tensorboard\n", "1"}, {"report_to: [tensorboard]\n", "1"},
                                {"report_to: [none, tensorboard]\n", "1"}, {"report_to: none\n", "0"},
                                {"report_to: [none]\n", "0"}, {"report_to: []\n", "0"}, {"report_to: null\n", "0"},
                                {"logging_dir: runs/tb\n", "0"}};
    for (int i = 0; i < 8; i++) {
        int rc = load_yaml(&c, reports[i][0], err);
        CHECK(rc == 0 && json_object_size(c.notices) == 0 &&
                  train_config_reports_to(&c, "tensorboard") == (reports[i][1][0] == '1'),
              "'%.*s': rc %d (%s), %zu notices, tensorboard %d", (int)strcspn(reports[i][0], "\n"), reports[i][0], rc,
              err, json_object_size(c.notices), train_config_reports_to(&c, "tensorboard"));
        train_config_free(&c);
    }
    CHECK(load_yaml(&c, "logging_dir: runs/tb\n", err) == 0 && c.logging_dir && strcmp(c.logging_dir, "runs/tb") == 0,
          "logging_dir %s", c.logging_dir ? c.logging_dir : "(null)");
    CHECK(train_config_set(&c, "report_to", "tensorboard", "command line", err) == 0 &&
              train_config_reports_to(&c, "tensorboard"),
          "--report_to tensorboard: %s", err);
    CHECK(train_config_set(&c, "report_to", "[\"tensorboard\"]", "command line", err) == 0 &&
              train_config_reports_to(&c, "tensorboard"),
          "--report_to '[\"tensorboard\"]': %s", err);
    CHECK(train_config_set(&c, "report_to", "none", "command line", err) == 0 &&
              !train_config_reports_to(&c, "tensorboard"),
          "--report_to none: %s", err);
    CHECK(train_config_set(&c, "report_to", "wandb", "command line", err) != 0 &&
              strstr(err, "command line: report_to: wandb is not supported") && !train_config_reports_to(&c, "tensorboard"),
          "--report_to wandb: %s", err);
    printf("  report_to tensorboard, [tensorboard], [none, tensorboard] honoured; none, [none], [], null report "
           "nowhere; --report_to tensorboard / none / wandb as flags\n");
    train_config_free(&c);

    /* refusals: a known key, what colt does, what to do instead */
    expect_trl_refusal("push_to_hub: true\n", "trl.yaml: push_to_hub: true is a known TRL/transformers setting that "
                                              "colt does not support (yet) with this value (colt accepts false)",
                       "hf upload");
    expect_trl_refusal("use_dora: true\n", "use_dora: true is a known TRL/transformers setting", "DoRA is not supported");
    expect_trl_refusal("lora_modules_to_save: [lm_head]\n", "lora_modules_to_save: [\"lm_head\"] is a known",
                       "not supported");
    expect_trl_refusal("lora_target_modules: [q_proj, c_attn]\n", "lora_target_modules: 'c_attn' is not a layer colt adapts",
                       "all-linear");
    expect_trl_refusal("fp16: true\n", "fp16: true is a known", "use bf16");
    expect_trl_refusal("report_to: wandb\n", "trl.yaml: report_to: wandb is not supported: colt reports to tensorboard",
                       "metrics.jsonl");
    expect_trl_refusal("report_to: [wandb, tensorboard]\n", "report_to: [\"wandb\",\"tensorboard\"] is not supported",
                       "wandb, mlflow");
    expect_trl_refusal("report_to: all\n", "report_to: all is not supported", NULL);
    expect_trl_refusal("torch_dtype: float16\n", "torch_dtype: float16 is a known", "use bf16");
    expect_trl_refusal("optim: adafactor\n", "optim: adafactor is a known", "AdamW");
    expect_trl_refusal("load_in_4bit: true\n", "load_in_4bit: true is a known", "quantized");
    expect_trl_refusal("model: a\nmodel_name_or_path: b\n",
                       "model and model_name_or_path name the same setting with different values", NULL);
    CHECK(load_yaml(&c, "vllm_tensor_parallel_size: 2\n", err) == 0 && c.tensor_parallel_size == 2,
          "TRL's vllm_tensor_parallel_size sets tensor_parallel_size: %s", err);
    train_config_free(&c);
    CHECK(load_yaml(&c, "tensor_parallel_size: 0\n", err) != 0, "tensor_parallel_size 0 accepted");
    train_config_free(&c);

    /* aliases and precision names */
    CHECK(load_yaml(&c, "model_name_or_path: models/stories260K\nactivation_checkpointing: true\n", err) == 0, "%s", err);
    CHECK(c.model && strcmp(c.model, "models/stories260K") == 0 && c.gradient_checkpointing && !c.notices,
          "model_name_or_path sets model (%s), activation_checkpointing sets gradient_checkpointing, no notice",
          c.model ? c.model : "(null)");
    train_config_free(&c);
    CHECK(load_yaml(&c, "model_name_or_path: null\n", err) == 0 && !c.model, "model_name_or_path: null leaves model");
    train_config_free(&c);
    const char *dtypes[] = {"bfloat16", "bf16", "auto", "float32"};
    for (int d = 0; d < 4; d++) {
        char doc[64];
        snprintf(doc, sizeof doc, "torch_dtype: %s\n", dtypes[d]);
        CHECK(load_yaml(&c, doc, err) == 0 && strstr(notice_of(&c, "torch_dtype"), "precision follows device"),
              "torch_dtype %s: %s", dtypes[d], err);
        train_config_free(&c);
    }
    CHECK(train_config_set(&c, "model_name_or_path", "m2", "command line", err) == 0 && c.model &&
              strcmp(c.model, "m2") == 0,
          "--model_name_or_path sets model: %s", err);
    train_config_free(&c);

    /* unknown keys: a suggestion only for a likely typo */
    struct {
        const char *key, *want;
    } typos[] = {{"learnig_rate", "did you mean 'learning_rate'?"},
                 {"vllm_tensor_paralel_size", "did you mean 'vllm_tensor_parallel_size'?"},
                 {"push_to_hubb", "did you mean 'push_to_hub'?"},
                 {"seeed", "did you mean 'seed'?"},
                 {"frobnicate", "unknown setting 'frobnicate' (not a colt, TRL or transformers setting"},
                 {"use_flux_capacitor", "unknown setting 'use_flux_capacitor' (not a colt"},
                 {"zz", "unknown setting 'zz' (not a colt"}};
    for (size_t t = 0; t < sizeof typos / sizeof typos[0]; t++) {
        train_config_defaults(&c);
        int rc = load_one(&c, typos[t].key, "1", err);
        CHECK(rc != 0 && strstr(err, typos[t].want), "%s: %s", typos[t].key, err);
        printf("  %-34s -> %s\n", typos[t].key, err);
        train_config_free(&c);
    }

    /* true/false keys, for `--key` alone on the command line */
    const char *bools[] = {"gradient_checkpointing", "use_vllm", "bf16", "push_to_hub", "activation_checkpointing",
                           "dataloader_pin_memory"};
    const char *not_bools[] = {"model", "learning_rate", "deepspeed", "report_to", "logging_dir", "no_such_key"};
    for (int b = 0; b < 6; b++) {
        CHECK(train_config_key_is_bool(bools[b]), "%s takes true/false", bools[b]);
        CHECK(!train_config_key_is_bool(not_bools[b]), "%s does not take true/false", not_bools[b]);
    }
    /* HfArgumentParser's 1 and 0 for a flag */
    train_config_defaults(&c);
    CHECK(train_config_set(&c, "gradient_checkpointing", "1", "command line", err) == 0 && c.gradient_checkpointing,
          "--gradient_checkpointing 1: %s", err);
    CHECK(train_config_set(&c, "gradient_checkpointing", "0", "command line", err) == 0 && !c.gradient_checkpointing,
          "--gradient_checkpointing 0: %s", err);
    train_config_free(&c);
    printf("TRL messages: %d checks\n", g_checks - before);
}

/* The GRPOConfig of TRL's colocate write-up (Qwen2.5-0.5B-Instruct, vLLM in
 * the trainer's process), as a YAML file, with colt's dataset and reward and
 * the stand-in model: loads with a notice for each key that changes nothing,
 * finalizes, and every honoured value is the one given. */
static void test_trl_colocate_config(void) {
    int before = g_checks;
    const char *yaml = "# TRL's colocate example, as a colt config\n"
                       "model_name_or_path: models/stories260K   # stands in for Qwen/Qwen2.5-0.5B-Instruct\n"
                       "dataset: examples/data/demo_train.jsonl\n"
                       "reward_funcs: [{type: length, target: 20}]\n"
                       "output_dir: Qwen2.5-0.5B-GRPO\n"
                       "use_vllm: true\n"
                       "vllm_mode: colocate\n"
                       "vllm_tensor_parallel_size: 1\n"
                       "vllm_gpu_memory_utilization: 0.3\n"
                       "per_device_train_batch_size: 16\n"
                       "gradient_accumulation_steps: 2\n"
                       "num_generations: 8\n"
                       "max_prompt_length: 256\n"
                       "max_completion_length: 512\n"
                       "learning_rate: 1.0e-5\n"
                       "bf16: true\n"
                       "logging_steps: 1\n"
                       "report_to: none\n"
                       "push_to_hub: false\n"
                       "gradient_checkpointing: true\n"
                       "num_train_epochs: 1\n"
                       "save_steps: 100\n"
                       "beta: 0.04\n"
                       "loss_type: dr_grpo\n"
                       "temperature: 0.9\n"
                       "lr_scheduler_type: cosine\n"
                       "warmup_ratio: 0.1\n"
                       "torch_dtype: bfloat16\n"
                       "remove_unused_columns: false\n"
                       "overwrite_output_dir: true\n"
                       "dataloader_num_workers: 2\n";
    TrainConfig c;
    char err[ERR_LEN];
    train_config_defaults(&c);
    int rc = train_config_load_text(&c, yaml, strlen(yaml), TRAIN_CONFIG_YAML, "colocate.yaml", err);
    CHECK(rc == 0, "colocate.yaml: %s", err);
    rc = rc == 0 ? train_config_finalize(&c, err) : rc;
    CHECK(rc == 0, "colocate.yaml finalize: %s", err);
    CHECK(c.model && strcmp(c.model, "models/stories260K") == 0, "model %s", c.model ? c.model : "(null)");
    CHECK(strcmp(c.output_dir, "Qwen2.5-0.5B-GRPO") == 0, "output_dir %s", c.output_dir);
    CHECK(c.gpu_memory_utilization == 0.3 && c.gpu_memory_utilization_set, "KV pool cap %g (set %d)",
          c.gpu_memory_utilization, c.gpu_memory_utilization_set);
    CHECK(c.per_device_train_batch_size == 16 && c.gradient_accumulation_steps == 2 && c.num_generations == 8 &&
              c.generation_batch_size == 32 && c.steps_per_generation == 2,
          "batching %d %d %d -> %d %d", c.per_device_train_batch_size, c.gradient_accumulation_steps,
          c.num_generations, c.generation_batch_size, c.steps_per_generation);
    CHECK(c.max_prompt_length == 256 && c.max_completion_length == 512 && c.logging_steps == 1 && c.save_steps == 100,
          "lengths and steps");
    CHECK(c.learning_rate == 1e-5 && c.beta == 0.04 && c.temperature == 0.9 && c.warmup_ratio == 0.1 &&
              c.num_train_epochs == 1.0 && c.max_steps == -1,
          "doubles lr %g beta %g", c.learning_rate, c.beta);
    CHECK(strcmp(c.loss_type, "dr_grpo") == 0 && strcmp(c.lr_scheduler_type, "cosine") == 0 &&
              strcmp(c.vllm_mode, "colocate") == 0 && c.use_vllm && c.gradient_checkpointing,
          "strings and flags");
    const char *noticed[] = {"use_vllm", "push_to_hub", "torch_dtype", "remove_unused_columns",
                             "overwrite_output_dir", "dataloader_num_workers"};
    size_t n_noticed = sizeof noticed / sizeof noticed[0];
    for (size_t i = 0; i < n_noticed; i++)
        CHECK(strstr(notice_of(&c, noticed[i]), "colocate.yaml: ") == notice_of(&c, noticed[i]),
              "no notice for %s", noticed[i]);
    CHECK(json_object_size(c.notices) == n_noticed, "%zu notices, want %zu (none for honoured keys)",
          json_object_size(c.notices), n_noticed);
    const char *key;
    json_t *line;
    json_object_foreach(c.notices, key, line) printf("  %s\n", json_string_value(line));
    int64_t steps = 0;
    /* 128 prompts / 4 per round (32 completions / 8) = 32 rounds x 2 micro-batches / 2 per optimizer step */
    CHECK(train_config_total_steps(&steps, &c, 128, err) == 0 && steps == 32, "1 epoch of 128 prompts: %lld steps",
          (long long)steps);
    train_config_free(&c);
    printf("TRL colocate config: %d checks\n", g_checks - before);
}

/* Compares the block of docs/trl_config.md from the line starting `begin` to
 * `end_line` (both included) with generated; with COLT_UPDATE_DOCS=1 rewrites
 * it. Returns whether they are (now) the same. */
static bool doc_block_matches(const char *begin, const char *end_line, const char *generated, size_t len) {
    char *doc = NULL, ferr[ERR_LEN];
    size_t doc_len = 0;
    int rc = file_read_all(TRL_DOC, &doc, &doc_len, ferr);
    CHECK(rc == 0, "%s", ferr);
    const char *start = rc == 0 ? strstr(doc, begin) : NULL;
    const char *end = start ? strstr(start, end_line) : NULL;
    bool same = end && (size_t)(end + strlen(end_line) - start) == len && memcmp(start, generated, len) == 0;
    const char *update = getenv("COLT_UPDATE_DOCS");
    if (!same && update && strcmp(update, "1") == 0 && start && end) {
        FILE *fp = fopen(TRL_DOC, "w");
        fwrite(doc, 1, (size_t)(start - doc), fp);
        fwrite(generated, 1, len, fp);
        const char *rest = end + strlen(end_line);
        fwrite(rest, 1, strlen(rest), fp);
        fclose(fp);
        printf("  %s: %.30s... block rewritten\n", TRL_DOC, begin);
        same = true;
    }
    CHECK(same, "%s: the block '%s' differs from what train_config.c gives now; run COLT_UPDATE_DOCS=1 "
                "build/test_train_config", TRL_DOC, begin);
    free(doc);
    return same;
}

/* What a few settings of TRL users do in colt, found by loading them (on top
 * of a minimal config) and finalizing: the error, or the settings that changed
 * and the notices. None depends on the machine (no GPU-dependent device). */
static void write_doc_examples(FILE *mem) {
    static const char *const examples[] = {
        "use_peft: true",
        "push_to_hub: false",
        "push_to_hub: true",
        "fp16: true",
        "use_cpu: true",
        "device: cpu\nbf16: false",
        "device: cuda\nbf16: false",
        "device: cpu\ncast_lm_head_to_fp32: true",
        "save_strategy: \"no\"",
        "save_strategy: epoch",
        "min_p: null\neval_steps: null\nddp_bucket_cap_mb: null",
        "logging_first_step: true",
        "lr_scheduler_type: cosine_with_min_lr\nlr_scheduler_kwargs: {min_lr_rate: 0.1}",
        "lr_scheduler_type: cosine_with_min_lr",
        "generation_kwargs: {top_k: 50, max_tokens: 64, do_sample: true}",
        "generation_kwargs: {stop: [\"###\"]}",
        "shuffle_dataset: false",
        "num_generations_eval: 4",
        "gradient_checkpointing: true\nactivation_checkpointing: true",
        "generation_batch_size: 8\nsteps_per_generation: 1",
        "accelerator_config: {split_batches: false, dispatch_batches: null, even_batches: true}",
        "accelerator_config: {split_batches: true}",
        "reward_funcs: [think_format_reward]",
        "reward_funcs: [accuracy_reward]",
        "reward_funcs: [get_soft_overlong_punishment]",
        "reward_model_name_or_path: Skywork/Skywork-Reward-V2-Qwen3-0.6B",
        "datasets: [{path: json, data_files: prompts.jsonl}]",
        "datasets: [{path: trl-lib/DeepMath-103K}, {path: x.jsonl}]",
        "dataset_name: trl-lib/DeepMath-103K",
        "fsdp: full_shard",
        "vllm_mode: server",
    };
    static const char base[] = "model: m\ndataset: d.jsonl\noutput_dir: out\n", rewards[] = "reward_funcs: [{type: length}]\n";
    TrainConfig c;
    char err[ERR_LEN], doc[512];
    train_config_defaults(&c);
    snprintf(doc, sizeof doc, "%s%s", base, rewards);
    int rc = train_config_load_text(&c, doc, strlen(doc), TRAIN_CONFIG_YAML, "x.yaml", err);
    rc = rc ? rc : train_config_finalize(&c, err);
    CHECK(rc == 0, "the base config: %s", err);
    json_t *before = train_config_to_json(&c);
    train_config_free(&c);
    fprintf(mem, "<!-- examples: made by test_train_config (COLT_UPDATE_DOCS=1 rewrites it) -->\n");
    fprintf(mem, "| settings | colt |\n|---|---|\n");
    for (size_t e = 0; e < sizeof examples / sizeof examples[0]; e++) {
        train_config_defaults(&c);
        snprintf(doc, sizeof doc, "%s%s%s\n", base, strstr(examples[e], "reward_funcs") ? "" : rewards, examples[e]);
        err[0] = '\0';
        rc = train_config_load_text(&c, doc, strlen(doc), TRAIN_CONFIG_YAML, "x.yaml", err);
        rc = rc ? rc : train_config_finalize(&c, err);
        CHECK(rc == 0 || (!strchr(err, '\n') && err[0]), "example '%s': error '%s'", examples[e], err);
        fputs("| `", mem);
        for (const char *p = examples[e]; *p; p++) fputs(*p == '\n' ? "`<br>`" : *p == '|' ? "/" : (char[2]){*p, 0}, mem);
        fputs("` | ", mem);
        if (rc != 0) {
            fprintf(mem, "refused: %s", strncmp(err, "x.yaml: ", 8) == 0 ? err + 8 : err);
        } else {
            json_t *after = train_config_to_json(&c);
            const char *key;
            json_t *v;
            int n = 0;
            json_object_foreach(after, key, v) {
                if (json_equal(v, json_object_get(before, key)) || !strcmp(key, "dataset")) continue;
                char *text = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT | JSON_REAL_PRECISION(10));
                fprintf(mem, "%s`%s: %s`", n++ ? ", " : "loads: sets ", key, text);
                free(text);
            }
            if (!strncmp(examples[e], "datasets", 8) && c.dataset)
                fprintf(mem, "%s`dataset: %s`", n++ ? ", " : "loads: sets ", c.dataset);
            if (n == 0) fputs("loads", mem);
            json_object_foreach(c.notices, key, v) {
                const char *line = json_string_value(v);
                fprintf(mem, "; notice: %s", strncmp(line, "x.yaml: ", 8) == 0 ? line + 8 : line);
            }
            json_decref(after);
        }
        fputs(" |\n", mem);
        train_config_free(&c);
    }
    fprintf(mem, "<!-- end of examples -->\n");
    json_decref(before);
}

/* docs/trl_config.md has a row for every key of the list, and each row is the
 * one the tables give now; its examples are what loading them gives now
 * (COLT_UPDATE_DOCS=1 rewrites both). */
static void test_trl_doc(void) {
    int before = g_checks;
    char header[256], text[1024];
    json_t *keys = read_trl_keys(header, sizeof header);
    char *table = NULL;
    size_t table_len = 0;
    FILE *mem = open_memstream(&table, &table_len);
    fprintf(mem, "<!-- table: made by test_train_config from %s (COLT_UPDATE_DOCS=1 rewrites it) -->\n",
            "tests/data/trl_config_keys.txt");
    fprintf(mem, "| key | colt | what colt does |\n|---|---|---|\n");
    size_t i;
    json_t *jk;
    json_array_foreach(keys, i, jk) {
        const char *key = json_string_value(jk);
        TrainKeyClass cls = train_config_describe_key(text, sizeof text, key);
        for (char *p = text; *p; p++)
            if (*p == '|') *p = '/'; /* a table cell */
        fprintf(mem, "| `%s` | %s | %s |\n", key, CLASS_NAME[cls], text);
    }
    fprintf(mem, "<!-- end of table -->\n");
    fclose(mem);
    bool same = doc_block_matches("<!-- table:", "<!-- end of table -->\n", table, table_len);
    json_array_foreach(keys, i, jk) {
        char row[160];
        snprintf(row, sizeof row, "| `%s` |", json_string_value(jk));
        CHECK(same && strstr(table, row), "%s has no row for %s", TRL_DOC, json_string_value(jk));
    }
    char *examples = NULL;
    size_t examples_len = 0;
    mem = open_memstream(&examples, &examples_len);
    write_doc_examples(mem);
    fclose(mem);
    doc_block_matches("<!-- examples:", "<!-- end of examples -->\n", examples, examples_len);
    free(table);
    free(examples);
    json_decref(keys);
    printf("docs/trl_config.md: %d checks\n", g_checks - before);
}

/* ---------------------------------------------------------------- DeepSpeed JSON */

/* Finalizes a minimal config with deepspeed: a file holding json (and extra
 * colt flags "key=value;..."); returns rc, err set. */
static int finalize_with_deepspeed(TrainConfig *c, const char *json, const char *extra, char *err) {
    static char path[] = "/tmp/colt_test_ds_XXXXXX.json";
    snprintf(path, sizeof path, "/tmp/colt_test_ds_XXXXXX.json");
    int fd = mkstemps(path, 5);
    if (fd < 0 || write(fd, json, strlen(json)) != (ssize_t)strlen(json)) return -2;
    close(fd);
    train_config_defaults(c);
    err[0] = '\0';
    char base[1024];
    snprintf(base, sizeof base, "model: m\ndataset: d.jsonl\noutput_dir: out\nreward_funcs: [{type: length}]\n"
                                "deepspeed: %s\n%s", path, extra ? extra : "");
    int rc = train_config_load_text(c, base, strlen(base), TRAIN_CONFIG_YAML, "x.yaml", err);
    if (rc == 0) rc = train_config_finalize(c, err);
    unlink(path);
    return rc;
}

/* A minimal config with --key value given on the command line, finalized. */
static int finalize_with_flag(TrainConfig *c, const char *key, const char *value, char *err) {
    char flag[96];
    snprintf(flag, sizeof flag, "--%s", key);
    train_config_defaults(c);
    int rc = train_config_set(c, key, value, flag, err);
    if (rc == 0) {
        char base[] = "model: m\ndataset: d.jsonl\noutput_dir: out\nreward_funcs: [{type: length}]\n";
        rc = train_config_load_text(c, base, strlen(base), TRAIN_CONFIG_YAML, "x.yaml", err);
        if (rc == 0) rc = train_config_finalize(c, err);
    }
    return rc;
}

static void test_deepspeed_json(void) {
    TrainConfig c;
    char err[ERR_LEN];
    /* TRL's ZeRO-2-with-offload style file, "auto" everywhere: stage 1 is what colt honours */
    int rc = finalize_with_deepspeed(
        &c,
        "{\"zero_optimization\": {\"stage\": 1, \"offload_optimizer\": {\"device\": \"cpu\", \"pin_memory\": true}, "
        "\"overlap_comm\": true, \"contiguous_gradients\": true, \"reduce_bucket_size\": 26214400}, "
        "\"bf16\": {\"enabled\": \"auto\"}, \"gradient_accumulation_steps\": \"auto\", \"gradient_clipping\": \"auto\", "
        "\"train_micro_batch_size_per_gpu\": \"auto\", \"train_batch_size\": \"auto\", \"steps_per_print\": 10}",
        NULL, err);
    CHECK(rc == 0, "DeepSpeed file: %s", err);
    CHECK(c.zero_stage == 1 && strcmp(c.offload_optimizer, "cpu") == 0 && c.ddp_bucket_cap_mb == 100 &&
              c.offload_optimizer_ratio == 1.0,
          "DeepSpeed file gave zero_stage %d, offload %s (ratio %g), bucket %d MB", c.zero_stage, c.offload_optimizer,
          c.offload_optimizer_ratio, c.ddp_bucket_cap_mb);
    const char *noticed[] = {"deepspeed.zero_optimization.overlap_comm", "deepspeed.zero_optimization.contiguous_gradients",
                             "deepspeed.bf16", "deepspeed.steps_per_print",
                             "deepspeed.zero_optimization.offload_optimizer.pin_memory"};
    for (size_t i = 0; i < sizeof noticed / sizeof noticed[0]; i++)
        CHECK(json_object_get(c.notices, noticed[i]) != NULL, "no notice line for %s", noticed[i]);
    train_config_free(&c);
    /* TRL's ZeRO-3 file: stage 3 honoured, its tuning keys noticed */
    rc = finalize_with_deepspeed(&c,
                                 "{\"zero_optimization\": {\"stage\": 3, \"stage3_prefetch_bucket_size\": \"auto\", "
                                 "\"stage3_param_persistence_threshold\": \"auto\", \"stage3_max_live_parameters\": 1e9, "
                                 "\"stage3_gather_16bit_weights_on_model_save\": true}}",
                                 NULL, err);
    CHECK(rc == 0 && c.zero_stage == 3, "DeepSpeed ZeRO-3 file: rc %d zero_stage %d: %s", rc, c.zero_stage, err);
    const char *noticed3[] = {"deepspeed.zero_optimization.stage3_prefetch_bucket_size",
                              "deepspeed.zero_optimization.stage3_param_persistence_threshold",
                              "deepspeed.zero_optimization.stage3_max_live_parameters",
                              "deepspeed.zero_optimization.stage3_gather_16bit_weights_on_model_save"};
    for (size_t i = 0; rc == 0 && i < sizeof noticed3 / sizeof noticed3[0]; i++)
        CHECK(json_object_get(c.notices, noticed3[i]) != NULL, "no notice line for %s", noticed3[i]);
    train_config_free(&c);
    /* ZeRO-Offload++'s ratio: the share of the state on the host */
    rc = finalize_with_deepspeed(&c, "{\"zero_optimization\": {\"stage\": 3, \"offload_optimizer\": {\"device\": \"cpu\", "
                                     "\"ratio\": 0.3}}}", NULL, err);
    CHECK(rc == 0 && c.offload_optimizer_ratio == 0.3, "DeepSpeed ratio 0.3: rc %d, ratio %g: %s", rc,
          c.offload_optimizer_ratio, err);
    train_config_free(&c);
    rc = finalize_with_deepspeed(&c, "{\"zero_optimization\": {\"offload_optimizer\": {\"device\": \"cpu\", "
                                     "\"ratio\": 0.3}}}", "offload_optimizer_ratio: 0.3\n", err);
    CHECK(rc == 0 && c.offload_optimizer_ratio == 0.3, "the same ratio in both: rc %d: %s", rc, err);
    train_config_free(&c);
    rc = finalize_with_deepspeed(&c, "{\"zero_optimization\": {\"offload_optimizer\": {\"device\": \"none\", "
                                     "\"ratio\": 0.3}}}", NULL, err);
    CHECK(rc == 0 && c.offload_optimizer_ratio == 1.0 &&
              json_object_get(c.notices, "deepspeed.zero_optimization.offload_optimizer.ratio") != NULL,
          "a ratio without offload in a DeepSpeed file: rc %d, ratio %g, no notice: %s", rc, c.offload_optimizer_ratio,
          err);
    train_config_free(&c);
    /* refusals: one line each, naming the key */
    const struct {
        const char *json, *extra, *needle;
    } bad[] = {
        {"{\"zero_optimization\": {\"stage\": 5}}", NULL, "zero_optimization.stage must be 0, 1, 2 or 3"},
        {"{\"zero_optimization\": {\"stage\": 3}}", "use_peft: true\n", "zero_stage 3 with use_peft"},
        {"{\"zero_optimization\": {\"stage\": 1}}", "zero_stage: 0\n", "zero_optimization.stage is 1 but zero_stage is 0"},
        {"{\"zero_optimization\": {\"offload_optimizer\": {\"device\": \"nvme\"}}}", NULL, "'nvme' is not supported"},
        {"{\"zero_optimization\": {\"offload_param\": {\"device\": \"cpu\"}}}", NULL, "offload_param.device 'cpu'"},
        {"{\"zero_optimization\": {\"offload_optimizer\": {\"device\": \"cpu\", \"ratio\": 1.5}}}", NULL,
         "offload_optimizer.ratio must be a number in [0, 1]"},
        {"{\"zero_optimization\": {\"offload_optimizer\": {\"device\": \"cpu\", \"ratio\": \"half\"}}}", NULL,
         "offload_optimizer.ratio must be a number in [0, 1]"},
        {"{\"zero_optimization\": {\"offload_optimizer\": {\"device\": \"cpu\", \"ratio\": 0.5}}}",
         "offload_optimizer_ratio: 0.25\n", "offload_optimizer.ratio is 0.5 but offload_optimizer_ratio is 0.25"},
        {"{\"zero_optimization\": {\"stage\": 1, \"bogus\": 1}}", NULL, "zero_optimization.bogus is not a DeepSpeed key"},
        {"{\"fp16\": {\"enabled\": true}}", NULL, "fp16 is not supported"},
        {"{\"train_micro_batch_size_per_gpu\": 3}", NULL, "train_micro_batch_size_per_gpu is 3 but colt's per_device_train_batch_size"},
        {"{\"gradient_clipping\": 0.5}", NULL, "gradient_clipping is 0.5 but colt's max_grad_norm is 1"},
        {"{\"optimizer\": {\"type\": \"Lamb\"}}", NULL, "optimizer type 'Lamb' is not supported"},
        {"{\"what\": 1}", NULL, "'what' is not a DeepSpeed key colt knows"},
        {"{\"zero_optimization\": {\"stage\": 1},}", NULL, "line 1"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        rc = finalize_with_deepspeed(&c, bad[i].json, bad[i].extra, err);
        CHECK(rc != 0 && strstr(err, bad[i].needle) && !strchr(err, '\n'), "%s: rc %d, '%s' should hold '%s'",
              bad[i].json, rc, err, bad[i].needle);
        printf("  deepspeed %-60s -> %s\n", bad[i].json, err);
        train_config_free(&c);
    }
    /* offload_optimizer and zero_stage as colt keys */
    rc = finalize_with_flag(&c, "offload_optimizer", "disk", err);
    CHECK(rc != 0 && strstr(err, "offload_optimizer 'disk': use none or cpu"), "offload disk: %s", err);
    train_config_free(&c);
    /* a ratio without offload: refused, naming both keys */
    rc = finalize_with_flag(&c, "offload_optimizer_ratio", "0.5", err);
    CHECK(rc != 0 && strstr(err, "offload_optimizer_ratio 0.5 without offload_optimizer cpu"), "ratio alone: %s", err);
    train_config_free(&c);
    train_config_defaults(&c);
    rc = train_config_set(&c, "offload_optimizer_ratio", "1.5", "--offload_optimizer_ratio", err);
    CHECK(rc != 0 && strstr(err, "offload_optimizer_ratio"), "ratio 1.5: %s", err);
    train_config_free(&c);
    printf("DeepSpeed JSON: %zu refusals checked\n", sizeof bad / sizeof bad[0]);
}

/* TRL's settings colt translates (issue 38): each YAML (on a minimal config)
 * finalizes with key holding want (JSON), or is refused in one line holding
 * needle. The values are TRL's meanings (transformers' docs and TRL's
 * __post_init__), restated. */
static void test_trl_translations(void) {
    static const struct {
        const char *yaml, *needle, *key, *want;
    } cases[] = {
        {"save_strategy: \"no\"\nsave_steps: 500\n", NULL, "save_steps", "0"},
        {"save_strategy: steps\nsave_steps: 7\n", NULL, "save_steps", "7"},
        {"save_strategy: no\nsave_steps: 500\n", NULL, "save_steps", "0"}, /* unquoted: YAML's false */
        {"save_strategy: best\n", "save_strategy 'best' is not supported", NULL, NULL},
        {"eval_strategy: steps\nlogging_steps: 4\neval_steps: null\n", NULL, "eval_steps", "4"},
        {"eval_strategy: steps\nlogging_steps: 4\neval_steps: 6\n", NULL, "eval_steps", "6"},
        {"eval_strategy: no\nlogging_steps: 4\neval_steps: 5\n", NULL, "eval_steps", "0"},
        {"eval_steps: 5\n", NULL, "eval_steps", "5"}, /* colt's own configs: eval_strategy unset */
        {"evaluation_strategy: steps\nlogging_steps: 3\n", NULL, "eval_steps", "3"},
        {"eval_strategy: epoch\n", "eval_strategy 'epoch' is not supported", NULL, NULL},
        {"use_cpu: true\n", NULL, "device", "\"cpu\""},
        {"no_cuda: true\n", NULL, "device", "\"cpu\""},
        {"use_cpu: true\ndevice: cuda\n", "use_cpu: true asks for the CPU but device is cuda", NULL, NULL},
        {"bf16: false\ndevice: cuda_f32\n", NULL, "device", "\"cuda_f32\""},
        {"bf16: false\ndevice: cuda\n", "bf16: false asks for fp32 weights", NULL, NULL},
        {"bf16: null\n", NULL, "bf16", "true"},
        {"bf16: false\nuse_cpu: true\n", NULL, "device", "\"cpu\""},
        {"cast_lm_head_to_fp32: true\ndevice: cuda\n", "cast_lm_head_to_fp32: true is not supported with bf16", NULL,
         NULL},
        {"cast_lm_head_to_fp32: true\ndevice: cuda_f32\n", NULL, "cast_lm_head_to_fp32", "true"},
        {"shuffle_dataset: null\n", NULL, "shuffle_dataset", "true"},
        {"min_p: null\n", NULL, "min_p", "0"},
        {"ddp_bucket_cap_mb: null\n", NULL, "ddp_bucket_cap_mb", "25"},
        {"num_generations_eval: null\n", NULL, "num_generations_eval", "0"},
        /* generation_kwargs win over the settings, as TRL passes them last */
        {"temperature: 0.5\ngeneration_kwargs: {temperature: 0.9, top_p: 0.8}\n", NULL, "temperature", "0.9"},
        {"generation_kwargs: {temperature: 0.9, top_p: 0.8}\ntemperature: 0.5\n", NULL, "top_p", "0.8"},
        {"generation_kwargs: {max_new_tokens: 33}\n", NULL, "max_completion_length", "33"},
        {"generation_kwargs: {min_p: 0.05, repetition_penalty: 1.1, top_k: 20}\n", NULL, "repetition_penalty", "1.1"},
        {"generation_kwargs: {top_p: 2}\n", "generation_kwargs: top_p: 2 is out of range", NULL, NULL},
        {"generation_kwargs: {do_sample: false}\n", "generation_kwargs.do_sample: false is not supported", NULL, NULL},
        {"generation_kwargs: {n: 2}\n", "generation_kwargs.n: 2 is not supported", NULL, NULL},
        {"generation_kwargs: {num_beams: 4}\n", "generation_kwargs.num_beams: 4 is not supported", NULL, NULL},
        {"generation_kwargs: {num_beams: 1, use_cache: true, logprobs: 0, top_k: 7}\n", NULL, "top_k", "7"},
        /* cosine_with_min_lr's kwargs, as transformers reads them */
        {"lr_scheduler_type: cosine_with_min_lr\nlr_scheduler_kwargs: {min_lr: 1.0e-7}\n", NULL, "lr_scheduler_type",
         "\"cosine_with_min_lr\""},
        {"lr_scheduler_type: cosine_with_min_lr\nlr_scheduler_kwargs: {min_lr: 1.0e-7, min_lr_rate: 0.1}\n",
         "give min_lr_rate or min_lr, not both", NULL, NULL},
        {"lr_scheduler_type: cosine_with_min_lr\nlr_scheduler_kwargs: {min_lr_rate: 1.5}\n", "outside [0, 1]", NULL,
         NULL},
        {"lr_scheduler_type: linear\nlr_scheduler_kwargs: {min_lr_rate: 0.1}\n",
         "lr_scheduler_kwargs.min_lr_rate: 0.1 is not supported with lr_scheduler_type linear", NULL, NULL},
        {"lr_scheduler_type: cosine\nlr_scheduler_kwargs: {num_cycles: 0.5}\n", NULL, "lr_scheduler_type",
         "\"cosine\""},
        {"lr_scheduler_type: cosine\nlr_scheduler_kwargs: {num_cycles: 2}\n", "only num_cycles: 0.5", NULL, NULL},
        {"lr_scheduler_type: cosine_with_restarts\n", "unknown lr_scheduler_type 'cosine_with_restarts'", NULL, NULL},
        /* both names, both batch sizes: fine when they agree */
        {"gradient_checkpointing: true\nactivation_checkpointing: true\n", NULL, "gradient_checkpointing", "true"},
        {"gradient_checkpointing: false\nactivation_checkpointing: true\n", "name the same setting with different",
         NULL, NULL},
        {"generation_batch_size: 16\nsteps_per_generation: 2\n", NULL, "generation_batch_size", "16"},
        {"generation_batch_size: 16\nsteps_per_generation: 1\n",
         "generation_batch_size 16 and steps_per_generation 1 disagree", NULL, NULL},
        /* trl grpo's dataset keys and reward names */
        {"datasets: [{path: json, data_files: x.jsonl, split: train}]\n", NULL, "dataset", "\"x.jsonl\""},
        {"datasets: [{path: y.jsonl}]\n", NULL, "dataset", "\"y.jsonl\""},
        {"datasets: [{path: json, data_files: {train: z.json}}]\n", NULL, "dataset", "\"z.json\""},
        {"datasets: [{path: trl-lib/tldr}]\n", "path 'trl-lib/tldr' is not a local JSON file", NULL, NULL},
        {"datasets: [{path: json, data_files: x.jsonl, columns: [prompt]}]\n", "datasets[0].columns", NULL, NULL},
        {"datasets: [{path: json, data_files: x.parquet}]\n", "not a local JSON file", NULL, NULL},
        {"dataset_name: local.jsonl\n", NULL, "dataset", "\"local.jsonl\""},
        {"dataset_name: trl-lib/DeepMath-103K\n", NULL, "dataset", "\"d.jsonl\""},
        {"reward_funcs: [think_format_reward, accuracy_reward, rewards.py:f]\n", NULL, "reward_funcs",
         "[{\"type\": \"regex\", \"name\": \"think_format_reward\", \"pattern\": "
         "\"^<think>(?!.*<think>)(.*?)</think>.*$\", \"flags\": \"s\"}, {\"type\": \"math\", \"name\": "
         "\"accuracy_reward\", \"column\": \"solution\"}, \"rewards.py:f\"]"},
        {"reward_funcs: [reasoning_accuracy_reward]\n", "trl.rewards.reasoning_accuracy_reward", NULL, NULL},
        {"accelerator_config: {split_batches: false, dispatch_batches: null, even_batches: true, "
         "use_seedable_sampler: true, non_blocking: false, gradient_accumulation_kwargs: null}\n",
         NULL, "model", "\"m\""},
        {"accelerator_config: {even_batches: false}\n", "accelerator_config.even_batches: false is not supported",
         NULL, NULL},
        /* TRL's script puts the reward model first (trl/scripts/grpo.py); "" is none */
        {"reward_model_name_or_path: some/rm\n", NULL, "reward_funcs",
         "[{\"type\": \"model\", \"path\": \"some/rm\"}, {\"type\": \"length\"}]"},
        {"reward_model_name_or_path: \"\"\n", NULL, "reward_funcs", "[{\"type\": \"length\"}]"},
        {"reward_model_name_or_path: some/rm\nreward_weights: [1, 2]\n", NULL, "reward_weights", "[1, 2]"},
        {"reward_model_name_or_path: some/rm\nreward_weights: [1]\n", "reward_weights", NULL, NULL},
        {"fsdp: full_shard auto_wrap\n", "colt shards with ZeRO instead", NULL, NULL},
    };
    int before = g_checks;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        TrainConfig c;
        char err[ERR_LEN] = "";
        base_config(&c);
        int rc = train_config_load_text(&c, cases[i].yaml, strlen(cases[i].yaml), TRAIN_CONFIG_YAML, "t.yaml", err);
        if (rc == 0) rc = train_config_finalize(&c, err);
        if (cases[i].needle) {
            CHECK(rc != 0 && strstr(err, cases[i].needle) && !strchr(err, '\n'), "'%s': rc %d, '%s' lacks '%s'",
                  cases[i].yaml, rc, err, cases[i].needle);
        } else {
            json_t *want = json_loads(cases[i].want, JSON_DECODE_ANY, NULL), *got = rc == 0 ? value_of(&c, cases[i].key)
                                                                                         : NULL;
            char *g = got ? json_dumps(got, JSON_ENCODE_ANY) : NULL;
            CHECK(rc == 0 && want && got &&
                      (json_equal(want, got) || (json_is_number(want) && json_is_number(got) &&
                                                 json_number_value(want) == json_number_value(got))),
                  "'%s': rc %d (%s): %s is %s, want %s", cases[i].yaml, rc, err, cases[i].key, g ? g : "-",
                  cases[i].want);
            free(g);
            json_decref(want), json_decref(got);
        }
        train_config_free(&c);
    }
    /* use_cpu: true sets device cpu when read, before finalize (colt train counts its processes from device) */
    {
        TrainConfig u;
        char uerr[ERR_LEN] = "";
        train_config_defaults(&u);
        const char *text = "use_cpu: true\ndevice: auto\n";
        CHECK(train_config_load_text(&u, text, strlen(text), TRAIN_CONFIG_YAML, "t.yaml", uerr) == 0 &&
                  !strcmp(u.device, "cpu"),
              "use_cpu: true, device: auto: device %s before finalize (%s)", u.device, uerr);
        /* the command line's use_cpu false over the file's true gives the device back (auto) */
        CHECK(train_config_set(&u, "use_cpu", "false", "command line", uerr) == 0 && !strcmp(u.device, "auto"),
              "use_cpu: true then --use_cpu false: device %s (%s)", u.device, uerr);
        train_config_free(&u);
    }
    /* the rate min_lr gives, and a flag in trl grpo's form */
    TrainConfig c;
    char err[ERR_LEN] = "";
    base_config(&c);
    const char *yaml = "learning_rate: 2.0e-5\nlr_scheduler_type: cosine_with_min_lr\nlr_scheduler_kwargs: {min_lr: 1.0e-6}\n";
    int rc = train_config_load_text(&c, yaml, strlen(yaml), TRAIN_CONFIG_YAML, "t.yaml", err);
    rc = rc ? rc : train_config_finalize(&c, err);
    CHECK(rc == 0 && c.min_lr_rate == 1e-6 / 2e-5, "min_lr 1e-6 of 2e-5: min_lr_rate %.17g (%s)", c.min_lr_rate, err);
    CHECK(train_config_set(&c, "reward_funcs", "think_format_reward", "command line", err) == 0 &&
              json_array_size(c.reward_funcs) == 1 &&
              !strcmp(json_string_value(json_object_get(json_array_get(c.reward_funcs, 0), "type")), "regex"),
          "--reward_funcs think_format_reward: %s", err);
    train_config_free(&c);
    printf("TRL translations: %zu cases, %d checks\n", sizeof cases / sizeof cases[0], g_checks - before);
}

/* vllm_mode server and async_generation: accepted as TRL writes them, refused in one line where colt cannot. */
static void test_server_mode_settings(void) {
    static const struct {
        const char *settings, *needle; /* NULL: finalizes */
    } cases[] = {
        {"vllm_mode: server\nvllm_server_host: 10.0.0.7\nvllm_server_port: 8001\nvllm_group_port: 51217\n"
         "vllm_server_timeout: 30\n", NULL},
        {"vllm_mode: server\nasync_generation: true\ngradient_accumulation_steps: 2\n", NULL},
        {"vllm_mode: server\nuse_peft: true\nasync_generation: true\n", NULL}, /* the adapters alone are pushed */
        {"vllm_mode: server\ntensor_parallel_size: 2\n", "vllm_mode server needs tensor_parallel_size 1, not 2"},
        {"async_generation: true\n", "async_generation needs vllm_mode server"},
        {"vllm_mode: server\nasync_generation: true\nsteps_per_generation: 2\n",
         "samples would be 2 steps stale, more than max_staleness 1"},
        {"vllm_mode: remote\n", "unknown vllm_mode 'remote' (colocate, server)"},
        {"vllm_mode: server\nmax_staleness: 2\n", "max_staleness"},
        {"tools: [\"t.py:f\"]\ntensor_parallel_size: 2\n", NULL}, /* the group's first rank runs the tools */
        {"tools: [\"t.py:f\"]\nvllm_mode: server\nasync_generation: true\n", NULL}, /* a second tool worker */
        /* several replicas: a YAML list or comma-separated, kept comma-separated (checked below) */
        {"vllm_mode: server\nvllm_server_base_url: [\"http://a:8000/\", \"http://b:8000\"]\nvllm_group_port: 51300\n",
         NULL},
        {"vllm_mode: server\nvllm_server_base_url: \"http://a:8000, http://b:8000\"\n", NULL},
        {"server_devices: [4, 5, 6, 7]\nserver_data_parallel_size: 2\n", NULL},
        {"server_devices: [4, 5, 6]\nserver_data_parallel_size: 2\n",
         "server_devices lists 3 GPU(s), which server_data_parallel_size 2 does not divide"},
        {"vllm_mode: server\nserver_data_parallel_size: 2\n", "server_data_parallel_size 2 goes with server_devices"},
        {"vllm_mode: server\nvllm_server_base_url: \"http://a:8000,http://a:8000/\"\n",
         "vllm_server_base_url lists http://a:8000 twice"},
        {"vllm_mode: server\nvllm_server_base_url: \"http://a:8000,,http://b:8000\"\n",
         "vllm_server_base_url's entry 1 is empty"},
        {"vllm_mode: server\nvllm_server_base_url: [\"http://a:8000\", 7]\n", "vllm_server_base_url[1] is not a URL"},
        {"vllm_mode: server\nvllm_server_base_url: [\"http://a:8000\", \"http://b:8000\"]\nvllm_group_port: 65535\n",
         "vllm_group_port 65535 + 2 replicas runs past port 65535"},
        {"ddp_backend: gloo\n", NULL}, /* the host path even on GPUs */
        {"ddp_backend: hccl\n", "ddp_backend 'hccl' is not one colt has (nccl, gloo or mpi)"},
    };
    static const char *const joined[] = {"http://a:8000,http://b:8000", "http://a:8000,http://b:8000"};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        TrainConfig c;
        char err[ERR_LEN] = "", text[512];
        base_config(&c);
        snprintf(text, sizeof text, "%s", cases[i].settings);
        int rc = train_config_load_text(&c, text, strlen(text), TRAIN_CONFIG_YAML, "server.yaml", err);
        if (rc == 0) rc = train_config_finalize(&c, err);
        if (!cases[i].needle) {
            CHECK(rc == 0, "server settings %zu: %s", i, err);
            if (i == 0)
                CHECK(rc == 0 && strcmp(c.vllm_server_host, "10.0.0.7") == 0 && c.vllm_server_port == 8001 &&
                          c.vllm_group_port == 51217 && c.vllm_server_timeout == 30 && !c.async_generation,
                      "server settings not stored");
            if (i == 10 || i == 11)
                CHECK(rc == 0 && c.vllm_server_base_url && strcmp(c.vllm_server_base_url, joined[i - 10]) == 0,
                      "server settings %zu: the replicas' URLs kept as '%s', want '%s'", i,
                      c.vllm_server_base_url ? c.vllm_server_base_url : "(null)", joined[i - 10]);
            if (i == 12) CHECK(rc == 0 && c.server_data_parallel_size == 2, "server_data_parallel_size not stored");
        } else {
            CHECK(rc != 0 && strstr(err, cases[i].needle) && !strchr(err, '\n'), "server settings %zu: '%s' lacks '%s'",
                  i, err, cases[i].needle);
            printf("  server settings %zu -> %s\n", i, err);
        }
        train_config_free(&c);
    }
    TrainConfig d;
    train_config_defaults(&d);
    CHECK(strcmp(d.vllm_mode, "colocate") == 0 && strcmp(d.vllm_server_host, "127.0.0.1") == 0 &&
              d.vllm_server_port == 8000 && d.vllm_group_port == 51216 && d.vllm_server_timeout == 240 &&
              !d.async_generation && d.max_staleness == 1 && d.server_data_parallel_size == 1,
          "server-mode defaults");
    train_config_free(&d);
}

int main(void) {
    test_tables_cover_every_key();
    test_int_bounds();
    test_double_bounds();
    test_overflow_text();
    test_products();
    test_total_steps();
    test_duplicates_and_empty();
    test_demo_loads();
    test_trl_keys_classified();
    test_trl_messages();
    test_trl_colocate_config();
    test_server_mode_settings();
    test_trl_translations();
    test_deepspeed_json();
    test_trl_doc();
    printf("%s: %d checks, %d failed\n", g_failures ? "FAIL" : "OK", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
