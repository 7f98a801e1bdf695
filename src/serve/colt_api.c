/* colt_api.c — see colt_api.h. Every key is checked; a key not listed is
 * refused, so a request is never half-understood. */
#include "serve/colt_api.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

#define MAX_COMPLETIONS 65536 /* one trainer rank's share of a round */
#define MAX_STOP_IDS 64
#define MAX_STREAM ((1ull << 31) - 1)

static const char *GENERATE_KEYS[] = {"prompts", "streams", "max_tokens", "temperature", "top_k", "top_p", "min_p",
                                      "repetition_penalty", "seed", "stop_token_ids", "first_positions", NULL};
/* The binary body's settings: the JSON form's keys but the prompts' own (their records carry them) */
static const char *BINARY_SETTING_KEYS[] = {"max_tokens", "temperature", "top_k", "top_p", "min_p",
                                            "repetition_penalty", "seed", "stop_token_ids", NULL};
static const char *SYNC_KEYS[] = {"port", "timeout", "nccl", "host", "lora", NULL};
static const char *LORA_KEYS[] = {"r", "lora_alpha", "use_rslora", "target_modules", NULL};

static int check_keys(json_t *o, const char *const *keys, const char *where, char *err) {
    const char *key;
    json_t *v;
    json_object_foreach(o, key, v) {
        int k = 0;
        while (keys[k] && strcmp(keys[k], key) != 0) k++;
        if (!keys[k]) return errorf(err, "%s: unknown key '%.100s'", where, key);
    }
    return COLT_OK;
}

/* An integer in [lo, hi]; absent: *out unchanged. */
static int read_int(json_t *o, const char *key, long long lo, long long hi, long long *out, char *err) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return COLT_OK;
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return errorf(err, "/colt/generate: '%s' must be an integer in [%lld, %lld]", key, lo, hi);
    *out = json_integer_value(v);
    return COLT_OK;
}

static int read_float(json_t *o, const char *key, float *out, char *err) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return COLT_OK;
    if (!json_is_number(v) || !isfinite((float)json_number_value(v)))
        return errorf(err, "/colt/generate: '%s' must be a finite number", key);
    *out = (float)json_number_value(v);
    return COLT_OK;
}

/* An array of n_min .. n_max integers in [0, below). */
static int read_ids(json_t *a, int **out, int *n, int n_min, int n_max, long long below, const char *what, char *err) {
    if (!json_is_array(a) || json_array_size(a) < (size_t)n_min || json_array_size(a) > (size_t)n_max)
        return errorf(err, "/colt/generate: %s must be an array of %d .. %d token ids", what, n_min, n_max);
    *n = (int)json_array_size(a);
    *out = xmalloc(sizeof(int) * (size_t)(*n > 0 ? *n : 1));
    for (int i = 0; i < *n; i++) {
        json_t *v = json_array_get(a, (size_t)i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= below)
            return errorf(err, "/colt/generate: %s[%d] is not a token id below %lld", what, i, below);
        (*out)[i] = (int)json_integer_value(v);
    }
    return COLT_OK;
}

/* *out = the n integers of array a (its size checked by the caller), each in [lo, hi]; key names them. */
static int read_int_each(json_t *a, const char *key, int n, long long lo, long long hi, int **out, char *err) {
    *out = xcalloc((size_t)n, sizeof(int));
    for (int i = 0; i < n; i++) {
        json_t *v = json_array_get(a, (size_t)i);
        if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
            return errorf(err, "/colt/generate: %s[%d] must be an integer in [%lld, %lld]", key, i, lo, hi);
        (*out)[i] = (int)json_integer_value(v);
    }
    return COLT_OK;
}

static unsigned char *put_u32(unsigned char *p, uint32_t v) {
    for (int b = 0; b < 4; b++) p[b] = (unsigned char)(v >> (8 * b));
    return p + 4;
}

static uint32_t get_u32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static int parse_sampling(ColtGenerateRequest *r, json_t *o, const ColtApiContext *ctx, char *err);

static int parse_generate(ColtGenerateRequest *r, json_t *o, const ColtApiContext *ctx, char *err) {
    if (!json_is_object(o)) return errorf(err, "/colt/generate: the body must be a JSON object");
    if (check_keys(o, GENERATE_KEYS, "/colt/generate", err) != 0) return COLT_ERR;
    json_t *prompts = json_object_get(o, "prompts"), *streams = json_object_get(o, "streams");
    if (!json_is_array(prompts) || json_array_size(prompts) < 1 || json_array_size(prompts) > MAX_COMPLETIONS)
        return errorf(err, "/colt/generate: 'prompts' must be an array of 1 .. %d prompts (arrays of token ids)",
                      MAX_COMPLETIONS);
    int n = (int)json_array_size(prompts);
    if (!json_is_array(streams) || json_array_size(streams) != (size_t)n)
        return errorf(err, "/colt/generate: 'streams' must be an array of %d RNG stream ids, one per prompt", n);
    r->prompts = xcalloc((size_t)n, sizeof(int *));
    r->prompt_lens = xcalloc((size_t)n, sizeof(int));
    r->streams = xcalloc((size_t)n, sizeof(uint64_t));
    r->n_prompts = n;
    long long max_tokens = 16;
    json_t *budgets = json_object_get(o, "max_tokens"), *positions = json_object_get(o, "first_positions");
    if (json_is_array(budgets)) { /* one per prompt; the request's own is the largest */
        if (json_array_size(budgets) != (size_t)n)
            return errorf(err, "/colt/generate: 'max_tokens' as an array needs one budget per prompt (%d)", n);
        if (read_int_each(budgets, "max_tokens", n, 1, ctx->max_tokens_limit, &r->max_tokens_each, err) != 0)
            return COLT_ERR;
        max_tokens = 1;
        for (int i = 0; i < n; i++)
            if (r->max_tokens_each[i] > max_tokens) max_tokens = r->max_tokens_each[i];
    } else if (read_int(o, "max_tokens", 1, ctx->max_tokens_limit, &max_tokens, err) != 0) {
        return COLT_ERR;
    }
    r->opt.max_new_tokens = (int)max_tokens;
    if (positions && !json_is_null(positions)) {
        if (!json_is_array(positions) || json_array_size(positions) != (size_t)n)
            return errorf(err, "/colt/generate: 'first_positions' must be an array of %d RNG positions, one per prompt",
                          n);
        if (read_int_each(positions, "first_positions", n, 0, ctx->max_model_len, &r->first_positions, err) != 0)
            return COLT_ERR;
    }
    for (int i = 0; i < n; i++) {
        char what[48];
        snprintf(what, sizeof what, "prompts[%d]", i);
        if (read_ids(json_array_get(prompts, (size_t)i), &r->prompts[i], &r->prompt_lens[i], 1, ctx->max_model_len,
                     ctx->vocab_size, what, err) != 0)
            return COLT_ERR;
        int budget = r->max_tokens_each ? r->max_tokens_each[i] : r->opt.max_new_tokens;
        if (r->prompt_lens[i] + budget > ctx->max_model_len)
            return errorf(err, "/colt/generate: prompts[%d] has %d tokens; with max_tokens %d that is more than the "
                               "server's max_model_len %d",
                          i, r->prompt_lens[i], budget, ctx->max_model_len);
        json_t *s = json_array_get(streams, (size_t)i);
        if (!json_is_integer(s) || json_integer_value(s) < 0 || (uint64_t)json_integer_value(s) > MAX_STREAM)
            return errorf(err, "/colt/generate: streams[%d] must be an integer in [0, 2^31-1]", i);
        r->streams[i] = (uint64_t)json_integer_value(s);
    }
    return parse_sampling(r, o, ctx, err);
}

/* The sampling settings and stop ids of o (either form of the body). */
static int parse_sampling(ColtGenerateRequest *r, json_t *o, const ColtApiContext *ctx, char *err) {
    SamplingParams *sp = &r->opt.sampling;
    *sp = (SamplingParams){.temperature = 1.0f, .top_p = 1.0f, .repetition_penalty = 1.0f};
    long long top_k = 0, seed = 0;
    if (read_float(o, "temperature", &sp->temperature, err) != 0 || read_float(o, "top_p", &sp->top_p, err) != 0 ||
        read_float(o, "min_p", &sp->min_p, err) != 0 ||
        read_float(o, "repetition_penalty", &sp->repetition_penalty, err) != 0 ||
        read_int(o, "top_k", 0, ctx->vocab_size, &top_k, err) != 0 ||
        read_int(o, "seed", 0, INT64_MAX, &seed, err) != 0)
        return COLT_ERR;
    sp->top_k = (int)top_k;
    sp->seed = (uint64_t)seed;
    if (sampling_params_validate(sp, err) != 0) return error_prefix(err, "/colt/generate");
    json_t *stop = json_object_get(o, "stop_token_ids");
    if (stop && !json_is_null(stop)) {
        if (read_ids(stop, &r->stop_ids, &r->opt.n_stop_ids, 0, MAX_STOP_IDS, ctx->vocab_size, "stop_token_ids",
                     err) != 0)
            return COLT_ERR;
    } else {
        r->opt.n_stop_ids = ctx->n_eos;
        r->stop_ids = xmalloc(sizeof(int) * (size_t)(ctx->n_eos > 0 ? ctx->n_eos : 1));
        memcpy(r->stop_ids, ctx->eos_ids, sizeof(int) * (size_t)ctx->n_eos);
    }
    r->opt.stop_ids = r->stop_ids;
    return COLT_OK;
}

/* The binary body (colt_api.h): its settings object, then the prompts' records, each checked as the JSON
 * form's; nothing may follow the last. */
static int parse_generate_binary(ColtGenerateRequest *r, const unsigned char *p, size_t len, const ColtApiContext *ctx,
                                 char *err) {
    const unsigned char *end = p + len;
    if (len < 12) return errorf(err, "/colt/generate: the binary body ends inside its header (%zu bytes)", len);
    uint32_t settings_len = get_u32(p + 8);
    p += 12;
    if ((size_t)(end - p) < (size_t)settings_len + 4)
        return errorf(err, "/colt/generate: the binary body ends inside its settings (%u bytes announced)", settings_len);
    json_error_t je;
    json_t *o = json_loadb((const char *)p, settings_len, 0, &je);
    if (!json_is_object(o)) {
        json_decref(o);
        return errorf(err, "/colt/generate: the binary body's settings are not a JSON object");
    }
    p += settings_len;
    long long max_tokens = 16;
    int rc = check_keys(o, BINARY_SETTING_KEYS, "/colt/generate (binary body's settings)", err) != 0 ||
                     read_int(o, "max_tokens", 1, ctx->max_tokens_limit, &max_tokens, err) != 0 ||
                     parse_sampling(r, o, ctx, err) != 0
                 ? COLT_ERR
                 : COLT_OK;
    json_decref(o);
    if (rc != 0) return COLT_ERR;
    uint32_t n = get_u32(p);
    p += 4;
    if (n < 1 || n > MAX_COMPLETIONS)
        return errorf(err, "/colt/generate: the binary body holds %u prompts, not 1 .. %d", n, MAX_COMPLETIONS);
    r->prompts = xcalloc(n, sizeof(int *));
    r->prompt_lens = xcalloc(n, sizeof(int));
    r->streams = xcalloc(n, sizeof(uint64_t));
    r->first_positions = xcalloc(n, sizeof(int));
    r->max_tokens_each = xcalloc(n, sizeof(int));
    r->n_prompts = (int)n;
    r->opt.max_new_tokens = 1;
    for (uint32_t i = 0; i < n; i++) {
        if (end - p < 16) return errorf(err, "/colt/generate: the binary body ends inside prompt %u", i);
        uint32_t stream = get_u32(p), position = get_u32(p + 4), budget = get_u32(p + 8), count = get_u32(p + 12);
        p += 16;
        if (stream > MAX_STREAM) return errorf(err, "/colt/generate: prompt %u: stream %u is above 2^31-1", i, stream);
        if (position > (uint32_t)ctx->max_model_len)
            return errorf(err, "/colt/generate: prompt %u: first position %u is past max_model_len %d", i, position,
                          ctx->max_model_len);
        if (budget > (uint32_t)ctx->max_tokens_limit)
            return errorf(err, "/colt/generate: prompt %u: max_tokens %u is above the server's limit %d", i, budget,
                          ctx->max_tokens_limit);
        if (count < 1 || count > (uint32_t)ctx->max_model_len)
            return errorf(err, "/colt/generate: prompt %u has %u token ids, not 1 .. %d", i, count, ctx->max_model_len);
        if ((size_t)(end - p) < 4 * (size_t)count)
            return errorf(err, "/colt/generate: the binary body ends inside prompt %u", i);
        r->streams[i] = stream;
        r->first_positions[i] = (int)position;
        r->max_tokens_each[i] = budget ? (int)budget : (int)max_tokens;
        if (r->max_tokens_each[i] > r->opt.max_new_tokens) r->opt.max_new_tokens = r->max_tokens_each[i];
        r->prompt_lens[i] = (int)count;
        r->prompts[i] = xmalloc(sizeof(int) * count);
        for (uint32_t k = 0; k < count; k++, p += 4) {
            uint32_t id = get_u32(p);
            if (id >= (uint32_t)ctx->vocab_size)
                return errorf(err, "/colt/generate: prompt %u: token %u is %u, not a token id below %d", i, k, id,
                              ctx->vocab_size);
            r->prompts[i][k] = (int)id;
        }
        if ((int)count + r->max_tokens_each[i] > ctx->max_model_len)
            return errorf(err, "/colt/generate: prompt %u has %u tokens; with max_tokens %d that is more than the "
                               "server's max_model_len %d",
                          i, count, r->max_tokens_each[i], ctx->max_model_len);
    }
    if (p != end) return errorf(err, "/colt/generate: the binary body has %zu bytes after its last prompt", (size_t)(end - p));
    return COLT_OK;
}

char *colt_generate_request_binary(const GenSequence *seqs, int n, const int *max_tokens_each,
                                   const char *settings_json, size_t *len) {
    size_t settings_len = strlen(settings_json), size = 8 + 4 + settings_len + 4;
    for (int i = 0; i < n; i++) size += 16 + 4 * (size_t)seqs[i].prompt_len;
    unsigned char *out = xmalloc(size), *p = out;
    memcpy(p, COLT_REQUEST_MAGIC, 8);
    p = put_u32(p + 8, (uint32_t)settings_len);
    memcpy(p, settings_json, settings_len);
    p = put_u32(p + settings_len, (uint32_t)n);
    for (int i = 0; i < n; i++) {
        const GenSequence *g = &seqs[i];
        p = put_u32(p, (uint32_t)g->stream);
        p = put_u32(p, (uint32_t)g->first_position);
        p = put_u32(p, max_tokens_each ? (uint32_t)max_tokens_each[i] : 0u);
        p = put_u32(p, (uint32_t)g->prompt_len);
        for (int k = 0; k < g->prompt_len; k++) p = put_u32(p, (uint32_t)g->prompt[k]);
    }
    COLT_ASSERT((size_t)(p - out) == size);
    *len = size;
    return (char *)out;
}

int colt_generate_parse(ColtGenerateRequest *out, const char *body, size_t len, const ColtApiContext *ctx, char *err) {
    memset(out, 0, sizeof *out);
    if (len >= 8 && memcmp(body, COLT_REQUEST_MAGIC, 8) == 0) {
        int rc = parse_generate_binary(out, (const unsigned char *)body, len, ctx, err);
        if (rc != 0) colt_generate_free(out);
        return rc;
    }
    json_error_t je;
    json_t *o = json_loadb(body, len, 0, &je);
    if (!o) return errorf(err, "/colt/generate: the body is not JSON: %s (line %d)", je.text, je.line);
    int rc = parse_generate(out, o, ctx, err);
    json_decref(o);
    if (rc != 0) colt_generate_free(out);
    return rc;
}

void colt_generate_free(ColtGenerateRequest *r) {
    for (int i = 0; r->prompts && i < r->n_prompts; i++) free(r->prompts[i]);
    free(r->prompts), free(r->prompt_lens), free(r->streams), free(r->stop_ids);
    free(r->first_positions), free(r->max_tokens_each);
    memset(r, 0, sizeof *r);
}

char *colt_generate_response_json(ServeRequest *sr, int64_t weight_updates) {
    json_t *list = json_array();
    for (int i = 0; i < serve_request_choices(sr); i++) {
        const GenSequence *g = serve_request_sequence(sr, i);
        json_t *ids = json_array(), *lp = json_array();
        for (int k = 0; k < g->n_tokens; k++) {
            json_array_append_new(ids, json_integer(g->tokens[k]));
            json_array_append_new(lp, isfinite(g->logprobs[k]) ? json_real(g->logprobs[k]) : json_null());
        }
        json_array_append_new(list, json_pack("{s:o,s:o,s:s}", "token_ids", ids, "logprobs", lp, "finish_reason",
                                               g->finish == FINISH_STOP ? "stop" : "length"));
    }
    json_t *o = json_pack("{s:o,s:I}", "completions", list, "weight_updates", (json_int_t)weight_updates);
    /* the only reals are fp32 log-probs: 9 significant digits bring back the same float (through the client's
     * double), a third fewer bytes to write and parse than 17 for a round of many thousand tokens */
    char *text = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(9));
    json_decref(o);
    return text;
}

char *colt_generate_response_binary(ServeRequest *sr, int64_t weight_updates, size_t *len) {
    const int n = serve_request_choices(sr);
    size_t size = 8 + 8 + 4;
    for (int i = 0; i < n; i++) size += 8 + 8 * (size_t)serve_request_sequence(sr, i)->n_tokens;
    unsigned char *out = xmalloc(size), *p = out;
    memcpy(p, COLT_GENERATE_MAGIC, 8);
    p = put_u32(p + 8, (uint32_t)weight_updates);
    p = put_u32(p, (uint32_t)((uint64_t)weight_updates >> 32));
    p = put_u32(p, (uint32_t)n);
    for (int i = 0; i < n; i++) {
        const GenSequence *g = serve_request_sequence(sr, i);
        p = put_u32(p, (uint32_t)g->n_tokens);
        p = put_u32(p, g->finish == FINISH_STOP ? 1u : 0u);
        for (int k = 0; k < g->n_tokens; k++) p = put_u32(p, (uint32_t)g->tokens[k]);
        for (int k = 0; k < g->n_tokens; k++) {
            uint32_t bits;
            memcpy(&bits, &g->logprobs[k], 4);
            p = put_u32(p, bits);
        }
    }
    COLT_ASSERT((size_t)(p - out) == size);
    *len = size;
    return (char *)out;
}

int colt_generate_answer_read(GenSequence *seqs, int n, const unsigned char *data, size_t len, int max_tokens,
                              const int *max_tokens_each, int vocab_size, long long *weight_updates, char *err) {
    const unsigned char *p = data, *end = data + len;
    if (len < 20 || memcmp(p, COLT_GENERATE_MAGIC, 8) != 0)
        return errorf(err, "the binary answer has no %s header (%zu bytes)", COLT_GENERATE_MAGIC, len);
    uint64_t updates = get_u32(p + 8) | (uint64_t)get_u32(p + 12) << 32;
    if (get_u32(p + 16) != (uint32_t)n)
        return errorf(err, "the answer has %u completions, not the %d asked for", get_u32(p + 16), n);
    p += 20;
    for (int i = 0; i < n; i++) {
        if (end - p < 8) return errorf(err, "the answer ends inside completion %d", i);
        uint32_t count = get_u32(p), finish = get_u32(p + 4);
        int budget = max_tokens_each ? max_tokens_each[i] : max_tokens;
        p += 8;
        if (count < 1 || count > (uint32_t)budget || finish > 1)
            return errorf(err, "completion %d of the answer is malformed (%u tokens for a budget of %d, finish %u)", i,
                          count, budget, finish);
        if ((size_t)(end - p) < 8 * (size_t)count) return errorf(err, "the answer ends inside completion %d", i);
        GenSequence *g = &seqs[i];
        g->tokens = xmalloc(sizeof(int) * count);
        g->logprobs = xmalloc(sizeof(float) * count);
        g->n_tokens = (int)count;
        g->finish = finish ? FINISH_STOP : FINISH_LENGTH;
        for (uint32_t k = 0; k < count; k++, p += 4) {
            uint32_t id = get_u32(p);
            if (id >= (uint32_t)vocab_size)
                return errorf(err, "completion %d has token %u out of the vocabulary (%d): a server with another model?",
                              i, k, vocab_size);
            g->tokens[k] = (int)id;
        }
        for (uint32_t k = 0; k < count; k++, p += 4) {
            uint32_t bits = get_u32(p);
            memcpy(&g->logprobs[k], &bits, 4);
        }
    }
    if (p != end) return errorf(err, "the answer has %zu bytes after its last completion", (size_t)(end - p));
    if (weight_updates) *weight_updates = (long long)updates;
    return COLT_OK;
}

char *colt_info_json(const ServeLoopStats *st, const ColtApiContext *ctx) {
    json_t *o = json_pack("{s:s,s:b,s:i,s:I,s:i,s:i}", "device", st->device, "deterministic", st->deterministic,
                          "max_model_len", ctx->max_model_len, "weight_updates", (json_int_t)st->weight_updates,
                          "tensor_parallel_size", st->tensor_parallel_size, "weight_sync_world_size",
                          st->tensor_parallel_size + 1);
    char *text = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return text;
}

/* The "lora" object of /colt/init_weight_sync: PEFT's names, colt's modules. */
static int parse_lora(LoraConfig *out, json_t *o, const char *where, char *err) {
    if (!json_is_object(o)) return errorf(err, "%s: 'lora' must be an object (r, lora_alpha, use_rslora, target_modules) "
                                               "or null", where);
    char lora_where[64];
    snprintf(lora_where, sizeof lora_where, "%s: lora", where);
    if (check_keys(o, LORA_KEYS, lora_where, err) != 0) return COLT_ERR;
    json_t *r = json_object_get(o, "r"), *alpha = json_object_get(o, "lora_alpha"),
           *rslora = json_object_get(o, "use_rslora"), *targets = json_object_get(o, "target_modules");
    *out = (LoraConfig){0};
    if (!json_is_integer(r) || json_integer_value(r) < 1 || json_integer_value(r) > 65536)
        return errorf(err, "%s: lora: 'r' must be an integer in [1, 65536]", where);
    if (!json_is_number(alpha) || !(json_number_value(alpha) > 0) || !isfinite(json_number_value(alpha)))
        return errorf(err, "%s: lora: 'lora_alpha' must be a positive number", where);
    if (rslora && !json_is_boolean(rslora)) return errorf(err, "%s: lora: 'use_rslora' must be true or false", where);
    if (!json_is_array(targets) || json_array_size(targets) == 0)
        return errorf(err, "%s: lora: 'target_modules' must be a non-empty array of module names", where);
    size_t i;
    json_t *v;
    json_array_foreach(targets, i, v) {
        LoraTarget t;
        if (!json_is_string(v) || lora_target_parse(json_string_value(v), &t) != 0)
            return errorf(err, "%s: lora: target_modules[%zu] is not a layer colt adapts (q_proj, k_proj, v_proj, "
                               "o_proj, gate_proj, up_proj, down_proj)", where, i);
        out->targets |= 1u << t;
    }
    out->r = (int)json_integer_value(r);
    out->alpha = (float)json_number_value(alpha);
    out->use_rslora = json_is_true(rslora);
    return COLT_OK;
}

char *colt_sync_init_json(int port, double timeout_s, bool nccl, const LoraConfig *lora) {
    json_t *o = json_pack("{s:i,s:f,s:b}", "port", port, "timeout", timeout_s, "nccl", nccl);
    if (lora) {
        json_t *targets = json_array();
        for (int k = 0; k < LORA_N_TARGETS; k++)
            if (lora->targets & (1u << k)) json_array_append_new(targets, json_string(lora_target_name((LoraTarget)k)));
        json_object_set_new(o, "lora", json_pack("{s:i,s:f,s:b,s:o}", "r", lora->r, "lora_alpha", (double)lora->alpha,
                                                 "use_rslora", lora->use_rslora, "target_modules", targets));
    }
    char *text = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(17));
    json_decref(o);
    return text;
}

int colt_sync_parse(ServeSyncRequest *out, ServeSyncOp op, const char *body, size_t len, const char *default_host,
                    char *err) {
    static const char *const where[] = {"/colt/init_weight_sync", "/colt/update_weights", "/colt/close_weight_sync"};
    *out = (ServeSyncRequest){.op = op, .timeout_s = 240};
    snprintf(out->host, sizeof out->host, "%s", default_host);
    json_t *o = len > 0 ? json_loadb(body, len, 0, NULL) : json_object();
    int rc = COLT_OK;
    if (!json_is_object(o)) {
        rc = errorf(err, "%s: the body must be a JSON object", where[op]);
    } else if (check_keys(o, SYNC_KEYS, where[op], err) != 0) {
        rc = COLT_ERR;
    } else {
        json_t *port = json_object_get(o, "port"), *timeout = json_object_get(o, "timeout");
        json_t *nccl = json_object_get(o, "nccl"), *host = json_object_get(o, "host"), *lora = json_object_get(o, "lora");
        if (op == SERVE_SYNC_OPEN &&
            (!json_is_integer(port) || json_integer_value(port) < 1 || json_integer_value(port) > 65535))
            rc = errorf(err, "%s: 'port' must be an integer in [1, 65535] (the group's port, vllm_group_port)",
                        where[op]);
        else if (timeout && !(json_is_number(timeout) && json_number_value(timeout) > 0 &&
                              json_number_value(timeout) <= 86400))
            rc = errorf(err, "%s: 'timeout' must be a number of seconds in (0, 86400]", where[op]);
        else if (nccl && !json_is_boolean(nccl))
            rc = errorf(err, "%s: 'nccl' must be true or false", where[op]);
        else if (host && (!json_is_string(host) || json_string_length(host) >= sizeof out->host))
            rc = errorf(err, "%s: 'host' must be a host name or address", where[op]);
        else if (lora && !json_is_null(lora) && op != SERVE_SYNC_OPEN)
            rc = errorf(err, "%s: 'lora' belongs to /colt/init_weight_sync", where[op]);
        else if (lora && !json_is_null(lora) && parse_lora(&out->lora, lora, where[op], err) != 0)
            rc = COLT_ERR;
        else {
            out->has_lora = lora && !json_is_null(lora);
            if (port) out->port = (int)json_integer_value(port);
            if (timeout) out->timeout_s = json_number_value(timeout);
            out->use_nccl = json_is_true(nccl);
            if (host) snprintf(out->host, sizeof out->host, "%s", json_string_value(host));
        }
    }
    json_decref(o);
    return rc;
}
