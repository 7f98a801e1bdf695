/* metrics.h — running means of named metrics between logging steps (TRL
 * averages what it collected since the last log), serialisable so a resumed
 * run logs exactly what the uninterrupted one would. */
#ifndef COLT_TRAIN_METRICS_H
#define COLT_TRAIN_METRICS_H

#include <jansson.h>

#define METRICS_MAX 64

typedef struct Metrics {
    int n;
    char names[METRICS_MAX][64];
    double sum[METRICS_MAX];
    double count[METRICS_MAX];
} Metrics;

/* Adds one observation (NaN observations are skipped, like nanmean). */
void metrics_add(Metrics *m, const char *name, double value);
/* Replaces the metric's value (for "last value" metrics such as learning_rate). */
void metrics_set(Metrics *m, const char *name, double value);
/* Means as a JSON object (metric names in insertion order), then clears. */
json_t *metrics_flush(Metrics *m);
json_t *metrics_to_json(const Metrics *m);
/* Reads metrics_to_json's form back, checked (names, finite sums, counts >= 0);
 * where: for messages. */
int metrics_from_json(Metrics *m, json_t *j, const char *where, char *err);

#endif
