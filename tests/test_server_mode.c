/* test_server_mode.c — `colt train` with vllm_mode server against a `colt
 * serve` it starts (two processes on the CPU, the weights over the host
 * channel: Gloo), on the demo config with the real stories260K:
 * - synchronous server mode equals colocated GRPO: the same completions
 *   (completions.jsonl byte for byte: every completion of every round), every metric within 1e-6 relative
 *   (timings, the engine's own memory figures and the server's staleness /
 *   weight-sync figures aside), byte-identical final weights — both sides
 *   with deterministic mode on, so the server's sampler and log-probs are the
 *   in-process engine's;
 * - LoRA (use_peft) in server mode equals colocated LoRA: the server, started
 *   from other base weights (the final norm zeroed), attaches the trainer's
 *   adapters at init_weight_sync and gets the base once with the first push;
 *   the same completions byte for byte, every metric within 1e-6,
 *   byte-identical adapter_model.safetensors; every later push is the
 *   adapters' bytes alone (the trainer's weight_sync/mb and the server's
 *   colt_weight_update_bytes); async_generation with LoRA runs; the plain
 *   server-mode run that follows takes the adapters off the server;
 * - tool calling (tests/data/models/tiny-tool-f32, which calls tools, and tests/data/agent's tools) in
 *   server mode equals colocated: the trainer runs the tools, colt serve each turn of every conversation
 *   (its later turns with their own budgets and RNG positions); the same completions byte for byte
 *   (the whole conversations), every metric within 1e-6, tools called in both (skipped without python3
 *   and transformers, which the tool worker needs); async_generation with tools: test_agent_parallel;
 * - async_generation runs, logs staleness 0 then 1 at every later step, keeps
 *   the loss finite, generates its first round as the synchronous run does,
 *   and the server counts every push (/metrics);
 * - bad input: no server (a bounded wait, one line naming host:port), a
 *   server with another model (weight_sync's fingerprint, one line), server
 *   mode with tensor_parallel_size 2, async_generation without a server;
 * - a trainer that never joins the weight channel does not hang the server:
 *   the open times out, the server logs it and keeps serving;
 * - the one-command form (server_devices: colt train starts colt serve
 *   itself, with a random API key of its own) gives the same run again, and
 *   leaves no server behind: not after a clean end, not after an error, not
 *   after the trainer is SIGKILLed.
 * Every server and trainer gets the API key from COLT_API_KEY (set here),
 * but server_devices, which draws its own.
 * Every server is killed by PID at the end (and dies with the test).
 * Under the sanitizers (build-asan) all but the async LoRA run, the tools runs and the clean server_devices
 * run, whose code the sanitized runs already take (docs/testing.md). */
#include <curl/curl.h>
#include <errno.h>
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

#include "core/error.h"
#include "core/fileio.h"
#include "serve/colt_api.h"
#include "harness.h"
#include "serve_harness.h"

#define MODEL COLT_SOURCE_DIR "/models/stories260K"
#define TEST_API_KEY "colt-test-key"
#define REL_TOL 1e-6

/* tests/gpu/test_server_mode_gpu.c includes this file with TEST_DEVICE "cuda": the server and the trainer
 * then share one GPU (the server's KV pool capped at 30% of it), the weights going through the host. */
#ifndef TEST_DEVICE
#define TEST_DEVICE "cpu"
#define SERVE_EXTRA ""
#define OWN_SERVER_DEVICES "[0]"
#define ELEM_BYTES 4 /* the weights' storage: fp32 */
#else
#define SERVE_EXTRA "--gpu_memory_utilization 0.3"
#define OWN_SERVER_DEVICES "[0] --devices [0] --vllm_gpu_memory_utilization 0.3" /* one GPU, shared on purpose */
#define ELEM_BYTES 2 /* bf16 */
#endif

/* Small, fast settings on top of the demo config; deterministic on both sides. */
static const char *BASE =
    "--config examples/demo.yaml --per_device_train_batch_size 16 --max_completion_length 24 --num_eval_prompts 8 "
    "--warmup_steps 0 --logging_steps 1 --log_completions_count 16 --save_total_limit 0 --save_steps 0 --device " TEST_DEVICE
    " --deterministic true";

/* ---------------------------------------------------------------- processes */

static Server g_servers[4];

/* Starts `colt serve --model model --port 0 ...`, waits (60 s at most) for its "listening" line. */
static bool server_start(Server *s, const char *name, const char *model) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s serve --model %s --device %s %s --deterministic --port 0", COLT_BINARY, model,
             TEST_DEVICE, SERVE_EXTRA);
    return serve_start(s, name, cmd, 60, false);
}
/* colt train ARGS, bounded by `timeout`; stderr in *err_out. Returns the exit code (124: timed out). */
static int run_train(const char *args, char **err_out) {
    int code = run_colt_with(&(ColtRun){.subcommand = "train", .timeout_s = 600}, args, err_out);
    /* under the sanitizers (build-asan), a report from colt train fails the test */
    CHECK(!strstr(*err_out, "Sanitizer") && !strstr(*err_out, "runtime error:"), "colt train %s: %s", args, *err_out);
    return code;
}

/* The error line colt train ends with: its last "colt train: " line (progress lines go to stderr too). */
static const char *error_line(const char *err) {
    const char *line = NULL;
    for (const char *at = err; at && (at = strstr(at, "colt train: ")); at++)
        if (at == err || at[-1] == '\n') line = at;
    return line;
}

static void expect_error(const char *name, const char *args, const char *needle, double max_seconds) {
    char *err;
    double t0 = now_s();
    int code = run_train(args, &err);
    double seconds = now_s() - t0;
    const char *line = error_line(err);
    CHECK(code != 0 && code < 124, "%s: exit %d", name, code);
    CHECK(line && count_lines(line) == 1, "%s: not one error line at the end: %s", name, err);
    CHECK(line && strstr(line, needle) != NULL, "%s: '%s' lacks '%s'", name, err, needle);
    CHECK(seconds < max_seconds, "%s: took %.1f s, bound %.0f s", name, seconds, max_seconds);
    printf("  bad input %-28s -> exit %d in %.1f s: %s", name, code, seconds, line ? line : err);
    free(err);
}

/* ---------------------------------------------------------------- HTTP (libcurl) */

/* GET (body NULL) or POST; returns the status (0: no answer), the body in *out (malloc'd). */
static long http(int port, const char *path, const char *body, char **out) {
    return serve_http(port, path, body, 60000L, out);
}
/* The value of a /metrics line "name value", or -1. */
static double server_metric(int port, const char *name) { return serve_metric(port, NULL, name); }

/* The pid of the colt serve a colt train started (its "started colt serve (pid N)" line), or 0. */
/* (not inlined: GCC 12 then sees a false dangling pointer through read_text) */
__attribute__((noinline)) static pid_t own_server_pid(const char *stderr_text) {
    const char *at = stderr_text ? strstr(stderr_text, "started colt serve (pid ") : NULL;
    return at ? (pid_t)atoi(at + strlen("started colt serve (pid ")) : 0;
}

/* Bytes the adapters of DIR/adapter_model.safetensors take in the model's
 * arena: each tensor padded to 64 elements (ARENA_ALIGN), elem_bytes each. */
static double adapter_arena_bytes(const char *dir, int elem_bytes) {
    char path[400];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    FILE *f = fopen(path, "rb");
    uint64_t n = 0;
    char *header = NULL;
    if (f && fread(&n, 8, 1, f) == 1 && n < (1u << 24)) {
        header = calloc(n + 1, 1);
        if (fread(header, 1, n, f) != n) header[0] = '\0';
    }
    if (f) fclose(f);
    json_t *h = header ? json_loads(header, 0, NULL) : NULL;
    free(header);
    double bytes = 0;
    const char *key;
    json_t *t;
    json_object_foreach(h, key, t) {
        json_t *shape = json_object_get(t, "shape");
        if (!shape) continue; /* __metadata__ */
        size_t numel = 1;
        for (size_t i = 0; i < json_array_size(shape); i++) numel *= (size_t)json_integer_value(json_array_get(shape, i));
        bytes += (double)((numel + 63) / 64 * 64) * elem_bytes;
    }
    json_decref(h);
    return bytes;
}

/* ---------------------------------------------------------------- metrics */

static json_t *load_metrics(const char *dir) {
    char *text = read_text(dir, "metrics.jsonl");
    json_t *rows = json_array();
    for (char *line = text ? strtok(text, "\n") : NULL; line; line = strtok(NULL, "\n"))
        json_array_append_new(rows, json_loads(line, 0, NULL));
    free(text);
    return rows;
}

/* Figures one mode has and the other cannot: timings, the in-process engine's
 * memory, the server's staleness and weight-sync figures. */
static bool mode_specific(const char *key) {
    return !strcmp(key, "step_time") || !strncmp(key, "time/", 5) || !strncmp(key, "engine/", 7) ||
           !strncmp(key, "memory/", 7) || !strcmp(key, "staleness") || !strncmp(key, "weight_sync/", 12);
}

/* Every shared metric of every step within REL_TOL; returns the largest relative difference. */
static double compare_metrics(json_t *a, json_t *b, int *compared) {
    double worst = 0;
    *compared = 0;
    CHECK(json_array_size(a) == json_array_size(b) && json_array_size(a) > 0, "metrics rows: %zu vs %zu",
          json_array_size(a), json_array_size(b));
    for (size_t i = 0; i < json_array_size(a) && i < json_array_size(b); i++) {
        json_t *ra = json_array_get(a, i), *rb = json_array_get(b, i);
        const char *key;
        json_t *vb;
        json_object_foreach(rb, key, vb) {
            if (mode_specific(key)) continue;
            json_t *va = json_object_get(ra, key);
            CHECK(va != NULL, "step %zu: server mode lacks metric %s", i + 1, key);
            if (!va || !json_is_number(vb)) continue;
            double x = json_number_value(va), y = json_number_value(vb);
            double rel = fabs(x - y) / (1.0 + fabs(y));
            if (rel > worst) worst = rel;
            CHECK(rel <= REL_TOL, "step %zu: %s is %.9g in server mode, %.9g colocated", i + 1, key, x, y);
            (*compared)++;
        }
    }
    return worst;
}

#if !defined(__SANITIZE_ADDRESS__) /* the tools runs: Release only (main) */
/* Tool calling: server mode against colocated, on the tool-calling model. */
#define AGENT "tests/data/agent"
static const char *TOOLS_ARGS =
    "--model tests/data/models/tiny-tool-f32 --dataset " AGENT "/tool_prompts.jsonl --tools '[\"" AGENT
    "/calc_tools.py:add\", \"" AGENT "/calc_tools.py:div\", \"" AGENT "/calc_tools.py:big\"]' --tool_timeout 10 "
    "--max_tool_calling_iterations 2 --reward_funcs '[\"" AGENT "/tool_rewards.py:repeats_tool_result\"]' "
    "--num_generations 4 --per_device_train_batch_size 36 --max_completion_length 64 --max_prompt_length 128 "
    "--temperature 1.0 --learning_rate 1e-3 --beta 0.04 --logging_steps 1 --log_completions_count 36 --save_steps 0 "
    "--seed 7 --report_to none --max_steps 2 --device " TEST_DEVICE " --deterministic true";

static void check_tools(Server *srv) {
    if (system("python3 -c 'import transformers' > /dev/null 2>&1") != 0) {
        printf("tools in server mode: skipped (no python3 with transformers for the tool worker)\n");
        return;
    }
    if (!server_start(srv, "serve-tools", COLT_SOURCE_DIR "/tests/data/models/tiny-tool-f32")) return;
    char args[4096], col[300], srv_dir[300], *err;
    snprintf(col, sizeof col, "%s/tools-colocate", g_tmp);
    snprintf(srv_dir, sizeof srv_dir, "%s/tools-server", g_tmp);
    snprintf(args, sizeof args, "%s --output_dir %s", TOOLS_ARGS, col);
    int code = run_train(args, &err);
    CHECK(code == 0, "colocated run with tools: exit %d: %s", code, err);
    free(err);
    snprintf(args, sizeof args, "%s --output_dir %s --vllm_mode server --vllm_server_port %d --vllm_group_port %d "
                                "--vllm_server_timeout 60",
             TOOLS_ARGS, srv_dir, srv->port, free_port());
    code = run_train(args, &err);
    CHECK(code == 0, "server-mode run with tools: exit %d: %s", code, err);
    free(err);
    json_t *m_col = load_metrics(col), *m_srv = load_metrics(srv_dir);
    int compared = 0;
    double worst = compare_metrics(m_srv, m_col, &compared);
    bool same = same_file(srv_dir, col, "completions.jsonl");
    double calls = 0;
    for (size_t i = 0; i < json_array_size(m_srv); i++)
        calls += json_number_value(json_object_get(json_array_get(m_srv, i), "tools/call_frequency"));
    printf("tools, server mode vs colocated, 2 steps: %d metric values compared, largest relative difference %.3g; "
           "completions.jsonl (whole conversations) %s; tools/call_frequency summed over the steps %.3f\n",
           compared, worst, same ? "identical" : "DIFFERENT", calls);
    CHECK(compared >= 2 * 10, "tools: only %d metric values compared", compared);
    CHECK(same, "tools: the conversations differ between server mode and colocated");
    CHECK(calls > 0, "tools: no tool was called in server mode");
    json_decref(m_col), json_decref(m_srv);
    code = serve_stop(srv, SIGTERM, 30);
    CHECK(code == 0, "colt serve %s exited %d after SIGTERM", srv->log, code);
}
#endif

/* POSTs body[len] to /colt/generate as content_type, asking for the answer as accept; the status, the
 * answer in *out (malloc'd) and its length. */
static long post_generate(int port, const void *body, size_t len, const char *content_type, const char *accept,
                          char **out, size_t *out_len) {
    char type_line[128], accept_line[128], auth[512] = "";
    const char *key = getenv("COLT_API_KEY");
    if (key && *key) snprintf(auth, sizeof auth, "Authorization: Bearer %s", key);
    snprintf(type_line, sizeof type_line, "Content-Type: %s", content_type);
    snprintf(accept_line, sizeof accept_line, "Accept: %s", accept);
    struct curl_slist *headers = curl_slist_append(curl_slist_append(NULL, type_line), accept_line);
    if (auth[0]) headers = curl_slist_append(headers, auth);
    HttpBuf b = {0};
    CURL *h = serve_request(port, NULL, "/colt/generate", NULL, &b, 60000L, headers);
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    long status = 0;
    if (curl_easy_perform(h) == CURLE_OK) curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(h);
    curl_slist_free_all(headers);
    *out_len = b.len;
    *out = b.data ? b.data : strdup("");
    return status;
}

/* /colt/generate in colt train's forms (colt_api.h): the request as bytes and the answer as bytes give
 * the JSON exchange's completion (json_text: the JSON answer to GENERATE_JSON), ids equal and log-probs
 * the same bits; bad binary bodies get a 400 naming what is wrong; the reader of binary answers refuses
 * a cut, a longer, a miscounted or a foreign answer. */
#define GENERATE_JSON "{\"prompts\": [[1, 403, 407]], \"streams\": [7], \"max_tokens\": 4}"
static void check_binary_forms(int port, const char *json_text) {
    const int prompt[] = {1, 403, 407};
    const GenSequence seq = {.prompt = prompt, .prompt_len = 3, .stream = 7};
    size_t req_len = 0, len = 0, len2 = 0;
    const char *settings = "{\"max_tokens\": 4}";
    const size_t at_n = 12 + strlen(settings), at_prompt = at_n + 4; /* the prompt count, the first prompt's record */
    char *req = colt_generate_request_binary(&seq, 1, NULL, settings, &req_len);
    char *bytes = NULL, *bytes2 = NULL;
    long status = post_generate(port, GENERATE_JSON, strlen(GENERATE_JSON), "application/json",
                                COLT_GENERATE_BINARY_TYPE, &bytes, &len);
    long status2 = post_generate(port, req, req_len, COLT_GENERATE_BINARY_TYPE, COLT_GENERATE_BINARY_TYPE, &bytes2, &len2);
    char err[ERR_LEN] = "";
    GenSequence g = {0};
    long long updates = -1;
    int rc = status == 200 ? colt_generate_answer_read(&g, 1, (unsigned char *)bytes, len, 4, NULL, 512, &updates, err)
                           : -1;
    json_t *o = json_loads(json_text, 0, NULL);
    json_t *c = json_array_get(json_object_get(o, "completions"), 0);
    json_t *ids = json_object_get(c, "token_ids"), *lps = json_object_get(c, "logprobs");
    bool same = rc == 0 && g.n_tokens == (int)json_array_size(ids) &&
                updates == json_integer_value(json_object_get(o, "weight_updates"));
    for (int k = 0; same && k < g.n_tokens; k++) {
        float lp = (float)json_number_value(json_array_get(lps, (size_t)k));
        same = g.tokens[k] == json_integer_value(json_array_get(ids, (size_t)k)) && memcmp(&lp, &g.logprobs[k], 4) == 0;
    }
    bool same_request = status2 == 200 && len2 == len && memcmp(bytes, bytes2, len) == 0;
    printf("/colt/generate as bytes: answer %ld, %zu bytes (JSON: %zu), %d tokens, the JSON answer's: %s; the request "
           "as bytes (%zu, JSON %zu): %ld, the same answer: %s\n", status, len, strlen(json_text), g.n_tokens,
           same ? "yes" : "no", req_len, strlen(GENERATE_JSON), status2, same_request ? "yes" : "no");
    CHECK(same, "the binary answer (%ld, %zu bytes, %s) differs from the JSON one %s", status, len, err, json_text);
    CHECK(same_request, "the binary request's answer (%ld, %zu bytes) differs from the JSON request's", status2, len2);
    free(g.tokens), free(g.logprobs);
    json_decref(o);
    free(bytes2);

    /* bad binary bodies: a 400 each, naming what is wrong */
    struct { const char *what; size_t cut; size_t at; uint32_t value; const char *want; } bad[] = {
        {"cut in the header", 10, 0, 0, "ends inside its header"},
        {"cut in a prompt", req_len - 2, 0, 0, "ends inside prompt 0"},
        {"a stream above 2^31-1", req_len, at_prompt, 0x80000000u, "stream 2147483648 is above"},
        {"no prompts", req_len, at_n, 0, "holds 0 prompts"},
        {"a token past the vocabulary", req_len, req_len - 4, 99999, "token 2 is 99999, not a token id below"},
        {"a budget above the limit", req_len, at_prompt + 8, 1u << 30, "max_tokens 1073741824 is above"},
        {"settings length past the end", req_len, 8, 1u << 20, "ends inside its settings"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        unsigned char *body = malloc(req_len);
        memcpy(body, req, req_len);
        if (bad[i].at) for (int k = 0; k < 4; k++) body[bad[i].at + k] = (unsigned char)(bad[i].value >> (8 * k));
        char *answer = NULL;
        size_t answer_len = 0;
        long st = post_generate(port, body, bad[i].cut, COLT_GENERATE_BINARY_TYPE, "application/json", &answer,
                                &answer_len);
        CHECK(st == 400 && strstr(answer, bad[i].want), "a binary body with %s: %ld %s", bad[i].what, st, answer);
        free(answer), free(body);
    }
    char *longer = malloc(req_len + 3), *answer = NULL;
    memcpy(longer, req, req_len);
    memset(longer + req_len, 0, 3);
    size_t answer_len = 0;
    long st = post_generate(port, longer, req_len + 3, COLT_GENERATE_BINARY_TYPE, "application/json", &answer, &answer_len);
    CHECK(st == 400 && strstr(answer, "3 bytes after its last prompt"), "a longer binary body: %ld %s", st, answer);
    free(answer), free(longer);
    const char *bad_settings[][2] = {{"{\"max_tokens\": 4, \"prompts\": [[1]]}", "unknown key 'prompts'"},
                                     {"[4]", "not a JSON object"}};
    for (int i = 0; i < 2; i++) {
        size_t n = 0;
        char *body = colt_generate_request_binary(&seq, 1, NULL, bad_settings[i][0], &n);
        st = post_generate(port, body, n, COLT_GENERATE_BINARY_TYPE, "application/json", &answer, &answer_len);
        CHECK(st == 400 && strstr(answer, bad_settings[i][1]), "binary settings %s: %ld %s", bad_settings[i][0], st,
              answer);
        free(answer), free(body);
    }
    /* the binary type elsewhere: 415, as before */
    char auth[512] = "";
    const char *key = getenv("COLT_API_KEY");
    if (key && *key) snprintf(auth, sizeof auth, "Authorization: Bearer %s", key);
    const char *octet[] = {"Content-Type: " COLT_GENERATE_BINARY_TYPE, auth[0] ? auth : NULL, NULL};
    st = serve_http_with(port, NULL, "/v1/completions", "{\"prompt\": \"x\"}", octet, 60000L, &answer);
    CHECK(st == 415, "/v1/completions with a binary Content-Type: %ld %s", st, answer);
    free(answer);
    free(req);

    /* the reader's refusals: one line each, naming what is wrong */
    struct { size_t len; int n, vocab; const char *want; } cut[] = {
        {len - 1, 1, 512, "ends inside completion 0"},
        {len, 2, 512, "has 1 completions, not the 2 asked for"},
        {len, 1, 2, "out of the vocabulary (2)"},
        {8, 1, 512, "no COLTGEN1 header"}};
    unsigned char *more = malloc(len + 1);
    memcpy(more, bytes, len);
    more[len] = 0;
    for (size_t i = 0; rc == 0 && i < sizeof cut / sizeof cut[0]; i++) {
        GenSequence x = {0};
        int r = colt_generate_answer_read(&x, cut[i].n, more, cut[i].len, 4, NULL, cut[i].vocab, NULL, err);
        CHECK(r != 0 && strstr(err, cut[i].want), "a bad binary answer (%s): rc %d, '%s'", cut[i].want, r, err);
        free(x.tokens), free(x.logprobs);
    }
    GenSequence x = {0};
    int r = rc == 0 ? colt_generate_answer_read(&x, 1, more, len + 1, 4, NULL, 512, NULL, err) : -1;
    CHECK(rc != 0 || (r != 0 && strstr(err, "1 bytes after its last completion")), "a longer binary answer: '%s'", err);
    free(x.tokens), free(x.logprobs);
    free(more), free(bytes);
}

int main(void) {
    snprintf(g_tmp, sizeof g_tmp, "/tmp/colt_test_server_mode_XXXXXX");
    if (!mkdtemp(g_tmp)) return 1;
    atexit(serve_kill_all);
    setenv("COLT_API_KEY", TEST_API_KEY, 1); /* every colt serve and colt train started here */
    curl_global_init(CURL_GLOBAL_DEFAULT);
    char args[4096], col_dir[300], srv_dir[300], async_dir[300], *err;
    snprintf(col_dir, sizeof col_dir, "%s/colocate", g_tmp);
    snprintf(srv_dir, sizeof srv_dir, "%s/server", g_tmp);
    snprintf(async_dir, sizeof async_dir, "%s/async", g_tmp);

    /* The server starts from other base weights: stories260K with its final norm zeroed (the file's last 256
     * bytes), so its logits are 0 and every sampled token has log-prob -log(512) until a push brings the
     * trainer's base. */
    char other_base[300];
    snprintf(other_base, sizeof other_base, "%s/other-base", g_tmp);
    sh("mkdir -p %s && cp %s/* %s/ && f=%s/model.safetensors && dd if=/dev/zero of=$f bs=1 count=256 "
       "seek=$(( $(stat -c %%s $f) - 256 )) conv=notrunc 2>/dev/null",
       other_base, MODEL, other_base, other_base);
    Server *srv = &g_servers[0];
    if (!server_start(srv, "serve", other_base)) goto done;
    char *body = NULL;
    long st = http(srv->port, "/colt/generate", "{\"prompts\": [[1, 403, 407]], \"streams\": [7], \"max_tokens\": 4}",
                   &body);
    json_t *gen = json_loads(body, 0, NULL), *lps = json_object_get(json_array_get(json_object_get(gen, "completions"), 0), "logprobs");
    int uniform = 0;
    for (size_t i = 0; i < json_array_size(lps); i++) uniform += fabs(json_number_value(json_array_get(lps, i)) + log(512.0)) < 1e-3;
    printf("the server starts from other base weights: %d of 4 sampled tokens at log-prob -log(512)\n", uniform);
    CHECK(st == 200 && json_array_size(lps) == 4 && uniform == 4, "the zeroed-norm server: %ld %s", st, body);
    json_decref(gen);
    free(body);

    /* 0. LoRA: server mode = colocated, the adapters alone pushed after the first push */
    char col_lora[300], srv_lora[300];
    snprintf(col_lora, sizeof col_lora, "%s/colocate-lora", g_tmp);
    snprintf(srv_lora, sizeof srv_lora, "%s/server-lora", g_tmp);
    snprintf(args, sizeof args, "%s --use_peft true --max_steps 2 --output_dir %s", BASE, col_lora);
    int code = run_train(args, &err);
    CHECK(code == 0, "colocated LoRA run: exit %d: %s", code, err);
    free(err);
    snprintf(args, sizeof args, "%s --use_peft true --max_steps 2 --output_dir %s --vllm_mode server "
                                "--vllm_server_port %d --vllm_group_port %d --vllm_server_timeout 60",
             BASE, srv_lora, srv->port, free_port());
    code = run_train(args, &err);
    CHECK(code == 0, "server-mode LoRA run: exit %d: %s", code, err);
    const char *first_push = strstr(err, "the first push sent the base weights and the LoRA adapters");
    CHECK(first_push != NULL, "server-mode LoRA run: no line about the first push: %s", err);
    if (first_push)
        printf("LoRA, %.*s", (int)(strchr(first_push, '\n') ? strchr(first_push, '\n') - first_push + 1 : (long)strlen(first_push)),
               first_push);
    free(err);
    json_t *m_col = load_metrics(col_lora), *m_srv = load_metrics(srv_lora);
    /* step 2's KL to the starting model is above 0 only if step 1 moved the weights: without that, equal
     * completions would not show that the pushes arrived */
    double kl2 = json_number_value(json_object_get(json_array_get(m_col, 1), "kl"));
    CHECK(kl2 > 0, "LoRA colocated: step 2's kl is %g, so step 1 did not move the adapters", kl2);
    int compared = 0;
    double worst = compare_metrics(m_srv, m_col, &compared);
    double adapter_bytes = adapter_arena_bytes(col_lora, ELEM_BYTES), pushed = server_metric(srv->port, "colt_weight_update_bytes");
    bool same_completions = same_file(srv_lora, col_lora, "completions.jsonl");
    bool same_adapters = same_file(srv_lora, col_lora, "adapter_model.safetensors");
    printf("LoRA sync server mode vs colocated, 2 steps: %d metric values compared, largest relative difference %.3g; "
           "completions.jsonl %s; adapter_model.safetensors %s; each step pushed %.0f bytes (the adapters: %.0f)\n",
           compared, worst, same_completions ? "identical" : "DIFFERENT", same_adapters ? "identical" : "DIFFERENT",
           pushed, adapter_bytes);
    CHECK(compared >= 2 * 10, "LoRA: only %d metric values compared", compared);
    CHECK(same_completions, "LoRA: completions differ between server mode and colocated");
    CHECK(same_adapters, "LoRA: final adapters differ between server mode and colocated");
    CHECK(adapter_bytes > 0 && pushed == adapter_bytes, "LoRA: the server's last push was %.0f bytes, the adapters are %.0f",
          pushed, adapter_bytes);
    for (size_t i = 0; i < json_array_size(m_srv); i++) {
        double mb = json_number_value(json_object_get(json_array_get(m_srv, i), "weight_sync/mb"));
        CHECK(fabs(mb * 1e6 - adapter_bytes) < 1, "LoRA step %zu: weight_sync/mb %.6f, the adapters are %.0f bytes",
              i + 1, mb, adapter_bytes);
    }
    json_decref(m_col), json_decref(m_srv);
    /* Under the sanitizers async LoRA is left to Release: its code is the async run's below plus the adapters'
     * push the synchronous LoRA run above takes. */
#if !defined(__SANITIZE_ADDRESS__)
    char async_lora[300];
    snprintf(async_lora, sizeof async_lora, "%s/async-lora", g_tmp);
    snprintf(args, sizeof args, "%s --use_peft true --max_steps 2 --output_dir %s --vllm_mode server "
                                "--vllm_server_port %d --vllm_group_port %d --vllm_server_timeout 60 --async_generation true",
             BASE, async_lora, srv->port, free_port());
    code = run_train(args, &err);
    CHECK(code == 0, "async LoRA run: exit %d: %s", code, err);
    free(err);
    json_t *m_alora = load_metrics(async_lora);
    CHECK(json_array_size(m_alora) == 2, "async LoRA: %zu metrics rows, want 2", json_array_size(m_alora));
    printf("async_generation with LoRA, 2 steps:");
    for (size_t i = 0; i < json_array_size(m_alora); i++) {
        json_t *row = json_array_get(m_alora, i);
        double stale = json_number_value(json_object_get(row, "staleness")), loss = json_number_value(json_object_get(row, "loss"));
        printf(" [step %zu: staleness %.0f, loss %.6g]", i + 1, stale, loss);
        CHECK(json_object_get(row, "staleness") && stale == (i == 0 ? 0 : 1), "async LoRA step %zu: staleness %.0f",
              i + 1, stale);
        CHECK(json_is_number(json_object_get(row, "loss")) && isfinite(loss), "async LoRA step %zu: loss", i + 1);
    }
    printf("\n");
    json_decref(m_alora);
    const int lora_pushes = 3 + 3; /* each run: the first push + one per step */
#else
    const int lora_pushes = 3;
#endif

    /* 1. synchronous server mode = colocated (the server had the LoRA runs' adapters: they come off) */
    snprintf(args, sizeof args, "%s --max_steps 2 --output_dir %s", BASE, col_dir);
    code = run_train(args, &err);
    CHECK(code == 0, "colocated run: exit %d: %s", code, err);
    free(err);
    snprintf(args, sizeof args, "%s --max_steps 2 --output_dir %s --vllm_mode server --vllm_server_port %d "
                                "--vllm_group_port %d --vllm_server_timeout 60",
             BASE, srv_dir, srv->port, free_port());
    code = run_train(args, &err);
    CHECK(code == 0, "server-mode run: exit %d: %s", code, err);
    free(err);
    m_col = load_metrics(col_dir), m_srv = load_metrics(srv_dir);
    kl2 = json_number_value(json_object_get(json_array_get(m_col, 1), "kl"));
    CHECK(kl2 > 0, "colocated: step 2's kl is %g, so step 1 did not move the weights", kl2);
    worst = compare_metrics(m_srv, m_col, &compared);
    char *completions = read_text(col_dir, "completions.jsonl");
    CHECK(count_lines(completions) == 2 * 16, "colocated completions.jsonl has %d lines, want 32",
          count_lines(completions));
    free(completions);
    same_completions = same_file(srv_dir, col_dir, "completions.jsonl");
    bool same_weights = same_file(srv_dir, col_dir, "model.safetensors");
    printf("sync server mode vs colocated, 2 steps: %d metric values compared, largest relative difference %.3g "
           "(tolerance %.0e); completions.jsonl %s; model.safetensors %s\n",
           compared, worst, REL_TOL, same_completions ? "identical" : "DIFFERENT",
           same_weights ? "identical" : "DIFFERENT");
    CHECK(compared >= 2 * 10, "only %d metric values compared", compared);
    CHECK(same_completions, "completions differ between server mode and colocated");
    CHECK(same_weights, "final weights differ between server mode and colocated");
    for (size_t i = 0; i < json_array_size(m_srv); i++) {
        json_t *row = json_array_get(m_srv, i);
        CHECK(json_number_value(json_object_get(row, "staleness")) == 0 && json_object_get(row, "staleness"),
              "sync step %zu: staleness is not 0", i + 1);
        CHECK(json_number_value(json_object_get(row, "time/weight_sync")) > 0, "sync step %zu: no time/weight_sync",
              i + 1);
    }
    double updates = server_metric(srv->port, "colt_weight_updates_total");
    printf("the server received %.0f weight pushes (the LoRA runs' %d, then the first at connect + 2 steps)\n", updates,
           lora_pushes);
    CHECK(updates == lora_pushes + 3, "colt_weight_updates_total %.0f, want %d", updates, lora_pushes + 3);
    char *lora_log = read_text("/", srv->log);
    CHECK(lora_log && strstr(lora_log, "LoRA adapters attached (r 16") && strstr(lora_log, "LoRA adapters (r 16) taken off"),
          "the server's log lacks the LoRA attach or detach: %s", lora_log ? lora_log : "(missing)");
    free(lora_log);

    /* 1b. tools: the trainer runs them, the server each turn. Under the sanitizers left to Release: the
     * server-mode turns (trainer_agent_generate_with) run sanitized in test_agent_parallel's async
     * environment run, the tools colocated in test_agent_train. */
#if !defined(__SANITIZE_ADDRESS__)
    check_tools(&g_servers[3]);
#else
    printf("tools in server mode: in the Release suite only\n");
#endif

    /* 2. async_generation: staleness 0 then 1; learns without diverging */
    snprintf(args, sizeof args, "%s --max_steps 3 --output_dir %s --vllm_mode server --vllm_server_port %d "
                                "--vllm_group_port %d --vllm_server_timeout 60 --async_generation true --save_steps 1",
             BASE, async_dir, srv->port, free_port());
    code = run_train(args, &err);
    CHECK(code == 0, "async run: exit %d: %s", code, err);
    free(err);
    json_t *m_async = load_metrics(async_dir);
    CHECK(json_array_size(m_async) == 3, "async: %zu metrics rows, want 3", json_array_size(m_async));
    printf("async_generation, 3 steps:");
    for (size_t i = 0; i < json_array_size(m_async); i++) {
        json_t *row = json_array_get(m_async, i);
        double st = json_is_number(json_object_get(row, "staleness")) ? json_number_value(json_object_get(row, "staleness")) : -1;
        double loss = json_is_number(json_object_get(row, "loss")) ? json_number_value(json_object_get(row, "loss")) : NAN;
        double lpd = json_number_value(json_object_get(row, "sampling/sampling_logp_difference/mean"));
        printf(" [step %zu: staleness %.0f, loss %.6g, sampling_logp_difference %.3g]", i + 1, st, loss, lpd);
        CHECK(st == (i == 0 ? 0 : 1), "async step %zu: staleness %.0f, want %d", i + 1, st, i == 0 ? 0 : 1);
        CHECK(isfinite(loss), "async step %zu: loss %g", i + 1, loss);
    }
    printf("\n");
    /* The first round is generated with the starting weights in both modes. */
    json_t *a1 = json_array_get(m_async, 0), *s1 = json_array_get(m_srv, 0);
    CHECK(a1 && s1 && json_equal(json_object_get(a1, "reward"), json_object_get(s1, "reward")) &&
              json_equal(json_object_get(a1, "completions/mean_length"), json_object_get(s1, "completions/mean_length")),
          "async step 1 differs from the synchronous run's step 1");
    /* A later round was generated one step behind: the trainer's log-probs moved from the server's. */
    json_t *a3 = json_array_get(m_async, 2);
    CHECK(a3 && json_number_value(json_object_get(a3, "sampling/sampling_logp_difference/mean")) > 0,
          "async step 3: sampling_logp_difference is 0, so the round was not stale");
    updates = server_metric(srv->port, "colt_weight_updates_total");
    CHECK(updates == lora_pushes + 3 + 4, "colt_weight_updates_total %.0f after the async run, want %d", updates,
          lora_pushes + 7);
    /* Resumed from step 1, an async run takes the same prompts for steps 2-3 (the round that was in flight
     * when the checkpoint was written is not in it: its prompts are taken again, generated synchronously). */
    char resumed_dir[300];
    snprintf(resumed_dir, sizeof resumed_dir, "%s/async-resumed", g_tmp);
    sh("cp -r %s %s && rm -f %s/completions.jsonl", async_dir, resumed_dir, resumed_dir);
    snprintf(args, sizeof args, "%s --max_steps 3 --output_dir %s --resume_from_checkpoint %s/checkpoint-1 "
                                "--vllm_mode server --vllm_server_port %d --vllm_group_port %d --async_generation true",
             BASE, resumed_dir, resumed_dir, srv->port, free_port());
    code = run_train(args, &err);
    CHECK(code == 0, "async resume: exit %d: %s", code, err);
    free(err);
    char *all = read_text(async_dir, "completions.jsonl"), *later = read_text(resumed_dir, "completions.jsonl");
    int same_prompts = 0, n_later = 0;
    json_t *first = json_array();
    for (char *line = all ? strtok(all, "\n") : NULL; line; line = strtok(NULL, "\n")) {
        json_t *o = json_loads(line, 0, NULL);
        if (json_integer_value(json_object_get(o, "step")) >= 2) json_array_append(first, json_object_get(o, "prompt"));
        json_decref(o);
    }
    for (char *line = later ? strtok(later, "\n") : NULL; line; line = strtok(NULL, "\n"), n_later++) {
        json_t *o = json_loads(line, 0, NULL);
        same_prompts += json_equal(json_object_get(o, "prompt"), json_array_get(first, (size_t)n_later));
        json_decref(o);
    }
    printf("async resumed from checkpoint-1: %d of %d completions of steps 2-3 have the uninterrupted run's prompts\n",
           same_prompts, n_later);
    CHECK(n_later == 32 && same_prompts == n_later && (int)json_array_size(first) == n_later,
          "async resume: %d of %d prompts as uninterrupted (%zu there)", same_prompts, n_later, json_array_size(first));
    json_decref(first);
    free(all), free(later);
    json_t *m_resumed = load_metrics(resumed_dir);
    json_t *r2 = json_array_get(m_resumed, 1);
    CHECK(r2 && json_number_value(json_object_get(r2, "staleness")) == 0 &&
              json_number_value(json_object_get(json_array_get(m_resumed, 2), "staleness")) == 1,
          "async resume: staleness of steps 2-3 should be 0 (generated at resume) then 1");
    json_decref(m_resumed);
    json_decref(m_col), json_decref(m_srv), json_decref(m_async);

    char *info = NULL, want_updates[64];
    /* the LoRA runs' pushes + 3 + 4 + the resumed run's 3 */
    snprintf(want_updates, sizeof want_updates, "\"weight_updates\":%d", lora_pushes + 10);
    long st0 = http(srv->port, "/colt/info", NULL, &info);
    CHECK(st0 == 200 && strstr(info, "\"device\":\"" TEST_DEVICE) && strstr(info, "\"deterministic\":true") &&
              strstr(info, want_updates),
          "/colt/info: %ld %s (want %s)", st0, info, want_updates);
    free(info);

    /* 3. a trainer that never joins the channel: the server times out, logs, serves on */
    st = http(srv->port, "/colt/init_weight_sync", "{\"port\": 1, \"timeout\": 2}", NULL);
    CHECK(st == 200, "init_weight_sync answered %ld", st);
    st = http(srv->port, "/colt/init_weight_sync", "{\"port\": 1, \"timeout\": 2}", NULL);
    CHECK(st == 409, "a second init_weight_sync answered %ld, want 409", st);
    double t0 = now_s();
    while (server_metric(srv->port, "colt_weight_sync_failures_total") < 1 && now_s() - t0 < 30) usleep(100 * 1000);
    double failures = server_metric(srv->port, "colt_weight_sync_failures_total");
    printf("a trainer that never joins: the server gave up after %.1f s (failures %.0f)\n", now_s() - t0, failures);
    CHECK(failures == 1, "colt_weight_sync_failures_total %.0f, want 1", failures);
    st = http(srv->port, "/colt/generate", "{\"prompts\": [[1, 403, 407]], \"streams\": [7], \"max_tokens\": 4}", &body);
    CHECK(st == 200 && strstr(body, "\"token_ids\""), "generate after the failed channel: %ld %s", st, body);
    check_binary_forms(srv->port, body);
    free(body);
    st = http(srv->port, "/colt/update_weights", "{}", &body);
    CHECK(st == 409 && strstr(body, "not open"), "update_weights without a channel: %ld %s", st, body);
    free(body);
    const char *bad_lora[][2] = {
        {"{\"port\": 1, \"lora\": {\"r\": 0, \"lora_alpha\": 16, \"target_modules\": [\"q_proj\"]}}", "'r' must be"},
        {"{\"port\": 1, \"lora\": {\"r\": 4096, \"lora_alpha\": 16, \"target_modules\": [\"q_proj\"]}}",
         "LoRA rank r = 4096 must be in 1..32"},
        {"{\"port\": 1, \"lora\": {\"r\": 4, \"lora_alpha\": 16, \"target_modules\": [\"lm_head\"]}}",
         "target_modules[0] is not a layer colt adapts"},
        {"{\"port\": 1, \"lora\": {\"r\": 4, \"lora_alpha\": 16, \"target_modules\": [\"q_proj\"], \"use_dora\": true}}",
         "unknown key 'use_dora'"},
        {"{\"port\": 1, \"lora\": 8}", "'lora' must be an object"}};
    for (int i = 0; i < 5; i++) {
        st = http(srv->port, "/colt/init_weight_sync", bad_lora[i][0], &body);
        CHECK(st == 400 && strstr(body, bad_lora[i][1]), "bad init_weight_sync %s: %ld %s", bad_lora[i][0], st, body);
        free(body);
    }
    const char *bad[][2] = {{"{\"prompts\": [[1]], \"streams\": [1, 2]}", "one per prompt"},
                            {"{\"prompts\": [[99999]], \"streams\": [1]}", "not a token id"},
                            {"{\"prompts\": [[1]], \"streams\": [4294967296]}", "streams[0]"},
                            {"{\"prompts\": [[1]], \"streams\": [1], \"temprature\": 1}", "unknown key 'temprature'"},
                            {"{\"prompts\": [[1]], \"streams\": [1], \"max_tokens\": 100000}", "max_tokens"},
                            {"{\"prompts\": [[1]], \"streams\": [1], \"max_tokens\": [4, 4]}", "one budget per prompt (1)"},
                            {"{\"prompts\": [[1]], \"streams\": [1], \"first_positions\": [-1]}", "first_positions[0]"},
                            {"not json", "not JSON"}};
    for (int i = 0; i < 8; i++) {
        st = http(srv->port, "/colt/generate", bad[i][0], &body);
        CHECK(st == 400 && strstr(body, bad[i][1]), "bad /colt/generate %s: %ld %s", bad[i][0], st, body);
        free(body);
    }
    CHECK(http(srv->port, "/health", NULL, NULL) == 200, "the server is not healthy after the bad requests");

    /* 4. the one-command form: colt train starts its own colt serve (on the CPU here). Under the sanitizers the
     * clean run is left to Release: its training is run 1's, and the errored and SIGKILLed runs below start,
     * use and stop their own server through the same code (cmd_train.c), the errored one drawing its key. */
    pid_t own;
#if !defined(__SANITIZE_ADDRESS__)
    char own_dir[300];
    snprintf(own_dir, sizeof own_dir, "%s/own", g_tmp);
    snprintf(args, sizeof args, "%s --max_steps 2 --output_dir %s --server_devices " OWN_SERVER_DEVICES, BASE, own_dir);
    unsetenv("COLT_API_KEY"); /* the trainer draws a key for its server */
    code = run_train(args, &err);
    setenv("COLT_API_KEY", TEST_API_KEY, 1);
    CHECK(code == 0, "server_devices run: exit %d: %s", code, err);
    own = own_server_pid(err);
    free(err);
    CHECK(own > 0, "server_devices: no 'started colt serve (pid N)' line");
    CHECK(own > 0 && process_gone(own, 5), "server_devices: colt serve (pid %d) still runs after training", (int)own);
    char *serve_log = read_text(own_dir, "serve.log");
    CHECK(serve_log && strstr(serve_log, "weight channel open") && strstr(serve_log, "colt serve: stopped") &&
              strstr(serve_log, "API key set"),
          "server_devices: serve.log lacks the key, the channel or the stop: %s", serve_log ? serve_log : "(missing)");
    free(serve_log);
    json_t *m_own = load_metrics(own_dir);
    m_col = load_metrics(col_dir);
    worst = compare_metrics(m_own, m_col, &compared);
    CHECK(same_file(own_dir, col_dir, "completions.jsonl"), "server_devices: completions differ from colocated");
    printf("server_devices (colt serve started by colt train, pid %d): %d metric values, largest relative difference "
           "%.3g; completions %s; the server stopped with the run\n",
           (int)own, compared, worst, same_file(own_dir, col_dir, "completions.jsonl") ? "identical" : "DIFFERENT");
    json_decref(m_own), json_decref(m_col);
#endif
    /* an error after the server started: the server is stopped too (its key drawn by colt train) */
    snprintf(args, sizeof args, "%s --max_steps 1 --output_dir %s/own2 --server_devices " OWN_SERVER_DEVICES " --dataset %s/none.jsonl",
             BASE, g_tmp, g_tmp);
    unsetenv("COLT_API_KEY");
    code = run_train(args, &err);
    setenv("COLT_API_KEY", TEST_API_KEY, 1);
    own = own_server_pid(err);
    CHECK(code != 0 && own > 0 && process_gone(own, 5), "server_devices + an error: exit %d, server pid %d left: %s",
          code, (int)own, err);
    free(err);
    /* the trainer SIGKILLed mid-run: its server dies with it */
    char own3[300], pid_file[300], err_file[300];
    snprintf(own3, sizeof own3, "%s/own3", g_tmp);
    snprintf(pid_file, sizeof pid_file, "%s/train.pid", g_tmp);
    snprintf(err_file, sizeof err_file, "%s/own3.err", g_tmp);
    sh("%s train %s --max_steps 50 --output_dir %s --server_devices " OWN_SERVER_DEVICES " > /dev/null 2> %s & echo $! > %s",
       COLT_BINARY, BASE, own3, err_file, pid_file);
    char *pid_text = read_text(g_tmp, "train.pid");
    pid_t trainer = pid_text ? (pid_t)atoi(pid_text) : 0;
    free(pid_text);
    own = 0;
    for (double t1 = now_s(); trainer > 0 && !own && now_s() - t1 < 60; usleep(50 * 1000)) {
        char *e = read_text(g_tmp, "own3.err");
        char *m = read_text(own3, "metrics.jsonl");
        if (m && count_lines(m) >= 1) own = own_server_pid(e); /* training is under way */
        free(e), free(m);
    }
    CHECK(trainer > 0 && own > 0, "the background trainer did not get to its first step");
    if (trainer > 0) kill(trainer, SIGKILL);
    CHECK(own > 0 && process_gone(own, 5), "colt serve (pid %d) outlived its SIGKILLed trainer", (int)own);
    printf("server_devices: an error after the server started, and a SIGKILLed trainer, leave no server behind\n");
    if (own > 0 && !process_gone(own, 0)) kill(own, SIGKILL);

    /* the server killed mid-run: the trainer stops within vllm_server_timeout, saying which server failed */
    Server *srv3 = &g_servers[2];
    if (server_start(srv3, "serve-killed", MODEL)) {
        char dir3[300];
        snprintf(dir3, sizeof dir3, "%s/server-killed", g_tmp);
        snprintf(err_file, sizeof err_file, "%s/killed.err", g_tmp);
        sh("%s train %s --max_steps 200 --output_dir %s --vllm_mode server --vllm_server_port %d --vllm_group_port %d "
           "--vllm_server_timeout 10 > /dev/null 2> %s & echo $! > %s",
           COLT_BINARY, BASE, dir3, srv3->port, free_port(), err_file, pid_file);
        pid_text = read_text(g_tmp, "train.pid");
        trainer = pid_text ? (pid_t)atoi(pid_text) : 0;
        free(pid_text);
        bool stepping = false;
        for (double t1 = now_s(); trainer > 0 && !stepping && now_s() - t1 < 60; usleep(50 * 1000)) {
            char *m = read_text(dir3, "metrics.jsonl");
            stepping = m && count_lines(m) >= 1;
            free(m);
        }
        CHECK(stepping, "the trainer against the server to kill did not get to its first step");
        kill(srv3->pid, SIGKILL);
        waitpid(srv3->pid, NULL, 0);
        srv3->pid = 0;
        double t1 = now_s();
        bool gone = trainer > 0 && process_gone(trainer, 60);
        char *e = read_text(g_tmp, "killed.err");
        const char *line = e ? error_line(e) : NULL;
        char url[64];
        snprintf(url, sizeof url, "127.0.0.1:%d", srv3->port);
        printf("the server SIGKILLed mid-run: the trainer stopped after %.1f s: %s", now_s() - t1, line ? line : "?\n");
        CHECK(gone, "the trainer still runs 60 s after its server was killed");
        CHECK(line && strstr(line, url) && count_lines(line) == 1, "the trainer's error does not name %s: %s", url,
              e ? e : "(none)");
        free(e);
        if (trainer > 0 && !gone) kill(trainer, SIGKILL);
    }

    /* 5. bad input */
    int closed = free_port();
    snprintf(args, sizeof args, "%s --max_steps 1 --output_dir %s/x --vllm_mode server --vllm_server_port %d "
                                "--vllm_server_timeout 2",
             BASE, g_tmp, closed);
    char needle[128];
    snprintf(needle, sizeof needle, "no colt serve answered at http://127.0.0.1:%d within 2 s", closed);
    expect_error("no server", args, needle, 30);
    /* a server with another model: tiny-llama-f32 (another shape) with the demo's tokenizer to serve text */
    char other[300];
    snprintf(other, sizeof other, "%s/other-model", g_tmp);
    sh("mkdir -p %s && cp %s/tests/data/models/tiny-llama-f32/* %s/ && cp %s/tokenizer.json %s/", other,
       COLT_SOURCE_DIR, other, MODEL, other);
    Server *srv2 = &g_servers[1];
    if (server_start(srv2, "serve-other", other)) {
        snprintf(args, sizeof args, "%s --max_steps 1 --output_dir %s/y --vllm_mode server --vllm_server_port %d "
                                    "--vllm_group_port %d --vllm_server_timeout 30",
                 BASE, g_tmp, srv2->port, free_port());
        expect_error("another model on the server", args, "weight sync", 60);
        CHECK(http(srv2->port, "/health", NULL, NULL) == 200, "the other server stopped serving after the mismatch");
    }
    snprintf(args, sizeof args, "%s --vllm_mode server --tensor_parallel_size 2 --output_dir %s/z", BASE, g_tmp);
    expect_error("server + tensor_parallel_size 2", args, "vllm_mode server needs tensor_parallel_size 1", 30);
    snprintf(args, sizeof args, "%s --async_generation true --output_dir %s/z", BASE, g_tmp);
    expect_error("async without a server", args, "async_generation needs vllm_mode server", 30);

done:
    for (int i = 0; i < 2; i++) { /* a clean stop (the third server is killed on purpose below), and no sanitizer report in the servers' logs either */
        if (g_servers[i].pid > 0) {
            int code = serve_stop(&g_servers[i], SIGTERM, 30);
            CHECK(code == 0, "colt serve %s exited %d after SIGTERM", g_servers[i].log, code);
        }
        char *log = g_servers[i].log[0] ? read_text("/", g_servers[i].log) : NULL;
        CHECK(!log || (!strstr(log, "Sanitizer") && !strstr(log, "runtime error:")), "%s: %s", g_servers[i].log, log);
        free(log);
    }
    serve_kill_all();
    curl_global_cleanup();
    if (!getenv("KEEP_TMP")) sh("rm -rf %s", g_tmp);
    printf("test_server_mode: %d checks, %d failures\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
