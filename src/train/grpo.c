/* grpo.c — GRPO's reward aggregation, advantages and clipped-ratio loss with
 * its gradient, line for line as TRL 1.16's GRPOTrainer
 * (_generate_and_score_completions and _compute_loss) computes them.
 *
 * Everything is computed in double on the host and rounded to float on output;
 * the goldens (tests/ref/make_grpo_goldens.py) run TRL's own code in float64 on
 * float32-representable inputs, so the two agree to float rounding. This file
 * is not the model's backward pass: it stops at d loss / d logp.
 *
 * Where TRL's code differs from the description in the issue, TRL wins:
 *  - the clip metrics use coef_1 *after* the delta cap (TRL reassigns coef_1);
 *  - at sequence level the clip metrics are means over sequences (every row
 *    counts, fully masked ones too), not over tokens;
 *  - dapo's normaliser is clamp(num_items_in_batch, 1) / num_processes
 *    * gradient_accumulation_steps / steps_per_generation; the caller passes the
 *    whole product in cfg->num_items_in_batch (with TRL's default
 *    steps_per_generation == gradient_accumulation_steps it is num_items / nproc);
 *  - with beta > 0 the KL term is beta * k3 * coef_1 (TRL's use_bias_correction_kl,
 *    True by default), and the gradient flows through coef_1 too, even on-policy
 *    where coef_1 = 1; the logged kl is the masked mean of k3 * coef_1 (with
 *    use_bias_correction_kl = false: k3 alone, no gradient through coef_1);
 *  - rewards: a completion whose reward functions are all NaN is "unscorable":
 *    its reward is NaN (not nansum's 0), it is left out of the group's mean and
 *    std (nanmean / nanstd), and its advantage is 0 (nan_to_num).
 *  - the vLLM importance-sampling weight multiplies the policy term only: TRL
 *    computes per_token_loss = -min(...) * is_ratio and then adds beta * kl; the
 *    ratio is exp of the *sum* (not the mean) of old - sampling over a row in the
 *    sequence modes; NaN differences become 0 (weight 1) after the mask is
 *    applied, so a NaN on a padded token is harmless too.
 *  - cispo and vespo weigh -A * logp by a detached coefficient (clamp(coef_1,
 *    max=epsilon_high), or the gamma weight of the sequence's summed log ratio):
 *    their gradient is the coefficient alone, none flows through the ratio; vespo
 *    folds the sampling correction into that weight instead of multiplying the
 *    loss by it; sapo replaces the clip by 4/tau * sigmoid(tau * (coef_1 - 1));
 *    luspo is grpo's clipped loss summed over each row's tokens, then averaged
 *    over rows.
 *  - the off-policy mask compares the engine's log-probs (vLLM's) with this forward's, detached, as a
 *    per-row mean over the counted tokens; only rows with A < 0 can be dropped; it multiplies the policy
 *    term only (not the KL), like the entropy mask;
 *  - the entropy mask's quantile is over the micro-batch's counted tokens gathered from every process (not
 *    the generation batch), recomputed on every micro-batch;
 *  - the entropy bonus is the mean entropy over mask x entropy mask divided by the accumulation steps,
 *    for every loss_type (dapo's normaliser does not apply to it); the adaptive controller's coefficient
 *    is applied from the previous step's measurement (none before the first: last entropy = +inf).
 * Not implemented (TRL options off by default): multi_objective_aggregation = "normalize_then_sum". */
#include "train/grpo.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/floats.h"

/* ---------------------------------------------------------------- parsing */

int grpo_loss_type_parse(GrpoLossType *out, const char *s, char *err) {
    static const char *names[] = {"grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo"};
    for (int i = 0; i < (int)(sizeof names / sizeof names[0]); i++)
        if (s && strcmp(s, names[i]) == 0) {
            *out = (GrpoLossType)i;
            return 0;
        }
    return errorf(err, "loss_type '%s' is not supported; use one of grpo, bnpo, dr_grpo, dapo, cispo, sapo, luspo, vespo",
                  s ? s : "(null)");
}

/* GRPOConfig.__post_init__ maps True -> "group" and False -> "none". */
int grpo_scale_rewards_parse(GrpoScaleRewards *out, const char *s, char *err) {
    if (s && (strcmp(s, "group") == 0 || strcmp(s, "true") == 0 || strcmp(s, "True") == 0)) *out = SCALE_GROUP;
    else if (s && strcmp(s, "batch") == 0) *out = SCALE_BATCH;
    else if (s && (strcmp(s, "none") == 0 || strcmp(s, "false") == 0 || strcmp(s, "False") == 0)) *out = SCALE_NONE;
    else return errorf(err, "scale_rewards '%s' is not valid; use group, batch or none (or true = group, false = none)",
                       s ? s : "(null)");
    return 0;
}

int grpo_aggregation_parse(GrpoAggregation *out, const char *s, char *err) {
    if (s && strcmp(s, "sum_then_normalize") == 0) *out = AGGREGATE_SUM_THEN_NORMALIZE;
    else if (s && strcmp(s, "normalize_then_sum") == 0) *out = AGGREGATE_NORMALIZE_THEN_SUM;
    else return errorf(err, "multi_objective_aggregation '%s' is not valid; use sum_then_normalize or normalize_then_sum",
                       s ? s : "(null)");
    return 0;
}

int grpo_sampling_is_mode_parse(GrpoSamplingIsMode *out, const char *s, char *err) {
    static const char *names[] = {"token_truncate", "token_mask", "sequence_truncate", "sequence_mask"};
    for (int i = 0; i < 4; i++)
        if (s && strcmp(s, names[i]) == 0) {
            *out = (GrpoSamplingIsMode)i;
            return 0;
        }
    return errorf(err,
                  "vllm_importance_sampling_mode '%s' is not valid; use token_truncate, token_mask, "
                  "sequence_truncate or sequence_mask",
                  s ? s : "(null)");
}

int grpo_importance_level_parse(GrpoImportanceLevel *out, const char *s, char *err) {
    if (s && strcmp(s, "token") == 0) *out = IS_LEVEL_TOKEN;
    else if (s && strcmp(s, "sequence") == 0) *out = IS_LEVEL_SEQUENCE;
    else return errorf(err, "importance_sampling_level '%s' is not valid; use token or sequence", s ? s : "(null)");
    return 0;
}


/* ---------------------------------------------------------------- rewards */

/* TRL: rewards = (rewards_per_func * reward_weights).nansum(dim=1), then
 * rewards[all functions NaN] = NaN (unscorable). A NaN weight times a value is
 * NaN and skipped as well, as nansum does. */
void grpo_combine_rewards(float *rewards, const float *per_func, const float *weights, int n, int n_funcs) {
    for (int i = 0; i < n; i++) {
        double sum = 0.0;
        int all_nan = 1;
        for (int k = 0; k < n_funcs; k++) {
            float r = per_func[(size_t)i * n_funcs + k];
            if (isnan(r)) continue;
            all_nan = 0;
            double term = (double)r * (double)weights[k];
            if (!isnan(term)) sum += term;
        }
        rewards[i] = all_nan ? NAN : (float)sum;
    }
}

/* nanmean and TRL's nanstd (Bessel-corrected over the non-NaN count; NaN when
 * fewer than two values) of x[0..n). */
static void nan_mean_std(double *mean, double *std, const float *x, int n) {
    double sum = 0.0;
    int count = 0;
    for (int i = 0; i < n; i++)
        if (!isnan(x[i])) {
            sum += x[i];
            count++;
        }
    double mu = count ? sum / count : NAN;
    double ss = 0.0;
    for (int i = 0; i < n; i++)
        if (!isnan(x[i])) ss += ((double)x[i] - mu) * ((double)x[i] - mu);
    *mean = mu;
    *std = count > 1 ? sqrt(ss / count * ((double)count / (count - 1))) : NAN;
}

/* TRL's sum_then_normalize branch. group_std gets the std TRL uses for
 * frac_reward_zero_std: each group's std for SCALE_GROUP / SCALE_NONE, the
 * batch std (the same value in every entry) for SCALE_BATCH; 0 when
 * num_generations == 1 (group) or n == 1 (batch), as TRL. */
void grpo_advantages(float *advantages, float *group_std, const float *rewards, int n, int num_generations,
                     GrpoScaleRewards scale) {
    COLT_ASSERT(num_generations > 0 && n % num_generations == 0);
    int n_groups = n / num_generations;
    double batch_mean, batch_std = 0.0;
    nan_mean_std(&batch_mean, &batch_std, rewards, n);
    if (n <= 1) batch_std = 0.0;
    for (int g = 0; g < n_groups; g++) {
        const float *r = rewards + (size_t)g * num_generations;
        double mean, std;
        nan_mean_std(&mean, &std, r, num_generations);
        if (num_generations == 1) std = 0.0;
        if (scale == SCALE_BATCH) std = batch_std;
        if (group_std) group_std[g] = (float)std;
        for (int j = 0; j < num_generations; j++) {
            double a = (double)r[j] - mean;
            if (scale != SCALE_NONE) a = a / (std + 1e-4);
            advantages[(size_t)g * num_generations + j] = isnan(a) ? 0.0f : (float)a;
        }
    }
}

void grpo_advantages_normalize_then_sum(float *advantages, float *batch_std, const float *per_func,
                                        const float *weights, int n, int n_funcs, int num_generations) {
    COLT_ASSERT(num_generations > 0 && n % num_generations == 0);
    float *column = xmalloc(sizeof(float) * (size_t)num_generations), *rewards = xmalloc(sizeof(float) * (size_t)n);
    double *sum = xcalloc((size_t)n, sizeof(double));
    for (int g = 0; g < n / num_generations; g++)
        for (int k = 0; k < n_funcs; k++) {
            const float *x = per_func + (size_t)g * num_generations * n_funcs + k;
            for (int j = 0; j < num_generations; j++) column[j] = x[(size_t)j * n_funcs];
            double mean, std;
            nan_mean_std(&mean, &std, column, num_generations);
            if (num_generations == 1) std = 0.0;
            for (int j = 0; j < num_generations; j++) {
                double term = ((double)column[j] - mean) / (std + 1e-4) * weights[k];
                if (!isnan(term)) sum[(size_t)g * num_generations + j] += term; /* nansum */
            }
        }
    for (int i = 0; i < n; i++) { /* unscorable: every function gave none */
        bool any = false;
        for (int k = 0; k < n_funcs; k++) any |= !isnan(per_func[(size_t)i * n_funcs + k]);
        rewards[i] = any ? (float)sum[i] : NAN;
    }
    double mean, std;
    nan_mean_std(&mean, &std, rewards, n);
    if (n <= 1) std = 0.0;
    *batch_std = (float)std;
    for (int i = 0; i < n; i++) {
        double a = ((double)rewards[i] - mean) / (std + 1e-4);
        advantages[i] = isnan(a) ? 0.0f : (float)a;
    }
    free(column), free(rewards), free(sum);
}

/* ---------------------------------------------------------------- sampling correction */

/* TRL's clamp (truncate modes) or masked_fill(ratio < min | ratio > max, 0)
 * (mask modes); NaN bounds are None. */
static double bound_ratio(double ratio, GrpoSamplingIsMode mode, double clip_min, double clip_max) {
    bool truncate = mode == SAMPLING_IS_TOKEN_TRUNCATE || mode == SAMPLING_IS_SEQUENCE_TRUNCATE;
    if (truncate) {
        if (!isnan(clip_min) && ratio < clip_min) ratio = clip_min;
        if (!isnan(clip_max) && ratio > clip_max) ratio = clip_max;
        return ratio;
    }
    bool outside = (!isnan(clip_min) && ratio < clip_min) || (!isnan(clip_max) && ratio > clip_max);
    return outside ? 0.0 : ratio;
}

/* The means and TRL's 0-when-empty from the sums and counts. */
static void sampling_metrics_finish(GrpoSamplingMetrics *m) {
    if (m->logp_difference_count > 0) m->logp_difference_mean = m->logp_difference_sum / m->logp_difference_count;
    else m->logp_difference_mean = m->logp_difference_max = 0.0;
    if (m->is_ratio_count > 0) m->is_ratio_mean = m->is_ratio_sum / m->is_ratio_count;
    else m->is_ratio_mean = m->is_ratio_min = m->is_ratio_max = 0.0;
}

/* Folds one value into a running min / max / sum / count. */
static void fold(double *sum, long long *count, double *min, double *max, double x) {
    if (min && (*count == 0 || x < *min)) *min = x;
    if (*count == 0 || x > *max) *max = x;
    *sum += x;
    (*count)++;
}

int grpo_sampling_is_weights(float *is_weight, GrpoSamplingMetrics *metrics, const float *old_logp,
                             const float *sampling_logp, const float *mask, int B, int T, GrpoSamplingIsMode mode,
                             double clip_min, double clip_max, char *err) {
    /* T = 0 is a row of nothing but padding: a sequence ratio of exp(0), as in a padded batch */
    if (B < 0 || T < 0) return errorf(err, "grpo_sampling_is_weights: bad shape (B=%d, T=%d)", B, T);
    if ((unsigned)mode > SAMPLING_IS_SEQUENCE_MASK)
        return errorf(err, "grpo_sampling_is_weights: unknown vllm_importance_sampling_mode %d", (int)mode);
    bool truncate = mode == SAMPLING_IS_TOKEN_TRUNCATE || mode == SAMPLING_IS_SEQUENCE_TRUNCATE;
    if (truncate && isnan(clip_min) && isnan(clip_max))
        return errorf(err, "vllm_importance_sampling_mode %s needs vllm_importance_sampling_clip_min or _clip_max",
                      mode == SAMPLING_IS_TOKEN_TRUNCATE ? "token_truncate" : "sequence_truncate");
    const bool sequence = mode == SAMPLING_IS_SEQUENCE_TRUNCATE || mode == SAMPLING_IS_SEQUENCE_MASK;
    GrpoSamplingMetrics m = {0};
    for (int b = 0; b < B; b++) {
        const float *old = old_logp + (size_t)b * T, *smp = sampling_logp + (size_t)b * T, *mk = mask + (size_t)b * T;
        float *w = is_weight + (size_t)b * T;
        double row_sum = 0.0;
        for (int t = 0; t < T; t++) {
            /* TRL: nan_to_num((old - sampling) * mask, nan=0.0); its infinities become
             * the dtype's extremes (float32 in TRL's runs, as here). */
            double diff = ((double)old[t] - smp[t]) * mk[t];
            if (isnan(diff)) diff = 0.0;
            else if (isinf(diff)) diff = diff > 0 ? FLT_MAX : -FLT_MAX;
            if (sequence) row_sum += diff;
            else {
                double ratio = bound_ratio(exp(diff), mode, clip_min, clip_max);
                w[t] = (float)ratio;
                if (mk[t] != 0.0f) fold(&m.is_ratio_sum, &m.is_ratio_count, &m.is_ratio_min, &m.is_ratio_max, ratio);
            }
            double delta = fabs((double)old[t] - smp[t]);
            if (mk[t] != 0.0f && !isnan(delta))
                fold(&m.logp_difference_sum, &m.logp_difference_count, NULL, &m.logp_difference_max, delta);
        }
        if (sequence) {
            double ratio = bound_ratio(exp(row_sum), mode, clip_min, clip_max);
            for (int t = 0; t < T; t++) w[t] = (float)ratio;
            fold(&m.is_ratio_sum, &m.is_ratio_count, &m.is_ratio_min, &m.is_ratio_max, ratio);
        }
    }
    sampling_metrics_finish(&m);
    if (metrics) *metrics = m;
    return 0;
}

void grpo_sampling_metrics_merge(GrpoSamplingMetrics *into, const GrpoSamplingMetrics *part) {
    if (part->logp_difference_count > 0) {
        if (into->logp_difference_count == 0 || part->logp_difference_max > into->logp_difference_max)
            into->logp_difference_max = part->logp_difference_max;
        into->logp_difference_sum += part->logp_difference_sum;
        into->logp_difference_count += part->logp_difference_count;
    }
    if (part->is_ratio_count > 0) {
        bool first = into->is_ratio_count == 0;
        if (first || part->is_ratio_min < into->is_ratio_min) into->is_ratio_min = part->is_ratio_min;
        if (first || part->is_ratio_max > into->is_ratio_max) into->is_ratio_max = part->is_ratio_max;
        into->is_ratio_sum += part->is_ratio_sum;
        into->is_ratio_count += part->is_ratio_count;
    }
    sampling_metrics_finish(into);
}

/* TRL: gather(mean).mean(), gather(max).max(), nanmin(gather(min)),
 * gather(mean).nanmean(), nanmax(gather(max)). No value is NaN here (NaN
 * differences are skipped, weights are finite or inf), so the nan-variants
 * reduce like the plain ones. */
void grpo_sampling_metrics_reduce_ranks(GrpoSamplingMetrics *out, const GrpoSamplingMetrics *per_rank, int n_ranks) {
    GrpoSamplingMetrics r = {0};
    for (int i = 0; i < n_ranks; i++) {
        const GrpoSamplingMetrics *p = &per_rank[i];
        r.logp_difference_mean += p->logp_difference_mean / n_ranks;
        r.is_ratio_mean += p->is_ratio_mean / n_ranks;
        if (i == 0 || p->logp_difference_max > r.logp_difference_max) r.logp_difference_max = p->logp_difference_max;
        if (i == 0 || p->is_ratio_max > r.is_ratio_max) r.is_ratio_max = p->is_ratio_max;
        if (i == 0 || p->is_ratio_min < r.is_ratio_min) r.is_ratio_min = p->is_ratio_min;
        r.logp_difference_sum += p->logp_difference_sum;
        r.logp_difference_count += p->logp_difference_count;
        r.is_ratio_sum += p->is_ratio_sum;
        r.is_ratio_count += p->is_ratio_count;
    }
    *out = r;
}

/* ---------------------------------------------------------------- loss */

/* d min(a, b) as torch's minimum backward: the smaller side takes the
 * gradient; a tie splits it in half. */
static double min_grad(double a, double b, double da, double db) {
    if (a < b) return da;
    if (a > b) return db;
    return 0.5 * (da + db);
}

/* One (token or sequence) ratio: the per-token policy loss -min(c1*A, c2*A)
 * and its derivative with respect to coef_1 = exp(log_w); *capped gets coef_1
 * after the delta cap (what TRL's clip metrics read). */
static double ratio_loss(double *dloss_dlogw, double *capped, double log_w, double adv, double lo, double hi,
                         double delta) {
    double coef1 = exp(log_w);
    double coef2 = coef1 < lo ? lo : coef1 > hi ? hi : coef1;
    double dcoef2 = (coef1 >= lo && coef1 <= hi) ? 1.0 : 0.0; /* clamp passes the gradient on [lo, hi] */
    double c1 = coef1, dc1 = 1.0;
    if (delta > 0.0) {
        c1 = coef1 > delta ? delta : coef1;
        dc1 = coef1 <= delta ? 1.0 : 0.0;
    }
    double l1 = c1 * adv, l2 = coef2 * adv;
    double loss = -(l1 < l2 ? l1 : l2);
    *dloss_dlogw = -min_grad(l1, l2, dc1 * adv, dcoef2 * adv) * coef1;
    *capped = c1;
    return loss;
}

/* sapo's soft gate for one ratio: -4/tau * sigmoid(tau * (coef_1 - 1)) * A, tau by A's sign, and its
 * derivative with respect to log_w (d coef_1 / d log_w = coef_1). */
static double sapo_loss(double *dloss_dlogw, double log_w, double adv, double tau_neg, double tau_pos) {
    double tau = adv > 0 ? tau_pos : tau_neg, coef1 = exp(log_w);
    double sig = 1.0 / (1.0 + exp(-tau * (coef1 - 1.0)));
    *dloss_dlogw = -adv * 4.0 * sig * (1.0 - sig) * coef1;
    return -sig * 4.0 / tau * adv;
}

/* vespo's gamma weight of one row (TRL's get_gamma_weights): phi(w) = e^lambda w^k e^(-lambda w), w the
 * row's summed log ratio (each token's clamped to [-20, 20]) plus the sampling correction's summed log
 * weights (every position, clamped to [log 1e-8, 20]), itself clamped to [log 1e-8, 20]; NaN or an
 * infinity becomes 0. No gradient flows through it. */
static double vespo_weight(const float *lp, const float *old, const float *isw, const float *m, int T, double adv,
                           const GrpoLossConfig *cfg) {
    const double lower = log(1e-8);
    double seq = 0.0;
    for (int t = 0; t < T; t++) {
        double lr = old ? (double)lp[t] - old[t] : 0.0;
        seq += (lr < -20.0 ? -20.0 : lr > 20.0 ? 20.0 : lr) * m[t];
    }
    if (isw)
        for (int t = 0; t < T; t++) {
            double l = log((double)isw[t]);
            seq += l < lower ? lower : l > 20.0 ? 20.0 : l;
        }
    double log_w = seq < lower ? lower : seq > 20.0 ? 20.0 : seq;
    bool nonneg = adv >= 0;
    double k = nonneg ? float_as_decimal(cfg->vespo_k_pos) : float_as_decimal(cfg->vespo_k_neg);
    double lambda = nonneg ? float_as_decimal(cfg->vespo_lambda_pos) : float_as_decimal(cfg->vespo_lambda_neg);
    if (lambda < 1e-4) lambda = 1e-4;
    double phi = exp(lambda + k * log_w - lambda * exp(log_w));
    return isfinite(phi) ? phi : 0.0;
}

int grpo_loss(float *loss, float *dlogp, GrpoLossMetrics *metrics, const GrpoLossConfig *cfg, const float *logp,
              const float *old_logp, const float *ref_logp, const float *mask, const float *advantages, int B,
              int T, char *err) {
    return grpo_loss_with_is_weight(loss, dlogp, metrics, cfg, logp, old_logp, ref_logp, NULL, mask, advantages, B, T,
                                    err);
}

int grpo_loss_with_is_weight(float *loss, float *dlogp, GrpoLossMetrics *metrics, const GrpoLossConfig *cfg,
                             const float *logp, const float *old_logp, const float *ref_logp, const float *is_weight,
                             const float *mask, const float *advantages, int B, int T, char *err) {
    GrpoLossInputs in = {.is_weight = is_weight};
    return grpo_loss_compute(loss, dlogp, metrics, cfg, logp, old_logp, ref_logp, &in, mask, advantages, B, T, err);
}

/* TRL's get_off_policy_mask for one row: 1 (keep) when the advantage is >= 0 or the row's mean of
 * nan_to_num(sampling - logp) over its counted tokens is <= the threshold, else 0. */
static double off_policy_keep(const float *lp, const float *smp, const float *m, int T, double adv,
                              double threshold) {
    if (adv >= 0) return 1.0;
    double sum = 0.0, count = 0.0;
    for (int t = 0; t < T; t++) {
        double d = (double)smp[t] - lp[t];
        if (isnan(d)) d = 0.0; /* a token the engine did not score gives no evidence */
        else if (isinf(d)) d = d > 0 ? FLT_MAX : -FLT_MAX;
        sum += d * m[t];
        count += m[t];
    }
    return sum / (count < 1.0 ? 1.0 : count) <= threshold ? 1.0 : 0.0;
}

int grpo_loss_compute(float *loss, float *dlogp, GrpoLossMetrics *metrics, const GrpoLossConfig *cfg,
                      const float *logp, const float *old_logp, const float *ref_logp, const GrpoLossInputs *in,
                      const float *mask, const float *advantages, int B, int T, char *err) {
    static const GrpoLossInputs none = {0};
    if (!in) in = &none;
    const float *is_weight = in->is_weight;
    if (B <= 0 || T <= 0) return errorf(err, "grpo_loss: empty batch (B=%d, T=%d)", B, T);
    if (cfg->gradient_accumulation_steps < 1)
        return errorf(err, "grpo_loss: gradient_accumulation_steps must be >= 1 (got %d)",
                      cfg->gradient_accumulation_steps);
    if (cfg->loss_type == LOSS_DR_GRPO && cfg->max_completion_length < 1)
        return errorf(err, "grpo_loss: dr_grpo needs max_completion_length >= 1 (got %d)", cfg->max_completion_length);
    if (cfg->beta != 0.0f && !ref_logp)
        return errorf(err, "grpo_loss: beta = %g needs reference log-probs", (double)cfg->beta);
    if (cfg->epsilon_low < 0.0f || cfg->epsilon_high < 0.0f)
        return errorf(err, "grpo_loss: epsilon must be >= 0 (got %g, %g)", (double)cfg->epsilon_low,
                      (double)cfg->epsilon_high);
    if (cfg->entropy_bonus && !in->entropy)
        return errorf(err, "grpo_loss: the entropy bonus needs the per-token entropies");
    const bool bias_corrected_kl = !cfg->kl_without_bias_correction;
    const double off_policy_threshold = float_as_decimal(cfg->off_policy_mask_threshold);

    const double lo = 1.0 - float_as_decimal(cfg->epsilon_low), hi = 1.0 + float_as_decimal(cfg->epsilon_high);
    const double delta = cfg->delta > 0.0f ? float_as_decimal(cfg->delta) : 0.0;
    const double beta = float_as_decimal(cfg->beta);
    const double gas = cfg->gradient_accumulation_steps;
    const bool sequence = cfg->importance_sampling_level == IS_LEVEL_SEQUENCE;

    double mask_total = 0.0;
    for (size_t i = 0; i < (size_t)B * T; i++) mask_total += mask[i];

    /* cispo clamps coef_1 at epsilon_high itself (not 1 + epsilon_high) */
    const double eps_high_raw = float_as_decimal(cfg->epsilon_high);
    const double sapo_neg = float_as_decimal(cfg->sapo_temperature_neg), sapo_pos = float_as_decimal(cfg->sapo_temperature_pos);
    if (cfg->loss_type == LOSS_SAPO && !(sapo_neg > 0.0 && sapo_pos > 0.0))
        return errorf(err, "grpo_loss: sapo needs positive temperatures (got %g, %g)", sapo_neg, sapo_pos);

    double total = 0.0;
    double kl_sum = 0.0, low_sum = 0.0, high_sum = 0.0, region_sum = 0.0, cispo_sum = 0.0, phi_sum = 0.0;
    double low_min = NAN, high_max = NAN;
    double off_policy_dropped = 0.0, entropy_dropped = 0.0;
    bool seq_counted = false;
    for (int b = 0; b < B; b++) {
        const float *lp = logp + (size_t)b * T, *m = mask + (size_t)b * T;
        const float *old = old_logp ? old_logp + (size_t)b * T : NULL;
        const float *ref = ref_logp ? ref_logp + (size_t)b * T : NULL;
        const float *isw = is_weight ? is_weight + (size_t)b * T : NULL;
        const float *em = in->entropy_mask ? in->entropy_mask + (size_t)b * T : NULL;
        float *dl = dlogp + (size_t)b * T;
        double adv = advantages[b];
        double row_mask = 0.0;
        for (int t = 0; t < T; t++) row_mask += m[t];
        double row_mask_clamped = row_mask < 1.0 ? 1.0 : row_mask;
        /* TRL compares the engine's log-probs when it has them (vLLM), else the old ones, else this
         * forward's own (detached: a difference of 0, every row kept) */
        double keep = 1.0;
        if (cfg->off_policy_mask) {
            const float *smp = in->sampling_logp ? in->sampling_logp + (size_t)b * T : old ? old : lp;
            keep = off_policy_keep(lp, smp, m, T, adv, off_policy_threshold);
            off_policy_dropped += (1.0 - keep) * row_mask;
        }
        if (em)
            for (int t = 0; t < T; t++) entropy_dropped += m[t] * (1.0 - em[t]);

        /* w = d loss / d per_token_loss[b, t] / mask[b, t]: the loss_type's normaliser. */
        double w;
        switch (cfg->loss_type) {
        case LOSS_GRPO:
        case LOSS_SAPO: w = 1.0 / row_mask_clamped / B / gas; break;
        case LOSS_BNPO: w = 1.0 / (mask_total < 1.0 ? 1.0 : mask_total) / gas; break;
        case LOSS_DR_GRPO: w = 1.0 / ((double)B * cfg->max_completion_length) / gas; break;
        case LOSS_DAPO:
        case LOSS_CISPO:
        case LOSS_VESPO: {
            double items = cfg->num_items_in_batch;
            w = 1.0 / (items > 0.0 ? items : 1.0); /* an all-masked batch: the loss is 0 whatever the normaliser */
            break;
        }
        case LOSS_LUSPO: w = 1.0 / B / gas; break; /* each row's tokens summed, then the mean over rows */
        default: return errorf(err, "grpo_loss: unknown loss_type %d", (int)cfg->loss_type);
        }
        const bool clipped = cfg->loss_type <= LOSS_DAPO || cfg->loss_type == LOSS_LUSPO; /* the two-sided clip */
        const bool detached = cfg->loss_type == LOSS_CISPO || cfg->loss_type == LOSS_VESPO; /* -c * A * logp */
        const double phi = cfg->loss_type == LOSS_VESPO ? vespo_weight(lp, old, isw, m, T, adv, cfg) : 0.0;
        phi_sum += phi;
        double row_low = 0.0, row_high = 0.0; /* this row's clipped tokens (or the row itself at sequence level) */

        /* Sequence level: one ratio coef_1 = exp(lw) per row, lw = sum_t(log_ratio * mask) /
         * clamp(sum_t mask, 1), so d lw / d logp[b, t] = mask[b, t] / clamp(sum_t mask, 1). */
        double seq_lw = 0.0, seq_coef = 1.0, seq_dloss_dlogw = 0.0;
        if (sequence) {
            if (old)
                for (int t = 0; t < T; t++) seq_lw += ((double)lp[t] - old[t]) * m[t];
            seq_lw /= row_mask_clamped;
            seq_coef = exp(seq_lw);
            if (!detached) {
                double capped = seq_coef, seq_loss;
                if (clipped) seq_loss = ratio_loss(&seq_dloss_dlogw, &capped, seq_lw, adv, lo, hi, delta);
                else seq_loss = sapo_loss(&seq_dloss_dlogw, seq_lw, adv, sapo_neg, sapo_pos);
                /* the row's loss is broadcast over its T tokens, each weighted by w * mask
                 * and by its sampling-correction weight */
                double row_weight = 0.0;
                for (int t = 0; t < T; t++)
                    row_weight += (isw ? (double)isw[t] : 1.0) * (em ? em[t] : 1.0) * m[t];
                row_weight *= keep;
                total += w * row_weight * seq_loss;
                seq_dloss_dlogw *= w * row_weight;
                if (clipped) {
                    row_low = capped < lo && adv < 0;
                    row_high = capped > hi && adv > 0;
                }
            }
            if (beta != 0.0 && bias_corrected_kl) /* the KL term's path through the row's coef_1 */
                for (int t = 0; t < T; t++) {
                    double diff = (double)ref[t] - lp[t];
                    seq_dloss_dlogw += w * m[t] * beta * (exp(diff) - diff - 1.0) * seq_coef;
                }
            if (cfg->loss_type == LOSS_CISPO) cispo_sum += seq_coef > eps_high_raw && adv > 0;
            low_sum += row_low;
            high_sum += row_high;
            region_sum += row_low || row_high;
        }
        for (int t = 0; t < T; t++) {
            double grad = sequence ? seq_dloss_dlogw * m[t] / row_mask_clamped : 0.0;
            double coef = seq_coef; /* coef_1 before the delta cap, as the KL term uses it */
            double lw = old ? (double)lp[t] - old[t] : 0.0; /* no old: logp - logp.detach() */
            if (!sequence) coef = exp(lw);
            /* TRL: per_token_loss * off_policy_mask * entropy_mask * is_ratio (vespo: no is_ratio) */
            double weight = (isw && cfg->loss_type != LOSS_VESPO ? isw[t] : 1.0) * keep * (em ? em[t] : 1.0);
            if (detached) {
                /* the coefficient is detached: the loss is -c * A * logp, its gradient -c * A */
                double c = cfg->loss_type == LOSS_VESPO ? phi : (coef < eps_high_raw ? coef : eps_high_raw);
                total += w * m[t] * (-c * adv * lp[t]) * weight;
                grad += w * m[t] * (-c * adv) * weight;
                if (cfg->loss_type == LOSS_CISPO && !sequence) cispo_sum += m[t] * (coef > eps_high_raw && adv > 0);
            } else if (!sequence) {
                double dloss_dlogw, capped = coef, l;
                if (clipped) l = ratio_loss(&dloss_dlogw, &capped, lw, adv, lo, hi, delta);
                else l = sapo_loss(&dloss_dlogw, lw, adv, sapo_neg, sapo_pos);
                total += w * m[t] * l * weight;
                grad += w * m[t] * dloss_dlogw * weight;
                if (clipped) {
                    int is_low = capped < lo && adv < 0, is_high = capped > hi && adv > 0;
                    low_sum += m[t] * is_low;
                    high_sum += m[t] * is_high;
                    region_sum += m[t] * (is_low || is_high);
                    row_low += m[t] * is_low;
                    row_high += m[t] * is_high;
                }
            }
            if (beta != 0.0) {
                /* k3 = exp(ref - logp) - (ref - logp) - 1, times coef_1 (TRL's default
                 * use_bias_correction_kl = True), with the gradient flowing through both:
                 * d k3 / d logp = 1 - exp(ref - logp); d coef_1 / d lw = coef_1. */
                double diff = (double)ref[t] - lp[t];
                double k3 = exp(diff) - diff - 1.0;
                double c = bias_corrected_kl ? coef : 1.0; /* use_bias_correction_kl = false: plain k3 */
                double kl = k3 * c;
                total += w * m[t] * beta * kl;
                grad += w * m[t] * beta * (1.0 - exp(diff)) * c;
                if (!sequence && bias_corrected_kl) grad += w * m[t] * beta * kl;
                kl_sum += m[t] * kl;
            }
            dl[t] = (float)grad;
        }
        /* TRL's clip_ratio/low_min and high_max: per-sequence means (a row without tokens is NaN and
         * left out at token level; at sequence level every row counts, as its one value) */
        if (clipped && (sequence || row_mask > 0.0)) {
            double l = sequence ? row_low : row_low / row_mask, h = sequence ? row_high : row_high / row_mask;
            if (!seq_counted || l < low_min) low_min = l;
            if (!seq_counted || h > high_max) high_max = h;
            seq_counted = true;
        }
    }
    /* policy_loss as TRL logs it: before the bonus and before the division by the accumulation steps */
    const bool divides_by_gas = cfg->loss_type != LOSS_DAPO && cfg->loss_type != LOSS_CISPO && cfg->loss_type != LOSS_VESPO;
    double policy_loss = divides_by_gas ? total * gas : total;
    /* The entropy bonus: the mean entropy over the tokens in the policy loss (mask x entropy mask), scaled
     * for accumulation only, whatever the loss_type's normaliser. */
    double bonus_sum = 0.0, bonus_count = 0.0;
    if (cfg->entropy_bonus) {
        for (size_t i = 0; i < (size_t)B * T; i++) {
            double e = (double)mask[i] * (in->entropy_mask ? in->entropy_mask[i] : 1.0);
            bonus_sum += e * in->entropy[i];
            bonus_count += e;
        }
        double scale = cfg->entropy_coef_applied / (bonus_count < 1.0 ? 1.0 : bonus_count) / gas;
        total -= scale * bonus_sum;
        if (in->dentropy)
            for (size_t i = 0; i < (size_t)B * T; i++)
                in->dentropy[i] = (float)(-scale * mask[i] * (in->entropy_mask ? in->entropy_mask[i] : 1.0));
    } else if (in->dentropy) {
        memset(in->dentropy, 0, sizeof(float) * (size_t)B * T);
    }
    *loss = (float)total;
    if (metrics) {
        metrics->policy_loss = policy_loss;
        metrics->bonus_entropy_sum = bonus_sum;
        metrics->bonus_token_count = bonus_count;
        metrics->off_policy_masked_tokens = off_policy_dropped;
        metrics->entropy_masked_tokens = entropy_dropped;
        double tokens = mask_total < 1.0 ? 1.0 : mask_total;
        double count = sequence ? (double)B : tokens;
        metrics->clip_ratio_low = low_sum / count;
        metrics->clip_ratio_high = high_sum / count;
        metrics->clip_ratio_region = region_sum / count;
        metrics->kl = beta != 0.0 ? kl_sum / tokens : 0.0;
        metrics->clip_ratio_low_min = low_min;
        metrics->clip_ratio_high_max = high_max;
        metrics->cispo_clip_ratio = cispo_sum / count;
        metrics->vespo_phi_seq_mean = phi_sum / B;
    }
    return 0;
}

/* ---------------------------------------------------------------- entropy */

static int compare_floats(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* torch.quantile's default ("linear"): sorted x, position q * (n - 1), interpolated between its floor and
 * ceiling, in float32 as TRL's tensor is (entropies .float()); torch's lerp form. */
int grpo_high_entropy_mask(float *entropy_mask, double *threshold, const float *entropy, const float *mask, int B,
                           int T, float *pool, size_t n_pool, double q, char *err) {
    if (!(q >= 0.0 && q <= 1.0)) return errorf(err, "grpo_high_entropy_mask: quantile %g is outside [0, 1]", q);
    if (n_pool == 0) {
        memset(entropy_mask, 0, sizeof(float) * (size_t)B * T);
        if (threshold) *threshold = NAN;
        return 0;
    }
    qsort(pool, n_pool, sizeof(float), compare_floats);
    float pos = (float)q * (float)(n_pool - 1);
    size_t lo = (size_t)floorf(pos), hi = (size_t)ceilf(pos);
    if (hi >= n_pool) hi = n_pool - 1; /* float rounding of q * (n - 1) */
    if (lo > hi) lo = hi;
    float weight = pos - (float)lo, a = pool[lo], b = pool[hi];
    /* torch's lerp: a + w (b - a) for w < 0.5, b - (b - a)(1 - w) otherwise */
    float thr = weight < 0.5f ? a + weight * (b - a) : b - (b - a) * (1.0f - weight);
    for (size_t i = 0; i < (size_t)B * T; i++)
        entropy_mask[i] = mask[i] != 0.0f && entropy[i] * mask[i] >= thr ? 1.0f : 0.0f;
    if (threshold) *threshold = thr;
    return 0;
}

double grpo_entropy_coef_applied(const GrpoEntropyControl *ctl, bool adaptive, double target) {
    if (!adaptive) return ctl->coef;
    return ctl->last_world_entropy <= target ? ctl->coef : 0.0;
}

void grpo_entropy_control_update(GrpoEntropyControl *ctl, double entropy_sum, double token_count, double target,
                                 double delta, double coef_min, double coef_max) {
    double world = entropy_sum / (token_count < 1.0 ? 1.0 : token_count);
    if (world <= target) ctl->coef = ctl->coef + delta < coef_max ? ctl->coef + delta : coef_max;
    else ctl->coef = ctl->coef - delta > coef_min ? ctl->coef - delta : coef_min;
    ctl->last_world_entropy = world;
}
