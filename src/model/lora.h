/* lora.h — LoRA adapters on a model (PEFT's LoraModel): each adapted linear
 * layer y = W x + b gains  + scaling * B (A x), with A [r, in] and B [out, r]
 * trainable and the base weights frozen.
 *
 * The adapters belong to the Model they are attached to: every forward (the
 * trainer's, the engine's, model_forward) applies them in place, with no merge
 * and no copy, so generation after an optimizer step already uses the new
 * adapters. While adapters are attached, the model's trainable parameters
 * (model_param*, model_params_flat, ModelGrads: model_train.h) are the
 * adapters alone, so the optimizer, gradient clipping, the data-parallel
 * gradient exchange and the optimizer-state file work on them unchanged.
 *
 * Files are PEFT's: adapter_config.json + adapter_model.safetensors (tensor
 * names base_model.model.<module>.lora_A.weight), which
 * PeftModel.from_pretrained loads onto the base model. This is not the
 * training loop (train/) nor config parsing of use_peft (train_config.c).
 *
 * On a tensor-parallel model (model.h) each rank holds its part of every
 * adapter, cut along the adapted layer's cut (lora.c); attach, load, save and
 * merge deal in whole tensors, as the files hold them, and save and merge are
 * collective over the group (its rank 0 writes). */
#ifndef COLT_MODEL_LORA_H
#define COLT_MODEL_LORA_H

#include <stdbool.h>

#include "model/model.h"

/* The linear layers of a decoder block an adapter can target, in PEFT's names. */
typedef enum { LORA_Q, LORA_K, LORA_V, LORA_O, LORA_GATE, LORA_UP, LORA_DOWN, LORA_N_TARGETS } LoraTarget;
#define LORA_ALL_TARGETS ((1u << LORA_N_TARGETS) - 1u)
const char *lora_target_name(LoraTarget t); /* "q_proj", ..., "down_proj" */
/* Sets *target for a module name ("q_proj"; also "self_attn.q_proj", "mlp.up_proj"); -1 if none. */
int lora_target_parse(const char *name, LoraTarget *target);

typedef struct LoraConfig {
    int r;            /* rank */
    float alpha;      /* lora_alpha */
    bool use_rslora;  /* scaling alpha / sqrt(r) instead of alpha / r */
    unsigned targets; /* bit (1 << LoraTarget) per adapted layer kind, in every block */
    float dropout;    /* lora_dropout: on the adapters' input, in the training forward only; 0 <= p < 1 */
} LoraConfig;

/* PEFT's scaling: alpha / r, or alpha / sqrt(r) with use_rslora. */
float lora_scaling(const LoraConfig *c);

/* New adapters as PEFT initialises them (init_lora_weights=True): A uniform in
 * +-1/sqrt(in) (kaiming_uniform with a = sqrt(5)), B zero, so the model's
 * output is unchanged until the first update. Draws depend only on seed. */
int model_lora_attach(Model *m, const LoraConfig *cfg, uint64_t seed, char *err);
/* Whether model_lora_attach would take cfg on m (r within the adapted
 * layers' widths, alpha, dropout, targets), adapters already attached aside;
 * where starts the message. Reads only m's config. */
int model_lora_check(const Model *m, const LoraConfig *cfg, const char *where, char *err);
/* Takes the adapters off (the model is its base weights again, and its
 * trainable parameters those weights); nothing without adapters. Moves the
 * weights version (model_weights_changed). */
void model_lora_detach(Model *m);
/* Whether a and b adapt a model the same way at inference: r, alpha,
 * use_rslora and the target modules (dropout, a training setting, aside). */
bool lora_config_same(const LoraConfig *a, const LoraConfig *b);
/* Reads DIR/adapter_config.json and DIR/adapter_model.safetensors (PEFT's
 * format) and attaches them. Configurations colt does not implement (DoRA,
 * bias training, rank/alpha patterns, modules_to_save, layer subsets) are
 * refused with the key named. */
int model_lora_load(Model *m, const char *dir, char *err);
/* Writes DIR/adapter_config.json and DIR/adapter_model.safetensors (fp32),
 * each atomically; base_model names the base model in adapter_config.json.
 * Tensor parallel: every rank of the group calls it; the whole tensors are
 * gathered, its rank 0 writes, and each returns only once that is done (an
 * error of rank 0's is every rank's). */
int model_lora_save(const Model *m, const char *dir, const char *base_model, char *err);
/* model_save of the merged weights W + scaling * B A (PEFT's merge_and_unload):
 * a plain Hugging Face checkpoint. Tensor parallel: each rank merges its parts
 * (W_part += scaling * B_part A, or B A_part) and rank 0 writes the gathered
 * whole (collective, as model_save). */
int model_save_merged(const Model *m, const char *dir, DType dtype, char *err);

bool model_has_lora(const Model *m);
const LoraConfig *model_lora_config(const Model *m); /* NULL without adapters */
size_t model_lora_bytes(const Model *m);             /* device bytes of the adapters (storage dtype) */
/* Turns the adapters' contribution off and on (PEFT's disable_adapter): the
 * reference model of GRPO's KL term is the base model. */
void model_lora_set_enabled(Model *m, bool enabled);
/* lora_dropout (LoraConfig.dropout > 0): PEFT's nn.Dropout on each adapter's
 * input, applied by the model_train_forward that follows with key >= 0 (its
 * backward redraws the same masks: they are a function of seed, key, layer,
 * adapted layer kind and element) and by nothing else — key -1 (the default)
 * is inference: log-prob passes, generation, model_forward. */
void model_lora_set_dropout_key(Model *m, uint64_t seed, int64_t key);
/* Sets lora_dropout (a resumed run's own setting over the checkpoint's); 0 <= p < 1. */
void model_lora_set_dropout(Model *m, float p);

#endif
