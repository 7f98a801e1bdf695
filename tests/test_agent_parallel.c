/* test_agent_parallel.c — tools and environments (docs/agents.md) where more than one process or thread takes
 * part, on the CPU with tests/data/models/tiny-tool-f32 (it calls tests/data/agent's tools) and the writer
 * environment (examples/environments), each run against one synchronous process:
 *
 *   1. tensor parallelism (mpirun -np 2, tensor_parallel_size 2): the group's first rank alone runs the tool
 *      worker and shares each poll's answers, the resets, get_reward and the environments' Python rewards;
 *      the other applies exactly those. A tools run (a tool that hangs past tool_timeout, one that raises, one
 *      whose result never fits) and an environment_factory run give one process's completions.jsonl byte for
 *      byte (every conversation, the error texts TRL writes), the same rewards, tool metrics and lengths, and the
 *      loss, entropy and gradient norm within 1e-4 relative (the split matmuls sum in another order: fp32
 *      rounding, about 1e-6 here). Data parallel x tensor parallel (4 ranks, 2 groups, each with its own
 *      leader and worker) gives the same conversations. A Python reward given environments= that raises on
 *      the leader ends both ranks with its one-line error, without hanging.
 *   2. async_generation against a colt serve: the round in flight runs its conversations on the generation
 *      thread with a second tool worker. At learning_rate 0 (the weights a round is generated with are then
 *      the same whether one step stale or not) an environment_factory run equals the synchronous one over 3
 *      rounds: completions.jsonl byte for byte (per-sample prompts with each instance's observation: the
 *      second worker numbers its instances as the first), rewards and tool metrics, staleness 1 after step 1; a
 *      resume from checkpoint-1 (its round in flight is not saved: taken again) gives steps 2-3 again. With
 *      learning it generates step 1 as the synchronous run does and later rounds one step stale.
 * Under the sanitizers (build-asan) only the first tensor-parallel run, the raising one and the first async
 * run (multi-rank runs are 5-10x slower there). Exits 77 (skipped) without python3 and transformers (the
 * tool worker needs them); without mpirun only part 2 runs. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fileio.h"
#include "harness.h"
#include "serve_harness.h"

#define MODEL COLT_SOURCE_DIR "/tests/data/models/tiny-tool-f32"
#define AGENT COLT_SOURCE_DIR "/tests/data/agent"
#define ENV_DIR COLT_SOURCE_DIR "/examples/environments"
#define MPIRUN "mpirun --oversubscribe --allow-run-as-root --bind-to none -x OMP_NUM_THREADS=1 -x " NO_LEAK_CHECK
#if defined(__SANITIZE_ADDRESS__)
#define SANITIZED 1
#else
#define SANITIZED 0
#endif

static const char *TOOLS_ARGS =
    "--model " MODEL " --dataset " AGENT "/tool_prompts.jsonl --tools '[\"" AGENT "/calc_tools.py:add\", \"" AGENT
    "/calc_tools.py:div\", \"" AGENT "/calc_tools.py:slow\", \"" AGENT "/calc_tools.py:big\"]' --tool_timeout 1 "
    "--max_tool_calling_iterations 2 --reward_funcs '[\"" AGENT "/tool_rewards.py:repeats_tool_result\"]' "
    "--num_generations 4 --per_device_train_batch_size 36 --max_completion_length 64 --max_prompt_length 128 "
    "--temperature 1.0 --learning_rate 1e-3 --beta 0 --logging_steps 1 --log_completions_count 36 --seed 7 "
    "--report_to none --device cpu --deterministic true --save_steps 0";

/* steps_per_generation 1: an async round may lag one step (max_staleness 1) */
static const char *ENV_ARGS =
    "--config " ENV_DIR "/writer.yaml --model " MODEL " --dataset " ENV_DIR "/writer.jsonl --environment_factory "
    ENV_DIR "/writer.py:WriterEnv --reward_funcs " ENV_DIR "/writer.py:says_the_sum --tools '[\"" AGENT
    "/calc_tools.py:add\", \"" AGENT "/calc_tools.py:div\", \"" AGENT "/calc_tools.py:slow\"]' --report_to none "
    "--top_k 1 --shuffle_dataset false --steps_per_generation 1 --per_device_train_batch_size 10 --max_steps 3 "
    "--learning_rate 0 --log_completions_count 10 --device cpu --deterministic true --save_steps 1";

/* colt train ARGS EXTRA --output_dir g_tmp/dir [under launcher]; exit status, stderr in *err. */
static int train(const char *launcher, const char *args, const char *extra, const char *dir, char **err) {
    char cd[300], all[8192];
    snprintf(cd, sizeof cd, "cd %s &&", g_tmp);
    snprintf(all, sizeof all, "%s %s --output_dir %s", args, extra, dir);
    double t0 = now_s();
    int rc = run_colt_with(&(ColtRun){.env = cd, .launcher = launcher, .subcommand = "train", .timeout_s = 300}, all,
                           err);
    printf("  %s: exit %d in %.1f s\n", dir, rc, now_s() - t0);
    if (*err) CHECK(!strstr(*err, "Sanitizer") && !strstr(*err, "runtime error:"), "%s: %s", dir, *err);
    return rc;
}

static char *read_run_file(const char *dir, const char *name) {
    char path[600], *text = NULL;
    size_t len;
    snprintf(path, sizeof path, "%s/%s/%s", g_tmp, dir, name);
    return file_read_all(path, &text, &len, NULL) == 0 ? text : NULL;
}

/* The metrics.jsonl line of a step (the one with its loss), or NULL. */
static json_t *step_metrics(const char *dir, int step) {
    char *text = read_run_file(dir, "metrics.jsonl");
    json_t *found = NULL;
    for (char *line = text ? strtok(text, "\n") : NULL; line && !found; line = strtok(NULL, "\n")) {
        json_t *o = json_loads(line, 0, NULL);
        if (json_integer_value(json_object_get(o, "step")) == step && json_object_get(o, "loss")) found = o;
        else json_decref(o);
    }
    free(text);
    return found;
}

/* completions.jsonl's lines of steps [from, to] joined, or NULL. */
static char *completions_of(const char *dir, int from, int to) {
    char *text = read_run_file(dir, "completions.jsonl");
    if (!text) return NULL;
    size_t n = 0;
    char *out = calloc(strlen(text) + 1, 1);
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        json_t *o = json_loads(line, 0, NULL);
        int step = (int)json_integer_value(json_object_get(o, "step"));
        json_decref(o);
        if (step < from || step > to) continue;
        n += (size_t)sprintf(out + n, "%s\n", line);
    }
    free(text);
    return out;
}

/* Metrics that must be equal (exact), and those equal up to the order of fp32 sums (rel_tol). */
static const char *EXACT[] = {"reward", "reward_std", "frac_reward_zero_std", "tools/call_frequency",
                              "tools/failure_frequency", "completions/mean_length", "completions/max_length",
                              "completions/clipped_ratio", "num_tokens"};
static const char *CLOSE[] = {"loss", "entropy", "grad_norm"};

/* Steps [1, steps] of dir against ref: the EXACT metrics and every rewards/ one equal, the CLOSE ones within
 * rel_tol (< 0: not compared). Returns the largest relative difference of the CLOSE ones. */
static double compare_steps(const char *ref, const char *dir, int from, int steps, double rel_tol) {
    double worst = 0;
    int compared = 0;
    for (int step = from; step <= steps; step++) {
        json_t *a = step_metrics(ref, step), *b = step_metrics(dir, step);
        CHECK(a && b, "%s / %s: no metrics for step %d", ref, dir, step);
        const char *key;
        json_t *v;
        json_object_foreach(a, key, v) {
            bool exact = strncmp(key, "rewards/", 8) == 0;
            for (size_t k = 0; k < sizeof EXACT / sizeof *EXACT; k++) exact |= strcmp(key, EXACT[k]) == 0;
            json_t *w = json_object_get(b, key);
            if (exact) {
                compared++;
                CHECK(w && json_number_value(v) == json_number_value(w), "%s step %d %s: %.9g, %s: %.9g", dir, step,
                      key, json_number_value(v), ref, json_number_value(w));
            }
        }
        for (size_t k = 0; rel_tol >= 0 && k < sizeof CLOSE / sizeof *CLOSE; k++) {
            double x = json_number_value(json_object_get(a, CLOSE[k]));
            double y = json_number_value(json_object_get(b, CLOSE[k]));
            double rel = fabs(x - y) / fmax(fabs(x), 1e-12);
            compared++;
            if (rel > worst) worst = rel;
            CHECK(json_object_get(b, CLOSE[k]) && rel <= rel_tol, "%s step %d %s: %.9g, %s: %.9g", dir, step, CLOSE[k],
                  y, ref, x);
        }
        json_decref(a), json_decref(b);
    }
    CHECK(compared >= 10 * (steps - from + 1), "%s: only %d metric values compared", dir, compared);
    return worst;
}

static void check_same_completions(const char *ref, const char *dir, int from, int to) {
    char *a = completions_of(ref, from, to), *b = completions_of(dir, from, to);
    bool same = a && b && *a && strcmp(a, b) == 0;
    CHECK(same, "%s: completions.jsonl (steps %d-%d) differs from %s's", dir, from, to, ref);
    printf("  %s: completions of steps %d-%d (%d lines) %s %s's\n", dir, from, to, count_lines(b ? b : ""),
           same ? "identical to" : "DIFFER from", ref);
    free(a), free(b);
}

/* ---------------------------------------------------------------- 1. tensor parallelism */

static void test_tensor_parallel(void) {
    char *err = NULL;
    int rc = train(NULL, TOOLS_ARGS, "--max_steps 2", "one", &err);
    CHECK(rc == 0, "one process with tools: exit %d: %s", rc, err);
    free(err);
    rc = train(MPIRUN " -np 2", TOOLS_ARGS, "--max_steps 2 --tensor_parallel_size 2", "tp2", &err);
    CHECK(rc == 0, "tensor_parallel_size 2 with tools: exit %d: %s", rc, err);
    CHECK(rc != 0 || strstr(err, "the first rank of each tensor-parallel group runs them"), "tp2: no log line");
    free(err);
    if (rc == 0) {
        check_same_completions("one", "tp2", 1, 2);
        double worst = compare_steps("one", "tp2", 1, 2, 1e-4);
        /* the model read TRL's error texts under TP too: the hanging tool's and the raising tool's */
        char *text = read_run_file("tp2", "completions.jsonl");
        CHECK(text && strstr(text, "{'error': 'Tool slow timed out after 1 s'}") &&
                  strstr(text, "{'error': 'integer division or modulo by zero'}"),
              "tp2: the hanging and raising tools' errors are not in the conversations");
        free(text);
        printf("tools, tensor_parallel_size 2 vs one process, 2 steps: rewards and tool metrics equal, loss / "
               "entropy / grad_norm within %.2g relative\n", worst);
    }

    /* the leader's failure is the group's: a Python reward given environments= raises in its worker */
    char extra[600];
    snprintf(extra, sizeof extra,
             "--max_steps 1 --tensor_parallel_size 2 --reward_funcs '[\"%s/raising_reward.py:boom\"]'", g_tmp);
    sh("printf 'def boom(completions, environments, **kwargs):\\n    raise ValueError(\"boom on the leader\")\\n' > "
       "%s/raising_reward.py", g_tmp);
    double t0 = now_s();
    rc = train(MPIRUN " -np 2", ENV_ARGS, extra, "tp2_raise", &err);
    double seconds = now_s() - t0;
    const char *line = NULL;
    for (const char *at = err; at && (at = strstr(at, "colt train: ")); at++) line = at;
    CHECK(rc != 0 && rc < 124 && seconds < 120, "a raising reward under TP: exit %d after %.1f s", rc, seconds);
    CHECK(line && strstr(line, "reward 'boom'") && strstr(line, "boom on the leader"),
          "a raising reward under TP: the last error line lacks the reward and its error: %s", err);
    CHECK(err && strstr(err, "the tensor-parallel group's first rank, which runs its tools"),
          "the follower does not say its group's first rank failed: %s", err);
    printf("a raising environments reward under TP: exit %d in %.1f s: %.*s\n", rc, seconds,
           line ? (int)strcspn(line, "\n") : 0, line ? line : "");
    free(err);
    if (SANITIZED) return;

    /* data parallel x tensor parallel: 2 groups of 2, each its own leader and worker, each its half */
    rc = train(MPIRUN " -np 4", TOOLS_ARGS, "--max_steps 2 --tensor_parallel_size 2 --per_device_train_batch_size 18",
               "dp2tp2", &err);
    CHECK(rc == 0, "2 x tensor_parallel_size 2 with tools: exit %d: %s", rc, err);
    free(err);
    if (rc == 0) {
        check_same_completions("one", "dp2tp2", 1, 2);
        compare_steps("one", "dp2tp2", 1, 2, -1); /* entropy is averaged per rank with data parallelism */
    }

    /* environment_factory: resets, get_reward and says_the_sum (environments=) on the leader */
    rc = train(NULL, ENV_ARGS, "", "env_one", &err);
    CHECK(rc == 0, "one process with environment_factory: exit %d: %s", rc, err);
    free(err);
    rc = train(MPIRUN " -np 2", ENV_ARGS, "--tensor_parallel_size 2", "env_tp2", &err);
    CHECK(rc == 0, "tensor_parallel_size 2 with environment_factory: exit %d: %s", rc, err);
    free(err);
    if (rc == 0) {
        check_same_completions("env_one", "env_tp2", 1, 3);
        double worst = compare_steps("env_one", "env_tp2", 1, 3, 1e-4);
        printf("environment_factory, tensor_parallel_size 2 vs one process, 3 steps: rewards equal, loss / entropy "
               "within %.2g relative\n", worst);
    }
}

/* ---------------------------------------------------------------- 2. async_generation */

static void test_async(Server *srv) {
    char server[300], extra[900], *err = NULL;
    snprintf(server, sizeof server, "--vllm_mode server --vllm_server_port %d --vllm_server_timeout 60", srv->port);
    if (SANITIZED || system("command -v mpirun > /dev/null 2>&1") != 0) { /* part 1 made no reference run */
        int rc = train(NULL, ENV_ARGS, "", "env_one", &err);
        CHECK(rc == 0, "one process with environment_factory: exit %d: %s", rc, err);
        free(err);
    }
    /* environments, learning_rate 0: the same rounds as synchronous, one step stale */
    snprintf(extra, sizeof extra, "%s --vllm_group_port %d --async_generation true", server, free_port());
    int rc = train(NULL, ENV_ARGS, extra, "env_async", &err);
    CHECK(rc == 0, "async_generation with environment_factory: exit %d: %s", rc, err);
    CHECK(rc != 0 || strstr(err, "a second tool worker"), "env_async: no log line about the second worker");
    free(err);
    if (rc == 0) {
        check_same_completions("env_one", "env_async", 1, 3);
        compare_steps("env_one", "env_async", 1, 3, 1e-6);
        for (int step = 1; step <= 3; step++) {
            json_t *m = step_metrics("env_async", step);
            CHECK(json_number_value(json_object_get(m, "staleness")) == (step == 1 ? 0 : 1) &&
                      json_number_value(json_object_get(m, "tools/call_frequency")) > 0.5,
                  "env_async step %d: staleness %g, tools/call_frequency %g", step,
                  json_number_value(json_object_get(m, "staleness")),
                  json_number_value(json_object_get(m, "tools/call_frequency")));
            json_decref(m);
        }
        printf("environment_factory with async_generation (learning_rate 0): 3 rounds equal the synchronous run's, "
               "staleness 0, 1, 1\n");
    }
    if (SANITIZED) return;
    /* resumed from checkpoint-1 (round 2 was in flight: not saved, its prompts taken again) */
    snprintf(extra, sizeof extra, "%s --vllm_group_port %d --async_generation true --resume_from_checkpoint "
                                  "env_async/checkpoint-1", server, free_port());
    rc = train(NULL, ENV_ARGS, extra, "env_async_resumed", &err);
    CHECK(rc == 0, "async resume with environment_factory: exit %d: %s", rc, err);
    free(err);
    if (rc == 0) {
        check_same_completions("env_async", "env_async_resumed", 2, 3);
        compare_steps("env_async", "env_async_resumed", 2, 3, 1e-6);
    }
    /* tools with learning: step 1 as the synchronous run, later rounds generated one step behind */
    snprintf(extra, sizeof extra, "%s --vllm_group_port %d --async_generation true --max_steps 2", server, free_port());
    rc = train(NULL, TOOLS_ARGS, extra, "tools_async", &err);
    CHECK(rc == 0, "async_generation with tools: exit %d: %s", rc, err);
    free(err);
    if (rc != 0) return;
    char *text = read_run_file("one", "completions.jsonl");
    if (text) { /* part 1's one-process run */
        free(text);
        check_same_completions("one", "tools_async", 1, 1);
        compare_steps("one", "tools_async", 1, 1, 1e-6);
    }
    json_t *m2 = step_metrics("tools_async", 2);
    double lag = json_number_value(json_object_get(m2, "sampling/sampling_logp_difference/mean"));
    CHECK(json_number_value(json_object_get(m2, "staleness")) == 1 && lag > 0 &&
              json_number_value(json_object_get(m2, "tools/call_frequency")) > 0.5,
          "tools_async step 2: staleness %g, sampling_logp_difference/mean %g, tools/call_frequency %g",
          json_number_value(json_object_get(m2, "staleness")), lag,
          json_number_value(json_object_get(m2, "tools/call_frequency")));
    printf("tools with async_generation: step 1 as one process's; step 2 generated one step behind "
           "(sampling_logp_difference/mean %.3g), tools/call_frequency %.3f\n",
           lag, json_number_value(json_object_get(m2, "tools/call_frequency")));
    json_decref(m2);
}

int main(void) {
    if (system("python3 -c 'import transformers' >/dev/null 2>&1") != 0) {
        printf("SKIP: python3 with transformers is needed for the tool worker\n");
        return 77;
    }
    snprintf(g_tmp, sizeof g_tmp, "/tmp/colt_agent_parallel_XXXXXX");
    if (!mkdtemp(g_tmp)) return 1;
    atexit(serve_kill_all);
    setenv("COLT_API_KEY", "colt-test-key", 1);
    double t0 = now_s();
    bool mpi = system("command -v mpirun > /dev/null 2>&1") == 0;
    if (mpi) test_tensor_parallel();
    else printf("SKIPPED: tensor parallelism (no mpirun)\n");
    printf("tensor parallelism: %.1f s\n", now_s() - t0);
    static Server srv;
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s serve --model %s --device cpu --deterministic --port 0", COLT_BINARY, MODEL);
    if (serve_start(&srv, "serve", cmd, 60, false)) {
        double t1 = now_s();
        test_async(&srv);
        printf("async_generation: %.1f s\n", now_s() - t1);
        int code = serve_stop(&srv, SIGTERM, 30);
        CHECK(code == 0, "colt serve (%s) exited %d after SIGTERM", srv.log, code);
    }
    if (g_failures == 0) sh("rm -rf %s", g_tmp);
    else fprintf(stderr, "kept %s\n", g_tmp);
    printf("%d checks, %d failures, %.1f s\n", g_checks, g_failures, now_s() - t0);
    return g_failures ? 1 : 0;
}
