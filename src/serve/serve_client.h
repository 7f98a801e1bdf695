/* serve_client.h — colt train's side of server mode: an HTTP client (libcurl)
 * of a running colt serve's colt endpoints (serve/colt_api.h). Every call is
 * bounded by the client's timeout; errors name the server's address.
 * Not the weight channel itself (parallel/weight_sync.h), not the trainer loop. */
#ifndef COLT_SERVE_SERVE_CLIENT_H
#define COLT_SERVE_SERVE_CLIENT_H

#include <jansson.h>
#include <stddef.h>

#include "engine/generate.h"

typedef struct ServeClient ServeClient;

/* A client of base_url ("http://host:port") that sends api_key (NULL: none)
 * as "Authorization: Bearer KEY" on every request. Waits until GET /health
 * answers 200, at most timeout_s (error: "no colt serve answered at URL
 * within N s"). timeout_s also bounds every later call. */
int serve_client_open(ServeClient **out, const char *base_url, const char *api_key, double timeout_s, char *err);
void serve_client_close(ServeClient *c);
const char *serve_client_url(const ServeClient *c);
/* The host part of the URL (where the weight channel's store listens). */
int serve_client_host(const ServeClient *c, char *host, size_t size, char *err);

/* Completes seqs[n] (prompt, prompt_len and stream as for engine_generate)
 * on the server with opt's settings; fills tokens, logprobs, n_tokens and
 * finish as the engine does (token ids checked below vocab_size). *weight_updates: pushes the server had received
 * when it answered (NULL: not wanted). Safe to call from another thread than
 * the other calls, one call at a time per thread. */
int serve_client_generate(ServeClient *c, GenSequence *seqs, int n, const GenerateOptions *opt, int vocab_size,
                          long long *weight_updates, char *err);
/* serve_client_generate for conversations' turns: seqs[i].first_position is sent (the RNG positions go on
 * from the conversation's earlier turns) and max_new_tokens[i] is turn i's own budget (NULL: opt's). */
int serve_client_generate_turns(ServeClient *c, GenSequence *seqs, int n, const GenerateOptions *opt,
                                const int *max_new_tokens, int vocab_size, long long *weight_updates, char *err);

/* GETs path and reads its JSON answer into *out (the caller decrefs). */
int serve_client_get_json(ServeClient *c, const char *path, json_t **out, char *err);

/* POSTs a JSON body to path (e.g. "/colt/update_weights"); an answer other
 * than 200 is an error carrying the server's message. */
int serve_client_post(ServeClient *c, const char *path, const char *json_body, char *err);

#endif
