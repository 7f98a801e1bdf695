/* openai.h — the OpenAI API's shapes for colt serve: a /v1/completions or
 * /v1/chat/completions body read and checked into what the engine takes
 * (prompt ids, n, sampling settings, stop ids and strings, limits), each
 * choice's text followed as its tokens arrive (stop strings, what is safe to
 * stream), and the JSON that goes back: whole responses, server-sent-event
 * chunks, error objects. Pure functions over jansson and the tokenizer: no
 * sockets (http_server.c), no threads (serve_loop.c). */
#ifndef COLT_SERVE_OPENAI_H
#define COLT_SERVE_OPENAI_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "agent/tool_calls.h"
#include "engine/generate.h"
#include "model/model.h"
#include "serve/serve_loop.h"
#include "tokenizer/tokenizer.h"

typedef enum { OPENAI_COMPLETIONS, OPENAI_CHAT } OpenAIEndpoint;

/* What every request is checked against (the server's settings). */
typedef struct OpenAIContext {
    const Tokenizer *tok;
    int vocab_size;
    const char *model_name;      /* the only "model" accepted */
    int max_model_len;           /* prompt + completion tokens */
    int max_tokens_limit;        /* the most max_tokens a request may ask */
    SamplingParams defaults;     /* for settings a request leaves out (seed: drawn per request) */
    const int *eos_ids;          /* the model's and tokenizer's end ids (data/prompt.h prompt_stop_ids) */
    int n_eos;
    /* how the chat template writes tool calls (agent/tool_calls.h), for chat requests with tools; false when
     * colt reads no calls in its format (tools are then still rendered, the calls left in the text) */
    bool reads_tool_calls;
    ToolCallFormat tool_format;
    bool can_score;              /* the server scores prompts (echo with logprobs, top log-probs): one process */
} OpenAIContext;

/* A checked request. */
typedef struct OpenAIRequest {
    OpenAIEndpoint endpoint;
    int **prompts, *prompt_lens, n_prompts; /* owned until openai_take_prompts */
    int n;                       /* completions per prompt */
    GenerateOptions opt;         /* stop_ids -> stop_ids below */
    int *stop_ids, n_stop_ids;
    int *bias_ids, n_bias;       /* logit_bias -> opt */
    float *bias_values;
    char **stop_strings;
    int n_stop_strings;
    char **prompt_texts;         /* [n_prompts] the text of a text prompt (echo), NULL for ids */
    bool stream, include_usage, logprobs, return_token_ids;
    bool echo;                   /* completions: the prompt's text (and, with logprobs, its tokens') first */
    int top_logprobs;            /* alternatives per position (completions' logprobs: k; chat's top_logprobs) */
    bool scores;                 /* logprobs come from the scoring forward (serve_request_want_scores): echo or
                                  * top_logprobs > 0 */
    bool seeded;                 /* the request gave a seed (else random_seed, and the caller picks its streams) */
    json_t *tools;               /* chat: the request's tools when calls are read out of its answers (else NULL) */
    ToolCallFormat tool_format;  /* with tools: the format they are read in (the context's) */
} OpenAIRequest;

/* Reads a request body. Returns 0, or -1 with err set to a message for an
 * HTTP 400 and *param to the offending parameter (NULL when none is to
 * blame). random_seed is used when the request gives no seed: the server
 * then gives its choices RNG streams of their own, so unseeded requests share
 * one seed and one sampler call per step, yet draw independently. */
int openai_parse_request(OpenAIRequest *out, OpenAIEndpoint endpoint, const char *body, size_t len,
                         const OpenAIContext *ctx, uint64_t random_seed, const char **param, char *err);
void openai_request_free(OpenAIRequest *r);
/* Hands the prompt arrays over (serve_request_create takes them); n_prompts and prompt_lens stay. */
void openai_take_prompts(OpenAIRequest *r);

/* An OpenAI error object {"error": {"message", "type", "param", "code"}} as text (malloc'd). */
char *openai_error_json(const char *message, const char *type, const char *param, int code);

/* One choice's text as its tokens arrive. */
typedef struct ChoiceText {
    char *text;          /* the completion's text so far; cut before a stop string once one is found */
    size_t streamed;     /* bytes of it already sent */
    int n_tokens;        /* tokens seen (ids of the sequence [0, n_tokens)) */
    int n_logprobs_sent; /* tokens whose log-probs were streamed */
    size_t logprob_chars; /* characters of those tokens' texts: the next one's text_offset */
    bool finished;
    const char *finish_reason; /* "stop" or "length" once finished */
    /* Incremental decoding (choice_text_update): text[0, committed_len) is the text of tokens
     * [0, read_offset); the rest, the text of the tokens after, may still change (an incomplete character) */
    size_t text_len, text_cap; /* strlen(text), its allocation */
    size_t committed_len;
    int read_offset;
    int *context_ids;    /* the kept ids (not special, in the vocabulary) of the last committed chunk that had
                          * any: decoded before the new ids so the decoder treats them as inside the whole text */
    int n_context;
    char *context_text;  /* the context's own text */
    size_t context_len;
    bool text_closed;    /* a NUL byte ended the text: text is a C string, nothing after it is seen */
    long long n_decoded; /* ids decoded so far (tests check the work stays linear in the length) */
} ChoiceText;

/* Brings ct to progress p of sequence g (text decoded as colt generate does:
 * a stop token left out, special tokens skipped). *hit_stop_string: a stop
 * string appeared now (ct is finished; the caller cancels the choice).
 * Before the end only the new tokens are decoded (with a few before them)
 * and only the new text searched for stop strings; once the choice is done,
 * or a stop string is found, the whole completion is decoded once, so the
 * final text is always what a whole answer has. */
int choice_text_update(ChoiceText *ct, const GenSequence *g, const ChoiceProgress *p, const OpenAIRequest *req,
                       const Tokenizer *tok, bool *hit_stop_string, char *err);
/* The bytes [ct->streamed, end) that may be sent now: not a trailing
 * incomplete character, not a tail that may begin a stop string (all of it
 * once finished); with tools (chat), only text that is content whatever
 * follows: none from the first character that may begin a call or a region
 * ('<' hermes, '{' Llama 3), not its trailing whitespace, and nothing while
 * it starts with whitespace (the parsed content is stripped). */
size_t choice_text_stream_end(const ChoiceText *ct, const OpenAIRequest *req);
void choice_text_free(ChoiceText *ct);

/* The whole response of a finished request (malloc'd JSON). */
char *openai_response_json(const OpenAIRequest *req, ServeRequest *sr, const ChoiceText *texts, const char *id,
                           int64_t created, const OpenAIContext *ctx);
/* One server-sent event "data: {...}\n\n" for choice i: the text
 * [from, to) of texts[i], the log-probs of its tokens not sent yet, its
 * finish reason when finished (first_chunk: chat's role delta). Appended to *buf.
 * With tools (chat), the finished choice's last events are vLLM's: the rest of
 * the answer's content (what the non-streamed message.content holds past the
 * text sent), then one delta.tool_calls event per call ({index, id, type,
 * function {name, arguments: all of them}}), finish_reason "tool_calls". */
void openai_stream_chunk(char **buf, size_t *len, const OpenAIRequest *req, ServeRequest *sr, ChoiceText *ct, int i,
                         size_t from, size_t to, bool first_chunk, const char *id, int64_t created,
                         const OpenAIContext *ctx);
/* The usage chunk (stream_options.include_usage) and "data: [DONE]\n\n". */
void openai_stream_usage(char **buf, size_t *len, const OpenAIRequest *req, ServeRequest *sr, const ChoiceText *texts,
                         const char *id, int64_t created, const OpenAIContext *ctx);
void openai_stream_done(char **buf, size_t *len);
/* An error inside a stream: "data: {"error": ...}\n\n". */
void openai_stream_error(char **buf, size_t *len, const char *message);

/* GET /v1/models (malloc'd JSON). */
char *openai_models_json(const OpenAIContext *ctx, int64_t created);

#endif
