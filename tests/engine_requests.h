/* engine_requests.h — the request set the engine tests (test_engine.c on the
 * CPU, gpu/test_cuda_engine.c) generate: 14 sequences, 3 runs of 3 identical
 * prompts (GRPO's layout, so prompt blocks are shared) and 5 single prompts of
 * 1 to 40 random tokens, RNG streams 0..13. */
#ifndef COLT_TESTS_ENGINE_REQUESTS_H
#define COLT_TESTS_ENGINE_REQUESTS_H

#include <stdbool.h>

#include "core/rng.h"
#include "engine/generate.h"

#define N_SEQS 14
#define MAX_PROMPT 40

typedef struct Requests {
    int prompts[N_SEQS][MAX_PROMPT];
    GenSequence seqs[N_SEQS];
} Requests;

static inline void make_requests(Requests *r, int vocab) {
    static const int lens[N_SEQS] = {17, 17, 17, 1, 33, 33, 33, 5, 40, 9, 9, 9, 16, 32};
    for (int i = 0; i < N_SEQS; i++) {
        bool copy = i > 0 && lens[i] == lens[i - 1] && lens[i] != 40;
        for (int k = 0; k < lens[i]; k++)
            r->prompts[i][k] = copy ? r->prompts[i - 1][k] : (int)(rng_uniform(99, (uint64_t)i, (uint64_t)k) * vocab);
        r->seqs[i] = (GenSequence){.prompt = r->prompts[i], .prompt_len = lens[i], .stream = (uint64_t)i};
    }
}

static inline void free_requests(Requests *r) {
    for (int i = 0; i < N_SEQS; i++) gen_sequence_free(&r->seqs[i]);
}

#endif
