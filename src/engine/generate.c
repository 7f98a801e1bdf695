/* generate.c — see generate.h. Sequences are processed in groups of
 * max_batch; each group gets one ModelState (KV cache + scratch) sized for it
 * up front, so nothing allocates inside the decode loop. */
#include "engine/generate.h"

#include <math.h>

#include <stdlib.h>
#include <string.h>

#include "core/error.h"

/* Tokens per prefill forward call: bounds scratch memory for long prompts. */
#define PREFILL_CHUNK 512

void gen_sequence_free(GenSequence *s) {
    free(s->tokens);
    free(s->logprobs);
    s->tokens = NULL;
    s->logprobs = NULL;
    s->n_tokens = 0;
}

static bool is_stop(const GenerateOptions *opt, int token) {
    if (opt->ignore_eos) return false;
    for (int i = 0; i < opt->n_stop_ids; i++)
        if (opt->stop_ids[i] == token) return true;
    return false;
}

int regex_dead_end(const TokenRegex *r, int seq, int n_tokens, char *err) {
    return errorf(err, "regex '%s': sequence %d's completion (%d tokens) is a prefix of a match that no token of the "
                       "vocabulary continues",
                  token_regex_pattern(r), seq, n_tokens);
}

static int generate_group(Model *m, GenSequence *seqs, int n, const GenerateOptions *opt, char *err) {
    const ModelConfig *cfg = model_config(m);
    const int V = cfg->vocab_size;
    int max_prompt = 0;
    for (int i = 0; i < n; i++)
        if (seqs[i].prompt_len > max_prompt) max_prompt = seqs[i].prompt_len;
    int max_len = max_prompt + opt->max_new_tokens;
    if (max_len > cfg->max_position_embeddings) max_len = cfg->max_position_embeddings;
    int max_tokens = n > PREFILL_CHUNK ? n : PREFILL_CHUNK;

    ModelState *st = NULL;
    if (model_state_create(&st, m, n, max_len, max_tokens, err) != 0) return COLT_ERR;
    int *tokens = xmalloc(sizeof(int) * (size_t)max_tokens);
    int *slot = xmalloc(sizeof(int) * (size_t)max_tokens);
    int *pos = xmalloc(sizeof(int) * (size_t)max_tokens);
    uint8_t *want = xcalloc((size_t)max_tokens, 1);
    int *owner = xmalloc(sizeof(int) * (size_t)max_tokens);  /* sequence of each wanted row */
    float *logits = xmalloc(sizeof(float) * (size_t)n * (size_t)V);
    int *history = xmalloc(sizeof(int) * (size_t)max_len);
    int *cur_len = xcalloc((size_t)n, sizeof(int));  /* tokens in the cache per sequence */
    bool *done = xcalloc((size_t)n, sizeof(bool));
    uint32_t *mask = opt->regex ? xmalloc(sizeof(uint32_t) * (size_t)token_regex_mask_words(opt->regex)) : NULL;
    float *policy = opt->regex && opt->policy_logprobs ? xmalloc(sizeof(float) * (size_t)V) : NULL; /* z = logits / T */
    const float policy_t = opt->sampling.temperature > 0.0f ? opt->sampling.temperature : 1.0f;
    Sampler sampler;
    sampler_init(&sampler, V);
    /* vLLM's penalties and logit bias before the sampler, which then leaves the repetition penalty to them */
    const bool vllm_penalties = sampling_has_vllm_penalties(&opt->sampling, opt->n_logit_bias);
    SamplingParams sampling = opt->sampling;
    if (vllm_penalties) sampling.repetition_penalty = 1.0f;
    int *penalty_scratch = vllm_penalties ? xcalloc((size_t)V, sizeof(int)) : NULL;
    int rc = COLT_OK;

    for (int i = 0; i < n; i++) {
        seqs[i].tokens = xmalloc(sizeof(int) * (size_t)(opt->max_new_tokens > 0 ? opt->max_new_tokens : 1));
        seqs[i].logprobs = xmalloc(sizeof(float) * (size_t)(opt->max_new_tokens > 0 ? opt->max_new_tokens : 1));
        seqs[i].n_tokens = 0;
        seqs[i].finish = FINISH_LENGTH;
        if (opt->max_new_tokens == 0 || seqs[i].prompt_len >= max_len) done[i] = true;
    }

    /* Feeds pending tokens (prompt remainder, or the last sampled token) in
     * chunks; the last token of each sequence in the call wants logits. Then
     * samples one token for each sequence whose logits came back. */
    for (;;) {
        int n_tok = 0, n_want = 0;
        for (int i = 0; i < n && n_tok < max_tokens; i++) {
            if (done[i]) continue;
            GenSequence *s = &seqs[i];
            int total = s->prompt_len + s->n_tokens;  /* tokens known so far */
            int pending = total - cur_len[i];
            if (pending <= 0) continue;
            int take = pending < max_tokens - n_tok ? pending : max_tokens - n_tok;
            for (int k = 0; k < take; k++) {
                int p = cur_len[i] + k;
                tokens[n_tok] = p < s->prompt_len ? s->prompt[p] : s->tokens[p - s->prompt_len];
                slot[n_tok] = i;
                pos[n_tok] = p;
                want[n_tok] = (k == take - 1 && take == pending);
                if (want[n_tok]) owner[n_want++] = i;
                n_tok++;
            }
            cur_len[i] += take;
        }
        if (n_tok == 0) break;
        if (model_forward(m, st, tokens, slot, pos, n_tok, want, logits, err) != 0) {
            rc = COLT_ERR;
            break;
        }
        for (int w = 0; w < n_want; w++) {
            int i = owner[w];
            GenSequence *s = &seqs[i];
            int n_hist = s->prompt_len + s->n_tokens;
            memcpy(history, s->prompt, sizeof(int) * (size_t)s->prompt_len);
            memcpy(history + s->prompt_len, s->tokens, sizeof(int) * (size_t)s->n_tokens);
            float lp = 0.0f;
            if (opt->regex) {
                if (token_regex_mask(opt->regex, mask, s->tokens, s->n_tokens, opt->stop_ids, opt->n_stop_ids) == 0) {
                    rc = regex_dead_end(opt->regex, i, s->n_tokens, err);
                    break;
                }
                if (policy)
                    for (int v = 0; v < V; v++) policy[v] = logits[(size_t)w * V + v] / policy_t;
                token_mask_apply(logits + (size_t)w * V, mask, V);
            }
            if (vllm_penalties)
                sampler_apply_penalties(logits + (size_t)w * V, V, &opt->sampling, history, n_hist, s->prompt_len,
                                        opt->logit_bias_ids, opt->logit_bias_values, opt->n_logit_bias,
                                        penalty_scratch);
            int t = sampler_sample(&sampler, logits + (size_t)w * V, &sampling, history, n_hist,
                                   s->stream, (uint64_t)(s->first_position + s->n_tokens), &lp);
            if (policy) lp = (float)logsoftmax_at(policy, V, t);
            s->tokens[s->n_tokens] = t;
            s->logprobs[s->n_tokens] = lp;
            s->n_tokens++;
            if (is_stop(opt, t)) {
                s->finish = FINISH_STOP;
                done[i] = true;
            } else if (s->n_tokens >= opt->max_new_tokens || s->prompt_len + s->n_tokens >= max_len) {
                done[i] = true;
            }
        }
        if (rc != COLT_OK) break;
    }

    sampler_free(&sampler);
    free(penalty_scratch);
    free(mask);
    free(policy);
    free(done);
    free(cur_len);
    free(history);
    free(logits);
    free(owner);
    free(want);
    free(pos);
    free(slot);
    free(tokens);
    model_state_free(st);
    return rc;
}

int generate_check(const Model *m, const GenSequence *seqs, int n_seqs, const GenerateOptions *opt, char *err) {
    const ModelConfig *cfg = model_config(m);
    if (sampling_params_validate(&opt->sampling, err) != 0) return COLT_ERR;
    if (opt->max_new_tokens < 0) return errorf(err, "max_new_tokens must be >= 0 (got %d)", opt->max_new_tokens);
    if (opt->n_logit_bias < 0 || opt->n_logit_bias > MAX_LOGIT_BIAS)
        return errorf(err, "logit_bias: %d entries, at most %d", opt->n_logit_bias, MAX_LOGIT_BIAS);
    for (int j = 0; j < opt->n_logit_bias; j++) {
        if (opt->logit_bias_ids[j] < 0 || opt->logit_bias_ids[j] >= cfg->vocab_size)
            return errorf(err, "logit_bias: token id %d out of range (vocab %d)", opt->logit_bias_ids[j],
                          cfg->vocab_size);
        if (!isfinite(opt->logit_bias_values[j]))
            return errorf(err, "logit_bias: the bias of token %d is not finite", opt->logit_bias_ids[j]);
        for (int k = 0; k < j; k++)
            if (opt->logit_bias_ids[k] == opt->logit_bias_ids[j])
                return errorf(err, "logit_bias: token id %d appears twice", opt->logit_bias_ids[j]);
    }
    if (opt->regex && token_regex_vocab_size(opt->regex) != cfg->vocab_size)
        return errorf(err, "regex '%s' was compiled over %d token ids, the model has %d", token_regex_pattern(opt->regex),
                      token_regex_vocab_size(opt->regex), cfg->vocab_size);
    if (opt->regex && opt->n_stop_ids == 0)
        return errorf(err, "regex '%s': structured outputs need a stop id (eos) to end a completion that matches",
                      token_regex_pattern(opt->regex));
    for (int i = 0; i < n_seqs; i++) {
        const GenSequence *s = &seqs[i];
        if (s->prompt_len <= 0) return errorf(err, "prompt %d is empty: generation needs at least one token", i);
        if (s->prompt_len > cfg->max_position_embeddings)
            return errorf(err, "prompt %d has %d tokens, longer than the model's max_position_embeddings (%d)", i,
                          s->prompt_len, cfg->max_position_embeddings);
        for (int k = 0; k < s->prompt_len; k++)
            if (s->prompt[k] < 0 || s->prompt[k] >= cfg->vocab_size)
                return errorf(err, "prompt %d: token id %d out of range (vocab %d)", i, s->prompt[k], cfg->vocab_size);
    }
    return COLT_OK;
}

int generate(Model *m, GenSequence *seqs, int n_seqs, const GenerateOptions *opt, char *err) {
    if (generate_check(m, seqs, n_seqs, opt, err) != 0) return COLT_ERR;
    for (int i = 0; i < n_seqs; i++) {
        seqs[i].tokens = NULL;
        seqs[i].logprobs = NULL;
        seqs[i].n_tokens = 0;
    }
    int group = opt->max_batch > 0 ? opt->max_batch : n_seqs;
    for (int start = 0; start < n_seqs; start += group) {
        int n = n_seqs - start < group ? n_seqs - start : group;
        if (generate_group(m, seqs + start, n, opt, err) != 0) {
            for (int i = 0; i < n_seqs; i++) gen_sequence_free(&seqs[i]);
            return COLT_ERR;
        }
    }
    return COLT_OK;
}
