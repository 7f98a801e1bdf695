/* test_rewards.c — the reward functions: spec errors, length values (code
 * points), regex match/non-match with flags, answer extraction, the math
 * reward on hand-written cases and on 20 real GSM8K test rows (the reference
 * solution scores 1, the same solution with its final number changed scores
 * 0) and MATH-500 rows, and the external program: examples/reward_example.py
 * (when python3 is present), then shell programs that crash, exit, return a
 * wrong count, a string, invalid JSON, hang, or close stdin early — each a
 * clear error, no crash, no child left behind. Then the reliability cases:
 * rewards that overflow fp32, a program that answers twice, 1 MB on stderr,
 * a crash whose message quotes the last stderr line, exits while a descendant
 * holds the pipes, a colt killed with SIGKILL (its program must die too) and a
 * setsid'd grandchild (it must not hold the caller's stderr). */
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <jansson.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/error.h"
#include "data/dataset.h"
#include "data/rewards.h"
#include "shared_data.h"
#include "harness.h"


/* Builds a reward from JSON text; NULL (with the message in err) on error. */
static RewardFunc *make(const char *spec_text, char *err) {
    json_error_t jerr;
    json_t *spec = json_loads(spec_text, 0, &jerr);
    if (!spec) {
        fprintf(stderr, "bad test spec %s: %s\n", spec_text, jerr.text);
        exit(1);
    }
    RewardFunc *r = NULL;
    if (reward_create(&r, spec, err) != 0) r = NULL;
    json_decref(spec);
    return r;
}

/* No child process of ours remains, zombie or alive. */
static void check_no_children(const char *after) {
    int status;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    CHECK(pid == -1 && errno == ECHILD, "after %s: a child process remains (waitpid returned %d)", after, (int)pid);
}

/* ---------------------------------------------------------------------------
 * Specs
 * ------------------------------------------------------------------------- */

static void test_specs(void) {
    static const char *const bad[][2] = {
        {"{\"type\": \"lenght\"}", "unknown reward type \"lenght\""},
        {"{\"type\": \"length\", \"target\": 10, \"targte\": 3}", "length reward: unknown key \"targte\""},
        {"{\"type\": \"length\"}", "\"target\""},
        {"{\"type\": \"regex\", \"pattern\": \"(unclosed\"}", "does not compile"},
        {"{\"type\": \"regex\", \"pattern\": \"a\", \"flags\": \"sq\"}", "unknown flag 'q'"},
        {"{\"type\": \"regex\"}", "\"pattern\" must be a string"},
        {"{\"type\": \"math\", \"column\": 3}", "\"column\""},
        {"{\"type\": \"command\", \"command\": \"cat\", \"timeout\": 0}", "\"timeout\" must be a positive"},
        {"{\"type\": \"command\", \"cmd\": \"cat\"}", "command reward: unknown key \"cmd\""},
        {"{\"target\": 3}", "needs a \"type\""},
        {"[1]", "must be an object"},
        {"{\"type\": \"math\", \"name\": \"\"}", "\"name\" must be a non-empty string"},
        {"{\"type\": \"regex\", \"pattern\": \"a\", \"reward\": 1e39}",
         "\"reward\" 1e+39 is not a finite 32-bit float"},
        {"{\"type\": \"regex\", \"pattern\": \"a\", \"reward\": -3.5e38}", "is not a finite 32-bit float"},
        {"{\"type\": \"length\", \"target\": -1e39}", "\"target\" -1e+39 is not a finite 32-bit float"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char err[ERR_LEN] = "";
        RewardFunc *r = make(bad[i][0], err);
        CHECK(!r && strstr(err, bad[i][1]), "spec %s: error \"%s\" should contain \"%s\"", bad[i][0], err, bad[i][1]);
        printf("spec %-58s -> %s\n", bad[i][0], err);
        reward_free(r);
    }
    static const char *const names[][2] = {
        {"{\"type\": \"length\", \"target\": 5}", "length"},
        {"{\"type\": \"regex\", \"pattern\": \"x\"}", "regex"},
        {"{\"type\": \"math\"}", "math"},
        {"{\"type\": \"math\", \"name\": \"accuracy\"}", "accuracy"},
        {"{\"type\": \"command\", \"command\": \"cat >/dev/null\"}", "cat"},
        {"{\"type\": \"command\", \"command\": \"python3 -u ./examples/reward_example.py --strict\"}", "reward_example"},
        {"{\"type\": \"command\", \"command\": \"cat - | tee ./log.txt\"}", "cat"},
        {"{\"type\": \"command\", \"command\": \"true ./score\", \"name\": \"mine\"}", "mine"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char err[ERR_LEN] = "";
        RewardFunc *r = make(names[i][0], err);
        CHECK(r && !strcmp(reward_name(r), names[i][1]), "spec %s: name \"%s\", want \"%s\" (%s)", names[i][0],
              r ? reward_name(r) : "(error)", names[i][1], r ? "" : err);
        printf("name %-58s -> %s\n", names[i][0], r ? reward_name(r) : err);
        reward_free(r);
    }
    check_no_children("creating and freeing command rewards");
}

/* ---------------------------------------------------------------------------
 * Built-in rewards
 * ------------------------------------------------------------------------- */

/* Runs reward r on the completions and compares with want (NaN = no reward). */
static void check_values(RewardFunc *r, const char *label, const char *const *completions, json_t *const *rows,
                         const float *want, int n) {
    char err[ERR_LEN] = "";
    float *got = malloc((size_t)n * sizeof *got);
    int rc = reward_compute(r, got, NULL, completions, NULL, NULL, rows, n, err);
    CHECK(rc == 0, "%s: reward_compute failed: %s", label, err);
    int equal = 0;
    for (int i = 0; rc == 0 && i < n; i++) {
        int same = isnan(want[i]) ? isnan(got[i]) : got[i] == want[i];
        equal += same;
        CHECK(same, "%s: completion %d \"%.60s\": got %g, want %g", label, i, completions[i], got[i], want[i]);
    }
    printf("%-34s %d/%d rewards as expected\n", label, equal, n);
    free(got);
}

static void test_length(void) {
    char err[ERR_LEN];
    RewardFunc *r = make("{\"type\": \"length\", \"target\": 5}", err);
    CHECK(r != NULL, "length: %s", err);
    if (!r) return;
    const char *completions[] = {"hello", "hi", "", "日本語", "héllo wörld", "0123456789"};
    const float want[] = {0, -3, -5, -2, -6, -5};
    check_values(r, "length target 5 (code points)", completions, NULL, want, 6);
    reward_free(r);
}

static void test_regex(void) {
    char err[ERR_LEN];
    struct {
        const char *spec;
        const char *completions[4];
        float want[4];
    } cases[] = {
        {"{\"type\": \"regex\", \"pattern\": \"^<think>.*?</think>\\\\s*<answer>.*?</answer>$\", \"flags\": \"s\"}",
         {"<think>\nstep 1\nstep 2\n</think>\n<answer>\n42\n</answer>", "<think>x</think><answer>42</answer>\n",
          "<think>unfinished <answer>42</answer>", "Sure! <think>a</think><answer>1</answer>"},
         {1, 1, 0, 0}},
        {"{\"type\": \"regex\", \"pattern\": \"^<think>.*?</think>\\\\s*<answer>.*?</answer>$\"}",
         {"<think>\nx\n</think><answer>1</answer>", "<think>x</think><answer>1</answer>", "", "<answer>"},
         {0, 1, 0, 0}},
        {"{\"type\": \"regex\", \"pattern\": \"\\\\\\\\boxed\\\\{\", \"reward\": 0.5}",
         {"so the answer is \\boxed{4}.", "the answer is 4", "\\boxed{", "boxed{4}"},
         {0.5f, 0, 0.5f, 0}},
        {"{\"type\": \"regex\", \"pattern\": \"^answer: \\\\d+$\", \"flags\": \"mi\"}",
         {"work\nAnswer: 12\nmore", "answer: 12", "answer: twelve", "the answer: 12"},
         {1, 1, 0, 0}},
        {"{\"type\": \"regex\", \"pattern\": \"^\\\\w+$\"}", {"日本語", "mot", "two words", "é"}, {1, 1, 0, 1}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        RewardFunc *r = make(cases[i].spec, err);
        CHECK(r != NULL, "regex %s: %s", cases[i].spec, err);
        if (!r) continue;
        char label[64];
        snprintf(label, sizeof label, "regex case %zu", i);
        check_values(r, label, cases[i].completions, NULL, cases[i].want, 4);
        reward_free(r);
    }
}

static void test_extract(void) {
    static const char *const cases[][2] = {
        {"The answer is 72.", "72"},
        {"so 16 - 3 - 4 = 9 eggs\n#### 1,000", "1000"},
        {"#### $18", "18"},
        {"#### 42\nthen 7 more", "42"},
        {"so \\boxed{\\frac{3}{4}}", "\\frac{3}{4}"},
        {"\\boxed{5} or rather \\boxed{7}", "7"},
        {"\\boxed{\\frac{1}{\\sqrt{2}}}", "\\frac{1}{\\sqrt{2}}"},
        {"\\boxed{\\dfrac{1}{2}}", "\\frac{1}{2}"},
        {"\\boxed{x = 5}", "5"},
        {"\\boxed{\\text{Evelyn}}", "Evelyn"},
        {"\\boxed{50\\%}", "50"},
        {"\\boxed{90^\\circ}", "90"},
        {"\\boxed{unbalanced 9", "9"},
        {"it costs $5.00 in total", "5"},
        {"a total of 3.50 dollars", "3.5"},
        {"It is -3 degrees outside", "-3"},
        {"see pages 3-4", "4"},
        {"x = 3/4 of the cake", "3/4"},
        {"1,234,567 people", "1234567"},
        {"No numbers here", NULL},
        {"", NULL},
    };
    int equal = 0, n = (int)(sizeof cases / sizeof cases[0]);
    for (int i = 0; i < n; i++) {
        char *got = reward_extract_answer(cases[i][0]);
        int same = cases[i][1] ? got && !strcmp(got, cases[i][1]) : got == NULL;
        equal += same;
        CHECK(same, "extract \"%s\": got %s%s%s, want %s", cases[i][0], got ? "\"" : "", got ? got : "NULL",
              got ? "\"" : "", cases[i][1] ? cases[i][1] : "NULL");
        free(got);
    }
    printf("%-34s %d/%d answers as expected\n", "reward_extract_answer", equal, n);
}

static void test_math_cases(void) {
    char err[ERR_LEN];
    RewardFunc *r = make("{\"type\": \"math\"}", err);
    CHECK(r != NULL, "math: %s", err);
    if (!r) return;
    struct {
        const char *row;
        const char *completion;
        float want;
    } cases[] = {
        {"{\"answer\": \"He pays 9 * 8 = 72.\\n#### 72\"}", "The answer is 72", 1},
        {"{\"answer\": \"#### 72\"}", "#### 72.0", 1},
        {"{\"answer\": \"#### 72\"}", "so \\boxed{72}", 1},
        {"{\"answer\": \"#### 72\"}", "I think 73", 0},
        {"{\"answer\": \"#### 72\"}", "I do not know", 0},
        {"{\"answer\": \"1000\"}", "That is 1,000 apples", 1},
        {"{\"answer\": \"#### 5\"}", "It costs $5.", 1},
        {"{\"answer\": \"\\\\frac{1}{2}\"}", "0.5", 1},
        {"{\"answer\": \"\\\\frac{1}{2}\"}", "about 1/2", 1},
        {"{\"answer\": \"\\\\frac{1}{2}\"}", "\\boxed{\\dfrac{1}{2}}", 1},
        {"{\"answer\": \"\\\\frac{1}{2}\"}", "\\boxed{\\frac{1}{3}}", 0},
        {"{\"answer\": \"-5\"}", "the result is -5.", 1},
        {"{\"answer\": \"-5\"}", "the result is 5", 0},
        {"{\"answer\": 18}", "#### 18", 1},
        {"{\"answer\": 0.75}", "3/4", 1},
        {"{\"answer\": \"0.3333333\"}", "1/3", 1},
        {"{\"answer\": \"100000\"}", "100001", 0},
        {"{\"answer\": \"\\\\left( 3, \\\\frac{\\\\pi}{2} \\\\right)\"}", "\\boxed{(3,\\frac{\\pi}{2})}", 1},
        {"{\"answer\": \"\\\\text{Evelyn}\"}", "The winner is \\boxed{\\text{Evelyn}}", 1},
        {"{\"answer\": \"p - q\"}", "\\boxed{p-q}", 1},
        {"{\"answer\": null}", "42", NAN},
        {"{\"answer\": \"#### \"}", "42", NAN},
    };
    int n = (int)(sizeof cases / sizeof cases[0]);
    json_t **rows = malloc((size_t)n * sizeof *rows);
    const char **completions = malloc((size_t)n * sizeof *completions);
    float *want = malloc((size_t)n * sizeof *want);
    for (int i = 0; i < n; i++) {
        rows[i] = json_loads(cases[i].row, 0, NULL);
        COLT_ASSERT(rows[i]);
        completions[i] = cases[i].completion;
        want[i] = cases[i].want;
    }
    check_values(r, "math (hand-written cases)", completions, rows, want, n);

    /* A row without the column is a configuration error, named. */
    json_t *no_column = json_loads("{\"solution\": \"#### 3\"}", 0, NULL);
    float value;
    const char *one[] = {"3"};
    int rc = reward_compute(r, &value, NULL, one, NULL, NULL, &no_column, 1, err);
    CHECK(rc != 0 && strstr(err, "no column \"answer\""), "row without the column: rc=%d err=%s", rc, err);
    printf("math row without \"answer\"          -> %s\n", err);
    json_decref(no_column);
    for (int i = 0; i < n; i++) json_decref(rows[i]);
    free(rows);
    free(completions);
    free(want);
    reward_free(r);

    /* Another column name. */
    r = make("{\"type\": \"math\", \"column\": \"solution\"}", err);
    json_t *row = json_loads("{\"solution\": \"so \\\\boxed{12}\", \"answer\": \"99\"}", 0, NULL);
    const char *c[] = {"12", "99"};
    json_t *rows2[] = {row, row};
    check_values(r, "math with column \"solution\"", c, rows2, (const float[]){1, 0}, 2);
    json_decref(row);
    reward_free(r);
}

/* Reads the first n rows of a JSONL file. */
static int read_rows(json_t **rows, const char *path, int n) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    char *line = NULL;
    size_t cap = 0;
    int k = 0;
    while (k < n && getline(&line, &cap, f) > 0) rows[k++] = json_loads(line, 0, NULL);
    free(line);
    fclose(f);
    return k;
}

/* The GSM8K reference solution as a completion scores 1; with the final
 * number changed (N -> N + 1) it scores 0. */
static void test_math_gsm8k(void) {
    enum { N = 20 };
    json_t *rows[N];
    if (!shared_data_present()) {
        shared_data_skipped("math reward on 20 GSM8K reference answers");
        return;
    }
    int k = read_rows(rows, COLT_SHARED_DATA "/gsm8k/test.jsonl", N);
    CHECK(k == N, "gsm8k/test.jsonl: read %d rows, want %d", k, N);
    if (k != N) return;
    char err[ERR_LEN];
    RewardFunc *r = make("{\"type\": \"math\", \"column\": \"answer\"}", err);
    const char *solutions[N];
    char *changed[N];
    float ones[N], zeros[N];
    for (int i = 0; i < N; i++) {
        solutions[i] = json_string_value(json_object_get(rows[i], "answer"));
        const char *hashes = strstr(solutions[i], "####");
        COLT_ASSERT(hashes);
        long long value = strtoll(hashes + 4, NULL, 10);
        size_t head = (size_t)(hashes - solutions[i]);
        changed[i] = malloc(head + 32);
        snprintf(changed[i], head + 32, "%.*s#### %lld", (int)head, solutions[i], value + 1);
        ones[i] = 1, zeros[i] = 0;
    }
    check_values(r, "math on 20 GSM8K reference answers", solutions, rows, ones, N);
    check_values(r, "math on 20 GSM8K answers, N -> N+1", (const char *const *)changed, rows, zeros, N);
    for (int i = 0; i < N; i++) {
        free(changed[i]);
        json_decref(rows[i]);
    }
    reward_free(r);
}

/* MATH-500: the reference solution (which ends in \boxed{...}) against the
 * "answer" column. Not all match as strings (a solution may box "\dfrac" or
 * add "\text{}" the answer column lacks); the count is printed and the ones
 * expected are required. */
static void test_math_math500(void) {
    enum { N = 20 };
    json_t *rows[N];
    if (!shared_data_present()) {
        shared_data_skipped("math reward on 20 MATH-500 reference solutions");
        return;
    }
    int k = read_rows(rows, COLT_SHARED_DATA "/math500/test.jsonl", N);
    CHECK(k == N, "math500/test.jsonl: read %d rows, want %d", k, N);
    if (k != N) return;
    char err[ERR_LEN];
    RewardFunc *r = make("{\"type\": \"math\"}", err);
    const char *solutions[N];
    for (int i = 0; i < N; i++) solutions[i] = json_string_value(json_object_get(rows[i], "solution"));
    float got[N];
    int rc = reward_compute(r, got, NULL, solutions, NULL, NULL, rows, N, err);
    CHECK(rc == 0, "math500: %s", err);
    int matched = 0;
    for (int i = 0; rc == 0 && i < N; i++) {
        matched += got[i] == 1.0f;
        if (got[i] != 1.0f) {
            char *a = reward_extract_answer(solutions[i]);
            printf("  math500 row %d: solution's answer \"%s\" vs column \"%s\" -> %g\n", i, a ? a : "(none)",
                   json_string_value(json_object_get(rows[i], "answer")), got[i]);
            free(a);
        }
    }
    CHECK(matched >= 19, "math500: %d/20 reference solutions match their answer column, want >= 19", matched);
    printf("%-34s %d/%d reference solutions score 1\n", "math on 20 MATH-500 solutions", matched, N);
    for (int i = 0; i < N; i++) json_decref(rows[i]);
    reward_free(r);
}

/* ---------------------------------------------------------------------------
 * External programs
 * ------------------------------------------------------------------------- */

static void test_example_program(void) {
    if (system("command -v python3 >/dev/null 2>&1") != 0) {
        printf("SKIP examples/reward_example.py: python3 not found (the shell-program g_checks still run)\n");
        return;
    }
    char err[ERR_LEN];
    Dataset *d = NULL;
    int rc = dataset_load(&d, COLT_SOURCE_DIR "/examples/data/target_words.jsonl", err);
    CHECK(rc == 0, "examples/data/target_words.jsonl: %s", err);
    if (rc != 0) return;
    RewardFunc *r = make("{\"type\": \"command\", \"command\": \"python3 " COLT_SOURCE_DIR
                         "/examples/reward_example.py\", \"timeout\": 20}", err);
    CHECK(r != NULL, "reward_example.py: %s", err);
    if (!r) {
        dataset_free(d);
        return;
    }
    CHECK(!strcmp(reward_name(r), "reward_example"), "default name %s", reward_name(r));
    const char *prompts[] = {"p0", "p1", "p2", "p3"};
    const char *completions[] = {"I like Apple pie.", "No whales here.", "Anything at all.", "The sky is blue"};
    json_t *rows[] = {dataset_row(d, 0), dataset_row(d, 1), dataset_row(d, 2), dataset_row(d, 3)};
    float want[] = {1, 0, NAN, 1};
    /* Twice: the program stays up between calls. */
    check_values(r, "reward_example.py call 1", completions, rows, want, 4);
    check_values(r, "reward_example.py call 2", completions, rows, want, 4);
    (void)prompts;

    /* A large batch: ~1.3 MB each way through the pipes. */
    enum { BIG = 64 };
    char *big[BIG];
    json_t *big_rows[BIG];
    float big_want[BIG];
    for (int i = 0; i < BIG; i++) {
        big[i] = malloc(20001);
        for (int j = 0; j < 20000; j++) big[i][j] = "abcd efgh "[j % 10];
        big[i][20000] = '\0';
        if (i % 2) memcpy(big[i] + 100, " apple ", 7);
        big_rows[i] = rows[0];
        big_want[i] = (float)(i % 2);
    }
    check_values(r, "reward_example.py 64 x 20 KB", (const char *const *)big, big_rows, big_want, BIG);
    for (int i = 0; i < BIG; i++) free(big[i]);
    reward_free(r);
    dataset_free(d);
    check_no_children("reward_example.py");
}

static void test_bad_programs(void) {
    struct {
        const char *label;
        const char *command;
        const char *expect;
    } cases[] = {
        {"crash (SIGSEGV)", "read -r line; kill -SEGV $$", "was killed by signal 11"},
        {"exit 3", "read -r line; exit 3", "exited with status 3"},
        {"not found", "/nonexistent/reward-program", "exited with status 127 (command not found?)"},
        {"wrong count", "while read -r l; do echo '{\"rewards\": [1]}'; done", "' returned 1 rewards for 2 completions"},
        {"a string", "while read -r l; do echo '{\"rewards\": [1, \"high\"]}'; done",
         "rewards[1] is a string, expected a number or null"},
        {"no rewards key", "while read -r l; do echo '{\"scores\": [1, 2]}'; done", "without a \"rewards\" list"},
        {"invalid JSON", "while read -r l; do echo 'debug: starting'; done", "is not valid JSON"},
        {"hang (timeout 1 s)", "sleep 30", "did not answer within 1 s (timeout); killed it"},
    };
    const char *completions[] = {"a", "b"};
    json_t *row = json_loads("{\"prompt\": \"p\", \"target\": \"a\"}", 0, NULL);
    json_t *rows[] = {row, row};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char err[ERR_LEN] = "", spec[512];
        json_t *s = json_pack("{s:s, s:s, s:i}", "type", "command", "command", cases[i].command, "timeout", 1);
        char *text = json_dumps(s, 0);
        snprintf(spec, sizeof spec, "%s", text);
        free(text);
        json_decref(s);
        RewardFunc *r = make(spec, err);
        CHECK(r != NULL, "%s: create failed: %s", cases[i].label, err);
        if (!r) continue;
        float got[2];
        double t0 = now_s();
        int rc = reward_compute(r, got, NULL, completions, NULL, NULL, rows, 2, err);
        double elapsed = now_s() - t0;
        CHECK(rc != 0 && strstr(err, cases[i].expect), "%s: rc=%d, error \"%s\" should contain \"%s\"", cases[i].label,
              rc, rc ? err : "", cases[i].expect);
        CHECK(strstr(err, cases[i].command) != NULL, "%s: error names the command: %s",
              cases[i].label, err);
        CHECK(elapsed < 3.5, "%s: took %.2f s", cases[i].label, elapsed);
        printf("%-20s (%.2f s) -> %s\n", cases[i].label, elapsed, err);
        /* A program that died stays dead: a second call says so rather than hanging. */
        if (strstr(err, "killed") || strstr(err, "exited")) {
            rc = reward_compute(r, got, NULL, completions, NULL, NULL, rows, 2, err);
            CHECK(rc != 0 && strstr(err, "no longer running"), "%s: second call: %s", cases[i].label, err);
        }
        reward_free(r);
        check_no_children(cases[i].label);
    }
    json_decref(row);

    /* A program that closes stdin while we write 1 MB: EPIPE with SIGPIPE
     * blocked, an error, no crash. */
    char err[ERR_LEN] = "";
    RewardFunc *r = make("{\"type\": \"command\", \"command\": \"exec 0<&-; sleep 0.2; exit 4\", \"timeout\": 5}", err);
    CHECK(r != NULL, "stdin-closer: %s", err);
    if (r) {
        char *big = malloc(1 << 20);
        memset(big, 'x', (1 << 20) - 1);
        big[(1 << 20) - 1] = '\0';
        const char *c[] = {big};
        float got;
        int rc = reward_compute(r, &got, NULL, c, NULL, NULL, NULL, 1, err);
        CHECK(rc != 0 && strstr(err, "exited with status 4"), "stdin closed early: rc=%d err=%s", rc, err);
        printf("%-20s -> %s\n", "stdin closed (1 MB)", err);
        free(big);
        reward_free(r);
        check_no_children("stdin closed early");
    }

    /* reward_free on a program that ignores EOF and SIGTERM: killed after the
     * grace period, reaped. */
    r = make("{\"type\": \"command\", \"command\": \"trap '' TERM; while true; do sleep 1; done\"}", err);
    CHECK(r != NULL, "stubborn: %s", err);
    double t0 = now_s();
    reward_free(r);
    double elapsed = now_s() - t0;
    CHECK(elapsed < 3.0, "reward_free of a program ignoring EOF took %.2f s", elapsed);
    printf("%-20s -> freed in %.2f s\n", "ignores EOF", elapsed);
    check_no_children("freeing a program that ignores EOF");
}

/* ---------------------------------------------------------------------------
 * Reliability of external programs
 * ------------------------------------------------------------------------- */

static char tmp_dir[64]; /* for pid files the programs write */

/* A command reward with the given timeout and name; NULL (message in err) on error. */
static RewardFunc *make_command(const char *command, int timeout, const char *name, char *err) {
    json_t *spec = json_pack("{s:s, s:s, s:i, s:s}", "type", "command", "command", command, "timeout", timeout,
                             "name", name);
    RewardFunc *r = NULL;
    if (reward_create(&r, spec, err) != 0) r = NULL;
    json_decref(spec);
    return r;
}

/* Alive and not a zombie (an orphan's zombie may wait for an init that does
 * not reap). */
static int process_alive(pid_t pid) {
    if (pid <= 0 || kill(pid, 0) != 0) return 0;
    char path[64], stat[256] = "";
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(stat, 1, sizeof stat - 1, f);
    fclose(f);
    stat[n] = '\0';
    char *paren = strrchr(stat, ')');
    return !(paren && paren[1] == ' ' && paren[2] == 'Z');
}

/* The pid a program wrote into tmp_dir/name, waiting up to wait_s for it. */
static pid_t read_pid_file(const char *name, double wait_s) {
    char path[128];
    snprintf(path, sizeof path, "%s/%s", tmp_dir, name);
    double t0 = now_s();
    do {
        FILE *f = fopen(path, "r");
        long pid = 0;
        if (f) {
            int ok = fscanf(f, "%ld", &pid) == 1;
            fclose(f);
            if (ok && pid > 0) return (pid_t)pid;
        }
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    } while (now_s() - t0 < wait_s);
    return 0;
}

/* Kills a leftover (non-child) process a test started, if it still runs a sleep. */
static void kill_leftover(pid_t pid) {
    char path[64], comm[64] = "";
    snprintf(path, sizeof path, "/proc/%d/comm", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return;
    if (fgets(comm, sizeof comm, f) && !strncmp(comm, "sleep", 5)) kill(pid, SIGKILL);
    fclose(f);
}

/* Rewards that a double holds but a float cannot are errors naming the
 * reward and the completion; FLT_MAX as Python prints it still fits. */
static void test_fp32_overflow(void) {
    struct {
        const char *answer;
        const char *expect;
    } bad[] = {
        {"[1e39, 0]", "reward 'big': completion 0: 1e+39 is not a finite 32-bit float"},
        {"[0, -1e39]", "reward 'big': completion 1: -1e+39 is not a finite 32-bit float"},
        {"[0, 3.4028236e38]", "completion 1: 3.40282e+38 is not a finite 32-bit float"},
    };
    const char *completions[] = {"a", "b"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char err[ERR_LEN] = "", command[128];
        snprintf(command, sizeof command, "while read -r l; do echo '{\"rewards\": %s}'; done", bad[i].answer);
        RewardFunc *r = make_command(command, 5, "big", err);
        CHECK(r != NULL, "%s: %s", command, err);
        if (!r) continue;
        float got[2];
        int rc = reward_compute(r, got, NULL, completions, NULL, NULL, NULL, 2, err);
        CHECK(rc != 0 && strstr(err, bad[i].expect), "rewards %s: rc=%d err \"%s\" should contain \"%s\"",
              bad[i].answer, rc, rc ? err : "", bad[i].expect);
        printf("rewards %-18s -> %s\n", bad[i].answer, err);
        reward_free(r);
    }
    char err[ERR_LEN] = "";
    RewardFunc *r = make_command(
        "while read -r l; do echo '{\"rewards\": [3.4028235e38, -3.4028235e38, null, 0.5]}'; done", 5, "edge", err);
    CHECK(r != NULL, "edge: %s", err);
    if (r) {
        const char *c4[] = {"a", "b", "c", "d"};
        check_values(r, "rewards +-FLT_MAX, null, 0.5", c4, NULL, (const float[]){FLT_MAX, -FLT_MAX, NAN, 0.5f}, 4);
        reward_free(r);
    }
    /* The largest regex reward and length target that fit. */
    r = make("{\"type\": \"regex\", \"pattern\": \"a\", \"reward\": -3.4028235e38}", err);
    CHECK(r != NULL, "regex reward -FLT_MAX: %s", err);
    if (r) check_values(r, "regex reward -FLT_MAX", completions, NULL, (const float[]){-FLT_MAX, 0}, 2);
    reward_free(r);
    r = make("{\"type\": \"length\", \"target\": -3.4028235e38}", err);
    CHECK(r != NULL, "length target -FLT_MAX: %s", err);
    if (r) check_values(r, "length target -FLT_MAX", completions, NULL, (const float[]){-FLT_MAX, -FLT_MAX}, 2);
    reward_free(r);
    check_no_children("fp32 overflow");
}

/* A second answer would be read as the answer to the next request. */
static void test_answers_twice(void) {
    const char *completions[] = {"a", "b"};
    float got[2];
    char err[ERR_LEN] = "";
    /* Both lines in one write: caught right after the first. (Two separate writes may
     * arrive apart on a loaded machine: the "late" case below covers that.) */
    RewardFunc *r = make_command("while read -r l; do printf '{\"rewards\": [1, 2]}\\n{\"rewards\": [3, 4]}\\n'; done",
                                 5, "twice", err);
    CHECK(r != NULL, "twice: %s", err);
    if (r) {
        int rc = reward_compute(r, got, NULL, completions, NULL, NULL, NULL, 2, err);
        CHECK(rc != 0 && strstr(err, "wrote more than one line for one request") && strstr(err, "[3, 4]"),
              "answers twice at once: rc=%d err=%s", rc, rc ? err : "");
        printf("%-20s -> %s\n", "answers twice", err);
        rc = reward_compute(r, got, NULL, completions, NULL, NULL, NULL, 2, err);
        CHECK(rc != 0 && strstr(err, "no longer running"), "answers twice, next call: %s", err);
        reward_free(r);
    }
    /* The second line 0.2 s later: the first call succeeds, the next request
     * (1 s later) is refused before it is written. */
    r = make_command("while read -r l; do echo '{\"rewards\": [1, 2]}'; sleep 0.2; echo '{\"rewards\": [3, 4]}'; done",
                     5, "late", err);
    CHECK(r != NULL, "late: %s", err);
    if (r) {
        check_values(r, "answers twice, late: call 1", completions, NULL, (const float[]){1, 2}, 2);
        struct timespec ts = {1, 0};
        nanosleep(&ts, NULL);
        int rc = reward_compute(r, got, NULL, completions, NULL, NULL, NULL, 2, err);
        CHECK(rc != 0 && strstr(err, "wrote more than one line for one request"), "late second answer: rc=%d err=%s",
              rc, rc ? err : "");
        printf("%-20s -> %s\n", "answers twice, late", err);
        reward_free(r);
    }
    /* A banner before the first request. */
    r = make_command("echo ready; while read -r l; do echo '{\"rewards\": [1, 2]}'; done", 5, "banner", err);
    CHECK(r != NULL, "banner: %s", err);
    if (r) {
        struct timespec ts = {0, 300 * 1000000L};
        nanosleep(&ts, NULL);
        int rc = reward_compute(r, got, NULL, completions, NULL, NULL, NULL, 2, err);
        CHECK(rc != 0 && strstr(err, "wrote to stdout before its first request (\"ready\")"), "banner: rc=%d err=%s",
              rc, rc ? err : "");
        printf("%-20s -> %s\n", "banner on stdout", err);
        reward_free(r);
    }
    check_no_children("answers twice");
}

/* 1 MB on stderr before reading the request (which is larger than a pipe)
 * and 1 MB more before answering: no deadlock, every line forwarded with the
 * reward's name. Our stderr goes to a file meanwhile. */
static void test_stderr_flood(void) {
    char err[ERR_LEN] = "", path[128];
    snprintf(path, sizeof path, "%s/stderr.txt", tmp_dir);
    const char *flood = "yes $(printf '%099d' 0) | head -n 10486 >&2";
    char command[256];
    snprintf(command, sizeof command, "%s; while read -r l; do %s; echo '{\"rewards\": [1, 2]}'; done", flood, flood);
    RewardFunc *r = make_command(command, 20, "flood", err);
    CHECK(r != NULL, "flood: %s", err);
    if (!r) return;
    char *big = malloc(300001);
    memset(big, 'x', 300000);
    big[300000] = '\0';
    const char *completions[] = {big, "b"};
    float got[2] = {0, 0};
    fflush(stderr);
    int saved = dup(STDERR_FILENO), file = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    COLT_ASSERT(saved >= 0 && file >= 0);
    dup2(file, STDERR_FILENO);
    double t0 = now_s();
    int rc = reward_compute(r, got, NULL, completions, NULL, NULL, NULL, 2, err);
    double elapsed = now_s() - t0;
    reward_free(r);
    fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
    close(file);
    CHECK(rc == 0 && got[0] == 1 && got[1] == 2, "1 MB on stderr: rc=%d err=%s got %g %g", rc, rc ? err : "", got[0],
          got[1]);
    FILE *f = fopen(path, "r");
    char *line = NULL;
    size_t cap = 0;
    long lines = 0, other = 0;
    char want[160];
    snprintf(want, sizeof want, "[reward flood] %099d\n", 0);
    while (f && getline(&line, &cap, f) > 0) {
        if (!strcmp(line, want)) lines++;
        else other++;
    }
    free(line);
    if (f) fclose(f);
    unlink(path);
    CHECK(lines == 2 * 10486 && other == 0, "stderr flood: %ld forwarded lines (want %d), %ld other lines", lines,
          2 * 10486, other);
    printf("%-20s -> answered in %.2f s, %ld stderr lines forwarded (2 x 1 MB)\n", "1 MB on stderr", elapsed, lines);
    free(big);
    check_no_children("stderr flood");
}

/* A crash quotes the program's last stderr line; an exit is noticed while a
 * descendant still holds the pipes, long before the timeout. */
static void test_crash_messages(void) {
    struct {
        const char *label;
        const char *command;
        const char *expect[2];
        int needs_python;
    } cases[] = {
        {"python traceback", "python3 -c 'import sys; sys.stdin.readline(); 1/0'",
         {"exited with status 1 without answering",
          "its last line on stderr was \"ZeroDivisionError: division by zero\""},
         1},
        {"shell error", "read -r l; echo 'fatal: config.yaml not found' >&2; echo >&2; exit 2",
         {"exited with status 2", "its last line on stderr was \"fatal: config.yaml not found\""}, 0},
        {"exit, child holds stdout", "sleep 300 & read -r l; echo 'bad input' >&2; exit 5",
         {"exited with status 5 without answering", "\"bad input\""}, 0},
        {"exit, child holds stdin", "exec 3<&0; sleep 300 <&3 3<&- & exit 6",
         {"exited with status 6 before reading all of its input", ""}, 0},
        {"hang, setsid child", "setsid sh -c 'echo $$ > DIR/hang.pid; exec sleep 300' & sleep 30",
         {"did not answer within 1 s (timeout); killed it", ""}, 0},
    };
    int have_python = system("command -v python3 >/dev/null 2>&1") == 0;
    char *big = malloc(1 << 20);
    memset(big, 'x', (1 << 20) - 1);
    big[(1 << 20) - 1] = '\0';
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (cases[i].needs_python && !have_python) {
            printf("SKIP %s: python3 not found\n", cases[i].label);
            continue;
        }
        char err[ERR_LEN] = "", command[256];
        snprintf(command, sizeof command, "%s", cases[i].command);
        char *dir = strstr(command, "DIR");
        if (dir) {
            char rest[256];
            snprintf(rest, sizeof rest, "%s", dir + 3);
            snprintf(dir, sizeof command - (size_t)(dir - command), "%s%s", tmp_dir, rest);
        }
        int timeout = strstr(cases[i].label, "hang") ? 1 : 10;
        RewardFunc *r = make_command(command, timeout, "crash", err);
        CHECK(r != NULL, "%s: %s", cases[i].label, err);
        if (!r) continue;
        const char *completions[] = {strstr(cases[i].label, "stdin") ? big : "a"};
        float got;
        double t0 = now_s();
        int rc = reward_compute(r, &got, NULL, completions, NULL, NULL, NULL, 1, err);
        double elapsed = now_s() - t0;
        reward_free(r);
        double freed = now_s() - t0 - elapsed;
        CHECK(rc != 0 && strstr(err, cases[i].expect[0]) && strstr(err, cases[i].expect[1]),
              "%s: rc=%d err \"%s\" should contain \"%s\" and \"%s\"", cases[i].label, rc, rc ? err : "",
              cases[i].expect[0], cases[i].expect[1]);
        /* bounds far below the 10 s timeout, with room for a loaded machine (CI runs tests in parallel) */
        CHECK(elapsed < timeout + 1.0 && (timeout == 1 || elapsed < 5.0) && freed < 2.0,
              "%s: the error took %.2f s, freeing %.2f s", cases[i].label, elapsed, freed);
        printf("%-24s (%.2f s) -> %s\n", cases[i].label, elapsed, err);
        check_no_children(cases[i].label);
    }
    pid_t leftover = read_pid_file("hang.pid", 10.0); /* a setsid shell writes it: late on a loaded machine */
    CHECK(leftover > 0, "hang, setsid child: no hang.pid");
    if (leftover > 0) kill_leftover(leftover);
    free(big);
}

/* A colt killed with SIGKILL in the middle of a call takes its reward
 * program and the program's children with it. */
static void test_killed_caller(void) {
    int sync[2];
    COLT_ASSERT(pipe(sync) == 0);
    fflush(NULL);
    pid_t caller = fork();
    COLT_ASSERT(caller >= 0);
    if (caller == 0) {
        close(sync[0]);
        char err[ERR_LEN], command[256];
        snprintf(command, sizeof command, "read -r l; sleep 300 & echo $! > %s/sleep.pid; wait", tmp_dir);
        RewardFunc *r = make_command(command, 600, "sleepy", err);
        pid_t pid = r ? reward_command_pid(r) : 0;
        if (write(sync[1], &pid, sizeof pid) != (ssize_t)sizeof pid) _exit(1);
        const char *completions[] = {"a"};
        float got;
        if (r) reward_compute(r, &got, NULL, completions, NULL, NULL, NULL, 1, err); /* blocks until killed */
        _exit(1);
    }
    close(sync[1]);
    pid_t program = 0;
    ssize_t got_bytes = read(sync[0], &program, sizeof program);
    close(sync[0]);
    CHECK(got_bytes == (ssize_t)sizeof program && program > 0, "killed caller: the child could not start the program");
    pid_t sleeper = read_pid_file("sleep.pid", 5.0);
    CHECK(sleeper > 0, "killed caller: the program never read its request");
    kill(caller, SIGKILL);
    waitpid(caller, NULL, 0);
    double t0 = now_s();
    while ((process_alive(program) || process_alive(sleeper)) && now_s() - t0 < 5.0) {
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
    double elapsed = now_s() - t0;
    int program_alive = process_alive(program), sleeper_alive = process_alive(sleeper);
    CHECK(program > 0 && sleeper > 0 && !program_alive && !sleeper_alive && elapsed < 4.0,
          "killed caller: %.2f s later the program (pid %d) is %s, its child sleep (pid %d) is %s", elapsed,
          (int)program, program_alive ? "alive" : "gone", (int)sleeper, sleeper_alive ? "alive" : "gone");
    printf("%-24s -> program and its child gone %.2f s after the caller's SIGKILL\n", "caller killed (-9)", elapsed);
    if (program_alive) kill(program, SIGKILL);
    if (sleeper_alive) kill_leftover(sleeper);
    check_no_children("killed caller");
}

/* A program whose setsid'd grandchild outlives it: the reward works, and once
 * the caller (a child with a pipe as stderr) exits, the pipe reaches EOF — the
 * grandchild holds only the program's own pipes. */
static void test_setsid_grandchild(void) {
    int err_pipe[2];
    COLT_ASSERT(pipe(err_pipe) == 0);
    fflush(NULL);
    pid_t caller = fork();
    COLT_ASSERT(caller >= 0);
    if (caller == 0) {
        dup2(err_pipe[1], STDERR_FILENO);
        close(err_pipe[0]);
        close(err_pipe[1]);
        char err[ERR_LEN], command[512];
        snprintf(command, sizeof command,
                 "setsid sh -c 'echo $$ > %s/daemon.pid; exec sleep 300' & "
                 /* answers only once the grandchild has left the process group (its pid written): else the
                  * end of the call could kill it before it detached, a race of this test, not of colt's */
                 "while [ ! -s %s/daemon.pid ]; do sleep 0.01; done; "
                 "echo started >&2; while read -r l; do echo '{\"rewards\": [1, 2]}'; done",
                 tmp_dir, tmp_dir);
        RewardFunc *r = make_command(command, 10, "daemon", err);
        if (!r) {
            fprintf(stderr, "create: %s\n", err);
            _exit(2);
        }
        const char *completions[] = {"a", "b"};
        float got[2] = {0, 0};
        int rc = reward_compute(r, got, NULL, completions, NULL, NULL, NULL, 2, err);
        double t0 = now_s();
        reward_free(r);
        double freed = now_s() - t0;
        if (rc != 0) fprintf(stderr, "compute: %s\n", err);
        fflush(stderr);
        _exit(rc != 0 ? 3 : got[0] != 1 || got[1] != 2 ? 4 : freed > 2.0 ? 5 : 0);
    }
    close(err_pipe[1]);
    char captured[4096];
    size_t len = 0;
    int status = -1;
    double exited_at = 0, eof_at = 0, t0 = now_s();
    /* EOF may come a moment before the exit can be reaped: wait for both. */
    while ((eof_at == 0 || exited_at == 0) && now_s() - t0 < 20.0 &&
           !(exited_at > 0 && now_s() - exited_at > 3.0)) {
        struct pollfd pfd = {err_pipe[0], POLLIN, 0};
        if (eof_at == 0 && poll(&pfd, 1, 20) > 0) {
            ssize_t r = read(err_pipe[0], captured + len, sizeof captured - 1 - len);
            if (r == 0) eof_at = now_s();
            if (r > 0) len += (size_t)r;
            if (len == sizeof captured - 1) len = 0; /* keep the tail */
        } else if (eof_at > 0) {
            struct timespec ts = {0, 20 * 1000000L};
            nanosleep(&ts, NULL);
        }
        if (exited_at == 0 && waitpid(caller, &status, WNOHANG) == caller) exited_at = now_s();
    }
    captured[len] = '\0';
    int eof = eof_at > 0;
    if (exited_at == 0) {
        kill(caller, SIGKILL);
        waitpid(caller, &status, 0);
    }
    double eof_after = eof && exited_at > 0 ? fmax(0.0, eof_at - exited_at) : -1.0;
    close(err_pipe[0]);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "setsid grandchild: the caller ended with status 0x%x: %s",
          status, captured);
    CHECK(eof && exited_at > 0, "setsid grandchild: the caller's stderr %s (%s)",
          exited_at > 0 ? "stayed open after it exited" : "caller did not exit", captured);
    CHECK(strstr(captured, "[reward daemon] started") != NULL, "setsid grandchild: stderr not forwarded: %s", captured);
    printf("%-24s -> rewards [1, 2], caller's stderr at EOF %.2f s after it exited\n", "setsid grandchild", eof_after);
    pid_t daemon = read_pid_file("daemon.pid", 10.0); /* a setsid shell writes it: late on a loaded machine */
    CHECK(daemon > 0, "setsid grandchild: no daemon.pid");
    if (daemon > 0) kill_leftover(daemon);
    check_no_children("setsid grandchild");
}

static void test_reliability(void) {
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/colt-test-rewards-XXXXXX");
    COLT_ASSERT(mkdtemp(tmp_dir) != NULL);
    test_fp32_overflow();
    test_answers_twice();
    test_stderr_flood();
    test_crash_messages();
    test_killed_caller();
    test_setsid_grandchild();
    static const char *const files[] = {"sleep.pid", "daemon.pid", "hang.pid", "stderr.txt"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char path[128];
        snprintf(path, sizeof path, "%s/%s", tmp_dir, files[i]);
        unlink(path);
    }
    rmdir(tmp_dir);
}

/* ---------------------------------------------------------------------------
 * Python reward functions (TRL's signature)
 * ------------------------------------------------------------------------- */

/* The functions a TRL user writes, in a file colt imports. */
static const char REWARDS_PY[] =
    "import math\n"
    "import sys\n"
    "print('importing rewards.py', file=sys.stderr)\n"
    "\n"
    "# The TRL write-up's function, unchanged.\n"
    "def reward_len(completions, **kwargs):\n"
    "    return [-abs(20 - len(completion)) for completion in completions]\n"
    "\n"
    "alias = reward_len  # metrics use __name__, as TRL's do\n"
    "\n"
    "def plain(prompts, completions, completion_ids, **kwargs):\n"
    "    assert all(isinstance(p, str) for p in prompts), prompts\n"
    "    assert all(isinstance(c, str) for c in completions), completions\n"
    "    assert all(isinstance(i, int) for ids in completion_ids for i in ids), completion_ids\n"
    "    return [len(p) * 1000 + sum(ids) for p, ids in zip(prompts, completion_ids)]\n"
    "\n"
    "def conversational(prompts, completions, completion_ids, **kwargs):\n"
    "    out = []\n"
    "    for p, c, ids in zip(prompts, completions, completion_ids):\n"
    "        assert isinstance(p, list) and all(isinstance(m, dict) and set(m) == {'role', 'content'} for m in p), p\n"
    "        assert isinstance(c, list) and len(c) == 1 and c[0]['role'] == 'assistant', c\n"
    "        out.append(100 * len(p) + len(p[-1]['content']) + len(c[0]['content']) + 0.5 * len(ids))\n"
    "    return out\n"
    "\n"
    "def columns(completions, answer, level, **kwargs):\n"
    "    assert not {'prompt', 'completion'} & set(kwargs), sorted(kwargs)\n"
    "    assert kwargs['tags'] == [['a', 'b'], None], kwargs['tags']\n"
    "    return [10.0 * a + (-1 if l is None else l) for a, l in zip(answer, level)]\n"
    "\n"
    "def some_none(completions, **kwargs):\n"
    "    return [1.5, None, math.nan, True][:len(completions)]\n"
    "\n"
    "def divide(completions, **kwargs):\n"
    "    return [1 / 0 for c in completions]\n"
    "\n"
    "def wrong_length(completions, **kwargs):\n"
    "    return [1.0] * (len(completions) + 1)\n"
    "\n"
    "def not_number(completions, **kwargs):\n"
    "    return ['high' for c in completions]\n"
    "\n"
    "def infinite(completions, **kwargs):\n"
    "    return [math.inf for c in completions]\n"
    "\n"
    "def noisy(completions, **kwargs):\n"
    "    print('print() goes to stderr, not into the protocol')\n"
    "    return [7] * len(completions)\n"
    "\n"
    "async def asynchronous(completions, **kwargs):\n"
    "    return [2.5] * len(completions)\n"
    "\n"
    "calls = 0\n"
    "def counter(completions, **kwargs):\n"
    "    global calls\n"
    "    calls += 1\n"
    "    return [float(calls)] * len(completions)\n"
    "\n"
    "NOT_A_FUNCTION = 3\n";

static const char OTHER_PY[] =
    "import os, time\n"
    "def dies(completions, **kwargs):\n"
    "    os._exit(3)\n"
    "def slow(completions, **kwargs):\n"
    "    time.sleep(60)\n"
    "def fine(completions, **kwargs):\n"
    "    return [1] * len(completions)\n";

static char py_dir[64]; /* the Python files, and the current directory while these tests run */

static void write_text(const char *name, const char *text) {
    char path[128];
    snprintf(path, sizeof path, "%s/%s", py_dir, name);
    FILE *f = fopen(path, "w");
    COLT_ASSERT(f && fputs(text, f) >= 0 && fclose(f) == 0);
}

/* Code points, as Python's len(str). */
static int code_points(const char *s) {
    int n = 0;
    for (; *s; s++) n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

/* Runs r with token ids and compares with want (NaN = None). */
static void check_python(RewardFunc *r, const char *label, const char *const *completions, const int *const *ids,
                         const int *lens, json_t *const *rows, const float *want, int n) {
    char err[ERR_LEN] = "";
    float got[8];
    COLT_ASSERT(n <= 8);
    int rc = reward_compute(r, got, NULL, completions, ids, lens, rows, n, err);
    CHECK(rc == 0, "%s: %s", label, err);
    int equal = 0;
    for (int i = 0; rc == 0 && i < n; i++) {
        int same = isnan(want[i]) ? isnan(got[i]) : got[i] == want[i];
        equal += same;
        CHECK(same, "%s: completion %d: got %g, want %g", label, i, got[i], want[i]);
    }
    printf("%-34s %d/%d rewards as expected\n", label, equal, n);
}

/* A reward from JSON text or, when text_form, the JSON string it is. */
static RewardFunc *make_python(const char *spec, char *err) {
    if (spec[0] == '{') return make(spec, err);
    json_t *s = json_string(spec);
    RewardFunc *r = NULL;
    if (reward_create(&r, s, err) != 0) r = NULL;
    json_decref(s);
    return r;
}

static void test_python_values(void) {
    char err[ERR_LEN] = "";
    const char *completions[] = {"short", "exactly twenty chars", "a much longer completion than twenty", "日本語の文"};
    const int ids0[] = {5, 6}, ids1[] = {7}, ids2[] = {1, 2, 3}, ids3[] = {9, 9, 9, 9};
    const int *ids[] = {ids0, ids1, ids2, ids3};
    const int lens[] = {2, 1, 3, 4};
    json_t *row = json_loads("{\"prompt\": \"Tell me a story.\", \"answer\": 3}", 0, NULL);
    json_t *rows[] = {row, row, row, row};

    /* TRL's reward_len, by file path, against its formula. */
    RewardFunc *len_reward = make_python("rewards.py:reward_len", err);
    CHECK(len_reward && !strcmp(reward_name(len_reward), "reward_len"), "rewards.py:reward_len: %s",
          len_reward ? reward_name(len_reward) : err);
    if (!len_reward) return;
    float want[4];
    for (int i = 0; i < 4; i++) want[i] = -fabsf(20.0f - (float)code_points(completions[i]));
    check_python(len_reward, "reward_len -abs(20 - len)", completions, ids, lens, rows, want, 4);
    printf("  reward_len: %g %g %g %g\n", want[0], want[1], want[2], want[3]);

    /* Plain prompts are strings, completion_ids lists of ints. */
    RewardFunc *plain = make_python("rewards.py:plain", err);
    CHECK(plain != NULL, "rewards.py:plain: %s", err);
    if (plain) {
        float w[4];
        for (int i = 0; i < 4; i++) {
            int sum = 0;
            for (int k = 0; k < lens[i]; k++) sum += ids[i][k];
            w[i] = (float)(16 * 1000 + sum);
        }
        check_python(plain, "plain prompts, completion_ids", completions, ids, lens, rows, w, 4);
    }
    /* One worker for the file: the same process, the module imported once. */
    RewardFunc *alias = make_python("rewards.py:alias", err);
    CHECK(alias && !strcmp(reward_name(alias), "reward_len"), "alias: name %s (want __name__ reward_len)",
          alias ? reward_name(alias) : err);
    CHECK(alias && plain && reward_command_pid(alias) == reward_command_pid(len_reward) &&
              reward_command_pid(plain) == reward_command_pid(len_reward) && reward_command_pid(alias) > 0,
          "rewards of one file share one worker: pids %d %d %d", (int)reward_command_pid(len_reward),
          plain ? (int)reward_command_pid(plain) : 0, alias ? (int)reward_command_pid(alias) : 0);
    RewardFunc *counter1 = make_python("rewards.py:counter", err), *counter2 = make_python("rewards.py:counter", err);
    if (counter1 && counter2) {
        check_python(counter1, "module state: call 1", completions, ids, lens, rows, (const float[]){1, 1}, 2);
        check_python(counter2, "module state: call 2", completions, ids, lens, rows, (const float[]){2, 2}, 2);
    }
    reward_free(counter1);
    reward_free(counter2);

    /* None, NaN -> NaN (TRL's "no reward"); True -> 1. */
    RewardFunc *r = make_python("rewards.py:some_none", err);
    CHECK(r != NULL, "some_none: %s", err);
    if (r) check_python(r, "None and NaN -> NaN", completions, ids, lens, rows, (const float[]){1.5f, NAN, NAN, 1}, 4);
    reward_free(r);

    /* print() reaches stderr; async functions are awaited, as TRL does. */
    r = make_python("rewards.py:noisy", err);
    if (r) check_python(r, "print() in the function", completions, ids, lens, rows, (const float[]){7, 7}, 2);
    CHECK(r != NULL, "noisy: %s", err);
    reward_free(r);
    r = make_python("rewards.py:asynchronous", err);
    CHECK(r != NULL, "asynchronous: %s", err);
    if (r) check_python(r, "async function", completions, ids, lens, rows, (const float[]){2.5f, 2.5f}, 2);
    reward_free(r);

    /* The object form, by module (cwd on sys.path), with a name. */
    r = make_python("{\"type\": \"python\", \"module\": \"rewards\", \"function\": \"reward_len\", \"name\": \"len20\", "
                    "\"timeout\": 10}", err);
    CHECK(r && !strcmp(reward_name(r), "len20"), "object form, module: %s", r ? reward_name(r) : err);
    if (r) check_python(r, "object form (module, name)", completions, ids, lens, rows, want, 4);
    reward_free(r);
    r = make_python("{\"type\": \"python\", \"file\": \"rewards.py\", \"function\": \"reward_len\"}", err);
    CHECK(r != NULL, "object form, file: %s", err);
    if (r) check_python(r, "object form (file)", completions, ids, lens, rows, want, 4);
    reward_free(r);
    r = make_python("rewards.reward_len", err);
    CHECK(r != NULL, "module.function: %s", err);
    if (r) check_python(r, "text form module.function", completions, ids, lens, rows, want, 4);
    reward_free(r);

    /* Errors in a call: the function named, the exception's last line
     * quoted; the worker lives on for the next call. */
    struct {
        const char *function, *expect;
    } bad[] = {
        {"divide", "reward 'divide' (rewards.py): ZeroDivisionError: division by zero"},
        {"wrong_length", "reward 'wrong_length' (rewards.py): returned 5 rewards for 4 completions"},
        {"not_number", "reward 'not_number' (rewards.py): rewards[0] is str 'high', expected a number or None"},
        {"infinite", "reward 'infinite' (rewards.py): rewards[0] is inf, not a finite number"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char spec[64];
        snprintf(spec, sizeof spec, "rewards.py:%s", bad[i].function);
        r = make_python(spec, err);
        CHECK(r != NULL, "%s: %s", spec, err);
        if (!r) continue;
        float got[4];
        int rc = reward_compute(r, got, NULL, completions, ids, lens, rows, 4, err);
        CHECK(rc != 0 && strstr(err, bad[i].expect) == err && !strchr(err, '\n'),
              "%s: error \"%s\", want it to start with \"%s\"", spec, rc ? err : "(none)", bad[i].expect);
        printf("%-24s -> %s\n", bad[i].function, err);
        reward_free(r);
    }
    check_python(len_reward, "reward_len after the errors", completions, ids, lens, rows, want, 4);
    reward_free(alias);
    reward_free(plain);
    reward_free(len_reward);
    json_decref(row);
    check_no_children("python rewards");
}

/* A conversational dataset (loaded by dataset_load): prompts are message
 * lists, completions [{"role": "assistant", "content": text}]. */
static void test_python_conversational(void) {
    char err[ERR_LEN] = "";
    write_text("chat.jsonl",
               "{\"prompt\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": "
               "\"Hi\"}]}\n"
               "{\"prompt\": [{\"role\": \"user\", \"content\": \"What is 2+2?\"}]}\n");
    Dataset *d = NULL;
    int rc = dataset_load(&d, "chat.jsonl", err);
    CHECK(rc == 0 && dataset_is_conversational(d, 0), "chat.jsonl: %s", err);
    if (rc != 0) return;
    RewardFunc *r = make_python("rewards.py:conversational", err);
    CHECK(r != NULL, "conversational: %s", err);
    if (r) {
        const char *completions[] = {"Hello!", "4", "Four."};
        const int a[] = {1, 2, 3}, b[] = {4}, c[] = {5, 6};
        const int *ids[] = {a, b, c}, lens[] = {3, 1, 2};
        json_t *rows[] = {dataset_row(d, 0), dataset_row(d, 1), dataset_row(d, 1)};
        /* 100 x messages + len(last prompt message) + len(completion) + 0.5 x ids */
        const float want[] = {200 + 2 + 6 + 1.5f, 100 + 12 + 1 + 0.5f, 100 + 12 + 5 + 1.0f};
        check_python(r, "conversational rows", completions, ids, lens, rows, want, 3);
        reward_free(r);
    }
    dataset_free(d);
    char path[128];
    snprintf(path, sizeof path, "%s/chat.jsonl", py_dir);
    unlink(path);
}

/* Every column but prompt/completion arrives as a keyword list (None where a
 * row lacks it). */
static void test_python_columns(void) {
    char err[ERR_LEN] = "";
    RewardFunc *r = make_python("rewards.py:columns", err);
    CHECK(r != NULL, "columns: %s", err);
    if (!r) return;
    json_t *rows[] = {
        json_loads("{\"prompt\": \"p\", \"completion\": \"ref\", \"answer\": 3, \"level\": 2, \"tags\": [\"a\", \"b\"]}",
                   0, NULL),
        json_loads("{\"prompt\": \"q\", \"answer\": 4}", 0, NULL)};
    const char *completions[] = {"x", "y"};
    check_python(r, "dataset columns as keyword lists", completions, NULL, NULL, rows, (const float[]){32, 39}, 2);
    json_decref(rows[0]);
    json_decref(rows[1]);
    reward_free(r);
}

/* Mistakes found when the reward is created (load time), each one line. */
static void test_python_load_errors(void) {
    write_text("broken.py", "import colt_no_such_module\n");
    write_text("syntax.py", "def f(:\n");
    char cwd[4096];
    COLT_ASSERT(getcwd(cwd, sizeof cwd) != NULL);
    char missing_file[4200];
    snprintf(missing_file, sizeof missing_file,
             "reward 'f' (nofile.py): nofile.py not found (a relative path is from the current directory, %s)", cwd);
    struct {
        const char *spec, *expect;
    } cases[] = {
        {"nofile.py:f", missing_file},
        {"rewards.py:nope", "reward 'nope' (rewards.py): rewards.py has no function 'nope' (it defines: alias, "},
        {"rewards.py:NOT_A_FUNCTION", "'NOT_A_FUNCTION' in rewards.py is not callable (it is of type int)"},
        {"broken.py:f", "reward 'f' (broken.py): importing broken.py failed: ModuleNotFoundError: No module named "
                        "'colt_no_such_module'"},
        {"syntax.py:f", "reward 'f' (syntax.py): importing syntax.py failed: SyntaxError: invalid syntax (syntax.py, line 1)"},
        {"no_such_module.f", "importing no_such_module failed: ModuleNotFoundError: No module named 'no_such_module'"},
        {"reward_len", "reward \"reward_len\": a reward given as text must be \"PATH.py:FUNCTION\""},
        {"rewards.py:", "must be \"PATH.py:FUNCTION\""},
        {"{\"type\": \"python\", \"function\": \"f\"}", "python reward: give either \"file\""},
        {"{\"type\": \"python\", \"file\": \"rewards.txt\", \"function\": \"f\"}", "\"file\" must be the path of a .py"},
        {"{\"type\": \"python\", \"file\": \"rewards.py\", \"function\": \"f\", \"args\": 1}",
         "python reward: unknown key \"args\""},
        {"{\"type\": \"python\", \"file\": \"rewards.py\", \"function\": \"reward_len\", \"python\": "
         "\"/nonexistent/python3\"}",
         "exited with status 127 (command not found?)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char err[ERR_LEN] = "";
        double t0 = now_s();
        RewardFunc *r = make_python(cases[i].spec, err);
        double elapsed = now_s() - t0;
        CHECK(!r && strstr(err, cases[i].expect) && !strchr(err, '\n') && elapsed < 10.0,
              "%s: error \"%s\" (%.2f s) should contain \"%s\"", cases[i].spec, r ? "(none)" : err, elapsed,
              cases[i].expect);
        printf("create %-28.28s -> %s\n", cases[i].spec, err);
        reward_free(r);
    }
    char err[ERR_LEN] = "";
    RewardFunc *r = make_python("{\"type\": \"python\", \"file\": \"rewards.py\", \"function\": \"reward_len\", "
                                "\"python\": \"/nonexistent/python3\"}", err);
    CHECK(!r && strstr(err, "set COLT_PYTHON"), "missing interpreter: %s", err);
    reward_free(r);
    check_no_children("python load errors");
}

/* A worker that dies or hangs: the process error path, bounded by the timeout;
 * other rewards of the same file then fail, and say so. */
static void test_python_worker_failures(void) {
    write_text("other.py", OTHER_PY);
    const char *completions[] = {"a"};
    const int one[] = {1}, *ids[] = {one}, lens[] = {1};
    char err[ERR_LEN] = "";
    RewardFunc *dies = make_python("other.py:dies", err), *fine = make_python("other.py:fine", err);
    CHECK(dies && fine, "other.py: %s", err);
    if (dies && fine) {
        float got;
        int rc = reward_compute(dies, &got, NULL, completions, ids, lens, NULL, 1, err);
        CHECK(rc != 0 && strstr(err, "reward 'dies' (other.py): Python worker (python3) exited with status 3 without "
                                     "answering") == err,
              "worker exits: %s", rc ? err : "(no error)");
        printf("%-24s -> %s\n", "os._exit(3)", err);
        rc = reward_compute(fine, &got, NULL, completions, ids, lens, NULL, 1, err);
        CHECK(rc != 0 && strstr(err, "reward 'fine' (other.py): Python worker (python3) is no longer running"),
              "sibling after the worker died: %s", rc ? err : "(no error)");
    }
    reward_free(dies);
    reward_free(fine);
    RewardFunc *slow = make_python("{\"type\": \"python\", \"file\": \"other.py\", \"function\": \"slow\", \"timeout\": 1}",
                                   err);
    CHECK(slow != NULL, "slow: %s", err);
    if (slow) {
        float got;
        double t0 = now_s();
        int rc = reward_compute(slow, &got, NULL, completions, ids, lens, NULL, 1, err);
        double elapsed = now_s() - t0;
        CHECK(rc != 0 && strstr(err, "did not answer within 1 s (timeout); killed it") && elapsed < 3.0,
              "slow: %.2f s, %s", elapsed, rc ? err : "(no error)");
        printf("%-24s (%.2f s) -> %s\n", "time.sleep(60)", elapsed, err);
        double t1 = now_s();
        reward_free(slow);
        CHECK(now_s() - t1 < 2.0, "freeing a killed worker took %.2f s", now_s() - t1);
    }
    check_no_children("python worker g_failures");
}

static void test_python(void) {
    if (system("command -v python3 >/dev/null 2>&1") != 0) {
        printf("SKIP python rewards: python3 not found (colt runs python3 from PATH or $COLT_PYTHON)\n");
        return;
    }
    char saved_cwd[4096];
    COLT_ASSERT(getcwd(saved_cwd, sizeof saved_cwd) != NULL);
    snprintf(py_dir, sizeof py_dir, "/tmp/colt-test-pyrewards-XXXXXX");
    COLT_ASSERT(mkdtemp(py_dir) != NULL);
    write_text("rewards.py", REWARDS_PY);
    /* TRL users' paths are relative to where they run: the current directory. */
    COLT_ASSERT(chdir(py_dir) == 0);
    unsetenv("COLT_PYTHON");
    test_python_values();
    test_python_conversational();
    test_python_columns();
    test_python_load_errors();
    test_python_worker_failures();
    COLT_ASSERT(chdir(saved_cwd) == 0);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", py_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", py_dir);
}

int main(void) {
    test_specs();
    test_length();
    test_regex();
    test_extract();
    test_math_cases();
    test_math_gsm8k();
    test_math_math500();
    test_example_program();
    test_bad_programs();
    test_python();
    test_reliability();
    printf("%s: %d checks, %d failed\n", g_failures ? "FAIL" : "OK", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
