/* sampling.h — picks the next token from a row of logits, as transformers'
 * generate does: repetition penalty, then temperature, top-k, top-p, min-p.
 *
 * Draws come from the counter-based RNG keyed by (seed, stream, counter) —
 * stream is the sequence's id, counter its position in the completion — so a
 * sequence samples the same tokens whatever else shares its batch. The draw is
 * an inverse CDF over the kept tokens in ascending id order, so a GPU can find
 * the token with a prefix scan (no sort) and map the same uniform number to
 * the same token (backend.h, op `sample`).
 * This is the host sampler the backends build on; it is not the generation
 * loop (engine/generate.h). */
#ifndef COLT_BACKEND_SAMPLING_H
#define COLT_BACKEND_SAMPLING_H

#include <stdbool.h>
#include <stdint.h>

typedef struct SamplingParams {
    float temperature;        /* 0 = greedy (argmax) */
    int top_k;                /* 0 = off */
    float top_p;              /* 1 = off */
    float min_p;              /* 0 = off */
    float repetition_penalty; /* 1 = off; > 1 discourages tokens already present */
    /* vLLM's (OpenAI's) penalties over the completion's tokens (sampler_apply_penalties): */
    float presence_penalty;   /* 0 = off; subtracted once from each token the completion holds */
    float frequency_penalty;  /* 0 = off; subtracted once per time the completion holds the token */
    uint64_t seed;
} SamplingParams;

SamplingParams sampling_params_greedy(void);

/* Checks ranges; returns 0 or an error naming the bad setting. */
int sampling_params_validate(const SamplingParams *p, char *err);

/* Scratch sized for a vocabulary, allocated once per generation run. */
typedef struct Sampler {
    int vocab_size;
    float *probs;    /* [V] */
    int *order;      /* [V] token ids sorted by probability, then the kept ones by id */
} Sampler;
void sampler_init(Sampler *s, int vocab_size);
void sampler_free(Sampler *s);

/* Chooses a token from logits[V] (modified in place). history[n_history] are the
 * tokens the repetition penalty applies to (prompt + completion so far, as in
 * transformers; each distinct token is penalised once). *logprob gets
 * log p(token) under the distribution drawn from: softmax of the penalised
 * logits / temperature, renormalised over the tokens top-k/top-p/min-p keep
 * (vLLM's processed_logprobs, what TRL's importance sampling compares with
 * the trainer; raw log-softmax when greedy). The draw: u = rng_uniform(seed, stream, counter)
 * times the kept probability mass (1 when unfiltered), and the token is the
 * first kept id, ascending, whose running mass (double) exceeds it. */
int sampler_sample(Sampler *s, float *logits, const SamplingParams *p, const int *history,
                   int n_history, uint64_t stream, uint64_t counter, float *logprob);

/* The distribution sampler_sample draws from, as probabilities probs_out[V]
 * (0 for filtered tokens; one-hot when greedy). logits are modified in place.
 * For tests against transformers' logits processors. */
void sampler_distribution(Sampler *s, float *logits, const SamplingParams *p, const int *history, int n_history,
                          float *probs_out);

/* The request asks for vLLM's penalties or a logit bias (sampler_apply_penalties / the backend's
 * apply_penalties op, which then also take the repetition penalty, before the sampler). */
static inline bool sampling_has_vllm_penalties(const SamplingParams *p, int n_logit_bias) {
    return p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f || n_logit_bias > 0;
}

/* vLLM's logit bias and penalties on logits[V], in place, in its order
 * (vllm/v1/sample: the logit-bias processor, then apply_all_penalties):
 * logits[bias_ids[j]] += bias_values[j]; then, for each distinct token of
 * history[n_history] (the prompt's n_prompt tokens, then the completion's),
 * the repetition penalty (positive logits divided by it, others multiplied),
 * then logit -= frequency_penalty * (times in the completion), then
 * logit -= presence_penalty when the completion holds it. bias_ids are
 * distinct. scratch [V] ints, all 0, left all 0. The sampler then runs with a
 * repetition penalty of 1 (it is applied here). */
void sampler_apply_penalties(float *logits, int vocab, const SamplingParams *p, const int *history, int n_history,
                             int n_prompt, const int *bias_ids, const float *bias_values, int n_bias, int *scratch);

/* log-softmax of logits[V] at index token, computed in double. */
double logsoftmax_at(const float *logits, int vocab_size, int token);

#endif
