/* test_cuda_structured.c — structured outputs on the GPU (GPU machine only): the regexes of
 * structured_cases.h (digits, an alternation, a JSON-ish pattern, a required suffix) on cuda_f32 and
 * cuda (bf16 storage), greedy and sampled with several seeds, through the engine (CUDA graphs on) and
 * generate(), and the engine in deterministic mode: every completion stops on a stop id and decodes to a
 * full match, forced tokens have log-prob 0. The mask (apply_token_bitmask) is checked op by op in
 * test_cuda_ops' table. Completions of the engine and generate() are counted alike, required equal on
 * cuda_f32 but for near-ties (10 of 14), reported on bf16 (paged and contiguous attention round apart).
 * Exit 77 when no GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "model/model.h"

#include "harness.h"
#include "structured_cases.h"

int main(void) {
    if (!backend_cuda()) {
        printf("no GPU: skipped\n");
        return 77;
    }
    double t0 = now_s();
    printf("cuda_f32\n");
    structured_run_backend(backend_cuda_f32(), NULL, 4, 10);
    printf("cuda (bf16)\n");
    structured_run_backend(backend_cuda(), NULL, 4, 0);
    printf("cuda (bf16), deterministic mode\n");
    EngineOptions det = {.deterministic = true};
    structured_run_backend(backend_cuda(), &det, 2, 0);
    backend_cuda()->set_batch_invariant(backend_cuda(), 0);
    printf("%d checks, %d failures (%.1f s)\n", g_checks, g_failures, now_s() - t0);
    return g_failures ? 1 : 0;
}
