/* prompt.h — what the engine is given for a prompt, in one place for colt
 * generate, colt train / eval and colt serve: the prompt's token ids (a chat
 * rendered with the chat template, which puts in whatever special tokens it
 * wants; plain text with BOS when the tokenizer says so, as HF's
 * tokenizer(...) does) and the ids that end a completion. Not the chat
 * template itself (tokenizer/chat_template.h) nor the dataset (data/dataset.h). */
#ifndef COLT_DATA_PROMPT_H
#define COLT_DATA_PROMPT_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "data/dataset.h"
#include "engine/structured.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

/* The ids of `text` (*ids malloc'd): BOS first when the text is not a rendered
 * chat (chat_rendered false) and the tokenizer adds it. vocab_size > 0: an id
 * at or above it is an error (a tokenizer larger than the model). Errors name
 * `where`. The result may be empty (*n_ids 0). */
int prompt_encode_text(int **ids, int *n_ids, const Tokenizer *tok, const char *text, bool chat_rendered,
                       int vocab_size, const char *where, char *err);

/* Renders a chat with the tokenizer's chat template, as
 * apply_chat_template(messages, tools=tools, add_generation_prompt=...,
 * **chat_template_kwargs): messages a list of message objects, tools a list of
 * tool definitions or NULL, chat_template_kwargs an object of extra template
 * variables or NULL. *out malloc'd. */
int prompt_render_chat(char **out, const Tokenizer *tok, json_t *messages, json_t *tools, json_t *chat_template_kwargs,
                       bool add_generation_prompt, const char *where, char *err);
/* The ids of a chat to be answered: rendered with add_generation_prompt, then
 * prompt_encode_text(chat_rendered = true). */
int prompt_encode_chat(int **ids, int *n_ids, const Tokenizer *tok, json_t *messages, json_t *tools,
                       json_t *chat_template_kwargs, int vocab_size, const char *where, char *err);
/* The optional "tools" (a list) and "chat_template_kwargs" (an object) of a
 * JSON object (a JSONL line, a request), borrowed from obj (NULL when absent or null). */
int prompt_chat_options(json_t **tools, json_t **chat_template_kwargs, json_t *obj, const char *where, char *err);

/* The ids of dataset row `row`'s prompt (*ids malloc'd, *n_ids >= 1) and the
 * text the model sees (*text malloc'd, for rewards and logs): the chat template
 * for conversational rows, else the text (prompt_encode_text). Longer than
 * max_prompt_length (> 0; 0: no cut): the left part is dropped. Errors name
 * dataset_name and the row; an empty prompt after tokenization is an error.
 * template_kwargs: the chat template's extra variables (dataset_prompt_text), or NULL. */
int prompt_encode_row(int **ids, int *n_ids, char **text, const Dataset *d, size_t row, const Tokenizer *tok,
                      const json_t *template_kwargs, int max_prompt_length, const char *dataset_name, char *err);
/* prompt_encode_row with the tools' JSON schemas rendered into conversational
 * prompts (apply_chat_template(tools=...), as TRL renders prompts for tool
 * calling); NULL: none. */
int prompt_encode_row_tools(int **ids, int *n_ids, char **text, const Dataset *d, size_t row, const Tokenizer *tok,
                            const json_t *template_kwargs, const json_t *tools, int max_prompt_length,
                            const char *dataset_name, char *err);

/* Fills stop_ids (room for MODEL_MAX_EOS + 1) with the model's eos ids and the
 * tokenizer's eos (tok may be NULL); returns how many. */
int prompt_stop_ids(int *stop_ids, const ModelConfig *mc, const Tokenizer *tok);

/* Structured outputs (engine/structured.h): pattern compiled over the model's
 * vocab_size ids, each token standing for its bytes in the tokenizer's decoded
 * text (special tokens and ids the tokenizer lacks: never generated but as a
 * stop id). Errors: those of token_regex_create, a tokenizer that is not
 * byte-level BPE. It points at tok's bytes: tok must outlive it. */
int prompt_regex_constraint(TokenRegex **out, const Tokenizer *tok, int vocab_size, const char *pattern, char *err);

#endif
