/* lora.c — LoRA adapters (lora.h): attach (PEFT's initialisation), load and
 * save in PEFT's files, merge into a plain checkpoint, and the adapter term
 * every forward adds after an adapted linear layer.
 *
 * The adapters live in one allocation laid out like the weights' arena, so the
 * optimizer and the gradient exchange see one flat buffer. The forward and
 * backward that use them are in model.c, model_paged.c and model_train.c.
 *
 * Under tensor parallelism each adapter is cut along its base weight's cut
 * (model.h): a column-parallel layer (q/k/v, gate/up: rows of W cut) keeps A
 * whole and B's rows of its outputs, so B_part (A x) is its part of the
 * output with no exchange; a row-parallel one (o_proj, down_proj: columns of
 * W cut) keeps A's columns of its inputs and B whole, so B (A_part x_part) is
 * its share of the output, summed by the all-reduce that already follows the
 * layer. Files hold whole tensors: saving gathers them, loading cuts them.
 *
 * Dimension legend: N tokens, r rank, in / out the adapted layer's widths. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/fileio.h"
#include "core/rng.h"
#include "model/model_internal.h"
#include "model/safetensors.h"

static const char *const TARGET_NAMES[LORA_N_TARGETS] = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                         "gate_proj", "up_proj", "down_proj"};
static const char *const TARGET_PARENTS[LORA_N_TARGETS] = {"self_attn", "self_attn", "self_attn", "self_attn",
                                                           "mlp",       "mlp",       "mlp"};

const char *lora_target_name(LoraTarget t) { return t >= 0 && t < LORA_N_TARGETS ? TARGET_NAMES[t] : "?"; }

int lora_target_parse(const char *name, LoraTarget *target) {
    for (int t = 0; t < LORA_N_TARGETS; t++) {
        char qualified[64];
        snprintf(qualified, sizeof qualified, "%s.%s", TARGET_PARENTS[t], TARGET_NAMES[t]);
        if (strcmp(name, TARGET_NAMES[t]) == 0 || strcmp(name, qualified) == 0) {
            *target = (LoraTarget)t;
            return COLT_OK;
        }
    }
    return COLT_ERR;
}

/* PEFT computes the scaling as a Python float; torch multiplies by it in fp32. */
float lora_scaling(const LoraConfig *c) {
    return (float)(c->use_rslora ? (double)c->alpha / sqrt((double)c->r) : (double)c->alpha / (double)c->r);
}

bool lora_target_row_parallel(LoraTarget t) { return t == LORA_O || t == LORA_DOWN; }

void lora_target_dims(const ModelConfig *c, LoraTarget t, int *in_dim, int *out_dim) {
    int D = c->hidden_size, F = c->intermediate_size, QD = c->num_attention_heads * c->head_dim,
        KVD = c->num_key_value_heads * c->head_dim;
    switch (t) {
    case LORA_Q: *in_dim = D, *out_dim = QD; break;
    case LORA_K:
    case LORA_V: *in_dim = D, *out_dim = KVD; break;
    case LORA_O: *in_dim = QD, *out_dim = D; break;
    case LORA_GATE:
    case LORA_UP: *in_dim = D, *out_dim = F; break;
    default: *in_dim = F, *out_dim = D; break; /* down_proj */
    }
}

/* ---------------------------------------------------------------- tensor table */

TensorSpec *lora_tensor_table(Model *m, const LoraConfig *cfg, int *count) {
    const ModelConfig *c = &m->local; /* this rank's part of each tensor */
    TensorSpec *t = xcalloc((size_t)c->num_hidden_layers * 2 * LORA_N_TARGETS + 1, sizeof(TensorSpec));
    int n = 0;
    for (int l = 0; l < c->num_hidden_layers; l++)
        for (int k = 0; k < LORA_N_TARGETS; k++) {
            if (!(cfg->targets & (1u << k))) continue;
            int in_dim, out_dim;
            lora_target_dims(c, (LoraTarget)k, &in_dim, &out_dim);
            for (int ab = 0; ab < 2; ab++) {
                TensorSpec *s = &t[n++];
                snprintf(s->name, sizeof s->name, "base_model.model.model.layers.%d.%s.%s.lora_%c.weight", l,
                         TARGET_PARENTS[k], TARGET_NAMES[k], ab ? 'B' : 'A');
                s->ndim = 2;
                s->shape[0] = ab ? out_dim : cfg->r;
                s->shape[1] = ab ? cfg->r : in_dim;
                s->init = ab ? INIT_ZEROS : INIT_NORMAL; /* A: the uniform draw of model_lora_attach */
                /* cut along the base weight's cut: A's columns (inputs) or B's rows (outputs) */
                bool row_parallel = lora_target_row_parallel((LoraTarget)k);
                TpSplit rows = k == LORA_K || k == LORA_V ? TP_KV_ROWS : TP_ROWS; /* k/v: by KV heads, as k/v_proj */
                s->split = ab ? (row_parallel ? TP_WHOLE : rows) : (row_parallel ? TP_COLS : TP_WHOLE);
                s->buf = ab ? &m->layers[l].lora_b[k] : &m->layers[l].lora_a[k];
            }
        }
    *count = n;
    return t;
}

int model_lora_check(const Model *m, const LoraConfig *cfg, const char *where, char *err) {
    const ModelConfig *c = &m->cfg; /* the whole model's widths (r is the same on every part) */
    int smallest = c->hidden_size < c->intermediate_size ? c->hidden_size : c->intermediate_size;
    if (c->num_key_value_heads * c->head_dim < smallest) smallest = c->num_key_value_heads * c->head_dim;
    if (cfg->r <= 0 || cfg->r > smallest)
        return errorf(err, "%s: LoRA rank r = %d must be in 1..%d (the narrowest adapted layer)", where, cfg->r,
                      smallest);
    if (!(cfg->alpha > 0.0f) || !isfinite(cfg->alpha))
        return errorf(err, "%s: lora_alpha %g must be a positive number", where, (double)cfg->alpha);
    if (!(cfg->dropout >= 0.0f && cfg->dropout < 1.0f))
        return errorf(err, "%s: lora_dropout %g must be in [0, 1)", where, (double)cfg->dropout);
    if (cfg->targets == 0 || (cfg->targets & ~LORA_ALL_TARGETS))
        return errorf(err, "%s: LoRA needs at least one target module (q_proj, k_proj, v_proj, o_proj, gate_proj, "
                           "up_proj, down_proj)", where);
    return COLT_OK;
}

static int check_lora_config(const Model *m, const LoraConfig *cfg, const char *where, char *err) {
    if (model_lora_check(m, cfg, where, err) != 0) return COLT_ERR;
    if (m->lora) return errorf(err, "%s: the model already has LoRA adapters", where);
    return COLT_OK;
}

bool lora_config_same(const LoraConfig *a, const LoraConfig *b) {
    return a->r == b->r && a->alpha == b->alpha && a->use_rslora == b->use_rslora && a->targets == b->targets;
}

/* The adapters' layout without their buffers (a planning model's, or lora_alloc's start). */
void lora_plan(Model *m, const LoraConfig *cfg) {
    LoraState *ls = xcalloc(1, sizeof(LoraState));
    ls->cfg = *cfg;
    ls->scaling = lora_scaling(cfg);
    ls->enabled = true;
    ls->dropout_key = -1;
    ls->tensors = lora_tensor_table(m, cfg, &ls->n_tensors);
    ls->offsets = xcalloc((size_t)ls->n_tensors + 1, sizeof(size_t));
    ls->arena_numel = model_arena_layout(ls->tensors, ls->n_tensors, ls->offsets);
    m->lora = ls;
}

/* Allocates the adapters' arena and points the layers' lora_a / lora_b into it (values 0). */
static void lora_alloc(Model *m, const LoraConfig *cfg) {
    lora_plan(m, cfg);
    LoraState *ls = m->lora;
    ls->arena = m->be->alloc(m->be, ls->arena_numel);
    m->be->zero(m->be, ls->arena, ls->arena_numel);
    size_t es = dtype_size(m->be->storage);
    for (int i = 0; i < ls->n_tensors; i++) *ls->tensors[i].buf = (char *)ls->arena + ls->offsets[i] * es;
}

void lora_state_free(Model *m) {
    LoraState *ls = m->lora;
    if (!ls) return;
    if (ls->arena) m->be->free(m->be, ls->arena);
    for (int i = 0; i < ls->n_tensors; i++) *ls->tensors[i].buf = NULL;
    free(ls->tensors);
    free(ls->offsets);
    free(ls);
    m->lora = NULL;
}

void model_lora_detach(Model *m) {
    if (!m->lora) return;
    lora_state_free(m);
    model_weights_changed(m);
}

int model_lora_attach(Model *m, const LoraConfig *cfg, uint64_t seed, char *err) {
    model_weights_changed(m);
    if (check_lora_config(m, cfg, "use_peft", err) != 0) return COLT_ERR;
    lora_alloc(m, cfg);
    LoraState *ls = m->lora;
    const int size = m->tp.tensor_parallel_size;
    size_t max_numel = 0;
    for (int i = 0; i < ls->n_tensors; i++)
        if (tensor_spec_numel(&ls->tensors[i]) > max_numel) max_numel = tensor_spec_numel(&ls->tensors[i]);
    /* the whole tensor is drawn on every rank of a tensor-parallel group, which keeps its part */
    float *host = xmalloc(max_numel * (size_t)size * sizeof(float));
    float *part = size > 1 ? xmalloc(max_numel * sizeof(float)) : host;
    for (int i = 0; i < ls->n_tensors; i++) {
        const TensorSpec *s = &ls->tensors[i];
        if (s->init == INIT_ZEROS) continue; /* B: the arena is zeroed */
        int64_t whole[2];
        model_tp_whole_shape(m, s, whole);
        /* kaiming_uniform_(a=sqrt(5)) on [r, in]: bound = gain * sqrt(3 / fan_in), gain = sqrt(2 / 6) */
        float bound = (float)(1.0 / sqrt((double)whole[1]));
        size_t numel = (size_t)whole[0] * (size_t)whole[1];
        for (size_t j = 0; j < numel; j++) host[j] = bound * (2.0f * rng_uniform(seed, (uint64_t)i, j) - 1.0f);
        if (size > 1) model_tp_cut(m, s, host, part);
        m->be->upload(m->be, *s->buf, part, tensor_spec_numel(s));
    }
    if (part != host) free(part);
    free(host);
    return COLT_OK;
}

/* ---------------------------------------------------------------- PEFT's files */

/* One target_modules entry as PEFT matches it against module names (equal,
 * or a suffix after a dot): "q_proj" adapts every layer's q_proj,
 * "model.layers.3.self_attn.q_proj" (how PEFT saves "all-linear") layer 3's.
 * Sets mask[l] bits for the layers it names; -1 if it names no linear layer
 * colt adapts. */
static int add_target_entry(unsigned *mask, int n_layers, const char *entry) {
    const char *last = strrchr(entry, '.');
    LoraTarget t;
    if (lora_target_parse(last ? last + 1 : entry, &t) != 0) return COLT_ERR;
    const char *layers = strstr(entry, "layers.");
    if (!layers) {
        for (int l = 0; l < n_layers; l++) mask[l] |= 1u << t;
        return COLT_OK;
    }
    char *end = NULL;
    long l = strtol(layers + 7, &end, 10);
    if (end == layers + 7 || *end != '.' || l < 0 || l >= n_layers) return COLT_ERR;
    mask[l] |= 1u << t;
    return COLT_OK;
}

/* adapter_config.json -> LoraConfig, refusing what colt does not implement. */
static int parse_adapter_config(LoraConfig *cfg, int n_layers, const char *path, char *err) {
    char *text = NULL;
    size_t len = 0;
    if (file_read_all(path, &text, &len, err) != 0) return COLT_ERR;
    json_error_t jerr;
    json_t *root = json_loadb(text, len, 0, &jerr);
    free(text);
    if (!root) return errorf(err, "%s: not valid JSON: %s (line %d)", path, jerr.text, jerr.line);
    int rc = COLT_ERR;
    memset(cfg, 0, sizeof *cfg);
    json_t *v;
    if (!json_is_object(root)) {
        errorf(err, "%s: not a JSON object", path);
        goto done;
    }
    v = json_object_get(root, "peft_type");
    if (!json_is_string(v) || strcmp(json_string_value(v), "LORA") != 0) {
        errorf(err, "%s: key 'peft_type' must be \"LORA\" (colt loads LoRA adapters only)", path);
        goto done;
    }
    v = json_object_get(root, "r");
    if (!json_is_integer(v) || json_integer_value(v) <= 0 || json_integer_value(v) > 65536) {
        errorf(err, "%s: key 'r' must be a positive integer", path);
        goto done;
    }
    cfg->r = (int)json_integer_value(v);
    v = json_object_get(root, "lora_alpha");
    if (!json_is_number(v) || !(json_number_value(v) > 0)) {
        errorf(err, "%s: key 'lora_alpha' must be a positive number", path);
        goto done;
    }
    cfg->alpha = (float)json_number_value(v);
    v = json_object_get(root, "use_rslora");
    if (v && !json_is_null(v) && !json_is_boolean(v)) {
        errorf(err, "%s: key 'use_rslora' must be true or false", path);
        goto done;
    }
    cfg->use_rslora = json_is_true(v);
    v = json_object_get(root, "lora_dropout"); /* a training setting: kept for a resumed run, unused otherwise */
    if (v && !json_is_null(v) && (!json_is_number(v) || !(json_number_value(v) >= 0 && json_number_value(v) < 1))) {
        errorf(err, "%s: key 'lora_dropout' must be a number in [0, 1)", path);
        goto done;
    }
    cfg->dropout = v && json_is_number(v) ? (float)json_number_value(v) : 0.0f;
    v = json_object_get(root, "target_modules");
    if (json_is_string(v) && strcmp(json_string_value(v), "all-linear") == 0) {
        cfg->targets = LORA_ALL_TARGETS;
    } else if (json_is_array(v) && json_array_size(v) > 0) {
        unsigned *mask = xcalloc((size_t)n_layers, sizeof(unsigned));
        size_t i;
        json_t *e;
        json_array_foreach(v, i, e) {
            if (!json_is_string(e) || add_target_entry(mask, n_layers, json_string_value(e)) != 0) {
                errorf(err, "%s: key 'target_modules': '%s' is not a layer colt adapts (q_proj, k_proj, v_proj, "
                            "o_proj, gate_proj, up_proj, down_proj, in layers 0..%d)",
                       path, json_is_string(e) ? json_string_value(e) : "(not a string)", n_layers - 1);
                free(mask);
                goto done;
            }
        }
        cfg->targets = mask[0];
        for (int l = 1; l < n_layers; l++)
            if (mask[l] != mask[0]) {
                errorf(err, "%s: key 'target_modules' adapts layer %d differently from layer 0 (colt adapts the "
                            "same modules in every layer)", path, l);
                free(mask);
                goto done;
            }
        free(mask);
    } else {
        errorf(err, "%s: key 'target_modules' must be a list of module names or \"all-linear\" (a regular "
                    "expression is not supported)", path);
        goto done;
    }
    /* Keys whose non-default values change the model in ways colt does not implement. */
    struct { const char *key; const char *why; } refused[] = {
        {"use_dora", "DoRA is not supported"},
        {"modules_to_save", "fully trained extra modules are not supported"},
        {"layers_to_transform", "adapting a subset of layers is not supported"},
        {"rank_pattern", "per-module ranks are not supported"},
        {"alpha_pattern", "per-module alphas are not supported"},
        {"fan_in_fan_out", "transposed (Conv1D) weights are not supported"},
        {"target_parameters", "adapting parameters directly is not supported"},
        {"exclude_modules", "excluding modules is not supported"},
        {"lora_bias", "a bias on lora_B is not supported"},
        {"layer_replication", "layer replication is not supported"},
        {"trainable_token_indices", "trainable token embeddings are not supported"},
        {"use_qalora", "QALoRA is not supported"},
    };
    for (size_t k = 0; k < sizeof refused / sizeof refused[0]; k++) {
        v = json_object_get(root, refused[k].key);
        bool unset = !v || json_is_null(v) || json_is_false(v) || (json_is_object(v) && json_object_size(v) == 0) ||
                     (json_is_array(v) && json_array_size(v) == 0);
        if (!unset) {
            errorf(err, "%s: key '%s' is set: %s", path, refused[k].key, refused[k].why);
            goto done;
        }
    }
    v = json_object_get(root, "bias");
    if (v && !json_is_null(v) && (!json_is_string(v) || strcmp(json_string_value(v), "none") != 0)) {
        errorf(err, "%s: key 'bias' must be \"none\" (trained biases are not supported)", path);
        goto done;
    }
    rc = COLT_OK;
done:
    json_decref(root);
    return rc;
}

int model_lora_load(Model *m, const char *dir, char *err) {
    model_weights_changed(m);
    char *config_path = path_join(dir, "adapter_config.json"), *weights_path = path_join(dir, "adapter_model.safetensors");
    LoraConfig cfg;
    SafeTensorsSet set;
    memset(&set, 0, sizeof set);
    int rc = parse_adapter_config(&cfg, m->cfg.num_hidden_layers, config_path, err);
    if (rc == 0) rc = check_lora_config(m, &cfg, config_path, err);
    if (rc == 0) rc = safetensors_open_file(&set, weights_path, err);
    if (rc != 0) goto done;
    lora_alloc(m, &cfg);
    LoraState *ls = m->lora;
    /* Every tensor of the file must be one of the table's: an adapter on a layer colt does not know would be
     * silently dropped otherwise. */
    for (int i = 0; i < set.headers[0].n_tensors && rc == 0; i++) {
        const char *name = set.headers[0].tensors[i].name;
        bool known = false;
        for (int k = 0; k < ls->n_tensors && !known; k++) known = strcmp(ls->tensors[k].name, name) == 0;
        if (!known)
            rc = errorf(err, "%s: tensor '%s' is not an adapter of the layers adapter_config.json names", weights_path,
                        name);
    }
    float *host = NULL, *part = NULL; /* the file's whole tensor; this rank's part under tensor parallelism */
    for (int i = 0; i < ls->n_tensors && rc == 0; i++) {
        const TensorSpec *s = &ls->tensors[i];
        const SafeTensor *st = safetensors_find(&set, s->name, NULL);
        if (!st) {
            rc = errorf(err, "%s: missing tensor '%s'", weights_path, s->name);
            break;
        }
        int64_t whole[2];
        model_tp_whole_shape(m, s, whole);
        if (st->ndim != 2 || st->shape[0] != whole[0] || st->shape[1] != whole[1]) {
            rc = errorf(err, "%s: tensor '%s' has shape [%lld,%lld], the model and r = %d want [%lld,%lld]",
                        weights_path, s->name, (long long)st->shape[0], (long long)(st->ndim > 1 ? st->shape[1] : 0),
                        cfg.r, (long long)whole[0], (long long)whole[1]);
            break;
        }
        host = xrealloc(host, (size_t)whole[0] * (size_t)whole[1] * sizeof(float));
        rc = safetensors_to_f32_finite(host, st, weights_path, err);
        if (rc == 0 && m->tp.tensor_parallel_size > 1) {
            part = xrealloc(part, tensor_spec_numel(s) * sizeof(float));
            model_tp_cut(m, s, host, part);
        }
        if (rc == 0) m->be->upload(m->be, *s->buf, m->tp.tensor_parallel_size > 1 ? part : host, tensor_spec_numel(s));
    }
    free(host);
    free(part);
    if (rc != 0) lora_state_free(m);
done:
    safetensors_set_free(&set);
    free(config_path);
    free(weights_path);
    return rc;
}

static int write_json_file(const char *path, json_t *root, char *err) {
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9));
    json_decref(root);
    COLT_ASSERT(text);
    size_t len = strlen(text);
    text = xrealloc(text, len + 2);
    text[len++] = '\n';
    text[len] = '\0';
    int rc = file_write_atomic(path, text, len, err);
    free(text);
    return rc;
}

/* Tensor parallel: every rank of the group gathers the whole adapters (they
 * are small), the group's rank 0 writes them, and the others wait for its
 * verdict, so the folder exists (or the error is known) when any returns. */
static int write_adapters(const Model *m, const char *dir, const char *base_model, char *err);

int model_lora_save(const Model *m, const char *dir, const char *base_model, char *err) {
    if (!m->lora) return errorf(err, "%s: the model has no LoRA adapters to save", dir);
    if (m->tp.tensor_parallel_size <= 1) return write_adapters(m, dir, base_model, err);
    int rc = m->tp.rank == 0 ? write_adapters(m, dir, base_model, err) : write_adapters(m, NULL, NULL, err);
    float failed = m->tp.rank == 0 && rc != 0; /* rank 0's verdict, summed over the group */
    char sum_err[ERR_LEN];
    if (model_tp_sum_host(m, &failed, sum_err) != 0) {
        if (rc != 0) return rc;
        return errorf(err, "%s: waiting for the tensor-parallel group's rank 0 to write the adapters: %s", dir,
                      sum_err);
    }
    if (rc == 0 && failed != 0.0f)
        return errorf(err, "%s: the tensor-parallel group's rank 0 could not write the adapters", dir);
    return rc;
}

/* dir NULL: a tensor-parallel rank other than 0, which only takes part in the gathers. */
static int write_adapters(const Model *m, const char *dir, const char *base_model, char *err) {
    const LoraState *ls = m->lora;
    SafeTensorWrite *w = xcalloc((size_t)ls->n_tensors, sizeof(SafeTensorWrite));
    int rc = COLT_OK;
    for (int i = 0; i < ls->n_tensors; i++) {
        const TensorSpec *s = &ls->tensors[i];
        int64_t whole[2];
        model_tp_whole_shape(m, s, whole);
        float *host = xmalloc((size_t)whole[0] * (size_t)whole[1] * sizeof(float));
        if (m->tp.tensor_parallel_size <= 1) m->be->download(m->be, host, *s->buf, tensor_spec_numel(s));
        else if (rc == 0) rc = model_tp_gather_tensor(m, s, host, false, err);
        w[i] = (SafeTensorWrite){.name = s->name, .ndim = 2, .shape = {whole[0], whole[1]}, .data = host};
    }
    if (rc == 0 && dir) rc = make_dirs(dir, err);
    if (rc == 0 && dir) {
        char *path = path_join(dir, "adapter_model.safetensors");
        rc = safetensors_write(path, w, ls->n_tensors, DTYPE_F32, err);
        free(path);
    }
    for (int i = 0; i < ls->n_tensors; i++) free((void *)w[i].data);
    free(w);
    if (rc != 0 || !dir) return rc;

    json_t *root = json_object();
    json_object_set_new(root, "peft_type", json_string("LORA"));
    json_object_set_new(root, "task_type", json_string("CAUSAL_LM"));
    json_object_set_new(root, "base_model_name_or_path", json_string(base_model ? base_model : ""));
    json_object_set_new(root, "r", json_integer(ls->cfg.r));
    json_object_set_new(root, "lora_alpha", json_real(ls->cfg.alpha));
    json_object_set_new(root, "lora_dropout", json_real((double)ls->cfg.dropout));
    json_object_set_new(root, "use_rslora", json_boolean(ls->cfg.use_rslora));
    json_t *targets = json_array();
    for (int k = 0; k < LORA_N_TARGETS; k++)
        if (ls->cfg.targets & (1u << k)) json_array_append_new(targets, json_string(TARGET_NAMES[k]));
    json_object_set_new(root, "target_modules", targets);
    json_object_set_new(root, "bias", json_string("none"));
    json_object_set_new(root, "fan_in_fan_out", json_false());
    json_object_set_new(root, "use_dora", json_false());
    json_object_set_new(root, "init_lora_weights", json_true());
    json_object_set_new(root, "inference_mode", json_true());
    json_object_set_new(root, "modules_to_save", json_null());
    json_object_set_new(root, "layers_to_transform", json_null());
    json_object_set_new(root, "rank_pattern", json_object());
    json_object_set_new(root, "alpha_pattern", json_object());
    char *config_path = path_join(dir, "adapter_config.json");
    rc = write_json_file(config_path, root, err);
    free(config_path);
    return rc;
}

/* ---------------------------------------------------------------- merge */

/* The base weight a target adapts, in a layer's weights. */
static void *const *base_weight(const LayerWeights *w, LoraTarget t) {
    switch (t) {
    case LORA_Q: return &w->q_w;
    case LORA_K: return &w->k_w;
    case LORA_V: return &w->v_w;
    case LORA_O: return &w->o_w;
    case LORA_GATE: return &w->gate_w;
    case LORA_UP: return &w->up_w;
    default: return &w->down_w;
    }
}

/* The layer and target of an adapted base weight whose buffer pointer is *buf; false when it is not adapted. */
static bool adapted_weight(const Model *m, void *const *buf, int *layer, LoraTarget *target) {
    if (!m->lora) return false;
    for (int l = 0; l < m->cfg.num_hidden_layers; l++)
        for (int k = 0; k < LORA_N_TARGETS; k++)
            if (*base_weight(&m->layers[l], (LoraTarget)k) == *buf && m->layers[l].lora_a[k]) {
                *layer = l, *target = (LoraTarget)k;
                return true;
            }
    return false;
}

bool lora_merges_into(const Model *m, void *const *buf) {
    int l;
    LoraTarget k;
    return adapted_weight(m, buf, &l, &k);
}

/* Declared in model_internal.h: host[out, in] (base weight tensor `buf` in
 * fp32) += scaling * B A, when buf is an adapted weight (PEFT's merge:
 * delta = (B @ A) * scaling in fp32, then W += delta). */
void lora_merge_into(const Model *m, void *const *buf, float *host) {
    int l;
    LoraTarget k;
    if (!adapted_weight(m, buf, &l, &k)) return;
    const LayerWeights *w = &m->layers[l];
    int in_dim, out_dim, r = m->lora->cfg.r;
    lora_target_dims(&m->local, k, &in_dim, &out_dim); /* this rank's parts: W_part += s B A of them */
    float *a = xmalloc((size_t)r * in_dim * sizeof(float)), *b = xmalloc((size_t)out_dim * r * sizeof(float));
    m->be->download(m->be, a, w->lora_a[k], (size_t)r * in_dim);
    m->be->download(m->be, b, w->lora_b[k], (size_t)out_dim * r);
    float scaling = m->lora->scaling;
#pragma omp parallel for schedule(static)
    for (int o = 0; o < out_dim; o++)
        for (int i = 0; i < in_dim; i++) {
            float s = 0.0f;
            for (int q = 0; q < r; q++) s += b[(size_t)o * r + q] * a[(size_t)q * in_dim + i];
            host[(size_t)o * in_dim + i] += s * scaling;
        }
    free(a);
    free(b);
}

/* ---------------------------------------------------------------- the adapter term */

bool model_lora_active(const Model *m, const LayerWeights *w, LoraTarget t) {
    return m->lora && m->lora->enabled && w->lora_a[t];
}

void model_lora_add(const Model *m, const LayerWeights *w, LoraTarget t, void *y, const void *x, int n, void *t_buf,
                    void *u_buf) {
    if (n <= 0 || !model_lora_active(m, w, t)) return;
    const Backend *be = m->be;
    int in_dim, out_dim, r = m->lora->cfg.r;
    lora_target_dims(&m->local, t, &in_dim, &out_dim);
    be->linear(be, t_buf, x, w->lora_a[t], NULL, n, in_dim, r);
    be->mul_scalar(be, t_buf, t_buf, m->lora->scaling, (size_t)n * r);
    be->linear(be, u_buf, t_buf, w->lora_b[t], NULL, n, r, out_dim);
    be->add(be, y, y, u_buf, (size_t)n * out_dim);
}

/* The widest input (inputs true) or output of the adapted layers, 0 without
 * adapters: the whole model's inputs (lora_dropout draws a row-parallel
 * input's masks over its whole width), this rank's outputs. */
static int widest_adapted(const Model *m, bool inputs) {
    if (!m->lora) return 0;
    int widest = 0;
    for (int k = 0; k < LORA_N_TARGETS; k++) {
        int in_dim, out_dim, unused;
        lora_target_dims(&m->cfg, (LoraTarget)k, &in_dim, &unused);
        lora_target_dims(&m->local, (LoraTarget)k, &unused, &out_dim);
        int dim = inputs ? in_dim : out_dim;
        if ((m->lora->cfg.targets & (1u << k)) && dim > widest) widest = dim;
    }
    return widest;
}

int lora_max_in_dim(const Model *m) { return widest_adapted(m, true); }
int lora_max_out_dim(const Model *m) { return widest_adapted(m, false); }

void model_lora_set_dropout_key(Model *m, uint64_t seed, int64_t key) {
    if (!m->lora) return;
    m->lora->dropout_seed = seed;
    m->lora->dropout_key = key;
}

void model_lora_set_dropout(Model *m, float p) {
    if (m->lora && p >= 0.0f && p < 1.0f) m->lora->cfg.dropout = p;
}

float lora_dropout_active(const Model *m) {
    if (!m->lora || !m->lora->enabled || m->lora->dropout_key < 0) return 0.0f;
    return m->lora->cfg.dropout;
}

int lora_rank(const Model *m) { return m->lora ? m->lora->cfg.r : 0; }
bool model_has_lora(const Model *m) { return m->lora != NULL; }
const LoraConfig *model_lora_config(const Model *m) { return m->lora ? &m->lora->cfg : NULL; }
size_t model_lora_bytes(const Model *m) { return m->lora ? m->lora->arena_numel * dtype_size(m->be->storage) : 0; }
void model_lora_set_enabled(Model *m, bool enabled) {
    if (m->lora && m->lora->enabled != enabled) {
        m->lora->enabled = enabled;
        model_weights_changed_in_place(m); /* the forward's results; the switch is in the layout version */
    }
}
