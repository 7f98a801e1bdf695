/* trainer_agent.c — tool calling in the trainer (TRL 1.16's tools=[...] and
 * max_tool_calling_iterations): the tool worker's life, prompts rendered with
 * the tools' schemas, and a round's multi-turn generation
 * (agent/agent_loop.h over agent/agent_tools.h) on this process's engine or,
 * in server mode, on colt serve. The loss side is one mask:
 * Sample.model_mask (trainer_micro_batch.c). Not here: environments. */
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
    if (n == 0) return COLT_OK;
    const char *template_source = tokenizer_chat_template(t->tok);
    if (!template_source) return errorf(err, "tools: %s's tokenizer has no chat template to render tools with", c->model);
    if (tool_calls_format_of_template(&t->tool_format, template_source, err) != 0)
        return error_prefix(err, "tools: %s's chat template", c->model);
    const char **names = xcalloc(n, sizeof(char *));
    for (size_t i = 0; i < n; i++) names[i] = json_string_value(json_array_get(c->tools, i));
    int rc = tool_worker_start(&t->tool_worker, names, n, NULL, NULL, err);
    free(names);
    if (rc != 0) return error_prefix(err, "tools");
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
    int n_queued;
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
    }
    int rc = serve_client_generate_turns(s->client, s->wave, n, &s->opt, s->budgets, s->vocab_size, NULL, err);
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

void trainer_agent_share_free(Trainer *t) {
    AgentShare *a = &t->agent;
    for (int i = 0; i < a->n; i++) {
        free(a->masks[i]);
        json_decref(a->messages[i]);
    }
    free(a->masks), free(a->calls), free(a->failures), free(a->messages);
    memset(a, 0, sizeof *a);
}

int trainer_agent_generate(Trainer *t, GenSequence *seqs, int n, const GenerateOptions *go, EngineStats *es,
                           char *err) {
    trainer_agent_share_free(t);
    AgentConversation *convs = xcalloc((size_t)(n > 0 ? n : 1), sizeof(AgentConversation));
    for (int i = 0; i < n; i++)
        convs[i] = (AgentConversation){.prompt = seqs[i].prompt, .prompt_len = seqs[i].prompt_len,
                                       .stream = seqs[i].stream};
    AgentToolsOptions to = {.tok = t->tok, .template_source = tokenizer_chat_template(t->tok),
                            .chat_template_kwargs = t->cfg->chat_template_kwargs, .format = t->tool_format,
                            .worker = t->tool_worker, .timeout_s = t->cfg->tool_timeout};
    AgentToolRunner *runner = agent_tool_runner_create(&to, n);
    AgentTools handler = agent_tool_runner_handler(runner);
    AgentLoopOptions lo = {.max_tool_calling_iterations = t->cfg->max_tool_calling_iterations};
    int rc;
    if (t->server) {
        size_t each = (size_t)(n > 0 ? n : 1);
        ServerTurns s = {.client = t->server, .vocab_size = model_config(t->model)->vocab_size, .opt = *go,
                         .queued = xcalloc(each, sizeof(GenSequence *)), .budgets = xcalloc(each, sizeof(int)),
                         .ids = xcalloc(each, sizeof(uint64_t)), .finished = xcalloc(each, sizeof(uint64_t)),
                         .wave = xcalloc(each, sizeof(GenSequence))};
        AgentGenerator g = {.ctx = &s, .max_positions = model_config(t->model)->max_position_embeddings,
                            .add = server_turns_add, .has_work = server_turns_has_work, .step = server_turns_step};
        rc = agent_generate_with(&g, convs, n, go, &handler, &lo, err);
        free(s.queued), free(s.budgets), free(s.ids), free(s.finished), free(s.wave);
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
