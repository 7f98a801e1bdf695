/* trainer_agent.c — tool calling in the trainer (TRL 1.16's tools=[...] and
 * max_tool_calling_iterations): the tool worker's life, prompts rendered with
 * the tools' schemas, and a round's multi-turn generation
 * (agent/agent_loop.h over agent/agent_tools.h) on this process's engine or,
 * in server mode, on colt serve. The loss side is one mask:
 * Sample.model_mask (trainer_micro_batch.c); with environment_factory, each
 * completion's environment: reset and its prompt, get_reward, and Python
 * rewards given environments=[...]. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/agent_loop.h"
#include "data/prompt.h"
#include "serve/serve_client.h"
#include "core/error.h"
#include "core/log.h"
#include "train/trainer_internal.h"

/* ---------------------------------------------------------------- tensor parallelism
 * The ranks of a tensor-parallel group run one engine together, so they must see the same tool results at
 * the same loop steps: the group's first rank (its leader) alone runs the tool worker (tools, environments,
 * their rewards) and shares what it got; the others hold a worker made from its description (schemas, the
 * environment's name), which runs nothing. Data parallel x tensor parallel: a leader and a worker per group. */

static bool tensor_parallel(const Trainer *t) { return t->mesh.groups.tensor_parallel_size > 1; }
static bool runs_tools(const Trainer *t) { return !tensor_parallel(t) || t->mesh.groups.tensor_parallel_rank == 0; }

/* AgentToolsGroup.share over the tensor-parallel group: a header (failed, length), then the bytes (the
 * leader's, or its error). A collective that fails or times out ends the job, as train_dist_agree does. */
static int group_share(void *ctx, char **bytes, size_t *n, int rc, char *err) {
    Trainer *t = ctx;
    Comm *tp = t->mesh.groups.tp;
    const bool leader = runs_tools(t);
    int64_t head[2] = {rc != 0, 0};
    if (leader) head[1] = (int64_t)(rc != 0 ? strlen(err) : *n);
    char comm_err[ERR_LEN];
    if (comm_broadcast(tp, head, 2, COMM_INT64, 0, NULL, comm_err) != 0) comm_abort(tp, comm_err);
    char *buf = leader ? (rc != 0 ? err : *bytes) : xmalloc((size_t)head[1] + 1);
    if (head[1] > 0 && comm_broadcast(tp, buf, (size_t)head[1], COMM_BYTE, 0, NULL, comm_err) != 0)
        comm_abort(tp, comm_err);
    if (leader) return rc != 0 ? COLT_ERR : COLT_OK;
    buf[head[1]] = '\0';
    if (head[0]) {
        errorf(err, "the tensor-parallel group's first rank, which runs its tools: %s", buf);
        free(buf);
        return COLT_ERR;
    }
    *bytes = buf, *n = (size_t)head[1];
    return COLT_OK;
}

/* The leader's JSON value (or its failure) to every rank of the group: *value a new reference everywhere. */
static int group_share_json(Trainer *t, json_t **value, int rc, char *err) {
    if (!tensor_parallel(t)) return rc;
    char *bytes = NULL;
    size_t n = 0;
    if (runs_tools(t) && rc == 0) {
        bytes = json_dumps(*value, JSON_COMPACT | JSON_ENCODE_ANY);
        n = strlen(bytes);
    }
    rc = group_share(t, &bytes, &n, rc, err);
    if (rc == 0 && !runs_tools(t)) {
        json_error_t je;
        *value = json_loadb(bytes, n, JSON_DECODE_ANY, &je);
        if (!*value) rc = errorf(err, "tools: the group leader's answer does not parse: %s", je.text);
    }
    free(bytes);
    return rc;
}

/* The worker, with TRL's single environment_factory or its dict (in the dict's order). */
static int start_leader_worker(ToolWorker **out, const Trainer *t, char *err) {
    const TrainConfig *c = t->cfg;
    size_t n_tools = json_array_size(c->tools);
    const char **tools = xcalloc(n_tools + 1, sizeof(char *));
    for (size_t i = 0; i < n_tools; i++) tools[i] = json_string_value(json_array_get(c->tools, i));
    int rc;
    if (!c->environment_factories) {
        const char *cls = c->environment_factory;
        rc = tool_worker_start_environments(out, tools, n_tools, NULL, cls ? &cls : NULL, cls ? 1 : 0, NULL, err);
    } else {
        size_t n = json_object_size(c->environment_factories), e = 0;
        const char **names = xcalloc(n, sizeof(char *)), **classes = xcalloc(n, sizeof(char *));
        const char *name;
        json_t *cls;
        json_object_foreach(c->environment_factories, name, cls) names[e] = name, classes[e++] = json_string_value(cls);
        rc = tool_worker_start_environments(out, tools, n_tools, names, classes, n, NULL, err);
        free(names), free(classes);
    }
    free(tools);
    return rc;
}

/* The worker: started by the leader, described to the others. */
static int start_worker(ToolWorker **out, Trainer *t, char *err) {
    int rc = COLT_OK;
    json_t *description = NULL;
    if (runs_tools(t)) {
        rc = start_leader_worker(out, t, err);
        if (rc == 0) description = tool_worker_description(*out);
    }
    rc = group_share_json(t, &description, rc, err);
    if (rc == 0 && !runs_tools(t)) rc = tool_worker_from_description(out, description, err);
    json_decref(description);
    return rc;
}

/* "math, game": the dict's names, for errors. */
static void environment_names(const ToolWorker *w, char *out, size_t cap) {
    const ToolEnvironment *envs;
    size_t n = tool_worker_environments(w, &envs), len = 0;
    out[0] = '\0';
    for (size_t e = 0; e < n && len < cap; e++)
        len += (size_t)snprintf(out + len, cap - len, "%s%s", e ? ", " : "", envs[e].name);
}

/* TRL's routing: with a dict, row i's 'environment' names one of its environments. *e its index. */
static int row_environment(const Trainer *t, int *e, const json_t *row, const char *where, size_t i, char *err) {
    *e = 0;
    if (!t->cfg->environment_factories) return COLT_OK;
    const json_t *name = json_object_get(row, "environment");
    *e = json_is_string(name) ? tool_worker_environment_index(t->tool_worker, json_string_value(name)) : -1;
    if (*e >= 0) return COLT_OK;
    char names[512], text[120];
    environment_names(t->tool_worker, names, sizeof names);
    if (!name) return errorf(err, "%s row %zu: no 'environment' field to pick one of environment_factory's environments "
                                  "(%s)", where, i, names);
    char *dumped = json_dumps(name, JSON_ENCODE_ANY | JSON_COMPACT);
    snprintf(text, sizeof text, "%s", dumped ? dumped : "?");
    free(dumped);
    return errorf(err, "%s row %zu: environment %s is not among the environments of environment_factory; expected "
                       "one of: %s", where, i, text, names);
}

/* Every row routes to a known environment: checked at start rather than at the round that draws it. */
static int check_environment_column(const Trainer *t, const Dataset *d, const char *where, char *err) {
    int e;
    for (size_t i = 0; d && t->cfg->environment_factories && i < dataset_size(d); i++)
        if (row_environment(t, &e, dataset_row((Dataset *)d, i), where, i, err) != 0) return COLT_ERR;
    return COLT_OK;
}

int trainer_tools_start(Trainer *t, char *err) {
    const TrainConfig *c = t->cfg;
    size_t n = json_array_size(c->tools);
    if (n == 0 && !c->environment_factory) return COLT_OK;
    const char *template_source = tokenizer_chat_template(t->tok);
    if (!template_source) return errorf(err, "tools: %s's tokenizer has no chat template to render tools with", c->model);
    if (tool_calls_format_of_template(&t->tool_format, template_source, err) != 0)
        return error_prefix(err, "tools: %s's chat template", c->model);
    int rc = start_worker(&t->tool_worker, t, err);
    /* async_generation: the round in flight calls its own worker (trainer_server.c) */
    if (rc == 0 && c->async_generation) rc = start_worker(&t->async_tool_worker, t, err);
    if (rc != 0) return error_prefix(err, "tools");
    if (check_environment_column(t, t->data, c->dataset, err) != 0 ||
        check_environment_column(t, t->eval_data, c->eval_dataset, err) != 0)
        return COLT_ERR;
    if (json_array_size(tool_worker_schemas(t->tool_worker)) == 0)
        return errorf(err, "environment_factory: %s has no public method for the model to call (its tools), and no "
                           "tools are given",
                      c->environment_factory);
    /* TRL: without reward_funcs the environment's get_reward is the reward */
    if (json_array_size(c->reward_funcs) == 0 && !tool_worker_environment_has_reward(t->tool_worker))
        return errorf(err, "environment_factory: no reward source: give reward_funcs, or define get_reward(self) "
                           "in %s (as TRL requires)",
                      c->environment_factory);
    /* TRL renders tool results by slicing two renderings of one conversation:
     * a template that is not prefix-preserving is refused now, not mid-run. */
    const json_t *schemas = tool_worker_schemas(t->tool_worker);
    const char *first = json_string_value(json_object_get(json_object_get(json_array_get(schemas, 0), "function"), "name"));
    json_t *probe = json_pack("[{s:s, s:s, s:s}]", "role", "tool", "name", first ? first : "tool", "content", "1");
    int *ids = NULL;
    size_t n_ids = 0;
    rc = tool_calls_suffix_ids(&ids, &n_ids, t->tok, template_source, probe, c->chat_template_kwargs, err);
    json_decref(probe);
    free(ids);
    if (rc != 0) return error_prefix(err, "tools: %s's chat template", c->model);
    if (dataset_size(t->data) > 0 && !dataset_is_conversational(t->data, 0))
        return errorf(err, "tools: %s holds plain-text prompts; tools are given to the model through the chat "
                           "template, so the prompts must be lists of messages (as TRL requires)",
                      c->dataset);
    if (c->environment_factories) {
        const ToolEnvironment *envs;
        size_t n_envs = tool_worker_environments(t->tool_worker, &envs);
        for (size_t e = 0; e < n_envs; e++)
            log_info0("environment_factory[%s]: %s, %zu tools%s", envs[e].name, envs[e].class_name,
                      json_array_size(envs[e].schemas), envs[e].has_reward ? ", get_reward() a reward" : "");
    } else if (c->environment_factory) {
        log_info0("environment_factory: %s, one instance per completion%s", tool_worker_environment_name(t->tool_worker),
                  tool_worker_environment_has_reward(t->tool_worker) ? ", get_reward() an extra reward" : "");
    }
    char rounds[32];
    snprintf(rounds, sizeof rounds, "%d", c->max_tool_calling_iterations);
    log_info0("tools: %zu (%s), rounds of calls per completion: %s, %g s per call", json_array_size(schemas),
              t->tool_format == TOOL_FORMAT_HERMES ? "<tool_call> JSON" : "Llama 3 JSON",
              c->max_tool_calling_iterations < 0 ? "no bound" : rounds, c->tool_timeout);
    if (t->async_tool_worker)
        log_info0("tools with async_generation: a second tool worker for the round generated while another trains "
                  "(rounds alternate between the two, each with its own environment instances)");
    if (tensor_parallel(t))
        log_info0("tools with tensor parallelism: the first rank of each tensor-parallel group runs them and shares "
                  "their results with its group");
    return COLT_OK;
}

void trainer_tools_stop(Trainer *t) {
    trainer_agent_share_free(t);
    tool_worker_free(t->tool_worker);
    tool_worker_free(t->async_tool_worker);
    t->tool_worker = NULL, t->async_tool_worker = NULL;
}

const json_t *trainer_tool_schemas(const Trainer *t) {
    return t->tool_worker ? tool_worker_schemas(t->tool_worker) : NULL;
}

const json_t *trainer_row_tool_schemas(const Trainer *t, const json_t *row) {
    if (!t->tool_worker || !t->cfg->environment_factories) return trainer_tool_schemas(t);
    const json_t *name = json_object_get(row, "environment");
    int e = json_is_string(name) ? tool_worker_environment_index(t->tool_worker, json_string_value(name)) : -1;
    const ToolEnvironment *envs;
    tool_worker_environments(t->tool_worker, &envs);
    /* an unknown name is an error where the row is used (trainer_environment_prompts) */
    return e >= 0 && json_array_size(envs[e].schemas) > 0 ? envs[e].schemas : e >= 0 ? NULL : trainer_tool_schemas(t);
}

/* ---------------------------------------------------------------- server mode's turns
 * The turns go to colt serve in waves: every turn queued since the last wave in one /colt/generate
 * call (the server batches them; its prefix cache keeps each conversation's K/V between its turns, so a
 * later turn computes only the tool results and what follows). Tools keep running in the worker while a
 * wave is out. */
typedef struct ServerTurns {
    ServeClient *client;
    int vocab_size;
    GenerateOptions opt;  /* sampling and stop ids, the same for every turn */
    GenSequence **queued; /* [n_queued] the loop's turns, filled in when their wave comes back */
    int *budgets;         /* [n_queued] each turn's max_new_tokens */
    uint64_t *ids, *finished;
    GenSequence *wave;
    int *replica;         /* [n_queued] each turn's replica: its conversation's, every turn (the prefix cache) */
    int n_queued, n_conversations;
} ServerTurns;

static int server_turns_add(void *ctx, GenSequence *turn, const GenerateOptions *opt, uint64_t id, char *err) {
    (void)err;
    ServerTurns *s = ctx;
    s->queued[s->n_queued] = turn, s->budgets[s->n_queued] = opt->max_new_tokens, s->ids[s->n_queued] = id;
    s->n_queued++;
    return COLT_OK;
}

static bool server_turns_has_work(void *ctx) { return ((ServerTurns *)ctx)->n_queued > 0; }

static int server_turns_step(void *ctx, const uint64_t **finished, int *n_finished, char *err) {
    ServerTurns *s = ctx;
    int n = s->n_queued;
    *finished = s->finished, *n_finished = 0;
    s->n_queued = 0;
    for (int k = 0; k < n; k++) {
        const GenSequence *q = s->queued[k];
        s->wave[k] = (GenSequence){.prompt = q->prompt, .prompt_len = q->prompt_len, .stream = q->stream,
                                   .first_position = q->first_position};
        s->replica[k] = serve_client_replica_of((int)s->ids[k], s->n_conversations, serve_client_replicas(s->client));
    }
    int rc = serve_client_generate_turns(s->client, s->wave, n, &s->opt, s->budgets, s->replica, s->vocab_size, NULL,
                                         err);
    for (int k = 0; k < n; k++) {
        if (rc != 0) {
            gen_sequence_free(&s->wave[k]);
            continue;
        }
        GenSequence *q = s->queued[k]; /* the completion's arrays become the turn's */
        q->tokens = s->wave[k].tokens, q->logprobs = s->wave[k].logprobs;
        q->n_tokens = s->wave[k].n_tokens, q->finish = s->wave[k].finish;
        s->finished[(*n_finished)++] = s->ids[k];
    }
    return rc;
}

/* The conversations of the share (its rows stay: they were set before generation). */
static void free_conversations(AgentShare *a) {
    for (int i = 0; i < a->n; i++) {
        free(a->masks[i]);
        json_decref(a->messages[i]);
    }
    free(a->masks), free(a->calls), free(a->failures), free(a->messages);
    a->masks = NULL, a->calls = NULL, a->failures = NULL, a->messages = NULL;
    a->n = 0;
}

void trainer_agent_share_clear(AgentShare *a) {
    free_conversations(a);
    dataset_free(a->rows);
    json_decref(a->row_list);
    free(a->environment_of), free(a->instance_of);
    memset(a, 0, sizeof *a);
}

void trainer_agent_share_free(Trainer *t) { trainer_agent_share_clear(&t->agent); }

long trainer_environment_instance(const Trainer *t, int j) {
    return t->agent.instance_of ? t->agent.instance_of[j] : j;
}

int trainer_agent_generate_with(const Trainer *t, ToolWorker *worker, ServeClient *server, Engine *engine,
                                AgentShare *a, GenSequence *seqs, int n, const GenerateOptions *go, EngineStats *es,
                                char *err) {
    free_conversations(a);
    AgentConversation *convs = xcalloc((size_t)(n > 0 ? n : 1), sizeof(AgentConversation));
    for (int i = 0; i < n; i++)
        convs[i] = (AgentConversation){.prompt = seqs[i].prompt, .prompt_len = seqs[i].prompt_len,
                                       .stream = seqs[i].stream};
    AgentToolsOptions to = {.tok = t->tok, .template_source = tokenizer_chat_template(t->tok),
                            .chat_template_kwargs = t->cfg->chat_template_kwargs, .format = t->tool_format,
                            .worker = worker, .timeout_s = t->cfg->tool_timeout,
                            .environments = t->cfg->environment_factory != NULL,
                            .environment_of = a->environment_of, .instance_of = a->instance_of};
    AgentToolsGroup group = {.ctx = (void *)t, .leader = runs_tools(t), .share = group_share};
    if (tensor_parallel(t)) to.group = &group;
    AgentToolRunner *runner = agent_tool_runner_create(&to, n);
    AgentTools handler = agent_tool_runner_handler(runner);
    AgentLoopOptions lo = {.max_tool_calling_iterations = t->cfg->max_tool_calling_iterations};
    int rc;
    if (server) {
        size_t each = (size_t)(n > 0 ? n : 1);
        ServerTurns s = {.client = server, .vocab_size = model_config(t->model)->vocab_size, .opt = *go,
                         .queued = xcalloc(each, sizeof(GenSequence *)), .budgets = xcalloc(each, sizeof(int)),
                         .ids = xcalloc(each, sizeof(uint64_t)), .finished = xcalloc(each, sizeof(uint64_t)),
                         .wave = xcalloc(each, sizeof(GenSequence)), .replica = xcalloc(each, sizeof(int)),
                         .n_conversations = n};
        AgentGenerator g = {.ctx = &s, .max_positions = model_config(t->model)->max_position_embeddings,
                            .add = server_turns_add, .has_work = server_turns_has_work, .step = server_turns_step};
        rc = agent_generate_with(&g, convs, n, go, &handler, &lo, err);
        free(s.queued), free(s.budgets), free(s.ids), free(s.finished), free(s.wave), free(s.replica);
    } else if (engine) {
        rc = agent_generate_on(engine, convs, n, go, &handler, &lo, es, err);
    } else {
        rc = agent_generate(t->model, convs, n, go, &t->engine_opts, &handler, &lo, es, err);
    }
    if (rc == 0) {
        a->n = n;
        a->masks = xcalloc((size_t)(n > 0 ? n : 1), sizeof(uint8_t *));
        a->calls = xcalloc((size_t)(n > 0 ? n : 1), sizeof(int));
        a->failures = xcalloc((size_t)(n > 0 ? n : 1), sizeof(int));
        a->messages = xcalloc((size_t)(n > 0 ? n : 1), sizeof(json_t *));
    }
    for (int i = 0; rc == 0 && i < n; i++) {
        /* the conversation's arrays become the sequence's, as engine_generate leaves them */
        seqs[i].tokens = convs[i].tokens, seqs[i].logprobs = convs[i].logprobs;
        seqs[i].n_tokens = convs[i].n_tokens, seqs[i].finish = convs[i].finish;
        a->masks[i] = convs[i].model_mask;
        convs[i].tokens = NULL, convs[i].logprobs = NULL, convs[i].model_mask = NULL;
        agent_tool_runner_counts(runner, i, &a->calls[i], &a->failures[i]);
        a->messages[i] = json_deep_copy(agent_tool_runner_messages(runner, i));
    }
    for (int i = 0; i < n; i++) agent_conversation_free(&convs[i]);
    free(convs);
    agent_tool_runner_free(runner);
    return rc;
}

int trainer_agent_generate(Trainer *t, GenSequence *seqs, int n, const GenerateOptions *go, EngineStats *es,
                           char *err) {
    return trainer_agent_generate_with(t, t->tool_worker, t->server, NULL, &t->agent, seqs, n, go, es, err);
}

int trainer_agent_round(Trainer *t, GenSequence *seqs, int n, const GenerateOptions *go, EngineStats *es, char *err) {
    if (t->server || n == 0) return trainer_agent_generate(t, seqs, n, go, es, err);
    double t0 = time_now();
    Engine *e = trainer_round_engine(t, seqs, n, go, err);
    int rc = e ? trainer_agent_generate_with(t, t->tool_worker, NULL, e, &t->agent, seqs, n, go, es, err) : COLT_ERR;
    if (rc == 0 && es) es->seconds = time_now() - t0;
    trainer_round_engine_done(t, rc);
    return rc;
}

/* ---------------------------------------------------------------- environments */

const char *trainer_reward_name(const Trainer *t, int k) {
    if (t->rewards[k]) return reward_name(t->rewards[k]);
    const ToolEnvironment *envs;
    tool_worker_environments(t->tool_worker, &envs);
    return envs[t->reward_environment[k]].class_name;
}

/* The row as environment j's rollout sees it: TRL's prompt[:-1] + [{**prompt[-1], "content": content +
 * observation}], the other columns as they are (a new object; row is not changed). */
static int row_with_observation(json_t **out, json_t *row, const char *column, const json_t *observation,
                                const char *where, size_t index, char *err) {
    *out = json_copy(row);
    if (json_is_null(observation)) return COLT_OK;
    if (!json_is_string(observation))
        return errorf(err, "%s row %zu: the environment's reset() returned a %s; colt takes None or a string "
                           "(appended to the prompt's last message)",
                      where, index, json_is_array(observation) ? "list (multimodal content)" : "non-string");
    json_t *prompt = json_deep_copy(json_object_get(row, column));
    json_t *last = json_array_get(prompt, json_array_size(prompt) - 1);
    const char *content = json_string_value(json_object_get(last, "content"));
    if (!content) {
        json_decref(prompt);
        return errorf(err, "%s row %zu: the prompt's last message has no text content to append the environment's "
                           "observation to",
                      where, index);
    }
    size_t a = strlen(content), b = json_string_length(observation);
    char *joined = xmalloc(a + b + 1);
    memcpy(joined, content, a);
    memcpy(joined + a, json_string_value(observation), b);
    joined[a + b] = '\0';
    json_object_set_new(last, "content", json_stringn(joined, a + b));
    free(joined);
    json_object_set_new(*out, column, prompt);
    return COLT_OK;
}

/* Waits for the answers of requests[0..n) (-1: answered), each into answers[j]. */
static int wait_all(ToolWorker *w, const long *requests, json_t **answers, int n, char *err) {
    int missing = 0;
    for (int j = 0; j < n; j++) missing += answers[j] == NULL;
    while (missing > 0) {
        long request = -1;
        json_t *answer = NULL;
        int got = tool_worker_poll(w, &request, &answer, 1.0, err);
        if (got == COLT_ERR) return COLT_ERR;
        if (got == 0) continue;
        int j = 0;
        while (j < n && requests[j] != request) j++;
        if (j == n || answers[j]) {
            json_decref(answer);
            continue;
        }
        answers[j] = answer;
        missing--;
    }
    return COLT_OK;
}

/* The answers to one environment request per sample j in [0, n) (d given: reset sample j's instance of its
 * environment (t->agent's instance_of, environment_of) with row rows_of[j] of d; else its get_reward, only
 * where wanted[j] when wanted is given: JSON null elsewhere), all at once, made by the leader and shared with
 * its group: answers[j] a new reference on every rank. */
static int environment_answers(Trainer *t, json_t **answers, int n, Dataset *d, const size_t *rows_of,
                               const bool *wanted, char *err) {
    int rc = COLT_OK;
    if (runs_tools(t)) {
        long *requests = xcalloc((size_t)n + 1, sizeof(long));
        /* every request at once (they run in parallel in the worker; environments are made in this order) */
        for (int j = 0; j < n && rc == 0; j++) {
            requests[j] = -1;
            if (wanted && !wanted[j]) answers[j] = json_null(); /* nothing to wait for */
            else if (d)
                rc = tool_worker_submit_reset_in(t->tool_worker, &requests[j], trainer_environment_instance(t, j),
                                                 t->agent.environment_of ? t->agent.environment_of[j] : 0,
                                                 dataset_row(d, rows_of[j]), err);
            else rc = tool_worker_submit_reward(t->tool_worker, &requests[j], trainer_environment_instance(t, j), err);
        }
        if (rc == 0) rc = wait_all(t->tool_worker, requests, answers, n, err);
        free(requests);
    }
    if (!tensor_parallel(t)) return rc;
    json_t *list = NULL;
    if (runs_tools(t) && rc == 0) {
        list = json_array();
        for (int j = 0; j < n; j++) json_array_append(list, answers[j]);
    }
    rc = group_share_json(t, &list, rc, err);
    if (rc == 0 && !runs_tools(t)) {
        if (json_array_size(list) != (size_t)n)
            rc = errorf(err, "tools: the group leader answered %zu environments, not %d", json_array_size(list), n);
        for (int j = 0; j < n && rc == 0; j++) answers[j] = json_incref(json_array_get(list, j));
    }
    json_decref(list);
    return rc;
}

int trainer_environment_prompts(Trainer *t, Dataset *d, const char *where, const size_t *rows_of, int n, int **ids,
                                int *lens, char **texts, char *err) {
    trainer_agent_share_free(t);
    const TrainConfig *c = t->cfg;
    const char *column = c->dataset_prompt_column ? c->dataset_prompt_column : "prompt";
    json_t **answers = xcalloc((size_t)n + 1, sizeof(json_t *));
    AgentShare *a = &t->agent;
    a->environment_of = xcalloc((size_t)n + 1, sizeof(int));
    a->instance_of = xcalloc((size_t)n + 1, sizeof(long));
    const ToolEnvironment *envs;
    const size_t n_envs = tool_worker_environments(t->tool_worker, &envs);
    int *taken = xcalloc(n_envs + 1, sizeof(int)); /* instances of each environment handed out so far */
    int rc = COLT_OK;
    for (int j = 0; j < n && rc == 0; j++) {
        rc = row_environment(t, &a->environment_of[j], dataset_row(d, rows_of[j]), where, rows_of[j], err);
        if (rc == 0) a->instance_of[j] = (long)taken[a->environment_of[j]]++ * (long)n_envs + a->environment_of[j];
    }
    free(taken);
    if (rc == 0) rc = environment_answers(t, answers, n, d, rows_of, NULL, err);
    json_t *list = json_array();
    for (int j = 0; j < n && rc == 0; j++) {
        const json_t *error = json_object_get(answers[j], "error");
        if (error) {
            rc = errorf(err, "%s row %zu: %s", where, rows_of[j], json_string_value(error));
            break;
        }
        const json_t *observation = json_object_get(answers[j], "observation");
        json_t *row = NULL;
        rc = row_with_observation(&row, dataset_row(d, rows_of[j]), column, observation ? observation : json_null(),
                                  where, rows_of[j], err);
        json_array_append_new(list, row ? row : json_null());
    }
    for (int j = 0; j < n; j++) json_decref(answers[j]);
    free(answers);
    if (rc == 0) rc = dataset_from_rows(&t->agent.rows, list, column, where, err);
    t->agent.row_list = list;
    const int max_position = model_config(t->model)->max_position_embeddings;
    for (int j = 0; j < n && rc == 0; j++) {
        /* rendered with its environment's tools alone (TRL: tools=self._env_tools[name] or None) */
        const json_t *schemas = envs[a->environment_of[j]].schemas;
        rc = prompt_encode_row_tools(&ids[j], &lens[j], &texts[j], t->agent.rows, (size_t)j, t->tok,
                                     c->chat_template_kwargs, json_array_size(schemas) ? schemas : NULL,
                                     c->max_prompt_length, c->dataset, err);
        if (rc == 0 && lens[j] > t->max_prompt_tokens)
            rc = errorf(err, "%s row %zu: its prompt with the environment's observation is %d tokens, more than "
                             "max_prompt_length %d or max_position_embeddings %d - max_completion_length %d allow",
                        where, rows_of[j], lens[j], c->max_prompt_length, max_position, c->max_completion_length);
    }
    return rc;
}

int trainer_environment_rewards(Trainer *t, float *values, int n, int environment, char *err) {
    json_t **answers = xcalloc((size_t)n + 1, sizeof(json_t *));
    const ToolEnvironment *envs;
    tool_worker_environments(t->tool_worker, &envs);
    const char *class_name = envs[environment].class_name;
    /* TRL scores a rollout only when its environment is exactly this class; the others get None */
    bool *scored = xcalloc((size_t)n + 1, sizeof(bool));
    for (int j = 0; j < n; j++)
        scored[j] = envs[t->agent.environment_of ? t->agent.environment_of[j] : 0].class_index == environment;
    int rc = environment_answers(t, answers, n, NULL, NULL, scored, err);
    int lost = 0;
    for (int j = 0; j < n && rc == 0; j++) {
        if (!scored[j]) {
            values[j] = NAN;
            continue;
        }
        const json_t *error = json_object_get(answers[j], "error"), *v = json_object_get(answers[j], "reward");
        /* a tool that held the worker past its limit got it killed, and the environments with it (beyond TRL,
         * which has no limit): those completions get no reward, as for a None */
        if (error && json_is_true(json_object_get(answers[j], "worker_lost"))) values[j] = NAN, lost++;
        else if (error) rc = errorf(err, "completion %d: %s", j, json_string_value(error));
        else if (json_is_number(v) && !isfinite((float)json_number_value(v)))
            rc = errorf(err, "completion %d: %s.get_reward() returned %g, which a 32-bit float cannot hold", j,
                        class_name, json_number_value(v));
        else values[j] = json_is_number(v) ? (float)json_number_value(v) : NAN;
    }
    if (lost > 0)
        log_error("warning: %d of %d completions' environments were lost with a killed tool worker: %s.get_reward() "
                  "gives them no reward",
                  lost, n, class_name);
    for (int j = 0; j < n; j++) json_decref(answers[j]);
    free(answers);
    free(scored);
    return rc;
}

int trainer_tool_reward_function(Trainer *t, double *rewards, bool *has, int n, const char *function,
                                 const json_t *kwargs, const long *envs, double timeout_s, char *err) {
    int rc = COLT_OK;
    if (runs_tools(t))
        rc = tool_worker_reward_function(t->tool_worker, rewards, has, (size_t)n, function, kwargs, envs, timeout_s,
                                         err);
    if (!tensor_parallel(t)) return rc;
    json_t *list = NULL;
    if (runs_tools(t) && rc == 0) {
        list = json_array();
        for (int j = 0; j < n; j++) json_array_append_new(list, has[j] ? json_real(rewards[j]) : json_null());
    }
    rc = group_share_json(t, &list, rc, err);
    if (rc == 0 && !runs_tools(t)) {
        if (json_array_size(list) != (size_t)n)
            rc = errorf(err, "the group leader's tool worker gave %zu rewards, not %d", json_array_size(list), n);
        for (int j = 0; j < n && rc == 0; j++) {
            has[j] = json_is_number(json_array_get(list, j));
            rewards[j] = has[j] ? json_number_value(json_array_get(list, j)) : 0;
        }
    }
    json_decref(list);
    return rc;
}
