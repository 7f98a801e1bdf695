/* cmd_train.c — `colt train`: GRPO training from a YAML/JSON config and/or
 * flags named as TRL's GRPOConfig (flags override the file). */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "core/error.h"
#include "core/log.h"
#include "backend/backend.h"
#include "dist/launch_env.h"
#include "dist/local_launch.h"
#include "train/train_config.h"
#include "train/trainer.h"

static const char *TRAIN_USAGE =
    "usage: colt train [--config FILE.yaml|FILE.json] [--SETTING VALUE ...]\n"
    "  GRPO training with TRL's GRPOConfig names; flags override the file. A true/false\n"
    "  setting alone (--gradient_checkpointing) means true.\n"
    "  Writes OUTPUT_DIR/metrics.jsonl, completions.jsonl, checkpoint-N/, the final model,\n"
    "  summary.json and reward_curve.svg. Ctrl-C finishes the step, saves a checkpoint and exits.\n"
    "settings:\n";

int cmd_train(int argc, char **argv) {
    char err[ERR_LEN];
    TrainConfig cfg;
    train_config_defaults(&cfg);
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
        if (train_config_set(&cfg, key, value, "command line", err) != 0) {
            train_config_free(&cfg);
            return cli_fail("train", err);
        }
    }
    /* Under torchrun, srun or mpirun this process is one rank of the launch. */
    LaunchEnv env;
    if (launch_env_from_process(&env, err) != 0) {
        train_config_free(&cfg);
        return cli_fail("train", err);
    }
    log_set_rank(env.rank);
    /* No launcher: colt starts one process per GPU (or nproc_per_node) itself. */
    if (env.launcher == LAUNCHER_NONE && !local_launch_is_child()) {
        int nproc = cfg.nproc_per_node;
        if (nproc == 0 && strcmp(cfg.device, "cpu") != 0)
            nproc = cfg.devices ? (int)json_array_size(cfg.devices) : backend_cuda_device_count();
        if (nproc > 1) {
            char **child_argv = xcalloc((size_t)argc + 3, sizeof(char *));
            child_argv[0] = "colt";
            child_argv[1] = "train";
            for (int i = 0; i < argc; i++) child_argv[i + 2] = argv[i];
            fprintf(stderr, "colt train: starting %d processes on this node (nproc_per_node)\n", nproc);
            int status = local_launch_run(nproc, child_argv, err);
            free(child_argv);
            train_config_free(&cfg);
            return status < 0 ? cli_fail("train", err) : status;
        }
    }
    cfg.world_size = env.world_size;
    int rc = 0;
    if (train_config_finalize(&cfg, err) != 0) rc = cli_fail("train", err);
    if (rc == 0) train_config_print_notices(&cfg); /* here: once, by rank 0 of the processes that train */
    if (rc == 0 && trainer_run(&cfg, &env, err) != 0) rc = cli_fail("train", err);
    train_config_free(&cfg);
    return rc;
}
