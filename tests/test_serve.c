/* test_serve.c — `colt serve` end to end: the built binary started on a free
 * port of 127.0.0.1 with the real stories260K, talked to with libcurl,
 * stopped with SIGTERM (and killed if it does not stop). Against `colt
 * generate` and `colt score`:
 * - greedy /v1/completions equals colt generate token for token, one prompt
 *   or several per request, to the end of the story (stop id) or a length;
 * - sampled with a seed (n completions, top-k / top-p / min-p / penalty)
 *   equals colt generate --seed with the same settings; without a seed, the
 *   completions of two requests and of one request's choices all differ;
 * - stop strings cut the text where colt generate's text has them;
 * - streaming (server-sent events) gives the same text and log-probs, and the
 *   log-probs are colt score's for greedy tokens;
 * - /v1/chat/completions (a chat template added to a copy of the model) equals
 *   colt generate --chat, whole and streamed;
 * - 50 concurrent clients (a bounded loop) get the answers they get alone;
 * - a client that disconnects has its sequences freed (in flight back to 0,
 *   far fewer tokens sampled than asked);
 * - 78 kinds of bad request get 400 with an OpenAI error object naming the
 *   problem, others 404 / 405 / 413, and the server keeps serving;
 * - /metrics counts what happened; SIGTERM lets a request in flight finish,
 *   then the server exits 0; bad flags are one-line errors. */
#include <curl/curl.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "serve_harness.h"

#define MODEL COLT_SOURCE_DIR "/models/stories260K"
#define REQUEST_TIMEOUT_MS 120000L

static const char *PROMPTS[] = {"Once upon a time", "Tom and Lily went to the park", "The little dog was sad because",
                                "One day, a girl named Sue"};
#define N_PROMPTS 4

/* ---------------------------------------------------------------- the server process */

/* Starts `colt serve ARGS --port 0`, waits (60 s at most) for its "listening" line. */
static bool server_start(Server *s, const char *name, const char *args) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s serve %s --port 0", COLT_BINARY, args);
    return serve_start(s, name, cmd, 60, false);
}

/* Sends sig and waits (timeout_s at most) for the exit; returns the exit code, or -1 (then it is killed). */
static int server_stop(Server *s, int sig, double timeout_s) { return serve_stop(s, sig, timeout_s); }

/* ---------------------------------------------------------------- HTTP */

/* One request (JSON headers); returns the HTTP status (0: no answer), *out the body (malloc'd). */
static long http(const Server *s, const char *method, const char *path, const char *body, char **out) {
    HttpBuf b = {0};
    return serve_perform(serve_request(s->port, method, path, body, &b, REQUEST_TIMEOUT_MS, http_json_headers()), &b,
                         out);
}

static json_t *post_json(const Server *s, const char *path, const char *body) {
    return serve_post_json(s->port, path, body, REQUEST_TIMEOUT_MS);
}

/* A completion's choices[i] fields. */
static json_t *choice(json_t *resp, int i) { return json_array_get(json_object_get(resp, "choices"), (size_t)i); }
static const char *choice_text(json_t *resp, int i, bool chat) {
    json_t *c = choice(resp, i);
    json_t *t = chat ? json_object_get(json_object_get(c, "message"), "content") : json_object_get(c, "text");
    return json_is_string(t) ? json_string_value(t) : "(none)";
}

/* ---------------------------------------------------------------- colt generate / score: the references */

/* colt generate --json ARGS: one {"ids", "text"} per completion. */
static json_t *generate_ref(const char *args) {
    char full[4096], *out;
    snprintf(full, sizeof full, "generate --json --device cpu %s", args);
    int rc = run_colt_with(&(ColtRun){.out = &out}, full, NULL);
    CHECK(rc == 0, "colt %s: exit %d", full, rc);
    json_t *list = json_array();
    for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) json_array_append_new(list, json_loads(line, 0, NULL));
    free(out);
    return list;
}

static bool same_ids(json_t *a, json_t *b) { return a && b && json_equal(a, b); }

/* Choice i of a response (return_token_ids) against reference line ref[i]: ids and text. */
static bool matches(json_t *resp, int i, json_t *ref, bool chat) {
    json_t *r = json_array_get(ref, (size_t)i);
    json_t *ids = json_object_get(choice(resp, i), "token_ids");
    const char *ref_text = json_string_value(json_object_get(r, "text"));
    return same_ids(ids, json_object_get(r, "ids")) && ref_text && strcmp(ref_text, choice_text(resp, i, chat)) == 0;
}

/* ---------------------------------------------------------------- the checks */

static void check_greedy_and_seeded(const Server *s) {
    int same = 0, total = 0;
    for (int p = 0; p < N_PROMPTS; p++) { /* greedy, to a length */
        int max_tokens = p == 0 ? 300 : 40;
        char *q = json_quoted(PROMPTS[p]), body[1024], args[1024];
        snprintf(body, sizeof body, "{\"prompt\": %s, \"max_tokens\": %d, \"temperature\": 0, \"return_token_ids\": true}",
                 q, max_tokens);
        snprintf(args, sizeof args, "--model %s --prompt %s --max_new_tokens %d", MODEL, q, max_tokens);
        json_t *resp = post_json(s, "/v1/completions", body), *ref = generate_ref(args);
        bool ok = resp && matches(resp, 0, ref, false);
        const char *finish = resp ? json_string_value(json_object_get(choice(resp, 0), "finish_reason")) : NULL;
        CHECK(ok, "greedy '%s': served %s, colt generate %s", PROMPTS[p], resp ? choice_text(resp, 0, false) : "-",
              json_string_value(json_object_get(json_array_get(ref, 0), "text")));
        CHECK(finish && !strcmp(finish, "length"), "greedy '%s': finish_reason %s", PROMPTS[p], finish ? finish : "-");
        same += ok, total++;
        json_decref(resp), json_decref(ref), free(q);
    }
    /* A stop id (stories260K never samples </s>: a token of the story is made one): the completion ends with
     * it, the text leaves it out (colt detokenize of the tokens before it). */
    {
        char args[512], body[512];
        snprintf(args, sizeof args, "--model %s --prompt \"Once upon a time\" --max_new_tokens 60", MODEL);
        json_t *ref = generate_ref(args), *ids = json_object_get(json_array_get(ref, 0), "ids");
        size_t at = 12; /* the 13th token, or where it first occurs */
        int stop_id = (int)json_integer_value(json_array_get(ids, at));
        snprintf(body, sizeof body, "{\"prompt\": \"Once upon a time\", \"max_tokens\": 60, \"temperature\": 0, "
                 "\"stop_token_ids\": [%d], \"return_token_ids\": true}", stop_id);
        json_t *resp = post_json(s, "/v1/completions", body);
        for (size_t k = at; k-- > 0;)
            if (json_integer_value(json_array_get(ids, k)) == stop_id) at = k;
        json_t *head = json_array();
        for (size_t k = 0; k <= at; k++) json_array_append(head, json_array_get(ids, k));
        json_t *before = json_array();
        for (size_t k = 0; k < at; k++) json_array_append(before, json_array_get(ids, k));
        json_t *wrapped = json_pack("{s:o}", "ids", before);
        char *line = json_dumps(wrapped, JSON_COMPACT), path[300], dargs[600], *out;
        json_decref(wrapped);
        snprintf(path, sizeof path, "%s/detok.jsonl", g_tmp);
        FILE *f = fopen(path, "w");
        fprintf(f, "%s\n", line);
        fclose(f);
        snprintf(dargs, sizeof dargs, "detokenize --model %s < %s", MODEL, path);
        run_colt_with(&(ColtRun){.out = &out}, dargs, NULL);
        json_t *d = json_loads(out, 0, NULL);
        const char *want = json_string_value(json_object_get(d, "text"));
        bool ok = resp && json_equal(json_object_get(choice(resp, 0), "token_ids"), head) && want &&
                  !strcmp(choice_text(resp, 0, false), want) &&
                  !strcmp(json_string_value(json_object_get(choice(resp, 0), "finish_reason")), "stop");
        printf("  stop id %d (token %zu of colt generate's): %s, \"%s\"\n", stop_id, at + 1,
               ok ? "ends there, finish_reason stop" : "WRONG", resp ? choice_text(resp, 0, false) : "");
        CHECK(ok, "stop_token_ids [%d]: served %s, expected the first %zu tokens and the text '%s'", stop_id,
              resp ? choice_text(resp, 0, false) : "-", at + 1, want ? want : "-");
        same += ok, total++;
        free(line), free(out), json_decref(d), json_decref(head), json_decref(resp), json_decref(ref);
    }
    printf("  greedy /v1/completions vs colt generate: %d/%d identical (ids and text)\n", same, total);

    /* Sampled with a seed, n completions (streams 0..n-1), several filters. */
    const char *settings[][2] = {
        {"\"temperature\": 0.8, \"top_k\": 40, \"top_p\": 0.9", "--temperature 0.8 --top_k 40 --top_p 0.9"},
        {"\"temperature\": 1.0, \"min_p\": 0.05, \"repetition_penalty\": 1.3",
         "--temperature 1.0 --min_p 0.05 --repetition_penalty 1.3"},
        {"\"temperature\": 1.2", "--temperature 1.2"},
    };
    same = total = 0;
    for (int k = 0; k < 3; k++) {
        char *q = json_quoted(PROMPTS[k]), body[1024], args[1024];
        snprintf(body, sizeof body, "{\"prompt\": %s, \"max_tokens\": 48, %s, \"seed\": %d, \"n\": 3, "
                 "\"return_token_ids\": true}", q, settings[k][0], 1000 + k);
        snprintf(args, sizeof args, "--model %s --prompt %s --max_new_tokens 48 %s --seed %d --n 3", MODEL, q,
                 settings[k][1], 1000 + k);
        json_t *resp = post_json(s, "/v1/completions", body), *ref = generate_ref(args);
        for (int i = 0; i < 3; i++) {
            bool ok = resp && matches(resp, i, ref, false);
            CHECK(ok, "seeded %s choice %d differs from colt generate --seed", settings[k][1], i);
            same += ok, total++;
        }
        CHECK(resp && strcmp(choice_text(resp, 0, false), choice_text(resp, 1, false)) != 0,
              "seeded %s: choices 0 and 1 are the same text (streams not used?)", settings[k][1]);
        json_decref(resp), json_decref(ref), free(q);
    }
    printf("  sampled with a seed (n=3, three settings) vs colt generate --seed: %d/%d identical\n", same, total);

    /* Several prompts in one request: prompt i's completion j is colt generate --prompts' line i*n+j. */
    char path[300];
    snprintf(path, sizeof path, "%s/prompts.jsonl", g_tmp);
    FILE *f = fopen(path, "w");
    json_t *list = json_array();
    for (int p = 0; p < 3; p++) {
        char *q = json_quoted(PROMPTS[p]);
        fprintf(f, "{\"prompt\": %s}\n", q);
        free(q);
        json_array_append_new(list, json_string(PROMPTS[p]));
    }
    fclose(f);
    char *prompts = json_dumps(list, JSON_COMPACT), body[2048], args[1024];
    snprintf(body, sizeof body, "{\"prompt\": %s, \"max_tokens\": 32, \"temperature\": 1.0, \"seed\": 77, \"n\": 2, "
             "\"return_token_ids\": true}", prompts);
    snprintf(args, sizeof args, "--model %s --prompts %s --max_new_tokens 32 --temperature 1.0 --seed 77 --n 2", MODEL,
             path);
    json_t *resp = post_json(s, "/v1/completions", body), *ref = generate_ref(args);
    same = 0;
    for (int i = 0; i < 6; i++) same += resp && matches(resp, i, ref, false);
    printf("  3 prompts x n=2 in one request vs colt generate --prompts: %d/6 identical\n", same);
    CHECK(same == 6, "3 prompts x 2: %d/6 identical to colt generate --prompts", same);
    json_t *usage = resp ? json_object_get(resp, "usage") : NULL;
    long long completion = 0;
    for (int i = 0; i < 6; i++) completion += (long long)json_array_size(json_object_get(choice(resp, i), "token_ids"));
    CHECK(usage && json_integer_value(json_object_get(usage, "completion_tokens")) == completion,
          "usage.completion_tokens is not the sum of the choices' tokens (%lld)", completion);
    json_decref(resp), json_decref(ref), json_decref(list), free(prompts);

    /* Without a seed: the server's one seed, RNG streams no other request uses. The same unseeded request
     * twice, and the 4 choices of one, all differ (stories260K samples 32 tokens at temperature 1). */
    const char *unseeded = "{\"prompt\": \"Once upon a time\", \"max_tokens\": 32, \"temperature\": 1.0, \"n\": 4, "
                           "\"return_token_ids\": true}";
    json_t *a = post_json(s, "/v1/completions", unseeded), *b = post_json(s, "/v1/completions", unseeded);
    int distinct = 0, pairs = 0;
    for (int i = 0; i < 8; i++)
        for (int j = i + 1; j < 8; j++) {
            json_t *ci = json_object_get(choice(i < 4 ? a : b, i % 4), "token_ids");
            json_t *cj = json_object_get(choice(j < 4 ? a : b, j % 4), "token_ids");
            pairs++;
            distinct += ci && cj && !json_equal(ci, cj);
        }
    printf("  unseeded, 2 requests x n=4 at temperature 1: %d/%d pairs of completions differ\n", distinct, pairs);
    CHECK(a && b && distinct == pairs, "unseeded requests: %d/%d pairs of completions differ (streams shared?)",
          distinct, pairs);
    json_decref(a), json_decref(b);
}

static void check_stop_strings(const Server *s) {
    char args[512], body[512];
    snprintf(args, sizeof args, "--model %s --prompt \"Once upon a time\" --max_new_tokens 60", MODEL);
    json_t *ref = generate_ref(args);
    const char *full = json_string_value(json_object_get(json_array_get(ref, 0), "text"));
    const char *stops[] = {" named", "park", "ZZZ-not-there"};
    for (int k = 0; k < 3; k++) {
        snprintf(body, sizeof body, "{\"prompt\": \"Once upon a time\", \"max_tokens\": 60, \"temperature\": 0, "
                 "\"stop\": [\"%s\", \"ZZZ\"]}", stops[k]);
        json_t *resp = post_json(s, "/v1/completions", body);
        const char *at = full ? strstr(full, stops[k]) : NULL;
        size_t expect_len = at ? (size_t)(at - full) : (full ? strlen(full) : 0);
        const char *text = resp ? choice_text(resp, 0, false) : "";
        const char *finish = resp ? json_string_value(json_object_get(choice(resp, 0), "finish_reason")) : "";
        bool ok = full && strlen(text) == expect_len && strncmp(text, full, expect_len) == 0 &&
                  !strcmp(finish, at ? "stop" : "length");
        printf("  stop \"%s\": \"%s\" (%s)\n", stops[k], text, finish);
        CHECK(ok, "stop '%s': got '%s' (%s), expected the first %zu bytes of '%s'", stops[k], text, finish, expect_len,
              full ? full : "-");
        json_decref(resp);
    }
    json_decref(ref);
}

/* The events of a stream: the concatenated text per choice, the log-probs, the finish reasons, usage. */
typedef struct Streamed {
    char text[4][4096];
    json_t *logprobs[4];
    char finish[4][16];
    int n_events, n_done;
    long long usage_completion;
    bool role_first[4], saw_role[4];
} Streamed;

static void parse_stream(const char *data, Streamed *st, bool chat) {
    memset(st, 0, sizeof *st);
    st->usage_completion = -1;
    for (int i = 0; i < 4; i++) st->logprobs[i] = json_array();
    const char *p = data;
    while ((p = strstr(p, "data: ")) != NULL) {
        p += 6;
        const char *end = strstr(p, "\n\n");
        if (!end) break;
        if (!strncmp(p, "[DONE]", 6)) {
            st->n_done++;
            p = end;
            continue;
        }
        json_t *o = json_loadb(p, (size_t)(end - p), 0, NULL);
        p = end;
        if (!o) continue;
        st->n_events++;
        json_t *u = json_object_get(o, "usage");
        if (u) st->usage_completion = json_integer_value(json_object_get(u, "completion_tokens"));
        json_t *c = json_array_get(json_object_get(o, "choices"), 0);
        if (c) {
            int i = (int)json_integer_value(json_object_get(c, "index"));
            if (i < 0 || i > 3) i = 0;
            json_t *delta = chat ? json_object_get(c, "delta") : c;
            json_t *t = json_object_get(delta, chat ? "content" : "text");
            if (chat && !st->saw_role[i]) st->role_first[i] = json_object_get(delta, "role") != NULL;
            st->saw_role[i] = true;
            if (json_is_string(t)) strncat(st->text[i], json_string_value(t), sizeof st->text[i] - strlen(st->text[i]) - 1);
            json_t *lp = json_object_get(c, "logprobs");
            json_t *vals = chat ? json_object_get(lp, "content") : json_object_get(lp, "token_logprobs");
            for (size_t k = 0; k < json_array_size(vals); k++) {
                json_t *v = chat ? json_object_get(json_array_get(vals, k), "logprob") : json_array_get(vals, k);
                json_array_append(st->logprobs[i], v);
            }
            json_t *f = json_object_get(c, "finish_reason");
            if (json_is_string(f)) snprintf(st->finish[i], sizeof st->finish[i], "%s", json_string_value(f));
        }
        json_decref(o);
    }
}

static void free_stream(Streamed *st) {
    for (int i = 0; i < 4; i++) json_decref(st->logprobs[i]);
}

static void check_streaming_and_logprobs(const Server *s) {
    const char *body = "{\"prompt\": \"Tom and Lily went to the park\", \"max_tokens\": 50, \"temperature\": 0, "
                       "\"logprobs\": 0, \"return_token_ids\": true, \"stop\": [\"ZZZ\"]}";
    json_t *whole = post_json(s, "/v1/completions", body);
    char sbody[1024], *out;
    snprintf(sbody, sizeof sbody, "%.*s, \"stream\": true, \"stream_options\": {\"include_usage\": true}}",
             (int)strlen(body) - 1, body);
    long status = http(s, "POST", "/v1/completions", sbody, &out);
    Streamed st;
    parse_stream(out, &st, false);
    json_t *lp = json_object_get(json_object_get(choice(whole, 0), "logprobs"), "token_logprobs");
    json_t *ids = json_object_get(choice(whole, 0), "token_ids");
    bool same_text = whole && !strcmp(st.text[0], choice_text(whole, 0, false));
    printf("  streamed: %d events, text %s the whole response's, log-probs %s, finish %s, usage %lld tokens, %d [DONE]\n",
           st.n_events, same_text ? "equal to" : "DIFFERENT from", json_equal(lp, st.logprobs[0]) ? "equal" : "DIFFER",
           st.finish[0], st.usage_completion, st.n_done);
    /* Each event carries what the engine made since the last read: with stories260K's decode at a few
     * ms for the 50 tokens, they may all come in one content event (then the usage chunk). */
    CHECK(status == 200 && st.n_events >= 2, "stream: status %ld, %d events", status, st.n_events);
    CHECK(same_text, "streamed text '%s' != '%s'", st.text[0], whole ? choice_text(whole, 0, false) : "-");
    CHECK(json_equal(lp, st.logprobs[0]), "streamed log-probs differ from the whole response's");
    CHECK(!strcmp(st.finish[0], json_string_value(json_object_get(choice(whole, 0), "finish_reason"))),
          "streamed finish_reason %s", st.finish[0]);
    CHECK(st.usage_completion == (long long)json_array_size(ids) && st.n_done == 1,
          "usage chunk %lld tokens (expected %zu), %d [DONE]", st.usage_completion, json_array_size(ids), st.n_done);
    free(out);
    free_stream(&st);

    /* Greedy log-probs are the model's: colt score of prompt + completion. */
    json_t *prompt_ids = json_object_get(choice(whole, 0), "prompt_token_ids");
    json_t *all = json_deep_copy(prompt_ids);
    json_array_extend(all, ids);
    json_t *wrapped = json_pack("{s:O}", "ids", all);
    char *line = json_dumps(wrapped, JSON_COMPACT), path[300], args[600];
    json_decref(wrapped);
    snprintf(path, sizeof path, "%s/score.jsonl", g_tmp);
    FILE *f = fopen(path, "w");
    fprintf(f, "%s\n", line);
    fclose(f);
    snprintf(args, sizeof args, "score --device cpu --model %s < %s", MODEL, path);
    char *scored;
    run_colt_with(&(ColtRun){.out = &scored}, args, NULL);
    json_t *score = json_loads(scored, 0, NULL), *sc = json_object_get(score, "logprobs");
    size_t n_prompt = json_array_size(prompt_ids), n = json_array_size(ids);
    double worst = sc ? 0 : INFINITY;
    for (size_t k = 0; sc && k < n; k++) {
        double a = json_real_value(json_array_get(lp, k)), b = json_number_value(json_array_get(sc, n_prompt - 1 + k));
        if (fabs(a - b) > worst) worst = fabs(a - b);
    }
    printf("  greedy log-probs vs colt score: %zu tokens, worst |diff| %.2g\n", n, worst);
    CHECK(n > 0 && worst < 1e-4, "greedy log-probs differ from colt score by %.3g", worst);
    free(line), free(scored), json_decref(all), json_decref(whole), json_decref(score);
}

static void check_chat(void) {
    /* A copy of stories260K with a chat template. */
    char dir[300];
    snprintf(dir, sizeof dir, "%s/chat-model", g_tmp);
    sh("mkdir -p %s && cp %s/config.json %s/model.safetensors %s/tokenizer.json %s/tokenizer_config.json %s/", dir,
       MODEL, MODEL, MODEL, MODEL, dir);
    char path[400];
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    FILE *f = fopen(path, "w");
    fputs("{% for m in messages %}{{ m['role'] }} said: {{ m['content'] }}\n{% endfor %}"
          "{% if add_generation_prompt %}Then{% endif %}", f);
    fclose(f);
    Server s;
    char args[600];
    snprintf(args, sizeof args, "--model %s --served_model_name stories-chat", dir);
    if (!server_start(&s, "chat", args)) return;
    const char *body = "{\"model\": \"stories-chat\", \"messages\": [{\"role\": \"user\", \"content\": \"Once upon a "
                       "time there was a cat\"}], \"max_tokens\": 40, \"temperature\": 0, \"return_token_ids\": true, "
                       "\"logprobs\": true}";
    json_t *resp = post_json(&s, "/v1/chat/completions", body);
    char gargs[600];
    snprintf(gargs, sizeof gargs, "--model %s --chat \"Once upon a time there was a cat\" --max_new_tokens 40", dir);
    json_t *ref = generate_ref(gargs);
    bool ok = resp && matches(resp, 0, ref, true);
    const char *role = resp ? json_string_value(json_object_get(json_object_get(choice(resp, 0), "message"), "role")) : 0;
    printf("  chat vs colt generate --chat: %s (\"%s\")\n", ok ? "identical" : "DIFFERENT", resp ? choice_text(resp, 0, true) : "");
    CHECK(ok && role && !strcmp(role, "assistant") && !strcmp(json_string_value(json_object_get(resp, "object")), "chat.completion"),
          "chat: served '%s', colt generate --chat '%s'", resp ? choice_text(resp, 0, true) : "-",
          json_string_value(json_object_get(json_array_get(ref, 0), "text")));
    json_t *content = json_object_get(json_object_get(choice(resp, 0), "logprobs"), "content");
    CHECK(json_array_size(content) == json_array_size(json_object_get(choice(resp, 0), "token_ids")),
          "chat logprobs.content has %zu entries", json_array_size(content));
    char sbody[1024], *out;
    snprintf(sbody, sizeof sbody, "%.*s, \"stream\": true}", (int)strlen(body) - 1, body);
    long status = http(&s, "POST", "/v1/chat/completions", sbody, &out);
    Streamed st;
    parse_stream(out, &st, true);
    bool same = resp && status == 200 && !strcmp(st.text[0], choice_text(resp, 0, true)) && st.role_first[0] &&
                st.n_done == 1;
    printf("  chat streamed: %d events, %s, first delta with the role: %s\n", st.n_events,
           same ? "same text" : "DIFFERENT", st.role_first[0] ? "yes" : "no");
    CHECK(same, "chat stream: '%s' vs '%s'", st.text[0], resp ? choice_text(resp, 0, true) : "-");
    free(out);
    free_stream(&st);
    json_decref(resp), json_decref(ref);

    /* Chat's bad requests (the template is there, so each fails for its own reason). */
    struct { const char *body, *needle; } bad[] = {
        {"{\"max_tokens\": 5}", "'messages' is required"},
        {"{\"messages\": []}", "non-empty list"},
        {"{\"messages\": {\"role\": \"user\"}}", "non-empty list"},
        {"{\"messages\": [\"hi\"]}", "must be an object"},
        {"{\"messages\": [{\"role\": \"wizard\", \"content\": \"hi\"}]}", "role must be one of"},
        {"{\"messages\": [{\"content\": \"hi\"}]}", "role must be one of"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": 5}]}", "content must be"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\", \"image_url\": {}}]}]}", "only text"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"top_logprobs\": 5}", "'top_logprobs' needs"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"logprobs\": true, \"top_logprobs\": 21}", "'top_logprobs' must be in [0, 20]"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"tool_choice\": \"required\"}", "tool_choice"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"response_format\": {\"type\": \"json_object\"}}", "response_format"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_completion_tokens\": 0}", "max_completion_tokens"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"chat_template_kwargs\": [1]}", "chat_template_kwargs"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"tools\": 5}", "tools"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"logprobs\": 1}", "'logprobs' must be true or false"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"model\": \"other\"}", "does not exist"},
    };
    int n400 = 0;
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        long st400 = http(&s, "POST", "/v1/chat/completions", bad[k].body, &out);
        json_t *e = json_loads(out, 0, NULL);
        const char *msg = json_string_value(json_object_get(json_object_get(e, "error"), "message"));
        bool ok400 = st400 == 400 && msg && strstr(msg, bad[k].needle);
        n400 += ok400;
        CHECK(ok400, "chat bad request %s: status %ld, %s (wanted '%s')", bad[k].body, st400, out, bad[k].needle);
        json_decref(e);
        free(out);
    }
    printf("  chat: %d/%zu bad requests answered 400 with the reason\n", n400, sizeof bad / sizeof bad[0]);

    /* Two signals: the second cuts what is in flight; the stream ends with an error event and [DONE]. */
    HttpBuf b = {0};
    const char *long_body = "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": 400, "
                            "\"n\": 8, \"ignore_eos\": true, \"stream\": true}";
    CURLM *multi = curl_multi_init();
    CURL *c = serve_request(s.port, "POST", "/v1/chat/completions", long_body, &b, REQUEST_TIMEOUT_MS,
                            http_json_headers());
    curl_multi_add_handle(multi, c);
    int running = 1, signals = 0;
    double deadline = now_s() + 60;
    while (running > 0 && now_s() < deadline) {
        curl_multi_perform(multi, &running);
        if (signals < 2 && b.len > 0) {
            kill(s.pid, SIGTERM);
            signals++;
            usleep(100 * 1000);
        }
        if (running > 0) curl_multi_poll(multi, NULL, 0, 50, NULL);
    }
    const char *tail = b.data ? b.data + (b.len > 300 ? b.len - 300 : 0) : "";
    bool cut = b.data && strstr(tail, "the server is shutting down") && strstr(tail, "data: [DONE]");
    int code = server_stop(&s, SIGTERM, 30);
    printf("  two SIGTERMs mid-stream: the stream %s; exit code %d\n",
           cut ? "ends with an error event and [DONE]" : "DID NOT END CLEANLY", code);
    CHECK(signals == 2 && cut, "a cut stream does not end with the error event and [DONE]: ...%s", tail);
    CHECK(code == 0, "chat server: exit %d after SIGTERM", code);
    curl_multi_remove_handle(multi, c);
    curl_easy_cleanup(c);
    curl_multi_cleanup(multi);
    free(b.data);
}

/* 50 clients at once, half streaming: each gets what it gets alone. */
#define N_CLIENTS 50
static void check_concurrent(const Server *s) {
    char bodies[N_CLIENTS][600];
    json_t *alone[N_CLIENTS];
    for (int i = 0; i < N_CLIENTS; i++) {
        char *q = json_quoted(PROMPTS[i % N_PROMPTS]);
        snprintf(bodies[i], sizeof bodies[i],
                 "{\"prompt\": %s, \"max_tokens\": %d, \"temperature\": %s, \"top_k\": %d, \"seed\": %d, \"n\": %d, "
                 "\"return_token_ids\": true%s}",
                 q, 8 + (i * 7) % 40, i % 3 == 0 ? "0" : "0.9", i % 5 == 0 ? 0 : 50, 500 + i, 1 + i % 3,
                 i % 4 == 1 ? ", \"stop\": [\" the\"]" : "");
        free(q);
        alone[i] = post_json(s, "/v1/completions", bodies[i]); /* the answer alone */
    }
    CURLM *multi = curl_multi_init();
    HttpBuf bufs[N_CLIENTS] = {0};
    CURL *handles[N_CLIENTS];
    char stream_bodies[N_CLIENTS][700];
    for (int i = 0; i < N_CLIENTS; i++) {
        const char *body = bodies[i];
        if (i % 2 == 1) { /* streamed */
            snprintf(stream_bodies[i], sizeof stream_bodies[i], "%.*s, \"stream\": true}", (int)strlen(bodies[i]) - 1,
                     bodies[i]);
            body = stream_bodies[i];
        }
        handles[i] = serve_request(s->port, "POST", "/v1/completions", body, &bufs[i], REQUEST_TIMEOUT_MS,
                                   http_json_headers());
        curl_multi_add_handle(multi, handles[i]);
    }
    double t0 = now_s(), deadline = t0 + 180;
    int running = N_CLIENTS;
    while (running > 0 && now_s() < deadline) { /* bounded: each transfer also has its own timeout */
        curl_multi_perform(multi, &running);
        if (running > 0) curl_multi_poll(multi, NULL, 0, 100, NULL);
    }
    double seconds = now_s() - t0;
    CHECK(running == 0, "%d of %d concurrent clients still running after 180 s", running, N_CLIENTS);
    int correct = 0;
    for (int i = 0; i < N_CLIENTS; i++) {
        long status = 0;
        curl_easy_getinfo(handles[i], CURLINFO_RESPONSE_CODE, &status);
        int n = 1 + i % 3;
        bool ok = status == 200 && alone[i];
        if (ok && i % 2 == 0) {
            json_t *resp = json_loads(bufs[i].data ? bufs[i].data : "", 0, NULL);
            for (int c = 0; ok && c < n; c++)
                ok = resp && json_equal(json_object_get(choice(resp, c), "token_ids"),
                                        json_object_get(choice(alone[i], c), "token_ids")) &&
                     !strcmp(choice_text(resp, c, false), choice_text(alone[i], c, false));
            json_decref(resp);
        } else if (ok) {
            Streamed st;
            parse_stream(bufs[i].data ? bufs[i].data : "", &st, false);
            for (int c = 0; ok && c < n; c++)
                ok = !strcmp(st.text[c], choice_text(alone[i], c, false)) &&
                     !strcmp(st.finish[c], json_string_value(json_object_get(choice(alone[i], c), "finish_reason")));
            ok = ok && st.n_done == 1;
            free_stream(&st);
        }
        correct += ok;
        CHECK(ok, "concurrent client %d (%s): status %ld, answer differs from the same request alone", i,
              i % 2 ? "streamed" : "whole", status);
        curl_multi_remove_handle(multi, handles[i]);
        curl_easy_cleanup(handles[i]);
        free(bufs[i].data);
        json_decref(alone[i]);
    }
    curl_multi_cleanup(multi);
    printf("  %d concurrent clients (half streaming): %d/%d answers equal to the request alone, %.2f s\n", N_CLIENTS,
           correct, N_CLIENTS, seconds);
}

/* The value of metric `name` (a line "name value"), or -1. */
static double metric(const Server *s, const char *name) { return serve_metric(s->port, NULL, name); }

/* A client that hangs up frees its sequences: none left in flight, far fewer tokens sampled than asked.
 * The waiting client asks for 128 x 400 tokens: more than the fastest CPU decodes before its 300 ms timeout
 * (8 x 400 once finished within it). */
static void check_disconnect(const Server *s) {
    for (int streamed = 0; streamed < 2; streamed++) {
        double before = metric(s, "colt_generation_tokens_total");
        const char *body = streamed ? "{\"prompt\": \"Once upon a time\", \"max_tokens\": 400, \"n\": 8, "
                                      "\"ignore_eos\": true, \"stream\": true}"
                                    : "{\"prompt\": \"Once upon a time\", \"max_tokens\": 400, \"n\": 128, "
                                      "\"ignore_eos\": true}";
        const double asked = streamed ? 8 * 400 : 128 * 400;
        HttpBuf b = {.abort_after = streamed ? 200 : 0};
        CURL *c = serve_request(s->port, "POST", "/v1/completions", body, &b, streamed ? REQUEST_TIMEOUT_MS : 300,
                               http_json_headers());
        CURLcode rc = curl_easy_perform(c); /* ends early: the write callback or the 300 ms timeout */
        curl_easy_cleanup(c);
        free(b.data);
        double deadline = now_s() + 10, in_flight = -1;
        while (now_s() < deadline && (in_flight = metric(s, "colt_sequences_in_flight")) != 0) usleep(20 * 1000);
        double sampled = metric(s, "colt_generation_tokens_total") - before;
        printf("  %s client hung up (curl: %s): %g sequences in flight after, %g of %g tokens sampled\n",
               streamed ? "streaming" : "waiting", curl_easy_strerror(rc), in_flight, sampled, asked);
        CHECK(rc != CURLE_OK, "the client did not hang up early");
        CHECK(in_flight == 0, "%g sequences still in flight 10 s after the client left", in_flight);
        CHECK(sampled >= 0 && sampled < asked, "%g tokens sampled for a client that left (%g asked)", sampled, asked);
    }
}

static void check_bad_requests(const Server *s) {
    char long_ids[8192] = "[1", mid_ids[4096] = "[1";
    for (int i = 1; i < 600; i++) strcat(long_ids, ",5");
    strcat(long_ids, "]");
    for (int i = 1; i < 300; i++) strcat(mid_ids, ",5");
    strcat(mid_ids, "]");
    char too_long[9000], too_much[6000], deep[9000] = "", many_stops[2000] = "{\"prompt\": \"a\", \"stop\": [";
    snprintf(too_long, sizeof too_long, "{\"prompt\": %s}", long_ids);
    snprintf(too_much, sizeof too_much, "{\"prompt\": %s, \"max_tokens\": 300}", mid_ids);
    for (int i = 0; i < 3000; i++) strcat(deep, "[");
    for (int i = 0; i < 17; i++) strcat(many_stops, i ? ", \"s\"" : "\"s\"");
    strcat(many_stops, "]}");
    struct { const char *body, *needle; } bad[] = {
        {"{", "not valid JSON"},
        {"", "not valid JSON"},
        {"[]", "must be a JSON object"},
        {"\"hi\"", "must be a JSON object"},
        {"3", "must be a JSON object"},
        {"{}", "'prompt' is required"},
        {"{\"prompt\": null}", "'prompt' is required"},
        {"{\"prompt\": 5}", "'prompt' must be"},
        {"{\"prompt\": []}", "'prompt' must be"},
        {"{\"prompt\": [\"a\", 5]}", "only strings or only lists"},
        {"{\"prompt\": [1, 99999]}", "token id in [0, 512)"},
        {"{\"prompt\": [-1]}", "token id in [0, 512)"},
        {"{\"prompt\": [[1, 2], \"a\"]}", "only strings or only lists"},
        {"{\"prompt\": [[]]}", "empty list"},
        {"{\"prompt\": \"a\", \"max_tokens\": \"10\"}", "'max_tokens' must be an integer"},
        {"{\"prompt\": \"a\", \"max_tokens\": 0}", "'max_tokens' must be in"},
        {"{\"prompt\": \"a\", \"max_tokens\": -5}", "'max_tokens' must be in"},
        {"{\"prompt\": \"a\", \"max_tokens\": 401}", "above this server's limit"},
        {"{\"prompt\": \"a\", \"max_tokens\": 1.5}", "'max_tokens' must be an integer"},
        {too_long, "maximum context length is 512"},
        {too_much, "maximum context length is 512"},
        {"{\"prompt\": \"a\", \"temperature\": \"hot\"}", "'temperature' must be a number"},
        {"{\"prompt\": \"a\", \"temperature\": -1}", "temperature must be >= 0"},
        {"{\"prompt\": \"a\", \"top_p\": 0}", "top_p must be in (0, 1]"},
        {"{\"prompt\": \"a\", \"top_p\": 1.5}", "top_p must be in (0, 1]"},
        {"{\"prompt\": \"a\", \"top_k\": -2}", "'top_k' must be in"},
        {"{\"prompt\": \"a\", \"top_k\": 1.5}", "'top_k' must be an integer"},
        {"{\"prompt\": \"a\", \"min_p\": 2}", "min_p must be in [0, 1]"},
        {"{\"prompt\": \"a\", \"repetition_penalty\": 0}", "repetition_penalty must be > 0"},
        {"{\"prompt\": \"a\", \"seed\": \"x\"}", "'seed' must be an integer"},
        {"{\"prompt\": \"a\", \"n\": 0}", "'n' must be in"},
        {"{\"prompt\": \"a\", \"n\": 1000}", "'n' must be in"},
        {"{\"prompt\": \"a\", \"n\": \"2\"}", "'n' must be an integer"},
        {"{\"prompt\": \"a\", \"stop\": 5}", "'stop' must be a string or a list"},
        {"{\"prompt\": \"a\", \"stop\": [\"x\", 5]}", "'stop'[1] must be"},
        {"{\"prompt\": \"a\", \"stop\": \"\"}", "'stop'[0] must be a non-empty"},
        {many_stops, "more than 16"},
        {"{\"prompt\": \"a\", \"stop_token_ids\": [9999]}", "'stop_token_ids'[0]"},
        {"{\"prompt\": \"a\", \"stop_token_ids\": 3}", "'stop_token_ids' must be a list"},
        {"{\"prompt\": \"a\", \"ignore_eos\": \"yes\"}", "'ignore_eos' must be true or false"},
        {"{\"prompt\": \"a\", \"stream\": \"true\"}", "'stream' must be true or false"},
        {"{\"prompt\": \"a\", \"stream_options\": {\"include_usage\": true}}", "only allowed with"},
        {"{\"prompt\": \"a\", \"stream\": true, \"stream_options\": 3}", "'stream_options' must be an object"},
        {"{\"prompt\": \"a\", \"logprobs\": 21}", "'logprobs' must be in [0, 20]"},
        {"{\"prompt\": \"a\", \"logprobs\": 2, \"stream\": true}", "'logprobs' is not supported with"},
        {"{\"prompt\": \"a\", \"logprobs\": true}", "'logprobs' must be an integer"},
        {"{\"prompt\": \"a\", \"echo\": true, \"stream\": true}", "'echo' is not supported with"},
        {"{\"prompt\": \"a\", \"echo\": 1}", "'echo' must be true or false"},
        {"{\"prompt\": \"a\", \"best_of\": 3}", "'best_of' other than n"},
        {"{\"prompt\": \"a\", \"suffix\": \"x\"}", "'suffix' is not supported"},
        {"{\"prompt\": \"a\", \"presence_penalty\": 2.5}", "presence_penalty must be in [-2, 2]"},
        {"{\"prompt\": \"a\", \"frequency_penalty\": -3}", "frequency_penalty must be in [-2, 2]"},
        {"{\"prompt\": \"a\", \"frequency_penalty\": \"a\"}", "'frequency_penalty' must be a number"},
        {"{\"prompt\": \"a\", \"logit_bias\": {\"99999\": 10}}", "'logit_bias' key '99999' must be a token id"},
        {"{\"prompt\": \"a\", \"logit_bias\": {\"05\": 1, \"5\": 2}}", "'logit_bias' names token 5 twice"},
        {"{\"prompt\": \"a\", \"logit_bias\": {\"5\": \"x\"}}", "'logit_bias'['5'] must be a number"},
        {"{\"prompt\": \"a\", \"logit_bias\": [5]}", "'logit_bias' must be an object"},
        {"{\"model\": \"gpt-4\", \"prompt\": \"a\"}", "does not exist"},
        {"{\"model\": 5, \"prompt\": \"a\"}", "'model' must be a string"},
        {"{\"prompt\": \"a\", \"foo\": 1}", "unrecognized request argument: 'foo'"},
        {"{\"prompt\": \"a\", \"prompt\": \"b\"}", "not valid JSON"},
        {"{\"prompt\": \"a\", \"user\": 5}", "'user' must be a string"},
        {deep, "not valid JSON"},
        {"{\"prompt\": \"\xff\xfe\"}", "not valid JSON"},
        {"{\"prompt\": \"a\", \"temperature\": NaN}", "not valid JSON"},
        {"{\"prompt\": \"a\", \"temperature\": 1e400}", "not valid JSON"},
        {"{\"prompt\": \"a\", \"n\": 200, \"prompt\": [\"a\"]}", "not valid JSON"},
        {"{\"prompt\": [\"a\", \"b\", \"c\", \"d\", \"e\", \"f\", \"g\", \"h\", \"i\"], \"n\": 128}", "more than 1024"},
        {"{\"prompt\": \"a\", \"max_tokens\": 1e10}", "'max_tokens' must be in"},
        {"{\"prompt\": \"a\", \"top_k\": 5000000000}", "'top_k' must be in"},
    };
    int n = (int)(sizeof bad / sizeof bad[0]), ok400 = 0;
    for (int k = 0; k < n; k++) {
        char *out;
        long status = http(s, "POST", "/v1/completions", bad[k].body, &out);
        json_t *e = json_loads(out, 0, NULL), *err = json_object_get(e, "error");
        const char *msg = json_string_value(json_object_get(err, "message"));
        const char *type = json_string_value(json_object_get(err, "type"));
        bool ok = status == 400 && msg && type && !strcmp(type, "invalid_request_error") && strstr(msg, bad[k].needle) &&
                  json_integer_value(json_object_get(err, "code")) == 400;
        ok400 += ok;
        CHECK(ok, "bad request %d (%.80s): status %ld, %.300s (wanted 400 with '%s')", k, bad[k].body, status, out,
              bad[k].needle);
        json_decref(e);
        free(out);
    }
    printf("  %d/%d kinds of bad request answered 400 with an OpenAI error naming the problem\n", ok400, n);

    /* Not 400s: wrong path, wrong method, a body over the limit (the server was started with 64 KiB). */
    char *big = malloc(100 * 1024);
    memset(big, ' ', 100 * 1024 - 1);
    big[100 * 1024 - 1] = '\0';
    memcpy(big, "{\"prompt\": \"a\"}", 15);
    struct { const char *method, *path, *body; long status; } other[] = {
        {"GET", "/v1/nothing", NULL, 404}, {"POST", "/", "{}", 404},          {"GET", "/v1/completions", NULL, 405},
        {"DELETE", "/v1/completions", NULL, 405}, {"POST", "/v1/models", "{}", 405}, {"POST", "/v1/completions", big, 413},
    };
    for (size_t k = 0; k < sizeof other / sizeof other[0]; k++) {
        char *out;
        long status = http(s, other[k].method, other[k].path, other[k].body, &out);
        json_t *e = json_loads(out, 0, NULL);
        CHECK(status == other[k].status && json_is_string(json_object_get(json_object_get(e, "error"), "message")),
              "%s %s: status %ld (wanted %ld), %.200s", other[k].method, other[k].path, status, other[k].status, out);
        printf("  %s %s -> %ld\n", other[k].method, other[k].path, status);
        json_decref(e);
        free(out);
    }
    free(big);
    char *out;
    CHECK(http(s, "GET", "/health", NULL, &out) == 200, "/health after the bad requests: not 200");
    free(out);
}

static void check_metrics(const Server *s) {
    char *out;
    long status = http(s, "GET", "/metrics", NULL, &out);
    const char *names[] = {"colt_requests_running", "colt_generation_tokens_per_second", "colt_kv_cache_usage_ratio",
                           "colt_sequences_waiting", "colt_time_to_first_token_seconds_count"};
    for (int k = 0; k < 5; k++) CHECK(status == 200 && strstr(out, names[k]), "/metrics has no %s", names[k]);
    free(out);
    double finished = metric(s, "colt_requests_finished_total"), tokens = metric(s, "colt_generation_tokens_total");
    double bad = metric(s, "colt_http_responses_total{class=\"4xx\"}"), blocks = metric(s, "colt_kv_cache_blocks");
    double ttft = metric(s, "colt_time_to_first_token_seconds_count");
    printf("  /metrics: %g requests finished, %g tokens sampled, %g 4xx answers, %g KV blocks, %g first tokens timed\n",
           finished, tokens, bad, blocks, ttft);
    CHECK(finished >= 100 && tokens > 3000 && bad >= 60 && blocks > 0 && ttft >= 100,
          "/metrics numbers too small for what the test sent");
}

/* SIGTERM while a request streams: it finishes whole, then the server exits 0 and refuses connections. */
static void check_sigterm_drain(Server *s) {
    HttpBuf b = {0};
    const char *body = "{\"prompt\": \"Once upon a time\", \"max_tokens\": 300, \"n\": 4, \"ignore_eos\": true, "
                       "\"stream\": true, \"stream_options\": {\"include_usage\": true}}";
    CURLM *multi = curl_multi_init();
    CURL *c = serve_request(s->port, "POST", "/v1/completions", body, &b, REQUEST_TIMEOUT_MS, http_json_headers());
    curl_multi_add_handle(multi, c);
    int running = 1;
    bool signalled = false;
    double deadline = now_s() + 120;
    while (running > 0 && now_s() < deadline) {
        curl_multi_perform(multi, &running);
        if (!signalled && b.len > 0) {
            kill(s->pid, SIGTERM);
            signalled = true;
        }
        if (running > 0) curl_multi_poll(multi, NULL, 0, 50, NULL);
    }
    Streamed st;
    parse_stream(b.data ? b.data : "", &st, false);
    int code = server_stop(s, SIGTERM, 60);
    printf("  SIGTERM mid-stream: the request ended with %lld tokens (1200 asked), finish %s/%s/%s/%s, %d [DONE]; "
           "exit code %d\n", st.usage_completion, st.finish[0], st.finish[1], st.finish[2], st.finish[3], st.n_done, code);
    CHECK(signalled, "the stream never started");
    CHECK(st.usage_completion == 1200 && st.n_done == 1 && !strcmp(st.finish[3], "length"),
          "the request in flight was not finished whole: %lld tokens", st.usage_completion);
    if (code != 0) {
        char *log = NULL;
        size_t len;
        file_read_all(s->log, &log, &len, NULL);
        CHECK(0, "colt serve exited %d after SIGTERM; its log:\n%s", code, log ? log : "(none)");
        free(log);
    }
    free_stream(&st);
    curl_multi_remove_handle(multi, c);
    curl_easy_cleanup(c);
    curl_multi_cleanup(multi);
    free(b.data);
    char *out;
    Server gone = {.port = s->port};
    CHECK(http(&gone, "GET", "/health", NULL, &out) == 0, "the port still answers after the server exited");
    free(out);
}

static void check_bad_flags(void) {
    struct { const char *args, *needle; } bad[] = {
        {"serve", "--model DIR is required"},
        {"serve --model " MODEL " --tensor_parallel_size 0", "--tensor_parallel_size must be >= 1"},
        {"serve --model " MODEL " --host example.com --port 0", "numeric IP address"},
        {"serve --model " MODEL " --port 70000", "--port must be in"},
        {"serve --model /nonexistent/model", "config.json"},
        {"serve --model " MODEL " --block_size 3", "power of two"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        char cmd[1024];
        snprintf(cmd, sizeof cmd, "%s %s > %s/flag_out 2> %s/flag_err", COLT_BINARY, bad[k].args, g_tmp, g_tmp);
        int status = system(cmd), code = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
        char *err = read_text(g_tmp, "flag_err");
        CHECK(code != 0 && code < 128 && err && count_lines(err) == 1 && strstr(err, bad[k].needle),
              "colt %s: exit %d, stderr %s (wanted one line with '%s')", bad[k].args, code, err ? err : "", bad[k].needle);
        printf("  colt %s -> exit %d: %s", bad[k].args, code, err ? err : "\n");
        free(err);
    }
}

int main(void) {
    snprintf(g_tmp, sizeof g_tmp, "/tmp/colt_test_serve_XXXXXX");
    if (!mkdtemp(g_tmp)) {
        perror("mkdtemp");
        return 1;
    }
    atexit(serve_kill_all);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    setenv("OMP_WAIT_POLICY", "passive", 0); /* the server and colt generate share the machine's cores */
    printf("bad flags\n");
    check_bad_flags();
    Server s;
    if (server_start(&s, "main", "--model " MODEL " --device cpu --max_tokens_limit 400 --max_body_kb 64")) {
        printf("colt serve on 127.0.0.1:%d\n", s.port);
        check_greedy_and_seeded(&s);
        check_stop_strings(&s);
        check_streaming_and_logprobs(&s);
        check_concurrent(&s);
        check_disconnect(&s);
        check_bad_requests(&s);
        check_metrics(&s);
        check_sigterm_drain(&s);
    }
    printf("chat\n");
    check_chat();
    serve_kill_all();
    curl_global_cleanup();
    sh("rm -rf %s", g_tmp);
    printf("test_serve: %d checks, %d failures\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
