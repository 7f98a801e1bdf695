/* generate.h — the plain generation loop: batched prefill, then one decode
 * step for all unfinished sequences per forward call, stopping at eos / stop
 * ids / max_new_tokens, over a contiguous KV cache and host-side sampling.
 * colt generate and colt train use the engine (engine.h) instead; this loop
 * is its reference in the tests. GenSequence and GenerateOptions are shared. */
#ifndef COLT_ENGINE_GENERATE_H
#define COLT_ENGINE_GENERATE_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/sampler.h"
#include "engine/structured.h"
#include "model/model.h"

typedef enum { FINISH_LENGTH = 0, FINISH_STOP = 1 } FinishReason;

#define MAX_LOGIT_BIAS 1024 /* logit_bias entries one request may give (the engine's per-slot tables) */

/* One sequence to complete. The caller fills prompt/prompt_len/stream; the
 * engine fills the rest (tokens and logprobs are malloc'd, caller frees). */
typedef struct GenSequence {
    const int *prompt;
    int prompt_len;
    uint64_t stream;      /* RNG stream: the sequence's id (e.g. completion index) */
    int first_position;   /* the RNG position of its first sampled token: 0, or for a conversation's later
                           * turn the completion's length so far, so no two turns draw the same numbers */
    int *tokens;          /* [n_tokens] completion ids, the stop token included */
    float *logprobs;      /* [n_tokens] log p of each sampled token, under the distribution drawn from (sampling.h) */
    int n_tokens;
    FinishReason finish;
} GenSequence;

typedef struct GenerateOptions {
    SamplingParams sampling;
    int max_new_tokens;
    const int *stop_ids;  /* eos ids and extra stop ids */
    int n_stop_ids;
    bool ignore_eos;      /* never stop on stop_ids */
    /* vLLM's logit_bias: logit_bias_values[j] added to the logit of the distinct
     * ids logit_bias_ids[j], j < n_logit_bias (sampler_apply_penalties). */
    const int *logit_bias_ids;
    const float *logit_bias_values;
    int n_logit_bias;
    int max_batch;        /* sequences decoded together (0 = all) */
    /* Structured outputs (structured.h), or NULL: each completion's text is
     * kept a prefix of a match, and a stop id is drawn only after a full
     * match. The log-probs are then those of the masked distribution drawn
     * from (vLLM's, whose grammar bitmask is applied to the logits before its
     * sampler). Not owned; used by one generation call at a time. */
    TokenRegex *regex;
    /* With a regex: report the policy's log-probs instead, log_softmax(logits /
     * temperature) of the sampled token before the mask (temperature 1 when
     * greedy; no top-k/top-p/min-p, no repetition penalty): the trainer's
     * definition, so that its importance-sampling ratio against them measures
     * engine/trainer mismatch, not the mask's mass (colt train sets it). */
    bool policy_logprobs;
} GenerateOptions;

/* Completes every sequence. Errors: a prompt longer than the model allows, an
 * empty prompt, bad sampling settings, a token id out of range, a regex over
 * another vocabulary or without a stop id, a completion the regex lets no
 * token continue. Generation that
 * reaches max_position_embeddings stops there with FINISH_LENGTH. */
int generate(Model *m, GenSequence *seqs, int n_seqs, const GenerateOptions *opt, char *err);
void gen_sequence_free(GenSequence *s);
/* The checks generate() starts with (shared with the engine). */
int generate_check(const Model *m, const GenSequence *seqs, int n_seqs, const GenerateOptions *opt, char *err);
/* The error when a regex lets no token continue sequence seq after n_tokens (shared with the engine). */
int regex_dead_end(const TokenRegex *r, int seq, int n_tokens, char *err);

#endif
