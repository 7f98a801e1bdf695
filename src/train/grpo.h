/* grpo.h — GRPO's math as TRL's GRPOTrainer (TRL 1.x) computes it: reward
 * aggregation, group advantages, and the clipped-ratio loss with its gradient
 * with respect to the per-token log-probs, for every loss_type and both
 * importance-sampling levels. Plain host C on small arrays; no model here.
 *
 * Layout: B completions, each padded to T tokens (row-major [B, T]); mask is
 * 1 for completion tokens that count, 0 for padding (and for completions
 * dropped by mask_truncated_completions). */
#ifndef COLT_TRAIN_GRPO_H
#define COLT_TRAIN_GRPO_H

#include <stdbool.h>
#include <stddef.h>

/* TRL 1.16's loss_type values, in its order of introduction (grpo_loss_type_parse's names). */
typedef enum { LOSS_GRPO = 0, LOSS_BNPO, LOSS_DR_GRPO, LOSS_DAPO, LOSS_CISPO, LOSS_SAPO, LOSS_LUSPO, LOSS_VESPO } GrpoLossType;
typedef enum { SCALE_GROUP = 0, SCALE_BATCH, SCALE_NONE } GrpoScaleRewards;
/* TRL 1.16's multi_objective_aggregation: weighted sum then normalise (the default), or each reward function
 * normalised within its group, then the weighted sum normalised over the batch (GDPO). */
typedef enum { AGGREGATE_SUM_THEN_NORMALIZE = 0, AGGREGATE_NORMALIZE_THEN_SUM } GrpoAggregation;
typedef enum { IS_LEVEL_TOKEN = 0, IS_LEVEL_SEQUENCE } GrpoImportanceLevel;

/* Parses TRL's names ("grpo", "bnpo", "dr_grpo", "dapo"; "group", "batch",
 * "none" — and true/false as TRL accepts for scale_rewards; "token",
 * "sequence"). Return 0 or -1 with err naming the valid values. */
int grpo_loss_type_parse(GrpoLossType *out, const char *s, char *err);
int grpo_scale_rewards_parse(GrpoScaleRewards *out, const char *s, char *err);
int grpo_aggregation_parse(GrpoAggregation *out, const char *s, char *err); /* TRL's two names */
int grpo_importance_level_parse(GrpoImportanceLevel *out, const char *s, char *err);

/* rewards[i] = sum_k weights[k] * per_func[i * n_funcs + k], skipping NaN
 * entries (TRL's nansum; a sample whose functions are all NaN gets NaN... as
 * TRL: nansum gives 0 — match TRL exactly and say which in the .c). */
void grpo_combine_rewards(float *rewards, const float *per_func, const float *weights, int n, int n_funcs);

/* Advantages as TRL: A_i = r_i - mean over i's group of num_generations
 * (consecutive samples); then divided by (std + 1e-4) of the group (SCALE_GROUP),
 * of the whole batch (SCALE_BATCH), or not at all (SCALE_NONE). std is torch's
 * unbiased std. group_std[n / num_generations] gets each group's std (for
 * frac_reward_zero_std). */
void grpo_advantages(float *advantages, float *group_std, const float *rewards, int n, int num_generations,
                     GrpoScaleRewards scale);

/* TRL's normalize_then_sum branch (scale_rewards does not apply): each
 * function's rewards centred on their group's mean and divided by (the group's
 * std + 1e-4), NaN where a function gave none; their weighted sum (NaN-skipping;
 * NaN where every function gave none); then centred on the batch mean and
 * divided by (the batch std + 1e-4). NaN advantages become 0. *batch_std gets
 * that std (0 when n == 1), which TRL's frac_reward_zero_std reads. */
void grpo_advantages_normalize_then_sum(float *advantages, float *batch_std, const float *per_func,
                                        const float *weights, int n, int n_funcs, int num_generations);

typedef struct GrpoLossConfig {
    GrpoLossType loss_type;
    GrpoImportanceLevel importance_sampling_level;
    float epsilon_low;            /* epsilon */
    float epsilon_high;           /* epsilon_high (= epsilon when not set) */
    float delta;                  /* upper cap on the ratio (two-sided clipping); <= 0 = off */
    float beta;                   /* KL coefficient; 0 = no reference model */
    int max_completion_length;    /* dr_grpo's normaliser */
    int gradient_accumulation_steps;
    /* dapo: number of completion tokens in the whole accumulated batch divided by the
     * number of processes (TRL's num_items_in_batch / num_processes). */
    float num_items_in_batch;
    /* sapo: the sigmoid's temperature for negative / positive advantages (TRL: 1.05 / 1.0) */
    float sapo_temperature_neg, sapo_temperature_pos;
    /* vespo: the gamma weighting's k and lambda for advantages >= 0 / < 0 (TRL: 2, 3 / 3, 2) */
    float vespo_k_pos, vespo_lambda_pos, vespo_k_neg, vespo_lambda_neg;
    /* use_bias_correction_kl = false: the KL term is the plain k3, not k3 * coef_1 (TRL's default, True,
     * is this flag's zero) */
    bool kl_without_bias_correction;
    /* off_policy_mask_threshold (TRL's None = off_policy_mask false): a sequence with a negative advantage
     * whose mean (sampling - current) log-prob difference exceeds the threshold leaves the policy loss */
    bool off_policy_mask;
    float off_policy_mask_threshold;
    /* the entropy bonus (TRL: entropy_coef != 0 or use_adaptive_entropy): loss -= entropy_coef_applied *
     * the mean entropy over the tokens in the loss / gradient_accumulation_steps; entropy_coef_applied is
     * what TRL's apply_coef is this step (grpo_entropy_coef_applied) */
    bool entropy_bonus;
    double entropy_coef_applied;
} GrpoLossConfig;

typedef struct GrpoLossMetrics {
    /* TRL's clip_ratio/low_mean, high_mean, region_mean over this call's tokens
     * (masked means), and the mean k3 KL (when beta > 0). */
    double clip_ratio_low, clip_ratio_high, clip_ratio_region, kl;
    /* clip_ratio/low_min and high_max: the smallest / largest per-sequence share of
     * clipped tokens (sequences without tokens left out; NAN when none is left) */
    double clip_ratio_low_min, clip_ratio_high_max;
    /* cispo: cispo_clip_ratio (tokens whose ratio exceeds epsilon_high, A > 0);
     * vespo: vespo/phi_seq_mean (the mean gamma weight over sequences) */
    double cispo_clip_ratio, vespo_phi_seq_mean;
    /* with the entropy bonus: TRL's policy_loss (the loss before the bonus, not divided by
     * gradient_accumulation_steps for the loss types that divide), and the sum of the entropies and the
     * count of the tokens the bonus acts on (the adaptive controller's window statistics) */
    double policy_loss, bonus_entropy_sum, bonus_token_count;
    /* the tokens the off-policy mask and the entropy mask dropped (of the counted ones) */
    double off_policy_masked_tokens, entropy_masked_tokens;
} GrpoLossMetrics;

/* ------------------------------------------------ sampler / trainer mismatch
 * TRL's vLLM importance-sampling correction (use_vllm with
 * vllm_importance_sampling_correction): colt's generation engine plays vLLM's
 * part. The sampler's log-prob of each sampled token (after temperature and
 * top-k / top-p / min-p renormalisation, vLLM's "processed_logprobs") differs
 * from the trainer's old log-prob of it; the ratio exp(old - sampling) — per
 * token, or per sequence as exp(sum over the row) — is truncated or masked to
 * [clip_min, clip_max] and multiplies the per-token policy loss. */
typedef enum {
    SAMPLING_IS_TOKEN_TRUNCATE = 0, /* per token, clamped to [clip_min, clip_max] */
    SAMPLING_IS_TOKEN_MASK,         /* per token, 0 outside [clip_min, clip_max] */
    SAMPLING_IS_SEQUENCE_TRUNCATE,  /* one ratio per sequence, clamped */
    SAMPLING_IS_SEQUENCE_MASK       /* one ratio per sequence, 0 outside the bounds (TRL's default) */
} GrpoSamplingIsMode;

/* Parses TRL's vllm_importance_sampling_mode names ("token_truncate",
 * "token_mask", "sequence_truncate", "sequence_mask"). Return 0 or -1 with err
 * naming the valid values. */
int grpo_sampling_is_mode_parse(GrpoSamplingIsMode *out, const char *s, char *err);

/* What TRL logs about the mismatch (sampling/...), for the rows given. TRL
 * computes them once per generation batch on each process; calling
 * grpo_sampling_is_weights on parts of it (single rows, micro-batches) and
 * merging the parts with grpo_sampling_metrics_merge gives the same values. */
typedef struct GrpoSamplingMetrics {
    /* sampling/sampling_logp_difference/mean and /max: |old - sampling| over
     * the counted tokens (mask != 0) whose difference is not NaN; 0 when none */
    double logp_difference_mean, logp_difference_max;
    /* sampling/importance_sampling_ratio/min, /mean, /max: the weights after
     * truncation / masking, over the counted tokens (token modes) or over every
     * sequence, fully masked ones included (sequence modes); 0 when none */
    double is_ratio_min, is_ratio_mean, is_ratio_max;
    /* the sums and counts behind the means, so that parts can be merged */
    double logp_difference_sum, is_ratio_sum;
    long long logp_difference_count, is_ratio_count;
} GrpoSamplingMetrics;

/* is_weight[B, T] = what TRL multiplies the per-token policy loss by
 * (sequence modes: the row's one weight in each of its T entries; padded
 * tokens get a weight too, which the loss multiplies by mask = 0), from
 * old_logp[B, T] (the trainer's log-probs of the sampled tokens before this
 * batch's updates), sampling_logp[B, T] (the engine's; NaN = not scored, a
 * weight of 1 as TRL) and mask[B, T]. clip_min / clip_max: NaN = None (TRL's
 * Optional[float]); a *_truncate mode needs at least one of them. metrics may be
 * NULL. Returns 0, or -1 with err. */
int grpo_sampling_is_weights(float *is_weight, GrpoSamplingMetrics *metrics, const float *old_logp,
                             const float *sampling_logp, const float *mask, int B, int T, GrpoSamplingIsMode mode,
                             double clip_min, double clip_max, char *err);

/* into += part (sums, counts, min, max), then the means and the empty-case
 * zeros recomputed. Start from a zeroed struct. */
void grpo_sampling_metrics_merge(GrpoSamplingMetrics *into, const GrpoSamplingMetrics *part);

/* TRL's reduction across processes of per_rank[n_ranks] (each rank's metrics
 * for its generation batch, all-gathered): a plain mean of the ranks' means
 * (a rank with no counted tokens contributes its 0), the max of the maxes, the
 * min of the mins (an empty rank's 0 included, as TRL's nanmin sees it). The
 * sums and counts of out are the totals. */
void grpo_sampling_metrics_reduce_ranks(GrpoSamplingMetrics *out, const GrpoSamplingMetrics *per_rank, int n_ranks);

/* loss (scalar) and dlogp[B, T] = d loss / d logp, for one micro-batch:
 * logp = current policy log-probs, old_logp (log-probs at generation time, or
 * NULL: then old = logp detached, i.e. ratio 1 with gradient), ref_logp (NULL
 * when beta == 0), advantages[B]. Returns 0, or -1 with err on a bad config. */
int grpo_loss(float *loss, float *dlogp, GrpoLossMetrics *metrics, const GrpoLossConfig *cfg, const float *logp,
              const float *old_logp, const float *ref_logp, const float *mask, const float *advantages, int B,
              int T, char *err);

/* grpo_loss with TRL's sampling correction: is_weight[B, T] (from
 * grpo_sampling_is_weights; NULL = none, exactly grpo_loss) multiplies the
 * per-token policy loss -min(c1 A, c2 A) before the KL term is added, as TRL's
 * _compute_loss does; the KL term is not weighted. The weights are constants
 * (no gradient flows into them). With the correction on, TRL always has old
 * log-probs: pass the same old_logp the weights were computed from (or NULL
 * when they equal this forward's own log-probs, i.e. on-policy). */
int grpo_loss_with_is_weight(float *loss, float *dlogp, GrpoLossMetrics *metrics, const GrpoLossConfig *cfg,
                             const float *logp, const float *old_logp, const float *ref_logp, const float *is_weight,
                             const float *mask, const float *advantages, int B, int T, char *err);

/* What grpo_loss_compute takes beyond grpo_loss's arguments; every pointer may be NULL (the feature
 * off). All [B, T]. */
typedef struct GrpoLossInputs {
    const float *is_weight;     /* grpo_sampling_is_weights' weights (see grpo_loss_with_is_weight) */
    /* the engine's log-probs for the off-policy mask (NaN = not scored: no evidence, a difference of 0);
     * NULL = TRL without vLLM: the old log-probs (or this forward's own when those are NULL too) */
    const float *sampling_logp;
    const float *entropy;       /* this forward's per-token entropies: needed by the entropy bonus */
    const float *entropy_mask;  /* 1 = a high-entropy token (grpo_high_entropy_mask), 0 = out of the policy loss */
    float *dentropy;            /* out: d loss / d entropy (the bonus's gradient; 0 without it) */
} GrpoLossInputs;

/* The general loss: grpo_loss_with_is_weight plus TRL's off-policy sequence mask, entropy mask, entropy
 * bonus and use_bias_correction_kl = false, in _compute_loss's order: per-token policy loss x off-policy
 * mask x entropy mask x IS weight, + beta * KL, normalised by loss_type, - the bonus. Returns 0, or -1
 * with err. */
int grpo_loss_compute(float *loss, float *dlogp, GrpoLossMetrics *metrics, const GrpoLossConfig *cfg,
                      const float *logp, const float *old_logp, const float *ref_logp, const GrpoLossInputs *in,
                      const float *mask, const float *advantages, int B, int T, char *err);

/* ------------------------------------------------ entropy masking and control
 * TRL's top_entropy_quantile < 1 (get_high_entropy_mask): the threshold is torch.quantile (linear
 * interpolation) at q = 1 - top_entropy_quantile of the entropies of every counted token of the
 * micro-batch on every process (pool[n_pool], gathered in any order); entropy_mask[B, T] = 1 where
 * mask != 0 and entropy >= the threshold, else 0; all 0 when the pool is empty. *threshold gets it (NaN
 * when empty; may be NULL). pool is sorted in place. Returns 0, or -1 with err (q outside [0, 1]). */
int grpo_high_entropy_mask(float *entropy_mask, double *threshold, const float *entropy, const float *mask, int B,
                           int T, float *pool, size_t n_pool, double q, char *err);

/* TRL's adaptive entropy controller (use_adaptive_entropy), state across optimizer steps (saved in
 * checkpoints): coef starts at entropy_coef, last_world_entropy at +inf (no bonus until a measurement). */
typedef struct GrpoEntropyControl {
    double coef;
    double last_world_entropy;
} GrpoEntropyControl;

/* The coefficient every micro-batch of this accumulation window applies: entropy_coef itself without
 * adaptive control; with it, coef when last_world_entropy <= target, else 0. */
double grpo_entropy_coef_applied(const GrpoEntropyControl *ctl, bool adaptive, double target);
/* At an optimizer step's end, with the window's entropy sum and token count summed over every rank and
 * micro-batch: the world entropy sum / max(count, 1); coef += delta (capped at coef_max) when it is <=
 * target, else coef -= delta (floored at coef_min); last_world_entropy = it. */
void grpo_entropy_control_update(GrpoEntropyControl *ctl, double entropy_sum, double token_count, double target,
                                 double delta, double coef_min, double coef_max);

#endif
