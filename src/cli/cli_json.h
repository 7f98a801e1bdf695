/* cli_json.h — JSON helpers for the CLI's JSONL contracts (jansson). */
#ifndef COLT_CLI_CLI_JSON_H
#define COLT_CLI_CLI_JSON_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "cli/cli.h"
#include "tokenizer/tokenizer.h"

/* Parses one line as a JSON object; errors name `where` (e.g. "stdin line 3"). */
int cli_json_parse_line(json_t **obj, const char *line, const char *where, char *err);
/* Parses a JSON array of token ids, each an integer in [0, vocab_size). */
int cli_json_ids_from_array(int **ids, size_t *n, json_t *arr, int vocab_size, const char *where, char *err);
/* A line {"ids": [...]} -> ids. */
int cli_json_read_ids(int **ids, size_t *n, const char *line, int vocab_size, const char *where, char *err);
/* Appends {"KEY": [ids...]}\n. */
void cli_json_append_ids(OutBuf *out, const char *key, const int *ids, size_t n);
/* Renders a chat with the tokenizer's chat template (cmd_tokenize.c), as
 * apply_chat_template(messages, tools=tools, add_generation_prompt=...,
 * **chat_template_kwargs): messages a list of message objects, tools a list of
 * tool definitions or NULL, chat_template_kwargs an object of extra template
 * variables or NULL. */
int cli_render_chat(char **out, const Tokenizer *tok, json_t *messages, json_t *tools, json_t *chat_template_kwargs,
                    bool add_generation_prompt, const char *where, char *err);
/* The optional "tools" (a list) and "chat_template_kwargs" (an object) of a
 * JSONL line, borrowed from obj (NULL when absent). */
int cli_chat_options(json_t **tools, json_t **chat_template_kwargs, json_t *obj, const char *where, char *err);

#endif
