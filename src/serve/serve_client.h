/* serve_client.h — colt train's side of server mode: an HTTP client (libcurl)
 * of a running colt serve's colt endpoints (serve/colt_api.h), or of several
 * data-parallel replicas of it (each its own colt serve, the same model): a
 * generation call is then split over them in a fixed way and their requests
 * are in flight at once. Every call is bounded by the client's timeout;
 * errors name the server's address (the replica's).
 * Not the weight channel itself (parallel/weight_sync.h), not the trainer loop. */
#ifndef COLT_SERVE_SERVE_CLIENT_H
#define COLT_SERVE_SERVE_CLIENT_H

#include <jansson.h>
#include <stddef.h>

#include "engine/generate.h"

typedef struct ServeClient ServeClient;

/* A client of base_url ("http://host:port"; several replicas: their URLs
 * separated by commas) that sends api_key (NULL: none) as "Authorization:
 * Bearer KEY" on every request. Waits until GET /health of every replica
 * answers 200, at most timeout_s in all (error: "no colt serve answered at
 * URL within N s", naming the replica). timeout_s also bounds every later call. */
int serve_client_open(ServeClient **out, const char *base_url, const char *api_key, double timeout_s, char *err);
void serve_client_close(ServeClient *c);
/* The URL (several replicas: theirs, comma-separated). */
const char *serve_client_url(const ServeClient *c);
/* The replicas (1: one server) and replica i as a client of its own (the
 * client itself when there is one; owned by c). */
int serve_client_replicas(const ServeClient *c);
ServeClient *serve_client_replica(ServeClient *c, int i);
/* The replica a sequence goes to: index j of n (a call's j-th sequence, or
 * conversation j of a round's n) to replica j * K / n of K, so each replica
 * gets a contiguous block, sizes within one. */
int serve_client_replica_of(int j, int n, int n_replicas);
/* The host part of the URL (where the weight channel's store listens); one replica's. */
int serve_client_host(const ServeClient *c, char *host, size_t size, char *err);

/* Completes seqs[n] (prompt, prompt_len and stream as for engine_generate)
 * on the server with opt's settings; fills tokens, logprobs, n_tokens and
 * finish as the engine does (token ids checked below vocab_size). *weight_updates: pushes the server had received
 * when it answered (NULL: not wanted). Safe to call from another thread than
 * the other calls, one call at a time per thread. */
int serve_client_generate(ServeClient *c, GenSequence *seqs, int n, const GenerateOptions *opt, int vocab_size,
                          long long *weight_updates, char *err);
/* serve_client_generate for conversations' turns: seqs[i].first_position is sent (the RNG positions go on
 * from the conversation's earlier turns) and max_new_tokens[i] is turn i's own budget (NULL: opt's).
 * replica[i]: the replica turn i goes to (NULL: serve_client_replica_of(i, n, K)); a conversation kept on
 * one replica finds its earlier turns in that server's prefix cache. Several replicas: one request per
 * replica, all in flight at once (a thread each); every sequence keeps its own RNG stream, so what comes
 * back does not depend on the number of replicas (deterministic servers: bit for bit). An error names the
 * first replica (in order) that failed; the other sequences may then hold completions (free them all). */
int serve_client_generate_turns(ServeClient *c, GenSequence *seqs, int n, const GenerateOptions *opt,
                                const int *max_new_tokens, const int *replica, int vocab_size,
                                long long *weight_updates, char *err);

/* GETs path and reads its JSON answer into *out (the caller decrefs); one replica's. */
int serve_client_get_json(ServeClient *c, const char *path, json_t **out, char *err);

/* POSTs a JSON body to path (e.g. "/colt/update_weights"); an answer other
 * than 200 is an error carrying the server's message. Several replicas: to
 * each in turn, the first error ends it. */
int serve_client_post(ServeClient *c, const char *path, const char *json_body, char *err);

#endif
