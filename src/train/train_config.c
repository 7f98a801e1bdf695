/* train_config.c — see train_config.h. One table lists every key: its type,
 * where it lives in TrainConfig, and its help; loading, flags, help text and
 * the JSON dump all walk it. YAML comes through libyaml's event parser and
 * becomes a jansson value, so YAML and JSON files share one code path. */
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

typedef enum { KEY_DOUBLE, KEY_DOUBLE_OR_NULL, KEY_INT, KEY_U64, KEY_BOOL, KEY_STRING, KEY_JSON_LIST } KeyType;

typedef struct ConfigKey {
    const char *name;
    KeyType type;
    size_t offset;
    const char *help;
} ConfigKey;

#define K(name, type, help) {#name, type, offsetof(TrainConfig, name), help}
static const ConfigKey KEYS[] = {
    K(model, KEY_STRING, "Hugging Face model folder to train"),
    K(dataset, KEY_STRING, "prompts: .jsonl or .json array of objects with \"prompt\""),
    K(eval_dataset, KEY_STRING, "held-out prompts, scored before and after training"),
    K(output_dir, KEY_STRING, "where metrics, checkpoints and the final model go"),
    K(reward_funcs, KEY_JSON_LIST, "list of reward specs ({type: length|regex|math|command, ...})"),
    K(reward_weights, KEY_JSON_LIST, "one weight per reward function (default 1 each)"),
    K(learning_rate, KEY_DOUBLE, "AdamW learning rate"),
    K(lr_scheduler_type, KEY_STRING, "constant, constant_with_warmup, linear or cosine"),
    K(warmup_ratio, KEY_DOUBLE, "fraction of steps for linear warmup"),
    K(warmup_steps, KEY_INT, "warmup steps (overrides warmup_ratio when > 0)"),
    K(weight_decay, KEY_DOUBLE, "AdamW decoupled weight decay"),
    K(adam_beta1, KEY_DOUBLE, "AdamW beta1"),
    K(adam_beta2, KEY_DOUBLE, "AdamW beta2"),
    K(adam_epsilon, KEY_DOUBLE, "AdamW epsilon"),
    K(max_grad_norm, KEY_DOUBLE, "clip the global gradient norm to this (0 = off)"),
    K(num_generations, KEY_INT, "completions per prompt (G)"),
    K(max_completion_length, KEY_INT, "tokens per completion at most"),
    K(max_prompt_length, KEY_INT, "prompt tokens kept (longer prompts lose their left part, as TRL)"),
    K(temperature, KEY_DOUBLE, "sampling temperature (also divides the logits when scoring)"),
    K(top_p, KEY_DOUBLE, "nucleus sampling"),
    K(top_k, KEY_INT, "top-k sampling (0 = off)"),
    K(min_p, KEY_DOUBLE, "min-p sampling (0 = off)"),
    K(repetition_penalty, KEY_DOUBLE, "repetition penalty (1 = off)"),
    K(beta, KEY_DOUBLE, "KL coefficient against the frozen initial model (0 = no reference model)"),
    K(epsilon, KEY_DOUBLE, "lower clipping epsilon"),
    K(epsilon_high, KEY_DOUBLE_OR_NULL, "upper clipping epsilon (default: epsilon)"),
    K(delta, KEY_DOUBLE_OR_NULL, "cap on the importance ratio (two-sided clipping; null = off)"),
    K(loss_type, KEY_STRING, "grpo, bnpo, dr_grpo or dapo"),
    K(importance_sampling_level, KEY_STRING, "token or sequence (GSPO)"),
    K(scale_rewards, KEY_STRING, "group, batch or none"),
    K(num_iterations, KEY_INT, "optimisation passes over each generation batch (mu)"),
    K(mask_truncated_completions, KEY_BOOL, "drop completions that hit max_completion_length from the loss"),
    K(gradient_checkpointing, KEY_BOOL, "recompute activations in the backward: ~1 more forward, far less memory"),
    K(use_vllm, KEY_BOOL, "accepted for TRL configs; colt always generates with its in-process engine"),
    K(vllm_mode, KEY_STRING, "colocate (the only mode: colt generates in-process, there is no server)"),
    K(vllm_importance_sampling_correction, KEY_BOOL,
      "weight the loss by exp(trainer old log-prob - sampler log-prob), bounded per vllm_importance_sampling_mode"),
    K(vllm_importance_sampling_mode, KEY_STRING, "token_truncate, token_mask, sequence_truncate or sequence_mask"),
    K(vllm_importance_sampling_clip_min, KEY_DOUBLE_OR_NULL, "lower bound of the IS ratio (null = none)"),
    K(vllm_importance_sampling_clip_max, KEY_DOUBLE_OR_NULL, "upper bound of the IS ratio (null = none)"),
    K(vllm_importance_sampling_cap, KEY_DOUBLE_OR_NULL, "deprecated (TRL): sets vllm_importance_sampling_clip_max"),
    K(gpu_memory_utilization, KEY_DOUBLE, "KV pool cap, fraction of total device memory (0 = auto: what is free)"),
    {"vllm_gpu_memory_utilization", KEY_DOUBLE, offsetof(TrainConfig, gpu_memory_utilization),
     "TRL's name for gpu_memory_utilization (colt's default 0 = auto, not TRL's 0.3)"},
    K(deterministic, KEY_BOOL,
      "batch-invariant kernels: engine log-probs bit-identical to the trainer's, completions independent of the "
      "batch (default: on for bf16 weights, where it costs ~10-17% of a GRPO step; off for fp32)"),
    K(per_device_train_batch_size, KEY_INT, "completions per micro-batch"),
    K(gradient_accumulation_steps, KEY_INT, "micro-batches per optimizer step"),
    K(generation_batch_size, KEY_INT, "completions per generation round (default: batch * steps_per_generation)"),
    K(steps_per_generation, KEY_INT, "micro-batches per generation round (default: gradient_accumulation_steps)"),
    K(max_steps, KEY_INT, "optimizer steps (-1: from num_train_epochs)"),
    K(num_train_epochs, KEY_DOUBLE, "passes over the prompts when max_steps is -1"),
    K(logging_steps, KEY_INT, "log metrics every N optimizer steps"),
    K(save_steps, KEY_INT, "save a checkpoint every N optimizer steps (0 = only at the end)"),
    K(save_total_limit, KEY_INT, "keep at most N checkpoints (0 = all)"),
    K(eval_steps, KEY_INT, "evaluate on eval_dataset every N steps (0 = only before and after)"),
    K(num_eval_prompts, KEY_INT, "eval prompts used (0 = all)"),
    K(log_completions_count, KEY_INT, "sample completions printed and saved per logging step"),
    K(seed, KEY_U64, "seed for shuffling and sampling"),
    K(resume_from_checkpoint, KEY_STRING, "checkpoint folder to continue from"),
    K(device, KEY_STRING, "cpu, cuda or auto (cuda when a GPU is usable)"),
};
#undef K
#define N_KEYS (sizeof KEYS / sizeof KEYS[0])

void train_config_defaults(TrainConfig *c) {
    memset(c, 0, sizeof *c);
    c->output_dir = xstrdup("runs/grpo");
    c->learning_rate = 1e-6;
    c->lr_scheduler_type = xstrdup("linear");
    c->weight_decay = 0.0;
    c->adam_beta1 = 0.9;
    c->adam_beta2 = 0.999;
    c->adam_epsilon = 1e-8;
    c->max_grad_norm = 1.0;
    c->num_generations = 8;
    c->max_completion_length = 256;
    c->max_prompt_length = 512;
    c->temperature = 1.0;
    c->top_p = 1.0;
    c->top_k = 0;
    c->min_p = 0.0;
    c->repetition_penalty = 1.0;
    c->beta = 0.0;
    c->epsilon = 0.2;
    c->epsilon_high = NAN;
    c->delta = NAN;
    c->loss_type = xstrdup("dapo");
    c->importance_sampling_level = xstrdup("token");
    c->scale_rewards = xstrdup("group");
    c->num_iterations = 1;
    c->use_vllm = true;
    c->vllm_mode = xstrdup("colocate");
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
    c->save_steps = 500;
    c->eval_steps = 0;
    c->log_completions_count = 2;
    c->seed = 42;
    c->device = xstrdup("auto");
}

void train_config_free(TrainConfig *c) {
    for (size_t i = 0; i < N_KEYS; i++) {
        void *p = (char *)c + KEYS[i].offset;
        if (KEYS[i].type == KEY_STRING) {
            free(*(char **)p);
            *(char **)p = NULL;
        } else if (KEYS[i].type == KEY_JSON_LIST) {
            json_decref(*(json_t **)p);
            *(json_t **)p = NULL;
        }
    }
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

static int unknown_key(const char *name, const char *where, char *err) {
    const char *best = KEYS[0].name;
    size_t best_d = (size_t)-1;
    for (size_t i = 0; i < N_KEYS; i++) {
        size_t d = edit_distance(name, KEYS[i].name);
        if (d < best_d) best_d = d, best = KEYS[i].name;
    }
    return errorf(err, "%s: unknown setting '%s' (did you mean '%s'?)", where, name, best);
}

/* ---------------------------------------------------------------- values */

/* A YAML plain scalar (or a flag's text) as JSON: null, bool, int, real or string. */
static json_t *scalar_to_json(const char *s, bool quoted) {
    if (quoted) return json_string(s);
    if (!*s || strcmp(s, "~") == 0 || strcasecmp(s, "null") == 0 || strcmp(s, "None") == 0) return json_null();
    if (strcasecmp(s, "true") == 0 || strcasecmp(s, "yes") == 0) return json_true();
    if (strcasecmp(s, "false") == 0 || strcasecmp(s, "no") == 0) return json_false();
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (!errno && *end == '\0') return json_integer(v);
    errno = 0;
    double d = strtod(s, &end);
    if (!errno && *end == '\0' && isfinite(d)) return json_real(d);
    return json_string(s);
}

static int set_from_json(TrainConfig *c, const ConfigKey *k, json_t *v, const char *where, char *err) {
    void *p = (char *)c + k->offset;
    /* Numbers given as strings ("1e-6" is a string in YAML 1.1) are accepted. */
    json_t *num = v;
    json_t *parsed = NULL;
    if (json_is_string(v) && k->type != KEY_STRING && k->type != KEY_JSON_LIST) {
        parsed = scalar_to_json(json_string_value(v), false);
        num = parsed;
    }
    int rc = COLT_OK;
    switch (k->type) {
    case KEY_DOUBLE:
    case KEY_DOUBLE_OR_NULL:
        if (json_is_null(num) && k->type == KEY_DOUBLE_OR_NULL) *(double *)p = NAN;
        else if (json_is_number(num)) *(double *)p = json_number_value(num);
        else rc = errorf(err, "%s: '%s' must be a number", where, k->name);
        break;
    case KEY_INT:
        if (json_is_null(num) && (strcmp(k->name, "generation_batch_size") == 0 ||
                                  strcmp(k->name, "steps_per_generation") == 0 ||
                                  strcmp(k->name, "save_total_limit") == 0 || strcmp(k->name, "top_k") == 0))
            *(int *)p = 0;  /* TRL's None */
        else if (json_is_integer(num) && json_integer_value(num) >= -2147483647LL &&
                 json_integer_value(num) <= 2147483647LL)
            *(int *)p = (int)json_integer_value(num);
        else rc = errorf(err, "%s: '%s' must be an integer", where, k->name);
        break;
    case KEY_U64:
        if (json_is_integer(num) && json_integer_value(num) >= 0) *(uint64_t *)p = (uint64_t)json_integer_value(num);
        else rc = errorf(err, "%s: '%s' must be a non-negative integer", where, k->name);
        break;
    case KEY_BOOL:
        if (json_is_boolean(num)) *(bool *)p = json_is_true(num);
        else rc = errorf(err, "%s: '%s' must be true or false", where, k->name);
        break;
    case KEY_STRING:
        if (json_is_string(v)) {
            free(*(char **)p);
            *(char **)p = xstrdup(json_string_value(v));
        } else if (json_is_null(v)) {
            free(*(char **)p);
            *(char **)p = NULL;
        } else if (json_is_number(v) || json_is_boolean(v)) {
            /* e.g. scale_rewards: true (TRL accepts booleans there) */
            free(*(char **)p);
            *(char **)p = xstrdup(json_is_true(v) ? "true" : json_is_false(v) ? "false" : "");
            if (json_is_number(v)) rc = errorf(err, "%s: '%s' must be a string", where, k->name);
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
    }
    json_decref(parsed);
    /* either name of the KV pool cap: remember that the user chose it */
    if (rc == COLT_OK && k->offset == offsetof(TrainConfig, gpu_memory_utilization))
        c->gpu_memory_utilization_set = true;
    if (rc == COLT_OK && k->offset == offsetof(TrainConfig, deterministic)) c->deterministic_set = true;
    return rc;
}

int train_config_set(TrainConfig *c, const char *key, const char *value, const char *where, char *err) {
    const ConfigKey *k = find_key(key);
    if (!k) return unknown_key(key, where, err);
    json_t *v;
    if (k->type == KEY_JSON_LIST) {
        json_error_t jerr;
        v = json_loads(value, JSON_DECODE_ANY, &jerr);
        if (!v) return errorf(err, "%s: '%s' must be JSON (a list): %s", where, key, jerr.text);
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

/* Builds a jansson value from libyaml events (mappings, sequences, scalars;
 * anchors and aliases are rejected). */
static json_t *yaml_node(yaml_parser_t *parser, yaml_event_t *first, const char *path, char *err, int depth) {
    if (depth > 64) {
        errorf(err, "%s: nesting deeper than 64", path);
        return NULL;
    }
    if (first->type == YAML_SCALAR_EVENT) {
        const char *s = (const char *)first->data.scalar.value;
        bool quoted = first->data.scalar.style == YAML_SINGLE_QUOTED_SCALAR_STYLE ||
                      first->data.scalar.style == YAML_DOUBLE_QUOTED_SCALAR_STYLE ||
                      first->data.scalar.style == YAML_LITERAL_SCALAR_STYLE ||
                      first->data.scalar.style == YAML_FOLDED_SCALAR_STYLE;
        json_t *v = scalar_to_json(s, quoted);
        if (!v) errorf(err, "%s line %zu: invalid UTF-8", path, first->start_mark.line + 1);
        return v;
    }
    if (first->type == YAML_ALIAS_EVENT) {
        errorf(err, "%s line %zu: YAML aliases are not supported", path, first->start_mark.line + 1);
        return NULL;
    }
    bool is_map = first->type == YAML_MAPPING_START_EVENT;
    if (!is_map && first->type != YAML_SEQUENCE_START_EVENT) {
        errorf(err, "%s line %zu: unexpected YAML content", path, first->start_mark.line + 1);
        return NULL;
    }
    json_t *out = is_map ? json_object() : json_array();
    for (;;) {
        yaml_event_t ev;
        if (!yaml_parser_parse(parser, &ev)) {
            errorf(err, "%s line %zu: %s", path, parser->problem_mark.line + 1,
                   parser->problem ? parser->problem : "YAML syntax error");
            json_decref(out);
            return NULL;
        }
        if (ev.type == YAML_MAPPING_END_EVENT || ev.type == YAML_SEQUENCE_END_EVENT) {
            yaml_event_delete(&ev);
            return out;
        }
        if (is_map) {
            if (ev.type != YAML_SCALAR_EVENT) {
                errorf(err, "%s line %zu: mapping keys must be plain strings", path, ev.start_mark.line + 1);
                yaml_event_delete(&ev);
                json_decref(out);
                return NULL;
            }
            char *key = xstrdup((const char *)ev.data.scalar.value);
            yaml_event_delete(&ev);
            yaml_event_t vev;
            if (!yaml_parser_parse(parser, &vev)) {
                errorf(err, "%s line %zu: %s", path, parser->problem_mark.line + 1,
                       parser->problem ? parser->problem : "YAML syntax error");
                free(key);
                json_decref(out);
                return NULL;
            }
            json_t *v = yaml_node(parser, &vev, path, err, depth + 1);
            yaml_event_delete(&vev);
            if (!v) {
                free(key);
                json_decref(out);
                return NULL;
            }
            json_object_set_new(out, key, v);
            free(key);
        } else {
            json_t *v = yaml_node(parser, &ev, path, err, depth + 1);
            yaml_event_delete(&ev);
            if (!v) {
                json_decref(out);
                return NULL;
            }
            json_array_append_new(out, v);
        }
    }
}

static json_t *yaml_load(const char *text, size_t len, const char *path, char *err) {
    yaml_parser_t parser;
    yaml_parser_initialize(&parser);
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    json_t *root = NULL;
    yaml_event_t ev;
    bool done = false;
    while (!done) {
        if (!yaml_parser_parse(&parser, &ev)) {
            errorf(err, "%s line %zu: %s", path, parser.problem_mark.line + 1,
                   parser.problem ? parser.problem : "YAML syntax error");
            json_decref(root);
            root = NULL;
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
            if (root) {
                errorf(err, "%s: more than one YAML document", path);
                json_decref(root);
                root = NULL;
                done = true;
                break;
            }
            root = yaml_node(&parser, &ev, path, err, 0);
            if (!root) done = true;
            break;
        default:
            break;
        }
        yaml_event_delete(&ev);
    }
    yaml_parser_delete(&parser);
    if (root && json_is_null(root)) {  /* an empty file */
        json_decref(root);
        root = json_object();
    }
    return root;
}

int train_config_load_file(TrainConfig *c, const char *path, char *err) {
    char *text = NULL;
    size_t len = 0;
    if (file_read_all(path, &text, &len, err) != 0) return COLT_ERR;
    json_t *root;
    size_t plen = strlen(path);
    if (plen > 5 && strcmp(path + plen - 5, ".json") == 0) {
        json_error_t jerr;
        root = json_loadb(text, len, 0, &jerr);
        if (!root) errorf(err, "%s line %d: invalid JSON: %s", path, jerr.line, jerr.text);
    } else {
        root = yaml_load(text, len, path, err);
    }
    free(text);
    if (!root) return COLT_ERR;
    if (!json_is_object(root)) {
        json_decref(root);
        return errorf(err, "%s: expected a mapping of settings at the top level", path);
    }
    const char *key;
    json_t *v;
    int rc = COLT_OK;
    json_object_foreach(root, key, v) {
        const ConfigKey *k = find_key(key);
        if (!k) {
            rc = unknown_key(key, path, err);
            break;
        }
        if (set_from_json(c, k, v, path, err) != 0) {
            rc = COLT_ERR;
            break;
        }
    }
    json_decref(root);
    return rc;
}

/* ---------------------------------------------------------------- checks */

static bool one_of(const char *s, const char *const *names) {
    for (; *names; names++)
        if (s && strcmp(s, *names) == 0) return true;
    return false;
}

int train_config_finalize(TrainConfig *c, char *err) {
    if (!c->model) return errorf(err, "settings: 'model' is required (a Hugging Face model folder)");
    if (!c->dataset) return errorf(err, "settings: 'dataset' is required (a .jsonl or .json file of prompts)");
    if (!c->output_dir || !*c->output_dir) return errorf(err, "settings: 'output_dir' must be set");
    if (!c->reward_funcs || json_array_size(c->reward_funcs) == 0)
        return errorf(err, "settings: 'reward_funcs' needs at least one reward function");
    if (c->reward_weights && json_array_size(c->reward_weights) != json_array_size(c->reward_funcs))
        return errorf(err, "settings: reward_weights has %zu values for %zu reward functions",
                      json_array_size(c->reward_weights), json_array_size(c->reward_funcs));
    for (size_t i = 0; c->reward_weights && i < json_array_size(c->reward_weights); i++)
        if (!json_is_number(json_array_get(c->reward_weights, i)))
            return errorf(err, "settings: reward_weights[%zu] must be a number", i);
    if (!(c->learning_rate >= 0)) return errorf(err, "settings: learning_rate must be >= 0 (got %g)", c->learning_rate);
    if (!(c->warmup_ratio >= 0 && c->warmup_ratio <= 1)) return errorf(err, "settings: warmup_ratio must be in [0, 1]");
    if (c->warmup_steps < 0) return errorf(err, "settings: warmup_steps must be >= 0");
    if (!(c->weight_decay >= 0)) return errorf(err, "settings: weight_decay must be >= 0");
    if (!(c->max_grad_norm >= 0)) return errorf(err, "settings: max_grad_norm must be >= 0");
    if (!(c->adam_beta1 >= 0 && c->adam_beta1 < 1 && c->adam_beta2 >= 0 && c->adam_beta2 < 1))
        return errorf(err, "settings: adam_beta1 and adam_beta2 must be in [0, 1)");
    if (!(c->adam_epsilon > 0)) return errorf(err, "settings: adam_epsilon must be > 0");
    static const char *const schedulers[] = {"constant", "constant_with_warmup", "linear", "cosine", NULL};
    if (!one_of(c->lr_scheduler_type, schedulers))
        return errorf(err, "settings: unknown lr_scheduler_type '%s' (constant, constant_with_warmup, linear, cosine)",
                      c->lr_scheduler_type ? c->lr_scheduler_type : "null");
    if (c->num_generations < 2)
        return errorf(err, "settings: num_generations must be >= 2 (got %d): GRPO compares completions of a prompt",
                      c->num_generations);
    if (c->max_completion_length < 1) return errorf(err, "settings: max_completion_length must be >= 1");
    if (c->max_prompt_length < 1) return errorf(err, "settings: max_prompt_length must be >= 1");
    if (!(c->temperature > 0)) return errorf(err, "settings: temperature must be > 0 for GRPO (got %g)", c->temperature);
    if (!(c->top_p > 0 && c->top_p <= 1)) return errorf(err, "settings: top_p must be in (0, 1]");
    if (c->top_k < 0) return errorf(err, "settings: top_k must be >= 0");
    if (!(c->min_p >= 0 && c->min_p <= 1)) return errorf(err, "settings: min_p must be in [0, 1]");
    if (!(c->repetition_penalty > 0)) return errorf(err, "settings: repetition_penalty must be > 0");
    if (!(c->beta >= 0)) return errorf(err, "settings: beta must be >= 0");
    if (!(c->epsilon >= 0)) return errorf(err, "settings: epsilon must be >= 0");
    if (isnan(c->epsilon_high)) c->epsilon_high = c->epsilon;
    if (!(c->epsilon_high >= 0)) return errorf(err, "settings: epsilon_high must be >= 0");
    if (!isnan(c->delta) && !(c->delta > 1)) return errorf(err, "settings: delta must be > 1 when set (got %g)", c->delta);
    static const char *const losses[] = {"grpo", "bnpo", "dr_grpo", "dapo", NULL};
    if (!one_of(c->loss_type, losses))
        return errorf(err, "settings: unknown loss_type '%s' (grpo, bnpo, dr_grpo, dapo)",
                      c->loss_type ? c->loss_type : "null");
    static const char *const levels[] = {"token", "sequence", NULL};
    if (!one_of(c->importance_sampling_level, levels))
        return errorf(err, "settings: unknown importance_sampling_level '%s' (token, sequence)",
                      c->importance_sampling_level ? c->importance_sampling_level : "null");
    if (c->scale_rewards && strcmp(c->scale_rewards, "true") == 0) {
        free(c->scale_rewards);
        c->scale_rewards = xstrdup("group");
    } else if (c->scale_rewards && strcmp(c->scale_rewards, "false") == 0) {
        free(c->scale_rewards);
        c->scale_rewards = xstrdup("none");
    }
    static const char *const scales[] = {"group", "batch", "none", NULL};
    if (!one_of(c->scale_rewards, scales))
        return errorf(err, "settings: unknown scale_rewards '%s' (group, batch, none)",
                      c->scale_rewards ? c->scale_rewards : "null");
    if (c->num_iterations < 1) return errorf(err, "settings: num_iterations must be >= 1");
    if (c->vllm_mode && strcmp(c->vllm_mode, "server") == 0)
        return errorf(err, "settings: vllm_mode 'server' is not supported: colt runs generation in-process with the "
                           "trainer's weights (use colocate)");
    static const char *const vllm_modes[] = {"colocate", NULL};
    if (!one_of(c->vllm_mode, vllm_modes))
        return errorf(err, "settings: unknown vllm_mode '%s' (colocate)", c->vllm_mode ? c->vllm_mode : "null");
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
    if (!(c->gpu_memory_utilization >= 0 && c->gpu_memory_utilization <= 1))
        return errorf(err, "settings: gpu_memory_utilization (vllm_gpu_memory_utilization) must be in (0, 1], or 0 "
                           "for auto (got %g)", c->gpu_memory_utilization);
    if (c->per_device_train_batch_size < 1) return errorf(err, "settings: per_device_train_batch_size must be >= 1");
    if (c->gradient_accumulation_steps < 1) return errorf(err, "settings: gradient_accumulation_steps must be >= 1");
    /* TRL: generation_batch_size and steps_per_generation are alternatives. */
    if (c->generation_batch_size > 0 && c->steps_per_generation > 0)
        return errorf(err, "settings: set generation_batch_size or steps_per_generation, not both");
    if (c->generation_batch_size < 0 || c->steps_per_generation < 0)
        return errorf(err, "settings: generation_batch_size and steps_per_generation must be positive");
    if (c->generation_batch_size > 0) {
        if (c->generation_batch_size % c->per_device_train_batch_size != 0)
            return errorf(err, "settings: generation_batch_size (%d) must be divisible by per_device_train_batch_size (%d)",
                          c->generation_batch_size, c->per_device_train_batch_size);
        c->steps_per_generation = c->generation_batch_size / c->per_device_train_batch_size;
    } else {
        if (c->steps_per_generation == 0) c->steps_per_generation = c->gradient_accumulation_steps;
        c->generation_batch_size = c->per_device_train_batch_size * c->steps_per_generation;
    }
    if (c->generation_batch_size % c->num_generations != 0)
        return errorf(err, "settings: generation_batch_size (%d = per_device_train_batch_size x steps_per_generation) "
                           "must be divisible by num_generations (%d)",
                      c->generation_batch_size, c->num_generations);
    if (c->max_steps == 0 || c->max_steps < -1) return errorf(err, "settings: max_steps must be > 0, or -1 to use num_train_epochs");
    if (c->max_steps == -1 && !(c->num_train_epochs > 0)) return errorf(err, "settings: num_train_epochs must be > 0");
    if (c->logging_steps < 1) return errorf(err, "settings: logging_steps must be >= 1");
    if (c->save_steps < 0 || c->save_total_limit < 0 || c->eval_steps < 0 || c->num_eval_prompts < 0 ||
        c->log_completions_count < 0)
        return errorf(err, "settings: save_steps, save_total_limit, eval_steps, num_eval_prompts and "
                           "log_completions_count must be >= 0");
    return COLT_OK;
}

/* ---------------------------------------------------------------- dump / help */

static json_t *key_to_json(const TrainConfig *c, const ConfigKey *k) {
    const void *p = (const char *)c + k->offset;
    switch (k->type) {
    case KEY_DOUBLE: return json_real(*(const double *)p);
    case KEY_DOUBLE_OR_NULL: return isnan(*(const double *)p) ? json_null() : json_real(*(const double *)p);
    case KEY_INT: return json_integer(*(const int *)p);
    case KEY_U64: return json_integer((json_int_t) * (const uint64_t *)p);
    case KEY_BOOL: return json_boolean(*(const bool *)p);
    case KEY_STRING: return *(char *const *)p ? json_string(*(char *const *)p) : json_null();
    case KEY_JSON_LIST: return *(json_t *const *)p ? json_deep_copy(*(json_t *const *)p) : json_null();
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
        json_t *v = key_to_json(&d, &KEYS[i]);
        char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_REAL_PRECISION(6));
        fprintf(fp, "  --%-28s %s (default %s)\n", KEYS[i].name, KEYS[i].help, s);
        free(s);
        json_decref(v);
    }
    train_config_free(&d);
}
