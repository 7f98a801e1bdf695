/* report.h — what a finished run leaves for a person: summary.json (eval
 * reward before/after, steps, time, settings) and reward_curve.svg (the
 * logged training reward per step, with the eval rewards marked), both read
 * from / written next to output_dir/metrics.jsonl. */
#ifndef COLT_TRAIN_REPORT_H
#define COLT_TRAIN_REPORT_H

#include <jansson.h>
#include <stdint.h>

typedef struct ReportSummary {
    double eval_reward_before, eval_reward_after;  /* NaN when there is no eval set */
    int64_t steps;
    double seconds;
} ReportSummary;

/* Writes output_dir/summary.json and output_dir/reward_curve.svg. Takes ownership of config. */
int report_write(const char *output_dir, const ReportSummary *s, json_t *config, char *err);

#endif
