/* train_dist.c — see train_dist.h. */
#include "train/train_dist.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

int train_dist_gather(TrainDist *d, void *out, const void *mine, size_t bytes_each, char *err) {
    if (d->world == 1) {
        if (bytes_each && out != mine) memmove(out, mine, bytes_each);
        return COLT_OK;
    }
    return comm_all_gather(d->comm, out, mine, bytes_each, COMM_BYTE, NULL, err);
}

int train_dist_sum_gradients(TrainDist *d, const Backend *be, void *grads, size_t n, char *err) {
    if (d->world == 1 || n == 0) return COLT_OK;
    /* All ranks' gradients side by side, then summed in rank order: memory of
     * world x the gradients on the host, which is what makes the order fixed
     * (an all-reduce's order depends on its algorithm). */
    if (d->staging_n < n) {
        free(d->staging);
        d->staging = xmalloc(sizeof(float) * n * ((size_t)d->world + 1));
        d->staging_n = n;
    }
    float *mine = d->staging, *all = d->staging + n;
    be->download_f32(be, mine, grads, n);
    if (comm_all_gather(d->comm, all, mine, n, COMM_FLOAT32, NULL, err) != 0) return COLT_ERR;
    for (size_t i = 0; i < n; i++) {
        float s = all[i];
        for (int r = 1; r < d->world; r++) s += all[(size_t)r * n + i];
        mine[i] = s;
    }
    be->upload_f32(be, grads, mine, n);
    return COLT_OK;
}

typedef struct StatusRecord {
    int rc;
    char message[ERR_LEN];
} StatusRecord;

int train_dist_agree(TrainDist *d, int rc, char *err) {
    if (d->world == 1) return rc == 0 ? COLT_OK : COLT_ERR;
    StatusRecord mine = {.rc = rc != 0};
    if (rc != 0) snprintf(mine.message, sizeof mine.message, "%s", err);
    StatusRecord *all = xcalloc((size_t)d->world, sizeof(StatusRecord));
    char gather_err[ERR_LEN];
    if (comm_all_gather(d->comm, all, &mine, sizeof mine, COMM_BYTE, NULL, gather_err) != 0) {
        free(all);
        comm_abort(d->comm, gather_err);
    }
    /* A failed rank reports its own message; the others the first failed rank's. */
    int out = rc != 0 ? COLT_ERR : COLT_OK;
    for (int r = 0; r < d->world && out == COLT_OK; r++)
        if (all[r].rc) {
            errorf(err, "rank %d: %s", r, all[r].message);
            out = COLT_ERR;
        }
    free(all);
    return out;
}

bool train_dist_any(TrainDist *d, bool flag) {
    if (d->world == 1) return flag;
    long long v = flag ? 1 : 0;
    char err[ERR_LEN];
    if (comm_all_reduce(d->comm, &v, 1, COMM_INT64, NULL, err) != 0) comm_abort(d->comm, err);
    return v != 0;
}

void train_dist_free(TrainDist *d) {
    if (d->comm) comm_close(d->comm);
    free(d->staging);
    memset(d, 0, sizeof *d);
}
