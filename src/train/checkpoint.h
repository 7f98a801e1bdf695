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
 * trainer_state.json also lists every other file of the folder with its size
 * and XXH64 ("files"), and the hash of its own content ("state_xxh64"); a
 * resume refuses a folder whose files differ, naming the file. trainer_state.json is written last, so a folder whose files match
 * it is complete.
 *
 * Folders are written under a temporary name ("checkpoint-N.tmp.PID"); one
 * that replaces an existing checkpoint moves the old one aside
 * ("checkpoint-N.old.PID") before the rename and deletes it after, so a whole
 * copy exists under a recognised name at every instant. A run prunes only what
 * it may (see CheckpointKeeper) and, at start, puts back a complete copy that
 * a killed run left under one of those names, then removes the rest. */
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

/* trainer_state.json's "files": {name: {"size": bytes, "xxh64": "16 hex digits"}}
 * of dir's regular files but trainer_state.json, in name order. */
int checkpoint_files_manifest(json_t **out, const char *dir, char *err);

/* Adds "files" (checkpoint_files_manifest of dir) and "state_xxh64" (the hash
 * of the rest of state) to state, the last thing done before writing it as
 * dir's trainer_state.json. checkpoint_state_parse checks state_xxh64. */
int checkpoint_state_seal(json_t *state, const char *dir, char *err);

/* Checks ckpt's files against the "files" of its trainer_state.json; err names
 * the first file missing, of another size or another content ("resume from
 * DIR: model.safetensors does not match ..."). A trainer_state.json without
 * "files" (an older colt's) passes with *has_manifest false. */
int checkpoint_verify_files(const char *ckpt, bool *has_manifest, char *err);

/* The tensor_parallel_size checkpoint ckpt was saved with, from its
 * optimizer files' names (optimizer-tpNNNNN-of-NNNNN...); 0 if none says. */
int checkpoint_saved_tensor_parallel_size(const char *ckpt);

/* Puts the complete folder output_dir/tmp_name in place as output_dir/name.
 * An existing name is first renamed to "<name>.old.<pid>" and deleted after,
 * so at every instant a complete copy is under name, tmp_name or the aside
 * name (what checkpoint_recover_leftovers recognises). Tests may set
 * COLT_TEST_REPLACE_PAUSE_MS to sleep between the steps. */
int checkpoint_install(const char *output_dir, const char *tmp_name, const char *name, char *err);

/* fsync of a folder, so files renamed into it are there after a crash. */
void checkpoint_sync_folder(const char *path);

/* Cleans output_dir of what runs that were killed left ("<name>.tmp.<pid>"
 * and "<name>.old.<pid>" whose process is gone): a checkpoint-N missing, or
 * not complete, takes back a complete copy (the new one first, else the old
 * one), counted in *restored; everything else is removed. Returns how many
 * were removed. Never removes the last complete copy of a checkpoint. */
int checkpoint_recover_leftovers(const char *output_dir, int *restored);

/* Deletes a folder and everything in it (no error when it does not exist). */
void remove_tree(const char *path);

#endif
