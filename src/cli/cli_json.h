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
#endif
