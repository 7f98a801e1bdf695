/* test_backend_profile.c — the profiling wrapper (backend/profile.h):
 *   1. it wraps every op of Backend: on a fake inner with every op set, each of
 *      the wrapper's ops differs from inner's (backend_profile_wrap also checks
 *      this itself and aborts); while capturing a graph, ops run untimed and
 *      never synchronise, and graph_launch is timed as one op;
 *   2. through the wrapper on a CPU instance, a model forward, greedy and
 *      deterministic engine_generate, and one training step (forward, backward,
 *      clipped AdamW step) are bit-identical to the same on the bare instance;
 *   3. the report lists the ops timed, with their calls. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/profile.h"
#include "core/error.h"
#include "engine/engine.h"
#include "engine/generate.h"
#include "model/model.h"
#include "model/model_train.h"
#include "parallel/optim.h"

#include "harness.h"

#define MODEL_DIR COLT_SOURCE_DIR "/tests/data/models/tiny-qwen2-f32"

/* ---- 1. a fake inner backend ---- */

typedef void (*AnyOp)(void);
static Backend g_fake;
static int g_syncs, g_linears, g_launches, g_wrong_instance;

static void fake_any(void) {}
static void fake_synchronize(const Backend *be) { g_syncs++, g_wrong_instance += be != &g_fake; }
static void fake_linear(const Backend *be, void *out, const void *x, const void *w, const void *bias, int n, int in_dim,
                        int out_dim) {
    g_linears++, g_wrong_instance += be != &g_fake;
}
static void fake_capture_begin(const Backend *be) { g_wrong_instance += be != &g_fake; }
static void *fake_capture_end(const Backend *be) {
    g_wrong_instance += be != &g_fake;
    return &g_fake;
}
static void fake_graph_launch(const Backend *be, void *graph) {
    g_launches++, g_wrong_instance += be != &g_fake || graph != &g_fake;
}

/* calls of op in a report, or -1 when it is not listed */
static long report_calls(const char *report, const char *op) {
    char key[80];
    snprintf(key, sizeof key, "| %s | ", op);
    const char *p = strstr(report, key);
    return p ? strtol(p + strlen(key), NULL, 10) : -1;
}

static char *report_of(const Backend *prof) {
    char *text = NULL;
    size_t len = 0;
    FILE *fp = open_memstream(&text, &len);
    backend_profile_report(prof, fp);
    fclose(fp);
    return text;
}

static void test_every_op_wrapped(void) {
    memset(&g_fake, 0, sizeof g_fake);
    g_fake.name = "fake";
    g_fake.close_instance = (void (*)(Backend *))fake_any;
    AnyOp any = fake_any;
    for (size_t off = offsetof(Backend, alloc); off < sizeof(Backend); off += sizeof(AnyOp))
        memcpy((char *)&g_fake + off, &any, sizeof any);
    g_fake.synchronize = fake_synchronize;
    g_fake.linear = fake_linear;
    g_fake.capture_begin = fake_capture_begin;
    g_fake.capture_end = fake_capture_end;
    g_fake.graph_launch = fake_graph_launch;

    Backend *w = backend_profile_wrap(&g_fake); /* aborts if an op is left unwrapped */
    int same = 0, ops = 0;
    for (size_t off = offsetof(Backend, alloc); off < sizeof(Backend); off += sizeof(AnyOp), ops++) {
        AnyOp mine;
        memcpy(&mine, (const char *)w + off, sizeof mine);
        same += mine == any;
    }
    CHECK(same == 0 && w->close_instance != g_fake.close_instance, "%d of %d ops not wrapped", same, ops);

    w->linear(w, NULL, NULL, NULL, NULL, 1, 1, 1);
    CHECK(g_syncs == 2 && g_linears == 1, "an op: %d synchronizes, %d calls (want 2, 1)", g_syncs, g_linears);
    w->capture_begin(w);
    w->linear(w, NULL, NULL, NULL, NULL, 1, 1, 1);
    void *graph = w->capture_end(w);
    CHECK(g_syncs == 2 && g_linears == 2, "while capturing: %d synchronizes (want none)", g_syncs - 2);
    w->graph_launch(w, graph);
    CHECK(g_syncs == 4 && g_launches == 1, "graph_launch: %d synchronizes (want 2)", g_syncs - 2);
    CHECK(g_wrong_instance == 0, "%d ops got the wrapper, not inner, as their instance", g_wrong_instance);
    char *report = report_of(w);
    CHECK(report_calls(report, "linear") == 1 && report_calls(report, "graph_launch") == 1,
          "fake report: want linear 1 (the captured call uncounted), graph_launch 1:\n%s", report);
    free(report);
    printf("  %d ops wrapped; captured ops untimed, graph_launch timed\n", ops);
    backend_close(w); /* the wrapper alone: close_instance frees it */
}

/* ---- 2. the same results through the wrapper ---- */

static Model *load(const Backend *be) {
    char err[ERR_LEN];
    Model *m = NULL;
    if (model_load(&m, MODEL_DIR, be, err) != 0) CHECK(0, "model_load: %s", err);
    return m;
}

#define T 12
static int g_tokens[T];

/* Logits of a prompt of T tokens in one slot. */
static float *forward_logits(const Backend *be) {
    char err[ERR_LEN];
    Model *m = load(be);
    if (!m) return NULL;
    int V = model_config(m)->vocab_size, slot[T], pos[T];
    for (int i = 0; i < T; i++) slot[i] = 0, pos[i] = i;
    float *logits = xmalloc(sizeof(float) * (size_t)T * (size_t)V);
    ModelState *st = NULL;
    CHECK(model_state_create(&st, m, 1, 64, T, err) == 0, "%s", err);
    CHECK(st && model_forward(m, st, g_tokens, slot, pos, T, NULL, logits, err) == 0, "model_forward: %s", err);
    model_state_free(st);
    model_free(m);
    return logits;
}

#define N_SEQS 3
#define NEW_TOKENS 8

typedef struct Generated {
    int tokens[N_SEQS][NEW_TOKENS], n[N_SEQS];
    float logprobs[N_SEQS][NEW_TOKENS];
} Generated;

static void run_generate(const Backend *be, bool deterministic, Generated *out) {
    char err[ERR_LEN];
    memset(out, 0, sizeof *out);
    Model *m = load(be);
    if (!m) return;
    GenSequence seqs[N_SEQS] = {0};
    for (int i = 0; i < N_SEQS; i++) {
        seqs[i].prompt = g_tokens + i;
        seqs[i].prompt_len = 4 + 2 * i;
        seqs[i].stream = (uint64_t)i;
    }
    GenerateOptions opt = {.sampling = sampling_params_greedy(), .max_new_tokens = NEW_TOKENS, .ignore_eos = true};
    EngineOptions eo = {.deterministic = deterministic};
    int rc = engine_generate(m, seqs, N_SEQS, &opt, &eo, NULL, err);
    CHECK(rc == 0, "engine_generate: %s", err);
    for (int i = 0; i < N_SEQS && rc == 0; i++) {
        out->n[i] = seqs[i].n_tokens;
        memcpy(out->tokens[i], seqs[i].tokens, sizeof(int) * (size_t)seqs[i].n_tokens);
        memcpy(out->logprobs[i], seqs[i].logprobs, sizeof(float) * (size_t)seqs[i].n_tokens);
        gen_sequence_free(&seqs[i]);
    }
    model_free(m);
}

typedef struct Trained {
    float lp[T], ent[T];
    double norm;
    float *params; /* every parameter after the step, in order */
    size_t numel;
} Trained;

/* One step on a sequence of T tokens: forward, backward, clip, AdamW. */
static void train_step(const Backend *be, Trained *out) {
    char err[ERR_LEN];
    memset(out, 0, sizeof *out);
    Model *m = load(be);
    if (!m) return;
    int slot[T], pos[T], targets[T];
    float dlp[T];
    for (int i = 0; i < T; i++) {
        slot[i] = 0, pos[i] = i;
        targets[i] = i >= 3 && i + 1 < T ? g_tokens[i + 1] : -1;
        dlp[i] = targets[i] >= 0 ? (float)(i % 5 - 2) / 8.0f : 0.0f;
    }
    TrainState *st = NULL;
    ModelGrads *g = NULL;
    Optimizer *o = NULL;
    AdamWConfig ac = {.beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.1f};
    int rc = train_state_create(&st, m, 1, T, T, err);
    if (rc == 0) rc = model_grads_create(&g, m, err);
    if (rc == 0) rc = optim_create(&o, m, &ac, be, err);
    if (rc == 0) model_grads_zero(g), rc = model_train_forward(m, st, g_tokens, slot, pos, targets, T, 0.7f, out->lp,
                                                               out->ent, err);
    if (rc == 0) rc = model_train_backward(m, st, dlp, g, err);
    CHECK(rc == 0, "training step: %s", err);
    if (rc == 0) {
        out->norm = optim_clip_grad_norm(m, g, 0.5, be);
        optim_step(o, g, 1e-2f);
        for (int i = 0; i < model_param_count(m); i++) out->numel += model_param(m, i).numel;
        out->params = xmalloc(sizeof(float) * out->numel);
        size_t at = 0;
        for (int i = 0; i < model_param_count(m); i++) {
            ModelParam p = model_param(m, i);
            be->download(be, out->params + at, p.data, p.numel);
            at += p.numel;
        }
    }
    if (o) optim_free(o);
    if (g) model_grads_free(g);
    if (st) train_state_free(st);
    model_free(m);
}

static void test_same_results(void) {
    char err[ERR_LEN];
    Backend *inner = backend_open("cpu", 0, err);
    COLT_ASSERT(inner);
    Backend *prof = backend_profile_wrap(inner);
    Model *m = load(inner);
    if (!m) return;
    int V = model_config(m)->vocab_size;
    model_free(m);
    for (int i = 0; i < T; i++) g_tokens[i] = 3 + (i * 37 + 11) % (V - 3);

    float *a = forward_logits(inner), *b = forward_logits(prof);
    CHECK(a && b && memcmp(a, b, sizeof(float) * (size_t)T * (size_t)V) == 0, "model_forward: logits differ");
    free(a), free(b);

    Generated ga, gb;
    run_generate(inner, false, &ga);
    run_generate(prof, false, &gb);
    CHECK(ga.n[0] == NEW_TOKENS && memcmp(&ga, &gb, sizeof ga) == 0, "greedy engine_generate: completions differ");

    Trained ta, tb;
    train_step(inner, &ta);
    train_step(prof, &tb);
    CHECK(ta.params && tb.params && ta.numel == tb.numel && ta.norm == tb.norm &&
              memcmp(ta.lp, tb.lp, sizeof ta.lp) == 0 && memcmp(ta.ent, tb.ent, sizeof ta.ent) == 0 &&
              memcmp(ta.params, tb.params, sizeof(float) * ta.numel) == 0,
          "training step: log-probs, gradient norm or parameters differ");
    free(ta.params), free(tb.params);

    /* Deterministic mode, the wrapper first: it must turn the mode on in inner
     * (set_batch_invariant), or its run would differ from inner's. It stays on. */
    run_generate(prof, true, &gb);
    run_generate(inner, true, &ga);
    CHECK(ga.n[0] == NEW_TOKENS && memcmp(&ga, &gb, sizeof ga) == 0, "deterministic engine_generate: completions differ");
    printf("  forward, greedy and deterministic generation, a training step: bit-identical through the wrapper\n");

    /* ---- 3. the report ---- */
    char *report = report_of(prof);
    const char *want[] = {"linear", "upload_i32", "paged_attention", "sample", "linear_backward", "adamw", "sum_squares"};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++)
        CHECK(report_calls(report, want[i]) > 0, "report: no calls of %s:\n%s", want[i], report);
    printf("  report: linear %ld calls, adamw %ld\n", report_calls(report, "linear"), report_calls(report, "adamw"));
    free(report);
    backend_close(prof);
    backend_close(inner);
}

int main(void) {
    test_every_op_wrapped();
    test_same_results();
    printf("%s: %d checks, %d failures\n", g_failures ? "FAILED" : "OK", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
