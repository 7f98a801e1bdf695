/* test_cuda_engine.c — the generation engine on the GPU (GPU machine only):
 *   - cuda_f32 (the GPU kernels with fp32 storage) against the CPU engine:
 *     greedy completions token-identical; sampled ones identical but for draws
 *     whose uniform falls within rounding of a boundary (at most 1 in 14);
 *   - a pool too small for every sequence (preemption and recompute) and a
 *     two-sequence batch limit give the same completions as the defaults;
 *   - CUDA graphs replay the same ops: greedy completions equal eager mode's;
 *   - the engine's log-prob of every sampled token against the trainer's
 *     forward (model_train_forward) on the same sequences: the shared kernels
 *     keep the mean difference below 1e-5 on cuda_f32 and 1e-2 on bf16 (these
 *     tiny models, D = 64, feel each bf16 rounding flip, and decode batches of
 *     up to 32 rows run the skinny GEMM while the trainer runs cuBLAS; the
 *     Qwen2.5-shaped GRPO benchmark logs sampling/sampling_logp_difference/mean
 *     at scale);
 *   - batch invariance on bf16: completions of sequences run alone against the
 *     same sequences in a batch (reported, counted);
 *   - deterministic mode (both tables): engine log-probs bit-identical to the
 *     trainer's; completions and log-probs bit-identical alone, in the batch,
 *     two at a time, under preemption, with or without CUDA graphs, with or
 *     without prefix caching (the copies of a prompt share its blocks or
 *     recompute them);
 *   - one engine across optimizer steps (and LoRA adapters switched off and
 *     on, as for beta > 0's reference log-probs): no graph recorded again,
 *     completions bit-identical to a fresh engine's; after a scratch that grew,
 *     the graphs are recorded again.
 * Exit 77 when no GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/rng.h"
#include "engine/engine.h"
#include "model/lora.h"
#include "model/model.h"
#include "model/model_train.h"
#include "parallel/optim.h"

#include "../engine_requests.h"
#include "../harness.h"

#define NEW_TOKENS 32

static int same_sequences(const Requests *a, const Requests *b) {
    int same = 0;
    for (int i = 0; i < N_SEQS; i++)
        same += a->seqs[i].n_tokens == b->seqs[i].n_tokens &&
                memcmp(a->seqs[i].tokens, b->seqs[i].tokens, sizeof(int) * (size_t)a->seqs[i].n_tokens) == 0;
    return same;
}

static int generate_on(Model *m, Requests *r, const SamplingParams *sp, const EngineOptions *eo, EngineStats *st) {
    char err[ERR_LEN];
    make_requests(r, model_config(m)->vocab_size);
    GenerateOptions opt = {.sampling = *sp, .max_new_tokens = NEW_TOKENS, .ignore_eos = true};
    if (engine_generate(m, r->seqs, N_SEQS, &opt, eo, st, err) != 0) {
        CHECK(0, "engine_generate: %s", err);
        return -1;
    }
    return 0;
}

/* Mean and max |engine log-prob - trainer log-prob| over every sampled token. */
static void trainer_agreement(Model *m, const Requests *r, double *mean, double *max) {
    char err[ERR_LEN];
    int differ;
    if (trainer_logprob_diff(m, r, 1.0f, mean, max, &differ, err) != 0) CHECK(0, "trainer forward: %s", err);
}

/* A model on a backend, with the PEFT adapter in adapter_dir attached (NULL: none). */
static int load_model(Model **m, const char *dir, const char *adapter_dir, const Backend *be, char *err) {
    if (model_load(m, dir, be, err) != 0) return COLT_ERR;
    return adapter_dir ? model_lora_load(*m, adapter_dir, err) : COLT_OK;
}

static void run(const char *dir, const char *adapter) {
    char err[ERR_LEN];
    Model *cpu = NULL, *f32 = NULL, *bf16 = NULL;
    if (load_model(&cpu, dir, adapter, backend_cpu(), err) != 0 ||
        load_model(&f32, dir, adapter, backend_cuda_f32(), err) != 0 ||
        load_model(&bf16, dir, adapter, backend_cuda(), err) != 0) {
        CHECK(0, "%s: %s", dir, err);
        return;
    }
    printf("%s%s%s\n", dir, adapter ? " + LoRA " : "", adapter ? adapter : "");
    SamplingParams greedy = sampling_params_greedy();
    SamplingParams sampled = {.temperature = 1.0f, .top_p = 1.0f, .repetition_penalty = 1.0f, .seed = 3};
    SamplingParams filtered = {.temperature = 0.8f, .top_k = 30, .top_p = 0.9f, .repetition_penalty = 1.1f, .seed = 4};
    const SamplingParams *params[3] = {&greedy, &sampled, &filtered};
    const char *names[3] = {"greedy", "temperature 1", "top-k/top-p/penalty"};
    EngineOptions defaults = {0}, eager = {.enforce_eager = true}, small = {.max_pool_blocks = 6},
                  two = {.max_num_seqs = 2};
    for (int p = 0; p < 3; p++) {
        Requests ref, got, other;
        EngineStats st;
        if (generate_on(cpu, &ref, params[p], &defaults, NULL) != 0) return;
        if (generate_on(f32, &got, params[p], &defaults, &st) != 0) return;
        int same = same_sequences(&ref, &got);
        printf("  %-22s cuda_f32 vs cpu: %2d/%d identical (graph steps %d/%d)\n", names[p], same, N_SEQS,
               st.graph_steps, st.steps);
        CHECK(same >= (p == 0 ? N_SEQS : N_SEQS - 1), "%s: cuda_f32 vs cpu %d/%d", names[p], same, N_SEQS);
        CHECK(st.graph_steps > 0, "no decode step replayed a CUDA graph");
        double mean, max;
        if (p < 2) { /* the trainer scores logits / 1, unfiltered: comparable for these two */
            trainer_agreement(f32, &got, &mean, &max);
            printf("  %-22s cuda_f32 engine vs trainer log-probs: mean %.2e max %.2e\n", names[p], mean, max);
            CHECK(mean < 1e-5, "cuda_f32 engine vs trainer mean %.3g", mean);
        }
        const EngineOptions *variants[2] = {&small, &two};
        const char *vnames[2] = {"6-block pool", "2 running"};
        for (int v = 0; v < 2; v++) {
            if (generate_on(f32, &other, params[p], variants[v], &st) != 0) return;
            int s2 = same_sequences(&got, &other);
            printf("  %-22s cuda_f32 %s vs defaults: %2d/%d identical (preemptions %d)\n", names[p], vnames[v], s2,
                   N_SEQS, st.preemptions);
            CHECK(s2 >= N_SEQS - 1, "%s: %s differs (%d/%d)", names[p], vnames[v], s2, N_SEQS);
            free_requests(&other);
        }
        free_requests(&got);

        /* bf16: graphs vs eager, trainer agreement, batch invariance. */
        if (generate_on(bf16, &got, params[p], &defaults, &st) != 0) return;
        if (generate_on(bf16, &other, params[p], &eager, NULL) != 0) return;
        int ge = same_sequences(&got, &other);
        printf("  %-22s bf16 graphs vs eager: %2d/%d identical\n", names[p], ge, N_SEQS);
        if (p == 0) CHECK(ge >= N_SEQS - 1, "bf16 graphs vs eager %d/%d", ge, N_SEQS);
        if (p < 2) {
            trainer_agreement(bf16, &got, &mean, &max);
            printf("  %-22s bf16 engine vs trainer log-probs: mean %.2e max %.2e\n", names[p], mean, max);
            CHECK(mean < 1e-2, "bf16 engine vs trainer mean %.3g", mean);
        }
        free_requests(&other);
        int alone_same = 0;
        make_requests(&other, model_config(bf16)->vocab_size);
        GenerateOptions opt = {.sampling = *params[p], .max_new_tokens = NEW_TOKENS, .ignore_eos = true};
        for (int i = 0; i < N_SEQS; i++) {
            if (engine_generate(bf16, &other.seqs[i], 1, &opt, NULL, NULL, err) != 0) CHECK(0, "%s", err);
            alone_same += other.seqs[i].n_tokens == got.seqs[i].n_tokens &&
                          memcmp(other.seqs[i].tokens, got.seqs[i].tokens,
                                 sizeof(int) * (size_t)got.seqs[i].n_tokens) == 0;
        }
        printf("  %-22s bf16 alone vs in the batch: %2d/%d identical\n", names[p], alone_same, N_SEQS);
        free_requests(&other);
        free_requests(&got);
        free_requests(&ref);
    }
    model_free(cpu);
    model_free(f32);
    model_free(bf16);
}

/* Deterministic mode on both CUDA tables: the engine's log-probs are the
 * trainer's bit for bit, and a sequence's completion and log-probs are the same
 * bits alone, in the batch, two at a time, under preemption and in eager mode. */
static void run_deterministic(const char *dir, const char *adapter) {
    char err[ERR_LEN];
    const Backend *tables[2] = {backend_cuda(), backend_cuda_f32()};
    for (int b = 0; b < 2; b++) {
        Model *m = NULL;
        if (load_model(&m, dir, adapter, tables[b], err) != 0) {
            CHECK(0, "%s: %s", dir, err);
            return;
        }
        printf("%s on %s, deterministic mode\n", dir, tables[b]->name);
        SamplingParams greedy = sampling_params_greedy();
        SamplingParams sampled = {.temperature = 0.7f, .top_k = 20, .top_p = 0.9f, .repetition_penalty = 1.0f,
                                  .seed = 21};
        const SamplingParams *params[2] = {&greedy, &sampled};
        const char *names[2] = {"greedy", "temperature 0.7, top-k/top-p"};
        for (int p = 0; p < 2; p++) {
            GenerateOptions opt = {.sampling = *params[p], .max_new_tokens = NEW_TOKENS, .ignore_eos = true};
            Requests ref;
            EngineStats st;
            EngineOptions det = {.deterministic = true};
            if (generate_on(m, &ref, params[p], &det, &st) != 0) break;
            double mean, max;
            int differ;
            float t = params[p]->temperature > 0 ? params[p]->temperature : 1.0f;
            CHECK(trainer_logprob_diff(m, &ref, t, &mean, &max, &differ, err) == 0, "trainer: %s", err);
            printf("  %-30s engine vs trainer log-probs: %d of %d tokens differ (max %.2g); graph steps %d/%d\n",
                   names[p], differ, N_SEQS * NEW_TOKENS, max, st.graph_steps, st.steps);
            CHECK(differ == 0, "%s: %d engine log-probs differ from the trainer's (max %.3g)", names[p], differ, max);
            CHECK(st.graph_steps > 0, "deterministic mode replayed no CUDA graph");
            struct {
                const char *what;
                EngineOptions eo;
            } cases[] = {
                {"2 running at most", {.deterministic = true, .max_num_seqs = 2}},
                {"pool of 6 blocks", {.deterministic = true, .max_pool_blocks = 6}},
                {"eager", {.deterministic = true, .enforce_eager = true}},
                {"no prefix caching", {.deterministic = true, .no_prefix_caching = true}},
            };
            for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
                Requests got;
                if (generate_on(m, &got, params[p], &cases[k].eo, &st) != 0) break;
                int same = bit_identical(&ref, &got);
                printf("  %-30s %s: %2d/%d bit-identical (preemptions %d)\n", names[p], cases[k].what, same, N_SEQS,
                       st.preemptions);
                CHECK(same == N_SEQS, "%s, %s: %d/%d bit-identical", names[p], cases[k].what, same, N_SEQS);
                free_requests(&got);
            }
            Requests alone;
            make_requests(&alone, model_config(m)->vocab_size);
            for (int i = 0; i < N_SEQS; i++)
                CHECK(engine_generate(m, &alone.seqs[i], 1, &opt, &det, NULL, err) == 0, "alone: %s", err);
            int same = bit_identical(&ref, &alone);
            printf("  %-30s alone vs in the batch: %2d/%d bit-identical\n", names[p], same, N_SEQS);
            CHECK(same == N_SEQS, "%s: alone vs batch %d/%d bit-identical", names[p], same, N_SEQS);
            free_requests(&alone);
            free_requests(&ref);
        }
        tables[b]->set_batch_invariant(tables[b], 0); /* the instance's mode: back to the default */
        model_free(m);
    }
}

/* The engine as colt train keeps it, from round to round with optimizer steps between: a step writes the
 * weights in place, so the graphs recorded in one round are replayed in the next (none recorded again) and
 * the completions are a fresh engine's on the new weights, bit for bit. When the backend grows a buffer the
 * graphs read (a training op's larger scratch) they are recorded again, and the completions are still a fresh
 * engine's. */
/* With adapter: LoRA's, switched off and on again before each step as the trainer does for the reference
 * log-probs of beta > 0; the graphs must survive that too. */
static void run_graphs_across_steps(const char *dir, const char *adapter) {
    char err[ERR_LEN];
    const Backend *be = backend_cuda();
    Model *m = NULL;
    Engine *e = NULL;
    Optimizer *opt = NULL;
    ModelGrads *grads = NULL;
    if (load_model(&m, dir, adapter, be, err) != 0) {
        CHECK(0, "%s: %s", dir, err);
        return;
    }
    printf("%s%s%s on %s: one engine across optimizer steps%s\n", dir, adapter ? " + LoRA " : "", adapter ? adapter : "",
           be->name, adapter ? ", the adapters switched off and on before each" : "");
    EngineOptions det = {.deterministic = true};
    GenerateOptions go = {.sampling = {.temperature = 0.7f, .top_k = 20, .top_p = 0.9f, .repetition_penalty = 1.0f,
                                       .seed = 21},
                          .max_new_tokens = NEW_TOKENS,
                          .ignore_eos = true};
    AdamWConfig ac = {.beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f};
    CHECK(engine_create(&e, m, &det, MAX_PROMPT + NEW_TOKENS, N_SEQS, err) == 0, "engine_create: %s", err);
    CHECK(optim_create(&opt, m, &ac, be, err) == 0 && model_grads_create(&grads, m, err) == 0, "%s", err);
    if (!e || !opt || !grads) goto done;
    size_t n_grads = 0;
    void *g = model_grads_flat(grads, &n_grads);
    float *host = malloc(sizeof(float) * n_grads);
    for (size_t k = 0; k < n_grads; k++) host[k] = (float)(rng_uniform(5, 0, k) - 0.5);
    be->copy_from_host(be, g, host, sizeof(float) * n_grads);
    free(host);

    Requests before;
    EngineStats st;
    make_requests(&before, model_config(m)->vocab_size);
    CHECK(engine_run(e, before.seqs, N_SEQS, &go, &st, err) == 0, "engine_run: %s", err);
    printf("  round 1: %d graphs recorded, %d of %d steps replayed\n", st.graphs_captured, st.graph_steps, st.steps);
    CHECK(st.graphs_captured > 0, "the first round recorded no graph");
    for (int round = 2; round <= 3; round++) {
        if (adapter) {
            model_lora_set_enabled(m, false);
            model_lora_set_enabled(m, true);
        }
        optim_step(opt, grads, 1e-2f);
        if (round == 3) { /* a training op's scratch larger than any so far: the buffer moves */
            uint64_t epoch = be->buffers_epoch(be);
            const int dim = model_config(m)->hidden_size;
            void *w = be->alloc(be, (size_t)dim);
            be->zero(be, w, (size_t)dim);
            for (int n = 1 << 14; be->buffers_epoch(be) == epoch && n <= 1 << 22; n *= 4) {
                void *x = be->alloc(be, (size_t)n * dim), *dx = be->alloc(be, (size_t)n * dim);
                be->zero(be, x, (size_t)n * dim);
                be->zero(be, dx, (size_t)n * dim);
                be->rmsnorm_backward(be, dx, NULL, x, x, w, n, dim, 1e-6f);
                be->synchronize(be);
                be->free(be, x), be->free(be, dx);
            }
            be->free(be, w);
            CHECK(be->buffers_epoch(be) != epoch, "no op grew the backend's scratch: the case shows nothing");
        }
        Requests got, fresh;
        make_requests(&got, model_config(m)->vocab_size);
        make_requests(&fresh, model_config(m)->vocab_size);
        CHECK(engine_run(e, got.seqs, N_SEQS, &go, &st, err) == 0, "engine_run: %s", err);
        CHECK(engine_generate(m, fresh.seqs, N_SEQS, &go, &det, NULL, err) == 0, "engine_generate: %s", err);
        int same = bit_identical(&got, &fresh), moved = N_SEQS - bit_identical(&got, &before);
        printf("  round %d, after an optimizer step%s: %d graphs recorded, %d of %d steps replayed; %2d/%d "
               "bit-identical to a fresh engine (%d of %d differ from round 1)\n",
               round, round == 3 ? " and a scratch that grew" : "", st.graphs_captured, st.graph_steps, st.steps, same,
               N_SEQS, moved, N_SEQS);
        CHECK(same == N_SEQS, "round %d: %d of %d completions differ from a fresh engine's", round, N_SEQS - same,
              N_SEQS);
        CHECK(moved > 0, "round %d: the optimizer step changed no completion: the case shows nothing", round);
        CHECK(st.graph_steps > 0, "round %d replayed no graph", round);
        if (round == 2) CHECK(st.graphs_captured == 0, "round 2 recorded %d graphs again", st.graphs_captured);
        if (round == 3) CHECK(st.graphs_captured > 0, "after the scratch moved no graph was recorded again");
        free_requests(&got);
        free_requests(&fresh);
    }
    free_requests(&before);
done:
    optim_free(opt);
    model_grads_free(grads);
    engine_destroy(e);
    be->set_batch_invariant(be, 0);
    model_free(m);
}

int main(void) {
    if (!backend_cuda()) {
        printf("test_cuda_engine: no GPU\n");
        return 77;
    }
    run("tests/data/models/tiny-qwen2-f32", NULL);
    run("models/stories260K", NULL);
    run("tests/data/models/tiny-llama3-f32", NULL); /* llama3 RoPE: the paged, fused and all-layers rope paths */
    run("tests/data/models/tiny-qwen3-f32", NULL);  /* Qwen3: q/k norm per head (rmsnorm rows of head_dim 24) */
    /* LoRA: the adapter term after each adapted linear layer, q/k/v and gate/up unfused */
    run("tests/data/models/tiny-qwen3-f32", "tests/data/lora/qwen3-all-linear");
    run("tests/data/models/tiny-llama-f32", "tests/data/lora/llama-qv-rslora");
    run_deterministic("tests/data/models/tiny-qwen2-f32", NULL);
    run_deterministic("models/stories260K", NULL);
    run_deterministic("tests/data/models/tiny-qwen3-f32", "tests/data/lora/qwen3-all-linear");
    run_graphs_across_steps("tests/data/models/tiny-qwen2-f32", NULL);
    run_graphs_across_steps("tests/data/models/tiny-qwen3-f32", "tests/data/lora/qwen3-all-linear");
    printf("test_cuda_engine: %d checks, %d failures\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
