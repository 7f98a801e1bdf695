/* model_train.h — training on top of model.h: a forward pass that keeps its
 * activations and returns per-token log-probs (and entropies), the backward
 * pass from d(loss)/d(log-prob) to every trainable parameter's gradient (the
 * weights, or the LoRA adapters when attached: lora.h), and access to
 * parameters and gradients for the optimizer.
 *
 * Written against the op table like the inference forward; the CPU backend is
 * the fp32 reference. Gradients are accumulated (+=) so micro-batches add up;
 * model_grads_zero starts a new step.
 *
 * Batch layout (as model_forward): n tokens, token i in sequence slot[i] at
 * position pos[i]; every sequence's tokens are present from position 0 up to
 * its length (a training batch holds whole sequences: prompt + completion).
 * Dimension legend: N tokens, D width, V vocab. */
#ifndef COLT_MODEL_MODEL_TRAIN_H
#define COLT_MODEL_MODEL_TRAIN_H

#include <stdbool.h>
#include <stddef.h>

#include "model/model.h"

/* ---- parameters and gradients (the optimizer's view) ---- */

/* Number of parameter tensors (tied lm_head counted once, as embed_tokens). */
int model_param_count(const Model *m);

typedef struct ModelParam {
    const char *name;  /* HF name, e.g. "model.layers.0.mlp.up_proj.weight" */
    void *data;        /* backend buffer */
    size_t numel;
} ModelParam;
ModelParam model_param(const Model *m, int index);
/* Under tensor parallelism: how many ranks of the group hold the same values
 * of parameter index — the group's size for a tensor each holds whole (the
 * norms), Model.kv_copies for the k/v projections when KV heads are
 * replicated, else 1 — so its gradient counts once in the global norm. 1 for
 * a whole model. */
int model_param_copies(const Model *m, int index);
/* Parameter index's element offset in model_params_flat's layout. */
size_t model_param_offset(const Model *m, int index);
/* The trainable parameters as one buffer (storage dtype; numel includes the
 * alignment padding, which stays 0): the weights' arena, or the adapters'
 * while LoRA adapters are attached (lora.h). Weight-decayed tensors come
 * first; those transformers' Trainer exempts (biases, norms) start at
 * model_params_no_decay_start. */
void *model_params_flat(const Model *m, size_t *numel);
/* The model's own weights whatever is trainable: the weights' arena and its
 * tensors, also while LoRA adapters are attached (when model_param* and
 * model_params_flat are the adapters and these the frozen base). A weight
 * channel sends them once so that a server's base is the trainer's. The
 * arena is NULL while the weights are partitioned (zero_stage 3). */
void *model_weights_flat(const Model *m, size_t *numel);
int model_weight_count(const Model *m);
ModelParam model_weight(const Model *m, int index);
size_t model_params_no_decay_start(const Model *m);

/* fp32 gradients, one backend buffer per parameter tensor, same order. */
typedef struct ModelGrads ModelGrads;
int model_grads_create(ModelGrads **out, const Model *m, char *err);
void model_grads_free(ModelGrads *g);
void model_grads_zero(ModelGrads *g);
void *model_grad(const ModelGrads *g, int index);  /* backend buffer, numel as model_param(index) */
size_t model_grads_bytes(const ModelGrads *g);     /* device bytes (fp32) */
/* All gradients as one [f32] buffer laid out like model_params_flat (padding 0). */
void *model_grads_flat(const ModelGrads *g, size_t *numel);
/* The sum of squares of the whole model's gradients (the global norm's
 * square): of g's buffer, or under tensor parallelism of every part's, summed
 * over the group with a parameter each rank holds whole (the norms) counted
 * once. Collective over the group then. */
int model_grads_sum_squares(const Model *m, const ModelGrads *g, double *out, char *err);

/* Told by model_train_backward, while it runs, which gradients are final: the
 * elements [lo, hi) of the flat buffer will not change again in this backward
 * (the lm_head and final norm first, then each layer from the last, the
 * embedding last; a range is announced when its ops are enqueued, not when
 * they have run). Every backward announces the same ranges in the same order,
 * together covering the flat buffer — also a backward over no tokens — so
 * ranks that bucket them issue the same collectives. A non-zero return stops
 * the backward with that error. NULL fn: no announcements. */
typedef int (*GradsReadyFn)(void *ctx, size_t lo, size_t hi, char *err);
void model_grads_on_ready(ModelGrads *g, GradsReadyFn fn, void *ctx);

/* ZeRO-2: gradients that exist only while they are being handed over. Each
 * decoder layer's gradients live in one of two alternating windows from the
 * start of its backward until its announcement has been handled (the
 * GradsReadyFn must take them then: the window is zeroed for the layer after
 * next); the embedding, final norm and lm_head keep a buffer of their own.
 * Every backward starts from zero (no accumulation across backwards: the
 * receiver accumulates), model_grads_flat returns NULL, and device memory is
 * two layers' gradients plus those edges instead of all of them. */
int model_grads_create_windowed(ModelGrads **out, const Model *m, char *err);
bool model_grads_windowed(const ModelGrads *g);
/* Where the announced range starting at flat offset lo lives now (a [f32]
 * buffer of hi - lo elements): for the GradsReadyFn. */
void *model_grads_range_data(const ModelGrads *g, size_t lo);
/* The device bytes model_grads_create(_windowed) would take for m (a plan shell works). */
size_t model_grads_plan_bytes(const Model *m, bool windowed);

/* ---- ZeRO-3: each rank keeps a part of the weights ----
 *
 * After model_params_partition the model keeps only elements [lo, hi) of the
 * flat weights (model_params_flat's layout) and two layer windows plus the
 * embedding / final norm / lm_head ("edges"); model_train_forward and
 * model_train_backward gather each layer's weights into a window just before
 * using it, the next layer's gather started while the current one computes.
 * The edges are gathered once after each weight change (model_params_changed)
 * and kept. Whole weights (the engine, model_forward, saving) exist only
 * between model_params_gather_all and model_params_release_all.
 *
 * A model that only runs model_forward (a reward model) is partitioned
 * without layer windows (per_layer false): at rest it keeps its part alone,
 * and is used only between model_params_gather_all and
 * model_params_release_all.
 *
 * The gathers are the caller's (the data-parallel layer): start fills
 * dst[hi - lo] (storage dtype) with flat elements [lo, hi) of the numel flat
 * weights (the ranks' parts cut from numel), this rank's part
 * of them from shard (flat elements [part lo, part hi)) and the others' from
 * their ranks; it may return before the data is there, and wait blocks until
 * every started gather completed. Collective: every rank calls them with the
 * same ranges in the same order, which the model guarantees as long as every
 * rank makes the same passes (also over no tokens). */
typedef struct ParamsGather {
    int (*start)(void *ctx, void *dst, size_t lo, size_t hi, size_t numel, const void *shard, char *err);
    int (*wait)(void *ctx, char *err);
    void *ctx;
} ParamsGather;
/* Keeps [lo, hi) of the weights (copied from the whole arena, which is
 * freed) and, per_layer, allocates the windows and edges. Not with LoRA
 * adapters attached. */
int model_params_partition(Model *m, size_t lo, size_t hi, const ParamsGather *g, bool per_layer, char *err);
bool model_params_partitioned(const Model *m);
/* Whole weights in the arena (allocated and gathered; collective), until
 * model_params_release_all frees them. Nothing for a whole model. */
int model_params_gather_all(Model *m, char *err);
void model_params_release_all(Model *m);
/* This rank's part changed (an optimizer step): gathered copies are stale. */
void model_params_changed(Model *m);
/* TR-DPO's reference sync (TRL's SyncRefModelCallback): target = alpha x source + (1 - alpha) x target over
 * the weights this rank holds — the whole arena, its tensor-parallel part, or under zero_stage 3 its part
 * [lo, hi) of the flat weights — in torch's order: target *= 1 - alpha, then target += alpha x source (two
 * roundings to storage, as torch's mul_ and add_ on bf16 weights; each factor rounded to fp32 from the double,
 * as torch takes Python's 1 - alpha and alpha). Both models must be cut alike (same config,
 * tensor-parallel rank and partition) and carry no LoRA adapters; each rank mixes its own part, which is
 * the mix of the whole weights. Local: no collective. */
int model_weights_mix(Model *target, const Model *source, double alpha, char *err);
/* Trainable parameter element off of model_params_flat's layout: in the
 * adapters' arena with LoRA attached, else in the weights' arena, or in this
 * rank's part (which must hold it) when partitioned. */
void *model_params_at(const Model *m, size_t off);
/* The device bytes a partition takes: the part, plus the windows and edges when per_layer. */
size_t model_params_partition_plan_bytes(const Model *m, size_t part_numel, bool per_layer);

/* ---- training forward / backward ---- */

/* Activations for up to max_tokens tokens in up to n_slots sequences of up to
 * max_len tokens, allocated once. */
typedef struct TrainState TrainState;
int train_state_create(TrainState **out, const Model *m, int n_slots, int max_len, int max_tokens, char *err);
/* The same with activation recompute (gradient checkpointing): only each
 * layer's input is kept, and the backward reruns a layer's forward before
 * going back through it — about one extra forward of compute for activation
 * memory of one layer instead of all of them. Gradients are identical. */
int train_state_create_recompute(TrainState **out, const Model *m, int n_slots, int max_len, int max_tokens,
                                 bool recompute, char *err);
void train_state_free(TrainState *st);
/* The device bytes train_state_create_recompute would allocate (to choose
 * recompute before allocating). */
size_t train_state_plan_bytes(const Model *m, int n_slots, int max_len, int max_tokens, bool recompute);
size_t train_state_bytes(const TrainState *st);    /* device bytes of its activations */

/* Forward over n tokens. For each token with targets[i] >= 0, logprobs[i] =
 * log softmax(logits_i / temperature)[targets[i]] and entropy[i] = the entropy
 * of softmax(logits_i / temperature) (entropy may be NULL); tokens with
 * targets[i] < 0 get 0 in both. logprobs/entropy are host arrays [N].
 * Activations are kept in st for model_train_backward. The full [N, V] logits
 * are never stored: the lm_head and log-softmax run in chunks of tokens. */
int model_train_forward(Model *m, TrainState *st, const int *tokens, const int *slot, const int *pos,
                        const int *targets, int n, float temperature, float *logprobs, float *entropy,
                        char *err);

/* Backward of the last model_train_forward: given dlogprobs[N] = d loss /
 * d logprobs[i] (host array; 0 where targets[i] < 0), accumulates every
 * parameter's gradient into g (+=). */
int model_train_backward(Model *m, TrainState *st, const float *dlogprobs, ModelGrads *g, char *err);

/* model_train_backward with d loss / d entropy[N] as well (host array; the entropies of the forward; NULL:
 * none, exactly model_train_backward), for TRL's entropy bonus. */
int model_train_backward_entropy(Model *m, TrainState *st, const float *dlogprobs, const float *dentropy,
                                 ModelGrads *g, char *err);

#endif
