/* bench_rounds.c — a GRPO run's generation rounds on the GPU: what keeping the
 * engine from round to round saves (colt train's rounds engine, engine_run)
 * against a fresh engine every round (engine_generate, what colt train did).
 *
 * Each round: PROMPTS x G sequences (GRPO's copies of a prompt, PROMPT_LEN
 * random tokens), completions ending at lengths spread evenly over 1..NEW_TOKENS
 * (a trained model's do; a random model never stops, so each request gets its
 * own max_new_tokens), temperature 1. Between rounds the weights change in
 * place, as an optimizer step writes them (model_weights_changed_in_place):
 * the engine forgets its K/V and prefix cache either way. The batch shrinks
 * through the decode sizes as sequences finish; a fresh engine records a CUDA
 * graph for every size it meets twice, every round; the kept one records
 * them in its first round only.
 * Usage: bench_rounds [preset ...]  (0.5b 1.5b 7b 8b; default 0.5b 1.5b)
 * COLT_ROUNDS=6, COLT_PROMPTS=16, COLT_G=8, COLT_PROMPT_LEN=160, COLT_DECODE_TOKENS=256;
 * COLT_DETERMINISTIC=0 turns the deterministic mode (colt train's default on bf16) off.
 * The two ways alternate round by round on one model, so drift hits both. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_bench.h"
#include "core/error.h"
#include "core/rng.h"
#include "core/log.h"
#include "engine/engine.h"
#include "model/model.h"

#include "bench_gpu_shapes.h"

static int env_int(const char *name, int fallback) {
    const char *e = getenv(name);
    return e && atoi(e) >= 0 && *e ? atoi(e) : fallback;
}

typedef struct Round {
    int n, prompt_len, new_tokens;
    int *prompts;
    GenSequence *seqs;
    GenerateOptions *opts;
} Round;

static void round_make(Round *r, int vocab, int prompts, int g, int prompt_len, int new_tokens, int round) {
    r->n = prompts * g, r->prompt_len = prompt_len, r->new_tokens = new_tokens;
    r->prompts = malloc(sizeof(int) * (size_t)prompts * prompt_len);
    for (int i = 0; i < prompts * prompt_len; i++)
        r->prompts[i] = (int)(rng_uniform(11, (uint64_t)round * prompts + (uint64_t)(i / prompt_len),
                                          (uint64_t)(i % prompt_len)) * (vocab - 1));
    r->seqs = calloc((size_t)r->n, sizeof(GenSequence));
    r->opts = calloc((size_t)r->n, sizeof(GenerateOptions));
    for (int i = 0; i < r->n; i++) {
        r->seqs[i] = (GenSequence){.prompt = r->prompts + (size_t)(i / g) * prompt_len, .prompt_len = prompt_len,
                                   .stream = (uint64_t)round * r->n + (uint64_t)i};
        /* lengths 1..new_tokens, spread over the copies of each prompt and across prompts */
        int len = 1 + (int)((((uint64_t)i * 7919u) % (uint64_t)r->n) * (uint64_t)new_tokens / (uint64_t)r->n);
        r->opts[i] = (GenerateOptions){.sampling = {.temperature = 1.0f, .top_p = 1.0f, .repetition_penalty = 1.0f,
                                                    .seed = 1},
                                       .max_new_tokens = len,
                                       .ignore_eos = true};
    }
}

static void round_free(Round *r) {
    for (int i = 0; i < r->n; i++) gen_sequence_free(&r->seqs[i]);
    free(r->seqs), free(r->opts), free(r->prompts);
}

/* One round on e: every request added, stepped to the end. Returns the sampled tokens, or -1. */
static long run_round(Engine *e, Round *r, char *err) {
    for (int i = 0; i < r->n; i++)
        if (engine_add_request(e, &r->seqs[i], &r->opts[i], (uint64_t)i, err) != 0) return -1;
    while (engine_has_work(e)) {
        const EngineEvent *ev;
        int n_ev;
        if (engine_step(e, &ev, &n_ev, err) != 0) return -1;
    }
    long tokens = 0;
    for (int i = 0; i < r->n; i++) tokens += r->seqs[i].n_tokens;
    return tokens;
}

typedef struct Totals {
    double seconds, decode_seconds;
    long tokens, graphs, steps;
    int rounds;
} Totals;

static void add_stats(Totals *t, double seconds, long tokens, const EngineStats *a, const EngineStats *b) {
    t->seconds += seconds, t->tokens += tokens, t->rounds++;
    t->decode_seconds += b->decode_seconds - a->decode_seconds;
    t->graphs += b->graphs_captured - a->graphs_captured;
    t->steps += b->steps - a->steps;
}

int main(int argc, char **argv) {
    const Backend *be = backend_cuda();
    if (!be) {
        printf("no CUDA device\n");
        return 77;
    }
    const int rounds = env_int("COLT_ROUNDS", 6), prompts = env_int("COLT_PROMPTS", 16), g = env_int("COLT_G", 8);
    const int prompt_len = env_int("COLT_PROMPT_LEN", 160), new_tokens = env_int("COLT_DECODE_TOKENS", 256);
    const bool deterministic = env_int("COLT_DETERMINISTIC", 1) > 0;
    const char *want[8] = {"0.5b", "1.5b"};
    int n_want = 2;
    if (argc > 1) {
        n_want = argc - 1 < 8 ? argc - 1 : 8;
        for (int i = 0; i < n_want; i++) want[i] = argv[i + 1];
    }
    printf("GRPO generation rounds on %s (bf16%s): %d prompts x %d, prompts of %d tokens, completions of 1-%d "
           "tokens spread evenly, %d rounds, the weights changed in place between rounds; means of rounds 2-%d\n\n",
           be->name, deterministic ? ", deterministic mode" : "", prompts, g, prompt_len, new_tokens, rounds, rounds);
    printf("| model | engine | ms per round | decode ms | graphs recorded per round | steps per round | tokens per "
           "round | tokens/s |\n|---|---|---:|---:|---:|---:|---:|---:|\n");
    char err[ERR_LEN];
    for (int w = 0; w < n_want; w++) {
        const Shape *s;
        Model *m = shape_random_model(want[w], be, &s);
        if (!m) continue;
        const int n = prompts * g, max_len = prompt_len + new_tokens;
        EngineOptions eo = {.deterministic = deterministic, .max_num_seqs = engine_round_max_num_seqs(n)};
        Engine *kept = NULL;
        if (engine_create(&kept, m, &eo, max_len, n, err) != 0) {
            printf("| %s | %s |\n", s->name, err);
            model_free(m);
            continue;
        }
        Totals fresh = {0}, keep = {0};
        int rc = 0;
        for (int k = 0; k < rounds && rc == 0; k++) {
            for (int way = 0; way < 2 && rc == 0; way++) { /* 0: a fresh engine, 1: the kept one */
                Round r;
                round_make(&r, s->vocab, prompts, g, prompt_len, new_tokens, k);
                model_weights_changed_in_place(m); /* the optimizer step before this round */
                EngineStats a, b;
                double t0 = time_now();
                Engine *e = kept;
                if (way == 0 && engine_create(&e, m, &eo, max_len, n, err) != 0) rc = -1;
                if (rc == 0) engine_stats(e, &a);
                long tokens = rc == 0 ? run_round(e, &r, err) : -1;
                if (tokens < 0) rc = -1;
                if (rc == 0) engine_stats(e, &b);
                if (way == 0) engine_destroy(e);
                be->synchronize(be);
                double dt = time_now() - t0;
                if (rc == 0 && k > 0) add_stats(way == 0 ? &fresh : &keep, dt, tokens, &a, &b);
                round_free(&r);
            }
        }
        if (rc != 0) printf("| %s | error: %s |\n", s->name, err);
        const Totals *rows[2] = {&fresh, &keep};
        const char *names[2] = {"fresh every round (before)", "kept between rounds"};
        for (int k = 0; k < 2 && rc == 0; k++) {
            const Totals *t = rows[k];
            double per = t->rounds ? 1.0 / t->rounds : 0;
            printf("| %s | %s | %.1f | %.1f | %.1f | %.0f | %.0f | %.0f |\n", s->name, names[k], 1e3 * t->seconds * per,
                   1e3 * t->decode_seconds * per, t->graphs * per, t->steps * per, t->tokens * per,
                   t->seconds > 0 ? t->tokens / t->seconds : 0);
        }
        engine_destroy(kept);
        model_free(m);
    }
    return 0;
}
