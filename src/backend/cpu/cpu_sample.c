/* cpu_sample.c — the sample, apply_penalties and apply_token_bitmask ops of the CPU reference backend (backend.h,
 * "generation engine"): the host sampler (backend/sampling.h) run on each row.
 *
 * logits are [n, V] fp32 and clobbered; [i32] arguments are host int arrays.
 * Rows run in parallel (one Sampler scratch per OpenMP thread), so two rows
 * must not belong to the same sequence: each appends to its own history.
 * Not a fast path: a filtered row sorts its whole vocabulary. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "backend/cpu/cpu_engine_ops.h"
#include "backend/sampling.h"
#include "core/error.h"

void cpu_sample(const Backend *be, void *tokens, void *logprobs, void *logits, int n, int vocab, const struct SamplingParams *p,
                const void *seq, const void *streams, const void *counters, void *history, void *history_len,
                int history_stride) {
    int *out_tokens = tokens, *hist = history, *hist_len = history_len;
    float *out_logprobs = logprobs, *rows = logits;
    const int *seqs = seq, *stream_ids = streams, *counter_ids = counters;
#pragma omp parallel num_threads(cpu_team(be, 20.0 * n * vocab))
    {
        Sampler sampler;
        sampler_init(&sampler, vocab);
#pragma omp for schedule(dynamic, 1)
        for (int i = 0; i < n; i++) {
            int s = seqs[i];
            if (s < 0) continue;
            int *seq_history = hist ? hist + (size_t)s * history_stride : NULL;
            int n_history = 0;
            if (hist) n_history = hist_len[s] < history_stride ? hist_len[s] : history_stride;
            float logprob;
            int token = sampler_sample(&sampler, rows + (size_t)i * vocab, p, seq_history, n_history,
                                       (uint64_t)stream_ids[i], (uint64_t)counter_ids[i], &logprob);
            out_tokens[i] = token;
            out_logprobs[i] = logprob;
            if (hist && hist_len[s] < history_stride) seq_history[hist_len[s]++] = token;
        }
        sampler_free(&sampler);
    }
}

void cpu_apply_penalties(const Backend *be, void *logits, int n, int vocab, const struct SamplingParams *p,
                         const void *seq, const void *history, const void *history_len, const void *prompt_len,
                         int history_stride, const void *bias_ids, const void *bias_values, const void *bias_len,
                         int bias_stride) {
    (void)be;
    float *rows = logits;
    const int *seqs = seq, *hist = history, *hist_len = history_len, *prompt = prompt_len, *b_ids = bias_ids,
              *b_len = bias_len;
    const float *b_values = bias_values;
#pragma omp parallel
    {
        int *scratch = xcalloc((size_t)vocab, sizeof(int)); /* sampler_apply_penalties leaves it zeroed */
#pragma omp for schedule(dynamic, 1)
        for (int i = 0; i < n; i++) {
            int s = seqs[i];
            if (s < 0) continue;
            int n_history = hist ? (hist_len[s] < history_stride ? hist_len[s] : history_stride) : 0;
            int n_prompt = hist ? (prompt[s] < n_history ? prompt[s] : n_history) : 0;
            int n_bias = b_ids ? (b_len[s] < bias_stride ? b_len[s] : bias_stride) : 0;
            sampler_apply_penalties(rows + (size_t)i * vocab, vocab, p, hist ? hist + (size_t)s * history_stride : NULL,
                                    n_history, n_prompt, b_ids ? b_ids + (size_t)s * bias_stride : NULL,
                                    b_values ? b_values + (size_t)s * bias_stride : NULL, n_bias, scratch);
        }
        free(scratch);
    }
}

void cpu_apply_token_bitmask(const Backend *be, void *logits, const void *bitmask, int n, int vocab) {
    (void)be;
    float *rows = logits;
    const uint32_t *words = bitmask;
    const size_t W = ((size_t)vocab + 31) / 32;
    for (int i = 0; i < n; i++) {
        float *row = rows + (size_t)i * vocab;
        const uint32_t *mask = words + (size_t)i * W;
        for (int v = 0; v < vocab; v++)
            if (!(mask[v >> 5] >> (v & 31) & 1u)) row[v] = -INFINITY;
    }
}
