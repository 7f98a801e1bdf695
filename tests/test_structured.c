/* test_structured.c — structured outputs (engine/structured.h) on the CPU backend: regex-constrained
 * completions, greedy and sampled with many seeds, through the engine and generate(), all full matches
 * (structured_cases.h); the errors (a bad regex with PCRE2's message and offset, a regex nothing
 * matches, one no token can start, a completion no token continues, no stop id, another vocabulary);
 * masks on a hand-made vocabulary; and with ../shared/data the mask's cost on Qwen2.5's 151k-token
 * vocabulary, each token of a tokenized match allowed at its step. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/log.h"
#include "model/model.h"

#include "harness.h"
#include "shared_data.h"
#include "structured_cases.h"

static bool allowed(const uint32_t *mask, int id) { return mask[id >> 5] >> (id & 31) & 1u; }

/* A vocabulary of a few strings (ids in order), for masks worked out by hand. */
static int small_regex(TokenRegex **re, const char *pattern, const char *const *tokens, int n, char *err) {
    uint32_t lens[16];
    for (int v = 0; v < n; v++) lens[v] = tokens[v] ? (uint32_t)strlen(tokens[v]) : 0;
    return token_regex_create(re, pattern, tokens, lens, n, err);
}

static void test_small_vocab(void) {
    char err[ERR_LEN];
    /* ids: 0 eos (no bytes), 1 "1", 2 "12", 3 "123", 4 "a", 5 "1a", 6 "12345" */
    const char *vocab[] = {NULL, "1", "12", "123", "a", "1a", "12345"};
    const int stop[] = {0};
    TokenRegex *re = NULL;
    CHECK(small_regex(&re, "\\d{2,4}", vocab, 7, err) == 0, "%s", err);
    if (!re) return;
    uint32_t mask[1];
    int n = token_regex_mask(re, mask, NULL, 0, stop, 1);
    CHECK(n == 3 && allowed(mask, 1) && allowed(mask, 2) && allowed(mask, 3) && !allowed(mask, 0) &&
              !allowed(mask, 6),
          "\\d{2,4} at the start: want {1, 12, 123} (got %d ids, mask %#x)", n, mask[0]);
    const int one[] = {1};
    n = token_regex_mask(re, mask, one, 1, stop, 1);
    CHECK(n == 3 && allowed(mask, 1) && allowed(mask, 2) && allowed(mask, 3) && !allowed(mask, 0),
          "after '1': want {1, 12, 123}, no eos yet (got %d, %#x)", n, mask[0]);
    const int twelve[] = {2};
    n = token_regex_mask(re, mask, twelve, 1, stop, 1);
    CHECK(n == 3 && allowed(mask, 0) && allowed(mask, 1) && allowed(mask, 2) && !allowed(mask, 3),
          "after '12': want {eos, 1, 12} (got %d, %#x)", n, mask[0]);
    const int full[] = {2, 2};
    n = token_regex_mask(re, mask, full, 2, stop, 1);
    CHECK(n == 1 && allowed(mask, 0), "after '1212' (complete, not extensible): want eos alone (got %d, %#x)", n,
          mask[0]);
    CHECK(token_regex_full_match(re, "1234", 4) && !token_regex_full_match(re, "1", 1) &&
              !token_regex_full_match(re, "12345", 5),
          "full matches of \\d{2,4}");
    token_regex_free(re);

    /* a stop id with bytes of its own ('1') is allowed only after a full match */
    const int stop_one[] = {1};
    CHECK(small_regex(&re, "(12|1)+", vocab, 7, err) == 0, "%s", err);
    if (re) {
        n = token_regex_mask(re, mask, NULL, 0, stop_one, 1);
        CHECK(!allowed(mask, 1) && allowed(mask, 2), "a stop id with bytes before a full match (mask %#x)", mask[0]);
        token_regex_free(re);
    }

    /* the errors */
    re = NULL;
    int rc = small_regex(&re, "(ab", vocab, 7, err);
    CHECK(rc != 0 && strstr(err, "missing closing parenthesis") && strstr(err, "offset 3") && !strchr(err, '\n'),
          "bad regex: got '%s'", rc ? err : "no error");
    printf("  bad regex:           %s\n", err);
    rc = small_regex(&re, "a(?!)", vocab, 7, err);
    CHECK(rc != 0 && strstr(err, "matches no text"), "unsatisfiable regex: got '%s'", rc ? err : "no error");
    printf("  unsatisfiable regex: %s\n", err);
    rc = small_regex(&re, "b+", vocab, 7, err);
    CHECK(rc != 0 && strstr(err, "no token of the vocabulary"), "regex no token starts: got '%s'",
          rc ? err : "no error");
    printf("  no token starts it:  %s\n", err);
    token_regex_free(re);
    /* 'a' then only tokens that start with a digit: "ab" has no continuation after 'a' */
    const char *dead_vocab[] = {NULL, "a", "1b"};
    CHECK(small_regex(&re, "ab", dead_vocab, 3, err) == 0, "%s", err);
    if (re) {
        const int a[] = {1};
        n = token_regex_mask(re, mask, a, 1, stop, 1);
        CHECK(n == 0, "after 'a' of 'ab' with no token 'b': want nothing allowed (got %d)", n);
        token_regex_free(re);
    }
}

/* The engine and generate() refuse what they cannot honour, with one line. */
static void test_generation_errors(void) {
    char err[ERR_LEN];
    Tokenizer *tok = NULL;
    Model *m = NULL;
    if (tokenizer_load(&tok, STRUCTURED_MODEL, err) != 0 || model_load(&m, STRUCTURED_MODEL, backend_cpu(), err) != 0) {
        CHECK(0, "%s", err);
        tokenizer_free(tok);
        return;
    }
    int vocab = model_config(m)->vocab_size, stop[] = {2};
    TokenRegex *re = NULL, *other = NULL;
    CHECK(prompt_regex_constraint(&re, tok, vocab, "\\d+", err) == 0, "%s", err);
    CHECK(prompt_regex_constraint(&other, tok, vocab - 1, "\\d+", err) == 0, "%s", err);
    Requests r;
    make_requests(&r, vocab);
    GenerateOptions opt = {.sampling = sampling_params_greedy(), .max_new_tokens = 8, .regex = re};
    int rc = engine_generate(m, r.seqs, N_SEQS, &opt, NULL, NULL, err);
    CHECK(rc != 0 && strstr(err, "stop id"), "no stop id: got '%s'", rc ? err : "no error");
    printf("  no stop id:          %s\n", err);
    opt.stop_ids = stop, opt.n_stop_ids = 1, opt.regex = other;
    rc = generate(m, r.seqs, N_SEQS, &opt, err);
    CHECK(rc != 0 && strstr(err, "token ids"), "another vocabulary: got '%s'", rc ? err : "no error");
    printf("  another vocabulary:  %s\n", err);
    free_requests(&r);
    token_regex_free(other);
    token_regex_free(re);
    model_free(m);
    tokenizer_free(tok);
}

/* The real vocabulary: for each regex, a matching text tokenized by the tokenizer must be allowed token by
 * token and end where only a full match allows eos; the mask's cost per step, uncached. */
static void test_qwen_vocab(void) {
    if (!shared_data_present()) {
        shared_data_skipped("structured outputs on Qwen2.5's vocabulary");
        return;
    }
    char err[ERR_LEN];
    Tokenizer *tok = NULL;
    if (tokenizer_load(&tok, COLT_SHARED_DATA "/qwen2.5-tokenizer", err) != 0) {
        CHECK(0, "%s", err);
        return;
    }
    const int V = 151936, eos = tokenizer_token_id(tok, "<|im_end|>");
    static const struct {
        const char *pattern, *text;
    } cases[] = {
        {"\\d{1,4}", "2024"},
        {"(yes|no)", "yes"},
        {"\\{\"name\": \"[a-z]{1,6}\", \"age\": \\d{1,3}\\}", "{\"name\": \"alice\", \"age\": 42}"},
        {"[a-z ]{0,24} the end\\.", "once upon a time the end."},
        {"[^\"]{0,64}", "a permissive class: almost every token stays viable"},
    };
    uint32_t *mask = xmalloc(sizeof(uint32_t) * (size_t)(V + 31) / 32);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        TokenRegex *re = NULL;
        double t0 = time_now();
        if (prompt_regex_constraint(&re, tok, V, cases[c].pattern, err) != 0) {
            CHECK(0, "%s", err);
            continue;
        }
        double setup = time_now() - t0;
        int *ids = NULL;
        size_t n = 0;
        CHECK(tokenizer_encode(tok, cases[c].text, strlen(cases[c].text), &ids, &n, err) == 0, "%s", err);
        bool ok = true;
        int min_allowed = V, max_allowed = 0;
        char text[256];
        size_t len = 0;
        for (size_t k = 0; k <= n; k++) {
            int got = token_regex_mask(re, mask, ids, (int)k, &eos, 1);
            if (got < min_allowed) min_allowed = got;
            if (got > max_allowed) max_allowed = got;
            /* eos exactly where the text so far is a full match (always at the end) */
            bool full = token_regex_full_match(re, text, len);
            if ((k < n && !allowed(mask, ids[k])) || allowed(mask, eos) != full || (k == n && !full)) ok = false;
            if (k < n) {
                size_t l;
                const char *b = tokenizer_token_bytes(tok, ids[k], &l);
                if (b && len + l < sizeof text) memcpy(text + len, b, l), len += l;
            }
        }
        TokenRegexStats st;
        token_regex_stats(re, &st);
        CHECK(ok, "regex %s: the tokens of '%s' are not each allowed, or eos is allowed before the end", cases[c].pattern,
              cases[c].text);
        printf("  qwen2.5 %-44s setup %5.1f ms, %zu steps: %6.2f ms/mask, %7.0f PCRE2 matches/mask, %d..%d ids allowed\n",
               cases[c].pattern, 1e3 * setup, n + 1, 1e3 * st.seconds / (double)st.masks,
               (double)st.matches / (double)st.masks, min_allowed, max_allowed);
        free(ids);
        token_regex_free(re);
    }
    free(mask);
    tokenizer_free(tok);
}

/* colt train with vllm_structured_outputs_regex: every logged completion is a full match, and the
 * importance-sampling ratio stays at 1 (the engine reports the policy's log-probs, not the mask's mass);
 * the settings it cannot honour are refused; colt generate --regex and a bad --regex. */
static void test_train_and_cli(void) {
    char *err = NULL, *out = NULL, args[1024], path[300];
    snprintf(path, sizeof path, "%s/t.yaml", g_tmp);
    FILE *f = fopen(path, "w");
    fprintf(f, "model: %s\ndataset: %s/examples/data/demo_train.jsonl\nreward_funcs: [{type: regex, pattern: \"yes\"}]\n"
               "output_dir: %s/out\nper_device_train_batch_size: 8\nnum_generations: 4\nmax_prompt_length: 64\n"
               "max_completion_length: 16\nmax_steps: 1\ndevice: cpu\nreport_to: none\nlog_completions: true\n"
               "vllm_guided_decoding_regex: \"(yes|no)\"\n",
            STRUCTURED_MODEL, COLT_SOURCE_DIR, g_tmp);
    fclose(f);
    snprintf(args, sizeof args, "train --config %s", path);
    int code = run_colt(args, &err);
    CHECK(code == 0, "train with a regex: exit %d: %s", code, err);
    free(err);
    snprintf(path, sizeof path, "%s/out/metrics.jsonl", g_tmp);
    json_error_t jerr;
    json_t *m = json_load_file(path, JSON_DISABLE_EOF_CHECK, &jerr);
    double ratio = m ? json_number_value(json_object_get(m, "sampling/importance_sampling_ratio/mean")) : 0;
    double diff = m ? json_number_value(json_object_get(m, "sampling/sampling_logp_difference/max")) : 1;
    CHECK(m && fabs(ratio - 1) < 1e-3 && diff < 1e-3, "train: importance-sampling ratio %g, logp difference %g", ratio,
          diff);
    json_decref(m);
    snprintf(path, sizeof path, "%s/out/completions.jsonl", g_tmp);
    FILE *cf = fopen(path, "r");
    int n = 0, matched = 0;
    char line[4096];
    while (cf && fgets(line, sizeof line, cf)) {
        json_t *o = json_loads(line, 0, &jerr);
        const char *text = o ? json_string_value(json_object_get(o, "completion")) : NULL;
        n++;
        matched += text && structured_full_match("(yes|no)", text);
        json_decref(o);
    }
    if (cf) fclose(cf);
    CHECK(n > 0 && matched == n, "train: %d/%d logged completions match (yes|no)", matched, n);
    printf("  colt train: %d/%d logged completions match, importance-sampling ratio %.6f\n", matched, n, ratio);

    snprintf(args, sizeof args, "train --config %s/t.yaml --vllm_mode server", g_tmp);
    code = run_colt(args, &err);
    CHECK(code != 0 && strstr(err, "vllm_structured_outputs_regex"), "regex with vllm_mode server: exit %d: %s", code,
          err);
    free(err);

    ColtRun r = {.out = &out};
    snprintf(args, sizeof args, "generate --model %s --prompt hi --n 6 --temperature 1 --regex '[a-c]{2}x' --device cpu",
             STRUCTURED_MODEL);
    code = run_colt_with(&r, args, &err);
    int lines = 0, ok = 0;
    for (char *p = out, *nl; code == 0 && p && *p; p = nl + 1) {
        nl = strchr(p, '\n');
        if (!nl) break;
        *nl = 0;
        lines++;
        ok += structured_full_match("[a-c]{2}x", p);
    }
    CHECK(code == 0 && lines == 6 && ok == 6, "generate --regex: exit %d, %d/%d lines match: %s", code, ok, lines, err);
    printf("  colt generate --regex: %d/%d completions match\n", ok, lines);
    free(out);
    free(err);
    snprintf(args, sizeof args, "generate --model %s --prompt hi --regex 'a[b' --device cpu", STRUCTURED_MODEL);
    code = run_colt(args, &err);
    CHECK(code != 0 && strstr(err, "missing terminating ] for character class at offset 3"),
          "generate with a bad --regex: exit %d: %s", code, err);
    free(err);
}

int main(void) {
    double t0 = now_s();
    printf("masks on a hand-made vocabulary, errors\n");
    test_small_vocab();
    test_generation_errors();
    printf("tiny-llama3 on the CPU: engine and generate() under each regex\n");
    structured_run_backend(backend_cpu(), NULL, 6, N_SEQS);
    /* deterministic mode: the log-probs by the trainer's op, on the masked logits too */
    printf("tiny-llama3 on the CPU, deterministic mode\n");
    EngineOptions det = {.deterministic = true};
    structured_run_backend(backend_cpu(), &det, 1, N_SEQS);
    backend_cpu()->set_batch_invariant(backend_cpu(), 0);
    test_qwen_vocab();
    snprintf(g_tmp, sizeof g_tmp, "/tmp/colt_test_structured_XXXXXX");
    if (!mkdtemp(g_tmp)) return 1;
    printf("colt train and colt generate with a regex\n");
    test_train_and_cli();
    sh("rm -rf %s", g_tmp);
    printf("%d checks, %d failures (%.1f s)\n", g_checks, g_failures, now_s() - t0);
    return g_failures ? 1 : 0;
}
