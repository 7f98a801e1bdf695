/* test_python_reward_train.c — `colt train` end to end on the CPU with TRL
 * users' Python reward functions: the TRL write-up's reward_len and a function
 * that reads a dataset column, named "rewards.py:FUNCTION" relative to the
 * current directory (a temporary one, so the binary must carry its worker).
 * Two steps on the demo config, then:
 *   - every logged and evaluated completion's reward equals -abs(20 - len(completion))
 *     (reward_weights [1, 0]: the column function counts in metrics only);
 *   - metrics.jsonl has rewards/reward_len/mean and rewards/says_name/mean;
 *   - a function that raises stops the run with the function named and the
 *     exception's last line; a missing function fails before any work.
 * Exits 77 (skipped) without python3. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/fileio.h"
#include "harness.h"

static const char REWARDS_PY[] =
    "def reward_len(completions, **kwargs):\n"
    "    return [-abs(20 - len(completion)) for completion in completions]\n"
    "\n"
    "def says_name(prompts, completions, completion_ids, name, **kwargs):\n"
    "    assert all(isinstance(p, str) for p in prompts) and len(name) == len(completions), (prompts, name)\n"
    "    assert all(ids and all(isinstance(i, int) for i in ids) for ids in completion_ids), completion_ids\n"
    "    return [1.0 if n in c else 0.0 for n, c in zip(name, completions)]\n"
    "\n"
    "def divide(completions, **kwargs):\n"
    "    return [len(c) / 0 for c in completions]\n";

/* Small, fast settings on the demo config, from the temporary directory. */
static const char *ARGS =
    "--config " COLT_SOURCE_DIR "/examples/demo.yaml --model " COLT_SOURCE_DIR "/models/stories260K "
    "--dataset " COLT_SOURCE_DIR "/examples/data/demo_train.jsonl --eval_dataset " COLT_SOURCE_DIR
    "/examples/data/demo_eval.jsonl --max_steps 2 --per_device_train_batch_size 16 --max_completion_length 24 "
    "--num_eval_prompts 4 --logging_steps 1 --log_completions_count 4 --save_total_limit 0";

/* Runs colt train in g_tmp with ARGS and extra; its stderr in *err_out. */
static int run(const char *extra, char **err_out) {
    char cd[300], args[4096];
    snprintf(cd, sizeof cd, "cd %s &&", g_tmp);
    snprintf(args, sizeof args, "%s %s", ARGS, extra);
    return run_colt_with(&(ColtRun){.env = cd, .subcommand = "train"}, args, err_out);
}

/* Code points, as Python's len(str). */
static int code_points(const char *s) {
    int n = 0;
    for (; *s; s++) n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

/* Every line {"completion", "reward"} of dir/name scores -abs(20 - len). */
static int check_rewards(const char *dir, const char *name) {
    char *path = path_join(dir, name), *text = NULL;
    size_t len;
    int lines = 0, equal = 0;
    if (file_read_all(path, &text, &len, NULL) == 0) {
        for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
            json_t *o = json_loads(line, 0, NULL);
            const char *completion = json_string_value(json_object_get(o, "completion"));
            json_t *reward = json_object_get(o, "reward");
            double want = completion ? -fabs(20.0 - code_points(completion)) : NAN;
            int same = json_is_number(reward) && json_number_value(reward) == want;
            lines++, equal += same;
            CHECK(same, "%s line %d: reward %g for \"%s\", want %g", name, lines,
                  json_is_number(reward) ? json_number_value(reward) : NAN, completion ? completion : "(none)", want);
            json_decref(o);
        }
    }
    CHECK(lines > 0, "%s: no completions", name);
    printf("%-18s %d/%d completions score -abs(20 - len(completion))\n", name, equal, lines);
    free(text);
    free(path);
    return lines;
}

static void test_train(void) {
    char *err = NULL;
    int rc = run("--output_dir run --reward_funcs '[\"rewards.py:reward_len\", \"rewards.py:says_name\"]' "
                 "--reward_weights '[1, 0]'",
                 &err);
    CHECK(rc == 0, "colt train with python rewards exited %d: %s", rc, err);
    free(err);
    if (rc != 0) return;
    char dir[300];
    snprintf(dir, sizeof dir, "%s/run", g_tmp);
    check_rewards(dir, "completions.jsonl");
    check_rewards(dir, "eval_before.jsonl");
    check_rewards(dir, "eval_after.jsonl");
    char *path = path_join(dir, "metrics.jsonl"), *text = NULL;
    size_t len;
    int steps = 0;
    if (file_read_all(path, &text, &len, NULL) == 0) {
        for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
            json_t *o = json_loads(line, 0, NULL);
            json_t *len_mean = json_object_get(o, "rewards/reward_len/mean");
            json_t *name_mean = json_object_get(o, "rewards/says_name/mean");
            json_t *reward = json_object_get(o, "reward");
            if (json_object_get(o, "step") && reward) {
                steps++;
                CHECK(json_is_number(len_mean) && json_is_number(name_mean) &&
                          json_number_value(len_mean) == json_number_value(reward) &&
                          json_number_value(name_mean) >= 0 && json_number_value(name_mean) <= 1,
                      "metrics step %d: rewards/reward_len/mean %g, reward %g, rewards/says_name/mean %g", steps,
                      json_number_value(len_mean), json_number_value(reward), json_number_value(name_mean));
                printf("metrics step %d: rewards/reward_len/mean %.4f, rewards/says_name/mean %.4f\n", steps,
                       json_number_value(len_mean), json_number_value(name_mean));
            }
            json_decref(o);
        }
    }
    CHECK(steps == 2, "metrics.jsonl: %d steps with rewards, want 2", steps);
    free(text);
    free(path);
}

static void test_errors(void) {
    /* Raises at the first scoring (the eval before training): named, one line. */
    char *err = NULL;
    int rc = run("--output_dir run_divide --reward_funcs '[\"rewards.py:divide\"]'", &err);
    CHECK(rc != 0 && strstr(err, "reward 'divide' (rewards.py): ZeroDivisionError: division by zero"),
          "a raising function: exit %d, stderr: %s", rc, err);
    char *last = err ? strstr(err, "reward 'divide' (rewards.py): ZeroDivisionError") : NULL;
    if (last) printf("raising function   -> %.*s\n", (int)strcspn(last, "\n"), last);
    free(err);
    /* A missing function: before any work, no metrics written. */
    rc = run("--output_dir run_missing --reward_funcs '[\"rewards.py:nope\"]'", &err);
    char metrics[400];
    snprintf(metrics, sizeof metrics, "%s/run_missing/metrics.jsonl", g_tmp);
    struct stat st;
    CHECK(rc != 0 && strstr(err, "reward 'nope' (rewards.py): rewards.py has no function 'nope'") &&
              !strstr(err, "eval before training") && stat(metrics, &st) != 0,
          "a missing function: exit %d, stderr: %s", rc, err);
    last = err ? strstr(err, "reward 'nope'") : NULL;
    if (last) printf("missing function   -> %.*s\n", (int)strcspn(last, "\n"), last);
    free(err);
}

int main(void) {
    if (system("command -v python3 >/dev/null 2>&1") != 0) {
        printf("SKIP test_python_reward_train: python3 not found\n");
        return 77;
    }
    snprintf(g_tmp, sizeof g_tmp, "/tmp/colt-test-pytrain-XXXXXX");
    if (!mkdtemp(g_tmp)) {
        perror("mkdtemp");
        return 1;
    }
    char *py = path_join(g_tmp, "rewards.py");
    FILE *f = fopen(py, "w");
    if (!f || fputs(REWARDS_PY, f) < 0 || fclose(f) != 0) {
        fprintf(stderr, "cannot write %s\n", py);
        return 1;
    }
    free(py);
    test_train();
    test_errors();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_tmp);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_tmp);
    printf("%s: %d checks, %d failed\n", g_failures ? "FAIL" : "OK", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
