/* report.h — what a finished run leaves for a person: summary.json (eval
 * reward before/after, steps, time, settings), reward_curve.svg (the logged
 * training reward per step, with the eval rewards marked) and
 * training_curves.svg (loss, KL when beta > 0, entropy and mean completion
 * length per logged step, as small multiples), all read from / written next to
 * output_dir/metrics.jsonl. */
#ifndef COLT_TRAIN_REPORT_H
#define COLT_TRAIN_REPORT_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct ReportSummary {
    double eval_reward_before, eval_reward_after;  /* NaN when there is no eval set */
    int64_t steps;
    double seconds;
} ReportSummary;

/* Writes output_dir/summary.json, output_dir/reward_curve.svg and output_dir/training_curves.svg (a
 * panel each for "loss", "kl" — only when logged —, "entropy" and "completions/mean_length"; a metric
 * no line carries is drawn as "not logged"). Takes ownership of config.
 * The curve is metrics.jsonl's "reward" per logged step; lines that carry "eval_reward" (with their
 * "step") are drawn as eval points, beside the before/after values of s. */
int report_write(const char *output_dir, const ReportSummary *s, json_t *config, char *err);

/* Refuses, in one line, an output_dir whose files a run writes (metrics.jsonl,
 * completions.jsonl, eval_*.jsonl, summary.json, the SVGs, the final weights,
 * adapters, config and tokenizer files) include a device, FIFO, socket or directory, or a link to one
 * (core/fileio.h's rule), so a bad path stops the run at setup, not after it. */
int report_check_output_dir(const char *output_dir, char *err);

/* The ticks of one plot axis: count values first + i * step, i = 0 .. count-1. */
typedef struct AxisTicks {
    double step;   /* 1, 2 or 5 x 10^k; at least 1 on an integer axis */
    double first;  /* the first tick, a multiple of step */
    int count;     /* at least 1 */
    int decimals;  /* digits after the point that print every tick exactly ("%.*f") */
} AxisTicks;

/* The smallest step of the form 1, 2 or 5 x 10^k (a whole number when integer is set) whose
 * multiples in [lo, hi] are at most max_ticks (>= 2) ticks. With widen the axis grows to the
 * multiples of step around lo and hi, and both ends are ticks (also at most max_ticks); without
 * it the ticks are the multiples inside [lo, hi]. Requires finite lo < hi. */
AxisTicks report_axis_ticks(double lo, double hi, int max_ticks, bool integer, bool widen);

#endif
