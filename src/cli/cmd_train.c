/* cmd_train.c — `colt train`: GRPO training from a YAML/JSON config and/or
 * flags named as TRL's GRPOConfig (flags override the file). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <stdint.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cli/cli.h"
#include "model/hub_cache.h"
#include "core/error.h"
#include "core/fileio.h"
#include "core/log.h"
#include "serve/serve_process.h"
#include "backend/backend.h"
#include "dist/launch_env.h"
#include "dist/local_launch.h"
#include "engine/engine.h"
#include "data/dataset.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"
#include "train/memory_plan.h"
#include "data/prompt.h"
#include "train/train_config.h"
#include "train/trainer.h"

static const char *TRAIN_USAGE =
    "usage: colt train [--config FILE.yaml|FILE.json] [--SETTING VALUE ...]\n"
    "  GRPO training with TRL's GRPOConfig names; flags override the file. A true/false\n"
    "  setting alone (--gradient_checkpointing) means true.\n"
    "  Writes OUTPUT_DIR/metrics.jsonl, completions.jsonl, checkpoint-N/, the final model,\n"
    "  summary.json and reward_curve.svg. Ctrl-C finishes the step, saves a checkpoint and exits.\n"
    "  --dry_run prints the memory plan (from config.json alone) and exits 0 if it fits; with --json as\n"
    "  one JSON object; --device_memory_gb G, --host_memory_gb G and --world_size N plan for another machine.\n"
    "settings:\n";

static int cmd_train_run(TrainConfig *cfg, const LaunchEnv *env, int argc, char **argv, char *const *extra_args,
                         char *err);

/* A run of n free ports on 127.0.0.1 (the replicas' weight channels are at
 * vllm_group_port + i); its first, or -1 with err set. */
static int free_port_run(int n, char *err) {
    for (int attempt = 0; attempt < 64; attempt++) {
        int base = local_launch_free_port(err);
        if (base < 0) return -1;
        bool free_run = base + n - 1 <= 65535;
        for (int i = 1; i < n && free_run; i++) {
            int fd = socket(AF_INET, SOCK_STREAM, 0);
            struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)(base + i)),
                                    .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
            free_run = fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
            if (fd >= 0) close(fd);
        }
        if (free_run) return base;
    }
    errorf(err, "server_devices: no run of %d free ports on 127.0.0.1 for the replicas' weight channels", n);
    return -1;
}

/* CUDA_VISIBLE_DEVICES for server_devices[lo, hi): our index i is the
 * parent's i-th id. Errors: an index this process does not see. */
static int visible_devices(char *out, size_t size, const json_t *devices, size_t lo, size_t hi, int count, char *err) {
    const char *parent = getenv("CUDA_VISIBLE_DEVICES");
    char ids[64][16];
    int n_ids = 0;
    if (parent && parent[0]) {
        char copy[512];
        snprintf(copy, sizeof copy, "%s", parent);
        for (char *t = strtok(copy, ","); t && n_ids < 64; t = strtok(NULL, ","))
            snprintf(ids[n_ids++], sizeof ids[0], "%s", t);
    }
    out[0] = '\0';
    for (size_t i = lo; i < hi; i++) {
        int d = (int)json_integer_value(json_array_get(devices, i));
        if (d < 0 || d >= count)
            return errorf(err, "server_devices[%zu] is GPU %d but this process sees %d GPU(s)", i, d, count);
        size_t len = strlen(out);
        if (n_ids > d) snprintf(out + len, size - len, "%s%s", len ? "," : "", ids[d]);
        else snprintf(out + len, size - len, "%s%d", len ? "," : "", d);
    }
    return COLT_OK;
}

/* The training processes take the GPUs server_devices leaves, unless devices lists them. */
static int training_devices(TrainConfig *cfg, int count, char *err) {
    if (cfg->devices) return COLT_OK;
    bool taken[1024] = {false};
    for (size_t i = 0; i < json_array_size(cfg->server_devices); i++)
        taken[json_integer_value(json_array_get(cfg->server_devices, i))] = true;
    json_t *rest = json_array();
    for (int d = 0; d < count; d++)
        if (!taken[d]) json_array_append_new(rest, json_integer(d));
    if (json_array_size(rest) == 0) {
        json_decref(rest);
        return errorf(err, "server_devices takes every GPU of this machine (%d): none is left to train on; "
                           "list devices to share one with the server",
                      count);
    }
    cfg->devices = rest;
    return COLT_OK;
}

/* A key of its own (unless one is set): no other program on this machine may push weights. The
 * training processes colt starts read it from their environment (ps shows argv, not this). */
static int own_api_key(TrainConfig *cfg, char *err) {
    if (!cfg->vllm_server_api_key) {
        unsigned char bytes[32];
        if (getrandom(bytes, sizeof bytes, 0) != (ssize_t)sizeof bytes)
            return errorf(err, "server_devices: cannot draw a random API key for colt serve: %s", strerror(errno));
        char hex[2 * sizeof bytes + 1];
        for (size_t i = 0; i < sizeof bytes; i++) snprintf(hex + 2 * i, 3, "%02x", bytes[i]);
        cfg->vllm_server_api_key = xstrdup(hex);
    }
    if (setenv("COLT_API_KEY", cfg->vllm_server_api_key, 1) != 0)
        return errorf(err, "server_devices: cannot hand the API key to the training processes: %s", strerror(errno));
    return COLT_OK;
}

/* Starts the server_data_parallel_size replicas (sp[K]) on their GPUs, all
 * loading at once, and waits until each listens; on an error none is left. */
static int start_replicas(TrainConfig *cfg, ServeProcess *sp, bool gpu, int count, int round, char *err) {
    const int K = cfg->server_data_parallel_size;
    const size_t per = json_array_size(cfg->server_devices) / (size_t)K;
    ServeProcessOptions *o = xcalloc((size_t)K, sizeof(ServeProcessOptions));
    char (*visible)[256] = xcalloc((size_t)K, sizeof *visible);
    char **logs = xcalloc((size_t)K, sizeof(char *));
    int rc = COLT_OK;
    for (int r = 0; r < K && rc == 0; r++) {
        char name[32];
        if (K == 1) snprintf(name, sizeof name, "serve.log");
        else snprintf(name, sizeof name, "serve-%d.log", r); /* one log per replica */
        logs[r] = path_join(cfg->output_dir, name);
        if (gpu) rc = visible_devices(visible[r], sizeof visible[r], cfg->server_devices, r * per, (r + 1) * per, count,
                                      err);
        /* the trainer's own default: deterministic for bf16 weights (GPUs), not for fp32; the server holds
         * the weights in the trainer's precision (cuda_f32: fp32), or the first push finds other bytes */
        const char *device = !gpu ? "cpu" : strcmp(cfg->device, "cuda_f32") == 0 ? "cuda_f32" : "cuda";
        o[r] = (ServeProcessOptions){
            .model = cfg->model, .device = device, .cuda_visible = gpu ? visible[r] : NULL,
            .deterministic = cfg->deterministic_set ? cfg->deterministic : gpu,
            .gpu_memory_utilization = cfg->gpu_memory_utilization_set ? cfg->gpu_memory_utilization : 0,
            .log_path = logs[r], .timeout_s = cfg->vllm_server_timeout, .api_key = cfg->vllm_server_api_key,
            .max_num_seqs = engine_round_max_num_seqs(round / K), /* its share of a round in one batch */
            /* one process per server GPU: the model cut across them */
            .tensor_parallel_size = (int)per};
        if (rc == 0) rc = serve_process_spawn(&sp[r], &o[r], err);
    }
    for (int r = 0; r < K && rc == 0; r++) {
        rc = serve_process_wait(&sp[r], &o[r], err);
        if (rc != 0 && K > 1) error_prefix(err, "replica %d of %d", r, K);
    }
    if (rc != 0) serve_process_stop_all(sp, K, 5);
    for (int r = 0; r < K; r++) free(logs[r]);
    free(logs), free(visible), free(o);
    return rc;
}

/* The data-parallel size the run will have: the launcher's processes, or those colt starts itself
 * (nproc_per_node, else one per GPU in devices or on the machine; one on the CPU), over
 * tensor_parallel_size. */
static int planned_world(const TrainConfig *cfg, const LaunchEnv *env) {
    int world = env->world_size;
    if (env->launcher == LAUNCHER_NONE) {
        world = cfg->nproc_per_node;
        if (world == 0)
            world = strcmp(cfg->device, "cpu") == 0 ? 1
                    : cfg->devices                   ? (int)json_array_size(cfg->devices)
                                                     : backend_gpu_count();
    }
    world /= cfg->tensor_parallel_size;
    return world < 1 ? 1 : world;
}

/* server_devices (the one-command form of server mode): starts colt serve on
 * those GPUs (server_data_parallel_size replicas, sp[K]) with a random API
 * key (unless one is set) and points the run at it; the training processes
 * take the other GPUs unless devices lists them (a GPU listed in both is
 * shared on purpose: the weights then go through the host). extra_args: what
 * the processes colt starts itself must add to their arguments (the
 * server's port or the replicas' URLs, the devices), "--name value" pairs,
 * NULL-terminated. */
static int start_own_server(TrainConfig *cfg, const LaunchEnv *env, ServeProcess *sp, char **extra_args, char *err) {
    if (env->launcher != LAUNCHER_NONE)
        return errorf(err, "server_devices: colt starts colt serve itself only when it also starts the training "
                           "processes (no torchrun, srun or mpirun); under a launcher start colt serve yourself and "
                           "set vllm_server_host / vllm_server_port");
    if (cfg->vllm_server_base_url)
        return errorf(err, "settings: server_devices starts its own server on 127.0.0.1: leave vllm_server_base_url "
                           "out");
    const int K = cfg->server_data_parallel_size;
    bool gpu = strcmp(cfg->device, "cpu") != 0 && backend_gpu_count() > 0;
    int count = gpu ? backend_gpu_count() : 0;
    char all[256];
    if (gpu && (visible_devices(all, sizeof all, cfg->server_devices, 0, json_array_size(cfg->server_devices), count,
                                err) != 0 ||
                training_devices(cfg, count, err) != 0))
        return COLT_ERR;
    /* free ports for the weight channels too: a fixed one could collide with another run's */
    int group_port = free_port_run(K, err);
    if (group_port < 0) return COLT_ERR;
    cfg->vllm_group_port = group_port;
    if (make_dirs(cfg->output_dir, err) != 0 || own_api_key(cfg, err) != 0) return COLT_ERR;
    if (start_replicas(cfg, sp, gpu, count, train_config_round_size(cfg, planned_world(cfg, env)), err) != 0)
        return COLT_ERR;
    int n = 0;
    char port[16];
    if (K == 1) {
        free(cfg->vllm_server_host);
        cfg->vllm_server_host = xstrdup("127.0.0.1");
        cfg->vllm_server_port = sp[0].port;
        extra_args[n++] = xstrdup("--vllm_server_host");
        extra_args[n++] = xstrdup("127.0.0.1");
        extra_args[n++] = xstrdup("--vllm_server_port");
        snprintf(port, sizeof port, "%d", sp[0].port);
        extra_args[n++] = xstrdup(port);
    } else {
        char *urls = xcalloc((size_t)K, 40);
        for (int r = 0; r < K; r++)
            snprintf(urls + strlen(urls), 40, "%shttp://127.0.0.1:%d", r ? "," : "", sp[r].port);
        cfg->vllm_server_base_url = xstrdup(urls);
        extra_args[n++] = xstrdup("--vllm_server_base_url");
        extra_args[n++] = urls;
    }
    extra_args[n++] = xstrdup("--vllm_group_port");
    snprintf(port, sizeof port, "%d", group_port);
    extra_args[n++] = xstrdup(port);
    if (cfg->devices) {
        extra_args[n++] = xstrdup("--devices");
        extra_args[n++] = json_dumps(cfg->devices, JSON_COMPACT);
    }
    extra_args[n] = NULL;
    return COLT_OK;
}

/* Flags of --dry_run (not settings): taken out of argv before the settings are read. */
typedef struct DryRun {
    bool on, json;
    double device_gb, host_gb; /* 0: this machine's */
    int world_size;            /* 0: the launcher's */
} DryRun;

static int take_dry_run_flags(int *argc, char **argv, DryRun *d, char *err) {
    int out = 0;
    for (int i = 0; i < *argc; i++) {
        const char *a = argv[i];
        double *num = strcmp(a, "--device_memory_gb") == 0 ? &d->device_gb
                      : strcmp(a, "--host_memory_gb") == 0 ? &d->host_gb
                                                            : NULL;
        if (strcmp(a, "--dry_run") == 0) d->on = true;
        else if (strcmp(a, "--json") == 0) d->json = true;
        else if (num || strcmp(a, "--world_size") == 0) {
            char *end = NULL;
            double v = i + 1 < *argc ? strtod(argv[i + 1], &end) : 0;
            if (i + 1 >= *argc || end == argv[i + 1] || *end || !(v > 0) || v > 1e7 ||
                (!num && (v != (int)v || v > 65536)))
                return errorf(err, "%s needs a positive %s", a, num ? "number of GB" : "whole number of ranks");
            if (num) *num = v;
            else d->world_size = (int)v;
            i++;
        } else argv[out++] = argv[i];
    }
    *argc = out;
    if ((d->json || d->device_gb || d->host_gb || d->world_size) && !d->on)
        return errorf(err, "--json, --device_memory_gb, --host_memory_gb and --world_size go with --dry_run");
    return 0;
}

/* The longest prompt of the dataset and eval_dataset in tokens, as the
 * trainer encodes them; -1 when the tokenizer or a dataset cannot be read
 * here (planning before downloading). */
static int longest_prompt(const TrainConfig *cfg) {
    char err[ERR_LEN];
    Tokenizer *tok = NULL;
    if (tokenizer_load(&tok, cfg->model, err) != 0) return -1;
    int longest = 0;
    const char *paths[2] = {cfg->dataset, cfg->eval_dataset};
    for (int k = 0; k < 2 && longest >= 0; k++) {
        Dataset *d = NULL;
        if (!paths[k]) continue;
        if (dataset_load_column(&d, paths[k], cfg->dataset_prompt_column, err) != 0) {
            longest = -1;
            break;
        }
        for (size_t i = 0; i < dataset_size(d) && longest >= 0; i++) {
            int *ids = NULL, n = 0;
            char *text = NULL;
            if (prompt_encode_row(&ids, &n, &text, d, i, tok, cfg->chat_template_kwargs, cfg->max_prompt_length,
                                  paths[k], err) != 0)
                longest = -1;
            else if (n > longest) longest = n;
            free(ids);
            free(text);
        }
        dataset_free(d);
    }
    tokenizer_free(tok);
    return longest;
}

/* --dry_run: the memory plan from config.json and the settings, no weights
 * loaded; exit 0 when it fits, 1 when not (the plan says why). The longest
 * prompt is the dataset's when the tokenizer and the dataset are here (cut to
 * max_prompt_length when set), else max_prompt_length, which must then be set. */
static int dry_run(const TrainConfig *cfg, const DryRun *d, int world_size) {
    char err[ERR_LEN];
    ModelConfig mc;
    if (model_config_load(&mc, NULL, cfg->model, err) != 0) return cli_fail("train", err);
    MemoryPlanInput in;
    LoraConfig lora;
    int longest = longest_prompt(cfg);
    bool longest_prompt_known = longest >= 0;
    if (longest < 0 && cfg->max_prompt_length == 0)
        return cli_fail("train", "--dry_run: the longest prompt is unknown (the tokenizer or the dataset is not here) "
                                 "and max_prompt_length is not set: set max_prompt_length to plan for prompts of that "
                                 "many tokens");
    if (longest < 0) longest = cfg->max_prompt_length;
    if (train_config_check_lengths(cfg, longest, err) != 0) return cli_fail("train", err);
    if (!d->json)
        printf("longest prompt: %d tokens (%s)\n", longest,
               longest_prompt_known ? "the dataset's" : "max_prompt_length: the tokenizer or the dataset is not here");
    trainer_plan_input(&in, cfg, &mc, NULL, world_size, longest, &lora);
    if (d->host_gb > 0) in.host_bytes = d->host_gb * 1073741824.0;
    if (d->device_gb > 0) in.device_bytes = in.device_free = d->device_gb * 1073741824.0;
    else if (!in.gpu) in.device_bytes = in.device_free = in.host_bytes;
    else {
        Backend *be = backend_gpu_count() > 0 ? backend_open("cuda", 0, err) : NULL;
        size_t free_b = 0, total_b = 0;
        if (be && be->memory_info) be->memory_info(be, &free_b, &total_b);
        if (be) backend_close(be);
        if (!total_b)
            return cli_fail("train", "--dry_run: no GPU visible to measure: give --device_memory_gb (e.g. 80 for an "
                                     "H100) or --device cpu");
        in.device_bytes = (double)total_b;
        in.device_free = (double)free_b + MEMORY_PLAN_CUDA_OVERHEAD; /* the plan counts the context itself */
    }
    MemoryPlan p;
    memory_plan_compute(&p, &in);
    if (d->json) {
        json_t *j = memory_plan_json(&p, &in);
        char *text = json_dumps(j, JSON_INDENT(2) | JSON_REAL_PRECISION(6));
        printf("%s\n", text);
        free(text);
        json_decref(j);
    } else memory_plan_print(&p, &in, stdout);
    return p.fits && p.fits_host ? 0 : 1;
}

int cmd_train(int argc, char **argv) {
    char err[ERR_LEN];
    TrainConfig cfg;
    train_config_defaults(&cfg);
    DryRun dry = {0};
    if (take_dry_run_flags(&argc, argv, &dry, err) != 0) {
        train_config_free(&cfg);
        return cli_fail("train", err);
    }
    /* The config file first, then every flag on top of it. */
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(TRAIN_USAGE, stdout);
            fprintf(stdout, "  --%-28s %s\n", "config", "YAML or JSON file of settings");
            train_config_print_help(stdout);
            train_config_free(&cfg);
            return 0;
        }
    }
    for (int i = 0; i < argc; i++) {
        if (strncmp(argv[i], "--config", 8) != 0) continue;
        const char *path = argv[i][8] == '=' ? argv[i] + 9 : (argv[i][8] == '\0' && i + 1 < argc ? argv[i + 1] : NULL);
        if (!path) {
            train_config_free(&cfg);
            return cli_fail("train", "option --config needs a file");
        }
        if (train_config_load_file(&cfg, path, err) != 0) {
            train_config_free(&cfg);
            return cli_fail("train", err);
        }
    }
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i];
        if (strncmp(arg, "--", 2) != 0) {
            errorf(err, "unexpected argument '%s' (settings are --name value)", arg);
            train_config_free(&cfg);
            return cli_fail("train", err);
        }
        char key[128];
        const char *eq = strchr(arg + 2, '=');
        size_t klen = eq ? (size_t)(eq - arg - 2) : strlen(arg + 2);
        if (klen >= sizeof key) klen = sizeof key - 1;
        memcpy(key, arg + 2, klen);
        key[klen] = '\0';
        /* A true/false key alone (at the end, or before the next --option) is
         * true, as transformers' HfArgumentParser reads it; a bare key is never
         * followed by a positional argument, so the next word is its value. */
        bool next_is_value = i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0;
        const char *value = eq ? eq + 1 : next_is_value ? argv[++i] : train_config_key_is_bool(key) ? "true" : NULL;
        if (!value) {
            errorf(err, "option --%s needs a value", key);
            train_config_free(&cfg);
            return cli_fail("train", err);
        }
        if (strcmp(key, "config") == 0) continue;
        /* `--reward_funcs a b` (trl grpo's form, HfArgumentParser's nargs): the words up to the next option are
         * one list */
        char *list = NULL;
        if (!eq && next_is_value && train_config_key_is_list(key) && i + 1 < argc && strncmp(argv[i + 1], "--", 2)) {
            json_t *words = json_array();
            json_array_append_new(words, json_string(value));
            while (i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0) json_array_append_new(words, json_string(argv[++i]));
            list = json_dumps(words, JSON_COMPACT);
            json_decref(words);
            value = list;
        }
        int set_rc = train_config_set(&cfg, key, value, "command line", err);
        free(list);
        if (set_rc != 0) {
            train_config_free(&cfg);
            return cli_fail("train", err);
        }
    }
    /* A Hub name as model ("Qwen/Qwen2.5-0.5B-Instruct") is the local Hugging Face cache's folder. */
    if (cfg.model) {
        char *folder = NULL;
        if (hub_cache_model_folder(&folder, cfg.model, cfg.model_revision, err) != 0) {
            train_config_free(&cfg);
            return cli_fail("train", err);
        }
        free(cfg.model);
        cfg.model = folder;
    }
    /* Under torchrun, srun or mpirun this process is one rank of the launch. */
    LaunchEnv env;
    if (launch_env_from_process(&env, err) != 0) {
        train_config_free(&cfg);
        return cli_fail("train", err);
    }
    log_set_rank(env.rank);
    if (dry.on) {
        cfg.world_size = dry.world_size ? dry.world_size / cfg.tensor_parallel_size : planned_world(&cfg, &env);
        if (cfg.world_size < 1) cfg.world_size = 1;
        int rc = train_config_finalize(&cfg, err) != 0 ? cli_fail("train", err) : dry_run(&cfg, &dry, cfg.world_size);
        train_config_free(&cfg);
        return rc;
    }
    if (train_config_check_server_tp(&cfg, err) != 0) {
        train_config_free(&cfg);
        return cli_fail("train", err);
    }
    /* the replicas the one-command form starts (server_data_parallel_size was checked above) */
    const int n_own = cfg.server_devices ? cfg.server_data_parallel_size : 0;
    ServeProcess *own_servers = xcalloc((size_t)n_own + 1, sizeof(ServeProcess));
    char *extra_args[12] = {NULL};
    if (cfg.server_devices && !local_launch_is_child() &&
        start_own_server(&cfg, &env, own_servers, extra_args, err) != 0) {
        free(own_servers);
        train_config_free(&cfg);
        return cli_fail("train", err);
    }
    int rc = cmd_train_run(&cfg, &env, argc, argv, extra_args, err);
    serve_process_stop_all(own_servers, n_own, 10);
    free(own_servers);
    for (int i = 0; extra_args[i]; i++) free(extra_args[i]);
    train_config_free(&cfg);
    return rc;
}

/* The training processes: started here (no launcher, several GPUs) or this one. */
static int cmd_train_run(TrainConfig *cfg, const LaunchEnv *env, int argc, char **argv, char *const *extra_args,
                         char *err) {
    /* No launcher: colt starts one process per GPU (or nproc_per_node) itself. */
    if (env->launcher == LAUNCHER_NONE && !local_launch_is_child()) {
        int nproc = cfg->nproc_per_node;
        if (nproc == 0 && strcmp(cfg->device, "cpu") != 0)
            nproc = cfg->devices ? (int)json_array_size(cfg->devices) : backend_gpu_count();
        if (nproc > 1) {
            int n_extra = 0;
            while (extra_args[n_extra]) n_extra++;
            char **child_argv = xcalloc((size_t)argc + (size_t)n_extra + 3, sizeof(char *));
            child_argv[0] = "colt";
            child_argv[1] = "train";
            for (int i = 0; i < argc; i++) child_argv[i + 2] = argv[i];
            for (int i = 0; i < n_extra; i++) child_argv[argc + 2 + i] = extra_args[i];
            fprintf(stderr, "colt train: starting %d processes on this node (nproc_per_node)\n", nproc);
            int status = local_launch_run(nproc, child_argv, err);
            free(child_argv);
            return status < 0 ? cli_fail("train", err) : status;
        }
    }
    int tp = cfg->tensor_parallel_size;
    if (env->world_size % tp != 0) {
        char msg[256];
        snprintf(msg, sizeof msg, "tensor_parallel_size %d needs a multiple of %d processes (one per part; mpirun -np or "
                                  "torchrun --nproc_per_node), and this launch has %d", tp, tp, env->world_size);
        return cli_fail("train", msg);
    }
    cfg->world_size = env->world_size / tp; /* the data-parallel size: each group of tp processes trains one model */
    if (train_config_finalize(cfg, err) != 0) return cli_fail("train", err);
    train_config_print_notices(cfg); /* here: once, by rank 0 of the processes that train */
    if (trainer_run(cfg, env, err) != 0) return cli_fail("train", err);
    return 0;
}
