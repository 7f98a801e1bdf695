/* test_serve_tp.c — tensor-parallel `colt serve` on CPU ranks:
 * `mpirun -np N colt serve --tensor_parallel_size N` with the real
 * stories260K (rank 0 serves HTTP, the others follow its engine), against
 * single-process `colt generate`:
 * - TP 2: greedy /v1/completions equals colt generate token for token;
 *   sampled with a seed (n = 3, filters) equals colt generate --seed;
 *   8 concurrent clients get what they get alone; bad requests get 400 and
 *   the server keeps serving; /colt/info says the weight channel's group size;
 * - colt train vllm_mode server (synchronous) against the TP-2 server: the
 *   trainer pushes its whole model, every server rank keeps its part; the
 *   completions equal a colocated run's (warmup_steps 0, so step 2 is
 *   generated with the weights step 1 moved and pushed), the final weights
 *   within a learning rate (the server's log-probs, its parts' sums added in
 *   another order, enter the loss);
 * - the one-command form: colt train with server_devices [0, 1] (on the CPU:
 *   two server processes) starts `colt serve --tensor_parallel_size 2`, which
 *   starts its two processes itself (no mpirun): the same completions again,
 *   and no server process left after the run, nor after the trainer is
 *   SIGKILLed mid-run;
 * - SIGTERM to rank 0 while a request streams: it finishes whole, then every
 *   rank exits and mpirun exits 0;
 * - TP 4: greedy equals colt generate; a follower killed with SIGKILL ends the
 *   whole job, non-zero, within a bounded time (no hang);
 * - one-line errors: a launch of another size, a size that does not divide
 *   the model, an adapter with TP.
 * Every server and trainer gets its API key from COLT_API_KEY (set here).
 * Skips (exit 77) without mpirun. Every process is killed by PID at the end. */
#include <curl/curl.h>
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "serve_harness.h"

#define MODEL COLT_SOURCE_DIR "/models/stories260K"
#define MPIRUN                                                                                                  \
    "mpirun --oversubscribe --allow-run-as-root --bind-to none -x OMP_NUM_THREADS=1 -x " NO_LEAK_CHECK \
    " -x COLT_API_KEY"
#define TEST_API_KEY "colt-test-key" /* every colt serve and colt train here reads it from COLT_API_KEY */
#define REQUEST_TIMEOUT_MS 120000L

static const char *PROMPTS[] = {"Once upon a time", "Tom and Lily went to the park", "The little dog was sad because",
                                "One day, a girl named Sue"};

/* ---------------------------------------------------------------- processes */

static Server g_servers[2];

/* `mpirun -np np colt serve --tensor_parallel_size np ARGS --port 0`; waits (120 s at most) for the
 * "listening" line, which names rank 0's pid. */
static bool server_start(Server *s, const char *name, int np, const char *args) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s -np %d %s serve --model %s --device cpu --tensor_parallel_size %d %s --port 0", MPIRUN,
             np, COLT_BINARY, MODEL, np, args);
    return serve_start(s, name, cmd, 120, true);
}

/* The ranks: mpirun's children (Open MPI forks local ranks itself). Returns how many. */
static int ranks_of(const Server *s, pid_t *out, int max) {
    int n = 0;
    DIR *d = opendir("/proc");
    for (struct dirent *e; d && (e = readdir(d)) && n < max;) {
        pid_t pid = (pid_t)atoi(e->d_name);
        if (pid <= 0) continue;
        char path[64], buf[512];
        snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        size_t len = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[len] = '\0';
        const char *close_paren = strrchr(buf, ')');
        int ppid = 0;
        if (close_paren && sscanf(close_paren + 2, "%*c %d", &ppid) == 1 && ppid == s->pid) out[n++] = pid;
    }
    if (d) closedir(d);
    return n;
}

static char *log_text(const Server *s) {
    char *text = NULL;
    size_t len;
    if (file_read_all(s->log, &text, &len, NULL) != 0) text = strdup("(no log)");
    return text;
}

/* Under the sanitizers (build-asan), a report in a server's log fails the test. */
static void check_no_sanitizer_report(const char *what, const char *log) {
    CHECK(log && !strstr(log, "Sanitizer") && !strstr(log, "runtime error:"), "%s: a sanitizer report:\n%s", what,
          log ? log : "(no log)");
}

/* ---------------------------------------------------------------- HTTP */

/* One request (GET when body is NULL); the HTTP status (0: no answer), *out the body. */
static long http(const Server *s, const char *path, const char *body, char **out) {
    return serve_http(s->port, path, body, REQUEST_TIMEOUT_MS, out);
}

static json_t *post_json(const Server *s, const char *body) {
    return serve_post_json(s->port, "/v1/completions", body, REQUEST_TIMEOUT_MS);
}

static json_t *choice_ids(json_t *resp, int i) {
    return json_object_get(json_array_get(json_object_get(resp, "choices"), (size_t)i), "token_ids");
}

/* colt generate --json (one process) ARGS: the ids of each completion. */
static json_t *generate_ref(const char *args) {
    char full[4096], *out = NULL;
    snprintf(full, sizeof full, "generate --json --device cpu --model %s %s", MODEL, args);
    int rc = run_colt_with(&(ColtRun){.out = &out}, full, NULL);
    CHECK(rc == 0, "colt generate %s: exit %d", args, rc);
    json_t *list = json_array();
    for (char *line = out ? strtok(out, "\n") : NULL; line; line = strtok(NULL, "\n")) {
        json_t *o = json_loads(line, 0, NULL);
        json_array_append(list, json_object_get(o, "ids"));
        json_decref(o);
    }
    free(out);
    return list;
}

/* ---------------------------------------------------------------- the checks */

static void check_greedy(const Server *s, int n_prompts, const char *extra_generate) {
    int same = 0;
    for (int p = 0; p < n_prompts; p++) {
        int max_tokens = p == 0 ? 200 : 40;
        char *q = json_quoted(PROMPTS[p]), body[1024], args[1024];
        snprintf(body, sizeof body, "{\"prompt\": %s, \"max_tokens\": %d, \"temperature\": 0, \"return_token_ids\": true}",
                 q, max_tokens);
        snprintf(args, sizeof args, "--prompt %s --max_new_tokens %d %s", q, max_tokens, extra_generate);
        json_t *resp = post_json(s, body), *ref = generate_ref(args);
        bool ok = resp && json_equal(choice_ids(resp, 0), json_array_get(ref, 0));
        CHECK(ok, "greedy '%s' differs from colt generate", PROMPTS[p]);
        same += ok;
        json_decref(resp), json_decref(ref), free(q);
    }
    printf("  greedy /v1/completions vs colt generate (one process): %d/%d identical\n", same, n_prompts);
}

static void check_seeded(const Server *s, const char *extra_generate) {
    const char *settings[][2] = {
        {"\"temperature\": 0.8, \"top_k\": 40, \"top_p\": 0.9", "--temperature 0.8 --top_k 40 --top_p 0.9"},
        {"\"temperature\": 1.0, \"min_p\": 0.05, \"repetition_penalty\": 1.3",
         "--temperature 1.0 --min_p 0.05 --repetition_penalty 1.3"},
    };
    int same = 0, total = 0;
    for (int k = 0; k < 2; k++) {
        char *q = json_quoted(PROMPTS[k + 1]), body[1024], args[1024];
        snprintf(body, sizeof body, "{\"prompt\": %s, \"max_tokens\": 48, %s, \"seed\": %d, \"n\": 3, "
                 "\"return_token_ids\": true}", q, settings[k][0], 1000 + k);
        snprintf(args, sizeof args, "--prompt %s --max_new_tokens 48 %s --seed %d --n 3 %s", q, settings[k][1],
                 1000 + k, extra_generate);
        json_t *resp = post_json(s, body), *ref = generate_ref(args);
        for (int i = 0; i < 3; i++) {
            bool ok = resp && json_equal(choice_ids(resp, i), json_array_get(ref, (size_t)i));
            CHECK(ok, "seeded %s choice %d differs from colt generate --seed", settings[k][1], i);
            same += ok, total++;
        }
        json_decref(resp), json_decref(ref), free(q);
    }
    printf("  sampled with a seed (n=3, two settings) vs colt generate --seed: %d/%d identical\n", same, total);
}

#define N_CLIENTS 8
static void check_concurrent(const Server *s) {
    char bodies[N_CLIENTS][600];
    json_t *alone[N_CLIENTS];
    for (int i = 0; i < N_CLIENTS; i++) {
        char *q = json_quoted(PROMPTS[i % 4]);
        snprintf(bodies[i], sizeof bodies[i],
                 "{\"prompt\": %s, \"max_tokens\": %d, \"temperature\": %s, \"seed\": %d, \"n\": %d, "
                 "\"return_token_ids\": true}",
                 q, 8 + (i * 7) % 40, i % 3 == 0 ? "0" : "0.9", 500 + i, 1 + i % 3);
        free(q);
        alone[i] = post_json(s, bodies[i]);
    }
    CURLM *multi = curl_multi_init();
    HttpBuf bufs[N_CLIENTS] = {0};
    CURL *handles[N_CLIENTS];
    for (int i = 0; i < N_CLIENTS; i++) {
        handles[i] = serve_request(s->port, NULL, "/v1/completions", bodies[i], &bufs[i], REQUEST_TIMEOUT_MS,
                                   http_json_headers());
        curl_multi_add_handle(multi, handles[i]);
    }
    int running = N_CLIENTS;
    for (double deadline = now_s() + 120; running > 0 && now_s() < deadline;) {
        curl_multi_perform(multi, &running);
        if (running > 0) curl_multi_poll(multi, NULL, 0, 100, NULL);
    }
    int correct = 0;
    for (int i = 0; i < N_CLIENTS; i++) {
        long status = 0;
        curl_easy_getinfo(handles[i], CURLINFO_RESPONSE_CODE, &status);
        json_t *resp = status == 200 ? json_loads(bufs[i].data ? bufs[i].data : "", 0, NULL) : NULL;
        bool ok = resp && alone[i];
        for (int c = 0; ok && c < 1 + i % 3; c++) ok = json_equal(choice_ids(resp, c), choice_ids(alone[i], c));
        CHECK(ok, "concurrent client %d: status %ld, answer differs from the same request alone", i, status);
        correct += ok;
        json_decref(resp), json_decref(alone[i]);
        curl_multi_remove_handle(multi, handles[i]);
        curl_easy_cleanup(handles[i]);
        free(bufs[i].data);
    }
    curl_multi_cleanup(multi);
    printf("  %d concurrent clients: %d/%d answers equal to the request alone\n", N_CLIENTS, correct, N_CLIENTS);
}

static void check_bad_requests_and_info(const Server *s) {
    const char *bad[] = {"{\"prompt\": \"x\", \"max_tokens\": -1}", "{not json", "{\"prompt\": [[99999]]}",
                         "{\"prompt\": \"x\", \"temperature\": -2}"};
    int n400 = 0;
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        char *out;
        long st = http(s, "/v1/completions", bad[k], &out);
        CHECK(st == 400, "bad request %s: status %ld, %s", bad[k], st, out);
        n400 += st == 400;
        free(out);
    }
    json_t *resp = post_json(s, "{\"prompt\": \"Once upon a time\", \"max_tokens\": 8, \"temperature\": 0}");
    printf("  %d/%zu bad requests got 400; a good one after them: %s\n", n400, sizeof bad / sizeof bad[0],
           resp ? "200" : "FAILED");
    json_decref(resp);
    char *info;
    long st = http(s, "/colt/info", NULL, &info);
    CHECK(st == 200 && strstr(info, "\"tensor_parallel_size\":2") && strstr(info, "\"weight_sync_world_size\":3"),
          "/colt/info: %ld %s", st, info);
    printf("  /colt/info: %s\n", info);
    free(info);
    /* a use_peft trainer's adapters: not on a tensor-parallel server yet (one line, 400, before any group forms) */
    char *lora;
    st = http(s, "/colt/init_weight_sync",
              "{\"port\": 1, \"timeout\": 5, \"lora\": {\"r\": 4, \"lora_alpha\": 8, \"target_modules\": [\"q_proj\"]}}",
              &lora);
    CHECK(st == 400 && strstr(lora, "tensor parallel") && strstr(lora, "LoRA"), "LoRA init on a TP server: %ld %s",
          st, lora);
    printf("  init_weight_sync with LoRA on the TP server: %ld\n", st);
    free(lora);
}

static int run_train(const char *args, const char *name) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "timeout -s KILL 600 %s train %s > /dev/null 2> %s/%s.err", COLT_BINARY, args, g_tmp,
             name);
    int status = system(cmd);
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
    if (code != 0) {
        char file[64];
        snprintf(file, sizeof file, "%s.err", name);
        char *err = read_text(g_tmp, file);
        CHECK(0, "colt train (%s): exit %d: %s", name, code, err ? err : "");
        free(err);
    }
    return code;
}

/* The largest |a - b| over two safetensors files of the same layout (fp32 data after the header). */
static double max_weight_diff(const char *a_path, const char *b_path, size_t *n_out) {
    char *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    double worst = INFINITY;
    *n_out = 0;
    if (file_read_all(a_path, &a, &na, NULL) == 0 && file_read_all(b_path, &b, &nb, NULL) == 0 && na == nb &&
        na > 8) {
        uint64_t header = 0;
        memcpy(&header, a, 8);
        if (memcmp(a, b, 8 + header) == 0 && (na - 8 - header) % 4 == 0) {
            worst = 0;
            size_t n = (na - 8 - header) / 4;
            const float *x = (const float *)(a + 8 + header), *y = (const float *)(b + 8 + header);
            for (size_t i = 0; i < n; i++) {
                double d = fabs((double)x[i] - (double)y[i]);
                if (!(d <= worst)) worst = d;
            }
            *n_out = n;
        }
    }
    free(a), free(b);
    return worst;
}

#define TRAIN_BASE                                                                                            \
    "--config examples/demo.yaml --per_device_train_batch_size 16 --max_completion_length 24 "                 \
    "--num_eval_prompts 0 --warmup_steps 0 --logging_steps 1 --log_completions_count 16 --save_total_limit 0 "  \
    "--save_steps 0 --device cpu --deterministic true"

/* A number after `key` in text, or 0. */
static int number_after(const char *text, const char *key) {
    const char *at = text ? strstr(text, key) : NULL;
    return at ? atoi(at + strlen(key)) : 0;
}

/* colt train vllm_mode server (synchronous) against the TP-2 server = colocated. */
static void check_weight_push(const Server *s) {
    const char *base = TRAIN_BASE " --max_steps 2";
    char args[2048], col[300], srv[300];
    snprintf(col, sizeof col, "%s/colocate", g_tmp);
    snprintf(srv, sizeof srv, "%s/server", g_tmp);
    snprintf(args, sizeof args, "%s --output_dir %s", base, col);
    if (run_train(args, "colocate") != 0) return;
    snprintf(args, sizeof args, "%s --output_dir %s --vllm_mode server --vllm_server_port %d --vllm_group_port %d "
                                "--vllm_server_timeout 60",
             base, srv, s->port, free_port());
    if (run_train(args, "server") != 0) return;
    bool same_completions = same_file(srv, col, "completions.jsonl");
    char a[400], b[400];
    snprintf(a, sizeof a, "%s/model.safetensors", col);
    snprintf(b, sizeof b, "%s/model.safetensors", srv);
    size_t n = 0;
    double worst = max_weight_diff(a, b, &n);
    char *metrics;
    long st = http(s, "/metrics", NULL, &metrics);
    const char *at = st == 200 ? strstr(metrics, "\ncolt_weight_updates_total ") : NULL;
    int updates = at ? atoi(at + strlen("\ncolt_weight_updates_total ")) : -1;
    free(metrics);
    printf("  colt train vllm_mode server against TP 2, 2 steps: completions.jsonl %s to colocated; final weights: "
           "largest difference %.3g over %zu values; the server received %d pushes\n",
           same_completions ? "identical" : "DIFFERENT", worst, n, updates);
    CHECK(same_completions, "server mode against TP 2: completions differ from colocated");
    /* The server's log-probs (the parts' sums in another order) enter the loss through the importance-sampling
     * correction; AdamW turns that rounding into up to a step of the learning rate (5e-4) on elements whose
     * gradient is near zero. A wrong push shows in the completions above. */
    CHECK(n > 0 && worst < 5e-4, "server mode against TP 2: final weights differ by %g from colocated", worst);
    CHECK(updates == 3, "colt_weight_updates_total %d, want 3 (at connect + 2 steps)", updates);

    /* the one-command form: colt train starts colt serve --tensor_parallel_size 2 itself */
    char own[300];
    snprintf(own, sizeof own, "%s/own", g_tmp);
    snprintf(args, sizeof args, "%s --output_dir %s --server_devices [0,1]", base, own);
    if (run_train(args, "own") != 0) return;
    char *serve_log = read_text(own, "serve.log"), *train_err = read_text(g_tmp, "own.err");
    pid_t launcher = number_after(train_err, "started colt serve (pid "), rank0 = number_after(serve_log, "rank 0: pid ");
    bool same = same_file(own, col, "completions.jsonl");
    bool gone = launcher > 0 && rank0 > 0 && process_gone(launcher, 5) && process_gone(rank0, 5);
    printf("  server_devices [0,1] (colt serve --tensor_parallel_size 2 started by colt train, 2 processes it "
           "started itself): completions.jsonl %s to colocated; server processes %s after the run\n",
           same ? "identical" : "DIFFERENT", gone ? "gone" : "STILL RUNNING");
    CHECK(serve_log && strstr(serve_log, "tensor parallel over 2 processes") && strstr(serve_log, "weight channel open") &&
              strstr(serve_log, "colt serve: stopped"),
          "server_devices [0,1]: serve.log lacks the TP line, the channel or the stop: %s", serve_log);
    CHECK(same, "server_devices [0,1]: completions differ from colocated");
    check_no_sanitizer_report("server_devices [0,1]: serve.log", serve_log);
    CHECK(gone, "server_devices [0,1]: colt serve (launcher %d, rank 0 %d) still runs after training", (int)launcher,
          (int)rank0);
    free(serve_log), free(train_err);

    /* the trainer SIGKILLed mid-run: every server process dies with it */
    char own2[300];
    snprintf(own2, sizeof own2, "%s/own2", g_tmp);
    sh("%s train " TRAIN_BASE " --max_steps 50 --output_dir %s --server_devices [0,1] > /dev/null 2> %s/own2.err & "
       "echo $! > %s/train.pid",
       COLT_BINARY, own2, g_tmp, g_tmp);
    char *pid_text = read_text(g_tmp, "train.pid");
    pid_t trainer = pid_text ? (pid_t)atoi(pid_text) : 0;
    free(pid_text);
    rank0 = 0;
    for (double t1 = now_s(); trainer > 0 && now_s() - t1 < 60; usleep(50 * 1000)) {
        char *m = read_text(own2, "metrics.jsonl");
        bool started = m && count_lines(m) >= 1; /* training is under way */
        free(m);
        if (!started) continue;
        char *log = read_text(own2, "serve.log");
        rank0 = number_after(log, "rank 0: pid ");
        free(log);
        break;
    }
    pid_t ranks[2] = {rank0, 0};
    char *err2 = read_text(g_tmp, "own2.err");
    launcher = number_after(err2, "started colt serve (pid ");
    free(err2);
    char children[64];
    snprintf(children, sizeof children, "/proc/%d/task/%d/children", (int)launcher, (int)launcher);
    FILE *f = launcher > 0 ? fopen(children, "r") : NULL;
    if (f) { /* the follower: the launcher's other child */
        int a = 0, b = 0;
        if (fscanf(f, "%d %d", &a, &b) == 2) ranks[1] = a == rank0 ? b : a;
        fclose(f);
    }
    CHECK(trainer > 0 && rank0 > 0 && ranks[1] > 0, "the background trainer did not get to its first step");
    if (trainer > 0) kill(trainer, SIGKILL);
    bool all_gone = rank0 > 0 && ranks[1] > 0 && process_gone(launcher, 5) && process_gone(rank0, 5) &&
                    process_gone(ranks[1], 5);
    printf("  a SIGKILLed trainer: its TP server's launcher and both ranks %s\n", all_gone ? "gone" : "NOT gone");
    CHECK(all_gone, "colt serve's processes (%d, %d, %d) outlived their SIGKILLed trainer", (int)launcher, (int)rank0,
          (int)ranks[1]);
    for (int k = 0; k < 2; k++)
        if (ranks[k] > 0 && !process_gone(ranks[k], 0)) kill(ranks[k], SIGKILL);
}

/* SIGTERM to rank 0 while a request streams: it finishes whole; every rank exits, mpirun with 0. */
static void check_sigterm(Server *s) {
    HttpBuf b = {0};
    const char *body = "{\"prompt\": \"Once upon a time\", \"max_tokens\": 200, \"n\": 2, \"ignore_eos\": true, "
                       "\"stream\": true, \"stream_options\": {\"include_usage\": true}}";
    CURLM *multi = curl_multi_init();
    CURL *c = serve_request(s->port, NULL, "/v1/completions", body, &b, REQUEST_TIMEOUT_MS, http_json_headers());
    curl_multi_add_handle(multi, c);
    int running = 1;
    bool signalled = false;
    for (double deadline = now_s() + 120; running > 0 && now_s() < deadline;) {
        curl_multi_perform(multi, &running);
        if (!signalled && b.len > 0) {
            kill(s->rank0, SIGTERM);
            signalled = true;
        }
        if (running > 0) curl_multi_poll(multi, NULL, 0, 50, NULL);
    }
    const char *usage = b.data ? strstr(b.data, "\"completion_tokens\":") : NULL;
    long long tokens = usage ? atoll(usage + strlen("\"completion_tokens\":")) : -1;
    double t0 = now_s();
    int code = serve_wait_exit(s, 60);
    printf("  SIGTERM to rank 0 mid-stream: the request ended with %lld tokens (400 asked); mpirun exit code %d "
           "after %.1f s\n", tokens, code, now_s() - t0);
    CHECK(signalled && tokens == 400, "the request in flight was not finished whole: %lld tokens", tokens);
    char *log = log_text(s);
    check_no_sanitizer_report("mpirun -np 2 colt serve", log);
    CHECK(code == 0, "mpirun colt serve exited %d after SIGTERM; its log:\n%s", code, log);
    free(log);
    curl_multi_remove_handle(multi, c);
    curl_easy_cleanup(c);
    curl_multi_cleanup(multi);
    free(b.data);
}

/* A follower killed: the job ends, non-zero, within a bound. */
static void check_follower_killed(Server *s) {
    pid_t ranks[8];
    int n = ranks_of(s, ranks, 8);
    pid_t victim = 0;
    for (int k = 0; k < n; k++)
        if (ranks[k] != s->rank0) victim = ranks[k];
    CHECK(n == 4 && victim > 0, "found %d ranks under mpirun (want 4)", n);
    if (!victim) return;
    kill(victim, SIGKILL);
    double t0 = now_s();
    int code = serve_wait_exit(s, 90);
    printf("  SIGKILL to follower pid %d: the job ended with exit code %d after %.1f s\n", (int)victim, code,
           now_s() - t0);
    CHECK(code > 0, "the job did not end non-zero within 90 s of a follower's death (code %d)", code);
}

static void check_errors(void) {
    struct {
        const char *env, *args, *needle;
    } bad[] = {
        {"WORLD_SIZE=3 RANK=0 LOCAL_RANK=0 LOCAL_WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=1",
         "serve --model " MODEL " --device cpu --tensor_parallel_size 2", "equal to the number of processes"},
        {"", "serve --model " MODEL " --device cpu --tensor_parallel_size 3", "does not divide"},
        {"", "serve --model " MODEL " --device cpu --tensor_parallel_size 2 --adapter /nonexistent", "--adapter"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        char cmd[1024];
        snprintf(cmd, sizeof cmd, "%s %s %s > /dev/null 2> %s/flag_err", bad[k].env, COLT_BINARY, bad[k].args, g_tmp);
        int status = system(cmd), code = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
        char *err = read_text(g_tmp, "flag_err");
        CHECK(code != 0 && code < 128 && err && count_lines(err) == 1 && strstr(err, bad[k].needle),
              "colt %s: exit %d, stderr %s (wanted one line with '%s')", bad[k].args, code, err ? err : "",
              bad[k].needle);
        printf("  colt %s -> exit %d: %s", bad[k].args, code, err ? err : "\n");
        free(err);
    }
}

int main(void) {
    snprintf(g_tmp, sizeof g_tmp, "/tmp/colt_test_serve_tp_XXXXXX");
    if (!mkdtemp(g_tmp)) return 1;
    printf("errors\n");
    check_errors();
    /* every server here is several ranks (mpirun's, or started by colt itself): no leak checking
     * in sanitizer builds (NO_LEAK_CHECK, harness.h) */
    setenv("LSAN_OPTIONS", "detect_leaks=0", 0);
    setenv("OMP_WAIT_POLICY", "passive", 0);
    setenv("COLT_API_KEY", TEST_API_KEY, 1);
    if (system("command -v mpirun > /dev/null 2>&1") != 0) {
        printf("SKIP: mpirun not found (scripts/setup.sh installs openmpi-bin); %d failures before\n", g_failures);
        return g_failures ? 1 : 77;
    }
    atexit(serve_kill_all);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    Server *s = &g_servers[0];
    printf("mpirun -np 2 colt serve --tensor_parallel_size 2\n");
    if (server_start(s, "tp2", 2, "--deterministic --max_tokens_limit 400")) {
        check_greedy(s, 4, "--deterministic");
        check_seeded(s, "--deterministic");
        check_concurrent(s);
        check_bad_requests_and_info(s);
        check_weight_push(s);
        check_sigterm(s);
    }
    s = &g_servers[1];
    printf("mpirun -np 4 colt serve --tensor_parallel_size 4\n");
    if (server_start(s, "tp4", 4, "")) {
        check_greedy(s, 2, "");
        check_follower_killed(s);
    }
    serve_kill_all();
    curl_global_cleanup();
    sh("rm -rf %s", g_tmp);
    printf("test_serve_tp: %d checks, %d failures\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
