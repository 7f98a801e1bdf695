/* backend.h — the op table: every op the model, engine and trainer need.
 *
 * Model code never branches on the device: it calls these function pointers.
 * Buffers are opaque device pointers (void *) made by alloc/free; model code
 * never dereferences them, and moves data in and out with upload/download.
 * The CPU backend (backend/cpu) stores fp32 and is the reference definition of
 * every op; a CUDA backend (later issue) stores bf16 with fp32 accumulation.
 *
 * Dimension legend: N tokens in a forward call (any mix of sequences), D model
 * width, F MLP width, H query heads, KVH key/value heads, Dh head dim, V vocab,
 * S cache slots (sequences), L max cache length per slot.
 * Contract: outputs are overwritten (=), never accumulated, unless a name says
 * otherwise. */
#ifndef COLT_BACKEND_BACKEND_H
#define COLT_BACKEND_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum { DTYPE_F32 = 0, DTYPE_BF16 = 1, DTYPE_F16 = 2 } DType;

/* What kind of device an instance computes on: code outside src/backend asks
 * this (and the capabilities below) instead of reading the backend's name. */
typedef enum { BACKEND_DEVICE_CPU = 0, BACKEND_DEVICE_GPU = 1 } BackendDeviceKind;

struct SamplingParams; /* backend/sampling.h */
typedef struct Backend Backend;

/* One decoder layer's weights and KV pools for decode_layers (below): q|k|v
 * weights [(H + 2*KVH)*Dh, D] and their bias (NULL for none), o [D, H*Dh] and
 * its bias (NULL for none), gate|up [2F, D], down [D, F], norms [D]; pools as
 * paged_kv_store's. */
typedef struct DecodeLayerWeights {
    const void *attn_norm, *qkv_w, *qkv_b, *o_w, *o_b, *mlp_norm, *gate_up_w, *down_w;
    void *k_pool, *v_pool;
} DecodeLayerWeights;

typedef struct DecodeDims {
    int n_layers, hidden, intermediate, n_heads, n_kv_heads, head_dim;
    int block_size, max_blocks; /* the pools' block size, the block table's width */
    float rms_eps;
    const float *rope_inv_freq; /* [head_dim / 2] host, as the rope ops take it; copied by decode_layers_create */
} DecodeDims;

struct Backend {
    const char *name;
    /* The instance: the device it was opened on (CPU: 0) and its own state
     * (streams, GEMM plans, scratch, options), private to the backend. Every op
     * receives its instance as the first argument; nothing is process-wide. */
    int device;
    BackendDeviceKind device_kind;
    /* Buffers live in device memory that NCCL reaches, with streams to order
     * collectives against the ops: collectives may go over NCCL (when it is
     * built, and every rank of the group has a device of its own). */
    bool nccl_capable;
    void *ctx;
    void (*close_instance)(Backend *be); /* frees ctx and the instance (backend_close calls it) */
    /* Storage dtype of alloc() buffers: weights and activations (CPU: F32; CUDA:
     * BF16). Gradients of parameters, optimizer state and per-token log-probs
     * live in fp32 buffers from alloc_f32; the ops below mark those "[f32]".
     * Every other buffer argument is in the storage dtype. */
    DType storage;
    /* Rows of logits the training lm_head computes per chunk: bounds the [rows, V]
     * scratch, and big enough on a GPU for the GEMM and the softmax to fill it. */
    int logits_chunk_rows;

    /* Every field from here to the end is an op (a function pointer): the
     * profiling wrapper (profile.c) must wrap each, and checks that it does. */

    /* Memory (sizes in elements). */
    void *(*alloc)(const Backend *be, size_t n_elements);
    void *(*alloc_f32)(const Backend *be, size_t n_elements);
    void (*free)(const Backend *be, void *buf);  /* either kind */
    void (*upload)(const Backend *be, void *dst, const float *src, size_t n);   /* fp32 host -> storage buffer */
    void (*download)(const Backend *be, float *dst, const void *src, size_t n); /* storage buffer -> fp32 host */
    void (*upload_f32)(const Backend *be, void *dst, const float *src, size_t n);   /* fp32 host -> [f32] buffer */
    void (*download_f32)(const Backend *be, float *dst, const void *src, size_t n); /* [f32] buffer -> fp32 host */
    void (*copy)(const Backend *be, void *dst, size_t dst_offset, const void *src, size_t src_offset, size_t n);
    /* Raw byte copies between host memory and any buffer (no conversion),
     * finished when they return: the optimizer's offload moves gradient and
     * weight ranges with these. */
    void (*copy_to_host)(const Backend *be, void *dst, const void *src, size_t bytes);
    void (*copy_from_host)(const Backend *be, void *dst, const void *src, size_t bytes);
    /* Host memory for such copies: page-locked on a GPU (copies at the bus's
     * speed), plain aligned memory on the CPU. NULL if it cannot be had. */
    void *(*alloc_host)(const Backend *be, size_t bytes);
    void (*free_host)(const Backend *be, void *p);
    /* Bytes of this instance's alloc / alloc_f32 buffers held now and the most
     * held since the last reset (reset_peak: the peak restarts from now): what
     * the memory plan's figures are checked against. */
    void (*memory_stats)(const Backend *be, size_t *in_use, size_t *peak, bool reset_peak);
    /* Names what the next allocations are for ("optimizer state, planned 30.5
     * GB"), so that running out of memory says which buffer and what the plan
     * gave it; NULL clears it. Copied. */
    void (*set_alloc_label)(const Backend *be, const char *label);

    /* dst[i, :] = src[rows[i], :] for i < n (rows: host array); gathers the
     * hidden rows that need logits. */
    void (*gather_rows)(const Backend *be, void *dst, const void *src, const int *rows, int n, int dim);
    /* dst[rows[i], :] = src[i, :] for i < n (rows distinct; host array). */
    void (*scatter_rows)(const Backend *be, void *dst, const void *src, const int *rows, int n, int dim);

    /* out[N, out_dim] = x[N, in_dim] @ w[out_dim, in_dim]^T (+ bias[out_dim] if non-NULL).
     * w is in PyTorch nn.Linear layout. */
    void (*linear)(const Backend *be, void *out, const void *x, const void *w, const void *bias,
                   int n, int in_dim, int out_dim);
    /* out[N, D] = x / sqrt(mean(x^2) + eps) * w; out may be x (in place) */
    void (*rmsnorm)(const Backend *be, void *out, const void *x, const void *w, int n, int dim, float eps);
    /* In place on x[N, n_heads, head_dim]: rotate_half RoPE (HF Llama/Qwen2 layout)
     * at positions pos[N]: dims j and j + Dh/2 rotate by the fp32 angle
     * (float)pos * inv_freq[j]. inv_freq[head_dim / 2] is a host array (the
     * model's frequencies, model_rope_inv_freq: default, linear or llama3);
     * a backend may keep a device copy and compare it on every call. */
    void (*rope)(const Backend *be, void *x, const int *pos, int n, int n_heads, int head_dim, const float *inv_freq);
    /* Writes k[N, KVH*Dh] and v[N, KVH*Dh] of token i into the cache at
     * (slot[i], pos[i]); caches are [S, L, KVH*Dh] per layer. */
    void (*kv_store)(const Backend *be, void *k_cache, void *v_cache, const void *k, const void *v,
                     const int *slot, const int *pos, int n, int kv_dim, int max_len);
    /* Causal attention: token i's query q[i, H, Dh] attends to cache positions
     * 0..pos[i] of slot[i] (GQA: head h reads KV head h / (H/KVH)), softmax
     * scaled by 1/sqrt(Dh); out[N, H*Dh]. lse[N, H] [f32], when not NULL,
     * receives each row's log-sum-exp of the scaled scores (natural log), for
     * attention_backward; generation passes NULL. */
    void (*attention)(const Backend *be, void *out, void *lse, const void *q, const void *k_cache, const void *v_cache,
                      const int *slot, const int *pos, int n, int n_heads, int n_kv_heads,
                      int head_dim, int max_len);
    /* out[i] = silu(gate[i]) * up[i] over n elements. */
    void (*swiglu)(const Backend *be, void *out, const void *gate, const void *up, size_t n);
    /* out[i] = a[i] + b[i] (out may alias a). */
    void (*add)(const Backend *be, void *out, const void *a, const void *b, size_t n);
    /* out[i] = s * x[i] over n storage elements (out may alias x): LoRA's scaling. */
    void (*mul_scalar)(const Backend *be, void *out, const void *x, float s, size_t n);
    /* out[i] = a[i] + s * b[i] over n storage elements, one fused multiply-add in fp32 rounded once to storage
     * (torch's a.add_(b, alpha=s)); out may alias a. The reference model's sync (TR-DPO) mixes weights with it. */
    void (*add_scaled)(const Backend *be, void *out, const void *a, const void *b, float s, size_t n);
    /* out[N, D] = table[ids[i], :]; a row whose ids[i] < 0 is zeros (a token
     * outside this rank's part of a vocabulary-parallel table). */
    void (*embedding)(const Backend *be, void *out, const void *table, const int *ids, int n, int dim);

    /* ---- training (backward ops are added next to this line by the backward-pass work) ---- */

    /* Backward ops. Gradients named "+=" accumulate (the caller zeroes them
     * once per step); everything else is overwritten. */

    /* x[i] = 0 over n elements: zero for storage buffers, zero_f32 for [f32] ones. */
    void (*zero)(const Backend *be, void *x, size_t n);
    void (*zero_f32)(const Backend *be, void *x, size_t n);
    /* Backward of linear: dx[N, in_dim] = dy[N, out_dim] @ w[out_dim, in_dim]
     * (+= instead of = when accumulate_dx; dx may be NULL to skip it);
     * dw[out_dim, in_dim] [f32] += dy^T @ x; db[out_dim] [f32] += sum over rows
     * of dy (db may be NULL). */
    void (*linear_backward)(const Backend *be, void *dx, void *dw, void *db, const void *dy, const void *x, const void *w, int n,
                            int in_dim, int out_dim, int accumulate_dx);
    /* Backward of rmsnorm (y = x * r * w, r = 1/sqrt(mean(x^2) + eps)) given
     * the forward input x[N, D]: dx[N, D] += r * (g - x * r^2 * mean(g * x))
     * with g = dy * w; dw[D] [f32] += sum over rows of dy * x * r (dw may be
     * NULL: a frozen norm). */
    void (*rmsnorm_backward)(const Backend *be, void *dx, void *dw, const void *dy, const void *x, const void *w, int n, int dim,
                             float eps);
    /* Backward of rope, in place on dx[N, n_heads, Dh]: the inverse rotation
     * (angle -pos * inv_freq), same fp32 angles as rope. */
    void (*rope_backward)(const Backend *be, void *dx, const int *pos, int n, int n_heads, int head_dim,
                          const float *inv_freq);
    /* Inverse of kv_store for the gradients: k[N, KVH*Dh] and v[N, KVH*Dh]
     * (storage) of token i are read from the [f32] caches [S, L, KVH*Dh] at
     * (slot[i], pos[i]). */
    void (*kv_gather)(const Backend *be, void *k, void *v, const void *k_cache, const void *v_cache, const int *slot, const int *pos,
                      int n, int kv_dim, int max_len);
    /* Backward of attention (same layout and causal rule): dq[N, H*Dh] =
     * d out / d q; dk_cache and dv_cache [S, L, KVH*Dh] [f32] += the gradients
     * of the cached K and V rows. out[N, H*Dh] and lse[N, H] [f32] are the
     * forward's output and log-sum-exp for the same inputs (lse as attention
     * wrote it); either may be NULL, and then the softmax statistics are
     * recomputed from q and the caches (a backend may recompute them anyway).
     * n_slots bounds the slot ids. */
    void (*attention_backward)(const Backend *be, void *dq, void *dk_cache, void *dv_cache, const void *dout, const void *q,
                               const void *out, const void *lse, const void *k_cache, const void *v_cache,
                               const int *slot, const int *pos, int n, int n_heads, int n_kv_heads, int head_dim,
                               int n_slots, int max_len);
    /* Backward of swiglu (out = silu(gate) * up) over n elements:
     * dgate = dout * up * silu'(gate), dup = dout * silu(gate). */
    void (*swiglu_backward)(const Backend *be, void *dgate, void *dup, const void *dout, const void *gate, const void *up, size_t n);
    /* Backward of embedding: dtable[ids[i], :] [f32] += dout[i, :] for i < N
     * (rows with ids[i] < 0 skipped). */
    void (*embedding_backward)(const Backend *be, void *dtable, const void *dout, const int *ids, int n, int dim);
    /* Per row of logits[N, V], with z = logits / temperature:
     * logprobs[i] [f32] = log_softmax(z)[targets[i]] and entropy[i] [f32] =
     * -sum p log p (entropy may be NULL); rows with targets[i] < 0 get 0.
     * The lm_head chunks of the training forward run through this. */
    void (*log_softmax_target)(const Backend *be, void *logprobs, void *entropy, const void *logits, const int *targets, int n,
                               int vocab, float temperature);
    /* Backward of log_softmax_target's logprobs: dlogits[N, V] =
     * dlogprobs[i] [f32] * (onehot(targets[i]) - softmax(z)) / temperature (0 for
     * rows with targets[i] < 0). dlogits may alias logits (in place). */
    void (*log_softmax_target_backward)(const Backend *be, void *dlogits, const void *logits, const int *targets,
                                        const void *dlogprobs, int n, int vocab, float temperature);
    /* log_softmax_target_backward with the entropy's gradient added (TRL's entropy bonus): dlogits[N, V] =
     * (dlogprobs[i] [f32] * (onehot(targets[i]) - p) - dentropy[i] [f32] * p * (z - sum_v p_v z_v)) /
     * temperature, p = softmax(z) (0 for rows with targets[i] < 0). dlogits may alias logits. */
    void (*log_softmax_entropy_backward)(const Backend *be, void *dlogits, const void *logits, const int *targets,
                                         const void *dlogprobs, const void *dentropy, int n, int vocab,
                                         float temperature);
    /* Tensor parallelism's vocabulary-parallel log-softmax: each rank holds
     * logits[N, V'] for its part of the vocabulary. logits_shard_stats gives per
     * row, with z = logits / temperature, stats[N, 4] [f32] = {max z, sum
     * exp(z - max), sum exp(z - max) * z, z[targets[i]] (0 when targets[i] < 0:
     * the target is another rank's)}, which the ranks combine into the row's
     * log-sum-exp, log-prob and entropy. log_softmax_shard_backward is then
     * log_softmax_target_backward on the part, given the whole row's lse[N]
     * [f32]: dlogits = dlogprobs[i] * (onehot(targets[i]) - exp(z - lse[i])) /
     * temperature, the onehot term only where targets[i] >= 0. dlogits may
     * alias logits. */
    void (*logits_shard_stats)(const Backend *be, void *stats, const void *logits, const int *targets, int n, int vocab,
                               float temperature);
    void (*log_softmax_shard_backward)(const Backend *be, void *dlogits, const void *logits, const int *targets,
                                       const void *dlogprobs, const void *lse, int n, int vocab, float temperature);
    /* log_softmax_shard_backward with the entropy's gradient (log_softmax_entropy_backward on the part), given
     * the whole row's lse[N] and pz[N] = sum_v p_v z_v [f32]: dlogits = (dlogprobs[i] * (onehot - p) -
     * dentropy[i] * p * (z - pz[i])) / temperature, the onehot term only where targets[i] >= 0. dlogits may
     * alias logits. */
    void (*log_softmax_shard_entropy_backward)(const Backend *be, void *dlogits, const void *logits,
                                               const int *targets, const void *dlogprobs, const void *dentropy,
                                               const void *lse, const void *pz, int n, int vocab, float temperature);
    /* dst[r * dst_stride + j] = src[r * src_stride + j] for r < rows, j < cols
     * (storage elements): a rank's columns of gathered vocabulary-parallel logits. */
    void (*copy_2d)(const Backend *be, void *dst, size_t dst_stride, const void *src, size_t src_stride, int rows,
                    int cols);

    /* torch.optim.AdamW step, in place, in torch's order of operations:
     * p *= 1 - lr*weight_decay; m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g*g;
     * p -= (lr / bias_correction1) * m / (sqrt(v) / sqrt(bias_correction2) + eps),
     * with bias_correction_k = 1 - beta_k^step. grad, m and v are [f32]. When
     * master [f32] is given (storage is not F32), the update runs on master and
     * param receives it rounded to storage; else on param directly. */
    void (*adamw)(const Backend *be, void *param, void *master, const void *grad, void *m, void *v, size_t n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, float bias_correction1, float bias_correction2);
    /* sum of x[i]^2 in double over an [f32] buffer (the global gradient norm). */
    double (*sum_squares)(const Backend *be, const void *x, size_t n);
    /* x[i] *= s over an [f32] buffer (gradient clipping). */
    void (*scale)(const Backend *be, void *x, float s, size_t n);
    /* y[i] += x[i] over [f32] buffers (ZeRO-2: a rank's shard of the summed
     * gradients, accumulated over micro-batches). */
    void (*add_f32)(const Backend *be, void *y, const void *x, size_t n);
    /* Inverted dropout (LoRA's lora_dropout in training): out[i] = x[i] * (1 / (1 - p)) where
     * rng_uniform(seed, stream, i) >= p (core/rng.h), else 0 — the same mask, bit for bit, on every
     * backend, so a backward can redraw it. out may be x; 0 <= p < 1. */
    void (*dropout)(const Backend *be, void *out, const void *x, size_t n, float p, uint64_t seed, uint64_t stream);

    /* ---- generation engine (engine/engine.h): paged KV cache, device sampling ----
     *
     * Int arrays marked [i32] are buffers from alloc_i32 (device memory on a GPU,
     * host memory on the CPU), so one decode step can be recorded as a CUDA graph
     * and replayed with new contents. A row or token whose seq[i] < 0 is padding:
     * ops skip it (its outputs are unspecified). */
    void *(*alloc_i32)(const Backend *be, size_t n);
    void (*upload_i32)(const Backend *be, void *dst, const int *src, size_t n);   /* host -> [i32], stream ordered */
    void (*download_i32)(const Backend *be, int *dst, const void *src, size_t n); /* [i32] -> host; synchronises */
    /* out[i] [i32] = ids[i] - lo where lo <= ids[i] < hi, else -1: token ids
     * into a rank's part [lo, hi) of a vocabulary-parallel table. */
    void (*vocab_shard_ids_i32)(const Backend *be, void *out, const void *ids, int n, int lo, int hi);
    /* As embedding, rope and gather_rows, with the ids / positions / rows in [i32] buffers. */
    void (*embedding_i32)(const Backend *be, void *out, const void *table, const void *ids, int n, int dim);
    void (*rope_i32)(const Backend *be, void *x, const void *pos, int n, int n_heads, int head_dim, const float *inv_freq);
    void (*gather_rows_i32)(const Backend *be, void *dst, const void *src, const void *rows, int n, int dim);
    /* Paged KV cache. A layer's pools k_pool / v_pool are [n_blocks * block_size,
     * KVH*Dh]: row r holds one token's K (V). Token i's k[i] / v[i] go to pool row
     * slot_mapping[i] [i32]; negative = skip. */
    void (*paged_kv_store)(const Backend *be, void *k_pool, void *v_pool, const void *k, const void *v, const void *slot_mapping,
                           int n, int kv_dim);
    /* Causal attention over the paged cache, the math of attention: token i of
     * sequence seq[i] [i32] at position pos[i] [i32] attends to positions
     * 0..pos[i] of that sequence; position p lives at pool row
     * block_tables[seq[i] * max_blocks + p / block_size] * block_size + p % block_size
     * (block_tables [i32] [n_seqs, max_blocks]). q[N, H*Dh], out[N, H*Dh]. */
    void (*paged_attention)(const Backend *be, void *out, const void *q, const void *k_pool, const void *v_pool,
                            const void *block_tables, const void *seq, const void *pos, int n, int n_heads,
                            int n_kv_heads, int head_dim, int block_size, int max_blocks);
    /* qkv_rope_store(q, k_pool, v_pool, qkv, pos, slot_mapping, ...) then paged_attention(out, q, ...), the
     * same bits, for a decode step (each token the next one of its own sequence, so only its own attention
     * reads its K/V): where it can, one kernel ropes q and stores each token's K/V itself (q is then not
     * written). NULL where the backend has no such fusion. */
    void (*paged_attention_rope)(const Backend *be, void *out, void *q, void *k_pool, void *v_pool, const void *qkv,
                                 const void *block_tables, const void *seq, const void *pos, const void *slot_mapping,
                                 int n, int n_heads, int n_kv_heads, int head_dim, const float *inv_freq,
                                 int block_size, int max_blocks);
    /* Draws one token for each row of logits[n, vocab] (storage dtype; clobbered)
     * as sampler_sample (backend/sampling.h) does on the host: repetition penalty
     * over the sequence's history, temperature, top-k / top-p / min-p, inverse CDF
     * in id order with u = rng_uniform(p->seed, streams[i], counters[i]); greedy
     * (temperature 0) is the argmax, lowest id on ties. Row i belongs to sequence
     * seq[i] [i32]; tokens[i] [i32] gets the token, logprobs[i] [f32] log p(token)
     * under the distribution drawn from (penalised logits / temperature,
     * renormalised over the kept tokens; raw log-softmax when greedy). history [i32] [n_seqs, history_stride] holds each sequence's tokens
     * so far (prompt and completion; history_len [i32] [n_seqs] of them): the
     * repetition penalty reads it, and the sampled token is appended (when
     * history_len < history_stride). history may be NULL when
     * p->repetition_penalty == 1. streams / counters [i32]. */
    void (*sample)(const Backend *be, void *tokens, void *logprobs, void *logits, int n, int vocab, const struct SamplingParams *p,
                   const void *seq, const void *streams, const void *counters, void *history, void *history_len,
                   int history_stride);
    /* vLLM's logit bias and penalties, before sample (which is then given a repetition penalty of 1): row
     * i < n of logits[n, vocab] (storage dtype, in place) belongs to sequence s = seq[i] [i32] (< 0: a
     * padding row, left alone), and gets what sampler_apply_penalties (backend/sampling.h) does with
     * p's repetition, frequency and presence penalties over history [i32] [n_seqs, history_stride] (s's
     * first history_len[s] tokens [i32] [n_seqs], of which the first prompt_len[s] [i32] [n_seqs] are
     * its prompt's) and its logit bias: bias_ids [i32] / bias_values [f32] [n_seqs, bias_stride], the
     * first bias_len[s] [i32] [n_seqs] entries (distinct ids). history and bias may be NULL (none).
     * Each logit changed is computed in fp32 and rounded to storage once. */
    void (*apply_penalties)(const Backend *be, void *logits, int n, int vocab, const struct SamplingParams *p,
                            const void *seq, const void *history, const void *history_len, const void *prompt_len,
                            int history_stride, const void *bias_ids, const void *bias_values, const void *bias_len,
                            int bias_stride);
    /* Structured outputs (engine/structured.h), before sample: logits[i, v] = -inf (storage dtype) where
     * bit v % 32 of bitmask[i * W + v / 32] is clear, W = (vocab + 31) / 32, for rows i < n (bitmask
     * [i32] [n, W]: vLLM's apply_token_bitmask_inplace); the other logits are unchanged. In place. */
    void (*apply_token_bitmask)(const Backend *be, void *logits, const void *bitmask, int n, int vocab);
    /* Fused ops of the decode step (fewer kernels per layer). Each gives results
     * bit-identical to the op sequence it replaces, on the same backend. */
    /* x[N, D] += delta[N, D] in place (rounded to storage as add does), then
     * xn[N, D] = rmsnorm(x) * w: add(x, x, delta); rmsnorm(xn, x, w, ...). xn
     * must not overlap x or delta. */
    void (*add_rmsnorm)(const Backend *be, void *x, void *xn, const void *delta, const void *w, int n, int dim, float eps);
    /* qkv[N, (H + 2*KVH)*Dh] holds each token's q | k | v (one linear over the
     * concatenated weights). Writes q[N, H*Dh] = rope(q part) for every token,
     * and rope(k part) / the v part to pool row slot_mapping[i] of k_pool /
     * v_pool ([n_blocks * block_size, KVH*Dh]) when slot_mapping[i] >= 0 (a
     * padding token writes its q, no K/V). pos, slot_mapping [i32]. The same as
     * copying the q and k parts out, rope_i32 on each, then paged_kv_store. */
    void (*qkv_rope_store)(const Backend *be, void *q, void *k_pool, void *v_pool, const void *qkv, const void *pos,
                           const void *slot_mapping, int n, int n_heads, int n_kv_heads, int head_dim,
                           const float *inv_freq);
    /* out[N, F] = silu(gate) * up, gate_up[N, 2F] holding each row's gate then
     * its up (one linear over the concatenated weights): swiglu on the halves.
     * out must not overlap gate_up. */
    void (*swiglu_gate_up)(const Backend *be, void *out, const void *gate_up, int n, int f);

    /* Every decoder layer of a decode step in one launch (NULL where the backend
     * has no such kernel, e.g. the CPU). decode_layers_create binds n_layers
     * layers' weights and pools (copied into the plan: they must outlive it) and
     * returns a plan, or NULL when it does not support these shapes.
     * decode_layers runs, for x[N, D] holding the N tokens' embeddings, what the
     * op sequence of model_forward_paged does from the first attn_norm to the
     * last residual add (x ends as the last layer's output), each token being
     * the next one of its own sequence (no two tokens of one sequence in a
     * call): K/V stored at slot_mapping, attention as paged_attention's. Same
     * roundings as those ops, sums in another order. Returns false, having done
     * nothing, when it does not take the call (N above its limit, deterministic
     * mode); the caller then runs the ops. pos, seq, slot_mapping,
     * block_tables [i32]. Capturable; decode_layers_free synchronises. */
    void *(*decode_layers_create)(const Backend *be, const DecodeLayerWeights *layers, const DecodeDims *dims);
    void (*decode_layers_free)(const Backend *be, void *plan);
    bool (*decode_layers)(const Backend *be, void *plan, void *x, const void *pos, const void *seq, const void *slot_mapping,
                          const void *block_tables, int n);

    /* Deterministic mode (the instance's own, off by default; vLLM's VLLM_BATCH_INVARIANT):
     * while on, every op computes a row (token) with bits that depend on that
     * row's inputs alone, never on how many rows the call has or what the others
     * hold (linear sums each output in one fixed order instead of the BLAS's
     * shape-dependent blocking), and attention runs paged_attention's arithmetic.
     * A token's forward is then bit-identical in the trainer and in the engine,
     * alone or in any batch. Slower: no cuBLAS on the GPU, no BLAS on the CPU. */
    void (*set_batch_invariant)(const Backend *be, int on);

    /* Host threads (NULL where the host does not compute, e.g. CUDA): the
     * threads this instance's ops compute with, the process's share of the
     * cores (core/cpu_threads.h; the mesh sets it from the launch). An op whose
     * work is too small to pay for waking them runs on fewer. Results do not
     * depend on it, except sum_squares' partial sums (one per thread). */
    void (*set_threads)(const Backend *be, int threads);

    /* ---- device control (NULL where the backend has no such thing, e.g. the CPU) ---- */
    /* Free and total device memory in bytes (what the KV pool is sized from). */
    void (*memory_info)(const Backend *be, size_t *free_bytes, size_t *total_bytes);
    void (*synchronize)(const Backend *be);
    /* CUDA graphs: ops issued between capture_begin and capture_end are recorded,
     * not run; graph_launch replays them reading the buffers' contents at that
     * time. Nothing may allocate or copy from the host while capturing. */
    void (*capture_begin)(const Backend *be);
    void *(*capture_end)(const Backend *be);
    void (*graph_launch)(const Backend *be, void *graph);
    void (*graph_free)(const Backend *be, void *graph);
    /* A counter that moves whenever the instance frees one of its own buffers
     * that ops read (scratch, partials) to allocate it larger: graphs recorded
     * before hold the old address and must be recorded again. A graph kept
     * while other ops run (the engine's, between training steps) is launched
     * only while the counter has not moved since its recording. */
    uint64_t (*buffers_epoch)(const Backend *be);

    /* ---- identity and streams for code that runs collectives beside the ops
     * (NULL on the CPU: no streams; use the backend_* wrappers below) ---- */
    /* A name of the physical device that is the same in every process on a
     * host, whatever CUDA_VISIBLE_DEVICES says (a GPU's PCI bus id): ranks
     * compare it to find two of them on one device. */
    void (*device_id)(const Backend *be, char *out, size_t size);
    /* The stream every op runs on, and the instance's own stream for
     * collectives (cudaStream_t on a GPU), as void *. */
    void *(*compute_stream)(const Backend *be);
    void *(*comm_stream)(const Backend *be);
    /* Orders the communication stream after everything enqueued so far on the
     * compute stream (an event): a collective enqueued next sees the results
     * of the ops before it, while later ops overlap it. */
    void (*comm_after_compute)(const Backend *be);
    /* Device bytes the instance holds for itself outside alloc'd buffers
     * (workspaces, staging, scratch): what the memory plan adds as "backend
     * scratch". */
    size_t (*reserved_bytes)(const Backend *be);
};

/* The capabilities above, with the CPU's answers where a backend has no such thing. */
static inline bool backend_is_gpu(const Backend *be) { return be->device_kind == BACKEND_DEVICE_GPU; }
static inline void backend_device_id(const Backend *be, char *out, size_t size) {
    if (be->device_id) be->device_id(be, out, size);
    else if (size) out[0] = 0;
}
static inline void *backend_compute_stream(const Backend *be) { return be->compute_stream ? be->compute_stream(be) : NULL; }
static inline void *backend_comm_stream(const Backend *be) { return be->comm_stream ? be->comm_stream(be) : NULL; }
static inline void backend_comm_after_compute(const Backend *be) {
    if (be->comm_after_compute) be->comm_after_compute(be);
}
static inline size_t backend_reserved_bytes(const Backend *be) { return be->reserved_bytes ? be->reserved_bytes(be) : 0; }

/* Bytes per element of a dtype. */
static inline size_t dtype_size(DType t) { return t == DTYPE_F32 ? 4 : 2; }

/* alloc / alloc_f32 that also add the bytes to *bytes: how each lifetime
 * (weights, optimizer state, activations, KV cache) knows its size for the
 * memory plan colt prints. */
static inline void *backend_alloc_counted(const Backend *be, size_t n, size_t *bytes) {
    *bytes += n * dtype_size(be->storage);
    return be->alloc(be, n);
}
static inline void *backend_alloc_f32_counted(const Backend *be, size_t n, size_t *bytes) {
    *bytes += n * 4;
    return be->alloc_f32(be, n);
}

/* Opens a backend instance on a device (an index among the devices this
 * process sees): "cpu" (the fp32 reference, OpenBLAS + OpenMP; device 0),
 * "cuda" (bf16 storage, fp32 accumulation), "cuda_f32" (fp32 storage, the same
 * kernels: for checking them against the CPU) or "auto" (cuda when a GPU is
 * usable, else cpu). NULL with err set when the kind is unknown or not
 * available. Each instance holds its own state; two may share a device. */
Backend *backend_open(const char *kind, int device, char *err);
void backend_close(Backend *be);

/* Shared instances (device 0) for tests and benchmarks that need just one;
 * the CUDA ones are NULL without a usable GPU. Programs use backend_open. */
const Backend *backend_cpu(void);
const Backend *backend_cuda(void);
const Backend *backend_cuda_f32(void);

/* The CUDA side of backend_open (builds with -DCOLT_CUDA=ON; elsewhere they
 * say there is no GPU). */
Backend *backend_cuda_open(int device, DType storage, char *err);
void backend_cuda_close(Backend *be);
/* GPUs this process sees (0 without CUDA or without a GPU); creates no context. */
int backend_cuda_device_count(void);
/* GPUs this process sees, whatever backend drives them (0 without one, or in
 * a build without a GPU backend); creates no context. What code outside
 * src/backend asks, instead of a backend's own count. */
int backend_gpu_count(void);
/* Whether a --device name (as backend_open takes it, or as another colt
 * reports its instance's name) computes on a GPU: "cuda", "cuda_f32". */
bool backend_kind_is_gpu(const char *kind);

#endif
