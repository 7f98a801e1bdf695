/* colt_api.h — colt's own endpoints of colt serve, for colt train in server
 * mode (TRL's vllm_serve has /generate/, /init_communicator/,
 * /update_named_param/ likewise):
 *   POST /colt/generate           token-id prompts, one RNG stream each, one
 *                                 set of sampling settings -> each
 *                                 completion's token ids, log-probs, finish reason
 *   POST /colt/init_weight_sync   {"port": P, "timeout": s, "nccl": false, "lora": {"r": 8, "lora_alpha": 16,
 *                                 "use_rslora": false, "target_modules": ["q_proj", ...]} or null}
 *   POST /colt/update_weights     {}
 *   POST /colt/close_weight_sync  {}
 *   GET  /colt/info               {"device", "deterministic", "max_model_len", "weight_updates",
 *                                 "tensor_parallel_size", "weight_sync_world_size"}: what a trainer
 *                                 checks before it uses the server (the weight channel's group is
 *                                 the server's processes and the trainer, last)
 * The bodies read and checked, and the JSON that goes back. Pure functions
 * over jansson: no sockets (http_server.c), no threads (serve_loop.c). */
#ifndef COLT_SERVE_COLT_API_H
#define COLT_SERVE_COLT_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/generate.h"
#include "serve/serve_loop.h"

/* What /colt/generate requests are checked against. */
typedef struct ColtApiContext {
    int vocab_size;
    int max_model_len;      /* prompt + completion tokens */
    int max_tokens_limit;
    const int *eos_ids;     /* stop ids when the request gives none */
    int n_eos;
} ColtApiContext;

/* A checked /colt/generate body: {"prompts": [[ids]...], "streams": [s...],
 * "max_tokens": L, "temperature", "top_k", "top_p", "min_p",
 * "repetition_penalty", "seed", "stop_token_ids": [...]} (sampling settings
 * absent: greedy off, i.e. temperature 1 and every filter off). Completion i
 * completes prompts[i] with RNG stream streams[i] (below 2^31).
 * A conversation's later turn (the trainer's tool calling): "max_tokens" may
 * be an array, one budget per prompt, and "first_positions": [p...] gives
 * each completion the RNG position of its first token (GenSequence's
 * first_position; absent: 0). */
typedef struct ColtGenerateRequest {
    int **prompts, *prompt_lens, n_prompts; /* owned until handed to serve_request_create */
    uint64_t *streams;
    int *first_positions; /* [n_prompts], or NULL: all 0 */
    int *max_tokens_each; /* [n_prompts], or NULL: opt.max_new_tokens for every one (then the largest) */
    GenerateOptions opt;
    int *stop_ids;
} ColtGenerateRequest;

/* The same request as bytes (Content-Type: application/octet-stream; colt
 * train sends it: a round's token ids need no decimal text, 256 contexts of
 * 2K tokens are 3.3 MB of JSON and ~0.5 s to write and parse on a two-core
 * machine). Little-endian, in order: the 8 bytes "COLTREQ1", u32 settings
 * length, the settings (a JSON object of the keys above but "prompts",
 * "streams" and "first_positions"; "max_tokens" an integer), u32 prompts,
 * then per prompt u32 stream, u32 first position, u32 max_tokens (0: the
 * settings'), u32 length n and n i32 token ids. colt_generate_parse reads
 * either form (this one by its first 8 bytes); colt_generate_request_binary
 * writes it for seqs[n] (their prompts, streams and first positions;
 * max_tokens_each may be NULL), malloc'd, *len bytes. */
#define COLT_REQUEST_MAGIC "COLTREQ1"
char *colt_generate_request_binary(const GenSequence *seqs, int n, const int *max_tokens_each,
                                   const char *settings_json, size_t *len);

/* Returns 0, or -1 with err set to a message for an HTTP 400. */
int colt_generate_parse(ColtGenerateRequest *out, const char *body, size_t len, const ColtApiContext *ctx, char *err);
void colt_generate_free(ColtGenerateRequest *r);

/* {"completions": [{"token_ids": [...], "logprobs": [...], "finish_reason": "stop"|"length"}...],
 * "weight_updates": k} for a finished request (malloc'd JSON). Log-probs are
 * the engine's floats written exactly (null: not scored). */
char *colt_generate_response_json(ServeRequest *sr, int64_t weight_updates);

/* The same answer as bytes, for a client that sends "Accept: application/octet-stream" (colt train
 * does): the token ids and fp32 log-probs as they are, no decimal text to write and read back (a
 * round of 512 x 256 tokens: 1 MB instead of 2.4 MB of JSON, and its two sides' ~0.15 s of
 * formatting and parsing gone). Little-endian, in order:
 *   the 8 bytes "COLTGEN1", u64 weight_updates, u32 completions, then per completion
 *   u32 tokens n, u32 finish (0 length, 1 stop), i32 token_ids[n], f32 logprobs[n] (NaN: not scored).
 * Returns the malloc'd bytes, their count in *len. */
#define COLT_GENERATE_BINARY_TYPE "application/octet-stream"
#define COLT_GENERATE_MAGIC "COLTGEN1"
char *colt_generate_response_binary(ServeRequest *sr, int64_t weight_updates, size_t *len);

/* Reads a binary answer of n completions into seqs[i] (tokens, logprobs,
 * n_tokens, finish: malloc'd): each with 1 .. max_tokens tokens
 * (max_tokens_each[i] when given), every id below vocab_size, nothing after
 * the last. Returns 0, or -1 with err naming what is wrong. */
int colt_generate_answer_read(GenSequence *seqs, int n, const unsigned char *data, size_t len, int max_tokens,
                              const int *max_tokens_each, int vocab_size, long long *weight_updates, char *err);

/* GET /colt/info's answer (malloc'd JSON). */
char *colt_info_json(const ServeLoopStats *st, const ColtApiContext *ctx);

/* A weight-channel body: {"port": P (init only), "timeout": seconds, "nccl":
 * bool, "lora": the trainer's adapters' config (init only; absent or null:
 * none)}. default_host: where the group's store listens (the server's own
 * address). Whether r suits the model is the loop's check (serve_loop_weight_sync). */
int colt_sync_parse(ServeSyncRequest *out, ServeSyncOp op, const char *body, size_t len, const char *default_host,
                    char *err);
/* The trainer's /colt/init_weight_sync body (malloc'd JSON); lora NULL: no adapters. */
char *colt_sync_init_json(int port, double timeout_s, bool nccl, const LoraConfig *lora);

#endif
