/* tool_calls.h — the tool calls in a completion, read as TRL 1.16's
 * GRPOTrainer reads them (trl.chat_template_utils.parse_response over
 * transformers 5.24's response templates, with the templates trl's
 * add_response_schema sets), and the token ids TRL puts between a completion
 * and the next turn when tool results come back (_get_tool_suffix_ids).
 *
 * Formats (TOOL_FORMAT_*), each TRL's response template for it:
 *   HERMES  Qwen2.5 / Qwen3 (trl's qwen3_template): the assistant turn starts
 *           after "<|im_start|>assistant\n"; "<think>...</think>" is
 *           reasoning_content; each "<tool_call>JSON</tool_call>" is one call
 *           {"type": "function", "function": JSON}; the rest, up to
 *           "<|im_end|>", is content (stripped; text after a tool call
 *           replaces text before it, as transformers' parser does).
 *   LLAMA3  Llama 3.1 / 3.2 (trl's llama3_template): a call is
 *           '{"name": "N", "parameters": JSON}<|eot_id|>', anywhere in the
 *           turn, at most one; the text before it is content.
 * The result is the message TRL appends to the conversation:
 *   {"role": "assistant", "content": "...", ["reasoning_content": "...",]
 *    ["tool_calls": [{"type": "function", "function": {"name": "...", "arguments": {...}}}, ...]]}
 * with TRL's rules: string arguments typed by the tool's JSON schema ("7" is 7
 * for an integer parameter, stays "7" for a string one), a call without
 * arguments (or null) gets {}, and anything malformed (JSON that does not
 * parse, a call that is not an object, a name that is not a string) makes the
 * whole completion plain content: the completion decoded without its special
 * tokens. A call naming an unknown tool is still a call; the tool worker
 * answers it with TRL's error text.
 *
 * Not here: running the tools (tool_worker.h), the multi-turn loop (the
 * engine's, to come), streaming parsing. JSON is read by jansson, which
 * unlike Python's json refuses NaN/Infinity literals and lone surrogates;
 * such a call becomes plain content. */
#ifndef COLT_AGENT_TOOL_CALLS_H
#define COLT_AGENT_TOOL_CALLS_H

#include <jansson.h>
#include <stddef.h>

#include "tokenizer/tokenizer.h"

typedef enum ToolCallFormat {
    TOOL_FORMAT_HERMES, /* Qwen2.5, Qwen3: <tool_call>{"name": ..., "arguments": ...}</tool_call> */
    TOOL_FORMAT_LLAMA3, /* Llama 3.1 / 3.2: {"name": ..., "parameters": ...}<|eot_id|> */
} ToolCallFormat;

/* The format of the tool calls a chat template renders, read from its text
 * (TRL matches whole known templates; colt accepts any template that renders
 * the same markers). Error if it renders no tool calls colt can read. */
int tool_calls_format_of_template(ToolCallFormat *out, const char *template_source, char *err);

/* Parses a completion. prefix: the text the completion followed (the
 * rendered prompt, or any tail of it holding the last assistant header; ""
 * when none); text: the completion decoded with its special tokens;
 * text_skip_special: decoded without them (TRL's fallback content);
 * eos_token: the tokenizer's eos text (TRL removes it from the end of
 * content), or NULL; tools: the JSON schemas of the tools the prompt was
 * rendered with (a list, or NULL). *message is new (caller decrefs). Fails
 * only on arguments it cannot use (NULL text, tools not a list). */
int tool_calls_parse(json_t **message, ToolCallFormat format, const char *prefix, const char *text,
                     const char *text_skip_special, const char *eos_token, const json_t *tools, char *err);

/* tool_calls_parse on token ids, decoded with tok as TRL decodes them (ids past the tokenizer's
 * vocabulary, a model's padded rows, left out). */
int tool_calls_parse_ids(json_t **message, ToolCallFormat format, const Tokenizer *tok, const int *prefix_ids,
                         size_t n_prefix, const int *ids, size_t n_ids, const json_t *tools, char *err);

/* The ids of a prompt rendered with the tools' schemas, as TRL's
 * _tokenize_prompts does: apply_chat_template(messages, tools=tools or None,
 * add_generation_prompt=True, tokenize=True) with template_source (TRL's
 * choice: the training variant for Qwen3) and variables (chat_template_kwargs,
 * or NULL). tools: the schemas (tool_worker_schemas). *ids malloc'd. */
int tool_calls_prompt_ids(int **ids, size_t *n_ids, const Tokenizer *tok, const char *template_source,
                          const json_t *messages, const json_t *tools, const json_t *variables, char *err);

/* TRL's _get_tool_suffix_ids: the ids that follow a completion when
 * tool_messages (a list of {"role": "tool", "name": ..., "content": ...}) are
 * appended and the model is asked to go on. Rendered as TRL does: the
 * conversation [user "dummy", assistant {"content": "", "tool_calls": [a call
 * of tool_messages[0]'s tool with {} arguments]}] without a generation prompt
 * (cut after its last eos token), and the same plus tool_messages with one;
 * the suffix is what the second adds. template_source: the template TRL uses
 * (for Qwen3 its training variant, see docs/agents.md); variables: TRL's
 * chat_template_kwargs or NULL. *ids malloc'd. Errors if the first rendering
 * is not a prefix of the second (the template is not prefix-preserving). */
int tool_calls_suffix_ids(int **ids, size_t *n_ids, const Tokenizer *tok, const char *template_source,
                          const json_t *tool_messages, const json_t *variables, char *err);

#endif
