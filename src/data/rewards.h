/* rewards.h — reward functions for GRPO. Built-in: length, regex format
 * match, math answer; external: a user program in any language that colt
 * starts once and talks to in JSON lines. Each returns one float per
 * completion, or NaN for "no reward" (TRL's None), which the trainer skips.
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
 * plus an optional "name" (metrics use rewards/<name>/mean; defaults: length,
 * regex, math, the command's program name). Unknown types or keys are errors. */
#ifndef COLT_DATA_REWARDS_H
#define COLT_DATA_REWARDS_H

#include <jansson.h>
#include <sys/types.h>

typedef struct RewardFunc RewardFunc;

int reward_create(RewardFunc **out, json_t *spec, char *err);
void reward_free(RewardFunc *r);  /* stops an external program */
const char *reward_name(const RewardFunc *r);

/* The pid of a command reward's program (its process group id); 0 for
 * built-in rewards or once the program is gone. For tests. */
pid_t reward_command_pid(const RewardFunc *r);

/* rewards[i] for n completions; rows[i] is the dataset row of completion i
 * (columns reach the function). The external program gets one line
 *   {"prompts": [...], "completions": [...], "<column>": [...], ...}
 * and must answer one line {"rewards": [number or null, ...]} within the
 * timeout. A crash, a wrong count, a non-number, a number that overflows a
 * 32-bit float, a second answer line or a timeout is an error with a message
 * that says which (quoting the program's last stderr line when it wrote one).
 * Its stderr lines reach ours prefixed "[reward <name>] ". */
int reward_compute(RewardFunc *r, float *rewards, const char *const *prompts, const char *const *completions,
                   json_t *const *rows, int n, char *err);

/* Helpers exposed for tests: the answer extracted from text (GSM8K "#### N",
 * else the last \boxed{...}, else the last number), normalised (commas and $
 * removed, trailing zeros of decimals dropped); NULL if none. malloc'd. */
char *reward_extract_answer(const char *text);

#endif
