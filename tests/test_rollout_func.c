/* test_rollout_func.c — TRL 1.16's rollout_func in colt train, on the CPU with tiny models:
 *
 *   1. Parity with TRL: tests/data/rollout/fixed_rollouts.py:fixed_game (a teacher-forced two-turn game:
 *      its ids come from the trainer's chat template and tokenizer, an env_mask, extra fields guess and
 *      label) on tests/data/models/tiny-tool-f32 and writer.jsonl's first 4 prompts x 3. The round saved
 *      inside checkpoint-1 equals TRL's own _generate_and_score_completions with the same function
 *      (tests/ref/make_rollout_func_goldens.py) sample for sample: prompt ids, completion ids, tool mask,
 *      the reward that reads the extra fields beside a dataset column, the advantage; its sampling
 *      log-probs are the function's. A resume from checkpoint-1 gives the uninterrupted run's step 2. Under
 *      mpirun -np 2 each rank calls the function on its half and the shared round is TRL's all the same.
 *   2. A two-turn game that generates with colt's engine (game_rollouts.py:two_turn: TRL's
 *      generate_rollout_completions, then trainer.generate on given streams) trains on stories260K, and the
 *      ids of both turns of round 0 equal `colt generate` on the same prompts and streams; the async
 *      variant trains too. In server mode (a colt serve it starts) both turns of both rounds equal the
 *      colocated run's: the asks go to the server, and the weights pushed after step 1 reach round 1.
 *   3. Errors, each one line naming what is wrong: keys missing, a function that raises, one completion
 *      short, an id outside the vocabulary, a completion longer than max_completion_length, an env_mask of
 *      the wrong length, a generate ask past max_completion_length, a function that does not return within
 *      rollout_func_timeout, a function that does not exist; settings it cannot go with (zero_stage 3, tools).
 * Exits 77 (skipped) without python3. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/fileio.h"
#include "serve_harness.h"

#define DATA COLT_SOURCE_DIR "/tests/data/rollout"
#define TINY COLT_SOURCE_DIR "/tests/data/models/tiny-tool-f32"
#define STORIES COLT_SOURCE_DIR "/models/stories260K"

static int run_train(const char *args, char **err) {
    char cd[300];
    snprintf(cd, sizeof cd, "cd %s &&", g_tmp);
    return run_colt_with(&(ColtRun){.env = cd, .subcommand = "train", .timeout_s = 300}, args, err);
}

static json_t *load_json(const char *dir, const char *name) {
    char *path = path_join(dir, name);
    json_t *o = json_load_file(path, 0, NULL);
    free(path);
    return o;
}

static bool same_ints(const json_t *a, const json_t *b) {
    if (!json_is_array(a) || !json_is_array(b) || json_array_size(a) != json_array_size(b)) return false;
    for (size_t i = 0; i < json_array_size(a); i++)
        if (json_integer_value(json_array_get(a, i)) != json_integer_value(json_array_get(b, i))) return false;
    return true;
}

/* ---------------------------------------------------------------- 1. parity with TRL */

#define PARITY_ARGS                                                                                              \
    "--model " TINY " --dataset " COLT_SOURCE_DIR "/examples/environments/writer.jsonl --rollout_func " DATA       \
    "/fixed_rollouts.py:fixed_game --reward_funcs '[\"" DATA "/rollout_rewards.py:guess_reward\"]' "            \
    "--num_generations 3 --per_device_train_batch_size 6 --steps_per_generation 2 --max_completion_length 32 " \
    "--shuffle_dataset false --max_steps 2 --save_steps 1 --logging_steps 1 --beta 0 --report_to none "        \
    "--learning_rate 1e-3 --vllm_importance_sampling_correction false "

static void check_parity(const char *dir) {
    json_t *golden = json_load_file(DATA "/rollout_func_goldens.json", 0, NULL);
    json_t *state = load_json(dir, "checkpoint-1/trainer_state.json");
    json_t *ro = json_object_get(state, "rollout"), *samples = json_object_get(ro, "samples");
    json_t *prompts = json_object_get(ro, "prompts"), *want = json_object_get(golden, "samples");
    CHECK(json_array_size(want) == 12, "rollout_func_goldens.json: 12 samples");
    CHECK(json_is_true(json_object_get(ro, "prompt_per_sample")), "checkpoint-1's rollout has a prompt per sample");
    CHECK(json_array_size(samples) == json_array_size(want), "checkpoint-1's rollout: %zu samples, TRL %zu",
          json_array_size(samples), json_array_size(want));
    int equal = 0;
    double max_adv = 0, max_reward = 0, max_logp = 0;
    for (size_t i = 0; i < json_array_size(want) && i < json_array_size(samples); i++) {
        json_t *s = json_array_get(samples, i), *w = json_array_get(want, i);
        json_t *p = json_array_get(prompts, (size_t)json_integer_value(json_object_get(s, "prompt")));
        bool prompt = same_ints(json_object_get(p, "ids"), json_object_get(w, "prompt_ids"));
        bool completion = same_ints(json_object_get(s, "completion"), json_object_get(w, "completion_ids"));
        bool mask = same_ints(json_object_get(s, "model_mask"), json_object_get(w, "tool_mask"));
        double reward = json_number_value(json_array_get(json_object_get(s, "per_func"), 0));
        double dr = fabs(reward - json_number_value(json_object_get(w, "reward")));
        double da = fabs(json_number_value(json_object_get(s, "advantage")) -
                         json_number_value(json_object_get(w, "advantage")));
        json_t *lp = json_object_get(s, "sampling_logp");
        for (size_t j = 0; j < json_array_size(lp); j++) {
            double d = fabs(json_number_value(json_array_get(lp, j)) + 0.125 * (double)(j + 1));
            if (!(d <= max_logp)) max_logp = d;
        }
        if (!(dr <= max_reward)) max_reward = dr;
        if (!(da <= max_adv)) max_adv = da;
        bool ok = prompt && completion && mask && dr <= 1e-6 && da <= 1e-5 &&
                  json_array_size(lp) == json_array_size(json_object_get(w, "completion_ids"));
        CHECK(ok, "sample %zu: prompt ids %s, completion ids %s, tool mask %s TRL's; reward off by %g, advantage by %g",
              i, prompt ? "=" : "!=", completion ? "=" : "!=", mask ? "=" : "!=", dr, da);
        equal += ok;
    }
    CHECK(max_logp <= 1e-6, "sampling log-probs differ from the function's by %g", max_logp);
    printf("parity: %d of %zu samples equal TRL 1.16's round (prompt, completion ids, tool mask; reward within %.1e, "
           "advantage within %.1e); sampling log-probs = the function's within %.1e\n",
           equal, json_array_size(want), max_reward, max_adv, max_logp);
    json_decref(golden), json_decref(state);
}

static void test_parity(void) {
    char *err = NULL;
    double t0 = now_s();
    int rc = run_train(PARITY_ARGS "--output_dir parity", &err);
    CHECK(rc == 0, "colt train with rollout_func exited %d: %s", rc, err);
    free(err);
    printf("colt train, fixed_game, 2 steps: %.1f s\n", now_s() - t0);
    if (rc != 0) return;
    char dir[300];
    snprintf(dir, sizeof dir, "%s/parity", g_tmp);
    check_parity(dir);
    /* resumed inside the round: its saved per-sample prompts and masks train step 2 alike */
    err = NULL;
    char args[2048];
    snprintf(args, sizeof args, PARITY_ARGS "--output_dir resumed --resume_from_checkpoint %s/checkpoint-1", dir);
    rc = run_train(args, &err);
    CHECK(rc == 0, "resume with rollout_func exited %d: %s", rc, err);
    free(err);
    if (rc != 0) return;
    char resumed[300];
    snprintf(resumed, sizeof resumed, "%s/resumed", g_tmp);
    double a[2], b[2], ga[2], gb[2];
    metric_by_step(a, 2, dir, "loss"), metric_by_step(b, 2, resumed, "loss");
    metric_by_step(ga, 2, dir, "grad_norm"), metric_by_step(gb, 2, resumed, "grad_norm");
    CHECK(a[1] == b[1] && ga[1] == gb[1] && !isnan(a[1]) && ga[1] > 0,
          "step 2: loss %g / grad_norm %g uninterrupted, %g / %g resumed", a[1], ga[1], b[1], gb[1]);
    printf("resumed from checkpoint-1 (inside the round): step 2 loss %.6g and grad_norm %.6g equal the "
           "uninterrupted run's\n", b[1], gb[1]);
}

/* Data parallel: two ranks each call the function on their 6 prompts (TRL's per-process slice); the round
 * they share, saved in checkpoint-1, is TRL's still. */
static void test_data_parallel(void) {
    if (system("command -v mpirun > /dev/null 2>&1") != 0) {
        printf("SKIPPED: two ranks (no mpirun)\n");
        return;
    }
    char *err = NULL, cd[300];
    snprintf(cd, sizeof cd, "cd %s &&", g_tmp);
    double t0 = now_s();
    int rc = run_colt_with(&(ColtRun){.env = cd, .subcommand = "train", .timeout_s = 180,
                                      .launcher = "mpirun --oversubscribe --allow-run-as-root --bind-to none -x "
                                                  "OMP_NUM_THREADS=1 -x " NO_LEAK_CHECK " -np 2"},
                           PARITY_ARGS "--device cpu --per_device_train_batch_size 3 --max_steps 1 --output_dir dp",
                           &err);
    CHECK(rc == 0, "mpirun -np 2 colt train with rollout_func exited %d: %s", rc, err);
    free(err);
    printf("mpirun -np 2, fixed_game, 1 step: %.1f s\n", now_s() - t0);
    char dir[300];
    snprintf(dir, sizeof dir, "%s/dp", g_tmp);
    if (rc == 0) check_parity(dir);
}

/* ---------------------------------------------------------------- 2. generation through colt's engine */

#define GAME_ARGS                                                                                                  \
    "--model " STORIES " --dataset " COLT_SOURCE_DIR "/examples/data/demo_train.jsonl --reward_funcs '[\"" DATA  \
    "/rollout_rewards.py:turn_count\", {\"type\": \"length\", \"target\": 30}]' --num_generations 4 --per_device_train_batch_size 8 " \
    "--max_completion_length 16 --temperature 1 --top_p 1 --top_k 0 --min_p 0 --seed 7 --shuffle_dataset false "  \
    "--max_steps 2 --logging_steps 1 --save_total_limit 0 --save_steps 0 --report_to none "

/* `colt generate` of lines (JSONL of {"ids": [...]}) with --n n: the completions' ids, in order. */
static json_t *colt_generate(const char *lines, int n, int max_new_tokens) {
    char *path = path_join(g_tmp, "gen_prompts.jsonl");
    FILE *fp = fopen(path, "w");
    if (fp) fputs(lines, fp), fclose(fp);
    char args[1024], *out = NULL;
    snprintf(args, sizeof args, "--model " STORIES " --prompts %s --n %d --max_new_tokens %d --temperature 1 "
                                "--top_p 1 --top_k 0 --min_p 0 --seed 7 --json --device cpu", path, n, max_new_tokens);
    int rc = run_colt_with(&(ColtRun){.subcommand = "generate", .out = &out, .timeout_s = 60}, args, NULL);
    free(path);
    json_t *all = json_array();
    for (char *line = rc == 0 && out ? strtok(out, "\n") : NULL; line; line = strtok(NULL, "\n")) {
        json_t *o = json_loads(line, 0, NULL);
        json_array_append(all, json_object_get(o, "ids"));
        json_decref(o);
    }
    CHECK(rc == 0, "colt generate exited %d", rc);
    free(out);
    return all;
}

static char *ids_lines(const json_t *lists, size_t step) {
    size_t cap = 1 << 16, len = 0;
    char *text = calloc(cap, 1);
    for (size_t i = 0; i < json_array_size(lists); i += step) {
        char *ids = json_dumps(json_array_get(lists, i), JSON_COMPACT);
        len += (size_t)snprintf(text + len, cap - len, "{\"ids\": %s}\n", ids);
        free(ids);
    }
    return text;
}

static void test_game(void) {
    char *err = NULL;
    char *log_path = path_join(g_tmp, "game_log.jsonl");
    unlink(log_path); /* the function appends to it */
    free(log_path);
    double t0 = now_s();
    int rc = run_train(GAME_ARGS "--rollout_func " DATA "/game_rollouts.py:two_turn --output_dir game", &err);
    CHECK(rc == 0, "colt train with two_turn exited %d: %s", rc, err);
    free(err);
    printf("colt train, two_turn on stories260K, 2 steps: %.1f s\n", now_s() - t0);
    if (rc != 0) return;
    char *log = read_text(g_tmp, "game_log.jsonl");
    json_t *round0 = log ? json_loads(log, JSON_DISABLE_EOF_CHECK, NULL) : NULL;
    CHECK(round0 && log && count_lines(log) == 2, "game_log.jsonl: %d rounds logged, want 2", log ? count_lines(log) : 0);
    free(log);
    if (!round0) return;
    /* turn 1: default streams 0 .. 7 of round 0 = colt generate of the 2 prompts with --n 4 */
    json_t *p1 = json_object_get(round0, "turn1_prompt_ids"), *t1 = json_object_get(round0, "turn1");
    char *lines = ids_lines(p1, 4);
    json_t *g1 = colt_generate(lines, 4, 6);
    free(lines);
    int same1 = 0;
    for (size_t i = 0; i < json_array_size(t1); i++) same1 += same_ints(json_array_get(t1, i), json_array_get(g1, i));
    CHECK(json_array_size(t1) == 8 && same1 == 8, "turn 1: %d of %zu completions equal colt generate's", same1,
          json_array_size(t1));
    /* turn 2: streams 0 .. 7 given, one prompt each = colt generate of the 8 conversations with --n 1 */
    json_t *p2 = json_object_get(round0, "turn2_prompt_ids"), *t2 = json_object_get(round0, "turn2");
    lines = ids_lines(p2, 1);
    json_t *g2 = colt_generate(lines, 1, 6);
    free(lines);
    int same2 = 0, differ = 0;
    for (size_t i = 0; i < json_array_size(t2); i++) {
        same2 += same_ints(json_array_get(t2, i), json_array_get(g2, i));
        differ += i > 0 && !same_ints(json_array_get(t1, i), json_array_get(t1, i - 1));
    }
    CHECK(json_array_size(t2) == 8 && same2 == 8, "turn 2: %d of %zu completions equal colt generate's", same2,
          json_array_size(t2));
    CHECK(differ >= 4, "turn 1: only %d of 7 neighbouring completions differ: sampling looks stuck", differ);
    printf("two_turn: round 0's turn 1 (%d of 8) and turn 2 (%d of 8) equal colt generate on the same prompts and "
           "streams\n", same1, same2);
    double lengths[2], turns[2];
    char dir[300];
    snprintf(dir, sizeof dir, "%s/game", g_tmp);
    metric_by_step(lengths, 2, dir, "completions/mean_length");
    metric_by_step(turns, 2, dir, "rewards/turn_count/mean");
    /* the model's tokens only: at most 6 + 6 of each completion, " Then" left out */
    CHECK(lengths[0] > 2 && lengths[0] <= 12 && turns[0] == 2 && turns[1] == 2,
          "completions/mean_length %g (the model's tokens: 2 .. 12), rewards/turn_count/mean %g, %g", lengths[0],
          turns[0], turns[1]);
    json_decref(round0), json_decref(g1), json_decref(g2);

    err = NULL;
    rc = run_train(GAME_ARGS "--rollout_func " DATA "/game_rollouts.py:two_turn_async --output_dir game_async "
                             "--max_steps 1", &err);
    CHECK(rc == 0, "colt train with an async rollout_func exited %d: %s", rc, err);
    free(err);
    double async_turns[1];
    snprintf(dir, sizeof dir, "%s/game_async", g_tmp);
    metric_by_step(async_turns, 1, dir, "rewards/turn_count/mean");
    CHECK(async_turns[0] == 2, "async rollout_func: rewards/turn_count/mean %g", async_turns[0]);
    printf("two_turn_async (a coroutine) trains: rewards/turn_count/mean %g\n", async_turns[0]);
}

/* Server mode: the function's generate asks go to a colt serve, as the trainer's own generation does; the
 * weights are pushed after step 1, so both rounds' turns equal the colocated game's (game_log.jsonl). */
static void test_server_mode(void) {
    setenv("COLT_API_KEY", "rollout-func-test-key-0123456789", 1); /* the trainer endpoints of colt serve */
    Server srv;
    if (!serve_start(&srv, "serve", COLT_BINARY " serve --model " STORIES " --device cpu --port 0", 60, false)) {
        CHECK(false, "colt serve did not start (%s)", srv.log);
        return;
    }
    char args[4096], *err = NULL;
    snprintf(args, sizeof args, "cd %s && mkdir -p srv && cd srv && rm -f game_log.jsonl &&", g_tmp);
    char train_args[4096];
    snprintf(train_args, sizeof train_args, GAME_ARGS "--rollout_func " DATA "/game_rollouts.py:two_turn --output_dir "
             "out --vllm_mode server --vllm_server_port %d --vllm_group_port %d --vllm_server_timeout 60",
             srv.port, 20000 + (int)(getpid() % 20000));
    double t0 = now_s();
    int rc = run_colt_with(&(ColtRun){.env = args, .subcommand = "train", .timeout_s = 120}, train_args, &err);
    CHECK(rc == 0, "colt train with rollout_func in server mode exited %d: %s", rc, err);
    free(err);
    serve_stop(&srv, SIGTERM, 30);
    printf("two_turn in server mode, 2 steps: %.1f s\n", now_s() - t0);
    if (rc != 0) return;
    char srv_dir[300];
    snprintf(srv_dir, sizeof srv_dir, "%s/srv", g_tmp);
    char *a = read_text(srv_dir, "game_log.jsonl"), *b = read_text(g_tmp, "game_log.jsonl");
    int equal = 0, compared = 0;
    char *sa = NULL, *sb = NULL;
    for (char *la = a ? strtok_r(a, "\n", &sa) : NULL, *lb = b ? strtok_r(b, "\n", &sb) : NULL; la && lb;
         la = strtok_r(NULL, "\n", &sa), lb = strtok_r(NULL, "\n", &sb)) {
        json_t *x = json_loads(la, 0, NULL), *y = json_loads(lb, 0, NULL);
        for (int turn = 1; turn <= 2; turn++) {
            json_t *tx = json_object_get(x, turn == 1 ? "turn1" : "turn2"), *ty = json_object_get(y, turn == 1 ? "turn1" : "turn2");
            for (size_t i = 0; i < json_array_size(tx); i++, compared++)
                equal += same_ints(json_array_get(tx, i), json_array_get(ty, i));
        }
        json_decref(x), json_decref(y);
    }
    CHECK(compared == 32 && equal == compared, "server mode: %d of %d completions (2 rounds x 2 turns x 8) equal the "
          "colocated game's", equal, compared);
    printf("server mode: %d of %d completions (2 rounds x 2 turns x 8, round 1 after a weight push) equal the "
           "colocated run's\n", equal, compared);
    free(a), free(b);
}

/* ---------------------------------------------------------------- 3. errors */

static void expect_error(const char *function, const char *extra, const char *want) {
    char args[2048], *err = NULL;
    snprintf(args, sizeof args, GAME_ARGS "--rollout_func " DATA "/game_rollouts.py:%s --output_dir err_%s %s",
             function, function, extra);
    double t0 = now_s();
    int rc = run_train(args, &err);
    /* the one line colt prints last */
    const char *last = err ? strstr(err, "colt train: ") : NULL;
    for (const char *p = last; p && (p = strstr(p + 1, "colt train: "));) last = p;
    char line[600] = "";
    if (last) snprintf(line, sizeof line, "%.*s", (int)strcspn(last, "\n"), last);
    CHECK(rc != 0 && rc < 128 && strstr(line, want), "%s: exit %d, last line \"%s\", want \"%s\"", function, rc, line,
          want);
    printf("  %-16s exit %d in %.1f s: %s\n", function, rc, now_s() - t0, line);
    free(err);
}

static void test_errors(void) {
    printf("errors:\n");
    expect_error("missing_logprobs", "", "rollout_func must return keys ['logprobs'] in its output dict.");
    expect_error("raises", "", "game_rollouts.py:raises\" raised ValueError: the game broke");
    expect_error("one_short", "", "rollout_func: prompt_ids has 7 entries for 8 prompts");
    expect_error("out_of_vocab", "", "rollout_func: completion_ids[0][0] is 100000, outside the model's vocabulary");
    expect_error("too_long", "", "rollout_func: completion_ids[0] has 40 tokens, max_completion_length is 16");
    expect_error("bad_mask", "", "rollout_func: env_mask[0] has ");
    expect_error("too_many_tokens", "", "raised RuntimeError: colt: generate: n must be >= 1");
    expect_error("slow", "--rollout_func_timeout 1", "did not return within 1 s (rollout_func_timeout)");
    expect_error("nope", "", "has no function 'nope'");
    expect_error("two_turn", "--zero_stage 3", "settings: rollout_func with zero_stage 3");
    expect_error("two_turn", "--tools '[\"" DATA "/rollout_rewards.py:turn_count\"]'", "settings: rollout_func with tools");
}

int main(void) {
    if (system("python3 -c 'import sys' >/dev/null 2>&1") != 0) {
        printf("SKIP: python3 is needed for the rollout_func worker\n");
        return 77;
    }
    snprintf(g_tmp, sizeof g_tmp, "/tmp/colt_rollout_func_XXXXXX");
    if (!mkdtemp(g_tmp)) return 1;
    atexit(serve_kill_all);
    test_parity();
    test_data_parallel();
    test_game();
    test_server_mode();
    test_errors();
    if (g_failures == 0) sh("rm -rf %s", g_tmp);
    else fprintf(stderr, "kept %s\n", g_tmp);
    printf("%d checks, %d failures\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
