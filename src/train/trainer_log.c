/* trainer_log.c — what a step leaves behind: its line in metrics.jsonl (TRL's
 * names), TensorBoard, the progress line, sample completions, eval rewards.
 * Not the end-of-run report (report.c). */
#include "train/trainer_internal.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fileio.h"
#include <unistd.h>
#include "core/error.h"
#include "core/log.h"

static double fractional_epoch(const Trainer *t) {
    size_t n = dataset_size(t->data);
    if (t->epoch == 0) return 0.0;
    return (double)(t->epoch - 1) + (double)t->epoch_pos / (double)n;
}

static void format_duration(char *buf, size_t size, double seconds) {
    long s = (long)(seconds + 0.5);
    if (s >= 3600) snprintf(buf, size, "%ldh%02ldm", s / 3600, (s / 60) % 60);
    else snprintf(buf, size, "%ldm%02lds", s / 60, s % 60);
}

/* Writes one metrics line and the progress line; prints and saves sample completions. */
static int log_step(Trainer *t, double elapsed, int64_t steps_this_run, char *err) {
    json_t *o = metrics_flush(&t->metrics);
    json_t *line = json_object();
    json_object_set_new(line, "step", json_integer(t->global_step));
    json_object_set_new(line, "epoch", json_real(fractional_epoch(t)));
    json_object_update(line, o);
    json_decref(o);
    json_object_set_new(line, "num_tokens", json_integer(t->num_tokens));
    char *s = json_dumps(line, JSON_REAL_PRECISION(8));
    int rc = file_append_line(t->metrics_fp, t->metrics_path, s, err);
    free(s);
    if (rc == 0 && t->tb) rc = tensorboard_add_metrics(t->tb, line, err);

    double per_step = steps_this_run > 0 ? elapsed / (double)steps_this_run : 0.0;
    char eta[32];
    format_duration(eta, sizeof eta, per_step * (double)(t->total_steps - t->global_step));
    json_t *reward = json_object_get(line, "reward"), *loss = json_object_get(line, "loss");
    json_t *len = json_object_get(line, "completions/mean_length");
    /* A step that starts no round has no reward or length (null or absent in
     * metrics.jsonl), and a round without a usable reward has none: "-", not 0 */
    char reward_s[32] = "-", loss_s[32] = "-", len_s[32] = "-";
    if (json_is_number(reward)) snprintf(reward_s, sizeof reward_s, "%.4f", json_number_value(reward));
    if (json_is_number(loss)) snprintf(loss_s, sizeof loss_s, "%.5f", json_number_value(loss));
    if (json_is_number(len)) snprintf(len_s, sizeof len_s, "%.1f", json_number_value(len));
    log_info0("step %lld/%lld | reward %s | loss %s | mean length %s | %.2f s/step | ETA %s",
              (long long)t->global_step, (long long)t->total_steps, reward_s, loss_s, len_s, per_step, eta);
    json_decref(line);

    /* Sample completions of the current round, printed and saved. */
    Rollout *r = &t->ro;
    if (rc != 0 || !r->samples || t->cfg->log_completions_count <= 0) return rc;
    char *path = path_join(t->cfg->output_dir, "completions.jsonl");
    FILE *fp = file_open_append(path, err);
    if (!fp) rc = COLT_ERR;
    for (int i = 0; rc == 0 && i < t->cfg->log_completions_count && i < r->n_samples; i++) {
        int k = (int)(((int64_t)i * r->n_samples) / t->cfg->log_completions_count);
        Sample *sm = &r->samples[k];
        /* JSON-quoted, so newlines in a completion stay on one line. */
        json_t *p = json_string(r->prompt_text[sm->prompt]), *q = json_string(sm->text);
        char *ps = json_dumps(p, JSON_ENCODE_ANY), *qs = json_dumps(q, JSON_ENCODE_ANY);
        log_info0("  sample: %s -> %s  [reward %.3f]", ps, qs, sm->reward);
        free(ps), free(qs);
        json_decref(p), json_decref(q);
        json_t *so = json_pack("{s:I,s:s,s:s,s:o,s:f}", "step", (json_int_t)t->global_step, "prompt",
                               r->prompt_text[sm->prompt], "completion", sm->text, "reward",
                               isnan(sm->reward) ? json_null() : json_real(sm->reward), "advantage",
                               (double)sm->advantage);
        char *ss = so ? json_dumps(so, 0) : NULL;
        if (ss) rc = file_append_line(fp, path, ss, err);
        free(ss);
        json_decref(so);
    }
    if (fp && fclose(fp) != 0 && rc == 0) rc = errorf(err, "%s: cannot write: %s", path, strerror(errno));
    free(path);
    return rc;
}

/* An eval's mean reward at the current step, to TensorBoard ("eval/reward")
 * and, for the evals during training, to metrics.jsonl as {"step",
 * "eval_reward"} (reward_curve.svg marks those; summary.json has before and
 * after). Rank 0 writes; every rank gets the outcome. */
int trainer_log_eval(Trainer *t, double reward, bool during_training, char *err) {
    int rc = COLT_OK;
    if (t->writer) {
        json_t *line = json_pack("{s:I,s:o}", "step", (json_int_t)t->global_step, "eval_reward",
                                 isnan(reward) ? json_null() : json_real(reward));
        char *s = during_training ? json_dumps(line, JSON_REAL_PRECISION(8)) : NULL;
        if (s) rc = file_append_line(t->metrics_fp, t->metrics_path, s, err);
        free(s);
        if (rc == 0 && t->tb) rc = tensorboard_add_metrics(t->tb, line, err);
        json_decref(line);
    }
    return train_dist_agree(&t->dist, rc, err);
}

void step_clock_start(StepClock *clock, Trainer *t) {
    clock->step_start = time_now();
    clock->at_start = t->times;
    if (t->be->memory_stats) t->be->memory_stats(t->be, NULL, NULL, true); /* this step's peak */
}

void trainer_add_step_metrics(Trainer *t, StepClock *clock, double loss, double norm) {
    double now = time_now();
    clock->step_end = now;
    const TrainerTimes *t0 = &clock->at_start, *t1 = &t->times;
    metrics_add(&t->metrics, "loss", loss);
    metrics_set(&t->metrics, "grad_norm", norm);
    metrics_set(&t->metrics, "learning_rate", trainer_learning_rate(t)); /* the next step's */
    metrics_add(&t->metrics, "step_time", now - clock->step_start);
    metrics_add(&t->metrics, "time/generation", t1->generation - t0->generation);
    metrics_add(&t->metrics, "time/scoring", t1->scoring - t0->scoring);
    metrics_add(&t->metrics, "time/logprobs", t1->logprobs - t0->logprobs);
    metrics_add(&t->metrics, "time/activation_memory", t1->memory - t0->memory);
    if (!t->server) metrics_add(&t->metrics, "time/generation_engine", t1->engine - t0->engine);
    if (t->dist.world > 1) metrics_add(&t->metrics, "time/generation_exchange", t1->exchange - t0->exchange);
    if (t->be->memory_stats) {
        /* colt's own buffers (weights, state, activations, KV pool): what the plan sizes */
        size_t in_use = 0, peak = 0;
        t->be->memory_stats(t->be, &in_use, &peak, false);
        metrics_set(&t->metrics, "memory/allocated_gb", in_use / (1024.0 * 1024.0 * 1024.0));
        metrics_set(&t->metrics, "memory/allocated_peak_gb", peak / (1024.0 * 1024.0 * 1024.0));
    }
    metrics_add(&t->metrics, "time/training", (now - clock->step_start) - (t1->generation - t0->generation) -
                                                  (t1->scoring - t0->scoring) - (t1->logprobs - t0->logprobs));
}

int trainer_log_progress(Trainer *t, const StepClock *clock, double loss, bool last, char *err) {
    const bool live_progress = isatty(STDERR_FILENO);
    /* logging_first_step: transformers logs global step 1 as well */
    bool logging = t->global_step % t->cfg->logging_steps == 0 || last ||
                   (t->cfg->logging_first_step && t->global_step == 1);
    double elapsed = clock->step_end - clock->loop_start;
    int64_t steps_this_run = t->global_step - clock->run_first_step;
    if (live_progress && !logging) {
        /* The live line between logging steps, overwritten in place. */
        double per_step = elapsed / (double)steps_this_run;
        char eta[32];
        format_duration(eta, sizeof eta, per_step * (double)(t->total_steps - t->global_step));
        fprintf(stderr, "\r\033[Kstep %lld/%lld | loss %.5f | %.2f s/step | ETA %s", (long long)t->global_step,
                (long long)t->total_steps, loss, per_step, eta);
        fflush(stderr);
    }
    if (!logging) return COLT_OK;
    if (live_progress) fputs("\r\033[K", stderr);
    int rc = COLT_OK;
    if (t->writer) rc = log_step(t, elapsed, steps_this_run, err);
    else json_decref(metrics_flush(&t->metrics)); /* rank 0 logs the world's metrics */
    return train_dist_agree(&t->dist, rc, err);
}
