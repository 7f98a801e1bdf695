/* test_cuda_reward_model.c — reward models on the GPU (GPU machine only): the tiny Qwen2 and Llama
 * ForSequenceClassification checkpoints of tests/data/models scored with model_score_sequences on the
 * cuda_f32 (fp32 storage) and cuda (bf16 storage) backends against transformers' fp32 scores
 * (reward_model_goldens.json), the score head being a one-row GEMM; then two steps of `colt train --device cuda`
 * with the Llama one as the reward, every logged reward checked against the CPU's score of that completion.
 * Tolerances: cuda_f32 1e-3 + 1e-3 |ref| (fp32, other GEMMs). cuda (bf16 weights and activations): the
 * yardstick is transformers' own bf16 error on the same case (score_bf16 - score, up to ~0.1 on these random
 * models whose scores span +-10): twice it, plus 2^-6 (1 + |ref|); the logged rewards of the training run, three
 * times the model's largest such error plus 2^-6 (1 + |ref|). Exit 77 when no GPU. */
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "backend/backend.h"
#include "core/error.h"
#include "core/fileio.h"
#include "data/rewards.h"
#include "model/model.h"

static int g_failures = 0;
#define CHECK(cond, ...)                                                                   \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            g_failures++;                                                                  \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__), fprintf(stderr, __VA_ARGS__); \
            fputc('\n', stderr);                                                           \
        }                                                                                  \
    } while (0)

/* The largest |score_bf16 - score| of a model's goldens: transformers' own bf16 error. */
static double bf16_error(json_t *entry) {
    json_t *cases = json_object_get(entry, "ids");
    double worst = 0;
    for (size_t i = 0; i < json_array_size(cases); i++) {
        json_t *c = json_array_get(cases, i);
        worst = fmax(worst, fabs(json_number_value(json_object_get(c, "score_bf16")) -
                                 json_number_value(json_object_get(c, "score"))));
    }
    return worst;
}

/* bf16: each case's bound is twice transformers' bf16 error on it (+ 2^-6 (1 + |ref|)); else atol + rtol |ref|. */
static void score_on(const char *device, double atol, double rtol, bool bf16, json_t *models) {
    char err[ERR_LEN];
    Backend *be = backend_open(device, 0, err);
    CHECK(be != NULL, "backend_open(%s): %s", device, err);
    if (!be) return;
    for (size_t k = 0; k < json_array_size(models); k++) {
        json_t *entry = json_array_get(models, k), *cases = json_object_get(entry, "ids");
        char dir[512];
        snprintf(dir, sizeof dir, "%s/%s", COLT_SOURCE_DIR, json_string_value(json_object_get(entry, "dir")));
        Model *m = NULL;
        if (model_load_classifier(&m, dir, be, NULL, err) != 0) {
            CHECK(0, "%s: %s", dir, err);
            continue;
        }
        int n = (int)json_array_size(cases), pad = (int)json_integer_value(json_object_get(entry, "pad_token_id"));
        int **ids = calloc((size_t)n, sizeof(int *)), *lens = calloc((size_t)n, sizeof(int));
        float *scores = calloc((size_t)n, sizeof(float));
        for (int i = 0; i < n; i++) {
            json_t *a = json_object_get(json_array_get(cases, (size_t)i), "ids");
            lens[i] = (int)json_array_size(a);
            ids[i] = malloc(sizeof(int) * (size_t)lens[i]);
            for (int t = 0; t < lens[i]; t++) ids[i][t] = (int)json_integer_value(json_array_get(a, (size_t)t));
        }
        int rc = model_score_sequences(m, scores, (const int *const *)ids, lens, n, pad, err);
        CHECK(rc == 0, "%s on %s: %s", dir, device, err);
        double worst = 0;
        for (int i = 0; rc == 0 && i < n; i++) {
            json_t *c = json_array_get(cases, (size_t)i);
            double want = json_number_value(json_object_get(c, "score"));
            double d = fabs(scores[i] - want);
            double bound = bf16 ? 2 * fabs(json_number_value(json_object_get(c, "score_bf16")) - want) +
                                      (1 + fabs(want)) / 64
                                : atol + rtol * fabs(want);
            worst = fmax(worst, d);
            CHECK(d <= bound, "%s on %s, case %d: %.5f, transformers %.5f (fp32), %.5f (bf16); bound %.4f", dir,
                  device, i, scores[i], want, json_number_value(json_object_get(c, "score_bf16")), bound);
        }
        printf("%-9s %s: %d sequences, max |colt - transformers| %.2e\n", device,
               json_string_value(json_object_get(entry, "name")), n, worst);
        for (int i = 0; i < n; i++) free(ids[i]);
        free(ids), free(lens), free(scores);
        model_free(m);
    }
    backend_close(be);
}

static void train_on_cuda(double model_bf16_error) {
    const char *colt = getenv("COLT_BINARY") ? getenv("COLT_BINARY") : "build-cuda/colt";
    const char *rm = COLT_SOURCE_DIR "/tests/data/models/tiny-llama-rm", *dir = "/tmp/colt_gpu_reward_model";
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "rm -rf %s && %s train --config examples/demo.yaml --nproc_per_node 1 --device cuda --max_steps 2 "
             "--per_device_train_batch_size 16 --max_completion_length 16 --eval_dataset null --logging_steps 1 "
             "--log_completions_count 16 --save_total_limit 0 --save_steps 0 --reward_funcs '[\"%s\"]' "
             "--output_dir %s > %s.log 2>&1",
             dir, colt, rm, dir, dir);
    int st = system(cmd);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "colt train --device cuda with a reward model failed: see %s.log",
          dir);
    char err[ERR_LEN];
    Backend *cpu = backend_open("cpu", 0, err);
    RewardFunc *r = NULL;
    RewardContext ctx = {.be = cpu};
    json_t *spec = json_string(rm);
    CHECK(reward_create_ctx(&r, spec, &ctx, err) == 0, "%s", err);
    json_decref(spec);
    char path[300], *text = NULL;
    size_t len;
    snprintf(path, sizeof path, "%s/completions.jsonl", dir);
    int lines = 0, ok = 0;
    double worst = 0;
    if (r && file_read_all(path, &text, &len, NULL) == 0) {
        for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
            json_t *o = json_loads(line, 0, NULL), *row = json_pack("{s:O}", "prompt", json_object_get(o, "prompt"));
            const char *p = json_string_value(json_object_get(o, "prompt"));
            const char *c = json_string_value(json_object_get(o, "completion"));
            double logged = json_number_value(json_object_get(o, "reward"));
            float want = NAN;
            if (p && c && reward_compute(r, &want, &p, &c, NULL, NULL, &row, 1, err) == 0) {
                double d = fabs(logged - want);
                worst = fmax(worst, d);
                ok += d <= 3 * model_bf16_error + (1 + fabs(want)) / 64;
            }
            lines++;
            json_decref(row), json_decref(o);
        }
    }
    printf("colt train --device cuda: %d/%d logged rewards within 3 x %.3f (transformers' own bf16 error on this "
           "model) + 2^-6 (1 + |score|) of the CPU's score (max diff %.3f)\n",
           ok, lines, model_bf16_error, worst);
    CHECK(lines >= 16 && ok == lines, "%d/%d logged rewards match the CPU scores", ok, lines);
    free(text);
    reward_free(r);
    backend_close(cpu);
}

int main(void) {
    if (!backend_cuda()) {
        printf("no CUDA device: skipped\n");
        return 77;
    }
    json_error_t jerr;
    json_t *goldens = json_load_file(COLT_SOURCE_DIR "/tests/data/models/reward_model_goldens.json", 0, &jerr);
    CHECK(goldens != NULL, "goldens: %s", jerr.text);
    json_t *models = json_object_get(goldens, "models");
    score_on("cuda_f32", 1e-3, 1e-3, false, models);
    score_on("cuda", 0, 0, true, models);
    double llama_bf16_error = 0;
    for (size_t k = 0; k < json_array_size(models); k++)
        if (!strcmp(json_string_value(json_object_get(json_array_get(models, k), "name")), "tiny-llama-rm"))
            llama_bf16_error = bf16_error(json_array_get(models, k));
    CHECK(llama_bf16_error > 0, "goldens: no score_bf16 for tiny-llama-rm (regenerate make_reward_model_goldens.py)");
    train_on_cuda(llama_bf16_error);
    json_decref(goldens);
    printf("%s\n", g_failures ? "FAILED" : "passed");
    return g_failures ? 1 : 0;
}
