/* test_eval.c — `colt eval` (src/train/math_eval.c, src/cli/cmd_eval.c):
 * the pass@k estimator against hand-computed values and against the binomial
 * formula in log-gamma form; the score of known per-problem counts (overall,
 * per subject and per level, skipped problems) and its JSON; end to end through
 * the built binary on 20 GSM8K and 20 MATH-500 rows of ../shared/data with the
 * shipped stories260K (it scores ~0, so the checks are on the pipeline: counts
 * against the completions file, breakdown against the rows, the same numbers
 * twice and for a shorter --limit); the chat-template path against the
 * template's text; bad input as one-line errors that write no summary. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/fileio.h"
#include "harness.h"
#include "shared_data.h"
#include "train/math_eval.h"

#define STORIES COLT_SOURCE_DIR "/models/stories260K"

/* ---------------------------------------------------------------- pass@k */

/* 1 - C(n-c, k) / C(n, k) through log-gamma: an independent form of the estimator. */
static double pass_at_k_lgamma(int n, int c, int k) {
    if (n - c < k) return 1.0;
    double log_ratio = lgamma(n - c + 1.0) - lgamma(n - c - k + 1.0) - lgamma(n + 1.0) + lgamma(n - k + 1.0);
    return 1.0 - exp(log_ratio);
}

static void test_pass_at_k(void) {
    /* by hand: 1 - C(n-c,k)/C(n,k) */
    struct { int n, c, k; double want; const char *how; } cases[] = {
        {1, 0, 1, 0.0, "no correct sample"},
        {1, 1, 1, 1.0, "the one sample right"},
        {2, 1, 1, 0.5, "1 - C(1,1)/C(2,1) = 1 - 1/2"},
        {2, 1, 2, 1.0, "k = n with one right"},
        {4, 1, 2, 0.5, "1 - C(3,2)/C(4,2) = 1 - 3/6"},
        {4, 2, 2, 5.0 / 6.0, "1 - C(2,2)/C(4,2) = 1 - 1/6"},
        {5, 2, 3, 0.9, "1 - C(3,3)/C(5,3) = 1 - 1/10"},
        {10, 3, 5, 1.0 - 21.0 / 252.0, "1 - C(7,5)/C(10,5) = 1 - 21/252"},
        {8, 0, 8, 0.0, "none right, k = n"},
        {8, 7, 1, 7.0 / 8.0, "pass@1 = c/n"},
        {200, 1, 1, 0.005, "pass@1 = 1/200"},
        {16, 4, 4, 1.0 - 495.0 / 1820.0, "1 - C(12,4)/C(16,4) = 1 - 495/1820"},
    };
    double worst = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        double got = math_eval_pass_at_k(cases[i].n, cases[i].c, cases[i].k);
        double diff = fabs(got - cases[i].want);
        if (diff > worst) worst = diff;
        CHECK(diff < 1e-12, "pass@%d with %d of %d right: %.15f, want %.15f (%s)", cases[i].k, cases[i].c, cases[i].n,
              got, cases[i].want, cases[i].how);
        printf("  pass@%-3d n %-3d c %-3d = %.10f  (%s)\n", cases[i].k, cases[i].n, cases[i].c, got, cases[i].how);
    }
    /* every (n, c, k) up to n = 64, and some large n, against the log-gamma form */
    double worst_lgamma = 0;
    int compared = 0;
    for (int n = 1; n <= 64; n++)
        for (int c = 0; c <= n; c++)
            for (int k = 1; k <= n; k++) {
                double d = fabs(math_eval_pass_at_k(n, c, k) - pass_at_k_lgamma(n, c, k));
                if (d > worst_lgamma) worst_lgamma = d;
                compared++;
            }
    int big[][3] = {{1000, 10, 100}, {1000, 1, 500}, {5000, 3, 64}, {256, 255, 1}};
    for (int i = 0; i < 4; i++) {
        double d = fabs(math_eval_pass_at_k(big[i][0], big[i][1], big[i][2]) -
                        pass_at_k_lgamma(big[i][0], big[i][1], big[i][2]));
        if (d > worst_lgamma) worst_lgamma = d;
        compared++;
    }
    CHECK(worst_lgamma < 1e-9, "pass@k against the log-gamma form: worst difference %g", worst_lgamma);
    printf("pass@k: %zu hand-computed values (worst |diff| %.1e); %d (n, c, k) against the log-gamma form (worst %.1e)\n",
           sizeof cases / sizeof cases[0], worst, compared, worst_lgamma);
}

/* ---------------------------------------------------------------- scores */

static const MathEvalGroup *find_group(const MathEvalGroup *g, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (strcmp(g[i].name, name) == 0) return &g[i];
    return NULL;
}

static void expect_group(const MathEvalGroup *g, const char *what, int problems, double p1, double pk) {
    CHECK(g != NULL, "%s: no such group", what);
    if (!g) return;
    CHECK(g->problems == problems && fabs(g->pass_at_1 - p1) < 1e-12 && fabs(g->pass_at_k - pk) < 1e-12,
          "%s: %d problems pass@1 %.12f pass@k %.12f, want %d %.12f %.12f", what, g->problems, g->pass_at_1,
          g->pass_at_k, problems, p1, pk);
    printf("  %-18s problems %d  pass@1 %.6f  pass@2 %.6f\n", what, g->problems, g->pass_at_1, g->pass_at_k);
}

/* Five problems, n = 4, k = 2; problem 3 has no reference answer, problem 4 no subject. */
static void test_score(void) {
    int correct[] = {4, 0, 2, -1, 1};
    const char *subjects[] = {"Algebra", "Geometry", "Algebra", "Algebra", NULL};
    const char *levels[] = {"1", "10", "2", "1", "2"};
    MathEvalScore s;
    math_eval_score(&s, correct, subjects, levels, 5, 4, 2);
    /* pass@1: 4/4, 0/4, 2/4, 1/4; pass@2: 1, 0, 1 - 1/6, 1 - 3/6 */
    printf("score of known counts (n 4, k 2: correct 4, 0, 2, none, 1):\n");
    CHECK(s.problems == 5 && s.skipped == 1 && s.n == 4 && s.k == 2, "problems %d skipped %d", s.problems, s.skipped);
    expect_group(&s.all, "all", 4, (1 + 0 + 0.5 + 0.25) / 4, (1 + 0 + 5.0 / 6 + 0.5) / 4);
    CHECK(s.n_subjects == 2 && strcmp(s.subjects[0].name, "Algebra") == 0, "subjects %d, sorted", s.n_subjects);
    expect_group(find_group(s.subjects, s.n_subjects, "Algebra"), "subject Algebra", 2, 0.75, (1 + 5.0 / 6) / 2);
    expect_group(find_group(s.subjects, s.n_subjects, "Geometry"), "subject Geometry", 1, 0, 0);
    CHECK(s.n_levels == 3 && strcmp(s.levels[0].name, "1") == 0 && strcmp(s.levels[1].name, "2") == 0 &&
              strcmp(s.levels[2].name, "10") == 0,
          "levels in numeric order: %s %s %s", s.n_levels > 0 ? s.levels[0].name : "-",
          s.n_levels > 1 ? s.levels[1].name : "-", s.n_levels > 2 ? s.levels[2].name : "-");
    expect_group(find_group(s.levels, s.n_levels, "1"), "level 1", 1, 1, 1);
    expect_group(find_group(s.levels, s.n_levels, "2"), "level 2", 2, 0.375, (5.0 / 6 + 0.5) / 2);
    expect_group(find_group(s.levels, s.n_levels, "10"), "level 10", 1, 0, 0);

    json_t *j = math_eval_score_json(&s);
    json_t *alg = json_object_get(json_object_get(j, "by_subject"), "Algebra");
    CHECK(json_integer_value(json_object_get(j, "problems")) == 5 &&
              json_integer_value(json_object_get(j, "skipped")) == 1 &&
              json_integer_value(json_object_get(j, "samples_per_problem")) == 4 &&
              fabs(json_real_value(json_object_get(j, "pass@1")) - 0.4375) < 1e-12 &&
              fabs(json_real_value(json_object_get(j, "pass@2")) - (1 + 5.0 / 6 + 0.5) / 4) < 1e-12 &&
              json_integer_value(json_object_get(alg, "problems")) == 2 &&
              fabs(json_real_value(json_object_get(alg, "pass@1")) - 0.75) < 1e-12 &&
              json_object_size(json_object_get(j, "by_level")) == 3,
          "score JSON");
    char *text = json_dumps(j, JSON_COMPACT);
    printf("  JSON: %.200s...\n", text);
    free(text);
    json_decref(j);
    math_eval_score_free(&s);

    /* k = 1 and no groups: no pass@k key, no breakdown */
    int one[] = {1, 0};
    math_eval_score(&s, one, NULL, NULL, 2, 1, 1);
    j = math_eval_score_json(&s);
    CHECK(fabs(s.all.pass_at_1 - 0.5) < 1e-12 && json_object_size(j) == 5 && !json_object_get(j, "by_subject"),
          "n 1: pass@1 %g, %zu keys", s.all.pass_at_1, json_object_size(j));
    json_decref(j);
    math_eval_score_free(&s);
}

/* ---------------------------------------------------------------- end to end */

static int run(const char *args, char **out, char **errout) {
    return run_colt_with(&(ColtRun){.out = out}, args, errout);
}

/* The first n lines of src into dst. */
static void head_lines(const char *src, const char *dst, int n) {
    FILE *in = fopen(src, "r"), *out = fopen(dst, "w");
    char *line = NULL;
    size_t cap = 0;
    for (int i = 0; i < n && getline(&line, &cap, in) > 0; i++) fputs(line, out);
    free(line);
    fclose(in);
    fclose(out);
}

static json_t **read_jsonl(const char *path, int *n) {
    FILE *fp = fopen(path, "r");
    json_t **rows = NULL;
    *n = 0;
    char *line = NULL;
    size_t cap = 0;
    while (fp && getline(&line, &cap, fp) > 0) {
        rows = realloc(rows, sizeof(json_t *) * (size_t)(*n + 1));
        rows[(*n)++] = json_loads(line, 0, NULL);
    }
    free(line);
    if (fp) fclose(fp);
    return rows;
}

static void free_rows(json_t **rows, int n) {
    for (int i = 0; i < n; i++) json_decref(rows[i]);
    free(rows);
}

/* Runs eval on the first 20 rows of a benchmark file (n 2, k 2) and checks
 * the summary against the completions file and the rows. */
static void test_benchmark(const char *name, const char *file, bool breakdown) {
    char src[512], rows_path[512], args[4096], summary_path[512], comp_path[512];
    snprintf(src, sizeof src, "%s/%s", COLT_SHARED_DATA, file);
    snprintf(rows_path, sizeof rows_path, "%s/%s20.jsonl", g_tmp, name);
    snprintf(summary_path, sizeof summary_path, "%s/%s.json", g_tmp, name);
    snprintf(comp_path, sizeof comp_path, "%s/%s_completions.jsonl", g_tmp, name);
    head_lines(src, rows_path, 20);
    snprintf(args, sizeof args,
             "eval --model %s --dataset %s --n 2 --k 2 --max_completion_length 16 --max_prompt_length 256 "
             "--device cpu --seed 7 --output %s --completions %s",
             STORIES, rows_path, summary_path, comp_path);
    char *out, *err;
    int code = run(args, &out, &err);
    CHECK(code == 0, "%s: colt eval exit %d: %s", name, code, err);
    printf("%s: colt %s\n%s", name, args, out);
    CHECK(strstr(out, "\nall ") && strstr(out, "summary: "), "%s: stdout table: %s", name, out);
    json_error_t jerr;
    json_t *s = json_load_file(summary_path, 0, &jerr);
    int n_comp = 0, n_rows = 0;
    json_t **comp = read_jsonl(comp_path, &n_comp), **rows = read_jsonl(rows_path, &n_rows);
    CHECK(s != NULL, "%s: summary: %s", name, jerr.text);
    CHECK(n_comp == 40 && n_rows == 20, "%s: %d completions of 20 problems x 2", name, n_comp);
    if (!s || n_comp != 40 || n_rows != 20) {
        free(out), free(err);
        json_decref(s);
        free_rows(comp, n_comp), free_rows(rows, n_rows);
        return;
    }
    CHECK(json_integer_value(json_object_get(s, "problems")) == 20 &&
              json_integer_value(json_object_get(s, "samples_per_problem")) == 2 &&
              json_integer_value(json_object_get(s, "completions")) == 40 &&
              json_integer_value(json_object_get(s, "skipped")) == 0,
          "%s: summary counts", name);
    /* each problem's count is its completions' rewards; pass@1 their mean */
    json_t *results = json_object_get(s, "results");
    double sum_reward = 0;
    int bad_counts = 0, answered = 0;
    for (int i = 0; i < 20; i++) {
        json_t *r = json_array_get(results, (size_t)i);
        int right = 0;
        for (int j = 0; j < 2; j++) {
            json_t *c = comp[i * 2 + j];
            double reward = json_number_value(json_object_get(c, "reward"));
            right += reward == 1.0;
            sum_reward += reward;
            answered += !json_is_null(json_object_get(c, "answer"));
            if (json_integer_value(json_object_get(c, "problem")) != i ||
                !json_equal(json_object_get(c, "answer"), json_array_get(json_object_get(r, "answers"), (size_t)j)))
                bad_counts++;
        }
        if (json_integer_value(json_object_get(r, "correct")) != right) bad_counts++;
    }
    double p1 = json_real_value(json_object_get(s, "pass@1"));
    CHECK(bad_counts == 0, "%s: %d problems whose counts or answers differ from the completions file", name,
          bad_counts);
    CHECK(fabs(p1 - sum_reward / 40) < 1e-12 && p1 >= 0 && p1 <= 1, "%s: pass@1 %g, mean reward %g", name, p1,
          sum_reward / 40);
    /* the reference as the reward reads it: GSM8K's "#### N" */
    json_t *ref0 = json_object_get(json_array_get(results, 0), "reference");
    const char *want0 = breakdown ? "(3,\\frac{\\pi}{2})" : "18"; /* \left( 3, \frac{\pi}{2} \right) normalised */
    CHECK(json_is_string(ref0) && strcmp(json_string_value(ref0), want0) == 0, "%s: reference 0 '%s', want '%s'", name,
          json_string_value(ref0), want0);
    printf("  %d completions: pass@1 %.4f = mean reward; %d with an extracted answer; reference[0] '%s'\n", n_comp, p1,
           answered, json_string_value(ref0));
    if (breakdown) {
        /* subjects and levels: the problems of each, counted from the rows */
        json_t *by_subject = json_object_get(s, "by_subject"), *by_level = json_object_get(s, "by_level");
        int subject_total = 0, level_total = 0, mismatched = 0;
        const char *key;
        json_t *g;
        json_object_foreach(by_subject, key, g) {
            int count = 0;
            for (int i = 0; i < 20; i++) count += strcmp(json_string_value(json_object_get(rows[i], "subject")), key) == 0;
            mismatched += count != json_integer_value(json_object_get(g, "problems"));
            subject_total += (int)json_integer_value(json_object_get(g, "problems"));
        }
        json_object_foreach(by_level, key, g) {
            int count = 0;
            for (int i = 0; i < 20; i++) count += json_integer_value(json_object_get(rows[i], "level")) == atoi(key);
            mismatched += count != json_integer_value(json_object_get(g, "problems"));
            level_total += (int)json_integer_value(json_object_get(g, "problems"));
        }
        CHECK(subject_total == 20 && level_total == 20 && mismatched == 0 && json_object_size(by_subject) >= 2,
              "%s: breakdown: %d by subject, %d by level, %d groups miscounted", name, subject_total, level_total,
              mismatched);
        printf("  breakdown: %zu subjects and %zu levels, their problem counts equal the rows'\n",
               json_object_size(by_subject), json_object_size(by_level));
    } else {
        CHECK(!json_object_get(s, "by_subject") && !json_object_get(s, "by_level"), "%s: a breakdown without columns",
              name);
    }
    free(out), free(err);

    /* deterministic: again, and with --limit 5 (completion j of problem i keeps stream i * n + j) */
    char again[512], limited[512], *a_text = NULL, *b_text = NULL, *c_text = NULL;
    size_t a_len = 0, b_len = 0, c_len = 0;
    snprintf(again, sizeof again, "%s/%s_again.jsonl", g_tmp, name);
    snprintf(limited, sizeof limited, "%s/%s_limit5.jsonl", g_tmp, name);
    snprintf(args, sizeof args,
             "eval --model %s --dataset %s --n 2 --max_completion_length 16 --max_prompt_length 256 --device cpu "
             "--seed 7 --output %s/x.json --completions %s",
             STORIES, rows_path, g_tmp, again);
    code = run(args, &out, &err);
    free(out), free(err);
    snprintf(args, sizeof args,
             "eval --model %s --dataset %s --n 2 --max_completion_length 16 --max_prompt_length 256 --device cpu "
             "--seed 7 --limit 5 --output %s/y.json --completions %s",
             STORIES, rows_path, g_tmp, limited);
    int code2 = run(args, &out, &err);
    free(out), free(err);
    file_read_all(comp_path, &a_text, &a_len, NULL);
    file_read_all(again, &b_text, &b_len, NULL);
    file_read_all(limited, &c_text, &c_len, NULL);
    CHECK(code == 0 && code2 == 0 && a_text && b_text && c_text && a_len == b_len && memcmp(a_text, b_text, a_len) == 0,
          "%s: a second run gave other completions", name);
    CHECK(c_text && c_len > 0 && c_len < a_len && a_text && memcmp(a_text, c_text, c_len) == 0,
          "%s: --limit 5 changed the first problems' completions", name);
    printf("  same seed: identical completions (%zu bytes); --limit 5: the first 10 completions unchanged\n", a_len);
    free(a_text), free(b_text), free(c_text);
    json_decref(s);
    free_rows(comp, n_comp), free_rows(rows, n_rows);
}

/* A model folder with a chat template (stories260K's weights and tokenizer):
 * the prompt is the template's rendering of the problem and the instruction. */
static void test_chat_template(void) {
    char dir[512], cmd[2048], args[4096], rows_path[512], summary_path[512];
    snprintf(dir, sizeof dir, "%s/chat_model", g_tmp);
    snprintf(cmd, sizeof cmd, "mkdir -p %s && cp %s/config.json %s/model.safetensors %s/tokenizer.json %s/", dir,
             STORIES, STORIES, STORIES, dir);
    CHECK(system(cmd) == 0, "copy stories260K");
    snprintf(cmd, sizeof cmd, "%s/tokenizer_config.json", dir);
    FILE *fp = fopen(cmd, "w");
    fputs("{\"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"add_bos_token\": true, \"chat_template\": "
          "\"{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\\n{% endfor %}"
          "{% if add_generation_prompt %}<|assistant|>{% endif %}\"}\n",
          fp);
    fclose(fp);
    snprintf(rows_path, sizeof rows_path, "%s/chat.jsonl", g_tmp);
    fp = fopen(rows_path, "w");
    fputs("{\"question\": \"What is 2 + 3?\", \"answer\": \"It is 5.\\n#### 5\"}\n", fp);
    fclose(fp);
    snprintf(summary_path, sizeof summary_path, "%s/chat.json", g_tmp);
    snprintf(args, sizeof args,
             "eval --model %s --dataset %s --max_completion_length 8 --device cpu --instruction 'Answer briefly.' "
             "--output %s",
             dir, rows_path, summary_path);
    char *out, *err;
    int code = run(args, &out, &err);
    CHECK(code == 0, "chat template: exit %d: %s", code, err);
    json_t *s = json_load_file(summary_path, 0, NULL);
    json_t *r0 = json_array_get(json_object_get(s, "results"), 0);
    const char *prompt = json_string_value(json_object_get(r0, "prompt"));
    const char *want = "<|user|>What is 2 + 3?\nAnswer briefly.\n<|assistant|>";
    CHECK(prompt && strcmp(prompt, want) == 0, "chat prompt '%s', want '%s'", prompt ? prompt : "(none)", want);
    CHECK(json_is_true(json_object_get(json_object_get(s, "settings"), "chat_template")) &&
              json_real_value(json_object_get(json_object_get(s, "settings"), "temperature")) == 0.0,
          "settings: chat_template true, greedy with --n 1");
    char *shown = json_dumps(json_object_get(r0, "prompt"), JSON_ENCODE_ANY);
    printf("chat template: prompt %s\n", shown ? shown : "(none)");
    free(shown);
    json_decref(s);
    free(out), free(err);
    /* a conversational row (TRL's format): its messages through the template, no instruction added */
    fp = fopen(rows_path, "w");
    fputs("{\"prompt\": [{\"role\": \"system\", \"content\": \"Be exact.\"}, {\"role\": \"user\", \"content\": "
          "\"What is 2 + 3?\"}], \"answer\": 5}\n",
          fp);
    fclose(fp);
    code = run(args, &out, &err);
    s = json_load_file(summary_path, 0, NULL);
    r0 = json_array_get(json_object_get(s, "results"), 0);
    prompt = json_string_value(json_object_get(r0, "prompt"));
    want = "<|system|>Be exact.\n<|user|>What is 2 + 3?\n<|assistant|>";
    CHECK(code == 0 && prompt && strcmp(prompt, want) == 0 &&
              json_integer_value(json_object_get(r0, "reference")) == 5,
          "conversational prompt '%s' (exit %d: %s), want '%s'", prompt ? prompt : "(none)", code, err, want);
    printf("conversational row: prompt rendered from its messages, numeric reference 5\n");
    json_decref(s);
    free(out), free(err);
    fp = fopen(rows_path, "w");
    fputs("{\"question\": \"What is 2 + 3?\", \"answer\": \"It is 5.\\n#### 5\"}\n", fp);
    fclose(fp);

    /* --chat_template false: the plain text */
    snprintf(args, sizeof args,
             "eval --model %s --dataset %s --max_completion_length 8 --device cpu --instruction '' "
             "--chat_template false --output %s",
             dir, rows_path, summary_path);
    code = run(args, &out, &err);
    s = json_load_file(summary_path, 0, NULL);
    prompt = json_string_value(json_object_get(json_array_get(json_object_get(s, "results"), 0), "prompt"));
    CHECK(code == 0 && prompt && strcmp(prompt, "What is 2 + 3?") == 0, "plain prompt '%s'", prompt ? prompt : "");
    json_decref(s);
    free(out), free(err);
}

/* One line on stderr, exit 1, nothing on stdout, no summary file. */
static void expect_error(const char *name, const char *rows, const char *extra, const char *needle) {
    char rows_path[512], summary_path[512], args[4096];
    snprintf(rows_path, sizeof rows_path, "%s/bad.jsonl", g_tmp);
    snprintf(summary_path, sizeof summary_path, "%s/bad_summary.json", g_tmp);
    FILE *fp = fopen(rows_path, "w");
    fputs(rows, fp);
    fclose(fp);
    remove(summary_path);
    snprintf(args, sizeof args, "eval --model %s --dataset %s --device cpu --output %s %s %s", STORIES, rows_path,
             summary_path, strstr(extra, "--max_completion_length") ? "" : "--max_completion_length 4", extra);
    char *out, *err;
    int code = run(args, &out, &err);
    int lines = 0;
    for (const char *p = err; *p; p++) lines += *p == '\n';
    CHECK(code == 1 && out[0] == '\0' && lines == 1 && strstr(err, needle) && !file_exists(summary_path),
          "%s: exit %d, stdout '%s', stderr (%d lines) '%s', wanted '%s'", name, code, out, lines, err, needle);
    printf("  bad input %-24s -> exit %d: %s", name, code, err);
    free(out), free(err);
}

static void test_bad_input(void) {
    printf("bad input:\n");
    const char *gsm = "{\"question\": \"1 + 1?\", \"answer\": \"#### 2\"}\n";
    expect_error("n < k", gsm, "--n 2 --k 4", "--k 4 is more than --n 2");
    expect_error("k < 1", gsm, "--k 0", "--k must be >= 1");
    expect_error("n < 1", gsm, "--n 0", "--n must be >= 1");
    expect_error("no problem column", "{\"text\": \"1 + 1?\", \"answer\": \"2\"}\n", "",
                 "no problem column (columns: text, answer)");
    expect_error("no answer column", "{\"problem\": \"1 + 1?\", \"answer\": \"2\"}\n{\"problem\": \"2 + 2?\"}\n", "",
                 "bad.jsonl row 1: no 'answer' column (columns: problem)");
    expect_error("--prompt_column absent", gsm, "--prompt_column query", "row 0: no 'query' column");
    expect_error("problem a number", "{\"question\": 12, \"answer\": \"2\"}\n", "", "'question' must be a string");
    expect_error("messages not messages", "{\"question\": [1, 2], \"answer\": \"2\"}\n", "",
                 "row 0: \"prompt\" message 0 must be an object");
    expect_error("messages, no template", "{\"prompt\": [{\"role\": \"user\", \"content\": \"1 + 1?\"}], \"answer\": 2}\n",
                 "", "no chat template");
    expect_error("answer a list", "{\"question\": \"1 + 1?\", \"answer\": [2]}\n", "",
                 "'answer' must be a string or a number");
    expect_error("invalid JSON", "{\"question\": \n", "", "invalid JSON");
    expect_error("prompt too long", gsm, "--max_completion_length 600", "exceeds the model's max_position_embeddings");
}

int main(void) {
    snprintf(g_tmp, sizeof g_tmp, "/tmp/colt_test_eval_%d", (int)getpid());
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s", g_tmp, g_tmp);
    if (system(cmd) != 0) return 1;
    test_pass_at_k();
    test_score();
    if (shared_data_present()) {
        test_benchmark("gsm8k", "gsm8k/test.jsonl", false);
        test_benchmark("math500", "math500/test.jsonl", true);
    } else {
        shared_data_skipped("colt eval on 20 GSM8K and 20 MATH-500 rows");
    }
    test_chat_template();
    test_bad_input();
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_tmp);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_tmp);
    printf("%s: %d checks, %d failed\n", g_failures ? "FAIL" : "OK", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
