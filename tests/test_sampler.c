/* test_sampler.c — the sampler against transformers' logits processors
 * (tests/data/sampler_goldens.json from tests/ref/make_sampler_goldens.py):
 * the distribution it draws from must equal softmax of the processed logits;
 * draws must follow that distribution, walk the kept tokens in id order and
 * depend only on (seed, stream, counter). Then the CPU backend's sample op
 * (backend.h): sampler_sample per row, padding rows skipped, the token
 * appended to the sequence's history, each repeated token penalised once. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/sampling.h"
#include "core/error.h"
#include "core/rng.h"

static int failures = 0;

/* The draw's rule, restated: u * (kept mass) against the running mass of the
 * kept tokens in ascending id order (probs: sampler_distribution's). */
static int draw_in_id_order(const float *probs, int V, float u) {
    double total = 0.0, acc = 0.0;
    int last = V - 1;
    for (int i = 0; i < V; i++)
        if (probs[i] > 0.0f) total += probs[i], last = i;
    for (int i = 0; i < V; i++) {
        acc += probs[i];
        if (probs[i] > 0.0f && (double)u * total < acc) return i;
    }
    return last;
}

/* The CPU sample op on rows of base[V] (V <= 64) against sampler_sample row
 * by row; then the penalty it applies, greedy. */
static void test_cpu_sample_op(const float *base, int V) {
    enum { N = 6, STRIDE = 8 };
    const Backend *cpu = backend_cpu();
    SamplingParams p = {.temperature = 0.8f, .top_k = 20, .top_p = 0.9f, .min_p = 0.0f,
                        .repetition_penalty = 1.3f, .seed = 4242};
    int seq[N] = {0, -1, 2, 3, -1, 5}, streams[N], counters[N], tokens[N];
    int history[N * STRIDE], history_len[N] = {3, 0, 1, STRIDE, 0, 2};
    float logits[N * 64], rows[N * 64], logprobs[N];
    int top = 0;
    for (int v = 1; v < V; v++)
        if (base[v] > base[top]) top = v;
    for (int i = 0; i < N; i++) {
        streams[i] = 100 + i, counters[i] = 7, tokens[i] = -9, logprobs[i] = 99.0f;
        for (int v = 0; v < V; v++) logits[i * V + v] = base[v] + 0.01f * (float)(i * v % 7);
        for (int j = 0; j < STRIDE; j++) history[i * STRIDE + j] = (5 * i + 3 * j) % V;
    }
    /* Rows 0 and 2: the same logits and draw; sequence 0 has the top token
     * three times in its history, sequence 2 once. */
    history[0] = history[1] = history[2] = top;
    history[2 * STRIDE] = top;
    memcpy(logits + 2 * V, logits, sizeof(float) * (size_t)V);
    streams[2] = streams[0];
    int before[N * STRIDE], before_len[N];
    memcpy(before, history, sizeof history);
    memcpy(before_len, history_len, sizeof history_len);
    memcpy(rows, logits, sizeof(float) * (size_t)N * V);

    cpu->sample(cpu, tokens, logprobs, logits, N, V, &p, seq, streams, counters, history, history_len, STRIDE);

    Sampler s;
    sampler_init(&s, V);
    int same = 1, padding = 1, appended = 1;
    for (int i = 0; i < N; i++) {
        if (seq[i] < 0) {
            padding &= tokens[i] == -9 && logprobs[i] == 99.0f;
            continue;
        }
        float lp;
        int t = sampler_sample(&s, rows + i * V, &p, before + seq[i] * STRIDE, before_len[seq[i]],
                               (uint64_t)streams[i], (uint64_t)counters[i], &lp);
        same &= t == tokens[i] && lp == logprobs[i];
        int len = before_len[seq[i]], full = len >= STRIDE;
        appended &= history_len[seq[i]] == (full ? len : len + 1) && (full || history[seq[i] * STRIDE + len] == t);
    }
    int once = tokens[0] == tokens[2] && logprobs[0] == logprobs[2];
    printf("cpu sample op: %s sampler_sample row by row, padding rows %s, history %s, "
           "a token repeated in the history penalised %s\n",
           same ? "equals" : "DIFFERS FROM", padding ? "untouched" : "WRITTEN", appended ? "appended" : "WRONG",
           once ? "once" : "MORE THAN ONCE");
    if (!same || !padding || !appended || !once) failures++;
    sampler_free(&s);

    /* Greedy with the top token in the history: argmax and log-prob of the
     * logits with that one logit penalised. */
    SamplingParams g = sampling_params_greedy();
    g.repetition_penalty = 1.3f;
    int g_seq = 0, g_stream = 0, g_counter = 0, g_token, g_history[STRIDE] = {top}, g_len = 1;
    float g_logprob, penalised[64];
    memcpy(logits, base, sizeof(float) * (size_t)V);
    memcpy(penalised, base, sizeof(float) * (size_t)V);
    penalised[top] = penalised[top] > 0 ? penalised[top] / 1.3f : penalised[top] * 1.3f;
    int want = 0;
    for (int v = 1; v < V; v++)
        if (penalised[v] > penalised[want]) want = v;
    double want_lp = logsoftmax_at(penalised, V, want);
    cpu->sample(cpu, &g_token, &g_logprob, logits, 1, V, &g, &g_seq, &g_stream, &g_counter, g_history, &g_len, STRIDE);
    int ok = g_token == want && fabs(g_logprob - want_lp) < 1e-6 && g_len == 2 && g_history[1] == want;
    printf("cpu sample op, greedy with penalty 1.3 on the top token %d: token %d (want %d), log-prob %.6f (want %.6f)\n",
           top, g_token, want, g_logprob, want_lp);
    if (!ok) failures++;
}

/* vLLM's logit bias and penalties (sampler_apply_penalties) against tests/data/penalty_goldens.json
 * (tests/ref/make_penalty_goldens.py: transformers' SequenceBias and RepetitionPenalty processors, vLLM's
 * frequency and presence lines); the CPU op equals the host function bit for bit, its scratch stays zero. */
static void test_penalties(void) {
    json_error_t jerr;
    json_t *cases = json_load_file(COLT_SOURCE_DIR "/tests/data/penalty_goldens.json", 0, &jerr);
    if (!cases || json_array_size(cases) != 14) {
        fprintf(stderr, "FAIL: cannot read 14 cases from penalty_goldens.json\n");
        failures++;
        json_decref(cases);
        return;
    }
    enum { V = 64 };
    const Backend *cpu = backend_cpu();
    int scratch[V] = {0}, n_equal = 0, n_moved = 0, op_same = 1, scratch_zero = 1;
    double worst = 0.0;
    for (size_t c = 0; c < json_array_size(cases); c++) {
        json_t *cs = json_array_get(cases, c);
        SamplingParams p = sampling_params_greedy();
        p.repetition_penalty = (float)json_number_value(json_object_get(cs, "repetition_penalty"));
        p.frequency_penalty = (float)json_number_value(json_object_get(cs, "frequency_penalty"));
        p.presence_penalty = (float)json_number_value(json_object_get(cs, "presence_penalty"));
        json_t *jl = json_object_get(cs, "logits"), *jh = json_object_get(cs, "history"),
               *jw = json_object_get(cs, "penalised"), *ji = json_object_get(cs, "bias_ids"),
               *jv = json_object_get(cs, "bias_values");
        int n_hist = (int)json_array_size(jh), n_prompt = (int)json_integer_value(json_object_get(cs, "n_prompt"));
        int n_bias = (int)json_array_size(ji), history[64], bias_ids[8];
        float logits[V], by_op[V], bias_values[8];
        for (int i = 0; i < V; i++) logits[i] = by_op[i] = (float)json_number_value(json_array_get(jl, (size_t)i));
        for (int i = 0; i < n_hist; i++) history[i] = (int)json_integer_value(json_array_get(jh, (size_t)i));
        for (int j = 0; j < n_bias; j++) {
            bias_ids[j] = (int)json_integer_value(json_array_get(ji, (size_t)j));
            bias_values[j] = (float)json_number_value(json_array_get(jv, (size_t)j));
        }
        sampler_apply_penalties(logits, V, &p, history, n_hist, n_prompt, bias_ids, bias_values, n_bias, scratch);
        double max_diff = 0.0;
        int moved = 0;
        for (int i = 0; i < V; i++) {
            double want = json_number_value(json_array_get(jw, (size_t)i));
            max_diff = fmax(max_diff, fabs(want - logits[i]));
            moved |= want != json_number_value(json_array_get(jl, (size_t)i));
            scratch_zero &= scratch[i] == 0;
        }
        worst = fmax(worst, max_diff);
        n_equal += max_diff <= 1e-6;
        n_moved += moved;
        if (max_diff > 1e-6)
            fprintf(stderr, "FAIL penalty case %zu (rep %g freq %g pres %g, %d biases): max |diff| %.3g\n", c,
                    p.repetition_penalty, p.frequency_penalty, p.presence_penalty, n_bias, max_diff);
        /* the backend op, one row of sequence 0 */
        int seq = 0, len = n_hist, stride = n_hist;
        cpu->apply_penalties(cpu, by_op, 1, V, &p, &seq, history, &len, &n_prompt, stride, n_bias ? bias_ids : NULL,
                             bias_values, &n_bias, n_bias);
        op_same &= memcmp(by_op, logits, sizeof logits) == 0;
    }
    printf("penalties and logit bias vs transformers' processors and vLLM's lines: %d/%zu cases within 1e-6 "
           "(worst %.2g; %d cases changed some logit), cpu op bit-identical: %s, scratch left zero: %s\n",
           n_equal, json_array_size(cases), worst, n_moved, op_same ? "yes" : "NO", scratch_zero ? "yes" : "NO");
    if (n_equal != (int)json_array_size(cases) || n_moved != (int)json_array_size(cases) || !op_same || !scratch_zero)
        failures++;
    json_decref(cases);
}

int main(void) {
    test_penalties();
    json_error_t jerr;
    json_t *cases = json_load_file(COLT_SOURCE_DIR "/tests/data/sampler_goldens.json", 0, &jerr);
    if (!cases || json_array_size(cases) != 27) {
        fprintf(stderr, "cannot read 27 cases from sampler_goldens.json\n");
        return 1;
    }
    const int V = 64;
    Sampler s;
    sampler_init(&s, V);
    float logits[64], probs[64];
    int history[64];
    double worst = 0.0;
    size_t n_equal = 0;
    for (size_t c = 0; c < json_array_size(cases); c++) {
        json_t *cs = json_array_get(cases, c), *st = json_object_get(cs, "settings");
        SamplingParams p = {
            .temperature = (float)json_number_value(json_object_get(st, "temperature")),
            .top_k = (int)json_integer_value(json_object_get(st, "top_k")),
            .top_p = (float)json_number_value(json_object_get(st, "top_p")),
            .min_p = (float)json_number_value(json_object_get(st, "min_p")),
            .repetition_penalty = (float)json_number_value(json_object_get(st, "repetition_penalty")),
            .seed = 1234,
        };
        json_t *jl = json_object_get(cs, "logits"), *jh = json_object_get(cs, "history"), *jp = json_object_get(cs, "probs");
        int n_hist = (int)json_array_size(jh);
        for (int i = 0; i < V; i++) logits[i] = (float)json_number_value(json_array_get(jl, (size_t)i));
        for (int i = 0; i < n_hist; i++) history[i] = (int)json_integer_value(json_array_get(jh, (size_t)i));
        sampler_distribution(&s, logits, &p, history, n_hist, probs);
        double max_diff = 0.0;
        int support_ok = 1;
        for (int i = 0; i < V; i++) {
            double want = json_number_value(json_array_get(jp, (size_t)i));
            double d = fabs(want - probs[i]);
            if (d > max_diff) max_diff = d;
            if ((want == 0.0) != (probs[i] == 0.0f)) support_ok = 0;
        }
        if (max_diff > worst) worst = max_diff;
        if (max_diff < 1e-6 && support_ok) n_equal++;
        else {
            failures++;
            fprintf(stderr, "FAIL case %zu (T=%g k=%d p=%g min_p=%g rep=%g): max |p - transformers| = %.3g, same support %d\n",
                    c, p.temperature, p.top_k, p.top_p, p.min_p, p.repetition_penalty, max_diff, support_ok);
        }
    }
    printf("distribution vs transformers processors: %zu/%zu cases equal (max |diff| %.3g, tol 1e-6, same kept set)\n",
           n_equal, json_array_size(cases), worst);

    /* Draws follow the distribution: 40000 streams, one draw each. */
    json_t *cs = json_array_get(cases, 7), *st = json_object_get(cs, "settings");
    SamplingParams p = {.temperature = (float)json_number_value(json_object_get(st, "temperature")),
                        .top_k = 20, .top_p = (float)json_number_value(json_object_get(st, "top_p")),
                        .min_p = 0.0f, .repetition_penalty = 1.0f, .seed = 99};
    float base[64];
    for (int i = 0; i < V; i++) base[i] = (float)json_number_value(json_array_get(json_object_get(cs, "logits"), (size_t)i));
    memcpy(logits, base, sizeof logits);
    sampler_distribution(&s, logits, &p, NULL, 0, probs);
    const int draws = 40000;
    static int counts[64];
    for (int d = 0; d < draws; d++) {
        memcpy(logits, base, sizeof logits);
        counts[sampler_sample(&s, logits, &p, NULL, 0, (uint64_t)d, 0, NULL)]++;
    }
    double max_dev = 0.0;
    int outside = 0;
    for (int i = 0; i < V; i++) {
        double f = (double)counts[i] / draws;
        double sigma = sqrt(probs[i] * (1 - probs[i]) / draws) + 1e-9;
        if (fabs(f - probs[i]) > max_dev) max_dev = fabs(f - probs[i]);
        if (fabs(f - probs[i]) > 5 * sigma) outside++;
        if (probs[i] == 0.0f && counts[i] > 0) outside++;
    }
    printf("sampling frequencies over %d draws: max |freq - p| = %.4f, %d tokens beyond 5 sigma or outside the kept set\n",
           draws, max_dev, outside);
    if (outside) failures++;

    /* The draw walks the kept tokens in id order (filtered and not). */
    int wrong_order = 0;
    SamplingParams plain = p;
    plain.top_k = 0, plain.top_p = 1.0f;
    for (int d = 0; d < 2000; d++) {
        const SamplingParams *q = d % 2 ? &p : &plain;
        memcpy(logits, base, sizeof logits);
        sampler_distribution(&s, logits, q, NULL, 0, probs);
        memcpy(logits, base, sizeof logits);
        int t = sampler_sample(&s, logits, q, NULL, 0, (uint64_t)d, 1, NULL);
        if (t != draw_in_id_order(probs, V, rng_uniform(q->seed, (uint64_t)d, 1))) wrong_order++;
    }
    printf("draws in ascending id order over the kept tokens: %d/2000 differ\n", wrong_order);
    if (wrong_order) failures++;

    /* A draw depends only on (seed, stream, counter). */
    memcpy(logits, base, sizeof logits);
    int a = sampler_sample(&s, logits, &p, NULL, 0, 5, 3, NULL);
    memcpy(logits, base, sizeof logits);
    (void)sampler_sample(&s, logits, &p, NULL, 0, 6, 3, NULL);
    memcpy(logits, base, sizeof logits);
    int b = sampler_sample(&s, logits, &p, NULL, 0, 5, 3, NULL);
    printf("same (seed, stream, counter) gives the same token: %s\n", a == b ? "yes" : "NO");
    if (a != b) failures++;

    /* Greedy returns the argmax and its log-prob. */
    SamplingParams g = sampling_params_greedy();
    memcpy(logits, base, sizeof logits);
    float lp;
    int t = sampler_sample(&s, logits, &g, NULL, 0, 0, 0, &lp);
    int best = 0;
    for (int i = 1; i < V; i++)
        if (base[i] > base[best]) best = i;
    double want_lp = logsoftmax_at(base, V, best);
    printf("greedy: token %d (argmax %d), logprob %.6f (want %.6f)\n", t, best, lp, want_lp);
    if (t != best || fabs(lp - want_lp) > 1e-5) failures++;

    char err[ERR_LEN];
    SamplingParams bad = g;
    bad.top_p = 1.5f;
    if (sampling_params_validate(&bad, err) == 0 || !strstr(err, "top_p")) failures++;
    sampler_free(&s);
    test_cpu_sample_op(base, V);
    json_decref(cases);
    printf("%s\n", failures ? "FAILED" : "all sampler checks passed");
    return failures ? 1 : 0;
}
