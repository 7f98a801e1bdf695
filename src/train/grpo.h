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

typedef enum { LOSS_GRPO = 0, LOSS_BNPO, LOSS_DR_GRPO, LOSS_DAPO } GrpoLossType;
typedef enum { SCALE_GROUP = 0, SCALE_BATCH, SCALE_NONE } GrpoScaleRewards;
typedef enum { IS_LEVEL_TOKEN = 0, IS_LEVEL_SEQUENCE } GrpoImportanceLevel;

/* Parses TRL's names ("grpo", "bnpo", "dr_grpo", "dapo"; "group", "batch",
 * "none" — and true/false as TRL accepts for scale_rewards; "token",
 * "sequence"). Return 0 or -1 with err naming the valid values. */
int grpo_loss_type_parse(GrpoLossType *out, const char *s, char *err);
int grpo_scale_rewards_parse(GrpoScaleRewards *out, const char *s, char *err);
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
} GrpoLossConfig;

typedef struct GrpoLossMetrics {
    /* TRL's clip_ratio/low_mean, high_mean, region_mean over this call's tokens
     * (masked means), and the mean k3 KL (when beta > 0). */
    double clip_ratio_low, clip_ratio_high, clip_ratio_region, kl;
} GrpoLossMetrics;

/* loss (scalar) and dlogp[B, T] = d loss / d logp, for one micro-batch:
 * logp = current policy log-probs, old_logp (log-probs at generation time, or
 * NULL: then old = logp detached, i.e. ratio 1 with gradient), ref_logp (NULL
 * when beta == 0), advantages[B]. Returns 0, or -1 with err on a bad config. */
int grpo_loss(float *loss, float *dlogp, GrpoLossMetrics *metrics, const GrpoLossConfig *cfg, const float *logp,
              const float *old_logp, const float *ref_logp, const float *mask, const float *advantages, int B,
              int T, char *err);

#endif
