/* model_score.c — a sequence classifier's scores (model.h model_score_sequences):
 * the score head on the last non-pad token of each sequence, as transformers'
 * *ForSequenceClassification picks it, run on the ordinary forward
 * (model_forward) with one cache slot per sequence.
 *
 * Not the reward built on it (data/rewards.c renders and tokenizes the texts)
 * and not a batch scheduler: sequences go in order, as many per call as fit a
 * fixed token budget.
 *
 * Dimension legend: S sequences per forward call (cache slots), L the longest
 * scored prefix, K labels. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "model/model.h"

/* Tokens per forward call: S = max(1, SCORE_TOKENS_PER_CALL / L) sequences
 * share a call. Bounds the KV cache (S x L per layer) and the activations the
 * transient state holds, whatever the batch, while a batch of short texts
 * still runs as few large GEMMs. */
#define SCORE_TOKENS_PER_CALL 4096

/* transformers: non_pad_mask = ids != pad; (arange(T) * non_pad_mask).argmax(-1):
 * the last non-pad position, 0 when there is none (argmax of all zeros). */
static int scored_position(const int *ids, int len, int pad_id) {
    if (pad_id < 0) return len - 1;
    for (int t = len - 1; t > 0; t--)
        if (ids[t] != pad_id) return t;
    return 0;
}

int model_score_sequences(Model *m, float *scores, const int *const *ids, const int *lens, int n, int pad_id,
                          char *err) {
    const ModelConfig *c = model_config(m);
    if (c->num_labels <= 0)
        return errorf(err, "model_score_sequences: the model is a causal LM, not a sequence classifier");
    if (n <= 0) return COLT_OK;
    int *keep = xmalloc(sizeof(int) * (size_t)n); /* tokens run per sequence: up to the scored one */
    int L = 1;
    for (int i = 0; i < n; i++) {
        if (lens[i] <= 0) {
            free(keep);
            return errorf(err, "model_score_sequences: sequence %d is empty (nothing to score)", i);
        }
        keep[i] = scored_position(ids[i], lens[i], pad_id) + 1;
        if (keep[i] > L) L = keep[i];
    }
    int S = SCORE_TOKENS_PER_CALL / L > 1 ? SCORE_TOKENS_PER_CALL / L : 1;
    if (S > n) S = n;
    const int K = c->num_labels;
    ModelState *st = NULL;
    int rc = model_state_create(&st, m, S, L, S * L, err);
    size_t T = (size_t)S * (size_t)L;
    int *tokens = xmalloc(sizeof(int) * T), *slot = xmalloc(sizeof(int) * T), *pos = xmalloc(sizeof(int) * T);
    uint8_t *want = xmalloc(T);
    float *out = xmalloc(sizeof(float) * (size_t)S * (size_t)K);
    for (int lo = 0; rc == 0 && lo < n; lo += S) {
        int hi = lo + S < n ? lo + S : n, k = 0;
        for (int i = lo; i < hi; i++)
            for (int t = 0; t < keep[i]; t++, k++) {
                tokens[k] = ids[i][t];
                slot[k] = i - lo;
                pos[k] = t;
                want[k] = t == keep[i] - 1; /* logits come back in token order: one row per sequence, in order */
            }
        rc = model_forward(m, st, tokens, slot, pos, k, want, out, err);
        if (rc == 0) memcpy(scores + (size_t)lo * K, out, sizeof(float) * (size_t)(hi - lo) * (size_t)K);
    }
    free(out), free(want), free(pos), free(slot), free(tokens), free(keep);
    model_state_free(st);
    return rc;
}
