/* trainer_server.c — vllm_mode server, the trainer's side: reaching colt serve,
 * pushing the weights after each step over the weight channel, and
 * async_generation's round in flight (a thread that waits for the server's
 * answer). Not the server (src/serve) nor the channel (dist/weight_sync.c). */
#include "train/trainer_internal.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pthread.h>
#include "serve/colt_api.h"
#include "model/lora.h"
#include "core/error.h"
#include "core/log.h"

static void *pending_main(void *arg) {
    PendingRound *p = arg;
    double t0 = time_now();
    if (p->worker) /* tools: the conversations turn by turn, their calls in the round's own worker */
        p->rc = trainer_agent_generate_with(p->trainer, p->worker, p->client, NULL, &p->agent, p->seqs, p->n, &p->go, NULL,
                                            p->err);
    else
        p->rc = serve_client_generate(p->client, p->seqs, p->n, &p->go, p->vocab_size, NULL, p->err);
    p->seconds = time_now() - t0;
    return NULL;
}

/* environment_factory: the pending round's environments are reset at its
 * launch, on the main thread (trainer_per_sample_prompts gathers over the
 * ranks), in its own worker: the round being scored keeps its instances in
 * the other. Its rows go to p->agent; the trainer's own are put back. */
static int pending_environment_prompts(Trainer *t, PendingRound *p, int lo, int hi, char *err) {
    AgentShare kept = t->agent;
    ToolWorker *kept_worker = t->tool_worker;
    memset(&t->agent, 0, sizeof t->agent);
    t->tool_worker = p->worker;
    int rc = trainer_per_sample_prompts(t, &p->ro, lo, hi, err);
    p->agent = t->agent;
    t->agent = kept;
    t->tool_worker = kept_worker;
    return rc;
}

/* async_generation: asks the server for round t->round + 1 now (its prompts
 * are chosen now, in the order a synchronous run takes them). With tools the
 * round runs its conversations on the thread, with the worker the round now
 * being scored does not use; environments are reset before the thread starts. */
int trainer_pending_launch(Trainer *t, char *err) {
    PendingRound *p = &t->next;
    COLT_ASSERT(!p->active);
    rollout_free(&p->ro);
    trainer_agent_share_clear(&p->agent);
    p->epoch_before = t->epoch;
    p->epoch_pos_before = t->epoch_pos;
    p->trainer = t;
    p->worker = t->async_tool_worker;
    if (trainer_choose_prompts(t, &p->ro, err) != 0) return COLT_ERR;
    int lo, hi;
    trainer_local_range(t, t->cfg->generation_batch_size, &lo, &hi);
    if (t->cfg->environment_factory && pending_environment_prompts(t, p, lo, hi, err) != 0) return COLT_ERR;
    p->seqs = trainer_local_sequences(t, &p->ro, t->round + 1, lo, hi);
    p->n = hi - lo;
    p->go = trainer_generate_options(t);
    p->vocab_size = model_config(t->model)->vocab_size;
    p->client = t->server;
    p->weights_step = t->server_weights_step;
    p->rc = COLT_OK;
    p->joined = false;
    /* a worker killed on the thread is not restarted there: a process it forked would die with it */
    if (p->worker) tool_worker_allow_restart(p->worker, false);
    if (pthread_create(&p->thread, NULL, pending_main, p) != 0) {
        if (p->worker) tool_worker_allow_restart(p->worker, true);
        free(p->seqs);
        p->seqs = NULL;
        return errorf(err, "async_generation: cannot start the generation thread");
    }
    p->active = true;
    return COLT_OK;
}

/* Waits for the pending round's answer (bounded: the client's timeout). */
void trainer_pending_join(Trainer *t) {
    PendingRound *p = &t->next;
    if (!p->active || p->joined) return;
    pthread_join(p->thread, NULL);
    p->joined = true;
    if (p->worker) tool_worker_allow_restart(p->worker, true);
}

/* Drops the pending round (an error, the end of the run). */
void trainer_pending_discard(Trainer *t) {
    PendingRound *p = &t->next;
    trainer_pending_join(t);
    for (int j = 0; p->seqs && j < p->n; j++) gen_sequence_free(&p->seqs[j]);
    free(p->seqs);
    p->seqs = NULL;
    rollout_free(&p->ro);
    trainer_agent_share_clear(&p->agent);
    p->worker = NULL;
    p->active = false;
}

/* One replica's push, on a thread of its own. */
typedef struct ReplicaPush {
    WeightSync *sync;
    const Model *model;
    int rc;
    char err[ERR_LEN];
} ReplicaPush;

static void *push_main(void *arg) {
    ReplicaPush *p = arg;
    p->rc = weight_sync_send(p->sync, p->model, p->err);
    return NULL;
}

/* Rank 0's push over every replica's channel: each server is told first (it
 * then waits for the weights), then the channels send. Through the host
 * they send at once, a thread each (each its own buffers and connections);
 * NCCL channels share the trainer's compute stream, so their broadcasts
 * would run one after another anyway and go in turn on this thread.
 * *bytes: one replica's push; *seconds: the whole send. */
static int push_to_replicas(Trainer *t, size_t *bytes, double *seconds, char *err) {
    const int K = serve_client_replicas(t->server);
    *bytes = 0, *seconds = 0;
    for (int r = 0; r < K; r++) {
        ServeClient *replica = serve_client_replica(t->server, r);
        if (serve_client_post(replica, "/colt/update_weights", "{}", err) != 0)
            return error_prefix(err, "server mode: pushing the weights to %s", serve_client_url(replica));
    }
    double t0 = time_now();
    ReplicaPush *push = xcalloc((size_t)K, sizeof(ReplicaPush));
    pthread_t *threads = xcalloc((size_t)K, sizeof(pthread_t));
    bool *started = xcalloc((size_t)K, sizeof(bool));
    for (int r = 0; r < K; r++) {
        push[r] = (ReplicaPush){.sync = t->sync[r], .model = t->model};
        if (r > 0 && weight_sync_kind(t->sync[r]) != COMM_NCCL)
            started[r] = pthread_create(&threads[r], NULL, push_main, &push[r]) == 0;
    }
    for (int r = 0; r < K; r++) {
        if (started[r]) pthread_join(threads[r], NULL);
        else push_main(&push[r]); /* replica 0, an NCCL channel, or no thread to be had */
    }
    *seconds = time_now() - t0;
    int rc = COLT_OK;
    for (int r = 0; r < K && rc == 0; r++)
        if (push[r].rc != 0)
            rc = errorf(err, "server mode: pushing the weights to %s: %s",
                        serve_client_url(serve_client_replica(t->server, r)), push[r].err);
    if (rc == 0) weight_sync_last(t->sync[0], bytes, &(double){0});
    free(push), free(threads), free(started);
    return rc;
}

/* vllm_mode server: after every optimizer step (and once at the start, so
 * the server computes with exactly the trainer's weights: a resumed run's,
 * say) rank 0 announces a push and sends the whole weights over the
 * channel — with use_peft the adapters alone, after a first push that also
 * carries the frozen base (weight_sync.h); to every replica over its own
 * channel; every rank waits for it, so the
 * next round is generated with them. async_generation: the round in flight
 * is generated first (with the weights it was asked with), so a round never
 * mixes two versions. */
int trainer_push_weights(Trainer *t, char *err) {
    if (!t->server) return COLT_OK;
    double wait0 = time_now();
    trainer_pending_join(t);
    t->times.generation += time_now() - wait0; /* async: waiting for the round in flight is generation's time */
    double t0 = time_now();
    int rc = trainer_weights_gather(t, err); /* zero_stage 3: the whole weights (collective) */
    size_t bytes = 0;
    double seconds = 0;
    if (rc == 0 && t->sync) rc = push_to_replicas(t, &bytes, &seconds, err);
    trainer_weights_release(t);
    rc = train_dist_agree(&t->dist, rc, err);
    if (rc != 0) return COLT_ERR;
    t->server_weights_step = t->global_step;
    metrics_add(&t->metrics, "time/weight_sync", time_now() - t0);
    if (t->sync) {
        int K = serve_client_replicas(t->server);
        metrics_add(&t->metrics, "weight_sync/gb_per_s", seconds > 0 ? (double)bytes * K / seconds / 1e9 : 0.0);
        metrics_add(&t->metrics, "weight_sync/mb", bytes / 1e6);
    }
    return COLT_OK;
}

/* Rank 0: replica r's weight channel, at vllm_group_port + r on its host. */
static int open_channel(Trainer *t, int r, char *err) {
    TrainConfig *c = t->cfg;
    ServeClient *replica = serve_client_replica(t->server, r);
    char host[256];
    bool nccl = false;
    int group_size = 2, port = c->vllm_group_port + r;
    int rc = serve_client_host(replica, host, sizeof host, err);
    if (rc == 0) rc = trainer_choose_weight_channel(t, replica, host, &nccl, &group_size, err);
    /* with use_peft the server attaches adapters of this config; the pushes then carry them alone */
    char *body = colt_sync_init_json(port, c->vllm_server_timeout, nccl, model_lora_config(t->model));
    if (rc == 0) rc = serve_client_post(replica, "/colt/init_weight_sync", body, err);
    free(body);
    WeightSyncOptions o = {.host = host, .port = port, .rank = group_size - 1,
                           .world_size = group_size, .be = t->be,
                           .use_nccl = nccl, .cuda_device = t->be->device, .timeout_s = c->vllm_server_timeout,
                           .token = c->vllm_server_api_key};
    if (rc == 0) rc = weight_sync_open(&t->sync[r], &o, err);
    if (rc != 0 && r == 0) error_prefix(err, "server mode: the weight channel to %s (vllm_group_port %d)",
                                        serve_client_url(replica), port);
    else if (rc != 0) error_prefix(err, "server mode: the weight channel to %s (port %d: vllm_group_port + %d)",
                                   serve_client_url(replica), port, r);
    return rc;
}

/* vllm_mode server: every rank reaches the server (every replica; waiting
 * for them up to vllm_server_timeout), rank 0 opens a weight channel to each
 * and pushes the trainer's weights once. */
int trainer_server_connect(Trainer *t, char *err) {
    TrainConfig *c = t->cfg;
    char url[600] = ""; /* host and port; a list of replicas is used as it is (no bound on its length) */
    if (!c->vllm_server_base_url)
        snprintf(url, sizeof url, strchr(c->vllm_server_host, ':') ? "http://[%s]:%d" : "http://%s:%d",
                 c->vllm_server_host, c->vllm_server_port);
    int rc = serve_client_open(&t->server, c->vllm_server_base_url ? c->vllm_server_base_url : url,
                               c->vllm_server_api_key, c->vllm_server_timeout, err);
    rc = train_dist_agree(&t->dist, rc, err);
    if (rc != 0) return COLT_ERR;
    const int K = serve_client_replicas(t->server);
    if (t->dist.rank == 0) {
        t->sync = xcalloc((size_t)K, sizeof(WeightSync *));
        for (int r = 0; r < K && rc == 0; r++) rc = open_channel(t, r, err);
        char replicas[64] = "";
        if (K > 1) snprintf(replicas, sizeof replicas, " (%d data-parallel replicas)", K);
        if (rc == 0)
            log_info0("server mode: generation by colt serve at %s%s; weights pushed over %s after every step%s",
                      serve_client_url(t->server), replicas, comm_kind_name(weight_sync_kind(t->sync[0])),
                      c->async_generation ? "; async_generation: the next round generates while this one trains" : "");
    }
    rc = train_dist_agree(&t->dist, rc, err);
    if (rc == 0) rc = trainer_push_weights(t, err);
    if (rc == 0 && t->sync) {
        size_t bytes;
        double seconds;
        weight_sync_last(t->sync[0], &bytes, &seconds);
        if (model_has_lora(t->model))
            log_info0("server mode: the first push sent the base weights and the LoRA adapters (%.2f MB in %.2f s); "
                      "each step's push sends the adapters alone (%.2f MB)",
                      bytes / 1e6, seconds, model_lora_bytes(t->model) / 1e6);
    }
    json_decref(metrics_flush(&t->metrics)); /* the first push is not a step's */
    return rc;
}

/* Leaves the servers as they were: the channels closed (best effort: a
 * server closes its side anyway when a push times out). */
void trainer_server_disconnect(Trainer *t) {
    trainer_pending_discard(t);
    for (int r = 0; t->sync && r < serve_client_replicas(t->server); r++) {
        if (!t->sync[r]) continue;
        char err[ERR_LEN]; /* the server has closed its side already after a failed push: nothing to say */
        (void)serve_client_post(serve_client_replica(t->server, r), "/colt/close_weight_sync", "{}", err);
        weight_sync_close(t->sync[r]);
    }
    free(t->sync);
    t->sync = NULL;
    serve_client_close(t->server);
    t->server = NULL;
}
