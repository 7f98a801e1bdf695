/* test_tool_calls.c — the foundations of tool calling against TRL 1.16 /
 * transformers 5.24, with tests/data/tool_goldens.json (made by
 * tests/ref/make_tool_goldens.py):
 *   parse   — every completion of the goldens through tool_calls_parse (text)
 *             and, where ../shared/data has the tokenizer, tool_calls_parse_ids,
 *             equal as JSON to TRL's parse_response message;
 *   suffix  — tool_calls_suffix_ids equal to TRL's _get_tool_suffix_ids over
 *             Qwen2.5, Qwen3 (training variant) and Llama 3.1's templates;
 *   prompt  — prompts rendered with the schemas the tool worker reports, equal
 *             to the ids TRL renders with tools=[callables];
 *   worker  — tests/data/agent/tools.py and envs.py:MathEnv in colt's Python
 *             tool worker: schemas, results as TRL stringifies them (raise,
 *             unknown tool, async), out-of-order answers, a hanging tool cut at
 *             a 1 s limit, an environment's reset, methods and reward;
 *   errors  — bad input fails with one line that names it.
 * The parts that need the Qwen tokenizer skip with one line without ../shared;
 * worker and errors skip with one line without python3 and transformers. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <unistd.h>

#include "agent/tool_calls.h"
#include "agent/tool_worker.h"
#include "core/error.h"
#include "tokenizer/tokenizer.h"
#include "harness.h"
#include "shared_data.h"

#define DATA COLT_SOURCE_DIR "/tests/data"

static ToolCallFormat format_of_setup(const char *setup) {
    return strncmp(setup, "llama", 5) == 0 ? TOOL_FORMAT_LLAMA3 : TOOL_FORMAT_HERMES;
}

static int *ids_of(const json_t *list, size_t *n) {
    *n = json_array_size(list);
    int *ids = malloc(sizeof(int) * (*n ? *n : 1));
    for (size_t i = 0; i < *n; i++) ids[i] = (int)json_integer_value(json_array_get(list, i));
    return ids;
}

static bool same_ids(const int *a, size_t na, const json_t *expected) {
    if (na != json_array_size(expected)) return false;
    for (size_t i = 0; i < na; i++)
        if (a[i] != json_integer_value(json_array_get(expected, i))) return false;
    return true;
}

static char *dumps(const json_t *v) { return json_dumps(v, JSON_SORT_KEYS | JSON_COMPACT); }

/* The Qwen2.5 tokenizer of ../shared/data with Llama 3's special tokens added at
 * the goldens' ids, and Llama's bos/eos: the script's stand-in for a Llama 3.1
 * tokenizer (the same vocabulary, so only the template and specials differ). */
static Tokenizer *llama_tokenizer(const json_t *added, char *err) {
    /* Spliced into the file's text: parsing and re-writing 11 MB of JSON would double the load time. */
    char *text = read_text(COLT_SHARED_DATA "/qwen2.5-tokenizer", "tokenizer.json");
    char *list = text ? strstr(text, "\"added_tokens\"") : NULL;
    char *bracket = list ? strchr(list, '[') : NULL;
    if (!bracket) {
        snprintf(err, ERR_LEN, "qwen2.5-tokenizer/tokenizer.json has no added_tokens list");
        free(text);
        return NULL;
    }
    size_t head = (size_t)(bracket + 1 - text), cap = strlen(text) + 4096, n = head;
    char *spliced = malloc(cap);
    memcpy(spliced, text, head);
    size_t i;
    json_t *t;
    json_array_foreach(added, i, t) n += (size_t)snprintf(
        spliced + n, cap - n,
        "{\"id\": %d, \"content\": \"%s\", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, "
        "\"normalized\": false, \"special\": true},",
        (int)json_integer_value(json_object_get(t, "id")), json_string_value(json_object_get(t, "content")));
    snprintf(spliced + n, cap - n, "%s", text + head);
    free(text);
    const char *config = "{\"bos_token\": \"<|begin_of_text|>\", \"eos_token\": \"<|eot_id|>\", "
                         "\"add_bos_token\": false}";
    Tokenizer *tok = NULL;
    if (tokenizer_load_from_memory(&tok, spliced, strlen(spliced), config, strlen(config), "llama-on-qwen", err) != 0)
        tok = NULL;
    free(spliced);
    return tok;
}

/* ---------------------------------------------------------------------------
 * parse
 * ------------------------------------------------------------------------- */

static void test_parse(const json_t *goldens, Tokenizer *qwen, Tokenizer *llama) {
    const json_t *rows = json_object_get(goldens, "parse"), *prefixes = json_object_get(goldens, "parse_prefixes");
    const json_t *schemas = json_object_get(json_object_get(goldens, "worker"), "schemas");
    size_t i, equal = 0, equal_ids = 0, n_ids = 0;
    json_t *row;
    json_array_foreach(rows, i, row) {
        const char *setup = json_string_value(json_object_get(row, "setup"));
        const char *name = json_string_value(json_object_get(row, "case"));
        const json_t *expected = json_object_get(row, "expected");
        ToolCallFormat format = format_of_setup(setup);
        const char *eos = format == TOOL_FORMAT_LLAMA3 ? "<|eot_id|>" : "<|im_end|>";
        char err[ERR_LEN];
        json_t *got = NULL;
        int rc = tool_calls_parse(&got, format, json_string_value(json_object_get(prefixes, setup)),
                                  json_string_value(json_object_get(row, "text")),
                                  json_string_value(json_object_get(row, "text_skip_special")), eos, schemas, err);
        CHECK(rc == 0, "parse %s/%s: %s", setup, name, err);
        if (rc == 0 && json_equal(got, (json_t *)expected)) {
            equal++;
        } else if (rc == 0) {
            char *a = dumps(got), *b = dumps(expected);
            CHECK(false, "parse %s/%s:\n  colt %s\n  TRL  %s", setup, name, a, b);
            free(a);
            free(b);
        }
        json_decref(got);

        Tokenizer *tok = format == TOOL_FORMAT_LLAMA3 ? llama : qwen;
        if (!tok) continue;
        /* the ids path: the prompt re-encoded from its text, the completion's ids as TRL had them */
        size_t n = 0, n_prefix = 0;
        int *ids = ids_of(json_object_get(row, "ids"), &n), *prefix_ids = NULL;
        const char *prefix = json_string_value(json_object_get(prefixes, setup));
        CHECK(tokenizer_encode(tok, prefix, strlen(prefix), &prefix_ids, &n_prefix, err) == 0, "encode: %s", err);
        rc = tool_calls_parse_ids(&got, format, tok, prefix_ids, n_prefix, ids, n, schemas, err);
        CHECK(rc == 0, "parse ids %s/%s: %s", setup, name, err);
        n_ids++;
        if (rc == 0 && json_equal(got, (json_t *)expected)) equal_ids++;
        else if (rc == 0) {
            char *a = dumps(got), *b = dumps(expected);
            CHECK(false, "parse ids %s/%s:\n  colt %s\n  TRL  %s", setup, name, a, b);
            free(a);
            free(b);
        }
        json_decref(got);
        free(ids);
        free(prefix_ids);
    }
    CHECK(json_array_size(rows) >= 80, "only %zu parse goldens", json_array_size(rows));
    printf("parse: %zu/%zu completions give TRL's message from text, %zu/%zu from ids\n", equal,
           json_array_size(rows), equal_ids, n_ids);
    if (!qwen) shared_data_skipped("tool-call parsing from token ids");
}

/* ---------------------------------------------------------------------------
 * suffix ids and prompts
 * ------------------------------------------------------------------------- */

static char *template_of(const char *setup, const Tokenizer *qwen) {
    if (!strcmp(setup, "qwen2.5") || !strcmp(setup, "qwen2.5_env")) return strdup(tokenizer_chat_template(qwen));
    const char *file = !strcmp(setup, "qwen3") ? DATA "/qwen3_training_chat_template.jinja"
                                               : DATA "/llama3.1_chat_template.jinja";
    char *path = strdup(file), *slash = strrchr(path, '/');
    *slash = '\0';
    char *text = read_text(path, slash + 1);
    free(path);
    return text;
}

static void test_suffix(const json_t *goldens, Tokenizer *qwen, Tokenizer *llama) {
    const json_t *rows = json_object_get(goldens, "suffix");
    size_t i, equal = 0;
    json_t *row;
    json_array_foreach(rows, i, row) {
        const char *setup = json_string_value(json_object_get(row, "setup"));
        const char *name = json_string_value(json_object_get(row, "case"));
        Tokenizer *tok = format_of_setup(setup) == TOOL_FORMAT_LLAMA3 ? llama : qwen;
        char *tmpl = template_of(setup, qwen), err[ERR_LEN];
        int *ids = NULL;
        size_t n = 0;
        int rc = tool_calls_suffix_ids(&ids, &n, tok, tmpl, json_object_get(row, "tool_messages"), NULL, err);
        CHECK(rc == 0, "suffix %s/%s: %s", setup, name, err);
        bool same = rc == 0 && same_ids(ids, n, json_object_get(row, "expected"));
        equal += same;
        if (rc == 0 && !same) {
            char *text = NULL;
            tokenizer_decode(tok, ids, n, false, &text, err);
            CHECK(false, "suffix %s/%s: colt %zu ids \"%s\", TRL %zu \"%s\"", setup, name, n, text ? text : "?",
                  json_array_size(json_object_get(row, "expected")),
                  json_string_value(json_object_get(row, "expected_text")));
            free(text);
        }
        free(ids);
        free(tmpl);
    }
    printf("suffix: %zu/%zu tool suffixes equal TRL's _get_tool_suffix_ids\n", equal, json_array_size(rows));

    /* The original Qwen3 template is not prefix-preserving: TRL swaps it, colt says so. */
    char *qwen3 = read_text(DATA, "qwen3_chat_template.jinja"), err[ERR_LEN];
    int *ids = NULL;
    size_t n = 0;
    json_t *msgs = json_pack("[{s:s, s:s, s:s}]", "role", "tool", "name", "calculator", "content", "12");
    CHECK(tool_calls_suffix_ids(&ids, &n, qwen, qwen3, msgs, NULL, err) != 0 && strstr(err, "prefix-preserving"),
          "the original Qwen3 template should be refused as not prefix-preserving (got \"%s\")", err);
    json_decref(msgs);
    free(ids);
    free(qwen3);
}

/* ---------------------------------------------------------------------------
 * the tool worker
 * ------------------------------------------------------------------------- */

#define AGENT COLT_SOURCE_DIR "/tests/data/agent"

static bool is_error_text(const char *content) { return strncmp(content, "{'error': ", 10) == 0; }

/* Each golden call: the text TRL gives the model, and whether TRL counts a failure. */
static void check_calls(ToolWorker *w, const json_t *calls, long env, const char *what) {
    size_t i, equal = 0;
    json_t *c;
    json_array_foreach(calls, i, c) {
        const json_t *fn = json_object_get(json_object_get(c, "call"), "function");
        const char *name = json_string_value(json_object_get(fn, "name"));
        const char *expected = json_string_value(json_object_get(c, "content"));
        char *content = NULL, err[ERR_LEN];
        bool failed = false;
        int rc = tool_worker_call(w, &content, &failed, name, json_object_get(fn, "arguments"), env, 10, err);
        CHECK(rc == 0, "%s call %s: %s", what, name, err);
        if (rc != 0) continue;
        bool same = strcmp(content, expected) == 0 && failed == is_error_text(expected);
        equal += same;
        CHECK(same, "%s call %s: colt \"%s\" (failed %d), TRL \"%s\"", what, name, content, failed, expected);
        free(content);
    }
    printf("worker: %zu/%zu %s calls give TRL's text\n", equal, json_array_size(calls), what);
}

/* A tool that holds the whole worker (the interpreter lock, in C code): colt
 * kills it past the limit and its grace, answers the call with the timeout
 * text, and the next call runs on a new worker, without the environments. */
static void test_worker_killed(ToolWorker *w) {
    char err[ERR_LEN], *content = NULL;
    int pid = tool_worker_pid(w);
    bool failed = false;
    double t0 = now_s();
    CHECK(tool_worker_call(w, &content, &failed, "freeze", NULL, -1, 0.3, err) == 0 && content &&
              !strcmp(content, "{'error': 'Tool freeze timed out after 0.3 s'}") && failed,
          "freeze with a 0.3 s limit: %s", content ? content : err);
    double took = now_s() - t0;
    free(content);
    CHECK(took > 0.55 && took < 3, "killed after %.2f s (limit 0.3 s + grace 0.3 s)", took);
    CHECK(tool_worker_pid(w) == 0 && kill(pid, 0) != 0, "the stuck worker (pid %d) is gone", pid);
    json_t *args = json_pack("{s:i, s:i, s:s}", "a", 6, "b", 7, "op", "*");
    /* async_generation's thread may not restart it (a process forked there would die with the thread) */
    tool_worker_allow_restart(w, false);
    CHECK(tool_worker_call(w, &content, &failed, "calculator", args, -1, 5, err) != 0 && !content &&
              strstr(err, "lost earlier in this round") && tool_worker_pid(w) == 0,
          "a call with restarts off after the kill: %s", content ? content : err);
    tool_worker_allow_restart(w, true);
    CHECK(tool_worker_call(w, &content, &failed, "calculator", args, -1, 5, err) == 0 && content &&
              !strcmp(content, "42") && !failed, "a call after the kill runs on a new worker: %s", content ? content : err);
    CHECK(tool_worker_pid(w) > 0 && tool_worker_pid(w) != pid, "a new worker runs");
    printf("worker: a tool that held the worker was cut off after %.2f s; the next call ran on a new worker\n", took);
    free(content);
    json_decref(args);
    CHECK(tool_worker_call(w, &content, &failed, "total_so_far", NULL, 0, 5, err) != 0 &&
              strstr(err, "environment 0 does not exist"), "the environments died with the worker: %s", err);
    free(content);
    /* its reward is answered as lost (the trainer gives such a completion no reward, not an error) */
    long request = -1, got_request = -2;
    json_t *answer = NULL;
    int got = 0;
    if (tool_worker_submit_reward(w, &request, 0, err) == 0)
        while ((got = tool_worker_poll(w, &got_request, &answer, 5, err)) == 1 && got_request != request)
            json_decref(answer), answer = NULL;
    CHECK(got == 1 && json_is_true(json_object_get(answer, "worker_lost")) && json_object_get(answer, "error"),
          "get_reward of a lost environment: answered %s", answer ? "without worker_lost" : err);
    json_decref(answer);
}

static void test_worker(const json_t *goldens, Tokenizer *qwen, Tokenizer *llama) {
    const json_t *golden = json_object_get(goldens, "worker"), *env_golden = json_object_get(golden, "environment");
    const char *tools[] = {AGENT "/tools.py:calculator", AGENT "/tools.py:lookup", AGENT "/tools.py:weather",
                           AGENT "/tools.py:sleepy", AGENT "/tools.py:no_args", AGENT "/tools.py:freeze"};
    char err[ERR_LEN];
    ToolWorker *w = NULL;
    ToolWorkerOptions options = {.kill_grace_s = 0.3};
    double t0 = now_s();
    /* the environment named as a module ("envs.MathEnv", importable from PYTHONPATH), the tools as files */
    setenv("PYTHONPATH", AGENT, 1);
    if (tool_worker_start(&w, tools, 6, "envs.MathEnv", &options, err) != 0) {
        CHECK(false, "tool_worker_start: %s", err);
        return;
    }
    printf("worker: started in %.2f s\n", now_s() - t0);

    /* schemas: transformers' get_json_schema, tools then the environment's methods */
    const json_t *schemas = tool_worker_schemas(w), *tool_schemas = json_object_get(golden, "schemas"),
                 *env_schemas = json_object_get(env_golden, "schemas");
    size_t n_tools = json_array_size(tool_schemas); /* freeze comes after them */
    CHECK(json_array_size(schemas) == n_tools + 1 + json_array_size(env_schemas), "%zu schemas",
          json_array_size(schemas));
    for (size_t i = 0; i < json_array_size(schemas); i++) {
        if (i == n_tools) continue;
        const json_t *want = i < n_tools ? json_array_get(tool_schemas, i) : json_array_get(env_schemas, i - n_tools - 1);
        CHECK(json_equal(json_array_get(schemas, i), (json_t *)want), "schema %zu differs from get_json_schema's", i);
    }
    json_t *tools_only = json_array(), *tools_and_methods = json_array();
    for (size_t i = 0; i < json_array_size(schemas); i++) {
        if (i < n_tools) json_array_append(tools_only, json_array_get(schemas, i));
        if (i != n_tools) json_array_append(tools_and_methods, json_array_get(schemas, i));
    }
    CHECK(tool_worker_environment_name(w) && !strcmp(tool_worker_environment_name(w), "MathEnv") &&
              tool_worker_environment_has_reward(w), "environment MathEnv with get_reward");
    /* tensor parallelism: the group's other ranks hold a worker made from the leader's description */
    json_t *description = tool_worker_description(w);
    ToolWorker *described = NULL;
    CHECK(tool_worker_from_description(&described, description, err) == 0, "from_description: %s", err);
    if (described) {
        long request = -1;
        CHECK(json_equal((json_t *)tool_worker_schemas(described), (json_t *)schemas) &&
                  !strcmp(tool_worker_environment_name(described), "MathEnv") &&
                  tool_worker_environment_has_reward(described) && tool_worker_pid(described) == 0,
              "a described worker has the leader's schemas and environment, and no process");
        int same_async = 0;
        for (size_t i = 0; i < json_array_size(schemas); i++) {
            const char *name = json_string_value(
                json_object_get(json_object_get(json_array_get(schemas, i), "function"), "name"));
            for (int with_env = 0; with_env < 2; with_env++)
                same_async += tool_worker_is_async(described, name, with_env) == tool_worker_is_async(w, name, with_env);
        }
        CHECK(same_async == 2 * (int)json_array_size(schemas) && tool_worker_is_async(described, "weather", false),
              "a described worker knows which tools are async as the leader does (%d of %zu)", same_async,
              2 * json_array_size(schemas));
        CHECK(tool_worker_submit_call(described, &request, "calculator", NULL, -1, 5, err) != 0 &&
                  strstr(err, "its tensor-parallel group's first rank does"), "a described worker runs nothing: %s", err);
        tool_worker_free(described);
    }
    json_decref(description);
    json_t *no_tools = json_pack("{s:n}", "tools");
    CHECK(tool_worker_from_description(&described, no_tools, err) != 0 && !described && strstr(err, "no tools"),
          "a description without tools: %s", err);
    json_decref(no_tools);

    CHECK(tool_worker_is_async(w, "weather", false) && !tool_worker_is_async(w, "calculator", true) &&
              !tool_worker_is_async(w, "add", true) && !tool_worker_is_async(w, "teleport", false),
          "async tools: weather only");
    check_calls(w, json_object_get(golden, "calls"), -1, "tool");

    /* an environment: reset(**row), its methods as tools, get_reward */
    json_t *observation = NULL;
    CHECK(tool_worker_reset(w, &observation, 0, json_object_get(env_golden, "row"), err) == 0, "reset: %s", err);
    CHECK(observation && json_equal(observation, json_object_get(env_golden, "observation")),
          "reset's observation differs from TRL's");
    json_decref(observation);
    check_calls(w, json_object_get(env_golden, "calls"), 0, "environment");
    double reward = -1;
    bool has = false;
    CHECK(tool_worker_reward(w, &reward, &has, 0, err) == 0 && has &&
              reward == json_number_value(json_object_get(env_golden, "reward")),
          "get_reward: %g (%s)", reward, has ? "" : err);
    /* a second instance is independent of the first */
    json_t *row = json_pack("{s:i, s:i}", "start", 100, "target", 1);
    CHECK(tool_worker_reset(w, &observation, 1, row, err) == 0, "reset 1: %s", err);
    json_decref(observation);
    json_decref(row);
    char *content = NULL;
    bool failed = false;
    CHECK(tool_worker_call(w, &content, &failed, "total_so_far", NULL, 1, 5, err) == 0 && content &&
              !strcmp(content, "total=100"), "environment 1: %s", content ? content : err);
    free(content);
    CHECK(tool_worker_call(w, &content, &failed, "total_so_far", NULL, 0, 5, err) == 0 && content &&
              !strcmp(content, "total=7"), "environment 0 after 1's reset: %s", content ? content : err);
    free(content);
    /* a reward function that reads the environments, as TRL passes them */
    double rewards[3] = {0};
    bool has_reward[3] = {0};
    long env_ids[3] = {1, -1, 0};
    json_t *kwargs = json_pack("{s:[s,s,s]}", "completions", "a", "b", "c");
    CHECK(tool_worker_reward_function(w, rewards, has_reward, 3, AGENT "/envs.py:total_reward", kwargs, env_ids, 5,
                                      err) == 0 && has_reward[0] && rewards[0] == 100 && !has_reward[1] &&
              has_reward[2] && rewards[2] == 7,
          "a reward over environments [1, none, 0]: %g %g %g (%s)", rewards[0], rewards[1], rewards[2], err);
    long two_envs[2] = {0, 0};
    CHECK(tool_worker_reward_function(w, rewards, has_reward, 2, AGENT "/envs.py:nope", kwargs, two_envs, 5, err) !=
              0 && strstr(err, "nope"), "a missing reward function: %s", err);
    json_decref(kwargs);
    CHECK(tool_worker_call(w, &content, &failed, "add", NULL, 7, 5, err) != 0 && strstr(err, "environment 7"),
          "a call on an environment never reset should fail naming it (%s)", err);
    free(content);

    /* answers in the order they finish: a slow call submitted first comes back last */
    long slow = 0, fast = 0, got = 0;
    json_t *args = json_pack("{s:f}", "seconds", 0.2), *answer = NULL;
    CHECK(tool_worker_submit_call(w, &slow, "sleepy", args, -1, 5, err) == 0, "submit: %s", err);
    json_decref(args);
    args = json_pack("{s:i, s:i}", "a", 20, "b", 22);
    CHECK(tool_worker_submit_call(w, &fast, "calculator", args, -1, 5, err) == 0, "submit: %s", err);
    json_decref(args);
    CHECK(tool_worker_in_flight(w) == 2, "%zu requests in flight", tool_worker_in_flight(w));
    CHECK(tool_worker_poll(w, &got, &answer, 5, err) == 1 && got == fast &&
              !strcmp(json_string_value(json_object_get(answer, "content")), "42"),
          "the fast call should answer first (got request %ld)", got);
    json_decref(answer);
    CHECK(tool_worker_poll(w, &got, &answer, 5, err) == 1 && got == slow &&
              !strcmp(json_string_value(json_object_get(answer, "content")), "woke up"),
          "then the slow one (got request %ld)", got);
    json_decref(answer);
    CHECK(tool_worker_poll(w, &got, &answer, 0.05, err) == 0, "nothing left to answer");

    /* a hanging tool: the worker answers at the limit with an error text, and goes on */
    args = json_pack("{s:i}", "seconds", 30);
    t0 = now_s();
    CHECK(tool_worker_call(w, &content, &failed, "sleepy", args, -1, 1.0, err) == 0 && content &&
              !strcmp(content, "{'error': 'Tool sleepy timed out after 1 s'}") && failed,
          "sleepy(30) with a 1 s limit: %s", content ? content : err);
    double took = now_s() - t0;
    CHECK(took > 0.9 && took < 2.5, "the 1 s limit answered after %.2f s", took);
    printf("worker: a tool hanging 30 s answered at its 1 s limit after %.2f s\n", took);
    free(content);
    json_decref(args);
    CHECK(tool_worker_call(w, &content, &failed, "total_so_far", NULL, 0, 5, err) == 0 && content &&
              !strcmp(content, "total=7"), "the environments survive a timed-out call: %s", content ? content : err);
    free(content);

    if (qwen && llama) {
        /* prompts rendered with the worker's schemas equal TRL's with tools=[callables] */
        const json_t *rows = json_object_get(goldens, "prompt");
        size_t i, equal = 0;
        json_t *r;
        json_array_foreach(rows, i, r) {
            const char *setup = json_string_value(json_object_get(r, "setup"));
            Tokenizer *tok = format_of_setup(setup) == TOOL_FORMAT_LLAMA3 ? llama : qwen;
            char *tmpl = template_of(setup, qwen);
            int *ids = NULL;
            size_t n = 0;
            int rc = tool_calls_prompt_ids(&ids, &n, tok, tmpl, json_object_get(r, "messages"),
                                           strstr(setup, "_env") ? tools_and_methods : tools_only, NULL, err);
            CHECK(rc == 0, "prompt %s: %s", setup, err);
            bool same = rc == 0 && same_ids(ids, n, json_object_get(r, "expected"));
            equal += same;
            CHECK(rc != 0 || same, "prompt %s: %zu ids, TRL %zu", setup, n,
                  json_array_size(json_object_get(r, "expected")));
            free(ids);
            free(tmpl);
        }
        printf("prompt: %zu/%zu prompts with the worker's schemas equal TRL's ids\n", equal, json_array_size(rows));
    }
    json_decref(tools_only);
    json_decref(tools_and_methods);
    test_worker_killed(w);
    tool_worker_free(w);
}
/* ---------------------------------------------------------------------------
 * errors: one line that names what is wrong
 * ------------------------------------------------------------------------- */

static void test_errors(void) {
    char err[ERR_LEN];
    ToolWorker *w = NULL;
    const char *bad_name[] = {"calculator"};
    CHECK(tool_worker_start(&w, bad_name, 1, NULL, NULL, err) != 0 && strstr(err, "\"calculator\"") &&
              strstr(err, "PATH.py:NAME"), "a bare name: %s", err);
    const char *missing_file[] = {"no_such_dir/tools.py:f"};
    CHECK(tool_worker_start(&w, missing_file, 1, NULL, NULL, err) != 0 && strstr(err, "not found"),
          "a missing file: %s", err);
    const char *missing_function[] = {AGENT "/tools.py:nope"};
    CHECK(tool_worker_start(&w, missing_function, 1, NULL, NULL, err) != 0 && strstr(err, "no function 'nope'"),
          "a missing function: %s", err);
    const char *no_docstring[] = {AGENT "/envs.py:MathEnv"}; /* a class is callable, but has no Args docstring */
    CHECK(tool_worker_start(&w, no_docstring, 1, NULL, NULL, err) != 0 && strstr(err, "JSON schema"),
          "a tool without a docstring: %s", err);
    const char *tools[] = {AGENT "/tools.py:no_args"};
    CHECK(tool_worker_start(&w, tools, 1, AGENT "/tools.py:no_args", NULL, err) != 0 && strstr(err, "reset"),
          "an environment without reset: %s", err);
    CHECK(tool_worker_start(&w, NULL, 0, NULL, NULL, err) != 0 && strstr(err, "at least one tool"), "nothing: %s", err);
    CHECK(strchr(err, '\n') == NULL, "errors are one line");

    json_t *message = NULL, *not_a_list = json_string("no");
    CHECK(tool_calls_parse(&message, TOOL_FORMAT_HERMES, "", "x", "x", NULL, not_a_list, err) != 0 &&
              strstr(err, "tools"), "tools not a list: %s", err);
    json_decref(not_a_list);
    ToolCallFormat f;
    CHECK(tool_calls_format_of_template(&f, "{{ messages }}", err) != 0 && strstr(err, "no tool calls"),
          "a template without tool calls: %s", err);
    CHECK(tool_calls_format_of_template(&f, "<function=x>", err) != 0 && strstr(err, "XML"), "Qwen3.5: %s", err);
}

/* ---------------------------------------------------------------------------
 * main
 * ------------------------------------------------------------------------- */

int main(void) {
    double t0 = now_s();
    json_error_t jerr;
    json_t *goldens = json_load_file(DATA "/tool_goldens.json", 0, &jerr);
    if (!goldens) {
        fprintf(stderr, "tests/data/tool_goldens.json: %s (line %d); run tests/ref/make_tool_goldens.py\n", jerr.text,
                jerr.line);
        return 1;
    }
    Tokenizer *qwen = NULL, *llama = NULL;
    char err[ERR_LEN];
    if (shared_data_present()) {
        CHECK(tokenizer_load(&qwen, COLT_SHARED_DATA "/qwen2.5-tokenizer", err) == 0, "qwen2.5 tokenizer: %s", err);
        llama = llama_tokenizer(json_object_get(goldens, "llama_added_tokens"), err);
        CHECK(llama != NULL, "llama-on-qwen tokenizer: %s", err);
        printf("tokenizers: Qwen2.5 and Llama-on-Qwen loaded in %.2f s\n", now_s() - t0);
    }
    test_parse(goldens, qwen, llama);
    if (qwen && llama) test_suffix(goldens, qwen, llama);
    else shared_data_skipped("tool suffix ids and prompts with tools (they need the Qwen2.5 tokenizer)");
    if (system("python3 -c 'import transformers' >/dev/null 2>&1") == 0) {
        test_worker(goldens, qwen, llama);
        test_errors();
    } else {
        printf("SKIP: the tool worker's checks (python3 with transformers is needed: it makes the tools' schemas)\n");
    }

    tokenizer_free(qwen);
    tokenizer_free(llama);
    json_decref(goldens);
    printf("%s: %d checks, %d failed (%.1f s)\n", g_failures ? "FAIL" : "OK", g_checks, g_failures, now_s() - t0);
    return g_failures ? 1 : 0;
}
