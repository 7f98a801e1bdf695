/* serve_loop.c — see serve_loop.h.
 *
 * Locks: the loop's mutex guards what HTTP threads hand over (incoming
 * requests, the drain and stop flags, counters); each request's mutex guards
 * what the loop publishes to its waiter (progress, failure, cancel flags).
 * The loop never holds both at once. A choice's tokens are written by the
 * engine without a lock; the waiter reads only the first n_ready, which the
 * loop sets under the request's mutex after the engine wrote them.
 *
 * The weight channel's OPEN waits for a trainer that may never come (or
 * comes late): on one process that wait (weight_sync_meet: the store alone,
 * no device, no model) runs on a thread of its own (the opener) while the
 * engine thread goes on generating; the engine thread then opens the
 * communicator itself. Operations queued behind the OPEN wait for it.
 * serve_loop_stop cancels the wait. */
#include "serve/serve_loop.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/error.h"
#include "core/log.h"
#include "parallel/weight_sync.h"
#include "serve/serve_turn.h"

#define IDLE_WAIT_S 0.1 /* the loop's longest sleep with nothing to do */
#define RATE_WINDOW_S 10
#define SYNC_QUEUE 8 /* weight-channel operations waiting for the engine thread */
#define SCORE_CHUNK 64 /* positions per scoring forward call */
#define MAX_SCORE_K 20

typedef struct ServeChoice {
    GenSequence seq;
    int max_new_tokens; /* its budget: the request's, or its own (serve_request_set_turns) */
    int n_ready;
    bool done;
    FinishReason finish;
    bool cancel;    /* the waiter gave it up */
    bool scored;    /* scores ready (under the request's mutex) */
    TokenScores scores;
    bool in_engine; /* loop-private from here */
    bool to_score;  /* left the engine, scores wanted, not computed yet */
    int slot;       /* its engine id while in the engine */
} ServeChoice;

struct ServeRequest {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;
    int **prompts, *prompt_lens, n_prompts, n;
    GenerateOptions opt;
    int *stop;
    int *bias_ids;     /* opt's logit bias, copied */
    float *bias_values;
    ServeChoice *choices;
    int n_choices;
    uint64_t version; /* bumped at every change a waiter may see */
    bool failed;
    char error[ERR_LEN];
    bool cancel_pending;
    double t_submit, t_first;
    int score_k;   /* alternatives per scored position; -1: no scores (serve_request_want_scores) */
    bool wake_at_end; /* the waiter reads nothing before a choice ends (serve_request_wake_at_end) */
    int in_engine; /* loop-private: choices still in the engine */
    uint64_t woken_turn; /* loop-private: the last turn that listed it for the waker */
};

typedef struct Slot {
    ServeRequest *r;
    int choice;
} Slot;

struct ServeLoop {
    Model *m;
    ServeLoopOptions o;
    Engine *engine;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* under mu */
    ServeRequest **incoming;
    int n_incoming, incoming_cap;
    bool started, stop, draining, failed, wake, abort_all;
    int start_rc;
    char start_err[ERR_LEN], fail_msg[ERR_LEN];
    int outstanding;
    int64_t requests_submitted, requests_finished, sequences_finished;
    EngineLoad load;
    EngineStats engine_stats;
    int64_t rate_tokens[RATE_WINDOW_S + 1];
    int64_t rate_second[RATE_WINDOW_S + 1];
    ServeSyncRequest sync_queue[SYNC_QUEUE];
    int n_sync;
    bool sync_open; /* open, or its OPEN queued: what the next operation is checked against */
    int64_t weight_updates, weight_sync_failures;
    double last_update_seconds, last_update_bytes;
    double idle_seconds, loop_seconds; /* the engine thread's time waiting for work, and between steps */
    double idle_since; /* when its current wait for work began (0: not waiting), for serve_loop_stats */
    atomic_bool cancel_sync; /* stopping: a wait for the trainer ends now */
    /* the opener (loop-private, but for opener_done and what the opener fills before setting it) */
    pthread_t opener;
    bool opening;
    atomic_bool opener_done;
    ServeSyncRequest open_q;
    Store *met; /* the group met at its store: the engine thread opens the channel on it */
    int open_rc;
    char open_err[ERR_LEN];
    /* The waker: wakes the waiters of a step's requests off the engine thread (a wake-up costs a system
     * call, and a step of 256 streams would spend ~1 ms on them between steps). Under waker_mu. */
    pthread_t waker;
    pthread_mutex_t waker_mu;
    pthread_cond_t waker_cv;
    ServeRequest **to_wake; /* each holds a reference the waker releases */
    int n_to_wake, to_wake_cap;
    bool waker_stop;
    /* loop-private */
    uint64_t n_turns;          /* the loop's publishing turns so far */
    ServeRequest **step_wake;  /* this turn's requests to wake, a reference each */
    int n_step_wake, step_wake_cap;
    WeightSync *sync;
    ServeTurn turn; /* tensor parallel: this turn's engine calls, for the other ranks (serve_turn.h) */
    ServeRequest **active;
    int n_active, active_cap;
    Slot *slots;
    int *free_slots, n_free_slots;
    ModelState *score_state; /* the scoring forward's cache and scratch, made at the first scored request */
    int score_len;           /* the longest sequence it holds */
    float *score_logits;     /* [SCORE_CHUNK, V] */
};

static void deadline_after(struct timespec *ts, double seconds) {
    clock_gettime(CLOCK_MONOTONIC, ts);
    double s = (double)ts->tv_sec + 1e-9 * (double)ts->tv_nsec + seconds;
    ts->tv_sec = (time_t)s;
    ts->tv_nsec = (long)((s - (double)ts->tv_sec) * 1e9);
}

static void cond_init_monotonic(pthread_cond_t *cv) {
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &a);
    pthread_condattr_destroy(&a);
}

/* ---------------------------------------------------------------- requests */

ServeRequest *serve_request_create(int **prompts, const int *prompt_lens, int n_prompts, int n,
                                   const GenerateOptions *opt) {
    ServeRequest *r = xcalloc(1, sizeof *r);
    pthread_mutex_init(&r->mu, NULL);
    cond_init_monotonic(&r->cv);
    r->refs = 1;
    r->prompts = prompts;
    r->prompt_lens = xmalloc(sizeof(int) * (size_t)n_prompts);
    memcpy(r->prompt_lens, prompt_lens, sizeof(int) * (size_t)n_prompts);
    r->n_prompts = n_prompts;
    r->n = n;
    r->opt = *opt;
    r->stop = xmalloc(sizeof(int) * (size_t)(opt->n_stop_ids > 0 ? opt->n_stop_ids : 1));
    if (opt->n_stop_ids > 0) memcpy(r->stop, opt->stop_ids, sizeof(int) * (size_t)opt->n_stop_ids);
    r->opt.stop_ids = r->stop;
    int n_bias = opt->n_logit_bias > 0 ? opt->n_logit_bias : 0;
    r->bias_ids = xmalloc(sizeof(int) * (size_t)(n_bias + 1));
    r->bias_values = xmalloc(sizeof(float) * (size_t)(n_bias + 1));
    if (n_bias > 0) {
        memcpy(r->bias_ids, opt->logit_bias_ids, sizeof(int) * (size_t)n_bias);
        memcpy(r->bias_values, opt->logit_bias_values, sizeof(float) * (size_t)n_bias);
    }
    r->opt.logit_bias_ids = r->bias_ids;
    r->opt.logit_bias_values = r->bias_values;
    r->n_choices = n_prompts * n;
    r->score_k = -1;
    r->choices = xcalloc((size_t)r->n_choices, sizeof(ServeChoice));
    for (int i = 0; i < r->n_choices; i++) {
        ServeChoice *c = &r->choices[i];
        c->seq = (GenSequence){.prompt = prompts[i / n], .prompt_len = prompt_lens[i / n], .stream = (uint64_t)i};
        c->max_new_tokens = opt->max_new_tokens;
        c->slot = -1;
    }
    return r;
}

void serve_request_release(ServeRequest *r) {
    if (!r) return;
    pthread_mutex_lock(&r->mu);
    int left = --r->refs;
    pthread_mutex_unlock(&r->mu);
    if (left > 0) return;
    for (int i = 0; i < r->n_choices; i++) {
        gen_sequence_free(&r->choices[i].seq);
        TokenScores *ts = &r->choices[i].scores;
        free(ts->logprob), free(ts->top_ids), free(ts->top_logprobs);
    }
    for (int i = 0; i < r->n_prompts; i++) free(r->prompts[i]);
    free(r->prompts), free(r->prompt_lens), free(r->stop), free(r->choices), free(r->bias_ids), free(r->bias_values);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r);
}

void serve_request_set_streams(ServeRequest *r, const uint64_t *streams) {
    for (int i = 0; i < r->n_choices; i++) r->choices[i].seq.stream = streams[i];
}

void serve_request_set_turns(ServeRequest *r, const int *first_positions, const int *max_new_tokens) {
    for (int i = 0; i < r->n_choices; i++) {
        if (first_positions) r->choices[i].seq.first_position = first_positions[i];
        if (max_new_tokens) r->choices[i].max_new_tokens = max_new_tokens[i];
    }
}

void serve_request_wake_at_end(ServeRequest *r) { r->wake_at_end = true; }

void serve_request_want_scores(ServeRequest *r, int k) {
    COLT_ASSERT(k >= 0 && k <= MAX_SCORE_K);
    r->score_k = k;
}

const TokenScores *serve_request_scores(const ServeRequest *r, int choice) {
    return r->score_k >= 0 ? &r->choices[choice].scores : NULL;
}

int serve_request_choices(const ServeRequest *r) { return r->n_choices; }
const GenSequence *serve_request_sequence(const ServeRequest *r, int choice) { return &r->choices[choice].seq; }

int serve_request_wait(ServeRequest *r, ChoiceProgress *out, uint64_t *seen, double timeout_s, char *err) {
    struct timespec deadline;
    deadline_after(&deadline, timeout_s);
    pthread_mutex_lock(&r->mu);
    while (r->version == *seen && !r->failed)
        if (pthread_cond_timedwait(&r->cv, &r->mu, &deadline) == ETIMEDOUT) break;
    int rc = r->version != *seen ? 1 : 0;
    if (r->failed) {
        errorf(err, "%s", r->error);
        rc = -1;
    }
    for (int i = 0; i < r->n_choices; i++)
        out[i] = (ChoiceProgress){.n_ready = r->choices[i].n_ready, .done = r->choices[i].done,
                                  .scored = r->choices[i].scored, .finish = r->choices[i].finish};
    *seen = r->version;
    pthread_mutex_unlock(&r->mu);
    return rc;
}

void serve_request_cancel(ServeLoop *l, ServeRequest *r, int choice) {
    pthread_mutex_lock(&r->mu);
    for (int i = 0; i < r->n_choices; i++) {
        if (choice >= 0 && i != choice) continue;
        ServeChoice *c = &r->choices[i];
        if (c->done || c->cancel) continue;
        c->cancel = c->done = true;
        r->cancel_pending = true;
    }
    r->version++;
    pthread_mutex_unlock(&r->mu);
    pthread_mutex_lock(&l->mu);
    l->wake = true;
    pthread_cond_signal(&l->cv);
    pthread_mutex_unlock(&l->mu);
}

double serve_request_first_token_seconds(ServeRequest *r) {
    pthread_mutex_lock(&r->mu);
    double s = r->t_first > 0 ? r->t_first - r->t_submit : 0.0;
    pthread_mutex_unlock(&r->mu);
    return s;
}

static void request_fail(ServeRequest *r, const char *msg) {
    pthread_mutex_lock(&r->mu);
    if (!r->failed) {
        r->failed = true;
        snprintf(r->error, sizeof r->error, "%s", msg);
    }
    r->version++;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

/* ---------------------------------------------------------------- the loop's side */

int serve_loop_submit(ServeLoop *l, ServeRequest *r, int *http_status, char *err) {
    pthread_mutex_lock(&l->mu);
    int rc = COLT_OK;
    if (l->failed) {
        *http_status = 500;
        rc = errorf(err, "the engine failed: %s", l->fail_msg);
    } else if (l->draining || l->stop) {
        *http_status = 503;
        rc = errorf(err, "the server is shutting down");
    } else if (l->outstanding + r->n_choices > l->o.max_queued_sequences) {
        *http_status = 503;
        rc = errorf(err, "the server is busy: %d sequences in flight, this request adds %d (limit %d); retry later",
                    l->outstanding, r->n_choices, l->o.max_queued_sequences);
    } else {
        if (l->n_incoming == l->incoming_cap) {
            l->incoming_cap = l->incoming_cap ? 2 * l->incoming_cap : 64;
            l->incoming = xrealloc(l->incoming, sizeof(ServeRequest *) * (size_t)l->incoming_cap);
        }
        pthread_mutex_lock(&r->mu);
        r->refs++; /* the loop's */
        r->t_submit = time_now();
        pthread_mutex_unlock(&r->mu);
        l->incoming[l->n_incoming++] = r;
        l->outstanding += r->n_choices;
        l->requests_submitted++;
        l->wake = true;
        pthread_cond_signal(&l->cv);
    }
    pthread_mutex_unlock(&l->mu);
    return rc;
}

void serve_loop_drain(ServeLoop *l) {
    pthread_mutex_lock(&l->mu);
    l->draining = true;
    pthread_mutex_unlock(&l->mu);
}

void serve_loop_abort_all(ServeLoop *l) {
    pthread_mutex_lock(&l->mu);
    l->draining = l->abort_all = l->wake = true;
    pthread_cond_signal(&l->cv);
    pthread_mutex_unlock(&l->mu);
}

int serve_loop_outstanding(ServeLoop *l) {
    pthread_mutex_lock(&l->mu);
    int n = l->outstanding;
    pthread_mutex_unlock(&l->mu);
    return n;
}

bool serve_loop_healthy(ServeLoop *l) {
    pthread_mutex_lock(&l->mu);
    bool ok = !l->failed && !l->draining && !l->stop;
    pthread_mutex_unlock(&l->mu);
    return ok;
}

void serve_loop_stats(ServeLoop *l, ServeLoopStats *out) {
    pthread_mutex_lock(&l->mu);
    *out = (ServeLoopStats){.load = l->load, .engine = l->engine_stats, .requests_submitted = l->requests_submitted,
                            .requests_finished = l->requests_finished, .sequences_finished = l->sequences_finished,
                            .outstanding = l->outstanding, .failed = l->failed, .draining = l->draining};
    int64_t now = (int64_t)time_now(), tokens = 0;
    for (int k = 0; k <= RATE_WINDOW_S; k++) /* the last RATE_WINDOW_S whole seconds */
        if (l->rate_second[k] < now && l->rate_second[k] >= now - RATE_WINDOW_S) tokens += l->rate_tokens[k];
    out->tokens_per_second = (double)tokens / RATE_WINDOW_S;
    out->sync_open = l->sync_open;
    out->weight_updates = l->weight_updates;
    out->weight_sync_failures = l->weight_sync_failures;
    out->last_update_seconds = l->last_update_seconds;
    out->last_update_bytes = l->last_update_bytes;
    out->idle_seconds = l->idle_seconds + (l->idle_since > 0 ? time_now() - l->idle_since : 0); /* a wait going on */
    out->loop_seconds = l->loop_seconds;
    out->device = model_backend(l->m)->name;
    out->deterministic = l->o.engine.deterministic;
    out->tensor_parallel_size = l->o.tp ? comm_world_size(l->o.tp) : 1;
    pthread_mutex_unlock(&l->mu);
}

int serve_loop_weight_sync(ServeLoop *l, const ServeSyncRequest *q, int *http_status, char *err) {
    static const char *const names[] = {"init_weight_sync", "update_weights", "close_weight_sync"};
    *http_status = 400; /* the trainer's adapters must fit this model (reads its config only) */
    if (q->op == SERVE_SYNC_OPEN && q->has_lora && l->o.tp)
        return errorf(err, "init_weight_sync: this colt serve is tensor parallel (%d processes) and cannot take a "
                           "use_peft trainer's LoRA adapters yet; serve it with --tensor_parallel_size 1",
                      comm_world_size(l->o.tp));
    if (q->op == SERVE_SYNC_OPEN && q->has_lora && model_lora_check(l->m, &q->lora, "init_weight_sync", err) != 0)
        return COLT_ERR;
    pthread_mutex_lock(&l->mu);
    int rc = COLT_OK;
    *http_status = 200;
    if (l->failed || l->stop) {
        *http_status = 503;
        rc = errorf(err, "%s: the server is not serving (%s)", names[q->op],
                    l->failed ? "the engine failed" : "shutting down");
    } else if (q->op == SERVE_SYNC_OPEN && l->sync_open) {
        *http_status = 409;
        rc = errorf(err, "init_weight_sync: the weight channel is already open (close_weight_sync first)");
    } else if (q->op != SERVE_SYNC_OPEN && !l->sync_open) {
        *http_status = 409;
        rc = errorf(err, "%s: the weight channel is not open (init_weight_sync first, or it failed: see the "
                         "server's log)", names[q->op]);
    } else if (l->n_sync == SYNC_QUEUE) {
        *http_status = 503;
        rc = errorf(err, "%s: %d weight-channel operations are already waiting", names[q->op], SYNC_QUEUE);
    } else {
        l->sync_queue[l->n_sync++] = *q;
        l->sync_open = q->op != SERVE_SYNC_CLOSE;
        l->wake = true;
        pthread_cond_signal(&l->cv);
    }
    pthread_mutex_unlock(&l->mu);
    return rc;
}
/* ---------------------------------------------------------------- the thread */

/* Adds r's choices to the engine; *left counts those that never will be (an error fails r). */
static void add_to_engine(ServeLoop *l, ServeRequest *r, int *left) {
    char err[ERR_LEN];
    if (l->n_active == l->active_cap) {
        l->active_cap = l->active_cap ? 2 * l->active_cap : 64;
        l->active = xrealloc(l->active, sizeof(ServeRequest *) * (size_t)l->active_cap);
    }
    l->active[l->n_active++] = r;
    for (int i = 0; i < r->n_choices; i++) {
        ServeChoice *c = &r->choices[i];
        COLT_ASSERT(l->n_free_slots > 0); /* outstanding <= max_queued_sequences = slots */
        int slot = l->free_slots[--l->n_free_slots];
        GenerateOptions opt = r->opt;
        opt.max_new_tokens = c->max_new_tokens;
        if (engine_add_request(l->engine, &c->seq, &opt, (uint64_t)slot, err) != 0) {
            l->free_slots[l->n_free_slots++] = slot;
            request_fail(r, err); /* the choices already added are aborted with it (apply_cancels) */
            *left += r->n_choices - i;
            return;
        }
        if (l->o.tp) serve_turn_add(&l->turn, (uint64_t)slot, &c->seq, &opt);
        l->slots[slot] = (Slot){r, i};
        c->slot = slot;
        c->in_engine = true;
        r->in_engine++;
    }
}

/* Takes choice c of r out of the engine (aborted, or finished by it). */
static void leave_engine(ServeLoop *l, ServeRequest *r, ServeChoice *c, int *left) {
    l->free_slots[l->n_free_slots++] = c->slot;
    c->slot = -1;
    c->in_engine = false;
    c->to_score = r->score_k >= 0 && !r->failed;
    r->in_engine--;
    (*left)++;
}

/* Aborts the choices their waiters gave up, and every choice of a failed request. */
static void apply_cancels(ServeLoop *l, int *left) {
    for (int a = 0; a < l->n_active; a++) {
        ServeRequest *r = l->active[a];
        pthread_mutex_lock(&r->mu);
        if (r->cancel_pending || r->failed) {
            for (int i = 0; i < r->n_choices; i++) {
                ServeChoice *c = &r->choices[i];
                if (!c->in_engine || !(c->cancel || r->failed)) continue;
                COLT_ASSERT(engine_abort(l->engine, (uint64_t)c->slot) == 0);
                if (l->o.tp) serve_turn_abort(&l->turn, (uint64_t)c->slot);
                leave_engine(l, r, c, left);
            }
            r->cancel_pending = false;
        }
        pthread_mutex_unlock(&r->mu);
    }
}

static void *waker_main(void *arg) {
    ServeLoop *l = arg;
    ServeRequest **batch = NULL;
    int batch_cap = 0;
    pthread_mutex_lock(&l->waker_mu);
    for (;;) {
        while (l->n_to_wake == 0 && !l->waker_stop) pthread_cond_wait(&l->waker_cv, &l->waker_mu);
        if (l->n_to_wake == 0) break; /* stopped, nothing left */
        ServeRequest **taken = l->to_wake; /* swap: the engine thread fills the other array meanwhile */
        int n = l->n_to_wake, cap = l->to_wake_cap;
        l->to_wake = batch, l->to_wake_cap = batch_cap, l->n_to_wake = 0;
        batch = taken, batch_cap = cap;
        pthread_mutex_unlock(&l->waker_mu);
        for (int i = 0; i < n; i++) { /* what changed was written under the request's mutex before */
            pthread_cond_broadcast(&batch[i]->cv);
            serve_request_release(batch[i]);
        }
        pthread_mutex_lock(&l->waker_mu);
    }
    pthread_mutex_unlock(&l->waker_mu);
    free(batch);
    return NULL;
}

/* The turn's requests to the waker. */
static void hand_to_waker(ServeLoop *l) {
    if (l->n_step_wake == 0) return;
    pthread_mutex_lock(&l->waker_mu);
    if (l->n_to_wake + l->n_step_wake > l->to_wake_cap) {
        l->to_wake_cap = 2 * (l->n_to_wake + l->n_step_wake);
        l->to_wake = xrealloc(l->to_wake, sizeof(ServeRequest *) * (size_t)l->to_wake_cap);
    }
    memcpy(l->to_wake + l->n_to_wake, l->step_wake, sizeof(ServeRequest *) * (size_t)l->n_step_wake);
    l->n_to_wake += l->n_step_wake;
    pthread_cond_signal(&l->waker_cv);
    pthread_mutex_unlock(&l->waker_mu);
    l->n_step_wake = 0;
}

/* Hands each event to its request; the waker wakes its waiter. */
static void publish(ServeLoop *l, const EngineEvent *ev, int n_events, int *left) {
    double now = time_now();
    for (int k = 0; k < n_events; k++) {
        Slot *s = &l->slots[ev[k].id];
        ServeRequest *r = s->r;
        ServeChoice *c = &r->choices[s->choice];
        pthread_mutex_lock(&r->mu);
        if (!c->cancel) {
            c->n_ready = c->seq.n_tokens;
            if (ev[k].token >= 0 && r->t_first == 0) r->t_first = now;
            if (ev[k].finished) {
                c->done = true;
                c->finish = c->seq.finish;
            }
        }
        if (ev[k].finished) leave_engine(l, r, c, left);
        r->version++;
        if ((!r->wake_at_end || ev[k].finished) && r->woken_turn != l->n_turns) { /* once a turn */
            r->woken_turn = l->n_turns;
            r->refs++; /* the waker's */
            if (l->n_step_wake == l->step_wake_cap) {
                l->step_wake_cap = l->step_wake_cap ? 2 * l->step_wake_cap : 256;
                l->step_wake = xrealloc(l->step_wake, sizeof(ServeRequest *) * (size_t)l->step_wake_cap);
            }
            l->step_wake[l->n_step_wake++] = r;
        }
        pthread_mutex_unlock(&r->mu);
    }
    hand_to_waker(l);
    l->n_turns++;
}

/* ts for ids[n] (TokenScores in serve_loop.h): the model's forward over the
 * ids in chunks, each row's log-softmax in double (cmd_score's), its k best
 * by insertion (k <= 20). On the engine thread, between engine steps. */
static int score_ids(ServeLoop *l, const int *ids, int n, int k, TokenScores *ts, char *err) {
    const int V = model_config(l->m)->vocab_size;
    if (!l->score_state || l->score_len < n) {
        /* sized to the longest sequence scored so far (a power of two from 256), not to max_model_len: the
         * engine's pool took the device memory, and scored prompts are usually far shorter */
        int len = 256;
        while (len < n) len *= 2;
        if (len > l->o.max_model_len) len = l->o.max_model_len;
        model_state_free(l->score_state);
        l->score_state = NULL;
        l->score_len = 0;
        if (model_state_create(&l->score_state, l->m, 1, len, SCORE_CHUNK, err) != 0)
            return error_prefix(err, "scoring the tokens");
        l->score_len = len;
        if (!l->score_logits) l->score_logits = xmalloc(sizeof(float) * SCORE_CHUNK * (size_t)V);
    }
    ts->n = n, ts->k = k;
    ts->logprob = xmalloc(sizeof(float) * (size_t)n);
    ts->top_ids = xmalloc(sizeof(int) * (size_t)n * (size_t)(k > 0 ? k : 1));
    ts->top_logprobs = xmalloc(sizeof(float) * (size_t)n * (size_t)(k > 0 ? k : 1));
    ts->logprob[0] = NAN;
    int slot[SCORE_CHUNK], pos[SCORE_CHUNK];
    for (int start = 0; start < n - 1; start += SCORE_CHUNK) {
        int len = n - 1 - start < SCORE_CHUNK ? n - 1 - start : SCORE_CHUNK;
        for (int j = 0; j < len; j++) slot[j] = 0, pos[j] = start + j;
        if (model_forward(l->m, l->score_state, ids + start, slot, pos, len, NULL, l->score_logits, err) != 0)
            return error_prefix(err, "scoring the tokens");
        for (int j = 0; j < len; j++) {
            const float *row = l->score_logits + (size_t)j * V;
            int t = start + j + 1; /* the position this row predicts */
            double max = row[0], sum = 0.0;
            for (int v = 1; v < V; v++) max = row[v] > max ? row[v] : max;
            for (int v = 0; v < V; v++) sum += exp((double)row[v] - max);
            double norm = max + log(sum);
            ts->logprob[t] = (float)((double)row[ids[t]] - norm);
            int *best = ts->top_ids + (size_t)t * k;
            int have = 0;
            for (int v = 0; k > 0 && v < V; v++) { /* keep the k largest, larger first, lower id first on ties */
                if (have == k && !(row[v] > row[best[k - 1]])) continue;
                int at = have < k ? have++ : k - 1;
                while (at > 0 && row[v] > row[best[at - 1]]) best[at] = best[at - 1], at--;
                best[at] = v;
            }
            for (int q = 0; q < k; q++) ts->top_logprobs[(size_t)t * k + q] = (float)((double)row[best[q]] - norm);
        }
    }
    return COLT_OK;
}

/* Scores the choices that left the engine this turn (serve_request_want_scores). */
static void score_left(ServeLoop *l) {
    char err[ERR_LEN];
    for (int a = 0; a < l->n_active; a++) {
        ServeRequest *r = l->active[a];
        for (int i = 0; i < r->n_choices; i++) {
            ServeChoice *c = &r->choices[i];
            if (!c->to_score) continue;
            c->to_score = false;
            int n = c->seq.prompt_len + c->seq.n_tokens;
            int *ids = xmalloc(sizeof(int) * (size_t)n);
            memcpy(ids, c->seq.prompt, sizeof(int) * (size_t)c->seq.prompt_len);
            if (c->seq.n_tokens > 0) memcpy(ids + c->seq.prompt_len, c->seq.tokens, sizeof(int) * (size_t)c->seq.n_tokens);
            TokenScores ts = {0};
            int rc = score_ids(l, ids, n, r->score_k, &ts, err);
            free(ids);
            if (rc != 0) {
                free(ts.logprob), free(ts.top_ids), free(ts.top_logprobs);
                request_fail(r, err);
                for (int j = i + 1; j < r->n_choices; j++) r->choices[j].to_score = false;
                break;
            }
            pthread_mutex_lock(&r->mu);
            c->scores = ts;
            c->scored = true;
            r->version++;
            pthread_cond_broadcast(&r->cv);
            pthread_mutex_unlock(&r->mu);
        }
    }
}

/* Drops the requests with nothing left in the engine (the loop's reference). */
static void drop_finished(ServeLoop *l, int64_t *requests_done) {
    int w = 0;
    for (int a = 0; a < l->n_active; a++) {
        ServeRequest *r = l->active[a];
        if (r->in_engine > 0) {
            l->active[w++] = r;
            continue;
        }
        (*requests_done)++;
        serve_request_release(r);
    }
    l->n_active = w;
}

/* Every request in flight fails with msg; the engine forgets them. */
static void fail_all(ServeLoop *l, const char *msg, int *left) {
    for (int a = 0; a < l->n_active; a++) request_fail(l->active[a], msg);
    apply_cancels(l, left);
}

/* The model's adapters made the trainer's (OPEN): its LoRA config attached
 * (values come with the first push), adapters of another config replaced,
 * none when the trainer has none. The weights version moves with each
 * change, so the engine drops its prefix cache and resizes its scratch. */
static int match_adapters(Model *m, const ServeSyncRequest *q, char *err) {
    const LoraConfig *have = model_lora_config(m);
    if (have && q->has_lora && lora_config_same(have, &q->lora)) return COLT_OK;
    if (have) {
        log_info0("colt serve: weight channel: LoRA adapters (r %d) taken off%s", have->r,
                  q->has_lora ? ", to attach the trainer's" : ": the trainer trains every weight");
        model_lora_detach(m);
    }
    if (!q->has_lora) return COLT_OK;
    if (model_lora_attach(m, &q->lora, 0, err) != 0) return error_prefix(err, "init_weight_sync");
    log_info0("colt serve: weight channel: LoRA adapters attached (r %d, lora_alpha %g%s); each push carries the "
              "adapters alone after the first", q->lora.r, (double)q->lora.alpha, q->lora.use_rslora ? ", rsLoRA" : "");
    return COLT_OK;
}

/* Tensor parallel: this turn to the other ranks. A failure (a rank gone)
 * ends the group: every rank exits with the reason. */
static void send_turn(ServeLoop *l) {
    char err[ERR_LEN];
    if (serve_turn_send(&l->turn, l->o.tp, err) != 0) {
        error_prefix(err, "colt serve: the tensor-parallel group stopped following rank 0");
        comm_abort(l->o.tp, err);
    }
}

/* One weight-channel operation, on the engine thread between steps. A
 * failure closes the channel: the trainer's side fails too (its collective
 * times out or sees the error) and says so; this side logs and serves on. */
static void sync_op_done(ServeLoop *l, const ServeSyncRequest *q, int rc, const char *err, size_t bytes,
                         double seconds) {
    if (rc != 0)
        log_error("colt serve: weight channel: %s; the channel is closed, serving goes on with the weights held", err);
    else if (q->op == SERVE_SYNC_OPEN)
        log_info0("colt serve: weight channel open (%s)", comm_kind_name(weight_sync_kind(l->sync)));
    else if (q->op == SERVE_SYNC_CLOSE)
        log_info0("colt serve: weight channel closed");
    pthread_mutex_lock(&l->mu);
    if (rc != 0) {
        l->weight_sync_failures++;
        /* operations queued behind the failed one find the channel closed */
        bool reopened = false;
        for (int k = 0; k < l->n_sync; k++) reopened |= l->sync_queue[k].op == SERVE_SYNC_OPEN;
        if (!reopened) l->sync_open = false;
    } else if (q->op == SERVE_SYNC_RECV) {
        l->weight_updates++;
        l->last_update_bytes = (double)bytes;
        l->last_update_seconds = seconds;
    }
    pthread_mutex_unlock(&l->mu);
}

/* The opener thread: OPEN's wait for the trainer (one process). */
static void *opener_main(void *arg) {
    ServeLoop *l = arg;
    WeightSyncOptions o = serve_sync_options(l->m, &l->open_q, 0, 1, &l->cancel_sync);
    l->open_rc = weight_sync_meet(&l->met, &o, l->open_err);
    atomic_store(&l->opener_done, true);
    pthread_mutex_lock(&l->mu);
    l->wake = true;
    pthread_cond_signal(&l->cv);
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

/* The opener ended: the channel opens on the store where the group met (or its failure is counted). */
static void opener_join(ServeLoop *l) {
    pthread_join(l->opener, NULL);
    l->opening = false;
    if (l->open_rc == 0) {
        WeightSyncOptions o = serve_sync_options(l->m, &l->open_q, 0, 1, &l->cancel_sync);
        l->open_rc = weight_sync_open_met(&l->sync, l->met, &o, l->open_err);
        l->met = NULL;
    }
    sync_op_done(l, &l->open_q, l->open_rc, l->open_err, 0, 0);
}

static void run_sync_op(ServeLoop *l, const ServeSyncRequest *q) {
    char err[ERR_LEN] = "";
    int rc = COLT_OK;
    size_t bytes = 0;
    double seconds = 0;
    int n_server_ranks = l->o.tp ? comm_world_size(l->o.tp) : 1;
    if (q->op == SERVE_SYNC_OPEN) rc = match_adapters(l->m, q, err);
    if (rc == 0 && q->op == SERVE_SYNC_OPEN)
        log_info0("colt serve: weight channel: waiting for the trainer on %s:%d (at most %.0f s)", q->host, q->port,
                  q->timeout_s);
    if (rc == 0 && q->op == SERVE_SYNC_OPEN && !l->o.tp) { /* the wait goes on beside the engine */
        l->open_q = *q;
        l->open_rc = 0;
        l->open_err[0] = '\0';
        atomic_store(&l->opener_done, false);
        if (pthread_create(&l->opener, NULL, opener_main, l) == 0) {
            l->opening = true;
            return;
        }
        rc = errorf(err, "init_weight_sync: cannot start a thread to wait for the trainer");
    }
    if (rc == 0) rc = serve_sync_run(&l->sync, l->m, q, 0, n_server_ranks, &l->cancel_sync, &bytes, &seconds, err);
    sync_op_done(l, q, rc, err, bytes, seconds);
}

static void *loop_main(void *arg) {
    ServeLoop *l = arg;
    char err[ERR_LEN] = "";
    int rc = serve_engine_create(&l->engine, l->m, &l->o.engine, l->o.max_model_len, l->o.max_queued_sequences,
                                 l->o.tp, err);
    pthread_mutex_lock(&l->mu);
    if (rc == 0) {
        engine_load(l->engine, &l->load);
        engine_stats(l->engine, &l->engine_stats);
    }
    l->start_rc = rc;
    snprintf(l->start_err, sizeof l->start_err, "%s", err);
    l->started = true;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
    if (rc != 0) return NULL;

    ServeRequest **taken = NULL;
    int taken_cap = 0;
    for (;;) {
        pthread_mutex_lock(&l->mu);
        l->idle_since = time_now();
        while (!l->stop && !l->wake && !engine_has_work(l->engine)) {
            struct timespec deadline;
            deadline_after(&deadline, IDLE_WAIT_S);
            if (pthread_cond_timedwait(&l->cv, &l->mu, &deadline) == ETIMEDOUT && l->o.tp) break; /* heartbeat */
        }
        double t_turn = time_now(), step_seconds = 0;
        l->idle_seconds += t_turn - l->idle_since;
        l->idle_since = 0;
        bool stop = l->stop, abort_all = l->abort_all;
        l->abort_all = false;
        int n_taken = l->n_incoming;
        if (n_taken > taken_cap) {
            taken_cap = n_taken;
            taken = xrealloc(taken, sizeof(ServeRequest *) * (size_t)taken_cap);
        }
        if (n_taken) memcpy(taken, l->incoming, sizeof(ServeRequest *) * (size_t)n_taken);
        l->n_incoming = 0;
        l->wake = false;
        if (l->opening && atomic_load(&l->opener_done)) {
            pthread_mutex_unlock(&l->mu);
            opener_join(l);
            pthread_mutex_lock(&l->mu);
        }
        /* Operations in order; one process: up to an OPEN, whose wait holds the rest back. */
        ServeSyncRequest ops[SYNC_QUEUE];
        int n_ops = stop || l->opening ? 0 : l->n_sync;
        for (int k = 0; !l->o.tp && k < n_ops; k++)
            if (l->sync_queue[k].op == SERVE_SYNC_OPEN) n_ops = k + 1;
        memcpy(ops, l->sync_queue, sizeof(ServeSyncRequest) * (size_t)n_ops);
        l->n_sync -= n_ops;
        memmove(l->sync_queue, l->sync_queue + n_ops, sizeof(ServeSyncRequest) * (size_t)l->n_sync);
        pthread_mutex_unlock(&l->mu);
        /* Between engine steps: requests taken from here on compute with what they bring. Tensor
         * parallel: the other ranks learn of the operations first (each is collective over them too). */
        if (l->o.tp && n_ops > 0) {
            for (int k = 0; k < n_ops; k++) serve_turn_sync(&l->turn, &ops[k]);
            send_turn(l);
        }
        for (int k = 0; k < n_ops; k++) run_sync_op(l, &ops[k]);
        if (stop) {
            if (l->o.tp) {
                serve_turn_stop(&l->turn);
                send_turn(l);
            }
            for (int i = 0; i < n_taken; i++) {
                request_fail(taken[i], "the server is shutting down");
                serve_request_release(taken[i]);
            }
            break;
        }

        int left = 0; /* sequences that left the engine this turn */
        int64_t requests_done = 0, sampled = 0;
        for (int i = 0; i < n_taken; i++) add_to_engine(l, taken[i], &left);
        if (abort_all) fail_all(l, "the server is shutting down", &left);
        apply_cancels(l, &left);
        bool step_failed = false, step = engine_has_work(l->engine);
        if (l->o.tp) { /* this turn's adds and aborts, and whether a step follows (else a heartbeat) */
            if (step) serve_turn_step(&l->turn);
            send_turn(l);
        }
        if (step) {
            const EngineEvent *ev;
            int n_events;
            double t_step = time_now();
            int step_rc = engine_step(l->engine, &ev, &n_events, err);
            step_seconds = time_now() - t_step;
            if (step_rc != 0) {
                /* tensor parallel: a collective failed (a rank died?) or a rank's forward did; the
                 * group cannot go on together */
                if (l->o.tp) comm_abort(l->o.tp, err);
                step_failed = true;
                log_error("colt serve: the engine failed: %s", err);
                fail_all(l, err, &left);
            } else {
                publish(l, ev, n_events, &left);
                for (int k = 0; k < n_events; k++) sampled += ev[k].token >= 0;
            }
        }
        score_left(l);
        drop_finished(l, &requests_done);

        pthread_mutex_lock(&l->mu);
        if (step_failed) {
            l->failed = true;
            snprintf(l->fail_msg, sizeof l->fail_msg, "%s", err);
        }
        l->outstanding -= left;
        l->sequences_finished += left;
        l->requests_finished += requests_done;
        engine_load(l->engine, &l->load);
        engine_stats(l->engine, &l->engine_stats);
        int64_t now = (int64_t)time_now();
        int bucket = (int)(now % (RATE_WINDOW_S + 1));
        if (l->rate_second[bucket] != now) l->rate_second[bucket] = now, l->rate_tokens[bucket] = 0;
        l->rate_tokens[bucket] += sampled;
        l->loop_seconds += time_now() - t_turn - step_seconds;
        pthread_mutex_unlock(&l->mu);
        if (step_failed) break; /* an engine whose step failed is not used again */
    }
    int left = 0;
    fail_all(l, l->failed ? l->fail_msg : "the server is shutting down", &left);
    int64_t done = 0;
    drop_finished(l, &done);
    if (l->failed) { /* keep answering: submissions are refused from now on, waiters already woken */
        pthread_mutex_lock(&l->mu);
        l->outstanding -= left;
        while (!l->stop) {
            for (int i = 0; i < l->n_incoming; i++) { /* raced with the failure */
                request_fail(l->incoming[i], l->fail_msg);
                l->outstanding -= l->incoming[i]->n_choices;
                serve_request_release(l->incoming[i]);
            }
            l->n_incoming = 0;
            struct timespec deadline;
            deadline_after(&deadline, IDLE_WAIT_S);
            pthread_cond_timedwait(&l->cv, &l->mu, &deadline);
        }
        pthread_mutex_unlock(&l->mu);
    }
    free(taken);
    return NULL;
}

/* Ends the waker once it has woken everything handed to it. */
static void waker_end(ServeLoop *l) {
    pthread_mutex_lock(&l->waker_mu);
    l->waker_stop = true;
    pthread_cond_signal(&l->waker_cv);
    pthread_mutex_unlock(&l->waker_mu);
    pthread_join(l->waker, NULL);
    free(l->to_wake);
    pthread_mutex_destroy(&l->waker_mu);
    pthread_cond_destroy(&l->waker_cv);
}

int serve_loop_start(ServeLoop **out, Model *m, const ServeLoopOptions *o, char *err) {
    *out = NULL;
    if (o->max_queued_sequences < 1) return errorf(err, "max_queued_sequences must be >= 1");
    ServeLoop *l = xcalloc(1, sizeof *l);
    l->m = m;
    l->o = *o;
    pthread_mutex_init(&l->mu, NULL);
    cond_init_monotonic(&l->cv);
    l->slots = xcalloc((size_t)o->max_queued_sequences, sizeof(Slot));
    l->free_slots = xmalloc(sizeof(int) * (size_t)o->max_queued_sequences);
    for (int k = 0; k < o->max_queued_sequences; k++) l->free_slots[k] = o->max_queued_sequences - 1 - k;
    l->n_free_slots = o->max_queued_sequences;
    pthread_mutex_init(&l->waker_mu, NULL);
    pthread_cond_init(&l->waker_cv, NULL);
    l->n_turns = 1; /* a request's woken_turn starts at 0 */
    if (pthread_create(&l->waker, NULL, waker_main, l) != 0) {
        pthread_mutex_destroy(&l->waker_mu);
        pthread_cond_destroy(&l->waker_cv);
        free(l->slots), free(l->free_slots), free(l);
        return errorf(err, "could not start the waker thread");
    }
    if (pthread_create(&l->thread, NULL, loop_main, l) != 0) {
        waker_end(l);
        free(l->slots), free(l->free_slots), free(l);
        return errorf(err, "could not start the engine thread");
    }
    pthread_mutex_lock(&l->mu);
    while (!l->started) pthread_cond_wait(&l->cv, &l->mu); /* engine_create returns, with its error or not */
    int rc = l->start_rc;
    if (rc != 0) errorf(err, "%s", l->start_err);
    pthread_mutex_unlock(&l->mu);
    if (rc != 0) {
        pthread_join(l->thread, NULL);
        waker_end(l);
        pthread_mutex_destroy(&l->mu);
        pthread_cond_destroy(&l->cv);
        free(l->slots), free(l->free_slots), free(l);
        return COLT_ERR;
    }
    *out = l;
    return COLT_OK;
}

int serve_loop_stop(ServeLoop *l, double grace_s) {
    if (!l) return COLT_OK;
    atomic_store(&l->cancel_sync, true); /* a wait for the trainer (on the opener or the engine thread) ends */
    pthread_mutex_lock(&l->mu);
    l->stop = true;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += (time_t)grace_s;
    if (pthread_timedjoin_np(l->thread, NULL, &until) != 0) return COLT_ERR;
    if (l->opening) {
        pthread_join(l->opener, NULL);
        store_close(l->met);
    }
    for (int i = 0; i < l->n_incoming; i++) {
        request_fail(l->incoming[i], "the server is shutting down");
        serve_request_release(l->incoming[i]);
    }
    waker_end(l); /* the engine thread has ended: nothing more is handed to the waker */
    weight_sync_close(l->sync);
    engine_destroy(l->engine);
    model_state_free(l->score_state);
    free(l->score_logits);
    serve_turn_free(&l->turn);
    free(l->incoming), free(l->active), free(l->slots), free(l->free_slots), free(l->step_wake);
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->cv);
    free(l);
    return COLT_OK;
}
