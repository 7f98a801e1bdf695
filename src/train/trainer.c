/* trainer.c — the GRPO loop (see trainer.h), as TRL's GRPOTrainer runs it:
 *
 *   round:  P = generation_batch_size / G prompts, each completed G times with
 *           the live weights; rewards, group advantages; old log-probs when
 *           generation and optimizer steps are misaligned; reference log-probs
 *           when beta > 0; the batch is shuffled and cut into
 *           steps_per_generation micro-batches, reused num_iterations times.
 *   step:   gradient_accumulation_steps micro-batches of forward + GRPO loss +
 *           backward, then clipping and one AdamW update with the scheduled lr.
 *
 * Everything random is keyed, not stateful: the epoch order by (seed, epoch),
 * the micro-batch shuffle by (seed, round), sampling by (seed, sample id,
 * position). So a checkpoint only stores counters, the optimizer state and —
 * when it falls inside a round — the round's samples; resuming reproduces the
 * uninterrupted run bit for bit on the CPU.
 *
 * This file: the run's setup and the loop (trainer_run). A round is in
 * trainer_rollout.c, a micro-batch in trainer_micro_batch.c, server mode in
 * trainer_server.c, checkpoints in trainer_checkpoint.c, evaluation in
 * trainer_eval.c, metrics lines in trainer_log.c (trainer_internal.h). */
#include "train/trainer.h"
#include "train/trainer_internal.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend.h"
#include "core/error.h"
#include "core/fileio.h"
#include "core/log.h"
#include "data/dataset.h"
#include "parallel/mesh.h"
#include "parallel/tp_group.h"
#include "model/lora.h"
#include "model/model.h"
#include "model/model_train.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_files.h"
#include "train/checkpoint.h"
#include "train/grpo.h"
#include "parallel/optim.h"
#include "data/prompt.h"
#include "train/report.h"
#include "train/memory_plan.h"
#include "train/tensorboard.h"
#include "parallel/train_dist.h"

/* SIGINT / SIGTERM: the first asks every rank to stop after the step and save (a step may take
 * minutes: a whole round's generation); another one a second or more later stops this process at
 * once, as the signal's default does, without saving. Sooner it is the same Ctrl-C arriving twice
 * (from the terminal to the whole process group, and forwarded by a launcher). Only async-signal-safe
 * calls here; the handler runs with both signals blocked. */
#define SECOND_SIGNAL_AFTER_S 1.0
static volatile sig_atomic_t g_stop_requested = 0;
static volatile sig_atomic_t g_tell_stop = 0; /* this process says so on stderr (rank 0) */
static double g_first_signal_at;              /* written by the handler only */
static double signal_clock(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}
static void on_stop_signal(int sig) {
    if (g_stop_requested) {
        if (signal_clock() - g_first_signal_at < SECOND_SIGNAL_AFTER_S) return;
        signal(sig, SIG_DFL);
        raise(sig);
        return;
    }
    g_first_signal_at = signal_clock();
    g_stop_requested = 1;
    /* Ctrl-C only: a SIGTERM comes from a supervisor or a launcher ending the job, and lines that
     * start "colt train: " are errors */
    static const char msg[] = "Ctrl-C: stopping after this step and saving a checkpoint (Ctrl-C again, a second "
                              "later, stops at once without saving)\n";
    if (g_tell_stop && sig == SIGINT) {
        ssize_t written = write(STDERR_FILENO, msg, sizeof msg - 1);
        (void)written; /* nothing to do if stderr is gone */
    }
}

/* Names what the backend allocates next and the plan's figure for it, so that
 * running out of device memory says which buffer (backend.h set_alloc_label);
 * NULL clears it. */
void trainer_alloc_label(const Trainer *t, const char *what, size_t planned) {
    if (!t->be || !t->be->set_alloc_label) return;
    if (!what) {
        t->be->set_alloc_label(t->be, NULL);
        return;
    }
    char label[160];
    snprintf(label, sizeof label, "%s (the memory plan gave it %.2f GB)", what, planned / (1024.0 * 1024.0 * 1024.0));
    t->be->set_alloc_label(t->be, label);
}

/* Training activations and the engine's KV pool take turns with the device
 * memory: before generating, the activations are given back when what is
 * free would not hold the pool the engine wants for this round (every
 * sequence at full length), and taken again by the next forward. When memory
 * is plentiful they stay (giving back and taking ~20 GB costs ~0.1 s). */
void trainer_release_activations(Trainer *t) {
    if (!t->ts) return;
    double t0 = time_now();
    train_state_free(t->ts);
    t->ts = NULL;
    t->times.memory += time_now() - t0;
}

int trainer_ensure_activations(Trainer *t, char *err) {
    if (t->ts) return COLT_OK;
    if (t->engine) engine_sleep(t->engine); /* the activations were given back: memory is short */
    double t0 = time_now();
    int bs = t->cfg->per_device_train_batch_size;
    trainer_alloc_label(t, "training activations", t->plan.activations);
    int rc = train_state_create_recompute(&t->ts, t->model, bs, t->max_seq, t->max_batch_tokens, t->recompute, err);
    trainer_alloc_label(t, NULL, 0);
    t->times.memory += time_now() - t0;
    return rc;
}

void trainer_make_room_for_generation(Trainer *t, int n_seqs) {
    if (t->engine) engine_sleep(t->engine);
    trainer_make_room_for_round(t, n_seqs);
}

void trainer_make_room_for_round(Trainer *t, int n_seqs) {
    if (!t->ts || (t->engine && engine_awake(t->engine))) return;
    bool release = true;
    if (t->be->memory_info) {
        size_t free_bytes, total_bytes;
        t->be->memory_info(t->be, &free_bytes, &total_bytes);
        release = free_bytes < engine_memory_wanted(t->model, n_seqs, t->max_seq, &t->engine_opts) +
                                   dist_optimizer_gathered_bytes(&t->optimizer);
    }
    if (release) trainer_release_activations(t);
}

/* Whether the rounds' engine may keep its memory through training: the
 * activations stayed beside it, the weights keep their addresses (an
 * optimizer step writes them in place; zero_stage 3 gathers them anew each
 * round), and what is free beside both leaves training twice the headroom the
 * memory plan gives it (its transient scratch). */
static bool engine_stays_awake(const Trainer *t) {
    if (!t->ts || dist_optimizer_weights_partitioned(&t->optimizer) || !t->be->memory_info) return false;
    size_t free_bytes, total_bytes;
    t->be->memory_info(t->be, &free_bytes, &total_bytes);
    return free_bytes >= 2 * MEMORY_PLAN_TRAIN_HEADROOM;
}

/* The rounds' engine lives from round to round: its pool and its CUDA graphs
 * (one per decode batch size met, recorded on the bucket's second step) are
 * made once instead of every round, which counts where completions end at
 * different lengths and the batch shrinks through many sizes. It stays awake
 * through training where memory allows (engine_stays_awake); otherwise it
 * sleeps, giving its memory back, and wakes for the next round. */
Engine *trainer_round_engine(Trainer *t, const GenSequence *seqs, int n_seqs, const GenerateOptions *go, char *err) {
    int need = 0; /* the longest sequence of this round */
    for (int i = 0; i < n_seqs; i++)
        if (seqs[i].prompt_len + go->max_new_tokens > need) need = seqs[i].prompt_len + go->max_new_tokens;
    int max_len = t->max_seq > need ? t->max_seq : need;
    if (t->engine && !engine_fits(t->engine, max_len, n_seqs)) {
        engine_destroy(t->engine); /* made for shorter or fewer sequences than this round's */
        t->engine = NULL;
    }
    int rc = COLT_OK;
    if (!t->engine) rc = engine_create(&t->engine, t->model, &t->engine_opts, max_len, n_seqs, err);
    else rc = engine_wake(t->engine, err);
    if (rc != 0) {
        engine_destroy(t->engine);
        t->engine = NULL;
    }
    return t->engine;
}

void trainer_round_engine_done(Trainer *t, int rc) {
    if (!t->engine) return;
    if (rc != 0) { /* it may still hold the failed round's requests */
        engine_destroy(t->engine);
        t->engine = NULL;
    } else if (!engine_stays_awake(t)) {
        engine_sleep(t->engine);
    }
}

int trainer_round_generate(Trainer *t, GenSequence *seqs, int n_seqs, const GenerateOptions *go, EngineStats *es,
                           char *err) {
    if (es) memset(es, 0, sizeof *es);
    if (n_seqs == 0) return COLT_OK;
    double t0 = time_now();
    Engine *e = trainer_round_engine(t, seqs, n_seqs, go, err);
    int rc = e ? engine_run(e, seqs, n_seqs, go, es, err) : COLT_ERR;
    if (rc == 0 && es) es->seconds = time_now() - t0;
    trainer_round_engine_done(t, rc);
    return rc;
}

/* The whole weights for the engine or for saving (gathered under zero_stage 3,
 * collective; already whole otherwise); trainer_weights_release gives them back. */
int trainer_weights_gather(Trainer *t, char *err) {
    trainer_alloc_label(t, "the whole weights, gathered (zero_stage 3)", t->plan.weights_gathered);
    int rc = dist_optimizer_gather_weights(&t->optimizer, err);
    trainer_alloc_label(t, NULL, 0);
    return rc;
}

void trainer_weights_release(Trainer *t) { dist_optimizer_release_weights(&t->optimizer); }

/* Before saving: the whole weights, in the memory the activations give back
 * when they must be gathered (zero_stage 3: rank 0 saves the whole weights). */
int trainer_weights_gather_for_saving(Trainer *t, char *err) {
    if (!dist_optimizer_weights_partitioned(&t->optimizer)) return COLT_OK;
    trainer_release_activations(t);
    return trainer_weights_gather(t, err);
}

/* Rank 0: NCCL or the host for the weight channel (weight_sync_backend),
 * from what the server says it runs on (/colt/info). NCCL refuses two ranks
 * on one GPU, so auto takes it only when the GPUs are known to differ. */
static int choose_weight_channel(Trainer *t, ServeClient *replica, const char *host, bool *nccl, int *group_size,
                                 char *err) {
    const TrainConfig *c = t->cfg;
    json_t *info = NULL;
    if (serve_client_get_json(replica, "/colt/info", &info, err) != 0) return COLT_ERR;
    /* the server's processes (tensor parallel: each holds a part) and this rank; absent: an older colt serve */
    json_t *ws = json_object_get(info, "weight_sync_world_size");
    *group_size = json_is_integer(ws) && json_integer_value(ws) >= 2 && json_integer_value(ws) <= 4096
                      ? (int)json_integer_value(ws) : 2;
    const char *device = json_string_value(json_object_get(info, "device"));
    bool server_gpu = backend_kind_is_gpu(device), trainer_gpu = backend_is_gpu(t->be);
    bool server_deterministic = json_is_true(json_object_get(info, "deterministic"));
    if (server_deterministic != t->engine_opts.deterministic)
        log_info0("server mode: deterministic mode is %s here and %s on the server: completions and log-probs may "
                  "differ from a colocated run's (run both with or both without it)",
                  t->engine_opts.deterministic ? "on" : "off", server_deterministic ? "on" : "off");
    int rc = COLT_OK;
    if (strcmp(c->weight_sync_backend, "nccl") == 0) {
        if (!trainer_gpu || !server_gpu)
            rc = errorf(err, "weight_sync_backend nccl needs a GPU on both sides: the trainer computes on %s, the "
                             "server on %s",
                        t->be->name, device ? device : "(unknown)");
        *nccl = true;
    } else if (strcmp(c->weight_sync_backend, "auto") == 0 && trainer_gpu && server_gpu) {
        bool apart = strncmp(host, "127.", 4) != 0 && strcmp(host, "localhost") != 0 && strcmp(host, "::1") != 0;
        if (c->server_devices) {
            apart = true;
            for (size_t i = 0; i < json_array_size(c->server_devices); i++)
                apart &= json_integer_value(json_array_get(c->server_devices, i)) != t->be->device;
        }
        *nccl = apart;
    }
    json_decref(info);
    return rc;
}

/* The mesh's options from the settings: the launch's groups for `colt train`
 * (data parallel across tensor-parallel groups); listed[] holds devices. */
static MeshOptions mesh_options(const TrainConfig *c, int *listed) {
    size_t n = json_array_size(c->devices);
    for (size_t i = 0; i < n; i++) listed[i] = (int)json_integer_value(json_array_get(c->devices, i));
    return (MeshOptions){.device = c->device, .devices = c->devices ? listed : NULL, .n_devices = (int)n,
                         .tensor_parallel_size = c->tensor_parallel_size, .timeout_s = c->ddp_timeout};
}

/* The world and its groups first, so that a rank failing anywhere in setup
 * can tell the others. Rounds and gradients go over the data-parallel group
 * (t->dist), agreements over the whole launch. */
static int open_world(Trainer *t, const LaunchEnv *env, char *err) {
    t->writer = env->rank == 0;
    t->dist.world = 1;
    int *listed = xcalloc(json_array_size(t->cfg->devices) + 1, sizeof(int));
    MeshOptions o = mesh_options(t->cfg, listed);
    int rc = mesh_open_world(&t->mesh, env, &o, err);
    free(listed);
    if (rc != 0 || !t->mesh.world) return rc;
    const TpGroup *g = &t->mesh.groups;
    t->dist.rank = g->data_parallel_rank;
    t->dist.world = g->data_parallel_size;
    if (g->tensor_parallel_size == 1) {
        t->dist.comm = t->mesh.world;
        log_info0("data parallel: %d processes (%s, %s)", env->world_size, launcher_name(env->launcher),
                  comm_kind_name(comm_kind(t->mesh.world)));
        return COLT_OK;
    }
    t->dist.comm = g->data_parallel_size > 1 ? g->dp : NULL;
    t->dist.all = t->mesh.world;
    t->dist.all_rank = env->rank;
    t->dist.all_world = env->world_size;
    log_info0("tensor parallel: %d group(s) of %d processes, data parallel across them (%s, %s)",
              g->data_parallel_size, g->tensor_parallel_size, launcher_name(env->launcher),
              comm_kind_name(comm_kind(t->mesh.world)));
    return COLT_OK;
}

static int trainer_setup_local(Trainer *t, TrainConfig *c, const LaunchEnv *env, char *err);

static int trainer_setup(Trainer *t, TrainConfig *c, const LaunchEnv *env, char *err) {
    memset(t, 0, sizeof *t);
    t->cfg = c;
    if (open_world(t, env, err) != 0) return COLT_ERR;
    if (train_dist_agree(&t->dist, trainer_setup_local(t, c, env, err), err) != 0) return COLT_ERR;
    /* Last: the gradient path gathers from every rank, so all must have got here. */
    return dist_optimizer_open_gradients(&t->optimizer, env, err);
}

/* The inputs of this run's memory plan (memory_plan.h): the settings, the
 * model's shape, the longest prompt found, and the device as it is now. */
void trainer_plan_input(MemoryPlanInput *in, const TrainConfig *c, const ModelConfig *mc, const Backend *be,
                        int world_size, int max_prompt_tokens, LoraConfig *lora_out) {
    memset(in, 0, sizeof *in);
    in->model = *mc;
    in->gpu = be ? backend_is_gpu(be) : strcmp(c->device, "cpu") != 0;
    in->storage = be ? be->storage : in->gpu ? DTYPE_BF16 : DTYPE_F32;
    in->logits_chunk_rows = be ? be->logits_chunk_rows : in->gpu ? 1024 : 64; /* without one: the cuda / cpu tables' */
    in->world_size = world_size;
    in->tensor_parallel_size = c->tensor_parallel_size;
    in->zero_stage = c->zero_stage;
    in->offload = strcmp(c->offload_optimizer, "cpu") == 0;
    in->offload_device_share = 1.0 - c->offload_optimizer_ratio;
    char err[ERR_LEN];
    in->lora = c->use_peft && train_config_lora(c, lora_out, err) == 0 ? lora_out : NULL;
    in->reference_model = c->beta > 0 && !c->use_peft;
    for (size_t k = 0; k < json_array_size(c->reward_funcs) && in->n_reward_models < MEMORY_PLAN_MAX_REWARD_MODELS; k++)
        in->n_reward_models += reward_model_config(&in->reward_models[in->n_reward_models], json_array_get(c->reward_funcs, k));
    in->batch = c->per_device_train_batch_size;
    in->max_seq = max_prompt_tokens + c->max_completion_length;
    in->gen_seqs = c->generation_batch_size / (world_size > 0 ? world_size : 1);
    in->deterministic = c->deterministic_set ? c->deterministic : in->storage == DTYPE_BF16;
    in->recompute = c->gradient_checkpointing;
    in->host_bytes = memory_plan_host_total();
}

/* Before any weight is loaded: a run that cannot fit stops here with the
 * parts and what would make it fit; one that fits only with recompute gets it. */
static int plan_memory(Trainer *t, const TrainConfig *c, const ModelConfig *mc, char *err) {
    MemoryPlanInput in;
    LoraConfig lora;
    trainer_plan_input(&in, c, mc, t->be, t->dist.world, t->max_prompt_tokens, &lora);
    size_t free_bytes = 0, total_bytes = 0;
    if (t->be->memory_info) t->be->memory_info(t->be, &free_bytes, &total_bytes);
    if (in.gpu) in.backend_scratch = backend_reserved_bytes(t->be);
    in.device_bytes = total_bytes ? (double)total_bytes : in.host_bytes;
    in.device_free = total_bytes ? (double)free_bytes : in.host_bytes;
    if (in.device_free <= 0) return COLT_OK; /* nothing known to plan against */
    MemoryPlan p;
    memory_plan_compute(&p, &in);
    if (!p.fits || !p.fits_host) return memory_plan_error(&p, &in, err);
    t->plan = p;
    if (p.recompute_forced) {
        t->recompute = true;
        log_info0("gradient_checkpointing turned on by the memory plan: activations need %.1f GB without it, "
                  "%.1f GB with it",
                  p.activations_full / (1024.0 * 1024.0 * 1024.0), p.activations_recompute / (1024.0 * 1024.0 * 1024.0));
    }
    return COLT_OK;
}

/* The model this run trains: the base model from `model`, or a full
 * checkpoint's weights when resuming; with use_peft the base model plus new
 * LoRA adapters, or the checkpoint's adapters when resuming. */
static int load_trained_model(Trainer *t, const TrainConfig *c, char *err) {
    const char *ckpt = c->resume_from_checkpoint;
    if (ckpt && !c->use_peft) {
        char *adapter = path_join(ckpt, "adapter_config.json");
        bool lora_ckpt = file_exists(adapter);
        free(adapter);
        if (lora_ckpt)
            return errorf(err, "resume from %s: it holds LoRA adapters (adapter_config.json): set use_peft: true", ckpt);
    }
    if (model_load_tp(&t->model, ckpt && !c->use_peft ? ckpt : c->model, t->be, mesh_tensor_parallel(&t->mesh, &t->tp_hooks), err) != 0) return COLT_ERR;
    if (!c->use_peft) return COLT_OK;
    LoraConfig want;
    if (train_config_lora(c, &want, err) != 0) return COLT_ERR;
    if (!ckpt) {
        if (model_lora_attach(t->model, &want, c->seed, err) != 0) return COLT_ERR;
    } else {
        if (model_lora_load(t->model, ckpt, err) != 0) return error_prefix(err, "resume from %s", ckpt);
        const LoraConfig *have = model_lora_config(t->model);
        if (have->r != want.r || have->alpha != want.alpha || have->use_rslora != want.use_rslora ||
            have->targets != want.targets)
            return errorf(err, "resume from %s: its adapters (r %d, lora_alpha %g, use_rslora %d) or target modules "
                               "differ from this run's settings (lora_r %d, lora_alpha %g, use_rslora %d)",
                          ckpt, have->r, (double)have->alpha, have->use_rslora, want.r, (double)want.alpha,
                          want.use_rslora);
        model_lora_set_dropout(t->model, want.dropout); /* a training setting: this run's */
    }
    size_t n_adapters = 0, n_weights = model_weight_bytes(t->model) / dtype_size(t->be->storage);
    for (int i = 0; i < model_param_count(t->model); i++) n_adapters += model_param(t->model, i).numel;
    const ModelConfig *mc = model_config(t->model);
    char targets[160] = "";
    for (int k = 0; k < LORA_N_TARGETS; k++)
        if (want.targets & (1u << k))
            snprintf(targets + strlen(targets), sizeof targets - strlen(targets), "%s%s", targets[0] ? " " : "",
                     lora_target_name((LoraTarget)k));
    log_info0("LoRA: r %d, lora_alpha %g%s on %s of %d layers: %zu trainable parameters (%.2f%% of %zu frozen)%s",
              want.r, (double)want.alpha, want.use_rslora ? " (rsLoRA)" : "", targets, mc->num_hidden_layers,
              n_adapters, 100.0 * (double)n_adapters / (double)n_weights, n_weights,
              t->mesh.groups.tensor_parallel_size > 1 ? " on each tensor-parallel rank (its part)" : "");
    return COLT_OK;
}

/* merge_lora: output_dir/merged, a plain checkpoint of the weights with the
 * adapters folded in (in the base model's dtype), with the tokenizer. Under
 * tensor parallelism the first group's ranks each merge their part and
 * gather it for rank 0, which writes. */
static int save_merged(const Trainer *t, char *err) {
    char *dir = path_join(t->cfg->output_dir, "merged");
    DType dtype = model_config(t->model)->torch_dtype == DTYPE_BF16 ? DTYPE_BF16 : DTYPE_F32;
    int rc = model_save_merged(t->model, dir, dtype, err);
    if (rc == 0 && t->writer) rc = tokenizer_copy_files(t->cfg->model, dir, err);
    if (rc == 0) log_info0("merged model (weights + adapters) saved to %s", dir);
    free(dir);
    return rc;
}

/* output_dir made (rank 0), with what a killed run left there cleared; a
 * checkpoint to resume from checked before anything is read from it. */
static int prepare_output_dir(Trainer *t, const TrainConfig *c, char *err) {
    t->last_saved_step = -1;
    /* a FIFO or device where an output goes stops the run now, not at its end */
    if (t->writer && report_check_output_dir(c->output_dir, err) != 0) return COLT_ERR;
    if (t->writer) {
        if (make_dirs(c->output_dir, err) != 0) return COLT_ERR;
        int restored = 0, stale = checkpoint_recover_leftovers(c->output_dir, &restored);
        if (stale > 0) log_info0("removed %d temporary file(s) left in %s by a run that was killed", stale, c->output_dir);
    }
    if (c->resume_from_checkpoint) { /* before anything is read from it */
        bool has_manifest = false;
        if (checkpoint_verify_files(c->resume_from_checkpoint, &has_manifest, err) != 0) return COLT_ERR;
        if (!has_manifest)
            log_info0("%s: trainer_state.json lists no files (saved by an older colt): its files are not checked",
                      c->resume_from_checkpoint);
    }
    return COLT_OK;
}

/* Where the reference model's weights come from: the base model, or with
 * sync_ref_model and a resume the checkpoint's ref_model/ (the reference as
 * the syncs left it; trainer_checkpoint.c saves it). *dir: allocated. */
static int reference_dir(const TrainConfig *c, char **dir, char *err) {
    *dir = NULL;
    if (!c->sync_ref_model || !c->resume_from_checkpoint) {
        *dir = xstrdup(c->model);
        return COLT_OK;
    }
    char *ref_dir = path_join(c->resume_from_checkpoint, "ref_model"), *config = path_join(ref_dir, "config.json");
    bool present = file_exists(config);
    free(config);
    if (!present) {
        free(ref_dir);
        return errorf(err, "resume from %s: it holds no ref_model/ folder, which a run with sync_ref_model saves "
                           "(the checkpoint of a run without it?): resume with sync_ref_model: false, or start a new "
                           "run",
                      c->resume_from_checkpoint);
    }
    *dir = ref_dir;
    return COLT_OK;
}

/* The tokenizer, the datasets (every prompt checked to fit with a full
 * completion), the memory plan, then the weights: the trained model and the
 * reference model. */
static int load_data_and_models(Trainer *t, TrainConfig *c, char *err) {
    if (tokenizer_load(&t->tok, c->model, err) != 0) return COLT_ERR;
    /* The model's shape first: the prompts are checked and the memory planned
     * before any weight is loaded. */
    ModelConfig base_cfg; /* the weights this run loads: a full-model checkpoint's when resuming from one */
    char *ck_config = c->resume_from_checkpoint ? path_join(c->resume_from_checkpoint, "config.json") : NULL;
    const char *weights_dir =
        c->resume_from_checkpoint && !c->use_peft && file_exists(ck_config) ? c->resume_from_checkpoint : c->model;
    free(ck_config);
    if (model_config_load(&base_cfg, NULL, weights_dir, err) != 0) return COLT_ERR;
    const ModelConfig *mc = &base_cfg;
    if (tokenizer_vocab_size(t->tok) > mc->vocab_size)
        return errorf(err, "%s: the tokenizer has %d tokens but the model only %d", c->model,
                      tokenizer_vocab_size(t->tok), mc->vocab_size);

    if (dataset_load_column(&t->data, c->dataset, c->dataset_prompt_column, err) != 0) return COLT_ERR;
    if (c->eval_dataset &&
        dataset_load_column(&t->eval_data, c->eval_dataset, c->dataset_prompt_column, err) != 0)
        return COLT_ERR;
    if (t->eval_data) {
        size_t rows = dataset_size(t->eval_data);
        if (c->num_eval_prompts > 0 && (size_t)c->num_eval_prompts < rows) rows = (size_t)c->num_eval_prompts;
        if (rows > TRAIN_CONFIG_MAX_COMPLETIONS / (size_t)c->num_generations)
            return errorf(err, "%s: %zu eval prompts x num_generations %d is more than the %d completions evaluated "
                               "at once: set num_eval_prompts",
                          c->eval_dataset, rows, c->num_generations, TRAIN_CONFIG_MAX_COMPLETIONS);
    }

    if (trainer_tools_start(t, err) != 0) return COLT_ERR; /* prompts are rendered with the tools' schemas */
    if (trainer_rollout_func_start(t, err) != 0) return COLT_ERR;

    /* Every prompt must fit with a full completion: check all of them now,
     * before any work that could be lost. */
    Dataset *sets[2] = {t->data, t->eval_data};
    const char *names[2] = {c->dataset, c->eval_dataset};
    for (int d = 0; d < 2; d++) {
        if (!sets[d]) continue;
        for (size_t i = 0; i < dataset_size(sets[d]); i++) {
            int *ids = NULL, n = 0;
            char *text = NULL;
            if (trainer_prompt_ids(t, sets[d], i, &ids, &n, &text, err) != 0) return error_prefix(err, "%s", names[d]);
            free(ids);
            free(text);
            if (n + c->max_completion_length > mc->max_position_embeddings)
                return errorf(err, "%s row %zu: prompt of %d tokens + max_completion_length %d exceeds the model's "
                                   "max_position_embeddings (%d); shorten the prompt, set max_prompt_length "
                                   "(prompts are cut from the left) or lower max_completion_length",
                              names[d], i, n, c->max_completion_length, mc->max_position_embeddings);
            if (n > t->max_prompt_tokens) t->max_prompt_tokens = n;
        }
    }
    /* An environment's reset() adds to the prompt by an amount known only then: buffers take the longest
     * prompt that fits (max_prompt_length, when set, bounds it; a plan that does not fit says to set it). */
    if (c->environment_factory || c->rollout_func) { /* rollout_func: its prompts are its own */
        int room = mc->max_position_embeddings - c->max_completion_length;
        t->max_prompt_tokens = c->max_prompt_length > 0 && c->max_prompt_length < room ? c->max_prompt_length : room;
    }
    /* without max_prompt_length the longest prompt bounds the token counts (settings checked them otherwise) */
    if (train_config_check_lengths(c, t->max_prompt_tokens, err) != 0) return COLT_ERR;
    if (plan_memory(t, c, mc, err) != 0) return COLT_ERR;
    trainer_alloc_label(t, "the model's weights", t->plan.weights + t->plan.adapters);
    if (load_trained_model(t, c, err) != 0) return COLT_ERR;
    DistOptimizerOptions oo = {.zero_stage = c->zero_stage, .offload = strcmp(c->offload_optimizer, "cpu") == 0,
                               .device_share = 1.0 - c->offload_optimizer_ratio,
                               .bucket_bytes = (size_t)c->ddp_bucket_cap_mb << 20, .timeout_s = c->ddp_timeout,
                               .host_threads = t->mesh.host_threads,
                               .host_gradients = c->ddp_backend && strcmp(c->ddp_backend, "nccl") != 0};
    dist_optimizer_init(&t->optimizer, t->model, t->be, &t->dist, &t->mesh.groups, &oo);
    if (dist_optimizer_partition(&t->optimizer, t->model, err) != 0) return COLT_ERR;
    trainer_alloc_label(t, "the reference model's weights", t->plan.reference);
    char *ref_dir = NULL;
    if (reference_dir(c, &ref_dir, err) != 0) return COLT_ERR;
    if (c->beta > 0 && !c->use_peft &&
        (model_load_tp(&t->ref_model, ref_dir, t->be, mesh_tensor_parallel(&t->mesh, &t->tp_hooks), err) != 0 ||
         dist_optimizer_partition(&t->optimizer, t->ref_model, err) != 0)) {
        free(ref_dir);
        return COLT_ERR;
    }
    free(ref_dir);
    trainer_alloc_label(t, NULL, 0);
    t->ref_is_base = c->beta > 0 && c->use_peft;

    return COLT_OK;
}

/* The reward functions and their weights. */
static int create_rewards(Trainer *t, const TrainConfig *c, char *err) {
    t->n_rewards = (int)json_array_size(c->reward_funcs);
    t->rewards = xcalloc((size_t)t->n_rewards, sizeof(RewardFunc *));
    t->reward_weights = xcalloc((size_t)t->n_rewards, sizeof(float));
    for (int k = 0; k < t->n_rewards; k++) {
        if (trainer_create_reward(t, &t->rewards[k], json_array_get(c->reward_funcs, (size_t)k), err) != 0)
            return error_prefix(err, "reward_funcs[%d]", k);
        t->reward_weights[k] =
            c->reward_weights ? (float)json_number_value(json_array_get(c->reward_weights, (size_t)k)) : 1.0f;
        if (!isfinite(t->reward_weights[k]))
            return errorf(err, "reward_weights[%d] is not a finite 32-bit float", k);
    }
    /* TRL: an environment's get_reward is one more reward function, weight 1, named after its class
     * (t->rewards[k] NULL: trainer_score_completions asks the environments) */
    const ToolEnvironment *envs = NULL;
    size_t n_envs = t->tool_worker ? tool_worker_environments(t->tool_worker, &envs) : 0;
    t->reward_environment = xcalloc((size_t)t->n_rewards + n_envs + 1, sizeof(int));
    for (int k = 0; k < t->n_rewards; k++) t->reward_environment[k] = -1;
    /* one column per class with get_reward (a dict may name one class twice), in the dict's order */
    for (size_t e = 0; e < n_envs; e++) {
        if (!envs[e].has_reward || envs[e].class_index != (int)e) continue;
        t->rewards = xrealloc(t->rewards, sizeof(RewardFunc *) * (size_t)(t->n_rewards + 1));
        t->reward_weights = xrealloc(t->reward_weights, sizeof(float) * (size_t)(t->n_rewards + 1));
        t->rewards[t->n_rewards] = NULL;
        t->reward_environment[t->n_rewards] = (int)e;
        t->reward_weights[t->n_rewards++] = 1.0f;
    }

    return COLT_OK;
}

/* Sampling, stop tokens, the GRPO loss's settings, deterministic mode. */
static int configure_loss_and_sampling(Trainer *t, const TrainConfig *c, char *err) {
    const ModelConfig *mc = model_config(t->model);
    t->sampling = (SamplingParams){.temperature = (float)c->temperature, .top_k = c->top_k, .top_p = (float)c->top_p,
                                   .min_p = (float)c->min_p, .repetition_penalty = (float)c->repetition_penalty,
                                   .seed = c->seed};
    t->n_stop = prompt_stop_ids(t->stop_ids, mc, t->tok);
    if (c->vllm_structured_outputs_regex &&
        prompt_regex_constraint(&t->regex, t->tok, mc->vocab_size, c->vllm_structured_outputs_regex, err) != 0)
        return error_prefix(err, "vllm_structured_outputs_regex");

    GrpoLossConfig *lc = &t->loss_cfg;
    if (grpo_loss_type_parse(&lc->loss_type, c->loss_type, err) != 0 ||
        grpo_importance_level_parse(&lc->importance_sampling_level, c->importance_sampling_level, err) != 0)
        return COLT_ERR;
    lc->epsilon_low = (float)c->epsilon;
    lc->epsilon_high = (float)c->epsilon_high;
    lc->delta = isnan(c->delta) ? 0.0f : (float)c->delta;
    lc->beta = (float)c->beta;
    lc->sapo_temperature_neg = (float)c->sapo_temperature_neg, lc->sapo_temperature_pos = (float)c->sapo_temperature_pos;
    lc->vespo_k_pos = (float)c->vespo_k_pos, lc->vespo_lambda_pos = (float)c->vespo_lambda_pos;
    lc->vespo_k_neg = (float)c->vespo_k_neg, lc->vespo_lambda_neg = (float)c->vespo_lambda_neg;
    lc->max_completion_length = c->max_completion_length;
    lc->kl_without_bias_correction = !c->use_bias_correction_kl;
    lc->off_policy_mask = !isnan(c->off_policy_mask_threshold);
    lc->off_policy_mask_threshold = lc->off_policy_mask ? (float)c->off_policy_mask_threshold : 0.0f;
    lc->entropy_bonus = c->entropy_coef != 0.0 || c->use_adaptive_entropy; /* TRL's _entropy_bonus_enabled */
    /* Each rank's loss carries 1 / world and the ranks' gradients are summed:
     * the sum equals one process accumulating the ranks' micro-batches. */
    lc->gradient_accumulation_steps = c->gradient_accumulation_steps * t->dist.world;
    /* TRL: old log-probs only when generation and optimizer steps are misaligned. */
    t->need_old_logp = c->gradient_accumulation_steps % (c->steps_per_generation * c->num_iterations) != 0;
    if (grpo_sampling_is_mode_parse(&t->is_mode, c->vllm_importance_sampling_mode, err) != 0) return COLT_ERR;
    t->engine_opts.gpu_memory_utilization = c->gpu_memory_utilization;
    t->engine_opts.max_num_seqs = engine_round_max_num_seqs(c->generation_batch_size / t->dist.world); /* the rank's round */
    t->engine_opts.structured_outputs = t->regex != NULL; /* the memory plan counts the masks' buffers */
    /* unset: on for bf16 storage, where the default kernels' engine/trainer log-probs differ by ~1e-2 */
    bool deterministic = c->deterministic_set ? c->deterministic
                                              : t->be->storage == DTYPE_BF16 && t->be->set_batch_invariant != NULL;
    if (deterministic) { /* on for the trainer's forward here, and for the engine's (engine.h) */
        if (!t->be->set_batch_invariant) return errorf(err, "deterministic: backend %s has no such mode", t->be->name);
        t->be->set_batch_invariant(t->be, 1);
        t->engine_opts.deterministic = true;
    }

    return COLT_OK;
}

/* The schedule, the optimizer state and the gradients (dist_optimizer.h). */
static int create_optimizer(Trainer *t, const TrainConfig *c, size_t n_prompts, char *err) {
    if (lr_scheduler_parse(&t->scheduler, c->lr_scheduler_type, err) != 0) return COLT_ERR;
    if (train_config_total_steps(&t->total_steps, c, n_prompts, err) != 0) return COLT_ERR;
    t->warmup_steps = lr_warmup_steps((int)t->total_steps, (float)c->warmup_ratio, c->warmup_steps);

    AdamWConfig ac = {.beta1 = (float)c->adam_beta1, .beta2 = (float)c->adam_beta2, .eps = (float)c->adam_epsilon,
                      .weight_decay = (float)c->weight_decay};
    trainer_alloc_label(t, "the optimizer state", t->plan.optimizer);
    if (dist_optimizer_create_state(&t->optimizer, &ac, err) != 0) return COLT_ERR;
    trainer_alloc_label(t, "the gradients", t->plan.gradients);
    if (dist_optimizer_create_gradients(&t->optimizer, err) != 0) return COLT_ERR;
    trainer_alloc_label(t, NULL, 0);
    return COLT_OK;
}

/* The training activations and the buffers of a micro-batch, sized once. */
static int create_buffers(Trainer *t, const TrainConfig *c, char *err) {
    int bs = c->per_device_train_batch_size;
    t->max_seq = t->max_prompt_tokens + c->max_completion_length;
    t->max_batch_tokens = bs * t->max_seq;
    /* Activations must fit beside weights, optimizer state and gradients: when
     * they would not, recompute (gradient checkpointing) turns on by itself. */
    t->recompute = c->gradient_checkpointing || t->recompute; /* the plan may have turned it on */
    if (t->be->memory_info) {
        size_t free_bytes, total_bytes;
        t->be->memory_info(t->be, &free_bytes, &total_bytes);
        size_t headroom = MEMORY_PLAN_TRAIN_HEADROOM, avail = free_bytes > headroom ? free_bytes - headroom : 0;
        double gib = 1.0 / (1024.0 * 1024.0 * 1024.0);
        size_t full = train_state_plan_bytes(t->model, bs, t->max_seq, t->max_batch_tokens, false);
        size_t lean = train_state_plan_bytes(t->model, bs, t->max_seq, t->max_batch_tokens, true);
        if (!t->recompute && full > avail && lean <= avail) {
            t->recompute = true;
            log_info0("gradient_checkpointing turned on: activations need %.1f GB without it, %.1f GB are free",
                      full * gib, avail * gib);
        }
        if (lean > avail)
            return errorf(err, "training activations need %.1f GB even with gradient checkpointing but %.1f GB are "
                               "free: lower per_device_train_batch_size or max_completion_length",
                          lean * gib, avail * gib);
    }
    if (trainer_ensure_activations(t, err) != 0) return COLT_ERR;
    size_t nt = (size_t)t->max_batch_tokens, bt = (size_t)bs * (size_t)c->max_completion_length;
    t->buf.tok_ids = xmalloc(nt * sizeof(int));
    t->buf.tok_slot = xmalloc(nt * sizeof(int));
    t->buf.tok_pos = xmalloc(nt * sizeof(int));
    t->buf.tok_target = xmalloc(nt * sizeof(int));
    t->buf.tok_logp = xmalloc(nt * sizeof(float));
    t->buf.tok_entropy = xmalloc(nt * sizeof(float));
    t->buf.tok_dlogp = xmalloc(nt * sizeof(float));
    t->buf.mb_logp = xmalloc(bt * sizeof(float));
    t->buf.mb_old = xmalloc(bt * sizeof(float));
    t->buf.mb_ref = xmalloc(bt * sizeof(float));
    t->buf.mb_mask = xmalloc(bt * sizeof(float));
    t->buf.mb_dlogp = xmalloc(bt * sizeof(float));
    t->buf.mb_sampling = xmalloc(bt * sizeof(float));
    t->buf.mb_isw = xmalloc(bt * sizeof(float));
    t->buf.mb_adv = xmalloc((size_t)bs * sizeof(float));
    t->buf.mb_entropy = xmalloc(bt * sizeof(float));
    t->buf.mb_entropy_mask = xmalloc(bt * sizeof(float));
    t->buf.mb_dentropy = xmalloc(bt * sizeof(float));
    t->buf.tok_dentropy = xmalloc(nt * sizeof(float));
    t->buf.entropy_pool = xmalloc((size_t)(t->dist.world + 1) * (1 + bt) * sizeof(float));

    return COLT_OK;
}

/* The resumed state, the checkpoint keeper, metrics.jsonl (continued or
 * anew) and TensorBoard's event file. */
static int open_run_files(Trainer *t, const TrainConfig *c, char *err) {
    if (checkpoint_resume_record(&t->resume_record, c, err) != 0) return COLT_ERR;
    if (c->resume_from_checkpoint) {
        if (trainer_load_state(t, c->resume_from_checkpoint, err) != 0) return COLT_ERR;
        t->last_saved_step = t->global_step;
        t->last_checkpoint = xstrdup(c->resume_from_checkpoint);
    }
    checkpoint_keeper_init(&t->keeper, c->output_dir, c->save_total_limit, c->resume_from_checkpoint, t->global_step);
    t->metrics_path = path_join(c->output_dir, "metrics.jsonl");
    if (t->writer) {
        char *completions_path = path_join(c->output_dir, "completions.jsonl");
        int rc = COLT_OK;
        if (c->resume_from_checkpoint) {
            rc = trainer_truncate_metrics(t->metrics_path, t->global_step, err);
        } else {
            /* A fresh run starts these two files anew. */
            if (remove(t->metrics_path) != 0 && errno != ENOENT)
                rc = errorf(err, "%s: cannot remove the earlier run's file: %s", t->metrics_path, strerror(errno));
            else if (remove(completions_path) != 0 && errno != ENOENT)
                rc = errorf(err, "%s: cannot remove the earlier run's file: %s", completions_path, strerror(errno));
        }
        free(completions_path);
        if (rc != 0) return COLT_ERR;
        t->metrics_fp = file_open_append(t->metrics_path, err);
        if (!t->metrics_fp) return COLT_ERR;
        if (train_config_reports_to(c, "tensorboard")) {
            char *dir = tensorboard_log_dir(c->output_dir, c->logging_dir);
            rc = tensorboard_open(&t->tb, dir, err);
            free(dir);
            if (rc != 0) return COLT_ERR;
            log_info0("tensorboard: %s", tensorboard_path(t->tb));
        }
    }

    return COLT_OK;
}

/* The memory plan: every lifetime's buffers are allocated above, once. */
static void log_memory_plan(const Trainer *t) {
    double gb = 1.0 / (1024.0 * 1024.0 * 1024.0);
    size_t w = model_weight_bytes(t->model) + model_lora_bytes(t->model), o = optim_state_bytes(t->optimizer.opt),
           gr = model_grads_bytes(t->optimizer.grads);
    size_t act = train_state_bytes(t->ts), ref = t->ref_model ? model_weight_bytes(t->ref_model) : 0;
    /* the CUDA backend's own scratch (cuBLASLt workspace, staging, attention and sampling partials) */
    size_t scratch = backend_reserved_bytes(t->be);
    log_info0("memory plan (%s): weights %.3f GB, reference model %.3f GB, optimizer state %.3f GB, gradients "
              "%.3f GB, training activations %.3f GB, backend scratch %.3f GB; total %.3f GB, plus the generation "
              "KV cache while generating%s",
              t->be->name, w * gb, ref * gb, o * gb, gr * gb, act * gb, scratch * gb,
              (w + ref + o + gr + act + scratch) * gb, optim_state_host_bytes(t->optimizer.opt) ? "; in host memory:" : "");
    if (optim_state_host_bytes(t->optimizer.opt))
        log_info0("memory plan (host): optimizer state and staging %.3f GB", optim_state_host_bytes(t->optimizer.opt) * gb);
}

/* Everything setup does on this rank. Only rank 0 touches output_dir. */
static int trainer_setup_local(Trainer *t, TrainConfig *c, const LaunchEnv *env, char *err) {
    int *listed = xcalloc(json_array_size(c->devices) + 1, sizeof(int));
    MeshOptions o = mesh_options(c, listed);
    int rc = mesh_open_device(&t->mesh, &o, err);
    free(listed);
    if (rc != 0) return COLT_ERR;
    t->be = t->mesh.be;
    if (t->mesh.groups.tensor_parallel_size > 1) log_info0("tensor parallel collectives: %s", t->mesh.collectives);
    if (prepare_output_dir(t, c, err) != 0 || load_data_and_models(t, c, err) != 0) return COLT_ERR;
    size_t n_prompts = dataset_size(t->data);
    int P = c->generation_batch_size / c->num_generations;
    if (n_prompts < (size_t)P)
        return errorf(err, "%s: %zu prompts, fewer than the %d unique prompts a generation batch needs "
                           "(generation_batch_size %d / num_generations %d)",
                      c->dataset, n_prompts, P, c->generation_batch_size, c->num_generations);
    t->epoch_order = xcalloc(n_prompts, sizeof(size_t));
    t->epoch_pos = n_prompts;  /* the first round starts epoch 1 */

    if (create_rewards(t, c, err) != 0 || configure_loss_and_sampling(t, c, err) != 0 ||
        create_optimizer(t, c, n_prompts, err) != 0 || create_buffers(t, c, err) != 0 || open_run_files(t, c, err) != 0)
        return COLT_ERR;
    log_memory_plan(t);
    return COLT_OK;
}

/* server mode's weight channel, for trainer_server.c (choose_weight_channel stays
 * beside the device setup it reads). */
int trainer_choose_weight_channel(Trainer *t, ServeClient *replica, const char *host, bool *nccl, int *group_size,
                                  char *err) {
    return choose_weight_channel(t, replica, host, nccl, group_size, err);
}

static void trainer_teardown(Trainer *t) {
    trainer_server_disconnect(t);
    rollout_free(&t->ro);
    if (t->metrics_fp) fclose(t->metrics_fp);
    tensorboard_close(t->tb, NULL);
    json_decref(t->resume_record);
    checkpoint_keeper_free(&t->keeper);
    free(t->last_checkpoint);
    free(t->metrics_path);
    trainer_tools_stop(t);
    trainer_rollout_func_stop(t);
    for (int k = 0; k < t->n_rewards; k++) reward_free(t->rewards[k]);
    free(t->rewards);
    free(t->reward_weights);
    free(t->reward_environment);
    free(t->epoch_order);
    engine_destroy(t->engine);
    train_state_free(t->ts);
    dist_optimizer_free(&t->optimizer);
    free(t->buf.tok_ids), free(t->buf.tok_slot), free(t->buf.tok_pos), free(t->buf.tok_target);
    free(t->buf.tok_logp), free(t->buf.tok_entropy), free(t->buf.tok_dlogp);
    free(t->buf.mb_logp), free(t->buf.mb_old), free(t->buf.mb_ref), free(t->buf.mb_mask), free(t->buf.mb_dlogp), free(t->buf.mb_adv);
    free(t->buf.mb_sampling), free(t->buf.mb_isw);
    free(t->buf.mb_entropy), free(t->buf.mb_entropy_mask), free(t->buf.mb_dentropy), free(t->buf.tok_dentropy);
    free(t->buf.entropy_pool);
    dataset_free(t->data);
    dataset_free(t->eval_data);
    model_free(t->ref_model);
    model_free(t->model);
    train_dist_free(&t->dist); /* before the backend: its NCCL communicators use the device */
    mesh_close(&t->mesh);      /* the groups, the backend, the world */
    token_regex_free(t->regex);
    tokenizer_free(t->tok);
}

/* ---------------------------------------------------------------- one optimizer step */

float trainer_learning_rate(const Trainer *t) {
    return lr_schedule_value(t->scheduler, (float)t->cfg->learning_rate, (int)t->global_step, (int)t->total_steps,
                             t->warmup_steps, t->cfg->min_lr_rate);
}

/* gradient_accumulation_steps micro-batches (a new round whenever the last one
 * is used up), then the ranks' gradients summed: every rank then holds what
 * it steps. The loss of the step is added to *step_loss. */
static int accumulate_gradients(Trainer *t, double *step_loss, char *err) {
    const TrainConfig *c = t->cfg;
    const int micro_per_round = c->steps_per_generation * c->num_iterations;
    int rc = COLT_OK;
    dist_optimizer_begin_step(&t->optimizer);
    for (int a = 0; a < c->gradient_accumulation_steps && rc == 0; a++) {
        if (!t->ro.samples || t->ro.micro_done >= micro_per_round) {
            rc = trainer_new_rollout(t, err);
            if (rc != 0) break;
        }
        dist_optimizer_backward_begin(&t->optimizer, a == c->gradient_accumulation_steps - 1);
        t->micro_in_step = a;
        rc = trainer_micro_batch(t, step_loss, err);
        rc = dist_optimizer_backward_end(&t->optimizer, rc, err);
    }
    if (rc != 0) return rc;
    double seconds = 0;
    rc = dist_optimizer_finish(&t->optimizer, &seconds, err);
    if (seconds >= 0) metrics_add(&t->metrics, "time/gradient_sync", seconds);
    return rc;
}

/* One AdamW update at learning rate lr, every rank's weights whole and alike
 * again after it. */
static int update_weights(Trainer *t, float lr, char *err) {
    double o0 = time_now();
    if (dist_optimizer_step(&t->optimizer, lr, err) != 0) return COLT_ERR;
    metrics_add(&t->metrics, "time/optimizer", time_now() - o0);
    double host_seconds = dist_optimizer_host_seconds(&t->optimizer);
    if (host_seconds >= 0) metrics_add(&t->metrics, "time/optimizer_host_adamw", host_seconds);
    return COLT_OK;
}

/* sync_ref_model (TR-DPO): TRL's SyncRefModelCallback.on_step_end, which runs
 * after the optimizer step and before logging and saving, when global_step %
 * ref_model_sync_steps == 0: ref = alpha x policy + (1 - alpha) x ref. Every
 * rank mixes the part of the weights it holds (tensor parallel: its cut;
 * zero_stage 3: its partition, the reference being partitioned alike), so no
 * rank talks to another. TRL's ZeRO-3 path gathers both models and mixes on
 * rank 0; the result is the same mix. */
static int sync_reference(Trainer *t, char *err) {
    const TrainConfig *c = t->cfg;
    if (!c->sync_ref_model || !t->ref_model || t->global_step % c->ref_model_sync_steps != 0) return COLT_OK;
    if (model_weights_mix(t->ref_model, t->model, c->ref_model_mixup_alpha, err) != 0) return COLT_ERR;
    log_info0("step %lld: reference model synced (ref = %g x policy + %g x ref)", (long long)t->global_step,
              c->ref_model_mixup_alpha, 1.0 - c->ref_model_mixup_alpha);
    return COLT_OK;
}

/* One optimizer step: micro-batches, gradients summed and clipped, AdamW,
 * the weights to the server in server mode. *loss and *norm: the step's. */
static int train_step(Trainer *t, double *loss, double *norm, char *err) {
    const TrainConfig *c = t->cfg;
    json_t *step_start_state = trainer_state_json(t);
    *loss = 0;
    int rc = accumulate_gradients(t, loss, err);
    if (rc != 0) {
        /* Save what the last completed step left (the model and optimizer have
         * not changed since), so no work is lost, then stop with the error. */
        char save_err[ERR_LEN];
        if (t->dist.rank == 0 && dist_optimizer_state_on_rank0(&t->optimizer) &&
            t->global_step > t->last_saved_step && t->global_step > 0 &&
            trainer_save_checkpoint(t, step_start_state, save_err) != 0)
            log_error("could not save a checkpoint after the error: %s", save_err);
        json_decref(step_start_state);
        return rc;
    }
    json_decref(step_start_state);
    if (dist_optimizer_clip(&t->optimizer, c->max_grad_norm, norm, err) != 0) return COLT_ERR;
    if (!isfinite(*loss) || !isfinite(*norm)) {
        /* Diverged: stop before the update, and save nothing (a checkpoint of
         * this state would replace a good one). */
        char last[512];
        trainer_last_checkpoint_text(t, last, sizeof last);
        return errorf(err, "step %lld: the loss is %g and the gradient norm %g: training diverged (learning_rate "
                           "%g); stopped without saving, %s",
                      (long long)t->global_step + 1, *loss, *norm, c->learning_rate, last);
    }
    if (update_weights(t, trainer_learning_rate(t), err) != 0) return COLT_ERR;
    t->global_step++;
    if (dist_optimizer_check_replicas(&t->optimizer, err) != 0)
        return error_prefix(err, "after step %lld", (long long)t->global_step);
    if (sync_reference(t, err) != 0) return COLT_ERR;
    return trainer_push_weights(t, err);
}

/* ---------------------------------------------------------------- the run */

/* Before the first step: the eval before training, or, when resuming, the
 * first run's eval_before kept for the summary. */
static int trainer_begin(Trainer *t, double *eval_before, char *err) {
    const TrainConfig *c = t->cfg;
    int rc = COLT_OK;
    if (t->eval_data && !c->resume_from_checkpoint) {
        rc = trainer_evaluate(t, "before", eval_before, err);
        if (rc == 0) log_info0("eval before training: mean reward %.4f", *eval_before);
        if (rc == 0) rc = trainer_log_eval(t, *eval_before, false, err);
    }
    if (c->resume_from_checkpoint) {
        char *p = path_join(c->output_dir, "summary.json"), *text = NULL;
        size_t len = 0;
        json_t *old = file_exists(p) && file_read_all(p, &text, &len, NULL) == 0 ? json_loadb(text, len, 0, NULL) : NULL;
        if (old && json_is_number(json_object_get(old, "eval_reward_before")))
            *eval_before = json_number_value(json_object_get(old, "eval_reward_before"));
        json_decref(old);
        free(text);
        free(p);
        log_info0("resumed from %s at step %lld", c->resume_from_checkpoint, (long long)t->global_step);
    }
    return rc;
}

/* After a step: its metrics line, an eval, a checkpoint when due or when a
 * signal asks to stop (*stop then set). */
static int trainer_after_step(Trainer *t, const StepClock *clock, double loss, bool *stop, char *err) {
    const TrainConfig *c = t->cfg;
    bool last = t->global_step == t->total_steps;
    int rc = trainer_log_progress(t, clock, loss, last, err);
    if (rc == 0 && c->eval_steps > 0 && t->eval_data && t->global_step % c->eval_steps == 0 && !last) {
        double r = NAN;
        rc = trainer_evaluate(t, "latest", &r, err);
        if (rc == 0) log_info0("eval at step %lld: mean reward %.4f", (long long)t->global_step, r);
        if (rc == 0) rc = trainer_log_eval(t, r, true, err);
    }
    if (rc != 0) return rc;
    *stop = train_dist_any(&t->dist, g_stop_requested); /* a signal to any rank stops them all */
    if ((c->save_steps > 0 && t->global_step % c->save_steps == 0) || *stop) {
        json_t *state = trainer_state_json(t);
        rc = trainer_save_checkpoint(t, state, err); /* rank 0, or every rank when sharded */
        json_decref(state);
        rc = train_dist_agree(&t->dist, rc, err);
    }
    if (*stop)
        log_info0("stopped by signal at step %lld; resume with --resume_from_checkpoint %s/checkpoint-%lld",
                  (long long)t->global_step, c->output_dir, (long long)t->global_step);
    return rc;
}

/* The trained model in output_dir (rank 0; the whole weights gathered first
 * under zero_stage 3, by the first group's ranks under tensor parallelism),
 * unless the weights or moments are not finite. */
static int save_final_model(Trainer *t, char *err) {
    const TrainConfig *c = t->cfg;
    int rc = COLT_OK;
    bool finite = dist_optimizer_state_finite(&t->optimizer);
    if (t->dist.rank == 0 && !finite) {
        char last[512];
        trainer_last_checkpoint_text(t, last, sizeof last);
        rc = errorf(err, "the weights or optimizer moments hold NaN or Inf after step %lld (training diverged; "
                         "learning_rate %g): the final model is not saved, %s",
                    (long long)t->global_step, c->learning_rate, last);
    }
    if (rc == 0) rc = trainer_weights_gather_for_saving(t, err);
    /* tensor parallel: the first group's ranks gather the weights for rank 0 */
    if (rc == 0 && t->dist.rank == 0 &&
        (trainer_save_trained(t, c->output_dir, err) != 0 ||
         (t->writer && tokenizer_copy_files(c->model, c->output_dir, err) != 0)))
        rc = COLT_ERR;
    /* each file replaced an old one by renaming a complete, fsynced copy over it; now the renames */
    if (rc == 0 && t->writer) checkpoint_sync_folder(c->output_dir);
    trainer_weights_release(t);
    return rc;
}

/* After the last step: the eval after training, the model, the merged model,
 * the report. */
static int trainer_finish(Trainer *t, double eval_before, double run_start, char *err) {
    const TrainConfig *c = t->cfg;
    double eval_after = NAN;
    int rc = COLT_OK;
    if (t->eval_data) {
        rc = trainer_evaluate(t, "after", &eval_after, err);
        if (rc == 0) log_info0("eval after training: mean reward %.4f (before %.4f)", eval_after, eval_before);
        if (rc == 0) rc = trainer_log_eval(t, eval_after, false, err);
    }
    if (rc == 0) rc = save_final_model(t, err);
    if (rc == 0 && t->dist.rank == 0 && c->merge_lora) rc = save_merged(t, err); /* the first group's ranks */
    if (rc == 0 && t->writer) {
        ReportSummary s = {.eval_reward_before = eval_before, .eval_reward_after = eval_after,
                           .steps = t->global_step, .seconds = time_now() - run_start};
        rc = report_write(c->output_dir, &s, train_config_to_json(c), err);
    }
    rc = train_dist_agree(&t->dist, rc, err);
    if (rc == 0) log_info0("done: %lld steps in %.1f s; model, metrics.jsonl, summary.json and reward_curve.svg in %s",
                           (long long)t->global_step, time_now() - run_start, c->output_dir);
    return rc;
}

int trainer_run(TrainConfig *c, const LaunchEnv *env, char *err) {
    Trainer t;
    double run_start = time_now();
    if (trainer_setup(&t, c, env, err) != 0 || (strcmp(c->vllm_mode, "server") == 0 && trainer_server_connect(&t, err) != 0)) {
        trainer_teardown(&t);
        return COLT_ERR;
    }
    log_info0("colt train: %s on %s, %zu prompts, %lld steps (%d completions per round: %d prompts x %d)",
              c->model, c->dataset, dataset_size(t.data), (long long)t.total_steps, c->generation_batch_size,
              c->generation_batch_size / c->num_generations, c->num_generations);
    log_info0("deterministic mode %s (%s)", t.engine_opts.deterministic ? "on" : "off",
              c->deterministic_set ? "as configured" : "default: on for bf16 weights, off for fp32");
    if (t.be->set_threads)
        log_info0("CPU threads: %d per rank (%s)", t.mesh.host_threads, t.mesh.host_threads_why);
    struct sigaction sa = {0};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaddset(&sa.sa_mask, SIGINT);
    sigaddset(&sa.sa_mask, SIGTERM);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    g_stop_requested = 0;
    g_tell_stop = env->rank == 0;

    double eval_before = NAN;
    int rc = trainer_begin(&t, &eval_before, err);
    StepClock clock = {.run_first_step = t.global_step, .loop_start = time_now()};
    bool stop = false;
    while (rc == 0 && !stop && t.global_step < t.total_steps) {
        step_clock_start(&clock, &t);
        double loss = 0, norm = 0;
        rc = train_step(&t, &loss, &norm, err); /* round -> micro-batches -> gradients -> AdamW */
        if (rc == 0) trainer_add_step_metrics(&t, &clock, loss, norm);
        if (rc == 0) rc = trainer_after_step(&t, &clock, loss, &stop, err); /* log, eval, save */
    }
    if (rc == 0 && !stop) rc = trainer_finish(&t, eval_before, run_start, err);
    /* After an error the ranks may not have issued the same collectives. */
    if (rc != 0) train_dist_cancel_gradients(&t.dist);
    trainer_teardown(&t);
    return rc;
}
