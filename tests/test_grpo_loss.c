/* test_grpo_loss.c — grpo.c against TRL's own code (tests/data/grpo_goldens.json
 * from tests/ref/make_grpo_goldens.py): for every loss_type x importance level x
 * beta x old log-probs present/absent x gradient accumulation (and delta on or
 * off), the loss within 1e-6 relative, d loss / d logp within 1e-6 relative +
 * 1e-9 absolute, and the clip / kl metrics; then reward aggregation and
 * advantages for every scale_rewards, NaN rewards and reward weights; then the
 * option parsers. Exits non-zero on any mismatch. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "train/grpo.h"

#define N_LOSS_CASES 66
#define N_ADV_CASES 12
#define MAX_BT 64

static int failures = 0;

static double num(const json_t *o, const char *key) { return json_number_value(json_object_get(o, key)); }

/* Reads a JSON array of numbers (null = NaN) into dst; returns its length. */
static int read_floats(float *dst, int cap, const json_t *arr) {
    int n = (int)json_array_size(arr);
    if (n > cap) {
        fprintf(stderr, "golden array of %d values exceeds %d\n", n, cap);
        exit(1);
    }
    for (int i = 0; i < n; i++) {
        const json_t *v = json_array_get(arr, (size_t)i);
        dst[i] = json_is_null(v) ? NAN : (float)json_number_value(v);
    }
    return n;
}

static int read_doubles(double *dst, int cap, const json_t *arr) {
    int n = (int)json_array_size(arr);
    if (n > cap) {
        fprintf(stderr, "golden array of %d values exceeds %d\n", n, cap);
        exit(1);
    }
    for (int i = 0; i < n; i++) {
        const json_t *v = json_array_get(arr, (size_t)i);
        dst[i] = json_is_null(v) ? NAN : json_number_value(v);
    }
    return n;
}

static int test_loss_cases(const json_t *root) {
    const int B = (int)json_integer_value(json_object_get(root, "B"));
    const int T = (int)json_integer_value(json_object_get(root, "T"));
    float logp[MAX_BT], old_logp[MAX_BT], ref_logp[MAX_BT], mask[MAX_BT], adv[MAX_BT], dlogp[MAX_BT];
    if (B * T > MAX_BT || read_floats(logp, MAX_BT, json_object_get(root, "logp")) != B * T) {
        fprintf(stderr, "bad golden shapes\n");
        return 1;
    }
    read_floats(old_logp, MAX_BT, json_object_get(root, "old_logp"));
    read_floats(ref_logp, MAX_BT, json_object_get(root, "ref_logp"));
    read_floats(mask, MAX_BT, json_object_get(root, "mask"));
    read_floats(adv, MAX_BT, json_object_get(root, "advantages"));

    const json_t *cases = json_object_get(root, "loss_cases");
    if (json_array_size(cases) != N_LOSS_CASES) {
        fprintf(stderr, "FAIL expected %d loss cases, the goldens have %zu\n", N_LOSS_CASES, json_array_size(cases));
        return 1;
    }
    int passed = 0;
    double worst_loss = 0.0, worst_grad = 0.0;
    for (size_t c = 0; c < json_array_size(cases); c++) {
        const json_t *cs = json_array_get(cases, c);
        const char *name = json_string_value(json_object_get(cs, "name"));
        GrpoLossConfig cfg = {
            .epsilon_low = (float)num(root, "epsilon_low"),
            .epsilon_high = (float)num(root, "epsilon_high"),
            .delta = (float)num(cs, "delta"),
            .beta = (float)num(cs, "beta"),
            .max_completion_length = (int)json_integer_value(json_object_get(root, "max_completion_length")),
            .gradient_accumulation_steps = (int)json_integer_value(json_object_get(cs, "gas")),
            .num_items_in_batch = (float)num(cs, "num_items_in_batch"),
        };
        char err[ERR_LEN];
        if (grpo_loss_type_parse(&cfg.loss_type, json_string_value(json_object_get(cs, "loss_type")), err) ||
            grpo_importance_level_parse(&cfg.importance_sampling_level,
                                        json_string_value(json_object_get(cs, "level")), err)) {
            fprintf(stderr, "FAIL %s: %s\n", name, err);
            failures++;
            continue;
        }
        bool with_old = json_is_true(json_object_get(cs, "with_old"));
        float loss;
        GrpoLossMetrics met;
        if (grpo_loss(&loss, dlogp, &met, &cfg, logp, with_old ? old_logp : NULL, cfg.beta != 0.0f ? ref_logp : NULL,
                      mask, adv, B, T, err)) {
            fprintf(stderr, "FAIL %s: %s\n", name, err);
            failures++;
            continue;
        }
        double want_loss = num(cs, "loss");
        double loss_diff = fabs(loss - want_loss);
        int ok = loss_diff <= 1e-6 * fabs(want_loss);
        double grad_diff = 0.0;
        const json_t *jg = json_object_get(cs, "dlogp");
        for (int i = 0; i < B * T; i++) {
            double want = json_number_value(json_array_get(jg, (size_t)i));
            double d = fabs(dlogp[i] - want);
            if (d > grad_diff) grad_diff = d;
            if (d > 1e-6 * fabs(want) + 1e-9) ok = 0;
        }
        double metric_diff = fmax(fmax(fabs(met.clip_ratio_low - num(cs, "clip_ratio_low")),
                                       fabs(met.clip_ratio_high - num(cs, "clip_ratio_high"))),
                                  fmax(fabs(met.clip_ratio_region - num(cs, "clip_ratio_region")),
                                       fabs(met.kl - num(cs, "kl"))));
        if (metric_diff > 1e-6) ok = 0;
        if (loss_diff > worst_loss) worst_loss = loss_diff;
        if (grad_diff > worst_grad) worst_grad = grad_diff;
        printf("%s %s: loss %.6g (TRL %.6g) diff %.2g, grad max diff %.2g, clip low/high/region %.4g/%.4g/%.4g kl %.4g "
               "(metric diff %.2g)\n",
               ok ? "ok  " : "FAIL", name, (double)loss, want_loss, loss_diff, grad_diff, met.clip_ratio_low,
               met.clip_ratio_high, met.clip_ratio_region, met.kl, metric_diff);
        if (ok) passed++;
        else failures++;
    }
    printf("loss: %d/%d cases match TRL (worst loss diff %.2g, worst grad diff %.2g)\n", passed, N_LOSS_CASES,
           worst_loss, worst_grad);
    return 0;
}

static int same_or_both_nan(double a, double b, double tol) {
    if (isnan(a) || isnan(b)) return isnan(a) && isnan(b);
    return fabs(a - b) <= tol * fabs(b) + 1e-9;
}

static int test_advantage_cases(const json_t *root) {
    const json_t *cases = json_object_get(root, "advantage_cases");
    if (json_array_size(cases) != N_ADV_CASES) {
        fprintf(stderr, "FAIL expected %d advantage cases, the goldens have %zu\n", N_ADV_CASES,
                json_array_size(cases));
        return 1;
    }
    int passed = 0;
    for (size_t c = 0; c < json_array_size(cases); c++) {
        const json_t *cs = json_array_get(cases, c);
        const char *name = json_string_value(json_object_get(cs, "name"));
        float per_func[MAX_BT], weights[8];
        double want_rewards[MAX_BT], want_adv[MAX_BT], want_std[MAX_BT];
        float rewards[MAX_BT], adv[MAX_BT], std[MAX_BT];
        int n = (int)json_integer_value(json_object_get(cs, "n"));
        int n_funcs = (int)json_integer_value(json_object_get(cs, "n_funcs"));
        int G = (int)json_integer_value(json_object_get(cs, "num_generations"));
        read_floats(per_func, MAX_BT, json_object_get(cs, "per_func"));
        read_floats(weights, 8, json_object_get(cs, "weights"));
        read_doubles(want_rewards, MAX_BT, json_object_get(cs, "rewards"));
        read_doubles(want_adv, MAX_BT, json_object_get(cs, "advantages"));
        int n_std = read_doubles(want_std, MAX_BT, json_object_get(cs, "std"));
        GrpoScaleRewards scale;
        char err[ERR_LEN];
        if (grpo_scale_rewards_parse(&scale, json_string_value(json_object_get(cs, "scale_rewards")), err)) {
            fprintf(stderr, "FAIL %s: %s\n", name, err);
            failures++;
            continue;
        }
        grpo_combine_rewards(rewards, per_func, weights, n, n_funcs);
        grpo_advantages(adv, std, rewards, n, G, scale);
        int ok = n_std == n / G;
        double max_diff = 0.0;
        for (int i = 0; i < n; i++) {
            ok &= same_or_both_nan(rewards[i], want_rewards[i], 1e-6);
            ok &= same_or_both_nan(adv[i], want_adv[i], 1e-6);
            if (!isnan(want_adv[i])) max_diff = fmax(max_diff, fabs(adv[i] - want_adv[i]));
        }
        /* frac_reward_zero_std as TRL logs it: isclose(std, 0) per completion (NaN is not close) */
        int zero = 0;
        for (int g = 0; g < n / G; g++) {
            ok &= same_or_both_nan(std[g], want_std[g], 1e-6);
            if (fabs(std[g]) <= 1e-8) zero += G;
        }
        double frac = (double)zero / n;
        ok &= fabs(frac - num(cs, "frac_reward_zero_std")) < 1e-6;
        printf("%s advantages %s: max diff %.2g, frac_reward_zero_std %.4g\n", ok ? "ok  " : "FAIL", name, max_diff,
               frac);
        if (ok) passed++;
        else failures++;
    }
    printf("advantages: %d/%d cases match TRL\n", passed, N_ADV_CASES);
    return 0;
}

static void check(int cond, const char *what) {
    if (!cond) {
        fprintf(stderr, "FAIL %s\n", what);
        failures++;
    }
}

static void test_parsers_and_errors(void) {
    char err[ERR_LEN];
    GrpoLossType lt;
    GrpoScaleRewards sr;
    GrpoImportanceLevel il;
    check(grpo_loss_type_parse(&lt, "dr_grpo", err) == 0 && lt == LOSS_DR_GRPO, "parse dr_grpo");
    check(grpo_loss_type_parse(&lt, "ppo", err) < 0 && strstr(err, "dapo"), "reject loss_type ppo, naming the valid ones");
    check(grpo_scale_rewards_parse(&sr, "true", err) == 0 && sr == SCALE_GROUP, "scale_rewards true = group");
    check(grpo_scale_rewards_parse(&sr, "false", err) == 0 && sr == SCALE_NONE, "scale_rewards false = none");
    check(grpo_scale_rewards_parse(&sr, "batch", err) == 0 && sr == SCALE_BATCH, "scale_rewards batch");
    check(grpo_scale_rewards_parse(&sr, "grp", err) < 0, "reject scale_rewards grp");
    check(grpo_importance_level_parse(&il, "sequence", err) == 0 && il == IS_LEVEL_SEQUENCE, "parse sequence");
    check(grpo_importance_level_parse(&il, "tok", err) < 0, "reject importance level tok");

    float logp[2] = {-1, -2}, mask[2] = {1, 1}, adv[1] = {1}, dl[2], loss;
    GrpoLossConfig cfg = {.loss_type = LOSS_GRPO, .epsilon_low = 0.2f, .epsilon_high = 0.2f, .beta = 0.04f,
                          .gradient_accumulation_steps = 1};
    check(grpo_loss(&loss, dl, NULL, &cfg, logp, NULL, NULL, mask, adv, 1, 2, err) < 0 && strstr(err, "beta"),
          "beta > 0 without reference log-probs is an error");
    cfg.beta = 0.0f;
    cfg.gradient_accumulation_steps = 0;
    check(grpo_loss(&loss, dl, NULL, &cfg, logp, NULL, NULL, mask, adv, 1, 2, err) < 0,
          "gradient_accumulation_steps 0 is an error");
    cfg.gradient_accumulation_steps = 1;
    cfg.loss_type = LOSS_DR_GRPO;
    check(grpo_loss(&loss, dl, NULL, &cfg, logp, NULL, NULL, mask, adv, 1, 2, err) < 0 &&
              strstr(err, "max_completion_length"),
          "dr_grpo without max_completion_length is an error");
}

int main(void) {
    json_error_t jerr;
    json_t *root = json_load_file(COLT_SOURCE_DIR "/tests/data/grpo_goldens.json", 0, &jerr);
    if (!root) {
        fprintf(stderr, "cannot read tests/data/grpo_goldens.json: %s\n", jerr.text);
        return 1;
    }
    printf("goldens from TRL %s\n", json_string_value(json_object_get(root, "trl_version")));
    if (test_loss_cases(root) || test_advantage_cases(root)) failures++;
    test_parsers_and_errors();
    json_decref(root);
    if (failures) {
        fprintf(stderr, "%d failure(s)\n", failures);
        return 1;
    }
    printf("all %d loss cases, %d advantage cases and the parser checks pass\n", N_LOSS_CASES, N_ADV_CASES);
    return 0;
}
