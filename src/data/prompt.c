/* prompt.c — see prompt.h. One BOS rule and one chat rendering for every
 * command that feeds a model a prompt. */
#include "data/prompt.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "tokenizer/chat_template.h"

int prompt_encode_text(int **ids, int *n_ids, const Tokenizer *tok, const char *text, bool chat_rendered,
                       int vocab_size, const char *where, char *err) {
    *ids = NULL;
    *n_ids = 0;
    int *body = NULL;
    size_t n_body = 0;
    if (tokenizer_encode(tok, text, strlen(text), &body, &n_body, err) != 0) return error_prefix(err, "%s", where);
    bool bos = !chat_rendered && tokenizer_add_bos(tok) && tokenizer_bos_id(tok) >= 0;
    int n = (int)n_body + (bos ? 1 : 0);
    int *out = xmalloc(sizeof(int) * (size_t)(n > 0 ? n : 1));
    if (bos) out[0] = tokenizer_bos_id(tok);
    if (n_body) memcpy(out + (bos ? 1 : 0), body, sizeof(int) * n_body);
    free(body);
    for (int i = 0; vocab_size > 0 && i < n; i++)
        if (out[i] >= vocab_size) {
            int bad = out[i];
            free(out);
            return errorf(err, "%s: tokenizer gave id %d, outside the model's vocabulary (%d)", where, bad, vocab_size);
        }
    *ids = out;
    *n_ids = n;
    return COLT_OK;
}

int prompt_render_chat(char **out, const Tokenizer *tok, json_t *messages, json_t *tools, json_t *chat_template_kwargs,
                       bool add_generation_prompt, const char *where, char *err) {
    const char *tmpl = tokenizer_chat_template(tok);
    if (!tmpl) return errorf(err, "%s: the tokenizer has no chat template (tokenizer_config.json's chat_template or "
                                   "chat_template.jinja)", where);
    if (!json_is_array(messages)) return errorf(err, "%s: \"messages\" must be a list", where);
    ChatTemplateOptions opt = {.add_generation_prompt = add_generation_prompt,
                               .bos_token = tokenizer_bos_token(tok),
                               .eos_token = tokenizer_eos_token(tok),
                               .tools = tools,
                               .variables = chat_template_kwargs};
    if (chat_template_render_json(out, tmpl, messages, &opt, err) != 0) return error_prefix(err, "%s", where);
    return COLT_OK;
}

int prompt_encode_chat(int **ids, int *n_ids, const Tokenizer *tok, json_t *messages, json_t *tools,
                       json_t *chat_template_kwargs, int vocab_size, const char *where, char *err) {
    char *rendered = NULL;
    *ids = NULL;
    *n_ids = 0;
    if (prompt_render_chat(&rendered, tok, messages, tools, chat_template_kwargs, true, where, err) != 0)
        return COLT_ERR;
    int rc = prompt_encode_text(ids, n_ids, tok, rendered, true, vocab_size, where, err);
    free(rendered);
    return rc;
}

int prompt_chat_options(json_t **tools, json_t **chat_template_kwargs, json_t *obj, const char *where, char *err) {
    *tools = json_object_get(obj, "tools");
    *chat_template_kwargs = json_object_get(obj, "chat_template_kwargs");
    if (json_is_null(*tools)) *tools = NULL; /* tools=None */
    if (json_is_null(*chat_template_kwargs)) *chat_template_kwargs = NULL;
    if (*tools && !json_is_array(*tools))
        return errorf(err, "%s: \"tools\" must be a list of tool definitions (JSON-schema objects)", where);
    if (*chat_template_kwargs && !json_is_object(*chat_template_kwargs))
        return errorf(err, "%s: \"chat_template_kwargs\" must be an object of template variables, e.g. "
                           "{\"enable_thinking\": false}", where);
    return COLT_OK;
}

/* Chat template for conversational rows, else the text with BOS when the
 * tokenizer adds it (TRL tokenizes plain prompts with the tokenizer's
 * defaults). */
int prompt_encode_row(int **ids, int *n, char **text, const Dataset *d, size_t row, const Tokenizer *tok,
                      const json_t *template_kwargs, int max_prompt_length, const char *dataset_name, char *err) {
    return prompt_encode_row_tools(ids, n, text, d, row, tok, template_kwargs, NULL, max_prompt_length, dataset_name,
                                   err);
}

int prompt_encode_row_tools(int **ids, int *n, char **text, const Dataset *d, size_t row, const Tokenizer *tok,
                            const json_t *template_kwargs, const json_t *tools, int max_prompt_length,
                            const char *dataset_name, char *err) {
    if (dataset_prompt_text_tools(text, d, row, tok, template_kwargs, tools, err) != 0) return COLT_ERR;
    char where[300];
    snprintf(where, sizeof where, "%s row %zu", dataset_name, row);
    int *all = NULL, total = 0;
    if (prompt_encode_text(&all, &total, tok, *text, dataset_is_conversational(d, row), 0, where, err) != 0) {
        free(*text);
        *text = NULL;
        return COLT_ERR;
    }
    int keep = max_prompt_length > 0 && total > max_prompt_length ? max_prompt_length : total; /* 0: no cut */
    if (keep == 0) {
        free(all);
        *ids = NULL;
        free(*text);
        *text = NULL;
        return errorf(err, "row %zu: the prompt is empty after tokenization", row);
    }
    memmove(all, all + (total - keep), sizeof(int) * (size_t)keep); /* the left part dropped */
    *ids = all;
    *n = keep;
    return COLT_OK;
}

int prompt_stop_ids(int *stop_ids, const ModelConfig *mc, const Tokenizer *tok) {
    int n = 0;
    for (int i = 0; i < mc->n_eos; i++) stop_ids[n++] = mc->eos_token_ids[i];
    if (tok && tokenizer_eos_id(tok) >= 0) stop_ids[n++] = tokenizer_eos_id(tok);
    return n;
}

int prompt_regex_constraint(TokenRegex **out, const Tokenizer *tok, int vocab_size, const char *pattern, char *err) {
    *out = NULL;
    if (!tokenizer_byte_level(tok))
        return errorf(err, "regex '%s': structured outputs need a byte-level BPE tokenizer (GPT-2 style: Qwen, "
                           "Llama 3), whose tokens stand for fixed bytes; this model's tokenizer is not one",
                      pattern);
    const char **bytes = xcalloc((size_t)(vocab_size > 0 ? vocab_size : 1), sizeof(char *));
    uint32_t *lens = xcalloc((size_t)(vocab_size > 0 ? vocab_size : 1), sizeof(uint32_t));
    for (int v = 0; v < vocab_size; v++) {
        size_t len;
        bytes[v] = tokenizer_token_bytes(tok, v, &len);
        lens[v] = (uint32_t)len;
    }
    int rc = token_regex_create(out, pattern, bytes, lens, vocab_size, err);
    free(bytes);
    free(lens);
    return rc;
}
