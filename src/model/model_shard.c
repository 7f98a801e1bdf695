/* model_shard.c — the weights cut into stages (StageLayout, shared with the
 * gradient windows of model_train.c) and ZeRO-3's partitioned weights: each
 * rank keeps a part of the arena and gathers a layer into a window while a
 * pass uses it (model_train.h). The gathers themselves are the caller's
 * (parallel/train_dist.c): this file decides what is gathered when and where it
 * goes, never how ranks talk.
 *
 * Dimension legend: L decoder layers; stage 0 the embedding, 1..L the layers,
 * L+1 the final norm and lm_head. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "model/model_internal.h"
#include "model/model_train.h"

/* ---------------------------------------------------------------- stages */

static int tensor_stage(const Model *owner, const TensorSpec *t) {
    int L = owner->cfg.num_hidden_layers;
    for (int l = 0; l < L; l++) {
        const char *p = (const char *)t->buf, *w = (const char *)&owner->layers[l];
        if (p >= w && p < w + sizeof(LayerWeights)) return l + 1;
    }
    return t->buf == &owner->embed ? 0 : L + 1;
}

size_t stage_layout_len(const StageLayout *sl, int s) {
    return (sl->range[s][0][1] - sl->range[s][0][0]) + (sl->range[s][1][1] - sl->range[s][1][0]);
}

bool stage_is_edge(const StageLayout *sl, int stage) { return stage == 0 || stage == sl->n_stages - 1; }

void stage_layout_build(StageLayout *sl, const Model *owner, const TensorSpec *t, int n, const size_t *offsets,
                        size_t numel) {
    memset(sl, 0, sizeof *sl);
    int L = owner->cfg.num_hidden_layers;
    sl->n_stages = L + 2;
    sl->range = xcalloc((size_t)sl->n_stages, sizeof *sl->range);
    sl->stage_of = xcalloc((size_t)(n ? n : 1), sizeof(int));
    sl->place = xcalloc((size_t)(n ? n : 1), sizeof(size_t));
    size_t covered = 0;
    for (int i = 0; i < n; i++) {
        int s = tensor_stage(owner, &t[i]), grp = model_param_no_weight_decay(t[i].name) ? 1 : 0;
        size_t lo = offsets[i], hi = lo + (tensor_spec_numel(&t[i]) + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
        size_t *r = sl->range[s][grp];
        if (r[0] == r[1]) r[0] = lo, r[1] = hi;
        else {
            COLT_ASSERT(lo == r[1]); /* contiguous, in table order */
            r[1] = hi;
        }
        sl->stage_of[i] = s;
        covered += hi - lo;
    }
    COLT_ASSERT(covered == numel);
    for (int s = 1; s <= L; s++)
        if (stage_layout_len(sl, s) > sl->window_numel) sl->window_numel = stage_layout_len(sl, s);
    int edges[2] = {0, L + 1};
    for (int e = 0; e < 2; e++)
        for (int grp = 0; grp < 2; grp++) {
            sl->edge_base[e][grp] = sl->edge_numel;
            sl->edge_numel += sl->range[edges[e]][grp][1] - sl->range[edges[e]][grp][0];
        }
    for (int i = 0; i < n; i++) {
        int s = sl->stage_of[i], grp = model_param_no_weight_decay(t[i].name) ? 1 : 0;
        size_t in_range = offsets[i] - sl->range[s][grp][0];
        if (stage_is_edge(sl, s)) sl->place[i] = sl->edge_base[s == 0 ? 0 : 1][grp] + in_range;
        else sl->place[i] = (grp == 0 ? 0 : sl->range[s][0][1] - sl->range[s][0][0]) + in_range;
    }
}

void stage_layout_free(StageLayout *sl) {
    free(sl->range);
    free(sl->stage_of);
    free(sl->place);
    memset(sl, 0, sizeof *sl);
}

/* ---------------------------------------------------------------- ZeRO-3 */

bool model_params_partitioned(const Model *m) { return m->part != NULL; }

/* A partition's device bytes: its part, and per_layer two layer windows and the edges (as partition_alloc
 * takes them). */
static size_t partition_bytes(const Model *m, const StageLayout *sl, size_t part_numel, bool per_layer) {
    size_t numel = part_numel ? part_numel : 1;
    if (per_layer) numel += 2 * (sl->window_numel ? sl->window_numel : 1) + (sl->edge_numel ? sl->edge_numel : 1);
    return numel * dtype_size(m->be->storage);
}

size_t model_params_partition_plan_bytes(const Model *m, size_t part_numel, bool per_layer) {
    if (m->part) return partition_bytes(m, &m->part->sl, part_numel, per_layer);
    StageLayout sl;
    stage_layout_build(&sl, m, m->tensors, m->n_tensors, m->offsets, m->arena_numel);
    size_t bytes = partition_bytes(m, &sl, part_numel, per_layer);
    stage_layout_free(&sl);
    return bytes;
}

/* The part, and per_layer the two layer windows and the edge buffer. */
static void partition_alloc(Model *m) {
    ModelPartition *p = m->part;
    const Backend *be = m->be;
    be->set_alloc_label(be, "zero_stage 3: this rank's part of the weights");
    p->shard = be->alloc(be, p->hi > p->lo ? p->hi - p->lo : 1);
    p->window_stage[0] = p->window_stage[1] = -1;
    p->edges_valid = false;
    if (!p->per_layer) {
        be->set_alloc_label(be, NULL);
        return;
    }
    be->set_alloc_label(be, "zero_stage 3: gathered layer windows and embedding / lm_head");
    for (int w = 0; w < 2; w++) {
        p->window[w] = be->alloc(be, p->sl.window_numel ? p->sl.window_numel : 1);
        p->window_stage[w] = -1;
    }
    p->edges = be->alloc(be, p->sl.edge_numel ? p->sl.edge_numel : 1);
    p->edges_valid = false;
    be->set_alloc_label(be, NULL);
}

static void partition_free_buffers(Model *m) {
    ModelPartition *p = m->part;
    const Backend *be = m->be;
    if (p->shard) be->free(be, p->shard);
    for (int w = 0; w < 2; w++)
        if (p->window[w]) be->free(be, p->window[w]);
    if (p->edges) be->free(be, p->edges);
    p->shard = p->edges = p->window[0] = p->window[1] = NULL;
}

/* The part, and the edges, copied out of the whole arena. */
static void partition_fill_from_arena(Model *m) {
    ModelPartition *p = m->part;
    const Backend *be = m->be;
    if (p->hi > p->lo) be->copy(be, p->shard, 0, m->arena, p->lo, p->hi - p->lo);
    if (!p->per_layer) return;
    int edges[2] = {0, p->sl.n_stages - 1};
    for (int e = 0; e < 2; e++)
        for (int grp = 0; grp < 2; grp++) {
            const size_t *r = p->sl.range[edges[e]][grp];
            if (r[1] > r[0]) be->copy(be, p->edges, p->sl.edge_base[e][grp], m->arena, r[0], r[1] - r[0]);
        }
    p->edges_valid = true;
}

int model_params_partition(Model *m, size_t lo, size_t hi, const ParamsGather *g, bool per_layer, char *err) {
    if (m->lora) return errorf(err, "zero_stage 3: the weights of a model with LoRA adapters are not partitioned");
    if (m->part) return errorf(err, "zero_stage 3: the model is partitioned already");
    if (lo > hi || hi > m->arena_numel)
        return errorf(err, "zero_stage 3: part [%zu, %zu) outside the %zu weights", lo, hi, m->arena_numel);
    ModelPartition *p = xcalloc(1, sizeof(ModelPartition));
    p->lo = lo;
    p->hi = hi;
    p->gather = *g;
    p->in_flight = -1;
    p->per_layer = per_layer;
    p->numel = m->arena_numel;
    stage_layout_build(&p->sl, m, m->tensors, m->n_tensors, m->offsets, m->arena_numel);
    m->part = p;
    partition_alloc(m);
    partition_fill_from_arena(m);
    m->be->free(m->be, m->arena);
    m->arena = NULL;
    for (int i = 0; i < m->n_tensors; i++) *m->tensors[i].buf = NULL;
    return COLT_OK;
}

void model_partition_free(Model *m) {
    ModelPartition *p = m->part;
    if (!p) return;
    partition_free_buffers(m);
    stage_layout_free(&p->sl);
    free(p);
    m->part = NULL;
}

void *model_params_at(const Model *m, size_t off) {
    size_t es = dtype_size(m->be->storage);
    if (m->lora) return (char *)m->lora->arena + off * es; /* the trainable parameters are the adapters */
    if (m->arena) return (char *)m->arena + off * es;
    COLT_ASSERT(m->part && off >= m->part->lo && off <= m->part->hi);
    return (char *)m->part->shard + (off - m->part->lo) * es;
}

int model_weights_mix(Model *target, const Model *source, double alpha, char *err) {
    if (target->lora || source->lora)
        return errorf(err, "reference sync: the models carry LoRA adapters (the reference of use_peft is the base model)");
    const ModelPartition *pt = target->part, *ps = source->part;
    if (target->arena_numel != source->arena_numel || (pt != NULL) != (ps != NULL) ||
        (pt && (pt->lo != ps->lo || pt->hi != ps->hi)) || target->be != source->be)
        return errorf(err, "reference sync: the reference and trained models hold different parts of the weights "
                           "(%zu vs %zu elements)", target->arena_numel, source->arena_numel);
    /* zero_stage 3: this rank's part, or the whole weights while gathered (the part's buffers are given back
     * then, and every rank mixes the same whole arena) */
    if (target->arena && !source->arena)
        return errorf(err, "reference sync: the reference model's weights are gathered, the trained model's are not");
    const Backend *be = target->be;
    size_t es = dtype_size(be->storage), n = target->arena ? target->arena_numel : pt->hi - pt->lo;
    void *dst = target->arena ? target->arena : pt->shard;
    const void *src = source->arena ? (const char *)source->arena + (target->arena || !ps ? 0 : ps->lo * es)
                                    : ps->shard;
    be->mul_scalar(be, dst, dst, (float)(1.0 - alpha), n);
    be->add_scaled(be, dst, dst, src, (float)alpha, n);
    model_params_changed(target);
    return COLT_OK;
}

void model_params_changed(Model *m) {
    model_weights_changed(m);
    ModelPartition *p = m->part;
    if (!p) return;
    p->window_stage[0] = p->window_stage[1] = -1;
    p->edges_valid = false;
}

/* Starts gathering both groups of stage s into dst (laid out [group 0 | group 1]). */
static int gather_stage(ModelPartition *p, int s, void *dst, size_t es, char *err) {
    size_t at = 0;
    for (int grp = 0; grp < 2; grp++) {
        const size_t *r = p->sl.range[s][grp];
        if (r[1] > r[0] && p->gather.start(p->gather.ctx, (char *)dst + at * es, r[0], r[1], p->numel, p->shard, err) != 0)
            return COLT_ERR;
        at += r[1] - r[0];
    }
    return COLT_OK;
}

/* The edge stages (both), gathered into their buffer and waited for. */
static int gather_edges(Model *m, char *err) {
    ModelPartition *p = m->part;
    size_t es = dtype_size(m->be->storage);
    int L = m->cfg.num_hidden_layers, edges[2] = {0, L + 1};
    for (int e = 0; e < 2; e++)
        if (gather_stage(p, edges[e], (char *)p->edges + p->sl.edge_base[e][0] * es, es, err) != 0) return COLT_ERR;
    if (p->gather.wait(p->gather.ctx, err) != 0) return COLT_ERR;
    p->in_flight = -1;
    p->edges_valid = true;
    return COLT_OK;
}

/* Points stage s's tensors at base (its window, or the edge buffer). */
static void point_stage(Model *m, int s, void *base) {
    size_t es = dtype_size(m->be->storage);
    for (int i = 0; i < m->n_tensors; i++)
        if (m->part->sl.stage_of[i] == s) *m->tensors[i].buf = (char *)base + m->part->sl.place[i] * es;
    if (m->cfg.tie_word_embeddings) m->lm_head = m->embed;
}

int model_params_use(Model *m, int stage, int next, char *err) {
    ModelPartition *p = m->part;
    if (!p || m->arena) return COLT_OK; /* whole weights: nothing to gather */
    if (!p->per_layer)
        return errorf(err, "zero_stage 3: this model's weights are gathered whole for a forward pass (model_params_gather_all), "
                           "not per layer");
    size_t es = dtype_size(m->be->storage);
    int w = stage & 1;
    if (stage_is_edge(&p->sl, stage)) {
        if (!p->edges_valid && gather_edges(m, err) != 0) return COLT_ERR;
        point_stage(m, 0, p->edges);
        point_stage(m, p->sl.n_stages - 1, p->edges);
        w = -1;
    } else {
        if (p->window_stage[w] != stage) {
            /* Not prefetched (the first layer of a pass, or weights changed): now. */
            if (gather_stage(p, stage, p->window[w], es, err) != 0) return COLT_ERR;
            p->window_stage[w] = stage;
            p->in_flight = w;
        }
        if (p->in_flight >= 0) {
            if (p->gather.wait(p->gather.ctx, err) != 0) return COLT_ERR;
            p->in_flight = -1;
        }
        point_stage(m, stage, p->window[w]);
    }
    if (next >= 1 && next < p->sl.n_stages - 1 && (next & 1) != w && p->window_stage[next & 1] != next) {
        /* The other window's last user was a stage whose ops are enqueued
         * already: the gather is ordered after them (train_dist.c). */
        if (p->in_flight >= 0) { /* one gather in flight at a time */
            if (p->gather.wait(p->gather.ctx, err) != 0) return COLT_ERR;
            p->in_flight = -1;
        }
        p->window_stage[next & 1] = -1;
        if (gather_stage(p, next, p->window[next & 1], es, err) != 0) return COLT_ERR;
        p->window_stage[next & 1] = next;
        p->in_flight = next & 1;
    }
    return COLT_OK;
}

/* While the whole weights exist the part, windows and edges are given back
 * (the arena holds all of it): generation, which takes its KV pool from what
 * is free, sees the same weight memory as without zero_stage 3. */
int model_params_gather_all(Model *m, char *err) {
    ModelPartition *p = m->part;
    if (!p || m->arena) return COLT_OK;
    const Backend *be = m->be;
    if (p->in_flight >= 0) { /* a prefetch nobody used: finish it first (collectives stay in order) */
        if (p->gather.wait(p->gather.ctx, err) != 0) return COLT_ERR;
        p->in_flight = -1;
    }
    be->set_alloc_label(be, "zero_stage 3: the whole weights, gathered for generation or saving");
    m->arena = be->alloc(be, m->arena_numel);
    be->set_alloc_label(be, NULL);
    if (p->gather.start(p->gather.ctx, m->arena, 0, m->arena_numel, m->arena_numel, p->shard, err) != 0 ||
        p->gather.wait(p->gather.ctx, err) != 0) {
        be->free(be, m->arena);
        m->arena = NULL;
        return COLT_ERR;
    }
    partition_free_buffers(m);
    size_t es = dtype_size(be->storage);
    for (int i = 0; i < m->n_tensors; i++) *m->tensors[i].buf = (char *)m->arena + m->offsets[i] * es;
    if (m->cfg.tie_word_embeddings) m->lm_head = m->embed;
    model_weights_changed(m); /* new addresses */
    return COLT_OK;
}

void model_params_release_all(Model *m) {
    if (!m->part || !m->arena) return;
    partition_alloc(m);
    partition_fill_from_arena(m);
    m->be->free(m->be, m->arena);
    m->arena = NULL;
    for (int i = 0; i < m->n_tensors; i++) *m->tensors[i].buf = NULL;
    model_weights_changed(m);
}
