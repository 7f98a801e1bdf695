/* tokenizer.h — Hugging Face tokenizer.json (BPE models: byte-level as in
 * GPT-2/Qwen/Llama-3, and sentencepiece-style as in Llama-2/Mistral/TinyStories)
 * plus tokenizer_config.json (bos/eos/pad, add_bos_token, chat_template).
 * Encoding never adds special tokens; callers add BOS where add_bos_token says. */
#ifndef COLT_TOKENIZER_TOKENIZER_H
#define COLT_TOKENIZER_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>

typedef struct Tokenizer Tokenizer;

/* Loads DIR/tokenizer.json and, if present, DIR/tokenizer_config.json and
 * DIR/chat_template.jinja (which wins over the config's chat_template, as in
 * transformers 5). */
int tokenizer_load(Tokenizer **out, const char *dir, char *err);
/* Builds from tokenizer.json text (config_json may be NULL); name is used in errors. */
int tokenizer_load_from_memory(Tokenizer **out, const char *tokenizer_json, size_t len,
                               const char *config_json, size_t config_len, const char *name, char *err);
void tokenizer_free(Tokenizer *t);

/* Encodes UTF-8 text (added tokens split out first, as HF does). *ids is malloc'd.
 * Errors: invalid UTF-8. */
int tokenizer_encode(const Tokenizer *t, const char *text, size_t len, int **ids, size_t *n_ids, char *err);
/* Decodes ids to malloc'd UTF-8 text (invalid byte sequences become U+FFFD, as HF).
 * Errors: id out of range. */
int tokenizer_decode(const Tokenizer *t, const int *ids, size_t n, bool skip_special_tokens, char **text, char *err);
/* As tokenizer_decode, with the text's length in bytes (*len): the text may hold NUL bytes (a token of byte 0). */
int tokenizer_decode_len(const Tokenizer *t, const int *ids, size_t n, bool skip_special_tokens, char **text,
                         size_t *len, char *err);

/* As tokenizer_decode, for a model's output: ids at or above the tokenizer's
 * vocabulary (a model's padded embedding rows, e.g. Qwen2.5's 151665..151935)
 * are left out, as transformers' decode leaves them; negative ids are errors. */
int tokenizer_decode_generated(const Tokenizer *t, const int *ids, size_t n, bool skip_special_tokens, char **text,
                               char *err);
int tokenizer_vocab_size(const Tokenizer *t);     /* including added tokens */
bool tokenizer_is_special(const Tokenizer *t, int id); /* decoding with skip_special_tokens leaves it out */
int tokenizer_token_id(const Tokenizer *t, const char *token); /* -1 if absent */
const char *tokenizer_id_to_token(const Tokenizer *t, int id); /* NULL if out of range */
int tokenizer_bos_id(const Tokenizer *t);         /* -1 if none */
int tokenizer_eos_id(const Tokenizer *t);         /* -1 if none */
int tokenizer_pad_id(const Tokenizer *t);         /* -1 if none */
const char *tokenizer_bos_token(const Tokenizer *t); /* "" if none */
const char *tokenizer_eos_token(const Tokenizer *t); /* "" if none */
bool tokenizer_add_bos(const Tokenizer *t);       /* tokenizer_config add_bos_token */
const char *tokenizer_chat_template(const Tokenizer *t); /* NULL if none */
/* The bytes id adds to decoded text (*len of them; not NUL-terminated) for a
 * lone ByteLevel decoder (GPT-2 style: Qwen, Llama 3), where a token's bytes do
 * not depend on its neighbours; NULL for special tokens, ids out of range and
 * other decoders (tokenizer_byte_level says which). Structured outputs test
 * tokens by these bytes (engine/structured.h). */
const char *tokenizer_token_bytes(const Tokenizer *t, int id, size_t *len);
bool tokenizer_byte_level(const Tokenizer *t);

#endif
