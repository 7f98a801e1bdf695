/* agent_tools.h — the tools' side of the multi-turn loop (agent_loop.h's
 * AgentTools) over colt's tool pieces, as TRL 1.16's `_tool_call_loop` does
 * it: each finished turn parsed in the model's format (tool_calls.h) into the
 * assistant message TRL appends; its calls submitted to the Python tool
 * worker (tool_worker.h), all at once and answered in any order, while the
 * engine decodes other conversations; once a turn's calls are all answered,
 * the tool messages in TRL's order (the sync tools' results and the errors
 * raised when calling, in call order, then what the async tools gave when
 * awaited) rendered into the ids that follow
 * the completion (tool_calls_suffix_ids). It keeps each conversation's
 * completion messages (what TRL gives reward functions and logs) and its
 * tool-call and failure counts (TRL's tools/call_frequency and
 * tools/failure_frequency).
 *
 * Not here: resetting environments and their prompts (the trainer's). */
#ifndef COLT_AGENT_AGENT_TOOLS_H
#define COLT_AGENT_AGENT_TOOLS_H

#include <jansson.h>

#include "agent/agent_loop.h"
#include "agent/tool_calls.h"
#include "agent/tool_worker.h"
#include "tokenizer/tokenizer.h"

/* Tensor parallelism: the ranks of a group run one engine together, so they
 * must take the same results at the same moments. The leader alone runs the
 * worker; at each poll it shares the answers it took (their conversation,
 * call, text and failure), and every rank, the leader too, applies exactly
 * those: the same suffix ids at the same loop step everywhere. */
typedef struct AgentToolsGroup {
    void *ctx;
    bool leader;
    /* Collective over the group: the leader's bytes[n] to every rank (the
     * others' *bytes malloc'd, the caller's to free); a leader that failed
     * (rc != 0, err its reason) makes it every rank's error. Bounded. */
    int (*share)(void *ctx, char **bytes, size_t *n, int rc, char *err);
} AgentToolsGroup;

typedef struct AgentToolsOptions {
    const Tokenizer *tok;
    const char *template_source;        /* the chat template TRL renders with (tool_calls.h) */
    const json_t *chat_template_kwargs; /* TRL's chat_template_kwargs, or NULL */
    ToolCallFormat format;
    ToolWorker *worker;                 /* borrowed; used from the loop's thread */
    double timeout_s;                   /* per tool call (<= 0: none) */
    /* environment_factory: conversation i's calls go to environment i (reset
     * by the caller), whose methods are tools of that conversation alone */
    bool environments;
    const AgentToolsGroup *group;       /* NULL: this rank alone (no tensor parallelism) */
    /* with environments, TRL's dict: conversation i is of environment
     * environment_of[i] (an index of tool_worker_environments; its tools parse
     * the turn) and its calls go to instance instance_of[i]; NULL: 0 and i */
    const int *environment_of;
    const long *instance_of;
} AgentToolsOptions;

typedef struct AgentToolRunner AgentToolRunner;

/* A runner for n conversations (agent_generate's indices). */
AgentToolRunner *agent_tool_runner_create(const AgentToolsOptions *o, int n);
void agent_tool_runner_free(AgentToolRunner *r);
/* The handler to give agent_generate (ctx is r). */
AgentTools agent_tool_runner_handler(AgentToolRunner *r);
/* Conversation c's completion as TRL keeps it: a list of messages (each
 * model turn as parsed, the tool messages between them). Borrowed. */
const json_t *agent_tool_runner_messages(const AgentToolRunner *r, int c);
/* Tool calls made by conversation c and, of them, failed. */
void agent_tool_runner_counts(const AgentToolRunner *r, int c, int *calls, int *failures);

#endif
