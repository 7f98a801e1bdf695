/* sampler.h — picks the next token from a row of logits, as transformers'
 * generate does: repetition penalty, then temperature, top-k, top-p, min-p.
 *
 * Draws come from the counter-based RNG keyed by (seed, stream, counter) —
 * stream is the sequence's id, counter its position in the completion — so a
 * sequence samples the same tokens whatever else shares its batch.
 * This is not the generation loop (generate.h). */
#ifndef COLT_ENGINE_SAMPLER_H
#define COLT_ENGINE_SAMPLER_H

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
    int *order;      /* [V] token ids sorted by probability */
} Sampler;
void sampler_init(Sampler *s, int vocab_size);
void sampler_free(Sampler *s);

/* Chooses a token from logits[V] (modified in place). history[n_history] are the
 * tokens the repetition penalty applies to (prompt + completion so far, as in
 * transformers). *logprob gets log p(token) under logits / temperature (the
 * model's distribution the trainer scores; raw logits when greedy), before
 * top-k/top-p/min-p filtering. */
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
