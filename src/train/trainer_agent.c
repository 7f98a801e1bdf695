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
#include "serve/serve_client.h"
#include "core/error.h"
#include "core/log.h"
#include "train/trainer_internal.h"

int trainer_tools_start(Trainer *t, char *err) {
    const TrainConfig *c = t->cfg;
    size_t n = json_array_size(c->tools);
    if (n == 0 && !c->environment_factory) return COLT_OK;
    const char *template_source = tokenizer_chat_template(t->tok);
    if (!template_source) return errorf(err, "tools: %s's tokenizer has no chat template to render tools with", c->model);
    if (tool_calls_format_of_template(&t->tool_format, template_source, err) != 0)
        return error_prefix(err, "tools: %s's chat template", c->model);
    const char **names = xcalloc(n, sizeof(char *));
    for (size_t i = 0; i < n; i++) names[i] = json_string_value(json_array_get(c->tools, i));
    int rc = tool_worker_start(&t->tool_worker, names, n, c->environment_factory, NULL, err);
    free(names);
    if (rc != 0) return error_prefix(err, "tools");
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
    if (c->environment_factory)
        log_info0("environment_factory: %s, one instance per completion%s", tool_worker_environment_name(t->tool_worker),
                  tool_worker_environment_has_reward(t->tool_worker) ? ", get_reward() an extra reward" : "");
    char rounds[32];
    snprintf(rounds, sizeof rounds, "%d", c->max_tool_calling_iterations);
    log_info0("tools: %zu (%s), rounds of calls per completion: %s, %g s per call", json_array_size(schemas),
              t->tool_format == TOOL_FORMAT_HERMES ? "<tool_call> JSON" : "Llama 3 JSON",
              c->max_tool_calling_iterations < 0 ? "no bound" : rounds, c->tool_timeout);
    return COLT_OK;
}

void trainer_tools_stop(Trainer *t) {
    trainer_agent_share_free(t);
    tool_worker_free(t->tool_worker);
    t->tool_worker = NULL;
}

const json_t *trainer_tool_schemas(const Trainer *t) {
    return t->tool_worker ? tool_worker_schemas(t->tool_worker) : NULL;
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

void trainer_agent_share_free(Trainer *t) {
    AgentShare *a = &t->agent;
    free_conversations(a);
    dataset_free(a->rows);
    json_decref(a->row_list);
    memset(a, 0, sizeof *a);
}

int trainer_agent_generate(Trainer *t, GenSequence *seqs, int n, const GenerateOptions *go, EngineStats *es,
                           char *err) {
    free_conversations(&t->agent);
    AgentConversation *convs = xcalloc((size_t)(n > 0 ? n : 1), sizeof(AgentConversation));
    for (int i = 0; i < n; i++)
        convs[i] = (AgentConversation){.prompt = seqs[i].prompt, .prompt_len = seqs[i].prompt_len,
                                       .stream = seqs[i].stream};
    AgentToolsOptions to = {.tok = t->tok, .template_source = tokenizer_chat_template(t->tok),
                            .chat_template_kwargs = t->cfg->chat_template_kwargs, .format = t->tool_format,
                            .worker = t->tool_worker, .timeout_s = t->cfg->tool_timeout,
                            .environments = t->cfg->environment_factory != NULL};
    AgentToolRunner *runner = agent_tool_runner_create(&to, n);
    AgentTools handler = agent_tool_runner_handler(runner);
    AgentLoopOptions lo = {.max_tool_calling_iterations = t->cfg->max_tool_calling_iterations};
    int rc;
    if (t->server) {
        size_t each = (size_t)(n > 0 ? n : 1);
        ServerTurns s = {.client = t->server, .vocab_size = model_config(t->model)->vocab_size, .opt = *go,
                         .queued = xcalloc(each, sizeof(GenSequence *)), .budgets = xcalloc(each, sizeof(int)),
                         .ids = xcalloc(each, sizeof(uint64_t)), .finished = xcalloc(each, sizeof(uint64_t)),
                         .wave = xcalloc(each, sizeof(GenSequence)), .replica = xcalloc(each, sizeof(int)),
                         .n_conversations = n};
        AgentGenerator g = {.ctx = &s, .max_positions = model_config(t->model)->max_position_embeddings,
                            .add = server_turns_add, .has_work = server_turns_has_work, .step = server_turns_step};
        rc = agent_generate_with(&g, convs, n, go, &handler, &lo, err);
        free(s.queued), free(s.budgets), free(s.ids), free(s.finished), free(s.wave), free(s.replica);
    } else {
        rc = agent_generate(t->model, convs, n, go, &t->engine_opts, &handler, &lo, es, err);
    }
    AgentShare *a = &t->agent;
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

/* ---------------------------------------------------------------- environments */

const char *trainer_reward_name(const Trainer *t, int k) {
    return t->rewards[k] ? reward_name(t->rewards[k]) : tool_worker_environment_name(t->tool_worker);
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

int trainer_environment_prompts(Trainer *t, Dataset *d, const char *where, const size_t *rows_of, int n, int **ids,
                                int *lens, char **texts, char *err) {
    trainer_agent_share_free(t);
    const TrainConfig *c = t->cfg;
    const char *column = c->dataset_prompt_column ? c->dataset_prompt_column : "prompt";
    long *requests = xcalloc((size_t)n + 1, sizeof(long));
    json_t **answers = xcalloc((size_t)n + 1, sizeof(json_t *));
    int rc = COLT_OK;
    /* every reset at once (they run in parallel in the worker, made in this order) */
    for (int j = 0; j < n && rc == 0; j++)
        rc = tool_worker_submit_reset(t->tool_worker, &requests[j], j, dataset_row(d, rows_of[j]), err);
    if (rc == 0) rc = wait_all(t->tool_worker, requests, answers, n, err);
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
    free(requests);
    if (rc == 0) rc = dataset_from_rows(&t->agent.rows, list, column, where, err);
    t->agent.row_list = list;
    const int max_position = model_config(t->model)->max_position_embeddings;
    for (int j = 0; j < n && rc == 0; j++) {
        rc = trainer_prompt_ids(t, t->agent.rows, (size_t)j, &ids[j], &lens[j], &texts[j], err);
        if (rc == 0 && lens[j] > t->max_prompt_tokens)
            rc = errorf(err, "%s row %zu: its prompt with the environment's observation is %d tokens, more than "
                             "max_prompt_length %d or max_position_embeddings %d - max_completion_length %d allow",
                        where, rows_of[j], lens[j], c->max_prompt_length, max_position, c->max_completion_length);
    }
    return rc;
}

int trainer_environment_rewards(Trainer *t, float *values, int n, char *err) {
    long *requests = xcalloc((size_t)n + 1, sizeof(long));
    json_t **answers = xcalloc((size_t)n + 1, sizeof(json_t *));
    int rc = COLT_OK;
    for (int j = 0; j < n && rc == 0; j++) rc = tool_worker_submit_reward(t->tool_worker, &requests[j], j, err);
    if (rc == 0) rc = wait_all(t->tool_worker, requests, answers, n, err);
    int lost = 0;
    for (int j = 0; j < n && rc == 0; j++) {
        const json_t *error = json_object_get(answers[j], "error"), *v = json_object_get(answers[j], "reward");
        /* a tool that held the worker past its limit got it killed, and the environments with it (beyond TRL,
         * which has no limit): those completions get no reward, as for a None */
        if (error && json_is_true(json_object_get(answers[j], "worker_lost"))) values[j] = NAN, lost++;
        else if (error) rc = errorf(err, "completion %d: %s", j, json_string_value(error));
        else if (json_is_number(v) && !isfinite((float)json_number_value(v)))
            rc = errorf(err, "completion %d: %s.get_reward() returned %g, which a 32-bit float cannot hold", j,
                        tool_worker_environment_name(t->tool_worker), json_number_value(v));
        else values[j] = json_is_number(v) ? (float)json_number_value(v) : NAN;
    }
    if (lost > 0)
        log_error("warning: %d of %d completions' environments were lost with a killed tool worker: %s.get_reward() "
                  "gives them no reward",
                  lost, n, tool_worker_environment_name(t->tool_worker));
    for (int j = 0; j < n; j++) json_decref(answers[j]);
    free(answers);
    free(requests);
    return rc;
}
