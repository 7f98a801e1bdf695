/* test_sampler.c — the sampler against transformers' logits processors
 * (tests/data/sampler_goldens.json from tests/ref/make_sampler_goldens.py):
 * the distribution it draws from must equal softmax of the processed logits;
 * draws must follow that distribution and depend only on (seed, stream, counter). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "engine/sampler.h"

static int failures = 0;

int main(void) {
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
    json_decref(cases);
    printf("%s\n", failures ? "FAILED" : "all sampler checks passed");
    return failures ? 1 : 0;
}
