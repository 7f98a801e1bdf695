/* fuzz_tool_calls.c — libFuzzer target for the tool-call parser: the input is
 * a completion's text, parsed in both formats (Qwen <tool_call> JSON, Llama 3
 * JSON) after a prefix that holds the assistant header, with tool schemas so
 * that argument typing runs too. Any text must give a message with a string
 * content (and, if any, well-formed tool calls); never crash or leak. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "agent/tool_calls.h"
#include "core/error.h"

static const char *TOOLS =
    "[{\"type\": \"function\", \"function\": {\"name\": \"calc\", \"parameters\": {\"type\": \"object\", \"properties\":"
    " {\"a\": {\"type\": \"integer\"}, \"b\": {\"type\": [\"number\", \"null\"]}, \"c\": {\"type\": \"boolean\"},"
    " \"d\": {\"anyOf\": [{\"type\": \"array\"}, {\"type\": \"object\"}]}, \"e\": {\"type\": \"string\"}}}}}]";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    memcpy(text, data, size);
    text[size] = '\0';
    json_t *tools = json_loads(TOOLS, 0, NULL);
    const char *prefixes[2] = {"<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
                               "<|start_header_id|>assistant<|end_header_id|>\n\n"};
    for (int f = 0; f < 2; f++) {
        json_t *message = NULL;
        char err[ERR_LEN];
        ToolCallFormat format = f ? TOOL_FORMAT_LLAMA3 : TOOL_FORMAT_HERMES;
        if (tool_calls_parse(&message, format, prefixes[f], text, text, f ? "<|eot_id|>" : "<|im_end|>", tools,
                             err) == 0) {
            if (!json_is_string(json_object_get(message, "content"))) abort();
            json_t *calls = json_object_get(message, "tool_calls");
            size_t i;
            json_t *call;
            json_array_foreach(calls, i, call) {
                json_t *fn = json_object_get(call, "function");
                if (!json_is_string(json_object_get(fn, "name")) || !json_object_get(fn, "arguments")) abort();
            }
        }
        json_decref(message);
    }
    json_decref(tools);
    free(text);
    return 0;
}
