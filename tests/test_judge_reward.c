/* test_judge_reward.c — the judge reward ({type: judge}, data/reward_judge.h) against a `colt serve` of
 * stories260K (a copy with a chat template that passes the user's text through), with an API key:
 *   - every reward of a batch of 20 (more than the 16 requests in flight at once, so finished requests make
 *     room for the rest) equals the first number of the server's own greedy answer to the same question, sent
 *     by this test (the test's request and parse, not the reward's); the rewards are not all equal;
 *   - {prompt} and {completion} are put into the prompt: the answer depends on both;
 *   - failures are one-line errors naming the completion: an answer without a number, a wrong key (HTTP 401),
 *     an unknown model (HTTP 4xx), nothing listening, and a server that accepts but never answers (given up
 *     after the 1 s timeout, not waited for);
 *   - bad specs (no url, no {completion}, unknown keys, an unset api_key_env, bad timeout / max_tokens);
 *   - the first-number rule on texts. */
#include <jansson.h>
#include <math.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/error.h"
#include "data/reward_judge.h"
#include "data/rewards.h"
#include "harness.h"
#include "serve_harness.h"

#define MODEL COLT_SOURCE_DIR "/models/stories260K"
#define KEY "judge-test-key"

/* Greedy answers of stories260K to these questions: "Score: 9 9 9 9" is continued with a number, "10" for
 * most stories and "1" for one; "Score: 2 4 6 8" after "The sun" with words alone. */
#define TEMPLATE "{prompt}: {completion}. Score: 9 9 9 9"
static const char *STORIES[] = {"a cat sat", "Tom ran",   "a dog",     "the sun",       "Lily was happy",
                                "Sue had a ball", "the big tree", "Ben and Mia", "a red car", "the bird sang"};
#define N_STORIES 10
#define N_BATCH 20

static void test_first_number(void) {
    const struct {
        const char *text;
        bool found;
        double value;
    } cases[] = {{"10, he said", true, 10},  {"00 many things", true, 0}, {"score: -3.5 points", true, -3.5},
                 {"about .5", true, 0.5},    {"1e3 stars", true, 1000},   {"0x1f", true, 0},
                 {"v2.0 is out", true, 2.0}, {"abc-2", true, -2},         {"e5", true, 5},
                 {"7e", true, 7},            {"no digits here", false, 0}, {"", false, 0}};
    int ok = 0, n = (int)(sizeof cases / sizeof cases[0]);
    for (int i = 0; i < n; i++) {
        double v = NAN;
        bool found = reward_judge_first_number(cases[i].text, &v);
        bool good = found == cases[i].found && (!found || v == cases[i].value);
        ok += good;
        CHECK(good, "first number of \"%s\": found %d, %g; want %d, %g", cases[i].text, found, v, cases[i].found,
              cases[i].value);
    }
    printf("first number: %d/%d texts\n", ok, n);
}

static json_t *spec_for(int port, const char *model, const char *template, const char *key_env) {
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1", port);
    json_t *spec = json_pack("{s:s, s:s, s:s, s:s, s:f, s:i}", "type", "judge", "url", url, "model", model, "prompt",
                             template, "timeout", 60.0, "max_tokens", 8);
    if (key_env) json_object_set_new(spec, "api_key_env", json_string(key_env));
    return spec;
}

/* The server's greedy answer to text, asked by this test: the number its answer starts with, NAN without one. */
static double reference(int port, const char *text, char *answer, size_t cap) {
    char *quoted = json_quoted(text), body[2048];
    snprintf(body, sizeof body,
             "{\"model\": \"judge\", \"messages\": [{\"role\": \"user\", \"content\": %s}], \"max_tokens\": 8, "
             "\"temperature\": 0}",
             quoted);
    free(quoted);
    json_t *o = serve_post_json(port, "/v1/chat/completions", body, 60000L);
    const char *content =
        json_string_value(json_object_get(json_object_get(json_array_get(json_object_get(o, "choices"), 0), "message"),
                                          "content"));
    snprintf(answer, cap, "%s", content ? content : "");
    /* the first digit, read by strtod (these answers have no signs or fractions before it) */
    const char *digit = content ? strpbrk(content, "0123456789") : NULL;
    double v = digit ? strtod(digit, NULL) : NAN;
    json_decref(o);
    return v;
}

/* rc and err of one batch of the reward given by spec. */
static int run_judge(json_t *spec, const char *const *prompts, const char *const *completions, int n, float *rewards,
                     char *err) {
    RewardFunc *r = NULL;
    int rc = reward_create(&r, spec, err);
    json_decref(spec);
    if (rc != 0) return rc;
    rc = reward_compute(r, rewards, prompts, completions, NULL, NULL, NULL, n, err);
    reward_free(r);
    return rc;
}

static void expect_error(const char *what, int rc, const char *err, const char *n1, const char *n2) {
    CHECK(rc != 0 && strstr(err, n1) && (!n2 || strstr(err, n2)) && !strchr(err, '\n'), "%s: rc %d, '%s' lacks '%s'",
          what, rc, err, n1);
    printf("  %-34s -> %s\n", what, err);
}

static void test_against_server(void) {
    char dir[300];
    snprintf(dir, sizeof dir, "%s/judge-model", g_tmp);
    sh("mkdir -p %s && cp %s/config.json %s/model.safetensors %s/tokenizer.json %s/tokenizer_config.json %s/", dir,
       MODEL, MODEL, MODEL, MODEL, dir);
    char path[400];
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    FILE *f = fopen(path, "w");
    if (f) fputs("{% for m in messages %}{{ m['content'] }}{% endfor %}", f), fclose(f);
    Server s;
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "env COLT_API_KEY=" KEY " %s serve --model %s --served_model_name judge --port 0",
             COLT_BINARY, dir);
    if (!serve_start(&s, "judge", cmd, 60, false)) return;

    /* 1. a batch: the rewards are the server's numbers */
    const char *prompts[N_BATCH], *completions[N_BATCH];
    for (int i = 0; i < N_BATCH; i++) prompts[i] = "Story", completions[i] = STORIES[i % N_STORIES];
    float rewards[N_BATCH];
    char err[ERR_LEN] = "";
    double t0 = now_s();
    int rc = run_judge(spec_for(s.port, "judge", TEMPLATE, "JUDGE_TEST_KEY"), prompts, completions, N_BATCH, rewards,
                       err);
    double seconds = now_s() - t0;
    CHECK(rc == 0, "judge batch: %s", err);
    int same = 0;
    double lo = INFINITY, hi = -INFINITY;
    for (int i = 0; rc == 0 && i < N_BATCH; i++) {
        char text[256], answer[512];
        snprintf(text, sizeof text, "Story: %s. Score: 9 9 9 9", completions[i]);
        double want = reference(s.port, text, answer, sizeof answer);
        bool good = rewards[i] == (float)want;
        same += good;
        CHECK(good, "completion %d (\"%s\"): reward %g, the server's answer \"%s\" starts with %g", i, completions[i],
              rewards[i], answer, want);
        lo = fmin(lo, rewards[i]), hi = fmax(hi, rewards[i]);
    }
    printf("judge: %d/%d rewards are the first number of the server's greedy answer (range %g .. %g), %.2f s\n", same,
           N_BATCH, lo, hi, seconds);
    CHECK(hi > lo, "every completion got the same reward: the check is vacuous");

    /* 2. {prompt} counts: completion 0's story after another prompt gets another number (1, not 10) */
    const char *p2 = "Ben and Mia", *c2 = STORIES[0];
    char answer[512];
    double want = reference(s.port, "Ben and Mia: a cat sat. Score: 9 9 9 9", answer, sizeof answer);
    float r2 = NAN;
    rc = run_judge(spec_for(s.port, "judge", TEMPLATE, "JUDGE_TEST_KEY"), &p2, &c2, 1, &r2, err);
    printf("judge: prompt \"%s\" before \"%s\": reward %g (after \"Story\": %g), the server's answer \"%s\"\n", p2,
           c2, r2, rewards[0], answer);
    CHECK(rc == 0 && r2 == (float)want && r2 != rewards[0], "the prompt's reward %g (%s), the server's %g, after "
          "\"Story\" %g", r2, rc ? err : "", want, rewards[0]);

    /* 3. one-line errors naming the completion */
    /* only completion 1's answer lacks a number (a batch stops at its first failure, so one fails) */
    const char *sun[2] = {"a cat sat", "The sun"}, *story2[2] = {"Story", "Story"};
    const char *split_prompts[2] = {"Story: a cat sat. Score: 9 9 9 ", "Story: The sun. Score: 2 4 6 "};
    const char *split_completions[2] = {"9", "8"};
    double none = reference(s.port, "Story: The sun. Score: 2 4 6 8", answer, sizeof answer);
    CHECK(isnan(none), "the server's answer to 'The sun' has a number (\"%s\"): pick another text", answer);
    rc = run_judge(spec_for(s.port, "judge", "{prompt}{completion}", "JUDGE_TEST_KEY"), split_prompts,
                   split_completions, 2, rewards, err);
    expect_error("an answer without a number", rc, err, "completion 1", "has no number");
    rc = run_judge(spec_for(s.port, "judge", TEMPLATE, NULL), story2, sun, 1, rewards, err);
    expect_error("no key", rc, err, "completion 0", "HTTP 401");
    rc = run_judge(spec_for(s.port, "nobody", TEMPLATE, "JUDGE_TEST_KEY"), story2, sun, 1, rewards, err);
    expect_error("an unknown model", rc, err, "completion 0", "answered HTTP 4");
    serve_stop(&s, SIGTERM, 30);

    rc = run_judge(spec_for(free_port(), "judge", TEMPLATE, NULL), story2, sun, 1, rewards, err);
    expect_error("nothing listening", rc, err, "completion 0", "the judge at http://127.0.0.1:");
    /* a server that accepts connections (the kernel's backlog) and never answers */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    bool listening = fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && listen(fd, 16) == 0 &&
                     getsockname(fd, (struct sockaddr *)&a, &len) == 0;
    CHECK(listening, "a silent listener could not be made");
    if (listening) {
        json_t *spec = spec_for(ntohs(a.sin_port), "judge", TEMPLATE, NULL);
        json_object_set_new(spec, "timeout", json_real(1.0));
        t0 = now_s();
        rc = run_judge(spec, story2, sun, 2, rewards, err);
        double waited = now_s() - t0;
        expect_error("a judge that never answers", rc, err, "within 1 s (timeout)", "completion ");
        CHECK(waited < 10, "the silent judge held the batch %.1f s (timeout 1 s)", waited);
    }
    if (fd >= 0) close(fd);
}

static void test_bad_specs(void) {
    char err[ERR_LEN] = "";
    const struct {
        const char *json, *needle;
    } bad[] = {
        {"{\"type\": \"judge\", \"model\": \"m\", \"prompt\": \"{completion}\"}", "\"url\" must be"},
        {"{\"type\": \"judge\", \"url\": \"ftp://x/v1\", \"model\": \"m\", \"prompt\": \"{completion}\"}", "http://"},
        {"{\"type\": \"judge\", \"url\": \"http://x/v1\", \"prompt\": \"{completion}\"}", "\"model\" must be"},
        {"{\"type\": \"judge\", \"url\": \"http://x/v1\", \"model\": \"m\", \"prompt\": \"rate {prompt}\"}",
         "{completion}"},
        {"{\"type\": \"judge\", \"url\": \"http://x/v1\", \"model\": \"m\", \"prompt\": \"{completion}\", \"temp\": 1}",
         "unknown key \"temp\""},
        {"{\"type\": \"judge\", \"url\": \"http://x/v1\", \"model\": \"m\", \"prompt\": \"{completion}\", "
         "\"api_key_env\": \"COLT_TEST_NO_SUCH_VARIABLE\"}",
         "COLT_TEST_NO_SUCH_VARIABLE is not set"},
        {"{\"type\": \"judge\", \"url\": \"http://x/v1\", \"model\": \"m\", \"prompt\": \"{completion}\", "
         "\"timeout\": -1}",
         "\"timeout\" must be"},
        {"{\"type\": \"judge\", \"url\": \"http://x/v1\", \"model\": \"m\", \"prompt\": \"{completion}\", "
         "\"max_tokens\": 0}",
         "\"max_tokens\" must be"},
        {"{\"type\": \"judges\"}", "judge)"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        json_t *spec = json_loads(bad[i].json, 0, NULL);
        RewardFunc *r = NULL;
        int rc = reward_create(&r, spec, err);
        json_decref(spec);
        CHECK(r == NULL, "a failed create left an object");
        expect_error(bad[i].json, rc, err, bad[i].needle, NULL);
    }
}

int main(void) {
    snprintf(g_tmp, sizeof g_tmp, "/tmp/colt_test_judge_reward_XXXXXX");
    if (!mkdtemp(g_tmp)) return 1;
    atexit(serve_kill_all);
    setenv("COLT_API_KEY", KEY, 1); /* this test's own requests (serve_harness.h) */
    setenv("JUDGE_TEST_KEY", KEY, 1);
    test_first_number();
    test_bad_specs();
    test_against_server();
    sh("rm -rf %s", g_tmp);
    printf("%d checks, %d failures\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
