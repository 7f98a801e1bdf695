/* trainer_rollout_func.c — TRL 1.16's rollout_func in the trainer: the
 * worker's life, a round whose completions the user's function makes (this
 * rank's prompts, each repeated num_generations times, as TRL's sampler gives
 * a process its slice), and the asks the function makes meanwhile through its
 * trainer object: generation on this process's engine with the live weights
 * (or, in server mode, on colt serve) and colt's tokenizer and chat template.
 * The round then goes on as any other (trainer_rollout.c): one prompt per
 * sample, env_mask as the tool mask, the function's log-probs as the sampling
 * log-probs, its extra fields in the rows the rewards read. Not the worker's
 * protocol (rollout_func.c). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/log.h"
#include "data/prompt.h"
#include "train/trainer_internal.h"

/* What trainer.args shows: the settings rollout functions read (TRL's names). */
static json_t *trainer_args_json(const TrainConfig *c) {
    json_t *args = json_pack("{s:i, s:i, s:i, s:i, s:f, s:f, s:i, s:f, s:f, s:i, s:i, s:s, s:f, s:I, s:s}",
                             "num_generations", c->num_generations, "max_completion_length", c->max_completion_length,
                             "max_prompt_length", c->max_prompt_length, "generation_batch_size",
                             c->generation_batch_size, "temperature", c->temperature, "top_p", c->top_p, "top_k",
                             c->top_k, "min_p", c->min_p, "repetition_penalty", c->repetition_penalty,
                             "per_device_train_batch_size", c->per_device_train_batch_size, "steps_per_generation",
                             c->steps_per_generation, "vllm_mode", c->vllm_mode ? c->vllm_mode : "colocate", "beta",
                             c->beta, "seed", (json_int_t)c->seed, "output_dir", c->output_dir);
    json_object_set_new(args, "num_iterations", json_integer(c->num_iterations));
    json_object_set_new(args, "gradient_accumulation_steps", json_integer(c->gradient_accumulation_steps));
    json_object_set_new(args, "max_steps", json_integer(c->max_steps));
    json_object_set_new(args, "learning_rate", json_real(c->learning_rate));
    json_object_set_new(args, "loss_type", json_string(c->loss_type ? c->loss_type : ""));
    json_object_set_new(args, "use_vllm", json_true()); /* colt's engine plays vLLM's part */
    json_object_set_new(args, "generation_kwargs", c->generation_kwargs ? json_deep_copy(c->generation_kwargs)
                                                                        : json_null());
    return args;
}

static json_t *id_or_null(int id) { return id >= 0 ? json_integer(id) : json_null(); }

int trainer_rollout_func_start(Trainer *t, char *err) {
    const TrainConfig *c = t->cfg;
    if (!c->rollout_func) return COLT_OK;
    json_t *args = trainer_args_json(c);
    json_t *tok = json_pack("{s:o, s:o, s:o, s:s, s:s}", "eos_token_id", id_or_null(tokenizer_eos_id(t->tok)),
                            "pad_token_id", id_or_null(tokenizer_pad_id(t->tok)), "bos_token_id",
                            id_or_null(tokenizer_bos_id(t->tok)), "eos_token", tokenizer_eos_token(t->tok),
                            "bos_token", tokenizer_bos_token(t->tok));
    int rc = rollout_func_start(&t->rollout_func, c->rollout_func, args, tok, NULL, 0, err);
    json_decref(args), json_decref(tok);
    if (rc != 0) return COLT_ERR;
    log_info0("rollout_func: %s makes each round's completions (%g s per call%s)", c->rollout_func,
              c->rollout_func_timeout, c->rollout_func_timeout > 0 ? "" : ": no limit");
    return COLT_OK;
}

void trainer_rollout_func_stop(Trainer *t) {
    rollout_func_free(t->rollout_func);
    t->rollout_func = NULL;
}

/* ---------------------------------------------------------------- the asks */

typedef struct AskContext {
    Trainer *t;
    int64_t first_stream; /* this rank's first sample's RNG stream this round */
    int generate_calls;   /* generate asks answered so far this round */
} AskContext;

/* A list of id lists from o[key], each id below vocab (ids[i] malloc'd). */
static int read_id_lists(int ***ids, int **lens, int *n, const json_t *list, const char *what, int vocab, char *err) {
    *ids = NULL, *lens = NULL, *n = 0;
    if (!json_is_array(list)) return errorf(err, "%s must be a list of token id lists", what);
    int m = (int)json_array_size(list);
    *ids = xcalloc((size_t)m + 1, sizeof(int *));
    *lens = xcalloc((size_t)m + 1, sizeof(int));
    *n = m;
    for (int i = 0; i < m; i++) {
        const json_t *p = json_array_get(list, (size_t)i);
        if (!json_is_array(p)) return errorf(err, "%s[%d] must be a list of token ids", what, i);
        (*lens)[i] = (int)json_array_size(p);
        (*ids)[i] = xmalloc(sizeof(int) * ((size_t)(*lens)[i] + 1));
        for (int k = 0; k < (*lens)[i]; k++) {
            const json_t *v = json_array_get(p, (size_t)k);
            if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= vocab)
                return errorf(err, "%s[%d][%d] is not a token id of the model's vocabulary (0 .. %d)", what, i, k,
                              vocab - 1);
            (*ids)[i][k] = (int)json_integer_value(v);
        }
    }
    return 0;
}

static void free_id_lists(int **ids, int *lens, int n) {
    for (int i = 0; ids && i < n; i++) free(ids[i]);
    free(ids), free(lens);
}

/* A number of the ask or the trainer's setting when absent or null. */
static double number_or(const json_t *ask, const char *key, double fallback) {
    const json_t *v = json_object_get(ask, key);
    return json_is_number(v) ? json_number_value(v) : fallback;
}

/* The sequences of a generate ask: prompt i's n completions at i*n .. i*n+n-1. Default streams: item q of
 * the c-th generate ask of this rank's round draws from stream first_stream + q, from RNG position c x
 * max_completion_length on, so the first ask is exactly colt's own generation of the round (and colt
 * generate's with those streams), and later asks (turns) draw numbers no earlier one drew. */
static int generate_sequences(GenSequence *seqs, AskContext *a, const json_t *ask, int *const *ids, const int *lens,
                              int P, int n, int max_tokens, char *err) {
    const Trainer *t = a->t;
    const json_t *streams = json_object_get(ask, "streams");
    if (streams && !json_is_null(streams) && (!json_is_array(streams) || json_array_size(streams) != (size_t)(P * n)))
        return errorf(err, "generate: streams must be a list of %d RNG stream ids, one per completion", P * n);
    const int max_pos = model_config(t->model)->max_position_embeddings;
    for (int i = 0; i < P; i++) {
        if (lens[i] == 0) return errorf(err, "generate: prompts[%d] is empty", i);
        if (lens[i] + max_tokens > max_pos)
            return errorf(err, "generate: prompts[%d] has %d tokens; with max_tokens %d that is past the model's "
                               "max_position_embeddings (%d)", i, lens[i], max_tokens, max_pos);
    }
    for (int q = 0; q < P * n; q++) {
        seqs[q].prompt = ids[q / n];
        seqs[q].prompt_len = lens[q / n];
        if (streams && !json_is_null(streams)) {
            const json_t *s = json_array_get(streams, (size_t)q);
            if (!json_is_integer(s) || json_integer_value(s) < 0 || json_integer_value(s) >= (json_int_t)1 << 31)
                return errorf(err, "generate: streams[%d] must be an integer in [0, 2^31-1]", q);
            seqs[q].stream = (uint64_t)json_integer_value(s);
        } else {
            seqs[q].stream = (uint64_t)(a->first_stream + q) % STREAM_EVAL_BASE;
            seqs[q].first_position = a->generate_calls * t->cfg->max_completion_length;
        }
    }
    return 0;
}

/* Runs the sequences where the trainer's own generation runs: colocated on the live weights, or on the server. */
static int run_generation(Trainer *t, GenSequence *seqs, int m, const GenerateOptions *go, char *err) {
    const int vocab = model_config(t->model)->vocab_size;
    if (t->server) {
        int *budgets = xmalloc(sizeof(int) * (size_t)m);
        for (int q = 0; q < m; q++) budgets[q] = go->max_new_tokens;
        int rc = serve_client_generate_turns(t->server, seqs, m, go, budgets, NULL, vocab, NULL, err);
        free(budgets);
        return rc;
    }
    trainer_make_room_for_round(t, m);
    int rc = trainer_weights_gather(t, err);
    trainer_alloc_label(t, "the generation engine's scratch and KV pool", t->plan.engine_scratch + t->plan.kv_min);
    /* every ask of the round (and of the next rounds) on the rounds' engine: made once, its graphs kept */
    if (rc == 0) rc = trainer_round_generate(t, seqs, m, go, NULL, err);
    trainer_alloc_label(t, NULL, 0);
    trainer_weights_release(t);
    return rc;
}

static json_t *int_list(const int *v, int n) {
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_integer(v[i]));
    return a;
}

/* {"op": "generate", "prompts": [[ids]], "n", "max_tokens", "temperature", ...}: the completions, their
 * sampling log-probs and finish reasons. */
static int ask_generate(AskContext *a, json_t **answer, const json_t *ask, char *err) {
    Trainer *t = a->t;
    const TrainConfig *c = t->cfg;
    int **ids = NULL, *lens = NULL, P = 0;
    if (read_id_lists(&ids, &lens, &P, json_object_get(ask, "prompts"), "generate: prompts",
                      model_config(t->model)->vocab_size, err) != 0) {
        free_id_lists(ids, lens, P);
        return COLT_ERR;
    }
    const int n = (int)number_or(ask, "n", 1), max_tokens = (int)number_or(ask, "max_tokens", c->max_completion_length);
    if (n < 1 || (int64_t)n * P > TRAIN_CONFIG_MAX_COMPLETIONS || max_tokens < 1 || max_tokens > c->max_completion_length) {
        free_id_lists(ids, lens, P);
        return errorf(err, "generate: n must be >= 1 (at most %d completions in all) and max_tokens 1 .. "
                           "max_completion_length (%d); got n %d for %d prompts, max_tokens %d",
                      TRAIN_CONFIG_MAX_COMPLETIONS, c->max_completion_length, n, P, max_tokens);
    }
    GenerateOptions go = trainer_generate_options(t);
    go.max_new_tokens = max_tokens;
    go.regex = NULL;
    go.sampling.temperature = (float)number_or(ask, "temperature", go.sampling.temperature);
    go.sampling.top_p = (float)number_or(ask, "top_p", go.sampling.top_p);
    go.sampling.top_k = (int)number_or(ask, "top_k", go.sampling.top_k);
    go.sampling.min_p = (float)number_or(ask, "min_p", go.sampling.min_p);
    const int m = P * n;
    GenSequence *seqs = xcalloc((size_t)m + 1, sizeof(GenSequence));
    int rc = sampling_params_validate(&go.sampling, err);
    if (rc == 0) rc = generate_sequences(seqs, a, ask, ids, lens, P, n, max_tokens, err);
    if (rc == 0 && m > 0) rc = run_generation(t, seqs, m, &go, err);
    if (rc == 0) {
        a->generate_calls++;
        json_t *completions = json_array(), *logprobs = json_array(), *finish = json_array();
        for (int q = 0; q < m; q++) {
            json_array_append_new(completions, int_list(seqs[q].tokens, seqs[q].n_tokens));
            json_t *lp = json_array();
            for (int k = 0; k < seqs[q].n_tokens; k++)
                json_array_append_new(lp, seqs[q].logprobs && isfinite(seqs[q].logprobs[k])
                                              ? json_real(seqs[q].logprobs[k]) : json_null());
            json_array_append_new(logprobs, lp);
            json_array_append_new(finish, json_string(seqs[q].finish == FINISH_STOP ? "stop" : "length"));
        }
        *answer = json_pack("{s:o, s:o, s:o}", "completion_ids", completions, "logprobs", logprobs, "finish", finish);
    }
    for (int q = 0; q < m; q++) gen_sequence_free(&seqs[q]);
    free(seqs);
    free_id_lists(ids, lens, P);
    return rc;
}

/* encode / decode / chat_template with colt's tokenizer and the run's chat template. */
static int ask_tokenizer(AskContext *a, json_t **answer, const json_t *ask, const char *op, char *err) {
    Trainer *t = a->t;
    json_t *out = json_array();
    int rc = COLT_OK;
    if (!strcmp(op, "encode")) {
        const json_t *texts = json_object_get(ask, "texts");
        bool special = json_is_true(json_object_get(ask, "add_special_tokens"));
        for (size_t i = 0; rc == 0 && i < json_array_size(texts); i++) {
            const char *s = json_string_value(json_array_get(texts, i));
            int *ids = NULL, n = 0;
            if (!s) rc = errorf(err, "encode: texts[%zu] is not a string", i);
            else rc = prompt_encode_text(&ids, &n, t->tok, s, !special, 0, "encode", err);
            if (rc == 0) json_array_append_new(out, int_list(ids, n));
            free(ids);
        }
        if (rc == 0) *answer = json_pack("{s:o}", "ids", out), out = NULL;
    } else if (!strcmp(op, "decode")) {
        int **ids = NULL, *lens = NULL, n = 0;
        bool skip = json_is_true(json_object_get(ask, "skip_special_tokens"));
        rc = read_id_lists(&ids, &lens, &n, json_object_get(ask, "ids"), "decode: ids", tokenizer_vocab_size(t->tok),
                           err);
        for (int i = 0; rc == 0 && i < n; i++) {
            char *text = NULL;
            rc = tokenizer_decode(t->tok, ids[i], (size_t)lens[i], skip, &text, err);
            if (rc == 0) json_array_append_new(out, json_string(text));
            free(text);
        }
        free_id_lists(ids, lens, n);
        if (rc == 0) *answer = json_pack("{s:o}", "texts", out), out = NULL;
    } else {
        const json_t *convs = json_object_get(ask, "conversations"), *kw = json_object_get(ask, "kwargs");
        json_t *tools = json_object_get(ask, "tools");
        json_t *kwargs = json_is_object(t->cfg->chat_template_kwargs) ? json_deep_copy(t->cfg->chat_template_kwargs)
                                                                      : json_object();
        if (json_is_object(kw)) json_object_update(kwargs, (json_t *)kw);
        for (size_t i = 0; rc == 0 && i < json_array_size(convs); i++) {
            char *text = NULL;
            rc = prompt_render_chat(&text, t->tok, json_array_get(convs, i), json_is_array(tools) ? tools : NULL,
                                    kwargs, json_is_true(json_object_get(ask, "add_generation_prompt")),
                                    "apply_chat_template", err);
            if (rc == 0) json_array_append_new(out, json_string(text));
            free(text);
        }
        json_decref(kwargs);
        if (rc == 0) *answer = json_pack("{s:o}", "texts", out), out = NULL;
    }
    json_decref(out);
    return rc;
}

static int answer_ask(void *ctx, json_t **answer, const json_t *ask, char *err) {
    const char *op = json_string_value(json_object_get(ask, "op"));
    if (!op) return errorf(err, "an ask without an op");
    if (!strcmp(op, "generate")) return ask_generate(ctx, answer, ask, err);
    if (!strcmp(op, "encode") || !strcmp(op, "decode") || !strcmp(op, "chat_template"))
        return ask_tokenizer(ctx, answer, ask, op, err);
    return errorf(err, "unknown op '%.40s'", op);
}

/* ---------------------------------------------------------------- the round */

/* Sample j's row as the rewards see it: its group's dataset row with the function's extra fields (TRL:
 * inputs[i][key] = values[i]). */
static json_t *sample_rows(const Trainer *t, const Rollout *r, const RolloutFuncSample *s, int lo, int n) {
    const int G = t->cfg->num_generations;
    json_t *rows = json_array();
    for (int j = 0; j < n; j++) {
        json_t *row = json_deep_copy(dataset_row(t->data, r->rows[(lo + j) / G]));
        json_object_update(row, s[j].extra);
        json_array_append_new(rows, row);
    }
    return rows;
}

/* seqs[j] and t->agent's masks from the checked samples (their arrays move). */
static void fill_share(Trainer *t, GenSequence *seqs, RolloutFuncSample *s, int n) {
    AgentShare *a = &t->agent;
    a->n = n;
    a->masks = xcalloc((size_t)n + 1, sizeof(uint8_t *));
    a->calls = xcalloc((size_t)n + 1, sizeof(int));
    a->failures = xcalloc((size_t)n + 1, sizeof(int));
    a->messages = xcalloc((size_t)n + 1, sizeof(json_t *)); /* none: TRL decodes a rollout's completion as one text */
    for (int j = 0; j < n; j++) {
        const int L = s[j].completion_len, last = s[j].completion_ids[L - 1];
        bool stop = false;
        for (int k = 0; k < t->n_stop; k++) stop = stop || t->stop_ids[k] == last;
        /* TRL: a completion ending in an eos or the pad token is not truncated */
        stop = stop || last == tokenizer_pad_id(t->tok);
        seqs[j].tokens = s[j].completion_ids, seqs[j].logprobs = s[j].logprobs;
        seqs[j].n_tokens = L, seqs[j].finish = stop ? FINISH_STOP : FINISH_LENGTH;
        s[j].completion_ids = NULL, s[j].logprobs = NULL;
        if (s[j].model_mask) a->masks[j] = s[j].model_mask, s[j].model_mask = NULL;
        else memset(a->masks[j] = xmalloc((size_t)L), 1, (size_t)L);
    }
}

/* This rank's prompts for the function: TRL's prompts of the process's slice, each group's raw prompt
 * (text or messages) repeated num_generations times. */
static json_t *share_prompts(const Trainer *t, const Rollout *r, int lo, int hi) {
    const int G = t->cfg->num_generations;
    json_t *prompts = json_array();
    for (int i = lo; i < hi; i++) {
        json_t *p = json_object_get(dataset_row(t->data, r->rows[i / G]), t->cfg->dataset_prompt_column);
        json_array_append(prompts, p ? p : json_null());
    }
    return prompts;
}

static int call_function(Trainer *t, json_t **result, const Rollout *r, int lo, int hi, char *err) {
    const int N = t->cfg->generation_batch_size;
    AskContext ctx = {.t = t, .first_stream = (int64_t)((uint64_t)t->round * (uint64_t)N + (uint64_t)lo)};
    json_t *prompts = share_prompts(t, r, lo, hi);
    int rc = rollout_func_call(t->rollout_func, result, prompts, t->global_step, t->cfg->rollout_func_timeout,
                               answer_ask, &ctx, err);
    json_decref(prompts);
    return rc;
}

int trainer_rollout_func_generate(Trainer *t, Rollout *r, GenSequence **seqs_out, int lo, int hi, char *err) {
    const int n_local = hi - lo, G = t->cfg->num_generations;
    trainer_agent_share_free(t);
    if (trainer_choose_prompts(t, r, err) != 0) return COLT_ERR;
    GenSequence *seqs = xcalloc((size_t)n_local + 1, sizeof(GenSequence));
    *seqs_out = seqs;
    RolloutFuncSample *s = xcalloc((size_t)n_local + 1, sizeof(RolloutFuncSample));
    json_t *result = NULL;
    int rc = n_local > 0 ? call_function(t, &result, r, lo, hi, err) : COLT_OK;
    RolloutFuncLimits lim = {.n = n_local, .vocab_size = model_config(t->model)->vocab_size,
                             .max_prompt_len = t->max_prompt_tokens, .max_completion_len = t->cfg->max_completion_length};
    if (rc == 0 && n_local > 0) rc = rollout_func_parse(s, result, &lim, err);
    json_decref(result);
    /* the prompts of every sample to every rank; this rank's texts are its groups' (TRL's rewards get the
     * dataset's prompts) */
    int **ids = xcalloc((size_t)n_local + 1, sizeof(int *)), *lens = xcalloc((size_t)n_local + 1, sizeof(int));
    char **texts = xcalloc((size_t)n_local + 1, sizeof(char *));
    for (int j = 0; rc == 0 && j < n_local; j++) {
        ids[j] = s[j].prompt_ids, lens[j] = s[j].prompt_len, s[j].prompt_ids = NULL;
        texts[j] = xstrdup(r->prompt_text[(lo + j) / G]);
    }
    json_t *rows = rc == 0 ? sample_rows(t, r, s, lo, n_local) : NULL;
    int share_rc = trainer_share_sample_prompts(t, r, lo, hi, ids, lens, texts, rc, err);
    if (rc == 0 && share_rc == 0) {
        fill_share(t, seqs, s, n_local);
        t->agent.row_list = rows, rows = NULL;
        rc = dataset_from_rows(&t->agent.rows, t->agent.row_list, t->cfg->dataset_prompt_column, "rollout_func rows",
                               err);
    }
    if (rc == 0) rc = share_rc;
    json_decref(rows);
    for (int j = 0; j < n_local; j++) free(ids[j]), free(texts[j]);
    free(ids), free(lens), free(texts);
    rollout_func_samples_free(s, n_local);
    free(s);
    return rc;
}
