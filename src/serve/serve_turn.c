/* serve_turn.c — see serve_turn.h. */
#include "serve/serve_turn.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/log.h"
#include "model/model.h"

/* What a turn holds: a sequence of records, each an op byte and its fields. */
enum { TURN_ADD = 1, TURN_ABORT, TURN_SYNC, TURN_STEP, TURN_STOP };

/* ---------------------------------------------------------------- recording (rank 0) */

static void put(ServeTurn *t, const void *p, size_t n) {
    if (t->len + n > t->cap) {
        t->cap = t->cap ? 2 * t->cap : 4096;
        while (t->cap < t->len + n) t->cap *= 2;
        t->data = xrealloc(t->data, t->cap);
    }
    if (n) memcpy(t->data + t->len, p, n);
    t->len += n;
}

static void put_op(ServeTurn *t, uint8_t op) { put(t, &op, 1); }

void serve_turn_add(ServeTurn *t, uint64_t id, const GenSequence *g, const GenerateOptions *opt) {
    put_op(t, TURN_ADD);
    put(t, &id, sizeof id);
    put(t, &g->stream, sizeof g->stream);
    put(t, &g->first_position, sizeof g->first_position);
    put(t, &g->prompt_len, sizeof g->prompt_len);
    put(t, opt, sizeof *opt); /* its stop_ids and logit_bias pointers are replaced on the other side */
    put(t, g->prompt, sizeof(int) * (size_t)g->prompt_len);
    put(t, opt->stop_ids, sizeof(int) * (size_t)opt->n_stop_ids);
    put(t, opt->logit_bias_ids, sizeof(int) * (size_t)opt->n_logit_bias);
    put(t, opt->logit_bias_values, sizeof(float) * (size_t)opt->n_logit_bias);
}

void serve_turn_abort(ServeTurn *t, uint64_t id) {
    put_op(t, TURN_ABORT);
    put(t, &id, sizeof id);
}

void serve_turn_sync(ServeTurn *t, const ServeSyncRequest *q) {
    put_op(t, TURN_SYNC);
    put(t, q, sizeof *q);
}

void serve_turn_step(ServeTurn *t) { put_op(t, TURN_STEP); }
void serve_turn_stop(ServeTurn *t) { put_op(t, TURN_STOP); }

int serve_turn_send(ServeTurn *t, Comm *tp, char *err) {
    int64_t len = (int64_t)t->len;
    int rc = comm_broadcast(tp, &len, 1, COMM_INT64, 0, NULL, err);
    if (rc == 0 && len > 0) rc = comm_broadcast(tp, t->data, t->len, COMM_BYTE, 0, NULL, err);
    t->len = 0;
    return rc;
}

void serve_turn_free(ServeTurn *t) {
    free(t->data);
    *t = (ServeTurn){0};
}

/* ---------------------------------------------------------------- shared */

int serve_engine_create(Engine **out, Model *m, const EngineOptions *eo, int max_len, int max_seqs, Comm *tp,
                        char *err) {
    *out = NULL;
    int rc = engine_create(out, m, eo, max_len, max_seqs, err);
    if (!tp) return rc;
    int n = comm_world_size(tp);
    EngineLoad load = {0};
    if (rc == 0) engine_load(*out, &load);
    int64_t mine = rc == 0 ? load.pool_blocks : -1, *all = xcalloc((size_t)n, sizeof(int64_t)), least = INT64_MAX;
    char cerr[ERR_LEN];
    if (comm_all_gather(tp, all, &mine, 1, COMM_INT64, NULL, cerr) != 0) {
        free(all);
        engine_destroy(*out);
        *out = NULL;
        return errorf(err, "%s", cerr);
    }
    int failed = 0;
    for (int r = 0; r < n; r++) {
        failed += all[r] < 0;
        if (all[r] >= 0 && all[r] < least) least = all[r];
    }
    free(all);
    if (rc != 0) return COLT_ERR; /* err says why */
    if (failed) {
        engine_destroy(*out);
        *out = NULL;
        return errorf(err, "%d rank%s of the tensor-parallel group could not create the engine (see %s message)",
                      failed, failed == 1 ? "" : "s", failed == 1 ? "its" : "their");
    }
    if (mine == least) return COLT_OK;
    /* a smaller pool than this rank could take: the one every rank can */
    engine_destroy(*out);
    EngineOptions smaller = *eo;
    smaller.max_pool_blocks = (int)least;
    rc = engine_create(out, m, &smaller, max_len, max_seqs, err);
    if (rc == 0) engine_load(*out, &load);
    if (rc == 0 && load.pool_blocks != least) {
        engine_destroy(*out);
        *out = NULL;
        rc = errorf(err, "the engine took a KV pool of %d blocks, not the group's %lld", load.pool_blocks,
                    (long long)least);
    }
    return rc;
}

WeightSyncOptions serve_sync_options(const Model *m, const ServeSyncRequest *q, int rank, int n_server_ranks,
                                     const atomic_bool *cancel) {
    const Backend *be = model_backend(m);
    return (WeightSyncOptions){.host = q->host, .port = q->port, .rank = rank, .world_size = n_server_ranks + 1,
                               .be = be, .use_nccl = q->use_nccl, .cuda_device = be->device, .timeout_s = q->timeout_s,
                               .bind_host = q->bind_host[0] ? q->bind_host : NULL,
                               .token = q->token[0] ? q->token : NULL, .cancel = cancel};
}

int serve_sync_run(WeightSync **sync, Model *m, const ServeSyncRequest *q, int rank, int n_server_ranks,
                   const atomic_bool *cancel, size_t *bytes, double *seconds, char *err) {
    int rc = COLT_OK;
    *bytes = 0;
    *seconds = 0;
    if (q->op == SERVE_SYNC_OPEN) {
        WeightSyncOptions o = serve_sync_options(m, q, rank, n_server_ranks, cancel);
        rc = weight_sync_open(sync, &o, err);
    } else if (q->op == SERVE_SYNC_RECV) {
        if (!*sync) rc = errorf(err, "update_weights: the weight channel is not open");
        else rc = weight_sync_recv(*sync, m, err);
        if (rc == 0) weight_sync_last(*sync, bytes, seconds);
    } else {
        weight_sync_close(*sync);
        *sync = NULL;
    }
    if (rc != 0) {
        weight_sync_close(*sync);
        *sync = NULL;
    }
    return rc;
}

/* ---------------------------------------------------------------- following (ranks > 0) */

/* A follower's copy of one live request: what the engine reads until it finishes or is aborted. */
typedef struct FollowSlot {
    GenSequence g;
    int *prompt;
    bool live;
} FollowSlot;

static void slot_release(FollowSlot *s) {
    gen_sequence_free(&s->g);
    free(s->prompt);
    *s = (FollowSlot){0};
}

typedef struct Reader {
    const char *p, *end;
} Reader;

static const void *take(Reader *r, size_t n) {
    COLT_ASSERT((size_t)(r->end - r->p) >= n); /* rank 0 wrote it with this build */
    const void *at = r->p;
    r->p += n;
    return at;
}

/* Receives one turn into *t (bounded by tp's timeout). */
static int turn_receive(ServeTurn *t, Comm *tp, char *err) {
    int64_t len = 0;
    t->len = 0;
    if (comm_broadcast(tp, &len, 1, COMM_INT64, 0, NULL, err) != 0) return COLT_ERR;
    if (len <= 0) return COLT_OK;
    if ((size_t)len > t->cap) {
        t->cap = (size_t)len;
        t->data = xrealloc(t->data, t->cap);
    }
    t->len = (size_t)len;
    return comm_broadcast(tp, t->data, t->len, COMM_BYTE, 0, NULL, err);
}

/* Replays one turn; *stop when it was the last. */
static int replay(Engine *e, Model *m, FollowSlot *slots, int n_slots, WeightSync **sync, Comm *tp,
                  const ServeTurn *t, bool *stop, char *err) {
    Reader r = {t->data, t->data + t->len};
    while (r.p < r.end) {
        uint8_t op = *(const uint8_t *)take(&r, 1);
        if (op == TURN_ADD) {
            uint64_t id, stream;
            int prompt_len, first_position;
            GenerateOptions opt;
            memcpy(&id, take(&r, sizeof id), sizeof id);
            memcpy(&stream, take(&r, sizeof stream), sizeof stream);
            memcpy(&first_position, take(&r, sizeof first_position), sizeof first_position);
            memcpy(&prompt_len, take(&r, sizeof prompt_len), sizeof prompt_len);
            memcpy(&opt, take(&r, sizeof opt), sizeof opt);
            COLT_ASSERT(id < (uint64_t)n_slots && !slots[id].live && prompt_len > 0 && opt.n_stop_ids >= 0 &&
                        opt.n_logit_bias >= 0 && opt.n_logit_bias <= MAX_LOGIT_BIAS);
            FollowSlot *s = &slots[id];
            s->prompt = xmalloc(sizeof(int) * (size_t)prompt_len);
            memcpy(s->prompt, take(&r, sizeof(int) * (size_t)prompt_len), sizeof(int) * (size_t)prompt_len);
            int *stop_ids = xmalloc(sizeof(int) * (size_t)(opt.n_stop_ids > 0 ? opt.n_stop_ids : 1));
            memcpy(stop_ids, take(&r, sizeof(int) * (size_t)opt.n_stop_ids), sizeof(int) * (size_t)opt.n_stop_ids);
            opt.stop_ids = stop_ids;
            size_t bias_bytes = sizeof(int) * (size_t)opt.n_logit_bias; /* ids and values: 4 bytes each */
            int *bias_ids = xmalloc(bias_bytes + 4), *bias_values = xmalloc(bias_bytes + 4);
            memcpy(bias_ids, take(&r, bias_bytes), bias_bytes);
            memcpy(bias_values, take(&r, bias_bytes), bias_bytes);
            opt.logit_bias_ids = bias_ids;
            opt.logit_bias_values = (const float *)bias_values;
            s->g = (GenSequence){.prompt = s->prompt, .prompt_len = prompt_len, .stream = stream,
                                 .first_position = first_position};
            int rc = engine_add_request(e, &s->g, &opt, id, err); /* copies the stop ids and the bias */
            free(stop_ids), free(bias_ids), free(bias_values);
            if (rc != 0) {
                slot_release(s);
                return error_prefix(err, "out of step with rank 0 (it added this request)");
            }
            s->live = true;
        } else if (op == TURN_ABORT) {
            uint64_t id;
            memcpy(&id, take(&r, sizeof id), sizeof id);
            COLT_ASSERT(id < (uint64_t)n_slots && slots[id].live);
            if (engine_abort(e, id) != 0)
                return errorf(err, "out of step with rank 0: it aborted request %llu, unknown here",
                              (unsigned long long)id);
            slot_release(&slots[id]);
        } else if (op == TURN_SYNC) {
            ServeSyncRequest q;
            memcpy(&q, take(&r, sizeof q), sizeof q);
            size_t bytes;
            double seconds;
            char serr[ERR_LEN];
            /* as on rank 0: a failure closes the channel, serving goes on */
            if (serve_sync_run(sync, m, &q, comm_rank(tp), comm_world_size(tp), NULL, &bytes, &seconds, serr) != 0)
                log_error("colt serve: weight channel: %s; the channel is closed", serr);
        } else if (op == TURN_STEP) {
            if (!engine_has_work(e)) return errorf(err, "out of step with rank 0: it stepped an engine with work");
            const EngineEvent *ev;
            int n_events;
            if (engine_step(e, &ev, &n_events, err) != 0) return error_prefix(err, "the engine failed");
            for (int k = 0; k < n_events; k++)
                if (ev[k].finished) slot_release(&slots[ev[k].id]);
        } else if (op == TURN_STOP) {
            *stop = true;
            return COLT_OK;
        } else {
            COLT_ASSERT(!"unknown turn record");
        }
    }
    return COLT_OK;
}

int serve_follow(Model *m, const ServeLoopOptions *o, Comm *tp, char *err) {
    Engine *e = NULL;
    if (serve_engine_create(&e, m, &o->engine, o->max_model_len, o->max_queued_sequences, tp, err) != 0)
        return COLT_ERR;
    int n_slots = o->max_queued_sequences;
    FollowSlot *slots = xcalloc((size_t)n_slots, sizeof(FollowSlot));
    WeightSync *sync = NULL;
    ServeTurn t = {0};
    bool stop = false;
    int rc = COLT_OK;
    while (!stop && rc == 0) {
        rc = turn_receive(&t, tp, err);
        if (rc != 0) error_prefix(err, "waiting for rank 0 (the HTTP server): is it gone?");
        else rc = replay(e, m, slots, n_slots, &sync, tp, &t, &stop, err);
    }
    serve_turn_free(&t);
    weight_sync_close(sync);
    engine_destroy(e);
    for (int k = 0; k < n_slots; k++) slot_release(&slots[k]);
    free(slots);
    return rc;
}
