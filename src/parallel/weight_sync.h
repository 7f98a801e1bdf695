/* weight_sync.h — the channel a trainer pushes its new weights over to a
 * generation server after each optimizer step (TRL's vllm_mode "server": the
 * server's ranks and the trainer's rank 0 form one group through a TCP store
 * on the server's host at vllm_group_port, and the trainer broadcasts).
 *
 * The group: the server's ranks are 0 .. world_size - 2 (its rank 0 serves
 * the store), the trainer is the last rank. Over NCCL when every member has a
 * GPU of its own (the weights go device to device in large buckets), else
 * over Gloo through the host (CPU ranks, or a server and a trainer sharing one
 * GPU): each bucket is copied to pinned host memory, broadcast, copied back.
 *
 * What goes over: the model's weights as laid out in its arena (every tensor,
 * padding included), bucket by bucket, so a push is a handful of large
 * broadcasts instead of one per tensor (TRL's per-parameter sync was its main
 * cost, trl#5249). With LoRA adapters attached (lora.h) the first push over a
 * channel sends the base weights and the adapters, every later one the
 * adapters' arena alone (the base is frozen): a few MB instead of the model,
 * where TRL merges the adapters and pushes every weight. Both sides must hold
 * the same layout — same config, same storage dtype, the same adapters (rank,
 * target modules, scaling) or none: the first thing each push sends is the
 * layout's fingerprint, and a mismatch fails on every member with one line
 * saying what differs. The trainer sends a whole model; a server rank may
 * hold a tensor-parallel part of it (a tensor-parallel colt serve: every rank
 * of its group is a member): it answers with the whole model's fingerprint,
 * receives the whole arena bucket by bucket into device memory and cuts its
 * part of each tensor (model.h model_part_receiver_*). Adapters on a
 * tensor-parallel part are refused for now.
 *
 * Joining: rank 0's store listens on bind_host (the server's own address),
 * admits only members that show the token, and every member waits there
 * (cancellable) until all have arrived, before NCCL or Gloo open their own
 * connections. */
#ifndef COLT_PARALLEL_WEIGHT_SYNC_H
#define COLT_PARALLEL_WEIGHT_SYNC_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#include "dist/comm.h"
#include "model/model.h"

#define WEIGHT_SYNC_BUCKET_BYTES ((size_t)256 << 20) /* >= 256 MB per broadcast */

typedef struct WeightSyncOptions {
    const char *host;   /* the server's host (its rank 0 serves the store there) */
    int port;           /* vllm_group_port */
    int rank;           /* server ranks 0 .. world_size - 2; the trainer world_size - 1 */
    int world_size;     /* the server's ranks + 1 */
    const Backend *be;  /* the backend the model computes on */
    CommKind kind;      /* COMM_AUTO: NCCL when be is a GPU and use_nccl, else Gloo */
    bool use_nccl;      /* every member has a GPU of its own (NCCL refuses two ranks on one GPU) */
    int cuda_device;    /* NCCL: this member's device ordinal (be->device) */
    double timeout_s;   /* bound on every wait (0: COMM_DEFAULT_TIMEOUT_S) */
    size_t bucket_bytes; /* 0: WEIGHT_SYNC_BUCKET_BYTES */
    const char *bind_host; /* rank 0: the address its store listens on (NULL: host when it is loopback, else any) */
    const char *token;  /* the store admits only members that show it (colt serve's API key); NULL: anyone */
    const atomic_bool *cancel; /* set: the wait for the other members ends now with an error (NULL: never) */
} WeightSyncOptions;

typedef struct WeightSync WeightSync;

/* Joins the group (collective over its members; bounded by the timeout):
 * weight_sync_meet, then weight_sync_open_met. */
int weight_sync_open(WeightSync **out, const WeightSyncOptions *opt, char *err);
/* Its two halves, for a member that waits for the others on another thread
 * than the one that uses the channel: meeting at the store (every member
 * present; the only long wait, ended early by opt->cancel) touches no device
 * and no model; opening the communicator and buffers (quick, the others are
 * there) takes the store over (closed on failure). */
int weight_sync_meet(Store **store, const WeightSyncOptions *opt, char *err);
int weight_sync_open_met(WeightSync **out, Store *store, const WeightSyncOptions *opt, char *err);
/* The trainer (the last rank): broadcasts m's weights (with adapters
 * attached: the base too at the channel's first push, else the adapters). */
int weight_sync_send(WeightSync *w, const Model *m, char *err);
/* A server rank: receives the trainer's weights into m and bumps its weights
 * version (model_weights_changed), so an engine computing with m drops what
 * it computed with the old ones (its prefix cache) at its next step. */
int weight_sync_recv(WeightSync *w, Model *m, char *err);
/* Bytes moved and seconds spent by the last send or recv. */
void weight_sync_last(const WeightSync *w, size_t *bytes, double *seconds);
CommKind weight_sync_kind(const WeightSync *w);
void weight_sync_close(WeightSync *w);

#endif
