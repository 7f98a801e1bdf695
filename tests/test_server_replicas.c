/* test_server_replicas.c — server mode over several data-parallel colt serve
 * replicas (vllm_server_base_url listing several servers; server_devices with
 * server_data_parallel_size), on the CPU with stories260K, deterministic on
 * both sides, against the same run on one server:
 * - synchronous, 2 replicas (a JSON list of URLs) = 1: completions.jsonl and
 *   model.safetensors byte for byte, metrics.jsonl equal as text (timings and
 *   the push's GB/s aside); the second replica answered requests and took
 *   every push (its /metrics);
 * - async_generation, 2 replicas (comma-separated) = 1, the same way, 3 steps;
 * - two trainer ranks (nproc_per_node 2), each rank's share split over the 2
 *   replicas: the completions of the 1-rank, 1-replica run;
 * - the one-command form, server_devices [0, 1] with server_data_parallel_size
 *   2 (two one-process servers on the CPU): the same run again, one log per
 *   replica (serve-0.log, serve-1.log), both servers gone after;
 * - tools (multi-turn waves, each conversation kept on one replica) with 2
 *   replicas = 1 (skipped without python3 and transformers);
 * - failures in one line: a replica killed mid-run (its URL named), a replica
 *   of another model (weight_sync's fingerprint, its URL named), a replica
 *   that never answers (named, within vllm_server_timeout), server_devices not
 *   divisible by server_data_parallel_size, server_data_parallel_size without
 *   server_devices, a URL listed twice.
 * Every server gets the API key from COLT_API_KEY (set here) and is killed by PID at the end.
 * Under the sanitizers (build-asan) only the synchronous comparison, the failures and the settings run: the
 * async, two-rank, server_devices and tools runs take the same split (serve_client.c) and are left to the
 * Release suite (each colt process is 5-10x slower there). */
#include <curl/curl.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "serve_harness.h"

#define MODEL COLT_SOURCE_DIR "/models/stories260K"
#define TOOL_MODEL COLT_SOURCE_DIR "/tests/data/models/tiny-tool-f32"

static const char *BASE =
    "--config examples/demo.yaml --per_device_train_batch_size 16 --max_completion_length 24 --num_eval_prompts 8 "
    "--warmup_steps 0 --logging_steps 1 --log_completions_count 16 --save_total_limit 0 --save_steps 0 --device cpu "
    "--deterministic true --vllm_server_timeout 30";

static Server g_servers[5];

static bool server_start(Server *s, const char *name, const char *model) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s serve --model %s --device cpu --deterministic --port 0", COLT_BINARY, model);
    return serve_start(s, name, cmd, 60, false);
}

/* vllm_group_port for 2 replicas: a port with the next one free too (replica 1's channel is at + 1; a
 * client connection's local port or a TIME_WAIT one may hold it). */
static int free_port_pair(void) {
    for (int attempt = 0; attempt < 100; attempt++) {
        int base = free_port();
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)(base + 1)),
                                .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        bool free_next = base > 0 && base < 65535 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
        close(fd);
        if (free_next) return base;
    }
    return free_port();
}

static int run_train(const char *env, const char *args, char **err_out) {
    int code = run_colt_with(&(ColtRun){.env = env, .subcommand = "train", .timeout_s = 300}, args, err_out);
    CHECK(!strstr(*err_out, "Sanitizer") && !strstr(*err_out, "runtime error:"), "colt train %s: %s", args, *err_out);
    return code;
}

/* The error line colt train ends with: its last "colt train: " line. */
static const char *error_line(const char *err) {
    const char *line = NULL;
    for (const char *at = err; at && (at = strstr(at, "colt train: ")); at++)
        if (at == err || at[-1] == '\n') line = at;
    return line;
}

static void expect_error(const char *name, const char *args, const char *needle, const char *needle2,
                         double max_seconds) {
    char *err;
    double t0 = now_s();
    int code = run_train(NULL, args, &err);
    double seconds = now_s() - t0;
    const char *line = error_line(err);
    CHECK(code != 0 && code < 124, "%s: exit %d", name, code);
    CHECK(line && count_lines(line) == 1, "%s: not one error line at the end: %s", name, err);
    CHECK(line && strstr(line, needle), "%s: '%s' lacks '%s'", name, err, needle);
    CHECK(line && (!needle2 || strstr(line, needle2)), "%s: '%s' lacks '%s'", name, err, needle2);
    CHECK(seconds < max_seconds, "%s: took %.1f s, bound %.0f s", name, seconds, max_seconds);
    printf("  %-40s -> exit %d in %.1f s: %s", name, code, seconds, line ? line : err);
    free(err);
}

/* metrics.jsonl without what differs from run to run: timings and the push's speed. */
static char *stable_metrics(const char *dir) {
    char *text = read_text(dir, "metrics.jsonl");
    json_t *rows = json_array();
    for (char *line = text ? strtok(text, "\n") : NULL; line; line = strtok(NULL, "\n")) {
        json_t *o = json_loads(line, 0, NULL);
        const char *key;
        json_t *v;
        void *next;
        json_object_foreach_safe(o, next, key, v) {
            if (!strcmp(key, "step_time") || !strncmp(key, "time/", 5) || !strcmp(key, "weight_sync/gb_per_s"))
                json_object_del(o, key);
        }
        json_array_append_new(rows, o ? o : json_null());
    }
    free(text);
    char *out = json_dumps(rows, JSON_SORT_KEYS | JSON_COMPACT);
    json_decref(rows);
    return out;
}

/* dir's run equals ref's: completions, final weights, metrics. Returns the metric rows compared. */
static int same_run(const char *what, const char *dir, const char *ref, bool weights) {
    bool completions = same_file(dir, ref, "completions.jsonl");
    bool model = !weights || same_file(dir, ref, "model.safetensors");
    char *a = stable_metrics(dir), *b = stable_metrics(ref);
    json_t *rows = json_loads(a, 0, NULL);
    int n = (int)json_array_size(rows);
    json_decref(rows);
    bool metrics = !weights || strcmp(a, b) == 0;
    printf("%s: completions.jsonl %s%s%s, %d metric rows %s\n", what, completions ? "identical" : "DIFFERENT",
           weights ? ", model.safetensors " : "", weights ? (model ? "identical" : "DIFFERENT") : "", n,
           weights ? (metrics ? "equal" : "DIFFERENT") : "(not compared: another world size)");
    CHECK(completions, "%s: completions differ from %s", what, ref);
    CHECK(model, "%s: final weights differ from %s", what, ref);
    CHECK(metrics, "%s: metrics differ:\n%s\n%s", what, a, b);
    CHECK(n >= 2, "%s: %d metric rows", what, n);
    free(a), free(b);
    return n;
}

#if !defined(__SANITIZE_ADDRESS__) /* Release only (main) */
static void check_tools(void) {
    if (system("python3 -c 'import transformers' > /dev/null 2>&1") != 0) {
        printf("tools with 2 replicas: skipped (no python3 with transformers for the tool worker)\n");
        return;
    }
    Server *t0 = &g_servers[3], *t1 = &g_servers[4];
    if (!server_start(t0, "serve-tools-0", TOOL_MODEL) || !server_start(t1, "serve-tools-1", TOOL_MODEL)) return;
    static const char *TOOLS =
        "--model tests/data/models/tiny-tool-f32 --dataset tests/data/agent/tool_prompts.jsonl --tools "
        "'[\"tests/data/agent/calc_tools.py:add\", \"tests/data/agent/calc_tools.py:div\"]' --tool_timeout 10 "
        "--max_tool_calling_iterations 2 --reward_funcs '[\"tests/data/agent/tool_rewards.py:repeats_tool_result\"]' "
        "--num_generations 4 --per_device_train_batch_size 36 --max_completion_length 64 --max_prompt_length 128 "
        "--temperature 1.0 --learning_rate 1e-3 --logging_steps 1 --log_completions_count 36 --save_steps 0 --seed 7 "
        "--report_to none --max_steps 2 --device cpu --deterministic true --vllm_mode server --vllm_server_timeout 60";
    char args[4096], one[300], two[300], *err;
    snprintf(one, sizeof one, "%s/tools-1", g_tmp);
    snprintf(two, sizeof two, "%s/tools-2", g_tmp);
    snprintf(args, sizeof args, "%s --output_dir %s --vllm_server_port %d --vllm_group_port %d", TOOLS, one, t0->port,
             free_port());
    int code = run_train(NULL, args, &err);
    CHECK(code == 0, "tools, 1 replica: exit %d: %s", code, err);
    free(err);
    snprintf(args, sizeof args, "%s --output_dir %s --vllm_server_base_url http://127.0.0.1:%d,http://127.0.0.1:%d "
                                "--vllm_group_port %d", TOOLS, two, t0->port, t1->port, free_port_pair());
    code = run_train(NULL, args, &err);
    CHECK(code == 0, "tools, 2 replicas: exit %d: %s", code, err);
    free(err);
    same_run("tools, 2 replicas vs 1", two, one, true);
    double calls[2];
    metric_by_step(calls, 2, two, "tools/call_frequency");
    CHECK(calls[0] + calls[1] > 0, "tools: no tool was called");
    double hits = serve_metric(t1->port, NULL, "colt_prefix_cache_hit_tokens_total");
    printf("tools: call frequency %.3f, %.3f; replica 1 reused %.0f prompt tokens of earlier turns (prefix cache)\n",
           calls[0], calls[1], hits);
    CHECK(hits > 0, "tools: replica 1 found no conversation's earlier turns in its prefix cache");
    /* a replica of another model than the trainer's: named by the first push */
    snprintf(args, sizeof args, "%s --max_steps 2 --output_dir %s/mismatch --vllm_mode server --vllm_server_base_url "
                                "http://127.0.0.1:%d,http://127.0.0.1:%d --vllm_group_port %d",
             BASE, g_tmp, g_servers[0].port, t1->port, free_port_pair());
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", t1->port);
    expect_error("a replica of another model", args, url, "other weight bytes", 30);
}
#endif

int main(void) {
    snprintf(g_tmp, sizeof g_tmp, "/tmp/colt_test_server_replicas_XXXXXX");
    if (!mkdtemp(g_tmp)) return 1;
    atexit(serve_kill_all);
    setenv("COLT_API_KEY", "colt-test-key", 1);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    Server *a = &g_servers[0], *b = &g_servers[1], *c = &g_servers[2];
    if (!server_start(a, "serve-a", MODEL) || !server_start(b, "serve-b", MODEL) || !server_start(c, "serve-c", MODEL))
        goto done;
    char args[4096], one[300], two[300], *err;

    /* synchronous: 1 replica, then 2 (a JSON list) */
    snprintf(one, sizeof one, "%s/sync-1", g_tmp);
    snprintf(two, sizeof two, "%s/sync-2", g_tmp);
    snprintf(args, sizeof args, "%s --max_steps 2 --output_dir %s --vllm_mode server --vllm_server_port %d "
                                "--vllm_group_port %d", BASE, one, a->port, free_port());
    int code = run_train(NULL, args, &err);
    CHECK(code == 0, "1 replica: exit %d: %s", code, err);
    free(err);
    double b_requests = serve_metric(b->port, NULL, "colt_requests_finished_total");
    snprintf(args, sizeof args, "%s --max_steps 2 --output_dir %s --vllm_mode server --vllm_server_base_url "
                                "'[\"http://127.0.0.1:%d\", \"http://127.0.0.1:%d/\"]' --vllm_group_port %d",
             BASE, two, a->port, b->port, free_port_pair());
    code = run_train(NULL, args, &err);
    CHECK(code == 0, "2 replicas: exit %d: %s", code, err);
    CHECK(strstr(err, "(2 data-parallel replicas)") != NULL, "2 replicas: no line naming them: %s", err);
    free(err);
    same_run("sync, 2 replicas vs 1", two, one, true);
    double requests = serve_metric(b->port, NULL, "colt_requests_finished_total") - b_requests;
    double pushes = serve_metric(b->port, NULL, "colt_weight_updates_total");
    printf("replica 1 answered %.0f requests (one per round) and took %.0f pushes (the first and one per step)\n",
           requests, pushes);
    CHECK(requests == 2 && pushes == 3, "replica 1: %.0f requests, %.0f pushes; want 2 and 3", requests, pushes);

#if !defined(__SANITIZE_ADDRESS__) /* sanitized: the synchronous run, the failures and the settings (see the top) */
    /* async_generation: 1 replica, then 2 (comma-separated) */
    snprintf(one, sizeof one, "%s/async-1", g_tmp);
    snprintf(two, sizeof two, "%s/async-2", g_tmp);
    snprintf(args, sizeof args, "%s --max_steps 3 --async_generation true --output_dir %s --vllm_mode server "
                                "--vllm_server_port %d --vllm_group_port %d", BASE, one, a->port, free_port());
    code = run_train(NULL, args, &err);
    CHECK(code == 0, "async, 1 replica: exit %d: %s", code, err);
    free(err);
    snprintf(args, sizeof args, "%s --max_steps 3 --async_generation true --output_dir %s --vllm_mode server "
                                "--vllm_server_base_url http://127.0.0.1:%d,http://127.0.0.1:%d --vllm_group_port %d",
             BASE, two, a->port, b->port, free_port_pair());
    code = run_train(NULL, args, &err);
    CHECK(code == 0, "async, 2 replicas: exit %d: %s", code, err);
    free(err);
    same_run("async, 2 replicas vs 1", two, one, true);
    double staleness[3];
    metric_by_step(staleness, 3, two, "staleness");
    CHECK(staleness[0] == 0 && staleness[1] == 1 && staleness[2] == 1, "async: staleness %g %g %g, want 0 1 1",
          staleness[0], staleness[1], staleness[2]);

    /* two trainer ranks, each rank's share over the 2 replicas */
    snprintf(one, sizeof one, "%s/sync-1", g_tmp);
    snprintf(two, sizeof two, "%s/ranks-2", g_tmp);
    snprintf(args, sizeof args, "%s --max_steps 2 --nproc_per_node 2 --per_device_train_batch_size 8 --output_dir %s "
                                "--vllm_mode server --vllm_server_base_url http://127.0.0.1:%d,http://127.0.0.1:%d "
                                "--vllm_group_port %d", BASE, two, a->port, b->port, free_port_pair());
    code = run_train(NO_LEAK_CHECK, args, &err);
    CHECK(code == 0, "2 ranks, 2 replicas: exit %d: %s", code, err);
    free(err);
    same_run("2 trainer ranks x 2 replicas vs 1 x 1", two, one, false);

    /* the one-command form: two one-process servers on the CPU */
    snprintf(two, sizeof two, "%s/own-2", g_tmp);
    snprintf(args, sizeof args, "%s --max_steps 2 --output_dir %s --server_devices [0,1] --server_data_parallel_size 2",
             BASE, two);
    unsetenv("COLT_API_KEY"); /* the trainer draws a key for its servers */
    code = run_train(NULL, args, &err);
    setenv("COLT_API_KEY", "colt-test-key", 1);
    CHECK(code == 0, "server_devices [0,1], 2 replicas: exit %d: %s", code, err);
    int started = 0;
    bool gone = true;
    for (const char *at = err; (at = strstr(at, "started colt serve (pid ")); at++, started++)
        gone = process_gone((pid_t)atoi(at + strlen("started colt serve (pid ")), 5) && gone;
    free(err);
    CHECK(started == 2 && gone, "server_devices, 2 replicas: %d servers started, all gone after: %d", started, gone);
    for (int r = 0; r < 2; r++) {
        char name[32];
        snprintf(name, sizeof name, "serve-%d.log", r);
        char *log = read_text(two, name);
        /* a round of 16 is 8 per replica: colt serve's default max_num_seqs 256, 32 blocks of 16 tokens each */
        CHECK(log && strstr(log, "weight channel open") && strstr(log, "colt serve: stopped") &&
                  strstr(log, "KV pool of 8192 blocks"),
              "server_devices: %s lacks the channel, the stop or the default pool: %s", name, log ? log : "(missing)");
        free(log);
    }
    same_run("server_devices [0,1], server_data_parallel_size 2, vs 1 replica", two, one, true);
    /* a round of 1024 (64 micro-batches of 16): the server takes it in one batch of 512, its largest
     * CUDA-graph batch (max_num_seqs raised as TRL sizes vLLM's to the round), so its pool has room for 512 */
    char big[300];
    snprintf(big, sizeof big, "%s/own-big", g_tmp);
    snprintf(args, sizeof args, "%s --max_steps 1 --gradient_accumulation_steps 64 --eval_dataset null --output_dir %s "
             "--server_devices [0]", BASE, big);
    unsetenv("COLT_API_KEY");
    code = run_train(NULL, args, &err);
    setenv("COLT_API_KEY", "colt-test-key", 1);
    free(err);
    char *big_log = read_text(big, "serve.log");
    CHECK(code == 0 && big_log && strstr(big_log, "KV pool of 16384 blocks"),
          "server_devices, a round of 1024: exit %d, serve.log: %s", code, big_log ? big_log : "(missing)");
    free(big_log);

    check_tools();
#endif

    /* a replica killed mid-run: the trainer stops, naming it */
    char dir[300], pid_file[300], err_file[300];
    snprintf(dir, sizeof dir, "%s/killed", g_tmp);
    snprintf(pid_file, sizeof pid_file, "%s/train.pid", g_tmp);
    snprintf(err_file, sizeof err_file, "%s/killed.err", g_tmp);
    sh("%s train %s --max_steps 300 --output_dir %s --vllm_mode server --vllm_server_base_url "
       "http://127.0.0.1:%d,http://127.0.0.1:%d --vllm_group_port %d --vllm_server_timeout 10 > /dev/null 2> %s & "
       "echo $! > %s",
       COLT_BINARY, BASE, dir, a->port, c->port, free_port_pair(), err_file, pid_file);
    char *pid_text = read_text(g_tmp, "train.pid");
    pid_t trainer = pid_text ? (pid_t)atoi(pid_text) : 0;
    free(pid_text);
    bool stepping = false;
    for (double t1 = now_s(); trainer > 0 && !stepping && now_s() - t1 < 60; usleep(50 * 1000)) {
        char *m = read_text(dir, "metrics.jsonl");
        stepping = m && count_lines(m) >= 1;
        free(m);
    }
    CHECK(stepping, "the trainer on the replica to kill did not get to its first step");
    double t0 = now_s();
    kill(c->pid, SIGKILL);
    serve_wait_exit(c, 5);
    bool ended = process_gone(trainer, 30);
    double seconds = now_s() - t0;
    char *text = read_text(g_tmp, "killed.err");
    const char *line = text ? error_line(text) : NULL;
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", c->port);
    printf("  %-40s -> ended in %.1f s: %s", "replica 1 killed mid-run", seconds, line ? line : "(no line)\n");
    CHECK(ended && seconds < 25, "the trainer did not end within 25 s of its replica's death");
    CHECK(line && count_lines(line) == 1 && strstr(line, url), "killed replica: no one line naming %s: %s", url,
          text ? text : "");
    free(text);
    if (!ended) kill(trainer, SIGKILL);

    /* bad settings */
    int nobody = free_port();
    snprintf(args, sizeof args, "%s --max_steps 1 --output_dir %s/bad --vllm_mode server --vllm_server_base_url "
                                "http://127.0.0.1:%d,http://127.0.0.1:%d --vllm_server_timeout 2",
             BASE, g_tmp, a->port, nobody);
    snprintf(url, sizeof url, "http://127.0.0.1:%d", nobody);
    expect_error("a replica that never answers", args, "replica 1 of 2: no colt serve answered at", url, 15);
    snprintf(args, sizeof args, "%s --output_dir %s/bad --server_devices [0,1,2] --server_data_parallel_size 2", BASE,
             g_tmp);
    expect_error("3 server_devices, 2 replicas", args, "which server_data_parallel_size 2 does not divide", NULL, 10);
    snprintf(args, sizeof args, "%s --output_dir %s/bad --vllm_mode server --server_data_parallel_size 2", BASE, g_tmp);
    expect_error("server_data_parallel_size alone", args, "goes with server_devices", NULL, 10);
    snprintf(args, sizeof args, "%s --output_dir %s/bad --vllm_mode server --vllm_server_base_url "
                                "'http://127.0.0.1:%d, http://127.0.0.1:%d/'", BASE, g_tmp, a->port, a->port);
    expect_error("a URL listed twice", args, "lists http://127.0.0.1:", "twice", 10);

done:
    serve_kill_all();
    sh("rm -rf %s", g_tmp);
    printf("%d checks, %d failures\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
