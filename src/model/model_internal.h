/* model_internal.h — the parts of model.c that model_train.c shares: the Model
 * struct, its per-layer weights and the tensor table. Private to src/model/;
 * nothing outside the model layer includes it.
 *
 * Dimension legend: D model width, F MLP width, H query heads, KVH key/value
 * heads, Dh head dim, V vocab. */
#ifndef COLT_MODEL_MODEL_INTERNAL_H
#define COLT_MODEL_MODEL_INTERNAL_H

#include <stdint.h>

#include "model/lora.h"
#include "model/model_train.h"
#include "model/model.h"

typedef struct LayerWeights {
    void *attn_norm;              /* [D] input_layernorm */
    void *q_w, *k_w, *v_w, *o_w;  /* [H*Dh, D], [KVH*Dh, D], [KVH*Dh, D], [D, H*Dh] */
    void *q_b, *k_b, *v_b, *o_b;  /* [H*Dh], [KVH*Dh], [KVH*Dh], [D]; NULL when absent */
    void *q_norm, *k_norm;        /* [Dh] per-head RMSNorm of q and k before RoPE (Qwen3); NULL when absent */
    void *mlp_norm;               /* [D] post_attention_layernorm */
    void *gate_w, *up_w, *down_w; /* [F, D], [F, D], [D, F] */
    /* LoRA adapters per LoraTarget: A [r, in], B [out, r]; NULL when not adapted */
    void *lora_a[LORA_N_TARGETS], *lora_b[LORA_N_TARGETS];
} LayerWeights;

typedef enum { INIT_NORMAL = 0, INIT_ONES, INIT_ZEROS } TensorInit;

/* How tensor parallelism cuts a tensor (model.h TensorParallel): not at all,
 * into consecutive blocks of rows, or of columns; or by key/value heads:
 * blocks of rows, one per rank while the group has no more ranks than the
 * model has KV heads, else one KV head per rank, each held by
 * Model.kv_copies consecutive ranks (KV-head replication). */
typedef enum { TP_WHOLE = 0, TP_ROWS, TP_COLS, TP_KV_ROWS } TpSplit;

typedef struct TensorSpec {
    char name[96];
    int ndim;
    int64_t shape[2]; /* this rank's part */
    TpSplit split;
    TensorInit init;
    void **buf; /* where the device buffer lives in Model */
} TensorSpec;

/* Adapters attached to a model (lora.c): their own arena, laid out like the
 * weights' (model_arena_layout over their tensor table). */
typedef struct LoraState {
    LoraConfig cfg;
    float scaling;
    bool enabled;
    uint64_t dropout_seed; /* model_lora_set_dropout_key */
    int64_t dropout_key;   /* -1: no dropout */
    TensorSpec *tensors; /* PEFT names; buffers are the layers' lora_a / lora_b */
    int n_tensors;
    size_t *offsets;
    void *arena;
    size_t arena_numel;
} LoraState;

/* The arena cut into the stages the training passes use the weights in:
 * stage 0 the embedding, 1..L the decoder layers, L+1 the final norm and
 * lm_head. Each stage's tensors are consecutive in the tensor table, so they
 * make one range in each group of the arena (decayed first, then no-decay:
 * model_arena_layout), either possibly empty. Storage that holds a layer at a
 * time (ZeRO-2's gradient windows, ZeRO-3's weight windows) lays a layer out
 * as [group 0 | group 1]; the edge stages (0 and L+1) share one buffer, laid
 * out [stage 0 group 0 | group 1 | stage L+1 group 0 | group 1]. */
typedef struct StageLayout {
    int n_stages;            /* L + 2 */
    size_t (*range)[2][2];   /* [stage][group][lo, hi) in the arena */
    int *stage_of;           /* [n tensors] */
    size_t *place;           /* [n] element offset in its layer window, or in the edge buffer */
    size_t window_numel;     /* the widest layer */
    size_t edge_numel;       /* both edge stages */
    size_t edge_base[2][2];  /* [0 embedding, 1 final norm + lm_head][group]: offset in the edge buffer */
} StageLayout;
/* owner: the model whose layers the table's buffer pointers point into (a
 * model, or a gradient shadow); numel: the arena's elements (checked covered). */
void stage_layout_build(StageLayout *sl, const Model *owner, const TensorSpec *t, int n, const size_t *offsets,
                        size_t numel);
void stage_layout_free(StageLayout *sl);
size_t stage_layout_len(const StageLayout *sl, int stage); /* elements of both groups */
bool stage_is_edge(const StageLayout *sl, int stage);

/* ZeRO-3 (model_params_partition): the weights this rank keeps, and the
 * windows the others' are gathered into while a pass uses them. */
typedef struct ModelPartition {
    size_t lo, hi;            /* this rank's part of the arena */
    size_t numel;             /* the whole arena's elements (how the ranks' parts are cut) */
    void *shard;              /* [hi - lo] storage dtype */
    ParamsGather gather;
    StageLayout sl;
    void *window[2];          /* [window_numel] each: layers alternate */
    int window_stage[2];      /* the stage a window holds (-1: none or stale) */
    void *edges;              /* [edge_numel] the embedding, final norm and lm_head, kept between passes */
    bool edges_valid;
    int in_flight;            /* the window whose gather was started and not waited for, -1 none */
    bool per_layer;           /* windows and edges exist (false: only whole gathers, model_params_gather_all) */
} ModelPartition;

/* Makes stage s's weights present (gathering them when the model is
 * partitioned and they are not) and points the tensors at them; then starts
 * gathering stage `next` (-1: none) so it overlaps the caller's work on s.
 * Does nothing for a whole model. Collective when partitioned: every rank
 * makes the same calls in the same order. */
int model_params_use(Model *m, int stage, int next, char *err);
void model_partition_free(Model *m); /* model_free's part */

struct Model {
    ModelConfig cfg;   /* the whole model's (config.json) */
    /* The dimensions this rank computes with: cfg's, with heads, KV heads,
     * intermediate size and vocabulary divided by the tensor-parallel size. */
    ModelConfig local;
    TensorParallel tp; /* size 1: the whole model */
    int vocab_lo;      /* this rank's first vocabulary row */
    /* Ranks of the group holding the same KV heads: size / num_key_value_heads
     * when the group is larger than the model's KV heads, else 1. */
    int kv_copies;
    const Backend *be;
    void *embed;      /* [V, D] */
    void *final_norm; /* [D] */
    void *lm_head;    /* [V, D]; == embed when tied */
    LayerWeights *layers;
    float *rope_inv_freq; /* [Dh / 2] host: model_rope_inv_freq(cfg), what every rope op gets */
    TensorSpec *tensors; /* the tensor table, built with the model (names and buffers stay valid) */
    int n_tensors;
    /* All weights live in one allocation (the weights' lifetime): tensor i at
     * element offsets[i], each aligned to ARENA_ALIGN elements; gradients and
     * optimizer state use the same layout, so the optimizer runs flat. */
    void *arena;
    size_t arena_numel;
    size_t *offsets;
    LoraState *lora; /* NULL without adapters */
    /* ZeRO-3: NULL, or this rank's part of the weights (arena is then NULL
     * except between model_params_gather_all and model_params_release_all). */
    ModelPartition *part;
    uint64_t weights_version;        /* model_weights_changed[_in_place] */
    uint64_t weights_layout_version; /* model_weights_changed: addresses or kernels may differ */
};

#define ARENA_ALIGN 64 /* elements: 128-byte aligned tensors in bf16, 256 in fp32 */

/* ---- one decoder layer, written once ----
 *
 * Every forward runs model_layer_forward: the inference forward (model_forward)
 * and the training forward (model_train.c) over a contiguous K/V cache
 * [S, max_len, KVD] indexed by host (slot, pos), the engine (model_paged.c)
 * over the paged pool. What differs is which buffers they pass: the training
 * forward keeps every activation its backward reads; the inference forwards
 * keep nothing and pass one residual stream as x_in, x_mid and x_out, one
 * normed buffer as xn_attn and xn_mlp, gate as h, and no q_lin / k_lin
 * (q_norm / k_norm then run in place). Tensor parallelism's collectives sit
 * here once, after the row-parallel projections. */
typedef struct LayerBuffers {
    void *x_in;              /* [N, D] the residual stream entering the layer */
    void *xn_attn;           /* [N, D] input_layernorm output */
    void *q_lin, *k_lin;     /* [N, QD], [N, KVD] projections before q_norm / k_norm; NULL: normed in place */
    void *q, *k, *v;         /* [N, QD], [N, KVD], [N, KVD]: q and k after rope */
    void *att, *lse;         /* [N, QD] attention output; [N, H] [f32] its log-sum-exp, or NULL */
    void *proj;              /* [N, D] o_proj / down_proj output */
    void *x_mid;             /* [N, D] residual after attention (may be x_in) */
    void *xn_mlp;            /* [N, D] post_attention_layernorm output */
    void *gate, *up, *h;     /* [N, F] gate, up; swiglu output (may be gate) */
    void *x_out;             /* [N, D] layer output (may be x_mid); NULL: stop once gate and up exist */
    void *lora_t, *lora_u;   /* LoRA scratch (model_lora_add) */
    /* Optional scratch for one GEMM over weights the arena holds back to back
     * (the engine's): [N, QD + 2 KVD] q|k|v (paged K/V only) and [N, 2F]
     * gate|up; NULL: one GEMM per projection. */
    void *qkv, *gate_up;
} LayerBuffers;

/* Where layer l's K/V go and how the tokens address them. */
typedef struct LayerKv {
    void *k, *v;           /* contiguous: the layer's caches [S, max_len, KVD]; paged: the pool's rows */
    const int *slot, *pos; /* contiguous: host [n], token i in slot[i] at pos[i] */
    int max_len;           /* contiguous: the caches' length */
    const PagedBatch *paged; /* non-NULL: the paged pool, addressed by this batch's [i32] arrays */
    int block_size;        /* paged */
} LayerKv;

/* What adapter t of layer l reads instead of its input x (lora_dropout), or x. */
typedef const void *(*LoraInputFn)(void *ctx, int l, LoraTarget t, const void *x);
/* Layer l over n tokens; lora_input NULL: the adapters read their inputs as
 * they are. With one residual stream (x_in == x_mid == x_out) and a backend
 * with add_rmsnorm, each residual add is fused with the norm after it, the
 * last one with layer l + 1's input norm: such callers run layers 0..L-1 in
 * order over the same buffers (layer l > 0 finds xn_attn ready). The fused
 * ops are bit-identical to the sequences they replace. Fails only when a
 * tensor-parallel collective does. */
int model_layer_forward(const Model *m, int l, const LayerBuffers *b, const LayerKv *kv, int n, LoraInputFn lora_input,
                        void *ctx, char *err);
/* The layer's q|k|v weights (and biases, when present) lie back to back, so
 * one GEMM can read them as a single [QD + 2 KVD, D] tensor; likewise gate|up
 * as one [2F, D] tensor (es: the storage dtype's size). */
bool model_qkv_back_to_back(const LayerWeights *w, const ModelConfig *c, size_t es);
bool model_gate_up_back_to_back(const LayerWeights *w, const ModelConfig *c, size_t es);

/* ---- tensor parallelism's collectives (no-ops for a whole model) ---- */
/* The whole tensor's shape (the file's) of m's table entry s (weights or adapters). */
void model_tp_whole_shape(const Model *m, const TensorSpec *s, int64_t shape[2]);
/* part = this rank's part of whole (the whole tensor of table entry s, fp32 host). */
void model_tp_cut(const Model *m, const TensorSpec *s, const float *whole, float *part);
/* whole[] = the group's parts of table entry s side by side, fp32 host
 * (collective over the group; a tensor kept whole on every rank is this
 * rank's copy). merge: each part with its LoRA adapters folded in first
 * (lora_merge_into on the part, gathered in fp32). Every rank of the group
 * calls it for the same tensors in the same order. */
int model_tp_gather_tensor(const Model *m, const TensorSpec *s, float *whole, bool merge, char *err);
/* *v, a host number, summed over the group (through a one-element [f32] buffer). */
int model_tp_sum_host(const Model *m, float *v, char *err);
/* x[n] (storage dtype) summed over the group. */
int model_tp_sum(const Model *m, void *x, size_t n, char *err);
/* ids[i] = tokens[i] - vocab_lo inside this rank's vocabulary part, else -1 (copied when whole). */
void model_tp_local_ids(const Model *m, int *ids, const int *tokens, int n);
/* x[n, D] = the embedding rows of tokens: this rank's rows, summed over the
 * group (ids: host scratch [n]). */
int model_embed(const Model *m, void *x, const int *tokens, int *ids, int n, char *err);
/* full[k, V] = the group's parts local[k, V / size] side by side (gathered:
 * scratch [size * k * V / size]); a whole model's logits are computed into
 * full directly. */
int model_tp_gather_logits(const Model *m, void *full, const void *local, void *gathered, int k, char *err);

/* The weights' arena holds the weight-decayed tensors first; the ones without
 * decay (model_param_no_weight_decay) start at this element. */
size_t model_weights_no_decay_start(const Model *m);

/* Elements of a table entry (1-D or 2-D). */
static inline size_t tensor_spec_numel(const TensorSpec *s) {
    return s->ndim == 2 ? (size_t)s->shape[0] * (size_t)s->shape[1] : (size_t)s->shape[0];
}

/* Element offsets of the table's tensors in one arena (aligned); returns the total. */
size_t model_arena_layout(const TensorSpec *t, int n, size_t *offsets);

/* Every tensor the config needs, in HF names; returns a malloc'd table. When
 * tied, lm_head.weight is not listed (it is embed_tokens). */
TensorSpec *model_tensor_table(Model *m, int *count);

/* The adapters' tensor table for m's layers (m may be a gradient shadow). */
TensorSpec *lora_tensor_table(Model *m, const LoraConfig *cfg, int *count);
/* Input and output width of a target's linear layer (c: the whole model's
 * config, or m->local for this rank's part). */
void lora_target_dims(const ModelConfig *c, LoraTarget t, int *in_dim, int *out_dim);
/* o_proj and down_proj: their inputs are cut under tensor parallelism (the
 * adapter's A by columns, B whole); the others' outputs are (A whole, B by rows). */
bool lora_target_row_parallel(LoraTarget t);
/* The widest output of an adapted layer on this rank (scratch of model_lora_add), 0 without adapters. */
int lora_max_out_dim(const Model *m);
int lora_rank(const Model *m); /* r, 0 without adapters */
/* The widest input of an adapted layer in the whole model (lora_dropout's
 * scratch: a row-parallel input's masks are drawn over its whole width), 0
 * without adapters. */
int lora_max_in_dim(const Model *m);
/* The lora_dropout probability in effect for a training forward now (0: none). */
float lora_dropout_active(const Model *m);
/* y[n, out] += scaling * B (A x[n, in]) for target t of layer w, when adapted
 * and enabled; scratch t_buf [n, r] and u_buf [n, out] (storage dtype). */
void model_lora_add(const Model *m, const LayerWeights *w, LoraTarget t, void *y, const void *x, int n, void *t_buf,
                    void *u_buf);
bool model_lora_active(const Model *m, const LayerWeights *w, LoraTarget t);
void lora_state_free(Model *m);
/* The adapters' layout (LoraState, tensors, offsets, arena_numel) with no buffers. */
void lora_plan(Model *m, const LoraConfig *cfg);
/* host[out, in] (the fp32 values of the base weight whose device buffer is
 * *buf) += scaling * B A when that weight is adapted; else unchanged. */
void lora_merge_into(const Model *m, void *const *buf, float *host);
bool lora_merges_into(const Model *m, void *const *buf); /* whether that weight is adapted */

#endif
