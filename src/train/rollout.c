/* rollout.c — see rollout.h. The JSON form keeps numbers exact: floats are
 * written as doubles (every float is one), NaN rewards as null. */
#include "train/rollout.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

void rollout_free(Rollout *r) {
    for (int i = 0; i < r->n_samples && r->samples; i++) {
        free(r->samples[i].completion);
        free(r->samples[i].old_logp);
        free(r->samples[i].sampling_logp);
        free(r->samples[i].ref_logp);
        free(r->samples[i].model_mask);
        free(r->samples[i].text);
    }
    for (int i = 0; i < r->n_prompts; i++) {
        if (r->prompt_ids) free(r->prompt_ids[i]);
        if (r->prompt_text) free(r->prompt_text[i]);
    }
    free(r->samples);
    free(r->per_func);
    free(r->order);
    free(r->rows);
    free(r->prompt_ids);
    free(r->prompt_len);
    free(r->prompt_text);
    memset(r, 0, sizeof *r);
}

/* ---------------------------------------------------------------- to JSON */

/* NaN (a reward function's "no reward") as null; every other value is finite. */
static json_t *floats_json(const float *x, int n) {
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, isfinite(x[i]) ? json_real(x[i]) : json_null());
    return a;
}

static json_t *ints_json(const int *x, int n) {
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_integer(x[i]));
    return a;
}

json_t *rollout_to_json(const Rollout *r, int micro_batch_samples) {
    if (!r->samples) return json_null();
    json_t *o = json_object();
    json_object_set_new(o, "round", json_integer(r->round));
    json_object_set_new(o, "samples_done", json_integer((json_int_t)r->micro_done * micro_batch_samples));
    json_object_set_new(o, "num_items", json_real(r->num_items));
    if (r->prompt_per_sample) json_object_set_new(o, "prompt_per_sample", json_true());
    json_t *prompts = json_array();
    for (int p = 0; p < r->n_prompts; p++)
        json_array_append_new(prompts, json_pack("{s:I,s:o,s:s}", "row", (json_int_t)r->rows[p], "ids",
                                                 ints_json(r->prompt_ids[p], r->prompt_len[p]), "text",
                                                 r->prompt_text[p]));
    json_object_set_new(o, "prompts", prompts);
    json_t *samples = json_array();
    for (int i = 0; i < r->n_samples; i++) {
        const Sample *s = &r->samples[i];
        json_t *so = json_pack("{s:i,s:o,s:b,s:o,s:f,s:s,s:o}", "prompt", s->prompt, "completion",
                               ints_json(s->completion, s->len), "terminated", s->terminated, "reward",
                               isnan(s->reward) ? json_null() : json_real(s->reward), "advantage", (double)s->advantage,
                               "text", s->text, "per_func", floats_json(r->per_func + (size_t)i * r->n_funcs, r->n_funcs));
        if (s->old_logp) json_object_set_new(so, "old_logp", floats_json(s->old_logp, s->len));
        if (s->sampling_logp) json_object_set_new(so, "sampling_logp", floats_json(s->sampling_logp, s->len));
        if (s->ref_logp) json_object_set_new(so, "ref_logp", floats_json(s->ref_logp, s->len));
        if (s->model_mask) {
            json_t *mask = json_array();
            for (int k = 0; k < s->len; k++) json_array_append_new(mask, json_integer(s->model_mask[k]));
            json_object_set_new(so, "model_mask", mask);
            json_object_set_new(so, "tool_calls", json_integer(s->tool_calls));
            json_object_set_new(so, "tool_failures", json_integer(s->tool_failures));
        }
        json_array_append_new(samples, so);
    }
    json_object_set_new(o, "samples", samples);
    json_object_set_new(o, "order", ints_json(r->order, r->n_samples));
    return o;
}

/* ---------------------------------------------------------------- from JSON, checked */

/* An integer field in [lo, hi]. what: "rollout sample 3: prompt". */
static int checked_int(int64_t *out, json_t *v, int64_t lo, int64_t hi, const char *where, const char *what,
                       char *err) {
    if (!json_is_integer(v)) return errorf(err, "%s: %s must be an integer", where, what);
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return errorf(err, "%s: %s is %lld, outside %lld .. %lld", where, what, (long long)x, (long long)lo,
                      (long long)hi);
    *out = x;
    return COLT_OK;
}

/* An array of n_min .. n_max token ids, each in [0, vocab). */
static int checked_ids(int **out, int *n, json_t *a, int n_min, int n_max, int vocab, const char *where,
                       const char *what, char *err) {
    *out = NULL;
    if (!json_is_array(a)) return errorf(err, "%s: %s must be an array of token ids", where, what);
    size_t len = json_array_size(a);
    if (len < (size_t)n_min || len > (size_t)n_max)
        return errorf(err, "%s: %s has %zu tokens, allowed %d .. %d", where, what, len, n_min, n_max);
    int *x = xmalloc(sizeof(int) * (len ? len : 1));
    for (size_t i = 0; i < len; i++) {
        json_t *v = json_array_get(a, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= vocab) {
            free(x);
            return errorf(err, "%s: %s[%zu] is not a token id below the vocabulary size %d", where, what, i, vocab);
        }
        x[i] = (int)json_integer_value(v);
    }
    *out = x;
    *n = (int)len;
    return COLT_OK;
}

/* n finite numbers; with allow_null, null reads as NaN ("no reward"). */
static int checked_floats(float *x, json_t *a, int n, bool allow_null, const char *where, const char *what,
                          char *err) {
    if (!json_is_array(a) || json_array_size(a) != (size_t)n)
        return errorf(err, "%s: %s must be an array of %d numbers", where, what, n);
    for (int i = 0; i < n; i++) {
        json_t *v = json_array_get(a, (size_t)i);
        if (allow_null && json_is_null(v)) {
            x[i] = NAN;
            continue;
        }
        double d = json_is_number(v) ? json_number_value(v) : NAN;
        if (!isfinite((float)d)) return errorf(err, "%s: %s[%d] is not a finite number", where, what, i);
        x[i] = (float)d;
    }
    return COLT_OK;
}

static int checked_float(float *x, json_t *v, bool allow_null, const char *where, const char *what, char *err) {
    if (allow_null && json_is_null(v)) {
        *x = NAN;
        return COLT_OK;
    }
    double d = json_is_number(v) ? json_number_value(v) : NAN;
    if (!isfinite((float)d)) return errorf(err, "%s: %s is not a finite number", where, what);
    *x = (float)d;
    return COLT_OK;
}

/* An optional per-token log-prob array: present exactly when wanted. null
 * entries (allow_null) read as NaN: the engine's "not scored". */
static int checked_logp(float **out, json_t *so, const char *key, bool wanted, bool optional, bool allow_null, int len,
                        const char *where, const char *ctx, char *err) {
    json_t *a = json_object_get(so, key);
    char what[96];
    snprintf(what, sizeof what, "%s: %s", ctx, key);
    if (!a) return wanted && !optional ? errorf(err, "%s: %s is missing", where, what) : COLT_OK;
    if (!wanted) return errorf(err, "%s: %s is present but this run does not use it", where, what);
    *out = xmalloc(sizeof(float) * (size_t)len);
    return checked_floats(*out, a, len, allow_null, where, what, err);
}

/* A multi-turn sample's mask (0 or 1 per token; the first token is always
 * the model's) and tool-call counts; absent for a single-turn one. */
static int read_model_mask(Sample *s, json_t *so, const char *where, const char *ctx, char *err) {
    json_t *a = json_object_get(so, "model_mask");
    if (!a) return COLT_OK;
    if (!json_is_array(a) || json_array_size(a) != (size_t)s->len)
        return errorf(err, "%s: %s: model_mask must be an array of %d zeros and ones", where, ctx, s->len);
    s->model_mask = xmalloc((size_t)s->len);
    for (int k = 0; k < s->len; k++) {
        json_t *v = json_array_get(a, (size_t)k);
        json_int_t x = json_is_integer(v) ? json_integer_value(v) : -1;
        if (x != 0 && x != 1) return errorf(err, "%s: %s: model_mask[%d] must be 0 or 1", where, ctx, k);
        s->model_mask[k] = (uint8_t)x;
    }
    if (s->model_mask[0] != 1) return errorf(err, "%s: %s: model_mask[0] must be 1 (a completion starts with the model's token)", where, ctx);
    int64_t v;
    char what[96];
    snprintf(what, sizeof what, "%s: tool_calls", ctx);
    if (checked_int(&v, json_object_get(so, "tool_calls"), 0, INT32_MAX, where, what, err) != 0) return COLT_ERR;
    s->tool_calls = (int)v;
    snprintf(what, sizeof what, "%s: tool_failures", ctx);
    if (checked_int(&v, json_object_get(so, "tool_failures"), 0, s->tool_calls, where, what, err) != 0) return COLT_ERR;
    s->tool_failures = (int)v;
    return COLT_OK;
}

static int read_sample(Rollout *r, int i, json_t *so, const RolloutShape *shape, const char *where, char *err) {
    Sample *s = &r->samples[i];
    char ctx[64];
    snprintf(ctx, sizeof ctx, "rollout sample %d", i);
    if (!json_is_object(so)) return errorf(err, "%s: %s must be an object", where, ctx);
    int64_t v;
    char what[96];
    snprintf(what, sizeof what, "%s: prompt", ctx);
    int want_prompt = rollout_prompt_index(shape->prompt_per_sample, i, shape->group_size);
    if (checked_int(&v, json_object_get(so, "prompt"), want_prompt, want_prompt, where, what, err) != 0)
        return COLT_ERR;
    s->prompt = (int)v;
    snprintf(what, sizeof what, "%s: completion", ctx);
    if (checked_ids(&s->completion, &s->len, json_object_get(so, "completion"), 1, shape->max_completion_len,
                    shape->vocab_size, where, what, err) != 0)
        return COLT_ERR;
    json_t *term = json_object_get(so, "terminated");
    if (!json_is_boolean(term)) return errorf(err, "%s: %s: terminated must be true or false", where, ctx);
    s->terminated = json_is_true(term);
    snprintf(what, sizeof what, "%s: reward", ctx);
    if (checked_float(&s->reward, json_object_get(so, "reward"), true, where, what, err) != 0) return COLT_ERR;
    snprintf(what, sizeof what, "%s: advantage", ctx);
    if (checked_float(&s->advantage, json_object_get(so, "advantage"), false, where, what, err) != 0) return COLT_ERR;
    const char *text = json_string_value(json_object_get(so, "text"));
    if (!text) return errorf(err, "%s: %s: text must be a string", where, ctx);
    s->text = xstrdup(text);
    snprintf(what, sizeof what, "%s: per_func", ctx);
    if (checked_floats(r->per_func + (size_t)i * shape->n_funcs, json_object_get(so, "per_func"), shape->n_funcs,
                       true, where, what, err) != 0)
        return COLT_ERR;
    if (checked_logp(&s->old_logp, so, "old_logp", shape->has_old_logp, false, false, s->len, where, ctx, err) != 0 ||
        checked_logp(&s->sampling_logp, so, "sampling_logp", true, true, true, s->len, where, ctx, err) != 0 ||
        checked_logp(&s->ref_logp, so, "ref_logp", shape->has_ref_logp, false, false, s->len, where, ctx, err) != 0)
        return COLT_ERR;
    return read_model_mask(s, so, where, ctx, err);
}

static int read_rollout(Rollout *r, json_t *o, const RolloutShape *shape, const char *where, char *err) {
    if (!json_is_object(o)) return errorf(err, "%s: rollout must be an object or null", where);
    json_t *prompts = json_object_get(o, "prompts"), *samples = json_object_get(o, "samples");
    int n_prompts = shape->prompt_per_sample ? shape->n_samples : shape->n_samples / shape->group_size;
    if (json_is_true(json_object_get(o, "prompt_per_sample")) != shape->prompt_per_sample)
        return errorf(err, "%s: the rollout has %s, this run %s (environment_factory)", where,
                      shape->prompt_per_sample ? "a prompt per group" : "a prompt per sample",
                      shape->prompt_per_sample ? "one per sample" : "one per group");
    if (!json_is_array(prompts) || json_array_size(prompts) != (size_t)n_prompts)
        return errorf(err, "%s: rollout prompts must be an array of %d (%s)", where, n_prompts,
                      shape->prompt_per_sample ? "generation_batch_size: environments give each sample its prompt"
                                               : "generation_batch_size / num_generations");
    if (!json_is_array(samples) || json_array_size(samples) != (size_t)shape->n_samples)
        return errorf(err, "%s: rollout samples must be an array of %d (generation_batch_size)", where,
                      shape->n_samples);
    int64_t v;
    if (checked_int(&v, json_object_get(o, "round"), 0, INT64_MAX / 2, where, "rollout round", err) != 0)
        return COLT_ERR;
    r->round = v;
    /* Consumption is kept in samples, so a checkpoint of one world size resumes at another. */
    const int64_t mbs = shape->micro_batch_samples;
    if (checked_int(&v, json_object_get(o, "samples_done"), 0, (int64_t)shape->micro_per_round * mbs - 1, where,
                    "rollout samples_done", err) != 0)
        return COLT_ERR;
    if (v % mbs != 0)
        return errorf(err, "%s: rollout samples_done %lld is not a whole number of micro-batches of %lld samples", where,
                      (long long)v, (long long)mbs);
    r->micro_done = (int)(v / mbs);
    json_t *items = json_object_get(o, "num_items");
    double max_items = (double)shape->n_samples * shape->max_completion_len;
    if (!json_is_number(items) || !(json_number_value(items) >= 0) || json_number_value(items) > max_items)
        return errorf(err, "%s: rollout num_items must be a number in 0 .. %.0f", where, max_items);
    r->num_items = json_number_value(items);

    r->n_prompts = n_prompts;
    r->prompt_per_sample = shape->prompt_per_sample;
    r->n_samples = shape->n_samples;
    r->n_funcs = shape->n_funcs;
    r->rows = xcalloc((size_t)n_prompts, sizeof(size_t));
    r->prompt_ids = xcalloc((size_t)n_prompts, sizeof(int *));
    r->prompt_len = xcalloc((size_t)n_prompts, sizeof(int));
    r->prompt_text = xcalloc((size_t)n_prompts, sizeof(char *));
    r->samples = xcalloc((size_t)r->n_samples, sizeof(Sample));
    r->per_func = xcalloc((size_t)r->n_samples * (size_t)(shape->n_funcs ? shape->n_funcs : 1), sizeof(float));
    r->order = xcalloc((size_t)r->n_samples, sizeof(int));
    for (int p = 0; p < n_prompts; p++) {
        json_t *po = json_array_get(prompts, (size_t)p);
        char what[64];
        snprintf(what, sizeof what, "rollout prompt %d: row", p);
        if (!json_is_object(po)) return errorf(err, "%s: rollout prompt %d must be an object", where, p);
        if (checked_int(&v, json_object_get(po, "row"), 0, (int64_t)shape->dataset_rows - 1, where, what, err) != 0)
            return COLT_ERR;
        r->rows[p] = (size_t)v;
        snprintf(what, sizeof what, "rollout prompt %d: ids", p);
        if (checked_ids(&r->prompt_ids[p], &r->prompt_len[p], json_object_get(po, "ids"), 1, shape->max_prompt_len,
                        shape->vocab_size, where, what, err) != 0)
            return COLT_ERR;
        const char *text = json_string_value(json_object_get(po, "text"));
        if (!text) return errorf(err, "%s: rollout prompt %d: text must be a string", where, p);
        r->prompt_text[p] = xstrdup(text);
    }
    for (int i = 0; i < r->n_samples; i++)
        if (read_sample(r, i, json_array_get(samples, (size_t)i), shape, where, err) != 0) return COLT_ERR;

    /* order: a permutation of 0 .. n_samples-1 (micro-batches index samples through it). */
    json_t *order = json_object_get(o, "order");
    if (!json_is_array(order) || json_array_size(order) != (size_t)r->n_samples)
        return errorf(err, "%s: rollout order must be an array of %d sample indices", where, r->n_samples);
    bool *seen = xcalloc((size_t)r->n_samples, sizeof(bool));
    int rc = COLT_OK;
    for (int i = 0; i < r->n_samples && rc == 0; i++) {
        char what[48];
        snprintf(what, sizeof what, "rollout order[%d]", i);
        rc = checked_int(&v, json_array_get(order, (size_t)i), 0, r->n_samples - 1, where, what, err);
        if (rc == 0 && seen[v]) rc = errorf(err, "%s: rollout order repeats sample %lld", where, (long long)v);
        if (rc == 0) seen[v] = true, r->order[i] = (int)v;
    }
    free(seen);
    return rc;
}

int rollout_from_json(Rollout *r, json_t *o, const RolloutShape *shape, const char *where, char *err) {
    rollout_free(r);
    if (!o || json_is_null(o)) return COLT_OK;
    COLT_ASSERT(shape->group_size > 0 && shape->n_samples % shape->group_size == 0);
    if (read_rollout(r, o, shape, where, err) != 0) {
        rollout_free(r);
        return COLT_ERR;
    }
    return COLT_OK;
}
