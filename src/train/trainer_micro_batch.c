/* trainer_micro_batch.c — one micro-batch of the world: each rank's slice
 * packed, forward, TRL's GRPO loss with the importance-sampling weights, the
 * off-policy and entropy masks and the entropy bonus, backward (gradients
 * accumulate; the bonus's through the entropies), then the ranks' metrics
 * merged in rank order and the adaptive entropy controller stepped. Not the
 * optimizer step (dist_optimizer) nor the round (trainer_rollout.c). */
#include "train/trainer_internal.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/lora.h"
#include "core/error.h"
#include "core/log.h"

/* One micro-batch: forward, GRPO loss, backward (gradients accumulate). */
/* This rank's part of a micro-batch: forward, GRPO loss, backward (gradients
 * accumulate). Fills the values the ranks then share. */
/* A micro-batch's values gathered from every rank: entropy, clip_ratio low / high / region, kl, loss,
 * clip_ratio low_min / high_max, cispo_clip_ratio, vespo's phi mean, policy_loss, the entropy bonus's
 * entropy sum and token count. */
#define N_MB_VALUES 13

/* TRL's top_entropy_quantile < 1: the quantile over the counted tokens of this micro-batch on every rank
 * (each rank sends its count and its entropies; the pool is then the same on every rank, whatever the
 * order), and this rank's mask from it. */
static int high_entropy_mask(Trainer *t, int B, int T, char *err) {
    const size_t each = 1 + (size_t)t->cfg->per_device_train_batch_size * t->cfg->max_completion_length;
    float *mine = t->buf.entropy_pool + (size_t)t->dist.world * each; /* the pool's last slot: this rank's */
    uint32_t n = 0;
    for (size_t i = 0; i < (size_t)B * T; i++)
        if (t->buf.mb_mask[i] != 0.0f) mine[1 + n++] = t->buf.mb_entropy[i];
    memcpy(&mine[0], &n, sizeof n); /* the count's bits in the first float */
    if (train_dist_gather(&t->dist, t->buf.entropy_pool, mine, each * sizeof(float), err) != 0) return COLT_ERR;
    size_t total = 0; /* packed in place: every rank's entropies one after the other */
    for (int q = 0; q < t->dist.world; q++) {
        const float *part = t->buf.entropy_pool + (size_t)q * each;
        uint32_t count;
        memcpy(&count, &part[0], sizeof count);
        memmove(t->buf.entropy_pool + total, part + 1, count * sizeof(float));
        total += count;
    }
    return grpo_high_entropy_mask(t->buf.mb_entropy_mask, NULL, t->buf.mb_entropy, t->buf.mb_mask, B, T,
                                  t->buf.entropy_pool, total, 1.0 - t->cfg->top_entropy_quantile, err);
}

static int micro_batch_local(Trainer *t, GrpoSamplingMetrics *part_out, double values[N_MB_VALUES], char *err) {
    TrainConfig *c = t->cfg;
    Rollout *r = &t->ro;
    const int bs = c->per_device_train_batch_size;
    /* Micro-batch k of the round spans the world: this rank takes its slice. */
    int k = r->micro_done % c->steps_per_generation;
    const int *idx = r->order + ((size_t)k * t->dist.world + t->dist.rank) * bs;
    int B = bs;
    int n = trainer_pack_batch(t, r, idx, B);
    int T = 1;
    for (int b = 0; b < B; b++)
        if (r->samples[idx[b]].len > T) T = r->samples[idx[b]].len;

    if (trainer_ensure_activations(t, err) != 0) return COLT_ERR;
    /* lora_dropout in this forward and its backward only; the masks keyed by the optimizer step and the
     * micro-batch in it, so a resumed run draws what the uninterrupted one drew */
    model_lora_set_dropout_key(t->model, c->seed, t->global_step * TRAIN_CONFIG_MAX_BATCH + t->micro_in_step);
    int frc = model_train_forward(t->model, t->ts, t->buf.tok_ids, t->buf.tok_slot, t->buf.tok_pos, t->buf.tok_target, n,
                                  (float)c->temperature, t->buf.tok_logp, t->buf.tok_entropy, err);
    model_lora_set_dropout_key(t->model, c->seed, -1);
    if (frc != 0) return COLT_ERR;
    /* Gather into padded [B, T] matrices. */
    size_t BT = (size_t)B * T;
    memset(t->buf.mb_logp, 0, BT * sizeof(float));
    memset(t->buf.mb_old, 0, BT * sizeof(float));
    memset(t->buf.mb_ref, 0, BT * sizeof(float));
    memset(t->buf.mb_mask, 0, BT * sizeof(float));
    memset(t->buf.mb_sampling, 0, BT * sizeof(float));
    memset(t->buf.mb_entropy, 0, BT * sizeof(float));
    double ent_sum = 0, ent_count = 0;
    int off = 0;
    for (int b = 0; b < B; b++) {
        Sample *s = &r->samples[idx[b]];
        int plen = r->prompt_len[s->prompt];
        bool counted = !(c->mask_truncated_completions && !s->terminated);
        for (int j = 0; j < s->len; j++) {
            int tok = off + plen - 1 + j;
            t->buf.mb_logp[(size_t)b * T + j] = t->buf.tok_logp[tok];
            if (s->old_logp) t->buf.mb_old[(size_t)b * T + j] = s->old_logp[j];
            if (s->ref_logp) t->buf.mb_ref[(size_t)b * T + j] = s->ref_logp[j];
            t->buf.mb_sampling[(size_t)b * T + j] = s->sampling_logp ? s->sampling_logp[j] : NAN;
            /* tool results are context: TRL's completion_mask * tool_mask */
            bool in_loss = counted && (!s->model_mask || s->model_mask[j]);
            t->buf.mb_mask[(size_t)b * T + j] = in_loss ? 1.0f : 0.0f;
            t->buf.mb_entropy[(size_t)b * T + j] = t->buf.tok_entropy[tok];
            if (in_loss) ent_sum += t->buf.tok_entropy[tok], ent_count += 1;
        }
        t->buf.mb_adv[b] = s->advantage;
        off += plen + s->len - 1;
    }
    GrpoLossConfig lc = t->loss_cfg;
    /* TRL's dapo normaliser: the generation batch's tokens, rescaled to one
     * accumulation window (x GAS / steps_per_generation), per process. */
    double items = r->num_items > 1.0 ? r->num_items : 1.0;
    lc.num_items_in_batch = (float)(items * c->gradient_accumulation_steps / c->steps_per_generation);
    /* TRL's vLLM importance-sampling correction: the engine's log-probs against
     * the trainer's old ones. Without a separate old-log-prob pass the weights
     * have not moved since generation, so this forward's own (detached)
     * log-probs are the old ones. */
    GrpoSamplingMetrics part;
    if (grpo_sampling_is_weights(t->buf.mb_isw, &part, t->need_old_logp ? t->buf.mb_old : t->buf.mb_logp, t->buf.mb_sampling,
                                 t->buf.mb_mask, B, T, t->is_mode, c->vllm_importance_sampling_clip_min,
                                 c->vllm_importance_sampling_clip_max, err) != 0)
        return COLT_ERR;
    /* TRL 1.16's masks and entropy bonus. The entropy mask's quantile is a collective: every rank takes
     * part, whatever its slice holds. The bonus's coefficient is the one the controller set at the end of
     * the last optimizer step, the same for every micro-batch of this one. */
    bool entropy_masked = c->top_entropy_quantile < 1.0;
    if (entropy_masked && high_entropy_mask(t, B, T, err) != 0) return COLT_ERR;
    if (!t->entropy_ctl_set) {
        t->entropy_ctl = (GrpoEntropyControl){.coef = c->entropy_coef, .last_world_entropy = INFINITY};
        t->entropy_ctl_set = true;
    }
    lc.entropy_coef_applied = grpo_entropy_coef_applied(&t->entropy_ctl, c->use_adaptive_entropy, c->entropy_target);
    GrpoLossInputs in = {
        .is_weight = c->vllm_importance_sampling_correction ? t->buf.mb_isw : NULL,
        .sampling_logp = t->buf.mb_sampling, /* the engine plays vLLM: its log-probs are always there */
        .entropy = t->buf.mb_entropy,
        .entropy_mask = entropy_masked ? t->buf.mb_entropy_mask : NULL,
        .dentropy = t->buf.mb_dentropy,
    };
    float loss = 0;
    GrpoLossMetrics lm;
    if (grpo_loss_compute(&loss, t->buf.mb_dlogp, &lm, &lc, t->buf.mb_logp, t->need_old_logp ? t->buf.mb_old : NULL,
                          trainer_has_reference(t) ? t->buf.mb_ref : NULL, &in, t->buf.mb_mask, t->buf.mb_adv, B, T,
                          err) != 0)
        return COLT_ERR;
    /* Back to the packed token layout. */
    memset(t->buf.tok_dlogp, 0, sizeof(float) * (size_t)n);
    memset(t->buf.tok_dentropy, 0, sizeof(float) * (size_t)n);
    off = 0;
    for (int b = 0; b < B; b++) {
        Sample *s = &r->samples[idx[b]];
        int plen = r->prompt_len[s->prompt];
        for (int j = 0; j < s->len; j++) {
            t->buf.tok_dlogp[off + plen - 1 + j] = t->buf.mb_dlogp[(size_t)b * T + j];
            t->buf.tok_dentropy[off + plen - 1 + j] = t->buf.mb_dentropy[(size_t)b * T + j];
        }
        off += plen + s->len - 1;
    }
    if (model_train_backward_entropy(t->model, t->ts, t->buf.tok_dlogp, lc.entropy_bonus ? t->buf.tok_dentropy : NULL,
                                     t->optimizer.grads, err) != 0)
        return COLT_ERR;

    *part_out = part;
    /* TRL's policy_loss is each process's own loss: grpo_loss_compute undoes the division by the accumulation
     * steps (here x world); dapo's normaliser here counts the whole world's tokens, TRL's one process's share */
    bool world_tokens = lc.loss_type == LOSS_DAPO || lc.loss_type == LOSS_CISPO || lc.loss_type == LOSS_VESPO;
    double policy_loss = lm.policy_loss * (world_tokens ? t->dist.world : 1);
    double v[N_MB_VALUES] = {ent_count > 0 ? ent_sum / ent_count : NAN, lm.clip_ratio_low, lm.clip_ratio_high,
                             lm.clip_ratio_region, lm.kl, loss, lm.clip_ratio_low_min, lm.clip_ratio_high_max,
                             lm.cispo_clip_ratio, lm.vespo_phi_seq_mean, policy_loss, lm.bonus_entropy_sum,
                             lm.bonus_token_count};
    memcpy(values, v, sizeof v);
    return COLT_OK;
}

/* The loss metrics TRL logs for each loss_type: the clip ratios for the clipped losses, cispo's and
 * vespo's own for theirs, none for sapo. */
static void add_loss_metrics(Trainer *t, const double *all) {
    const char *type = t->cfg->loss_type;
    bool clipped = strcmp(type, "cispo") != 0 && strcmp(type, "sapo") != 0 && strcmp(type, "vespo") != 0;
    double low_min = NAN, high_max = NAN; /* over the world's sequences, as TRL's gathered nanmin / nanmax */
    for (int q = 0; q < t->dist.world; q++) {
        const double *v = all + (size_t)q * N_MB_VALUES;
        if (clipped) {
            metrics_add(&t->metrics, "clip_ratio/low_mean", v[1]);
            metrics_add(&t->metrics, "clip_ratio/high_mean", v[2]);
            metrics_add(&t->metrics, "clip_ratio/region_mean", v[3]);
            if (!isnan(v[6]) && !(v[6] >= low_min)) low_min = v[6];
            if (!isnan(v[7]) && !(v[7] <= high_max)) high_max = v[7];
        } else if (!strcmp(type, "cispo")) {
            metrics_add(&t->metrics, "cispo_clip_ratio", v[8]);
        } else if (!strcmp(type, "vespo")) {
            metrics_add(&t->metrics, "vespo/phi_seq_mean", v[9]);
        }
    }
    if (!isnan(low_min)) metrics_add(&t->metrics, "clip_ratio/low_min", low_min);
    if (!isnan(high_max)) metrics_add(&t->metrics, "clip_ratio/high_max", high_max);
}

/* The entropy bonus's metrics (TRL's policy_loss each micro-batch, entropy_coef at the end of each
 * optimizer step) and, with use_adaptive_entropy, the controller: the window's entropy sum and token count
 * summed over the ranks in rank order (every rank the same values, so the same controller), then updated
 * at the step's last micro-batch as TRL's at sync_gradients. */
static void add_entropy_bonus_metrics(Trainer *t, const double *all) {
    const TrainConfig *c = t->cfg;
    for (int q = 0; q < t->dist.world; q++) {
        const double *v = all + (size_t)q * N_MB_VALUES;
        metrics_add(&t->metrics, "policy_loss", v[10]);
        t->entropy_window_sum += v[11];
        t->entropy_window_count += v[12];
    }
    if (t->micro_in_step != c->gradient_accumulation_steps - 1) return;
    if (c->use_adaptive_entropy)
        grpo_entropy_control_update(&t->entropy_ctl, t->entropy_window_sum, t->entropy_window_count, c->entropy_target,
                                    c->entropy_coef_delta, c->entropy_coef_min, c->entropy_coef_max);
    t->entropy_window_sum = t->entropy_window_count = 0.0;
    metrics_add(&t->metrics, "entropy_coef", t->entropy_ctl.coef);
}

/* One micro-batch of the world: every rank its slice, then the ranks' metrics
 * and losses combined in rank order — the same sums as one process running the
 * ranks' micro-batches one after the other. A failure on any rank fails all. */
int trainer_micro_batch(Trainer *t, double *loss_out, char *err) {
    TrainConfig *c = t->cfg;
    Rollout *r = &t->ro;
    GrpoSamplingMetrics part;
    memset(&part, 0, sizeof part);
    double mine[N_MB_VALUES] = {0};
    if (train_dist_agree(&t->dist, micro_batch_local(t, &part, mine, err), err) != 0) return COLT_ERR;
    if (r->micro_done < c->steps_per_generation) { /* TRL logs these once per round */
        /* every rank's part, merged in rank order (as one process merges its micro-batches) */
        GrpoSamplingMetrics *parts = xcalloc((size_t)t->dist.world, sizeof(GrpoSamplingMetrics));
        int rc = train_dist_gather(&t->dist, parts, &part, sizeof part, err);
        if (r->micro_done == 0) memset(&t->round_sampling, 0, sizeof t->round_sampling);
        for (int q = 0; rc == 0 && q < t->dist.world; q++) grpo_sampling_metrics_merge(&t->round_sampling, &parts[q]);
        free(parts);
        if (rc != 0) return COLT_ERR;
        if (r->micro_done == c->steps_per_generation - 1) {
            const GrpoSamplingMetrics *sm = &t->round_sampling;
            metrics_add(&t->metrics, "sampling/sampling_logp_difference/mean", sm->logp_difference_mean);
            metrics_add(&t->metrics, "sampling/sampling_logp_difference/max", sm->logp_difference_max);
            if (c->vllm_importance_sampling_correction) {
                metrics_add(&t->metrics, "sampling/importance_sampling_ratio/min", sm->is_ratio_min);
                metrics_add(&t->metrics, "sampling/importance_sampling_ratio/mean", sm->is_ratio_mean);
                metrics_add(&t->metrics, "sampling/importance_sampling_ratio/max", sm->is_ratio_max);
            }
        }
    }
    /* TRL logs the loss summed over the accumulation window (the Trainer's tr_loss). */
    double *all = xcalloc((size_t)t->dist.world * N_MB_VALUES, sizeof(double));
    int rc = train_dist_gather(&t->dist, all, mine, sizeof mine, err);
    for (int q = 0; rc == 0 && q < t->dist.world; q++) {
        const double *v = all + (size_t)q * N_MB_VALUES;
        metrics_add(&t->metrics, "entropy", v[0]);
        if (c->beta > 0) metrics_add(&t->metrics, "kl", v[4]);
        *loss_out += v[5];
    }
    if (rc == 0) add_loss_metrics(t, all);
    if (rc == 0 && t->loss_cfg.entropy_bonus) add_entropy_bonus_metrics(t, all);
    free(all);
    r->micro_done++;
    return rc;
}
