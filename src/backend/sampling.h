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

#include <stdint.h>

typedef struct SamplingParams {
    float temperature;        /* 0 = greedy (argmax) */
    int top_k;                /* 0 = off */
    float top_p;              /* 1 = off */
    float min_p;              /* 0 = off */
    float repetition_penalty; /* 1 = off; > 1 discourages tokens already present */
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

/* log-softmax of logits[V] at index token, computed in double. */
double logsoftmax_at(const float *logits, int vocab_size, int token);

#endif
