/* agent_loop.c — conversations over a turn generator: this process's persistent engine, or another (agent_loop.h). */
#include "agent/agent_loop.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/log.h"
#include "model/model.h"

enum { CONV_RUNNING, CONV_WAITING, CONV_DONE };

void agent_conversation_free(AgentConversation *c) {
    free(c->tokens), free(c->logprobs), free(c->model_mask), free(c->context);
    gen_sequence_free(&c->turn);
    c->tokens = NULL, c->logprobs = NULL, c->model_mask = NULL, c->context = NULL;
    c->n_tokens = 0;
}

/* Queues conversation i's next turn: its whole context (prompt, completion
 * so far) as the request's prompt, the RNG positions going on from there. */
static int start_turn(const AgentGenerator *g, AgentConversation *c, int i, const GenerateOptions *opt, char *err) {
    int n_context = c->prompt_len + c->n_tokens;
    c->context = xrealloc(c->context, sizeof(int) * (size_t)n_context);
    memcpy(c->context, c->prompt, sizeof(int) * (size_t)c->prompt_len);
    memcpy(c->context + c->prompt_len, c->tokens, sizeof(int) * (size_t)c->n_tokens);
    c->turn = (GenSequence){.prompt = c->context, .prompt_len = n_context, .stream = c->stream,
                            .first_position = c->n_tokens};
    GenerateOptions o = *opt;
    o.max_new_tokens = opt->max_new_tokens - c->n_tokens;
    c->state = CONV_RUNNING;
    return g->add(g->ctx, &c->turn, &o, (uint64_t)i, err);
}

static void append(AgentConversation *c, const int *ids, const float *logprobs, int n, uint8_t model) {
    for (int k = 0; k < n; k++) {
        c->tokens[c->n_tokens] = ids[k];
        c->logprobs[c->n_tokens] = logprobs ? logprobs[k] : 0.0f;
        c->model_mask[c->n_tokens] = model;
        c->n_tokens++;
    }
}

/* A turn finished: its tokens join the conversation; the tools say whether
 * it goes on. */
static int end_turn(AgentConversation *c, int i, const AgentTools *tools, const AgentLoopOptions *lo, char *err) {
    append(c, c->turn.tokens, c->turn.logprobs, c->turn.n_tokens, 1);
    c->finish = c->turn.finish;
    bool called = false;
    int rc = COLT_OK;
    bool may_call = lo->max_tool_calling_iterations < 0 || c->tool_rounds < lo->max_tool_calling_iterations;
    if (tools)
        rc = tools->turn_ended(tools->ctx, i, c->turn.prompt, c->turn.prompt_len, c->turn.tokens, c->turn.n_tokens,
                               c->finish, may_call, &called, err);
    called = called && may_call;
    gen_sequence_free(&c->turn);
    c->state = called ? CONV_WAITING : CONV_DONE;
    return rc;
}

/* Results for conversation i: appended and the next turn queued, or dropped
 * when they do not fit (TRL: past max_completion_length, or reaching the
 * model's length). */
static int take_results(const AgentGenerator *g, AgentConversation *c, int i, const AgentToolResult *r,
                        const GenerateOptions *opt, const AgentTools *tools, char *err) {
    if (c->state != CONV_WAITING)
        return errorf(err, "agent loop: tool results for conversation %d, which is not waiting for any", i);
    if (c->n_tokens + r->n > opt->max_new_tokens || c->prompt_len + c->n_tokens + r->n >= g->max_positions) {
        c->results_dropped = true;
        c->state = CONV_DONE;
        if (tools->results_dropped) tools->results_dropped(tools->ctx, i);
        return COLT_OK;
    }
    append(c, r->ids, NULL, r->n, 0);
    c->tool_rounds++;
    if (c->n_tokens == opt->max_new_tokens) { /* nothing left for another turn */
        c->finish = FINISH_LENGTH;
        c->state = CONV_DONE;
        return COLT_OK;
    }
    return start_turn(g, c, i, opt, err);
}

int agent_generate_with(const AgentGenerator *g, AgentConversation *convs, int n, const GenerateOptions *opt,
                        const AgentTools *tools, const AgentLoopOptions *lo, char *err) {
    static const AgentLoopOptions defaults = {.max_tool_calling_iterations = -1};
    if (!lo) lo = &defaults;
    for (int i = 0; i < n; i++) {
        AgentConversation *c = &convs[i];
        c->n_tokens = 0, c->tool_rounds = 0, c->results_dropped = false, c->finish = FINISH_LENGTH;
        c->context = NULL, c->turn = (GenSequence){0};
        size_t cap = (size_t)(opt->max_new_tokens > 0 ? opt->max_new_tokens : 1);
        c->tokens = xmalloc(sizeof(int) * cap);
        c->logprobs = xmalloc(sizeof(float) * cap);
        c->model_mask = xmalloc(cap);
    }
    int rc = COLT_OK;
    for (int i = 0; rc == 0 && i < n; i++) rc = start_turn(g, &convs[i], i, opt, err);
    int waiting = 0, done = 0;
    double idle_wait = lo->idle_wait_s > 0 ? lo->idle_wait_s : 0.05;
    while (rc == 0 && done < n) {
        if (g->has_work(g->ctx)) {
            const uint64_t *finished;
            int n_finished;
            rc = g->step(g->ctx, &finished, &n_finished, err);
            for (int k = 0; rc == 0 && k < n_finished; k++) {
                int i = (int)finished[k];
                rc = end_turn(&convs[i], i, tools, lo, err);
                if (convs[i].state == CONV_WAITING) waiting++;
                else done++;
            }
        }
        if (rc != 0 || waiting == 0) continue;
        /* Tools run while the engine decodes: take what is ready without
         * waiting, and wait only when there is nothing else to do. */
        const AgentToolResult *ready = NULL;
        int n_ready = 0;
        rc = tools->poll(tools->ctx, g->has_work(g->ctx) ? 0.0 : idle_wait, &ready, &n_ready, err);
        for (int k = 0; rc == 0 && k < n_ready; k++) {
            int i = ready[k].conversation;
            if (i < 0 || i >= n) {
                rc = errorf(err, "agent loop: tool results for conversation %d of %d", i, n);
                break;
            }
            waiting--;
            rc = take_results(g, &convs[i], i, &ready[k], opt, tools, err);
            if (convs[i].state == CONV_DONE) done++;
        }
    }
    if (rc != 0)
        for (int i = 0; i < n; i++) agent_conversation_free(&convs[i]);
    else
        for (int i = 0; i < n; i++) free(convs[i].context), convs[i].context = NULL;
    return rc;
}

/* ---------------------------------------------------------------- this process's engine */

typedef struct EngineGenerator {
    Engine *engine;
    uint64_t *finished; /* [n]: the ids a step ended */
} EngineGenerator;

static int engine_gen_add(void *ctx, GenSequence *turn, const GenerateOptions *opt, uint64_t id, char *err) {
    return engine_add_request(((EngineGenerator *)ctx)->engine, turn, opt, id, err);
}

static bool engine_gen_has_work(void *ctx) { return engine_has_work(((EngineGenerator *)ctx)->engine); }

static int engine_gen_step(void *ctx, const uint64_t **finished, int *n_finished, char *err) {
    EngineGenerator *eg = ctx;
    const EngineEvent *events;
    int n_events;
    *finished = eg->finished, *n_finished = 0;
    if (engine_step(eg->engine, &events, &n_events, err) != 0) return COLT_ERR;
    for (int k = 0; k < n_events; k++)
        if (events[k].finished) eg->finished[(*n_finished)++] = events[k].id;
    return COLT_OK;
}

int agent_generate_on(Engine *e, AgentConversation *convs, int n, const GenerateOptions *opt, const AgentTools *tools,
                      const AgentLoopOptions *lo, EngineStats *stats, char *err) {
    if (stats) memset(stats, 0, sizeof *stats);
    if (n == 0) return COLT_OK;
    if (!engine_awake(e)) return errorf(err, "agent_generate_on: the engine is asleep (engine_wake takes its memory again)");
    if (engine_has_work(e)) return errorf(err, "agent_generate_on: the engine still has requests of its own");
    for (int i = 0; i < n; i++) /* every turn's context is prompt + completion so far, bounded by max_new_tokens */
        if (engine_check_length(e, "agent_generate_on: conversation", i, convs[i].prompt_len, opt->max_new_tokens,
                                err) != 0)
            return COLT_ERR;
    double t0 = time_now();
    EngineGenerator eg = {.engine = e, .finished = xmalloc(sizeof(uint64_t) * (size_t)n)};
    AgentGenerator g = {.ctx = &eg, .max_positions = model_config(engine_model(e))->max_position_embeddings,
                        .add = engine_gen_add, .has_work = engine_gen_has_work, .step = engine_gen_step};
    EngineCall call;
    engine_call_begin(e, &call);
    int rc = agent_generate_with(&g, convs, n, opt, tools, lo, err);
    engine_call_end(e, &call, rc == 0 ? stats : NULL);
    if (stats) stats->seconds = time_now() - t0;
    free(eg.finished);
    return rc;
}

int agent_generate(Model *m, AgentConversation *convs, int n, const GenerateOptions *opt, const EngineOptions *eo,
                   const AgentTools *tools, const AgentLoopOptions *lo, EngineStats *stats, char *err) {
    if (stats) memset(stats, 0, sizeof *stats);
    if (n == 0) return COLT_OK;
    int max_positions = model_config(m)->max_position_embeddings, max_prompt = 0;
    for (int i = 0; i < n; i++)
        if (convs[i].prompt_len > max_prompt) max_prompt = convs[i].prompt_len;
    /* Every turn's context fits: prompt + completion, the completion bounded. */
    long long max_len = (long long)max_prompt + opt->max_new_tokens;
    if (max_len > max_positions) max_len = max_positions;
    double t0 = time_now();
    Engine *e = NULL;
    int rc = engine_create(&e, m, eo, (int)max_len, n, err);
    if (rc == 0) rc = agent_generate_on(e, convs, n, opt, tools, lo, stats, err);
    if (stats) stats->seconds = time_now() - t0; /* the engine's making too */
    engine_destroy(e);
    return rc;
}
