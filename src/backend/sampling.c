/* sampling.c — see sampling.h. Filtering follows transformers' logits warpers:
 * TopK keeps the k largest (ties at the k-th value kept), TopP removes the
 * tokens whose cumulative probability, in ascending order, is <= 1 - top_p
 * (always keeping the most likely; among equal probabilities the larger ids
 * go first), MinP removes tokens with p < min_p * p_max. The draw is an
 * inverse CDF over the kept tokens in ascending id order with one uniform
 * number per step: the order a GPU scans in without sorting. */
#include "backend/sampling.h"

#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/rng.h"

SamplingParams sampling_params_greedy(void) {
    SamplingParams p = {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f,
                        .repetition_penalty = 1.0f, .seed = 0};
    return p;
}

int sampling_params_validate(const SamplingParams *p, char *err) {
    /* inf here is a larger number rounded to a float (1e308): say so, not "got inf" */
    if (isinf(p->temperature) && p->temperature > 0)
        return errorf(err, "temperature is out of range (a 32-bit float holds at most %g)", (double)FLT_MAX);
    if (!(p->temperature >= 0.0f) || !isfinite(p->temperature))
        return errorf(err, "temperature must be >= 0 (got %g)", p->temperature);
    if (p->top_k < 0) return errorf(err, "top_k must be >= 0 (got %d)", p->top_k);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f)) return errorf(err, "top_p must be in (0, 1] (got %g)", p->top_p);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f)) return errorf(err, "min_p must be in [0, 1] (got %g)", p->min_p);
    if (!(p->repetition_penalty > 0.0f) || !isfinite(p->repetition_penalty))
        return errorf(err, "repetition_penalty must be > 0 (got %g)", p->repetition_penalty);
    /* vLLM's ranges (SamplingParams._verify_args) */
    if (!(p->presence_penalty >= -2.0f && p->presence_penalty <= 2.0f))
        return errorf(err, "presence_penalty must be in [-2, 2] (got %g)", p->presence_penalty);
    if (!(p->frequency_penalty >= -2.0f && p->frequency_penalty <= 2.0f))
        return errorf(err, "frequency_penalty must be in [-2, 2] (got %g)", p->frequency_penalty);
    return COLT_OK;
}

void sampler_init(Sampler *s, int vocab_size) {
    s->vocab_size = vocab_size;
    s->probs = xmalloc(sizeof(float) * (size_t)vocab_size);
    s->order = xmalloc(sizeof(int) * (size_t)vocab_size);
}

void sampler_free(Sampler *s) {
    free(s->probs);
    free(s->order);
    s->probs = NULL;
    s->order = NULL;
}

/* scratch[t] while applying: bit 30 = in the prompt, the low bits = times in the completion. */
#define IN_PROMPT (1 << 30)

void sampler_apply_penalties(float *logits, int vocab, const SamplingParams *p, const int *history, int n_history,
                             int n_prompt, const int *bias_ids, const float *bias_values, int n_bias, int *scratch) {
    for (int j = 0; j < n_bias; j++) logits[bias_ids[j]] += bias_values[j];
    for (int i = 0; i < n_history; i++) {
        int t = history[i];
        if (t < 0 || t >= vocab) continue;
        if (i < n_prompt) scratch[t] |= IN_PROMPT;
        else scratch[t]++;
    }
    for (int i = 0; i < n_history; i++) { /* each distinct token once: its entry is cleared when done */
        int t = history[i];
        if (t < 0 || t >= vocab || scratch[t] == 0) continue;
        int count = scratch[t] & ~IN_PROMPT;
        scratch[t] = 0;
        float l = logits[t];
        if (p->repetition_penalty != 1.0f) l = l > 0 ? l / p->repetition_penalty : l * p->repetition_penalty;
        if (count > 0) {
            l -= p->frequency_penalty * (float)count;
            l -= p->presence_penalty;
        }
        logits[t] = l;
    }
}

double logsoftmax_at(const float *logits, int vocab_size, int token) {
    double max = logits[0];
    for (int i = 1; i < vocab_size; i++)
        if (logits[i] > max) max = logits[i];
    double sum = 0.0;
    for (int i = 0; i < vocab_size; i++) sum += exp((double)logits[i] - max);
    return (double)logits[token] - max - log(sum);
}

/* qsort_r comparator: descending probability, then ascending id so the order
 * is total and reproducible. */
static int compare_by_prob_desc(const void *a, const void *b, void *probs) {
    int i = *(const int *)a, j = *(const int *)b;
    float pi = ((const float *)probs)[i], pj = ((const float *)probs)[j];
    if (pi > pj) return -1;
    if (pi < pj) return 1;
    return (i > j) - (i < j);
}

static int compare_ids(const void *a, const void *b) {
    int i = *(const int *)a, j = *(const int *)b;
    return (i > j) - (i < j);
}

static int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* Applies the repetition penalty and temperature to logits in place, fills
 * s->probs with the softmax, and, when a filter is on, s->order with the ids
 * sorted by probability. Returns how many of them survive the filters: the
 * first ones of s->order (V, and no order, when no filter is on).
 * *log_norm = max + log(sum exp(logit - max)). */
static int sampler_prepare(Sampler *s, float *logits, const SamplingParams *p, const int *history, int n_history,
                           bool *filtered, double *log_norm) {
    const int V = s->vocab_size;
    /* Repetition penalty (transformers: divide positive logits, multiply negative
     * ones; each distinct token once — probs marks the tokens already done). */
    if (p->repetition_penalty != 1.0f && n_history > 0) {
        memset(s->probs, 0, sizeof(float) * (size_t)V);
        for (int i = 0; i < n_history; i++) {
            int t = history[i];
            if (t < 0 || t >= V || s->probs[t] != 0.0f) continue;
            s->probs[t] = 1.0f;
            logits[t] = logits[t] > 0 ? logits[t] / p->repetition_penalty : logits[t] * p->repetition_penalty;
        }
    }
    float temperature = p->temperature > 0.0f ? p->temperature : 1.0f;
    for (int i = 0; i < V; i++) logits[i] /= temperature;
    float max = logits[argmax(logits, V)];
    double sum = 0.0;
    for (int i = 0; i < V; i++) {
        s->probs[i] = expf(logits[i] - max);
        sum += s->probs[i];
    }
    for (int i = 0; i < V; i++) s->probs[i] = (float)(s->probs[i] / sum);
    *log_norm = (double)max + log(sum);

    *filtered = p->top_k > 0 || p->top_p < 1.0f || p->min_p > 0.0f;
    if (!*filtered) return V;
    for (int i = 0; i < V; i++) s->order[i] = i;
    qsort_r(s->order, (size_t)V, sizeof(int), compare_by_prob_desc, s->probs);

    int kept = V;
    if (p->top_k > 0 && p->top_k < kept) {
        float kth = s->probs[s->order[p->top_k - 1]];
        kept = p->top_k;
        while (kept < V && s->probs[s->order[kept]] == kth) kept++;
    }
    if (p->top_p < 1.0f) {
        /* After top-k, transformers renormalises, then removes the tail whose
         * ascending cumulative mass is <= 1 - top_p, keeping at least one token. */
        double total = 0.0;
        for (int i = 0; i < kept; i++) total += s->probs[s->order[i]];
        double tail = 0.0;
        int new_kept = kept;
        for (int i = kept - 1; i >= 1; i--) {
            tail += s->probs[s->order[i]] / total;
            if (tail <= 1.0 - (double)p->top_p) new_kept = i;
            else break;
        }
        kept = new_kept;
    }
    if (p->min_p > 0.0f) {
        float threshold = p->min_p * s->probs[s->order[0]];
        int new_kept = 1;
        while (new_kept < kept && s->probs[s->order[new_kept]] >= threshold) new_kept++;
        kept = new_kept;
    }
    return kept;
}

void sampler_distribution(Sampler *s, float *logits, const SamplingParams *p, const int *history, int n_history,
                          float *probs_out) {
    const int V = s->vocab_size;
    bool filtered;
    double log_norm;
    if (p->temperature == 0.0f) {
        SamplingParams plain = *p;
        plain.top_k = 0; plain.top_p = 1.0f; plain.min_p = 0.0f;
        sampler_prepare(s, logits, &plain, history, n_history, &filtered, &log_norm);
        memset(probs_out, 0, sizeof(float) * (size_t)V);
        probs_out[argmax(logits, V)] = 1.0f;
        return;
    }
    int kept = sampler_prepare(s, logits, p, history, n_history, &filtered, &log_norm);
    if (!filtered) {
        memcpy(probs_out, s->probs, sizeof(float) * (size_t)V);
        return;
    }
    memset(probs_out, 0, sizeof(float) * (size_t)V);
    double total = 0.0;
    for (int i = 0; i < kept; i++) total += s->probs[s->order[i]];
    for (int i = 0; i < kept; i++) probs_out[s->order[i]] = (float)(s->probs[s->order[i]] / total);
}

int sampler_sample(Sampler *s, float *logits, const SamplingParams *p, const int *history,
                   int n_history, uint64_t stream, uint64_t counter, float *logprob) {
    const int V = s->vocab_size;
    bool filtered;
    double log_norm;
    if (p->temperature == 0.0f) {
        SamplingParams plain = *p;
        plain.top_k = 0; plain.top_p = 1.0f; plain.min_p = 0.0f;
        sampler_prepare(s, logits, &plain, history, n_history, &filtered, &log_norm);
        int t = argmax(logits, V);
        if (logprob) *logprob = (float)((double)logits[t] - log_norm);
        return t;
    }
    int kept = sampler_prepare(s, logits, p, history, n_history, &filtered, &log_norm);
    /* Inverse CDF with one uniform draw keyed by (seed, stream, counter), over the
     * kept tokens in ascending id order. Filtered, the total is summed in that
     * same order, so u * total stays below the last running sum; unfiltered it
     * is 1, which the rounded probabilities may fall just short of (then the
     * last id). */
    if (filtered) qsort(s->order, (size_t)kept, sizeof(int), compare_ids);
    double total = 1.0;
    if (filtered) {
        total = 0.0;
        for (int i = 0; i < kept; i++) total += s->probs[s->order[i]];
    }
    double u = (double)rng_uniform(p->seed, stream, counter) * total;
    int token = filtered ? s->order[kept - 1] : V - 1;
    double acc = 0.0;
    for (int i = 0; i < kept; i++) {
        int id = filtered ? s->order[i] : i;
        acc += s->probs[id];
        if (u < acc) {
            token = id;
            break;
        }
    }
    /* The log-prob of the distribution drawn from (vLLM's processed_logprobs,
     * which TRL's importance sampling expects): renormalised over the kept set. */
    if (logprob) *logprob = (float)((double)logits[token] - log_norm - (filtered ? log(total) : 0.0));
    return token;
}
