/* tokenizer_files.h — copying a model folder's tokenizer files into another
 * (colt init --tokenizer, checkpoints, the trained model). */
#ifndef COLT_TOKENIZER_TOKENIZER_FILES_H
#define COLT_TOKENIZER_TOKENIZER_FILES_H

/* Copies tokenizer.json, tokenizer_config.json, special_tokens_map.json,
 * added_tokens.json, vocab.json, merges.txt and chat_template.jinja when
 * present in src_dir; each written atomically. */
int tokenizer_copy_files(const char *src_dir, const char *dst_dir, char *err);

#endif
