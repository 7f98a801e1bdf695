/* cpu_sample.c — STUB, being written (the sample op on the CPU). */
#include <stdio.h>
#include <stdlib.h>

#include "backend/cpu/cpu_engine_ops.h"

void cpu_sample(void *tokens, void *logprobs, void *logits, int n, int vocab, const struct SamplingParams *p,
                const void *seq, const void *streams, const void *counters, void *history, void *history_len,
                int history_stride) {
    fprintf(stderr, "cpu_sample: not written yet\n");
    abort();
}
