/* rollout_func.c — colt's side of the rollout_func worker (rollout_worker.py):
 * its start, a call that answers the worker's asks until the function
 * returns, and the checks of what it returned. The process plumbing (pipes,
 * process group, stderr forwarding, death with colt) is
 * data/reward_process.c's. Not the trainer's use of the completions. */
#include "train/rollout_func.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "agent/tool_worker.h"
#include "core/error.h"
#include "data/reward_process.h"
#include "rollout_worker_py.h" /* ROLLOUT_WORKER_SOURCE: src/train/rollout_worker.py, embedded at build time */

enum { SEND_TIMEOUT_S = 30 };

struct RolloutFuncWorker {
    char *python, *function;
    double start_timeout_s;
    json_t *setup;          /* sent as the first line at every start */
    RewardProcess *process; /* NULL after a kill, until the next call */
    long next_id;
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The worker's text on one line (an exception's message may hold newlines). */
static void one_line(char *s) {
    for (; *s; s++)
        if ((unsigned char)*s < 0x20) *s = ' ';
}

static int launch(RolloutFuncWorker *w, char *err) {
    char subject[300];
    snprintf(subject, sizeof subject, "rollout_func \"%.150s\" (%.100s)", w->function, w->python);
    RewardProcess *p = NULL;
    json_t *reply = NULL;
    if (reward_process_start_python(&p, &reply, w->python, "colt_rollout_worker.py", "__colt_rollout_worker__",
                                    w->setup, subject, "rollout_func", w->start_timeout_s, err) != 0)
        return COLT_ERR;
    const json_t *error = json_object_get(reply, "error");
    if (error || !json_is_true(json_object_get(reply, "ok"))) {
        errorf(err, "rollout_func \"%s\": %s", w->function,
               json_is_string(error) ? json_string_value(error) : "the worker's answer has no \"ok\"");
        one_line(err);
        json_decref(reply);
        reward_process_stop(p);
        return COLT_ERR;
    }
    json_decref(reply);
    w->process = p;
    return 0;
}

int rollout_func_start(RolloutFuncWorker **out, const char *function, const json_t *args, const json_t *tokenizer,
                       const char *python, double start_timeout_s, char *err) {
    *out = NULL;
    json_t *spec = NULL;
    if (!function || tool_worker_python_spec(&spec, function, "function", "rollout_func", err) != 0) {
        if (!function) errorf(err, "rollout_func: the function is missing");
        return COLT_ERR;
    }
    RolloutFuncWorker *w = xcalloc(1, sizeof *w);
    w->python = xstrdup(reward_process_python(python));
    w->function = xstrdup(function);
    w->start_timeout_s = start_timeout_s > 0 ? start_timeout_s : 120;
    w->setup = json_pack("{s:s, s:o, s:O, s:O}", "source", ROLLOUT_WORKER_SOURCE, "function", spec, "args", args,
                         "tokenizer", tokenizer);
    if (!w->setup || launch(w, err) != 0) {
        if (!w->setup) errorf(err, "rollout_func: its settings cannot be sent");
        rollout_func_free(w);
        return COLT_ERR;
    }
    *out = w;
    return 0;
}

void rollout_func_free(RolloutFuncWorker *w) {
    if (!w) return;
    reward_process_stop(w->process);
    json_decref(w->setup);
    free(w->python);
    free(w->function);
    free(w);
}

/* The worker is gone or must go: the next call starts a new one. */
static void drop_process(RolloutFuncWorker *w, bool kill) {
    if (kill) reward_process_kill(w->process);
    reward_process_stop(w->process);
    w->process = NULL;
}

static int answer_ask(RolloutFuncWorker *w, const json_t *ask, RolloutAskFn fn, void *ctx, char *err) {
    char ask_err[ERR_LEN];
    json_t *answer = NULL;
    if (fn(ctx, &answer, ask, ask_err) != 0) {
        json_decref(answer);
        answer = json_pack("{s:s}", "error", ask_err);
    }
    json_object_set(answer, "ask", json_object_get(ask, "ask"));
    int rc = reward_process_send(w->process, answer, SEND_TIMEOUT_S, err);
    json_decref(answer);
    return rc;
}

int rollout_func_call(RolloutFuncWorker *w, json_t **result, const json_t *prompts, int64_t global_step,
                      double timeout_s, RolloutAskFn ask, void *ctx, char *err) {
    *result = NULL;
    if (!w->process && launch(w, err) != 0) return error_prefix(err, "restarting the rollout_func worker");
    const long id = ++w->next_id;
    json_t *req = json_pack("{s:I, s:s, s:O, s:I}", "id", (json_int_t)id, "op", "rollout", "prompts", prompts,
                            "global_step", (json_int_t)global_step);
    int rc = req ? reward_process_send(w->process, req, SEND_TIMEOUT_S, err)
                 : errorf(err, "rollout_func: the prompts cannot be sent as JSON");
    json_decref(req);
    if (rc != 0) {
        drop_process(w, false);
        return COLT_ERR;
    }
    const double deadline = timeout_s > 0 ? now_s() + timeout_s : 0;
    for (;;) {
        double wait = deadline > 0 ? deadline - now_s() : 60;
        json_t *reply = NULL;
        if (wait <= 0 || reward_process_receive(w->process, &reply, wait, err) != 0) {
            if (wait <= 0)
                errorf(err, "rollout_func \"%s\" did not return within %g s (rollout_func_timeout); colt stopped "
                            "its worker", w->function, timeout_s);
            drop_process(w, wait <= 0);
            return COLT_ERR;
        }
        if (!reply) continue; /* nothing yet: the deadline is checked above */
        if (json_object_get(reply, "ask")) {
            rc = answer_ask(w, reply, ask, ctx, err);
            json_decref(reply);
            if (rc != 0) {
                drop_process(w, false);
                return COLT_ERR;
            }
            continue;
        }
        const json_t *got = json_object_get(reply, "id"), *res = json_object_get(reply, "result");
        const json_t *error = json_object_get(reply, "error");
        if (!json_is_integer(got) || json_integer_value(got) != id || (!json_is_object(res) && !json_is_string(error))) {
            json_decref(reply);
            drop_process(w, true);
            return errorf(err, "rollout_func \"%s\": the worker answered out of turn", w->function);
        }
        if (json_is_string(error)) {
            errorf(err, "rollout_func \"%s\" %s", w->function, json_string_value(error));
            one_line(err);
            json_decref(reply);
            return COLT_ERR;
        }
        *result = json_incref((json_t *)res);
        json_decref(reply);
        return 0;
    }
}

/* ---------------------------------------------------------------------------
 * The result
 * ------------------------------------------------------------------------- */

/* A JSON value's type as the Python it came from calls it. */
static const char *python_type(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "a dict";
    case JSON_ARRAY: return "a list";
    case JSON_STRING: return "a str";
    case JSON_INTEGER: return "an int";
    case JSON_REAL: return "a float";
    case JSON_TRUE: case JSON_FALSE: return "a bool";
    default: return "None";
    }
}

static const char *const REQUIRED[] = {"prompt_ids", "completion_ids", "logprobs"};

/* out[len] from a list of ids below vocab_size. */
static int read_ids(int **out, int *len, const json_t *list, const char *key, int i, int vocab_size, int max_len,
                    const char *limit_name, char *err) {
    if (!json_is_array(list))
        return errorf(err, "rollout_func: %s[%d] is %s, expected a list of token ids", key, i, python_type(list));
    size_t n = json_array_size(list);
    if ((int64_t)n > max_len)
        return errorf(err, "rollout_func: %s[%d] has %zu tokens, %s is %d", key, i, n, limit_name, max_len);
    *out = xmalloc(sizeof(int) * (n ? n : 1));
    *len = (int)n;
    for (size_t k = 0; k < n; k++) {
        const json_t *v = json_array_get(list, k);
        if (!json_is_integer(v))
            return errorf(err, "rollout_func: %s[%d][%zu] is %s, not a token id", key, i, k, python_type(v));
        if (json_integer_value(v) < 0 || json_integer_value(v) >= vocab_size)
            return errorf(err, "rollout_func: %s[%d][%zu] is %lld, outside the model's vocabulary (0 .. %d)", key, i,
                          k, (long long)json_integer_value(v), vocab_size - 1);
        (*out)[k] = (int)json_integer_value(v);
    }
    return 0;
}

static int read_sample(RolloutFuncSample *s, const json_t *result, int i, const RolloutFuncLimits *lim, char *err) {
    if (read_ids(&s->prompt_ids, &s->prompt_len, json_array_get(json_object_get(result, "prompt_ids"), (size_t)i),
                 "prompt_ids", i, lim->vocab_size, lim->max_prompt_len, "the longest prompt colt plans for "
                 "(max_prompt_length, else max_position_embeddings - max_completion_length)", err) != 0 ||
        read_ids(&s->completion_ids, &s->completion_len,
                 json_array_get(json_object_get(result, "completion_ids"), (size_t)i), "completion_ids", i,
                 lim->vocab_size, lim->max_completion_len, "max_completion_length", err) != 0)
        return COLT_ERR;
    if (s->prompt_len == 0) return errorf(err, "rollout_func: prompt_ids[%d] is empty", i);
    if (s->completion_len == 0)
        return errorf(err, "rollout_func: completion_ids[%d] is empty (colt trains on at least one token)", i);
    const int L = s->completion_len;
    const json_t *lp = json_array_get(json_object_get(result, "logprobs"), (size_t)i);
    if (!json_is_array(lp) || json_array_size(lp) != (size_t)L)
        return errorf(err, "rollout_func: logprobs[%d] has %zu values for %d completion tokens", i,
                      json_is_array(lp) ? json_array_size(lp) : 0, L);
    s->logprobs = xmalloc(sizeof(float) * (size_t)L);
    for (int k = 0; k < L; k++) {
        const json_t *v = json_array_get(lp, (size_t)k);
        if (!json_is_number(v) && !json_is_null(v))
            return errorf(err, "rollout_func: logprobs[%d][%d] is %s, expected a number or None", i, k,
                          python_type(v));
        s->logprobs[k] = json_is_null(v) ? NAN : (float)json_number_value(v);
    }
    const json_t *masks = json_object_get(result, "env_mask");
    if (masks && !json_is_null(masks)) {
        const json_t *m = json_array_get(masks, (size_t)i);
        if (!json_is_array(m) || json_array_size(m) != (size_t)L)
            return errorf(err, "rollout_func: env_mask[%d] has %zu values for %d completion tokens", i,
                          json_is_array(m) ? json_array_size(m) : 0, L);
        s->model_mask = xmalloc((size_t)L);
        for (int k = 0; k < L; k++) {
            const json_t *v = json_array_get(m, (size_t)k);
            json_int_t b = json_is_integer(v) ? json_integer_value(v) : json_is_boolean(v) ? json_is_true(v) : -1;
            if (b != 0 && b != 1) return errorf(err, "rollout_func: env_mask[%d][%d] must be 0 or 1", i, k);
            s->model_mask[k] = (uint8_t)b;
        }
    }
    /* TRL: a list gives completion i its i-th value (none past its end), anything else goes to every one */
    s->extra = json_object();
    const char *key;
    json_t *value;
    json_object_foreach((json_t *)result, key, value) {
        if (!strcmp(key, "prompt_ids") || !strcmp(key, "completion_ids") || !strcmp(key, "logprobs") ||
            !strcmp(key, "env_mask"))
            continue;
        if (!json_is_array(value)) json_object_set(s->extra, key, value);
        else if ((size_t)i < json_array_size(value)) json_object_set(s->extra, key, json_array_get(value, (size_t)i));
    }
    return 0;
}

int rollout_func_parse(RolloutFuncSample *out, const json_t *result, const RolloutFuncLimits *lim, char *err) {
    memset(out, 0, sizeof *out * (size_t)(lim->n > 0 ? lim->n : 0));
    if (!json_is_object(result)) return errorf(err, "rollout_func must return a dict");
    char missing[64] = "";
    for (size_t k = 0; k < sizeof REQUIRED / sizeof *REQUIRED; k++)
        if (!json_object_get(result, REQUIRED[k]))
            snprintf(missing + strlen(missing), sizeof missing - strlen(missing), "%s'%s'", *missing ? ", " : "",
                     REQUIRED[k]);
    if (*missing) return errorf(err, "rollout_func must return keys [%s] in its output dict.", missing);
    static const char *const LISTS[] = {"prompt_ids", "completion_ids", "logprobs", "env_mask"};
    for (size_t k = 0; k < sizeof LISTS / sizeof *LISTS; k++) {
        const json_t *v = json_object_get(result, LISTS[k]);
        if (!v || (k == 3 && json_is_null(v))) continue;
        if (!json_is_array(v) || json_array_size(v) != (size_t)lim->n)
            return errorf(err, "rollout_func: %s has %zu entries for %d prompts (this process's prompts, each "
                               "already repeated num_generations times: one completion per prompt)",
                          LISTS[k], json_is_array(v) ? json_array_size(v) : 0, lim->n);
    }
    for (int i = 0; i < lim->n; i++)
        if (read_sample(&out[i], result, i, lim, err) != 0) return COLT_ERR;
    return 0;
}

void rollout_func_samples_free(RolloutFuncSample *s, int n) {
    for (int i = 0; s && i < n; i++) {
        free(s[i].prompt_ids), free(s[i].completion_ids), free(s[i].logprobs), free(s[i].model_mask);
        json_decref(s[i].extra);
        memset(&s[i], 0, sizeof s[i]);
    }
}
