/* test_agent_envs.c — TRL 1.16's dict of environments (environment_factory={name: class}) against TRL's own
 * code, on the tiny tool model (tests/data/models/tiny-tool-f32) with examples/environments/mixed.yaml:
 * {"writer": WriterEnv, "count": CountEnv, "writer2": WriterEnv, "mul": MulEnv}, each row of mixed.jsonl
 * naming its environment.
 *
 *   1. The tool worker: one entry per name in the dict's order, each with its class, its tools (the
 *      standalone ones, then its methods), whether it has get_reward, and the class it shares a reward
 *      column with (writer2 is WriterEnv: one column); a reset says which environment the instance is; a
 *      call to another environment's method is TRL's "Tool mul not found.".
 *   2. `colt train`, greedy, one round saved mid-round in checkpoint-1, against TRL's
 *      _generate_and_score_completions on the same rows (tests/ref/make_env_goldens.py, env_dict_goldens.json):
 *      every sample's prompt ids (rendered with its environment's tools alone), completion ids, tool mask and
 *      its three rewards (says_the_sum; WriterEnv and CountEnv, each null for the other classes' rollouts),
 *      and tools/call_frequency, tools/failure_frequency; a resume from checkpoint-1 gives the uninterrupted
 *      run's step 2, and one with the dict's names in another order (its reward columns') is refused.
 *   3. One-line errors: a row naming an unknown environment (the name and the expected ones, as TRL's
 *      message), a dict without a dataset, bad forms of the mapping.
 * Exits 77 (skipped) without python3 and transformers (the tool worker needs them). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/tool_worker.h"
#include "core/error.h"
#include "core/fileio.h"

#include "harness.h"

#define AGENT COLT_SOURCE_DIR "/tests/data/agent"
#define ENV_DIR COLT_SOURCE_DIR "/examples/environments"
#define DICT "{\"writer\": \"" ENV_DIR "/writer.py:WriterEnv\", \"count\": \"" ENV_DIR "/counter.py:CountEnv\", " \
    "\"writer2\": \"" ENV_DIR "/writer.py:WriterEnv\", \"mul\": \"" ENV_DIR "/counter.py:MulEnv\"}"

/* ---------------------------------------------------------------- 1. the tool worker */

static void test_worker(void) {
    const char *tools[] = {AGENT "/calc_tools.py:add"};
    const char *names[] = {"writer", "count", "writer2", "mul"};
    const char *classes[] = {ENV_DIR "/writer.py:WriterEnv", ENV_DIR "/counter.py:CountEnv",
                             ENV_DIR "/writer.py:WriterEnv", ENV_DIR "/counter.py:MulEnv"};
    ToolWorker *w = NULL;
    char err[ERR_LEN];
    int rc = tool_worker_start_environments(&w, tools, 1, names, classes, 4, NULL, err);
    CHECK(rc == 0, "tool worker with 4 environments: %s", err);
    if (rc != 0) return;
    const ToolEnvironment *envs;
    size_t n = tool_worker_environments(w, &envs);
    CHECK(n == 4, "%zu environments, want 4", n);
    const char *want_class[] = {"WriterEnv", "CountEnv", "WriterEnv", "MulEnv"};
    const char *want_tool[] = {"big", "big", "big", "mul"};
    const int want_class_index[] = {0, 1, 0, 3};
    const bool want_reward[] = {true, true, true, false};
    for (size_t e = 0; e < n && e < 4; e++) {
        const json_t *last = json_array_get(envs[e].schemas, json_array_size(envs[e].schemas) - 1);
        const char *tool = json_string_value(json_object_get(json_object_get(last, "function"), "name"));
        CHECK(envs[e].name && !strcmp(envs[e].name, names[e]) && !strcmp(envs[e].class_name, want_class[e]) &&
                  envs[e].class_index == want_class_index[e] && envs[e].has_reward == want_reward[e] &&
                  json_array_size(envs[e].schemas) == 2 && tool && !strcmp(tool, want_tool[e]),
              "environment %zu: %s %s class %d reward %d, %zu tools, the last %s", e, envs[e].name,
              envs[e].class_name, envs[e].class_index, envs[e].has_reward, json_array_size(envs[e].schemas),
              tool ? tool : "?");
    }
    CHECK(tool_worker_environment_index(w, "mul") == 3 && tool_worker_environment_index(w, "chess") == -1,
          "environment_index: mul %d, chess %d", tool_worker_environment_index(w, "mul"),
          tool_worker_environment_index(w, "chess"));
    /* instance 7 as a MulEnv: its reset names it; the row's environment column is not passed to reset */
    json_t *row = json_pack("{s:i, s:i, s:s}", "a", 6, "b", 7, "environment", "mul");
    long id;
    json_t *answer = NULL;
    long got = -1;
    rc = tool_worker_submit_reset_in(w, &id, 7, 3, row, err);
    while (rc == 0 && !answer) rc = tool_worker_poll(w, &got, &answer, 5.0, err) < 0 ? COLT_ERR : 0;
    const char *env_name = json_string_value(json_object_get(answer, "environment"));
    const char *observation = json_string_value(json_object_get(answer, "observation"));
    CHECK(rc == 0 && got == id && env_name && !strcmp(env_name, "mul") && observation && !strcmp(observation, " 6 7"),
          "reset of a MulEnv: %s", answer ? json_dumps(answer, JSON_COMPACT) : err);
    json_decref(answer), json_decref(row);
    char *content = NULL;
    bool failed = false;
    json_t *args = json_pack("{s:i, s:i}", "a", 6, "b", 7);
    rc = tool_worker_call(w, &content, &failed, "mul", args, 7, 0, err);
    CHECK(rc == 0 && content && !strcmp(content, "42") && !failed, "MulEnv's mul: %s", content ? content : err);
    free(content), content = NULL;
    /* instance 8 as a WriterEnv: mul is another environment's method there */
    row = json_pack("{s:i, s:i, s:s}", "a", 1, "b", 2, "environment", "writer");
    json_t *observation_json = NULL;
    rc = tool_worker_submit_reset_in(w, &id, 8, 0, row, err);
    answer = NULL;
    while (rc == 0 && !answer) rc = tool_worker_poll(w, &got, &answer, 5.0, err) < 0 ? COLT_ERR : 0;
    json_decref(answer), json_decref(row), json_decref(observation_json);
    rc = tool_worker_call(w, &content, &failed, "mul", args, 8, 0, err);
    CHECK(rc == 0 && content && !strcmp(content, "{'error': 'Tool mul not found.'}") && failed,
          "mul in a WriterEnv: %s", content ? content : err);
    printf("tool worker: 4 environments (WriterEnv's column shared by writer and writer2), a MulEnv's mul -> 42, "
           "in a WriterEnv -> %s\n", content ? content : "?");
    free(content);
    json_decref(args);
    tool_worker_free(w);
}

/* ---------------------------------------------------------------- 2. colt train against TRL */

static int run_train(const char *extra, char **err) {
    char cd[300], args[4096];
    snprintf(cd, sizeof cd, "cd %s &&", COLT_SOURCE_DIR);
    snprintf(args, sizeof args, "--config " ENV_DIR "/mixed.yaml --report_to none --top_k 1 --shuffle_dataset false %s",
             extra);
    return run_colt_with(&(ColtRun){.env = cd, .subcommand = "train", .timeout_s = 300}, args, err);
}

static bool same_ints(const json_t *a, const json_t *b) {
    if (json_array_size(a) != json_array_size(b) || !json_is_array(a)) return false;
    for (size_t i = 0; i < json_array_size(a); i++)
        if (json_integer_value(json_array_get(a, i)) != json_integer_value(json_array_get(b, i))) return false;
    return true;
}

/* A saved reward (null: none) against TRL's (null: None / NaN). */
static bool same_reward(const json_t *colt, const json_t *trl) {
    if (json_is_null(trl)) return json_is_null(colt);
    return json_is_number(colt) && json_number_value(colt) == json_number_value(trl);
}

static json_t *step_metrics(const char *dir, int step) {
    char *path = path_join(dir, "metrics.jsonl"), *text = NULL;
    size_t len;
    json_t *found = NULL;
    if (file_read_all(path, &text, &len, NULL) == 0)
        for (char *line = strtok(text, "\n"); line && !found; line = strtok(NULL, "\n")) {
            json_t *o = json_loads(line, 0, NULL);
            if (json_integer_value(json_object_get(o, "step")) == step && json_object_get(o, "loss")) found = o;
            else json_decref(o);
        }
    free(text), free(path);
    return found;
}

static void check_parity(const char *dir, const json_t *golden) {
    char *path = path_join(dir, "checkpoint-1/trainer_state.json");
    json_t *state = json_load_file(path, 0, NULL);
    free(path);
    json_t *ro = json_object_get(state, "rollout"), *samples = json_object_get(ro, "samples");
    json_t *prompts = json_object_get(ro, "prompts"), *want = json_object_get(golden, "samples");
    const json_t *names = json_object_get(golden, "reward_names");
    CHECK(json_array_size(want) == 14 && json_array_size(names) == 3, "env_dict_goldens.json: %zu samples, %zu rewards",
          json_array_size(want), json_array_size(names));
    CHECK(json_array_size(samples) == json_array_size(want), "checkpoint-1's rollout: %zu samples, TRL %zu",
          json_array_size(samples), json_array_size(want));
    int equal = 0, none = 0, n_mul = 0; /* n_mul: samples whose prompt shows mul instead of big */
    for (size_t i = 0; i < json_array_size(want) && i < json_array_size(samples); i++) {
        json_t *s = json_array_get(samples, i), *w = json_array_get(want, i);
        json_t *p = json_array_get(prompts, (size_t)json_integer_value(json_object_get(s, "prompt")));
        bool prompt = same_ints(json_object_get(p, "ids"), json_object_get(w, "prompt_ids"));
        bool completion = same_ints(json_object_get(s, "completion"), json_object_get(w, "completion_ids"));
        bool mask = same_ints(json_object_get(s, "model_mask"), json_object_get(w, "tool_mask"));
        const json_t *per_func = json_object_get(s, "per_func"), *rewards = json_object_get(w, "rewards");
        bool rewards_equal = json_array_size(per_func) == 3;
        for (size_t k = 0; k < 3 && rewards_equal; k++) {
            const json_t *trl = json_object_get(rewards, json_string_value(json_array_get(names, k)));
            rewards_equal = same_reward(json_array_get(per_func, k), trl);
            none += json_is_null(trl);
        }
        CHECK(prompt && completion && mask && rewards_equal,
              "sample %zu (%s): prompt ids %s, completion ids %s, tool mask %s, rewards %s TRL's", i,
              json_string_value(json_object_get(w, "environment")), prompt ? "=" : "!=", completion ? "=" : "!=",
              mask ? "=" : "!=", rewards_equal ? "=" : "!=");
        equal += prompt && completion && mask && rewards_equal;
        n_mul += strcmp(json_string_value(json_object_get(w, "environment")), "mul") == 0;
    }
    CHECK(none >= 14, "only %d rewards were None in TRL: the classes' columns do not exclude each other", none);
    json_t *m = step_metrics(dir, 1);
    const json_t *trl = json_object_get(golden, "metrics");
    const char *keys[] = {"tools/call_frequency", "tools/failure_frequency"};
    for (int k = 0; k < 2; k++) {
        double a = json_number_value(json_object_get(m, keys[k])), b = json_number_value(json_object_get(trl, keys[k]));
        CHECK(json_is_number(json_object_get(m, keys[k])) && fabs(a - b) < 1e-6, "%s: colt %.8f, TRL %.8f", keys[k], a,
              b);
        printf("%s: colt %.6f, TRL %.6f\n", keys[k], a, b);
    }
    printf("dict of environments: %d of %zu greedy rollouts (prompt ids with their own tools, completion ids, tool "
           "mask, 3 rewards of which %d None) equal TRL's; %d samples of the mul environment\n",
           equal, json_array_size(want), none, n_mul);
    json_decref(m), json_decref(state);
}

static void test_train(void) {
    json_t *golden = json_load_file(AGENT "/env_dict_goldens.json", 0, NULL);
    CHECK(golden != NULL, "tests/data/agent/env_dict_goldens.json is missing");
    if (!golden) return;
    char *err = NULL, extra[1400];
    double t0 = now_s();
    snprintf(extra, sizeof extra, "--output_dir %s/run --max_steps 2 --save_steps 1", g_tmp);
    int rc = run_train(extra, &err);
    CHECK(rc == 0, "colt train with a dict of environments exited %d: %s", rc, err);
    printf("colt train, a dict of 4 environments, 2 steps: %.1f s\n", now_s() - t0);
    free(err);
    char dir[300], resumed[300];
    snprintf(dir, sizeof dir, "%s/run", g_tmp);
    if (rc == 0) check_parity(dir, golden);
    json_decref(golden);
    if (rc != 0) return;
    /* resumed inside the round (checkpoint-1 of a 2-step round): step 2 as the uninterrupted run */
    err = NULL;
    snprintf(extra, sizeof extra, "--output_dir %s/resumed --max_steps 2 --save_steps 1 --resume_from_checkpoint %s/checkpoint-1",
             g_tmp, dir);
    rc = run_train(extra, &err);
    CHECK(rc == 0, "resume with a dict of environments exited %d: %s", rc, err);
    free(err);
    /* the dict's order is its reward columns': a resume with the names in another order (the same classes,
     * named as mixed.yaml names them) is refused */
    err = NULL;
    snprintf(extra, sizeof extra, "--output_dir %s/reordered --max_steps 2 --resume_from_checkpoint %s/checkpoint-1 "
                                  "--environment_factory '{\"count\": \"examples/environments/counter.py:CountEnv\", "
                                  "\"writer\": \"examples/environments/writer.py:WriterEnv\", \"writer2\": "
                                  "\"examples/environments/writer.py:WriterEnv\", \"mul\": "
                                  "\"examples/environments/counter.py:MulEnv\"}'",
             g_tmp, dir);
    int rc2 = run_train(extra, &err);
    CHECK(rc2 != 0 && err && strstr(err, "environment_factory was {\"writer\""),
          "resume with the dict reordered: exit %d, %s", rc2, err ? err : "");
    const char *line = err ? strstr(err, "colt train: ") : NULL;
    printf("resume with the dict reordered: %s", line ? line : "\n");
    free(err);
    snprintf(resumed, sizeof resumed, "%s/resumed", g_tmp);
    json_t *a = step_metrics(dir, 2), *b = step_metrics(resumed, 2);
    const char *keys[] = {"loss", "grad_norm"};
    int same = 0;
    for (int k = 0; k < 2; k++) {
        const json_t *x = json_object_get(a, keys[k]), *y = json_object_get(b, keys[k]);
        CHECK(x && y && json_number_value(x) == json_number_value(y), "resumed step 2 %s: %g, uninterrupted %g",
              keys[k], json_number_value(y), json_number_value(x));
        same += x && y && json_number_value(x) == json_number_value(y);
    }
    CHECK(json_number_value(json_object_get(a, "loss")) != 0, "step 2's loss is 0: nothing to compare");
    printf("resumed mid-round from checkpoint-1: step 2's loss %.6g and grad_norm equal the uninterrupted run's "
           "(%d of 2)\n", json_number_value(json_object_get(a, "loss")), same);
    json_decref(a), json_decref(b);
}

/* ---------------------------------------------------------------- 3. errors */

static void expect_error(const char *what, const char *extra, const char *const *words) {
    char *err = NULL;
    int rc = run_train(extra, &err);
    bool all = err != NULL;
    for (int k = 0; all && words[k]; k++) all = strstr(err, words[k]) != NULL;
    int lines = 0;
    for (const char *c = err ? err : ""; *c; c++) lines += *c == '\n';
    CHECK(rc != 0 && rc < 128 && all && lines == 1, "%s: exit %d, %s", what, rc, err ? err : "");
    printf("%s: %s", what, err ? err : "\n");
    free(err);
}

static void test_errors(const json_t *golden) {
    /* a row naming an environment the dict does not have: TRL names it and the expected ones */
    char path[300], extra[1200];
    snprintf(path, sizeof path, "%s/chess.jsonl", g_tmp);
    FILE *fp = fopen(path, "w");
    if (fp) {
        fputs("{\"prompt\": [{\"role\": \"user\", \"content\": \"big\"}], \"a\": 1, \"b\": 2, \"environment\": \"writer\"}\n"
              "{\"prompt\": [{\"role\": \"user\", \"content\": \"big\"}], \"a\": 1, \"b\": 2, \"environment\": \"chess\"}\n",
              fp);
        fclose(fp);
    }
    const char *trl = json_string_value(json_object_get(json_object_get(golden, "errors"), "unknown_environment"));
    CHECK(trl && strstr(trl, "'chess'") && strstr(trl, "['writer', 'count', 'writer2', 'mul']"), "TRL's error: %s",
          trl ? trl : "missing");
    snprintf(extra, sizeof extra, "--output_dir %s/chess --dataset %s --generation_batch_size 4 "
                                  "--per_device_train_batch_size 2", g_tmp, path);
    expect_error("a row naming an unknown environment", extra,
                 (const char *[]){"row 1", "\"chess\"", "writer, count, writer2, mul", NULL});
    /* no environment column at all */
    snprintf(extra, sizeof extra, "--output_dir %s/nocol --dataset " ENV_DIR "/writer.jsonl --generation_batch_size 10 "
                                  "--per_device_train_batch_size 5", g_tmp);
    expect_error("rows without an environment column", extra,
                 (const char *[]){"row 0", "no 'environment'", "writer, count, writer2, mul", NULL});
    /* TRL: a dict needs a dataset (no placeholder prompts) */
    trl = json_string_value(json_object_get(json_object_get(golden, "errors"), "dict_without_dataset"));
    CHECK(trl && strstr(trl, "requires a `train_dataset` with an `environment` column"), "TRL's error: %s",
          trl ? trl : "missing");
    snprintf(extra, sizeof extra, "--output_dir %s/nodata --dataset null", g_tmp);
    expect_error("a dict without a dataset", extra, (const char *[]){"needs a 'dataset' with an 'environment' column", NULL});
    /* bad forms of the mapping */
    snprintf(extra, sizeof extra, "--output_dir %s/bad --environment_factory '{}'", g_tmp);
    expect_error("an empty mapping", extra, (const char *[]){"'environment_factory' is an empty mapping", NULL});
    snprintf(extra, sizeof extra, "--output_dir %s/bad --environment_factory '{\"math\": 3}'", g_tmp);
    expect_error("a class that is not a name", extra, (const char *[]){"environment_factory.math must name a Python class", NULL});
    snprintf(extra, sizeof extra, "--output_dir %s/bad --environment_factory '{\"math\": '", g_tmp);
    expect_error("broken JSON", extra, (const char *[]){"'environment_factory' starts with '{' but is not a JSON mapping", NULL});
    snprintf(extra, sizeof extra, "--output_dir %s/bad --environment_factory '{\"math\": \"nofile.py:Env\"}'", g_tmp);
    expect_error("a missing file", extra, (const char *[]){"environment_factory[\"math\"]", "nofile.py not found", NULL});
}

int main(void) {
    if (system("python3 -c 'import transformers' >/dev/null 2>&1") != 0) {
        printf("SKIP: python3 with transformers is needed for the tool worker\n");
        return 77;
    }
    snprintf(g_tmp, sizeof g_tmp, "/tmp/colt_agent_envs_XXXXXX");
    if (!mkdtemp(g_tmp)) return 1;
    double t0 = now_s();
    test_worker();
    printf("tool worker: %.1f s\n", now_s() - t0);
    test_train();
    json_t *golden = json_load_file(AGENT "/env_dict_goldens.json", 0, NULL);
    test_errors(golden);
    json_decref(golden);
    printf("all: %.1f s\n", now_s() - t0);
    if (g_failures == 0) sh("rm -rf %s", g_tmp);
    else fprintf(stderr, "kept %s\n", g_tmp);
    printf("%d checks, %d failures\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
