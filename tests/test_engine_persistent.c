/* test_engine_persistent.c — the persistent engine (engine_create / add /
 * step / abort / sleep / wake) on the CPU backend, against engine_generate.
 *
 * In the deterministic mode a sequence's tokens and log-probs are the same
 * bits in any batch, so every check here is exact: a request added while
 * others run, one whose neighbours have other sampling settings, one that
 * outlives a sleep, or one that survives its neighbours' aborts completes as
 * engine_generate completes it alone. The events must tell exactly what was
 * sampled. After the weights change (copied from another model, or moved by
 * an optimizer step), the next generation must be the new weights' — the
 * prefix cache and the running sequences' K/V are forgotten — and a sequence
 * running across the change continues as the new weights would continue it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/rng.h"
#include "engine/engine.h"
#include "engine/generate.h"
#include "model/model.h"
#include "model/model_train.h"
#include "parallel/optim.h"
#include "harness.h"

#define N_REQ 8
#define MAX_PROMPT 40
#define MAX_NEW 20

typedef struct Request {
    int prompt[MAX_PROMPT];
    GenSequence seq;
    GenerateOptions opt;
    int n_events, events[MAX_NEW];  /* tokens the events reported */
    float event_logprobs[MAX_NEW];
    int n_finished_events;
    bool aborted;
} Request;

static const int STOP_IDS[2] = {2, 7};

/* Requests with prompts of 1-37 tokens (0/1 and 4/5 share their first 17 and
 * 33 tokens, as GRPO's copies do) and, when mixed, different sampling settings. */
static void make_requests(Request *r, int vocab, bool mixed) {
    static const int lens[N_REQ] = {17, 17, 1, 33, 33, 37, 9, 20};
    SamplingParams greedy = sampling_params_greedy();
    SamplingParams settings[4] = {
        greedy,
        {.temperature = 0.7f, .top_k = 20, .top_p = 0.9f, .repetition_penalty = 1.0f, .seed = 21},
        {.temperature = 1.0f, .top_p = 1.0f, .repetition_penalty = 1.3f, .seed = 5},
        {.temperature = 0.9f, .top_p = 1.0f, .min_p = 0.05f, .repetition_penalty = 1.0f, .seed = 77},
    };
    for (int i = 0; i < N_REQ; i++) {
        memset(&r[i], 0, sizeof r[i]);
        int source = (i == 1 || i == 4) ? i - 1 : i;
        for (int k = 0; k < lens[i]; k++) r[i].prompt[k] = (int)(rng_uniform(99, (uint64_t)source, (uint64_t)k) * vocab);
        r[i].seq = (GenSequence){.prompt = r[i].prompt, .prompt_len = lens[i], .stream = (uint64_t)i};
        r[i].opt = (GenerateOptions){.sampling = mixed ? settings[i % 4] : settings[1],
                                     .max_new_tokens = MAX_NEW - 2 * (i % 3),
                                     .stop_ids = STOP_IDS,
                                     .n_stop_ids = 2,
                                     .ignore_eos = i % 2 == 0 || i == 3}; /* 3 must still run when aborted */
    }
}

/* engine_generate of request i alone (a fresh engine): the reference. */
static GenSequence reference(Model *m, const Request *r, const EngineOptions *eo) {
    char err[ERR_LEN];
    GenSequence g = {.prompt = r->seq.prompt, .prompt_len = r->seq.prompt_len, .stream = r->seq.stream};
    CHECK(engine_generate(m, &g, 1, &r->opt, eo, NULL, err) == 0, "reference: %s", err);
    return g;
}

static bool same_bits(const GenSequence *a, const GenSequence *b) {
    return a->n_tokens == b->n_tokens && a->finish == b->finish &&
           memcmp(a->tokens, b->tokens, sizeof(int) * (size_t)a->n_tokens) == 0 &&
           memcmp(a->logprobs, b->logprobs, sizeof(float) * (size_t)a->n_tokens) == 0;
}

/* Runs one step; records each event on its request (id = index in r). */
static int step(Engine *e, Request *r, int n_req) {
    char err[ERR_LEN];
    const EngineEvent *ev;
    int n;
    int rc = engine_step(e, &ev, &n, err);
    CHECK(rc == 0, "engine_step: %s", err);
    for (int k = 0; rc == 0 && k < n; k++) {
        CHECK(ev[k].id < (uint64_t)n_req, "event for unknown id %llu", (unsigned long long)ev[k].id);
        if (ev[k].id >= (uint64_t)n_req) continue;
        Request *q = &r[ev[k].id];
        CHECK(!q->aborted && q->n_finished_events == 0, "request %llu: event after it finished or was aborted",
              (unsigned long long)ev[k].id);
        if (ev[k].token >= 0 && q->n_events < MAX_NEW) {
            q->event_logprobs[q->n_events] = ev[k].logprob;
            q->events[q->n_events++] = ev[k].token;
        }
        q->n_finished_events += ev[k].finished;
    }
    return rc;
}

/* The events of request q said what its sequence holds, and that it finished once. */
static void check_events(const char *what, int i, const Request *q) {
    const GenSequence *g = &q->seq;
    bool same = q->n_events == g->n_tokens && memcmp(q->events, g->tokens, sizeof(int) * (size_t)g->n_tokens) == 0 &&
                memcmp(q->event_logprobs, g->logprobs, sizeof(float) * (size_t)g->n_tokens) == 0;
    CHECK(same, "%s: request %d's events (%d tokens) differ from its sequence (%d)", what, i, q->n_events, g->n_tokens);
    CHECK(q->n_finished_events == 1, "%s: request %d got %d finished events", what, i, q->n_finished_events);
}

static Model *load(const char *dir) {
    char err[ERR_LEN];
    Model *m = NULL;
    if (model_load(&m, dir, backend_cpu(), err) != 0) {
        CHECK(0, "%s", err);
        return NULL;
    }
    return m;
}

/* Requests arriving while others run, mixed sampling settings in one batch,
 * aborts, sleep and wake: each completion as engine_generate makes it alone. */
static void run_requests(Model *m, bool mixed, int block_size, const char *label) {
    char err[ERR_LEN];
    const ModelConfig *c = model_config(m);
    /* fewer slots than requests: some wait */
    EngineOptions eo = {.deterministic = true, .max_num_seqs = 4, .block_size = block_size};
    Request r[N_REQ];
    make_requests(r, c->vocab_size, mixed);
    GenSequence ref[N_REQ];
    for (int i = 0; i < N_REQ; i++) ref[i] = reference(m, &r[i], &eo);

    Engine *e = NULL;
    if (engine_create(&e, m, &eo, MAX_PROMPT + MAX_NEW, N_REQ, err) != 0) {
        CHECK(0, "engine_create: %s", err);
        return;
    }
    /* Three now, the rest one per step; request 6 aborted while it waits, 3 after 4 steps of running. */
    int added = 0, steps = 0;
    for (; added < 3; added++) CHECK(engine_add_request(e, &r[added].seq, &r[added].opt, added, err) == 0, "%s", err);
    bool slept = false;
    while (engine_has_work(e) || added < N_REQ) {
        if (added < N_REQ) {
            CHECK(engine_add_request(e, &r[added].seq, &r[added].opt, added, err) == 0, "%s", err);
            added++;
        }
        if (added == 7 && !r[6].aborted) {
            CHECK(engine_abort(e, 6) == 0, "%s: abort of waiting request 6 failed", label);
            r[6].aborted = true;
        }
        if (steps == 7 && !r[3].aborted) {
            CHECK(r[3].n_events > 0 && r[3].n_finished_events == 0, "%s: request 3 is not running at step 7 (%d tokens)",
                  label, r[3].n_events);
            CHECK(engine_abort(e, 3) == 0, "%s: abort of running request 3 failed", label);
            r[3].aborted = true;
        }
        if (steps == 5 && !slept) { /* sleep with requests running: they are recomputed after wake */
            EngineLoad before, asleep;
            engine_load(e, &before);
            engine_sleep(e);
            engine_load(e, &asleep);
            const EngineEvent *ev;
            int n;
            CHECK(engine_step(e, &ev, &n, err) != 0 && strstr(err, "asleep"), "%s: a step while asleep ran", label);
            CHECK(!engine_awake(e) && asleep.pool_blocks == 0 && asleep.running == 0 &&
                      asleep.waiting == before.running + before.waiting,
                  "%s: asleep: pool %d blocks, %d running, %d waiting (before: %d + %d)", label, asleep.pool_blocks,
                  asleep.running, asleep.waiting, before.running, before.waiting);
            CHECK(engine_wake(e, err) == 0 && engine_awake(e), "%s: wake: %s", label, err);
            printf("  %s: slept at step 5 with %d running, %d waiting; woke\n", label, before.running, before.waiting);
            slept = true;
        }
        if (step(e, r, N_REQ) != 0) break;
        steps++;
        CHECK(steps < 1000, "%s: no end after 1000 steps", label);
        if (steps >= 1000) break;
    }
    CHECK(engine_abort(e, 3) != 0 && engine_abort(e, 0) != 0 && engine_abort(e, 99) != 0,
          "%s: abort of a finished, aborted or unknown id succeeded", label);
    EngineLoad load;
    engine_load(e, &load);
    CHECK(load.running == 0 && load.waiting == 0 && load.blocks_used == 0,
          "%s: after the last request: %d running, %d waiting, %d blocks held", label, load.running, load.waiting,
          load.blocks_used);
    int same = 0, compared = 0;
    for (int i = 0; i < N_REQ; i++) {
        if (r[i].aborted) continue;
        compared++;
        same += same_bits(&r[i].seq, &ref[i]);
        check_events(label, i, &r[i]);
    }
    CHECK(same == compared, "%s: %d/%d requests bit-identical to engine_generate alone", label, same, compared);
    CHECK(r[6].seq.n_tokens == 0 && r[6].n_events == 0, "%s: aborted waiting request 6 got %d tokens", label,
          r[6].seq.n_tokens);
    CHECK(r[3].seq.n_tokens == r[3].n_events && r[3].n_finished_events == 0 &&
              memcmp(r[3].seq.tokens, ref[3].tokens, sizeof(int) * (size_t)r[3].seq.n_tokens) == 0,
          "%s: aborted running request 3 kept %d tokens, not the first of its reference", label, r[3].seq.n_tokens);
    EngineStats st;
    engine_stats(e, &st);
    printf("  %s: %d/%d requests bit-identical to engine_generate alone (%d steps, %lld tokens from the prefix "
           "cache); request 3 aborted after %d tokens\n",
           label, same, compared, st.steps, (long long)st.shared_tokens, r[3].seq.n_tokens);
    CHECK(st.shared_tokens > 0, "%s: no prompt block was shared", label);
    engine_destroy(e);
    for (int i = 0; i < N_REQ; i++) gen_sequence_free(&r[i].seq), gen_sequence_free(&ref[i]);
}

/* The pool, its prefix cache and the request table outlive requests; edge
 * cases of engine_add_request. */
static void run_lifetime(Model *m) {
    char err[ERR_LEN];
    const ModelConfig *c = model_config(m);
    EngineOptions eo = {.deterministic = true};
    Request r[N_REQ];
    make_requests(r, c->vocab_size, false);
    Engine *e = NULL;
    if (engine_create(&e, m, &eo, MAX_PROMPT + MAX_NEW, 4, err) != 0) {
        CHECK(0, "engine_create: %s", err);
        return;
    }
    /* Request 3 (33 tokens: 2 full blocks), then request 4 (its first 33 tokens) after 3 finished. */
    GenSequence ref4 = reference(m, &r[4], &eo);
    CHECK(engine_add_request(e, &r[3].seq, &r[3].opt, 3, err) == 0, "%s", err);
    while (engine_has_work(e) && step(e, r, N_REQ) == 0) {}
    EngineStats before, after;
    engine_stats(e, &before);
    CHECK(engine_add_request(e, &r[4].seq, &r[4].opt, 4, err) == 0, "%s", err);
    while (engine_has_work(e) && step(e, r, N_REQ) == 0) {}
    engine_stats(e, &after);
    long long shared = after.shared_tokens - before.shared_tokens;
    printf("  a request after another finished: %lld tokens from the prefix cache (expected 32), %s\n", shared,
           same_bits(&r[4].seq, &ref4) ? "bit-identical to alone" : "DIFFERENT from alone");
    CHECK(shared == 32, "the second request took %lld tokens from the cache, expected 32", shared);
    CHECK(same_bits(&r[4].seq, &ref4), "the second request differs from engine_generate alone");
    check_events("lifetime", 4, &r[4]);

    /* After a sleep the cache is gone: nothing shared. */
    engine_sleep(e);
    CHECK(engine_wake(e, err) == 0, "wake: %s", err);
    gen_sequence_free(&r[4].seq);
    r[4].n_events = r[4].n_finished_events = 0;
    engine_stats(e, &before);
    CHECK(engine_add_request(e, &r[4].seq, &r[4].opt, 4, err) == 0, "%s", err);
    while (engine_has_work(e) && step(e, r, N_REQ) == 0) {}
    engine_stats(e, &after);
    CHECK(after.shared_tokens == before.shared_tokens, "after sleep/wake %lld tokens came from the cache",
          (long long)(after.shared_tokens - before.shared_tokens));
    CHECK(same_bits(&r[4].seq, &ref4), "after sleep/wake the request differs from engine_generate alone");

    /* max_new_tokens 0: complete at once, reported by the next step with no token. */
    GenerateOptions none = r[0].opt;
    none.max_new_tokens = 0;
    CHECK(engine_add_request(e, &r[0].seq, &none, 0, err) == 0, "%s", err);
    CHECK(engine_has_work(e), "a request complete at add leaves no work to report it");
    step(e, r, N_REQ);
    CHECK(r[0].n_finished_events == 1 && r[0].n_events == 0 && r[0].seq.n_tokens == 0 && !engine_has_work(e),
          "max_new_tokens 0: %d finished events, %d tokens", r[0].n_finished_events, r[0].seq.n_tokens);

    /* Bad requests: a one-line error, nothing queued. */
    GenSequence longer = {.prompt = r[5].prompt, .prompt_len = MAX_PROMPT + MAX_NEW + 1, .stream = 0};
    int long_prompt[MAX_PROMPT + MAX_NEW + 1] = {0};
    longer.prompt = long_prompt;
    CHECK(engine_add_request(e, &longer, &r[5].opt, 50, err) != 0 && strstr(err, "max_len"),
          "a prompt longer than max_len was accepted");
    printf("  prompt too long: %s\n", err);
    GenSequence big_stream = {.prompt = r[5].prompt, .prompt_len = 3, .stream = 1ull << 40};
    CHECK(engine_add_request(e, &big_stream, &r[5].opt, 51, err) != 0 && strstr(err, "stream"),
          "a stream id above 2^31-1 was accepted");
    GenSequence a = {.prompt = r[5].prompt, .prompt_len = 3}, b = a;
    CHECK(engine_add_request(e, &a, &r[5].opt, 52, err) == 0, "%s", err);
    CHECK(engine_add_request(e, &b, &r[5].opt, 52, err) != 0 && strstr(err, "already"), "a duplicate id was accepted");
    GenerateOptions bad = r[5].opt;
    bad.sampling.top_p = 2.0f;
    GenSequence c2 = {.prompt = r[5].prompt, .prompt_len = 3};
    CHECK(engine_add_request(e, &c2, &bad, 53, err) != 0, "top_p 2 was accepted");
    CHECK(engine_abort(e, 52) == 0 && !engine_has_work(e), "abort of a waiting request left work");
    gen_sequence_free(&a);
    engine_destroy(e);
    gen_sequence_free(&ref4);
    for (int i = 0; i < N_REQ; i++) gen_sequence_free(&r[i].seq);
}

/* Copies src's weights into dst (same config) as a weight update would. */
static void copy_weights(Model *dst, Model *src) {
    size_t n_dst = 0, n_src = 0;
    void *d = model_params_flat(dst, &n_dst), *s = model_params_flat(src, &n_src);
    COLT_ASSERT(n_dst == n_src);
    const Backend *be = model_backend(dst);
    be->copy(be, d, 0, s, 0, n_dst);
}

/* Gradients for an optimizer step: uniform in [-0.5, 0.5), from RNG stream `key`. */
static void fill_random_grads(ModelGrads *grads, uint64_t key) {
    size_t n = 0;
    void *g = model_grads_flat(grads, &n);
    float *host = malloc(sizeof(float) * n);
    for (size_t k = 0; k < n; k++) host[k] = (float)(rng_uniform(key, 0, k) - 0.5);
    backend_cpu()->copy_from_host(backend_cpu(), g, host, sizeof(float) * n);
    free(host);
}

/* One step, its events not looked at. */
static int step_quiet(Engine *e) {
    char err[ERR_LEN];
    const EngineEvent *ev;
    int n;
    int rc = engine_step(e, &ev, &n, err);
    CHECK(rc == 0, "engine_step: %s", err);
    return rc;
}

/* Runs request q to the end on e. */
static void complete(Engine *e, Request *q, uint64_t id) {
    char err[ERR_LEN];
    CHECK(engine_add_request(e, &q->seq, &q->opt, id, err) == 0, "%s", err);
    while (engine_has_work(e) && step_quiet(e) == 0) {}
}

/* New weights: the next generation uses them (the stale-weights bug of TRL's
 * sleep mode, trl#5312, cannot happen), both when they are copied in and when
 * an optimizer step moves them in place; a sequence running across the change
 * continues with the new weights. */
static void run_weight_update(const char *dir) {
    char err[ERR_LEN];
    Model *m = load(dir), *other = NULL;
    if (!m) return;
    const ModelConfig *c = model_config(m);
    CHECK(model_create_random(&other, c, 1234, backend_cpu(), err) == 0, "%s", err);
    if (!other) return;
    EngineOptions eo = {.deterministic = true};
    Request r[N_REQ];
    make_requests(r, c->vocab_size, false);
    Request *q = &r[5]; /* 37 prompt tokens: two full blocks go to the prefix cache */
    q->opt.sampling = sampling_params_greedy();
    q->opt.ignore_eos = true;
    Engine *e = NULL;
    if (engine_create(&e, m, &eo, MAX_PROMPT + MAX_NEW, 4, err) != 0) {
        CHECK(0, "engine_create: %s", err);
        return;
    }
    GenSequence old_ref = reference(m, q, &eo);
    complete(e, q, 1);
    CHECK(same_bits(&q->seq, &old_ref), "before the update: differs from engine_generate");
    EngineStats s0, s1;
    engine_stats(e, &s0);
    gen_sequence_free(&q->seq);
    complete(e, q, 2); /* the same request again: its prompt blocks come from the cache */
    engine_stats(e, &s1);
    CHECK(s1.shared_tokens - s0.shared_tokens == 32, "the repeated request took %lld tokens from the cache, not 32",
          (long long)(s1.shared_tokens - s0.shared_tokens));
    gen_sequence_free(&q->seq);

    /* 1. Weights copied in from another model. */
    uint64_t v0 = model_weights_version(m);
    copy_weights(m, other);
    model_weights_changed(m);
    GenSequence new_ref = reference(other, q, &eo);
    engine_stats(e, &s0);
    complete(e, q, 3);
    engine_stats(e, &s1);
    bool used_new = same_bits(&q->seq, &new_ref), differs = !same_bits(&new_ref, &old_ref);
    printf("  weights copied in: %s the new weights' completion (which %s the old one's); %lld tokens from the "
           "prefix cache\n", used_new ? "bit-identical to" : "DIFFERENT from", differs ? "differs from" : "EQUALS",
           (long long)(s1.shared_tokens - s0.shared_tokens));
    CHECK(used_new, "after the update the engine did not generate with the new weights");
    CHECK(differs, "the two models give the same completion: the test shows nothing");
    CHECK(s1.shared_tokens == s0.shared_tokens, "after the update %lld prompt tokens came from the stale cache",
          (long long)(s1.shared_tokens - s0.shared_tokens));
    CHECK(model_weights_version(m) > v0, "model_weights_changed did not move the version");
    gen_sequence_free(&q->seq);
    gen_sequence_free(&old_ref);

    /* 2. An optimizer step in place (no call by the caller: the optimizer bumps the version). */
    Optimizer *opt = NULL;
    ModelGrads *grads = NULL;
    AdamWConfig ac = {.beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f};
    CHECK(optim_create(&opt, m, &ac, backend_cpu(), err) == 0 && model_grads_create(&grads, m, err) == 0, "%s", err);
    if (opt && grads) {
        fill_random_grads(grads, 5);
        complete(e, q, 4); /* fills the cache with the copied weights' blocks */
        gen_sequence_free(&q->seq);
        v0 = model_weights_version(m);
        optim_step(opt, grads, 0.05f);
        GenSequence stepped_ref = reference(m, q, &eo); /* a fresh engine on the stepped weights */
        engine_stats(e, &s0);
        complete(e, q, 5);
        engine_stats(e, &s1);
        bool ok = same_bits(&q->seq, &stepped_ref), moved = !same_bits(&stepped_ref, &new_ref);
        printf("  after an optimizer step: %s a fresh engine's completion (which %s the previous weights'); %lld "
               "tokens from the prefix cache\n", ok ? "bit-identical to" : "DIFFERENT from",
               moved ? "differs from" : "EQUALS", (long long)(s1.shared_tokens - s0.shared_tokens));
        CHECK(model_weights_version(m) > v0, "optim_step did not move the weights version");
        CHECK(ok, "after an optimizer step the engine did not generate with the new weights");
        CHECK(moved, "the optimizer step changed nothing the test can see");
        CHECK(s1.shared_tokens == s0.shared_tokens, "after the step %lld tokens came from the stale cache",
              (long long)(s1.shared_tokens - s0.shared_tokens));
        gen_sequence_free(&q->seq);
        gen_sequence_free(&stepped_ref);
    }
    optim_free(opt);
    model_grads_free(grads);

    /* 3. A change while the request runs: the tokens it has stay, the rest are the new weights'
     * continuation of them (greedy: the same as a fresh request whose prompt is prompt + those tokens). */
    CHECK(engine_add_request(e, &q->seq, &q->opt, 6, err) == 0, "%s", err);
    for (int k = 0; k < 6; k++) step_quiet(e);
    int kept = q->seq.n_tokens;
    copy_weights(m, other);
    model_weights_changed(m);
    while (engine_has_work(e) && step_quiet(e) == 0) {}
    int prompt2[MAX_PROMPT + MAX_NEW];
    memcpy(prompt2, q->prompt, sizeof(int) * (size_t)q->seq.prompt_len);
    memcpy(prompt2 + q->seq.prompt_len, q->seq.tokens, sizeof(int) * (size_t)kept);
    GenSequence cont = {.prompt = prompt2, .prompt_len = q->seq.prompt_len + kept};
    GenerateOptions rest = q->opt;
    rest.max_new_tokens = q->opt.max_new_tokens - kept;
    CHECK(engine_generate(other, &cont, 1, &rest, &eo, NULL, err) == 0, "%s", err);
    bool cont_ok = kept > 0 && q->seq.n_tokens == kept + cont.n_tokens &&
                   memcmp(q->seq.tokens + kept, cont.tokens, sizeof(int) * (size_t)cont.n_tokens) == 0 &&
                   memcmp(q->seq.logprobs + kept, cont.logprobs, sizeof(float) * (size_t)cont.n_tokens) == 0;
    printf("  weights changed after %d of %d tokens: the other %d %s the new weights' continuation\n", kept,
           q->seq.n_tokens, q->seq.n_tokens - kept, cont_ok ? "are bit-identical to" : "DIFFER from");
    CHECK(cont_ok, "a sequence running across the update did not continue with the new weights");
    gen_sequence_free(&cont);
    gen_sequence_free(&q->seq);
    gen_sequence_free(&new_ref);
    engine_destroy(e);
    model_free(other);
    model_free(m);
}

/* engine_run: rounds on one engine with an optimizer step (in place) between them, as colt train runs
 * them. Each round's completions are engine_generate's on the weights of that moment, bit for bit; the step
 * moves the weights' version but not their layout (the engine keeps its graphs); the prefix cache of the
 * round before is forgotten after a step and used when no step came between; each call's stats are its
 * own and add up to the engine's totals; and the refusals. */
static void run_rounds(const char *dir) {
    char err[ERR_LEN];
    Model *m = load(dir);
    if (!m) return;
    const ModelConfig *c = model_config(m);
    EngineOptions eo = {.deterministic = true};
    Request r[N_REQ];
    make_requests(r, c->vocab_size, false);
    GenerateOptions go = r[0].opt;
    go.max_new_tokens = MAX_NEW;
    go.ignore_eos = false;
    /* stop ids the model does sample (taken from a first generation), so the completions end at different
     * lengths and the batch shrinks through several sizes, as a trained model's do */
    int stop_ids[2] = {0, 0};
    GenSequence probe[2] = {{.prompt = r[1].prompt, .prompt_len = r[1].seq.prompt_len, .stream = 1},
                            {.prompt = r[6].prompt, .prompt_len = r[6].seq.prompt_len, .stream = 6}};
    go.n_stop_ids = 0;
    CHECK(engine_generate(m, probe, 2, &go, &eo, NULL, err) == 0, "probe: %s", err);
    stop_ids[0] = probe[0].tokens[4], stop_ids[1] = probe[1].tokens[9];
    gen_sequence_free(&probe[0]), gen_sequence_free(&probe[1]);
    go.stop_ids = stop_ids, go.n_stop_ids = 2;
    Engine *e = NULL;
    Optimizer *opt = NULL;
    ModelGrads *grads = NULL;
    AdamWConfig ac = {.beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f};
    CHECK(engine_create(&e, m, &eo, MAX_PROMPT + MAX_NEW, N_REQ, err) == 0, "engine_create: %s", err);
    CHECK(optim_create(&opt, m, &ac, backend_cpu(), err) == 0 && model_grads_create(&grads, m, err) == 0, "%s", err);
    if (!e || !opt || !grads) goto done;
    fill_random_grads(grads, 6);

    /* rounds 0-2 with a step after each of the first two; round 3 right after round 2 */
    int64_t shared[4] = {0}, steps_sum = 0;
    EngineStats before;
    engine_stats(e, &before);
    GenSequence round2[N_REQ];
    for (int round = 0; round < 4; round++) {
        GenSequence seqs[N_REQ], refs[N_REQ];
        for (int i = 0; i < N_REQ; i++)
            seqs[i] = refs[i] = (GenSequence){.prompt = r[i].prompt, .prompt_len = r[i].seq.prompt_len,
                                              .stream = (uint64_t)(round < 3 ? round : 2) * 100 + (uint64_t)i};
        EngineStats st;
        CHECK(engine_run(e, seqs, N_REQ, &go, &st, err) == 0, "round %d: engine_run: %s", round, err);
        CHECK(engine_generate(m, refs, N_REQ, &go, &eo, NULL, err) == 0, "round %d: engine_generate: %s", round, err);
        int same = 0, lengths_differ = 0;
        int64_t sampled = 0;
        for (int i = 0; i < N_REQ; i++) {
            same += same_bits(&seqs[i], &refs[i]);
            lengths_differ += seqs[i].n_tokens != seqs[0].n_tokens;
            sampled += seqs[i].n_tokens;
        }
        shared[round] = st.shared_tokens;
        steps_sum += st.steps;
        printf("  engine_run round %d: %d/%d completions bit-identical to engine_generate's (%lld tokens, %d of "
               "other lengths than the first); %lld prompt tokens from the prefix cache\n",
               round, same, N_REQ, (long long)sampled, lengths_differ, (long long)st.shared_tokens);
        CHECK(same == N_REQ, "round %d: %d of %d completions differ from engine_generate's", round, N_REQ - same, N_REQ);
        CHECK(st.decode_tokens == sampled, "round %d: the call's stats count %lld sampled tokens, not %lld", round,
              (long long)st.decode_tokens, (long long)sampled);
        if (round == 0) CHECK(lengths_differ > 0, "every completion has one length: the rounds show nothing");
        for (int i = 0; i < N_REQ; i++) gen_sequence_free(&refs[i]);
        if (round == 2)
            memcpy(round2, seqs, sizeof seqs);
        else if (round == 3) {
            int again = 0;
            for (int i = 0; i < N_REQ; i++) again += same_bits(&seqs[i], &round2[i]);
            CHECK(again == N_REQ, "the same round on the same weights gave other completions (%d of %d the same)",
                  again, N_REQ);
            for (int i = 0; i < N_REQ; i++) gen_sequence_free(&round2[i]);
        }
        if (round == 3 || round == 2) {
            if (round == 3)
                for (int i = 0; i < N_REQ; i++) gen_sequence_free(&seqs[i]);
            continue;
        }
        for (int i = 0; i < N_REQ; i++) gen_sequence_free(&seqs[i]);
        uint64_t v0 = model_weights_version(m), l0 = model_weights_layout_version(m);
        optim_step(opt, grads, 0.05f);
        CHECK(model_weights_version(m) > v0 && model_weights_layout_version(m) == l0,
              "an optimizer step moved the version %s and the layout %s (want: moved, kept)",
              model_weights_version(m) > v0 ? "moved" : "kept", model_weights_layout_version(m) == l0 ? "kept" : "moved");
    }
    CHECK(shared[1] == shared[0] && shared[2] == shared[0],
          "after an optimizer step the round took %lld / %lld tokens from the cache, the first round %lld (stale blocks)",
          (long long)shared[1], (long long)shared[2], (long long)shared[0]);
    CHECK(shared[3] > shared[2], "with no step between, the round took %lld tokens from the cache, not more than %lld",
          (long long)shared[3], (long long)shared[2]);
    EngineStats after;
    engine_stats(e, &after);
    CHECK(after.steps - before.steps == steps_sum, "engine_stats counts %d steps over the rounds, the calls %lld",
          after.steps - before.steps, (long long)steps_sum);

    /* Refusals: a sequence longer than the engine was made for, an asleep engine. */
    GenSequence longer = {.prompt = r[5].prompt, .prompt_len = r[5].seq.prompt_len}; /* 37 + 24 > 60 */
    GenerateOptions more = go;
    more.max_new_tokens = MAX_NEW + 4;
    err[0] = 0;
    CHECK(engine_run(e, &longer, 1, &more, NULL, err) != 0 && strstr(err, "needs 61 tokens"),
          "a sequence past the engine's length: '%s'", err);
    engine_sleep(e);
    GenSequence one = {.prompt = r[0].prompt, .prompt_len = r[0].seq.prompt_len};
    err[0] = 0;
    CHECK(engine_run(e, &one, 1, &go, NULL, err) != 0 && strstr(err, "asleep"), "an asleep engine: '%s'", err);
    CHECK(engine_wake(e, err) == 0 && engine_run(e, &one, 1, &go, NULL, err) == 0, "after waking: %s", err);
    gen_sequence_free(&one);
done:
    optim_free(opt);
    model_grads_free(grads);
    engine_destroy(e);
    model_free(m);
}

int main(void) {
    const char *dirs[2] = {COLT_SOURCE_DIR "/tests/data/models/tiny-qwen2-f32", COLT_SOURCE_DIR "/models/stories260K"};
    for (int d = 0; d < 2; d++) {
        printf("%s\n", dirs[d]);
        Model *m = load(dirs[d]);
        if (!m) continue;
        run_requests(m, false, 0, "one sampling setting");
        run_requests(m, true, 0, "four sampling settings in a batch");
        /* blocks of one token: the block table (32 entries a row at first) is widened while sequences run, by
         * whichever comes first of a sequence growing past 32 tokens and one admitted with a 33-token prompt */
        run_requests(m, true, 1, "blocks of 1 token (the table widened from 32 to 60)");
        run_lifetime(m);
        model_free(m);
        run_weight_update(dirs[d]);
        run_rounds(dirs[d]);
    }
    backend_cpu()->set_batch_invariant(backend_cpu(), 0);
    printf("test_engine_persistent: %d checks, %d failures\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
