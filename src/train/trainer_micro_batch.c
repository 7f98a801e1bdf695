/* trainer_micro_batch.c — one micro-batch of the world: each rank's slice
 * packed, forward, TRL's GRPO loss with the importance-sampling weights,
 * backward (gradients accumulate), then the ranks' metrics merged in rank
 * order. Not the optimizer step (dist_optimizer) nor the round (trainer_rollout.c). */
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
 * clip_ratio low_min / high_max, cispo_clip_ratio, vespo's phi mean. */
#define N_MB_VALUES 10

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
    float loss = 0;
    GrpoLossMetrics lm;
    if (grpo_loss_with_is_weight(&loss, t->buf.mb_dlogp, &lm, &lc, t->buf.mb_logp, t->need_old_logp ? t->buf.mb_old : NULL,
                                 trainer_has_reference(t) ? t->buf.mb_ref : NULL,
                                 c->vllm_importance_sampling_correction ? t->buf.mb_isw : NULL, t->buf.mb_mask, t->buf.mb_adv,
                                 B, T, err) != 0)
        return COLT_ERR;
    /* Back to the packed token layout. */
    memset(t->buf.tok_dlogp, 0, sizeof(float) * (size_t)n);
    off = 0;
    for (int b = 0; b < B; b++) {
        Sample *s = &r->samples[idx[b]];
        int plen = r->prompt_len[s->prompt];
        for (int j = 0; j < s->len; j++) t->buf.tok_dlogp[off + plen - 1 + j] = t->buf.mb_dlogp[(size_t)b * T + j];
        off += plen + s->len - 1;
    }
    if (model_train_backward(t->model, t->ts, t->buf.tok_dlogp, t->optimizer.grads, err) != 0) return COLT_ERR;

    *part_out = part;
    double v[N_MB_VALUES] = {ent_count > 0 ? ent_sum / ent_count : NAN, lm.clip_ratio_low, lm.clip_ratio_high,
                             lm.clip_ratio_region, lm.kl, loss, lm.clip_ratio_low_min, lm.clip_ratio_high_max,
                             lm.cispo_clip_ratio, lm.vespo_phi_seq_mean};
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
    free(all);
    r->micro_done++;
    return rc;
}
