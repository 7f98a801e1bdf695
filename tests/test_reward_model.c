/* test_reward_model.c — reward models in the loop (TRL's reward_funcs="path/to/reward-model"), on the CPU
 * against tests/data/models/reward_model_goldens.json (tests/ref/make_reward_model_goldens.py: transformers and
 * TRL 1.16):
 *   - model_score_sequences on token ids (pad ids inside, trailing, first, nothing but pad) equals the scores of
 *     transformers' right-padded batch, for a Qwen2 and a Llama ForSequenceClassification; so does each sequence
 *     scored alone; the last-non-pad rule is what the goldens test (the last token scores differently);
 *   - the model reward ({type: model} and the bare folder string) scores plain and conversational prompts, and
 *     multi-turn tool-calling completions (lists of messages: the calls and tool results in the scored text), as
 *     GRPOTrainer._calculate_rewards does: its own tokenizer and chat template, the pad token or else the eos;
 *   - bad input: a model reward without a device, a reward model given as the policy, a causal LM given as a
 *     reward model, unknown keys;
 *   - a 2-step `colt train` on stories260K with the reward model as its reward: every logged completion's reward
 *     is the model's score of prompt + completion, and rewards/<folder>/mean is logged.
 * Tolerance: |colt - ref| <= 1e-4 + 1e-4 |ref| (fp32 forwards with different summation orders). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "backend/backend.h"
#include "core/error.h"
#include "data/rewards.h"
#include "harness.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

#define GOLDENS COLT_SOURCE_DIR "/tests/data/models/reward_model_goldens.json"
#define ATOL 1e-4
#define RTOL 1e-4

static double g_max_diff = 0.0;

static bool close_to(double got, double want) {
    double d = fabs(got - want);
    if (d > g_max_diff) g_max_diff = d;
    return d <= ATOL + RTOL * fabs(want);
}

/* The golden entry's ids as malloc'd int arrays. */
static int *ids_of(json_t *arr, int *len) {
    *len = (int)json_array_size(arr);
    int *ids = malloc(sizeof(int) * (size_t)(*len ? *len : 1));
    for (int i = 0; i < *len; i++) ids[i] = (int)json_integer_value(json_array_get(arr, (size_t)i));
    return ids;
}

/* model_score_sequences against the padded batch's scores. */
static void test_ids(json_t *entry, const char *dir, const Backend *be) {
    char err[ERR_LEN];
    Model *m = NULL;
    if (model_load_classifier(&m, dir, be, NULL, err) != 0) {
        CHECK(0, "model_load_classifier(%s): %s", dir, err);
        return;
    }
    const ModelConfig *c = model_config(m);
    CHECK(c->num_labels == 1 && !c->tie_word_embeddings, "%s: num_labels %d, tied %d", dir, c->num_labels,
          c->tie_word_embeddings);
    int pad = (int)json_integer_value(json_object_get(entry, "pad_token_id"));
    json_t *cases = json_object_get(entry, "ids");
    int n = (int)json_array_size(cases);
    int **ids = calloc((size_t)n, sizeof(int *)), *lens = calloc((size_t)n, sizeof(int));
    float *batch = calloc((size_t)n, sizeof(float));
    for (int i = 0; i < n; i++) ids[i] = ids_of(json_object_get(json_array_get(cases, (size_t)i), "ids"), &lens[i]);
    int rc = model_score_sequences(m, batch, (const int *const *)ids, lens, n, pad, err);
    CHECK(rc == 0, "%s: model_score_sequences: %s", dir, err);
    int ok = 0;
    for (int i = 0; rc == 0 && i < n; i++) {
        double want = json_number_value(json_object_get(json_array_get(cases, (size_t)i), "score"));
        float alone = NAN;
        CHECK(model_score_sequences(m, &alone, (const int *const *)&ids[i], &lens[i], 1, pad, err) == 0, "%s", err);
        bool good = close_to(batch[i], want) && close_to(alone, want);
        ok += good;
        CHECK(good, "%s ids case %d (%d tokens): colt %.6f (alone %.6f), transformers %.6f", dir, i, lens[i],
              batch[i], alone, want);
    }
    printf("%-14s ids: %d/%d sequences score as transformers' right-padded batch (pad id %d)\n",
           json_string_value(json_object_get(entry, "name")), ok, n, pad);
    /* Not vacuous: sequence 1 ends with pad ids, and its last token scores differently. */
    float last = NAN;
    CHECK(model_score_sequences(m, &last, (const int *const *)&ids[1], &lens[1], 1, -1, err) == 0, "%s", err);
    double want1 = json_number_value(json_object_get(json_array_get(cases, 1), "score"));
    printf("%-14s the last token instead of the last non-pad one: %.4f vs %.4f\n", "", last, want1);
    CHECK(fabs(last - want1) > 0.01, "scoring the trailing pad gives the same score: the rule is untested");
    /* An empty sequence is an error, not a score. */
    int empty_len = 0;
    CHECK(model_score_sequences(m, batch, (const int *const *)ids, &empty_len, 1, pad, err) != 0 &&
              strstr(err, "empty"),
          "an empty sequence: %s", err);
    for (int i = 0; i < n; i++) free(ids[i]);
    free(ids), free(lens), free(batch);
    model_free(m);
}

/* The reward on the golden prompts and completions, as TRL scores them. */
static void test_reward(json_t *entry, const char *dir, const Backend *be, bool as_text) {
    char err[ERR_LEN];
    RewardContext ctx = {.be = be};
    json_t *spec = as_text ? json_string(dir) : json_pack("{s:s, s:s}", "type", "model", "path", dir);
    RewardFunc *r = NULL;
    int rc = reward_create_ctx(&r, spec, &ctx, err);
    json_decref(spec);
    CHECK(rc == 0, "reward_create_ctx(%s): %s", dir, err);
    if (rc != 0) return;
    const char *name = json_string_value(json_object_get(entry, "name"));
    CHECK(strcmp(reward_name(r), name) == 0, "reward name '%s', want the folder's '%s'", reward_name(r), name);
    Tokenizer *tok = NULL;
    CHECK(tokenizer_load(&tok, dir, err) == 0, "%s", err);
    /* multi_turn: tool-calling completions (lists of messages), through reward_compute_messages */
    const char *kinds[3] = {"plain", "conversational", "multi_turn"};
    for (int k = 0; k < 3 && tok; k++) {
        json_t *cases = json_object_get(entry, kinds[k]);
        int n = (int)json_array_size(cases), ok = 0, same_ids = 0;
        const char **prompts = calloc((size_t)n, sizeof(char *)), **completions = calloc((size_t)n, sizeof(char *));
        json_t **rows = calloc((size_t)n, sizeof(json_t *)), **turns = calloc((size_t)n, sizeof(json_t *));
        float *rewards = calloc((size_t)n, sizeof(float));
        for (int i = 0; i < n; i++) {
            json_t *c = json_array_get(cases, (size_t)i);
            json_t *prompt = json_object_get(c, "prompt");
            rows[i] = json_pack("{s:O, s:s}", "prompt", prompt, "other", "column");
            prompts[i] = json_is_string(prompt) ? json_string_value(prompt) : "(rendered by the policy's template)";
            json_t *completion = json_object_get(c, "completion");
            /* a multi-turn completion's text is its turns' (unused by a conversational prompt's score) */
            completions[i] = json_is_string(completion) ? json_string_value(completion) : "(the turns' text)";
            turns[i] = json_is_array(completion) ? completion : NULL;
            /* colt's tokenizer on TRL's text gives TRL's ids (a score mismatch is then the rendering's or the
             * model's) */
            const char *text = json_string_value(json_object_get(c, "text"));
            int *got = NULL, want_len = 0, *want = ids_of(json_object_get(c, "ids"), &want_len);
            size_t got_len = 0;
            if (tokenizer_encode(tok, text, strlen(text), &got, &got_len, err) == 0)
                same_ids += (int)got_len == want_len && memcmp(got, want, sizeof(int) * got_len) == 0;
            free(got), free(want);
        }
        rc = reward_compute_messages(r, rewards, prompts, completions, k == 2 ? turns : NULL, NULL, NULL, rows, n, err);
        CHECK(rc == 0, "%s %s: reward_compute: %s", dir, kinds[k], err);
        for (int i = 0; rc == 0 && i < n; i++) {
            double want = json_number_value(json_object_get(json_array_get(cases, (size_t)i), "score"));
            bool good = close_to(rewards[i], want);
            ok += good;
            CHECK(good, "%s %s case %d: colt %.6f, TRL %.6f", dir, kinds[k], i, rewards[i], want);
        }
        CHECK(same_ids == n, "%s %s: %d/%d texts tokenize to TRL's ids", dir, kinds[k], same_ids, n);
        printf("%-14s %s reward (%s): %d/%d completions score as TRL, %d/%d texts tokenize to TRL's ids\n",
               json_string_value(json_object_get(entry, "name")), as_text ? "text" : "spec", kinds[k], ok, n, same_ids,
               n);
        for (int i = 0; i < n; i++) json_decref(rows[i]);
        free(prompts), free(completions), free(rows), free(rewards), free(turns);
    }
    tokenizer_free(tok);
    reward_free(r);
}

static void expect_error(const char *what, int rc, const char *err, const char *needle) {
    CHECK(rc != 0 && strstr(err, needle) && !strchr(err, '\n'), "%s: rc %d, error '%s' lacks '%s'", what, rc, err,
          needle);
    printf("  bad input %-28s -> %s\n", what, err);
}

static void test_errors(const Backend *be) {
    char err[ERR_LEN] = "";
    const char *rm = COLT_SOURCE_DIR "/tests/data/models/tiny-qwen2-rm";
    RewardFunc *r = NULL;
    json_t *spec = json_pack("{s:s, s:s}", "type", "model", "path", rm);
    expect_error("no device", reward_create(&r, spec, err), err, "needs a device");
    json_decref(spec);
    RewardContext ctx = {.be = be};
    spec = json_pack("{s:s, s:s, s:i}", "type", "model", "path", rm, "batch", 4);
    expect_error("unknown key", reward_create_ctx(&r, spec, &ctx, err), err, "unknown key \"batch\"");
    json_decref(spec);
    spec = json_pack("{s:s}", "type", "model");
    expect_error("no path", reward_create_ctx(&r, spec, &ctx, err), err, "\"path\" must be");
    json_decref(spec);
    spec = json_pack("{s:s, s:s}", "type", "model", "path", COLT_SOURCE_DIR "/tests/data/models/tiny-qwen2-f32");
    expect_error("a causal LM as reward", reward_create_ctx(&r, spec, &ctx, err), err,
                 "not a sequence-classification checkpoint");
    json_decref(spec);
    spec = json_string(COLT_SOURCE_DIR "/tests/data/models/no-such-rm");
    expect_error("a missing folder", reward_create_ctx(&r, spec, &ctx, err), err, "no-such-rm");
    json_decref(spec);
    spec = json_string("rewards/check.py");
    expect_error("a .py file, no function", reward_create_ctx(&r, spec, &ctx, err), err, "\"PATH.py:FUNCTION\"");
    json_decref(spec);
    Model *m = NULL;
    expect_error("a reward model as policy", model_load(&m, rm, be, err), err, "sequence classifier (a reward model)");
    CHECK(r == NULL && m == NULL, "a failed create left an object");
}

/* [launcher] colt train ARGS; its output in *err_out (malloc'd), its exit code returned. */
static int run_train(const char *launcher, const char *args, char **err_out) {
    char cmd[8192], err_path[300];
    snprintf(err_path, sizeof err_path, "%s/output", g_tmp);
    snprintf(cmd, sizeof cmd, "%s %s train %s > %s 2>&1", launcher, COLT_BINARY, args, err_path);
    int status = system(cmd);
    size_t len;
    if (file_read_all(err_path, err_out, &len, NULL) != 0) *err_out = strdup("");
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

typedef enum { ONE_PROCESS, TP_2, ZERO3_DP_2 } Layout;

/* The reward model's MB on rank 0 and whole, from the run's log line. */
static void logged_reward_mb(const char *log, double *rank_mb, double *whole_mb) {
    const char *at = log ? strstr(log, "MB of weights on the training device") : NULL;
    *rank_mb = *whole_mb = NAN;
    if (!at) return;
    const char *start = at;
    while (start > log && start[-1] != ' ') start--;
    while (start > log && start[-2] != ' ') start--; /* the number before " MB" */
    sscanf(start, "%lf", rank_mb);
    const char *whole = strstr(at, "(");
    if (whole && strstr(whole, "MB whole")) sscanf(whole + 1, "%lf", whole_mb);
}

/* The dry run's per-device GB of the reward models, at rest and gathered, for zero_stage z over 2 ranks. */
static void planned_reward_gb(const char *rm, int zero_stage, double *rest, double *gathered) {
    char args[2048], *out = NULL;
    snprintf(args, sizeof args,
             "--config " COLT_SOURCE_DIR "/examples/demo.yaml --model " COLT_SOURCE_DIR "/models/stories260K "
             "--dataset " COLT_SOURCE_DIR "/examples/data/demo_train.jsonl --device cpu --output_dir %s/plan "
             "--reward_funcs '[\"%s\"]' --zero_stage %d --dry_run --json --world_size 2",
             g_tmp, rm, zero_stage);
    *rest = *gathered = NAN;
    char *log = NULL;
    int rc = run_colt_with(&(ColtRun){.subcommand = "train", .out = &out}, args, &log);
    CHECK(rc == 0, "colt train --dry_run (zero_stage %d): exit %d: %s", zero_stage, rc, log);
    free(log);
    json_t *plan = json_loads(out ? out : "", 0, NULL), *dev = json_object_get(plan, "per_device_gb");
    if (dev) {
        *rest = json_number_value(json_object_get(dev, "reward_models"));
        *gathered = json_number_value(json_object_get(dev, "reward_model_gathered"));
    }
    CHECK(dev != NULL, "colt train --dry_run --json (zero_stage %d): no per_device_gb in '%s'", zero_stage, out);
    json_decref(plan);
    free(out);
}

/* Two steps of GRPO with the reward model as the only reward (TRL's text form): in one process; under
 * mpirun with tensor_parallel_size 2 (the reward model cut like the policy); or under mpirun as two
 * data-parallel ranks at zero_stage 3 (the policy and the reward model partitioned: each rank keeps half of
 * the reward model, gathered whole while scoring, and the memory plan counts that half). */
/* Whether two runs' JSONL files hold the same records: every field equal, but "reward" and "advantage",
 * numbers within 1e-5 of each other (relative to max(1, |value|)); *worst gets their largest such gap. */
static bool jsonl_same_but_scores(const char *dir_a, const char *dir_b, const char *file, double *worst, int *lines) {
    char *ta = read_text(dir_a, file), *tb = read_text(dir_b, file);
    bool same = ta && tb;
    char *sa = NULL, *sb = NULL;
    for (char *la = same ? strtok_r(ta, "\n", &sa) : NULL, *lb = same ? strtok_r(tb, "\n", &sb) : NULL; same && (la || lb);
         la = strtok_r(NULL, "\n", &sa), lb = strtok_r(NULL, "\n", &sb)) {
        json_t *a = la ? json_loads(la, 0, NULL) : NULL, *b = lb ? json_loads(lb, 0, NULL) : NULL;
        same = a && b && json_object_size(a) == json_object_size(b);
        const char *key;
        json_t *va;
        json_object_foreach(same ? a : NULL, key, va) {
            json_t *vb = json_object_get(b, key);
            bool score = strcmp(key, "reward") == 0 || strcmp(key, "advantage") == 0;
            if (score && json_is_number(va) && json_is_number(vb)) {
                double x = json_number_value(va), y = json_number_value(vb), gap = fabs(x - y) / fmax(1.0, fabs(x));
                if (gap > *worst) *worst = gap;
                same &= gap <= 1e-5;
            } else {
                same &= json_equal(va, vb) != 0;
            }
        }
        json_decref(a), json_decref(b);
        *lines += same;
    }
    free(ta), free(tb);
    return same;
}

/* The runs' settings but for the reward and the output folder: the demo, 2 steps of 16 short completions. */
#define RUN_ARGS                                                                                                    \
    "--config " COLT_SOURCE_DIR "/examples/demo.yaml --model " COLT_SOURCE_DIR "/models/stories260K --dataset "     \
    COLT_SOURCE_DIR "/examples/data/demo_train.jsonl --eval_dataset null --max_steps 2 --per_device_train_batch_size " \
    "16 --max_completion_length 16 --logging_steps 1 --device cpu --log_completions_count 16 --save_total_limit 0 "

static void test_train(const Backend *be, Layout layout) {
    const char *rm = COLT_SOURCE_DIR "/tests/data/models/tiny-llama-rm";
    static const char *const names[] = {"", " (mpirun, TP 2)", " (mpirun, DP 2, zero_stage 3)"};
    /* one process and ZeRO-3 also evaluate (scoring on every rank, eval_before/after.jsonl compared) */
#define EVAL " --eval_dataset " COLT_SOURCE_DIR "/examples/data/demo_eval.jsonl --num_eval_prompts 3"
    static const char *const extra[] = {EVAL, " --tensor_parallel_size 2 --ddp_timeout 60",
                                        " --zero_stage 3 --per_device_train_batch_size 8 --ddp_timeout 60" EVAL};
    static const char *const held[] = {", whole, ", "cut across the 2 ranks of the tensor-parallel group",
                                       ", partitioned across 2 data-parallel ranks (zero_stage 3), "};
    char args[4096], dir[300], launcher[256] = "", *err = NULL;
    snprintf(dir, sizeof dir, "%s/run_%d", g_tmp, (int)layout);
    if (layout != ONE_PROCESS)
        snprintf(launcher, sizeof launcher,
                 "mpirun --oversubscribe --allow-run-as-root --bind-to none -x OMP_NUM_THREADS=1 -x " NO_LEAK_CHECK
                 " -np 2");
    snprintf(args, sizeof args, RUN_ARGS "--reward_funcs '[\"%s\"]' --output_dir %s%s", rm, dir, extra[layout]);
    double t0 = now_s();
    int rc = run_train(launcher, args, &err);
    printf("colt train%s, 2 steps with the reward model: exit %d in %.1f s\n", names[layout], rc, now_s() - t0);
    CHECK(rc == 0, "colt train%s with a reward model: exit %d: %s", names[layout], rc, err);
    CHECK(err && strstr(err, held[layout]), "the run's log does not say the reward model is held '%s'", held[layout]);
    if (layout == ZERO3_DP_2) {
        /* rank 0 holds half of the weights at rest; the plan says the same */
        double rank_mb, whole_mb, plan_rest, plan_gathered, plan_whole, unused;
        logged_reward_mb(err, &rank_mb, &whole_mb);
        planned_reward_gb(rm, 3, &plan_rest, &plan_gathered);
        planned_reward_gb(rm, 0, &plan_whole, &unused);
        const double GB = 1024.0 * 1024.0 * 1024.0 / 1e6; /* MB per GB */
        printf("reward model per rank at zero_stage 3: %.3f MB of %.3f MB (%.2f); plan %.3f MB at rest, %.3f MB "
               "gathered, %.3f MB at zero_stage 0\n",
               rank_mb, whole_mb, rank_mb / whole_mb, plan_rest * GB, plan_gathered * GB, plan_whole * GB);
        CHECK(rank_mb / whole_mb > 0.45 && rank_mb / whole_mb < 0.55, "rank 0 keeps %.3f MB of the reward model's %.3f MB",
              rank_mb, whole_mb);
        CHECK(fabs(plan_rest * GB - rank_mb) <= 0.01 * rank_mb && fabs(plan_gathered * GB - whole_mb) <= 0.01 * whole_mb &&
                  fabs(plan_whole * GB - whole_mb) <= 0.01 * whole_mb,
              "the plan's reward model (%.4f MB at rest, %.4f gathered, %.4f at zero_stage 0) is not the run's (%.4f of "
              "%.4f MB)",
              plan_rest * GB, plan_gathered * GB, plan_whole * GB, rank_mb, whole_mb);
    }
    free(err);
    if (rc != 0) return;
    /* Every logged completion's reward is the model's score of prompt + completion. */
    RewardFunc *r = NULL;
    RewardContext ctx = {.be = be};
    json_t *spec = json_string(rm);
    char e[ERR_LEN];
    CHECK(reward_create_ctx(&r, spec, &ctx, e) == 0, "%s", e);
    json_decref(spec);
    char *text = read_text(dir, "completions.jsonl");
    if (layout == ZERO3_DP_2) {
        /* the same prompts and completions as the one-process run (run_0: the same global batch), and the
         * same rewards but for the rounding of the scoring GEMMs: a rank scores its half of the completions
         * as one batch, the one process all of them, and BLAS kernels that tile the rows (OpenBLAS's
         * Haswell kernels, which AMD Zen 4 gets) round a row by where it falls in the batch */
        char one_dir[300];
        snprintf(one_dir, sizeof one_dir, "%s/run_%d", g_tmp, (int)ONE_PROCESS);
        static const char *const files[] = {"completions.jsonl", "eval_before.jsonl", "eval_after.jsonl"};
        for (int f = 0; f < 3; f++) {
            double worst = 0.0;
            int lines_compared = 0;
            bool same = jsonl_same_but_scores(one_dir, dir, files[f], &worst, &lines_compared);
            CHECK(same, "zero_stage 3 on 2 ranks: %s (prompts, completions, rewards within 1e-5) differs from one "
                  "process's", files[f]);
            printf("zero_stage 3 on 2 ranks: %s %s one process's (%d lines; rewards and advantages within %.1e)\n",
                   files[f], same ? "equal to" : "DIFFERS from", lines_compared, worst);
        }
    }
    int lines = 0, ok = 0;
    double lo = INFINITY, hi = -INFINITY;
    for (char *line = text && r ? strtok(text, "\n") : NULL; line; line = strtok(NULL, "\n")) {
        json_t *o = json_loads(line, 0, NULL), *row = json_pack("{s:O}", "prompt", json_object_get(o, "prompt"));
        const char *p = json_string_value(json_object_get(o, "prompt"));
        const char *c = json_string_value(json_object_get(o, "completion"));
        double logged = json_number_value(json_object_get(o, "reward"));
        float want = NAN;
        if (p && c && reward_compute(r, &want, &p, &c, NULL, NULL, &row, 1, e) == 0) {
            bool good = close_to(logged, want);
            ok += good;
            CHECK(good, "completions.jsonl line %d: logged reward %.6f, the model scores %.6f", lines + 1, logged,
                  want);
            lo = fmin(lo, want), hi = fmax(hi, want);
        } else {
            CHECK(0, "completions.jsonl line %d: cannot rescore: %s", lines + 1, e);
        }
        lines++;
        json_decref(row), json_decref(o);
    }
    printf("completions.jsonl: %d/%d logged rewards are the model's scores (range %.3f .. %.3f)\n", ok, lines, lo, hi);
    CHECK(lines >= 16, "completions.jsonl: %d lines, want at least 16", lines);
    CHECK(hi - lo > 0.01, "every completion scores the same: the check is vacuous");
    free(text);
    reward_free(r);
    char *metrics = read_text(dir, "metrics.jsonl");
    CHECK(metrics && strstr(metrics, "\"rewards/tiny-llama-rm/mean\""),
          "metrics.jsonl lacks rewards/tiny-llama-rm/mean");
    free(metrics);
}

/* TRL's script argument: `--reward_model_name_or_path RM` (reward_funcs empty) gives the one-process run's
 * completions and rewards byte for byte: the model is the first reward, named after its folder. */
static void test_script_argument(void) {
    const char *rm = COLT_SOURCE_DIR "/tests/data/models/tiny-llama-rm";
    char args[4096], dir[300], one_dir[300], *err = NULL;
    snprintf(dir, sizeof dir, "%s/run_script_argument", g_tmp);
    snprintf(one_dir, sizeof one_dir, "%s/run_%d", g_tmp, (int)ONE_PROCESS);
    snprintf(args, sizeof args, RUN_ARGS "--reward_funcs '[]' --reward_model_name_or_path %s --output_dir %s" EVAL,
             rm, dir);
    int rc = run_train("", args, &err);
    CHECK(rc == 0, "colt train --reward_model_name_or_path: exit %d: %s", rc, err);
    free(err);
    if (rc != 0) return;
    static const char *const files[] = {"completions.jsonl", "eval_before.jsonl", "eval_after.jsonl"};
    int same = 0;
    for (int f = 0; f < 3; f++) {
        char *a = read_text(one_dir, files[f]), *b = read_text(dir, files[f]);
        same += a && b && strcmp(a, b) == 0;
        free(a), free(b);
    }
    char *metrics = read_text(dir, "metrics.jsonl");
    bool named = metrics && strstr(metrics, "\"rewards/tiny-llama-rm/mean\"");
    free(metrics);
    CHECK(same == 3 && named, "--reward_model_name_or_path: %d of 3 files equal reward_funcs [RM]'s, rewards/tiny-llama-rm "
          "%s", same, named ? "logged" : "missing");
    printf("--reward_model_name_or_path (TRL's script argument): %d of 3 files equal to reward_funcs [\"RM\"]'s\n", same);
}

int main(void) {
    snprintf(g_tmp, sizeof g_tmp, "/tmp/colt_test_reward_model_XXXXXX");
    if (!mkdtemp(g_tmp)) return 1;
    char err[ERR_LEN];
    Backend *be = backend_open("cpu", 0, err);
    if (!be) {
        fprintf(stderr, "backend_open: %s\n", err);
        return 1;
    }
    json_error_t jerr;
    json_t *goldens = json_load_file(GOLDENS, 0, &jerr);
    CHECK(goldens != NULL, "%s: %s", GOLDENS, jerr.text);
    json_t *models = json_object_get(goldens, "models");
    CHECK(json_array_size(models) == 2, "%zu golden models, want 2", json_array_size(models));
    double t0 = now_s();
    for (size_t i = 0; i < json_array_size(models); i++) {
        json_t *entry = json_array_get(models, i);
        char dir[512];
        snprintf(dir, sizeof dir, "%s/%s", COLT_SOURCE_DIR, json_string_value(json_object_get(entry, "dir")));
        test_ids(entry, dir, be);
        test_reward(entry, dir, be, i == 1); /* the Llama one through the bare folder string, as TRL users write it */
    }
    printf("scores: max |colt - reference| %.2e (tolerance %.0e + %.0e |ref|), %.2f s\n", g_max_diff, ATOL, RTOL,
           now_s() - t0);
    test_errors(be);
    test_train(be, ONE_PROCESS);
    test_script_argument();
    if (system("command -v mpirun > /dev/null 2>&1") == 0) {
        test_train(be, TP_2);
        test_train(be, ZERO3_DP_2);
    } else {
        printf("SKIPPED: colt train with the reward model under TP 2 and ZeRO-3 (no mpirun)\n");
    }
    json_decref(goldens);
    backend_close(be);
    if (!getenv("KEEP_TMP")) sh("rm -rf %s", g_tmp);
    printf("%d checks, %d failures\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
