/* reward_judge.h — the judge reward (rewards.h {type: judge}): a language
 * model behind an OpenAI-compatible /v1/chat/completions endpoint (colt serve,
 * vLLM, any) asked about each completion, the first number of its answer taken
 * as the reward.
 *
 *   {"type": "judge", "url": "http://127.0.0.1:8000/v1", "model": "NAME",
 *    "prompt": "Rate ... {prompt} ... {completion} ... from 0 to 10.",
 *    "api_key_env": "VAR", "timeout": 60, "max_tokens": 32}
 *
 * url is the API's base (as OpenAI's base_url: ".../v1"); prompt the user
 * message, {prompt} and {completion} replaced by the prompt the policy saw and
 * its completion ({completion} required); api_key_env the environment variable
 * holding the key sent as "Authorization: Bearer" (read once, at creation;
 * none: no header); timeout the seconds one request may take (default 60);
 * max_tokens the answer's length (default 32). The judge samples greedily
 * (temperature 0), so one answer per text.
 *
 * Not a retry policy and not colt's own client (serve/serve_client.h): a batch's
 * requests go out together (libcurl multi, at most JUDGE_MAX_IN_FLIGHT at a
 * time) and the first that fails (no answer in time, an HTTP error, an answer
 * without a number) fails the batch with a one-line error naming its
 * completion. */
#ifndef COLT_DATA_REWARD_JUDGE_H
#define COLT_DATA_REWARD_JUDGE_H

#include <jansson.h>
#include <stdbool.h>

typedef struct RewardJudge RewardJudge;

/* Checks spec (keys, url, prompt, the key's variable) for the reward called name. */
int reward_judge_create(RewardJudge **out, const json_t *spec, const char *name, char *err);
/* values[i] the judge's number for completion i of n. */
int reward_judge_compute(RewardJudge *j, double *values, const char *const *prompts, const char *const *completions,
                         int n, char *err);
void reward_judge_free(RewardJudge *j);

/* The first number in text (an optional sign, digits, an optional fraction
 * and exponent: "-3.5", "10", ".5"); false when there is none. For tests. */
bool reward_judge_first_number(const char *text, double *value);

#endif
