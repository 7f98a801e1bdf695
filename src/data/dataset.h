/* dataset.h — prompt datasets for GRPO, as TRL reads them: a JSON Lines file
 * (one object per line; what datasets' to_json writes, .json included) or a
 * JSON file holding an array of objects (or one object). The prompt column
 * ("prompt" unless dataset_prompt_column names another) is a string (standard
 * format) or a list of {"role","content"} messages (conversational format,
 * rendered with the model's chat template and add_generation_prompt). Every
 * other column is kept and reaches the rewards. Parquet and Arrow files are
 * refused with the command that converts them. Not the reward functions
 * (rewards.h). */
#ifndef COLT_DATA_DATASET_H
#define COLT_DATA_DATASET_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "tokenizer/tokenizer.h"

typedef struct Dataset Dataset;

/* Loads and validates every row, the prompt read from column prompt_column
 * (NULL: "prompt"): an error names the file, the line (JSONL) or index (JSON
 * array) and the problem — no prompt column (listing the columns found), wrong
 * type, bad message, invalid JSON, empty dataset. */
int dataset_load_column(Dataset **out, const char *path, const char *prompt_column, char *err);
/* dataset_load_column with the column "prompt". */
int dataset_load(Dataset **out, const char *path, char *err);
/* The rows alone, each a JSON object, without a prompt column (colt eval picks
 * its columns itself, then makes its prompts with dataset_from_rows); such a
 * dataset has no prompt text. */
int dataset_load_rows(Dataset **out, const char *path, char *err);
/* A dataset of rows built in memory (an array of objects, each holding
 * prompt_column; the rows are shared, not copied); errors name "NAME row i". */
int dataset_from_rows(Dataset **out, json_t *rows, const char *prompt_column, const char *name, char *err);
void dataset_free(Dataset *d);
size_t dataset_size(const Dataset *d);
/* The row as a JSON object (borrowed): all columns, the prompt's included. */
json_t *dataset_row(const Dataset *d, size_t i);
/* True when the prompt is a list of messages. */
int dataset_is_conversational(const Dataset *d, size_t i);

/* The prompt text the model sees (malloc'd): the string itself, or the
 * messages rendered with tok's chat template and add_generation_prompt.
 * template_kwargs: extra template variables (TRL's chat_template_kwargs, e.g.
 * {"enable_thinking": false}), or NULL. */
int dataset_prompt_text(char **text, const Dataset *d, size_t i, const Tokenizer *tok, const json_t *template_kwargs,
                        char *err);
/* dataset_prompt_text with the tools' JSON schemas given to the chat template
 * (its tools variable, as apply_chat_template(tools=...)); NULL: none. */
int dataset_prompt_text_tools(char **text, const Dataset *d, size_t i, const Tokenizer *tok,
                              const json_t *template_kwargs, const json_t *tools, char *err);

/* The row order of epoch `epoch`: a permutation of 0..n-1 from a seeded
 * Fisher-Yates shuffle keyed by (seed, epoch) with the counter-based RNG, so
 * resuming at any epoch gives the same order. */
void dataset_epoch_order(size_t *order, size_t n, uint64_t seed, uint64_t epoch);

#endif
