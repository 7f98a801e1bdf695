/* rollout_func.h — TRL 1.16's rollout_func run in a Python worker
 * (src/train/rollout_worker.py, embedded in the binary; its header comment is
 * the wire protocol): starting it, one rollout call at a time during which the
 * worker asks colt for generation and tokenizer work (answered by the caller's
 * RolloutAskFn), and reading the function's dict back, checked, into
 * per-completion arrays.
 *
 * The function is named as tools are: "rollouts.py:my_rollout" (a file;
 * relative paths from the current directory) or "my_pkg.rollouts.my_rollout".
 *
 * Not here: what colt does with the completions (train/trainer_rollout_func.c)
 * nor the engine. */
#ifndef COLT_TRAIN_ROLLOUT_FUNC_H
#define COLT_TRAIN_ROLLOUT_FUNC_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct RolloutFuncWorker RolloutFuncWorker;

/* Answers one ask of the worker ({"op": "generate" | "encode" | "decode" |
 * "chat_template", ...}): *answer a new object (its "ask" id is added by the
 * caller), or COLT_ERR with err, which the worker gets as {"error": ...}
 * (the function then raises it, a RuntimeError: a bad ask is the user's). */
typedef int (*RolloutAskFn)(void *ctx, json_t **answer, const json_t *ask, char *err);

/* Starts the worker and imports the function. args: the GRPO settings the
 * trainer object shows (trainer.args); tokenizer: processing_class's
 * attributes (eos_token_id, pad_token_id, ...). python NULL: $COLT_PYTHON,
 * else python3. Errors name the function and what is wrong. */
int rollout_func_start(RolloutFuncWorker **out, const char *function, const json_t *args, const json_t *tokenizer,
                       const char *python, double start_timeout_s, char *err);
void rollout_func_free(RolloutFuncWorker *w); /* NULL is fine */

/* Calls the function with prompts (a JSON list) and answers its asks until it
 * returns: *result (new ref) is its dict. timeout_s > 0: the whole call's
 * limit (the worker is killed past it and the next call starts a new one).
 * Errors: the function raised (its last line), the worker died, the limit. */
int rollout_func_call(RolloutFuncWorker *w, json_t **result, const json_t *prompts, int64_t global_step,
                      double timeout_s, RolloutAskFn ask, void *ctx, char *err);

/* One completion of a rollout's result, checked. */
typedef struct RolloutFuncSample {
    int *prompt_ids, prompt_len;
    int *completion_ids, completion_len;
    float *logprobs;     /* [completion_len], NaN where the function gave None */
    uint8_t *model_mask; /* [completion_len] from env_mask (1: the model's token), or NULL without one */
    json_t *extra;       /* the other keys' values for this completion (an object; TRL's extra_fields) */
} RolloutFuncSample;

/* What a result must fit. */
typedef struct RolloutFuncLimits {
    int n;                  /* completions: the prompts given (each repeated num_generations times) */
    int vocab_size;         /* every id below it */
    int max_prompt_len;     /* tokens */
    int max_completion_len; /* max_completion_length */
} RolloutFuncLimits;

/* Reads result into out[0..limits->n) (zeroed first; free with
 * rollout_func_samples_free also on error). Errors name the key and the
 * completion: "rollout_func: completion_ids[3] has 40 tokens, max_completion_length is 32". */
int rollout_func_parse(RolloutFuncSample *out, const json_t *result, const RolloutFuncLimits *limits, char *err);
void rollout_func_samples_free(RolloutFuncSample *s, int n);

#endif
