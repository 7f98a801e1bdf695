/* model.c — Llama / Qwen2 / Qwen3 weights (load, random init, save) and the forward
 * pass with a KV cache, written once against the op table.
 *
 * Every weight is listed once in a tensor table (HF name, shape, init kind,
 * where its device buffer lives); load, save and random init all walk it.
 * This is not the generation loop (engine/); the backward pass is model_train.c.
 *
 * Dimension legend: N tokens in a forward call, D model width, F MLP width,
 * H query heads, KVH key/value heads, Dh head dim, V vocab, S cache slots,
 * L max cache length per slot, K tokens that want logits. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/fileio.h"
#include "core/rng.h"
#include "model/model.h"
#include "model/model_internal.h"
#include "model/safetensors.h"

struct ModelState {
    const Backend *be;         /* made the buffers; frees them */
    int n_layers, n_slots, max_len, max_tokens;
    void **k_cache, **v_cache; /* per layer [S, L, KVH*Dh] */
    void *x;                   /* [N, D] residual stream */
    void *xn;                  /* [N, D] normed */
    void *q;                   /* [N, H*Dh] */
    void *k, *v;               /* [N, KVH*Dh] */
    void *att;                 /* [N, H*Dh] */
    void *proj;                /* [N, D] o_proj / down_proj output */
    void *gate, *up;           /* [N, F] */
    void *rows;                /* [K, D] final hidden rows that want logits */
    void *lora_t, *lora_u;     /* [N, r], [N, widest adapted output]: LoRA scratch (NULL without adapters) */
    void *logits;              /* [K, V] */
    void *logits_part, *logits_gathered; /* tensor parallel: [K, V'] this rank's, [size, K, V'] the group's */
    int *want_rows;            /* [N] host: indices of the tokens that want logits */
    int *ids;                  /* [N] host: token ids into this rank's vocabulary part */
    size_t bytes;              /* device memory of the buffers above */
};

/* ---------------------------------------------------------------- tensor table */

static void spec_add(TensorSpec *t, int *n, const char *name, int64_t d0, int64_t d1, TensorInit init, void **buf,
                     TpSplit split) {
    TensorSpec *s = &t[(*n)++];
    s->split = split;
    snprintf(s->name, sizeof(s->name), "%s", name);
    s->ndim = d1 > 0 ? 2 : 1;
    s->shape[0] = d0;
    s->shape[1] = d1 > 0 ? d1 : 0;
    s->init = init;
    s->buf = buf;
}

/* Declared in model_internal.h (model_train.c reads it too). */
TensorSpec *model_tensor_table(Model *m, int *count) {
    const ModelConfig *c = &m->local; /* this rank's part of each tensor */
    int64_t D = c->hidden_size, F = c->intermediate_size, QD = (int64_t)c->num_attention_heads * c->head_dim,
            KVD = (int64_t)c->num_key_value_heads * c->head_dim;
    bool qkv_bias = c->arch == ARCH_QWEN2 || c->attention_bias;
    bool o_bias = c->arch != ARCH_QWEN2 && c->attention_bias; /* Llama's and Qwen3's attention_bias covers o_proj too */
    TensorSpec *t = xcalloc((size_t)c->num_hidden_layers * 15 + 3, sizeof(TensorSpec));
    int n = 0;
    char name[96];
    spec_add(t, &n, "model.embed_tokens.weight", c->vocab_size, D, INIT_NORMAL, &m->embed, TP_ROWS);
    for (int l = 0; l < c->num_hidden_layers; l++) {
        LayerWeights *w = &m->layers[l];
#define LAYER(suffix, d0, d1, init, field, split)                        \
    do {                                                                 \
        snprintf(name, sizeof(name), "model.layers.%d.%s", l, suffix);   \
        spec_add(t, &n, name, d0, d1, init, &w->field, split);           \
    } while (0)
        /* column-parallel (heads, intermediate columns) by rows; row-parallel by columns */
        LAYER("input_layernorm.weight", D, 0, INIT_ONES, attn_norm, TP_WHOLE);
        LAYER("self_attn.q_proj.weight", QD, D, INIT_NORMAL, q_w, TP_ROWS);
        if (qkv_bias) LAYER("self_attn.q_proj.bias", QD, 0, INIT_ZEROS, q_b, TP_ROWS);
        LAYER("self_attn.k_proj.weight", KVD, D, INIT_NORMAL, k_w, TP_KV_ROWS);
        if (qkv_bias) LAYER("self_attn.k_proj.bias", KVD, 0, INIT_ZEROS, k_b, TP_KV_ROWS);
        LAYER("self_attn.v_proj.weight", KVD, D, INIT_NORMAL, v_w, TP_KV_ROWS);
        if (qkv_bias) LAYER("self_attn.v_proj.bias", KVD, 0, INIT_ZEROS, v_b, TP_KV_ROWS);
        LAYER("self_attn.o_proj.weight", D, QD, INIT_NORMAL, o_w, TP_COLS);
        if (o_bias) LAYER("self_attn.o_proj.bias", D, 0, INIT_ZEROS, o_b, TP_WHOLE);
        if (model_has_qk_norm(c)) {
            LAYER("self_attn.q_norm.weight", c->head_dim, 0, INIT_ONES, q_norm, TP_WHOLE);
            LAYER("self_attn.k_norm.weight", c->head_dim, 0, INIT_ONES, k_norm, TP_WHOLE);
        }
        LAYER("post_attention_layernorm.weight", D, 0, INIT_ONES, mlp_norm, TP_WHOLE);
        LAYER("mlp.gate_proj.weight", F, D, INIT_NORMAL, gate_w, TP_ROWS);
        LAYER("mlp.up_proj.weight", F, D, INIT_NORMAL, up_w, TP_ROWS);
        LAYER("mlp.down_proj.weight", D, F, INIT_NORMAL, down_w, TP_COLS);
#undef LAYER
    }
    spec_add(t, &n, "model.norm.weight", D, 0, INIT_ONES, &m->final_norm, TP_WHOLE);
    if (c->num_labels > 0) /* a classifier's head (no bias), whole on every rank: its rows are labels, not vocabulary */
        spec_add(t, &n, "score.weight", c->num_labels, D, INIT_NORMAL, &m->lm_head, TP_WHOLE);
    else if (!c->tie_word_embeddings)
        spec_add(t, &n, "lm_head.weight", c->vocab_size, D, INIT_NORMAL, &m->lm_head, TP_ROWS);
    *count = n;
    return t;
}

bool model_param_no_weight_decay(const char *name) {
    /* transformers' Trainer.get_decay_parameter_names: no decay for names matching
     * bias, layernorm, rmsnorm, (^|.)norm($|.) or _norm($|.). */
    if (strstr(name, "bias") || strstr(name, "layernorm") || strstr(name, "rmsnorm")) return true;
    for (const char *p = strstr(name, "norm"); p; p = strstr(p + 1, "norm")) {
        char before = p == name ? '.' : p[-1], after = p[4];
        if ((before == '.' || before == '_') && (after == '\0' || after == '.')) return true;
    }
    return false;
}

/* Decayed tensors first, then the ones without weight decay, each group in
 * table order: the optimizer then runs one adamw call per group. */
size_t model_arena_layout(const TensorSpec *t, int n, size_t *offsets) {
    size_t total = 0;
    for (int group = 0; group < 2; group++)
        for (int i = 0; i < n; i++) {
            if (model_param_no_weight_decay(t[i].name) != (group == 1)) continue;
            offsets[i] = total;
            total += (tensor_spec_numel(&t[i]) + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
        }
    return total;
}

static size_t arena_no_decay_start(const Model *m) {
    size_t start = m->arena_numel;
    for (int i = 0; i < m->n_tensors; i++)
        if (model_param_no_weight_decay(m->tensors[i].name) && m->offsets[i] < start) start = m->offsets[i];
    return start;
}

int model_tp_check(const ModelConfig *c, int size, char *err) {
    if (size < 1) return errorf(err, "tensor_parallel_size %d must be >= 1", size);
    if (size == 1) return COLT_OK;
    struct { const char *name; int value; } dims[] = {{"num_attention_heads", c->num_attention_heads},
                                                     {"intermediate_size", c->intermediate_size},
                                                     {"vocab_size", c->vocab_size}};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
        if (dims[i].value % size != 0)
            return errorf(err, "tensor_parallel_size %d does not divide the model's %s (%d)", size, dims[i].name,
                          dims[i].value);
    /* KV heads are cut while there are enough of them, then replicated */
    int kvh = c->num_key_value_heads;
    if (kvh % size != 0 && size % kvh != 0)
        return errorf(err,
                      "tensor_parallel_size %d and the model's num_key_value_heads (%d): one must divide the other "
                      "(KV heads are cut across ranks, or each replicated on size / heads ranks)",
                      size, kvh);
    if (c->arch != ARCH_QWEN2 && c->attention_bias)
        return errorf(err, "tensor_parallel_size %d: models with an o_proj bias (attention_bias) are not supported", size);
    return COLT_OK;
}

int model_tensor_parallel_size(const Model *m) { return m->tp.tensor_parallel_size; }
int model_tensor_parallel_rank(const Model *m) { return m->tp.rank; }
bool model_tp_graph_safe(const Model *m) { return m->tp.tensor_parallel_size <= 1 || m->tp.graph_safe; }

/* cfg's dimensions on one rank of a group of tp->tensor_parallel_size. */
static ModelConfig local_config(const ModelConfig *cfg, const TensorParallel *tp) {
    ModelConfig c = *cfg;
    c.num_attention_heads /= tp->tensor_parallel_size;
    c.num_key_value_heads = c.num_key_value_heads >= tp->tensor_parallel_size ? c.num_key_value_heads / tp->tensor_parallel_size : 1;
    c.intermediate_size /= tp->tensor_parallel_size;
    c.vocab_size /= tp->tensor_parallel_size;
    return c;
}

static Model *model_alloc_tp(const ModelConfig *cfg, const Backend *be, const TensorParallel *tp) {
    Model *m = xcalloc(1, sizeof(Model));
    m->cfg = *cfg;
    m->tp = tp && tp->tensor_parallel_size > 1 ? *tp : (TensorParallel){.rank = 0, .tensor_parallel_size = 1};
    m->local = local_config(cfg, &m->tp);
    m->vocab_lo = m->tp.rank * m->local.vocab_size;
    m->kv_copies = m->tp.tensor_parallel_size > cfg->num_key_value_heads ? m->tp.tensor_parallel_size / cfg->num_key_value_heads : 1;
    m->be = be;
    m->layers = xcalloc((size_t)cfg->num_hidden_layers, sizeof(LayerWeights));
    m->rope_inv_freq = xcalloc((size_t)cfg->head_dim / 2, sizeof(float));
    model_rope_inv_freq(m->rope_inv_freq, cfg);
    m->tensors = model_tensor_table(m, &m->n_tensors);
    m->offsets = xcalloc((size_t)m->n_tensors, sizeof(size_t));
    m->arena_numel = model_arena_layout(m->tensors, m->n_tensors, m->offsets);
    return m;
}

static Model *model_alloc(const ModelConfig *cfg, const Backend *be) { return model_alloc_tp(cfg, be, NULL); }

/* The blocks a group of size cuts table entry s into (1: kept whole). */
static int tp_blocks(const Model *m, const TensorSpec *s) {
    if (s->split == TP_WHOLE) return 1;
    return s->split == TP_KV_ROWS ? m->tp.tensor_parallel_size / m->kv_copies : m->tp.tensor_parallel_size;
}

/* Declared in model_internal.h (lora.c cuts and gathers the adapters the same way). */
void model_tp_whole_shape(const Model *m, const TensorSpec *s, int64_t shape[2]) {
    int blocks = tp_blocks(m, s);
    shape[0] = s->shape[0] * (s->split == TP_COLS ? 1 : blocks);
    shape[1] = s->shape[1] * (s->split == TP_COLS ? blocks : 1);
}

static size_t whole_numel(const Model *m, const TensorSpec *s) {
    return tensor_spec_numel(s) * (size_t)tp_blocks(m, s);
}

/* model_tp_cut over elements of es bytes (fp32 on the host, or the storage dtype's raw bytes). */
static void tp_cut_bytes(const Model *m, const TensorSpec *s, const char *whole, char *part, size_t es) {
    size_t numel = tensor_spec_numel(s);
    int rank = m->tp.rank, size = m->tp.tensor_parallel_size;
    if (s->split != TP_COLS) { /* whole, or a block of consecutive rows */
        size_t block = s->split == TP_WHOLE ? 0 : (size_t)(s->split == TP_KV_ROWS ? rank / m->kv_copies : rank);
        memcpy(part, whole + block * numel * es, numel * es);
        return;
    }
    size_t rows = (size_t)s->shape[0], cols = (size_t)s->shape[1];
    for (size_t r = 0; r < rows; r++)
        memcpy(part + r * cols * es, whole + (r * cols * size + (size_t)rank * cols) * es, cols * es);
}

void model_tp_cut(const Model *m, const TensorSpec *s, const float *whole, float *part) {
    tp_cut_bytes(m, s, (const char *)whole, (char *)part, sizeof(float));
}

/* ---------------------------------------------------------------- a whole arena into a part */

/* The whole model's arena (as a whole model of m's config lays it out on a
 * backend of m's storage dtype: what a trainer sends) taken as a stream of
 * pieces in m's backend memory, cut on the device: the bytes of a piece that
 * fall in a tensor's part go straight to it (a whole tensor, or a block of
 * consecutive rows: one range); a column-cut tensor is staged whole (the
 * largest such, once) and its columns taken with copy_2d when complete. */
struct ModelPartReceiver {
    Model *m, *whole;   /* the part; a shell with the whole layout */
    int *order;         /* the whole table's entries by arena offset */
    int next;           /* order[next]: the tensor being received */
    size_t pos, bytes;  /* bytes of the stream seen; its length */
    void *stage;        /* backend: one whole column-cut tensor */
};

ModelPartReceiver *model_part_receiver_create(Model *m, size_t *whole_bytes) {
    ModelPartReceiver *r = xcalloc(1, sizeof *r);
    r->m = m;
    r->whole = model_plan_shell(&m->cfg, m->be, NULL, 1);
    size_t es = dtype_size(m->be->storage), max_cols = 0;
    COLT_ASSERT(r->whole->n_tensors == m->n_tensors);
    r->order = xmalloc(sizeof(int) * (size_t)r->whole->n_tensors);
    for (int i = 0; i < r->whole->n_tensors; i++) {
        COLT_ASSERT(strcmp(r->whole->tensors[i].name, m->tensors[i].name) == 0); /* one table, two layouts */
        r->order[i] = i;
        size_t numel = tensor_spec_numel(&r->whole->tensors[i]);
        if (m->tensors[i].split == TP_COLS && numel > max_cols) max_cols = numel;
    }
    /* by offset (insertion sort: a few hundred tensors) */
    for (int i = 1; i < r->whole->n_tensors; i++)
        for (int j = i; j > 0 && r->whole->offsets[r->order[j]] < r->whole->offsets[r->order[j - 1]]; j--) {
            int t = r->order[j];
            r->order[j] = r->order[j - 1];
            r->order[j - 1] = t;
        }
    if (max_cols) r->stage = m->be->alloc(m->be, max_cols);
    r->bytes = r->whole->arena_numel * es;
    *whole_bytes = r->bytes;
    return r;
}

void model_part_receiver_put(ModelPartReceiver *r, const void *piece, size_t n) {
    const Backend *be = r->m->be;
    const size_t es = dtype_size(be->storage);
    const int rank = r->m->tp.rank, size = r->m->tp.tensor_parallel_size;
    size_t lo = r->pos, hi = r->pos + n;
    COLT_ASSERT(lo % es == 0 && n % es == 0); /* pieces of whole elements (weight_sync's buckets are) */
    while (r->next < r->whole->n_tensors) {
        int i = r->order[r->next];
        const TensorSpec *w = &r->whole->tensors[i], *s = &r->m->tensors[i];
        size_t t_lo = r->whole->offsets[i] * es, t_hi = t_lo + tensor_spec_numel(w) * es;
        if (t_lo >= hi) break; /* starts in a later piece */
        size_t a = t_lo > lo ? t_lo : lo, b = t_hi < hi ? t_hi : hi;
        if (b > a && s->split == TP_COLS) {
            be->copy(be, r->stage, (a - t_lo) / es, piece, (a - lo) / es, (b - a) / es);
        } else if (b > a) { /* the part is one range of the whole (model_tp_cut's block) */
            size_t numel = tensor_spec_numel(s);
            size_t block = s->split == TP_WHOLE ? 0 : (size_t)(s->split == TP_KV_ROWS ? rank / r->m->kv_copies : rank);
            size_t p_lo = t_lo + block * numel * es, p_hi = p_lo + numel * es;
            size_t x = a > p_lo ? a : p_lo, y = b < p_hi ? b : p_hi;
            if (y > x) be->copy(be, *s->buf, (x - p_lo) / es, piece, (x - lo) / es, (y - x) / es);
        }
        if (t_hi > hi) break; /* the rest comes in the next piece */
        if (s->split == TP_COLS) {
            int rows = s->shape[0], cols = s->shape[1];
            be->copy_2d(be, *s->buf, (size_t)cols, (const char *)r->stage + (size_t)rank * (size_t)cols * es,
                        (size_t)cols * (size_t)size, rows, cols);
        }
        r->next++;
    }
    r->pos = hi;
}

bool model_part_receiver_done(const ModelPartReceiver *r) {
    return r->next == r->whole->n_tensors && r->pos == r->bytes;
}

void model_part_receiver_free(ModelPartReceiver *r) {
    if (!r) return;
    if (r->stage) r->m->be->free(r->m->be, r->stage);
    model_free(r->whole);
    free(r->order), free(r);
}

/* The one allocation of the weights; every tensor pointer is a view into it. */
static void model_alloc_weights(Model *m) {
    const Backend *be = m->be;
    m->arena = be->alloc(be, m->arena_numel);
    be->zero(be, m->arena, m->arena_numel);  /* the alignment padding stays 0 */
    size_t es = dtype_size(be->storage);
    for (int i = 0; i < m->n_tensors; i++) *m->tensors[i].buf = (char *)m->arena + m->offsets[i] * es;
    if (m->cfg.tie_word_embeddings) m->lm_head = m->embed;
}

Model *model_plan_shell(const ModelConfig *cfg, const Backend *be, const LoraConfig *lora, int tensor_parallel_size) {
    TensorParallel tp = {.rank = 0, .tensor_parallel_size = tensor_parallel_size}; /* a layout only: no collective ever runs on a shell */
    Model *m = model_alloc_tp(cfg, be, tensor_parallel_size > 1 ? &tp : NULL);
    if (lora) lora_plan(m, lora);
    return m;
}

void model_free(Model *m) {
    if (!m) return;
    lora_state_free(m);
    model_partition_free(m);
    if (m->arena) m->be->free(m->be, m->arena);
    free(m->offsets);
    free(m->tensors);
    free(m->layers);
    free(m->rope_inv_freq);
    free(m);
}

/* Declared in model_internal.h (model_train.c's view of the trainable parameters). */
size_t model_weights_no_decay_start(const Model *m) { return arena_no_decay_start(m); }

const ModelConfig *model_config(const Model *m) { return &m->cfg; }

static void format_shape(char *buf, size_t size, int ndim, const int64_t *shape) {
    size_t k = (size_t)snprintf(buf, size, "[");
    for (int d = 0; d < ndim && k < size; d++)
        k += (size_t)snprintf(buf + k, size - k, "%s%lld", d ? "," : "", (long long)shape[d]);
    if (k < size) snprintf(buf + k, size - k, "]");
}

const Backend *model_backend(const Model *m) { return m->be; }
const float *model_rope_table(const Model *m) { return m->rope_inv_freq; }
uint64_t model_weights_version(const Model *m) { return m->weights_version; }
/* The adapters' on/off switch is the lowest bit: switched off and on again (the reference log-probs of
 * LoRA with beta > 0, each step) the version is what it was, every address unmoved, so graphs recorded
 * with the adapters on stay valid. */
uint64_t model_weights_layout_version(const Model *m) {
    return m->weights_layout_version * 2 + (uint64_t)(m->lora && m->lora->enabled);
}
void model_weights_changed(Model *m) {
    m->weights_version++;
    m->weights_layout_version++;
}
void model_weights_changed_in_place(Model *m) { m->weights_version++; }

/* ---------------------------------------------------------------- load */

int model_load(Model **out, const char *dir, const Backend *be, char *err) {
    return model_load_tp(out, dir, be, NULL, err);
}

/* The rows of the head after the final norm: lm_head's vocabulary, or a classifier's labels. */
static int head_rows(const ModelConfig *c) { return c->num_labels > 0 ? c->num_labels : c->vocab_size; }

static int load_checkpoint(Model **out, const char *dir, const Backend *be, const TensorParallel *tp,
                           bool classifier, char *err);

int model_load_tp(Model **out, const char *dir, const Backend *be, const TensorParallel *tp, char *err) {
    return load_checkpoint(out, dir, be, tp, false, err);
}

int model_load_classifier(Model **out, const char *dir, const Backend *be, const TensorParallel *tp, char *err) {
    return load_checkpoint(out, dir, be, tp, true, err);
}

/* A causal LM (classifier false) or a *ForSequenceClassification (true); the
 * other kind is refused by name, so a reward model never reaches the engine or
 * the trainer, whose logits are vocabulary-wide. */
static int load_checkpoint(Model **out, const char *dir, const Backend *be, const TensorParallel *tp,
                           bool classifier, char *err) {
    *out = NULL;
    ModelConfig cfg;
    if (model_config_load(&cfg, NULL, dir, err) != 0) return COLT_ERR;
    if (!classifier && cfg.num_labels > 0)
        return errorf(err, "%s is a %s sequence classifier (a reward model): it scores text and cannot generate or "
                           "be trained here; give it as a reward ({type: model, path: %s})",
                      dir, model_arch_name(cfg.arch), dir);
    if (classifier && cfg.num_labels == 0)
        return errorf(err, "%s/config.json: not a sequence-classification checkpoint (architectures must be "
                           "LlamaForSequenceClassification, Qwen2ForSequenceClassification or "
                           "Qwen3ForSequenceClassification)", dir);
    if (tp && model_tp_check(&cfg, tp->tensor_parallel_size, err) != 0) return COLT_ERR;
    SafeTensorsSet set;
    if (safetensors_open_dir(&set, dir, err) != 0) return COLT_ERR;
    Model *m = model_alloc_tp(&cfg, be, tp);
    const int size = m->tp.tensor_parallel_size;
    int n = 0;
    TensorSpec *t = model_tensor_table(m, &n);
    char *where = set.n_files == 1 ? xstrdup(set.paths[0]) : path_join(dir, "model.safetensors.index.json");
    /* Check every tensor before converting any, so a bad file fails fast. */
    size_t max_numel = 0;
    for (int i = 0; i < n; i++) {
        const SafeTensor *st = safetensors_find(&set, t[i].name, NULL);
        if (!st) {
            errorf(err, "%s: missing tensor '%s'", where, t[i].name);
            goto error;
        }
        int64_t whole[2];
        model_tp_whole_shape(m, &t[i], whole);
        if (st->ndim != t[i].ndim || st->shape[0] != whole[0] || (t[i].ndim == 2 && st->shape[1] != whole[1])) {
            char have[128], want[64];
            format_shape(have, sizeof(have), st->ndim, st->shape);
            format_shape(want, sizeof(want), t[i].ndim, whole);
            errorf(err, "%s: tensor '%s' has shape %s, config wants %s", where, t[i].name, have, want);
            goto error;
        }
        if (tensor_spec_numel(&t[i]) > max_numel) max_numel = tensor_spec_numel(&t[i]);
    }
    float *host = xmalloc(max_numel * (size_t)size * sizeof(float));
    float *part = size > 1 ? xmalloc(max_numel * sizeof(float)) : host;
    model_alloc_weights(m);
    for (int i = 0; i < n; i++) {
        const char *path = NULL;
        const SafeTensor *st = safetensors_find(&set, t[i].name, &path);
        /* a NaN weight would only show up later as NaN logits or loss */
        if (safetensors_to_f32_finite(host, st, path, err) != 0) {
            if (part != host) free(part);
            free(host);
            goto error;
        }
        if (size > 1) model_tp_cut(m, &t[i], host, part);
        be->upload(be, *t[i].buf, part, tensor_spec_numel(&t[i]));
    }
    if (part != host) free(part);
    free(host);
    if (cfg.tie_word_embeddings) m->lm_head = m->embed;
    free(t);
    free(where);
    safetensors_set_free(&set);
    *out = m;
    return COLT_OK;
error:
    free(t);
    free(where);
    safetensors_set_free(&set);
    model_free(m);
    return COLT_ERR;
}

/* ---------------------------------------------------------------- random init */

static int save_configs(const ModelConfig *c, const char *dir, DType dtype, char *err);

static int check_random_config(const ModelConfig *cfg, char *err) {
    if (cfg->hidden_size <= 0 || cfg->intermediate_size <= 0 || cfg->num_hidden_layers <= 0 ||
        cfg->num_attention_heads <= 0 || cfg->num_key_value_heads <= 0 || cfg->head_dim <= 0 ||
        cfg->head_dim % 2 != 0 || cfg->vocab_size <= 0 || cfg->num_attention_heads % cfg->num_key_value_heads != 0)
        return errorf(err, "random init: invalid config (sizes must be positive, head_dim even, "
                           "num_key_value_heads must divide num_attention_heads)");
    return COLT_OK;
}

/* Element j of tensor number `index` in the tensor table: normal(0, 0.02)
 * weights keyed by (seed, index, j), norms 1, biases 0. model_create_random and
 * model_save_random share it, so both give the same checkpoint. */
static float random_init_value(TensorInit init, uint64_t seed, int index, size_t j) {
    if (init == INIT_ONES) return 1.0f;
    if (init == INIT_ZEROS) return 0.0f;
    return 0.02f * rng_normal(seed, (uint64_t)index, (uint64_t)j);
}

int model_create_random(Model **out, const ModelConfig *cfg, uint64_t seed, const Backend *be, char *err) {
    return model_create_random_tp(out, cfg, seed, be, NULL, err);
}

int model_create_random_tp(Model **out, const ModelConfig *cfg, uint64_t seed, const Backend *be,
                           const TensorParallel *tp, char *err) {
    *out = NULL;
    if (check_random_config(cfg, err) != 0) return COLT_ERR;
    if (tp && model_tp_check(cfg, tp->tensor_parallel_size, err) != 0) return COLT_ERR;
    Model *m = model_alloc_tp(cfg, be, tp);
    const int size = m->tp.tensor_parallel_size;
    int n = 0;
    TensorSpec *t = model_tensor_table(m, &n);
    size_t max_numel = 0;
    for (int i = 0; i < n; i++)
        if (tensor_spec_numel(&t[i]) > max_numel) max_numel = tensor_spec_numel(&t[i]);
    float *host = xmalloc(max_numel * (size_t)size * sizeof(float));
    float *part = size > 1 ? xmalloc(max_numel * sizeof(float)) : host;
    model_alloc_weights(m);
    for (int i = 0; i < n; i++) {
        size_t numel = whole_numel(m, &t[i]);
#pragma omp parallel for schedule(static)
        for (size_t j = 0; j < numel; j++) host[j] = random_init_value(t[i].init, seed, i, j);
        if (size > 1) model_tp_cut(m, &t[i], host, part);
        be->upload(be, *t[i].buf, part, tensor_spec_numel(&t[i]));
    }
    if (part != host) free(part);
    free(host);
    free(t);
    if (cfg->tie_word_embeddings) m->lm_head = m->embed;
    *out = m;
    return COLT_OK;
}

typedef struct RandomFill {
    TensorInit init;
    uint64_t seed;
    int index;
} RandomFill;

static void random_fill(float *dst, size_t start, size_t count, void *ctx) {
    const RandomFill *f = ctx;
#pragma omp parallel for schedule(static)
    for (size_t k = 0; k < count; k++) dst[k] = random_init_value(f->init, f->seed, f->index, start + k);
}

int model_save_config(const ModelConfig *cfg, const char *dir, DType dtype, char *err) {
    if (check_random_config(cfg, err) != 0 || make_dirs(dir, err) != 0) return COLT_ERR;
    return save_configs(cfg, dir, dtype, err);
}

int model_save_random(const ModelConfig *cfg, uint64_t seed, const char *dir, DType dtype, char *err) {
    if (check_random_config(cfg, err) != 0) return COLT_ERR;
    if (dtype != DTYPE_F32 && dtype != DTYPE_BF16) return errorf(err, "%s: random init writes F32 or BF16 only", dir);
    if (make_dirs(dir, err) != 0) return COLT_ERR;
    Model *m = model_alloc(cfg, NULL); /* only for the tensor table; no buffers */
    int n = 0;
    TensorSpec *t = model_tensor_table(m, &n);
    SafeTensorWrite *w = xcalloc((size_t)n, sizeof(SafeTensorWrite));
    RandomFill *fills = xcalloc((size_t)n, sizeof(RandomFill));
    for (int i = 0; i < n; i++) {
        fills[i] = (RandomFill){.init = t[i].init, .seed = seed, .index = i};
        w[i] = (SafeTensorWrite){.name = t[i].name, .ndim = t[i].ndim, .shape = {t[i].shape[0], t[i].shape[1]},
                                 .fill = random_fill, .fill_ctx = &fills[i]};
    }
    char *path = path_join(dir, "model.safetensors");
    int rc = safetensors_write(path, w, n, dtype, err);
    if (rc == 0) rc = save_configs(cfg, dir, dtype, err);
    free(path);
    free(fills);
    free(w);
    free(t);
    model_free(m);
    return rc;
}

/* ---------------------------------------------------------------- save */

/* A JSON real holding the shortest decimal that round-trips to the float, so
 * 1e-6f is written as 1e-06, not 9.99999997e-07. */
static json_t *json_real_from_float(float f) {
    char buf[32];
    for (int p = 1; p <= 9; p++) {
        snprintf(buf, sizeof(buf), "%.*g", p, (double)f);
        if (strtof(buf, NULL) == f) break;
    }
    return json_real(strtod(buf, NULL));
}

static json_t *json_eos_ids(const ModelConfig *c) {
    if (c->n_eos == 0) return json_null();
    if (c->n_eos == 1) return json_integer(c->eos_token_ids[0]);
    json_t *a = json_array();
    for (int i = 0; i < c->n_eos; i++) json_array_append_new(a, json_integer(c->eos_token_ids[i]));
    return a;
}

static int write_json(const char *dir, const char *file, json_t *root, char *err) {
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9));
    json_decref(root);
    COLT_ASSERT(text);
    size_t len = strlen(text);
    text = xrealloc(text, len + 2);
    text[len++] = '\n';
    text[len] = '\0';
    char *path = path_join(dir, file);
    int rc = file_write_atomic(path, text, len, err);
    free(path);
    free(text);
    return rc;
}

static int save_configs(const ModelConfig *c, const char *dir, DType dtype, char *err) {
    bool llama = c->arch == ARCH_LLAMA;
    static const char *const CLASS[] = {[ARCH_LLAMA] = "LlamaForCausalLM", [ARCH_QWEN2] = "Qwen2ForCausalLM",
                                        [ARCH_QWEN3] = "Qwen3ForCausalLM"};
    json_t *root = json_object();
    json_t *archs = json_array();
    json_array_append_new(archs, json_string(CLASS[c->arch]));
    json_object_set_new(root, "architectures", archs);
    json_object_set_new(root, "model_type", json_string(model_arch_name(c->arch)));
    json_object_set_new(root, "hidden_act", json_string("silu"));
    json_object_set_new(root, "hidden_size", json_integer(c->hidden_size));
    json_object_set_new(root, "intermediate_size", json_integer(c->intermediate_size));
    json_object_set_new(root, "num_hidden_layers", json_integer(c->num_hidden_layers));
    json_object_set_new(root, "num_attention_heads", json_integer(c->num_attention_heads));
    json_object_set_new(root, "num_key_value_heads", json_integer(c->num_key_value_heads));
    json_object_set_new(root, "head_dim", json_integer(c->head_dim));
    json_object_set_new(root, "vocab_size", json_integer(c->vocab_size));
    json_object_set_new(root, "max_position_embeddings", json_integer(c->max_position_embeddings));
    json_object_set_new(root, "rms_norm_eps", json_real_from_float(c->rms_norm_eps));
    json_object_set_new(root, "rope_theta", json_real_from_float(c->rope_theta));
    /* transformers 5 reads rope_parameters; 4.x reads rope_theta and rope_scaling. */
    json_t *scaling = json_object();
    json_object_set_new(scaling, "rope_type", json_string(model_rope_type_name(c->rope_type)));
    if (c->rope_type != ROPE_DEFAULT) json_object_set_new(scaling, "factor", json_real_from_float(c->rope_factor));
    if (c->rope_type == ROPE_LLAMA3) {
        json_object_set_new(scaling, "low_freq_factor", json_real_from_float(c->rope_low_freq_factor));
        json_object_set_new(scaling, "high_freq_factor", json_real_from_float(c->rope_high_freq_factor));
        json_object_set_new(scaling, "original_max_position_embeddings",
                            json_integer(c->rope_original_max_position_embeddings));
    }
    json_t *rope = json_deep_copy(scaling);
    json_object_set_new(rope, "rope_theta", json_real_from_float(c->rope_theta));
    json_object_set_new(root, "rope_parameters", rope);
    if (c->rope_type == ROPE_DEFAULT) {
        json_decref(scaling);
        json_object_set_new(root, "rope_scaling", json_null());
    } else {
        json_object_set_new(root, "rope_scaling", scaling);
    }
    json_object_set_new(root, "tie_word_embeddings", json_boolean(c->tie_word_embeddings));
    if (c->arch != ARCH_QWEN2) json_object_set_new(root, "attention_bias", json_boolean(c->attention_bias));
    if (llama) json_object_set_new(root, "mlp_bias", json_false());
    else json_object_set_new(root, "use_sliding_window", json_false());
    json_object_set_new(root, "bos_token_id", c->bos_token_id >= 0 ? json_integer(c->bos_token_id) : json_null());
    json_object_set_new(root, "eos_token_id", json_eos_ids(c));
    json_object_set_new(root, "torch_dtype", json_string(dtype == DTYPE_BF16 ? "bfloat16" : "float32"));
    json_object_set_new(root, "initializer_range", json_real(0.02));
    json_object_set_new(root, "use_cache", json_true());
    if (write_json(dir, "config.json", root, err) != 0) return COLT_ERR;

    json_t *gen = json_object();
    json_object_set_new(gen, "bos_token_id", c->bos_token_id >= 0 ? json_integer(c->bos_token_id) : json_null());
    json_object_set_new(gen, "eos_token_id", json_eos_ids(c));
    return write_json(dir, "generation_config.json", gen, err);
}

/* Streams one tensor from the device in the writer's chunks (no host copy of
 * the model); merging LoRA needs the whole tensor, so then one tensor at a
 * time is held while it is written. */
typedef struct SaveFill {
    const Model *m;
    const TensorSpec *spec;
    void *const *buf; /* the tensor's buffer pointer (its TensorSpec.buf) */
    size_t numel;     /* the whole tensor's */
    bool merge;
    float *whole;     /* merge, or tensor parallel: the whole tensor, while it is being written */
    int index;        /* in the tensor table */
    char *err;        /* a failed gather's message (the writer's fill cannot fail) */
    bool *failed;
} SaveFill;

/* Tensor parallel saving: the group's rank 0 writes, in the writer's order,
 * and before each gather tells the others which tensor comes next (index + 1;
 * 0: done) through a sum over the group where only it adds. */
static int tp_announce(const Model *m, int mine, int *got, char *err) {
    float v = (float)mine; /* table indices are far below 2^24 */
    int rc = model_tp_sum_host(m, &v, err);
    *got = (int)v;
    return rc;
}

/* Declared in model_internal.h. An adapted weight being merged is gathered
 * in fp32, so a part's W + s B A is rounded once, to the file's dtype, as a
 * whole model's merge is. */
int model_tp_gather_tensor(const Model *m, const TensorSpec *s, float *whole, bool merge, char *err) {
    const Backend *be = m->be;
    size_t numel = tensor_spec_numel(s), size = (size_t)m->tp.tensor_parallel_size;
    if (s->split == TP_WHOLE) {
        be->download(be, whole, *s->buf, numel);
        if (merge) lora_merge_into(m, s->buf, whole);
        return COLT_OK;
    }
    bool f32 = merge && lora_merges_into(m, s->buf); /* the same on every rank: the adapters target the same layers */
    void *mine = NULL, *all = f32 ? be->alloc_f32(be, numel * size) : be->alloc(be, numel * size);
    if (f32) { /* this rank's part with its adapters' parts folded in */
        float *host = xmalloc(numel * sizeof(float));
        be->download(be, host, *s->buf, numel);
        lora_merge_into(m, s->buf, host);
        mine = be->alloc_f32(be, numel);
        be->upload_f32(be, mine, host, numel);
        free(host);
    }
    int rc = m->tp.all_gather(m->tp.ctx, all, f32 ? mine : *s->buf, numel, f32, err);
    float *parts = s->split == TP_ROWS ? whole : xmalloc(numel * size * sizeof(float)); /* rows: blocks in rank order */
    if (rc == 0 && f32) be->download_f32(be, parts, all, numel * size);
    if (rc == 0 && !f32) be->download(be, parts, all, numel * size);
    if (rc == 0 && s->split == TP_KV_ROWS) /* one copy of each block: the first of its kv_copies ranks' */
        for (size_t b = 0; b < size / (size_t)m->kv_copies; b++)
            memcpy(whole + b * numel, parts + b * (size_t)m->kv_copies * numel, numel * sizeof(float));
    if (rc == 0 && s->split == TP_COLS) {
        size_t rows = (size_t)s->shape[0], cols = (size_t)s->shape[1];
        for (size_t r = 0; r < size; r++)
            for (size_t i = 0; i < rows; i++)
                memcpy(whole + i * cols * size + r * cols, parts + r * numel + i * cols, cols * sizeof(float));
    }
    if (parts != whole) free(parts);
    if (mine) be->free(be, mine);
    be->free(be, all);
    return rc;
}

static void save_fill(float *dst, size_t start, size_t count, void *ctx) {
    SaveFill *f = ctx;
    const Backend *be = f->m->be;
    if (f->m->tp.tensor_parallel_size > 1) {
        if (start == 0) {
            f->whole = xcalloc(f->numel, sizeof(float));
            int next = 0;
            if (!*f->failed && (tp_announce(f->m, f->index + 1, &next, f->err) != 0 ||
                                model_tp_gather_tensor(f->m, f->spec, f->whole, f->merge, f->err) != 0))
                *f->failed = true;
        }
        memcpy(dst, f->whole + start, count * sizeof(float));
        if (start + count == f->numel) {
            free(f->whole);
            f->whole = NULL;
        }
        return;
    }
    if (!f->merge) {
        be->download(be, dst, (const char *)*f->buf + start * dtype_size(be->storage), count);
        return;
    }
    if (!f->whole) {
        f->whole = xmalloc(f->numel * sizeof(float));
        be->download(be, f->whole, *f->buf, f->numel);
        lora_merge_into(f->m, f->buf, f->whole);
    }
    memcpy(dst, f->whole + start, count * sizeof(float));
    if (start + count == f->numel) {
        free(f->whole);
        f->whole = NULL;
    }
}

#define SHARD_NAME_FMT "model-%05d-of-%05d.safetensors"

/* Removes DIR's weight files of the other layout (a single file when writing
 * shards, and the index and shards when writing one file): the loader would
 * otherwise read a stale one. */
static void remove_other_layout(const char *dir, bool sharded) {
    char *single = path_join(dir, "model.safetensors"), *index = path_join(dir, "model.safetensors.index.json");
    if (sharded) remove(single);
    else {
        json_t *root = json_load_file(index, 0, NULL);
        const char *k;
        json_t *v;
        json_object_foreach(json_object_get(root, "weight_map"), k, v) {
            const char *file = json_string_value(v);
            if (file && !strchr(file, '/')) {
                char *p = path_join(dir, file);
                remove(p);
                free(p);
            }
        }
        json_decref(root);
        remove(index);
    }
    free(single);
    free(index);
}

/* The base weights as they are, or (merge) with the LoRA adapters folded in:
 * one model.safetensors, or shards of at most max_shard_bytes with
 * model.safetensors.index.json (transformers' layout) when larger. */
static int save_weights(const Model *m, const char *dir, DType dtype, bool merge, size_t max_shard_bytes, char *err) {
    if (dtype != DTYPE_F32 && dtype != DTYPE_BF16)
        return errorf(err, "%s: model_save writes F32 or BF16 only", dir);
    if (m->tp.tensor_parallel_size > 1 && m->tp.rank != 0) { /* the group's rank 0 writes: take part in its gathers */
        int n = 0;
        TensorSpec *t = model_tensor_table((Model *)m, &n);
        size_t max_numel = 0;
        for (int i = 0; i < n; i++)
            if (tensor_spec_numel(&t[i]) > max_numel) max_numel = tensor_spec_numel(&t[i]);
        float *whole = xmalloc(max_numel * (size_t)m->tp.tensor_parallel_size * sizeof(float));
        int rc = COLT_OK, next = 0;
        while (rc == 0 && (rc = tp_announce(m, 0, &next, err)) == 0 && next > 0 && next <= n)
            rc = model_tp_gather_tensor(m, &t[next - 1], whole, merge, err);
        free(whole);
        free(t);
        return rc;
    }
    if (make_dirs(dir, err) != 0) return COLT_ERR;
    int n = 0;
    TensorSpec *t = model_tensor_table((Model *)m, &n); /* only reads the buffer pointers */
    SafeTensorWrite *w = xcalloc((size_t)n, sizeof(SafeTensorWrite));
    SaveFill *fills = xcalloc((size_t)n, sizeof(SaveFill));
    size_t total = 0, es = dtype_size(dtype);
    bool gather_failed = false;
    char gather_err[ERR_LEN] = "";
    for (int i = 0; i < n; i++) {
        int64_t shape[2]; /* the whole tensor's (a tensor-parallel rank holds a part) */
        model_tp_whole_shape(m, &t[i], shape);
        size_t numel = (size_t)shape[0] * (size_t)(t[i].ndim == 2 ? shape[1] : 1);
        fills[i] = (SaveFill){.m = m, .spec = &t[i], .buf = t[i].buf, .numel = numel, .merge = merge, .index = i,
                              .err = gather_err, .failed = &gather_failed};
        w[i] = (SafeTensorWrite){.name = t[i].name, .ndim = t[i].ndim, .shape = {shape[0], shape[1]},
                                 .fill = save_fill, .fill_ctx = &fills[i]};
        total += numel * es;
    }
    /* Shards: tensors in table order, a new file when the next would pass the limit. */
    int *file_of = xcalloc((size_t)n, sizeof(int)), n_files = 1;
    size_t in_file = 0;
    for (int i = 0; i < n; i++) {
        size_t bytes = fills[i].numel * es;
        if (in_file > 0 && in_file + bytes > max_shard_bytes) n_files++, in_file = 0;
        file_of[i] = n_files - 1;
        in_file += bytes;
    }
    int rc = COLT_OK;
    if (n_files == 1) {
        char *path = path_join(dir, "model.safetensors");
        rc = safetensors_write(path, w, n, dtype, err);
        free(path);
        if (rc == 0) remove_other_layout(dir, false);
    } else {
        json_t *map = json_object();
        SafeTensorWrite *part = xcalloc((size_t)n, sizeof(SafeTensorWrite));
        for (int f = 0; f < n_files && rc == 0; f++) {
            char name[64];
            snprintf(name, sizeof name, SHARD_NAME_FMT, f + 1, n_files);
            int k = 0;
            for (int i = 0; i < n; i++)
                if (file_of[i] == f) {
                    part[k++] = w[i];
                    json_object_set_new(map, t[i].name, json_string(name));
                }
            char *path = path_join(dir, name);
            rc = safetensors_write(path, part, k, dtype, err);
            free(path);
        }
        free(part);
        if (rc == 0) {
            json_t *root = json_object(), *meta = json_object();
            json_object_set_new(meta, "total_size", json_integer((json_int_t)total));
            json_object_set_new(root, "metadata", meta);
            json_object_set_new(root, "weight_map", map);
            remove_other_layout(dir, true);
            rc = write_json(dir, "model.safetensors.index.json", root, err);
        } else json_decref(map);
    }
    int done = 0; /* the others stop waiting for tensors, also after a failed write */
    if (m->tp.tensor_parallel_size > 1 && !gather_failed && tp_announce(m, 0, &done, gather_err) != 0) gather_failed = true;
    if (rc == 0 && gather_failed) rc = errorf(err, "%s: gathering the tensor-parallel parts: %s", dir, gather_err);
    if (rc == 0) rc = save_configs(&m->cfg, dir, dtype, err);
    for (int i = 0; i < n; i++) free(fills[i].whole);
    free(fills);
    free(file_of);
    free(w);
    free(t);
    return rc;
}

int model_save(const Model *m, const char *dir, DType dtype, char *err) {
    return save_weights(m, dir, dtype, false, MODEL_SAVE_SHARD_BYTES, err);
}

int model_save_sharded(const Model *m, const char *dir, DType dtype, size_t max_shard_bytes, char *err) {
    return save_weights(m, dir, dtype, false, max_shard_bytes ? max_shard_bytes : MODEL_SAVE_SHARD_BYTES, err);
}

int model_save_merged(const Model *m, const char *dir, DType dtype, char *err) {
    if (!m->lora) return errorf(err, "%s: the model has no LoRA adapters to merge", dir);
    return save_weights(m, dir, dtype, true, MODEL_SAVE_SHARD_BYTES, err);
}

/* ---------------------------------------------------------------- state */

int model_state_create(ModelState **out, const Model *m, int n_slots, int max_len, int max_tokens, char *err) {
    *out = NULL;
    if (n_slots <= 0 || max_len <= 0 || max_tokens <= 0)
        return errorf(err, "model_state_create: n_slots (%d), max_len (%d) and max_tokens (%d) must be positive",
                      n_slots, max_len, max_tokens);
    const ModelConfig *c = &m->local;
    const Backend *be = m->be;
    size_t N = (size_t)max_tokens, D = (size_t)c->hidden_size, F = (size_t)c->intermediate_size,
           QD = (size_t)c->num_attention_heads * c->head_dim, KVD = (size_t)c->num_key_value_heads * c->head_dim;
    ModelState *st = xcalloc(1, sizeof(ModelState));
    st->be = be;
    st->n_layers = c->num_hidden_layers;
    st->n_slots = n_slots;
    st->max_len = max_len;
    st->max_tokens = max_tokens;
    st->k_cache = xcalloc((size_t)c->num_hidden_layers, sizeof(void *));
    st->v_cache = xcalloc((size_t)c->num_hidden_layers, sizeof(void *));
    for (int l = 0; l < c->num_hidden_layers; l++) {
        st->k_cache[l] = backend_alloc_counted(be, (size_t)n_slots * max_len * KVD, &st->bytes);
        st->v_cache[l] = backend_alloc_counted(be, (size_t)n_slots * max_len * KVD, &st->bytes);
    }
    st->x = backend_alloc_counted(be, N * D, &st->bytes);
    st->xn = backend_alloc_counted(be, N * D, &st->bytes);
    st->q = backend_alloc_counted(be, N * QD, &st->bytes);
    st->k = backend_alloc_counted(be, N * KVD, &st->bytes);
    st->v = backend_alloc_counted(be, N * KVD, &st->bytes);
    st->att = backend_alloc_counted(be, N * QD, &st->bytes);
    st->proj = backend_alloc_counted(be, N * D, &st->bytes);
    st->gate = backend_alloc_counted(be, N * F, &st->bytes);
    st->up = backend_alloc_counted(be, N * F, &st->bytes);
    st->rows = backend_alloc_counted(be, N * D, &st->bytes);
    if (m->lora) {
        st->lora_t = backend_alloc_counted(be, N * (size_t)lora_rank(m), &st->bytes);
        st->lora_u = backend_alloc_counted(be, N * (size_t)lora_max_out_dim(m), &st->bytes);
    }
    st->want_rows = xmalloc(N * sizeof(int));
    st->ids = xmalloc(N * sizeof(int));
    st->logits = backend_alloc_counted(be, N * (size_t)head_rows(&m->cfg), &st->bytes);
    if (m->tp.tensor_parallel_size > 1) {
        st->logits_part = backend_alloc_counted(be, N * (size_t)c->vocab_size, &st->bytes);
        st->logits_gathered = backend_alloc_counted(be, N * (size_t)m->cfg.vocab_size, &st->bytes);
    }
    *out = st;
    return COLT_OK;
}

size_t model_state_bytes(const ModelState *st) { return st ? st->bytes : 0; }

size_t model_weight_bytes(const Model *m) {
    size_t es = dtype_size(m->be->storage);
    if (!m->part || m->arena) return m->arena_numel * es; /* whole (zero_stage 3 gives its part back meanwhile) */
    return model_params_partition_plan_bytes(m, m->part->hi - m->part->lo, m->part->per_layer);
}

void model_state_free(ModelState *st) {
    if (!st) return;
    const Backend *be = st->be;
    for (int l = 0; l < st->n_layers; l++) {
        be->free(be, st->k_cache[l]);
        be->free(be, st->v_cache[l]);
    }
    free(st->k_cache);
    free(st->v_cache);
    void *bufs[] = {st->x,    st->xn,   st->q,  st->k,    st->v,      st->att,   st->proj,
                    st->gate, st->up,   st->rows, st->logits, st->lora_t, st->lora_u, st->logits_part,
                    st->logits_gathered};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        if (bufs[i]) be->free(be, bufs[i]);
    free(st->want_rows);
    free(st->ids);
    free(st);
}

/* ---------------------------------------------------------------- forward */

static const void *adapter_input(LoraInputFn fn, void *ctx, int l, LoraTarget t, const void *x) {
    return fn ? fn(ctx, l, t, x) : x;
}

/* ---- tensor parallelism ---- */

int model_tp_sum_host(const Model *m, float *v, char *err) {
    const Backend *be = m->be;
    void *buf = be->alloc_f32(be, 1);
    be->upload_f32(be, buf, v, 1);
    int rc = m->tp.all_reduce(m->tp.ctx, buf, 1, true, err);
    be->download_f32(be, v, buf, 1);
    be->free(be, buf);
    return rc;
}

int model_tp_sum(const Model *m, void *x, size_t n, char *err) {
    if (m->tp.tensor_parallel_size <= 1) return COLT_OK;
    return m->tp.all_reduce(m->tp.ctx, x, n, false, err);
}

void model_tp_local_ids(const Model *m, int *ids, const int *tokens, int n) {
    int lo = m->vocab_lo, hi = lo + m->local.vocab_size;
    for (int i = 0; i < n; i++) ids[i] = tokens[i] >= lo && tokens[i] < hi ? tokens[i] - lo : -1;
}

int model_embed(const Model *m, void *x, const int *tokens, int *ids, int n, char *err) {
    const Backend *be = m->be;
    int D = m->local.hidden_size;
    if (m->tp.tensor_parallel_size <= 1) {
        be->embedding(be, x, m->embed, tokens, n, D);
        return COLT_OK;
    }
    model_tp_local_ids(m, ids, tokens, n);
    be->embedding(be, x, m->embed, ids, n, D); /* others' tokens: zero rows */
    return model_tp_sum(m, x, (size_t)n * D, err);
}

int model_tp_gather_logits(const Model *m, void *full, const void *local, void *gathered, int k, char *err) {
    if (m->tp.tensor_parallel_size <= 1) return COLT_OK;
    size_t Vp = (size_t)m->local.vocab_size, V = (size_t)m->cfg.vocab_size;
    if (m->tp.all_gather(m->tp.ctx, gathered, local, (size_t)k * Vp, false, err) != 0) return COLT_ERR;
    size_t es = dtype_size(m->be->storage);
    for (int r = 0; r < m->tp.tensor_parallel_size; r++) /* rank r's [k, V'] block: columns [r V', (r + 1) V') of full */
        m->be->copy_2d(m->be, (char *)full + (size_t)r * Vp * es, V, (const char *)gathered + (size_t)r * k * Vp * es,
                       Vp, k, (int)Vp);
    return COLT_OK;
}

/* q, k, v of layer l stored and attended: b->att (and b->lse) from b->xn_attn. */
static void layer_attention(const Model *m, int l, const LayerBuffers *b, const LayerKv *kv, int n,
                            LoraInputFn lora_input, void *ctx) {
    const ModelConfig *c = &m->local;
    const Backend *be = m->be;
    const int D = c->hidden_size, H = c->num_attention_heads, KVH = c->num_key_value_heads, Dh = c->head_dim,
              QD = H * Dh, KVD = KVH * Dh;
    const LayerWeights *w = &m->layers[l];
    const PagedBatch *pb = kv->paged;
    void *lt = b->lora_t, *lu = b->lora_u;
    /* One GEMM over q|k|v, rope and the K/V store in one kernel (and, for a
     * decode step, the attention too): paged only; the fused kernels have no
     * q/k norm, and the adapter terms need q, k and v apart. The fused kernels
     * give the unfused sequence's bits; the one GEMM sums in its own order, as
     * any GEMM does. */
    bool qkv_lora = model_lora_active(m, w, LORA_Q) || model_lora_active(m, w, LORA_K) ||
                    model_lora_active(m, w, LORA_V);
    if (pb && b->qkv && be->qkv_rope_store && !w->q_norm && !qkv_lora &&
        model_qkv_back_to_back(w, c, dtype_size(be->storage))) {
        be->linear(be, b->qkv, b->xn_attn, w->q_w, w->q_b, n, D, QD + 2 * KVD);
        if (pb->decode && be->paged_attention_rope) {
            be->paged_attention_rope(be, b->att, b->q, kv->k, kv->v, b->qkv, pb->block_tables, pb->seq, pb->pos,
                                     pb->slot_mapping, n, H, KVH, Dh, m->rope_inv_freq, kv->block_size, pb->max_blocks);
            return;
        }
        be->qkv_rope_store(be, b->q, kv->k, kv->v, b->qkv, pb->pos, pb->slot_mapping, n, H, KVH, Dh, m->rope_inv_freq);
    } else {
        /* Qwen3 norms the projections per head (rows of Dh): from q_lin / k_lin when kept, else in place. */
        void *q = w->q_norm && b->q_lin ? b->q_lin : b->q, *k = w->q_norm && b->k_lin ? b->k_lin : b->k;
        be->linear(be, q, b->xn_attn, w->q_w, w->q_b, n, D, QD);
        be->linear(be, k, b->xn_attn, w->k_w, w->k_b, n, D, KVD);
        be->linear(be, b->v, b->xn_attn, w->v_w, w->v_b, n, D, KVD);
        model_lora_add(m, w, LORA_Q, q, adapter_input(lora_input, ctx, l, LORA_Q, b->xn_attn), n, lt, lu);
        model_lora_add(m, w, LORA_K, k, adapter_input(lora_input, ctx, l, LORA_K, b->xn_attn), n, lt, lu);
        model_lora_add(m, w, LORA_V, b->v, adapter_input(lora_input, ctx, l, LORA_V, b->xn_attn), n, lt, lu);
        if (w->q_norm) {
            be->rmsnorm(be, b->q, q, w->q_norm, n * H, Dh, c->rms_norm_eps);
            be->rmsnorm(be, b->k, k, w->k_norm, n * KVH, Dh, c->rms_norm_eps);
        }
        if (pb) {
            be->rope_i32(be, b->q, pb->pos, n, H, Dh, m->rope_inv_freq);
            be->rope_i32(be, b->k, pb->pos, n, KVH, Dh, m->rope_inv_freq);
            be->paged_kv_store(be, kv->k, kv->v, b->k, b->v, pb->slot_mapping, n, KVD);
        } else {
            be->rope(be, b->q, kv->pos, n, H, Dh, m->rope_inv_freq);
            be->rope(be, b->k, kv->pos, n, KVH, Dh, m->rope_inv_freq);
            be->kv_store(be, kv->k, kv->v, b->k, b->v, kv->slot, kv->pos, n, KVD, kv->max_len);
        }
    }
    if (pb)
        be->paged_attention(be, b->att, b->q, kv->k, kv->v, pb->block_tables, pb->seq, pb->pos, n, H, KVH, Dh,
                            kv->block_size, pb->max_blocks);
    else
        be->attention(be, b->att, b->lse, b->q, kv->k, kv->v, kv->slot, kv->pos, n, H, KVH, Dh, kv->max_len);
}

int model_layer_forward(const Model *m, int l, const LayerBuffers *b, const LayerKv *kv, int n, LoraInputFn lora_input,
                        void *ctx, char *err) {
    const ModelConfig *c = &m->local;
    const Backend *be = m->be;
    const int D = c->hidden_size, F = c->intermediate_size, QD = c->num_attention_heads * c->head_dim;
    const size_t ND = (size_t)n * D;
    const LayerWeights *w = &m->layers[l];
    void *lt = b->lora_t, *lu = b->lora_u;
    /* one residual stream: adds fused with the norms after them (see model_internal.h) */
    const bool fused_norms = be->add_rmsnorm && b->x_out && b->x_in == b->x_mid && b->x_mid == b->x_out;
    if (l == 0 || !fused_norms) be->rmsnorm(be, b->xn_attn, b->x_in, w->attn_norm, n, D, c->rms_norm_eps);
    layer_attention(m, l, b, kv, n, lora_input, ctx);
    be->linear(be, b->proj, b->att, w->o_w, w->o_b, n, QD, D);
    model_lora_add(m, w, LORA_O, b->proj, adapter_input(lora_input, ctx, l, LORA_O, b->att), n, lt, lu);
    if (model_tp_sum(m, b->proj, ND, err) != 0) return COLT_ERR; /* row-parallel: the heads' parts */
    if (fused_norms) {
        be->add_rmsnorm(be, b->x_mid, b->xn_mlp, b->proj, w->mlp_norm, n, D, c->rms_norm_eps);
    } else {
        be->add(be, b->x_mid, b->x_in, b->proj, ND);
        be->rmsnorm(be, b->xn_mlp, b->x_mid, w->mlp_norm, n, D, c->rms_norm_eps);
    }
    bool gate_up_lora = model_lora_active(m, w, LORA_GATE) || model_lora_active(m, w, LORA_UP);
    if (b->gate_up && b->x_out && be->swiglu_gate_up && !gate_up_lora &&
        model_gate_up_back_to_back(w, c, dtype_size(be->storage))) {
        be->linear(be, b->gate_up, b->xn_mlp, w->gate_w, NULL, n, D, 2 * F);
        be->swiglu_gate_up(be, b->h, b->gate_up, n, F);
    } else {
        be->linear(be, b->gate, b->xn_mlp, w->gate_w, NULL, n, D, F);
        be->linear(be, b->up, b->xn_mlp, w->up_w, NULL, n, D, F);
        model_lora_add(m, w, LORA_GATE, b->gate, adapter_input(lora_input, ctx, l, LORA_GATE, b->xn_mlp), n, lt, lu);
        model_lora_add(m, w, LORA_UP, b->up, adapter_input(lora_input, ctx, l, LORA_UP, b->xn_mlp), n, lt, lu);
        if (!b->x_out) return COLT_OK;
        be->swiglu(be, b->h, b->gate, b->up, (size_t)n * F);
    }
    be->linear(be, b->proj, b->h, w->down_w, NULL, n, F, D);
    model_lora_add(m, w, LORA_DOWN, b->proj, adapter_input(lora_input, ctx, l, LORA_DOWN, b->h), n, lt, lu);
    if (model_tp_sum(m, b->proj, ND, err) != 0) return COLT_ERR;
    if (fused_norms && l + 1 < c->num_hidden_layers)
        be->add_rmsnorm(be, b->x_out, b->xn_attn, b->proj, m->layers[l + 1].attn_norm, n, D, c->rms_norm_eps);
    else
        be->add(be, b->x_out, b->x_mid, b->proj, ND);
    return COLT_OK;
}

int model_forward(Model *m, ModelState *st, const int *tokens, const int *slot, const int *pos, int n,
                  const uint8_t *want_logits, float *logits, char *err) {
    const ModelConfig *c = &m->local;
    const Backend *be = m->be;
    if (n < 0 || n > st->max_tokens)
        return errorf(err, "model_forward: %d tokens, state holds at most %d per call", n, st->max_tokens);
    int n_want = 0;
    for (int i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= m->cfg.vocab_size)
            return errorf(err, "model_forward: token id %d out of range (vocab %d)", tokens[i], m->cfg.vocab_size);
        if (slot[i] < 0 || slot[i] >= st->n_slots)
            return errorf(err, "model_forward: slot %d out of range (%d slots)", slot[i], st->n_slots);
        if (pos[i] < 0 || pos[i] >= st->max_len)
            return errorf(err, "model_forward: position %d out of range (max_len %d)", pos[i], st->max_len);
        n_want += !want_logits || want_logits[i];
    }
    if (n == 0) return COLT_OK;
    int D = c->hidden_size, V = head_rows(&m->cfg); /* a classifier's "logits" are its labels' scores */
    if (model_embed(m, st->x, tokens, st->ids, n, err) != 0) return COLT_ERR;
    /* nothing kept: one residual stream, one normed buffer, q_norm in place */
    LayerBuffers lb = {.x_in = st->x, .xn_attn = st->xn, .q = st->q, .k = st->k, .v = st->v, .att = st->att,
                       .proj = st->proj, .x_mid = st->x, .xn_mlp = st->xn, .gate = st->gate, .up = st->up,
                       .h = st->gate, .x_out = st->x, .lora_t = st->lora_t, .lora_u = st->lora_u};
    LayerKv kv = {.slot = slot, .pos = pos, .max_len = st->max_len};
    for (int l = 0; l < c->num_hidden_layers; l++) {
        kv.k = st->k_cache[l];
        kv.v = st->v_cache[l];
        if (model_layer_forward(m, l, &lb, &kv, n, NULL, NULL, err) != 0) return COLT_ERR;
    }
    if (n_want == 0) return COLT_OK;
    be->rmsnorm(be, st->xn, st->x, m->final_norm, n, D, c->rms_norm_eps);
    const void *rows = st->xn;
    if (n_want < n) { /* lm_head only on the rows that want logits */
        for (int i = 0, k = 0; i < n; i++)
            if (want_logits[i]) st->want_rows[k++] = i;
        be->gather_rows(be, st->rows, st->xn, st->want_rows, n_want, D);
        rows = st->rows;
    }
    if (m->tp.tensor_parallel_size > 1 && c->num_labels == 0) { /* this rank's vocabulary columns, then the group's */
        be->linear(be, st->logits_part, rows, m->lm_head, NULL, n_want, D, c->vocab_size);
        if (model_tp_gather_logits(m, st->logits, st->logits_part, st->logits_gathered, n_want, err) != 0)
            return COLT_ERR;
    } else {
        be->linear(be, st->logits, rows, m->lm_head, NULL, n_want, D, V);
    }
    be->download(be, logits, st->logits, (size_t)n_want * V);
    return COLT_OK;
}
