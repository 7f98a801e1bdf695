/* model_internal.h — the parts of model.c that model_train.c shares: the Model
 * struct, its per-layer weights and the tensor table. Private to src/model/;
 * nothing outside the model layer includes it.
 *
 * Dimension legend: D model width, F MLP width, H query heads, KVH key/value
 * heads, Dh head dim, V vocab. */
#ifndef COLT_MODEL_MODEL_INTERNAL_H
#define COLT_MODEL_MODEL_INTERNAL_H

#include <stdint.h>

#include "model/model.h"

typedef struct LayerWeights {
    void *attn_norm;              /* [D] input_layernorm */
    void *q_w, *k_w, *v_w, *o_w;  /* [H*Dh, D], [KVH*Dh, D], [KVH*Dh, D], [D, H*Dh] */
    void *q_b, *k_b, *v_b, *o_b;  /* [H*Dh], [KVH*Dh], [KVH*Dh], [D]; NULL when absent */
    void *q_norm, *k_norm;        /* [Dh] per-head RMSNorm of q and k before RoPE (Qwen3); NULL when absent */
    void *mlp_norm;               /* [D] post_attention_layernorm */
    void *gate_w, *up_w, *down_w; /* [F, D], [F, D], [D, F] */
} LayerWeights;

typedef enum { INIT_NORMAL = 0, INIT_ONES, INIT_ZEROS } TensorInit;

typedef struct TensorSpec {
    char name[96];
    int ndim;
    int64_t shape[2];
    TensorInit init;
    void **buf; /* where the device buffer lives in Model */
} TensorSpec;

struct Model {
    ModelConfig cfg;
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
};

#define ARENA_ALIGN 64 /* elements: 128-byte aligned tensors in bf16, 256 in fp32 */

/* Element offsets of the table's tensors in one arena (aligned); returns the total. */
size_t model_arena_layout(const TensorSpec *t, int n, size_t *offsets);

/* Every tensor the config needs, in HF names; returns a malloc'd table. When
 * tied, lm_head.weight is not listed (it is embed_tokens). */
TensorSpec *model_tensor_table(Model *m, int *count);

#endif
