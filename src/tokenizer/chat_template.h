/* chat_template.h — renders a Hugging Face chat template (the Jinja source in
 * tokenizer_config.json's chat_template) for system/user/assistant messages,
 * exactly as transformers' apply_chat_template does. It implements the subset of
 * Jinja those templates use; anything outside it is an error that says so, never
 * a wrong prompt. */
#ifndef COLT_TOKENIZER_CHAT_TEMPLATE_H
#define COLT_TOKENIZER_CHAT_TEMPLATE_H

#include <stdbool.h>
#include <stddef.h>

typedef struct ChatMessage {
    const char *role;
    const char *content;
} ChatMessage;

/* *out is malloc'd. bos_token/eos_token are the strings the template sees. */
int chat_template_render(char **out, const char *template_source, const ChatMessage *messages,
                         size_t n_messages, bool add_generation_prompt, const char *bos_token,
                         const char *eos_token, char *err);

#endif
