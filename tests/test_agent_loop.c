/* test_agent_loop.c — multi-turn generation (agent/agent_loop.h) on the CPU
 * backend with a scripted tool handler: which turns "call tools", what their
 * results are (fixed token ids) and the order and delay in which they come
 * back are chosen here, so every property is checked without a model that
 * really calls tools (test_tool_calls covers parsing and running tools).
 *
 * Checked: each later turn is what generate() (the plain loop) produces for
 * the same context and RNG positions; the masks and log-probs of tool-result
 * tokens; the per-conversation bound on tool rounds; the completion budget
 * (results that do not fit are dropped, a later turn is cut); the prefix
 * cache giving a resumed conversation its K/V back; that the tokens do
 * not depend on the order in which results arrive; and rounds on an engine
 * that lives on (agent_generate_on, the trainer's rounds). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/agent_loop.h"
#include "core/error.h"
#include "engine/generate.h"
#include "model/model.h"
#include "train/rollout.h"

#include "harness.h"

#define N_CONV 6
#define BUDGET 64     /* max_completion_length */
#define N_STOP 16     /* stop ids: every 16th token id, so a turn ends after ~16 tokens */
#define MAX_ROUNDS 2  /* max_tool_calling_iterations */
#define SUFFIX_LEN 5

/* The scripted tools: conversations 0-3 call tools after every turn (4 and 5
 * never do); conversation 3's results are longer than the budget allows, so
 * they are dropped. Results come back `delay` polls after the call, in the
 * order given by `reverse`. */
typedef struct Script {
    int delay;
    bool reverse;
    int due[N_CONV];      /* poll count at which the results are ready; -1: none pending */
    int polls;
    int calls[N_CONV], dropped[N_CONV];
    int ids[N_CONV][BUDGET + 8];
    AgentToolResult ready[N_CONV];
    int vocab;
    int stop[N_STOP];
} Script;

static int result_len(int c) { return c == 3 ? BUDGET : SUFFIX_LEN; }

static int turn_ended(void *ctx, int c, const int *context, int n_context, const int *turn, int n, FinishReason finish,
                      bool may_call, bool *called, char *err) {
    (void)turn, (void)finish, (void)err;
    CHECK(n_context >= 6 + c, "conversation %d: a context of %d tokens", c, n_context);
    (void)context;
    Script *s = ctx;
    CHECK(n > 0, "conversation %d: a turn of %d tokens", c, n);
    *called = c < 4 && may_call;
    if (*called) {
        s->calls[c]++;
        s->due[c] = s->polls + s->delay;
        for (int k = 0; k < result_len(c); k++) s->ids[c][k] = (7 + 13 * c + 5 * k + s->calls[c]) % s->vocab;
    }
    return COLT_OK;
}

static int poll_results(void *ctx, double wait_s, const AgentToolResult **ready, int *n_ready, char *err) {
    (void)wait_s, (void)err;
    Script *s = ctx;
    s->polls++;
    int n = 0;
    for (int j = 0; j < N_CONV; j++) {
        int c = s->reverse ? N_CONV - 1 - j : j;
        if (s->due[c] < 0 || s->due[c] > s->polls) continue;
        s->ready[n++] = (AgentToolResult){.conversation = c, .ids = s->ids[c], .n = result_len(c)};
        s->due[c] = -1;
    }
    *ready = s->ready;
    *n_ready = n;
    return COLT_OK;
}

static void results_dropped(void *ctx, int c) { ((Script *)ctx)->dropped[c]++; }

/* Runs the loop, on engine e when not NULL (agent_generate_on), else on an engine of its own; convs get the
 * prompts. */
static int run_on(Model *m, Engine *e, AgentConversation *convs, int prompts[N_CONV][12], Script *s, EngineStats *st,
                  char *err) {
    for (int c = 0; c < N_CONV; c++) {
        convs[c] = (AgentConversation){.prompt = prompts[c], .prompt_len = 6 + c, .stream = (uint64_t)c};
        s->due[c] = -1;
    }
    AgentTools tools = {.ctx = s, .turn_ended = turn_ended, .poll = poll_results, .results_dropped = results_dropped};
    GenerateOptions go = {.sampling = {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .repetition_penalty = 1.0f, .seed = 11},
                          .max_new_tokens = BUDGET};
    go.stop_ids = s->stop, go.n_stop_ids = N_STOP;
    AgentLoopOptions lo = {.max_tool_calling_iterations = MAX_ROUNDS, .idle_wait_s = 0.001};
    return e ? agent_generate_on(e, convs, N_CONV, &go, &tools, &lo, st, err)
             : agent_generate(m, convs, N_CONV, &go, NULL, &tools, &lo, st, err);
}

static int run(Model *m, AgentConversation *convs, int prompts[N_CONV][12], Script *s, EngineStats *st, char *err) {
    return run_on(m, NULL, convs, prompts, s, st, err);
}

static int same_conversations(const AgentConversation *x, const AgentConversation *y) {
    int identical = 0;
    for (int c = 0; c < N_CONV; c++)
        identical += x[c].n_tokens == y[c].n_tokens &&
                     memcmp(x[c].tokens, y[c].tokens, sizeof(int) * (size_t)x[c].n_tokens) == 0 &&
                     memcmp(x[c].model_mask, y[c].model_mask, (size_t)x[c].n_tokens) == 0;
    return identical;
}

/* Two rounds on one engine that lives on (the trainer's rounds' engine): each round's conversations are the
 * fresh engine's, the engine holds nothing of them afterwards, and the second round finds the first's blocks
 * in the prefix cache (same weights, same prompts): the engine was kept, cache and all. */
static void check_kept_engine(Model *m, const AgentConversation *fresh, int prompts[N_CONV][12], int vocab) {
    char err[ERR_LEN];
    Engine *e = NULL;
    int rc = engine_create(&e, m, NULL, 12 + BUDGET, N_CONV, err);
    CHECK(rc == 0, "engine_create: %s", err);
    if (rc != 0) return;
    EngineStats st[2] = {0};
    int identical[2] = {0, 0};
    for (int round = 0; round < 2; round++) {
        Script s = {.delay = 1, .vocab = vocab};
        for (int k = 0; k < N_STOP; k++) s.stop[k] = (16 * k + 2) % vocab;
        AgentConversation convs[N_CONV];
        rc = run_on(m, e, convs, prompts, &s, &st[round], err);
        CHECK(rc == 0, "agent_generate_on, round %d: %s", round + 1, err);
        if (rc != 0) break;
        identical[round] = same_conversations(fresh, convs);
        EngineLoad load;
        engine_load(e, &load);
        CHECK(!engine_has_work(e) && load.running == 0 && load.waiting == 0,
              "round %d left %d running and %d waiting on the engine", round + 1, load.running, load.waiting);
        for (int c = 0; c < N_CONV; c++) agent_conversation_free(&convs[c]);
    }
    EngineStats total;
    engine_stats(e, &total);
    printf("a kept engine, two rounds: %d and %d of %d conversations identical to a fresh engine's; steps %lld + %lld "
           "(totals %lld); prompt tokens from the cache %lld, then %lld\n",
           identical[0], identical[1], N_CONV, (long long)st[0].steps, (long long)st[1].steps, (long long)total.steps,
           (long long)st[0].shared_tokens, (long long)st[1].shared_tokens);
    CHECK(identical[0] >= N_CONV - 1 && identical[1] >= N_CONV - 1,
          "a kept engine: %d and %d of %d conversations identical to a fresh engine's", identical[0], identical[1],
          N_CONV);
    CHECK(st[0].steps > 0 && st[1].steps > 0 && total.steps == st[0].steps + st[1].steps,
          "a kept engine's per-call steps %lld + %lld against its totals %lld", (long long)st[0].steps,
          (long long)st[1].steps, (long long)total.steps);
    CHECK(st[1].shared_tokens > st[0].shared_tokens, "the second round shared %lld prompt tokens from the cache, the "
          "first %lld: the kept engine's cache was not used", (long long)st[1].shared_tokens,
          (long long)st[0].shared_tokens);
    /* refused in one line: a conversation longer than the engine was made for */
    AgentConversation one[N_CONV];
    Script s = {.delay = 1, .vocab = vocab};
    GenerateOptions go = {.sampling = {.temperature = 1.0f, .top_p = 1.0f, .repetition_penalty = 1.0f}, .max_new_tokens = BUDGET + 1};
    for (int c = 0; c < N_CONV; c++) one[c] = (AgentConversation){.prompt = prompts[c], .prompt_len = 12};
    AgentTools tools = {.ctx = &s, .turn_ended = turn_ended, .poll = poll_results};
    rc = agent_generate_on(e, one, N_CONV, &go, &tools, NULL, NULL, err);
    CHECK(rc != 0 && strstr(err, "conversation 0 needs 77 tokens (prompt 12 + max_new_tokens 65) but the engine was "
                                 "made for 76"), "a conversation too long for the engine: %s", rc ? err : "accepted");
    engine_destroy(e);
}

/* generate() on the context a turn saw: its tokens and log-probs. */
static int plain_turn(Model *m, const AgentConversation *c, int from, const int *stop, GenSequence *out, char *err) {
    int *context = malloc(sizeof(int) * (size_t)(c->prompt_len + from));
    memcpy(context, c->prompt, sizeof(int) * (size_t)c->prompt_len);
    memcpy(context + c->prompt_len, c->tokens, sizeof(int) * (size_t)from);
    *out = (GenSequence){.prompt = context, .prompt_len = c->prompt_len + from, .stream = c->stream,
                         .first_position = from};
    GenerateOptions go = {.sampling = {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .repetition_penalty = 1.0f, .seed = 11},
                          .max_new_tokens = BUDGET - from, .stop_ids = stop, .n_stop_ids = N_STOP};
    int rc = generate(m, out, 1, &go, err);
    free(context);
    return rc;
}

/* A round of these conversations as a checkpoint keeps it (rollout.h): the
 * masks and tool counts come back, a bad mask is refused in one line. */
static void check_saved_round(const AgentConversation *convs, int prompts[N_CONV][12], int vocab) {
    Rollout r = {.n_samples = N_CONV, .n_prompts = N_CONV, .n_funcs = 0};
    r.rows = calloc(N_CONV, sizeof(size_t));
    r.prompt_ids = calloc(N_CONV, sizeof(int *));
    r.prompt_len = calloc(N_CONV, sizeof(int));
    r.prompt_text = calloc(N_CONV, sizeof(char *));
    r.samples = calloc(N_CONV, sizeof(Sample));
    r.per_func = calloc(1, sizeof(float));
    r.order = calloc(N_CONV, sizeof(int));
    for (int c = 0; c < N_CONV; c++) {
        r.rows[c] = (size_t)c, r.order[c] = N_CONV - 1 - c;
        r.prompt_len[c] = convs[c].prompt_len;
        r.prompt_ids[c] = malloc(sizeof(int) * 12);
        memcpy(r.prompt_ids[c], prompts[c], sizeof(int) * 12);
        r.prompt_text[c] = strdup("p");
        Sample *s = &r.samples[c];
        s->prompt = c, s->len = convs[c].n_tokens, s->text = strdup("t"), s->advantage = 0.5f;
        s->completion = malloc(sizeof(int) * (size_t)s->len);
        memcpy(s->completion, convs[c].tokens, sizeof(int) * (size_t)s->len);
        if (convs[c].tool_rounds > 0) {
            s->model_mask = malloc((size_t)s->len);
            memcpy(s->model_mask, convs[c].model_mask, (size_t)s->len);
            s->tool_calls = convs[c].tool_rounds, s->tool_failures = 1;
        }
    }
    RolloutShape shape = {.n_samples = N_CONV, .group_size = 1, .max_prompt_len = 12, .max_completion_len = BUDGET,
                          .vocab_size = vocab, .dataset_rows = N_CONV, .micro_per_round = 1, .micro_batch_samples = 1};
    json_t *o = rollout_to_json(&r, 1);
    Rollout back = {0};
    char err[ERR_LEN];
    int rc = rollout_from_json(&back, o, &shape, "trainer_state.json", err);
    CHECK(rc == 0, "saved round: %s", err);
    int same = 0, with_mask = 0;
    for (int c = 0; rc == 0 && c < N_CONV; c++) {
        const Sample *a = &r.samples[c], *b = &back.samples[c];
        with_mask += a->model_mask != NULL;
        same += b->len == a->len && (a->model_mask == NULL) == (b->model_mask == NULL) &&
                (!a->model_mask || memcmp(a->model_mask, b->model_mask, (size_t)a->len) == 0) &&
                a->tool_calls == b->tool_calls && a->tool_failures == b->tool_failures;
    }
    CHECK(with_mask >= 1 && same == N_CONV, "saved round: %d of %d samples back as saved (%d with a mask)", same, N_CONV,
          with_mask);
    rollout_free(&back);
    /* a mask of the wrong length, and a 2 in it */
    for (int c = 0; c < N_CONV; c++) {
        json_t *so = json_array_get(json_object_get(o, "samples"), (size_t)c), *mask = json_object_get(so, "model_mask");
        if (!mask) continue;
        json_array_append_new(mask, json_integer(1));
        CHECK(rollout_from_json(&back, o, &shape, "ckpt", err) != 0 && strstr(err, "model_mask must be an array of"),
              "a mask one too long: %s", err);
        json_array_remove(mask, json_array_size(mask) - 1);
        json_array_set_new(mask, 1, json_integer(2));
        CHECK(rollout_from_json(&back, o, &shape, "ckpt", err) != 0 && strstr(err, "model_mask[1] must be 0 or 1"),
              "a 2 in the mask: %s", err);
        break;
    }
    json_decref(o);
    rollout_free(&r);
}

int main(void) {
    char err[ERR_LEN];
    Model *m = NULL;
    if (model_load(&m, COLT_SOURCE_DIR "/tests/data/models/tiny-llama-f32", backend_cpu(), err) != 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    int vocab = model_config(m)->vocab_size;
    int prompts[N_CONV][12];
    for (int c = 0; c < N_CONV; c++)
        for (int k = 0; k < 12; k++) prompts[c][k] = (1 + 31 * c + 17 * k) % vocab;

    Script a = {.delay = 1, .vocab = vocab}, b = {.delay = 3, .reverse = true, .vocab = vocab};
    for (int k = 0; k < N_STOP; k++) a.stop[k] = b.stop[k] = (16 * k + 2) % vocab;
    AgentConversation ca[N_CONV], cb[N_CONV];
    EngineStats st;
    int rc = run(m, ca, prompts, &a, &st, err);
    CHECK(rc == 0, "agent_generate: %s", err);
    if (rc != 0) return 1;

    int64_t shared_lower_bound = 0;
    int block = st.block_size, same_turns = 0, turns_compared = 0;
    for (int c = 0; c < N_CONV; c++) {
        AgentConversation *cv = &ca[c];
        CHECK(cv->n_tokens <= BUDGET, "conversation %d: %d tokens, budget %d", c, cv->n_tokens, BUDGET);
        int tool_tokens = 0;
        for (int k = 0; k < cv->n_tokens; k++) {
            tool_tokens += cv->model_mask[k] == 0;
            if (cv->model_mask[k] == 0) CHECK(cv->logprobs[k] == 0.0f, "conversation %d token %d: tool log-prob %g", c, k, (double)cv->logprobs[k]);
            else CHECK(cv->logprobs[k] <= 0.0f && isfinite(cv->logprobs[k]), "conversation %d token %d: log-prob %g", c, k, (double)cv->logprobs[k]);
        }
        CHECK(tool_tokens == cv->tool_rounds * SUFFIX_LEN, "conversation %d: %d tool tokens for %d rounds", c,
              tool_tokens, cv->tool_rounds);
        if (c >= 4) CHECK(cv->tool_rounds == 0 && a.calls[c] == 0, "conversation %d called no tool", c);
        if (c == 3) CHECK(cv->tool_rounds == 0 && a.dropped[3] == 1 && cv->results_dropped,
                          "conversation 3: results longer than the budget are dropped (rounds %d, dropped %d)",
                          cv->tool_rounds, a.dropped[3]);
        if (c < 3) {
            CHECK(a.calls[c] <= MAX_ROUNDS, "conversation %d: %d tool rounds, at most %d", c, a.calls[c], MAX_ROUNDS);
            CHECK(cv->tool_rounds == a.calls[c] || cv->n_tokens + SUFFIX_LEN > BUDGET,
                  "conversation %d: %d calls, %d rounds appended", c, a.calls[c], cv->tool_rounds);
        }
        /* every turn after the first: generate() on the same context */
        int k = 0;
        while (k < cv->n_tokens) {
            int start = k;
            while (k < cv->n_tokens && cv->model_mask[k]) k++;
            if (start > 0) {
                GenSequence ref;
                turns_compared++;
                if (plain_turn(m, cv, start, a.stop, &ref, err) != 0) {
                    CHECK(0, "generate: %s", err);
                } else {
                    bool same = ref.n_tokens == k - start &&
                                memcmp(ref.tokens, cv->tokens + start, sizeof(int) * (size_t)(k - start)) == 0;
                    same_turns += same;
                    double worst = 0;
                    for (int j = 0; same && j < ref.n_tokens; j++)
                        worst = fmax(worst, fabs((double)ref.logprobs[j] - cv->logprobs[start + j]));
                    CHECK(worst < 1e-4, "conversation %d turn at %d: log-probs differ from generate() by %.2e", c,
                          start, worst);
                    /* the K/V of every full block before the turn's last known token came from the cache */
                    int known = cv->prompt_len + start, computed_before = cv->prompt_len + start - SUFFIX_LEN - 1;
                    int blocks = (known - 1) / block, cached = computed_before / block;
                    shared_lower_bound += (int64_t)(blocks < cached ? blocks : cached) * block;
                    gen_sequence_free(&ref);
                }
            }
            while (k < cv->n_tokens && !cv->model_mask[k]) k++;
        }
    }
    printf("%d later turns compared with generate(): %d token-identical; %lld tokens shared from the cache "
           "(at least %lld from resumed conversations), block %d\n",
           turns_compared, same_turns, (long long)st.shared_tokens, (long long)shared_lower_bound, block);
    CHECK(turns_compared >= 3, "only %d later turns: the script should give at least 3", turns_compared);
    CHECK(same_turns >= turns_compared - 1, "%d of %d later turns match generate()", same_turns, turns_compared);
    CHECK(st.shared_tokens >= shared_lower_bound, "prefix cache: %lld tokens shared, resumed turns alone %lld",
          (long long)st.shared_tokens, (long long)shared_lower_bound);

    /* Other delays, results in reverse order: the same conversations. */
    rc = run(m, cb, prompts, &b, NULL, err);
    CHECK(rc == 0, "agent_generate (reversed): %s", err);
    int identical = rc == 0 ? same_conversations(ca, cb) : 0;
    printf("results in another order and delay: %d of %d conversations identical\n", identical, N_CONV);
    CHECK(identical >= N_CONV - 1, "only %d of %d conversations identical when results come in another order",
          identical, N_CONV);

    check_saved_round(ca, prompts, vocab);
    check_kept_engine(m, ca, prompts, vocab);
    for (int c = 0; c < N_CONV; c++) agent_conversation_free(&ca[c]), agent_conversation_free(&cb[c]);
    model_free(m);
    printf("test_agent_loop: %d checks, %d failures\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
