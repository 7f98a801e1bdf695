/* train_dist.h — the trainer's data-parallel collectives over dist/comm.h:
 * gathering each rank's share of a round (completions, rewards, log-probs),
 * summing gradients in a fixed order, and agreeing on errors and stop signals.
 * A world of one calls nothing: every function is then a copy or a no-op.
 *
 * Buffers passed here are host memory, except the gradient buffer of
 * train_dist_sum_gradients, which is the backend's [f32] buffer (staged through
 * the host when the communicator cannot read device memory). */
#ifndef COLT_TRAIN_TRAIN_DIST_H
#define COLT_TRAIN_TRAIN_DIST_H

#include <stdbool.h>
#include <stddef.h>

#include "backend/backend.h"
#include "dist/comm.h"

typedef struct TrainDist {
    int rank, world;
    Comm *comm;       /* NULL for a world of one */
    float *staging;   /* host copy of the gradients (device buffers over a host communicator) */
    size_t staging_n;
} TrainDist;

/* out[world * bytes_each] = every rank's mine[bytes_each], in rank order. */
int train_dist_gather(TrainDist *d, void *out, const void *mine, size_t bytes_each, char *err);

/* The sum over ranks of grads[n] ([f32] buffer of be), added in rank order
 * (r0 + r1 + r2 ... : the same bits as one process accumulating the ranks'
 * micro-batches one after the other). */
int train_dist_sum_gradients(TrainDist *d, const Backend *be, void *grads, size_t n, char *err);

/* The ranks agree on a status: every rank passes its rc (and err when failed).
 * Returns COLT_OK when all succeeded; else COLT_ERR on every rank: a rank that
 * failed keeps its own message, the others get the first failing rank's
 * ("rank 2: reward 'x': ...") — so rank 0 can save and report what another
 * rank hit. */
int train_dist_agree(TrainDist *d, int rc, char *err);

/* True on every rank when flag is true on any (a stop signal seen by one). */
bool train_dist_any(TrainDist *d, bool flag);

void train_dist_free(TrainDist *d);

#endif
