/* test_train.c — `colt train` end to end on the CPU with the real
 * stories260K and the demo's "park" reward:
 *   - learning: the held-out reward rises by at least LEARN_MARGIN;
 *   - reproducibility: two runs with the same seed write identical metrics
 *     (timing fields aside) and byte-identical final weights;
 *   - SIGINT finishes the step, saves a checkpoint and exits 0, and resuming
 *     from it reproduces the uninterrupted run's metrics and weights exactly
 *     (rounds span two optimizer steps, so the checkpoint falls mid-round);
 *   - a reward program that crashes stops training with a clear error after a
 *     checkpoint is saved;
 *   - TRL 1.16's entropy mask, off-policy mask, plain-k3 KL and adaptive
 *     entropy bonus in one short run: the controller's entropy_coef per step,
 *     the bonus equal to the saved world entropy, the mask's effect, and a
 *     resume that restores the controller (entropy_ctrl_state.json);
 *   - bad settings and data give one-line errors before any work. */
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/fileio.h"
#include "harness.h"
#include "train/grpo.h"

#define LEARN_MARGIN 0.30

/* Small, fast settings on top of the demo config. */
static const char *BASE =
    "--config examples/demo.yaml --per_device_train_batch_size 16 --max_completion_length 24 "
    "--num_eval_prompts 8 --logging_steps 1 --log_completions_count 0 --save_total_limit 0";

static int run(const char *args, char **err_out) {
    return run_colt_with(&(ColtRun){.subcommand = "train"}, args, err_out);
}

static double summary_value(const char *dir, const char *key) {
    char *p = path_join(dir, "summary.json");
    json_t *o = json_load_file(p, 0, NULL);
    free(p);
    double v = o && json_is_number(json_object_get(o, key)) ? json_number_value(json_object_get(o, key)) : NAN;
    json_decref(o);
    return v;
}

static void expect_error(const char *name, const char *args, const char *needle) {
    char *err;
    int code = run(args, &err);
    CHECK(code != 0 && code < 128, "%s: exit %d", name, code);
    CHECK(count_lines(err) == 1, "%s: %d stderr lines: %s", name, count_lines(err), err);
    CHECK(strstr(err, needle) != NULL, "%s: '%s' lacks '%s'", name, err, needle);
    printf("  bad input %-34s -> exit %d: %s", name, code, err);
    free(err);
}

/* The demo model's entropies are far below entropy_target 10 (at most log 512 = 6.24 nats), so TRL's
 * controller raises entropy_coef by entropy_coef_delta every step and applies the previous step's value
 * from step 2 on; with one micro-batch per step the bonus is then exactly that coefficient times the
 * step's mean entropy over the top half of the tokens, which is the world entropy the controller saves. */
static void test_masks_and_entropy_bonus(void) {
    char m_dir[300], plain_dir[300], r_dir[300], args[4096], *err;
    const char *opts = "--max_steps 3 --save_steps 2 --eval_dataset null --top_entropy_quantile 0.5 "
                       "--use_bias_correction_kl false --use_adaptive_entropy true --entropy_coef 0.01 "
                       "--entropy_coef_delta 0.005 --entropy_target 10";
    snprintf(m_dir, sizeof m_dir, "%s/masks", g_tmp);
    snprintf(plain_dir, sizeof plain_dir, "%s/masks_no_off_policy", g_tmp);
    snprintf(r_dir, sizeof r_dir, "%s/masks_resumed", g_tmp);
    snprintf(args, sizeof args, "%s %s --off_policy_mask_threshold 0 --output_dir %s", BASE, opts, m_dir);
    int code = run(args, &err);
    CHECK(code == 0, "masks run: exit %d: %s", code, err);
    free(err);
    snprintf(args, sizeof args, "%s %s --output_dir %s", BASE, opts, plain_dir);
    code = run(args, &err);
    CHECK(code == 0, "masks run without the off-policy mask: exit %d: %s", code, err);
    free(err);
    double coef[3], loss[3], policy[3], entropy[3], kl[3], plain_policy[3];
    metric_by_step(coef, 3, m_dir, "entropy_coef");
    metric_by_step(loss, 3, m_dir, "loss");
    metric_by_step(policy, 3, m_dir, "policy_loss");
    metric_by_step(entropy, 3, m_dir, "entropy");
    metric_by_step(kl, 3, m_dir, "kl");
    metric_by_step(plain_policy, 3, plain_dir, "policy_loss");
    for (int k = 0; k < 3; k++) {
        CHECK(fabs(coef[k] - (0.01 + 0.005 * (k + 1))) < 1e-9, "step %d: entropy_coef %g, want %g", k + 1, coef[k],
              0.01 + 0.005 * (k + 1));
        CHECK(isfinite(policy[k]) && isfinite(loss[k]) && kl[k] >= 0.0, "step %d: policy_loss %g loss %g kl %g",
              k + 1, policy[k], loss[k], kl[k]);
    }
    /* step 1: no measurement yet, no bonus; step 2: the bonus is 0.015 x the window's entropy */
    CHECK(fabs(loss[0] - policy[0]) <= 1e-6 * fabs(policy[0]) + 1e-9, "step 1: loss %g != policy_loss %g (no bonus "
          "before the first measurement)", loss[0], policy[0]);
    double bonus_entropy = (policy[1] - loss[1]) / 0.015;
    char *state = read_text(m_dir, "checkpoint-2/entropy_ctrl_state.json");
    json_t *st = state ? json_loads(state, 0, NULL) : NULL;
    double saved_coef = json_number_value(json_object_get(st, "entropy_coef"));
    double saved_entropy = json_number_value(json_object_get(st, "last_world_entropy"));
    printf("masks: entropy_coef %.3f %.3f %.3f; step 2's bonus entropy %.5f (saved world entropy %.5f, mean entropy "
           "of every token %.5f); policy_loss at step 1 %.6g, %.6g without the off-policy mask\n",
           coef[0], coef[1], coef[2], bonus_entropy, saved_entropy, entropy[1], policy[0], plain_policy[0]);
    CHECK(st && fabs(saved_coef - 0.02) < 1e-12, "checkpoint-2/entropy_ctrl_state.json: %s", state ? state : "missing");
    CHECK(fabs(bonus_entropy - saved_entropy) <= 1e-4 * saved_entropy, "step 2's bonus entropy %g != the saved "
          "world entropy %g", bonus_entropy, saved_entropy);
    /* the entropy mask keeps the high-entropy half: its mean is above every token's mean */
    CHECK(saved_entropy > entropy[1] && saved_entropy <= log(512.0), "masked entropy %g vs all tokens' %g",
          saved_entropy, entropy[1]);
    CHECK(plain_policy[0] != policy[0], "the off-policy mask (threshold 0) changed nothing at step 1");
    json_decref(st);
    free(state);

    snprintf(args, sizeof args, "%s %s --off_policy_mask_threshold 0 --output_dir %s --resume_from_checkpoint "
             "%s/checkpoint-2", BASE, opts, r_dir, m_dir);
    code = run(args, &err);
    CHECK(code == 0, "masks resume: exit %d: %s", code, err);
    free(err);
    char *mu = metrics_without_timing(m_dir), *mr = metrics_without_timing(r_dir);
    char *tail = mu;
    for (int k = 0; k < 2 && tail; k++) tail = strchr(tail, '\n') ? strchr(tail, '\n') + 1 : NULL;
    bool same = tail && mr && strcmp(tail, mr) == 0 && count_lines(mr) == 1;
    printf("masks: resumed from checkpoint-2, step 3 equal to the uninterrupted run's: %s\n", same ? "yes" : "NO");
    CHECK(same, "resumed step 3 differs:\n--- uninterrupted\n%s--- resumed\n%s", tail ? tail : "", mr ? mr : "");
    free(mu), free(mr);
}

/* multi_objective_aggregation: the logged advantages of one round (16 completions, groups of 8, the park reward
 * alone) are grpo.c's for the logged rewards (test_grpo_loss checks those against TRL's own code), in both
 * modes, and the two modes differ (normalize_then_sum divides by the batch's std after the groups'). */
static void test_multi_objective_aggregation(void) {
    static const char *const modes[] = {"sum_then_normalize", "normalize_then_sum"};
    float logged[2][16], rewards[16];
    int ok[2] = {0, 0}, n = 0;
    for (int m = 0; m < 2; m++) {
        char args[1024], dir[300], *err = NULL;
        snprintf(dir, sizeof dir, "%s/aggregation_%d", g_tmp, m);
        snprintf(args, sizeof args,
                 "%s --max_completion_length 48 --max_steps 1 --eval_dataset null --log_completions_count 16 "
                 "--multi_objective_aggregation %s --output_dir %s",
                 BASE, modes[m], dir);
        int code = run(args, &err);
        CHECK(code == 0, "%s: exit %d: %s", modes[m], code, err);
        free(err);
        char *text = read_text(dir, "completions.jsonl");
        n = 0;
        for (char *line = text ? strtok(text, "\n") : NULL; line && n < 16; line = strtok(NULL, "\n"), n++) {
            json_t *o = json_loads(line, 0, NULL);
            rewards[n] = (float)json_number_value(json_object_get(o, "reward"));
            logged[m][n] = (float)json_number_value(json_object_get(o, "advantage"));
            json_decref(o);
        }
        free(text);
        CHECK(n == 16, "%s: %d completions logged, want 16", modes[m], n);
        if (n != 16) return;
        float want[16], std[2], scale = 1.0f, weight = 1.0f;
        if (m == 0) grpo_advantages(want, std, rewards, 16, 8, SCALE_GROUP);
        else grpo_advantages_normalize_then_sum(want, std, rewards, &weight, 16, 1, 8);
        for (int i = 0; i < 16; i++) scale = fmaxf(scale, fabsf(want[i]));
        for (int i = 0; i < 16; i++) ok[m] += fabsf(logged[m][i] - want[i]) <= 1e-5f * scale;
    }
    int moved = 0;
    for (int i = 0; i < 16; i++) moved += fabsf(logged[0][i] - logged[1][i]) > 1e-3f;
    printf("multi_objective_aggregation: logged advantages as grpo.c computes them: %d/16 (sum_then_normalize), "
           "%d/16 (normalize_then_sum); %d differ between the modes\n", ok[0], ok[1], moved);
    CHECK(ok[0] == 16 && ok[1] == 16, "advantages: %d and %d of 16 as computed from the logged rewards", ok[0], ok[1]);
    CHECK(moved > 0, "the two modes gave the same advantages: every group's rewards were equal (nothing tested)");
}

int main(void) {
    snprintf(g_tmp, sizeof g_tmp, "/tmp/colt_test_train_XXXXXX");
    if (!mkdtemp(g_tmp)) return 1;
    char args[4096], a_dir[300], b_dir[300], u_dir[300], i_dir[300], *err;

    /* 1. learning, and 2. the same seed twice */
    snprintf(a_dir, sizeof a_dir, "%s/a", g_tmp);
    snprintf(b_dir, sizeof b_dir, "%s/b", g_tmp);
    snprintf(args, sizeof args, "%s --max_steps 12 --output_dir %s", BASE, a_dir);
    int code = run(args, &err);
    CHECK(code == 0, "training run: exit %d: %s", code, err);
    free(err);
    double before = summary_value(a_dir, "eval_reward_before"), after = summary_value(a_dir, "eval_reward_after");
    printf("learning: held-out reward %.3f -> %.3f after 12 steps (gain %.3f, required >= %.2f)\n", before, after,
           after - before, LEARN_MARGIN);
    CHECK(after - before >= LEARN_MARGIN, "held-out reward gain %.3f < %.2f", after - before, LEARN_MARGIN);
    const char *outputs[] = {"metrics.jsonl", "summary.json", "reward_curve.svg", "eval_before.jsonl",
                             "eval_after.jsonl", "model.safetensors", "config.json", "tokenizer.json"};
    for (int i = 0; i < 8; i++) {
        char *p = path_join(a_dir, outputs[i]);
        CHECK(file_exists(p), "missing output %s", outputs[i]);
        free(p);
    }
    char *metrics_a = metrics_without_timing(a_dir);
    CHECK(count_lines(metrics_a) == 12, "metrics.jsonl has %d lines, want 12", count_lines(metrics_a));
    const char *names[] = {"\"reward\"", "\"reward_std\"", "\"rewards/park/mean\"", "\"frac_reward_zero_std\"",
                           "\"completions/mean_length\"", "\"completions/clipped_ratio\"", "\"entropy\"",
                           "\"clip_ratio/region_mean\"", "\"loss\"", "\"grad_norm\"", "\"learning_rate\"",
                           "\"num_tokens\"", "\"step\"", "\"sampling/sampling_logp_difference/mean\"",
                           "\"sampling/importance_sampling_ratio/mean\"", "\"engine/kv_pool_gb\""};
    for (int i = 0; i < 16; i++) CHECK(strstr(metrics_a, names[i]), "metric %s not logged", names[i]);

    snprintf(args, sizeof args, "%s --max_steps 12 --output_dir %s", BASE, b_dir);
    code = run(args, &err);
    free(err);
    char *metrics_b = metrics_without_timing(b_dir);
    bool same_metrics = strcmp(metrics_a, metrics_b) == 0;
    bool same_weights = same_file(a_dir, b_dir, "model.safetensors");
    printf("reproducible: same seed -> identical metrics: %s, identical weights: %s\n", same_metrics ? "yes" : "NO",
           same_weights ? "yes" : "NO");
    CHECK(code == 0 && same_metrics && same_weights, "two runs with the same seed differ");
    free(metrics_a), free(metrics_b);

    /* 2b. deterministic mode: every step's engine/trainer log-prob difference is exactly 0 and the IS ratio
     * exactly 1 (the default run above logs a non-zero difference: the comparison is real). */
    char d_dir[300];
    snprintf(d_dir, sizeof d_dir, "%s/det", g_tmp);
    snprintf(args, sizeof args, "%s --max_steps 3 --eval_dataset null --deterministic true --output_dir %s", BASE,
             d_dir);
    code = run(args, &err);
    CHECK(code == 0, "deterministic run: exit %d: %s", code, err);
    free(err);
    double det_max = -1, det_ratio_min = 2, det_ratio_max = 0, default_max = 0;
    const char *dirs[2] = {d_dir, a_dir};
    for (int d = 0; d < 2; d++) {
        char *text = read_text(dirs[d], "metrics.jsonl");
        for (char *line = text ? strtok(text, "\n") : NULL; line; line = strtok(NULL, "\n")) {
            json_t *o = json_loads(line, 0, NULL);
            double diff = json_number_value(json_object_get(o, "sampling/sampling_logp_difference/max"));
            if (d == 0) {
                det_max = fmax(det_max, diff);
                det_ratio_min = fmin(det_ratio_min, json_number_value(json_object_get(o, "sampling/importance_sampling_ratio/min")));
                det_ratio_max = fmax(det_ratio_max, json_number_value(json_object_get(o, "sampling/importance_sampling_ratio/max")));
            } else {
                default_max = fmax(default_max, diff);
            }
            json_decref(o);
        }
        free(text);
    }
    printf("deterministic: engine vs trainer log-prob difference max %g (default run: %g), IS ratio %g..%g\n",
           det_max, default_max, det_ratio_min, det_ratio_max);
    CHECK(det_max == 0.0, "deterministic mode: log-prob difference %g, want exactly 0", det_max);
    CHECK(det_ratio_min == 1.0 && det_ratio_max == 1.0, "deterministic mode: IS ratio %g..%g, want 1", det_ratio_min,
          det_ratio_max);
    CHECK(default_max > 0.0, "the default run logs no log-prob difference: the comparison would be vacuous");

    /* 3. SIGINT, checkpoint, resume == uninterrupted. Rounds of 2 steps (steps_per_generation 2). */
    const char *resume_cfg = "--max_steps 8 --steps_per_generation 2 --save_steps 3 --eval_dataset null";
    snprintf(u_dir, sizeof u_dir, "%s/uninterrupted", g_tmp);
    snprintf(i_dir, sizeof i_dir, "%s/interrupted", g_tmp);
    snprintf(args, sizeof args, "%s %s --output_dir %s", BASE, resume_cfg, u_dir);
    code = run(args, &err);
    CHECK(code == 0, "uninterrupted run: %s", err);
    free(err);

    char cmd[4096];
    /* exec: the signal must reach colt itself, not a shell around it. */
    snprintf(cmd, sizeof cmd, "exec %s train %s %s --output_dir %s", COLT_BINARY, BASE, resume_cfg, i_dir);
    pid_t pid = start_command(cmd, NULL, NULL);
    wait_for_metric_lines(i_dir, 3, 120); /* interrupt once three steps are logged (an odd step: mid-round) */
    kill(pid, SIGINT);
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "interrupted run did not exit 0 (status %d)", status);
    int ckpt = newest_checkpoint(i_dir);
    printf("SIGINT: exit %d, checkpoint saved at step %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1, ckpt);
    CHECK(ckpt >= 1 && ckpt < 8, "no checkpoint after SIGINT");
    snprintf(args, sizeof args, "%s %s --output_dir %s --resume_from_checkpoint %s/checkpoint-%d", BASE, resume_cfg,
             i_dir, i_dir, ckpt);
    code = run(args, &err);
    CHECK(code == 0, "resume: exit %d: %s", code, err);
    free(err);
    char *mu = metrics_without_timing(u_dir), *mi = metrics_without_timing(i_dir);
    same_metrics = strcmp(mu, mi) == 0 && count_lines(mu) == 8;
    same_weights = same_file(u_dir, i_dir, "model.safetensors");
    printf("resume from checkpoint-%d: metrics equal to the uninterrupted run: %s, final weights identical: %s\n", ckpt,
           same_metrics ? "yes" : "NO", same_weights ? "yes" : "NO");
    CHECK(same_metrics, "resumed metrics differ:\n--- uninterrupted\n%s--- resumed\n%s", mu, mi);
    CHECK(same_weights, "resumed final weights differ");
    free(mu), free(mi);

    /* checkpoint-3 falls inside a round (rounds are steps 1-2, 3-4, ...): resume
     * from it into a fresh folder and compare steps 4..8. */
    char j_dir[300];
    snprintf(j_dir, sizeof j_dir, "%s/from_checkpoint3", g_tmp);
    snprintf(args, sizeof args, "%s %s --output_dir %s --resume_from_checkpoint %s/checkpoint-3", BASE, resume_cfg,
             j_dir, u_dir);
    code = run(args, &err);
    CHECK(code == 0, "resume from checkpoint-3: exit %d: %s", code, err);
    free(err);
    mu = metrics_without_timing(u_dir);
    mi = metrics_without_timing(j_dir);
    char *tail_u = mu;
    for (int k = 0; k < 3 && tail_u; k++) tail_u = strchr(tail_u, '\n') ? strchr(tail_u, '\n') + 1 : NULL;
    same_metrics = tail_u && strcmp(tail_u, mi) == 0 && count_lines(mi) == 5;
    same_weights = same_file(u_dir, j_dir, "model.safetensors");
    printf("resume from checkpoint-3 (mid-round): steps 4-8 equal: %s, final weights identical: %s\n",
           same_metrics ? "yes" : "NO", same_weights ? "yes" : "NO");
    CHECK(same_metrics && same_weights, "mid-round resume differs:\n--- uninterrupted\n%s--- resumed\n%s", mu, mi);
    free(mu), free(mi);

    /* 3b. a second SIGINT stops at once, without saving: the step waits on a reward program that never
     * answers (its timeout 60 s), so only the second signal can end it now */
    char twice_dir[300], twice_err[320];
    snprintf(twice_dir, sizeof twice_dir, "%s/sigint_twice", g_tmp);
    snprintf(twice_err, sizeof twice_err, "%s/sigint_twice.err", g_tmp); /* read back as g_tmp's sigint_twice.err */
    snprintf(cmd, sizeof cmd,
             "exec %s train %s --max_steps 4 --eval_dataset null --output_dir %s --reward_funcs "
             "'[{\"type\": \"command\", \"command\": \"sleep 47\", \"timeout\": 60}]'",
             COLT_BINARY, BASE, twice_dir);
    pid = start_command(cmd, NULL, twice_err);
    /* the run's handler is in place once it logs its CPU threads (the line before it); the step then
     * waits on the reward program, which starts with the run */
    bool waiting = false;
    for (int waited = 0; waited < 600 && !waiting; waited++) {
        char *text = read_text(g_tmp, "sigint_twice.err");
        waiting = text && strstr(text, "CPU threads") && system("pgrep -f 'sleep 47' > /dev/null") == 0;
        free(text);
        if (!waiting) usleep(100000);
    }
    usleep(500000);
    kill(pid, SIGINT);
    usleep(1500000); /* a second signal sooner than 1 s is taken for the same Ctrl-C arriving twice */
    bool alive_after_one = waitpid(pid, &status, WNOHANG) == 0;
    double t_second = now_s();
    kill(pid, SIGINT);
    waitpid(pid, &status, 0);
    double took = now_s() - t_second;
    char *twice_text = read_text(g_tmp, "sigint_twice.err");
    bool saved = exists_in(twice_dir, "checkpoint-1");
    printf("SIGINT twice: the run was in its step: %s, alive after the first: %s, ended %.2f s after the second by "
           "signal %d, checkpoint: %s\n", waiting ? "yes" : "no", alive_after_one ? "yes" : "no", took,
           WIFSIGNALED(status) ? WTERMSIG(status) : 0, saved ? "yes" : "no");
    CHECK(waiting && alive_after_one && WIFSIGNALED(status) && WTERMSIG(status) == SIGINT && took < 5 &&
              !saved && twice_text && strstr(twice_text, "Ctrl-C again, a second later, stops at once without saving"),
          "SIGINT twice: status %d after %.2f s, stderr: %s", status, took, twice_text ? twice_text : "");
    free(twice_text);
    system("pkill -f 'sleep 47' > /dev/null 2>&1");

    /* 3c. Ctrl-C in a terminal with colt's own launcher (2 CPU ranks): the process group gets SIGINT and
     * the launcher forwards it, so each rank sees it twice within milliseconds: still one graceful stop */
    char group_dir[300];
    snprintf(group_dir, sizeof group_dir, "%s/sigint_group", g_tmp);
    snprintf(cmd, sizeof cmd, "exec setsid %s train %s --max_steps 200 --save_steps 0 --eval_dataset null "
             "--nproc_per_node 2 --device cpu --output_dir %s", COLT_BINARY, BASE, group_dir);
    pid = start_command(cmd, NULL, NULL);
    wait_for_metric_lines(group_dir, 2, 120);
    kill(-pid, SIGINT); /* setsid: pid leads its own group, the ranks in it */
    waitpid(pid, &status, 0);
    int group_ckpt = newest_checkpoint(group_dir);
    printf("Ctrl-C to the process group of 2 ranks: exit %d, checkpoint-%d saved\n",
           WIFEXITED(status) ? WEXITSTATUS(status) : -1, group_ckpt);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0 && group_ckpt >= 2 && group_ckpt < 200,
          "Ctrl-C to the group: status %d, checkpoint-%d", status, group_ckpt);

    /* 4. a reward program that crashes on its second call */
    char crash_dir[300];
    snprintf(crash_dir, sizeof crash_dir, "%s/crash", g_tmp);
    snprintf(args, sizeof args,
             "%s --max_steps 4 --eval_dataset null --output_dir %s --reward_funcs "
             "'[{\"type\": \"command\", \"command\": \"python3 tests/data/train/reward_crash_on_second_call.py\"}]'",
             BASE, crash_dir);
    code = run(args, &err);
    char *ck1 = path_join(crash_dir, "checkpoint-1");
    printf("crashing reward program: exit %d, checkpoint-1 saved: %s, error: %s", code, file_exists(ck1) ? "yes" : "NO", err);
    CHECK(code != 0 && code < 128 && file_exists(ck1), "reward crash: exit %d", code);
    CHECK(strstr(err, "reward") != NULL, "reward crash error does not say so: %s", err);
    free(ck1);
    free(err);

    /* 4b. TRL 1.16's entropy mask, off-policy mask, plain-k3 KL and adaptive entropy bonus together; then
     * resumed from a checkpoint the controller's state was saved in. */
    test_masks_and_entropy_bonus();
    test_multi_objective_aggregation();

    /* 5. bad input */
    char bad_dir[300];
    snprintf(bad_dir, sizeof bad_dir, "%s/bad", g_tmp);
    char *no_prompt = path_join(g_tmp, "no_prompt.jsonl"), *empty = path_join(g_tmp, "empty.jsonl");
    file_write_atomic(no_prompt, "{\"prompt\": \"ok\"}\n{\"question\": \"where is the prompt?\"}\n", 55, NULL);
    file_write_atomic(empty, "", 0, NULL);
    snprintf(args, sizeof args, "%s --output_dir %s --dataset %s", BASE, bad_dir, no_prompt);
    expect_error("dataset row without prompt", args, "line 2");
    snprintf(args, sizeof args, "%s --output_dir %s --dataset %s", BASE, bad_dir, empty);
    expect_error("empty dataset", args, "empty");
    snprintf(args, sizeof args, "%s --output_dir %s --num_generations 1", BASE, bad_dir);
    expect_error("num_generations 1", args, "num_generations");
    snprintf(args, sizeof args, "%s --output_dir %s --per_device_train_batch_size 12", BASE, bad_dir);
    expect_error("batch not divisible by G", args, "divisible");
    snprintf(args, sizeof args, "%s --output_dir %s --learning_rate -1", BASE, bad_dir);
    expect_error("negative learning rate", args, "learning_rate");
    snprintf(args, sizeof args, "%s --output_dir %s --loss_type ppo", BASE, bad_dir);
    expect_error("unknown loss_type", args, "loss_type");
    snprintf(args, sizeof args, "%s --output_dir %s --multi_objective_aggregation mean", BASE, bad_dir);
    expect_error("unknown aggregation", args, "multi_objective_aggregation 'mean'");
    snprintf(args, sizeof args, "%s --output_dir %s --learnig_rate 1e-3", BASE, bad_dir);
    expect_error("misspelt setting", args, "did you mean 'learning_rate'");
    snprintf(args, sizeof args, "%s --output_dir %s --max_completion_length 600", BASE, bad_dir);
    expect_error("prompt + completion too long", args, "max_position_embeddings");
    free(no_prompt), free(empty);

    snprintf(cmd, sizeof cmd, "rm -rf %s", g_tmp);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_tmp);
    printf("%d checks, %d failed\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
