/* test_dynamic_sampling.c — DAPO's dynamic sampling (dynamic_sampling, max_num_gen_batches; veRL's
 * algorithm.filter_groups) end to end on the CPU with the real stories260K and a Python reward keyed on a
 * dataset column: the "easy" prompts score 1 whatever the completion (their groups always agree), the others
 * 1 when the completion says "the".
 *   - rounds are refilled: no trained group is uniform (every logged completion of every round, its group's
 *     rewards compared), no easy prompt is trained on, frac_reward_zero_std is 0, num_gen_batches > 1 in some
 *     round, and num_dropped_groups accounts for the extra batches;
 *   - the same seed gives the same run (metrics and final weights byte for byte), and a resume from
 *     checkpoint-2 goes on as the uninterrupted run (the extra batches' prompts and RNG streams included);
 *   - when every group agrees, the run stops after max_num_gen_batches with one error line (veRL raises);
 *   - dynamic_sampling with async_generation is refused.
 * Exits 77 (skipped) without python3. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fileio.h"
#include "harness.h"

#define STEPS 4
#define G 4
#define P 2 /* prompts per round: per_device_train_batch_size 8 / num_generations 4 */

static const char REWARDS_PY[] =
    "def easy_or_the(prompts, completions, easy, **kwargs):\n"
    "    return [1.0 if e else float(' the ' in ' ' + c + ' ') for c, e in zip(completions, easy)]\n"
    "def constant(prompts, completions, **kwargs):\n"
    "    return [0.5 for _ in completions]\n";

static char g_args[1024];

static int run(const char *extra, char **err_out) {
    char args[4096];
    snprintf(args, sizeof args, "%s %s", g_args, extra);
    return run_colt_with(&(ColtRun){.subcommand = "train"}, args, err_out);
}

/* completions.jsonl holds every completion of each round (log_completions_count = the round's size), a group
 * being G consecutive lines of one prompt: counts the lines, the groups whose rewards all agree and the
 * completions of easy prompts. */
static void check_trained_groups(const char *dir, int *lines, int *uniform, int *easy, int *bad_groups) {
    *lines = *uniform = *easy = *bad_groups = 0;
    char *text = read_text(dir, "completions.jsonl");
    char prompt[G][512];
    double reward[G];
    int in_group = 0;
    for (char *line = text ? strtok(text, "\n") : NULL; line; line = strtok(NULL, "\n")) {
        json_t *o = json_loads(line, 0, NULL);
        const char *p = json_string_value(json_object_get(o, "prompt"));
        snprintf(prompt[in_group], sizeof prompt[in_group], "%s", p ? p : "");
        reward[in_group] = json_number_value(json_object_get(o, "reward"));
        *easy += strstr(prompt[in_group], "EASY") != NULL;
        (*lines)++;
        if (++in_group == G) {
            bool same_prompt = true, agree = true;
            for (int g = 1; g < G; g++) {
                same_prompt &= strcmp(prompt[g], prompt[0]) == 0;
                agree &= reward[g] == reward[0];
            }
            *bad_groups += !same_prompt;
            *uniform += agree;
            in_group = 0;
        }
        json_decref(o);
    }
    *bad_groups += in_group != 0;
    free(text);
}

int main(void) {
    if (system("command -v python3 >/dev/null 2>&1") != 0) {
        printf("SKIP test_dynamic_sampling: python3 not found\n");
        return 77;
    }
    double t0 = now_s();
    snprintf(g_tmp, sizeof g_tmp, "/tmp/colt_test_dynamic_sampling_XXXXXX");
    if (!mkdtemp(g_tmp)) return 1;
    char *py = path_join(g_tmp, "rewards.py"), *data = path_join(g_tmp, "prompts.jsonl");
    char rows[4096] = "";
    const char *animals[8] = {"girl", "boy", "dog", "cat", "bird", "fox", "frog", "bear"};
    for (int i = 0; i < 8; i++) /* rows 0, 2, 4, 6 easy */
        snprintf(rows + strlen(rows), sizeof rows - strlen(rows),
                 "{\"prompt\": \"Once upon a time, there was a little %s%s.\", \"easy\": %s}\n", animals[i],
                 i % 2 == 0 ? " called EASY" : "", i % 2 == 0 ? "true" : "false");
    CHECK(file_write_atomic(py, REWARDS_PY, strlen(REWARDS_PY), NULL) == 0 &&
              file_write_atomic(data, rows, strlen(rows), NULL) == 0,
          "cannot write the test's files in %s", g_tmp);
    snprintf(g_args, sizeof g_args,
             "--config examples/demo.yaml --dataset %s --eval_dataset null --num_generations %d "
             "--per_device_train_batch_size %d --max_completion_length 16 --max_steps %d --logging_steps 1 "
             "--log_completions_count %d --save_steps 2 --save_total_limit 0 --warmup_steps 0 --dynamic_sampling true",
             data, G, G * P, STEPS, G * P);

    /* 1. refilled rounds */
    char a_dir[300], b_dir[300], extra[2048], *err;
    snprintf(a_dir, sizeof a_dir, "%s/a", g_tmp);
    snprintf(b_dir, sizeof b_dir, "%s/b", g_tmp);
    char reward_arg[512];
    snprintf(reward_arg, sizeof reward_arg, "--reward_funcs '[\"%s:easy_or_the\"]'", py);
    snprintf(extra, sizeof extra, "%s --output_dir %s", reward_arg, a_dir);
    int code = run(extra, &err);
    CHECK(code == 0, "dynamic sampling run: exit %d: %s", code, err);
    free(err);
    double batches[STEPS], dropped[STEPS], zero_std[STEPS];
    metric_by_step(batches, STEPS, a_dir, "num_gen_batches");
    metric_by_step(dropped, STEPS, a_dir, "num_dropped_groups");
    metric_by_step(zero_std, STEPS, a_dir, "frac_reward_zero_std");
    int refilled = 0;
    for (int s = 0; s < STEPS; s++) {
        printf("step %d: %g generation batches, %g groups dropped, frac_reward_zero_std %g\n", s + 1, batches[s],
               dropped[s], zero_std[s]);
        CHECK(batches[s] >= 1 && batches[s] <= 10, "step %d: num_gen_batches %g", s + 1, batches[s]);
        /* the batches before the last kept fewer than P groups: each dropped at least one */
        CHECK(dropped[s] >= (batches[s] - 1) * P - (P - 1), "step %d: %g batches but only %g groups dropped", s + 1,
              batches[s], dropped[s]);
        CHECK(zero_std[s] == 0, "step %d: frac_reward_zero_std %g: a uniform group was trained on", s + 1,
              zero_std[s]);
        refilled += batches[s] > 1;
    }
    CHECK(refilled > 0, "no round needed a second generation batch: the refill is untested");
    int lines, uniform, easy, bad_groups;
    check_trained_groups(a_dir, &lines, &uniform, &easy, &bad_groups);
    printf("completions.jsonl: %d completions trained on (%d rounds), %d uniform groups, %d of easy prompts\n", lines,
           lines / (G * P), uniform, easy);
    CHECK(lines == STEPS * G * P && bad_groups == 0, "completions.jsonl: %d lines, %d malformed groups", lines,
          bad_groups);
    CHECK(uniform == 0 && easy == 0, "%d uniform groups and %d easy completions were trained on", uniform, easy);

    /* 2. the same seed, the same run */
    snprintf(extra, sizeof extra, "%s --output_dir %s", reward_arg, b_dir);
    code = run(extra, &err);
    CHECK(code == 0, "second run: exit %d: %s", code, err);
    free(err);
    char *ma = metrics_without_timing(a_dir), *mb = metrics_without_timing(b_dir);
    bool same_metrics = strcmp(ma, mb) == 0, same_model = same_file(a_dir, b_dir, "model.safetensors");
    printf("same seed twice: metrics equal: %s, final weights identical: %s\n", same_metrics ? "yes" : "NO",
           same_model ? "yes" : "NO");
    CHECK(same_metrics && same_model, "runs differ:\n--- a\n%s--- b\n%s", ma, mb);
    free(ma), free(mb);
    char r_dir[300];
    snprintf(r_dir, sizeof r_dir, "%s/resumed", g_tmp);
    snprintf(extra, sizeof extra, "%s --output_dir %s --resume_from_checkpoint %s/checkpoint-2", reward_arg, r_dir,
             a_dir);
    code = run(extra, &err);
    CHECK(code == 0, "resume: exit %d: %s", code, err);
    free(err);
    char *mu = metrics_without_timing(a_dir), *mr = metrics_without_timing(r_dir), *tail = mu;
    for (int k = 0; k < 2 && tail; k++) tail = strchr(tail, '\n') ? strchr(tail, '\n') + 1 : NULL;
    bool same_tail = tail && strcmp(tail, mr) == 0 && count_lines(mr) == 2;
    bool same_final = same_file(a_dir, r_dir, "model.safetensors");
    printf("resume from checkpoint-2: steps 3-4 equal: %s, final weights identical: %s\n", same_tail ? "yes" : "NO",
           same_final ? "yes" : "NO");
    CHECK(same_tail && same_final, "resumed run differs:\n--- uninterrupted\n%s--- resumed\n%s", tail ? tail : "",
          mr);
    free(mu), free(mr);

    /* 3. every group agrees: the bound stops the run */
    char c_dir[300];
    snprintf(c_dir, sizeof c_dir, "%s/c", g_tmp);
    snprintf(extra, sizeof extra, "--reward_funcs '[\"%s:constant\"]' --max_num_gen_batches 3 --output_dir %s", py,
             c_dir);
    code = run(extra, &err);
    /* stderr: the run's progress lines, then the error in one line */
    const char *last = err;
    for (const char *nl = strchr(err, '\n'); nl && nl[1]; nl = strchr(nl + 1, '\n')) last = nl + 1;
    printf("constant reward, max_num_gen_batches 3: exit %d: %s", code, last);
    CHECK(code != 0 && code < 128 && count_lines(last) == 1, "bound: exit %d: %s", code, err);
    CHECK(strstr(last, "step 1: dynamic_sampling kept 0 of the 2 groups") && strstr(last, "after 3 generation batches") &&
              strstr(last, "6 groups had rewards that all agree") && strstr(last, "max_num_gen_batches"),
          "bound: the error does not say what happened: %s", last);
    free(err);

    /* 4. not with async_generation */
    snprintf(extra, sizeof extra, "%s --output_dir %s --vllm_mode server --async_generation true", reward_arg, c_dir);
    code = run(extra, &err);
    CHECK(code != 0 && code < 128 && strstr(err, "dynamic_sampling with async_generation"), "async: exit %d: %s",
          code, err);
    printf("with async_generation: exit %d: %s", code, err);
    free(err);

    free(py), free(data);
    sh("rm -rf %s", g_tmp);
    printf("%d checks, %d failed (%.1f s)\n", g_checks, g_failures, now_s() - t0);
    return g_failures ? 1 : 0;
}
