/* structured.h — structured outputs: sampling constrained to a regular
 * expression (vLLM's StructuredOutputsParams(regex=...), TRL's
 * vllm_structured_outputs_regex). Every completion's decoded text is a full
 * match of the regex when it ends on a stop token.
 *
 * The regex is PCRE2's (compiled anchored at both ends, in non-UTF mode: it
 * matches bytes, so byte-level BPE tokens that hold part of a UTF-8 character
 * are tested as the bytes they are; `.` is one byte, `\d` ASCII digits). Each
 * step the allowed next tokens are those whose bytes, appended to the text so
 * far, leave a text that can still be extended to a match (PCRE2_PARTIAL_HARD)
 * or is one. The vocabulary is kept sorted by its tokens' bytes, an implicit
 * byte trie: a subtree whose prefix already fails is skipped whole, so a step
 * costs one match per live trie edge, not one per token. Stop tokens (eos) are
 * allowed only when the text is a full match; a full match that no token can
 * extend allows only them. Masks are cached by the text they follow (the same
 * text gives the same mask), so G completions of a prompt share their first
 * steps' masks.
 *
 * It is not a regex engine (PCRE2 is) and not a grammar (no JSON schema). A
 * TokenRegex holds scratch and a cache: one thread at a time. */
#ifndef COLT_ENGINE_STRUCTURED_H
#define COLT_ENGINE_STRUCTURED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct TokenRegex TokenRegex;

/* Compiles pattern over a vocabulary of vocab_size ids: token_bytes[v] /
 * token_lens[v] are the bytes id v adds to the decoded text (token_bytes[v]
 * NULL: never generated — special tokens, a model's padding rows). Errors, one
 * line: a bad regex ("regex 'a(': missing closing parenthesis at offset 2"), a
 * regex no text can match, a regex whose matches no token can start. */
int token_regex_create(TokenRegex **out, const char *pattern, const char *const *token_bytes,
                       const uint32_t *token_lens, int vocab_size, char *err);
void token_regex_free(TokenRegex *r); /* NULL is fine */

const char *token_regex_pattern(const TokenRegex *r);
int token_regex_vocab_size(const TokenRegex *r);
/* uint32 words of one row's mask: (vocab_size + 31) / 32. */
int token_regex_mask_words(const TokenRegex *r);

/* The tokens allowed after a completion tokens[n_tokens] (its text: the bytes
 * of its tokens, ids without bytes left out): mask[mask_words] gets bit v % 32
 * of word v / 32 set for each allowed id v. stop_ids are allowed only when the
 * text is a full match (and then always). Returns how many ids are allowed (0:
 * the text cannot be completed, or it is complete and there is no stop id). */
int token_regex_mask(TokenRegex *r, uint32_t *mask, const int *tokens, int n_tokens, const int *stop_ids, int n_stop);

/* Whether text[len] is a full match (for tests and callers' checks). */
bool token_regex_full_match(TokenRegex *r, const char *text, size_t len);

/* What token_regex_mask cost so far: calls, of which answered from the
 * cache, PCRE2 matches run, seconds. */
typedef struct TokenRegexStats {
    int64_t masks, cached, matches;
    double seconds;
} TokenRegexStats;
void token_regex_stats(const TokenRegex *r, TokenRegexStats *out);

/* logits[v] = -inf where mask's bit v is clear (the host form of the
 * backend's apply_token_bitmask). */
void token_mask_apply(float *logits, const uint32_t *mask, int vocab_size);

#endif
