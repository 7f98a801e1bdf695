/* test_grpo_loss.c — grpo.c against TRL's own code (tests/data/grpo_goldens.json
 * from tests/ref/make_grpo_goldens.py): for every loss_type (TRL 1.16's eight:
 * grpo, bnpo, dr_grpo, dapo, cispo, sapo, luspo, vespo) x importance level x
 * beta x old log-probs present/absent x gradient accumulation (and delta on or
 * off, and the sampling correction's weights), the loss within 1e-6 relative
 * (+ 1e-12), d loss / d logp within 1e-6 relative + 1e-9 absolute, and the clip
 * (mean, low_min, high_max), cispo, vespo and kl metrics; then reward aggregation and
 * advantages for every scale_rewards, NaN rewards and reward weights; then the
 * option parsers. Then TRL 1.16's masks (same goldens): the off-policy sequence
 * mask for every loss_type and level (engine log-probs with a NaN, old ones, none),
 * the entropy mask at several quantiles (the pool over one and two processes),
 * use_bias_correction_kl = false, the entropy bonus (d loss / d entropy and
 * policy_loss), and the adaptive entropy controller's state over five optimizer
 * steps, all at the tolerances above.
 * Then TRL's vLLM importance-sampling correction (tests/data/is_goldens.json
 * from tests/ref/make_is_goldens.py): for every vllm_importance_sampling_mode x
 * clip bounds x loss_type x importance level x beta, the IS weights (1e-6
 * relative: they are stored as float), the sampling metrics (1e-9 relative),
 * the weighted loss and d loss / d logp at the tolerances above; the metrics of
 * an all-masked batch and of three processes reduced as TRL gathers them; then
 * the config keys of the correction (defaults, parsing, errors).
 * Exits non-zero on any mismatch. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "train/grpo.h"
#include "train/train_config.h"

#define N_LOSS_CASES 103
#define N_ADV_CASES 18 /* 12 sum_then_normalize (3 scales x 2 weights x 2 group sizes), 6 normalize_then_sum */
#define N_IS_CASES 148
#define N_IS_METRIC_CASES 24
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
    float is_ratio[MAX_BT];
    read_floats(is_ratio, MAX_BT, json_object_get(root, "is_ratio"));

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
            .epsilon_high = (float)num(cs, "epsilon_high"),
            .delta = (float)num(cs, "delta"),
            .beta = (float)num(cs, "beta"),
            .max_completion_length = (int)json_integer_value(json_object_get(root, "max_completion_length")),
            .gradient_accumulation_steps = (int)json_integer_value(json_object_get(cs, "gas")),
            .num_items_in_batch = (float)num(cs, "num_items_in_batch"),
            .sapo_temperature_neg = (float)num(root, "sapo_temperature_neg"),
            .sapo_temperature_pos = (float)num(root, "sapo_temperature_pos"),
            .vespo_k_pos = (float)num(root, "vespo_k_pos"),
            .vespo_lambda_pos = (float)num(root, "vespo_lambda_pos"),
            .vespo_k_neg = (float)num(root, "vespo_k_neg"),
            .vespo_lambda_neg = (float)num(root, "vespo_lambda_neg"),
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
        bool with_is = json_is_true(json_object_get(cs, "with_is"));
        if (grpo_loss_with_is_weight(&loss, dlogp, &met, &cfg, logp, with_old ? old_logp : NULL,
                                     cfg.beta != 0.0f ? ref_logp : NULL, with_is ? is_ratio : NULL, mask, adv, B, T,
                                     err)) {
            fprintf(stderr, "FAIL %s: %s\n", name, err);
            failures++;
            continue;
        }
        double want_loss = num(cs, "loss");
        double loss_diff = fabs(loss - want_loss);
        int ok = loss_diff <= 1e-6 * fabs(want_loss) + 1e-12; /* float rounding of a double sum */
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
        /* the newer metrics: clip_ratio/low_min and high_max where TRL logs them (null elsewhere), cispo's
         * and vespo's own */
        const json_t *jmin = json_object_get(cs, "clip_ratio_low_min"), *jmax = json_object_get(cs, "clip_ratio_high_max");
        double newer[4] = {json_is_number(jmin) ? fabs(met.clip_ratio_low_min - json_number_value(jmin)) : 0.0,
                           json_is_number(jmax) ? fabs(met.clip_ratio_high_max - json_number_value(jmax)) : 0.0,
                           fabs(met.cispo_clip_ratio - num(cs, "cispo_clip_ratio")),
                           fabs(met.vespo_phi_seq_mean - num(cs, "vespo_phi_seq_mean"))};
        for (int k = 0; k < 4; k++) metric_diff = newer[k] > metric_diff || isnan(newer[k]) ? newer[k] : metric_diff;
        if (!(metric_diff <= 1e-6)) ok = 0; /* NaN fails too */
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
        GrpoAggregation aggregation = AGGREGATE_SUM_THEN_NORMALIZE;
        const char *agg = json_string_value(json_object_get(cs, "aggregation"));
        if (agg && grpo_aggregation_parse(&aggregation, agg, err)) {
            fprintf(stderr, "FAIL %s: %s\n", name, err);
            failures++;
            continue;
        }
        grpo_combine_rewards(rewards, per_func, weights, n, n_funcs); /* the logged reward, in both modes */
        if (aggregation == AGGREGATE_NORMALIZE_THEN_SUM) {
            float batch_std;
            grpo_advantages_normalize_then_sum(adv, &batch_std, per_func, weights, n, n_funcs, G);
            for (int g = 0; g < n / G; g++) std[g] = batch_std;
        } else {
            grpo_advantages(adv, std, rewards, n, G, scale);
        }
        int ok = n_std == n / G;
        double max_diff = 0.0, adv_scale = 1.0; /* advantages within 1e-6 of the case's largest (or of 1): an
                                                  * advantage near 0 is a difference of near-equal sums, whose
                                                  * last bits depend on the summation order */
        for (int i = 0; i < n; i++) adv_scale = fmax(adv_scale, fabs(want_adv[i]));
        for (int i = 0; i < n; i++) {
            ok &= same_or_both_nan(rewards[i], want_rewards[i], 1e-6);
            ok &= !isnan(adv[i]) && fabs(adv[i] - want_adv[i]) <= 1e-6 * adv_scale;
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

/* ---------------------------------------------------------------- masks and the entropy bonus */

#define N_MASK_CASES 49
#define N_ADAPTIVE_CALLS 10

/* The worst |got - want| over n values against a golden array (relative 1e-6 + abs 1e-9 passes). */
static double golden_diff(const float *got, const json_t *arr, int n, int *ok) {
    double worst = 0.0;
    if ((int)json_array_size(arr) != n) {
        *ok = 0;
        return INFINITY;
    }
    for (int i = 0; i < n; i++) {
        double want = json_number_value(json_array_get(arr, (size_t)i));
        double d = fabs((double)got[i] - want);
        if (!(d <= worst)) worst = d;
        if (!(d <= 1e-6 * fabs(want) + 1e-9)) *ok = 0;
    }
    return worst;
}

typedef struct MaskInputs {
    int B, T;
    float logp[MAX_BT], old_logp[MAX_BT], ref_logp[MAX_BT], mask[MAX_BT], adv[MAX_BT];
    float entropy[MAX_BT], sampling[MAX_BT], other[MAX_BT], is_ratio[MAX_BT];
    int n_other;
} MaskInputs;

static GrpoLossConfig mask_case_config(const json_t *root, const json_t *cs) {
    GrpoLossConfig cfg = {
        .epsilon_low = (float)num(root, "epsilon_low"),
        .epsilon_high = (float)num(cs, "epsilon_high"),
        .beta = (float)num(cs, "beta"),
        .max_completion_length = (int)json_integer_value(json_object_get(root, "max_completion_length")),
        .gradient_accumulation_steps = (int)json_integer_value(json_object_get(cs, "gas")),
        .num_items_in_batch = (float)num(cs, "num_items_in_batch"),
        .sapo_temperature_neg = (float)num(root, "sapo_temperature_neg"),
        .sapo_temperature_pos = (float)num(root, "sapo_temperature_pos"),
        .vespo_k_pos = (float)num(root, "vespo_k_pos"),
        .vespo_lambda_pos = (float)num(root, "vespo_lambda_pos"),
        .vespo_k_neg = (float)num(root, "vespo_k_neg"),
        .vespo_lambda_neg = (float)num(root, "vespo_lambda_neg"),
        .kl_without_bias_correction = json_is_false(json_object_get(cs, "bias_kl")),
        .off_policy_mask = json_is_number(json_object_get(cs, "off_policy")),
        .off_policy_mask_threshold = (float)num(cs, "off_policy"),
        .entropy_bonus = num(cs, "entropy_coef") != 0.0,
        .entropy_coef_applied = num(cs, "entropy_coef"),
    };
    return cfg;
}

/* The entropy mask as the trainer makes it: this process's counted entropies, plus the other process's
 * when the case spans two, into the quantile's pool. */
static int mask_case_entropy_mask(float *emask, const MaskInputs *in, double top_q, bool with_other, char *err) {
    float pool[2 * MAX_BT];
    size_t n = 0;
    for (int i = 0; i < in->B * in->T; i++)
        if (in->mask[i] != 0.0f) pool[n++] = in->entropy[i];
    if (with_other)
        for (int i = 0; i < in->n_other; i++) pool[n++] = in->other[i];
    return grpo_high_entropy_mask(emask, NULL, in->entropy, in->mask, in->B, in->T, pool, n, 1.0 - top_q, err);
}

static void test_mask_cases(const json_t *root, const MaskInputs *in) {
    const int B = in->B, T = in->T;
    const json_t *cases = json_object_get(root, "mask_cases");
    if (json_array_size(cases) != N_MASK_CASES) {
        fprintf(stderr, "FAIL expected %d mask cases, the goldens have %zu\n", N_MASK_CASES, json_array_size(cases));
        failures++;
        return;
    }
    int passed = 0, dropped_rows = 0, masked_tokens = 0;
    double worst_loss = 0.0, worst_grad = 0.0, worst_dent = 0.0;
    for (size_t c = 0; c < json_array_size(cases); c++) {
        const json_t *cs = json_array_get(cases, c);
        const char *name = json_string_value(json_object_get(cs, "name"));
        GrpoLossConfig cfg = mask_case_config(root, cs);
        char err[ERR_LEN];
        if (grpo_loss_type_parse(&cfg.loss_type, json_string_value(json_object_get(cs, "loss_type")), err) ||
            grpo_importance_level_parse(&cfg.importance_sampling_level,
                                        json_string_value(json_object_get(cs, "level")), err)) {
            fprintf(stderr, "FAIL %s: %s\n", name, err);
            failures++;
            continue;
        }
        int ok = 1;
        double top_q = num(cs, "top_entropy_quantile");
        float emask[MAX_BT], dlogp[MAX_BT], dent[MAX_BT], loss;
        double emask_diff = 0.0;
        if (top_q < 1.0) {
            if (mask_case_entropy_mask(emask, in, top_q, json_is_true(json_object_get(cs, "with_other")), err)) {
                fprintf(stderr, "FAIL %s: %s\n", name, err);
                failures++;
                continue;
            }
            emask_diff = golden_diff(emask, json_object_get(cs, "entropy_mask"), B * T, &ok);
        }
        GrpoLossInputs li = {
            .is_weight = json_is_true(json_object_get(cs, "with_is")) ? in->is_ratio : NULL,
            .sampling_logp = json_is_true(json_object_get(cs, "with_sampling")) ? in->sampling : NULL,
            .entropy = in->entropy,
            .entropy_mask = top_q < 1.0 ? emask : NULL,
            .dentropy = dent,
        };
        GrpoLossMetrics met;
        bool with_old = json_is_true(json_object_get(cs, "with_old"));
        if (grpo_loss_compute(&loss, dlogp, &met, &cfg, in->logp, with_old ? in->old_logp : NULL,
                              cfg.beta != 0.0f ? in->ref_logp : NULL, &li, in->mask, in->adv, B, T, err)) {
            fprintf(stderr, "FAIL %s: %s\n", name, err);
            failures++;
            continue;
        }
        double want_loss = num(cs, "loss"), loss_diff = fabs(loss - want_loss);
        if (!(loss_diff <= 1e-6 * fabs(want_loss) + 1e-12)) ok = 0;
        double grad_diff = golden_diff(dlogp, json_object_get(cs, "dlogp"), B * T, &ok);
        double dent_diff = golden_diff(dent, json_object_get(cs, "dentropy"), B * T, &ok);
        static const char *keys[] = {"clip_ratio_low", "clip_ratio_high", "clip_ratio_region", "kl",
                                     "cispo_clip_ratio", "vespo_phi_seq_mean"};
        const double got[] = {met.clip_ratio_low, met.clip_ratio_high, met.clip_ratio_region, met.kl,
                              met.cispo_clip_ratio, met.vespo_phi_seq_mean};
        double metric_diff = 0.0;
        for (int k = 0; k < 6; k++) {
            double d = fabs(got[k] - num(cs, keys[k]));
            if (!(d <= metric_diff)) metric_diff = d;
        }
        const json_t *jpl = json_object_get(cs, "policy_loss"); /* logged by TRL with the bonus only */
        if (json_is_number(jpl) != cfg.entropy_bonus) ok = 0;
        if (json_is_number(jpl)) {
            double d = fabs(met.policy_loss - json_number_value(jpl)) / fmax(1.0, fabs(json_number_value(jpl)));
            if (!(d <= metric_diff)) metric_diff = d;
        }
        if (!(metric_diff <= 1e-6)) ok = 0;
        dropped_rows += met.off_policy_masked_tokens > 0;
        masked_tokens += met.entropy_masked_tokens > 0;
        worst_loss = fmax(worst_loss, loss_diff), worst_grad = fmax(worst_grad, grad_diff);
        worst_dent = fmax(worst_dent, dent_diff);
        printf("%s mask %s: loss %.6g (TRL %.6g) diff %.2g, grad diff %.2g, d entropy diff %.2g, entropy mask diff "
               "%.2g, metric diff %.2g, off-policy dropped %g tokens, entropy mask dropped %g\n",
               ok ? "ok  " : "FAIL", name, (double)loss, want_loss, loss_diff, grad_diff, dent_diff, emask_diff,
               metric_diff, met.off_policy_masked_tokens, met.entropy_masked_tokens);
        if (ok) passed++;
        else failures++;
    }
    if (dropped_rows == 0 || masked_tokens == 0) {
        fprintf(stderr, "FAIL the off-policy mask dropped no row (%d cases) or the entropy mask no token (%d cases): "
                        "the mask cases test nothing\n", dropped_rows, masked_tokens);
        failures++;
    }
    printf("masks: %d/%d cases match TRL (worst loss diff %.2g, grad diff %.2g, d entropy diff %.2g)\n", passed,
           N_MASK_CASES, worst_loss, worst_grad, worst_dent);
}

/* TRL's adaptive controller over optimizer steps of two micro-batches: each call's loss and gradients
 * with the coefficient the controller applies, the window's statistics summed, the state updated at
 * each step's end as TRL's is. */
static void test_adaptive_entropy(const json_t *root, const MaskInputs *in) {
    const int B = in->B, T = in->T;
    const json_t *ad = json_object_get(root, "adaptive"), *calls = json_object_get(ad, "calls");
    if (json_array_size(calls) != N_ADAPTIVE_CALLS) {
        fprintf(stderr, "FAIL expected %d adaptive calls, the goldens have %zu\n", N_ADAPTIVE_CALLS,
                json_array_size(calls));
        failures++;
        return;
    }
    const double target = num(ad, "target"), delta = num(ad, "delta"), cmin = num(ad, "min"), cmax = num(ad, "max");
    GrpoEntropyControl ctl = {.coef = num(ad, "entropy_coef"), .last_world_entropy = INFINITY};
    double window_sum = 0.0, window_count = 0.0;
    int passed = 0, applied_zero = 0;
    for (size_t k = 0; k < json_array_size(calls); k++) {
        const json_t *cs = json_array_get(calls, k);
        float ent[MAX_BT], dlogp[MAX_BT], dent[MAX_BT], loss;
        float sc = (float)num(cs, "scale");
        for (int i = 0; i < B * T; i++) ent[i] = (float)((double)in->entropy[i] * sc); /* f32(entropies * scale) */
        GrpoLossConfig cfg = {.loss_type = LOSS_GRPO, .epsilon_low = (float)num(root, "epsilon_low"),
                              .epsilon_high = (float)num(root, "epsilon_high"),
                              .gradient_accumulation_steps = (int)num(ad, "gas"), .entropy_bonus = true,
                              .entropy_coef_applied = grpo_entropy_coef_applied(&ctl, true, target)};
        applied_zero += cfg.entropy_coef_applied == 0.0;
        GrpoLossInputs li = {.sampling_logp = in->sampling, .entropy = ent, .dentropy = dent};
        GrpoLossMetrics met;
        char err[ERR_LEN];
        int ok = grpo_loss_compute(&loss, dlogp, &met, &cfg, in->logp, in->old_logp, NULL, &li, in->mask, in->adv, B,
                                   T, err) == 0;
        window_sum += met.bonus_entropy_sum, window_count += met.bonus_token_count;
        if (json_is_true(json_object_get(cs, "sync"))) {
            grpo_entropy_control_update(&ctl, window_sum, window_count, target, delta, cmin, cmax);
            window_sum = window_count = 0.0;
        }
        double want_loss = num(cs, "loss"), loss_diff = fabs(loss - want_loss);
        ok &= loss_diff <= 1e-6 * fabs(want_loss) + 1e-12;
        double grad_diff = golden_diff(dlogp, json_object_get(cs, "dlogp"), B * T, &ok);
        double dent_diff = golden_diff(dent, json_object_get(cs, "dentropy"), B * T, &ok);
        double coef_diff = fabs(ctl.coef - num(cs, "coef_after"));
        double want_last = num(cs, "last_world_entropy_after"); /* null: TRL's initial inf */
        const json_t *jl = json_object_get(cs, "last_world_entropy_after");
        bool last_ok = json_is_number(jl) ? fabs(ctl.last_world_entropy - want_last) <= 1e-6 * fabs(want_last)
                                          : isinf(ctl.last_world_entropy);
        ok &= coef_diff <= 1e-12 && last_ok;
        printf("%s adaptive call %zu (scale %.2g%s): applied coef %.4g, loss diff %.2g, grad diff %.2g, d entropy diff "
               "%.2g, coef after %.4g (TRL %.4g), last world entropy %.6g\n",
               ok ? "ok  " : "FAIL", k, (double)sc, json_is_true(json_object_get(cs, "sync")) ? ", step end" : "",
               cfg.entropy_coef_applied, loss_diff, grad_diff, dent_diff, ctl.coef, num(cs, "coef_after"),
               ctl.last_world_entropy);
        if (ok) passed++;
        else failures++;
    }
    if (applied_zero == 0 || applied_zero == N_ADAPTIVE_CALLS) {
        fprintf(stderr, "FAIL the controller's gate never (or always) held the bonus back\n");
        failures++;
    }
    printf("adaptive entropy: %d/%d calls match TRL\n", passed, N_ADAPTIVE_CALLS);
}

static void test_mask_goldens(const json_t *root) {
    static MaskInputs in;
    in.B = (int)json_integer_value(json_object_get(root, "B"));
    in.T = (int)json_integer_value(json_object_get(root, "T"));
    int BT = in.B * in.T;
    read_floats(in.logp, MAX_BT, json_object_get(root, "logp"));
    read_floats(in.old_logp, MAX_BT, json_object_get(root, "old_logp"));
    read_floats(in.ref_logp, MAX_BT, json_object_get(root, "ref_logp"));
    read_floats(in.mask, MAX_BT, json_object_get(root, "mask"));
    in.n_other = read_floats(in.other, MAX_BT, json_object_get(root, "other_entropies"));
    if (read_floats(in.adv, MAX_BT, json_object_get(root, "mask_advantages")) != in.B ||
        read_floats(in.entropy, MAX_BT, json_object_get(root, "entropies")) != BT ||
        read_floats(in.sampling, MAX_BT, json_object_get(root, "sampling_logp")) != BT ||
        read_floats(in.is_ratio, MAX_BT, json_object_get(root, "mask_is_ratio")) != BT || in.n_other < 1) {
        fprintf(stderr, "FAIL bad mask golden shapes\n");
        failures++;
        return;
    }
    test_mask_cases(root, &in);
    test_adaptive_entropy(root, &in);
}

static void test_mask_errors(void) {
    char err[ERR_LEN];
    float e[2] = {0.5f, 1.5f}, m[2] = {1, 1}, pool[2] = {0.5f, 1.5f}, em[2], dl[2], loss;
    float logp[2] = {-1, -2}, adv[1] = {1};
    double thr;
    check(grpo_high_entropy_mask(em, &thr, e, m, 1, 2, pool, 2, 1.5, err) < 0 && strstr(err, "quantile"),
          "a quantile outside [0, 1] is an error");
    check(grpo_high_entropy_mask(em, &thr, e, m, 1, 2, pool, 0, 0.5, err) == 0 && em[0] == 0.0f && em[1] == 0.0f &&
              isnan(thr),
          "an empty pool masks every token (TRL: zeros_like)");
    GrpoLossConfig cfg = {.loss_type = LOSS_GRPO, .epsilon_low = 0.2f, .epsilon_high = 0.2f,
                          .gradient_accumulation_steps = 1, .entropy_bonus = true, .entropy_coef_applied = 0.1};
    GrpoLossInputs li = {0};
    check(grpo_loss_compute(&loss, dl, NULL, &cfg, logp, NULL, NULL, &li, m, adv, 1, 2, err) < 0 &&
              strstr(err, "entrop"),
          "the entropy bonus without entropies is an error");
    GrpoEntropyControl ctl = {.coef = 0.5, .last_world_entropy = INFINITY};
    check(grpo_entropy_coef_applied(&ctl, true, 0.2) == 0.0 && grpo_entropy_coef_applied(&ctl, false, 0.2) == 0.5,
          "no bonus before the first measurement (adaptive); the static coefficient always");
    grpo_entropy_control_update(&ctl, 0.0, 0.0, 0.2, 0.1, 0.0, 0.55);
    check(ctl.coef == 0.55 && ctl.last_world_entropy == 0.0, "an empty window measures 0 (count clamped to 1)");
}

/* ---------------------------------------------------------------- sampling correction */

static double num_or_nan(const json_t *o, const char *key) {
    const json_t *v = json_object_get(o, key);
    return json_is_null(v) ? NAN : json_number_value(v);
}

static int read_is_mode(GrpoSamplingIsMode *mode, const json_t *cs, const char *name) {
    char err[ERR_LEN];
    if (grpo_sampling_is_mode_parse(mode, json_string_value(json_object_get(cs, "mode")), err) == 0) return 0;
    fprintf(stderr, "FAIL %s: %s\n", name, err);
    failures++;
    return -1;
}

/* The five logged values against the golden's, relative 1e-9; returns the worst difference. */
static double sampling_metrics_diff(const GrpoSamplingMetrics *m, const json_t *cs) {
    const double got[5] = {m->logp_difference_mean, m->logp_difference_max, m->is_ratio_min, m->is_ratio_mean,
                           m->is_ratio_max};
    static const char *keys[5] = {"logp_difference_mean", "logp_difference_max", "is_ratio_min", "is_ratio_mean",
                                  "is_ratio_max"};
    double worst = 0.0;
    for (int i = 0; i < 5; i++) {
        double want = num(cs, keys[i]);
        double d = fabs(got[i] - want) / (fabs(want) > 1.0 ? fabs(want) : 1.0);
        if (!(d <= worst)) worst = d;  /* NaN counts as the worst */
    }
    return worst;
}

typedef struct IsInputs {
    int B, T;
    float logp[MAX_BT], old_logp[MAX_BT], sampling_logp[MAX_BT], ref_logp[MAX_BT], mask[MAX_BT], adv[MAX_BT];
} IsInputs;

static void test_is_loss_cases(const json_t *root, const IsInputs *in) {
    const int B = in->B, T = in->T;
    const json_t *cases = json_object_get(root, "cases");
    if (json_array_size(cases) != N_IS_CASES) {
        fprintf(stderr, "FAIL expected %d IS cases, the goldens have %zu\n", N_IS_CASES, json_array_size(cases));
        failures++;
        return;
    }
    int passed = 0, nontrivial_weights = 0;
    double worst_w = 0.0, worst_m = 0.0, worst_loss = 0.0, worst_grad = 0.0;
    for (size_t c = 0; c < json_array_size(cases); c++) {
        const json_t *cs = json_array_get(cases, c);
        const char *name = json_string_value(json_object_get(cs, "name"));
        char err[ERR_LEN];
        GrpoSamplingIsMode mode;
        if (read_is_mode(&mode, cs, name)) continue;
        float weight[MAX_BT], dlogp[MAX_BT];
        double want_weight[MAX_BT];
        GrpoSamplingMetrics sm;
        if (grpo_sampling_is_weights(weight, &sm, in->old_logp, in->sampling_logp, in->mask, B, T, mode,
                                     num_or_nan(cs, "clip_min"), num_or_nan(cs, "clip_max"), err)) {
            fprintf(stderr, "FAIL %s: %s\n", name, err);
            failures++;
            continue;
        }
        int ok = read_doubles(want_weight, MAX_BT, json_object_get(cs, "is_weight")) == B * T;
        double w_diff = 0.0;
        for (int i = 0; i < B * T; i++) {
            double d = fabs((double)weight[i] - want_weight[i]);
            if (d > w_diff) w_diff = d;
            if (!(d <= 1e-6 * fabs(want_weight[i]))) ok = 0;
            if (in->mask[i] != 0.0f && weight[i] != 1.0f) nontrivial_weights++;
        }
        /* Merging single-row calls must give the batch's metrics (how a trainer accumulates them). */
        GrpoSamplingMetrics merged = {0};
        for (int b = 0; b < B; b++) {
            GrpoSamplingMetrics part;
            float row_w[MAX_BT];
            grpo_sampling_is_weights(row_w, &part, in->old_logp + (size_t)b * T, in->sampling_logp + (size_t)b * T,
                                     in->mask + (size_t)b * T, 1, T, mode, num_or_nan(cs, "clip_min"),
                                     num_or_nan(cs, "clip_max"), err);
            grpo_sampling_metrics_merge(&merged, &part);
        }
        double m_diff = fmax(sampling_metrics_diff(&sm, cs), sampling_metrics_diff(&merged, cs));
        if (!(m_diff <= 1e-9)) ok = 0;

        GrpoLossConfig cfg = {
            .epsilon_low = (float)num(root, "epsilon_low"),
            .epsilon_high = (float)num(root, "epsilon_high"),
            .delta = (float)num(cs, "delta"),
            .beta = (float)num(cs, "beta"),
            .max_completion_length = (int)json_integer_value(json_object_get(root, "max_completion_length")),
            .gradient_accumulation_steps = (int)json_integer_value(json_object_get(cs, "gas")),
            .num_items_in_batch = (float)num(cs, "num_items_in_batch"),
        };
        if (grpo_loss_type_parse(&cfg.loss_type, json_string_value(json_object_get(cs, "loss_type")), err) ||
            grpo_importance_level_parse(&cfg.importance_sampling_level,
                                        json_string_value(json_object_get(cs, "level")), err)) {
            fprintf(stderr, "FAIL %s: %s\n", name, err);
            failures++;
            continue;
        }
        float loss;
        GrpoLossMetrics lm;
        if (grpo_loss_with_is_weight(&loss, dlogp, &lm, &cfg, in->logp, in->old_logp,
                                     cfg.beta != 0.0f ? in->ref_logp : NULL, weight, in->mask, in->adv, B, T, err)) {
            fprintf(stderr, "FAIL %s: %s\n", name, err);
            failures++;
            continue;
        }
        double want_loss = num(cs, "loss");
        double loss_diff = fabs(loss - want_loss);
        if (!(loss_diff <= 1e-6 * fabs(want_loss))) ok = 0;
        double grad_diff = 0.0;
        const json_t *jg = json_object_get(cs, "dlogp");
        for (int i = 0; i < B * T; i++) {
            double want = json_number_value(json_array_get(jg, (size_t)i));
            double d = fabs(dlogp[i] - want);
            if (d > grad_diff) grad_diff = d;
            if (!(d <= 1e-6 * fabs(want) + 1e-9)) ok = 0;
        }
        double clip_diff = fmax(fmax(fabs(lm.clip_ratio_low - num(cs, "clip_ratio_low")),
                                     fabs(lm.clip_ratio_high - num(cs, "clip_ratio_high"))),
                                fmax(fabs(lm.clip_ratio_region - num(cs, "clip_ratio_region")),
                                     fabs(lm.kl - num(cs, "kl"))));
        if (!(clip_diff <= 1e-6)) ok = 0;
        worst_w = fmax(worst_w, w_diff), worst_m = fmax(worst_m, m_diff);
        worst_loss = fmax(worst_loss, loss_diff), worst_grad = fmax(worst_grad, grad_diff);
        printf("%s IS %s: weight diff %.2g, sampling metrics diff %.2g (logp diff mean %.4g max %.4g, ratio "
               "min/mean/max %.4g/%.4g/%.4g), loss %.6g (TRL %.6g) diff %.2g, grad max diff %.2g\n",
               ok ? "ok  " : "FAIL", name, w_diff, m_diff, sm.logp_difference_mean, sm.logp_difference_max,
               sm.is_ratio_min, sm.is_ratio_mean, sm.is_ratio_max, (double)loss, want_loss, loss_diff, grad_diff);
        if (ok) passed++;
        else failures++;
    }
    if (nontrivial_weights == 0) {
        fprintf(stderr, "FAIL every IS weight is 1: the IS cases test nothing\n");
        failures++;
    }
    printf("IS: %d/%d cases match TRL (worst weight diff %.2g, metric diff %.2g, loss diff %.2g, grad diff %.2g)\n",
           passed, N_IS_CASES, worst_w, worst_m, worst_loss, worst_grad);
}

/* An all-masked batch alone, and three processes (the batch, the all-masked
 * batch, the batch's first rows) reduced as TRL gathers them. */
static void test_is_metric_cases(const json_t *root, const IsInputs *in) {
    const int T = in->T;
    const json_t *cases = json_object_get(root, "metric_cases"), *ranks = json_object_get(root, "rank_inputs");
    if (json_array_size(cases) != N_IS_METRIC_CASES) {
        fprintf(stderr, "FAIL expected %d IS metric cases, the goldens have %zu\n", N_IS_METRIC_CASES,
                json_array_size(cases));
        failures++;
        return;
    }
    float zeros[MAX_BT] = {0}, weight[MAX_BT];
    int passed = 0;
    for (size_t c = 0; c < json_array_size(cases); c++) {
        const json_t *cs = json_array_get(cases, c);
        const char *name = json_string_value(json_object_get(cs, "name"));
        GrpoSamplingIsMode mode;
        if (read_is_mode(&mode, cs, name)) continue;
        const json_t *rank_ids = json_object_get(cs, "ranks");
        GrpoSamplingMetrics per_rank[8], out = {0};
        int n_ranks = (int)json_array_size(rank_ids), ok = n_ranks >= 1 && n_ranks <= 8;
        char err[ERR_LEN];
        for (int r = 0; ok && r < n_ranks; r++) {
            const json_t *ri = json_array_get(ranks, (size_t)json_integer_value(json_array_get(rank_ids, (size_t)r)));
            int rows = (int)json_integer_value(json_object_get(ri, "rows"));
            const float *mask = json_is_true(json_object_get(ri, "all_masked")) ? zeros : in->mask;
            if (grpo_sampling_is_weights(weight, &per_rank[r], in->old_logp, in->sampling_logp, mask, rows, T, mode,
                                         num_or_nan(cs, "clip_min"), num_or_nan(cs, "clip_max"), err))
                ok = 0;
        }
        if (ok) grpo_sampling_metrics_reduce_ranks(&out, per_rank, n_ranks);
        double diff = ok ? sampling_metrics_diff(&out, cs) : INFINITY;
        ok = ok && diff <= 1e-9;
        printf("%s IS metrics %s: diff %.2g (logp diff mean %.4g max %.4g, ratio min/mean/max %.4g/%.4g/%.4g)\n",
               ok ? "ok  " : "FAIL", name, diff, out.logp_difference_mean, out.logp_difference_max, out.is_ratio_min,
               out.is_ratio_mean, out.is_ratio_max);
        if (ok) passed++;
        else failures++;
    }
    printf("IS metrics: %d/%d cases match TRL\n", passed, N_IS_METRIC_CASES);
}

static void test_is_errors(void) {
    char err[ERR_LEN];
    GrpoSamplingIsMode mode;
    float old[2] = {-1, -2}, smp[2] = {-1.1f, -1.9f}, mask[2] = {1, 1}, w[2];
    check(grpo_sampling_is_mode_parse(&mode, "sequence_mask", err) == 0 && mode == SAMPLING_IS_SEQUENCE_MASK,
          "parse sequence_mask");
    check(grpo_sampling_is_mode_parse(&mode, "token", err) < 0 && strstr(err, "token_truncate") &&
              strstr(err, "sequence_mask"),
          "reject IS mode token, naming the valid ones");
    check(grpo_sampling_is_weights(w, NULL, old, smp, mask, 1, 2, SAMPLING_IS_TOKEN_TRUNCATE, NAN, NAN, err) < 0 &&
              strstr(err, "clip"),
          "token_truncate without bounds is an error");
    check(grpo_sampling_is_weights(w, NULL, old, smp, mask, 1, 2, SAMPLING_IS_TOKEN_MASK, NAN, NAN, err) == 0 &&
              fabsf(w[0] - expf(0.1f)) < 1e-6f,
          "token_mask without bounds keeps every ratio");
}

static void test_is_goldens(void) {
    json_error_t jerr;
    json_t *root = json_load_file(COLT_SOURCE_DIR "/tests/data/is_goldens.json", 0, &jerr);
    if (!root) {
        fprintf(stderr, "FAIL cannot read tests/data/is_goldens.json: %s\n", jerr.text);
        failures++;
        return;
    }
    printf("IS goldens from TRL %s\n", json_string_value(json_object_get(root, "trl_version")));
    static IsInputs in;
    in.B = (int)json_integer_value(json_object_get(root, "B"));
    in.T = (int)json_integer_value(json_object_get(root, "T"));
    int BT = in.B * in.T;
    if (BT <= 0 || BT > MAX_BT || read_floats(in.logp, MAX_BT, json_object_get(root, "logp")) != BT ||
        read_floats(in.old_logp, MAX_BT, json_object_get(root, "old_logp")) != BT ||
        read_floats(in.sampling_logp, MAX_BT, json_object_get(root, "sampling_logp")) != BT ||
        read_floats(in.ref_logp, MAX_BT, json_object_get(root, "ref_logp")) != BT ||
        read_floats(in.mask, MAX_BT, json_object_get(root, "mask")) != BT ||
        read_floats(in.adv, MAX_BT, json_object_get(root, "advantages")) != in.B) {
        fprintf(stderr, "FAIL bad IS golden shapes\n");
        failures++;
    } else {
        test_is_loss_cases(root, &in);
        test_is_metric_cases(root, &in);
    }
    json_decref(root);
}

/* ---------------------------------------------------------------- config keys */

/* A config with the required keys, then `extra` (YAML lines), finalized. */
static int load_config(TrainConfig *c, const char *extra, char *err) {
    char path[] = "/tmp/colt_test_grpo_config_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return errorf(err, "mkstemp failed");
    FILE *f = fdopen(fd, "w");
    fprintf(f, "model: m\ndataset: d.jsonl\nreward_funcs: [{type: length}]\n%s", extra);
    fclose(f);
    /* mkstemp's name has no .yaml suffix; the loader reads anything else as YAML */
    train_config_defaults(c);
    int rc = train_config_load_file(c, path, err);
    unlink(path);
    if (rc == 0) rc = train_config_finalize(c, err);
    return rc;
}

static void test_is_config(void) {
    char err[ERR_LEN];
    TrainConfig c;
    check(load_config(&c, "", err) == 0, "a minimal config loads");
    check(c.use_vllm && c.vllm_importance_sampling_correction && strcmp(c.vllm_mode, "colocate") == 0 &&
              strcmp(c.vllm_importance_sampling_mode, "sequence_mask") == 0 &&
              isnan(c.vllm_importance_sampling_clip_min) && c.vllm_importance_sampling_clip_max == 3.0 &&
              isnan(c.vllm_importance_sampling_cap) && c.gpu_memory_utilization == 0.0 &&
              !c.gpu_memory_utilization_set,
          "IS and memory defaults (TRL's, memory 0 = auto, not set)");
    train_config_free(&c);

    check(load_config(&c,
                      "use_vllm: false\nvllm_mode: colocate\nvllm_importance_sampling_correction: false\n"
                      "vllm_importance_sampling_mode: token_truncate\nvllm_importance_sampling_clip_min: 0.25\n"
                      "vllm_importance_sampling_clip_max: 2.5\nvllm_gpu_memory_utilization: 0.6\n",
                      err) == 0 &&
              !c.use_vllm && !c.vllm_importance_sampling_correction &&
              strcmp(c.vllm_importance_sampling_mode, "token_truncate") == 0 &&
              c.vllm_importance_sampling_clip_min == 0.25 && c.vllm_importance_sampling_clip_max == 2.5 &&
              c.gpu_memory_utilization == 0.6 && c.gpu_memory_utilization_set,
          "every IS key parsed; vllm_gpu_memory_utilization sets gpu_memory_utilization");
    train_config_free(&c);

    check(load_config(&c, "gpu_memory_utilization: 0.5\nvllm_importance_sampling_clip_max: null\n"
                          "vllm_importance_sampling_clip_min: 0.5\n", err) == 0 &&
              c.gpu_memory_utilization == 0.5 && c.gpu_memory_utilization_set &&
              isnan(c.vllm_importance_sampling_clip_max),
          "gpu_memory_utilization, and clip_max null = None");
    train_config_free(&c);

    check(load_config(&c, "vllm_importance_sampling_cap: 4.0\n", err) == 0 &&
              c.vllm_importance_sampling_clip_max == 4.0,
          "deprecated vllm_importance_sampling_cap sets clip_max");
    train_config_free(&c);

    train_config_defaults(&c);
    check(train_config_set(&c, "vllm_importance_sampling_mode", "token_mask", "command line", err) == 0 &&
              train_config_set(&c, "vllm_importance_sampling_clip_min", "null", "command line", err) == 0 &&
              strcmp(c.vllm_importance_sampling_mode, "token_mask") == 0 && isnan(c.vllm_importance_sampling_clip_min),
          "IS keys as flags");
    train_config_free(&c);

    check(load_config(&c, "vllm_importance_sampling_mode: token\n", err) < 0 && !strchr(err, '\n') &&
              strstr(err, "token_truncate, token_mask, sequence_truncate, sequence_mask"),
          "a bad vllm_importance_sampling_mode is a one-line error naming the allowed ones");
    printf("bad mode: %s\n", err);
    train_config_free(&c);
    check(load_config(&c, "vllm_mode: server\n", err) == 0 && strcmp(c.vllm_mode, "server") == 0,
          "vllm_mode server is accepted (a running colt serve generates; test_server_mode runs it)");
    train_config_free(&c);
    check(load_config(&c, "vllm_mode: remote\n", err) < 0 && strstr(err, "colocate"), "unknown vllm_mode");
    train_config_free(&c);
    check(load_config(&c, "vllm_importance_sampling_clip_min: 3.0\n", err) < 0 && strstr(err, "less than"),
          "clip_min >= clip_max is an error (TRL)");
    train_config_free(&c);
    check(load_config(&c, "vllm_importance_sampling_mode: sequence_truncate\n"
                          "vllm_importance_sampling_clip_max: null\n", err) < 0 && strstr(err, "clip_min"),
          "a truncate mode without bounds is an error (TRL)");
    train_config_free(&c);
    check(load_config(&c, "vllm_importance_sampling_mode: token_mask\nvllm_importance_sampling_clip_max: null\n",
                      err) == 0,
          "a mask mode without bounds is allowed (TRL)");
    train_config_free(&c);
    check(load_config(&c, "gpu_memory_utilization: 1.5\n", err) < 0 && strstr(err, "gpu_memory_utilization"),
          "gpu_memory_utilization above 1 is an error");
    train_config_free(&c);
    check(load_config(&c, "vllm_importance_sampling_moed: token_mask\n", err) < 0 &&
              strstr(err, "did you mean 'vllm_importance_sampling_mode'"),
          "a misspelt IS key suggests the right one");
    train_config_free(&c);

    train_config_defaults(&c);
    json_t *j = train_config_to_json(&c);
    check(json_is_true(json_object_get(j, "vllm_importance_sampling_correction")) &&
              json_is_null(json_object_get(j, "vllm_importance_sampling_clip_min")) &&
              json_number_value(json_object_get(j, "vllm_gpu_memory_utilization")) == 0.0,
          "the IS keys in the saved config");
    json_decref(j);
    train_config_free(&c);
}

/* TRL 1.16's mask and entropy keys: TRL's defaults, every key parsed, the errors (one line each). */
static void test_mask_config(void) {
    char err[ERR_LEN];
    TrainConfig c;
    check(load_config(&c, "", err) == 0 && c.top_entropy_quantile == 1.0 && isnan(c.off_policy_mask_threshold) &&
              c.use_bias_correction_kl && c.entropy_coef == 0.0 && !c.use_adaptive_entropy &&
              c.entropy_coef_min == 0.0 && c.entropy_coef_max == 1.0 && c.entropy_coef_delta == 0.005 &&
              c.entropy_target == 0.2,
          "mask and entropy defaults are TRL 1.16's");
    train_config_free(&c);
    check(load_config(&c,
                      "top_entropy_quantile: 0.2\noff_policy_mask_threshold: 0.5\nuse_bias_correction_kl: false\n"
                      "entropy_coef: 0.01\nuse_adaptive_entropy: true\nentropy_coef_min: 0.001\n"
                      "entropy_coef_max: 0.1\nentropy_coef_delta: 0.002\nentropy_target: 1.5\n",
                      err) == 0 &&
              c.top_entropy_quantile == 0.2 && c.off_policy_mask_threshold == 0.5 && !c.use_bias_correction_kl &&
              c.entropy_coef == 0.01 && c.use_adaptive_entropy && c.entropy_coef_min == 0.001 &&
              c.entropy_coef_max == 0.1 && c.entropy_coef_delta == 0.002 && c.entropy_target == 1.5,
          "every mask and entropy key parsed");
    train_config_free(&c);
    check(load_config(&c, "off_policy_mask_threshold: null\n", err) == 0 && isnan(c.off_policy_mask_threshold),
          "off_policy_mask_threshold null = off");
    train_config_free(&c);
    check(load_config(&c, "top_entropy_quantile: 1.5\n", err) < 0 && strstr(err, "top_entropy_quantile") &&
              !strchr(err, '\n'),
          "top_entropy_quantile above 1 is a one-line error");
    printf("bad quantile: %s\n", err);
    train_config_free(&c);
    check(load_config(&c, "use_adaptive_entropy: true\nentropy_coef_min: 0.5\nentropy_coef_max: 0.1\n", err) < 0 &&
              strstr(err, "entropy_coef_min") && strstr(err, "entropy_coef_max"),
          "entropy_coef_min above entropy_coef_max is an error with use_adaptive_entropy");
    printf("bad bounds: %s\n", err);
    train_config_free(&c);
    check(load_config(&c, "top_entropy_quantile: 0.2\noff_policy_mask_threshold: 0.1\nentropy_coef: 0.01\n"
                          "tensor_parallel_size: 2\n", err) == 0,
          "the masks and the entropy bonus under tensor parallelism are accepted");
    train_config_free(&c);
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
    test_mask_goldens(root);
    test_mask_errors();
    json_decref(root);
    test_is_goldens();
    test_is_errors();
    test_is_config();
    test_mask_config();
    if (failures) {
        fprintf(stderr, "%d failure(s)\n", failures);
        return 1;
    }
    printf("all %d loss cases, %d mask cases, %d adaptive-entropy calls, %d advantage cases, %d IS cases, %d IS "
           "metric cases, the parser and config checks pass\n",
           N_LOSS_CASES, N_MASK_CASES, N_ADAPTIVE_CALLS, N_ADV_CASES, N_IS_CASES, N_IS_METRIC_CASES);
    return 0;
}
