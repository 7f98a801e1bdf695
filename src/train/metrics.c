/* metrics.c — see metrics.h. */
#include "train/metrics.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/error.h"

static int metrics_index(Metrics *m, const char *name) {
    for (int i = 0; i < m->n; i++)
        if (strcmp(m->names[i], name) == 0) return i;
    COLT_ASSERT(m->n < METRICS_MAX);
    snprintf(m->names[m->n], sizeof m->names[0], "%s", name);
    m->sum[m->n] = 0.0;
    m->count[m->n] = 0.0;
    return m->n++;
}

void metrics_add(Metrics *m, const char *name, double value) {
    int i = metrics_index(m, name);
    if (isnan(value)) return;
    m->sum[i] += value;
    m->count[i] += 1.0;
}

void metrics_set(Metrics *m, const char *name, double value) {
    int i = metrics_index(m, name);
    m->sum[i] = value;
    m->count[i] = 1.0;
}

json_t *metrics_flush(Metrics *m) {
    json_t *o = json_object();
    for (int i = 0; i < m->n; i++) {
        if (m->count[i] > 0) json_object_set_new(o, m->names[i], json_real(m->sum[i] / m->count[i]));
        else json_object_set_new(o, m->names[i], json_null());
    }
    m->n = 0;
    return o;
}

json_t *metrics_to_json(const Metrics *m) {
    json_t *a = json_array();
    for (int i = 0; i < m->n; i++)
        json_array_append_new(a, json_pack("{s:s,s:f,s:f}", "name", m->names[i], "sum", m->sum[i], "count", m->count[i]));
    return a;
}

int metrics_from_json(Metrics *m, json_t *j, const char *where, char *err) {
    memset(m, 0, sizeof *m);
    if (!json_is_array(j)) return errorf(err, "%s: metrics must be an array", where);
    if (json_array_size(j) > METRICS_MAX)
        return errorf(err, "%s: %zu metrics, at most %d", where, json_array_size(j), METRICS_MAX);
    size_t i;
    json_t *e;
    json_array_foreach(j, i, e) {
        const char *name = json_string_value(json_object_get(e, "name"));
        json_t *sum = json_object_get(e, "sum"), *count = json_object_get(e, "count");
        if (!name || strlen(name) >= sizeof m->names[0])
            return errorf(err, "%s: metrics[%zu] needs a name shorter than %zu characters", where, i, sizeof m->names[0]);
        for (int k = 0; k < m->n; k++)
            if (strcmp(m->names[k], name) == 0) return errorf(err, "%s: metric '%s' appears twice", where, name);
        if (!json_is_number(sum) || !isfinite(json_number_value(sum)) || !json_is_number(count) ||
            !(json_number_value(count) >= 0) || !isfinite(json_number_value(count)))
            return errorf(err, "%s: metric '%s' needs a finite sum and a count >= 0", where, name);
        int k = metrics_index(m, name);
        m->sum[k] = json_number_value(sum);
        m->count[k] = json_number_value(count);
    }
    return COLT_OK;
}
