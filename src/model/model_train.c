/* model_train.c — the training forward (activations kept, per-token log-probs
 * and entropies of targets under logits / temperature) and its backward pass
 * to every parameter's gradient, written once against the op table.
 *
 * Attention reuses the inference layout: each layer's K/V go to a [S, L, KVD]
 * buffer indexed by (slot, pos), and the backward accumulates dK/dV into the
 * same layout and gathers them back to tokens. The lm_head and log-softmax run
 * on chunks of the backend's logits_chunk_rows target rows, so [N, V] logits never exist whole; the
 * backward recomputes each chunk's logits instead of storing them. Only rows
 * with a target (forward) or a non-zero dlogprob (backward) pay for the
 * lm_head. This is not the optimizer (train/) and keeps no gradient
 * checkpointing: every layer's activations are stored.
 *
 * Dimension legend: N tokens, D width, F MLP width, H query heads, KVH
 * key/value heads, Dh head dim, QD = H*Dh, KVD = KVH*Dh, V vocab, S slots,
 * L max length per slot, C rows per lm_head chunk. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "model/model_internal.h"
#include "model/model_train.h"


/* ---------------------------------------------------------------- parameters */

/* The trainable parameters: the weights, or the adapters alone while LoRA
 * adapters are attached (the base weights are frozen then). */
int model_param_count(const Model *m) { return m->lora ? m->lora->n_tensors : m->n_tensors; }

ModelParam model_param(const Model *m, int index) {
    COLT_ASSERT(index >= 0 && index < model_param_count(m));
    const TensorSpec *s = m->lora ? &m->lora->tensors[index] : &m->tensors[index];
    return (ModelParam){.name = s->name, .data = *s->buf, .numel = tensor_spec_numel(s)};
}

int model_param_copies(const Model *m, int index) {
    COLT_ASSERT(index >= 0 && index < model_param_count(m));
    if (m->tp.tensor_parallel_size <= 1) return 1;
    TpSplit split = m->lora ? m->lora->tensors[index].split : m->tensors[index].split;
    return split == TP_WHOLE ? m->tp.tensor_parallel_size : split == TP_KV_ROWS ? m->kv_copies : 1;
}

size_t model_param_offset(const Model *m, int index) {
    COLT_ASSERT(index >= 0 && index < model_param_count(m));
    return m->lora ? m->lora->offsets[index] : m->offsets[index];
}

void *model_params_flat(const Model *m, size_t *numel) {
    *numel = m->lora ? m->lora->arena_numel : m->arena_numel;
    return m->lora ? m->lora->arena : m->arena;
}

void *model_weights_flat(const Model *m, size_t *numel) {
    *numel = m->arena_numel;
    return m->arena;
}

int model_weight_count(const Model *m) { return m->n_tensors; }

ModelParam model_weight(const Model *m, int index) {
    COLT_ASSERT(index >= 0 && index < m->n_tensors);
    const TensorSpec *s = &m->tensors[index];
    return (ModelParam){.name = s->name, .data = *s->buf, .numel = tensor_spec_numel(s)};
}

size_t model_params_no_decay_start(const Model *m) {
    if (!m->lora) return model_weights_no_decay_start(m);
    size_t start = m->lora->arena_numel; /* lora_A / lora_B are all decayed, as the Trainer groups them */
    for (int i = 0; i < m->lora->n_tensors; i++)
        if (model_param_no_weight_decay(m->lora->tensors[i].name) && m->lora->offsets[i] < start)
            start = m->lora->offsets[i];
    return start;
}

/* shadow is a Model whose weight pointers are the gradient buffers: walking
 * its own tensor table fills them in parameter order, so the backward reads
 * shadow.layers[l].q_w as "the gradient of q_w". */
struct ModelGrads {
    const Backend *be;
    int n;
    void **bufs;    /* [n] views into flat */
    size_t *numel;  /* [n] */
    void *flat;     /* [flat_numel] fp32, the model's arena layout */
    size_t flat_numel;
    Model shadow;
    /* The backward's announcements (model_grads_on_ready), one per stage and
     * group of sl (embedding, layers, final norm and lm_head). */
    GradsReadyFn ready;
    void *ready_ctx;
    StageLayout sl;
    bool lora;                   /* the adapters' gradients (made for a model with LoRA attached) */
    /* Windowed (model_grads_create_windowed): a layer's gradients exist only
     * while its backward runs and its announcement is handled, in one of two
     * windows (layers alternate); the edge stages (embedding, final norm,
     * lm_head) live in `flat`, which then holds only them, as sl lays them out. */
    bool windowed;
    TensorSpec *tensors;         /* [n] the shadow's table (re-pointed per layer) */
    void *window[2];
    void *(*stage_data)[2];      /* [L + 2][group]: where the stage's range lives now */
};

void model_grads_on_ready(ModelGrads *g, GradsReadyFn fn, void *ctx) {
    g->ready = fn;
    g->ready_ctx = ctx;
}

static int grads_announce(ModelGrads *g, int stage, char *err) {
    if (!g->ready) return COLT_OK;
    for (int grp = 0; grp < 2; grp++) {
        const size_t *r = g->sl.range[stage][grp];
        if (r[1] > r[0] && g->ready(g->ready_ctx, r[0], r[1], err) != 0) return COLT_ERR;
    }
    return COLT_OK;
}

/* The gradients' tensor table (the shadow's: the weights', or the adapters'
 * with LoRA attached) and its layout; fills g's common fields. */
static TensorSpec *grads_table(ModelGrads *g, const Model *m, const size_t **offsets) {
    g->be = m->be;
    g->n = model_param_count(m);
    g->bufs = xcalloc((size_t)g->n, sizeof(void *));
    g->numel = xcalloc((size_t)g->n, sizeof(size_t));
    g->shadow.cfg = m->cfg;
    g->shadow.local = m->local;
    g->shadow.tp = m->tp;
    g->shadow.be = m->be;
    g->shadow.layers = xcalloc((size_t)m->cfg.num_hidden_layers, sizeof(LayerWeights));
    /* With adapters the shadow's base weights stay NULL: the backward then
     * computes no gradient for them (frozen), only the adapters'. */
    int n = 0;
    TensorSpec *t = m->lora ? lora_tensor_table(&g->shadow, &m->lora->cfg, &n) : model_tensor_table(&g->shadow, &n);
    *offsets = m->lora ? m->lora->offsets : m->offsets;
    COLT_ASSERT(n == g->n);
    model_params_flat(m, &g->flat_numel);
    stage_layout_build(&g->sl, &g->shadow, t, n, *offsets, g->flat_numel);
    for (int i = 0; i < n; i++) g->numel[i] = tensor_spec_numel(&t[i]);
    g->lora = m->lora != NULL;
    return t;
}

int model_grads_create(ModelGrads **out, const Model *m, char *err) {
    (void)err;
    ModelGrads *g = xcalloc(1, sizeof(ModelGrads));
    const size_t *offsets = NULL;
    TensorSpec *t = grads_table(g, m, &offsets);
    /* One fp32 allocation in the parameters' layout: zeroing, the global norm
     * and clipping are single calls over it. */
    g->flat = m->be->alloc_f32(m->be, g->flat_numel);
    m->be->zero_f32(m->be, g->flat, g->flat_numel);
    for (int i = 0; i < g->n; i++) {
        g->bufs[i] = (char *)g->flat + offsets[i] * sizeof(float);
        *t[i].buf = g->bufs[i];
    }
    free(t);
    if (m->cfg.tie_word_embeddings) g->shadow.lm_head = g->shadow.embed;
    *out = g;
    return COLT_OK;
}

static size_t windowed_bytes(const StageLayout *sl) {
    return (sl->edge_numel + 2 * (sl->window_numel ? sl->window_numel : 1)) * 4;
}

/* Points stage s's tensors into window s & 1 and zeroes the part they use. */
static void window_begin(ModelGrads *g, int stage) {
    if (!g->windowed || stage_is_edge(&g->sl, stage)) return;
    void *w = g->window[stage & 1];
    for (int i = 0; i < g->n; i++)
        if (g->sl.stage_of[i] == stage) *g->tensors[i].buf = (char *)w + g->sl.place[i] * sizeof(float);
    size_t len0 = g->sl.range[stage][0][1] - g->sl.range[stage][0][0];
    g->stage_data[stage][0] = w;
    g->stage_data[stage][1] = (char *)w + len0 * sizeof(float);
    g->be->zero_f32(g->be, w, stage_layout_len(&g->sl, stage));
}

int model_grads_create_windowed(ModelGrads **out, const Model *m, char *err) {
    (void)err;
    ModelGrads *g = xcalloc(1, sizeof(ModelGrads));
    const size_t *offsets = NULL;
    TensorSpec *t = grads_table(g, m, &offsets);
    g->windowed = true;
    int L = m->cfg.num_hidden_layers;
    g->stage_data = xcalloc((size_t)L + 2, sizeof *g->stage_data);
    /* The edge stages in flat, laid out as sl says. */
    g->flat = m->be->alloc_f32(m->be, g->sl.edge_numel);
    m->be->zero_f32(m->be, g->flat, g->sl.edge_numel);
    size_t window = g->sl.window_numel ? g->sl.window_numel : 1;
    for (int w = 0; w < 2; w++) g->window[w] = m->be->alloc_f32(m->be, window);
    for (int i = 0; i < g->n; i++)
        if (stage_is_edge(&g->sl, g->sl.stage_of[i])) {
            g->bufs[i] = (char *)g->flat + g->sl.place[i] * sizeof(float);
            *t[i].buf = g->bufs[i];
        }
    int edges[2] = {0, L + 1};
    for (int e = 0; e < 2; e++)
        for (int grp = 0; grp < 2; grp++)
            g->stage_data[edges[e]][grp] = (char *)g->flat + g->sl.edge_base[e][grp] * sizeof(float);
    g->tensors = t;
    if (m->cfg.tie_word_embeddings) g->shadow.lm_head = g->shadow.embed;
    *out = g;
    return COLT_OK;
}

bool model_grads_windowed(const ModelGrads *g) { return g->windowed; }

void *model_grads_range_data(const ModelGrads *g, size_t lo) {
    for (int s = 0; s < g->sl.n_stages; s++)
        for (int grp = 0; grp < 2; grp++)
            if (g->sl.range[s][grp][0] == lo && g->sl.range[s][grp][1] > lo)
                return g->windowed ? g->stage_data[s][grp] : (char *)g->flat + lo * sizeof(float);
    return NULL;
}

size_t model_grads_plan_bytes(const Model *m, bool windowed) {
    size_t numel = 0;
    model_params_flat(m, &numel);
    if (!windowed) return numel * 4;
    /* the layout alone: a windowed set's sizes without its buffers */
    Model shadow;
    memset(&shadow, 0, sizeof shadow);
    shadow.cfg = m->cfg;
    shadow.local = m->local;
    shadow.tp = m->tp;
    shadow.layers = xcalloc((size_t)m->cfg.num_hidden_layers, sizeof(LayerWeights));
    int n = 0;
    TensorSpec *t = m->lora ? lora_tensor_table(&shadow, &m->lora->cfg, &n) : model_tensor_table(&shadow, &n);
    StageLayout sl;
    stage_layout_build(&sl, &shadow, t, n, m->lora ? m->lora->offsets : m->offsets, numel);
    size_t bytes = windowed_bytes(&sl);
    stage_layout_free(&sl);
    free(t);
    free(shadow.layers);
    return bytes;
}

void model_grads_free(ModelGrads *g) {
    if (!g) return;
    g->be->free(g->be, g->flat);
    for (int w = 0; w < 2; w++)
        if (g->window[w]) g->be->free(g->be, g->window[w]);
    free(g->tensors);
    free(g->stage_data);
    free(g->bufs);
    free(g->numel);
    free(g->shadow.layers);
    stage_layout_free(&g->sl);
    free(g);
}

void model_grads_zero(ModelGrads *g) {
    if (!g->windowed) g->be->zero_f32(g->be, g->flat, g->flat_numel);
}

void *model_grads_flat(const ModelGrads *g, size_t *numel) {
    *numel = g->flat_numel;
    return g->windowed ? NULL : g->flat;
}

void *model_grad(const ModelGrads *g, int index) {
    COLT_ASSERT(index >= 0 && index < g->n);
    return g->bufs[index];
}

/* ---------------------------------------------------------------- state */

typedef struct LayerActivations {
    void *x_in;              /* [N, D] residual stream entering the layer */
    void *xn_attn;           /* [N, D] input_layernorm output */
    void *q_lin, *k_lin;     /* [N, QD], [N, KVD] q_proj / k_proj output before q_norm / k_norm (Qwen3; else NULL) */
    void *q;                 /* [N, QD] after rope */
    void *k_cache, *v_cache; /* [S, L, KVD], K after rope */
    void *att;               /* [N, QD] attention output (o_proj input) */
    void *lse;               /* [N, H] [f32] attention log-sum-exp, for its backward */
    void *x_mid;             /* [N, D] residual after attention */
    void *xn_mlp;            /* [N, D] post_attention_layernorm output */
    void *gate, *up;         /* [N, F] before the activation */
} LayerActivations;

struct TrainState {
    const Backend *be;
    int n_layers, n_slots, max_len, max_tokens;
    int chunk;                          /* target rows per lm_head chunk */
    bool recompute;                     /* activations recomputed layer by layer in the backward */
    size_t bytes;                       /* device memory of the buffers below */
    /* the last forward */
    bool have_forward;
    int n;
    float temperature;
    int *tokens, *slot, *pos, *targets; /* host [N] */
    unsigned char *seen;                /* host [S, L]: position present in the call */
    int *rows;                          /* host [N]: token index of each lm_head row */
    int *chunk_targets;                 /* host [C] */
    float *chunk_host;                  /* host [C] */
    /* tensor parallel (vocabulary-parallel log-softmax; NULL otherwise) */
    int *ids;                           /* host [N]: tokens in this rank's vocabulary part, else -1 */
    float *row_lse;                     /* host [N]: each target row's log-sum-exp (the backward's) */
    float *row_pz;                      /* host [N]: each target row's sum p z (the entropy's backward) */
    float *stats_host;                  /* host [size, C, 4]: the group's logits_shard_stats */
    void *chunk_stats, *stats_all;      /* [C, 4], [size, C, 4] [f32] */
    void *dqk_norm;                     /* [2, Dh] [f32]: the q/k norms' gradients of this rank's heads (Qwen3) */
    /* KV heads replicated (Model.kv_copies > 1): [blocks, KV_GRADS] [f32], the
     * k/v projections' gradients of this rank's query heads in its KV block's
     * row, zeros elsewhere, summed over the group (kv_grads_sum) */
    void *dkv_blocks;
    LayerActivations *act;              /* [n_layers] */
    void *x_final, *xn_final;           /* [N, D] */
    /* scratch (forward and backward) */
    void *k, *v;                        /* [N, KVD]; dK, dV in the backward */
    void *proj;                         /* [N, D] */
    void *h;                            /* [N, F] swiglu output */
    void *chunk_rows, *chunk_drows;     /* [C, D] */
    void *chunk_logits;                 /* [C, V]; d logits in the backward */
    void *chunk_lp, *chunk_ent;         /* [C] */
    /* backward only */
    void *dres, *dxn;                   /* [N, D] */
    void *dq, *datt;                    /* [N, QD] */
    void *dq_lin, *dk_lin;              /* [N, QD], [N, KVD]: d q_proj / k_proj output (Qwen3; else NULL) */
    /* LoRA (NULL without adapters): [N, r] A x (scaled) and its gradient, [N, widest adapted output] B (A x) */
    void *lora_t, *lora_dt, *lora_u;
    /* lora_dropout (NULL without): [N, widest adapted input of the whole model] an adapter's dropped
     * input and d of it (also the whole-width scratch of a row-parallel input's masks) */
    void *lora_xd, *lora_dxd;
    /* tensor parallel LoRA: [adapted layer kinds, r * D] [f32] this rank's shares of the gradients of the
     * adapter tensors every rank holds whole (lora_shared_grad), summed over the group once per layer */
    void *lora_shared;
    int64_t dropout_key;                /* the forward's (model_lora_set_dropout_key), -1: none */
    const Model *model;                 /* the model of the pass running (lora_input's) */
    uint64_t dropout_seed;
    float dropout_p;
    void *dk_cache, *dv_cache;          /* [S, L, KVD] */
    void *dgate, *dup, *dh;             /* [N, F] */
};

size_t train_state_bytes(const TrainState *st) { return st ? st->bytes : 0; }

int model_grads_sum_squares(const Model *m, const ModelGrads *g, double *out, char *err) {
    const Backend *be = m->be;
    if (m->tp.tensor_parallel_size <= 1) {
        *out = be->sum_squares(be, g->flat, g->flat_numel); /* padding is 0 */
        return COLT_OK;
    }
    double mine = 0.0;
    for (int i = 0; i < g->n; i++) {
        double sq = be->sum_squares(be, g->bufs[i], g->numel[i]);
        mine += sq / model_param_copies(m, i); /* the same on its copies' ranks: once in the sum */
    }
    float v = (float)mine;
    int rc = model_tp_sum_host(m, &v, err);
    *out = v;
    return rc;
}

size_t model_grads_bytes(const ModelGrads *g) {
    if (!g) return 0;
    return g->windowed ? windowed_bytes(&g->sl) : g->flat_numel * 4;
}

/* Rows per lm_head chunk: the backend's preference, at most the batch. */
static int st_chunk_rows(const Backend *be, int max_tokens) {
    int rows = be->logits_chunk_rows > 0 ? be->logits_chunk_rows : 64;
    return rows < max_tokens ? rows : max_tokens;
}

/* KV-head replication: one KV block's gradients summed over its copies' ranks:
 * k_proj, k bias, v_proj, v bias, and the k/v adapters' B (r columns each,
 * when adapted). Frozen tensors (under LoRA) keep their slots, unused. */
static size_t kv_grads_numel(const Model *m) {
    size_t KVD = (size_t)m->local.num_key_value_heads * m->local.head_dim, D = (size_t)m->local.hidden_size;
    return 2 * (KVD * D + KVD) + 2 * KVD * (size_t)lora_rank(m);
}
static size_t kv_blocks_numel(const Model *m) {
    return (size_t)(m->tp.tensor_parallel_size / m->kv_copies) * kv_grads_numel(m);
}

/* Tensor parallel LoRA: elements of lora_shared (one r * D slot per adapted
 * layer kind), 0 for a whole model or without adapters. */
static size_t lora_shared_numel(const Model *m) {
    if (!m->lora || m->tp.tensor_parallel_size <= 1) return 0;
    size_t kinds = 0;
    for (int k = 0; k < LORA_N_TARGETS; k++) kinds += (m->lora->cfg.targets >> k) & 1u;
    return kinds * (size_t)m->lora->cfg.r * (size_t)m->local.hidden_size;
}

size_t train_state_plan_bytes(const Model *m, int n_slots, int max_len, int max_tokens, bool recompute) {
    const ModelConfig *c = &m->local; /* this rank's part under tensor parallelism */
    size_t N = (size_t)max_tokens, D = (size_t)c->hidden_size, F = (size_t)c->intermediate_size,
           QD = (size_t)c->num_attention_heads * c->head_dim, KVD = (size_t)c->num_key_value_heads * c->head_dim,
           V = (size_t)c->vocab_size, SL = (size_t)n_slots * max_len, C = (size_t)st_chunk_rows(m->be, max_tokens);
    size_t es = dtype_size(m->be->storage);
    size_t H = (size_t)c->num_attention_heads;
    size_t qk_lin = model_has_qk_norm(c) ? (N * QD + N * KVD) * es : 0; /* q_lin, k_lin; dq_lin, dk_lin */
    size_t layer_rest = (3 * N * D + 2 * N * QD + 2 * SL * KVD + 2 * N * F) * es + N * H * 4 + qk_lin; /* all but x_in */
    size_t layers = (size_t)c->num_hidden_layers * N * D * es + (recompute ? 1 : (size_t)c->num_hidden_layers) * layer_rest;
    size_t lora = (2 * N * (size_t)lora_rank(m) + N * (size_t)lora_max_out_dim(m)) * es;
    if (m->lora && m->lora->cfg.dropout > 0.0f) lora += 2 * N * (size_t)lora_max_in_dim(m) * es;
    lora += lora_shared_numel(m) * 4;
    size_t tp_stats = m->tp.tensor_parallel_size > 1 ? (size_t)(m->tp.tensor_parallel_size + 1) * C * 4 * 4 + (qk_lin ? 2 * (size_t)c->head_dim * 4 : 0) +
                                           (m->kv_copies > 1 ? kv_blocks_numel(m) * 4 : 0)
                                     : 0;
    size_t shared = (5 * N * D + 2 * N * KVD + 2 * N * QD + 4 * N * F + 2 * C * D + C * V) * es + 2 * C * 4 +
                    2 * SL * KVD * 4 + qk_lin + lora + tp_stats;
    return layers + shared;
}

int train_state_create(TrainState **out, const Model *m, int n_slots, int max_len, int max_tokens, char *err) {
    return train_state_create_recompute(out, m, n_slots, max_len, max_tokens, false, err);
}

int train_state_create_recompute(TrainState **out, const Model *m, int n_slots, int max_len, int max_tokens,
                                 bool recompute, char *err) {
    *out = NULL;
    if (n_slots <= 0 || max_len <= 0 || max_tokens <= 0)
        return errorf(err, "train_state_create: n_slots (%d), max_len (%d) and max_tokens (%d) must be positive",
                      n_slots, max_len, max_tokens);
    const ModelConfig *c = &m->local; /* this rank's part under tensor parallelism */
    const Backend *be = m->be;
    size_t N = (size_t)max_tokens, D = (size_t)c->hidden_size, F = (size_t)c->intermediate_size,
           QD = (size_t)c->num_attention_heads * c->head_dim, KVD = (size_t)c->num_key_value_heads * c->head_dim,
           V = (size_t)c->vocab_size, SL = (size_t)n_slots * max_len, C = (size_t)st_chunk_rows(m->be, max_tokens);
    TrainState *st = xcalloc(1, sizeof(TrainState));
    st->be = be;
    st->n_layers = c->num_hidden_layers;
    st->n_slots = n_slots;
    st->max_len = max_len;
    st->max_tokens = max_tokens;
    st->chunk = (int)C;
    st->tokens = xmalloc(N * sizeof(int));
    st->slot = xmalloc(N * sizeof(int));
    st->pos = xmalloc(N * sizeof(int));
    st->targets = xmalloc(N * sizeof(int));
    st->rows = xmalloc(N * sizeof(int));
    st->seen = xmalloc(SL);
    st->chunk_targets = xmalloc(C * sizeof(int));
    st->chunk_host = xmalloc(C * sizeof(float));
    st->ids = xmalloc(N * sizeof(int));
    if (m->tp.tensor_parallel_size > 1) {
        size_t tp = (size_t)m->tp.tensor_parallel_size;
        st->row_lse = xmalloc(N * sizeof(float));
        st->row_pz = xmalloc(N * sizeof(float));
        st->stats_host = xmalloc(tp * C * 4 * sizeof(float));
        st->chunk_stats = backend_alloc_f32_counted(be, C * 4, &st->bytes);
        st->stats_all = backend_alloc_f32_counted(be, tp * C * 4, &st->bytes);
        if (model_has_qk_norm(c)) st->dqk_norm = backend_alloc_f32_counted(be, 2 * (size_t)c->head_dim, &st->bytes);
        if (m->kv_copies > 1) st->dkv_blocks = backend_alloc_f32_counted(be, kv_blocks_numel(m), &st->bytes);
    }
    st->recompute = recompute;
    st->act = xcalloc((size_t)st->n_layers, sizeof(LayerActivations));
    for (int l = 0; l < st->n_layers; l++) {
        LayerActivations *a = &st->act[l];
        a->x_in = backend_alloc_counted(be, N * D, &st->bytes);
        if (recompute && l > 0) { /* one set of the other activations, shared by every layer */
            LayerActivations x_in_only = *a;
            *a = st->act[0];
            a->x_in = x_in_only.x_in;
            continue;
        }
        a->xn_attn = backend_alloc_counted(be, N * D, &st->bytes);
        if (model_has_qk_norm(c)) {
            a->q_lin = backend_alloc_counted(be, N * QD, &st->bytes);
            a->k_lin = backend_alloc_counted(be, N * KVD, &st->bytes);
        }
        a->q = backend_alloc_counted(be, N * QD, &st->bytes);
        a->k_cache = backend_alloc_counted(be, SL * KVD, &st->bytes);
        a->v_cache = backend_alloc_counted(be, SL * KVD, &st->bytes);
        a->att = backend_alloc_counted(be, N * QD, &st->bytes);
        a->lse = backend_alloc_f32_counted(be, N * (size_t)c->num_attention_heads, &st->bytes);
        a->x_mid = backend_alloc_counted(be, N * D, &st->bytes);
        a->xn_mlp = backend_alloc_counted(be, N * D, &st->bytes);
        a->gate = backend_alloc_counted(be, N * F, &st->bytes);
        a->up = backend_alloc_counted(be, N * F, &st->bytes);
    }
    st->x_final = backend_alloc_counted(be, N * D, &st->bytes);
    st->xn_final = backend_alloc_counted(be, N * D, &st->bytes);
    st->k = backend_alloc_counted(be, N * KVD, &st->bytes);
    st->v = backend_alloc_counted(be, N * KVD, &st->bytes);
    st->proj = backend_alloc_counted(be, N * D, &st->bytes);
    st->h = backend_alloc_counted(be, N * F, &st->bytes);
    st->chunk_rows = backend_alloc_counted(be, C * D, &st->bytes);
    st->chunk_drows = backend_alloc_counted(be, C * D, &st->bytes);
    st->chunk_logits = backend_alloc_counted(be, C * V, &st->bytes);
    st->chunk_lp = backend_alloc_f32_counted(be, C, &st->bytes);
    st->chunk_ent = backend_alloc_f32_counted(be, C, &st->bytes);
    st->dres = backend_alloc_counted(be, N * D, &st->bytes);
    st->dxn = backend_alloc_counted(be, N * D, &st->bytes);
    st->dq = backend_alloc_counted(be, N * QD, &st->bytes);
    st->datt = backend_alloc_counted(be, N * QD, &st->bytes);
    if (model_has_qk_norm(c)) {
        st->dq_lin = backend_alloc_counted(be, N * QD, &st->bytes);
        st->dk_lin = backend_alloc_counted(be, N * KVD, &st->bytes);
    }
    st->dk_cache = backend_alloc_f32_counted(be, SL * KVD, &st->bytes);
    st->dv_cache = backend_alloc_f32_counted(be, SL * KVD, &st->bytes);
    if (m->lora) {
        st->lora_t = backend_alloc_counted(be, N * (size_t)lora_rank(m), &st->bytes);
        st->lora_dt = backend_alloc_counted(be, N * (size_t)lora_rank(m), &st->bytes);
        st->lora_u = backend_alloc_counted(be, N * (size_t)lora_max_out_dim(m), &st->bytes);
        if (m->lora->cfg.dropout > 0.0f) {
            st->lora_xd = backend_alloc_counted(be, N * (size_t)lora_max_in_dim(m), &st->bytes);
            st->lora_dxd = backend_alloc_counted(be, N * (size_t)lora_max_in_dim(m), &st->bytes);
            /* a row-parallel input's masks read the other ranks' columns too (values then unused): defined ones */
            be->zero(be, st->lora_xd, N * (size_t)lora_max_in_dim(m));
            be->zero(be, st->lora_dxd, N * (size_t)lora_max_in_dim(m));
        }
        if (lora_shared_numel(m)) st->lora_shared = backend_alloc_f32_counted(be, lora_shared_numel(m), &st->bytes);
    }
    st->dgate = backend_alloc_counted(be, N * F, &st->bytes);
    st->dup = backend_alloc_counted(be, N * F, &st->bytes);
    st->dh = backend_alloc_counted(be, N * F, &st->bytes);
    *out = st;
    return COLT_OK;
}

void train_state_free(TrainState *st) {
    if (!st) return;
    const Backend *be = st->be;
    for (int l = 0; l < st->n_layers; l++) {
        LayerActivations *a = &st->act[l];
        be->free(be, a->x_in);
        if (st->recompute && l > 0) continue; /* the rest is layer 0's, shared */
        void *bufs[] = {a->xn_attn, a->q_lin, a->k_lin, a->q, a->k_cache, a->v_cache, a->att, a->lse, a->x_mid, a->xn_mlp,
                        a->gate, a->up};
        for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
            if (bufs[i]) be->free(be, bufs[i]);
    }
    void *bufs[] = {st->x_final, st->xn_final, st->k, st->v, st->proj, st->h, st->chunk_rows, st->chunk_drows,
                    st->chunk_logits, st->chunk_lp, st->chunk_ent, st->dres, st->dxn, st->dq, st->datt,
                    st->dq_lin, st->dk_lin, st->dk_cache, st->dv_cache, st->dgate, st->dup, st->dh,
                    st->lora_t, st->lora_dt, st->lora_u, st->lora_xd, st->lora_dxd, st->lora_shared, st->chunk_stats,
                    st->stats_all, st->dqk_norm, st->dkv_blocks};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        if (bufs[i]) be->free(be, bufs[i]);
    free(st->act);
    free(st->tokens);
    free(st->slot);
    free(st->pos);
    free(st->targets);
    free(st->rows);
    free(st->seen);
    free(st->chunk_targets);
    free(st->chunk_host);
    free(st->ids);
    free(st->row_lse);
    free(st->row_pz);
    free(st->stats_host);
    free(st);
}

/* ---------------------------------------------------------------- forward */

/* Checks ids and that every slot used holds positions 0..len-1 exactly once
 * (the attention backward relies on whole sequences). */
static int check_batch(const Model *m, TrainState *st, const int *tokens, const int *slot, const int *pos,
                       const int *targets, int n, float temperature, char *err) {
    const ModelConfig *c = &m->cfg; /* ids over the whole vocabulary */
    if (n < 0 || n > st->max_tokens)
        return errorf(err, "model_train_forward: %d tokens, state holds at most %d per call", n, st->max_tokens);
    if (!(temperature > 0.0f)) return errorf(err, "model_train_forward: temperature %g must be > 0", (double)temperature);
    memset(st->seen, 0, (size_t)st->n_slots * st->max_len);
    for (int i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= c->vocab_size)
            return errorf(err, "model_train_forward: token id %d out of range (vocab %d)", tokens[i], c->vocab_size);
        if (targets[i] >= c->vocab_size)
            return errorf(err, "model_train_forward: target id %d out of range (vocab %d)", targets[i], c->vocab_size);
        if (slot[i] < 0 || slot[i] >= st->n_slots)
            return errorf(err, "model_train_forward: slot %d out of range (%d slots)", slot[i], st->n_slots);
        if (pos[i] < 0 || pos[i] >= st->max_len)
            return errorf(err, "model_train_forward: position %d out of range (max_len %d)", pos[i], st->max_len);
        unsigned char *s = &st->seen[(size_t)slot[i] * st->max_len + pos[i]];
        if (*s) return errorf(err, "model_train_forward: slot %d position %d appears twice", slot[i], pos[i]);
        *s = 1;
    }
    for (int i = 0; i < n; i++)
        if (pos[i] > 0 && !st->seen[(size_t)slot[i] * st->max_len + pos[i] - 1])
            return errorf(err, "model_train_forward: slot %d has position %d but not %d (sequences must be whole)",
                          slot[i], pos[i], pos[i] - 1);
    return COLT_OK;
}

/* Copies the final hidden rows st->rows[r0 .. r0+c) into chunk_rows and runs
 * the lm_head on them: chunk_logits[c, V]. */
static void lm_head_chunk(const Model *m, TrainState *st, int r0, int c) {
    const Backend *be = m->be;
    int D = m->local.hidden_size;
    be->gather_rows(be, st->chunk_rows, st->xn_final, st->rows + r0, c, D);
    for (int r = 0; r < c; r++) st->chunk_targets[r] = st->targets[st->rows[r0 + r]];
    if (m->tp.tensor_parallel_size > 1) model_tp_local_ids(m, st->chunk_targets, st->chunk_targets, c); /* -1: another rank's */
    be->linear(be, st->chunk_logits, st->chunk_rows, m->lm_head, NULL, c, D, m->local.vocab_size);
}

/* Tensor parallel: each row's log-prob, entropy and log-sum-exp from the
 * group's logits_shard_stats (the parts' max, sum of exp, sum of exp * z and
 * target z), combined in double in rank order on every rank alike. */
static int tp_chunk_logprobs(const Model *m, TrainState *st, int r0, int cn, float *logprobs, float *entropy,
                             char *err) {
    const Backend *be = m->be;
    int size = m->tp.tensor_parallel_size;
    be->logits_shard_stats(be, st->chunk_stats, st->chunk_logits, st->chunk_targets, cn, m->local.vocab_size,
                           st->temperature);
    if (m->tp.all_gather(m->tp.ctx, st->stats_all, st->chunk_stats, (size_t)cn * 4, true, err) != 0) return COLT_ERR;
    be->download_f32(be, st->stats_host, st->stats_all, (size_t)size * cn * 4);
    for (int r = 0; r < cn; r++) {
        double mx = -INFINITY, sum = 0.0, sz = 0.0, zt = 0.0;
        for (int k = 0; k < size; k++) mx = fmax(mx, st->stats_host[((size_t)k * cn + r) * 4]);
        for (int k = 0; k < size; k++) {
            const float *s4 = &st->stats_host[((size_t)k * cn + r) * 4];
            double scale = exp((double)s4[0] - mx);
            sum += s4[1] * scale;
            sz += s4[2] * scale;
            zt += s4[3];
        }
        double lse = mx + log(sum);
        int i = st->rows[r0 + r];
        st->row_lse[i] = (float)lse;
        st->row_pz[i] = (float)(sz / sum);
        logprobs[i] = (float)(zt - lse);
        if (entropy) entropy[i] = (float)(lse - sz / sum);
    }
    return COLT_OK;
}

/* lora_dropout: the masks of adapter t of layer l in the forward keyed key. */
static uint64_t dropout_stream(int64_t key, int l, LoraTarget t) {
    return ((uint64_t)key << 16) ^ ((uint64_t)l << 3) ^ (uint64_t)t;
}

/* out[n, in] = lora_dropout of x[n, in], adapter t's input on this rank (out
 * may be x). A mask element is keyed by its index in the whole model's input,
 * so under tensor parallelism a row-parallel input (this rank's columns) is
 * put in its place in wide [n, whole width], masked there and copied back: the
 * masks one process draws, whatever the cut. */
static void lora_dropout_apply(const Model *m, const TrainState *st, int l, LoraTarget t, void *out, const void *x,
                               void *wide) {
    const Backend *be = m->be;
    int in_dim, whole_in, out_dim;
    lora_target_dims(&m->local, t, &in_dim, &out_dim);
    lora_target_dims(&m->cfg, t, &whole_in, &out_dim);
    uint64_t stream = dropout_stream(st->dropout_key, l, t);
    if (in_dim == whole_in) {
        be->dropout(be, out, x, (size_t)st->n * in_dim, st->dropout_p, st->dropout_seed, stream);
        return;
    }
    char *mine = (char *)wide + (size_t)m->tp.rank * in_dim * dtype_size(be->storage); /* this rank's columns */
    be->copy_2d(be, mine, (size_t)whole_in, x, (size_t)in_dim, st->n, in_dim);
    be->dropout(be, wide, wide, (size_t)st->n * whole_in, st->dropout_p, st->dropout_seed, stream);
    be->copy_2d(be, out, (size_t)in_dim, mine, (size_t)whole_in, st->n, in_dim);
}

/* What adapter t of layer l reads: x, or in a training forward with
 * lora_dropout its dropout, in st->lora_xd (consumed before the next call).
 * A LoraInputFn (model_internal.h) with ctx the TrainState. */
static const void *lora_input(void *ctx, int l, LoraTarget t, const void *x) {
    TrainState *st = ctx;
    const Model *m = st->model;
    if (st->dropout_key < 0 || !model_lora_active(m, &m->layers[l], t)) return x;
    lora_dropout_apply(m, st, l, t, st->lora_xd, x, st->lora_dxd);
    return st->lora_xd;
}

/* One decoder layer's forward from act[l].x_in (model_layer_forward with
 * every activation the backward reads kept). With x_out, the layer output
 * goes there; without (the recompute in the backward), it stops once every
 * activation the backward reads exists (gate, up). */
static int layer_forward(Model *m, TrainState *st, int l, void *x_out, char *err) {
    LayerActivations *a = &st->act[l];
    LayerBuffers b = {.x_in = a->x_in, .xn_attn = a->xn_attn, .q_lin = a->q_lin, .k_lin = a->k_lin, .q = a->q,
                      .k = st->k, .v = st->v, .att = a->att,
                      .lse = a->lse, .proj = st->proj, .x_mid = a->x_mid, .xn_mlp = a->xn_mlp, .gate = a->gate,
                      .up = a->up, .h = st->h, .x_out = x_out, .lora_t = st->lora_t, .lora_u = st->lora_u};
    LayerKv kv = {.k = a->k_cache, .v = a->v_cache, .slot = st->slot, .pos = st->pos, .max_len = st->max_len};
    st->model = m;
    return model_layer_forward(m, l, &b, &kv, st->n, lora_input, st, err);
}

int model_train_forward(Model *m, TrainState *st, const int *tokens, const int *slot, const int *pos,
                        const int *targets, int n, float temperature, float *logprobs, float *entropy,
                        char *err) {
    st->have_forward = false;
    if (check_batch(m, st, tokens, slot, pos, targets, n, temperature, err) != 0) return COLT_ERR;
    st->dropout_key = -1;
    if (lora_dropout_active(m) > 0.0f) {
        if (!st->lora_xd || !m->be->dropout)
            return errorf(err, "model_train_forward: lora_dropout %g, but %s", (double)lora_dropout_active(m),
                          st->lora_xd ? "the backend has no dropout op" : "the training state was made without it");
        st->dropout_key = m->lora->dropout_key;
        st->dropout_seed = m->lora->dropout_seed;
        st->dropout_p = m->lora->cfg.dropout;
    }
    const ModelConfig *c = &m->local; /* this rank's part under tensor parallelism */
    const Backend *be = m->be;
    int D = c->hidden_size, V = c->vocab_size;
    memcpy(st->tokens, tokens, (size_t)n * sizeof(int));
    model_tp_local_ids(m, st->ids, tokens, n); /* the embedding's rows on this rank (all when whole) */
    memcpy(st->slot, slot, (size_t)n * sizeof(int));
    memcpy(st->pos, pos, (size_t)n * sizeof(int));
    memcpy(st->targets, targets, (size_t)n * sizeof(int));
    st->n = n;
    st->temperature = temperature;
    for (int i = 0; i < n; i++) {
        logprobs[i] = 0.0f;
        if (entropy) entropy[i] = 0.0f;
    }
    /* ZeRO-3: each stage's weights gathered just before use, the next one's
     * started meanwhile (model_params_use); the same calls over no tokens. */
    const int L = c->num_hidden_layers;
    if (model_params_use(m, 0, 1, err) != 0) return COLT_ERR;
    if (n > 0 && model_embed(m, st->act[0].x_in, tokens, st->ids, n, err) != 0) return COLT_ERR;
    for (int l = 0; l < L; l++) {
        if (model_params_use(m, l + 1, l + 2 <= L ? l + 2 : -1, err) != 0) return COLT_ERR;
        if (n > 0 && layer_forward(m, st, l, l + 1 < L ? st->act[l + 1].x_in : st->x_final, err) != 0) return COLT_ERR;
    }
    if (model_params_use(m, L + 1, -1, err) != 0) return COLT_ERR;
    if (n == 0) {
        st->have_forward = true;
        return COLT_OK;
    }
    be->rmsnorm(be, st->xn_final, st->x_final, m->final_norm, n, D, c->rms_norm_eps);

    int n_rows = 0;
    for (int i = 0; i < n; i++)
        if (targets[i] >= 0) st->rows[n_rows++] = i;
    for (int r0 = 0; r0 < n_rows; r0 += st->chunk) {
        int cn = n_rows - r0 < st->chunk ? n_rows - r0 : st->chunk;
        lm_head_chunk(m, st, r0, cn);
        if (m->tp.tensor_parallel_size > 1) {
            if (tp_chunk_logprobs(m, st, r0, cn, logprobs, entropy, err) != 0) return COLT_ERR;
            continue;
        }
        be->log_softmax_target(be, st->chunk_lp, entropy ? st->chunk_ent : NULL, st->chunk_logits, st->chunk_targets, cn,
                               V, temperature);
        be->download_f32(be, st->chunk_host, st->chunk_lp, (size_t)cn);
        for (int r = 0; r < cn; r++) logprobs[st->rows[r0 + r]] = st->chunk_host[r];
        if (entropy) {
            be->download_f32(be, st->chunk_host, st->chunk_ent, (size_t)cn);
            for (int r = 0; r < cn; r++) entropy[st->rows[r0 + r]] = st->chunk_host[r];
        }
    }
    st->have_forward = true;
    return COLT_OK;
}

/* ---------------------------------------------------------------- backward */

/* Where target t's backward accumulates the gradient of its adapter tensor
 * that every rank of the group holds whole (A of a column-parallel layer, B
 * of a row-parallel one: [r, D] or [D, r]): each rank computes only its share
 * of it (a column-parallel layer's dt = dy_part B_part is this rank's share of
 * the whole dt; a row-parallel one's t = A_part x_part is this rank's share of
 * the whole A x), so the shares go to t's slot of lora_shared and
 * lora_sum_shared adds their sum over the group. */
static void *lora_shared_grad(const Model *m, const TrainState *st, LoraTarget t) {
    size_t slot = 0, rd = (size_t)m->lora->cfg.r * (size_t)m->local.hidden_size;
    for (int k = 0; k < (int)t; k++) slot += (m->lora->cfg.targets >> k) & 1u;
    return (char *)st->lora_shared + slot * rd * sizeof(float);
}

/* After a layer's backward: the shares in lora_shared summed over the group
 * (one all-reduce) and added to the layer's gradients gw. No-op without them. */
static int lora_sum_shared(const Model *m, TrainState *st, const LayerWeights *gw, char *err) {
    size_t numel = lora_shared_numel(m);
    if (!numel) return COLT_OK;
    size_t rd = (size_t)m->lora->cfg.r * (size_t)m->local.hidden_size;
    if (m->tp.all_reduce(m->tp.ctx, st->lora_shared, numel, true, err) != 0) return COLT_ERR;
    for (int k = 0; k < LORA_N_TARGETS; k++) {
        if (!gw->lora_a[k]) continue;
        void *g = lora_target_row_parallel((LoraTarget)k) ? gw->lora_b[k] : gw->lora_a[k];
        m->be->add_f32(m->be, g, lora_shared_grad(m, st, (LoraTarget)k), rd);
    }
    return COLT_OK;
}

/* Backward of the adapter term y += s B (A x) of target t of layer l
 * (model_lora_add), after the base layer's own backward: dB += dy^T (s A x),
 * dA += (s dy B)^T x, dx += (s dy B) A. A x is recomputed (one [N, r] GEMM)
 * rather than kept. With lora_dropout x is the dropped input (its mask
 * redrawn) and dx gets (s dy B) A through the same mask. Under tensor
 * parallelism A, B, x, dx and dy are this rank's parts (lora.c): dx is this
 * rank's share where the layer's input gradient is summed over the group
 * next (column-parallel), and the tensor held whole gets its share in
 * lora_shared (lora_shared_grad). */
static void lora_backward_into(const Model *m, TrainState *st, int l, const LayerWeights *w, const LayerWeights *gw,
                               LoraTarget t, void *dx, const void *dy, const void *x, void *gb_into) {
    if (!gw->lora_a[t]) return;
    const Backend *be = m->be;
    int n = st->n, r = lora_rank(m), in_dim, out_dim;
    float s = m->lora->scaling;
    lora_target_dims(&m->local, t, &in_dim, &out_dim);
    void *ga = gw->lora_a[t], *gb = gw->lora_b[t];
    if (st->lora_shared && lora_target_row_parallel(t)) gb = lora_shared_grad(m, st, t);
    else if (st->lora_shared) ga = lora_shared_grad(m, st, t);
    if (gb_into) gb = gb_into;
    st->model = m;
    const void *xa = lora_input(st, l, t, x);
    be->linear(be, st->lora_t, xa, w->lora_a[t], NULL, n, in_dim, r);
    be->mul_scalar(be, st->lora_t, st->lora_t, s, (size_t)n * r);
    be->linear_backward(be, st->lora_dt, gb, NULL, dy, st->lora_t, w->lora_b[t], n, r, out_dim, 0);
    be->mul_scalar(be, st->lora_dt, st->lora_dt, s, (size_t)n * r);
    if (xa == x) {
        be->linear_backward(be, dx, ga, NULL, st->lora_dt, x, w->lora_a[t], n, in_dim, r, 1);
        return;
    }
    /* the dropped input (lora_xd) is no longer read: it is the masks' whole-width scratch now */
    be->linear_backward(be, st->lora_dxd, ga, NULL, st->lora_dt, xa, w->lora_a[t], n, in_dim, r, 0);
    lora_dropout_apply(m, st, l, t, st->lora_dxd, st->lora_dxd, st->lora_xd);
    be->add(be, dx, dx, st->lora_dxd, (size_t)n * in_dim);
}

static void lora_backward(const Model *m, TrainState *st, int l, const LayerWeights *w, const LayerWeights *gw,
                          LoraTarget t, void *dx, const void *dy, const void *x) {
    lora_backward_into(m, st, l, w, gw, t, dx, dy, x, NULL);
}

/* KV-head replication: a KV head's gradients are the sum of its copies'
 * ranks' (each saw its own query heads' share): every rank put its share in
 * its block of st->dkv_blocks (zeros elsewhere); after one sum over the group
 * each block holds its KV head's whole gradient, added to gw's. */
static int kv_grads_sum(const Model *m, TrainState *st, const LayerWeights *gw, const float *block, char *err) {
    const Backend *be = m->be;
    size_t KVD = (size_t)m->local.num_key_value_heads * m->local.head_dim, WN = KVD * (size_t)m->local.hidden_size,
           BN = KVD * (size_t)lora_rank(m);
    if (m->tp.all_reduce(m->tp.ctx, st->dkv_blocks, kv_blocks_numel(m), true, err) != 0) return COLT_ERR;
    if (gw->k_w) be->add_f32(be, gw->k_w, block, WN);
    if (gw->k_b) be->add_f32(be, gw->k_b, block + WN, KVD);
    if (gw->v_w) be->add_f32(be, gw->v_w, block + WN + KVD, WN);
    if (gw->v_b) be->add_f32(be, gw->v_b, block + 2 * WN + KVD, KVD);
    if (gw->lora_b[LORA_K]) be->add_f32(be, gw->lora_b[LORA_K], block + 2 * WN + 2 * KVD, BN);
    if (gw->lora_b[LORA_V]) be->add_f32(be, gw->lora_b[LORA_V], block + 2 * WN + 2 * KVD + BN, BN);
    return COLT_OK;
}

int model_train_backward(Model *m, TrainState *st, const float *dlogprobs, ModelGrads *g, char *err) {
    return model_train_backward_entropy(m, st, dlogprobs, NULL, g, err);
}

int model_train_backward_entropy(Model *m, TrainState *st, const float *dlogprobs, const float *dentropy,
                                 ModelGrads *g, char *err) {
    bool has_entropy_op = m->tp.tensor_parallel_size > 1 ? m->be->log_softmax_shard_entropy_backward != NULL
                                                         : m->be->log_softmax_entropy_backward != NULL;
    if (dentropy && !has_entropy_op)
        return errorf(err, "model_train_backward: backend %s cannot take the entropy's gradient (the entropy bonus)",
                      m->be->name);
    if (!st->have_forward) return errorf(err, "model_train_backward: no successful model_train_forward to go back through");
    if (g->n != model_param_count(m) || g->lora != (m->lora != NULL))
        return errorf(err, "model_train_backward: gradients were made for another model");
    if (m->lora && !m->lora->enabled)
        return errorf(err, "model_train_backward: the LoRA adapters are disabled (a reference forward only)");
    const ModelConfig *c = &m->local; /* this rank's part under tensor parallelism */
    const Backend *be = m->be;
    const Model *gm = &g->shadow;
    int n = st->n;
    const int L = c->num_hidden_layers;
    /* Windowed: each backward's gradients are its own (the announcements
     * carry them away), so the edge stages start from zero. */
    if (g->windowed) be->zero_f32(be, g->flat, g->sl.edge_numel);
    if (n == 0) { /* nothing changes: every gradient is final already; the same collectives */
        if (model_params_use(m, L + 1, L, err) != 0 || grads_announce(g, L + 1, err) != 0) return COLT_ERR;
        for (int l = L - 1; l >= 0; l--) {
            window_begin(g, l + 1);
            if (model_params_use(m, l + 1, l >= 1 ? l : -1, err) != 0 || grads_announce(g, l + 1, err) != 0)
                return COLT_ERR;
        }
        return grads_announce(g, 0, err);
    }
    int D = c->hidden_size, F = c->intermediate_size, H = c->num_attention_heads, KVH = c->num_key_value_heads,
        Dh = c->head_dim, V = c->vocab_size;
    int QD = H * Dh, KVD = KVH * Dh;
    size_t ND = (size_t)n * D;
    const int *slot = st->slot, *pos = st->pos;

    /* lm_head + log-softmax, chunk by chunk: d xn_final rows and d lm_head. */
    if (model_params_use(m, L + 1, L, err) != 0) return COLT_ERR;
    be->zero(be, st->dxn, ND);
    int n_rows = 0;
    for (int i = 0; i < n; i++)
        if (st->targets[i] >= 0 && (dlogprobs[i] != 0.0f || (dentropy && dentropy[i] != 0.0f))) st->rows[n_rows++] = i;
    for (int r0 = 0; r0 < n_rows; r0 += st->chunk) {
        int cn = n_rows - r0 < st->chunk ? n_rows - r0 : st->chunk;
        lm_head_chunk(m, st, r0, cn);
        for (int r = 0; r < cn; r++) st->chunk_host[r] = dlogprobs[st->rows[r0 + r]];
        be->upload_f32(be, st->chunk_lp, st->chunk_host, (size_t)cn);
        if (m->tp.tensor_parallel_size > 1 && dentropy) {
            /* the whole row's lse and sum p z from the forward, and d entropy, in chunk_stats ([C, 4], free in
             * the backward) */
            float *dent_dev = (float *)st->chunk_stats, *pz_dev = dent_dev + st->chunk;
            for (int r = 0; r < cn; r++) st->chunk_host[r] = st->row_lse[st->rows[r0 + r]];
            be->upload_f32(be, st->chunk_ent, st->chunk_host, (size_t)cn);
            for (int r = 0; r < cn; r++) st->chunk_host[r] = st->row_pz[st->rows[r0 + r]];
            be->upload_f32(be, pz_dev, st->chunk_host, (size_t)cn);
            for (int r = 0; r < cn; r++) st->chunk_host[r] = dentropy[st->rows[r0 + r]];
            be->upload_f32(be, dent_dev, st->chunk_host, (size_t)cn);
            be->log_softmax_shard_entropy_backward(be, st->chunk_logits, st->chunk_logits, st->chunk_targets,
                                                   st->chunk_lp, dent_dev, st->chunk_ent, pz_dev, cn, V,
                                                   st->temperature);
        } else if (m->tp.tensor_parallel_size > 1) { /* the whole row's log-sum-exp from the forward */
            for (int r = 0; r < cn; r++) st->chunk_host[r] = st->row_lse[st->rows[r0 + r]];
            be->upload_f32(be, st->chunk_ent, st->chunk_host, (size_t)cn);
            be->log_softmax_shard_backward(be, st->chunk_logits, st->chunk_logits, st->chunk_targets, st->chunk_lp,
                                           st->chunk_ent, cn, V, st->temperature);
        } else if (dentropy) { /* chunk_ent is free here (the TP path's lse): d entropy */
            for (int r = 0; r < cn; r++) st->chunk_host[r] = dentropy[st->rows[r0 + r]];
            be->upload_f32(be, st->chunk_ent, st->chunk_host, (size_t)cn);
            be->log_softmax_entropy_backward(be, st->chunk_logits, st->chunk_logits, st->chunk_targets, st->chunk_lp,
                                             st->chunk_ent, cn, V, st->temperature);
        } else {
            be->log_softmax_target_backward(be, st->chunk_logits, st->chunk_logits, st->chunk_targets, st->chunk_lp, cn,
                                            V, st->temperature);
        }
        be->linear_backward(be, st->chunk_drows, gm->lm_head, NULL, st->chunk_logits, st->chunk_rows, m->lm_head, cn, D,
                            V, 0);
        be->scatter_rows(be, st->dxn, st->chunk_drows, st->rows + r0, cn, D);
    }
    if (model_tp_sum(m, st->dxn, ND, err) != 0) return COLT_ERR; /* each rank's vocabulary part's share */
    be->zero(be, st->dres, ND);
    be->rmsnorm_backward(be, st->dres, gm->final_norm, st->dxn, st->x_final, m->final_norm, n, D, c->rms_norm_eps);
    if (grads_announce(g, L + 1, err) != 0) return COLT_ERR;

    /* dres is d(residual stream) at each layer's output, then its input. */
    for (int l = L - 1; l >= 0; l--) {
        window_begin(g, l + 1);
        if (model_params_use(m, l + 1, l >= 1 ? l : -1, err) != 0) return COLT_ERR;
        const LayerWeights *w = &m->layers[l];
        const LayerWeights *gw = &gm->layers[l];
        LayerActivations *a = &st->act[l];
        if (st->recompute && layer_forward(m, st, l, NULL, err) != 0) return COLT_ERR; /* this layer's activations, again */
        if (st->lora_shared) be->zero_f32(be, st->lora_shared, lora_shared_numel(m));
        /* MLP */
        be->swiglu(be, st->h, a->gate, a->up, (size_t)n * F);
        be->linear_backward(be, st->dh, gw->down_w, NULL, st->dres, st->h, w->down_w, n, F, D, 0);
        lora_backward(m, st, l, w, gw, LORA_DOWN, st->dh, st->dres, st->h);
        be->swiglu_backward(be, st->dgate, st->dup, st->dh, a->gate, a->up, (size_t)n * F);
        be->linear_backward(be, st->dxn, gw->gate_w, NULL, st->dgate, a->xn_mlp, w->gate_w, n, D, F, 0);
        lora_backward(m, st, l, w, gw, LORA_GATE, st->dxn, st->dgate, a->xn_mlp);
        be->linear_backward(be, st->dxn, gw->up_w, NULL, st->dup, a->xn_mlp, w->up_w, n, D, F, 1);
        lora_backward(m, st, l, w, gw, LORA_UP, st->dxn, st->dup, a->xn_mlp);
        if (model_tp_sum(m, st->dxn, ND, err) != 0) return COLT_ERR; /* column-parallel input: the parts' shares */
        be->rmsnorm_backward(be, st->dres, gw->mlp_norm, st->dxn, a->x_mid, w->mlp_norm, n, D, c->rms_norm_eps);
        /* attention */
        be->linear_backward(be, st->datt, gw->o_w, gw->o_b, st->dres, a->att, w->o_w, n, QD, D, 0);
        lora_backward(m, st, l, w, gw, LORA_O, st->datt, st->dres, a->att);
        be->zero_f32(be, st->dk_cache, (size_t)st->n_slots * st->max_len * KVD);
        be->zero_f32(be, st->dv_cache, (size_t)st->n_slots * st->max_len * KVD);
        be->attention_backward(be, st->dq, st->dk_cache, st->dv_cache, st->datt, a->q, a->att, a->lse, a->k_cache,
                               a->v_cache, slot, pos, n, H, KVH, Dh, st->n_slots, st->max_len);
        be->kv_gather(be, st->k, st->v, st->dk_cache, st->dv_cache, slot, pos, n, KVD, st->max_len);
        be->rope_backward(be, st->dq, pos, n, H, Dh, m->rope_inv_freq);
        be->rope_backward(be, st->k, pos, n, KVH, Dh, m->rope_inv_freq);
        const void *dq = st->dq, *dk = st->k; /* d q_proj / k_proj output */
        if (w->q_norm) {
            be->zero(be, st->dq_lin, (size_t)n * QD);
            be->zero(be, st->dk_lin, (size_t)n * KVD);
            /* under tensor parallelism each rank sees its heads only: the norms' gradients are summed over the group */
            bool tp = m->tp.tensor_parallel_size > 1 && gw->q_norm;
            void *dqn = tp ? st->dqk_norm : gw->q_norm, *dkn = tp ? (float *)st->dqk_norm + Dh : gw->k_norm;
            if (tp) be->zero_f32(be, st->dqk_norm, 2 * (size_t)Dh);
            be->rmsnorm_backward(be, st->dq_lin, dqn, st->dq, a->q_lin, w->q_norm, n * H, Dh, c->rms_norm_eps);
            be->rmsnorm_backward(be, st->dk_lin, dkn, st->k, a->k_lin, w->k_norm, n * KVH, Dh, c->rms_norm_eps);
            if (tp) {
                if (m->tp.all_reduce(m->tp.ctx, st->dqk_norm, 2 * (size_t)Dh, true, err) != 0) return COLT_ERR;
                be->add_f32(be, gw->q_norm, dqn, (size_t)Dh);
                be->add_f32(be, gw->k_norm, dkn, (size_t)Dh);
            }
            dq = st->dq_lin, dk = st->dk_lin;
        }
        be->linear_backward(be, st->dxn, gw->q_w, gw->q_b, dq, a->xn_attn, w->q_w, n, D, QD, 0);
        lora_backward(m, st, l, w, gw, LORA_Q, st->dxn, dq, a->xn_attn);
        if (m->kv_copies > 1) { /* k/v gradients into this rank's block of dkv_blocks, summed over the copies */
            size_t WN = (size_t)KVD * D, BN = (size_t)KVD * lora_rank(m);
            float *block = (float *)st->dkv_blocks + (size_t)(m->tp.rank / m->kv_copies) * kv_grads_numel(m);
            float *kw = gw->k_w ? block : NULL, *kb = gw->k_b ? block + WN : NULL;
            float *vw = gw->v_w ? block + WN + KVD : NULL, *vb = gw->v_b ? block + 2 * WN + KVD : NULL;
            be->zero_f32(be, st->dkv_blocks, kv_blocks_numel(m));
            be->linear_backward(be, st->dxn, kw, kb, dk, a->xn_attn, w->k_w, n, D, KVD, 1);
            lora_backward_into(m, st, l, w, gw, LORA_K, st->dxn, dk, a->xn_attn, block + 2 * WN + 2 * KVD);
            be->linear_backward(be, st->dxn, vw, vb, st->v, a->xn_attn, w->v_w, n, D, KVD, 1);
            lora_backward_into(m, st, l, w, gw, LORA_V, st->dxn, st->v, a->xn_attn, block + 2 * WN + 2 * KVD + BN);
            if (kv_grads_sum(m, st, gw, block, err) != 0) return COLT_ERR;
        } else {
            be->linear_backward(be, st->dxn, gw->k_w, gw->k_b, dk, a->xn_attn, w->k_w, n, D, KVD, 1);
            lora_backward(m, st, l, w, gw, LORA_K, st->dxn, dk, a->xn_attn);
            be->linear_backward(be, st->dxn, gw->v_w, gw->v_b, st->v, a->xn_attn, w->v_w, n, D, KVD, 1);
            lora_backward(m, st, l, w, gw, LORA_V, st->dxn, st->v, a->xn_attn);
        }
        if (model_tp_sum(m, st->dxn, ND, err) != 0) return COLT_ERR;
        be->rmsnorm_backward(be, st->dres, gw->attn_norm, st->dxn, a->x_in, w->attn_norm, n, D, c->rms_norm_eps);
        if (lora_sum_shared(m, st, gw, err) != 0) return COLT_ERR;
        if (grads_announce(g, l + 1, err) != 0) return COLT_ERR;
    }
    if (gm->embed) be->embedding_backward(be, gm->embed, st->dres, st->ids, n, D); /* frozen under LoRA */
    return grads_announce(g, 0, err);
}
