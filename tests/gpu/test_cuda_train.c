/* test_cuda_train.c — GRPO on the GPU tracks the CPU run (GPU machine only).
 * The demo config for a few steps with --device cpu, cuda_f32 (fp32 storage on
 * the GPU) and cuda (bf16 storage):
 *   - cuda_f32's first step (before any update the three runs share the same
 *     weights, prompts and RNG keys) logs the same reward as the CPU, and its
 *     grad_norm within 1e-3 relative;
 *   - every run learns: held-out reward gain >= 0.30, as the CPU test asks.
 * Prints the per-step reward of each run side by side. Exit 77 when no GPU. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "backend/backend.h"
#include "core/fileio.h"

#define STEPS 12
static int g_failures = 0;

static int train(const char *device, const char *out_dir) {
    char cmd[2048];
    const char *colt = getenv("COLT_BINARY") ? getenv("COLT_BINARY") : "build-cuda/colt";
    snprintf(cmd, sizeof cmd,
             "%s train --config examples/demo.yaml --nproc_per_node 1 --per_device_train_batch_size 16 --max_completion_length 24 "
             "--num_eval_prompts 8 --logging_steps 1 --log_completions_count 0 --save_steps 0 --max_steps %d "
             "--device %s --output_dir %s > %s.log 2>&1",
             colt, STEPS, device, out_dir, out_dir);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static int read_metric(const char *dir, const char *key, double *out, int max) {
    char *p = path_join(dir, "metrics.jsonl"), *data = NULL;
    size_t len;
    int n = 0;
    if (file_read_all(p, &data, &len, NULL) == 0) {
        for (char *line = strtok(data, "\n"); line && n < max; line = strtok(NULL, "\n")) {
            json_t *o = json_loads(line, 0, NULL);
            out[n++] = json_number_value(json_object_get(o, key));
            json_decref(o);
        }
    }
    free(p);
    free(data);
    return n;
}

static double summary(const char *dir, const char *key) {
    char *p = path_join(dir, "summary.json");
    json_t *o = json_load_file(p, 0, NULL);
    free(p);
    double v = o ? json_number_value(json_object_get(o, key)) : NAN;
    json_decref(o);
    return v;
}

int main(void) {
    if (!backend_cuda()) {
        printf("no CUDA device: skipped\n");
        return 77;
    }
    const char *devices[3] = {"cpu", "cuda_f32", "cuda"};
    char dirs[3][256];
    double reward[3][STEPS], gnorm[3][STEPS];
    for (int d = 0; d < 3; d++) {
        snprintf(dirs[d], sizeof dirs[d], "/tmp/colt_gpu_train_%s", devices[d]);
        int code = train(devices[d], dirs[d]);
        if (code != 0) {
            printf("FAIL: colt train --device %s exited %d (see %s.log)\n", devices[d], code, dirs[d]);
            g_failures++;
        }
        int n = read_metric(dirs[d], "reward", reward[d], STEPS);
        read_metric(dirs[d], "grad_norm", gnorm[d], STEPS);
        if (n != STEPS) {
            printf("FAIL: %s logged %d steps\n", devices[d], n);
            g_failures++;
            return 1;
        }
    }
    printf("| step | reward cpu | reward cuda_f32 | reward cuda (bf16) | grad_norm cpu | cuda_f32 | cuda |\n|---|---|---|---|---|---|---|\n");
    for (int s = 0; s < STEPS; s++)
        printf("| %d | %.4f | %.4f | %.4f | %.4f | %.4f | %.4f |\n", s + 1, reward[0][s], reward[1][s], reward[2][s],
               gnorm[0][s], gnorm[1][s], gnorm[2][s]);
    double rel = fabs(gnorm[1][0] - gnorm[0][0]) / fmax(fabs(gnorm[0][0]), 1e-12);
    printf("step 1: reward cpu %.4f cuda_f32 %.4f; grad_norm relative difference %.2e (limit 1e-3)\n", reward[0][0],
           reward[1][0], rel);
    if (reward[0][0] != reward[1][0] || rel > 1e-3) g_failures++;
    for (int d = 0; d < 3; d++) {
        double gain = summary(dirs[d], "eval_reward_after") - summary(dirs[d], "eval_reward_before");
        printf("%-9s held-out reward gain %.3f (required >= 0.30)\n", devices[d], gain);
        if (!(gain >= 0.30)) g_failures++;
    }
    printf("%s\n", g_failures ? "FAILED" : "GPU GRPO tracks the CPU run");
    return g_failures ? 1 : 0;
}
