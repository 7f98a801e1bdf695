/* checkpoint.h — what `colt train` saves in output_dir/checkpoint-N and how it
 * reads it back without trusting it.
 *
 * A checkpoint folder: the model (HF format) with its tokenizer files,
 * optimizer.safetensors, train_config.json, and trainer_state.json — the
 * counters, the pending metrics, the current round's samples when the
 * checkpoint falls inside a round, and the resume record: fingerprints of the
 * base model, tokenizer and dataset, and every setting the saved state
 * depends on. Resuming refuses a checkpoint whose record differs from the run
 * (naming the setting and both values), and checks every count, index and
 * number in trainer_state.json before using it.
 *
 * Folders are written under a temporary name and renamed into place; a run
 * prunes only what it may (see CheckpointKeeper) and removes the temporaries
 * that killed runs left behind. */
#ifndef COLT_TRAIN_CHECKPOINT_H
#define COLT_TRAIN_CHECKPOINT_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "train/grpo.h"
#include "train/metrics.h"
#include "train/rollout.h"
#include "train/train_config.h"

/* ---------------------------------------------------------------- the resume record */

/* 16 hex digits of a 64-bit FNV-1a hash, and a NUL. */
typedef char Fingerprint[17];

/* Of a model folder: config.json, the safetensors index when sharded, and of
 * each weights file its size, header and samples spread over its data (a few
 * MB read whatever the model's size). */
int fingerprint_model_dir(Fingerprint out, const char *dir, char *err);
/* Of the tokenizer files present in dir (tokenizer.json, tokenizer_config.json, ...), whole. */
int fingerprint_tokenizer_dir(Fingerprint out, const char *dir, char *err);
/* Of one whole file. */
int fingerprint_file(Fingerprint out, const char *path, char *err);

/* The record of a run: the fingerprints and the settings a saved state assumes
 * (batch shape, generation, rewards, data, seed, beta). Fails only when a file
 * cannot be read. */
int checkpoint_resume_record(json_t **out, const TrainConfig *c, char *err);

/* COLT_OK when saved (from checkpoint ckpt) equals current; else err names the
 * first difference: "resume from runs/x/checkpoint-30: per_device_train_batch_size
 * was 16 there, 32 here (...)". */
int checkpoint_check_resume_record(const json_t *saved, const json_t *current, const char *ckpt, char *err);

/* ---------------------------------------------------------------- trainer_state.json */

/* The trainer's progress counters. */
typedef struct TrainerProgress {
    int64_t global_step;  /* optimizer steps done */
    int64_t round;        /* generation rounds started */
    uint64_t epoch;       /* 0 before the first round, then 1, 2, ... */
    size_t epoch_pos;     /* prompts taken from the current epoch's order */
    int64_t num_tokens;   /* prompt + completion tokens seen */
} TrainerProgress;

/* Everything trainer_state.json holds, parsed and checked. */
typedef struct CheckpointState {
    TrainerProgress progress;
    Metrics metrics;                    /* accumulated since the last logging step */
    Rollout rollout;                    /* empty unless the checkpoint falls inside a round */
    GrpoSamplingMetrics round_sampling; /* the round's sampling metrics so far (inside a round) */
    json_t *resume_record;              /* owned */
} CheckpointState;

/* What a state read back must agree with. */
typedef struct StateLimits {
    const json_t *resume_record;  /* this run's (checkpoint_resume_record), checked first; NULL: not checked */
    const char *checkpoint;       /* the folder, for messages */
    RolloutShape rollout;
    int64_t total_steps;          /* global_step may not exceed it */
} StateLimits;

/* trainer_state.json's text for a state (the rollout only when inside a round). */
json_t *checkpoint_state_json(const TrainerProgress *p, const Metrics *m, const Rollout *in_round,
                              int micro_batch_samples, const GrpoSamplingMetrics *round_sampling,
                              const json_t *resume_record);

/* Parses and checks trainer_state.json's text (name: for messages): its resume
 * record against lim->resume_record first (a changed setting is named as such,
 * not as the damage it does to the saved rollout), then every field. On error
 * *st is empty (checkpoint_state_free is still safe to call). */
int checkpoint_state_parse(CheckpointState *st, const char *text, size_t len, const StateLimits *lim,
                           const char *name, char *err);
void checkpoint_state_free(CheckpointState *st);

/* ---------------------------------------------------------------- folders */

/* Which checkpoint-N folders of output_dir a run may delete for
 * save_total_limit: those it wrote, and those older than the step it resumed
 * from (the same history) — never the one it resumed from, and never newer
 * ones left by an earlier run (they are replaced when this run reaches them). */
typedef struct CheckpointKeeper {
    char *output_dir;
    int limit;               /* save_total_limit; 0 = keep all */
    int64_t resume_step;     /* -1: a fresh run */
    char *resume_real_path;  /* realpath of the resume source, or NULL */
    int64_t *written;        /* steps this run saved */
    int n_written, cap_written;
} CheckpointKeeper;

void checkpoint_keeper_init(CheckpointKeeper *k, const char *output_dir, int limit, const char *resume_dir,
                            int64_t resume_step);
void checkpoint_keeper_free(CheckpointKeeper *k);
/* Records that this run saved checkpoint-step, then deletes what the limit
 * allows. A folder that cannot be deleted is logged, not an error. */
void checkpoint_keeper_saved(CheckpointKeeper *k, int64_t step);

/* Removes output_dir's "<name>.tmp.<pid>" files and folders whose process is
 * gone (left by a run that was killed while writing). Returns how many. */
int checkpoint_remove_stale_temporaries(const char *output_dir);

/* Deletes a folder and everything in it (no error when it does not exist). */
void remove_tree(const char *path);

#endif
