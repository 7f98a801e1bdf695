/* structured_cases.h — regex-constrained generation checked on one backend (test_structured.c on the CPU,
 * gpu/test_cuda_structured.c on cuda): the tiny Llama 3 (tests/data/models/tiny-llama3-f32, random
 * weights, a byte-level BPE tokenizer of 304 tokens, 320 model ids) completes engine_requests.h's 14
 * prompts under each regex, greedy and sampled with several seeds, through the engine and generate().
 * Every completion must end on a stop id, its decoded text must be a full match (PCRE2, compiled here
 * on its own), and where the mask left one token the log-prob must be 0 (the masked distribution's).
 * Include after harness.h. */
#ifndef COLT_TESTS_STRUCTURED_CASES_H
#define COLT_TESTS_STRUCTURED_CASES_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "data/prompt.h"
#include "engine/engine.h"
#include "engine/generate.h"
#include "engine/structured.h"
#include "tokenizer/tokenizer.h"

#include "engine_requests.h"

#define STRUCTURED_MODEL COLT_SOURCE_DIR "/tests/data/models/tiny-llama3-f32"

/* Bounded regexes: every match is at most ~40 bytes, so every completion must stop within 64 tokens. */
static const char *const STRUCTURED_REGEXES[] = {
    "\\d{1,4}",                                            /* digits */
    "(yes|no)",                                            /* an alternation */
    "\\{\"name\": \"[a-z]{1,6}\", \"age\": \\d{1,3}\\}",    /* JSON-ish */
    "[a-z ]{0,24} the end\\.",                             /* a required suffix */
};
#define N_STRUCTURED_REGEXES ((int)(sizeof(STRUCTURED_REGEXES) / sizeof(STRUCTURED_REGEXES[0])))

/* pattern compiled to test a text for a full match, independently of structured.c. */
static inline bool structured_full_match(const char *pattern, const char *text) {
    int e;
    PCRE2_SIZE off;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, 0, &e, &off, NULL);
    if (!re) return false;
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    int rc = pcre2_match(re, (PCRE2_SPTR)text, strlen(text), 0, PCRE2_ANCHORED | PCRE2_ENDANCHORED, md, NULL);
    pcre2_match_data_free(md);
    pcre2_code_free(re);
    return rc >= 0;
}

/* Every completion of r stopped on a stop id, decodes to a full match, and has log-prob 0 wherever the
 * regex allowed exactly one token. Returns the sequences that passed. */
static inline int structured_check(const char *what, const Requests *r, TokenRegex *re, const Tokenizer *tok,
                                   const GenerateOptions *opt) {
    char err[ERR_LEN];
    int ok = 0, forced = 0, total = 0;
    uint32_t *mask = xmalloc(sizeof(uint32_t) * (size_t)token_regex_mask_words(re));
    for (int i = 0; i < N_SEQS; i++) {
        const GenSequence *g = &r->seqs[i];
        bool stopped = g->finish == FINISH_STOP && g->n_tokens > 0;
        char *text = NULL;
        if (tokenizer_decode_generated(tok, g->tokens, (size_t)(stopped ? g->n_tokens - 1 : g->n_tokens), true, &text,
                                       err) != 0) {
            CHECK(0, "%s: sequence %d: %s", what, i, err);
            continue;
        }
        bool match = structured_full_match(token_regex_pattern(re), text);
        total += g->n_tokens;
        bool logp_ok = true;
        for (int k = 0; k < g->n_tokens; k++) {
            int n_allowed = token_regex_mask(re, mask, g->tokens, k, opt->stop_ids, opt->n_stop_ids);
            bool allowed = mask[g->tokens[k] >> 5] >> (g->tokens[k] & 31) & 1u;
            if (!allowed) logp_ok = false;
            if (n_allowed == 1 && !opt->policy_logprobs) {
                forced++;
                if (fabsf(g->logprobs[k]) > 1e-5f) logp_ok = false;
            }
        }
        CHECK(stopped && match && logp_ok, "%s: sequence %d (%d tokens, %s) '%s': %s", what, i, g->n_tokens,
              stopped ? "stopped" : "not stopped", text,
              !match ? "not a full match" : !logp_ok ? "a token outside the mask, or log-prob != 0 where forced" : "");
        ok += stopped && match && logp_ok;
        free(text);
    }
    free(mask);
    printf("    %-34s %2d/%d full matches, %4.1f tokens each (%d forced tokens with log-prob 0)\n", what, ok, N_SEQS,
           (double)total / N_SEQS, forced);
    return ok;
}

/* Sequences whose tokens are the same in a and b. */
static inline int structured_same_tokens(const Requests *a, const Requests *b) {
    int same = 0;
    for (int i = 0; i < N_SEQS; i++)
        same += a->seqs[i].n_tokens == b->seqs[i].n_tokens &&
                memcmp(a->seqs[i].tokens, b->seqs[i].tokens, sizeof(int) * (size_t)a->seqs[i].n_tokens) == 0;
    return same;
}

/* The regexes on backend be: greedy through the engine and generate(), sampled with n_seeds seeds through
 * the engine (the first seed through generate() too). min_same: sequences of each engine run that must
 * be token-identical to generate()'s. eo: the engine's options (NULL: defaults). */
static inline void structured_run_backend(const Backend *be, const EngineOptions *eo, int n_seeds, int min_same) {
    char err[ERR_LEN];
    Tokenizer *tok = NULL;
    Model *m = NULL;
    if (tokenizer_load(&tok, STRUCTURED_MODEL, err) != 0 || model_load(&m, STRUCTURED_MODEL, be, err) != 0) {
        CHECK(0, "%s", err);
        tokenizer_free(tok);
        return;
    }
    const ModelConfig *c = model_config(m);
    int stop[MODEL_MAX_EOS + 1], n_stop = prompt_stop_ids(stop, c, tok);
    for (int x = 0; x < N_STRUCTURED_REGEXES; x++) {
        TokenRegex *re = NULL;
        if (prompt_regex_constraint(&re, tok, c->vocab_size, STRUCTURED_REGEXES[x], err) != 0) {
            CHECK(0, "%s", err);
            continue;
        }
        printf("  regex %s\n", STRUCTURED_REGEXES[x]);
        for (int s = 0; s <= n_seeds; s++) {
            SamplingParams sp = s == 0 ? sampling_params_greedy()
                                       : (SamplingParams){.temperature = 1.0f, .top_p = 1.0f,
                                                          .repetition_penalty = 1.0f, .seed = (uint64_t)s};
            if (s == 2) sp.top_k = 20, sp.top_p = 0.9f, sp.temperature = 0.8f; /* filters over the masked row */
            GenerateOptions opt = {.sampling = sp, .max_new_tokens = 64, .stop_ids = stop, .n_stop_ids = n_stop,
                                   .regex = re};
            char what[64];
            snprintf(what, sizeof what, "%s engine", s == 0 ? "greedy" : "sampled");
            if (s > 0) snprintf(what, sizeof what, "seed %d engine", s);
            Requests eng;
            make_requests(&eng, c->vocab_size);
            if (engine_generate(m, eng.seqs, N_SEQS, &opt, eo, NULL, err) != 0) {
                CHECK(0, "%s: %s", what, err);
                continue;
            }
            structured_check(what, &eng, re, tok, &opt);
            if (s <= 1) {
                Requests ref;
                make_requests(&ref, c->vocab_size);
                if (generate(m, ref.seqs, N_SEQS, &opt, err) != 0) {
                    CHECK(0, "generate: %s", err);
                } else {
                    snprintf(what, sizeof what, "%s generate()", s == 0 ? "greedy" : "seed 1");
                    structured_check(what, &ref, re, tok, &opt);
                    int same = structured_same_tokens(&ref, &eng);
                    CHECK(same >= min_same, "%s: %d/%d sequences token-identical to the engine's (want >= %d)", what,
                          same, N_SEQS, min_same);
                    printf("    %-34s %2d/%d token-identical to the engine's\n", "", same, N_SEQS);
                }
                free_requests(&ref);
            }
            if (s == 1) { /* the policy's log-probs (colt train's): same draws, lower log-probs */
                GenerateOptions po = opt;
                po.policy_logprobs = true;
                Requests pol, polref;
                make_requests(&pol, c->vocab_size);
                make_requests(&polref, c->vocab_size);
                if (engine_generate(m, pol.seqs, N_SEQS, &po, eo, NULL, err) != 0 ||
                    generate(m, polref.seqs, N_SEQS, &po, err) != 0) {
                    CHECK(0, "policy log-probs: %s", err);
                } else {
                    int same = structured_same_tokens(&pol, &eng), below = 0, tokens = 0;
                    double worst = 0;
                    /* the sampler's and the trainer's op round apart: bf16 logits give them ~1e-3 */
                    const bool bf16 = be->storage != DTYPE_F32;
                    const float below_tol = bf16 ? 1e-2f : 1e-5f;
                    const double worst_tol = bf16 ? 0.25 : 2e-2;
                    for (int i = 0; i < N_SEQS; i++) {
                        const GenSequence *a = &pol.seqs[i], *b = &eng.seqs[i], *r = &polref.seqs[i];
                        for (int k = 0; k < a->n_tokens && k < b->n_tokens; k++, tokens++)
                            below += a->logprobs[k] <= b->logprobs[k] + below_tol;
                        for (int k = 0; k < a->n_tokens && k < r->n_tokens && a->tokens[k] == r->tokens[k]; k++)
                            if (fabs((double)a->logprobs[k] - r->logprobs[k]) > worst)
                                worst = fabs((double)a->logprobs[k] - r->logprobs[k]);
                    }
                    CHECK(same == N_SEQS && below == tokens,
                          "policy log-probs: %d/%d sequences drew the same tokens, %d/%d log-probs <= the masked ones",
                          same, N_SEQS, below, tokens);
                    CHECK(worst <= worst_tol, "policy log-probs: engine and generate() differ by %.3g (limit %.2g)", worst,
                          worst_tol);
                    printf("    %-34s %2d/%d same draws, %d/%d log-probs <= masked, engine vs generate() %.2g\n",
                           "policy log-probs (colt train)", same, N_SEQS, below, tokens, worst);
                }
                free_requests(&pol);
                free_requests(&polref);
            }
            free_requests(&eng);
        }
        TokenRegexStats st;
        token_regex_stats(re, &st);
        printf("    masks: %lld (%lld from the cache), %lld PCRE2 matches, %.3f ms per mask computed\n",
               (long long)st.masks, (long long)st.cached, (long long)st.matches,
               st.masks > st.cached ? 1e3 * st.seconds / (double)(st.masks - st.cached) : 0.0);
        token_regex_free(re);
    }
    model_free(m);
    tokenizer_free(tok);
}

#endif
