/* trainer_checkpoint.c — saving a checkpoint of the run (the model, the optimizer
 * state whole or in shards, trainer_state.json sealed last) and resuming from
 * one. Not the formats themselves: trainer_state.json and its checks are in
 * checkpoint.c, the rollout's JSON in rollout.c, the optimizer's files in
 * parallel/dist_optimizer_files.c. */
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
                          .has_old_logp = t->need_old_logp, .has_ref_logp = trainer_has_reference(t),
                          .prompt_per_sample = c->environment_factory != NULL || c->rollout_func != NULL};
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

/* use_adaptive_entropy: the controller's state in TRL's file and keys (entropy_ctrl_state.json:
 * entropy_coef, last_world_entropy), so TRL and colt resume each other's. Before the first step's
 * measurement last_world_entropy is +inf, which JSON cannot hold: written as null (TRL writes Infinity). */
static int save_entropy_control(const Trainer *t, const char *dir, char *err) {
    if (!t->cfg->use_adaptive_entropy) return COLT_OK;
    const GrpoEntropyControl *ctl = &t->entropy_ctl;
    double coef = t->entropy_ctl_set ? ctl->coef : t->cfg->entropy_coef;
    double last = t->entropy_ctl_set ? ctl->last_world_entropy : INFINITY;
    json_t *o = json_pack("{s:f, s:o}", "entropy_coef", coef, "last_world_entropy",
                          isfinite(last) ? json_real(last) : json_null());
    char *text = json_dumps(o, JSON_REAL_PRECISION(17));
    char *path = path_join(dir, "entropy_ctrl_state.json");
    int rc = file_write_atomic(path, text, strlen(text), err);
    free(text), free(path);
    json_decref(o);
    return rc;
}

/* TRL's _load_optimizer_and_scheduler: a checkpoint without the file keeps the configured start. */
static int load_entropy_control(Trainer *t, const char *ckpt, char *err) {
    if (!t->cfg->use_adaptive_entropy) return COLT_OK;
    char *path = path_join(ckpt, "entropy_ctrl_state.json");
    int rc = COLT_OK;
    if (file_exists(path)) {
        json_error_t jerr;
        json_t *o = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
        json_t *coef = o ? json_object_get(o, "entropy_coef") : NULL, *last = o ? json_object_get(o, "last_world_entropy") : NULL;
        if (!o) rc = errorf(err, "%s: %s (line %d)", path, jerr.text, jerr.line);
        else if (!json_is_number(coef) || !(json_is_number(last) || json_is_null(last)))
            rc = errorf(err, "%s: needs numbers entropy_coef and last_world_entropy (null = not measured yet)", path);
        else {
            t->entropy_ctl = (GrpoEntropyControl){.coef = json_number_value(coef),
                                                  .last_world_entropy = json_is_null(last) ? INFINITY
                                                                                           : json_number_value(last)};
            t->entropy_ctl_set = true;
        }
        json_decref(o);
    }
    free(path);
    return rc;
}

/* sync_ref_model: the reference model changes during the run, so a checkpoint
 * holds it — ref_model/, a Hugging Face folder in the storage dtype (bf16
 * values on a GPU are saved exactly) — and a resume loads it from there
 * (trainer.c). Called by every rank that reaches the trained model's save:
 * under zero_stage 3 the reference's parts are gathered first (collective),
 * under tensor parallelism the first group's ranks gather it for rank 0.
 * rc: the save's status so far (passed on; a failed save still gathers). */
static int save_reference(Trainer *t, const char *dir, int rc, char *err) {
    if (!t->cfg->sync_ref_model || !t->ref_model) return rc;
    bool partitioned = model_params_partitioned(t->ref_model);
    if (partitioned) {
        char gather_err[ERR_LEN] = "";
        trainer_alloc_label(t, "the reference model's whole weights, gathered to save them (zero_stage 3)",
                            t->plan.weights_gathered);
        int g = model_params_gather_all(t->ref_model, gather_err);
        trainer_alloc_label(t, NULL, 0);
        g = train_dist_agree(&t->dist, g, gather_err);
        if (g != 0) {
            model_params_release_all(t->ref_model);
            if (rc == 0) snprintf(err, ERR_LEN, "%s", gather_err);
            return COLT_ERR;
        }
    }
    if (rc == 0 && t->dist.rank == 0) {
        char *ref_dir = path_join(dir, "ref_model");
        rc = model_save(t->ref_model, ref_dir, t->be->storage == DTYPE_BF16 ? DTYPE_BF16 : DTYPE_F32, err);
        if (rc != 0) error_prefix(err, "the reference model (sync_ref_model)");
        free(ref_dir);
    }
    if (partitioned) model_params_release_all(t->ref_model);
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
    bool collective = !dist_optimizer_state_on_rank0(&t->optimizer);
    if (!collective && t->dist.rank != 0) return COLT_OK;
    int64_t step = json_integer_value(json_object_get(state, "global_step"));
    int rc = state ? COLT_OK : errorf(err, "checkpoint: the trainer state could not be written as JSON");
    if (rc == 0 && !optim_state_finite(t->optimizer.opt)) {
        char last[512];
        trainer_last_checkpoint_text(t, last, sizeof last);
        rc = errorf(err, "step %lld: the weights or optimizer moments hold NaN or Inf (training diverged; "
                         "learning_rate %g): checkpoint-%lld not saved, %s",
                    (long long)step, t->cfg->learning_rate, (long long)step, last);
    }
    if (collective && train_dist_agree(&t->dist, rc, err) != 0) return COLT_ERR;
    if (rc != 0) return rc;
    long pid = 0;
    if ((rc = dist_optimizer_rank0_pid(&t->optimizer, &pid, err)) != 0) return rc;
    if ((rc = trainer_weights_gather_for_saving(t, err)) != 0) return rc;
    char name[64], tmp_name[96];
    snprintf(name, sizeof name, "checkpoint-%lld", (long long)step);
    snprintf(tmp_name, sizeof tmp_name, "%s.tmp.%ld", name, pid);
    char *final_dir = path_join(t->cfg->output_dir, name), *dir = path_join(t->cfg->output_dir, tmp_name);
    if (t->dist.rank == 0) { /* tensor parallel: the first group's ranks, which gather the weights for rank 0 */
        if (t->writer) remove_tree(dir);
        if (trainer_save_trained(t, dir, err) != 0 || (t->writer && tokenizer_copy_files(t->cfg->model, dir, err) != 0) ||
            (t->writer && save_entropy_control(t, dir, err) != 0))
            rc = COLT_ERR;
    }
    trainer_weights_release(t);
    rc = save_reference(t, dir, rc, err);
    rc = dist_optimizer_save(&t->optimizer, dir, step, rc, err); /* collective unless rank 0 holds it all */
    if (rc == 0 && t->writer) rc = seal_and_install(t, state, dir, tmp_name, name, err);
    if (rc != 0 && t->writer) remove_tree(dir);
    if (collective) rc = train_dist_agree(&t->dist, rc, err);
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
        rc = dist_optimizer_load(&t->optimizer, ckpt, checkpoint_saved_tensor_parallel_size(ckpt), err);
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
        if (t->epoch > 0 && t->cfg->shuffle_dataset)
            dataset_epoch_order(t->epoch_order, dataset_size(t->data), t->cfg->seed, t->epoch);
        else if (t->epoch > 0) /* shuffle_dataset false: file order (as trainer_rollout.c's next_prompt_rows) */
            for (size_t r = 0; r < dataset_size(t->data); r++) t->epoch_order[r] = r;
        t->metrics = st.metrics;
        rollout_free(&t->ro);
        t->ro = st.rollout;
        memset(&st.rollout, 0, sizeof st.rollout);
        t->round_sampling = st.round_sampling;
        rc = load_entropy_control(t, ckpt, err);
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
