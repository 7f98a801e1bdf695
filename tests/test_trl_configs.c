/* test_trl_configs.c — TRL users' configs load unchanged and train
 * (tests/data/trl_configs/, made by tests/ref/make_trl_configs.py with trl
 * itself):
 *   - GRPOConfig(output_dir=..., use_cpu=True).to_dict() (JSON and YAML) and
 *     the bf16=False dump load as they are: every honoured key holds the
 *     dump's value (null: colt's default, as TRL's None), every alias sets its
 *     target, every other key leaves one notice line; then two training steps
 *     on stories260K from each dump; the DAPO, Dr. GRPO and GSPO recipes
 *     (GRPOConfig's help, TRL's paper index) load the same way, GSPO's trains;
 *   - a `trl grpo --config` YAML (datasets, reward_funcs short names,
 *     logging_first_step, cosine_with_min_lr with min_lr_rate, save_strategy
 *     "no", generation_kwargs, shuffle_dataset false, null defaults) trains two
 *     steps: steps 1 and 2 logged, the learning rates transformers logs, the
 *     prompts in file order, no checkpoint, the sampling settings applied;
 *   - `trl grpo`'s command line (dataset_name, several reward names after one
 *     flag, a bare --use_cpu) trains a step;
 *   - the same YAML resumed from checkpoint-1 gives step 2's completions
 *     again (the file order is rebuilt on resume); shuffle_dataset is in the
 *     resume record (a change is refused; an older record resumes shuffled);
 *   - cosine_with_min_lr's learning rates against transformers' scheduler
 *     (min_lr_rate and min_lr), and think_format_reward against trl's function.
 * Not test_train_config (every key and range): this is whole files of TRL's. */
#include <dirent.h>
#include <float.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/error.h"
#include "core/fileio.h"
#include "data/dataset.h"
#include "data/rewards.h"
#include "train/checkpoint.h"
#include "parallel/optim.h"
#include "train/train_config.h"
#include "harness.h"

#define DATA COLT_SOURCE_DIR "/tests/data/trl_configs"
/* What TRL passes to GRPOTrainer beside the config (model, train_dataset,
 * reward_funcs), as colt's flags; the length keeps the test in budget. */
#define TRAINER_ARGS                                                                                              \
    "--model " COLT_SOURCE_DIR "/models/stories260K --dataset " DATA "/prompts.jsonl --reward_funcs "            \
    "'[{\"type\": \"length\", \"target\": 8}]' --max_steps 2 --max_completion_length 16"

static json_t *load_json(const char *path) {
    json_error_t jerr;
    json_t *j = json_load_file(path, 0, &jerr);
    CHECK(j != NULL, "%s: %s", path, jerr.text);
    return j;
}

static bool same_value(const json_t *a, const json_t *b) {
    return json_equal(a, b) || (json_is_number(a) && json_is_number(b) && json_number_value(a) == json_number_value(b));
}

/* ---------------------------------------------------------------- the dumps load */

/* Loads a dump the way `colt train --config FILE` does, with TRL's trainer
 * arguments as flags, and checks every key of it (dump: the same file's JSON);
 * trl_defaults: the dump is GRPOConfig's defaults, whose derived values are known. */
static void check_dump(const char *file, const json_t *dump, const char *device_want, bool trl_defaults) {
    TrainConfig c, d;
    char err[ERR_LEN] = "";
    train_config_defaults(&c);
    train_config_defaults(&d);
    int rc = train_config_load_file(&c, file, err);
    CHECK(rc == 0, "%s: %s", file, err);
    json_t *loaded = train_config_to_json(&c), *defaults = train_config_to_json(&d);
    int honoured = 0, aliases = 0, noticed = 0;
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)dump, key, v) {
        char text[1024];
        TrainKeyClass cls = train_config_describe_key(text, sizeof text, key);
        CHECK(cls != TRAIN_KEY_UNKNOWN, "%s: %s is unknown", file, key);
        const char *target = key;
        char alias[64] = "";
        if (cls == TRAIN_KEY_ALIAS) { /* "sets `gradient_checkpointing`: ..." */
            sscanf(text, "sets `%63[^`]`", alias);
            target = alias;
            aliases++;
        }
        if (cls == TRAIN_KEY_HONOURED || cls == TRAIN_KEY_ALIAS) {
            const json_t *want = json_is_null(v) ? json_object_get(defaults, target) : v, *got =
                                                                                       json_object_get(loaded, target);
            char *w = json_dumps(want, JSON_ENCODE_ANY), *g = json_dumps(got, JSON_ENCODE_ANY);
            CHECK(got && same_value(want, got), "%s: %s: TRL wrote %s, colt's %s holds %s", file, key, w, target, g);
            free(w), free(g);
            honoured += cls == TRAIN_KEY_HONOURED;
        } else {
            CHECK(json_object_get(c.notices, key) != NULL, "%s: %s (%s) left no notice", file, key, text);
            noticed++;
        }
    }
    CHECK(json_object_size(c.notices) == (size_t)noticed, "%s: %zu notices for %d keys that change nothing", file,
          json_object_size(c.notices), noticed);
    /* what the trainer is given, then the derived settings */
    const char *flags[][2] = {{"model", "models/stories260K"}, {"dataset", "prompts.jsonl"},
                              {"reward_funcs", "[{\"type\": \"length\"}]"}};
    for (int i = 0; i < 3 && rc == 0; i++) rc = train_config_set(&c, flags[i][0], flags[i][1], "command line", err);
    rc = rc ? rc : train_config_finalize(&c, err);
    CHECK(rc == 0, "%s finalize: %s", file, err);
    CHECK(rc != 0 || (strcmp(c.device, device_want) == 0 &&
                      (!trl_defaults || (c.generation_batch_size == 8 && c.steps_per_generation == 1 &&
                                     c.max_completion_length == 512 && c.eval_steps == 0 && c.ddp_bucket_cap_mb == 25 &&
                                     c.min_p == 0 && c.epsilon_high == 0.2 && c.gradient_checkpointing))),
          "%s: device %s (want %s), generation_batch_size %d, steps_per_generation %d, max_completion_length %d", file,
          c.device, device_want, c.generation_batch_size, c.steps_per_generation, c.max_completion_length);
    printf("  %s: %zu keys: %d honoured, %d aliases, %d with a notice; device %s\n", file + strlen(DATA) + 1,
           json_object_size(dump), honoured, aliases, noticed, c.device);
    json_decref(loaded), json_decref(defaults);
    train_config_free(&c), train_config_free(&d);
}

static void test_dumps_load(void) {
    int before = g_checks;
    json_t *use_cpu = load_json(DATA "/grpo_config_use_cpu.json"), *bf16 = load_json(DATA "/grpo_config_bf16_false.json");
    CHECK(json_object_size(use_cpu) >= 190 && json_is_true(json_object_get(use_cpu, "use_cpu")),
          "grpo_config_use_cpu.json: %zu keys", json_object_size(use_cpu));
    check_dump(DATA "/grpo_config_use_cpu.json", use_cpu, "cpu", true);
    check_dump(DATA "/grpo_config_use_cpu.yaml", use_cpu, "cpu", true); /* the YAML of the same dict */
    /* bf16: false: fp32 weights, on a GPU the cuda_f32 backend */
    check_dump(DATA "/grpo_config_bf16_false.json", bf16, backend_gpu_count() > 0 ? "cuda_f32" : "cpu", true);
    json_decref(use_cpu), json_decref(bf16);
    /* the DAPO, Dr. GRPO and GSPO recipes: their values reach colt's settings (check_dump) */
    const char *papers[] = {"grpo_config_dapo.json", "grpo_config_dr_grpo.json", "grpo_config_gspo.json"};
    for (int p = 0; p < 3; p++) {
        char path[512];
        snprintf(path, sizeof path, DATA "/%s", papers[p]);
        json_t *dump = load_json(path);
        check_dump(path, dump, "cpu", false);
        json_decref(dump);
    }
    printf("GRPOConfig().to_dict() dumps load: %d checks\n", g_checks - before);
}

/* ---------------------------------------------------------------- reference values */

/* cosine_with_min_lr against transformers: min_lr_rate as given, min_lr as a
 * fraction of learning_rate (resolved by train_config_finalize). The schedule
 * is computed in double and rounded to float once: within one float rounding. */
static void test_schedules(void) {
    int before = g_checks, compared = 0;
    json_t *g = load_json(DATA "/schedules.json");
    size_t i;
    json_t *s;
    json_array_foreach(json_object_get(g, "schedules"), i, s) {
        double base = json_number_value(json_object_get(s, "base_lr"));
        int total = (int)json_integer_value(json_object_get(s, "total")),
            warm = (int)json_integer_value(json_object_get(s, "warmup"));
        TrainConfig c;
        char err[ERR_LEN] = "", text[512];
        char *kwargs = json_dumps(json_object_get(s, "kwargs"), JSON_COMPACT);
        snprintf(text, sizeof text, "model: m\ndataset: d.jsonl\nreward_funcs: [{type: length}]\nlearning_rate: %.17g\n"
                                    "lr_scheduler_type: cosine_with_min_lr\nlr_scheduler_kwargs: %s\n", base, kwargs);
        free(kwargs);
        train_config_defaults(&c);
        int rc = train_config_load_text(&c, text, strlen(text), TRAIN_CONFIG_YAML, "schedule.yaml", err);
        rc = rc ? rc : train_config_finalize(&c, err);
        CHECK(rc == 0, "schedule %zu: %s", i, err);
        LrSchedulerType type;
        CHECK(lr_scheduler_parse(&type, c.lr_scheduler_type, err) == 0 && type == LR_COSINE_WITH_MIN_LR, "%s", err);
        double worst = 0;
        for (int step = 0; step < total; step++) {
            double want = json_number_value(json_array_get(json_object_get(s, "used"), (size_t)step));
            float got = lr_schedule_value(type, (float)base, step, total, warm, c.min_lr_rate);
            double diff = fabs((double)got - want);
            CHECK(diff <= fabs(want) * FLT_EPSILON, "schedule %zu step %d: %.9g, transformers %.9g", i, step, got, want);
            if (want != 0 && diff / fabs(want) > worst) worst = diff / fabs(want);
            compared++;
        }
        printf("  cosine_with_min_lr lr %g, %d steps, warmup %d, min_lr_rate %g: worst relative difference %.2g\n",
               base, total, warm, c.min_lr_rate, worst);
        train_config_free(&c);
    }
    json_decref(g);
    CHECK(compared >= 19, "%d learning rates compared", compared);
    printf("schedules against transformers: %d checks\n", g_checks - before);
}

/* think_format_reward (colt's regex reward) against trl.rewards.think_format_reward. */
static void test_think_format(void) {
    int before = g_checks;
    TrainConfig c;
    char err[ERR_LEN] = "";
    train_config_defaults(&c);
    int rc = train_config_set(&c, "reward_funcs", "[\"think_format_reward\"]", "command line", err);
    CHECK(rc == 0, "think_format_reward: %s", err);
    RewardFunc *r = NULL;
    rc = rc ? rc : reward_create(&r, json_array_get(c.reward_funcs, 0), err);
    CHECK(rc == 0 && strcmp(reward_name(r), "think_format_reward") == 0, "reward: %s", err);
    json_t *g = load_json(DATA "/think_format.json"), *cases = json_object_get(g, "cases");
    size_t n = json_array_size(cases), ones = 0;
    const char **texts = calloc(n + 1, sizeof *texts);
    float *got = calloc(n + 1, sizeof *got);
    for (size_t i = 0; i < n; i++) texts[i] = json_string_value(json_object_get(json_array_get(cases, i), "completion"));
    rc = rc ? rc : reward_compute(r, got, texts, texts, NULL, NULL, NULL, (int)n, err);
    CHECK(rc == 0, "reward_compute: %s", err);
    for (size_t i = 0; rc == 0 && i < n; i++) {
        double want = json_number_value(json_object_get(json_array_get(cases, i), "reward"));
        CHECK(got[i] == want, "think_format_reward(%s) = %g, trl's %g", texts[i], got[i], want);
        ones += want == 1;
    }
    CHECK(n >= 10 && ones > 0 && ones < n, "%zu cases, %zu rewarded: both outcomes must be probed", n, ones);
    printf("think_format_reward: %zu completions (%zu rewarded) as trl's: %d checks\n", n, ones, g_checks - before);
    reward_free(r);
    free(texts), free(got);
    json_decref(g);
    train_config_free(&c);
}

/* ---------------------------------------------------------------- training */

/* Runs colt train with args in the folder cwd; its exit status, stderr in *err_text. */
static int colt_train(const char *cwd, const char *args, char **err_text) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "cd %s && OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive %s train %s > /dev/null 2> %s/err.txt",
             cwd, COLT_BINARY, args, g_tmp);
    int status = system(cmd);
    *err_text = read_text(g_tmp, "err.txt");
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* metrics.jsonl's rows as a JSON list. */
static json_t *metrics_rows(const char *dir) {
    json_t *rows = json_array();
    char *text = read_text(dir, "metrics.jsonl");
    for (char *line = text ? strtok(text, "\n") : NULL; line; line = strtok(NULL, "\n")) {
        json_t *row = json_loads(line, 0, NULL);
        if (row) json_array_append_new(rows, row);
    }
    free(text);
    return rows;
}

static json_t *summary_config(const char *dir) {
    char *text = read_text(dir, "summary.json");
    json_t *s = text ? json_loads(text, 0, NULL) : NULL;
    free(text);
    json_t *c = json_incref(json_object_get(s, "config"));
    json_decref(s);
    CHECK(c != NULL, "%s/summary.json has no config", dir);
    return c;
}

static void test_train_dumps(void) {
    int before = g_checks;
    const char *dumps[] = {"grpo_config_use_cpu.json", "grpo_config_bf16_false.json", "grpo_config_gspo.json"};
    for (int i = 0; i < 3; i++) {
        char args[2048], dir[400], *err = NULL;
        snprintf(dir, sizeof dir, "%s/dump%d", g_tmp, i);
        /* use_cpu: true alone picks the CPU; bf16: false would take cuda_f32 on a GPU machine, so CI names the CPU */
        /* the first also evaluates 3 prompts with num_generations_eval 2 (8 would be num_generations') */
        snprintf(args, sizeof args, "--config " DATA "/%s " TRAINER_ARGS " --output_dir dump%d%s", dumps[i], i,
                 i == 1   ? " --device cpu"
                 : i == 0 ? " --eval_dataset " DATA "/prompts.jsonl --num_eval_prompts 3 --num_generations_eval 2"
                          : "");
        double t0 = now_s();
        int rc = colt_train(g_tmp, args, &err);
        CHECK(rc == 0, "colt train --config %s: exit %d: %s", dumps[i], rc, err ? err : "");
        json_t *rows = metrics_rows(dir), *cfg = summary_config(dir);
        json_t *last = json_array_get(rows, json_array_size(rows) - 1);
        /* logging_steps 10 of 2 steps: the last step alone; the length reward varies, so the step trains */
        CHECK(json_array_size(rows) == 1 && json_integer_value(json_object_get(last, "step")) == 2 &&
                  json_number_value(json_object_get(last, "reward_std")) > 0 &&
                  json_number_value(json_object_get(last, "grad_norm")) > 0,
              "%s: metrics rows %zu, last step %lld", dumps[i], json_array_size(rows),
              (long long)json_integer_value(json_object_get(last, "step")));
        CHECK(!strcmp(json_string_value(json_object_get(cfg, "device")), "cpu") &&
                  json_integer_value(json_object_get(cfg, "max_completion_length")) == 16 &&
                  json_integer_value(json_object_get(cfg, "save_steps")) == 500 &&
                  json_is_true(json_object_get(cfg, "gradient_checkpointing")),
              "%s: the run's config", dumps[i]);
        if (i == 2) /* GSPO: sequence-level ratios, 4 micro-batches per round of 32 completions */
            CHECK(!strcmp(json_string_value(json_object_get(cfg, "importance_sampling_level")), "sequence") &&
                      json_integer_value(json_object_get(cfg, "generation_batch_size")) == 32 &&
                      json_integer_value(json_object_get(cfg, "steps_per_generation")) == 4 &&
                      json_number_value(json_object_get(cfg, "epsilon_high")) == 4e-4,
                  "GSPO's recipe as run");
        if (i == 0) {
            char *before_text = read_text(dir, "eval_before.jsonl"), *after_text = read_text(dir, "eval_after.jsonl");
            CHECK(before_text && after_text && count_lines(before_text) == 6 && count_lines(after_text) == 6,
                  "num_generations_eval 2 x 3 prompts: eval files of %d and %d lines, want 6",
                  before_text ? count_lines(before_text) : -1, after_text ? count_lines(after_text) : -1);
            free(before_text), free(after_text);
        }
        printf("  colt train --config %s: exit %d, %.1f s, step 2 reward_std %.3g grad_norm %.3g\n", dumps[i], rc,
               now_s() - t0, json_number_value(json_object_get(last, "reward_std")),
               json_number_value(json_object_get(last, "grad_norm")));
        json_decref(rows), json_decref(cfg);
        free(err);
    }
    /* On a GPU machine: bf16: false alone trains with fp32 weights on the GPU (cuda_f32), and
     * cast_lm_head_to_fp32 is refused where the weights would be bf16 (device auto) */
    if (backend_gpu_count() > 0) {
        char args[2048], dir[400], *err = NULL;
        snprintf(dir, sizeof dir, "%s/dump_gpu", g_tmp);
        snprintf(args, sizeof args, "--config " DATA "/grpo_config_bf16_false.json " TRAINER_ARGS " --output_dir dump_gpu");
        int rc = colt_train(g_tmp, args, &err);
        json_t *cfg = rc == 0 ? summary_config(dir) : NULL;
        CHECK(rc == 0 && !strcmp(json_string_value(json_object_get(cfg, "device")), "cuda_f32"),
              "bf16: false on a GPU: exit %d, device %s: %s", rc, json_string_value(json_object_get(cfg, "device")),
              err ? err : "");
        printf("  GPU: colt train --config grpo_config_bf16_false.json: exit %d, device %s\n", rc,
               json_string_value(json_object_get(cfg, "device")));
        json_decref(cfg), free(err);
        rc = colt_train(g_tmp, "--config " DATA "/grpo_config_use_cpu.json " TRAINER_ARGS " --use_cpu false "
                        "--cast_lm_head_to_fp32 true --output_dir dump_gpu2", &err);
        CHECK(rc != 0 && err && strstr(err, "cast_lm_head_to_fp32: true is not supported with bf16 weights"),
              "cast_lm_head_to_fp32 on bf16 GPU weights: exit %d: %s", rc, err ? err : "");
        free(err);
    } else {
        printf("  no GPU: bf16: false -> cuda_f32 checked on GPU machines only\n");
    }
    printf("GRPOConfig dumps train: %d checks\n", g_checks - before);
}

/* The `trl grpo` YAML: logging_first_step logs step 1, cosine_with_min_lr's
 * learning rates are transformers', shuffle_dataset false takes the prompts in
 * file order, save_strategy "no" writes no checkpoint, generation_kwargs'
 * top_k reaches the sampler's settings. */
static void test_train_trl_grpo_yaml(void) {
    int before = g_checks;
    char dir[400], *err = NULL;
    snprintf(dir, sizeof dir, "%s/grpo", g_tmp);
    double t0 = now_s();
    /* from the repository root: the file's data_files is relative to where trl grpo runs, as TRL reads it */
    char args[1024];
    snprintf(args, sizeof args, "--config tests/data/trl_configs/trl_grpo.yaml --model models/stories260K --output_dir %s "
                                "--log_completions_count 8", dir);
    int rc = colt_train(COLT_SOURCE_DIR, args, &err);
    CHECK(rc == 0, "colt train --config trl_grpo.yaml: exit %d: %s", rc, err ? err : "");
    CHECK(err && strstr(err, "accuracy_reward is colt's math reward"), "no notice for accuracy_reward");
    json_t *rows = metrics_rows(dir), *cfg = summary_config(dir), *g = load_json(DATA "/schedules.json");
    json_t *logged = json_object_get(json_array_get(json_object_get(g, "schedules"), 0), "logged");
    CHECK(json_array_size(rows) == 2, "metrics.jsonl: %zu rows, want steps 1 and 2", json_array_size(rows));
    for (size_t s = 0; s < json_array_size(rows); s++) {
        json_t *row = json_array_get(rows, s);
        double lr = json_number_value(json_object_get(row, "learning_rate")),
               want = json_number_value(json_array_get(logged, s));
        CHECK(json_integer_value(json_object_get(row, "step")) == (json_int_t)s + 1 &&
                  fabs(lr - want) <= want * FLT_EPSILON * 2,
              "step %zu: learning_rate %.9g, transformers logs %.9g", s + 1, lr, want);
        CHECK(json_object_get(row, "rewards/think_format_reward/mean") &&
                  json_object_get(row, "rewards/accuracy_reward/mean"),
              "step %zu: no per-function rewards", s + 1);
        printf("  step %zu: learning_rate %.9g (transformers %.9g)\n", s + 1, lr, want);
    }
    /* file order: round 1 takes rows 0-1, round 2 rows 2-3 (8 completions / 4 per prompt) */
    Dataset *data = NULL;
    char derr[ERR_LEN];
    CHECK(dataset_load_column(&data, DATA "/prompts.jsonl", "prompt", derr) == 0, "%s", derr);
    char *text = read_text(dir, "completions.jsonl");
    int seen = 0, in_order = 0, thinks = 0;
    for (char *line = text ? strtok(text, "\n") : NULL; line; line = strtok(NULL, "\n")) {
        json_t *row = json_loads(line, 0, NULL);
        long long step = json_integer_value(json_object_get(row, "step"));
        const char *prompt = json_string_value(json_object_get(row, "prompt"));
        size_t first = (size_t)(step - 1) * 2;
        for (size_t k = first; data && prompt && k < first + 2 && k < dataset_size(data); k++)
            in_order += strcmp(prompt, json_string_value(json_object_get(dataset_row(data, k), "prompt"))) == 0;
        const char *completion = json_string_value(json_object_get(row, "completion"));
        thinks += completion && strncmp(completion, "<think>", 7) == 0;
        seen++;
        json_decref(row);
    }
    CHECK(seen == 16 && in_order == seen, "completions.jsonl: %d completions, %d from the rows in file order", seen,
          in_order);
    /* shuffled, epoch 1 would start elsewhere: the check above is not met by chance */
    size_t order[4];
    dataset_epoch_order(order, 4, 42, 1);
    CHECK(!((order[0] == 0 && order[1] == 1) || (order[0] == 1 && order[1] == 0)), "seed 42 shuffles rows 0-1 first");
    json_t *last = json_array_get(rows, 1);
    CHECK(thinks == 0 && json_number_value(json_object_get(last, "rewards/think_format_reward/mean")) == 0,
          "no completion starts with <think> (%d), so think_format_reward is 0", thinks);
    DIR *d = opendir(dir);
    int checkpoints = 0;
    for (struct dirent *e; d && (e = readdir(d));) checkpoints += strncmp(e->d_name, "checkpoint-", 11) == 0;
    if (d) closedir(d);
    CHECK(checkpoints == 0 && exists_in(dir, "model.safetensors"), "save_strategy no: %d checkpoints", checkpoints);
    CHECK(json_integer_value(json_object_get(cfg, "top_k")) == 50 &&
              json_integer_value(json_object_get(cfg, "save_steps")) == 0 &&
              !strcmp(json_string_value(json_object_get(cfg, "device")), "cpu") &&
              json_is_false(json_object_get(cfg, "shuffle_dataset")) &&
              json_is_true(json_object_get(cfg, "logging_first_step")) &&
              !strcmp(json_string_value(json_object_get(cfg, "dataset")), "tests/data/trl_configs/prompts.jsonl"),
          "the run's config: top_k, save_steps, device, shuffle_dataset, logging_first_step, dataset");
    printf("  colt train --config trl_grpo.yaml: exit %d, %.1f s, %d completions in file order, %d checkpoints\n", rc,
           now_s() - t0, in_order, checkpoints);
    free(text), free(err);
    dataset_free(data);
    json_decref(rows), json_decref(cfg), json_decref(g);
    printf("trl grpo YAML trains: %d checks\n", g_checks - before);
}

/* The `trl grpo` command line as TRL's docs write it (model_name_or_path,
 * dataset_name, reward_funcs with several names after one flag, use_cpu
 * alone meaning true), on colt train. */
static void test_trl_grpo_flags(void) {
    int before = g_checks;
    char args[1024], dir[400], *err = NULL;
    snprintf(dir, sizeof dir, "%s/flags", g_tmp);
    snprintf(args, sizeof args, "--model_name_or_path models/stories260K --dataset_name tests/data/trl_configs/prompts.jsonl "
                                "--reward_funcs think_format_reward accuracy_reward --output_dir %s --use_cpu "
                                "--max_steps 1 --max_completion_length 8 --per_device_train_batch_size 4 "
                                "--num_generations 4 --logging_steps 1", dir);
    int rc = colt_train(COLT_SOURCE_DIR, args, &err);
    CHECK(rc == 0, "colt train with trl grpo's flags: exit %d: %s", rc, err ? err : "");
    json_t *cfg = rc == 0 ? summary_config(dir) : NULL, *funcs = json_object_get(cfg, "reward_funcs");
    CHECK(json_array_size(funcs) == 2 &&
              !strcmp(json_string_value(json_object_get(json_array_get(funcs, 0), "name")), "think_format_reward") &&
              !strcmp(json_string_value(json_object_get(json_array_get(funcs, 1), "name")), "accuracy_reward") &&
              !strcmp(json_string_value(json_object_get(cfg, "device")), "cpu") &&
              !strcmp(json_string_value(json_object_get(cfg, "dataset")), "tests/data/trl_configs/prompts.jsonl"),
          "trl grpo's flags: reward_funcs, device, dataset as given");
    printf("  colt train --model_name_or_path ... --dataset_name ... --reward_funcs think_format_reward "
           "accuracy_reward --use_cpu: exit %d, %zu reward functions\n", rc, json_array_size(funcs));
    json_decref(cfg);
    free(err);
    printf("trl grpo flags: %d checks\n", g_checks - before);
}

/* The completions of a step in dir's completions.jsonl, one per line, in file order. */
static char *step_completions(const char *dir, long long step) {
    char *text = read_text(dir, "completions.jsonl"), *out = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&out, &len);
    for (char *line = text ? strtok(text, "\n") : NULL; line; line = strtok(NULL, "\n")) {
        json_t *row = json_loads(line, 0, NULL);
        if (json_integer_value(json_object_get(row, "step")) == step) fprintf(mem, "%s\n", line);
        json_decref(row);
    }
    fclose(mem);
    free(text);
    return out;
}

/* shuffle_dataset false survives a resume (the file order is rebuilt, not the
 * seeded shuffle), and is part of the resume record: a resume that changes it
 * is refused; a record from before the setting (no entry) resumes as shuffled. */
static void test_resume_file_order(void) {
    int before = g_checks;
    char args[1536], *err = NULL;
    const char *base = "--config tests/data/trl_configs/trl_grpo.yaml --model models/stories260K --log_completions_count 8";
    snprintf(args, sizeof args, "%s --save_strategy steps --save_steps 1 --output_dir %s/r1", base, g_tmp);
    int rc = colt_train(COLT_SOURCE_DIR, args, &err);
    CHECK(rc == 0, "run with checkpoints: exit %d: %s", rc, err ? err : "");
    free(err);
    snprintf(args, sizeof args, "%s --resume_from_checkpoint %s/r1/checkpoint-1 --output_dir %s/r2", base, g_tmp, g_tmp);
    rc = colt_train(COLT_SOURCE_DIR, args, &err);
    CHECK(rc == 0, "resume: exit %d: %s", rc, err ? err : "");
    free(err);
    char dir1[400], dir2[400];
    snprintf(dir1, sizeof dir1, "%s/r1", g_tmp);
    snprintf(dir2, sizeof dir2, "%s/r2", g_tmp);
    char *a = step_completions(dir1, 2), *b = step_completions(dir2, 2);
    CHECK(a && b && count_lines(a) == 8 && strcmp(a, b) == 0, "step 2 after a resume: %d completions, %s the run's",
          b ? count_lines(b) : -1, a && b && !strcmp(a, b) ? "equal to" : "unlike");
    free(a), free(b);
    snprintf(args, sizeof args, "%s --shuffle_dataset true --resume_from_checkpoint %s/r1/checkpoint-1 --output_dir %s/r3",
             base, g_tmp, g_tmp);
    rc = colt_train(COLT_SOURCE_DIR, args, &err);
    CHECK(rc != 0 && err && strstr(err, "shuffle_dataset was false there, true here"),
          "resume with shuffle_dataset changed: exit %d: %s", rc, err ? err : "");
    free(err);
    /* a record written before shuffle_dataset was recorded: resumes as shuffled, not as file order */
    char *state = read_text(dir1, "checkpoint-1/trainer_state.json");
    json_t *s = state ? json_loads(state, 0, NULL) : NULL, *record = json_object_get(s, "resume_record");
    CHECK(record && json_object_get(json_object_get(record, "settings"), "shuffle_dataset"),
          "checkpoint-1's resume record has no shuffle_dataset");
    json_t *current = json_deep_copy(record), *old = json_deep_copy(record);
    json_object_del(json_object_get(old, "settings"), "shuffle_dataset");
    json_object_set_new(json_object_get(current, "settings"), "shuffle_dataset", json_true());
    char cerr[ERR_LEN] = "";
    CHECK(record && checkpoint_check_resume_record(old, current, "old", cerr) == 0, "older record, shuffled: %s", cerr);
    json_object_set_new(json_object_get(current, "settings"), "shuffle_dataset", json_false());
    CHECK(record && checkpoint_check_resume_record(old, current, "old", cerr) != 0 &&
              strstr(cerr, "shuffle_dataset was (not recorded) there, false here"),
          "older record, file order: %s", cerr);
    printf("  resume keeps the file order (step 2 equal); a changed shuffle_dataset refused (%s)\n", cerr);
    json_decref(s), json_decref(current), json_decref(old);
    free(state);
    printf("resume with shuffle_dataset false: %d checks\n", g_checks - before);
}

int main(void) {
    double t0 = now_s();
    snprintf(g_tmp, sizeof g_tmp, "/tmp/colt_test_trl_configs_XXXXXX");
    if (!mkdtemp(g_tmp)) {
        perror("mkdtemp");
        return 1;
    }
    test_dumps_load();
    test_schedules();
    test_think_format();
    test_train_dumps();
    test_train_trl_grpo_yaml();
    test_trl_grpo_flags();
    test_resume_file_order();
    if (!g_failures) sh("rm -rf %s", g_tmp);
    printf("%s: %d checks, %d failed (%.1f s)\n", g_failures ? "FAIL" : "OK", g_checks, g_failures, now_s() - t0);
    return g_failures ? 1 : 0;
}
