/* rewards.h — reward functions for GRPO. Built-in: length, regex format
 * match, math answer; external: a user program in any language that colt
 * starts once and talks to in JSON lines, or a TRL-style Python function run
 * in a Python worker colt starts. Each returns one float per completion, or
 * NaN for "no reward" (TRL's None), which the trainer skips.
 *
 * A reward is specified by a JSON object (the YAML config's entries):
 *   {"type": "length", "target": 200}                 -abs(target - len(completion chars))
 *   {"type": "regex", "pattern": "...", "flags": "s", "reward": 1.0}
 *                                                     reward if the pattern matches anywhere in the
 *                                                     completion (PCRE2, UTF + Unicode classes; anchor
 *                                                     with ^...$ for a whole-completion format check;
 *                                                     flags: s dotall, m multiline, i caseless,
 *                                                     x extended), else 0
 *   {"type": "math", "column": "answer"}              1 if the completion's answer equals the
 *                                                     column's ("#### N" or \boxed{N}, last number
 *                                                     otherwise), else 0; NaN if the column has none
 *   {"type": "command", "command": "python3 r.py", "timeout": 30}
 *   {"type": "python", "file": "rewards.py", "function": "reward_len", "timeout": 120, "python": "python3"}
 *   {"type": "python", "module": "my_rewards", "function": "reward_len"}
 *                                                     reward_len(prompts=, completions=, completion_ids=,
 *                                                     **columns) as TRL's GRPOTrainer calls it; the file
 *                                                     is imported when the reward is created (a missing
 *                                                     file or function fails then); relative paths are
 *                                                     from the current directory; "python" defaults to
 *                                                     $COLT_PYTHON, else python3 from PATH
 *   "rewards.py:reward_len", "my_rewards.reward_len"  text forms of the two above
 *   {"type": "model", "path": "DIR"}                  a reward model: DIR (or a Hub name in the local
 *                                                     cache) holds a Llama/Qwen2/Qwen3
 *                                                     ForSequenceClassification checkpoint and its
 *                                                     tokenizer; scored as TRL's GRPOTrainer scores one
 *                                                     (below), on the caller's device (RewardContext)
 *   {"type": "judge", "url": "http://HOST:PORT/v1", "model": "NAME", "prompt": "... {prompt} ... {completion} ...",
 *    "api_key_env": "VAR", "timeout": 60, "max_tokens": 32}
 *                                                     the first number in the answer of an OpenAI-compatible
 *                                                     chat endpoint asked greedily (data/reward_judge.h)
 *   "DIR"                                             text form of the model reward (TRL's reward_funcs="DIR"):
 *                                                     a folder, or a text with a '/' that is not a
 *                                                     Python form
 * plus an optional "name" (metrics use rewards/<name>/mean; defaults: length,
 * regex, math, the command's program name, the Python function's __name__, the
 * model folder's last component).
 *
 * A model reward does what TRL 1.16's _calculate_rewards does for a model:
 * the text is the dataset row's prompt + the completion for a plain prompt,
 * or the prompt's messages + {"role": "assistant", "content": completion}
 * (a multi-turn completion's messages instead: its assistant turns with their
 * tool_calls and the tool results, reward_compute_messages) rendered with the
 * reward model's own chat template (no tools, no generation prompt,
 * the caller's chat_template_kwargs) for a conversational one; it is tokenized
 * with the reward model's tokenizer without added special tokens; the score is
 * label 0 of the score head (logits[:, 0]) at the last token that is not the
 * pad id, the pad id being the tokenizer's pad token, else its eos (as TRL sets
 * config.pad_token_id). The model runs on the device it is given, cut across
 * the tensor-parallel group it is given, and under ZeRO-3 partitioned across
 * the data-parallel ranks it is given (gathered whole while scoring).
 * Unknown types or keys are errors. Create and free rewards on one thread. */
#ifndef COLT_DATA_REWARDS_H
#define COLT_DATA_REWARDS_H

#include <jansson.h>
#include <sys/types.h>

#include "model/model.h" /* Backend, TensorParallel */

typedef struct RewardFunc RewardFunc;

/* What the caller lends a reward that runs a model (all borrowed; the
 * backend and the kwargs must outlive the reward). */
typedef struct RewardContext {
    const Backend *be;                  /* the device the reward model runs on (the policy's: colocated) */
    const char *prompt_column;          /* the dataset column of the prompt (NULL: "prompt") */
    json_t *chat_template_kwargs;       /* the chat template's extra variables, or NULL */
    /* The policy's tensor-parallel group (NULL: none): a reward model is cut
     * across it like the policy when its shape allows (model_tp_check), else
     * held whole on every rank. Its scoring is then collective: every rank of
     * the group computes the same rewards in the same order (the trainer's
     * ranks of a group share their completions). */
    const TensorParallel *tp;
    /* ZeRO-3 over several data-parallel ranks (NULL: none): each rank keeps
     * 1/ranks of a reward model's weights, gathered whole while scoring. Its
     * scoring is then collective over the data-parallel ranks: every rank
     * calls reward_compute as often as the others (with n 0 when it has
     * nothing to score). */
    const WeightPartition *zero3;
} RewardContext;

/* reward_create_ctx with no context: a model reward is refused (it has no device). */
int reward_create(RewardFunc **out, json_t *spec, char *err);
int reward_create_ctx(RewardFunc **out, json_t *spec, const RewardContext *ctx, char *err);
void reward_free(RewardFunc *r);  /* stops an external program */
/* For planning memory before any reward exists: 1 and *out the config.json of
 * the classifier a model reward names; 0 for any other reward, or one whose
 * config does not load (reward_create_ctx then says why). */
int reward_model_config(ModelConfig *out, json_t *spec);
const char *reward_name(const RewardFunc *r);

/* The pid of a command reward's program or a python reward's worker (its
 * process group id; python rewards of one file share it); 0 for built-in
 * rewards or once the process is gone. For tests. */
pid_t reward_command_pid(const RewardFunc *r);

/* rewards[i] for n completions; prompts[i] is the text the model saw,
 * completion_ids[i][0..completion_lens[i]) the completion's token ids, stop
 * token included (both may be NULL), rows[i] the dataset row of completion i
 * (columns reach the function). The external program gets one line
 *   {"prompts": [...], "completions": [...], "completion_ids": [[...]], "<column>": [...], ...}
 * and must answer one line {"rewards": [number or null, ...]} within the
 * timeout. A crash, a wrong count, a non-number, a number that overflows a
 * 32-bit float, a second answer line or a timeout is an error with a message
 * that says which (quoting the program's last stderr line when it wrote one).
 * Its stderr lines reach ours prefixed "[reward <name>] ". A python reward's
 * exception is an error "reward 'f' (rewards.py): <the traceback's last
 * line>", its full traceback on stderr. A model reward reads the prompt
 * column of rows[i] (prompts[i] when the row has none). */
int reward_compute(RewardFunc *r, float *rewards, const char *const *prompts, const char *const *completions,
                   const int *const *completion_ids, const int *completion_lens, json_t *const *rows, int n,
                   char *err);
/* reward_compute for multi-turn completions (tool calling): messages[i] is
 * completion i as a list of messages (the model's turns and the tool results
 * between them), or NULL for a plain one. Python rewards get the list as
 * their completion, as TRL passes it; a model reward scores the prompt's
 * messages + the list rendered with its chat template (as TRL; the completion's
 * text after a plain prompt); the others score completions[i], the
 * completion's whole text. messages may be NULL. */
int reward_compute_messages(RewardFunc *r, float *rewards, const char *const *prompts, const char *const *completions,
                            json_t *const *messages, const int *const *completion_ids, const int *completion_lens,
                            json_t *const *rows, int n, char *err);

/* A python reward run elsewhere (the tool worker calls it with environments=[...],
 * as TRL does when there are environments): its "file.py:f" or "module.f"
 * (malloc'd; NULL for another type) and its seconds per call; the keyword
 * arguments reward_compute_messages would give it; and value i stored as
 * reward_compute stores it (an error when a 32-bit float cannot hold it). */
char *reward_python_function(const RewardFunc *r, double *timeout_s);
int reward_python_kwargs(json_t **out, const RewardFunc *r, const char *const *prompts,
                         const char *const *completions, json_t *const *messages, const int *const *ids,
                         const int *id_lens, json_t *const *rows, int n, char *err);
int reward_store_value(const RewardFunc *r, float *rewards, int i, double value, char *err);

/* Helpers exposed for tests: the answer extracted from text (GSM8K "#### N",
 * else the last \boxed{...}, else the last number), normalised (commas and $
 * removed, trailing zeros of decimals dropped); NULL if none. malloc'd. */
char *reward_extract_answer(const char *text);
/* The reference answer of a dataset column's text as the math reward reads
 * it: after "####" (GSM8K), else the last \boxed{}, else the whole text
 * (MATH-500), normalised the same way; NULL if none. malloc'd. */
char *reward_reference_answer(const char *text);

#endif
