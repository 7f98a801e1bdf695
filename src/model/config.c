/* config.c — config.json and generation_config.json of LlamaForCausalLM,
 * Qwen2ForCausalLM and Qwen3ForCausalLM checkpoints (and of their
 * *ForSequenceClassification reward models: the same decoder, a score head),
 * parsed with jansson and validated.
 *
 * Defaults follow transformers 5 (LlamaConfig / Qwen2Config / Qwen3Config). Both the legacy
 * top-level rope_theta / rope_scaling and transformers 5's rope_parameters are
 * read, with RoPE types default, linear and llama3. This file does not load
 * weights (model.c) and does not write configs (model_save in model.c). */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/fileio.h"
#include "model/model.h"

/* Upper bounds that keep every size product of the model far from overflow. */
#define CONFIG_MAX_DIM (1 << 20)
#define CONFIG_MAX_VOCAB (1 << 24)
#define CONFIG_MAX_LAYERS 4096
#define CONFIG_MAX_POSITIONS (1 << 24)

/* Reads an optional positive integer key: absent or null leaves *out alone. */
static int get_positive_int(const json_t *root, const char *key, int *out, int required, int max, const char *name,
                            char *err) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) {
        if (required) return errorf(err, "%s: missing key '%s'", name, key);
        return COLT_OK;
    }
    if (!json_is_integer(v)) return errorf(err, "%s: key '%s' must be an integer", name, key);
    json_int_t x = json_integer_value(v);
    if (x <= 0 || x > max) return errorf(err, "%s: key '%s' is %lld, must be in 1..%d", name, key, (long long)x, max);
    *out = (int)x;
    return COLT_OK;
}

static int get_positive_real(const json_t *root, const char *key, float *out, const char *name, char *err) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) return COLT_OK;
    if (!json_is_number(v)) return errorf(err, "%s: key '%s' must be a number", name, key);
    float x = (float)json_number_value(v); /* checked after the cast: 1e-46 underflows to 0 */
    if (!(x > 0.0f) || !isfinite(x))
        return errorf(err, "%s: key '%s' must be a positive number representable as fp32", name, key);
    *out = x;
    return COLT_OK;
}

static int get_bool(const json_t *root, const char *key, bool *out, const char *name, char *err) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) return COLT_OK;
    if (!json_is_boolean(v)) return errorf(err, "%s: key '%s' must be true or false", name, key);
    *out = json_is_true(v);
    return COLT_OK;
}

/* Appends eos ids from an int or a list of ints (duplicates skipped). */
static int add_eos_ids(ModelConfig *cfg, const json_t *v, const char *name, char *err) {
    if (!v || json_is_null(v)) return COLT_OK;
    size_t n = json_is_array(v) ? json_array_size(v) : 1;
    for (size_t i = 0; i < n; i++) {
        const json_t *e = json_is_array(v) ? json_array_get(v, i) : v;
        if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) > CONFIG_MAX_VOCAB)
            return errorf(err, "%s: key 'eos_token_id' must be a non-negative integer or a list of them", name);
        int id = (int)json_integer_value(e), dup = 0;
        for (int k = 0; k < cfg->n_eos; k++) dup |= cfg->eos_token_ids[k] == id;
        if (dup) continue;
        if (cfg->n_eos == MODEL_MAX_EOS)
            return errorf(err, "%s: key 'eos_token_id' has more than %d ids", name, MODEL_MAX_EOS);
        cfg->eos_token_ids[cfg->n_eos++] = id;
    }
    return COLT_OK;
}

static int parse_dtype(ModelConfig *cfg, const json_t *root, const char *name, char *err) {
    const char *key = "torch_dtype";
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) v = json_object_get(root, key = "dtype");
    cfg->torch_dtype = DTYPE_F32;
    if (!v || json_is_null(v)) return COLT_OK;
    const char *s = json_is_string(v) ? json_string_value(v) : "";
    if (strcmp(s, "float32") == 0) cfg->torch_dtype = DTYPE_F32;
    else if (strcmp(s, "bfloat16") == 0) cfg->torch_dtype = DTYPE_BF16;
    else if (strcmp(s, "float16") == 0) cfg->torch_dtype = DTYPE_F16;
    else return errorf(err, "%s: key '%s' must be \"float32\", \"bfloat16\" or \"float16\"", name, key);
    return COLT_OK;
}

/* A required positive fp32 number `key` of the rope object `obj` (the config's key `where`). */
static int get_rope_real(const json_t *obj, const char *key, float *out, const char *where, const char *name,
                         char *err) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v))
        return errorf(err, "%s: key '%s.%s' is missing (needed by its rope_type)", name, where, key);
    float x = json_is_number(v) ? (float)json_number_value(v) : 0.0f;
    if (!(x > 0.0f) || !isfinite(x))
        return errorf(err, "%s: key '%s.%s' must be a positive number representable as fp32", name, where, key);
    *out = x;
    return COLT_OK;
}

/* RoPE in either form users have: transformers 5's rope_parameters (with
 * rope_theta inside) or 4.x's top-level rope_theta + rope_scaling (the type
 * under "rope_type" or the older "type"). As transformers 5 reads them: a
 * non-empty rope_scaling wins over rope_parameters, and the dict's rope_theta
 * over the top-level one. Types: default, linear (factor) and llama3 (factor,
 * low_freq_factor, high_freq_factor, original_max_position_embeddings, else
 * the top-level original_max_position_embeddings or max_position_embeddings);
 * the others are refused, naming the key. */
static int parse_rope(ModelConfig *cfg, const json_t *root, const char *name, char *err) {
    cfg->rope_theta = 10000.0f;
    cfg->rope_type = ROPE_DEFAULT;
    if (get_positive_real(root, "rope_theta", &cfg->rope_theta, name, err) != 0) return COLT_ERR;
    const char *where = "rope_scaling";
    json_t *params = json_object_get(root, where);
    if (!params || json_is_null(params) || (json_is_object(params) && json_object_size(params) == 0))
        params = json_object_get(root, where = "rope_parameters");
    if (!params || json_is_null(params)) return COLT_OK;
    if (!json_is_object(params)) return errorf(err, "%s: key '%s' must be an object", name, where);
    json_t *theta = json_object_get(params, "rope_theta");
    if (theta && !json_is_null(theta) && get_rope_real(params, "rope_theta", &cfg->rope_theta, where, name, err) != 0)
        return COLT_ERR;
    json_t *partial = json_object_get(params, "partial_rotary_factor");
    if (partial && !json_is_null(partial) && !(json_is_number(partial) && json_number_value(partial) == 1.0))
        return errorf(err, "%s: key '%s.partial_rotary_factor' is set; colt rotates the whole head (1.0 only)", name,
                      where);
    const char *type_key = "rope_type";
    json_t *type = json_object_get(params, type_key);
    if (!type || json_is_null(type)) type = json_object_get(params, type_key = "type");
    const char *t = "default";
    if (type && !json_is_null(type)) {
        if (!json_is_string(type)) return errorf(err, "%s: key '%s.%s' must be a string", name, where, type_key);
        t = json_string_value(type);
    }
    if (strcmp(t, "default") == 0) return COLT_OK;
    if (strcmp(t, "linear") == 0) {
        cfg->rope_type = ROPE_LINEAR;
        return get_rope_real(params, "factor", &cfg->rope_factor, where, name, err);
    }
    if (strcmp(t, "llama3") != 0)
        return errorf(err, "%s: key '%s.%s' is \"%.32s\"; colt supports the RoPE types default, linear and llama3",
                      name, where, type_key, t);
    cfg->rope_type = ROPE_LLAMA3;
    if (get_rope_real(params, "factor", &cfg->rope_factor, where, name, err) != 0 ||
        get_rope_real(params, "low_freq_factor", &cfg->rope_low_freq_factor, where, name, err) != 0 ||
        get_rope_real(params, "high_freq_factor", &cfg->rope_high_freq_factor, where, name, err) != 0)
        return COLT_ERR;
    if (!(cfg->rope_low_freq_factor < cfg->rope_high_freq_factor))
        return errorf(err, "%s: key '%s.low_freq_factor' (%g) must be below high_freq_factor (%g)", name, where,
                      cfg->rope_low_freq_factor, cfg->rope_high_freq_factor);
    const char *orig_key = "original_max_position_embeddings";
    const json_t *orig_obj = json_object_get(root, orig_key) ? root : params; /* transformers: top level first */
    json_t *orig = json_object_get(orig_obj, orig_key);
    cfg->rope_original_max_position_embeddings = cfg->max_position_embeddings;
    if (!orig || json_is_null(orig)) return COLT_OK;
    if (!json_is_integer(orig) || json_integer_value(orig) <= 0 || json_integer_value(orig) > CONFIG_MAX_POSITIONS)
        return errorf(err, "%s: key '%s%s%s' must be an integer in 1..%d", name, orig_obj == root ? "" : where,
                      orig_obj == root ? "" : ".", orig_key, CONFIG_MAX_POSITIONS);
    cfg->rope_original_max_position_embeddings = (int)json_integer_value(orig);
    return COLT_OK;
}

/* A *ForSequenceClassification's label count, as transformers' PretrainedConfig
 * derives it: "num_labels" when written, else the size of id2label (what
 * save_pretrained writes), else its default 2. */
static int parse_num_labels(ModelConfig *cfg, const json_t *root, const char *name, char *err) {
    cfg->num_labels = 2;
    json_t *id2label = json_object_get(root, "id2label");
    if (json_is_object(id2label) && json_object_size(id2label) > 0) cfg->num_labels = (int)json_object_size(id2label);
    return get_positive_int(root, "num_labels", &cfg->num_labels, 0, CONFIG_MAX_VOCAB, name, err);
}

static int parse_arch(ModelConfig *cfg, const json_t *root, const char *name, char *err) {
    json_t *archs = json_object_get(root, "architectures");
    if (archs && !json_is_null(archs)) {
        json_t *a0 = json_is_array(archs) ? json_array_get(archs, 0) : NULL;
        if (!json_is_string(a0)) return errorf(err, "%s: key 'architectures' must be a list of strings", name);
        const char *s = json_string_value(a0);
        static const struct { const char *name; ModelArch arch; bool classifier; } known[] = {
            {"LlamaForCausalLM", ARCH_LLAMA, false},
            {"Qwen2ForCausalLM", ARCH_QWEN2, false},
            {"Qwen3ForCausalLM", ARCH_QWEN3, false},
            {"LlamaForSequenceClassification", ARCH_LLAMA, true},
            {"Qwen2ForSequenceClassification", ARCH_QWEN2, true},
            {"Qwen3ForSequenceClassification", ARCH_QWEN3, true},
        };
        for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
            if (strcmp(s, known[i].name) == 0) {
                cfg->arch = known[i].arch;
                return known[i].classifier ? parse_num_labels(cfg, root, name, err) : COLT_OK;
            }
        return errorf(err, "%s: key 'architectures': unsupported architecture '%.64s' (colt supports "
                           "LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM and their "
                           "*ForSequenceClassification reward models)", name, s);
    }
    json_t *mt = json_object_get(root, "model_type");
    const char *s = json_is_string(mt) ? json_string_value(mt) : NULL;
    if (!s) return errorf(err, "%s: missing key 'architectures' (or 'model_type')", name);
    if (strcmp(s, "llama") == 0) cfg->arch = ARCH_LLAMA;
    else if (strcmp(s, "qwen2") == 0) cfg->arch = ARCH_QWEN2;
    else if (strcmp(s, "qwen3") == 0) cfg->arch = ARCH_QWEN3;
    else
        return errorf(err, "%s: key 'model_type': unsupported model type '%.64s' (colt supports llama, qwen2, qwen3)",
                      name, s);
    return COLT_OK;
}

int model_config_parse(ModelConfig *cfg, const char *json_text, size_t len, const char *name, char *err) {
    memset(cfg, 0, sizeof(*cfg));
    json_error_t jerr;
    json_t *root = json_loadb(json_text, len, 0, &jerr);
    if (!root) return errorf(err, "%s: not valid JSON: %s (line %d)", name, jerr.text, jerr.line);
    int rc = COLT_ERR;
    if (!json_is_object(root)) {
        errorf(err, "%s: not a JSON object", name);
        goto done;
    }
    if (parse_arch(cfg, root, name, err) != 0) goto done;
    if (get_positive_int(root, "hidden_size", &cfg->hidden_size, 1, CONFIG_MAX_DIM, name, err) != 0 ||
        get_positive_int(root, "intermediate_size", &cfg->intermediate_size, 1, CONFIG_MAX_DIM, name, err) != 0 ||
        get_positive_int(root, "num_hidden_layers", &cfg->num_hidden_layers, 1, CONFIG_MAX_LAYERS, name, err) != 0 ||
        get_positive_int(root, "num_attention_heads", &cfg->num_attention_heads, 1, CONFIG_MAX_DIM, name, err) != 0 ||
        get_positive_int(root, "vocab_size", &cfg->vocab_size, 1, CONFIG_MAX_VOCAB, name, err) != 0)
        goto done;
    cfg->num_key_value_heads = cfg->num_attention_heads;
    if (get_positive_int(root, "num_key_value_heads", &cfg->num_key_value_heads, 0, CONFIG_MAX_DIM, name, err) != 0)
        goto done;
    cfg->max_position_embeddings = cfg->arch == ARCH_LLAMA ? 2048 : 32768;
    if (get_positive_int(root, "max_position_embeddings", &cfg->max_position_embeddings, 0, CONFIG_MAX_POSITIONS,
                         name, err) != 0)
        goto done;
    cfg->head_dim = 0;
    if (get_positive_int(root, "head_dim", &cfg->head_dim, 0, CONFIG_MAX_DIM, name, err) != 0) goto done;
    if (cfg->head_dim == 0) {
        if (cfg->hidden_size % cfg->num_attention_heads != 0) {
            errorf(err, "%s: key 'num_attention_heads' (%d) does not divide 'hidden_size' (%d)", name,
                   cfg->num_attention_heads, cfg->hidden_size);
            goto done;
        }
        cfg->head_dim = cfg->hidden_size / cfg->num_attention_heads;
    }
    if (cfg->head_dim % 2 != 0 || cfg->head_dim > 1024) {
        errorf(err, "%s: key 'head_dim' (%d) must be even and at most 1024", name, cfg->head_dim);
        goto done;
    }
    if (cfg->num_attention_heads % cfg->num_key_value_heads != 0) {
        errorf(err, "%s: key 'num_key_value_heads' (%d) does not divide 'num_attention_heads' (%d)", name,
               cfg->num_key_value_heads, cfg->num_attention_heads);
        goto done;
    }
    if ((long long)cfg->num_attention_heads * cfg->head_dim > CONFIG_MAX_DIM) {
        errorf(err, "%s: key 'num_attention_heads' x head_dim is too large", name);
        goto done;
    }
    cfg->rms_norm_eps = 1e-6f;
    if (get_positive_real(root, "rms_norm_eps", &cfg->rms_norm_eps, name, err) != 0) goto done;
    if (parse_rope(cfg, root, name, err) != 0) goto done;

    json_t *act = json_object_get(root, "hidden_act");
    if (act && !json_is_null(act) && (!json_is_string(act) || strcmp(json_string_value(act), "silu") != 0)) {
        errorf(err, "%s: key 'hidden_act' must be \"silu\"", name);
        goto done;
    }
    cfg->tie_word_embeddings = false; /* transformers' default for both LlamaConfig and Qwen2Config */
    if (get_bool(root, "tie_word_embeddings", &cfg->tie_word_embeddings, name, err) != 0) goto done;
    if (cfg->arch != ARCH_LLAMA) {
        bool sliding = false;
        if (get_bool(root, "use_sliding_window", &sliding, name, err) != 0) goto done;
        if (sliding) {
            errorf(err, "%s: key 'use_sliding_window' is true; sliding-window attention is not supported", name);
            goto done;
        }
    }
    if (cfg->arch == ARCH_QWEN2) {
        cfg->attention_bias = true;
    } else {
        bool mlp_bias = false;
        if (get_bool(root, "attention_bias", &cfg->attention_bias, name, err) != 0 ||
            get_bool(root, "mlp_bias", &mlp_bias, name, err) != 0)
            goto done;
        if (mlp_bias) {
            errorf(err, "%s: key 'mlp_bias' is true; MLP biases are not supported", name);
            goto done;
        }
    }
    cfg->bos_token_id = -1;
    json_t *bos = json_object_get(root, "bos_token_id");
    if (bos && !json_is_null(bos)) {
        if (!json_is_integer(bos) || json_integer_value(bos) < 0 || json_integer_value(bos) > CONFIG_MAX_VOCAB) {
            errorf(err, "%s: key 'bos_token_id' must be a non-negative integer", name);
            goto done;
        }
        cfg->bos_token_id = (int)json_integer_value(bos);
    }
    if (add_eos_ids(cfg, json_object_get(root, "eos_token_id"), name, err) != 0) goto done;
    /* A classifier has no lm_head: its score head is never tied to the embedding. */
    if (cfg->num_labels > 0) cfg->tie_word_embeddings = false;
    if (parse_dtype(cfg, root, name, err) != 0) goto done;
    rc = COLT_OK;
done:
    json_decref(root);
    return rc;
}

bool model_has_qk_norm(const ModelConfig *cfg) { return cfg->arch == ARCH_QWEN3; }

const char *model_arch_name(ModelArch arch) {
    switch (arch) {
    case ARCH_LLAMA: return "llama";
    case ARCH_QWEN2: return "qwen2";
    case ARCH_QWEN3: return "qwen3";
    }
    return "?";
}

/* generation_config.json: eos ids (merged) and transformers' sampling defaults. */
static int parse_generation_config(ModelConfig *cfg, GenerationDefaults *gen, const char *path, char *err) {
    char *text = NULL;
    size_t len = 0;
    if (file_read_all(path, &text, &len, err) != 0) return COLT_ERR;
    json_error_t jerr;
    json_t *root = json_loadb(text, len, 0, &jerr);
    free(text);
    if (!root) return errorf(err, "%s: not valid JSON: %s (line %d)", path, jerr.text, jerr.line);
    int rc = COLT_ERR;
    if (!json_is_object(root)) {
        errorf(err, "%s: not a JSON object", path);
        goto done;
    }
    if (add_eos_ids(cfg, json_object_get(root, "eos_token_id"), path, err) != 0) goto done;
    if (gen) {
        *gen = (GenerationDefaults){.present = true, .temperature = 1.0f, .top_p = 1.0f, .top_k = 50,
                                    .repetition_penalty = 1.0f};
        if (get_bool(root, "do_sample", &gen->do_sample, path, err) != 0) goto done;
        const char *reals[] = {"temperature", "top_p", "min_p", "repetition_penalty"};
        float *dst[] = {&gen->temperature, &gen->top_p, &gen->min_p, &gen->repetition_penalty};
        for (int i = 0; i < 4; i++) {
            json_t *v = json_object_get(root, reals[i]);
            if (!v || json_is_null(v)) continue;
            if (!json_is_number(v) || json_number_value(v) < 0 || !isfinite(json_number_value(v))) {
                errorf(err, "%s: key '%s' must be a non-negative number", path, reals[i]);
                goto done;
            }
            *dst[i] = (float)json_number_value(v);
        }
        json_t *k = json_object_get(root, "top_k");
        if (k && !json_is_null(k)) {
            if (!json_is_integer(k) || json_integer_value(k) < 0 || json_integer_value(k) > CONFIG_MAX_VOCAB) {
                errorf(err, "%s: key 'top_k' must be a non-negative integer", path);
                goto done;
            }
            gen->top_k = (int)json_integer_value(k);
        }
    }
    rc = COLT_OK;
done:
    json_decref(root);
    return rc;
}

int model_config_load(ModelConfig *cfg, GenerationDefaults *gen, const char *dir, char *err) {
    char *path = path_join(dir, "config.json");
    char *text = NULL;
    size_t len = 0;
    if (gen) memset(gen, 0, sizeof(*gen));
    int rc = file_read_all(path, &text, &len, err);
    if (rc == 0) rc = model_config_parse(cfg, text, len, path, err);
    free(text);
    free(path);
    if (rc != 0) return rc;
    char *gen_path = path_join(dir, "generation_config.json");
    if (file_exists(gen_path)) rc = parse_generation_config(cfg, gen, gen_path, err);
    free(gen_path);
    return rc;
}
