/* openai.c — see openai.h. The parameters colt serve reads, with the
 * OpenAI / vLLM names: model, prompt (completions: a string, a list of ids,
 * a list of strings, a list of lists of ids) or messages (chat), n,
 * max_tokens (chat also max_completion_tokens), temperature, top_p, top_k,
 * min_p, repetition_penalty, presence_penalty, frequency_penalty,
 * logit_bias (vLLM's semantics: sampler_apply_penalties), seed, stop, stop_token_ids, ignore_eos,
 * logprobs (completions: 0-20 alternatives; chat: true, top_logprobs 0-20),
 * echo (completions; with max_tokens 0 too: lm-eval's log-likelihoods),
 * stream, stream_options.include_usage, return_token_ids, user; chat also
 * tools, tool_choice "none"/"auto", chat_template_kwargs, response_format text.
 * With tools (and tool_choice "auto"), a chat answer's tool calls are read
 * out of its text in the chat template's format, as vLLM's tool parsers do:
 * message.tool_calls (arguments as a JSON string), finish_reason "tool_calls"
 * (streaming: content deltas for the text before anything that may begin a
 * call, then, at the end, the rest of the content and one delta.tool_calls
 * event per call, as vLLM's streaming tool parsers send them).
 * Top alternatives and the prompt's log-probs come from a scoring forward
 * after the completion (serve_request_want_scores): the model's raw
 * log-softmax, vLLM's default logprobs_mode. What colt cannot honour
 * (best_of != n, suffix, echo or top alternatives while streaming) is refused with a 400 naming it, and
 * so is any parameter not listed: a request is never half-understood. */
#include "serve/openai.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "data/prompt.h"

#define MAX_N 128
#define MAX_PROMPTS 256
#define MAX_CHOICES 1024
#define MAX_STOP_STRINGS 16
#define MAX_STOP_STRING_BYTES 256
#define MAX_STOP_TOKEN_IDS 64

static const char *COMPLETIONS_KEYS[] = {
    "model", "prompt", "n", "max_tokens", "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "seed",
    "stop", "stop_token_ids", "ignore_eos", "logprobs", "stream", "stream_options", "return_token_ids", "user",
    "echo", "best_of", "suffix", "presence_penalty", "frequency_penalty", "logit_bias", NULL};
static const char *CHAT_KEYS[] = {
    "model", "messages", "n", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "min_p",
    "repetition_penalty", "seed", "stop", "stop_token_ids", "ignore_eos", "logprobs", "top_logprobs", "stream",
    "stream_options", "return_token_ids", "user", "tools", "tool_choice", "parallel_tool_calls",
    "chat_template_kwargs", "response_format", "presence_penalty", "frequency_penalty", "logit_bias", NULL};

/* ---------------------------------------------------------------- typed reads (null counts as absent) */

static json_t *field(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return json_is_null(v) ? NULL : v;
}

/* An integer (a JSON integer, or a number with no fraction) in [lo, hi]. */
static int read_int(json_t *o, const char *key, long long lo, long long hi, long long *out, bool *present,
                    const char **param, char *err) {
    json_t *v = field(o, key);
    *present = v != NULL;
    if (!v) return COLT_OK;
    *param = key;
    double d = json_is_real(v) ? json_real_value(v) : 0.5;
    if (json_is_integer(v)) {
        *out = json_integer_value(v);
    } else if (json_is_real(v) && d == floor(d) && fabs(d) < 9e18) {
        *out = (long long)d;
    } else {
        return errorf(err, "'%s' must be an integer", key);
    }
    if (*out < lo || *out > hi) return errorf(err, "'%s' must be in [%lld, %lld] (got %lld)", key, lo, hi, *out);
    return COLT_OK;
}

static int read_number(json_t *o, const char *key, double *out, bool *present, const char **param, char *err) {
    json_t *v = field(o, key);
    *present = v != NULL;
    if (!v) return COLT_OK;
    *param = key;
    if (!json_is_number(v)) return errorf(err, "'%s' must be a number", key);
    *out = json_number_value(v);
    if (!isfinite(*out)) return errorf(err, "'%s' must be finite", key);
    return COLT_OK;
}

static int read_bool(json_t *o, const char *key, bool *out, const char **param, char *err) {
    json_t *v = field(o, key);
    if (!v) return COLT_OK;
    if (!json_is_boolean(v)) {
        *param = key;
        return errorf(err, "'%s' must be true or false", key);
    }
    *out = json_is_true(v);
    return COLT_OK;
}

/* ---------------------------------------------------------------- prompts */

static void add_prompt(OpenAIRequest *r, int *ids, int n, const char *text) {
    r->prompts = xrealloc(r->prompts, sizeof(int *) * (size_t)(r->n_prompts + 1));
    r->prompt_lens = xrealloc(r->prompt_lens, sizeof(int) * (size_t)(r->n_prompts + 1));
    r->prompt_texts = xrealloc(r->prompt_texts, sizeof(char *) * (size_t)(r->n_prompts + 1));
    r->prompt_texts[r->n_prompts] = text ? xstrdup(text) : NULL;
    r->prompts[r->n_prompts] = ids;
    r->prompt_lens[r->n_prompts++] = n;
}

static int ids_prompt(OpenAIRequest *r, json_t *arr, const char *where, int vocab, char *err) {
    size_t n = json_array_size(arr);
    if (n == 0) return errorf(err, "%s is an empty list of token ids", where);
    int *ids = xmalloc(sizeof(int) * n);
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(arr, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= vocab) {
            free(ids);
            return errorf(err, "%s[%zu] must be a token id in [0, %d)", where, i, vocab);
        }
        ids[i] = (int)json_integer_value(v);
    }
    add_prompt(r, ids, (int)n, NULL);
    return COLT_OK;
}

static int text_prompt(OpenAIRequest *r, const char *text, const char *where, const OpenAIContext *ctx, char *err) {
    int *ids = NULL, n = 0;
    if (prompt_encode_text(&ids, &n, ctx->tok, text, false, ctx->vocab_size, where, err) != 0) return COLT_ERR;
    if (n == 0) {
        free(ids);
        return errorf(err, "%s is empty: generation needs at least one token", where);
    }
    add_prompt(r, ids, n, text);
    return COLT_OK;
}

/* prompt: a string, a list of ids, a list of strings or a list of lists of ids. */
static int read_completion_prompts(OpenAIRequest *r, json_t *body, const OpenAIContext *ctx, const char **param,
                                   char *err) {
    json_t *p = field(body, "prompt");
    *param = "prompt";
    if (!p) return errorf(err, "'prompt' is required");
    if (json_is_string(p)) return text_prompt(r, json_string_value(p), "'prompt'", ctx, err);
    if (!json_is_array(p) || json_array_size(p) == 0)
        return errorf(err, "'prompt' must be a string, a list of token ids, a list of strings or a list of lists of "
                           "token ids (non-empty)");
    json_t *first = json_array_get(p, 0);
    if (json_is_integer(first)) return ids_prompt(r, p, "'prompt'", ctx->vocab_size, err);
    if (json_array_size(p) > MAX_PROMPTS) return errorf(err, "'prompt' holds more than %d prompts", MAX_PROMPTS);
    for (size_t i = 0; i < json_array_size(p); i++) {
        json_t *e = json_array_get(p, i);
        char where[64];
        snprintf(where, sizeof where, "'prompt'[%zu]", i);
        int rc;
        if (json_is_string(first) && json_is_string(e)) rc = text_prompt(r, json_string_value(e), where, ctx, err);
        else if (json_is_array(first) && json_is_array(e)) rc = ids_prompt(r, e, where, ctx->vocab_size, err);
        else rc = errorf(err, "%s: a list of prompts must hold only strings or only lists of token ids", where);
        if (rc != 0) return COLT_ERR;
    }
    return COLT_OK;
}

/* messages: a non-empty list of {"role", "content"} (content a string, null, or
 * a list of text parts, joined with newlines as vLLM does); rendered with the chat template. */
static int read_chat_prompt(OpenAIRequest *r, json_t *body, const OpenAIContext *ctx, const char **param, char *err) {
    static const char *ROLES[] = {"system", "developer", "user", "assistant", "tool", NULL};
    json_t *msgs = field(body, "messages"), *tools = NULL, *kwargs = NULL;
    *param = "messages";
    if (!msgs) return errorf(err, "'messages' is required");
    if (!json_is_array(msgs) || json_array_size(msgs) == 0)
        return errorf(err, "'messages' must be a non-empty list of {\"role\", \"content\"} objects");
    json_t *copy = json_deep_copy(msgs);
    int rc = COLT_OK;
    for (size_t i = 0; rc == 0 && i < json_array_size(copy); i++) {
        json_t *m = json_array_get(copy, i), *role = json_object_get(m, "role"), *content;
        if (!json_is_object(m)) {
            rc = errorf(err, "'messages'[%zu] must be an object", i);
            break;
        }
        int k = 0;
        while (json_is_string(role) && ROLES[k] && strcmp(ROLES[k], json_string_value(role)) != 0) k++;
        if (!json_is_string(role) || !ROLES[k]) {
            rc = errorf(err, "'messages'[%zu].role must be one of system, developer, user, assistant, tool", i);
            break;
        }
        /* an assistant's earlier calls come back with their arguments as JSON text (the OpenAI form); the
         * template renders them as the object they were (vLLM parses them back the same way) */
        json_t *calls = json_object_get(m, "tool_calls");
        for (size_t k = 0; json_is_array(calls) && k < json_array_size(calls); k++) {
            json_t *fn = json_object_get(json_array_get(calls, k), "function"), *args = json_object_get(fn, "arguments");
            json_t *parsed = json_is_string(args) ? json_loads(json_string_value(args), JSON_DECODE_ANY, NULL) : NULL;
            if (json_is_object(parsed)) json_object_set(fn, "arguments", parsed);
            json_decref(parsed);
        }
        content = json_object_get(m, "content");
        if (!content || json_is_null(content) || json_is_string(content)) continue;
        if (!json_is_array(content)) {
            rc = errorf(err, "'messages'[%zu].content must be a string, null or a list of text parts", i);
            break;
        }
        size_t cap = 1, len = 0;
        char *joined = xmalloc(cap);
        joined[0] = '\0';
        for (size_t j = 0; j < json_array_size(content); j++) {
            json_t *part = json_array_get(content, j), *type = json_object_get(part, "type"),
                   *text = json_object_get(part, "text");
            if (!json_is_string(type) || strcmp(json_string_value(type), "text") != 0 || !json_is_string(text)) {
                rc = errorf(err, "'messages'[%zu].content[%zu] must be {\"type\": \"text\", \"text\": string} (only "
                                 "text is supported)", i, j);
                break;
            }
            size_t n = json_string_length(text);
            joined = xrealloc(joined, cap = len + n + 2);
            if (j > 0) joined[len++] = '\n';
            memcpy(joined + len, json_string_value(text), n);
            len += n;
            joined[len] = '\0';
        }
        if (rc == 0) json_object_set_new(m, "content", json_stringn(joined, len));
        free(joined);
    }
    int *ids = NULL, n = 0;
    if (rc == 0 && prompt_chat_options(&tools, &kwargs, body, "request", err) != 0) {
        json_t *t = field(body, "tools");
        *param = t && !json_is_array(t) ? "tools" : "chat_template_kwargs";
        rc = COLT_ERR;
    }
    if (rc == 0 && prompt_encode_chat(&ids, &n, ctx->tok, copy, tools, kwargs, ctx->vocab_size, "'messages'", err) != 0)
        rc = COLT_ERR;
    json_t *choice = field(body, "tool_choice");
    bool calls_allowed = !(json_is_string(choice) && !strcmp(json_string_value(choice), "none"));
    if (rc == 0 && tools && json_array_size(tools) > 0 && calls_allowed && ctx->reads_tool_calls) {
        r->tools = json_incref(tools);
        r->tool_format = ctx->tool_format;
    }
    json_decref(copy);
    if (rc != 0) return COLT_ERR;
    if (n == 0) {
        free(ids);
        return errorf(err, "'messages' renders to an empty prompt");
    }
    add_prompt(r, ids, n, NULL);
    return COLT_OK;
}

/* ---------------------------------------------------------------- the request */

static int read_stop(OpenAIRequest *r, json_t *body, const OpenAIContext *ctx, const char **param, char *err) {
    json_t *stop = field(body, "stop");
    *param = "stop";
    if (stop) {
        json_t *list = json_is_string(stop) ? json_pack("[O]", stop) : json_incref(stop);
        int rc = COLT_OK;
        if (!json_is_array(list)) rc = errorf(err, "'stop' must be a string or a list of strings");
        else if (json_array_size(list) > MAX_STOP_STRINGS)
            rc = errorf(err, "'stop' holds more than %d strings", MAX_STOP_STRINGS);
        for (size_t i = 0; rc == 0 && i < json_array_size(list); i++) {
            json_t *s = json_array_get(list, i);
            if (!json_is_string(s) || json_string_length(s) == 0 || json_string_length(s) > MAX_STOP_STRING_BYTES) {
                rc = errorf(err, "'stop'[%zu] must be a non-empty string of at most %d bytes", i,
                            MAX_STOP_STRING_BYTES);
                break;
            }
            r->stop_strings = xrealloc(r->stop_strings, sizeof(char *) * (size_t)(r->n_stop_strings + 1));
            r->stop_strings[r->n_stop_strings++] = xstrdup(json_string_value(s));
        }
        json_decref(list);
        if (rc != 0) return COLT_ERR;
    }
    /* Stop ids: the model's end ids, then the request's stop_token_ids. */
    json_t *ids = field(body, "stop_token_ids");
    size_t n_extra = json_is_array(ids) ? json_array_size(ids) : 0;
    *param = "stop_token_ids";
    if (ids && (!json_is_array(ids) || n_extra > MAX_STOP_TOKEN_IDS))
        return errorf(err, "'stop_token_ids' must be a list of at most %d token ids", MAX_STOP_TOKEN_IDS);
    r->stop_ids = xmalloc(sizeof(int) * (size_t)(ctx->n_eos + n_extra + 1));
    memcpy(r->stop_ids, ctx->eos_ids, sizeof(int) * (size_t)ctx->n_eos);
    r->n_stop_ids = ctx->n_eos;
    for (size_t i = 0; i < n_extra; i++) {
        json_t *v = json_array_get(ids, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= ctx->vocab_size)
            return errorf(err, "'stop_token_ids'[%zu] must be a token id in [0, %d)", i, ctx->vocab_size);
        r->stop_ids[r->n_stop_ids++] = (int)json_integer_value(v);
    }
    return COLT_OK;
}

/* logit_bias: {"token id": bias, ...} (OpenAI's and vLLM's), each bias clamped
 * to [-100, 100] as vLLM does; ids in the vocabulary, each once. */
static int read_logit_bias(OpenAIRequest *r, json_t *body, const OpenAIContext *ctx, const char **param, char *err) {
    json_t *bias = field(body, "logit_bias");
    if (!bias) return COLT_OK;
    *param = "logit_bias";
    if (!json_is_object(bias)) return errorf(err, "'logit_bias' must be an object of token ids to biases");
    size_t n = json_object_size(bias);
    if (n > MAX_LOGIT_BIAS) return errorf(err, "'logit_bias' holds %zu tokens, at most %d", n, MAX_LOGIT_BIAS);
    r->bias_ids = xmalloc(sizeof(int) * (n + 1));
    r->bias_values = xmalloc(sizeof(float) * (n + 1));
    const char *key;
    json_t *value;
    json_object_foreach(bias, key, value) {
        char *end = NULL;
        long id = strtol(key, &end, 10);
        if (!*key || *end || id < 0 || id >= ctx->vocab_size)
            return errorf(err, "'logit_bias' key '%.40s' must be a token id in [0, %d)", key, ctx->vocab_size);
        if (!json_is_number(value) || !isfinite(json_number_value(value)))
            return errorf(err, "'logit_bias'['%s'] must be a number", key);
        for (int k = 0; k < r->n_bias; k++)
            if (r->bias_ids[k] == (int)id) return errorf(err, "'logit_bias' names token %ld twice", id);
        double b = json_number_value(value);
        r->bias_ids[r->n_bias] = (int)id;
        r->bias_values[r->n_bias++] = (float)(b < -100.0 ? -100.0 : b > 100.0 ? 100.0 : b);
    }
    return COLT_OK;
}

/* Settings colt does not have: refused unless they ask for nothing. */
static int refuse_unsupported(json_t *body, OpenAIEndpoint ep, int n, const char **param, char *err) {
    bool present;
    if (ep == OPENAI_COMPLETIONS) {
        long long best_of;
        if (read_int(body, "best_of", 1, MAX_N, &best_of, &present, param, err) != 0) return COLT_ERR;
        if (present && best_of != n) return errorf(err, "'best_of' other than n is not supported");
        json_t *suffix = field(body, "suffix");
        *param = "suffix";
        if (suffix && !(json_is_string(suffix) && json_string_length(suffix) == 0))
            return errorf(err, "'suffix' is not supported");
    } else {
        json_t *choice = field(body, "tool_choice");
        *param = "tool_choice";
        if (choice && !(json_is_string(choice) && (!strcmp(json_string_value(choice), "none") ||
                                                   !strcmp(json_string_value(choice), "auto"))))
            return errorf(err, "'tool_choice' must be \"none\" or \"auto\" (a named or required tool is not supported)");
        bool parallel = true;
        if (read_bool(body, "parallel_tool_calls", &parallel, param, err) != 0) return COLT_ERR;
        json_t *format = field(body, "response_format"), *type = json_object_get(format, "type");
        *param = "response_format";
        if (format && !(json_is_object(format) && json_is_string(type) && !strcmp(json_string_value(type), "text")))
            return errorf(err, "'response_format' other than {\"type\": \"text\"} is not supported");
    }
    json_t *user = field(body, "user");
    *param = "user";
    if (user && !json_is_string(user)) return errorf(err, "'user' must be a string");
    return COLT_OK;
}

static int read_sampling(SamplingParams *sp, bool *seeded, json_t *body, const OpenAIContext *ctx,
                         uint64_t random_seed, const char **param, char *err) {
    *sp = ctx->defaults;
    sp->seed = random_seed;
    double d;
    long long k;
    bool present;
    if (read_number(body, "temperature", &d, &present, param, err) != 0) return COLT_ERR;
    if (present) sp->temperature = (float)d;
    if (read_number(body, "top_p", &d, &present, param, err) != 0) return COLT_ERR;
    if (present) sp->top_p = (float)d;
    if (read_number(body, "min_p", &d, &present, param, err) != 0) return COLT_ERR;
    if (present) sp->min_p = (float)d;
    if (read_number(body, "repetition_penalty", &d, &present, param, err) != 0) return COLT_ERR;
    if (present) sp->repetition_penalty = (float)d;
    if (read_number(body, "presence_penalty", &d, &present, param, err) != 0) return COLT_ERR;
    if (present) sp->presence_penalty = (float)d;
    if (read_number(body, "frequency_penalty", &d, &present, param, err) != 0) return COLT_ERR;
    if (present) sp->frequency_penalty = (float)d;
    if (read_int(body, "top_k", -1, 1 << 30, &k, &present, param, err) != 0) return COLT_ERR;
    if (present) sp->top_k = k < 0 ? 0 : (int)k; /* vLLM's -1: off */
    if (read_int(body, "seed", INT64_MIN, INT64_MAX, &k, &present, param, err) != 0) return COLT_ERR;
    if (present) sp->seed = (uint64_t)k;
    *seeded = present;
    if (sampling_params_validate(sp, err) != 0) {
        const char *names[] = {"temperature", "top_k", "top_p", "min_p", "repetition_penalty", "presence_penalty",
                               "frequency_penalty"};
        *param = NULL;
        for (int i = 0; i < 7; i++)
            if (strncmp(err, names[i], strlen(names[i])) == 0) *param = names[i];
        return COLT_ERR;
    }
    return COLT_OK;
}

static bool known_key(const char *key, const char **keys) {
    for (int i = 0; keys[i]; i++)
        if (strcmp(key, keys[i]) == 0) return true;
    return false;
}

int openai_parse_request(OpenAIRequest *r, OpenAIEndpoint endpoint, const char *body_text, size_t len,
                         const OpenAIContext *ctx, uint64_t random_seed, const char **param, char *err) {
    memset(r, 0, sizeof *r);
    r->endpoint = endpoint;
    *param = NULL;
    json_error_t jerr;
    json_t *body = json_loadb(body_text, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &jerr);
    if (!body) return errorf(err, "the body is not valid JSON: %s (line %d, column %d)", jerr.text, jerr.line,
                             jerr.column);
    int rc = COLT_OK;
    const char *key;
    json_t *value;
    long long v;
    bool present;
    if (!json_is_object(body)) {
        rc = errorf(err, "the body must be a JSON object");
        goto done;
    }
    json_object_foreach(body, key, value) {
        if (!known_key(key, endpoint == OPENAI_CHAT ? CHAT_KEYS : COMPLETIONS_KEYS)) {
            *param = NULL;
            rc = errorf(err, "unrecognized request argument: '%.100s'", key);
            goto done;
        }
    }
    json_t *model = field(body, "model");
    *param = "model";
    if (model && !json_is_string(model)) {
        rc = errorf(err, "'model' must be a string");
        goto done;
    }
    if (model && strcmp(json_string_value(model), ctx->model_name) != 0) {
        rc = errorf(err, "the model '%.200s' does not exist; this server has '%s'", json_string_value(model),
                    ctx->model_name);
        goto done;
    }
    if (read_int(body, "n", 1, MAX_N, &v, &present, param, err) != 0) goto fail;
    r->n = present ? (int)v : 1;
    if ((endpoint == OPENAI_CHAT ? read_chat_prompt(r, body, ctx, param, err)
                                 : read_completion_prompts(r, body, ctx, param, err)) != 0)
        goto fail;
    *param = "n";
    if (r->n_prompts * r->n > MAX_CHOICES) {
        rc = errorf(err, "%d prompts x n = %d completions, more than %d in one request", r->n_prompts, r->n,
                    MAX_CHOICES);
        goto done;
    }
    if (refuse_unsupported(body, endpoint, r->n, param, err) != 0) goto fail;
    if (read_sampling(&r->opt.sampling, &r->seeded, body, ctx, random_seed, param, err) != 0) goto fail;
    if (read_stop(r, body, ctx, param, err) != 0) goto fail;
    r->opt.stop_ids = r->stop_ids;
    r->opt.n_stop_ids = r->n_stop_ids;
    if (read_logit_bias(r, body, ctx, param, err) != 0) goto fail;
    r->opt.logit_bias_ids = r->bias_ids;
    r->opt.logit_bias_values = r->bias_values;
    r->opt.n_logit_bias = r->n_bias;
    if (read_bool(body, "ignore_eos", &r->opt.ignore_eos, param, err) != 0) goto fail;
    if (read_bool(body, "stream", &r->stream, param, err) != 0) goto fail;
    if (read_bool(body, "return_token_ids", &r->return_token_ids, param, err) != 0) goto fail;
    json_t *so = field(body, "stream_options");
    *param = "stream_options";
    if (so && !r->stream) {
        rc = errorf(err, "'stream_options' is only allowed with \"stream\": true");
        goto done;
    }
    if (so && !json_is_object(so)) {
        rc = errorf(err, "'stream_options' must be an object such as {\"include_usage\": true}");
        goto done;
    }
    if (so && read_bool(so, "include_usage", &r->include_usage, param, err) != 0) goto fail;
    if (endpoint == OPENAI_COMPLETIONS) {
        if (read_int(body, "logprobs", 0, 20, &v, &present, param, err) != 0) goto fail;
        r->logprobs = present;
        r->top_logprobs = present ? (int)v : 0;
        if (read_bool(body, "echo", &r->echo, param, err) != 0) goto fail;
    } else {
        if (read_bool(body, "logprobs", &r->logprobs, param, err) != 0) goto fail;
        if (read_int(body, "top_logprobs", 0, 20, &v, &present, param, err) != 0) goto fail;
        if (present && v > 0 && !r->logprobs) {
            rc = errorf(err, "'top_logprobs' needs \"logprobs\": true");
            goto done;
        }
        r->top_logprobs = present ? (int)v : 0;
    }
    r->scores = r->logprobs && (r->echo || r->top_logprobs > 0);
    *param = r->echo ? "echo" : endpoint == OPENAI_CHAT ? "top_logprobs" : "logprobs";
    if (r->scores && r->stream) {
        rc = errorf(err, "'%s' is not supported with \"stream\": true (ask without streaming)", *param);
        goto done;
    }
    if (r->echo && r->stream) {
        rc = errorf(err, "'echo' is not supported with \"stream\": true (ask without streaming)");
        goto done;
    }
    if (r->scores && !ctx->can_score) {
        rc = errorf(err, "'%s' needs the prompt scored, which a tensor-parallel colt serve does not do yet; "
                         "serve with --tensor_parallel_size 1", *param);
        goto done;
    }

    /* Lengths: max_tokens (chat: or max_completion_tokens) against the server's limit and the context. */
    long long max_tokens = 0;
    bool given = false;
    const char *max_key = "max_tokens";
    /* max_tokens 0 with echo: the prompt's log-probs alone (vLLM's, lm-eval's log-likelihoods) */
    if (read_int(body, "max_tokens", r->echo ? 0 : 1, INT32_MAX, &max_tokens, &given, param, err) != 0) goto fail;
    if (!given && endpoint == OPENAI_CHAT) {
        max_key = "max_completion_tokens";
        if (read_int(body, max_key, 1, INT32_MAX, &max_tokens, &given, param, err) != 0) goto fail;
    }
    int longest = 0;
    for (int i = 0; i < r->n_prompts; i++)
        if (r->prompt_lens[i] > longest) longest = r->prompt_lens[i];
    *param = given ? max_key : "messages";
    if (given && max_tokens > ctx->max_tokens_limit) {
        rc = errorf(err, "'%s' is %lld, above this server's limit of %d", max_key, max_tokens, ctx->max_tokens_limit);
        goto done;
    }
    if (!given) { /* completions: OpenAI's 16; chat: what the context has room for */
        max_tokens = endpoint == OPENAI_COMPLETIONS ? 16 : ctx->max_model_len - longest;
        if (max_tokens > ctx->max_tokens_limit) max_tokens = ctx->max_tokens_limit;
    }
    if (longest + (max_tokens < 1 ? 1 : max_tokens) > ctx->max_model_len || (max_tokens < 1 && !r->echo)) {
        *param = endpoint == OPENAI_CHAT ? "messages" : "prompt";
        rc = errorf(err, "this model's maximum context length is %d tokens; the request asks for %lld (%d in the "
                         "prompt, %lld for the completion): shorten the prompt or max_tokens",
                    ctx->max_model_len, longest + max_tokens, longest, max_tokens < 1 ? 1 : max_tokens);
        goto done;
    }
    r->opt.max_new_tokens = (int)max_tokens;
    goto done;
fail:
    rc = COLT_ERR;
done:
    json_decref(body);
    if (rc != 0) openai_request_free(r);
    return rc;
}

void openai_take_prompts(OpenAIRequest *r) { r->prompts = NULL; /* n_prompts and prompt_lens stay for the usage */ }

void openai_request_free(OpenAIRequest *r) {
    for (int i = 0; r->prompts && i < r->n_prompts; i++) free(r->prompts[i]);
    for (int i = 0; r->prompt_texts && i < r->n_prompts; i++) free(r->prompt_texts[i]);
    free(r->prompts), free(r->prompt_lens), free(r->stop_ids), free(r->prompt_texts);
    free(r->bias_ids), free(r->bias_values);
    for (int i = 0; i < r->n_stop_strings; i++) free(r->stop_strings[i]);
    free(r->stop_strings);
    json_decref(r->tools);
    memset(r, 0, sizeof *r);
}

char *openai_error_json(const char *message, const char *type, const char *param, int code) {
    json_t *e = json_pack("{s:{s:s,s:s,s:o,s:i}}", "error", "message", message, "type", type, "param",
                          param ? json_string(param) : json_null(), "code", code);
    if (!e) e = json_pack("{s:{s:s,s:s,s:n,s:i}}", "error", "message", "(message not valid UTF-8)", "type", type,
                          "param", "code", code);
    char *s = json_dumps(e, JSON_COMPACT);
    json_decref(e);
    return s;
}

/* ---------------------------------------------------------------- a choice's text */

/* Streamed text is decoded incrementally, as vLLM's detokenizer does: each update decodes the context (the
 * last committed chunk) followed by the ids after it, and what that text adds past the context's own text is
 * the new text. A chunk is committed once its text does not end in U+FFFD (a character whose bytes have not
 * all come). The context makes the decoder treat the new ids as it does inside the whole text (sentencepiece's
 * stripped leading space, byte-fallback runs, characters split over tokens). */
#define MAX_PENDING_IDS 32 /* ids held back for an incomplete character before they are committed anyway */

static bool ends_incomplete(const char *s, size_t n) { return n >= 3 && memcmp(s + n - 3, "\xEF\xBF\xBD", 3) == 0; }

/* Appends to out the ids of tokens[from, to) that decoding keeps: tokenizer_decode_generated leaves out ids
 * past the vocabulary, skip_special_tokens the special ones. Returns how many. */
static int keep_decoded_ids(const Tokenizer *tok, const int *tokens, int from, int to, int *out) {
    int n = 0, vocab = tokenizer_vocab_size(tok);
    for (int i = from; i < to; i++)
        if (tokens[i] < vocab && !tokenizer_is_special(tok, tokens[i])) out[n++] = tokens[i];
    return n;
}

static int decode_counted(ChoiceText *ct, const Tokenizer *tok, const int *ids, int n, char **text, size_t *len,
                          char *err) {
    ct->n_decoded += n;
    return tokenizer_decode_len(tok, ids, (size_t)n, true, text, len, err);
}

/* text = text[0, keep) + add[0, add_len), up to add's first NUL (text is a C string). Returns whether add had one. */
static bool text_replace_tail(ChoiceText *ct, size_t keep, const char *add, size_t add_len) {
    const char *nul = memchr(add, '\0', add_len);
    if (nul) add_len = (size_t)(nul - add);
    if (keep + add_len + 1 > ct->text_cap) {
        ct->text_cap = 2 * (keep + add_len + 1) + 64;
        ct->text = xrealloc(ct->text, ct->text_cap);
    }
    memcpy(ct->text + keep, add, add_len);
    ct->text_len = keep + add_len;
    ct->text[ct->text_len] = '\0';
    return nul != NULL;
}

/* Commits the text so far as that of tokens [0, n); kept (n_kept ids) are those of [read_offset, n). */
static int commit_text(ChoiceText *ct, const Tokenizer *tok, const int *kept, int n_kept, int n, char *err) {
    ct->committed_len = ct->text_len;
    ct->read_offset = n;
    if (n_kept == 0) return COLT_OK; /* nothing kept: the context stays */
    ct->context_ids = xrealloc(ct->context_ids, sizeof(int) * (size_t)n_kept);
    memcpy(ct->context_ids, kept, sizeof(int) * (size_t)n_kept);
    ct->n_context = n_kept;
    free(ct->context_text);
    ct->context_text = NULL;
    return decode_counted(ct, tok, ct->context_ids, n_kept, &ct->context_text, &ct->context_len, err);
}

/* Brings text to tokens [0, n). *rewritten: the decoder changed committed text (a byte-fallback run that turned
 * out invalid), so the whole text was decoded again. */
static int text_advance(ChoiceText *ct, const int *tokens, int n, const Tokenizer *tok, bool *rewritten, char *err) {
    *rewritten = false;
    if (ct->text_closed) {
        ct->read_offset = n;
        return COLT_OK;
    }
    int *window = xmalloc(sizeof(int) * (size_t)(ct->n_context + n - ct->read_offset + 1));
    if (ct->n_context) memcpy(window, ct->context_ids, sizeof(int) * (size_t)ct->n_context);
    int *kept = window + ct->n_context, n_kept = keep_decoded_ids(tok, tokens, ct->read_offset, n, kept);
    char *w = NULL;
    size_t w_len = 0;
    int rc = COLT_OK;
    if (n_kept == 0) { /* nothing pending: the text stays */
        ct->read_offset = n;
        goto done;
    }
    if ((rc = decode_counted(ct, tok, window, ct->n_context + n_kept, &w, &w_len, err)) != 0) goto done;
    bool extends =
        w_len >= ct->context_len && (!ct->context_len || memcmp(w, ct->context_text, ct->context_len) == 0);
    size_t skip = extends ? ct->context_len : 0; /* the new text, or all of the window's when it disagrees */
    bool wait = ends_incomplete(w + skip, w_len - skip) && n_kept < MAX_PENDING_IDS;
    if (extends) {
        bool nul = text_replace_tail(ct, ct->committed_len, w + skip, w_len - skip);
        if (!wait) {
            ct->text_closed = nul;
            rc = commit_text(ct, tok, kept, n_kept, n, err);
        }
    } else if (!wait) { /* the window's text disagrees with what was committed: decode the whole text */
        char *all = NULL;
        size_t all_len = 0;
        int *ids = xmalloc(sizeof(int) * (size_t)(n + 1));
        rc = decode_counted(ct, tok, ids, keep_decoded_ids(tok, tokens, 0, n, ids), &all, &all_len, err);
        free(ids);
        if (rc == 0) {
            ct->text_closed = text_replace_tail(ct, 0, all, all_len);
            *rewritten = true;
            rc = commit_text(ct, tok, kept, n_kept, n, err);
        }
        free(all);
    } /* else: the window disagrees only until its last character completes (a byte-fallback run is decoded whole) */
done:
    free(w);
    free(window);
    return rc;
}

/* The first place in text[from, len) where a stop string begins (NULL: none). */
static char *first_stop_string(char *text, size_t from, size_t len, const OpenAIRequest *req) {
    char *cut = NULL;
    for (int i = 0; from <= len && i < req->n_stop_strings; i++) {
        char *at = strstr(text + from, req->stop_strings[i]);
        if (at && (!cut || at < cut)) cut = at;
    }
    return cut;
}

/* The whole completion decoded once (the final text, or the cut when a stop string was found), as a whole answer's. */
static int text_final(ChoiceText *ct, const GenSequence *g, int n_text, const ChoiceProgress *p,
                      const OpenAIRequest *req, const Tokenizer *tok, bool *hit_stop_string, char *err) {
    int *kept = xmalloc(sizeof(int) * (size_t)(n_text + 1));
    char *text = NULL;
    size_t bytes = 0;
    int rc = decode_counted(ct, tok, kept, keep_decoded_ids(tok, g->tokens, 0, n_text, kept), &text, &bytes, err);
    if (rc != 0) goto done;
    size_t len = strlen(text);
    char *cut = first_stop_string(text, 0, len, req);
    if (cut) {
        *cut = '\0';
        len = (size_t)(cut - text);
        ct->finished = true;
        ct->finish_reason = "stop";
        *hit_stop_string = true;
    } else if (p->done) {
        ct->finished = true;
        ct->finish_reason = p->finish == FINISH_STOP ? "stop" : "length";
    }
    free(ct->text);
    ct->text = text;
    ct->text_len = len;
    ct->text_cap = bytes + 1;
    if (!ct->finished) { /* the window saw a stop string the whole text has not (a decoder rewriting its text) */
        ct->text_closed = len < bytes;
        int n_kept = keep_decoded_ids(tok, g->tokens, ct->read_offset, n_text, kept);
        rc = commit_text(ct, tok, kept, n_kept, n_text, err);
    }
done:
    free(kept);
    return rc;
}

int choice_text_update(ChoiceText *ct, const GenSequence *g, const ChoiceProgress *p, const OpenAIRequest *req,
                       const Tokenizer *tok, bool *hit_stop_string, char *err) {
    *hit_stop_string = false;
    if (ct->finished || (p->n_ready == ct->n_tokens && !p->done && ct->text)) return COLT_OK;
    if (!p->done && !req->stream && req->n_stop_strings == 0) { /* nobody reads the text before the end */
        ct->n_tokens = p->n_ready;
        return COLT_OK;
    }
    int n_text = p->n_ready - (p->done && p->finish == FINISH_STOP && p->n_ready > 0 ? 1 : 0);
    int rc = COLT_OK;
    if (p->done) {
        rc = text_final(ct, g, n_text, p, req, tok, hit_stop_string, err);
    } else {
        if (!ct->text) text_replace_tail(ct, 0, "", 0);
        size_t old_committed = ct->committed_len, longest = 0;
        for (int i = 0; i < req->n_stop_strings; i++)
            if (strlen(req->stop_strings[i]) > longest) longest = strlen(req->stop_strings[i]);
        bool rewritten = false;
        if (text_advance(ct, g->tokens, n_text, tok, &rewritten, err) != 0) return COLT_ERR;
        /* a new match ends in the new text: it begins at most longest - 1 bytes before it */
        size_t back = longest > 0 ? longest - 1 : 0;
        size_t from = rewritten || old_committed < back ? 0 : old_committed - back;
        if (first_stop_string(ct->text, from, ct->text_len, req))
            rc = text_final(ct, g, n_text, p, req, tok, hit_stop_string, err);
    }
    if (rc != 0) return rc;
    ct->n_tokens = p->n_ready;
    if (ct->streamed > ct->text_len) ct->streamed = ct->text_len; /* a stop string cut into what was held back */
    return COLT_OK;
}

size_t choice_text_stream_end(const ChoiceText *ct, const OpenAIRequest *req) {
    size_t len = ct->text ? strlen(ct->text) : 0;
    if (ct->finished) return len;
    size_t end = len;
    while (ends_incomplete(ct->text, end)) end -= 3; /* an incomplete character */
    size_t hold = 0;
    for (int i = 0; i < req->n_stop_strings; i++) { /* a tail that may be the start of a stop string */
        size_t s_len = strlen(req->stop_strings[i]);
        for (size_t k = s_len - 1; k > hold; k--)
            if (k <= end && memcmp(ct->text + end - k, req->stop_strings[i], k) == 0) {
                hold = k;
                break;
            }
    }
    end -= hold;
    if (req->endpoint == OPENAI_CHAT && req->tools) { /* only what is content whatever comes next */
        const char *marker = memchr(ct->text, req->tool_format == TOOL_FORMAT_LLAMA3 ? '{' : '<', end);
        size_t safe = marker ? (size_t)(marker - ct->text) : end;
        while (safe > 0 && isspace((unsigned char)ct->text[safe - 1])) safe--;
        if (safe > 0 && isspace((unsigned char)ct->text[0])) safe = 0;
        if (safe < end) end = safe;
    }
    return end > ct->streamed ? end : ct->streamed;
}

void choice_text_free(ChoiceText *ct) {
    free(ct->text), free(ct->context_ids), free(ct->context_text);
    memset(ct, 0, sizeof *ct);
}

/* ---------------------------------------------------------------- responses */

static json_t *text_value(const char *s, size_t n) {
    json_t *v = json_stringn(s, n);
    return v ? v : json_string("");
}

static json_t *logprob_value(float lp) { return json_real(isfinite(lp) ? lp : -9999.0); }

static size_t utf8_chars(const char *s) {
    size_t n = 0;
    for (; *s; s++) n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

/* Each token's text, as what it adds to the text of the ids before it,
 * decoded over a window of the WINDOW ids before it (a token's text may
 * depend on its neighbours: byte-level pieces of one character, sentencepiece
 * spaces); a token that adds nothing shows as itself. pieces[n], malloc'd. */
#define WINDOW 6
static char **token_pieces(const Tokenizer *tok, const int *ids, int n, bool skip_special) {
    char **pieces = xmalloc(sizeof(char *) * (size_t)(n > 0 ? n : 1));
    for (int t = 0; t < n; t++) {
        int from = t > WINDOW ? t - WINDOW : 0;
        char *before = NULL, *with = NULL, *piece = NULL;
        if (tokenizer_decode_generated(tok, ids + from, (size_t)(t - from), skip_special, &before, NULL) != 0)
            before = xstrdup("");
        if (tokenizer_decode_generated(tok, ids + from, (size_t)(t - from + 1), skip_special, &with, NULL) != 0)
            with = xstrdup("");
        size_t n_before = strlen(before);
        if (strncmp(with, before, n_before) == 0 && with[n_before]) piece = xstrdup(with + n_before);
        else if (tokenizer_decode_generated(tok, &ids[t], 1, false, &piece, NULL) != 0) piece = xstrdup("");
        free(before), free(with);
        pieces[t] = piece;
    }
    return pieces;
}

/* The log-probs of tokens [from, to) of choice g, in the endpoint's shape.
 * A token's text is what it adds to the text of the tokens before it
 * (token_pieces: " there", not "there", after "Once upon a time,"); a
 * special token, which adds nothing, shows as itself. text_offset counts
 * characters, each token's starting where the texts before it end (vLLM's
 * count): *chars holds that count at from and is moved to to, so a stream's
 * chunks go on from each other. Linear in the tokens shown: each text is
 * decoded over a short window, never from the completion's start. */
static json_t *logprobs_json(const OpenAIRequest *req, const GenSequence *g, int from, int to, const Tokenizer *tok,
                             size_t *chars) {
    json_t *tokens = json_array(), *lps = json_array(), *offsets = json_array(), *content = json_array();
    int window = from > WINDOW ? WINDOW : from; /* the ids before from that the first texts are decoded after */
    char **pieces = token_pieces(tok, g->tokens + from - window, to - from + window, true);
    for (int k = from; k < to; k++) {
        const char *piece = pieces[k - from + window];
        if (req->endpoint == OPENAI_COMPLETIONS) {
            json_array_append_new(tokens, text_value(piece, strlen(piece)));
            json_array_append_new(lps, logprob_value(g->logprobs[k]));
            json_array_append_new(offsets, json_integer((json_int_t)*chars));
        } else {
            json_t *bytes = json_array();
            for (const unsigned char *b = (const unsigned char *)piece; *b; b++)
                json_array_append_new(bytes, json_integer(*b));
            json_array_append_new(content, json_pack("{s:o,s:o,s:o,s:[]}", "token", text_value(piece, strlen(piece)),
                                                     "logprob", logprob_value(g->logprobs[k]), "bytes", bytes,
                                                     "top_logprobs"));
        }
        *chars += utf8_chars(piece);
    }
    for (int k = 0; k < to - from + window; k++) free(pieces[k]);
    free(pieces);
    json_t *out;
    if (req->endpoint == OPENAI_COMPLETIONS) {
        out = json_pack("{s:o,s:o,s:n,s:o}", "tokens", tokens, "token_logprobs", lps, "top_logprobs", "text_offset",
                        offsets);
        json_decref(content);
    } else {
        out = json_pack("{s:o}", "content", content);
        json_decref(tokens), json_decref(lps), json_decref(offsets);
    }
    return out;
}

static char *one_token_text(const Tokenizer *tok, int id) {
    char *s = NULL;
    if (tokenizer_decode_generated(tok, &id, 1, false, &s, NULL) != 0) s = xstrdup("");
    return s;
}

static json_t *bytes_json(const char *s) {
    json_t *bytes = json_array();
    for (const unsigned char *b = (const unsigned char *)s; *b; b++) json_array_append_new(bytes, json_integer(*b));
    return bytes;
}

/* Log-probs from the scoring forward (ts: the prompt's and the completion's
 * tokens), positions [from, to) of the prompt + completion ids. Completions:
 * vLLM's shape — each position's top_logprobs a dict of its own token and the
 * k most likely (k + 1 entries at most), text_offset in characters from the
 * first position shown; the first prompt token (echo) has null log-probs.
 * Chat: OpenAI's, the k most likely per token. */
static json_t *scored_logprobs_json(const OpenAIRequest *req, const GenSequence *g, const TokenScores *ts, int from,
                                    int to, const Tokenizer *tok) {
    int n = g->prompt_len + (to - g->prompt_len);
    int *ids = xmalloc(sizeof(int) * (size_t)(n > 0 ? n : 1));
    memcpy(ids, g->prompt, sizeof(int) * (size_t)g->prompt_len);
    if (to > g->prompt_len) memcpy(ids + g->prompt_len, g->tokens, sizeof(int) * (size_t)(to - g->prompt_len));
    /* the prompt's pieces as its text shows them (specials included); the completion's as its text (skipped) */
    char **prompt_pieces = token_pieces(tok, ids, g->prompt_len, false);
    char **completion_pieces = token_pieces(tok, g->tokens, to - g->prompt_len, true);
    json_t *tokens = json_array(), *lps = json_array(), *tops = json_array(), *offsets = json_array(),
           *content = json_array();
    size_t offset = 0;
    for (int t = from; t < to; t++) {
        const char *piece = t < g->prompt_len ? prompt_pieces[t] : completion_pieces[t - g->prompt_len];
        const int *best = ts->top_ids + (size_t)t * ts->k;
        const float *best_lp = ts->top_logprobs + (size_t)t * ts->k;
        if (req->endpoint == OPENAI_COMPLETIONS) {
            json_array_append_new(tokens, text_value(piece, strlen(piece)));
            json_array_append_new(offsets, json_integer((json_int_t)offset));
            if (t == 0) {
                json_array_append_new(lps, json_null());
                json_array_append_new(tops, json_null());
            } else {
                json_array_append_new(lps, logprob_value(ts->logprob[t]));
                json_t *d = json_object();
                json_object_set_new(d, piece, logprob_value(ts->logprob[t]));
                for (int q = 0; q < ts->k; q++) {
                    if (best[q] == ids[t]) continue;
                    char *s = one_token_text(tok, best[q]);
                    json_object_set_new(d, s, logprob_value(best_lp[q]));
                    free(s);
                }
                json_array_append_new(tops, d);
            }
        } else {
            json_t *alts = json_array();
            for (int q = 0; q < ts->k; q++) {
                char *s = one_token_text(tok, best[q]);
                json_array_append_new(alts, json_pack("{s:o,s:o,s:o}", "token", text_value(s, strlen(s)), "logprob",
                                                      logprob_value(best_lp[q]), "bytes", bytes_json(s)));
                free(s);
            }
            json_array_append_new(content, json_pack("{s:o,s:o,s:o,s:o}", "token", text_value(piece, strlen(piece)),
                                                     "logprob", logprob_value(ts->logprob[t]), "bytes",
                                                     bytes_json(piece), "top_logprobs", alts));
        }
        offset += utf8_chars(piece);
    }
    for (int t = 0; t < g->prompt_len; t++) free(prompt_pieces[t]);
    for (int t = 0; t < to - g->prompt_len; t++) free(completion_pieces[t]);
    free(prompt_pieces), free(completion_pieces), free(ids);
    json_t *out;
    if (req->endpoint == OPENAI_COMPLETIONS) {
        out = json_pack("{s:o,s:o,s:o,s:o}", "tokens", tokens, "token_logprobs", lps, "top_logprobs", tops,
                        "text_offset", offsets);
        json_decref(content);
    } else {
        out = json_pack("{s:o}", "content", content);
        json_decref(tokens), json_decref(lps), json_decref(tops), json_decref(offsets);
    }
    return out;
}

static json_t *ids_json(const int *ids, int n) {
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_integer(ids[i]));
    return a;
}

static json_t *usage_json(const OpenAIRequest *req, ServeRequest *sr, const ChoiceText *texts) {
    long long prompt = 0, completion = 0;
    for (int i = 0; i < req->n_prompts; i++) prompt += req->prompt_lens[i];
    for (int i = 0; i < serve_request_choices(sr); i++) completion += texts[i].n_tokens;
    return json_pack("{s:I,s:I,s:I}", "prompt_tokens", (json_int_t)prompt, "completion_tokens",
                     (json_int_t)completion, "total_tokens", (json_int_t)(prompt + completion));
}

/* A chat answer's message. With the request's tools, the calls in its text
 * are read in the chat template's format (agent/tool_calls.h, TRL's and
 * transformers' reading) and written as vLLM's tool parsers write them:
 * content (null when empty), tool_calls [{id, type "function", function
 * {name, arguments: the arguments as JSON text}}], and *finish "tool_calls".
 * Text that holds no well-formed call stays plain content. */
static json_t *chat_message(const OpenAIRequest *req, const char *text, const OpenAIContext *ctx, const char *id,
                            int choice, const char **finish) {
    json_t *parsed = NULL, *calls = NULL;
    char err[ERR_LEN];
    if (req->tools && tool_calls_parse(&parsed, ctx->tool_format, "", text, text, NULL, req->tools, err) == 0)
        calls = json_object_get(parsed, "tool_calls");
    if (json_array_size(calls) == 0) {
        json_decref(parsed);
        return json_pack("{s:s,s:o}", "role", "assistant", "content", text_value(text, strlen(text)));
    }
    json_t *out = json_array();
    for (size_t k = 0; k < json_array_size(calls); k++) {
        json_t *fn = json_object_get(json_array_get(calls, k), "function"), *args = json_object_get(fn, "arguments");
        char *args_text = json_is_string(args) ? xstrdup(json_string_value(args)) : json_dumps(args, JSON_ENCODE_ANY);
        char call_id[128];
        snprintf(call_id, sizeof call_id, "call_%s_%d_%zu", id, choice, k);
        json_array_append_new(out, json_pack("{s:s,s:s,s:{s:O,s:s}}", "id", call_id, "type", "function", "function",
                                             "name", json_object_get(fn, "name"), "arguments", args_text));
        free(args_text);
    }
    json_t *content = json_object_get(parsed, "content");
    json_t *m = json_pack("{s:s,s:O,s:o}", "role", "assistant", "content",
                          json_is_string(content) && json_string_length(content) > 0 ? content : json_null(),
                          "tool_calls", out);
    json_decref(parsed);
    *finish = "tool_calls";
    return m;
}

static const char *object_name(const OpenAIRequest *req, bool chunk) {
    if (req->endpoint == OPENAI_COMPLETIONS) return "text_completion";
    return chunk ? "chat.completion.chunk" : "chat.completion";
}

char *openai_response_json(const OpenAIRequest *req, ServeRequest *sr, const ChoiceText *texts, const char *id,
                           int64_t created, const OpenAIContext *ctx) {
    json_t *choices = json_array();
    for (int i = 0; i < serve_request_choices(sr); i++) {
        const ChoiceText *ct = &texts[i];
        const GenSequence *g = serve_request_sequence(sr, i);
        json_t *c = json_object();
        json_object_set_new(c, "index", json_integer(i));
        const char *finish = ct->finish_reason ? ct->finish_reason : "length";
        char *echo = NULL;
        if (req->echo) { /* the prompt as given, or its ids' text */
            const char *given = req->prompt_texts[i / req->n];
            if (given) echo = xstrdup(given);
            else if (tokenizer_decode_generated(ctx->tok, g->prompt, (size_t)g->prompt_len, false, &echo, NULL) != 0)
                echo = xstrdup("");
        }
        const char *completion = ct->text ? ct->text : "";
        size_t n_echo = echo ? strlen(echo) : 0, n_text = n_echo + strlen(completion);
        char *full = xmalloc(n_text + 1);
        memcpy(full, echo ? echo : "", n_echo);
        memcpy(full + n_echo, completion, n_text - n_echo + 1);
        json_t *text = text_value(full, n_text);
        free(full), free(echo);
        if (req->endpoint == OPENAI_COMPLETIONS) json_object_set_new(c, "text", text);
        else { /* chat has no echo: text is the completion's */
            json_decref(text);
            json_object_set_new(c, "message", chat_message(req, completion, ctx, id, i, &finish));
        }
        const TokenScores *ts = serve_request_scores(sr, i);
        json_t *lp = json_null();
        if (req->logprobs && req->scores && ts)
            lp = scored_logprobs_json(req, g, ts, req->echo ? 0 : g->prompt_len, g->prompt_len + ct->n_tokens,
                                      ctx->tok);
        else if (req->logprobs) {
            size_t chars = 0;
            lp = logprobs_json(req, g, 0, ct->n_tokens, ctx->tok, &chars);
        }
        json_object_set_new(c, "logprobs", lp);
        json_object_set_new(c, "finish_reason", json_string(finish));
        if (req->return_token_ids) {
            json_object_set_new(c, "token_ids", ids_json(g->tokens, ct->n_tokens));
            json_object_set_new(c, "prompt_token_ids", ids_json(g->prompt, g->prompt_len));
        }
        json_array_append_new(choices, c);
    }
    json_t *o = json_pack("{s:s,s:s,s:I,s:s,s:o,s:o}", "id", id, "object", object_name(req, false), "created",
                          (json_int_t)created, "model", ctx->model_name, "choices", choices, "usage",
                          usage_json(req, sr, texts));
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

static void append_event(char **buf, size_t *len, json_t *o) {
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    size_t n = strlen(s);
    *buf = xrealloc(*buf, *len + n + 9);
    memcpy(*buf + *len, "data: ", 6);
    memcpy(*buf + *len + 6, s, n);
    memcpy(*buf + *len + 6 + n, "\n\n", 3);
    *len += n + 8;
    free(s);
}

static json_t *chunk_json(const OpenAIRequest *req, const char *id, int64_t created, const OpenAIContext *ctx,
                          json_t *choice) {
    return json_pack("{s:s,s:s,s:I,s:s,s:[o]}", "id", id, "object", object_name(req, true), "created",
                     (json_int_t)created, "model", ctx->model_name, "choices", choice);
}

/* The end of a streamed chat answer with tools: its message as the
 * non-streamed answer has it (chat_message), sent as what it adds to the text
 * streamed so far ([0, from) of the text: content before any call): the rest
 * of the content, then each call in one delta, the finish reason on the last
 * event. Content that does not continue what was sent (text after a call
 * replaces text before it in the parse) cannot be taken back: only the calls
 * follow then. */
static void stream_tool_answer(char **buf, size_t *len, const OpenAIRequest *req, ServeRequest *sr, ChoiceText *ct,
                               int i, size_t from, bool first_chunk, const char *id, int64_t created,
                               const OpenAIContext *ctx) {
    const GenSequence *g = serve_request_sequence(sr, i);
    const char *text = ct->text ? ct->text : "", *finish = ct->finish_reason;
    json_t *message = chat_message(req, text, ctx, id, i, &finish);
    const char *content = json_string_value(json_object_get(message, "content"));
    const json_t *calls = json_object_get(message, "tool_calls");
    size_t n_calls = json_array_size(calls);
    const char *rest = content && strncmp(content, text, from) == 0 ? content + from : "";
    for (size_t k = 0; k <= n_calls; k++) {
        if (k == 0 && !*rest && !first_chunk && n_calls > 0) continue; /* nothing to add before the calls */
        json_t *c = json_object(), *d = json_object();
        json_object_set_new(c, "index", json_integer(i));
        if (k == 0 && first_chunk) json_object_set_new(d, "role", json_string("assistant"));
        if (k == 0) json_object_set_new(d, "content", json_string(rest));
        else {
            json_t *call = json_deep_copy(json_array_get(calls, k - 1));
            json_object_set_new(call, "index", json_integer((json_int_t)(k - 1)));
            json_object_set_new(d, "tool_calls", json_pack("[o]", call));
        }
        json_object_set_new(c, "delta", d);
        if (req->logprobs && ct->n_tokens > ct->n_logprobs_sent) {
            json_object_set_new(c, "logprobs", logprobs_json(req, g, ct->n_logprobs_sent, ct->n_tokens, ctx->tok, &ct->logprob_chars));
            ct->n_logprobs_sent = ct->n_tokens;
        } else {
            json_object_set_new(c, "logprobs", json_null());
        }
        bool last = k == n_calls;
        json_object_set_new(c, "finish_reason", last ? json_string(finish) : json_null());
        if (last && req->return_token_ids) json_object_set_new(c, "token_ids", ids_json(g->tokens, ct->n_tokens));
        append_event(buf, len, chunk_json(req, id, created, ctx, c));
    }
    json_decref(message);
}

void openai_stream_chunk(char **buf, size_t *len, const OpenAIRequest *req, ServeRequest *sr, ChoiceText *ct, int i,
                         size_t from, size_t to, bool first_chunk, const char *id, int64_t created,
                         const OpenAIContext *ctx) {
    const GenSequence *g = serve_request_sequence(sr, i);
    bool last = ct->finished && to == strlen(ct->text ? ct->text : "");
    if (last && req->endpoint == OPENAI_CHAT && req->tools) {
        stream_tool_answer(buf, len, req, sr, ct, i, from, first_chunk, id, created, ctx);
        return;
    }
    json_t *c = json_object(), *delta = text_value(ct->text ? ct->text + from : "", to - from);
    json_object_set_new(c, "index", json_integer(i));
    if (req->endpoint == OPENAI_COMPLETIONS) {
        json_object_set_new(c, "text", delta);
    } else {
        json_t *d = json_object();
        if (first_chunk) json_object_set_new(d, "role", json_string("assistant"));
        json_object_set_new(d, "content", delta);
        json_object_set_new(c, "delta", d);
    }
    if (req->logprobs && ct->n_tokens > ct->n_logprobs_sent) {
        json_object_set_new(c, "logprobs", logprobs_json(req, g, ct->n_logprobs_sent, ct->n_tokens, ctx->tok, &ct->logprob_chars));
        ct->n_logprobs_sent = ct->n_tokens;
    } else {
        json_object_set_new(c, "logprobs", json_null());
    }
    json_object_set_new(c, "finish_reason", last ? json_string(ct->finish_reason) : json_null());
    if (last && req->return_token_ids) json_object_set_new(c, "token_ids", ids_json(g->tokens, ct->n_tokens));
    append_event(buf, len, chunk_json(req, id, created, ctx, c));
}

void openai_stream_usage(char **buf, size_t *len, const OpenAIRequest *req, ServeRequest *sr, const ChoiceText *texts,
                         const char *id, int64_t created, const OpenAIContext *ctx) {
    append_event(buf, len,
                 json_pack("{s:s,s:s,s:I,s:s,s:[],s:o}", "id", id, "object", object_name(req, true), "created",
                           (json_int_t)created, "model", ctx->model_name, "choices", "usage",
                           usage_json(req, sr, texts)));
}

void openai_stream_done(char **buf, size_t *len) {
    *buf = xrealloc(*buf, *len + 15);
    memcpy(*buf + *len, "data: [DONE]\n\n", 15);
    *len += 14;
}

void openai_stream_error(char **buf, size_t *len, const char *message) {
    json_t *e = json_pack("{s:{s:s,s:s,s:n,s:i}}", "error", "message", message, "type", "server_error", "param",
                          "code", 500);
    if (e) append_event(buf, len, e);
}

char *openai_models_json(const OpenAIContext *ctx, int64_t created) {
    json_t *o = json_pack("{s:s,s:[{s:s,s:s,s:I,s:s,s:i}]}", "object", "list", "data", "id", ctx->model_name, "object",
                          "model", "created", (json_int_t)created, "owned_by", "colt", "max_model_len",
                          ctx->max_model_len);
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}
