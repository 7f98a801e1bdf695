/* agent_tools.c — TRL's tool rounds over the tool worker (agent_tools.h). */
#include "agent/agent_tools.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/log.h"

/* One call of a conversation's current round. */
typedef struct RoundCall {
    long request;      /* the worker's id; -1 once answered */
    char *name;
    bool async;        /* TRL puts the async tools' results after the others */
    char *content;     /* the answer: what the model gets */
    bool failed;
} RoundCall;

typedef struct Conversation {
    json_t *messages;  /* the completion's messages */
    int calls, failures;
    RoundCall *round;  /* the calls of the round in flight */
    int n_round, n_answered, round_messages; /* round_messages: tool messages it appended */
    int *suffix;
    size_t n_suffix;
} Conversation;

/* An answer to apply: [conversation, call, content, failed, raised_on_call]. The worker's answers and the
 * failed submits become these first, so that a tensor-parallel group's leader can share them as they are. */
struct AgentToolRunner {
    AgentToolsOptions o;
    Conversation *convs;
    int n;
    AgentToolResult *ready;
    json_t *outbox; /* answers taken and not applied yet */
};

AgentToolRunner *agent_tool_runner_create(const AgentToolsOptions *o, int n) {
    AgentToolRunner *r = xcalloc(1, sizeof *r);
    r->o = *o;
    r->n = n;
    r->convs = xcalloc((size_t)(n > 0 ? n : 1), sizeof(Conversation));
    r->ready = xcalloc((size_t)(n > 0 ? n : 1), sizeof(AgentToolResult));
    for (int i = 0; i < n; i++) r->convs[i].messages = json_array();
    r->outbox = json_array();
    return r;
}

static void clear_round(Conversation *c) {
    for (int k = 0; k < c->n_round; k++) free(c->round[k].name), free(c->round[k].content);
    free(c->round);
    c->round = NULL;
    c->n_round = c->n_answered = 0;
}

void agent_tool_runner_free(AgentToolRunner *r) {
    if (!r) return;
    for (int i = 0; i < r->n; i++) {
        clear_round(&r->convs[i]);
        json_decref(r->convs[i].messages);
        free(r->convs[i].suffix);
    }
    free(r->convs);
    free(r->ready);
    json_decref(r->outbox);
    free(r);
}

const json_t *agent_tool_runner_messages(const AgentToolRunner *r, int c) { return r->convs[c].messages; }

void agent_tool_runner_counts(const AgentToolRunner *r, int c, int *calls, int *failures) {
    *calls = r->convs[c].calls;
    *failures = r->convs[c].failures;
}

/* TRL's text for a call that could not be made (Python's str of {"error": ...}). */
static char *error_text(const char *message) {
    json_t *s = json_string(message ? message : "the tool worker failed");
    char *quoted = json_dumps(s, JSON_ENCODE_ANY);
    json_decref(s);
    size_t n = strlen(quoted) + 16;
    char *text = xmalloc(n);
    /* json's "..." quoting is Python's repr for the plain messages this gets */
    snprintf(text, n, "{'error': '%.*s'}", (int)(strlen(quoted) - 2), quoted + 1);
    free(quoted);
    return text;
}

static bool runs_tools(const AgentToolRunner *r) { return !r->o.group || r->o.group->leader; }

static void take_answer(AgentToolRunner *r, int i, int k, const char *content, bool failed, bool raised_on_call) {
    json_array_append_new(r->outbox, json_pack("[i, i, s, b, b]", i, k, content, failed, raised_on_call));
}

static void answer(Conversation *c, RoundCall *call, char *content, bool failed) {
    call->request = -1;
    call->content = content;
    call->failed = failed;
    c->failures += failed;
    c->n_answered++;
}

static int turn_ended(void *ctx, int i, const int *context, int n_context, const int *turn, int n, FinishReason finish,
                      bool may_call, bool *called, char *err) {
    (void)finish;
    AgentToolRunner *r = ctx;
    Conversation *c = &r->convs[i];
    *called = false;
    json_t *message = NULL;
    /* TRL parses each completion with the tools its prompt was rendered with */
    const int environment = r->o.environments ? (r->o.environment_of ? r->o.environment_of[i] : 0) : -1;
    const long instance = r->o.environments ? (r->o.instance_of ? r->o.instance_of[i] : i) : -1;
    const json_t *schemas = tool_worker_schemas(r->o.worker);
    const ToolEnvironment *envs;
    if (environment >= 0 && (size_t)environment < tool_worker_environments(r->o.worker, &envs))
        schemas = envs[environment].schemas;
    if (tool_calls_parse_ids(&message, r->o.format, r->o.tok, context, (size_t)n_context, turn, (size_t)n, schemas,
                             err) != 0)
        return COLT_ERR;
    json_array_append_new(c->messages, message);
    json_t *calls = json_object_get(message, "tool_calls");
    size_t n_calls = json_array_size(calls);
    if (!may_call || n_calls == 0) return COLT_OK;
    clear_round(c);
    c->round = xcalloc(n_calls, sizeof(RoundCall));
    c->n_round = (int)n_calls;
    c->round_messages = 0;
    for (size_t k = 0; k < n_calls; k++) {
        json_t *function = json_object_get(json_array_get(calls, k), "function");
        const char *name = json_string_value(json_object_get(function, "name"));
        RoundCall *call = &c->round[k];
        call->name = xstrdup(name ? name : "unknown");
        call->async = tool_worker_is_async_in(r->o.worker, call->name, environment);
        c->calls++;
        call->request = -2; /* not submitted on this rank: its group's leader runs it */
        char why[ERR_LEN];
        if (runs_tools(r) &&
            tool_worker_submit_call(r->o.worker, &call->request, call->name, json_object_get(function, "arguments"),
                                    instance, r->o.timeout_s, why) != 0) {
            char *text = error_text(why); /* the model is told, as for any failing call */
            take_answer(r, i, (int)k, text, true, false);
            free(text);
        }
    }
    *called = true;
    return COLT_OK;
}

/* The round's tool messages in TRL's order, then the ids that follow. */
static int finish_round(AgentToolRunner *r, int i, char *err) {
    Conversation *c = &r->convs[i];
    json_t *tool_messages = json_array();
    for (int pass = 0; pass < 2; pass++)
        for (int k = 0; k < c->n_round; k++)
            if (c->round[k].async == (pass == 1))
                json_array_append_new(tool_messages, json_pack("{s:s, s:s, s:s}", "role", "tool", "name",
                                                               c->round[k].name, "content", c->round[k].content));
    free(c->suffix);
    c->suffix = NULL;
    int rc = tool_calls_suffix_ids(&c->suffix, &c->n_suffix, r->o.tok, r->o.template_source, tool_messages,
                                   r->o.chat_template_kwargs, err);
    if (rc == 0) {
        c->round_messages = (int)json_array_size(tool_messages);
        json_array_extend(c->messages, tool_messages);
    }
    json_decref(tool_messages);
    clear_round(c);
    return rc;
}

/* The round call a worker answer belongs to. */
static bool find_request(AgentToolRunner *r, long request, int *conv, int *index) {
    for (int i = 0; i < r->n; i++)
        for (int k = 0; k < r->convs[i].n_round; k++)
            if (r->convs[i].round[k].request == request) {
                *conv = i, *index = k;
                return true;
            }
    return false;
}

/* The worker's answers (waiting up to wait_s for the first) into the outbox. */
static int collect_answers(AgentToolRunner *r, double wait_s, char *err) {
    double wait = json_array_size(r->outbox) ? 0.0 : wait_s;
    int worker_failures = 0;
    for (;;) {
        long request = -1;
        json_t *ans = NULL;
        char why[ERR_LEN];
        int got = tool_worker_poll(r->o.worker, &request, &ans, wait, why);
        if (got == COLT_ERR) { /* every call in flight is answered with an error; the next submit restarts it */
            log_error("tool worker failed, calls in flight answered with an error: %s", why);
            if (++worker_failures > 3) return errorf(err, "the tool worker keeps failing: %s", why);
            wait = 0;
            continue;
        }
        if (got == 0) return COLT_OK;
        wait = 0;
        int i, k;
        if (!find_request(r, request, &i, &k)) {
            json_decref(ans);
            continue; /* not a call of ours (the worker's other requests) */
        }
        r->convs[i].round[k].request = -1; /* taken: answered once applied */
        const char *content = json_string_value(json_object_get(ans, "content"));
        char *text = content ? NULL : error_text(json_string_value(json_object_get(ans, "error")));
        /* an async tool that raised when called (wrong arguments): TRL appends that error in call order with
         * the sync results, not with the awaited ones */
        take_answer(r, i, k, content ? content : text, content ? json_is_true(json_object_get(ans, "failed")) : true,
                    json_is_true(json_object_get(ans, "raised_on_call")));
        free(text);
        json_decref(ans);
    }
}

/* Under tensor parallelism the leader's outbox becomes every rank's (or its failure every rank's error). */
static int share_outbox(AgentToolRunner *r, int rc, char *err) {
    const AgentToolsGroup *g = r->o.group;
    char *bytes = NULL;
    size_t n = 0;
    if (g->leader && rc == 0) {
        bytes = json_dumps(r->outbox, JSON_COMPACT);
        n = strlen(bytes);
    }
    rc = g->share(g->ctx, &bytes, &n, rc, err);
    if (rc == 0 && !g->leader) {
        json_error_t je;
        json_decref(r->outbox);
        r->outbox = json_loadb(bytes, n, 0, &je);
        if (!json_is_array(r->outbox)) {
            json_decref(r->outbox);
            r->outbox = json_array();
            rc = errorf(err, "tools: the group leader's tool results do not parse: %s", je.text);
        }
    }
    free(bytes);
    return rc;
}

/* Applies the outbox in order; each round it completes is rendered and ready. */
static int apply_outbox(AgentToolRunner *r, int *n_ready, char *err) {
    size_t index;
    json_t *e;
    int rc = COLT_OK;
    json_array_foreach(r->outbox, index, e) {
        int i = (int)json_integer_value(json_array_get(e, 0)), k = (int)json_integer_value(json_array_get(e, 1));
        if (i < 0 || i >= r->n || k < 0 || k >= r->convs[i].n_round || !r->convs[i].round[k].name ||
            r->convs[i].round[k].content || !json_is_string(json_array_get(e, 2))) {
            rc = errorf(err, "tools: an answer for call %d of conversation %d, which has no such call waiting", k, i);
            break;
        }
        Conversation *c = &r->convs[i];
        if (json_is_true(json_array_get(e, 4))) c->round[k].async = false;
        answer(c, &c->round[k], xstrdup(json_string_value(json_array_get(e, 2))), json_is_true(json_array_get(e, 3)));
        if (c->n_answered == c->n_round) {
            if ((rc = finish_round(r, i, err)) != 0) {
                error_prefix(err, "conversation %d", i);
                break;
            }
            r->ready[(*n_ready)++] = (AgentToolResult){.conversation = i, .ids = c->suffix, .n = (int)c->n_suffix};
        }
    }
    json_array_clear(r->outbox);
    return rc;
}

static int poll_results(void *ctx, double wait_s, const AgentToolResult **ready, int *n_ready, char *err) {
    AgentToolRunner *r = ctx;
    *n_ready = 0;
    *ready = r->ready;
    int rc = runs_tools(r) ? collect_answers(r, wait_s, err) : COLT_OK;
    if (r->o.group) rc = share_outbox(r, rc, err);
    if (rc != 0) {
        json_array_clear(r->outbox);
        return COLT_ERR;
    }
    return apply_outbox(r, n_ready, err);
}

static void results_dropped(void *ctx, int i) {
    Conversation *c = &((AgentToolRunner *)ctx)->convs[i];
    for (; c->round_messages > 0; c->round_messages--)
        json_array_remove(c->messages, json_array_size(c->messages) - 1);
}

AgentTools agent_tool_runner_handler(AgentToolRunner *r) {
    return (AgentTools){.ctx = r, .turn_ended = turn_ended, .poll = poll_results, .results_dropped = results_dropped};
}
