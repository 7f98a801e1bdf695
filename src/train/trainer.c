/* trainer.c — the GRPO loop (see trainer.h), as TRL's GRPOTrainer runs it:
 *
 *   round:  P = generation_batch_size / G prompts, each completed G times with
 *           the live weights; rewards, group advantages; old log-probs when
 *           generation and optimizer steps are misaligned; reference log-probs
 *           when beta > 0; the batch is shuffled and cut into
 *           steps_per_generation micro-batches, reused num_iterations times.
 *   step:   gradient_accumulation_steps micro-batches of forward + GRPO loss +
 *           backward, then clipping and one AdamW update with the scheduled lr.
 *
 * Everything random is keyed, not stateful: the epoch order by (seed, epoch),
 * the micro-batch shuffle by (seed, round), sampling by (seed, sample id,
 * position). So a checkpoint only stores counters, the optimizer state and —
 * when it falls inside a round — the round's samples; resuming reproduces the
 * uninterrupted run bit for bit on the CPU. */
#include "train/trainer.h"

#include <errno.h>
#include <stddef.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_instance.h"
#include "core/error.h"
#include "core/fileio.h"
#include "core/log.h"
#include "core/rng.h"
#include "data/dataset.h"
#include "data/rewards.h"
#include "dist/tp_group.h"
#include "engine/engine.h"
#include "model/lora.h"
#include "model/model.h"
#include "model/model_train.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_files.h"
#include "train/checkpoint.h"
#include "train/grpo.h"
#include "train/metrics.h"
#include "train/optim.h"
#include "data/prompt.h"
#include "train/report.h"
#include "train/rollout.h"
#include "train/memory_plan.h"
#include "train/tensorboard.h"
#include "train/train_dist.h"

/* RNG streams: keep sampling of training, eval and shuffles apart. The
 * engine's sampler takes stream ids below 2^31: training completions use
 * 0 .. 2^30-1, eval ones start at 2^30. */
#define STREAM_EVAL_BASE (1ull << 30)
#define STREAM_SHUFFLE (1ull << 41)

static volatile sig_atomic_t g_stop_requested = 0;
static void on_stop_signal(int sig) {
    (void)sig;
    g_stop_requested = 1;
}

/* ---------------------------------------------------------------- trainer */

typedef struct Trainer {
    TrainConfig *cfg;
    Backend *be;              /* this process's instance, opened on its device */
    TrainDist dist;           /* data-parallel rank, world size and communicator (a world of one: none) */
    /* tensor_parallel_size > 1: this rank's groups (dist is then the
     * data-parallel one) and the model's collectives over its group */
    TpGroup tp;
    TensorParallel tp_hooks;
    bool writer;              /* writes the run's files and logs: the launch's rank 0 */
    Model *model, *ref_model;
    /* With use_peft and beta > 0 the reference model is the base model: the
     * trainer's own, with its adapters turned off (TRL: disable_adapter()). */
    bool ref_is_base;
    Tokenizer *tok;
    Dataset *data, *eval_data;
    RewardFunc **rewards;
    int n_rewards;
    float *reward_weights;
    Optimizer *opt;
    ModelGrads *grads;
    TrainState *ts;
    int stop_ids[MODEL_MAX_EOS + 1], n_stop;
    GrpoLossConfig loss_cfg;
    SamplingParams sampling;
    LrSchedulerType scheduler;
    int warmup_steps;
    bool need_old_logp;
    GrpoSamplingIsMode is_mode;
    GrpoSamplingMetrics round_sampling; /* engine vs trainer log-probs over the round's first pass */
    /* progress */
    int64_t global_step, total_steps, round;
    int micro_in_step; /* the micro-batch of the optimizer step being trained, 0 .. gradient_accumulation_steps - 1 */
    uint64_t epoch;
    size_t epoch_pos, *epoch_order;
    int64_t num_tokens;
    Rollout ro;
    Metrics metrics;
    double time_generation, time_scoring, time_logprobs, time_training;
    double time_memory; /* giving activations back and taking them again (inside the other times) */
    EngineOptions engine_opts;
    bool recompute;    /* activation recompute (gradient checkpointing) */
    MemoryPlan plan;   /* the memory plan (zeroed when there was nothing to plan against) */
    /* buffers sized once */
    int max_prompt_tokens, max_seq, max_batch_tokens;
    int *tok_ids, *tok_slot, *tok_pos, *tok_target;
    float *tok_logp, *tok_entropy, *tok_dlogp;
    float *mb_logp, *mb_old, *mb_ref, *mb_mask, *mb_adv, *mb_dlogp, *mb_sampling, *mb_isw;
    FILE *metrics_fp;
    TensorboardWriter *tb;    /* report_to tensorboard: rank 0's event file, else NULL */
    char *metrics_path;
    /* checkpoints */
    json_t *resume_record;    /* what this run's saved state depends on (checkpoint.h) */
    CheckpointKeeper keeper;  /* which checkpoint folders save_total_limit may delete */
    int64_t last_saved_step;  /* -1: none yet */
    char *last_checkpoint;    /* the newest good checkpoint's folder (saved or resumed from), or NULL */
} Trainer;

/* Names what the backend allocates next and the plan's figure for it, so that
 * running out of device memory says which buffer (backend.h set_alloc_label);
 * NULL clears it. */
static void alloc_label(const Trainer *t, const char *what, size_t planned) {
    if (!t->be || !t->be->set_alloc_label) return;
    if (!what) {
        t->be->set_alloc_label(t->be, NULL);
        return;
    }
    char label[160];
    snprintf(label, sizeof label, "%s (the memory plan gave it %.2f GB)", what, planned / (1024.0 * 1024.0 * 1024.0));
    t->be->set_alloc_label(t->be, label);
}

/* Training activations and the engine's KV pool take turns with the device
 * memory: before generating, the activations are given back when what is
 * free would not hold the pool the engine wants for this round (every
 * sequence at full length), and taken again by the next forward. When memory
 * is plentiful they stay (giving back and taking ~20 GB costs ~0.1 s). */
static void release_activations(Trainer *t) {
    if (!t->ts) return;
    double t0 = time_now();
    train_state_free(t->ts);
    t->ts = NULL;
    t->time_memory += time_now() - t0;
}

static int ensure_activations(Trainer *t, char *err) {
    if (t->ts) return COLT_OK;
    double t0 = time_now();
    int bs = t->cfg->per_device_train_batch_size;
    alloc_label(t, "training activations", t->plan.activations);
    int rc = train_state_create_recompute(&t->ts, t->model, bs, t->max_seq, t->max_batch_tokens, t->recompute, err);
    alloc_label(t, NULL, 0);
    t->time_memory += time_now() - t0;
    return rc;
}

/* Prompt ids of dataset row i, as colt eval encodes them too (prompt.h). */
static int prompt_ids_for_row(Trainer *t, Dataset *d, size_t row, int **ids, int *n, char **text, char *err) {
    return prompt_encode_row(ids, n, text, d, row, t->tok, t->cfg->chat_template_kwargs, t->cfg->max_prompt_length,
                             t->cfg->dataset, err);
}

/* Rewards of n completions: per_func[i, k] from each function (NaN = none). */
static int score_completions(Trainer *t, float *per_func, Dataset *d, const size_t *rows_of_sample,
                             const char *const *prompts, const char *const *completions, const int *const *ids,
                             const int *id_lens, int n, char *err) {
    json_t **rows = xmalloc(sizeof(json_t *) * (size_t)n);
    float *values = xmalloc(sizeof(float) * (size_t)n);
    for (int i = 0; i < n; i++) rows[i] = dataset_row(d, rows_of_sample[i]);
    int rc = COLT_OK;
    for (int k = 0; k < t->n_rewards && rc == 0; k++) {
        if (reward_compute(t->rewards[k], values, prompts, completions, ids, id_lens, rows, n, err) != 0) {
            char prefix[128];
            snprintf(prefix, sizeof prefix, "reward '%s'", reward_name(t->rewards[k]));
            rc = strncmp(err, prefix, strlen(prefix)) == 0 ? COLT_ERR : error_prefix(err, "%s", prefix);
            break;
        }
        for (int i = 0; i < n; i++) per_func[(size_t)i * t->n_rewards + k] = values[i];
    }
    free(values);
    free(rows);
    return rc;
}

/* Packs samples[idx[0..B)] into the token arrays; returns the token count. */
static int pack_batch(Trainer *t, Rollout *r, const int *idx, int B) {
    int n = 0;
    for (int b = 0; b < B; b++) {
        Sample *s = &r->samples[idx[b]];
        int plen = r->prompt_len[s->prompt];
        const int *p = r->prompt_ids[s->prompt];
        /* prompt + completion[:-1]: position plen-1+j predicts completion[j]. */
        int total = plen + s->len - 1;
        for (int k = 0; k < total; k++) {
            t->tok_ids[n] = k < plen ? p[k] : s->completion[k - plen];
            t->tok_slot[n] = b;
            t->tok_pos[n] = k;
            t->tok_target[n] = k >= plen - 1 ? s->completion[k - plen + 1] : -1;
            n++;
        }
    }
    return n;
}

/* beta > 0: reference log-probs enter the loss. */
static bool has_reference(const Trainer *t) { return t->ref_model || t->ref_is_base; }

/* Log-probs of samples [lo, hi)'s completions under model m (old or
 * reference), in micro-batches of per_device_train_batch_size; out[i - lo]
 * gets a malloc'd [len] array. */

static int completion_logprobs(Trainer *t, Model *m, Rollout *r, int lo, int hi, float **out, char *err) {
    int bs = t->cfg->per_device_train_batch_size;
    int *idx = xmalloc(sizeof(int) * (size_t)bs);
    int rc = COLT_OK;
    for (int start = lo; start < hi; start += bs) {
        int B = hi - start < bs ? hi - start : bs;
        for (int b = 0; b < B; b++) idx[b] = start + b;
        int n = pack_batch(t, r, idx, B);
        if (ensure_activations(t, err) != 0 ||
            model_train_forward(m, t->ts, t->tok_ids, t->tok_slot, t->tok_pos, t->tok_target, n,
                                (float)t->cfg->temperature, t->tok_logp, NULL, err) != 0) {
            rc = COLT_ERR;
            break;
        }
        int k = 0;
        for (int b = 0; b < B; b++) {
            Sample *s = &r->samples[start + b];
            int plen = r->prompt_len[s->prompt];
            float *lp = xmalloc(sizeof(float) * (size_t)s->len);
            for (int j = 0; j < s->len; j++) lp[j] = t->tok_logp[k + plen - 1 + j];
            k += plen + s->len - 1;
            out[start + b - lo] = lp;
        }
    }
    free(idx);
    return rc;
}

/* This rank's share of a round's N samples: [lo, hi). N is a multiple of the
 * world's micro-batch, so every rank gets the same count. */
static void local_range(const Trainer *t, int N, int *lo, int *hi) {
    *lo = (int)((int64_t)N * t->dist.rank / t->dist.world);
    *hi = (int)((int64_t)N * (t->dist.rank + 1) / t->dist.world);
}

/* Gathers per-token values of samples [lo, hi) from every rank into each
 * sample's field (old_logp, ref_logp or sampling_logp): mine[i - lo] are this
 * rank's arrays (taken over). */
static int gather_token_values(Trainer *t, Rollout *r, float **mine, int lo, int hi, size_t field, char *err) {
    const int L = t->cfg->max_completion_length, n_local = hi - lo, N = r->n_samples;
    float *send = xcalloc((size_t)n_local * L, sizeof(float)), *all = xcalloc((size_t)N * L, sizeof(float));
    for (int i = 0; i < n_local; i++) {
        if (mine[i]) memcpy(send + (size_t)i * L, mine[i], sizeof(float) * (size_t)r->samples[lo + i].len);
        else for (int j = 0; j < L; j++) send[(size_t)i * L + j] = NAN;
        free(mine[i]);
        mine[i] = NULL;
    }
    int rc = train_dist_gather(&t->dist, all, send, sizeof(float) * (size_t)n_local * L, err);
    for (int i = 0; rc == 0 && i < N; i++) {
        Sample *s = &r->samples[i];
        float **dst = (float **)((char *)s + field);
        free(*dst);
        *dst = xmalloc(sizeof(float) * (size_t)s->len);
        memcpy(*dst, all + (size_t)i * L, sizeof(float) * (size_t)s->len);
    }
    free(send);
    free(all);
    return rc;
}

static double nanmean(const float *x, int n, int stride) {
    double s = 0;
    int c = 0;
    for (int i = 0; i < n; i++)
        if (!isnan(x[(size_t)i * stride])) s += x[(size_t)i * stride], c++;
    return c ? s / c : NAN;
}

/* torch's unbiased std over the non-NaN values (TRL's nanstd). */
static double nanstd(const float *x, int n, int stride) {
    double mean = nanmean(x, n, stride), s = 0;
    int c = 0;
    for (int i = 0; i < n; i++)
        if (!isnan(x[(size_t)i * stride])) s += (x[(size_t)i * stride] - mean) * (x[(size_t)i * stride] - mean), c++;
    return c > 1 ? sqrt(s / (c - 1)) : NAN;
}

/* Takes the next P prompts in epoch order (a new epoch when too few remain). */
static void next_prompt_rows(Trainer *t, size_t *rows, int P) {
    size_t n = dataset_size(t->data);
    for (int i = 0; i < P; i++) {
        if (t->epoch_pos >= n || (i == 0 && n - t->epoch_pos < (size_t)P && (size_t)P <= n)) {
            t->epoch++;
            t->epoch_pos = 0;
            dataset_epoch_order(t->epoch_order, n, t->cfg->seed, t->epoch);
        }
        rows[i] = t->epoch_order[t->epoch_pos++ % n];
    }
}

/* zero_stage 3: the bytes the whole weights take when gathered (0 otherwise). */
static size_t whole_weights_to_gather(const Trainer *t) {
    if (!model_params_partitioned(t->model)) return 0;
    size_t numel = 0;
    model_params_flat(t->model, &numel);
    return numel * dtype_size(t->be->storage);
}

static void make_room_for_generation(Trainer *t, int n_seqs) {
    if (!t->ts) return;
    bool release = true;
    if (t->be->memory_info) {
        size_t free_bytes, total_bytes;
        t->be->memory_info(t->be, &free_bytes, &total_bytes);
        release = free_bytes < engine_memory_wanted(t->model, n_seqs, t->max_seq, &t->engine_opts) +
                                   whole_weights_to_gather(t);
    }
    if (release) release_activations(t);
}

/* zero_stage 3: every rank gathers the whole weights (collective) for the
 * engine or for saving; weights_release gives them back. Nothing otherwise. */
static int weights_gather(Trainer *t, char *err) {
    if (!model_params_partitioned(t->model)) return COLT_OK;
    alloc_label(t, "the whole weights, gathered (zero_stage 3)", t->plan.weights_gathered);
    int rc = model_params_gather_all(t->model, err);
    alloc_label(t, NULL, 0);
    return train_dist_agree(&t->dist, rc, err);
}

static void weights_release(Trainer *t) { model_params_release_all(t->model); }

/* The engine's memory per round (colt's names; TRL has none for these). */
static void log_engine_stats(Trainer *t, const EngineStats *es) {
    const double gb = 1.0 / (1024.0 * 1024.0 * 1024.0);
    metrics_add(&t->metrics, "engine/kv_pool_gb", es->pool_bytes * gb);
    metrics_add(&t->metrics, "engine/sequences_held", es->peak_running);
    metrics_add(&t->metrics, "engine/kv_blocks_used", es->peak_blocks_used);
    metrics_add(&t->metrics, "engine/preemptions", es->preemptions);
    /* vLLM's prefix cache hit rate: prompt tokens found in the cache over those looked up */
    int64_t looked_up = es->shared_tokens + es->prefill_tokens;
    metrics_add(&t->metrics, "engine/prefix_cache_hit_rate", looked_up ? (double)es->shared_tokens / looked_up : 0.0);
    metrics_add(&t->metrics, "engine/activations_released", t->ts == NULL);
    if (t->be->memory_info) {
        size_t free_bytes, total_bytes;
        t->be->memory_info(t->be, &free_bytes, &total_bytes);
        metrics_add(&t->metrics, "engine/peak_memory_gb", (total_bytes - es->device_free_min) * gb);
    }
}

/* One generation round: completions, rewards, advantages, old/ref log-probs. */
static int new_rollout(Trainer *t, char *err) {
    TrainConfig *c = t->cfg;
    rollout_free(&t->ro);
    Rollout *r = &t->ro;
    const int G = c->num_generations, N = c->generation_batch_size, P = N / G;
    r->round = t->round;
    r->n_samples = N;
    r->n_prompts = P;
    r->n_funcs = t->n_rewards;
    r->rows = xcalloc((size_t)P, sizeof(size_t));
    r->prompt_ids = xcalloc((size_t)P, sizeof(int *));
    r->prompt_len = xcalloc((size_t)P, sizeof(int));
    r->prompt_text = xcalloc((size_t)P, sizeof(char *));
    r->samples = xcalloc((size_t)N, sizeof(Sample));
    r->per_func = xcalloc((size_t)N * (size_t)t->n_rewards, sizeof(float));
    r->order = xcalloc((size_t)N, sizeof(int));
    next_prompt_rows(t, r->rows, P);
    for (int p = 0; p < P; p++)
        if (prompt_ids_for_row(t, t->data, r->rows[p], &r->prompt_ids[p], &r->prompt_len[p], &r->prompt_text[p], err) != 0)
            return COLT_ERR;

    /* Generate this rank's share with the live weights, in the memory the
     * training activations give back (they are re-created for the next forward).
     * Sample i draws from RNG stream round * N + i whatever rank makes it, so the
     * completions do not depend on the world size. */
    double t0 = time_now();
    int lo, hi;
    local_range(t, N, &lo, &hi);
    const int n_local = hi - lo, L = c->max_completion_length;
    make_room_for_generation(t, n_local);
    GenSequence *seqs = xcalloc((size_t)n_local, sizeof(GenSequence));
    for (int j = 0; j < n_local; j++) {
        int i = lo + j;
        seqs[j].prompt = r->prompt_ids[i / G];
        seqs[j].prompt_len = r->prompt_len[i / G];
        seqs[j].stream = ((uint64_t)t->round * (uint64_t)N + (uint64_t)i) % STREAM_EVAL_BASE;
    }
    GenerateOptions go = {.sampling = t->sampling, .max_new_tokens = L, .stop_ids = t->stop_ids,
                          .n_stop_ids = t->n_stop};
    EngineStats es;
    int rc = weights_gather(t, err);
    alloc_label(t, "the generation engine's scratch and KV pool", t->plan.engine_scratch + t->plan.kv_min);
    if (rc == 0) rc = engine_generate(t->model, seqs, n_local, &go, &t->engine_opts, &es, err);
    alloc_label(t, NULL, 0);
    weights_release(t);
    if (rc == 0) log_engine_stats(t, &es);
    /* Every rank gets every completion: ids, lengths, stop flags and the engine's log-probs. */
    int *send = xcalloc((size_t)n_local * (L + 2), sizeof(int)), *all = xcalloc((size_t)N * (L + 2), sizeof(int));
    float **sampling = xcalloc((size_t)n_local, sizeof(float *));
    for (int j = 0; rc == 0 && j < n_local; j++) {
        int *row = send + (size_t)j * (L + 2);
        row[0] = seqs[j].n_tokens;
        row[1] = seqs[j].finish == FINISH_STOP;
        memcpy(row + 2, seqs[j].tokens, sizeof(int) * (size_t)seqs[j].n_tokens);
        sampling[j] = seqs[j].logprobs;
        seqs[j].logprobs = NULL;
    }
    for (int j = 0; j < n_local; j++) gen_sequence_free(&seqs[j]);
    free(seqs);
    rc = train_dist_agree(&t->dist, rc, err);
    if (rc == 0) rc = train_dist_gather(&t->dist, all, send, sizeof(int) * (size_t)n_local * (L + 2), err);
    for (int i = 0; rc == 0 && i < N; i++) {
        const int *row = all + (size_t)i * (L + 2);
        Sample *s = &r->samples[i];
        s->prompt = i / G;
        s->len = row[0];
        s->terminated = row[1];
        s->completion = xmalloc(sizeof(int) * (size_t)(s->len > 0 ? s->len : 1));
        memcpy(s->completion, row + 2, sizeof(int) * (size_t)s->len);
        int n_text = s->len - (s->terminated ? 1 : 0);
        rc = tokenizer_decode_generated(t->tok, s->completion, (size_t)n_text, true, &s->text, err);
    }
    if (rc == 0) rc = gather_token_values(t, r, sampling, lo, hi, offsetof(Sample, sampling_logp), err);
    for (int j = 0; j < n_local; j++) free(sampling[j]);
    free(sampling);
    free(send);
    free(all);
    if (rc != 0) return COLT_ERR;
    double t1 = time_now();
    t->time_generation += t1 - t0;

    /* A completion of zero tokens cannot be scored by the loss; generate() always
     * gives at least one token when max_completion_length >= 1. */
    /* Each rank scores its own share (a reward program runs once per completion),
     * then every rank gets every reward. */
    const char **prompts = xmalloc(sizeof(char *) * (size_t)n_local);
    const char **completions = xmalloc(sizeof(char *) * (size_t)n_local);
    size_t *rows = xmalloc(sizeof(size_t) * (size_t)n_local);
    float *mine = xcalloc((size_t)n_local * (size_t)t->n_rewards + 1, sizeof(float));
    const int **ids = xmalloc(sizeof(int *) * (size_t)n_local);
    int *id_lens = xmalloc(sizeof(int) * (size_t)n_local);
    for (int j = 0; j < n_local; j++) {
        prompts[j] = r->prompt_text[(lo + j) / G];
        completions[j] = r->samples[lo + j].text;
        rows[j] = r->rows[(lo + j) / G];
        ids[j] = r->samples[lo + j].completion;
        id_lens[j] = r->samples[lo + j].len;
    }
    rc = score_completions(t, mine, t->data, rows, prompts, completions, ids, id_lens, n_local, err);
    rc = train_dist_agree(&t->dist, rc, err);
    if (rc == 0)
        rc = train_dist_gather(&t->dist, r->per_func, mine, sizeof(float) * (size_t)n_local * (size_t)t->n_rewards, err);
    free(prompts);
    free(completions);
    free(rows);
    free(mine);
    free(ids);
    free(id_lens);
    if (rc != 0) return COLT_ERR;

    float *rewards = xmalloc(sizeof(float) * (size_t)N), *adv = xmalloc(sizeof(float) * (size_t)N);
    float *group_std = xmalloc(sizeof(float) * (size_t)P);
    grpo_combine_rewards(rewards, r->per_func, t->reward_weights, N, t->n_rewards);
    for (int i = 0; i < N; i++)
        if (isinf(rewards[i])) {
            free(rewards), free(adv), free(group_std);
            return errorf(err, "completion %d: the weighted sum of its rewards overflows a 32-bit float; scale the "
                               "rewards or reward_weights down",
                          i);
        }
    GrpoScaleRewards scale;
    COLT_ASSERT(grpo_scale_rewards_parse(&scale, c->scale_rewards, err) == 0);
    grpo_advantages(adv, group_std, rewards, N, G, scale);
    for (int i = 0; i < N; i++) {
        r->samples[i].reward = rewards[i];
        r->samples[i].advantage = isnan(adv[i]) ? 0.0f : adv[i];
    }

    /* Metrics of the round (TRL's names). */
    for (int k = 0; k < t->n_rewards; k++) {
        char name[96];
        snprintf(name, sizeof name, "rewards/%s/mean", reward_name(t->rewards[k]));
        metrics_add(&t->metrics, name, nanmean(r->per_func + k, N, t->n_rewards));
        snprintf(name, sizeof name, "rewards/%s/std", reward_name(t->rewards[k]));
        metrics_add(&t->metrics, name, nanstd(r->per_func + k, N, t->n_rewards));
    }
    metrics_add(&t->metrics, "reward", nanmean(rewards, N, 1));
    metrics_add(&t->metrics, "reward_std", nanstd(rewards, N, 1));
    int zero_std = 0;
    for (int p = 0; p < P; p++) zero_std += fabsf(group_std[p]) <= 1e-8f;
    metrics_add(&t->metrics, "frac_reward_zero_std", (double)zero_std / P);
    free(rewards);
    free(adv);
    free(group_std);

    double sum_len = 0, sum_term = 0;
    int min_len = 1 << 30, max_len = 0, n_term = 0, min_term = 1 << 30, max_term = 0;
    int64_t tokens = 0;
    r->num_items = 0;
    for (int i = 0; i < N; i++) {
        Sample *s = &r->samples[i];
        sum_len += s->len;
        if (s->len < min_len) min_len = s->len;
        if (s->len > max_len) max_len = s->len;
        if (s->terminated) {
            n_term++;
            sum_term += s->len;
            if (s->len < min_term) min_term = s->len;
            if (s->len > max_term) max_term = s->len;
        }
        tokens += r->prompt_len[s->prompt] + s->len;
        if (!(c->mask_truncated_completions && !s->terminated)) r->num_items += s->len;
    }
    t->num_tokens += tokens;
    metrics_add(&t->metrics, "completions/mean_length", sum_len / N);
    metrics_add(&t->metrics, "completions/min_length", min_len);
    metrics_add(&t->metrics, "completions/max_length", max_len);
    metrics_add(&t->metrics, "completions/clipped_ratio", (double)(N - n_term) / N);
    metrics_add(&t->metrics, "completions/mean_terminated_length", n_term ? sum_term / n_term : 0.0);
    metrics_add(&t->metrics, "completions/min_terminated_length", n_term ? min_term : 0);
    metrics_add(&t->metrics, "completions/max_terminated_length", n_term ? max_term : 0);

    /* Old and reference log-probs (TRL computes them before any update of the round). */
    double t_lp = time_now();
    float **lp = xcalloc((size_t)n_local, sizeof(float *));
    if (t->need_old_logp) {
        rc = train_dist_agree(&t->dist, completion_logprobs(t, t->model, r, lo, hi, lp, err), err);
        if (rc == 0) rc = gather_token_values(t, r, lp, lo, hi, offsetof(Sample, old_logp), err);
    }
    if (rc == 0 && has_reference(t)) {
        if (t->ref_is_base) model_lora_set_enabled(t->model, false);
        rc = completion_logprobs(t, t->ref_is_base ? t->model : t->ref_model, r, lo, hi, lp, err);
        if (t->ref_is_base) model_lora_set_enabled(t->model, true);
        rc = train_dist_agree(&t->dist, rc, err);
        if (rc == 0) rc = gather_token_values(t, r, lp, lo, hi, offsetof(Sample, ref_logp), err);
    }
    for (int j = 0; j < n_local; j++) free(lp[j]);
    free(lp);
    double lp_seconds = time_now() - t_lp;
    t->time_logprobs += lp_seconds;

    /* Shuffle the samples (TRL's shuffle_sequence_dict), keyed by the round. */
    for (int i = 0; i < N; i++) r->order[i] = i;
    for (int i = N - 1; i > 0; i--) {
        uint32_t w[4];
        rng_philox(w, c->seed, STREAM_SHUFFLE, (uint64_t)t->round * (uint64_t)N + (uint64_t)i);
        int j = (int)(w[0] % (uint32_t)(i + 1));
        int tmp = r->order[i];
        r->order[i] = r->order[j];
        r->order[j] = tmp;
    }
    r->micro_done = 0;
    t->round++;
    t->time_scoring += time_now() - t1 - lp_seconds;
    return rc;
}

/* One micro-batch: forward, GRPO loss, backward (gradients accumulate). */
/* This rank's part of a micro-batch: forward, GRPO loss, backward (gradients
 * accumulate). Fills the values the ranks then share. */
static int micro_batch_local(Trainer *t, GrpoSamplingMetrics *part_out, double values[6], char *err) {
    TrainConfig *c = t->cfg;
    Rollout *r = &t->ro;
    const int bs = c->per_device_train_batch_size;
    /* Micro-batch k of the round spans the world: this rank takes its slice. */
    int k = r->micro_done % c->steps_per_generation;
    const int *idx = r->order + ((size_t)k * t->dist.world + t->dist.rank) * bs;
    int B = bs;
    int n = pack_batch(t, r, idx, B);
    int T = 1;
    for (int b = 0; b < B; b++)
        if (r->samples[idx[b]].len > T) T = r->samples[idx[b]].len;

    if (ensure_activations(t, err) != 0) return COLT_ERR;
    /* lora_dropout in this forward and its backward only; the masks keyed by the optimizer step and the
     * micro-batch in it, so a resumed run draws what the uninterrupted one drew */
    model_lora_set_dropout_key(t->model, c->seed, t->global_step * TRAIN_CONFIG_MAX_BATCH + t->micro_in_step);
    int frc = model_train_forward(t->model, t->ts, t->tok_ids, t->tok_slot, t->tok_pos, t->tok_target, n,
                                  (float)c->temperature, t->tok_logp, t->tok_entropy, err);
    model_lora_set_dropout_key(t->model, c->seed, -1);
    if (frc != 0) return COLT_ERR;
    /* Gather into padded [B, T] matrices. */
    size_t BT = (size_t)B * T;
    memset(t->mb_logp, 0, BT * sizeof(float));
    memset(t->mb_old, 0, BT * sizeof(float));
    memset(t->mb_ref, 0, BT * sizeof(float));
    memset(t->mb_mask, 0, BT * sizeof(float));
    memset(t->mb_sampling, 0, BT * sizeof(float));
    double ent_sum = 0, ent_count = 0;
    int off = 0;
    for (int b = 0; b < B; b++) {
        Sample *s = &r->samples[idx[b]];
        int plen = r->prompt_len[s->prompt];
        bool counted = !(c->mask_truncated_completions && !s->terminated);
        for (int j = 0; j < s->len; j++) {
            int tok = off + plen - 1 + j;
            t->mb_logp[(size_t)b * T + j] = t->tok_logp[tok];
            if (s->old_logp) t->mb_old[(size_t)b * T + j] = s->old_logp[j];
            if (s->ref_logp) t->mb_ref[(size_t)b * T + j] = s->ref_logp[j];
            t->mb_sampling[(size_t)b * T + j] = s->sampling_logp ? s->sampling_logp[j] : NAN;
            t->mb_mask[(size_t)b * T + j] = counted ? 1.0f : 0.0f;
            if (counted) ent_sum += t->tok_entropy[tok], ent_count += 1;
        }
        t->mb_adv[b] = s->advantage;
        off += plen + s->len - 1;
    }
    GrpoLossConfig lc = t->loss_cfg;
    /* TRL's dapo normaliser: the generation batch's tokens, rescaled to one
     * accumulation window (x GAS / steps_per_generation), per process. */
    double items = r->num_items > 1.0 ? r->num_items : 1.0;
    lc.num_items_in_batch = (float)(items * c->gradient_accumulation_steps / c->steps_per_generation);
    /* TRL's vLLM importance-sampling correction: the engine's log-probs against
     * the trainer's old ones. Without a separate old-log-prob pass the weights
     * have not moved since generation, so this forward's own (detached)
     * log-probs are the old ones. */
    GrpoSamplingMetrics part;
    if (grpo_sampling_is_weights(t->mb_isw, &part, t->need_old_logp ? t->mb_old : t->mb_logp, t->mb_sampling,
                                 t->mb_mask, B, T, t->is_mode, c->vllm_importance_sampling_clip_min,
                                 c->vllm_importance_sampling_clip_max, err) != 0)
        return COLT_ERR;
    float loss = 0;
    GrpoLossMetrics lm;
    if (grpo_loss_with_is_weight(&loss, t->mb_dlogp, &lm, &lc, t->mb_logp, t->need_old_logp ? t->mb_old : NULL,
                                 has_reference(t) ? t->mb_ref : NULL,
                                 c->vllm_importance_sampling_correction ? t->mb_isw : NULL, t->mb_mask, t->mb_adv,
                                 B, T, err) != 0)
        return COLT_ERR;
    /* Back to the packed token layout. */
    memset(t->tok_dlogp, 0, sizeof(float) * (size_t)n);
    off = 0;
    for (int b = 0; b < B; b++) {
        Sample *s = &r->samples[idx[b]];
        int plen = r->prompt_len[s->prompt];
        for (int j = 0; j < s->len; j++) t->tok_dlogp[off + plen - 1 + j] = t->mb_dlogp[(size_t)b * T + j];
        off += plen + s->len - 1;
    }
    if (model_train_backward(t->model, t->ts, t->tok_dlogp, t->grads, err) != 0) return COLT_ERR;

    *part_out = part;
    double v[6] = {ent_count > 0 ? ent_sum / ent_count : NAN, lm.clip_ratio_low, lm.clip_ratio_high,
                   lm.clip_ratio_region, lm.kl, loss};
    memcpy(values, v, sizeof v);
    return COLT_OK;
}

/* One micro-batch of the world: every rank its slice, then the ranks' metrics
 * and losses combined in rank order — the same sums as one process running the
 * ranks' micro-batches one after the other. A failure on any rank fails all. */
static int train_micro_batch(Trainer *t, double *loss_out, char *err) {
    TrainConfig *c = t->cfg;
    Rollout *r = &t->ro;
    GrpoSamplingMetrics part;
    memset(&part, 0, sizeof part);
    double mine[6] = {0};
    if (train_dist_agree(&t->dist, micro_batch_local(t, &part, mine, err), err) != 0) return COLT_ERR;
    if (r->micro_done < c->steps_per_generation) { /* TRL logs these once per round */
        /* every rank's part, merged in rank order (as one process merges its micro-batches) */
        GrpoSamplingMetrics *parts = xcalloc((size_t)t->dist.world, sizeof(GrpoSamplingMetrics));
        int rc = train_dist_gather(&t->dist, parts, &part, sizeof part, err);
        if (r->micro_done == 0) memset(&t->round_sampling, 0, sizeof t->round_sampling);
        for (int q = 0; rc == 0 && q < t->dist.world; q++) grpo_sampling_metrics_merge(&t->round_sampling, &parts[q]);
        free(parts);
        if (rc != 0) return COLT_ERR;
        if (r->micro_done == c->steps_per_generation - 1) {
            const GrpoSamplingMetrics *sm = &t->round_sampling;
            metrics_add(&t->metrics, "sampling/sampling_logp_difference/mean", sm->logp_difference_mean);
            metrics_add(&t->metrics, "sampling/sampling_logp_difference/max", sm->logp_difference_max);
            if (c->vllm_importance_sampling_correction) {
                metrics_add(&t->metrics, "sampling/importance_sampling_ratio/min", sm->is_ratio_min);
                metrics_add(&t->metrics, "sampling/importance_sampling_ratio/mean", sm->is_ratio_mean);
                metrics_add(&t->metrics, "sampling/importance_sampling_ratio/max", sm->is_ratio_max);
            }
        }
    }
    /* TRL logs the loss summed over the accumulation window (the Trainer's tr_loss). */
    double *all = xcalloc((size_t)t->dist.world * 6, sizeof(double));
    int rc = train_dist_gather(&t->dist, all, mine, sizeof mine, err);
    for (int q = 0; rc == 0 && q < t->dist.world; q++) {
        const double *v = all + (size_t)q * 6;
        metrics_add(&t->metrics, "entropy", v[0]);
        metrics_add(&t->metrics, "clip_ratio/low_mean", v[1]);
        metrics_add(&t->metrics, "clip_ratio/high_mean", v[2]);
        metrics_add(&t->metrics, "clip_ratio/region_mean", v[3]);
        if (c->beta > 0) metrics_add(&t->metrics, "kl", v[4]);
        *loss_out += v[5];
    }
    free(all);
    r->micro_done++;
    return rc;
}

/* ---------------------------------------------------------------- checkpoints */

/* What a rollout of this run looks like (a saved one is checked against it). */
static RolloutShape rollout_shape(const Trainer *t) {
    const TrainConfig *c = t->cfg;
    return (RolloutShape){.n_samples = c->generation_batch_size, .group_size = c->num_generations,
                          .n_funcs = t->n_rewards, .max_prompt_len = t->max_prompt_tokens,
                          .max_completion_len = c->max_completion_length,
                          .vocab_size = model_config(t->model)->vocab_size, .dataset_rows = dataset_size(t->data),
                          .micro_per_round = c->steps_per_generation * c->num_iterations,
                          .micro_batch_samples = c->per_device_train_batch_size * t->dist.world,
                          .has_old_logp = t->need_old_logp, .has_ref_logp = has_reference(t)};
}

/* trainer_state.json's content now (NULL if a sample cannot be written as JSON). */
static json_t *trainer_state_json(const Trainer *t) {
    TrainerProgress p = {.global_step = t->global_step, .round = t->round, .epoch = t->epoch,
                         .epoch_pos = t->epoch_pos, .num_tokens = t->num_tokens};
    bool in_round = t->ro.samples && t->ro.micro_done < t->cfg->steps_per_generation * t->cfg->num_iterations;
    return checkpoint_state_json(&p, &t->metrics, in_round ? &t->ro : NULL,
                                 t->cfg->per_device_train_batch_size * t->dist.world, &t->round_sampling,
                                 t->resume_record);
}

static void last_checkpoint_text(const Trainer *t, char *buf, size_t size) {
    if (t->last_checkpoint) snprintf(buf, size, "the last good checkpoint is %s", t->last_checkpoint);
    else snprintf(buf, size, "no checkpoint was saved");
}

/* Writes what this run trains to dir: the model, or its LoRA adapters (PEFT's
 * files). The weights in their storage dtype — bf16 on a GPU, as Hugging Face
 * checkpoints hold them (no rounding: they are bf16 values), fp32 on the CPU;
 * a resume takes the exact fp32 masters from the optimizer state. */
static int save_trained(const Trainer *t, const char *dir, char *err) {
    if (model_has_lora(t->model)) return model_lora_save(t->model, dir, t->cfg->model, err);
    return model_save(t->model, dir, t->be->storage == DTYPE_BF16 ? DTYPE_BF16 : DTYPE_F32, err);
}

/* An unsharded optimizer's file: one, or one per part under tensor parallelism
 * (a checkpoint resumes at the same tensor_parallel_size). */
static void optimizer_file_name(const Trainer *t, char *buf, size_t size) {
    if (t->tp.tp_size > 1)
        snprintf(buf, size, "optimizer-tp%05d-of-%05d.safetensors", t->tp.tp_rank, t->tp.tp_size);
    else
        snprintf(buf, size, "optimizer.safetensors");
}

/* The optimizer shard file of data-parallel rank r in a checkpoint of a
 * sharded run (of this rank's part under tensor parallelism). */
static void shard_file_name(const Trainer *t, char *buf, size_t size, int rank, int world) {
    if (t->tp.tp_size > 1)
        snprintf(buf, size, "optimizer-tp%05d-rank%05d-of-%05d.safetensors", t->tp.tp_rank, rank, world);
    else
        snprintf(buf, size, "optimizer-rank%05d-of-%05d.safetensors", rank, world);
}

#define SHARD_MANIFEST "optimizer_shards.json"

/* The list of a sharded run's shard files: one, or one per part under tensor parallelism. */
static void manifest_name(const Trainer *t, char *buf, size_t size) {
    if (t->tp.tp_size > 1)
        snprintf(buf, size, "optimizer_shards-tp%05d-of-%05d.json", t->tp.tp_rank, t->tp.tp_size);
    else
        snprintf(buf, size, "%s", SHARD_MANIFEST);
}

/* Writes output_dir/checkpoint-N atomically: everything goes into a temporary
 * folder that is renamed into place at the end. state: trainer_state_json's.
 * Weights or optimizer moments that are not finite are never saved: a run that
 * diverged must not replace a good checkpoint.
 *
 * Unsharded optimizer: rank 0 writes everything (the others return at once).
 * Sharded (zero_stage >= 1): collective — rank 0 writes the model, every rank its
 * optimizer shard into the same temporary folder (output_dir must be shared
 * by the ranks' hosts, as for DeepSpeed), then rank 0 the manifest
 * (optimizer_shards.json), the trainer state and the rename.
 * Tensor parallel: collective too — the first data-parallel group's ranks
 * gather the whole weights for rank 0 and each writes its part's optimizer
 * state (optimizer-tpNNNNN-of-NNNNN.safetensors) into the same folder. */
static int save_checkpoint(Trainer *t, json_t *state, char *err) {
    bool sharded = optim_is_sharded(t->opt), tp = t->tp.tp_size > 1;
    if (!sharded && !tp && t->dist.rank != 0) return COLT_OK;
    int64_t step = json_integer_value(json_object_get(state, "global_step"));
    int rc = state ? COLT_OK : errorf(err, "checkpoint: the trainer state could not be written as JSON");
    if (rc == 0 && !optim_state_finite(t->opt)) {
        char last[512];
        last_checkpoint_text(t, last, sizeof last);
        rc = errorf(err, "step %lld: the weights or optimizer moments hold NaN or Inf (training diverged; "
                         "learning_rate %g): checkpoint-%lld not saved, %s",
                    (long long)step, t->cfg->learning_rate, (long long)step, last);
    }
    if ((sharded || tp) && train_dist_agree(&t->dist, rc, err) != 0) return COLT_ERR;
    if (rc != 0) return rc;
    /* The temporary folder carries rank 0's pid (a stale one is recognised as such). */
    long pid = (long)getpid();
    if (sharded) {
        long *pids = xcalloc((size_t)t->dist.world, sizeof(long));
        rc = train_dist_agree(&t->dist, train_dist_gather(&t->dist, pids, &pid, sizeof pid, err), err);
        pid = pids[0];
        free(pids);
        if (rc != 0) return rc;
    }
    if (tp) { /* every rank of the launch writes into rank 0's folder */
        long *pids = xcalloc((size_t)t->dist.all_world, sizeof(long));
        rc = train_dist_agree(&t->dist, comm_all_gather(t->dist.all, pids, &pid, sizeof pid, COMM_BYTE, NULL, err), err);
        pid = pids[0];
        free(pids);
        if (rc != 0) return rc;
    }
    if (model_params_partitioned(t->model)) { /* zero_stage 3: rank 0 saves the whole weights */
        release_activations(t);
        if ((rc = weights_gather(t, err)) != 0) return rc;
    }
    char name[64], tmp_name[96];
    snprintf(name, sizeof name, "checkpoint-%lld", (long long)step);
    snprintf(tmp_name, sizeof tmp_name, "%s.tmp.%ld", name, pid);
    char *final_dir = path_join(t->cfg->output_dir, name), *dir = path_join(t->cfg->output_dir, tmp_name);
    char *state_path = path_join(dir, "trainer_state.json"), *cfg_path = path_join(dir, "train_config.json");
    if (t->dist.rank == 0) { /* tensor parallel: the first group's ranks, which gather the weights for rank 0 */
        if (t->writer) remove_tree(dir);
        if (save_trained(t, dir, err) != 0 || (t->writer && tokenizer_copy_files(t->cfg->model, dir, err) != 0))
            rc = COLT_ERR;
        if (rc == 0 && !sharded) {
            char file[64];
            optimizer_file_name(t, file, sizeof file);
            char *opt_path = path_join(dir, file);
            rc = optim_save(t->opt, opt_path, err);
            free(opt_path);
        }
    }
    if (tp) rc = train_dist_agree(&t->dist, rc, err); /* every part's optimizer state is in the folder */
    weights_release(t);
    if (sharded) {
        rc = train_dist_agree(&t->dist, rc, err); /* the folder exists */
        if (rc == 0) {
            char file[64];
            shard_file_name(t, file, sizeof file, t->dist.rank, t->dist.world);
            char *path = path_join(dir, file);
            rc = train_dist_agree(&t->dist, optim_save_shard(t->opt, path, err), err);
            free(path);
        }
        if (rc == 0 && t->dist.rank == 0) {
            json_t *m = json_object(), *files = json_array();
            json_object_set_new(m, "format", json_string("colt-adamw-shards"));
            json_object_set_new(m, "world_size", json_integer(t->dist.world));
            json_object_set_new(m, "step", json_integer(step));
            for (int r = 0; r < t->dist.world; r++) {
                char file[64];
                shard_file_name(t, file, sizeof file, r, t->dist.world);
                json_array_append_new(files, json_string(file));
            }
            json_object_set_new(m, "files", files);
            char manifest[64];
            manifest_name(t, manifest, sizeof manifest);
            char *text = json_dumps(m, JSON_INDENT(1)), *path = path_join(dir, manifest);
            rc = file_write_atomic(path, text, strlen(text), err);
            free(text), free(path);
            json_decref(m);
        }
        if (tp) rc = train_dist_agree(&t->dist, rc, err); /* every part's list is there before the rename */
    }
    if (rc == 0 && t->writer) {
        char *s = json_dumps(state, JSON_INDENT(1));
        rc = s ? file_write_atomic(state_path, s, strlen(s), err) : errorf(err, "%s: cannot encode", state_path);
        free(s);
    }
    if (rc == 0 && t->writer) {
        json_t *cj = train_config_to_json(t->cfg);
        char *s = json_dumps(cj, JSON_INDENT(2));
        rc = file_write_atomic(cfg_path, s, strlen(s), err);
        free(s);
        json_decref(cj);
    }
    if (rc == 0 && t->writer) {
        remove_tree(final_dir);
        if (rename(dir, final_dir) != 0)
            rc = errorf(err, "%s: cannot rename the checkpoint into place: %s", final_dir, strerror(errno));
    }
    if (rc != 0 && t->writer) remove_tree(dir);
    if (sharded || tp) rc = train_dist_agree(&t->dist, rc, err);
    if (rc == 0) {
        log_info0("saved %s", final_dir);
        t->last_saved_step = step;
        free(t->last_checkpoint);
        t->last_checkpoint = xstrdup(final_dir);
        if (t->writer) checkpoint_keeper_saved(&t->keeper, step);
    }
    free(final_dir), free(dir), free(state_path), free(cfg_path);
    return rc;
}

/* Loads the optimizer state of checkpoint ckpt into this rank's optimizer:
 * optimizer.safetensors (an unsharded run's) or the shards listed in
 * optimizer_shards.json (a sharded run's, at any world size). */
static int load_optimizer(Trainer *t, const char *ckpt, char *err) {
    char file[64], list[64];
    optimizer_file_name(t, file, sizeof file);
    manifest_name(t, list, sizeof list);
    char *whole = path_join(ckpt, file), *manifest = path_join(ckpt, list);
    int rc = COLT_OK;
    if (file_exists(whole)) rc = optim_load(t->opt, whole, err);
    else if (!file_exists(manifest))
        rc = errorf(err, "%s: no optimizer state (neither %s nor %s)%s", ckpt, file, list,
                    t->tp.tp_size > 1 ? ": a checkpoint resumes at the tensor_parallel_size that saved it" : "");
    else {
        json_error_t jerr;
        json_t *m = json_load_file(manifest, 0, &jerr), *files = json_object_get(m, "files");
        size_t n = json_array_size(files);
        if (!m) rc = errorf(err, "%s line %d: %s", manifest, jerr.line, jerr.text);
        else if (n == 0 || json_integer_value(json_object_get(m, "world_size")) != (json_int_t)n)
            rc = errorf(err, "%s: 'files' must list world_size shard files", manifest);
        char **paths = xcalloc(n ? n : 1, sizeof(char *));
        for (size_t i = 0; rc == 0 && i < n; i++) {
            const char *f = json_string_value(json_array_get(files, i));
            if (!f || strchr(f, '/')) rc = errorf(err, "%s: files[%zu] is not a file name", manifest, i);
            else {
                paths[i] = path_join(ckpt, f);
                if (!file_exists(paths[i]))
                    rc = errorf(err, "%s: optimizer shard %s is missing (the checkpoint of a %zu-rank run is "
                                     "incomplete)",
                                ckpt, f, n);
            }
        }
        if (rc == 0) rc = optim_load_shards(t->opt, (const char *const *)paths, (int)n, err);
        for (size_t i = 0; i < n; i++) free(paths[i]);
        free(paths);
        json_decref(m);
    }
    free(whole), free(manifest);
    return rc;
}

/* The checkpoint's model must be the base model's architecture (its weights
 * are the trained ones; the tokenizer, reference model and record come from
 * --model). */
static int check_checkpoint_config(const ModelConfig *ck, const ModelConfig *base, const char *ckpt, char *err) {
#define SAME(field, fmt)                                                                                     \
    if (ck->field != base->field)                                                                            \
        return errorf(err, "resume from %s: its config.json has " #field " " fmt ", the base model's is " fmt \
                           " (a checkpoint of another model?)",                                              \
                      ckpt, ck->field, base->field);
    SAME(arch, "%d") SAME(hidden_size, "%d") SAME(intermediate_size, "%d") SAME(num_hidden_layers, "%d")
    SAME(num_attention_heads, "%d") SAME(num_key_value_heads, "%d") SAME(head_dim, "%d") SAME(vocab_size, "%d")
    SAME(max_position_embeddings, "%d") SAME(rms_norm_eps, "%g") SAME(rope_theta, "%g")
    SAME(tie_word_embeddings, "%d") SAME(attention_bias, "%d")
#undef SAME
    return COLT_OK;
}

static int load_trainer_state(Trainer *t, const char *ckpt, char *err) {
    char *state_path = path_join(ckpt, "trainer_state.json"), *text = NULL;
    size_t len = 0;
    CheckpointState st;
    memset(&st, 0, sizeof st);
    StateLimits lim = {.resume_record = t->resume_record, .checkpoint = ckpt, .rollout = rollout_shape(t),
                       .total_steps = t->total_steps};
    ModelConfig base;
    int rc = file_read_all(state_path, &text, &len, err);
    if (rc == 0) rc = checkpoint_state_parse(&st, text, len, &lim, state_path, err);
    if (rc == 0) rc = model_config_load(&base, NULL, t->cfg->model, err);
    if (rc == 0) rc = check_checkpoint_config(model_config(t->model), &base, ckpt, err);
    if (rc == 0) {
        rc = load_optimizer(t, ckpt, err);
        if (rc == 0 && optim_step_count(t->opt) != st.progress.global_step)
            rc = errorf(err, "%s: the optimizer is at step %lld but trainer_state.json at step %lld (files from "
                             "two checkpoints?)",
                        ckpt, (long long)optim_step_count(t->opt), (long long)st.progress.global_step);
    }
    if (rc == 0) {
        t->global_step = st.progress.global_step;
        t->round = st.progress.round;
        t->epoch = st.progress.epoch;
        t->epoch_pos = st.progress.epoch_pos;
        t->num_tokens = st.progress.num_tokens;
        if (t->epoch > 0) dataset_epoch_order(t->epoch_order, dataset_size(t->data), t->cfg->seed, t->epoch);
        t->metrics = st.metrics;
        rollout_free(&t->ro);
        t->ro = st.rollout;
        memset(&st.rollout, 0, sizeof st.rollout);
        t->round_sampling = st.round_sampling;
    }
    checkpoint_state_free(&st);
    free(text);
    free(state_path);
    return rc;
}

/* ---------------------------------------------------------------- eval and logging */

/* Mean combined reward of num_generations sampled completions per held-out
 * prompt, with fixed RNG streams so before/after are comparable. Writes the
 * completions to output_dir/eval_<tag>.jsonl. */
static int evaluate(Trainer *t, const char *tag, double *mean_reward, char *err) {
    TrainConfig *c = t->cfg;
    size_t n_rows = dataset_size(t->eval_data);
    if (c->num_eval_prompts > 0 && (size_t)c->num_eval_prompts < n_rows) n_rows = (size_t)c->num_eval_prompts;
    const int G = c->num_generations, L = c->max_completion_length, F = t->n_rewards, W = t->dist.world;
    const int N = (int)(n_rows * (size_t)G);
    /* Each rank generates and scores a slice of `chunk` completions (the last
     * ones may be short), then every rank gets every completion and reward. */
    const int chunk = (N + W - 1) / W, lo = chunk * t->dist.rank < N ? chunk * t->dist.rank : N;
    const int hi = lo + chunk < N ? lo + chunk : N, n_local = hi - lo;
    int **ids = xcalloc(n_rows, sizeof(int *));
    int *lens = xcalloc(n_rows, sizeof(int));
    char **texts = xcalloc(n_rows, sizeof(char *));
    GenSequence *seqs = xcalloc((size_t)chunk + 1, sizeof(GenSequence));
    const char **prompts = xcalloc((size_t)N + 1, sizeof(char *)), **completions = xcalloc((size_t)N + 1, sizeof(char *));
    size_t *rows = xcalloc((size_t)chunk + 1, sizeof(size_t));
    float *mine_rewards = xcalloc((size_t)chunk * F + 1, sizeof(float));
    float *per_func = xcalloc((size_t)W * chunk * F + 1, sizeof(float)), *rewards = xcalloc((size_t)N + 1, sizeof(float));
    int *mine_ids = xcalloc((size_t)chunk * (L + 1) + 1, sizeof(int)), *all_ids = xcalloc((size_t)W * chunk * (L + 1) + 1, sizeof(int));
    char **outs = xcalloc((size_t)N + 1, sizeof(char *));
    int rc = COLT_OK;
    for (size_t i = 0; i < n_rows && rc == 0; i++)
        rc = prompt_ids_for_row(t, t->eval_data, i, &ids[i], &lens[i], &texts[i], err);
    if (rc == 0) {
        for (int j = 0; j < n_local; j++) {
            seqs[j].prompt = ids[(lo + j) / G];
            seqs[j].prompt_len = lens[(lo + j) / G];
            seqs[j].stream = STREAM_EVAL_BASE + (uint64_t)(lo + j);
        }
        GenerateOptions go = {.sampling = t->sampling, .max_new_tokens = L, .stop_ids = t->stop_ids,
                              .n_stop_ids = t->n_stop};
        make_room_for_generation(t, n_local);
        rc = weights_gather(t, err);
        if (rc == 0 && n_local > 0) rc = engine_generate(t->model, seqs, n_local, &go, &t->engine_opts, NULL, err);
        weights_release(t);
    }
    for (int j = 0; j < n_local && rc == 0; j++) {
        /* a row: the text's token count, then its ids */
        int n_text = seqs[j].n_tokens - (seqs[j].finish == FINISH_STOP ? 1 : 0);
        int *row = mine_ids + (size_t)j * (L + 1);
        row[0] = n_text;
        memcpy(row + 1, seqs[j].tokens, sizeof(int) * (size_t)n_text);
        rc = tokenizer_decode_generated(t->tok, seqs[j].tokens, (size_t)n_text, true, &outs[lo + j], err);
        prompts[j] = texts[(lo + j) / G];
        completions[j] = outs[lo + j];
        rows[j] = (size_t)(lo + j) / G;
    }
    const int **completion_ids = xcalloc((size_t)chunk + 1, sizeof(int *));
    int *completion_lens = xcalloc((size_t)chunk + 1, sizeof(int));
    for (int j = 0; j < n_local && rc == 0; j++) completion_ids[j] = seqs[j].tokens, completion_lens[j] = seqs[j].n_tokens;
    if (rc == 0 && n_local > 0)
        rc = score_completions(t, mine_rewards, t->eval_data, rows, prompts, completions, completion_ids,
                               completion_lens, n_local, err);
    free(completion_ids), free(completion_lens);
    rc = train_dist_agree(&t->dist, rc, err);
    if (rc == 0) rc = train_dist_gather(&t->dist, per_func, mine_rewards, sizeof(float) * (size_t)chunk * F, err);
    if (rc == 0) rc = train_dist_gather(&t->dist, all_ids, mine_ids, sizeof(int) * (size_t)chunk * (L + 1), err);
    if (rc == 0) {
        grpo_combine_rewards(rewards, per_func, t->reward_weights, N, F);
        *mean_reward = nanmean(rewards, N, 1);
    }
    /* Rank 0 writes every completion with its reward. */
    if (rc == 0 && t->writer) {
        for (int i = 0; rc == 0 && i < N; i++) {
            prompts[i] = texts[i / G];
            if (!outs[i]) {
                const int *row = all_ids + (size_t)i * (L + 1);
                rc = tokenizer_decode_generated(t->tok, row + 1, (size_t)row[0], true, &outs[i], err);
            }
            completions[i] = outs[i];
        }
        char name[64];
        snprintf(name, sizeof name, "eval_%s.jsonl", tag);
        char *path = path_join(c->output_dir, name);
        AtomicFile af;
        if (rc == 0 && atomic_open(&af, path, err) == 0) {
            for (int i = 0; rc == 0 && i < N; i++) {
                json_t *o = json_pack("{s:s,s:s,s:o}", "prompt", prompts[i], "completion", completions[i], "reward",
                                      isnan(rewards[i]) ? json_null() : json_real(rewards[i]));
                char *line = o ? json_dumps(o, 0) : NULL;
                if (line) rc = atomic_write(&af, line, strlen(line), err) || atomic_write(&af, "\n", 1, err);
                free(line);
                json_decref(o);
            }
            if (rc == 0) rc = atomic_commit(&af, err);
            else atomic_abort(&af);
        } else rc = COLT_ERR;
        free(path);
    }
    rc = train_dist_agree(&t->dist, rc, err);
    for (int j = 0; j < n_local; j++) gen_sequence_free(&seqs[j]);
    for (int i = 0; i < N; i++) free(outs[i]);
    for (size_t i = 0; i < n_rows; i++) free(ids[i]), free(texts[i]);
    free(ids), free(lens), free(texts), free(seqs), free(prompts), free(completions), free(rows);
    free(per_func), free(rewards), free(outs), free(mine_rewards), free(mine_ids), free(all_ids);
    return rc;
}

static double fractional_epoch(const Trainer *t) {
    size_t n = dataset_size(t->data);
    if (t->epoch == 0) return 0.0;
    return (double)(t->epoch - 1) + (double)t->epoch_pos / (double)n;
}

static void format_duration(char *buf, size_t size, double seconds) {
    long s = (long)(seconds + 0.5);
    if (s >= 3600) snprintf(buf, size, "%ldh%02ldm", s / 3600, (s / 60) % 60);
    else snprintf(buf, size, "%ldm%02lds", s / 60, s % 60);
}

/* Writes one metrics line and the progress line; prints and saves sample completions. */
static int log_step(Trainer *t, double elapsed, int64_t steps_this_run, char *err) {
    json_t *o = metrics_flush(&t->metrics);
    json_t *line = json_object();
    json_object_set_new(line, "step", json_integer(t->global_step));
    json_object_set_new(line, "epoch", json_real(fractional_epoch(t)));
    json_object_update(line, o);
    json_decref(o);
    json_object_set_new(line, "num_tokens", json_integer(t->num_tokens));
    char *s = json_dumps(line, JSON_REAL_PRECISION(8));
    int rc = file_append_line(t->metrics_fp, t->metrics_path, s, err);
    free(s);
    if (rc == 0 && t->tb) rc = tensorboard_add_metrics(t->tb, line, err);

    double per_step = steps_this_run > 0 ? elapsed / (double)steps_this_run : 0.0;
    char eta[32];
    format_duration(eta, sizeof eta, per_step * (double)(t->total_steps - t->global_step));
    json_t *reward = json_object_get(line, "reward"), *loss = json_object_get(line, "loss");
    json_t *len = json_object_get(line, "completions/mean_length");
    log_info0("step %lld/%lld | reward %.4f | loss %.5f | mean length %.1f | %.2f s/step | ETA %s",
              (long long)t->global_step, (long long)t->total_steps, json_number_value(reward),
              json_number_value(loss), json_number_value(len), per_step, eta);
    json_decref(line);

    /* Sample completions of the current round, printed and saved. */
    Rollout *r = &t->ro;
    if (rc != 0 || !r->samples || t->cfg->log_completions_count <= 0) return rc;
    char *path = path_join(t->cfg->output_dir, "completions.jsonl");
    FILE *fp = file_open_append(path, err);
    if (!fp) rc = COLT_ERR;
    for (int i = 0; rc == 0 && i < t->cfg->log_completions_count && i < r->n_samples; i++) {
        int k = (int)(((int64_t)i * r->n_samples) / t->cfg->log_completions_count);
        Sample *sm = &r->samples[k];
        /* JSON-quoted, so newlines in a completion stay on one line. */
        json_t *p = json_string(r->prompt_text[sm->prompt]), *q = json_string(sm->text);
        char *ps = json_dumps(p, JSON_ENCODE_ANY), *qs = json_dumps(q, JSON_ENCODE_ANY);
        log_info0("  sample: %s -> %s  [reward %.3f]", ps, qs, sm->reward);
        free(ps), free(qs);
        json_decref(p), json_decref(q);
        json_t *so = json_pack("{s:I,s:s,s:s,s:o,s:f}", "step", (json_int_t)t->global_step, "prompt",
                               r->prompt_text[sm->prompt], "completion", sm->text, "reward",
                               isnan(sm->reward) ? json_null() : json_real(sm->reward), "advantage",
                               (double)sm->advantage);
        char *ss = so ? json_dumps(so, 0) : NULL;
        if (ss) rc = file_append_line(fp, path, ss, err);
        free(ss);
        json_decref(so);
    }
    if (fp && fclose(fp) != 0 && rc == 0) rc = errorf(err, "%s: cannot write: %s", path, strerror(errno));
    free(path);
    return rc;
}

/* An eval's mean reward at the current step, to TensorBoard ("eval/reward")
 * and, for the evals during training, to metrics.jsonl as {"step",
 * "eval_reward"} (reward_curve.svg marks those; summary.json has before and
 * after). Rank 0 writes; every rank gets the outcome. */
static int log_eval(Trainer *t, double reward, bool during_training, char *err) {
    int rc = COLT_OK;
    if (t->writer) {
        json_t *line = json_pack("{s:I,s:o}", "step", (json_int_t)t->global_step, "eval_reward",
                                 isnan(reward) ? json_null() : json_real(reward));
        char *s = during_training ? json_dumps(line, JSON_REAL_PRECISION(8)) : NULL;
        if (s) rc = file_append_line(t->metrics_fp, t->metrics_path, s, err);
        free(s);
        if (rc == 0 && t->tb) rc = tensorboard_add_metrics(t->tb, line, err);
        json_decref(line);
    }
    return train_dist_agree(&t->dist, rc, err);
}

/* On resume, keeps only the metric lines of steps up to the checkpoint. */
static int truncate_metrics(const char *path, int64_t max_step, char *err) {
    if (!file_exists(path)) return COLT_OK;
    char *data = NULL;
    size_t len = 0;
    if (file_read_all(path, &data, &len, err) != 0) return COLT_ERR;
    char *keep = xmalloc(len + 1);
    size_t k = 0;
    char *line = data;
    while (line && *line) {
        char *nl = strchr(line, '\n');
        size_t l = nl ? (size_t)(nl - line + 1) : strlen(line);
        json_t *o = json_loadb(line, l, 0, NULL);
        if (o && json_integer_value(json_object_get(o, "step")) <= max_step) {
            memcpy(keep + k, line, l);
            k += l;
        }
        json_decref(o);
        line = nl ? nl + 1 : NULL;
    }
    int rc = file_write_atomic(path, keep, k, err);
    free(keep);
    free(data);
    return rc;
}

/* ---------------------------------------------------------------- setup */

/* The communicator first, so that a rank failing anywhere in setup can tell the others. */
static int open_world(Trainer *t, const LaunchEnv *env, char *err) {
    t->dist.rank = env->rank;
    t->dist.world = env->world_size;
    t->writer = env->rank == 0;
    log_set_rank(env->rank);
    int tp = t->cfg->tensor_parallel_size;
    if (env->world_size == 1 && tp > 1)
        return errorf(err, "tensor_parallel_size %d runs one process per part: start %d (or a multiple) with mpirun "
                           "-np or torchrun --nproc_per_node",
                      tp, tp);
    if (env->world_size == 1) return COLT_OK;
    /* Collectives here run on host buffers (gradients are staged through the
     * host), so CPU transports serve GPU ranks too. */
    CommOptions co = {.kind = COMM_AUTO, .gpu = false, .cuda_device = -1, .timeout_s = t->cfg->ddp_timeout};
    Comm *world = NULL;
    if (comm_open(&world, env, &co, err) != 0) return COLT_ERR;
    if (tp == 1) {
        t->dist.comm = world;
        t->dist.owns_comm = true;
        log_info0("data parallel: %d processes (%s, %s)", env->world_size, launcher_name(env->launcher),
                  comm_kind_name(comm_kind(world)));
        return COLT_OK;
    }
    /* Tensor parallel: gradients and rounds over the data-parallel group,
     * agreements over the world. */
    t->dist.all = world;
    t->dist.all_rank = env->rank;
    t->dist.all_world = env->world_size;
    if (tp_group_open(&t->tp, world, tp, NULL, err) != 0) return COLT_ERR;
    t->dist.rank = t->tp.dp_rank;
    t->dist.world = t->tp.dp_size;
    t->dist.comm = t->tp.dp_size > 1 ? t->tp.dp : NULL;
    log_info0("tensor parallel: %d group(s) of %d processes, data parallel across them (%s, %s)", t->tp.dp_size, tp,
              launcher_name(env->launcher), comm_kind_name(comm_kind(world)));
    return COLT_OK;
}

/* zero_stage 2 or 3 under tensor parallelism: the global gradient norm from
 * every rank's shard of its part's summed gradients, over the whole launch,
 * a parameter several ranks of a group hold (the norms; replicated KV heads)
 * counted once. */
static int zero2_norm_tp(Trainer *t, double *norm, char *err) {
    size_t lo = 0, hi = 0;
    optim_shard_range(t->opt, &lo, &hi);
    const Backend *be = t->be;
    const char *shard = train_dist_zero2_shard(&t->dist);
    double mine = be->sum_squares(be, shard, hi - lo);
    for (int i = 0; i < model_param_count(t->model); i++) {
        int copies = model_param_copies(t->model, i);
        if (copies == 1) continue;
        size_t a = model_param_offset(t->model, i), b = a + model_param(t->model, i).numel;
        a = a > lo ? a : lo;
        b = b < hi ? b : hi;
        if (b > a) mine -= be->sum_squares(be, shard + (a - lo) * sizeof(float), b - a) * (1.0 - 1.0 / copies);
    }
    int rc = comm_all_reduce(t->dist.all, &mine, 1, COMM_FLOAT64, NULL, err);
    *norm = sqrt(mine);
    return rc;
}

/* The model's tensor-parallel collectives, or NULL for whole models. */
static const TensorParallel *tp_hooks(Trainer *t) {
    if (t->tp.tp_size <= 1) return NULL;
    t->tp_hooks = tp_group_hooks(&t->tp);
    return &t->tp_hooks;
}

static int trainer_setup_local(Trainer *t, TrainConfig *c, const LaunchEnv *env, char *err);
static int check_visible_devices(Trainer *t, char *err);

static int trainer_setup(Trainer *t, TrainConfig *c, const LaunchEnv *env, char *err) {
    memset(t, 0, sizeof *t);
    t->cfg = c;
    if (open_world(t, env, err) != 0) return COLT_ERR;
    if (train_dist_agree(&t->dist, check_visible_devices(t, err), err) != 0) return COLT_ERR;
    if (train_dist_agree(&t->dist, trainer_setup_local(t, c, env, err), err) != 0) return COLT_ERR;
    /* Last: the gradient path gathers from every rank, so all must have got here. */
    size_t n_grads = 0;
    void *grads = model_grads_flat(t->grads, &n_grads);
    char how[256];
    int rc = COLT_OK;
    if (t->tp.tp_size > 1) { /* over the data-parallel group: NCCL when the groups are, else the host */
        Comm *dp = NULL;
        if (t->dist.world > 1) rc = tp_group_data_parallel_nccl(&t->tp, &dp, err);
        if (dp)
            train_dist_adopt_gradients(&t->dist, dp, t->be, grads, n_grads, (size_t)c->ddp_bucket_cap_mb << 20);
        snprintf(how, sizeof how, "%s",
                 t->dist.world == 1 ? "one data-parallel group"
                 : dp ? "NCCL across the tensor-parallel groups, all-reduced in buckets during the backward pass"
                      : "summed on the host in rank order");
    } else
        rc = train_dist_open_gradients(&t->dist, env, t->be, t->be->device, grads, n_grads,
                                       (size_t)c->ddp_bucket_cap_mb << 20, c->ddp_timeout, how, sizeof how, err);
    if (train_dist_agree(&t->dist, rc, err) != 0) return COLT_ERR;
    if (c->zero_stage >= 2) {
        size_t lo = 0, hi = 0;
        optim_shard_range(t->opt, &lo, &hi);
        if (train_dist_agree(&t->dist, train_dist_zero2_open(&t->dist, t->be, t->grads, lo, hi, err), err) != 0)
            return COLT_ERR;
        snprintf(how, sizeof how, "zero_stage %d: each layer's gradients %s as the backward finishes it; this rank "
                                  "keeps its shard of the sum",
                 c->zero_stage, t->dist.world == 1 ? "added to the shard" : t->dist.grad_comm ? "reduced over NCCL, each part to the rank keeping it," : "summed on the host in rank order");
    }
    if (t->dist.world > 1 || c->zero_stage >= 2) log_info0("gradients: %s", how);
    return COLT_OK;
}

/* The GPU this rank computes on: local rank r takes devices[r], or GPU r. It
 * never touches another (no context is created on any other device). */
static int choose_device(const TrainConfig *c, const LaunchEnv *env, int *device, char *err) {
    *device = 0;
    const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
    if (strcmp(c->device, "cpu") == 0) return COLT_OK; /* CPU ranks, on purpose */
    int n_gpus = backend_cuda_device_count();
    if (n_gpus == 0) {
        if (strcmp(c->device, "auto") == 0 && env->world_size > 1)
            return errorf(err, "no GPU is visible to this process (CUDA_VISIBLE_DEVICES=%s) but %d processes were "
                               "launched: pass --device cpu to run CPU ranks on purpose",
                          cvd ? cvd : "unset", env->world_size);
        return COLT_OK; /* auto: the CPU; cuda: backend_open says there is no GPU */
    }
    if (c->devices) {
        size_t n = json_array_size(c->devices);
        if ((size_t)env->local_rank >= n)
            return errorf(err, "local rank %d has no entry in devices (%zu listed for %d processes on this node)",
                          env->local_rank, n, env->local_world_size);
        *device = (int)json_integer_value(json_array_get(c->devices, (size_t)env->local_rank));
        if (*device >= n_gpus)
            return errorf(err, "devices[%d] is GPU %d, but this process sees %d (CUDA_VISIBLE_DEVICES=%s)",
                          env->local_rank, *device, n_gpus, cvd ? cvd : "unset");
        return COLT_OK;
    }
    if (env->local_rank >= n_gpus)
        return errorf(err, "local rank %d of %d on this node has no GPU of its own: %d visible (CUDA_VISIBLE_DEVICES=%s); "
                           "start at most %d processes per node, or list devices to share GPUs on purpose",
                      env->local_rank, env->local_world_size, n_gpus, cvd ? cvd : "unset", n_gpus);
    *device = env->local_rank;
    return COLT_OK;
}

/* Ranks on one host must see the same GPUs, or "local rank r takes GPU r" means
 * different cards to different ranks. */
static int check_visible_devices(Trainer *t, char *err) {
    if (t->dist.world == 1) return COLT_OK;
    typedef struct {
        char host[64], visible[192];
    } Seen;
    Seen mine;
    memset(&mine, 0, sizeof mine);
    gethostname(mine.host, sizeof mine.host - 1);
    const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
    snprintf(mine.visible, sizeof mine.visible, "%s", cvd ? cvd : "(unset)");
    Seen *all = xcalloc((size_t)t->dist.world, sizeof(Seen));
    int rc = train_dist_gather(&t->dist, all, &mine, sizeof mine, err);
    for (int r = 0; rc == 0 && r < t->dist.world; r++)
        if (strcmp(all[r].host, mine.host) == 0 && strcmp(all[r].visible, mine.visible) != 0)
            rc = errorf(err, "CUDA_VISIBLE_DEVICES differs between ranks on host %s: rank %d has %s, rank %d has %s",
                        mine.host, r, all[r].visible, t->dist.rank, mine.visible);
    free(all);
    return rc;
}

/* The inputs of this run's memory plan (memory_plan.h): the settings, the
 * model's shape, the longest prompt found, and the device as it is now. */
void trainer_plan_input(MemoryPlanInput *in, const TrainConfig *c, const ModelConfig *mc, const Backend *be,
                        int world_size, int max_prompt_tokens, LoraConfig *lora_out) {
    memset(in, 0, sizeof *in);
    in->model = *mc;
    in->gpu = be ? strncmp(be->name, "cuda", 4) == 0 : strcmp(c->device, "cpu") != 0;
    in->storage = be ? be->storage : in->gpu ? DTYPE_BF16 : DTYPE_F32;
    in->logits_chunk_rows = be ? be->logits_chunk_rows : in->gpu ? 1024 : 64; /* without one: the cuda / cpu tables' */
    in->world_size = world_size;
    in->tensor_parallel_size = c->tensor_parallel_size;
    in->zero_stage = c->zero_stage;
    in->offload = strcmp(c->offload_optimizer, "cpu") == 0;
    char err[ERR_LEN];
    in->lora = c->use_peft && train_config_lora(c, lora_out, err) == 0 ? lora_out : NULL;
    in->reference_model = c->beta > 0 && !c->use_peft;
    in->batch = c->per_device_train_batch_size;
    in->max_seq = max_prompt_tokens + c->max_completion_length;
    in->gen_seqs = c->generation_batch_size / (world_size > 0 ? world_size : 1);
    in->deterministic = c->deterministic_set ? c->deterministic : in->storage == DTYPE_BF16;
    in->recompute = c->gradient_checkpointing;
    in->host_bytes = memory_plan_host_total();
}

/* Before any weight is loaded: a run that cannot fit stops here with the
 * parts and what would make it fit; one that fits only with recompute gets it. */
static int plan_memory(Trainer *t, const TrainConfig *c, const ModelConfig *mc, char *err) {
    MemoryPlanInput in;
    LoraConfig lora;
    trainer_plan_input(&in, c, mc, t->be, t->dist.world, t->max_prompt_tokens, &lora);
    size_t free_bytes = 0, total_bytes = 0;
    if (t->be->memory_info) t->be->memory_info(t->be, &free_bytes, &total_bytes);
    if (in.gpu) in.backend_scratch = backend_cuda_reserved_bytes(t->be);
    in.device_bytes = total_bytes ? (double)total_bytes : in.host_bytes;
    in.device_free = total_bytes ? (double)free_bytes : in.host_bytes;
    if (in.device_free <= 0) return COLT_OK; /* nothing known to plan against */
    MemoryPlan p;
    memory_plan_compute(&p, &in);
    if (!p.fits || !p.fits_host) return memory_plan_error(&p, &in, err);
    t->plan = p;
    if (p.recompute_forced) {
        t->recompute = true;
        log_info0("gradient_checkpointing turned on by the memory plan: activations need %.1f GB without it, "
                  "%.1f GB with it",
                  p.activations_full / (1024.0 * 1024.0 * 1024.0), p.activations_recompute / (1024.0 * 1024.0 * 1024.0));
    }
    return COLT_OK;
}

/* The model this run trains: the base model from `model`, or a full
 * checkpoint's weights when resuming; with use_peft the base model plus new
 * LoRA adapters, or the checkpoint's adapters when resuming. */
static int load_trained_model(Trainer *t, const TrainConfig *c, char *err) {
    const char *ckpt = c->resume_from_checkpoint;
    if (ckpt && !c->use_peft) {
        char *adapter = path_join(ckpt, "adapter_config.json");
        bool lora_ckpt = file_exists(adapter);
        free(adapter);
        if (lora_ckpt)
            return errorf(err, "resume from %s: it holds LoRA adapters (adapter_config.json): set use_peft: true", ckpt);
    }
    if (model_load_tp(&t->model, ckpt && !c->use_peft ? ckpt : c->model, t->be, tp_hooks(t), err) != 0) return COLT_ERR;
    if (!c->use_peft) return COLT_OK;
    LoraConfig want;
    if (train_config_lora(c, &want, err) != 0) return COLT_ERR;
    if (!ckpt) {
        if (model_lora_attach(t->model, &want, c->seed, err) != 0) return COLT_ERR;
    } else {
        if (model_lora_load(t->model, ckpt, err) != 0) return error_prefix(err, "resume from %s", ckpt);
        const LoraConfig *have = model_lora_config(t->model);
        if (have->r != want.r || have->alpha != want.alpha || have->use_rslora != want.use_rslora ||
            have->targets != want.targets)
            return errorf(err, "resume from %s: its adapters (r %d, lora_alpha %g, use_rslora %d) or target modules "
                               "differ from this run's settings (lora_r %d, lora_alpha %g, use_rslora %d)",
                          ckpt, have->r, (double)have->alpha, have->use_rslora, want.r, (double)want.alpha,
                          want.use_rslora);
        model_lora_set_dropout(t->model, want.dropout); /* a training setting: this run's */
    }
    size_t n_adapters = 0, n_weights = model_weight_bytes(t->model) / dtype_size(t->be->storage);
    for (int i = 0; i < model_param_count(t->model); i++) n_adapters += model_param(t->model, i).numel;
    const ModelConfig *mc = model_config(t->model);
    char targets[160] = "";
    for (int k = 0; k < LORA_N_TARGETS; k++)
        if (want.targets & (1u << k))
            snprintf(targets + strlen(targets), sizeof targets - strlen(targets), "%s%s", targets[0] ? " " : "",
                     lora_target_name((LoraTarget)k));
    log_info0("LoRA: r %d, lora_alpha %g%s on %s of %d layers: %zu trainable parameters (%.2f%% of %zu frozen)%s",
              want.r, (double)want.alpha, want.use_rslora ? " (rsLoRA)" : "", targets, mc->num_hidden_layers,
              n_adapters, 100.0 * (double)n_adapters / (double)n_weights, n_weights,
              t->tp.tp_size > 1 ? " on each tensor-parallel rank (its part)" : "");
    return COLT_OK;
}

/* merge_lora: output_dir/merged, a plain checkpoint of the weights with the
 * adapters folded in (in the base model's dtype), with the tokenizer. Under
 * tensor parallelism the first group's ranks each merge their part and
 * gather it for rank 0, which writes. */
static int save_merged(const Trainer *t, char *err) {
    char *dir = path_join(t->cfg->output_dir, "merged");
    DType dtype = model_config(t->model)->torch_dtype == DTYPE_BF16 ? DTYPE_BF16 : DTYPE_F32;
    int rc = model_save_merged(t->model, dir, dtype, err);
    if (rc == 0 && t->writer) rc = tokenizer_copy_files(t->cfg->model, dir, err);
    if (rc == 0) log_info0("merged model (weights + adapters) saved to %s", dir);
    free(dir);
    return rc;
}

/* zero_stage 3: m keeps only this rank's part of its weights (the optimizer
 * shard's range), loaded whole just before; a layer is gathered while a pass
 * uses it, the whole weights for generation and saving (model_train.h). The
 * gathers run over t->dist, whose NCCL path opens later: none happens here. */
static int partition_weights(Trainer *t, Model *m, char *err) {
    if (t->cfg->zero_stage < 3) return COLT_OK;
    size_t lo = 0, hi = 0, numel = 0;
    model_params_flat(m, &numel);
    optim_shard_bounds(numel, t->dist.world, t->dist.rank, &lo, &hi);
    ParamsGather pg;
    train_dist_zero3_gather(&t->dist, t->be, numel, &pg);
    if (model_params_partition(m, lo, hi, &pg, err) != 0) return COLT_ERR;
    if (m == t->model)
        log_info0("weights: zero_stage 3 over %d rank(s): this rank keeps parameters %zu .. %zu of %zu; each layer is "
                  "gathered while a pass uses it, the whole weights for generation and saving",
                  t->dist.world, lo, hi, numel);
    return COLT_OK;
}

/* Ranks on one host share its cores: unless OMP_NUM_THREADS says otherwise,
 * each takes its share for OpenMP (the CPU backend's ops, the offloaded
 * AdamW), where each would otherwise start a thread per core (torchrun sets
 * OMP_NUM_THREADS for its ranks for the same reason). */
static void share_host_cores(const LaunchEnv *env) {
    if (env->local_world_size <= 1 || getenv("OMP_NUM_THREADS")) return;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int share = cores > env->local_world_size ? (int)(cores / env->local_world_size) : 1;
    omp_set_num_threads(share);
    log_info0("OpenMP: %d thread(s) per rank (%ld cores shared by the %d ranks on this host; OMP_NUM_THREADS "
              "overrides)", share, cores, env->local_world_size);
}

/* Everything setup does on this rank. Only rank 0 touches output_dir. */
static int trainer_setup_local(Trainer *t, TrainConfig *c, const LaunchEnv *env, char *err) {
    share_host_cores(env);
    int device = 0;
    if (choose_device(c, env, &device, err) != 0) return COLT_ERR;
    t->be = backend_open(c->device, device, err);
    if (!t->be) return COLT_ERR;
    if (t->tp.tp_size > 1) {
        char how[128];
        if (tp_group_use_nccl(&t->tp, env, t->dist.all, t->be, c->ddp_timeout, how, sizeof how, err) != 0)
            return COLT_ERR;
        log_info0("tensor parallel collectives: %s", how);
    }
    t->last_saved_step = -1;
    if (t->writer) {
        if (make_dirs(c->output_dir, err) != 0) return COLT_ERR;
        int stale = checkpoint_remove_stale_temporaries(c->output_dir);
        if (stale > 0) log_info0("removed %d temporary file(s) left in %s by a run that was killed", stale, c->output_dir);
    }
    if (tokenizer_load(&t->tok, c->model, err) != 0) return COLT_ERR;
    /* The model's shape first: the prompts are checked and the memory planned
     * before any weight is loaded. */
    ModelConfig base_cfg; /* the weights this run loads: a full-model checkpoint's when resuming from one */
    char *ck_config = c->resume_from_checkpoint ? path_join(c->resume_from_checkpoint, "config.json") : NULL;
    const char *weights_dir =
        c->resume_from_checkpoint && !c->use_peft && file_exists(ck_config) ? c->resume_from_checkpoint : c->model;
    free(ck_config);
    if (model_config_load(&base_cfg, NULL, weights_dir, err) != 0) return COLT_ERR;
    const ModelConfig *mc = &base_cfg;
    if (tokenizer_vocab_size(t->tok) > mc->vocab_size)
        return errorf(err, "%s: the tokenizer has %d tokens but the model only %d", c->model,
                      tokenizer_vocab_size(t->tok), mc->vocab_size);

    if (dataset_load_column(&t->data, c->dataset, c->dataset_prompt_column, err) != 0) return COLT_ERR;
    if (c->eval_dataset &&
        dataset_load_column(&t->eval_data, c->eval_dataset, c->dataset_prompt_column, err) != 0)
        return COLT_ERR;
    if (t->eval_data) {
        size_t rows = dataset_size(t->eval_data);
        if (c->num_eval_prompts > 0 && (size_t)c->num_eval_prompts < rows) rows = (size_t)c->num_eval_prompts;
        if (rows > TRAIN_CONFIG_MAX_COMPLETIONS / (size_t)c->num_generations)
            return errorf(err, "%s: %zu eval prompts x num_generations %d is more than the %d completions evaluated "
                               "at once: set num_eval_prompts",
                          c->eval_dataset, rows, c->num_generations, TRAIN_CONFIG_MAX_COMPLETIONS);
    }

    /* Every prompt must fit with a full completion: check all of them now,
     * before any work that could be lost. */
    Dataset *sets[2] = {t->data, t->eval_data};
    const char *names[2] = {c->dataset, c->eval_dataset};
    for (int d = 0; d < 2; d++) {
        if (!sets[d]) continue;
        for (size_t i = 0; i < dataset_size(sets[d]); i++) {
            int *ids = NULL, n = 0;
            char *text = NULL;
            if (prompt_ids_for_row(t, sets[d], i, &ids, &n, &text, err) != 0) return error_prefix(err, "%s", names[d]);
            free(ids);
            free(text);
            if (n + c->max_completion_length > mc->max_position_embeddings)
                return errorf(err, "%s row %zu: prompt of %d tokens + max_completion_length %d exceeds the model's "
                                   "max_position_embeddings (%d); shorten the prompt, lower max_prompt_length "
                                   "(prompts are cut from the left) or max_completion_length",
                              names[d], i, n, c->max_completion_length, mc->max_position_embeddings);
            if (n > t->max_prompt_tokens) t->max_prompt_tokens = n;
        }
    }
    if (plan_memory(t, c, mc, err) != 0) return COLT_ERR;
    alloc_label(t, "the model's weights", t->plan.weights + t->plan.adapters);
    if (load_trained_model(t, c, err) != 0 || partition_weights(t, t->model, err) != 0) return COLT_ERR;
    alloc_label(t, "the reference model's weights", t->plan.reference);
    if (c->beta > 0 && !c->use_peft &&
        (model_load_tp(&t->ref_model, c->model, t->be, tp_hooks(t), err) != 0 ||
         partition_weights(t, t->ref_model, err) != 0))
        return COLT_ERR;
    alloc_label(t, NULL, 0);
    t->ref_is_base = c->beta > 0 && c->use_peft;
    mc = model_config(t->model);

    size_t n_prompts = dataset_size(t->data);
    int P = c->generation_batch_size / c->num_generations;
    if (n_prompts < (size_t)P)
        return errorf(err, "%s: %zu prompts, fewer than the %d unique prompts a generation batch needs "
                           "(generation_batch_size %d / num_generations %d)",
                      c->dataset, n_prompts, P, c->generation_batch_size, c->num_generations);
    t->epoch_order = xcalloc(n_prompts, sizeof(size_t));
    t->epoch_pos = n_prompts;  /* the first round starts epoch 1 */

    t->n_rewards = (int)json_array_size(c->reward_funcs);
    t->rewards = xcalloc((size_t)t->n_rewards, sizeof(RewardFunc *));
    t->reward_weights = xcalloc((size_t)t->n_rewards, sizeof(float));
    for (int k = 0; k < t->n_rewards; k++) {
        if (reward_create(&t->rewards[k], json_array_get(c->reward_funcs, (size_t)k), err) != 0)
            return error_prefix(err, "reward_funcs[%d]", k);
        t->reward_weights[k] =
            c->reward_weights ? (float)json_number_value(json_array_get(c->reward_weights, (size_t)k)) : 1.0f;
        if (!isfinite(t->reward_weights[k]))
            return errorf(err, "reward_weights[%d] is not a finite 32-bit float", k);
    }

    t->sampling = (SamplingParams){.temperature = (float)c->temperature, .top_k = c->top_k, .top_p = (float)c->top_p,
                                   .min_p = (float)c->min_p, .repetition_penalty = (float)c->repetition_penalty,
                                   .seed = c->seed};
    t->n_stop = prompt_stop_ids(t->stop_ids, mc, t->tok);

    GrpoLossConfig *lc = &t->loss_cfg;
    if (grpo_loss_type_parse(&lc->loss_type, c->loss_type, err) != 0 ||
        grpo_importance_level_parse(&lc->importance_sampling_level, c->importance_sampling_level, err) != 0)
        return COLT_ERR;
    lc->epsilon_low = (float)c->epsilon;
    lc->epsilon_high = (float)c->epsilon_high;
    lc->delta = isnan(c->delta) ? 0.0f : (float)c->delta;
    lc->beta = (float)c->beta;
    lc->max_completion_length = c->max_completion_length;
    /* Each rank's loss carries 1 / world and the ranks' gradients are summed:
     * the sum equals one process accumulating the ranks' micro-batches. */
    lc->gradient_accumulation_steps = c->gradient_accumulation_steps * t->dist.world;
    /* TRL: old log-probs only when generation and optimizer steps are misaligned. */
    t->need_old_logp = c->gradient_accumulation_steps % (c->steps_per_generation * c->num_iterations) != 0;
    if (grpo_sampling_is_mode_parse(&t->is_mode, c->vllm_importance_sampling_mode, err) != 0) return COLT_ERR;
    t->engine_opts.gpu_memory_utilization = c->gpu_memory_utilization;
    /* unset: on for bf16 storage, where the default kernels' engine/trainer log-probs differ by ~1e-2 */
    bool deterministic = c->deterministic_set ? c->deterministic
                                              : t->be->storage == DTYPE_BF16 && t->be->set_batch_invariant != NULL;
    if (deterministic) { /* on for the trainer's forward here, and for the engine's (engine.h) */
        if (!t->be->set_batch_invariant) return errorf(err, "deterministic: backend %s has no such mode", t->be->name);
        t->be->set_batch_invariant(t->be, 1);
        t->engine_opts.deterministic = true;
    }

    if (lr_scheduler_parse(&t->scheduler, c->lr_scheduler_type, err) != 0) return COLT_ERR;
    if (train_config_total_steps(&t->total_steps, c, n_prompts, err) != 0) return COLT_ERR;
    t->warmup_steps = lr_warmup_steps((int)t->total_steps, (float)c->warmup_ratio, c->warmup_steps);

    AdamWConfig ac = {.beta1 = (float)c->adam_beta1, .beta2 = (float)c->adam_beta2, .eps = (float)c->adam_epsilon,
                      .weight_decay = (float)c->weight_decay};
    /* zero_stage >= 1: each rank keeps its shard of the optimizer state (and
     * updates that shard of the weights); offload: that state in host memory. */
    OptimShardOptions so = {.rank = c->zero_stage >= 1 ? t->dist.rank : 0,
                            .world = c->zero_stage >= 1 ? t->dist.world : 1,
                            .offload = strcmp(c->offload_optimizer, "cpu") == 0};
    alloc_label(t, "the optimizer state", t->plan.optimizer);
    if (optim_create_sharded(&t->opt, t->model, &ac, t->be, &so, err) != 0) return COLT_ERR;
    alloc_label(t, NULL, 0);
    if (so.world > 1 || so.offload) {
        size_t lo = 0, hi = 0;
        optim_shard_range(t->opt, &lo, &hi);
        log_info0("optimizer: zero_stage %d over %d rank(s) (this rank: parameters %zu .. %zu of the flat layout), "
                  "state on the %s",
                  c->zero_stage, so.world, lo, hi, so.offload ? "host (offload_optimizer cpu)" : "device");
    }
    /* zero_stage 2: the gradients of a layer exist only while they are handed over (train_dist.h). */
    alloc_label(t, "the gradients", t->plan.gradients);
    if ((c->zero_stage >= 2 ? model_grads_create_windowed(&t->grads, t->model, err)
                            : model_grads_create(&t->grads, t->model, err)) != 0)
        return COLT_ERR;
    alloc_label(t, NULL, 0);

    int bs = c->per_device_train_batch_size;
    t->max_seq = t->max_prompt_tokens + c->max_completion_length;
    t->max_batch_tokens = bs * t->max_seq;
    /* Activations must fit beside weights, optimizer state and gradients: when
     * they would not, recompute (gradient checkpointing) turns on by itself. */
    t->recompute = c->gradient_checkpointing || t->recompute; /* the plan may have turned it on */
    if (t->be->memory_info) {
        size_t free_bytes, total_bytes;
        t->be->memory_info(t->be, &free_bytes, &total_bytes);
        size_t headroom = MEMORY_PLAN_TRAIN_HEADROOM, avail = free_bytes > headroom ? free_bytes - headroom : 0;
        double gib = 1.0 / (1024.0 * 1024.0 * 1024.0);
        size_t full = train_state_plan_bytes(t->model, bs, t->max_seq, t->max_batch_tokens, false);
        size_t lean = train_state_plan_bytes(t->model, bs, t->max_seq, t->max_batch_tokens, true);
        if (!t->recompute && full > avail && lean <= avail) {
            t->recompute = true;
            log_info0("gradient_checkpointing turned on: activations need %.1f GB without it, %.1f GB are free",
                      full * gib, avail * gib);
        }
        if (lean > avail)
            return errorf(err, "training activations need %.1f GB even with gradient checkpointing but %.1f GB are "
                               "free: lower per_device_train_batch_size or max_completion_length",
                          lean * gib, avail * gib);
    }
    if (ensure_activations(t, err) != 0) return COLT_ERR;
    size_t nt = (size_t)t->max_batch_tokens, bt = (size_t)bs * (size_t)c->max_completion_length;
    t->tok_ids = xmalloc(nt * sizeof(int));
    t->tok_slot = xmalloc(nt * sizeof(int));
    t->tok_pos = xmalloc(nt * sizeof(int));
    t->tok_target = xmalloc(nt * sizeof(int));
    t->tok_logp = xmalloc(nt * sizeof(float));
    t->tok_entropy = xmalloc(nt * sizeof(float));
    t->tok_dlogp = xmalloc(nt * sizeof(float));
    t->mb_logp = xmalloc(bt * sizeof(float));
    t->mb_old = xmalloc(bt * sizeof(float));
    t->mb_ref = xmalloc(bt * sizeof(float));
    t->mb_mask = xmalloc(bt * sizeof(float));
    t->mb_dlogp = xmalloc(bt * sizeof(float));
    t->mb_sampling = xmalloc(bt * sizeof(float));
    t->mb_isw = xmalloc(bt * sizeof(float));
    t->mb_adv = xmalloc((size_t)bs * sizeof(float));

    if (checkpoint_resume_record(&t->resume_record, c, err) != 0) return COLT_ERR;
    if (c->resume_from_checkpoint) {
        if (load_trainer_state(t, c->resume_from_checkpoint, err) != 0) return COLT_ERR;
        t->last_saved_step = t->global_step;
        t->last_checkpoint = xstrdup(c->resume_from_checkpoint);
    }
    checkpoint_keeper_init(&t->keeper, c->output_dir, c->save_total_limit, c->resume_from_checkpoint, t->global_step);
    t->metrics_path = path_join(c->output_dir, "metrics.jsonl");
    if (t->writer) {
        char *completions_path = path_join(c->output_dir, "completions.jsonl");
        int rc = COLT_OK;
        if (c->resume_from_checkpoint) {
            rc = truncate_metrics(t->metrics_path, t->global_step, err);
        } else {
            /* A fresh run starts these two files anew. */
            if (remove(t->metrics_path) != 0 && errno != ENOENT)
                rc = errorf(err, "%s: cannot remove the earlier run's file: %s", t->metrics_path, strerror(errno));
            else if (remove(completions_path) != 0 && errno != ENOENT)
                rc = errorf(err, "%s: cannot remove the earlier run's file: %s", completions_path, strerror(errno));
        }
        free(completions_path);
        if (rc != 0) return COLT_ERR;
        t->metrics_fp = file_open_append(t->metrics_path, err);
        if (!t->metrics_fp) return COLT_ERR;
        if (train_config_reports_to(c, "tensorboard")) {
            char *dir = tensorboard_log_dir(c->output_dir, c->logging_dir);
            rc = tensorboard_open(&t->tb, dir, err);
            free(dir);
            if (rc != 0) return COLT_ERR;
            log_info0("tensorboard: %s", tensorboard_path(t->tb));
        }
    }

    /* The memory plan: every lifetime's buffers are allocated above, once. */
    double gb = 1.0 / (1024.0 * 1024.0 * 1024.0);
    size_t w = model_weight_bytes(t->model) + model_lora_bytes(t->model), o = optim_state_bytes(t->opt),
           gr = model_grads_bytes(t->grads);
    size_t act = train_state_bytes(t->ts), ref = t->ref_model ? model_weight_bytes(t->ref_model) : 0;
    /* the CUDA backend's own scratch (cuBLASLt workspace, staging, attention and sampling partials) */
    size_t scratch = strncmp(t->be->name, "cuda", 4) == 0 ? backend_cuda_reserved_bytes(t->be) : 0;
    log_info0("memory plan (%s): weights %.3f GB, reference model %.3f GB, optimizer state %.3f GB, gradients "
              "%.3f GB, training activations %.3f GB, backend scratch %.3f GB; total %.3f GB, plus the generation "
              "KV cache while generating%s",
              t->be->name, w * gb, ref * gb, o * gb, gr * gb, act * gb, scratch * gb,
              (w + ref + o + gr + act + scratch) * gb, optim_state_host_bytes(t->opt) ? "; in host memory:" : "");
    if (optim_state_host_bytes(t->opt))
        log_info0("memory plan (host): optimizer state and staging %.3f GB", optim_state_host_bytes(t->opt) * gb);
    return COLT_OK;
}

static void trainer_teardown(Trainer *t) {
    rollout_free(&t->ro);
    if (t->metrics_fp) fclose(t->metrics_fp);
    tensorboard_close(t->tb, NULL);
    json_decref(t->resume_record);
    checkpoint_keeper_free(&t->keeper);
    free(t->last_checkpoint);
    free(t->metrics_path);
    for (int k = 0; k < t->n_rewards; k++) reward_free(t->rewards[k]);
    free(t->rewards);
    free(t->reward_weights);
    free(t->epoch_order);
    train_state_free(t->ts);
    model_grads_free(t->grads);
    optim_free(t->opt);
    free(t->tok_ids), free(t->tok_slot), free(t->tok_pos), free(t->tok_target);
    free(t->tok_logp), free(t->tok_entropy), free(t->tok_dlogp);
    free(t->mb_logp), free(t->mb_old), free(t->mb_ref), free(t->mb_mask), free(t->mb_dlogp), free(t->mb_adv);
    free(t->mb_sampling), free(t->mb_isw);
    dataset_free(t->data);
    dataset_free(t->eval_data);
    model_free(t->ref_model);
    model_free(t->model);
    tp_group_close(&t->tp);    /* its groups before the world (dist.all) */
    train_dist_free(&t->dist); /* before its backend: the communicators use the device */
    backend_close(t->be);
    tokenizer_free(t->tok);
}

/* ---------------------------------------------------------------- the loop */

int trainer_run(TrainConfig *c, const LaunchEnv *env, char *err) {
    Trainer t;
    double run_start = time_now();
    if (trainer_setup(&t, c, env, err) != 0) {
        trainer_teardown(&t);
        return COLT_ERR;
    }
    log_info0("colt train: %s on %s, %zu prompts, %lld steps (%d completions per round: %d prompts x %d)",
              c->model, c->dataset, dataset_size(t.data), (long long)t.total_steps, c->generation_batch_size,
              c->generation_batch_size / c->num_generations, c->num_generations);
    log_info0("deterministic mode %s (%s)", t.engine_opts.deterministic ? "on" : "off",
              c->deterministic_set ? "as configured" : "default: on for bf16 weights, off for fp32");
    struct sigaction sa = {0};
    sa.sa_handler = on_stop_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    g_stop_requested = 0;

    int rc = COLT_OK;
    double eval_before = NAN, eval_after = NAN;
    if (t.eval_data && !c->resume_from_checkpoint) {
        rc = evaluate(&t, "before", &eval_before, err);
        if (rc == 0) log_info0("eval before training: mean reward %.4f", eval_before);
        if (rc == 0) rc = log_eval(&t, eval_before, false, err);
    }
    if (c->resume_from_checkpoint) {
        /* Keep the first run's eval_before for the summary. */
        char *p = path_join(c->output_dir, "summary.json"), *text = NULL;
        size_t len = 0;
        json_t *old = file_exists(p) && file_read_all(p, &text, &len, NULL) == 0 ? json_loadb(text, len, 0, NULL) : NULL;
        if (old && json_is_number(json_object_get(old, "eval_reward_before")))
            eval_before = json_number_value(json_object_get(old, "eval_reward_before"));
        json_decref(old);
        free(text);
        free(p);
        log_info0("resumed from %s at step %lld", c->resume_from_checkpoint, (long long)t.global_step);
    }

    const int micro_per_round = c->steps_per_generation * c->num_iterations;
    int64_t start_step = t.global_step;
    const bool live_progress = isatty(STDERR_FILENO);
    double loop_start = time_now();
    json_t *step_start_state = NULL;
    bool interrupted = false;
    while (rc == 0 && t.global_step < t.total_steps) {
        json_decref(step_start_state);
        step_start_state = trainer_state_json(&t);
        double step_start = time_now();
        double gen0 = t.time_generation, score0 = t.time_scoring, lp0 = t.time_logprobs, mem0 = t.time_memory;
        if (t.be->memory_stats) t.be->memory_stats(t.be, NULL, NULL, true); /* this step's peak */
        const bool zero2 = c->zero_stage >= 2;
        model_grads_zero(t.grads);
        if (zero2) train_dist_zero2_begin_step(&t.dist);
        double step_loss = 0;
        for (int a = 0; a < c->gradient_accumulation_steps && rc == 0; a++) {
            if (!t.ro.samples || t.ro.micro_done >= micro_per_round) {
                rc = new_rollout(&t, err);
                if (rc != 0) break;
            }
            double t0 = time_now();
            /* The last backward of the step hands its finished gradients to
             * the all-reduce as it goes (GPU ranks over NCCL). */
            bool overlap = !zero2 && a == c->gradient_accumulation_steps - 1 && train_dist_overlaps(&t.dist);
            if (overlap) model_grads_on_ready(t.grads, train_dist_gradients_ready, &t.dist);
            /* zero_stage 2: every backward hands its gradients over as it goes */
            if (zero2) model_grads_on_ready(t.grads, train_dist_zero2_ready, &t.dist);
            t.micro_in_step = a;
            rc = train_micro_batch(&t, &step_loss, err);
            if (rc == 0 && zero2) rc = train_dist_zero2_finish_backward(&t.dist, err);
            if (overlap || zero2) model_grads_on_ready(t.grads, NULL, NULL);
            t.time_training += time_now() - t0;
        }
        /* The ranks' gradients summed (every rank then holds the same). */
        if (rc == 0) {
            size_t n_grads = 0;
            void *grads = model_grads_flat(t.grads, &n_grads);
            /* Time the exchange, not the backward still running on the GPU: the
             * host would wait for it here anyway. */
            if (t.dist.world > 1 && t.be->synchronize) t.be->synchronize(t.be);
            double s0 = time_now();
            rc = train_dist_agree(&t.dist,
                                  zero2 ? train_dist_zero2_finish_step(&t.dist, err)
                                        : train_dist_sum_gradients(&t.dist, t.be, grads, n_grads, err),
                                  err);
            if (t.dist.world > 1) metrics_add(&t.metrics, "time/gradient_sync", time_now() - s0);
        }
        if (rc != 0) {
            /* Save what the last completed step left (the model and optimizer have
             * not changed since), so no work is lost, then stop with the error. */
            char save_err[ERR_LEN];
            if (t.dist.rank == 0 && !optim_is_sharded(t.opt) && t.tp.tp_size <= 1 &&
                t.global_step > t.last_saved_step && t.global_step > 0 &&
                save_checkpoint(&t, step_start_state, save_err) != 0)
                log_error("could not save a checkpoint after the error: %s", save_err);
            break;
        }
        double t0 = time_now();
        double norm = 0;
        if (zero2) {
            /* The global norm from the ranks' shards; each clips its own. */
            rc = train_dist_agree(&t.dist,
                                  t.tp.tp_size > 1 ? zero2_norm_tp(&t, &norm, err)
                                                   : train_dist_zero2_norm(&t.dist, &norm, err),
                                  err);
            if (rc != 0) break;
            if (c->max_grad_norm > 0 && isfinite(norm) && c->max_grad_norm / (norm + 1e-6) < 1.0) {
                size_t lo = 0, hi = 0;
                optim_shard_range(t.opt, &lo, &hi);
                t.be->scale(t.be, train_dist_zero2_shard(&t.dist), (float)(c->max_grad_norm / (norm + 1e-6)), hi - lo);
            }
        } else if (t.tp.tp_size > 1) {
            /* every part's gradients: the norm over the group, each rank clips its part */
            double sq = 0;
            rc = train_dist_agree(&t.dist, model_grads_sum_squares(t.model, t.grads, &sq, err), err);
            if (rc != 0) break;
            norm = sqrt(sq);
            size_t n_grads = 0;
            void *grads = model_grads_flat(t.grads, &n_grads);
            if (c->max_grad_norm > 0 && isfinite(norm) && c->max_grad_norm / (norm + 1e-6) < 1.0)
                t.be->scale(t.be, grads, (float)(c->max_grad_norm / (norm + 1e-6)), n_grads);
        } else norm = optim_clip_grad_norm(t.model, t.grads, c->max_grad_norm, t.be);
        float lr = lr_schedule_value(t.scheduler, (float)c->learning_rate, (int)t.global_step, (int)t.total_steps,
                                     t.warmup_steps);
        if (!isfinite(step_loss) || !isfinite(norm)) {
            /* Diverged: stop before the update, and save nothing (a checkpoint of
             * this state would replace a good one). */
            char last[512];
            last_checkpoint_text(&t, last, sizeof last);
            rc = errorf(err, "step %lld: the loss is %g and the gradient norm %g: training diverged (learning_rate "
                             "%g); stopped without saving, %s",
                        (long long)t.global_step + 1, step_loss, norm, c->learning_rate, last);
            break;
        }
        double o0 = time_now();
        if (zero2) optim_step_shard(t.opt, train_dist_zero2_shard(&t.dist), lr);
        else optim_step(t.opt, t.grads, lr);
        if (model_params_partitioned(t.model)) model_params_changed(t.model); /* zero_stage 3: gathered per use */
        else if (optim_is_sharded(t.opt)) {
            /* Each rank updated its shard of the weights: exchange them. */
            size_t n_weights = 0;
            void *weights = model_params_flat(t.model, &n_weights);
            rc = train_dist_agree(&t.dist,
                                  train_dist_gather_shards(&t.dist, t.be, weights, n_weights, err),
                                  err);
            if (rc != 0) break;
        }
        if (t.be->synchronize) t.be->synchronize(t.be);
        metrics_add(&t.metrics, "time/optimizer", time_now() - o0);
        if (strcmp(c->offload_optimizer, "cpu") == 0)
            metrics_add(&t.metrics, "time/optimizer_host_adamw", optim_last_host_seconds(t.opt));
        t.global_step++;
        /* Unsharded ranks hold whole states that must agree; sharded ones hold
         * different shards, and every rank's weights come from the same gather. */
        if (t.dist.world > 1 && !optim_is_sharded(t.opt)) {
            /* Every rank applied the same sum of gradients: the weights must
             * be the same bits everywhere. Two passes over the state, cheap
             * beside a step; a rank that drifted stops the job here. */
            double fingerprint[2];
            optim_fingerprint(t.opt, fingerprint);
            rc = train_dist_agree(&t.dist,
                                  train_dist_check_same(&t.dist, fingerprint, 2, "weights and first moments", err), err);
            if (rc != 0) {
                error_prefix(err, "after step %lld", (long long)t.global_step);
                break;
            }
        }
        double now = time_now();
        t.time_training += now - t0;
        metrics_add(&t.metrics, "loss", step_loss);
        metrics_set(&t.metrics, "grad_norm", norm);
        metrics_set(&t.metrics, "learning_rate",
                    lr_schedule_value(t.scheduler, (float)c->learning_rate, (int)t.global_step, (int)t.total_steps,
                                      t.warmup_steps));
        metrics_add(&t.metrics, "step_time", now - step_start);
        metrics_add(&t.metrics, "time/generation", t.time_generation - gen0);
        metrics_add(&t.metrics, "time/scoring", t.time_scoring - score0);
        metrics_add(&t.metrics, "time/logprobs", t.time_logprobs - lp0);
        metrics_add(&t.metrics, "time/activation_memory", t.time_memory - mem0);
        if (t.be->memory_stats) {
            /* colt's own buffers (weights, state, activations, KV pool): what the plan sizes */
            size_t in_use = 0, peak = 0;
            t.be->memory_stats(t.be, &in_use, &peak, false);
            metrics_set(&t.metrics, "memory/allocated_gb", in_use / (1024.0 * 1024.0 * 1024.0));
            metrics_set(&t.metrics, "memory/allocated_peak_gb", peak / (1024.0 * 1024.0 * 1024.0));
        }
        metrics_add(&t.metrics, "time/training", (now - step_start) - (t.time_generation - gen0) -
                                                     (t.time_scoring - score0) - (t.time_logprobs - lp0));

        bool last = t.global_step == t.total_steps;
        bool logging = t.global_step % c->logging_steps == 0 || last;
        if (live_progress && !logging) {
            /* The live line between logging steps, overwritten in place. */
            double per_step = (now - loop_start) / (double)(t.global_step - start_step);
            char eta[32];
            format_duration(eta, sizeof eta, per_step * (double)(t.total_steps - t.global_step));
            fprintf(stderr, "\r\033[Kstep %lld/%lld | loss %.5f | %.2f s/step | ETA %s", (long long)t.global_step,
                    (long long)t.total_steps, step_loss, per_step, eta);
            fflush(stderr);
        }
        if (logging) {
            if (live_progress) fputs("\r\033[K", stderr);
            if (t.writer) rc = log_step(&t, now - loop_start, t.global_step - start_step, err);
            else json_decref(metrics_flush(&t.metrics)); /* rank 0 logs the world's metrics */
            rc = train_dist_agree(&t.dist, rc, err);
            if (rc != 0) break;
        }
        if (c->eval_steps > 0 && t.eval_data && t.global_step % c->eval_steps == 0 && !last) {
            double r = NAN;
            rc = evaluate(&t, "latest", &r, err);
            if (rc == 0) log_info0("eval at step %lld: mean reward %.4f", (long long)t.global_step, r);
            if (rc == 0) rc = log_eval(&t, r, true, err);
        }
        bool stop = train_dist_any(&t.dist, g_stop_requested); /* a signal to any rank stops them all */
        if (rc == 0 && ((c->save_steps > 0 && t.global_step % c->save_steps == 0) || stop)) {
            json_t *state = trainer_state_json(&t);
            rc = save_checkpoint(&t, state, err); /* rank 0, or every rank when sharded */
            json_decref(state);
            rc = train_dist_agree(&t.dist, rc, err);
        }
        if (stop) {
            log_info0("stopped by signal at step %lld; resume with --resume_from_checkpoint %s/checkpoint-%lld",
                      (long long)t.global_step, c->output_dir, (long long)t.global_step);
            interrupted = true;
            break;
        }
    }
    json_decref(step_start_state);

    if (rc == 0 && !interrupted) {
        if (t.eval_data) {
            rc = evaluate(&t, "after", &eval_after, err);
            if (rc == 0) log_info0("eval after training: mean reward %.4f (before %.4f)", eval_after, eval_before);
            if (rc == 0) rc = log_eval(&t, eval_after, false, err);
        }
        bool finite = optim_is_sharded(t.opt) || t.dist.rank == 0 ? optim_state_finite(t.opt) : true;
        if (optim_is_sharded(t.opt) || t.tp.tp_size > 1) finite = !train_dist_any(&t.dist, !finite);
        if (rc == 0 && t.dist.rank == 0 && !finite) {
            char last[512];
            last_checkpoint_text(&t, last, sizeof last);
            rc = errorf(err, "the weights or optimizer moments hold NaN or Inf after step %lld (training diverged; "
                             "learning_rate %g): the final model is not saved, %s",
                        (long long)t.global_step, c->learning_rate, last);
        }
        if (rc == 0 && model_params_partitioned(t.model)) { /* zero_stage 3: rank 0 saves the whole weights */
            release_activations(&t);
            rc = weights_gather(&t, err);
        }
        /* tensor parallel: the first group's ranks gather the weights for rank 0 */
        if (rc == 0 && t.dist.rank == 0 &&
            (save_trained(&t, c->output_dir, err) != 0 ||
             (t.writer && tokenizer_copy_files(c->model, c->output_dir, err) != 0)))
            rc = COLT_ERR;
        weights_release(&t);
        if (rc == 0 && t.dist.rank == 0 && c->merge_lora) rc = save_merged(&t, err); /* the first group's ranks */
        if (rc == 0 && t.writer) {
            ReportSummary s = {.eval_reward_before = eval_before, .eval_reward_after = eval_after,
                               .steps = t.global_step, .seconds = time_now() - run_start};
            rc = report_write(c->output_dir, &s, train_config_to_json(c), err);
        }
        rc = train_dist_agree(&t.dist, rc, err);
        if (rc == 0) log_info0("done: %lld steps in %.1f s; model, metrics.jsonl, summary.json and reward_curve.svg in %s",
                               (long long)t.global_step, time_now() - run_start, c->output_dir);
    }
    /* After an error the ranks may not have issued the same collectives. */
    if (rc != 0) train_dist_cancel_gradients(&t.dist);
    trainer_teardown(&t);
    return rc;
}
