/* serve_turn.h — tensor-parallel colt serve: the other ranks of the group
 * follow rank 0's engine.
 *
 * The engine is deterministic given its calls, and the model's forward does
 * the group's collectives. So rank 0 alone runs HTTP and the serve loop
 * (serve_loop.h); each turn of the loop it records the engine calls it makes
 * — requests added (prompt tokens, stream, options with their stop ids, slot
 * id), aborted, weight-channel operations, "step", "stop" — in a byte buffer
 * (a turn) and broadcasts it over the group's host communicator (its length,
 * then its bytes) before the collective that follows (an engine step, a
 * weight-channel operation). The other ranks (serve_follow) receive each turn
 * and make the same calls in the same order, so every rank's engine holds
 * the same requests and every step's collectives match. Only rank 0 answers
 * clients.
 *
 * Bounded: rank 0 sends a turn at least every 0.1 s (an empty one when idle),
 * and a follower's receive is bounded by the communicator's timeout; a
 * failure there, or in a step, ends every rank (comm_abort) with the reason.
 * Rank 0's "stop" turn ends the followers with status 0.
 *
 * A turn is raw memory of this build (structs copied as they are): every
 * rank runs the same executable on the same kind of host.
 * Not the serve loop itself (serve_loop.c), not the launch (cli/cmd_serve.c). */
#ifndef COLT_SERVE_SERVE_TURN_H
#define COLT_SERVE_SERVE_TURN_H

#include <stddef.h>
#include <stdint.h>

#include "dist/comm.h"
#include "parallel/weight_sync.h"
#include "engine/engine.h"
#include "serve/serve_loop.h"

typedef struct ServeTurn {
    char *data;
    size_t len, cap;
} ServeTurn;

/* Rank 0's side: what it did to its engine, in order. */
void serve_turn_add(ServeTurn *t, uint64_t id, const GenSequence *g, const GenerateOptions *opt);
void serve_turn_abort(ServeTurn *t, uint64_t id);
void serve_turn_sync(ServeTurn *t, const ServeSyncRequest *q);
void serve_turn_step(ServeTurn *t);
void serve_turn_stop(ServeTurn *t);
/* Broadcasts the turn from rank 0 (possibly empty: a heartbeat) and empties it. */
int serve_turn_send(ServeTurn *t, Comm *tp, char *err);
void serve_turn_free(ServeTurn *t);

/* engine_create on every rank of the group (tp NULL: one process), with one
 * KV pool size for all: the smallest any rank could take (each rank's free
 * device memory differs; the schedule, and so the collectives, depend on the
 * pool). Collective; an error on every rank when one failed. */
int serve_engine_create(Engine **out, Model *m, const EngineOptions *eo, int max_len, int max_seqs, Comm *tp,
                        char *err);

/* One weight-channel operation as server rank `rank` of a server of
 * n_server_ranks processes (the group: those and the trainer, last). On a
 * failure the channel is closed (*sync NULL). *bytes, *seconds: the push
 * received (RECV). cancel (NULL: never): set by another thread, OPEN's wait
 * for the trainer ends at once. */
int serve_sync_run(WeightSync **sync, Model *m, const ServeSyncRequest *q, int rank, int n_server_ranks,
                   const atomic_bool *cancel, size_t *bytes, double *seconds, char *err);
/* The channel's options for q (OPEN) as server rank `rank` of n_server_ranks. */
WeightSyncOptions serve_sync_options(const Model *m, const ServeSyncRequest *q, int rank, int n_server_ranks,
                                     const atomic_bool *cancel);

/* A follower (rank > 0 of tp): creates its engine, then replays rank 0's
 * turns until the "stop" turn (returns 0) or a failure (err says what; the
 * caller then calls comm_abort). */
int serve_follow(Model *m, const ServeLoopOptions *o, Comm *tp, char *err);

#endif
