/* chat_template.h — renders a Hugging Face chat template (the Jinja source in
 * tokenizer_config.json's chat_template) for a conversation, exactly as
 * transformers' apply_chat_template does: messages with any fields (role,
 * content, reasoning_content, tool_calls, ...), a tools list, and extra
 * template variables such as Qwen3's enable_thinking. It implements the subset
 * of Jinja those templates use; anything outside it is an error that says so,
 * never a wrong prompt. */
#ifndef COLT_TOKENIZER_CHAT_TEMPLATE_H
#define COLT_TOKENIZER_CHAT_TEMPLATE_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

/* What the template sees besides the messages: apply_chat_template's other
 * arguments. A zeroed struct is add_generation_prompt=False, no tokens,
 * tools=None and no extra variables. */
typedef struct ChatTemplateOptions {
    bool add_generation_prompt;
    const char *bos_token, *eos_token; /* the strings the template sees; NULL leaves one undefined */
    const json_t *tools;     /* a list of tool definitions (JSON-schema objects), or NULL for tools=None */
    const json_t *variables; /* an object of extra template variables (apply_chat_template's keyword
                              * arguments, TRL's chat_template_kwargs), e.g. {"enable_thinking": false};
                              * bos_token/eos_token here override the fields above. NULL: none */
} ChatTemplateOptions;

/* Renders `messages`, a JSON array of message objects, into *out (malloc'd).
 * The messages are prepared as transformers 5.24 prepares them: keys whose
 * value is null are dropped, and a message with reasoning under
 * reasoning_content, thinking or reasoning gets it under reasoning_content and
 * thinking too. options may be NULL. Errors are one line: a message that is not
 * an object, a variable named messages, tools, documents or
 * add_generation_prompt (apply_chat_template sets those itself), or what the
 * template got wrong and at which line. */
int chat_template_render_json(char **out, const char *template_source, const json_t *messages,
                              const ChatTemplateOptions *options, char *err);

/* A {role, content} message, for callers that have nothing else. */
typedef struct ChatMessage {
    const char *role;
    const char *content;
} ChatMessage;

/* chat_template_render_json for {role, content} messages, no tools and no extra
 * variables. *out is malloc'd. bos_token/eos_token are the strings the template
 * sees (NULL: undefined). */
int chat_template_render(char **out, const char *template_source, const ChatMessage *messages,
                         size_t n_messages, bool add_generation_prompt, const char *bos_token,
                         const char *eos_token, char *err);

#endif
