/* model.h — a Hugging Face causal LM (LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM):
 * config, weights, forward pass with a KV cache, save; and the same decoder
 * with a score head (*ForSequenceClassification, a reward model), loaded and
 * run by model_load_classifier / model_score_sequences.
 *
 * Written once against the op table (backend/backend.h); it never branches on
 * the device. This is not the generation loop (engine/) nor the tokenizer. */
#ifndef COLT_MODEL_MODEL_H
#define COLT_MODEL_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"

/* Qwen3 is Llama's block plus a per-head RMSNorm of q and k before RoPE
 * (q_norm, k_norm; model_has_qk_norm). */
typedef enum { ARCH_LLAMA = 0, ARCH_QWEN2 = 1, ARCH_QWEN3 = 2 } ModelArch;

/* RoPE frequency schemes (transformers' rope_type); each only changes inv_freq.
 * Zero-initialised configs get ROPE_DEFAULT. */
typedef enum { ROPE_DEFAULT = 0, ROPE_LINEAR = 1, ROPE_LLAMA3 = 2 } RopeType;

#define MODEL_MAX_EOS 8

typedef struct ModelConfig {
    ModelArch arch;
    int hidden_size;          /* D */
    int intermediate_size;    /* F */
    int num_hidden_layers;
    int num_attention_heads;  /* H */
    int num_key_value_heads;  /* KVH (GQA) */
    int head_dim;             /* Dh: config's head_dim when given, else D / H */
    int vocab_size;           /* V */
    int max_position_embeddings;
    float rms_norm_eps;
    float rope_theta;
    RopeType rope_type;
    float rope_factor;        /* linear, llama3: how much longer the context is than trained */
    float rope_low_freq_factor, rope_high_freq_factor; /* llama3 */
    int rope_original_max_position_embeddings;         /* llama3 */
    bool tie_word_embeddings;
    bool attention_bias;      /* q/k/v biases (Qwen2: always true); Llama and Qwen3: o_proj's too */
    int bos_token_id;         /* -1 when absent */
    /* *ForSequenceClassification (a reward model): the rows of its score head
     * [num_labels, D], which replaces lm_head; 0 for a causal LM. */
    int num_labels;
    int eos_token_ids[MODEL_MAX_EOS]; /* config.json's, then generation_config.json's */
    int n_eos;
    DType torch_dtype;
} ModelConfig;

/* Sampling defaults from generation_config.json (what transformers' generate uses). */
typedef struct GenerationDefaults {
    bool present;
    bool do_sample;
    float temperature, top_p, min_p, repetition_penalty;
    int top_k;
} GenerationDefaults;

/* Parses config.json text; name is used in error messages ("DIR/config.json: ..."). */
int model_config_parse(ModelConfig *cfg, const char *json_text, size_t len, const char *name, char *err);
/* Reads DIR/config.json and, if present, DIR/generation_config.json (eos ids, defaults). */
int model_config_load(ModelConfig *cfg, GenerationDefaults *gen, const char *dir, char *err);

/* The RoPE frequencies inv_freq[head_dim / 2] (fp32) that transformers'
 * rotary embedding computes for this config: default 1 / theta^(2j/Dh) (the
 * expression colt's rope ops always used), divided by factor (linear), or
 * Llama 3's per-frequency rescaling with its smooth band (llama3). The rope
 * ops take this table. */
void model_rope_inv_freq(float *inv_freq, const ModelConfig *cfg);
const char *model_rope_type_name(RopeType type);
/* Qwen3: q and k go through a per-head RMSNorm (weights [Dh]) before RoPE. */
bool model_has_qk_norm(const ModelConfig *cfg);
const char *model_arch_name(ModelArch arch); /* "llama", "qwen2", "qwen3": config.json's model_type */

typedef struct Model Model;

/* ---- tensor parallelism (Megatron-style) ----
 *
 * A model made with a TensorParallel of size > 1 holds one rank's part of
 * every layer: the query, key and value heads, the MLP's intermediate columns
 * and the vocabulary cut into `size` equal consecutive parts (q/k/v, gate/up,
 * the embedding and lm_head by rows; o_proj and down_proj by columns; norms
 * whole on every rank). A forward then sums o_proj's and down_proj's outputs
 * and the embedding rows over the group, and gathers logits; a training
 * backward sums the gradients at the inputs of q/k/v and gate/up (and, with
 * LoRA adapters, once per layer the gradients of the adapter tensors every
 * rank holds whole: lora.h). Every rank
 * of the group runs the same calls on the same tokens. The hooks are the
 * caller's (the dist layer); buffers are the backend's. */
typedef struct TensorParallel {
    int rank;                 /* this rank in the group */
    int tensor_parallel_size; /* the group's size: the setting's own name, from the config to here */
    /* x[n] summed over the group, in place (storage dtype, or [f32] when f32). */
    int (*all_reduce)(void *ctx, void *x, size_t n, bool f32, char *err);
    /* out[tensor_parallel_size * n] = every rank's in[n], in rank order. */
    int (*all_gather)(void *ctx, void *out, const void *in, size_t n, bool f32, char *err);
    /* The hooks only enqueue work on the backend's stream: a CUDA graph can record them. */
    bool graph_safe;
    void *ctx;
} TensorParallel;

/* ZeRO-3 for a model that only runs forward passes (a reward model): the
 * data-parallel layer's hooks, as TensorParallel's are the dist layer's.
 * partition keeps this rank's 1/ranks of m's weights and nothing else at rest
 * (the rest given back); gather makes them whole for a pass (collective over
 * the data-parallel ranks, its outcome agreed: every rank calls it, also with
 * nothing to compute); release gives the whole back. */
typedef struct WeightPartition {
    int ranks; /* the data-parallel ranks the weights are cut across */
    int (*partition)(void *ctx, Model *m, char *err);
    int (*gather)(void *ctx, Model *m, char *err);
    void (*release)(void *ctx, Model *m);
    void *ctx;
} WeightPartition;

/* Whether cfg can be cut into `size` parts (heads, KV heads, intermediate
 * size and vocabulary divisible by it; no o_proj bias), else a one-line error
 * naming what does not divide. */
int model_tp_check(const ModelConfig *cfg, int size, char *err);
/* The group's size (1: the whole model) and this rank in it. */
int model_tensor_parallel_size(const Model *m);
int model_tensor_parallel_rank(const Model *m);
bool model_tp_graph_safe(const Model *m); /* the hooks can be recorded in a CUDA graph */

/* Loads DIR (config.json + model.safetensors or sharded with
 * model.safetensors.index.json); weights converted to the backend's storage. */
int model_load(Model **out, const char *dir, const Backend *be, char *err);
/* A *ForSequenceClassification checkpoint (Llama, Qwen2, Qwen3: the decoder's
 * model.* tensors and score.weight [num_labels, D], no bias) on this backend:
 * whole (tp NULL or of size 1), or this rank's part of the decoder cut as a
 * causal LM's is (model_tp_check), the score head whole on every rank (the
 * final hidden state is whole there: no gather). Its forward's "logits" are
 * the score head's [num_labels] per token. model_load refuses such a folder,
 * and this function a causal LM, each with a line saying what the folder is. */
int model_load_classifier(Model **out, const char *dir, const Backend *be, const TensorParallel *tp, char *err);
/* scores[i * num_labels + k] = label k of the score head on the final hidden
 * state of sequence i's last token whose id is not pad_id, as transformers'
 * *ForSequenceClassification.forward picks it in a right-padded batch (the
 * last non-pad position; position 0 when every token is pad_id; the last
 * token when pad_id < 0). Each sequence is run unpadded and only up to that
 * token, which gives the padded batch's numbers: the causal mask hides the
 * padding from every real token. ids[i][0..lens[i]), lens[i] >= 1. Several
 * sequences share a forward call (one cache slot each); the state is made and
 * freed here, so nothing stays allocated between calls. A tensor-parallel
 * classifier's call is collective: every rank of its group passes the same
 * sequences. */
int model_score_sequences(Model *m, float *scores, const int *const *ids, const int *lens, int n, int pad_id,
                          char *err);
/* A randomly initialised model (normal(0, 0.02) weights, norms = 1, biases = 0). */
int model_create_random(Model **out, const ModelConfig *cfg, uint64_t seed, const Backend *be, char *err);
/* The same, keeping this rank's part (tp NULL or of size 1: the whole model).
 * Each rank reads (or draws) whole tensors one at a time and keeps its part. */
int model_load_tp(Model **out, const char *dir, const Backend *be, const TensorParallel *tp, char *err);
int model_create_random_tp(Model **out, const ModelConfig *cfg, uint64_t seed, const Backend *be,
                           const TensorParallel *tp, char *err);
/* Writes the checkpoint model_create_random + model_save would, tensor by
 * tensor in chunks, without holding the weights in memory (for 7B shapes). */
int model_save_random(const ModelConfig *cfg, uint64_t seed, const char *dir, DType dtype, char *err);
/* DIR/config.json and generation_config.json alone, as model_save_random
 * writes them (a shape to plan with `colt train --dry_run`, no weights). */
int model_save_config(const ModelConfig *cfg, const char *dir, DType dtype, char *err);
/* Writes DIR/config.json, DIR/generation_config.json and DIR/model.safetensors
 * (F32 or BF16), each atomically, streaming the weights from the device (no
 * host copy of the model). Larger than MODEL_SAVE_SHARD_BYTES: shards
 * model-0000k-of-0000N.safetensors and model.safetensors.index.json, as
 * transformers' save_pretrained writes them (a stale file of the other layout
 * is removed). transformers loads the result. The base weights only: LoRA
 * adapters are saved by model_lora_save, or merged in by model_save_merged
 * (lora.h). model_save_sharded: the same with another shard limit (0: the
 * default). */
/* A tensor-parallel model's save is collective over its group: the group's
 * rank 0 writes the whole tensors, gathered one at a time; the others take
 * part in the gathers and write nothing. */
#define MODEL_SAVE_SHARD_BYTES ((size_t)5000000000) /* transformers' 5GB */
int model_save(const Model *m, const char *dir, DType dtype, char *err);
int model_save_sharded(const Model *m, const char *dir, DType dtype, size_t max_shard_bytes, char *err);
void model_free(Model *m);
const ModelConfig *model_config(const Model *m); /* the whole model's, also on a tensor-parallel rank */
const Backend *model_backend(const Model *m);
const float *model_rope_table(const Model *m); /* model_rope_inv_freq of its config, [Dh / 2], host */
/* A counter of changes to the weights the forward computes with. Whatever
 * writes them (an optimizer step, LoRA adapters attached, loaded or switched,
 * ZeRO-3's gathers, a weight update from outside) calls model_weights_changed;
 * the engine compares the version at every step, so nothing it computed from
 * older weights (K/V, cached prefix blocks, recorded graphs) is used again.
 * model_weights_changed_in_place is the narrower promise of a writer that only
 * changes values (an optimizer step): every tensor keeps its address and the
 * forward launches the same kernels, so recorded graphs (which hold addresses,
 * not values) stay valid; the layout version moves only with
 * model_weights_changed, and with the LoRA adapters switched off or on
 * (back to its value when they are switched back). */
uint64_t model_weights_version(const Model *m);
uint64_t model_weights_layout_version(const Model *m);
void model_weights_changed(Model *m);
void model_weights_changed_in_place(Model *m);

/* Per-run state: the KV cache (n_slots sequences of up to max_len tokens) and
 * scratch activations for up to max_tokens tokens per forward call. Everything
 * is allocated here, once; forward calls do not allocate. */
typedef struct ModelState ModelState;
int model_state_create(ModelState **out, const Model *m, int n_slots, int max_len, int max_tokens, char *err);
void model_state_free(ModelState *st);
size_t model_state_bytes(const ModelState *st);  /* device bytes: KV cache + scratch */
size_t model_weight_bytes(const Model *m);       /* device bytes of the weights this rank holds now (zero_stage 3: its part) */
/* A model for planning memory (train/memory_plan.h): the layout of cfg's
 * weights (and of LoRA adapters when lora is not NULL) with no buffers, so the
 * size functions here, in model_train.h and in engine.h answer as for a
 * loaded model on a backend of be's storage and logits_chunk_rows (be needs
 * nothing else). Nothing may run on it; model_free frees it. */
struct LoraConfig;
/* tensor_parallel_size > 1: the layout of one rank's part under tensor parallelism. */
Model *model_plan_shell(const ModelConfig *cfg, const Backend *be, const struct LoraConfig *lora, int tensor_parallel_size);
/* A whole model's weights into a tensor-parallel part (the weight channel of
 * a tensor-parallel colt serve, parallel/weight_sync.c): the whole model's arena
 * — as a whole model of m's config lays it out on a backend of m's storage
 * dtype, padding included — given in pieces in order from its first byte,
 * each in m's backend memory and a whole number of storage elements; m's part
 * of each tensor (model_tp_cut's rule, replicated KV heads included) is copied
 * out of them on the device, as they come (a column-cut tensor once complete,
 * from a staged copy). *whole_bytes: the stream's length. Backend memory: one
 * of the largest column-cut tensor. */
typedef struct ModelPartReceiver ModelPartReceiver;
ModelPartReceiver *model_part_receiver_create(Model *m, size_t *whole_bytes);
void model_part_receiver_put(ModelPartReceiver *r, const void *bytes, size_t n);
bool model_part_receiver_done(const ModelPartReceiver *r); /* every byte came */
void model_part_receiver_free(ModelPartReceiver *r);
/* transformers' Trainer exempts these from weight decay (biases, norms). */
bool model_param_no_weight_decay(const char *name);

/* Runs n tokens (n <= max_tokens). Token i belongs to cache slot slot[i] at
 * position pos[i]: its K/V are stored at (slot[i], pos[i]), then it attends to
 * positions 0..pos[i] of that slot. So a call can hold prefill chunks and decode
 * steps of many sequences at once. For the tokens with want_logits[i] != 0 (all
 * when want_logits is NULL), fp32 logits go to host memory logits[k, V] in
 * token order. Errors: token id out of range, position >= max_len. */
int model_forward(Model *m, ModelState *st, const int *tokens, const int *slot, const int *pos, int n,
                  const uint8_t *want_logits, float *logits, char *err);

/* ---- the generation engine's forward (engine/engine.h): paged KV cache ----
 *
 * KV pool: per layer, K and V rows [n_blocks * block_size, KVH*Dh] in the
 * storage dtype; a sequence's position p lives in row
 * block_table[p / block_size] * block_size + p % block_size. */
typedef struct KvPool {
    const Backend *be;
    int n_layers, n_blocks, block_size, kv_dim;
    void **k, **v; /* [n_layers] */
    size_t bytes;
} KvPool;
size_t kv_pool_block_bytes(const Model *m, int block_size); /* device bytes of one block, all layers */
void kv_pool_create(KvPool *pool, const Model *m, int n_blocks, int block_size);
void kv_pool_free(KvPool *pool);

/* One forward call of the engine, described by [i32] buffers (backend.h) so
 * it can be replayed as a CUDA graph: token i (tokens[i]) of sequence seq[i]
 * at position pos[i], K/V stored at pool row slot_mapping[i]; seq[i] < 0 marks
 * padding. Logits are computed for n_logits rows: the tokens listed in
 * logit_rows, or (logit_rows NULL) the first n_logits tokens. */
typedef struct PagedBatch {
    int n, n_logits;
    const void *tokens, *pos, *seq, *slot_mapping, *logit_rows;
    const void *block_tables; /* [n_seqs, max_blocks] */
    int max_blocks;
    /* A decode plan (model_decode_plan_create) when every token is the next one
     * of its own sequence (a pure decode step): the backend may then run all
     * layers in one launch. NULL: the op sequence. */
    void *decode_plan;
    bool decode; /* every token is the next one of its own sequence (a pure decode step) */
} PagedBatch;

/* The backend's all-layers decode kernel (backend.h decode_layers) bound to
 * this model's weights and the pool `kv` (tables max_blocks wide); NULL when
 * the backend has none or does not support the model (the engine then runs
 * the op sequence). Free it before the pool. */
void *model_decode_plan_create(const Model *m, const KvPool *kv, int max_blocks);
void model_decode_plan_free(const Model *m, void *plan);

/* Scratch activations for engine calls of up to max_tokens tokens and
 * max_logit_rows rows of logits; allocated here once. */
typedef struct PagedState PagedState;
int paged_state_create(PagedState **out, const Model *m, int max_tokens, int max_logit_rows, char *err);
void paged_state_free(PagedState *st);
size_t paged_state_bytes(const PagedState *st);
size_t paged_state_plan_bytes(const Model *m, int max_tokens, int max_logit_rows); /* what create would take */
/* Whether st's LoRA scratch is enough for the adapters m has now (they may
 * have been attached after st was made: colt serve's weight channel). */
bool paged_state_fits(const PagedState *st, const Model *m);
/* The logits of the last call: [n_logits, V] in the storage dtype, on the device. */
void *paged_state_logits(PagedState *st);
/* Runs the batch; issues ops only (no host-side checks, no synchronisation),
 * so it can be captured. The caller (the engine) validates ids and positions.
 * Fails only when a tensor-parallel collective does. */
int model_forward_paged(Model *m, PagedState *st, const KvPool *kv, const PagedBatch *b, char *err);

#endif
