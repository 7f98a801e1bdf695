/* test_report.c — the end-of-run report (src/train/report.c): the tick choices
 * of reward_curve.svg's axes (whole optimizer steps for any step count, y ticks
 * on 1/2/5 x 10^k), and report_write end to end on hand-written metrics.jsonl
 * files: the SVG's axis labels, the eval points drawn only when the metrics
 * carry eval rewards, and summary.json's values; training_curves.svg's panels
 * (loss, KL only when logged, entropy, mean completion length), their titles,
 * ticks and points. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "core/fileio.h"
#include "train/report.h"
#include "harness.h"


/* The ticks as text, "0 0.2 0.4" (each printed with the axis' decimals). */
static void ticks_text(char *buf, size_t cap, AxisTicks t) {
    size_t n = 0;
    buf[0] = '\0';
    for (int k = 0; k < t.count && n < cap; k++) {
        double v = t.first + k * t.step;
        if (fabs(v) < 1e-9 * t.step) v = 0;
        n += (size_t)snprintf(buf + n, cap - n, "%s%.*f", k ? " " : "", t.decimals, v);
    }
}

static void expect_ticks(double lo, double hi, int max_ticks, bool integer, bool widen, const char *want) {
    char got[512];
    AxisTicks t = report_axis_ticks(lo, hi, max_ticks, integer, widen);
    ticks_text(got, sizeof got, t);
    CHECK(strcmp(got, want) == 0, "ticks of [%g, %g] (at most %d%s%s): got \"%s\", want \"%s\"", lo, hi, max_ticks,
          integer ? ", integer" : "", widen ? ", widened" : "", got, want);
    CHECK(t.count <= max_ticks, "[%g, %g]: %d ticks, at most %d", lo, hi, t.count, max_ticks);
    double m = t.step / pow(10, floor(log10(t.step) + 1e-9));
    CHECK(fabs(m - 1) < 1e-9 || fabs(m - 2) < 1e-9 || fabs(m - 5) < 1e-9, "[%g, %g]: step %g is not 1/2/5 x 10^k",
          lo, hi, t.step);
    printf("  [%g, %g] max %d%s%s -> step %g: %s\n", lo, hi, max_ticks, integer ? " integer" : "",
           widen ? " widened" : "", t.step, got);
}

static void test_ticks(void) {
    printf("x axis: optimizer steps 0..N, whole numbers, at most 8 ticks\n");
    expect_ticks(0, 1, 8, true, false, "0 1");
    expect_ticks(0, 2, 8, true, false, "0 1 2"); /* was labelled "0 0 1 2 2" */
    expect_ticks(0, 3, 8, true, false, "0 1 2 3");
    expect_ticks(0, 7, 8, true, false, "0 1 2 3 4 5 6 7");
    expect_ticks(0, 8, 8, true, false, "0 2 4 6 8");
    expect_ticks(0, 12, 8, true, false, "0 2 4 6 8 10 12");
    expect_ticks(0, 60, 8, true, false, "0 10 20 30 40 50 60");
    expect_ticks(0, 100, 8, true, false, "0 20 40 60 80 100");
    expect_ticks(0, 1000000, 8, true, false, "0 200000 400000 600000 800000 1000000");
    /* every count from 1 to 500: whole, increasing, starting at 0, none past N */
    int bad = 0;
    for (int n = 1; n <= 500; n++) {
        AxisTicks t = report_axis_ticks(0, n, 8, true, false);
        double last = t.first + (t.count - 1) * t.step;
        if (t.first != 0 || t.step < 1 || t.step != floor(t.step) || t.count < 2 || t.count > 8 || last > n ||
            last + t.step <= n)
            bad++;
    }
    CHECK(bad == 0, "step counts 1..500: %d with wrong x ticks", bad);
    printf("  step counts 1..500: ticks start at 0, whole, 2-8 of them, the last within one step of N (%d wrong)\n",
           bad);

    printf("y axis: rewards, widened to round ends, at most 6 ticks\n");
    expect_ticks(0.0547, 0.9625, 6, false, true, "0.0 0.2 0.4 0.6 0.8 1.0");
    expect_ticks(0, 1, 6, false, true, "0.0 0.2 0.4 0.6 0.8 1.0");
    expect_ticks(-0.5, 0.5, 6, false, true, "-0.5 0.0 0.5");
    expect_ticks(0.12, 0.13, 6, false, true, "0.120 0.122 0.124 0.126 0.128 0.130");
    expect_ticks(0.1187, 0.9625, 6, false, true, "0.0 0.2 0.4 0.6 0.8 1.0");
    expect_ticks(-212.5, -151.25, 6, false, true, "-220 -200 -180 -160 -140");
    expect_ticks(1e-5, 3e-5, 6, false, true, "0.000010 0.000015 0.000020 0.000025 0.000030");
    expect_ticks(0.3, 0.7, 6, false, false, "0.3 0.4 0.5 0.6 0.7");
    expect_ticks(0.31, 0.69, 2, false, false, "0.4 0.6");
    expect_ticks(0.31, 0.69, 3, false, false, "0.4 0.5 0.6");
}

/* path's contents, or NULL after a failed check naming why. */
static char *read_checked(const char *path) {
    char *data = NULL, err[ERR_LEN];
    size_t len;
    if (file_read_all(path, &data, &len, err) != 0) {
        CHECK(0, "%s", err);
        return NULL;
    }
    return data;
}

/* The labels of the x axis: the text elements right under it (y = 388). */
static void x_labels(char *out, size_t cap, const char *svg) {
    size_t n = 0;
    out[0] = '\0';
    for (const char *p = svg; (p = strstr(p, "y=\"388.0\" text-anchor=\"middle\">")) != NULL;) {
        p += strlen("y=\"388.0\" text-anchor=\"middle\">");
        const char *e = strchr(p, '<');
        n += (size_t)snprintf(out + n, cap > n ? cap - n : 0, "%s%.*s", n ? " " : "", (int)(e - p), p);
    }
}

static int count(const char *s, const char *what) {
    int k = 0;
    for (const char *p = s; (p = strstr(p, what)) != NULL; p += strlen(what)) k++;
    return k;
}

static void run_report(const char *dir, const char *metrics, double before, double after, int64_t steps, char **svg,
                       json_t **summary) {
    char path[600], err[ERR_LEN];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    CHECK(file_write_atomic(path, metrics, strlen(metrics), err) == 0, "%s", err);
    ReportSummary s = {.eval_reward_before = before, .eval_reward_after = after, .steps = steps, .seconds = 1.5};
    json_t *config = json_pack("{s:i}", "max_steps", (int)steps);
    CHECK(report_write(dir, &s, config, err) == 0, "report_write: %s", err);
    snprintf(path, sizeof path, "%s/reward_curve.svg", dir);
    *svg = read_checked(path);
    snprintf(path, sizeof path, "%s/summary.json", dir);
    *summary = json_load_file(path, 0, NULL);
}

static void test_report_write(void) {
    char dir[] = "/tmp/colt_test_report_XXXXXX";
    COLT_ASSERT(mkdtemp(dir));
    char *svg = NULL, labels[512];
    json_t *sum = NULL;

    /* a 2-step run logged every step, eval before and after */
    run_report(dir, "{\"step\": 1, \"reward\": 0.25}\n{\"step\": 2, \"reward\": 0.75}\n", 0.125, 0.5, 2, &svg, &sum);
    if (svg) {
        x_labels(labels, sizeof labels, svg);
        CHECK(strcmp(labels, "0 1 2") == 0, "2 steps: x labels \"%s\", want \"0 1 2\"", labels);
        printf("2-step run: x labels \"%s\"\n", labels);
        /* rewards 0.125 .. 0.75: y ticks 0.0 .. 0.8 by 0.2 */
        for (int k = 0; k <= 4; k++) {
            char want[64];
            snprintf(want, sizeof want, "text-anchor=\"end\">%.1f</text>", 0.2 * k);
            CHECK(strstr(svg, want) != NULL, "2 steps: y label %.1f missing", 0.2 * k);
        }
        CHECK(count(svg, "text-anchor=\"end\">") == 5 + 1, "2 steps: %d y labels (+ 'eval after'), want 5 + 1",
              count(svg, "text-anchor=\"end\">"));
        CHECK(count(svg, "class=\"eval\"") == 0 && !strstr(svg, "eval reward"),
              "no eval_reward in the metrics: no eval points");
        CHECK(strstr(svg, "eval before 0.125") && strstr(svg, "eval after 0.500"), "before/after labels");
        /* step 1 at x 70 + 630 / 2, reward 0.25 at y 370 - 0.25 / 0.8 * 330; step 2 at the right end */
        CHECK(strstr(svg, "points=\"385.0,266.9 700.0,60.6 \"") != NULL, "training curve points");
    }
    if (sum) {
        CHECK(json_number_value(json_object_get(sum, "train_reward_first")) == 0.25 &&
                  json_number_value(json_object_get(sum, "train_reward_last")) == 0.75 &&
                  json_integer_value(json_object_get(sum, "steps")) == 2 &&
                  json_number_value(json_object_get(sum, "eval_reward_gain")) == 0.375,
              "summary.json values");
    } else CHECK(0, "summary.json unreadable");
    free(svg), json_decref(sum);

    /* a 7-step run with evals at steps 3 and 6 in the metrics (eval-only lines and a line with both) */
    run_report(dir,
               "{\"step\": 1, \"reward\": 0.1}\n{\"step\": 2, \"reward\": 0.2}\n{\"step\": 3, \"reward\": 0.3}\n"
               "{\"step\": 3, \"eval_reward\": 0.35}\n{\"step\": 4, \"reward\": 0.4}\n{\"step\": 5, \"reward\": 0.5}\n"
               "{\"step\": 6, \"reward\": 0.6, \"eval_reward\": 0.65}\n{\"step\": 7, \"reward\": 0.7}\n",
               0.05, 0.75, 7, &svg, &sum);
    if (svg) {
        x_labels(labels, sizeof labels, svg);
        CHECK(strcmp(labels, "0 1 2 3 4 5 6 7") == 0, "7 steps: x labels \"%s\"", labels);
        CHECK(count(svg, "class=\"eval\"") == 2 && strstr(svg, "eval reward"), "7 steps: %d eval points, want 2",
              count(svg, "class=\"eval\""));
        /* x = 70 + 3/7 * 630 = 340; the square is drawn 4 px left of its point */
        CHECK(strstr(svg, "class=\"eval\" x=\"336.0\"") != NULL, "eval at step 3 drawn at x 340");
        printf("7-step run with 2 evals: x labels \"%s\", %d eval points\n", labels, count(svg, "class=\"eval\""));
    }
    free(svg), json_decref(sum);

    /* no metrics at all (0 steps), no eval set */
    run_report(dir, "", NAN, NAN, 0, &svg, &sum);
    if (svg) {
        x_labels(labels, sizeof labels, svg);
        CHECK(strcmp(labels, "0 1") == 0, "0 steps: x labels \"%s\", want \"0 1\"", labels);
        CHECK(!strstr(svg, "eval before") && !strstr(svg, "<polyline"), "0 steps: nothing drawn");
    }
    if (sum) CHECK(json_is_null(json_object_get(sum, "eval_reward_before")), "no eval set: null");
    free(svg), json_decref(sum);

    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) printf("warning: could not remove %s\n", dir);
}

/* The text of the panel titled `title` (up to the next panel), or NULL. */
static char *panel_of(const char *svg, const char *title) {
    char needle[160];
    snprintf(needle, sizeof needle, "font-size=\"13\">%s</text>", title);
    const char *start = strstr(svg, needle);
    if (!start) return NULL;
    const char *end = strstr(start, "</g>");
    return strndup(start, end ? (size_t)(end - start) : strlen(start));
}

static void test_training_curves(void) {
    char dir[] = "/tmp/colt_test_curves_XXXXXX";
    COLT_ASSERT(mkdtemp(dir));
    char *svg = NULL, path[600];
    json_t *sum = NULL;
    /* 4 logged steps with a KL term, an eval-only line between them */
    run_report(dir,
               "{\"step\": 1, \"reward\": 0.1, \"loss\": 0.01, \"kl\": 0.0, \"entropy\": 2.5, "
               "\"completions/mean_length\": 48}\n"
               "{\"step\": 2, \"reward\": 0.2, \"loss\": 0.03, \"kl\": 0.002, \"entropy\": 2.25, "
               "\"completions/mean_length\": 40}\n"
               "{\"step\": 2, \"eval_reward\": 0.5}\n"
               "{\"step\": 3, \"reward\": 0.3, \"loss\": -0.02, \"kl\": 0.004, \"entropy\": 2.0, "
               "\"completions/mean_length\": 32}\n"
               "{\"step\": 4, \"reward\": 0.4, \"loss\": 0.05, \"kl\": 0.008, \"entropy\": 1.75, "
               "\"completions/mean_length\": 24}\n",
               NAN, NAN, 4, &svg, &sum);
    free(svg), json_decref(sum);
    snprintf(path, sizeof path, "%s/training_curves.svg", dir);
    svg = read_checked(path);
    const char *titles[] = {"loss", "KL to the reference model", "entropy (nats per token)",
                            "mean completion length (tokens)"};
    if (svg) {
        CHECK(count(svg, "<g class=\"panel\">") == 4 && count(svg, "<polyline") == 4, "4 panels, 4 curves: %d, %d",
              count(svg, "<g class=\"panel\">"), count(svg, "<polyline"));
        CHECK(strstr(svg, "height=\"556\"") != NULL, "2 rows of panels: 36 + 2 x 250 + 20 high");
        for (int i = 0; i < 4; i++) {
            char *panel = panel_of(svg, titles[i]);
            CHECK(panel && count(panel, "<polyline") == 1, "panel '%s'", titles[i]);
            /* 4 points each, x ticks 0..4, the first at step 1: x = 62 + 1/4 x (380 - 76) */
            const char *points = panel ? strstr(panel, "points=\"") : NULL;
            int n_points = 0;
            for (const char *p = points; p && *p && *p != '/'; p++) n_points += *p == ',';
            CHECK(n_points == 4, "panel '%s': %d points, want 4", titles[i], n_points);
            CHECK(panel && count(panel, "text-anchor=\"middle\">") == 5, "panel '%s': x labels 0..4", titles[i]);
            free(panel);
        }
        /* at most 5 y ticks: entropy 1.75 .. 2.5 -> 1.5 2.0 2.5; mean length 24 .. 48 -> 20 30 40 50 */
        char *entropy = panel_of(svg, titles[2]), *length = panel_of(svg, titles[3]);
        CHECK(entropy && strstr(entropy, ">1.5</text>") && strstr(entropy, ">2.5</text>") &&
                  count(entropy, "text-anchor=\"end\">") == 3,
              "entropy y ticks 1.5 .. 2.5");
        CHECK(length && strstr(length, ">20</text>") && strstr(length, ">50</text>") &&
                  count(length, "text-anchor=\"end\">") == 4,
              "length y ticks 20 .. 50");
        /* loss panel: step 1 (x 138.0), loss 0.01 on -0.02 .. 0.06 (y 36 + 250 - 34 - 0.375 x 190 = 180.8) */
        char *loss = panel_of(svg, titles[0]);
        CHECK(loss && strstr(loss, "points=\"138.0,180.8 "), "loss: first point at (138.0, 180.8): %s",
              loss ? strstr(loss, "points=") : "(no panel)");
        printf("training_curves.svg with beta > 0: 4 panels (loss, KL, entropy, mean length), 4 points each, "
               "ticks entropy 1.5..2.5, length 20..50\n");
        free(entropy), free(length), free(loss);
    }
    free(svg);

    /* beta 0 (no kl key), one logged step: 3 panels, one row and a half, a dot each */
    run_report(dir, "{\"step\": 1, \"reward\": 0.5, \"loss\": 0.0, \"entropy\": 3.0, \"completions/mean_length\": 8}\n",
               NAN, NAN, 1, &svg, &sum);
    free(svg), json_decref(sum);
    svg = read_checked(path);
    if (svg) {
        CHECK(count(svg, "<g class=\"panel\">") == 3 && !strstr(svg, titles[1]) && count(svg, "<circle") == 3 &&
                  count(svg, "<polyline") == 0,
              "beta 0, 1 step: %d panels, %d dots", count(svg, "<g class=\"panel\">"), count(svg, "<circle"));
        printf("training_curves.svg with beta 0 and 1 step: 3 panels, no KL, a dot each\n");
    }
    free(svg);

    /* no metrics: panels say so */
    run_report(dir, "", NAN, NAN, 0, &svg, &sum);
    free(svg), json_decref(sum);
    svg = read_checked(path);
    if (svg) CHECK(count(svg, "not logged") == 3 && !strstr(svg, "<polyline"), "no metrics: 3 'not logged' panels");
    free(svg);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) printf("warning: could not remove %s\n", dir);
}

int main(void) {
    test_ticks();
    test_report_write();
    test_training_curves();
    printf("%s: %d checks, %d failed\n", g_failures ? "FAIL" : "OK", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
