/* fuzz_trainer_state.c — libFuzzer target: a checkpoint's trainer_state.json
 * as resume reads it (checkpoint_state_parse), on arbitrary bytes. Must never
 * crash or leak; when it accepts, every index the trainer will use must lie
 * inside the run's shape (checked here). The shape is that of the seed, a
 * mid-round checkpoint of `colt train` on the demo with 2 prompts x 2
 * completions of at most 8 tokens (fuzz/seeds/fuzz_trainer_state). */
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "train/checkpoint.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    StateLimits lim = {.resume_record = NULL,
                       .rollout = {.n_samples = 4, .group_size = 2, .n_funcs = 1, .max_prompt_len = 22,
                                   .max_completion_len = 8, .vocab_size = 512, .dataset_rows = 128,
                                   .micro_per_round = 2, .micro_batch_samples = 2, .has_old_logp = true,
                                   .has_ref_logp = true},
                       .total_steps = 100};
    CheckpointState st;
    char err[ERR_LEN];
    if (checkpoint_state_parse(&st, (const char *)data, size, &lim, "fuzz/trainer_state.json", err) == 0) {
        const TrainerProgress *p = &st.progress;
        COLT_ASSERT(p->global_step >= 0 && p->global_step <= lim.total_steps && p->round >= 0);
        COLT_ASSERT(p->epoch_pos <= lim.rollout.dataset_rows);
        const Rollout *r = &st.rollout;
        if (r->samples) {
            COLT_ASSERT(r->n_samples == 4 && r->n_prompts == 2 && r->micro_done >= 0 && r->micro_done < 2);
            for (int i = 0; i < r->n_samples; i++) {
                const Sample *s = &r->samples[i];
                COLT_ASSERT(r->order[i] >= 0 && r->order[i] < r->n_samples);
                COLT_ASSERT(s->prompt == i / 2 && s->len >= 1 && s->len <= 8);
                COLT_ASSERT(s->old_logp && s->ref_logp);
                for (int j = 0; j < s->len; j++) COLT_ASSERT(s->completion[j] >= 0 && s->completion[j] < 512);
            }
            for (int p2 = 0; p2 < r->n_prompts; p2++) {
                COLT_ASSERT(r->rows[p2] < 128 && r->prompt_len[p2] >= 1 && r->prompt_len[p2] <= 22);
                for (int j = 0; j < r->prompt_len[p2]; j++)
                    COLT_ASSERT(r->prompt_ids[p2][j] >= 0 && r->prompt_ids[p2][j] < 512);
            }
        }
        checkpoint_state_free(&st);
    }
    return 0;
}
