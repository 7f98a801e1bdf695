/* trainer_checkpoint.c — saving a checkpoint of the run (the model, the optimizer
 * state whole or in shards, trainer_state.json sealed last) and resuming from
 * one. Not the formats themselves: trainer_state.json and its checks are in
 * checkpoint.c, the rollout's JSON in rollout.c, the optimizer's files in optim.c. */
#include "train/trainer_internal.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <unistd.h>
#include "core/fileio.h"
#include "tokenizer/tokenizer_files.h"
#include "core/error.h"
#include "core/log.h"

/* What a rollout of this run looks like (a saved one is checked against it). */
static RolloutShape rollout_shape(const Trainer *t) {
    const TrainConfig *c = t->cfg;
    return (RolloutShape){.n_samples = c->generation_batch_size, .group_size = c->num_generations,
                          .n_funcs = t->n_rewards, .max_prompt_len = t->max_prompt_tokens,
                          .max_completion_len = c->max_completion_length,
                          .vocab_size = model_config(t->model)->vocab_size, .dataset_rows = dataset_size(t->data),
                          .micro_per_round = c->steps_per_generation * c->num_iterations,
                          .micro_batch_samples = c->per_device_train_batch_size * t->dist.world,
                          .has_old_logp = t->need_old_logp, .has_ref_logp = trainer_has_reference(t)};
}

/* trainer_state.json's content now (NULL if a sample cannot be written as JSON). */
json_t *trainer_state_json(const Trainer *t) {
    TrainerProgress p = {.global_step = t->global_step, .round = t->round, .epoch = t->epoch,
                         .epoch_pos = t->epoch_pos, .num_tokens = t->num_tokens};
    if (t->next.active) { /* async_generation: the round in flight is not saved; its prompts are taken again */
        p.epoch = t->next.epoch_before;
        p.epoch_pos = t->next.epoch_pos_before;
    }
    bool in_round = t->ro.samples && t->ro.micro_done < t->cfg->steps_per_generation * t->cfg->num_iterations;
    return checkpoint_state_json(&p, &t->metrics, in_round ? &t->ro : NULL,
                                 t->cfg->per_device_train_batch_size * t->dist.world, &t->round_sampling,
                                 t->resume_record);
}

void trainer_last_checkpoint_text(const Trainer *t, char *buf, size_t size) {
    if (t->last_checkpoint) snprintf(buf, size, "the last good checkpoint is %s", t->last_checkpoint);
    else snprintf(buf, size, "no checkpoint was saved");
}

/* Writes what this run trains to dir: the model, or its LoRA adapters (PEFT's
 * files). The weights in their storage dtype — bf16 on a GPU, as Hugging Face
 * checkpoints hold them (no rounding: they are bf16 values), fp32 on the CPU;
 * a resume takes the exact fp32 masters from the optimizer state. */
int trainer_save_trained(const Trainer *t, const char *dir, char *err) {
    if (model_has_lora(t->model)) return model_lora_save(t->model, dir, t->cfg->model, err);
    return model_save(t->model, dir, t->be->storage == DTYPE_BF16 ? DTYPE_BF16 : DTYPE_F32, err);
}

/* An unsharded optimizer's file: one, or one per part under tensor parallelism
 * (a checkpoint resumes at the same tensor_parallel_size). */
static void optimizer_file_name(const Trainer *t, char *buf, size_t size) {
    if (t->tp.tp_size > 1)
        snprintf(buf, size, "optimizer-tp%05d-of-%05d.safetensors", t->tp.tp_rank, t->tp.tp_size);
    else
        snprintf(buf, size, "optimizer.safetensors");
}

/* The optimizer shard file of data-parallel rank r in a checkpoint of a
 * sharded run (of this rank's part under tensor parallelism). */
static void shard_file_name(const Trainer *t, char *buf, size_t size, int rank, int world) {
    if (t->tp.tp_size > 1)
        snprintf(buf, size, "optimizer-tp%05d-rank%05d-of-%05d.safetensors", t->tp.tp_rank, rank, world);
    else
        snprintf(buf, size, "optimizer-rank%05d-of-%05d.safetensors", rank, world);
}

/* The list of a sharded run's shard files: one, or one per part under tensor parallelism. */
static void manifest_name(const Trainer *t, char *buf, size_t size) {
    if (t->tp.tp_size > 1)
        snprintf(buf, size, "optimizer_shards-tp%05d-of-%05d.json", t->tp.tp_rank, t->tp.tp_size);
    else
        snprintf(buf, size, "optimizer_shards.json");
}

/* The temporary folder carries rank 0's pid (a stale one is recognised as
 * such): every rank that writes into it learns it. */
static int folder_pid(Trainer *t, bool sharded, bool tp, long *pid_out, char *err) {
    long pid = (long)getpid();
    int rc = COLT_OK;
    if (sharded) {
        long *pids = xcalloc((size_t)t->dist.world, sizeof(long));
        rc = train_dist_agree(&t->dist, train_dist_gather(&t->dist, pids, &pid, sizeof pid, err), err);
        pid = pids[0];
        free(pids);
        if (rc != 0) return rc;
    }
    if (tp) { /* every rank of the launch writes into rank 0's folder */
        long *pids = xcalloc((size_t)t->dist.all_world, sizeof(long));
        rc = train_dist_agree(&t->dist, comm_all_gather(t->dist.all, pids, &pid, sizeof pid, COMM_BYTE, NULL, err), err);
        pid = pids[0];
        free(pids);
    }
    *pid_out = pid;
    return rc;
}

/* A sharded optimizer's state: every rank its shard into dir, then rank 0
 * the list of them (collective; rc: the folder's outcome so far). */
static int save_optimizer_shards(Trainer *t, const char *dir, int64_t step, int rc, char *err) {
    rc = train_dist_agree(&t->dist, rc, err); /* the folder exists */
    if (rc == 0) {
        char file[64];
        shard_file_name(t, file, sizeof file, t->dist.rank, t->dist.world);
        char *path = path_join(dir, file);
        rc = train_dist_agree(&t->dist, optim_save_shard(t->optimizer.opt, path, err), err);
        free(path);
    }
    if (rc == 0 && t->dist.rank == 0) {
        json_t *m = json_object(), *files = json_array();
        json_object_set_new(m, "format", json_string("colt-adamw-shards"));
        json_object_set_new(m, "world_size", json_integer(t->dist.world));
        json_object_set_new(m, "step", json_integer(step));
        for (int r = 0; r < t->dist.world; r++) {
            char file[64];
            shard_file_name(t, file, sizeof file, r, t->dist.world);
            json_array_append_new(files, json_string(file));
        }
        json_object_set_new(m, "files", files);
        char manifest[64];
        manifest_name(t, manifest, sizeof manifest);
        char *text = json_dumps(m, JSON_INDENT(1)), *path = path_join(dir, manifest);
        rc = file_write_atomic(path, text, strlen(text), err);
        free(text), free(path);
        json_decref(m);
    }
    if (t->tp.tp_size > 1) rc = train_dist_agree(&t->dist, rc, err); /* every part's list is there before the rename */
    return rc;
}

/* Rank 0: train_config.json, then trainer_state.json last with every other
 * file's size and hash (a folder whose files match it is complete), then the
 * folder in place of checkpoint-N. */
static int seal_and_install(Trainer *t, json_t *state, const char *dir, const char *tmp_name, const char *name,
                            char *err) {
    char *state_path = path_join(dir, "trainer_state.json"), *cfg_path = path_join(dir, "train_config.json");
    json_t *cj = train_config_to_json(t->cfg);
    char *text = json_dumps(cj, JSON_INDENT(2));
    int rc = file_write_atomic(cfg_path, text, strlen(text), err);
    free(text);
    json_decref(cj);
    if (rc == 0) {
        json_t *sealed = json_copy(state); /* state may be saved again (after an error) */
        rc = checkpoint_state_seal(sealed, dir, err);
        char *s = rc == 0 ? json_dumps(sealed, JSON_INDENT(1)) : NULL;
        if (rc == 0) rc = s ? file_write_atomic(state_path, s, strlen(s), err) : errorf(err, "%s: cannot encode", state_path);
        free(s);
        json_decref(sealed);
    }
    if (rc == 0) rc = checkpoint_install(t->cfg->output_dir, tmp_name, name, err);
    free(state_path), free(cfg_path);
    return rc;
}

/* Writes output_dir/checkpoint-N atomically: everything goes into a temporary
 * folder, trainer_state.json last with every other file's size and hash, and
 * the folder replaces an existing checkpoint-N by checkpoint_install (the old
 * one moved aside, then deleted). state: trainer_state_json's.
 * Weights or optimizer moments that are not finite are never saved: a run that
 * diverged must not replace a good checkpoint.
 *
 * Unsharded optimizer: rank 0 writes everything (the others return at once).
 * Sharded (zero_stage >= 1): collective — rank 0 writes the model, every rank its
 * optimizer shard into the same temporary folder (output_dir must be shared
 * by the ranks' hosts, as for DeepSpeed), then rank 0 the manifest
 * (optimizer_shards.json), the trainer state and the rename.
 * Tensor parallel: collective too — the first data-parallel group's ranks
 * gather the whole weights for rank 0 and each writes its part's optimizer
 * state (optimizer-tpNNNNN-of-NNNNN.safetensors) into the same folder. */
int trainer_save_checkpoint(Trainer *t, json_t *state, char *err) {
    bool sharded = optim_is_sharded(t->optimizer.opt), tp = t->tp.tp_size > 1;
    if (!sharded && !tp && t->dist.rank != 0) return COLT_OK;
    int64_t step = json_integer_value(json_object_get(state, "global_step"));
    int rc = state ? COLT_OK : errorf(err, "checkpoint: the trainer state could not be written as JSON");
    if (rc == 0 && !optim_state_finite(t->optimizer.opt)) {
        char last[512];
        trainer_last_checkpoint_text(t, last, sizeof last);
        rc = errorf(err, "step %lld: the weights or optimizer moments hold NaN or Inf (training diverged; "
                         "learning_rate %g): checkpoint-%lld not saved, %s",
                    (long long)step, t->cfg->learning_rate, (long long)step, last);
    }
    if ((sharded || tp) && train_dist_agree(&t->dist, rc, err) != 0) return COLT_ERR;
    if (rc != 0) return rc;
    long pid = 0;
    if ((rc = folder_pid(t, sharded, tp, &pid, err)) != 0) return rc;
    if ((rc = trainer_weights_gather_for_saving(t, err)) != 0) return rc;
    char name[64], tmp_name[96];
    snprintf(name, sizeof name, "checkpoint-%lld", (long long)step);
    snprintf(tmp_name, sizeof tmp_name, "%s.tmp.%ld", name, pid);
    char *final_dir = path_join(t->cfg->output_dir, name), *dir = path_join(t->cfg->output_dir, tmp_name);
    if (t->dist.rank == 0) { /* tensor parallel: the first group's ranks, which gather the weights for rank 0 */
        if (t->writer) remove_tree(dir);
        if (trainer_save_trained(t, dir, err) != 0 || (t->writer && tokenizer_copy_files(t->cfg->model, dir, err) != 0))
            rc = COLT_ERR;
        if (rc == 0 && !sharded) {
            char file[64];
            optimizer_file_name(t, file, sizeof file);
            char *opt_path = path_join(dir, file);
            rc = optim_save(t->optimizer.opt, opt_path, err);
            free(opt_path);
        }
    }
    if (tp) rc = train_dist_agree(&t->dist, rc, err); /* every part's optimizer state is in the folder */
    trainer_weights_release(t);
    if (sharded) rc = save_optimizer_shards(t, dir, step, rc, err);
    if (rc == 0 && t->writer) rc = seal_and_install(t, state, dir, tmp_name, name, err);
    if (rc != 0 && t->writer) remove_tree(dir);
    if (sharded || tp) rc = train_dist_agree(&t->dist, rc, err);
    if (rc == 0) {
        log_info0("saved %s", final_dir);
        t->last_saved_step = step;
        free(t->last_checkpoint);
        t->last_checkpoint = xstrdup(final_dir);
        if (t->writer) checkpoint_keeper_saved(&t->keeper, step);
    }
    free(final_dir), free(dir);
    return rc;
}

/* Loads the optimizer state of checkpoint ckpt into this rank's optimizer:
 * optimizer.safetensors (an unsharded run's) or the shards listed in
 * optimizer_shards.json (a sharded run's, at any world size). */
static int load_optimizer(Trainer *t, const char *ckpt, char *err) {
    char file[64], list[64];
    optimizer_file_name(t, file, sizeof file);
    manifest_name(t, list, sizeof list);
    char *whole = path_join(ckpt, file), *manifest = path_join(ckpt, list);
    int rc = COLT_OK;
    if (file_exists(whole)) rc = optim_load(t->optimizer.opt, whole, err);
    else if (!file_exists(manifest)) {
        int saved_tp = checkpoint_saved_tensor_parallel_size(ckpt), tp_size = t->tp.tp_size > 1 ? t->tp.tp_size : 1;
        if (saved_tp > 0 && saved_tp != tp_size)
            rc = errorf(err, "%s: no optimizer state for tensor_parallel_size %d: the checkpoint was saved with "
                             "tensor_parallel_size %d (optimizer-tp*-of-%05d files); resume it with "
                             "--tensor_parallel_size %d in a launch of a multiple of %d processes (e.g. "
                             "--nproc_per_node %d, or mpirun -np %d), or start a new run from its weights with "
                             "--model %s",
                        ckpt, tp_size, saved_tp, saved_tp, saved_tp, saved_tp, saved_tp, saved_tp, ckpt);
        else
            rc = errorf(err, "%s: no optimizer state (neither %s nor %s)%s", ckpt, file, list,
                        t->tp.tp_size > 1 ? ": a checkpoint resumes at the tensor_parallel_size that saved it" : "");
    } else {
        json_error_t jerr;
        json_t *m = json_load_file(manifest, 0, &jerr), *files = json_object_get(m, "files");
        size_t n = json_array_size(files);
        if (!m) rc = errorf(err, "%s line %d: %s", manifest, jerr.line, jerr.text);
        else if (n == 0 || json_integer_value(json_object_get(m, "world_size")) != (json_int_t)n)
            rc = errorf(err, "%s: 'files' must list world_size shard files", manifest);
        char **paths = xcalloc(n ? n : 1, sizeof(char *));
        for (size_t i = 0; rc == 0 && i < n; i++) {
            const char *f = json_string_value(json_array_get(files, i));
            if (!f || strchr(f, '/')) rc = errorf(err, "%s: files[%zu] is not a file name", manifest, i);
            else {
                paths[i] = path_join(ckpt, f);
                if (!file_exists(paths[i]))
                    rc = errorf(err, "%s: optimizer shard %s is missing (the checkpoint of a %zu-rank run is "
                                     "incomplete)",
                                ckpt, f, n);
            }
        }
        if (rc == 0) rc = optim_load_shards(t->optimizer.opt, (const char *const *)paths, (int)n, err);
        for (size_t i = 0; i < n; i++) free(paths[i]);
        free(paths);
        json_decref(m);
    }
    free(whole), free(manifest);
    return rc;
}

/* The checkpoint's model must be the base model's architecture (its weights
 * are the trained ones; the tokenizer, reference model and record come from
 * --model). */
static int check_checkpoint_config(const ModelConfig *ck, const ModelConfig *base, const char *ckpt, char *err) {
#define SAME(field, fmt)                                                                                     \
    if (ck->field != base->field)                                                                            \
        return errorf(err, "resume from %s: its config.json has " #field " " fmt ", the base model's is " fmt \
                           " (a checkpoint of another model?)",                                              \
                      ckpt, ck->field, base->field);
    SAME(arch, "%d") SAME(hidden_size, "%d") SAME(intermediate_size, "%d") SAME(num_hidden_layers, "%d")
    SAME(num_attention_heads, "%d") SAME(num_key_value_heads, "%d") SAME(head_dim, "%d") SAME(vocab_size, "%d")
    SAME(max_position_embeddings, "%d") SAME(rms_norm_eps, "%g") SAME(rope_theta, "%g")
    SAME(tie_word_embeddings, "%d") SAME(attention_bias, "%d")
#undef SAME
    return COLT_OK;
}

int trainer_load_state(Trainer *t, const char *ckpt, char *err) {
    char *state_path = path_join(ckpt, "trainer_state.json"), *text = NULL;
    size_t len = 0;
    CheckpointState st;
    memset(&st, 0, sizeof st);
    StateLimits lim = {.resume_record = t->resume_record, .checkpoint = ckpt, .rollout = rollout_shape(t),
                       .total_steps = t->total_steps};
    ModelConfig base;
    int rc = file_read_all(state_path, &text, &len, err);
    if (rc == 0) rc = checkpoint_state_parse(&st, text, len, &lim, state_path, err);
    if (rc == 0) rc = model_config_load(&base, NULL, t->cfg->model, err);
    if (rc == 0) rc = check_checkpoint_config(model_config(t->model), &base, ckpt, err);
    if (rc == 0) {
        rc = load_optimizer(t, ckpt, err);
        if (rc == 0 && optim_step_count(t->optimizer.opt) != st.progress.global_step)
            rc = errorf(err, "%s: the optimizer is at step %lld but trainer_state.json at step %lld (files from "
                             "two checkpoints?)",
                        ckpt, (long long)optim_step_count(t->optimizer.opt), (long long)st.progress.global_step);
    }
    if (rc == 0) {
        t->global_step = st.progress.global_step;
        t->round = st.progress.round;
        t->epoch = st.progress.epoch;
        t->epoch_pos = st.progress.epoch_pos;
        t->num_tokens = st.progress.num_tokens;
        if (t->epoch > 0) dataset_epoch_order(t->epoch_order, dataset_size(t->data), t->cfg->seed, t->epoch);
        t->metrics = st.metrics;
        rollout_free(&t->ro);
        t->ro = st.rollout;
        memset(&st.rollout, 0, sizeof st.rollout);
        t->round_sampling = st.round_sampling;
    }
    checkpoint_state_free(&st);
    free(text);
    free(state_path);
    return rc;
}

/* On resume, keeps only the metric lines of steps up to the checkpoint. */
int trainer_truncate_metrics(const char *path, int64_t max_step, char *err) {
    if (!file_exists(path)) return COLT_OK;
    char *data = NULL;
    size_t len = 0;
    if (file_read_all(path, &data, &len, err) != 0) return COLT_ERR;
    char *keep = xmalloc(len + 1);
    size_t k = 0;
    char *line = data;
    while (line && *line) {
        char *nl = strchr(line, '\n');
        size_t l = nl ? (size_t)(nl - line + 1) : strlen(line);
        json_t *o = json_loadb(line, l, 0, NULL);
        if (o && json_integer_value(json_object_get(o, "step")) <= max_step) {
            memcpy(keep + k, line, l);
            k += l;
        }
        json_decref(o);
        line = nl ? nl + 1 : NULL;
    }
    int rc = file_write_atomic(path, keep, k, err);
    free(keep);
    free(data);
    return rc;
}
