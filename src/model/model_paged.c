/* model_paged.c — the model's forward for the generation engine: the same
 * layer function as model_forward (model.c), with the KV cache in a paged pool and
 * every index array in [i32] device buffers, so a decode step is a fixed list
 * of ops a CUDA graph can record. Because the ops and their rounding points
 * are the trainer's, the engine's log-probs agree with the trainer's. */
#include <stdlib.h>

#include "core/error.h"
#include "model/model_internal.h"

struct PagedState {
    const Backend *be;
    int max_tokens, max_logit_rows;
    void *x, *xn, *q, *k, *v, *att, *proj, *gate, *up; /* [max_tokens, ...] */
    void *qkv;    /* [max_tokens, QD + 2 KVD]: one GEMM's q | k | v (fused path) */
    void *gate_up; /* [max_tokens, 2F]: one GEMM's gate | up (fused path) */
    void *lora_t, *lora_u; /* [max_tokens, r], [max_tokens, widest adapted output]: LoRA scratch, else NULL */
    int lora_r, lora_out;  /* the r and widest adapted output that scratch was sized for (0: none) */
    void *rows;   /* [max_logit_rows, D] final-norm rows that want logits */
    void *logits; /* [max_logit_rows, V] */
    /* tensor parallel: [max_tokens] [i32] ids into this rank's vocabulary part;
     * [max_logit_rows, V'] this rank's logits, [size, max_logit_rows, V'] the group's */
    void *ids, *logits_part, *logits_gathered;
    size_t bytes;
};

size_t kv_pool_block_bytes(const Model *m, int block_size) {
    const ModelConfig *c = &m->local; /* this rank's part under tensor parallelism */
    size_t kv_dim = (size_t)c->num_key_value_heads * c->head_dim;
    return 2 * (size_t)c->num_hidden_layers * (size_t)block_size * kv_dim * dtype_size(m->be->storage);
}

void kv_pool_create(KvPool *pool, const Model *m, int n_blocks, int block_size) {
    const ModelConfig *c = &m->local; /* this rank's part under tensor parallelism */
    pool->be = m->be;
    pool->n_layers = c->num_hidden_layers;
    pool->n_blocks = n_blocks;
    pool->block_size = block_size;
    pool->kv_dim = c->num_key_value_heads * c->head_dim;
    pool->bytes = 0;
    pool->k = xcalloc((size_t)pool->n_layers, sizeof(void *));
    pool->v = xcalloc((size_t)pool->n_layers, sizeof(void *));
    size_t rows = (size_t)n_blocks * (size_t)block_size;
    for (int l = 0; l < pool->n_layers; l++) {
        pool->k[l] = backend_alloc_counted(m->be, rows * pool->kv_dim, &pool->bytes);
        pool->v[l] = backend_alloc_counted(m->be, rows * pool->kv_dim, &pool->bytes);
    }
}

void kv_pool_free(KvPool *pool) {
    if (!pool->k) return;
    for (int l = 0; l < pool->n_layers; l++) {
        pool->be->free(pool->be, pool->k[l]);
        pool->be->free(pool->be, pool->v[l]);
    }
    free(pool->k);
    free(pool->v);
    pool->k = pool->v = NULL;
    pool->bytes = 0;
}

int paged_state_create(PagedState **out, const Model *m, int max_tokens, int max_logit_rows, char *err) {
    *out = NULL;
    if (max_tokens <= 0 || max_logit_rows <= 0 || max_logit_rows > max_tokens)
        return errorf(err, "paged_state_create: max_tokens (%d) and max_logit_rows (%d) must be positive, rows <= tokens",
                      max_tokens, max_logit_rows);
    const ModelConfig *c = &m->local; /* this rank's part under tensor parallelism */
    const Backend *be = m->be;
    size_t N = (size_t)max_tokens, D = (size_t)c->hidden_size, F = (size_t)c->intermediate_size,
           QD = (size_t)c->num_attention_heads * c->head_dim, KVD = (size_t)c->num_key_value_heads * c->head_dim;
    PagedState *st = xcalloc(1, sizeof(PagedState));
    st->be = be;
    st->max_tokens = max_tokens;
    st->max_logit_rows = max_logit_rows;
    st->x = backend_alloc_counted(be, N * D, &st->bytes);
    st->xn = backend_alloc_counted(be, N * D, &st->bytes);
    st->q = backend_alloc_counted(be, N * QD, &st->bytes);
    st->k = backend_alloc_counted(be, N * KVD, &st->bytes);
    st->v = backend_alloc_counted(be, N * KVD, &st->bytes);
    st->att = backend_alloc_counted(be, N * QD, &st->bytes);
    st->proj = backend_alloc_counted(be, N * D, &st->bytes);
    st->gate = backend_alloc_counted(be, N * F, &st->bytes);
    st->up = backend_alloc_counted(be, N * F, &st->bytes);
    st->qkv = backend_alloc_counted(be, N * (QD + 2 * KVD), &st->bytes);
    st->gate_up = backend_alloc_counted(be, N * 2 * F, &st->bytes);
    if (m->lora) {
        st->lora_r = lora_rank(m), st->lora_out = lora_max_out_dim(m);
        st->lora_t = backend_alloc_counted(be, N * (size_t)st->lora_r, &st->bytes);
        st->lora_u = backend_alloc_counted(be, N * (size_t)st->lora_out, &st->bytes);
    }
    st->rows = backend_alloc_counted(be, (size_t)max_logit_rows * D, &st->bytes);
    size_t V = (size_t)m->cfg.vocab_size;
    st->logits = backend_alloc_counted(be, (size_t)max_logit_rows * V, &st->bytes);
    if (m->tp.tensor_parallel_size > 1) {
        st->ids = be->alloc_i32(be, N);
        st->bytes += N * sizeof(int);
        st->logits_part = backend_alloc_counted(be, (size_t)max_logit_rows * (size_t)c->vocab_size, &st->bytes);
        st->logits_gathered = backend_alloc_counted(be, (size_t)max_logit_rows * V, &st->bytes);
    }
    *out = st;
    return COLT_OK;
}

size_t paged_state_plan_bytes(const Model *m, int max_tokens, int max_logit_rows) {
    const ModelConfig *c = &m->local; /* this rank's part under tensor parallelism */
    size_t N = (size_t)max_tokens, R = (size_t)max_logit_rows, D = (size_t)c->hidden_size,
           F = (size_t)c->intermediate_size, QD = (size_t)c->num_attention_heads * c->head_dim,
           KVD = (size_t)c->num_key_value_heads * c->head_dim;
    size_t V = (size_t)m->cfg.vocab_size, tp_logits = m->tp.tensor_parallel_size > 1 ? R * ((size_t)c->vocab_size + V) : 0;
    size_t elems = N * (3 * D + 2 * QD + 2 * KVD + 2 * F + (QD + 2 * KVD) + 2 * F) + R * D + R * V + tp_logits +
                   N * ((size_t)lora_rank(m) + (size_t)lora_max_out_dim(m));
    return elems * dtype_size(m->be->storage) + (m->tp.tensor_parallel_size > 1 ? N * sizeof(int) : 0);
}

void paged_state_free(PagedState *st) {
    if (!st) return;
    void *bufs[] = {st->x,      st->xn,     st->q,      st->k,          st->v,           st->att,
                    st->proj,   st->gate,   st->up,     st->qkv,        st->gate_up,     st->rows,
                    st->logits, st->lora_t, st->lora_u, st->logits_part, st->logits_gathered, st->ids};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        if (bufs[i]) st->be->free(st->be, bufs[i]);
    free(st);
}

bool paged_state_fits(const PagedState *st, const Model *m) {
    return !m->lora || (lora_rank(m) <= st->lora_r && lora_max_out_dim(m) <= st->lora_out);
}

size_t paged_state_bytes(const PagedState *st) { return st ? st->bytes : 0; }
void *paged_state_logits(PagedState *st) { return st->logits; }

/* True when b starts right where a's n elements end: tensors the arena laid
 * out back to back can be read as one (q|k|v and gate|up weights, q|k|v biases). */
static bool adjacent(const void *a, size_t n, size_t elem, const void *b) {
    return a && b && (const char *)a + n * elem == (const char *)b;
}

bool model_qkv_back_to_back(const LayerWeights *w, const ModelConfig *c, size_t es) {
    size_t D = (size_t)c->hidden_size, QD = (size_t)c->num_attention_heads * c->head_dim,
           KVD = (size_t)c->num_key_value_heads * c->head_dim;
    bool weights = adjacent(w->q_w, QD * D, es, w->k_w) && adjacent(w->k_w, KVD * D, es, w->v_w);
    bool bias = (!w->q_b && !w->k_b && !w->v_b) || (adjacent(w->q_b, QD, es, w->k_b) && adjacent(w->k_b, KVD, es, w->v_b));
    return weights && bias;
}

bool model_gate_up_back_to_back(const LayerWeights *w, const ModelConfig *c, size_t es) {
    return adjacent(w->gate_w, (size_t)c->intermediate_size * c->hidden_size, es, w->up_w);
}

void *model_decode_plan_create(const Model *m, const KvPool *kv, int max_blocks) {
    const Backend *be = m->be;
    const ModelConfig *c = &m->local; /* this rank's part under tensor parallelism */
    /* the kernel has no q/k norm, no adapter term and no collectives */
    if (!be->decode_layers_create || model_has_qk_norm(c) || m->lora || m->tp.tensor_parallel_size > 1) return NULL;
    int L = c->num_hidden_layers;
    DecodeLayerWeights *layers = xcalloc((size_t)L, sizeof(DecodeLayerWeights));
    bool ok = true;
    for (int l = 0; l < L && ok; l++) {
        const LayerWeights *w = &m->layers[l];
        size_t es = dtype_size(be->storage);
        ok = model_qkv_back_to_back(w, c, es) && model_gate_up_back_to_back(w, c, es);
        layers[l] = (DecodeLayerWeights){.attn_norm = w->attn_norm, .qkv_w = w->q_w, .qkv_b = w->q_b,
                                         .o_w = w->o_w, .o_b = w->o_b, .mlp_norm = w->mlp_norm,
                                         .gate_up_w = w->gate_w, .down_w = w->down_w,
                                         .k_pool = kv->k[l], .v_pool = kv->v[l]};
    }
    DecodeDims dims = {.n_layers = L, .hidden = c->hidden_size, .intermediate = c->intermediate_size,
                       .n_heads = c->num_attention_heads, .n_kv_heads = c->num_key_value_heads,
                       .head_dim = c->head_dim, .block_size = kv->block_size, .max_blocks = max_blocks,
                       .rms_eps = c->rms_norm_eps, .rope_inv_freq = m->rope_inv_freq};
    void *plan = ok ? be->decode_layers_create(be, layers, &dims) : NULL;
    free(layers);
    return plan;
}

void model_decode_plan_free(const Model *m, void *plan) {
    if (plan) m->be->decode_layers_free(m->be, plan);
}

int model_forward_paged(Model *m, PagedState *st, const KvPool *kv, const PagedBatch *b, char *err) {
    const ModelConfig *c = &m->local; /* this rank's part under tensor parallelism */
    const Backend *be = m->be;
    const int n = b->n, D = c->hidden_size;
    if (m->tp.tensor_parallel_size > 1) { /* vocabulary-parallel: this rank's rows, others' tokens zeros, summed */
        be->vocab_shard_ids_i32(be, st->ids, b->tokens, n, m->vocab_lo, m->vocab_lo + c->vocab_size);
        be->embedding_i32(be, st->x, m->embed, st->ids, n, D);
        if (model_tp_sum(m, st->x, (size_t)n * D, err) != 0) return COLT_ERR;
    } else {
        be->embedding_i32(be, st->x, m->embed, b->tokens, n, D);
    }
    bool one_launch = b->decode_plan && be->decode_layers(be, b->decode_plan, st->x, b->pos, b->seq, b->slot_mapping,
                                                          b->block_tables, n);
    if (!one_launch) {
        /* Nothing kept (one residual stream, gate as swiglu's output); the
         * fused GEMMs' scratch: fewer, larger kernels per layer where the
         * weights sit back to back. */
        LayerBuffers lb = {.x_in = st->x, .xn_attn = st->xn, .q = st->q, .k = st->k, .v = st->v, .att = st->att,
                           .proj = st->proj, .x_mid = st->x, .xn_mlp = st->xn, .gate = st->gate, .up = st->up,
                           .h = st->gate, .x_out = st->x, .lora_t = st->lora_t, .lora_u = st->lora_u,
                           .qkv = st->qkv, .gate_up = st->gate_up};
        LayerKv lkv = {.paged = b, .block_size = kv->block_size};
        for (int l = 0; l < c->num_hidden_layers; l++) {
            lkv.k = kv->k[l];
            lkv.v = kv->v[l];
            if (model_layer_forward(m, l, &lb, &lkv, n, NULL, NULL, err) != 0) return COLT_ERR;
        }
    }
    if (b->n_logits == 0) return COLT_OK;
    /* The final norm only on the rows that want logits: norm is per row. */
    const void *rows = st->x;
    if (b->logit_rows) {
        be->gather_rows_i32(be, st->rows, st->x, b->logit_rows, b->n_logits, D);
        rows = st->rows;
    }
    be->rmsnorm(be, st->xn, rows, m->final_norm, b->n_logits, D, c->rms_norm_eps);
    if (m->tp.tensor_parallel_size <= 1) {
        be->linear(be, st->logits, st->xn, m->lm_head, NULL, b->n_logits, D, c->vocab_size);
        return COLT_OK;
    }
    be->linear(be, st->logits_part, st->xn, m->lm_head, NULL, b->n_logits, D, c->vocab_size);
    return model_tp_gather_logits(m, st->logits, st->logits_part, st->logits_gathered, b->n_logits, err);
}
