/* trainer_eval.c — evaluation on the held-out prompts: num_generations_eval
 * (default num_generations) completions per prompt with fixed RNG streams, scored, their mean reward, and
 * eval_<tag>.jsonl written by rank 0. Not colt eval's benchmarks (math_eval.c). */
#include "train/trainer_internal.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fileio.h"
#include "core/error.h"
#include "core/log.h"

/* output_dir/eval_<tag>.jsonl: each completion with its prompt and reward. */
static int write_eval_file(const Trainer *t, const char *tag, const char *const *prompts,
                           const char *const *completions, const float *rewards, int N, char *err) {
    char name[64];
    snprintf(name, sizeof name, "eval_%s.jsonl", tag);
    char *path = path_join(t->cfg->output_dir, name);
    AtomicFile af;
    int rc = COLT_OK;
    if (atomic_open(&af, path, err) == 0) {
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
    return rc;
}

/* Mean combined reward of num_generations_eval sampled completions per held-out
 * prompt, with fixed RNG streams so before/after are comparable. Writes the
 * completions to output_dir/eval_<tag>.jsonl. */
int trainer_evaluate(Trainer *t, const char *tag, double *mean_reward, char *err) {
    TrainConfig *c = t->cfg;
    size_t n_rows = dataset_size(t->eval_data);
    if (c->num_eval_prompts > 0 && (size_t)c->num_eval_prompts < n_rows) n_rows = (size_t)c->num_eval_prompts;
    const int G = c->num_generations_eval > 0 ? c->num_generations_eval : c->num_generations;
    const int L = c->max_completion_length, F = t->n_rewards, W = t->dist.world;
    if (n_rows > TRAIN_CONFIG_MAX_COMPLETIONS / (size_t)G)
        return errorf(err, "%s: %zu eval prompts x num_generations_eval %d is more than the %d completions evaluated "
                           "at once: set num_eval_prompts",
                      c->eval_dataset, n_rows, G, TRAIN_CONFIG_MAX_COMPLETIONS);
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
    /* a training round's conversations (not scored yet with async_generation) stay as they are */
    AgentShare training_round = t->agent;
    memset(&t->agent, 0, sizeof t->agent);
    for (size_t i = 0; i < n_rows && rc == 0; i++)
        rc = trainer_prompt_ids(t, t->eval_data, i, &ids[i], &lens[i], &texts[i], err);
    /* environment_factory: each eval rollout's own prompt, its environment reset with its row, as in
     * training (the eval file shows the dataset's prompt) */
    const bool environments = c->environment_factory != NULL;
    int **env_ids = xcalloc((size_t)chunk + 1, sizeof(int *)), *env_lens = xcalloc((size_t)chunk + 1, sizeof(int));
    char **env_texts = xcalloc((size_t)chunk + 1, sizeof(char *));
    if (environments) {
        for (int j = 0; j < n_local; j++) rows[j] = (size_t)(lo + j) / G;
        if (rc == 0)
            rc = trainer_environment_prompts(t, t->eval_data, c->eval_dataset, rows, n_local, env_ids, env_lens,
                                             env_texts, err);
        rc = train_dist_agree(&t->dist, rc, err);
    }
    if (rc == 0) {
        for (int j = 0; j < n_local; j++) {
            seqs[j].prompt = environments ? env_ids[j] : ids[(lo + j) / G];
            seqs[j].prompt_len = environments ? env_lens[j] : lens[(lo + j) / G];
            seqs[j].stream = STREAM_EVAL_BASE + (uint64_t)(lo + j);
        }
        GenerateOptions go = {.sampling = t->sampling, .max_new_tokens = L, .stop_ids = t->stop_ids,
                              .n_stop_ids = t->n_stop, .regex = t->regex};
        trainer_make_room_for_generation(t, n_local);
        rc = trainer_weights_gather(t, err);
        /* with tools an eval rollout calls them as a training one does (TRL's _generate in eval mode) */
        if (rc == 0 && n_local > 0)
            rc = t->tool_worker ? trainer_agent_generate(t, seqs, n_local, &go, NULL, err)
                                : engine_generate(t->model, seqs, n_local, &go, &t->engine_opts, NULL, err);
        trainer_weights_release(t);
    }
    for (int j = 0; j < n_local && rc == 0; j++) {
        /* a row: the text's token count, then its ids */
        int n_text = seqs[j].n_tokens - (seqs[j].finish == FINISH_STOP ? 1 : 0);
        int *row = mine_ids + (size_t)j * (L + 1);
        row[0] = n_text;
        memcpy(row + 1, seqs[j].tokens, sizeof(int) * (size_t)n_text);
        rc = tokenizer_decode_generated(t->tok, seqs[j].tokens, (size_t)n_text, true, &outs[lo + j], err);
        prompts[j] = environments ? env_texts[j] : texts[(lo + j) / G];
        completions[j] = outs[lo + j];
        rows[j] = environments ? (size_t)j : (size_t)(lo + j) / G;
    }
    const int **completion_ids = xcalloc((size_t)chunk + 1, sizeof(int *));
    int *completion_lens = xcalloc((size_t)chunk + 1, sizeof(int));
    for (int j = 0; j < n_local && rc == 0; j++) completion_ids[j] = seqs[j].tokens, completion_lens[j] = seqs[j].n_tokens;
    json_t *const *messages = t->tool_worker && t->agent.n == n_local && n_local > 0 ? t->agent.messages : NULL;
    /* every rank, also with none: a reward model's scoring may be collective (trainer_score_completions) */
    char score_err[ERR_LEN];
    if (trainer_score_completions(t, mine_rewards, environments ? t->agent.rows : t->eval_data, rows, prompts,
                                  completions, messages, completion_ids, completion_lens, rc == 0 ? n_local : 0,
                                  environments, score_err) != 0 &&
        rc == 0) {
        snprintf(err, ERR_LEN, "%s", score_err);
        rc = COLT_ERR;
    }
    free(completion_ids), free(completion_lens);
    rc = train_dist_agree(&t->dist, rc, err);
    if (rc == 0) rc = train_dist_gather(&t->dist, per_func, mine_rewards, sizeof(float) * (size_t)chunk * F, err);
    if (rc == 0) rc = train_dist_gather(&t->dist, all_ids, mine_ids, sizeof(int) * (size_t)chunk * (L + 1), err);
    if (rc == 0) {
        grpo_combine_rewards(rewards, per_func, t->reward_weights, N, F);
        *mean_reward = trainer_nanmean(rewards, N, 1);
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
        if (rc == 0) rc = write_eval_file(t, tag, prompts, completions, rewards, N, err);
    }
    rc = train_dist_agree(&t->dist, rc, err);
    trainer_agent_share_free(t);
    t->agent = training_round;
    for (int j = 0; j < n_local; j++) gen_sequence_free(&seqs[j]);
    for (int i = 0; i < N; i++) free(outs[i]);
    for (size_t i = 0; i < n_rows; i++) free(ids[i]), free(texts[i]);
    for (int j = 0; j < n_local; j++) free(env_ids[j]), free(env_texts[j]);
    free(env_ids), free(env_lens), free(env_texts);
    free(ids), free(lens), free(texts), free(seqs), free(prompts), free(completions), free(rows);
    free(per_func), free(rewards), free(outs), free(mine_rewards), free(mine_ids), free(all_ids);
    return rc;
}
