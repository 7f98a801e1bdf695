/* trainer_rollout.c — one GRPO round (trainer_internal.h): this rank's share of the
 * completions generated with the live weights (colocated) or by the server,
 * shared with every rank, scored, turned into group advantages, with old and
 * reference log-probs when the loss needs them, then shuffled into
 * micro-batches. Not the rollout's file format (rollout.c) nor the loss
 * (trainer_micro_batch.c). */
#include "train/trainer_internal.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fileio.h"
#include "core/rng.h"
#include "data/prompt.h"
#include "model/lora.h"
#include "core/error.h"
#include "core/log.h"

/* Prompt ids of dataset row i, as colt eval encodes them too (prompt.h). */
int trainer_prompt_ids(Trainer *t, Dataset *d, size_t row, int **ids, int *n, char **text, char *err) {
    return prompt_encode_row_tools(ids, n, text, d, row, t->tok, t->cfg->chat_template_kwargs,
                                   trainer_row_tool_schemas(t, dataset_row(d, row)), t->cfg->max_prompt_length,
                                   t->cfg->dataset, err);
}

/* A reward model runs on the trainer's backend, beside the policy, cut across
 * the policy's tensor-parallel group (whose ranks score the same completions:
 * dist is the data-parallel group) and, under ZeRO-3, partitioned across the
 * data-parallel ranks like the policy (trainer_score_completions then calls
 * every reward on every rank). */
int trainer_create_reward(Trainer *t, RewardFunc **out, json_t *spec, char *err) {
    WeightPartition zero3;
    RewardContext ctx = {.be = t->be, .prompt_column = t->cfg->dataset_prompt_column,
                         .chat_template_kwargs = t->cfg->chat_template_kwargs,
                         .tp = mesh_tensor_parallel(&t->mesh, &t->tp_hooks),
                         .zero3 = dist_optimizer_forward_partition(&t->optimizer, &zero3) ? &zero3 : NULL};
    return reward_create_ctx(out, spec, &ctx, err);
}

/* A Python reward with environments: run in the tool worker beside the
 * instances, as TRL calls every reward function with environments=[...]
 * (completion j's environment is environment j). */
static int python_reward_with_environments(Trainer *t, RewardFunc *r, float *values, const char *const *prompts,
                                           const char *const *completions, json_t *const *messages,
                                           const int *const *ids, const int *id_lens, json_t *const *rows, int n,
                                           char *err) {
    double timeout_s = 0;
    char *function = reward_python_function(r, &timeout_s);
    json_t *kwargs = NULL;
    if (reward_python_kwargs(&kwargs, r, prompts, completions, messages, ids, id_lens, rows, n, err) != 0) {
        free(function);
        return COLT_ERR;
    }
    double *got = xmalloc(sizeof(double) * (size_t)n);
    bool *has = xmalloc(sizeof(bool) * (size_t)n);
    long *envs = xmalloc(sizeof(long) * (size_t)n);
    for (int j = 0; j < n; j++) envs[j] = trainer_environment_instance(t, j);
    int rc = trainer_tool_reward_function(t, got, has, n, function, kwargs, envs, timeout_s, err);
    for (int j = 0; j < n && rc == 0; j++)
        rc = has[j] ? reward_store_value(r, values, j, got[j], err) : (values[j] = NAN, COLT_OK);
    json_decref(kwargs);
    free(function), free(got), free(has), free(envs);
    return rc;
}

/* Rewards of n completions: per_func[i, k] from each function (NaN = none).
 * environments: completion j's environment is the tool worker's environment
 * j (reset for it): the environment's get_reward is the last function, and
 * Python rewards get environments=[...]. */
int trainer_score_completions(Trainer *t, float *per_func, Dataset *d, const size_t *rows_of_sample,
                             const char *const *prompts, const char *const *completions, json_t *const *messages,
                             const int *const *ids, const int *id_lens, int n, bool environments, char *err) {
    json_t **rows = xmalloc(sizeof(json_t *) * (size_t)n);
    float *values = xmalloc(sizeof(float) * (size_t)n);
    for (int i = 0; i < n; i++) rows[i] = dataset_row(d, rows_of_sample[i]);
    int rc = COLT_OK;
    /* Every reward is called on every rank, also with nothing to score or after
     * a failure (then with none): a reward model's scoring under ZeRO-3 gathers
     * its weights from every data-parallel rank. The environments' rewards and
     * Python rewards given environments are this rank's alone. */
    for (int k = 0; k < t->n_rewards; k++) {
        RewardFunc *r = t->rewards[k];
        char reward_err[ERR_LEN];
        double timeout_s;
        char *python = r && environments ? reward_python_function(r, &timeout_s) : NULL;
        int m = rc == 0 ? n : 0, krc = COLT_OK;
        if (!r) krc = m > 0 ? trainer_environment_rewards(t, values, m, t->reward_environment[k], reward_err) : COLT_OK;
        else if (python)
            krc = m > 0 ? python_reward_with_environments(t, r, values, prompts, completions, messages, ids, id_lens,
                                                          rows, m, reward_err)
                        : COLT_OK;
        else krc = reward_compute_messages(r, values, prompts, completions, messages, ids, id_lens, rows, m, reward_err);
        free(python);
        if (krc != 0 && rc == 0) {
            char prefix[128];
            snprintf(prefix, sizeof prefix, "reward '%s'", trainer_reward_name(t, k));
            snprintf(err, ERR_LEN, "%s", reward_err);
            rc = strncmp(err, prefix, strlen(prefix)) == 0 ? COLT_ERR : error_prefix(err, "%s", prefix);
        }
        for (int i = 0; i < n && rc == 0; i++) per_func[(size_t)i * t->n_rewards + k] = values[i];
    }
    free(values);
    free(rows);
    return rc;
}

/* Packs samples[idx[0..B)] into the token arrays; returns the token count. */
int trainer_pack_batch(Trainer *t, Rollout *r, const int *idx, int B) {
    int n = 0;
    for (int b = 0; b < B; b++) {
        Sample *s = &r->samples[idx[b]];
        int plen = r->prompt_len[s->prompt];
        const int *p = r->prompt_ids[s->prompt];
        /* prompt + completion[:-1]: position plen-1+j predicts completion[j]. */
        int total = plen + s->len - 1;
        for (int k = 0; k < total; k++) {
            t->buf.tok_ids[n] = k < plen ? p[k] : s->completion[k - plen];
            t->buf.tok_slot[n] = b;
            t->buf.tok_pos[n] = k;
            t->buf.tok_target[n] = k >= plen - 1 ? s->completion[k - plen + 1] : -1;
            n++;
        }
    }
    return n;
}

/* beta > 0: reference log-probs enter the loss. */
bool trainer_has_reference(const Trainer *t) { return t->ref_model || t->ref_is_base; }

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
        int n = trainer_pack_batch(t, r, idx, B);
        if (trainer_ensure_activations(t, err) != 0 ||
            model_train_forward(m, t->ts, t->buf.tok_ids, t->buf.tok_slot, t->buf.tok_pos, t->buf.tok_target, n,
                                (float)t->cfg->temperature, t->buf.tok_logp, NULL, err) != 0) {
            rc = COLT_ERR;
            break;
        }
        int k = 0;
        for (int b = 0; b < B; b++) {
            Sample *s = &r->samples[start + b];
            int plen = r->prompt_len[s->prompt];
            float *lp = xmalloc(sizeof(float) * (size_t)s->len);
            for (int j = 0; j < s->len; j++) lp[j] = t->buf.tok_logp[k + plen - 1 + j];
            k += plen + s->len - 1;
            out[start + b - lo] = lp;
        }
    }
    free(idx);
    return rc;
}

/* This rank's share of a round's N samples: [lo, hi). N is a multiple of the
 * world's micro-batch, so every rank gets the same count. */
void trainer_local_range(const Trainer *t, int N, int *lo, int *hi) {
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

double trainer_nanmean(const float *x, int n, int stride) {
    double s = 0;
    int c = 0;
    for (int i = 0; i < n; i++)
        if (!isnan(x[(size_t)i * stride])) s += x[(size_t)i * stride], c++;
    return c ? s / c : NAN;
}

/* torch's unbiased std over the non-NaN values (TRL's nanstd). */
static double nanstd(const float *x, int n, int stride) {
    double mean = trainer_nanmean(x, n, stride), s = 0;
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
            if (t->cfg->shuffle_dataset) dataset_epoch_order(t->epoch_order, n, t->cfg->seed, t->epoch);
            else for (size_t r = 0; r < n; r++) t->epoch_order[r] = r; /* shuffle_dataset false: file order, as TRL */
        }
        rows[i] = t->epoch_order[t->epoch_pos++ % n];
    }
}

/* The engine's memory per round (colt's names; TRL has none for these). */
static void log_engine_stats(Trainer *t, const EngineStats *es) {
    const double gb = 1.0 / (1024.0 * 1024.0 * 1024.0);
    metrics_add(&t->metrics, "engine/kv_pool_gb", es->pool_bytes * gb);
    metrics_add(&t->metrics, "engine/sequences_held", es->peak_running);
    metrics_add(&t->metrics, "engine/kv_blocks_used", es->peak_blocks_used);
    metrics_add(&t->metrics, "engine/preemptions", es->preemptions);
    metrics_add(&t->metrics, "engine/graphs_captured", es->graphs_captured);
    /* vLLM's prefix cache hit rate: prompt tokens found in the cache over those looked up */
    int64_t looked_up = es->shared_tokens + es->prefill_tokens;
    metrics_add(&t->metrics, "engine/prefix_cache_hit_rate", looked_up ? (double)es->shared_tokens / looked_up : 0.0);
    metrics_add(&t->metrics, "engine/activations_released", t->ts == NULL);
    /* where the decode steps' time goes: waiting for the device, and the rest, the host's own work */
    metrics_add(&t->metrics, "time/generation_decode", es->decode_seconds);
    metrics_add(&t->metrics, "time/generation_decode_wait", es->decode_wait_seconds);
    if (t->be->memory_info) {
        size_t free_bytes, total_bytes;
        t->be->memory_info(t->be, &free_bytes, &total_bytes);
        metrics_add(&t->metrics, "engine/peak_memory_gb", (total_bytes - es->device_free_min) * gb);
    }
}

/* A round's prompts: the next P rows in epoch order, encoded. */
int trainer_choose_prompts(Trainer *t, Rollout *r, char *err) {
    const int P = t->cfg->generation_batch_size / t->cfg->num_generations;
    r->n_prompts = P;
    r->rows = xcalloc((size_t)P, sizeof(size_t));
    r->prompt_ids = xcalloc((size_t)P, sizeof(int *));
    r->prompt_len = xcalloc((size_t)P, sizeof(int));
    r->prompt_text = xcalloc((size_t)P, sizeof(char *));
    next_prompt_rows(t, r->rows, P);
    for (int p = 0; p < P; p++)
        if (trainer_prompt_ids(t, t->data, r->rows[p], &r->prompt_ids[p], &r->prompt_len[p], &r->prompt_text[p],
                               err) != 0)
            return COLT_ERR;
    return COLT_OK;
}

/* Each sample's own prompt (environments, rollout_func), shared with every
 * rank (rows of [length, ids], then the texts padded to the longest): ids[j],
 * lens[j], texts[j] are this rank's samples [lo, hi) (the caller frees them),
 * rc their outcome on this rank, agreed on first. r's prompts become one per
 * sample, rows[i] the dataset row of sample i's group. */
int trainer_share_sample_prompts(Trainer *t, Rollout *r, int lo, int hi, int **ids, const int *lens, char **texts,
                                 int rc, char *err) {
    const int G = t->cfg->num_generations, N = t->cfg->generation_batch_size, n_local = hi - lo;
    const size_t W = 1 + (size_t)t->max_prompt_tokens;
    rc = train_dist_agree(&t->dist, rc, err);
    int *send = xcalloc((size_t)n_local * W + 1, sizeof(int)), *all = xcalloc((size_t)N * W, sizeof(int));
    int *send_len = xcalloc((size_t)n_local + 1, sizeof(int)), *all_len = xcalloc((size_t)N, sizeof(int));
    for (int j = 0; rc == 0 && j < n_local; j++) {
        send[(size_t)j * W] = lens[j];
        memcpy(send + (size_t)j * W + 1, ids[j], sizeof(int) * (size_t)lens[j]);
        send_len[j] = (int)strlen(texts[j]);
    }
    if (rc == 0) rc = train_dist_gather(&t->dist, all, send, sizeof(int) * (size_t)n_local * W, err);
    if (rc == 0) rc = train_dist_gather(&t->dist, all_len, send_len, sizeof(int) * (size_t)n_local, err);
    size_t M = 1;
    for (int i = 0; rc == 0 && i < N; i++)
        if ((size_t)all_len[i] + 1 > M) M = (size_t)all_len[i] + 1;
    char *send_text = xcalloc((size_t)n_local * M + 1, 1), *all_text = xcalloc((size_t)N * M, 1);
    for (int j = 0; rc == 0 && j < n_local; j++) memcpy(send_text + (size_t)j * M, texts[j], (size_t)send_len[j]);
    if (rc == 0) rc = train_dist_gather(&t->dist, all_text, send_text, (size_t)n_local * M, err);
    if (rc == 0) {
        size_t *rows = xcalloc((size_t)N, sizeof(size_t));
        for (int i = 0; i < N; i++) rows[i] = r->rows[i / G];
        for (int p = 0; p < r->n_prompts; p++) free(r->prompt_ids[p]), free(r->prompt_text[p]);
        free(r->rows), free(r->prompt_ids), free(r->prompt_len), free(r->prompt_text);
        r->rows = rows;
        r->n_prompts = N;
        r->prompt_per_sample = true;
        r->prompt_ids = xcalloc((size_t)N, sizeof(int *));
        r->prompt_len = xcalloc((size_t)N, sizeof(int));
        r->prompt_text = xcalloc((size_t)N, sizeof(char *));
        for (int i = 0; i < N; i++) {
            r->prompt_len[i] = all[(size_t)i * W];
            r->prompt_ids[i] = xmalloc(sizeof(int) * (size_t)r->prompt_len[i]);
            memcpy(r->prompt_ids[i], all + (size_t)i * W + 1, sizeof(int) * (size_t)r->prompt_len[i]);
            r->prompt_text[i] = xstrdup(all_text + (size_t)i * M);
        }
    }
    free(send), free(all), free(send_len), free(all_len), free(send_text), free(all_text);
    return rc;
}

/* environment_factory: each sample's own prompt, TRL's prompt with its
 * environment's observation (trainer_environment_prompts, for this rank's
 * share), shared with every rank. */
int trainer_per_sample_prompts(Trainer *t, Rollout *r, int lo, int hi, char *err) {
    const int G = t->cfg->num_generations, n_local = hi - lo;
    size_t *rows_of = xcalloc((size_t)n_local + 1, sizeof(size_t));
    int **ids = xcalloc((size_t)n_local + 1, sizeof(int *)), *lens = xcalloc((size_t)n_local + 1, sizeof(int));
    char **texts = xcalloc((size_t)n_local + 1, sizeof(char *));
    for (int j = 0; j < n_local; j++) rows_of[j] = r->rows[(lo + j) / G];
    int rc = trainer_environment_prompts(t, t->data, t->cfg->dataset, rows_of, n_local, ids, lens, texts, err);
    rc = trainer_share_sample_prompts(t, r, lo, hi, ids, lens, texts, rc, err);
    for (int j = 0; j < n_local; j++) free(ids[j]), free(texts[j]);
    free(rows_of), free(ids), free(lens), free(texts);
    return rc;
}

/* This rank's sequences of round `round` (prompts from r). Sample i draws
 * from RNG stream round * N + i whatever rank (or server) makes it, so the
 * completions depend neither on the world size nor on where they are made. */
GenSequence *trainer_local_sequences(const Trainer *t, const Rollout *r, int64_t round, int lo, int hi) {
    const int G = t->cfg->num_generations, N = t->cfg->generation_batch_size;
    GenSequence *seqs = xcalloc((size_t)(hi - lo > 0 ? hi - lo : 1), sizeof(GenSequence));
    for (int j = 0; j < hi - lo; j++) {
        int i = lo + j;
        int p = rollout_prompt_index(r->prompt_per_sample, i, G);
        seqs[j].prompt = r->prompt_ids[p];
        seqs[j].prompt_len = r->prompt_len[p];
        seqs[j].stream = ((uint64_t)round * (uint64_t)N + (uint64_t)i) % STREAM_EVAL_BASE;
    }
    return seqs;
}

GenerateOptions trainer_generate_options(const Trainer *t) {
    return (GenerateOptions){.sampling = t->sampling, .max_new_tokens = t->cfg->max_completion_length,
                             .stop_ids = t->stop_ids, .n_stop_ids = t->n_stop, .regex = t->regex,
                             .policy_logprobs = true};
}

/* A round in which some completions got no usable reward (every function gave
 * NaN/None) trains nothing on them, and one in which none did trains nothing
 * at all: warn each such round, naming the functions, as TRL warns; stop after
 * max_rounds_without_reward such whole rounds in a row. Every rank holds every
 * reward, so every rank decides alike. */
static int check_usable_rewards(Trainer *t, const float *rewards, int n, char *err) {
    int unscored = 0;
    for (int i = 0; i < n; i++) unscored += isnan(rewards[i]);
    t->rounds_without_reward = unscored == n ? t->rounds_without_reward + 1 : 0;
    if (unscored == 0) return COLT_OK;
    char names[400] = "";
    size_t len = 0;
    for (int k = 0; k < t->n_rewards && len < sizeof names; k++) {
        int none = 0;
        for (int i = 0; i < n; i++) none += isnan(t->ro.per_func[(size_t)i * t->n_rewards + k]);
        len += (size_t)snprintf(names + len, sizeof names - len, "%s'%s' gave none for %d", k ? ", " : "",
                                trainer_reward_name(t, k), none);
    }
    const int limit = t->cfg->max_rounds_without_reward;
    if (unscored == n && limit > 0 && t->rounds_without_reward >= limit)
        return errorf(err, "step %lld: no completion got a usable reward in %d rounds in a row (%s of %d; every reward "
                           "function gave NaN/None), so training changes nothing: fix the reward functions "
                           "(max_rounds_without_reward: %d)",
                      (long long)t->global_step + 1, t->rounds_without_reward, names, n, limit);
    log_info0("warning: step %lld: %d of %d completions got no usable reward (%s of %d; every reward function gave "
              "NaN/None) and add nothing to the loss",
              (long long)t->global_step + 1, unscored, n, names, n);
    return COLT_OK;
}

/* This rank's share of the round's completions, made with the live weights:
 * colocated, in the memory the training activations give back (they are
 * re-created for the next forward); in server mode by the server, which holds
 * the weights of the last push; with async_generation the round asked for
 * while the last one trained. Sets the round's prompts in r; *seqs_out gets
 * the [hi - lo] sequences (also on error, for the caller to free). */
static int generate_share(Trainer *t, Rollout *r, GenSequence **seqs_out, int lo, int hi, char *err) {
    const TrainConfig *c = t->cfg;
    const int n_local = hi - lo;
    GenSequence *seqs = NULL;
    int64_t weights_step = t->global_step; /* of the weights that generate this round */
    int rc = COLT_OK;
    if (t->rollout_func) return trainer_rollout_func_generate(t, r, seqs_out, lo, hi, err);
    bool from_pending = t->next.active;
    if (from_pending) {
        trainer_pending_join(t);
        PendingRound *p = &t->next;
        *r = p->ro;
        memset(&p->ro, 0, sizeof p->ro);
        seqs = p->seqs;
        p->seqs = NULL;
        p->active = false;
        weights_step = p->weights_step;
        if (p->worker) { /* tools: its conversations and worker become the round's, scored with them */
            trainer_agent_share_free(t);
            t->agent = p->agent;
            memset(&p->agent, 0, sizeof p->agent);
            t->async_tool_worker = t->tool_worker;
            t->tool_worker = p->worker;
            p->worker = NULL;
        }
        /* the server's time on the round, most of it hidden behind the last round's training */
        metrics_add(&t->metrics, "time/server_generation", p->seconds);
        rc = p->rc;
        if (rc != 0) errorf(err, "%s", p->err);
    } else {
        if (trainer_choose_prompts(t, r, err) != 0) return COLT_ERR;
        if (t->cfg->environment_factory && trainer_per_sample_prompts(t, r, lo, hi, err) != 0) return COLT_ERR;
        seqs = trainer_local_sequences(t, r, t->round, lo, hi);
    }
    *seqs_out = seqs;
    GenerateOptions go = trainer_generate_options(t);
    if (t->server && !from_pending) {
        weights_step = t->server_weights_step;
        if (t->tool_worker) /* multi-turn: the trainer runs the tools, the server each turn */
            rc = trainer_agent_round(t, seqs, n_local, &go, NULL, err);
        else if (n_local > 0)
            rc = serve_client_generate(t->server, seqs, n_local, &go, model_config(t->model)->vocab_size, NULL, err);
    }
    /* async_generation: the next round is asked for now, so the server
     * generates it while this one is scored and trained. */
    const int64_t micro_per_round = (int64_t)c->steps_per_generation * c->num_iterations;
    if (rc == 0 && c->async_generation &&
        (t->round + 1) * micro_per_round < t->total_steps * c->gradient_accumulation_steps)
        rc = trainer_pending_launch(t, err);
    if (!t->server) {
        trainer_make_room_for_round(t, n_local);
        EngineStats es;
        rc = trainer_weights_gather(t, err);
        trainer_alloc_label(t, "the generation engine's scratch and KV pool", t->plan.engine_scratch + t->plan.kv_min);
        double e0 = time_now();
        if (rc == 0)
            rc = t->tool_worker ? trainer_agent_round(t, seqs, n_local, &go, &es, err)
                                : trainer_round_generate(t, seqs, n_local, &go, &es, err);
        t->times.engine += time_now() - e0;
        trainer_alloc_label(t, NULL, 0);
        trainer_weights_release(t);
        if (rc == 0) log_engine_stats(t, &es);
    }
    /* optimizer steps between the weights that generated this round and those it trains first */
    if (t->server) metrics_add(&t->metrics, "staleness", (double)(t->global_step - weights_step));
    return rc;
}

/* Every rank gets every completion: ids, lengths, stop flags, text and the
 * engine's log-probs, from each rank's seqs[hi - lo] (freed here); with tools
 * also each completion's model mask and tool-call counts. rc: the
 * generation's outcome on this rank, agreed on first. A row holds
 * [len, terminated, ids[L]] and with tools [mask[L], calls, failures] after. */
static int share_completions(Trainer *t, Rollout *r, GenSequence *seqs, int lo, int hi, int rc, char *err) {
    const int G = t->cfg->num_generations, N = r->n_samples, L = t->cfg->max_completion_length, n_local = hi - lo;
    const bool tools = t->tool_worker != NULL || t->rollout_func != NULL; /* rollout_func: env_mask */
    const size_t W = (size_t)(L + 2) + (tools ? (size_t)(L + 2) : 0);
    int *send = xcalloc((size_t)n_local * W, sizeof(int)), *all = xcalloc((size_t)N * W, sizeof(int));
    float **sampling = xcalloc((size_t)n_local, sizeof(float *));
    for (int j = 0; rc == 0 && j < n_local; j++) {
        int *row = send + (size_t)j * W;
        row[0] = seqs[j].n_tokens;
        row[1] = seqs[j].finish == FINISH_STOP;
        memcpy(row + 2, seqs[j].tokens, sizeof(int) * (size_t)seqs[j].n_tokens);
        if (tools) {
            for (int k = 0; k < seqs[j].n_tokens; k++) row[2 + L + k] = t->agent.masks[j][k];
            row[2 + 2 * L] = t->agent.calls[j];
            row[3 + 2 * L] = t->agent.failures[j];
        }
        sampling[j] = seqs[j].logprobs;
        seqs[j].logprobs = NULL;
    }
    for (int j = 0; j < n_local; j++) gen_sequence_free(&seqs[j]);
    free(seqs);
    double x0 = time_now();
    rc = train_dist_agree(&t->dist, rc, err);
    if (rc == 0) rc = train_dist_gather(&t->dist, all, send, sizeof(int) * (size_t)n_local * W, err);
    t->times.exchange += time_now() - x0;
    for (int i = 0; rc == 0 && i < N; i++) {
        const int *row = all + (size_t)i * W;
        Sample *s = &r->samples[i];
        s->prompt = rollout_prompt_index(r->prompt_per_sample, i, G);
        s->len = row[0];
        s->terminated = row[1];
        s->completion = xmalloc(sizeof(int) * (size_t)(s->len > 0 ? s->len : 1));
        memcpy(s->completion, row + 2, sizeof(int) * (size_t)s->len);
        if (tools) {
            s->model_mask = xmalloc((size_t)(s->len > 0 ? s->len : 1));
            for (int k = 0; k < s->len; k++) s->model_mask[k] = (uint8_t)row[2 + L + k];
            s->tool_calls = row[2 + 2 * L];
            s->tool_failures = row[3 + 2 * L];
        }
        int n_text = s->len - (s->terminated ? 1 : 0);
        rc = tokenizer_decode_generated(t->tok, s->completion, (size_t)n_text, true, &s->text, err);
    }
    x0 = time_now();
    if (rc == 0) rc = gather_token_values(t, r, sampling, lo, hi, offsetof(Sample, sampling_logp), err);
    t->times.exchange += time_now() - x0;
    for (int j = 0; j < n_local; j++) free(sampling[j]);
    free(sampling);
    free(send);
    free(all);
    return rc;
}

/* Each rank scores its own share (a reward program runs once per completion),
 * then every rank gets every reward (r->per_func). */
static int score_share(Trainer *t, Rollout *r, int lo, int hi, char *err) {
    const int G = t->cfg->num_generations, n_local = hi - lo;
    const char **prompts = xmalloc(sizeof(char *) * (size_t)n_local);
    const char **completions = xmalloc(sizeof(char *) * (size_t)n_local);
    size_t *rows = xmalloc(sizeof(size_t) * (size_t)n_local);
    float *mine = xcalloc((size_t)n_local * (size_t)t->n_rewards + 1, sizeof(float));
    const int **ids = xmalloc(sizeof(int *) * (size_t)n_local);
    int *id_lens = xmalloc(sizeof(int) * (size_t)n_local);
    /* with environments each sample's row is its own (its prompt with the observation), with rollout_func
     * too (the dataset row with the function's extra fields) */
    const bool own_rows = t->agent.rows != NULL, environments = own_rows && t->cfg->environment_factory;
    for (int j = 0; j < n_local; j++) {
        const int p = rollout_prompt_index(r->prompt_per_sample, lo + j, G);
        prompts[j] = r->prompt_text[p];
        completions[j] = r->samples[lo + j].text;
        rows[j] = own_rows ? (size_t)j : r->rows[p];
        ids[j] = r->samples[lo + j].completion;
        id_lens[j] = r->samples[lo + j].len;
    }
    json_t *const *messages = t->agent.n == n_local && n_local > 0 ? t->agent.messages : NULL;
    int rc = trainer_score_completions(t, mine, own_rows ? t->agent.rows : t->data, rows, prompts, completions,
                                       messages, ids, id_lens, n_local, environments, err);
    rc = train_dist_agree(&t->dist, rc, err);
    if (rc == 0)
        rc = train_dist_gather(&t->dist, r->per_func, mine, sizeof(float) * (size_t)n_local * (size_t)t->n_rewards, err);
    free(prompts);
    free(completions);
    free(rows);
    free(mine);
    free(ids);
    free(id_lens);
    return rc;
}

/* The weighted rewards and the group advantages of every sample, and the
 * round's reward metrics (TRL's names). */
static int compute_advantages(Trainer *t, Rollout *r, char *err) {
    const TrainConfig *c = t->cfg;
    const int G = c->num_generations, N = r->n_samples, P = N / G; /* groups */
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
    if (check_usable_rewards(t, rewards, N, err) != 0) {
        free(rewards), free(adv), free(group_std);
        return COLT_ERR;
    }
    GrpoScaleRewards scale;
    GrpoAggregation aggregation;
    COLT_ASSERT(grpo_scale_rewards_parse(&scale, c->scale_rewards, err) == 0);
    COLT_ASSERT(grpo_aggregation_parse(&aggregation, c->multi_objective_aggregation, err) == 0);
    if (aggregation == AGGREGATE_NORMALIZE_THEN_SUM) {
        float batch_std;
        grpo_advantages_normalize_then_sum(adv, &batch_std, r->per_func, t->reward_weights, N, t->n_rewards, G);
        for (int p = 0; p < P; p++) group_std[p] = batch_std; /* TRL's frac_reward_zero_std reads the batch's */
    } else {
        grpo_advantages(adv, group_std, rewards, N, G, scale);
    }
    for (int i = 0; i < N; i++) {
        r->samples[i].reward = rewards[i];
        r->samples[i].advantage = isnan(adv[i]) ? 0.0f : adv[i];
    }
    for (int k = 0; k < t->n_rewards; k++) {
        char name[96];
        snprintf(name, sizeof name, "rewards/%s/mean", trainer_reward_name(t, k));
        metrics_add(&t->metrics, name, trainer_nanmean(r->per_func + k, N, t->n_rewards));
        snprintf(name, sizeof name, "rewards/%s/std", trainer_reward_name(t, k));
        metrics_add(&t->metrics, name, nanstd(r->per_func + k, N, t->n_rewards));
    }
    metrics_add(&t->metrics, "reward", trainer_nanmean(rewards, N, 1));
    metrics_add(&t->metrics, "reward_std", nanstd(rewards, N, 1));
    int zero_std = 0;
    for (int p = 0; p < P; p++) zero_std += fabsf(group_std[p]) <= 1e-8f;
    metrics_add(&t->metrics, "frac_reward_zero_std", (double)zero_std / P);
    free(rewards);
    free(adv);
    free(group_std);
    return COLT_OK;
}

/* The tokens of a completion the model sampled (TRL counts only those when
 * tool results are in it). */
static int model_tokens(const Sample *s) {
    if (!s->model_mask) return s->len;
    int n = 0;
    for (int j = 0; j < s->len; j++) n += s->model_mask[j];
    return n;
}

/* The round's completion lengths (TRL's metrics: the model's tokens), its
 * tokens, the tokens the loss counts (r->num_items), and with tools TRL's
 * tools/call_frequency (calls per completion) and tools/failure_frequency
 * (failed calls per call). */
static void count_completions(Trainer *t, Rollout *r) {
    const int N = r->n_samples;
    double sum_len = 0, sum_term = 0;
    int min_len = 1 << 30, max_len = 0, n_term = 0, min_term = 1 << 30, max_term = 0;
    int64_t tokens = 0, calls = 0, failures = 0;
    r->num_items = 0;
    for (int i = 0; i < N; i++) {
        Sample *s = &r->samples[i];
        int len = model_tokens(s);
        sum_len += len;
        if (len < min_len) min_len = len;
        if (len > max_len) max_len = len;
        if (s->terminated) {
            n_term++;
            sum_term += len;
            if (len < min_term) min_term = len;
            if (len > max_term) max_term = len;
        }
        tokens += r->prompt_len[s->prompt] + s->len;
        if (!(t->cfg->mask_truncated_completions && !s->terminated)) r->num_items += len;
        calls += s->tool_calls, failures += s->tool_failures;
    }
    t->num_tokens += tokens;
    metrics_add(&t->metrics, "completions/mean_length", sum_len / N);
    metrics_add(&t->metrics, "completions/min_length", min_len);
    metrics_add(&t->metrics, "completions/max_length", max_len);
    metrics_add(&t->metrics, "completions/clipped_ratio", (double)(N - n_term) / N);
    metrics_add(&t->metrics, "completions/mean_terminated_length", n_term ? sum_term / n_term : 0.0);
    metrics_add(&t->metrics, "completions/min_terminated_length", n_term ? min_term : 0);
    metrics_add(&t->metrics, "completions/max_terminated_length", n_term ? max_term : 0);
    if (t->tool_worker) {
        metrics_add(&t->metrics, "tools/call_frequency", (double)calls / N);
        metrics_add(&t->metrics, "tools/failure_frequency", calls ? (double)failures / (double)calls : 0.0);
    }
}

/* Old and reference log-probs (TRL computes them before any update of the
 * round): each rank its share, then every rank all of them. */
static int old_and_reference_logprobs(Trainer *t, Rollout *r, int lo, int hi, char *err) {
    const int n_local = hi - lo;
    int rc = COLT_OK;
    float **lp = xcalloc((size_t)n_local, sizeof(float *));
    if (t->need_old_logp) {
        rc = train_dist_agree(&t->dist, completion_logprobs(t, t->model, r, lo, hi, lp, err), err);
        if (rc == 0) rc = gather_token_values(t, r, lp, lo, hi, offsetof(Sample, old_logp), err);
    }
    if (rc == 0 && trainer_has_reference(t)) {
        if (t->ref_is_base) model_lora_set_enabled(t->model, false);
        rc = completion_logprobs(t, t->ref_is_base ? t->model : t->ref_model, r, lo, hi, lp, err);
        if (t->ref_is_base) model_lora_set_enabled(t->model, true);
        rc = train_dist_agree(&t->dist, rc, err);
        if (rc == 0) rc = gather_token_values(t, r, lp, lo, hi, offsetof(Sample, ref_logp), err);
    }
    for (int j = 0; j < n_local; j++) free(lp[j]);
    free(lp);
    return rc;
}

/* Shuffles the samples (TRL's shuffle_sequence_dict), keyed by the round. */
static void shuffle_samples(const Trainer *t, Rollout *r) {
    const int N = r->n_samples;
    for (int i = 0; i < N; i++) r->order[i] = i;
    for (int i = N - 1; i > 0; i--) {
        uint32_t w[4];
        rng_philox(w, t->cfg->seed, STREAM_SHUFFLE, (uint64_t)t->round * (uint64_t)N + (uint64_t)i);
        int j = (int)(w[0] % (uint32_t)(i + 1));
        int tmp = r->order[i];
        r->order[i] = r->order[j];
        r->order[j] = tmp;
    }
}

/* One generation batch of N = generation_batch_size completions into r (its
 * prompts the next ones in epoch order, its RNG streams t->round's), shared
 * with every rank and scored: r->per_func on every rank. */
static int generate_and_score(Trainer *t, Rollout *r, int lo, int hi, char *err) {
    const TrainConfig *c = t->cfg;
    const int N = c->generation_batch_size;
    double t0 = time_now();
    GenSequence *seqs = NULL;
    int rc = generate_share(t, r, &seqs, lo, hi, err);
    if (!seqs) return rc; /* no prompts: nothing was asked */
    r->round = t->round;
    r->n_samples = N;
    r->n_funcs = t->n_rewards;
    r->samples = xcalloc((size_t)N, sizeof(Sample));
    r->per_func = xcalloc((size_t)N * (size_t)t->n_rewards, sizeof(float));
    r->order = xcalloc((size_t)N, sizeof(int));
    if (share_completions(t, r, seqs, lo, hi, rc, err) != 0) return COLT_ERR;
    double t1 = time_now();
    t->times.generation += t1 - t0;
    /* A completion of zero tokens cannot be scored by the loss; generate() always
     * gives at least one token when max_completion_length >= 1. */
    rc = score_share(t, r, lo, hi, err);
    t->times.scoring += time_now() - t1;
    return rc;
}

/* dynamic_sampling: whether group p of r carries no signal — the weighted
 * rewards of its completions all agree (DAPO's std 0; NaN, no reward, left
 * out: a group with fewer than two rewards has none to compare either). */
static bool group_is_uniform(const Trainer *t, const Rollout *r, int p, float *rewards) {
    const int G = t->cfg->num_generations;
    grpo_combine_rewards(rewards, r->per_func + (size_t)p * G * t->n_rewards, t->reward_weights, G, t->n_rewards);
    int scored = 0;
    float first = NAN;
    for (int g = 0; g < G; g++) {
        if (isnan(rewards[g])) continue;
        if (scored++ == 0) first = rewards[g];
        else if (rewards[g] != first) return false;
    }
    return true;
}

/* Moves group src_p of src (its prompt and its G completions with their
 * rewards) to group dst_p of dst; src keeps empty slots (rollout_free skips them). */
static void move_prompt(Rollout *dst, int to, Rollout *src, int from) {
    dst->rows[to] = src->rows[from];
    dst->prompt_ids[to] = src->prompt_ids[from];
    dst->prompt_len[to] = src->prompt_len[from];
    dst->prompt_text[to] = src->prompt_text[from];
    src->prompt_ids[from] = NULL;
    src->prompt_text[from] = NULL;
}

static void move_group(Rollout *dst, int dst_p, Rollout *src, int src_p, int G) {
    if (!src->prompt_per_sample) move_prompt(dst, dst_p, src, src_p);
    for (int g = 0; g < G; g++) {
        size_t i = (size_t)dst_p * G + g, j = (size_t)src_p * G + g;
        if (src->prompt_per_sample) move_prompt(dst, (int)i, src, (int)j);
        dst->samples[i] = src->samples[j];
        dst->samples[i].prompt = rollout_prompt_index(dst->prompt_per_sample, (int)i, G);
        memset(&src->samples[j], 0, sizeof src->samples[j]);
        memcpy(dst->per_func + i * dst->n_funcs, src->per_func + j * src->n_funcs, sizeof(float) * (size_t)dst->n_funcs);
    }
}

/* DAPO's dynamic sampling (veRL's algorithm.filter_groups): generation batches
 * of generation_batch_size completions, each scored, each group whose rewards
 * all agree dropped, the others kept in order until P = generation_batch_size /
 * num_generations groups are kept (the rest of the last batch is left out, as
 * veRL's batch[:traj_bsz]). Each extra batch takes the next prompts and the
 * next round's RNG streams (t->round), so a run is the same for a seed, and a
 * resume (which saves t->round) goes on alike. Every rank holds every reward,
 * so every rank keeps the same groups. After max_num_gen_batches batches (0:
 * no bound) without P groups the run stops with an error, as veRL's does.
 * Logs num_gen_batches (veRL's train/num_gen_batches) and
 * num_dropped_groups. */
static int fill_informative_groups(Trainer *t, Rollout *r, int lo, int hi, char *err) {
    const TrainConfig *c = t->cfg;
    const int G = c->num_generations, N = c->generation_batch_size, P = N / G, bound = c->max_num_gen_batches;
    r->prompt_per_sample = c->environment_factory != NULL || c->rollout_func != NULL;
    const int n_prompts = r->prompt_per_sample ? N : P;
    r->n_samples = N, r->n_prompts = n_prompts, r->n_funcs = t->n_rewards;
    r->rows = xcalloc((size_t)n_prompts, sizeof(size_t));
    r->prompt_ids = xcalloc((size_t)n_prompts, sizeof(int *));
    r->prompt_len = xcalloc((size_t)n_prompts, sizeof(int));
    r->prompt_text = xcalloc((size_t)n_prompts, sizeof(char *));
    r->samples = xcalloc((size_t)N, sizeof(Sample));
    r->per_func = xcalloc((size_t)N * (size_t)t->n_rewards, sizeof(float));
    r->order = xcalloc((size_t)N, sizeof(int));
    float *rewards = xmalloc(sizeof(float) * (size_t)G);
    int kept = 0, dropped = 0, batches = 0, rc = COLT_OK;
    for (;;) {
        Rollout batch;
        memset(&batch, 0, sizeof batch);
        rc = generate_and_score(t, &batch, lo, hi, err);
        batches++;
        for (int p = 0; rc == 0 && p < P; p++) {
            if (group_is_uniform(t, &batch, p, rewards)) dropped++;
            else if (kept < P) move_group(r, kept++, &batch, p, G);
        }
        rollout_free(&batch);
        if (rc != 0 || kept == P) break;
        if (bound > 0 && batches >= bound) {
            rc = errorf(err, "step %lld: dynamic_sampling kept %d of the %d groups a round needs after %d generation "
                             "batches (max_num_gen_batches; %d groups had rewards that all agree): the prompts are "
                             "too easy or too hard for the model, or the rewards cannot tell completions apart; raise "
                             "max_num_gen_batches (0: no bound) or turn dynamic_sampling off",
                        (long long)t->global_step + 1, kept, P, batches, dropped);
            break;
        }
        t->round++; /* the next batch: the next round's RNG streams */
    }
    free(rewards);
    r->round = t->round;
    metrics_add(&t->metrics, "num_gen_batches", batches);
    metrics_add(&t->metrics, "num_dropped_groups", dropped);
    return rc;
}

/* One generation round: completions, rewards (dynamic_sampling: until every
 * group's rewards differ), advantages, old/ref log-probs. */
int trainer_new_rollout(Trainer *t, char *err) {
    const TrainConfig *c = t->cfg;
    rollout_free(&t->ro);
    Rollout *r = &t->ro;
    const int N = c->generation_batch_size;
    int lo, hi;
    trainer_local_range(t, N, &lo, &hi);
    int rc = c->dynamic_sampling ? fill_informative_groups(t, r, lo, hi, err) : generate_and_score(t, r, lo, hi, err);
    if (rc != 0 || !r->samples) return rc;
    double t1 = time_now();
    if (compute_advantages(t, r, err) != 0) return COLT_ERR;
    count_completions(t, r);
    double t_lp = time_now();
    rc = old_and_reference_logprobs(t, r, lo, hi, err);
    double lp_seconds = time_now() - t_lp;
    t->times.logprobs += lp_seconds;
    shuffle_samples(t, r);
    r->micro_done = 0;
    t->round++;
    t->times.scoring += time_now() - t1 - lp_seconds;
    return rc;
}
