/* serve_loop.h — the engine thread of colt serve. It alone touches the model
 * and the persistent engine; HTTP threads submit requests (prompts x n
 * completions, one set of options) and wait on them. Each turn the loop adds
 * what was submitted, aborts what a waiter cancelled (a client gone, a stop
 * string found), runs one engine step over everything in flight — requests of
 * every client batched together — and publishes each new token to its
 * request, waking the waiter. Every wait is bounded.
 * Not the HTTP server (http_server.h) nor the OpenAI formats (openai.h). */
#ifndef COLT_SERVE_SERVE_LOOP_H
#define COLT_SERVE_SERVE_LOOP_H

#include <stdbool.h>
#include <stdint.h>

#include "dist/comm.h"
#include "engine/engine.h"
#include "model/lora.h"

typedef struct ServeLoop ServeLoop;
typedef struct ServeRequest ServeRequest;

typedef struct ServeLoopOptions {
    EngineOptions engine;     /* max_num_seqs: sequences in the pool at once */
    int max_model_len;        /* prompt + completion tokens of one sequence */
    int max_queued_sequences; /* sequences submitted and not finished; more are refused as busy */
    Comm *tp;                 /* tensor parallel: the group's host communicator, this process its rank 0, the
                               * others following (serve_turn.h); NULL: one process */
} ServeLoopOptions;

/* Starts the thread; it creates the engine (the KV pool is taken now) and
 * the call returns its error, if any. */
int serve_loop_start(ServeLoop **out, Model *m, const ServeLoopOptions *o, char *err);
/* Ends the thread; requests still in flight fail ("the server is shutting
 * down"). Their waiters must still release them. A wait for a trainer that
 * has not joined the weight channel ends at once; a push being received may
 * hold the engine thread until the channel's timeout: past grace_s this
 * returns COLT_ERR and leaves the loop as it is (not freed, its thread
 * running), and the caller exits without it. */
int serve_loop_stop(ServeLoop *l, double grace_s);

/* A request: prompts[n_prompts] (taken: malloc'd arrays, freed with the
 * request) completed n times each; completion j of prompt i is choice
 * i * n + j and draws from RNG stream i * n + j (colt generate's numbering).
 * opt's stop ids and logit bias are copied. The caller holds one reference. */
ServeRequest *serve_request_create(int **prompts, const int *prompt_lens, int n_prompts, int n,
                                   const GenerateOptions *opt);
void serve_request_release(ServeRequest *r);
/* Gives choice i RNG stream streams[i] instead (colt's /colt/generate: the
 * trainer numbers its completions itself); before serve_loop_submit. */
void serve_request_set_streams(ServeRequest *r, const uint64_t *streams);
/* A conversation's later turns: choice i's first RNG position first_positions[i] and its own budget
 * max_new_tokens[i] (at most the request's); either may be NULL (unchanged). Before serve_loop_submit. */
void serve_request_set_turns(ServeRequest *r, const int *first_positions, const int *max_new_tokens);

/* Its waiter reads nothing before a choice ends (a whole answer without stop
 * strings): serve_request_wait wakes at each choice's end (or its time slice)
 * rather than at every token. Before serve_loop_submit. */
void serve_request_wake_at_end(ServeRequest *r);

/* Hands the request to the loop (which takes its own reference). Refused
 * with an HTTP status and a message: 503 when the queue is full or the server
 * drains, 500 when the engine failed. */
int serve_loop_submit(ServeLoop *l, ServeRequest *r, int *http_status, char *err);
/* New requests are refused from now on (503); those in flight go on. */
void serve_loop_drain(ServeLoop *l);
/* Every request in flight fails now ("the server is shutting down"); the
 * loop keeps running (refusing new ones) until serve_loop_stop. */
void serve_loop_abort_all(ServeLoop *l);
/* Sequences submitted and not finished. */
int serve_loop_outstanding(ServeLoop *l);
bool serve_loop_healthy(ServeLoop *l); /* the engine has not failed and the loop is not draining */

/* What a waiter sees of one choice. Tokens [0, n_ready) of its sequence
 * (serve_request_sequence) are final and may be read without a lock. */
typedef struct ChoiceProgress {
    int n_ready;
    bool done;
    bool scored; /* its TokenScores are ready (requests with serve_request_want_scores) */
    FinishReason finish;
} ChoiceProgress;

/* Scores of a choice's tokens by the model's own forward over prompt +
 * completion (the echo and top-log-prob answers of the OpenAI API): for each
 * position t of the n = prompt_len + n_tokens ids, log p(id_t | ids_<t) under
 * log_softmax(logits) (no temperature, no filters: vLLM's raw_logprobs) and
 * the k most likely ids there, most likely first (lower id first on ties).
 * Position 0 has nothing before it: logprob NaN, no alternatives. */
typedef struct TokenScores {
    int n, k;
    float *logprob;      /* [n] */
    int *top_ids;        /* [n, k] */
    float *top_logprobs; /* [n, k] */
} TokenScores;
/* Before serve_loop_submit: every choice is scored (with k alternatives,
 * 0..20) when it leaves the engine (finished, or cancelled by its waiter at a
 * stop string: then over the tokens it had). The loop scores on the engine
 * thread, one process only (a tensor-parallel server refuses: the caller
 * checks). */
void serve_request_want_scores(ServeRequest *r, int k);
/* Choice i's scores once its progress says scored; NULL when not asked for. */
const TokenScores *serve_request_scores(const ServeRequest *r, int choice);

int serve_request_choices(const ServeRequest *r);
const GenSequence *serve_request_sequence(const ServeRequest *r, int choice);
/* Waits until the request changed since *seen (0 at first) or timeout_s
 * passed, then copies every choice's progress into out[] and updates *seen.
 * Returns 1 when something changed, 0 on timeout, -1 when the request failed
 * (err says why: the engine failed, the server stopped). */
int serve_request_wait(ServeRequest *r, ChoiceProgress *out, uint64_t *seen, double timeout_s, char *err);
/* The waiter gives up a choice (-1: all): the loop aborts it in the engine;
 * it counts as done from now on. */
void serve_request_cancel(ServeLoop *l, ServeRequest *r, int choice);
/* Seconds from submission to its first token (0 until there is one). */
double serve_request_first_token_seconds(ServeRequest *r);

/* The weight-update channel (parallel/weight_sync.h), run by the engine thread
 * between engine steps in the order asked (one process: OPEN's wait for the
 * trainer runs on a thread of its own, so generation goes on meanwhile and
 * the operations after it wait; serve_loop_stop cuts that wait short): OPEN
 * first gives the model the
 * trainer's LoRA adapters (attached with its config, replacing adapters of
 * another config; taken off when the trainer has none: the pushes then hold
 * whole weights; refused on a tensor-parallel server), then joins the group
 * as server rank 0 (serving its store on host:port; a tensor-parallel
 * server's other ranks join as ranks 1 .. N-1, the trainer is rank N) and
 * waits for the trainer;
 * RECV receives one push into the model (the weights version moves, so the
 * engine recomputes what it holds and empties its prefix cache; requests
 * still running finish with the new weights); CLOSE leaves the group. Each
 * is bounded by timeout_s; a failure is logged, closes the channel and the
 * server keeps serving with the weights it has. Returns at once (the caller
 * then does its side of the collective); refused (409) when the operation
 * does not follow (RECV or CLOSE without OPEN, OPEN twice) or too many wait,
 * (400) when the trainer's adapters do not suit this model (r too large). */
typedef enum { SERVE_SYNC_OPEN, SERVE_SYNC_RECV, SERVE_SYNC_CLOSE } ServeSyncOp;
typedef struct ServeSyncRequest {
    ServeSyncOp op;
    char host[256];
    int port;
    bool use_nccl;    /* the trainer has a GPU of its own (else Gloo through the host) */
    double timeout_s;
    bool has_lora;    /* OPEN: the trainer trains LoRA adapters of config lora (its dropout 0: inference) */
    LoraConfig lora;
    char bind_host[256]; /* OPEN: where rank 0's store listens (the server's own address, not the client's) */
    char token[256];     /* OPEN: what every member shows the store to join (the server's API key) */
} ServeSyncRequest;
int serve_loop_weight_sync(ServeLoop *l, const ServeSyncRequest *q, int *http_status, char *err);

/* Numbers for /metrics. */
typedef struct ServeLoopStats {
    EngineLoad load;
    EngineStats engine;      /* totals since start */
    int64_t requests_submitted, requests_finished;
    int64_t sequences_finished;
    int outstanding;         /* sequences submitted, not finished */
    double tokens_per_second; /* sampled tokens over the last 10 s */
    bool failed, draining;
    bool sync_open;           /* the weight channel is open (or its OPEN is queued) */
    int64_t weight_updates;   /* pushes received */
    int64_t weight_sync_failures;
    double last_update_seconds, last_update_bytes;
    double idle_seconds; /* the engine thread waiting for work (nothing running, nothing queued) */
    double loop_seconds; /* the engine thread between steps: admitting, publishing, scoring, weight pushes */
    const char *device;       /* the backend the model computes on ("cpu", "cuda") */
    bool deterministic;       /* the engine's deterministic mode */
    int tensor_parallel_size; /* the server's processes (the weight channel's group: these + the trainer) */
} ServeLoopStats;
void serve_loop_stats(ServeLoop *l, ServeLoopStats *out);

#endif
