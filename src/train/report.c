/* report.c — see report.h. The SVG is drawn by hand: a line per metric over
 * steps with axes and labels; no plotting library is needed for that. */
#include "train/report.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/fileio.h"

static json_t *num_or_null(double x) { return isnan(x) ? json_null() : json_real(x); }

/* Reads (step, reward, reward_std) from metrics.jsonl. */
static int read_curve(const char *path, double **steps, double **rewards, int *n) {
    char *data = NULL;
    size_t len = 0;
    *n = 0;
    *steps = *rewards = NULL;
    if (file_read_all(path, &data, &len, NULL) != 0) return COLT_ERR;
    int cap = 0;
    for (char *line = strtok(data, "\n"); line; line = strtok(NULL, "\n")) {
        json_t *o = json_loads(line, 0, NULL);
        json_t *s = json_object_get(o, "step"), *r = json_object_get(o, "reward");
        if (json_is_number(s) && json_is_number(r)) {
            if (*n == cap) {
                cap = cap ? cap * 2 : 64;
                *steps = xrealloc(*steps, sizeof(double) * (size_t)cap);
                *rewards = xrealloc(*rewards, sizeof(double) * (size_t)cap);
            }
            (*steps)[*n] = json_number_value(s);
            (*rewards)[*n] = json_number_value(r);
            (*n)++;
        }
        json_decref(o);
    }
    free(data);
    return COLT_OK;
}

static int write_svg(const char *path, const double *x, const double *y, int n, double before, double after,
                     double last_step, char *err) {
    const double W = 720, H = 420, L = 70, R = 20, T = 40, B = 50;
    double xmin = 0, xmax = last_step > 0 ? last_step : 1, ymin = INFINITY, ymax = -INFINITY;
    for (int i = 0; i < n; i++) ymin = fmin(ymin, y[i]), ymax = fmax(ymax, y[i]);
    if (!isnan(before)) ymin = fmin(ymin, before), ymax = fmax(ymax, before);
    if (!isnan(after)) ymin = fmin(ymin, after), ymax = fmax(ymax, after);
    if (!isfinite(ymin)) ymin = 0, ymax = 1;
    if (ymax - ymin < 1e-9) ymin -= 0.5, ymax += 0.5;
    double pad = 0.05 * (ymax - ymin);
    ymin -= pad, ymax += pad;
#define PX(v) (L + ((v) - xmin) / (xmax - xmin) * (W - L - R))
#define PY(v) (H - B - ((v) - ymin) / (ymax - ymin) * (H - T - B))
    AtomicFile af;
    if (atomic_open(&af, path, err) != 0) return COLT_ERR;
    FILE *f = af.fp;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\" "
               "font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n", W, H);
    fprintf(f, "<text x=\"%.0f\" y=\"22\" font-size=\"15\">colt GRPO: training reward per logged step</text>\n", L);
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n", L, H - B, W - R, H - B);
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n", L, T, L, H - B);
    for (int k = 0; k <= 4; k++) {
        double v = ymin + (ymax - ymin) * k / 4, xv = xmin + (xmax - xmin) * k / 4;
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%.3g</text>\n", L - 6, PY(v) + 4, v);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", L, PY(v), W - R, PY(v));
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%.0f</text>\n", PX(xv), H - B + 18, xv);
    }
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">optimizer step</text>\n", (L + W - R) / 2, H - 10);
    fprintf(f, "<text x=\"16\" y=\"%.1f\" transform=\"rotate(-90 16 %.1f)\" text-anchor=\"middle\">reward</text>\n",
            (T + H - B) / 2, (T + H - B) / 2);
    if (n > 0) {
        fprintf(f, "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"2\" points=\"");
        for (int i = 0; i < n; i++) fprintf(f, "%.1f,%.1f ", PX(x[i]), PY(y[i]));
        fprintf(f, "\"/>\n");
    }
    if (!isnan(before)) {
        fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"5\" fill=\"#d62728\"/>\n", PX(0), PY(before));
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" fill=\"#d62728\">eval before %.3f</text>\n", PX(0) + 8, PY(before) - 8, before);
    }
    if (!isnan(after)) {
        fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"5\" fill=\"#2ca02c\"/>\n", PX(xmax), PY(after));
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" fill=\"#2ca02c\" text-anchor=\"end\">eval after %.3f</text>\n",
                PX(xmax) - 8, PY(after) - 8, after);
    }
    fprintf(f, "</svg>\n");
#undef PX
#undef PY
    return atomic_commit(&af, err);
}

int report_write(const char *output_dir, const ReportSummary *s, json_t *config, char *err) {
    char *metrics = path_join(output_dir, "metrics.jsonl"), *summary = path_join(output_dir, "summary.json");
    char *svg = path_join(output_dir, "reward_curve.svg");
    double *x = NULL, *y = NULL;
    int n = 0;
    read_curve(metrics, &x, &y, &n);
    json_t *o = json_object();
    json_object_set_new(o, "eval_reward_before", num_or_null(s->eval_reward_before));
    json_object_set_new(o, "eval_reward_after", num_or_null(s->eval_reward_after));
    json_object_set_new(o, "eval_reward_gain", num_or_null(s->eval_reward_after - s->eval_reward_before));
    json_object_set_new(o, "steps", json_integer(s->steps));
    json_object_set_new(o, "seconds", json_real(s->seconds));
    json_object_set_new(o, "train_reward_first", n ? json_real(y[0]) : json_null());
    json_object_set_new(o, "train_reward_last", n ? json_real(y[n - 1]) : json_null());
    json_object_set_new(o, "config", config);
    char *text = json_dumps(o, JSON_INDENT(2) | JSON_REAL_PRECISION(8));
    int rc = file_write_atomic(summary, text, strlen(text), err);
    free(text);
    json_decref(o);
    if (rc == 0) rc = write_svg(svg, x, y, n, s->eval_reward_before, s->eval_reward_after, (double)s->steps, err);
    free(x), free(y), free(metrics), free(summary), free(svg);
    return rc;
}
