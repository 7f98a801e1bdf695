/* report.c — see report.h. The SVGs are drawn by hand: the training reward over
 * steps, eval points, axes with round ticks (report_axis_ticks) and labels, and
 * the small multiples of training_curves.svg; no plotting library is needed for
 * that. */
#include "train/report.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/fileio.h"

int report_check_output_dir(const char *output_dir, char *err) {
    static const char *const names[] = {
        "metrics.jsonl",     "completions.jsonl",         "eval_before.jsonl",   "eval_after.jsonl",
        "eval_latest.jsonl", "summary.json",              "reward_curve.svg",    "training_curves.svg",
        "model.safetensors", "config.json",               "generation_config.json", "tokenizer.json",
        "tokenizer_config.json", "adapter_model.safetensors", "adapter_config.json"};
    int rc = COLT_OK;
    for (size_t i = 0; rc == COLT_OK && i < sizeof names / sizeof names[0]; i++) {
        char *p = path_join(output_dir, names[i]);
        rc = file_check_output(p, err);
        free(p);
    }
    return rc;
}

static json_t *num_or_null(double x) { return isnan(x) ? json_null() : json_real(x); }

/* The points of metrics.jsonl: (step, reward) of every training line and
 * (step, eval_reward) of every line that has one. */
typedef struct Curve {
    double *x, *y;
    int n, cap;
} Curve;

static void curve_add(Curve *c, double x, double y) {
    if (c->n == c->cap) {
        c->cap = c->cap ? c->cap * 2 : 64;
        c->x = xrealloc(c->x, sizeof(double) * (size_t)c->cap);
        c->y = xrealloc(c->y, sizeof(double) * (size_t)c->cap);
    }
    c->x[c->n] = x, c->y[c->n] = y;
    c->n++;
}

static void curve_free(Curve *c) { free(c->x), free(c->y); }

/* curves[k]: (step, keys[k]) of every line of metrics.jsonl that has both as
 * numbers. A metrics file that is missing or has no such lines gives empty
 * curves. */
static void read_curves(const char *path, const char *const *keys, Curve *curves, int n_keys) {
    char *data = NULL;
    size_t len = 0;
    if (file_read_all(path, &data, &len, NULL) != 0) return;
    char *save = NULL;
    for (char *line = strtok_r(data, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        json_t *o = json_loads(line, 0, NULL);
        json_t *s = json_object_get(o, "step");
        for (int k = 0; k < n_keys && json_is_number(s); k++) {
            json_t *v = json_object_get(o, keys[k]);
            if (json_is_number(v)) curve_add(&curves[k], json_number_value(s), json_number_value(v));
        }
        json_decref(o);
    }
    free(data);
}

AxisTicks report_axis_ticks(double lo, double hi, int max_ticks, bool integer, bool widen) {
    COLT_ASSERT(isfinite(lo) && isfinite(hi) && lo < hi && max_ticks >= 2);
    static const double mantissa[3] = {1, 2, 5};
    /* start where the count is about 10 x max_ticks and climb 1, 2, 5, 10, 20, ... */
    int e = (int)floor(log10((hi - lo) / (10.0 * max_ticks)));
    if (integer && e < 0) e = 0;
    for (;; e++) {
        for (int m = 0; m < 3; m++) {
            double step = mantissa[m] * pow(10, e);
            /* 1e-9: a bound that is a multiple of step up to rounding counts as one */
            double k0 = widen ? floor(lo / step + 1e-9) : ceil(lo / step - 1e-9);
            double k1 = widen ? ceil(hi / step - 1e-9) : floor(hi / step + 1e-9);
            if (k1 - k0 + 1 > max_ticks) continue;
            AxisTicks t = {.step = step, .first = k0 * step, .count = (int)(k1 - k0) + 1, .decimals = e < 0 ? -e : 0};
            if (t.count < 1) t.first = lo, t.count = 1;
            return t;
        }
    }
}

/* Prints a tick value with the axis' decimals, never as "-0". */
static void tick_label(char *buf, size_t cap, double v, const AxisTicks *t) {
    if (fabs(v) < 1e-9 * t->step) v = 0;
    snprintf(buf, cap, "%.*f", t->decimals, v);
}

static int write_svg(const char *path, const Curve *train, const Curve *eval, double before, double after,
                     double last_step, char *err) {
    const double W = 720, H = 420, L = 70, R = 20, T = 40, B = 50;
    double xmax = last_step > 0 ? last_step : 1, ymin = INFINITY, ymax = -INFINITY;
    for (int i = 0; i < train->n; i++) ymin = fmin(ymin, train->y[i]), ymax = fmax(ymax, train->y[i]);
    for (int i = 0; i < eval->n; i++) {
        ymin = fmin(ymin, eval->y[i]), ymax = fmax(ymax, eval->y[i]);
        xmax = fmax(xmax, eval->x[i]);
    }
    if (train->n > 0) xmax = fmax(xmax, train->x[train->n - 1]);
    if (!isnan(before)) ymin = fmin(ymin, before), ymax = fmax(ymax, before);
    if (!isnan(after)) ymin = fmin(ymin, after), ymax = fmax(ymax, after);
    if (!isfinite(ymin) || !isfinite(ymax)) ymin = 0, ymax = 1;
    if (ymax - ymin < 1e-9) ymin -= 0.5, ymax += 0.5;
    const double xmin = 0;
    AxisTicks xt = report_axis_ticks(xmin, xmax, 8, true, false);
    AxisTicks yt = report_axis_ticks(ymin, ymax, 6, false, true);
    ymin = yt.first, ymax = yt.first + (yt.count - 1) * yt.step;
#define PX(v) (L + ((v) - xmin) / (xmax - xmin) * (W - L - R))
#define PY(v) (H - B - ((v) - ymin) / (ymax - ymin) * (H - T - B))
    AtomicFile af;
    if (atomic_open(&af, path, err) != 0) return COLT_ERR;
    FILE *f = af.fp;
    char label[64];
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\" "
               "font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n", W, H);
    fprintf(f, "<text x=\"%.0f\" y=\"22\" font-size=\"15\">colt GRPO: training reward per logged step</text>\n", L);
    for (int k = 0; k < yt.count; k++) {
        double v = yt.first + k * yt.step;
        tick_label(label, sizeof label, v, &yt);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", L, PY(v), W - R, PY(v));
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n", L - 6, PY(v) + 4, label);
    }
    for (int k = 0; k < xt.count; k++) {
        double v = xt.first + k * xt.step;
        tick_label(label, sizeof label, v, &xt);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n", PX(v), H - B, PX(v),
                H - B + 4);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n", PX(v), H - B + 18, label);
    }
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n", L, H - B, W - R, H - B);
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n", L, T, L, H - B);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">optimizer step</text>\n", (L + W - R) / 2, H - 10);
    fprintf(f, "<text x=\"16\" y=\"%.1f\" transform=\"rotate(-90 16 %.1f)\" text-anchor=\"middle\">reward</text>\n",
            (T + H - B) / 2, (T + H - B) / 2);
    if (train->n > 0) {
        fprintf(f, "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"2\" points=\"");
        for (int i = 0; i < train->n; i++) fprintf(f, "%.1f,%.1f ", PX(train->x[i]), PY(train->y[i]));
        fprintf(f, "\"/>\n");
    }
    for (int i = 0; i < eval->n; i++) /* evals during training (eval_steps) */
        fprintf(f, "<rect class=\"eval\" x=\"%.1f\" y=\"%.1f\" width=\"8\" height=\"8\" fill=\"#ff7f0e\"/>\n",
                PX(eval->x[i]) - 4, PY(eval->y[i]) - 4);
    if (eval->n > 0)
        fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"8\" height=\"8\" fill=\"#ff7f0e\"/>\n"
                   "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\" fill=\"#ff7f0e\">eval reward</text>\n",
                W - R - 8, T - 14, W - R - 12, T - 6);
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

/* ---------------------------------------------------------------- training_curves.svg */

/* One small multiple: a frame at (x0, y0) of w x h with its title, round y
 * ticks over the curve's range, whole-step x ticks over [0, xmax], the curve
 * (a dot when it has one point), or "not logged". */
static void draw_panel(FILE *f, double x0, double y0, double w, double h, const char *title, const Curve *c,
                       double xmax) {
    const double L = 62, R = 14, T = 26, B = 34;
    char label[64];
    fprintf(f, "<g class=\"panel\">\n<text x=\"%.1f\" y=\"%.1f\" font-size=\"13\">%s</text>\n", x0 + L, y0 + 16, title);
    if (c->n == 0) {
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" fill=\"#888\">not logged</text>\n</g>\n",
                x0 + w / 2, y0 + h / 2);
        return;
    }
    double ymin = INFINITY, ymax = -INFINITY;
    for (int i = 0; i < c->n; i++) ymin = fmin(ymin, c->y[i]), ymax = fmax(ymax, c->y[i]);
    if (ymax - ymin < 1e-12 * fmax(1.0, fabs(ymax))) {
        double pad = fabs(ymax) > 0 ? fabs(ymax) * 0.1 : 0.5;
        ymin -= pad, ymax += pad;
    }
    AxisTicks xt = report_axis_ticks(0, xmax, 6, true, false), yt = report_axis_ticks(ymin, ymax, 5, false, true);
    ymin = yt.first, ymax = yt.first + (yt.count - 1) * yt.step;
    const double left = x0 + L, right = x0 + w - R, top = y0 + T, bottom = y0 + h - B;
#define PX(v) (left + (v) / xmax * (right - left))
#define PY(v) (bottom - ((v) - ymin) / (ymax - ymin) * (bottom - top))
    for (int k = 0; k < yt.count; k++) {
        double v = yt.first + k * yt.step;
        tick_label(label, sizeof label, v, &yt);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", left, PY(v), right, PY(v));
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n", left - 5, PY(v) + 4, label);
    }
    for (int k = 0; k < xt.count; k++) {
        double v = xt.first + k * xt.step;
        tick_label(label, sizeof label, v, &xt);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n", PX(v), bottom, PX(v),
                bottom + 4);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n", PX(v), bottom + 17, label);
    }
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n", left, bottom, right, bottom);
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n", left, top, left, bottom);
    if (c->n == 1) {
        fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"#1f77b4\"/>\n", PX(c->x[0]), PY(c->y[0]));
    } else {
        fprintf(f, "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1.5\" points=\"");
        for (int i = 0; i < c->n; i++) fprintf(f, "%.1f,%.1f ", PX(c->x[i]), PY(c->y[i]));
        fprintf(f, "\"/>\n");
    }
    fprintf(f, "</g>\n");
#undef PX
#undef PY
}

/* Loss, KL (when logged: beta > 0), entropy and mean completion length per
 * logged step, two panels a row. */
static int write_training_curves(const char *path, const char *metrics, double last_step, char *err) {
    static const char *const keys[] = {"loss", "kl", "entropy", "completions/mean_length"};
    static const char *const titles[] = {"loss", "KL to the reference model", "entropy (nats per token)",
                                         "mean completion length (tokens)"};
    Curve curves[4] = {{0}};
    read_curves(metrics, keys, curves, 4);
    double xmax = last_step > 0 ? last_step : 1;
    for (int k = 0; k < 4; k++)
        if (curves[k].n > 0) xmax = fmax(xmax, curves[k].x[curves[k].n - 1]);
    int shown[4], n_panels = 0;
    for (int k = 0; k < 4; k++)
        if (k != 1 || curves[k].n > 0) shown[n_panels++] = k; /* no KL panel without a KL term */
    const double PW = 380, PH = 250, TOP = 36;
    const int rows = (n_panels + 1) / 2;
    AtomicFile af;
    int rc = atomic_open(&af, path, err);
    if (rc == 0) {
        FILE *f = af.fp;
        fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\" "
                   "font-size=\"11\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
                2 * PW, TOP + rows * PH + 20);
        fprintf(f, "<text x=\"16\" y=\"24\" font-size=\"15\">colt GRPO: training curves per logged step</text>\n");
        for (int p = 0; p < n_panels; p++)
            draw_panel(f, (p % 2) * PW, TOP + (p / 2) * PH, PW, PH, titles[shown[p]], &curves[shown[p]], xmax);
        fprintf(f, "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\">optimizer step</text>\n", PW,
                TOP + rows * PH + 12);
        fprintf(f, "</svg>\n");
        rc = atomic_commit(&af, err);
    }
    for (int k = 0; k < 4; k++) curve_free(&curves[k]);
    return rc;
}

int report_write(const char *output_dir, const ReportSummary *s, json_t *config, char *err) {
    char *metrics = path_join(output_dir, "metrics.jsonl"), *summary = path_join(output_dir, "summary.json");
    char *svg = path_join(output_dir, "reward_curve.svg"), *curves_svg = path_join(output_dir, "training_curves.svg");
    static const char *const keys[] = {"reward", "eval_reward"};
    Curve both[2] = {{0}}, train, eval;
    read_curves(metrics, keys, both, 2);
    train = both[0], eval = both[1];
    const int n = train.n;
    json_t *o = json_object();
    json_object_set_new(o, "eval_reward_before", num_or_null(s->eval_reward_before));
    json_object_set_new(o, "eval_reward_after", num_or_null(s->eval_reward_after));
    json_object_set_new(o, "eval_reward_gain", num_or_null(s->eval_reward_after - s->eval_reward_before));
    json_object_set_new(o, "steps", json_integer(s->steps));
    json_object_set_new(o, "seconds", json_real(s->seconds));
    json_object_set_new(o, "train_reward_first", n ? json_real(train.y[0]) : json_null());
    json_object_set_new(o, "train_reward_last", n ? json_real(train.y[n - 1]) : json_null());
    json_object_set_new(o, "config", config);
    char *text = json_dumps(o, JSON_INDENT(2) | JSON_REAL_PRECISION(8));
    int rc = file_write_atomic(summary, text, strlen(text), err);
    free(text);
    json_decref(o);
    if (rc == 0)
        rc = write_svg(svg, &train, &eval, s->eval_reward_before, s->eval_reward_after, (double)s->steps, err);
    if (rc == 0) rc = write_training_curves(curves_svg, metrics, (double)s->steps, err);
    curve_free(&train), curve_free(&eval);
    free(metrics), free(summary), free(svg), free(curves_svg);
    return rc;
}
