/* trainer_agent.c — tool calling in the trainer (TRL 1.16's tools=[...] and
 * max_tool_calling_iterations): the tool worker's life, prompts rendered with
 * the tools' schemas, and a round's multi-turn generation
 * (agent/agent_loop.h over agent/agent_tools.h). The loss side is one mask:
 * Sample.model_mask (trainer_micro_batch.c). Not here: environments. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/agent_loop.h"
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
    int rc = agent_generate(t->model, convs, n, go, &t->engine_opts, &handler, &lo, es, err);
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
