/* fuzz_chat_template.c — libFuzzer target for the Jinja subset: the input is
 * a chat template, rendered for a small fixed conversation with and without
 * add_generation_prompt, and once more for a Qwen3-style conversation (reasoning,
 * tool calls, tool results) with tools and extra variables through
 * chat_template_render_json. Any template must render or fail with a message;
 * never crash, hang or exhaust memory (the renderer bounds all three). */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "tokenizer/chat_template.h"

static const char *TOOL_CHAT =
    "[{\"role\": \"system\", \"content\": \"Use tools.\"}, {\"role\": \"user\", \"content\": \"Weather?\"},"
    " {\"role\": \"assistant\", \"content\": null, \"reasoning_content\": \"need it\", \"tool_calls\": [{\"type\":"
    " \"function\", \"function\": {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"n\": [1, 2.5,"
    " true, null]}}}]}, {\"role\": \"tool\", \"content\": \"sunny\"}, {\"role\": \"tool\", \"content\": {\"t\": 21}},"
    " {\"role\": \"assistant\", \"content\": \"<think>\\nok\\n</think>\\n\\nSunny.\"}]";
static const char *TOOLS = "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\":"
                           " {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}}}}]";
static const char *VARIABLES = "{\"enable_thinking\": false, \"date_string\": \"01 Jan 2025\"}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *tmpl = malloc(size + 1);
    memcpy(tmpl, data, size);
    tmpl[size] = '\0';
    ChatMessage msgs[3] = {{"system", "Be brief."}, {"user", "What is 2+2?"}, {"assistant", "4"}};
    char err[ERR_LEN];
    for (int agp = 0; agp < 2; agp++) {
        char *out = NULL;
        if (chat_template_render(&out, tmpl, msgs, 3, agp, "<s>", "</s>", err) == 0) free(out);
    }
    json_error_t jerr;
    json_t *chat = json_loads(TOOL_CHAT, 0, &jerr), *tools = json_loads(TOOLS, 0, &jerr);
    json_t *variables = json_loads(VARIABLES, 0, &jerr);
    ChatTemplateOptions opt = {.add_generation_prompt = true, .eos_token = "<|im_end|>", .tools = tools,
                               .variables = variables};
    char *out = NULL;
    if (chat_template_render_json(&out, tmpl, chat, &opt, err) == 0) free(out);
    json_decref(chat);
    json_decref(tools);
    json_decref(variables);
    free(tmpl);
    return 0;
}
