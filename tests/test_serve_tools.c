/* test_serve_tools.c — a multi-turn tool conversation through colt serve's chat endpoint, as an agent
 * framework drives vLLM's OpenAI server: tests/data/models/tiny-tool-f32 (taught to answer "add A B" by
 * calling add(a, b) and then repeating the tool's result; tests/ref/make_tool_model.py) served on the CPU.
 *   1. A request with `tools` gets the call read out of the answer: message.content null,
 *      message.tool_calls [{id, type "function", function {name "add", arguments "{\"a\": 3, \"b\": 4}"}}]
 *      (the arguments as JSON text, Python's json.dumps spacing), finish_reason "tool_calls".
 *   2. The conversation sent back as OpenAI clients send it (the assistant's call with its arguments as
 *      JSON text, then a tool message with the result) continues as the same conversation rendered by
 *      the trainer's tool loop: the model repeats the result ("7", finish_reason "stop").
 *   3. tool_choice "none" and a request without tools leave the call in the text (finish_reason "stop");
 *      tool_choice "required" is refused with a 400 naming it; a streamed request streams the call as vLLM
 *      does (delta.tool_calls, finish_reason "tool_calls"; tests/test_serve_tools_stream.py assembles streamed
 *      answers with the openai client and compares them with the non-streamed ones).
 *   4. What a streamed answer with tools may send before its end (choice_text_stream_end): the text before
 *      anything that may begin a call.
 * Each answer is greedy (temperature 0). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "serve/openai.h"
#include "serve_harness.h"

#define MODEL COLT_SOURCE_DIR "/tests/data/models/tiny-tool-f32"

static const char *TOOLS =
    "[{\"type\": \"function\", \"function\": {\"name\": \"add\", \"description\": \"Adds two numbers.\", "
    "\"parameters\": {\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\", \"description\": "
    "\"The first number.\"}, \"b\": {\"type\": \"integer\", \"description\": \"The second number.\"}}, "
    "\"required\": [\"a\", \"b\"]}}}]";

static json_t *chat(int port, const char *messages, const char *extra, long *status) {
    char body[4096];
    snprintf(body, sizeof body,
             "{\"model\": \"%s\", \"messages\": %s, \"temperature\": 0, \"max_tokens\": 40%s}", MODEL, messages,
             extra);
    char *out = NULL;
    *status = serve_http(port, "/v1/chat/completions", body, 60000L, &out);
    json_t *o = out ? json_loads(out, 0, NULL) : NULL;
    if (*status != 200) printf("  answer %ld: %s\n", *status, out ? out : "(none)");
    free(out);
    return o;
}

static json_t *first_choice(json_t *o) { return json_array_get(json_object_get(o, "choices"), 0); }

/* What a streamed chat answer with tools may send before its end (choice_text_stream_end): the text before
 * anything that may begin a call, without its trailing whitespace, nothing while it starts with whitespace
 * (the parsed content is stripped); everything once finished, or without tools. */
static void test_stream_hold_back(void) {
    json_t *tools = json_loads(TOOLS, 0, NULL);
    struct {
        const char *text;
        ToolCallFormat format;
        bool tools, finished;
        size_t want;
    } cases[] = {
        {"Sure, adding.<tool_call>\n{\"na", TOOL_FORMAT_HERMES, true, false, 13},
        {"Sure, adding. \n<tool", TOOL_FORMAT_HERMES, true, false, 13},
        {"Sure, adding. \n", TOOL_FORMAT_HERMES, true, false, 13},
        {"Fine <b>x</b>", TOOL_FORMAT_HERMES, true, false, 4},
        {"  Sure", TOOL_FORMAT_HERMES, true, false, 0},
        {"<think>hm", TOOL_FORMAT_HERMES, true, false, 0},
        {"12}\n0}}", TOOL_FORMAT_HERMES, true, false, 7},
        {"Let me call {\"name\"", TOOL_FORMAT_LLAMA3, true, false, 11},
        {"Sure <tool_call>", TOOL_FORMAT_HERMES, false, false, 16},
        {"Sure <tool_call>{}</tool_call>", TOOL_FORMAT_HERMES, true, true, 30},
    };
    int ok = 0, n = (int)(sizeof cases / sizeof cases[0]);
    for (int k = 0; k < n; k++) {
        OpenAIRequest req = {.endpoint = OPENAI_CHAT, .tools = cases[k].tools ? tools : NULL,
                             .tool_format = cases[k].format};
        ChoiceText ct = {.text = (char *)cases[k].text, .finished = cases[k].finished};
        size_t end = choice_text_stream_end(&ct, &req);
        CHECK(end == cases[k].want, "stream hold-back of \"%s\": %zu bytes may go, want %zu", cases[k].text, end,
              cases[k].want);
        ok += end == cases[k].want;
    }
    printf("4. streamed with tools: what may go out before the end is right in %d of %d texts\n", ok, n);
    json_decref(tools);
}

int main(void) {
    snprintf(g_tmp, sizeof g_tmp, "/tmp/colt_test_serve_tools_XXXXXX");
    if (!mkdtemp(g_tmp)) return 1;
    curl_global_init(CURL_GLOBAL_DEFAULT);
    atexit(serve_kill_all);
    unsetenv("COLT_API_KEY"); /* chat needs no key */
    Server s = {0};
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s serve --model %s --device cpu --port 0", COLT_BINARY, MODEL);
    if (!serve_start(&s, "serve-tools", cmd, 60, false)) {
        printf("FAIL: colt serve did not start\n");
        return 1;
    }
    char with_tools[2048];
    snprintf(with_tools, sizeof with_tools, ", \"tools\": %s", TOOLS);

    /* 1. the call read out */
    long st;
    json_t *o = chat(s.port, "[{\"role\": \"user\", \"content\": \"add 3 4\"}]", with_tools, &st);
    json_t *c = first_choice(o), *m = json_object_get(c, "message");
    json_t *call = json_array_get(json_object_get(m, "tool_calls"), 0), *fn = json_object_get(call, "function");
    const char *args = json_string_value(json_object_get(fn, "arguments")),
               *call_id = json_string_value(json_object_get(call, "id"));
    printf("1. tools given: finish_reason %s, content %s, call %s(%s), id %s\n",
           json_string_value(json_object_get(c, "finish_reason")), json_is_null(json_object_get(m, "content")) ? "null" : "text",
           json_string_value(json_object_get(fn, "name")), args ? args : "?", call_id ? call_id : "?");
    CHECK(st == 200 && json_is_null(json_object_get(m, "content")), "1: content is not null");
    CHECK(json_array_size(json_object_get(m, "tool_calls")) == 1, "1: not one tool call");
    CHECK(!strcmp(json_string_value(json_object_get(c, "finish_reason")) ?: "", "tool_calls"), "1: finish_reason");
    CHECK(!strcmp(json_string_value(json_object_get(call, "type")) ?: "", "function") &&
              !strcmp(json_string_value(json_object_get(fn, "name")) ?: "", "add"),
          "1: the call is not add");
    CHECK(args && !strcmp(args, "{\"a\": 3, \"b\": 4}"), "1: arguments %s", args ? args : "(none)");
    CHECK(call_id && !strncmp(call_id, "call_", 5), "1: call id %s", call_id ? call_id : "(none)");

    /* 2. the result sent back: the model repeats it */
    char conv[2048];
    snprintf(conv, sizeof conv,
             "[{\"role\": \"user\", \"content\": \"add 3 4\"}, {\"role\": \"assistant\", \"content\": null, "
             "\"tool_calls\": [{\"id\": \"%s\", \"type\": \"function\", \"function\": {\"name\": \"add\", "
             "\"arguments\": \"{\\\"a\\\": 3, \\\"b\\\": 4}\"}}]}, {\"role\": \"tool\", \"tool_call_id\": \"%s\", "
             "\"content\": \"7\"}]",
             call_id ? call_id : "x", call_id ? call_id : "x");
    json_decref(o);
    o = chat(s.port, conv, with_tools, &st);
    c = first_choice(o), m = json_object_get(c, "message");
    const char *answer = json_string_value(json_object_get(m, "content"));
    printf("2. after the tool result: finish_reason %s, content \"%s\"\n",
           json_string_value(json_object_get(c, "finish_reason")), answer ? answer : "?");
    CHECK(st == 200 && answer && !strcmp(answer, "7"), "2: the answer is not the tool's result");
    CHECK(!strcmp(json_string_value(json_object_get(c, "finish_reason")) ?: "", "stop"), "2: finish_reason");
    CHECK(!json_object_get(m, "tool_calls"), "2: a tool call in the final answer");
    json_decref(o);

    /* 3. no reading without tools or with tool_choice none; required refused; streaming streams text */
    const char *user = "[{\"role\": \"user\", \"content\": \"add 3 4\"}]";
    char none[2100];
    snprintf(none, sizeof none, "%s, \"tool_choice\": \"none\"", with_tools);
    const char *extras[2] = {none, ""};
    for (int k = 0; k < 2; k++) {
        o = chat(s.port, user, extras[k], &st);
        c = first_choice(o), m = json_object_get(c, "message");
        const char *text = json_string_value(json_object_get(m, "content"));
        /* without tools in the prompt the model does not call (it writes on to max_tokens): only
         * tool_choice none has a call to keep in the text */
        const char *finish = json_string_value(json_object_get(c, "finish_reason"));
        CHECK(st == 200 && text && !json_object_get(m, "tool_calls") && finish && strcmp(finish, "tool_calls") != 0,
              "3: %s: the call was read out", k ? "without tools" : "tool_choice none");
        CHECK(k == 1 || (text && strstr(text, "<tool_call>") && !strcmp(finish ? finish : "", "stop")),
              "3: tool_choice none: the call is not in the text");
        json_decref(o);
    }
    printf("3. tool_choice none / no tools: the call stays in the text\n");
    char required[2100];
    snprintf(required, sizeof required, "%s, \"tool_choice\": \"required\"", with_tools);
    o = chat(s.port, user, required, &st);
    CHECK(st == 400, "3: tool_choice required answered %ld", st);
    json_decref(o);
    char streamed[2100];
    snprintf(streamed, sizeof streamed, "%s, \"stream\": true", with_tools);
    char body[4096], *out = NULL;
    snprintf(body, sizeof body, "{\"model\": \"%s\", \"messages\": %s, \"temperature\": 0, \"max_tokens\": 40%s}",
             MODEL, user, streamed);
    st = serve_http(s.port, "/v1/chat/completions", body, 60000L, &out);
    CHECK(st == 200 && out && strstr(out, "data: [DONE]"), "3: the streamed request: %ld", st);
    /* the call streamed as vLLM streams it (tests/test_serve_tools_stream.py assembles it with the openai client) */
    CHECK(out && strstr(out, "\"tool_calls\":[{\"id\":\"call_") && strstr(out, "\"finish_reason\":\"tool_calls\"") &&
              !strstr(out, "\"content\":\"<tool_call>"),
          "3: the streamed answer's call: %s", out ? out : "");
    free(out);
    test_stream_hold_back();

    CHECK(serve_stop(&s, SIGTERM, 30) == 0, "colt serve did not stop cleanly");
    curl_global_cleanup();
    if (!getenv("KEEP_TMP")) sh("rm -rf %s", g_tmp);
    printf("test_serve_tools: %d checks, %d failures\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
