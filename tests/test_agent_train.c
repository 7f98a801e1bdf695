/* test_agent_train.c — tool calling end to end with a model that really calls tools:
 * tests/data/models/tiny-tool-f32 (tests/ref/make_tool_model.py) was taught to answer "add A B" by
 * calling add(a, b) and repeating the result, and, in the same way, to call a tool that raises (div by 0),
 * one that does not exist (mul), one that hangs (slow), one whose result never fits (big), and to write a
 * call with broken JSON (bad). Its tools are tests/data/agent/calc_tools.py.
 *
 *   1. Parity with TRL: for each golden prompt, colt's prompt ids (rendered with the tools' schemas),
 *      then a greedy multi-turn rollout by agent_generate over the tool worker, equal TRL's
 *      _tool_call_loop on transformers' greedy generate: completion ids, tool_mask and the
 *      completion's messages, token for token; TRL's tool suffix ids; a turn holding an id past the
 *      tokenizer's vocabulary (the model has 800 rows, the tokenizer 799 ids) parsed as TRL parses it.
 *   2. `colt train` on the CPU, 2 steps of 9 prompts x 4, every behaviour in one batch: tools are called
 *      and their results come back (tools/call_frequency, tool_response in the completions), the reward
 *      (tests/data/agent/tool_rewards.py) is 1 exactly when the last message repeats the last tool
 *      result, failures are counted (tools/failure_frequency) and each case's messages are TRL's:
 *      {'error': ...} for the raising, unknown and hanging tools (tool_timeout 1: the run is not held
 *      up), plain content and no call for broken JSON, the results dropped and the conversation ended
 *      for the result that does not fit max_completion_length. Two prompts hold 3-digit sums the model never
 *      saw: it writes anything there (wrong or missing arguments, other tools, several calls), so rewards
 *      differ within groups and the loss moves; for every completion, each call is answered by one tool
 *      message, in order. The evals before and after training (eval_dataset) call the tools as well,
 *      their rewards read the same way.
 *   3. Resuming from the run's checkpoint-1 ends at step 2 with tools called again, its reward, loss and
 *      tools metrics equal to the uninterrupted run's step 2. The same run under mpirun -np 2 with LoRA: step
 *      1's reward and tools metrics (summed over the ranks, as TRL) equal one process's, both ranks calling.
 *   4. environment_factory (examples/environments/writer.py): colt's greedy round, saved inside the round in
 *      checkpoint-1, equals TRL's own _generate_and_score_completions (tests/ref/make_env_goldens.py) sample
 *      for sample: per-sample prompt ids (reset's text appended), completion ids, tool mask, both rewards
 *      (one reading environments=[...], the environment's get_reward); a resume from that checkpoint gives
 *      the uninterrupted run's steps 2-4.
 * Exits 77 (skipped) without python3 and transformers (the tool worker needs them). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent/agent_loop.h"
#include "agent/agent_tools.h"
#include "agent/tool_calls.h"
#include "agent/tool_worker.h"
#include "backend/backend.h"
#include "core/error.h"
#include "core/fileio.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

#include "harness.h"

#define MODEL COLT_SOURCE_DIR "/tests/data/models/tiny-tool-f32"
#define AGENT COLT_SOURCE_DIR "/tests/data/agent"

static const char *const TOOLS[] = {AGENT "/calc_tools.py:add", AGENT "/calc_tools.py:div",
                                    AGENT "/calc_tools.py:slow", AGENT "/calc_tools.py:big"};
#define N_TOOLS 4

static json_t *int_array(const int *v, int n) {
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_integer(v[i]));
    return a;
}

static json_t *byte_array(const uint8_t *v, int n) {
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_integer(v[i]));
    return a;
}

/* ---------------------------------------------------------------- 1. parity with TRL's loop */

static void test_order(Tokenizer *tok, ToolCallFormat format);

static void test_parity(void) {
    char err[ERR_LEN];
    json_error_t jerr;
    json_t *goldens = json_load_file(AGENT "/tool_model_goldens.json", 0, &jerr);
    CHECK(goldens, "tool_model_goldens.json: %s", jerr.text);
    Model *m = NULL;
    Tokenizer *tok = NULL;
    ToolWorker *w = NULL;
    if (!goldens) return;
    if (model_load(&m, MODEL, backend_cpu(), err) != 0 || tokenizer_load(&tok, MODEL, err) != 0 ||
        tool_worker_start(&w, TOOLS, N_TOOLS, NULL, NULL, err) != 0) {
        CHECK(false, "loading %s: %s", MODEL, err);
        goto done;
    }
    const char *template_source = tokenizer_chat_template(tok);
    ToolCallFormat format;
    CHECK(tool_calls_format_of_template(&format, template_source, err) == 0 && format == TOOL_FORMAT_HERMES,
          "the chat template's tool-call format: %s", err);

    /* TRL's suffix for one result, on this tokenizer */
    int *suffix = NULL;
    size_t n_suffix = 0;
    json_t *tool_messages = json_pack("[{s:s, s:s, s:s}]", "role", "tool", "name", "add", "content", "42");
    CHECK(tool_calls_suffix_ids(&suffix, &n_suffix, tok, template_source, tool_messages, NULL, err) == 0, "suffix: %s",
          err);
    json_t *got_suffix = int_array(suffix, (int)n_suffix);
    CHECK(json_equal(got_suffix, json_object_get(goldens, "suffix_add_42")), "tool suffix ids differ from TRL's");
    json_decref(got_suffix), json_decref(tool_messages), free(suffix);

    const json_t *rollouts = json_object_get(goldens, "rollouts");
    int n = (int)json_array_size(rollouts), budget = (int)json_integer_value(json_object_get(goldens, "budget"));
    AgentConversation *convs = calloc((size_t)n, sizeof *convs);
    int **prompts = calloc((size_t)n, sizeof(int *));
    for (int i = 0; i < n; i++) {
        const json_t *g = json_array_get(rollouts, i);
        json_t *messages = json_pack("[{s:s, s:s}]", "role", "user", "content",
                                     json_string_value(json_object_get(g, "user")));
        size_t n_ids = 0;
        if (tool_calls_prompt_ids(&prompts[i], &n_ids, tok, template_source, messages, tool_worker_schemas(w), NULL,
                                  err) != 0)
            CHECK(false, "prompt %d: %s", i, err);
        json_t *got = int_array(prompts[i], (int)n_ids);
        CHECK(json_equal(got, json_object_get(g, "prompt_ids")), "'%s': prompt ids differ from TRL's",
              json_string_value(json_object_get(g, "user")));
        json_decref(got), json_decref(messages);
        convs[i] = (AgentConversation){.prompt = prompts[i], .prompt_len = (int)n_ids, .stream = (uint64_t)i};
    }
    int stop = tokenizer_token_id(tok, "<|im_end|>");
    GenerateOptions go = {.sampling = sampling_params_greedy(), .max_new_tokens = budget, .stop_ids = &stop,
                          .n_stop_ids = 1};
    AgentToolsOptions to = {.tok = tok, .template_source = template_source, .format = format, .worker = w,
                            .timeout_s = 10};
    AgentToolRunner *runner = agent_tool_runner_create(&to, n);
    AgentTools handler = agent_tool_runner_handler(runner);
    int rc = agent_generate(m, convs, n, &go, NULL, &handler, NULL, NULL, err);
    CHECK(rc == 0, "agent_generate: %s", err);
    int same = 0;
    for (int i = 0; rc == 0 && i < n; i++) {
        const json_t *g = json_array_get(rollouts, i);
        const char *user = json_string_value(json_object_get(g, "user"));
        json_t *ids = int_array(convs[i].tokens, convs[i].n_tokens);
        json_t *mask = byte_array(convs[i].model_mask, convs[i].n_tokens);
        bool ids_ok = json_equal(ids, json_object_get(g, "completion_ids"));
        bool mask_ok = json_equal(mask, json_object_get(g, "tool_mask"));
        bool messages_ok = json_equal(agent_tool_runner_messages(runner, i), json_object_get(g, "messages"));
        char *got = json_dumps(agent_tool_runner_messages(runner, i), JSON_COMPACT);
        char *want = json_dumps(json_object_get(g, "messages"), JSON_COMPACT);
        CHECK(ids_ok && mask_ok && messages_ok, "'%s': ids %s, tool_mask %s, messages %s\n  colt: %s\n  TRL:  %s", user,
              ids_ok ? "equal" : "DIFFER", mask_ok ? "equal" : "DIFFER", messages_ok ? "equal" : "DIFFER", got, want);
        same += ids_ok && mask_ok && messages_ok;
        printf("parity %-10s %3d tokens, %d tool rounds, results dropped: %s, %s\n", user, convs[i].n_tokens,
               convs[i].tool_rounds, convs[i].results_dropped ? "yes" : "no", got);
        free(got), free(want);
        json_decref(ids), json_decref(mask);
    }
    printf("parity: %d/%d greedy rollouts equal TRL's (completion ids, tool_mask, messages)\n", same, n);

    /* The model has 800 embedding rows, the tokenizer 799 ids; at a high temperature the model samples
     * id 799. TRL's parse_response decodes it to nothing (transformers' decode); colt stopped the run with
     * "token id 799 is out of range" (fixed in tool_calls_parse_ids). The golden's first turn with 799
     * inserted parses as without it; [799, '#', 799] is {"role": "assistant", "content": "#"} in TRL. */
    const json_t *g0 = json_array_get(rollouts, 0);
    const json_t *ids0 = json_object_get(g0, "completion_ids");
    int padded = tokenizer_vocab_size(tok), turn[80], n_turn = 0;
    CHECK(padded < model_config(m)->vocab_size, "the model has %d rows, the tokenizer %d ids: nothing to test",
          model_config(m)->vocab_size, padded);
    for (size_t k = 0; k < json_array_size(ids0) && n_turn < 78; k++) {
        int id = (int)json_integer_value(json_array_get(ids0, k));
        if (id == stop) turn[n_turn++] = padded;
        turn[n_turn++] = id;
        if (id == stop) break;
    }
    json_t *parsed = NULL;
    rc = tool_calls_parse_ids(&parsed, format, tok, prompts[0], (size_t)convs[0].prompt_len, turn, (size_t)n_turn,
                              tool_worker_schemas(w), err);
    json_t *want0 = json_array_get(json_object_get(g0, "messages"), 0);
    CHECK(rc == 0 && json_equal(parsed, want0), "a turn holding padded id %d: %s", padded,
          rc ? err : "parsed otherwise");
    json_decref(parsed), parsed = NULL;
    int hash[3] = {padded, tokenizer_token_id(tok, "#"), padded};
    rc = tool_calls_parse_ids(&parsed, format, tok, NULL, 0, hash, 3, tool_worker_schemas(w), err);
    json_t *want_hash = json_pack("{s:s, s:s}", "role", "assistant", "content", "#");
    CHECK(rc == 0 && json_equal(parsed, want_hash), "[%d, '#', %d]: %s", padded, padded, rc ? err : "parsed otherwise");
    printf("padded id %d (model rows %d) in a turn: left out when parsing, as TRL: %s\n", padded,
           model_config(m)->vocab_size, rc == 0 && json_equal(parsed, want_hash) ? "yes" : "NO");
    json_decref(parsed), json_decref(want_hash);
    test_order(tok, format);
    for (int i = 0; i < n; i++) agent_conversation_free(&convs[i]), free(prompts[i]);
    free(convs), free(prompts);
    agent_tool_runner_free(runner);
done:
    tool_worker_free(w);
    tokenizer_free(tok);
    model_free(m);
    json_decref(goldens);
}

/* TRL's order of one turn's tool messages: sync results and errors raised when calling, in call order, then
 * what the async tools gave when awaited (_tool_call_loop: tool_call_results, then async_results). The turn
 * calls async weather with a wrong argument (raises TypeError when called), async weather that raises when
 * awaited, and sync calculator. colt put the first error after calculator's result. */
static void test_order(Tokenizer *tok, ToolCallFormat format) {
    char err[ERR_LEN];
    const char *tools[] = {AGENT "/tools.py:calculator", AGENT "/tools.py:weather"};
    ToolWorker *w = NULL;
    if (tool_worker_start(&w, tools, 2, NULL, NULL, err) != 0) {
        CHECK(false, "tool_worker_start: %s", err);
        return;
    }
    const char *text = "<tool_call>\n{\"name\": \"weather\", \"arguments\": {\"town\": \"Paris\"}}\n</tool_call>\n"
                       "<tool_call>\n{\"name\": \"weather\", \"arguments\": {\"city\": \" \"}}\n</tool_call>\n"
                       "<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"a\": 3, \"b\": 4, \"op\": \"*\"}}\n"
                       "</tool_call><|im_end|>";
    const char *prefix_text = "<|im_start|>user\nweather?<|im_end|>\n<|im_start|>assistant\n";
    int *turn = NULL, *prefix = NULL;
    size_t n_turn = 0, n_prefix = 0;
    CHECK(tokenizer_encode(tok, text, strlen(text), &turn, &n_turn, err) == 0 &&
              tokenizer_encode(tok, prefix_text, strlen(prefix_text), &prefix, &n_prefix, err) == 0,
          "encode: %s", err);
    AgentToolsOptions to = {.tok = tok, .template_source = tokenizer_chat_template(tok), .format = format,
                            .worker = w, .timeout_s = 10};
    AgentToolRunner *runner = agent_tool_runner_create(&to, 1);
    AgentTools h = agent_tool_runner_handler(runner);
    bool called = false;
    int rc = h.turn_ended(h.ctx, 0, prefix, (int)n_prefix, turn, (int)n_turn, FINISH_STOP, true, &called, err);
    CHECK(rc == 0 && called, "turn_ended: %s", rc ? err : "no call");
    int n_ready = 0;
    double t0 = now_s();
    while (rc == 0 && called && n_ready == 0 && now_s() - t0 < 20) {
        const AgentToolResult *ready = NULL;
        rc = h.poll(h.ctx, 0.2, &ready, &n_ready, err);
    }
    CHECK(rc == 0 && n_ready == 1, "poll: %s", rc ? err : "no results");
    json_t *want = json_pack("[{s:s, s:s, s:s}, {s:s, s:s, s:s}, {s:s, s:s, s:s}]",
                             "role", "tool", "name", "weather", "content",
                             "{'error': \"weather() got an unexpected keyword argument 'town'\"}",
                             "role", "tool", "name", "calculator", "content", "12",
                             "role", "tool", "name", "weather", "content", "{'error': 'no such city'}");
    const json_t *messages = agent_tool_runner_messages(runner, 0);
    json_t *got = json_array();
    for (size_t k = 1; k < json_array_size(messages); k++) json_array_append(got, json_array_get(messages, k));
    char *dump = json_dumps(got, JSON_COMPACT);
    CHECK(json_equal(got, want), "tool messages in TRL's order: got %s", dump);
    int calls = 0, failures = 0;
    agent_tool_runner_counts(runner, 0, &calls, &failures);
    CHECK(calls == 3 && failures == 2, "calls %d, failures %d: want 3 and 2", calls, failures);
    printf("order of one turn's tool messages (async raising when called, async raising when awaited, sync): %s\n",
           dump);
    free(dump);
    json_decref(got), json_decref(want);
    agent_tool_runner_free(runner);
    free(turn), free(prefix);
    tool_worker_free(w);
}

/* ---------------------------------------------------------------- 2. colt train */

/* --deterministic true: tools run while the engine decodes, so which turns share a decode step depends on when
 * each tool returns; only the batch-invariant engine makes the rounds (their sampling log-probs, which the
 * importance-sampling correction reads) the same in every run, as the resume checks below need. */
static const char *ARGS =
    "--deterministic true --model " MODEL " --dataset " AGENT "/tool_prompts.jsonl --tools '[\"" AGENT "/calc_tools.py:add\", \"" AGENT
    "/calc_tools.py:div\", \"" AGENT "/calc_tools.py:slow\", \"" AGENT "/calc_tools.py:big\"]' "
    "--tool_timeout 1 --max_tool_calling_iterations 2 "
    "--reward_funcs '[\"" AGENT "/tool_rewards.py:repeats_tool_result\", \"" AGENT
    "/tool_rewards.py:record_messages\"]' "
    "--reward_weights '[1, 0]' --num_generations 4 --per_device_train_batch_size 36 --max_completion_length 64 "
    "--max_prompt_length 128 --temperature 1.0 --learning_rate 1e-3 --beta 0 --logging_steps 1 "
    "--log_completions_count 36 --save_steps 1 --seed 7 --report_to none";

static int run_train(const char *extra, char **err) {
    char cd[300], args[4096];
    snprintf(cd, sizeof cd, "cd %s &&", g_tmp);
    snprintf(args, sizeof args, "%s %s", ARGS, extra);
    return run_colt_with(&(ColtRun){.env = cd, .subcommand = "train", .timeout_s = 500}, args, err);
}

/* The text between after and the next until in s (malloc'd), or NULL. */
static char *between(const char *s, const char *after, const char *until) {
    const char *a = strstr(s, after);
    if (!a) return NULL;
    a += strlen(after);
    const char *b = strstr(a, until);
    return b ? strndup(a, (size_t)(b - a)) : NULL;
}

/* completions.jsonl or eval_*.jsonl: the reward is 1 exactly when the text after the last tool response is
 * that response. */
static int check_completions(const char *dir, const char *name, int *with_results) {
    char *path = path_join(dir, name), *text = NULL;
    size_t len;
    int lines = 0, consistent = 0, rewarded = 0;
    *with_results = 0;
    if (file_read_all(path, &text, &len, NULL) == 0) {
        for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
            json_t *o = json_loads(line, 0, NULL);
            const char *completion = json_string_value(json_object_get(o, "completion"));
            double reward = json_number_value(json_object_get(o, "reward"));
            const char *last = NULL;
            for (const char *p = completion ? strstr(completion, "<tool_response>\n") : NULL; p;
                 p = strstr(p + 1, "<tool_response>\n"))
                last = p;
            char *result = last ? between(last, "<tool_response>\n", "\n</tool_response>") : NULL;
            const char *tail = last ? strstr(last, "</tool_response>") : NULL;
            const char *answer = tail ? strstr(tail, "assistant\n") : NULL;
            double want = result && answer && strcmp(answer + strlen("assistant\n"), result) == 0 ? 1.0 : 0.0;
            lines++, consistent += reward == want, rewarded += reward == 1.0, *with_results += result != NULL;
            CHECK(reward == want, "%s line %d: reward %g, want %g: %s", name, lines, reward, want, completion);
            free(result);
            json_decref(o);
        }
    }
    printf("%-18s %d completions, %d with tool results, %d rewarded 1, reward = [answer == tool result] in %d\n",
           name, lines, *with_results, rewarded, consistent);
    CHECK(lines > 0 && rewarded > 0 && *with_results > rewarded, "%s: %d lines, %d rewarded, %d with results: want "
          "some rewarded and some not", name, lines, rewarded, *with_results);
    free(text), free(path);
    return lines;
}

/* The messages the reward got for one prompt's completions, as TRL gives them. */
static void check_case(json_t *const *records, int n, const char *user) {
    int seen = 0;
    for (int i = 0; i < n; i++) {
        const char *u = json_string_value(json_object_get(records[i], "user"));
        if (!u || strcmp(u, user) != 0) continue;
        seen++;
        const json_t *messages = json_object_get(records[i], "messages");
        const json_t *first = json_array_get(messages, 0), *tool = json_array_get(messages, 1);
        size_t n_messages = json_array_size(messages);
        const char *content = json_string_value(json_object_get(tool, "content"));
        const char *role1 = json_string_value(json_object_get(tool, "role"));
        const char *name = json_string_value(json_object_get(json_object_get(
            json_array_get(json_object_get(first, "tool_calls"), 0), "function"), "name"));
        char *dump = json_dumps(messages, JSON_COMPACT);
        bool ok = false;
        if (!strncmp(user, "add", 3))
            ok = n_messages == 3 && name && !strcmp(name, "add") && role1 && !strcmp(role1, "tool") && content &&
                 atoi(content) == atoi(user + 4) + atoi(strchr(user + 4, ' ') + 1);
        else if (!strncmp(user, "div", 3))
            ok = n_messages == 3 && content && !strcmp(content, "{'error': 'integer division or modulo by zero'}");
        else if (!strncmp(user, "mul", 3))
            ok = n_messages == 3 && content && !strcmp(content, "{'error': 'Tool mul not found.'}");
        else if (!strncmp(user, "slow", 4))
            ok = n_messages == 3 && content && !strcmp(content, "{'error': 'Tool slow timed out after 1 s'}");
        else if (!strncmp(user, "bad", 3)) /* TRL: the whole completion is content, no call */
            ok = n_messages == 1 && !json_object_get(first, "tool_calls") &&
                 strstr(json_string_value(json_object_get(first, "content")), "<tool_call>");
        else if (!strncmp(user, "big", 3)) /* the results did not fit: dropped, the call stays, nothing after */
            ok = n_messages == 1 && name && !strcmp(name, "big");
        CHECK(ok, "'%s': messages %s", user, dump);
        if (seen == 1) printf("  %-10s -> %s\n", user, dump);
        free(dump);
    }
    CHECK(seen > 0, "'%s': no completions scored", user);
}

/* Any completion, whatever the model wrote: each assistant turn with calls is followed by one tool message
 * per call, in call order (the tools here are all sync), or by none when the results were dropped, which
 * ends the conversation. */
static bool calls_answered_in_order(const json_t *messages) {
    size_t n = json_array_size(messages);
    for (size_t i = 0; i < n; i++) {
        const json_t *calls = json_object_get(json_array_get(messages, i), "tool_calls");
        if (!json_array_size(calls)) continue;
        size_t k = 0;
        for (; i + 1 + k < n; k++) {
            const json_t *m = json_array_get(messages, i + 1 + k);
            if (strcmp(json_string_value(json_object_get(m, "role")), "tool") != 0) break;
            const char *name = json_string_value(json_object_get(m, "name"));
            const char *called = json_string_value(
                json_object_get(json_object_get(json_array_get(calls, k), "function"), "name"));
            if (k >= json_array_size(calls) || !name || !called || strcmp(name, called) != 0) return false;
        }
        if (k != json_array_size(calls) && !(k == 0 && i + 1 == n)) return false;
        i += k;
    }
    return true;
}

static void check_messages(void) {
    char *path = path_join(g_tmp, "messages.jsonl"), *text = NULL;
    size_t len;
    json_t *records[256];
    int n = 0;
    if (file_read_all(path, &text, &len, NULL) == 0)
        for (char *line = strtok(text, "\n"); line && n < 256; line = strtok(NULL, "\n"))
            records[n++] = json_loads(line, 0, NULL);
    int in_order = 0;
    for (int i = 0; i < n; i++) {
        bool ok = calls_answered_in_order(json_object_get(records[i], "messages"));
        char *dump = ok ? NULL : json_dumps(json_object_get(records[i], "messages"), JSON_COMPACT);
        CHECK(ok, "calls and tool messages do not pair up: %s", dump);
        free(dump);
        in_order += ok;
    }
    printf("messages the reward got: %d completions, calls and tool messages paired in %d; one per case:\n", n,
           in_order);
    /* the 3-digit sums are new to the model, which writes anything there (wrong or missing arguments, other
     * tools, several calls): only the pairing above is checked for them */
    const char *cases[] = {"add 3 4", "add 25 17", "div 7 0", "mul 6 7", "slow 1 2", "bad 5 6", "big 8 9"};
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) check_case(records, n, cases[k]);
    for (int i = 0; i < n; i++) json_decref(records[i]);
    free(text), free(path);
}

/* metrics.jsonl: steps with a finite loss, tools called, failures counted. Returns the steps whose loss is
 * not 0 (a group whose rewards differ). */
static int check_metrics(const char *dir, int want_steps) {
    int moved = 0;
    char *path = path_join(dir, "metrics.jsonl"), *text = NULL;
    size_t len;
    int steps = 0;
    if (file_read_all(path, &text, &len, NULL) == 0) {
        for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
            json_t *o = json_loads(line, 0, NULL);
            json_t *loss = json_object_get(o, "loss"), *calls = json_object_get(o, "tools/call_frequency");
            json_t *failures = json_object_get(o, "tools/failure_frequency");
            if (json_object_get(o, "step") && loss) {
                steps++;
                double c = json_number_value(calls), f = json_number_value(failures), l = json_number_value(loss);
                /* 8 of the 9 prompts call a tool (bad does not); 3 of those 8 fail */
                CHECK(json_is_number(loss) && isfinite(l), "step %d: loss %g", steps, l);
                moved += l != 0;
                CHECK(json_is_number(calls) && c > 0.5, "step %d: tools/call_frequency %g", steps, c);
                CHECK(json_is_number(failures) && f > 0.25 && f < 1, "step %d: tools/failure_frequency %g", steps, f);
                printf("%s step %lld: loss %.5f, reward %.3f, tools/call_frequency %.3f, tools/failure_frequency "
                       "%.3f, completions/mean_length %.1f\n",
                       dir, (long long)json_integer_value(json_object_get(o, "step")), l,
                       json_number_value(json_object_get(o, "reward")), c, f,
                       json_number_value(json_object_get(o, "completions/mean_length")));
            }
            json_decref(o);
        }
    }
    CHECK(steps == want_steps, "%s/metrics.jsonl: %d steps, want %d", dir, steps, want_steps);
    free(text), free(path);
    return moved;
}

/* The metrics.jsonl line of a step (with its loss), or NULL. */
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

static void test_train(void) {
    char *err = NULL;
    double t0 = now_s();
    int rc = run_train("--output_dir run --max_steps 2 --eval_dataset " AGENT "/tool_prompts.jsonl", &err);
    double seconds = now_s() - t0;
    CHECK(rc == 0, "colt train with tools exited %d: %s", rc, err);
    /* slow hangs for 600 s in each of 4 generation rounds (eval before, 2 steps, eval after): >= 2400 s without
     * tool_timeout, which answers each in about 1 s (the bound is far from both, so a loaded machine passes) */
    CHECK(seconds < 400, "colt train with a hanging tool took %.1f s", seconds);
    printf("colt train, 2 steps with tools: %.1f s\n", seconds);
    free(err);
    if (rc != 0) return;
    char dir[300];
    snprintf(dir, sizeof dir, "%s/run", g_tmp);
    /* the 3-digit sums are new to the model: it sometimes repeats the result wrongly, so rewards differ
     * within a group and the loss moves */
    int moved = check_metrics(dir, 2);
    CHECK(moved > 0, "no step with a non-zero loss: every group's rewards were equal");
    int with_results = 0;
    check_completions(dir, "completions.jsonl", &with_results);
    /* the evals before and after training call the tools too (TRL's _generate in eval mode) */
    check_completions(dir, "eval_before.jsonl", &with_results);
    check_completions(dir, "eval_after.jsonl", &with_results);
    check_messages();

    /* 3. resume: checkpoint-1 to step 2 */
    err = NULL;
    char extra[600];
    snprintf(extra, sizeof extra, "--output_dir resumed --max_steps 2 --resume_from_checkpoint %s/run/checkpoint-1",
             g_tmp);
    rc = run_train(extra, &err);
    CHECK(rc == 0, "resume from checkpoint-1 exited %d: %s", rc, err);
    free(err);
    snprintf(dir, sizeof dir, "%s/resumed", g_tmp);
    if (rc != 0) return;
    check_metrics(dir, 1);
    /* the resumed step 2 is the uninterrupted run's: same rollouts, tool calls, rewards and loss */
    char run_dir[300];
    snprintf(run_dir, sizeof run_dir, "%s/run", g_tmp);
    json_t *a = step_metrics(run_dir, 2), *b = step_metrics(dir, 2);
    const char *keys[] = {"reward", "loss", "tools/call_frequency", "tools/failure_frequency",
                          "completions/mean_length"};
    int same = 0;
    for (size_t k = 0; k < sizeof keys / sizeof *keys; k++) {
        double x = json_number_value(json_object_get(a, keys[k])), y = json_number_value(json_object_get(b, keys[k]));
        CHECK(a && b && x == y, "step 2 %s: %g uninterrupted, %g resumed", keys[k], x, y);
        same += a && b && x == y;
    }
    printf("resumed step 2 equals the uninterrupted one in %d of %zu metrics\n", same, sizeof keys / sizeof *keys);
    json_decref(a), json_decref(b);
}

/* ---------------------------------------------------------------- 3b. two ranks, LoRA */

/* Step 1 of `mpirun -np 2` with LoRA against the one-process full-weight run's step 1: the round is
 * generated before any update and LoRA starts as the base model (B = 0), so each rank's tool calls (its half
 * of the round, its own tool worker) and the metrics TRL aggregates over the processes (tools/call_frequency:
 * all calls over all completions; tools/failure_frequency: all failures over all calls) equal one process's. */
static void test_data_parallel_lora(void) {
    if (system("command -v mpirun > /dev/null 2>&1") != 0) {
        printf("SKIPPED: two ranks with tools (no mpirun)\n");
        return;
    }
    char *err = NULL;
    double t0 = now_s();
    char cd[300], args[4096];
    snprintf(cd, sizeof cd, "cd %s &&", g_tmp);
    snprintf(args, sizeof args, "%s --device cpu --use_peft true --per_device_train_batch_size 18 --max_steps 1 "
                                "--output_dir dp_lora",
             ARGS);
    int rc = run_colt_with(&(ColtRun){.env = cd, .subcommand = "train", .timeout_s = 180,
                                      .launcher = "mpirun --oversubscribe --allow-run-as-root --bind-to none -x "
                                                  "OMP_NUM_THREADS=1 -x " NO_LEAK_CHECK " -np 2"},
                           args, &err);
    CHECK(rc == 0, "mpirun -np 2 colt train with tools and LoRA exited %d: %s", rc, err);
    free(err);
    printf("mpirun -np 2, tools and LoRA, 1 step: %.1f s\n", now_s() - t0);
    if (rc != 0) return;
    char run_dir[300], dp_dir[300];
    snprintf(run_dir, sizeof run_dir, "%s/run", g_tmp);
    snprintf(dp_dir, sizeof dp_dir, "%s/dp_lora", g_tmp);
    json_t *a = step_metrics(run_dir, 1), *b = step_metrics(dp_dir, 1);
    const char *keys[] = {"reward", "tools/call_frequency", "tools/failure_frequency", "completions/mean_length",
                          "loss"};
    for (size_t k = 0; k < sizeof keys / sizeof *keys; k++) {
        double x = json_number_value(json_object_get(a, keys[k])), y = json_number_value(json_object_get(b, keys[k]));
        /* the loss sums the two ranks' halves in another order: fp32 rounding */
        bool same = k < 4 ? x == y : fabs(x - y) <= 1e-6 + 1e-4 * fabs(x);
        CHECK(a && b && same, "step 1 %s: %g one process, %g two ranks with LoRA", keys[k], x, y);
    }
    printf("two ranks with LoRA, step 1: reward %.4f, tools/call_frequency %.4f, tools/failure_frequency %.4f, loss "
           "%.5f (one process: %.5f)\n",
           json_number_value(json_object_get(b, "reward")), json_number_value(json_object_get(b, "tools/call_frequency")),
           json_number_value(json_object_get(b, "tools/failure_frequency")), json_number_value(json_object_get(b, "loss")),
           json_number_value(json_object_get(a, "loss")));
    json_decref(a), json_decref(b);
    /* completions.jsonl holds the round in sample order: rank 0 made the first 18, rank 1 the others */
    char *path = path_join(dp_dir, "completions.jsonl"), *text = NULL;
    size_t len;
    int line_no = 0, results[2] = {0, 0};
    if (file_read_all(path, &text, &len, NULL) == 0)
        for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n"), line_no++)
            results[line_no < 18 ? 0 : 1] += strstr(line, "<tool_response>") != NULL;
    CHECK(line_no == 36 && results[0] > 9 && results[1] > 9,
          "completions.jsonl: %d lines, tool results in %d of rank 0's 18 and %d of rank 1's", line_no, results[0],
          results[1]);
    printf("tool results in %d of rank 0's 18 completions and %d of rank 1's\n", results[0], results[1]);
    free(text), free(path);
}

/* ---------------------------------------------------------------- 4. environment_factory */

#define ENV_DIR COLT_SOURCE_DIR "/examples/environments"
/* --deterministic true as ARGS */
#define ENV_ARGS "--deterministic true --config " ENV_DIR "/writer.yaml --model " MODEL " --dataset " ENV_DIR "/writer.jsonl " \
    "--environment_factory " ENV_DIR "/writer.py:WriterEnv --reward_funcs " ENV_DIR "/writer.py:says_the_sum " \
    "--tools '[\"" AGENT "/calc_tools.py:add\", \"" AGENT "/calc_tools.py:div\", \"" AGENT "/calc_tools.py:slow\"]' " \
    "--output_dir env --report_to none "

static int run_env_train(const char *extra, char **err) {
    char cd[300], args[4096];
    snprintf(cd, sizeof cd, "cd %s &&", g_tmp);
    snprintf(args, sizeof args, "%s %s", ENV_ARGS, extra);
    return run_colt_with(&(ColtRun){.env = cd, .subcommand = "train", .timeout_s = 500}, args, err);
}

static json_t *load_json(const char *dir, const char *name) {
    char *path = path_join(dir, name);
    json_t *o = json_load_file(path, 0, NULL);
    free(path);
    return o;
}

static bool same_ints(const json_t *a, const json_t *b) {
    if (json_array_size(a) != json_array_size(b) || !json_is_array(a)) return false;
    for (size_t i = 0; i < json_array_size(a); i++)
        if (json_integer_value(json_array_get(a, i)) != json_integer_value(json_array_get(b, i))) return false;
    return true;
}

/* The round saved inside checkpoint-1 (steps_per_generation 2: mid-round) against TRL's own
 * _generate_and_score_completions (tests/ref/make_env_goldens.py), greedy (top_k 1) on both sides: each
 * sample's prompt ids (its environment's reset appended its numbers), completion ids, tool mask and its
 * two rewards (says_the_sum, which reads environments=[...], and the environment's get_reward). */
static void check_env_parity(const char *dir) {
    json_t *golden = json_load_file(AGENT "/env_goldens.json", 0, NULL);
    json_t *state = load_json(dir, "checkpoint-1/trainer_state.json");
    json_t *ro = json_object_get(state, "rollout"), *samples = json_object_get(ro, "samples");
    json_t *prompts = json_object_get(ro, "prompts"), *want = json_object_get(golden, "samples");
    CHECK(golden && json_array_size(want) == 10, "tests/data/agent/env_goldens.json: 10 samples");
    CHECK(json_is_true(json_object_get(ro, "prompt_per_sample")), "checkpoint-1's rollout has a prompt per sample");
    CHECK(json_array_size(samples) == json_array_size(want), "checkpoint-1's rollout: %zu samples, TRL %zu",
          json_array_size(samples), json_array_size(want));
    int equal = 0, differ_in_group = 0;
    for (size_t i = 0; i < json_array_size(want) && i < json_array_size(samples); i++) {
        json_t *s = json_array_get(samples, i), *w = json_array_get(want, i);
        json_t *p = json_array_get(prompts, (size_t)json_integer_value(json_object_get(s, "prompt")));
        bool prompt = same_ints(json_object_get(p, "ids"), json_object_get(w, "prompt_ids"));
        bool completion = same_ints(json_object_get(s, "completion"), json_object_get(w, "completion_ids"));
        bool mask = same_ints(json_object_get(s, "model_mask"), json_object_get(w, "tool_mask"));
        json_t *per_func = json_object_get(s, "per_func"), *rewards = json_object_get(w, "rewards");
        bool rewards_equal = json_array_size(per_func) == 2 &&
            json_real_value(json_array_get(per_func, 0)) == json_number_value(json_object_get(rewards, "says_the_sum")) &&
            json_real_value(json_array_get(per_func, 1)) == json_number_value(json_object_get(rewards, "WriterEnv"));
        CHECK(prompt && completion && mask && rewards_equal,
              "environment sample %zu: prompt ids %s, completion ids %s, tool mask %s, rewards %s TRL's", i,
              prompt ? "=" : "!=", completion ? "=" : "!=", mask ? "=" : "!=", rewards_equal ? "=" : "!=");
        equal += prompt && completion && mask && rewards_equal;
        if (i % 2 == 1) {
            json_t *q = json_array_get(prompts, (size_t)json_integer_value(json_object_get(json_array_get(samples, i - 1), "prompt")));
            differ_in_group += !same_ints(json_object_get(p, "ids"), json_object_get(q, "ids"));
        }
    }
    /* each instance shifts its b by its number: the two completions of a prompt read different prompts */
    CHECK(differ_in_group >= 4, "only %d of 5 groups had a prompt per completion", differ_in_group);
    printf("environment_factory: %d of %zu greedy rollouts (prompt ids, completion ids, tool mask, both rewards) "
           "equal TRL's; %d of 5 groups with two prompts\n", equal, json_array_size(want), differ_in_group);
    json_decref(golden), json_decref(state);
}

static void test_environments(void) {
    /* greedy (top_k 1, as the goldens), 4 steps (2 rounds of 2 steps), a checkpoint every step */
    char *err = NULL;
    double t0 = now_s();
    int rc = run_env_train("--output_dir env_run --top_k 1 --shuffle_dataset false --max_steps 4 --save_steps 1", &err);
    CHECK(rc == 0, "colt train with environment_factory exited %d: %s", rc, err);
    free(err);
    printf("colt train with environment_factory, 4 steps: %.1f s\n", now_s() - t0);
    char dir[300];
    snprintf(dir, sizeof dir, "%s/env_run", g_tmp);
    if (rc == 0) check_env_parity(dir);

    /* resumed from checkpoint-1, inside round 1 (its saved conversations, per-sample prompts and masks); round
     * 2 then resets the environments of a new worker */
    err = NULL;
    char extra[600];
    snprintf(extra, sizeof extra, "--output_dir env_resumed --top_k 1 --shuffle_dataset false --max_steps 4 "
                                  "--save_steps 1 --resume_from_checkpoint %s/env_run/checkpoint-1", g_tmp);
    t0 = now_s();
    int rc2 = run_env_train(extra, &err);
    CHECK(rc2 == 0, "resume with environment_factory exited %d: %s", rc2, err);
    free(err);
    printf("resumed from checkpoint-1 to step 4: %.1f s\n", now_s() - t0);
    /* the saved round's prompts and rewards came from the environments: another class is refused */
    err = NULL;
    snprintf(extra, sizeof extra, "--output_dir env_other --top_k 1 --shuffle_dataset false --environment_factory "
                                  AGENT "/envs.py:MathEnv --resume_from_checkpoint %s/env_run/checkpoint-1", g_tmp);
    int rc3 = run_env_train(extra, &err);
    CHECK(rc3 != 0 && err && strstr(err, "environment_factory was \"" ENV_DIR "/writer.py:WriterEnv\" there"),
          "resume with another environment_factory: exit %d, %s", rc3, err ? err : "");
    printf("resume with another environment class: %s", err ? err : "\n");
    free(err);
    if (rc != 0 || rc2 != 0) return;
    char run_dir[300], resumed_dir[300];
    snprintf(run_dir, sizeof run_dir, "%s/env_run", g_tmp);
    snprintf(resumed_dir, sizeof resumed_dir, "%s/env_resumed", g_tmp);
    const char *keys[] = {"reward", "loss", "rewards/says_the_sum/mean", "rewards/WriterEnv/mean",
                          "tools/call_frequency", "tools/failure_frequency", "completions/mean_length", "grad_norm"};
    int same = 0, compared = 0, moved = 0;
    for (int step = 1; step <= 4; step++) {
        json_t *a = step_metrics(run_dir, step), *b = step < 2 ? NULL : step_metrics(resumed_dir, step);
        CHECK(a != NULL, "env_run: no metrics for step %d", step);
        moved += a && json_number_value(json_object_get(a, "loss")) != 0;
        if (step % 2 == 1) /* a round's first step: its tools were called and the environment rewarded */
            CHECK(json_number_value(json_object_get(a, "tools/call_frequency")) > 0.5 &&
                      json_is_number(json_object_get(a, "rewards/WriterEnv/mean")),
                  "step %d: tools/call_frequency %g, rewards/WriterEnv/mean %s", step,
                  json_number_value(json_object_get(a, "tools/call_frequency")),
                  json_object_get(a, "rewards/WriterEnv/mean") ? "logged" : "missing");
        for (size_t k = 0; step >= 2 && k < sizeof keys / sizeof *keys; k++) {
            json_t *x = json_object_get(a, keys[k]), *y = json_object_get(b, keys[k]);
            if (!x && !y) continue; /* a round's second step logs no rollout metrics */
            compared++;
            CHECK(x && y && json_number_value(x) == json_number_value(y), "step %d %s: %g uninterrupted, %g resumed",
                  step, keys[k], json_number_value(x), json_number_value(y));
            same += x && y && json_number_value(x) == json_number_value(y);
        }
        json_decref(a), json_decref(b);
    }
    CHECK(compared >= 12 && same == compared, "resumed steps 2-4: %d of %d metrics equal", same, compared);
    CHECK(moved > 0, "no step with a non-zero loss: every group's rewards were equal");
    printf("environment_factory resumed mid-round from checkpoint-1: steps 2-4 equal the uninterrupted run in %d "
           "of %d metrics; %d of 4 steps with a non-zero loss\n", same, compared, moved);
}

int main(void) {
    if (system("python3 -c 'import transformers' >/dev/null 2>&1") != 0) {
        printf("SKIP: python3 with transformers is needed for the tool worker\n");
        return 77;
    }
    snprintf(g_tmp, sizeof g_tmp, "/tmp/colt_agent_train_XXXXXX");
    if (!mkdtemp(g_tmp)) return 1;
    double t0 = now_s();
    test_parity();
    printf("parity: %.1f s\n", now_s() - t0);
    test_train();
    test_data_parallel_lora();
    test_environments();
    if (g_failures == 0) sh("rm -rf %s", g_tmp);
    else fprintf(stderr, "kept %s\n", g_tmp);
    printf("%d checks, %d failures\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
