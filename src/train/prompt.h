/* prompt.h — what the engine is given for a dataset row: the prompt's token ids
 * (chat template for conversational rows, BOS for plain text as the tokenizer
 * says, cut from the left to max_prompt_length, as TRL does) and the ids that
 * end a completion. One place for both, so `colt train` and `colt eval` feed a
 * model the same prompt. Not the chat template itself (tokenizer/chat_template.h)
 * nor the dataset (data/dataset.h). */
#ifndef COLT_TRAIN_PROMPT_H
#define COLT_TRAIN_PROMPT_H

#include <stddef.h>

#include "data/dataset.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

/* The ids of row `row`'s prompt (*ids malloc'd, *n_ids >= 1) and the text the
 * model sees (*text malloc'd, for rewards and logs). Longer than
 * max_prompt_length: the left part is dropped. Errors name dataset_name and
 * the row; an empty prompt after tokenization is an error. template_kwargs:
 * the chat template's extra variables (dataset_prompt_text), or NULL. */
int prompt_encode_row(int **ids, int *n_ids, char **text, const Dataset *d, size_t row, const Tokenizer *tok,
                      const json_t *template_kwargs, int max_prompt_length, const char *dataset_name, char *err);

/* Fills stop_ids (room for MODEL_MAX_EOS + 1) with the model's eos ids and the
 * tokenizer's eos (tok may be NULL); returns how many. */
int prompt_stop_ids(int *stop_ids, const ModelConfig *mc, const Tokenizer *tok);

#endif
