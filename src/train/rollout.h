/* rollout.h — one generation round's samples (prompts, completions, rewards,
 * advantages, log-probs, the micro-batch order) and their JSON form inside a
 * checkpoint's trainer_state.json.
 *
 * Reading a rollout back trusts nothing: every count, index, length, token id
 * and number is checked against the run's shape (RolloutShape) before the
 * trainer indexes with it. Generating a rollout is the trainer's job (trainer.c). */
#ifndef COLT_TRAIN_ROLLOUT_H
#define COLT_TRAIN_ROLLOUT_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct Sample {
    int prompt;           /* index into Rollout.prompt_*: rollout_prompt_index */
    int *completion;      /* [len] token ids, the stop token included */
    int len;              /* 1 .. max_completion_length */
    int terminated;       /* ended with a stop token (not truncated) */
    float reward, advantage;
    float *old_logp;      /* [len] or NULL */
    float *sampling_logp; /* [len] the engine's log-prob of each sampled token, or NULL */
    float *ref_logp;      /* [len] or NULL */
    /* Multi-turn (tools): [len] 1 for a token the model sampled, 0 for a tool
     * result's (context, never trained on: TRL's tool_mask); NULL when every
     * token is the model's. */
    uint8_t *model_mask;
    int tool_calls, tool_failures; /* tool calls the completion made; of them, failed */
    char *text;
} Sample;

typedef struct Rollout {
    int n_samples, n_prompts, n_funcs;
    /* One prompt per group (n_prompts = n_samples / num_generations), or with
     * environments one per sample (n_prompts = n_samples): each rollout's
     * environment appends its own observation to the group's prompt. */
    bool prompt_per_sample;
    size_t *rows;        /* [n_prompts] dataset rows */
    int **prompt_ids;    /* [n_prompts][prompt_len] */
    int *prompt_len;
    char **prompt_text;
    Sample *samples;     /* [n_samples]: group g's completions at g*G .. g*G+G-1 */
    float *per_func;     /* [n_samples, n_funcs] rewards, NaN = none */
    int *order;          /* [n_samples] a permutation: the micro-batches' sample order */
    double num_items;    /* completion tokens counted by the loss, whole batch */
    int micro_done;      /* micro-batches of the world consumed (JSON: samples_done, which any world size reads) */
    int64_t round;
} Rollout;

/* What a rollout of this run must look like; a saved one is checked against it. */
typedef struct RolloutShape {
    int n_samples;           /* generation_batch_size */
    int group_size;          /* num_generations */
    int n_funcs;             /* reward functions */
    int max_prompt_len;      /* tokens */
    int max_completion_len;  /* max_completion_length */
    int vocab_size;          /* every token id below it */
    size_t dataset_rows;     /* every row index below it */
    int micro_per_round;     /* steps_per_generation * num_iterations: micro_done stays below it */
    int micro_batch_samples; /* samples in one micro-batch of the world: per_device_train_batch_size x processes */
    bool has_old_logp;       /* old log-probs are computed (generation and optimizer steps misaligned) */
    bool has_ref_logp;       /* beta > 0 */
    bool prompt_per_sample;  /* environment_factory: one prompt per sample */
} RolloutShape;

/* The prompt entry of sample i (G: num_generations). */
static inline int rollout_prompt_index(bool prompt_per_sample, int i, int G) { return prompt_per_sample ? i : i / G; }

void rollout_free(Rollout *r);

/* The rollout as JSON (json null when there is none); micro_batch_samples as
 * in RolloutShape (consumption is written in samples). */
json_t *rollout_to_json(const Rollout *r, int micro_batch_samples);

/* Replaces *r by the rollout in o (json null or NULL: none). Every field is
 * checked against shape; on error *r is empty and err names the field
 * ("where: rollout sample 3: completion has 300 tokens, max_completion_length is 24"). */
int rollout_from_json(Rollout *r, json_t *o, const RolloutShape *shape, const char *where, char *err);

#endif
